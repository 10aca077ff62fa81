/* src/kernels/amx_tiles.h — the tile operations dtrain's AMX bf16 GEMM is
 * written against, and the two implementations of them.
 *
 * The GEMM's driver (gemm_amx.c: packing, blocking, tile configuration,
 * edge tiles, threading, epilogue) and the attention's tile products
 * (attention.c) call a dt__amx_tiles vtable. Three fill it:
 *  - amx_hw.c: the real instructions (ldtilecfg, tileloadd, tdpbf16ps,
 *    tilestored, tilerelease), compiled with target("amx-tile,amx-bf16")
 *    and used only where the CPU has AMX-TILE and AMX-BF16, the OS saves
 *    the tile state (XCR0 bits 17 and 18) and Linux granted the process the
 *    tile data (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
 *  - amx_emul.c: a portable C model of the same instructions, exact to the
 *    architecture's pseudocode, that also checks every operation's
 *    preconditions (where the hardware raises #UD it counts a fault), so the
 *    driver is tested on every CPU. It is for tests only: the matmul
 *    dispatch never selects it;
 *  - amx_vdp.c: the same block on AVX512_BF16's vdpbf16ps, for CPUs with it
 *    but no AMX (no tile state: the configuration is kept per thread for
 *    the block's edges). The attention runs its products on it there; the
 *    matmul dispatch keeps oneDNN (its avx512_core_bf16 kernels measured
 *    faster on a training step's weight and input gradients).
 *
 * The micro-kernel (amx_ukernel.h) is one source text compiled twice, once
 * over each of the first two implementations' tile macros, so the code that
 * runs on AMX is the code the tests run; amx_vdp.c has its own block (the
 * tests run it on CPUs with AVX512_BF16).
 *
 * Tile use (palette 1: 8 tiles of up to 16 rows x 64 bytes):
 *   tmm0..3  C, f32, 2 x 2 tiles of up to 16 x 16 (an output block of up to
 *            32 x 32); rows and colsb shrink at the matrix edges
 *   tmm4..5  A, bf16, up to 16 rows x 32 values (64 bytes) of a K step,
 *            loaded with the rows' own stride
 *   tmm6..7  B in the VNNI pair layout: 16 rows of up to 16 pairs
 *            (row r holds B[2r][n], B[2r+1][n] for each column n) */
#ifndef DT_KERNELS_AMX_TILES_H
#define DT_KERNELS_AMX_TILES_H

#include <stdbool.h>
#include <stdint.h>

/* The 64-byte operand of ldtilecfg (palette 1). */
typedef struct {
    uint8_t palette;     /* 1 (0 = release all tiles) */
    uint8_t start_row;   /* 0: restart of an interrupted load/store */
    uint8_t reserved[14];
    uint16_t colsb[16];  /* bytes per row of tile i (only 0..7 exist) */
    uint8_t rows[16];    /* rows of tile i (0 = tile unused) */
} dt__amx_cfg;
_Static_assert(sizeof(dt__amx_cfg) == 64, "ldtilecfg reads 64 bytes");

/* Packed-panel geometry shared by the driver and the micro-kernel: a K step
 * is 32 bf16 values (one A tile row of 64 bytes, 16 B tile rows of pairs);
 * a tile of either operand occupies TILE_ELEMS bf16 values in a panel. */
#define DT__AMX_KSTEP 32
#define DT__AMX_TILE_ELEMS 512 /* 16 x 32 bf16 = 1 KiB */

/* One implementation of the tile operations. Every slot is required. */
typedef struct dt__amx_tiles {
    const char *name;                           /* "amx", "emulated" or "avx512_bf16" */
    void (*load_config)(const dt__amx_cfg *cfg); /* ldtilecfg: zeroes every tile */
    void (*release)(void);                       /* tilerelease: back to the init state */
    /* The micro-kernel over this implementation (amx_ukernel.h): the
     * C block at c (2 x 2 tiles of 16 x 16 floats, rows ldc floats apart)
     * = (acc_in ? c : 0) + the sum over kb K steps of A tiles (read in place
     * from a, rows lda values apart, 32 values a step) times B tiles (pb, a
     * packed panel, 2 tiles a step). two_m / two_n: whether tile row /
     * column 1 of the 2 x 2 block is in use (the configuration has those
     * tiles). pf (or NULL): pfn rows of A, lda apart, whose first kb K
     * steps to prefetch into L2 along the way (a hint: no result changes). */
    void (*block)(const uint16_t *a, int64_t lda, const uint16_t *pb, int64_t kb, bool two_m, bool two_n,
                  float *c, int64_t ldc, bool acc_in, const uint16_t *pf, int pfn);
} dt__amx_tiles;

/* The real instructions, or NULL where they cannot run (no AMX-TILE or
 * AMX-BF16, no OS support, the permission refused, or not x86-64 gcc);
 * *why (if not NULL) then says which. Probed once per process. */
const dt__amx_tiles *dt__amx_tiles_hw(const char **why);

/* The same operations on AVX512_BF16's vdpbf16ps (amx_vdp.c: no tiles; the
 * configuration is kept per thread for the block's edges), or NULL where
 * the CPU lacks AVX512_BF16 (DT_MAX_CPU_ISA below avx512_bf16 included) or
 * the build cannot target it; *why (if not NULL) says which. */
const dt__amx_tiles *dt__amx_tiles_vdp(const char **why);

/* The portable model (tests only). */
const dt__amx_tiles *dt__amx_tiles_emul(void);

/* The model's checks, for tests: faults counts operations that would raise
 * #UD on hardware (a tile used while unconfigured or not configured in the
 * current palette, shapes of tdpbf16ps that do not agree, a bad
 * configuration) since process start; live counts threads whose tiles are
 * configured now (each configure from the init state adds one, each
 * release subtracts one); configured says whether the calling thread's
 * tiles are configured; loads counts ldtilecfg calls. */
typedef struct {
    uint64_t faults, loads;
    int64_t live;
} dt__amx_emul_stats;
void dt__amx_emul_stats_get(dt__amx_emul_stats *out);
bool dt__amx_emul_thread_configured(void);
/* Direct tile operations of the model for the tests of its checks. */
void dt__amx_emul_tile_zero(int t);
void dt__amx_emul_tile_dp(int c, int a, int b);

/* One tdpbf16ps step on scalars, as the model computes it: acc + a0 b0,
 * rounded, + a1 b1, rounded (bf16 inputs as raw bits, denormal inputs read
 * as zero, denormal sums flushed to zero). Exposed for the tests'
 * reference. */
float dt__amx_emul_dp_pair(float acc, uint16_t a0, uint16_t b0, uint16_t a1, uint16_t b1);

#endif
