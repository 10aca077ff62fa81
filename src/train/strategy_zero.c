/* The "zero" strategy: ZeRO stages 1-3 / FSDP (parallel.h) at the
 * trainer's fixed points. attach shards the model (dt_zero_init); each
 * micro-batch but the step's last accumulates whole gradients locally; wait
 * is dt_zero_wait; the optimizer steps the ranges of every unit this rank
 * owns (optim_ranges); after the step the whole units are gathered. FSDP's
 * names map onto it: NO_SHARD is the "ddp" strategy, SHARD_GRAD_OP stage 2,
 * FULL_SHARD stage 3. */
#include "train/train_impl.h"

#include "dtrain/tp.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_pg *pg;
    dt_zero_params p;
    char *wrap_type; /* owned copy of p.wrap_module_type */
    char *nvme_path; /* owned copy of p.offload_param.nvme_path */
    dt_zero *z;
    dt_strategy *handle; /* the handle this strategy is the state of (dt_strategy_zero_init) */
    dt_zero_piece *tpc;  /* a tensor-parallel model: this rank's shard pieces (which elements are slices) */
    size_t ntpc;
} zero_strategy;

/* ZeRO over the data-parallel ranks of a tensor-parallel model (sl names
 * one of its slices, tp its group): stage 1 only (2 and 3 shard gradients
 * or parameters in ways not checked with tensor-parallel layers yet); keeps
 * the shard pieces that the gradient norm reads. */
static dt_status tp_pieces(zero_strategy *s, const char *sl, dt_pg *tp)
{
    if (s->p.stage != 1)
        return dt_error(DT_ERR_UNSUPPORTED, "'%s' is a tensor-parallel slice (tp.h): ZeRO stage %d "
                        "over the data-parallel ranks of a tensor-parallel model is not supported (stage 1 or DDP)",
                        sl, s->p.stage);
    dt_zero *z = s->z;
    /* the ZeRO group must be a data-parallel one: every member the same tp
     * rank (else it would average different slices) */
    double v[2] = {dt_pg_rank(tp), -dt_pg_rank(tp)};
    dt_status st = dt_pg_allreduce(dt_zero_group(z), DT_IN_PLACE, v, 2, DT_F64, DT_REDUCE_MAX);
    if (st < 0)
        return dt_error_wrap(st, "checking the ZeRO group");
    if (v[0] != -v[1])
        return dt_error(DT_ERR_INVALID_ARG, "'%s' is a tensor-parallel slice (tp.h) and the ZeRO "
                        "group holds ranks of different tensor-parallel ranks (ZeRO runs over the data-parallel "
                        "group: dt_tp_groups)", sl);
    dt_zero_unit_info u;
    if (dt_zero_num_units(z) > 0 && dt_zero_unit(z, 0, &u) >= 0 && u.shard_hi > u.shard_lo &&
        u.total / (u.shard_hi - u.shard_lo) != (size_t)dt_pg_size(dt_zero_group(z)))
        return dt_error(DT_ERR_UNSUPPORTED, "'%s' is a tensor-parallel slice (tp.h): hybrid "
                        "sharding over its data-parallel ranks is not supported (ZeRO-1 over all of them)", sl);
    size_t n = 0;
    if ((st = dt_zero_pieces(z, NULL, 0, &n)) < 0)
        return st;
    if (!(s->tpc = dt_calloc((n ? n : 1) * sizeof *s->tpc)))
        return dt_error(DT_ERR_NO_MEMORY, "ZeRO pieces");
    s->ntpc = n;
    return dt_zero_pieces(z, s->tpc, n, &n);
}

static dt_status s_attach(void *self, dt_model *m)
{
    zero_strategy *s = self;
    dt_status st = dt_zero_init(s->pg, m, &s->p, &s->z);
    if (st < 0)
        return st;
    const char *sl = dt_tp_model_slice(m);
    dt_pg *tp = dt_tp_model_group(m);
    return sl && tp && dt_pg_size(tp) > 1 ? tp_pieces(s, sl, tp) : DT_OK;
}

/* ZeRO-3 with its parameters offloaded to NVMe steps the optimizer unit by
 * unit (dt_zero_step): f32 parameters, no loss scaling, no LAMB. */
static dt_status s_optim_setup(void *self, dt_strategy_optim *o)
{
    zero_strategy *s = self;
    if (!dt_zero_params_offloaded(s->z))
        return DT_OK;
    if (o->scaled || o->mixed || o->kind == DT_OPTIM_LAMB)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: ZeRO parameter offload (offload_param nvme) steps f32 "
                        "parameters unit by unit with sgd, adam, adamw or lion, without loss scaling (this run: %s%s)",
                        dt_optim_kind_name(o->kind), o->scaled || o->mixed ? ", mixed precision" : "");
    o->steps = true;
    return DT_OK;
}

static dt_status s_optim_step(void *self, dt_optim *opt, dt_offload_optim *off)
{
    return dt_zero_step(((zero_strategy *)self)->z, opt, off);
}

/* Under tensor parallelism which elements are slices comes from the pieces
 * (the ranges are the units' own flats, not the model's). */
static dt_status s_grad_sqnorm(void *self, const dt_strategy_grads *g, double *sq)
{
    zero_strategy *s = self;
    return dt__strategy_grad_sqnorm_pieces(s->handle, g, s->tpc, s->ntpc, sq);
}

static dt_status s_pieces(void *self, dt_zero_piece *out, size_t cap, size_t *n)
{
    return dt_zero_pieces(((zero_strategy *)self)->z, out, cap, n);
}

/* Sharded over the ZeRO group; under tensor parallelism (stage 1) the
 * data-parallel ranks first complete each other's shares and the
 * tensor-parallel group of data-parallel rank 0 saves. */
static dt_status s_ckpt_layout(void *self, dt_strategy_ckpt *out)
{
    zero_strategy *s = self;
    out->save_group = dt_zero_group(s->z);
    out->share_group = dt_zero_group(s->z);
    out->tp_shares = false;
    return DT_OK;
}

/* Every rank loaded its shard: gather the whole (stage 1/2) units. */
static dt_status s_after_load(void *self) { return dt_zero_after_step(((zero_strategy *)self)->z); }

/* The policy's reduce dtype becomes the units' (before attach); the
 * parameters' dtypes are the model's (built in the policy's param_dtype). */
static dt_status s_set_precision(void *self, const dt_precision_policy *p)
{
    zero_strategy *s = self;
    dt_dtype rd = dt_precision_reduce_dtype(p);
    s->p.reduce_dtype = rd == DT_DTYPE_UNSET ? DT_DTYPE_COUNT : rd;
    return DT_OK;
}

static dt_status s_begin_micro(void *self, bool sync)
{
    dt_zero_set_sync(((zero_strategy *)self)->z, sync);
    return DT_OK;
}

static dt_status s_wait(void *self) { return dt_zero_wait(((zero_strategy *)self)->z); }

static dt_status s_allreduce_sum(void *self, double *v, int n)
{
    return dt_metrics_allreduce(((zero_strategy *)self)->pg, v, n, DT_REDUCE_SUM);
}

static dt_status s_optim_ranges(void *self, dt_model *m, bool no_decay_1d, const dt_optim_range **r, size_t *n)
{
    (void)m;
    return dt_zero_ranges(((zero_strategy *)self)->z, no_decay_1d, r, n);
}

static dt_status s_shard_sum(void *self, double *v, int n) { return dt_zero_shard_sum(((zero_strategy *)self)->z, v, n); }

static dt_status s_memory(void *self, dt_strategy_memory *out)
{
    return dt_zero_memory(((zero_strategy *)self)->z, &out->param_bytes, &out->grad_bytes, &out->gathered_peak);
}

static dt_status s_after_step(void *self) { return dt_zero_after_step(((zero_strategy *)self)->z); }

static dt_status s_sync_buffers(void *self) { return dt_zero_sync_buffers(((zero_strategy *)self)->z); }

static int s_rank(void *self) { return dt_pg_rank(((zero_strategy *)self)->pg); }

static int s_world(void *self) { return dt_pg_size(((zero_strategy *)self)->pg); }

static void s_free(void *self)
{
    zero_strategy *s = self;
    dt_zero_free(s->z);
    dt_free(s->tpc);
    dt_free(s->wrap_type);
    dt_free(s->nvme_path);
    dt_free(s);
}

static const dt_strategy_ops k_zero_ops = {
    .version = DT_STRATEGY_OPS_VERSION,
    .name = "zero",
    .attach = s_attach,
    .begin_micro = s_begin_micro,
    .forward = NULL, /* the units' module hooks do the gathering */
    .wait = s_wait,
    .allreduce_sum = s_allreduce_sum,
    .owned_range = NULL,
    .optim_ranges = s_optim_ranges,
    .shard_sum = s_shard_sum,
    .memory = s_memory,
    .after_step = s_after_step,
    .sync_buffers = s_sync_buffers,
    .rank = s_rank,
    .world = s_world,
    .free = s_free,
    .set_precision = s_set_precision,
    .forward_backward = NULL,
    .optim_setup = s_optim_setup,
    .optim_step = s_optim_step,
    .grad_sqnorm = s_grad_sqnorm,
    .agree_flags = NULL, /* the tensor-parallel default */
    .grads_private = NULL,
    .pieces = s_pieces,
    .ckpt_layout = s_ckpt_layout,
    .after_load = s_after_load,
    .eval_forward = NULL,
    .eval_share = NULL,
    .compress_state = NULL,
};

dt_status dt_strategy_zero_init(dt_pg *pg, const dt_zero_params *p, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_zero_init: out is NULL");
    *out = NULL;
    if (!pg)
        return dt_error(DT_ERR_NULL, "dt_strategy_zero_init: process group is NULL");
    zero_strategy *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_zero_init");
    s->pg = pg;
    s->p = p ? *p : dt_zero_params_default();
    if (s->p.stage < 1 || s->p.stage > 3) {
        int stage = s->p.stage;
        dt_free(s);
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_zero_init: stage %d (1, 2 or 3; stage 0 is the ddp "
                                            "strategy)", stage);
    }
    if (s->p.wrap_module_type) {
        size_t n = strlen(s->p.wrap_module_type) + 1;
        if (!(s->wrap_type = dt_alloc(n))) {
            dt_free(s);
            return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_zero_init");
        }
        memcpy(s->wrap_type, s->p.wrap_module_type, n);
        s->p.wrap_module_type = s->wrap_type;
    }
    if (s->p.offload_param.nvme_path) {
        size_t n = strlen(s->p.offload_param.nvme_path) + 1;
        if (!(s->nvme_path = dt_alloc(n))) {
            dt_free(s->wrap_type);
            dt_free(s);
            return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_zero_init");
        }
        memcpy(s->nvme_path, s->p.offload_param.nvme_path, n);
        s->p.offload_param.nvme_path = s->nvme_path;
    }
    dt_status st = dt_strategy_init(&k_zero_ops, s, out);
    if (st >= 0)
        s->handle = *out;
    if (st < 0) {
        dt_free(s->nvme_path);
        dt_free(s->wrap_type);
        dt_free(s);
    }
    return st;
}

dt_status dt_strategy_fsdp_init(dt_pg *pg, dt_fsdp_sharding sharding, const dt_zero_params *p, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_fsdp_init: out is NULL");
    *out = NULL;
    dt_zero_params zp = p ? *p : dt_zero_params_default();
    switch (sharding) {
    case DT_FSDP_NO_SHARD:
        return dt_strategy_ddp_init(pg, NULL, out);
    case DT_FSDP_SHARD_GRAD_OP:
        zp.stage = 2;
        return dt_strategy_zero_init(pg, &zp, out);
    case DT_FSDP_FULL_SHARD:
        zp.stage = 3;
        return dt_strategy_zero_init(pg, &zp, out);
    case DT_FSDP_HYBRID_SHARD:
        if (!pg)
            return dt_error(DT_ERR_NULL, "dt_strategy_fsdp_init: process group is NULL");
        zp.stage = 3;
        if (zp.hybrid_shard_size <= 0)
            zp.hybrid_shard_size = dt_pg_local_size(pg);
        return dt_strategy_zero_init(pg, &zp, out);
    default:
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_fsdp_init: unknown sharding strategy %d", (int)sharding);
    }
}

dt_zero *dt_strategy_zero(const dt_strategy *s)
{
    return s && s->ops.attach == s_attach ? ((zero_strategy *)s->self)->z : NULL;
}

