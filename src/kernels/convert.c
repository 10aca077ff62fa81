/* f32 <-> f16 / bf16 array conversion, vectorised, bit-exact with base.h.
 *
 * Paths (chosen once from dt_cpu_detect(), overridable by dt_k_set_isa):
 *  - scalar: the reference functions of base.h in a loop.
 *  - avx2:   F16C vcvtps2ph / vcvtph2ps for f16; integer AVX2 arithmetic for
 *            bf16 (add 0x7fff + lsb, shift: exactly the scalar formula).
 *  - avx512: the same at 16 lanes.
 *  - avx512_bf16: avx512, but f32->bf16 by AVX512_BF16 vcvtneps2bf16.
 * The CPU's features come from dt_cpu_detect(): DT_MAX_CPU_ISA=avx2 keeps
 * the automatic choice off both AVX-512 paths.
 * Where hardware differs from the reference the lanes are patched:
 *  - vcvtph2ps quiets signalling NaNs; the reference keeps the payload bits
 *    as they are (sign | 0x7f800000 | m << 13), so NaN lanes are rebuilt with
 *    integer ops.
 *  - vcvtps2ph on a NaN gives sign | 0x7e00 | (m >> 13), which is what the
 *    reference gives, but we do not rely on it: NaN lanes are rebuilt too.
 *  - vcvtneps2bf16 flushes f32 subnormal inputs to zero (it ignores MXCSR);
 *    those lanes are recomputed with the integer formula.
 * Large arrays are split across OpenMP threads in fixed chunks (the result
 * does not depend on the split: every element is independent). */
#include "kernels_impl.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define DT_X86 1
#include <immintrin.h>
#endif

static atomic_int g_isa; /* 0 = not resolved yet */

static dt_k_isa best_isa(void)
{
    dt_cpu_features f = dt_cpu_detect();
    if (f.avx512f && f.avx512bw && f.avx512vl && f.f16c && f.avx2 && f.fma)
        return f.avx512_bf16 ? DT_K_ISA_AVX512_BF16 : DT_K_ISA_AVX512;
    if (f.avx2 && f.f16c && f.fma)
        return DT_K_ISA_AVX2;
    return DT_K_ISA_SCALAR;
}

static bool isa_ok(dt_k_isa isa)
{
#ifdef DT_X86
    dt_cpu_features f = dt_cpu_detect();
    switch (isa) {
    case DT_K_ISA_SCALAR: return true;
    case DT_K_ISA_AVX2: return f.avx2 && f.f16c && f.fma;
    case DT_K_ISA_AVX512: return f.avx512f && f.avx512bw && f.avx512vl && f.f16c && f.avx2 && f.fma;
    case DT_K_ISA_AVX512_BF16:
        return f.avx512f && f.avx512bw && f.avx512vl && f.f16c && f.avx2 && f.fma && f.avx512_bf16;
    default: return false;
    }
#else
    return isa == DT_K_ISA_SCALAR;
#endif
}

dt_status dt_k_set_isa(dt_k_isa isa)
{
    if (isa == DT_K_ISA_AUTO) {
        atomic_store(&g_isa, (int)best_isa());
        return DT_OK;
    }
    if ((int)isa < 0 || isa > DT_K_ISA_AVX512_BF16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_k_set_isa: unknown isa %d", (int)isa);
    if (!isa_ok(isa))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_k_set_isa: this CPU does not support the %s path",
                        dt_k_isa_name(isa));
    atomic_store(&g_isa, (int)isa);
    return DT_OK;
}

dt_k_isa dt_k_get_isa(void)
{
    int v = atomic_load(&g_isa);
    if (!v) {
        v = (int)best_isa();
        atomic_store(&g_isa, v);
    }
    return (dt_k_isa)v;
}

const char *dt_k_isa_name(dt_k_isa isa)
{
    switch (isa) {
    case DT_K_ISA_AUTO: return "auto";
    case DT_K_ISA_SCALAR: return "scalar";
    case DT_K_ISA_AVX2: return "avx2";
    case DT_K_ISA_AVX512: return "avx512";
    case DT_K_ISA_AVX512_BF16: return "avx512_bf16";
    }
    return "?";
}

/* ---- scalar ------------------------------------------------------------------ */
static void s_f32_f16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = dt_f32_to_f16(x[i]);
}
static void s_f16_f32(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = dt_f16_to_f32(x[i]);
}
static void s_f32_bf16(const float *x, uint16_t *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = dt_f32_to_bf16(x[i]);
}
static void s_bf16_f32(const uint16_t *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = dt_bf16_to_f32(x[i]);
}

#ifdef DT_X86
/* ---- AVX2 + F16C ---------------------------------------------------------------- */
#define AVX2 __attribute__((target("avx2,f16c,fma")))

AVX2 static void v2_f32_f16(const float *x, uint16_t *y, int64_t n)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256i u = _mm256_castps_si256(v);
        __m256i a = _mm256_and_si256(u, absmask);
        __m256i nan = _mm256_cmpgt_epi32(a, inf);
        if (!_mm256_testz_si256(nan, nan)) {
            /* sign | 0x7e00 | ((a >> 13) & 0x3ff), per lane, packed to 16 bits */
            __m256i sgn = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
            __m256i r = _mm256_or_si256(_mm256_or_si256(sgn, _mm256_set1_epi32(0x7e00)),
                                        _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(0x3ff)));
            __m256i hw = _mm256_cvtepu16_epi32(h);
            hw = _mm256_blendv_epi8(hw, r, nan);
            __m256i p = _mm256_packus_epi32(hw, hw); /* lanes: 0-3 0-3 | 4-7 4-7 */
            p = _mm256_permute4x64_epi64(p, 0x08);  /* qwords 0, 2 */
            h = _mm256_castsi256_si128(p);
        }
        _mm_storeu_si128((__m128i *)(y + i), h);
    }
    s_f32_f16(x + i, y + i, n - i);
}

AVX2 static void v2_f16_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(x + i));
        __m256 f = _mm256_cvtph_ps(h);
        __m256i w = _mm256_cvtepu16_epi32(h);
        __m256i e = _mm256_and_si256(w, _mm256_set1_epi32(0x7c00));
        __m256i m = _mm256_and_si256(w, _mm256_set1_epi32(0x3ff));
        __m256i nan = _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()),
                                          _mm256_cmpeq_epi32(e, _mm256_set1_epi32(0x7c00)));
        if (!_mm256_testz_si256(nan, nan)) {
            __m256i r = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                        _mm256_or_si256(_mm256_set1_epi32(0x7f800000), _mm256_slli_epi32(m, 13)));
            f = _mm256_castsi256_ps(_mm256_blendv_epi8(_mm256_castps_si256(f), r, nan));
        }
        _mm256_storeu_ps(y + i, f);
    }
    s_f16_f32(x + i, y + i, n - i);
}

AVX2 static void v2_f32_bf16(const float *x, uint16_t *y, int64_t n)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), q = _mm256_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * k));
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absmask), inf);
            __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
            __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
            __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), q);
            r[k] = _mm256_blendv_epi8(rn, qn, nan);
        }
        __m256i p = _mm256_packus_epi32(r[0], r[1]); /* a0-3 b0-3 | a4-7 b4-7 */
        p = _mm256_permute4x64_epi64(p, 0xd8);      /* a0-3 a4-7 b0-3 b4-7 */
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    s_f32_bf16(x + i, y + i, n - i);
}

AVX2 static void v2_bf16_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_slli_epi32(w, 16));
    }
    s_bf16_f32(x + i, y + i, n - i);
}

/* ---- AVX-512 ------------------------------------------------------------------------ */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c,avx2")))

AVX512 static void v5_f32_f16(const float *x, uint16_t *y, int64_t n)
{
    const __m512i absmask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i u = _mm512_castps_si512(v);
        __m512i a = _mm512_and_si512(u, absmask);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(a, inf);
        if (nan) {
            __m512i sgn = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000));
            __m512i r = _mm512_or_si512(_mm512_or_si512(sgn, _mm512_set1_epi32(0x7e00)),
                                        _mm512_and_si512(_mm512_srli_epi32(a, 13), _mm512_set1_epi32(0x3ff)));
            __m512i hw = _mm512_mask_mov_epi32(_mm512_cvtepu16_epi32(h), nan, r);
            h = _mm512_cvtepi32_epi16(hw);
        }
        _mm256_storeu_si256((__m256i *)(y + i), h);
    }
    v2_f32_f16(x + i, y + i, n - i);
}

AVX512 static void v5_f16_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(x + i));
        __m512 f = _mm512_cvtph_ps(h);
        __m512i w = _mm512_cvtepu16_epi32(h);
        __m512i m = _mm512_and_si512(w, _mm512_set1_epi32(0x3ff));
        __mmask16 nan = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7c00)),
                                                _mm512_set1_epi32(0x7c00)) &
                        _mm512_test_epi32_mask(m, m);
        if (nan) {
            __m512i r = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
                                        _mm512_or_si512(_mm512_set1_epi32(0x7f800000), _mm512_slli_epi32(m, 13)));
            f = _mm512_castsi512_ps(_mm512_mask_mov_epi32(_mm512_castps_si512(f), nan, r));
        }
        _mm512_storeu_ps(y + i, f);
    }
    v2_f16_f32(x + i, y + i, n - i);
}

/* Integer RNE of 16 lanes (the scalar formula), NaN lanes quieted. */
AVX512 static inline __m256i v5_bf16_int(__m512i u)
{
    __m512i a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rn = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    __m512i qn = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rn, nan, qn));
}

AVX512 static void v5_f32_bf16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), v5_bf16_int(_mm512_loadu_si512(x + i)));
    v2_f32_bf16(x + i, y + i, n - i);
}

#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,avx2")))
AVX512BF16 static void v5bf_f32_bf16(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        __m256bh hb = _mm512_cvtneps_pbh(v);
        __m256i h;
        memcpy(&h, &hb, sizeof h);
        /* The instruction treats subnormal inputs as zero: redo those lanes
         * (exponent 0, mantissa non-zero) with the integer formula. */
        __m512i u = _mm512_castps_si512(v);
        __mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
                        _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
        if (sub) {
            __m256i r = v5_bf16_int(u);
            h = _mm256_mask_mov_epi16(h, sub, r);
        }
        _mm256_storeu_si256((__m256i *)(y + i), h);
    }
    v2_f32_bf16(x + i, y + i, n - i);
}

AVX512 static void v5_bf16_f32(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_si512(y + i, _mm512_slli_epi32(w, 16));
    }
    v2_bf16_f32(x + i, y + i, n - i);
}
#endif /* DT_X86 */

/* ---- the non-finite scan (dt_k_first_nonfinite) -------------------------------------
 * An element is non-finite when its exponent bits are all ones (e = the
 * exponent mask of its dtype); the vector loops test 64 bytes (or 32) at a
 * time and hand the block that holds a hit to the scalar loop, which names
 * the first element: the same index on every path. */
static int64_t s_nonfinite(const void *p, int es, uint32_t e, int64_t n)
{
    if (es == 4) {
        const uint32_t *u = p;
        for (int64_t i = 0; i < n; i++)
            if ((u[i] & e) == e)
                return i;
        return n;
    }
    const uint16_t *u = p;
    for (int64_t i = 0; i < n; i++)
        if ((u[i] & e) == e)
            return i;
    return n;
}

#ifdef DT_X86
AVX2 static int64_t v2_nonfinite(const void *p, int es, uint32_t e, int64_t n)
{
    const int64_t per = 32 / es; /* elements per vector */
    const __m256i m = es == 4 ? _mm256_set1_epi32((int)e) : _mm256_set1_epi16((short)e);
    int64_t i = 0;
    for (; i + 4 * per <= n; i += 4 * per) {
        const __m256i *v = (const __m256i *)((const char *)p + i * es);
        __m256i hit = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i x = _mm256_and_si256(_mm256_loadu_si256(v + k), m);
            hit = _mm256_or_si256(hit, es == 4 ? _mm256_cmpeq_epi32(x, m) : _mm256_cmpeq_epi16(x, m));
        }
        if (!_mm256_testz_si256(hit, hit))
            return i + s_nonfinite((const char *)p + i * es, es, e, 4 * per);
    }
    return i + s_nonfinite((const char *)p + i * es, es, e, n - i);
}

/* Whether any of the 64-byte blocks [0, nb) holds a non-finite element:
 * four streams (the quarters of the range) read side by side, the hits
 * OR-ed and tested once per 1 KiB: one stream alone leaves the memory
 * bandwidth idle waiting on its next line. */
AVX512 static bool v5_any_nonfinite(const char *b, int es, uint32_t e, int64_t nb)
{
    const __m512i m = es == 4 ? _mm512_set1_epi32((int)e) : _mm512_set1_epi16((short)e);
    const int64_t q = nb / 4;
    uint64_t hit = 0;
    for (int64_t j = 0; j < q; j += 4) {
        const int64_t c = q - j < 4 ? q - j : 4;
        for (int s = 0; s < 4; s++)
            for (int64_t k = 0; k < c; k++) {
                __m512i x = _mm512_and_si512(_mm512_loadu_si512(b + 64 * (s * q + j + k)), m);
                hit |= es == 4 ? (uint64_t)_mm512_cmpeq_epi32_mask(x, m) : (uint64_t)_mm512_cmpeq_epi16_mask(x, m);
            }
        if (hit)
            return true;
    }
    for (int64_t j = 4 * q; j < nb; j++) {
        __m512i x = _mm512_and_si512(_mm512_loadu_si512(b + 64 * j), m);
        hit |= es == 4 ? (uint64_t)_mm512_cmpeq_epi32_mask(x, m) : (uint64_t)_mm512_cmpeq_epi16_mask(x, m);
    }
    return hit != 0;
}

AVX512 static int64_t v5_nonfinite(const void *p, int es, uint32_t e, int64_t n)
{
    /* the common case (all finite) in four streams; a hit is located by
     * the in-order loop below, which names the first element */
    if (n >= 64 * 64 / es && !v5_any_nonfinite(p, es, e, n * es / 64)) {
        const int64_t i = n - (n * es % 64) / es; /* the sub-block tail */
        const char *t = (const char *)p + i * es;
        return dt__any_exp_ones(t, es, e, n - i) ? i + s_nonfinite(t, es, e, n - i) : n;
    }
    const int64_t per = 64 / es;
    const __m512i m = es == 4 ? _mm512_set1_epi32((int)e) : _mm512_set1_epi16((short)e);
    int64_t i = 0;
    for (; i + 4 * per <= n; i += 4 * per) {
        const char *b = (const char *)p + i * es;
        uint64_t hit = 0;
        for (int k = 0; k < 4; k++) {
            __m512i x = _mm512_and_si512(_mm512_loadu_si512(b + 64 * k), m);
            hit |= es == 4 ? (uint64_t)_mm512_cmpeq_epi32_mask(x, m) : (uint64_t)_mm512_cmpeq_epi16_mask(x, m);
        }
        if (hit)
            return i + s_nonfinite(b, es, e, 4 * per);
    }
    const char *t = (const char *)p + i * es; /* under 256 bytes: masked, then located in order */
    return dt__any_exp_ones(t, es, e, n - i) ? i + s_nonfinite(t, es, e, n - i) : n;
}
#endif

int64_t dt_k_first_nonfinite(const void *x, dt_dtype dt, int64_t n)
{
    if (!x || n <= 0 || (dt != DT_F32 && dt != DT_BF16 && dt != DT_F16))
        return n > 0 ? n : 0;
    const int es = dt == DT_F32 ? 4 : 2;
    const uint32_t e = dt == DT_F32 ? 0x7f800000u : dt == DT_BF16 ? 0x7f80u : 0x7c00u;
    int64_t (*f)(const void *, int, uint32_t, int64_t) = s_nonfinite;
#ifdef DT_X86
    dt_k_isa isa = dt_k_get_isa();
    f = isa >= DT_K_ISA_AVX512 ? v5_nonfinite : isa == DT_K_ISA_AVX2 ? v2_nonfinite : s_nonfinite;
#endif
    const int64_t chunk = 1 << 16, nchunks = (n + chunk - 1) / chunk;
    int nt = dt__threads_for(n);
    if (nt <= 1 || nchunks <= 1)
        return f(x, es, e, n);
    int64_t first = n; /* the lowest chunk's hit: the first non-finite element */
#pragma omp parallel for schedule(static) num_threads(nt) reduction(min : first)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
        int64_t k = f((const char *)x + lo * es, es, e, len);
        if (k < len && lo + k < first)
            first = lo + k;
    }
    return first;
}

/* ---- dispatch ------------------------------------------------------------------------ */
typedef void (*cvt_fn)(const void *, void *, int64_t);
enum { F32_F16, F16_F32, F32_BF16, BF16_F32 };

/* Uniform signatures for the dispatch table (no calls through cast pointers). */
#define WRAP(name, Tin, Tout)                                                   \
    static void w_##name(const void *x, void *y, int64_t n) { name((const Tin *)x, (Tout *)y, n); }
WRAP(s_f32_f16, float, uint16_t)
WRAP(s_f16_f32, uint16_t, float)
WRAP(s_f32_bf16, float, uint16_t)
WRAP(s_bf16_f32, uint16_t, float)
#ifdef DT_X86
WRAP(v2_f32_f16, float, uint16_t)
WRAP(v2_f16_f32, uint16_t, float)
WRAP(v2_f32_bf16, float, uint16_t)
WRAP(v2_bf16_f32, uint16_t, float)
WRAP(v5_f32_f16, float, uint16_t)
WRAP(v5_f16_f32, uint16_t, float)
WRAP(v5_f32_bf16, float, uint16_t)
WRAP(v5bf_f32_bf16, float, uint16_t)
WRAP(v5_bf16_f32, uint16_t, float)
#endif

static cvt_fn pick(int which)
{
    dt_k_isa isa = dt_k_get_isa();
#ifdef DT_X86
    if (isa == DT_K_ISA_AVX512 || isa == DT_K_ISA_AVX512_BF16) {
        switch (which) {
        case F32_F16: return w_v5_f32_f16;
        case F16_F32: return w_v5_f16_f32;
        case F32_BF16: return isa == DT_K_ISA_AVX512_BF16 ? w_v5bf_f32_bf16 : w_v5_f32_bf16;
        default: return w_v5_bf16_f32;
        }
    }
    if (isa == DT_K_ISA_AVX2) {
        switch (which) {
        case F32_F16: return w_v2_f32_f16;
        case F16_F32: return w_v2_f16_f32;
        case F32_BF16: return w_v2_f32_bf16;
        default: return w_v2_bf16_f32;
        }
    }
#endif
    (void)isa;
    switch (which) {
    case F32_F16: return w_s_f32_f16;
    case F16_F32: return w_s_f16_f32;
    case F32_BF16: return w_s_f32_bf16;
    default: return w_s_bf16_f32;
    }
}

static dt_status run(int which, const char *fn, const void *x, size_t xs, void *y, size_t ys, int64_t n)
{
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    cvt_fn f = pick(which);
    const int64_t chunk = 1 << 16;
    int64_t nchunks = (n + chunk - 1) / chunk;
    int nt = dt__threads_for(n);
    if (nt <= 1 || nchunks <= 1) {
        f(x, y, n);
        return DT_OK;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t c = 0; c < nchunks; c++) {
        int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
        f((const char *)x + lo * (int64_t)xs, (char *)y + lo * (int64_t)ys, len);
    }
    return DT_OK;
}

dt_status dt_k_f32_to_f16(const float *x, uint16_t *y, int64_t n)
{
    return run(F32_F16, "dt_k_f32_to_f16", x, 4, y, 2, n);
}
dt_status dt_k_f16_to_f32(const uint16_t *x, float *y, int64_t n)
{
    return run(F16_F32, "dt_k_f16_to_f32", x, 2, y, 4, n);
}
dt_status dt_k_f32_to_bf16(const float *x, uint16_t *y, int64_t n)
{
    return run(F32_BF16, "dt_k_f32_to_bf16", x, 4, y, 2, n);
}
dt_status dt_k_bf16_to_f32(const uint16_t *x, float *y, int64_t n)
{
    return run(BF16_F32, "dt_k_bf16_to_f32", x, 2, y, 4, n);
}

dt_status dt_k_convert(const void *x, dt_dtype xt, void *y, dt_dtype yt, int64_t n)
{
    const char *fn = "dt_k_convert";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    bool okx = xt == DT_F32 || xt == DT_F16 || xt == DT_BF16, oky = yt == DT_F32 || yt == DT_F16 || yt == DT_BF16;
    if (!okx || !oky)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: %s -> %s (only f32, f16, bf16)", fn, dt_dtype_name(xt),
                        dt_dtype_name(yt));
    if (xt == yt) {
        if (n && x != y)
            memmove(y, x, (size_t)n * dt_dtype_size(xt));
        return DT_OK;
    }
    if (xt == DT_F32)
        return yt == DT_F16 ? dt_k_f32_to_f16(x, y, n) : dt_k_f32_to_bf16(x, y, n);
    if (yt == DT_F32)
        return xt == DT_F16 ? dt_k_f16_to_f32(x, y, n) : dt_k_bf16_to_f32(x, y, n);
    /* f16 <-> bf16 through f32 in blocks (each step rounds once: f16 -> f32 is
     * exact, so this is a single rounding of the true value). */
    float buf[1024];
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t len = n - i < 1024 ? n - i : 1024;
        const uint16_t *xi = (const uint16_t *)x + i;
        uint16_t *yi = (uint16_t *)y + i;
        if (xt == DT_F16) {
            dt_k_f16_to_f32(xi, buf, len);
            dt_k_f32_to_bf16(buf, yi, len);
        } else {
            dt_k_bf16_to_f32(xi, buf, len);
            dt_k_f32_to_f16(buf, yi, len);
        }
    }
    return DT_OK;
}
