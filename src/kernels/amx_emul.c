/* A portable model of the AMX tile operations the bf16 GEMM uses, for
 * testing its driver on CPUs without AMX (amx_tiles.h).
 *
 * State is per thread, as the hardware's: a configuration (rows and bytes
 * per row of each of the 8 tiles) and 8 tiles of 16 rows x 64 bytes.
 * ldtilecfg zeroes every tile; tilerelease returns to the init state
 * (nothing configured). Every operation checks what the hardware checks
 * before it runs (#UD on a tile used while unconfigured, a tile with no
 * rows in the configuration, tdpbf16ps shapes that disagree; #GP on a bad
 * configuration) and counts a fault instead of running.
 *
 * tdpbf16ps follows the Intel SDM's pseudocode exactly:
 *
 *   for m < dst.rows, for k < a.colsb / 4, for n < dst.colsb / 4:
 *       tmp[n] += f32(a[m].bf16[2k])   * f32(b[k].bf16[2n])
 *       tmp[n] += f32(a[m].bf16[2k+1]) * f32(b[k].bf16[2n+1])
 *
 * with the instruction's fixed numerics (MXCSR is not consulted): bf16
 * inputs that are denormal read as zero (DAZ), each sum is rounded to
 * nearest even and a denormal sum flushes to zero of its sign (FTZ). The
 * product of two bf16 values has at most 16 significant bits, so it is
 * exact in f32 unless it overflows or falls below the normal range; each
 * pair therefore adds two exactly-known terms with one rounding each, and
 * whether the compiler contracts a product and its sum into an FMA does
 * not change the result. Real hardware may add a pair's two products
 * before rounding once (the SDM leaves the internal order of the pair to
 * the implementation); the tests hold both to the same error bound. */
#include "kernels/amx_tiles.h"

#include <stdatomic.h>
#include <string.h>

typedef struct {
    bool configured;
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t data[8][16][64];
} emul_state;

static _Thread_local emul_state g_tiles;
static atomic_ullong g_faults, g_loads;
static atomic_llong g_live;

static void fault(void) { atomic_fetch_add(&g_faults, 1); }

/* Whether tile t may be used now (configured, in range, has rows). */
static bool usable(int t)
{
    if (!g_tiles.configured || t < 0 || t > 7 || !g_tiles.rows[t] || !g_tiles.colsb[t]) {
        fault();
        return false;
    }
    return true;
}

static void emul_release(void)
{
    if (g_tiles.configured)
        atomic_fetch_sub(&g_live, 1);
    memset(&g_tiles, 0, sizeof g_tiles);
}

static void emul_load_config(const dt__amx_cfg *cfg)
{
    atomic_fetch_add(&g_loads, 1);
    if (cfg->palette == 0) { /* palette 0: the init state */
        emul_release();
        return;
    }
    bool bad = cfg->palette != 1 || cfg->start_row != 0;
    for (int i = 0; i < 14; i++)
        bad |= cfg->reserved[i] != 0;
    for (int t = 0; t < 16; t++) {
        bad |= cfg->rows[t] > 16 || cfg->colsb[t] > 64 || (cfg->colsb[t] & 3) != 0;
        if (t >= 8)
            bad |= cfg->rows[t] != 0 || cfg->colsb[t] != 0;
        bad |= (cfg->rows[t] == 0) != (cfg->colsb[t] == 0);
    }
    if (bad) { /* #GP: the state is unchanged */
        fault();
        return;
    }
    if (!g_tiles.configured)
        atomic_fetch_add(&g_live, 1);
    memset(&g_tiles, 0, sizeof g_tiles);
    g_tiles.configured = true;
    for (int t = 0; t < 8; t++) {
        g_tiles.rows[t] = cfg->rows[t];
        g_tiles.colsb[t] = cfg->colsb[t];
    }
}

void dt__amx_emul_tile_zero(int t)
{
    if (usable(t))
        memset(g_tiles.data[t], 0, sizeof g_tiles.data[t]);
}

/* tileloadd: the configured rows and bytes; the rest of the tile zeroed. */
static void tile_load(int t, const void *p, int64_t ld)
{
    if (!usable(t))
        return;
    memset(g_tiles.data[t], 0, sizeof g_tiles.data[t]);
    for (int r = 0; r < g_tiles.rows[t]; r++)
        memcpy(g_tiles.data[t][r], (const uint8_t *)p + r * ld, g_tiles.colsb[t]);
}

static void tile_store(int t, void *p, int64_t ld)
{
    if (!usable(t))
        return;
    for (int r = 0; r < g_tiles.rows[t]; r++)
        memcpy((uint8_t *)p + r * ld, g_tiles.data[t][r], g_tiles.colsb[t]);
}

static float bf16_daz(uint16_t h)
{
    if ((h & 0x7f80) == 0) /* zero or denormal: DAZ */
        h &= 0x8000;
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float ftz(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0)
        u &= 0x80000000u;
    memcpy(&x, &u, 4);
    return x;
}

float dt__amx_emul_dp_pair(float acc, uint16_t a0, uint16_t b0, uint16_t a1, uint16_t b1)
{
    acc = ftz(acc + bf16_daz(a0) * bf16_daz(b0));
    return ftz(acc + bf16_daz(a1) * bf16_daz(b1));
}

void dt__amx_emul_tile_dp(int c, int a, int b)
{
    if (!usable(c) || !usable(a) || !usable(b))
        return;
    const uint8_t *rows = g_tiles.rows;
    const uint16_t *colsb = g_tiles.colsb;
    /* the shape checks of tdpbf16ps (#UD), and distinct registers */
    if (rows[c] != rows[a] || colsb[a] / 4 != rows[b] || colsb[c] != colsb[b] || (colsb[a] & 3) ||
        c == a || c == b || a == b) {
        fault();
        return;
    }
    int nk = colsb[a] / 4, nn = colsb[c] / 4;
    for (int m = 0; m < rows[c]; m++) {
        float tmp[16];
        uint16_t ar[32], br[32];
        memcpy(tmp, g_tiles.data[c][m], sizeof tmp);
        memcpy(ar, g_tiles.data[a][m], sizeof ar);
        for (int k = 0; k < nk; k++) {
            memcpy(br, g_tiles.data[b][k], sizeof br);
            for (int n = 0; n < nn; n++)
                tmp[n] = dt__amx_emul_dp_pair(tmp[n], ar[2 * k], br[2 * n], ar[2 * k + 1], br[2 * n + 1]);
        }
        memset(g_tiles.data[c][m], 0, 64); /* write_row_and_zero */
        memcpy(g_tiles.data[c][m], tmp, colsb[c]);
    }
}

void dt__amx_emul_stats_get(dt__amx_emul_stats *out)
{
    out->faults = atomic_load(&g_faults);
    out->loads = atomic_load(&g_loads);
    out->live = atomic_load(&g_live);
}

bool dt__amx_emul_thread_configured(void) { return g_tiles.configured; }

/* ---- the micro-kernel over the model ------------------------------------------ */
#define DT__T_ZERO(t) dt__amx_emul_tile_zero(t)
#define DT__T_LOAD(t, p, ld) tile_load(t, p, ld)
#define DT__T_LOADB(t, p, ld) tile_load(t, p, ld)
#define DT__T_DP(c, a, b) dt__amx_emul_tile_dp(c, a, b)
#define DT__T_STORE(t, p, ld) tile_store(t, p, ld)
#define DT__UK_ATTR
#define DT__UK_NAME emul_block
#include "kernels/amx_ukernel.h"

static const dt__amx_tiles g_emul = {
    .name = "emulated",
    .load_config = emul_load_config,
    .release = emul_release,
    .block = emul_block,
};

const dt__amx_tiles *dt__amx_tiles_emul(void) { return &g_emul; }
