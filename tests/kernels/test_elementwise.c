/* Elementwise, broadcasting, reductions, strided copy, dropout and embedding
 * values; thread-count independence of the reductions; bad arguments. */
#include "dtrain/kernels.h"
#include "test.h"

#include <string.h>

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 9, 9), 0, x, (size_t)n, lo, hi);
}

TEST(binary_broadcast_values)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, c[2] = {100, 200}, out[6];
    int64_t sa[2] = {2, 3}, sb[1] = {3}, sc[2] = {2, 1};
    ASSERT_OK(dt_k_binary(DT_K_ADD, a, sa, 2, b, sb, 1, out));
    const float w1[6] = {11, 22, 33, 14, 25, 36};
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(out[i], w1[i], 0, 0);
    ASSERT_OK(dt_k_binary(DT_K_SUB, a, sa, 2, c, sc, 2, out));
    const float w2[6] = {-99, -98, -97, -196, -195, -194};
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(out[i], w2[i], 0, 0);
    /* (2,1) x (3) -> (2,3) outer product */
    ASSERT_OK(dt_k_binary(DT_K_MUL, c, sc, 2, b, sb, 1, out));
    ASSERT_NEAR(out[0], 1000, 0, 0);
    ASSERT_NEAR(out[5], 6000, 0, 0);
    /* scalar (0 dims) */
    float two = 2.0f;
    ASSERT_OK(dt_k_binary(DT_K_DIV, a, sa, 2, &two, NULL, 0, out));
    ASSERT_NEAR(out[5], 3, 0, 0);
    float m[2] = {3, NAN};
    int64_t s2[1] = {2};
    float one[2] = {4, 1}, mo[2];
    ASSERT_OK(dt_k_binary(DT_K_MAXIMUM, m, s2, 1, one, s2, 1, mo));
    ASSERT_NEAR(mo[0], 4, 0, 0);
    ASSERT(isnan(mo[1])); /* NaN propagates as torch.maximum */
    /* in place */
    ASSERT_OK(dt_k_binary(DT_K_ADD, a, sa, 2, b, sb, 1, a));
    ASSERT_NEAR(a[3], 14, 0, 0);
    int64_t bad[1] = {4};
    ASSERT_STATUS(dt_k_binary(DT_K_ADD, a, sa, 2, b, bad, 1, out), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "[2,3]");
    ASSERT_STATUS(dt_k_binary((dt_k_binop)42, a, sa, 2, b, sb, 1, out), DT_ERR_INVALID_ARG);
    int64_t neg[1] = {-3};
    ASSERT_STATUS(dt_k_binary(DT_K_ADD, a, neg, 1, b, sb, 1, out), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_binary(DT_K_ADD, NULL, sa, 2, b, sb, 1, out), DT_ERR_NULL);
}

TEST(large_elementwise_threads)
{
    const int64_t n = 300001;
    float *a = dt_alloc(n * 4), *b = dt_alloc(n * 4), *o = dt_alloc(n * 4);
    fill(a, n, 1, -1, 1);
    fill(b, n, 2, -1, 1);
    int64_t s[1] = {n};
    ASSERT_OK(dt_k_binary(DT_K_MUL, a, s, 1, b, s, 1, o));
    for (int64_t i = 0; i < n; i += 997)
        ASSERT(o[i] == a[i] * b[i]);
    ASSERT(o[n - 1] == a[n - 1] * b[n - 1]);
    ASSERT_OK(dt_k_scale(a, 2.0f, 1.0f, o, n));
    ASSERT(o[n - 1] == 2.0f * a[n - 1] + 1.0f);
    ASSERT_OK(dt_k_axpy(n, -2.0f, a, o));
    ASSERT(o[77] == 1.0f);
    ASSERT_OK(dt_k_fill(o, 3.5f, n));
    ASSERT(o[n - 1] == 3.5f && o[0] == 3.5f);
    dt_free(a);
    dt_free(b);
    dt_free(o);
}

TEST(unary_values)
{
    float x[4] = {0.25f, 1.0f, 4.0f, 9.0f}, y[4];
    ASSERT_OK(dt_k_unary(DT_K_SQRT, x, y, 4));
    ASSERT_NEAR(y[3], 3, 0, 0);
    ASSERT_OK(dt_k_unary(DT_K_RSQRT, x, y, 4));
    ASSERT_NEAR(y[0], 2, 1e-7, 0);
    ASSERT_OK(dt_k_unary(DT_K_LOG, x, y, 4));
    ASSERT_NEAR(y[1], 0, 0, 0);
    ASSERT_OK(dt_k_unary(DT_K_SIGMOID, x, y, 4));
    ASSERT_NEAR(y[1], 1.0 / (1.0 + exp(-1.0)), 1e-7, 0);
    ASSERT_OK(dt_k_unary(DT_K_NEG, x, x, 4));
    ASSERT_NEAR(x[2], -4, 0, 0);
    ASSERT_STATUS(dt_k_unary((dt_k_unop)99, x, y, 4), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_unary_bwd(DT_K_EXP, x, NULL, y, y, 4), DT_ERR_NULL);
}

TEST(reductions)
{
    /* x (2, 3, 4): x = i */
    float x[24], y[12];
    int64_t arg[12];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    ASSERT_OK(dt_k_reduce(DT_K_SUM, x, 2, 3, 4, y, NULL)); /* over axis 1 */
    ASSERT_NEAR(y[0], 0 + 4 + 8, 0, 0);
    ASSERT_NEAR(y[7], 15 + 19 + 23, 0, 0);
    ASSERT_OK(dt_k_reduce(DT_K_MEAN, x, 6, 4, 1, y, NULL)); /* last axis */
    ASSERT_NEAR(y[5], (20 + 21 + 22 + 23) / 4.0, 0, 0);
    x[9] = 100; /* (0, 2, 1) */
    ASSERT_OK(dt_k_reduce(DT_K_MAX, x, 2, 3, 4, y, arg));
    ASSERT_NEAR(y[1], 100, 0, 0);
    ASSERT_EQ_INT(arg[1], 2);
    ASSERT_EQ_INT(arg[0], 2);
    ASSERT_OK(dt_k_reduce(DT_K_MIN, x, 1, 24, 1, y, arg));
    ASSERT_NEAR(y[0], 0, 0, 0);
    ASSERT_EQ_INT(arg[0], 0);
    x[13] = NAN;
    ASSERT_OK(dt_k_reduce(DT_K_MAX, x, 1, 24, 1, y, arg));
    ASSERT(isnan(y[0]));
    ASSERT_EQ_INT(arg[0], 13);
    ASSERT_STATUS(dt_k_reduce(DT_K_MAX, x, 1, 0, 1, y, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_reduce(DT_K_SUM, x, 1, 3, 1, y, arg), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_k_reduce(DT_K_SUM, x, 2, 0, 3, y, NULL)); /* empty axis sums to 0 */
    ASSERT_NEAR(y[4], 0, 0, 0);
    /* reduce_to_shape: (2,3) -> (3) and -> (2,1) */
    float g[6] = {1, 2, 3, 4, 5, 6}, o[3];
    int64_t gs[2] = {2, 3}, os1[1] = {3}, os2[2] = {2, 1}, os3[1] = {2};
    ASSERT_OK(dt_k_reduce_to_shape(g, gs, 2, o, os1, 1));
    ASSERT_NEAR(o[2], 9, 0, 0);
    ASSERT_OK(dt_k_reduce_to_shape(g, gs, 2, o, os2, 2));
    ASSERT_NEAR(o[1], 15, 0, 0);
    ASSERT_STATUS(dt_k_reduce_to_shape(g, gs, 2, o, os3, 1), DT_ERR_SHAPE);
}

/* dt_k_sum_rows_acc: the bits of the serial loop y[j] += x[r][j] (rows in
 * order, onto a nonzero y), for 1 and 2 threads and a ragged last block. */
TEST(sum_rows_acc_bits)
{
    const int64_t R = 257, C = 3077;
    float *x = dt_alloc(R * C * 4), *y0 = dt_alloc(C * 4), *ref = dt_alloc(C * 4), *y = dt_alloc(C * 4);
    fill(x, R * C, 21, -1, 1);
    fill(y0, C, 22, -100, 100); /* large start: the order of the adds shows in the bits */
    memcpy(ref, y0, C * 4);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < C; j++)
            ref[j] += x[r * C + j];
    int saved = dt_get_num_threads();
    for (int t = 1; t <= 2; t++) {
        dt_set_num_threads(t);
        memcpy(y, y0, C * 4);
        ASSERT_OK(dt_k_sum_rows_acc(x, R, C, y));
        ASSERT(memcmp(y, ref, C * 4) == 0);
    }
    dt_set_num_threads(saved);
    float one = 5.0f;
    ASSERT_OK(dt_k_sum_rows_acc(x, 0, 1, &one)); /* no rows: y unchanged */
    ASSERT_NEAR(one, 5.0f, 0, 0);
    ASSERT_STATUS(dt_k_sum_rows_acc(x, -1, 4, y), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_sum_rows_acc(NULL, 2, 4, y), DT_ERR_NULL);
    dt_free(x);
    dt_free(y0);
    dt_free(ref);
    dt_free(y);
}

/* Thread-count independence of every reduction that feeds a gradient. */
TEST(reductions_thread_independent)
{
    const int64_t n = 1 << 18;
    float *x = dt_alloc(n * 4), *g = dt_alloc(n * 4), *y = dt_alloc(n * 4);
    fill(x, n, 3, -1, 1);
    fill(g, n, 4, -1, 1);
    float r[2][8];
    double sq[2];
    float dg[2][256], db[2][256], bng[2][64], bnb[2][64], emb[2][4 * 256], rts[2][1024];
    int64_t gsh[2] = {256, 1024}, osh[1] = {1024};
    int64_t idx[1024];
    for (int i = 0; i < 1024; i++)
        idx[i] = (i * 7) % 4;
    int saved = dt_get_num_threads();
    for (int t = 0; t < 2; t++) {
        dt_set_num_threads(t ? 2 : 1);
        ASSERT_OK(dt_k_sum_all(x, n, &r[t][0]));
        ASSERT_OK(dt_k_sumsq(x, n, &sq[t]));
        ASSERT_OK(dt_k_reduce(DT_K_SUM, x, 1, 1024, 256, y, NULL));
        r[t][1] = y[17];
        float m[1024], rs[1024];
        ASSERT_OK(dt_k_layernorm_fwd(x, 1024, 256, NULL, NULL, 1e-5f, y, m, rs));
        ASSERT_OK(dt_k_layernorm_bwd(x, g, 1024, 256, NULL, m, rs, NULL, dg[t], db[t]));
        float sm[64], si[64];
        ASSERT_OK(dt_k_batchnorm_train_fwd(x, 16, 64, 256, NULL, NULL, 1e-5f, 0.1f, NULL, NULL, y, sm, si));
        ASSERT_OK(dt_k_batchnorm_bwd(x, g, 16, 64, 256, NULL, sm, si, y, bng[t], bnb[t]));
        ASSERT_OK(dt_k_embedding_bwd(g, idx, DT_I64, 1024, 4, 256, emb[t]));
        ASSERT_OK(dt_k_reduce_to_shape(g, gsh, 2, rts[t], osh, 1));
    }
    ASSERT(!memcmp(rts[0], rts[1], sizeof rts[0]));
    for (int j = 0; j < 1024; j += 101) {
        double acc = 0;
        for (int rr = 0; rr < 256; rr++)
            acc += g[rr * 1024 + j];
        ASSERT_NEAR(rts[0][j], acc, 1e-4, 1e-4);
    }
    dt_set_num_threads(saved);
    ASSERT(!memcmp(r[0], r[1], 2 * sizeof(float)));
    ASSERT(sq[0] == sq[1]);
    ASSERT(!memcmp(dg[0], dg[1], sizeof dg[0]));
    ASSERT(!memcmp(db[0], db[1], sizeof db[0]));
    ASSERT(!memcmp(bng[0], bng[1], sizeof bng[0]));
    ASSERT(!memcmp(bnb[0], bnb[1], sizeof bnb[0]));
    ASSERT(!memcmp(emb[0], emb[1], sizeof emb[0]));
    double want = 0;
    for (int64_t i = 0; i < n; i++)
        want += x[i];
    ASSERT_NEAR(r[0][0], want, 1e-3, 1e-6);
    dt_free(x);
    dt_free(g);
    dt_free(y);
}

TEST(copy_strided_transpose)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, t[6];
    int64_t shape[2] = {3, 2}, st[2] = {1, 3}; /* transpose of (2,3) */
    ASSERT_OK(dt_k_copy_strided(a, 4, 2, shape, st, t));
    const float want[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(t[i], want[i], 0, 0);
    int64_t rs[1] = {-1}, sh1[1] = {6};
    ASSERT_OK(dt_k_copy_strided(a + 5, 4, 1, sh1, rs, t)); /* reversed */
    ASSERT_NEAR(t[0], 6, 0, 0);
    ASSERT_NEAR(t[5], 1, 0, 0);
    uint16_t h[4] = {1, 2, 3, 4}, ho[2];
    int64_t s2[1] = {2}, st2[1] = {2};
    ASSERT_OK(dt_k_copy_strided(h, 2, 1, s2, st2, ho));
    ASSERT_EQ_INT(ho[1], 3);
    ASSERT_STATUS(dt_k_copy_strided(a, 3, 1, s2, st2, t), DT_ERR_INVALID_ARG);
}

TEST(softmax_values)
{
    float x[6] = {1, 2, 3, 1000, 1000, 1000}, y[6];
    ASSERT_OK(dt_k_softmax_fwd(x, y, 2, 3, false));
    double e = exp(1) + exp(2) + exp(3);
    ASSERT_NEAR(y[2], exp(3) / e, 1e-7, 1e-6);
    ASSERT_NEAR(y[4], 1.0 / 3, 1e-7, 0); /* stable for large inputs */
    ASSERT_OK(dt_k_softmax_fwd(x, y, 2, 3, true));
    ASSERT_NEAR(y[0], 1 - log(e), 1e-6, 1e-6);
    ASSERT_STATUS(dt_k_softmax_fwd(x, y, 2, 0, false), DT_ERR_INVALID_ARG);
}

TEST(dropout_properties)
{
    const int64_t n = 100000;
    float *x = dt_alloc(n * 4), *y = dt_alloc(n * 4), *z = dt_alloc(n * 4);
    dt_k_fill(x, 1.0f, n);
    dt_rng_key k = dt_rng_key_make(7, DT_RNG_DROPOUT, 0, 3);
    ASSERT_OK(dt_k_dropout_fwd(x, y, n, 0.25f, k, 1000));
    int64_t kept = 0;
    for (int64_t i = 0; i < n; i++) {
        ASSERT(y[i] == 0.0f || y[i] == 1.0f / 0.75f);
        kept += y[i] != 0.0f;
        /* the mask is dt_rng_uniform(key, offset + i) >= p */
        if (i < 100)
            ASSERT_EQ_INT(y[i] != 0.0f, dt_rng_uniform(k, 1000 + (uint64_t)i) >= 0.25f);
    }
    ASSERT(kept > 74000 && kept < 76000);
    /* two halves with offsets equal the whole (mask depends on index only) */
    ASSERT_OK(dt_k_dropout_fwd(x, z, 333, 0.25f, k, 1000));
    ASSERT_OK(dt_k_dropout_fwd(x + 333, z + 333, n - 333, 0.25f, k, 1333));
    ASSERT(!memcmp(y, z, n * 4));
    int saved = dt_get_num_threads();
    dt_set_num_threads(1);
    ASSERT_OK(dt_k_dropout_fwd(x, z, n, 0.25f, k, 1000));
    dt_set_num_threads(saved);
    ASSERT(!memcmp(y, z, n * 4));
    ASSERT_OK(dt_k_dropout_fwd(x, z, n, 0.0f, k, 0));
    ASSERT(z[5] == 1.0f);
    ASSERT_STATUS(dt_k_dropout_fwd(x, z, n, 1.0f, k, 0), DT_ERR_INVALID_ARG);
    dt_free(x);
    dt_free(y);
    dt_free(z);
}

TEST(embedding_values_and_errors)
{
    float table[12] = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32}, out[9];
    int64_t idx[3] = {3, 0, 3};
    ASSERT_OK(dt_k_embedding_fwd(table, 4, 3, idx, DT_I64, 3, out));
    ASSERT_NEAR(out[0], 30, 0, 0);
    ASSERT_NEAR(out[4], 1, 0, 0);
    idx[1] = 4;
    ASSERT_STATUS(dt_k_embedding_fwd(table, 4, 3, idx, DT_I64, 3, out), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "position 1");
    ASSERT_STATUS(dt_k_embedding_fwd(table, 4, 3, idx, DT_F32, 3, out), DT_ERR_DTYPE);
}

TEST(norm_and_pool_errors)
{
    float x[8] = {0}, y[8], s[2], t[2];
    ASSERT_STATUS(dt_k_batchnorm_train_fwd(x, 1, 2, 1, NULL, NULL, 1e-5f, 0.1f, NULL, NULL, y, s, t),
                  DT_ERR_INVALID_ARG); /* one value per channel */
    ASSERT_STATUS(dt_k_batchnorm_train_fwd(x, -1, 2, 1, NULL, NULL, 1e-5f, 0.1f, NULL, NULL, y, s, t),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_layernorm_fwd(NULL, 2, 4, NULL, NULL, 1e-5f, y, NULL, NULL), DT_ERR_NULL);
    dt_k_pool2d_shape p = {1, 1, 2, 2, 3, 3, 1, 1, 0, 0};
    ASSERT_STATUS(dt_k_maxpool2d_fwd(&p, x, y, NULL), DT_ERR_SHAPE);
    p.kh = p.kw = 2, p.ph = 2;
    ASSERT_STATUS(dt_k_maxpool2d_fwd(&p, x, y, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_mse_fwd(x, y, 0, s), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_gelu_fwd(x, y, 4, (dt_k_gelu_approx)5), DT_ERR_INVALID_ARG);
}

/* Max pooling against a naive loop on data with ties and NaNs, for the
 * vectorised 2x2/2 path (widths with full 4-wide blocks and a tail) and the
 * general path: value and argmax (first maximum in window order; NaN wins). */
static void ref_maxpool(const dt_k_pool2d_shape *s, const float *x, float *y, int32_t *am)
{
    int64_t P, Q;
    dt_k_pool2d_out_size(s, &P, &Q);
    for (int64_t pl = 0; pl < s->N * s->C; pl++)
        for (int64_t p = 0; p < P; p++)
            for (int64_t q = 0; q < Q; q++) {
                float m = 0;
                int64_t best = -1;
                for (int64_t r = 0; r < s->kh; r++)
                    for (int64_t t = 0; t < s->kw; t++) {
                        int64_t h = p * s->sh - s->ph + r, w = q * s->sw - s->pw + t;
                        if (h < 0 || h >= s->H || w < 0 || w >= s->W)
                            continue;
                        float v = x[pl * s->H * s->W + h * s->W + w];
                        if (best < 0 || (isnan(v) && !isnan(m)) || v > m) {
                            m = v;
                            best = h * s->W + w;
                        }
                    }
                y[(pl * P + p) * Q + q] = m;
                am[(pl * P + p) * Q + q] = (int32_t)best;
            }
}

TEST(maxpool_paths_vs_naive)
{
    dt_k_pool2d_shape shapes[3] = {{2, 3, 10, 22, 2, 2, 2, 2, 0, 0}, {1, 2, 9, 17, 2, 2, 2, 2, 0, 0},
                                   {1, 2, 9, 17, 3, 2, 2, 1, 1, 1}};
    for (int k = 0; k < 3; k++) {
        const dt_k_pool2d_shape *s = &shapes[k];
        int64_t n = s->N * s->C * s->H * s->W, P, Q;
        ASSERT_OK(dt_k_pool2d_out_size(s, &P, &Q));
        int64_t no = s->N * s->C * P * Q;
        float *x = dt_alloc(n * 4), *y = dt_alloc(no * 4), *r = dt_alloc(no * 4);
        int32_t *a = dt_alloc(no * 4), *ra = dt_alloc(no * 4);
        fill(x, n, 30 + (uint64_t)k, -2, 2);
        for (int64_t i = 0; i < n; i++) {
            x[i] = roundf(x[i] * 2.0f); /* few distinct values: many ties */
            if (i % 13 == 5)
                x[i] = NAN;
        }
        ASSERT_OK(dt_k_maxpool2d_fwd(s, x, y, a));
        ref_maxpool(s, x, r, ra);
        for (int64_t i = 0; i < no; i++) {
            if (!(y[i] == r[i] || (isnan(y[i]) && isnan(r[i]))) || a[i] != ra[i])
                TEST_FAIL_("shape %d out %lld: %g@%d, want %g@%d", k, (long long)i, (double)y[i], a[i], (double)r[i],
                           ra[i]);
        }
        ASSERT_OK(dt_k_maxpool2d_fwd(s, x, r, NULL)); /* without argmax: same values */
        ASSERT(!memcmp(r, y, no * 4));
        dt_free(x);
        dt_free(y);
        dt_free(r);
        dt_free(a);
        dt_free(ra);
    }
}

/* The blocked max pool's gradient against a scatter in the test (dx zeroed,
 * dy added at each argmax), bit for bit, in nChw16c and nChw8c: 2x2
 * windows on 7 x 9 planes (an odd row and column past the last window), dy
 * with -0 and NaN; then with one argmax moved outside its window (still in
 * the plane). */
TEST(maxpool_bwd_blocked_vs_scatter)
{
    enum { N = 2, C = 16, H = 7, W = 9, P = 3, Q = 4 };
    const dt_k_pool2d_shape s = {N, C, H, W, 2, 2, 2, 2, 0, 0};
    static float x[N * C * H * W], xb[N * C * H * W], y[N * C * P * Q], dy[N * C * P * Q], dx[N * C * H * W],
        want[N * C * H * W];
    static int32_t am[N * C * P * Q];
    fill(x, N * C * H * W, 40, -2, 2);
    fill(dy, N * C * P * Q, 41, -1, 1);
    dy[3] = -0.0f;
    dy[20] = NAN;
    for (int B = 8; B <= 16; B += 8)
        for (int moved = 0; moved < 2; moved++) {
            ASSERT_OK(dt_k_to_blocked(x, N, C, H * W, B, xb));
            ASSERT_OK(dt_k_maxpool2d_fwd_blocked(&s, B, xb, y, am));
            if (moved)
                am[5 * B + 3] = (int32_t)(H * W - 1); /* output 5 of block 0, lane 3: to the last position */
            memset(want, 0, sizeof want);
            for (int64_t bl = 0; bl < N * C / B; bl++)
                for (int64_t i = 0; i < P * Q; i++)
                    for (int j = 0; j < B; j++)
                        want[(bl * H * W + am[(bl * P * Q + i) * B + j]) * B + j] += dy[(bl * P * Q + i) * B + j];
            memset(dx, 0x7f, sizeof dx); /* every value must be written */
            ASSERT_OK(dt_k_maxpool2d_bwd_blocked(&s, B, dy, am, dx));
            if (memcmp(dx, want, sizeof dx))
                TEST_FAIL_("nChw%dc%s: dx differs from the scatter's bits", B, moved ? ", an argmax moved" : "");
        }
}

/* Batch norm statistics stay accurate when the mean dwarfs the spread
 * (one-pass moments are shifted; the output is centred before scaling). */
TEST(batchnorm_large_offset)
{
    enum { N = 8, C = 3, HW = 50 };
    static float x[N * C * HW], y[N * C * HW];
    fill(x, N * C * HW, 40, -1, 1);
    for (int i = 0; i < N * C * HW; i++)
        x[i] += 1000.0f * (float)(1 + (i / HW) % C);
    float sm[C], si[C], rm[C] = {0}, rv[C] = {1, 1, 1};
    ASSERT_OK(dt_k_batchnorm_train_fwd(x, N, C, HW, NULL, NULL, 1e-5f, 1.0f, rm, rv, y, sm, si));
    for (int c = 0; c < C; c++) {
        double s = 0, s2 = 0;
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++)
                s += x[(n * C + c) * HW + i];
        double mean = s / (N * HW);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i++) {
                double d = x[(n * C + c) * HW + i] - mean;
                s2 += d * d;
            }
        double var = s2 / (N * HW);
        ASSERT_NEAR(sm[c], mean, 1e-3, 1e-7);
        ASSERT_NEAR(si[c], 1 / sqrt(var + 1e-5), 0, 1e-4);
        ASSERT_NEAR(rv[c], var * (N * HW) / (N * HW - 1), 0, 1e-4);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < HW; i += 7) {
                int j = (n * C + c) * HW + i;
                ASSERT_NEAR(y[j], (x[j] - mean) / sqrt(var + 1e-5), 2e-3, 0);
            }
    }
}

/* Random shapes (0-4 dims, many 1s) against a naive broadcast by index. */
TEST(binary_broadcast_random)
{
    uint32_t seed[4];
    float a[256], b[256], o[1024], ref[1024];
    for (int trial = 0; trial < 300; trial++) {
        dt_rng_block(dt_rng_key_make(99, DT_RNG_USER, 0, 0), (uint64_t)trial, seed);
        int na = (int)(seed[0] % 5), nb = (int)(seed[1] % 5), n = na > nb ? na : nb;
        int64_t os[4], sa[4], sb[4];
        uint32_t bits = seed[2];
        for (int d = 0; d < n; d++) {
            os[d] = 1 + (int64_t)((seed[3] >> (3 * d)) % 4);
        }
        for (int d = 0; d < na; d++) { /* align right */
            int od = d + n - na;
            sa[d] = (bits >> d) & 1 ? 1 : os[od];
        }
        for (int d = 0; d < nb; d++) {
            int od = d + n - nb;
            sb[d] = (bits >> (8 + d)) & 1 ? 1 : os[od];
        }
        int64_t ta = 1, tb = 1, to = 1;
        for (int d = 0; d < na; d++)
            ta *= sa[d];
        for (int d = 0; d < nb; d++)
            tb *= sb[d];
        for (int d = 0; d < n; d++)
            to *= os[d];
        for (int64_t i = 0; i < ta; i++)
            a[i] = (float)i + 0.5f;
        for (int64_t i = 0; i < tb; i++)
            b[i] = 1000.0f * (float)(i + 1);
        /* the broadcast shape: max per dim (a dim of 1 where both are 1) */
        int64_t bs[4];
        int nbs;
        ASSERT_OK(dt_k_broadcast_shape(sa, na, sb, nb, bs, &nbs));
        ASSERT_EQ_INT(nbs, n);
        to = 1;
        for (int d = 0; d < n; d++)
            to *= bs[d];
        for (int64_t i = 0; i < to; i++) {
            int64_t rem = i, ia = 0, ib = 0, ma = 1, mb = 1;
            for (int d = n - 1; d >= 0; d--) {
                int64_t idx = rem % bs[d];
                rem /= bs[d];
                int dA = d - (n - na), dB = d - (n - nb);
                if (dA >= 0) {
                    ia += (sa[dA] == 1 ? 0 : idx) * ma;
                    ma *= sa[dA];
                }
                if (dB >= 0) {
                    ib += (sb[dB] == 1 ? 0 : idx) * mb;
                    mb *= sb[dB];
                }
            }
            ref[i] = a[ia] - b[ib];
        }
        ASSERT_OK(dt_k_binary(DT_K_SUB, a, sa, na, b, sb, nb, o));
        for (int64_t i = 0; i < to; i++)
            if (o[i] != ref[i])
                TEST_FAIL_("trial %d: out[%lld] = %g, want %g", trial, (long long)i, (double)o[i], (double)ref[i]);
        /* and back: summing the broadcast gradient to a's shape */
        float ga[256];
        ASSERT_OK(dt_k_reduce_to_shape(o, bs, n, ga, sa, na));
        for (int64_t i = 0; i < ta; i++) {
            double want = 0;
            for (int64_t j = 0; j < to; j++) {
                int64_t rem = j, ia = 0, ma = 1;
                for (int d = n - 1; d >= 0; d--) {
                    int64_t idx = rem % bs[d];
                    rem /= bs[d];
                    int dA = d - (n - na);
                    if (dA >= 0) {
                        ia += (sa[dA] == 1 ? 0 : idx) * ma;
                        ma *= sa[dA];
                    }
                }
                if (ia == i)
                    want += ref[j];
            }
            ASSERT_NEAR(ga[i], want, 1e-2, 1e-6);
        }
    }
}

int main(void)
{
    RUN(binary_broadcast_random);
    RUN(batchnorm_large_offset);
    RUN(maxpool_paths_vs_naive);
    RUN(maxpool_bwd_blocked_vs_scatter);
    RUN(binary_broadcast_values);
    RUN(large_elementwise_threads);
    RUN(unary_values);
    RUN(reductions);
    RUN(reductions_thread_independent);
    RUN(sum_rows_acc_bits);
    RUN(copy_strided_transpose);
    RUN(softmax_values);
    RUN(dropout_properties);
    RUN(embedding_values_and_errors);
    RUN(norm_and_pool_errors);
    return TEST_REPORT();
}
