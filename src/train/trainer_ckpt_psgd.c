/* PowerSGD's state in trainer checkpoints (trainer_ckpt.c calls these).
 *
 * A DDP run that compresses with PowerSGD carries state a resume needs
 * (parallel.h dt_powersgd_state_*): the hook's step count, its seed
 * generator and each bucket's warm-start Q are the same on every rank; the
 * error-feedback memories are each rank's own. A save gathers every rank's
 * errors to rank 0 (one dt_pg_gather over DDP's group, before rank 0
 * stages; the gathered copy is the staging copy), which writes
 *
 *     "powersgd.q"      F32 [Q]       the buckets' Qs, bucket order
 *     "powersgd.error"  F32 [W, E]    row r: rank r's error memories, bucket order
 *
 * and, as metadata "dtrain.powersgd", {"world": W, "state": <the hook's JSON>}.
 * A load restores it into a run with the same hook settings, world size and
 * buckets, each rank reading its own row; any difference is DT_ERR_MISMATCH
 * naming it. A checkpoint without PowerSGD state leaves the hook as it is (a
 * fresh run: iter 0, so start_iter counts from the resume); a run without
 * PowerSGD ignores the state. */
#include "train/train_impl.h"

#include "dtrain/ckpt.h"
#include "dtrain/parallel.h"

#include <cjson/cJSON.h>
#include <string.h>

#include "train/trainer_ckpt_psgd.h"

/* The run's PowerSGD hook and its group, or NULL (the strategy's
 * compress_state slot). */
static dt_powersgd *run_psgd(dt_trainer *tr, dt_pg **pg, dt_reducer **r)
{
    return dt__strategy_compress_state(dt_trainer_strategy(tr), pg, r);
}

/* Buckets the state has (the length of its JSON's "buckets"). */
static int state_buckets(const cJSON *state)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(state, "buckets"));
}

/* Concatenate array `which` of buckets [0, nb) into a new buffer (*n floats). */
static dt_status concat(dt_powersgd *ps, int nb, dt_powersgd_array which, float **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    size_t total = 0;
    for (int k = 0; k < nb; k++) {
        float *d;
        size_t m;
        dt_status st = dt_powersgd_state_array(ps, k, which, &d, &m);
        if (st < 0)
            return st;
        total += m;
    }
    float *b = dt_alloc((total + 1) * sizeof(float));
    if (!b)
        return dt_error(DT_ERR_NO_MEMORY, "checkpoint: PowerSGD state of %zu floats", total);
    size_t at = 0;
    for (int k = 0; k < nb; k++) {
        float *d;
        size_t m;
        dt_powersgd_state_array(ps, k, which, &d, &m);
        if (m)
            memcpy(b + at, d, m * sizeof(float));
        at += m;
    }
    *out = b;
    *n = total;
    return DT_OK;
}

void dt__psgd_saved_release(dt__psgd_saved *c)
{
    if (!c)
        return;
    dt_free(c->meta);
    dt_free(c->q);
    dt_free(c->err);
    memset(c, 0, sizeof *c);
}

dt_status dt__psgd_ckpt_collect(dt_trainer *tr, dt__psgd_saved *out)
{
    memset(out, 0, sizeof *out);
    dt_pg *pg;
    dt_reducer *r;
    dt_powersgd *ps = run_psgd(tr, &pg, &r);
    if (!ps)
        return DT_OK;
    const int W = dt_pg_size(pg), rank = dt_pg_rank(pg);
    char *js = NULL;
    cJSON *state = NULL, *meta = NULL;
    float *err = NULL;
    size_t nerr = 0;
    dt_status st = dt_powersgd_state_save(ps, &js);
    if (st >= 0 && !(state = cJSON_Parse(js)))
        st = dt_error(DT_ERR_NO_MEMORY, "checkpoint: PowerSGD state");
    const int nb = st >= 0 ? state_buckets(state) : 0;
    if (st >= 0)
        st = concat(ps, nb, DT_POWERSGD_ERROR, &err, &nerr);
    /* every rank gathers (the sizes are the same everywhere: the same steps
     * made the same memories); rank 0 keeps the rest */
    if (st >= 0 && rank == 0 && !(out->err = dt_alloc(((size_t)W * nerr + 1) * sizeof(float))))
        st = dt_error(DT_ERR_NO_MEMORY, "checkpoint: PowerSGD errors of %d ranks", W);
    if (st >= 0 && nerr)
        st = dt_pg_gather(pg, err, out->err, nerr, DT_F32, 0);
    out->nerr = nerr;
    out->world = W;
    if (st >= 0 && rank == 0) {
        st = concat(ps, nb, DT_POWERSGD_Q, &out->q, &out->nq);
        char *text = NULL;
        if (st >= 0 && (!(meta = cJSON_CreateObject()) || !cJSON_AddNumberToObject(meta, "world", W) ||
                        !cJSON_AddItemToObject(meta, "state", state) || !(text = cJSON_PrintUnformatted(meta))))
            st = dt_error(DT_ERR_NO_MEMORY, "checkpoint: PowerSGD state");
        else if (st >= 0)
            state = NULL; /* meta owns it */
        if (text && (out->meta = dt_alloc(strlen(text) + 1)))
            memcpy(out->meta, text, strlen(text) + 1);
        else if (text)
            st = dt_error(DT_ERR_NO_MEMORY, "checkpoint: PowerSGD state");
        cJSON_free(text);
    }
    cJSON_Delete(meta);
    cJSON_Delete(state);
    dt_free(js);
    dt_free(err);
    if (st < 0)
        dt__psgd_saved_release(out);
    return st;
}

dt_status dt__psgd_saved_entries(dt__psgd_saved *c, dt_ckpt_list *l)
{
    if (!c->meta)
        return DT_OK;
    dt_status st = DT_OK;
    if (c->nq) {
        dt_ckpt_entry e = {.name = DT__PSGD_Q, .dtype = DT_F32, .ndim = 1, .shape = {(int64_t)c->nq},
                           .lo = 0, .hi = c->nq, .data = c->q};
        st = dt_ckpt_list_add(l, &e);
    }
    if (st >= 0 && c->nerr) {
        dt_ckpt_entry e = {.name = DT__PSGD_ERROR, .dtype = DT_F32, .ndim = 2,
                           .shape = {c->world, (int64_t)c->nerr}, .lo = 0, .hi = (uint64_t)c->world * c->nerr,
                           .data = c->err};
        st = dt_ckpt_list_add(l, &e);
    }
    return st;
}

/* Saved tensor `name`: F32, numel n, index in *i. */
static dt_status saved_tensor(dt_ckpt *ck, const char *ckname, const char *name, uint64_t n, int64_t *i)
{
    *i = dt_ckpt_find(ck, name);
    if (*i < 0)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s: its PowerSGD state lacks the tensor '%s'", ckname, name);
    dt_ckpt_tensor t;
    dt_status st = dt_ckpt_tensor_at(ck, (size_t)*i, &t);
    if (st < 0)
        return st;
    if (t.dtype != DT_ST_F32 || t.numel != n)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s: tensor '%s' is %s of %llu elements; its PowerSGD state "
                        "says F32 of %llu", ckname, name, dt_st_dtype_name(t.dtype), (unsigned long long)t.numel,
                        (unsigned long long)n);
    return DT_OK;
}

dt_status dt__psgd_ckpt_load(dt_trainer *tr, dt_ckpt *ck, const char *ckname)
{
    dt_pg *pg;
    dt_reducer *r;
    dt_powersgd *ps = run_psgd(tr, &pg, &r);
    const char *text = dt_ckpt_meta(ck, DT__PSGD_META);
    if (!ps || !text)
        return DT_OK;
    const int W = dt_pg_size(pg), rank = dt_pg_rank(pg);
    const int nb = dt_reducer_num_buckets(r);
    size_t *numel = dt_calloc((size_t)(nb + 1) * sizeof *numel);
    cJSON *meta = cJSON_Parse(text);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(meta, "world");
    const cJSON *state = cJSON_GetObjectItemCaseSensitive(meta, "state");
    char *stext = NULL;
    dt_status st = DT_OK;
    if (!numel)
        st = dt_error(DT_ERR_NO_MEMORY, "checkpoint %s: PowerSGD state", ckname);
    else if (!cJSON_IsObject(meta) || !cJSON_IsNumber(w) || !cJSON_IsObject(state))
        st = dt_error(DT_ERR_FORMAT, "checkpoint %s: its \"%s\" metadata is not {\"world\": N, \"state\": {...}}",
                      ckname, DT__PSGD_META);
    else if (w->valuedouble != W)
        st = dt_error(DT_ERR_MISMATCH, "checkpoint %s holds the PowerSGD error feedback of %g ranks, this run has %d "
                      "(the memories are per rank: resume at %g ranks, or without --comm-hook powersgd)", ckname,
                      w->valuedouble, W, w->valuedouble);
    for (int k = 0; st >= 0 && k < nb; k++) {
        dt_reducer_bucket_info bi;
        if ((st = dt_reducer_bucket(r, k, &bi)) >= 0)
            numel[k] = bi.numel;
    }
    if (st >= 0 && !(stext = cJSON_PrintUnformatted(state)))
        st = dt_error(DT_ERR_NO_MEMORY, "checkpoint %s: PowerSGD state", ckname);
    if (st >= 0 && (st = dt_powersgd_state_load(ps, stext, numel, nb)) < 0)
        st = dt_error(st, "checkpoint %s: %s", ckname, dt_last_error());
    /* the arrays: Q from the one copy, the errors from this rank's row */
    const int sb = st >= 0 ? state_buckets(state) : 0;
    uint64_t nq = 0, ne = 0;
    for (int k = 0; st >= 0 && k < sb; k++) {
        float *a;
        size_t n;
        dt_powersgd_state_array(ps, k, DT_POWERSGD_Q, &a, &n);
        nq += n;
        dt_powersgd_state_array(ps, k, DT_POWERSGD_ERROR, &a, &n);
        ne += n;
    }
    int64_t iq = -1, ie = -1;
    if (st >= 0 && nq)
        st = saved_tensor(ck, ckname, DT__PSGD_Q, nq, &iq);
    if (st >= 0 && ne)
        st = saved_tensor(ck, ckname, DT__PSGD_ERROR, (uint64_t)W * ne, &ie);
    uint64_t aq = 0, ae = (uint64_t)rank * ne;
    for (int k = 0; st >= 0 && k < sb; k++) {
        float *a;
        size_t n;
        dt_powersgd_state_array(ps, k, DT_POWERSGD_Q, &a, &n);
        if (n && (st = dt_ckpt_read(ck, (size_t)iq, aq, aq + n, a, false)) < 0)
            break;
        aq += n;
        dt_powersgd_state_array(ps, k, DT_POWERSGD_ERROR, &a, &n);
        if (n && (st = dt_ckpt_read(ck, (size_t)ie, ae, ae + n, a, false)) < 0)
            break;
        ae += n;
    }
    cJSON_free(stext);
    cJSON_Delete(meta);
    dt_free(numel);
    return st;
}
