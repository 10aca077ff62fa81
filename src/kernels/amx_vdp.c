/* The tile operations (amx_tiles.h) on AVX512_BF16's vdpbf16ps, for CPUs
 * with it but no AMX: the block slot, which the attention's products
 * (attention.c) and the GEMM driver (gemm_amx.c) are written against, over
 * vector registers instead of tiles.
 *
 * Where it runs. The attention's six products of a bf16 qkv from 96
 * tokens on (attention.c, VDP_MIN_T): GPT-2's attention at B=8 T=256 took
 * 23.6-23.9 ms forward and backward a layer against 33.9-37.6 on the
 * avx512_bf16 rows (2 threads, AMD EPYC). Not dt_k_matmul: the GEMM driver
 * over this block ran GPT-2's forward products (K = 768) 2-5% faster than
 * oneDNN 2.6's avx512_core_bf16 kernels but its input and weight gradients
 * 5-40% slower (the driver's blocking is the AMX tiles': partial sums and
 * A^T's copies through memory), and the bf16 step at B=8 T=256 8-19% slower
 * with all of them here; the tests run the driver over it all the same
 * (tests/kernels/test_amx_gemm.c "vdp").
 *
 * The driver's unit of work is the micro-kernel's: a C block of up to
 * 32 x 32 f32 = (acc_in ? C : 0) + the A rows (read in place, 32 values a
 * K step) times a packed B panel (per K step two 16 x 16 tiles in the VNNI
 * pair layout, 1 KiB each). A B tile row of pairs is exactly vdpbf16ps'
 * second operand (lane n: B[2r][n], B[2r+1][n]) and an A pair broadcast
 * to every lane its first, so one instruction adds one A row's pair times
 * 16 columns, as tdpbf16ps does for each row of a tile.
 *
 * Registers. The 32 rows of a block run in passes of up to ROWS rows, each
 * over all the block's K steps with ROWS x 2 accumulators (the block's 32
 * columns as two zmm), the two B rows of a pair loaded once per pair and
 * each row's A pair broadcast from memory; the B panel is re-read from the
 * caches once per pass.
 *
 * Configuration. There are no tiles: load_config keeps the driver's
 * configuration in a thread-local copy (the C tiles' rows and columns at
 * the matrix edges) and release clears it, so the driver runs unchanged;
 * the block takes its rows and columns from that copy, and edge columns
 * are masked on load and store (the padded panel supplies zeros for the
 * rest, which are computed and dropped).
 *
 * Numerics. vdpbf16ps adds a pair's two products into each lane with the
 * instruction's own rounding (DAZ inputs, FTZ result, round to nearest
 * even, MXCSR not consulted), as tdpbf16ps; the tests hold it to the same
 * bounds as the AMX instructions (tests/kernels/test_amx_gemm.c,
 * tests/kernels/test_attention_bf16.c).
 *
 * The kernel itself, one thread, a 32 x 32 block over 24 K steps with A
 * and B in L1: 482 GFLOP/s, 96% of the core's vdpbf16ps limit (488,
 * bench/isa_peak); over 8 panels of B in L2: 471. */
#include "kernels/amx_tiles.h"

#include "dtrain/base.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define DT__VDP 1
#include <immintrin.h>

#define VDP_TARGET __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

static _Thread_local dt__amx_cfg g_cfg;

static void vdp_load_config(const dt__amx_cfg *cfg) { g_cfg = *cfg; }

static void vdp_release(void) { memset(&g_cfg, 0, sizeof g_cfg); }

/* Rows a pass keeps in registers: ROWS x 2 accumulators, 2 B rows, a broadcast. */
#define ROWS 12

/* One pass: rows [0, R) of the block at a / c (R <= ROWS), every K step. */
VDP_TARGET static inline __attribute__((always_inline)) void
vdp_pass(const int R, const uint16_t *a, int64_t lda, const uint16_t *pb, int64_t kb, float *c, int64_t ldc,
         bool acc_in, __mmask16 m0, __mmask16 m1, const uint16_t *pf, int pfn)
{
    __m512 acc0[ROWS], acc1[ROWS];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        acc0[r] = acc_in ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
        acc1[r] = acc_in ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
    }
    /* row r's pair p of a K step at a0 + r lda + 4 p bytes, written from two
     * bases (rows 0 and 3) and the strides lda and 3 lda; gcc 12 still keeps
     * a pointer a row and a broadcast load each, but this form measured
     * faster than a + r lda + 2 p (one thread, 3 interleaved runs: 481-486
     * against 461-472 GFLOP/s in L1, 463-485 against 418-444 over 8 B
     * panels in L2) */
    const int64_t ld = 2 * lda, ld3 = 3 * ld;
    const char *a0 = (const char *)a, *a3 = a0 + ld3;
    for (int64_t k = 0; k < kb; k++, a0 += 2 * DT__AMX_KSTEP, a3 += 2 * DT__AMX_KSTEP) {
        const uint16_t *b = pb + k * 2 * DT__AMX_TILE_ELEMS;
        for (int i = 0; i < pfn; i++)
            __builtin_prefetch(pf + i * lda + k * DT__AMX_KSTEP, 0, 2);
#pragma GCC unroll 16
        for (int p = 0; p < 16; p++) {
            const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + 32 * p);
            const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + DT__AMX_TILE_ELEMS + 32 * p);
#pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                const char *q = (r < 3 ? a0 : r < 6 ? a3 : r < 9 ? a3 + ld3 : a3 + 2 * ld3) + (r % 3) * ld;
                int32_t pair;
                memcpy(&pair, q + 4 * p, 4);
                const __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
                acc0[r] = _mm512_dpbf16_ps(acc0[r], b0, av);
                acc1[r] = _mm512_dpbf16_ps(acc1[r], b1, av);
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
        _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
    }
}

VDP_TARGET static void vdp_pass_n(int R, const uint16_t *a, int64_t lda, const uint16_t *pb, int64_t kb, float *c,
                                  int64_t ldc, bool acc_in, __mmask16 m0, __mmask16 m1, const uint16_t *pf, int pfn)
{
    switch (R) { /* a constant row count per case: the accumulators stay in registers */
#define VDP_CASE(n)                                                                                                   \
    case n:                                                                                                           \
        vdp_pass(n, a, lda, pb, kb, c, ldc, acc_in, m0, m1, pf, pfn);                                                 \
        break;
        VDP_CASE(1) VDP_CASE(2) VDP_CASE(3) VDP_CASE(4) VDP_CASE(5) VDP_CASE(6) VDP_CASE(7) VDP_CASE(8)
        VDP_CASE(9) VDP_CASE(10) VDP_CASE(11) VDP_CASE(12)
#undef VDP_CASE
    default:
        break;
    }
}

static __mmask16 cols_mask(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

VDP_TARGET static void vdp_block(const uint16_t *a, int64_t lda, const uint16_t *pb, int64_t kb, bool two_m,
                                 bool two_n, float *c, int64_t ldc, bool acc_in, const uint16_t *pf, int pfn)
{
    /* the C tiles' shapes as the driver configured them: tile 0 (and 2) rows, tile 0 (and 1) columns */
    const int rows = g_cfg.rows[0] + (two_m ? g_cfg.rows[2] : 0);
    const __mmask16 m0 = cols_mask(g_cfg.colsb[0] / 4), m1 = two_n ? cols_mask(g_cfg.colsb[1] / 4) : 0;
    for (int r = 0; r < rows; r += ROWS) {
        const int n = rows - r < ROWS ? rows - r : ROWS;
        vdp_pass_n(n, a + r * lda, lda, pb, kb, c + r * ldc, ldc, acc_in, m0, m1, r == 0 ? pf : NULL,
                   r == 0 ? pfn : 0);
    }
}

static const dt__amx_tiles g_vdp = {
    .name = "avx512_bf16",
    .load_config = vdp_load_config,
    .release = vdp_release,
    .block = vdp_block,
};
#else
#define DT__VDP 0
#endif

const dt__amx_tiles *dt__amx_tiles_vdp(const char **why)
{
#if DT__VDP
    dt_cpu_features f = dt_cpu_detect();
    if (f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16) {
        if (why)
            *why = "active";
        return &g_vdp;
    }
    if (why)
        *why = "the CPU has no AVX512_BF16 (or DT_MAX_CPU_ISA caps it)";
    return NULL;
#else
    if (why)
        *why = "not built for AVX512_BF16 (needs gcc or clang on x86-64)";
    return NULL;
#endif
}
