/* Element kernels of the optimizers.
 *
 * Each kernel exists three times: an AVX-512 version (16 lanes, AVX-512F/
 * VL/BW with FMA), an AVX2+FMA version (intrinsics; both chosen at run time
 * from dt_cpu_detect(), so DT_MAX_CPU_ISA caps them) and a portable scalar
 * version. They compute bit-identical results: every fused multiply-add of the vector code is an
 * fmaf() in the scalar code, the rest are plain IEEE operations in the same
 * order, and sums of squares use the same 8-lane double accumulation
 * pattern followed by the same fixed-order final sum.
 *
 * Formula order per optimizer (float32 math, as the references compute):
 *   SGD (torch 1.13 _single_tensor_sgd; add(alpha) is an FMA on AVX2 CPUs)
 *     d = fma(p, wd, g)                       if wd != 0
 *     buf = first ? d : fma(d, 1-damp, buf*mom)
 *     d = nesterov ? fma(buf, mom, d) : buf   if mom != 0
 *     p = fma(d, -lr, p)
 *   Adam/AdamW (torch 1.13 _single_tensor_adam[w])
 *     g = fma(p, wd, g)                       Adam, wd != 0
 *     p = p * (1 - lr*wd)                     AdamW, wd != 0
 *     m = fma(g, 1-b1, m*b1)                  mul_ then add_(alpha)
 *     v = fma((1-b2)*g, g, v*b2)              mul_ then addcmul_
 *     p = p + (-step_size*m) / (sqrt(v)/sqrt(bc2) + eps)     addcdiv_
 *   LAMB (apex multi_tensor_lamb.cu, formula order without contraction)
 *     s = g / clip; [L2: s = s + wd*p]
 *     m = m*b1 + b3*s; v = v*b2 + (1-b2)*s*s
 *     u = (m/bc1) / (sqrt(v/bc2) + eps) [+ wd*p in adam_w_mode]
 */
#include "optim_impl.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DT_OPT_X86 1
#else
#define DT_OPT_X86 0
#endif

/* The kernels in use: SIMD_SCALAR, SIMD_AVX2 or SIMD_AVX512; -1 = not
 * probed yet; atomic because ranks-as-threads may step concurrently. */
enum { SIMD_SCALAR = 0, SIMD_AVX2 = 1, SIMD_AVX512 = 2 };
static _Atomic int g_simd = -1;

/* The best level of this CPU, from dt_cpu_detect() (so DT_MAX_CPU_ISA caps it). */
static int simd_best(void)
{
    dt_cpu_features f = dt_cpu_detect();
    if (!(DT_OPT_X86 && f.avx2 && f.fma))
        return SIMD_SCALAR;
    return f.avx512f && f.avx512vl && f.avx512bw ? SIMD_AVX512 : SIMD_AVX2;
}

static int simd_level(void)
{
    int v = g_simd;
    if (v < 0)
        g_simd = v = simd_best();
    return v;
}

static bool use_avx2(void)
{
    return simd_level() >= SIMD_AVX2;
}

static bool use_avx512(void)
{
    return simd_level() >= SIMD_AVX512;
}

void dt__optim_force_scalar(bool on)
{
    g_simd = on ? 0 : -1;
}

bool dt__optim_force_level(int level)
{
    if (level < 0) {
        g_simd = -1;
        return true;
    }
    if (level > simd_best())
        return false;
    g_simd = level;
    return true;
}

bool dt__optim_simd_active(void)
{
    return DT_OPT_X86 && use_avx2();
}

/* ---- scalar reference paths ---------------------------------------------- */

static void sgd_scalar(float *p, float *g, float *buf, size_t n, const dt__sgd_k *k)
{
    for (size_t i = 0; i < n; i++) {
        float d = g[i];
        if (k->has_wd)
            d = fmaf(p[i], k->wd, d);
        if (k->has_momentum) {
            float b = k->first ? d : fmaf(d, k->one_minus_damp, buf[i] * k->momentum);
            buf[i] = b;
            d = k->nesterov ? fmaf(b, k->momentum, d) : b;
        }
        p[i] = fmaf(d, k->neg_lr, p[i]);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

/* One element of Adam(W): steps the moments *m, *v in place and returns the
 * new parameter (the loops below, f32 or bf16 gradients, share it). */
static inline float adam_one(float pi, float gi, float *m, float *v, const dt__adam_k *k)
{
    if (k->l2)
        gi = fmaf(pi, k->wd, gi);
    if (k->decoupled)
        pi = pi * k->decay;
    float mi = fmaf(gi, k->omb1, *m * k->b1);
    float vi = fmaf(k->omb2 * gi, gi, *v * k->b2);
    float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    *m = mi;
    *v = vi;
    return pi + (k->neg_step_size * mi) / denom;
}

static void adam_scalar(float *p, float *g, float *m, float *v, size_t n, const dt__adam_k *k)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = adam_one(p[i], g[i], m + i, v + i, k);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

/* Lion's sign: -1, 0 or 1, NaN kept (a NaN gradient must reach the parameter, as torch.sign's NaN does). */
static inline float lion_sign(float c) { return c > 0.0f ? 1.0f : c < 0.0f ? -1.0f : c == 0.0f ? 0.0f : c; }

static void lion_scalar(float *p, float *g, float *m, size_t n, const dt__lion_k *k)
{
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i], c = fmaf(gi, k->omb1, m[i] * k->b1);
        p[i] = fmaf(lion_sign(c), k->neg_lr, p[i] * k->decay);
        m[i] = fmaf(gi, k->omb2, m[i] * k->b2);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

/* bf16 -> f32 and f32 -> bf16 (round to nearest even, NaN quieted): the
 * formulas of dt_bf16_to_f32 / dt_f32_to_bf16, inline for the fused loop. */
static inline float bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* adam_scalar on widened bf16 grads, the master rounded into the copy. */
static void adam_bf16_scalar(float *p, uint16_t *g, float *m, float *v, uint16_t *copy, size_t n,
                             const dt__adam_k *k)
{
    for (size_t i = 0; i < n; i++) {
        const float pi = p[i] = adam_one(p[i], bf16_f32(g[i]), m + i, v + i, k);
        if (copy)
            copy[i] = f32_bf16(pi);
        if (k->zero_grad)
            g[i] = 0;
    }
}

static double lamb1_scalar(const float *p, float *g, float *m, float *v, size_t n, const dt__lamb_k *k)
{
    double acc[8] = {0}, tail = 0;
    size_t n8 = n & ~(size_t)7;
    for (size_t i = 0; i < n; i++) {
        float pi = k->decay != 0.0f ? p[i] : 0.0f;
        float s = g[i] / k->clip;
        if (!k->adam_w_mode)
            s = s + k->decay * pi;
        float mi = m[i] * k->b1 + k->b3 * s;
        float vi = v[i] * k->b2 + k->omb2 * s * s;
        float mh = mi / k->bc1, vh = vi / k->bc2;
        float denom = sqrtf(vh) + k->eps;
        float u = mh / denom;
        if (k->adam_w_mode)
            u = u + k->decay * pi;
        g[i] = u;
        m[i] = mi;
        v[i] = vi;
        double du = (double)u;
        if (i < n8)
            acc[i & 7] = fma(du, du, acc[i & 7]);
        else
            tail = fma(du, du, tail);
    }
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += acc[j];
    return s + tail;
}

static double sqsum_scalar(const float *x, size_t n)
{
    double acc[8] = {0}, tail = 0;
    size_t n8 = n & ~(size_t)7;
    for (size_t i = 0; i < n8; i++)
        acc[i & 7] = fma((double)x[i], (double)x[i], acc[i & 7]);
    for (size_t i = n8; i < n; i++)
        tail = fma((double)x[i], (double)x[i], tail);
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += acc[j];
    return s + tail;
}

/* ---- AVX2 + FMA paths ------------------------------------------------------ */
#if DT_OPT_X86
#define DT_AVX2 __attribute__((target("avx2,fma")))

/* The Adam sweeps' software prefetch (AVX2 and AVX-512): the lines PF
 * elements ahead of the block being stepped (a hint: no fault past an
 * array's end, no result changed). The hardware prefetcher alone leaves the
 * sweep waiting on its four or five streams behind the divider's work:
 * with the hint the bf16 sweep over 100M parameters took 0.88-0.93 of the
 * CPU time (AVX-512; AVX2: 0.83) on the AMD EPYC (Zen 4) VM, interleaved
 * in one process (256 to 2048 ahead measured; 512 best). */
#define PF 512

static inline void pf_f32(const float *x, size_t i)
{
    _mm_prefetch((const char *)((uintptr_t)(x + i) + PF * sizeof *x), _MM_HINT_T0);
}

/* The bf16 gradient: one line every 32 elements. */
static inline void pf_bf16(const uint16_t *g, size_t i)
{
    if (!(i & 31))
        _mm_prefetch((const char *)((uintptr_t)(g + i) + PF * sizeof *g), _MM_HINT_T0);
}

DT_AVX2 static void sgd_avx2(float *p, float *g, float *buf, size_t n, const dt__sgd_k *k)
{
    const __m256 wd = _mm256_set1_ps(k->wd), mom = _mm256_set1_ps(k->momentum);
    const __m256 omd = _mm256_set1_ps(k->one_minus_damp), nlr = _mm256_set1_ps(k->neg_lr);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 d = _mm256_loadu_ps(g + i), pp = _mm256_loadu_ps(p + i);
        if (k->has_wd)
            d = _mm256_fmadd_ps(pp, wd, d);
        if (k->has_momentum) {
            __m256 b = k->first ? d
                                : _mm256_fmadd_ps(d, omd, _mm256_mul_ps(_mm256_loadu_ps(buf + i), mom));
            _mm256_storeu_ps(buf + i, b);
            d = k->nesterov ? _mm256_fmadd_ps(b, mom, d) : b;
        }
        _mm256_storeu_ps(p + i, _mm256_fmadd_ps(d, nlr, pp));
        if (k->zero_grad)
            _mm256_storeu_ps(g + i, _mm256_setzero_ps());
    }
    if (i < n)
        sgd_scalar(p + i, g + i, buf ? buf + i : NULL, n - i, k);
}

/* lion_scalar on 8 lanes: the sign is 1 with c's sign bit, 0 where c == 0, c where c is NaN. */
DT_AVX2 static void lion_avx2(float *p, float *g, float *m, size_t n, const dt__lion_k *k)
{
    const __m256 b1 = _mm256_set1_ps(k->b1), omb1 = _mm256_set1_ps(k->omb1), b2 = _mm256_set1_ps(k->b2);
    const __m256 omb2 = _mm256_set1_ps(k->omb2), nlr = _mm256_set1_ps(k->neg_lr), dec = _mm256_set1_ps(k->decay);
    const __m256 one = _mm256_set1_ps(1.0f), sgn = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i), mi = _mm256_loadu_ps(m + i);
        const __m256 c = _mm256_fmadd_ps(gi, omb1, _mm256_mul_ps(mi, b1));
        __m256 sg = _mm256_or_ps(_mm256_and_ps(c, sgn), one);
        sg = _mm256_andnot_ps(_mm256_cmp_ps(c, zero, _CMP_EQ_OQ), sg);
        sg = _mm256_blendv_ps(sg, c, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));
        _mm256_storeu_ps(p + i, _mm256_fmadd_ps(sg, nlr, _mm256_mul_ps(_mm256_loadu_ps(p + i), dec)));
        _mm256_storeu_ps(m + i, _mm256_fmadd_ps(gi, omb2, _mm256_mul_ps(mi, b2)));
        if (k->zero_grad)
            _mm256_storeu_ps(g + i, zero);
    }
    if (i < n)
        lion_scalar(p + i, g + i, m + i, n - i, k);
}

/* adam_one on 8 lanes (the constants broadcast once per call of a loop). */
typedef struct {
    __m256 wd, decay, b1, omb1, b2, omb2, bc2s, eps, nss;
} adam_c8;

DT_AVX2 static inline adam_c8 adam_c8_of(const dt__adam_k *k)
{
    return (adam_c8){_mm256_set1_ps(k->wd),   _mm256_set1_ps(k->decay),    _mm256_set1_ps(k->b1),
                     _mm256_set1_ps(k->omb1), _mm256_set1_ps(k->b2),       _mm256_set1_ps(k->omb2),
                     _mm256_set1_ps(k->bc2_sqrt), _mm256_set1_ps(k->eps), _mm256_set1_ps(k->neg_step_size)};
}

DT_AVX2 static inline __m256 adam8(__m256 pi, __m256 gi, float *m, float *v, const adam_c8 *c, const dt__adam_k *k)
{
    if (k->l2)
        gi = _mm256_fmadd_ps(pi, c->wd, gi);
    if (k->decoupled)
        pi = _mm256_mul_ps(pi, c->decay);
    __m256 mi = _mm256_fmadd_ps(gi, c->omb1, _mm256_mul_ps(_mm256_loadu_ps(m), c->b1));
    __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(c->omb2, gi), gi, _mm256_mul_ps(_mm256_loadu_ps(v), c->b2));
    __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), c->bc2s), c->eps);
    _mm256_storeu_ps(m, mi);
    _mm256_storeu_ps(v, vi);
    return _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(c->nss, mi), denom));
}

DT_AVX2 static void adam_avx2(float *p, float *g, float *m, float *v, size_t n, const dt__adam_k *k)
{
    const adam_c8 c = adam_c8_of(k);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (!(i & 15)) /* a line of each stream every other block */
            pf_f32(p, i), pf_f32(g, i), pf_f32(m, i), pf_f32(v, i);
        _mm256_storeu_ps(p + i, adam8(_mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), m + i, v + i, &c, k));
        if (k->zero_grad)
            _mm256_storeu_ps(g + i, _mm256_setzero_ps());
    }
    if (i < n)
        adam_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

/* 8 lanes of f32 -> bf16 (the scalar formula, NaN quieted), in the low
 * 16 bits of each 32-bit lane. */
DT_AVX2 static inline __m256i bf16_round_avx2(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rn, qn, nan);
}

DT_AVX2 static void adam_bf16_avx2(float *p, uint16_t *g, float *m, float *v, uint16_t *copy, size_t n,
                                   const dt__adam_k *k)
{
    const adam_c8 c = adam_c8_of(k);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 pr[2];
        pf_f32(p, i), pf_f32(m, i), pf_f32(v, i), pf_bf16(g, i);
        for (int h = 0; h < 2; h++) {
            const size_t j = i + 8 * (size_t)h;
            __m256 gi = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(g + j))), 16));
            pr[h] = adam8(_mm256_loadu_ps(p + j), gi, m + j, v + j, &c, k);
            _mm256_storeu_ps(p + j, pr[h]);
        }
        if (copy) {
            __m256i h = _mm256_packus_epi32(bf16_round_avx2(pr[0]), bf16_round_avx2(pr[1]));
            _mm256_storeu_si256((__m256i *)(copy + i), _mm256_permute4x64_epi64(h, 0xd8));
        }
        if (k->zero_grad)
            _mm256_storeu_si256((__m256i *)(g + i), _mm256_setzero_si256());
    }
    if (i < n)
        adam_bf16_scalar(p + i, g + i, m + i, v + i, copy ? copy + i : NULL, n - i, k);
}

DT_AVX2 static double hsum_ordered(__m256d a0, __m256d a1, double tail)
{
    double acc[8];
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += acc[j];
    return s + tail;
}

DT_AVX2 static double lamb1_avx2(const float *p, float *g, float *m, float *v, size_t n, const dt__lamb_k *k)
{
    const __m256 clip = _mm256_set1_ps(k->clip), decay = _mm256_set1_ps(k->decay);
    const __m256 b1 = _mm256_set1_ps(k->b1), b3 = _mm256_set1_ps(k->b3);
    const __m256 b2 = _mm256_set1_ps(k->b2), omb2 = _mm256_set1_ps(k->omb2);
    const __m256 bc1 = _mm256_set1_ps(k->bc1), bc2 = _mm256_set1_ps(k->bc2), eps = _mm256_set1_ps(k->eps);
    const bool use_p = k->decay != 0.0f;
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 pi = use_p ? _mm256_loadu_ps(p + i) : _mm256_setzero_ps();
        __m256 s = _mm256_div_ps(_mm256_loadu_ps(g + i), clip);
        if (!k->adam_w_mode)
            s = _mm256_add_ps(s, _mm256_mul_ps(decay, pi));
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(b3, s));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, s), s));
        __m256 mh = _mm256_div_ps(mi, bc1), vh = _mm256_div_ps(vi, bc2);
        __m256 u = _mm256_div_ps(mh, _mm256_add_ps(_mm256_sqrt_ps(vh), eps));
        if (k->adam_w_mode)
            u = _mm256_add_ps(u, _mm256_mul_ps(decay, pi));
        _mm256_storeu_ps(g + i, u);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256d ulo = _mm256_cvtps_pd(_mm256_castps256_ps128(u));
        __m256d uhi = _mm256_cvtps_pd(_mm256_extractf128_ps(u, 1));
        a0 = _mm256_fmadd_pd(ulo, ulo, a0);
        a1 = _mm256_fmadd_pd(uhi, uhi, a1);
    }
    double tail = 0;
    if (i < n)
        tail = lamb1_scalar(p + i, g + i, m + i, v + i, n - i, k); /* < 8 elements: all in its tail */
    return hsum_ordered(a0, a1, tail);
}

DT_AVX2 static void lamb2_avx2(float *p, float *u, size_t n, float ratio, bool zero_grad)
{
    const __m256 r = _mm256_set1_ps(ratio);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(p + i, _mm256_sub_ps(_mm256_loadu_ps(p + i), _mm256_mul_ps(r, _mm256_loadu_ps(u + i))));
        if (zero_grad)
            _mm256_storeu_ps(u + i, _mm256_setzero_ps());
    }
    for (; i < n; i++) {
        p[i] = p[i] - ratio * u[i];
        if (zero_grad)
            u[i] = 0.0f;
    }
}

DT_AVX2 static double sqsum_avx2(const float *x, size_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xi = _mm256_loadu_ps(x + i);
        __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(xi));
        __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(xi, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    double tail = 0;
    for (; i < n; i++)
        tail = fma((double)x[i], (double)x[i], tail);
    return hsum_ordered(a0, a1, tail);
}

DT_AVX2 static void scale_avx2(float *x, size_t n, float s)
{
    const __m256 sv = _mm256_set1_ps(s);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
    for (; i < n; i++)
        x[i] *= s;
}

/* ---- AVX-512 paths: 16 lanes, the AVX2 paths' operations per element (so
 * the same bits); the last n % 16 elements run as one masked block where
 * elements are independent. ------------------------------------------------ */
#define DT_AVX512 __attribute__((target("avx2,fma,avx512f,avx512vl,avx512bw")))

DT_AVX512 static inline __mmask16 tail_mask(size_t r)
{
    return (__mmask16)((1u << r) - 1u);
}

/* Loads and stores of a block: plain ones for a whole block, masked ones
 * only for the tail (AMD's Zen 4 runs masked stores far slower than plain
 * ones: with them on every block the SGD step took 1.8x the AVX2 one). */
DT_AVX512 static inline __m512 ld16(__mmask16 mk, const float *x)
{
    return mk == (__mmask16)0xffff ? _mm512_loadu_ps(x) : _mm512_maskz_loadu_ps(mk, x);
}

DT_AVX512 static inline void st16(float *x, __mmask16 mk, __m512 v)
{
    if (mk == (__mmask16)0xffff)
        _mm512_storeu_ps(x, v);
    else
        _mm512_mask_storeu_ps(x, mk, v);
}

DT_AVX512 static void sgd_avx512(float *p, float *g, float *buf, size_t n, const dt__sgd_k *k)
{
    const __m512 wd = _mm512_set1_ps(k->wd), mom = _mm512_set1_ps(k->momentum);
    const __m512 omd = _mm512_set1_ps(k->one_minus_damp), nlr = _mm512_set1_ps(k->neg_lr);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 d = ld16(mk, g + i), pp = ld16(mk, p + i);
        if (k->has_wd)
            d = _mm512_fmadd_ps(pp, wd, d);
        if (k->has_momentum) {
            __m512 b = k->first ? d
                                : _mm512_fmadd_ps(d, omd, _mm512_mul_ps(ld16(mk, buf + i), mom));
            st16(buf + i, mk, b);
            d = k->nesterov ? _mm512_fmadd_ps(b, mom, d) : b;
        }
        st16(p + i, mk, _mm512_fmadd_ps(d, nlr, pp));
        if (k->zero_grad)
            st16(g + i, mk, _mm512_setzero_ps());
    }
}

DT_AVX512 static void lion_avx512(float *p, float *g, float *m, size_t n, const dt__lion_k *k)
{
    const __m512 b1 = _mm512_set1_ps(k->b1), omb1 = _mm512_set1_ps(k->omb1), b2 = _mm512_set1_ps(k->b2);
    const __m512 omb2 = _mm512_set1_ps(k->omb2), nlr = _mm512_set1_ps(k->neg_lr), dec = _mm512_set1_ps(k->decay);
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    const __m512i sgn = _mm512_set1_epi32((int)0x80000000u);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        const __m512 gi = ld16(mk, g + i), mi = ld16(mk, m + i);
        const __m512 c = _mm512_fmadd_ps(gi, omb1, _mm512_mul_ps(mi, b1));
        __m512 sg = _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(c), sgn),
                                                        _mm512_castps_si512(one)));
        sg = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, zero, _CMP_EQ_OQ), sg, zero);
        sg = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q), sg, c);
        st16(p + i, mk, _mm512_fmadd_ps(sg, nlr, _mm512_mul_ps(ld16(mk, p + i), dec)));
        st16(m + i, mk, _mm512_fmadd_ps(gi, omb2, _mm512_mul_ps(mi, b2)));
        if (k->zero_grad)
            st16(g + i, mk, zero);
    }
}

/* adam_one on 16 lanes, the moments loaded and stored under the mask. */
typedef struct {
    __m512 wd, decay, b1, omb1, b2, omb2, bc2s, eps, nss;
} adam_c16;

DT_AVX512 static inline adam_c16 adam_c16_of(const dt__adam_k *k)
{
    return (adam_c16){_mm512_set1_ps(k->wd),   _mm512_set1_ps(k->decay),    _mm512_set1_ps(k->b1),
                      _mm512_set1_ps(k->omb1), _mm512_set1_ps(k->b2),       _mm512_set1_ps(k->omb2),
                      _mm512_set1_ps(k->bc2_sqrt), _mm512_set1_ps(k->eps), _mm512_set1_ps(k->neg_step_size)};
}

DT_AVX512 static inline __m512 adam16(__mmask16 mk, __m512 pi, __m512 gi, float *m, float *v, const adam_c16 *c,
                                      const dt__adam_k *k)
{
    if (k->l2)
        gi = _mm512_fmadd_ps(pi, c->wd, gi);
    if (k->decoupled)
        pi = _mm512_mul_ps(pi, c->decay);
    __m512 mi = _mm512_fmadd_ps(gi, c->omb1, _mm512_mul_ps(ld16(mk, m), c->b1));
    __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(c->omb2, gi), gi, _mm512_mul_ps(ld16(mk, v), c->b2));
    __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c->bc2s), c->eps);
    st16(m, mk, mi);
    st16(v, mk, vi);
    return _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(c->nss, mi), denom));
}

DT_AVX512 static void adam_avx512(float *p, float *g, float *m, float *v, size_t n, const dt__adam_k *k)
{
    const adam_c16 c = adam_c16_of(k);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        pf_f32(p, i), pf_f32(g, i), pf_f32(m, i), pf_f32(v, i);
        st16(p + i, mk, adam16(mk, ld16(mk, p + i), ld16(mk, g + i), m + i, v + i, &c, k));
        if (k->zero_grad)
            st16(g + i, mk, _mm512_setzero_ps());
    }
}

/* One sweep of AdamW over bf16 grads: widen 16 grads, step the master and
 * the moments as adam_avx512 does, round the new master into the bf16
 * copy (the integer formula of dt_f32_to_bf16: the same bits on every
 * CPU), zero the grads; the last n % 16 elements as one masked block.
 * The copy is only written here, so where it is 32-byte aligned its whole
 * blocks go out as streaming stores (no read of the old lines; fenced
 * before return): GPT-2's step at B=4 T=64 on the Xeon with AMX, 2
 * threads, the optimizer 77.0 -> 72.4 ms, interleaved, 4 rounds. */
DT_AVX512 static void adam_bf16_avx512(float *p, uint16_t *g, float *m, float *v, uint16_t *copy, size_t n,
                                       const dt__adam_k *k)
{
    const adam_c16 c = adam_c16_of(k);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), q = _mm512_set1_epi32(0x40);
    const bool nt = copy && !((uintptr_t)copy & 31); /* whole blocks of the copy: streaming stores */
    for (size_t i = 0; i < n; i += 16) {
        const bool full = n - i >= 16;
        const __mmask16 mk = full ? (__mmask16)0xffff : tail_mask(n - i);
        pf_f32(p, i), pf_f32(m, i), pf_f32(v, i), pf_bf16(g, i);
        __m256i gh = full ? _mm256_loadu_si256((const __m256i *)(g + i)) : _mm256_maskz_loadu_epi16(mk, g + i);
        __m512 gi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(gh), 16));
        const __m512 pi = adam16(mk, ld16(mk, p + i), gi, m + i, v + i, &c, k);
        st16(p + i, mk, pi);
        if (copy) {
            const __m512i u = _mm512_castps_si512(pi);
            __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
            __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
            __m512i rn = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
            __m512i qn = _mm512_or_si512(_mm512_srli_epi32(u, 16), q);
            __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rn, nan, qn));
            if (full && nt)
                _mm256_stream_si256((__m256i *)(copy + i), h);
            else if (full)
                _mm256_storeu_si256((__m256i *)(copy + i), h);
            else
                _mm256_mask_storeu_epi16(copy + i, mk, h);
        }
        if (k->zero_grad) {
            if (full)
                _mm256_storeu_si256((__m256i *)(g + i), _mm256_setzero_si256());
            else
                _mm256_mask_storeu_epi16(g + i, mk, _mm256_setzero_si256());
        }
    }
    if (nt)
        _mm_sfence();
}

/* LAMB stage 1: the sum of u^2 keeps the other paths' pattern (lane i & 7 for
 * i below n rounded down to 8, in order; the rest in the scalar tail): each
 * 16-block adds its low 8 then its high 8 into one 8-lane double
 * accumulator, an 8-block left over runs masked, fewer than 8 go scalar. */
DT_AVX512 static double lamb1_avx512(const float *p, float *g, float *m, float *v, size_t n, const dt__lamb_k *k)
{
    const __m512 clip = _mm512_set1_ps(k->clip), decay = _mm512_set1_ps(k->decay);
    const __m512 b1 = _mm512_set1_ps(k->b1), b3 = _mm512_set1_ps(k->b3);
    const __m512 b2 = _mm512_set1_ps(k->b2), omb2 = _mm512_set1_ps(k->omb2);
    const __m512 bc1 = _mm512_set1_ps(k->bc1), bc2 = _mm512_set1_ps(k->bc2), eps = _mm512_set1_ps(k->eps);
    const bool use_p = k->decay != 0.0f;
    const size_t n8 = n & ~(size_t)7;
    __m512d acc = _mm512_setzero_pd();
    for (size_t i = 0; i < n8; i += 16) {
        const __mmask16 mk = n8 - i >= 16 ? (__mmask16)0xffff : (__mmask16)0x00ff;
        __m512 pi = use_p ? ld16(mk, p + i) : _mm512_setzero_ps();
        __m512 s = _mm512_div_ps(ld16(mk, g + i), clip);
        if (!k->adam_w_mode)
            s = _mm512_add_ps(s, _mm512_mul_ps(decay, pi));
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(ld16(mk, m + i), b1), _mm512_mul_ps(b3, s));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(ld16(mk, v + i), b2),
                                  _mm512_mul_ps(_mm512_mul_ps(omb2, s), s));
        __m512 mh = _mm512_div_ps(mi, bc1), vh = _mm512_div_ps(vi, bc2);
        __m512 u = _mm512_div_ps(mh, _mm512_add_ps(_mm512_sqrt_ps(vh), eps));
        if (k->adam_w_mode)
            u = _mm512_add_ps(u, _mm512_mul_ps(decay, pi));
        st16(g + i, mk, u);
        st16(m + i, mk, mi);
        st16(v + i, mk, vi);
        __m512d ulo = _mm512_cvtps_pd(_mm512_castps512_ps256(u));
        acc = _mm512_fmadd_pd(ulo, ulo, acc);
        if (mk == (__mmask16)0xffff) {
            __m512d uhi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(u), 1)));
            acc = _mm512_fmadd_pd(uhi, uhi, acc);
        }
    }
    double tail = 0;
    if (n8 < n)
        tail = lamb1_scalar(p + n8, g + n8, m + n8, v + n8, n - n8, k); /* < 8 elements: all in its tail */
    double a[8];
    _mm512_storeu_pd(a, acc);
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += a[j];
    return s + tail;
}

DT_AVX512 static void lamb2_avx512(float *p, float *u, size_t n, float ratio, bool zero_grad)
{
    const __m512 r = _mm512_set1_ps(ratio);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        __m512 ui = ld16(mk, u + i);
        st16(p + i, mk, _mm512_sub_ps(ld16(mk, p + i), _mm512_mul_ps(r, ui)));
        if (zero_grad)
            st16(u + i, mk, _mm512_setzero_ps());
    }
}

DT_AVX512 static void scale_avx512(float *x, size_t n, float s)
{
    const __m512 sv = _mm512_set1_ps(s);
    for (size_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        st16(x + i, mk, _mm512_mul_ps(ld16(mk, x + i), sv));
    }
}
#endif

/* ---- dispatch ---------------------------------------------------------------- */

void dt__optim_sgd(float *p, float *g, float *buf, size_t n, const dt__sgd_k *k)
{
#if DT_OPT_X86
    if (use_avx512()) {
        sgd_avx512(p, g, buf, n, k);
        return;
    }
    if (use_avx2()) {
        sgd_avx2(p, g, buf, n, k);
        return;
    }
#endif
    sgd_scalar(p, g, buf, n, k);
}

void dt__optim_adam(float *p, float *g, float *m, float *v, size_t n, const dt__adam_k *k)
{
#if DT_OPT_X86
    if (use_avx512()) {
        adam_avx512(p, g, m, v, n, k);
        return;
    }
    if (use_avx2()) {
        adam_avx2(p, g, m, v, n, k);
        return;
    }
#endif
    adam_scalar(p, g, m, v, n, k);
}

void dt__optim_lion(float *p, float *g, float *m, size_t n, const dt__lion_k *k)
{
#if DT_OPT_X86
    if (use_avx512()) {
        lion_avx512(p, g, m, n, k);
        return;
    }
    if (use_avx2()) {
        lion_avx2(p, g, m, n, k);
        return;
    }
#endif
    lion_scalar(p, g, m, n, k);
}

void dt__optim_adam_bf16(float *p, uint16_t *g, float *m, float *v, uint16_t *copy, size_t n, const dt__adam_k *k)
{
#if DT_OPT_X86
    if (use_avx512()) {
        adam_bf16_avx512(p, g, m, v, copy, n, k);
        return;
    }
    if (use_avx2()) {
        adam_bf16_avx2(p, g, m, v, copy, n, k);
        return;
    }
#endif
    adam_bf16_scalar(p, g, m, v, copy, n, k);
}

double dt__optim_lamb_stage1(const float *p, float *g, float *m, float *v, size_t n, const dt__lamb_k *k)
{
#if DT_OPT_X86
    if (use_avx512())
        return lamb1_avx512(p, g, m, v, n, k);
    if (use_avx2())
        return lamb1_avx2(p, g, m, v, n, k);
#endif
    return lamb1_scalar(p, g, m, v, n, k);
}

void dt__optim_lamb_stage2(float *p, float *u, size_t n, float ratio, bool zero_grad)
{
#if DT_OPT_X86
    if (use_avx512()) {
        lamb2_avx512(p, u, n, ratio, zero_grad);
        return;
    }
    if (use_avx2()) {
        lamb2_avx2(p, u, n, ratio, zero_grad);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) {
        p[i] = p[i] - ratio * u[i];
        if (zero_grad)
            u[i] = 0.0f;
    }
}

double dt__sqsum(const float *x, size_t n)
{
#if DT_OPT_X86
    if (use_avx2())
        return sqsum_avx2(x, n);
#endif
    return sqsum_scalar(x, n);
}

void dt__scale(float *x, size_t n, float s)
{
#if DT_OPT_X86
    if (use_avx512()) {
        scale_avx512(x, n, s);
        return;
    }
    if (use_avx2()) {
        scale_avx2(x, n, s);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}
