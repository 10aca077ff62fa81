/* Attention over a bf16 qkv on the avx512_bf16 path (dt_k_set_isa; skipped
 * where the CPU lacks AVX512_BF16): the probabilities are rounded to bf16
 * before they multiply v (vdpbf16ps, as kernels.h states), and what the
 * causal mask hides stays hidden although the products run on pairs of
 * rows (a masked key or row beside a visible one in a pair). The bound
 * against the f32 reference on every path is tests/autograd/test_attention_lp.
 *
 * The products on the AMX tiles (attention.c): their driver (packing,
 * blocking, edges, tile configuration and release) runs here over the
 * portable model of the tiles (dt__amx_tiles_emul) on every CPU, and with
 * the argument "hw" over the real instructions (skipped where the CPU, the
 * OS or DT_MAX_CPU_ISA leave AMX off; tests.cmake registers that run), and
 * with "vdp" over vdpbf16ps, the tiles of a CPU with AVX512_BF16 but no AMX
 * (skipped without AVX512_BF16).
 * y, lse and dq, dk, dv are checked element by element against a reference
 * in double from the same bf16 q, k, v and dy rounded to bf16, including
 * dropout's mask. The bound: P and dS are rounded to bf16 (relative error
 * at most 2^-8) before they multiply v, dy, k and q; the products of bf16
 * values are exact and summed in f32; so each element is within
 * 2^-8 (1 + 2^-6) of the sum of its terms' magnitudes (y: sum_j P_ij |v_j|
 * / l_i; dv: sum_i P_ij |dy_i|; dq: sum_j |dS_ij k_j|; dk: sum_i |dS_ij q_i|)
 * plus, for dq and dk, 2^-14 of the magnitudes dS's inputs carry (P_ij
 * scale (sum_d |dy_i v_j| + |Di|) times |k_j| or |q_i|: dP - Di cancels, and
 * their f32 sums and the f32 y in Di have rounding of that size), and the
 * gradients' final rounding to bf16 (2^-8 of the value). lse within 2^-18
 * (1 + |lse|). The same with sliding windows (dt_k_attention_window_fwd_lp
 * and _bwd_lp): the tiles, the rows, and what a window hides staying
 * hidden although pairs of keys and rows straddle its edge; and with soft
 * caps (the scores capped before the softmax, dS times 1 - tanh^2 in the
 * reference) on the tiles and on every path's rows. */
#include "dtrain/kernels.h"
#include "isa_paths.h"
#include "kernels/amx_tiles.h"
#include "kernels/attention_amx.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The row loops around the tiles a tile case runs with: scalar, AVX2, AVX-512 and the CPU's own */
static const dt_k_isa g_tile_paths[4] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AUTO};

static const dt__amx_tiles *g_tiles; /* the AMX path's tiles: the model, or the hardware with "hw" */

static float bf16_of(float x)
{
    uint16_t h;
    float r = NAN;
    if (dt_k_convert(&x, DT_F32, &h, DT_BF16, 1) < 0 || dt_k_convert(&h, DT_BF16, &r, DT_F32, 1) < 0)
        return NAN;
    return r;
}

/* v one-hot (v_j = e_j), no mask: y_i[j] = E_ij / l_i with E_ij = exp(s_ij
 * - max) rounded to bf16 and E = 1 for the largest score, so y_i[j] / max_j
 * y_i[j] is a bf16 value (within the one rounding of y). With E in f32
 * (the other paths) almost none is. */
TEST(attention_bf16_rounds_probabilities)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    enum { T = 16, D = 16, C3 = 3 * D };
    static float x[T * C3], y[T * D], lse[T];
    static uint16_t xh[T * C3];
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
    for (int j = 0; j < T; j++)
        for (int d = 0; d < D; d++)
            x[j * C3 + 2 * D + d] = d == j ? 1.0f : 0.0f;
    ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
    ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, 1, D, 0, 1, false, 0.0f, (dt_rng_key){0}, y, NULL, lse));
    int off = 0;
    for (int i = 0; i < T; i++) {
        float inv = 0.0f;
        for (int j = 0; j < T; j++)
            inv = y[i * D + j] > inv ? y[i * D + j] : inv;
        ASSERT(inv > 0.0f);
        for (int j = 0; j < T; j++) {
            double e = (double)y[i * D + j] / inv, r = bf16_of((float)e);
            off += !(fabs(e - r) <= 0x1p-22 * e);
        }
    }
    ASSERT_EQ_INT(off, 0);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* Causal, T odd and even: an infinite value in the last key's k and v (head
 * 1) and in the first row's q and dy (head 0). The products pair keys (2m, 2m + 1) and rows (2m,
 * 2m + 1), so a row that does not see the last key and a key that row 0
 * does not reach share a pair with them: y, lse and dqkv are NaN exactly
 * where the f32 kernel on the widened qkv gives NaN, and finite elsewhere. */
TEST(attention_bf16_mask_hides_nonfinite)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    for (int T = 69; T <= 70; T++) {
        enum { TM = 70, H = 2, D = 24, C = H * D, C3 = 3 * C };
        static float x[TM * C3], dy[TM * C], y[2][TM * C], lse[2][H * TM], g[2][TM * C3];
        static uint16_t xh[TM * C3];
        dt_rng_fill_uniform(dt_rng_key_make(32, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
        dt_rng_fill_uniform(dt_rng_key_make(32, DT_RNG_DATA, 1, 0), 0, dy, T * C, -1.0f, 1.0f);
        for (int d = D; d < C; d++) { /* head 1: the last key */
            x[(T - 1) * C3 + C + d] = INFINITY;
            x[(T - 1) * C3 + 2 * C + d] = INFINITY;
        }
        x[3] = INFINITY; /* head 0: row 0's q and dy */
        dy[5] = INFINITY;
        ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
        const dt_k_isa paths[2] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX512_BF16}; /* the reference: scalar, bit exact */
        for (int r = 0; r < 2; r++) {
            ASSERT_OK(dt_k_set_isa(paths[r]));
            ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, true, 0.0f, (dt_rng_key){0}, y[r],
                                                  NULL, lse[r]));
            ASSERT_OK(dt_k_attention_bwd_heads_lp(DT_BF16, xh, y[0], lse[0], dy, 1, T, H, D, 0, H, true, 0.0f,
                                                  (dt_rng_key){0}, g[r], NULL));
        }
        int64_t nan_y = 0, nan_g = 0, diff = 0;
        for (int64_t i = 0; i < (int64_t)T * C; i++) {
            nan_y += isnan(y[0][i]);
            diff += isnan(y[0][i]) != isnan(y[1][i]) || isinf(y[0][i]) != isinf(y[1][i]);
        }
        for (int64_t i = 0; i < (int64_t)H * T; i++)
            diff += isnan(lse[0][i]) != isnan(lse[1][i]);
        for (int64_t i = 0; i < (int64_t)T * C3; i++) {
            nan_g += isnan(g[0][i]);
            diff += isnan(g[0][i]) != isnan(g[1][i]) || isinf(g[0][i]) != isinf(g[1][i]);
        }
        ASSERT(nan_y > 0 && nan_y < T * C / 2); /* the case does reach NaN, not everywhere */
        ASSERT(nan_g > 0 && nan_g < T * C3 / 2);
        ASSERT_EQ_INT((long long)diff, 0);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* ---- the AMX path ---------------------------------------------------------------------- */

typedef struct {
    int64_t B, T, H, D;
    bool causal;
    float p;
} att_case;

/* The worst ratio |got - want| / bound seen (printed: how close each bound is). */
static double g_worst[6];

/* P (b, h, i, j) as dropout leaves it: scaled by ps where kept, else 0. */
static double dropped(dt_rng_key key, float p, double ps, int64_t bh, int64_t T, int64_t i, int64_t j, double P)
{
    return dt_rng_uniform(key, (uint64_t)((bh * T + i) * T + j)) >= p ? P * ps : 0.0;
}

static void worst(int k, double e, double bound)
{
    g_worst[k] = e / bound > g_worst[k] ? e / bound : g_worst[k];
}


/* Check one case on the forced tiles against the double reference; returns the elements outside the bounds.
   window > 0 or cap > 0: the sliding window's entry points (c causal; with dropout the general one,
   dt_k_attention_ex_fwd), query i seeing the keys (i -
   window, i], its scores s capped to cap tanh(s / cap) (dS times 1 - tanh^2; the bound's magnitudes of dS's inputs
   keep no such factor: they cover the f32 tanh's error in it too). */
static int64_t amx_case(att_case c, int64_t window, float cap, float *yk, float *gk)
{
    const int64_t B = c.B, T = c.T, H = c.H, D = c.D, C = H * D, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)D), ps = c.p > 0.0f ? 1.0 / (1.0 - c.p) : 1.0;
    float *x = malloc((size_t)(B * T * C3) * 4), *dy = malloc((size_t)(B * T * C) * 4);
    float *y = malloc((size_t)(B * T * C) * 4), *lse = malloc((size_t)(B * H * T) * 4);
    /* g 64-byte aligned: with D a multiple of 16 its rows take the tiles' streaming stores */
    float *g = aligned_alloc(64, ((size_t)(B * T * C3) * 4 + 63) / 64 * 64), *xw = malloc((size_t)(B * T * C3) * 4);
    float *gw = malloc((size_t)(B * T * C) * 4);
    uint16_t *xh = malloc((size_t)(B * T * C3) * 2), *dh = malloc((size_t)(B * T * C) * 2);
    double *P = malloc((size_t)(T * T) * 8), *dS = malloc((size_t)(T * T) * 8), *yr = malloc((size_t)(T * D) * 8);
    double *dc = calloc((size_t)(T * T), 8); /* d c / d s: 1 - tanh^2 under a cap, else 1 (0 where P is) */
    const dt_rng_key key = dt_rng_key_make(77, DT_RNG_DROPOUT, 0, 0);
    dt_rng_fill_uniform(dt_rng_key_make(41, DT_RNG_DATA, 0, 0), 0, x, B * T * C3, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(41, DT_RNG_DATA, 1, 0), 0, dy, B * T * C, -1.0f, 1.0f);
    if (dt_k_convert(x, DT_F32, xh, DT_BF16, B * T * C3) < 0 || dt_k_convert(xh, DT_BF16, xw, DT_F32, B * T * C3) < 0 ||
        dt_k_convert(dy, DT_F32, dh, DT_BF16, B * T * C) < 0 || dt_k_convert(dh, DT_BF16, gw, DT_F32, B * T * C) < 0)
        return -1;
    dt__attention_amx_force(g_tiles);
    const bool ex = (window > 0 || cap > 0.0f) && c.p > 0.0f; /* the general entry point: dropout beside them */
    if (ex ? dt_k_attention_ex_fwd(DT_BF16, xh, B, T, H, D, 0, H, true, window, cap, c.p, key, y, NULL, lse) < 0 ||
                 dt_k_attention_ex_bwd(DT_BF16, xh, y, lse, dy, B, T, H, D, 0, H, true, window, cap, c.p, key, g,
                                       NULL) < 0
           : window > 0 || cap > 0.0f
               ? dt_k_attention_window_fwd_lp(DT_BF16, xh, B, T, H, D, window, cap, y, NULL, lse) < 0 ||
                     dt_k_attention_window_bwd_lp(DT_BF16, xh, y, lse, dy, B, T, H, D, window, cap, g, NULL) < 0
               : dt_k_attention_fwd_heads_lp(DT_BF16, xh, B, T, H, D, 0, H, c.causal, c.p, key, y, NULL, lse) < 0 ||
                     dt_k_attention_bwd_heads_lp(DT_BF16, xh, y, lse, dy, B, T, H, D, 0, H, c.causal, c.p, key, g,
                                                 NULL) < 0)
        return -1;
    dt__attention_amx_force(NULL);
    if (yk)
        memcpy(yk, y, (size_t)(B * T * C) * 4);
    if (gk)
        memcpy(gk, g, (size_t)(B * T * C3) * 4);
    int64_t bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *X = xw + b * T * C3 + h * D, *G = gw + b * T * C + h * D;
            const int64_t bh = b * H + h;
#define Q_(i, d) ((double)X[(i) * C3 + (d)])
#define K_(j, d) ((double)X[(j) * C3 + C + (d)])
#define V_(j, d) ((double)X[(j) * C3 + 2 * C + (d)])
#define DY(i, d) ((double)G[(i) * C + (d)])
            for (int64_t i = 0; i < T; i++) { /* forward: P (dropped in Pd below), y, lse */
                const int64_t n = c.causal ? i + 1 : T, j0 = window > 0 && i >= window ? i + 1 - window : 0;
                double mx = -INFINITY, l = 0.0;
                for (int64_t j = j0; j < n; j++) {
                    double s = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        s += Q_(i, d) * K_(j, d);
                    const double th = cap > 0.0f ? tanh(s * scale / cap) : 0.0;
                    P[i * T + j] = cap > 0.0f ? cap * th : s * scale;
                    dc[i * T + j] = cap > 0.0f ? 1.0 - th * th : 1.0;
                    mx = P[i * T + j] > mx ? P[i * T + j] : mx;
                }
                for (int64_t j = j0; j < n; j++)
                    l += P[i * T + j] = exp(P[i * T + j] - mx);
                for (int64_t j = 0; j < T; j++)
                    P[i * T + j] = j >= j0 && j < n ? P[i * T + j] / l : 0.0;
                double lr = mx + log(l), e = fabs(lse[bh * T + i] - lr), bd = 0x1p-18 * (1.0 + fabs(lr));
                bad += !(e <= bd);
                worst(0, e, bd);
                for (int64_t d = 0; d < D; d++) {
                    double acc = 0.0, mag = 0.0;
                    for (int64_t j = j0; j < n; j++) {
                        double pd = dropped(key, c.p, ps, bh, T, i, j, P[i * T + j]);
                        acc += pd * V_(j, d);
                        mag += pd * fabs(V_(j, d));
                    }
                    yr[i * D + d] = acc;
                    double got = y[(b * T + i) * C + h * D + d], eb = 0x1p-8 * (1.0 + 0x1p-6) * mag + 1e-30;
                    bad += !(fabs(got - acc) <= eb);
                    worst(1, fabs(got - acc), eb);
                }
            }
            /* backward: dS, then dq, dk, dv with their magnitudes */
            double *m2 = malloc((size_t)(T * T) * 8);
            for (int64_t i = 0; i < T; i++) {
                double Di = 0.0;
                for (int64_t d = 0; d < D; d++)
                    Di += DY(i, d) * y[(b * T + i) * C + h * D + d]; /* the backward's input y, as the kernel */
                for (int64_t j = 0; j < T; j++) {
                    double dp = 0.0, dpm = 0.0;
                    for (int64_t d = 0; d < D; d++) {
                        dp += DY(i, d) * V_(j, d);
                        dpm += fabs(DY(i, d) * V_(j, d));
                    }
                    bool kp = dt_rng_uniform(key, (uint64_t)((bh * T + i) * T + j)) >= c.p;
                    dS[i * T + j] = P[i * T + j] * ((kp ? dp * ps : 0.0) - Di) * dc[i * T + j] * scale;
                    m2[i * T + j] = P[i * T + j] * scale * (dpm * ps + fabs(Di));
                }
            }
            for (int64_t r = 0; r < T; r++)
                for (int64_t d = 0; d < D; d++) {
                    double w[3] = {0, 0, 0}, mg[3] = {0, 0, 0}, mc[3] = {0, 0, 0};
                    for (int64_t o = 0; o < T; o++) {
                        w[0] += dS[r * T + o] * K_(o, d); /* dq_r: over keys o */
                        mg[0] += fabs(dS[r * T + o] * K_(o, d));
                        mc[0] += m2[r * T + o] * fabs(K_(o, d));
                        w[1] += dS[o * T + r] * Q_(o, d); /* dk_r: over rows o */
                        mg[1] += fabs(dS[o * T + r] * Q_(o, d));
                        mc[1] += m2[o * T + r] * fabs(Q_(o, d));
                        double pd = dropped(key, c.p, ps, bh, T, o, r, P[o * T + r]);
                        w[2] += pd * DY(o, d); /* dv_r */
                        mg[2] += pd * fabs(DY(o, d));
                    }
                    for (int k = 0; k < 3; k++) {
                        double got = g[(b * T + r) * C3 + k * C + h * D + d];
                        double eb = 0x1p-8 * (1.0 + 0x1p-6) * mg[k] + 0x1p-14 * mc[k] + 0x1p-8 * fabs(w[k]) + 1e-30;
                        bad += !(fabs(got - w[k]) <= eb);
                        worst(3 + k, fabs(got - w[k]), eb);
                    }
                }
            free(m2);
#undef Q_
#undef K_
#undef V_
#undef DY
        }
    free(x), free(dy), free(y), free(lse), free(g), free(xw), free(gw), free(xh), free(dh), free(P), free(dS), free(yr);
    free(dc);
    return bad;
}

/* Causal and not, dropout, T not a multiple of 32 (and below it), D not a
 * multiple of 32, B H above the threads, with each ISA path's row loops
 * (softmax, roundings, pairing) around the tiles: every element within its bound;
 * every task on the tiles (no fallback); the tile state released after
 * each call (the model: no thread configured, no fault). */
TEST(amx_matches_reference)
{
    const att_case cases[] = {
        {1, 70, 2, 64, true, 0.0f}, {2, 33, 3, 40, false, 0.0f}, {1, 96, 1, 32, true, 0.0f},
        {1, 5, 2, 16, true, 0.0f},  {2, 45, 2, 64, true, 0.2f},  {1, 64, 2, 72, false, 0.1f},
    };
    for (size_t n = 0; n < 4 * (sizeof cases / sizeof cases[0]); n++) { /* every case on each path's rows */
        if (dt_k_set_isa(g_tile_paths[n % 4]) != DT_OK)
            continue;
        dt__attention_amx_stats s0, s1;
        dt__amx_emul_stats e0, e1;
        dt__attention_amx_stats_get(&s0);
        dt__amx_emul_stats_get(&e0);
        int64_t bad = amx_case(cases[n / 4], 0, 0.0f, NULL, NULL);
        dt__attention_amx_stats_get(&s1);
        dt__amx_emul_stats_get(&e1);
        if (bad)
            printf("case %zu on path %d: %lld elements outside the bound\n", n / 4, (int)g_tile_paths[n % 4],
                   (long long)bad);
        ASSERT_EQ_INT((long long)bad, 0);
        ASSERT(s1.tasks > s0.tasks);
        ASSERT_EQ_INT((long long)(s1.fallbacks - s0.fallbacks), 0);
        ASSERT_EQ_INT((long long)(e1.faults - e0.faults), 0);
        ASSERT_EQ_INT((long long)e1.live, 0);
        ASSERT(!dt__amx_emul_thread_configured());
        if (g_tiles == dt__amx_tiles_emul())
            ASSERT(e1.loads > e0.loads);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    printf("worst error / bound: lse %.3f y %.3f dq %.3f dk %.3f dv %.3f\n", g_worst[0], g_worst[1], g_worst[3],
           g_worst[4], g_worst[5]);
}

/* A case with a sliding window (0 none) and a soft cap (0 none) */
typedef struct {
    att_case c;
    int64_t window;
    float cap;
} masked_case;

/* Every case on the rows of each of the paths the CPU has (the tiles off: no task may take them), within the
 * bounds */
static void rows_cases_on_paths(const char *what, const dt_k_isa *paths, size_t np, const masked_case *cases,
                                size_t nc)
{
    const dt__amx_tiles *keep_tiles = g_tiles;
    g_tiles = NULL;
    dt__attention_amx_disable(true);
    dt__attention_amx_stats s0, s1;
    dt__attention_amx_stats_get(&s0);
    for (size_t n = 0; n < np * nc; n++) {
        if (dt_k_set_isa(paths[n % np]) != DT_OK)
            continue;
        int64_t bad = amx_case(cases[n / np].c, cases[n / np].window, cases[n / np].cap, NULL, NULL);
        if (bad)
            printf("%s case %zu on the rows of path %d: %lld elements outside the bound\n", what, n / np,
                   (int)paths[n % np], (long long)bad);
        ASSERT_EQ_INT((long long)bad, 0);
    }
    dt__attention_amx_stats_get(&s1);
    dt__attention_amx_disable(false);
    g_tiles = keep_tiles;
    ASSERT_EQ_INT((long long)(s1.tasks - s0.tasks), 0);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* The avx512_bf16 rows (vdpbf16ps; the tiles off) within the same bounds
 * (kernels.h states them for both). */
TEST(rows_bf16_matches_reference)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    static const masked_case cases[] = {{{1, 70, 2, 64, true, 0.0f}, 0, 0.0f},
                                        {{2, 33, 3, 40, false, 0.0f}, 0, 0.0f},
                                        {{2, 45, 2, 64, true, 0.2f}, 0, 0.0f}};
    rows_cases_on_paths("plain", (const dt_k_isa[]){DT_K_ISA_AVX512_BF16}, 1, cases, sizeof cases / sizeof cases[0]);
}

/* Sliding windows on the tiles and on the avx512_bf16 rows, within the same bounds: windows 1 and 2 (a row's
   keys inside one tile block, pairs of keys and rows split by the edge), 31, 32 and 33 (a tile block and one key
   either side), 64 and 65 (a key block of the rows), 100; odd and even, T not a multiple of 32 or 64, B and H
   above 1, D not a multiple of 32. On the tiles every task stays there (no fallback). */
static const masked_case g_window_cases[] = {
    {{1, 150, 2, 64, true, 0.0f}, 1, 0.0f},  {{2, 131, 2, 40, true, 0.0f}, 2, 0.0f},
    {{1, 150, 3, 64, true, 0.0f}, 31, 0.0f}, {{2, 100, 2, 32, true, 0.0f}, 32, 0.0f},
    {{1, 150, 2, 40, true, 0.0f}, 33, 0.0f}, {{1, 200, 2, 64, true, 0.0f}, 64, 0.0f},
    {{2, 150, 2, 24, true, 0.0f}, 65, 0.0f}, {{1, 230, 1, 64, true, 0.0f}, 100, 0.0f},
};

/* Every case on the tiles of each path (scalar, AVX2, AVX-512 and the CPU's own), within the bounds, the tiles
 * taking every task (no fallback to the rows) */
static void amx_cases_on_paths(const char *what, const masked_case *cases, size_t nc)
{
    for (size_t n = 0; n < 4 * nc; n++) {
        if (dt_k_set_isa(g_tile_paths[n % 4]) != DT_OK)
            continue;
        dt__attention_amx_stats s0, s1;
        dt__attention_amx_stats_get(&s0);
        int64_t bad = amx_case(cases[n / 4].c, cases[n / 4].window, cases[n / 4].cap, NULL, NULL);
        dt__attention_amx_stats_get(&s1);
        if (bad)
            printf("%s case %zu on path %d: %lld elements outside the bound\n", what, n / 4, (int)g_tile_paths[n % 4],
                   (long long)bad);
        ASSERT_EQ_INT((long long)bad, 0);
        ASSERT(s1.tasks > s0.tasks);
        ASSERT_EQ_INT((long long)(s1.fallbacks - s0.fallbacks), 0);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    printf("worst error / bound: lse %.3f y %.3f dq %.3f dk %.3f dv %.3f\n", g_worst[0], g_worst[1], g_worst[3],
           g_worst[4], g_worst[5]);
}

TEST(amx_window_matches_reference)
{
    amx_cases_on_paths("window", g_window_cases, sizeof g_window_cases / sizeof g_window_cases[0]);
}

TEST(rows_bf16_window_matches_reference)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    rows_cases_on_paths("window", (const dt_k_isa[]){DT_K_ISA_AVX512_BF16}, 1, g_window_cases,
                        sizeof g_window_cases / sizeof g_window_cases[0]);
}

/* What a window hides stays hidden although the bf16 products pair keys (2m, 2m + 1) and rows (2m, 2m + 1): infinite
   k and v in an even key (the rows whose window starts at the odd key after it pair them), an infinite q and dy in
   odd rows (the keys whose last row is the even row before them pair them) and a dy in an even row (window 1: the
   key after it pairs it), windows 1, odd and even, on the avx512_bf16 rows and on the tiles (a task that packs a
   non-finite value runs the rows instead): y, lse and dqkv are NaN or infinite exactly where the scalar path (the
   f32 arithmetic on the widened qkv, which never reads what the window hides) has them, finite elsewhere. */
TEST(window_hides_nonfinite)
{
    enum { T = 150, H = 2, D = 40, C = H * D, C3 = 3 * C };
    static float x[T * C3], dy[T * C], y[3][T * C], lse[3][H * T], g[3][T * C3];
    static uint16_t xh[T * C3];
    static const int64_t windows[3] = {1, 5, 6};
    for (int k = 0; k < 3; k++) {
        const int64_t window = windows[k];
        dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
        dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 1, 0), 0, dy, T * C, -1.0f, 1.0f);
        for (int d = 0; d < D; d++) /* head 0: key 68's k and v (rows 68 to 67 + window see it) */
            x[68 * C3 + C + d] = x[68 * C3 + 2 * C + d] = INFINITY;
        x[64 * C3 + C + D + 3] = -INFINITY; /* head 1: key 64's k */
        x[101 * C3 + D + 7] = INFINITY;      /* head 1: row 101's q */
        dy[121 * C + 5] = INFINITY;          /* head 0: row 121's dy */
        dy[130 * C + D + 2] = INFINITY;      /* head 1: row 130's dy (window 1: row 130 does not see key 131) */
        ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
        for (int r = 0; r < 3; r++) { /* the scalar path, the avx512_bf16 rows, the tiles */
            if (r && dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
                break;
            if (!r)
                ASSERT_OK(dt_k_set_isa(DT_K_ISA_SCALAR));
            dt__attention_amx_disable(r == 1);
            dt__attention_amx_force(r == 2 ? g_tiles : NULL);
            ASSERT_OK(dt_k_attention_window_fwd_lp(DT_BF16, xh, 1, T, H, D, window, 0.0f, y[r], NULL, lse[r]));
            ASSERT_OK(dt_k_attention_window_bwd_lp(DT_BF16, xh, y[0], lse[0], dy, 1, T, H, D, window, 0.0f, g[r],
                                                   NULL));
            dt__attention_amx_force(NULL);
            dt__attention_amx_disable(false);
            int64_t bad_y = 0, bad_g = 0, diff = 0;
            for (int64_t i = 0; i < (int64_t)T * C; i++) {
                bad_y += !isfinite(y[0][i]);
                diff += isnan(y[0][i]) != isnan(y[r][i]) || isinf(y[0][i]) != isinf(y[r][i]);
            }
            for (int64_t i = 0; i < (int64_t)H * T; i++)
                diff += isnan(lse[0][i]) != isnan(lse[r][i]);
            for (int64_t i = 0; i < (int64_t)T * C3; i++) {
                bad_g += !isfinite(g[0][i]);
                diff += isnan(g[0][i]) != isnan(g[r][i]) || isinf(g[0][i]) != isinf(g[r][i]);
            }
            ASSERT(bad_y > 0 && bad_y < T * C / 8); /* the case does reach non-finite values, not everywhere */
            ASSERT(bad_g > 0 && bad_g < T * C3 / 8);
            if (diff)
                printf("window %lld, path %d: %lld elements differ in finiteness\n", (long long)window, r,
                       (long long)diff);
            ASSERT_EQ_INT((long long)diff, 0);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* Soft caps (0.3: most scores on tanh's flat ends; 1; 50: Gemma 2's), with no window and with one, D 8, 64 and
   256, T below and above the tiles' shortest sequence (dt_k_attention_lp_tiles: 64 with AMX, 96 on vdpbf16ps),
   within the same bounds: on the tiles with each ISA path's row loops around them (the scores capped as they come
   out of the tile products), then on the rows of each path (the tiles off: f32 rows over the widened qkv, the
   avx512 fast rows, the avx512_bf16 rows). */
static const masked_case g_cap_cases[] = {
    {{1, 40, 2, 8, true, 0.0f}, 0, 0.3f},   {{2, 150, 2, 8, true, 0.0f}, 37, 1.0f},
    {{1, 100, 2, 64, true, 0.0f}, 0, 50.0f}, {{2, 70, 1, 64, true, 0.0f}, 16, 0.3f},
    {{1, 131, 2, 256, true, 0.0f}, 0, 1.0f}, {{1, 50, 1, 256, true, 0.0f}, 33, 50.0f},
};

TEST(amx_cap_matches_reference)
{
    memset(g_worst, 0, sizeof g_worst); /* the worst of these cases */
    amx_cases_on_paths("cap", g_cap_cases, sizeof g_cap_cases / sizeof g_cap_cases[0]);
}

TEST(rows_cap_matches_reference)
{
    rows_cases_on_paths("cap", test_isa_paths, TEST_NISA, g_cap_cases, sizeof g_cap_cases / sizeof g_cap_cases[0]);
}

/* Dropout (0.2, 0.3) beside a sliding window and a soft cap (dt_k_attention_ex_fwd: Mistral's and Gemma 2's
   attention with attention_dropout): the mask on the probabilities of the capped scores within the window, dS
   through tanh' for the kept ones; on the tiles with each path's row loops, then on the rows of each path */
static const masked_case g_drop_cases[] = {
    {{1, 100, 2, 64, true, 0.3f}, 0, 0.3f},  {{2, 150, 2, 40, true, 0.2f}, 37, 0.0f},
    {{1, 131, 2, 64, true, 0.3f}, 33, 1.0f}, {{2, 45, 2, 24, true, 0.2f}, 16, 50.0f},
};

TEST(amx_dropout_window_cap_matches_reference)
{
    memset(g_worst, 0, sizeof g_worst);
    amx_cases_on_paths("dropout", g_drop_cases, sizeof g_drop_cases / sizeof g_drop_cases[0]);
}

TEST(rows_dropout_window_cap_matches_reference)
{
    rows_cases_on_paths("dropout", test_isa_paths, TEST_NISA, g_drop_cases,
                        sizeof g_drop_cases / sizeof g_drop_cases[0]);
}

/* More threads than tasks and than cores: the same bits as one thread (each
 * task's sums run in a fixed order), the tiles released. */
TEST(amx_threads_same_bits)
{
    /* then a sliding window: with 16 threads each query block is a task, packing the keys from its own first; then
       soft caps, with and without one */
    const att_case cs[4] = {{2, 40, 3, 64, true, 0.0f},
                            {2, 100, 3, 64, true, 0.0f},
                            {2, 40, 3, 64, true, 0.0f},
                            {2, 100, 3, 64, true, 0.0f}};
    const int64_t windows[4] = {0, 20, 0, 20};
    const float caps[4] = {0.0f, 0.0f, 0.3f, 50.0f};
    for (int k = 0; k < 4; k++) {
        const att_case c = cs[k];
        const int64_t ny = c.B * c.T * c.H * c.D, ng = 3 * ny;
        float *y1 = malloc((size_t)ny * 4), *g1 = malloc((size_t)ng * 4), *y8 = malloc((size_t)ny * 4),
              *g8 = malloc((size_t)ng * 4);
        const int nt = dt_get_num_threads();
        dt_set_num_threads(1);
        ASSERT_EQ_INT((long long)amx_case(c, windows[k], caps[k], y1, g1), 0);
        dt_set_num_threads(16);
        ASSERT_EQ_INT((long long)amx_case(c, windows[k], caps[k], y8, g8), 0);
        dt_set_num_threads(nt);
        ASSERT(!memcmp(y1, y8, (size_t)ny * 4));
        ASSERT(!memcmp(g1, g8, (size_t)ng * 4));
        free(y1), free(g1), free(y8), free(g8);
    }
    dt__amx_emul_stats e;
    dt__amx_emul_stats_get(&e);
    ASSERT_EQ_INT((long long)e.live, 0);
}

/* A non-finite q, k, v or dy: the task runs the rows instead (0 x inf in
 * the padded or masked products would be NaN where the mask hides it), so
 * NaN appears exactly where the scalar path has it. */
TEST(amx_nonfinite_falls_back)
{
    enum { T = 45, H = 2, D = 32, C = H * D, C3 = 3 * C };
    static float x[T * C3], dy[T * C], y[2][T * C], lse[2][H * T], g[2][T * C3];
    static uint16_t xh[T * C3];
    dt_rng_fill_uniform(dt_rng_key_make(33, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(33, DT_RNG_DATA, 1, 0), 0, dy, T * C, -1.0f, 1.0f);
    for (int d = D; d < C; d++) /* head 1: the last key */
        x[(T - 1) * C3 + C + d] = x[(T - 1) * C3 + 2 * C + d] = INFINITY;
    x[3] = INFINITY; /* head 0: row 0's q and dy */
    dy[5] = INFINITY;
    ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
    dt__attention_amx_stats s0, s1;
    dt__attention_amx_stats_get(&s0);
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(dt_k_set_isa(r ? DT_K_ISA_AUTO : DT_K_ISA_SCALAR));
        dt__attention_amx_force(r ? g_tiles : NULL);
        ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, true, 0.0f, (dt_rng_key){0}, y[r], NULL,
                                              lse[r]));
        ASSERT_OK(dt_k_attention_bwd_heads_lp(DT_BF16, xh, y[0], lse[0], dy, 1, T, H, D, 0, H, true, 0.0f,
                                              (dt_rng_key){0}, g[r], NULL));
        dt__attention_amx_force(NULL);
    }
    dt__attention_amx_stats_get(&s1);
    ASSERT(s1.fallbacks >= s0.fallbacks + 3); /* forward: both heads' tasks; backward: both heads */
    int64_t nan_y = 0, diff = 0;
    for (int i = 0; i < T * C; i++) {
        nan_y += isnan(y[0][i]);
        diff += isnan(y[0][i]) != isnan(y[1][i]) || isinf(y[0][i]) != isinf(y[1][i]);
    }
    for (int i = 0; i < T * C3; i++)
        diff += isnan(g[0][i]) != isnan(g[1][i]) || isinf(g[0][i]) != isinf(g[1][i]);
    ASSERT(nan_y > 0);
    ASSERT_EQ_INT((long long)diff, 0);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* One non-finite value anywhere in a row of a head of 64 values (the
 * scan takes 32 lanes at a time), or of 40 (a masked tail of 8): each lane
 * of a q row, of a k row and of a v row, alone, sends the forward task to
 * the rows. */
TEST(amx_nonfinite_every_lane)
{
    enum { T = 32, H = 1, DMAXT = 64, C3MAX = 3 * H * DMAXT };
    static float x[T * C3MAX], y[T * DMAXT], lse[H * T];
    static uint16_t xh[T * C3MAX];
    static const int Ds[] = {64, 40};
    for (size_t k = 0; k < sizeof Ds / sizeof Ds[0]; k++) {
        const int D = Ds[k], C = H * D, C3 = 3 * C;
        dt_rng_fill_uniform(dt_rng_key_make(34, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
        ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
        dt__attention_amx_force(g_tiles);
        dt__attention_amx_stats s0, s1;
        for (int part = 0; part < 3; part++)
            for (int d = 0; d < D; d++) {
                const int64_t at = 5 * C3 + part * C + d; /* row 5 */
                const uint16_t keep = xh[at];
                xh[at] = (uint16_t)(d % 2 ? 0x7fc0 : 0xff80); /* NaN, -inf */
                dt__attention_amx_stats_get(&s0);
                ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, false, 0.0f, (dt_rng_key){0},
                                                      y, NULL, lse));
                dt__attention_amx_stats_get(&s1);
                xh[at] = keep;
                if (s1.fallbacks - s0.fallbacks != 1)
                    TEST_FAIL_("D=%d part %d lane %d: %lld fallbacks", D, part, d,
                               (long long)(s1.fallbacks - s0.fallbacks));
            }
        dt__attention_amx_stats_get(&s0);
        ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, false, 0.0f, (dt_rng_key){0}, y, NULL,
                                              lse));
        dt__attention_amx_stats_get(&s1);
        ASSERT_EQ_INT((long long)(s1.fallbacks - s0.fallbacks), 0);
        ASSERT_EQ_INT((long long)(s1.tasks - s0.tasks), 1);
        dt__attention_amx_force(NULL);
    }
}

/* The gradient in bf16 alone (dqkv NULL, as autograd asks where qkv's GEMM
 * is its one reader): the same bf16 bits as beside the f32 gradient, on the
 * tiles (g_tiles; a head with a non-finite value takes the rows, which then
 * sum in rows of their own) and on the rows of every path the CPU has; an
 * f16 qkv (the rows); and no output at all refused. */
TEST(lp_alone_same_bits)
{
    enum { B = 2, T = 70, H = 2, D = 64, C = H * D, C3 = 3 * C };
    static float x[B * T * C3], dy[B * T * C], y[B * T * C], lse[B * H * T], g[B * T * C3];
    static uint16_t xh[B * T * C3], d1[B * T * C3], d2[B * T * C3];
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 0, 0), 0, x, B * T * C3, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 1, 0), 0, dy, B * T * C, -1.0f, 1.0f);
    const dt_rng_key key = dt_rng_key_make(78, DT_RNG_DROPOUT, 0, 0);
    for (int run = 0; run < 3 * 4; run++) {
        const int how = run / 4; /* 0: the tiles; 1: the tiles, head 1 of batch 1 non-finite; 2: the rows */
        if (dt_k_set_isa(g_tile_paths[run % 4]) != DT_OK)
            continue;
        for (int dt = 0; dt < (how == 2 ? 2 : 1); dt++) {
            const dt_dtype t = dt ? DT_F16 : DT_BF16;
            ASSERT_OK(dt_k_convert(x, DT_F32, xh, t, B * T * C3));
            if (how == 1)
                xh[(T + 3) * C3 + D + 5] = t == DT_BF16 ? 0x7f80 : 0x7c00; /* batch 1, row 3, head 1's q: inf */
            dt__attention_amx_force(how < 2 ? g_tiles : NULL);
            dt__attention_amx_disable(how == 2);
            dt__attention_amx_stats s0, s1;
            dt__attention_amx_stats_get(&s0);
            ASSERT_OK(dt_k_attention_ex_fwd(t, xh, B, T, H, D, 0, H, true, 0, 0.0f, 0.1f, key, y, NULL, lse));
            memset(d1, 0x5a, sizeof d1), memset(d2, 0xa5, sizeof d2);
            ASSERT_OK(dt_k_attention_ex_bwd(t, xh, y, lse, dy, B, T, H, D, 0, H, true, 0, 0.0f, 0.1f, key, g, d1));
            ASSERT_OK(dt_k_attention_ex_bwd(t, xh, y, lse, dy, B, T, H, D, 0, H, true, 0, 0.0f, 0.1f, key, NULL, d2));
            dt__attention_amx_stats_get(&s1);
            dt__attention_amx_force(NULL);
            dt__attention_amx_disable(false);
            if (memcmp(d1, d2, sizeof d1))
                TEST_FAIL_("%s qkv, run %d (path %d): the gradient in %s alone differs from the one beside f32",
                           dt_dtype_name(t), how, (int)g_tile_paths[run % 4], dt_dtype_name(t));
            if (how < 2) /* the tiles ran (the non-finite head on the rows) */
                ASSERT(s1.tasks > s0.tasks && (s1.fallbacks > s0.fallbacks) == (how == 1));
            else
                ASSERT_EQ_INT((long long)(s1.tasks - s0.tasks), 0);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    ASSERT(dt_k_attention_ex_bwd(DT_BF16, xh, y, lse, dy, B, T, H, D, 0, H, true, 0, 0.0f, 0.0f, key, NULL, NULL) ==
           DT_ERR_NULL);
    ASSERT(dt_k_attention_bwd_heads_lp(DT_BF16, xh, y, lse, dy, B, T, H, D, 0, H, true, 0.0f, key, NULL, NULL) ==
           DT_ERR_NULL);
}

/* The run-time choice: a bf16 qkv of 64 tokens or more takes the tiles on
 * the avx512_bf16 path where AMX is usable (unless DT_ATTN_AMX=off; a
 * shorter one only with DT_ATTN_AMX=on), never below that path, never an
 * f16 or f32 one; the emulated tiles are never chosen by themselves. */
TEST(amx_dispatch)
{
    enum { TMAX = 128, H = 1, D = 32, C3 = 3 * H * D };
    static float x[TMAX * C3], y[TMAX * D], lse[TMAX];
    static uint16_t xh[TMAX * C3];
    dt_rng_fill_uniform(dt_rng_key_make(34, DT_RNG_DATA, 0, 0), 0, x, TMAX * C3, -2.0f, 2.0f);
    ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, TMAX * C3));
    const char *env = getenv("DT_ATTN_AMX");
    bool off = env && (!strcmp(env, "off") || !strcmp(env, "0")), on = env && (!strcmp(env, "on") || !strcmp(env, "1"));
    const int64_t Ts[] = {40, 63, 64, 95, 96, 128};
    for (size_t r = 0; r < TEST_NISA; r++) {
        if (dt_k_set_isa(test_isa_paths[r]) != DT_OK)
            continue;
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            const int64_t T = Ts[k];
            dt__attention_amx_stats s0, s1;
            dt__amx_emul_stats e0, e1;
            dt__attention_amx_stats_get(&s0);
            dt__amx_emul_stats_get(&e0);
            ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, true, 0.0f, (dt_rng_key){0}, y, NULL,
                                                  lse));
            ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_F16, xh, 1, T, H, D, 0, H, true, 0.0f, (dt_rng_key){0}, y, NULL,
                                                  lse));
            dt__attention_amx_stats_get(&s1);
            dt__amx_emul_stats_get(&e1);
            const dt__amx_tiles *hw = dt__amx_tiles_hw(NULL), *vdp = dt__amx_tiles_vdp(NULL);
            bool want = test_isa_paths[r] == DT_K_ISA_AVX512_BF16 && !off &&
                        ((hw && (T >= 64 || on)) || (!hw && vdp && (T >= 96 || on)));
            ASSERT_EQ_INT((long long)(s1.tasks > s0.tasks), (long long)want);
            ASSERT_EQ_INT((long long)(e1.loads - e0.loads), 0);
        }
    }
    /* what `dtrain info` reports: the same tiles and the same shortest length */
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) == DT_OK) {
        int64_t mt = 0;
        const char *name = dt_k_attention_lp_tiles(&mt);
        const dt__amx_tiles *hw = dt__amx_tiles_hw(NULL), *vdp = dt__amx_tiles_vdp(NULL);
        if (off || (!hw && !vdp)) {
            ASSERT(name == NULL);
        } else {
            ASSERT_STR_EQ(name, hw ? "amx" : "avx512_bf16");
            ASSERT_EQ_INT((long long)mt, on ? 1 : hw ? 64 : 96);
        }
    }
    if (dt_k_set_isa(DT_K_ISA_AVX2) == DT_OK)
        ASSERT(dt_k_attention_lp_tiles(NULL) == NULL);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* The tile path's checks on g_tiles (the model, AMX's or vdpbf16ps's). */
static int run_tile_checks(void)
{
    RUN(amx_matches_reference);
    RUN(amx_window_matches_reference);
    RUN(amx_cap_matches_reference);
    RUN(amx_dropout_window_cap_matches_reference);
    RUN(amx_threads_same_bits);
    RUN(amx_nonfinite_falls_back);
    RUN(amx_nonfinite_every_lane);
    RUN(lp_alone_same_bits);
    RUN(amx_dispatch);
    return TEST_REPORT();
}

int main(int argc, char **argv)
{
    const char *why = NULL;
    if (argc > 1 && !strcmp(argv[1], "hw")) {
        if (!(g_tiles = dt__amx_tiles_hw(&why)))
            DT_TEST_SKIP_ALL("AMX tiles not usable here: %s", why);
        return run_tile_checks();
    }
    if (argc > 1 && !strcmp(argv[1], "vdp")) {
        if (!(g_tiles = dt__amx_tiles_vdp(&why)))
            DT_TEST_SKIP_ALL("vdpbf16ps tiles not usable here: %s", why);
        return run_tile_checks();
    }
    g_tiles = dt__amx_tiles_emul();
    RUN(attention_bf16_rounds_probabilities);
    RUN(attention_bf16_mask_hides_nonfinite);
    RUN(rows_bf16_matches_reference);
    RUN(rows_bf16_window_matches_reference);
    RUN(rows_cap_matches_reference);
    RUN(rows_dropout_window_cap_matches_reference);
    RUN(window_hides_nonfinite);
    return run_tile_checks();
}
