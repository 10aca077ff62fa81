/* Activation checkpointing and re-entrant backward: gradients with and
 * without checkpointing are identical, the region keeps no activations on
 * the tape, hooks of parameters inside the region fire once, gradients
 * reach inputs, and misuse of nested backward is an error. */
#include "dtrain/autograd.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

typedef struct {
    dt_tensor *w1, *b1, *w2, *b2, *w3, *b3;
} net;

static dt_tensor *param(int nd, const int64_t *sh, uint64_t seed)
{
    dt_tensor *t = dt_tensor_new(DT_F32, nd, sh);
    dt_tensor_rand_normal(t, dt_rng_key_make(seed, DT_RNG_INIT, 0, 0), 0, 0.4f);
    dt_tensor_set_requires_grad(t, true);
    return t;
}

static dt_tensor *block(dt_ctx *ctx, int nin, dt_tensor **in, void *ud)
{
    (void)nin;
    net *m = ud;
    dt_tensor *h = dt_gelu(ctx, dt_linear(ctx, in[0], m->w1, m->b1));
    h = dt_dropout(ctx, h, 0.25f, true, dt_rng_key_make(3, DT_RNG_DROPOUT, 0, 7));
    return dt_linear(ctx, h, m->w2, m->b2);
}

static float xin[5 * 6];
static int64_t lab[5] = {0, 1, 2, 1, 0};

static dt_tensor *forward(dt_ctx *ctx, net *m, dt_tensor *x, bool ckpt)
{
    dt_tensor *h = ckpt ? dt_ag_checkpoint(ctx, block, 1, &x, m) : block(ctx, 1, &x, m);
    h = dt_linear(ctx, dt_relu(ctx, h), m->w3, m->b3);
    return dt_cross_entropy(ctx, h, dt_tensor_view_of(ctx, lab, DT_I64, 1, SH(5)));
}

static int fired[6];
static dt_status count_hook(dt_tensor *t, void *ud)
{
    (void)t;
    fired[(intptr_t)ud]++;
    return DT_OK;
}

TEST(checkpoint_matches_plain_backward)
{
    net m = {param(2, SH(8, 6), 1), param(1, SH(8), 2), param(2, SH(7, 8), 3),
             param(1, SH(7), 4),    param(2, SH(3, 7), 5), param(1, SH(3), 6)};
    dt_tensor **p = &m.w1;
    for (int i = 0; i < 6; i++)
        ASSERT_OK(dt_ag_add_grad_hook(p[i], count_hook, (void *)(intptr_t)i));
    dt_rng_fill_normal(dt_rng_key_make(9, DT_RNG_DATA, 0, 0), 0, xin, 30, 0, 1);
    dt_tensor *x = dt_tensor_wrap(xin, DT_F32, 2, SH(5, 6));
    dt_tensor_set_requires_grad(x, true);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);

    /* plain */
    dt_tensor *loss = forward(ctx, &m, x, false);
    ASSERT(loss);
    size_t plain_len = dt_ag_tape_len(ctx);
    float plain_loss = dt_tensor_item(loss);
    ASSERT_OK(dt_backward(ctx, loss));
    float ref[6][64], refx[30];
    for (int i = 0; i < 6; i++)
        dt_tensor_read(p[i]->grad, ref[i]);
    dt_tensor_read(x->grad, refx);
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ_INT(fired[i], 1);
        fired[i] = 0;
        dt_ag_zero_grad(p[i]);
    }
    dt_ag_zero_grad(x);
    dt_ctx_reset(ctx);

    /* checkpointed */
    loss = forward(ctx, &m, x, true);
    ASSERT(loss);
    ASSERT_NEAR(dt_tensor_item(loss), plain_loss, 0, 0);
    /* the region (linear, gelu, dropout, linear = 4 nodes) is one node */
    ASSERT_EQ_INT(dt_ag_tape_len(ctx), plain_len - 3);
    ASSERT_OK(dt_backward(ctx, loss));
    for (int i = 0; i < 6; i++) {
        ASSERT_EQ_INT(fired[i], 1);
        float got[64];
        dt_tensor_read(p[i]->grad, got);
        for (int64_t j = 0; j < dt_tensor_numel(p[i]); j++)
            ASSERT_NEAR(got[j], ref[i][j], 1e-7, 1e-6);
    }
    float gx[30];
    dt_tensor_read(x->grad, gx);
    for (int j = 0; j < 30; j++)
        ASSERT_NEAR(gx[j], refx[j], 1e-7, 1e-6);

    /* no-grad: the region just runs */
    dt_ctx_reset(ctx);
    dt_ag_set_enabled(ctx, false);
    loss = forward(ctx, &m, x, true);
    ASSERT_NEAR(dt_tensor_item(loss), plain_loss, 0, 0);
    ASSERT_EQ_INT(dt_ag_tape_len(ctx), 0);
    dt_ag_set_enabled(ctx, true);

    dt_ctx_free(ctx);
    for (int i = 0; i < 6; i++)
        dt_tensor_free(p[i]);
    dt_tensor_free(x);
}

static dt_tensor *stale_loss;
static dt_status nested_from_old_node(dt_ctx *ctx, void *ud)
{
    (void)ud;
    dt_status st = dt_backward(ctx, stale_loss);
    if (st != DT_ERR_STATE)
        return dt_error(DT_ERR_INTERNAL, "nested backward from an old node was accepted");
    return DT_OK;
}

TEST(nested_backward_only_over_new_nodes)
{
    dt_tensor *w = dt_tensor_new(DT_F32, 1, SH(3));
    dt_tensor_set_requires_grad(w, true);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    stale_loss = dt_sum(ctx, w);
    ASSERT_OK(dt_ag_mark(ctx, nested_from_old_node, NULL));
    dt_tensor *loss = dt_sum(ctx, dt_scale(ctx, w, 2.0f));
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_STR_CONTAINS(dt_last_error(), "enclosing backward");
    ASSERT_NEAR(((float *)w->grad->data)[0], 2.0, 0, 0);
    dt_ctx_free(ctx);
    dt_tensor_free(w);
}

int main(void)
{
    RUN(checkpoint_matches_plain_backward);
    RUN(nested_backward_only_over_new_nodes);
    return TEST_REPORT();
}
