/* The inline exponential on every form (its bound, its lanes), and the
 * kernels' vector row loops (dt__expf8 / dt__expf16: the fused bias +
 * GELU and the chunked softmax cross-entropy, its backward from saved
 * log-sum-exps too; rows_acc: attention forward
 * and backward; RMSNorm) give the same bits as their scalar loops on every ISA path
 * the CPU has: avx2 (8 lanes), avx512 and avx512_bf16 (16 lanes), each set
 * with dt_k_set_isa and compared with DT_K_ISA_SCALAR, on row lengths that
 * leave a tail after the 16-lane part, an 8-lane step and a scalar rest, and
 * on inputs that reach the exponential's clamps (large magnitudes, -0, NaN).
 * A path the CPU lacks is reported and left out; skipped on a CPU without
 * AVX2 (as dt_cpu_detect() reports it: DT_MAX_CPU_ISA=scalar too), where
 * only the scalar loops exist. */
#include "dtrain/kernels.h"
#include "kernels/kernels_impl.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The vector paths, each run when the CPU has it (dt_k_set_isa succeeds). */
static const dt_k_isa k_paths[] = {DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
#define NPATH (int)(sizeof k_paths / sizeof k_paths[0])
static int g_ran[NPATH];

/* Sets path k (NPATH: scalar); false when the CPU lacks it. */
static bool set_path(int k)
{
    if (k == NPATH)
        return dt_k_set_isa(DT_K_ISA_SCALAR) == DT_OK;
    if (dt_k_set_isa(k_paths[k]) != DT_OK)
        return false;
    g_ran[k] = 1;
    return true;
}

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

/* a and b (n floats) bit for bit, else a failure naming the first element that differs, a's path
 * and what b is (ref). */
#define SAME_AS(a, b, n, what, ref)                                                                   \
    do {                                                                                              \
        int64_t i_ = first_diff(a, b, n);                                                             \
        if (i_ >= 0)                                                                                  \
            TEST_FAIL_("%s: element %lld differs: %.9g (%s) vs %.9g (%s)", what, (long long)i_,       \
                       (double)(a)[i_], dt_k_isa_name(dt_k_get_isa()), (double)(b)[i_], ref);         \
    } while (0)
#define SAME_BITS(a, b, n, what) SAME_AS(a, b, n, what, "scalar")

/* The rows' inline exponential itself: dt__expf within 2 ulp of exp (in
 * double) on every 127th float of [-87, 88.37] (about 18 million values),
 * its 8- and 16-lane forms bit-identical to it there where the CPU has
 * them, and the ends: 0 below -87, +inf above 88.7 and from where 2^n
 * overflows (x >= 88.3763), NaN for NaN, on every form. */
#if DT__X86_VEC
DT__AVX2 static void exp_rows8(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(y + i, dt__expf8(_mm256_loadu_ps(x + i)));
}

DT__AVX512 static void exp_rows16(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(y + i, dt__expf16(_mm512_loadu_ps(x + i)));
}
#endif

/* |got - want| in units of the last place of want rounded to float */
static double ulps(float got, double want)
{
    int e;
    frexp(want, &e);
    return fabs((double)got - want) / ldexp(1.0, e - 24);
}

/* the batch x[0..n) (n a multiple of 16) on every form: the scalar's
 * worst error in ulps into *worst; fails on a lane that differs */
static void exp_batch(const float *x, int64_t n, bool v8, bool v16, double *worst)
{
    float y[3][4096];
    for (int64_t j = 0; j < n; j++) {
        y[0][j] = dt__expf(x[j]);
        double u = ulps(y[0][j], exp((double)x[j]));
        *worst = u > *worst ? u : *worst;
    }
#if DT__X86_VEC
    if (v8)
        exp_rows8(x, y[1], n);
    if (v16)
        exp_rows16(x, y[2], n);
#endif
    for (int k = 1; k < 3; k++) {
        const int64_t j = (k == 1 && v8) || (k == 2 && v16) ? first_diff(y[k], y[0], n) : -1;
        if (j >= 0)
            TEST_FAIL_("exp(%.9g): %d lanes give %.9g, the scalar %.9g", (double)x[j], k == 1 ? 8 : 16,
                       (double)y[k][j], (double)y[0][j]);
    }
}

TEST(expf_bound_and_lanes)
{
    const dt_cpu_features f = dt_cpu_detect();
    const bool v8 = f.avx2 && f.fma, v16 = v8 && f.avx512f && f.avx512bw && f.avx512vl;
    float x[4096];
    int64_t n = 0, seen = 0;
    double worst = 0.0;
    for (uint64_t i = 0; i < (UINT64_C(1) << 32); i += 127) {
        uint32_t b = (uint32_t)i;
        float v;
        memcpy(&v, &b, 4);
        if (!(v >= -87.0f && v <= 88.37f))
            continue;
        x[n++] = v, seen++;
        if (n == 4096) {
            exp_batch(x, n, v8, v16, &worst);
            n = 0;
            if (dt_test_failed_) /* the first batch that differs is reported */
                return;
        }
    }
    while (n % 16) /* a whole number of 16-lane steps */
        x[n++] = 0.0f;
    exp_batch(x, n, v8, v16, &worst);
    printf("# dt__expf: %lld values, worst %.3f ulp (8 lanes %s, 16 lanes %s)\n", (long long)seen, worst,
           v8 ? "compared" : "not on this CPU", v16 ? "compared" : "not on this CPU");
    ASSERT(seen > 10000000);
    ASSERT(worst <= 2.0);
    const float ends[16] = {-INFINITY, -1e30f, -88.0f, -87.5f, 88.38f, 88.5f, 88.7f, 89.0f,
                            1e30f,     INFINITY, NAN,   -NAN,   0.0f,   -0.0f, 1.0f,  -1.0f};
    const float want[16] = {0.0f,     0.0f,     0.0f, 0.0f, INFINITY, INFINITY, INFINITY, INFINITY,
                            INFINITY, INFINITY, NAN,  NAN,  1.0f,     1.0f,     2.71828183f, 0.36787944f};
    double w_ends = 0.0;
    exp_batch(ends, 16, v8, v16, &w_ends); /* the forms agree on the ends too (the error is not looked at) */
    for (int j = 0; j < 16; j++) {
        float y = dt__expf(ends[j]);
        if (isnan(want[j]) ? !isnan(y) : !(y == want[j] || fabsf(y - want[j]) <= 2e-7f * fabsf(want[j])))
            TEST_FAIL_("exp(%.9g) = %.9g, want %.9g", (double)ends[j], (double)y, (double)want[j]);
    }
}

TEST(bias_gelu_tanh_paths_identical)
{
    const int64_t R = 5, N = 203; /* 12 lanes of 16, one of 8 and a tail of 3 */
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
        /* [1]: the scalar reference */
        ASSERT(set_path(NPATH));
        ASSERT_OK(dt_k_bias_gelu_fwd(x, withb ? b : NULL, R, N, y[1], DT_K_GELU_TANH));
        ASSERT_OK(dt_k_bias_gelu_bwd(x, withb ? b : NULL, dy, R, N, dx[1], db[1], DT_K_GELU_TANH));
        for (int k = 0; k < NPATH; k++) {
            if (!set_path(k))
                continue;
            ASSERT_OK(dt_k_bias_gelu_fwd(x, withb ? b : NULL, R, N, y[0], DT_K_GELU_TANH));
            ASSERT_OK(dt_k_bias_gelu_bwd(x, withb ? b : NULL, dy, R, N, dx[0], db[0], DT_K_GELU_TANH));
            SAME_BITS(y[0], y[1], R * N, withb ? "gelu forward with bias" : "gelu forward");
            SAME_BITS(dx[0], dx[1], R * N, withb ? "gelu backward dx with bias" : "gelu backward dx");
            SAME_BITS(db[0], db[1], N, "gelu backward dbias");
            /* the bias-free entry points take the same rows */
            if (!withb) {
                ASSERT_OK(dt_k_gelu_fwd(x, y[0], R * N, DT_K_GELU_TANH));
                SAME_BITS(y[0], y[1], R * N, "dt_k_gelu_fwd");
                ASSERT_OK(dt_k_gelu_bwd(x, dy, dx[0], R * N, DT_K_GELU_TANH));
                SAME_BITS(dx[0], dx[1], R * N, "dt_k_gelu_bwd");
            }
        }
        if (!withb) {
            ASSERT(isnan(y[1][7 + 13 * 8]));            /* NaN in, NaN out */
            ASSERT_NEAR(y[1][7 + 13 * 2], 60.0f, 0, 1e-6); /* gelu(60) = 60 */
            ASSERT_NEAR(y[1][7 + 13 * 3], 0.0f, 0, 0);  /* gelu(-60) = -0 */
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(x), free(b), free(dy);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dx[k]), free(db[k]);
}

/* The f32 bias + GELU backward over column blocks of every width it picks
 * (512 columns where each thread gets one, else 256; a tail block of 76):
 * on every path, dbias is each column's sum of the dx returned over the
 * rows in row order, the tanh form's dx is the element-wise gradient of
 * x + b (dt_k_gelu_bwd on the same path), and 2 and 3 threads give the
 * bits of 1. */
TEST(bias_gelu_bwd_blocks)
{
    const int64_t R = 40, N = 1100, M = R * N;
    float *x = malloc(M * 4), *b = malloc(N * 4), *dy = malloc(M * 4), *h = malloc(M * 4);
    float *dx = malloc(M * 4), *dx1 = malloc(M * 4), *db = malloc(N * 4), *db1 = malloc(N * 4);
    fill(x, M, 11, 5.0f);
    fill(b, N, 12, 1.0f);
    fill(dy, M, 13, 1.0f);
    for (int64_t i = 0; i < M; i++)
        h[i] = x[i] + b[i % N];
    const int threads = dt_get_num_threads();
    for (int k = 0; k <= NPATH; k++) {
        if (!set_path(k))
            continue;
        for (int a = 0; a < 2; a++) {
            dt_k_gelu_approx ap = a ? DT_K_GELU_TANH : DT_K_GELU_ERF;
            const char *what = a ? "tanh gelu backward, column blocks" : "erf gelu backward, column blocks";
            dt_set_num_threads(1);
            memset(db1, 0xff, (size_t)N * 4);
            ASSERT_OK(dt_k_bias_gelu_bwd(x, b, dy, R, N, dx1, db1, ap));
            for (int64_t j = 0; j < N; j++) {
                float s = 0.0f;
                for (int64_t r = 0; r < R; r++)
                    s += dx1[r * N + j];
                db[j] = s;
            }
            SAME_AS(db1, db, N, what, "the in-order column sums");
            if (a) {
                ASSERT_OK(dt_k_gelu_bwd(h, dy, dx, M, ap));
                SAME_AS(dx1, dx, M, what, "dt_k_gelu_bwd");
            }
            for (int nt = 2; nt <= 3; nt++) {
                dt_set_num_threads(nt);
                memset(db, 0xff, (size_t)N * 4);
                ASSERT_OK(dt_k_bias_gelu_bwd(x, b, dy, R, N, dx, db, ap));
                SAME_AS(dx, dx1, M, what, "1 thread");
                SAME_AS(db, db1, N, what, "1 thread");
            }
        }
    }
    dt_set_num_threads(threads);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(x), free(b), free(dy), free(h), free(dx), free(dx1), free(db), free(db1);
}

/* The bias + GELU kernels on bf16/f16 x (dt_k_bias_gelu_*_lp): on every
 * path, scalar included, the same bits as widening x with dt_k_convert and
 * running the f32 kernels of that path (which equal the scalar loops,
 * above); dx rounded to the dtype afterwards; dbias from the unrounded
 * values. The bound against the f32 reference is 0 ulp on the widened x
 * (x's own rounding is the caller's). Rows of 203, 517 and 1100 columns
 * leave tails in the backward's column blocks (256 columns, or 512 where
 * every thread still has one) and in the 16/8 lanes. */
TEST(bias_gelu_lp_equals_widened)
{
    const int64_t R = 4, Ns[3] = {203, 517, 1100};
    const dt_dtype dts[2] = {DT_BF16, DT_F16};
    for (int ni = 0; ni < 3; ni++)
        for (int di = 0; di < 2; di++) {
            const int64_t N = Ns[ni], M = R * N;
            const dt_dtype t = dts[di];
            float *x = malloc(M * 4), *xw = malloc(M * 4), *b = malloc(N * 4), *dy = malloc(M * 4);
            float *y[2], *dx[2], *db[2];
            uint16_t *xh = malloc(M * 2), *hh = malloc(M * 2);
            for (int k = 0; k < 2; k++) {
                y[k] = malloc(M * 4);
                dx[k] = malloc(M * 4);
                db[k] = malloc(N * 4);
            }
            fill(x, M, 11 + ni, 6.0f);
            fill(b, N, 12, 1.0f);
            fill(dy, M, 13, 1.0f); /* most values not representable in t: dx's rounding shows */
            const float special[] = {-0.0f, 0.0f, 60.0f, -60.0f, 200.0f, -200.0f, NAN, 1e-30f, -9.5f};
            for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
                x[5 + 17 * i] = special[i];
            ASSERT_OK(dt_k_convert(x, DT_F32, xh, t, M));
            ASSERT_OK(dt_k_convert(xh, t, xw, DT_F32, M));
            for (int k = 0; k <= NPATH; k++) {
                if (!set_path(k))
                    continue;
                /* [1]: widened, the f32 kernels, dx rounded */
                ASSERT_OK(dt_k_bias_gelu_fwd(xw, b, R, N, y[1], DT_K_GELU_TANH));
                ASSERT_OK(dt_k_bias_gelu_bwd(xw, b, dy, R, N, dx[1], db[1], DT_K_GELU_TANH));
                ASSERT_OK(dt_k_convert(dx[1], DT_F32, hh, t, M));
                ASSERT_OK(dt_k_convert(hh, t, dx[1], DT_F32, M));
                ASSERT_OK(dt_k_bias_gelu_fwd_lp(t, xh, b, R, N, y[0], DT_F32, DT_K_GELU_TANH));
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, dy, NULL, false, R, N, dx[0], NULL, db[0], DT_K_GELU_TANH));
                SAME_BITS(y[0], y[1], M, "bias gelu lp forward");
                SAME_BITS(dx[0], dx[1], M, "bias gelu lp backward dx");
                SAME_BITS(db[0], db[1], N, "bias gelu lp backward dbias");
                /* dx's rounded values in t too (the gradient's shadow) */
                uint16_t *dxl = malloc(M * 2);
                ASSERT(dxl != NULL);
                memset(dxl, 0xff, (size_t)M * 2);
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, dy, NULL, false, R, N, dx[0], dxl, db[0], DT_K_GELU_TANH));
                SAME_BITS(dx[0], dx[1], M, "bias gelu lp backward dx beside its shadow");
                ASSERT(!memcmp(dxl, hh, (size_t)M * 2));
                free(dxl);
                /* dbias alone, and dx in place over dy */
                memcpy(dx[0], dy, (size_t)M * 4);
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, dx[0], NULL, false, R, N, NULL, NULL, db[0], DT_K_GELU_TANH));
                SAME_BITS(db[0], db[1], N, "bias gelu lp backward dbias only");
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, dx[0], NULL, false, R, N, dx[0], NULL, NULL, DT_K_GELU_TANH));
                SAME_BITS(dx[0], dx[1], M, "bias gelu lp backward dx in place");
                /* a result of dtype t: y rounded by the kernel; its gradient
                 * dy rounded first (round_dy), then as above */
                uint16_t *yl = malloc(M * 2), *yr = malloc(M * 2);
                float *dyr = malloc(M * 4);
                ASSERT(yl && yr && dyr);
                ASSERT_OK(dt_k_bias_gelu_fwd_lp(t, xh, b, R, N, yl, t, DT_K_GELU_TANH));
                ASSERT_OK(dt_k_convert(y[1], DT_F32, yr, t, M));
                ASSERT(!memcmp(yl, yr, (size_t)M * 2));
                ASSERT_OK(dt_k_convert(dy, DT_F32, yr, t, M));
                ASSERT_OK(dt_k_convert(yr, t, dyr, DT_F32, M));
                ASSERT_OK(dt_k_bias_gelu_bwd(xw, b, dyr, R, N, dx[1], db[1], DT_K_GELU_TANH));
                ASSERT_OK(dt_k_convert(dx[1], DT_F32, hh, t, M));
                ASSERT_OK(dt_k_convert(hh, t, dx[1], DT_F32, M));
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, dy, NULL, true, R, N, dx[0], NULL, db[0], DT_K_GELU_TANH));
                SAME_BITS(dx[0], dx[1], M, "bias gelu lp backward dx, dy rounded");
                SAME_BITS(db[0], db[1], N, "bias gelu lp backward dbias, dy rounded");
                /* dy given as its t values (yr; dy not read): the same bits */
                ASSERT_OK(dt_k_bias_gelu_bwd_lp(t, xh, b, NULL, yr, true, R, N, dx[0], NULL, db[0],
                                                DT_K_GELU_TANH));
                SAME_BITS(dx[0], dx[1], M, "bias gelu lp backward dx, dy of t");
                SAME_BITS(db[0], db[1], N, "bias gelu lp backward dbias, dy of t");
                free(yl), free(yr), free(dyr);
            }
            ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
            ASSERT(isnan(y[0][5 + 17 * 6]));
            /* wrong dtype or approximation: errors, not results */
            ASSERT(dt_k_bias_gelu_fwd_lp(DT_F32, xh, b, R, N, y[0], DT_F32, DT_K_GELU_TANH) == DT_ERR_DTYPE);
            ASSERT(dt_k_bias_gelu_fwd_lp(t, xh, b, R, N, y[0], t == DT_BF16 ? DT_F16 : DT_BF16, DT_K_GELU_TANH) ==
                   DT_ERR_DTYPE);
            ASSERT(dt_k_bias_gelu_bwd_lp(t, xh, b, dy, NULL, false, R, N, dx[0], NULL, db[0], DT_K_GELU_ERF) ==
                   DT_ERR_INVALID_ARG);
            free(x), free(xw), free(b), free(dy), free(xh), free(hh);
            for (int k = 0; k < 2; k++)
                free(y[k]), free(dx[k]), free(db[k]);
        }
}

/* The bf16 residual stream's sum (dt_k_add2_lp) and its gradient's rounding
 * (dt_k_grad_round_lp, with and without the bf16 copy): the same bits on
 * every path, over two whole blocks of 2048 and a tail, with -0, NaN,
 * infinities, subnormals and values that round to the next binade. */
TEST(add_lp_paths_identical)
{
    const int64_t n = 2 * 2048 + 37;
    float *a = malloc(n * 4), *b = malloc(n * 4), *g = malloc(n * 4), *y[2], *s[2];
    uint16_t *ah = malloc(n * 2), *bh = malloc(n * 2), *yh[2], *gh[2];
    ASSERT(a && b && g && ah && bh);
    for (int k = 0; k < 2; k++) {
        y[k] = malloc(n * 4), s[k] = malloc(n * 4), yh[k] = malloc(n * 2), gh[k] = malloc(n * 2);
        ASSERT(y[k] && s[k] && yh[k] && gh[k]);
    }
    fill(a, n, 21, 4.0f);
    fill(b, n, 22, 4.0f);
    fill(g, n, 23, 1.0f);
    const float special[] = {-0.0f, 0.0f, NAN, INFINITY, -INFINITY, 1e-40f, -3e-39f, 3.3895e38f, 1.00390625f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
        a[3 + 131 * i] = special[i];
        g[5 + 97 * i] = special[i];
        g[2048 * 2 + 1 + i] = special[i]; /* in the tail */
    }
    ASSERT_OK(dt_k_convert(a, DT_F32, ah, DT_BF16, n));
    ASSERT_OK(dt_k_convert(b, DT_F32, bh, DT_BF16, n));
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_add2_lp(DT_BF16, ah, bh, yh[1], n));
    ASSERT_OK(dt_k_grad_round_lp(DT_BF16, g, s[1], gh[1], n));
    ASSERT_OK(dt_k_grad_round_lp(DT_BF16, g, y[1], NULL, n));
    ASSERT(!memcmp(s[1], y[1], (size_t)n * 4));
    for (int k = 0; k < NPATH; k++) {
        if (!set_path(k))
            continue;
        ASSERT_OK(dt_k_add2_lp(DT_BF16, ah, bh, yh[0], n));
        ASSERT(!memcmp(yh[0], yh[1], (size_t)n * 2));
        ASSERT_OK(dt_k_grad_round_lp(DT_BF16, g, s[0], gh[0], n));
        SAME_BITS(s[0], s[1], n, "gradient rounded to bf16");
        ASSERT(!memcmp(gh[0], gh[1], (size_t)n * 2));
        memcpy(y[0], g, (size_t)n * 4); /* in place, no copy */
        ASSERT_OK(dt_k_grad_round_lp(DT_BF16, y[0], y[0], NULL, n));
        SAME_BITS(y[0], s[1], n, "gradient rounded to bf16 in place");
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(a), free(b), free(g), free(ah), free(bh);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(s[k]), free(yh[k]), free(gh[k]);
}

TEST(xent_paths_identical)
{
    const int64_t R = 4, V = 5003; /* three chunks, the last 907 wide: 56 x 16, 8 and a tail of 3 */
    float *lg = malloc(R * V * 4), *g[2];
    float loss[2];
    int64_t lab[4] = {5002, 0, DT_K_IGNORE_INDEX, 2500};
    fill(lg, R * V, 9, 8.0f);
    lg[4600] = 40.0f;        /* row 0: the max in the last chunk */
    lg[V + 1] = -90.0f;      /* exponentials that underflow to 0 */
    lg[3 * V + 17] = 95.0f;  /* x - max reaches -100 in the rest of row 3 */
    g[0] = malloc(R * V * 4);
    g[1] = malloc(R * V * 4);
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_softmax_xent_fwd(lg, lab, DT_I64, R, V, &loss[1], NULL));
    ASSERT_OK(dt_k_softmax_xent_bwd(lg, NULL, lab, DT_I64, R, V, 1.5f, g[1]));
    for (int k = 0; k < NPATH; k++) {
        if (!set_path(k))
            continue;
        ASSERT_OK(dt_k_softmax_xent_fwd(lg, lab, DT_I64, R, V, &loss[0], NULL));
        ASSERT_OK(dt_k_softmax_xent_bwd(lg, NULL, lab, DT_I64, R, V, 1.5f, g[0]));
        SAME_BITS(&loss[0], &loss[1], 1, "cross-entropy loss");
        SAME_BITS(g[0], g[1], R * V, "cross-entropy gradient");
    }
    /* the backward from the forward's row log-sum-exps: the same bits on
     * every path as recomputing them (the ignored row's lse is not read) */
    for (int k = 0; k <= NPATH; k++) {
        if (!set_path(k))
            continue;
        float lse[4] = {0, 0, NAN, 0};
        ASSERT_OK(dt_k_softmax_xent_fwd_lse(lg, lab, DT_I64, R, V, &loss[0], lse));
        SAME_BITS(&loss[0], &loss[1], 1, "cross-entropy loss keeping the lse");
        ASSERT(isfinite(lse[2]) && lse[0] >= 40.0f); /* every row's, ignored ones too; row 0's max is 40 */
        lse[2] = NAN;
        ASSERT_OK(dt_k_softmax_xent_bwd_lse(lg, lse, lab, DT_I64, R, V, 1.5f, g[0]));
        SAME_BITS(g[0], g[1], R * V, "cross-entropy gradient from the saved lse");
        ASSERT_STATUS(dt_k_softmax_xent_bwd_lse(lg, NULL, lab, DT_I64, R, V, 1.5f, g[0]), DT_ERR_NULL);
        ASSERT_STATUS(dt_k_softmax_xent_fwd_lse(lg, lab, DT_I64, R, V, &loss[0], NULL), DT_ERR_NULL);
    }
    /* A row whose loss is log(1 + s), s ~ 1.5e-3 the sum of 5002 small
     * exponentials: the loss's bits show the order of that sum (a loss near
     * 10, as above, rounds a change of s's last bit away). */
    float *one = malloc(V * 4), l1[2];
    int64_t lab1 = 0;
    fill(one, V, 11, 1.0f);
    for (int64_t j = 0; j < V; j++)
        one[j] = -15.0f + one[j];
    one[0] = 0.0f;
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_softmax_xent_fwd(one, &lab1, DT_I64, 1, V, &l1[1], NULL));
    ASSERT(l1[1] > 1e-4f && l1[1] < 1e-2f);
    for (int k = 0; k < NPATH; k++) {
        if (!set_path(k))
            continue;
        ASSERT_OK(dt_k_softmax_xent_fwd(one, &lab1, DT_I64, 1, V, &l1[0], NULL));
        SAME_BITS(&l1[0], &l1[1], 1, "cross-entropy loss of a small-sum row");
    }
    free(one);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
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
    ASSERT_NEAR(loss[1], tot / 3, 0, 1e-5);
    free(lg), free(g[0]), free(g[1]);
}

/* Column sums (bias gradients): dt_k_sum_rows_acc on every path gives the
 * serial loop's bits (computed here), and dt_k_sum_rows_acc_lp over bf16 /
 * f16 rows those of dt_k_sum_rows_acc over the widened rows, on widths with
 * partial 16-lane groups and partial 128-column blocks (3, 16, 203, 517),
 * with -0, infinities and NaN in some columns. */
TEST(sum_rows_paths_identical)
{
    const int64_t R = 37, Ns[4] = {3, 16, 203, 517};
    const dt_dtype dts[2] = {DT_BF16, DT_F16};
    for (int ni = 0; ni < 4; ni++) {
        const int64_t N = Ns[ni], M = R * N;
        float *x = malloc(M * 4), *xw = malloc(M * 4), *ref = malloc(N * 4), *y = malloc(N * 4), *y0 = malloc(N * 4);
        uint16_t *xh = malloc(M * 2);
        fill(x, M, 41 + ni, 3.0f);
        fill(y0, N, 51 + ni, 1.0f);
        const float special[] = {-0.0f, INFINITY, -INFINITY, NAN, 1e-39f, 3e38f};
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
            x[(7 * (int64_t)i * N + 11 * (int64_t)i) % M] = special[i];
        for (int di = 0; di <= 2; di++) { /* 2: f32 */
            const dt_dtype t = di < 2 ? dts[di] : DT_F32;
            if (t != DT_F32) {
                ASSERT_OK(dt_k_convert(x, DT_F32, xh, t, M));
                ASSERT_OK(dt_k_convert(xh, t, xw, DT_F32, M));
            } else {
                memcpy(xw, x, M * 4);
            }
            for (int64_t j = 0; j < N; j++) { /* the serial loop */
                float a = y0[j];
                for (int64_t r = 0; r < R; r++)
                    a += xw[r * N + j];
                ref[j] = a;
            }
            for (int k = 0; k <= NPATH; k++) {
                if (!set_path(k))
                    continue;
                memcpy(y, y0, N * 4);
                ASSERT_OK(dt_k_sum_rows_acc(xw, R, N, y));
                SAME_BITS(y, ref, N, "column sums");
                if (t == DT_F32)
                    continue;
                memcpy(y, y0, N * 4);
                ASSERT_OK(dt_k_sum_rows_acc_lp(t, xh, R, N, y));
                SAME_BITS(y, ref, N, "column sums of low-precision rows");
            }
            ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
        }
        ASSERT_STATUS(dt_k_sum_rows_acc_lp(DT_F32, x, R, N, y), DT_ERR_DTYPE);
        ASSERT_STATUS(dt_k_sum_rows_acc_lp(DT_BF16, NULL, R, N, y), DT_ERR_NULL);
        free(x), free(xw), free(ref), free(y), free(y0), free(xh);
    }
}

/* The cross-entropy over bf16/f16 logits (dt_k_softmax_xent_fwd_lp /
 * _bwd_lp: rows widened chunk by chunk in cache) gives, on every path, the
 * bits of the f32 kernels on the widened logits with the gradient rounded
 * to the logits' dtype by dt_k_convert: the loss, each row's log-sum-exp,
 * the rounded gradient and its f32 copy; with the lse recomputed (NULL), in
 * place over the logits, and with the label in each chunk (V = 5003: chunks
 * of 2048, 2048 and 907) and an ignored row. */
TEST(xent_lp_equals_widened)
{
    const int64_t R = 5, V = 5003, M = R * V;
    const dt_dtype dts[2] = {DT_BF16, DT_F16};
    int64_t lab[5] = {5002, 0, DT_K_IGNORE_INDEX, 2500, 2047};
    float *x = malloc(M * 4), *xw = malloc(M * 4), *gref = malloc(M * 4), *g = malloc(M * 4);
    uint16_t *xh = malloc(M * 2), *href = malloc(M * 2), *h = malloc(M * 2);
    for (int di = 0; di < 2; di++) {
        const dt_dtype t = dts[di];
        fill(x, M, 21 + di, 8.0f);
        x[4600] = 40.0f;           /* row 0: the max in the last chunk */
        x[V + 1] = -90.0f;         /* exponentials that underflow to 0 */
        x[3 * V + 17] = 60.0f;     /* row 3: gradients far below the smallest normal */
        x[4 * V + 9] = -0.0f;
        x[4 * V + 10] = 1e-30f;    /* subnormal in f16, a normal bf16 */
        ASSERT_OK(dt_k_convert(x, DT_F32, xh, t, M));
        ASSERT_OK(dt_k_convert(xh, t, xw, DT_F32, M));
        for (int k = 0; k <= NPATH; k++) {
            if (!set_path(k))
                continue;
            float lref, l, lse_ref[5], lse[5] = {0};
            ASSERT_OK(dt_k_softmax_xent_fwd_lse(xw, lab, DT_I64, R, V, &lref, lse_ref));
            ASSERT_OK(dt_k_softmax_xent_bwd_lse(xw, lse_ref, lab, DT_I64, R, V, 1.5f, gref));
            ASSERT_OK(dt_k_convert(gref, DT_F32, href, t, M));
            ASSERT_OK(dt_k_convert(href, t, gref, DT_F32, M));
            ASSERT_OK(dt_k_softmax_xent_fwd_lp(t, xh, lab, DT_I64, R, V, &l, lse));
            SAME_BITS(&l, &lref, 1, "lp cross-entropy loss");
            SAME_BITS(lse, lse_ref, R, "lp cross-entropy log-sum-exps");
            ASSERT_OK(dt_k_softmax_xent_fwd_lp(t, xh, lab, DT_I64, R, V, &l, NULL));
            SAME_BITS(&l, &lref, 1, "lp cross-entropy loss without lse");
            memset(g, 0x7f, M * 4);
            ASSERT_OK(dt_k_softmax_xent_bwd_lp(t, xh, lse, lab, DT_I64, R, V, 1.5f, g, h));
            ASSERT(memcmp(h, href, M * 2) == 0);
            SAME_BITS(g, gref, M, "lp cross-entropy gradient (f32 copy)");
            /* lse recomputed, no f32 copy, in place over the logits */
            memcpy(h, xh, M * 2);
            ASSERT_OK(dt_k_softmax_xent_bwd_lp(t, h, NULL, lab, DT_I64, R, V, 1.5f, NULL, h));
            ASSERT(memcmp(h, href, M * 2) == 0);
        }
        ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
        /* the rounded gradient is not all zeros where it should not be */
        int nz = 0;
        for (int64_t j = V; j < 2 * V; j++) /* row 1: no dominant logit */
            nz += href[j] != 0;
        ASSERT(nz > V / 2);
        for (int64_t j = 2 * V; j < 3 * V; j++) /* the ignored row: +0 */
            ASSERT(href[j] == 0);
    }
    float l;
    ASSERT_STATUS(dt_k_softmax_xent_fwd_lp(DT_F32, x, lab, DT_I64, R, V, &l, NULL), DT_ERR_DTYPE);
    ASSERT_STATUS(dt_k_softmax_xent_bwd_lp(DT_I32, xh, NULL, lab, DT_I64, R, V, 1.0f, g, h), DT_ERR_DTYPE);
    ASSERT_STATUS(dt_k_softmax_xent_bwd_lp(DT_BF16, xh, NULL, lab, DT_I64, R, V, 1.0f, g, NULL), DT_ERR_NULL);
    lab[1] = V; /* out of range: named, not read */
    ASSERT_STATUS(dt_k_softmax_xent_fwd_lp(DT_BF16, xh, lab, DT_I64, R, V, &l, NULL), DT_ERR_RANGE);
    ASSERT_STATUS(dt_k_softmax_xent_bwd_lp(DT_BF16, xh, NULL, lab, DT_I64, R, V, 1.0f, g, h), DT_ERR_RANGE);
    free(x), free(xw), free(gref), free(g), free(xh), free(href), free(h);
}

/* Attention forward and backward (rows_acc: the scores along keys and the
 * updates along D) on head sizes whose columns take every block width of
 * the 16-lane loop (200 = 128 + 64 + 8, 72 = 64 + 8, 40 = 32 + 8, 19 = 16 +
 * 3) and a T that leaves a partial key block, causal and not, with dropout. */
TEST(attention_paths_identical)
{
    const int64_t B = 2, T = 75, H = 2, Ds[] = {200, 72, 40, 19};
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++) {
        const int64_t D = Ds[di], C = H * D, nq = B * T * 3 * C, ny = B * T * C, nl = B * H * T;
        float *qkv = malloc(nq * 4), *dy = malloc(ny * 4), *y[2], *lse[2], *dq[2];
        for (int k = 0; k < 2; k++)
            y[k] = malloc(ny * 4), lse[k] = malloc(nl * 4), dq[k] = malloc(nq * 4);
        fill(qkv, nq, 20 + di, 2.0f);
        fill(dy, ny, 30 + di, 1.0f);
        for (int causal = 0; causal < 2; causal++) {
            const float p = causal ? 0.0f : 0.25f;
            dt_rng_key key = dt_rng_key_make(7, DT_RNG_USER, 1, 2);
            ASSERT(set_path(NPATH));
            ASSERT_OK(dt_k_attention_fwd(qkv, B, T, H, D, causal, p, key, y[1], lse[1]));
            ASSERT_OK(dt_k_attention_bwd(qkv, y[1], lse[1], dy, B, T, H, D, causal, p, key, dq[1]));
            for (int k = 0; k < NPATH; k++) {
                if (!set_path(k))
                    continue;
                ASSERT_OK(dt_k_attention_fwd(qkv, B, T, H, D, causal, p, key, y[0], lse[0]));
                ASSERT_OK(dt_k_attention_bwd(qkv, y[1], lse[1], dy, B, T, H, D, causal, p, key, dq[0]));
                SAME_BITS(y[0], y[1], ny, "attention output");
                SAME_BITS(lse[0], lse[1], nl, "attention log-sum-exp");
                SAME_BITS(dq[0], dq[1], nq, "attention dqkv");
            }
        }
        ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
        free(qkv), free(dy);
        for (int k = 0; k < 2; k++)
            free(y[k]), free(lse[k]), free(dq[k]);
    }
}

/* SwiGLU (dt__expf16 / dt__expf8 rows against dt__expf): forward and
 * backward on every path give the scalar loop's bits, as do the
 * low-precision entry points (bf16 and f16), which must also equal the chain
 * they replace: widen, the f32 kernel, round (forward); dy rounded, the f32
 * backward, both gradients rounded (backward). The f32 forward stays within
 * 4e-7 relative of a double reference. */
/* NaNs made one NaN (their sign bit depends on the operand order a
 * compiler picks for a commutative multiply). */
static void one_nan(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (isnan(x[i]))
            x[i] = NAN;
}

TEST(swiglu_paths_identical)
{
    const int64_t n = 2048 * 2 + 203; /* two whole blocks, then 12 x 16 lanes, 8 and 3 */
    float *g = malloc(n * 4), *u = malloc(n * 4), *dy = malloc(n * 4), *y[2], *dg[2], *du[2];
    uint16_t *gh = malloc(n * 2), *uh = malloc(n * 2), *yh[2];
    for (int k = 0; k < 2; k++)
        y[k] = malloc(n * 4), dg[k] = malloc(n * 4), du[k] = malloc(n * 4), yh[k] = malloc(n * 2);
    fill(g, n, 11, 12.0f);
    fill(u, n, 12, 2.0f);
    fill(dy, n, 13, 1.0f);
    const float special[] = {-0.0f, 0.0f, 60.0f, -60.0f, 200.0f, -200.0f, 3e38f, -3e38f, NAN, 1e-30f, -9.5f, 88.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        g[5 + 17 * i] = special[i];
    /* NaNs and values that round to bf16 infinity among the ups and the
     * output gradients too, in other 16-lane groups than the gates' */
    u[2100] = NAN, u[2101] = 3.3e38f, dy[2200] = -NAN, dy[2203] = 3.4e38f, dy[2205] = 1e-40f;
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_swiglu_fwd(g, u, n, y[1]));
    ASSERT_OK(dt_k_swiglu_bwd(g, u, dy, n, dg[1], du[1]));
    one_nan(y[1], n), one_nan(dg[1], n), one_nan(du[1], n);
    for (int64_t i = 0; i < n; i++) { /* the f32 reference */
        double gd = g[i], want = gd / (1.0 + exp(-gd)) * (double)u[i];
        if (isfinite(want) && !(fabs(y[1][i] - want) <= 4e-7 * fabs(want) + 1e-37))
            TEST_FAIL_("swiglu element %lld: %.9g, double reference %.9g", (long long)i, (double)y[1][i], want);
    }
    for (int k = 0; k <= NPATH; k++) {
        if (!set_path(k))
            continue;
        if (k < NPATH) {
            ASSERT_OK(dt_k_swiglu_fwd(g, u, n, y[0]));
            ASSERT_OK(dt_k_swiglu_bwd(g, u, dy, n, dg[0], du[0]));
            one_nan(y[0], n), one_nan(dg[0], n), one_nan(du[0], n);
            SAME_BITS(y[0], y[1], n, "swiglu forward");
            SAME_BITS(dg[0], dg[1], n, "swiglu backward dg");
            SAME_BITS(du[0], du[1], n, "swiglu backward du");
            ASSERT_OK(dt_k_swiglu_bwd(g, u, dy, n, NULL, du[0]));
            one_nan(du[0], n);
            SAME_BITS(du[0], du[1], n, "swiglu backward du alone");
        }
        for (int lp = 0; lp < 2; lp++) { /* the low-precision kernels against the chain */
            dt_dtype t = lp ? DT_F16 : DT_BF16;
            float *gw = malloc(n * 4), *uw = malloc(n * 4), *dr = malloc(n * 4);
            uint16_t *tmp = malloc(n * 2);
            ASSERT_OK(dt_k_convert(g, DT_F32, gh, t, n));
            ASSERT_OK(dt_k_convert(u, DT_F32, uh, t, n));
            ASSERT_OK(dt_k_convert(gh, t, gw, DT_F32, n));
            ASSERT_OK(dt_k_convert(uh, t, uw, DT_F32, n));
            ASSERT_OK(dt_k_swiglu_fwd(gw, uw, n, y[0]));
            ASSERT_OK(dt_k_convert(y[0], DT_F32, yh[1], t, n));
            ASSERT_OK(dt_k_swiglu_fwd_lp(gh, uh, t, n, yh[0]));
            if (memcmp(yh[0], yh[1], (size_t)n * 2))
                TEST_FAIL_("%s: swiglu_fwd_lp differs from the chain on path %s", dt_dtype_name(t),
                           dt_k_isa_name(dt_k_get_isa()));
            ASSERT_OK(dt_k_convert(dy, DT_F32, tmp, t, n));
            ASSERT_OK(dt_k_convert(tmp, t, dr, DT_F32, n));
            ASSERT_OK(dt_k_swiglu_bwd(gw, uw, dr, n, dg[0], du[0]));
            for (int j = 0; j < 2; j++) {
                ASSERT_OK(dt_k_convert(j ? du[0] : dg[0], DT_F32, tmp, t, n));
                ASSERT_OK(dt_k_convert(tmp, t, j ? du[0] : dg[0], DT_F32, n));
            }
            float *dgl = malloc(n * 4), *dul = malloc(n * 4);
            ASSERT_OK(dt_k_swiglu_bwd_lp(gh, uh, t, dy, n, dgl, dul, NULL, NULL));
            SAME_BITS(dgl, dg[0], n, "swiglu_bwd_lp dg against the chain");
            SAME_BITS(dul, du[0], n, "swiglu_bwd_lp du against the chain");
            uint16_t *dgh = malloc(n * 2), *duh = malloc(n * 2); /* the t copies: dg / du's bits */
            ASSERT_OK(dt_k_swiglu_bwd_lp(gh, uh, t, dy, n, dgl, dul, dgh, duh));
            SAME_BITS(dgl, dg[0], n, "swiglu_bwd_lp dg (with its t copy) against the chain");
            SAME_BITS(dul, du[0], n, "swiglu_bwd_lp du (with its t copy) against the chain");
            ASSERT_OK(dt_k_convert(dg[0], DT_F32, tmp, t, n));
            ASSERT(!memcmp(dgh, tmp, (size_t)n * 2));
            ASSERT_OK(dt_k_convert(du[0], DT_F32, tmp, t, n));
            ASSERT(!memcmp(duh, tmp, (size_t)n * 2));
            ASSERT_OK(dt_k_swiglu_bwd_lp(gh, uh, t, dy, n, NULL, dul, NULL, duh)); /* du alone */
            SAME_BITS(dul, du[0], n, "swiglu_bwd_lp du alone against the chain");
            ASSERT(!memcmp(duh, tmp, (size_t)n * 2));
            free(dgh), free(duh);
            ASSERT_STATUS(dt_k_swiglu_fwd_lp(gh, uh, DT_F32, n, yh[0]), DT_ERR_UNSUPPORTED);
            free(gw), free(uw), free(dr), free(tmp), free(dgl), free(dul);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(g), free(u), free(dy), free(gh), free(uh);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dg[k]), free(du[k]), free(yh[k]);
}

/* RoPE on bf16/f16 rows: dt_k_rope_lp and dt_k_rope_bwd_lp (t copy and f32
 * copy, f32 copy alone) equal widen + dt_k_rope + round on every path, at
 * head sizes 64 (the avx512 bf16 rows: 16 pairs at a time) and 40 (20
 * pairs: a tail of 4), with NaN pairs (both halves NaN), lone NaNs,
 * infinities, values that round to infinity, subnormals and -0; rotary
 * widths below the head size (partial rotary: the rest passes, rounded
 * once for a gradient), and rows wider than one conversion (the head by
 * head branch). */
static void rope_case(int64_t hd, int64_t rot)
{
    enum { B = 2, T = 3, H = 5 };
    const int64_t n = B * T * H * hd, half = rot / 2;
    float *x = malloc(n * 4), *cs = malloc(T * half * 4), *sn = malloc(T * half * 4), *w = malloc(n * 4),
          *ref = malloc(n * 4), *got = malloc(n * 4);
    uint16_t *xl = malloc(n * 2), *yl = malloc(n * 2), *rl = malloc(n * 2);
    ASSERT(x && cs && sn && w && ref && got && xl && yl && rl);
    fill(x, n, 21, 30.0f);
    for (int64_t i = 0; i < T * half; i++)
        cs[i] = cosf(0.37f * (float)i), sn[i] = sinf(0.37f * (float)i);
    const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 3.4e38f, -3.39e38f, 1e-40f, -0.0f, 0.0f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[3 + 7 * i] = special[i];
    x[hd + 2] = NAN, x[hd + 2 + half] = -NAN; /* a pair of NaNs */
    x[3 * hd + 5] = NAN, x[3 * hd + 5 + half] = 2.0f;
    for (int k = 0; k <= NPATH; k++) {
        if (!set_path(k))
            continue;
        for (int lp = 0; lp < 2; lp++) {
            dt_dtype t = lp ? DT_F16 : DT_BF16;
            /* forward: the t input widened, rotated, rounded */
            ASSERT_OK(dt_k_convert(x, DT_F32, xl, t, n));
            ASSERT_OK(dt_k_convert(xl, t, w, DT_F32, n));
            ASSERT_OK(dt_k_rope(w, B, T, H, hd, rot, cs, sn, false, ref));
            ASSERT_OK(dt_k_convert(ref, DT_F32, rl, t, n));
            ASSERT_OK(dt_k_rope_lp(xl, t, B, T, H, hd, rot, cs, sn, yl));
            if (memcmp(yl, rl, (size_t)n * 2))
                TEST_FAIL_("%s hd %lld rot %lld: rope_lp differs from the chain on path %s", dt_dtype_name(t),
                           (long long)hd, (long long)rot, dt_k_isa_name(dt_k_get_isa()));
            /* backward: the f32 gradient rounded, rotated back, rounded */
            ASSERT_OK(dt_k_convert(x, DT_F32, rl, t, n));
            ASSERT_OK(dt_k_convert(rl, t, w, DT_F32, n));
            ASSERT_OK(dt_k_rope(w, B, T, H, hd, rot, cs, sn, true, ref));
            ASSERT_OK(dt_k_convert(ref, DT_F32, rl, t, n));
            ASSERT_OK(dt_k_convert(rl, t, ref, DT_F32, n));
            ASSERT_OK(dt_k_rope_bwd_lp(x, t, B, T, H, hd, rot, cs, sn, got, NULL));
            SAME_BITS(got, ref, n, "rope_bwd_lp (f32 copy) against the chain");
            memset(got, 0, (size_t)n * 4);
            ASSERT_OK(dt_k_rope_bwd_lp(x, t, B, T, H, hd, rot, cs, sn, got, yl));
            SAME_BITS(got, ref, n, "rope_bwd_lp (both copies) against the chain");
            if (memcmp(yl, rl, (size_t)n * 2))
                TEST_FAIL_("%s hd %lld: rope_bwd_lp's t copy differs from the chain on path %s", dt_dtype_name(t),
                           (long long)hd, dt_k_isa_name(dt_k_get_isa()));
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(x), free(cs), free(sn), free(w), free(ref), free(got), free(xl), free(yl), free(rl);
}

TEST(rope_lp_paths_identical)
{
    rope_case(64, 64);
    rope_case(40, 40);
    rope_case(64, 48);
    rope_case(40, 24);
    rope_case(1024, 1024); /* H * hd past one row's conversion */
    rope_case(1024, 768);
}

/* RMSNorm (f32 and bf16/f16 rows): forward, rstd, dx and dw the same bits on
 * every path as on the scalar loops (a row's double sums run in 16 fixed
 * lanes on every path), on rows of 203 columns (12 x 16 lanes and a tail of
 * 11), 16, 5 (tail only) and 300 (over the dw work item of 256), with and
 * without a weight, a row of zeros and one of large magnitudes; the _lp
 * kernels equal widen + f32 kernel + round on each path; and rstd is the
 * exactly rounded 1/sqrt(mean(x^2) + eps) of a long double sum within one
 * ulp. */
static void rms_case(int64_t R, int64_t D, bool hw)
{
    const int64_t n = R * D;
    float *x = malloc(n * 4), *w = malloc(D * 4), *dy = malloc(n * 4), *y[2], *dx[2], *dw[2], *rs[2];
    for (int k = 0; k < 2; k++)
        y[k] = malloc(n * 4), dx[k] = malloc(n * 4), dw[k] = malloc(D * 4), rs[k] = malloc(R * 4);
    fill(x, n, 21, 3.0f);
    fill(w, D, 22, 1.5f);
    fill(dy, n, 23, 1.0f);
    if (R > 2) {
        memset(x + D, 0, (size_t)D * 4); /* rstd 1/sqrt(eps) */
        for (int64_t j = 0; j < D; j++)
            x[2 * D + j] *= 1e15f;
        x[3] = -0.0f;
    }
    const float *wp = hw ? w : NULL;
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_rmsnorm_fwd(x, R, D, wp, 1e-5f, y[1], rs[1]));
    ASSERT_OK(dt_k_rmsnorm_bwd(x, dy, R, D, wp, rs[1], dx[1], dw[1]));
    for (int64_t r = 0; r < R; r++) {
        long double s = 0;
        for (int64_t j = 0; j < D; j++)
            s += (long double)x[r * D + j] * x[r * D + j];
        float ms = (float)(s / D), want = 1.0f / sqrtf(ms + 1e-5f);
        if (fabsf(rs[1][r] - want) > 1.2e-7f * want)
            TEST_FAIL_("rmsnorm rstd of row %lld: %.9g, long double sum gives %.9g", (long long)r, (double)rs[1][r],
                       (double)want);
    }
    uint16_t *xh = malloc(n * 2), *yh[2];
    yh[0] = malloc(n * 2), yh[1] = malloc(n * 2);
    float *xw = malloc(n * 4), *dr = malloc(n * 4), *dxl = malloc(n * 4), *dwl = malloc(D * 4), *rsl = malloc(R * 4);
    for (int k = 0; k <= NPATH; k++) {
        if (!set_path(k))
            continue;
        if (k < NPATH) {
            ASSERT_OK(dt_k_rmsnorm_fwd(x, R, D, wp, 1e-5f, y[0], rs[0]));
            ASSERT_OK(dt_k_rmsnorm_bwd(x, dy, R, D, wp, rs[1], dx[0], dw[0]));
            SAME_BITS(y[0], y[1], n, "rmsnorm forward");
            SAME_BITS(rs[0], rs[1], R, "rmsnorm rstd");
            SAME_BITS(dx[0], dx[1], n, "rmsnorm dx");
            SAME_BITS(dw[0], dw[1], D, "rmsnorm dw");
        }
        for (int lp = 0; lp < 2; lp++) { /* the low-precision kernels against the chain on this path */
            const dt_dtype t = lp ? DT_F16 : DT_BF16;
            ASSERT_OK(dt_k_convert(x, DT_F32, xh, t, n));
            ASSERT_OK(dt_k_convert(xh, t, xw, DT_F32, n));
            ASSERT_OK(dt_k_rmsnorm_fwd(xw, R, D, wp, 1e-5f, y[0], rs[0]));
            ASSERT_OK(dt_k_convert(y[0], DT_F32, yh[1], t, n));
            ASSERT_OK(dt_k_rmsnorm_fwd_lp(xh, t, R, D, wp, 1e-5f, yh[0], rsl));
            if (memcmp(yh[0], yh[1], (size_t)n * 2))
                TEST_FAIL_("%s: rmsnorm_fwd_lp differs from the chain on path %s", dt_dtype_name(t),
                           dt_k_isa_name(dt_k_get_isa()));
            SAME_BITS(rsl, rs[0], R, "rmsnorm_fwd_lp rstd");
            ASSERT_OK(dt_k_convert(dy, DT_F32, yh[1], t, n));
            ASSERT_OK(dt_k_convert(yh[1], t, dr, DT_F32, n));
            ASSERT_OK(dt_k_rmsnorm_bwd(xw, dr, R, D, wp, rs[0], dx[0], dw[0]));
            ASSERT_OK(dt_k_convert(dx[0], DT_F32, yh[1], t, n));
            ASSERT_OK(dt_k_convert(yh[1], t, dx[0], DT_F32, n));
            ASSERT_OK(dt_k_rmsnorm_bwd_lp(xh, t, dy, R, D, wp, rs[0], dxl, dwl));
            SAME_BITS(dxl, dx[0], n, "rmsnorm_bwd_lp dx against the chain");
            SAME_BITS(dwl, dw[0], D, "rmsnorm_bwd_lp dw against the chain");
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(x), free(w), free(dy), free(xh), free(yh[0]), free(yh[1]), free(xw), free(dr), free(dxl), free(dwl);
    free(rsl);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(dx[k]), free(dw[k]), free(rs[k]);
}

TEST(rmsnorm_paths_identical)
{
    rms_case(4, 203, true);
    rms_case(4, 203, false);
    rms_case(3, 300, true);
    rms_case(2, 16, true);
    rms_case(2, 5, false);
}

/* Blocked 2x2 max pooling (the ConvNet's): values and argmax indices the
 * same on every path as on the scalar loop, in nChw8c and nChw16c, with
 * ties (the first in window order wins), -0 against 0, NaN (propagates,
 * the first NaN wins) and infinities. */
TEST(maxpool_blocked_paths_identical)
{
    const int64_t N = 2, C = 32, H = 10, W = 14, P = 5, Q = 7;
    const dt_k_pool2d_shape s = {N, C, H, W, 2, 2, 2, 2, 0, 0};
    float *x = malloc(N * C * H * W * 4), *y[2];
    int32_t *a[2];
    for (int k = 0; k < 2; k++) {
        y[k] = malloc(N * C * P * Q * 4);
        a[k] = malloc(N * C * P * Q * 4);
    }
    fill(x, N * C * H * W, 9, 3.0f);
    for (int64_t i = 0; i < N * C * H * W; i += 5) /* ties: coarse values */
        x[i] = (float)(int)x[i];
    const float special[] = {NAN, -0.0f, 0.0f, INFINITY, -INFINITY, NAN, 3e38f, -NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        for (int64_t j = (int64_t)i * 37; j < N * C * H * W; j += 301)
            x[j] = special[i];
    for (int B = 8; B <= 16; B += 8) {
        ASSERT(set_path(NPATH));
        ASSERT_OK(dt_k_maxpool2d_fwd_blocked(&s, B, x, y[1], a[1]));
        for (int k = 0; k < NPATH; k++) {
            if (!set_path(k))
                continue;
            memset(y[0], 0xff, (size_t)(N * C * P * Q) * 4);
            memset(a[0], 0xff, (size_t)(N * C * P * Q) * 4);
            ASSERT_OK(dt_k_maxpool2d_fwd_blocked(&s, B, x, y[0], a[0]));
            SAME_BITS(y[0], y[1], N * C * P * Q, B == 8 ? "max pool nChw8c" : "max pool nChw16c");
            for (int64_t i = 0; i < N * C * P * Q; i++)
                if (a[0][i] != a[1][i])
                    TEST_FAIL_("max pool nChw%dc: argmax %lld differs: %d (%s) vs %d (scalar)", B, (long long)i,
                               a[0][i], dt_k_isa_name(dt_k_get_isa()), a[1][i]);
        }
    }
    /* the scalar loop against the plain kernel (each block position holds
     * plane index h*W + w, the same in both layouts) */
    float *xb = malloc(N * C * H * W * 4), *yp = malloc(N * C * P * Q * 4), *yb = malloc(N * C * P * Q * 4);
    int32_t *ap = malloc(N * C * P * Q * 4);
    ASSERT(set_path(NPATH));
    ASSERT_OK(dt_k_maxpool2d_fwd(&s, x, yp, ap));
    ASSERT_OK(dt_k_to_blocked(x, N, C, H * W, 16, xb));
    ASSERT_OK(dt_k_maxpool2d_fwd_blocked(&s, 16, xb, y[1], a[1]));
    ASSERT_OK(dt_k_from_blocked(y[1], N, C, P * Q, 16, yb));
    SAME_BITS(yb, yp, N * C * P * Q, "max pool nChw16c against plain");
    ASSERT_OK(dt_k_from_blocked((float *)a[1], N, C, P * Q, 16, (float *)a[0])); /* a bit-exact reorder */
    ASSERT(memcmp(a[0], ap, (size_t)(N * C * P * Q) * 4) == 0);
    free(xb), free(yp), free(yb), free(ap), free(x);
    for (int k = 0; k < 2; k++)
        free(y[k]), free(a[k]);
}

int main(void)
{
    if (dt_k_get_isa() == DT_K_ISA_SCALAR)
        DT_TEST_SKIP_ALL("no AVX2 on this CPU (dt_k_get_isa() is scalar): only the scalar loops exist");
    RUN(expf_bound_and_lanes);
    RUN(bias_gelu_tanh_paths_identical);
    RUN(bias_gelu_bwd_blocks);
    RUN(bias_gelu_lp_equals_widened);
    RUN(add_lp_paths_identical);
    RUN(xent_paths_identical);
    RUN(xent_lp_equals_widened);
    RUN(sum_rows_paths_identical);
    RUN(attention_paths_identical);
    RUN(swiglu_paths_identical);
    RUN(rope_lp_paths_identical);
    RUN(rmsnorm_paths_identical);
    RUN(maxpool_blocked_paths_identical);
    for (int k = 0; k < NPATH; k++)
        printf("# path %s: %s\n", dt_k_isa_name(k_paths[k]), g_ran[k] ? "compared with scalar" : "not on this CPU");
    return TEST_REPORT();
}
