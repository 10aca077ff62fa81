/* DDP construction, forward and teardown (the reducer is ddp_reducer.c).
 *
 * Construction: every rank describes its model as text,
 * one line per entry ("P f32 layer1.0.weight [16,1,5,5]"), and the lines are
 * all-gathered (lengths, then an allgatherv of the bytes). Every rank then
 * runs the same comparison against rank 0's description, so all ranks agree
 * on the verdict and fail together with the same message naming the first
 * difference. Only then are the parameters and buffers broadcast from rank
 * 0 (a mismatch would make the broadcast sizes differ).
 *
 * The gradient buffer is moved into dt_pg_alloc memory: the shm backend
 * then reduces the buckets straight out of the peers' buffers; a model with
 * several parameter dtypes has one gradient flat and one reducer per dtype,
 * as PyTorch's DDP buckets per dtype. The buckets,
 * their ordered posting and the wait are the reduction engine's (reducer.c);
 * DDP adds the iteration state, unused parameters and buffer broadcasts. */
#include "parallel/ddp/ddp_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_ddp_params dt_ddp_params_default(void)
{
    dt_ddp_params p;
    memset(&p, 0, sizeof p);
    p.bucket_cap_mb = 25.0;
    p.first_bucket_mb = 1.0;
    p.find_unused_parameters = false;
    p.broadcast_buffers = true;
    p.predivide = false;
    p.reduce_dtype = DT_F32;
    p.comm_hook = DT_COMM_HOOK_ALLREDUCE;
    p.powersgd = dt_powersgd_params_default();
    return p;
}

/* "P f32 name [a,b]\n" per entry, into a malloc'd string. */
static char *describe(const dt_model *m, size_t *len)
{
    size_t n = dt_model_num_entries(m), cap = 256, used = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        dt_param_info e;
        if (dt_model_entry(m, i, &e) < 0) {
            free(s);
            return NULL;
        }
        char line[512];
        int w = snprintf(line, sizeof line, "%s %s %s [", e.is_buffer ? "buffer" : "parameter",
                         dt_dtype_name(e.dtype), e.name);
        for (int k = 0; k < e.ndim && w > 0 && (size_t)w < sizeof line; k++)
            w += snprintf(line + w, sizeof line - (size_t)w, "%s%lld", k ? "," : "", (long long)e.shape[k]);
        if (w > 0 && (size_t)w < sizeof line)
            w += snprintf(line + w, sizeof line - (size_t)w, "]\n");
        if (w < 0 || (size_t)w >= sizeof line)
            w = (int)strlen(line);
        if (used + (size_t)w + 1 > cap) {
            while (used + (size_t)w + 1 > cap)
                cap *= 2;
            char *t = realloc(s, cap);
            if (!t) {
                free(s);
                return NULL;
            }
            s = t;
        }
        memcpy(s + used, line, (size_t)w);
        used += (size_t)w;
    }
    s[used] = 0;
    *len = used;
    return s;
}

/* Line i of a description (without '\n') into out; false past the end. */
static bool line_at(const char *s, size_t len, size_t i, char *out, size_t cap)
{
    size_t pos = 0;
    for (size_t k = 0; k < i; k++) {
        const char *nl = memchr(s + pos, '\n', len - pos);
        if (!nl)
            return false;
        pos = (size_t)(nl - s) + 1;
    }
    if (pos >= len)
        return false;
    const char *nl = memchr(s + pos, '\n', len - pos);
    size_t l = nl ? (size_t)(nl - (s + pos)) : len - pos;
    if (l >= cap)
        l = cap - 1;
    memcpy(out, s + pos, l);
    out[l] = 0;
    return true;
}

/* Compare every rank's description with rank 0's; same verdict everywhere. */
static dt_status verify_across_ranks(dt_pg *pg, const dt_model *m)
{
    const int W = dt_pg_size(pg);
    size_t len = 0;
    char *mine = describe(m, &len);
    if (!mine)
        return dt_error(DT_ERR_NO_MEMORY, "dt_ddp_init: describing the model");
    int64_t *lens = calloc((size_t)W, sizeof *lens);
    size_t *counts = calloc((size_t)W, sizeof *counts);
    char *all = NULL;
    dt_status st = DT_ERR_NO_MEMORY;
    if (!lens || !counts)
        goto out;
    int64_t l64 = (int64_t)len;
    st = dt_pg_allgather(pg, &l64, lens, 1, DT_I64);
    if (st < 0) {
        dt_error_wrap(st, "dt_ddp_init: exchanging model descriptions");
        goto out;
    }
    size_t total = 0;
    for (int r = 0; r < W; r++) {
        counts[r] = (size_t)lens[r];
        total += counts[r];
    }
    all = malloc(total + 1);
    if (!all) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_ddp_init: %zu bytes of model descriptions", total);
        goto out;
    }
    st = dt_pg_allgatherv(pg, mine, all, counts, NULL, DT_U8);
    if (st < 0) {
        dt_error_wrap(st, "dt_ddp_init: exchanging model descriptions");
        goto out;
    }
    const char *d0 = all;
    size_t off = counts[0];
    for (int r = 1; r < W; r++) {
        const char *dr = all + off;
        off += counts[r];
        if (counts[r] == counts[0] && !memcmp(dr, d0, counts[0]))
            continue;
        for (size_t i = 0;; i++) {
            char a[400], b[400];
            bool ha = line_at(d0, counts[0], i, a, sizeof a), hb = line_at(dr, counts[r], i, b, sizeof b);
            if (ha && hb && !strcmp(a, b))
                continue;
            if (ha && hb)
                st = dt_error(DT_ERR_MISMATCH,
                              "DDP: the model differs between ranks: entry %zu is %s on rank 0 but %s on "
                              "rank %d (build the same model on every rank)",
                              i, a, b, r);
            else if (ha)
                st = dt_error(DT_ERR_MISMATCH,
                              "DDP: the model differs between ranks: rank 0 has entry %zu (%s) but rank %d "
                              "has only %zu entries",
                              i, a, r, i);
            else
                st = dt_error(DT_ERR_MISMATCH,
                              "DDP: the model differs between ranks: rank %d has entry %zu (%s) but rank 0 "
                              "has only %zu entries",
                              r, i, b, i);
            goto out;
        }
    }
    st = DT_OK;
out:
    free(mine);
    free(lens);
    free(counts);
    free(all);
    return st;
}

/* Broadcast every buffer flat (running stats; num_batches_tracked's i64
 * flat) from rank 0, each in its own dtype. */
static dt_status bcast_buffers(dt_pg *pg, const dt_model *m)
{
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        const dt_flat *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)t);
        if (!b || !b->base)
            continue;
        dt_status st = dt_pg_broadcast(pg, b->base, dt_flat_nbytes(b), DT_U8, 0);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt_ddp_init(dt_pg *pg, dt_model *m, const dt_ddp_params *pp, dt_ddp **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_ddp_init: out is NULL");
    *out = NULL;
    if (!pg || !m)
        return dt_error(DT_ERR_NULL, "dt_ddp_init: %s is NULL", pg ? "model" : "process group");
    dt_ddp_params p = pp ? *pp : dt_ddp_params_default();
    if (!(p.bucket_cap_mb > 0) || !(p.first_bucket_mb > 0))
        return dt_error(DT_ERR_INVALID_ARG, "dt_ddp_init: bucket_cap_mb (%g) and first_bucket_mb (%g) must be > 0",
                        p.bucket_cap_mb, p.first_bucket_mb);
    if (dt_pg_status(pg) < 0)
        return dt_error_wrap(dt_pg_status(pg), "dt_ddp_init: the process group has failed");
    /* fp16/bf16 compression is the engine's low-precision reduction */
    if (p.comm_hook == DT_COMM_HOOK_FP16 || p.comm_hook == DT_COMM_HOOK_BF16) {
        const dt_dtype want = p.comm_hook == DT_COMM_HOOK_FP16 ? DT_F16 : DT_BF16;
        if (p.reduce_dtype != DT_F32 && p.reduce_dtype != want)
            return dt_error(DT_ERR_INVALID_ARG, "dt_ddp_init: comm hook %s with reduce_dtype %s (the hook sets it)",
                            dt_comm_hook_name(p.comm_hook), dt_dtype_name(p.reduce_dtype));
        p.reduce_dtype = want;
    } else if (p.comm_hook == DT_COMM_HOOK_POWERSGD && p.reduce_dtype != DT_F32) {
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_ddp_init: comm hook powersgd compresses f32 gradients; reduce_dtype %s cannot be "
                        "combined with it (reduce in f32)",
                        dt_dtype_name(p.reduce_dtype));
    } else if ((unsigned)p.comm_hook >= DT_COMM_HOOK_COUNT) {
        return dt_error(DT_ERR_INVALID_ARG, "dt_ddp_init: unknown comm hook %d", (int)p.comm_hook);
    }

    /* the dtypes of the trained parameters, in the order they first appear:
     * f32, or bf16/f16 for a model that holds them so (reduced in that dtype),
     * or both (a bf16 model whose batch norms stay f32): one reducer each */
    dt_dtype dts[DT__DDP_MAX_DTYPES] = {DT_F32, DT_F32, DT_F32};
    int ndt = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info e;
        if (dt_model_entry(m, i, &e) < 0 || e.is_buffer || e.tied_to >= 0)
            continue;
        int k = 0;
        while (k < ndt && dts[k] != e.dtype)
            k++;
        if (k == ndt) {
            if (e.dtype != DT_F32 && e.dtype != DT_BF16 && e.dtype != DT_F16)
                return dt_error(DT_ERR_UNSUPPORTED, "dt_ddp_init: parameter '%s' is %s (DDP reduces f32, bf16 and "
                                "f16 gradients)", e.name, dt_dtype_name(e.dtype));
            dts[ndt++] = e.dtype;
        }
    }
    for (int k = 0; k < ndt; k++) {
        if (dts[k] == DT_F32)
            continue;
        /* every parameter low: reduce_dtype names their dtype (the policy's default); a mix: the
           low ones reduce in their own dtype, and reduce_dtype may name it or stay f32 */
        if (p.reduce_dtype != dts[k] && (ndt == 1 || p.reduce_dtype != DT_F32))
            return dt_error(DT_ERR_UNSUPPORTED, "dt_ddp_init: %s parameters reduce their gradients in %s "
                            "(reduce_dtype is %s)", dt_dtype_name(dts[k]), dt_dtype_name(dts[k]),
                            dt_dtype_name(p.reduce_dtype));
        if (p.comm_hook == DT_COMM_HOOK_POWERSGD)
            return dt_error(DT_ERR_UNSUPPORTED, "dt_ddp_init: comm hook powersgd compresses f32 gradients; this "
                            "model has %s parameters", dt_dtype_name(dts[k]));
    }

    dt_ddp *d = dt_calloc(sizeof *d);
    if (!d)
        return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_ddp_init");
    d->pg = pg;
    d->m = m;
    d->p = p;
    d->rank = dt_pg_rank(pg);
    d->world = dt_pg_size(pg);
    d->nred = ndt;
    memcpy(d->dtype, dts, sizeof dts);
    d->nentry = dt_model_num_entries(m);
    d->np = (int)dt_model_num_params(m);
    dt_status st = DT_ERR_NO_MEMORY;
    for (int k = 0; k < ndt; k++) {
        const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, dts[k]);
        if (!P || !P->base) {
            st = dt_error(DT_ERR_INVALID_ARG, "dt_ddp_init: the model has no %s parameter memory (a meta model?)",
                          dt_dtype_name(dts[k]));
            goto fail;
        }
    }
    if (d->np <= 0 || ndt == 0) {
        st = dt_error(DT_ERR_INVALID_ARG, "dt_ddp_init: the model has no parameters");
        goto fail;
    }
    d->red_of_entry = dt_calloc(d->nentry);
    if (!d->red_of_entry) {
        dt_error(DT_ERR_NO_MEMORY, "dt_ddp_init: out of memory");
        goto fail;
    }
    d->slot_of_entry = dt_calloc(d->nentry * sizeof *d->slot_of_entry);
    d->used_local = dt_calloc((size_t)d->np);
    d->used_global = dt_calloc((size_t)d->np);
    if (!d->slot_of_entry || !d->used_local || !d->used_global) {
        dt_error(DT_ERR_NO_MEMORY, "dt_ddp_init: out of memory");
        goto fail;
    }
    memset(d->used_global, 1, (size_t)d->np);
    int np = 0;
    for (size_t i = 0; i < d->nentry; i++) {
        dt_param_info e;
        if ((st = dt_model_entry(m, i, &e)) < 0)
            goto fail;
        const bool trained = !e.is_buffer && e.tied_to < 0; /* a tied entry is its source's tensor */
        d->slot_of_entry[i] = trained ? np++ : -1;
        int k = 0;
        while (trained && dts[k] != e.dtype)
            k++;
        d->red_of_entry[i] = (int8_t)(trained ? k : -1);
    }
    d->np = np;

    if (d->world > 1) {
        if ((st = verify_across_ranks(pg, m)) < 0)
            goto fail;
        for (int k = 0; k < ndt && st >= 0; k++) {
            const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, dts[k]);
            st = dt_pg_broadcast(pg, P->base, P->total, dts[k], 0);
        }
        if (st >= 0)
            st = bcast_buffers(pg, m);
        if (st < 0) {
            dt_error_wrap(st, "dt_ddp_init: broadcasting parameters and buffers from rank 0");
            goto fail;
        }
    }

    for (int k = 0; k < ndt; k++) {
        const dt_flat *G = dt_model_flat(m, DT_FLAT_GRADS, dts[k]);
        if ((st = dt_flat_alloc(&d->gflat[k], dts[k], G->used, G->world, pg)) < 0) {
            st = dt_error_wrap(st, "dt_ddp_init: group memory for the %s gradient flat", dt_dtype_name(dts[k]));
            goto fail;
        }
        dt_reducer_params rp = dt_reducer_params_default();
        rp.bucket_cap_mb = p.bucket_cap_mb;
        rp.first_bucket_mb = p.first_bucket_mb;
        rp.predivide = p.predivide;
        /* low gradients reduce in their own dtype; f32 ones in reduce_dtype, which with a mix of dtypes
           is the policy's low dtype: there they stay f32 unless a compression hook asks for less */
        rp.reduce_dtype = dts[k] != DT_F32 ? dts[k]
                          : ndt == 1 || p.comm_hook == DT_COMM_HOOK_FP16 || p.comm_hook == DT_COMM_HOOK_BF16
                              ? p.reduce_dtype
                              : DT_F32;
        rp.collective = DT_REDUCER_ALLREDUCE;
        rp.hierarchical = p.hierarchical;
        rp.wait_hint = "DDP's gradient all-reduces are still in flight: call dt_ddp_wait(ddp) after "
                       "dt_backward and before the optimizer step (or train with dt_trainer), else the "
                       "replicas drift apart";
        if ((st = dt_reducer_init(pg, m, &d->gflat[k], &rp, &d->red[k])) < 0) {
            dt_error_wrap(st, "dt_ddp_init");
            goto fail;
        }
    }
    if (p.comm_hook == DT_COMM_HOOK_POWERSGD) {
        if ((st = dt_powersgd_init(&p.powersgd, &d->psgd)) < 0 ||
            (st = dt_reducer_register_comm_hook(d->red[0], dt_powersgd_hook(), d->psgd)) < 0) {
            dt_error_wrap(st, "dt_ddp_init");
            goto fail;
        }
    }
    for (int k = 0; k < ndt; k++)
        if ((st = dt_model_set_grads(m, dts[k], &d->gflat[k])) < 0) {
            while (k-- > 0)
                dt_model_set_grads(m, dts[k], NULL);
            goto fail;
        }
    if ((st = dt_model_add_grad_ready_hook(m, dt__ddp_grad_ready, d, &d->hook)) < 0) {
        for (int k = 0; k < ndt; k++)
            dt_model_set_grads(m, dts[k], NULL);
        goto fail;
    }
    d->hooked = true;
    d->state = DT__DDP_IDLE;
    *out = d;
    return DT_OK;
fail:
    for (int k = 0; k < DT__DDP_MAX_DTYPES; k++) {
        dt_reducer_free(d->red[k]);
        dt_flat_free(&d->gflat[k]);
    }
    dt_powersgd_free(d->psgd);
    dt_free(d->red_of_entry);
    dt_free(d->slot_of_entry);
    dt_free(d->used_local);
    dt_free(d->used_global);
    dt_free(d);
    return st < 0 ? st : DT_ERR_INTERNAL;
}

void dt_ddp_free(dt_ddp *d)
{
    if (!d)
        return;
    dt__ddp_drain(d);
    if (d->hooked) {
        dt_model_remove_hook(d->m, d->hook);
        for (int k = 0; k < d->nred; k++)
            dt_model_set_grads(d->m, d->dtype[k], NULL);
    }
    for (int k = 0; k < d->nred; k++) {
        dt_reducer_free(d->red[k]);
        dt_flat_free(&d->gflat[k]);
    }
    dt_powersgd_free(d->psgd);
    dt_free(d->red_of_entry);
    dt_free(d->slot_of_entry);
    dt_free(d->used_local);
    dt_free(d->used_global);
    dt_free(d);
}

dt_tensor *dt_ddp_forward(dt_ctx *ctx, dt_ddp *d, dt_tensor *x)
{
    if (!ctx || !d) {
        dt_error(DT_ERR_NULL, "dt_ddp_forward: %s is NULL", ctx ? "handle" : "context");
        return NULL;
    }
    /* The caller skipped dt_ddp_wait: the gradient buffer must not be
     * touched (no_sync accumulation, zero_grad) while it is reduced. */
    if (d->state == DT__DDP_REDUCING && dt_ddp_wait(d) < 0)
        return NULL;
    if (dt_ag_enabled(ctx) && !d->no_sync) {
        if (d->state == DT__DDP_FAILED) {
            dt_error(d->fail_st, "%s", d->fail_msg);
            return NULL;
        }
        if (d->state == DT__DDP_PREPARED && dt__ddp_num_ready(d) > 0) {
            dt_error(DT_ERR_STATE,
                     "DDP: the previous iteration's backward did not finish its reduction (%d of %d "
                     "gradients arrived); every synchronised forward needs a backward and dt_ddp_wait",
                     dt__ddp_num_ready(d), d->np);
            return NULL;
        }
        /* A second forward on the same tape (no backward yet) joins the
         * iteration; otherwise (fresh tape) a new iteration starts. */
        if (!(d->state == DT__DDP_PREPARED && dt_ag_tape_len(ctx) > 0))
            dt__ddp_begin_iteration(d);
        if (d->p.broadcast_buffers && d->world > 1) {
            double t = dt_time_s();
            dt_status st = bcast_buffers(d->pg, d->m);
            d->st.buffer_bcast_s += dt_time_s() - t;
            if (st < 0) {
                dt_error_wrap(st, "DDP: broadcasting buffers from rank 0");
                return NULL;
            }
        }
        if (dt_ag_mark(ctx, dt__ddp_end_mark, d) < 0)
            return NULL;
        d->marks_live++;
    }
    return dt_model_forward(ctx, d->m, x);
}

dt_status dt_ddp_sync_buffers(dt_ddp *d)
{
    if (!d)
        return dt_error(DT_ERR_NULL, "dt_ddp_sync_buffers: handle is NULL");
    if (d->world == 1)
        return DT_OK;
    if (d->state == DT__DDP_REDUCING) {
        dt_status st = dt_ddp_wait(d);
        if (st < 0)
            return st;
    }
    dt_status st = bcast_buffers(d->pg, d->m);
    return st < 0 ? dt_error_wrap(st, "DDP: broadcasting buffers from rank 0") : DT_OK;
}

void dt_ddp_set_no_sync(dt_ddp *d, bool on)
{
    if (d)
        d->no_sync = on;
}

bool dt_ddp_no_sync(const dt_ddp *d) { return d && d->no_sync; }

dt_model *dt_ddp_model(const dt_ddp *d) { return d ? d->m : NULL; }

dt_pg *dt_ddp_pg(const dt_ddp *d) { return d ? d->pg : NULL; }

dt_reducer *dt_ddp_reducer(const dt_ddp *d) { return d ? d->red[0] : NULL; }

dt_powersgd *dt_ddp_powersgd(const dt_ddp *d) { return d ? d->psgd : NULL; }
