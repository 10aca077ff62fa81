/* Bad input never crashes: every op given mismatched shapes, wrong dtypes,
 * bad arguments or NULL returns NULL with a message naming the op and the
 * shapes; a NULL flows through a forward pass to the loss and backward. */
#include "dtrain/autograd.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static dt_ctx *ctx;

static dt_tensor *z(int ndim, const int64_t *shape) { return dt_tensor_zeros(ctx, DT_F32, ndim, shape); }

/* Expect r == NULL with status st and a message containing each needle. */
#define EXPECT_ERR(r, st, ...)                                                        \
    do {                                                                              \
        dt_error_clear();                                                             \
        const void *r_ = (r);                                                         \
        if (r_)                                                                       \
            TEST_FAIL_("%s: expected NULL", #r);                                      \
        ASSERT_EQ_INT(dt_last_status(), st);                                          \
        const char *nd_[] = {__VA_ARGS__};                                            \
        for (size_t i_ = 0; i_ < sizeof nd_ / sizeof nd_[0]; i_++)                    \
            ASSERT_STR_CONTAINS(dt_last_error(), nd_[i_]);                            \
    } while (0)

TEST(shape_mismatches)
{
    dt_tensor *a = z(2, SH(4, 3)), *b = z(1, SH(5));
    EXPECT_ERR(dt_add(ctx, a, b), DT_ERR_SHAPE, "dt_add", "[4,3]", "[5]");
    EXPECT_ERR(dt_sub(ctx, a, b), DT_ERR_SHAPE, "dt_sub", "[4,3]", "[5]");
    EXPECT_ERR(dt_mul(ctx, a, b), DT_ERR_SHAPE, "dt_mul", "[4,3]", "[5]");
    EXPECT_ERR(dt_div(ctx, a, b), DT_ERR_SHAPE, "dt_div", "[4,3]", "[5]");
    EXPECT_ERR(dt_matmul(ctx, a, z(2, SH(4, 2))), DT_ERR_SHAPE, "dt_matmul", "[4,3]", "[4,2]");
    EXPECT_ERR(dt_matmul(ctx, z(3, SH(2, 4, 3)), z(3, SH(3, 3, 2))), DT_ERR_SHAPE, "dt_matmul",
               "[2,4,3]", "[3,3,2]");
    EXPECT_ERR(dt_matmul(ctx, b, a), DT_ERR_SHAPE, "dt_matmul", "[5]");
    EXPECT_ERR(dt_linear(ctx, a, z(2, SH(7, 4)), NULL), DT_ERR_SHAPE, "dt_linear", "[4,3]",
               "[7,4]");
    EXPECT_ERR(dt_linear(ctx, a, z(2, SH(7, 3)), z(1, SH(6))), DT_ERR_SHAPE, "dt_linear",
               "[7,3]", "[6]");
    dt_tensor *img = z(4, SH(2, 3, 8, 8));
    EXPECT_ERR(dt_conv2d(ctx, img, z(4, SH(4, 2, 3, 3)), NULL, 1, 0), DT_ERR_SHAPE, "dt_conv2d",
               "[2,3,8,8]", "[4,2,3,3]");
    EXPECT_ERR(dt_conv2d(ctx, img, z(4, SH(4, 3, 3, 3)), z(1, SH(5)), 1, 0), DT_ERR_SHAPE,
               "dt_conv2d", "[5]");
    EXPECT_ERR(dt_conv2d(ctx, img, z(4, SH(4, 3, 9, 9)), NULL, 1, 0), DT_ERR_SHAPE, "dt_conv2d");
    EXPECT_ERR(dt_conv2d(ctx, a, z(4, SH(4, 3, 3, 3)), NULL, 1, 0), DT_ERR_SHAPE, "dt_conv2d",
               "[4,3]");
    EXPECT_ERR(dt_conv2d(ctx, img, z(4, SH(4, 3, 3, 3)), NULL, 0, 0), DT_ERR_INVALID_ARG,
               "dt_conv2d", "stride");
    EXPECT_ERR(dt_max_pool2d(ctx, a, 2, 2, 0), DT_ERR_SHAPE, "dt_max_pool2d", "[4,3]");
    EXPECT_ERR(dt_avg_pool2d(ctx, img, 10, 1, 0), DT_ERR_SHAPE, "dt_avg_pool2d", "[2,3,8,8]");
    EXPECT_ERR(dt_max_pool2d(ctx, img, 0, 1, 0), DT_ERR_INVALID_ARG, "dt_max_pool2d");
    EXPECT_ERR(dt_batch_norm(ctx, img, z(1, SH(4)), NULL, NULL, NULL, true, 0.1f, 1e-5f),
               DT_ERR_SHAPE, "dt_batch_norm", "gamma", "[4]", "[2,3,8,8]");
    EXPECT_ERR(dt_batch_norm(ctx, img, NULL, NULL, NULL, NULL, false, 0.1f, 1e-5f),
               DT_ERR_INVALID_ARG, "dt_batch_norm", "running");
    EXPECT_ERR(dt_batch_norm(ctx, z(2, SH(1, 3)), NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f),
               DT_ERR_SHAPE, "dt_batch_norm", "more than one value");
    EXPECT_ERR(dt_layer_norm(ctx, a, z(1, SH(4)), NULL, 1e-5f), DT_ERR_SHAPE, "dt_layer_norm",
               "[4]", "[4,3]");
    dt_tensor *lab = dt_tensor_zeros(ctx, DT_I64, 1, SH(5));
    EXPECT_ERR(dt_cross_entropy(ctx, a, lab), DT_ERR_SHAPE, "dt_cross_entropy", "[4,3]", "[5]");
    EXPECT_ERR(dt_cross_entropy(ctx, z(3, SH(5, 3, 1)), lab), DT_ERR_SHAPE, "dt_cross_entropy");
    EXPECT_ERR(dt_mse_loss(ctx, a, z(2, SH(3, 4))), DT_ERR_SHAPE, "dt_mse_loss", "[4,3]",
               "[3,4]");
    EXPECT_ERR(dt_embedding(ctx, z(1, SH(10)), lab), DT_ERR_SHAPE, "dt_embedding", "[10]");
    EXPECT_ERR(dt_reshape(ctx, a, 2, SH(5, -1)), DT_ERR_SHAPE, "dt_reshape", "[4,3]", "[5,-1]");
    EXPECT_ERR(dt_reshape(ctx, a, 2, SH(-1, -1)), DT_ERR_INVALID_ARG, "dt_reshape");
    EXPECT_ERR(dt_transpose(ctx, a, 0, 2), DT_ERR_INVALID_ARG, "dt_transpose", "[4,3]");
    EXPECT_ERR(dt_permute(ctx, a, (const int[]){0, 0}), DT_ERR_INVALID_ARG, "dt_permute");
    EXPECT_ERR(dt_narrow(ctx, a, 1, 2, 2), DT_ERR_RANGE, "dt_narrow", "[4,3]");
    /* start + length overflowed and these views were made (rows 2^63 - 1 of 4) */
    EXPECT_ERR(dt_narrow(ctx, a, 0, INT64_MAX, 2), DT_ERR_RANGE, "dt_narrow", "[4,3]");
    EXPECT_ERR(dt_narrow(ctx, a, 0, 2, INT64_MAX), DT_ERR_RANGE, "dt_narrow", "[4,3]");
    EXPECT_ERR(dt_narrow(ctx, a, 0, 5, 0), DT_ERR_RANGE, "dt_narrow");
    dt_tensor *nv = dt_narrow(ctx, a, 0, 4, 0); /* an empty view at the end is valid */
    ASSERT(nv && nv->shape[0] == 0);
    /* pos0 + t overflowed in dt_rope's position table */
    EXPECT_ERR(dt_rope(ctx, z(3, SH(2, 4, 8)), 2, (const float[2]){1, 1}, INT64_MAX - 2), DT_ERR_INVALID_ARG,
               "dt_rope", "INT64_MAX");
    ASSERT(dt_rope(ctx, z(3, SH(2, 4, 8)), 2, (const float[2]){1, 1}, INT64_MAX - 4) != NULL);
    EXPECT_ERR(dt_flatten(ctx, a, 1, 0), DT_ERR_INVALID_ARG, "dt_flatten");
    EXPECT_ERR(dt_softmax(ctx, z(0, NULL)), DT_ERR_SHAPE, "dt_softmax");
    EXPECT_ERR(dt_dropout(ctx, a, 1.5f, true, dt_rng_key_make(1, 2, 3, 4)), DT_ERR_INVALID_ARG,
               "dt_dropout");
}

TEST(out_of_range_values)
{
    int64_t bad[3] = {0, 7, 1};
    dt_tensor *lab = dt_tensor_view_of(ctx, bad, DT_I64, 1, SH(3));
    EXPECT_ERR(dt_cross_entropy(ctx, z(2, SH(3, 4)), lab), DT_ERR_RANGE, "dt_cross_entropy",
               "7");
    EXPECT_ERR(dt_embedding(ctx, z(2, SH(4, 2)), lab), DT_ERR_RANGE, "dt_embedding", "7");
    int32_t neg[1] = {-3};
    EXPECT_ERR(dt_embedding(ctx, z(2, SH(4, 2)), dt_tensor_view_of(ctx, neg, DT_I32, 1, SH(1))),
               DT_ERR_RANGE, "dt_embedding", "-3");
}

TEST(wrong_dtypes)
{
    dt_tensor *f = z(2, SH(2, 3));
    dt_tensor *i = dt_tensor_zeros(ctx, DT_I32, 2, SH(2, 3));
    /* bf16 and f16 are computed (precision.h); f64 is not */
    dt_tensor *h = dt_tensor_zeros(ctx, DT_F64, 2, SH(2, 3));
    EXPECT_ERR(dt_add(ctx, f, i), DT_ERR_DTYPE, "dt_add", "i32");
    EXPECT_ERR(dt_mul(ctx, h, f), DT_ERR_DTYPE, "dt_mul", "f64");
    EXPECT_ERR(dt_cast(ctx, i, DT_BF16), DT_ERR_DTYPE, "dt_cast", "i32");
    EXPECT_ERR(dt_cast(ctx, f, DT_I64), DT_ERR_DTYPE, "dt_cast", "i64");
    EXPECT_ERR(dt_relu(ctx, i), DT_ERR_DTYPE, "dt_relu");
    EXPECT_ERR(dt_gelu(ctx, i), DT_ERR_DTYPE, "dt_gelu");
    EXPECT_ERR(dt_gelu_tanh(ctx, h), DT_ERR_DTYPE, "dt_gelu_tanh", "f64");
    EXPECT_ERR(dt_scale(ctx, i, 2), DT_ERR_DTYPE, "dt_scale");
    EXPECT_ERR(dt_matmul(ctx, f, dt_tensor_zeros(ctx, DT_F64, 2, SH(3, 2))), DT_ERR_DTYPE,
               "dt_matmul", "f64");
    EXPECT_ERR(dt_linear(ctx, f, i, NULL), DT_ERR_DTYPE, "dt_linear");
    EXPECT_ERR(dt_softmax(ctx, i), DT_ERR_DTYPE, "dt_softmax");
    EXPECT_ERR(dt_log_softmax(ctx, h), DT_ERR_DTYPE, "dt_log_softmax");
    EXPECT_ERR(dt_sum(ctx, i), DT_ERR_DTYPE, "dt_sum");
    EXPECT_ERR(dt_mean(ctx, i), DT_ERR_DTYPE, "dt_mean");
    EXPECT_ERR(dt_layer_norm(ctx, i, NULL, NULL, 1e-5f), DT_ERR_DTYPE, "dt_layer_norm");
    EXPECT_ERR(dt_batch_norm(ctx, i, NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f), DT_ERR_DTYPE,
               "dt_batch_norm");
    EXPECT_ERR(dt_conv2d(ctx, dt_tensor_zeros(ctx, DT_F64, 4, SH(1, 1, 3, 3)),
                         z(4, SH(1, 1, 1, 1)), NULL, 1, 0),
               DT_ERR_DTYPE, "dt_conv2d", "f64");
    EXPECT_ERR(dt_max_pool2d(ctx, dt_tensor_zeros(ctx, DT_U8, 4, SH(1, 1, 4, 4)), 2, 2, 0),
               DT_ERR_DTYPE, "dt_max_pool2d");
    /* labels must be integers, logits float */
    EXPECT_ERR(dt_cross_entropy(ctx, f, z(1, SH(2))), DT_ERR_DTYPE, "dt_cross_entropy", "labels");
    EXPECT_ERR(dt_cross_entropy(ctx, i, dt_tensor_zeros(ctx, DT_I64, 1, SH(2))), DT_ERR_DTYPE,
               "dt_cross_entropy");
    EXPECT_ERR(dt_embedding(ctx, z(2, SH(4, 2)), f), DT_ERR_DTYPE, "dt_embedding");
    EXPECT_ERR(dt_mse_loss(ctx, f, i), DT_ERR_DTYPE, "dt_mse_loss");
    EXPECT_ERR(dt_dropout(ctx, i, 0.5f, true, dt_rng_key_make(1, 2, 3, 4)), DT_ERR_DTYPE,
               "dt_dropout");
}

TEST(null_inputs)
{
    dt_tensor *a = z(2, SH(2, 3));
    EXPECT_ERR(dt_add(ctx, a, NULL), DT_ERR_NULL, "dt_add", "b");
    EXPECT_ERR(dt_add(NULL, a, a), DT_ERR_NULL, "dt_add", "context");
    EXPECT_ERR(dt_relu(ctx, NULL), DT_ERR_NULL, "dt_relu");
    EXPECT_ERR(dt_linear(ctx, NULL, a, NULL), DT_ERR_NULL, "dt_linear");
    EXPECT_ERR(dt_conv2d(ctx, NULL, NULL, NULL, 1, 0), DT_ERR_NULL, "dt_conv2d");
    EXPECT_ERR(dt_reshape(ctx, NULL, 1, SH(6)), DT_ERR_NULL, "dt_reshape");
    EXPECT_ERR(dt_cross_entropy(ctx, a, NULL), DT_ERR_NULL, "dt_cross_entropy");
    EXPECT_ERR(dt_tensor_zeros(NULL, DT_F32, 1, SH(1)), DT_ERR_NULL, "context");
    dt_error_clear();
    ASSERT_STATUS(dt_backward(ctx, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_backward(NULL, a), DT_ERR_NULL);
    ASSERT_STATUS(dt_ag_mark(ctx, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_ag_add_grad_hook(NULL, NULL, NULL), DT_ERR_NULL);
    ASSERT(isnan(dt_tensor_item(NULL)));
}

TEST(null_flows_through_forward_to_loss)
{
    dt_tensor *w1 = dt_tensor_new(DT_F32, 2, SH(8, 5)); /* wrong: x has 6 features */
    dt_tensor *w2 = dt_tensor_new(DT_F32, 2, SH(3, 8));
    dt_tensor_set_requires_grad(w1, true);
    dt_tensor_set_requires_grad(w2, true);
    dt_error_clear();
    dt_tensor *x = z(2, SH(4, 6));
    dt_tensor *h = dt_linear(ctx, x, w1, NULL); /* fails here */
    h = dt_relu(ctx, h);
    h = dt_reshape(ctx, h, 2, SH(4, -1));
    h = dt_layer_norm(ctx, h, NULL, NULL, 1e-5f);
    h = dt_dropout(ctx, h, 0.1f, true, dt_rng_key_make(1, 2, 3, 4));
    h = dt_linear(ctx, h, w2, NULL);
    dt_tensor *loss = dt_cross_entropy(ctx, h, dt_tensor_zeros(ctx, DT_I64, 1, SH(4)));
    ASSERT(loss == NULL);
    /* the message is the first failure's, naming op and shapes */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "dt_linear");
    ASSERT_STR_CONTAINS(dt_last_error(), "[4,6]");
    ASSERT_STR_CONTAINS(dt_last_error(), "[8,5]");
    ASSERT_STATUS(dt_backward(ctx, loss), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "[8,5]");
    ASSERT(isnan(dt_tensor_item(loss)));
    ASSERT_EQ_INT(dt_ag_tape_len(ctx), 0); /* nothing recorded after the failure */
    dt_tensor_free(w1);
    dt_tensor_free(w2);
}

TEST(backward_misuse)
{
    dt_tensor *w = dt_tensor_new(DT_F32, 1, SH(3));
    dt_tensor_set_requires_grad(w, true);
    dt_tensor *y = dt_scale(ctx, w, 2.0f);
    ASSERT_STATUS(dt_backward(ctx, y), DT_ERR_SHAPE); /* not a scalar */
    ASSERT_STR_CONTAINS(dt_last_error(), "[3]");
    ASSERT_STATUS(dt_backward_with(ctx, y, z(1, SH(4))), DT_ERR_SHAPE);
    ASSERT_OK(dt_backward_with(ctx, y, dt_tensor_full(ctx, DT_F32, 1, SH(3), 1.0)));
    ASSERT_NEAR(((float *)w->grad->data)[1], 2.0, 0, 0);
    /* a custom op needs a fresh temporary output */
    EXPECT_ERR(dt_ag_custom(ctx, 1, &w, w, NULL, NULL), DT_ERR_INVALID_ARG, "dt_ag_custom");
    dt_tensor_free(w);
}

/* Empty tensors are valid everywhere a shape allows them; huge ones fail
 * cleanly. */
TEST(empty_and_huge)
{
    dt_tensor *w = dt_tensor_new(DT_F32, 2, SH(5, 4));
    dt_tensor_set_requires_grad(w, true);
    dt_tensor *e = z(2, SH(0, 4));
    dt_tensor *y = dt_linear(ctx, e, w, NULL);
    ASSERT(y && y->shape[0] == 0 && y->shape[1] == 5);
    dt_tensor *m = dt_matmul(ctx, e, z(2, SH(4, 3)));
    ASSERT(m && dt_tensor_numel(m) == 0);
    dt_tensor *a = dt_add(ctx, e, z(1, SH(4)));
    ASSERT(a && dt_tensor_numel(a) == 0);
    dt_tensor *s = dt_sum(ctx, dt_relu(ctx, y));
    ASSERT(s);
    ASSERT_NEAR(dt_tensor_item(s), 0, 0, 0);
    ASSERT_OK(dt_backward(ctx, s));
    ASSERT_NEAR(dt_tensor_get(w->grad, 0), 0, 0, 0);
    EXPECT_ERR(dt_cross_entropy(ctx, z(2, SH(0, 3)), dt_tensor_zeros(ctx, DT_I64, 1, SH(0))),
               DT_ERR_SHAPE, "dt_cross_entropy");
    EXPECT_ERR(dt_tensor_zeros(ctx, DT_F32, 2, SH((int64_t)1 << 31, (int64_t)1 << 30)),
               DT_ERR_RANGE, "too large");
    EXPECT_ERR(dt_tensor_zeros(ctx, DT_F32, 2, SH((int64_t)1 << 40, (int64_t)1 << 30)),
               DT_ERR_RANGE, "overflows");
    /* [2^21] indices into a [2, 2^40] table: the output would be too large;
     * checked before anything is read or allocated (views over dummies) */
    static float dummy[4];
    static int64_t ids[4];
    EXPECT_ERR(dt_embedding(ctx,
                            dt_tensor_view_of(ctx, dummy, DT_F32, 2, SH(2, (int64_t)1 << 40)),
                            dt_tensor_view_of(ctx, ids, DT_I64, 1, SH((int64_t)1 << 21))),
               DT_ERR_RANGE, "too large");
    dt_tensor_free(w);
}

int main(void)
{
    dt_ctx_init(NULL, &ctx);
    RUN(shape_mismatches);
    RUN(out_of_range_values);
    RUN(wrong_dtypes);
    RUN(null_inputs);
    RUN(null_flows_through_forward_to_loss);
    RUN(backward_misuse);
    RUN(empty_and_huge);
    dt_ctx_free(ctx);
    return TEST_REPORT();
}
