/* ZeRO stages 1-3 / FSDP: sharded optimizer state, gradients and parameters
 * over units (parallel.h has the semantics).
 *
 * Units. The wrap policy (zero_wrap.c) picks modules; each unit owns the f32
 * parameters of its module minus those of nested units, laid out in model
 * order in its own flat buffer (FSDP's FlatParameter): every tensor on a
 * 64-byte boundary, the flat padded to a multiple of W * 16 elements, so rank
 * r owns the equal range [r*c, (r+1)*c) with c = total / W. With stage 3 the
 * parameters smaller than param_persistence_threshold leave their units for
 * one "persistent" unit (index 0) that stays gathered, as DeepSpeed's
 * persistent parameters do.
 *
 * Memory. A unit's whole parameters and whole gradients live in two mmap'd
 * regions whose addresses never change: the model's tensors are bound to
 * them once (dt_model_bind_param), and a tape that saved a weight pointer in
 * forward still finds the weight there in backward. "Freeing" a unit is
 * madvise(MADV_DONTNEED): its pages go back to the system (RSS drops) and
 * read as zero until the next all-gather writes them; a gradient region
 * released that way is also zeroed for free, and it takes physical memory
 * only from the first gradient written into it. Only the shards (stage 3
 * parameters, stage 2/3 gradients) are ordinary allocations. Buffers that
 * are never freed (resident units' parameters, stage 1's gradients) come
 * from dt_pg_alloc instead when it has room ("shared buffers" below).
 *
 * Collectives. Gradients: a grad-ready hook counts each unit's parameters;
 * a complete unit's reduction (a reduce-scatter AVG into the owner's shard,
 * which for stage 1 is its range of the whole gradients; stage 1 with
 * reduce_scatter off: an all-reduce AVG of the whole unit) is posted on pg,
 * strictly in descending unit index on every rank (a unit that completes
 * early waits for its predecessors, like the reducer's buckets); units not
 * complete when backward ends are posted at the wait (their missing
 * gradients count as zero). Parameters: all-gathers run on a duplicate of
 * pg (its own progress engine), so a prefetch overlaps both the compute and
 * the gradient reduce-scatters. Stage 3 gathers a unit in its forward
 * pre-hook and backward pre-hook (waiting only for what the prefetch has
 * not finished) and frees it after forward (reshard_after_forward; never
 * the root unit) and after backward. Stages 1/2 keep every unit whole and
 * all-gather the updated shards after the step.
 *
 * Cross-rank order. The per-step check all-reduces each unit's gather count
 * (MAX and -MIN in one call): a unit that ran on one rank but not on another
 * is an error naming the unit. Collective mismatches before that (a gather
 * of another size) fail in the comm layer and are reported with the unit's
 * name. */
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/kernels.h"
#include "dtrain/precision.h"
#include "nn/nn_layer.h"
#include "parallel/zero/zero_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

dt_zero_params dt_zero_params_default(void)
{
    dt_zero_params p;
    memset(&p, 0, sizeof p);
    p.stage = 3;
    p.reshard_after_forward = true;
    p.wrap_min_params = 0;
    p.wrap_module_type = NULL;
    p.wrap_fn = NULL;
    p.wrap_ud = NULL;
    p.backward_prefetch = DT_PREFETCH_BACKWARD_PRE;
    p.forward_prefetch = false;
    p.limit_all_gathers = true;
    p.page_pool = true;
    p.sync_module_states = false;
    p.init_rng = DT_INIT_PHILOX;
    p.init_seed = 0;
    p.overlap_comm = true;
    p.reduce_scatter = true;
    p.contiguous_gradients = true;
    p.reduce_bucket_size = 500000000;
    p.allgather_bucket_size = 500000000;
    p.prefetch_bucket_size = 50000000;
    p.param_persistence_threshold = 0;
    p.max_live_parameters = 1000000000;
    p.max_reuse_distance = 0;
    p.sub_group_size = 1000000000;
    p.round_robin_gradients = false;
    p.hybrid_shard_size = 0;
    p.reduce_dtype = DT_DTYPE_COUNT;
    p.offload_param = dt_offload_params_default();
    p.offload_param.buffer_count = 5; /* DeepSpeed's offload_param default */
    p.quantized_weights = false;
    p.quantized_gradients = false;
    p.hpz_partition_size = 1;
    p.quant_block = 2048;
    p.quant_grad_bits = 4;
    p.quant_grad_block = 64;
    return p;
}

const char *dt_prefetch_name(dt_backward_prefetch b)
{
    switch (b) {
    case DT_PREFETCH_NONE:
        return "none";
    case DT_PREFETCH_BACKWARD_PRE:
        return "backward_pre";
    case DT_PREFETCH_BACKWARD_POST:
        return "backward_post";
    default:
        return "?";
    }
}

dt_status dt_prefetch_parse(const char *s, dt_backward_prefetch *out)
{
    for (int k = 0; s && k <= DT_PREFETCH_BACKWARD_POST; k++)
        if (!strcmp(s, dt_prefetch_name((dt_backward_prefetch)k))) {
            if (out)
                *out = (dt_backward_prefetch)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown backward prefetch '%s' (none, backward_pre, backward_post)",
                    s ? s : "(null)");
}

static const char *const k_sharding_names[] = {"no_shard", "shard_grad_op", "full_shard", "hybrid_shard"};
_Static_assert(DT_FSDP_SHARDING_COUNT == 4, "one name per sharding strategy");

const char *dt_fsdp_sharding_name(dt_fsdp_sharding s)
{
    return (unsigned)s < DT_FSDP_SHARDING_COUNT ? k_sharding_names[s] : "?";
}

dt_status dt_fsdp_sharding_parse(const char *s, dt_fsdp_sharding *out)
{
    for (int k = 0; s && k < DT_FSDP_SHARDING_COUNT; k++)
        if (!strcmp(s, k_sharding_names[k])) {
            if (out)
                *out = (dt_fsdp_sharding)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown FSDP sharding strategy '%s' (no_shard, shard_grad_op, full_shard, "
                                        "hybrid_shard)", s ? s : "(null)");
}

/* ---- parameter gathers --------------------------------------------------------------- */

dt_status dt__zero_unit_err(const zunit *u, dt_status st, const char *what)
{
    return dt_error_wrap(st, "ZeRO unit '%s' (%d): %s", u->name, u->index, what);
}

static dt_status unit_err(const zunit *u, dt_status st, const char *what) { return dt__zero_unit_err(u, st, what); }

static dt_status wait_gather(dt_zero *z, zunit *u)
{
    if (!u->ag)
        return DT_OK;
    dt_status st = dt_req_wait(u->ag, -1);
    char msg[512];
    snprintf(msg, sizeof msg, "all-gather: %s", st < 0 ? dt_req_message(u->ag) : "");
    dt_status st2 = dt__zpp_finish_gather(z, u, st); /* ZeRO++: dequantize, drop the secondary shard */
    dt_req_free(u->ag);
    u->ag = NULL;
    for (int i = 0; i < z->ninflight; i++)
        if (z->inflight[i] == u->index) {
            memmove(z->inflight + i, z->inflight + i + 1, (size_t)(z->ninflight - i - 1) * sizeof *z->inflight);
            z->ninflight--;
            break;
        }
    dt__zo_drop(z, u); /* parameter offload: the shard's buffer is no longer needed */
    if (st < 0)
        return dt_error(st, "ZeRO unit '%s' (%d): %s", u->name, u->index, msg);
    return st2 < 0 ? unit_err(u, st2, "dequantizing the gathered parameters (qwZ)") : DT_OK;
}

/* Post unit u's all-gather (stage 3) unless it is whole or on its way;
 * bwd: for its backward (hpZ gathers those in the secondary group). */
static dt_status post_gather(dt_zero *z, zunit *u, bool bwd)
{
    if (u->gathered || u->ag)
        return DT_OK;
    /* limit_all_gathers: at most two all-gathers in flight (FSDP's rate limiter) */
    while (z->p.limit_all_gathers && z->ninflight >= 2) {
        dt_status st = wait_gather(z, &z->u[z->inflight[0]]);
        if (st < 0)
            return st;
    }
    /* parameter offload: the shard read in first; a failed read is held
     * for the step's check and the gather goes on (the peers are in it) */
    dt_status st = dt__zo_hold(z, dt__zo_ready(z, u));
    if (st >= 0)
        st = dt__zo_buffer(z, u); /* a held failure left no buffer: gather zeros */
    if (st < 0)
        return st;
    dt__zero_pool_take(z, u);
    dt__zero_live_add(z, dt__zero_unit_bytes(u));
    u->gathered = true;
    u->gathers++;
    u->prefetched = false;
    z->stats.gathers++;
    z->stats.bytes_gathered += dt__zero_unit_bytes(u);
    dt_pg_set_labelf(z->gpg, "ZeRO unit %d gather", u->index); /* the flight recorder's label */
    bool posted;
    st = dt__zpp_post_gather(z, u, bwd, &posted); /* ZeRO++: in the hpZ group, or quantized */
    if (st >= 0 && !posted)
        st = dt_pg_allgather_async(z->gpg, u->pshard, u->full, u->c, u->dtype, &u->ag);
    if (st < 0)
        return unit_err(u, st, "posting the all-gather");
    z->inflight[z->ninflight++] = u->index;
    return DT_OK;
}

static dt_status ensure_gathered(dt_zero *z, zunit *u, bool bwd)
{
    if (u->prefetched) { /* a prefetch got here first */
        z->stats.prefetched++;
        if (!u->ag || dt_req_test(u->ag) == DT_OK)
            z->stats.ready_when_needed++;
        u->prefetched = false;
    }
    dt_status st = post_gather(z, u, bwd);
    return st < 0 ? st : wait_gather(z, u);
}

/* Prefetch unit k (an index into the recorded forward order) when the knobs
 * allow it. */
static dt_status prefetch(dt_zero *z, int k, bool bwd)
{
    if (!z->order_done || k < 0 || k >= z->norder)
        return DT_OK;
    zunit *n = &z->u[z->order[k]];
    if (n->gathered || n->ag)
        return DT_OK;
    if (n->total > z->p.prefetch_bucket_size || (z->live + dt__zero_unit_bytes(n)) / sizeof(float) > z->p.max_live_parameters)
        return DT_OK;
    dt_status st = post_gather(z, n, bwd);
    n->prefetched = st >= 0;
    return st;
}

/* ---- gradient reductions --------------------------------------------------------------- */

static dt_status post_reduce(dt_zero *z, zunit *u)
{
    dt_status st;
    dt__zero_grads_touch(z, u); /* a unit without any gradient reduces zeros */
    void *g = u->gfull;
    if (u->rfull) { /* reduce in the policy's dtype: one rounding (or exact widening) of the whole */
        if ((st = dt_k_convert(u->gfull, u->dtype, u->rfull, u->rdt, (int64_t)u->total)) < 0)
            return unit_err(u, st, "converting the gradients to the reduce dtype");
        g = u->rfull;
    }
    dt_pg *rg = z->hpg ? z->hpg : z->pg;
    /* stage 1: gshard is this rank's range of g, so the reduce-scatter
     * runs in place (recv == send + rank * c) and leaves the other ranges
     * holding this rank's own gradients, which nothing reads */
    const bool ar = z->p.stage == 1 && !z->p.reduce_scatter;
    dt_pg_set_labelf(rg, "ZeRO unit %d reduce", u->index); /* the flight recorder's label */
    if (z->zpp) { /* qgZ: the quantized two-hop reduce-scatter, now (no request to wait for) */
        st = dt__zpp_reduce(z, u, g);
        if (st < 0)
            return unit_err(u, st, "the quantized gradient reduce-scatter (qgZ)");
        u->posted = true;
        z->stats.bytes_reduced += dt__zero_unit_rbytes(u);
        dt__zero_release_grads(z, u);
        return DT_OK;
    }
    if (ar)
        st = dt_pg_allreduce_async(rg, DT_IN_PLACE, g, u->total, u->rdt, DT_REDUCE_AVG, &u->rs);
    else
        st = dt_pg_reduce_scatter_async(rg, g, u->gshard, u->c, u->rdt, DT_REDUCE_AVG, &u->rs);
    if (st < 0)
        return unit_err(u, st, ar ? "posting the gradient all-reduce" : "posting the gradient reduce-scatter");
    u->posted = true;
    z->stats.bytes_reduced += dt__zero_unit_rbytes(u);
    if (!z->p.overlap_comm)
        return dt_req_wait(u->rs, -1) < 0 ? unit_err(u, dt_req_status(u->rs), dt_req_message(u->rs)) : DT_OK;
    return DT_OK;
}

/* Release the whole gradients of units whose reduce-scatter completed. */
static void reap_reduces(dt_zero *z)
{
    if (z->p.stage < 2)
        return;
    for (int i = z->nu - 1; i >= 0; i--) {
        zunit *u = &z->u[i];
        if (u->rs && dt_req_test(u->rs) == DT_OK) {
            dt_req_free(u->rs);
            u->rs = NULL;
            dt__zero_release_grads(z, u);
        }
    }
}

/* Post every complete unit whose predecessors (higher indices) are posted. */
static dt_status post_ready(dt_zero *z, bool all)
{
    while (z->next_post >= 0) {
        zunit *u = &z->u[z->next_post];
        if (!all && u->nready < u->nent)
            break;
        dt_status st = post_reduce(z, u);
        if (st < 0)
            return st;
        z->next_post--;
    }
    reap_reduces(z);
    return DT_OK;
}

static dt_status on_grad_ready(dt_model *m, size_t index, const dt_param_info *p, void *ud)
{
    (void)m;
    (void)p;
    dt_zero *z = ud;
    if (index >= z->nentry || z->entry_unit[index] < 0)
        return DT_OK;
    zunit *u = &z->u[z->entry_unit[index]];
    dt__zero_grads_touch(z, u);
    if (!z->sync)
        return DT_OK;
    if (u->posted)
        return dt_error(DT_ERR_STATE, "ZeRO unit '%s' (%d): a gradient of '%s' arrived after the unit was reduced "
                                      "(a parameter used again after its unit's backward)",
                        u->name, u->index, p->name);
    u->nready++;
    return post_ready(z, false);
}

/* ---- module hooks (stage 3) ------------------------------------------------------------ */

static dt_status fwd_pre(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx;
    (void)x;
    (void)m;
    zunit *u = ud;
    dt_zero *z = u->z;
    const int k = u->index;
    if (!z->order_done) { /* record the forward order of the first iteration */
        bool seen = false;
        for (int i = 0; i < z->norder; i++)
            seen |= z->order[i] == k;
        if (!seen) {
            u->fwd_pos = z->norder;
            z->order[z->norder++] = k;
        }
    }
    dt_status st = ensure_gathered(z, u, false);
    dt__zo_readahead(z, u->fwd_pos);
    if (st >= 0 && z->p.forward_prefetch)
        st = prefetch(z, u->fwd_pos + 1, false);
    reap_reduces(z);
    return st;
}

static dt_status fwd_post(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)ctx;
    (void)x;
    (void)y;
    zunit *u = ud;
    dt_zero *z = u->z;
    if (!z->p.reshard_after_forward || m == dt_model_root(z->m))
        return DT_OK;
    if (z->order_done && z->p.max_reuse_distance > 0) {
        /* elements gathered between this unit's forward end and its backward start */
        size_t dist = 0;
        for (int i = u->fwd_pos + 1; i < z->norder; i++)
            dist += z->u[z->order[i]].total;
        if (dist < z->p.max_reuse_distance)
            return DT_OK;
    }
    dt__zpp_keep_secondary(z, u); /* hpZ: this rank's slice for the backward gather */
    dt__zero_unit_reshard(z, u);
    dt__zo_readahead(z, u->fwd_pos); /* the last units' backward comes next */
    return DT_OK;
}

static dt_status bwd_pre(dt_ctx *ctx, dt_module *m, void *ud)
{
    (void)ctx;
    (void)m;
    zunit *u = ud;
    dt_zero *z = u->z;
    dt_status st = ensure_gathered(z, u, true);
    dt__zo_readahead(z, 2 * z->norder - 1 - u->fwd_pos);
    if (st >= 0 && z->p.backward_prefetch == DT_PREFETCH_BACKWARD_PRE)
        st = prefetch(z, u->fwd_pos - 1, true);
    reap_reduces(z);
    return st;
}

static dt_status bwd_post(dt_ctx *ctx, dt_module *m, void *ud)
{
    (void)ctx;
    (void)m;
    zunit *u = ud;
    dt_zero *z = u->z;
    dt__zero_unit_reshard(z, u);
    dt_status st = DT_OK;
    if (z->p.backward_prefetch == DT_PREFETCH_BACKWARD_POST)
        st = prefetch(z, u->fwd_pos - 1, true);
    reap_reduces(z);
    return st;
}

/* ---- the step ---------------------------------------------------------------------------- */

void dt_zero_set_sync(dt_zero *z, bool sync)
{
    if (!z)
        return;
    if (z->need_clear) { /* a new step: the last one's whole gradients (stage 1) go */
        for (int i = 0; i < z->nu; i++)
            if (z->p.stage == 1)
                dt__zero_clear_grads(&z->u[i], z->rank);
            else
                dt__zero_release_grads(z, &z->u[i]);
        z->need_clear = false;
    }
    z->sync = sync;
    if (sync) {
        for (int i = 0; i < z->nu; i++) {
            z->u[i].nready = 0;
            z->u[i].posted = false;
        }
        z->next_post = z->nu - 1;
    }
}

/* Wait for the outstanding reductions; *first_err keeps the first failure. */
static void drain(dt_zero *z, dt_status *first_err)
{
    for (int i = z->nu - 1; i >= 0; i--) {
        zunit *u = &z->u[i];
        if (u->ag) {
            dt_status st = wait_gather(z, u);
            if (st < 0 && *first_err >= 0)
                *first_err = st;
        }
        if (u->rs) {
            dt_status st = dt_req_wait(u->rs, -1);
            if (st < 0 && *first_err >= 0)
                *first_err = unit_err(u, st, dt_req_message(u->rs));
            dt_req_free(u->rs);
            u->rs = NULL;
            if (z->p.stage >= 2)
                dt__zero_release_grads(z, u);
        }
    }
}

dt_status dt_zero_wait(dt_zero *z)
{
    if (!z)
        return dt_error(DT_ERR_NULL, "dt_zero_wait: handle is NULL");
    dt_status st = DT_OK;
    if (z->sync)
        st = post_ready(z, true); /* units still missing gradients reduce what they have */
    drain(z, &st);
    z->need_clear = true;
    if (z->pstore && z->sync) /* parameter offload: a read failed on some rank in this step? */
        st = dt__zo_agree(z, st, "reading a parameter shard");
    if (st < 0)
        return st;
    if (z->rpg && z->sync && z->p.stage >= 2) {
        /* hybrid: the group's averaged shards, averaged over the replicas */
        dt_req **rq = z->rr;
        for (int i = 0; i < z->nu && st >= 0; i++) {
            st = dt_pg_allreduce_async(z->rpg, DT_IN_PLACE, z->u[i].gshard, z->u[i].c, z->u[i].rdt, DT_REDUCE_AVG,
                                       &rq[i]);
            if (st < 0)
                unit_err(&z->u[i], st, "posting the replica all-reduce");
        }
        dt_status st2 = dt_req_wait_all(rq, z->nu, -1);
        for (int i = 0; i < z->nu; i++) {
            dt_req_free(rq[i]);
            rq[i] = NULL;
        }
        if (st < 0)
            return st;
        if (st2 < 0)
            return dt_error_wrap(st2, "ZeRO: the replica all-reduce of the gradients");
    }
    z->order_done = true;
    /* every rank gathered every unit the same number of times */
    if (z->W > 1 && z->p.stage == 3 && z->sync) {
        double *v = z->check;
        for (int i = 0; i < z->nu; i++) {
            v[i] = (double)z->u[i].gathers;
            v[z->nu + i] = -(double)z->u[i].gathers;
        }
        if ((st = dt_pg_allreduce(z->pg, DT_IN_PLACE, v, (size_t)(2 * z->nu), DT_F64, DT_REDUCE_MAX)) < 0)
            return dt_error_wrap(st, "ZeRO: checking the units' collective order");
        for (int i = 0; i < z->nu; i++) {
            if (v[i] != -v[z->nu + i])
                return dt_error(DT_ERR_MISMATCH, "ZeRO unit '%s' (%d) was gathered %.0f times on some rank and %.0f "
                                                 "on another in this step: every rank must run the same units in the "
                                                 "same order",
                                z->u[i].name, i, v[i], -v[z->nu + i]);
            z->u[i].gathers = 0;
        }
    }
    return DT_OK;
}

dt_status dt_zero_after_step(dt_zero *z)
{
    if (!z)
        return dt_error(DT_ERR_NULL, "dt_zero_after_step: handle is NULL");
    /* whole units: gather the updated shards (in place), posting ahead up
     * to allgather_bucket_size elements; stage 3 units: stale until the next
     * forward gathers them */
    dt_req *pending[64];
    int np = 0;
    size_t posted = 0;
    dt_status st = DT_OK;
    for (int i = 0; i < z->nu && st >= 0; i++) {
        zunit *u = &z->u[i];
        if (!u->resident) {
            dt__zero_unit_reshard(z, u);
            dt__zpp_drop_secondary(z, u); /* hpZ: the parameters changed */
            continue;
        }
        if (z->W == 1)
            continue;
        if (np == 64 || (np > 0 && posted + u->total > z->p.allgather_bucket_size)) {
            st = dt_req_wait_all(pending, np, -1);
            for (int j = 0; j < np; j++)
                dt_req_free(pending[j]);
            np = 0;
            posted = 0;
            if (st < 0)
                return dt_error_wrap(st, "ZeRO: gathering the updated parameters");
        }
        st = dt_pg_allgather_async(z->pg, DT_IN_PLACE, u->full, u->c, u->dtype, &pending[np]);
        if (st < 0) {
            unit_err(u, st, "posting the parameter all-gather");
            break;
        }
        z->stats.bytes_gathered += dt__zero_unit_bytes(u);
        np++;
        posted += u->total;
    }
    dt_status st2 = np ? dt_req_wait_all(pending, np, -1) : DT_OK;
    for (int j = 0; j < np; j++)
        dt_req_free(pending[j]);
    if (st < 0)
        return st;
    if (st2 < 0)
        return dt_error_wrap(st2, "ZeRO: gathering the updated parameters");
    return DT_OK;
}

void dt_zero_drain(dt_zero *z)
{
    if (!z)
        return;
    dt_status st = DT_OK;
    drain(z, &st);
    for (int i = 0; i < z->nu; i++) {
        dt__zero_release_grads(z, &z->u[i]);
        memset(z->u[i].gshard, 0, z->u[i].c * z->u[i].res);
    }
}

dt_status dt_zero_shard_sum(dt_zero *z, double *v, int n)
{
    if (!z || (!v && n > 0))
        return dt_error(DT_ERR_NULL, "dt_zero_shard_sum: NULL argument");
    return z->W > 1 && n > 0 ? dt_pg_allreduce(z->pg, DT_IN_PLACE, v, (size_t)n, DT_F64, DT_REDUCE_SUM) : DT_OK;
}

dt_status dt_zero_sync_buffers(dt_zero *z)
{
    if (!z)
        return dt_error(DT_ERR_NULL, "dt_zero_sync_buffers: handle is NULL");
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *b = dt_model_flat(z->m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (z->W > 1 && b && b->base) {
            dt_status st = dt_pg_broadcast(z->wpg, b->base, b->total, (dt_dtype)d, 0);
            if (st < 0)
                return dt_error_wrap(st, "ZeRO: broadcasting the %s buffers", dt_dtype_name((dt_dtype)d));
        }
    }
    return DT_OK;
}

/* ---- whole parameters ------------------------------------------------------------------ */

dt_status dt_zero_full_params(dt_zero *z, float *dst)
{
    if (!z)
        return dt_error(DT_ERR_NULL, "dt_zero_full_params: handle is NULL");
    for (int i = 0; i < z->nu; i++) {
        const dt_flat *P = dt_model_flat(z->m, DT_FLAT_PARAMS, z->u[i].dtype);
        if (dst && z->u[i].dtype != DT_F32)
            return dt_error(DT_ERR_DTYPE, "dt_zero_full_params: unit '%s' holds %s parameters; an f32 dst "
                                          "takes f32 models only (pass NULL: the model's own flats)",
                            z->u[i].name, dt_dtype_name(z->u[i].dtype));
        if (!dst && (!P || !P->base))
            return dt_error(DT_ERR_STATE, "dt_zero_full_params: the model is meta (no flat of its own): pass dst");
    }
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        char *out = dst ? (char *)dst : (char *)dt_model_flat(z->m, DT_FLAT_PARAMS, u->dtype)->base;
        bool was = u->gathered;
        dt_status st = wait_gather(z, u);
        if (st >= 0 && !u->gathered)
            st = dt__zo_hold(z, dt__zo_ready(z, u)); /* parameter offload: agreed on below */
        if (st >= 0 && !u->gathered && z->W > 1)
            st = dt_pg_allgather(z->pg, u->pshard, u->full, u->c, u->dtype);
        else if (st >= 0 && !u->gathered)
            memcpy(u->full, u->pshard, u->c * u->es);
        if (!was)
            dt__zo_drop(z, u);
        if (st < 0)
            return unit_err(u, st, "gathering the whole parameters");
        for (int j = 0; j < u->nent; j++) {
            dt_param_info e;
            dt_model_entry(z->m, u->entries[j], &e);
            memcpy(out + e.offset * u->es, u->full + u->uoff[j] * u->es, e.numel * u->es);
        }
        if (!was)
            dt__zero_region_release(u->full, dt__zero_unit_bytes(u));
    }
    return z->pstore ? dt__zo_agree(z, DT_OK, "reading a parameter shard") : DT_OK;
}


/* ---- construction ----------------------------------------------------------------------- */

static dt_status install_hooks(dt_zero *z)
{
    dt_status st = dt_model_add_grad_ready_hook(z->m, on_grad_ready, z, &z->ready_hook);
    if (st < 0 || z->p.stage < 3)
        return st;
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        if (!u->mod || u->resident)
            continue;
        if ((st = dt_module_add_forward_pre_hook(u->mod, fwd_pre, u, &u->hooks[0])) < 0 ||
            (st = dt_module_add_forward_post_hook(u->mod, fwd_post, u, &u->hooks[1])) < 0 ||
            (st = dt_module_add_backward_pre_hook(u->mod, bwd_pre, u, &u->hooks[2])) < 0 ||
            (st = dt_module_add_backward_post_hook(u->mod, bwd_post, u, &u->hooks[3])) < 0)
            return st;
        /* they gather and free parameters and never look at an activation:
         * the model's forward computes exactly what it computes without
         * them (DDP's), e.g. the ConvNet keeps its channel-blocked path */
        for (int k = 0; k < 4; k++)
            if ((st = dt_module_hook_set_blind(u->mod, u->hooks[k])) < 0)
                return st;
    }
    return DT_OK;
}

/* A built (not meta) model's own parameter and gradient flats are unused
 * once every parameter of their dtype is bound to the units' buffers: give
 * their pages back (dt__model_keep_only with no span; dt_model_zero_grad
 * then leaves them alone), or ZeRO-1/2 would hold a second whole copy of
 * the parameters and of the gradients beside the units' (more memory than
 * DDP). A dtype with a parameter outside the units keeps its flats. */
static void release_model_flats(dt_zero *z)
{
    if (dt_model_is_meta(z->m))
        return;
    size_t in_units[DT_DTYPE_COUNT] = {0}, in_model[DT_DTYPE_COUNT] = {0};
    for (int i = 0; i < z->nu; i++)
        for (int j = 0; j < z->u[i].nent; j++) {
            dt_param_info e;
            if (dt_model_entry(z->m, z->u[i].entries[j], &e) == DT_OK)
                in_units[e.dtype] += e.numel;
        }
    for (size_t i = 0; i < dt_model_num_entries(z->m); i++) {
        dt_param_info e;
        if (dt_model_entry(z->m, i, &e) == DT_OK && !e.is_buffer && e.tied_to < 0)
            in_model[e.dtype] += e.numel;
    }
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        if (in_model[d] && in_units[d] == in_model[d] && dt__model_keep_only(z->m, (dt_dtype)d, NULL, 0) < 0)
            dt_error_clear();
}

/* Fill rank's shard of every unit: from the model's memory (broadcast from
 * rank 0 first with sync_module_states), or for a meta model with
 * dt_model_init_range, equal to the same elements of a full build. */
static dt_status init_shards(dt_zero *z)
{
    const bool meta = dt_model_is_meta(z->m);
    dt_status st;
    for (int d = 0; d < DT_DTYPE_COUNT && !meta && z->p.sync_module_states && z->W > 1; d++) {
        const dt_flat *P = dt_model_flat(z->m, DT_FLAT_PARAMS, (dt_dtype)d);
        if (P && P->base && dt_dtype_is_float((dt_dtype)d) &&
            (st = dt_pg_broadcast(z->wpg, P->base, P->total, (dt_dtype)d, 0)) < 0)
            return dt_error_wrap(st, "ZeRO: sync_module_states (broadcasting rank 0's %s parameters)",
                                 dt_dtype_name((dt_dtype)d));
    }
    if (z->p.sync_module_states && (st = dt_zero_sync_buffers(z)) < 0)
        return st;
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        const dt_flat *P = dt_model_flat(z->m, DT_FLAT_PARAMS, u->dtype);
        size_t lo = (size_t)z->rank * u->c, hi = lo + u->c;
        if ((st = dt__zo_buffer(z, u)) < 0) /* parameter offload: filled here, written below */
            return st;
        for (int j = 0; j < u->nent; j++) {
            dt_param_info e;
            dt_model_entry(z->m, u->entries[j], &e);
            size_t a = u->uoff[j], b = a + e.numel;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            if (a >= b)
                continue;
            char *dst = u->pshard + (a - lo) * u->es;
            size_t t0 = a - u->uoff[j]; /* first element within the tensor */
            if (!meta) {
                memcpy(dst, (const char *)dt_flat_ptr(P, e.offset) + t0 * u->es, (b - a) * u->es);
            } else {
                dt_flat d = {.dtype = u->dtype, .base = dst, .offset = e.offset + t0, .numel = b - a,
                             .total = P->total, .used = P->used, .world = P->world};
                if ((st = dt_model_init_range(z->m, z->p.init_rng, z->p.init_seed, &d)) < 0)
                    return dt_error_wrap(st, "ZeRO: initialising '%s'", e.name);
            }
        }
        /* fp32 masters: the shard's values widened (exactly), padding zero */
        if (u->master && (st = dt_k_convert(u->pshard, u->dtype, u->master, DT_F32, (int64_t)u->c)) < 0)
            return unit_err(u, st, "the fp32 master weights");
        if (u->preg >= 0) {
            st = dt__zo_write_sync(z, u);
            dt__zo_drop(z, u);
            if (st < 0)
                return st;
        }
    }
    return DT_OK;
}

/* The dtype unit u reduces its gradients in: the policy's reduce dtype,
 * except that an f32 unit of a model with low-precision units (norms kept
 * f32 by the precision policy) reduces in f32, as FSDP runs the modules it
 * keeps in f32 without mixed precision; UNSET: the unit's own dtype. */
static dt_dtype unit_reduce_dtype(const dt_zero *z, const zunit *u, bool lowp_model)
{
    const dt_dtype r = z->p.reduce_dtype;
    if (!dt_dtype_is_float(r) || (u->dtype == DT_F32 && lowp_model))
        return u->dtype;
    return r;
}

static dt_status unit_alloc(dt_zero *z, zunit *u, bool lowp_model)
{
    size_t b = dt__zero_unit_bytes(u);
    u->rdt = unit_reduce_dtype(z, u, lowp_model);
    u->res = dt_dtype_size(u->rdt);
    const bool s1 = z->p.stage == 1, rd = u->rdt != u->dtype;
    bool sh = false;
    u->full = dt__zero_buf_map(z, b, u->resident, &u->full_sh);
    u->gfull = dt__zero_buf_map(z, b, s1 && !rd, &sh);
    u->gred_sh = sh;
    if (!u->full || !u->gfull)
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO unit '%s': mapping 2 x %zu bytes", u->name, b);
    if (rd && !(u->rfull = dt__zero_buf_map(z, dt__zero_unit_rbytes(u), s1, &u->gred_sh)))
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO unit '%s': mapping %zu bytes of %s gradients", u->name,
                        dt__zero_unit_rbytes(u), dt_dtype_name(u->rdt));
    if (u->resident) {
        u->pshard = u->full + (size_t)z->rank * u->c * u->es;
    } else if (u->preg >= 0) {
        u->pshard = NULL; /* parameter offload: in a file, in memory only while in flight */
    } else if (!(u->pshard_own = u->pshard = dt_calloc(u->c * u->es + 1))) {
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO unit '%s': parameter shard of %zu bytes", u->name, u->c * u->es);
    }
    if (z->p.stage == 1) {
        u->gshard = (u->rfull ? u->rfull : u->gfull) + (size_t)z->rank * u->c * u->res;
    } else if (!(u->gshard_own = u->gshard = dt_calloc(u->c * u->res + 1))) {
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO unit '%s': gradient shard of %zu bytes", u->name, u->c * u->res);
    }
    if (u->dtype != DT_F32 && !(u->master = dt_calloc(u->c * sizeof(float) + 1)))
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO unit '%s': fp32 master weights of %zu bytes", u->name, u->c * 4);
    size_t lo = (size_t)z->rank * u->c;
    u->pflat = (dt_flat){.dtype = u->dtype, .base = u->pshard, .offset = lo, .numel = u->c, .total = u->total,
                         .used = u->used_numel, .world = z->W};
    u->gflat = u->pflat;
    u->gflat.dtype = u->rdt;
    u->gflat.base = u->gshard;
    u->mflat = u->pflat;
    u->mflat.dtype = DT_F32;
    u->mflat.base = u->master;
    u->gathered = u->resident;
    if (!u->resident && z->p.stage == 3) /* whole until the first forward frees it: no */
        u->gathered = false;
    return DT_OK;
}

dt_status dt_zero_init(dt_pg *pg, dt_model *m, const dt_zero_params *pp, dt_zero **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_zero_init: out is NULL");
    *out = NULL;
    if (!pg || !m)
        return dt_error(DT_ERR_NULL, "dt_zero_init: %s is NULL", pg ? "model" : "process group");
    dt_zero_params p = pp ? *pp : dt_zero_params_default();
    dt_status st0;
    if (p.stage < 1 || p.stage > 3)
        return dt_error(DT_ERR_INVALID_ARG, "dt_zero_init: stage %d (ZeRO stages are 1, 2 and 3; stage 0 is DDP)",
                        p.stage);
    if ((unsigned)p.backward_prefetch > DT_PREFETCH_BACKWARD_POST || (unsigned)p.init_rng >= DT_INIT_RNG_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "dt_zero_init: backward_prefetch %d or init_rng %d unknown",
                        (int)p.backward_prefetch, (int)p.init_rng);
    if ((st0 = dt_zero_pp_check(&p, dt_pg_size(pg))) < 0)
        return st0;
    if (p.stage < 3)
        p.reshard_after_forward = false;
    dt_zero *z = dt_calloc(sizeof *z);
    if (!z)
        return dt_error(DT_ERR_NO_MEMORY, "dt_zero_init");
    z->pg = z->wpg = pg;
    z->m = m;
    z->p = p;
    z->p.wrap_module_type = NULL; /* borrowed only during init */
    z->sync = true;
    dt_status st;
    const int world = dt_pg_size(pg), S = p.hybrid_shard_size;
    if (S < 0 || (S > 0 && (world % S != 0 || p.stage < 2))) {
        st = dt_error(DT_ERR_INVALID_ARG, "dt_zero_init: hybrid_shard_size %d must divide the world size %d "
                                          "(stages 2 and 3 only; this is stage %d)", S, world, p.stage);
        goto fail;
    }
    if (S > 0 && S < world) { /* HYBRID_SHARD: rows of S ranks shard, columns replicate */
        const int r = dt_pg_rank(pg);
        if ((st = dt_pg_split(pg, r / S, r, &z->spg)) < 0 || (st = dt_pg_split(pg, r % S, r, &z->rpg)) < 0) {
            dt_error_wrap(st, "dt_zero_init: hybrid sharding groups");
            goto fail;
        }
        z->pg = z->spg;
    }
    z->rank = dt_pg_rank(z->pg);
    z->W = dt_pg_size(z->pg);
    if ((st = dt__zero_build_units(z, &p)) < 0)
        goto fail;
    /* parameter offload: the store, agreed on before any other collective */
    st = dt__zo_open(z);
    if (p.offload_param.device == DT_OFFLOAD_NVME && (st = dt__zo_agree(z, st, "opening the parameter store")) < 0)
        goto fail;
    if (st < 0)
        goto fail;
    z->rg = dt_calloc((size_t)z->nu * sizeof *z->rg + 1);
    z->order = dt_calloc((size_t)z->nu * sizeof *z->order + 1);
    z->inflight = dt_calloc((size_t)z->nu * sizeof *z->inflight + sizeof(int) * 4);
    z->check = dt_calloc((size_t)z->nu * 2 * sizeof *z->check + 1);
    z->rr = dt_calloc((size_t)z->nu * sizeof *z->rr + 1);
    if (!z->rg || !z->order || !z->inflight || !z->check || !z->rr) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_zero_init");
        goto fail;
    }
    bool lowp_model = false;
    for (int i = 0; i < z->nu; i++)
        lowp_model |= z->u[i].dtype != DT_F32;
    for (int i = 0; i < z->nu && st >= 0; i++)
        st = unit_alloc(z, &z->u[i], lowp_model);
    if (st >= 0)
        st = init_shards(z);
    if (z->pstore && (st = dt__zo_agree(z, st, "writing the initial parameter shards")) < 0)
        goto fail;
    if (st < 0)
        goto fail;
    /* bind the model's tensors to the units' whole buffers */
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        for (int j = 0; j < u->nent; j++)
            if ((st = dt_model_bind_param(m, u->entries[j], u->full + u->uoff[j] * u->es,
                                           u->gfull + u->uoff[j] * u->es)) < 0)
                goto fail;
    }
    release_model_flats(z);
    if (z->p.stage == 3 && z->W > 1 && (st = dt_pg_dup(z->pg, &z->gpg)) < 0) {
        dt_error_wrap(st, "dt_zero_init: the all-gather channel");
        goto fail;
    }
    if (!z->gpg)
        z->gpg = z->pg;
    if ((st = dt__zpp_setup(z)) < 0)
        goto fail;
    if (p.hierarchical && z->W > 1 && (st = dt_pg_hierarchical(z->pg, &z->hpg)) < 0) {
        dt_error_wrap(st, "dt_zero_init: the hierarchical reduction group");
        goto fail;
    }
    /* whole units start gathered (stage 1/2 and persistent ones) */
    for (int i = 0; i < z->nu; i++)
        z->u[i].gathered = false;
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        if (!u->resident)
            continue;
        if (z->W > 1 && (st = dt_pg_allgather(z->pg, DT_IN_PLACE, u->full, u->c, u->dtype)) < 0) {
            unit_err(u, st, "gathering the initial parameters");
            goto fail;
        }
        u->gathered = true;
    }
    z->peak_live = z->live = 0;
    dt__zero_pool_init(z);
    if ((st = install_hooks(z)) < 0)
        goto fail;
    dt_model_set_rank(m, z->rank);
    *out = z;
    return DT_OK;
fail:
    dt_zero_free(z);
    return st;
}

void dt_zero_free(dt_zero *z)
{
    if (!z)
        return;
    dt_status st = DT_OK;
    drain(z, &st);
    if (z->ready_hook)
        dt_model_remove_hook(z->m, z->ready_hook);
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        for (int k = 0; k < 4; k++)
            if (u->hooks[k])
                dt_module_remove_hook(u->mod, u->hooks[k]);
    }
    dt__zpp_teardown(z);
    if (z->gpg && z->gpg != z->pg)
        dt_pg_free(z->gpg);
    dt_pg_free(z->hpg);
    dt_pg_free(z->rpg);
    dt_pg_free(z->spg);
    dt__zo_close(z);
    dt__zero_pool_free(z);
    dt__zero_free_units(z);
    dt_free(z->rg);
    dt_free(z->order);
    dt_free(z->inflight);
    dt_free(z->check);
    dt_free(z->rr);
    dt_free(z);
}

void dt__zero_unit_unmap(zunit *u)
{
    dt__zero_buf_unmap(u->z, u->full, dt__zero_unit_bytes(u), u->full_sh);
    dt__zero_buf_unmap(u->z, u->gfull, dt__zero_unit_bytes(u), u->gred_sh && !u->rfull);
    dt__zero_buf_unmap(u->z, u->rfull, dt__zero_unit_rbytes(u), u->gred_sh);
    dt_free(u->pshard_own);
    dt_free(u->gshard_own);
    dt_free(u->master);
    u->full = u->gfull = u->rfull = u->pshard = u->gshard = u->pshard_own = u->gshard_own = NULL;
    u->master = NULL;
}
