/* Causal attention with a sliding window (Mistral's, Qwen2's, Gemma 2's
 * and 3's sliding layers: query i sees the keys (i - window, i]) and/or
 * soft-capped scores (Gemma 2's attn_logit_softcapping: cap tanh(s / cap)
 * before the softmax), over dt_k_attention_fwd's packed qkv (B, T, 3C) and
 * into its (B, T, C) output: the entry points of dt_attention_window. They
 * check their arguments and run the blocked kernel (attention.c) with the
 * window and the cap, f32 or a bf16/f16 qkv read as it is (the _lp entry
 * points) on every path it has (the f32 rows, the widened or the
 * avx512_bf16 rows of a bf16/f16 qkv, the AMX or vdpbf16ps tiles): key
 * blocks outside every row's window skipped, the window's edge masked
 * inside a block as the causal diagonal is, and a block's scores capped
 * where they are computed, before the softmax's running max (forward) and
 * before P (backward, which takes tanh's derivative 1 - tanh^2 into dS).
 * dt_k_attention_ex_fwd/_bwd are the general form over the same kernel: a
 * layer's heads (h0, Ht), the causal mask or none, and dropout on the
 * probabilities beside the window and the cap (the mask applied after the
 * capped exponentials' sum; the backward's dS = P (d dP - Di) (1 - t^2)).
 *
 * The cap's tanh (dt__att_cap_row, below) is shared with the context
 * parallel kernel (attention_part.c): tanh_f within 1.5 ulp, branch-free
 * so that a row of it vectorises, 8 lanes a step where the CPU has AVX2
 * (the same bits as the scalar loop), so the f32 results keep the blocked
 * kernel's property: the same bits on every ISA path. */
#include "kernels/kernels_impl.h"

#include <math.h>

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

static const dt_rng_key no_key;

dt_status dt_k_attention_window_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                                    float cap, float *y, float *lse)
{
    const char *fn = "dt_k_attention_window_fwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    return st < 0 ? st
                  : dt__attention_ex_fwd(fn, DT_F32, qkv, B, T, H, D, 0, H, true, window, cap, 0.0f, no_key, y, NULL,
                                         lse);
}

dt_status dt_k_attention_window_bwd(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                    int64_t T, int64_t H, int64_t D, int64_t window, float cap, float *dqkv)
{
    const char *fn = "dt_k_attention_window_bwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    return st < 0 ? st
                  : dt__attention_ex_bwd(fn, DT_F32, qkv, y, lse, dy, B, T, H, D, 0, H, true, window, cap, 0.0f,
                                         no_key, dqkv, NULL);
}

/* A bf16/f16 qkv */
static dt_status lp_args(const char *fn, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                         float cap)
{
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st >= 0 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_DTYPE, "%s: qkv dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    return st;
}

dt_status dt_k_attention_window_fwd_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                       int64_t window, float cap, float *y, void *ylp, float *lse)
{
    const char *fn = "dt_k_attention_window_fwd_lp";
    dt_status st = lp_args(fn, t, B, T, H, D, window, cap);
    return st < 0 ? st
                  : dt__attention_ex_fwd(fn, t, qkv, B, T, H, D, 0, H, true, window, cap, 0.0f, no_key, y, ylp, lse);
}

dt_status dt_k_attention_window_bwd_lp(dt_dtype t, const void *qkv, const float *y, const float *lse, const float *dy,
                                       int64_t B, int64_t T, int64_t H, int64_t D, int64_t window, float cap,
                                       float *dqkv, void *dqkv_lp)
{
    const char *fn = "dt_k_attention_window_bwd_lp";
    dt_status st = lp_args(fn, t, B, T, H, D, window, cap);
    return st < 0 ? st
                  : dt__attention_ex_bwd(fn, t, qkv, y, lse, dy, B, T, H, D, 0, H, true, window, cap, 0.0f, no_key,
                                         dqkv, dqkv_lp);
}

/* The general form: f32 or bf16/f16, a window and a cap with the causal mask only */
static dt_status ex_args(const char *fn, dt_dtype t, bool causal, int64_t window, float cap, const void *ylp)
{
    /* the shapes, heads and p: the kernel's checks (a head size over its limit: DT_ERR_UNSUPPORTED) */
    if (window < 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: the window %lld must be >= 0 (0: none)", fn, (long long)window);
    if (!(cap >= 0.0f) || !isfinite(cap))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the soft cap %g must be finite and >= 0 (0: none)", fn,
                        (double)cap);
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_DTYPE, "%s: qkv dtype %s; want f32, bf16 or f16", fn, dt_dtype_name(t));
    if (t == DT_F32 && ylp)
        return dt_error(DT_ERR_INVALID_ARG, "%s: an f32 qkv has no rounded copy of its result (pass NULL)", fn);
    if (!causal && (window > 0 || cap > 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: a sliding window (%lld) or a soft cap (%g) needs the causal mask", fn,
                        (long long)window, (double)cap);
    return DT_OK;
}

dt_status dt_k_attention_ex_fwd(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key, float *y,
                                void *ylp, float *lse)
{
    const char *fn = "dt_k_attention_ex_fwd";
    dt_status st = ex_args(fn, t, causal, window, cap, ylp);
    return st < 0 ? st : dt__attention_ex_fwd(fn, t, qkv, B, T, H, D, h0, Ht, causal, window, cap, p, key, y, ylp, lse);
}

dt_status dt_k_attention_ex_bwd(dt_dtype t, const void *qkv, const float *y, const float *lse, const float *dy,
                                int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                                int64_t window, float cap, float p, dt_rng_key key, float *dqkv, void *dqkv_lp)
{
    const char *fn = "dt_k_attention_ex_bwd";
    dt_status st = ex_args(fn, t, causal, window, cap, dqkv_lp);
    return st < 0 ? st
                  : dt__attention_ex_bwd(fn, t, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, window, cap, p, key,
                                         dqkv, dqkv_lp);
}
