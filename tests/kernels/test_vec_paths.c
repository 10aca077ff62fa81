/* The kernels' AVX2 row loops (dt__expf8: the fused bias + GELU and the
 * chunked softmax cross-entropy) give the same bits as their scalar loops
 * (dt_k_set_isa(DT_K_ISA_SCALAR)), on row lengths that leave a tail after
 * the 8-lane part and on inputs that reach the exponential's clamps (large
 * magnitudes, -0, NaN). Skipped on a CPU without AVX2 (as dt_cpu_detect()
 * reports it: DT_MAX_CPU_ISA=scalar too), where only the scalar loops
 * exist. */
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>

static void fill(float *x, int64_t n, uint64_t seed, float scale)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 3, 4), 0, x, (size_t)n, -scale, scale);
}

static int64_t first_diff(const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)))
            return i;
    return -1;
}

#define SAME_BITS(a, b, n, what)                                                                      \
    do {                                                                                              \
        int64_t i_ = first_diff(a, b, n);                                                             \
        if (i_ >= 0)                                                                                  \
            TEST_FAIL_("%s: element %lld differs: %.9g (avx2) vs %.9g (scalar)", what, (long long)i_, \
                       (double)(a)[i_], (double)(b)[i_]);                                             \
    } while (0)

TEST(bias_gelu_tanh_paths_identical)
{
    const int64_t R = 5, N = 203; /* 25 lanes of 8 and a tail of 3 */
    float *x = malloc(R * N * 4), *b = malloc(N * 4), *dy = malloc(R * N * 4);
    float *y[2], *dx[2], *db[2];
    for (int k = 0; k < 2; k++) {
        y[k] = malloc(R * N * 4);
        dx[k] = malloc(R * N * 4);
        db[k] = malloc(N * 4);
    }
    fill(x, R * N, 1, 6.0f);
    fill(b, N, 2, 1.0f);
    fill(dy, R * N, 3, 1.0f);
    const float special[] = {-0.0f, 0.0f, 60.0f, -60.0f, 200.0f, -200.0f, 3e38f, -3e38f, NAN, 1e-30f, -9.5f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[7 + 13 * i] = special[i];
    for (int withb = 0; withb < 2; withb++) {
        for (int k = 0; k < 2; k++) { /* k = 0: the vector path, 1: scalar */
            ASSERT_OK(dt_k_set_isa(k ? DT_K_ISA_SCALAR : DT_K_ISA_AUTO));
            ASSERT_OK(dt_k_bias_gelu_fwd(x, withb ? b : NULL, R, N, y[k], DT_K_GELU_TANH));
            ASSERT_OK(dt_k_bias_gelu_bwd(x, withb ? b : NULL, dy, R, N, dx[k], db[k], DT_K_GELU_TANH));
        }
        SAME_BITS(y[0], y[1], R * N, withb ? "gelu forward with bias" : "gelu forward");
        SAME_BITS(dx[0], dx[1], R * N, withb ? "gelu backward dx with bias" : "gelu backward dx");
        SAME_BITS(db[0], db[1], N, "gelu backward dbias");
        if (!withb) {
            ASSERT(isnan(y[0][7 + 13 * 8]));            /* NaN in, NaN out */
            ASSERT_NEAR(y[0][7 + 13 * 2], 60.0f, 0, 1e-6); /* gelu(60) = 60 */
            ASSERT_NEAR(y[0][7 + 13 * 3], 0.0f, 0, 0);  /* gelu(-60) = -0 */
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(x), free(b), free(dy);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dx[k]), free(db[k]);
}

TEST(xent_paths_identical)
{
    const int64_t R = 4, V = 5003; /* three chunks, the last 907 wide: a tail of 3 */
    float *lg = malloc(R * V * 4), *g[2];
    float loss[2];
    int64_t lab[4] = {5002, 0, DT_K_IGNORE_INDEX, 2500};
    fill(lg, R * V, 9, 8.0f);
    lg[4600] = 40.0f;        /* row 0: the max in the last chunk */
    lg[V + 1] = -90.0f;      /* exponentials that underflow to 0 */
    lg[3 * V + 17] = 95.0f;  /* x - max reaches -100 in the rest of row 3 */
    for (int k = 0; k < 2; k++) {
        g[k] = malloc(R * V * 4);
        ASSERT_OK(dt_k_set_isa(k ? DT_K_ISA_SCALAR : DT_K_ISA_AUTO));
        ASSERT_OK(dt_k_softmax_xent_fwd(lg, lab, DT_I64, R, V, &loss[k], NULL));
        ASSERT_OK(dt_k_softmax_xent_bwd(lg, NULL, lab, DT_I64, R, V, 1.5f, g[k]));
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    SAME_BITS(&loss[0], &loss[1], 1, "cross-entropy loss");
    SAME_BITS(g[0], g[1], R * V, "cross-entropy gradient");
    /* and the value: against a double loop */
    double tot = 0;
    for (int64_t r = 0; r < R; r++) {
        if (lab[r] == DT_K_IGNORE_INDEX)
            continue;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++)
            m = fmax(m, lg[r * V + j]);
        for (int64_t j = 0; j < V; j++)
            s += exp((double)lg[r * V + j] - m);
        tot += m + log(s) - lg[r * V + lab[r]];
    }
    ASSERT_NEAR(loss[0], tot / 3, 0, 1e-5);
    free(lg), free(g[0]), free(g[1]);
}

int main(void)
{
    if (dt_k_get_isa() == DT_K_ISA_SCALAR)
        DT_TEST_SKIP_ALL("no AVX2 on this CPU (dt_k_get_isa() is scalar): only the scalar loops exist");
    RUN(bias_gelu_tanh_paths_identical);
    RUN(xent_paths_identical);
    return TEST_REPORT();
}
