/* The trainer's run state: everything besides the tensors that a resumed
 * run needs to continue bit-identically (train.h, "Checkpoints").
 *
 * What makes a resumed step identical to the uninterrupted one:
 *   - parameters, buffers and optimizer moments (tensors: dt_trainer_save);
 *   - the optimizer's step count (Adam's bias correction, SGD's first
 *     momentum step) and the trainer's (the schedule: dt_sched_lr is a pure
 *     function of the step, so the step is the schedule's position);
 *   - the random streams: Philox is counter-based, keyed by (seed, purpose,
 *     rank, ...), so the only positions are the models' per-module counters
 *     (dropout), and the data order is a pure function of (seed + epoch);
 *   - the data position: the epoch and the next batch within it, which the
 *     loader restarts at (dt_loader_start_epoch_at) with its prefetch
 *     thread filling from there.
 * The record is one JSON object. At another world size the tensors load
 * (they are whole under DDP) but the data order cannot be kept: the
 * distributed sampler deals the permutation to W ranks, so the remaining
 * batches at W' are other samples in another order. The resume then starts
 * at the same fraction of the saved epoch and says so. */
#include "train/train_impl.h"

#include "base/json_strict.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_STATE_FORMAT "dtrain.trainer"
#define RUN_STATE_VERSION 1

dt_trainer_position dt_trainer_get_position(const dt_trainer *tr)
{
    dt_trainer_position p;
    memset(&p, 0, sizeof p);
    if (!tr)
        return p;
    const dt__trainer_pos *pos = dt__trainer_position((dt_trainer *)tr);
    p.step = dt_trainer_steps(tr);
    p.epoch = pos->epoch;
    p.batch = pos->batch;
    p.batches = pos->batches;
    p.samples = pos->samples;
    return p;
}

static bool add_num(cJSON *o, const char *k, double v) { return cJSON_AddNumberToObject(o, k, v) != NULL; }

dt_status dt_trainer_run_state(const dt_trainer *tr, char **json)
{
    if (!tr || !json)
        return dt_error(DT_ERR_NULL, "dt_trainer_run_state: NULL %s", tr ? "json" : "trainer");
    *json = NULL;
    const dt_trainer_params *p = dt__trainer_params(tr);
    const dt__trainer_pos *pos = dt__trainer_position((dt_trainer *)tr);
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    size_t nrng = dt_model_rng_state_size(m);
    uint64_t *ctr = calloc(nrng ? nrng : 1, sizeof *ctr);
    cJSON *root = cJSON_CreateObject(), *sched = NULL, *rng = NULL, *arr = NULL;
    bool ok = root && ctr && dt_model_get_rng_state(m, ctr, nrng) == DT_OK;
    ok = ok && cJSON_AddStringToObject(root, "format", RUN_STATE_FORMAT) &&
         add_num(root, "version", RUN_STATE_VERSION) && add_num(root, "step", (double)dt_trainer_steps(tr)) &&
         add_num(root, "optim_step", (double)dt_optim_get_step(o)) && add_num(root, "epoch", (double)pos->epoch) &&
         add_num(root, "batch", (double)pos->batch) && add_num(root, "epoch_batches", (double)pos->epoch_batches) &&
         add_num(root, "batches", (double)pos->batches) && add_num(root, "samples", (double)pos->samples) &&
         add_num(root, "world_size", dt__trainer_replicas(tr)) &&
         cJSON_AddStringToObject(root, "optimizer", dt_optim_kind_name(dt_optim_get_kind(o))) &&
         add_num(root, "grad_accum", (double)p->grad_accum) && add_num(root, "loss_scale", p->loss_scale) &&
         add_num(root, "next_lr", dt_trainer_next_lr(tr));
    if (ok && (sched = cJSON_AddObjectToObject(root, "schedule")))
        ok = cJSON_AddStringToObject(sched, "kind", dt_sched_kind_name(p->sched.kind)) &&
             add_num(sched, "base_lr", p->sched.base_lr) &&
             add_num(sched, "warmup_steps", (double)p->sched.warmup_steps) &&
             add_num(sched, "total_steps", (double)p->sched.total_steps) &&
             add_num(sched, "step_size", (double)p->sched.step_size) && add_num(sched, "gamma", p->sched.gamma) &&
             add_num(sched, "min_lr", p->sched.min_lr) && add_num(sched, "warmup_start", p->sched.warmup_start) &&
             add_num(sched, "min_ratio", p->sched.min_ratio) && add_num(sched, "step_rate", p->sched.step_rate) &&
             cJSON_AddBoolToObject(sched, "staircase", p->sched.staircase) &&
             add_num(sched, "lag", (double)p->sched.lag) &&
             cJSON_AddStringToObject(sched, "warmup_type", p->sched.warmup == DT_WARMUP_LOG ? "log" : "linear");
    else
        ok = false;
    if (ok && (rng = cJSON_AddObjectToObject(root, "rng")) && (arr = cJSON_AddArrayToObject(rng, "module_counters"))) {
        for (size_t i = 0; ok && i < nrng; i++) {
            cJSON *n = cJSON_CreateNumber((double)ctr[i]);
            ok = n && cJSON_AddItemToArray(arr, n);
        }
    } else {
        ok = false;
    }
    dt_loss_scaler *ls = dt_trainer_loss_scaler(tr);
    cJSON *lso;
    if (ok && ls && (lso = cJSON_AddObjectToObject(root, "loss_scaler"))) {
        dt_loss_scaler_state q;
        dt_loss_scaler_get_state(ls, &q);
        ok = add_num(lso, "scale", q.scale) && add_num(lso, "iter", (double)q.iter) &&
             add_num(lso, "last_overflow", (double)q.last_overflow) &&
             add_num(lso, "hysteresis_left", q.hysteresis_left) &&
             add_num(lso, "growth_tracker", (double)q.growth_tracker) && add_num(lso, "skipped", (double)q.skipped) &&
             add_num(lso, "overflow_run", (double)q.overflow_run);
    } else if (ok && ls) {
        ok = false;
    }
    char *s = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    free(ctr);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_run_state: out of memory");
    *json = s;
    return DT_OK;
}

void dt_trainer_run_state_free(char *json) { cJSON_free(json); }

/* A non-negative integer field, or an error naming it. */
static dt_status get_int(const cJSON *o, const char *k, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != floor(v->valuedouble))
        return dt_error(DT_ERR_FORMAT, "trainer run state: \"%s\" is %s (want an integer >= 0)", k,
                        v ? "not a valid integer" : "missing");
    *out = (int64_t)v->valuedouble;
    return DT_OK;
}

dt_status dt_trainer_apply_run_state(dt_trainer *tr, const char *json, dt_trainer_resume_info *info)
{
    if (!tr || !json)
        return dt_error(DT_ERR_NULL, "dt_trainer_apply_run_state: NULL %s", tr ? "json" : "trainer");
    dt_trainer_resume_info ri;
    memset(&ri, 0, sizeof ri);
    dt_status st = DT_OK;
    uint64_t *ctr = NULL;
    cJSON *root = NULL;
    if ((st = dt__json_parse_strict(json, strlen(json), "trainer run state", &root)) < 0)
        goto out;
    if (!cJSON_IsObject(root)) {
        st = dt_error(DT_ERR_FORMAT, "trainer run state: not a JSON object");
        goto out;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    int64_t ver = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, RUN_STATE_FORMAT) != 0) {
        st = dt_error(DT_ERR_FORMAT, "trainer run state: \"format\" is not \"%s\"", RUN_STATE_FORMAT);
        goto out;
    }
    if ((st = get_int(root, "version", &ver)) < 0)
        goto out;
    if (ver != RUN_STATE_VERSION) {
        st = dt_error(DT_ERR_UNSUPPORTED, "trainer run state: version %lld (this dtrain reads %d)", (long long)ver,
                      RUN_STATE_VERSION);
        goto out;
    }
    int64_t step, ostep, epoch, batch, nb, batches, samples, world;
    if ((st = get_int(root, "step", &step)) < 0 || (st = get_int(root, "optim_step", &ostep)) < 0 ||
        (st = get_int(root, "epoch", &epoch)) < 0 || (st = get_int(root, "batch", &batch)) < 0 ||
        (st = get_int(root, "epoch_batches", &nb)) < 0 || (st = get_int(root, "batches", &batches)) < 0 ||
        (st = get_int(root, "samples", &samples)) < 0 || (st = get_int(root, "world_size", &world)) < 0)
        goto out;
    if (world < 1 || world > (1 << 24)) {
        st = dt_error(DT_ERR_FORMAT, "trainer run state: \"world_size\" is %lld (want 1 or more ranks)",
                      (long long)world);
        goto out;
    }
    if (nb > 0 && batch > nb) {
        st = dt_error(DT_ERR_FORMAT, "trainer run state: \"batch\" is %lld but \"epoch_batches\" is %lld (the "
                      "position must lie inside its epoch)", (long long)batch, (long long)nb);
        goto out;
    }
    dt_optim *o = dt_trainer_optim(tr);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
    const char *have = dt_optim_kind_name(dt_optim_get_kind(o));
    if (!cJSON_IsString(ok) || strcmp(ok->valuestring, have) != 0) {
        st = dt_error(DT_ERR_MISMATCH, "the checkpoint holds %s optimizer state, this run uses %s",
                      cJSON_IsString(ok) ? ok->valuestring : "no", have);
        goto out;
    }
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    const cJSON *arr = rng ? cJSON_GetObjectItemCaseSensitive(rng, "module_counters") : NULL;
    if (!cJSON_IsArray(arr)) {
        st = dt_error(DT_ERR_FORMAT, "trainer run state: \"rng\".\"module_counters\" is missing");
        goto out;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    ctr = calloc(n ? n : 1, sizeof *ctr);
    if (!ctr) {
        st = dt_error(DT_ERR_NO_MEMORY, "trainer run state: out of memory");
        goto out;
    }
    const cJSON *el;
    cJSON_ArrayForEach(el, arr)
    {
        if (!cJSON_IsNumber(el) || !(el->valuedouble >= 0 && el->valuedouble <= 9007199254740992.0) ||
            el->valuedouble != floor(el->valuedouble)) {
            st = dt_error(DT_ERR_FORMAT, "trainer run state: module counter %zu is not an integer >= 0", i);
            goto out;
        }
        ctr[i++] = (uint64_t)el->valuedouble;
    }
    /* the loss scaler's state (absent: the saving run had none) */
    dt_loss_scaler_state lq;
    const cJSON *lso = cJSON_GetObjectItemCaseSensitive(root, "loss_scaler");
    dt_loss_scaler *ls = dt_trainer_loss_scaler(tr);
    if (lso && ls) {
        dt_loss_scaler_get_state(ls, &lq);
        const char *keys[7] = {"scale", "iter", "last_overflow", "hysteresis_left", "growth_tracker", "skipped",
                               "overflow_run"};
        double v[7];
        for (int k = 0; k < 7; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(lso, keys[k]);
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < (k == 2 ? -1 : 0)) {
                st = dt_error(DT_ERR_FORMAT, "trainer run state: \"loss_scaler\".\"%s\" is missing or invalid",
                              keys[k]);
                goto out;
            }
            v[k] = x->valuedouble;
        }
        lq.scale = v[0];
        lq.iter = (int64_t)v[1];
        lq.last_overflow = (int64_t)v[2];
        lq.hysteresis_left = (int)v[3];
        lq.growth_tracker = (int64_t)v[4];
        lq.skipped = (int64_t)v[5];
        lq.overflow_run = (int64_t)v[6];
    }
    /* everything checked: now change the trainer */
    if (lso && ls && (st = dt_loss_scaler_set_state(ls, &lq)) < 0)
        goto out;
    if ((st = dt_model_set_rng_state(dt_trainer_model(tr), ctr, n)) < 0)
        goto out;
    if ((st = dt_optim_set_step(o, ostep)) < 0)
        goto out;
    dt__trainer_set_steps(tr, step);
    dt__trainer_pos *pos = dt__trainer_position(tr);
    pos->epoch = epoch;
    pos->batch = batch;
    pos->saved_batches = nb;
    pos->batches = batches;
    pos->samples = samples;
    pos->resume = true;
    pos->order_kept = world == dt__trainer_replicas(tr);
    ri.step = step;
    ri.epoch = epoch;
    ri.batch = batch;
    ri.saved_world = (int)world;
    ri.data_order_kept = pos->order_kept;
    if (!ri.data_order_kept)
        snprintf(ri.note, sizeof ri.note,
                 "the checkpoint was saved by %lld data-parallel replicas, this run has %d: weights, optimizer "
                 "state and the schedule are resumed, the data order is not kept (epoch %lld continues at the same fraction of "
                 "its batches, with other samples in another order; dropout masks differ)",
                 (long long)world, dt__trainer_replicas(tr), (long long)epoch + 1);
out:
    free(ctr);
    cJSON_Delete(root);
    if (info)
        *info = ri;
    return st;
}
