/* src/kernels/attention_impl.h — the vectorised pieces of the blocked
 * attention kernels (attention.c, the whole sequence; attention_part.c, a
 * block of queries against a block of keys for context parallelism):
 * rows_acc (running sums along D kept in registers), block_t (a key or
 * value block transposed), row_dots (a query row's scores against it), the
 * backward's dk and dv of a key block (dkdv_keys), the softmax rows'
 * exponentials, and the tiles' key stride and the forward's task grouping.
 * Private to src/kernels. */
#ifndef DT_KERNELS_ATTENTION_IMPL_H
#define DT_KERNELS_ATTENTION_IMPL_H

#include "kernels_impl.h"

#include <string.h>

/* Whether attention dropout of probability p keeps element (bh, i, j) of a
 * T x T mask under key: dt_rng_uniform at ((bh T + i) T + j) >= p. The
 * whole-sequence kernels (attention.c) and the block kernel
 * (attention_part.c) draw it alike. */
static inline bool dt__att_keep(dt_rng_key key, float p, int64_t bh, int64_t T, int64_t i, int64_t j)
{
    return dt_rng_uniform(key, (uint64_t)((bh * T + i) * T + j)) >= p;
}

#define DT__ATT_BK 64 /* keys per block */

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
            _Pragma("GCC unroll 8") for (int k = 0; k < 64 / VW; k++)                                          \
                memcpy(&a[k], out + d0 + k * VW, sizeof a[k]);                                                 \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                const float ct = c[t * cs], *xr = x + t * xs + d0;                                             \
                _Pragma("GCC unroll 16") for (int k = 0; k < 64 / VW; k++)                                     \
                {                                                                                              \
                    VT v;                                                                                      \
                    memcpy(&v, xr + k * VW, sizeof v);                                                         \
                    a[k] += ct * v;                                                                            \
                }                                                                                              \
            }                                                                                                  \
            _Pragma("GCC unroll 8") for (int k = 0; k < 64 / VW; k++)                                          \
                memcpy(out + d0 + k * VW, &a[k], sizeof a[k]);                                                 \
        }                                                                                                      \
        for (; d0 + 32 <= D; d0 += 32) {                                                                       \
            VT a[32 / VW];                                                                                     \
            _Pragma("GCC unroll 8") for (int k = 0; k < 32 / VW; k++)                                          \
                memcpy(&a[k], out + d0 + k * VW, sizeof a[k]);                                                 \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                const float ct = c[t * cs], *xr = x + t * xs + d0;                                             \
                _Pragma("GCC unroll 16") for (int k = 0; k < 32 / VW; k++)                                     \
                {                                                                                              \
                    VT v;                                                                                      \
                    memcpy(&v, xr + k * VW, sizeof v);                                                         \
                    a[k] += ct * v;                                                                            \
                }                                                                                              \
            }                                                                                                  \
            _Pragma("GCC unroll 8") for (int k = 0; k < 32 / VW; k++)                                          \
                memcpy(out + d0 + k * VW, &a[k], sizeof a[k]);                                                 \
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

/* rows_acc for 4 outputs that share their rows of x: out_k = out + k os
 * takes the terms c[t cs + k] x_t (k < 4), each element's sum the same
 * sequence of rounded products and adds as rows_acc's (so the bits of four
 * rows_acc calls), 2 vectors of columns at a time with the 4 x 2 running
 * sums in registers: each vector of x is loaded once for the four, where
 * four calls load it four times (the keys' dk and dv, whose x rows, the
 * head's q or dy, do not stay in L1). The last D mod 2 VW columns take
 * rows_acc. */
#define ROWS_ACC4(name, one, attr, VT, VW)                                                                      \
    attr static inline void name(float *restrict out, int64_t os, const float *restrict c, int64_t cs,        \
                                 const float *restrict x, int64_t xs, int64_t n, int64_t D)                   \
    {                                                                                                          \
        int64_t d0 = 0;                                                                                        \
        for (; d0 + 2 * VW <= D; d0 += 2 * VW) {                                                               \
            VT a[4][2];                                                                                        \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                                \
            {                                                                                                  \
                memcpy(&a[k][0], out + k * os + d0, sizeof a[k][0]);                                           \
                memcpy(&a[k][1], out + k * os + d0 + VW, sizeof a[k][1]);                                      \
            }                                                                                                  \
            for (int64_t t = 0; t < n; t++) {                                                                  \
                VT v0, v1;                                                                                     \
                memcpy(&v0, x + t * xs + d0, sizeof v0);                                                       \
                memcpy(&v1, x + t * xs + d0 + VW, sizeof v1);                                                  \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                            \
                {                                                                                              \
                    const float ct = c[t * cs + k];                                                            \
                    a[k][0] += ct * v0;                                                                        \
                    a[k][1] += ct * v1;                                                                        \
                }                                                                                              \
            }                                                                                                  \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                                                \
            {                                                                                                  \
                memcpy(out + k * os + d0, &a[k][0], sizeof a[k][0]);                                           \
                memcpy(out + k * os + d0 + VW, &a[k][1], sizeof a[k][1]);                                      \
            }                                                                                                  \
        }                                                                                                      \
        if (d0 < D)                                                                                            \
            for (int k = 0; k < 4; k++)                                                                        \
                one(out + k * os + d0, c + k, cs, x + d0, xs, n, D - d0);                                      \
    }

typedef float v4f __attribute__((vector_size(16)));
ROWS_ACC(rows_acc_base, , v4f, 4)
ROWS_ACC4(rows_acc4_base, rows_acc_base, , v4f, 4)
#if DT__X86_VEC
typedef float v8f __attribute__((vector_size(32)));
ROWS_ACC(rows_acc_avx2, DT__AVX2, v8f, 8)
ROWS_ACC4(rows_acc4_avx2, rows_acc_avx2, DT__AVX2, v8f, 8)
typedef float v16f __attribute__((vector_size(64)));

/* rows_acc on 16 lanes (zmm): 128 columns at a time in 8 registers, then
 * 64, 32, 16, one 8-lane step and the scalar tail. Each element's sum is the
 * same sequence of rounded products and adds as in the other versions. */
DT__AVX512 static inline void rows_acc_avx512(float *restrict out, const float *restrict c, int64_t cs,
                                              const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
    int64_t d0 = 0;
#define RA16_BLOCK(W)                                                                                          \
    for (; d0 + (W) <= D; d0 += (W)) {                                                                         \
        v16f a[(W) / 16];                                                                                      \
        _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++)                                             \
            memcpy(&a[k], out + d0 + k * 16, sizeof a[k]);                                                     \
        for (int64_t t = 0; t < n; t++) {                                                                      \
            const float ct = c[t * cs], *xr = x + t * xs + d0;                                                 \
            _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++)                                         \
            {                                                                                                  \
                v16f v;                                                                                        \
                memcpy(&v, xr + k * 16, sizeof v);                                                             \
                a[k] += ct * v;                                                                                \
            }                                                                                                  \
        }                                                                                                      \
        _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++)                                             \
            memcpy(out + d0 + k * 16, &a[k], sizeof a[k]);                                                     \
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
ROWS_ACC4(rows_acc4_avx512, rows_acc_avx512, DT__AVX512, v16f, 16)

/* rows_acc with fused multiply-adds (one rounding a term instead of two)
 * on 16 lanes: 128, 64, 32 and 16 columns at a time, the last D mod 16
 * under a mask. Not the bits of the others: the attention over a bf16/f16
 * qkv runs it on the AVX-512 paths (DT__ATT_FAST), the f32 one never. */
DT__AVX512 static inline void rows_acc_fma16(float *restrict out, const float *restrict c, int64_t cs,
                                             const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
    int64_t d0 = 0;
#define RAF_BLOCK(W)                                                                                           \
    for (; d0 + (W) <= D; d0 += (W)) {                                                                         \
        __m512 a[(W) / 16];                                                                                    \
        _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++) a[k] = _mm512_loadu_ps(out + d0 + 16 * k);  \
        for (int64_t t = 0; t < n; t++) {                                                                      \
            const __m512 ct = _mm512_set1_ps(c[t * cs]);                                                       \
            const float *xr = x + t * xs + d0;                                                                 \
            _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++) a[k] =                                  \
                _mm512_fmadd_ps(ct, _mm512_loadu_ps(xr + 16 * k), a[k]);                                       \
        }                                                                                                      \
        _Pragma("GCC unroll 8") for (int k = 0; k < (W) / 16; k++) _mm512_storeu_ps(out + d0 + 16 * k, a[k]);  \
    }
    RAF_BLOCK(128)
    RAF_BLOCK(64)
    RAF_BLOCK(32)
    RAF_BLOCK(16)
#undef RAF_BLOCK
    if (d0 < D) {
        const __mmask16 m = (__mmask16)((1u << (D - d0)) - 1u);
        __m512 a = _mm512_maskz_loadu_ps(m, out + d0);
        for (int64_t t = 0; t < n; t++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(c[t * cs]), _mm512_maskz_loadu_ps(m, x + t * xs + d0), a);
        _mm512_mask_storeu_ps(out + d0, m, a);
    }
}
#endif

/* The row-loop levels of the attention over a bf16/f16 qkv on the AVX-512
 * paths: rows_acc_fma16 and the 16-lane softmax rows of attention.c (with
 * dt__expf16), within a stated bound of the f32 arithmetic rather than its
 * bits. DT__ATT_BF16 (a bf16 qkv on the avx512_bf16 path) also takes the
 * scores q . k and dy . v from the bf16 operands themselves by vdpbf16ps
 * (row_dots_bf16). Above DT__VEC_AVX512, so every "vec >= DT__VEC_AVX512"
 * test (the bf16 row loops) holds for them too. */
#define DT__ATT_FAST 3
#define DT__ATT_BF16 4

#if DT__X86_VEC
#define DT__AVX512BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

/* s[jj] = sum_d q[d] k_jj[d] for jj < nk (<= DT__ATT_BK) from bf16 operands
 * in pairs: qp[d2] holds q[2 d2] (low half) and q[2 d2 + 1], and kp[d2 ldk
 * + jj] the same pair of key jj (a zero high half past an odd D). vdpbf16ps
 * multiplies exactly and adds in f32 (bf16 subnormals read as 0), two
 * chains of 16 keys over the even and the odd pairs, then their sum. */
DT__AVX512BF16 static inline void row_dots_bf16(const uint32_t *restrict qp, const uint32_t *restrict kp, int64_t ldk,
                                                int64_t D2, int64_t nk, float *restrict s)
{
    __m512 a[4], b[4];
    __mmask16 m[4];
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
    {
        int64_t r = nk - 16 * c;
        m[c] = r >= 16 ? (__mmask16)0xffff : r > 0 ? (__mmask16)((1u << r) - 1u) : (__mmask16)0;
        a[c] = b[c] = _mm512_setzero_ps();
    }
    int64_t d2 = 0;
    for (; d2 + 2 <= D2; d2 += 2) {
        const __m512bh q0 = (__m512bh)_mm512_set1_epi32((int)qp[d2]), q1 = (__m512bh)_mm512_set1_epi32((int)qp[d2 + 1]);
        const uint32_t *k0 = kp + d2 * ldk, *k1 = k0 + ldk;
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) if (m[c])
        {
            a[c] = _mm512_dpbf16_ps(a[c], q0, (__m512bh)_mm512_maskz_loadu_epi32(m[c], k0 + 16 * c));
            b[c] = _mm512_dpbf16_ps(b[c], q1, (__m512bh)_mm512_maskz_loadu_epi32(m[c], k1 + 16 * c));
        }
    }
    if (d2 < D2) {
        const __m512bh q0 = (__m512bh)_mm512_set1_epi32((int)qp[d2]);
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) if (m[c]) a[c] =
            _mm512_dpbf16_ps(a[c], q0, (__m512bh)_mm512_maskz_loadu_epi32(m[c], kp + d2 * ldk + 16 * c));
    }
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(s + 16 * c, m[c],
                                                                              _mm512_add_ps(a[c], b[c]));
}

/* The lanes [j, n) of a 16-lane step (none when j >= n). */
static inline __mmask16 att_lanes(int64_t j, int64_t n)
{
    return n - j >= 16 ? (__mmask16)0xffff : n > j ? (__mmask16)((1u << (n - j)) - 1u) : (__mmask16)0;
}

/* The accumulations of the avx512_bf16 path (DT__ATT_BF16) on vdpbf16ps:
 *   out[d] += sum over pairs t < n2 of lo(c_t) lo(x_t[d]) + hi(c_t) hi(x_t[d])
 * with c_t = c[t cs] a pair of bf16 coefficients and x_t = x + t xs a row of
 * D pairs (two bf16 rows interleaved: pair_rows). Each pair's products are
 * exact and added in f32 (bf16 subnormals read as 0); the sums run in a
 * fixed order (64 columns at a time: the even and the odd pairs in two
 * chains, then their sum; 16 at a time in t order; the last D mod 16 under
 * a mask). lo0: the low halves of x_0 are ignored, hi_last: the high
 * halves of x_(n2-1) (a row the mask hides, whose zero coefficient must not
 * meet an infinite or NaN value: 0 x inf is NaN). */
DT__AVX512BF16 static inline void rows_acc_bf16(float *restrict out, const uint32_t *restrict c, int64_t cs,
                                                const uint32_t *restrict x, int64_t xs, int64_t n2, int64_t D,
                                                bool lo0, bool hi_last)
{
    if (n2 <= 0)
        return;
    const __m512i all = _mm512_set1_epi32(-1);
    __m512i m0 = lo0 ? _mm512_set1_epi32((int)0xffff0000u) : all, m1 = hi_last ? _mm512_set1_epi32(0xffff) : all;
    int64_t ta = 0, tz = n2; /* the pairs without a mask */
    if (lo0 || (hi_last && n2 == 1)) {
        m0 = n2 == 1 ? _mm512_and_si512(m0, m1) : m0;
        ta = 1;
    }
    if (hi_last && tz > ta)
        tz--;
    else
        hi_last = false; /* done with the first pair, or none */
    int64_t d0 = 0;
#define RAB_STEP(t, W, M, MASKED)                                                                                \
    do {                                                                                                       \
        const __m512bh cb = (__m512bh)_mm512_set1_epi32((int)c[(t) * cs]);                                      \
        const uint32_t *xr = x + (t) * xs + d0;                                                                \
        _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++)                                             \
        {                                                                                                      \
            __m512i v = _mm512_maskz_loadu_epi32(M, xr + 16 * k);                                              \
            a[k] = _mm512_dpbf16_ps(a[k], cb, (__m512bh)(MASKED ? _mm512_and_si512(v, mk) : v));                \
        }                                                                                                      \
    } while (0)
#define RAB_BLOCK(W, M, COND)                                                                                    \
    for (; COND; d0 += (W)) {                                                                                  \
        __m512 a[(W) / 16];                                                                                    \
        _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++) a[k] = _mm512_maskz_loadu_ps(M, out + d0 + 16 * k); \
        __m512i mk = m0;                                                                                       \
        if (ta)                                                                                                \
            RAB_STEP(0, W, M, 1);                                                                              \
        int64_t t = ta;                                                                                        \
        if ((W) == 64 && tz - ta >= 4) { /* two chains a register: even and odd pairs, then their sum */     \
            __m512 b[(W) / 16];                                                                                \
            _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++) b[k] = _mm512_setzero_ps();             \
            for (; t + 2 <= tz; t += 2) {                                                                      \
                const __m512bh c0 = (__m512bh)_mm512_set1_epi32((int)c[t * cs]);                               \
                const __m512bh c1 = (__m512bh)_mm512_set1_epi32((int)c[(t + 1) * cs]);                         \
                const uint32_t *x0 = x + t * xs + d0, *x1 = x0 + xs;                                           \
                _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++)                                     \
                {                                                                                              \
                    a[k] = _mm512_dpbf16_ps(a[k], c0, (__m512bh)_mm512_loadu_si512(x0 + 16 * k));              \
                    b[k] = _mm512_dpbf16_ps(b[k], c1, (__m512bh)_mm512_loadu_si512(x1 + 16 * k));              \
                }                                                                                              \
            }                                                                                                  \
            _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++) a[k] = _mm512_add_ps(a[k], b[k]);      \
        }                                                                                                      \
        for (; t < tz; t++)                                                                                    \
            RAB_STEP(t, W, M, 0);                                                                              \
        mk = m1;                                                                                               \
        if (hi_last)                                                                                           \
            RAB_STEP(tz, W, M, 1);                                                                             \
        _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++) _mm512_mask_storeu_ps(out + d0 + 16 * k, M, a[k]); \
    }
    RAB_BLOCK(64, (__mmask16)0xffff, d0 + 64 <= D)
    RAB_BLOCK(16, (__mmask16)0xffff, d0 + 16 <= D)
    const __mmask16 mt = att_lanes(d0, D);
    RAB_BLOCK(16, mt, d0 < D)
#undef RAB_BLOCK
#undef RAB_STEP
}

/* rows_acc_bf16 for two outputs over the same rows x: out0 with the
 * coefficients c0[t cs], out1 with c1[t cs], each x_t loaded once for
 * both; hi1: the low halves of x_0 are ignored for out1 (its lo0; out0 has
 * none). Each sum in t order (so out0 gets the bits rows_acc_bf16 would
 * give it with chains of 16 columns). */
DT__AVX512BF16 static inline void rows_acc_bf16_x2(float *restrict out0, float *restrict out1,
                                                   const uint32_t *restrict c0, const uint32_t *restrict c1,
                                                   int64_t cs, const uint32_t *restrict x, int64_t xs, int64_t n2,
                                                   int64_t D, bool lo1)
{
    if (n2 <= 0)
        return;
    const __m512i m0 = lo1 ? _mm512_set1_epi32((int)0xffff0000u) : _mm512_set1_epi32(-1);
    int64_t d0 = 0;
#define RAB2_BLOCK(W, M, COND)                                                                                   \
    for (; COND; d0 += (W)) {                                                                                  \
        __m512 a[(W) / 16], b[(W) / 16];                                                                       \
        _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++)                                             \
        {                                                                                                      \
            a[k] = _mm512_maskz_loadu_ps(M, out0 + d0 + 16 * k);                                               \
            b[k] = _mm512_maskz_loadu_ps(M, out1 + d0 + 16 * k);                                               \
        }                                                                                                      \
        for (int64_t t = 0; t < n2; t++) {                                                                     \
            const __m512bh ca = (__m512bh)_mm512_set1_epi32((int)c0[t * cs]);                                   \
            const __m512bh cb = (__m512bh)_mm512_set1_epi32((int)c1[t * cs]);                                   \
            const __m512i mk = t ? _mm512_set1_epi32(-1) : m0;                                                 \
            const uint32_t *xr = x + t * xs + d0;                                                              \
            _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++)                                         \
            {                                                                                                  \
                __m512i v = _mm512_maskz_loadu_epi32(M, xr + 16 * k);                                          \
                a[k] = _mm512_dpbf16_ps(a[k], ca, (__m512bh)v);                                                \
                b[k] = _mm512_dpbf16_ps(b[k], cb, (__m512bh)_mm512_and_si512(v, mk));                          \
            }                                                                                                  \
        }                                                                                                      \
        _Pragma("GCC unroll 4") for (int k = 0; k < (W) / 16; k++)                                             \
        {                                                                                                      \
            _mm512_mask_storeu_ps(out0 + d0 + 16 * k, M, a[k]);                                                \
            _mm512_mask_storeu_ps(out1 + d0 + 16 * k, M, b[k]);                                                \
        }                                                                                                      \
    }
    RAB2_BLOCK(64, (__mmask16)0xffff, d0 + 64 <= D)
    RAB2_BLOCK(16, (__mmask16)0xffff, d0 + 16 <= D)
    const __mmask16 mt = att_lanes(d0, D);
    RAB2_BLOCK(16, mt, d0 < D)
#undef RAB2_BLOCK
}

/* dst[d] = a[d] | b[d] << 16 for d < D: rows a and b of bf16 as the pairs
 * rows_acc_bf16 reads (b NULL: zero high halves). */
DT__AVX512BF16 static inline void pair_rows(const uint16_t *restrict a, const uint16_t *restrict b, int64_t D,
                                            uint32_t *restrict dst)
{
    for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 k = att_lanes(d, D);
        __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + d));
        __m512i hi = b ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b + d)), 16)
                       : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(dst + d, k, _mm512_or_si512(lo, hi));
    }
}

/* dst[0, (n + 1) / 2) = s[0, n) rounded to bf16 (vcvtne2ps2bf16: to
 * nearest even) as pairs along s, a zero high half past an odd n. */
DT__AVX512BF16 static inline void bf16_pairs_f32(const float *restrict s, int64_t n, uint32_t *restrict dst)
{
    for (int64_t j = 0; j < n; j += 32) {
        const __mmask16 k0 = att_lanes(j, n), k1 = att_lanes(j + 16, n);
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(k1, s + j + 16), _mm512_maskz_loadu_ps(k0, s + j));
        _mm512_mask_storeu_epi32(dst + j / 2, att_lanes(j / 2, (n + 1) / 2), (__m512i)h);
    }
}

/* dst[j] = bf16(a[j]) | bf16(b[j]) << 16 for j < n: rows a and b of f32
 * rounded to bf16 (to nearest even) and paired across the rows (b NULL:
 * zero high halves). */
DT__AVX512BF16 static inline void bf16_pairs_2rows(const float *restrict a, const float *restrict b, int64_t n,
                                                   uint32_t *restrict dst)
{
    static const uint16_t ix[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i idx = _mm512_loadu_si512(ix);
    for (int64_t j = 0; j < n; j += 16) {
        const __mmask16 k = att_lanes(j, n);
        __m512 hb = b ? _mm512_maskz_loadu_ps(k, b + j) : _mm512_setzero_ps();
        __m512bh h = _mm512_cvtne2ps_pbh(hb, _mm512_maskz_loadu_ps(k, a + j));
        _mm512_mask_storeu_epi32(dst + j, k, _mm512_permutexvar_epi16(idx, (__m512i)h));
    }
}
#endif

/* The pairs of n bf16 values at src as row_dots_bf16 reads them: dst[0,
 * (n + 1) / 2) (little-endian: the bytes themselves, a zero high half past
 * an odd n). */
static inline void bf16_pairs(const uint16_t *restrict src, uint32_t *restrict dst, int64_t n)
{
    dst[(n + 1) / 2 - 1] = 0;
    memcpy(dst, src, (size_t)n * sizeof *src);
}

/* Keys (or values) [0, nk) of bf16 rows at src (stride lds) as pairs
 * transposed: dst[d2 ldd + j] = the pair d2 of row j, for d2 < (D + 1) / 2;
 * row is a (D + 1) / 2 words' scratch. */
static inline void bf16_pairs_t(const uint16_t *restrict src, int64_t lds, int64_t nk, int64_t D,
                                uint32_t *restrict dst, int64_t ldd, uint32_t *restrict row)
{
    const int64_t D2 = (D + 1) / 2;
    for (int64_t j = 0; j < nk; j++) {
        bf16_pairs(src + j * lds, row, D);
        for (int64_t d2 = 0; d2 < D2; d2++)
            dst[d2 * ldd + j] = row[d2];
    }
}

/* The widest row loop vec (dt__vec_level(), or DT__ATT_FAST) allows:
 * rows_acc_fma16, rows_acc_avx512, rows_acc_avx2 or the baseline; the same
 * bits on every one but the first. */
static inline void rows_acc(int vec, float *restrict out, const float *restrict c, int64_t cs,
                            const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
#if DT__X86_VEC
    if (vec >= DT__ATT_FAST) {
        rows_acc_fma16(out, c, cs, x, xs, n, D);
        return;
    }
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

/* rows_acc for the 4 outputs out + k os with the terms c[t cs + k] x_t
 * (ROWS_ACC4): the bits of rows_acc(vec, out + k os, c + k, cs, x, xs, n,
 * D) for k < 4, whichever vec (DT__ATT_FAST: four such calls). */
static inline void rows_acc4(int vec, float *restrict out, int64_t os, const float *restrict c, int64_t cs,
                             const float *restrict x, int64_t xs, int64_t n, int64_t D)
{
#if DT__X86_VEC
    if (vec >= DT__ATT_FAST) {
        for (int k = 0; k < 4; k++)
            rows_acc(vec, out + k * os, c + k, cs, x, xs, n, D);
        return;
    }
    if (vec >= DT__VEC_AVX512) {
        rows_acc4_avx512(out, os, c, cs, x, xs, n, D);
        return;
    }
    if (vec) {
        rows_acc4_avx2(out, os, c, cs, x, xs, n, D);
        return;
    }
#endif
    (void)vec;
    rows_acc4_base(out, os, c, cs, x, xs, n, D);
}

/* a . b summed in index order (the same bits on every code path). */
static inline float dot_seq(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t d = 0; d < n; d++)
        s += a[d] * b[d];
    return s;
}

/* The backward's dk_j and dv_j for the keys j in [j0, j1) of a block: each
 * summed over the rows i < nrows that see key j, in i order, from the
 * block's dS and P (dsm, pdm: [rows from i0][DT__ATT_BK]) and the rows of q
 * and dy (qr, gr; row strides ldq, ldg) into dk + j lddk and dv + j lddv.
 * Key j's first row is i0, or with the mask max(i0, j + shift) (shift: the
 * keys' first position less the rows'), and with a window (> 0) its last
 * j + shift + window - 1. Four keys at a time (rows_acc4, the bits of one
 * key at a time) over the rows all four see, the rows before those and
 * after them one key at a time; the block's last keys one at a time. */
static inline void dkdv_keys(int vec, float *dk, int64_t lddk, float *dv, int64_t lddv, const float *dsm,
                             const float *pdm, const float *qr, int64_t ldq, const float *gr, int64_t ldg,
                             int64_t nrows, int64_t i0, int64_t j0, int64_t j1, bool causal, int64_t shift,
                             int64_t window, int64_t D)
{
#define DKDV_FIRST(j) (causal && (j) + shift > i0 ? (j) + shift : i0)
#define DKDV_END(j) (window > 0 && (j) + shift + window < nrows ? (j) + shift + window : nrows)
#define DKDV_ONE(c, a, z)                                                                                          \
    do {                                                                                                       \
        const int64_t c0 = ((a) - i0) * DT__ATT_BK + j + (c) - j0;                                             \
        rows_acc(vec, dk + (j + (c)) * lddk, dsm + c0, DT__ATT_BK, qr + (a) * ldq, ldq, (z) - (a), D);         \
        rows_acc(vec, dv + (j + (c)) * lddv, pdm + c0, DT__ATT_BK, gr + (a) * ldg, ldg, (z) - (a), D);         \
    } while (0)
    for (int64_t j = j0, nk; j < j1; j += nk) {
        nk = j + 4 <= j1 ? 4 : 1;
        const int64_t ie = DKDV_END(j); /* the four keys' rows end at ie or later */
        int64_t ib = nk == 1 ? nrows : DKDV_FIRST(j + 3); /* the rows [ib, ie) see all four keys */
        ib = ib < ie ? ib : ie;
        for (int64_t c = 0; c < nk; c++) {
            const int64_t ia = DKDV_FIRST(j + c);
            if (ib > ia)
                DKDV_ONE(c, ia, ib);
        }
        if (ib < ie) {
            const int64_t c0 = (ib - i0) * DT__ATT_BK + j - j0;
            rows_acc4(vec, dk + j * lddk, lddk, dsm + c0, DT__ATT_BK, qr + ib * ldq, ldq, ie - ib, D);
            rows_acc4(vec, dv + j * lddv, lddv, pdm + c0, DT__ATT_BK, gr + ib * ldg, ldg, ie - ib, D);
        }
        for (int64_t c = 0; c < nk && window > 0; c++) { /* the rows after ie that see key j + c */
            const int64_t ia = DKDV_FIRST(j + c) > ie ? DKDV_FIRST(j + c) : ie, iz = DKDV_END(j + c);
            if (iz > ia)
                DKDV_ONE(c, ia, iz);
        }
    }
#undef DKDV_ONE
#undef DKDV_END
#undef DKDV_FIRST
}

/* The exponentials of the f32 softmax rows (the f32 paths, and bf16/f16
 * widened where no 16-lane path runs) by dt__expf (inline; within 2
 * ulp of exp), 8 lanes at a time where vec allows (dt__expf8: lane for lane
 * the same bits), so every path gives the same bits. */
#if DT__X86_VEC
DT__AVX2 static inline int64_t att_exp8(float *s, int64_t n, float mx) /* the whole 8-lane steps; returns their end */
{
    const __m256 m = _mm256_set1_ps(mx);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(s + j, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m)));
    return j;
}

DT__AVX2 static inline int64_t att_probs8(const float *sc, int64_t n, float scale, float L, float *P)
{
    const __m256 a = _mm256_set1_ps(scale), l = _mm256_set1_ps(L);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(P + j, dt__expf8(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(sc + j), a), l)));
    return j;
}
#endif

/* s[j] = e^(s[j] - mx) for j < n; returns their sum, added in j order. */
static inline float att_exp_sum(int vec, float *s, int64_t n, float mx)
{
    int64_t j = 0;
#if DT__X86_VEC
    if (vec)
        j = att_exp8(s, n, mx);
#endif
    (void)vec;
    for (; j < n; j++)
        s[j] = dt__expf(s[j] - mx);
    float sum = 0.0f;
    for (j = 0; j < n; j++)
        sum += s[j];
    return sum;
}

/* P[j] = e^(sc[j] scale - L) for j < n: the backward's probabilities from
 * the scores and the row's log-sum-exp. */
static inline void att_probs(int vec, const float *sc, int64_t n, float scale, float L, float *P)
{
    int64_t j = 0;
#if DT__X86_VEC
    if (vec)
        j = att_probs8(sc, n, scale, L, P);
#endif
    (void)vec;
    for (; j < n; j++)
        P[j] = dt__expf(sc[j] * scale - L);
}

/* The row stride of a task's transposed keys ([D][stride]) for n keys: n
 * rounded up to 16, plus 16 when that is an even number of cache lines, so
 * a block of keys read down its D rows spreads over all of L1's sets (rows a
 * multiple of 128 bytes apart share a fraction of them: at 1 KiB, 64 rows of
 * 4 lines fall on 16 sets of 8 ways and evict each other). At most n + 31. */
static inline int64_t dt__att_key_stride(int64_t n)
{
    int64_t ld = (n + 15) & ~(int64_t)15;
    return (ld / 16) % 2 == 0 ? ld + 16 : ld;
}

/* Query blocks a forward task takes, of nqb blocks a head over nheads heads
 * on nt threads: as many as keep about 4 tasks a thread, so a head's keys
 * and values are copied into a task's tiles once or a few times, not once
 * a block. The grouping changes no result. */
static inline int64_t dt__att_group(int nt, int64_t nheads, int64_t nqb)
{
    const int64_t want = 4 * (int64_t)nt, per = (want + nheads - 1) / nheads; /* tasks a head */
    if (per <= 1)
        return nqb;
    return per >= nqb ? 1 : (nqb + per - 1) / per;
}

/* xt[d * DT__ATT_BK + jj] = row jj of the rows at x (ld floats apart), columns [0, D), for jj < nk: one key (or
 * value) block transposed, so the products with it run along contiguous keys. */
static inline void block_t(const float *restrict x, int64_t ld, int64_t nk, int64_t D, float *restrict xt)
{
    for (int64_t jj = 0; jj < nk; jj++)
        for (int64_t d = 0; d < D; d++)
            xt[d * DT__ATT_BK + jj] = x[jj * ld + d];
    for (int64_t jj = nk; jj < ((nk + 7) & ~(int64_t)7); jj++) /* zero columns up to a multiple of 8 (row_dots) */
        for (int64_t d = 0; d < D; d++)
            xt[d * DT__ATT_BK + jj] = 0.0f;
}

/* s[jj] = sum_d q[d] xt[d ldxt + jj] for jj < nk, each sum in d order, vectorised along the keys:
 * computed for nk rounded up to a multiple of 8 (the caller zeroes the columns past the keys, as
 * block_t does; s has DT__ATT_BK entries), so no column takes the scalar path. xt: a block_t copy
 * (ldxt = DT__ATT_BK) or a view into a whole head's keys transposed. */
static inline void row_dots(int vec, const float *restrict q, const float *restrict xt, int64_t ldxt, int64_t D,
                            int64_t nk, float *restrict s)
{
    int64_t w = (nk + 7) & ~(int64_t)7;
    for (int64_t jj = 0; jj < w; jj++)
        s[jj] = 0.0f;
    rows_acc(vec, s, q, 1, xt, ldxt, D, w);
}

#endif
