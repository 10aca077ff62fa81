/* Causal attention with a sliding window (Mistral's, Qwen2's, Gemma 2's
 * and 3's sliding layers: query i sees the keys (i - window, i]) and/or
 * soft-capped scores (Gemma 2's attn_logit_softcapping: cap tanh(s / cap)
 * before the softmax), over dt_k_attention_fwd's packed qkv (B, T, 3C) and
 * into its (B, T, C) output: the entry points of dt_attention_window.
 * Without a cap they run the blocked kernel (attention.c) with the window:
 * key blocks outside every row's window skipped, the window's edge masked
 * inside a block as the causal diagonal is, f32 or a bf16/f16 qkv read as
 * it is (the _lp entry points). The kernel below, the plain one, is left
 * for the soft cap only (with or without a window; f32 only), which the
 * blocked kernel has no place for.
 *
 * The plain kernel: one task per (b, h). It first copies the head's keys (and, backward, its
 * values) transposed into per-thread scratch, [D][T], so that a query's
 * row of scores is D multiply-adds along contiguous keys (vectorised over
 * the keys, no horizontal sums), and so are the backward's dP row and its
 * updates of dk and dv, accumulated transposed ([D][T]) and copied back at
 * the end. A window makes the work O(T window) instead of O(T^2); memory is
 * O(D T) per thread, never T x T. lse (B, H, T) keeps each row's
 * log-sum-exp of the (capped) scores c; the backward recomputes
 *     c_ij = cap tanh(s_ij / cap) (or s_ij),  P_ij = exp(c_ij - lse_i),
 *     Di = dy_i . y_i,  dv_j += P_ij dy_i,  dC_ij = P_ij (dy_i . v_j - Di),
 *     dS_ij = dC_ij (1 - (c_ij / cap)^2) (or dC_ij)      (tanh' = 1 - tanh^2)
 *     dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i.
 * The task owns the head's columns of dq, dk and dv, so no two threads
 * write one element, and every sum runs in a fixed order (the results do
 * not depend on the thread count). tanh is tanh_f (within 1.5 ulp), exp
 * dt__expf (within 2 ulp of expf), in f32. */
#include "kernels/kernels_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W_DMAX 256

static dt_status window_args(const char *fn, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window, float cap)
{
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, T);
    if (H <= 0 || D <= 0 || D > W_DMAX)
        return dt_error(DT_ERR_INVALID_ARG, "%s: heads (%lld) must be > 0 and the head size (%lld) in [1, %d]", fn,
                        (long long)H, (long long)D, W_DMAX);
    if (window < 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: the window %lld must be >= 0 (0: none)", fn, (long long)window);
    if (!(cap >= 0.0f) || !isfinite(cap))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the soft cap %g must be finite and >= 0 (0: none)", fn,
                        (double)cap);
    return DT_OK;
}

static inline __attribute__((always_inline)) float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int64_t e = 0; e < n; e++)
        d += a[e] * b[e];
    return d;
}

static inline __attribute__((always_inline)) void axpy(float *restrict y, float a, const float *restrict x, int64_t n)
{
#pragma omp simd
    for (int64_t e = 0; e < n; e++)
        y[e] += a * x[e];
}

/* tanh in f32 within 1.5 ulp (checked against tanh in double over
 * [-12, 12]), branch-free so that a loop of it vectorises (libm's tanhf is
 * a call per value): the odd Taylor series to x^15 below 0.55 (its next
 * term is under 5e-8 of the result there), 1 - 2 / (e^2|x| + 1) with x's
 * sign above (no cancellation: the result is over 0.5) */
static inline __attribute__((always_inline)) float tanh_f(float x)
{
    const float a = fabsf(x), x2 = x * x;
    float p = -929569.0f / 638512875.0f;
    p = p * x2 + 21844.0f / 6081075.0f;
    p = p * x2 - 1382.0f / 155925.0f;
    p = p * x2 + 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    const float small = x + x * x2 * p, big = 1.0f - 2.0f / (dt__expf(2.0f * a) + 1.0f);
    return a < 0.55f ? small : copysignf(big, x);
}

/* r[j] = exp(r[j] - sub), j < n: dt__expf, 8 lanes a step where vec allows
 * (dt__expf8: the same bits) */
DT__AVX2 static void exp_row_avx2(float *r, int64_t n, float sub)
{
    const __m256 m = _mm256_set1_ps(sub);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(r + j, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(r + j), m)));
    for (; j < n; j++)
        r[j] = dt__expf(r[j] - sub);
}

static void exp_row(int vec, float *r, int64_t n, float sub)
{
    if (vec >= DT__VEC_AVX2) {
        exp_row_avx2(r, n, sub);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        r[j] = dt__expf(r[j] - sub);
}

/* t[j] = tanh_f(r[j] scale / cap) and r[j] = cap t[j], j < n (t NULL: r
 * only), 8 lanes a step where vec allows: tanh_f's operations in its order
 * (no fused multiply-adds in this build), the same bits */
DT__AVX2 static void cap_row_avx2(float *r, float *t, int64_t n, float scale, float cap)
{
    const float inv = 1.0f / cap;
    const __m256 vs = _mm256_set1_ps(scale), vi = _mm256_set1_ps(inv), vc = _mm256_set1_ps(cap);
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const float c[7] = {-929569.0f / 638512875.0f, 21844.0f / 6081075.0f, -1382.0f / 155925.0f, 62.0f / 2835.0f,
                        -17.0f / 315.0f, 2.0f / 15.0f, -1.0f / 3.0f};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 x = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(r + j), vs), vi);
        const __m256 a = _mm256_andnot_ps(sign, x), x2 = _mm256_mul_ps(x, x);
        __m256 p = _mm256_set1_ps(c[0]);
        for (int k = 1; k < 7; k++)
            p = _mm256_add_ps(_mm256_mul_ps(p, x2), _mm256_set1_ps(c[k]));
        const __m256 small = _mm256_add_ps(x, _mm256_mul_ps(_mm256_mul_ps(x, x2), p));
        const __m256 e = dt__expf8(_mm256_mul_ps(two, a));
        __m256 big = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
        big = _mm256_or_ps(_mm256_andnot_ps(sign, big), _mm256_and_ps(sign, x)); /* copysignf */
        const __m256 th = _mm256_blendv_ps(small, big, _mm256_cmp_ps(a, _mm256_set1_ps(0.55f), _CMP_NLT_UQ));
        if (t)
            _mm256_storeu_ps(t + j, th);
        _mm256_storeu_ps(r + j, _mm256_mul_ps(vc, th));
    }
    for (; j < n; j++) {
        const float th = tanh_f(r[j] * scale * inv);
        if (t)
            t[j] = th;
        r[j] = cap * th;
    }
}

void dt__att_cap_row(int vec, float *r, float *t, int64_t n, float scale, float cap)
{
    if (vec >= DT__VEC_AVX2) {
        cap_row_avx2(r, t, n, scale, cap);
        return;
    }
    const float inv = 1.0f / cap;
    for (int64_t j = 0; j < n; j++) {
        const float th = tanh_f(r[j] * scale * inv);
        if (t)
            t[j] = th;
        r[j] = cap * th;
    }
}

/* the first key query i sees */
static inline int64_t first_key(int64_t i, int64_t window)
{
    return window > 0 && i + 1 > window ? i + 1 - window : 0;
}

/* The head's keys (part 1) or values (part 2) of batch b transposed: xt[e T + j] = x_j[e] */
static inline __attribute__((always_inline)) void transpose_head(const float *qkv, int64_t b, int64_t h, int64_t T, int64_t H, int64_t D, int part,
                           float *xt)
{
    const int64_t C = H * D, ld = 3 * C;
    const float *x = qkv + (size_t)(b * T) * (size_t)ld + (size_t)(part * C + h * D);
    for (int64_t j = 0; j < T; j++)
        for (int64_t e = 0; e < D; e++)
            xt[e * T + j] = x[j * ld + e];
}

/* out[j] = x . m_j for n keys j, m transposed ([D] rows of stride T): D
 * multiply-adds along the keys, in e order (the scores' q . k_j, the
 * backward's dy_i . v_j) */
static inline __attribute__((always_inline)) void along_keys(const float *x, const float *mt, int64_t T, int64_t D,
                                                             int64_t n, float *restrict out)
{
    for (int64_t j = 0; j < n; j++)
        out[j] = 0.0f;
    for (int64_t e = 0; e < D; e++) {
        const float a = x[e], *restrict m = mt + e * T;
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            out[j] += a * m[j];
    }
}

/* Query i's scores over keys [j0, i] into s[j0..i] (the same arithmetic
 * forward and backward: the backward's probabilities are the forward's);
 * t[j], when not NULL, the tanh of each (capped scores only). */
static inline __attribute__((always_inline)) void row_scores(int vec, const float *qi, const float *kt, int64_t T,
                                                             int64_t D, int64_t j0, int64_t i, float scale, float cap,
                                                             float *s, float *t)
{
    const int64_t n = i + 1 - j0;
    float *restrict r = s + j0;
    along_keys(qi, kt + j0, T, D, n, r);
    if (cap > 0.0f) {
        dt__att_cap_row(vec, r, t ? t + j0 : NULL, n, scale, cap);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++)
            r[j] *= scale;
    }
}

/* Head bh = b H + h: its rows of y and lse. kt: [D][T] scratch, s: a row of T. */
static inline __attribute__((always_inline)) void fwd_head_body(int vec, const float *qkv, int64_t T, int64_t H, int64_t D,
                                                                int64_t window, float cap, int64_t bh, float *kt,
                                                                float *s, float *y, float *lse)
{
    const int64_t b = bh / H, h = bh % H, C = H * D, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)D);
    const float *base = qkv + (size_t)(b * T) * (size_t)ld;
    transpose_head(qkv, b, h, T, H, D, 1, kt);
    for (int64_t i = 0; i < T; i++) {
        const int64_t j0 = first_key(i, window), n = i + 1 - j0;
        row_scores(vec, base + i * ld + h * D, kt, T, D, j0, i, scale, cap, s, NULL);
        float *restrict r = s + j0, mx = -INFINITY, sum = 0.0f;
        for (int64_t j = 0; j < n; j++)
            mx = r[j] > mx ? r[j] : mx;
        exp_row(vec, r, n, mx);
        for (int64_t j = 0; j < n; j++)
            sum += r[j];
        float *yi = y + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
        memset(yi, 0, (size_t)D * sizeof *yi);
        const float rs = 1.0f / sum;
        for (int64_t j = 0; j < n; j++)
            axpy(yi, r[j] * rs, base + (j0 + j) * ld + 2 * C + h * D, D);
        lse[bh * T + i] = mx + logf(sum);
    }
}

/* Head bh's columns of dqkv. w: bwd_floats(T, D) of scratch. */
static inline __attribute__((always_inline)) void bwd_head_body(int vec, const float *qkv, const float *y, const float *lse,
                                                                const float *dy, int64_t T, int64_t H, int64_t D,
                                                                int64_t window, float cap, int64_t bh, float *w,
                                                                float *dqkv)
{
    const int64_t b = bh / H, h = bh % H, C = H * D, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)D);
    const float *base = qkv + (size_t)(b * T) * (size_t)ld;
    float *gbase = dqkv + (size_t)(b * T) * (size_t)ld;
    float *kt = w, *vt = kt + D * T, *dkt = vt + D * T, *dvt = dkt + D * T, *s = dvt + D * T, *t = s + T, *u = t + T;
    transpose_head(qkv, b, h, T, H, D, 1, kt);
    transpose_head(qkv, b, h, T, H, D, 2, vt);
    memset(dkt, 0, (size_t)(2 * D * T) * sizeof(float)); /* dkt and dvt */
    for (int64_t i = 0; i < T; i++) {
        const float *qi = base + i * ld + h * D;
        const float *dyi = dy + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
        const float *yi = y + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
        const float Di = dot(dyi, yi, D), L = lse[bh * T + i];
        const int64_t j0 = first_key(i, window), n = i + 1 - j0;
        row_scores(vec, qi, kt, T, D, j0, i, scale, cap, s, t);
        float *restrict P = s + j0, *restrict th = t + j0, *restrict dS = u + j0;
        exp_row(vec, P, n, L);
        along_keys(dyi, vt + j0, T, D, n, dS); /* dy_i . v_j */
        if (cap > 0.0f) {
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                dS[j] = P[j] * (dS[j] - Di) * (1.0f - th[j] * th[j]) * scale;
        } else {
#pragma omp simd
            for (int64_t j = 0; j < n; j++)
                dS[j] = P[j] * (dS[j] - Di) * scale;
        }
        float *dqi = gbase + i * ld + h * D;
        for (int64_t e = 0; e < D; e++) {
            const float *restrict k = kt + e * T + j0;
            float acc_e = 0.0f;
#pragma omp simd reduction(+ : acc_e)
            for (int64_t j = 0; j < n; j++)
                acc_e += dS[j] * k[j];
            dqi[e] = acc_e;
            const float q = qi[e], g = dyi[e];
            float *restrict dk = dkt + e * T + j0, *restrict dv = dvt + e * T + j0;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) {
                dk[j] += dS[j] * q;
                dv[j] += P[j] * g;
            }
        }
    }
    for (int64_t j = 0; j < T; j++) /* dk and dv back from [D][T] */
        for (int64_t e = 0; e < D; e++) {
            gbase[j * ld + C + h * D + e] = dkt[e * T + j];
            gbase[j * ld + 2 * C + h * D + e] = dvt[e * T + j];
        }
}

/* The bodies compiled for each vector level (dt__vec_level: the CPU's, or
 * dtrain's cap): the loops along the keys and over D vectorised 4, 8 or
 * 16 wide (the results differ between the levels by rounding only: the
 * order of the vector sums over D and along the keys) */
#define HEAD_FNS(sfx, attr)                                                                                         \
    attr static void fwd_head_##sfx(int vec, const float *qkv, int64_t T, int64_t H, int64_t D, int64_t window, float cap,  \
                                    int64_t bh, float *kt, float *s, float *y, float *lse)                          \
    {                                                                                                               \
        fwd_head_body(vec, qkv, T, H, D, window, cap, bh, kt, s, y, lse);                                                \
    }                                                                                                               \
    attr static void bwd_head_##sfx(int vec, const float *qkv, const float *y, const float *lse, const float *dy, int64_t T, \
                                    int64_t H, int64_t D, int64_t window, float cap, int64_t bh, float *w,          \
                                    float *dqkv)                                                                    \
    {                                                                                                               \
        bwd_head_body(vec, qkv, y, lse, dy, T, H, D, window, cap, bh, w, dqkv);                                          \
    }
HEAD_FNS(base, )
HEAD_FNS(avx2, DT__AVX2)
HEAD_FNS(avx512, DT__AVX512)

static void fwd_head(int vec, const float *qkv, int64_t T, int64_t H, int64_t D, int64_t window, float cap,
                     int64_t bh, float *kt, float *s, float *y, float *lse)
{
    if (vec == DT__VEC_AVX512)
        fwd_head_avx512(vec, qkv, T, H, D, window, cap, bh, kt, s, y, lse);
    else if (vec == DT__VEC_AVX2)
        fwd_head_avx2(vec, qkv, T, H, D, window, cap, bh, kt, s, y, lse);
    else
        fwd_head_base(vec, qkv, T, H, D, window, cap, bh, kt, s, y, lse);
}

static void bwd_head(int vec, const float *qkv, const float *y, const float *lse, const float *dy, int64_t T,
                     int64_t H, int64_t D, int64_t window, float cap, int64_t bh, float *w, float *dqkv)
{
    if (vec == DT__VEC_AVX512)
        bwd_head_avx512(vec, qkv, y, lse, dy, T, H, D, window, cap, bh, w, dqkv);
    else if (vec == DT__VEC_AVX2)
        bwd_head_avx2(vec, qkv, y, lse, dy, T, H, D, window, cap, bh, w, dqkv);
    else
        bwd_head_base(vec, qkv, y, lse, dy, T, H, D, window, cap, bh, w, dqkv);
}

/* Floats of scratch a forward (kt, s) or backward (kt, vt, dkt, dvt, s, t, u) task uses */
static size_t fwd_floats(int64_t T, int64_t D) { return (size_t)(D * T + T); }
static size_t bwd_floats(int64_t T, int64_t D) { return (size_t)(4 * D * T + 3 * T); }

dt_status dt_k_attention_window_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                                    float cap, float *y, float *lse)
{
    const char *fn = "dt_k_attention_window_fwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st < 0)
        return st;
    if (cap == 0.0f) /* the blocked kernel; the plain one below for the cap only */
        return dt__attention_window_fwd(fn, DT_F32, qkv, B, T, H, D, window, y, NULL, lse);
    DT__CHECK_PTR(fn, qkv, B * T * 3 * H * D);
    DT__CHECK_PTR(fn, y, B * T * H * D);
    DT__CHECK_PTR(fn, lse, B * H * T);
    const int64_t span = window > 0 && window < T ? window : T;
    const int nt = dt__threads_for(B * H * T * span * D), vec = dt__vec_level();
    bool nomem = false;
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc(fwd_floats(T, D) * sizeof(float)); /* the thread's keys and row of scores */
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++)
            if (kt)
                fwd_head(vec, qkv, T, H, D, window, cap, bh, kt, kt + D * T, y, lse);
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: %lld transposed keys and a row of scores per thread", fn,
                        (long long)(D * T));
    return DT_OK;
}

dt_status dt_k_attention_window_bwd(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                    int64_t T, int64_t H, int64_t D, int64_t window, float cap, float *dqkv)
{
    const char *fn = "dt_k_attention_window_bwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st < 0)
        return st;
    if (cap == 0.0f)
        return dt__attention_window_bwd(fn, DT_F32, qkv, y, lse, dy, B, T, H, D, window, dqkv, NULL);
    DT__CHECK_PTR(fn, qkv, B * T * 3 * H * D);
    DT__CHECK_PTR(fn, y, B * T * H * D);
    DT__CHECK_PTR(fn, lse, B * H * T);
    DT__CHECK_PTR(fn, dy, B * T * H * D);
    DT__CHECK_PTR(fn, dqkv, B * T * 3 * H * D);
    const int64_t span = window > 0 && window < T ? window : T;
    const int nt = dt__threads_for(B * H * T * span * D), vec = dt__vec_level();
    bool nomem = false;
#pragma omp parallel num_threads(nt)
    {
        float *w = dt_alloc(bwd_floats(T, D) * sizeof(float));
        if (!w) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++)
            if (w)
                bwd_head(vec, qkv, y, lse, dy, T, H, D, window, cap, bh, w, dqkv);
        dt_free(w);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: %lld floats of scratch per thread", fn,
                        (long long)bwd_floats(T, D));
    return DT_OK;
}

/* A bf16/f16 qkv; the soft cap runs on the plain kernel, f32 only, so a cap is refused here (dt_attention_window
   widens such a qkv first). */
static dt_status lp_args(const char *fn, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                         float cap)
{
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st >= 0 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_DTYPE, "%s: qkv dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    if (st >= 0 && cap > 0.0f)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: a soft cap (%g) runs on f32 only; widen the %s qkv "
                        "(dt_k_attention_window_fwd)", fn, (double)cap, dt_dtype_name(t));
    return st;
}

dt_status dt_k_attention_window_fwd_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                       int64_t window, float cap, float *y, void *ylp, float *lse)
{
    const char *fn = "dt_k_attention_window_fwd_lp";
    dt_status st = lp_args(fn, t, B, T, H, D, window, cap);
    return st < 0 ? st : dt__attention_window_fwd(fn, t, qkv, B, T, H, D, window, y, ylp, lse);
}

dt_status dt_k_attention_window_bwd_lp(dt_dtype t, const void *qkv, const float *y, const float *lse, const float *dy,
                                       int64_t B, int64_t T, int64_t H, int64_t D, int64_t window, float cap,
                                       float *dqkv, void *dqkv_lp)
{
    const char *fn = "dt_k_attention_window_bwd_lp";
    dt_status st = lp_args(fn, t, B, T, H, D, window, cap);
    return st < 0 ? st : dt__attention_window_bwd(fn, t, qkv, y, lse, dy, B, T, H, D, window, dqkv, dqkv_lp);
}
