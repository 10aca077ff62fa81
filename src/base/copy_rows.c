/* The strided row copy (copy.h).
 *
 * The AVX2 path moves the first 32 bytes of a row, then from the
 * destination's next 32-byte boundary in 128-byte steps (four unaligned
 * 32-byte loads, then four aligned stores: no store splits a cache line),
 * then 32-byte steps, and ends the row with one 32-byte move that overlaps
 * the previous one (rows of at least 32 bytes),
 * so a row of 512 bytes is 4 iterations and no tail loop. Rows under 32
 * bytes take 16/8/4/2/1-byte moves (fixed-size memcpy: single
 * instructions). A row of up to 32 bytes repeated 4096 times is a loop
 * of a few instructions, against a libc call per row before. */
#include "base/copy.h"
#include "base/cpu_cached.h"

#include <stdint.h>
#include <string.h>

/* Rows under 32 bytes: the largest fixed-size moves that fit. */
static inline void small_row(char *d, const char *s, size_t n)
{
    while (n >= 16) {
        memcpy(d, s, 16);
        d += 16, s += 16, n -= 16;
    }
    if (n >= 8) {
        memcpy(d, s, 8);
        d += 8, s += 8, n -= 8;
    }
    if (n >= 4) {
        memcpy(d, s, 4);
        d += 4, s += 4, n -= 4;
    }
    if (n >= 2) {
        memcpy(d, s, 2);
        d += 2, s += 2, n -= 2;
    }
    if (n)
        *d = *s;
}

#if defined(__x86_64__)
#include <immintrin.h>

/* One row of at least 32 bytes. */
__attribute__((target("avx2"))) static inline void row_avx2(char *dst, const char *src, size_t bytes)
{
    /* the first 32 bytes unaligned, then from the next 32-byte boundary of
     * the destination: no store splits a cache line */
    _mm256_storeu_si256((__m256i *)(void *)dst, _mm256_loadu_si256((const __m256i *)(const void *)src));
    size_t i = (32 - ((uintptr_t)dst & 31u)) & 31u;
    for (; i + 128 <= bytes; i += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(src + i + 96));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), a);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i + 32), b);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i + 64), c);
        _mm256_storeu_si256((__m256i *)(void *)(dst + i + 96), e);
    }
    for (; i + 32 <= bytes; i += 32)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            _mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
    if (i < bytes) /* the last 32 bytes of the row, overlapping what is done */
        _mm256_storeu_si256((__m256i *)(void *)(dst + bytes - 32),
                            _mm256_loadu_si256((const __m256i *)(const void *)(src + bytes - 32)));
}

__attribute__((target("avx2"))) static void rows_avx2(char *const *dst, size_t dstride,
                                                      const char *const *src, size_t sstride, int n,
                                                      size_t rows, size_t bytes)
{
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            char *d = dst[j] + r * dstride;
            const char *s = src[j] + r * sstride;
            if (bytes < 32)
                small_row(d, s, bytes);
            else
                row_avx2(d, s, bytes);
        }
}
#endif

void dt__copy_rows_multi(void *const *dst, size_t dstride, const void *const *src, size_t sstride,
                         int n, size_t rows, size_t bytes)
{
    if (!rows || !bytes || n < 1)
        return;
    if (n == 1 && (rows == 1 || (dstride == bytes && sstride == bytes))) {
        memcpy(dst[0], src[0], rows * bytes);
        return;
    }
#if defined(__x86_64__)
    if (dt__cpu_avx2()) {
        rows_avx2((char *const *)dst, dstride, (const char *const *)src, sstride, n, rows, bytes);
        return;
    }
#endif
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            char *d = (char *)dst[j] + r * dstride;
            const char *s = (const char *)src[j] + r * sstride;
            if (bytes < 32)
                small_row(d, s, bytes);
            else
                memcpy(d, s, bytes);
        }
}

void dt__copy_rows(void *dst, size_t dstride, const void *src, size_t sstride, size_t rows,
                   size_t bytes)
{
    dt__copy_rows_multi(&dst, dstride, &src, sstride, 1, rows, bytes);
}
