/* dt_plan (plan.h): degrees and sharding into groups, a mesh and the
 * strategy; the memory a rank will hold. */
#include "dtrain/plan.h"
#include "dtrain/zeropp.h"

#include "dtrain/tp.h"

#include <stdio.h>
#include <string.h>

struct dt_plan {
    dt_plan_params p;
    int stage;          /* ZeRO stage in effect (after fsdp) */
    bool hybrid;        /* FSDP HYBRID_SHARD: sharded within each machine */
    dt_pg *world;       /* every rank; NULL on one rank without ZeRO */
    bool own_world;
    dt_pg *pg;          /* the data-parallel group the strategy reduces over (NULL: one replica
                           without ZeRO, or a pipeline) */
    dt_pg *tp_pg, *dp_pg; /* tp > 1 without pp: dt_tp_groups' (owned) */
    dt_pg *cp_pg;       /* cp > 1: the ranks of one replica's sequence (owned) */
    dt_mesh *mesh;      /* pp > 1 (owned; its "tp" group is tp_pg then) */
    int rank, world_size, tp_rank, pp_rank, cp_rank;
    int shard_world;    /* the ranks that hold replicas of (or shard) the same parameters: dp x cp */
    int nconverted;     /* batch norms that became SyncBatchNorm */
};

dt_plan_params dt_plan_params_default(void)
{
    dt_plan_params p;
    memset(&p, 0, sizeof p);
    p.dp = 0;
    p.tp = 1;
    p.pp = 1;
    p.cp = 1;
    p.cp_impl = DT_CP_RING;
    p.cp_balance = -1;
    p.zero_stage = 0;
    p.fsdp = -1;
    p.ddp = dt_ddp_params_default();
    p.zero = dt_zero_params_default();
    p.pipe = dt_pipe_params_default();
    p.names[0] = "dp";
    p.names[1] = "tp";
    p.names[2] = "pp";
    p.names[3] = "comm hook";
    p.names[4] = "zero_stage/fsdp";
    p.names[5] = "cp";
    return p;
}

dt_status dt_plan_config_auto(const dt_config *c, bool *on)
{
    if (!c || !on)
        return dt_error(DT_ERR_NULL, "dt_plan_config_auto: NULL argument");
    *on = false;
    const char *s;
    if (dt_config_get_str(c, "dtrain.plan", &s) != DT_OK)
        return DT_OK;
    if (strcmp(s, "auto")) /* the key table allows "auto" only; a config set by hand may not have been checked */
        return dt_error(DT_ERR_INVALID_ARG, "key dtrain.plan '%s': \"auto\" (the planner chooses the layout) or "
                        "leave it out", s);
    static const char *const layout[] = {
        "dtrain.data_parallel_size", "dtrain.tensor_parallel_size", "dtrain.pipeline_parallel_size", "pipeline.stages",
        "dtrain.micro_batches", "gradient_accumulation_steps", "zero_optimization.stage",
        "zero_optimization.offload_optimizer.device", "dtrain.hybrid_shard", "dtrain.activation_checkpointing",
        "activation_checkpointing", "pipeline.activation_checkpoint_interval", "dtrain.context_parallel_size",
        "sequence_parallel_size"};
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
        const dt_config_origin o = dt_config_origin_of(c, layout[i]);
        if (o != DT_CONFIG_UNSET)
            return dt_error(DT_ERR_INVALID_ARG, "key dtrain.plan \"auto\" and key %s (from %s): the planner chooses "
                            "the layout (degrees, ZeRO stage, micro-batches, gradient accumulation, checkpointing, "
                            "offload); give one of the two", layout[i],
                            o == DT_CONFIG_FROM_FILE ? "the file" : o == DT_CONFIG_FROM_CLI ? "a flag" : "the environment");
    }
    *on = true;
    return DT_OK;
}

dt_status dt_plan_from_config(const dt_config *c, dt_plan_params *p)
{
    if (!c || !p)
        return dt_error(DT_ERR_NULL, "dt_plan_from_config: NULL argument");
    bool planned;
    dt_status st0 = dt_plan_config_auto(c, &planned); /* the layout keys then are the planner's */
    if (st0 < 0)
        return st0;
    int64_t v;
    if (dt_config_get_int(c, "dtrain.data_parallel_size", &v) == DT_OK)
        p->dp = (int)v;
    if (dt_config_get_int(c, "dtrain.tensor_parallel_size", &v) == DT_OK)
        p->tp = (int)v;
    const char *s;
    dt_status st;
    /* DeepSpeed's sequence_parallel_size is its Ulysses degree; Megatron's context parallelism
       (ring attention) is dtrain.context_parallel_size; the impl key decides where both are given */
    if (dt_config_get_int(c, "sequence_parallel_size", &v) == DT_OK) {
        p->cp = (int)v;
        p->cp_impl = DT_CP_ULYSSES;
    }
    if (dt_config_get_int(c, "dtrain.context_parallel_size", &v) == DT_OK) {
        p->cp = (int)v;
        p->cp_impl = DT_CP_RING;
    }
    if (dt_config_get_str(c, "dtrain.context_parallel_impl", &s) == DT_OK &&
        (st = dt_cp_impl_parse(s, &p->cp_impl)) < 0)
        return dt_error_wrap(st, "key dtrain.context_parallel_impl");
    bool bal;
    if (dt_config_get_bool(c, "dtrain.context_parallel_balance", &bal) == DT_OK)
        p->cp_balance = bal ? 1 : 0;
    dt_pipe_params pq = p->pipe;
    pq.pp = p->pp > 1 ? p->pp : 1;
    st = dt_config_pipe_params((dt_config *)c, &pq);
    if (st < 0)
        return st;
    p->pipe = pq;
    p->pp = pq.pp;
    int stage = -1;
    if ((st = dt_config_zero_params(c, &stage, &p->zero)) < 0)
        return st;
    if (stage >= 0)
        p->zero_stage = stage;
    bool hybrid;
    if (dt_config_get_bool(c, "dtrain.hybrid_shard", &hybrid) == DT_OK && hybrid)
        p->fsdp = DT_FSDP_HYBRID_SHARD; /* stage 3 sharded within each machine, replicated across */
    p->hierarchical = p->hierarchical || p->zero.hierarchical;
    bool b;
    if (dt_config_get_bool(c, "dtrain.hierarchical_allreduce", &b) == DT_OK)
        p->hierarchical = b;
    if (dt_config_get_str(c, "dtrain.comm_hook", &s) == DT_OK && (st = dt_comm_hook_parse(s, &p->ddp.comm_hook)) < 0)
        return dt_error_wrap(st, "key dtrain.comm_hook");
    return DT_OK;
}

/* The stage and hybrid choice in effect. */
static void sharding(const dt_plan_params *p, int *stage, bool *hybrid)
{
    *stage = p->zero_stage;
    *hybrid = false;
    if (p->fsdp >= 0) {
        const dt_fsdp_sharding sh = (dt_fsdp_sharding)p->fsdp;
        *stage = sh == DT_FSDP_FULL_SHARD || sh == DT_FSDP_HYBRID_SHARD ? 3 : sh == DT_FSDP_SHARD_GRAD_OP ? 2 : 0;
        *hybrid = sh == DT_FSDP_HYBRID_SHARD;
    }
}

dt_status dt_plan_check(const dt_plan_params *p, int ws)
{
    if (!p)
        return dt_error(DT_ERR_NULL, "dt_plan_check: params is NULL");
    const char *const *N = p->names;
    const char *nd = N[0] ? N[0] : "dp", *nt = N[1] ? N[1] : "tp", *np = N[2] ? N[2] : "pp";
    const char *nc = N[5] ? N[5] : "cp";
    if (p->tp < 1 || p->pp < 1 || p->dp < 0 || p->cp < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s %d, %s %d, %s %d, %s %d: degrees are >= 1 (dp 0: what the world "
                        "leaves)", nd, p->dp, nc, p->cp, nt, p->tp, np, p->pp);
    if ((unsigned)p->cp_impl >= DT_CP_IMPL_COUNT || p->cp_balance < -1 || p->cp_balance > 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: attention kind %d (ring 0, ulysses 1) or balance %d (-1 auto, 0, 1) "
                        "out of range", nc, (int)p->cp_impl, p->cp_balance);
    if (p->fsdp > DT_FSDP_HYBRID_SHARD)
        return dt_error(DT_ERR_INVALID_ARG, "fsdp %d: not an FSDP sharding strategy", p->fsdp);
    int stage;
    bool hybrid;
    sharding(p, &stage, &hybrid);
    if (stage < 0 || stage > 3)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO stage %d: 0 (DDP), 1, 2 or 3", stage);
    if ((p->tp > 1 || p->pp > 1) && stage > 1)
        return dt_error(DT_ERR_INVALID_ARG, "ZeRO stage %d with %s %d x %s %d: tensor and pipeline parallelism "
                        "combine with DDP or ZeRO-1 over the data-parallel ranks", stage, nt, p->tp, np, p->pp);
    const dt_comm_hook_kind hook = p->ddp.comm_hook;
    if (stage > 0 && hook != DT_COMM_HOOK_ALLREDUCE)
        return dt_error(DT_ERR_INVALID_ARG, "%s %s (or AIAK_*_COMPRESSION) compresses DDP's gradient all-reduce; "
                        "ZeRO stage %d (%s) reduce-scatters sharded gradients instead, which %s; drop one of the two",
                        N[3] ? N[3] : "comm hook", dt_comm_hook_name(hook), stage, N[4] ? N[4] : "zero_stage/fsdp",
                        hook == DT_COMM_HOOK_POWERSGD ? "PowerSGD's low-rank all-reduce cannot do"
                                                      : "this hook does not apply to");
    const dt_zero_params *zq = &p->zero; /* ZeRO++: stage 3 over all ranks (FULL_SHARD) */
    if (zq->quantized_weights || zq->quantized_gradients || zq->hpz_partition_size != 1) {
        if (hybrid)
            return dt_error(DT_ERR_INVALID_ARG, "ZeRO++ (zero_quantized_weights, zero_quantized_gradients, "
                            "zero_hpz_partition_size) with FSDP's hybrid_shard: ZeRO++ is FULL_SHARD (stage 3 "
                            "over all ranks); drop one");
        dt_zero_params zc = *zq;
        zc.stage = stage;
        dt_status st = dt_zero_pp_check(&zc, ws);
        if (st < 0)
            return st;
    }
    if (p->tp > 1 && ws % p->tp)
        return dt_error(DT_ERR_INVALID_ARG, "%s %d needs a multiple of %d ranks; this job has %d", nt, p->tp, p->tp,
                        ws);
    if (p->pp > 1 && ws % p->pp)
        return dt_error(DT_ERR_INVALID_ARG, "%s %d needs a multiple of %d ranks; this job has %d", np, p->pp, p->pp,
                        ws);
    if (p->cp > 1 && ws % p->cp)
        return dt_error(DT_ERR_INVALID_ARG, "%s %d needs a multiple of %d ranks; this job has %d", nc, p->cp, p->cp,
                        ws);
    const int per = p->cp * p->tp * p->pp;
    char cps[48] = ""; /* the cp degree in the messages, when there is one */
    if (p->cp > 1)
        snprintf(cps, sizeof cps, "%s %d x ", nc, p->cp);
    if (ws % per)
        return dt_error(DT_ERR_INVALID_ARG, "%s%s %d x %s %d (%d ranks per replica) does not divide this job's %d "
                        "ranks", cps, nt, p->tp, np, p->pp, per, ws);
    if (p->dp && p->dp * per != ws)
        return dt_error(DT_ERR_INVALID_ARG, "%s %d x %s%s %d x %s %d is %d ranks; this job has %d", nd, p->dp, cps, nt,
                        p->tp, np, p->pp, p->dp * per, ws);
    return DT_OK;
}

/* Context parallelism's split of dc, the dp x cp ranks that hold the same parameters (its rank d cp + c): the cp
 * group of this replica, the replica's index and count for the data, dc's size for the sharding */
static dt_status split_cp(dt_plan *pl, dt_pg *dc)
{
    const int cp = pl->p.cp, r = dt_pg_rank(dc);
    dt_status st = dt_pg_split(dc, r / cp, r, &pl->cp_pg);
    if (st < 0)
        return dt_error_wrap(st, "context-parallel groups");
    pl->cp_rank = r % cp;
    pl->rank = r / cp;
    pl->world_size = dt_pg_size(dc) / cp;
    pl->shard_world = dt_pg_size(dc);
    return DT_OK;
}

/* The groups of the layout over pl->world. */
static dt_status build_groups(dt_plan *pl)
{
    dt_status st;
    const dt_plan_params *p = &pl->p;
    pl->rank = dt_pg_rank(pl->world);
    pl->world_size = dt_pg_size(pl->world);
    if (p->cp > 1 && p->pp <= 1) { /* Megatron's order: tp ranks adjacent, then cp, then dp (rank = (d cp + c) tp
                                      + t); with pp: the mesh below */
        if (p->tp > 1 && (st = dt_tp_groups(pl->world, p->tp, &pl->tp_pg, &pl->dp_pg)) < 0)
            return st;
        dt_pg *dc = p->tp > 1 ? pl->dp_pg : pl->world; /* the same tp rank: replicas of the same slices */
        if ((st = split_cp(pl, dc)) < 0)
            return st;
        pl->tp_rank = pl->tp_pg ? dt_pg_rank(pl->tp_pg) : 0;
        pl->pg = dc; /* gradients reduce over dp x cp */
        return DT_OK;
    }
    if (p->pp > 1) { /* one dp x tp x pp mesh: the pipe strategy takes its pipelines and replicas */
        if ((st = dt_pipe_mesh_init(pl->world, p->tp, p->pp, &pl->mesh)) < 0)
            return st;
        pl->rank = dt_mesh_coord(pl->mesh, 0);
        pl->world_size = dt_mesh_size(pl->mesh, 0);
        pl->tp_rank = dt_mesh_coord(pl->mesh, 1);
        pl->tp_pg = p->tp > 1 ? dt_mesh_dim_group(pl->mesh, 1) : NULL; /* the model's slices */
        pl->pp_rank = dt_mesh_coord(pl->mesh, 2);
        if (p->cp > 1) { /* the mesh's "dp" is dp x cp (rank = ((d cp + c) tp + t) pp + s): the pipe strategy
                            reduces a stage's gradients over it; the cp ranks of a replica's stage, its coordinates
                            d cp .. d cp + cp - 1, run the attention's exchanges */
            return split_cp(pl, dt_mesh_dim_group(pl->mesh, 0));
        }
        return DT_OK;
    }
    if (p->tp > 1) { /* Megatron's order: tp ranks adjacent, data parallel across the groups */
        if ((st = dt_tp_groups(pl->world, p->tp, &pl->tp_pg, &pl->dp_pg)) < 0)
            return st;
        pl->tp_rank = dt_pg_rank(pl->tp_pg);
        pl->rank = dt_pg_rank(pl->dp_pg);
        pl->world_size = dt_pg_size(pl->dp_pg);
        pl->pg = pl->world_size > 1 ? pl->dp_pg : NULL;
        return DT_OK;
    }
    pl->pg = pl->world;
    return DT_OK;
}

dt_status dt_plan_init(dt_pg *world, const dt_plan_params *p, dt_plan **out)
{
    if (!out || !p)
        return dt_error(DT_ERR_NULL, "dt_plan_init: NULL argument");
    *out = NULL;
    int ws = 1;
    dt_status st = world ? DT_OK : dt_pg_env_world_size(&ws);
    if (st < 0)
        return st;
    if (world)
        ws = dt_pg_size(world);
    if ((st = dt_plan_check(p, ws)) < 0)
        return st;
    dt_plan *pl = dt_calloc(sizeof *pl);
    if (!pl)
        return dt_error(DT_ERR_NO_MEMORY, "dt_plan_init");
    pl->p = *p;
    sharding(p, &pl->stage, &pl->hybrid);
    pl->world_size = 1;
    pl->world = world;
    pl->shard_world = 0;
    if (!world && (ws > 1 || pl->stage > 0)) {
        dt_pg_params pp = dt_pg_params_default();
        pp.interrupted = p->interrupted;
        pp.interrupted_arg = p->interrupted_arg;
        if (ws <= 1) { /* ZeRO on one rank: a group of one */
            pp.rank = 0;
            pp.world_size = 1;
            pp.backend = "self";
        }
        if ((st = dt_pg_init(&pp, &pl->world)) < 0) {
            dt_free(pl);
            return dt_error_wrap(st, "process group");
        }
        pl->own_world = true;
    }
    if (pl->world && (st = build_groups(pl)) < 0) {
        dt_plan_free(pl);
        return st;
    }
    if (!pl->shard_world)
        pl->shard_world = pl->world_size;
    /* hpZ's groups must be machines: checked here, where a bad number is the user's input */
    if (pl->pg && pl->stage == 3 && (st = dt_zpp_hpz_check(pl->pg, p->zero.hpz_partition_size)) < 0) {
        dt_plan_free(pl);
        return st;
    }
    *out = pl;
    return DT_OK;
}

dt_status dt_plan_strategy(dt_plan *pl, dt_model *m, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_plan_strategy: out is NULL");
    *out = NULL;
    if (!pl || !m)
        return dt_error(DT_ERR_NULL, "dt_plan_strategy: %s is NULL", pl ? "model" : "plan");
    const dt_plan_params *p = &pl->p;
    dt_status st;
    if (p->pp > 1) {
        dt_pipe_params pp = p->pipe;
        pp.pp = p->pp;
        pp.mesh = pl->mesh;
        pp.zero = pl->stage; /* 0 or 1 (dt_plan_check) */
        pp.init_rng = p->zero.init_rng; /* a meta model (dt_plan_meta_model) */
        pp.init_seed = p->zero.init_seed;
        st = dt_strategy_pipe_init(pl->world, &pp, out);
        return st < 0 ? dt_error_wrap(st, "pipeline") : st;
    }
    if (!pl->pg)
        return dt_strategy_none_init(out);
    if (pl->stage > 0) {
        dt_zero_params zp = p->zero;
        zp.stage = pl->stage;
        zp.hierarchical = p->hierarchical;
        if (pl->hybrid) /* shard within this machine's ranks, replicate across machines */
            zp.hybrid_shard_size = dt_pg_local_size(pl->pg);
        st = dt_strategy_zero_init(pl->pg, &zp, out);
        return st < 0 ? dt_error_wrap(st, "ZeRO stage %d", pl->stage) : st;
    }
    if (p->sync_bn && (st = dt_syncbn_convert(m, pl->pg, &pl->nconverted)) < 0)
        return dt_error_wrap(st, "sync_bn");
    dt_ddp_params dp = p->ddp;
    dp.hierarchical = p->hierarchical;
    st = dt_strategy_ddp_init(pl->pg, &dp, out);
    return st < 0 ? dt_error_wrap(st, "DDP") : st;
}

dt_status dt_plan_memory(const dt_plan *pl, size_t psi, int param_bytes, dt_optim_kind kind, bool sgd_momentum,
                         const dt_offload_params *op, dt_mem_estimate *out)
{
    if (!pl || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_memory: NULL argument");
    const dt_offload_device dev = op ? op->device : DT_OFFLOAD_NONE;
    dt_mem_policy mp = {.numel = psi, .world = pl->shard_world, .zero_stage = pl->stage, .param_bytes = param_bytes,
                        .master_weights = param_bytes < 4, .sgd_momentum = sgd_momentum, .optimizer = kind,
                        .offload = dev};
    const dt_offload_params *pp = &pl->p.zero.offload_param;
    if (pl->stage == 3 && pp->device == DT_OFFLOAD_NVME) { /* at most buffer_count shards in memory */
        size_t shard = (psi + (size_t)pl->shard_world - 1) / (size_t)pl->shard_world;
        size_t cap = (size_t)pp->buffer_count * pp->buffer_size;
        mp.param_offload = true;
        mp.param_buffer_bytes = (shard < cap ? shard : cap) * sizeof(float);
    }
    if (dev == DT_OFFLOAD_NVME) { /* the driver's buffers: buffer_count sub-groups of each state */
        size_t sg = psi < op->sub_group_size ? psi : op->sub_group_size;
        int nstate = dt_optim_kind_num_states(kind, sgd_momentum); /* -1: refused below */
        nstate = nstate > 0 ? nstate : 0;
        mp.offload_buffer_bytes = (size_t)op->buffer_count * (size_t)nstate * sg * sizeof(float);
    }
    return dt_mem_model_states(&mp, out);
}

void dt_plan_precision(const dt_plan *pl, dt_precision_policy *p)
{
    const dt_comm_hook_kind h = pl ? pl->p.ddp.comm_hook : DT_COMM_HOOK_ALLREDUCE;
    if (pl && p && pl->pg && pl->p.pp <= 1 && pl->stage == 0 && h != DT_COMM_HOOK_ALLREDUCE)
        p->reduce_dtype = h == DT_COMM_HOOK_FP16 ? DT_F16 : h == DT_COMM_HOOK_BF16 ? DT_BF16 : DT_F32;
}

void dt_plan_set_sample(dt_plan *pl, const dt_trainer_batch *sample)
{
    if (pl)
        pl->p.pipe.sample = sample;
}

dt_status dt_plan_sampler(const dt_plan *pl, int64_t n, uint64_t seed, dt_shuffle_rng rng, dt_sampler **out)
{
    if (!pl || !out)
        return dt_error(DT_ERR_NULL, "dt_plan_sampler: NULL argument");
    if (pl->world_size <= 1)
        return dt_sampler_random_init_rng(n, seed, rng, out);
    dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
    p.length = n;
    p.world_size = pl->world_size;
    p.rank = pl->rank;
    p.shuffle = true;
    p.seed = seed;
    p.drop_last = false;
    p.rng = rng;
    return dt_sampler_distributed_init(&p, out);
}

void dt_plan_eval_range(const dt_plan *pl, int64_t n, int64_t *lo, int64_t *hi)
{
    dt_eval_shard(n, dt_plan_rank(pl), dt_plan_world(pl), lo, hi);
}

int dt_plan_rank(const dt_plan *pl) { return pl ? pl->rank : 0; }
int dt_plan_world(const dt_plan *pl) { return pl ? pl->world_size : 1; }
int dt_plan_zero_stage(const dt_plan *pl) { return pl ? pl->stage : 0; }
int dt_plan_tp(const dt_plan *pl) { return pl ? pl->p.tp : 1; }
int dt_plan_pp(const dt_plan *pl) { return pl ? pl->p.pp : 1; }
int dt_plan_tp_rank(const dt_plan *pl) { return pl ? pl->tp_rank : 0; }
int dt_plan_pp_rank(const dt_plan *pl) { return pl ? pl->pp_rank : 0; }
int dt_plan_cp(const dt_plan *pl) { return pl ? pl->p.cp : 1; }
int dt_plan_cp_rank(const dt_plan *pl) { return pl ? pl->cp_rank : 0; }

dt_cp_params dt_plan_cp_params(const dt_plan *pl)
{
    dt_cp_params c = dt_cp_params_default();
    if (!pl || pl->p.cp <= 1)
        return c;
    c.group = pl->cp_pg;
    c.impl = pl->p.cp_impl;
    c.balance = pl->p.cp_balance < 0 ? pl->p.cp_impl == DT_CP_RING : pl->p.cp_balance == 1;
    return c;
}
dt_pg *dt_plan_tp_group(const dt_plan *pl) { return pl ? pl->tp_pg : NULL; }
dt_pg *dt_plan_dp_group(const dt_plan *pl) { return pl ? pl->pg : NULL; }
dt_pg *dt_plan_world_group(const dt_plan *pl) { return pl ? pl->world : NULL; }
dt_mesh *dt_plan_mesh(const dt_plan *pl) { return pl ? pl->mesh : NULL; }
int dt_plan_num_syncbn(const dt_plan *pl) { return pl ? pl->nconverted : 0; }

bool dt_plan_meta_model(const dt_plan *pl)
{
    return pl && (pl->stage == 3 || (pl->p.pp > 1 && pl->p.tp <= 1 && pl->p.pipe.balance != DT_PIPE_BY_TIME));
}

bool dt_plan_is_main(const dt_plan *pl)
{
    return !pl || (pl->rank == 0 && pl->tp_rank == 0 && pl->pp_rank == 0 && pl->cp_rank == 0);
}

void dt_plan_free(dt_plan *pl)
{
    if (!pl)
        return;
    dt_pg_free(pl->cp_pg); /* with pp a subgroup of the mesh's: first */
    if (pl->mesh) /* the mesh owns its tp group */
        dt_mesh_free(pl->mesh);
    else
        dt_pg_free(pl->tp_pg);
    dt_pg_free(pl->dp_pg);
    if (pl->own_world)
        dt_pg_free(pl->world);
    dt_free(pl);
}
