/* Causal attention with what the blocked kernel (attention.c) has no place
 * for: a sliding window (Mistral's, Gemma 2's sliding layers: query i sees
 * the keys (i - window, i]) and soft-capped scores (Gemma 2's
 * attn_logit_softcapping: cap tanh(s / cap) before the softmax), over
 * dt_k_attention_fwd's packed qkv (B, T, 3C) and into its (B, T, C)
 * output.
 *
 * The kernel is plain: one task per (b, h) walks the query rows, each with
 * its row of scores in per-thread scratch (O(T) memory, never T x T; a
 * window makes the work O(T window) instead of O(T^2)). lse (B, H, T) keeps
 * each row's log-sum-exp of the (capped) scores c; the backward recomputes
 *     c_ij = cap tanh(s_ij / cap) (or s_ij),  P_ij = exp(c_ij - lse_i),
 *     Di = dy_i . y_i,  dv_j += P_ij dy_i,  dC_ij = P_ij (dy_i . v_j - Di),
 *     dS_ij = dC_ij (1 - (c_ij / cap)^2) (or dC_ij)      (tanh' = 1 - tanh^2)
 *     dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i
 * in the task that owns the head's columns of dq, dk and dv, so no two
 * threads write one element and every sum runs in a fixed order (the
 * results do not depend on the thread count). exp, log and tanh are libm's
 * in f32; the dot products over D are vectorised by the compiler. */
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

static inline float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float d = 0;
#pragma omp simd reduction(+ : d)
    for (int64_t e = 0; e < n; e++)
        d += a[e] * b[e];
    return d;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n)
{
#pragma omp simd
    for (int64_t e = 0; e < n; e++)
        y[e] += a * x[e];
}

/* the first key query i sees */
static inline int64_t first_key(int64_t i, int64_t window)
{
    return window > 0 && i + 1 > window ? i + 1 - window : 0;
}

/* Head bh = b H + h: its rows of y and lse; s: a row of T scores. */
static void fwd_head(const float *qkv, int64_t T, int64_t H, int64_t D, int64_t window, float cap, int64_t bh,
                     float *s, float *y, float *lse)
{
    const int64_t b = bh / H, h = bh % H, C = H * D, ld = 3 * C;
    const float scale = 1.0f / sqrtf((float)D), inv = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float *base = qkv + (size_t)(b * T) * (size_t)ld;
    for (int64_t i = 0; i < T; i++) {
        const float *qi = base + i * ld + h * D;
        const int64_t j0 = first_key(i, window);
        float mx = -INFINITY;
        for (int64_t j = j0; j <= i; j++) {
            const float d = dot(qi, base + j * ld + C + h * D, D) * scale;
            const float c = cap > 0.0f ? cap * tanhf(d * inv) : d;
            s[j] = c;
            mx = c > mx ? c : mx;
        }
        float sum = 0;
        for (int64_t j = j0; j <= i; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        float *yi = y + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
        memset(yi, 0, (size_t)D * sizeof *yi);
        for (int64_t j = j0; j <= i; j++)
            axpy(yi, s[j] / sum, base + j * ld + 2 * C + h * D, D);
        lse[bh * T + i] = mx + logf(sum);
    }
}

dt_status dt_k_attention_window_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                                    float cap, float *y, float *lse)
{
    const char *fn = "dt_k_attention_window_fwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, qkv, B * T * 3 * H * D);
    DT__CHECK_PTR(fn, y, B * T * H * D);
    DT__CHECK_PTR(fn, lse, B * H * T);
    const int64_t span = window > 0 && window < T ? window : T;
    const int nt = dt__threads_for(B * H * T * span * D);
    bool nomem = false;
#pragma omp parallel num_threads(nt)
    {
        float *s = dt_alloc((size_t)T * sizeof(float)); /* the thread's row of scores */
        if (!s) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++)
            if (s)
                fwd_head(qkv, T, H, D, window, cap, bh, s, y, lse);
        dt_free(s);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: a row of %lld scores per thread", fn, (long long)T);
    return DT_OK;
}

dt_status dt_k_attention_window_bwd(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                    int64_t T, int64_t H, int64_t D, int64_t window, float cap, float *dqkv)
{
    const char *fn = "dt_k_attention_window_bwd";
    dt_status st = window_args(fn, B, T, H, D, window, cap);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, qkv, B * T * 3 * H * D);
    DT__CHECK_PTR(fn, y, B * T * H * D);
    DT__CHECK_PTR(fn, lse, B * H * T);
    DT__CHECK_PTR(fn, dy, B * T * H * D);
    DT__CHECK_PTR(fn, dqkv, B * T * 3 * H * D);
    const int64_t C = H * D, ld = 3 * C, span = window > 0 && window < T ? window : T;
    const float scale = 1.0f / sqrtf((float)D), inv = cap > 0.0f ? 1.0f / cap : 0.0f;
    const int nt = dt__threads_for(B * H * T * span * D);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        const float *base = qkv + (size_t)(b * T) * (size_t)ld;
        float *gbase = dqkv + (size_t)(b * T) * (size_t)ld;
        for (int64_t t = 0; t < T; t++)
            for (int part = 0; part < 3; part++)
                memset(gbase + t * ld + part * C + h * D, 0, (size_t)D * sizeof(float));
        for (int64_t i = 0; i < T; i++) {
            const float *qi = base + i * ld + h * D;
            const float *dyi = dy + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
            const float *yi = y + (size_t)(b * T + i) * (size_t)C + (size_t)(h * D);
            const float Di = dot(dyi, yi, D), L = lse[bh * T + i];
            float *dqi = gbase + i * ld + h * D;
            for (int64_t j = first_key(i, window); j <= i; j++) {
                const float *kj = base + j * ld + C + h * D, *vj = base + j * ld + 2 * C + h * D;
                const float d = dot(qi, kj, D) * scale;
                const float t = cap > 0.0f ? tanhf(d * inv) : 0.0f, c = cap > 0.0f ? cap * t : d;
                const float P = expf(c - L);
                const float dS = P * (dot(dyi, vj, D) - Di) * (1.0f - t * t) * scale;
                axpy(gbase + j * ld + 2 * C + h * D, P, dyi, D);
                axpy(dqi, dS, kj, D);
                axpy(gbase + j * ld + C + h * D, dS, qi, D);
            }
        }
    }
    return DT_OK;
}
