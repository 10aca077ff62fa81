/* src/kernels/kernels_impl.h — internals shared by the kernel files
 * (argument checks, thread count, the oneDNN engine and primitive cache). */
#ifndef DT_KERNELS_IMPL_H
#define DT_KERNELS_IMPL_H

#include "dtrain/kernels.h"

#include <dnnl.h>

/* Argument checks: each returns from the calling function with an error. */
#define DT__CHECK_N(fn, n)                                                                   \
    do {                                                                                     \
        if ((n) < 0)                                                                         \
            return dt_error(DT_ERR_INVALID_ARG, "%s: %s = %lld is negative", fn, #n,         \
                            (long long)(n));                                                 \
    } while (0)
#define DT__CHECK_PTR(fn, p, n)                                                              \
    do {                                                                                     \
        if (!(p) && (n) > 0)                                                                 \
            return dt_error(DT_ERR_NULL, "%s: %s is NULL with %lld elements", fn, #p,        \
                            (long long)(n));                                                 \
    } while (0)

/* Row kernels cloned for x86-64-v3 (AVX2 with FMA, what the avx2 path
 * requires) and the baseline, picked at load time by an ifunc resolver (gcc
 * only); the v3 clone inlines the 8-lane helpers below (target("avx2,fma"))
 * and dt__expf's fused multiply-adds. Not under ThreadSanitizer: the
 * resolver runs during relocation, before TSan's runtime is up, and its
 * instrumented entry crashes every program at start. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define DT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DT_CLONES
#endif

/* exp(x) in float, inline: Cody-Waite reduction x = n ln2 + r, |r| <=
 * ln2 / 2, Cephes' degree-6 polynomial for e^r, 2^n from exponent bits;
 * n's argument, the reduction's steps and every step of the polynomial one
 * fused multiply-add each (fmaf: one instruction where the code is
 * compiled with FMA, as the vector forms and the x86-64-v3 clones are,
 * else libm's exact fmaf, so the same bits everywhere). Within 2 ulp of
 * exp over [-87, 88.37] (tests/kernels/test_vec_paths); below -87 it
 * returns 0 (the true value is under 1.7e-38), +inf from 88.38 (2^n
 * overflows) and above 88.7, NaN for NaN. The fused form runs the GELU
 * rows on 2048 x 3072 bf16 about a third faster forward and a fifth
 * backward than separate multiplies and adds did (Xeon with AMX, 2
 * threads). GCC 12 at -O2 does not vectorise loops over it (floorf and the
 * selects keep control flow); dt__expf8 below is its 8-lane form, which
 * the GELU and the cross-entropy rows use. */
static inline float dt__expf(float x)
{
    /* NaN fails both tests and takes -87 (a finite input for the exponent
     * bits below: converting NaN to int is undefined), fixed at the end */
    float xc = x > -87.0f ? x : -87.0f;
    xc = xc > 88.7f ? 88.7f : xc;
    float n = __builtin_floorf(__builtin_fmaf(xc, 1.44269504088896341f, 0.5f));
    float r = __builtin_fmaf(-n, 0.693359375f, xc);
    r = __builtin_fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = __builtin_fmaf(p, r, 1.3981999507e-3f);
    p = __builtin_fmaf(p, r, 8.3334519073e-3f);
    p = __builtin_fmaf(p, r, 4.1665795894e-2f);
    p = __builtin_fmaf(p, r, 1.6666665459e-1f);
    p = __builtin_fmaf(p, r, 5.0000001201e-1f);
    p = __builtin_fmaf(p * r, r, r) + 1.0f;
    union {
        int32_t i;
        float f;
    } s = {.i = ((int32_t)n + 127) << 23};
    float y = p * s.f;
    y = x < -87.0f ? 0.0f : y;
    y = x > 88.7f ? __builtin_inff() : y;
    return x != x ? x : y;
}

/* A hint to bring the line DT__PF_AHEAD bytes past p into L1, for row
 * kernels that stream a large operand with much arithmetic per element
 * (exponentials): on the Xeon VM with AMX the hardware prefetcher alone
 * left the cross-entropy's gradient rows waiting on memory (one thread,
 * 2048 x 50304 bf16 logits: 44-49 cycles per 16 lanes, 30-32 with the
 * hint, 28-32 with the rows in L1). A prefetch past the end of an array
 * does not fault and changes no result. */
#define DT__PF_AHEAD 2048
static inline void dt__prefetch_ahead(const void *p) { __builtin_prefetch((const char *)p + DT__PF_AHEAD); }

/* dt__expf on 8 lanes (AVX2 and FMA): the same operations in the same
 * order, so every lane is bit-identical to dt__expf of that element; when
 * every lane lies inside the clamps the selects are skipped (they would
 * change nothing). GCC does not vectorise loops over the scalar form (see
 * above); kernels call this from DT__AVX2 code when dt__vec_avx2() says the
 * CPU has it (DT_MAX_CPU_ISA=scalar, or dt_k_set_isa(DT_K_ISA_SCALAR),
 * keeps them on the scalar loops). */
#if defined(__x86_64__) && defined(__GNUC__)
#define DT__X86_VEC 1
#include <immintrin.h>
/* The AVX2 row loops (8 lanes): AVX2 and FMA, as the avx2 path of
 * dt_k_get_isa() requires. A fused multiply-add is one only where it is
 * written (_mm256_fmadd_ps, fmaf): the build never contracts a multiply and
 * an add (ISO C: -ffp-contract=off). */
#define DT__AVX2 __attribute__((target("avx2,fma")))
DT__AVX2 static inline __m256 dt__expf8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.7f);
    __m256 xc = _mm256_max_ps(_mm256_min_ps(x, hi), lo); /* NaN lanes: fixed at the end */
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(x, xc, _CMP_NEQ_UQ)) == 0, 1))
        return y; /* every lane inside the clamps: the selects below change nothing */
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* The AVX-512 row loops (16 lanes): AVX-512F, BW and VL (and FMA), as the
 * avx512 and avx512_bf16 paths of dt_k_get_isa() require. No FMA is
 * contracted from separate multiplies and adds (the build is ISO C:
 * -ffp-contract=off), so a 16-lane loop written with the scalar loop's
 * operations in its order (fmaf as _mm512_fmadd_ps) gives the scalar
 * loop's bits, as the 8-lane ones do. */
#define DT__AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl")))

/* Whether any of the n values at p (es bytes each, 2 or 4) has every bit
 * of e set (its dtype's exponent mask: inf or NaN), 64 bytes a step, the
 * tail masked. Unthreaded and inline, for short runs (a row, a tail);
 * dt_k_first_nonfinite names the first of a long array. */
DT__AVX512 static inline bool dt__any_exp_ones(const void *p, int es, uint32_t e, int64_t n)
{
    const char *b = (const char *)p;
    if (es == 2) {
        const __m512i m = _mm512_set1_epi16((short)e);
        for (int64_t i = 0; i < n; i += 32) {
            const __mmask32 k = n - i >= 32 ? 0xffffffffu : (__mmask32)((1u << (n - i)) - 1);
            if (_mm512_mask_cmpeq_epi16_mask(k, _mm512_and_si512(_mm512_maskz_loadu_epi16(k, b + 2 * i), m), m))
                return true;
        }
        return false;
    }
    const __m512i m = _mm512_set1_epi32((int)e);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        if (_mm512_mask_cmpeq_epi32_mask(k, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, b + 4 * i), m), m))
            return true;
    }
    return false;
}

/* dt__expf8 on 16 lanes: the same operations in the same order (masks for
 * the selects, skipped likewise), so every lane is bit-identical to
 * dt__expf of that element. */
DT__AVX512 static inline __m512 dt__expf16(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.7f);
    __m512 xc = _mm512_max_ps(_mm512_min_ps(x, hi), lo); /* NaN lanes: fixed at the end */
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    if (__builtin_expect(_mm512_cmp_ps_mask(x, xc, _CMP_NEQ_UQ) == 0, 1))
        return y; /* every lane inside the clamps: the selects below change nothing */
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), y, _mm512_setzero_ps());
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(__builtin_inff()));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

/* bf16 <-> f32 in registers on the avx512 paths (rope, SwiGLU, GELU rows):
 * widening bf16 is exact (a shift); rounding is the integer formula of
 * dt_f32_to_bf16 (dt__bf16_round at 16 lanes), whose bits every
 * dt_k_convert path gives, vcvtneps2bf16 included. */
DT__AVX512 static inline __m512 dt__bf16_load16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* v rounded to bf16, as f32 (low 16 bits zero) */
DT__AVX512 static inline __m512 dt__bf16_round16(__m512 v)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512i u = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), hi);
    __m512i q = _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)), hi);
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, nan, q));
}

/* r (a bf16 value held in f32) as its 16 bf16 bits */
DT__AVX512 static inline __m256i dt__bf16_pack16(__m512 r)
{
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16));
}

/* r (a bf16 value held in f32) stored as bf16 */
DT__AVX512 static inline void dt__bf16_store16(uint16_t *p, __m512 r)
{
    _mm256_storeu_si256((__m256i *)p, dt__bf16_pack16(r));
}

/* 16 x 16 transpose of 32-bit lanes: element j of r[i] becomes element i
 * of r[j] (the AMX GEMM's packing and transposed epilogue, the attention's
 * tile panels). */
DT__AVX512 static inline void dt__tr16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* u[4i + j], lane l: column 4l + j of rows 4i .. 4i + 3 */
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) { /* lanes across u[j], u[4 + j], u[8 + j], u[12 + j] */
        __m512i x0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88), x1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xdd);
        __m512i x2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
        __m512i x3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xdd);
        r[j] = _mm512_shuffle_i32x4(x0, x2, 0x88);
        r[8 + j] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
        r[4 + j] = _mm512_shuffle_i32x4(x1, x3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
    }
}

#else
#define DT__X86_VEC 0
#endif

/* Which row loops the kernels run, from dt_k_get_isa() (so DT_MAX_CPU_ISA
 * and dt_k_set_isa cap it): DT__VEC_SCALAR on the scalar path, DT__VEC_AVX2
 * on the avx2 path, DT__VEC_AVX512 on the avx512 and avx512_bf16 paths
 * (every path but scalar implies AVX2, as dt_cpu_detect() reports the CPU).
 * Kernels that have no 16-lane loop treat DT__VEC_AVX512 as AVX2. */
enum { DT__VEC_SCALAR = 0, DT__VEC_AVX2 = 1, DT__VEC_AVX512 = 2 };
static inline int dt__vec_level(void)
{
#if DT__X86_VEC
    dt_k_isa isa = dt_k_get_isa();
    return isa == DT_K_ISA_SCALAR ? DT__VEC_SCALAR : isa >= DT_K_ISA_AVX512 ? DT__VEC_AVX512 : DT__VEC_AVX2;
#else
    return DT__VEC_SCALAR;
#endif
}

/* Whether the kernels' AVX2 (or wider) row loops run: dt__vec_level() is
 * not scalar. */
static inline bool dt__vec_avx2(void)
{
    return dt__vec_level() != DT__VEC_SCALAR;
}

/* v rounded to bf16 (held in f32) as dt_f32_to_bf16 rounds: to nearest
 * even, a NaN quieted with its sign and the top of its payload kept. Plain
 * integer operations: loops over it vectorise at any width with the same
 * bits (the norms' row roundings). */
static inline __attribute__((always_inline)) float dt__bf16_round(float v)
{
    union {
        float f;
        uint32_t u;
    } b = {.f = v};
    uint32_t q = (b.u | 0x00400000u) & 0xffff0000u, r = (b.u + 0x7fffu + ((b.u >> 16) & 1u)) & 0xffff0000u;
    b.u = (b.u & 0x7fffffffu) > 0x7f800000u ? q : r;
    return b.f;
}

/* OpenMP threads for the C kernels: dt_get_num_threads(), 1 for small work. */
int dt__threads_for(int64_t work);

/* Soft-capped attention scores (defined in attention_window.c; the blocked
 * kernel attention.c and attention_part.c take them): t[j]
 * = tanh(r[j] scale / cap) and r[j] = cap t[j] for j < n (t NULL: r only),
 * tanh within 1.5 ulp; vec (dt__vec_level) picks 8 lanes a step, the same
 * bits. */
void dt__att_cap_row(int vec, float *r, float *t, int64_t n, float scale, float cap);

/* Pooling: the input range [*lo, *hi) of output index i along one axis
 * (window k, stride, padding pad, input length n), clipped to the input. */
static inline void dt__pool_window(int64_t i, int64_t stride, int64_t pad, int64_t k, int64_t n, int64_t *lo,
                                   int64_t *hi)
{
    int64_t a = i * stride - pad, b = a + k;
    *lo = a < 0 ? 0 : a;
    *hi = b > n ? n : b;
}

/* The blocked attention kernel (attention.c) with every argument: heads
 * [h0, h0 + H) of Ht, causal or not, a sliding window and a soft cap
 * (causal), dropout p with its key: the entry points of attention_window.c.
 * qkv of dtype t (f32, or bf16/f16 as dt_k_attention_fwd_heads_lp reads
 * it: ylp, dqkv_lp as there); window 0 or >= T: none, cap 0: none (both:
 * dt_k_attention_fwd_heads' bits). fn names the caller in errors; the
 * caller checks the window and the cap. */
dt_status dt__attention_ex_fwd(const char *fn, dt_dtype t, const void *qkv, int64_t B, int64_t T, int64_t H, int64_t D,
                               int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                               float *y, void *ylp, float *lse);
dt_status dt__attention_ex_bwd(const char *fn, dt_dtype t, const void *qkv, const float *y, const float *lse,
                               const float *dy, int64_t B, int64_t T, int64_t H, int64_t D, int64_t h0, int64_t Ht,
                               bool causal, int64_t window, float cap, float p, dt_rng_key key, float *dqkv,
                               void *dqkv_lp);

/* Batch norm, shared by the plain (norm.c) and nChw8c (blocked.c) kernels. */
/* Training needs more than one value per channel and eps > 0. */
dt_status dt__bn_train_args(const char *fn, int64_t cnt, float eps);
/* Channel c from its shifted moments (s1 = sum(x - k), s2 = sum((x - k)^2)
 * over cnt values): writes save_mean/save_invstd and updates the running
 * stats (unbiased variance) where those are non-NULL, and returns the affine
 * y = (x - *mean) * *scale + *shift. */
void dt__bn_finish_channel(int64_t c, double s1, double s2, float k, int64_t cnt, float eps, float momentum,
                           const float *gamma, const float *beta, float *running_mean, float *running_var,
                           float *save_mean, float *save_invstd, float *mean, float *scale, float *shift);

/* ---- oneDNN ---------------------------------------------------------------- */
/* The process-wide CPU engine and stream (created on first use); NULL and an
 * error set if oneDNN cannot start. */
dnnl_engine_t dt__dnnl_engine(void);
dnnl_stream_t dt__dnnl_stream(void);
/* Make oneDNN's OpenMP region use dt_get_num_threads() threads. */
/* Convolution backward weights for C = 1 with dy in nChw8c or nChw16c
 * (block B, blocked.c): stride 1, dilation 1, kernels up to DT__C1_MAX_K,
 * padded rows up to DT__C1_MAX_ROW. P, Q: output size. Writes dw (OIHW) and
 * dbias if given. */
#define DT__C1_MAX_K 8
#define DT__C1_MAX_ROW 1024
bool dt__conv_c1_bwd_weights_blk_ok(const dt_k_conv2d_shape *s, int B);
void dt__conv_c1_bwd_weights_blk(const dt_k_conv2d_shape *s, int B, int64_t P, int64_t Q, const float *x,
                                 const float *dy, float *dw, float *dbias);
/* Convolution backward weights with x and dy both in nChw8c (blocked.c):
 * C and K multiples of 8, 5 taps a kernel row, stride 1, dilation 1, Q >= 4
 * outputs a row (dt__conv_bwd_weights_blk8_ok). nt threads (at most the
 * units: dt__conv_bwd_weights_blk8_threads); scratch holds
 * dt__conv_bwd_weights_blk8_scratch(s, nt) floats. Writes dw (OIHW) and
 * dbias if given; the same bits for any nt. */
bool dt__conv_bwd_weights_blk8_ok(const dt_k_conv2d_shape *s, int64_t Q);
int dt__conv_bwd_weights_blk8_threads(const dt_k_conv2d_shape *s, int64_t P, int64_t Q);
size_t dt__conv_bwd_weights_blk8_scratch(const dt_k_conv2d_shape *s, int nt);
void dt__conv_bwd_weights_blk8(const dt_k_conv2d_shape *s, int nt, int64_t P, int64_t Q, const float *x,
                               const float *dy, float *dw, float *dbias, float *scratch);
/* Work units of the per-channel kernels over nChw<B>c (blocked.c: batch
 * norm, the C = 1 backward weights) for CB channel blocks and nt threads:
 * whole blocks (*L = B), or half blocks of 8 lanes at stride 16 when B = 16
 * has fewer blocks than threads (a 16-channel layer still uses two threads);
 * unit u covers block u / (B / *L), lanes (u % (B / *L)) * *L onwards. */
int64_t dt__blk_units(int64_t CB, int B, int nt, int *L);

void dt__dnnl_set_threads(void);
/* Turn a dnnl_status_t into a dt_status with a message naming `what`. */
dt_status dt__dnnl_err(dnnl_status_t s, const char *what);

/* Primitive cache. A key is up to DT__KEY_LEN - 1 int64 values (op tag
 * first; the last slot is set to dt_get_num_threads() by the cache);
 * the payload is owned by the cache and released with its destroy function. */
#define DT__KEY_LEN 24
typedef struct { int64_t v[DT__KEY_LEN]; } dt__key;
typedef void (*dt__payload_free)(void *payload);
/* Cached payload for key, or NULL (counts a hit when found). */
void *dt__cache_get(const dt__key *key);
/* Insert payload under key (the cache takes ownership); returns the payload
 * that is in the cache afterwards (an existing one wins a race; then the new
 * one is freed). NULL on out-of-memory (payload freed). */
void *dt__cache_put(const dt__key *key, void *payload, dt__payload_free destroy);
/* Counters. */
void dt__stats_primitive_created(void);
void dt__stats_reorder(void);

/* Create a primitive from a primitive descriptor, counting it. */
dt_status dt__prim_create(dnnl_primitive_t *prim, const_dnnl_primitive_desc_t pd, const char *what);
/* Execute prim with nargs (arg, memory) pairs and wait. */
dt_status dt__prim_exec(dnnl_primitive_t prim, int nargs, const dnnl_exec_arg_t *args, const char *what);
/* A memory object over user data ptr (NULL allowed = none). */
dt_status dt__mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md, void *ptr, const char *what);

/* GEMM recording (gemm_record.c, dt_k_gemm_record_start): whether one is
 * running (one relaxed atomic load), and the call to count in it. */
bool dt__gemm_recording(void);
void dt__gemm_record(const dt_k_gemm_shape *call);

#endif
