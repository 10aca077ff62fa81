/* Op semantics beyond gradients: dropout masks (rate, scale, keyed
 * determinism, eval identity; dt_dropout_at's rows), batch-norm running statistics over two
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

/* dt_dropout_at: rows 5, 0 and 3 of a [2, 6, 7] tensor (bf16 too) get the whole tensor's dt_dropout mask, forward
 * and backward; eval and p = 0 are the identity; a position outside the sequence is refused */
TEST(dropout_at_rows)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    const int64_t B = 2, T = 6, E = 7, R = 3, pos[3] = {5, 0, 3};
    dt_rng_key key = dt_rng_key_make(4, DT_RNG_DROPOUT, 2, 9);
    dt_tensor *x = dt_tensor_new(DT_F32, 3, SH(B, T, E)), *xr = dt_tensor_new(DT_F32, 3, SH(B, R, E));
    ASSERT(x && xr);
    for (int64_t i = 0; i < B * T * E; i++)
        dt_tensor_set(x, i, 1.0 + 0.01 * (double)i);
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < E; e++)
                dt_tensor_set(xr, (b * R + r) * E + e, dt_tensor_get(x, (b * T + pos[r]) * E + e));
    ASSERT_OK(dt_tensor_set_requires_grad(x, true));
    ASSERT_OK(dt_tensor_set_requires_grad(xr, true));
    dt_tensor *y = dt_dropout(ctx, x, 0.4f, true, key), *yr = dt_dropout_at(ctx, xr, 0.4f, true, key, pos, T);
    ASSERT(y && yr);
    /* the gradient of sum(y * w): w's values at the rows */
    dt_tensor *w = dt_tensor_empty(ctx, DT_F32, 3, SH(B, T, E)), *wr = dt_tensor_empty(ctx, DT_F32, 3, SH(B, R, E));
    for (int64_t i = 0; i < B * T * E; i++)
        dt_tensor_set(w, i, cos((double)i));
    int64_t zeros = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < E; e++) {
                const int64_t at = (b * T + pos[r]) * E + e, ar = (b * R + r) * E + e;
                dt_tensor_set(wr, ar, dt_tensor_get(w, at));
                ASSERT(dt_tensor_get(yr, ar) == dt_tensor_get(y, at));
                zeros += dt_tensor_get(yr, ar) == 0.0;
            }
    ASSERT(zeros > 5 && zeros < 37); /* of 42: the mask drops some and keeps some */
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, w))));
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, yr, wr))));
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t e = 0; e < E; e++)
                ASSERT(dt_tensor_get(xr->grad, (b * R + r) * E + e) ==
                       dt_tensor_get(x->grad, (b * T + pos[r]) * E + e));
    dt_tensor *h = dt_cast(ctx, xr, DT_BF16), *hr = dt_dropout_at(ctx, h, 0.4f, true, key, pos, T);
    ASSERT(hr && hr->dtype == DT_BF16);
    for (int64_t i = 0; hr && i < B * R * E; i++)
        ASSERT((dt_tensor_get(hr, i) == 0.0) == (dt_tensor_get(yr, i) == 0.0));
    ASSERT(dt_dropout_at(ctx, xr, 0.4f, false, key, pos, T) == xr);
    ASSERT(dt_dropout_at(ctx, xr, 0.0f, true, key, pos, T) == xr);
    ASSERT(dt_dropout_at(ctx, xr, 0.4f, true, key, (const int64_t[]){5, 6, 0}, T) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "position 6 of row 1 is outside [0, 6)");
    ASSERT(dt_dropout_at(ctx, xr, 0.4f, true, key, pos, 2) == NULL); /* T below the rows */
    dt_tensor_free(x);
    dt_tensor_free(xr);
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
    RUN(dropout_at_rows);
    RUN(batch_norm_running_stats_two_steps);
    RUN(view_gradients_land_in_place);
    return TEST_REPORT();
}
