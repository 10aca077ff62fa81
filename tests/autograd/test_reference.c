/* Forward values of conv2d, pooling, batch norm (train with running-stat
 * update, eval), layer norm, cross-entropy, GELU (erf and tanh) and softmax against
 * PyTorch 1.13 (values produced by gen_reference.py, see its header; the
 * inputs are closed-form so both sides build the same tensors). */
#include "dtrain/autograd.h"
#include "reference_values.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define N_(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

static dt_ctx *ctx;

static dt_tensor *X(int nd, const int64_t *sh, float mul)
{
    dt_tensor *t = dt_tensor_empty(ctx, DT_F32, nd, sh);
    for (int64_t i = 0; i < dt_tensor_numel(t); i++)
        ((float *)t->data)[i] = (float)sin(0.37 * (double)i + 0.1) * mul;
    return t;
}
static dt_tensor *W(int nd, const int64_t *sh, float add)
{
    dt_tensor *t = dt_tensor_empty(ctx, DT_F32, nd, sh);
    for (int64_t i = 0; i < dt_tensor_numel(t); i++)
        ((float *)t->data)[i] = (float)(0.5 * cos(0.11 * (double)i)) + add;
    return t;
}
static dt_tensor *V(int64_t n)
{
    dt_tensor *t = dt_tensor_empty(ctx, DT_F32, 1, &n);
    for (int64_t i = 0; i < n; i++)
        ((float *)t->data)[i] = (float)(0.1 * (double)i - 0.2);
    return t;
}

static int compare(const char *what, const dt_tensor *t, const float *ref, int64_t n, double tol)
{
    if (!t) {
        fprintf(stderr, "%s: NULL (%s)\n", what, dt_last_error());
        return 1;
    }
    if (dt_tensor_numel(t) != n) {
        fprintf(stderr, "%s: %lld elements, want %lld\n", what, (long long)dt_tensor_numel(t),
                (long long)n);
        return 1;
    }
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = dt_tensor_get(t, i);
        if (!(fabs(v - ref[i]) <= tol + tol * fabs(ref[i]))) {
            if (bad++ < 3)
                fprintf(stderr, "%s[%lld]: %.9g, torch %.9g\n", what, (long long)i, v, ref[i]);
        }
    }
    return bad;
}

#define CMP(what, t, ref, tol) ASSERT_EQ_INT(compare(what, t, ref, N_(ref), tol), 0)

TEST(conv2d_stride2_pad1)
{
    dt_tensor *y = dt_conv2d(ctx, X(4, SH(2, 3, 5, 5), 1), W(4, SH(4, 3, 3, 3), 0), V(4), 2, 1);
    CMP("conv2d", y, ref_conv, 1e-5);
}

TEST(pooling)
{
    CMP("max_pool2d", dt_max_pool2d(ctx, X(4, SH(1, 2, 4, 4), 1), 2, 0, 0), ref_maxpool, 1e-6);
    CMP("avg_pool2d", dt_avg_pool2d(ctx, X(4, SH(1, 2, 5, 5), 1), 3, 2, 1), ref_avgpool, 1e-6);
}

TEST(batch_norm_train_then_eval)
{
    dt_tensor *rm = dt_tensor_new(DT_F32, 1, SH(3));
    dt_tensor *rv = dt_tensor_new(DT_F32, 1, SH(3));
    dt_tensor_fill(rv, 1.0);
    dt_tensor *x = X(4, SH(4, 3, 2, 2), 1);
    dt_tensor *g = W(1, SH(3), 1), *b = V(3);
    CMP("bn_train", dt_batch_norm(ctx, x, g, b, rm, rv, true, 0.1f, 1e-5f), ref_bn_train, 1e-5);
    CMP("bn_running_mean", rm, ref_bn_rm, 1e-6);
    CMP("bn_running_var", rv, ref_bn_rv, 1e-6);
    CMP("bn_eval", dt_batch_norm(ctx, x, g, b, rm, rv, false, 0.1f, 1e-5f), ref_bn_eval, 1e-5);
    dt_tensor_free(rm);
    dt_tensor_free(rv);
}

TEST(layer_norm)
{
    CMP("layer_norm", dt_layer_norm(ctx, X(2, SH(3, 5), 1), W(1, SH(5), 1), V(5), 1e-5f), ref_ln,
        1e-5);
}

TEST(cross_entropy)
{
    int64_t y[4] = {1, 0, 4, 2}, yi[4] = {1, -100, 4, 2};
    dt_tensor *logits = X(2, SH(4, 5), 3);
    CMP("cross_entropy", dt_cross_entropy(ctx, logits, dt_tensor_view_of(ctx, y, DT_I64, 1, SH(4))),
        ref_ce, 1e-6);
    CMP("cross_entropy_ignore",
        dt_cross_entropy(ctx, logits, dt_tensor_view_of(ctx, yi, DT_I64, 1, SH(4))),
        ref_ce_ignore, 1e-6);
}

TEST(activations)
{
    CMP("gelu", dt_gelu(ctx, X(1, SH(10), 3)), ref_gelu, 1e-6);
    CMP("gelu_tanh", dt_gelu_tanh(ctx, X(1, SH(10), 3)), ref_gelu_tanh, 1e-6);
    CMP("softmax", dt_softmax(ctx, X(2, SH(2, 4), 2)), ref_softmax, 1e-6);
    CMP("log_softmax", dt_log_softmax(ctx, X(2, SH(2, 4), 2)), ref_log_softmax, 1e-6);
}

int main(void)
{
    dt_ctx_init(NULL, &ctx);
    RUN(conv2d_stride2_pad1);
    RUN(pooling);
    RUN(batch_norm_train_then_eval);
    RUN(layer_norm);
    RUN(cross_entropy);
    RUN(activations);
    dt_ctx_free(ctx);
    return TEST_REPORT();
}
