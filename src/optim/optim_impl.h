/* src/optim/optim_impl.h — internals shared by the optimizer files.
 *
 * Each owned range [lo, hi) is cut into work items: pieces of one segment
 * (tensor) of at most DT__OPTIM_CHUNK elements. The items of all ranges form
 * one list, the unit of parallelism (a step is one parallel loop over it)
 * and of norm accumulation: each item's partial sums land in its own slot
 * and are added in item order afterwards, so sums depend neither on the
 * thread count nor on how the elements are split into ranges. Segments are
 * numbered in one table over all ranges: a tensor named by two ranges over
 * the same params flat (same flat pointer, same offset) is one segment.
 *
 * Items are cut at fixed global boundaries (the segment's offset plus
 * multiples of DT__OPTIM_CHUNK), so the pieces of a tensor that adjacent
 * ranges own fall into the same chunks a single range would have. LAMB's
 * sums of squares are taken per norm unit: a maximal run of items of one
 * chunk that are contiguous in one params/grads flat pair, read straight
 * from the flats. A unit of one item is that item (the common case: its
 * ‖u‖² comes fused with stage 1); a unit that several ranges share is read
 * in one piece, so its sum, and every norm, is bit-identical to the
 * single-range optimizer's. */
#ifndef DT_OPTIM_IMPL_H
#define DT_OPTIM_IMPL_H

#include "dtrain/optim.h"

#define DT__OPTIM_CHUNK 16384

typedef struct dt__optim_item {
    size_t range;    /* index of its range */
    size_t start;    /* local index in the range (global - lo) */
    size_t len;
    size_t seg;      /* index of the segment in the optimizer's table */
    bool no_decay;
} dt__optim_item;

typedef struct dt__optim_unit {
    size_t seg;      /* segment table index */
    size_t gstart;   /* first global element */
    size_t len;
    size_t range;    /* a range over its flats (all of the unit's share them) */
    size_t first;    /* its items: uitems[first .. first + count) */
    size_t count;
} dt__optim_unit;

typedef struct dt__optim_range {
    const dt_flat *params, *grads; /* borrowed */
    const dt_flat *mirror;         /* borrowed; NULL: none */
    size_t lo, hi;
    float *state[2];               /* hi - lo floats each */
    float *g32;                    /* f32 copy of low-precision grads (hi - lo floats; written by unscale_pass
                                      before any read, untouched by the fused step: no pages until then);
                                      NULL for f32 grads */
} dt__optim_range;

struct dt_optim {
    dt_optim_kind kind;
    dt_sgd_params sgd;
    dt_adam_params adam;
    dt_lamb_params lamb;
    dt_lion_params lion;
    double lr;
    int64_t step;
    size_t nrange;
    dt__optim_range *ranges;
    float **pbase, **gbase; /* per range, element lo, resolved at each step (gbase: f32 view) */
    void **mbase;           /* per range, the mirror's element lo, or NULL */
    bool grads_ready;       /* dt_optim_unscale_grads ran since the last step */
    size_t nitem;
    dt__optim_item *items;
    size_t nunit;
    dt__optim_unit *units; /* in segment order, then by position */
    size_t *uitems;        /* item indices, grouped by unit */
    double *unit_sums;     /* 2 per unit */
    size_t *seg_off;       /* per segment: its offset (global) */
    size_t nseg;           /* segments in the table */
    double *item_sums;     /* 2 per item */
    double *seg_sums;      /* 2 per segment */
    float *seg_ratio;      /* LAMB: lr * trust ratio per segment */
    bool *seg_no_decay;    /* per segment */
    int nstate;
    const char *state_name[2];
    dt_optim_reduce_fn reduce;
    void *reduce_ctx;
    double last_gnorm;
    bool zero_grad;
};

/* Element kernels (optim_kernels.c): AVX-512 (16 lanes) or AVX2+FMA when the
 * CPU has it, otherwise scalar code; all three compute bit-identical results
 * (fmaf, same summation pattern). */
typedef struct dt__sgd_k {
    float wd, momentum, one_minus_damp, neg_lr;
    bool has_wd, has_momentum, nesterov, first, zero_grad;
} dt__sgd_k;
void dt__optim_sgd(float *p, float *g, float *buf, size_t n, const dt__sgd_k *k);

typedef struct dt__adam_k {
    float wd;           /* Adam: L2 coefficient (0 = none) */
    float decay;        /* AdamW: 1 - lr*wd (1 = none) */
    float b1, omb1, b2, omb2, bc2_sqrt, eps, neg_step_size;
    bool l2, decoupled, zero_grad;
} dt__adam_k;
void dt__optim_adam(float *p, float *g, float *m, float *v, size_t n, const dt__adam_k *k);
/* Adam/AdamW over bf16 grads in one sweep: each grad widened (exact),
 * the master and moments stepped as dt__optim_adam steps them, the new
 * master rounded to nearest even into copy (NULL: none) as dt_k_convert
 * rounds it, and the grad zeroed when k->zero_grad: the bits of widen +
 * dt__optim_adam + dt_k_convert, with p, m, v, g and copy each touched
 * once. */
void dt__optim_adam_bf16(float *p, uint16_t *g, float *m, float *v, uint16_t *copy, size_t n, const dt__adam_k *k);

/* A range's flats, dtypes and bounds (not its memory), "range i" in errors. */
dt_status dt__optim_check_range(const dt_optim_range *r, size_t i);

/* The kernel constants of o's next step (its lr, step count, zero_grad), for
 * decaying tensors (k) and no-decay ones (k_nd); optim.c and optim_part.c. */
void dt__optim_sgd_k_make(const dt_optim *o, dt__sgd_k *k, dt__sgd_k *k_nd);
void dt__optim_adam_k_make(const dt_optim *o, dt__adam_k *k, dt__adam_k *k_nd);

typedef struct dt__lion_k {
    float b1, omb1, b2, omb2, neg_lr;
    float decay;        /* 1 - lr*wd (1 = none) */
    bool zero_grad;
} dt__lion_k;
/* p = p*decay - lr*sign(b1*m + omb1*g) (sign(0) = 0); m = b2*m + omb2*g; g = 0 with zero_grad. */
void dt__optim_lion(float *p, float *g, float *m, size_t n, const dt__lion_k *k);
void dt__optim_lion_k_make(const dt_optim *o, dt__lion_k *k, dt__lion_k *k_nd);

typedef struct dt__lamb_k {
    float clip;         /* divisor of the gradient (>= 1) */
    float decay;        /* weight decay of this tensor */
    float b1, b3, b2, omb2, bc1, bc2, eps;
    bool adam_w_mode;
} dt__lamb_k;
/* Stage 1: writes the update u into g, updates m and v; returns sum(u^2). */
double dt__optim_lamb_stage1(const float *p, float *g, float *m, float *v, size_t n, const dt__lamb_k *k);
/* Stage 2: p -= ratio * u; then u = 0 when zero_grad. */
void dt__optim_lamb_stage2(float *p, float *u, size_t n, float ratio, bool zero_grad);

/* Tests: force the scalar kernels (true) or pick by CPU again (false). */
void dt__optim_force_scalar(bool on);
/* Tests: use the kernels of level 0 (scalar), 1 (AVX2+FMA) or 2 (AVX-512);
 * -1 picks by CPU again. False (nothing changed) when the CPU, as
 * dt_cpu_detect() reports it, lacks that level. */
bool dt__optim_force_level(int level);
/* True when the AVX2+FMA kernels are in use. */
bool dt__optim_simd_active(void);

/* Sum of squares in double, fixed order. */
double dt__sqsum(const float *x, size_t n);
/* x *= s. */
void dt__scale(float *x, size_t n, float s);

#endif
