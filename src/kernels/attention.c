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
 * matmuls.
 *
 * A bf16/f16 qkv (the _lp entry points: autocast's attention input) is
 * read as it is: the tasks widen the rows they use into f32 tiles (a
 * forward task the head's keys straight into a transposed [D][T] tile, once,
 * instead of each key block per query block) and run the same f32
 * arithmetic, so on the scalar and avx2 paths every result equals widening
 * qkv first. On the avx512 paths they run the fast rows instead
 * (DT__ATT_FAST: rows_acc_fma16, the 16-lane softmax rows with dt__expf16),
 * within a stated bound of those bits (kernels.h); an f32 qkv never does.
 * A bf16 qkv on the avx512_bf16 path (DT__ATT_BF16) widens nothing: the
 * scores come from the bf16 pairs (row_dots_bf16), and P and dS, rounded to
 * bf16, multiply v, k, q and dy by vdpbf16ps (rows_acc_bf16) with those
 * operands interleaved in pairs of rows once a task or a key block
 * (fwd_rows_bf16, bwd_head_bf16), within the bound kernels.h states.
 * Where the CPU has AMX the products of that path run on the tiles
 * instead (fwd_task_amx, bwd_task_amx: see "the products on the AMX
 * tiles" below).
 *
 * A soft cap (dt_k_attention_window_fwd/_bwd and their _lp versions,
 * attention_window.c; Gemma 2's attn_logit_softcapping; causal, no
 * dropout) replaces each score s = scale q.k by c = cap tanh(s / cap)
 * (dt__att_cap_row) where a block's scores are computed, on every path
 * (f32 rows, widened and avx512_bf16 rows, the tiles' f32 products): the
 * forward caps them before the running max (the softmax then takes them
 * with scale 1, the same bits as unscaled), lse is that of c, and the
 * backward recomputes c with its tanh t, P = exp(c - lse) and
 *   dS_ij = P_ij (dP_ij - Di) (1 - t_ij^2)   (tanh' = 1 - tanh^2),
 * the rest unchanged. Cap 0 runs the code without it: the same bits.
 *
 * A sliding window (the same entry points; causal, no dropout): query i
 * sees the keys (i - window, i]. A forward task copies only the keys its
 * rows see and
 * walks the key blocks from the one that holds its first row's first key;
 * the backward, for each key block, only the rows that see one of its
 * keys; so the work is O(T window), not O(T^2). Inside a block that
 * straddles a row's window edge the row's scores start at its first key
 * as the causal mask ends them at the diagonal, and each key's sums over
 * the rows end at the last row that sees it (key blocks and rows the
 * window hides are never read, as the causal mask's are not: a NaN there
 * changes nothing). Window 0 (none; the entry points make a window of T
 * or more 0) runs the same code with every start 0 and every end T: the
 * bits of the causal kernel. */
#include "attention_impl.h"
#include "kernels/attention_amx.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
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


/* The first key query i sees under a window (0: none), and one past the
 * last row that sees key j (of T rows). */
static inline int64_t att_first(int64_t i, int64_t window) { return window > 0 && i >= window ? i + 1 - window : 0; }

static inline int64_t att_rows_end(int64_t j, int64_t window, int64_t T)
{
    return window > 0 && j + window < T ? j + window : T;
}

/* Per-thread scratch of the backward: a transposed key block and a
 * transposed value block (and more: bwd_scratch). */
#define SCRATCH_FLOATS (2 * DMAX * BK)

/* ---- bf16/f16 operands ------------------------------------------------------------- */
/* A bf16/f16 qkv is read as it is: each task widens the rows it works on
 * into its f32 tiles (exact: bf16 by shifting the bits up, f16 through the
 * F16C/AVX-512 conversion) and then runs the f32 arithmetic unchanged, so
 * the results are bit for bit those of widening the whole qkv first (on
 * the avx512 paths: within the fast rows' bound). */

/* x rounded to bf16 (round to nearest even, a NaN quieted: dt_f32_to_bf16,
 * which every path of dt_k_convert matches), as the bits of the f32 value. */
static inline uint32_t bf16_round_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, q = (u & 0xffff0000u) | 0x00400000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? q : r;
}

/* The bf16 row loops W lanes at a time (GCC's vector extension; integer
 * arithmetic, so every width gives the scalar formula's bits), the tail
 * element by element, and the scalar path's plain loops (_s1):
 *   widen_bf16: d[i] = s[i] widened (the bits shifted up);
 *   round_bf16: s[i] rounded to bf16 by bf16_round_bits, into d (f32, may
 *     be s) and/or h (bf16), either NULL to skip. */
#define BF16_LOOPS(sfx, attr, W)                                                                               \
    typedef uint16_t vh_##sfx __attribute__((vector_size(2 * (W))));                                          \
    typedef uint32_t vu_##sfx __attribute__((vector_size(4 * (W))));                                          \
    attr static void widen_bf16_##sfx(const uint16_t *restrict s, float *restrict d, int64_t n)               \
    {                                                                                                          \
        int64_t i = 0;                                                                                         \
        for (; i + (W) <= n; i += (W)) {                                                                       \
            vh_##sfx h;                                                                                        \
            memcpy(&h, s + i, sizeof h);                                                                       \
            vu_##sfx u = __builtin_convertvector(h, vu_##sfx) << 16;                                           \
            memcpy(d + i, &u, sizeof u);                                                                       \
        }                                                                                                      \
        for (; i < n; i++) {                                                                                   \
            uint32_t u = (uint32_t)s[i] << 16;                                                                 \
            memcpy(d + i, &u, sizeof u);                                                                       \
        }                                                                                                      \
    }                                                                                                          \
    attr static void round_bf16_##sfx(const float *s, float *d, uint16_t *restrict h, int64_t n)              \
    {                                                                                                          \
        int64_t i = 0;                                                                                         \
        for (; i + (W) <= n; i += (W)) {                                                                       \
            vu_##sfx u;                                                                                        \
            memcpy(&u, s + i, sizeof u);                                                                       \
            vu_##sfx r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, q = (u & 0xffff0000u) | 0x00400000u; \
            vu_##sfx m = (vu_##sfx)((u & 0x7fffffffu) > 0x7f800000u);                                          \
            r = (q & m) | (r & ~m);                                                                            \
            if (d)                                                                                             \
                memcpy(d + i, &r, sizeof r);                                                                   \
            if (h) {                                                                                           \
                vh_##sfx t = __builtin_convertvector(r >> 16, vh_##sfx);                                       \
                memcpy(h + i, &t, sizeof t);                                                                   \
            }                                                                                                  \
        }                                                                                                      \
        for (; i < n; i++) {                                                                                   \
            uint32_t r = bf16_round_bits(s[i]);                                                                \
            if (d)                                                                                             \
                memcpy(d + i, &r, sizeof r);                                                                   \
            if (h)                                                                                             \
                h[i] = (uint16_t)(r >> 16);                                                                    \
        }                                                                                                      \
    }

static void widen_bf16_s1(const uint16_t *restrict s, float *restrict d, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)s[i] << 16;
        memcpy(d + i, &u, sizeof u);
    }
}

static void round_bf16_s1(const float *s, float *d, uint16_t *restrict h, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = bf16_round_bits(s[i]);
        if (d)
            memcpy(d + i, &r, sizeof r);
        if (h)
            h[i] = (uint16_t)(r >> 16);
    }
}

#if DT__X86_VEC
BF16_LOOPS(v8, DT__AVX2, 8)
BF16_LOOPS(v16, DT__AVX512, 16)
#endif

/* dst[0, n) = the n t-elements at src widened to f32: bf16 on the widest
 * loop vec allows, f16 by dt_k_f16_to_f32 (the F16C/AVX-512 conversion). */
static inline void widen_row(int vec, dt_dtype t, const uint16_t *restrict src, float *restrict dst, int64_t n)
{
    if (t != DT_BF16) {
        (void)dt_k_f16_to_f32(src, dst, n); /* n <= DMAX, valid pointers: cannot fail */
        return;
    }
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        widen_bf16_v16(src, dst, n);
        return;
    }
    if (vec) {
        widen_bf16_v8(src, dst, n);
        return;
    }
#endif
    (void)vec;
    widen_bf16_s1(src, dst, n);
}

/* src[0, n) rounded to t: into dst (f32 values of t; may be src) and/or h
 * (t itself), either NULL to skip; the bits of dt_k_convert (f16: through
 * it, via h's scratch, which it then needs). */
static inline void round_row(int vec, dt_dtype t, const float *src, float *dst, uint16_t *h, int64_t n)
{
    if (t != DT_BF16) {
        (void)dt_k_convert(src, DT_F32, h, t, n);
        if (dst)
            (void)dt_k_convert(h, t, dst, DT_F32, n);
        return;
    }
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        round_bf16_v16(src, dst, h, n);
        return;
    }
    if (vec) {
        round_bf16_v8(src, dst, h, n);
        return;
    }
#endif
    (void)vec;
    round_bf16_s1(src, dst, h, n);
}

/* Element off of a qkv of dtype t as f32 into dst[0, n): copied (f32) or
 * widened exactly (bf16/f16): a task's q, k, v rows into its tiles. */
static inline void task_row(int vec, dt_dtype t, const void *qkv, int64_t off, float *restrict dst, int64_t n)
{
    if (t == DT_F32)
        memcpy(dst, (const float *)qkv + off, (size_t)n * sizeof(float));
    else
        widen_row(vec, t, (const uint16_t *)qkv + off, dst, n);
}

/* The end of a forward task: each of its nq query rows (from i0) divided
 * by its softmax sum into y (and its rounded copy ylp), and its
 * log-sum-exp; a row that saw no key gets 0 and -inf. */
static inline void fwd_finish(int vec, dt_dtype t, float (*acc)[DMAX], const float *m, const float *l, int64_t nq,
                              int64_t i0, int64_t C, int64_t D, float *y, uint16_t *ylp, float *lse)
{
    for (int64_t r = 0; r < nq; r++) {
        int64_t i = i0 + r;
        float *yo = y + i * C;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int64_t d = 0; d < D; d++)
            yo[d] = acc[r][d] * inv;
        if (ylp)
            round_row(vec, t, yo, NULL, ylp + i * C, D);
        lse[i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
}

/* ---- the 16-lane softmax rows of DT__ATT_FAST (bf16/f16 qkv, AVX-512) ------------------ */
#if DT__X86_VEC
/* The lanes [j, n) of a 16-lane step, at most 16. */
static inline __mmask16 lanes16(int64_t j, int64_t n)
{
    return n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1u);
}

/* s[j] *= scale for j < n; returns the largest of m and those (a NaN
 * score ignored, as the scalar loop's "x > mx" does). */
DT__AVX512 static float fast_scale_max(float *s, int64_t n, float scale, float m)
{
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(m);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = lanes16(j, n);
        __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), vs);
        _mm512_mask_storeu_ps(s + j, k, x);
        mx = _mm512_mask_max_ps(mx, k, x, mx); /* MAXPS gives its second operand for a NaN */
    }
    return _mm512_reduce_max_ps(mx);
}

/* s[j] = dt__expf(s[j] - mx) for j < n (within 2 ulp of expf; 0 below
 * e^-87); returns their sum (16 partial sums, then a tree). */
DT__AVX512 static float fast_exp_sum(float *s, int64_t n, float mx)
{
    const __m512 vm = _mm512_set1_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = lanes16(j, n);
        __m512 e = _mm512_maskz_mov_ps(k, dt__expf16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm)));
        _mm512_mask_storeu_ps(s + j, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}

/* The backward's row of a key block: P = dt__expf(sc scale - L) into pd and
 * P (dp - Di) scale into ds, j < n (no dropout: the caller applies it).
 * Soft-capped scores (th not NULL: sc the capped scores c, th their tanh,
 * dt__att_cap_row's): P = dt__expf(c - L) and P (dp - Di) (1 - th^2) scale,
 * tanh's derivative. */
DT__AVX512 static void fast_bwd_probs(const float *sc, const float *th, const float *dp, int64_t n, float scale,
                                      float L, float Di, float *pd, float *ds)
{
    const __m512 vs = _mm512_set1_ps(scale), vl = _mm512_set1_ps(L), vd = _mm512_set1_ps(Di);
    const __m512 one = _mm512_set1_ps(1.0f);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = lanes16(j, n);
        const __m512 x = _mm512_maskz_loadu_ps(k, sc + j);
        __m512 P = dt__expf16(_mm512_sub_ps(th ? x : _mm512_mul_ps(x, vs), vl));
        __m512 d = _mm512_mul_ps(P, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), vd));
        if (th) {
            const __m512 t = _mm512_maskz_loadu_ps(k, th + j);
            d = _mm512_mul_ps(d, _mm512_sub_ps(one, _mm512_mul_ps(t, t)));
        }
        _mm512_mask_storeu_ps(pd + j, k, P);
        _mm512_mask_storeu_ps(ds + j, k, _mm512_mul_ps(d, vs));
    }
}

/* The lanes l of a 16-lane step at c with lo <= c + l < hi. */
static inline __mmask16 lanes_in(int64_t c, int64_t lo, int64_t hi)
{
    const int64_t a = lo - c > 0 ? lo - c : 0, b = hi - c < 16 ? hi - c : 16;
    return b <= a ? (__mmask16)0 : (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* A key's row of a block on the tiles' backward (bwd_task_amx: the scores
 * transposed, one key against 32 queries c with their own L[c] and Di[c]):
 * P = dt__expf(sc[c] scale - L[c]) into pd[c] and P (dp[c] - Di[c]) scale
 * into ds[c] for lo <= c < hi, 0 in both for the other lanes of the 32 (no
 * dropout: the caller applies it). th not NULL: soft-capped scores, as
 * fast_bwd_probs takes them (th[c] for lo <= c < hi). */
DT__AVX512 static void fast_bwd_probs_t(const float *sc, const float *th, const float *dp, int64_t lo, int64_t hi,
                                        float scale, const float *L, const float *Di, float *pd, float *ds)
{
    const __m512 vs = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    for (int64_t c = 0; c < 32; c += 16) {
        const __mmask16 k = lanes_in(c, lo, hi);
        const __m512 s = _mm512_maskz_loadu_ps(k, sc + c);
        const __m512 x = _mm512_sub_ps(th ? s : _mm512_mul_ps(s, vs), _mm512_maskz_loadu_ps(k, L + c));
        const __m512 P = _mm512_maskz_mov_ps(k, dt__expf16(x));
        __m512 d = _mm512_mul_ps(P, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + c), _mm512_maskz_loadu_ps(k, Di + c)));
        if (th) {
            const __m512 t = _mm512_maskz_loadu_ps(k, th + c);
            d = _mm512_mul_ps(d, _mm512_sub_ps(one, _mm512_mul_ps(t, t)));
        }
        _mm512_storeu_ps(pd + c, P);
        _mm512_storeu_ps(ds + c, _mm512_mul_ps(d, vs));
    }
}

/* A query row of the forward on the tiles (no dropout) in one pass after
 * its max: sr[j] scale for lo <= j < n, exponentiated against their max
 * (*mx) as fast_scale_max and fast_exp_sum do, rounded to bf16 straight
 * into dst (cols values: 0 before lo, the keys a window hides, and past n,
 * as the padded keys) as bf16_pairs_f32 rounds; returns the sum of the
 * exponentials in fast_exp_sum's order (the same bits as those three
 * passes). */
DT__AVX512BF16 static float fast_softmax_bf16(const float *sr, int64_t lo, int64_t n, int64_t cols, float scale,
                                              float *mx, uint16_t *dst)
{
    const __m512 vs = _mm512_set1_ps(scale);
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t j = lo & ~(int64_t)15; j < n; j += 16) {
        const __mmask16 k = lanes_in(j, lo, n);
        m = _mm512_mask_max_ps(m, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, sr + j), vs), m);
    }
    *mx = _mm512_reduce_max_ps(m);
    const __m512 vm = _mm512_set1_ps(*mx);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < cols; j += 32) {
        const __mmask16 k0 = lanes_in(j, lo, n), k1 = lanes_in(j + 16, lo, n);
        const __m512 x0 = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k0, sr + j), vs), vm);
        const __m512 x1 = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k1, sr + j + 16), vs), vm);
        const __m512 e0 = _mm512_maskz_mov_ps(k0, dt__expf16(x0)), e1 = _mm512_maskz_mov_ps(k1, dt__expf16(x1));
        sum = _mm512_add_ps(_mm512_add_ps(sum, e0), e1);
        _mm512_storeu_si512(dst + j, (__m512i)_mm512_cvtne2ps_pbh(e1, e0));
    }
    return _mm512_reduce_add_ps(sum);
}

/* a . b over n floats on 16 lanes (fused multiply-adds), then their sum. */
DT__AVX512 static float fast_dot16(const float *a, const float *b, int64_t n)
{
    __m512 s = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; d += 16) {
        const __mmask16 k = lanes16(d, n);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + d), _mm512_maskz_loadu_ps(k, b + d), s);
    }
    return _mm512_reduce_add_ps(s);
}

/* fwd_rows on the avx512_bf16 path (DT__ATT_BF16): q rows as bf16 pairs
 * along D at qp + r D2, the head's keys from kb (even) likewise, transposed
 * (kp: pair d2 of key kb + j at d2 ldT + j), its values paired along the
 * keys (vp: keys kb + 2 j2 and kb + 2 j2 + 1 at j2 D, pair_rows). Each key
 * block's probabilities are rounded to bf16 (after the dropout's scaling;
 * their f32 values make the row's sum) and multiply the values by
 * vdpbf16ps (rows_acc_bf16), as flash-attention kernels do for bf16
 * inputs. A row whose window starts at an odd key takes the pair before it
 * with that half hidden (rows_acc_bf16's lo0). */
DT__AVX512BF16 static void fwd_rows_bf16(dt_dtype t, const uint32_t *qp, const uint32_t *kp, int64_t ldT,
                                         const uint32_t *vp, int64_t kb, int64_t T, int64_t C, int64_t D, int64_t gbh,
                                         bool causal, int64_t window, float cap, float p, dt_rng_key key, int64_t i0,
                                         int64_t i1, float *y, uint16_t *ylp, float *lse)
{
    const int64_t nq = i1 - i0, D2 = (D + 1) / 2;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float ss = cap > 0.0f ? 1.0f : scale; /* the scores' scale after the cap (which scales them itself) */
    float m[BQ], l[BQ], s[BK];
    uint32_t sp[BK / 2];
    float acc[BQ][DMAX];
    for (int64_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc[r], 0, (size_t)D * sizeof(float));
    }
    int64_t kend = causal ? i1 : T;
    for (int64_t j0 = att_first(i0, window) / BK * BK; j0 < kend; j0 += BK) {
        int64_t j1 = j0 + BK < kend ? j0 + BK : kend;
        for (int64_t r = 0; r < nq; r++) {
            int64_t i = i0 + r, je = causal && i + 1 < j1 ? i + 1 : j1, js = att_first(i, window);
            js = js > j0 ? js : j0; /* the row's keys of the block: [js, je) */
            const int64_t n = je - js, odd = (js - kb) & 1;
            if (n <= 0)
                continue;
            float *sr = s + odd; /* s[0]: the hidden half of the first pair (n + odd <= BK: js > j0 then) */
            row_dots_bf16(qp + r * D2, kp + (js - kb), ldT, D2, n, sr);
            if (cap > 0.0f) /* capped before the running max */
                dt__att_cap_row(DT__ATT_BF16, sr, NULL, n, scale, cap);
            float mx = fast_scale_max(sr, n, ss, m[r]);
            float corr = expf(m[r] - mx); /* m[r] = -inf the first time: 0 */
            float *a = acc[r];
            for (int64_t d = 0; d < D; d += 16) {
                const __mmask16 k = att_lanes(d, D);
                _mm512_mask_storeu_ps(a + d, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, a + d), _mm512_set1_ps(corr)));
            }
            float sum = fast_exp_sum(sr, n, mx);
            for (int64_t j = js; j < je && p > 0.0f; j++)
                sr[j - js] = dt__att_keep(key, p, gbh, T, i, j) ? sr[j - js] * pscale : 0.0f;
            if (odd)
                s[0] = 0.0f;
            bf16_pairs_f32(s, n + odd, sp);
            rows_acc_bf16(a, sp, 1, vp + ((js - odd - kb) / 2) * D, D, (n + odd + 1) / 2, D, odd != 0,
                          ((n + odd) & 1) != 0);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
        }
    }
    fwd_finish(DT__ATT_BF16, t, acc, m, l, nq, i0, C, D, y, ylp, lse);
}
#endif

/* Query rows [i0, i1) (at most BQ) of one head: q row r at q + r ldq, the
 * head's keys from kb (a multiple of 8) transposed in kT (key kb + j at
 * column j of D rows of stride ldT, zero past the last key up to a
 * multiple of 8), its value rows kb + j at v + j ldv, the output rows at y
 * + i C (and rounded to t at ylp + i C when ylp is not NULL), lse at
 * lse[i]. gbh: the dropout mask's head (b Ht + h0 + h). Cloned for AVX2:
 * the loops along keys and along D vectorise; no sum is reordered, so both
 * clones give the same bits. */
DT_CLONES static void fwd_rows(int vec, dt_dtype t, const float *q, int64_t ldq, const float *kT, int64_t ldT,
                               const float *v, int64_t ldv, int64_t kb, int64_t T, int64_t C, int64_t D, int64_t gbh,
                               bool causal, int64_t window, float cap, float p, dt_rng_key key, int64_t i0, int64_t i1,
                               float *y, uint16_t *ylp, float *lse)
{
    const int64_t nq = i1 - i0;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float ss = cap > 0.0f ? 1.0f : scale; /* the scores' scale after the cap (which scales them itself) */
    float m[BQ], l[BQ], s[BK];
    float acc[BQ][DMAX];
    for (int64_t r = 0; r < nq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc[r], 0, (size_t)D * sizeof(float));
    }
    int64_t kend = causal ? i1 : T;
    for (int64_t j0 = att_first(i0, window) / BK * BK; j0 < kend; j0 += BK) {
        int64_t j1 = j0 + BK < kend ? j0 + BK : kend;
        for (int64_t r = 0; r < nq; r++) {
            int64_t i = i0 + r, je = causal && i + 1 < j1 ? i + 1 : j1, js = att_first(i, window);
            js = js > j0 ? js : j0; /* the row's keys of the block: [js, je) */
            if (je <= js)
                continue;
            /* the scores from ja, js rounded down to row_dots' 8-key steps within the block (every column's
               sum is its own: the same bits from any start) */
            const int64_t ja = j0 + ((js - j0) & ~(int64_t)7), n = je - js;
            row_dots(vec, q + r * ldq, kT + (ja - kb), ldT, D, je - ja, s);
            float *sr = s + (js - ja), mx = m[r];
            if (cap > 0.0f) /* capped before the running max; times ss = 1 below: the same bits */
                dt__att_cap_row(vec, sr, NULL, n, scale, cap);
#if DT__X86_VEC
            if (vec >= DT__ATT_FAST)
                mx = fast_scale_max(sr, n, ss, mx);
            else
#endif
                for (int64_t j = 0; j < n; j++) {
                    float x = sr[j] * ss;
                    sr[j] = x;
                    mx = x > mx ? x : mx;
                }
            float corr = expf(m[r] - mx), sum; /* m[r] = -inf the first time: 0 */
            float *a = acc[r];
#pragma omp simd
            for (int64_t d = 0; d < D; d++)
                a[d] *= corr;
#if DT__X86_VEC
            if (vec >= DT__ATT_FAST)
                sum = fast_exp_sum(sr, n, mx);
            else
#endif
                sum = att_exp_sum(vec, sr, n, mx);
            for (int64_t j = js; j < je && p > 0.0f; j++) /* dropout after the sum */
                sr[j - js] = dt__att_keep(key, p, gbh, T, i, j) ? sr[j - js] * pscale : 0.0f;
            rows_acc(vec, a, sr, 1, v + (js - kb) * ldv, ldv, n, D);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
        }
    }
    fwd_finish(vec, t, acc, m, l, nq, i0, C, D, y, ylp, lse);
}

/* One forward task: query blocks [qb0, qb1) of head h of batch b. The
 * head's keys that the blocks see (from kb: the key block of the first
 * row's first key) are copied (f32) or widened (bf16/f16)
 * once into kT (transposed: [D][ldT]), its values into vw ([rows][D]) and
 * each block's q rows into qt, then fwd_rows runs on those tiles: the keys
 * transposed once a task, not once a query block, and every row read
 * contiguous instead of 3C floats apart (qkv's rows of 3C floats map a
 * head's keys onto a quarter of L1's sets). kt: fwd_scratch(T, D). */
static void fwd_task(int vec, dt_dtype t, const void *qkv, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                     bool causal, int64_t window, float cap, float p, dt_rng_key key, int64_t b, int64_t h, int64_t qb0,
                     int64_t qb1, float *kt, float *y, void *ylp, float *lse)
{
    const int64_t C = H * D, C3 = 3 * C, gbh = b * Ht + h0 + h, bh = b * H + h;
    float *yh = y + b * T * C + h * D, *lh = lse + bh * T;
    uint16_t *ylh = ylp ? (uint16_t *)ylp + b * T * C + h * D : NULL;
    const int64_t ia = qb0 * BQ, iz = qb1 * BQ < T ? qb1 * BQ : T;
    const uint16_t *src = (const uint16_t *)qkv + b * T * C3 + h * D; /* bf16/f16 */
    const float *srcf = (const float *)qkv + b * T * C3 + h * D;      /* f32 */
    const int64_t nkv = causal ? iz : T, kb = att_first(ia, window) / BK * BK; /* keys [kb, nkv) */
    const int64_t ldT = dt__att_key_stride(nkv - kb);
    float *qt = kt + DMAX, *kT = qt + BQ * DMAX, *vw = kT + D * ldT; /* kt: a row's scratch */
#if DT__X86_VEC
    if (vec == DT__ATT_BF16) { /* the keys and each block's q rows as bf16 pairs (row_dots_bf16), the values
                                  paired along the keys (rows_acc_bf16) */
        const int64_t D2 = (D + 1) / 2;
        uint32_t *kp = (uint32_t *)(void *)kT, *qp = (uint32_t *)(void *)qt, *vp = (uint32_t *)(void *)vw;
        bf16_pairs_t(src + kb * C3 + C, C3, nkv - kb, D, kp, ldT, (uint32_t *)(void *)kt);
        for (int64_t j = kb; j < nkv; j += 2)
            pair_rows(src + j * C3 + 2 * C, j + 1 < nkv ? src + (j + 1) * C3 + 2 * C : NULL, D,
                      vp + ((j - kb) / 2) * D);
        for (int64_t i0 = ia; i0 < iz; i0 += BQ) {
            int64_t i1 = i0 + BQ < iz ? i0 + BQ : iz;
            for (int64_t i = i0; i < i1; i++)
                bf16_pairs(src + i * C3, qp + (i - i0) * D2, D);
            fwd_rows_bf16(t, qp, kp, ldT, vp, kb, T, C, D, gbh, causal, window, cap, p, key, i0, i1, yh, ylh, lh);
        }
        return;
    }
#endif
    for (int64_t j = kb; j < nkv; j++) {
        const float *kr = t == DT_F32 ? srcf + j * C3 + C : kt;
        if (t != DT_F32)
            widen_row(vec, t, src + j * C3 + C, kt, D);
        for (int64_t d = 0; d < D; d++)
            kT[d * ldT + j - kb] = kr[d];
        task_row(vec, t, qkv, (b * T + j) * C3 + 2 * C + h * D, vw + (j - kb) * D, D);
    }
    for (int64_t d = 0; d < D; d++)
        for (int64_t j = nkv - kb; j < ldT; j++)
            kT[d * ldT + j] = 0.0f;
    for (int64_t i0 = ia; i0 < iz; i0 += BQ) {
        int64_t i1 = i0 + BQ < iz ? i0 + BQ : iz;
        for (int64_t i = i0; i < i1; i++)
            task_row(vec, t, qkv, (b * T + i) * C3 + h * D, qt + (i - i0) * D, D);
        fwd_rows(vec, t, qt, D, kT, ldT, vw, D, kb, T, C, D, gbh, causal, window, cap, p, key, i0, i1, yh, ylh,
                 lh);
    }
}

/* A forward task's scratch in floats: a row, a block's q rows, and the
 * head's keys (transposed, at dt__att_key_stride(T) <= T + 31) and values, as f32. */
static size_t fwd_scratch(int64_t T, int64_t D)
{
    return (size_t)(DMAX + BQ * DMAX + 2 * T * D + 31 * D);
}

/* The row loops of a task over a qkv of dtype t: with bf16/f16 on the
 * AVX-512 paths the fast ones (DT__ATT_FAST), else dt__vec_level()'s (the
 * bits of the f32 arithmetic on the widened qkv). */
static int task_vec(dt_dtype t)
{
    int vec = dt__vec_level();
    if (t == DT_BF16 && dt_k_get_isa() == DT_K_ISA_AVX512_BF16)
        return DT__ATT_BF16;
    return t != DT_F32 && vec >= DT__VEC_AVX512 ? DT__ATT_FAST : vec;
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

/* ---- the products on the AMX tiles (a bf16 qkv) --------------------------------------- */
/* Where the CPU has AMX (dt__amx_tiles_hw, on the avx512_bf16 path) a bf16
 * qkv runs the attention's six products on the tiles, and on a CPU with
 * AVX512_BF16 but no AMX on the same slot over vdpbf16ps (dt__amx_tiles_vdp)
 * from longer sequences on (see VDP_MIN_T) (amx_tiles.h: the
 * block slot, C (32 x 32 f32, 2 x 2 tiles) = the sum over K steps of 32
 * of an A panel of 32 rows times a B panel of 32 columns in the pair
 * layout), the rest (softmax rows, dropout, roundings) as the avx512_bf16
 * path does it. The driver below is written against the slot only, so the
 * tests run it over the portable model (dt__amx_tiles_emul) on every CPU.
 *
 * Forward task: a head's query blocks of 32 rows. The keys the task's
 * last row sees are packed once as B panels of K^T (32 keys a panel, D in
 * K steps) and the values as B panels along the keys (32 columns of D a
 * panel); each query block's rows as an A panel. S = Q K^T for every key
 * block up to the diagonal goes into a [32][keys] row buffer, each row's
 * softmax is taken over all of its keys at once (its max first, then the
 * exponentials: no online rescaling), the probabilities (after dropout's
 * scaling; the row sums use their f32 values) rounded to bf16 straight
 * into an A panel, and O = P V is one tile sum over all the keys, divided
 * by the row sums at the end.
 *
 * Backward task: a head, its scores transposed (a key's row over the
 * queries that see it). For each key block of 32 and each query block
 * that sees it: S^T = K Q^T and dP^T = V dO^T (dy rounded to bf16), P^T
 * and dS^T = P^T (dP^T - Di) / sqrt(D) row by row (each column with its
 * query's L and Di), rounded into the key block's rows of P^T and dS^T
 * (A panels along the queries) and dS^T paired across keys (a B panel) for
 * dQ^T += K^T dS^T, summed in the tiles into an f32 dq^T; then dV = P^T dO
 * and dK = dS^T Q are one tile sum each over the query blocks, stored as
 * rows. dk and dv stay in an f32 scratch, dq^T is transposed at the end,
 * and all three are rounded into dqkv (one pass). Nothing is transposed
 * but K (once) and dq^T (once).
 *
 * Memory per thread: the forward's row buffer of 32 x T floats and the
 * head's panels (O(T D), as the rows' scratch); the backward's panels and
 * scratch O(T D) too.
 *
 * Edges: rows past T, keys past T and D past a multiple of 32 are zeros in
 * the panels (a padded product is 0 x 0), and masked and padded P and dS
 * are zeros. Those zeros multiply the other operand's rows, and 0 x inf is
 * NaN: a task whose q, k, v or dy hold a non-finite value runs the
 * avx512_bf16 rows instead (the path dt_k_get_isa() gives), so the mask
 * hides what it hides there.
 *
 * Panels: a B panel is the tile slot's packed layout (amx_tiles.h); an A
 * panel of 32 rows holds each row's K values contiguous, padded to whole
 * K steps of 32 (rows 32 ceil(K / 32) values apart: the tiles read it in
 * place), and a product's 32 x 32 f32 block comes back row-major.
 *
 * Tile state: each thread configures its tiles (palette 1, all eight
 * 16 x 64 bytes) at its first task of a call and releases them before it
 * leaves the call's parallel region. */
#define AB 32                 /* rows, keys and columns of a tile block */
#define AT DT__AMX_TILE_ELEMS /* bf16 values of one tile in a panel */
#define ASTEP (2 * AT)        /* a K step of a panel of 32 rows or columns */

static const dt__amx_tiles *g_amx_forced; /* the tests' tiles (attention_amx.h) */
static bool g_amx_disabled;                /* the tests' switch */
static atomic_ullong g_amx_tasks, g_amx_fallbacks;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static bool g_amx_off, g_amx_on; /* DT_ATTN_AMX=off, =on */

/* Sequences shorter than this stay on the avx512_bf16 rows under auto:
 * bench/attn_lp --batch 4 --threads 2 --reps 51, Xeon with AMX, medians of
 * 3 interleaved runs, ms: T = 64 1.279 on the tiles against 1.604 on the
 * rows; T = 48 1.083 against 1.073, T = 32 0.633 against 0.662, T = 24
 * 0.506 against 0.492 (the tiles' packing does not pay for itself below
 * 64 keys). GPT-2's bf16 step at B=4 T=64: the backward 208 -> 201 ms.
 * On vdpbf16ps (no AMX: amx_vdp.c's tiles, four times slower a product)
 * the packing weighs more: bench/attn_lp --batch 4 --threads 1 --reps 31,
 * AMD EPYC with AVX512_BF16, two interleaved runs, the CPU ms of the
 * direct op against its widened composition: T = 64 0.63-0.71 on the
 * tiles against 0.63-0.64 on the rows, T = 96 0.53-0.56 against
 * 0.59-0.64, T = 128 0.53-0.54 against 0.58-0.61; B=8 T=256 on 2 threads
 * 23.6-23.9 against 33.9-37.6 ms. */
#define AMX_MIN_T 64
#define VDP_MIN_T 96

void dt__attention_amx_force(const dt__amx_tiles *tiles) { g_amx_forced = tiles; }

void dt__attention_amx_disable(bool off) { g_amx_disabled = off; }

void dt__attention_amx_stats_get(dt__attention_amx_stats *out)
{
    out->tasks = atomic_load(&g_amx_tasks);
    out->fallbacks = atomic_load(&g_amx_fallbacks);
}

/* DT_ATTN_AMX: "off" (or 0) keeps a bf16 qkv on the avx512_bf16 rows;
 * "auto" (the default), "on" (or 1) run its products on the tiles where
 * the CPU has them. Read once per process. */
static void amx_env(void)
{
    const char *e = getenv("DT_ATTN_AMX");
    if (!e || !*e || !strcmp(e, "auto"))
        return;
    if (!strcmp(e, "on") || !strcmp(e, "1"))
        g_amx_on = true;
    else if (!strcmp(e, "off") || !strcmp(e, "0"))
        g_amx_off = true;
    else
        dt_log(DT_LOG_WARN, "DT_ATTN_AMX=%s is not one of auto, on, off; ignored (auto)", e);
}

/* The tiles a bf16 qkv runs its products on from *min_t tokens on, or NULL:
 * on the avx512_bf16 path, the AMX tiles where AMX is usable
 * (DT_MAX_CPU_ISA=avx512 or lower switches it off) from AMX_MIN_T, else
 * vdpbf16ps (dt__amx_tiles_vdp) from VDP_MIN_T, unless DT_ATTN_AMX=off
 * (=on: from 1); or the tests' forced tiles (from 1). */
static const dt__amx_tiles *att_choice(int64_t *min_t)
{
    *min_t = 1;
    if (g_amx_forced)
        return g_amx_forced;
    if (g_amx_disabled || dt_k_get_isa() != DT_K_ISA_AVX512_BF16)
        return NULL;
    pthread_once(&g_amx_once, amx_env);
    if (g_amx_off)
        return NULL;
    const dt__amx_tiles *hw = dt__amx_tiles_hw(NULL), *t = hw ? hw : dt__amx_tiles_vdp(NULL);
    if (!g_amx_on)
        *min_t = hw ? AMX_MIN_T : VDP_MIN_T;
    return t;
}

/* The tiles a qkv of dtype t and T tokens runs its products on, or NULL
 * (the rows): bf16 only, as att_choice says. */
static const dt__amx_tiles *att_tiles(dt_dtype t, int64_t T)
{
    int64_t min_t;
    const dt__amx_tiles *tiles = t == DT_BF16 ? att_choice(&min_t) : NULL;
    return tiles && T >= min_t ? tiles : NULL;
}

const char *dt_k_attention_lp_tiles(int64_t *min_t)
{
    int64_t m;
    const dt__amx_tiles *t = att_choice(&m);
    if (t && min_t)
        *min_t = m;
    return t ? t->name : NULL;
}

/* Configure the calling thread's tiles at its first task (*on says
 * whether it has). */
static void amx_configure(const dt__amx_tiles *tiles, bool *on)
{
    if (*on)
        return;
    dt__amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.rows[i] = 16;
        c.colsb[i] = 64;
    }
    tiles->load_config(&c);
    *on = true;
}

/* Prefetch the n bytes at p (a row the next iterations read). */
static inline void amx_prefetch(const void *p, int64_t n)
{
    for (int64_t o = 0; o < n; o += 64)
        __builtin_prefetch((const char *)p + o);
}

/* Whether any of the n bf16 values at x is infinite or NaN: (h & 0x7f80) +
 * 0x80 has its top bit set exactly when h's exponent is all ones (32
 * values a step in GCC's vector extension, whatever the target; the lanes
 * folded as eight 64-bit words, not one by one: a head's row is 64 values,
 * so the fold is most of the work). On AVX-512 (vec) the kernels' masked
 * loop, dt__any_exp_ones. */
typedef uint16_t amx_v32h __attribute__((vector_size(64)));
static bool bf16_nonfinite(int vec, const uint16_t *x, int64_t n)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) /* the portable loop compiled for the file's baseline (SSE2, spilled) was
                                  0.6-1% of GPT-2's bf16 step on the Xeon with AMX */
        return dt__any_exp_ones(x, 2, 0x7f80u, n);
#else
    (void)vec;
#endif
    amx_v32h a = {0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        amx_v32h v;
        memcpy(&v, x + i, sizeof v);
        a |= (v & 0x7f80) + 0x80;
    }
    uint64_t w[8], m = 0;
    memcpy(w, &a, sizeof w);
    for (int k = 0; k < 8; k++)
        m |= w[k];
    for (; i < n; i++)
        m |= (x[i] & 0x7f80u) + 0x80u;
    return (m & 0x8000800080008000ull) != 0;
}

/* Row r (< 32) of an A panel of 32 rows of K values padded to whole K
 * steps, rows lda = 32 ceil(K / 32) values apart (the tiles read it in
 * place): pa[r lda + k] = x[k] for k < K (the panel zeroed before). */
static void amx_a_row(uint16_t *pa, int64_t r, const uint16_t *x, int64_t K)
{
    memcpy(pa + r * ((K + AB - 1) / AB * AB), x, (size_t)K * 2);
}

/* Column n (< 32) of a B panel whose K index runs along x (a row of k or v
 * for Q K^T, dO V^T): the pair x[2 k2], x[2 k2 + 1] at row k2 % 16 of tile
 * n / 16 of step k2 / 16, slot n % 16 (a zero high half past an odd K). */
static void amx_bt_col(uint16_t *pb, int64_t n, const uint16_t *x, int64_t K)
{
    uint32_t *o = (uint32_t *)(void *)(pb + n / 16 * AT) + n % 16;
    const int64_t K2 = K / 2;
    for (int64_t k2 = 0; k2 < K2; k2++) {
        uint32_t w;
        memcpy(&w, x + 2 * k2, sizeof w);
        o[k2 / 16 * AT + k2 % 16 * 16] = w;
    }
    if (K & 1)
        o[K2 / 16 * AT + K2 % 16 * 16] = x[K - 1];
}

/* dst[d] = a[d] | b[d] << 16 for d < n: bf16 rows a and b as pairs (b
 * NULL: zero high halves). */
static void amx_pair_rows(int vec, const uint16_t *a, const uint16_t *b, int64_t n, uint32_t *dst)
{
#if DT__X86_VEC
    if (vec == DT__ATT_BF16) {
        pair_rows(a, b, n, dst);
        return;
    }
#endif
    (void)vec;
    for (int64_t d = 0; d < n; d++)
        dst[d] = a[d] | (b ? (uint32_t)b[d] << 16 : 0u);
}

/* dst[j] = bf16(a[j]) | bf16(b[j]) << 16 for j < n: f32 rows a and b
 * rounded to bf16 (to nearest even) as pairs (b NULL: zero high halves). */
static void amx_pairs_f32(int vec, const float *a, const float *b, int64_t n, uint32_t *dst)
{
#if DT__X86_VEC
    if (vec == DT__ATT_BF16) {
        bf16_pairs_2rows(a, b, n, dst);
        return;
    }
#endif
    (void)vec;
    for (int64_t j = 0; j < n; j++)
        dst[j] = bf16_round_bits(a[j]) >> 16 | (b ? bf16_round_bits(b[j]) & 0xffff0000u : 0u);
}

/* s[0, 32) rounded to bf16 (to nearest even) into dst[0, 32). */
static void amx_round32(int vec, const float *s, uint16_t *dst)
{
#if DT__X86_VEC
    if (vec == DT__ATT_BF16) {
        bf16_pairs_f32(s, AB, (uint32_t *)(void *)dst);
        return;
    }
#endif
    round_row(vec, DT_BF16, s, NULL, dst, AB);
}

/* Rows k (even) and k + 1 (x1, NULL past the last) of B panels along rows
 * (the K index: the keys of v or k, the rows of q or dy), N columns: column
 * block d / 32 of kbt steps, each 16 columns' pairs one tile row. pr: N
 * words' scratch. */
static void amx_b_rows(int vec, uint16_t *pb, int64_t kbt, int64_t k, const uint16_t *x0, const uint16_t *x1,
                       int64_t N, uint32_t *pr)
{
    amx_pair_rows(vec, x0, x1, N, pr);
    uint32_t *o = (uint32_t *)(void *)pb + k / AB * AT + k % AB / 2 * 16;
    for (int64_t d = 0; d < N; d += 16)
        memcpy(o + (d / AB * kbt) * AT + d % AB / 16 * (AT / 2), pr + d, (size_t)(N - d < 16 ? N - d : 16) * 4);
}

/* Row i of X (D values at x) into the A panels of X^T (rows d, the K index
 * i): row block d / 32 of kbt steps. */
static void amx_at_col(uint16_t *pa, int64_t kbt, int64_t i, const uint16_t *x, int64_t D)
{
    for (int64_t d = 0; d < D; d++) /* row d % 32 of panel d / 32: rows 32 kbt values apart */
        pa[d / AB * kbt * ASTEP + d % AB * kbt * AB + i] = x[d];
}

#if DT__X86_VEC
/* amx_bt_col for the 16 columns n0 .. n0 + 15 at once (n0 a multiple of
 * 16), column n0 + r from the row x + r ldx, K a multiple of 32: each K
 * step's 16 pairs of the 16 rows, transposed, are the step's 16 tile rows
 * of those columns. The same values in the same places as amx_bt_col's. */
DT__AVX512 static void amx_bt_cols16(uint16_t *pb, int64_t n0, const uint16_t *x, int64_t ldx, int64_t K)
{
    uint32_t *o = (uint32_t *)(void *)(pb + n0 / 16 * AT);
    for (int64_t s = 0; s < K / 32; s++) {
        __m512i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = _mm512_loadu_si512(x + i * ldx + 32 * s);
        dt__tr16(r);
        for (int j = 0; j < 16; j++)
            _mm512_storeu_si512(o + s * AT + j * 16, r[j]);
    }
}

/* amx_at_col for the 32 rows i0 .. i0 + 31 of X at once (row r at x + r
 * ldx), D a multiple of 16: each pair of rows interleaved into 32-bit
 * words (the even row low), then 16 of D at a time transposed, so row d of
 * X^T gets its 32 values by one store. The same values in the same places
 * as amx_at_col's. */
DT__AVX512 static void amx_at_cols32(uint16_t *pa, int64_t kbt, int64_t i0, const uint16_t *x, int64_t ldx,
                                     int64_t D)
{
    const int64_t ld = kbt * AB; /* row d of X^T at pa + d ld (panel d / 32, row d % 32) */
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
        __m512i r[16];
        for (int p = 0; p < 16; p++) {
            const __m256i *lo = (const __m256i *)(x + 2 * p * ldx + d0);
            const __m256i *hi = (const __m256i *)(x + (2 * p + 1) * ldx + d0);
            r[p] = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm256_loadu_si256(lo)),
                                   _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(hi)), 16));
        }
        dt__tr16(r);
        for (int j = 0; j < 16; j++)
            _mm512_storeu_si512(pa + (d0 + j) * ld + i0, r[j]);
    }
}
#endif

/* a . b over n floats: 16 partial sums then their sum where vec allows
 * (Di, within the path's bound), else in index order. */
static float amx_dot(int vec, const float *a, const float *b, int64_t n)
{
#if DT__X86_VEC
    if (vec >= DT__ATT_FAST)
        return fast_dot16(a, b, n);
#endif
    return dot_seq(a, b, n);
}

/* s[0, n) scaled and exponentiated against their max (*mx); returns their
 * sum. The fast rows (dt__expf16) where vec allows, else expf. */
static float amx_softmax_row(int vec, float *s, int64_t n, float scale, float *mx)
{
#if DT__X86_VEC
    if (vec >= DT__ATT_FAST) {
        *mx = fast_scale_max(s, n, scale, -INFINITY);
        return fast_exp_sum(s, n, *mx);
    }
#endif
    float m = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float x = s[j] * scale;
        s[j] = x;
        m = x > m ? x : m;
    }
    for (int64_t j = 0; j < n; j++) {
        float e = expf(s[j] - m);
        sum += e;
        s[j] = e;
    }
    *mx = m;
    return sum;
}

/* A forward task's scratch in bytes on the tiles (T keys at most), at
 * least fwd_scratch's (the fallback's). */
static size_t fwd_scratch_amx(int64_t T, int64_t D)
{
    const int64_t kd = (D + AB - 1) / AB, nkb = (T + AB - 1) / AB;
    const size_t b16 = (size_t)(2 * nkb * kd + kd + nkb) * ASTEP * 2, f32 = (size_t)(AB * nkb * AB + 4 * 256) * 4;
    const size_t lp = fwd_scratch(T, D) * sizeof(float);
    return b16 + f32 > lp ? b16 + f32 : lp;
}

/* fwd_task on the tiles: query blocks [qb0, qb1) of 32 rows. Cloned for
 * AVX2 as fwd_rows (the loops around the tiles; the same bits). */
DT_CLONES static void fwd_task_amx(const dt__amx_tiles *tiles, bool *on, int vec, const void *qkv, int64_t T,
                                   int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal, int64_t window, float cap,
                                   float p, dt_rng_key key, int64_t b, int64_t h, int64_t qb0, int64_t qb1,
                                   void *scratch, float *y, void *ylp, float *lse)
{
    const int64_t C = H * D, C3 = 3 * C, gbh = b * Ht + h0 + h, bh = b * H + h, kd = (D + AB - 1) / AB;
    const int64_t ia = qb0 * AB, iz = qb1 * AB < T ? qb1 * AB : T, nkv = causal ? iz : T;
    const int64_t kb = att_first(ia, window) / AB * AB, nkb = (nkv - kb + AB - 1) / AB, lds = nkb * AB; /* [kb, nkv) */
    const uint16_t *src = (const uint16_t *)qkv + b * T * C3 + h * D;
    uint16_t *kp = scratch, *vp = kp + nkb * kd * ASTEP, *qp = vp + kd * nkb * ASTEP, *pp = qp + kd * ASTEP;
    float *s = (float *)(void *)(pp + nkb * ASTEP), *acc = s + AB * lds;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    const float ss = cap > 0.0f ? 1.0f : scale; /* the scores' scale after the cap (which scales them itself) */
    float m[AB], l[AB];
    memset(kp, 0, (size_t)(2 * nkb * kd) * ASTEP * 2);
    uint32_t pr[DMAX];
    int64_t j0 = kb; /* the keys into B panels along D: 16 at a time where the row loops allow */
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512 && D % AB == 0) /* (kb is a multiple of 32) */
        for (; j0 + 16 <= nkv; j0 += 16) {
            for (int64_t r = j0 + 16; r < j0 + 32 && r < nkv; r++) { /* the next 16 rows, 3C apart */
                amx_prefetch(src + r * C3 + C, D * 2);
                amx_prefetch(src + r * C3 + 2 * C, D * 2);
            }
            amx_bt_cols16(kp + (j0 - kb) / AB * kd * ASTEP, (j0 - kb) % AB, src + j0 * C3 + C, C3, D);
        }
#endif
    for (int64_t j = j0; j < nkv; j++) {
        if (j + 4 < nkv) { /* rows a stride of 3C apart: fetch them ahead */
            amx_prefetch(src + (j + 4) * C3 + C, D * 2);
            amx_prefetch(src + (j + 4) * C3 + 2 * C, D * 2);
        }
        amx_bt_col(kp + (j - kb) / AB * kd * ASTEP, (j - kb) % AB, src + j * C3 + C, D);
    }
    for (int64_t j = kb; j < nkv; j += 2)
        amx_b_rows(vec, vp, nkb, j - kb, src + j * C3 + 2 * C, j + 1 < nkv ? src + (j + 1) * C3 + 2 * C : NULL, D,
                   pr);
    /* the keys and values checked whole in their panels (the padding zeros), the q rows one by one */
    bool bad = bf16_nonfinite(vec, kp, 2 * nkb * kd * ASTEP);
    for (int64_t i = ia; i < iz && !bad; i++)
        bad = bf16_nonfinite(vec, src + i * C3, D);
    if (bad) {
        const int64_t nqb = (T + BQ - 1) / BQ, q1 = qb1 * (AB / BQ);
        atomic_fetch_add(&g_amx_fallbacks, 1);
        fwd_task(vec, DT_BF16, qkv, T, H, D, h0, Ht, causal, window, cap, p, key, b, h, qb0 * (AB / BQ),
                 q1 < nqb ? q1 : nqb, scratch, y, ylp, lse);
        return;
    }
    atomic_fetch_add(&g_amx_tasks, 1);
    amx_configure(tiles, on);
    for (int64_t i0 = ia; i0 < iz; i0 += AB) {
        /* the block's key blocks [jb0, nk) of the task's (from kb): keys [k0, k0 + cols) */
        const int64_t nr = iz - i0 < AB ? iz - i0 : AB, nk = ((causal ? i0 + nr : T) - kb + AB - 1) / AB;
        const int64_t jb0 = (att_first(i0, window) - kb) / AB, k0 = kb + jb0 * AB, cols = (nk - jb0) * AB;
        memset(qp, 0, (size_t)kd * ASTEP * 2);
        for (int64_t r = 0; r < nr; r++)
            amx_a_row(qp, r, src + (i0 + r) * C3, D);
        for (int64_t jb = jb0; jb < nk; jb++) /* each key block's scores straight into the rows */
            tiles->block(qp, kd * AB, kp + jb * kd * ASTEP, kd, true, true, s + (jb - jb0) * AB, lds, false, NULL, 0);
        memset(pp, 0, (size_t)(nk - jb0) * ASTEP * 2);
        for (int64_t r = 0; r < nr; r++) {
            const int64_t i = i0 + r, n = (causal ? i + 1 : T) - k0, lo = att_first(i, window) - k0;
            float *sr = s + r * lds; /* key k0 + j at sr[j]; the row's keys [lo, n) */
            if (cap > 0.0f) /* the scores as they come out of the tiles capped, before the row's max */
                dt__att_cap_row(vec, sr + lo, NULL, n - lo, scale, cap);
#if DT__X86_VEC
            if (vec == DT__ATT_BF16 && p == 0.0f) { /* the three passes below in one */
                l[r] = fast_softmax_bf16(sr, lo, n, cols, ss, &m[r], pp + r * cols);
                continue;
            }
#endif
            l[r] = amx_softmax_row(vec, sr + lo, n - lo, ss, &m[r]);
            for (int64_t j = lo; j < n && p > 0.0f; j++)
                sr[j] = dt__att_keep(key, p, gbh, T, i, k0 + j) ? sr[j] * pscale : 0.0f;
            for (int64_t j = 0; j < lo; j++)
                sr[j] = 0.0f;
            for (int64_t j = n; j < cols; j++)
                sr[j] = 0.0f;
            for (int64_t jb = 0; jb < nk - jb0; jb++)
                amx_round32(vec, sr + jb * AB, pp + r * cols + jb * AB);
        }
        for (int64_t nb = 0; nb < kd; nb++) {
            const int64_t nc = D - nb * AB < AB ? D - nb * AB : AB;
            float *yo = y + (b * T + i0) * C + h * D + nb * AB;
            tiles->block(pp, cols, vp + (nb * nkb + jb0) * ASTEP, nk - jb0, true, true, acc, AB, false, NULL, 0);
            for (int64_t r = 0; r < nr; r++) { /* the block's rows divided by their sums */
                const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f, *restrict ar = acc + r * AB;
                float *restrict o = yo + r * C;
                for (int64_t c = 0; c < nc; c++)
                    o[c] = ar[c] * inv;
            }
        }
        for (int64_t r = 0; r < nr; r++) {
            const int64_t i = i0 + r;
            if (ylp)
                round_row(vec, DT_BF16, y + (b * T + i) * C + h * D, NULL, (uint16_t *)ylp + (b * T + i) * C + h * D,
                          D);
            lse[bh * T + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
        }
    }
}

/* window: > 0 a sliding window (causal), 0 or >= T none */
static dt_status fwd_run(const char *fn, dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                         int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                         float *y, void *ylp, float *lse)
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
    /* Tasks of g query blocks of one head (dt__att_group) */
    const dt__amx_tiles *tiles = att_tiles(t, T);
    const int64_t bq = tiles ? AB : BQ, nqb = (T + bq - 1) / bq; /* on the tiles: blocks of 32 rows */
    window = window < T ? window : 0;
    int nt = dt__threads_for(B * T * (window ? window : T) * C);
    const int64_t g = dt__att_group(nt, B * H, nqb), ngr = (nqb + g - 1) / g, ntask = B * H * ngr;
    const size_t scratch = tiles ? fwd_scratch_amx(T, D) : fwd_scratch(T, D) * sizeof(float);
    bool nomem = false;
    const int vec = task_vec(t);
#pragma omp parallel num_threads(nt)
    {
        float *kt = dt_alloc(scratch);
        bool on = false; /* this thread's tiles configured */
        if (!kt) {
#pragma omp atomic write
            nomem = true;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < ntask; task++) {
            int64_t bh = task / ngr, q0 = (task % ngr) * g, q1 = q0 + g < nqb ? q0 + g : nqb;
            if (kt && tiles)
                fwd_task_amx(tiles, &on, vec, qkv, T, H, D, h0, Ht, causal, window, cap, p, key, bh / H, bh % H, q0,
                             q1, kt, y, ylp, lse);
            else if (kt)
                fwd_task(vec, t, qkv, T, H, D, h0, Ht, causal, window, cap, p, key, bh / H, bh % H, q0, q1, kt, y,
                         ylp, lse);
        }
        if (on)
            tiles->release();
        dt_free(kt);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key blocks", fn);
    return DT_OK;
}

dt_status dt_k_attention_fwd_heads(const float *qkv, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                   int64_t Ht, bool causal, float p, dt_rng_key key, float *y, float *lse)
{
    return fwd_run("dt_k_attention_fwd", DT_F32, qkv, B, T, H, D, h0, Ht, causal, 0, 0.0f, p, key, y, NULL, lse);
}

dt_status dt_k_attention_fwd_heads_lp(dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                                      int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y,
                                      void *ylp, float *lse)
{
    const char *fn = "dt_k_attention_fwd_lp";
    dt_status st = lp_dtype(fn, t);
    return st < 0 ? st : fwd_run(fn, t, qkv, B, T, H, D, h0, Ht, causal, 0, 0.0f, p, key, y, ylp, lse);
}

#if DT__X86_VEC
/* The backward of one head on the avx512_bf16 path (DT__ATT_BF16) for a
 * bf16 qkv: the head's q rows at src (stride C3; k at + C, v at + 2 C), its
 * y, dy (stride C) and lse rows, its dq columns at g (dk at + C, dv at + 2
 * C; stride C3) and, when dl is not NULL, their bf16 copy. The scores q . k
 * and dy . v by row_dots_bf16; P and dS rounded to bf16 (to nearest even)
 * multiply k (dq), q (dk) and the rounded dy (dv) by vdpbf16ps
 * (rows_acc_bf16), with k paired along the keys once a block and q and dy
 * along the rows once a head. The sums run in a fixed order (the same bits
 * for any thread count). Under a window the pair that holds a row's first
 * key or a key's last row has the other half hidden (rows_acc_bf16's lo0
 * and hi_last). kt: bwd_scratch(DT_BF16, T, D). */
DT__AVX512BF16 static void bwd_head_bf16(const uint16_t *src, const float *y, const float *lse, const float *dy,
                                         int64_t T, int64_t C, int64_t D, int64_t gbh, bool causal, int64_t window,
                                         float cap, float p, dt_rng_key key, float *kt, float *g, uint16_t *dl)
{
    const int64_t C3 = 3 * C, D2 = (D + 1) / 2, T2 = (T + 1) / 2;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    uint32_t *kp = (uint32_t *)(void *)kt, *vp = kp + DMAX * BK; /* the block's keys and values, row_dots_bf16's */
    float *pdm = (float *)(void *)(vp + DMAX * BK), *dsm = pdm + T * BK; /* [T, BK] each: P (dropped), dS */
    float *dim = dsm + T * BK;                                           /* [T]: each row's Di */
    uint32_t *qp = (uint32_t *)(void *)(dim + T), *gp = qp + T * D2;    /* q, dy rows as pairs along D */
    uint32_t *q2 = gp + T * D2, *g2 = q2 + T2 * D;                     /* q, dy paired along the rows */
    uint32_t *k2 = g2 + T2 * D, *ptm = k2 + (BK / 2) * D, *dtm = ptm + T2 * BK; /* keys paired; P, dS paired */
    float sc[BK], dp[BK], th[BK], wr[DMAX];
    uint16_t hb[DMAX];
    uint32_t pr[DMAX / 2], sp[BK / 2];
    for (int64_t i = 0; i < T; i++) {
        bf16_pairs(src + i * C3, qp + i * D2, D);
        round_row(DT__ATT_BF16, DT_BF16, dy + i * C, wr, hb, D); /* dy rounded: the gradient of a bf16 result */
        bf16_pairs(hb, gp + i * D2, D);
        __m512 di = _mm512_setzero_ps(); /* Di on 16 lanes, then their sum (within the path's bound) */
        for (int64_t d = 0; d < D; d += 16) {
            const __mmask16 k = att_lanes(d, D);
            di = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, wr + d), _mm512_maskz_loadu_ps(k, y + i * C + d), di);
        }
        dim[i] = _mm512_reduce_add_ps(di);
        for (int k = 0; k < 3; k++)
            memset(g + i * C3 + k * C, 0, (size_t)D * sizeof(float));
    }
    for (int64_t m = 0; m < T2; m++) {
        const bool two = 2 * m + 1 < T;
        pair_rows(src + 2 * m * C3, two ? src + (2 * m + 1) * C3 : NULL, D, q2 + m * D);
        pair_rows((const uint16_t *)(const void *)(gp + 2 * m * D2),
                  two ? (const uint16_t *)(const void *)(gp + (2 * m + 1) * D2) : NULL, D, g2 + m * D);
    }
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
        const int64_t j1 = j0 + BK < T ? j0 + BK : T, nb = j1 - j0, i0 = causal ? j0 : 0, m0 = i0 / 2;
        const int64_t iend = att_rows_end(j1 - 1, window, T); /* the rows [i0, iend) see the block */
        bf16_pairs_t(src + j0 * C3 + C, C3, nb, D, kp, BK, pr);
        bf16_pairs_t(src + j0 * C3 + 2 * C, C3, nb, D, vp, BK, pr);
        for (int64_t jj = 0; jj < nb; jj += 2)
            pair_rows(src + (j0 + jj) * C3 + C, jj + 1 < nb ? src + (j0 + jj + 1) * C3 + C : NULL, D, k2 + jj / 2 * D);
        for (int64_t i = i0; i < iend; i++) { /* the block's P and dS row by row, and dq_i */
            /* the row's keys j0 + [o, o + ne) */
            const int64_t je = causal && i + 1 < j1 ? i + 1 : j1, fk = att_first(i, window);
            const int64_t o = fk > j0 ? fk - j0 : 0, ne = je - j0 - o, odd = o & 1;
            float *pd = pdm + (i - i0) * BK, *ds = dsm + (i - i0) * BK;
            const float L = lse[i], Di = dim[i];
            row_dots_bf16(qp + i * D2, kp + o, BK, D2, ne, sc);
            row_dots_bf16(gp + i * D2, vp + o, BK, D2, ne, dp);
            if (cap > 0.0f) /* the recomputed scores capped, with their tanh for its derivative */
                dt__att_cap_row(DT__ATT_BF16, sc, th, ne, scale, cap);
            fast_bwd_probs(sc, cap > 0.0f ? th : NULL, dp, ne, scale, L, Di, pd + o, ds + o);
            for (int64_t jj = 0; jj < ne && p > 0.0f; jj++) { /* dropout on P */
                bool kp1 = dt__att_keep(key, p, gbh, T, i, j0 + o + jj);
                float P = pd[o + jj];
                pd[o + jj] = kp1 ? P * pscale : 0.0f;
                ds[o + jj] = P * ((kp1 ? dp[jj] * pscale : 0.0f) - Di) * scale *
                             (cap > 0.0f ? 1.0f - th[jj] * th[jj] : 1.0f); /* a cap: tanh' */
            }
            for (int64_t jj = 0; jj < o; jj++) /* keys before the row's window: 0 in the pairs below */
                pd[jj] = ds[jj] = 0.0f;
            for (int64_t jj = o + ne; jj < nb; jj++) /* keys the row does not see: 0 in the pairs below */
                pd[jj] = ds[jj] = 0.0f;
            bf16_pairs_f32(ds + o - odd, ne + odd, sp);
            rows_acc_bf16(g + i * C3, sp, 1, k2 + (o - odd) / 2 * D, D, (ne + odd + 1) / 2, D, odd != 0,
                          ((ne + odd) & 1) != 0);
        }
        for (int64_t m = m0; m < (iend + 1) / 2; m++) { /* P and dS of rows 2m, 2m + 1 paired, for each key */
            const int64_t r = 2 * m - i0;
            const bool two = 2 * m + 1 < iend;
            bf16_pairs_2rows(pdm + r * BK, two ? pdm + (r + 1) * BK : NULL, nb, ptm + (m - m0) * BK);
            bf16_pairs_2rows(dsm + r * BK, two ? dsm + (r + 1) * BK : NULL, nb, dtm + (m - m0) * BK);
        }
        for (int64_t j = j0; j < j1; j += 2) { /* dk_j and dv_j over the rows i that see key j, in i order */
            const int64_t ia = causal ? j : i0, jj = j - j0, ma = ia / 2; /* j, ia even */
            /* one past the last rows of keys j and j + 1 and the pairs of rows both see (row j does not see key
               j + 1: x2's lo1): under a window, the pair with key j's last row is its tail, with the second row
               hidden when ea is odd, and key j + 1's the pair with its own (the second hidden when eb is odd) */
            const int64_t ea = att_rows_end(j, window, T), eb = att_rows_end(j + 1, window, T);
            const int64_t mz = window ? ea / 2 : T2;
            if (j + 1 < j1) { /* keys j and j + 1 over the same pairs of rows */
                rows_acc_bf16_x2(g + j * C3 + C, g + (j + 1) * C3 + C, dtm + (ma - m0) * BK + jj,
                                 dtm + (ma - m0) * BK + jj + 1, BK, q2 + ma * D, D, mz - ma, D, causal);
                rows_acc_bf16_x2(g + j * C3 + 2 * C, g + (j + 1) * C3 + 2 * C, ptm + (ma - m0) * BK + jj,
                                 ptm + (ma - m0) * BK + jj + 1, BK, g2 + ma * D, D, mz - ma, D, causal);
                for (int64_t c = 0; c < 2 && window; c++) { /* the tails, key j then j + 1 */
                    const int64_t n2 = ((c ? eb : ea) + 1) / 2 - mz, at = (mz - m0) * BK + jj + c;
                    const bool lo = c && causal && mz == ma, hi = ((c ? eb : ea) & 1) != 0;
                    rows_acc_bf16(g + (j + c) * C3 + C, dtm + at, BK, q2 + mz * D, D, n2, D, lo, hi);
                    rows_acc_bf16(g + (j + c) * C3 + 2 * C, ptm + at, BK, g2 + mz * D, D, n2, D, lo, hi);
                }
                continue;
            }
            const int64_t n2 = (ea + 1) / 2 - ma; /* window 0: T2 - ma */
            const bool hi = window && (ea & 1);
            rows_acc_bf16(g + j * C3 + C, dtm + (ma - m0) * BK + jj, BK, q2 + ma * D, D, n2, D, false, hi);
            rows_acc_bf16(g + j * C3 + 2 * C, ptm + (ma - m0) * BK + jj, BK, g2 + ma * D, D, n2, D, false, hi);
        }
    }
    for (int64_t i = 0; i < T; i++)
        for (int k = 0; k < 3; k++) {
            float *gr = g + i * C3 + k * C;
            round_row(DT__ATT_BF16, DT_BF16, gr, gr, dl ? dl + i * C3 + k * C : hb, D);
        }
}
#endif

/* The f32 rows a backward task of batch b sums into: b's rows of dqkv, or
 * (dqkv NULL: the gradient wanted in t alone) T rows of the thread's own,
 * allocated at its first need into *own (freed by bwd_run); NULL when out
 * of memory. */
static float *task_rows(float *dqkv, int64_t b, int64_t T, int64_t C3, float **own)
{
    if (dqkv)
        return dqkv + b * T * C3;
    if (!*own)
        *own = dt_alloc((size_t)(T * C3) * sizeof(float));
    return *own;
}

/* One backward task: head h of batch b, whose columns of dq, dk and dv it
 * owns, in gbase: batch b's T rows of the f32 gradient (3C floats a row;
 * the caller's dqkv, or with a gradient wanted in t alone the thread's own
 * rows, each task zeroing its columns first). Cloned for AVX2 as fwd_task,
 * with the same bits on both clones. t: qkv's dtype. The head's q, k, v
 * are first copied (f32) or widened (bf16/f16) into an f32 [T][3D] tile
 * and dy's head columns copied (f32) or rounded to t (the gradient of a t
 * result) into a [T][D] one: the loops read contiguous rows, not rows 3C
 * floats apart (see dt__att_key_stride); with bf16/f16 the head's dq, dk,
 * dv are rounded to t at the end (the gradient of a t input; also stored
 * as t in dlp, the whole gradient's, when it is not NULL). kt:
 * bwd_scratch(t, T, D). */
DT_CLONES static void bwd_task(int vec, dt_dtype t, const void *qkv, const float *y, const float *lse,
                               const float *dy, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                               int64_t window, float cap, float p, dt_rng_key key, int64_t b, int64_t h, float *kt,
                               float *gbase, uint16_t *dlp)
{
    const int64_t gbh = b * Ht + h0 + h; /* the dropout mask's head */
    const int64_t C = H * D, C3 = 3 * C, bh = b * H + h;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *vt = kt + DMAX * BK;
    float *pdm = vt + DMAX * BK, *dsm = pdm + T * BK; /* [T, BK] each: P (dropped) and dS of the block */
    float sc[BK], dp[BK], th[BK];
    uint16_t hb[DMAX];
    const uint16_t *src = t == DT_F32 ? NULL : (const uint16_t *)qkv + b * T * C3 + h * D;
#if DT__X86_VEC
    if (vec == DT__ATT_BF16) {
        bwd_head_bf16(src, y + b * T * C + h * D, lse + bh * T, dy + b * T * C + h * D, T, C, D, gbh, causal, window,
                      cap, p, key, kt, gbase + h * D, dlp ? dlp + b * T * C3 + h * D : NULL);
        return;
    }
#endif
    float *dim = dsm + T * BK; /* [T]: each row's Di, once (not once a key block) */
    float *w = dim + T, *wg = w + T * 3 * D;
    for (int64_t i = 0; i < T; i++) {
        for (int k = 0; k < 3; k++)
            task_row(vec, t, qkv, (b * T + i) * C3 + k * C + h * D, w + i * 3 * D + k * D, D);
        if (t == DT_F32)
            memcpy(wg + i * D, dy + (b * T + i) * C + h * D, (size_t)D * sizeof(float));
        else
            round_row(vec, t, dy + (b * T + i) * C + h * D, wg + i * D, hb, D);
    }
    /* the head's q, k, v rows (stride ld) and dy rows (stride ldg) */
    const float *qb = w, *kb = w + D, *vb = w + 2 * D, *gy = wg;
    const int64_t ld = 3 * D, ldg = D;
    for (int64_t i = 0; i < T; i++) { /* this head's columns of dq, dk, dv, and Di */
        for (int k = 0; k < 3; k++)
            memset(gbase + i * C3 + k * C + h * D, 0, (size_t)D * sizeof(float));
        dim[i] = dot_seq(gy + i * ldg, y + (b * T + i) * C + h * D, D);
    }
    for (int64_t j0 = 0; j0 < T; j0 += BK) {
        int64_t j1 = j0 + BK < T ? j0 + BK : T, i0 = causal ? j0 : 0, iend = att_rows_end(j1 - 1, window, T);
        block_t(kb + j0 * ld, ld, j1 - j0, D, kt);
        block_t(vb + j0 * ld, ld, j1 - j0, D, vt);
        for (int64_t i = i0; i < iend; i++) { /* the rows that see the block: its P and dS row by row, and dq_i */
            /* the row's keys j0 + [o, o + ne); the scores from oa, o rounded down to row_dots' 8-key steps */
            const int64_t je = causal && i + 1 < j1 ? i + 1 : j1, fk = att_first(i, window);
            const int64_t o = fk > j0 ? fk - j0 : 0, oa = o & ~(int64_t)7, ne = je - j0 - o;
            const float *q = qb + i * ld, *g = gy + i * ldg;
            float *pd = pdm + (i - i0) * BK + o, *ds = dsm + (i - i0) * BK + o;
            float L = lse[bh * T + i], Di = dim[i];
            float *scr = sc + (o - oa), *dpr = dp + (o - oa);
            row_dots(vec, q, kt + oa, BK, D, je - j0 - oa, sc);
            row_dots(vec, g, vt + oa, BK, D, je - j0 - oa, dp);
            if (cap > 0.0f) /* the recomputed scores capped, with their tanh for its derivative */
                dt__att_cap_row(vec, scr, th, ne, scale, cap);
#if DT__X86_VEC
            if (vec >= DT__ATT_FAST) {
                fast_bwd_probs(scr, cap > 0.0f ? th : NULL, dpr, ne, scale, L, Di, pd, ds);
                for (int64_t jj = 0; jj < ne && p > 0.0f; jj++) { /* dropout on the fast path's P */
                    bool kp = dt__att_keep(key, p, gbh, T, i, j0 + o + jj);
                    float P = pd[jj];
                    pd[jj] = kp ? P * pscale : 0.0f;
                    ds[jj] = P * ((kp ? dpr[jj] * pscale : 0.0f) - Di) * scale *
                             (cap > 0.0f ? 1.0f - th[jj] * th[jj] : 1.0f); /* a cap: tanh' */
                }
            } else
#endif
            if (cap > 0.0f) { /* P from the capped scores (times 1: the same bits), dS through tanh' = 1 - tanh^2 */
                att_probs(vec, scr, ne, 1.0f, L, pd);
                for (int64_t jj = 0; jj < ne; jj++) {
                    float P = pd[jj], dP = dpr[jj];
                    if (p > 0.0f) { /* dropout on P: dS through the kept ones' dP */
                        bool kp = dt__att_keep(key, p, gbh, T, i, j0 + o + jj);
                        pd[jj] = kp ? P * pscale : 0.0f;
                        dP = kp ? dP * pscale : 0.0f;
                    }
                    ds[jj] = P * (dP - Di) * (1.0f - th[jj] * th[jj]) * scale;
                }
            } else {
                att_probs(vec, scr, ne, scale, L, pd);
                for (int64_t jj = 0; jj < ne; jj++) {
                    float P = pd[jj], dP = dpr[jj], Pd = P;
                    if (p > 0.0f) {
                        bool kp = dt__att_keep(key, p, gbh, T, i, j0 + o + jj);
                        Pd = kp ? P * pscale : 0.0f;
                        dP = kp ? dP * pscale : 0.0f;
                    }
                    pd[jj] = Pd;
                    ds[jj] = P * (dP - Di) * scale;
                }
            }
            rows_acc(vec, gbase + i * C3 + h * D, ds, 1, kb + (j0 + o) * ld, ld, ne, D);
        }
        /* dk_j and dv_j over the rows that see key j (a key's first row is j with the mask, its last j + window
           - 1 with a window) */
        dkdv_keys(vec, gbase + C + h * D, C3, gbase + 2 * C + h * D, C3, dsm, pdm, qb, ld, gy, ldg, T, i0, j0, j1,
                  causal, 0, window, D);
    }
    for (int64_t i = 0; i < T && t != DT_F32; i++)
        for (int k = 0; k < 3; k++) {
            const int64_t at = i * C3 + k * C + h * D;
            float *gr = gbase + at;
            round_row(vec, t, gr, gr, dlp ? dlp + b * T * C3 + at : hb, D);
        }
}

/* A backward task's scratch in floats: the key and value blocks, P and dS
 * ([T, BK] each), the rows' Di [T], and with bf16/f16 the widened q|k|v
 * [T][3D] and dy [T][D] and (DT__ATT_BF16) the q and dy rows' bf16 pairs. */
static size_t bwd_scratch(dt_dtype t, int64_t T, int64_t D)
{
    const int64_t base = SCRATCH_FLOATS + 2 * T * BK + T, T2 = (T + 1) / 2, D2 = (D + 1) / 2;
    const int64_t wide = base + 4 * T * D + T * (D + 1);
    const int64_t pairs = base + 2 * T * D2 + 2 * T2 * D + (BK / 2) * D + 2 * T2 * BK; /* bwd_head_bf16's */
    return (size_t)(t == DT_BF16 && pairs > wide ? pairs : wide);
}

#if DT__X86_VEC
/* round_bf16_v16 for a row of whole 16-float groups whose f32 copy d is
 * 64-byte aligned: d written with streaming stores (no read of its lines
 * first, nothing of it kept in the caches: the f32 gradient of a bf16 qkv
 * is read by no one when its bf16 copy h is taken), h as usual. The
 * caller fences (_mm_sfence) before its results are read. */
DT__AVX512 static void round_bf16_nt16(const float *s, float *d, uint16_t *h, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 r = dt__bf16_round16(_mm512_loadu_ps(s + i));
        if (d)
            _mm512_stream_ps(d + i, r);
        dt__bf16_store16(h + i, r);
    }
}
#endif

/* The rows' final rounding on the tiles: round_row, with streaming stores
 * for d where the row allows them; d NULL: h alone (s, the task's scratch,
 * rounded in place where round_row runs). */
static inline void amx_round_out(int vec, float *s, float *d, uint16_t *h, int64_t n)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512 && n % 16 == 0 && ((uintptr_t)d & 63) == 0) {
        round_bf16_nt16(s, d, h, n);
        return;
    }
#endif
    round_row(vec, DT_BF16, s, d ? d : s, h, n);
}

/* A backward task's scratch in bytes on the tiles, at least bwd_scratch's
 * (the fallback's): bwd_task_amx's eight head panels of Tp x Dp values, a
 * key block's P^T and dS^T rows (32 x Tp each) and dS^T pairs (one step);
 * in floats dk|dv [Tp][2 Dp], dq^T [Dp][Tp + 16], three 32 x 32 blocks, L
 * and Di [Tp] and a row. */
static size_t bwd_scratch_amx(int64_t T, int64_t D)
{
    const int64_t Tp = (T + AB - 1) / AB * AB, Dp = (D + AB - 1) / AB * AB;
    const size_t b16 = (size_t)(8 * Tp * Dp + 2 * AB * Tp + ASTEP) * 2;
    const size_t f32 = (size_t)(2 * Tp * Dp + Dp * (Tp + 16) + 3 * AB * AB + 2 * Tp + DMAX) * 4;
    const size_t lp = bwd_scratch(DT_BF16, T, D) * sizeof(float);
    return b16 + f32 > lp ? b16 + f32 : lp;
}

/* The rows [lo, hi) of a key's row of P and dS on the tiles (the others
 * 0): fast_bwd_probs_t where vec allows, else expf; th not NULL: the
 * scores soft-capped, th their tanh (as fast_bwd_probs_t takes them). */
static void amx_probs_t(int vec, const float *sc, const float *th, const float *dp, int64_t lo, int64_t hi,
                        float scale, const float *L, const float *Di, float *pd, float *ds)
{
#if DT__X86_VEC
    if (vec >= DT__ATT_FAST) {
        fast_bwd_probs_t(sc, th, dp, lo, hi, scale, L, Di, pd, ds);
        return;
    }
#endif
    (void)vec;
    for (int64_t c = 0; c < AB; c++) {
        const bool in = c >= lo && c < hi;
        const float P = in ? expf(th ? sc[c] - L[c] : sc[c] * scale - L[c]) : 0.0f;
        pd[c] = P;
        ds[c] = !in ? 0.0f : th ? P * (dp[c] - Di[c]) * (1.0f - th[c] * th[c]) * scale : P * (dp[c] - Di[c]) * scale;
    }
}

/* bwd_task on the tiles: head h of batch b (cloned for AVX2, the same
 * bits). The scores are taken transposed, a key block against the query
 * blocks that see it: S^T = K Q^T and dP^T = V dO^T, so that a key's row
 * of P^T and dS^T (rounded to bf16) is a row of the A operands of dV = P^T
 * dO and dK = dS^T Q as it comes, and the key block's dV and dK rows are
 * one tile sum each over the query blocks, stored once; dQ^T = K^T dS^T
 * gathers over the key blocks in the tiles' f32 sums (dq^T, Dp rows),
 * transposed once at the end. Panels of the head, Tp = 32 nqb rows and Dp
 * = 32 kd columns: k and v rows as A panels (ka, va: rows Dp apart), q and
 * the rounded dy as B panels along D (qt, gt: one block of 32 queries a
 * panel, kd steps), dy and q as B panels along the rows (gb, qb: the K
 * index a query, kd column blocks of nqb steps), K^T as an A panel (kT:
 * rows d, Tp apart); a key block's P^T and dS^T rows (pa, sa: 32 rows of Tp
 * values) and one query block's dS^T paired along the keys (sb). A head
 * with a non-finite value runs bwd_task instead, in task_rows(..., own);
 * false: out of memory for those rows. */
DT_CLONES static bool bwd_task_amx(const dt__amx_tiles *tiles, bool *on, int vec, const void *qkv,
                                   const float *y, const float *lse, const float *dy, int64_t T, int64_t H, int64_t D,
                                   int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p,
                                   dt_rng_key key, int64_t b, int64_t h, void *scratch, float *dqkv, uint16_t *dlp,
                                   float **own)
{
    const int64_t C = H * D, C3 = 3 * C, gbh = b * Ht + h0 + h, bh = b * H + h, kd = (D + AB - 1) / AB;
    const int64_t nqb = (T + AB - 1) / AB, Tp = nqb * AB, Dp = kd * AB, pn = Tp * Dp;
    const int64_t ldq = Tp + 16; /* dq^T's rows: not a multiple of 1 KiB apart (the gather's cache sets) */
    const uint16_t *src = (const uint16_t *)qkv + b * T * C3 + h * D;
    const float *yh = y + b * T * C + h * D, *dyh = dy + b * T * C + h * D, *L = lse + bh * T;
    const float scale = 1.0f / sqrtf((float)D), pscale = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    float *g = dqkv ? dqkv + b * T * C3 + h * D : NULL; /* NULL: the gradient in bf16 alone (dlp) */
    uint16_t *ka = scratch, *va = ka + pn, *qt = va + pn, *gt = qt + pn, *gb = gt + pn, *qb = gb + pn;
    uint16_t *kT = qb + pn, *gh = kT + pn; /* gh: dy rounded, [Tp][Dp] */
    uint16_t *pa = gh + pn, *sa = pa + AB * Tp, *sb = sa + AB * Tp;
    float *gw = (float *)(void *)(sb + ASTEP), *dqt = gw + 2 * pn; /* gw: dk|dv rows [Tp][2 Dp]; dq^T [Dp][ldq] */
    float *sc = dqt + Dp * ldq, *dp = sc + AB * AB, *ds = dp + AB * AB, *Lp = ds + AB * AB, *Dip = Lp + Tp;
    float *wr = Dip + Tp;
    float th[AB]; /* a key's row of the capped scores' tanh */
    uint16_t hb[DMAX];
    uint32_t pr[DMAX];
    if (T % AB || D % AB) /* padding: zeros (every value is written when there is none) */
        memset(ka, 0, (size_t)(8 * pn) * 2);
    for (int64_t i = 0; i < T; i++) {
        const uint16_t *q = src + i * C3, *k = q + C, *v = q + 2 * C;
        if (i + 4 < T) { /* rows a stride of 3C apart: fetch them ahead */
            for (int c = 0; c < 3; c++)
                amx_prefetch(q + 4 * C3 + c * C, D * 2);
            amx_prefetch(dyh + (i + 4) * C, D * 4);
            amx_prefetch(yh + (i + 4) * C, D * 4);
        }
        uint16_t *hr = gh + i * Dp;
        round_row(vec, DT_BF16, dyh + i * C, wr, hr, D); /* dy rounded: the gradient of a bf16 result */
        Dip[i] = amx_dot(vec, wr, yh + i * C, D);
        Lp[i] = L[i];
        amx_a_row(ka, i, k, D);
        amx_a_row(va, i, v, D);
    }
    int64_t ir = 0; /* q and the rounded dy into B panels along D, k into the A panels of k^T */
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512 && D % AB == 0)
        for (; ir + AB <= T; ir += AB) {
            for (int64_t r = ir; r < ir + AB; r += 16) {
                amx_bt_cols16(qt + ir / AB * kd * ASTEP, r % AB, src + r * C3, C3, D);
                amx_bt_cols16(gt + ir / AB * kd * ASTEP, r % AB, gh + r * Dp, Dp, D);
            }
            amx_at_cols32(kT, nqb, ir, src + ir * C3 + C, C3, D);
        }
#endif
    for (int64_t i = ir; i < T; i++) {
        const uint16_t *q = src + i * C3;
        amx_bt_col(qt + i / AB * kd * ASTEP, i % AB, q, D);
        amx_bt_col(gt + i / AB * kd * ASTEP, i % AB, gh + i * Dp, D);
        amx_at_col(kT, nqb, i, q + C, D);
    }
    for (int64_t i = T; i < Tp; i++)
        Lp[i] = Dip[i] = 0.0f;
    for (int64_t i = 0; i < T; i += 2) {
        const bool two = i + 1 < T;
        amx_b_rows(vec, gb, nqb, i, gh + i * Dp, two ? gh + (i + 1) * Dp : NULL, D, pr);
        amx_b_rows(vec, qb, nqb, i, src + i * C3, two ? src + (i + 1) * C3 : NULL, D, pr);
    }
    /* q, k, v and the rounded dy, each whole in a panel (the padding zeros) */
    if (bf16_nonfinite(vec, ka, pn) || bf16_nonfinite(vec, va, pn) || bf16_nonfinite(vec, qt, pn) ||
        bf16_nonfinite(vec, gh, pn)) {
        atomic_fetch_add(&g_amx_fallbacks, 1);
        float *rows = task_rows(dqkv, b, T, C3, own);
        if (!rows)
            return false;
        bwd_task(vec, DT_BF16, qkv, y, lse, dy, T, H, D, h0, Ht, causal, window, cap, p, key, b, h, scratch, rows,
                 dlp);
        return true;
    }
    atomic_fetch_add(&g_amx_tasks, 1);
    amx_configure(tiles, on);
    for (int64_t jb = 0; jb < nqb; jb++) {
        /* the query blocks [ib0, ib1) see the key block (under a window, up to its last key's last row) */
        const int64_t j0 = jb * AB, ib0 = causal ? jb : 0, ib1 = (att_rows_end(j0 + AB - 1, window, T) + AB - 1) / AB;
        for (int64_t ib = ib0; ib < ib1; ib++) {
            /* rows [i0, i0 + hi) of the block; its first key block is att_first(i0) / AB (the one that stores dq^T) */
            const int64_t i0 = ib * AB, hi = T - i0 < AB ? T - i0 : AB, jbf = att_first(i0, window) / AB;
            tiles->block(ka + j0 * Dp, Dp, qt + ib * kd * ASTEP, kd, true, true, sc, AB, false, NULL, 0);
            tiles->block(va + j0 * Dp, Dp, gt + ib * kd * ASTEP, kd, true, true, dp, AB, false, NULL, 0);
            for (int64_t r = 0; r < AB; r++) { /* key j's P^T and dS^T over the block's queries [lo, hz) */
                const int64_t j = j0 + r, lo = !causal || j <= i0 ? 0 : j - i0 < AB ? j - i0 : AB;
                const int64_t ez = att_rows_end(j, window, T) - i0, hz = j >= T ? 0 : ez < hi ? ez : hi;
                float *prw = sc + r * AB, *dr = ds + r * AB; /* P over the scores (read first) */
                if (cap > 0.0f && hz > lo) /* the scores as they come out of the tiles capped, before P */
                    dt__att_cap_row(vec, prw + lo, th + lo, hz - lo, scale, cap);
                amx_probs_t(vec, prw, cap > 0.0f ? th : NULL, dp + r * AB, lo, hz, scale, Lp + i0, Dip + i0, prw, dr);
                for (int64_t c = lo; c < hz && p > 0.0f; c++) { /* dropout on P */
                    const bool kp = dt__att_keep(key, p, gbh, T, i0 + c, j);
                    const float P = prw[c];
                    prw[c] = kp ? P * pscale : 0.0f;
                    dr[c] = P * ((kp ? dp[r * AB + c] * pscale : 0.0f) - Dip[i0 + c]) * scale *
                            (cap > 0.0f ? 1.0f - th[c] * th[c] : 1.0f);
                }
                amx_round32(vec, prw, pa + r * Tp + i0);
                amx_round32(vec, dr, sa + r * Tp + i0);
            }
            for (int64_t m = 0; m < AB / 2; m++) /* keys 2m, 2m + 1 of dS^T: row m of the B tiles */
                for (int tj = 0; tj < 2; tj++)
                    amx_pairs_f32(vec, ds + 2 * m * AB + 16 * tj, ds + (2 * m + 1) * AB + 16 * tj, 16,
                                  (uint32_t *)(void *)sb + tj * AT / 2 + m * 16);
            for (int64_t n = 0; n < kd; n++) /* dq^T += K^T dS^T (the first key block stores) */
                tiles->block(kT + n * nqb * ASTEP + j0, Tp, sb, 1, true, true, dqt + n * AB * ldq + i0, ldq, jb > jbf,
                             NULL, 0);
        }
        for (int64_t n = 0; n < kd; n++) { /* dV = P^T dO, dK = dS^T Q over the query blocks [ib0, ib1) */
            tiles->block(pa + ib0 * AB, Tp, gb + (n * nqb + ib0) * ASTEP, ib1 - ib0, true, true,
                         gw + j0 * 2 * Dp + Dp + n * AB, 2 * Dp, false, NULL, 0);
            tiles->block(sa + ib0 * AB, Tp, qb + (n * nqb + ib0) * ASTEP, ib1 - ib0, true, true,
                         gw + j0 * 2 * Dp + n * AB, 2 * Dp, false, NULL, 0);
        }
    }
    for (int64_t i = 0; i < T; i++) { /* rounded to bf16: the gradient of a bf16 input */
        uint16_t *dl = dlp ? dlp + (b * T + i) * C3 + h * D : NULL;
        for (int64_t d = 0; d < D; d++)
            wr[d] = dqt[d * ldq + i];
        amx_round_out(vec, wr, g ? g + i * C3 : NULL, dl ? dl : hb, D);
        for (int c = 0; c < 2; c++)
            amx_round_out(vec, gw + i * 2 * Dp + c * Dp, g ? g + i * C3 + (c + 1) * C : NULL, dl ? dl + (c + 1) * C : hb,
                          D);
    }
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512)
        _mm_sfence(); /* the streaming stores before the task's end */
#endif
    return true;
}

/* window: as fwd_run's */
static dt_status bwd_run(const char *fn, dt_dtype t, const void *qkv, const float *y, const float *lse,
                         const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                         bool causal, int64_t window, float cap, float p, dt_rng_key key, float *dqkv, void *dqkv_lp)
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
    if (!dqkv_lp || t == DT_F32) /* dqkv NULL: the gradient in t alone, into dqkv_lp */
        DT__CHECK_PTR(fn, dqkv, B * T * C3);
    window = window < T ? window : 0;
    int nt = dt__threads_for(B * T * (window ? window : T) * C * 2);
    bool nomem = false;
    const int vec = task_vec(t);
    const dt__amx_tiles *tiles = att_tiles(t, T);
    const size_t scratch = tiles ? bwd_scratch_amx(T, D) : bwd_scratch(t, T, D) * sizeof(float);
#pragma omp parallel num_threads(nt)
    {
        /* own: the thread's f32 rows where the rows run without dqkv (task_rows) */
        float *kt = dt_alloc(scratch), *own = NULL;
        bool on = false, ok = kt != NULL; /* on: this thread's tiles configured */
#pragma omp for schedule(dynamic, 1)
        for (int64_t bh = 0; bh < B * H; bh++) {
            if (ok && tiles) {
                ok = bwd_task_amx(tiles, &on, vec, qkv, y, lse, dy, T, H, D, h0, Ht, causal, window, cap, p, key,
                                  bh / H, bh % H, kt, dqkv, dqkv_lp, &own);
            } else if (ok) {
                float *rows = task_rows(dqkv, bh / H, T, C3, &own);
                if ((ok = rows != NULL))
                    bwd_task(vec, t, qkv, y, lse, dy, T, H, D, h0, Ht, causal, window, cap, p, key, bh / H, bh % H,
                             kt, rows, dqkv_lp);
            }
        }
        if (!ok) {
#pragma omp atomic write
            nomem = true;
        }
        if (on)
            tiles->release();
        dt_free(kt);
        dt_free(own);
    }
    if (nomem)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the key and value blocks or the gradient's rows",
                        fn);
    return DT_OK;
}

dt_status dt_k_attention_bwd_heads(const float *qkv, const float *y, const float *lse, const float *dy, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal, float p,
                                   dt_rng_key key, float *dqkv)
{
    return bwd_run("dt_k_attention_bwd", DT_F32, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, 0, 0.0f, p, key, dqkv,
                   NULL);
}

dt_status dt_k_attention_bwd_heads_lp(dt_dtype t, const void *qkv, const float *y, const float *lse,
                                      const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0,
                                      int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv, void *dqkv_lp)
{
    const char *fn = "dt_k_attention_bwd_lp";
    dt_status st = lp_dtype(fn, t);
    return st < 0 ? st : bwd_run(fn, t, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, 0, 0.0f, p, key, dqkv, dqkv_lp);
}

/* ---- the general entry points (attention_window.c) ------------------------------------------ */

dt_status dt__attention_ex_fwd(const char *fn, dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                               int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                               float *y, void *ylp, float *lse)
{
    return fwd_run(fn, t, qkv, B, T, H, D, h0, Ht, causal, window, cap, p, key, y, ylp, lse);
}

dt_status dt__attention_ex_bwd(const char *fn, dt_dtype t, const void *qkv, const float *y, const float *lse,
                               const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                               bool causal, int64_t window, float cap, float p, dt_rng_key key, float *dqkv,
                               void *dqkv_lp)
{
    return bwd_run(fn, t, qkv, y, lse, dy, B, T, H, D, h0, Ht, causal, window, cap, p, key, dqkv, dqkv_lp);
}
