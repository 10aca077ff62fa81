/* The AMX tile operations on the real instructions (amx_tiles.h).
 *
 * Usable only when all of these hold, probed once per process:
 *  - CPUID leaf 7 subleaf 0 reports AMX-TILE (EDX bit 24) and AMX-BF16
 *    (EDX bit 22), and dt_cpu_detect() keeps them (DT_MAX_CPU_ISA=avx512
 *    or lower switches AMX off);
 *  - the OS saves the tile state: XCR0 bits 17 (XTILECFG) and 18
 *    (XTILEDATA);
 *  - Linux grants this process the tile data: arch_prctl(ARCH_REQ_XCOMP_PERM,
 *    XFEATURE_XTILEDATA) returns 0 (kernel 5.16 and later; the permission
 *    covers every thread of the process, present and future).
 *
 * gcc's tile intrinsics are asm statements that name no memory: a barrier
 * before each load and after each store keeps the compiler from moving the
 * packing stores past a load or the epilogue's reads before a store. */
#include "kernels/amx_tiles.h"

#include "dtrain/base.h"

#include <pthread.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define DT__AMX_HW 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define DT__AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define BARRIER() __asm__ volatile("" ::: "memory")

DT__AMX_TARGET static void hw_load_config(const dt__amx_cfg *cfg)
{
    BARRIER();
    _tile_loadconfig(cfg);
}

DT__AMX_TARGET static void hw_release(void) { _tile_release(); }

#define DT__T_ZERO(t) _tile_zero(t)
#define DT__T_LOAD(t, p, ld)                                                                       \
    do {                                                                                           \
        BARRIER();                                                                                 \
        _tile_loadd(t, p, ld);                                                                     \
    } while (0)
/* B tiles with the streaming hint (tileloaddt1): a B panel's chunk is read
 * once a block from L2, so it need not push the block's A rows, reused
 * across the macro block's panels, out of L1 (a 2048 x 2304 x 768 product
 * 925-937 -> 948-1001 GFLOP/s on one core of a Xeon with AMX). */
#define DT__T_LOADB(t, p, ld)                                                                      \
    do {                                                                                           \
        BARRIER();                                                                                 \
        _tile_stream_loadd(t, p, ld);                                                              \
    } while (0)
#define DT__T_DP(c, a, b) _tile_dpbf16ps(c, a, b)
#define DT__T_STORE(t, p, ld)                                                                      \
    do {                                                                                           \
        _tile_stored(t, p, ld);                                                                    \
        BARRIER();                                                                                 \
    } while (0)
#define DT__UK_ATTR DT__AMX_TARGET
#define DT__UK_NAME hw_block
#include "kernels/amx_ukernel.h"

static const dt__amx_tiles g_hw = {
    .name = "amx",
    .load_config = hw_load_config,
    .release = hw_release,
    .block = hw_block,
};
#else
#define DT__AMX_HW 0
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static const dt__amx_tiles *g_ops;
static const char *g_why = "not probed";

static void probe(void)
{
#if DT__AMX_HW
    dt_cpu_features hw = dt_cpu_detect_hw(), f = dt_cpu_detect();
    if (!hw.amx_tile || !hw.amx_bf16) {
        g_why = "the CPU has no AMX-TILE/AMX-BF16 (or the OS does not save the tile state)";
        return;
    }
    if (!f.amx_tile || !f.amx_bf16) {
        g_why = "switched off by DT_MAX_CPU_ISA (avx512 or lower)";
        return;
    }
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        g_why = "Linux refused the tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM; kernel 5.16 or "
                "later needed)";
        return;
    }
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits) != 0 || !(bits & (1ul << XFEATURE_XTILEDATA))) {
        g_why = "Linux did not grant the tile data permission (arch_prctl ARCH_GET_XCOMP_PERM)";
        return;
    }
    g_ops = &g_hw;
    g_why = "active";
#else
    g_why = "not built for AMX (needs gcc on x86-64 Linux)";
#endif
}

const dt__amx_tiles *dt__amx_tiles_hw(const char **why)
{
    pthread_once(&g_once, probe);
    if (why)
        *why = g_why;
    return g_ops;
}
