/* Matmul through oneDNN against a naive double-precision reference: every
 * transpose combination, alpha/beta/bias, batched with broadcast, bf16
 * inputs; the primitive cache counter; bad arguments. */
// dt-test-labels: threads
#include "dtrain/kernels.h"
#include "test.h"

static void fill(float *x, int64_t n, uint64_t seed)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 1, 2), 0, x, (size_t)n, -1.0f, 1.0f);
}

/* C = alpha op(A) op(B) + beta C + bias, in double. */
static void ref_mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, const float *B,
                   float beta, float *C, const float *bias)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * M + i] : A[i * K + k];
                double b = tb ? B[j * K + k] : B[k * N + j];
                acc += a * b;
            }
            double c = alpha * acc + (beta != 0.0f ? beta * C[i * N + j] : 0.0) + (bias ? bias[j] : 0.0);
            C[i * N + j] = (float)c;
        }
}

TEST(matmul_f32_all_flags)
{
    const int64_t M = 37, N = 29, K = 53;
    float *A = dt_alloc(M * K * 4), *B = dt_alloc(K * N * 4), *C = dt_alloc(M * N * 4), *R = dt_alloc(M * N * 4),
          *bias = dt_alloc(N * 4);
    fill(A, M * K, 1);
    fill(B, K * N, 2);
    fill(bias, N, 3);
    const float alphas[] = {1.0f, 0.5f}, betas[] = {0.0f, 1.0f, -2.0f};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int ai = 0; ai < 2; ai++)
                for (int bi = 0; bi < 3; bi++)
                    for (int hb = 0; hb < 2; hb++) {
                        fill(C, M * N, 4);
                        memcpy(R, C, M * N * 4);
                        float al = alphas[ai], be = betas[bi];
                        ASSERT_OK(dt_k_matmul(ta, tb, M, N, K, al, A, B, DT_F32, be, C, hb ? bias : NULL));
                        ref_mm(ta, tb, M, N, K, al, A, B, be, R, hb ? bias : NULL);
                        for (int64_t i = 0; i < M * N; i++)
                            if (!(fabsf(C[i] - R[i]) <= 1e-4f + 1e-4f * fabsf(R[i])))
                                TEST_FAIL_("ta=%d tb=%d alpha=%g beta=%g bias=%d: C[%lld] = %g, want %g", ta, tb,
                                           (double)al, (double)be, hb, (long long)i, (double)C[i], (double)R[i]);
                    }
    /* beta = 0 must ignore NaN garbage in C */
    for (int64_t i = 0; i < M * N; i++)
        C[i] = NAN;
    ASSERT_OK(dt_k_matmul(false, false, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C, NULL));
    memset(R, 0, M * N * 4);
    ref_mm(false, false, M, N, K, 1.0f, A, B, 0.0f, R, NULL);
    for (int64_t i = 0; i < M * N; i++)
        ASSERT_NEAR(C[i], R[i], 1e-4, 1e-4);
    dt_free(A);
    dt_free(B);
    dt_free(C);
    dt_free(R);
    dt_free(bias);
}

TEST(matmul_batched_broadcast)
{
    const int64_t Bt = 3, M = 5, N = 7, K = 4;
    float A[3 * 5 * 4], B[4 * 7], C[3 * 5 * 7], R[3 * 5 * 7];
    fill(A, Bt * M * K, 5);
    fill(B, K * N, 6);
    /* B broadcast (stride 0) over a batch of A */
    ASSERT_OK(dt_k_matmul_batched(false, false, Bt, M, N, K, 1.0f, A, M * K, B, 0, DT_F32, 0.0f, C, M * N, NULL));
    for (int64_t b = 0; b < Bt; b++) {
        ref_mm(false, false, M, N, K, 1.0f, A + b * M * K, B, 0.0f, R + b * M * N, NULL);
        for (int64_t i = 0; i < M * N; i++)
            ASSERT_NEAR(C[b * M * N + i], R[b * M * N + i], 1e-5, 1e-5);
    }
    /* transposed A per batch: A_b stored (K, M) */
    ASSERT_OK(dt_k_matmul_batched(true, false, Bt, M, N, K, 2.0f, A, M * K, B, 0, DT_F32, 0.0f, C, M * N, NULL));
    for (int64_t b = 0; b < Bt; b++) {
        ref_mm(true, false, M, N, K, 2.0f, A + b * M * K, B, 0.0f, R + b * M * N, NULL);
        for (int64_t i = 0; i < M * N; i++)
            ASSERT_NEAR(C[b * M * N + i], R[b * M * N + i], 1e-5, 1e-5);
    }
}

TEST(matmul_bf16)
{
    const int64_t M = 16, N = 24, K = 40;
    float A[16 * 40], B[40 * 24], C[16 * 24], R[16 * 24], bias[24];
    uint16_t Ah[16 * 40], Bh[40 * 24];
    fill(A, M * K, 7);
    fill(B, K * N, 8);
    fill(bias, N, 9);
    ASSERT_OK(dt_k_f32_to_bf16(A, Ah, M * K));
    ASSERT_OK(dt_k_f32_to_bf16(B, Bh, K * N));
    ASSERT_OK(dt_k_bf16_to_f32(Ah, A, M * K)); /* the reference sees the rounded inputs */
    ASSERT_OK(dt_k_bf16_to_f32(Bh, B, K * N));
    for (int tb = 0; tb < 2; tb++) {
        if (tb) { /* store B transposed (N, K) */
            float Bt[40 * 24];
            uint16_t Bth[40 * 24];
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < N; j++)
                    Bt[j * K + k] = B[k * N + j];
            dt_k_f32_to_bf16(Bt, Bth, K * N);
            ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, Ah, Bth, DT_BF16, 0.0f, C, bias));
            ref_mm(false, true, M, N, K, 1.0f, A, Bt, 0.0f, R, bias);
        } else {
            ASSERT_OK(dt_k_matmul(false, false, M, N, K, 1.0f, Ah, Bh, DT_BF16, 0.0f, C, bias));
            ref_mm(false, false, M, N, K, 1.0f, A, B, 0.0f, R, bias);
        }
        for (int64_t i = 0; i < M * N; i++)
            ASSERT_NEAR(C[i], R[i], 1e-4, 1e-4); /* exact products, f32 accumulation */
    }
    fprintf(stderr, "bf16 matmul native: %s\n", dt_k_matmul_bf16_native() ? "yes" : "no (widened to f32)");
}

TEST(primitive_cache)
{
    const int64_t M = 19, N = 23, K = 31;
    float *A = dt_alloc(M * K * 4), *B = dt_alloc(K * N * 4), *C = dt_alloc(M * N * 4);
    fill(A, M * K, 10);
    fill(B, K * N, 11);
    dt_k_stats s0, s1, s2;
    dt_k_stats_get(&s0);
    ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C, NULL));
    dt_k_stats_get(&s1);
    ASSERT_EQ_U64(s1.primitives_created - s0.primitives_created, 1);
    for (int i = 0; i < 5; i++)
        ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C, NULL));
    dt_k_stats_get(&s2);
    ASSERT_EQ_U64(s2.primitives_created, s1.primitives_created); /* steady state creates none */
    ASSERT(s2.cache_hits - s1.cache_hits >= 5);
    /* a different flag is a different primitive */
    ASSERT_OK(dt_k_matmul(false, true, M, N, K, 1.0f, A, B, DT_F32, 1.0f, C, NULL));
    dt_k_stats_get(&s2);
    ASSERT_EQ_U64(s2.primitives_created - s1.primitives_created, 1);
    dt_k_cache_clear();
    dt_k_stats_get(&s2);
    ASSERT_EQ_U64(s2.cache_entries, 0);
    dt_free(A);
    dt_free(B);
    dt_free(C);
}

/* Products marked varying (dt_k_matmul_set_varying): f32 and bf16, every
 * transpose, alpha/beta/bias, over row counts (M) and reductions (K) that
 * change call to call, each against the reference; at most one primitive
 * for all the shapes of one kind (none where dtrain's AMX GEMM runs the bf16
 * ones), and the setting per thread, restored. */
TEST(matmul_varying_shapes)
{
    const int64_t N = 24, Ms[] = {1, 7, 33, 130, 61}, Ks[] = {5, 64, 200, 17, 96};
    const int64_t MX = 130, KX = 200;
    float *A = dt_alloc(MX * KX * 4), *B = dt_alloc(KX * N * 4), *C = dt_alloc(MX * N * 4),
          *R = dt_alloc(MX * N * 4), *bias = dt_alloc(N * 4), *Ar = dt_alloc(MX * KX * 4), *Br = dt_alloc(KX * N * 4);
    uint16_t *Ah = dt_alloc(MX * KX * 2), *Bh = dt_alloc(KX * N * 2);
    fill(A, MX * KX, 21);
    fill(B, KX * N, 22);
    fill(bias, N, 23);
    ASSERT_OK(dt_k_f32_to_bf16(A, Ah, MX * KX));
    ASSERT_OK(dt_k_f32_to_bf16(B, Bh, KX * N));
    ASSERT_OK(dt_k_bf16_to_f32(Ah, Ar, MX * KX)); /* the bf16 reference sees the rounded inputs */
    ASSERT_OK(dt_k_bf16_to_f32(Bh, Br, KX * N));
    ASSERT(!dt_k_matmul_set_varying(true));
    for (int bf = 0; bf < 2; bf++)
        for (int kind = 0; kind < 4; kind++) { /* A B, A B^T with bias, A^T B with beta 1, A B alpha 0.5 */
            const bool ta = kind == 2, tb = kind == 1;
            const float alpha = kind == 3 ? 0.5f : 1.0f, beta = kind == 2 ? 1.0f : 0.0f;
            const float *bs = kind == 1 ? bias : NULL;
            dt_k_stats s0, s1;
            dt_k_stats_get(&s0);
            for (int i = 0; i < 5; i++) {
                const int64_t M = Ms[i], K = Ks[i];
                fill(C, M * N, 24 + (uint64_t)i);
                memcpy(R, C, (size_t)(M * N) * 4);
                ASSERT_OK(dt_k_matmul(ta, tb, M, N, K, alpha, bf ? (const void *)Ah : A, bf ? (const void *)Bh : B,
                                      bf ? DT_BF16 : DT_F32, beta, C, bs));
                ref_mm(ta, tb, M, N, K, alpha, bf ? Ar : A, bf ? Br : B, beta, R, bs);
                for (int64_t j = 0; j < M * N; j++)
                    if (!(fabsf(C[j] - R[j]) <= 1e-4f + 1e-4f * fabsf(R[j])))
                        TEST_FAIL_("%s kind %d M %lld K %lld: C[%lld] = %g, want %g", bf ? "bf16" : "f32", kind,
                                   (long long)M, (long long)K, (long long)j, (double)C[j], (double)R[j]);
            }
            dt_k_stats_get(&s1);
            if (!(s1.primitives_created - s0.primitives_created <= 1))
                TEST_FAIL_("%s kind %d: %llu primitives for 5 shapes of one kind (at most 1)", bf ? "bf16" : "f32",
                           kind, (unsigned long long)(s1.primitives_created - s0.primitives_created));
        }
    ASSERT(dt_k_matmul_set_varying(false));
    /* off again: a new shape gets its own primitive */
    dt_k_stats s0, s1;
    dt_k_stats_get(&s0);
    ASSERT_OK(dt_k_matmul(false, false, 11, N, 13, 1.0f, A, B, DT_F32, 0.0f, C, NULL));
    dt_k_stats_get(&s1);
    ASSERT_EQ_U64(s1.primitives_created - s0.primitives_created, 1);
    dt_free(A);
    dt_free(B);
    dt_free(C);
    dt_free(R);
    dt_free(bias);
    dt_free(Ar);
    dt_free(Br);
    dt_free(Ah);
    dt_free(Bh);
}

/* B's rows a multiple of 4 KiB apart and few rows of A: the product runs
 * on a padded copy of B (src/kernels/matmul.c; not where oneDNN runs
 * avx512_core_amx: isa_avx2/test_matmul runs it there). Same values as the
 * reference, with bias and beta, reused (the copy is refreshed on every
 * call: B changes between calls), and beside a transposed B and a tall A,
 * which are not padded. */
TEST(matmul_padded_b)
{
    const int64_t M = 24, N = 1024, K = 40, Mt = 400;
    float *A = dt_alloc(Mt * K * 4), *B = dt_alloc(K * N * 4), *C = dt_alloc(Mt * N * 4), *R = dt_alloc(Mt * N * 4),
          *bias = dt_alloc(N * 4);
    fill(A, Mt * K, 21);
    fill(bias, N, 23);
    for (int round = 0; round < 2; round++) {
        fill(B, K * N, 22 + 10 * (uint64_t)round); /* new weights: the padded copy must follow */
        for (int tb = 0; tb < 2; tb++)
            for (int64_t m = M; m <= Mt; m += Mt - M) {
                fill(C, m * N, 24);
                memcpy(R, C, (size_t)(m * N) * 4);
                ASSERT_OK(dt_k_matmul(false, tb, m, N, K, 1.0f, A, B, DT_F32, 0.5f, C, bias));
                ref_mm(false, tb, m, N, K, 1.0f, A, B, 0.5f, R, bias);
                for (int64_t i = 0; i < m * N; i++)
                    if (!(fabsf(C[i] - R[i]) <= 1e-4f + 1e-4f * fabsf(R[i])))
                        TEST_FAIL_("round %d tb=%d M=%lld: C[%lld] = %g, want %g", round, tb, (long long)m,
                                   (long long)i, (double)C[i], (double)R[i]);
            }
    }
    dt_free(A);
    dt_free(B);
    dt_free(C);
    dt_free(R);
    dt_free(bias);
}

TEST(matmul_edge_and_errors)
{
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 1, 1, 1, 1, 1}, C[4] = {1, 2, 3, 4}, bias[2] = {10, 20};
    /* K = 0: C = beta C + bias */
    ASSERT_OK(dt_k_matmul(false, false, 2, 2, 0, 1.0f, A, B, DT_F32, 2.0f, C, bias));
    ASSERT_NEAR(C[0], 12, 0, 0);
    ASSERT_NEAR(C[3], 28, 0, 0);
    ASSERT_OK(dt_k_matmul(false, false, 0, 2, 3, 1.0f, NULL, B, DT_F32, 0.0f, NULL, NULL));
    ASSERT_STATUS(dt_k_matmul(false, false, -1, 2, 3, 1.0f, A, B, DT_F32, 0.0f, C, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "negative");
    ASSERT_STATUS(dt_k_matmul(false, false, 2, 2, 3, 1.0f, NULL, B, DT_F32, 0.0f, C, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_matmul(false, false, 2, 2, 3, 1.0f, A, B, DT_I32, 0.0f, C, NULL), DT_ERR_UNSUPPORTED);
    /* sizes whose element counts overflow int64 crashed (stack overflow, M = N = 2^63 - 1) */
    ASSERT_STATUS(dt_k_matmul(false, false, INT64_MAX, INT64_MAX, 2, 1.0f, A, B, DT_F32, 0.0f, C, NULL),
                  DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "more elements than any buffer");
    ASSERT_STATUS(dt_k_matmul(false, false, 2, (int64_t)1 << 40, (int64_t)1 << 30, 1.0f, A, B, DT_F32, 0.0f, C, NULL),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_matmul_batched(false, false, (int64_t)1 << 40, 2, 2, (int64_t)1 << 30, 1.0f, A, 0, B, 0,
                                      DT_F32, 0.0f, C, 4, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_matmul_batched(false, false, 2, 2, 2, 3, 1.0f, A, 0, B, 0, DT_F32, 0.0f, C, 1, NULL),
                  DT_ERR_INVALID_ARG);
    double g;
    ASSERT_STATUS(dt_k_bench_matmul(0, DT_F32, 1, &g), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_k_bench_matmul(64, DT_F32, 2, &g));
    ASSERT(g > 0.0);
}

TEST(matmul_bf16_batched)
{
    enum { Bt = 3, M = 6, N = 5, K = 7 };
    float A[Bt * M * K], B[K * N], C[Bt * M * N], R[Bt * M * N];
    uint16_t Ah[Bt * M * K], Bh[K * N];
    fill(A, Bt * M * K, 12);
    fill(B, K * N, 13);
    dt_k_f32_to_bf16(A, Ah, Bt * M * K);
    dt_k_f32_to_bf16(B, Bh, K * N);
    dt_k_bf16_to_f32(Ah, A, Bt * M * K);
    dt_k_bf16_to_f32(Bh, B, K * N);
    fill(C, Bt * M * N, 14);
    memcpy(R, C, sizeof C);
    ASSERT_OK(dt_k_matmul_batched(false, false, Bt, M, N, K, 1.0f, Ah, M * K, Bh, 0, DT_BF16, 0.5f, C, M * N, NULL));
    for (int b = 0; b < Bt; b++)
        ref_mm(false, false, M, N, K, 1.0f, A + b * M * K, B, 0.5f, R + b * M * N, NULL);
    for (int i = 0; i < Bt * M * N; i++)
        ASSERT_NEAR(C[i], R[i], 1e-5, 1e-5);
}

/* Two threads creating and running primitives at once share the cache. */
#include <pthread.h>
typedef struct {
    int64_t n;
    int ok;
} mm_job;

static void *mm_thread(void *arg)
{
    mm_job *j = arg;
    int64_t n = j->n;
    float *A = dt_alloc(n * n * 4), *C = dt_alloc(n * n * 4);
    for (int64_t i = 0; i < n * n; i++)
        A[i] = (float)(i % 7) - 3.0f;
    j->ok = 1;
    for (int r = 0; r < 20 && j->ok; r++) {
        if (dt_k_matmul(false, false, n, n, n, 1.0f, A, A, DT_F32, 0.0f, C, NULL) < 0)
            j->ok = 0;
        double want = 0;
        for (int64_t k = 0; k < n; k++)
            want += (double)A[k] * A[k * n];
        if (fabs(C[0] - want) > 1e-3)
            j->ok = 0;
    }
    dt_free(A);
    dt_free(C);
    return NULL;
}

TEST(matmul_concurrent_threads)
{
    dt_k_cache_clear();
    mm_job jobs[4] = {{17, 0}, {17, 0}, {33, 0}, {33, 0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_INT(pthread_create(&th[i], NULL, mm_thread, &jobs[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ_INT(jobs[i].ok, 1);
    dt_k_stats st;
    dt_k_stats_get(&st);
    ASSERT(st.cache_entries >= 2);
}

/* dt_k_matmul_batched_lp: the bf16 result (written by oneDNN where
 * dt_k_matmul_writes_lp, else rounded from f32) against the double
 * reference rounded to bf16: within one bf16 ulp (the f32 sums may differ in
 * their last bits, which can move a rounding), for every transpose, with a
 * bias and alpha, 2-D and batched (broadcast B); sizes with vector tails. */
TEST(matmul_bf16_lp_result)
{
    enum { Bt = 3, M = 37, N = 45, K = 70 };
    float *A = malloc(Bt * M * K * 4), *B = malloc(K * N * 4), *R = malloc(Bt * M * N * 4), bias[N];
    uint16_t *Ah = malloc(Bt * M * K * 2), *Bh = malloc(K * N * 2), *Ch = malloc(Bt * M * N * 2);
    ASSERT(A && B && R && Ah && Bh && Ch);
    fill(A, Bt * M * K, 21);
    fill(B, K * N, 22);
    fill(bias, N, 23);
    dt_k_f32_to_bf16(A, Ah, Bt * M * K);
    dt_k_f32_to_bf16(B, Bh, K * N);
    dt_k_bf16_to_f32(Ah, A, Bt * M * K);
    dt_k_bf16_to_f32(Bh, B, K * N);
    fprintf(stderr, "bf16 result written by oneDNN: %s\n", dt_k_matmul_writes_lp(DT_BF16) ? "yes" : "no (rounded from f32)");
    for (int f = 0; f < 4; f++) {
        bool ta = f & 1, tb = f & 2;
        const float alpha = f == 3 ? 0.5f : 1.0f;
        const float *bs = f >= 2 ? bias : NULL;
        int batch = f == 1 ? Bt : 1;
        ASSERT_OK(dt_k_matmul_batched_lp(ta, tb, batch, M, N, K, alpha, Ah, M * K, Bh, 0, DT_BF16, Ch, M * N, bs));
        for (int b = 0; b < batch; b++)
            ref_mm(ta, tb, M, N, K, alpha, A + b * M * K, B, 0.0f, R + b * M * N, bs);
        for (int i = 0; i < batch * M * N; i++) {
            float got = dt_bf16_to_f32(Ch[i]), want = dt_bf16_to_f32(dt_f32_to_bf16(R[i]));
            float ulp = fabsf(want) * 0x1p-7f + 1e-30f;
            if (!(fabsf(got - want) <= ulp))
                TEST_FAIL_("flags %d element %d: %.6g, reference %.6g", f, i, (double)got, (double)want);
        }
    }
    ASSERT_STATUS(dt_k_matmul_batched_lp(false, false, 1, M, N, K, 1.0f, Ah, 0, Bh, 0, DT_F32, Ch, 0, NULL),
                  DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_matmul_batched_lp(false, false, 1, M, N, K, 1.0f, NULL, 0, Bh, 0, DT_BF16, Ch, 0, NULL),
                  DT_ERR_NULL);
    free(A), free(B), free(R), free(Ah), free(Bh), free(Ch);
}

/* dt_k_matmul_lp_checked: the result of dt_k_matmul_batched_lp (bit for
 * bit: the same path) and whether every value of it is finite, on a shape
 * auto sends to dtrain's AMX GEMM where it runs (2^27 multiply-adds: the
 * check in its epilogue) and on a small one (oneDNN or the widening: a read
 * pass); every transpose. One row of A large enough that a sum overflows: false.
 * NULL finite refused. */
TEST(matmul_lp_checked)
{
    static const int64_t shp[][3] = {{37, 45, 70}, {512, 520, 512}};
    for (int s = 0; s < 2; s++) {
        const int64_t M = shp[s][0], N = shp[s][1], K = shp[s][2];
        float *A = malloc((size_t)(M * K) * 4), *B = malloc((size_t)(K * N) * 4);
        uint16_t *Ah = malloc((size_t)(M * K) * 2), *Bh = malloc((size_t)(K * N) * 2);
        uint16_t *C = malloc((size_t)(M * N) * 2), *C2 = malloc((size_t)(M * N) * 2);
        ASSERT(A && B && Ah && Bh && C && C2);
        fill(A, M * K, 31);
        fill(B, K * N, 32);
        for (int f = 0; f < 8; f++) {
            bool ta = f & 1, tb = f & 2, poison = f & 4;
            dt_k_f32_to_bf16(A, Ah, M * K);
            dt_k_f32_to_bf16(B, Bh, K * N);
            if (poison) /* a row of op(A) at 1e37 against a column of op(B) at 1: K 1e37 overflows */
                for (int64_t k = 0; k < K; k++) {
                    Ah[ta ? k * M + M / 2 : (M / 2) * K + k] = dt_f32_to_bf16(1e37f);
                    Bh[tb ? (N / 2) * K + k : k * N + N / 2] = dt_f32_to_bf16(1.0f);
                }
            bool fin = poison;
            ASSERT_OK(dt_k_matmul_lp_checked(ta, tb, M, N, K, Ah, Bh, DT_BF16, C, &fin));
            ASSERT_OK(dt_k_matmul_batched_lp(ta, tb, 1, M, N, K, 1.0f, Ah, 0, Bh, 0, DT_BF16, C2, 0, NULL));
            ASSERT(memcmp(C, C2, (size_t)(M * N) * 2) == 0);
            int64_t bad = dt_k_first_nonfinite(C, DT_BF16, M * N);
            ASSERT(poison ? bad < M * N : bad == M * N); /* the poison did overflow, the rest is finite */
            if (fin != !poison)
                TEST_FAIL_("M=%lld flags %d: finite %d", (long long)M, f, (int)fin);
        }
        ASSERT_STATUS(dt_k_matmul_lp_checked(false, false, M, N, K, Ah, Bh, DT_BF16, C, NULL), DT_ERR_NULL);
        free(A), free(B), free(Ah), free(Bh), free(C), free(C2);
    }
}

/* Products large enough to run as slabs on 2+ threads (src/kernels/matmul.c:
 * M N K >= 2^24, one slab per thread, split along the larger of M and N at
 * multiples of 48, N only without alpha and beta): every result within the
 * f32/bf16 bound of the double reference on 1, 2 and 3 threads; on oneDNN's
 * AVX-512 kernels the 2- and 3-thread results equal the one-thread result
 * bit for bit (a slab's call is a one-thread call over some of the
 * outputs; the AVX2 kernels block by other sizes, and bf16 on AMX runs
 * without slabs, on oneDNN's AMX kernels, which block by the thread count,
 * or on dtrain's own GEMM: bits not compared there). Every
 * transpose, alpha/beta/bias, f32 and bf16 (native or widened), the bf16
 * result of dt_k_matmul_batched_lp, a split of M and one of N, sizes that
 * are no multiple of 48. */
static void slab_case(int64_t M, int64_t N, int64_t K, dt_dtype t, bool lp)
{
    const int saved = dt_get_num_threads();
    float *A = dt_alloc(M * K * 4), *B = dt_alloc(K * N * 4), *R = dt_alloc(M * N * 4), *C0 = dt_alloc(M * N * 4),
          *C = dt_alloc(M * N * 4), *bias = dt_alloc(N * 4);
    uint16_t *Ah = dt_alloc(M * K * 2), *Bh = dt_alloc(K * N * 2), *H0 = dt_alloc(M * N * 2), *H = dt_alloc(M * N * 2);
    ASSERT(A && B && R && C0 && C && bias && Ah && Bh && H0 && H);
    fill(A, M * K, 31);
    fill(B, K * N, 32);
    fill(bias, N, 33);
    if (t == DT_BF16) { /* the reference on the rounded inputs */
        dt_k_f32_to_bf16(A, Ah, M * K);
        dt_k_f32_to_bf16(B, Bh, K * N);
        dt_k_bf16_to_f32(Ah, A, M * K);
        dt_k_bf16_to_f32(Bh, B, K * N);
    }
    const void *a = t == DT_BF16 ? (const void *)Ah : A, *b = t == DT_BF16 ? (const void *)Bh : B;
    const char *isa = dt_k_onednn_isa();
    const bool same_bits = !strncmp(isa, "avx512_core", 11) &&
                           !(t == DT_BF16 && (dt_k_matmul_amx(NULL) || strstr(isa, "amx")));
    for (int f = 0; f < (lp ? 4 : 8); f++) {
        bool ta = f & 1, tb = f & 2, post = f & 4;
        float alpha = post ? 0.5f : 1.0f, beta = post ? 1.0f : 0.0f;
        const float *bs = (f == 3 || post) ? bias : NULL;
        for (int nt = 1; nt <= 3; nt++) {
            dt_set_num_threads(nt);
            float *c = nt == 1 ? C0 : C;
            uint16_t *h = nt == 1 ? H0 : H;
            fill(c, M * N, 34);
            if (lp)
                ASSERT_OK(dt_k_matmul_batched_lp(ta, tb, 1, M, N, K, alpha, a, 0, b, 0, t, h, 0, bs));
            else
                ASSERT_OK(dt_k_matmul(ta, tb, M, N, K, alpha, a, b, t, beta, c, bs));
            if (nt == 1) {
                fill(R, M * N, 34);
                ref_mm(ta, tb, M, N, K, alpha, A, B, lp ? 0.0f : beta, R, bs);
            }
            for (int64_t i = 0; i < M * N; i++) {
                float got = lp ? dt_bf16_to_f32(h[i]) : c[i], want = R[i];
                float tol = lp ? fabsf(want) * 0x1p-7f + 1e-3f : 1e-3f + 1e-4f * fabsf(want);
                if (!(fabsf(got - want) <= tol)) {
                    TEST_FAIL_("%s M=%lld N=%lld K=%lld flags %d, %d threads: C[%lld] = %g, reference %g",
                               dt_dtype_name(t), (long long)M, (long long)N, (long long)K, f, nt, (long long)i,
                               (double)got, (double)want);
                    goto out;
                }
            }
            if (nt > 1 && same_bits &&
                (lp ? memcmp(H, H0, (size_t)(M * N) * 2) : memcmp(C, C0, (size_t)(M * N) * 4))) {
                int64_t i = 0;
                while (lp ? H[i] == H0[i] : C[i] == C0[i])
                    i++;
                TEST_FAIL_("%s%s M=%lld N=%lld K=%lld flags %d, %d threads: C[%lld] = %.9g, one thread %.9g",
                           dt_dtype_name(t), lp ? " (bf16 result)" : "", (long long)M, (long long)N, (long long)K, f,
                           nt, (long long)i, lp ? (double)dt_bf16_to_f32(H[i]) : (double)C[i],
                           lp ? (double)dt_bf16_to_f32(H0[i]) : (double)C0[i]);
                goto out;
            }
        }
    }
out:
    dt_set_num_threads(saved);
    dt_free(A), dt_free(B), dt_free(R), dt_free(C0), dt_free(C), dt_free(bias);
    dt_free(Ah), dt_free(Bh), dt_free(H0), dt_free(H);
}

TEST(matmul_slabs_match_one_thread)
{
    slab_case(301, 203, 280, DT_F32, false); /* split M */
    slab_case(150, 333, 350, DT_F32, false); /* split N */
    slab_case(301, 203, 280, DT_BF16, false);
    slab_case(150, 333, 350, DT_BF16, false);
    if (dt_k_matmul_native(DT_BF16)) {
        slab_case(301, 203, 280, DT_BF16, true);
        slab_case(150, 333, 350, DT_BF16, true);
    }
}

/* The slabs run: on 2 threads a product of 2^24 multiply-adds or more
 * creates its primitive and one single-threaded primitive per slab (1 + 2),
 * a smaller one only its own; on 1 thread one. Inside a caller's parallel
 * region the product runs as one call on that thread (same values). */
TEST(matmul_slab_primitives)
{
#ifndef _OPENMP
    DT_TEST_SKIP("built without OpenMP: no slabs");
#else
    const int saved = dt_get_num_threads();
    const int64_t M = 256, N = 256, K = 256, Ms = 64; /* 2^24 and 2^22 multiply-adds */
    float *A = dt_alloc(M * K * 4), *B = dt_alloc(K * N * 4), *C = dt_alloc(M * N * 4), *C1 = dt_alloc(M * N * 4);
    fill(A, M * K, 41);
    fill(B, K * N, 42);
    dt_k_cache_clear();
    dt_k_stats s0, s1;
    const int64_t want[3][2] = {{1, 1}, {1, 1}, {3, 1}}; /* [threads][large, small] */
    for (int nt = 1; nt <= 2; nt++) {
        dt_set_num_threads(nt);
        for (int small = 0; small < 2; small++) {
            dt_k_stats_get(&s0);
            ASSERT_OK(dt_k_matmul(false, false, small ? Ms : M, N, K, 1.0f, A, B, DT_F32, 0.0f, nt == 1 ? C1 : C,
                                  NULL));
            dt_k_stats_get(&s1);
            if ((int64_t)(s1.primitives_created - s0.primitives_created) != want[nt][small])
                TEST_FAIL_("%d threads, %s product: %llu primitives created, want %lld", nt,
                           small ? "small" : "large",
                           (unsigned long long)(s1.primitives_created - s0.primitives_created),
                           (long long)want[nt][small]);
        }
    }
    ASSERT(!memcmp(C, C1, (size_t)(M * N) * 4));
    memset(C, 0, (size_t)(M * N) * 4);
    int ok = 1;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
        ok = dt_k_matmul(false, false, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C, NULL) >= 0;
    }
    ASSERT(ok);
    ASSERT(!memcmp(C, C1, (size_t)(M * N) * 4));
    dt_set_num_threads(saved);
    dt_free(A), dt_free(B), dt_free(C), dt_free(C1);
#endif
}

/* On oneDNN's AVX2 kernels a product whose slabs would be one-thread calls
 * over column blocks of a long B with rows a multiple of 4 KiB apart (B not
 * transposed, N a multiple of 1024, K >= 2048: such a slab ran at half
 * speed) runs as one call; on the AVX-512 kernels, and with B transposed,
 * it runs as slabs (1 + 2 primitives on 2 threads). Either way the 2-thread
 * result is within the f32 bound of the 1-thread one. */
TEST(matmul_slab_conflicts)
{
#ifndef _OPENMP
    DT_TEST_SKIP("built without OpenMP: no slabs");
#else
    const int saved = dt_get_num_threads();
    const int64_t M = 512, N = 1024, K = 2048; /* above the padded copy's 384 rows */
    const bool avx512 = !strncmp(dt_k_onednn_isa(), "avx512_core", 11); /* AMX included */
    float *A = dt_alloc(M * K * 4), *B = dt_alloc(K * N * 4), *C = dt_alloc(M * N * 4), *C1 = dt_alloc(M * N * 4);
    ASSERT(A && B && C && C1);
    fill(A, M * K, 51);
    fill(B, K * N, 52);
    for (int tb = 0; tb < 2; tb++) {
        dt_set_num_threads(1);
        ASSERT_OK(dt_k_matmul(false, tb, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C1, NULL));
        dt_set_num_threads(2);
        dt_k_stats s0, s1;
        dt_k_stats_get(&s0);
        ASSERT_OK(dt_k_matmul(false, tb, M, N, K, 1.0f, A, B, DT_F32, 0.0f, C, NULL));
        dt_k_stats_get(&s1);
        const int64_t want = !tb && !avx512 ? 1 : 3, got = (int64_t)(s1.primitives_created - s0.primitives_created);
        if (got != want)
            TEST_FAIL_("B%s, oneDNN isa %s, 2 threads: %lld primitives created, want %lld", tb ? "^T" : "",
                       dt_k_onednn_isa(), (long long)got, (long long)want);
        for (int64_t i = 0; i < M * N; i++)
            if (!(fabsf(C[i] - C1[i]) <= 1e-3f + 1e-4f * fabsf(C1[i]))) {
                TEST_FAIL_("B%s, 2 threads: C[%lld] = %g, one thread %g", tb ? "^T" : "", (long long)i,
                           (double)C[i], (double)C1[i]);
                break;
            }
    }
    dt_set_num_threads(saved);
    dt_free(A), dt_free(B), dt_free(C), dt_free(C1);
#endif
}

int main(void)
{
    RUN(matmul_slab_primitives);
    RUN(matmul_slab_conflicts);
    RUN(matmul_slabs_match_one_thread);
    RUN(matmul_bf16_batched);
    RUN(matmul_bf16_lp_result);
    RUN(matmul_lp_checked);
    RUN(matmul_concurrent_threads);
    RUN(matmul_f32_all_flags);
    RUN(matmul_batched_broadcast);
    RUN(matmul_padded_b);
    RUN(matmul_bf16);
    RUN(primitive_cache);
    RUN(matmul_edge_and_errors);
    RUN(matmul_varying_shapes);
    return TEST_REPORT();
}
