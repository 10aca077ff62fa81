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
 * Each key (and value) block is first copied transposed (D x BK, per-thread
 * scratch), so a query row's BK scores are one loop over D of multiply-adds
 * along contiguous keys (vectorised, no horizontal sums), and the updates
 * of the output, dq, dk and dv are multiply-adds along D. All of them are
 * rows_acc: the running sums of 32 or 64 columns stay in registers over the
 * terms. The backward keeps the block's P and dS ([T, BK] each, per-thread
 * scratch) so that dk_j and dv_j are each one such sum over the rows i, and
 * dq_i one over the block's keys. Every sum runs in a fixed order (scores in
 * d order, the rest in key or query order), so the AVX-512 (16 lanes), AVX2
 * and baseline paths give the same bits. At GPT-2 sizes attention is
 * a few percent of a step's FLOPs, the projections around it are oneDNN
 * matmuls. */
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

/* a . b summed in index order (the same bits on every code path). */
static inline float dot_seq(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* out[d] += c[t cs] x[t xs + d] for t = 0, 1, ..., n-1 in that order, for
 * d < D: each element's sum is the sequence of adds the scalar loop
 * "for t: out[d] += c * x[d]" makes (product rounded, then the sum: the
 * targets have no FMA), but the running sums stay in registers over t, 64
 * or 32 columns at a time, instead of a load and a store of out per term.
 * Written with GCC's vector extension: 8-float vectors (ymm) in the AVX2
 * version, 4-float ones (xmm) in the baseline one; the same bits either way.
 * Loads and stores go through memcpy, so no vector value crosses a call
 * (GCC's -Wpsabi) and rows need not be aligned. */
#define ROWS_ACC(name, attr, VT, VW)                                                                            \
    attr static inline void name(float *restrict out, const float *restrict c, int64_t cs,                    \
                                 const float *restrict x, int64_t xs, int64_t n, int64_t D)                   \
    {                                                                                                          \
        int64_t d0 = 0;                                                                                        \
        for (; d0 + 64 <= D && VW == 8; d0 += 64) {                                                            \
            VT a[64 / VW];                                                                                     \
            memcpy(a, out + d0, sizeof a);                                                                     \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                const float ct = c[t * cs], *xr = x + t * xs + d0;                                             \
                _Pragma("GCC unroll 16") for (int k = 0; k < 64 / VW; k++)                                     \
                {                                                                                              \
                    VT v;                                                                                      \
                    memcpy(&v, xr + k * VW, sizeof v);                                                         \
                    a[k] += ct * v;                                                                            \
                }                                                                                              \
            }                                                                                                  \
            memcpy(out + d0, a, sizeof a);                                                                     \
        }                                                                                                      \
        for (; d0 + 32 <= D; d0 += 32) {                                                                       \
            VT a[32 / VW];                                                                                     \
            memcpy(a, out + d0, sizeof a);                                                                     \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                const float ct = c[t * cs], *xr = x + t * xs + d0;                                             \
                _Pragma("GCC unroll 16") for (int k = 0; k < 32 / VW; k++)                                     \
                {                                                                                              \
                    VT v;                                                                                      \
                    memcpy(&v, xr + k * VW, sizeof v);                                                         \
                    a[k] += ct * v;                                                                            \
                }                                                                                              \
            }                                                                                                  \
            memcpy(out + d0, a, sizeof a);                                                                     \
        }                                                                                                      \
        for (; d0 + VW <= D; d0 += VW) {                                                                       \
            VT a, v;                                                                                           \
            memcpy(&a, out + d0, sizeof a);                                                                    \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                memcpy(&v, x + t * xs + d0, sizeof v);                                                         \
                a += c[t * cs] * v;                                                                            \
            }                                                                                                  \
            memcpy(out + d0, &a, sizeof a);                                                                    \
        }                                                                                                      \
        for (; d0 < D; d0++) {                                                                                 \
            float a = out[d0];                                                                                 \
            for (int64_t t = 0; t < n; t++)                                                                    \
                a += c[t * cs] * x[t * xs + d0];                                                               \
            out[d0] = a;                                                                                       \
        }                                                                                                      \
    }

typedef float v4f __attribute__((vector_size(16)));
ROWS_ACC(rows_acc_base, , v4f, 4)
#if DT__X86_VEC
typedef float v8f __attribute__((vector_size(32)));
ROWS_ACC(rows_acc_avx2, DT__AVX2, v8f, 8)
typedef float v16f __attribute__((vector_size(64)));

/* rows_acc on 16 lanes (zmm): 128 columns at a time in 8 registers, then
 * 64, 32, 16, one 8-lane step and the scalar tail. Each element's sum is the
 * same sequence of rounded products and adds as in the other versions. */
DT__AVX512 static void rows_acc_avx512(float *restrict out, const float *restrict c, int64_t cs,
                                       const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
    int64_t d0 = 0;
#define RA16_BLOCK(W)                                                                                          \
    for (; d0 + (W) <= D; d0 += (W)) {                                                                         \
        v16f a[(W) / 16];                                                                                      \
        memcpy(a, out + d0, sizeof a);                                                                         \
        for (int64_t t = 0; t < n; t++) {                                                                      \
            const float ct = c[t * cs], *xr = x + t * xs + d0;                                                 \
            _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++)                                         \
            {                                                                                                  \
                v16f v;                                                                                        \
                memcpy(&v, xr + k * 16, sizeof v);                                                             \
                a[k] += ct * v;                                                                                \
            }                                                                                                  \
        }                                                                                                      \
        memcpy(out + d0, a, sizeof a);                                                                         \
    }
    RA16_BLOCK(128)
    RA16_BLOCK(64)
    RA16_BLOCK(32)
    RA16_BLOCK(16)
#undef RA16_BLOCK
    if (d0 + 8 <= D) {
        v8f a, v;
        memcpy(&a, out + d0, sizeof a);
        for (int64_t t = 0; t < n; t++) {
            memcpy(&v, x + t * xs + d0, sizeof v);
            a += c[t * cs] * v;
        }
        memcpy(out + d0, &a, sizeof a);
        d0 += 8;
    }
    for (; d0 < D; d0++) {
        float a = out[d0];
        for (int64_t t = 0; t < n; t++)
            a += c[t * cs] * x[t * xs + d0];
        out[d0] = a;
    }
}
#endif

/* The widest row loop vec (dt__vec_level()) allows: rows_acc_avx512,
 * rows_acc_avx2 or the baseline. */
static inline void rows_acc(int vec, float *restrict out, const float *restrict c, int64_t cs,
                            const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        rows_acc_avx512(out, c, cs, x, xs, n, D);
        return;
    }
    if (vec) {
        rows_acc_avx2(out, c, cs, x, xs, n, D);
        return;
    }
#endif
    (void)vec;
    rows_acc_base(out, c, cs, x, xs, n, D);
}

/* Whether dropout keeps element (bh, i, j). */
/* gbh: the head's index b Ht + h0 + h in the full layer (dt_k_attention_fwd_heads) */
static inline bool keep(dt_rng_key key, float p, int64_t bh, int64_t T, int64_t i, int64_t j)
{
    return dt_rng_uniform(key, (uint64_t)((bh * T + i) * T + j)) >= p;
}

/* xt[d * BK + jj] = row j0 + jj of the (T, 3C) matrix at x (stride C3), columns [0, D): one key (or value)
 * block transposed, so the products with it run along contiguous keys. */
static void block_t(const float *restrict x, int64_t C3, int64_t nk, int64_t D, float *restrict xt)
{
    for (int64_t jj = 0; jj < nk; jj++)
        for (int64_t d = 0; d < D; d++)
            xt[d * BK + jj] = x[jj * C3 + d];
    for (int64_t jj = nk; jj < ((nk + 7) & ~(int64_t)7); jj++) /* zero columns up to a multiple of 8 (row_dots) */
        for (int64_t d = 0; d < D; d++)
            xt[d * BK + jj] = 0.0f;
}

/* s[jj] = sum_d q[d] xt[d][jj] for jj < nk, each sum in d order, vectorised along the keys: computed
 * for nk rounded up to a multiple of 8 (block_t zeroes the columns past the block; s has BK
 * entries), so no column takes the scalar path. */
static inline void row_dots(int vec, const float *restrict q, const float *restrict xt, int64_t D, int64_t nk,
                            float *restrict s)
{
    int64_t w = (nk + 7) & ~(int64_t)7;
    for (int64_t jj = 0; jj < w; jj++)
        s[jj] = 0.0f;
    rows_acc(vec, s, q, 1, xt, BK, D, w);
}

/* Per-thread scratch: a transposed key block and a transposed value block. */
#define SCRATCH_FLOATS (2 * DMAX * BK)

/* One forward task: query rows [i0, i1) of head h of batch b. Cloned for
 * AVX2: the loops along keys and along D vectorise; no sum is reordered,
 * so both clones give the same bits. */
DT_CLONES static void fwd_task(int vec, const float *qkv, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                               float p, dt_rng_key key, int64_t b, int64_t h, int64_t i0, int64_t i1, float *kt,
                               float *y, float *lse)
{
    const int64_t gbh = b * Ht + h0 + h; /* the dropout mask's head */
    const int64_t C = H * D, C3 = 3 * C, nq = i1 - i0, bh = b * H + h;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
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
        block_t(base + j0 * C3 + C + h * D, C3, j1 - j0, D, kt);
        for (int64_t r = 0; r < nq; r++) {
            int64_t i = i0 + r, je = causal && i + 1 < j1 ? i + 1 : j1;
            if (je <= j0)
                continue;
            row_dots(vec, base + i * C3 + h * D, kt, D, je - j0, s);
            float mx = m[r];
            for (int64_t j = j0; j < je; j++) {
                float v = s[j - j0] * scale;
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
                    e = keep(key, p, gbh, T, i, j) ? e * pscale : 0.0f;
                s[j - j0] = e;
            }
            rows_acc(vec, a, s, 1, base + j0 * C3 + 2 * C + h * D, C3, je - j0, D);
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
    int64_t nqb = (T + BQ - 1) / BQ, ntask = B * H * nqb;
    int nt = dt__threads_for(B * T * T * C);
    bool nomem = false;
    const int vec = dt__vec_level();
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc(SCRATCH_FLOATS * sizeof(float));
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntask; task++) {
            int64_t bh = task / nqb, qb = task % nqb, i0 = qb * BQ;
            if (kt)
                fwd_task(vec, qkv, T, H, D, h0, Ht, causal, p, key, bh / H, bh % H, i0, i0 + BQ < T ? i0 + BQ : T, kt, y,
                         lse);
        }
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key blocks", fn);
    return DT_OK;
}

/* One backward task: head h of batch b, whose columns of dq, dk and dv it
 * owns. Cloned for AVX2 as fwd_task, with the same bits on both clones. */
DT_CLONES static void bwd_task(int vec, const float *qkv, const float *y, const float *lse, const float *dy, int64_t T,
                               int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key,
                               int64_t b, int64_t h, float *kt, float *dqkv)
{
    const int64_t gbh = b * Ht + h0 + h; /* the dropout mask's head */
    const int64_t C = H * D, C3 = 3 * C, bh = b * H + h;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float *base = qkv + b * T * C3;
    float *gbase = dqkv + b * T * C3, *vt = kt + DMAX * BK;
    float *pdm = vt + DMAX * BK, *dsm = pdm + T * BK; /* [T, BK] each: P (dropped) and dS of the block */
    float sc[BK], dp[BK];
    for (int64_t t = 0; t < T; t++) /* this head's columns of dq, dk, dv */
        for (int k = 0; k < 3; k++)
            memset(gbase + t * C3 + k * C + h * D, 0, (size_t)D * sizeof(float));
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
        int64_t j1 = j0 + BK < T ? j0 + BK : T, i0 = causal ? j0 : 0;
        block_t(base + j0 * C3 + C + h * D, C3, j1 - j0, D, kt);
        block_t(base + j0 * C3 + 2 * C + h * D, C3, j1 - j0, D, vt);
        for (int64_t i = i0; i < T; i++) { /* the block's P and dS row by row, and dq_i */
            int64_t je = causal && i + 1 < j1 ? i + 1 : j1, ne = je - j0;
            const float *q = base + i * C3 + h * D, *g = dy + (b * T + i) * C + h * D;
            const float *yo = y + (b * T + i) * C + h * D;
            float *pd = pdm + (i - i0) * BK, *ds = dsm + (i - i0) * BK;
            float L = lse[bh * T + i], Di = dot_seq(g, yo, D);
            row_dots(vec, q, kt, D, ne, sc);
            row_dots(vec, g, vt, D, ne, dp);
            for (int64_t jj = 0; jj < ne; jj++) {
                float P = expf(sc[jj] * scale - L);
                float dP = dp[jj], Pd = P;
                if (p > 0.0f) {
                    bool kp = keep(key, p, gbh, T, i, j0 + jj);
                    Pd = kp ? P * pscale : 0.0f;
                    dP = kp ? dP * pscale : 0.0f;
                }
                pd[jj] = Pd;
                ds[jj] = P * (dP - Di) * scale;
            }
            rows_acc(vec, gbase + i * C3 + h * D, ds, 1, base + j0 * C3 + C + h * D, C3, ne, D);
        }
        for (int64_t j = j0; j < j1; j++) { /* dk_j and dv_j over the rows i that see key j, in i order */
            int64_t ia = causal ? j : i0, jj = j - j0;
            rows_acc(vec, gbase + j * C3 + C + h * D, dsm + (ia - i0) * BK + jj, BK, base + ia * C3 + h * D, C3, T - ia,
                     D);
            rows_acc(vec, gbase + j * C3 + 2 * C + h * D, pdm + (ia - i0) * BK + jj, BK, dy + (b * T + ia) * C + h * D, C,
                     T - ia, D);
        }
    }
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
    int nt = dt__threads_for(B * T * T * C * 2);
    bool nomem = false;
    const int vec = dt__vec_level();
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc((size_t)(SCRATCH_FLOATS + 2 * T * BK) * sizeof(float));
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++)
            if (kt)
                bwd_task(vec, qkv, y, lse, dy, T, H, D, h0, Ht, causal, p, key, bh / H, bh % H, kt, dqkv);
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key and value blocks", fn);
    return DT_OK;
}
