/* Multi-head scaled dot-product attention over a packed qkv, blocked with an
 * online softmax (FlashAttention, Dao et al. 2022; the backward as in
 * FlashAttention-2).
 *
 * Layout: qkv (B, T, 3C) with C = H * D, the output of GPT-2's c_attn:
 * q of head h is columns [h D, (h+1) D), k the same + C, v + 2C. y (B, T, C)
 * has the heads side by side again, ready for c_proj. lse (B, H, T) is the
 * log-sum-exp of each query row's scaled scores, all the backward needs
 * besides q, k, v, y and dy.
 *
 * Forward: each task is (b, h, a block of BQ query rows). It walks the key
 * blocks of BK keys (up to the diagonal when causal), computes the scores of
 * the block, and rescales its running max, sum and output accumulator
 * (online softmax), so memory is O(BQ * (BK + D)) per task whatever T is:
 * the (T, T) score matrix never exists.
 *
 * Backward: one task per (b, h): it owns that head's columns of dq, dk and
 * dv, so no two threads write the same element and the sums run in a fixed
 * order (results do not depend on the thread count). For each key block it
 * recomputes P = exp(s - lse) row by row from q and k (nothing of size T x T
 * was saved), with Di = dy_i . y_i:
 *   dv_j += P_ij dy_i,  dP_ij = dy_i . v_j,  dS_ij = P_ij (dP_ij - Di),
 *   dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i.
 * Dropout on the probabilities (p > 0) keeps element (b, h, i, j) when
 * dt_rng_uniform(key, ((b H + h) T + i) T + j) >= p, scaled by 1/(1-p); the
 * backward regenerates the same mask. lse is that of the undropped scores,
 * and Di = dy_i . y_i still holds with dropout.
 *
 * The inner products run over D contiguous floats (vectorised); at GPT-2
 * sizes attention is a few percent of a step's FLOPs, the projections
 * around it are oneDNN matmuls. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

#define BQ 16
#define BK 64
#define DMAX 256

static dt_status attn_args(const char *fn, int64_t B, int64_t T, int64_t H, int64_t D, float p)
{
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, T);
    if (H <= 0 || D <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: heads (%lld) and head size (%lld) must be > 0", fn, (long long)H,
                        (long long)D);
    if (D > DMAX)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: head size %lld is above the kernel's limit %d", fn, (long long)D,
                        DMAX);
    if (!(p >= 0.0f && p < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: dropout probability %g is outside [0, 1)", fn, (double)p);
    return DT_OK;
}

static inline float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

static inline void axpy(float a, const float *x, float *y, int64_t n)
{
#pragma omp simd
    for (int64_t d = 0; d < n; d++)
        y[d] += a * x[d];
}

/* Whether dropout keeps element (bh, i, j); bh = b H + h of the local
 * heads, counted as head h0 + h of Ht in the mask (dt_k_attention_fwd_heads). */
static inline bool keep(dt_rng_key key, float p, int64_t bh, int64_t H, int64_t h0, int64_t Ht, int64_t T, int64_t i,
                        int64_t j)
{
    const int64_t g = (bh / H) * Ht + h0 + bh % H;
    return dt_rng_uniform(key, (uint64_t)((g * T + i) * T + j)) >= p;
}

static dt_status heads_args(const char *fn, int64_t H, int64_t h0, int64_t Ht)
{
    if (h0 < 0 || Ht < H || h0 > Ht - H)
        return dt_error(DT_ERR_INVALID_ARG, "%s: heads [%lld, %lld) are not within %lld heads", fn, (long long)h0,
                        (long long)(h0 + H), (long long)Ht);
    return DT_OK;
}

dt_status dt_k_attention_fwd(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, bool causal, float p,
                             dt_rng_key key, float *y, float *lse)
{
    return dt_k_attention_fwd_heads(qkv, B, T, H, D, 0, H, causal, p, key, y, lse);
}

dt_status dt_k_attention_bwd(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                             int64_t T, int64_t H, int64_t D, bool causal, float p, dt_rng_key key, float *dqkv)
{
    return dt_k_attention_bwd_heads(qkv, y, lse, dy, B, T, H, D, 0, H, causal, p, key, dqkv);
}

dt_status dt_k_attention_fwd_heads(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                   int64_t Ht, bool causal, float p, dt_rng_key key, float *y, float *lse)
{
    const char *fn = "dt_k_attention_fwd";
    dt_status st = attn_args(fn, B, T, H, D, p);
    if (st >= 0)
        st = heads_args(fn, H, h0, Ht);
    if (st < 0)
        return st;
    int64_t C = H * D, C3 = 3 * C;
    DT__CHECK_PTR(fn, qkv, B * T * C3);
    DT__CHECK_PTR(fn, y, B * T * C);
    DT__CHECK_PTR(fn, lse, B * H * T);
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    int64_t nqb = (T + BQ - 1) / BQ, ntask = B * H * nqb;
    int nt = dt__threads_for(B * T * T * C);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < ntask; task++) {
        int64_t bh = task / nqb, qb = task % nqb, b = bh / H, h = bh % H;
        int64_t i0 = qb * BQ, i1 = i0 + BQ < T ? i0 + BQ : T, nq = i1 - i0;
        const float *base = qkv + b * T * C3;
        float m[BQ], l[BQ], s[BK];
        float acc[BQ][DMAX];
        for (int64_t r = 0; r < nq; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(acc[r], 0, (size_t)D * sizeof(float));
        }
        int64_t kend = causal ? i1 : T;
        for (int64_t j0 = 0; j0 < kend; j0 += BK) {
            int64_t j1 = j0 + BK < kend ? j0 + BK : kend;
            for (int64_t r = 0; r < nq; r++) {
                int64_t i = i0 + r, je = causal && i + 1 < j1 ? i + 1 : j1;
                if (je <= j0)
                    continue;
                const float *q = base + i * C3 + h * D;
                float mx = m[r];
                for (int64_t j = j0; j < je; j++) {
                    float v = dot(q, base + j * C3 + C + h * D, D) * scale;
                    s[j - j0] = v;
                    mx = v > mx ? v : mx;
                }
                float corr = expf(m[r] - mx), sum = 0.0f; /* m[r] = -inf the first time: 0 */
                float *a = acc[r];
#pragma omp simd
                for (int64_t d = 0; d < D; d++)
                    a[d] *= corr;
                for (int64_t j = j0; j < je; j++) {
                    float e = expf(s[j - j0] - mx);
                    sum += e;
                    if (p > 0.0f)
                        e = keep(key, p, bh, H, h0, Ht, T, i, j) ? e * pscale : 0.0f;
                    axpy(e, base + j * C3 + 2 * C + h * D, a, D);
                }
                l[r] = l[r] * corr + sum;
                m[r] = mx;
            }
        }
        for (int64_t r = 0; r < nq; r++) {
            int64_t i = i0 + r;
            float *yo = y + (b * T + i) * C + h * D;
            float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            for (int64_t d = 0; d < D; d++)
                yo[d] = acc[r][d] * inv;
            lse[bh * T + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
        }
    }
    return DT_OK;
}

dt_status dt_k_attention_bwd_heads(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal, float p,
                                   dt_rng_key key, float *dqkv)
{
    const char *fn = "dt_k_attention_bwd";
    dt_status st = attn_args(fn, B, T, H, D, p);
    if (st >= 0)
        st = heads_args(fn, H, h0, Ht);
    if (st < 0)
        return st;
    int64_t C = H * D, C3 = 3 * C;
    DT__CHECK_PTR(fn, qkv, B * T * C3);
    DT__CHECK_PTR(fn, y, B * T * C);
    DT__CHECK_PTR(fn, lse, B * H * T);
    DT__CHECK_PTR(fn, dy, B * T * C);
    DT__CHECK_PTR(fn, dqkv, B * T * C3);
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    int nt = dt__threads_for(B * T * T * C * 2);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H;
        const float *base = qkv + b * T * C3;
        float *gbase = dqkv + b * T * C3;
        for (int64_t t = 0; t < T; t++) /* this head's columns of dq, dk, dv */
            for (int k = 0; k < 3; k++)
                memset(gbase + t * C3 + k * C + h * D, 0, (size_t)D * sizeof(float));
        for (int64_t j0 = 0; j0 < T; j0 += BK) {
            int64_t j1 = j0 + BK < T ? j0 + BK : T;
            for (int64_t i = causal ? j0 : 0; i < T; i++) {
                int64_t je = causal && i + 1 < j1 ? i + 1 : j1;
                const float *q = base + i * C3 + h * D, *g = dy + (b * T + i) * C + h * D;
                const float *yo = y + (b * T + i) * C + h * D;
                float *gq = gbase + i * C3 + h * D;
                float L = lse[bh * T + i], Di = dot(g, yo, D);
                for (int64_t j = j0; j < je; j++) {
                    const float *k = base + j * C3 + C + h * D, *v = base + j * C3 + 2 * C + h * D;
                    float P = expf(dot(q, k, D) * scale - L);
                    float dP = dot(g, v, D), Pd = P;
                    if (p > 0.0f) {
                        bool kp = keep(key, p, bh, H, h0, Ht, T, i, j);
                        Pd = kp ? P * pscale : 0.0f;
                        dP = kp ? dP * pscale : 0.0f;
                    }
                    axpy(Pd, g, gbase + j * C3 + 2 * C + h * D, D);
                    float dS = P * (dP - Di) * scale;
                    axpy(dS, k, gq, D);
                    axpy(dS, q, gbase + j * C3 + C + h * D, D);
                }
            }
        }
    }
    return DT_OK;
}
