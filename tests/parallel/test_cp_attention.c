/* Context parallelism's attention (cp.h, dt_k_attention_part_* in
 * kernels.h) against the single-process kernel dt_k_attention_fwd/bwd on
 * the whole sequence:
 *   - the partial kernel: the keys cut into blocks of odd, uneven lengths,
 *     added in a scrambled order, give the whole attention's y and lse, and
 *     the blocks' backward terms sum to its dqkv (causal and not);
 *   - ring attention on real processes (shm), cp 2 and 4, with and without
 *     the causal load balancing, causal and not: every rank's y, lse and
 *     dqkv rows equal the single-process rows at the same global positions
 *     (within 1e-5; the sums run in another order);
 *   - DeepSpeed-Ulysses' all-to-all variant, the same cases, and a head
 *     count that does not divide over the degree refused by name; with a
 *     sliding window and a soft cap of the scores against
 *     dt_k_attention_window_fwd/bwd on the whole sequence; ring attention
 *     with windows and caps the same way, bad windows and caps refused
 *     before any exchange; the partial kernel's blocks under a window and
 *     a cap;
 *   - the layout: rank r of P holds chunks r and 2P-1-r when balanced
 *     (P = 2, T = 8: positions 0,1,6,7 and 2,3,4,5), and a length that does
 *     not divide into equal chunks is refused by name. */
// dt-test-labels: threads
#include "comm/harness.h"
#include "test.h"

#include "dtrain/cp.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static float *rand_buf(size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; x && i < n; i++)
        x[i] = frand(&seed);
    return x;
}

/* The keys of a (B, T, H, D) attention cut into nb blocks (block c: keys
 * [k0[c], k0[c] + kn[c])), added in the given order, one batch row a call
 * (the batch strides are the caller's): the running yp and lp from the
 * forward blocks, and dp (zeroed here) the backward blocks' sum from the
 * final y and lse given. */
typedef struct {
    bool causal;
    int64_t B, T, H, D;
    int nb;
    const int64_t *k0, *kn;
    const int *order;
    int64_t window; /* with causal: a sliding window (0 none) */
    float cap;      /* with causal: a soft cap of the scores (0 none) */
    float p;        /* dropout (0 none), the mask of heads [1, 1 + H) of a layer of H + 2 */
} part_case;

static const dt_rng_key k_drop_key = {{0x5eed, 0x1234}, 7};

static void part_blocks(const part_case *pc, const float *qkv, const float *dy, const float *y, const float *lse,
                        float *yp, float *lp, float *dp)
{
    const int64_t B = pc->B, T = pc->T, H = pc->H, D = pc->D, C = H * D;
    for (int64_t i = 0; i < B * H * T; i++)
        lp[i] = -INFINITY;
    memset(dp, 0, sizeof(float) * (size_t)(B * T * 3 * C));
    for (int o = 0; o < pc->nb; o++) {
        int c = pc->order[o];
        for (int64_t b = 0; b < B; b++) {
            const float *k = qkv + (b * T + pc->k0[c]) * 3 * C + C;
            const dt_k_att_drop dr = {pc->p, k_drop_key, b * (H + 2) + 1, H + 2, T};
            ASSERT_OK(dt_k_attention_part_fwd(qkv + b * T * 3 * C, 3 * C, k, 3 * C, k + C, 3 * C, 1, T, pc->kn[c], H,
                                              D, 0, pc->k0[c], pc->causal, pc->window, pc->cap, pc->p > 0 ? &dr : NULL,
                                              yp + b * T * C, C, lp + b * H * T, T));
        }
    }
    for (int o = 0; o < pc->nb; o++) {
        int c = pc->order[o];
        for (int64_t b = 0; b < B; b++) {
            const float *k = qkv + (b * T + pc->k0[c]) * 3 * C + C;
            float *dk = dp + (b * T + pc->k0[c]) * 3 * C + C;
            const dt_k_att_drop dr = {pc->p, k_drop_key, b * (H + 2) + 1, H + 2, T};
            ASSERT_OK(dt_k_attention_part_bwd(qkv + b * T * 3 * C, 3 * C, k, 3 * C, k + C, 3 * C, y + b * T * C, C,
                                              lse + b * H * T, T, dy + b * T * C, C, 1, T, pc->kn[c], H, D, 0,
                                              pc->k0[c], pc->causal, pc->window, pc->cap, pc->p > 0 ? &dr : NULL,
                                              dp + b * T * 3 * C, 3 * C, dk, 3 * C, dk + C, 3 * C));
        }
    }
}

/* The blocks' y, lse and summed backward terms equal the whole attention's
 * (within TOL: the sums run in another order); with isa_bits, the blocks on
 * the portable loops (DT_K_ISA_SCALAR) give the vector paths' bits. */
static void part_vs_whole(const part_case *pc, bool isa_bits)
{
    const int64_t B = pc->B, T = pc->T, H = pc->H, D = pc->D, C = H * D;
    const size_t nq = (size_t)(B * T * 3 * C), ny = (size_t)(B * T * C), nl = (size_t)(B * H * T);
    float *qkv = rand_buf(nq, 7), *dy = rand_buf(ny, 11);
    float *y = malloc(sizeof(float) * ny), *lse = malloc(sizeof(float) * nl), *dq = malloc(sizeof(float) * nq);
    float *yp = malloc(sizeof(float) * ny), *lp = malloc(sizeof(float) * nl), *dp = malloc(sizeof(float) * nq);
    float *ys = malloc(sizeof(float) * ny), *ls = malloc(sizeof(float) * nl), *ds = malloc(sizeof(float) * nq);
    ASSERT(qkv && dy && y && lse && dq && yp && lp && dp && ys && ls && ds);
    ASSERT_OK(dt_k_attention_ex_fwd(DT_F32, qkv, B, T, H, D, 1, H + 2, pc->causal, pc->window, pc->cap, pc->p,
                                    k_drop_key, y, NULL, lse));
    ASSERT_OK(dt_k_attention_ex_bwd(DT_F32, qkv, y, lse, dy, B, T, H, D, 1, H + 2, pc->causal, pc->window, pc->cap,
                                    pc->p, k_drop_key, dq, NULL));
    part_blocks(pc, qkv, dy, y, lse, yp, lp, dp);
    for (size_t i = 0; i < ny; i++)
        ASSERT_NEAR(yp[i], y[i], TOL, TOL);
    for (size_t i = 0; i < nl; i++)
        ASSERT_NEAR(lp[i], lse[i], TOL, TOL);
    for (size_t i = 0; i < nq; i++)
        ASSERT_NEAR(dp[i], dq[i], TOL, TOL);
    if (isa_bits) {
        const dt_k_isa isa0 = dt_k_get_isa();
        ASSERT_OK(dt_k_set_isa(DT_K_ISA_SCALAR));
        part_blocks(pc, qkv, dy, y, lse, ys, ls, ds);
        ASSERT_OK(dt_k_set_isa(isa0));
        ASSERT_EQ_INT(memcmp(ys, yp, sizeof(float) * ny), 0);
        ASSERT_EQ_INT(memcmp(ls, lp, sizeof(float) * nl), 0);
        ASSERT_EQ_INT(memcmp(ds, dp, sizeof(float) * nq), 0);
    }
    free(qkv), free(dy), free(y), free(lse), free(dq), free(yp), free(lp), free(dp), free(ys), free(ls), free(ds);
}

/* The blocks of keys [0, 5), [5, 6), [6, 13), [13, 19) of T = 19, added in the order 2, 0, 3, 1 (with a window:
 * of 4, rows whose window starts inside a block, a block of one key some rows' windows pass by, the first block
 * before the last rows' windows whole; of 1, each row its own key; a cap of 0.3 bends these inputs' scores,
 * up to ~1.2, to under 0.3). */
static void part_small(bool causal, int64_t window, float cap, float p)
{
    static const int64_t k0[4] = {0, 5, 6, 13}, kn[4] = {5, 1, 7, 6};
    static const int order[4] = {2, 0, 3, 1};
    part_vs_whole(&(part_case){causal, 2, 19, 3, 8, 4, k0, kn, order, window, cap, p}, false);
}

TEST(part_blocks_equal_whole_causal) { part_small(true, 0, 0.0f, 0.0f); }
TEST(part_blocks_equal_whole_full) { part_small(false, 0, 0.0f, 0.0f); }
TEST(part_blocks_equal_whole_window)
{
    part_small(true, 4, 0.0f, 0.0f);
    part_small(true, 1, 0.0f, 0.0f);
}
TEST(part_blocks_equal_whole_cap)
{
    part_small(true, 0, 0.3f, 0.0f);
    part_small(true, 4, 0.3f, 0.0f);
}

/* One head of 150 positions (ten 16-row query blocks: a forward task takes
 * several), D = 24, keys cut at 70 and 71: a block of 79 keys (more than
 * one 64-key block, a last group of fewer than four keys), one of a single
 * key, and one of 70 whose causal rows start mid-block; the vector paths
 * (the tiles, the four-key sums, the 8-lane exponentials) against the
 * portable loops bit for bit too. */
static void part_long(bool causal, int64_t window, float cap, float p)
{
    static const int64_t k0[3] = {0, 70, 71}, kn[3] = {70, 1, 79};
    static const int order[3] = {2, 0, 1};
    part_vs_whole(&(part_case){causal, 1, 150, 1, 24, 3, k0, kn, order, window, cap, p}, true);
}

TEST(part_long_blocks_causal) { part_long(true, 0, 0.0f, 0.0f); }
TEST(part_long_blocks_full) { part_long(false, 0, 0.0f, 0.0f); }
/* windows of 37 (rows starting mid 64-key block and mid 8-key step), 64 (a block's width) and 100 (a window that
 * spans the three blocks) */
TEST(part_long_blocks_window)
{
    part_long(true, 37, 0.0f, 0.0f);
    part_long(true, 64, 0.0f, 0.0f);
    part_long(true, 100, 0.0f, 0.0f);
}
TEST(part_long_blocks_cap)
{
    part_long(true, 0, 0.5f, 0.0f);
    part_long(true, 37, 0.5f, 0.0f);
}

/* Dropout 0.3 on the blocks: each block draws its part of the whole sequence's mask (heads 1.. of a layer of H +
 * 2: a wrong head, position or scale draws another and misses by far more than TOL), forward and backward; the
 * long blocks' vector paths the portable loops' bits */
TEST(part_blocks_dropout)
{
    part_small(true, 0, 0.0f, 0.3f);
    part_small(false, 0, 0.0f, 0.3f);
    part_long(true, 0, 0.0f, 0.3f);
}

/* Dropout beside a window and a cap: the mask on the probabilities of the capped scores within the window, dS
 * through tanh' for the kept ones (the whole-sequence kernel's, itself against a double reference in
 * tests/kernels/test_attention) */
TEST(part_blocks_dropout_window_cap)
{
    part_small(true, 4, 0.0f, 0.3f);
    part_small(true, 0, 0.3f, 0.3f);
    part_small(true, 4, 0.3f, 0.3f);
    part_long(true, 37, 0.5f, 0.3f);
}

TEST(part_bad_arguments)
{
    float x[64] = {0}, l[4];
    ASSERT_STATUS(dt_k_attention_part_fwd(x, 2, x, 4, x, 4, 1, 2, 2, 1, 4, 0, 0, true, 0, 0.0f, NULL, x, 4, l, 2),
                  DT_ERR_INVALID_ARG); /* ldq below H D */
    ASSERT_STATUS(dt_k_attention_part_fwd(x, 4, x, 4, x, 4, 1, 2, 2, 1, 4, 0, 0, true, 0, 0.0f, NULL, x, 4, l, 1),
                  DT_ERR_INVALID_ARG); /* lse stride below Tq */
    ASSERT_STR_CONTAINS(dt_last_error(), "lse");
    ASSERT_STATUS(dt_k_attention_part_fwd(x, 4, x, 4, x, 4, 1, 2, 2, 1, 4, 0, 0, false, 3, 0.0f, NULL, x, 4, l, 2),
                  DT_ERR_INVALID_ARG); /* a window without the causal mask */
    ASSERT_STR_CONTAINS(dt_last_error(), "window");
    ASSERT_STATUS(dt_k_attention_part_bwd(x, 4, x, 4, x, 4, x, 4, l, 2, x, 4, 1, 2, 2, 1, 4, 0, 0, true, -1, 0.0f, NULL,
                                          x, 4, x, 4, x, 4), DT_ERR_INVALID_ARG); /* a negative window */
    ASSERT_STATUS(dt_k_attention_part_fwd(x, 4, x, 4, x, 4, 1, 2, 2, 1, 4, 0, 0, true, 0, -1.0f, NULL, x, 4, l, 2),
                  DT_ERR_INVALID_ARG); /* a negative cap */
    ASSERT_STR_CONTAINS(dt_last_error(), "soft cap");
    ASSERT_STATUS(dt_k_attention_part_bwd(x, 4, x, 4, x, 4, x, 4, l, 2, x, 4, 1, 2, 2, 1, 4, 0, 0, true, 0, INFINITY,
                                          NULL, x, 4, x, 4, x, 4), DT_ERR_INVALID_ARG); /* an infinite one */
    const dt_k_att_drop bad_p = {1.0f, k_drop_key, 0, 1, 2}, short_t = {0.1f, k_drop_key, 0, 1, 2};
    ASSERT_STATUS(dt_k_attention_part_fwd(x, 4, x, 4, x, 4, 1, 2, 2, 1, 4, 0, 0, true, 0, 0.0f, &bad_p, x, 4, l, 2),
                  DT_ERR_INVALID_ARG); /* dropout 1 */
    ASSERT_STR_CONTAINS(dt_last_error(), "dropout");
    ASSERT_STATUS(dt_k_attention_part_bwd(x, 4, x, 4, x, 4, x, 4, l, 2, x, 4, 1, 2, 2, 1, 4, 1, 0, true, 0, 0.0f,
                                          &short_t, x, 4, x, 4, x, 4), DT_ERR_INVALID_ARG); /* rows past T = 2 */
}

TEST(layout_positions_and_uneven_refused)
{
    dt_cp_layout L;
    const int64_t want[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}};
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(dt_cp_layout_make(r, 2, 8, true, &L));
        ASSERT_EQ_INT(L.local_len, 4);
        for (int64_t i = 0; i < 4; i++)
            ASSERT_EQ_INT(dt_cp_position(&L, i), want[r][i]);
        ASSERT_EQ_INT(dt_cp_position(&L, 4), -1);
    }
    ASSERT_OK(dt_cp_layout_make(1, 2, 8, false, &L));
    ASSERT_EQ_INT(dt_cp_position(&L, 0), 4);
    ASSERT_STATUS(dt_cp_layout_make(0, 2, 6, true, &L), DT_ERR_INVALID_ARG); /* 6 % 4 != 0 */
    ASSERT_STR_CONTAINS(dt_last_error(), "sequence length 6");
    ASSERT_STATUS(dt_cp_layout_make(0, 4, 10, false, &L), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "uneven chunks");
    ASSERT_STATUS(dt_cp_layout_make(2, 2, 8, false, &L), DT_ERR_INVALID_ARG);
}

typedef struct {
    int64_t T;
    bool balance, causal, ulysses;
    int64_t H;      /* 0: 4 */
    int64_t window; /* with causal: a sliding window (0 none) */
    float cap;      /* and a soft cap (0 none) */
    float p;        /* dropout on the probabilities (0 none) over heads [h0, h0 + H) of a layer of Ht */
    int64_t h0, Ht; /* (Ht 0: H) */
} ring_case;

static int body_ring(int rank, int P, void *arg)
{
    const ring_case *rc = arg;
    const int64_t B = 2, T = rc->T, H = rc->H ? rc->H : 4, D = 8, C = H * D;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    if (rc->ulysses && H % P != 0) { /* refused by name, on every rank */
        dt_cp_layout L;
        float x[1];
        TH_OK(dt_cp_layout_make(rank, P, T, rc->balance, &L));
        TH_CHECK(dt_cp_ulysses_fwd(pg, &L, x, 1, H, D, true, x, x) == DT_ERR_INVALID_ARG &&
                     strstr(dt_last_error(), "heads do not divide"),
                 "Ulysses with %lld heads on cp %d: %s", (long long)H, P, dt_last_error());
        dt_pg_free(pg);
        return 0;
    }
    /* the whole problem, the same on every rank, and its single-process answer */
    float *qkv = rand_buf((size_t)(B * T * 3 * C), 3), *dy = rand_buf((size_t)(B * T * C), 5);
    float *y = malloc(sizeof(float) * (size_t)(B * T * C)), *lse = malloc(sizeof(float) * (size_t)(B * H * T));
    float *dq = malloc(sizeof(float) * (size_t)(B * T * 3 * C));
    TH_CHECK(qkv && dy && y && lse && dq, "out of memory");
    const bool win = rc->window || rc->cap;
    const int64_t Ht = rc->Ht ? rc->Ht : H;
    const dt_rng_key key = dt_rng_key_make(11, DT_RNG_DROPOUT, 3, 1);
    TH_OK(dt_k_attention_ex_fwd(DT_F32, qkv, B, T, H, D, rc->h0, Ht, rc->causal, rc->window, rc->cap, rc->p, key, y,
                                NULL, lse));
    TH_OK(dt_k_attention_ex_bwd(DT_F32, qkv, y, lse, dy, B, T, H, D, rc->h0, Ht, rc->causal, rc->window, rc->cap,
                                rc->p, key, dq, NULL));
    dt_cp_layout L;
    TH_OK(dt_cp_layout_make(rank, P, T, rc->balance, &L));
    const int64_t Tl = L.local_len;
    float *lq = malloc(sizeof(float) * (size_t)(B * Tl * 3 * C)), *ldy = malloc(sizeof(float) * (size_t)(B * Tl * C));
    float *ly = malloc(sizeof(float) * (size_t)(B * Tl * C)), *ll = malloc(sizeof(float) * (size_t)(B * H * Tl));
    float *ld = malloc(sizeof(float) * (size_t)(B * Tl * 3 * C));
    TH_CHECK(lq && ldy && ly && ll && ld, "out of memory");
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tl; i++) {
            int64_t g = dt_cp_position(&L, i);
            memcpy(lq + (b * Tl + i) * 3 * C, qkv + (b * T + g) * 3 * C, sizeof(float) * (size_t)(3 * C));
            memcpy(ldy + (b * Tl + i) * C, dy + (b * T + g) * C, sizeof(float) * (size_t)C);
        }
    if (win && rc->p > 0.0f && rc->ulysses) { /* the general forms */
        TH_OK(dt_cp_ulysses_ex_fwd(pg, &L, lq, B, H, D, rc->h0, Ht, true, rc->window, rc->cap, rc->p, key, ly, ll));
        TH_OK(dt_cp_ulysses_ex_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->h0, Ht, true, rc->window, rc->cap, rc->p, key,
                                   ld));
    } else if (win && rc->p > 0.0f) {
        TH_OK(dt_cp_attention_ex_fwd(pg, &L, lq, B, H, D, rc->h0, Ht, true, rc->window, rc->cap, rc->p, key, ly, ll));
        TH_OK(dt_cp_attention_ex_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->h0, Ht, true, rc->window, rc->cap, rc->p,
                                     key, ld));
    } else if (win && rc->ulysses) {
        TH_OK(dt_cp_ulysses_window_fwd(pg, &L, lq, B, H, D, rc->window, rc->cap, ly, ll));
        TH_OK(dt_cp_ulysses_window_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->window, rc->cap, ld));
    } else if (win) {
        TH_OK(dt_cp_attention_window_fwd(pg, &L, lq, B, H, D, rc->window, rc->cap, ly, ll));
        TH_OK(dt_cp_attention_window_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->window, rc->cap, ld));
    } else if (!rc->ulysses && (rc->p > 0.0f || rc->Ht)) {
        TH_OK(dt_cp_attention_heads_fwd(pg, &L, lq, B, H, D, rc->h0, Ht, rc->causal, rc->p, key, ly, ll));
        TH_OK(dt_cp_attention_heads_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->h0, Ht, rc->causal, rc->p, key, ld));
    } else if (rc->ulysses && (rc->p > 0.0f || rc->Ht)) {
        TH_OK(dt_cp_ulysses_heads_fwd(pg, &L, lq, B, H, D, rc->h0, Ht, rc->causal, rc->p, key, ly, ll));
        TH_OK(dt_cp_ulysses_heads_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->h0, Ht, rc->causal, rc->p, key, ld));
    } else if (rc->ulysses) {
        TH_OK(dt_cp_ulysses_fwd(pg, &L, lq, B, H, D, rc->causal, ly, ll));
        TH_OK(dt_cp_ulysses_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->causal, ld));
    } else {
        TH_OK(dt_cp_attention_fwd(pg, &L, lq, B, H, D, rc->causal, ly, ll));
        TH_OK(dt_cp_attention_bwd(pg, &L, lq, ly, ll, ldy, B, H, D, rc->causal, ld));
    }
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < Tl; i++) {
            int64_t g = dt_cp_position(&L, i);
            for (int64_t c = 0; c < C; c++) {
                double e = fabs(ly[(b * Tl + i) * C + c] - y[(b * T + g) * C + c]);
                worst = e > worst ? e : worst;
            }
            for (int64_t c = 0; c < 3 * C; c++) {
                double e = fabs(ld[(b * Tl + i) * 3 * C + c] - dq[(b * T + g) * 3 * C + c]);
                worst = e > worst ? e : worst;
            }
            for (int64_t h = 0; h < H; h++) {
                double e = fabs(ll[(b * H + h) * Tl + i] - lse[(b * H + h) * T + g]);
                worst = e > worst ? e : worst;
            }
        }
    TH_CHECK(worst <= TOL, "%s cp %d, T %lld, balance %d, causal %d, window %lld, cap %g, dropout %g, heads %lld of "
             "%lld: largest difference %.3g", rc->ulysses ? "Ulysses" : "ring", P, (long long)T, rc->balance, rc->causal,
             (long long)rc->window, (double)rc->cap, (double)rc->p, (long long)rc->h0, (long long)Ht, worst);
    free(qkv), free(dy), free(y), free(lse), free(dq), free(lq), free(ldy), free(ly), free(ll), free(ld);
    dt_pg_free(pg);
    return 0;
}

static void ring(int P, int64_t T, bool balance, bool causal)
{
    ring_case rc = {T, balance, causal, false, 0, 0, 0.0f, 0.0f, 0, 0};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

static void ulysses(int P, int64_t T, bool balance, bool causal, int64_t H)
{
    ring_case rc = {T, balance, causal, true, H, 0, 0.0f, 0.0f, 0, 0};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

/* Ulysses with a sliding window of 5 over 24 positions (the balanced chunks of 6: a rank's rows see keys of
 * other ranks' chunks, cut by the window), a soft cap of 0.8 (the scores of these inputs reach where tanh
 * bends), and both; the ring with windows (balanced or not: the blocks before a chunk's window skipped, those
 * across its edge masked) */
static void ulysses_window(int P, int64_t window, float cap)
{
    ring_case rc = {24, true, true, true, 4, window, cap, 0.0f, 0, 0};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

static void ring_window(int P, int64_t T, bool balance, int64_t window, float cap)
{
    ring_case rc = {T, balance, true, false, 4, window, cap, 0.0f, 0, 0};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

TEST(ring_cp2_balanced_causal) { ring(2, 24, true, true); }
TEST(ring_cp2_plain_causal) { ring(2, 22, false, true); }
TEST(ring_cp2_full) { ring(2, 20, false, false); }
TEST(ring_cp4_balanced_causal) { ring(4, 40, true, true); }
TEST(ring_cp4_plain_causal) { ring(4, 36, false, true); }
TEST(ring_cp4_balanced_full) { ring(4, 24, true, false); }
TEST(ulysses_cp2_balanced_causal) { ulysses(2, 24, true, true, 4); }
TEST(ulysses_cp4_plain_causal) { ulysses(4, 20, false, true, 4); }
TEST(ulysses_cp4_balanced_full) { ulysses(4, 16, true, false, 4); }
TEST(ulysses_heads_must_divide) { ulysses(4, 16, true, true, 2); }
TEST(ulysses_cp2_sliding_window) { ulysses_window(2, 5, 0.0f); }
TEST(ulysses_cp2_soft_cap) { ulysses_window(2, 0, 0.8f); }
TEST(ulysses_cp4_window_and_cap) { ulysses_window(4, 3, 0.8f); }
TEST(ring_cp2_window) { ring_window(2, 24, true, 5, 0.0f); }
TEST(ring_cp4_window)
{
    ring_window(4, 40, true, 7, 0.0f);  /* chunks of 5: a window longer than a chunk */
    ring_window(4, 36, false, 2, 0.0f); /* chunks of 9, each row's window inside its own or the one before */
}
TEST(ring_cp2_soft_cap) { ring_window(2, 24, true, 0, 0.8f); }
TEST(ring_cp4_window_and_cap) { ring_window(4, 40, true, 7, 0.8f); }

/* Ulysses and the ring with dropout 0.3 on heads [4, 8) of a layer of 12 (a tp rank's heads): Ulysses' heads of
 * the whole sequence, and the ring's blocks, draw their part of the layer's mask, so y, lse and dqkv are the
 * whole-sequence kernel's with the same mask (a wrong head offset or position draws another mask: far outside the
 * bound); causal and not */
static void ulysses_dropout(int P, int64_t T, bool balance, bool causal)
{
    ring_case rc = {T, balance, causal, true, 4, 0, 0.0f, 0.3f, 4, 12};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

static void ring_dropout(int P, int64_t T, bool balance, bool causal)
{
    ring_case rc = {T, balance, causal, false, 4, 0, 0.0f, 0.3f, 4, 12};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

TEST(ulysses_cp2_dropout_balanced_causal) { ulysses_dropout(2, 24, true, true); }
TEST(ring_cp2_dropout_balanced_causal) { ring_dropout(2, 24, true, true); }
TEST(ring_cp4_dropout_plain_full) { ring_dropout(4, 16, false, false); }
TEST(ulysses_cp4_dropout_plain_full) { ulysses_dropout(4, 16, false, false); }

/* Dropout 0.3 beside a sliding window and a soft cap (Mistral's, Gemma 2's attention with attention_dropout), heads
 * [4, 8) of 12, under both attentions: the whole-sequence kernel's y, lse and dqkv */
static void window_dropout(int P, int64_t T, bool ulysses, int64_t window, float cap)
{
    ring_case rc = {T, true, true, ulysses, 4, window, cap, 0.3f, 4, 12};
    ASSERT_EQ_INT(th_run(P, 120.0, body_ring, &rc, NULL), 0);
}

TEST(ring_cp2_dropout_window_cap) { window_dropout(2, 24, false, 5, 0.8f); }
TEST(ring_cp4_dropout_window) { window_dropout(4, 40, false, 7, 0.0f); }
TEST(ulysses_cp2_dropout_window_cap) { window_dropout(2, 24, true, 5, 0.8f); }
TEST(ulysses_cp4_dropout_cap) { window_dropout(4, 16, true, 0, 0.8f); }

/* Bad windows and caps are refused by both attentions before any exchange (no rank waits) */
static int body_bad_masks(int rank, int P, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, P, NULL, &pg));
    dt_cp_layout L;
    float x[1];
    TH_OK(dt_cp_layout_make(rank, P, 16, true, &L));
    TH_CHECK(dt_cp_ulysses_window_fwd(pg, &L, x, 1, 4, 8, -2, 0.0f, x, x) == DT_ERR_INVALID_ARG,
             "Ulysses window -2: %s", dt_last_error());
    TH_CHECK(dt_cp_attention_window_fwd(pg, &L, x, 1, 4, 8, -2, 0.0f, x, x) == DT_ERR_INVALID_ARG,
             "ring window -2: %s", dt_last_error());
    TH_CHECK(dt_cp_attention_window_fwd(pg, &L, x, 1, 4, 8, 4, NAN, x, x) == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "soft cap"), "ring cap NaN: %s", dt_last_error());
    TH_CHECK(dt_cp_attention_window_bwd(pg, &L, x, x, x, x, 1, 4, 8, 0, -1.0f, x) == DT_ERR_INVALID_ARG,
             "ring backward cap -1: %s", dt_last_error());
    TH_CHECK(dt_cp_ulysses_window_bwd(pg, &L, x, x, x, x, 1, 4, 8, 0, INFINITY, x) == DT_ERR_INVALID_ARG,
             "Ulysses backward cap inf: %s", dt_last_error());
    const dt_rng_key key = dt_rng_key_make(1, DT_RNG_DROPOUT, 0, 0);
    TH_CHECK(dt_cp_ulysses_heads_fwd(pg, &L, x, 1, 4, 8, 0, 4, true, 1.0f, key, x, x) == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "dropout"), "Ulysses dropout 1: %s", dt_last_error());
    TH_CHECK(dt_cp_ulysses_heads_bwd(pg, &L, x, x, x, x, 1, 4, 8, 2, 4, true, 0.1f, key, x) == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "not inside a layer"), "Ulysses heads [2, 6) of 4: %s", dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(bad_masks_refused_before_exchange) { ASSERT_EQ_INT(th_run(2, 60.0, body_bad_masks, NULL, NULL), 0); }

/* The forked ranks first: a child of a process whose OpenMP pool has
 * started can hang in its first parallel region (libgomp is not fork-safe),
 * so the parent runs no kernel until the ring tests are done. */
int main(void)
{
    RUN(layout_positions_and_uneven_refused);
    RUN(ring_cp2_balanced_causal);
    RUN(ring_cp2_plain_causal);
    RUN(ring_cp2_full);
    RUN(ring_cp4_balanced_causal);
    RUN(ring_cp4_plain_causal);
    RUN(ring_cp4_balanced_full);
    RUN(ulysses_cp2_balanced_causal);
    RUN(ulysses_cp4_plain_causal);
    RUN(ulysses_cp4_balanced_full);
    RUN(ulysses_heads_must_divide);
    RUN(ulysses_cp2_sliding_window);
    RUN(ulysses_cp2_soft_cap);
    RUN(ulysses_cp4_window_and_cap);
    RUN(ulysses_cp2_dropout_balanced_causal);
    RUN(ulysses_cp4_dropout_plain_full);
    RUN(ring_cp2_dropout_window_cap);
    RUN(ring_cp4_dropout_window);
    RUN(ulysses_cp2_dropout_window_cap);
    RUN(ulysses_cp4_dropout_cap);
    RUN(ring_cp2_dropout_balanced_causal);
    RUN(ring_cp4_dropout_plain_full);
    RUN(ring_cp2_window);
    RUN(ring_cp4_window);
    RUN(ring_cp2_soft_cap);
    RUN(ring_cp4_window_and_cap);
    RUN(bad_masks_refused_before_exchange);
    RUN(part_blocks_equal_whole_causal);
    RUN(part_blocks_equal_whole_full);
    RUN(part_blocks_equal_whole_window);
    RUN(part_blocks_equal_whole_cap);
    RUN(part_blocks_dropout);
    RUN(part_blocks_dropout_window_cap);
    RUN(part_long_blocks_causal);
    RUN(part_long_blocks_full);
    RUN(part_long_blocks_window);
    RUN(part_long_blocks_cap);
    RUN(part_bad_arguments);
    return TEST_REPORT();
}
