/* Op semantics beyond gradients: dropout masks (rate, scale, keyed
 * determinism, eval identity), batch-norm running statistics over two
 * steps (hand-computed), view gradients landing in the right places. */
#include "dtrain/autograd.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

TEST(dropout_masks)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *x = dt_tensor_full(ctx, DT_F32, 1, SH(20000), 2.0);
    dt_rng_key k1 = dt_rng_key_make(1, DT_RNG_DROPOUT, 0, 0);
    dt_rng_key k2 = dt_rng_key_make(1, DT_RNG_DROPOUT, 0, 1);
    dt_tensor *a = dt_dropout(ctx, x, 0.3f, true, k1);
    dt_tensor *b = dt_dropout(ctx, x, 0.3f, true, k1);
    dt_tensor *c = dt_dropout(ctx, x, 0.3f, true, k2);
    ASSERT(a && b && c);
    int64_t zeros = 0, diff = 0;
    for (int64_t i = 0; i < 20000; i++) {
        float v = ((float *)a->data)[i];
        ASSERT(v == 0.0f || fabsf(v - 2.0f / 0.7f) < 1e-6f);
        zeros += v == 0.0f;
        ASSERT(v == ((float *)b->data)[i]);                 /* same key, same mask */
        diff += (v == 0.0f) != (((float *)c->data)[i] == 0.0f); /* other key differs */
        /* the mask is the documented function of (key, i) */
        ASSERT((v == 0.0f) == (dt_rng_uniform(k1, (uint64_t)i) < 0.3f));
    }
    ASSERT(zeros > 5700 && zeros < 6300);
    ASSERT(diff > 1000);
    ASSERT(dt_dropout(ctx, x, 0.3f, false, k1) == x); /* eval: identity */
    ASSERT(dt_dropout(ctx, x, 0.0f, true, k1) == x);
    dt_tensor *all = dt_dropout(ctx, x, 1.0f, true, k1);
    ASSERT(all && dt_tensor_get(all, 7) == 0.0);
    dt_ctx_free(ctx);
}

TEST(batch_norm_running_stats_two_steps)
{
    /* x [4, 1]: batch 1 = {1,2,3,4}: mean 2.5, unbiased var 5/3;
     * batch 2 = {0,0,2,2}: mean 1, unbiased var 4/3; momentum 0.5 */
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *rm = dt_tensor_new(DT_F32, 1, SH(1)), *rv = dt_tensor_new(DT_F32, 1, SH(1));
    dt_tensor_fill(rv, 1.0);
    float b1[4] = {1, 2, 3, 4}, b2[4] = {0, 0, 2, 2};
    dt_tensor *y = dt_batch_norm(ctx, dt_tensor_from(ctx, DT_F32, 2, SH(4, 1), b1), NULL, NULL, rm,
                                 rv, true, 0.5f, 1e-12f);
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(rm, 0), 1.25, 1e-6, 0);
    ASSERT_NEAR(dt_tensor_get(rv, 0), 0.5 + 0.5 * 5.0 / 3.0, 1e-6, 0);
    /* output uses the biased variance 1.25 */
    ASSERT_NEAR(dt_tensor_get(y, 0), (1 - 2.5) / sqrt(1.25), 1e-5, 0);
    ASSERT(dt_batch_norm(ctx, dt_tensor_from(ctx, DT_F32, 2, SH(4, 1), b2), NULL, NULL, rm, rv,
                         true, 0.5f, 1e-12f));
    ASSERT_NEAR(dt_tensor_get(rm, 0), 0.5 * 1.25 + 0.5 * 1.0, 1e-6, 0);
    ASSERT_NEAR(dt_tensor_get(rv, 0), 0.5 * (0.5 + 0.5 * 5.0 / 3.0) + 0.5 * 4.0 / 3.0, 1e-6, 0);
    /* eval uses them and leaves them alone */
    dt_tensor *e = dt_batch_norm(ctx, dt_tensor_from(ctx, DT_F32, 2, SH(4, 1), b2), NULL, NULL, rm,
                                 rv, false, 0.5f, 1e-12f);
    double m = dt_tensor_get(rm, 0), v = dt_tensor_get(rv, 0);
    ASSERT_NEAR(dt_tensor_get(e, 2), (2 - m) / sqrt(v), 1e-5, 0);
    ASSERT_NEAR(dt_tensor_get(rm, 0), m, 0, 0);
    dt_tensor_free(rm);
    dt_tensor_free(rv);
    dt_ctx_free(ctx);
}

TEST(view_gradients_land_in_place)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *w = dt_tensor_new(DT_F32, 2, SH(3, 4));
    dt_tensor_set_requires_grad(w, true);
    /* loss = sum(narrow(w^T, dim 0, 1, 2) * 10): rows 1..2 of w^T = columns 1..2 of w */
    dt_tensor *t = dt_narrow(ctx, dt_transpose(ctx, w, 0, 1), 0, 1, 2);
    dt_tensor *loss = dt_sum(ctx, dt_scale(ctx, t, 10.0f));
    ASSERT_OK(dt_backward(ctx, loss));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++)
            ASSERT_NEAR(dt_tensor_get(w->grad, r * 4 + c), (c == 1 || c == 2) ? 10.0 : 0.0, 0, 0);
    /* detach cuts the tape: no gradient flows through it */
    dt_ag_zero_grad(w);
    dt_tensor *d = dt_detach(ctx, w);
    ASSERT(d && d->data == w->data && !(d->flags & DT_TENSOR_REQUIRES_GRAD));
    dt_tensor *l2 = dt_sum(ctx, dt_add(ctx, dt_mul(ctx, d, d), w));
    ASSERT_OK(dt_backward(ctx, l2));
    ASSERT_NEAR(dt_tensor_get(w->grad, 5), 1.0, 0, 0); /* only the "+ w" term */
    dt_ctx_free(ctx);
    dt_tensor_free(w);
}

int main(void)
{
    RUN(dropout_masks);
    RUN(batch_norm_running_stats_two_steps);
    RUN(view_gradients_land_in_place);
    return TEST_REPORT();
}
