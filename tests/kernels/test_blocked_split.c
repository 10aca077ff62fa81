/* The per-channel kernels on channel-blocked activations (batch norm
 * forward and backward, the C = 1 convolution backward weights) with fewer
 * channel blocks than threads: a 16-channel layer in nChw16c is one block,
 * and splitting the work over blocks alone ran it on one thread (the
 * ConvNet's first layer: its 2-thread step was ~15% slower than in
 * nChw8c). The work is split there: batch norm over whole (n, block) rows,
 * each row's channel sums kept and summed in n order afterwards; the C = 1
 * convolution over half blocks, or over the kernel's rows with AVX-512.
 * These tests check the split is taken and that it changes no bit: every
 * thread count and both block sizes give the same outputs. */
#include "dtrain/kernels.h"
#include "test.h"

#include <string.h>

/* blocked.c (kernels_impl.h): the work units of those kernels */
int64_t dt__blk_units(int64_t CB, int B, int nt, int *L);

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 5, 6), 0, x, (size_t)n, lo, hi);
}

/* A 16-channel layer in nChw16c has two units of work for two threads (the
 * old split over whole blocks had one), as many as in nChw8c; more blocks
 * than threads keep whole blocks, and so do many channels. */
TEST(split_units)
{
    int L;
    ASSERT_EQ_INT((long long)dt__blk_units(1, 16, 2, &L), 2);
    ASSERT_EQ_INT(L, 8);
    ASSERT_EQ_INT((long long)dt__blk_units(2, 8, 2, &L), 2); /* the same layer in nChw8c */
    ASSERT_EQ_INT(L, 8);
    ASSERT_EQ_INT((long long)dt__blk_units(3, 16, 4, &L), 6);
    ASSERT_EQ_INT(L, 8);
    ASSERT_EQ_INT((long long)dt__blk_units(2, 16, 2, &L), 2); /* enough blocks: whole ones */
    ASSERT_EQ_INT(L, 16);
    ASSERT_EQ_INT((long long)dt__blk_units(1, 16, 1, &L), 1); /* one thread: whole blocks */
    ASSERT_EQ_INT(L, 16);
    ASSERT_EQ_INT((long long)dt__blk_units(8, 16, 64, &L), 8); /* 128 channels: whole blocks */
    ASSERT_EQ_INT(L, 16);
}

enum { NOUT = 7 }; /* y, mean, invstd, running mean, running var, then dgamma, dbeta (C each) and dx */

/* Batch norm forward and backward on nChw<B>c with nt threads; the outputs
 * in plain layout: o[0] = y (N*C*HW), o[1..4] (C each), o[5] = dgamma,
 * o[6] = dbeta, dxo = dx (N*C*HW). */
static void bn_run(int64_t N, int64_t C, int64_t HW, int B, int nt, const float *x, const float *dy,
                   const float *gamma, const float *beta, float **o, float *dxo)
{
    size_t n = (size_t)(N * C * HW);
    float *xb = dt_alloc(n * 4), *dyb = dt_alloc(n * 4), *yb = dt_alloc(n * 4), *dxb = dt_alloc(n * 4);
    ASSERT(xb && dyb && yb && dxb);
    ASSERT_OK(dt_k_to_blocked(x, N, C, HW, B, xb));
    ASSERT_OK(dt_k_to_blocked(dy, N, C, HW, B, dyb));
    for (int64_t c = 0; c < C; c++)
        o[3][c] = 0.1f * (float)c, o[4][c] = 1.0f + 0.01f * (float)c;
    const int saved = dt_get_num_threads();
    dt_set_num_threads(nt);
    ASSERT_OK(dt_k_batchnorm_train_fwd_blocked(xb, N, C, HW, B, gamma, beta, 1e-5f, 0.1f, o[3], o[4], yb, o[1],
                                               o[2]));
    ASSERT_OK(dt_k_batchnorm_bwd_blocked(xb, dyb, N, C, HW, B, gamma, o[1], o[2], dxb, o[5], o[6]));
    dt_set_num_threads(saved);
    ASSERT_OK(dt_k_from_blocked(yb, N, C, HW, B, o[0]));
    ASSERT_OK(dt_k_from_blocked(dxb, N, C, HW, B, dxo));
    dt_free(xb), dt_free(dyb), dt_free(yb), dt_free(dxb);
}

/* Every thread count (1-4) and both blocks give batch norm's outputs bit for
 * bit, 16 channels (one nChw16c block: the half-block split) and 48 (three),
 * and they are batch norm's (a float64 reference, loosely). */
TEST(batchnorm_threads_and_blocks_agree)
{
    static const int64_t Cs[2] = {16, 48};
    for (int ci = 0; ci < 2; ci++) {
        const int64_t N = 4, C = Cs[ci], HW = 28 * 28; /* N*C*HW >= the kernels' threshold for threads */
        const size_t n = (size_t)(N * C * HW);
        float *x = dt_alloc(n * 4), *dy = dt_alloc(n * 4), *gamma = dt_alloc((size_t)C * 4),
              *beta = dt_alloc((size_t)C * 4);
        ASSERT(x && dy && gamma && beta);
        fill(x, (int64_t)n, 1 + (uint64_t)ci, -2.0f, 3.0f);
        fill(dy, (int64_t)n, 2 + (uint64_t)ci, -1.0f, 1.0f);
        fill(gamma, C, 3, 0.5f, 1.5f);
        fill(beta, C, 4, -0.5f, 0.5f);
        float *ref[NOUT], *got[NOUT], *dxr = dt_alloc(n * 4), *dxg = dt_alloc(n * 4);
        ASSERT(dxr && dxg);
        for (int k = 0; k < NOUT; k++) {
            size_t m = k == 0 ? n : (size_t)C;
            ref[k] = dt_alloc(m * 4), got[k] = dt_alloc(m * 4);
            ASSERT(ref[k] && got[k]);
        }
        bn_run(N, C, HW, 8, 1, x, dy, gamma, beta, ref, dxr);
        for (int B = 8; B <= 16; B += 8)
            for (int nt = 1; nt <= 4; nt++) {
                bn_run(N, C, HW, B, nt, x, dy, gamma, beta, got, dxg);
                for (int k = 0; k < NOUT; k++)
                    if (memcmp(got[k], ref[k], (k == 0 ? n : (size_t)C) * 4))
                        TEST_FAIL_("C=%lld B=%d threads=%d: output %d differs from 1 thread's nChw8c",
                                   (long long)C, B, nt, k);
                if (memcmp(dxg, dxr, n * 4))
                    TEST_FAIL_("C=%lld B=%d threads=%d: dx differs from 1 thread's nChw8c", (long long)C, B, nt);
            }
        /* the values themselves: channel 0 and the last against float64 */
        for (int64_t c = 0; c < C; c += C - 1) {
            double s = 0, s2 = 0;
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < HW; j++) {
                    double v = x[(i * C + c) * HW + j];
                    s += v, s2 += v * v;
                }
            double mean = s / (double)(N * HW), var = s2 / (double)(N * HW) - mean * mean;
            ASSERT_NEAR(ref[1][c], mean, 1e-5, 1e-5);
            ASSERT_NEAR(ref[2][c], 1.0 / sqrt(var + 1e-5), 1e-4, 1e-4);
            double xh = (x[c * HW + 5] - mean) / sqrt(var + 1e-5);
            ASSERT_NEAR(ref[0][c * HW + 5], xh * gamma[c] + beta[c], 1e-4, 1e-4);
        }
        for (int k = 0; k < NOUT; k++)
            dt_free(ref[k]), dt_free(got[k]);
        dt_free(x), dt_free(dy), dt_free(gamma), dt_free(beta), dt_free(dxr), dt_free(dxg);
    }
}

/* The C = 1 backward weights with dy in nChw16c, 16 output channels (one
 * block), on 1-4 threads: the same bits as nChw8c on one thread. */
TEST(c1_bwd_weights_threads_agree)
{
    dt_k_conv2d_shape s = dt_k_conv2d_shape_make(3, 1, 28, 28, 16, 5, 5);
    s.pad_h = s.pad_w = 2;
    int64_t P, Q;
    ASSERT_OK(dt_k_conv2d_out_size(&s, &P, &Q));
    const size_t nx = (size_t)(s.N * s.H * s.W), ny = (size_t)(s.N * s.K * P * Q), nw = (size_t)(s.K * s.R * s.S);
    float *x = dt_alloc(nx * 4), *dy = dt_alloc(ny * 4), *dyb = dt_alloc(ny * 4);
    float *dw0 = dt_alloc(nw * 4), *db0 = dt_alloc((size_t)s.K * 4), *dw = dt_alloc(nw * 4),
          *db = dt_alloc((size_t)s.K * 4);
    ASSERT(x && dy && dyb && dw0 && db0 && dw && db);
    fill(x, (int64_t)nx, 7, -1.0f, 1.0f);
    fill(dy, (int64_t)ny, 8, -1.0f, 1.0f);
    const int saved = dt_get_num_threads();
    for (int B = 8; B <= 16; B += 8) {
        ASSERT_OK(dt_k_to_blocked(dy, s.N, s.K, P * Q, B, dyb));
        for (int nt = 1; nt <= 4; nt++) {
            dt_set_num_threads(nt);
            dt_status st =
                dt_k_conv2d_bwd_weights_l(&s, x, dyb, dw, db, B == 8 ? DT_K_DST_BLOCKED8 : DT_K_DST_BLOCKED16);
            dt_set_num_threads(saved);
            ASSERT_OK(st);
            if (B == 8 && nt == 1) {
                memcpy(dw0, dw, nw * 4);
                memcpy(db0, db, (size_t)s.K * 4);
                continue;
            }
            if (memcmp(dw, dw0, nw * 4) || memcmp(db, db0, (size_t)s.K * 4))
                TEST_FAIL_("B=%d threads=%d: dW or dbias differs from 1 thread's nChw8c", B, nt);
        }
    }
    dt_free(x), dt_free(dy), dt_free(dyb), dt_free(dw0), dt_free(db0), dt_free(dw), dt_free(db);
}

int main(void)
{
    RUN(split_units);
    RUN(batchnorm_threads_and_blocks_agree);
    RUN(c1_bwd_weights_threads_agree);
    return TEST_REPORT();
}
