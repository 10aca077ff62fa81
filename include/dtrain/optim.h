/* dtrain/optim.h — fused optimizers over flat buffers, clipping, LR schedules.
 *
 * Overview
 * --------
 * A model keeps all its parameters in one flat f32 buffer and the gradients
 * in a mirror buffer (nn.h). An optimizer updates such a buffer in one fused
 * pass per step (two or three for LAMB, which needs norms first). It can own
 * the whole buffer or just a range [lo, hi) of it: ZeRO gives each rank an
 * equal shard and every rank runs its own optimizer over its own range. The
 * optimizer allocates and owns its state (momentum, exp_avg, exp_avg_sq) for
 * exactly hi - lo elements.
 *
 * The layout names the per-tensor segments of the flat buffer (offset, numel,
 * in global element indices). Elements outside every segment (alignment
 * padding) are never touched. LAMB needs the segments for its per-tensor
 * trust ratio; for a range, each segment is clipped to [lo, hi). When a
 * tensor is split across ranks, its norms are partial on each rank: install a
 * reducer (dt_optim_set_reducer) that sums the partial sums of squares over
 * the ranks (an all-reduce), and every rank sees the full norms.
 *
 * Semantics follow the reference implementations to the last ulp where they
 * are CPU code (torch.optim SGD, Adam, AdamW of PyTorch 1.13 on an AVX2 CPU:
 * `add(alpha)` and `addcmul` are fused multiply-adds there, so they are here)
 * and follow the formula order of apex FusedLAMB's CUDA kernel without
 * contraction. Hyper-parameters are doubles because PyTorch computes
 * `1 - beta1`, `lr / bias_correction1`, ... in double and rounds the result
 * to float once; apex receives floats and we round to float where it does.
 *
 * Lifecycle: dt_optim_*_init() returns a handle that owns its state; free it
 * with dt_optim_free() (NULL is a no-op). Params and grads are borrowed for
 * the duration of each dt_optim_step() only.
 *
 * Usage
 * -----
 *     dt_optim_segment segs[] = {{0, 160}, {192, 10}};     // two tensors
 *     dt_optim_layout lay = {.lo = 0, .hi = 202, .segs = segs, .nseg = 2};
 *     dt_sgd_params sp = dt_sgd_params_default();
 *     sp.lr = 0.1; sp.momentum = 0.9;
 *     dt_optim *opt = dt_optim_sgd_init(&sp, &lay);
 *     for (step...) {
 *         ... backward fills grads ...
 *         float norm;
 *         dt_clip_grad_norm(grads, 202, 1.0f, &norm);      // optional
 *         dt_optim_set_lr(opt, dt_sched_lr(&sched, step));
 *         dt_optim_step(opt, params, grads);               // params, grads: element lo
 *     }
 *     dt_optim_free(opt);
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- layout --------------------------------------------------------------- */

/* One parameter tensor inside the flat buffer, in global element indices. */
typedef struct dt_optim_segment {
    size_t offset;   /* first element of the tensor in the flat buffer */
    size_t numel;    /* number of elements */
    bool no_decay;   /* true: weight decay is 0 for this tensor (biases, norms); default false */
} dt_optim_segment;

/* What part of a flat buffer an optimizer owns. */
typedef struct dt_optim_layout {
    size_t lo;                     /* first owned element (global index) */
    size_t hi;                     /* one past the last owned element; hi >= lo */
    const dt_optim_segment *segs;  /* per-tensor segments, sorted by offset, disjoint;
                                      copied at init. NULL: [lo, hi) is one tensor */
    size_t nseg;                   /* number of segments (0 with segs == NULL) */
} dt_optim_layout;

/* ---- parameters ------------------------------------------------------------- */

/* torch.optim.SGD. */
typedef struct dt_sgd_params {
    double lr;            /* learning rate; default 0.01 (torch requires it; we pick 0.01) */
    double momentum;      /* momentum factor; default 0 (plain SGD, no state) */
    double dampening;     /* dampening for momentum; default 0 */
    double weight_decay;  /* L2 penalty added to the gradient; default 0 */
    bool nesterov;        /* Nesterov momentum (needs momentum > 0, dampening 0); default false */
} dt_sgd_params;
DT_API dt_sgd_params dt_sgd_params_default(void);

/* torch.optim.Adam / torch.optim.AdamW (same struct; the init call picks). */
typedef struct dt_adam_params {
    double lr;            /* learning rate; default 1e-3 */
    double beta1;         /* first-moment decay; default 0.9 */
    double beta2;         /* second-moment decay; default 0.999 */
    double eps;           /* added to the denominator; default 1e-8 */
    double weight_decay;  /* Adam: L2 added to the gradient, default 0;
                             AdamW: decoupled decay theta *= 1 - lr*wd, default 1e-2 */
} dt_adam_params;
/* Adam defaults (weight_decay 0). */
DT_API dt_adam_params dt_adam_params_default(void);
/* AdamW defaults (weight_decay 1e-2). */
DT_API dt_adam_params dt_adamw_params_default(void);

/* apex FusedLAMB (SEMANTICS.md 9.1); defaults are apex's code defaults. */
typedef struct dt_lamb_params {
    double lr;             /* learning rate; default 1e-3 */
    double beta1;          /* default 0.9 */
    double beta2;          /* default 0.999 */
    double eps;            /* default 1e-6 (apex code; its docstring says 1e-8) */
    double weight_decay;   /* default 0.01 (apex code; its docstring says 0) */
    double max_grad_norm;  /* global grad norm above which grads are scaled down;
                              default 1.0; <= 0 disables */
    bool bias_correction;  /* divide moments by 1 - beta^step; default true */
    bool adam_w_mode;      /* true: decoupled decay added to the update; false:
                              L2 added to the gradient; default true */
    bool grad_averaging;   /* true: m = b1*m + (1-b1)*g; false: m = b1*m + g; default true */
    bool use_nvlamb;       /* apply the trust ratio also when weight decay is 0; default false */
} dt_lamb_params;
DT_API dt_lamb_params dt_lamb_params_default(void);

/* ---- optimizers ---------------------------------------------------------------- */

typedef struct dt_optim dt_optim;

typedef enum {
    DT_OPTIM_SGD = 0,
    DT_OPTIM_ADAM,
    DT_OPTIM_ADAMW,
    DT_OPTIM_LAMB,
    DT_OPTIM_KIND_COUNT
} dt_optim_kind;

/* Create an optimizer over the layout's range. Returns NULL (error set) on a
 * bad layout (segments unsorted/overlapping, hi < lo) or bad parameters
 * (negative lr, beta outside [0, 1), nesterov without momentum...). */
DT_API dt_optim *dt_optim_sgd_init(const dt_sgd_params *p, const dt_optim_layout *l);
DT_API dt_optim *dt_optim_adam_init(const dt_adam_params *p, const dt_optim_layout *l);
DT_API dt_optim *dt_optim_adamw_init(const dt_adam_params *p, const dt_optim_layout *l);
DT_API dt_optim *dt_optim_lamb_init(const dt_lamb_params *p, const dt_optim_layout *l);
/* Free the optimizer and its state; NULL is a no-op. */
DT_API void dt_optim_free(dt_optim *o);

/* One optimizer step. params and grads point at element `lo` of the flat
 * buffers (pass flat + lo when you hold the whole buffer) and hold hi - lo
 * elements. SGD and Adam(W) only read grads; LAMB overwrites grads with its
 * update direction, as apex does (zero them before the next backward anyway).
 * Increments the step count. Errors: NULL pointers, a failing reducer. */
DT_API dt_status dt_optim_step(dt_optim *o, float *params, float *grads);

/* Sums partial sums of squares over the ranks that share a flat buffer, in
 * place (an all-reduce SUM of n doubles). Called by LAMB twice per step with
 * the same n on every rank: once with n = 1 (the squared global grad norm),
 * once with n = 2 * nseg_total (squared per-tensor ‖w‖ then ‖u‖, indexed by
 * the segment's position in the layout's list; zeros for segments outside
 * this rank's range). Return DT_OK or an error, which step() passes on. */
typedef dt_status (*dt_optim_reduce_fn)(void *ctx, double *sums, size_t n);
/* Install (or with fn NULL, remove) the reducer. Without one, norms are local. */
DT_API void dt_optim_set_reducer(dt_optim *o, dt_optim_reduce_fn fn, void *ctx);

/* With on, each step leaves the owned range of grads zeroed, in the same
 * pass that reads them (saves a separate zero_grad pass over the buffer;
 * default off). Only the owned range is zeroed: under ZeRO, zero the rest
 * of the buffer yourself if you use it. */
DT_API void dt_optim_set_zero_grad(dt_optim *o, bool on);

DT_API dt_optim_kind dt_optim_get_kind(const dt_optim *o);
/* "sgd", "adam", "adamw", "lamb". */
DT_API const char *dt_optim_kind_name(dt_optim_kind k);
/* The reverse; DT_ERR_INVALID_ARG for an unknown name. */
DT_API dt_status dt_optim_kind_parse(const char *s, dt_optim_kind *out);
/* Current learning rate (schedules set it before each step). */
DT_API double dt_optim_get_lr(const dt_optim *o);
DT_API void dt_optim_set_lr(dt_optim *o, double lr);
/* Steps taken so far (0 before the first). Setting it is for resuming from a
 * checkpoint together with the state buffers. */
DT_API int64_t dt_optim_get_step(const dt_optim *o);
DT_API void dt_optim_set_step(dt_optim *o, int64_t step);
/* The global grad norm LAMB saw in its last step (before clipping), 0 before. */
DT_API double dt_optim_last_grad_norm(const dt_optim *o);

/* State buffers, for checkpoints: index 0.. in a fixed order per kind
 * (SGD with momentum: "momentum_buffer"; Adam/AdamW/LAMB: "exp_avg",
 * "exp_avg_sq"). Each has hi - lo floats, laid out like the owned range.
 * Returns the number of state buffers; *name and *data may be NULL. The
 * pointer is owned by the optimizer and writable (to restore a checkpoint). */
DT_API int dt_optim_num_states(const dt_optim *o);
DT_API dt_status dt_optim_state(dt_optim *o, int i, const char **name, float **data, size_t *n);

/* ---- layouts of models (nn.h) ----------------------------------------------------- */

struct dt_model;
/* Fill segs[0..*n) with the parameter tensors of model m in model order
 * (buffers are not optimised). With no_decay_1d, tensors of one dimension
 * (biases, norm weights) get no_decay = true, the usual recipe for AdamW
 * and LAMB. cap is the room in segs; *n receives the count needed
 * (DT_ERR_RANGE when cap is too small). Use with
 * dt_optim_layout{.lo, .hi, .segs, .nseg = *n} over dt_model_flat_numel. */
DT_API dt_status dt_optim_segments_from_model(const struct dt_model *m, bool no_decay_1d,
                                              dt_optim_segment *segs, size_t cap, size_t *n);

/* ---- gradient clipping ------------------------------------------------------------ */

/* torch.nn.utils.clip_grad_norm_ (norm type 2) over a flat buffer: computes
 * the L2 norm of g[0..n), and if max_norm > 0 multiplies g by
 * min(1, max_norm / (norm + 1e-6)). *total_norm (may be NULL) receives the
 * norm before clipping; max_norm <= 0 only measures (DeepSpeed's
 * gradient_clipping default 0.0 means disabled, SEMANTICS 1.5; its clip
 * uses the same max_norm / (norm + 1e-6) factor). The sum of squares is taken in double in a fixed
 * order (independent of the thread count). Returns DT_ERR_NULL on a NULL g
 * with n > 0. A non-finite norm is returned as is and g is left alone. */
DT_API dt_status dt_clip_grad_norm(float *g, size_t n, float max_norm, float *total_norm);
/* The pieces, for sharded gradients: the partial sum of squares of g[0..n)
 * (sum these over ranks, then sqrt), and the scaling step given the total. */
DT_API double dt_grad_sqnorm(const float *g, size_t n);
DT_API void dt_grad_clip_apply(float *g, size_t n, float total_norm, float max_norm);

/* ---- learning-rate schedules ----------------------------------------------------- */

typedef enum {
    DT_SCHED_CONSTANT = 0,  /* lr = base_lr */
    DT_SCHED_STEP,          /* torch StepLR: base_lr * gamma^(step / step_size) */
    DT_SCHED_COSINE,        /* linear warm-up then cosine decay to min_lr */
    DT_SCHED_KIND_COUNT
} dt_sched_kind;

typedef struct dt_sched_params {
    dt_sched_kind kind;     /* default DT_SCHED_CONSTANT */
    double base_lr;         /* peak learning rate; default 1e-3 */
    int64_t step_size;      /* STEP: steps per decay; default 1 */
    double gamma;           /* STEP: decay factor; default 0.1 */
    int64_t warmup_steps;   /* linear warm-up length (every kind); default 0 */
    int64_t total_steps;    /* COSINE: steps until min_lr is reached; default 1000 */
    double min_lr;          /* COSINE: floor; default 0 */
} dt_sched_params;
DT_API dt_sched_params dt_sched_params_default(void);

/* The learning rate for optimizer step `step` (0-based: the first step is 0),
 * a pure function so a resumed run gets the same values.
 * COSINE (HF get_cosine_schedule_with_warmup, with a floor):
 *   step < warmup:  base_lr * step / warmup            (step 0 has lr 0)
 *   else:           p = min(1, (step - warmup) / max(1, total - warmup))
 *                   min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * p))
 * STEP: base_lr * gamma^floor(step / step_size). CONSTANT: base_lr.
 * With warmup_steps > 0, STEP and CONSTANT are multiplied by step / warmup
 * while step < warmup (the same linear ramp; step 0 has lr 0). */
DT_API double dt_sched_lr(const dt_sched_params *p, int64_t step);
/* "constant", "step", "cosine" <-> kind; parse returns DT_ERR_INVALID_ARG. */
DT_API const char *dt_sched_kind_name(dt_sched_kind k);
DT_API dt_status dt_sched_kind_parse(const char *s, dt_sched_kind *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */
