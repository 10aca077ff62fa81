/* RMSNorm forward and backward, on f32 and on low-precision (bf16/f16)
 * rows, with Hugging Face's numerics in f32: the mean of squares is summed
 * in double (PyTorch sums in f32 pairwise; both are within an ulp or two of
 * the exact mean), rstd is rounded to f32, and y = (x rstd) w with the
 * normalised value rounded before the weight multiplies. The weight
 * gradient is a column sum over rows; work items split columns and each
 * column adds its rows in order, so it does not depend on the thread count.
 *
 * The row loops are written per ISA path (scalar, AVX2, AVX-512; picked by
 * dt_k_get_isa, so DT_MAX_CPU_ISA and dt_k_set_isa cap them), with results
 * that do not depend on the path: a row's double sums (the mean of squares
 * forward, the mean of g w x backward) run in 16 fixed lanes, lane k adding
 * the elements j = k mod 16 in order, and the lanes are added 0 to 15 at
 * the end, on every path (the products are of two floats, exact in double;
 * only the additions round, and they are the same additions in the same
 * order). The element-wise loops have no reduction, and no FMA is
 * contracted (ISO C build: -ffp-contract=off), so they are the same on
 * every path too. The low-precision kernels run the same row code on the
 * widened values: their results equal widening, the f32 kernel and
 * rounding, bit for bit. */
#include "kernels_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { RMS_L = 16 };

#define RMS_AI inline __attribute__((always_inline))

/* The rest of a 16-lane sum: elements [j, n) (fewer than 16) into lanes
 * 0.., then the lanes added in order. p w q: the product summed (w NULL:
 * p q). */
static RMS_AI double rms_finish(double *a, const float *p, const float *w, const float *q, int64_t j, int64_t n)
{
    for (int64_t k = 0; j + k < n; k++)
        a[k] += (double)(w ? p[j + k] * w[j + k] : p[j + k]) * (double)q[j + k];
    double s = 0.0;
    for (int k = 0; k < RMS_L; k++)
        s += a[k];
    return s;
}

/* sum_j (double)(p_j w_j) (double)q_j (w NULL: p_j) in the 16 lanes */
__attribute__((noinline)) static double rms_dot_scalar(const float *p, const float *w, const float *q, int64_t n)
{
    double a[RMS_L] = {0};
    int64_t j = 0;
    for (; j + RMS_L <= n; j += RMS_L)
        for (int k = 0; k < RMS_L; k++)
            a[k] += (double)(w ? p[j + k] * w[j + k] : p[j + k]) * (double)q[j + k];
    return rms_finish(a, p, w, q, j, n);
}

/* the element-wise loops, compiled per path below */
static RMS_AI void rms_fwd_body(const float *xr, int64_t cols, const float *w, bool hw, float rstd, float *yr)
{
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) { /* yr may alias xr: each x is read before its y is written */
        float v = xr[j] * rstd;
        yr[j] = hw ? w[j] * v : v;
    }
}

static RMS_AI void rms_bwd_body(const float *xr, const float *gr, int64_t cols, const float *w, bool hw, float rs,
                                float k, float *dr)
{
#pragma omp simd
    for (int64_t j = 0; j < cols; j++) /* dr may alias gr */
        dr[j] = rs * ((hw ? gr[j] * w[j] : gr[j]) - xr[j] * k);
}

/* s[j] += dy_j (x_j rstd) over one row's n columns (each column sums its
 * rows in row order) */
static RMS_AI void rms_col_body(const float *xr, const float *gr, float rs, int64_t n, double *s)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
        s[j] += (double)gr[j] * (double)(xr[j] * rs);
}

static RMS_AI void rms_round_bf16_body(const float *x, float *y, int64_t n)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++)
        y[j] = dt__bf16_round(x[j]);
}

#if DT__X86_VEC
DT__AVX2 __attribute__((noinline)) static double rms_dot_avx2(const float *p, const float *w, const float *q,
                                                              int64_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    int64_t j = 0;
    for (; j + RMS_L <= n; j += RMS_L) {
        __m256 p0 = _mm256_loadu_ps(p + j), p1 = _mm256_loadu_ps(p + j + 8);
        if (w) {
            p0 = _mm256_mul_ps(p0, _mm256_loadu_ps(w + j));
            p1 = _mm256_mul_ps(p1, _mm256_loadu_ps(w + j + 8));
        }
        const __m256 q0 = _mm256_loadu_ps(q + j), q1 = _mm256_loadu_ps(q + j + 8);
        a0 = _mm256_add_pd(a0, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(p0)),
                                             _mm256_cvtps_pd(_mm256_castps256_ps128(q0))));
        a1 = _mm256_add_pd(a1, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(p0, 1)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(q0, 1))));
        a2 = _mm256_add_pd(a2, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(p1)),
                                             _mm256_cvtps_pd(_mm256_castps256_ps128(q1))));
        a3 = _mm256_add_pd(a3, _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(p1, 1)),
                                             _mm256_cvtps_pd(_mm256_extractf128_ps(q1, 1))));
    }
    double a[RMS_L];
    _mm256_storeu_pd(a, a0);
    _mm256_storeu_pd(a + 4, a1);
    _mm256_storeu_pd(a + 8, a2);
    _mm256_storeu_pd(a + 12, a3);
    return rms_finish(a, p, w, q, j, n);
}

DT__AVX512 __attribute__((noinline)) static double rms_dot_avx512(const float *p, const float *w, const float *q,
                                                                  int64_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    int64_t j = 0;
    for (; j + RMS_L <= n; j += RMS_L) {
        __m512 pv = _mm512_loadu_ps(p + j);
        if (w)
            pv = _mm512_mul_ps(pv, _mm512_loadu_ps(w + j));
        const __m512 qv = _mm512_loadu_ps(q + j);
        const __m256 ph = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(pv), 1));
        const __m256 qh = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(qv), 1));
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(pv)),
                                             _mm512_cvtps_pd(_mm512_castps512_ps256(qv))));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(_mm512_cvtps_pd(ph), _mm512_cvtps_pd(qh)));
    }
    double a[RMS_L];
    _mm512_storeu_pd(a, a0);
    _mm512_storeu_pd(a + 8, a1);
    return rms_finish(a, p, w, q, j, n);
}
#endif

/* One row of the forward (y may alias x), returning rstd; one row of dx
 * (may alias g): dx_j = r (g_j w_j - x_j r^2 mean(g w x)); the column sums
 * of dw; a bf16 rounding (y may be x). */
#define RMS_ROWS(SUF, ATTR)                                                                                            \
    ATTR __attribute__((noinline)) static float rms_fwd_row_##SUF(const float *xr, int64_t cols, const float *w,     \
                                                                  float eps, float *yr)                              \
    {                                                                                                                  \
        float ms = (float)(rms_dot_##SUF(xr, NULL, xr, cols) / (double)cols);                                        \
        float rstd = 1.0f / sqrtf(ms + eps);                                                                           \
        if (w)                                                                                                         \
            rms_fwd_body(xr, cols, w, true, rstd, yr);                                                                 \
        else                                                                                                           \
            rms_fwd_body(xr, cols, w, false, rstd, yr);                                                                \
        return rstd;                                                                                                   \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void rms_bwd_row_##SUF(const float *xr, const float *gr, int64_t cols,     \
                                                                 const float *w, float rs, float *dr)                \
    {                                                                                                                  \
        float k = (float)(rms_dot_##SUF(gr, w, xr, cols) / (double)cols) * rs * rs;                                  \
        if (w)                                                                                                         \
            rms_bwd_body(xr, gr, cols, w, true, rs, k, dr);                                                            \
        else                                                                                                           \
            rms_bwd_body(xr, gr, cols, w, false, rs, k, dr);                                                           \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void rms_col_##SUF(const float *xr, const float *gr, float rs, int64_t n,  \
                                                             double *s)                                              \
    {                                                                                                                  \
        rms_col_body(xr, gr, rs, n, s);                                                                                \
    }                                                                                                                  \
    ATTR __attribute__((noinline)) static void rms_round_bf16_##SUF(const float *x, float *y, int64_t n)             \
    {                                                                                                                  \
        rms_round_bf16_body(x, y, n);                                                                                  \
    }
RMS_ROWS(scalar, )
#if DT__X86_VEC
RMS_ROWS(avx2, DT__AVX2)
RMS_ROWS(avx512, DT__AVX512)
#define RMS_PICK(vec, name, ...)                                                                                       \
    ((vec) >= DT__VEC_AVX512 ? name##_avx512(__VA_ARGS__) : (vec) ? name##_avx2(__VA_ARGS__) : name##_scalar(__VA_ARGS__))
#else
#define RMS_PICK(vec, name, ...) ((void)(vec), name##_scalar(__VA_ARGS__))
#endif

enum { RN_STACK = 4096, RN_COLS = 256 }; /* row buffers on the stack up to RN_STACK columns; dw work items */

/* y[0, n) = x rounded to t values (t bf16 or f16; y may be x; f16 through
 * the conversion kernels, RN_COLS at a time) */
static void rms_round(int vec, const float *x, float *y, dt_dtype t, int64_t n)
{
    if (t == DT_BF16) {
        RMS_PICK(vec, rms_round_bf16, x, y, n);
        return;
    }
    if (y != x)
        memcpy(y, x, (size_t)n * sizeof(float));
    uint16_t h[RN_COLS];
    for (int64_t i = 0; i < n; i += RN_COLS) {
        int64_t c = n - i < RN_COLS ? n - i : RN_COLS;
        dt_k_convert(y + i, DT_F32, h, t, c);
        dt_k_convert(h, t, y + i, DT_F32, c);
    }
}

/* dw (cols) = the column sums of dy (x rstd) over the rows, RN_COLS columns
 * per work item, each column in row order. t f32: x and dy as they are;
 * else x (t) widened and dy rounded to t first. */
static void rms_dw(int vec, int nt, const void *x, dt_dtype t, const float *dy, int64_t rows, int64_t cols,
                   const float *save_rstd, float *dw)
{
    (void)nt; /* read by the OpenMP pragma only: unused in a build without OpenMP */
    const int64_t nb = (cols + RN_COLS - 1) / RN_COLS;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t j0 = b * RN_COLS, c = cols - j0 < RN_COLS ? cols - j0 : RN_COLS;
        double s[RN_COLS] = {0};
        float xb[RN_COLS], gb[RN_COLS];
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = (const float *)x + r * cols + j0, *gr = dy + r * cols + j0;
            if (t != DT_F32) {
                dt_k_convert((const uint16_t *)x + r * cols + j0, t, xb, DT_F32, c);
                rms_round(vec, gr, gb, t, c);
                xr = xb, gr = gb;
            }
            RMS_PICK(vec, rms_col, xr, gr, save_rstd[r], c, s);
        }
        for (int64_t j = 0; j < c; j++)
            dw[j0 + j] = (float)s[j];
    }
}

dt_status dt_k_rmsnorm_fwd(const float *x, int64_t rows, int64_t cols, const float *w, float eps, float *y,
                           float *save_rstd)
{
    const char *fn = "dt_k_rmsnorm_fwd";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (rows > 0 && cols == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: normalising over 0 elements", fn);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, rows * cols);
    if (!(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    int nt = dt__threads_for(rows * cols * 2);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        float rstd = RMS_PICK(vec, rms_fwd_row, x + r * cols, cols, w, eps, y + r * cols);
        if (save_rstd)
            save_rstd[r] = rstd;
    }
    return DT_OK;
}

dt_status dt_k_rmsnorm_bwd(const float *x, const float *dy, int64_t rows, int64_t cols, const float *w,
                           const float *save_rstd, float *dx, float *dw)
{
    const char *fn = "dt_k_rmsnorm_bwd";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, save_rstd, rows);
    int nt = dt__threads_for(rows * cols * 2);
    const int vec = dt__vec_level();
    if (dx) {
        /* y_j = w_j x_j r, r = (mean(x^2) + eps)^-1/2:
         * dx_j = r (g_j - x_j r^2 mean(g x)),  g_j = dy_j w_j */
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t r = 0; r < rows; r++)
            RMS_PICK(vec, rms_bwd_row, x + r * cols, dy + r * cols, cols, w, save_rstd[r], dx + r * cols);
    }
    if (dw)
        rms_dw(vec, nt, x, DT_F32, dy, rows, cols, save_rstd, dw);
    return DT_OK;
}

/* ---- RMSNorm on low-precision data ---------------------------------------------
 * x (t) is widened a row at a time into a per-thread buffer (on the stack
 * up to RN_STACK columns, else on the heap), normalised by the f32 kernel's
 * row code and rounded once into y: the bits of widening, dt_k_rmsnorm_fwd
 * and rounding without the two cast passes. The backward rounds dy to t
 * first (the gradient of a t result), as the cast chain does. */

static dt_status rms_lp_args(const char *fn, const void *x, dt_dtype t, int64_t rows, int64_t cols)
{
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (rows > 0 && cols == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: normalising over 0 elements", fn);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    DT__CHECK_PTR(fn, x, rows * cols);
    return DT_OK;
}

dt_status dt_k_rmsnorm_fwd_lp(const void *x, dt_dtype t, int64_t rows, int64_t cols, const float *w, float eps,
                              void *y, float *save_rstd)
{
    const char *fn = "dt_k_rmsnorm_fwd_lp";
    dt_status st = rms_lp_args(fn, x, t, rows, cols);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, y, rows * cols);
    if (!(eps > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: eps must be > 0", fn);
    int nt = dt__threads_for(rows * cols * 4), oom = 0;
    const int vec = dt__vec_level();
#pragma omp parallel num_threads(nt) reduction(| : oom)
    {
        float stk[RN_STACK];
        float *buf = cols <= RN_STACK ? stk : malloc((size_t)cols * sizeof(float));
        oom = !buf;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!buf)
                continue;
            dt_k_convert((const uint16_t *)x + r * cols, t, buf, DT_F32, cols);
            float rstd = RMS_PICK(vec, rms_fwd_row, buf, cols, w, eps, buf);
            dt_k_convert(buf, DT_F32, (uint16_t *)y + r * cols, t, cols);
            if (save_rstd)
                save_rstd[r] = rstd;
        }
        if (buf != stk)
            free(buf);
    }
    return oom ? dt_error(DT_ERR_NO_MEMORY, "%s: a row buffer of %lld floats", fn, (long long)cols) : DT_OK;
}

dt_status dt_k_rmsnorm_bwd_lp(const void *x, dt_dtype t, const float *dy, int64_t rows, int64_t cols,
                              const float *w, const float *save_rstd, float *dx, float *dw)
{
    const char *fn = "dt_k_rmsnorm_bwd_lp";
    dt_status st = rms_lp_args(fn, x, t, rows, cols);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, save_rstd, rows);
    int nt = dt__threads_for(rows * cols * 4), oom = 0;
    const int vec = dt__vec_level();
    if (dx) {
#pragma omp parallel num_threads(nt) reduction(| : oom)
        {
            float stk[2 * RN_STACK];
            float *buf = cols <= RN_STACK ? stk : malloc((size_t)cols * 2 * sizeof(float));
            oom = !buf;
#pragma omp for schedule(static)
            for (int64_t r = 0; r < rows; r++) {
                if (!buf)
                    continue;
                float *xb = buf, *gb = buf + cols;
                dt_k_convert((const uint16_t *)x + r * cols, t, xb, DT_F32, cols);
                rms_round(vec, dy + r * cols, gb, t, cols);
                RMS_PICK(vec, rms_bwd_row, xb, gb, cols, w, save_rstd[r], dx + r * cols);
                rms_round(vec, dx + r * cols, dx + r * cols, t, cols);
            }
            if (buf != stk)
                free(buf);
        }
        if (oom)
            return dt_error(DT_ERR_NO_MEMORY, "%s: a row buffer of %lld floats", fn, (long long)cols);
    }
    if (dw)
        rms_dw(vec, nt, x, t, dy, rows, cols, save_rstd, dw);
    return DT_OK;
}
