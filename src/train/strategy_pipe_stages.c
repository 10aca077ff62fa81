/* The "pipe" strategy (pipe_strategy.h): what a pipeline rank holds and
 * steps. From the cut, the stage of every entry's storage (the first that
 * uses it) and which ranks use it; per dtype, this rank's entries as an
 * optimizer range with, under ZeRO-1, its share over the replicas; with
 * DT_PIPE_BY_TIME, the units' measured costs agreed over the world; then
 * the rank keeps (or, for a meta model, maps and initialises) only its
 * stages' parts of the flats. strategy_pipe.c's attach calls these in
 * that order. */
#include "train/strategy_pipe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt__pipe_dt_index(dt_dtype t)
{
    for (int k = 0; k < NDT; k++)
        if (k_dts[k] == t)
            return k;
    return -1;
}

static int cmp_seg(const void *a, const void *b)
{
    const dt_optim_segment *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Stage of every entry's storage: the first stage using it (-1: none), and
 * which pipeline ranks use it (users[key * P + rank]). */
dt_status dt__pipe_ownership(pipe_strategy *s, int *owner, bool *users)
{
    size_t ne = dt_model_num_entries(s->m);
    for (size_t e = 0; e < ne; e++)
        owner[e] = -1;
    for (int st = 0; st < s->S; st++)
        for (int u = s->starts[st]; u < s->starts[st + 1]; u++)
            for (size_t e = 0; e < ne; e++) {
                dt_param_info pi;
                dt_status rc = dt_model_entry(s->m, e, &pi);
                if (rc < 0)
                    return rc;
                if (pi.is_buffer || !dt_pipe_unit_uses(&s->units[u], pi.name))
                    continue;
                size_t key = pi.tied_to >= 0 ? (size_t)pi.tied_to : e;
                if (owner[key] < 0 || st < owner[key])
                    owner[key] = st;
                users[key * (size_t)s->P + (size_t)dt_pipe_stage_rank(s->P, st)] = true;
            }
    return DT_OK;
}

/* Range k from its entries (fsegs): the span, this rank's ZeRO-1 share
 * (the replicas split the stage's elements evenly, in offset order), the
 * clipped segments and the optimizer's view. */
dt_status dt__pipe_make_range(pipe_strategy *s, int k)
{
    prange *R = &s->rk[k];
    R->P = dt_model_flat(s->m, DT_FLAT_PARAMS, k_dts[k]);
    R->G = dt_model_flat(s->m, DT_FLAT_GRADS, k_dts[k]);
    if (!R->P || R->P->used == 0)
        return DT_OK;
    if (!R->G || !R->P->base || !R->G->base)
        return dt_error(DT_ERR_UNSUPPORTED, "pipe: the model has no allocated %s parameters and gradients",
                        dt_dtype_name(k_dts[k]));
    qsort(R->fsegs, R->nfseg, sizeof *R->fsegs, cmp_seg);
    size_t total = 0;
    for (size_t i = 0; i < R->nfseg; i++)
        total += R->fsegs[i].numel;
    if (R->nfseg) {
        R->lo = R->fsegs[0].offset;
        R->hi = R->fsegs[R->nfseg - 1].offset + R->fsegs[R->nfseg - 1].numel;
    }
    R->a = R->lo, R->b = R->hi;
    if (s->p.zero == 1 && s->dp) {
        int D = s->D, d = dt_pg_rank(s->dp);
        R->counts = dt_calloc((size_t)D * sizeof *R->counts);
        R->displs = dt_calloc((size_t)D * sizeof *R->displs);
        if (!R->counts || !R->displs)
            return dt_error(DT_ERR_NO_MEMORY, "pipe: ZeRO-1 shares");
        size_t prev = R->lo;
        for (int j = 0; j < D; j++) {
            /* the offset of owned element number (j + 1) total / D */
            size_t want = (size_t)(((unsigned long long)total * (unsigned long long)(j + 1)) / (unsigned long long)D);
            size_t end = R->hi, cum = 0;
            for (size_t i = 0; i < R->nfseg && j + 1 < D; i++) {
                if (cum + R->fsegs[i].numel >= want) {
                    end = R->fsegs[i].offset + (want - cum);
                    break;
                }
                cum += R->fsegs[i].numel;
            }
            end = end < prev ? prev : end;
            R->displs[j] = prev - R->lo;
            R->counts[j] = end - prev;
            if (j == d)
                R->a = prev, R->b = end;
            prev = end;
        }
        if (R->b > R->a && !(R->rs = dt_alloc((R->b - R->a) * dt_dtype_size(R->G->dtype))))
            return dt_error(DT_ERR_NO_MEMORY, "pipe: ZeRO-1 gradient share");
    }
    /* the runs: fsegs no further apart than a 64-byte entry alignment's padding */
    const size_t es = dt_dtype_size(R->G->dtype);
    if (R->nfseg && !(R->runs = dt_calloc(2 * R->nfseg * sizeof *R->runs)))
        return dt_error(DT_ERR_NO_MEMORY, "pipe: runs of the stages' entries");
    for (size_t i = 0, x = R->nfseg ? R->fsegs[0].offset : 0; i < R->nfseg; i++) {
        size_t y = R->fsegs[i].offset + R->fsegs[i].numel;
        if (i + 1 < R->nfseg && R->fsegs[i + 1].offset <= y + DT_ALIGN / es)
            continue;
        R->runs[2 * R->nrun] = x, R->runs[2 * R->nrun + 1] = y, R->nrun++;
        if (i + 1 < R->nfseg)
            x = R->fsegs[i + 1].offset;
    }
    if (R->counts && R->nrun) { /* the shares partition [lo, hi), so their pieces of a run partition it */
        const size_t D = (size_t)s->D;
        R->rcounts = dt_calloc(R->nrun * D * sizeof *R->rcounts);
        R->rdispls = dt_calloc(R->nrun * D * sizeof *R->rdispls);
        if (!R->rcounts || !R->rdispls)
            return dt_error(DT_ERR_NO_MEMORY, "pipe: ZeRO-1 shares of the runs");
        for (size_t r = 0; r < R->nrun; r++)
            for (size_t j = 0, at = 0; j < D; j++) {
                size_t x = R->runs[2 * r], y = R->runs[2 * r + 1];
                size_t s0 = R->lo + R->displs[j], s1 = s0 + R->counts[j];
                s0 = s0 < x ? x : s0 > y ? y : s0;
                s1 = s1 < x ? x : s1 > y ? y : s1;
                R->rcounts[r * D + j] = s1 - s0;
                R->rdispls[r * D + j] = at;
                at += s1 - s0;
            }
    }
    for (size_t i = 0; i < R->nfseg; i++) {
        size_t x = R->fsegs[i].offset, y = x + R->fsegs[i].numel;
        x = x < R->a ? R->a : x;
        y = y > R->b ? R->b : y;
        if (x < y)
            R->segs[R->nseg++] = (dt_optim_segment){.offset = x, .numel = y - x, .no_decay = false};
    }
    R->has_master = k_dts[k] != DT_F32; /* an empty range too: the optimizer steps f32 masters */
    s->range[s->nrange++] = (dt_optim_range){.params = R->has_master ? &R->master : R->P, .grads = R->G,
                                             .mirror = R->has_master ? R->P : NULL, .lo = R->a, .hi = R->b,
                                             .segs = R->segs, .nseg = R->nseg};
    return DT_OK;
}

/* DT_PIPE_BY_TIME: every rank times every unit on the sample (the ranks of
 * a tp group in step, their layers' collectives matching: hence the shape
 * check first, over the world, before anything runs); the world takes the
 * mean of the ranks' times and rank 0's copy of it, so that every rank
 * (every replica of a stage) cuts alike. A rank whose timing fails says so
 * in the same all-reduce (and, with tp, fails its tp group first, so that
 * its tp peers cannot wait in a collective it will not join): every rank
 * then fails. */
#define PIPE_TIME_REPS 3

dt_status dt__pipe_timed_costs(pipe_strategy *s, dt_model *m, double *cost)
{
    const int n = s->nunits, W = dt_pg_size(s->world);
    double hi[2 + DT_MAX_DIMS] = {s->sample_nd, (double)s->sample_dt}, lo[2 + DT_MAX_DIMS];
    for (int d = 0; d < s->sample_nd; d++)
        hi[2 + d] = (double)s->sample_shape[d];
    memcpy(lo, hi, sizeof lo);
    dt_status st = dt_metrics_allreduce(s->world, hi, 2 + DT_MAX_DIMS, DT_REDUCE_MAX);
    if (st >= 0)
        st = dt_metrics_allreduce(s->world, lo, 2 + DT_MAX_DIMS, DT_REDUCE_MIN);
    if (st < 0)
        return dt_error_wrap(st, "pipe: agreeing on the sample's shape (DT_PIPE_BY_TIME)");
    if (memcmp(hi, lo, sizeof hi))
        return dt_error(DT_ERR_INVALID_ARG, "pipe: DT_PIPE_BY_TIME: the ranks' samples differ in shape or dtype (this "
                        "rank's: %d dims, batch %lld, %s); give every rank a sample of the same shape",
                        s->sample_nd, (long long)s->sample_shape[0], dt_dtype_name(s->sample_dt));
    double *t = dt_calloc((size_t)(n + 1) * sizeof *t);
    if (!t)
        return dt_error(DT_ERR_NO_MEMORY, "pipe: unit times");
    dt_tensor x;
    char msg[512] = "";
    st = dt_tensor_init_contiguous(&x, s->sample_dt, s->sample_nd, s->sample_shape, s->sample);
    if (st >= 0)
        st = dt_pipe_unit_times(m, s->units, n, &x, s->amp, PIPE_TIME_REPS, t);
    if (st < 0) {
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        for (int i = 0; i < n; i++)
            t[i] = 0;
        t[n] = 1; /* failed here */
        if (s->T > 1)
            dt_pg_fail(dt_mesh_dim_group(s->mesh, 1), st, msg);
    }
    dt_status st2 = dt_metrics_allreduce(s->world, t, n + 1, DT_REDUCE_SUM);
    for (int i = 0; i < n; i++)
        t[i] /= W;
    if (st2 >= 0 && t[n] == 0)
        st2 = dt_pg_broadcast(s->world, t, (size_t)n, DT_F64, 0);
    if (st < 0)
        st = dt_error(st, "pipe: timing the units (DT_PIPE_BY_TIME): %s", msg);
    else if (st2 < 0)
        st = dt_error_wrap(st2, "pipe: agreeing on the units' times (DT_PIPE_BY_TIME)");
    else if (t[n] > 0)
        st = dt_error(DT_ERR_STATE, "pipe: timing the units (DT_PIPE_BY_TIME) failed on %g other rank(s)", t[n]);
    if (st >= 0)
        memcpy(cost, t, (size_t)n * sizeof *cost);
    dt_free(t);
    return st;
}

/* From here on this rank holds only the parameters (and gradients) its
 * stages use, its own and the shared ones: the pages of the model's flats
 * outside them go back to the system (dt__model_keep_only), so a rank's
 * parameters and gradients take about 1/p of the model's. Called at the
 * end of attach, after the broadcasts that wrote the whole flats. */
dt_status dt__pipe_keep_stages(pipe_strategy *s, const bool *users)
{
    const size_t ne = dt_model_num_entries(s->m);
    size_t *spans = dt_calloc(2 * (ne + 1) * sizeof *spans);
    if (!spans)
        return dt_error(DT_ERR_NO_MEMORY, "pipe: the stages' spans");
    dt_status st = DT_OK;
    for (int k = 0; k < NDT && st >= 0; k++) {
        const dt_flat *P = dt_model_flat(s->m, DT_FLAT_PARAMS, k_dts[k]);
        if (!P || !P->used)
            continue;
        size_t n = 0;
        /* within a dtype, entries come in offset order (model.c) */
        for (size_t e = 0; e < ne && st >= 0; e++) {
            dt_param_info pi;
            if ((st = dt_model_entry(s->m, e, &pi)) < 0 || s->eown[e] < 0 || pi.dtype != k_dts[k])
                continue;
            if (s->eown[e] != s->pr && !users[e * (size_t)s->P + (size_t)s->pr])
                continue;
            if (n && spans[2 * n - 1] >= pi.offset) /* touching: one span */
                spans[2 * n - 1] = pi.offset + pi.numel;
            else
                spans[2 * n] = pi.offset, spans[2 * n + 1] = pi.offset + pi.numel, n++;
        }
        if (st >= 0)
            st = dt__model_keep_only(s->m, k_dts[k], spans, n);
    }
    dt_free(spans);
    return st;
}

/* A meta model (dt_model_build_params.meta): this rank's stages' entries
 * are recorded as what it holds (keep_stages: nothing is mapped yet, so
 * nothing is given back), the flats are mapped (dt__model_materialize:
 * nothing resident) and only those entries are initialised, to a whole
 * build's values (dt_model_init_range with params.init_rng and
 * init_seed). The other stages' pages are never written, at any point. */
dt_status dt__pipe_init_stages(pipe_strategy *s, const bool *users)
{
    dt_status st = dt__pipe_keep_stages(s, users);
    if (st >= 0)
        st = dt__model_materialize(s->m);
    for (int k = 0; k < NDT && st >= 0; k++) {
        const dt_flat *P = dt_model_flat(s->m, DT_FLAT_PARAMS, k_dts[k]);
        const size_t *sp = s->m->keep[k_dts[k]];
        for (size_t i = 0; sp && i < s->m->nkeep[k_dts[k]] && st >= 0; i++) {
            dt_flat v;
            if ((st = dt_flat_range(P, sp[2 * i], sp[2 * i + 1], &v)) >= 0)
                st = dt_model_init_range(s->m, s->p.init_rng, s->p.init_seed, &v);
        }
    }
    return st < 0 ? dt_error_wrap(st, "pipe: initialising the stages of a meta model") : st;
}

/* DT_PIPE_BY_TIME: keep params.sample's x (the caller's batch is borrowed
 * until init returns). */
dt_status dt__pipe_copy_sample(pipe_strategy *s)
{
    const dt_trainer_batch *b = s->p.sample;
    if (!b || !b->x)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: balance DT_PIPE_BY_TIME needs params.sample (a "
                        "micro-batch of the model's input to time the units on)%s", b ? ": its x is NULL" : "");
    if (b->x_ndim < 1 || b->x_ndim > DT_MAX_DIMS || (unsigned)b->x_dtype >= DT_DTYPE_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: params.sample has %d dims (1..%d) or an unknown "
                        "dtype", b->x_ndim, DT_MAX_DIMS);
    size_t numel = 1;
    for (int d = 0; d < b->x_ndim; d++) {
        if (b->x_shape[d] < 1 || b->x_shape[d] > ((int64_t)1 << 40))
            return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: params.sample's dim %d is %lld", d,
                            (long long)b->x_shape[d]);
        numel *= (size_t)b->x_shape[d];
    }
    size_t bytes = numel * dt_dtype_size(b->x_dtype);
    if (!(s->sample = dt_alloc(bytes ? bytes : 1)))
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_pipe_init: a copy of params.sample (%zu bytes)", bytes);
    memcpy(s->sample, b->x, bytes);
    s->sample_dt = b->x_dtype;
    s->sample_nd = b->x_ndim;
    memcpy(s->sample_shape, b->x_shape, (size_t)b->x_ndim * sizeof *s->sample_shape);
    return DT_OK;
}
