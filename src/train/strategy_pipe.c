/* The "pipe" strategy (pipe_strategy.h): pipeline stages, data parallelism
 * over the replicas, tied parameters between stages.
 *
 * Placement: one mesh dp x tp x pp (dt_pipe_mesh_init: world rank
 * (d tp + t) pp + s), the caller's or, without tensor parallelism, the
 * strategy's own dp x 1 x pp; so a pipeline is pp adjacent ranks. attach
 * takes the pipeline group (the schedule's point to point) and the
 * data-parallel group (gradient averages) from the mesh, cuts the model,
 * builds and checks the table, and works out
 * which parameters this rank steps: those of its stages; a parameter
 * stored once and used by stages on several ranks (the GPT's wte and
 * lm_head) belongs to the first of them, and the ranks that use it get a
 * group of their own (dt_pg_split).
 *
 * Per step: each trainer micro-batch runs the table (exec.c); wait then
 * (1) sums each shared parameter's gradient over its group, (2) averages
 * this rank's gradients over the replicas, once per step, after the last
 * micro-batch; the optimizer steps this rank's range; after_step sends the
 * shared parameters from their owner to the other users. The global
 * gradient norm is a sum over the pipeline ranks (each parameter is in
 * exactly one rank's range). Every rank builds the whole model's layout, so
 * names, offsets and initial values do not depend on the cut; replicas
 * start from dp rank 0's values. Then each rank gives back the pages of the
 * flats outside its stages' entries (keep_stages): it holds its stages
 * only. A meta model is never whole: the flats are mapped at attach and
 * only the stages' entries initialised (init_stages).
 * An evaluation runs through the stages (exec.c), so no rank needs the
 * others' parameters, ever.
 *
 * A rank that breaks off its schedule fails the pipeline group (exec.c),
 * so its pipeline's other ranks break off too; each of them then also
 * fails its data-parallel and tensor-parallel groups and the world
 * (fail_replicas), so that the other pipelines, waiting on those groups for
 * this replica's gradients, activations or agreement, fail at once with the
 * cause instead of at the group's timeout (on backends whose groups can
 * tell their ranks: shm and mpi).
 *
 * Tensor parallelism composes without code here: the tp ranks of a stage
 * hold different slices under the same names and offsets, run the same
 * table in step, and each pipeline (fixed d and t) moves its own copy of
 * the activations; a slice's gradient is averaged over its dp group like
 * any other parameter's (under ZeRO-1 each tp rank splits its own stage
 * elements over its dp group: the shares of a slice and of a replicated
 * tensor differ between the tp ranks, which the trainer's norm allows for).
 * What tp changes is counting: the tp x pp ranks of
 * a replica all know the loss (sent along the pipeline from the last
 * stage), so the sum over the replicas is the world sum / (tp pp). */
#include "train/strategy_pipe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status s_attach(void *self, dt_model *m)
{
    pipe_strategy *s = self;
    s->m = m;
    int W = dt_pg_size(s->world);
    if (s->p.pp < 1 || W % s->p.pp)
        return dt_error(DT_ERR_INVALID_ARG, "pipe: %d ranks do not make pipelines of %d (the world must be dp x pp)",
                        W, s->p.pp);
    dt_status st;
    if (!s->mesh) {
        if ((st = dt_pipe_mesh_init(s->world, 1, s->p.pp, &s->own_mesh)) < 0)
            return dt_error_wrap(st, "pipe");
        s->mesh = s->own_mesh;
    }
    s->P = dt_mesh_size(s->mesh, 2), s->T = dt_mesh_size(s->mesh, 1), s->D = dt_mesh_size(s->mesh, 0);
    s->pr = dt_mesh_coord(s->mesh, 2);
    s->pp = dt_mesh_dim_group(s->mesh, 2);
    s->dp = s->D > 1 ? dt_mesh_dim_group(s->mesh, 0) : NULL;
    s->v = s->p.chunks > 0 ? s->p.chunks : s->p.schedule == DT_PIPE_INTERLEAVED ? 2 : 1;
    s->S = s->P * s->v;
    /* the dropout masks: keyed by the replica (its tp ranks draw one layer's mask, each its heads' part; the cp
       ranks of a replica, dt_model_set_replica_ranks, its positions' part), as DDP keys them by its group rank */
    dt_model_set_rank(m, dt_mesh_coord(s->mesh, 0));
    const bool meta = dt_model_is_meta(m);
    if (meta && s->T > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "pipe: a meta model with tensor parallelism (tp %d): a slice's initial "
                        "values are not a range of a whole build's; build the model whole", s->T);
    if (meta && s->p.balance == DT_PIPE_BY_TIME && !s->cuts)
        return dt_error(DT_ERR_UNSUPPORTED, "pipe: DT_PIPE_BY_TIME times every unit at attach, which needs the whole "
                        "model: build it whole (not meta), or balance by compute or parameters");
    /* the schedule first: its limits fail before any collective */
    st = dt_pipe_schedule_build(s->p.schedule, s->P, s->p.micro_batches, s->v, &s->sched);
    if (st < 0)
        return dt_error_wrap(st, "pipe");
    if ((st = dt_model_pipe_units(m, &s->units, &s->nunits)) < 0)
        return st;
    if (!(s->starts = dt_calloc((size_t)(s->S + 1) * sizeof *s->starts)))
        return dt_error(DT_ERR_NO_MEMORY, "pipe");
    if (s->cuts) {
        if (s->p.ncuts != s->S - 1)
            return dt_error(DT_ERR_INVALID_ARG, "pipe: %d cut points for %d stages (need %d)", s->p.ncuts, s->S,
                            s->S - 1);
        for (int i = 0; i < s->p.ncuts; i++) {
            int prev = i ? s->cuts[i - 1] : 0;
            if (s->cuts[i] <= prev || s->cuts[i] >= s->nunits)
                return dt_error(DT_ERR_INVALID_ARG, "pipe: cut point %d is %d; cuts must increase within [1, %d) (the "
                                "model has %d units)", i, s->cuts[i], s->nunits, s->nunits);
            s->starts[i + 1] = s->cuts[i];
        }
    } else {
        double *cost = dt_calloc((size_t)s->nunits * sizeof *cost);
        if (!cost)
            return dt_error(DT_ERR_NO_MEMORY, "pipe");
        st = s->p.balance == DT_PIPE_BY_TIME ? dt__pipe_timed_costs(s, m, cost)
                                              : dt_pipe_unit_costs(m, s->units, s->nunits, s->p.balance, cost);
        if (st >= 0)
            st = dt_pipe_balance(cost, s->nunits, s->P, s->v, s->starts);
        dt_free(cost);
        if (st < 0)
            return dt_error_wrap(st, "pipe: %d stages (pp %d x v %d)", s->S, s->P, s->v);
    }
    s->starts[s->S] = s->nunits;
    if ((st = dt__pipe_exec_init(s->pp, m, s->units, s->starts, s->S, s->sched, &s->ex)) < 0)
        return st;
    if (s->amp != DT_F32)
        dt__pipe_exec_set_autocast(s->ex, s->amp);
    /* what this rank steps; shared parameters */
    size_t ne = dt_model_num_entries(m);
    int *owner = dt_calloc(ne * sizeof *owner);
    bool *users = dt_calloc(ne * (size_t)s->P * sizeof *users);
    s->ties = dt_calloc((ne + 1) * sizeof *s->ties);
    s->eown = dt_calloc((ne + 1) * sizeof *s->eown);
    bool ok = owner && users && s->ties && s->eown;
    for (size_t e = 0; ok && e < ne; e++)
        s->eown[e] = -1;
    for (int k = 0; k < NDT && ok; k++) {
        s->rk[k].fsegs = dt_calloc((ne + 1) * sizeof *s->rk[k].fsegs);
        s->rk[k].segs = dt_calloc((ne + 1) * sizeof *s->rk[k].segs);
        ok = s->rk[k].fsegs && s->rk[k].segs;
    }
    if (!ok) {
        st = dt_error(DT_ERR_NO_MEMORY, "pipe");
        goto done;
    }
    if ((st = dt__pipe_ownership(s, owner, users)) < 0)
        goto done;
    for (size_t e = 0; e < ne && st >= 0; e++) {
        dt_param_info pi;
        if ((st = dt_model_entry(m, e, &pi)) < 0)
            break;
        int k = dt__pipe_dt_index(pi.dtype);
        if (pi.is_buffer || pi.tied_to >= 0 || k < 0)
            continue;
        prange *R = &s->rk[k];
        int own = owner[e] < 0 ? 0 : owner[e]; /* used by no unit: rank 0 steps it (it gets no gradient) */
        int orank = dt_pipe_stage_rank(s->P, own);
        s->eown[e] = orank;
        if (orank == s->pr || users[e * (size_t)s->P + (size_t)s->pr])
            s->stage_bytes += pi.numel * dt_dtype_size(pi.dtype);
        if (orank == s->pr)
            R->fsegs[R->nfseg++] = (dt_optim_segment){.offset = pi.offset, .numel = pi.numel, .no_decay = false};
        int nusers = 0, me = -1, root = -1;
        for (int q = 0; q < s->P; q++) {
            if (!users[e * (size_t)s->P + (size_t)q])
                continue;
            if (q == s->pr)
                me = nusers;
            if (q == orank)
                root = nusers;
            nusers++;
        }
        if (nusers < 2)
            continue;
        /* every pipeline rank takes part in the split, in entry order */
        tie *t = &s->ties[s->nties];
        if ((st = dt_pg_split(s->pp, me >= 0 ? 0 : DT_PG_NO_COLOR, s->pr, &t->g)) < 0)
            break;
        if (me < 0) {
            dt_pg_free(t->g);
            t->g = NULL;
            continue;
        }
        t->root = root, t->k = k, t->off = pi.offset, t->numel = pi.numel;
        s->nties++;
    }
    if (st >= 0 && meta)
        st = dt__pipe_init_stages(s, users);
    for (int k = 0; k < NDT && st >= 0; k++)
        st = dt__pipe_make_range(s, k);
    if (st < 0)
        goto done;
    if (!s->nrange) {
        st = dt_error(DT_ERR_UNSUPPORTED, "pipe: the model has no f32, bf16 or f16 parameters");
        goto done;
    }
    /* one starting point: the replicas take dp rank 0's values, the users
     * of a shared parameter its owner's */
    for (int k = 0; k < NDT && st >= 0; k++) {
        const dt_flat *pf = s->rk[k].P;
        const size_t *sp = m->keep[k_dts[k]];
        if (!s->dp || !pf || !pf->total)
            continue;
        if (!meta) {
            st = dt_pg_broadcast(s->dp, pf->base, pf->total, pf->dtype, 0);
            continue;
        }
        for (size_t i = 0; sp && i < m->nkeep[k_dts[k]] && st >= 0; i++) /* a meta model: what it holds */
            st = dt_pg_broadcast(s->dp, dt_flat_ptr(pf, sp[2 * i]), sp[2 * i + 1] - sp[2 * i], pf->dtype, 0);
    }
    for (int i = 0; i < s->nties && st >= 0; i++) {
        const dt_flat *pf = s->rk[s->ties[i].k].P;
        st = dt_pg_broadcast(s->ties[i].g, dt_flat_ptr(pf, s->ties[i].off), s->ties[i].numel, pf->dtype,
                             s->ties[i].root);
    }
    /* fp32 masters of the low-precision parameters, from the (now common) values */
    for (int k = 0; k < NDT && st >= 0; k++)
        if (s->rk[k].has_master && (st = dt_optim_master_alloc_segments(s->rk[k].P, s->rk[k].a, s->rk[k].b,
                                                                         s->rk[k].segs, s->rk[k].nseg,
                                                                         &s->rk[k].master)) < 0)
            st = dt_error_wrap(st, "pipe: fp32 master weights of the %s parameters", dt_dtype_name(k_dts[k]));
    if (st >= 0 && s->P > 1 && !meta) /* a meta model's were never written */
        st = dt__pipe_keep_stages(s, users);
done:
    dt_free(owner);
    dt_free(users);
    return st;
}

/* This rank's pipeline broke off its schedule (the pipeline group has
 * failed): fail the groups that join it to the other pipelines, data
 * parallel and tensor parallel, and the world (the trainer's agreement on
 * losses and stopping), with this rank's error (st, dt_last_error()), which
 * stays this rank's error. */
static void fail_replicas(pipe_strategy *s, dt_status st)
{
    char msg[DT_PG_MSG_CAP];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (dt_pg_status(s->pp) >= 0) { /* an error before the schedule ran: nothing was abandoned */
        dt_error(st, "%s", msg);
        return;
    }
    dt_pg *other[3] = {s->dp, s->T > 1 ? dt_mesh_dim_group(s->mesh, 1) : NULL, s->world};
    for (int i = 0; i < 3; i++)
        if (other[i])
            dt_pg_fail(other[i], st, msg);
    dt_error(st, "%s", msg);
}

static dt_status s_forward_backward(void *self, dt_ctx *ctx, dt_model *m, dt_strategy_fb *fb)
{
    (void)ctx, (void)m;
    pipe_strategy *s = self;
    dt__pipe_batch b = {.x = fb->x, .y = fb->y, .loss = fb->loss, .loss_ud = fb->loss_ud, .scale = fb->scale};
    dt_status st = dt__pipe_exec_run(s->ex, &b);
    fb->loss_value = b.loss_value;
    if (st < 0)
        fail_replicas(s, st);
    /* the last stage's loss to the whole pipeline (its tp ranks have it) */
    if (st >= 0 && s->P > 1 && (st = dt_pg_broadcast(s->pp, &fb->loss_value, 1, DT_F64, s->P - 1)) < 0)
        st = dt_error_wrap(st, "pipe: sending the loss along the pipeline");
    return st;
}

/* After the step's last micro-batch: shared parameters' gradients summed
 * between stages, then this rank's averaged over the replicas (ZeRO-1:
 * reduce-scattered, each replica keeping its share). */
static dt_status s_wait(void *self)
{
    pipe_strategy *s = self;
    dt_status st = DT_OK;
    for (int i = 0; i < s->nties && st >= 0; i++) {
        const dt_flat *gf = s->rk[s->ties[i].k].G;
        void *g = dt_flat_ptr(gf, s->ties[i].off);
        st = dt_pg_allreduce(s->ties[i].g, DT_IN_PLACE, g, s->ties[i].numel, gf->dtype, DT_REDUCE_SUM);
        /* only the owner steps it (and its optimizer zeroes it): the other
         * users start the next step from zero themselves */
        if (st >= 0 && dt_pg_rank(s->ties[i].g) != s->ties[i].root)
            memset(g, 0, s->ties[i].numel * dt_dtype_size(gf->dtype));
    }
    for (int k = 0; k < NDT && st >= 0; k++) {
        prange *R = &s->rk[k];
        if (!s->dp || !R->P || R->hi <= R->lo)
            continue;
        const dt_dtype dt = R->G->dtype;
        const size_t es = dt_dtype_size(dt);
        /* run by run (R->runs): not over the other stages' entries between
         * this rank's chunks (interleaved), whose pages it does not hold
         * (keep_stages) */
        for (size_t r = 0; r < R->nrun && st >= 0; r++) {
            const size_t x = R->runs[2 * r], y = R->runs[2 * r + 1];
            char *g = dt_flat_ptr(R->G, x);
            if (!R->counts) {
                st = dt_pg_allreduce(s->dp, DT_IN_PLACE, g, y - x, dt, DT_REDUCE_AVG);
                continue;
            }
            /* ZeRO-1: this replica's share of the run [ca, cb) lands in rs at
             * ca - a; the rest of the run starts the next step from zero */
            const size_t ca = R->a < x ? x : R->a > y ? y : R->a, cb = R->b < x ? x : R->b > y ? y : R->b;
            char scratch[64], *out = cb > ca ? (char *)R->rs + (ca - R->a) * es : scratch;
            if ((st = dt_pg_reduce_scatterv(s->dp, g, out, R->rcounts + r * (size_t)s->D, dt, DT_REDUCE_AVG)) < 0)
                break;
            memset(g, 0, (ca - x) * es);
            if (cb > ca)
                memcpy(g + (ca - x) * es, out, (cb - ca) * es);
            memset(g + (cb - x) * es, 0, (y - cb) * es);
        }
    }
    return st < 0 ? dt_error_wrap(st, "pipe: reducing gradients") : st;
}

static dt_status s_optim_ranges(void *self, dt_model *m, bool no_decay_1d, const dt_optim_range **r, size_t *n)
{
    pipe_strategy *s = self;
    for (int k = 0; k < NDT; k++)
        for (size_t i = 0; i < s->rk[k].nseg; i++) {
            dt_optim_segment *sg = &s->rk[k].segs[i];
            bool one_d = false;
            for (size_t e = 0; e < dt_model_num_entries(m); e++) {
                dt_param_info pi;
                if (dt_model_entry(m, e, &pi) >= 0 && !pi.is_buffer && pi.tied_to < 0 && pi.dtype == k_dts[k] &&
                    pi.offset <= sg->offset && sg->offset < pi.offset + pi.numel) {
                    one_d = pi.ndim <= 1;
                    break;
                }
            }
            sg->no_decay = no_decay_1d && one_d;
        }
    *r = s->range;
    *n = s->nrange;
    return DT_OK;
}

/* ZeRO-1: every replica takes the others' shares of the stage's parameters. */
static dt_status gather_shares(pipe_strategy *s)
{
    dt_status st = DT_OK;
    for (int k = 0; k < NDT && st >= 0; k++) {
        prange *R = &s->rk[k];
        for (size_t r = 0; R->counts && r < R->nrun && st >= 0; r++) /* run by run, as s_wait */
            st = dt_pg_allgatherv(s->dp, NULL, dt_flat_ptr(R->P, R->runs[2 * r]), R->rcounts + r * (size_t)s->D,
                                  R->rdispls + r * (size_t)s->D, R->P->dtype);
    }
    return st < 0 ? dt_error_wrap(st, "pipe: gathering the replicas' ZeRO-1 shares") : st;
}

static dt_status s_after_step(void *self)
{
    pipe_strategy *s = self;
    dt_status st = gather_shares(s);
    for (int i = 0; i < s->nties && st >= 0; i++) {
        const dt_flat *pf = s->rk[s->ties[i].k].P;
        st = dt_pg_broadcast(s->ties[i].g, dt_flat_ptr(pf, s->ties[i].off), s->ties[i].numel, pf->dtype,
                             s->ties[i].root);
    }
    return st;
}

/* The sum over the replicas: every rank of a replica (tp x pp of them)
 * holds the replica's values (the loss, an evaluation's sums) or zeros
 * and a flag (stop, overflow: only "> 0" is read, so an overflow on any
 * rank of any stage skips the step everywhere). */
static dt_status s_allreduce_sum(void *self, double *v, int n)
{
    pipe_strategy *s = self;
    dt_status st = dt_metrics_allreduce(s->world, v, n, DT_REDUCE_SUM);
    for (int i = 0; i < n && st >= 0; i++)
        v[i] /= (double)(s->P * s->T);
    return st;
}

/* The ranks whose optimizer ranges partition the model: the pipeline
 * (and, under ZeRO-1, the replicas' shares). */
static dt_status s_shard_sum(void *self, double *v, int n)
{
    pipe_strategy *s = self;
    dt_status st = dt_metrics_allreduce(s->pp, v, n, DT_REDUCE_SUM);
    if (st >= 0 && s->p.zero == 1 && s->dp)
        st = dt_metrics_allreduce(s->dp, v, n, DT_REDUCE_SUM);
    return st;
}

/* After a checkpoint load (each rank loaded what it steps): the other
 * replicas' ZeRO-1 shares and the shared parameters from their owners, as
 * after a step; the other stages' pages are given back again, should
 * anything have written them. An evaluation needs nothing before it
 * (no sync_buffers slot): it runs through the stages (s_eval_forward). */
static dt_status s_after_load(void *self)
{
    pipe_strategy *s = self;
    dt_status st = s_after_step(s);
    dt__model_release(s->m);
    return st < 0 ? dt_error_wrap(st, "pipe: completing the stages' parameters") : st;
}

static int s_rank(void *self) { return dt_pg_rank(((pipe_strategy *)self)->world); }

static int s_world(void *self)
{
    pipe_strategy *s = self;
    return s->D > 0 ? s->D : dt_pg_size(s->world) / (s->p.pp > 0 ? s->p.pp : 1);
}

/* The stages compute under autocast in the policy's parameter dtype (as
 * the trainer's own context does); gradients are reduced in their flats'
 * dtype, so a different reduce dtype is refused. */
static dt_status s_set_precision(void *self, const struct dt_precision_policy *p)
{
    pipe_strategy *s = self;
    dt_dtype pd = p && p->param_dtype != DT_DTYPE_UNSET ? p->param_dtype : DT_F32;
    dt_dtype rd = dt_precision_reduce_dtype(p);
    if (rd != DT_DTYPE_UNSET && rd != pd)
        return dt_error(DT_ERR_UNSUPPORTED, "pipe: gradients are reduced in the parameters' dtype (%s); a reduce "
                        "dtype of %s is not supported", dt_dtype_name(pd), dt_dtype_name(rd));
    s->amp = pd == DT_BF16 || pd == DT_F16 ? pd : DT_F32;
    return DT_OK;
}

static void s_free(void *self)
{
    pipe_strategy *s = self;
    dt__pipe_exec_free(s->ex);
    for (int i = 0; s->ties && i < s->nties; i++)
        dt_pg_free(s->ties[i].g);
    dt_free(s->ties);
    dt_free(s->eown);
    for (int k = 0; k < NDT; k++) {
        prange *R = &s->rk[k];
        dt_free(R->fsegs);
        dt_free(R->segs);
        dt_free(R->counts);
        dt_free(R->displs);
        dt_free(R->rs);
        dt_free(R->runs);
        dt_free(R->rcounts);
        dt_free(R->rdispls);
        if (R->has_master)
            dt_flat_free(&R->master);
    }
    dt_mesh_free(s->own_mesh);
    dt_pipe_schedule_free(s->sched);
    dt_free(s->starts);
    dt_free(s->units);
    dt_free(s->cuts);
    dt_free(s->sample);
    dt_free(s);
}

/* What this rank holds for its stages: the parameters its units use (a
 * shared one on each rank that uses it) and their gradients. Every rank
 * builds the whole model (names, offsets and initial values do not depend
 * on the cut), but the other stages' entries are never read or written
 * after attach, and their pages were given back (keep_stages). The
 * optimizer state and fp32 masters are the trainer's count of what this
 * rank's ranges step (optim_ranges: an interleaved rank's range spans the
 * other ranks' stages between its chunks, which hold no memory). */
static dt_status s_memory(void *self, dt_strategy_memory *out)
{
    const pipe_strategy *s = self;
    memset(out, 0, sizeof *out);
    out->param_bytes = s->stage_bytes;
    out->grad_bytes = s->stage_bytes;
    return DT_OK;
}

/* Every rank saves its stages' share of each tensor over the world
 * (with tensor parallelism too); under ZeRO-1 with tensor parallelism the
 * replicas first complete each other's shares over the data-parallel group. */
static dt_status s_ckpt_layout(void *self, dt_strategy_ckpt *out)
{
    pipe_strategy *s = self;
    out->save_group = s->world;
    out->tp_shares = true;
    out->share_group = s->p.zero ? s->dp : NULL;
    return DT_OK;
}

static dt_status s_eval_forward(void *self, dt_ctx *ctx, dt_model *m, dt_tensor *x, dt_tensor **out)
{
    (void)m;
    pipe_strategy *p = self;
    *out = NULL;
    dt_status st = dt__pipe_exec_forward(p->ex, ctx, x, out);
    if (st < 0)
        fail_replicas(p, st);
    return st;
}

/* The last stage's n values to every rank of its pipeline (collective over
 * the pipeline); failed < 0: fail the pipeline (and the groups joining it
 * to the other replicas) instead, so that the other ranks' waits fail at
 * once with this rank's message. */
static dt_status s_eval_share(void *self, double *v, int n, dt_status failed)
{
    pipe_strategy *p = self;
    if (failed < 0) { /* this rank cannot finish: the others must not wait for its sums */
        char msg[DT_PG_MSG_CAP];
        snprintf(msg, sizeof msg, "pipeline rank %d broke off its forward through the stages (an evaluation or "
                 "a generation): %s", p->pr, dt_last_error());
        if (dt_pg_status(p->pp) >= 0)
            dt_pg_fail(p->pp, failed, msg);
        dt_error(failed, "%s", msg);
        fail_replicas(p, failed);
        return failed;
    }
    dt_status st = p->P > 1 ? dt_pg_broadcast(p->pp, v, (size_t)n, DT_F64, p->P - 1) : DT_OK;
    return st < 0 ? dt_error_wrap(st, "pipe: sending the last stage's values (an evaluation's sums, a generated "
                                  "token) along the pipeline")
                  : st;
}

static const dt_strategy_ops k_pipe_ops = {
    .version = DT_STRATEGY_OPS_VERSION,
    .name = "pipe",
    .attach = s_attach,
    .begin_micro = NULL,
    .forward = NULL, /* forward_backward runs the schedule */
    .wait = s_wait,
    .allreduce_sum = s_allreduce_sum,
    .owned_range = NULL,
    .optim_ranges = s_optim_ranges,
    .shard_sum = s_shard_sum,
    .memory = s_memory,
    .after_step = s_after_step,
    .sync_buffers = NULL,
    .rank = s_rank,
    .world = s_world,
    .free = s_free,
    .set_precision = s_set_precision,
    .forward_backward = s_forward_backward,
    .optim_setup = NULL,
    .optim_step = NULL,
    .grad_sqnorm = NULL, /* the default over the shares, shard_sum and tensor parallelism */
    .agree_flags = NULL,
    .grads_private = NULL,
    .pieces = NULL,
    .ckpt_layout = s_ckpt_layout,
    .after_load = s_after_load,
    .eval_forward = s_eval_forward,
    .eval_share = s_eval_share,
    .compress_state = NULL,
};

dt_pipe_params dt_pipe_params_default(void)
{
    dt_pipe_params p;
    memset(&p, 0, sizeof p);
    p.pp = 2;
    p.schedule = DT_PIPE_1F1B;
    p.micro_batches = 4;
    p.chunks = 0;
    p.balance = DT_PIPE_BY_COMPUTE;
    p.cuts = NULL;
    p.ncuts = 0;
    p.sample = NULL;
    p.mesh = NULL;
    p.init_rng = DT_INIT_PHILOX;
    p.init_seed = 0;
    return p;
}

dt_status dt_strategy_pipe_init(dt_pg *world, const dt_pipe_params *p, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_init: out is NULL");
    *out = NULL;
    if (!world)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_init: process group is NULL");
    pipe_strategy *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_pipe_init");
    s->world = world;
    s->amp = DT_F32;
    s->p = p ? *p : dt_pipe_params_default();
    s->mesh = s->p.mesh;
    dt_status st = DT_OK;
    const dt_mesh *mh = s->mesh;
    if (mh && (dt_mesh_world(mh) != world || dt_mesh_ndim(mh) != 3 || dt_mesh_size(mh, -1) != dt_pg_size(world) ||
               dt_mesh_dim_index(mh, "dp") != 0 || dt_mesh_dim_index(mh, "tp") != 1 ||
               dt_mesh_dim_index(mh, "pp") != 2))
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: the mesh is not a dp x tp x pp mesh of "
                      "dt_pipe_mesh_init over this world group");
    else if (mh && s->p.pp != dt_mesh_size(mh, 2))
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: pp = %d but the mesh's \"pp\" dim has %d ranks",
                      s->p.pp, dt_mesh_size(mh, 2));
    else if (s->p.pp < 1 || dt_pg_size(world) % s->p.pp)
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: %d ranks do not make pipelines of pp = %d (the "
                      "world must be dp x pp)", dt_pg_size(world), s->p.pp);
    else if ((unsigned)s->p.schedule >= DT_PIPE_KIND_COUNT)
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: unknown schedule %d", (int)s->p.schedule);
    else if ((unsigned)s->p.balance > DT_PIPE_BY_TIME)
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: unknown balance %d", (int)s->p.balance);
    else if (s->p.zero < 0 || s->p.zero > 1)
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: zero = %d: the data-parallel dimension runs DDP (0) "
                      "or ZeRO-1 (1); stages 2 and 3 do not combine with pipeline stages", s->p.zero);
    else if ((unsigned)s->p.init_rng >= DT_INIT_RNG_COUNT)
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: unknown init_rng %d", (int)s->p.init_rng);
    else if (s->p.ncuts < 0 || (s->p.ncuts > 0 && !s->p.cuts))
        st = dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_init: %d cuts without a list", s->p.ncuts);
    if (st >= 0 && s->p.cuts && s->p.ncuts > 0) {
        if (!(s->cuts = dt_calloc((size_t)s->p.ncuts * sizeof *s->cuts)))
            st = dt_error(DT_ERR_NO_MEMORY, "dt_strategy_pipe_init");
        else
            memcpy(s->cuts, s->p.cuts, (size_t)s->p.ncuts * sizeof *s->cuts);
    }
    s->p.cuts = NULL;
    if (st >= 0 && s->p.balance == DT_PIPE_BY_TIME && !s->cuts)
        st = dt__pipe_copy_sample(s);
    s->p.sample = NULL;
    if (st >= 0)
        st = dt_strategy_init(&k_pipe_ops, s, out);
    if (st < 0)
        s_free(s);
    return st;
}

dt_status dt_strategy_pipe_stats(const dt_strategy *s, dt_pipe_stats *out)
{
    if (!s || !out)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_stats: an argument is NULL");
    if (s->ops.attach != s_attach || !((pipe_strategy *)s->self)->ex)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_stats: strategy '%s' is not an attached \"pipe\" one",
                        s->ops.name);
    dt__pipe_exec_stats(((pipe_strategy *)s->self)->ex, out);
    return DT_OK;
}

dt_status dt_strategy_pipe_cut(const dt_strategy *s, int *starts, size_t *param_bytes, int cap, int *nstages)
{
    if (!s || !starts || !nstages)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_cut: an argument is NULL");
    const pipe_strategy *p = s->ops.attach == s_attach ? s->self : NULL;
    if (!p || !p->ex)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_cut: strategy '%s' is not an attached \"pipe\" one",
                        s->ops.name);
    *nstages = p->S;
    if (cap < p->S + 1)
        return dt_error(DT_ERR_RANGE, "dt_strategy_pipe_cut: %d stages need room for %d starts, not %d", p->S,
                        p->S + 1, cap);
    memcpy(starts, p->starts, (size_t)(p->S + 1) * sizeof *starts);
    for (int st = 0; param_bytes && st < p->S; st++) { /* the entries (their storage) its units use */
        param_bytes[st] = 0;
        for (size_t e = 0; e < dt_model_num_entries(p->m); e++) {
            dt_param_info pi;
            dt_status rc = dt_model_entry(p->m, e, &pi);
            if (rc < 0)
                return rc;
            bool used = false;
            for (int u = p->starts[st]; u < p->starts[st + 1] && !used && !pi.is_buffer && pi.tied_to < 0; u++)
                used = dt_pipe_unit_uses(&p->units[u], pi.name);
            for (size_t t = 0; t < dt_model_num_entries(p->m) && !used && !pi.is_buffer && pi.tied_to < 0; t++) {
                dt_param_info ti; /* a tied entry's unit uses this storage */
                if (dt_model_entry(p->m, t, &ti) < 0 || ti.tied_to != (int64_t)e)
                    continue;
                for (int u = p->starts[st]; u < p->starts[st + 1] && !used; u++)
                    used = dt_pipe_unit_uses(&p->units[u], ti.name);
            }
            param_bytes[st] += used ? pi.numel * dt_dtype_size(pi.dtype) : 0;
        }
    }
    return DT_OK;
}

dt_status dt_strategy_pipe_msg_times(const dt_strategy *s, double *t, size_t n)
{
    if (!s || !t)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_msg_times: an argument is NULL");
    if (s->ops.attach != s_attach || !((pipe_strategy *)s->self)->ex)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_msg_times: strategy '%s' is not an attached \"pipe\" "
                        "one", s->ops.name);
    return dt__pipe_exec_msg_times(((pipe_strategy *)s->self)->ex, t, n);
}

dt_status dt_strategy_pipe_trace(const dt_strategy *s, const dt_pipe_action **acts, const double **t, int *n)
{
    if (!s || !acts || !t || !n)
        return dt_error(DT_ERR_NULL, "dt_strategy_pipe_trace: an argument is NULL");
    if (s->ops.attach != s_attach || !((pipe_strategy *)s->self)->ex)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_trace: strategy '%s' is not an attached \"pipe\" one",
                        s->ops.name);
    dt__pipe_exec_trace(((pipe_strategy *)s->self)->ex, acts, t, n);
    return DT_OK;
}
