/* dtrain/parallel.h — data parallelism: DDP, SyncBatchNorm, metrics.
 *
 * Overview
 * --------
 * DDP (PyTorch's DistributedDataParallel semantics) keeps one
 * replica of a model per rank and averages the gradients after every
 * backward pass, so every rank takes the same optimizer step.
 *
 *   - dt_ddp_init() checks that every rank has the same parameter and buffer
 *     names, dtypes and shapes (an error naming the first difference), then
 *     broadcasts the parameters and buffers from rank 0. It moves the model's
 *     flat gradient buffer into group-allocated memory (dt_pg_alloc), which
 *     the shm backend reduces without copying.
 *   - The gradient buffer is split into buckets: byte ranges of whole
 *     parameters in model order, closed as soon as they hold >= 1 MiB (the
 *     first bucket) or >= bucket_cap_mb MiB (the others; a bucket can exceed
 *     the cap by one tensor), then REVERSED: bucket 0 holds the last
 *     parameters, whose gradients are ready first in backward.
 *   - During backward, a grad-ready hook counts arrivals per bucket; when a
 *     bucket's last gradient lands, its all-reduce (average) is posted at
 *     once, so communication overlaps the rest of backward. Buckets are
 *     posted strictly in bucket-index order on every rank: a bucket that
 *     completes early waits until the buckets before it were posted.
 *   - dt_ddp_wait() (call it before the optimizer step) waits only for what
 *     is still outstanding. The gradient buffer then holds the average over
 *     ranks of the local gradients.
 *
 * A step with DDP
 * ---------------
 *     dt_pg *pg;       dt_pg_init(NULL, &pg);
 *     dt_model *m;  dt_model_desc d;
 *     dt_model_create("convnet", seed, NULL, &m, &d);       // models.h
 *     dt_ddp *ddp;
 *     dt_ddp_params dp = dt_ddp_params_default();
 *     if (dt_ddp_init(pg, m, &dp, &ddp) < 0) fail(dt_last_error());
 *     for (step...) {
 *         dt_model_zero_grad(m);
 *         dt_tensor *out = dt_ddp_forward(ctx, ddp, x);      // not dt_model_forward
 *         dt_tensor *loss = dt_model_desc_loss(ctx, &d, out, y);
 *         if (dt_backward(ctx, loss) < 0 || dt_ddp_wait(ddp) < 0) fail(dt_last_error());
 *         dt_optim_step(opt);     // ranges over the model's flats follow DDP's grads
 *         dt_ctx_reset(ctx);
 *     }
 *     dt_ddp_free(ddp);   // before dt_model_free and dt_pg_free
 *
 * Gradient accumulation: dt_ddp_set_no_sync(ddp, true) for the first k-1
 * micro-batches (gradients accumulate locally, nothing is communicated),
 * false for the last one, whose backward reduces the accumulated sum
 * (scale each micro-batch loss by 1/k to average).
 *
 * Unused parameters: with find_unused_parameters off (the default), a
 * parameter that gets no gradient in a synchronised backward makes that
 * backward fail with an error naming the parameters, instead of a hang.
 * With it on, such parameters are marked ready when backward ends (their
 * slots keep what the buffer holds, zero after zero_grad), every bucket is
 * still reduced, and a bitmap of the parameters used on any rank is
 * all-reduced (dt_ddp_param_used).
 *
 * Rules: dt_ddp_forward records a tape mark before the model's forward;
 * backward ends the iteration when it reaches that mark. Use one dt_ctx per
 * step and reset it between steps. Under no-grad (evaluation) dt_ddp_forward
 * is a plain forward with no communication. Every rank must run the same
 * sequence of synchronised backwards (the collectives must match).
 * Bucket membership and order are fixed at construction and identical on
 * every rank; unlike PyTorch they are not rebuilt after the first iteration
 * (the flat buffer fixes the layout in model order, which for feed-forward
 * models is the reverse of the ready order anyway).
 *
 * SyncBatchNorm (PyTorch's torch.nn.SyncBatchNorm): dt_sync_batch_norm() is batch norm whose
 * training statistics come from the whole group (all-gather of per-rank
 * [mean, M2, count], combined by count; the running variance is unbiased over
 * the global count) and whose backward all-reduces [sum_dy, sum_dy_xmu].
 * dt_syncbn_convert() switches every BatchNorm2d of a model to it.
 *
 * Metrics: dt_metrics_allreduce() sums (or maxes...) a few doubles over the
 * group; dt_eval_shard() splits an evaluation set into contiguous per-rank
 * ranges so that summed metrics equal the single-process ones exactly.
 */
#ifndef DTRAIN_PARALLEL_H
#define DTRAIN_PARALLEL_H

#include "dtrain/autograd.h"
#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DDP ------------------------------------------------------------------- */

typedef struct dt_ddp dt_ddp;

typedef struct dt_ddp_params {
    double bucket_cap_mb;        /* bucket size limit in MiB (bytes = mb * 2^20); default 25 */
    double first_bucket_mb;      /* limit of the first bucket in model order (reduced last); default 1 */
    bool find_unused_parameters; /* tolerate parameters without gradient; default false */
    bool broadcast_buffers;      /* re-broadcast buffers from rank 0 at every synchronised
                                    forward; default true */
    bool predivide;              /* true: scale each bucket by 1/W, then all-reduce SUM
                                    (PyTorch's rounding); false: all-reduce AVG; default false */
} dt_ddp_params;

/* Defaults as listed above. */
DT_API dt_ddp_params dt_ddp_params_default(void);

/* Wrap model m for data parallelism over pg (collective: every rank calls it
 * with the same architecture). p may be NULL for defaults. Checks names and
 * shapes across ranks (DT_ERR_MISMATCH naming the first difference),
 * broadcasts parameters and buffers from rank 0, moves the gradient buffer
 * into dt_pg_alloc memory (its contents are zeroed) and installs the hooks.
 * pg and m are borrowed and must outlive the handle. */
DT_API dt_status dt_ddp_init(dt_pg *pg, dt_model *m, const dt_ddp_params *p, dt_ddp **out);

/* Wait for outstanding reductions, give the model a private gradient buffer
 * back (zeroed), remove the hooks, release everything. NULL is a no-op. */
DT_API void dt_ddp_free(dt_ddp *d);

/* The model's forward with DDP's bookkeeping: in grad mode with sync on,
 * broadcasts buffers (if enabled), starts an iteration and records the tape
 * mark that ends it. Returns the output (a temporary) or NULL with the error. */
DT_API dt_tensor *dt_ddp_forward(dt_ctx *ctx, dt_ddp *d, dt_tensor *x);

/* Wait for every bucket all-reduce still outstanding (and the used-bitmap
 * with find_unused_parameters). Call after dt_backward, before the optimizer
 * step. Returns DT_OK (also when nothing was reduced, e.g. under no_sync) or
 * the error of a failed collective (DT_ERR_PEER_FAILED naming the dead rank,
 * DT_ERR_TIMEOUT, ...). */
DT_API dt_status dt_ddp_wait(dt_ddp *d);

/* Broadcast the model's buffers (batch-norm running statistics) from rank 0
 * now (collective). Each rank's last training forward updated its own
 * copy; call this before a sharded evaluation so that every rank evaluates
 * rank 0's model. */
DT_API dt_status dt_ddp_sync_buffers(dt_ddp *d);

/* no_sync: while on, backward accumulates gradients locally and nothing is
 * communicated; the first synchronised backward after it reduces the sum. */
DT_API void dt_ddp_set_no_sync(dt_ddp *d, bool on);
DT_API bool dt_ddp_no_sync(const dt_ddp *d);

DT_API dt_model *dt_ddp_model(const dt_ddp *d);
DT_API dt_pg *dt_ddp_pg(const dt_ddp *d);

/* With find_unused_parameters: whether parameter entry `index` (an index of
 * dt_model_entry) got a gradient on any rank in the last reduced iteration.
 * Without it, true for every parameter. False for buffers and bad indices. */
DT_API bool dt_ddp_param_used(const dt_ddp *d, size_t index);

/* ---- introspection: buckets, overlap counters, trace ------------------------ */

DT_API int dt_ddp_num_buckets(const dt_ddp *d);

typedef struct dt_ddp_bucket_info {
    size_t offset;        /* first element in the flat gradient buffer */
    size_t numel;         /* elements in the range (parameters + padding between them) */
    size_t bytes;         /* sum of the parameters' sizes (what the cap counts) */
    int nparams;          /* parameters in the bucket */
    size_t first_entry;   /* model entry index of its first parameter in model order */
    size_t last_entry;    /* ... and of its last */
    /* trace of the last synchronised iteration, seconds since its forward began
     * (-1 when it did not happen) */
    double ready_s;       /* the bucket's last gradient landed */
    double posted_s;      /* its all-reduce was posted */
    double done_s;        /* its completion was observed (an upper bound) */
} dt_ddp_bucket_info;

/* Bucket k (0 = reduced first). DT_ERR_RANGE for a bad k. */
DT_API dt_status dt_ddp_bucket(const dt_ddp *d, int k, dt_ddp_bucket_info *out);

typedef struct dt_ddp_stats {
    uint64_t iterations;         /* synchronised backwards whose reduction completed */
    uint64_t buckets_posted;     /* bucket all-reduces posted */
    uint64_t posted_in_backward; /* ... of which posted before backward finished (overlap) */
    uint64_t done_in_backward;   /* ... of which already complete when backward finished */
    uint64_t bytes_reduced;      /* bytes of gradient all-reduced */
    double wait_s;               /* seconds spent in dt_ddp_wait, total */
    double last_wait_s;          /* ... in the last call */
    double last_backward_s;      /* forward start to backward end, last iteration */
    double buffer_bcast_s;       /* seconds broadcasting buffers in forward, total */
} dt_ddp_stats;

/* Counters since init (or the last reset). */
DT_API dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d);
DT_API void dt_ddp_reset_stats(dt_ddp *d);

/* ---- SyncBatchNorm ------------------------------------------------------------ */

/* Batch norm over channel dim 1 of x [N,C,H,W] or [N,C] whose training
 * statistics are those of the union of every rank's batch (pg's ranks must
 * all call it, in the same order; a rank may have N = 0). gamma/beta [C]
 * or NULL; running_mean/var [C] f32 or NULL, updated as PyTorch does with the
 * unbiased global variance; num_batches NULL or an i64 scalar incremented.
 * training false: the running statistics, no communication. Differentiable
 * (a custom op whose backward all-reduces [sum_dy, sum_dy_xmu]); gamma and
 * beta get the LOCAL sums (DDP averages them). */
DT_API dt_tensor *dt_sync_batch_norm(dt_ctx *ctx, dt_pg *pg, dt_tensor *x, dt_tensor *gamma,
                                     dt_tensor *beta, dt_tensor *running_mean,
                                     dt_tensor *running_var, dt_tensor *num_batches,
                                     bool training, float momentum, float eps);

/* Make every BatchNorm2d of m run dt_sync_batch_norm over pg (PyTorch's
 * convert_sync_batchnorm). Same names, parameters and buffers; works before
 * or after dt_ddp_init. *n (may be NULL) gets the number converted.
 * pg must outlive the model's use. */
DT_API dt_status dt_syncbn_convert(dt_model *m, dt_pg *pg, int *n);

/* ---- metrics and evaluation ------------------------------------------------------ */

/* In-place all-reduce of n doubles over pg (op SUM, MAX, MIN, ...). */
DT_API dt_status dt_metrics_allreduce(dt_pg *pg, double *vals, int n, dt_reduce_op op);

/* Rank r's contiguous share [*lo, *hi) of n items over `world` ranks: the
 * first n % world ranks get one more. Every item goes to exactly one rank
 * (no padding), so sums of per-item metrics reduce exactly. */
DT_API void dt_eval_shard(int64_t n, int rank, int world, int64_t *lo, int64_t *hi);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PARALLEL_H */
