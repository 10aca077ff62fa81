/* CPU feature detection through cpuid and xgetbv (the OS must have enabled
 * the AVX and AVX-512 register state for the features to count), capped by
 * DT_MAX_CPU_ISA so that a machine with AMX can run the code paths of an
 * AVX-512 one, and one with AVX-512 those of an AVX2 (or a plain x86-64) machine: every SIMD path dtrain picks at run time
 * asks dt_cpu_detect(), so the cap reaches all of them. */
#include "base/cpu_cached.h"
#include "dtrain/base.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

dt_cpu_features dt_cpu_detect_hw(void)
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
        /* AMX: XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA) say the OS saves the tiles */
        bool tiles = (xcr0 & 0x60000) == 0x60000;
        f.amx_tile = tiles && ((d >> 24) & 1);
        f.amx_bf16 = tiles && ((d >> 22) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512_bf16 = zmm && ((a >> 5) & 1);
#endif
    return f;
}

char *dt_cpu_model_str(char *buf, size_t n)
{
    if (!buf || !n)
        return buf;
    char name[49] = "";
    int fam = -1, model = -1, step = -1;
#if defined(__x86_64__) || defined(__i386__)
    unsigned r[12], a, b, c, d;
    if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
        for (unsigned k = 0; k < 3; k++)
            __get_cpuid(0x80000002 + k, &r[4 * k], &r[4 * k + 1], &r[4 * k + 2], &r[4 * k + 3]);
        memcpy(name, r, 48);
        name[48] = 0;
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) { /* the displayed family and model, as the kernel's cpuinfo */
        fam = (int)((a >> 8) & 0xf), model = (int)((a >> 4) & 0xf), step = (int)(a & 0xf);
        if (fam == 0xf)
            fam += (int)((a >> 20) & 0xff);
        if (fam >= 6)
            model |= (int)((a >> 16) & 0xf) << 4;
    }
#endif
    const char *p = name; /* the brand string is padded with spaces (and NULs) */
    while (*p == ' ')
        p++;
    size_t len = strlen(p);
    while (len && p[len - 1] == ' ')
        len--;
    int ncpu = 0;
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        ncpu = CPU_COUNT(&set);
#endif
    int k = snprintf(buf, n, "%.*s", len ? (int)len : 7, len ? p : "unknown");
    if (fam >= 0 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " (family %d, model %d, stepping %d)", fam, model, step);
    if (ncpu > 0 && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ", %d CPU%s", ncpu, ncpu == 1 ? "" : "s");
    return buf;
}

/* -1 = not probed yet (cpu_cached.h): dt_cpu_detect()'s avx2 */
static _Atomic int g_avx2 = -1;

int dt__cpu_avx2(void)
{
    int v = atomic_load_explicit(&g_avx2, memory_order_relaxed);
    if (v < 0) {
        v = dt_cpu_detect().avx2;
        atomic_store_explicit(&g_avx2, v, memory_order_relaxed);
    }
    return v;
}

/* -1 = not read yet; else a dt_cpu_isa_cap value */
static _Atomic int g_cap = -1;

dt_cpu_isa_cap dt_cpu_max_isa(void)
{
    int c = atomic_load(&g_cap);
    if (c >= 0)
        return (dt_cpu_isa_cap)c;
    const char *e = getenv("DT_MAX_CPU_ISA");
    c = DT_CPU_ISA_ALL;
    if (e && *e) {
        if (!strcasecmp(e, "scalar") || !strcasecmp(e, "none") || !strcasecmp(e, "sse4.1") ||
            !strcasecmp(e, "sse41"))
            c = DT_CPU_ISA_SCALAR;
        else if (!strcasecmp(e, "avx2"))
            c = DT_CPU_ISA_AVX2;
        else if (!strcasecmp(e, "avx512"))
            c = DT_CPU_ISA_AVX512;
        else if (!strcasecmp(e, "amx") || !strcasecmp(e, "all"))
            c = DT_CPU_ISA_ALL;
        else
            dt_log(DT_LOG_WARN, "DT_MAX_CPU_ISA=%s is not one of scalar, avx2, avx512, amx, all; ignored (no cap)",
                   e);
    }
    atomic_store(&g_cap, c);
    return (dt_cpu_isa_cap)c;
}

const char *dt_cpu_isa_cap_name(dt_cpu_isa_cap cap)
{
    switch (cap) {
    case DT_CPU_ISA_SCALAR: return "scalar";
    case DT_CPU_ISA_AVX2: return "avx2";
    case DT_CPU_ISA_AVX512: return "avx512";
    case DT_CPU_ISA_ALL: return "all";
    }
    return "?";
}

dt_cpu_features dt_cpu_detect(void)
{
    dt_cpu_features f = dt_cpu_detect_hw();
    dt_cpu_isa_cap cap = dt_cpu_max_isa();
    if (cap <= DT_CPU_ISA_AVX512)
        f.amx_tile = f.amx_bf16 = false;
    if (cap <= DT_CPU_ISA_AVX2)
        f.avx512f = f.avx512bw = f.avx512vl = f.avx512_bf16 = f.avx512_fp16 = false;
    if (cap <= DT_CPU_ISA_SCALAR)
        f.avx2 = f.fma = f.f16c = false;
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
    ADD(amx_tile, "amx_tile")
    ADD(amx_bf16, "amx_bf16")
#undef ADD
    if (len == 0)
        snprintf(buf, n, "(none)");
    return buf;
}
