/* Finite-difference checks of every backward kernel against its forward.
 * Each check defines L = sum_i out_i * g_i for a fixed random g, perturbs
 * one input element at a time by +-h and compares (L+ - L-) / 2h with the
 * backward kernel's gradient. */
#include "dtrain/kernels.h"
#include "test.h"

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 7, 8), 0, x, (size_t)n, lo, hi);
}

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

typedef double (*loss_fn)(void);

/* Compare analytic[i] with the central difference of f() in param[i]. */
static int fd(const char *what, float *param, const float *analytic, int64_t n, loss_fn f, float h, double atol,
              double rtol)
{
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float keep = param[i];
        param[i] = keep + h;
        double lp = f();
        param[i] = keep - h;
        double lm = f();
        param[i] = keep;
        double num = (lp - lm) / (2.0 * (double)h);
        if (!(fabs(num - analytic[i]) <= atol + rtol * fabs(num))) {
            if (bad++ < 5)
                fprintf(stderr, "%s[%lld]: analytic %.7g, numeric %.7g\n", what, (long long)i, (double)analytic[i],
                        num);
        }
    }
    return bad;
}

#define FD(what, p, a, n, f, h) \
    do { if (fd(what, p, a, n, f, h, 2e-3, 1e-2)) TEST_FAIL_("finite differences of %s disagree", what); } while (0)

/* ---- shared buffers -------------------------------------------------------------- */
static float X[512], Y[512], G[512], DX[512], GAM[64], BET[64], DGAM[64], DBET[64], T2[512];
static int64_t R_, C_; /* rows, cols */
static bool LOG_;
static dt_k_unop UOP_;
static dt_k_gelu_approx GA_;
static dt_k_pool2d_shape PS_;
static int64_t LAB_[8];

static double l_softmax(void)
{
    dt_k_softmax_fwd(X, Y, R_, C_, LOG_);
    return dot(Y, G, R_ * C_);
}

TEST(softmax_grad)
{
    R_ = 4, C_ = 9;
    fill(X, 36, 1, -3, 3);
    fill(G, 36, 2, -1, 1);
    for (int lg = 0; lg < 2; lg++) {
        LOG_ = lg;
        ASSERT_OK(dt_k_softmax_fwd(X, Y, R_, C_, LOG_));
        ASSERT_OK(dt_k_softmax_bwd(Y, G, DX, R_, C_, LOG_));
        FD(lg ? "log_softmax" : "softmax", X, DX, 36, l_softmax, 1e-2f);
    }
}

static double l_xent(void)
{
    float loss;
    dt_k_softmax_xent_fwd(X, LAB_, DT_I64, R_, C_, &loss, NULL);
    return 2.5 * loss;
}

TEST(xent_grad)
{
    R_ = 6, C_ = 5;
    fill(X, 30, 3, -2, 2);
    int64_t lab[6] = {0, 4, DT_K_IGNORE_INDEX, 2, 2, 1};
    memcpy(LAB_, lab, sizeof lab);
    ASSERT_OK(dt_k_softmax_xent_bwd(X, NULL, LAB_, DT_I64, R_, C_, 2.5f, DX));
    FD("xent", X, DX, 30, l_xent, 1e-2f);
    for (int j = 0; j < 5; j++) /* ignored row gets no gradient */
        ASSERT(DX[2 * 5 + j] == 0.0f);
}

static double l_mse(void)
{
    float loss;
    dt_k_mse_fwd(X, T2, 40, &loss);
    return 3.0 * loss;
}

TEST(mse_grad)
{
    fill(X, 40, 4, -1, 1);
    fill(T2, 40, 5, -1, 1);
    float loss;
    ASSERT_OK(dt_k_mse_fwd(X, T2, 40, &loss));
    double want = 0;
    for (int i = 0; i < 40; i++)
        want += ((double)X[i] - T2[i]) * ((double)X[i] - T2[i]);
    ASSERT_NEAR(loss, want / 40, 1e-6, 1e-6);
    ASSERT_OK(dt_k_mse_bwd(X, T2, 40, 3.0f, DX));
    FD("mse", X, DX, 40, l_mse, 1e-2f);
}

static double l_unary(void)
{
    dt_k_unary(UOP_, X, Y, 50);
    return dot(Y, G, 50);
}

TEST(unary_grad)
{
    fill(G, 50, 6, -1, 1);
    for (int op = 0; op < DT_K_UNOP_COUNT; op++) {
        UOP_ = (dt_k_unop)op;
        bool pos = op == DT_K_LOG || op == DT_K_SQRT || op == DT_K_RSQRT || op == DT_K_RECIP;
        fill(X, 50, 7 + (uint64_t)op, pos ? 0.5f : -2.0f, 2.0f);
        if (op == DT_K_ABS)
            for (int i = 0; i < 50; i++)
                if (fabsf(X[i]) < 0.05f)
                    X[i] = 0.3f;
        ASSERT_OK(dt_k_unary(UOP_, X, Y, 50));
        ASSERT_OK(dt_k_unary_bwd(UOP_, X, Y, G, DX, 50));
        char name[32];
        snprintf(name, sizeof name, "unary op %d", op);
        FD(name, X, DX, 50, l_unary, 1e-3f);
    }
}

static double l_gelu(void)
{
    dt_k_gelu_fwd(X, Y, 60, GA_);
    return dot(Y, G, 60);
}

static double l_relu(void)
{
    dt_k_relu_fwd(X, Y, 60);
    return dot(Y, G, 60);
}

TEST(activation_grad)
{
    fill(X, 60, 8, -4, 4);
    fill(G, 60, 9, -1, 1);
    for (int a = 0; a < 2; a++) {
        GA_ = (dt_k_gelu_approx)a;
        ASSERT_OK(dt_k_gelu_bwd(X, G, DX, 60, GA_));
        FD(a ? "gelu_tanh" : "gelu_erf", X, DX, 60, l_gelu, 1e-3f);
    }
    for (int i = 0; i < 60; i++)
        if (fabsf(X[i]) < 0.01f)
            X[i] = 0.5f; /* keep away from the kink */
    ASSERT_OK(dt_k_relu_bwd(X, G, DX, 60));
    FD("relu", X, DX, 60, l_relu, 1e-3f);
}

static double l_maxpool(void)
{
    dt_k_maxpool2d_fwd(&PS_, X, Y, NULL);
    int64_t P, Q;
    dt_k_pool2d_out_size(&PS_, &P, &Q);
    return dot(Y, G, PS_.N * PS_.C * P * Q);
}

static double l_avgpool(void)
{
    dt_k_avgpool2d_fwd(&PS_, X, Y, LOG_);
    int64_t P, Q;
    dt_k_pool2d_out_size(&PS_, &P, &Q);
    return dot(Y, G, PS_.N * PS_.C * P * Q);
}

TEST(pool_grad)
{
    dt_k_pool2d_shape shapes[2] = {{2, 2, 6, 6, 2, 2, 2, 2, 0, 0}, {1, 3, 7, 6, 3, 3, 2, 2, 1, 1}};
    for (int k = 0; k < 2; k++) {
        PS_ = shapes[k];
        int64_t n = PS_.N * PS_.C * PS_.H * PS_.W, P, Q;
        ASSERT_OK(dt_k_pool2d_out_size(&PS_, &P, &Q));
        /* a permutation of distinct values spaced 0.1 apart: no ties */
        for (int64_t i = 0; i < n; i++)
            X[i] = 0.1f * (float)((i * 37) % n) - 3.0f;
        fill(G, PS_.N * PS_.C * P * Q, 10, -1, 1);
        int32_t am[256];
        ASSERT_OK(dt_k_maxpool2d_fwd(&PS_, X, Y, am));
        ASSERT_OK(dt_k_maxpool2d_bwd(&PS_, G, am, DX));
        FD("maxpool", X, DX, n, l_maxpool, 1e-2f);
        for (int inc = 0; inc < 2; inc++) {
            LOG_ = inc;
            ASSERT_OK(dt_k_avgpool2d_bwd(&PS_, G, DX, inc));
            FD("avgpool", X, DX, n, l_avgpool, 1e-2f);
        }
    }
}

static double l_bn(void)
{
    float sm[8], si[8];
    dt_k_batchnorm_train_fwd(X, 3, 4, 5, GAM, BET, 1e-5f, 0.1f, NULL, NULL, Y, sm, si);
    return dot(Y, G, 60);
}

TEST(batchnorm_grad)
{
    fill(X, 60, 11, -2, 3);
    fill(G, 60, 12, -1, 1);
    fill(GAM, 4, 13, 0.5f, 1.5f);
    fill(BET, 4, 14, -1, 1);
    float sm[4], si[4];
    ASSERT_OK(dt_k_batchnorm_train_fwd(X, 3, 4, 5, GAM, BET, 1e-5f, 0.1f, NULL, NULL, Y, sm, si));
    ASSERT_OK(dt_k_batchnorm_bwd(X, G, 3, 4, 5, GAM, sm, si, DX, DGAM, DBET));
    FD("bn dx", X, DX, 60, l_bn, 1e-2f);
    FD("bn dgamma", GAM, DGAM, 4, l_bn, 1e-2f);
    FD("bn dbeta", BET, DBET, 4, l_bn, 1e-2f);
    /* eval-mode forward is affine in x: check against running stats by hand */
    float rm[4] = {0.1f, 0.2f, 0.3f, 0.4f}, rv[4] = {1, 2, 3, 4};
    ASSERT_OK(dt_k_batchnorm_eval_fwd(X, 3, 4, 5, GAM, BET, rm, rv, 1e-5f, Y));
    for (int i = 0; i < 60; i++) {
        int c = (i / 5) % 4;
        ASSERT_NEAR(Y[i], (X[i] - rm[c]) / sqrt(rv[c] + 1e-5) * GAM[c] + BET[c], 1e-5, 1e-5);
    }
}

static double l_ln(void)
{
    dt_k_layernorm_fwd(X, 4, 10, GAM, BET, 1e-5f, Y, NULL, NULL);
    return dot(Y, G, 40);
}

TEST(layernorm_grad)
{
    fill(X, 40, 15, -2, 2);
    fill(G, 40, 16, -1, 1);
    fill(GAM, 10, 17, 0.5f, 1.5f);
    fill(BET, 10, 18, -1, 1);
    float m[4], r[4];
    ASSERT_OK(dt_k_layernorm_fwd(X, 4, 10, GAM, BET, 1e-5f, Y, m, r));
    ASSERT_OK(dt_k_layernorm_bwd(X, G, 4, 10, GAM, m, r, DX, DGAM, DBET));
    FD("ln dx", X, DX, 40, l_ln, 1e-2f);
    FD("ln dgamma", GAM, DGAM, 10, l_ln, 1e-2f);
    FD("ln dbeta", BET, DBET, 10, l_ln, 1e-2f);
}

/* Broadcast binary ops: grads through dt_k_reduce_to_shape. */
static int64_t SA_[3] = {3, 1, 5}, SB_[2] = {4, 1};
static dt_k_binop BOP_;
static double l_binary(void)
{
    dt_k_binary(BOP_, X, SA_, 3, T2, SB_, 2, Y);
    return dot(Y, G, 60);
}

TEST(binary_broadcast_grad)
{
    int64_t so[3] = {3, 4, 5};
    fill(X, 15, 19, 0.5f, 2);
    fill(T2, 4, 20, 0.5f, 2);
    fill(G, 60, 21, -1, 1);
    float ga[60], gb[60], bb[60], aa[60], tmp[60];
    for (int op = 0; op < 4; op++) {
        BOP_ = (dt_k_binop)op;
        /* broadcast copies of a and b into the output shape */
        float zeros[60] = {0};
        ASSERT_OK(dt_k_binary(DT_K_ADD, X, SA_, 3, zeros, so, 3, aa));
        ASSERT_OK(dt_k_binary(DT_K_ADD, aa, so, 3, T2, SB_, 2, tmp));
        ASSERT_OK(dt_k_binary(DT_K_SUB, tmp, so, 3, aa, so, 3, bb)); /* = b broadcast */
        for (int i = 0; i < 60; i++) {
            float da, db;
            switch (op) {
            case DT_K_ADD: da = 1, db = 1; break;
            case DT_K_SUB: da = 1, db = -1; break;
            case DT_K_MUL: da = bb[i], db = aa[i]; break;
            default: da = 1 / bb[i], db = -aa[i] / (bb[i] * bb[i]); break;
            }
            ga[i] = G[i] * da;
            gb[i] = G[i] * db;
        }
        ASSERT_OK(dt_k_reduce_to_shape(ga, so, 3, DX, SA_, 3));
        FD("binary da", X, DX, 15, l_binary, 1e-2f);
        ASSERT_OK(dt_k_reduce_to_shape(gb, so, 3, DX, SB_, 2));
        FD("binary db", T2, DX, 4, l_binary, 1e-2f);
    }
}

static double l_emb(void)
{
    static const int32_t idx[7] = {2, 0, 2, 4, 1, 2, 0};
    dt_k_embedding_fwd(X, 5, 6, idx, DT_I32, 7, Y);
    return dot(Y, G, 42);
}

TEST(embedding_grad)
{
    static const int32_t idx[7] = {2, 0, 2, 4, 1, 2, 0};
    fill(X, 30, 22, -1, 1);
    fill(G, 42, 23, -1, 1);
    ASSERT_OK(dt_k_embedding_bwd(G, idx, DT_I32, 7, 5, 6, DX));
    FD("embedding", X, DX, 30, l_emb, 1e-2f);
    for (int j = 0; j < 6; j++) /* row 3 is never used */
        ASSERT(DX[3 * 6 + j] == 0.0f);
}

static double l_drop(void)
{
    dt_k_dropout_fwd(X, Y, 100, 0.3f, dt_rng_key_make(5, DT_RNG_DROPOUT, 0, 1), 17);
    return dot(Y, G, 100);
}

TEST(dropout_grad)
{
    fill(X, 100, 24, -1, 1);
    fill(G, 100, 25, -1, 1);
    ASSERT_OK(dt_k_dropout_bwd(G, DX, 100, 0.3f, dt_rng_key_make(5, DT_RNG_DROPOUT, 0, 1), 17));
    FD("dropout", X, DX, 100, l_drop, 1e-2f);
}

int main(void)
{
    RUN(softmax_grad);
    RUN(xent_grad);
    RUN(mse_grad);
    RUN(unary_grad);
    RUN(activation_grad);
    RUN(pool_grad);
    RUN(batchnorm_grad);
    RUN(layernorm_grad);
    RUN(binary_broadcast_grad);
    RUN(embedding_grad);
    RUN(dropout_grad);
    return TEST_REPORT();
}
