/* dtrain/optim.h — fused optimizers over flat buffers, clipping, LR schedules.
 *
 * Overview
 * --------
 * A model keeps its parameters in typed flat buffers (dt_flat, tensor.h; one
 * per dtype) and the gradients in mirror flats (nn.h). An optimizer steps a
 * LIST of ranges: each names a params flat and a grads flat (their dtypes
 * come with them) and the global element range [lo, hi) of them it owns.
 * DDP steps one range over the whole f32 flat; ZeRO gives each rank an
 * equal shard (dt_flat_shard) and every rank steps its own range; a model
 * with parameters of two dtypes has one range per flat. All ranges are
 * updated in one fused pass per step (two or three for LAMB, which needs
 * norms first). The optimizer allocates and owns its state (momentum,
 * exp_avg, exp_avg_sq) for exactly hi - lo elements per range; the whole
 * pages of it outside every segment are never written and hold no memory
 * (a range that spans other ranks' tensors between its own, as an
 * interleaved pipeline rank's, pays only for its own).
 *
 * Ranges hold POINTERS to the flats and read their base at every step, so
 * a flat whose memory moves (dt_model_set_grads: DDP's shared memory) is
 * followed. A flat may hold only part of the buffer (a shard view: its
 * offset is the global index of its first element); it must hold [lo, hi).
 *
 * Mixed precision (apex O2, DeepSpeed's fp16/bf16 optimizers): a range's
 * params are the fp32 MASTER weights (dt_optim_master_alloc makes them from
 * the model's bf16/f16 flat for [lo, hi)), its grads may be the model's
 * bf16/f16 gradients (read as f32: widened into an f32 copy the optimizer
 * owns), and its `mirror` is the model's compute-dtype flat, rewritten from
 * the master after every step. Optimizer states are always f32. The update
 * of the master equals an f32 optimizer's on the same (widened) gradients,
 * bit for bit.
 *
 * A range's segments name the per-tensor pieces of its params flat (offset,
 * numel, in global element indices). Elements outside every segment
 * (alignment padding) are never touched. LAMB needs the segments for its
 * per-tensor trust ratio; for a range, each segment is clipped to [lo, hi),
 * and segments that two ranges over the same params flat (the same
 * dt_flat pointer) both name are one tensor whose norms add up. When a
 * tensor is split across ranks, its norms are partial on each rank: install
 * a reducer (dt_optim_set_reducer) that sums the partial sums of squares
 * over the ranks (an all-reduce), and every rank sees the full norms.
 *
 * Semantics follow the reference implementations to the last ulp where they
 * are CPU code (torch.optim SGD, Adam, AdamW of PyTorch 1.13 on an AVX2 CPU:
 * `add(alpha)` and `addcmul` are fused multiply-adds there, so they are here)
 * and follow the formula order of apex FusedLAMB's CUDA kernel without
 * contraction. Hyper-parameters are doubles because PyTorch computes
 * `1 - beta1`, `lr / bias_correction1`, ... in double and rounds the result
 * to float once; apex receives floats and we round to float where it does.
 * How the elements are split into ranges does not change any result bit.
 *
 * Lifecycle: dt_optim_*_init() creates a handle into *out that owns its
 * state; free it with dt_optim_free() (NULL is a no-op). The flats a range
 * points at are borrowed and must outlive the optimizer.
 *
 * Usage
 * -----
 *     const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
 *     dt_optim_segment segs[64]; size_t nseg;
 *     dt_optim_segments_from_model(m, DT_F32, false, segs, 64, &nseg);
 *     dt_optim_range r = {.params = P, .grads = G, .lo = 0, .hi = P->total, .segs = segs, .nseg = nseg};
 *     dt_sgd_params sp = dt_sgd_params_default();
 *     sp.lr = 0.1; sp.momentum = 0.9;
 *     dt_optim *opt;
 *     if (dt_optim_sgd_init(&sp, &r, 1, &opt) < 0) { report dt_last_error(); }
 *     for (step...) {
 *         ... backward fills the grads flat ...
 *         dt_clip_grad_norm(G->base, G->total, 1.0f, NULL);  // optional
 *         dt_optim_set_lr(opt, dt_sched_lr(&sched, step));
 *         dt_optim_step(opt);
 *     }
 *     dt_optim_free(opt);
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include "dtrain/base.h"
#include "dtrain/tensor.h"

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

/* One range an optimizer owns: elements [lo, hi) of a params flat and the
 * grads flat that mirrors it. */
typedef struct dt_optim_range {
    const dt_flat *params;         /* updated in place (f32: under mixed precision the fp32
                                      master weights); borrowed, read at every step */
    const dt_flat *grads;          /* same layout; f32, bf16 or f16 (read as f32); borrowed,
                                      read at every step */
    const dt_flat *mirror;         /* NULL, or the compute-dtype copy of params (bf16, f16 or
                                      f32; same global indices; must hold [lo, hi)): its
                                      [lo, hi) is rewritten from params, rounded to nearest
                                      even, after each step; borrowed */
    size_t lo;                     /* first owned element (global index) */
    size_t hi;                     /* one past the last owned element; hi >= lo */
    const dt_optim_segment *segs;  /* per-tensor segments, sorted by offset, disjoint;
                                      copied at init. NULL: [lo, hi) is one tensor */
    size_t nseg;                   /* number of segments (0 with segs == NULL) */
} dt_optim_range;

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

/* apex FusedLAMB; defaults are apex's code defaults. */
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

/* Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms";
 * DeepSpeed's FusedLion): c = beta1*m + (1-beta1)*g; p = p*(1 - lr*wd) -
 * lr*sign(c); m = beta2*m + (1-beta2)*g. sign(0) is 0, as torch.sign's (a
 * parameter whose gradient and momentum are 0 does not move). */
typedef struct dt_lion_params {
    double lr;            /* default 1e-3 (DeepSpeed's FusedLion) */
    double beta1;         /* interpolation of the update; default 0.9 */
    double beta2;         /* momentum decay; default 0.999 (FusedLion's; the paper uses 0.99) */
    double weight_decay;  /* decoupled, as AdamW's; default 0 */
} dt_lion_params;
DT_API dt_lion_params dt_lion_params_default(void);

/* ---- optimizers ---------------------------------------------------------------- */

typedef struct dt_optim dt_optim;

typedef enum {
    DT_OPTIM_SGD = 0,
    DT_OPTIM_ADAM,
    DT_OPTIM_ADAMW,
    DT_OPTIM_LAMB,
    DT_OPTIM_LION,
    DT_OPTIM_KIND_COUNT
} dt_optim_kind;

/* Create an optimizer over ranges[0..nrange) into *out (NULL on error).
 * Errors: DT_ERR_NULL (p, out, a range's flats), DT_ERR_INVALID_ARG (hi <
 * lo, segments unsorted/overlapping, two ranges overlapping in one params
 * flat, negative lr, beta outside [0, 1), nesterov without momentum...),
 * DT_ERR_DTYPE (params not f32; grads or mirror not f32/bf16/f16). */
DT_API dt_status dt_optim_sgd_init(const dt_sgd_params *p, const dt_optim_range *ranges, size_t nrange,
                                   dt_optim **out);
DT_API dt_status dt_optim_adam_init(const dt_adam_params *p, const dt_optim_range *ranges, size_t nrange,
                                    dt_optim **out);
DT_API dt_status dt_optim_adamw_init(const dt_adam_params *p, const dt_optim_range *ranges, size_t nrange,
                                     dt_optim **out);
DT_API dt_status dt_optim_lamb_init(const dt_lamb_params *p, const dt_optim_range *ranges, size_t nrange,
                                    dt_optim **out);
DT_API dt_status dt_optim_lion_init(const dt_lion_params *p, const dt_optim_range *ranges, size_t nrange,
                                    dt_optim **out);
/* The init of `kind` with hparams pointing at its params struct (SGD:
 * dt_sgd_params, ADAM/ADAMW: dt_adam_params, LAMB: dt_lamb_params, LION:
 * dt_lion_params); DT_ERR_INVALID_ARG for an unknown kind. */
DT_API dt_status dt_optim_init(dt_optim_kind kind, const void *hparams, const dt_optim_range *ranges, size_t nrange,
                               dt_optim **out);
/* Free the optimizer and its state; NULL is a no-op. */
DT_API void dt_optim_free(dt_optim *o);

/* One optimizer step over every range, in one fused pass. SGD and Adam(W)
 * only read grads; LAMB overwrites grads with its update direction, as apex
 * does (zero them before the next backward anyway). Increments the step
 * count. Errors: DT_ERR_NULL / DT_ERR_RANGE when a flat has no memory or no
 * longer holds its range (nothing is updated then), a failing reducer. */
DT_API dt_status dt_optim_step(dt_optim *o);

/* One step of elements [part->lo, part->hi) of part's flats with the
 * optimizer state of exactly those elements in caller memory: state[i]
 * holds hi - lo floats of state i (dt_optim_state's order; SGD without
 * momentum has none and state may be NULL). Uses o's kind,
 * hyper-parameters, learning rate, step count and zero-grad setting; o's
 * own ranges and state are not touched and its step count does not
 * advance (dt_optim_set_step after the last part). The result is
 * bit-identical to dt_optim_step over a range covering the part. This is
 * how the offload driver (offload.h) steps sub-groups whose state lives in
 * files: it creates o over no ranges (nrange 0), so o allocates no state.
 * SGD, Adam, AdamW and Lion: DT_ERR_UNSUPPORTED for LAMB (its trust ratio
 * needs whole-tensor norms) and for a part with a mirror or non-f32
 * gradients (mixed precision is not stepped by parts yet). Errors as dt_optim_step, DT_ERR_NULL for a
 * missing state buffer. */
DT_API dt_status dt_optim_step_part(dt_optim *o, const dt_optim_range *part, float *const *state);

/* Sums partial sums of squares over the ranks that share a flat buffer, in
 * place (an all-reduce SUM of n doubles). Called by LAMB twice per step with
 * the same n on every rank: once with n = 1 (the squared global grad norm),
 * once with n = 2 * nseg_total (squared per-tensor ‖w‖ then ‖u‖, indexed by
 * the segment's position in the optimizer's table: the segments of all
 * ranges in order, a segment named twice counted once; zeros for segments
 * outside this rank's ranges). Return DT_OK or an error, which step() passes on. */
typedef dt_status (*dt_optim_reduce_fn)(void *ctx, double *sums, size_t n);
/* Install (or with fn NULL, remove) the reducer. Without one, norms are local. */
DT_API void dt_optim_set_reducer(dt_optim *o, dt_optim_reduce_fn fn, void *ctx);

/* With on, each step leaves the owned range of grads zeroed, in the same
 * pass that reads them (saves a separate zero_grad pass over the buffer;
 * default off). Only the owned range is zeroed: under ZeRO, zero the rest
 * of the buffer yourself if you use it. */
DT_API void dt_optim_set_zero_grad(dt_optim *o, bool on);

DT_API dt_optim_kind dt_optim_get_kind(const dt_optim *o);
/* The f32 state buffers a kind keeps per element (SGD: 1 with momentum, else 0; Adam, AdamW, LAMB: 2;
 * Lion: 1); -1 for an unknown kind. */
DT_API int dt_optim_kind_num_states(dt_optim_kind k, bool sgd_momentum);
/* "sgd", "adam", "adamw", "lamb", "lion". */
DT_API const char *dt_optim_kind_name(dt_optim_kind k);
/* The reverse; DT_ERR_INVALID_ARG for an unknown name. */
DT_API dt_status dt_optim_kind_parse(const char *s, dt_optim_kind *out);
/* Current learning rate (schedules set it before each step). Setting a NaN,
 * an infinity or a negative rate is DT_ERR_INVALID_ARG and keeps the old one
 * (every following step would have written NaN into the parameters). */
DT_API double dt_optim_get_lr(const dt_optim *o);
DT_API dt_status dt_optim_set_lr(dt_optim *o, double lr);
/* Steps taken so far (0 before the first). Setting it is for resuming from a
 * checkpoint together with the state buffers; a negative step is
 * DT_ERR_INVALID_ARG. */
DT_API int64_t dt_optim_get_step(const dt_optim *o);
DT_API dt_status dt_optim_set_step(dt_optim *o, int64_t step);
/* Adam, AdamW, LAMB and Lion: the betas of the next steps (a schedule may move
 * them, DeepSpeed's OneCycle does; bias correction uses the betas of the
 * step, as torch's Adam and DeepSpeed's FusedAdam do). Betas outside [0, 1)
 * are DT_ERR_INVALID_ARG, SGD DT_ERR_UNSUPPORTED; the old ones are kept. */
DT_API dt_status dt_optim_set_betas(dt_optim *o, double beta1, double beta2);
/* The betas of the next step; DT_ERR_UNSUPPORTED for SGD. */
DT_API dt_status dt_optim_get_betas(const dt_optim *o, double *beta1, double *beta2);
/* The global grad norm LAMB saw in its last step (before clipping), 0 before. */
DT_API double dt_optim_last_grad_norm(const dt_optim *o);

/* State buffers, for checkpoints: index 0.. in a fixed order per kind
 * (SGD with momentum: "momentum_buffer"; Adam/AdamW/LAMB: "exp_avg",
 * "exp_avg_sq"; Lion: "exp_avg"), one set per range. State i of range r has hi - lo floats,
 * laid out like the range. dt_optim_num_states gives the states per range;
 * *name, *data and *n may be NULL. The pointer is owned by the optimizer and
 * writable (to restore a checkpoint). */
DT_API int dt_optim_num_states(const dt_optim *o);
DT_API size_t dt_optim_num_ranges(const dt_optim *o);
/* Elements of range `range` whose state the optimizer holds in memory:
 * hi - lo less the gaps between its segments longer than an entry's
 * alignment padding (DT_ALIGN elements), which it never touches and whose
 * whole pages hold no memory (an interleaved pipeline rank's range spans
 * the other ranks' stages between its own). 0 for a NULL o or a range out
 * of bounds. dt_trainer_memory_get counts states, fp32 masters and f32
 * gradient copies by it. */
DT_API size_t dt_optim_range_held(const dt_optim *o, size_t range);
DT_API dt_status dt_optim_state(dt_optim *o, size_t range, int i, const char **name, float **data, size_t *n);
/* State i by name ("exp_avg"): its index, or -1 when this kind has none. */
DT_API int dt_optim_state_find(const dt_optim *o, const char *name);
/* Per-parameter export and import (checkpoints): copy global elements
 * [lo, hi) of state i, over the ranges whose params flat is `params`, to
 * dst (hi - lo floats) or from src. A parameter tensor's state is the
 * segment [offset, offset + numel) of it; under a sharded strategy ask for
 * the part of it this rank owns. DT_ERR_RANGE naming the first element no
 * range over `params` owns (nothing copied then); DT_ERR_NULL. */
DT_API dt_status dt_optim_state_read(const dt_optim *o, const dt_flat *params, int i, size_t lo, size_t hi,
                                     float *dst);
DT_API dt_status dt_optim_state_write(dt_optim *o, const dt_flat *params, int i, size_t lo, size_t hi,
                                      const float *src);

/* ---- mixed precision: master weights and gradient preparation ------------------- */

/* Allocate into *master an f32 flat holding global elements [lo, hi) of the
 * layout of `lp` (a model's bf16/f16/f32 parameter flat, or a shard view of
 * it, which must hold [lo, hi)), filled with lp's values widened to f32: the
 * fp32 master weights of a range. Same total/used/world as lp; offset lo.
 * Free with dt_flat_free. Errors: DT_ERR_NULL, DT_ERR_RANGE (lp does not
 * hold the range), DT_ERR_DTYPE (not a float dtype), DT_ERR_NO_MEMORY. */
DT_API dt_status dt_optim_master_alloc(const dt_flat *lp, size_t lo, size_t hi, dt_flat *master);
/* The same for a range whose segments (sorted, disjoint; clipped to
 * [lo, hi)) are all it steps: only their elements are widened; the rest of
 * [lo, hi) reads as zero and holds no memory (dt_decommit), as the
 * optimizer's state there. nseg 0: the whole range (dt_optim_master_alloc).
 * DT_ERR_INVALID_ARG for unsorted or overlapping segments, else as above. */
DT_API dt_status dt_optim_master_alloc_segments(const dt_flat *lp, size_t lo, size_t hi, const dt_optim_segment *segs,
                                                size_t nseg, dt_flat *master);

/* One fused pass over the gradients of every range (GradScaler's
 * unscale_): each element is read as f32 (bf16/f16 grads are widened),
 * multiplied by inv_scale (skipped when it is 1) and checked: *found_inf
 * (may be NULL) is set when any element of the owned ranges is inf or NaN.
 * Every element is multiplied even after a non-finite one is seen. f32
 * grads are updated in place; the f32 values of low-precision grads go to
 * the optimizer's own f32 gradient copy of the range (hi - lo floats,
 * allocated at init for such ranges), which the next dt_optim_step reads,
 * and the low-precision grads are zeroed when zero_grad is on. Without this
 * call, dt_optim_step widens low-precision grads itself (inv_scale 1).
 * Errors: as dt_optim_step's range checks. */
DT_API dt_status dt_optim_unscale_grads(dt_optim *o, float inv_scale, bool *found_inf);
/* The f32 gradients range r's step will read: the grads flat itself for f32
 * grads, the optimizer's copy otherwise (valid after dt_optim_unscale_grads;
 * borrowed, writable: clipping scales them). *g may be NULL for an empty range. */
DT_API dt_status dt_optim_grads_f32(dt_optim *o, size_t r, float **g, size_t *n);

/* ---- loss scaling ----------------------------------------------------------------- */

/* Dynamic loss scaling for fp16 training. The trainer multiplies the loss by
 * dt_loss_scaler_scale() before backward; after the gradients are reduced it
 * unscales them and checks for inf/NaN in one pass
 * (dt_optim_unscale_grads), agrees on the flag across every rank (MAX over
 * the process group: ShardedGradScaler's rule, needed once gradients are
 * sharded), skips the step when it is set, and calls
 * dt_loss_scaler_update(flag) once per step. Two rules are offered:
 *
 *   DEEPSPEED (the default): DeepSpeed's DynamicLossScaler (ZeRO path).
 *     Start at 2^initial_scale_power; an overflow uses up
 *     one unit of hysteresis, and once it is used up halves the scale (not
 *     below min_loss_scale); after loss_scale_window clean steps in a row
 *     the scale doubles and the hysteresis refills (consecutive_hysteresis:
 *     every clean step refills it). No upper cap.
 *   TORCH: torch.amp.GradScaler: start at init_scale;
 *     an overflow multiplies by backoff_factor, growth_interval clean steps
 *     in a row multiply by growth_factor; the scale is kept in f32.
 *     GradScaler has no floor; here min_loss_scale applies too.
 *
 * An overflow while the scale is at min_loss_scale (and, DEEPSPEED, no
 * hysteresis is left) returns DT_ERR_RANGE naming the scale and the count
 * of overflowing steps instead of skipping forever (DeepSpeed raises there
 * too). loss_scale > 0 is a static scale: it never changes (overflowed
 * steps are still skipped and counted); DT_LOSS_SCALER_STATIC_MAX_RUN
 * overflowing steps in a row under it return DT_ERR_RANGE (the scale is too
 * large: DeepSpeed would apply those non-finite gradients; skipping them for
 * ever would end a run that never stepped as a success). bf16 needs no
 * scaler (DeepSpeed forces scale 1 there).
 *
 *     dt_loss_scaler_params sp = dt_loss_scaler_params_default();  // DeepSpeed's fp16 defaults
 *     dt_loss_scaler *ls;  dt_loss_scaler_init(&sp, &ls);
 *     for (step...) {
 *         float s = (float)dt_loss_scaler_scale(ls);   // backward of loss * s
 *         bool inf;  dt_optim_unscale_grads(opt, 1.0f / s, &inf);
 *         ... MAX-all-reduce inf over the ranks ...
 *         if (!inf) dt_optim_step(opt);               // else: zero the grads, leave everything
 *         if (dt_loss_scaler_update(ls, inf) < 0) fail(dt_last_error());
 *     }
 *     dt_loss_scaler_free(ls);
 */
typedef struct dt_loss_scaler dt_loss_scaler;

/* Overflowing steps in a row after which a static scale is an error. */
#define DT_LOSS_SCALER_STATIC_MAX_RUN 10

typedef enum dt_loss_scaler_kind {
    DT_LOSS_SCALER_DEEPSPEED = 0, /* DeepSpeed's fp16 dynamic scaler */
    DT_LOSS_SCALER_TORCH,         /* torch.amp.GradScaler */
    DT_LOSS_SCALER_KIND_COUNT
} dt_loss_scaler_kind;

typedef struct dt_loss_scaler_params {
    dt_loss_scaler_kind kind;     /* default DT_LOSS_SCALER_DEEPSPEED */
    double loss_scale;            /* > 0: static scale; 0: dynamic (DeepSpeed's fp16.loss_scale); default 0 */
    int initial_scale_power;      /* DEEPSPEED: initial scale 2^power, 0..127; default 16 */
    int64_t loss_scale_window;    /* DEEPSPEED: clean steps in a row before the scale doubles; default 1000 */
    int hysteresis;               /* DEEPSPEED: overflows absorbed before halving (>= 1); default 2 */
    bool consecutive_hysteresis;  /* DEEPSPEED: refill the hysteresis on every clean step; default false */
    double min_loss_scale;        /* floor of a dynamic scale (both kinds), > 0; default 1 */
    double init_scale;            /* TORCH: initial scale; default 65536 (2^16) */
    double growth_factor;         /* TORCH: > 1; default 2 */
    double backoff_factor;        /* TORCH: in (0, 1); default 0.5 */
    int64_t growth_interval;      /* TORCH: clean steps in a row before growing; default 2000 */
} dt_loss_scaler_params;
DT_API dt_loss_scaler_params dt_loss_scaler_params_default(void);

/* The whole mutable state: plain data to save in a checkpoint and restore
 * with dt_loss_scaler_set_state (the parameters are not part of it). */
typedef struct dt_loss_scaler_state {
    double scale;            /* the current scale */
    int64_t iter;            /* updates so far */
    int64_t last_overflow;   /* DEEPSPEED: iter of the last overflow; -1: none */
    int hysteresis_left;     /* DEEPSPEED: overflows still absorbed (1..hysteresis) */
    int64_t growth_tracker;  /* TORCH: clean updates since the last growth or backoff */
    int64_t skipped;         /* overflowed (skipped) steps in all */
    int64_t overflow_run;    /* overflowed steps in a row up to the last update */
} dt_loss_scaler_state;

/* A scaler into *out (p NULL: defaults). DT_ERR_INVALID_ARG for bad params. */
DT_API dt_status dt_loss_scaler_init(const dt_loss_scaler_params *p, dt_loss_scaler **out);
/* NULL is a no-op. */
DT_API void dt_loss_scaler_free(dt_loss_scaler *s);
/* The scale to multiply the loss by (1 for NULL). */
DT_API double dt_loss_scaler_scale(const dt_loss_scaler *s);
/* Whether the scale changes (loss_scale == 0). */
DT_API bool dt_loss_scaler_is_dynamic(const dt_loss_scaler *s);
/* Record one step's agreed overflow flag (call once per optimizer step,
 * with the same flag on every rank). DT_ERR_RANGE when an overflow hits the
 * floor, or the DT_LOSS_SCALER_STATIC_MAX_RUN-th overflow in a row of a
 * static scale (see above; the step counts as skipped). */
DT_API dt_status dt_loss_scaler_update(dt_loss_scaler *s, bool overflow);
/* Copy the state out / restore it (DT_ERR_FORMAT for an inconsistent one). */
DT_API void dt_loss_scaler_get_state(const dt_loss_scaler *s, dt_loss_scaler_state *out);
DT_API dt_status dt_loss_scaler_set_state(dt_loss_scaler *s, const dt_loss_scaler_state *st);
/* "deepspeed", "torch" <-> kind; parse returns DT_ERR_INVALID_ARG. */
DT_API const char *dt_loss_scaler_kind_name(dt_loss_scaler_kind k);
DT_API dt_status dt_loss_scaler_kind_parse(const char *s, dt_loss_scaler_kind *out);

/* ---- layouts of models (nn.h) ----------------------------------------------------- */

struct dt_model;
/* Fill segs[0..*n) with the parameter tensors of dtype `dtype` of model m
 * in model order (buffers are not optimised). With no_decay_1d, tensors of
 * one dimension (biases, norm weights) get no_decay = true, the usual recipe
 * for AdamW and LAMB. cap is the room in segs; *n receives the count needed
 * (DT_ERR_RANGE when cap is too small). Use with a dt_optim_range over
 * dt_model_flat(m, DT_FLAT_PARAMS, dtype). */
DT_API dt_status dt_optim_segments_from_model(const struct dt_model *m, dt_dtype dtype, bool no_decay_1d,
                                              dt_optim_segment *segs, size_t cap, size_t *n);

/* ---- gradient clipping ------------------------------------------------------------ */

/* torch.nn.utils.clip_grad_norm_ (norm type 2) over a flat buffer: computes
 * the L2 norm of g[0..n), and if max_norm > 0 multiplies g by
 * min(1, max_norm / (norm + 1e-6)). *total_norm (may be NULL) receives the
 * norm before clipping; max_norm <= 0 only measures (DeepSpeed's
 * gradient_clipping default 0.0 means disabled; its clip
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
    DT_SCHED_COSINE,        /* warm-up then cosine decay to min_lr */
    DT_SCHED_LINEAR,        /* warm-up then linear decay to min_lr (HF get_linear_schedule_with_warmup) */
    DT_SCHED_WARMUP_COSINE, /* DeepSpeed WarmupCosineLR: warm-up, cosine decay to base_lr * min_ratio */
    DT_SCHED_RANGE_TEST,    /* DeepSpeed LRRangeTest: base_lr * (1 + step_rate * step / step_size) */
    DT_SCHED_ONE_CYCLE,     /* DeepSpeed OneCycle: up and down between two rates, then a decay */
    DT_SCHED_KIND_COUNT
} dt_sched_kind;

/* How the warm-up ramps (DeepSpeed WarmupLR's warmup_type). */
typedef enum {
    DT_WARMUP_LINEAR = 0,   /* factor step / warmup (step 0 has lr 0) */
    DT_WARMUP_LOG           /* factor ln(step + 1) / ln(max(2, warmup)) (DeepSpeed's default) */
} dt_warmup_kind;

/* DT_SCHED_ONE_CYCLE's shape (DeepSpeed OneCycle's params). The cycle rises
 * from base_lr * min_ratio to base_lr over first_steps and falls back over
 * second_steps (0: first_steps), in that many stairs when a stair count is
 * > 0; then the rate decays as min / (1 + decay_lr_rate * t / decay_steps)
 * (none with decay_steps or the rate 0). With cycle_momentum the first beta
 * of Adam, AdamW, LAMB and Lion moves the other way between min_mom and max_mom
 * (dt_sched_beta1; the second beta is held at 0.99, as DeepSpeed holds it). */
typedef struct dt_one_cycle {
    double min_ratio;       /* cycle_min_lr / cycle_max_lr (base_lr is cycle_max_lr) */
    int64_t first_steps;    /* cycle_first_step_size; DeepSpeed's default 2000 */
    int64_t second_steps;   /* cycle_second_step_size; 0: first_steps */
    int64_t first_stairs;   /* cycle_first_stair_count; 0: continuous */
    int64_t second_stairs;  /* cycle_second_stair_count; -1: first_stairs */
    int64_t decay_steps;    /* decay_step_size; 0: no decay */
    double decay_lr_rate;   /* decay_lr_rate */
    bool cycle_momentum;    /* cycle_momentum (DeepSpeed's default true) */
    double min_mom, max_mom; /* cycle_min_mom 0.8, cycle_max_mom 0.9 */
    double decay_mom_rate;  /* decay_mom_rate */
} dt_one_cycle;

typedef struct dt_sched_params {
    dt_sched_kind kind;     /* default DT_SCHED_CONSTANT */
    double base_lr;         /* peak learning rate; default 1e-3 */
    int64_t step_size;      /* STEP: steps per decay; default 1 */
    double gamma;           /* STEP: decay factor; default 0.1 */
    int64_t warmup_steps;   /* warm-up length (every kind); default 0 (none) */
    int64_t total_steps;    /* COSINE, LINEAR: steps until min_lr is reached; default 1000 */
    double min_lr;          /* COSINE, LINEAR: floor; default 0 */
    dt_warmup_kind warmup;  /* the warm-up's ramp; default DT_WARMUP_LINEAR */
    double warmup_start;    /* the warm-up starts at base_lr * warmup_start (every kind; DeepSpeed's
                               warmup_min_ratio, or warmup_min_lr / warmup_max_lr); default 0 */
    double min_ratio;       /* WARMUP_COSINE: the floor, a fraction of base_lr (cos_min_ratio); default 1e-4 */
    double step_rate;       /* RANGE_TEST: the rate's growth per step_size steps; default 1 */
    bool staircase;         /* RANGE_TEST: grow once every step_size steps (floor), not every step; default false */
    int64_t lag;            /* the rate of step s is the schedule's at s - lag; the steps before take base_lr *
                               warmup_start (WARMUP_COSINE: 0). DeepSpeed's engine steps its scheduler after
                               each optimizer step, so its WarmupLR, WarmupDecayLR and WarmupCosineLR run one
                               step behind (lag 1; its LRRangeTest counts from 1 and needs none); default 0 */
    dt_one_cycle cycle;     /* ONE_CYCLE: its shape; default DeepSpeed's (min_ratio 0.1) */
} dt_sched_params;
DT_API dt_sched_params dt_sched_params_default(void);

/* The learning rate for optimizer step `step` (0-based: the first step is 0),
 * a pure function so a resumed run gets the same values. The warm-up
 * factor w(step), for step < warmup (1 afterwards, and always with warmup 0):
 *   DT_WARMUP_LINEAR:  s0 + (1 - s0) * step / warmup     (step 0 has lr base_lr * s0)
 *   DT_WARMUP_LOG:     s0 + (1 - s0) * ln(step + 1) / ln(max(2, warmup))
 *                      (DeepSpeed WarmupLR's "log" warmup_type)
 * where s0 is warmup_start (0 by default: step 0 has lr 0).
 * COSINE (HF get_cosine_schedule_with_warmup, with a floor):
 *   step < warmup:  base_lr * w(step)
 *   else:           p = min(1, (step - warmup) / max(1, total - warmup))
 *                   min_lr + (base_lr - min_lr) * 0.5 * (1 + cos(pi * p))
 * LINEAR (HF get_linear_schedule_with_warmup, with a floor):
 *   step < warmup:  base_lr * w(step)
 *   else:           min_lr + (base_lr - min_lr) * max(0, (total - step) / max(1, total - warmup))
 * WARMUP_COSINE (DeepSpeed WarmupCosineLR; its decay starts one step in):
 *   step < warmup:  base_lr * w(step)
 *   else:           p = min(1, (step - warmup + 1) / max(1, total - warmup))
 *                   base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + cos(pi * p)))
 * RANGE_TEST (DeepSpeed LRRangeTest): base_lr * (1 + step_rate * i), i = step / step_size,
 *   floored with staircase.
 * ONE_CYCLE (DeepSpeed OneCycle as its engine steps it; T = first + second):
 *   step <= T:  x = step / T - floor(step / T), f = first / T;
 *               c = x <= f ? x / f : (x - 1) / (f - 1)   (with a stair count: floor(q * stairs) / stairs,
 *               q the step's place in its half);  base_lr * (m + (1 - m) * c), m = min_ratio
 *   else:       base_lr * m / (1 + decay_lr_rate * (step - T) / decay_steps)  (base_lr * m without decay)
 * STEP: base_lr * gamma^floor(step / step_size). CONSTANT: base_lr.
 * With warmup_steps > 0, STEP, CONSTANT, RANGE_TEST and ONE_CYCLE are
 * multiplied by w(step) while step < warmup. With lag > 0 all of this is evaluated at
 * step - lag, and the first lag steps take base_lr * warmup_start (0 for
 * WARMUP_COSINE). */
DT_API double dt_sched_lr(const dt_sched_params *p, int64_t step);
/* ONE_CYCLE with cycle.cycle_momentum: the first beta of optimizer step
 * `step` into *beta1, true (DeepSpeed's: min_mom at step 0, then max_mom -
 * (max_mom - min_mom) * c through the cycle, max_mom * (1 + decay_mom_rate
 * * t / decay_steps) after it). False, *beta1 untouched, for any other. */
DT_API bool dt_sched_beta1(const dt_sched_params *p, int64_t step, double *beta1);
/* "constant", "step", "cosine", "linear", "warmup_cosine", "range_test", "one_cycle" <-> kind; parse
 * returns DT_ERR_INVALID_ARG. */
DT_API const char *dt_sched_kind_name(dt_sched_kind k);
DT_API dt_status dt_sched_kind_parse(const char *s, dt_sched_kind *out);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPTIM_H */
