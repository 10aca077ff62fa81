/* dtrain/train.h — the trainer: one call per training step.
 *
 * Overview
 * --------
 * A dt_trainer owns the training step, so that the command line, the
 * benchmarks, the tests and a user's program all run the same arithmetic.
 * One dt_trainer_step() runs, in this order:
 *
 *   1. for each micro-batch (gradient accumulation): forward (in the
 *      dtypes the model's parameters are held in: the precision policy),
 *      the loss (divided by grad_accum when > 1; times the loss scale when
 *      scaling), backward. The strategy is told which
 *      micro-batch is the last, whose backward reduces the gradients (the
 *      others accumulate locally: DDP's no_sync);
 *   2. the strategy waits for its outstanding reductions (stepping while
 *      reductions are in flight cannot happen through the trainer);
 *   3. unscale and look for inf/NaN in one pass over the gradients
 *      (dt_optim_unscale_grads; bf16/f16 gradients are widened to f32 in
 *      it), then one all-reduce over the replicas of [stop request,
 *      overflow, the micro-batch losses]: every rank agrees on the losses
 *      shown, on skipping an overflowed step (loss scaling: parameters,
 *      optimizer state, step count and schedule stay as they were) and on
 *      stopping;
 *   4. clip by the global norm (clip_grad_norm), the optimizer step on the
 *      ranges this rank owns (fp32 master weights for bf16/f16 parameters,
 *      the model's copy refreshed; gradients zeroed in the same pass, or,
 *      in one process with f32 gradients, marked zero without writing them:
 *      dt_model_zero_grad_lazy, the next backward overwrites them and
 *      zero-fills the ones it does not reach, so read a parameter's
 *      gradient between steps only after dt_model_grads_materialize), then
 *      the strategy gathers what it must (ZeRO); the loss scaler's update;
 *   5. the learning rate of the next step from the schedule, and metrics
 *      (dt_trainer_metrics) handed back to the caller.
 *
 * Strategies: a parallel strategy plugs in as a small vtable
 * (dt_strategy_ops) that the trainer calls at fixed points: attach to the
 * model, begin a micro-batch, forward, wait, all-reduce metrics, the owned
 * range, after the step, synchronise buffers; and the work that depends on
 * where state lives: the optimizer step over what the rank owns, the
 * gradient norm's partial sums and their reductions (tensor parallel
 * included), the agreement on overflow, the checkpoint layout and what
 * completes a load, evaluation's forward and result sharing (generation
 * too), a compression hook's state. "none" runs one process; "ddp" is
 * DistributedDataParallel (parallel.h), "zero" ZeRO/FSDP, "pipe" the
 * pipeline (pipeline.h). A strategy is never a special case inside the
 * trainer: a new one is a file that fills a dt_strategy_ops. A plan
 * (plan.h) builds the strategy of a dp x tp x pp layout.
 *
 * Lifecycle: dt_trainer_init() takes ownership of the strategy (also on
 * failure) and borrows the model, which must outlive the trainer; it builds
 * the optimizer (params.optimizer) over the strategy's owned range and a
 * context (dt_ctx) for the steps. dt_trainer_free() frees the optimizer,
 * the context and the strategy (DDP: gives the model a private gradient
 * buffer back). Batches are borrowed for the duration of one call.
 *
 * A data-parallel training loop
 * -----------------------------
 *     dt_pg *pg;           dt_pg_init(NULL, &pg);              // ranks from the launcher
 *     dt_model *m = ...;                                       // dt_model_build / dt_model_create
 *     dt_strategy *s;      dt_strategy_ddp_init(pg, NULL, &s); // or dt_strategy_none_init(&s)
 *     dt_trainer_params tp = dt_trainer_params_default();
 *     tp.sgd.lr = 0.1;     tp.sgd.momentum = 0.9;              // optimizer: SGD by default
 *     tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;                  // the default
 *     dt_trainer *tr;
 *     if (dt_trainer_init(m, s, &tp, &tr) < 0) fail(dt_last_error());
 *     for (int step = 0; step < 200; step++) {
 *         dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){B, 16},
 *                                                    y, DT_I64, 1, (int64_t[]){B});
 *         dt_trainer_metrics r;
 *         if (dt_trainer_step(tr, &b, 1, &r) < 0) fail(dt_last_error());
 *         printf("loss %.4f\n", r.loss);
 *     }
 *     dt_trainer_free(tr);  dt_model_free(m);  dt_pg_free(pg);
 *
 * With a loader (data.h), dt_trainer_epoch() runs an epoch (grouping
 * batches into steps of grad_accum micro-batches, the last one possibly
 * shorter) and calls back after every step; dt_trainer_evaluate() computes
 * the test loss and accuracy of a (per-rank shard of a) test set, summed
 * over the replicas.
 *
 * Checkpoints and exact resume
 * ----------------------------
 * dt_trainer_save(tr, dir, &sp) writes dir/step-<N>: the weights, the
 * optimizer state and the run state (steps, schedule, data position,
 * random-stream counters); dt_trainer_load(tr, dir, &info) restores all of
 * it into a trainer built the same way, and the next dt_trainer_fit (or
 * dt_trainer_epoch of the saved epoch) goes on with exactly the batches
 * the saving run would have seen next: at the same world size, the weights
 * after the last step are bit-identical to an uninterrupted run's. Any
 * strategy saves (DDP, ZeRO 1-3, one process; f32, bf16, fp16 with fp32
 * masters) and any loads what another saved, at another world size too:
 * each rank holds element ranges of each tensor and loading intersects
 * them with the saved ones (parameters, masters and optimizer state alike).
 *
 *     dt_trainer_save_params sp = dt_trainer_save_params_default();
 *     sp.async = true; sp.keep = 3;
 *     // in the per-step callback, every 100 steps (on every rank):
 *     if ((m->step + 1) % 100 == 0) st = dt_trainer_save(tr, "ckpt", &sp);
 *     ...
 *     // a new process, same model, optimizer kind and data:
 *     dt_trainer_resume_info info;
 *     if (dt_trainer_load(tr, "ckpt", &info) < 0) fail(dt_last_error());
 *     if (!info.data_order_kept) warn(info.note);   // another world size
 *     dt_trainer_fit(tr, ld, info_ds, epochs, cb, ud, NULL);  // from the saved epoch and batch
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/base.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/offload.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/tensor.h"
#include "dtrain/monitor.h"
#include "dtrain/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- precision policy ---------------------------------------------------------- */

/* "Leave as it is" for a dtype of the policy (FSDP's None). */
#define DT_DTYPE_UNSET DT_DTYPE_COUNT

/* Which dtype each kind of data computes and travels in (FSDP's
 * MixedPrecision; apex O2's cast model with f32 batch
 * norm, 14.2; DeepSpeed's fp16/bf16 blocks, 1.1-1.3). Parameters in
 * param_dtype are stepped through fp32 master weights that the trainer
 * keeps for the range each rank owns (optim.h), and optimizer states stay
 * f32. fp16 needs loss scaling (dt_trainer_params.use_scaler); bf16 does
 * not (DeepSpeed forces scale 1 there). */
typedef struct dt_precision_policy {
    dt_dtype param_dtype;      /* compute dtype of the parameters (forward and backward): DT_F32,
                                  DT_BF16, DT_F16 or DT_DTYPE_UNSET (as the model holds them);
                                  the model must hold its parameters in it; default UNSET */
    dt_dtype reduce_dtype;     /* dtype of the gradient reduction (DDP's all-reduce): f32, bf16,
                                  f16; UNSET inherits param_dtype (FSDP); default UNSET */
    dt_dtype buffer_dtype;     /* dtype of buffers (running statistics): f32, bf16, f16 or UNSET
                                  (not checked); the model must hold its buffers so
                                  (dt_model_build_params.buffer_dtype; batch norm's stay f32
                                  under keep_batchnorm_fp32), else trainer init refuses;
                                  default UNSET */
    bool keep_batchnorm_fp32;  /* batch-norm parameters and statistics stay f32 (apex O2's
                                  keep_batchnorm_fp32); default true */
    const char *const *f32_modules; /* per-module override: NULL-terminated list of module paths
                                  ("features.3", "classifier") whose parameters, and those of the
                                  modules inside them, stay f32; borrowed; default NULL */
} dt_precision_policy;

/* All UNSET, keep_batchnorm_fp32 true, no overrides: plain f32 training. */
DT_API dt_precision_policy dt_precision_policy_default(void);
/* The policy of a --precision name: "fp32"/"f32" (all f32), "bf16", "fp16"/"f16"
 * (param and reduce dtype; buffers f32), "auto" (bf16 or fp32 as
 * dt_precision_auto chooses). DT_ERR_INVALID_ARG otherwise. */
DT_API dt_status dt_precision_policy_parse(const char *name, dt_precision_policy *out);
/* DT_ERR_INVALID_ARG naming the field when a dtype is neither a float type
 * nor UNSET. */
DT_API dt_status dt_precision_policy_check(const dt_precision_policy *p);
/* The reduce dtype after inheritance: reduce_dtype, else param_dtype, else UNSET. */
DT_API dt_dtype dt_precision_reduce_dtype(const dt_precision_policy *p);
/* The dtype the parameters of module `path` (dotted, "" for the root)
 * compute in: f32 for a module under an f32_modules entry or, with
 * keep_batchnorm_fp32, a batch norm; else param_dtype (f32 when UNSET).
 * This is the table a model is cast by. */
DT_API dt_dtype dt_precision_param_dtype(const dt_precision_policy *p, const char *path, bool is_batchnorm);
/* The model build options that make a model hold its parameters and
 * buffers as policy p says (what `dtrain train --precision` and `dtrain
 * bench step --precision` build with): b->param_dtype (f32 when UNSET),
 * keep_batchnorm_fp32, f32_modules (borrowed from p), buffer_dtype (f32
 * when UNSET). The trainer then keeps f32 master weights for a bf16/f16
 * model and runs its forward under autocast in that dtype. Other fields of
 * *b are left as they are. */
DT_API dt_status dt_precision_policy_build_params(const dt_precision_policy *p, dt_model_build_params *b);

/* ---- strategies --------------------------------------------------------------- */

typedef struct dt_strategy dt_strategy;

/* Bytes of model state one rank holds (dt_trainer_memory). */
typedef struct dt_strategy_memory {
    size_t param_bytes;       /* parameters held between steps (whole, or this rank's shards plus
                                 parameters kept whole) */
    size_t grad_bytes;        /* gradients held between steps (whole, or this rank's shards) */
    size_t gathered_peak;     /* peak bytes of gathered (unsharded) parameters and gradients
                                 that existed at once beyond the above, since init */
} dt_strategy_memory;

struct dt_strategy_fb;
struct dt_strategy_optim;
struct dt_strategy_grads;
struct dt_strategy_ckpt;

#define DT_STRATEGY_OPS_VERSION 4

/* The points where the trainer calls a strategy. `self` is the pointer
 * given to dt_strategy_init. Optional slots may be NULL (the default said). */
typedef struct dt_strategy_ops {
    int version;       /* DT_STRATEGY_OPS_VERSION */
    const char *name;  /* "none", "ddp", ... */
    /* Required. Take charge of model m (DDP: check it across ranks,
     * broadcast rank 0's weights, move the gradients into group memory,
     * install the hooks). Called once, by dt_trainer_init. */
    dt_status (*attach)(void *self, dt_model *m);
    /* Optional (default: nothing). A micro-batch begins; sync says whether
     * its backward must reduce the gradients (the step's last micro-batch). */
    dt_status (*begin_micro)(void *self, bool sync);
    /* Optional (default: dt_model_forward). The forward of a micro-batch in
     * grad mode. */
    dt_tensor *(*forward)(void *self, dt_ctx *ctx, dt_model *m, dt_tensor *x);
    /* Optional (default: nothing). After the last backward: wait until
     * every gradient reduction is complete. */
    dt_status (*wait)(void *self);
    /* Optional (default: one replica, values unchanged). In-place SUM of n
     * doubles over the replicas (collective). */
    dt_status (*allreduce_sum)(void *self, double *v, int n);
    /* Optional (default: [0, flat numel), everything). The range of the
     * flat buffers this rank's optimizer steps. */
    dt_status (*owned_range)(void *self, dt_model *m, size_t *lo, size_t *hi);
    /* Optional (default: one range, owned_range of the model's f32 flats).
     * The ranges the optimizer steps when the strategy keeps parameters in
     * buffers of its own (ZeRO's units): *n ranges owned by the strategy,
     * valid until it is freed, segments clipped to each range, no_decay
     * set on 1-d tensors when no_decay_1d. Overrides owned_range. */
    dt_status (*optim_ranges)(void *self, dt_model *m, bool no_decay_1d, const dt_optim_range **r, size_t *n);
    /* Optional (default: allreduce_sum). In-place SUM of n doubles over the
     * ranks whose optimizer ranges are disjoint and together cover the
     * model (the global gradient norm): ZeRO's shard group; under hybrid
     * sharding the replicas hold copies and are not summed. */
    dt_status (*shard_sum)(void *self, double *v, int n);
    /* Optional (default: the model's f32 parameter and gradient flats,
     * nothing gathered). What this rank holds (dt_trainer_memory). */
    dt_status (*memory)(void *self, dt_strategy_memory *out);
    /* Optional (default: nothing). After the optimizer step (ZeRO: gather
     * the updated parameters). */
    dt_status (*after_step)(void *self);
    /* Optional (default: nothing). Before an evaluation: make the replicas'
     * buffers (batch-norm running statistics) agree. */
    dt_status (*sync_buffers)(void *self);
    /* Optional (default: 0 and 1). This rank and the number of replicas. */
    int (*rank)(void *self);
    int (*world)(void *self);
    /* Optional. Release self (called by dt_strategy_free). */
    void (*free)(void *self);
    /* Optional. Called by dt_trainer_init before attach with the trainer's
     * precision policy (borrowed for the call): a strategy that reduces
     * gradients takes dt_precision_reduce_dtype(p) from it. Default: a
     * policy with a reduce dtype is refused by a strategy with an
     * allreduce_sum slot (it could not honour it). */
    dt_status (*set_precision)(void *self, const struct dt_precision_policy *p);
    /* Optional (default: the trainer runs forward, loss and backward of
     * each micro-batch on its context, `forward` above). Run them itself
     * for micro-batch fb->x (fb->y) on any contexts of its own, backward
     * from fb->loss(...) x fb->scale, and set fb->loss_value: a pipeline
     * splits the micro-batch further and runs its schedule (pipeline.h).
     * ctx (the trainer's) holds x and y; begin_micro was called. With
     * this slot the trainer's agreement (allreduce_sum, shard_sum) runs
     * even when world is 1: the strategy's ranks are more than its
     * replicas. */
    dt_status (*forward_backward)(void *self, dt_ctx *ctx, dt_model *m, struct dt_strategy_fb *fb);

    /* ---- version 4: the work a strategy owns (every "which strategy is
     * this?" the trainer used to ask is one of these slots) ---- */

    /* Optional (default: the trainer steps the optimizer itself). Called by
     * dt_trainer_init once the optimizer exists: *o says what it will run;
     * refuse (DT_ERR_UNSUPPORTED naming what does not combine) or set
     * o->steps when the strategy steps the optimizer itself in optim_step
     * (ZeRO-3 with parameter offload: unit by unit; its gradients are then
     * not in memory between steps and the trainer reads them from the
     * ranges' flats). */
    dt_status (*optim_setup)(void *self, struct dt_strategy_optim *o);
    /* Optional (default: dt_offload_optim_step(off) under NVMe offload, else
     * dt_optim_step(opt)). The optimizer step over the ranges this rank
     * owns; called only when optim_setup set steps. */
    dt_status (*optim_step)(void *self, dt_optim *opt, dt_offload_optim *off);
    /* Optional (default: the sum of g->g's squares over the ranges, summed
     * with shard_sum, else allreduce_sum, when g->sharded and g->agree; for a
     * tensor-parallel model (tp.h) the slices' squares are also summed over
     * the tensor-parallel group and a whole tensor counted once). The
     * squared global gradient norm, bitwise the same on every rank. */
    dt_status (*grad_sqnorm)(void *self, const struct dt_strategy_grads *g, double *sq);
    /* Optional (default: a tensor-parallel model's group takes the MAX;
     * else nothing). The step's flags (overflow, non-finite) after the sum
     * over the replicas: any rank's flag to every rank that holds a part
     * of the same replica. */
    dt_status (*agree_flags)(void *self, double *flags, int n);
    /* Optional (default: false). Whether the trainer is the only reader of
     * the gradients between backward and the step (no bucket, shard or
     * stage reads them during backward: "none"): it may then zero them by
     * marks (dt_model_zero_grad_lazy) when it steps the whole flats itself
     * and the model has no tensor parallelism. */
    bool (*grads_private)(void *self);
    /* Optional (default: *n = 0, no map). Which elements of which model
     * entries this rank's optimizer ranges hold (ZeRO's shard pieces):
     * called with out NULL for the count, then with cap >= *n. A strategy
     * with this slot saves checkpoints sharded. */
    dt_status (*pieces)(void *self, dt_zero_piece *out, size_t cap, size_t *n);
    /* Optional (default: a replicated layout, all NULL and false). How a
     * checkpoint is saved under this strategy (struct dt_strategy_ckpt). */
    dt_status (*ckpt_layout)(void *self, struct dt_strategy_ckpt *out);
    /* Optional (default: nothing). After a checkpoint load, in which every
     * rank loaded the ranges it steps: complete the rest (ZeRO: gather the
     * whole units; a pipeline: the replicas' shares and shared parameters). */
    dt_status (*after_load)(void *self);
    /* Optional (default: dt_model_forward on ctx). Evaluation's forward
     * (no grad) of x; collective when the model is split over ranks: *out
     * the model's output where it is computed, NULL on the other ranks. */
    dt_status (*eval_forward)(void *self, dt_ctx *ctx, dt_model *m, dt_tensor *x, dt_tensor **out);
    /* Optional (default: nothing to share). n values computed where the
     * output is (an evaluation's sums, a generated token) to every rank of
     * the replica (collective). failed < 0: this rank's evaluation failed
     * (dt_last_error() says why): instead make the other ranks' waits fail
     * with its message; returns failed. */
    dt_status (*eval_share)(void *self, double *v, int n, dt_status failed);
    /* Optional (default: NULL). A compression hook whose state checkpoints
     * carry (PowerSGD's step, seeds, warm-start Qs and error memories), the
     * group it runs over and the reducer whose buckets it compresses, after
     * attach. */
    dt_powersgd *(*compress_state)(void *self, dt_pg **group, dt_reducer **buckets);
} dt_strategy_ops;

/* What dt_trainer_init tells a strategy's optim_setup slot. */
typedef struct dt_strategy_optim {
    dt_optim_kind kind;   /* the optimizer */
    bool mixed;           /* low-precision parameters or gradients (fp32 masters) */
    bool scaled;          /* loss scaling */
    bool steps;           /* out: the strategy steps the optimizer (optim_step); default false */
} dt_strategy_optim;

/* What the trainer hands a strategy's grad_sqnorm slot. */
typedef struct dt_strategy_grads {
    dt_model *m;                 /* the model */
    const dt_optim_range *rg;    /* the ranges the optimizer steps */
    size_t nrg;
    float *const *g;             /* g[k]: range k's f32 gradients, unscaled (n[k] of them) */
    const size_t *n;
    bool sharded;                /* the ranges are this rank's share (owned_range or optim_ranges) */
    bool agree;                  /* the ranks agree each step (more than one rank) */
} dt_strategy_grads;

/* How a checkpoint is saved under a strategy (its ckpt_layout slot). */
typedef struct dt_strategy_ckpt {
    dt_pg *save_group;    /* sharded state: every rank of it saves its pieces collectively
                             (ZeRO's group, a pipeline's world); NULL: replicated, rank 0 writes */
    bool tp_shares;       /* with tensor parallelism too, every rank saves its share over
                             save_group (a pipeline); false: the tensor-parallel group of
                             data-parallel rank 0 saves */
    dt_pg *share_group;   /* under tensor parallelism: the group whose ranks' optimizer shares
                             complete each other before the save (ZeRO-1's); NULL: none */
} dt_strategy_ckpt;

/* A strategy from a vtable (for your own strategy). ops is copied; self is
 * owned by the strategy when ops->free is set. */
DT_API dt_status dt_strategy_init(const dt_strategy_ops *ops, void *self, dt_strategy **out);
/* One process, no communication. */
DT_API dt_status dt_strategy_none_init(dt_strategy **out);
/* DistributedDataParallel over pg (borrowed; must outlive the strategy);
 * p NULL: dt_ddp_params_default(). The dt_ddp is created at attach. */
DT_API dt_status dt_strategy_ddp_init(dt_pg *pg, const dt_ddp_params *p, dt_strategy **out);
/* ZeRO over pg (borrowed): p->stage 1, 2 or 3 (parallel.h, dt_zero_params;
 * p NULL: the defaults, stage 3). The dt_zero is created at attach, where
 * the model is sharded (build it meta for stage 3 so that no rank holds it
 * whole; set p->init_seed to the build's seed). p->wrap_module_type is
 * copied. A tensor-parallel model (tp.h) takes stage 1 only, pg its
 * data-parallel group (dt_trainer_init refuses stages 2 and 3). */
DT_API dt_status dt_strategy_zero_init(dt_pg *pg, const dt_zero_params *p, dt_strategy **out);
/* FSDP's sharding strategies: NO_SHARD = the "ddp" strategy (default DDP
 * params), SHARD_GRAD_OP = ZeRO stage 2, FULL_SHARD = stage 3, with the
 * other fields of p (NULL: defaults). HYBRID_SHARD = stage 3 sharded over
 * p->hybrid_shard_size ranks (0: the ranks on this machine,
 * dt_pg_local_size) and replicated across such groups. */
DT_API dt_status dt_strategy_fsdp_init(dt_pg *pg, dt_fsdp_sharding sharding, const dt_zero_params *p,
                                       dt_strategy **out);
/* The dt_zero of a "zero" strategy after attach, else NULL. Borrowed. */
DT_API dt_zero *dt_strategy_zero(const dt_strategy *s);
/* Free a strategy that no trainer owns. NULL is a no-op. */
DT_API void dt_strategy_free(dt_strategy *s);
DT_API const char *dt_strategy_name(const dt_strategy *s);
/* The DDP handle of a "ddp" strategy after attach (stats, buckets, comm
 * hooks), else NULL. Borrowed. */
DT_API dt_ddp *dt_strategy_ddp(const dt_strategy *s);
/* The model a strategy is attached to (by dt_trainer_init), else NULL. Borrowed. */
DT_API dt_model *dt_strategy_model(const dt_strategy *s);
/* Evaluation's forward (no grad) of x through an attached strategy: its
 * eval_forward slot (a pipeline: through the stages, collective over the
 * pipeline), else dt_model_forward on ctx. *out: the model's output on the
 * ranks that compute it, NULL on the others. DT_ERR_STATE before attach. */
DT_API dt_status dt_strategy_eval_forward(dt_strategy *s, dt_ctx *ctx, dt_tensor *x, dt_tensor **out);
/* n values from the ranks that computed the output (an evaluation's sums, a
 * generated token) to every rank of the replica (eval_share; default:
 * nothing to share). failed < 0: this rank failed (dt_last_error() says
 * why): make the other ranks' waits fail with its message; returns failed.
 * DT_ERR_STATE before attach. */
DT_API dt_status dt_strategy_eval_share(dt_strategy *s, double *v, int n, dt_status failed);

/* ---- the trainer ---------------------------------------------------------------- */

typedef struct dt_trainer dt_trainer;

typedef enum dt_trainer_loss {
    DT_TRAINER_LOSS_CROSS_ENTROPY = 0, /* dt_cross_entropy(output, integer labels) */
    DT_TRAINER_LOSS_MSE,               /* dt_mse_loss(output, target) */
    DT_TRAINER_LOSS_MEAN,              /* dt_mean(output); no target */
} dt_trainer_loss;

/* A custom loss: a scalar tensor on ctx, or NULL with the error set. */
typedef dt_tensor *(*dt_trainer_loss_fn)(void *ud, dt_ctx *ctx, dt_tensor *output, dt_tensor *target);

/* What the trainer hands a strategy's forward_backward slot. */
typedef struct dt_strategy_fb {
    dt_tensor *x;              /* the micro-batch's input (on the trainer's context) */
    dt_tensor *y;              /* its target, NULL when the loss takes none */
    dt_trainer_loss_fn loss;   /* the trainer's loss, on whatever context it is given */
    void *loss_ud;             /* its first argument */
    float scale;               /* backward runs from loss x scale (1/grad_accum, times the loss
                                  scale when scaling) */
    double loss_value;         /* out: the micro-batch's (unscaled) loss on a rank that computes
                                  it, 0 on the others (the trainer's agreement sums over the
                                  ranks and divides by the replicas, world) */
} dt_strategy_fb;

typedef struct dt_trainer_params {
    dt_optim_kind optimizer;  /* which of the five below; default DT_OPTIM_SGD */
    dt_sgd_params sgd;        /* default dt_sgd_params_default() */
    dt_adam_params adam;      /* default dt_adam_params_default() */
    dt_adam_params adamw;     /* default dt_adamw_params_default() */
    dt_lamb_params lamb;      /* default dt_lamb_params_default() */
    dt_lion_params lion;      /* default dt_lion_params_default() */
    bool no_decay_1d;         /* no weight decay on 1-d tensors (biases, norms); default false
                                 (PyTorch's optimizers decay every parameter) */
    dt_sched_params sched;    /* the learning rate of optimizer step s is dt_sched_lr(&sched, s)
                                 with sched.base_lr replaced by the optimizer's lr; default
                                 constant, no warm-up. dt_trainer_init refuses unknown kinds,
                                 a negative or non-finite min_lr or gamma, negative steps */
    int64_t grad_accum;       /* micro-batches per optimizer step; each micro-batch loss is
                                 divided by it; default 1 */
    double clip_grad_norm;    /* clip the global gradient L2 norm to this; <= 0: off; default 0 */
    bool measure_grad_norm;   /* report the gradient norm even without clipping (one more pass
                                 over the gradients); default false */
    dt_precision_policy precision; /* dtypes of parameters, reduction, buffers; default
                                 dt_precision_policy_default() (as the model holds them) */
    float loss_scale;         /* a static loss scale: the loss is multiplied by this before backward
                                 and the gradients divided by it after the reduction; a step whose
                                 gradients are not finite on any rank is skipped (all ranks agree);
                                 default 1 (off) */
    bool use_scaler;          /* loss scaling by `scaler` (fp16): dynamic with scaler.loss_scale 0;
                                 loss_scale must stay 1; default false */
    dt_loss_scaler_params scaler; /* the loss scaler's rule and settings (optim.h); default
                                 dt_loss_scaler_params_default() (DeepSpeed's fp16 defaults) */
    dt_trainer_loss loss;     /* default DT_TRAINER_LOSS_CROSS_ENTROPY */
    dt_trainer_loss_fn loss_fn; /* custom loss, overrides `loss` when set (a zoo model's:
                                   dt_model_desc_loss_fn with loss_ud = &desc, models.h);
                                   default NULL */
    void *loss_ud;            /* passed to loss_fn; default NULL */
    dt_offload_params offload; /* optimizer-state offload (offload.h): NVME keeps the state of the
                                  owned range in files and steps it sub-group by sub-group
                                  (sgd/adam/adamw; bit-identical results); CPU changes nothing and
                                  logs so; default dt_offload_params_default() (none). Parameter
                                  offload is the zero strategy's (dt_zero_params.offload_param):
                                  the trainer then steps through dt_zero_step, unit by unit */
    dt_trace_params trace;    /* the timeline (trace.h): with trace.dir set and no tracer open,
                                 the trainer opens one at init and writes DIR/rank-N.json at
                                 free; with a tracer open (the caller's), it records into it.
                                 Default dt_trace_params_default() (off) */
    dt_monitor *monitor;      /* scalars for TensorBoard / CSV (monitor.h), borrowed: after every
                                 optimizer step Train/Samples/train_loss, Train/Samples/lr (the next
                                 step's), Train/Samples/loss_scale (with loss scaling: the scale after the
                                 step's update), after each
                                 dt_trainer_evaluate Train/Samples/eval_loss, each at the samples
                                 trained over all replicas (the position's samples, kept in
                                 checkpoints: DeepSpeed's global_samples). Give it on one rank
                                 (dt_monitor_open_config); default NULL (none) */
    bool wall_clock_breakdown; /* DeepSpeed's key: with a monitor, also the step's times in ms,
                                  Train/Samples/elapsed_time_ms_forward, _backward (backward with
                                  the wait for its reductions), _backward_inner (the backward
                                  passes), _backward_allreduce (the wait), _step (the optimizer);
                                  default false */
    int same_batch;           /* ranks of the strategy's group that train on one batch together
                                 (context parallelism: the cp ranks of a replica split its
                                 sequences, plan.h dt_plan_cp); the metrics count its samples
                                 once; default 1 */
} dt_trainer_params;

/* Defaults as listed above. */
DT_API dt_trainer_params dt_trainer_params_default(void);
/* The learning rate of the optimizer p names (p->sgd.lr, p->adam.lr, ... as p->optimizer says; 0 for an
 * unknown kind). */
DT_API double dt_trainer_params_lr(const dt_trainer_params *p);
/* The fields of tp that a DeepSpeed-style config (config.h) sets, over
 * what tp holds: optimizer (type and params; DeepSpeed's "Adam" is AdamW
 * unless params.adam_w_mode is false, and a type from the config starts
 * from DeepSpeed's defaults: lr 1e-3, eps 1e-8, weight_decay 0), scheduler
 * (WarmupLR with linear warm-up -> constant with warm-up at warmup_max_lr;
 * dtrain's constant/step/cosine), gradient_clipping,
 * gradient_accumulation_steps (grad_accum; 1 with more than one pipeline
 * stage, where it is the pipeline's micro-batches: dt_config_pipe_params),
 * fp16/bf16 (precision and the loss scaler),
 * communication_data_type (reduce dtype) and the optimizer offload. Keys
 * the config does not set leave tp's fields alone. DT_ERR_INVALID_ARG /
 * DT_ERR_UNSUPPORTED name the key that cannot be honoured. */
DT_API dt_status dt_trainer_params_apply_config(const dt_config *c, dt_trainer_params *tp);

/* One micro-batch: input x and target y (y may be NULL when the loss takes
 * none), each a contiguous array with its dtype and shape; dim 0 of x is the
 * number of samples. Borrowed for the call. */
typedef struct dt_trainer_batch {
    void *x;
    dt_dtype x_dtype;
    int x_ndim;
    int64_t x_shape[DT_MAX_DIMS];
    void *y;
    dt_dtype y_dtype;
    int y_ndim;
    int64_t y_shape[DT_MAX_DIMS];
} dt_trainer_batch;

/* A batch from arrays and shapes (ndim <= DT_MAX_DIMS; shapes copied). An
 * ndim outside [0, DT_MAX_DIMS] is kept as given (at most DT_MAX_DIMS
 * dims copied) and dt_trainer_step refuses the batch. */
DT_API dt_trainer_batch dt_trainer_batch_make(void *x, dt_dtype x_dtype, int x_ndim, const int64_t *x_shape,
                                              void *y, dt_dtype y_dtype, int y_ndim, const int64_t *y_shape);

/* What a step reports. Loss values are means over the replicas (identical
 * on every rank); times are this rank's. */
typedef struct dt_trainer_metrics {
    int64_t step;          /* optimizer steps taken before this one (0 for the first) */
    double loss;           /* mean of the micro-batch losses (unscaled, before 1/grad_accum) */
    const double *micro_loss; /* each micro-batch's loss (nmicro of them); borrowed until the next step */
    int nmicro;            /* micro-batches in this step */
    double lr;             /* learning rate used */
    double grad_norm;      /* global gradient L2 norm before clipping (NAN unless clipping or
                              measure_grad_norm) */
    int64_t samples;       /* samples in this step over all replicas */
    bool skipped;          /* non-finite gradients under loss scaling on some rank: no update of
                              parameters, optimizer state, step count or schedule */
    double loss_scale;     /* the loss scale this step ran with (1 without scaling) */
    int64_t skipped_steps; /* skipped steps so far, this one included (0 without scaling) */
    bool stop;             /* some rank asked to stop (dt_trainer_request_stop): all stop here */
    double forward_s, backward_s, wait_s, optim_s, step_s; /* this rank's seconds */
    bool grads_checked_in_backward; /* the non-finite check of the gradients (no loss scaling) ran
                                       in backward, on each gradient as it became final (while in
                                       cache), not as a read pass over the flats after it: where
                                       the trainer alone reads the gradients and steps whole flats */
} dt_trainer_metrics;

/* Build a trainer for model m with strategy s (owned from now on, also on
 * failure; attached here: collective under a parallel strategy). p NULL:
 * defaults. The optimizer steps one range per dtype of the model's
 * parameters: f32 ones in place, bf16/f16 ones through fp32 master weights
 * (the model's flat is refreshed after each step). Errors: bad parameters
 * (DT_ERR_INVALID_ARG), a policy the model or strategy cannot honour
 * (DT_ERR_UNSUPPORTED), a model another live trainer trains (DT_ERR_STATE:
 * one trainer a model; free the other first), the strategy's attach errors. */
DT_API dt_status dt_trainer_init(dt_model *m, dt_strategy *s, const dt_trainer_params *p, dt_trainer **out);
/* Free the trainer, its optimizer, context and strategy. NULL is a no-op. */
DT_API void dt_trainer_free(dt_trainer *tr);

/* One optimizer step over n >= 1 micro-batches (gradient accumulation over
 * them, whatever grad_accum says). Collective under a parallel strategy:
 * every rank calls it with the same n. *out (may be NULL) gets the metrics.
 * A non-finite mean loss without loss scaling is an error naming the step
 * (the training diverged); so is a dynamic scale stuck at min_loss_scale
 * (DT_ERR_RANGE from the scaler: the step is skipped, *out not filled). */
DT_API dt_status dt_trainer_step(dt_trainer *tr, const dt_trainer_batch *micro, int n, dt_trainer_metrics *out);

/* Prepare for the steps (a warm-up that is not a step, like a compiled
 * framework's first call): one forward and backward on micro-batch b that sizes and
 * commits the step's memory (the context's arena, page-faulted once) and
 * creates the matmul/convolution kernels, so that the first
 * dt_trainer_step runs as fast as the later ones (no page fault, no kernel
 * created). It leaves no trace: parameters, optimizer state, step count,
 * schedule, the model's buffers (running statistics) and random streams
 * (dropout) are as before, the gradients zero. Call it with a batch of the
 * shapes the steps will use (another shape's first step pays for itself).
 * It costs about one step's forward and backward. Local: no communication
 * (DDP: the backward runs without reduction), so it may be called on some
 * ranks only. Where the strategy keeps sharded, offloaded or pipelined
 * gradients (ZeRO, pipeline, offload, tensor parallelism) it does nothing
 * and *ran (may be NULL) says false; true when it ran. */
DT_API dt_status dt_trainer_prepare(dt_trainer *tr, const dt_trainer_batch *b, bool *ran);

/* Ask every rank to stop: the next step's agreement reports stop = true on
 * all ranks (dt_trainer_epoch returns after that step). Only sets a flag:
 * safe to call from a signal handler. */
DT_API void dt_trainer_request_stop(dt_trainer *tr);

/* Called after every optimizer step of dt_trainer_epoch. A negative return
 * ends the epoch with that status. */
typedef dt_status (*dt_trainer_callback)(void *ud, dt_trainer *tr, const dt_trainer_metrics *m);

typedef struct dt_trainer_epoch_result {
    int64_t steps;     /* optimizer steps */
    int64_t batches;   /* micro-batches */
    int64_t samples;   /* over all replicas */
    double loss;       /* mean of the micro-batch losses */
    bool stopped;      /* ended early by an agreed stop request */
} dt_trainer_epoch_result;

/* One epoch of loader ld (its dataset's item shapes in info): batches are
 * grouped into steps of grad_accum micro-batches (the epoch's last step may
 * have fewer), cb (may be NULL) is called after each step. Loader errors are
 * returned with their status. out may be NULL. */
DT_API dt_status dt_trainer_epoch(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info, int64_t epoch,
                                  dt_trainer_callback cb, void *ud, dt_trainer_epoch_result *out);

/* `epochs` epochs (numbered from 0) of dt_trainer_epoch; stops early on an
 * agreed stop. out (may be NULL) gets the last epoch's result. */
DT_API dt_status dt_trainer_fit(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info, int64_t epochs,
                                dt_trainer_callback cb, void *ud, dt_trainer_epoch_result *out);

typedef struct dt_trainer_eval_result {
    double loss;       /* mean loss over every item of every rank */
    double accuracy;   /* fraction of argmax(output) == label for a [N, C] output and integer
                          labels, else NAN */
    int64_t items;     /* items evaluated over all ranks */
} dt_trainer_eval_result;

/* Evaluate the model (eval mode, no gradients) on loader ld: each rank its
 * own items (e.g. a dt_eval_shard of the test set), sums combined over the
 * replicas after the strategy synchronised the buffers (collective). */
DT_API dt_status dt_trainer_evaluate(dt_trainer *tr, dt_loader *ld, const dt_dataset_info *info,
                                     dt_trainer_eval_result *out);

/* Accessors (borrowed). */
DT_API dt_model *dt_trainer_model(const dt_trainer *tr);
DT_API dt_optim *dt_trainer_optim(const dt_trainer *tr);
/* The offload driver when params.offload.device is NVME, else NULL. Its
 * optimizer (dt_trainer_optim) then has no ranges: the state is in files. */
DT_API dt_offload_optim *dt_trainer_offload(const dt_trainer *tr);
DT_API dt_strategy *dt_trainer_strategy(const dt_trainer *tr);
/* The context the steps run on (reset after each micro-batch). */
DT_API dt_ctx *dt_trainer_ctx(const dt_trainer *tr);
/* Optimizer steps taken so far; the learning rate the next step will use. */
DT_API int64_t dt_trainer_steps(const dt_trainer *tr);
DT_API double dt_trainer_next_lr(const dt_trainer *tr);
DT_API int dt_trainer_rank(const dt_trainer *tr);
DT_API int dt_trainer_world(const dt_trainer *tr);
/* Model-state bytes this rank holds, the ZeRO memory model's terms
 * (parameters, gradients, optimizer states, fp32 master weights), the peak
 * of gathered parameters, and the process's peak RSS. */
typedef struct dt_trainer_memory {
    size_t param_bytes;       /* parameters held between steps */
    size_t grad_bytes;        /* gradients held between steps */
    size_t optim_bytes;       /* optimizer states (momentum, exp_avg, exp_avg_sq) */
    size_t master_bytes;      /* fp32 master weights of bf16/f16 parameters (the range this rank
                                 steps; f32 parameters are their own master: 0 for them) */
    size_t grad_f32_bytes;    /* the optimizer's f32 copies of bf16/f16 gradients (same range) */
    size_t gathered_peak;     /* peak bytes of gathered parameters / unsharded gradients beyond
                                 the above (ZeRO-2/3 units), 0 for DDP */
    size_t peak_rss;          /* the process's peak resident set (VmHWM), bytes; 0 if unknown */
    size_t frozen_bytes;      /* frozen parameters (dt_model_build_params.frozen, LoRA's base): whole
                                 on every rank, with no gradient, optimizer state or master (none of
                                 the above counts them) */
} dt_trainer_memory;
/* Without a strategy memory slot, what a precision policy implies, with P
 * the padded element count of a parameter flat: f32: params 4P, grads 4P,
 * master 0; bf16/f16: params 2P, grads 2P, master 4P, f32 grads 4P (over
 * the owned range); optimizer states 4P per state (SGD with momentum 1,
 * Adam(W)/LAMB 2). */
DT_API dt_status dt_trainer_memory_get(const dt_trainer *tr, dt_trainer_memory *out);
/* SUM of n doubles over the replicas (collective; identity with one). */
DT_API dt_status dt_trainer_allreduce_sum(dt_trainer *tr, double *v, int n);

/* One setting of a run, by name and value as text, for dt_trainer_check_same. */
typedef struct dt_trainer_field {
    const char *name;  /* "lr", "--optimizer", ... */
    const char *value; /* its value as text; NULL is "(unset)" */
} dt_trainer_field;
/* Whether every replica runs with the same settings (collective: every
 * rank passes its own values of the same n fields in the same order).
 * Ranks that disagree on the optimizer, the learning rate, the seed or
 * clipping would train apart and still end "successfully"; called once at
 * start, like the collectives' check of their arguments. One all-reduce of
 * n + 1 hashes per rank. DT_ERR_MISMATCH, the same message on every rank,
 * naming each differing field and the ranks whose value differs from rank
 * 0's (the field list itself is compared too). One replica, or a pipeline
 * strategy (not compared here): DT_OK. Settings that shape the groups or
 * the model (tensor or pipeline parallel) are best compared before the
 * trainer exists, over the world: dt_pg_check_same (comm.h). */
DT_API dt_status dt_trainer_check_same(dt_trainer *tr, const dt_trainer_field *f, int n);
/* The loss scaler (use_scaler, or a static loss_scale != 1), else NULL.
 * Borrowed; its state (dt_loss_scaler_get_state) is what a checkpoint saves. */
DT_API dt_loss_scaler *dt_trainer_loss_scaler(const dt_trainer *tr);
/* The policy's reduce dtype after inheritance (DT_DTYPE_UNSET: the grads'). */
DT_API dt_dtype dt_trainer_reduce_dtype(const dt_trainer *tr);



/* ---- exact resume ------------------------------------------------------------------ */

/* Where a run is: the optimizer steps taken and, kept by dt_trainer_epoch,
 * the data position (the epoch of the next batch and the batch within it;
 * after an epoch's last step, the next epoch at batch 0). */
typedef struct dt_trainer_position {
    int64_t step;      /* optimizer steps taken (the schedule's position) */
    int64_t epoch;     /* epoch of the next batch (0-based) */
    int64_t batch;     /* next batch within that epoch */
    int64_t batches;   /* micro-batches dt_trainer_epoch has run, all epochs */
    int64_t samples;   /* samples over all replicas, likewise */
} dt_trainer_position;
DT_API dt_trainer_position dt_trainer_get_position(const dt_trainer *tr);

/* The run state besides the tensors, as one JSON object (malloc'd into
 * *json; free with dt_trainer_run_state_free): the trainer's and the
 * optimizer's step counts (the schedule is a pure function of the step,
 * dt_sched_lr), the schedule's parameters, the data position above and the
 * epoch's batch count, the world size, the optimizer kind, grad_accum, the
 * loss scale, and the model's random-stream counters
 * (dt_model_get_rng_state; Philox streams are keyed, not stateful, and the
 * data order is a pure function of seed + epoch, so these counters are the
 * only positions). dt_trainer_save writes it beside the tensors. */
DT_API dt_status dt_trainer_run_state(const dt_trainer *tr, char **json);
DT_API void dt_trainer_run_state_free(char *json);

/* What a resume restored and what it could not keep. */
typedef struct dt_trainer_resume_info {
    int64_t step;          /* optimizer steps of the checkpoint */
    int64_t epoch, batch;  /* its data position */
    int saved_world;       /* world size that saved it */
    bool data_order_kept;  /* false: saved at another world size, so the remaining batches are
                              not those of the uninterrupted run (the epoch continues at the same
                              fraction of its batches) */
    char note[512];        /* when !data_order_kept: one line saying what was dropped */
    char path[1024];       /* dt_trainer_load: the checkpoint directory it used */
} dt_trainer_resume_info;

/* Restore a run state (dt_trainer_run_state's JSON) into tr, a trainer
 * built like the one that saved it (same model and optimizer kind; the
 * tensors are restored separately, dt_trainer_load). The next
 * dt_trainer_epoch(tr, ..., epoch) with the saved epoch starts at the saved
 * batch (dt_loader_start_epoch_at: the same remaining batches, same world
 * size); dt_trainer_fit starts at the saved epoch; an earlier epoch is
 * DT_ERR_STATE. info (may be NULL) says what was kept. Errors:
 * DT_ERR_FORMAT (malformed, naming the field), DT_ERR_UNSUPPORTED (a newer
 * version), DT_ERR_MISMATCH (another optimizer kind or model); nothing is
 * changed on error. */
DT_API dt_status dt_trainer_apply_run_state(dt_trainer *tr, const char *json, dt_trainer_resume_info *info);

/* ---- checkpoints ------------------------------------------------------------------- */

typedef struct dt_trainer_save_params {
    bool async;             /* return once rank 0 has copied the state into a staging buffer; a
                               background thread writes it while training goes on, and the next
                               save, dt_trainer_save_wait or dt_trainer_free waits for it. The
                               buffer (the size of the state) is kept for the next asynchronous
                               save and freed by dt_trainer_free.
                               Sharded state (ZeRO) is written by every rank together and
                               synchronously whatever this says; default false */
    int keep;               /* after a save, keep only the newest `keep` checkpoints in the
                               directory (0: all): the one just saved and the newest keep - 1
                               before it; one of a later step (left by a run this one resumed
                               from an older checkpoint of) is not removed; default 0 */
    const char *user_json;  /* a JSON object stored with the checkpoint as "user" (the CLI keeps
                               its model and data options there; dt_trainer_ckpt_user reads it);
                               copied; default NULL */
} dt_trainer_save_params;
DT_API dt_trainer_save_params dt_trainer_save_params_default(void);

/* Save a checkpoint of the run into dir/step-<steps, 8 digits>, a ckpt.h
 * checkpoint (index.json and its safetensors files): the parameters and
 * buffers under PyTorch's state_dict names (each in its dtype), the fp32
 * master weights of bf16/f16 parameters as "master.<param>", the optimizer
 * state as "optim.<param>.exp_avg" (exp_avg_sq, momentum_buffer: f32, the
 * parameter's shape), and as metadata the run state ("dtrain.run":
 * dt_trainer_run_state) and user_json ("dtrain.user"). A DDP run whose comm
 * hook is PowerSGD adds the hook's state (dt_powersgd_state_save): its
 * metadata "dtrain.powersgd", the Qs "powersgd.q" and every rank's error
 * memory "powersgd.error" [W, E] (gathered to rank 0), so a resume at the
 * same world size continues bit for bit; dt_trainer_load refuses another
 * world size, matrix rank or bucket layout with DT_ERR_MISMATCH naming it. A
 * checkpoint is complete or absent (dt_ckpt_save renames it into place at
 * the end).
 * Collective: every rank calls it after the same step. With replicated
 * state (DDP, one process) rank 0 writes and the others wait without ever
 * sitting in one collective for the length of the write (the wait is a loop
 * of short agreements), so a slow disk never runs into the collective
 * timeout; a synchronous save writes from the trainer's own memory (rank 0
 * needs no second copy of the state), an asynchronous one from its staging
 * copy. With sharded state (ZeRO/FSDP) every rank writes the ranges it
 * owns (its fp32 masters and optimizer state included) in one collective
 * dt_ckpt_save over all ranks; the index says which file holds which range
 * (a slow disk on any rank does not run into DT_COMM_TIMEOUT: the ranks
 * poll each other while they write). dir is created when
 * missing (its parent must exist) and locked for this trainer
 * (dt_trainer_save_prepare). p NULL: defaults. Errors (on every
 * rank): I/O naming the file, DT_ERR_UNSUPPORTED under NVMe offload, an
 * earlier asynchronous save's failure. ZeRO-1 over a tensor-parallel model
 * (tp.h) gathers the data-parallel shares first and writes what DDP
 * writes. */
DT_API dt_status dt_trainer_save(dt_trainer *tr, const char *dir, const dt_trainer_save_params *p);
/* Take the save directory before training (collective): the rank that
 * writes and prunes it creates it when missing (its parent must exist) and
 * locks it (dt_ckpt_dir_lock, ckpt.h) for the trainer's life, so that a
 * directory that cannot be used, or one another job saves into, fails now
 * rather than at the first save, and two jobs never delete each other's
 * checkpoints (stale temporaries and --keep pruning touch only the
 * owner's). dt_trainer_save does the same at its first save into a
 * directory when this was not called. Every rank returns the owner's
 * status: DT_ERR_STATE (held by another job, naming it and the holder's pid
 * and host), DT_ERR_INVALID_ARG (dir is a checkpoint itself: it holds
 * index.json), DT_ERR_IO (missing parent, not a directory, a symlink,
 * read-only), naming the directory. */
DT_API dt_status dt_trainer_save_prepare(dt_trainer *tr, const char *dir);
/* Release the save directory this rank took (dt_trainer_save_prepare or a
 * save) as dt_ckpt_dir_lock_abandon does: for a run that fails before its
 * first checkpoint, a directory it created goes again (when still empty)
 * and one that existed is left as it was. Not collective; no-op without a
 * directory taken (and on NULL); dt_trainer_free after it as usual. */
DT_API void dt_trainer_save_abandon(dt_trainer *tr);
/* Wait for an asynchronous save (collective); DT_OK when none is in flight. */
DT_API dt_status dt_trainer_save_wait(dt_trainer *tr);
/* The newest complete checkpoint in dir (a step-N directory holding
 * index.json) into out ("" when there is none). DT_ERR_IO when dir cannot
 * be read. */
DT_API dt_status dt_trainer_ckpt_latest(const char *dir, char *out, size_t n);
/* The newest complete checkpoint in dir whose step is below `below` into
 * out ("" and *step -1 when there is none; step may be NULL): the next one
 * to try when a newer one turns out damaged. DT_ERR_IO when dir cannot be
 * read. */
DT_API dt_status dt_trainer_ckpt_before(const char *dir, int64_t below, char *out, size_t n, int64_t *step);
/* Resume: load a checkpoint into tr, a trainer built like the saving one
 * (same model; same optimizer kind). path is one checkpoint or a save
 * directory (its newest complete checkpoint is used). Verifies every file's
 * checksum (CRC-32C, or CRC-32 in older checkpoints) in the pass that reads
 * it (a damaged file fails the load after the tensors were read: the
 * trainer's state is then unspecified), checks every tensor's name and shape
 * against the model
 * (DT_ERR_NOT_FOUND / DT_ERR_SHAPE naming it; a non-float saved dtype is
 * DT_ERR_DTYPE; another optimizer kind is DT_ERR_MISMATCH), then restores
 * parameters, buffers, optimizer state and the run state
 * (dt_trainer_apply_run_state: the data position, the schedule, the random
 * streams). dtype rule: a parameter's f32 value is the checkpoint's fp32
 * master ("master.<param>") when it has one, else the saved parameter
 * widened to f32; a bf16/f16 parameter here keeps that value as its master
 * and rounds it (to nearest even) as its weight. So bf16 -> f32 -> bf16
 * round-trips exactly, and an f32 checkpoint starts a bf16 run. Collective: every rank reads
 * the files itself (across machines, the directory must be on a shared file
 * system) and all agree on the outcome. At another world size the weights
 * and optimizer state load and info->data_order_kept is false (with a note
 * saying what is not kept). On error the trainer's state is unspecified:
 * do not train on. info (may be NULL). */
DT_API dt_status dt_trainer_load(dt_trainer *tr, const char *path, dt_trainer_resume_info *info);
/* Load the model's parameters and buffers only, from a safetensors file
 * with PyTorch's state_dict names (one written by PyTorch / Hugging Face),
 * or from a checkpoint (a step-N directory or a save directory; CRC-checked):
 * every tensor of the model must be there with its shape, in f32, bf16 or
 * f16 (converted by dt_trainer_load's dtype rule; extra tensors, the
 * optimizer state, are ignored); fp32 masters are set too. A parameter
 * missing under its own name is taken under the other spellings files
 * written elsewhere use: the name of a parameter tied to it (safetensors'
 * save_model keeps "lm_head.weight" and drops the tied
 * "transformer.wte.weight") and either name without the base-model prefix
 * "transformer." (a Hugging Face base model's file). LoRA adapters
 * (dt_model_build_params.lora) the file lacks keep their initial values
 * (the base model's weights load into a LoRA model). Any strategy
 * (ZeRO: each rank reads its ranges). Collective like dt_trainer_load. */
DT_API dt_status dt_trainer_load_weights(dt_trainer *tr, const char *file);
/* Load the LoRA adapters of directory dir, as Hugging Face PEFT's
 * save_pretrained writes them (dir/adapter_model.safetensors, keys
 * "base_model.model.<layer>.lora_A.weight" / ".lora_B.weight", DoRA's
 * ".lora_magnitude_vector", the modules to save's "base_model.model." +
 * their names), into the adapters of tr's model (built with
 * dt_model_build_params.lora: read the settings with
 * dt_lora_peft_config_read, ckpt.h). Only the adapters (and the modules to
 * save) change; every one of the model must be in the file
 * (DT_ERR_NOT_FOUND naming the key) and every key of the file must be one
 * of them (DT_ERR_NOT_FOUND / DT_ERR_FORMAT naming the file and the key;
 * a weight the model ties to another must hold its values:
 * DT_ERR_MISMATCH), each in
 * its shape (DT_ERR_SHAPE) and a float dtype. Adapters of Gemma 3's
 * image-text model load onto its language model (the keys named as the
 * text model's, the vision tower's and projector's left out, as
 * dt_lora_peft_config_read says; the messages name the text model's keys).
 * Any strategy (ZeRO: each rank reads its ranges). Collective like
 * dt_trainer_load. */
DT_API dt_status dt_trainer_load_peft(dt_trainer *tr, const char *dir);
/* The "user" object (user_json) saved with the checkpoint at path (a checkpoint or a
 * save directory), as JSON in *json (free with dt_trainer_run_state_free).
 * DT_ERR_FORMAT when it has none. */
DT_API dt_status dt_trainer_ckpt_user(const char *path, char **json);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TRAIN_H */
