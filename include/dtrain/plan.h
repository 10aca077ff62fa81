/* dtrain/plan.h — a parallel layout from a few numbers: dp x cp x tp x pp, ZeRO.
 *
 * Overview
 * --------
 * A dt_plan turns the degrees of a run (data-parallel replicas dp,
 * context-parallel ranks cp, tensor-parallel ranks tp and pipeline stages
 * pp per replica), the sharding (ZeRO stage 0-3 or
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
 * Layout: the world is dp x cp x tp x pp ranks. With cp > 1 (and pp 1),
 * Megatron's order: rank = (d cp + c) tp + t; the tp ranks of a sequence
 * chunk are adjacent (dt_tp_groups), the cp group (dt_plan_cp_params) holds
 * the cp ranks of one replica that share a tp rank, and the gradients
 * (DDP, ZeRO 1-3 without tp, ZeRO-1 with it) reduce over the dp x cp ranks
 * of that tp rank (dt_plan_dp_group): the cp ranks hold replicas of the
 * parameters and each computed the gradient of its part of the sequence.
 * The data: dt_plan_rank / dt_plan_world are the replica's index and the
 * number of replicas dp, so every cp rank of a replica reads the same
 * batch (the model keeps its rows: models.h dt_model_config.cp). With pp > 1 it is one mesh
 * ("dp", "tp", "pp": dt_pipe_mesh_init) and the "pipe" strategy takes its
 * pipelines and replicas (ZeRO-1 over the replicas with zero_stage 1);
 * with cp > 1 too the mesh's "dp" holds dp x cp (rank = ((d cp + c) tp +
 * t) pp + s): a stage's gradients reduce over its dp x cp ranks, each cp
 * rank runs its own pipeline over its part of the sequence, and the cp
 * ranks of a replica's stage (its cp group) exchange the attention's
 * keys and values.
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
#include "dtrain/cp.h"
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
    int cp;                   /* context-parallel ranks per replica (the sequence split over them);
                                 default 1 */
    dt_cp_impl cp_impl;       /* cp > 1: ring attention or Ulysses (cp.h); default DT_CP_RING */
    int cp_balance;           /* cp > 1: the causal load balance (2 cp chunks, rank r: r and 2cp-1-r):
                                 1 on, 0 off, -1 auto (on for ring, off for Ulysses); default -1 */
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
    const char *names[6];     /* how messages name dp, tp, pp, the communication hook, the ZeRO
                                 stage and cp (a CLI: "--dp", "--tp", "--pp", "--comm-hook",
                                 "--zero/--fsdp", "--cp"); default "dp", "tp", "pp", "comm hook",
                                 "zero_stage/fsdp", "cp" */
    int (*interrupted)(void *arg); /* world NULL: the world group's dt_pg_params.interrupted (comm.h: stops
                                      the start-up with DT_ERR_CANCELED); default NULL */
    void *interrupted_arg;    /* passed to interrupted; default NULL */
} dt_plan_params;

/* dp from the world, tp = pp = cp = 1, DDP, the defaults of each part. */
DT_API dt_plan_params dt_plan_params_default(void);

/* The degrees and the sharding of a DeepSpeed-style config (config.h) into
 * *p (other fields kept): dtrain.data_parallel_size, dtrain.tensor_parallel_size,
 * dtrain.context_parallel_size (ring attention, Megatron's
 * --context-parallel-size) or DeepSpeed's sequence_parallel_size (its
 * Ulysses degree: cp with Ulysses attention), dtrain.context_parallel_impl
 * ("ring" | "ulysses", over both), dtrain.context_parallel_balance,
 * pipeline.stages / dtrain.pipeline_parallel_size and the pipeline's keys
 * (dt_config_pipe_params), zero_optimization (dt_config_zero_params),
 * dtrain.hybrid_shard (true: fsdp = DT_FSDP_HYBRID_SHARD),
 * dtrain.hierarchical_allreduce, dtrain.comm_hook. `dtrain train --config`
 * builds its layout with it (the command line's flags merged into the
 * config first). A bad value is the config
 * layer's error (DT_ERR_INVALID_ARG naming the key). */
DT_API dt_status dt_plan_from_config(const dt_config *c, dt_plan_params *p);

/* Whether config c leaves the layout to the planner ("dtrain": {"plan":
 * "auto"}, as `dtrain train --plan auto`): *on true, and then the degrees,
 * the ZeRO stage, micro-batches, gradient accumulation, checkpointing and
 * offload are the planner's (dt_plan_search), so a key of c that sets one of
 * them (dtrain.data_parallel_size, dtrain.tensor_parallel_size,
 * dtrain.pipeline_parallel_size, pipeline.stages, dtrain.micro_batches,
 * gradient_accumulation_steps, zero_optimization.stage,
 * zero_optimization.offload_optimizer.device, dtrain.hybrid_shard,
 * dtrain.activation_checkpointing, activation_checkpointing,
 * pipeline.activation_checkpoint_interval, dtrain.context_parallel_size,
 * sequence_parallel_size; "auto" values set nothing) is DT_ERR_INVALID_ARG
 * naming the key and where it came from. dt_plan_from_config checks the
 * same; the caller runs the search and sets the layout it chose. */
DT_API dt_status dt_plan_config_auto(const dt_config *c, bool *on);

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
 * Sharded over the plan's data-parallel ranks (times cp: the cp ranks shard
 * too). */
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
/* The context-parallel degree, this rank's place in its cp group, and the
 * model's context parallelism (dt_model_config.cp: the group, borrowed,
 * with the attention kind and the balance in effect; group NULL with cp 1). */
DT_API int dt_plan_cp(const dt_plan *pl);
DT_API int dt_plan_cp_rank(const dt_plan *pl);
DT_API dt_cp_params dt_plan_cp_params(const dt_plan *pl);
/* The tensor-parallel group for the model's slices (dt_model_config.tp),
 * NULL with tp 1. Borrowed. */
DT_API dt_pg *dt_plan_tp_group(const dt_plan *pl);
/* The group the gradients reduce over: the data-parallel ranks, times the
 * context-parallel ones with cp > 1 (NULL: one replica and no ZeRO, or a
 * pipeline, which splits the world itself); the world group (every rank).
 * Borrowed. */
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

/* ---- prediction: which layout to run (src/plan/predict.c, search.c) -------------
 *
 * dt_plan_search answers "which dp x cp x tp x pp x ZeRO x micro-batches x
 * recomputation should I run on N ranks within M bytes per rank": it
 * enumerates the layouts of a GPT-2 or Llama model (zoo or hf:DIR) for a global batch, predicts
 * each one's peak resident memory per rank and its step time, ranks the
 * feasible ones by time and gives each infeasible one its reason.
 *
 * The prediction rests on a calibration of this machine (dt_plan_calibrate:
 * a few seconds, cacheable with dt_plan_calib_save/load):
 *   - the model's own units, run for real: a 1-block and a 3-block copy of
 *     the model (same width, heads, vocabulary, sequence) each take a
 *     training forward + loss + backward on one sample, with and without
 *     activation checkpointing, and at a quarter of the tokens, on one
 *     thread (interleaved, the best of 3); a third of the difference of the
 *     two is one block, the rest the embeddings, head and loss. Per token:
 *     core-seconds of compute (the process's CPU time) and activation
 *     bytes (the autograd arena's peak); per pass: the fixed core-seconds
 *     beyond the tokens; the parameter count of a block and of the rest;
 *     the core-seconds the process's own threads add over one thread;
 *   - an AdamW step over the 1-block model's parameters (core-seconds per
 *     parameter), a GEMM's rate (flop/s, reported), memcpy bandwidth, and
 *     the process's resident set before any model (the baseline: the
 *     program, its libraries, oneDNN's and OpenMP's state);
 *   - what tensor parallelism leaves whole on each rank: a block's two
 *     layer norms and two residual additions, forward + backward (core-
 *     seconds per token), and what a fresh page costs beyond writing it
 *     (ZeRO-2/3's released gradient pages faulted in again each pass);
 *   - the collective curve of a group, per kind (all-reduce, all-gather,
 *     reduce-scatter: a latency per call plus the bytes over a bus
 *     bandwidth, fitted over 64 KiB to 64 MiB), measured with
 *     dt_plan_calibrate_comm over a group (`dtrain plan` forks a 2-rank
 *     shared-memory group for it; without one, the shared-memory
 *     estimate: half the memcpy bandwidth, 20 us a call).
 *
 * Memory per rank = baseline + model state (dt_mem_model_states over the
 * rank's parameters: tensor-parallel slice, pipeline stage, ZeRO shard) +
 * the gathered units (ZeRO-2: two units' gradients less the rank's shard; ZeRO-3: the units
 * alive at once in backward: the root unit's parameters and gradients, the block unit computed
 * (parameters and gradients), the one prefetched, the one waiting for its reduce-scatter and
 * two in the page pool: 2 roots + 6 blocks) + what the
 * strategies hold beyond the formula (buffer_bytes below: the peers'
 * shared-memory pages a rank reads: DDP's gradients, ZeRO-1/2's units'
 * whole parameters and gradients, ZeRO-3's staging areas) + activations of the
 * micro-batches in flight (1F1B: up to pp on the first stage; GPipe: all
 * m) from the measured bytes per token (context parallelism: a rank keeps
 * seq / cp of them; sequence parallelism keeps the norms' inputs, two
 * per block and the final one, on seq / (cp tp) positions). Step time = compute (per-token core-seconds x
 * tokens plus the fixed cost of each pass (micro-batch, accumulated
 * forward), split over tp and pp, the pipeline bubble (pp - 1) / m of the
 * stage's work, ranks sharing the machine's cores: a rank's threads are
 * cores / ranks, and the step is at least the whole machine's core-seconds
 * over its cores) + collectives (ring volumes over the measured bandwidth
 * plus a latency per call: tp's four all-reduces per block per pass and four
 * for its vocabulary-parallel embedding, head and loss (sequence
 * parallelism: four all-gathers and four reduce-scatters per block at
 * their curves, and the norms and residual adds split over tp), ZeRO-2's reduce-
 * scatter per unit, ZeRO-3's gathers (forward; backward again but the root
 * unit) and reduce-scatters per unit at the all-gather and reduce-scatter
 * curves, the units as wrap_min_params groups
 * the blocks, a pipeline's sends, context parallelism's ring: per block
 * and pass cp - 1 steps that pass a chunk's keys and values forward and
 * keys, values and their gradients backward, in f32, or Ulysses' all-to-
 * alls (q, k, v and the output forward; those, the output's gradient and
 * q, k, v's backward; at the all-gather curve, and their packing copies),
 * the gradients reduced over dp x cp) + the optimizer
 * step over the rank's shard. LoRA (dt_plan_search_params.lora): the
 * frozen model in the parameter dtype, unsharded; the adapters' state,
 * gradients and reductions; LoRA's measured activations and compute ratio.
 * Among the feasible layouts predicted within
 * 5% of the fastest, the simplest ranks first (DDP before ZeRO before
 * tensor or pipeline parallelism; no checkpointing or accumulation before
 * them), as DeepSpeed's autotuner prefers the simpler at equal speed.
 *
 * Usage:
 *     dt_plan_calib c;
 *     if (dt_plan_calib_load(path, "gpt2", 128, DT_F32, &c) < 0) {   // not cached yet
 *         dt_plan_calibrate("gpt2", 128, DT_F32, &c);                // seconds
 *         dt_plan_calib_save(&c, path);
 *     }
 *     dt_plan_search_params sp = dt_plan_search_params_default();
 *     sp.world = 4; sp.global_batch = 16; sp.mem_per_rank = 4ull << 30;
 *     dt_plan_prediction *rows; int n;
 *     dt_plan_search(&sp, &c, &rows, &n);       // feasible first, fastest first
 *     ... rows[0].layout is the choice ...
 *     dt_free(rows);
 */

/* What the calibration measured (per token: one position of one sample). */
typedef struct dt_plan_calib {
    char model[32];           /* the model's id (dt_plan_model_id: the zoo name, "gpt2") */
    int64_t seq;              /* tokens per sample it was measured at */
    dt_dtype dtype;           /* parameter dtype it ran in (DT_F32, DT_BF16) */
    int threads;              /* threads of this process (OMP_NUM_THREADS, else the cores) */
    int cores;                /* cores of the machine (online CPUs this process may use) */
    int64_t n_layer, n_head, n_embd, vocab; /* the full model's shape */
    int64_t n_kv_head;        /* key/value heads (Llama's grouped-query attention; = n_head for GPT-2) */
    double numel_block;       /* parameters of one block */
    double numel_fixed;       /* the rest (embeddings, final norm; the head is tied) */
    double fb_block_s;        /* core-seconds per token of one block's forward + backward */
    double fb_fixed_s;        /* the same for the embeddings, head and loss */
    double fb_block_ckpt_s;   /* one block with activation checkpointing (forward run twice) */
    double pass_block_s;      /* core-seconds one forward + backward pass of one block costs beyond its
                                 tokens (a pass at T/4 tokens against one at T: fb = pass + tokens x per
                                 token): paid per micro-batch and per accumulated forward */
    double pass_fixed_s;      /* the same for the embeddings, head and loss */
    double thread_cost;       /* core-seconds of a pass on `threads` threads over those on one (>= 1: the
                                 figures above are one thread's; a rank with more threads pays this much
                                 more per core-second, scaled by its threads) */
    double act_block;         /* activation bytes per token kept by one block */
    double act_fixed;         /* the embeddings, head and loss (the logits) */
    double act_block_ckpt;    /* one checkpointed block (its input only) */
    double optim_s;           /* core-seconds of an AdamW step per parameter (its gradients written, as
                                 backward leaves them) */
    double matmul_flops;      /* a GEMM's rate on this process's threads, flop/s */
    double copy_bw;           /* memcpy bandwidth, bytes/s (one thread) */
    double coll_bw;           /* all-reduce bus bandwidth, bytes/s (2 (n-1)/n of the buffer per rank over the
                                 time, nccl-tests' convention) */
    double coll_lat_s;        /* seconds per all-reduce call (the curve's intercept) */
    int coll_measured;        /* ranks of the group the curve was measured on; 0: the memcpy estimate */
    double base_rss;          /* resident bytes of the process before any model */
    double repl_block_s;      /* core-seconds per token of a block's parts tensor parallelism does not split
                                 (two layer norms and two residual additions, forward + backward): every tp
                                 rank runs them whole */
    double fault_bw;          /* bytes/s of CPU time a fresh 4 KiB page costs beyond writing it (fault +
                                 zeroing), in a region without huge pages */
    double fault_huge_bw;     /* the same in a 2 MiB-aligned region advised MADV_HUGEPAGE (as ZeRO-2/3 map
                                 the units' whole gradients, which they hand back after each reduce-scatter and
                                 fault in again in the next backward): a fault per 2 MiB; = fault_bw where the
                                 calibration got no huge pages (thp 0) */
    int thp;                  /* 1: the calibration's MADV_HUGEPAGE region got transparent huge pages */
    double nonfinite_s;       /* core-seconds per parameter of the trainer's non-finite scan of the gradients
                                 a rank steps (a read pass each step of a run without loss scaling) */
    double ag_bw, ag_lat_s;   /* all-gather: bus bandwidth ((n-1)/n of the gathered buffer per rank over the
                                 time), bytes/s, and seconds per call: ZeRO-3's parameter gathers */
    double rs_bw, rs_lat_s;   /* reduce-scatter, the same: ZeRO-2/3's gradient reductions */
} dt_plan_calib;

/* Measure this machine for model `model` (a transformer with a Hugging
 * Face description, dt_model_hf_config: the GPT-2 zoo sizes "gpt2",
 * "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-mini", "gpt-micro", the Llama
 * ones "llama-tiny", "llama-100m", and "hf:DIR" for a GPT2LMHeadModel or
 * Llama-family directory) at seq tokens per sample (0: 128, at most the
 * model's positions) in parameter dtype dtype (DT_F32 or DT_BF16): builds
 * copies of the model's shape with one and three blocks (random weights) and
 * runs them, so it allocates about 12 bytes per embedding parameter for a
 * moment and takes seconds. Not collective. Errors: DT_ERR_UNSUPPORTED for
 * a model without such a description (named), DT_ERR_INVALID_ARG for seq
 * or dtype, a model's own errors (hf:DIR's config). */
DT_API dt_status dt_plan_calibrate(const char *model, int64_t seq, dt_dtype dtype, dt_plan_calib *out);
/* The id calibrations of `model` are cached under (buf, n bytes; 32 hold
 * any): the zoo name, or for hf:DIR a hash of the shape its config.json
 * gives ("hfllama-" + 16 hex digits; the figures depend on the shape, not
 * the weights); *positions (may be NULL): the model's positions, the
 * longest seq. DT_ERR_UNSUPPORTED as dt_plan_calibrate. */
DT_API dt_status dt_plan_model_id(const char *model, char *buf, size_t n, int64_t *positions);
/* Measure the collective curve of group g into c: all-reduce, all-gather
 * and reduce-scatter of f32 buffers of 64 KiB, 1 MiB, 8 MiB and 64 MiB
 * (the whole buffer), each size the best of a few runs after a warm-up,
 * the slowest rank's time (agreed by every rank); per kind, t = latency +
 * bus bytes / bandwidth fitted over the sizes into coll_lat_s/coll_bw,
 * ag_lat_s/ag_bw, rs_lat_s/rs_bw, and coll_measured = g's size. About
 * 0.5 s on two shared-memory ranks; 128 MiB of buffers per rank. A group of
 * one leaves c as it is. Collective over g; a collective's error is
 * returned named. */
DT_API dt_status dt_plan_calibrate_comm(dt_pg *g, dt_plan_calib *c);
/* Write c to path as "key value" lines (temp file + rename: complete or
 * absent; a symlink at path is an error). DT_ERR_IO naming the path. */
DT_API dt_status dt_plan_calib_save(const dt_plan_calib *c, const char *path);
/* Read a calibration saved by dt_plan_calib_save that matches model
 * (dt_plan_model_id), seq, dtype and this machine's cores: DT_ERR_NOT_FOUND
 * when the file is absent, was measured for something else or by an older
 * dtrain (then calibrate), DT_ERR_FORMAT for a damaged file (named; a value
 * out of range named too). */
DT_API dt_status dt_plan_calib_load(const char *path, const char *model, int64_t seq, dt_dtype dtype,
                                    dt_plan_calib *out);

/* One layout of a run. */
typedef struct dt_plan_layout {
    int dp, tp, pp;           /* degrees; dp x cp x tp x pp = the world */
    int cp;                   /* context-parallel ranks per replica; 0 or 1: none. Not with offload */
    dt_cp_impl cp_impl;       /* cp > 1: DT_CP_RING (the default: ring attention with the causal load
                                 balance, the sequence in 2 cp chunks) or DT_CP_ULYSSES (DeepSpeed-
                                 Ulysses' all-to-all: a tp rank's heads and the sequence divisible by cp) */
    bool sp;                  /* tp > 1: sequence parallelism (Megatron's: the norms and residual adds on
                                 a rank's T/(cp tp) positions, all-gathers and reduce-scatters in place
                                 of tp's all-reduces; a cp rank's T/cp positions divisible by tp) */
    int zero_stage;           /* 0 (DDP) .. 3; with tp or pp > 1: 0 or 1 */
    bool hybrid;              /* ZeRO-3 sharded within each machine only (FSDP HYBRID_SHARD) */
    int64_t batch;            /* samples per rank per forward (--batch; with pp: the whole batch a
                                 replica splits into micro_batches) */
    int micro_batches;        /* pipeline micro-batches (pp > 1), else 1 */
    int grad_accum;           /* forwards per optimizer step (--grad-accum) */
    bool act_ckpt;            /* activation checkpointing of every block */
    bool offload;             /* optimizer state offloaded to NVMe (ZeRO >= 1, no tp/pp) */
    int64_t wrap_min_params;  /* ZeRO-2/3 units (dt_zero_params.wrap_min_params): a module reaching this
                                 many parameters is its own unit; 0: the whole model is one unit (then
                                 the gathered unit is the whole model). The search sets one block's
                                 parameters */
} dt_plan_layout;

/* LoRA fine-tuning as the planner predicts it: the model's own parameters
 * frozen (kept in the parameter dtype on their tp slice and stage, never
 * sharded; no gradients, optimizer state or masters), the adapters
 * training (whole on each tp rank: an upper bound), and the activations
 * and compute of a LoRA pass as measured on the model's copies. */
typedef struct dt_plan_lora {
    double block, fixed;      /* adapter parameters per block and outside the blocks */
    double act_block;         /* activation bytes per token of a block with its adapters (replaces the
                                 calibration's act_block; measured the same way) */
    double act_fixed;         /* the same for the rest (embeddings, head, loss) */
    double fb_ratio;          /* core-seconds of a LoRA forward + backward over the same copy's without LoRA
                                 (the frozen layers' weight gradients are not computed): the calibrated
                                 compute is scaled by it */
} dt_plan_lora;

/* What dt_plan_search is asked. */
typedef struct dt_plan_search_params {
    int world;                /* ranks (>= 1) */
    int ranks_per_machine;    /* 0: all on one machine (= world) */
    int cores;                /* cores the ranks of one machine share; 0: the calibration's */
    int64_t global_batch;     /* samples per optimizer step over all replicas; 0: world x 2 */
    size_t mem_per_rank;      /* bytes one rank may use; 0: no limit */
    bool offload_dir;         /* an NVMe directory is available for offload (else those layouts are
                                 infeasible, with that reason); default false */
    int max_grad_accum;       /* largest gradient accumulation tried; default 8 */
    dt_optim_kind optimizer;  /* the optimizer's state (offload.h's model) and its step's time, scaled
                                 from the measured AdamW step by the bytes it streams (SGD 3 of
                                 AdamW's 7 streams, with momentum 5); default DT_OPTIM_ADAMW */
    bool sgd_momentum;        /* DT_OPTIM_SGD with momentum */
    dt_plan_lora lora;        /* lora.block > 0: LoRA fine-tuning (dt_plan_lora_measure); default all 0:
                                 every parameter trains */
} dt_plan_search_params;
/* world 1, one machine, no memory limit, global batch 0 (world x 2), AdamW. */
DT_API dt_plan_search_params dt_plan_search_params_default(void);
/* Measure LoRA on `model` (as dt_plan_calibrate names it) with targets
 * (comma-separated layer names, or "all-linear"; as dt_lora_params.targets)
 * and rank r (0: the default, 8) at seq tokens (0: 128, at most the
 * model's positions) in dtype (DT_F32, DT_BF16): copies of the model with
 * one and two blocks, with and without the adapters, each counted (the
 * parameters that train) and run (one sample's forward + backward, the
 * best of 3 after a warm-up: CPU time and the arena's peak) into *out.
 * Seconds, and memory for the copies' embeddings; not cached. Errors: the
 * model's and LoRA's (a target that matches no layer: DT_ERR_NOT_FOUND),
 * named. */
DT_API dt_status dt_plan_lora_measure(const char *model, const char *targets, int64_t r, int64_t seq, dt_dtype dtype,
                                      dt_plan_lora *out);

/* One layout and what it is predicted to cost. */
typedef struct dt_plan_prediction {
    dt_plan_layout layout;
    double mem_bytes;         /* peak resident bytes of the busiest rank */
    double state_bytes;       /* of which model state (parameters, gradients, optimizer, masters) */
    double gathered_bytes;    /* of which ZeRO-2/3's whole units alive at once (ZeRO-3: 2 roots + 6 blocks,
                                 see above) */
    double buffer_bytes;      /* of which the strategies' buffers beyond the formula: with the
                                 shared-memory transport a rank's resident set also counts the pages of
                                 the peers' buffers it reads ((dp - 1)/dp of them: DDP's gradients,
                                 ZeRO-1/2's units' whole parameters and gradients; ZeRO-3: the
                                 transport's staging areas its plain buffers go through, 8 MiB a rank in
                                 each of its two groups, every rank's read) */
    double act_bytes;         /* of which activations */
    double base_bytes;        /* of which the process baseline */
    double step_s;            /* predicted seconds per optimizer step */
    double compute_s, bubble_s, comm_s, optim_s; /* its parts (bubble: idle in the pipeline) */
    bool feasible;
    char reason[200];         /* why not (feasible: "") */
} dt_plan_prediction;

/* The prediction for layout l of p's world with calibration c into *out
 * (out->feasible false with the reason for a layout that breaks a rule or
 * exceeds p->mem_per_rank; DT_ERR_INVALID_ARG only for arguments that make
 * no prediction possible: NULLs, world < 1). */
DT_API dt_status dt_plan_predict(const dt_plan_search_params *p, const dt_plan_calib *c, const dt_plan_layout *l,
                                 dt_plan_prediction *out);

/* Every layout of p (dp x cp x tp x pp = world, tp dividing the heads, pp at
 * most the blocks, cp dividing the sequence into 2 cp chunks (ring) or cp
 * dividing the sequence and a tp rank's heads (Ulysses); tp > 1 with and
 * without sequence parallelism; ZeRO 0-3 and
 * hybrid; batch split into gradient
 * accumulation (1, 2, 4, ... up to max_grad_accum) or pipeline micro-
 * batches (pp .. 4 pp, dividing the replica's samples); checkpointing off
 * and on; offload off and on), predicted: *out (malloc'd; dt_free) holds *n
 * rows, the feasible ones first by step time (ties: less memory), then the
 * infeasible ones by memory. DT_ERR_INVALID_ARG when the global batch is
 * not a multiple of... nothing: a batch no layout divides only yields
 * infeasible rows. */
DT_API dt_status dt_plan_search(const dt_plan_search_params *p, const dt_plan_calib *c, dt_plan_prediction **out,
                                int *n);
/* The margin of that ranking: among the feasible layouts predicted within
 * this fraction of the fastest step, the simplest ranks first. */
#define DT_PLAN_SIMPLER_WITHIN 0.05
/* A layout as text: "dp2 tp1 pp2 zero1 mb4x2 ga1 ckpt", "dp1 cp2 ulysses tp1
 * pp1 zero0 b2 ga1", "dp1 tp2 sp pp1 zero0 b4 ga1" (buf of n bytes). */
DT_API const char *dt_plan_layout_str(const dt_plan_layout *l, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PLAN_H */
