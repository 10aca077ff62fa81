/* CPU feature detection through cpuid and xgetbv (the OS must have enabled
 * the AVX and AVX-512 register state for the features to count). */
#include "dtrain/base.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

dt_cpu_features dt_cpu_detect(void)
{
    dt_cpu_features f;
    memset(&f, 0, sizeof f);
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return f;
    bool osxsave = (c >> 27) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    f.fma = ymm && ((c >> 12) & 1);
    f.f16c = ymm && ((c >> 29) & 1);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = ymm && ((b >> 5) & 1);
        f.avx512f = zmm && ((b >> 16) & 1);
        f.avx512bw = zmm && ((b >> 30) & 1);
        f.avx512vl = zmm && ((b >> 31) & 1);
        f.avx512_fp16 = zmm && ((d >> 23) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512_bf16 = zmm && ((a >> 5) & 1);
#endif
    return f;
}

char *dt_cpu_features_str(dt_cpu_features f, char *buf, size_t n)
{
    if (!buf || !n)
        return buf;
    buf[0] = '\0';
    size_t len = 0;
#define ADD(flag, name)                                                   \
    if (f.flag && len < n)                                                \
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? " " : "", name);
    ADD(avx2, "avx2")
    ADD(fma, "fma")
    ADD(f16c, "f16c")
    ADD(avx512f, "avx512f")
    ADD(avx512bw, "avx512bw")
    ADD(avx512vl, "avx512vl")
    ADD(avx512_bf16, "avx512_bf16")
    ADD(avx512_fp16, "avx512_fp16")
#undef ADD
    if (len == 0)
        snprintf(buf, n, "(none)");
    return buf;
}
