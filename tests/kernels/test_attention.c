/* The blocked online-softmax attention kernel against a naive reference that
 * materialises the (T, T) probabilities (in double): forward and backward,
 * causal and not, T odd and spanning several query and key blocks, dropout
 * with the kernel's documented mask, sliding windows (the blocked kernel
 * under dt_k_attention_window_fwd/_bwd: windows of 1, 2, a
 * query block, a key block, one key either side of it, not a multiple of
 * 8, wider than a block; the same bits as the causal kernel for a window
 * of 0 or T or more, and on every ISA path), soft caps (the same bits on
 * every ISA path and thread count; their values against a double
 * reference: tests/autograd/test_llama_ops, and bf16:
 * tests/kernels/test_attention_bf16); the fused bias + GELU against the
 * unfused kernels; the chunked cross-entropy (rows wider than one chunk)
 * against a plain double loop. */
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>

typedef struct {
    int64_t B, T, H, D;
    bool causal;
    float p;
} cfg;

/* What only the general entry point (dt_k_attention_ex_fwd) takes */
typedef struct {
    float cap;      /* > 0: the scores soft-capped (causal) */
    int64_t h0, Ht; /* the dropout mask's heads [h0, h0 + H) of Ht (Ht 0: H) */
} ext;

/* score (i, j) of head h after the cap; *th its tanh (0 without a cap) */
static double naive_score(const float *qkv, cfg c, ext e, int64_t b, int64_t h, int64_t i, int64_t j, double *th)
{
    const int64_t C = c.H * c.D, C3 = 3 * C, T = c.T, D = c.D;
    double v = 0;
    for (int64_t d = 0; d < D; d++)
        v += (double)qkv[(b * T + i) * C3 + h * D + d] * qkv[(b * T + j) * C3 + C + h * D + d];
    v /= sqrt((double)D);
    *th = e.cap > 0 ? tanh(v / e.cap) : 0.0;
    return e.cap > 0 ? e.cap * *th : v;
}

/* Pu: softmax probabilities (B, H, T, T); M: dropout factor (0 or 1/(1-p), 1 without). window > 0: query i
   sees the keys (i - window, i] (with c.causal). */
static void naive_fwd(const float *qkv, cfg c, ext e, int64_t window, dt_rng_key key, double *y, double *Pu,
                      double *M)
{
    int64_t C = c.H * c.D, C3 = 3 * C, T = c.T, D = c.D;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.H; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t row = ((b * c.H + h) * T + i) * T;
                const int64_t mrow = ((b * (e.Ht ? e.Ht : c.H) + e.h0 + h) * T + i) * T; /* the mask's */
                double *pr = Pu + row, *mr = M + row, m = -INFINITY, s = 0, th;
                for (int64_t j = 0; j < T; j++) {
                    pr[j] = (c.causal && j > i) || (window > 0 && j + window <= i) ? -INFINITY
                                                                                   : naive_score(qkv, c, e, b, h, i, j, &th);
                    m = pr[j] > m ? pr[j] : m;
                }
                for (int64_t j = 0; j < T; j++)
                    s += pr[j] = exp(pr[j] - m);
                for (int64_t j = 0; j < T; j++) {
                    pr[j] /= s;
                    mr[j] = c.p == 0 ? 1.0
                            : dt_rng_uniform(key, (uint64_t)(mrow + j)) >= c.p ? 1.0 / (1.0 - c.p) : 0.0;
                }
                for (int64_t d = 0; d < D; d++) {
                    double a = 0;
                    for (int64_t j = 0; j < T; j++)
                        a += pr[j] * mr[j] * qkv[(b * T + j) * C3 + 2 * C + h * D + d];
                    y[(b * T + i) * C + h * D + d] = a;
                }
            }
}

static void naive_bwd(const float *qkv, const double *Pu, const double *M, const float *dy, cfg c, ext e,
                      double *dqkv)
{
    int64_t C = c.H * c.D, C3 = 3 * C, T = c.T, D = c.D;
    double scale = 1.0 / sqrt((double)D);
    memset(dqkv, 0, (size_t)(c.B * T * C3) * sizeof(double));
    double *dPu = malloc((size_t)T * sizeof(double));
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t h = 0; h < c.H; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t row = ((b * c.H + h) * T + i) * T;
                const float *g = dy + (b * T + i) * C + h * D;
                double sum = 0;
                for (int64_t j = 0; j < T; j++) {
                    double dPd = 0;
                    for (int64_t d = 0; d < D; d++) {
                        dPd += (double)g[d] * qkv[(b * T + j) * C3 + 2 * C + h * D + d];
                        dqkv[(b * T + j) * C3 + 2 * C + h * D + d] += Pu[row + j] * M[row + j] * g[d];
                    }
                    dPu[j] = dPd * M[row + j];
                    sum += Pu[row + j] * dPu[j];
                }
                for (int64_t j = 0; j < T; j++) {
                    double th = 0;
                    if (e.cap > 0 && Pu[row + j] != 0)
                        naive_score(qkv, c, e, b, h, i, j, &th);
                    double dS = Pu[row + j] * (dPu[j] - sum) * (1.0 - th * th) * scale;
                    for (int64_t d = 0; d < D; d++) {
                        dqkv[(b * T + i) * C3 + h * D + d] += dS * qkv[(b * T + j) * C3 + C + h * D + d];
                        dqkv[(b * T + j) * C3 + C + h * D + d] += dS * qkv[(b * T + i) * C3 + h * D + d];
                    }
                }
            }
    free(dPu);
}

static void fill(float *x, int64_t n, uint64_t seed, float sd)
{
    dt_rng_fill_normal(dt_rng_key_make(seed, DT_RNG_USER, 3, 0), 0, x, (size_t)n, 0.0f, sd);
}

static double max_rel(const float *a, const double *ref, int64_t n)
{
    double amax = 0, emax = 0;
    for (int64_t i = 0; i < n; i++) {
        amax = fmax(amax, fabs(ref[i]));
        emax = fmax(emax, fabs((double)a[i] - ref[i]));
    }
    return emax / (amax > 0 ? amax : 1);
}

/* window > 0: the sliding window's entry points (c causal, no dropout); the general one (dt_k_attention_ex_fwd)
 * with a cap, heads of a layer, or a window with dropout */
static int check_ex(cfg c, int64_t window, ext e)
{
    const bool ex = e.cap > 0 || e.Ht || (window > 0 && c.p > 0);
    int64_t C = c.H * c.D, nq = c.B * c.T * 3 * C, ny = c.B * c.T * C, np = c.B * c.H * c.T * c.T;
    float *qkv = malloc((size_t)nq * 4), *y = malloc((size_t)ny * 4), *lse = malloc((size_t)(c.B * c.H * c.T) * 4);
    float *dy = malloc((size_t)ny * 4), *dq = malloc((size_t)nq * 4);
    double *ry = malloc((size_t)ny * 8), *Pu = malloc((size_t)np * 8), *M = malloc((size_t)np * 8);
    double *rdq = malloc((size_t)nq * 8);
    dt_rng_key key = dt_rng_key_make(77, DT_RNG_DROPOUT, 1, 2);
    fill(qkv, nq, (uint64_t)(c.T * 7 + c.causal), 1.5f);
    fill(dy, ny, 5, 1.0f);
    int bad = 0;
    const int64_t Ht = e.Ht ? e.Ht : c.H;
    dt_status st = ex ? dt_k_attention_ex_fwd(DT_F32, qkv, c.B, c.T, c.H, c.D, e.h0, Ht, c.causal, window, e.cap, c.p,
                                              key, y, NULL, lse)
                   : window > 0 ? dt_k_attention_window_fwd(qkv, c.B, c.T, c.H, c.D, window, 0.0f, y, lse)
                                : dt_k_attention_fwd(qkv, c.B, c.T, c.H, c.D, c.causal, c.p, key, y, lse);
    if (st >= 0)
        st = ex ? dt_k_attention_ex_bwd(DT_F32, qkv, y, lse, dy, c.B, c.T, c.H, c.D, e.h0, Ht, c.causal, window, e.cap,
                                        c.p, key, dq, NULL)
             : window > 0 ? dt_k_attention_window_bwd(qkv, y, lse, dy, c.B, c.T, c.H, c.D, window, 0.0f, dq)
                          : dt_k_attention_bwd(qkv, y, lse, dy, c.B, c.T, c.H, c.D, c.causal, c.p, key, dq);
    if (st < 0) {
        fprintf(stderr, "kernel failed: %s\n", dt_last_error());
        bad = 1;
    } else {
        naive_fwd(qkv, c, e, window, key, ry, Pu, M);
        naive_bwd(qkv, Pu, M, dy, c, e, rdq);
        double ef = max_rel(y, ry, ny), eb = max_rel(dq, rdq, nq);
        if (!(ef < 2e-6 && eb < 2e-5)) {
            fprintf(stderr, "B%lld T%lld H%lld D%lld causal %d p %.2f window %lld cap %g heads %lld of %lld: forward "
                    "rel err %.3g, backward %.3g\n",
                    (long long)c.B, (long long)c.T, (long long)c.H, (long long)c.D, c.causal, (double)c.p,
                    (long long)window, (double)e.cap, (long long)e.h0, (long long)Ht, ef, eb);
            bad = 1;
        }
    }
    free(qkv), free(y), free(lse), free(dy), free(dq), free(ry), free(Pu), free(M), free(rdq);
    return bad;
}

static int check_case(cfg c, int64_t window) { return check_ex(c, window, (ext){0.0f, 0, 0}); }

TEST(attention_vs_naive)
{
    const cfg cases[] = {
        {1, 1, 1, 4, true, 0}, {2, 5, 3, 8, true, 0},   {2, 5, 3, 8, false, 0},   {1, 37, 2, 16, true, 0},
        {1, 37, 2, 16, false, 0}, {2, 131, 2, 8, true, 0}, {1, 131, 1, 24, false, 0}, {1, 64, 2, 64, true, 0},
        {2, 33, 2, 8, true, 0.3f}, {1, 70, 1, 8, false, 0.5f},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        ASSERT_EQ_INT(check_case(cases[k], 0), 0);
}

/* Sliding windows on the blocked kernel: 1 and 2 (a row's keys inside one block, pairs split), 16 (a query
   block), 37 (no multiple of 8: row_dots' steps start inside the window), 63, 64 and 65 (a key block and one
   key either side), 100 (two key blocks), T - 1; T not a multiple of 16 or 64, B and H above 1, D 8 to 40. */
TEST(attention_window_vs_naive)
{
    const struct {
        cfg c;
        int64_t window;
    } cases[] = {
        {{1, 131, 2, 16, true, 0}, 1},  {{2, 131, 2, 8, true, 0}, 2},   {{1, 100, 2, 16, true, 0}, 16},
        {{2, 150, 3, 16, true, 0}, 37}, {{1, 200, 2, 24, true, 0}, 63}, {{1, 200, 3, 24, true, 0}, 64},
        {{2, 131, 1, 40, true, 0}, 65}, {{1, 300, 1, 8, true, 0}, 100}, {{1, 70, 2, 8, true, 0}, 69},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        ASSERT_EQ_INT(check_case(cases[k].c, cases[k].window), 0);
}

/* The general entry point against the double reference: a soft cap (0.3 bends these scores, up to ~4, far
   into tanh's flat part), with dropout 0.3 (dS through tanh' for the kept ones only), with a window as well, a
   window with dropout, heads [2, 5) of a layer of 7 (the mask's head index), and T past a key block; a wrong
   derivative, mask or head misses by far more than the bound */
TEST(attention_ex_vs_naive)
{
    const struct {
        cfg c;
        int64_t window;
        ext e;
    } cases[] = {
        {{2, 37, 3, 8, true, 0.0f}, 0, {0.3f, 0, 0}},   {{2, 37, 3, 8, true, 0.3f}, 0, {0.3f, 0, 0}},
        {{1, 131, 2, 16, true, 0.3f}, 37, {0.3f, 0, 0}}, {{2, 70, 2, 8, true, 0.3f}, 16, {0.0f, 0, 0}},
        {{1, 77, 3, 24, true, 0.2f}, 20, {1.0f, 2, 7}},  {{2, 33, 3, 8, false, 0.3f}, 0, {0.0f, 2, 7}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        ASSERT_EQ_INT(check_ex(cases[k].c, cases[k].window, cases[k].e), 0);
}

/* The general entry point's arguments: a window or a cap without the causal mask, an f32 qkv with a rounded
   copy, a dtype it does not take */
TEST(attention_ex_bad_args)
{
    float x[24] = {0}, y[8], l[2];
    const dt_rng_key k = dt_rng_key_make(0, DT_RNG_DROPOUT, 0, 0);
    ASSERT_STATUS(dt_k_attention_ex_fwd(DT_F32, x, 1, 2, 1, 4, 0, 1, false, 2, 0.0f, 0.1f, k, y, NULL, l),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "causal");
    ASSERT_STATUS(dt_k_attention_ex_bwd(DT_F32, x, y, l, y, 1, 2, 1, 4, 0, 1, false, 0, 0.5f, 0.0f, k, x, NULL),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_attention_ex_fwd(DT_F32, x, 1, 2, 1, 4, 0, 1, true, 0, 0.0f, 0.0f, k, y, x, l),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_attention_ex_fwd(DT_I32, x, 1, 2, 1, 4, 0, 1, true, 0, 0.0f, 0.0f, k, y, NULL, l),
                  DT_ERR_DTYPE);
    ASSERT_STATUS(dt_k_attention_ex_fwd(DT_F32, x, 1, 2, 1, 4, 1, 1, true, 0, 0.0f, 0.0f, k, y, NULL, l),
                  DT_ERR_INVALID_ARG); /* heads [1, 2) of 1 */
    ASSERT_STATUS(dt_k_attention_ex_fwd(DT_F32, x, 1, 2, 1, 300, 0, 1, true, 0, 0.0f, 0.0f, k, y, NULL, l),
                  DT_ERR_UNSUPPORTED); /* the head size over the kernel's limit, as dt_k_attention_fwd's */
}

/* A window of 0 or T or more is none: the causal kernel's bits, forward and backward; a window of T - 1 is
   not. */
TEST(attention_window_none_same_bits)
{
    const cfg c = {2, 77, 3, 16, true, 0};
    const int64_t C = c.H * c.D, nq = c.B * c.T * 3 * C, ny = c.B * c.T * C, nl = c.B * c.H * c.T;
    float *qkv = malloc((size_t)nq * 4), *dy = malloc((size_t)ny * 4), *y[2], *dq[2], *lse[2];
    fill(qkv, nq, 8, 1.0f);
    fill(dy, ny, 9, 1.0f);
    for (int r = 0; r < 2; r++)
        y[r] = malloc((size_t)ny * 4), dq[r] = malloc((size_t)nq * 4), lse[r] = malloc((size_t)nl * 4);
    ASSERT_OK(dt_k_attention_fwd(qkv, c.B, c.T, c.H, c.D, true, 0.0f, (dt_rng_key){0}, y[0], lse[0]));
    ASSERT_OK(dt_k_attention_bwd(qkv, y[0], lse[0], dy, c.B, c.T, c.H, c.D, true, 0.0f, (dt_rng_key){0}, dq[0]));
    const int64_t windows[] = {0, 77, 78, 1000, 76};
    for (size_t k = 0; k < sizeof windows / sizeof windows[0]; k++) {
        ASSERT_OK(dt_k_attention_window_fwd(qkv, c.B, c.T, c.H, c.D, windows[k], 0.0f, y[1], lse[1]));
        ASSERT_OK(dt_k_attention_window_bwd(qkv, y[1], lse[1], dy, c.B, c.T, c.H, c.D, windows[k], 0.0f, dq[1]));
        const bool same = !memcmp(y[0], y[1], (size_t)ny * 4) && !memcmp(lse[0], lse[1], (size_t)nl * 4) &&
                          !memcmp(dq[0], dq[1], (size_t)nq * 4);
        ASSERT_EQ_INT(same, windows[k] != 76);
    }
    free(qkv), free(dy);
    for (int r = 0; r < 2; r++)
        free(y[r]), free(dq[r]), free(lse[r]);
}

TEST(attention_threads_identical)
{
    cfg c = {2, 77, 3, 16, true, 0.1f};
    int64_t C = c.H * c.D, nq = c.B * c.T * 3 * C, ny = c.B * c.T * C;
    float *qkv = malloc((size_t)nq * 4), *dy = malloc((size_t)ny * 4), *lse = malloc((size_t)(c.B * c.H * c.T) * 4);
    float *y[2], *dq[2];
    fill(qkv, nq, 3, 1.0f);
    fill(dy, ny, 4, 1.0f);
    dt_rng_key key = dt_rng_key_make(1, DT_RNG_DROPOUT, 0, 0);
    int th0 = dt_get_num_threads();
    /* dropout, then a sliding window (the tasks' first keys move with the threads' grouping of query blocks),
       soft caps with and without one */
    const struct {
        int64_t window;
        float cap;
    } wc[4] = {{0, 0.0f}, {20, 0.0f}, {0, 0.3f}, {20, 50.0f}};
    for (int k = 0; k < 4; k++) {
        const int64_t w = wc[k].window;
        const float cap = wc[k].cap;
        for (int r = 0; r < 2; r++) {
            dt_set_num_threads(r ? 2 : 1);
            y[r] = malloc((size_t)ny * 4), dq[r] = malloc((size_t)nq * 4);
            if (w || cap > 0.0f) {
                ASSERT_OK(dt_k_attention_window_fwd(qkv, c.B, c.T, c.H, c.D, w, cap, y[r], lse));
                ASSERT_OK(dt_k_attention_window_bwd(qkv, y[r], lse, dy, c.B, c.T, c.H, c.D, w, cap, dq[r]));
                continue;
            }
            ASSERT_OK(dt_k_attention_fwd(qkv, c.B, c.T, c.H, c.D, true, c.p, key, y[r], lse));
            ASSERT_OK(dt_k_attention_bwd(qkv, y[r], lse, dy, c.B, c.T, c.H, c.D, true, c.p, key, dq[r]));
        }
        dt_set_num_threads(th0);
        ASSERT_EQ_INT(memcmp(y[0], y[1], (size_t)ny * 4), 0);
        ASSERT_EQ_INT(memcmp(dq[0], dq[1], (size_t)nq * 4), 0);
        free(y[0]), free(y[1]), free(dq[0]), free(dq[1]);
    }
    free(qkv), free(dy), free(lse);
}

/* An f32 qkv gives the same bits on the vector paths (the 4-key weighted
 * sums of the backward, the whole-head tiles, the 64- and 32-column running
 * sums, the 8-lane exponentials and tanh) as on the portable loops: shapes with D's tails (40, 24), a last
 * key block of fewer than 4 keys (T 131), causal or not, dropout, sliding windows and soft caps (0.3, 1 and
 * 50; D 8 and 256). */
TEST(attention_isa_paths_identical)
{
    const cfg cases[] = {{2, 131, 2, 64, true, 0}, {1, 131, 3, 64, false, 0}, {2, 70, 2, 40, true, 0.2f},
                         {1, 67, 2, 24, false, 0}, {1, 200, 1, 80, true, 0}, {2, 150, 2, 40, true, 0},
                         {1, 200, 2, 24, true, 0},  {2, 131, 2, 64, true, 0}, {1, 150, 2, 40, true, 0},
                         {2, 77, 2, 8, true, 0},    {1, 100, 1, 256, true, 0}};
    const int64_t windows[] = {0, 0, 0, 0, 0, 37, 2, 0, 37, 5, 64}; /* from the sixth: sliding windows, caps */
    const float caps[] = {0, 0, 0, 0, 0, 0, 0, 0.3f, 50.0f, 1.0f, 0.3f};
    const dt_k_isa isa0 = dt_k_get_isa();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const cfg c = cases[k];
        const int64_t w = windows[k];
        const float cap = caps[k];
        const int64_t C = c.H * c.D, nq = c.B * c.T * 3 * C, ny = c.B * c.T * C;
        float *qkv = malloc((size_t)nq * 4), *dy = malloc((size_t)ny * 4);
        float *lse = malloc((size_t)(c.B * c.H * c.T) * 4), *y[2], *dq[2];
        fill(qkv, nq, 5 + k, 1.0f);
        fill(dy, ny, 6 + k, 1.0f);
        const dt_rng_key key = dt_rng_key_make(2, DT_RNG_DROPOUT, 0, 0);
        for (int r = 0; r < 2; r++) {
            ASSERT_OK(dt_k_set_isa(r ? DT_K_ISA_SCALAR : isa0));
            y[r] = malloc((size_t)ny * 4), dq[r] = malloc((size_t)nq * 4);
            if (w || cap > 0.0f) {
                ASSERT_OK(dt_k_attention_window_fwd(qkv, c.B, c.T, c.H, c.D, w, cap, y[r], lse));
                ASSERT_OK(dt_k_attention_window_bwd(qkv, y[r], lse, dy, c.B, c.T, c.H, c.D, w, cap, dq[r]));
                continue;
            }
            ASSERT_OK(dt_k_attention_fwd(qkv, c.B, c.T, c.H, c.D, c.causal, c.p, key, y[r], lse));
            ASSERT_OK(dt_k_attention_bwd(qkv, y[r], lse, dy, c.B, c.T, c.H, c.D, c.causal, c.p, key, dq[r]));
        }
        ASSERT_OK(dt_k_set_isa(isa0));
        ASSERT_EQ_INT(memcmp(y[0], y[1], (size_t)ny * 4), 0);
        ASSERT_EQ_INT(memcmp(dq[0], dq[1], (size_t)nq * 4), 0);
        free(qkv), free(dy), free(lse), free(y[0]), free(y[1]), free(dq[0]), free(dq[1]);
    }
}

TEST(attention_bad_args)
{
    float x[24] = {0}, y[8], l[2];
    dt_rng_key k = dt_rng_key_make(0, DT_RNG_DROPOUT, 0, 0);
    ASSERT_STATUS(dt_k_attention_fwd(x, 1, 2, 0, 4, true, 0, k, y, l), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_attention_fwd(x, 1, 2, 1, 4, true, 1.0f, k, y, l), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_attention_fwd(x, 1, 2, 1, 300, true, 0, k, y, l), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_attention_fwd(NULL, 1, 2, 1, 4, true, 0, k, y, l), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_attention_bwd(x, y, NULL, y, 1, 2, 1, 4, true, 0, k, x), DT_ERR_NULL);
}

TEST(bias_gelu_matches_unfused)
{
    const int64_t R = 7, N = 131;
    float *x = malloc(R * N * 4), *b = malloc(N * 4), *dy = malloc(R * N * 4), *y = malloc(R * N * 4);
    float *h = malloc(R * N * 4), *ry = malloc(R * N * 4), *dx = malloc(R * N * 4), *rdx = malloc(R * N * 4);
    float db[131];
    fill(x, R * N, 1, 2.0f);
    fill(b, N, 2, 1.0f);
    fill(dy, R * N, 3, 1.0f);
    for (int a = 0; a < 2; a++) {
        dt_k_gelu_approx ap = a ? DT_K_GELU_TANH : DT_K_GELU_ERF;
        ASSERT_OK(dt_k_bias_gelu_fwd(x, b, R, N, y, ap));
        ASSERT_OK(dt_k_bias_gelu_bwd(x, b, dy, R, N, dx, db, ap));
        for (int64_t i = 0; i < R * N; i++)
            h[i] = x[i] + b[i % N];
        ASSERT_OK(dt_k_gelu_fwd(h, ry, R * N, ap));
        ASSERT_OK(dt_k_gelu_bwd(h, dy, rdx, R * N, ap));
        for (int64_t i = 0; i < R * N; i++) {
            ASSERT_NEAR(y[i], ry[i], 1e-6, 1e-6);
            ASSERT_NEAR(dx[i], rdx[i], 1e-6, 1e-6);
        }
        for (int64_t j = 0; j < N; j++) {
            double s = 0;
            for (int64_t r = 0; r < R; r++)
                s += rdx[r * N + j];
            ASSERT_NEAR(db[j], s, 1e-5, 1e-6);
        }
    }
    ASSERT_STATUS(dt_k_bias_gelu_fwd(x, b, R, N, y, (dt_k_gelu_approx)7), DT_ERR_INVALID_ARG);
    free(x), free(b), free(dy), free(y), free(h), free(ry), free(dx), free(rdx);
}

/* Rows of 5000 logits span three 2048-column chunks; the max sits in a late
 * chunk in one row and in the first in another (the online rescale). */
TEST(xent_chunked_wide_rows)
{
    const int64_t R = 3, V = 5000;
    float *lg = malloc(R * V * 4), *g = malloc(R * V * 4);
    int64_t lab[3] = {4999, 0, DT_K_IGNORE_INDEX};
    fill(lg, R * V, 9, 3.0f);
    lg[4500] = 30.0f;      /* row 0: max in the last chunk */
    lg[V + 3] = 25.0f;     /* row 1: max in the first chunk */
    float loss;
    ASSERT_OK(dt_k_softmax_xent_fwd(lg, lab, DT_I64, R, V, &loss, NULL));
    ASSERT_OK(dt_k_softmax_xent_bwd(lg, NULL, lab, DT_I64, R, V, 2.0f, g));
    double tot = 0;
    for (int64_t r = 0; r < 2; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++)
            m = fmax(m, lg[r * V + j]);
        for (int64_t j = 0; j < V; j++)
            s += exp((double)lg[r * V + j] - m);
        double lse = m + log(s);
        tot += lse - lg[r * V + lab[r]];
        for (int64_t j = 0; j < V; j++) {
            double want = 2.0 / 2 * (exp(lg[r * V + j] - lse) - (j == lab[r]));
            ASSERT_NEAR(g[r * V + j], want, 1e-6, 1e-5);
        }
    }
    ASSERT_NEAR(loss, tot / 2, 0, 1e-5);
    for (int64_t j = 0; j < V; j++)
        ASSERT_NEAR(g[2 * V + j], 0.0, 0.0, 0.0);
    free(lg), free(g);
}

int main(void)
{
    RUN(attention_vs_naive);
    RUN(attention_window_vs_naive);
    RUN(attention_ex_vs_naive);
    RUN(attention_ex_bad_args);
    RUN(attention_window_none_same_bits);
    RUN(attention_threads_identical);
    RUN(attention_isa_paths_identical);
    RUN(attention_bad_args);
    RUN(bias_gelu_matches_unfused);
    RUN(xent_chunked_wide_rows);
    return TEST_REPORT();
}
