/* Split backward (autograd.h dt_backward_input / dt_backward_weight, the
 * BI / BW of zero-bubble pipelines): on a GPT-2 (gpt-micro: embeddings,
 * layer norms, attention, Conv1D matmuls, the tied head) and on a
 * Sequential MLP fed a float input that requires grad (a pipeline stage's
 * received activation), BI then BW gives the same parameter and input
 * gradients as one dt_backward_with (bit for bit: the same kernels per
 * tensor); BI alone leaves every parameter gradient zero but computes the
 * input's; grad-ready hooks fire in BW only; two micro-batches on two
 * contexts interleaved (BI 1, BI 2, BW 1, BW 2) accumulate what two whole
 * backwards do; with activation checkpointing of the GPT's blocks, BI then
 * BW equals the whole backward (a checkpointed region computes its weight
 * gradients in BI: deferring them crashed on the freed recomputation). */
#include "test.h"
#include "model_util.h"

#include "dtrain/autograd.h"

#include <stdlib.h>
#include <string.h>

static int g_hooks;
static dt_status count_hook(dt_model *m, size_t entry, const dt_param_info *p, void *ud)
{
    (void)m, (void)entry, (void)p, (void)ud;
    g_hooks++;
    return DT_OK;
}

/* Forward of the GPT on ids (B = 2, T = 8) into a scalar loss on ctx. */
static dt_tensor *gpt_loss(dt_ctx *ctx, dt_model *m, int seed)
{
    int64_t B = 2, T = 8;
    int64_t *ids = dt_ctx_alloc(ctx, (size_t)(2 * B * T) * sizeof *ids);
    for (int64_t i = 0; i < 2 * B * T; i++)
        ids[i] = (i * 37 + seed * 11) % 512;
    dt_tensor *x = dt_tensor_view_of(ctx, ids, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *y = dt_tensor_view_of(ctx, ids + B * T, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *out = dt_model_forward(ctx, m, x);
    dt_tensor *lo = dt_reshape(ctx, out, 2, (int64_t[]){B * T, -1});
    return dt_cross_entropy(ctx, lo, dt_reshape(ctx, y, 1, (int64_t[]){B * T}));
}

TEST(gpt_split_equals_whole)
{
    dt_model *m = t_create("gpt-micro", 5, NULL);
    ASSERT(m != NULL);
    size_t n = t_numel(m);
    float *ref = malloc(n * sizeof *ref);
    dt_ctx *c1, *c2;
    ASSERT_OK(dt_ctx_init(NULL, &c1));
    ASSERT_OK(dt_ctx_init(NULL, &c2));
    dt_hook_id hid;
    ASSERT_OK(dt_model_add_grad_ready_hook(m, count_hook, NULL, &hid));

    /* whole backwards of two micro-batches */
    dt_model_zero_grad(m);
    g_hooks = 0;
    ASSERT_OK(dt_backward(c1, gpt_loss(c1, m, 1)));
    ASSERT_OK(dt_backward(c2, gpt_loss(c2, m, 2)));
    int whole_hooks = g_hooks;
    ASSERT(whole_hooks > 0);
    memcpy(ref, t_grads(m), n * sizeof *ref);
    dt_ctx_reset(c1);
    dt_ctx_reset(c2);

    /* split, interleaved over two contexts */
    dt_model_zero_grad(m);
    g_hooks = 0;
    float one = 1.0f;
    dt_tensor g;
    dt_tensor_init_contiguous(&g, DT_F32, 0, NULL, &one);
    dt_tensor *l1 = gpt_loss(c1, m, 1), *l2 = gpt_loss(c2, m, 2);
    ASSERT_OK(dt_backward_input(c1, l1, &g));
    ASSERT_OK(dt_backward_input(c2, l2, &g));
    ASSERT_EQ_INT(g_hooks, 0);
    float mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabsf(t_grads(m)[i]) > mx ? fabsf(t_grads(m)[i]) : mx;
    ASSERT(mx == 0.0f); /* BI computed no parameter gradient */
    ASSERT_OK(dt_backward_weight(c1));
    ASSERT_OK(dt_backward_weight(c2));
    ASSERT_EQ_INT(g_hooks, whole_hooks);
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += t_grads(m)[i] != ref[i];
    ASSERT_EQ_INT((int)diff, 0);
    ASSERT_OK(dt_backward_weight(c1)); /* nothing queued any more: no change */
    ASSERT(memcmp(t_grads(m), ref, n * sizeof *ref) == 0);
    dt_ctx_free(c1);
    dt_ctx_free(c2);
    free(ref);
    dt_model_free(m);
}

TEST(checkpointed_blocks_split_equals_whole)
{
    dt_model *m = t_create("gpt-micro", 5, NULL);
    ASSERT(m != NULL);
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    int nck = 0;
    ASSERT_OK(dt_model_checkpoint_type(m, "GPT2Block", &p, &nck));
    ASSERT(nck > 0);
    size_t n = t_numel(m);
    float *ref = malloc(n * sizeof *ref);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_model_zero_grad(m);
    ASSERT_OK(dt_backward(ctx, gpt_loss(ctx, m, 3)));
    memcpy(ref, t_grads(m), n * sizeof *ref);
    dt_ctx_reset(ctx);

    dt_model_zero_grad(m);
    float one = 1.0f;
    dt_tensor g;
    dt_tensor_init_contiguous(&g, DT_F32, 0, NULL, &one);
    ASSERT_OK(dt_backward_input(ctx, gpt_loss(ctx, m, 3), &g));
    ASSERT_OK(dt_backward_weight(ctx));
    size_t diff = 0;
    float mx = 0;
    for (size_t i = 0; i < n; i++) {
        diff += t_grads(m)[i] != ref[i];
        mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
    }
    ASSERT_EQ_INT((int)diff, 0);
    ASSERT(mx > 0);
    dt_ctx_free(ctx);
    free(ref);
    dt_model_free(m);
}

TEST(stage_input_gradient_in_bi)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(6, 10, true));
    dt_nn_add(net, NULL, dt_nn_layernorm(10, 1e-5f));
    dt_nn_add(net, NULL, dt_nn_gelu());
    dt_nn_add(net, NULL, dt_nn_linear(10, 3, true));
    dt_model *m = t_build(net, 9);
    ASSERT(m != NULL);
    size_t n = t_numel(m);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xin[4 * 6], gout[4 * 3];
    for (int i = 0; i < 24; i++)
        xin[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    for (int i = 0; i < 12; i++)
        gout[i] = (float)((i * 5) % 7) / 3.0f - 1.0f;
    dt_tensor go;
    dt_tensor_init_contiguous(&go, DT_F32, 2, (int64_t[]){4, 3}, gout);
    float gx_ref[24], *ref = malloc(n * sizeof *ref);
    for (int pass = 0; pass < 2; pass++) {
        dt_model_zero_grad(m);
        dt_tensor *x = dt_tensor_view_of(ctx, xin, DT_F32, 2, (int64_t[]){4, 6});
        ASSERT_OK(dt_tensor_set_requires_grad(x, true));
        dt_tensor *y = dt_model_forward(ctx, m, x);
        if (pass == 0) {
            ASSERT_OK(dt_backward_with(ctx, y, &go));
            memcpy(gx_ref, x->grad->data, sizeof gx_ref);
            memcpy(ref, t_grads(m), n * sizeof *ref);
        } else {
            ASSERT_OK(dt_backward_input(ctx, y, &go));
            ASSERT(x->grad != NULL);
            ASSERT(memcmp(x->grad->data, gx_ref, sizeof gx_ref) == 0);
            ASSERT_OK(dt_backward_weight(ctx));
            ASSERT(memcmp(t_grads(m), ref, n * sizeof *ref) == 0);
            ASSERT(memcmp(x->grad->data, gx_ref, sizeof gx_ref) == 0); /* BW leaves the input alone */
        }
        dt_ctx_reset(ctx);
    }
    float mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fabsf(ref[i]) > mx ? fabsf(ref[i]) : mx;
    ASSERT(mx > 0);
    ASSERT(dt_backward_input(NULL, NULL, NULL) < 0);
    dt_ctx_free(ctx);
    free(ref);
    dt_model_free(m);
}

int main(void)
{
    RUN(gpt_split_equals_whole);
    RUN(checkpointed_blocks_split_equals_whole);
    RUN(stage_input_gradient_in_bi);
    return TEST_REPORT();
}
