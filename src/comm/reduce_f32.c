/* The hot kernel of the shm backend: f32 sum/avg of W sources written to
 * one or more destinations in a single pass (the direct all-reduce reads
 * every rank's chunk once and writes the result to every rank's output).
 *
 * 32 floats are loaded from every source, added in source order (the same
 * order as dt__reduce, so the bits agree with the generic kernel), divided
 * by W for avg (a true division, as the reference does), and stored to each
 * destination. A destination may alias a source element for element:
 * everything for an element is loaded before anything is stored.
 *
 * Large messages use non-temporal stores (the result is not read again
 * soon, and streaming avoids reading every destination line before writing
 * it), followed by an sfence so the stores are visible before the rank
 * signals its peers. AVX2 when the CPU has it, SSE otherwise. */
#include "base/cpu_cached.h"
#include "comm/backend.h"

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static void f32_avx2(float *const *dst, int nd,
                                                     const float *const *src, int ns, size_t n,
                                                     int div, int nt)
{
    size_t i = 0;
    const __m256 dv = _mm256_set1_ps((float)div);
    /* streaming stores need 32-byte aligned destinations */
    if (nt)
        for (int d = 0; d < nd; d++)
            if (((uintptr_t)dst[d] & 31u) != ((uintptr_t)dst[0] & 31u))
                nt = 0;
    while (nt && i < n && ((uintptr_t)(dst[0] + i) & 31u)) {
        float a = src[0][i];
        for (int k = 1; k < ns; k++)
            a += src[k][i];
        if (div)
            a /= (float)div;
        for (int d = 0; d < nd; d++)
            dst[d][i] = a;
        i++;
    }
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_loadu_ps(src[0] + i), a1 = _mm256_loadu_ps(src[0] + i + 8);
        __m256 a2 = _mm256_loadu_ps(src[0] + i + 16), a3 = _mm256_loadu_ps(src[0] + i + 24);
        for (int k = 1; k < ns; k++) {
            const float *s = src[k] + i;
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s + 8));
            a2 = _mm256_add_ps(a2, _mm256_loadu_ps(s + 16));
            a3 = _mm256_add_ps(a3, _mm256_loadu_ps(s + 24));
        }
        if (div) {
            a0 = _mm256_div_ps(a0, dv);
            a1 = _mm256_div_ps(a1, dv);
            a2 = _mm256_div_ps(a2, dv);
            a3 = _mm256_div_ps(a3, dv);
        }
        for (int d = 0; d < nd; d++) {
            float *o = dst[d] + i;
            if (nt) {
                _mm256_stream_ps(o, a0);
                _mm256_stream_ps(o + 8, a1);
                _mm256_stream_ps(o + 16, a2);
                _mm256_stream_ps(o + 24, a3);
            } else {
                _mm256_storeu_ps(o, a0);
                _mm256_storeu_ps(o + 8, a1);
                _mm256_storeu_ps(o + 16, a2);
                _mm256_storeu_ps(o + 24, a3);
            }
        }
    }
    for (; i < n; i++) {
        float a = src[0][i];
        for (int k = 1; k < ns; k++)
            a += src[k][i];
        if (div)
            a /= (float)div;
        for (int d = 0; d < nd; d++)
            dst[d][i] = a;
    }
    if (nt)
        _mm_sfence();
}
#endif

static void f32_generic(float *const *dst, int nd, const float *const *src, int ns, size_t n,
                        int div)
{
    for (size_t i = 0; i < n; i++) {
        float a = src[0][i];
        for (int k = 1; k < ns; k++)
            a += src[k][i];
        if (div)
            a /= (float)div;
        for (int d = 0; d < nd; d++)
            dst[d][i] = a;
    }
}

void dt__reduce_f32_multi(float *const *dst, int nd, const float *const *src, int ns, size_t n,
                          int div, int nt)
{
#if defined(__x86_64__)
    if (dt__cpu_avx2()) {
        f32_avx2(dst, nd, src, ns, n, div, nt);
        return;
    }
#endif
    (void)nt;
    f32_generic(dst, nd, src, ns, n, div);
}
