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
 *     ranks of the local gradients. The buckets, their ordered posting and
 *     the wait are the gradient-reduction engine's (dt_reducer, below),
 *     which DDP drives.
 *
 * Training with DDP
 * -----------------
 * The usual way is the trainer (train.h), which runs the whole step
 * (micro-batches, the wait, the agreement on losses and stopping, clipping,
 * the update):
 *     dt_pg *pg;           dt_pg_init(NULL, &pg);
 *     dt_strategy *s;      dt_strategy_ddp_init(pg, NULL, &s);   // wraps m at trainer init
 *     dt_trainer *tr;      dt_trainer_init(m, s, &tp, &tr);
 *     for (step...) dt_trainer_step(tr, &batch, 1, &metrics);
 *     dt_trainer_free(tr);  // frees the DDP handle; then dt_model_free, dt_pg_free
 *
 * The same step by hand, with any model and loss:
 *     dt_ddp *ddp;
 *     if (dt_ddp_init(pg, m, NULL, &ddp) < 0) fail(dt_last_error());
 *     for (step...) {
 *         dt_model_zero_grad(m);
 *         dt_tensor *out = dt_ddp_forward(ctx, ddp, x);      // not dt_model_forward
 *         dt_tensor *loss = dt_cross_entropy(ctx, out, y);   // your loss
 *         if (dt_backward(ctx, loss) < 0 || dt_ddp_wait(ddp) < 0) fail(dt_last_error());
 *         dt_optim_step(opt);     // ranges over the model's flats follow DDP's grads
 *         dt_ctx_reset(ctx);
 *     }
 *     dt_ddp_free(ddp);   // before dt_model_free and dt_pg_free
 * Without dt_ddp_wait the optimizer step (and dt_clip_grad_norm) fails with
 * DT_ERR_STATE naming dt_ddp_wait: the gradients are still being reduced.
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
 * Communication hooks: how each bucket is reduced is a hook on the engine
 * (below): the default all-reduce, fp16/bf16 compression (= reduce_dtype),
 * PowerSGD (dt_ddp_params.comm_hook), or a user's dt_comm_hook.
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
#include "dtrain/offload.h"
#include "dtrain/optim.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_reducer dt_reducer; /* the gradient-reduction engine (below) */

/* ---- communication hooks ----------------------------------------------------------
 *
 * A communication hook replaces how the engine reduces a bucket (PyTorch's
 * DDP register_comm_hook). The engine hands the hook each bucket, in bucket
 * order, the moment the bucket is complete in backward; the bucket carries
 * its flat range of the gradient buffer, the shape and place of each of its
 * parameters, and the step. The layout is stable: the same buckets with the
 * same parameters every step (they are never rebuilt), so a hook may keep
 * state per bucket index.
 *
 * A hook is a vtable (dt_comm_hook): post starts the reduction and returns a
 * request; an optional `then` runs after that request completed and may post
 * the next one (compress, all-reduce, decompress, all-reduce again: PyTorch's
 * future.then chain). The engine calls every `then` inside dt_reducer_wait,
 * in rounds: it waits for every bucket's current request in bucket order,
 * then calls `then` for each of those buckets in bucket order, and repeats
 * until no bucket posted anything. Every rank therefore posts the same
 * collectives in the same order (the process group needs that). When the
 * wait returns, each bucket's range holds the reduced gradients (the average
 * over the group): the hook must leave them there.
 *
 * Built-in hooks (dt_comm_hook_kind; DDP's dt_ddp_params.comm_hook, the CLI's
 * --comm-hook, AIAK_FP16_COMPRESSION / AIAK_POWERSGD_COMPRESSION):
 *   allreduce  the engine's default: all-reduce AVG of the f32 bucket.
 *   fp16/bf16  Horovod's Compression.fp16, PyTorch's
 *              fp16_compress_hook / bf16_compress_hook: cast the bucket to
 *              the 16-bit dtype, all-reduce it in that dtype with averaging,
 *              cast back. This IS the engine's low-precision reduction
 *              (dt_reducer_params.reduce_dtype, the precision policy's
 *              reduce dtype): selecting the hook sets reduce_dtype, there is
 *              no second implementation. Rounding: each gradient is rounded
 *              to 16 bits once; the collective accumulates the 16-bit values
 *              in f32, divides by W and rounds the average to 16 bits once
 *              (so the sum cannot overflow 16 bits as Horovod's can; the
 *              result differs from PyTorch's divide-first fp16 hook in the
 *              last bit at most in one rounding).
 *   powersgd   PowerSGD (dt_powersgd below).
 *
 * A user hook (state is the user's, borrowed):
 *     static dt_status my_post(void *st, dt_pg *pg, const dt_grad_bucket *b, dt_req **req) {
 *         return dt_pg_allreduce_async(pg, DT_IN_PLACE, b->data, b->numel, DT_F32, DT_REDUCE_AVG, req);
 *     }
 *     static const dt_comm_hook my_hook = {.name = "mine", .post = my_post, .then = NULL};
 *     dt_reducer_register_comm_hook(dt_ddp_reducer(ddp), &my_hook, &my_state);
 */

/* One parameter of a bucket. */
typedef struct dt_grad_param {
    size_t entry;          /* its dt_model_entry index */
    const char *name;      /* borrowed, lives with the model */
    size_t offset;         /* its first element, relative to the bucket's data */
    size_t numel;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
} dt_grad_param;

/* One bucket, as a communication hook sees it. */
typedef struct dt_grad_bucket {
    int index;          /* 0 = posted first */
    int nbuckets;       /* buckets in the engine (index nbuckets-1 is posted last) */
    float *data;        /* the bucket's range of the gradient buffer, numel floats */
    size_t offset;      /* its first element in the flat buffer */
    size_t numel;       /* elements in the range (parameters + zero padding between them) */
    size_t shard_numel; /* REDUCE_SCATTER: elements of each rank's slice; 0 for ALLREDUCE */
    int nparams;        /* its parameters, model order */
    const dt_grad_param *params; /* nparams entries; borrowed, fixed for the engine's life */
    uint64_t step;      /* synchronised iterations completed before this one (0 first): the
                           reductions that dt_reducer_wait finished */
} dt_grad_bucket;

/* Post one request that reduces bucket b (or its first stage) and return it
 * in *req (NULL: nothing to wait for). Called from backward, in bucket order. */
typedef dt_status (*dt_comm_hook_fn)(void *state, dt_pg *pg, const dt_grad_bucket *b, dt_req **req);

typedef struct dt_comm_hook {
    const char *name;      /* for messages ("powersgd") */
    dt_comm_hook_fn post;  /* required */
    dt_comm_hook_fn then;  /* optional, NULL: the bucket is reduced when post's request completes.
                              Called in dt_reducer_wait after the bucket's previous request
                              completed (and was freed); *req gets the next request, NULL when
                              the bucket is done. Rounds as described above. */
} dt_comm_hook;

typedef enum dt_comm_hook_kind {
    DT_COMM_HOOK_ALLREDUCE = 0, /* the default all-reduce */
    DT_COMM_HOOK_FP16,          /* = reduce_dtype DT_F16 */
    DT_COMM_HOOK_BF16,          /* = reduce_dtype DT_BF16 */
    DT_COMM_HOOK_POWERSGD,      /* dt_powersgd */
    DT_COMM_HOOK_COUNT
} dt_comm_hook_kind;
/* "allreduce", "fp16", "bf16", "powersgd" <-> value; parse: DT_ERR_INVALID_ARG naming the choices. */
DT_API const char *dt_comm_hook_name(dt_comm_hook_kind k);
DT_API dt_status dt_comm_hook_parse(const char *s, dt_comm_hook_kind *out);

/* ---- PowerSGD (Vogels et al. 2019; PyTorch's powerSGD_hook) ------------
 *
 * Per bucket and step s (s = the steps this hook reduced before, dt_powersgd_iter):
 *   s < start_iter: plain all-reduce (average) of the bucket.
 *   otherwise:
 *   1. error feedback: bucket += error[bucket] (zeros at first); keep G0.
 *   2. each parameter is viewed as M = (shape[0], numel/shape[0]) (n x m),
 *      r = min(n, m, rank); it is compressed iff (n + m) r min_compression_rate
 *      < n m; 1-d tensors (biases, norms) never are.
 *   3. the uncompressed tensors are concatenated and all-reduced (averaged)
 *      in ONE all-reduce together with the Ps of step 5 (one buffer
 *      [uncompressed | P...], SUM; the uncompressed part is divided by W).
 *   4. Q (m x r): the last step's Q re-orthogonalised (warm start), else drawn
 *      N(0,1) exactly as PyTorch does: a numpy-style MT19937 seeded with
 *      random_seed gives one seed per draw (randint(1e9)), which seeds a
 *      torch-style MT19937 (dt_torch_rng) whose normals fill the Qs in order
 *      (tensors grouped by shape, first appearance first); identical on every
 *      rank, different each draw; then orthogonalised.
 *   5. P = M Q (n x r), all-reduced (SUM, not divided).
 *   6. P orthogonalised: Gram-Schmidt, col /= (|col| + eps), then its
 *      projection removed from the later columns (PyTorch uses QR when r > 2:
 *      the same span, columns may differ in sign; P Q^T does not). A zero
 *      column with eps = 0 becomes zeros (PyTorch's intent; a plain division
 *      would give NaN).
 *   7. Q = M^T P, all-reduced, divided by W.
 *   8. M <- P Q^T in place: the bucket holds the averaged approximation.
 *   9. error[bucket] = G0 - bucket (without warm start, P and Q are dropped).
 * With error feedback, summed over steps the applied updates equal the summed
 * averaged gradients minus the average of the ranks' current errors:
 *     sum_t out_t = sum_t mean_i g_i,t - mean_i error_i,T
 * and |error| per step is at most |G0| (the approximation is a projection).
 * Differences from PyTorch: start_iter may be 0 or 1 with error feedback or
 * warm start (PyTorch forbids it because DDP rebuilds its buckets after
 * iteration 1; these buckets never change); the uncompressed tensors and the
 * Ps share one all-reduce (PyTorch posts two; the values are the same).
 * Only the ALLREDUCE collective (DDP): a reduce-scatter engine is refused. */
typedef struct dt_powersgd_params {
    int rank;                   /* matrix_approximation_rank, >= 1; default 1 */
    int64_t start_iter;         /* start_powerSGD_iter: steps of plain all-reduce first, >= 0;
                                   default 1000 */
    double min_compression_rate;/* compress a matrix only if it shrinks by more than this; default 2 */
    bool use_error_feedback;    /* default true */
    bool warm_start;            /* reuse the last step's Q; default true */
    float orthogonalization_epsilon; /* default 0 */
    uint64_t random_seed;       /* seed of the Q draws; default 0 */
} dt_powersgd_params;
DT_API dt_powersgd_params dt_powersgd_params_default(void);

typedef struct dt_powersgd dt_powersgd;
/* The hook's state (errors, P/Q memories per bucket index). p NULL: defaults.
 * DT_ERR_INVALID_ARG for a bad parameter (naming it). */
DT_API dt_status dt_powersgd_init(const dt_powersgd_params *p, dt_powersgd **out);
/* NULL is a no-op. Free only after the engine it is registered with. */
DT_API void dt_powersgd_free(dt_powersgd *s);
/* The vtable to register with state = the dt_powersgd:
 *     dt_reducer_register_comm_hook(dt_ddp_reducer(ddp), dt_powersgd_hook(), ps);
 * (dt_ddp_params.comm_hook = DT_COMM_HOOK_POWERSGD does this inside DDP.) */
DT_API const dt_comm_hook *dt_powersgd_hook(void);
/* Bucket `bucket`'s error-feedback memory (numel floats of the bucket range;
 * borrowed until the next step): DT_ERR_RANGE before its first compressed step. */
DT_API dt_status dt_powersgd_error(const dt_powersgd *s, int bucket, const float **err, size_t *numel);
/* Preset bucket `bucket`'s Q memory (all its compressed tensors' Qs, each
 * m x r row-major, in the order of step 4) before its first compressed step:
 * it is then used as a warm-start Q instead of a draw (PyTorch with a
 * prefilled q_memory_dict). n must match at that step (DT_ERR_MISMATCH then). */
DT_API dt_status dt_powersgd_set_q(dt_powersgd *s, int bucket, const float *q, size_t n);
/* PyTorch's compression_stats: elements before and after compression,
 * summed over every compressed step and bucket. Either pointer may be NULL. */
DT_API void dt_powersgd_stats(const dt_powersgd *s, uint64_t *numel_before, uint64_t *numel_after);
/* Steps this hook has reduced (PyTorch's PowerSGDState.iter): the buckets of
 * step s are compressed iff s >= start_iter. Counted by the hook itself
 * (after the post of a step's last bucket), so it survives a checkpoint
 * with the state below. 0 for NULL. */
DT_API int64_t dt_powersgd_iter(const dt_powersgd *s);

/* State for checkpoints (dt_trainer_save / dt_trainer_load hold it when the
 * run's DDP hook is PowerSGD). A resumed run continues bit for bit when it
 * gets back: the step count (iter), the Q seed generator's position, and per
 * bucket the warm-start Q (identical on every rank; a preset not yet used
 * counts as one) and the error-feedback memory (each rank's own). P is not
 * state: every compressed step computes it from the gradients and Q.
 *
 *     char *js; dt_powersgd_state_save(ps, &js);      // scalars + array sizes, JSON
 *     for each bucket k: dt_powersgd_state_array(ps, k, DT_POWERSGD_Q, &q, &n) ... store n floats
 *     ...
 *     dt_powersgd_state_load(ps2, js, numel_of_each_bucket, nbuckets);   // checks, sizes
 *     for each bucket k: dt_powersgd_state_array(ps2, k, DT_POWERSGD_Q, &q, &n) ... fill n floats
 *     dt_free(js);
 */
typedef enum dt_powersgd_array {
    DT_POWERSGD_Q = 0,      /* the bucket's Qs (step 4's order), warm-start memory or preset */
    DT_POWERSGD_ERROR,      /* the bucket's error feedback (its numel floats); per rank */
} dt_powersgd_array;
/* The state as JSON in *json (free with dt_free): the parameters that shape
 * it, iter, the seed generator, and per bucket {"numel", "q" (floats), "error"
 * (bool)}. DT_ERR_STATE between a step's post and its wait. */
DT_API dt_status dt_powersgd_state_save(const dt_powersgd *s, char **json);
/* Bucket `bucket`'s array `which`: *data (borrowed; NULL and *n 0 when the
 * bucket has none) of *n floats, to read after state_save or to fill after
 * state_load. DT_ERR_RANGE for a bucket the state does not have. */
DT_API dt_status dt_powersgd_state_array(dt_powersgd *s, int bucket, dt_powersgd_array which, float **data,
                                         size_t *n);
/* Replace s's state by json's (arrays zeroed, sized; fill them with
 * state_array). bucket_numel[nbuckets]: the sizes of the engine's buckets
 * (dt_reducer_bucket), which the saved ones must equal. Errors:
 * DT_ERR_MISMATCH naming what differs (matrix approximation rank, error
 * feedback, warm start, min_compression_rate, epsilon, seed, the number or
 * sizes of the buckets); DT_ERR_FORMAT (malformed, naming the field),
 * DT_ERR_UNSUPPORTED (a newer version). s is unchanged on error. start_iter
 * may differ (iter is restored; the new start_iter applies to it). */
DT_API dt_status dt_powersgd_state_load(dt_powersgd *s, const char *json, const size_t *bucket_numel,
                                        int nbuckets);

/* AIAK's variables, read in one place (the config layer calls this after
 * the command line; the variables override it):
 *   AIAK_FP16_COMPRESSION=1      -> *kind = DT_COMM_HOOK_FP16
 *   AIAK_POWERSGD_COMPRESSION=1  -> *kind = DT_COMM_HOOK_POWERSGD
 *   AIAK_MATRIX_APPROXIMATION_RANK (1..1024; unset: ps->rank unchanged, whose default is 1)
 *   AIAK_START_COMPRESS_ITER (>= 0; unset: ps->start_iter unchanged, default 1000)
 * Values 0/1 only for the switches; both switches set is DT_ERR_INVALID_ARG,
 * as is any malformed value (naming the variable). A variable set to 0 or
 * unset leaves *kind as it was. */
DT_API dt_status dt_comm_hook_env(dt_comm_hook_kind *kind, dt_powersgd_params *ps);

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
    dt_dtype reduce_dtype;       /* dtype of the all-reduce: DT_F32, or DT_BF16 / DT_F16 (the
                                    bucket is rounded to it, reduced with f32 accumulation, and
                                    widened back: PyTorch's bf16/fp16 compress hooks, FSDP's
                                    reduce_dtype); default DT_F32. bf16/f16 parameters reduce their
                                    gradients in place in their own dtype, which reduce_dtype must
                                    name when every parameter has that dtype. A model of several
                                    parameter dtypes (a bf16 model whose batch norms stay f32:
                                    keep_batchnorm_fp32) gets one reducer per dtype, each
                                    reducing in its own dtype (f32 ones in f32, or in the
                                    FP16/BF16 comm hook's dtype), as PyTorch buckets per dtype */
    bool hierarchical;           /* hierarchical all-reduce of the buckets (Horovod's
                                    HOROVOD_HIERARCHICAL_ALLREDUCE, AIAK_HIERARCHICAL_ALLREDUCE;
                                    dt_pg_hierarchical in comm.h); default false */
    dt_comm_hook_kind comm_hook; /* how buckets are reduced (see "communication hooks"):
                                    FP16/BF16 set reduce_dtype (an explicit other non-f32
                                    reduce_dtype is DT_ERR_INVALID_ARG); POWERSGD needs reduce_dtype
                                    f32 and creates a dt_powersgd with `powersgd`; default
                                    DT_COMM_HOOK_ALLREDUCE */
    dt_powersgd_params powersgd; /* comm_hook POWERSGD; default dt_powersgd_params_default() */
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

/* The reduction engine DDP drives (borrowed; for a user communication hook:
 * dt_reducer_register_comm_hook(dt_ddp_reducer(d), &hook, state)). With
 * several parameter dtypes, the one of the first trained parameter's dtype. */
DT_API dt_reducer *dt_ddp_reducer(const dt_ddp *d);
/* The PowerSGD state DDP created for comm_hook POWERSGD (borrowed), else NULL. */
DT_API dt_powersgd *dt_ddp_powersgd(const dt_ddp *d);

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

/* ---- the gradient-reduction engine ------------------------------------------- */

/* The engine DDP is built on, shared by every strategy that reduces
 * gradients during backward (DDP today; ZeRO-2/3 next): buckets of whole
 * parameters over a flat f32 gradient buffer (sized and ordered as for DDP
 * above), a grad-ready count per bucket, posting strictly in bucket order on
 * every rank, and a wait for only what is outstanding. The strategy chooses
 * the collective (all-reduce, or reduce-scatter into each rank's slice of
 * the bucket) or installs a communication hook that posts its own (PyTorch's
 * register_comm_hook idea: compression, hierarchical reduction...).
 *
 *     dt_reducer *r;
 *     dt_reducer_init(pg, m, dt_model_flat(m, DT_FLAT_GRADS, DT_F32), NULL, &r);
 *     dt_reducer_begin(r);                       // each iteration
 *     ... backward; for each gradient that lands: dt_reducer_grad_ready(r, entry) ...
 *     dt_reducer_finish(r);                      // end of backward
 *     dt_reducer_wait(r);                        // before reading the gradients
 *
 * From the first post until dt_reducer_wait the gradient buffer is "in
 * flight": dt_optim_step and dt_clip_grad_norm over it fail with
 * DT_ERR_STATE and the wait_hint (DDP's names dt_ddp_wait), instead of
 * reading half-reduced gradients. */
typedef enum dt_reducer_collective {
    DT_REDUCER_ALLREDUCE = 0,  /* every rank gets the whole reduced bucket (DDP) */
    DT_REDUCER_REDUCE_SCATTER, /* rank r gets the reduced slice r of each bucket (ZeRO-2/3):
                                  slices of floor(numel / W) elements in rank order; the
                                  numel mod W tail elements are all-reduced (every rank) */
} dt_reducer_collective;

typedef struct dt_reducer_params {
    double bucket_cap_mb;     /* bucket size limit in MiB; default 25 */
    double first_bucket_mb;   /* limit of the first bucket in model order; default 1 */
    dt_reducer_collective collective; /* default DT_REDUCER_ALLREDUCE */
    bool predivide;           /* scale by 1/W then reduce SUM (else reduce AVG); default false */
    dt_dtype reduce_dtype;    /* DT_F32, or DT_BF16 / DT_F16: each bucket is rounded into a
                                 low-precision copy, reduced in that dtype (f32 accumulation
                                 inside the collective) and widened back into the f32 gradients
                                 at dt_reducer_wait (the range this rank keeps). Ignored under a
                                 comm hook. A bf16/f16 gradient flat is reduced in place in its
                                 dtype, which this must name (no predivide, no comm hook).
                                 Default DT_F32 */
    const char *wait_hint;    /* the error text while gradients are in flight (copied);
                                 default NULL: "... call dt_reducer_wait ..." */
    bool hierarchical;        /* reduce over dt_pg_hierarchical(pg) (made at init, collective;
                                 comm hooks get that group too): two-level all-reduce and
                                 reduce-scatter across nodes; default false */
} dt_reducer_params;
DT_API dt_reducer_params dt_reducer_params_default(void);

/* Buckets over the parameters of m, whose gradients live in grads (a whole
 * flat laid out as the model's, e.g. dt_model_flat(m, DT_FLAT_GRADS,
 * DT_F32); its base is read here and must not move): the trained parameters
 * of the flat's dtype (f32, bf16 or f16); parameters of other dtypes belong
 * to another reducer over their own flat.
 * pg, m and the flat's memory are borrowed and must outlive the engine.
 * p NULL: defaults. */
DT_API dt_status dt_reducer_init(dt_pg *pg, dt_model *m, const dt_flat *grads, const dt_reducer_params *p,
                                 dt_reducer **out);
/* Waits for anything outstanding, then frees. NULL is a no-op. */
DT_API void dt_reducer_free(dt_reducer *r);
/* Install hook h (NULL: remove; the default post again) with its state
 * (borrowed; must outlive the engine or the next registration). h is copied.
 * DT_ERR_INVALID_ARG when h has no post; DT_ERR_STATE while reductions are
 * outstanding. */
DT_API dt_status dt_reducer_register_comm_hook(dt_reducer *r, const dt_comm_hook *h, void *state);
/* Shorthand: a hook with only post = fn (fn NULL: remove). */
DT_API void dt_reducer_set_comm_hook(dt_reducer *r, dt_comm_hook_fn fn, void *state);
/* Start an iteration: nothing ready, nothing posted. */
DT_API void dt_reducer_begin(dt_reducer *r);
/* The gradient of parameter entry `entry` (a dt_model_entry index) is final:
 * count it, and post every complete bucket whose predecessors are posted.
 * DT_ERR_STATE when it was already ready in this iteration. */
DT_API dt_status dt_reducer_grad_ready(dt_reducer *r, size_t entry);
/* End of backward: every parameter must be ready (DT_ERR_STATE otherwise;
 * mark unused ones ready first); posts what is left. */
DT_API dt_status dt_reducer_finish(dt_reducer *r);
/* Wait for every request still outstanding and free it; clears the in-flight
 * mark. Returns the first failure (naming the bucket). */
DT_API dt_status dt_reducer_wait(dt_reducer *r);
/* Wait without reporting (error and teardown paths). */
DT_API void dt_reducer_drain(dt_reducer *r);
/* Whether requests are outstanding (posted, not yet waited for). */
DT_API bool dt_reducer_outstanding(const dt_reducer *r);
/* Buckets posted so far in this iteration, and how many of them completed
 * (tests the requests without waiting). Either pointer may be NULL. */
DT_API void dt_reducer_progress(dt_reducer *r, int *posted, int *done);
DT_API int dt_reducer_num_ready(const dt_reducer *r);
DT_API int dt_reducer_num_params(const dt_reducer *r);
DT_API bool dt_reducer_is_ready(const dt_reducer *r, size_t entry);
DT_API int dt_reducer_num_buckets(const dt_reducer *r);

typedef struct dt_reducer_bucket_info {
    size_t offset;        /* first element in the flat gradient buffer */
    size_t numel;         /* elements in the range (parameters + padding between them) */
    size_t bytes;         /* sum of the parameters' sizes (what the cap counts) */
    int nparams;          /* parameters in the bucket */
    size_t first_entry;   /* model entry index of its first parameter in model order */
    size_t last_entry;    /* ... and of its last */
    double ready_s;       /* this iteration, seconds since begin: last gradient landed (-1: not yet) */
    double posted_s;      /* ... reduction posted */
    double done_s;        /* ... completion observed (an upper bound) */
} dt_reducer_bucket_info;
/* Bucket k (0 = posted first). DT_ERR_RANGE for a bad k. */
DT_API dt_status dt_reducer_bucket(const dt_reducer *r, int k, dt_reducer_bucket_info *out);
/* The range of bucket k that rank holds reduced after the wait: the whole
 * bucket under ALLREDUCE; its slice (without the tail) under REDUCE_SCATTER. */
DT_API dt_status dt_reducer_shard(const dt_reducer *r, int k, int rank, size_t *offset, size_t *numel);
/* Totals since init: buckets posted, bytes reduced. */
DT_API void dt_reducer_counters(const dt_reducer *r, uint64_t *buckets_posted, uint64_t *bytes_reduced);

/* ---- ZeRO stages 1-3 / FSDP --------------------------------------------------------
 *
 * Sharded data parallelism (DeepSpeed ZeRO, PyTorch FSDP,
 * 2.1-2.6). Both vocabularies mean the same thing:
 *
 *   DeepSpeed   FSDP            sharded                      moved by
 *   stage 0     NO_SHARD        nothing (DDP: use dt_ddp)    all-reduce
 *   stage 1     -               optimizer states             reduce-scatter (or all-reduce: reduce_scatter
 *                                                            false), all-gather after the step
 *   stage 2     SHARD_GRAD_OP   + gradients                  reduce-scatter, all-gather after the step
 *   stage 3     FULL_SHARD      + parameters                 all-gather per unit (prefetched), reduce-scatter
 *   -           HYBRID_SHARD    stage 3 (or 2) within groups of hybrid_shard_size ranks, replicated
 *                               across the groups: reduce-scatter in the group, all-reduce across
 *
 * Units. A wrap policy splits the model into units (FSDP's auto_wrap_policy):
 * wrap_min_params (a module whose not-yet-wrapped parameter elements reach
 * it, unless it would split a tie: GPT-2's wte stays with lm_head in the
 * parent's unit), wrap_module_type (every module of that type, e.g. each transformer
 * block: "GPT2Block" in the built-in GPT-2; a type no module has is an error
 * naming the types there are), or a predicate wrap_fn; the root is always a
 * unit and takes the rest. Each unit's parameters (its module's minus nested units') live in one
 * flat buffer (FSDP's FlatParameter): model order, each tensor 64-byte
 * aligned, padded to a multiple of W * 64 bytes, so rank r owns the equal
 * range [r*c, (r+1)*c), c = total / W. Each rank's optimizer steps only its
 * ranges (dt_zero_ranges: one dt_optim_range per unit).
 *
 * Stage 3 gathers a unit just before it runs (module forward and backward
 * pre-hooks), frees it after its forward (reshard_after_forward; never the
 * root unit) and after its backward; all-gathers run on a second channel
 * (dt_pg_dup) and are prefetched: forward_prefetch (the next unit in the
 * recorded forward order), backward_prefetch BACKWARD_PRE (in the unit's
 * backward pre-hook, before its gradients are computed), BACKWARD_POST (in
 * its backward post-hook, after freeing it) or NONE. Gradients of a unit are
 * reduced as soon as all of them landed (grad-ready hooks), in descending
 * unit index on every rank: stage 1 reduce-scatters the unit into this
 * rank's range of its whole gradients (reduce_scatter, the default; false
 * all-reduces the whole unit) and steps that range, stages 2/3
 * reduce-scatter into the owner's shard; the whole gradients of stages 2/3
 * are released when the reduce-scatter completes, stage 1 keeps them (the
 * next step's first dt_zero_set_sync zeroes all but the owned ranges, which
 * the optimizer zeroes as it steps them: dt_optim_set_zero_grad, as the
 * trainer sets it; a caller stepping otherwise zeroes them itself).
 * A freed unit's pages are not given back: up to two of the largest units'
 * worth stay in a page pool, and the next gather moves them (mremap) under
 * its own fixed addresses, so it writes already-faulted memory instead of
 * faulting fresh zeroed pages (DT_ZERO_NO_POOL=1 turns the pool off).
 * Units must run the same forward on every rank: each step checks that
 * every rank gathered every unit as often, else an error naming the unit.
 *
 * Lazy construction: build the model meta (dt_model_build_params.meta) and
 * each rank allocates only its shards and initialises them with
 * dt_model_init_range (init_rng, init_seed = the build's seed): the values
 * equal a full build's. A non-meta model is copied from (after rank 0's
 * broadcast with sync_module_states); its own flats then go unused.
 *
 * Mixed precision (FSDP MixedPrecision, DeepSpeed's fp16/bf16 with ZeRO):
 * build the model with bf16/f16 parameters (dt_model_build_params.param_dtype;
 * norms may stay f32). Units hold one dtype each (a module with two gets two
 * units); a bf16/f16 unit's whole parameters and gradients are bf16/f16
 * (2 bytes each), and this rank keeps fp32 master weights of its shard only:
 * the optimizer steps the masters (f32 state for the shard only) and rounds
 * them into the shard (dt_zero_ranges: params = masters, mirror = the shard),
 * which is then all-gathered. Gradients are reduced in reduce_dtype (a copy
 * converted from the unit's dtype when they differ). Per parameter: 2 + 2 +
 * 12 bytes for Adam (parameters, gradients, master + two moments), the
 * sharded parts divided by N; the trainer reports the optimizer's f32 copy of
 * the shard's gradients (4/N) apart (dt_trainer_memory.grad_f32_bytes).
 *
 * Memory: a unit's whole parameters and gradients are mapped regions at a
 * fixed address (the model's tensors view them); freeing returns their pages
 * (madvise), so resident memory follows what is gathered. Buffers that stay
 * whole (stage 1's gradients, the parameters of stage 1/2 units and of the
 * persistent unit) come from dt_pg_alloc while its arena has room
 * ($DT_SHM_HEAP_MB), so the shm backend reduces and gathers them without
 * copies, as DDP's gradient buffer; not with hybrid_shard_size or
 * hierarchical. dt_zero_memory
 * gives the bytes held: stage 3 parameters and stage 2/3 gradients are
 * Psi/N (padded), stage 1/2 parameters and stage 1 gradients Psi.
 *
 * Parameter offload (ZeRO-Infinity's offload_param, stage 3 only):
 * offload_param.device NVME keeps each non-resident unit's parameter shard
 * in a file of an NVMe store (offload.h: a per-run directory under
 * nvme_path, files created O_EXCL|O_NOFOLLOW and removed by dt_zero_free).
 * A shard is read in asynchronously before the unit's all-gather and its
 * buffer returned once the gather completed; reads run ahead along the
 * recorded order (forward, then backward in reverse) so that up to
 * buffer_count shards are in memory, the disk time overlapping the compute
 * and the other gathers. The optimizer steps unit by unit (dt_zero_step:
 * read ahead, step, write back), with its state in memory or in files
 * (dt_offload_optim). A failed or short read or write is an error naming
 * the file; in a hook it is held and reported by every rank at the step's
 * dt_zero_wait (the per-step check carries it), after the step by every
 * rank at once, at init by every rank before any other collective: never a
 * hang. f32 units only (mixed precision: DT_ERR_UNSUPPORTED), SGD, Adam and
 * AdamW (the step goes by parts, dt_optim_step_part). The parameters are
 * bit-identical to stage 3 without offload.
 *
 * ZeRO++ (DeepSpeed's, stage 3 FULL_SHARD only; the collectives are
 * zeropp.h's): quantized_weights (qwZ) sends each shard of an all-gather
 * as int8 blocks (quant_block elements, one f32 scale per block: a bit more
 * than a quarter of the f32 bytes) and dequantizes what arrives into the
 * unit's whole parameters; the shards, the fp32 masters and the optimizer
 * never see the rounding, only forward and backward do (an element is
 * within half its block's scale, max |x| / 254, of the exact value; a bf16
 * unit is quantized from and dequantized to bf16). hpz_partition_size H
 * (hpZ) keeps, after a unit's forward all-gather, this rank's 1/H of the
 * gathered parameters (the secondary shard, the slice of its place among
 * the H consecutive ranks of its group) until the unit's backward
 * all-gather, which then runs among those H ranks, within one machine:
 * no parameter bytes cross machines in backward. The values are those the
 * forward gathered, so without qwZ hpZ is bit-identical to plain stage 3;
 * it costs 1/H of each unit held from its forward to its backward
 * (dt_zero_stats.secondary_peak, counted in dt_zero_memory's peak).
 * quantized_gradients (qgZ) replaces each unit's reduce-scatter by
 * dt_zpp_reduce_scatter_q: quant_grad_bits (4 or 8) blocks exchanged within
 * each machine (blocks of quant_grad_block), summed in f32, requantized and exchanged across machines,
 * summed in f32 and averaged; it runs when the unit's gradients are
 * complete (no overlap with the rest of backward). No error feedback (as
 * DeepSpeed's). A NaN or infinity in a block makes the block NaN: the
 * trainer's non-finite check still sees it. The ranks must be numbered
 * machine by machine (as launchers do); H must divide the world, and
 * equal the ranks per machine when there are several machines (real, or
 * simulated with $DT_SIM_LOCAL_SIZE); with one machine any divisor works.
 * Not with hybrid_shard_size or parameter offload (DT_ERR_INVALID_ARG).
 *
 * Usage (the trainer does all of this through dt_strategy_zero_init, train.h):
 *     dt_model_build_params bp = {.world = 1, .meta = true};
 *     dt_model_build(net, seed, &bp, &m);          // no parameter memory
 *     dt_zero_params zp = dt_zero_params_default(); // stage 3
 *     zp.wrap_module_type = "Block";  zp.init_seed = seed;
 *     dt_zero *z;  dt_zero_init(pg, m, &zp, &z);   // each rank: its shards only
 *     ... per step: dt_zero_set_sync(z, true); forward; backward; dt_zero_wait(z);
 *         optimizer over dt_zero_ranges(z, ...); dt_zero_after_step(z);
 *     dt_zero_full_params(z, NULL) ... dt_zero_free(z);  // before the model
 */
typedef struct dt_zero dt_zero;

/* FSDP's ShardingStrategy names (dt_strategy_fsdp_init, train.h). */
typedef enum dt_fsdp_sharding {
    DT_FSDP_NO_SHARD = 0,    /* DDP */
    DT_FSDP_SHARD_GRAD_OP,   /* ZeRO-2 */
    DT_FSDP_FULL_SHARD,      /* ZeRO-3 */
    DT_FSDP_HYBRID_SHARD,    /* FULL_SHARD in a node group, replicated across the nodes */
    DT_FSDP_SHARDING_COUNT
} dt_fsdp_sharding;
/* "no_shard", "shard_grad_op", "full_shard", "hybrid_shard" <-> value;
 * parse: DT_ERR_INVALID_ARG naming the choices. */
DT_API const char *dt_fsdp_sharding_name(dt_fsdp_sharding s);
DT_API dt_status dt_fsdp_sharding_parse(const char *s, dt_fsdp_sharding *out);

typedef enum dt_backward_prefetch {
    DT_PREFETCH_NONE = 0,        /* the next unit is gathered only when its own pre-hook runs */
    DT_PREFETCH_BACKWARD_PRE,    /* in a unit's backward pre-hook: gather the next one (FSDP default) */
    DT_PREFETCH_BACKWARD_POST,   /* in its backward post-hook, after freeing it */
} dt_backward_prefetch;
/* "none", "backward_pre", "backward_post". */
DT_API const char *dt_prefetch_name(dt_backward_prefetch b);
/* The reverse of dt_prefetch_name. */
DT_API dt_status dt_prefetch_parse(const char *s, dt_backward_prefetch *out);

/* A user wrap predicate: wrap module m, which holds `numel` parameter
 * elements not yet in a nested unit? (FSDP's auto_wrap_policy with
 * recurse=False.) */
typedef bool (*dt_wrap_fn)(void *ud, const dt_module *m, size_t numel);

typedef struct dt_zero_params {
    int stage;                   /* 1, 2 or 3; default 3 */
    bool reshard_after_forward;  /* stage 3: free a unit after its forward (FULL_SHARD); false
                                    keeps it until its backward ends; default true */
    size_t wrap_min_params;      /* size-based wrap policy threshold in elements; 0 off; default 0 */
    const char *wrap_module_type;/* wrap every module of this type ("Linear", "GPT2Block"); one
                                    the model lacks is an error; borrowed during init; default NULL */
    dt_wrap_fn wrap_fn;          /* user predicate; default NULL */
    void *wrap_ud;               /* passed to wrap_fn; default NULL */
    dt_backward_prefetch backward_prefetch; /* default DT_PREFETCH_BACKWARD_PRE */
    bool forward_prefetch;       /* gather the next unit of the recorded forward order in a unit's
                                    forward pre-hook; default false */
    bool limit_all_gathers;      /* at most two all-gathers in flight; default true */
    bool page_pool;              /* stage 3: keep freed units' pages (up to two of the largest
                                    units) for the next gathers; default true (false, or
                                    DT_ZERO_NO_POOL=1 in the environment: give them back) */
    bool sync_module_states;     /* broadcast rank 0's parameters and buffers at init (non-meta
                                    model); default false */
    dt_init_rng init_rng;        /* meta model: the generator of its initial values; default PHILOX */
    uint64_t init_seed;          /* meta model: the build's seed; default 0 */
    /* DeepSpeed's knobs (zero_optimization), with their meaning here: */
    bool overlap_comm;           /* post reductions during backward (false: each waits at once);
                                    default true */
    bool reduce_scatter;         /* stage 1: reduce-scatter each unit's gradients into this rank's
                                    range of its whole gradient buffer (the only part the step
                                    reads); false: all-reduce the whole unit (twice the work and
                                    traffic), then step the slice. Stages 2/3 always
                                    reduce-scatter. The owner's range is the same either way
                                    (bit-identical on shm; see GUIDE). Default true (DeepSpeed's) */
    bool contiguous_gradients;   /* accepted, no effect: gradients always live in contiguous
                                    per-unit buffers; default true */
    size_t reduce_bucket_size;   /* elements; accepted, no effect: a unit is the reduction bucket
                                    (use wrap_min_params for smaller ones); default 5e8 */
    size_t allgather_bucket_size;/* stage 1/2: elements of after-step all-gathers posted before
                                    waiting; default 5e8 */
    size_t prefetch_bucket_size; /* stage 3: a unit larger than this (elements) is not prefetched;
                                    default 5e7 */
    size_t param_persistence_threshold; /* stage 3: parameters with fewer elements stay whole (one
                                    resident unit, gathered after the step); DeepSpeed's default
                                    is 1e5, here 0 (off) so small models shard; default 0 */
    size_t max_live_parameters;  /* stage 3: no prefetch that would make more gathered elements
                                    resident than this; default 1e9 */
    size_t max_reuse_distance;   /* stage 3: a unit is not freed after forward when fewer elements
                                    are gathered before its backward reuses it; 0: FSDP's
                                    behaviour (free); DeepSpeed's default is 1e9; default 0 */
    size_t sub_group_size;       /* accepted, no effect: the optimizer steps a rank's ranges in one
                                    fused pass (it tiles offloaded steps in DeepSpeed); default 1e9 */
    bool round_robin_gradients;  /* accepted, no effect (a CPU-offload copy order in DeepSpeed);
                                    default false */
    int hybrid_shard_size;       /* HYBRID_SHARD (stages 2/3): shard over groups of this many
                                    consecutive ranks (a node: dt_pg_local_size), replicate across
                                    the groups; gradients are reduce-scattered in the group, then
                                    all-reduced over the replicas. 0 (or the world size): plain
                                    sharding over all ranks; default 0 */
    dt_dtype reduce_dtype;       /* dtype of the gradient reductions (FSDP MixedPrecision's
                                    reduce_dtype): DT_F32, DT_BF16, DT_F16; DT_DTYPE_COUNT (unset):
                                    each unit's parameter dtype. An f32 unit of a model that also
                                    has bf16/f16 units (norms the precision policy keeps f32)
                                    always reduces in f32. Default DT_DTYPE_COUNT */
    bool hierarchical;           /* gradient reductions (reduce-scatters; stage 1's all-reduce
                                    with reduce_scatter false) over dt_pg_hierarchical of the shard group:
                                    two levels across nodes; default false */
    dt_offload_params offload_param; /* DeepSpeed's offload_param (stage 3): device NVME keeps
                                    this rank's parameter shards in files under nvme_path
                                    (borrowed during init), see "Parameter offload" above; CPU
                                    changes nothing on a CPU system. Default: device NONE,
                                    buffer_count 5, buffer_size 1e8, max_in_cpu 1e9 */
    /* ZeRO++ (stage 3, FULL_SHARD only; see "ZeRO++" above): */
    bool quantized_weights;      /* qwZ: the units' forward (and, without hpZ, backward) all-gathers
                                    carry int8 blocks of quant_block elements, one f32 scale each;
                                    the shards (and fp32 masters) stay exact. DeepSpeed's
                                    zero_quantized_weights; default false */
    bool quantized_gradients;    /* qgZ: the gradient reduce-scatter is the two-hop quantized
                                    all-to-all of zeropp.h (within each machine, then across),
                                    quant_grad_bits per value, summed in f32 at each hop; no error
                                    feedback. DeepSpeed's zero_quantized_gradients; default false */
    int hpz_partition_size;      /* hpZ: after a unit's forward all-gather each rank keeps 1/H of
                                    the gathered parameters (H consecutive ranks: one machine), so
                                    its backward all-gather runs among those H ranks only; 1: off.
                                    DeepSpeed's zero_hpz_partition_size, FSDP2's
                                    reshard_after_forward=H; default 1 */
    int64_t quant_block;         /* qwZ: elements per scale; default 2048 */
    int quant_grad_bits;         /* qgZ: 4 (DeepSpeed's) or 8; default 4 */
    int64_t quant_grad_block;    /* qgZ: elements per scale; default 64 (int4 over larger blocks
                                    rounds small gradients to zero: see GUIDE's ZeRO++) */
} dt_zero_params;
DT_API dt_zero_params dt_zero_params_default(void);

/* Shard model m over pg (collective): apply the wrap policy, allocate this
 * rank's shards and the units' mapped regions, initialise (see above), bind
 * the model's tensors, install the hooks. pg and m are borrowed and must
 * outlive the handle. Errors: DT_ERR_INVALID_ARG (bad params),
 * DT_ERR_UNSUPPORTED (non-float parameters; stage 3 with tied parameters in
 * different units), DT_ERR_NO_MEMORY, the collectives' errors. */
DT_API dt_status dt_zero_init(dt_pg *pg, dt_model *m, const dt_zero_params *p, dt_zero **out);
/* Check p's ZeRO++ fields (quantized_weights, quantized_gradients,
 * hpz_partition_size, quant_block, quant_grad_bits, quant_grad_block) against a world of
 * `world` ranks, without collectives: DT_ERR_INVALID_ARG naming the
 * DeepSpeed key (ZeRO++ on a stage other than 3, with hybrid sharding or
 * parameter offload to NVMe, hpZ not dividing the world or without
 * reshard_after_forward, a block outside 1..2^30, bits not 4 or 8). dt_zero_init runs
 * it; the machines are checked there too (zeropp.h's dt_zpp_hpz_check). */
DT_API dt_status dt_zero_pp_check(const dt_zero_params *p, int world);
/* Wait for everything outstanding, remove the hooks, free. The model's
 * tensors point into freed memory afterwards: copy the parameters out first
 * (dt_zero_full_params) and free the model after. NULL is a no-op. */
DT_API void dt_zero_free(dt_zero *z);
/* Whether the coming backward reduces (the step's last micro-batch); false
 * accumulates whole gradients locally (FSDP's no_sync). The first call after
 * dt_zero_wait starts a new step: the last step's whole gradients are
 * released (stages 2/3) or zeroed outside this rank's ranges (stage 1: the
 * ranges' own gradients are the optimizer's to zero, see above). */
DT_API void dt_zero_set_sync(dt_zero *z, bool sync);
/* After the last backward: post what is left, wait for every reduction and
 * run the per-step unit check. The shards' gradients are then averaged. */
DT_API dt_status dt_zero_wait(dt_zero *z);
/* After the optimizer step: gather the updated parameters of whole units
 * (stages 1/2, and stage 3's persistent unit; collective). */
DT_API dt_status dt_zero_after_step(dt_zero *z);
/* Error path: wait without reporting and zero every gradient. */
DT_API void dt_zero_drain(dt_zero *z);
/* Whether the parameter shards are offloaded (offload_param.device NVME). */
DT_API bool dt_zero_params_offloaded(const dt_zero *z);
/* The optimizer step under parameter offload (the trainer calls it instead
 * of dt_optim_step): unit by unit, the shard read in (buffer_count - 1
 * ahead), the unit's range stepped, the shard written back. o was made over
 * dt_zero_ranges (state in memory) or, with d non-NULL, over no ranges with
 * d stepping its state in files (dt_offload_optim_step_range). Advances o's
 * step count. Collective: every rank learns whether any rank's I/O failed
 * (the failing rank's error names the file). Without parameter offload:
 * dt_optim_step(o) or dt_offload_optim_step(d). */
DT_API dt_status dt_zero_step(dt_zero *z, dt_optim *o, dt_offload_optim *d);
/* The parameter store (NULL without parameter offload; borrowed). */
DT_API dt_nvme_store *dt_zero_param_store(const dt_zero *z);
/* In-place SUM of n doubles over the shard group (the ranks whose ranges
 * are disjoint: all ranks, or the hybrid shard group). Collective there. */
DT_API dt_status dt_zero_shard_sum(dt_zero *z, double *v, int n);
/* Broadcast the model's buffers (batch-norm statistics) from rank 0. */
DT_API dt_status dt_zero_sync_buffers(dt_zero *z);
/* The optimizer's ranges, one per unit (this rank's shard of it), with
 * segments (no_decay on 1-d tensors when no_decay_1d). Owned by z. */
DT_API dt_status dt_zero_ranges(dt_zero *z, bool no_decay_1d, const dt_optim_range **r, size_t *n);

/* Write the whole parameters in the model's flat layout (the model's f32
 * DT_FLAT_PARAMS offsets, dt_model_flat(m)->total floats) into dst on every
 * rank; dst NULL: into the model's own flats of each dtype (not for a meta
 * model). dst non-NULL needs an all-f32 model (DT_ERR_DTYPE otherwise).
 * Collective (stage 3 all-gathers each unit). */
DT_API dt_status dt_zero_full_params(dt_zero *z, float *dst);

/* The group z was made over (all ranks, whatever the hybrid sharding):
 * what a sharded checkpoint is saved over. Borrowed. */
DT_API dt_pg *dt_zero_group(const dt_zero *z);

DT_API int dt_zero_num_units(const dt_zero *z);
typedef struct dt_zero_unit_info {
    const char *name;     /* its module's path, "<root>", or "<persistent>"; borrowed */
    dt_module *module;    /* NULL for the persistent unit */
    int nparams;          /* parameter tensors */
    size_t numel;         /* elements of its layout (tensors and alignment gaps) */
    size_t total;         /* padded flat: W * (shard_hi - shard_lo) */
    size_t shard_lo, shard_hi; /* this rank's range of it */
    bool resident;        /* kept whole between steps (stage 1/2, persistent) */
    bool gathered;        /* its whole parameters are present now */
    int fwd_pos;          /* position in the recorded forward order, -1 before the first step */
    dt_dtype dtype;       /* its parameters' dtype (bf16/f16 units keep fp32 masters of the shard) */
    dt_dtype reduce_dtype;/* the dtype its gradients are reduced in (the shard's gradients) */
} dt_zero_unit_info;
DT_API dt_status dt_zero_unit(const dt_zero *z, int k, dt_zero_unit_info *out);

/* What this rank holds, for sharded checkpoints: one piece per (tensor,
 * unit range) intersection. Optimizer state of a piece: state i of range
 * `range` of the optimizer (dt_optim_state) at element range_offset. */
typedef struct dt_zero_piece {
    size_t entry;         /* model entry index */
    const char *name;     /* its name ("0.weight"); borrowed */
    size_t lo, hi;        /* element range within the tensor (row-major) */
    size_t range;         /* the optimizer range (= unit) holding it */
    size_t range_offset;  /* its first element's index within that range */
    float *param;         /* this rank's f32 values of those elements: the parameters, or for a
                             bf16/f16 unit their fp32 master weights (what the optimizer steps) */
    void *lowp;           /* bf16/f16 unit: the compute copy of those elements (dtype); else NULL */
    dt_dtype dtype;       /* the parameter's dtype */
    void *grad;           /* the shard's reduced gradients (grad_dtype: the reduce dtype) */
    dt_dtype grad_dtype;
} dt_zero_piece;
/* Fill out[0..cap) with this rank's pieces, in unit then model order; *n
 * gets the count (DT_ERR_RANGE when cap is smaller; out NULL only counts). */
DT_API dt_status dt_zero_pieces(const dt_zero *z, dt_zero_piece *out, size_t cap, size_t *n);
/* Bytes held between steps (parameters, gradients) and the peak of gathered
 * parameters plus unsharded gradients plus stage 3's page pool (the pages
 * of released units kept for the next gathers: at most two of the largest
 * units) since init. Any pointer may be NULL.
 * Under parameter offload the offloaded shards count as the peak bytes of
 * their buffers held at once since init (the files are not memory). */
DT_API dt_status dt_zero_memory(const dt_zero *z, size_t *param_bytes, size_t *grad_bytes, size_t *gathered_peak);
/* Counters since init: what moved, and whether stage 3's all-gathers
 * overlapped compute (a gather a prefetch posted before the unit's hook
 * needed it; of those, the ones already complete by then). */
typedef struct dt_zero_stats {
    uint64_t bytes_reduced;    /* gradient bytes all-reduced or reduce-scattered (input size) */
    uint64_t bytes_gathered;   /* parameter bytes all-gathered (output size), after-step gathers included */
    uint64_t gathers;          /* stage 3 unit all-gathers posted */
    uint64_t prefetched;       /* ... of which posted by a prefetch, ahead of the hook that needed them */
    uint64_t ready_when_needed;/* ... of which complete when that hook came */
    uint64_t bytes_pooled;     /* stage 3: bytes of gathers written into pages kept from released
                                  units (the page pool) instead of freshly faulted ones */
    uint64_t pool_peak;        /* the most bytes the page pool held at once (counted in
                                  dt_zero_memory's gathered peak); 0 without the pool */
    uint64_t secondary_bytes;  /* hpZ: bytes of secondary shards held now */
    uint64_t secondary_peak;   /* hpZ: the most bytes of secondary shards held at once (counted in
                                  dt_zero_memory's gathered peak); 0 without hpZ */
    uint64_t gathers_secondary;/* hpZ: unit all-gathers that ran within the hpZ group */
    uint64_t gathers_quantized;/* qwZ: unit all-gathers that carried int8 blocks */
    uint64_t reduces_quantized;/* qgZ: unit reduce-scatters that ran quantized */
} dt_zero_stats;
DT_API dt_zero_stats dt_zero_get_stats(const dt_zero *z);

/* ---- SyncBatchNorm ------------------------------------------------------------ */

/* Batch norm over channel dim 1 of x [N,C,H,W] or [N,C] whose training
 * statistics are those of the union of every rank's batch (pg's ranks must
 * all call it, in the same order; a rank may have N = 0). gamma/beta [C]
 * or NULL; running_mean/var [C] f32 or NULL, updated as PyTorch does with the
 * unbiased global variance; num_batches NULL or an i64 scalar incremented.
 * training false: the running statistics, no communication. Differentiable
 * (a custom op whose backward all-reduces [sum_dy, sum_dy_xmu]); gamma and
 * beta get the LOCAL sums (DDP averages them). x, gamma and beta may be
 * bf16/f16 (precision.h): the statistics are f32 and the result has x's
 * dtype. */
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
