/* Finite-difference gradient checking for the autograd tests.
 *
 * For an op f and fixed random weights R of f's output shape, the scalar
 * L(inputs) = sum(f(inputs) * R) (computed in double) has gradient
 * backward_with(f(inputs), R). Each checked input element is compared with
 * the central difference (L(x+h) - L(x-h)) / 2h evaluated in no-grad mode.
 * Inputs are persistent f32 tensors; RNG draws come from Philox keys. */
#ifndef DT_GRADCHECK_H
#define DT_GRADCHECK_H

#include "dtrain/autograd.h"
#include "test.h"

typedef dt_tensor *(*gc_fn)(dt_ctx *ctx, dt_tensor **in, void *ud);

/* Persistent f32 tensor, N(0,1) from key (seed, a), requires grad if rg. */
static inline dt_tensor *gc_tensor(int ndim, const int64_t *shape, uint64_t seed, bool rg)
{
    dt_tensor *t = dt_tensor_new(DT_F32, ndim, shape);
    if (!t)
        return NULL;
    dt_tensor_rand_normal(t, dt_rng_key_make(seed, DT_RNG_USER, 11, 0), 0.0f, 1.0f);
    if (rg)
        dt_tensor_set_requires_grad(t, true);
    return t;
}

/* Shift values so that |x| >= margin (keeps h-steps away from kinks). */
static inline void gc_away_from_zero(dt_tensor *t, float margin)
{
    float *p = t->data;
    for (int64_t i = 0; i < dt_tensor_numel(t); i++)
        if (fabsf(p[i]) < margin)
            p[i] = p[i] < 0 ? p[i] - margin : p[i] + margin;
}

/* Distinct values spaced `gap` apart in a random order (no ties for max). */
static inline void gc_distinct(dt_tensor *t, uint64_t seed, float gap)
{
    int64_t n = dt_tensor_numel(t);
    int64_t *perm = malloc((size_t)n * sizeof *perm);
    dt_rng_permutation(dt_rng_key_make(seed, DT_RNG_USER, 12, 0), perm, n);
    float *p = t->data;
    for (int64_t i = 0; i < n; i++)
        p[i] = ((float)perm[i] - (float)n / 2) * gap;
    free(perm);
}

static double gc_loss(dt_ctx *ctx, gc_fn f, dt_tensor **in, void *ud, const float *R, bool *ok)
{
    bool old = dt_ag_set_enabled(ctx, false);
    dt_tensor *out = f(ctx, in, ud);
    double s = NAN;
    if (out) {
        int64_t n = dt_tensor_numel(out);
        s = 0.0;
        for (int64_t i = 0; i < n; i++)
            s += dt_tensor_get(out, i) * (double)R[i];
    } else {
        *ok = false;
    }
    dt_ag_set_enabled(ctx, old);
    dt_ctx_reset(ctx);
    return s;
}

/* Returns the number of mismatches (0 = pass); prints the first few. */
static int gradcheck(const char *name, int nin, dt_tensor **in, gc_fn f, void *ud, double h,
                     double atol, double rtol)
{
    enum { GC_MAX_IN = 8 };
    if (nin < 0 || nin > GC_MAX_IN) {
        fprintf(stderr, "gradcheck %s: %d inputs (at most %d)\n", name, nin, GC_MAX_IN);
        return 1;
    }
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    int bad = 0;
    for (int i = 0; i < nin; i++)
        if (in[i] && in[i]->grad)
            dt_ag_zero_grad(in[i]);
    dt_tensor *out = f(ctx, in, ud);
    if (!out) {
        fprintf(stderr, "gradcheck %s: forward failed: %s\n", name, dt_last_error());
        dt_ctx_free(ctx);
        return 1;
    }
    int64_t no = dt_tensor_numel(out);
    float *R = malloc((size_t)(no ? no : 1) * sizeof(float));
    dt_rng_fill_normal(dt_rng_key_make(99, DT_RNG_USER, 13, 0), 0, R, (size_t)no, 0.0f, 1.0f);
    dt_tensor *Rt = dt_tensor_from(ctx, DT_F32, out->ndim, out->shape, R);
    dt_status st = dt_backward_with(ctx, out, Rt);
    if (st < 0) {
        fprintf(stderr, "gradcheck %s: backward failed: %s\n", name, dt_last_error());
        free(R);
        dt_ctx_free(ctx);
        return 1;
    }
    /* copy analytic grads before the context is reused */
    float *ana[GC_MAX_IN] = {0};
    for (int i = 0; i < nin; i++) {
        if (!in[i] || !(in[i]->flags & DT_TENSOR_REQUIRES_GRAD))
            continue;
        int64_t n = dt_tensor_numel(in[i]);
        ana[i] = calloc((size_t)(n ? n : 1), sizeof(float));
        if (in[i]->grad)
            dt_tensor_read(in[i]->grad, ana[i]);
        else
            bad++, fprintf(stderr, "gradcheck %s: input %d got no gradient\n", name, i);
    }
    dt_ctx_reset(ctx);
    bool ok = true;
    for (int i = 0; i < nin; i++) {
        if (!ana[i])
            continue;
        int64_t n = dt_tensor_numel(in[i]);
        int64_t step = n > 48 ? n / 48 : 1;
        for (int64_t j = 0; j < n; j += step) {
            double x0 = dt_tensor_get(in[i], j);
            dt_tensor_set(in[i], j, x0 + h);
            double lp = gc_loss(ctx, f, in, ud, R, &ok);
            dt_tensor_set(in[i], j, x0 - h);
            double lm = gc_loss(ctx, f, in, ud, R, &ok);
            dt_tensor_set(in[i], j, x0);
            double num = (lp - lm) / (2 * h), a = ana[i][j];
            if (!ok || !(fabs(num - a) <= atol + rtol * fabs(num))) {
                if (bad < 5)
                    fprintf(stderr, "gradcheck %s: input %d elem %lld: analytic %.6g numeric %.6g\n",
                            name, i, (long long)j, a, num);
                bad++;
            }
        }
        free(ana[i]);
    }
    free(R);
    dt_ctx_free(ctx);
    return bad;
}

/* Shapes and random inputs in one line: T(seed, 2, 3) is a [2, 3] input
 * (requires grad) from Philox stream seed; SH(2, 3) the shape array. */
#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define NARG(...) (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define T(seed, ...) gc_tensor(NARG(__VA_ARGS__), SH(__VA_ARGS__), seed, true)

/* Free the n inputs of a check. */
static inline void gc_free_all(int n, dt_tensor **t)
{
    for (int i = 0; i < n; i++)
        dt_tensor_free(t[i]);
}

/* The finite-difference check of f at inputs in[0..nin) with step h and the
 * suite's tolerances (atol 2e-3, rtol 2e-2); frees the inputs; fails the
 * test when any element's analytic and numeric gradients differ. */
#define GRADCHECK(name, nin, in, fn, ud, h)                                             \
    do {                                                                                \
        int bad_ = gradcheck(name, nin, in, fn, ud, h, 2e-3, 2e-2);                     \
        gc_free_all(nin, in);                                                           \
        ASSERT_EQ_INT(bad_, 0);                                                         \
    } while (0)

#endif
