/* GEMM recording and timing (dt_k_gemm_record_start/stop, dt_k_gemm_bench):
 * every dt_k_matmul* entry is seen once per call with its arguments, the
 * low-precision entry as itself (not as the f32 product it may run on),
 * repeats are counted and timed, nothing is seen outside a recording; the
 * bench's work and weighting, the recorded times summed; misuse is an
 * error. Speeds are not checked. */
// dt-test-labels: threads
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>
#include <string.h>

TEST(record_counts_each_entry)
{
    enum { M = 16, N = 24, K = 8 };
    static float a[4 * M * K], b[4 * K * N], c[4 * M * N], bias[N];
    static uint16_t ah[4 * M * K], bh[4 * K * N], ch[4 * M * N];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    memset(bias, 0, sizeof bias);
    memset(ah, 0, sizeof ah);
    memset(bh, 0, sizeof bh);
    ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, a, b, DT_F32, 0.0f, c, NULL)); /* not recorded */
    ASSERT_OK(dt_k_gemm_record_start());
    ASSERT_STATUS(dt_k_gemm_record_start(), DT_ERR_INVALID_ARG); /* one at a time */
    for (int i = 0; i < 3; i++)
        ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, a, b, DT_F32, 0.0f, c, NULL));
    ASSERT_OK(dt_k_matmul(true, false, M, N, K, 1.0f, a, b, DT_F32, 1.0f, c, bias)); /* beta and bias differ */
    ASSERT_OK(dt_k_matmul_batched_lp(false, false, 1, M, N, K, 1.0f, ah, 0, bh, 0, DT_BF16, ch, 0, NULL));
    ASSERT_OK(dt_k_matmul_batched(false, false, 4, M, N, K, 0.5f, ah, M * K, bh, 0, DT_BF16, 0.0f, c, M * N, NULL));
    dt_k_gemm_shape g[8];
    int n = -1;
    ASSERT_OK(dt_k_gemm_record_stop(g, 8, &n));
    ASSERT_EQ_INT(n, 4);
    ASSERT(!g[0].trans_a && g[0].trans_b && g[0].M == M && g[0].N == N && g[0].K == K && g[0].batch == 1);
    ASSERT(g[0].ab_type == DT_F32 && g[0].c_type == DT_F32 && !g[0].bias && g[0].beta == 0.0f);
    ASSERT_EQ_INT((int)g[0].count, 3);
    ASSERT(g[1].trans_a && !g[1].trans_b && g[1].beta == 1.0f && g[1].bias && g[1].count == 1);
    /* the low-precision entry: once, with its own result dtype, whichever way it runs here */
    ASSERT(g[2].ab_type == DT_BF16 && g[2].c_type == DT_BF16 && g[2].count == 1);
    ASSERT(g[3].batch == 4 && g[3].stride_a == M * K && g[3].stride_b == 0 && g[3].stride_c == M * N);
    ASSERT(g[3].alpha == 0.5f && g[3].ab_type == DT_BF16 && g[3].c_type == DT_F32);
    for (int i = 0; i < 4; i++) /* each entry's calls timed where they ran */
        ASSERT(g[i].seconds > 0 && g[i].seconds < 10);
    /* after the stop nothing is recorded; a second stop is an error */
    ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, a, b, DT_F32, 0.0f, c, NULL));
    ASSERT_STATUS(dt_k_gemm_record_stop(g, 8, &n), DT_ERR_INVALID_ARG);
    /* a fresh recording starts empty; cap smaller than the distinct calls */
    ASSERT_OK(dt_k_gemm_record_start());
    ASSERT_OK(dt_k_matmul(false, false, M, N, K, 1.0f, a, b, DT_F32, 0.0f, c, NULL));
    ASSERT_OK(dt_k_matmul(false, false, M, N, K + 1, 1.0f, a, b, DT_F32, 0.0f, c, NULL));
    ASSERT_OK(dt_k_gemm_record_stop(g, 1, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT(g[0].K == K && g[0].count == 1);
    ASSERT_OK(dt_k_gemm_record_start());
    ASSERT_OK(dt_k_gemm_record_stop(NULL, 0, &n));
    ASSERT_EQ_INT(n, 0);
    ASSERT_STATUS(dt_k_gemm_record_stop(NULL, 0, NULL), DT_ERR_NULL);
}

TEST(bench_weights_by_count)
{
    dt_k_gemm_shape g[3] = {
        {.batch = 1, .M = 64, .N = 32, .K = 48, .alpha = 1.0f, .ab_type = DT_F32, .c_type = DT_F32, .count = 12},
        {.trans_b = true, .batch = 1, .M = 40, .N = 72, .K = 16, .alpha = 1.0f, .ab_type = DT_BF16,
         .c_type = DT_BF16, .bias = true, .count = 1},
        {.trans_a = true, .batch = 3, .M = 8, .N = 8, .K = 8, .stride_a = 64, .stride_c = 64, .alpha = 1.0f,
         .beta = 1.0f, .ab_type = DT_BF16, .c_type = DT_F32, .count = 0}, /* timed, weighs nothing */
    };
    double best[3] = {-1, -1, -1};
    dt_k_gemm_rate r;
    ASSERT_OK(dt_k_gemm_bench(g, 3, 2, best, &r));
    for (int i = 0; i < 3; i++)
        ASSERT(best[i] > 0 && isfinite(best[i]));
    double flop = 12.0 * 2 * 64 * 32 * 48 + 2.0 * 40 * 72 * 16;
    ASSERT_NEAR(r.gflop, flop * 1e-9, 1e-15, 1e-12);
    ASSERT_NEAR(r.seconds, 12 * best[0] + best[1], 1e-15, 1e-9);
    ASSERT_NEAR(r.gflops, flop / r.seconds * 1e-9, 0, 1e-9);
    ASSERT(r.cpu_gflops >= 0 && isfinite(r.cpu_gflops));
    ASSERT(r.recorded_seconds == 0); /* a list written by hand: no time where it ran */
    g[0].seconds = 0.25, g[1].seconds = 0.5; /* recorded times are summed, not weighed */
    ASSERT_OK(dt_k_gemm_bench(g, 3, 1, NULL, &r));
    ASSERT_NEAR(r.recorded_seconds, 0.75, 0, 1e-12);
    /* the recording and the bench agree: a recorded call replays */
    ASSERT_OK(dt_k_gemm_record_start());
    ASSERT_OK(dt_k_gemm_bench(g, 1, 1, NULL, &r));
    dt_k_gemm_shape again[2];
    int n = 0;
    ASSERT_OK(dt_k_gemm_record_stop(again, 2, &n));
    ASSERT_EQ_INT(n, 1);
    ASSERT(again[0].M == 64 && again[0].N == 32 && again[0].K == 48 && again[0].count == 1);
    ASSERT(again[0].seconds > 0);
}

TEST(bench_bad_args)
{
    dt_k_gemm_shape g = {.batch = 1, .M = 8, .N = 8, .K = 8, .alpha = 1.0f, .ab_type = DT_F32, .c_type = DT_F32,
                         .count = 1};
    dt_k_gemm_rate r;
    ASSERT_STATUS(dt_k_gemm_bench(NULL, 1, 1, NULL, &r), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_gemm_bench(&g, 1, 1, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_gemm_bench(&g, 0, 1, NULL, &r), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_gemm_bench(&g, 1, 0, NULL, &r), DT_ERR_INVALID_ARG);
    dt_k_gemm_shape bad = g;
    bad.M = -1;
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_INVALID_ARG);
    bad = g;
    bad.count = -3;
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_INVALID_ARG);
    bad = g;
    bad.seconds = -1e-3;
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_INVALID_ARG);
    bad.seconds = NAN;
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_INVALID_ARG);
    bad = g;
    bad.M = bad.N = bad.K = (int64_t)1 << 40; /* no allocation is tried */
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_INVALID_ARG);
    bad = g;
    bad.ab_type = DT_I32;
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_UNSUPPORTED);
    bad = g;
    bad.c_type = DT_BF16; /* an f32 product has an f32 result */
    ASSERT_STATUS(dt_k_gemm_bench(&bad, 1, 1, NULL, &r), DT_ERR_UNSUPPORTED);
}

int main(void)
{
    RUN(record_counts_each_entry);
    RUN(bench_weights_by_count);
    RUN(bench_bad_args);
    return TEST_REPORT();
}
