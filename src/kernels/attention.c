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
#include "attention_impl.h"

#include <math.h>
#include <string.h>

#define BQ 16
#define BK DT__ATT_BK
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

/* Whether dropout keeps element (bh, i, j). */
/* gbh: the head's index b Ht + h0 + h in the full layer (dt_k_attention_fwd_heads) */
static inline bool keep(dt_rng_key key, float p, int64_t bh, int64_t T, int64_t i, int64_t j)
{
    return dt_rng_uniform(key, (uint64_t)((bh * T + i) * T + j)) >= p;
}

/* Per-thread scratch: a transposed key block and a value block (transposed
 * in the backward, widened in a low-precision forward), then a forward
 * task's q rows widened (BQ x DMAX; low precision only). */
#define SCRATCH_FLOATS (2 * DMAX * BK)
#define FWD_SCRATCH_FLOATS (SCRATCH_FLOATS + BQ * DMAX)

/* ---- bf16/f16 operands ------------------------------------------------------------- */
/* A bf16/f16 qkv is read as it is: each task widens the rows it works on
 * into its f32 tiles (exact: bf16 by shifting the bits up, f16 through the
 * F16C/AVX-512 conversion) and then runs the f32 arithmetic unchanged, so
 * the results are bit for bit those of widening the whole qkv first. */

/* dst[0, n) = the n t-elements at src widened to f32. */
static inline void widen_row(dt_dtype t, const uint16_t *restrict src, float *restrict dst, int64_t n)
{
    if (t == DT_BF16) {
        for (int64_t d = 0; d < n; d++) {
            uint32_t u = (uint32_t)src[d] << 16;
            memcpy(dst + d, &u, sizeof u);
        }
        return;
    }
    (void)dt_k_f16_to_f32(src, dst, n); /* n <= DMAX, valid pointers: cannot fail */
}

/* x rounded to bf16 (round to nearest even, a NaN quieted: dt_f32_to_bf16,
 * which every path of dt_k_convert matches), as the bits of the f32 value. */
static inline uint32_t bf16_round_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, q = (u & 0xffff0000u) | 0x00400000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? q : r;
}

/* dst[0, n) = src[0, n) rounded to t's precision, held in f32 (dst may be
 * src); h: n elements of scratch (f16: the two conversions dt_cast makes). */
static inline void round_row(dt_dtype t, const float *src, uint16_t *restrict h, float *dst, int64_t n)
{
    if (t == DT_BF16) {
        for (int64_t d = 0; d < n; d++) {
            uint32_t r = bf16_round_bits(src[d]);
            memcpy(dst + d, &r, sizeof r);
        }
        return;
    }
    (void)dt_k_convert(src, DT_F32, h, t, n);
    (void)dt_k_convert(h, t, dst, DT_F32, n);
}

/* dst[0, n) = src[0, n) converted to t (dt_k_convert's bits). */
static inline void narrow_row(dt_dtype t, const float *restrict src, uint16_t *restrict dst, int64_t n)
{
    if (t == DT_BF16) {
        for (int64_t d = 0; d < n; d++)
            dst[d] = (uint16_t)(bf16_round_bits(src[d]) >> 16);
        return;
    }
    (void)dt_k_convert(src, DT_F32, dst, t, n);
}

/* block_t of a key (or value) block of t elements, widened while it is
 * transposed: the same f32 block. */
static inline void block_t_lp(dt_dtype t, const uint16_t *restrict x, int64_t C3, int64_t nk, int64_t D,
                              float *restrict xt)
{
    float row[DMAX];
    for (int64_t jj = 0; jj < nk; jj++) {
        widen_row(t, x + jj * C3, row, D);
        for (int64_t d = 0; d < D; d++)
            xt[d * DT__ATT_BK + jj] = row[d];
    }
    for (int64_t jj = nk; jj < ((nk + 7) & ~(int64_t)7); jj++)
        for (int64_t d = 0; d < D; d++)
            xt[d * DT__ATT_BK + jj] = 0.0f;
}

/* One forward task: query rows [i0, i1) of head h of batch b. Cloned for
 * AVX2: the loops along keys and along D vectorise; no sum is reordered,
 * so both clones give the same bits. t: qkv's dtype; bf16/f16 rows are
 * widened into tiles (the task's q rows, each key block transposed into
 * kt, each value block into vt) and y's rows are also written rounded to
 * t into ylp (when not NULL). kt: FWD_SCRATCH_FLOATS. */
DT_CLONES static void fwd_task(int vec, dt_dtype t, const void *qkv, int64_t T, int64_t H, int64_t D, int64_t h0,
                               int64_t Ht, bool causal, float p, dt_rng_key key, int64_t b, int64_t h, int64_t i0,
                               int64_t i1, float *kt, float *y, void *ylp, float *lse)
{
    const int64_t gbh = b * Ht + h0 + h; /* the dropout mask's head */
    const int64_t C = H * D, C3 = 3 * C, nq = i1 - i0, bh = b * H + h;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const bool lp = t != DT_F32;
    const float *base = lp ? NULL : (const float *)qkv + b * T * C3;
    const uint16_t *lbase = lp ? (const uint16_t *)qkv + b * T * C3 : NULL;
    float *vt = kt + DMAX * BK; /* low precision: the value block widened, [BK][D] */
    float *qt = vt + DMAX * BK; /* low precision: the task's q rows widened, [BQ][DMAX] */
    float m[BQ], l[BQ], s[BK];
    float acc[BQ][DMAX];
    for (int64_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc[r], 0, (size_t)D * sizeof(float));
        if (lp)
            widen_row(t, lbase + (i0 + r) * C3 + h * D, qt + r * DMAX, D);
    }
    int64_t kend = causal ? i1 : T;
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t j1 = j0 + BK < kend ? j0 + BK : kend;
        const float *vb;
        int64_t vs;
        if (lp) {
            block_t_lp(t, lbase + j0 * C3 + C + h * D, C3, j1 - j0, D, kt);
            for (int64_t jj = 0; jj < j1 - j0; jj++)
                widen_row(t, lbase + (j0 + jj) * C3 + 2 * C + h * D, vt + jj * D, D);
            vb = vt, vs = D;
        } else {
            block_t(base + j0 * C3 + C + h * D, C3, j1 - j0, D, kt);
            vb = base + j0 * C3 + 2 * C + h * D, vs = C3;
        }
        for (int64_t r = 0; r < nq; r++) {
            int64_t i = i0 + r, je = causal && i + 1 < j1 ? i + 1 : j1;
            if (je <= j0)
                continue;
            row_dots(vec, lp ? qt + r * DMAX : base + i * C3 + h * D, kt, D, je - j0, s);
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
            rows_acc(vec, a, s, 1, vb, vs, je - j0, D);
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
        if (ylp)
            narrow_row(t, yo, (uint16_t *)ylp + (b * T + i) * C + h * D, D);
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

static dt_status lp_dtype(const char *fn, dt_dtype t)
{
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_DTYPE, "%s: qkv dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    return DT_OK;
}

static dt_status fwd_run(const char *fn, dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                         int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y, void *ylp, float *lse)
{
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
        float *kt = dt_alloc(FWD_SCRATCH_FLOATS * sizeof(float));
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntask; task++) {
            int64_t bh = task / nqb, qb = task % nqb, i0 = qb * BQ;
            if (kt)
                fwd_task(vec, t, qkv, T, H, D, h0, Ht, causal, p, key, bh / H, bh % H, i0, i0 + BQ < T ? i0 + BQ : T,
                         kt, y, ylp, lse);
        }
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key blocks", fn);
    return DT_OK;
}

dt_status dt_k_attention_fwd_heads(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                   int64_t Ht, bool causal, float p, dt_rng_key key, float *y, float *lse)
{
    return fwd_run("dt_k_attention_fwd", DT_F32, qkv, B, T, H, D, h0, Ht, causal, p, key, y, NULL, lse);
}

dt_status dt_k_attention_fwd_heads_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                      int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y,
                                      void *ylp, float *lse)
{
    const char *fn = "dt_k_attention_fwd_lp";
    dt_status st = lp_dtype(fn, t);
    return st < 0 ? st : fwd_run(fn, t, qkv, B, T, H, D, h0, Ht, causal, p, key, y, ylp, lse);
}

/* One backward task: head h of batch b, whose columns of dq, dk and dv it
 * owns. Cloned for AVX2 as fwd_task, with the same bits on both clones.
 * t: qkv's dtype; with bf16/f16 the head's q, k, v are first widened into
 * an f32 [T][3D] tile and dy's head columns rounded to t into a [T][D] one
 * (the gradient of a t result), and at the end the head's dq, dk, dv are
 * rounded to t (the gradient of a t input). kt: bwd_scratch(t, T, D). */
DT_CLONES static void bwd_task(int vec, dt_dtype t, const void *qkv, const float *y, const float *lse,
                               const float *dy, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                               float p, dt_rng_key key, int64_t b, int64_t h, float *kt, float *dqkv)
{
    const int64_t gbh = b * Ht + h0 + h; /* the dropout mask's head */
    const int64_t C = H * D, C3 = 3 * C, bh = b * H + h;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *gbase = dqkv + b * T * C3, *vt = kt + DMAX * BK;
    float *pdm = vt + DMAX * BK, *dsm = pdm + T * BK; /* [T, BK] each: P (dropped) and dS of the block */
    float sc[BK], dp[BK];
    uint16_t hb[DMAX];
    const float *qb, *kb, *vb, *gy; /* the head's q, k, v rows (stride ld) and dy rows (stride ldg) */
    int64_t ld, ldg;
    if (t == DT_F32) {
        qb = (const float *)qkv + b * T * C3 + h * D, kb = qb + C, vb = qb + 2 * C, ld = C3;
        gy = dy + b * T * C + h * D, ldg = C;
    } else {
        float *w = dsm + T * BK, *wg = w + T * 3 * D;
        const uint16_t *src = (const uint16_t *)qkv + b * T * C3 + h * D;
        for (int64_t i = 0; i < T; i++) {
            for (int k = 0; k < 3; k++)
                widen_row(t, src + i * C3 + k * C, w + i * 3 * D + k * D, D);
            round_row(t, dy + (b * T + i) * C + h * D, hb, wg + i * D, D);
        }
        qb = w, kb = w + D, vb = w + 2 * D, ld = 3 * D;
        gy = wg, ldg = D;
    }
    for (int64_t i = 0; i < T; i++) /* this head's columns of dq, dk, dv */
        for (int k = 0; k < 3; k++)
            memset(gbase + i * C3 + k * C + h * D, 0, (size_t)D * sizeof(float));
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
        int64_t j1 = j0 + BK < T ? j0 + BK : T, i0 = causal ? j0 : 0;
        block_t(kb + j0 * ld, ld, j1 - j0, D, kt);
        block_t(vb + j0 * ld, ld, j1 - j0, D, vt);
        for (int64_t i = i0; i < T; i++) { /* the block's P and dS row by row, and dq_i */
            int64_t je = causal && i + 1 < j1 ? i + 1 : j1, ne = je - j0;
            const float *q = qb + i * ld, *g = gy + i * ldg;
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
            rows_acc(vec, gbase + i * C3 + h * D, ds, 1, kb + j0 * ld, ld, ne, D);
        }
        for (int64_t j = j0; j < j1; j++) { /* dk_j and dv_j over the rows i that see key j, in i order */
            int64_t ia = causal ? j : i0, jj = j - j0;
            rows_acc(vec, gbase + j * C3 + C + h * D, dsm + (ia - i0) * BK + jj, BK, qb + ia * ld, ld, T - ia, D);
            rows_acc(vec, gbase + j * C3 + 2 * C + h * D, pdm + (ia - i0) * BK + jj, BK, gy + ia * ldg, ldg, T - ia,
                     D);
        }
    }
    for (int64_t i = 0; i < T && t != DT_F32; i++)
        for (int k = 0; k < 3; k++) {
            float *gr = gbase + i * C3 + k * C + h * D;
            round_row(t, gr, hb, gr, D);
        }
}

/* A backward task's scratch in floats: the key and value blocks, P and dS
 * ([T, BK] each), and with bf16/f16 the widened q|k|v [T][3D] and dy [T][D]. */
static size_t bwd_scratch(dt_dtype t, int64_t T, int64_t D)
{
    return (size_t)(SCRATCH_FLOATS + 2 * T * BK + (t == DT_F32 ? 0 : 4 * T * D));
}

static dt_status bwd_run(const char *fn, dt_dtype t, const void *qkv, const float *y, const float *lse,
                         const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                         bool causal, float p, dt_rng_key key, float *dqkv)
{
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
    const size_t scratch = bwd_scratch(t, T, D) * sizeof(float);
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc(scratch);
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++)
            if (kt)
                bwd_task(vec, t, qkv, y, lse, dy, T, H, D, h0, Ht, causal, p, key, bh / H, bh % H, kt, dqkv);
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key and value blocks", fn);
    return DT_OK;
}

dt_status dt_k_attention_bwd_heads(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal, float p,
                                   dt_rng_key key, float *dqkv)
{
    return bwd_run("dt_k_attention_bwd", DT_F32, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, p, key, dqkv);
}

dt_status dt_k_attention_bwd_heads_lp(dt_dtype t, const void *qkv, const float *y, const float *lse,
                                      const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                      int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv)
{
    const char *fn = "dt_k_attention_bwd_lp";
    dt_status st = lp_dtype(fn, t);
    return st < 0 ? st : bwd_run(fn, t, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, p, key, dqkv);
}
