/* The strategy handle: a copied vtable plus its state, and the "none"
 * strategy (one process: every slot left to the trainer's defaults). */
#include "train/train_impl.h"

#include "dtrain/tp.h"

#include <stdlib.h>
#include <string.h>

dt_status dt_strategy_init(const dt_strategy_ops *ops, void *self, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_init: out is NULL");
    *out = NULL;
    if (!ops)
        return dt_error(DT_ERR_NULL, "dt_strategy_init: ops is NULL");
    if (ops->version != DT_STRATEGY_OPS_VERSION)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_strategy_init: strategy '%s' has ops version %d, this library %d",
                        ops->name ? ops->name : "?", ops->version, DT_STRATEGY_OPS_VERSION);
    if (!ops->attach || !ops->name)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_init: a strategy needs a name and an attach slot");
    dt_strategy *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_init");
    s->ops = *ops;
    s->self = self;
    *out = s;
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s)
{
    if (!s)
        return;
    if (s->ops.free)
        s->ops.free(s->self);
    dt_free(s);
}

const char *dt_strategy_name(const dt_strategy *s) { return s ? s->ops.name : ""; }

dt_ddp *dt_strategy_ddp(const dt_strategy *s) { return s ? dt__strategy_ddp_handle(s) : NULL; }

dt_model *dt_strategy_model(const dt_strategy *s) { return s && s->attached ? s->m : NULL; }

dt_status dt_strategy_eval_forward(dt_strategy *s, dt_ctx *ctx, dt_tensor *x, dt_tensor **out)
{
    if (out)
        *out = NULL;
    if (!s || !ctx || !out)
        return dt_error(DT_ERR_NULL, "dt_strategy_eval_forward: NULL argument");
    if (!s->attached)
        return dt_error(DT_ERR_STATE, "dt_strategy_eval_forward: strategy '%s' is not attached to a model "
                        "(dt_trainer_init)", s->ops.name);
    return dt__strategy_eval_forward(s, ctx, x, out);
}

dt_status dt_strategy_eval_share(dt_strategy *s, double *v, int n, dt_status failed)
{
    if (!s || (!v && n > 0))
        return dt_error(DT_ERR_NULL, "dt_strategy_eval_share: NULL argument");
    if (!s->attached)
        return dt_error(DT_ERR_STATE, "dt_strategy_eval_share: strategy '%s' is not attached to a model "
                        "(dt_trainer_init)", s->ops.name);
    return dt__strategy_eval_share(s, v, n, failed);
}

static dt_status none_attach(void *self, dt_model *m)
{
    (void)self;
    (void)m;
    return DT_OK;
}

/* One process: nothing but the trainer reads the gradients. */
static bool none_grads_private(void *self)
{
    (void)self;
    return true;
}

dt_status dt_strategy_none_init(dt_strategy **out)
{
    static const dt_strategy_ops ops = {
        .version = DT_STRATEGY_OPS_VERSION,
        .name = "none",
        .attach = none_attach,
        .begin_micro = NULL,
        .forward = NULL,
        .wait = NULL,
        .allreduce_sum = NULL,
        .owned_range = NULL,
        .optim_ranges = NULL,
        .shard_sum = NULL,
        .memory = NULL,
        .after_step = NULL,
        .sync_buffers = NULL,
        .rank = NULL,
        .world = NULL,
        .free = NULL,
        .set_precision = NULL, /* no reduction: any policy */
        .forward_backward = NULL,
        .grads_private = none_grads_private,
    };
    return dt_strategy_init(&ops, NULL, out);
}

/* ---- the trainer's calls (train_impl.h) ---------------------------------------- */

dt_status dt__strategy_attach(dt_strategy *s, dt_model *m, const dt_precision_policy *p, dt_dtype model_dtype)
{
    dt_status st;
    const dt_dtype rd = dt_precision_reduce_dtype(p);
    if (s->ops.set_precision) {
        if ((st = s->ops.set_precision(s->self, p)) < 0)
            return dt_error_wrap(st, "dt_trainer_init: strategy '%s'", s->ops.name);
    } else if (rd != DT_DTYPE_UNSET && rd != model_dtype && s->ops.allreduce_sum) {
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: strategy '%s' cannot reduce gradients in %s (it has no "
                        "set_precision slot)", s->ops.name, dt_dtype_name(rd));
    }
    if ((st = s->ops.attach(s->self, m)) < 0)
        return dt_error_wrap(st, "dt_trainer_init: strategy '%s'", s->ops.name);
    s->attached = true;
    s->m = m;
    s->tp = dt_tp_model_group(m);
    if (s->tp && dt_pg_size(s->tp) <= 1)
        s->tp = NULL;
    return DT_OK;
}

dt_status dt__strategy_optim_setup(dt_strategy *s, dt_strategy_optim *o)
{
    o->steps = false;
    return s->ops.optim_setup ? s->ops.optim_setup(s->self, o) : DT_OK;
}

dt_status dt__strategy_optim_step(dt_strategy *s, bool steps, dt_optim *opt, dt_offload_optim *off)
{
    if (steps && s->ops.optim_step)
        return s->ops.optim_step(s->self, opt, off);
    return off ? dt_offload_optim_step(off) : dt_optim_step(opt);
}

/* The sum over the ranks whose ranges partition the model. */
static dt_status shard_sum(dt_strategy *s, const dt_strategy_grads *g, double *v, int n)
{
    dt_status (*sum)(void *, double *, int) = s->ops.shard_sum ? s->ops.shard_sum : s->ops.allreduce_sum;
    return g->sharded && g->agree && sum ? sum(s->self, v, n) : DT_OK;
}

/* Tensor parallel: the squared global gradient norm over the ranges (after
 * unscaling). A slice's squares are summed over the tensor-parallel group
 * (each element of the full tensor lives on one rank of it); a whole tensor
 * (layer norms, row-parallel biases: the same gradient on every rank of the
 * group) is counted once, from tp rank 0. Under a sharded strategy the two
 * partial sums are first summed over the ranks whose ranges partition this
 * rank's tensors (shard_sum: ZeRO-1's data-parallel shards, the pipeline's
 * stages and their replicas' shares), then over tp: every rank adds the
 * same numbers in the same order, so the norm is bitwise the same on all
 * ranks (the replicated tensors stay equal) and equals the single-process
 * model's up to rounding. Vocabulary padding rows have zero gradients.
 * ZeRO's ranges are its units' own flats: which elements are slices comes
 * from its pieces (pc). */
dt_status dt__strategy_grad_sqnorm_pieces(dt_strategy *s, const dt_strategy_grads *g, const dt_zero_piece *pc,
                                          size_t npc, double *sq)
{
    dt_status st;
    if (!s->tp) { /* partial sums of squares over the owned ranges */
        double v = 0;
        for (size_t k = 0; k < g->nrg; k++)
            v += dt_grad_sqnorm(g->g[k], g->n[k]);
        if ((st = shard_sum(s, g, &v, 1)) < 0)
            return st;
        *sq = v;
        return DT_OK;
    }
    double part[2] = {0, 0}; /* slices, whole tensors */
    const size_t ne = dt_model_num_entries(g->m);
    for (size_t k = 0; k < g->nrg; k++) {
        const float *gk = g->g[k];
        const size_t ng = g->n[k];
        const dt_optim_range *rg = &g->rg[k];
        const dt_flat *f = rg->mirror ? rg->mirror : rg->params;
        for (size_t i = 0; i < npc && ng; i++) {
            const dt_zero_piece *q = &pc[i];
            dt_param_info e;
            if (q->range != k)
                continue;
            if ((st = dt_model_entry(g->m, q->entry, &e)) < 0)
                return st;
            part[e.tp_dim ? 0 : 1] += dt_grad_sqnorm(gk + q->range_offset, q->hi - q->lo);
        }
        for (size_t i = 0; i < ne && ng && !pc; i++) {
            dt_param_info e;
            if ((st = dt_model_entry(g->m, i, &e)) < 0)
                return st;
            if (e.is_buffer || e.tied_to >= 0 || e.dtype != f->dtype)
                continue;
            size_t a = e.offset > rg->lo ? e.offset : rg->lo, b = e.offset + e.numel;
            b = b < rg->hi ? b : rg->hi;
            if (a < b)
                part[e.tp_dim ? 0 : 1] += dt_grad_sqnorm(gk + (a - rg->lo), b - a);
        }
    }
    if ((st = shard_sum(s, g, part, 2)) < 0)
        return st;
    if (dt_pg_rank(s->tp) != 0)
        part[1] = 0;
    if ((st = dt_pg_allreduce(s->tp, DT_IN_PLACE, part, 2, DT_F64, DT_REDUCE_SUM)) < 0)
        return dt_error_wrap(st, "the tensor-parallel gradient norm");
    *sq = part[0] + part[1];
    return DT_OK;
}

dt_status dt__strategy_grad_sqnorm(dt_strategy *s, const dt_strategy_grads *g, double *sq)
{
    return s->ops.grad_sqnorm ? s->ops.grad_sqnorm(s->self, g, sq) : dt__strategy_grad_sqnorm_pieces(s, g, NULL, 0, sq);
}

dt_status dt__strategy_agree_flags(dt_strategy *s, double *flags, int n)
{
    if (s->ops.agree_flags)
        return s->ops.agree_flags(s->self, flags, n);
    /* tensor parallel: an overflow (or a non-finite value) in one rank's
     * slice skips (stops) the step on all */
    dt_status st = s->tp ? dt_pg_allreduce(s->tp, DT_IN_PLACE, flags, (size_t)n, DT_F64, DT_REDUCE_MAX) : DT_OK;
    return st < 0 ? dt_error_wrap(st, "agreeing on overflow over the tensor-parallel group") : st;
}

bool dt__strategy_grads_private(const dt_strategy *s)
{
    return s->ops.grads_private && s->ops.grads_private(s->self) && !s->tp;
}

dt_status dt__strategy_pieces(dt_strategy *s, dt_zero_piece **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!s->ops.pieces)
        return DT_OK;
    size_t k = 0;
    dt_status st = s->ops.pieces(s->self, NULL, 0, &k);
    if (st < 0)
        return st;
    dt_zero_piece *pc = calloc(k ? k : 1, sizeof *pc);
    if (!pc)
        return dt_error(DT_ERR_NO_MEMORY, "strategy '%s': %zu pieces", s->ops.name, k);
    if ((st = s->ops.pieces(s->self, pc, k, &k)) < 0) {
        free(pc);
        return st;
    }
    *out = pc;
    *n = k;
    return DT_OK;
}

dt_status dt__strategy_ckpt_layout(dt_strategy *s, dt_strategy_ckpt *out)
{
    memset(out, 0, sizeof *out);
    return s->ops.ckpt_layout ? s->ops.ckpt_layout(s->self, out) : DT_OK;
}

dt_status dt__strategy_after_load(dt_strategy *s) { return s->ops.after_load ? s->ops.after_load(s->self) : DT_OK; }

dt_status dt__strategy_eval_forward(dt_strategy *s, dt_ctx *ctx, dt_tensor *x, dt_tensor **out)
{
    if (s->ops.eval_forward)
        return s->ops.eval_forward(s->self, ctx, s->m, x, out);
    *out = dt_model_forward(ctx, s->m, x);
    return *out ? DT_OK : dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
}

dt_status dt__strategy_eval_share(dt_strategy *s, double *v, int n, dt_status failed)
{
    if (s->ops.eval_share)
        return s->ops.eval_share(s->self, v, n, failed);
    return failed < 0 ? failed : DT_OK;
}

dt_powersgd *dt__strategy_compress_state(dt_strategy *s, dt_pg **group, dt_reducer **buckets)
{
    *group = NULL;
    *buckets = NULL;
    return s->ops.compress_state ? s->ops.compress_state(s->self, group, buckets) : NULL;
}
