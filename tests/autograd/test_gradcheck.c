/* Finite-difference gradient check of every differentiable op (f32 central
 * differences, h = 1e-2 unless stated; tolerances atol 2e-3 + rtol 2e-2).
 * Random inputs come from the Philox RNG (gradcheck.h). */
#include "gradcheck.h"

#define TC(seed, ...) gc_tensor(NARG(__VA_ARGS__), SH(__VA_ARGS__), seed, false)

/* ---- elementwise ---- */
static dt_tensor *f_add(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_add(c, in[0], in[1]); }
static dt_tensor *f_sub(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_sub(c, in[0], in[1]); }
static dt_tensor *f_mul(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_mul(c, in[0], in[1]); }
static dt_tensor *f_div(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_div(c, in[0], in[1]); }
static dt_tensor *f_scale(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_scale(c, in[0], -1.7f); }
static dt_tensor *f_relu(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_relu(c, in[0]); }
static dt_tensor *f_gelu(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_gelu(c, in[0]); }
static dt_tensor *f_gelu_tanh(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_gelu_tanh(c, in[0]); }
static dt_tensor *f_dropout(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_dropout(c, in[0], 0.3f, true, dt_rng_key_make(5, DT_RNG_DROPOUT, 0, 1));
}

TEST(add_broadcast)
{
    dt_tensor *in[2] = {T(1, 2, 3, 4), T(2, 3, 1)};
    GRADCHECK("add", 2, in, f_add, NULL, 1e-2);
}
TEST(add_same_shape_one_const)
{
    dt_tensor *in[2] = {T(1, 5, 7), TC(2, 5, 7)};
    GRADCHECK("add_const", 2, in, f_add, NULL, 1e-2);
}
TEST(sub_broadcast)
{
    dt_tensor *in[2] = {T(3, 4), T(4, 2, 3, 4)};
    GRADCHECK("sub", 2, in, f_sub, NULL, 1e-2);
}
TEST(mul_broadcast)
{
    dt_tensor *in[2] = {T(5, 2, 3), T(6, 1, 3)};
    GRADCHECK("mul", 2, in, f_mul, NULL, 1e-2);
}
TEST(div_broadcast)
{
    dt_tensor *in[2] = {T(7, 3, 4), T(8, 4)};
    float *b = in[1]->data;
    for (int i = 0; i < 4; i++)
        b[i] = 1.5f + fabsf(b[i]);
    GRADCHECK("div", 2, in, f_div, NULL, 1e-2);
}
TEST(scale)
{
    dt_tensor *in[1] = {T(9, 3, 5)};
    GRADCHECK("scale", 1, in, f_scale, NULL, 1e-2);
}
TEST(relu)
{
    dt_tensor *in[1] = {T(10, 4, 6)};
    gc_away_from_zero(in[0], 0.05f);
    GRADCHECK("relu", 1, in, f_relu, NULL, 1e-2);
}
TEST(gelu)
{
    dt_tensor *in[1] = {T(11, 4, 6)};
    GRADCHECK("gelu", 1, in, f_gelu, NULL, 1e-2);
}
TEST(gelu_tanh)
{
    dt_tensor *in[1] = {T(13, 4, 6)};
    GRADCHECK("gelu_tanh", 1, in, f_gelu_tanh, NULL, 1e-2);
}
TEST(dropout)
{
    dt_tensor *in[1] = {T(12, 8, 8)};
    GRADCHECK("dropout", 1, in, f_dropout, NULL, 1e-2);
}

/* ---- matmul / linear ---- */
static dt_tensor *f_matmul(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_matmul(c, in[0], in[1]); }
static dt_tensor *f_linear(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_linear(c, in[0], in[1], in[2]); }
static dt_tensor *f_matmul_t(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u; /* x @ w^T through a transpose view */
    return dt_matmul(c, in[0], dt_transpose(c, in[1], 0, 1));
}

TEST(matmul_2d)
{
    dt_tensor *in[2] = {T(20, 3, 4), T(21, 4, 5)};
    GRADCHECK("matmul2d", 2, in, f_matmul, NULL, 1e-2);
}
TEST(matmul_nd_2d)
{
    dt_tensor *in[2] = {T(22, 2, 3, 4), T(23, 4, 5)};
    GRADCHECK("matmul_nd", 2, in, f_matmul, NULL, 1e-2);
}
TEST(matmul_batched)
{
    dt_tensor *in[2] = {T(24, 2, 3, 4), T(25, 2, 4, 5)};
    GRADCHECK("matmul_batched", 2, in, f_matmul, NULL, 1e-2);
}
TEST(matmul_transposed_view)
{
    dt_tensor *in[2] = {T(26, 3, 4), T(27, 5, 4)};
    GRADCHECK("matmul_t", 2, in, f_matmul_t, NULL, 1e-2);
}
TEST(linear_bias)
{
    dt_tensor *in[3] = {T(28, 2, 3, 4), T(29, 5, 4), T(30, 5)};
    GRADCHECK("linear", 3, in, f_linear, NULL, 1e-2);
}
TEST(linear_nobias)
{
    dt_tensor *in[3] = {T(31, 3, 4), T(32, 2, 4), NULL};
    GRADCHECK("linear_nobias", 2, in, f_linear, NULL, 1e-2);
}

/* ---- conv / pool ---- */
typedef struct { int stride, pad, k; } cv_ud;
static dt_tensor *f_conv(dt_ctx *c, dt_tensor **in, void *u)
{
    cv_ud *p = u;
    return dt_conv2d(c, in[0], in[1], in[2], p->stride, p->pad);
}
static dt_tensor *f_maxpool(dt_ctx *c, dt_tensor **in, void *u)
{
    cv_ud *p = u;
    return dt_max_pool2d(c, in[0], p->k, p->stride, p->pad);
}
static dt_tensor *f_avgpool(dt_ctx *c, dt_tensor **in, void *u)
{
    cv_ud *p = u;
    return dt_avg_pool2d(c, in[0], p->k, p->stride, p->pad);
}

TEST(conv2d_pad1)
{
    cv_ud u = {1, 1, 0};
    dt_tensor *in[3] = {T(40, 2, 3, 5, 5), T(41, 4, 3, 3, 3), T(42, 4)};
    GRADCHECK("conv2d", 3, in, f_conv, &u, 1e-2);
}
TEST(conv2d_stride2_nobias)
{
    cv_ud u = {2, 0, 0};
    dt_tensor *in[3] = {T(43, 2, 2, 7, 6), T(44, 3, 2, 3, 2), NULL};
    GRADCHECK("conv2d_s2", 2, in, f_conv, &u, 1e-2);
}
TEST(max_pool2d)
{
    cv_ud u = {0, 0, 2};
    dt_tensor *in[1] = {T(45, 2, 3, 6, 6)};
    gc_distinct(in[0], 45, 0.05f);
    GRADCHECK("max_pool2d", 1, in, f_maxpool, &u, 1e-2);
}
TEST(max_pool2d_overlap_pad)
{
    cv_ud u = {2, 1, 3};
    dt_tensor *in[1] = {T(46, 1, 2, 7, 7)};
    gc_distinct(in[0], 46, 0.05f);
    GRADCHECK("max_pool2d_pad", 1, in, f_maxpool, &u, 1e-2);
}
TEST(avg_pool2d)
{
    cv_ud u = {2, 1, 3};
    dt_tensor *in[1] = {T(47, 2, 2, 6, 5)};
    GRADCHECK("avg_pool2d", 1, in, f_avgpool, &u, 1e-2);
}

/* ---- norms ---- */
typedef struct { dt_tensor *rm, *rv; bool train; } bn_ud;
static dt_tensor *f_bn(dt_ctx *c, dt_tensor **in, void *u)
{
    bn_ud *p = u;
    return dt_batch_norm(c, in[0], in[1], in[2], p->rm, p->rv, p->train, 0.0f, 1e-5f);
}
static dt_tensor *f_ln(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_layer_norm(c, in[0], in[1], in[2], 1e-5f); }

TEST(batch_norm_train_4d)
{
    /* momentum 0 keeps the running stats fixed across the checker's calls */
    bn_ud u = {TC(50, 3), TC(51, 3), true};
    dt_tensor *in[3] = {T(52, 4, 3, 2, 2), T(53, 3), T(54, 3)};
    GRADCHECK("batch_norm_train", 3, in, f_bn, &u, 1e-2);
    dt_tensor_free(u.rm);
    dt_tensor_free(u.rv);
}
TEST(batch_norm_train_2d_noaffine)
{
    bn_ud u = {NULL, NULL, true};
    dt_tensor *in[3] = {T(55, 6, 4), NULL, NULL};
    GRADCHECK("batch_norm_2d", 1, in, f_bn, &u, 1e-2);
}
TEST(batch_norm_eval)
{
    bn_ud u = {TC(56, 3), TC(57, 3), false};
    float *rv = u.rv->data;
    for (int i = 0; i < 3; i++)
        rv[i] = 0.5f + fabsf(rv[i]);
    dt_tensor *in[3] = {T(58, 2, 3, 3, 2), T(59, 3), T(60, 3)};
    GRADCHECK("batch_norm_eval", 3, in, f_bn, &u, 1e-2);
    dt_tensor_free(u.rm);
    dt_tensor_free(u.rv);
}
TEST(layer_norm)
{
    dt_tensor *in[3] = {T(61, 2, 3, 8), T(62, 8), T(63, 8)};
    GRADCHECK("layer_norm", 3, in, f_ln, NULL, 1e-2);
}

/* ---- embedding, softmax, losses, reductions ---- */
static dt_tensor *f_embedding(dt_ctx *c, dt_tensor **in, void *u)
{
    return dt_embedding(c, in[0], (dt_tensor *)u);
}
static dt_tensor *f_softmax(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_softmax(c, in[0]); }
static dt_tensor *f_log_softmax(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_log_softmax(c, in[0]); }
static dt_tensor *f_ce(dt_ctx *c, dt_tensor **in, void *u) { return dt_cross_entropy(c, in[0], (dt_tensor *)u); }
static dt_tensor *f_mse(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_mse_loss(c, in[0], in[1]); }
static dt_tensor *f_sum(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_sum(c, in[0]); }
static dt_tensor *f_mean(dt_ctx *c, dt_tensor **in, void *u) { (void)u; return dt_mean(c, in[0]); }

TEST(embedding_repeated_indices)
{
    int64_t ids[6] = {1, 3, 1, 0, 4, 1};
    dt_tensor *idx = dt_tensor_wrap(ids, DT_I64, 2, SH(2, 3));
    dt_tensor *in[1] = {T(70, 5, 4)};
    GRADCHECK("embedding", 1, in, f_embedding, idx, 1e-2);
    dt_tensor_free(idx);
}
TEST(softmax)
{
    dt_tensor *in[1] = {T(71, 3, 2, 5)};
    GRADCHECK("softmax", 1, in, f_softmax, NULL, 1e-2);
}
TEST(log_softmax)
{
    dt_tensor *in[1] = {T(72, 4, 6)};
    GRADCHECK("log_softmax", 1, in, f_log_softmax, NULL, 1e-2);
}
TEST(cross_entropy_i64)
{
    int64_t y[5] = {0, 3, 2, 3, 1};
    dt_tensor *lab = dt_tensor_wrap(y, DT_I64, 1, SH(5));
    dt_tensor *in[1] = {T(73, 5, 4)};
    GRADCHECK("cross_entropy_i64", 1, in, f_ce, lab, 1e-2);
    dt_tensor_free(lab);
}
TEST(cross_entropy_i32)
{
    int32_t y[3] = {6, 0, 2};
    dt_tensor *lab = dt_tensor_wrap(y, DT_I32, 1, SH(3));
    dt_tensor *in[1] = {T(74, 3, 7)};
    GRADCHECK("cross_entropy_i32", 1, in, f_ce, lab, 1e-2);
    dt_tensor_free(lab);
}
TEST(cross_entropy_ignore_index)
{
    int64_t y[4] = {2, -100, 0, 1};
    dt_tensor *lab = dt_tensor_wrap(y, DT_I64, 1, SH(4));
    dt_tensor *in[1] = {T(79, 4, 3)};
    GRADCHECK("cross_entropy_ignore", 1, in, f_ce, lab, 1e-2);
    dt_tensor_free(lab);
}
TEST(mse_loss)
{
    dt_tensor *in[2] = {T(75, 3, 4), T(76, 3, 4)};
    GRADCHECK("mse_loss", 2, in, f_mse, NULL, 1e-2);
}
TEST(sum_mean)
{
    dt_tensor *a[1] = {T(77, 3, 4)};
    GRADCHECK("sum", 1, a, f_sum, NULL, 1e-2);
    dt_tensor *b[1] = {T(78, 2, 5)};
    GRADCHECK("mean", 1, b, f_mean, NULL, 1e-2);
}

/* ---- views ---- */
static dt_tensor *f_views(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u; /* permute -> narrow -> reshape (copy) -> transpose -> flatten -> mul to mix */
    dt_tensor *p = dt_permute(c, in[0], (const int[]){2, 0, 1}); /* [4,2,3] */
    dt_tensor *n = dt_narrow(c, p, 0, 1, 2);                       /* [2,2,3] */
    dt_tensor *r = dt_reshape(c, n, 2, SH(4, 3));
    dt_tensor *t = dt_transpose(c, r, 0, 1); /* [3,4] */
    dt_tensor *f = dt_flatten(c, dt_contiguous(c, t), 0, -1);
    return dt_mul(c, f, f);
}
TEST(views_chain)
{
    dt_tensor *in[1] = {T(80, 2, 3, 4)};
    GRADCHECK("views", 1, in, f_views, NULL, 1e-2);
}

/* ---- a small network end to end ---- */
static dt_tensor *f_net(dt_ctx *c, dt_tensor **in, void *u)
{
    dt_tensor *x = u; /* [2,1,6,6] */
    dt_tensor *h = dt_conv2d(c, x, in[0], in[1], 1, 1);
    h = dt_relu(c, h);
    h = dt_max_pool2d(c, h, 2, 0, 0); /* [2,2,3,3] */
    h = dt_flatten(c, h, 1, -1);      /* [2,18] */
    h = dt_linear(c, h, in[2], in[3]);
    static int64_t y[2] = {1, 2};
    dt_tensor *lab = dt_tensor_view_of(c, y, DT_I64, 1, SH(2));
    return dt_cross_entropy(c, h, lab);
}
TEST(small_convnet)
{
    dt_tensor *x = TC(90, 2, 1, 6, 6);
    dt_tensor *in[4] = {T(91, 2, 1, 3, 3), T(92, 2), T(93, 3, 18), T(94, 3)};
    int bad = gradcheck("convnet", 4, in, f_net, x, 1e-3, 3e-3, 3e-2);
    gc_free_all(4, in);
    dt_tensor_free(x);
    ASSERT_EQ_INT(bad, 0);
}

int main(void)
{
    RUN(add_broadcast);
    RUN(add_same_shape_one_const);
    RUN(sub_broadcast);
    RUN(mul_broadcast);
    RUN(div_broadcast);
    RUN(scale);
    RUN(relu);
    RUN(gelu);
    RUN(gelu_tanh);
    RUN(dropout);
    RUN(matmul_2d);
    RUN(matmul_nd_2d);
    RUN(matmul_batched);
    RUN(matmul_transposed_view);
    RUN(linear_bias);
    RUN(linear_nobias);
    RUN(conv2d_pad1);
    RUN(conv2d_stride2_nobias);
    RUN(max_pool2d);
    RUN(max_pool2d_overlap_pad);
    RUN(avg_pool2d);
    RUN(batch_norm_train_4d);
    RUN(batch_norm_train_2d_noaffine);
    RUN(batch_norm_eval);
    RUN(layer_norm);
    RUN(embedding_repeated_indices);
    RUN(softmax);
    RUN(log_softmax);
    RUN(cross_entropy_i64);
    RUN(cross_entropy_i32);
    RUN(cross_entropy_ignore_index);
    RUN(mse_loss);
    RUN(sum_mean);
    RUN(views_chain);
    RUN(small_convnet);
    return TEST_REPORT();
}
