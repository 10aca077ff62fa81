/* ReLU, GELU (erf and tanh forms), dropout and embedding.
 *
 * Dropout draws element i's keep decision from Philox lane (offset+i) % 4 of
 * block (offset+i) / 4 of the key's stream (the same value as
 * dt_rng_uniform(key, offset + i)), so the mask is a pure function of
 * (key, offset + i) and the backward regenerates it instead of storing it.
 * The embedding backward splits the table's COLUMNS across threads and walks
 * the indices in order, so repeated indices add in a fixed order whatever
 * the thread count. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

dt_status dt_k_relu_fwd(const float *x, float *y, int64_t n)
{
    DT__CHECK_N("dt_k_relu_fwd", n);
    DT__CHECK_PTR("dt_k_relu_fwd", x, n);
    DT__CHECK_PTR("dt_k_relu_fwd", y, n);
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f || x[i] != x[i] ? x[i] : 0.0f; /* NaN stays NaN, as torch.relu */
    return DT_OK;
}

dt_status dt_k_relu_bwd(const float *x, const float *dy, float *dx, int64_t n)
{
    DT__CHECK_N("dt_k_relu_bwd", n);
    DT__CHECK_PTR("dt_k_relu_bwd", x, n);
    DT__CHECK_PTR("dt_k_relu_bwd", dy, n);
    DT__CHECK_PTR("dt_k_relu_bwd", dx, n);
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i]; /* load unconditionally: a select, not a branch */
        dx[i] = x[i] > 0.0f ? g : 0.0f;
    }
    return DT_OK;
}

/* Blocks of LP_BLK elements, widened into a stack buffer: every pass of
 * the op stays in L1 and the conversions are dt_k_convert's own. */
enum { LP_BLK = 2048 };

static bool lp_dtype(dt_dtype t) { return t == DT_BF16 || t == DT_F16; }

dt_status dt_k_relu_fwd_lp(dt_dtype t, const void *x, void *y, int64_t n)
{
    DT__CHECK_N("dt_k_relu_fwd_lp", n);
    DT__CHECK_PTR("dt_k_relu_fwd_lp", x, n);
    DT__CHECK_PTR("dt_k_relu_fwd_lp", y, n);
    if (!lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "dt_k_relu_fwd_lp: dtype %s; want bf16 or f16", dt_dtype_name(t));
    const int64_t nb = (n + LP_BLK - 1) / LP_BLK;
    int nt = dt__threads_for(n), bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t b = 0; b < nb; b++) {
        float v[LP_BLK];
        int64_t lo = b * LP_BLK, c = n - lo < LP_BLK ? n - lo : LP_BLK;
        bad |= dt_k_convert((const uint16_t *)x + lo, t, v, DT_F32, c) < 0;
        for (int64_t i = 0; i < c; i++)
            v[i] = v[i] > 0.0f || v[i] != v[i] ? v[i] : 0.0f; /* as dt_k_relu_fwd */
        bad |= dt_k_convert(v, DT_F32, (uint16_t *)y + lo, t, c) < 0;
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "dt_k_relu_fwd_lp: a conversion failed") : DT_OK;
}

dt_status dt_k_relu_bwd_lp(dt_dtype t, const void *y, const float *dy, float *dx, int64_t n)
{
    DT__CHECK_N("dt_k_relu_bwd_lp", n);
    DT__CHECK_PTR("dt_k_relu_bwd_lp", y, n);
    DT__CHECK_PTR("dt_k_relu_bwd_lp", dy, n);
    DT__CHECK_PTR("dt_k_relu_bwd_lp", dx, n);
    if (!lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "dt_k_relu_bwd_lp: dtype %s; want bf16 or f16", dt_dtype_name(t));
    const int64_t nb = (n + LP_BLK - 1) / LP_BLK;
    int nt = dt__threads_for(n), bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t b = 0; b < nb; b++) {
        float v[LP_BLK], g[LP_BLK];
        uint16_t h[LP_BLK];
        int64_t lo = b * LP_BLK, c = n - lo < LP_BLK ? n - lo : LP_BLK;
        bad |= dt_k_convert((const uint16_t *)y + lo, t, v, DT_F32, c) < 0;
        bad |= dt_k_convert(dy + lo, DT_F32, h, t, c) < 0 || dt_k_convert(h, t, g, DT_F32, c) < 0;
        for (int64_t i = 0; i < c; i++)
            dx[lo + i] = v[i] > 0.0f ? g[i] : 0.0f; /* as dt_k_relu_bwd */
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "dt_k_relu_bwd_lp: a conversion failed") : DT_OK;
}

#define SQRT1_2 0.70710678118654752440f
#define SQRT2_PI 0.79788456080286535588f  /* sqrt(2/pi) */
/* The tanh form's coefficients as the rows use them, one value on every
 * path: 2u = v (GELU_K + GELU_KC v^2), 2u' = GELU_K + GELU_KD v^2. */
#define GELU_K (2.0f * SQRT2_PI)
#define GELU_KC (GELU_K * 0.044715f)
#define GELU_KD (GELU_K * (3.0f * 0.044715f))
#define INV_SQRT_2PI 0.39894228040143267794f

/* The tanh form runs the fused bias + GELU rows below (no bias): one inline
 * exp per element on 8 lanes instead of libm's scalar tanhf, the same
 * values as dt_k_bias_gelu_* give. */
static void gelu_tanh_row(int vec, const float *x, const float *b, float *y, int64_t n);
static void gelu_tanh_bwd_row(int vec, const float *x, const float *b, const float *dy, float *dx, float *sb,
                              int64_t n);
enum { GELU_BLOCK = 2048 };

dt_status dt_k_gelu_fwd(const float *x, float *y, int64_t n, dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_gelu_fwd";
    if (approx != DT_K_GELU_ERF && approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown approximation %d", fn, (int)approx);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    int nt = dt__threads_for(n * 8);
    if (approx == DT_K_GELU_ERF) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i++)
            y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * SQRT1_2));
    } else {
        const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i += GELU_BLOCK)
            gelu_tanh_row(vec, x + i, NULL, y + i, n - i < GELU_BLOCK ? n - i : GELU_BLOCK);
    }
    return DT_OK;
}

dt_status dt_k_gelu_bwd(const float *x, const float *dy, float *dx, int64_t n, dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_gelu_bwd";
    if (approx != DT_K_GELU_ERF && approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown approximation %d", fn, (int)approx);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, dy, n);
    DT__CHECK_PTR(fn, dx, n);
    int nt = dt__threads_for(n * 8);
    if (approx == DT_K_GELU_ERF) {
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            float cdf = 0.5f * (1.0f + erff(v * SQRT1_2));
            float pdf = INV_SQRT_2PI * expf(-0.5f * v * v);
            dx[i] = dy[i] * (cdf + v * pdf);
        }
    } else {
        const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t i = 0; i < n; i += GELU_BLOCK)
            gelu_tanh_bwd_row(vec, x + i, NULL, dy + i, dx + i, NULL, n - i < GELU_BLOCK ? n - i : GELU_BLOCK);
    }
    return DT_OK;
}

/* ---- soft cap ----------------------------------------------------------------------
 * Gemma 2's final_logit_softcapping: y = cap tanh(x / cap) (libm's tanhf),
 * and dx = dy (1 - (y / cap)^2) from the output. */
dt_status dt_k_softcap_fwd(const float *x, float *y, int64_t n, float cap)
{
    const char *fn = "dt_k_softcap_fwd";
    if (!(cap > 0.0f) || !isfinite(cap))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the cap %g must be positive and finite", fn, (double)cap);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    const float inv = 1.0f / cap;
#pragma omp parallel for schedule(static) num_threads(dt__threads_for(n * 16))
    for (int64_t i = 0; i < n; i++)
        y[i] = cap * tanhf(x[i] * inv);
    return DT_OK;
}

dt_status dt_k_softcap_bwd(const float *y, const float *dy, float *dx, int64_t n, float cap)
{
    const char *fn = "dt_k_softcap_bwd";
    if (!(cap > 0.0f) || !isfinite(cap))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the cap %g must be positive and finite", fn, (double)cap);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, y, n);
    DT__CHECK_PTR(fn, dy, n);
    DT__CHECK_PTR(fn, dx, n);
    const float inv = 1.0f / cap;
#pragma omp parallel for schedule(static) num_threads(dt__threads_for(n * 4))
    for (int64_t i = 0; i < n; i++) {
        const float t = y[i] * inv;
        dx[i] = dy[i] * (1.0f - t * t);
    }
    return DT_OK;
}

/* ---- fused bias + GELU ---------------------------------------------------------------
 * y = gelu(x + bias) row by row: one pass instead of an add and a GELU, and
 * the backward recomputes x + bias instead of keeping it. dbias (column
 * sums of dx) runs over column blocks, each summing its rows in order, so
 * the result does not depend on the thread count. */
static inline float gelu_erf_d(float v)
{
    return 0.5f * (1.0f + erff(v * SQRT1_2)) + v * INV_SQRT_2PI * expf(-0.5f * v * v);
}

/* GELU (tanh form) through E = e^(2u), u = sqrt(2/pi) (v + 0.044715 v^3):
 * (1 + tanh u) / 2 = E / (E + 1) and (1 - tanh u) / 2 = 1 / (E + 1), so
 * neither side cancels (1 + tanh u is tiny for negative v), with one
 * inline exp (dt__expf; 2u clamped to 88 so E stays finite). 2u is
 * v (GELU_K + GELU_KC v^2) with one fused multiply-add (fmaf, as the
 * vector rows' _mm*_fmadd_ps: the same bits). */
static inline void gelu_tanh_parts(float v, float *opp, float *q)
{
    float u2 = v * __builtin_fmaf(v * v, GELU_KC, GELU_K);
    float E = dt__expf(u2 < 88.0f ? u2 : 88.0f), r = 1.0f / (E + 1.0f);
    *opp = E * r;
    *q = r;
}

/* One row of y = gelu_tanh(x + b) and of its backward (b may be NULL:
 * zero; sb, the bias gradient's running sums, may be NULL: not wanted). */
DT_CLONES static void bias_gelu_tanh_row(const float *restrict x, const float *restrict b, float *restrict y,
                                         int64_t n)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] + (b ? b[j] : 0.0f), opp, q;
        gelu_tanh_parts(v, &opp, &q);
        y[j] = v * opp;
    }
}

/* d/dv [v (1 + tanh u) / 2] = (1 + t) / 2 + v (1 - t^2) u' / 2 = opp + v opp q (2u'),
 * 2u' = GELU_K + GELU_KD v^2; both sums one fused multiply-add */
DT_CLONES static void bias_gelu_tanh_bwd_row(const float *restrict x, const float *restrict b,
                                             const float *dy, float *dx, float *restrict sb, int64_t n)
{
#pragma omp simd
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] + (b ? b[j] : 0.0f), opp, q;
        gelu_tanh_parts(v, &opp, &q);
        float g = dy[j] * __builtin_fmaf(v * opp * q, __builtin_fmaf(v * v, GELU_KD, GELU_K), opp);
        if (dx)
            dx[j] = g;
        if (sb)
            sb[j] += g;
    }
}

#if DT__X86_VEC
/* The same rows on 8 lanes: the operations of gelu_tanh_parts and the row
 * loops above in the same order (dt__expf8 for dt__expf), so the results
 * are bit-identical to the scalar rows; the tail goes to them. */
DT__AVX2 static inline void gelu_tanh_parts8(__m256 v, __m256 *opp, __m256 *q)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 u2 = _mm256_mul_ps(v, _mm256_fmadd_ps(_mm256_mul_ps(v, v), _mm256_set1_ps(GELU_KC), _mm256_set1_ps(GELU_K)));
    __m256 E = dt__expf8(_mm256_min_ps(u2, _mm256_set1_ps(88.0f))); /* NaN u2: 88, as the scalar select */
    __m256 r = _mm256_div_ps(one, _mm256_add_ps(E, one));
    *opp = _mm256_mul_ps(E, r);
    *q = r;
}

DT__AVX2 static void bias_gelu_tanh_row_avx2(const float *restrict x, const float *restrict b, float *restrict y,
                                             int64_t n)
{
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + j), b ? _mm256_loadu_ps(b + j) : _mm256_setzero_ps()), opp, q;
        gelu_tanh_parts8(v, &opp, &q);
        _mm256_storeu_ps(y + j, _mm256_mul_ps(v, opp));
    }
    if (j < n)
        bias_gelu_tanh_row(x + j, b ? b + j : NULL, y + j, n - j);
}

DT__AVX2 static void bias_gelu_tanh_bwd_row_avx2(const float *restrict x, const float *restrict b, const float *dy,
                                                 float *dx, float *restrict sb, int64_t n)
{
    const __m256 kd = _mm256_set1_ps(GELU_KD), k = _mm256_set1_ps(GELU_K);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 v = _mm256_add_ps(_mm256_loadu_ps(x + j), b ? _mm256_loadu_ps(b + j) : _mm256_setzero_ps()), opp, q;
        gelu_tanh_parts8(v, &opp, &q);
        __m256 du2 = _mm256_fmadd_ps(_mm256_mul_ps(v, v), kd, k);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(dy + j),
                                 _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(v, opp), q), du2, opp));
        if (dx)
            _mm256_storeu_ps(dx + j, g);
        if (sb)
            _mm256_storeu_ps(sb + j, _mm256_add_ps(_mm256_loadu_ps(sb + j), g));
    }
    if (j < n)
        bias_gelu_tanh_bwd_row(x + j, b ? b + j : NULL, dy + j, dx ? dx + j : NULL, sb ? sb + j : NULL, n - j);
}

/* The same rows on 16 lanes: gelu_tanh_parts8's operations (dt__expf16),
 * bit-identical again; the tail goes to the 8-lane rows. */
DT__AVX512 static inline void gelu_tanh_parts16(__m512 v, __m512 *opp, __m512 *q)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 u2 = _mm512_mul_ps(v, _mm512_fmadd_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(GELU_KC), _mm512_set1_ps(GELU_K)));
    __m512 E = dt__expf16(_mm512_min_ps(u2, _mm512_set1_ps(88.0f))); /* NaN u2: 88, as the scalar select */
    __m512 r = _mm512_div_ps(one, _mm512_add_ps(E, one));
    *opp = _mm512_mul_ps(E, r);
    *q = r;
}

DT__AVX512 static void bias_gelu_tanh_row_avx512(const float *restrict x, const float *restrict b,
                                                 float *restrict y, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(x + j), b ? _mm512_loadu_ps(b + j) : _mm512_setzero_ps()), opp, q;
        gelu_tanh_parts16(v, &opp, &q);
        _mm512_storeu_ps(y + j, _mm512_mul_ps(v, opp));
    }
    if (j < n)
        bias_gelu_tanh_row_avx2(x + j, b ? b + j : NULL, y + j, n - j);
}

/* dy times GELU's slope at v, the operations of the avx2 row in its order */
DT__AVX512 static inline __m512 gelu_tanh_bwd16(__m512 v, __m512 dy)
{
    __m512 opp, q;
    gelu_tanh_parts16(v, &opp, &q);
    __m512 du2 = _mm512_fmadd_ps(_mm512_mul_ps(v, v), _mm512_set1_ps(GELU_KD), _mm512_set1_ps(GELU_K));
    return _mm512_mul_ps(dy, _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(v, opp), q), du2, opp));
}

DT__AVX512 static void bias_gelu_tanh_bwd_row_avx512(const float *restrict x, const float *restrict b,
                                                     const float *dy, float *dx, float *restrict sb, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(x + j), b ? _mm512_loadu_ps(b + j) : _mm512_setzero_ps());
        __m512 g = gelu_tanh_bwd16(v, _mm512_loadu_ps(dy + j));
        if (dx)
            _mm512_storeu_ps(dx + j, g);
        if (sb)
            _mm512_storeu_ps(sb + j, _mm512_add_ps(_mm512_loadu_ps(sb + j), g));
    }
    if (j < n)
        bias_gelu_tanh_bwd_row_avx2(x + j, b ? b + j : NULL, dy + j, dx ? dx + j : NULL, sb ? sb + j : NULL, n - j);
}

/* y = gelu(x + b) with x in bf16, widened in registers: y as f32 (y32) or
 * rounded to bf16 (y16), whichever is not NULL; the bits of widening x with
 * dt_k_convert, the f32 row, then (y16) rounding with dt_k_convert. */
DT__AVX512 static void bias_gelu_tanh_row_bf16_avx512(const uint16_t *restrict x, const float *restrict b,
                                                     float *y32, uint16_t *y16, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        dt__prefetch_ahead(x + j);
        __m512 v = _mm512_add_ps(dt__bf16_load16(x + j), b ? _mm512_loadu_ps(b + j) : _mm512_setzero_ps()), opp, q;
        gelu_tanh_parts16(v, &opp, &q);
        __m512 y = _mm512_mul_ps(v, opp);
        if (y32)
            _mm512_storeu_ps(y32 + j, y);
        else
            dt__bf16_store16(y16 + j, dt__bf16_round16(y));
    }
    if (j < n) {
        float v[16], y[16];
        (void)dt_k_convert(x + j, DT_BF16, v, DT_F32, n - j);
        bias_gelu_tanh_row_avx2(v, b ? b + j : NULL, y32 ? y32 + j : y, n - j);
        if (!y32)
            (void)dt_k_convert(y, DT_F32, y16 + j, DT_BF16, n - j);
    }
}

/* The same row with x in bf16, widened in registers, and dx rounded to bf16
 * in registers: h gets the rounded values' bits and dx (unless NULL) the
 * values as f32 (neither when h is NULL); sb sums the unrounded ones. dy
 * is f32 (dy, rounded first with round_dy) or bf16 (dyh, not NULL: read
 * widened). The bits of widening x (and dyh) with dt_k_convert, the row
 * above, then rounding dx with dt_k_convert both ways (the tail goes
 * exactly that way). */
DT__AVX512 static void bias_gelu_tanh_bwd_row_bf16_avx512(const uint16_t *restrict x, const float *restrict b,
                                                          const float *dy, const uint16_t *dyh, bool round_dy,
                                                          float *dx, uint16_t *h, float *restrict sb, int64_t n)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 v = _mm512_add_ps(dt__bf16_load16(x + j), b ? _mm512_loadu_ps(b + j) : _mm512_setzero_ps());
        __m512 d = dyh ? dt__bf16_load16(dyh + j) : _mm512_loadu_ps(dy + j);
        __m512 g = gelu_tanh_bwd16(v, round_dy && !dyh ? dt__bf16_round16(d) : d);
        if (h) {
            __m512 r = dt__bf16_round16(g);
            if (dx)
                _mm512_storeu_ps(dx + j, r);
            dt__bf16_store16(h + j, r);
        }
        if (sb)
            _mm512_storeu_ps(sb + j, _mm512_add_ps(_mm512_loadu_ps(sb + j), g));
    }
    if (j < n) {
        float v[16], dr[16], o[16];
        uint16_t hr[16];
        const float *g = dy ? dy + j : NULL;
        (void)dt_k_convert(x + j, DT_BF16, v, DT_F32, n - j);
        if (dyh) {
            (void)dt_k_convert(dyh + j, DT_BF16, dr, DT_F32, n - j);
            g = dr;
        } else if (round_dy) {
            (void)(dt_k_convert(g, DT_F32, hr, DT_BF16, n - j) < 0 || dt_k_convert(hr, DT_BF16, dr, DT_F32, n - j) < 0);
            g = dr;
        }
        float *d = dx ? dx + j : o;
        bias_gelu_tanh_bwd_row_avx2(v, b ? b + j : NULL, g, h ? d : NULL, sb ? sb + j : NULL, n - j);
        if (h)
            (void)(dt_k_convert(d, DT_F32, h + j, DT_BF16, n - j) < 0 ||
                   (dx && dt_k_convert(h + j, DT_BF16, dx + j, DT_F32, n - j) < 0));
    }
}
#endif

/* The rows of the tanh form on the widest path vec (dt__vec_level()) allows. */
static void gelu_tanh_row(int vec, const float *x, const float *b, float *y, int64_t n)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        bias_gelu_tanh_row_avx512(x, b, y, n);
        return;
    }
    if (vec) {
        bias_gelu_tanh_row_avx2(x, b, y, n);
        return;
    }
#endif
    (void)vec;
    bias_gelu_tanh_row(x, b, y, n);
}

static void gelu_tanh_bwd_row(int vec, const float *x, const float *b, const float *dy, float *dx, float *sb,
                              int64_t n)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        bias_gelu_tanh_bwd_row_avx512(x, b, dy, dx, sb, n);
        return;
    }
    if (vec) {
        bias_gelu_tanh_bwd_row_avx2(x, b, dy, dx, sb, n);
        return;
    }
#endif
    (void)vec;
    bias_gelu_tanh_bwd_row(x, b, dy, dx, sb, n);
}

dt_status dt_k_bias_gelu_fwd(const float *x, const float *bias, int64_t rows, int64_t cols, float *y,
                             dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_bias_gelu_fwd";
    if (approx != DT_K_GELU_ERF && approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown approximation %d", fn, (int)approx);
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, rows * cols);
    int nt = dt__threads_for(rows * cols * 8);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (approx == DT_K_GELU_TANH) {
            gelu_tanh_row(vec, xr, bias, yr, cols);
        } else {
            for (int64_t j = 0; j < cols; j++) {
                float v = xr[j] + (bias ? bias[j] : 0.0f);
                yr[j] = 0.5f * v * (1.0f + erff(v * SQRT1_2));
            }
        }
    }
    return DT_OK;
}

/* The backward's column blocks (f32 and low precision alike): GELU_CB_WIDE
 * columns where that still leaves every thread a block, else GELU_CB. A
 * block's rows are a stride apart: the longer run of each is read faster,
 * and both loops prefetch the rows two ahead (on the Xeon with AMX, 2
 * threads: 2048 x 3072 bf16 6.1-6.6 ms against 6.7-7.1 at 256 columns; f32
 * 256 x 3072 1.11 ms at the 64 columns it had, 0.41-0.50 at 512, 0.37-0.41
 * with the prefetch; 2048 x 3072 10.2, 6.1-6.3, 4.6-5.6). Each column's sum
 * runs over the rows in order whatever the width: the same bits. */
enum { GELU_CB = 256, GELU_CB_WIDE = 2 * GELU_CB };

static int64_t gelu_bwd_cb(int64_t cols, int nt) { return cols / GELU_CB_WIDE >= nt ? GELU_CB_WIDE : GELU_CB; }

dt_status dt_k_bias_gelu_bwd(const float *x, const float *bias, const float *dy, int64_t rows, int64_t cols,
                             float *dx, float *dbias, dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_bias_gelu_bwd";
    if (approx != DT_K_GELU_ERF && approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown approximation %d", fn, (int)approx);
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, dy, rows * cols);
    if (!dx && !dbias)
        return DT_OK;
    int nt = dt__threads_for(rows * cols * 8);
    const int64_t cb = gelu_bwd_cb(cols, nt), nblk = (cols + cb - 1) / cb;
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bk = 0; bk < nblk; bk++) {
        int64_t j0 = bk * cb, j1 = j0 + cb < cols ? j0 + cb : cols;
        float sb[GELU_CB_WIDE] = {0};
        for (int64_t r = 0; r < rows && approx == DT_K_GELU_TANH; r++) {
            if (r + 2 < rows)
                for (int64_t k = j0; k < j1; k += 16) {
                    __builtin_prefetch(x + (r + 2) * cols + k);
                    __builtin_prefetch(dy + (r + 2) * cols + k);
                }
            gelu_tanh_bwd_row(vec, x + r * cols + j0, bias ? bias + j0 : NULL, dy + r * cols + j0,
                                   dx ? dx + r * cols + j0 : NULL, sb, j1 - j0);
        }
        for (int64_t r = 0; r < rows && approx == DT_K_GELU_ERF; r++) {
            const float *xr = x + r * cols, *gr = dy + r * cols;
            for (int64_t j = j0; j < j1; j++) {
                float v = xr[j] + (bias ? bias[j] : 0.0f);
                float g = gr[j] * gelu_erf_d(v);
                if (dx)
                    dx[r * cols + j] = g;
                sb[j - j0] += g;
            }
        }
        if (dbias)
            for (int64_t j = j0; j < j1; j++)
                dbias[j] = sb[j - j0];
    }
    return DT_OK;
}

/* Low-precision x (bf16/f16) with an f32 bias: the rows widened block by
 * block into a stack buffer (dt_k_convert, exact; bf16 on the avx512 paths
 * in registers) and run through the same row loops, so y, dx and dbias are
 * bit-identical to dt_k_convert to f32 followed by dt_k_bias_gelu_fwd /
 * _bwd; a result of dtype t is then rounded, dy first rounded (the gradient
 * of such a result), and dx rounded to t (its gradient holds values of its
 * dtype). */
dt_status dt_k_bias_gelu_fwd_lp(dt_dtype t, const void *x, const float *bias, int64_t rows, int64_t cols, void *y,
                                dt_dtype yt, dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_bias_gelu_fwd_lp";
    if (!lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "%s: dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    if (yt != DT_F32 && yt != t)
        return dt_error(DT_ERR_DTYPE, "%s: result dtype %s; want f32 or %s", fn, dt_dtype_name(yt), dt_dtype_name(t));
    if (approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: approximation %d; only the tanh form has a low-precision path",
                        fn, (int)approx);
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, rows * cols);
    int nt = dt__threads_for(rows * cols * 8), bad = 0;
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t r = 0; r < rows; r++) {
        float v[LP_BLK];
        for (int64_t j = 0; j < cols; j += LP_BLK) {
            int64_t c = cols - j < LP_BLK ? cols - j : LP_BLK, o = r * cols + j;
            float *y32 = yt == DT_F32 ? (float *)y + o : NULL;
#if DT__X86_VEC
            if (t == DT_BF16 && vec >= DT__VEC_AVX512) {
                bias_gelu_tanh_row_bf16_avx512((const uint16_t *)x + o, bias ? bias + j : NULL, y32,
                                               y32 ? NULL : (uint16_t *)y + o, c);
                continue;
            }
#endif
            bad |= dt_k_convert((const uint16_t *)x + o, t, v, DT_F32, c) < 0;
            gelu_tanh_row(vec, v, bias ? bias + j : NULL, y32 ? y32 : v, c);
            if (!y32)
                bad |= dt_k_convert(v, DT_F32, (uint16_t *)y + o, t, c) < 0;
        }
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", fn) : DT_OK;
}

dt_status dt_k_bias_gelu_bwd_lp(dt_dtype t, const void *x, const float *bias, const float *dy, const void *dy_lp,
                                bool round_dy, int64_t rows, int64_t cols, float *dx, void *dx_lp, float *dbias,
                                dt_k_gelu_approx approx)
{
    const char *fn = "dt_k_bias_gelu_bwd_lp";
    if (!lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "%s: dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    if (approx != DT_K_GELU_TANH)
        return dt_error(DT_ERR_INVALID_ARG, "%s: approximation %d; only the tanh form has a low-precision path",
                        fn, (int)approx);
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    DT__CHECK_PTR(fn, x, rows * cols);
    if (!dy_lp) /* else dy is not read */
        DT__CHECK_PTR(fn, dy, rows * cols);
    if (!dx && !dx_lp && !dbias)
        return DT_OK;
    int nt = dt__threads_for(rows * cols * 8), bad = 0;
    const int64_t cb = gelu_bwd_cb(cols, nt);
    const int64_t nblk = (cols + cb - 1) / cb;
    const int vec = dt__vec_level();
    /* column blocks, each summing its rows in order: dbias does not depend
     * on the block width or the thread count (each column's sum is the f32
     * kernel's) */
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t bk = 0; bk < nblk; bk++) {
        int64_t j0 = bk * cb, c = cols - j0 < cb ? cols - j0 : cb;
        float sb[GELU_CB_WIDE] = {0}, v[GELU_CB_WIDE], dr[GELU_CB_WIDE], dw[GELU_CB_WIDE];
        uint16_t hb[GELU_CB_WIDE];
        for (int64_t r = 0; r < rows; r++) {
            /* d: dx's row, or (dx_lp alone) the f32 values' scratch; h: dx_lp's row, or scratch */
            float *d = dx ? dx + r * cols + j0 : dx_lp ? dw : NULL;
            uint16_t *h = dx_lp ? (uint16_t *)dx_lp + r * cols + j0 : d ? hb : NULL;
            const uint16_t *gh = dy_lp ? (const uint16_t *)dy_lp + r * cols + j0 : NULL;
            if (r + 2 < rows) /* the next rows' segments: rows are cols apart, so no stream runs on */
                for (int64_t k = 0; k < c; k += 32) {
                    __builtin_prefetch((const uint16_t *)x + (r + 2) * cols + j0 + k);
                    if (gh)
                        __builtin_prefetch(gh + 2 * cols + k);
                    else {
                        __builtin_prefetch(dy + (r + 2) * cols + j0 + k);
                        __builtin_prefetch(dy + (r + 2) * cols + j0 + k + 16);
                    }
                }
#if DT__X86_VEC
            if (t == DT_BF16 && vec >= DT__VEC_AVX512) {
                bias_gelu_tanh_bwd_row_bf16_avx512((const uint16_t *)x + r * cols + j0, bias ? bias + j0 : NULL,
                                                   gh ? NULL : dy + r * cols + j0, gh, round_dy, dx ? d : NULL, h,
                                                   sb, c);
                continue;
            }
#endif
            const float *g = gh ? NULL : dy + r * cols + j0;
            if (gh) { /* dy's values of t, widened */
                bad |= dt_k_convert(gh, t, dr, DT_F32, c) < 0;
                g = dr;
            } else if (round_dy) { /* dy's values of t, through hb */
                bad |= dt_k_convert(g, DT_F32, hb, t, c) < 0 || dt_k_convert(hb, t, dr, DT_F32, c) < 0;
                g = dr;
            }
            bad |= dt_k_convert((const uint16_t *)x + r * cols + j0, t, v, DT_F32, c) < 0;
            gelu_tanh_bwd_row(vec, v, bias ? bias + j0 : NULL, g, d, sb, c);
            if (d)
                bad |= dt_k_convert(d, DT_F32, h, t, c) < 0 || dt_k_convert(h, t, d, DT_F32, c) < 0;
        }
        if (dbias)
            memcpy(dbias + j0, sb, (size_t)c * sizeof(float));
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", fn) : DT_OK;
}

/* ---- dropout ------------------------------------------------------------------------ */
static dt_status dropout(const char *fn, const float *x, float *y, int64_t n, float p, dt_rng_key key, uint64_t off)
{
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    if (!(p >= 0.0f && p < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: p = %g must be in [0, 1)", fn, (double)p);
    if (p == 0.0f) {
        if (x != y && n)
            memmove(y, x, (size_t)n * sizeof(float));
        return DT_OK;
    }
    float scale = 1.0f / (1.0f - p);
    /* Tasks of 1024 elements aligned to global element indices. */
    const int64_t T = 1024;
    int64_t ntask = (n + T - 1) / T;
    int nt = dt__threads_for(n * 4);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t t = 0; t < ntask; t++) {
        int64_t lo = t * T, hi = lo + T < n ? lo + T : n;
        int64_t i = lo;
        while (i < hi) {
            uint64_t g = off + (uint64_t)i;
            uint32_t o[4];
            dt_rng_block(key, g >> 2, o);
            for (unsigned lane = (unsigned)(g & 3); lane < 4 && i < hi; lane++, i++) {
                float u = (float)(o[lane] >> 8) * (1.0f / 16777216.0f);
                y[i] = u >= p ? x[i] * scale : 0.0f;
            }
        }
    }
    return DT_OK;
}

dt_status dt_k_dropout_fwd(const float *x, float *y, int64_t n, float p, dt_rng_key key, uint64_t offset)
{
    return dropout("dt_k_dropout_fwd", x, y, n, p, key, offset);
}

dt_status dt_k_dropout_bwd(const float *dy, float *dx, int64_t n, float p, dt_rng_key key, uint64_t offset)
{
    return dropout("dt_k_dropout_bwd", dy, dx, n, p, key, offset);
}

/* ---- embedding ------------------------------------------------------------------------ */
static dt_status idx_check(const char *fn, const void *idx, dt_dtype t, int64_t n, int64_t num)
{
    if (t != DT_I64 && t != DT_I32)
        return dt_error(DT_ERR_DTYPE, "%s: indices must be i64 or i32, got %s", fn, dt_dtype_name(t));
    DT__CHECK_PTR(fn, idx, n);
    for (int64_t i = 0; i < n; i++) {
        int64_t v = t == DT_I64 ? ((const int64_t *)idx)[i] : ((const int32_t *)idx)[i];
        if (v < 0 || v >= num)
            return dt_error(DT_ERR_RANGE, "%s: index %lld at position %lld is outside [0, %lld)", fn, (long long)v,
                            (long long)i, (long long)num);
    }
    return DT_OK;
}

dt_status dt_k_embedding_fwd(const float *table, int64_t num, int64_t dim, const void *idx, dt_dtype it, int64_t n,
                             float *out)
{
    const char *fn = "dt_k_embedding_fwd";
    DT__CHECK_N(fn, num);
    DT__CHECK_N(fn, dim);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, table, num * dim);
    DT__CHECK_PTR(fn, out, n * dim);
    dt_status st = idx_check(fn, idx, it, n, num);
    if (st < 0)
        return st;
    int nt = dt__threads_for(n * dim);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) {
        int64_t v = it == DT_I64 ? ((const int64_t *)idx)[i] : ((const int32_t *)idx)[i];
        memcpy(out + i * dim, table + v * dim, (size_t)dim * sizeof(float));
    }
    return DT_OK;
}

dt_status dt_k_embedding_bwd(const float *dout, const void *idx, dt_dtype it, int64_t n, int64_t num, int64_t dim,
                             float *dtable)
{
    const char *fn = "dt_k_embedding_bwd";
    DT__CHECK_N(fn, num);
    DT__CHECK_N(fn, dim);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, dout, n * dim);
    DT__CHECK_PTR(fn, dtable, num * dim);
    dt_status st = idx_check(fn, idx, it, n, num);
    if (st < 0)
        return st;
    if (num > 0 && dim > 0)
        memset(dtable, 0, (size_t)(num * dim) * sizeof(float));
    const int64_t CB = 64;
    int64_t nblk = (dim + CB - 1) / CB;
    int nt = dt__threads_for(n * dim);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t j0 = b * CB, j1 = j0 + CB < dim ? j0 + CB : dim;
        for (int64_t i = 0; i < n; i++) {
            int64_t v = it == DT_I64 ? ((const int64_t *)idx)[i] : ((const int32_t *)idx)[i];
            float *restrict d = dtable + v * dim;
            const float *restrict g = dout + i * dim;
#pragma omp simd
            for (int64_t j = j0; j < j1; j++)
                d[j] += g[j];
        }
    }
    return DT_OK;
}
