/* dtrain/plan.h — a parallel layout from a few numbers: dp x tp x pp, ZeRO.
 *
 * Overview
 * --------
 * A dt_plan turns the degrees of a run (data-parallel replicas dp,
 * tensor-parallel ranks tp and pipeline stages pp per replica; context
 * parallelism is reserved: cp must be 1), the sharding (ZeRO stage 0-3 or
 * an FSDP sharding strategy), the hierarchical/hybrid choices, the
 * communication hook and the precision policy into what the trainer runs:
 * the process group, the mesh and its groups, and the composed strategy.
 * It checks the numbers against the world and each other first (a degree
 * that does not divide the world, a ZeRO stage that does not combine with
 * tensor or pipeline parallelism, an FSDP name and a stage that disagree):
 * DT_ERR_INVALID_ARG naming the numbers. The same plan gives the model
 * state one rank will hold (dt_plan_memory, the ZeRO memory model of
 * offload.h) before anything large is allocated. `dtrain train` builds
 * its runs this way, from flags or from a DeepSpeed-style config
 * (dt_plan_from_config).
 *
 * Layout: the world is dp x tp x pp ranks. With pp > 1 it is one mesh
 * ("dp", "tp", "pp": dt_pipe_mesh_init) and the "pipe" strategy takes its
 * pipelines and replicas (ZeRO-1 over the replicas with zero_stage 1).
 * With tp > 1 alone, Megatron's order: tp ranks adjacent (dt_tp_groups),
 * DDP or ZeRO-1 over the data-parallel groups. Otherwise DDP (stage 0) or
 * ZeRO (stage 1-3) over the world, or "none" on one rank.
 *
 * Usage (every rank):
 *     dt_plan_params pp = dt_plan_params_default();
 *     pp.tp = 2; pp.pp = 2; pp.zero_stage = 1;        // dp: what the world leaves
 *     dt_plan *pl;
 *     if (dt_plan_init(NULL, &pp, &pl) < 0) fail(dt_last_error());  // ranks from the launcher
 *     dt_model_config mc = dt_model_config_default();
 *     mc.tp = dt_plan_tp_group(pl);                    // the model's tensor-parallel slices
 *     mc.build.meta = dt_plan_meta_model(pl);          // each rank initialises only what it holds
 *     dt_model_create("gpt-micro", seed, &mc, &m, &desc);
 *     dt_strategy *s;
 *     dt_plan_strategy(pl, m, &s);                     // owned by the trainer from here
 *     dt_trainer_init(m, s, &tparams, &tr);
 *     ...
 *     dt_trainer_free(tr); dt_model_free(m); dt_plan_free(pl);   // the plan last
 *
 * Lifecycle: the plan owns the groups and the mesh it made (and the world
 * group when it made it: world NULL); the strategy borrows them, so the
 * plan outlives the trainer. A plan is built once per run on every rank
 * (collective: group creation). */
#ifndef DTRAIN_PLAN_H
#define DTRAIN_PLAN_H

#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/mesh.h"
#include "dtrain/offload.h"
#include "dtrain/parallel.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_plan dt_plan;

typedef struct dt_plan_params {
    int dp;                   /* data-parallel replicas; 0: the world / (tp x pp); default 0 */
    int tp;                   /* tensor-parallel ranks per replica; default 1 */
    int pp;                   /* pipeline stages (ranks) per replica; default 1 */
    int cp;                   /* context parallelism: reserved, must be 1; default 1 */
    int zero_stage;           /* 0 DDP, 1-3 ZeRO (parallel.h); with tp or pp > 1: 0 or 1; default 0 */
    int fsdp;                 /* -1: unset; else a dt_fsdp_sharding, which sets the stage (NO_SHARD 0,
                                 SHARD_GRAD_OP 2, FULL_SHARD 3, HYBRID_SHARD 3 sharded within each
                                 machine); default -1 */
    bool hierarchical;        /* two-level reductions (intra-node, then across nodes) for DDP and ZeRO;
                                 default false */
    bool sync_bn;             /* DDP: batch norms become SyncBatchNorm (dt_syncbn_convert) */
    dt_ddp_params ddp;        /* DDP's buckets and communication hook (comm_hook, powersgd); default
                                 dt_ddp_params_default() */
    dt_zero_params zero;      /* ZeRO/FSDP's knobs (units, prefetch, parameter offload, init seed and
                                 generator); its stage is zero_stage's; default dt_zero_params_default() */
    dt_pipe_params pipe;      /* pp > 1: schedule, micro_batches, balance, sample, cuts (pp, zero,
                                 mesh, init_rng and init_seed are the plan's); default
                                 dt_pipe_params_default() */
    const char *names[5];     /* how messages name dp, tp, pp, the communication hook and the ZeRO
                                 stage (a CLI: "--dp", "--tp", "--pp", "--comm-hook",
                                 "--zero/--fsdp"); default "dp", "tp", "pp", "comm hook",
                                 "zero_stage/fsdp" */
} dt_plan_params;

/* dp from the world, tp = pp = cp = 1, DDP, the defaults of each part. */
DT_API dt_plan_params dt_plan_params_default(void);

/* The degrees and the sharding of a DeepSpeed-style config (config.h) into
 * *p (other fields kept): dtrain.data_parallel_size, dtrain.tensor_parallel_size,
 * pipeline.stages / dtrain.pipeline_parallel_size and the pipeline's keys
 * (dt_config_pipe_params), zero_optimization (dt_config_zero_params),
 * dtrain.hybrid_shard (true: fsdp = DT_FSDP_HYBRID_SHARD),
 * dtrain.hierarchical_allreduce, dtrain.comm_hook. `dtrain train --config`
 * builds its layout with it (the command line's flags merged into the
 * config first). A bad value is the config
 * layer's error (DT_ERR_INVALID_ARG naming the key). */
DT_API dt_status dt_plan_from_config(const dt_config *c, dt_plan_params *p);

/* Check p against the world and build the groups, the mesh and (later) the
 * strategy's parameters. world: borrowed (must outlive the plan); NULL:
 * the plan makes the world group from the launcher's environment
 * (dt_pg_init) and owns it. Collective over the world. DT_ERR_INVALID_ARG
 * for numbers that do not fit (named), a group's error otherwise. */
DT_API dt_status dt_plan_init(dt_pg *world, const dt_plan_params *p, dt_plan **out);

/* The degrees and the world size the environment gives, checked without
 * creating anything (what dt_plan_init checks first; world_size: the
 * launcher's WORLD_SIZE, 1 without one). */
DT_API dt_status dt_plan_check(const dt_plan_params *p, int world_size);

/* The strategy of the plan for model m (built with dt_plan_tp_group's
 * slices where tp > 1): "pipe" over the mesh (pp > 1), "zero" (stage 1-3)
 * or "ddp" over the data-parallel group, "none" alone. DDP with sync_bn
 * converts m's batch norms first. The caller owns *out (dt_trainer_init
 * takes it). */
DT_API dt_status dt_plan_strategy(dt_plan *pl, dt_model *m, dt_strategy **out);

/* The precision policy of the layout: DDP with a compression hook reduces
 * in the hook's dtype (fp16/bf16: the hook IS the reduce dtype; PowerSGD:
 * f32), which replaces p->reduce_dtype; other layouts leave *p as it is. */
DT_API void dt_plan_precision(const dt_plan *pl, dt_precision_policy *p);

/* pp > 1 balanced by time (pipe.balance DT_PIPE_BY_TIME): the batch to
 * time the units on, known once the data is loaded (pipeline.h's
 * dt_pipe_params.sample; borrowed until dt_plan_strategy). */
DT_API void dt_plan_set_sample(dt_plan *pl, const dt_trainer_batch *sample);

/* The model state one rank holds (offload.h's ZeRO model: parameters,
 * gradients, optimizer states, fp32 masters) for a model of numel
 * parameters of param_bytes bytes each (4 or 2: masters then counted),
 * trained with optimizer kind (sgd_momentum: SGD keeps one state),
 * optimizer state offloaded as *optim_offload says (NULL: in memory; NVMe:
 * its sub-group buffers) and parameters as the plan's ZeRO-3 offload_param.
 * Sharded over the plan's data-parallel ranks. */
DT_API dt_status dt_plan_memory(const dt_plan *pl, size_t numel, int param_bytes, dt_optim_kind kind,
                                bool sgd_momentum, const dt_offload_params *optim_offload, dt_mem_estimate *out);

/* The training sampler of the layout: each replica its share of n samples
 * per epoch (dt_sampler_distributed_init: shuffled by seed with rng, padded
 * by wrapping so every replica runs as many steps), or a random sampler of
 * all n with one replica. The ranks of one replica (tp, pp) draw the same. */
DT_API dt_status dt_plan_sampler(const dt_plan *pl, int64_t n, uint64_t seed, dt_shuffle_rng rng, dt_sampler **out);
/* This replica's contiguous range [lo, hi) of n evaluation items (dt_eval_shard). */
DT_API void dt_plan_eval_range(const dt_plan *pl, int64_t n, int64_t *lo, int64_t *hi);

/* This rank's data-parallel index and the number of replicas. */
DT_API int dt_plan_rank(const dt_plan *pl);
DT_API int dt_plan_world(const dt_plan *pl);
/* The ZeRO stage in effect (after fsdp), 0 for DDP. */
DT_API int dt_plan_zero_stage(const dt_plan *pl);
/* The degrees in effect. */
DT_API int dt_plan_tp(const dt_plan *pl);
DT_API int dt_plan_pp(const dt_plan *pl);
/* This rank's tensor-parallel rank and pipeline rank (0 without them). */
DT_API int dt_plan_tp_rank(const dt_plan *pl);
DT_API int dt_plan_pp_rank(const dt_plan *pl);
/* The tensor-parallel group for the model's slices (dt_model_config.tp),
 * NULL with tp 1. Borrowed. */
DT_API dt_pg *dt_plan_tp_group(const dt_plan *pl);
/* The data-parallel group (NULL: one replica and no ZeRO, or a pipeline,
 * which splits the world itself); the world group (every rank). Borrowed. */
DT_API dt_pg *dt_plan_dp_group(const dt_plan *pl);
DT_API dt_pg *dt_plan_world_group(const dt_plan *pl);
/* The dp x tp x pp mesh (pp > 1), else NULL. Borrowed. */
DT_API dt_mesh *dt_plan_mesh(const dt_plan *pl);
/* Whether the model is best built meta (nothing allocated until the
 * strategy says what this rank holds): ZeRO-3, and a pipeline without
 * tensor parallelism or time balancing (each rank fills only its stages). */
DT_API bool dt_plan_meta_model(const dt_plan *pl);
/* Batch norms dt_plan_strategy made SyncBatchNorm (sync_bn). */
DT_API int dt_plan_num_syncbn(const dt_plan *pl);
/* Whether this rank is the world's first (prints, writes files). */
DT_API bool dt_plan_is_main(const dt_plan *pl);
/* The groups and the mesh the plan made, subgroups first; the world group
 * when it made it. NULL is a no-op. */
DT_API void dt_plan_free(dt_plan *pl);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PLAN_H */
