/* Batch norm (train / eval / backward) and layer norm (forward / backward).
 *
 * Batch norm works per channel: one task per channel sums its N*HW elements
 * in double, in index order, so statistics and the gamma/beta gradients do
 * not depend on the thread count. The running variance uses the unbiased
 * batch variance, as PyTorch does.
 * Layer norm works per row for the forward and dx; dgamma/dbeta are column
 * sums over rows, computed with threads splitting COLUMNS (each column sums
 * rows in order) for the same reason. */
#include "kernels_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static dt_status bn_check(const char *fn, const float *x, const float *y, int64_t N, int64_t C, int64_t HW)
{
    DT__CHECK_N(fn, N);
    DT__CHECK_N(fn, C);
    DT__CHECK_N(fn, HW);
    DT__CHECK_PTR(fn, x, N * C * HW);
    DT__CHECK_PTR(fn, y, N * C * HW);
    return DT_OK;
}

/* Row kernels of batch norm, cloned for AVX2 (8 lanes) and the baseline
 * (4 lanes) and picked at load time. The float row sums depend on the lane
 * count, so they are reproducible per machine, not across ISAs. */

DT_CLONES static void row_moments(const float *restrict xp, int64_t n, float k, float *s1, float *s2)
{
    float r1 = 0.0f, r2 = 0.0f;
#pragma omp simd reduction(+ : r1, r2)
    for (int64_t i = 0; i < n; i++) {
        float d = xp[i] - k;
        r1 += d;
        r2 += d * d;
    }
    *s1 = r1;
    *s2 = r2;
}

DT_CLONES static void row_affine(const float *restrict xp, float *restrict yp, int64_t n, float m, float a, float b)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        yp[i] = (xp[i] - m) * a + b; /* centre first: no cancellation */
}

DT_CLONES static void row_bwd_sums(const float *restrict xp, const float *restrict gp, int64_t n, float m,
                                   float *sa, float *sb)
{
    float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
    for (int64_t i = 0; i < n; i++) {
        a += gp[i];
        b += gp[i] * (xp[i] - m);
    }
    *sa = a;
    *sb = b;
}

DT_CLONES static void row_bwd_dx(const float *restrict xp, const float *restrict gp, float *restrict dp, int64_t n,
                                 float m, float is, float k, float mdy, float mdyx)
{
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xh = (xp[i] - m) * is;
        dp[i] = k * (gp[i] - mdy - xh * mdyx);
    }
}

dt_status dt__bn_train_args(const char *fn, int64_t cnt, float eps)
{
    if (cnt < 2)
        return dt_error(DT_ERR_INVALID_ARG, "%s: training needs more than one value per channel (N*H*W = %lld)", fn,
                        (long long)cnt);
    if (!(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    return DT_OK;
}

void dt__bn_finish_channel(int64_t c, double s1, double s2, float k, int64_t cnt, float eps, float momentum,
                           const float *gamma, const float *beta, float *running_mean, float *running_var,
                           float *save_mean, float *save_invstd, float *mean, float *scale, float *shift)
{
    double m1 = s1 / (double)cnt;
    double var = s2 / (double)cnt - m1 * m1;
    if (var < 0.0)
        var = 0.0;
    float invstd = (float)(1.0 / sqrt(var + (double)eps));
    float fm = (float)((double)k + m1);
    *mean = fm;
    *scale = (gamma ? gamma[c] : 1.0f) * invstd;
    *shift = beta ? beta[c] : 0.0f;
    if (save_mean)
        save_mean[c] = fm;
    if (save_invstd)
        save_invstd[c] = invstd;
    if (running_mean)
        running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * fm;
    if (running_var)
        running_var[c] = (1.0f - momentum) * running_var[c] +
                         momentum * (float)(var * (double)cnt / (double)(cnt - 1));
}

dt_status dt_k_batchnorm_train_fwd(const float *x, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                   const float *beta, float eps, float momentum, float *running_mean,
                                   float *running_var, float *y, float *save_mean, float *save_invstd)
{
    const char *fn = "dt_k_batchnorm_train_fwd";
    dt_status st = bn_check(fn, x, y, N, C, HW);
    if (st < 0)
        return st;
    if (C == 0)
        return DT_OK;
    int64_t cnt = N * HW;
    if ((st = dt__bn_train_args(fn, cnt, eps)) < 0)
        return st;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < C; c++) {
        /* One pass for both moments, shifted by the channel's first value
         * (k) so that E[(x-k)^2] - E[x-k]^2 does not cancel. Each (n, c)
         * row of HW values is summed in float (vectorised, a fixed order),
         * the row sums in double in n order. */
        const float k = x[c * HW];
        double s1 = 0.0, s2 = 0.0;
        for (int64_t n = 0; n < N; n++) {
            float r1, r2;
            row_moments(x + (n * C + c) * HW, HW, k, &r1, &r2);
            s1 += (double)r1;
            s2 += (double)r2;
        }
        float fm, a, b;
        dt__bn_finish_channel(c, s1, s2, k, cnt, eps, momentum, gamma, beta, running_mean, running_var,
                              save_mean, save_invstd, &fm, &a, &b);
        for (int64_t n = 0; n < N; n++)
            row_affine(x + (n * C + c) * HW, y + (n * C + c) * HW, HW, fm, a, b);
    }
    return DT_OK;
}

dt_status dt_k_batchnorm_eval_fwd(const float *x, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                  const float *beta, const float *running_mean, const float *running_var, float eps,
                                  float *y)
{
    const char *fn = "dt_k_batchnorm_eval_fwd";
    dt_status st = bn_check(fn, x, y, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, running_mean, C);
    DT__CHECK_PTR(fn, running_var, C);
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt) collapse(2)
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            float invstd = 1.0f / sqrtf(running_var[c] + eps);
            float a = (gamma ? gamma[c] : 1.0f) * invstd;
            float b = beta ? beta[c] : 0.0f, m = running_mean[c];
            row_affine(x + (n * C + c) * HW, y + (n * C + c) * HW, HW, m, a, b);
        }
    return DT_OK;
}

dt_status dt_k_batchnorm_bwd(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW, const float *gamma,
                             const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta)
{
    const char *fn = "dt_k_batchnorm_bwd";
    dt_status st = bn_check(fn, x, dy, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, save_mean, C);
    DT__CHECK_PTR(fn, save_invstd, C);
    int64_t cnt = N * HW;
    if (cnt == 0) {
        for (int64_t c = 0; c < C; c++) {
            if (dgamma)
                dgamma[c] = 0.0f;
            if (dbeta)
                dbeta[c] = 0.0f;
        }
        return DT_OK;
    }
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < C; c++) {
        float m = save_mean[c], is = save_invstd[c];
        double sdy = 0.0, sdyx = 0.0;
        for (int64_t n = 0; n < N; n++) {
            float a, b;
            row_bwd_sums(x + (n * C + c) * HW, dy + (n * C + c) * HW, HW, m, &a, &b);
            sdy += (double)a;
            sdyx += (double)b;
        }
        sdyx *= (double)is; /* sum dy * xhat */
        if (dgamma)
            dgamma[c] = (float)sdyx;
        if (dbeta)
            dbeta[c] = (float)sdy;
        if (dx) {
            float g = gamma ? gamma[c] : 1.0f;
            float k = g * is, mdy = (float)(sdy / (double)cnt), mdyx = (float)(sdyx / (double)cnt);
            for (int64_t n = 0; n < N; n++)
                row_bwd_dx(x + (n * C + c) * HW, dy + (n * C + c) * HW, dx + (n * C + c) * HW, HW, m, is, k, mdy,
                           mdyx);
        }
    }
    return DT_OK;
}

/* ---- layer norm ----------------------------------------------------------------
 * A row's forward, dx and column sums have one body each, compiled for the
 * scalar baseline, AVX2 and AVX-512 and picked by dt__vec_level() (which
 * follows dt_k_get_isa: DT_MAX_CPU_ISA and dt_k_set_isa cap it). The
 * statistics and the dx sums are double reductions vectorised across
 * lanes, so the low bits of the f32 results depend on the path (not on the
 * thread count); at one path the f32 kernels and the low-precision ones
 * below run the same instructions on the same f32 values: the _lp kernels'
 * results equal those of widening, the f32 kernel and rounding, bit for
 * bit. */

static inline __attribute__((always_inline)) void ln_fwd_body(const float *xr, int64_t cols, const float *gamma,
                                                              const float *beta, bool hg, bool hb, float eps,
                                                              float *yr, float *save_mean, float *save_rstd)
{
    double s = 0.0, s2 = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < cols; j++)
        s += (double)xr[j];
    double mean = s / (double)cols;
#pragma omp simd reduction(+ : s2)
    for (int64_t j = 0; j < cols; j++) {
        double d = (double)xr[j] - mean;
        s2 += d * d;
    }
    float rstd = (float)(1.0 / sqrt(s2 / (double)cols + (double)eps)), fm = (float)mean;
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) /* yr may alias xr: each x is read before its y is written */
        yr[j] = ((xr[j] - fm) * rstd) * (hg ? gamma[j] : 1.0f) + (hb ? beta[j] : 0.0f);
    *save_mean = fm;
    *save_rstd = rstd;
}

/* hg, hb: gamma / beta given (else 1 and 0); the row functions call the
 * bodies with constants, so each case is a branch-free loop */
static inline __attribute__((always_inline)) void ln_bwd_body(const float *xr, const float *gr, int64_t cols,
                                                              const float *gamma, bool hg, float m, float rs,
                                                              float *dr)
{
    double a = 0.0, b = 0.0; /* mean(g*dy), mean(g*dy*xhat) */
#pragma omp simd reduction(+ : a, b)
    for (int64_t j = 0; j < cols; j++) {
        float gd = gr[j] * (hg ? gamma[j] : 1.0f);
        a += (double)gd;
        b += (double)gd * (double)((xr[j] - m) * rs);
    }
    float ma = (float)(a / (double)cols), mb = (float)(b / (double)cols);
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) {
        float gd = gr[j] * (hg ? gamma[j] : 1.0f);
        float xh = (xr[j] - m) * rs;
        dr[j] = rs * (gd - ma - xh * mb);
    }
}

/* sg[j] += dy * xhat, sb[j] += dy over one row's n columns: each column
 * sums its rows in row order whatever the lane count */
static inline __attribute__((always_inline)) void ln_col_body(const float *xr, const float *gr, float m, float rs,
                                                              int64_t n, double *sg, double *sb)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        sg[j] += (double)gr[j] * (double)((xr[j] - m) * rs);
        sb[j] += (double)gr[j];
    }
}

/* y[0, n) = x rounded to bf16 (y may be x) */
static inline __attribute__((always_inline)) void ln_round_bf16_body(const float *x, float *y, int64_t n)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
        y[j] = dt__bf16_round(x[j]);
}

#define LN_ROWS(SUF, ATTR)                                                                                             \
    ATTR __attribute__((noinline)) static void ln_fwd_row_##SUF(const float *xr, int64_t cols, const float *gamma,   \
                                                                const float *beta, float eps, float *yr, float *sm,  \
                                                                float *sr)                                           \
    {                                                                                                                  \
        if (gamma && beta)                                                                                             \
            ln_fwd_body(xr, cols, gamma, beta, true, true, eps, yr, sm, sr);                                          \
        else if (gamma)                                                                                                \
            ln_fwd_body(xr, cols, gamma, beta, true, false, eps, yr, sm, sr);                                         \
        else if (beta)                                                                                                 \
            ln_fwd_body(xr, cols, gamma, beta, false, true, eps, yr, sm, sr);                                         \
        else                                                                                                           \
            ln_fwd_body(xr, cols, gamma, beta, false, false, eps, yr, sm, sr);                                        \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void ln_bwd_row_##SUF(const float *xr, const float *gr, int64_t cols,      \
                                                                const float *gamma, float m, float rs, float *dr)    \
    {                                                                                                                  \
        if (gamma)                                                                                                     \
            ln_bwd_body(xr, gr, cols, gamma, true, m, rs, dr);                                                        \
        else                                                                                                           \
            ln_bwd_body(xr, gr, cols, gamma, false, m, rs, dr);                                                       \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void ln_col_##SUF(const float *xr, const float *gr, float m, float rs,     \
                                                            int64_t n, double *sg, double *sb)                       \
    {                                                                                                                  \
        ln_col_body(xr, gr, m, rs, n, sg, sb);                                                                        \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void ln_round_bf16_##SUF(const float *x, float *y, int64_t n)              \
    {                                                                                                                  \
        ln_round_bf16_body(x, y, n);                                                                                  \
    }
LN_ROWS(scalar, )
#if DT__X86_VEC
LN_ROWS(avx2, DT__AVX2)
LN_ROWS(avx512, DT__AVX512)
#define LN_PICK(vec, name, ...)                                                                                        \
    ((vec) >= DT__VEC_AVX512 ? name##_avx512(__VA_ARGS__) : (vec) ? name##_avx2(__VA_ARGS__) : name##_scalar(__VA_ARGS__))
#else
#define LN_PICK(vec, name, ...) ((void)(vec), name##_scalar(__VA_ARGS__))
#endif

static void ln_fwd_row(int vec, const float *xr, int64_t cols, const float *gamma, const float *beta, float eps,
                       float *yr, float *save_mean, float *save_rstd)
{
    LN_PICK(vec, ln_fwd_row, xr, cols, gamma, beta, eps, yr, save_mean, save_rstd);
}

static void ln_bwd_row(int vec, const float *xr, const float *gr, int64_t cols, const float *gamma, float m, float rs,
                       float *dr)
{
    LN_PICK(vec, ln_bwd_row, xr, gr, cols, gamma, m, rs, dr);
}

static void ln_col_sums(int vec, const float *xr, const float *gr, float m, float rs, int64_t n, double *sg,
                        double *sb)
{
    LN_PICK(vec, ln_col, xr, gr, m, rs, n, sg, sb);
}

enum { LN_CB = 128 }; /* the columns of one dgamma/dbeta work item */

static dt_status ln_args(const char *fn, const void *x, int64_t rows, int64_t cols, float eps, bool fwd)
{
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (fwd && rows > 0 && cols == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: normalising over 0 elements", fn);
    DT__CHECK_PTR(fn, x, rows * cols);
    if (fwd && !(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    return DT_OK;
}

dt_status dt_k_layernorm_fwd(const float *x, int64_t rows, int64_t cols, const float *gamma, const float *beta,
                             float eps, float *y, float *save_mean, float *save_rstd)
{
    const char *fn = "dt_k_layernorm_fwd";
    dt_status st = ln_args(fn, x, rows, cols, eps, true);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, y, rows * cols);
    int nt = dt__threads_for(rows * cols * 2);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        float m, rs;
        ln_fwd_row(vec, x + r * cols, cols, gamma, beta, eps, y + r * cols, &m, &rs);
        if (save_mean)
            save_mean[r] = m;
        if (save_rstd)
            save_rstd[r] = rs;
    }
    return DT_OK;
}

dt_status dt_k_layernorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols, const float *gamma,
                             const float *save_mean, const float *save_rstd, float *dx, float *dgamma, float *dbeta)
{
    return dt_k_layernorm_bwd_lp(x, DT_F32, dy, NULL, DT_F32, rows, cols, gamma, save_mean, save_rstd, dx, dgamma,
                                 dbeta);
}

/* ---- layer norm on low-precision data --------------------------------------------
 * A row of x (xt) is widened into a per-thread buffer (on the stack up to
 * LN_STACK columns, else on the heap), normalised by the f32 row code and
 * rounded once into y (yt) by the conversion kernels (vcvtneps2bf16 on
 * AVX512_BF16, integer rounding on AVX-512 / AVX2 / scalar: the same bits).
 * The backward rounds dy to yt (the gradient of a yt result) and dx to xt
 * (the gradient of an xt input) a row (or a column block) at a time in
 * cache, as the cast chain's backward does in passes of its own: bf16 by
 * dt_f32_to_bf16's integer formula vectorised at the path's width, f16 by
 * the conversion kernels. */
enum { LN_STACK = 4096 };

static bool ln_dtype_ok(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

/* y[0, n) = x rounded to t values (t f32: a copy; y may be x) */
static void ln_round(int vec, const float *x, float *y, dt_dtype t, int64_t n)
{
    if (t == DT_BF16) {
        LN_PICK(vec, ln_round_bf16, x, y, n);
        return;
    }
    if (y != x)
        memcpy(y, x, (size_t)n * sizeof(float));
    if (t == DT_F32)
        return;
    uint16_t h[LN_CB];
    for (int64_t i = 0; i < n; i += LN_CB) {
        int64_t c = n - i < LN_CB ? n - i : LN_CB;
        dt_k_convert(y + i, DT_F32, h, t, c);
        dt_k_convert(h, t, y + i, DT_F32, c);
    }
}

/* n values of x (t) at element offset off, as f32: x itself (t f32) or widened into buf */
static const float *ln_widen(const void *x, dt_dtype t, int64_t off, int64_t n, float *buf)
{
    if (t == DT_F32)
        return (const float *)x + off;
    dt_k_convert((const uint16_t *)x + off, t, buf, DT_F32, n);
    return buf;
}

dt_status dt_k_layernorm_fwd_lp(const void *x, dt_dtype xt, int64_t rows, int64_t cols, const float *gamma,
                                const float *beta, float eps, void *y, dt_dtype yt, float *save_mean,
                                float *save_rstd)
{
    const char *fn = "dt_k_layernorm_fwd_lp";
    if (!ln_dtype_ok(xt) || !ln_dtype_ok(yt))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s (f32, bf16 or f16)", fn, dt_dtype_name(xt),
                        dt_dtype_name(yt));
    dt_status st = ln_args(fn, x, rows, cols, eps, true);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, y, rows * cols);
    if (xt == DT_F32 && yt == DT_F32)
        return dt_k_layernorm_fwd(x, rows, cols, gamma, beta, eps, y, save_mean, save_rstd);
    int nt = dt__threads_for(rows * cols * 4), oom = 0;
    const int vec = dt__vec_level();
#pragma omp parallel num_threads(nt) reduction(| : oom)
    {
        float stk[LN_STACK];
        float *buf = cols <= LN_STACK ? stk : malloc((size_t)cols * sizeof(float));
        oom = !buf;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf)
                continue;
            const float *xr = ln_widen(x, xt, r * cols, cols, buf);
            float *yr = yt == DT_F32 ? (float *)y + r * cols : buf;
            float m, rs;
            ln_fwd_row(vec, xr, cols, gamma, beta, eps, yr, &m, &rs);
            if (yt != DT_F32)
                dt_k_convert(buf, DT_F32, (char *)y + (size_t)(r * cols) * 2, yt, cols);
            if (save_mean)
                save_mean[r] = m;
            if (save_rstd)
                save_rstd[r] = rs;
        }
        if (buf != stk)
            free(buf);
    }
    return oom ? dt_error(DT_ERR_NO_MEMORY, "%s: a row buffer of %lld floats", fn, (long long)cols) : DT_OK;
}

dt_status dt_k_layernorm_bwd_lp(const void *x, dt_dtype xt, const float *dy, const void *dy_lp, dt_dtype yt,
                                int64_t rows, int64_t cols, const float *gamma, const float *save_mean,
                                const float *save_rstd, float *dx, float *dgamma, float *dbeta)
{
    const char *fn = xt == DT_F32 && yt == DT_F32 ? "dt_k_layernorm_bwd" : "dt_k_layernorm_bwd_lp";
    if (!ln_dtype_ok(xt) || !ln_dtype_ok(yt))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtypes %s -> %s (f32, bf16 or f16)", fn, dt_dtype_name(xt),
                        dt_dtype_name(yt));
    dt_status st = ln_args(fn, x, rows, cols, 1.0f, false);
    if (st < 0)
        return st;
    if (dy_lp && yt == DT_F32)
        return dt_error(DT_ERR_INVALID_ARG, "%s: dy given in the result's dtype, which is f32", fn);
    if (!dy_lp) /* else dy is not read */
        DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, save_mean, rows);
    DT__CHECK_PTR(fn, save_rstd, rows);
    const bool plain = xt == DT_F32 && yt == DT_F32;
    int nt = dt__threads_for(rows * cols * (plain ? 2 : 4)), oom = 0;
    const int vec = dt__vec_level();
    if (dx) {
#pragma omp parallel num_threads(nt) reduction(| : oom)
        {
            float stk[2 * LN_STACK];
            float *buf = plain || cols <= LN_STACK ? stk : malloc((size_t)cols * 2 * sizeof(float));
            oom = !buf;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                if (!buf)
                    continue;
                const float *xr = ln_widen(x, xt, r * cols, cols, buf), *gr;
                if (dy_lp) /* dy's values of yt, widened */
                    gr = ln_widen(dy_lp, yt, r * cols, cols, buf + cols);
                else if (yt != DT_F32) {
                    ln_round(vec, dy + r * cols, buf + cols, yt, cols);
                    gr = buf + cols;
                } else
                    gr = dy + r * cols;
                ln_bwd_row(vec, xr, gr, cols, gamma, save_mean[r], save_rstd[r], dx + r * cols);
                if (xt != DT_F32)
                    ln_round(vec, dx + r * cols, dx + r * cols, xt, cols);
            }
            if (buf != stk)
                free(buf);
        }
        if (oom)
            return dt_error(DT_ERR_NO_MEMORY, "%s: a row buffer of %lld floats", fn, (long long)cols);
    }
    if (dgamma || dbeta) {
        const int64_t nblk = (cols + LN_CB - 1) / LN_CB, xs = (int64_t)dt_dtype_size(xt);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t bk = 0; bk < nblk; bk++) {
            int64_t j0 = bk * LN_CB, n = cols - j0 < LN_CB ? cols - j0 : LN_CB;
            double sg[LN_CB], sb[LN_CB];
            float xb[LN_CB], gb[LN_CB];
            for (int64_t j = 0; j < n; j++)
                sg[j] = sb[j] = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                if (r + 2 < rows) { /* the next rows' segments: a whole row apart, no stream runs on */
                    const char *px = (const char *)x + ((r + 2) * cols + j0) * xs;
                    for (int64_t k = 0; k < n * xs; k += 64)
                        __builtin_prefetch(px + k);
                    for (int64_t k = 0; k < n; k += dy_lp ? 32 : 16)
                        __builtin_prefetch(dy_lp ? (const void *)((const uint16_t *)dy_lp + (r + 2) * cols + j0 + k)
                                                 : (const void *)(dy + (r + 2) * cols + j0 + k));
                }
                const float *xr = ln_widen(x, xt, r * cols + j0, n, xb), *gr;
                if (dy_lp)
                    gr = ln_widen(dy_lp, yt, r * cols + j0, n, gb);
                else if (yt != DT_F32) {
                    ln_round(vec, dy + r * cols + j0, gb, yt, n);
                    gr = gb;
                } else
                    gr = dy + r * cols + j0;
                ln_col_sums(vec, xr, gr, save_mean[r], save_rstd[r], n, sg, sb);
            }
            for (int64_t j = 0; j < n; j++) {
                if (dgamma)
                    dgamma[j0 + j] = (float)sg[j];
                if (dbeta)
                    dbeta[j0 + j] = (float)sb[j];
            }
        }
    }
    return DT_OK;
}
