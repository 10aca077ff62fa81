// dt-test-timeout: 600
// dt-test-labels: threads;slow
/* dtrain's AMX bf16 GEMM (src/kernels/gemm_amx.c) on the portable model of
 * the tile instructions (amx_emul.c), so the driver's blocking, packing,
 * edge tiles, epilogue, packed-B cache and per-thread tile configuration
 * are tested on every CPU; with the argument "hw" the same shapes run on
 * the real instructions (skipped where the CPU, the OS or DT_MAX_CPU_ISA
 * leave AMX off; tests.cmake registers that run), and with "vdp" over
 * vdpbf16ps (amx_vdp.c: the tiles the attention uses on a CPU with
 * AVX512_BF16 but no AMX; skipped without it).
 *
 * The bound. Inputs are bf16; each product of two bf16 values is exact in
 * f32, so the only error is the f32 summation: K products summed one at a
 * time (tdpbf16ps adds a pair's two products in turn, each sum rounded),
 * then alpha, beta C and the bias, each rounded once. Against the sum in
 * double of the same bf16 products:
 *     |C - ref| <= (K + 3) u (|alpha| sum_k |a_ik b_kj| + |beta C_ij| + |bias_j|),  u = 2^-24
 * (the textbook bound of recursive summation; no input here is near the
 * denormal range, where the tiles flush to zero). With GELU after it the
 * bound grows by GELU's slope (at most 1.13, 1.2 taken) plus 1e-6 (1 + |y|)
 * for tanhf. On the model the result must moreover be bit-identical to a
 * scalar loop that adds the products in the tiles' order (k increasing,
 * pairs as tdpbf16ps adds them) and applies the epilogue in its order. */
#include "kernels/amx_tiles.h"
#include "kernels/gemm_amx.h"
#include "test.h"

#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const dt__amx_tiles *g_tiles; /* what the GEMM runs on: the model, or the hardware with "hw" */
static bool g_exact;                 /* bit-identical to the model's order expected (the model only) */

static _Thread_local uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static uint16_t *bf16_rand(int64_t n)
{
    uint16_t *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = dt_f32_to_bf16(urand());
    return p;
}

static float *f32_rand(int64_t n)
{
    float *p = malloc((size_t)(n ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = urand();
    return p;
}

static float bf(uint16_t h) { return dt_bf16_to_f32(h); }

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    bool bias, gelu;
} shape;

/* Run one case on g_tiles (B packed per call, pre-packed, or through the
 * cache with `version`); check against the references. Returns 0 if good. */
enum { VIA_CALL, VIA_PACKED, VIA_CACHE };
static int run_case(shape s, int via)
{
    int64_t arows = s.ta ? s.K : s.M, brows = s.tb ? s.N : s.K;
    if (!s.lda)
        s.lda = s.ta ? s.M : s.K;
    if (!s.ldb)
        s.ldb = s.tb ? s.K : s.N;
    if (!s.ldc)
        s.ldc = s.N;
    uint16_t *A = bf16_rand(arows * s.lda), *B = bf16_rand(brows * s.ldb);
    float *C0 = f32_rand(s.M * s.ldc), *C = malloc((size_t)(s.M * s.ldc + 1) * sizeof(float));
    float *bias = s.bias ? f32_rand(s.N) : NULL;
    memcpy(C, C0, (size_t)(s.M * s.ldc) * sizeof(float));
    if (s.beta == 0.0f) /* beta 0: C must not be read */
        for (int64_t i = 0; i < s.M * s.ldc; i++)
            C[i] = NAN;
    dt__amx_gemm_args g = {.ta = s.ta, .tb = s.tb, .M = s.M, .N = s.N, .K = s.K, .A = A, .lda = s.lda,
                           .B = B, .ldb = s.ldb, .alpha = s.alpha, .beta = s.beta, .C = C, .ldc = s.ldc,
                           .bias = bias, .act = s.gelu ? DT__AMX_ACT_GELU_TANH : DT__AMX_ACT_NONE};
    dt__amx_packed_b pb = {0};
    dt_status st;
    if (via == VIA_PACKED) {
        st = dt__amx_pack_b(&pb, s.tb, s.K, s.N, B, s.ldb);
        g.B = NULL;
        g.pb = &pb;
        if (st == DT_OK)
            st = dt__amx_gemm(g_tiles, &g);
    } else if (via == VIA_CACHE) {
        st = dt__amx_gemm_cached_b(g_tiles, &g, 1);
    } else {
        st = dt__amx_gemm(g_tiles, &g);
    }
    int bad = 0;
    if (st != DT_OK) {
        fprintf(stderr, "  gemm failed: %s\n", dt_last_error());
        bad = 1;
    }
    double worst = 0;
    for (int64_t i = 0; i < s.M && !bad; i++)
        for (int64_t j = 0; j < s.N; j++) {
            double sum = 0, mag = 0;
            float acc = 0.0f; /* the tiles' order */
            for (int64_t k = 0; k < s.K; k += 2) {
                uint16_t a0 = s.ta ? A[k * s.lda + i] : A[i * s.lda + k];
                uint16_t b0 = s.tb ? B[j * s.ldb + k] : B[k * s.ldb + j];
                uint16_t a1 = 0, b1 = 0;
                if (k + 1 < s.K) {
                    a1 = s.ta ? A[(k + 1) * s.lda + i] : A[i * s.lda + k + 1];
                    b1 = s.tb ? B[j * s.ldb + k + 1] : B[(k + 1) * s.ldb + j];
                }
                acc = dt__amx_emul_dp_pair(acc, a0, b0, a1, b1);
                sum += (double)bf(a0) * bf(b0) + (double)bf(a1) * bf(b1);
                mag += fabs((double)bf(a0) * bf(b0)) + fabs((double)bf(a1) * bf(b1));
            }
            float c0 = C0[i * s.ldc + j], bj = bias ? bias[j] : 0.0f;
            float e = s.alpha * acc;
            if (s.beta != 0.0f)
                e += s.beta * c0;
            if (bias)
                e += bj;
            double ref = s.alpha * sum + (s.beta != 0.0f ? (double)s.beta * c0 : 0.0) + bj;
            double bound = (double)(s.K + 3) * 0x1p-24 *
                           (fabs(s.alpha) * mag + fabs((double)s.beta * c0) + fabs((double)bj));
            float got = C[i * s.ldc + j];
            if (s.gelu) {
                ref = gelu_d(ref);
                bound = 1.2 * bound + 1e-6 * (1.0 + fabs(ref));
            }
            double err = fabs(got - ref);
            if (!(err <= bound)) {
                fprintf(stderr, "  C[%lld][%lld] = %.9g, reference %.9g, error %.3g > bound %.3g\n", (long long)i,
                        (long long)j, got, ref, err, bound);
                bad = 1;
                break;
            }
            if (bound > 0 && err / bound > worst)
                worst = err / bound;
            if (g_exact && !s.gelu && memcmp(&got, &e, 4) != 0) {
                fprintf(stderr, "  C[%lld][%lld] = %.9g, the tiles' order gives %.9g (not bit-identical)\n",
                        (long long)i, (long long)j, got, e);
                bad = 1;
                break;
            }
        }
    for (int64_t i = 0; i < s.M && !bad; i++) /* columns past N of a wider ldc untouched */
        for (int64_t j = s.N; j < s.ldc; j++)
            if (memcmp(&C[i * s.ldc + j], &C0[i * s.ldc + j], 4) != 0 && !(s.beta == 0.0f && isnan(C[i * s.ldc + j]))) {
                fprintf(stderr, "  C[%lld][%lld] beyond N was written\n", (long long)i, (long long)j);
                bad = 1;
                break;
            }
    if (bad)
        fprintf(stderr, "  case %s%s M=%lld N=%lld K=%lld lda=%lld ldb=%lld ldc=%lld alpha=%g beta=%g%s%s via %d\n",
                s.ta ? "A^T" : "A", s.tb ? "B^T" : "B", (long long)s.M, (long long)s.N, (long long)s.K,
                (long long)s.lda, (long long)s.ldb, (long long)s.ldc, s.alpha, s.beta, s.bias ? " bias" : "",
                s.gelu ? " gelu" : "", via);
    dt__amx_packed_b_free(&pb);
    free(A);
    free(B);
    free(C0);
    free(C);
    free(bias);
    return bad;
}

/* The shapes: tails in every dimension (1, odd, one past a tile, one short
 * of a block), whole blocks, and a GPT-2 layer's width. */
static const int64_t g_shapes[][3] = {
    {1, 1, 1},   {17, 33, 65}, {64, 64, 64}, {16, 16, 32}, {32, 32, 32}, {33, 17, 31}, {15, 47, 2},
    {31, 1, 100}, {1, 100, 1},  {48, 80, 96}, {2, 3, 33},   {47, 49, 63},
};

TEST(shapes_all_transposes)
{
    int fails = 0;
    for (size_t i = 0; i < sizeof g_shapes / sizeof g_shapes[0]; i++)
        for (int t = 0; t < 4; t++) {
            shape s = {.ta = t & 1, .tb = (t >> 1) & 1, .M = g_shapes[i][0], .N = g_shapes[i][1],
                       .K = g_shapes[i][2], .alpha = 1.0f};
            fails += run_case(s, VIA_CALL);
        }
    ASSERT_EQ_INT(fails, 0);
}

TEST(beta_alpha_bias_gelu)
{
    int fails = 0;
    for (size_t i = 0; i < sizeof g_shapes / sizeof g_shapes[0]; i++)
        for (int t = 0; t < 4; t++) {
            shape s = {.ta = t & 1, .tb = (t >> 1) & 1, .M = g_shapes[i][0], .N = g_shapes[i][1],
                       .K = g_shapes[i][2], .alpha = 1.0f, .beta = 1.0f};
            fails += run_case(s, VIA_CALL); /* gradient accumulation */
            s.alpha = 0.5f;
            s.beta = 0.25f;
            s.bias = true;
            fails += run_case(s, VIA_CALL);
            s.alpha = 1.0f;
            s.beta = 0.0f;
            s.gelu = true;
            fails += run_case(s, VIA_CALL); /* linear + bias + GELU */
        }
    ASSERT_EQ_INT(fails, 0);
}

TEST(leading_dimensions)
{
    /* sub-matrices: rows longer than the product uses, C columns past N kept */
    int fails = 0;
    for (int t = 0; t < 4; t++) {
        shape s = {.ta = t & 1, .tb = (t >> 1) & 1, .M = 37, .N = 41, .K = 45, .alpha = 1.0f,
                   .beta = (t & 1) ? 1.0f : 0.0f};
        s.lda = (s.ta ? s.M : s.K) + 7;
        s.ldb = (s.tb ? s.K : s.N) + 5;
        s.ldc = s.N + 3;
        fails += run_case(s, VIA_CALL);
    }
    ASSERT_EQ_INT(fails, 0);
}

TEST(gpt2_layer_shape)
{
    /* 100 rows through GPT-2's c_attn (768 -> 2304), forward and both
     * gradients; under the sanitizers (dt_test_reduced) 20 rows, the same
     * widths: one whole 16-row block and an edge, at a fifth of the cost */
    int fails = 0;
    const int64_t rows = dt_test_reduced() ? 20 : 100;
    shape fwd = {.tb = false, .M = rows, .N = 2304, .K = 768, .alpha = 1.0f, .bias = true};
    fails += run_case(fwd, VIA_CALL);
    shape dx = {.tb = true, .M = rows, .N = 768, .K = 2304, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(dx, VIA_CALL);
    shape dw = {.ta = true, .M = 768, .N = 2304, .K = rows, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(dw, VIA_CALL);
    ASSERT_EQ_INT(fails, 0);
}

/* K around the chunking: 24 steps with a partial last one (one chunk, its
 * last step from the K tail), 26 steps with a partial last one (a chunk of
 * 16, then 10 with the tail), 25 whole steps (16, then 9), each transpose,
 * accumulating into C. */
TEST(k_chunks)
{
    static const int64_t ks[] = {765, 805, 800};
    int fails = 0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int t = 0; t < 4; t++) {
            shape s = {.ta = t & 1, .tb = (t >> 1) & 1, .M = 33, .N = 47, .K = ks[i], .alpha = 1.0f, .beta = 1.0f};
            fails += run_case(s, VIA_CALL);
        }
    /* plain (beta 0) with 1024 rows or more: macro blocks of all the columns, two a thread */
    for (int t = 0; t < 2; t++) {
        shape p = {.tb = t, .M = 1030, .N = 40, .K = 805, .alpha = 1.0f, .beta = 0.0f};
        fails += run_case(p, VIA_CALL);
    }
    ASSERT_EQ_INT(fails, 0);
}

/* A^T with many rows and few columns: each macro block transposes its own
 * rows of A^T (a language model head's weight gradient), with and without
 * accumulating. */
TEST(a_private_rows)
{
    int fails = 0;
    for (int t = 0; t < 4; t++) {
        shape s = {.ta = true, .tb = t & 1, .M = 1100, .N = 40, .K = 70, .alpha = 1.0f, .beta = t & 2 ? 1.0f : 0.0f};
        fails += run_case(s, VIA_CALL);
    }
    ASSERT_EQ_INT(fails, 0);
}

/* B given as B^T with few rows (at most 512) and at least twice as many
 * columns: the driver computes the transpose (the weight read in place as
 * the A operand, A packed instead) and its epilogue writes it back
 * transposed. Edges in every dimension, K in chunks with a tail, beta,
 * alpha and a bias, a wider ldc; 512 x 1024 is the limit (transposed), 513
 * rows are not. */
TEST(few_rows_transposed)
{
    int fails = 0;
    shape s = {.tb = true, .M = 40, .N = 1000, .K = 805, .alpha = 1.0f};
    fails += run_case(s, VIA_CALL); /* beta 0: through the buffer, not through C */
    s.beta = 1.0f;
    fails += run_case(s, VIA_CALL);
    s.alpha = 0.5f, s.beta = 0.25f, s.bias = true, s.ldc = s.N + 3;
    fails += run_case(s, VIA_CALL);
    const int64_t k = dt_test_reduced() ? 32 : 70;
    shape lim = {.tb = true, .M = 512, .N = 1024, .K = k, .alpha = 1.0f, .beta = 1.0f, .bias = true};
    fails += run_case(lim, VIA_CALL);
    lim.M = 513;
    fails += run_case(lim, VIA_CALL);
    ASSERT_EQ_INT(fails, 0);
}

/* A^T B with K in chunks and more rows than columns (a weight gradient of
 * a layer with more inputs than outputs): the driver computes the
 * transpose, B^T A, and its epilogue writes it back transposed. Edges,
 * a partial last K step, beta, alpha, a bias, a wider ldc; 4096 rows is
 * the limit (transposed), 4097 are not (A^T in private rows). */
TEST(weight_gradient_transposed)
{
    int fails = 0;
    shape s = {.ta = true, .M = 300, .N = 100, .K = 805, .alpha = 1.0f};
    fails += run_case(s, VIA_CALL);
    s.alpha = 0.5f, s.beta = 0.25f, s.bias = true, s.ldc = s.N + 3;
    fails += run_case(s, VIA_CALL);
    const int64_t k = dt_test_reduced() ? 800 : 1030;
    shape lim = {.ta = true, .M = 4096, .N = 20, .K = k, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(lim, VIA_CALL);
    lim.M = 4097;
    fails += run_case(lim, VIA_CALL);
    ASSERT_EQ_INT(fails, 0);
}

/* A row-major B with few rows (at most 512), or with K in chunks: a macro
 * block spans all the rows and packs its own chunk of B's panels just
 * before the chunk's products. Column groups of several panels with an
 * edge, K in one chunk and in chunks, each with a partial last step,
 * alpha, beta, a bias, GELU, a wider ldc, a plain product (partial sums
 * through C), A^T, 600 rows with K in chunks, 1700 columns with K in
 * chunks (more panels than a macro block takes), and plain products of 520
 * rows with K in chunks (the longer chunks, with fewer panels when wide). */
TEST(b_chunks)
{
    int fails = 0;
    const int64_t m = dt_test_reduced() ? 40 : 200;
    shape s = {.M = m, .N = 1000, .K = 765, .alpha = 1.0f, .bias = true, .gelu = true};
    fails += run_case(s, VIA_CALL);
    s.K = 805, s.gelu = false, s.alpha = 0.5f, s.beta = 0.25f, s.ldc = s.N + 3;
    fails += run_case(s, VIA_CALL);
    shape p = {.M = m, .N = 300, .K = 1030, .alpha = 1.0f};
    fails += run_case(p, VIA_CALL);
    shape t = {.ta = true, .M = 100, .N = 200, .K = 805, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(t, VIA_CALL);
    shape r = {.M = 600, .N = 100, .K = 805, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(r, VIA_CALL);
    /* K in chunks over more than 24 panels a thread: a macro block's panels halved (the chunk of B in L2) */
    shape w = {.M = dt_test_reduced() ? 64 : 600, .N = 1700, .K = 805, .alpha = 1.0f, .beta = 1.0f};
    fails += run_case(w, VIA_CALL);
    /* a plain product of at least 512 rows with K in chunks (a language model head's input gradient):
     * chunks of KC_PLAIN steps, the last one a single step with the K tail; wider, its panels halved */
    shape h = {.M = 520, .N = dt_test_reduced() ? 64 : 300, .K = 1030, .alpha = 1.0f};
    fails += run_case(h, VIA_CALL);
    if (!dt_test_reduced()) {
        shape hw = {.M = 520, .N = 900, .K = 1030, .alpha = 1.0f};
        fails += run_case(hw, VIA_CALL);
    }
    ASSERT_EQ_INT(fails, 0);
}

TEST(k_zero_and_empty)
{
    /* K = 0: C = beta C + bias; M or N = 0: nothing written, no error */
    float C[6] = {1, 2, 3, 4, 5, 6}, bias[3] = {10, 20, 30};
    uint16_t a = 0, b = 0;
    dt__amx_gemm_args g = {.M = 2, .N = 3, .K = 0, .A = &a, .lda = 0, .B = &b, .ldb = 3, .alpha = 1.0f,
                           .beta = 1.0f, .C = C, .ldc = 3, .bias = bias};
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    ASSERT_NEAR(C[0], 11.0, 0.0, 0.0);
    ASSERT_NEAR(C[5], 36.0, 0.0, 0.0);
    g.M = 0;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    g.M = 2;
    g.ldc = 2; /* shorter than N */
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    g.ldc = 3;
    g.C = NULL;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_NULL);
}

TEST(packed_b_reused)
{
    /* one packing, many products: the same bits as packing per call */
    int fails = 0;
    for (int t = 0; t < 4; t++) {
        shape s = {.ta = t & 1, .tb = (t >> 1) & 1, .M = 45, .N = 70, .K = 77, .alpha = 1.0f, .beta = 1.0f};
        fails += run_case(s, VIA_PACKED);
    }
    uint16_t *B = bf16_rand(50 * 40), *A1 = bf16_rand(9 * 50), *A2 = bf16_rand(40 * 50);
    float *c1 = calloc(9 * 40, 4), *c2 = calloc(40 * 40, 4), *r1 = calloc(9 * 40, 4), *r2 = calloc(40 * 40, 4);
    dt__amx_packed_b pb = {0};
    ASSERT_EQ_INT(dt__amx_pack_b(&pb, false, 50, 40, B, 40), DT_OK);
    dt__amx_gemm_args g = {.M = 9, .N = 40, .K = 50, .A = A1, .lda = 50, .pb = &pb, .alpha = 1.0f, .C = c1,
                           .ldc = 40};
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    g.M = 40;
    g.A = A2;
    g.C = c2;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    g.pb = NULL;
    g.B = B;
    g.ldb = 40;
    g.C = r2;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    g.M = 9;
    g.A = A1;
    g.C = r1;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_OK);
    ASSERT(!memcmp(c1, r1, 9 * 40 * 4) && !memcmp(c2, r2, 40 * 40 * 4));
    g.pb = &pb; /* a packed B of another shape is refused */
    g.B = NULL;
    g.K = 49;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    dt__amx_packed_b_free(&pb);
    free(B), free(A1), free(A2), free(c1), free(c2), free(r1), free(r2);
    ASSERT_EQ_INT(fails, 0);
}

TEST(packed_b_cache_versions)
{
    enum { M = 20, N = 36, K = 40 };
    dt__amx_cache_clear();
    uint16_t *A = bf16_rand(M * K), *W = bf16_rand(N * K), *W0 = malloc(N * K * 2);
    memcpy(W0, W, N * K * 2);
    float *C = calloc(M * N, 4), *R = calloc(M * N, 4);
    dt__amx_gemm_args g = {.tb = true, .M = M, .N = N, .K = K, .A = A, .lda = K, .B = W, .ldb = K,
                           .alpha = 1.0f, .C = C, .ldc = N};
    dt__amx_gemm_args r = g;
    r.C = R;
    dt__amx_cache_stats s0, s1;
    dt__amx_cache_stats_get(&s0);
    ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 7), DT_OK); /* first use: packs */
    ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 7), DT_OK); /* same version: reused */
    dt__amx_cache_stats_get(&s1);
    ASSERT_EQ_INT((int)(s1.packs - s0.packs), 1);
    ASSERT_EQ_INT((int)(s1.hits - s0.hits), 1);
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &r), DT_OK);
    ASSERT(!memcmp(C, R, sizeof(float) * M * N));
    /* the weights change (an optimizer step) and the version moves on: repacked, new result */
    for (int i = 0; i < N * K; i++)
        W[i] = dt_f32_to_bf16(urand());
    ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 8), DT_OK);
    dt__amx_cache_stats_get(&s1);
    ASSERT_EQ_INT((int)(s1.packs - s0.packs), 2);
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &r), DT_OK);
    ASSERT(!memcmp(C, R, sizeof(float) * M * N));
    /* the contract: contents changed without a new version are not seen (the
     * cache never reads B to check), so the result is the old weights' */
    float *old = malloc(sizeof(float) * M * N);
    memcpy(old, C, sizeof(float) * M * N);
    memcpy(W, W0, N * K * 2);
    ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 8), DT_OK);
    ASSERT(!memcmp(C, old, sizeof(float) * M * N));
    /* another buffer (same shape) is its own entry */
    uint16_t *W2 = bf16_rand(N * K);
    g.B = W2;
    r.B = W2;
    ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 8), DT_OK);
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &r), DT_OK);
    ASSERT(!memcmp(C, R, sizeof(float) * M * N));
    dt__amx_cache_stats_get(&s1);
    ASSERT_EQ_INT((int)(s1.packs - s0.packs), 3);
    /* more weights than slots: the least recently used are evicted, results
     * stay right (a freed buffer's address may come back from malloc: each
     * new buffer gets a new version, as a step counter gives) */
    for (int i = 0; i < 70; i++) {
        uint16_t *w = bf16_rand(N * K);
        g.B = r.B = w;
        ASSERT_EQ_INT(dt__amx_gemm_cached_b(g_tiles, &g, 100 + (uint64_t)i), DT_OK);
        ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &r), DT_OK);
        int same = !memcmp(C, R, sizeof(float) * M * N);
        free(w);
        ASSERT(same);
    }
    dt__amx_cache_clear();
    free(A), free(W), free(W0), free(W2), free(C), free(R), free(old);
}

TEST(bf16_result)
{
    /* Cb: the same sums as the f32 result, rounded once as dt_f32_to_bf16
     * rounds, so bit-identical to rounding the f32 C of the same call (on the
     * model and on the hardware alike); edges, K tails, both transposes, a
     * bias with alpha 0.75 and with alpha 1, and a wider ldc whose extra
     * columns stay untouched; 70 x 300 x 100 with B^T and 300 x 100 x 805
     * with A^T B run transposed (few rows; K in chunks, more rows than
     * columns) */
    static const int64_t shp[][3] = {{1, 1, 1}, {17, 33, 65}, {33, 47, 31}, {64, 64, 64}, {70, 300, 100},
                                     {300, 100, 805}};
    int fails = 0;
    for (size_t i = 0; i < sizeof shp / sizeof shp[0]; i++)
        for (int t = 0; t < 16; t++) {
            bool ta = t & 1, tb = t & 2, extra = t & 4, alpha1 = t & 8; /* the bias with alpha 1 (cvt32's) */
            if (alpha1 && !extra)
                continue;
            int64_t M = shp[i][0], N = shp[i][1], K = shp[i][2], ldc = N + (extra ? 5 : 0);
            uint16_t *A = bf16_rand(M * K), *B = bf16_rand(K * N);
            uint16_t *Cb = aligned_alloc(64, ((size_t)(M * ldc) * 2 + 63) / 64 * 64);
            float *C = malloc((size_t)(M * ldc) * 4), *bias = extra ? f32_rand(N) : NULL;
            for (int64_t j = 0; j < M * ldc; j++)
                Cb[j] = 0x7fc1; /* a NaN pattern: columns past N must keep it */
            dt__amx_gemm_args g = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .A = A, .lda = ta ? M : K, .B = B,
                                   .ldb = tb ? K : N, .alpha = extra && !alpha1 ? 0.75f : 1.0f, .C = C,
                                   .ldc = ldc, .bias = bias};
            int bad = dt__amx_gemm(g_tiles, &g) != DT_OK;
            g.C = NULL;
            g.Cb = Cb;
            g.stream = t < 4; /* streaming stores where the rows allow them (Cb 64-byte aligned: 64 x 64) */
            bad |= dt__amx_gemm(g_tiles, &g) != DT_OK;
            for (int64_t r = 0; r < M && !bad; r++)
                for (int64_t c = 0; c < ldc && !bad; c++) {
                    uint16_t want = c < N ? dt_f32_to_bf16(C[r * ldc + c]) : 0x7fc1;
                    if (Cb[r * ldc + c] != want) {
                        fprintf(stderr, "  Cb[%lld][%lld] = %04x, want %04x (M=%lld N=%lld K=%lld t=%d)\n",
                                (long long)r, (long long)c, Cb[r * ldc + c], want, (long long)M, (long long)N,
                                (long long)K, t);
                        bad = 1;
                    }
                }
            fails += bad;
            free(A), free(B), free(Cb), free(C), free(bias);
        }
    /* refused: a bf16 result with beta != 0, or with C given too */
    uint16_t a = 0, b = 0, cb = 0;
    float c = 0;
    dt__amx_gemm_args g = {.M = 1, .N = 1, .K = 1, .A = &a, .lda = 1, .B = &b, .ldb = 1, .alpha = 1.0f,
                           .beta = 1.0f, .Cb = &cb, .ldc = 1};
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    g.beta = 0.0f;
    g.C = &c;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    ASSERT_EQ_INT(fails, 0);
}

/* A bf16 result's rounding at its edges: subnormal sums (the bias's; a
 * rounding by AVX512_BF16's vcvtne2ps2bf16 would read them as zero), NaNs
 * with payloads and signs (quieted, their top bits kept), infinities,
 * finite values that round to inf, ties to even, zero and the smallest
 * normal, in 32-column groups with and without a subnormal and in the
 * tail; with alpha 1 and 0.5, streamed and not: every value the bits of
 * dt_f32_to_bf16 of the same call's f32 result. */
static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

TEST(bf16_result_edges)
{
    const int64_t M = 40, N = 148, K = 64; /* four 32-column groups and a tail of 20 */
    const uint32_t special[] = {0x7f800001u, 0xffa12345u, 0x7fc00000u, 0x7f800000u, 0xff800000u, 0x7f7fc000u,
                                0x7f7f8000u, 0x3f808000u, 0x3f818000u, 0x80000000u, 0x00800000u, 0x3f800000u};
    const int ns = (int)(sizeof special / sizeof special[0]);
    uint16_t *A = bf16_rand(M * K), *B = calloc((size_t)(K * N), 2); /* B = 0: each sum is alpha 0 + bias */
    uint16_t *Cb = aligned_alloc(64, ((size_t)(M * N) * 2 + 63) / 64 * 64);
    float *C = malloc((size_t)(M * N) * 4), *bias = f32_rand(N);
    for (int64_t j = 0; j < N; j++)
        if (j % 32 < ns)
            bias[j] = f32_of(special[j % 32]);
    bias[40] = 1e-39f; /* subnormals in the second group and in the tail */
    bias[45] = -3e-40f;
    bias[140] = f32_of(0x00000001u);
    int fails = 0;
    for (int t = 0; t < 4; t++) {
        dt__amx_gemm_args g = {.M = M, .N = N, .K = K, .A = A, .lda = K, .B = B, .ldb = N,
                               .alpha = t & 1 ? 0.5f : 1.0f, .C = C, .ldc = N, .bias = bias};
        int bad = dt__amx_gemm(g_tiles, &g) != DT_OK;
        g.C = NULL;
        g.Cb = Cb;
        g.stream = (t & 2) != 0;
        bad |= dt__amx_gemm(g_tiles, &g) != DT_OK;
        for (int64_t i = 0; i < M * N && !bad; i++)
            if (Cb[i] != dt_f32_to_bf16(C[i])) {
                uint32_t u;
                memcpy(&u, &C[i], 4);
                fprintf(stderr, "  t=%d Cb[%lld][%lld] = %04x for %08x, want %04x\n", t, (long long)(i / N),
                        (long long)(i % N), Cb[i], (unsigned)u, dt_f32_to_bf16(C[i]));
                bad = 1;
            }
        fails += bad;
    }
    free(A), free(B), free(Cb), free(C), free(bias);
    ASSERT_EQ_INT(fails, 0);
}

/* A plain bf16 result (alpha 1, no beta, no bias) of whole 32-column
 * blocks: rounded 32 values at a time by vcvtne2ps2bf16 where the kernels
 * run their avx512_bf16 path, else by the integer formula; both give
 * dt_f32_to_bf16's bits of the same call's f32 result. The sums are made
 * exactly (one K step: each row adds three bf16 terms of its column): ties
 * to even both ways, the largest bf16 and a sum past it that rounds to
 * inf, a NaN from a NaN input, a zero, and random rows; with and without
 * streaming stores; the finite check false only with the inf or NaN
 * columns present. */
static uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

TEST(bf16_plain_rounding)
{
    enum { M = 48, N = 64, K = 32 };
    static const uint16_t terms[][3] = {
        {0x3f80, 0x3b80, 0},      /* 1 + 2^-8: a tie, to 0x3f80 (even) */
        {0x3f81, 0x3b80, 0},      /* 0x3f818000: a tie, to 0x3f82 */
        {0x3f80, 0x3b80, 0x3400}, /* 0x3f808001, past the tie: up */
        {0x7f7f, 0, 0},           /* the largest bf16 */
        {0x7f7f, 0x7b00, 0},      /* 0x7f7f8000: a tie at the top, to inf */
        {0x7fc1, 0, 0},           /* a NaN */
        {0x8000, 0, 0},           /* -0 x 1 added to the tile's +0: +0 */
    };
    const int nt = (int)(sizeof terms / sizeof terms[0]);
    const dt_k_isa isa0 = dt_k_get_isa();
    int fails = 0;
    for (int special = 0; special < 2; special++) /* with the inf and NaN columns, or only finite ones */
        for (int st = 0; st < 2; st++)
            for (int path = 0; path < 2; path++) { /* the CPU's path, then AVX-512's integer rounding */
                if (path && (isa0 != DT_K_ISA_AVX512_BF16 || dt_k_set_isa(DT_K_ISA_AVX512) != DT_OK))
                    continue;
                uint16_t *A = bf16_rand(M * K), *B = bf16_rand(K * N);
                uint16_t *Cb = aligned_alloc(64, (size_t)(M * N) * 2);
                float *C = malloc((size_t)(M * N) * 4);
                for (int64_t r = 0; r < M / 2; r++) /* the first half of the rows: 1, 1, 1, 0 ... */
                    for (int64_t k = 0; k < K; k++)
                        A[r * K + k] = k < 3 ? 0x3f80 : 0;
                for (int64_t j = 0; j < N; j++) {
                    int t = (int)(j % nt);
                    if (!special && (t == 4 || t == 5))
                        t = 0;
                    for (int64_t k = 0; k < 3; k++)
                        B[k * N + j] = terms[t][k];
                }
                dt__amx_gemm_args g = {.M = M, .N = N, .K = K, .A = A, .lda = K, .B = B, .ldb = N, .alpha = 1.0f,
                                       .C = C, .ldc = N};
                int bad = dt__amx_gemm(g_tiles, &g) != DT_OK;
                bool fin = true;
                g.C = NULL, g.Cb = Cb, g.stream = st, g.finite = &fin;
                bad |= dt__amx_gemm(g_tiles, &g) != DT_OK;
                for (int64_t i = 0; i < M * N && !bad; i++)
                    if (Cb[i] != dt_f32_to_bf16(C[i])) {
                        fprintf(stderr, "  [%lld][%lld]: %04x, want %04x (f32 %08x)\n", (long long)(i / N),
                                (long long)(i % N), Cb[i], dt_f32_to_bf16(C[i]), (unsigned)bits32(C[i]));
                        bad = 1;
                    }
                if (!bad) /* the exact sums' expected bits, row 0 */
                    bad = Cb[0] != 0x3f80 || Cb[1] != 0x3f82 || Cb[2] != 0x3f81 || Cb[3] != 0x7f7f ||
                          (special && (Cb[4] != 0x7f80 || (Cb[5] & 0x7fc0) != 0x7fc0)) || Cb[6] != 0;
                if (bad || fin != !special) {
                    fprintf(stderr, "  special %d stream %d path %d: finite %d, results %s\n", special, st, path,
                            (int)fin, bad ? "differ or failed" : "equal");
                    fails++;
                }
                free(A), free(B), free(Cb), free(C);
                if (path)
                    dt_k_set_isa(isa0);
            }
    ASSERT_EQ_INT(fails, 0);
}

TEST(finite_check)
{
    /* args.finite: the epilogue says whether every value it stored is
     * finite, for each way a result goes out: f32 (a plain product then
     * takes the epilogue too), bf16 (checked after rounding: a finite f32
     * sum past bf16's largest value rounds to inf), streaming stores, the
     * transposed product of a few rows (tb, N >= 2M), GELU (the scalar
     * epilogue) and beta C. Finite inputs: true, and the very bits of the
     * same call without the check. One output made inf or NaN (its row of
     * A scaled to overflow, or a NaN in beta's C), at the last row and
     * column so every edge mask counts: false. Columns past N of a wider
     * ldc hold NaN and are not the result's: they never count. */
    typedef struct {
        int64_t M, N, K;
        bool tb, bf16, stream, gelu, beta;
    } fc;
    static const fc cs[] = {
        {33, 47, 31, false, false, false, false, false}, {70, 300, 100, false, true, false, false, false},
        {64, 64, 64, false, true, true, false, false},  {40, 200, 64, true, true, false, false, false},
        {40, 200, 64, true, false, false, false, false}, {17, 33, 65, false, false, false, true, false},
        {17, 33, 65, false, true, false, true, false},  {33, 47, 31, false, false, false, false, true},
    };
    int fails = 0;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int poison = 0; poison < 2; poison++) {
            const fc c = cs[i];
            const int64_t M = c.M, N = c.N, K = c.K, ldc = N + 3;
            uint16_t *A = bf16_rand(M * K), *B = bf16_rand(K * N);
            uint16_t *Cb = aligned_alloc(64, ((size_t)(M * ldc) * 2 + 63) / 64 * 64),
                     *Cb2 = aligned_alloc(64, ((size_t)(M * ldc) * 2 + 63) / 64 * 64);
            float *C = malloc((size_t)(M * ldc) * 4), *C2 = malloc((size_t)(M * ldc) * 4);
            for (int64_t j = 0; j < M * ldc; j++) {
                C[j] = C2[j] = (j % ldc) < N ? 0.5f : NAN; /* beta's C, and NaN past N */
                Cb[j] = Cb2[j] = 0x7fc1;
            }
            if (poison && c.beta)
                C[M * ldc - 4] = C2[M * ldc - 4] = NAN; /* the last result's C */
            else if (poison) /* the last row of A: large enough that its sums overflow f32 */
                for (int64_t k = 0; k < K; k++)
                    A[(M - 1) * K + k] = dt_f32_to_bf16(1e37f * (k % 2 ? 3.0f : 2.5f));
            if (poison && !c.beta) /* and B's last column all positive: its sum overflows */
                for (int64_t k = 0; k < K; k++)
                    B[c.tb ? (N - 1) * K + k : k * N + N - 1] = dt_f32_to_bf16(40.0f);
            bool fin = !poison;
            dt__amx_gemm_args g = {.tb = c.tb, .M = M, .N = N, .K = K, .A = A, .lda = K, .B = B,
                                   .ldb = c.tb ? K : N, .alpha = 1.0f, .beta = c.beta ? 1.0f : 0.0f, .ldc = ldc,
                                   .act = c.gelu ? DT__AMX_ACT_GELU_TANH : DT__AMX_ACT_NONE,
                                   .stream = c.stream};
            if (c.bf16)
                g.Cb = Cb;
            else
                g.C = C;
            g.finite = &fin;
            int bad = dt__amx_gemm(g_tiles, &g) != DT_OK;
            g.finite = NULL; /* the same call unchecked */
            if (c.bf16)
                g.Cb = Cb2;
            else
                g.C = C2;
            bad |= dt__amx_gemm(g_tiles, &g) != DT_OK;
            bad |= c.bf16 ? memcmp(Cb, Cb2, (size_t)(M * ldc) * 2) != 0 : memcmp(C, C2, (size_t)(M * ldc) * 4) != 0;
            if (bad || fin != !poison) {
                fprintf(stderr, "  case %zu poison %d: finite %d, results %s\n", i, poison, (int)fin,
                        bad ? "differ or failed" : "equal");
                fails++;
            }
            free(A), free(B), free(Cb), free(Cb2), free(C), free(C2);
        }
    ASSERT_EQ_INT(fails, 0);
}

/* args.keep: the rows it keeps go in f32 to their rows of Ck, bit for bit
 * the same call's f32 result (alpha, bias and GELU applied), every other
 * row rounded into Cb as the bf16 result rounds it; a kept row's Cb and an
 * unkept row's Ck untouched. Shapes: edges and K tails, both transposes, a
 * weight gradient's A^T B with many rows (its rows of A^T private to the
 * macro blocks), A^T B with K in chunks and more rows than columns, and a
 * few rows against many columns of B^T (those two run transposed without
 * keep; with it they must not). The finite check covers both: a kept
 * row's overflow and an unkept one's each make it false. */
TEST(kept_rows)
{
    typedef struct {
        int64_t M, N, K;
        bool ta, tb, bias, gelu;
    } kc;
    static const kc cs[] = {
        {33, 47, 31, false, false, false, false}, {70, 300, 100, false, false, true, false},
        {17, 33, 65, false, false, true, true},   {1100, 64, 40, true, false, false, false},
        {300, 100, 805, true, false, false, false}, {40, 200, 64, false, true, false, false},
        {64, 64, 64, true, true, false, false},
    };
    int fails = 0;
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        for (int poison = 0; poison < 3; poison++) { /* none, a kept row, an unkept row */
            const kc c = cs[i];
            const int64_t M = c.M, N = c.N, K = c.K;
            uint16_t *A = bf16_rand(M * K), *B = bf16_rand(K * N);
            uint16_t *Cb = malloc((size_t)(M * N) * 2);
            float *C = malloc((size_t)(M * N) * 4), *Ck = malloc((size_t)(M * N) * 4);
            float *bias = c.bias ? f32_rand(N) : NULL;
            int32_t *keep = malloc((size_t)M * sizeof *keep);
            int64_t nk = 0;
            for (int64_t r = 0; r < M; r++)
                keep[r] = r % 3 == 1 || r == M - 1 ? (int32_t)nk++ : -1;
            for (int64_t r = 0; r < M; r++) /* kept rows in reverse order in Ck */
                if (keep[r] >= 0)
                    keep[r] = (int32_t)(nk - 1 - keep[r]);
            for (int64_t j = 0; j < M * N; j++)
                Cb[j] = 0x7fc1, Ck[j] = -7.0f;
            if (poison) { /* the row's sums overflow: row M - 1 is kept, row 0 is not */
                const int64_t r = poison == 1 ? M - 1 : 0;
                for (int64_t k = 0; k < K; k++) {
                    A[c.ta ? k * M + r : r * K + k] = dt_f32_to_bf16(1e37f * (k % 2 ? 3.0f : 2.5f));
                    B[c.tb ? k : k * N] = dt_f32_to_bf16(40.0f); /* and column 0 of B positive */
                }
            }
            dt__amx_gemm_args g = {.ta = c.ta, .tb = c.tb, .M = M, .N = N, .K = K, .A = A, .lda = c.ta ? M : K,
                                   .B = B, .ldb = c.tb ? K : N, .alpha = c.bias ? 0.75f : 1.0f, .C = C, .ldc = N,
                                   .bias = bias, .act = c.gelu ? DT__AMX_ACT_GELU_TANH : DT__AMX_ACT_NONE};
            int bad = dt__amx_gemm(g_tiles, &g) != DT_OK;
            bool fin = true;
            g.C = NULL, g.Cb = Cb, g.keep = keep, g.Ck = Ck, g.finite = &fin;
            bad |= dt__amx_gemm(g_tiles, &g) != DT_OK;
            for (int64_t r = 0; r < M && !bad; r++)
                for (int64_t j = 0; j < N && !bad; j++) {
                    const float want = C[r * N + j];
                    const bool ok = keep[r] >= 0 ? memcmp(&Ck[keep[r] * N + j], &want, 4) == 0 && Cb[r * N + j] == 0x7fc1
                                                 : Cb[r * N + j] == dt_f32_to_bf16(want);
                    if (!ok) {
                        fprintf(stderr, "  case %zu poison %d: row %lld (kept %d) column %lld differs\n", i, poison,
                                (long long)r, keep[r], (long long)j);
                        bad = 1;
                    }
                }
            for (int64_t j = nk * N; j < M * N && !bad; j++)
                bad = Ck[j] != -7.0f; /* past the kept rows: untouched */
            if (bad || fin != !poison) {
                fprintf(stderr, "  case %zu poison %d: finite %d, results %s\n", i, poison, (int)fin,
                        bad ? "differ or failed" : "equal");
                fails++;
            }
            free(A), free(B), free(Cb), free(C), free(Ck), free(bias), free(keep);
        }
    /* refused: keep without Cb, or without Ck */
    uint16_t a = 0, b = 0, cb = 0;
    float c = 0;
    int32_t k0 = 0;
    dt__amx_gemm_args g = {.M = 1, .N = 1, .K = 1, .A = &a, .lda = 1, .B = &b, .ldb = 1, .alpha = 1.0f, .C = &c,
                           .ldc = 1, .keep = &k0, .Ck = &c};
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    g.C = NULL, g.Cb = &cb, g.Ck = NULL;
    ASSERT_EQ_INT(dt__amx_gemm(g_tiles, &g), DT_ERR_INVALID_ARG);
    ASSERT_EQ_INT(fails, 0);
}

TEST(direct_a_strides)
{
    /* op(A) = A is read in place with its own row stride: odd leading
     * dimensions (rows not 4-byte aligned), K tails of every length in a
     * step, K of several chunks, M tails; and the transposed copy of A^T
     * with odd lda */
    static const int64_t ks[] = {1, 2, 31, 33, 63, 64, 95, 513, 600};
    int fails = 0;
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int t = 0; t < 2; t++) {
            shape s = {.ta = t, .M = 37 + (int64_t)i, .N = 40, .K = ks[i], .alpha = 1.0f};
            s.lda = (t ? s.M : s.K) + 1 + 2 * (int64_t)i; /* odd and even, never the row's length */
            fails += run_case(s, VIA_CALL);
            s.beta = 0.5f; /* through the sum buffer and the epilogue */
            s.bias = true;
            fails += run_case(s, VIA_PACKED);
        }
    /* A^T of more than 1024 rows and at most 1024 columns: each macro block
     * transposes its own rows into its thread's buffer (an LM head's weight
     * gradient); M tail, K tail, odd lda, plain and through the epilogue */
    shape w = {.ta = true, .M = 1100, .N = 70, .K = 45, .lda = 1103, .alpha = 1.0f};
    fails += run_case(w, VIA_CALL);
    w.beta = 1.0f;
    w.bias = true;
    w.K = 64;
    fails += run_case(w, VIA_PACKED);
    ASSERT_EQ_INT(fails, 0);
}

/* ---- tile configuration lifecycle ---------------------------------------------------- */

TEST(config_once_per_shape_and_released)
{
    dt_set_num_threads(1);
    dt__amx_emul_stats e0, e1;
    dt__amx_emul_stats_get(&e0);
    uint64_t faults0 = e0.faults;
    shape s = {.M = 64, .N = 64, .K = 64, .alpha = 1.0f}; /* 4 whole blocks: one configuration */
    ASSERT_EQ_INT(run_case(s, VIA_CALL), 0);
    dt__amx_emul_stats_get(&e1);
    ASSERT_EQ_INT((int)(e1.loads - e0.loads), 1);
    ASSERT(!dt__amx_thread_configured() && !dt__amx_emul_thread_configured());
    shape t = {.M = 33, .N = 33, .K = 8, .alpha = 1.0f}; /* 4 blocks, 4 shapes: whole, N tail, M tail, both */
    ASSERT_EQ_INT(run_case(t, VIA_CALL), 0);
    dt__amx_emul_stats_get(&e0);
    ASSERT_EQ_INT((int)(e0.loads - e1.loads), 4);
    ASSERT_EQ_INT((int)e0.live, 0);
    ASSERT_EQ_INT((int)(e0.faults - faults0), 0);
    dt_set_num_threads(0);
}

static long ncpu(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

TEST(more_threads_than_cores)
{
    /* the kernels' threads: many more than cores, each configures and releases */
    int nt = (int)(2 * ncpu() + 3);
    dt_set_num_threads(nt);
    dt__amx_emul_stats e0, e1;
    dt__amx_emul_stats_get(&e0);
    shape s = {.M = 200, .N = 130, .K = 70, .alpha = 1.0f, .beta = 1.0f, .bias = true};
    ASSERT_EQ_INT(run_case(s, VIA_CALL), 0);
    ASSERT(!dt__amx_thread_configured()); /* the caller's thread released its tiles */
    if (g_tiles == dt__amx_tiles_emul()) { /* the model counts every thread's configurations */
        dt__amx_emul_stats_get(&e1);
        ASSERT(e1.loads - e0.loads >= 2); /* several threads configured */
        ASSERT_EQ_INT((int)e1.live, 0);   /* and every one released */
        ASSERT_EQ_INT((int)(e1.faults - e0.faults), 0);
    }
    dt_set_num_threads(0);
}

typedef struct {
    int bad;
    int id;
} worker;

static void *worker_main(void *p)
{
    worker *w = p;
    for (int r = 0; r < 3 && !w->bad; r++) {
        shape s = {.ta = w->id & 1, .tb = (w->id >> 1) & 1, .M = 33 + w->id, .N = 40 + r, .K = 50,
                   .alpha = 1.0f, .beta = r ? 1.0f : 0.0f};
        w->bad |= run_case(s, w->id % 3 == 2 ? VIA_PACKED : VIA_CALL);
        /* between calls a thread holds no tile state */
        w->bad |= dt__amx_thread_configured() || dt__amx_emul_thread_configured();
    }
    return NULL;
}

TEST(concurrent_callers_more_than_cores)
{
    /* callers on their own threads at once (more than the cores), each call
     * on 2 kernel threads: the tile state is per thread, so none disturbs
     * another; the model counts a fault for any tile used unconfigured */
    dt_set_num_threads(2);
    enum { MAXW = 64 };
    int n = (int)(2 * ncpu() + 1);
    n = n > MAXW ? MAXW : n;
    pthread_t th[MAXW];
    worker w[MAXW];
    dt__amx_emul_stats e0, e1;
    dt__amx_emul_stats_get(&e0);
    int started = 0;
    for (int i = 0; i < n; i++) {
        w[i] = (worker){.id = i};
        if (pthread_create(&th[i], NULL, worker_main, &w[i]) != 0)
            break;
        started++;
    }
    int bad = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        bad |= w[i].bad;
    }
    dt__amx_emul_stats_get(&e1);
    dt_set_num_threads(0);
    ASSERT_EQ_INT(started, n);
    ASSERT_EQ_INT(bad, 0);
    ASSERT_EQ_INT((int)e1.live, 0);
    ASSERT_EQ_INT((int)(e1.faults - e0.faults), 0);
}

/* ---- the model's own semantics ------------------------------------------------------- */

static uint16_t bits_of(float f) { return dt_f32_to_bf16(f); }

TEST(tdpbf16ps_numerics)
{
    /* pair order: acc + a0 b0, rounded, + a1 b1, rounded: 1 + 2^-24 + 2^-24 stays 1
     * (ties to even twice); one rounding of both would give 1 + 2^-23 */
    uint16_t t = bits_of(0x1p-12f);
    float r = dt__amx_emul_dp_pair(1.0f, t, t, t, t);
    ASSERT_NEAR(r, 1.0, 0.0, 0.0);
    /* products are exact: (1 + 2^-7)^2 = 1 + 2^-6 + 2^-14 */
    uint16_t u = bits_of(1.0f + 0x1p-7f);
    r = dt__amx_emul_dp_pair(0.0f, u, u, 0, 0);
    ASSERT_NEAR(r, 1.0 + 0x1p-6 + 0x1p-14, 0.0, 0.0);
    /* DAZ: a denormal bf16 input reads as zero */
    uint16_t den = 0x0001, one = bits_of(1.0f), big = bits_of(0x1p100f);
    r = dt__amx_emul_dp_pair(0.0f, den, big, 0, 0);
    ASSERT_NEAR(r, 0.0, 0.0, 0.0);
    /* FTZ: a denormal sum flushes to zero (2^-120 x 2^-10 = 2^-130) */
    r = dt__amx_emul_dp_pair(0.0f, bits_of(0x1p-120f), bits_of(0x1p-10f), 0, 0);
    ASSERT_NEAR(r, 0.0, 0.0, 0.0);
    r = dt__amx_emul_dp_pair(0.0f, one, one, one, one);
    ASSERT_NEAR(r, 2.0, 0.0, 0.0);
}

TEST(model_checks_fault)
{
    /* the model reports what the hardware refuses, so the lifecycle tests above can fail */
    const dt__amx_tiles *em = dt__amx_tiles_emul();
    dt__amx_emul_stats e0, e1;
    dt__amx_emul_stats_get(&e0);
    dt__amx_emul_tile_zero(0); /* unconfigured: #UD */
    dt__amx_emul_stats_get(&e1);
    ASSERT_EQ_INT((int)(e1.faults - e0.faults), 1);
    dt__amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = 17; /* more rows than a tile has: #GP, state unchanged */
    c.colsb[0] = 64;
    em->load_config(&c);
    ASSERT(!dt__amx_emul_thread_configured());
    c.rows[0] = 16;
    c.rows[1] = 8, c.colsb[1] = 64;  /* A: 8 rows */
    c.rows[2] = 16, c.colsb[2] = 64; /* B */
    em->load_config(&c);
    ASSERT(dt__amx_emul_thread_configured());
    dt__amx_emul_tile_dp(0, 1, 2); /* C has 16 rows, A 8: #UD */
    dt__amx_emul_tile_dp(3, 1, 2); /* tile 3 not configured: #UD */
    dt__amx_emul_stats_get(&e0);
    ASSERT_EQ_INT((int)(e0.faults - e1.faults), 3); /* the bad config, the two dp */
    em->release();
    ASSERT(!dt__amx_emul_thread_configured());
    dt__amx_emul_stats_get(&e1);
    ASSERT_EQ_INT((int)e1.live, 0);
}

/* ---- dispatch ---------------------------------------------------------------------- */

TEST(dispatch_never_emulated)
{
    /* dt_k_matmul's bf16 path takes the AMX GEMM only on the real
     * instructions: where the CPU (as capped) has no AMX it stays on oneDNN */
    const char *why = NULL;
    bool on = dt_k_matmul_amx(&why);
    dt_cpu_features f = dt_cpu_detect();
    ASSERT(why != NULL);
    if (!f.amx_tile || !f.amx_bf16)
        ASSERT(!on);
    /* oneDNN unless DT_AMX_GEMM=on asks for dtrain's (main sets it for the "hw" run) */
    const char *sel = getenv("DT_AMX_GEMM");
    ASSERT(on == (dt__amx_tiles_hw(NULL) != NULL && sel && !strcmp(sel, "on")));
    printf("dtrain AMX GEMM: %s (%s)\n", on ? "on" : "off", why);
    /* either way a bf16 product through dt_k_matmul is right */
    uint16_t *A = bf16_rand(19 * 23), *B = bf16_rand(23 * 29);
    float *C = calloc(19 * 29, 4);
    ASSERT_EQ_INT(dt_k_matmul(false, false, 19, 29, 23, 1.0f, A, B, DT_BF16, 0.0f, C, NULL), DT_OK);
    double err = 0;
    for (int i = 0; i < 19; i++)
        for (int j = 0; j < 29; j++) {
            double s = 0;
            for (int k = 0; k < 23; k++)
                s += (double)bf(A[i * 23 + k]) * bf(B[k * 29 + j]);
            err = fmax(err, fabs(s - C[i * 29 + j]));
        }
    free(A), free(B), free(C);
    ASSERT(err < 1e-5);
}

TEST(lp_rows_dispatch)
{
    /* dt_k_matmul_lp_rows, wherever it runs (split by the AMX GEMM's
     * epilogue where dt_k_matmul_splits_rows, else an f32 result copied or
     * rounded row by row): kept rows bit for bit dt_k_matmul's f32 result,
     * the others that rounded as dt_k_convert rounds; 512 x 256 x 1024 is
     * 2^27 multiply-adds (the auto rule's least), 40 x 50 x 30 is not */
    static const int64_t shp[][3] = {{512, 256, 1024}, {40, 50, 30}};
    for (size_t i = 0; i < 2; i++)
        for (int ta = 0; ta < 2; ta++) {
            const int64_t M = shp[i][0], N = shp[i][1], K = shp[i][2];
            uint16_t *A = bf16_rand(M * K), *B = bf16_rand(K * N), *Cb = malloc((size_t)(M * N) * 2),
                     *want = malloc((size_t)(M * N) * 2);
            float *C = malloc((size_t)(M * N) * 4), *Ck = malloc((size_t)(M * N) * 4);
            int32_t *keep = malloc((size_t)M * sizeof *keep);
            for (int64_t r = 0; r < M; r++)
                keep[r] = r % 5 == 2 ? (int32_t)r : -1;
            ASSERT_EQ_INT(dt_k_matmul(ta, false, M, N, K, 1.0f, A, B, DT_BF16, 0.0f, C, NULL), DT_OK);
            ASSERT_EQ_INT(dt_k_convert(C, DT_F32, want, DT_BF16, M * N), DT_OK);
            bool fin = false;
            ASSERT_EQ_INT(dt_k_matmul_lp_rows(ta, false, M, N, K, A, B, DT_BF16, Cb, keep, Ck, &fin), DT_OK);
            ASSERT(fin);
            int64_t bad = 0;
            for (int64_t r = 0; r < M; r++)
                for (int64_t j = 0; j < N; j++)
                    bad += keep[r] >= 0 ? memcmp(&Ck[r * N + j], &C[r * N + j], 4) != 0
                                        : Cb[r * N + j] != want[r * N + j];
            ASSERT_EQ_INT((int)bad, 0);
            free(A), free(B), free(Cb), free(want), free(C), free(Ck), free(keep);
        }
    printf("dt_k_matmul_lp_rows on 512 x 256 x 1024: %s\n",
           dt_k_matmul_splits_rows(DT_BF16, 512, 256, 1024) ? "split by the AMX GEMM" : "f32 result, then rows");
    ASSERT(dt_k_matmul_splits_rows(DT_BF16, 512, 256, 1024) == dt__amx_use(512, 256, 1024));
    ASSERT(!dt_k_matmul_splits_rows(DT_F16, 512, 256, 1024));
    bool fin = true;
    int32_t k0 = 0;
    uint16_t a = 0, b = 0, cb = 0;
    ASSERT_EQ_INT(dt_k_matmul_lp_rows(false, false, 1, 1, 1, &a, &b, DT_BF16, &cb, NULL, NULL, &fin), DT_ERR_NULL);
    ASSERT(!fin);
    ASSERT_EQ_INT(dt_k_matmul_lp_rows(false, false, 1, 1, 1, &a, &b, DT_F32, &cb, &k0, NULL, &fin),
                  DT_ERR_UNSUPPORTED);
}

TEST(auto_rule)
{
    /* DT_AMX_GEMM=auto's choice: GPT-2's 15 step products (2048 rows) and a
     * ~100M Llama's (256 rows) here; a one-row decode step and small
     * products on oneDNN */
    static const int64_t picked[][3] = {
        {2048, 2304, 768}, {2048, 768, 768},  {2048, 3072, 768}, {2048, 768, 3072}, /* forward */
        {2048, 768, 2304}, {2048, 768, 768},  {2048, 768, 3072}, {2048, 3072, 768}, /* input gradients */
        {768, 2304, 2048}, {768, 768, 2048},  {768, 3072, 2048}, {3072, 768, 2048}, /* weight gradients */
        {2048, 50304, 768}, {2048, 768, 50304}, {50304, 768, 2048},                 /* the LM head */
        {256, 768, 768},   {256, 512, 1024},                                         /* 2^27.2, 2^27 */
    };
    static const int64_t left[][3] = {
        {1, 50304, 768}, {255, 50304, 768}, {2048, 255, 768}, {256, 256, 256}, {256, 511, 1024},
    };
    const dt__amx_tiles *hw = dt__amx_tiles_hw(NULL);
    const char *sel = getenv("DT_AMX_GEMM");
    bool on = sel && !strcmp(sel, "on"), off = sel && (!strcmp(sel, "off") || !strcmp(sel, "0"));
    for (size_t i = 0; i < sizeof picked / sizeof picked[0]; i++) {
        ASSERT(dt__amx_auto_picks(picked[i][0], picked[i][1], picked[i][2]));
        ASSERT(dt__amx_use(picked[i][0], picked[i][1], picked[i][2]) == (hw != NULL && !off));
    }
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        ASSERT(!dt__amx_auto_picks(left[i][0], left[i][1], left[i][2]));
        ASSERT(dt__amx_use(left[i][0], left[i][1], left[i][2]) == (hw != NULL && on));
    }
}

/* The driver's checks on g_tiles (the model's exact order expected when
 * g_exact, else the bound); dispatch: also dt_k_matmul's choice (not on
 * vdpbf16ps, which the dispatch never takes). */
static int run_checks(bool dispatch)
{
    RUN(shapes_all_transposes);
    RUN(beta_alpha_bias_gelu);
    RUN(leading_dimensions);
    RUN(gpt2_layer_shape);
    RUN(k_chunks);
    RUN(a_private_rows);
    RUN(few_rows_transposed);
    RUN(weight_gradient_transposed);
    RUN(b_chunks);
    RUN(k_zero_and_empty);
    RUN(packed_b_reused);
    RUN(packed_b_cache_versions);
    RUN(bf16_result);
    RUN(bf16_result_edges);
    RUN(bf16_plain_rounding);
    RUN(finite_check);
    RUN(kept_rows);
    RUN(direct_a_strides);
    RUN(more_threads_than_cores);
    RUN(concurrent_callers_more_than_cores);
    if (dispatch) {
        RUN(dispatch_never_emulated);
        RUN(lp_rows_dispatch);
        RUN(auto_rule);
    }
    return TEST_REPORT();
}

int main(int argc, char **argv)
{
    const char *why = NULL;
    if (argc > 1 && !strcmp(argv[1], "hw")) {
        if (!(g_tiles = dt__amx_tiles_hw(&why)))
            DT_TEST_SKIP_ALL("AMX tiles not usable here: %s", why);
        setenv("DT_AMX_GEMM", "on", 1); /* dt_k_matmul's bf16 products through this GEMM too */
        return run_checks(true);
    }
    if (argc > 1 && !strcmp(argv[1], "vdp")) {
        if (!(g_tiles = dt__amx_tiles_vdp(&why)))
            DT_TEST_SKIP_ALL("vdpbf16ps tiles not usable here: %s", why);
        return run_checks(false);
    }
    g_tiles = dt__amx_tiles_emul();
    g_exact = true;
    RUN(tdpbf16ps_numerics);
    RUN(model_checks_fault);
    RUN(config_once_per_shape_and_released);
    return run_checks(true);
}
