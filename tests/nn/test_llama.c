/* The Llama-family decoder of the zoo: Hugging Face's names and shapes,
 * the parameter count formula, init statistics, a tied head stored once,
 * training that lowers the loss, activation checkpointing bit for bit,
 * meta builds with the same layout, and greedy generation. Parity with
 * transformers itself is test_hf_parity (golden files). */
#include "model_util.h"
#include "test.h"

#include "dtrain/autograd.h"

#include <math.h>
#include <stdlib.h>

static size_t count_formula(const dt_llama_config *c)
{
    size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden_size, L = (size_t)c->num_hidden_layers;
    size_t H = (size_t)c->num_attention_heads, KV = (size_t)c->num_key_value_heads, hd = (size_t)c->head_dim;
    size_t I = (size_t)c->intermediate_size;
    return V * C + L * (2 * C * H * hd + 2 * C * KV * hd + 3 * C * I + 2 * C) + C + (c->tie_word_embeddings ? 0 : V * C);
}

static void expect_shape(const dt_model *m, const char *name, int64_t d0, int64_t d1)
{
    int64_t i = dt_model_find_entry(m, name);
    if (i < 0) {
        TEST_FAIL_("no entry %s", name);
        return;
    }
    dt_param_info pi;
    ASSERT_OK(dt_model_entry(m, (size_t)i, &pi));
    ASSERT_EQ_INT(pi.ndim, d1 ? 2 : 1);
    ASSERT_EQ_INT((int)pi.shape[0], (int)d0);
    if (d1)
        ASSERT_EQ_INT((int)pi.shape[1], (int)d1);
}

TEST(names_and_count)
{
    dt_model *m;
    dt_model_desc d;
    ASSERT_OK(dt_model_create("llama-tiny", 1, NULL, &m, &d));
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    expect_shape(m, "model.embed_tokens.weight", 512, 64);
    expect_shape(m, "model.layers.0.self_attn.q_proj.weight", 64, 64);
    expect_shape(m, "model.layers.0.self_attn.k_proj.weight", 32, 64);
    expect_shape(m, "model.layers.1.self_attn.v_proj.weight", 32, 64);
    expect_shape(m, "model.layers.1.self_attn.o_proj.weight", 64, 64);
    expect_shape(m, "model.layers.1.mlp.gate_proj.weight", 176, 64);
    expect_shape(m, "model.layers.1.mlp.up_proj.weight", 176, 64);
    expect_shape(m, "model.layers.1.mlp.down_proj.weight", 64, 176);
    expect_shape(m, "model.layers.0.input_layernorm.weight", 64, 0);
    expect_shape(m, "model.layers.0.post_attention_layernorm.weight", 64, 0);
    expect_shape(m, "model.norm.weight", 64, 0);
    expect_shape(m, "lm_head.weight", 512, 64);
    ASSERT(dt_model_find_entry(m, "model.layers.0.self_attn.q_proj.bias") < 0);
    ASSERT_EQ_U64(dt_model_param_count(m), count_formula(&c));
    ASSERT_STR_EQ(d.ckpt_unit, "LlamaDecoderLayer");
    ASSERT_EQ_INT((int)d.input_shape[0], 128);
    /* init: Linear and embedding N(0, 0.02), norms 1 */
    dt_param_info pi;
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "model.layers.0.mlp.up_proj.weight"), &pi));
    double s = 0, s2 = 0;
    for (size_t i = 0; i < pi.numel; i++) {
        double v = dt_tensor_get(pi.tensor, (int64_t)i);
        s += v, s2 += v * v;
    }
    double sd = sqrt(s2 / (double)pi.numel - (s / (double)pi.numel) * (s / (double)pi.numel));
    ASSERT_NEAR(sd, 0.02, 0.002, 0);
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "model.norm.weight"), &pi));
    ASSERT_NEAR(dt_tensor_get(pi.tensor, 7), 1.0, 0, 0);
    dt_model_free(m);
    /* the ~100M configuration, tied (meta: layout only) */
    ASSERT_OK(dt_llama_config_by_name("llama-100m", &c));
    dt_model_config mc = dt_model_config_default();
    mc.build.meta = true;
    ASSERT_OK(dt_model_create("llama-100m", 1, &mc, &m, NULL));
    ASSERT_EQ_U64(dt_model_param_count(m), count_formula(&c));
    ASSERT_EQ_U64(dt_model_param_count(m), 100092672);
    int64_t lm = dt_model_find_entry(m, "lm_head.weight");
    ASSERT(lm >= 0);
    ASSERT_OK(dt_model_entry(m, (size_t)lm, &pi));
    ASSERT_EQ_INT((int)pi.tied_to, (int)dt_model_find_entry(m, "model.embed_tokens.weight"));
    dt_model_free(m);
}

/* Loss of a fixed batch (B 2, T 16) of model m, with backward when grad. */
static double batch_loss(dt_model *m, const dt_model_desc *d, bool grad)
{
    dt_ctx *ctx;
    if (dt_ctx_init(NULL, &ctx) < 0)
        return NAN;
    int64_t ids[2 * 17];
    for (int i = 0; i < 34; i++)
        ids[i] = (i * 37 + 11) % 512;
    int64_t x[32], y[32];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 16; t++)
            x[b * 16 + t] = ids[b * 17 + t], y[b * 16 + t] = ids[b * 17 + t + 1];
    dt_ag_set_enabled(ctx, grad);
    dt_tensor *xt = dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){2, 16});
    dt_tensor *yt = dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){2, 16});
    dt_tensor *loss = dt_model_desc_loss(ctx, d, dt_model_forward(ctx, m, xt), yt);
    double v = loss ? dt_tensor_get(loss, 0) : NAN;
    if (loss && grad && dt_backward(ctx, loss) < 0)
        v = NAN;
    dt_ctx_free(ctx);
    return v;
}

TEST(trains)
{
    dt_model_config mc = dt_model_config_default();
    mc.seq = 16;
    dt_model *m;
    dt_model_desc d;
    ASSERT_OK(dt_model_create("llama-tiny", 3, &mc, &m, &d));
    double first = batch_loss(m, &d, false);
    ASSERT_NEAR(first, log(512.0), 0.1, 0); /* small init: near uniform */
    double last = first;
    for (int step = 0; step < 30; step++) {
        dt_model_zero_grad(m);
        last = batch_loss(m, &d, true);
        ASSERT(isfinite(last));
        float *p = t_params(m), *g = t_grads(m);
        for (size_t i = 0; i < t_numel(m); i++)
            p[i] -= 0.5f * g[i];
    }
    ASSERT(last < first - 1.0);
    /* activation checkpointing: the same loss and gradients bit for bit */
    dt_model_zero_grad(m);
    double a = batch_loss(m, &d, true);
    float *g0 = malloc(t_numel(m) * sizeof(float));
    memcpy(g0, t_grads(m), t_numel(m) * sizeof(float));
    int n = 0;
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    ASSERT_OK(dt_model_desc_checkpoint(m, &d, &ap, &n));
    ASSERT_EQ_INT(n, 2);
    dt_model_zero_grad(m);
    double b = batch_loss(m, &d, true);
    ASSERT(a == b);
    ASSERT(memcmp(g0, t_grads(m), t_numel(m) * sizeof(float)) == 0);
    free(g0);
    /* greedy generation: deterministic, tokens in range */
    dt_model_desc_checkpoint(m, &d, NULL, NULL);
    dt_generate_params gp = dt_generate_params_default();
    gp.temperature = 0;
    gp.max_new_tokens = 8;
    int64_t prompt[3] = {11, 48, 85}, o1[16], o2[16], n1, n2;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, o1, 16, &n1));
    ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, o2, 16, &n2));
    ASSERT_EQ_INT((int)n1, 11);
    ASSERT(memcmp(o1, o2, sizeof(int64_t) * 11) == 0);
    for (int i = 0; i < 11; i++)
        ASSERT(o1[i] >= 0 && o1[i] < 512);
    dt_model_free(m);
}

/* A tied head is one storage; a meta build has the same layout as a full
 * one and dt_model_init_range gives the same values. */
TEST(tied_and_meta)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.tie_word_embeddings = true;
    c.attention_bias = true, c.qkv_bias_only = true; /* Qwen2's q/k/v biases */
    dt_model *m, *mm;
    ASSERT_OK(dt_llama_create(&c, 5, NULL, &m, NULL));
    dt_model_config mc = dt_model_config_default();
    mc.build.meta = true;
    ASSERT_OK(dt_llama_create(&c, 5, &mc, &mm, NULL));
    ASSERT(dt_model_find_entry(m, "model.layers.0.self_attn.q_proj.bias") >= 0);
    ASSERT(dt_model_find_entry(m, "model.layers.0.self_attn.o_proj.bias") < 0);
    ASSERT_EQ_U64(dt_model_param_count(m), count_formula(&c) + 2 * (64 + 32 + 32));
    const dt_flat *f = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    dt_flat sh;
    ASSERT_OK(dt_flat_alloc_shard(&sh, dt_model_flat(mm, DT_FLAT_PARAMS, DT_F32), 1, 2, NULL));
    memset(sh.base, 0x7f, dt_flat_nbytes(&sh));
    ASSERT_OK(dt_model_init_range(mm, DT_INIT_PHILOX, 5, &sh));
    ASSERT(memcmp(sh.base, dt_flat_ptr(f, sh.offset), dt_flat_nbytes(&sh)) == 0);
    dt_flat_free(&sh);
    dt_model_free(mm);
    dt_model_free(m);
    /* configuration errors name the key */
    c.num_key_value_heads = 3;
    ASSERT_STATUS(dt_llama_create(&c, 5, NULL, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "num_key_value_heads");
    /* a dropout outside [0, 1): refused by name */
    c.num_key_value_heads = 2;
    mc = dt_model_config_default();
    mc.dropout = 1.0f;
    ASSERT_STATUS(dt_llama_create(&c, 5, &mc, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "dropout 1");
    c.attention_dropout = -0.5;
    ASSERT_STATUS(dt_llama_create(&c, 5, NULL, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "attention_dropout");
}

/* The attention's dropout (transformers' attention_dropout; the model config's dropout for a Llama): a Dropout
 * child keys each attention's masks (none without dropout: the same modules and random-stream state); in eval the
 * model's bits without it; in training each forward draws new masks; recomputation under activation checkpointing
 * draws the same ones (loss and gradients bit for bit); config.json's attention_dropout builds the same model */
TEST(attention_dropout)
{
    dt_model_config mc = dt_model_config_default();
    mc.seq = 16;
    dt_model *m0, *m1;
    dt_model_desc d0, d1;
    ASSERT_OK(dt_model_create("llama-tiny", 3, &mc, &m0, &d0));
    mc.dropout = 0.3f;
    ASSERT_OK(dt_model_create("llama-tiny", 3, &mc, &m1, &d1));
    ASSERT(dt_model_find_module(m1, "model.layers.1.self_attn.attn_dropout") != NULL);
    ASSERT(dt_model_find_module(m0, "model.layers.1.self_attn.attn_dropout") == NULL);
    ASSERT(dt_model_rng_state_size(m1) > dt_model_rng_state_size(m0));
    dt_model_train(m0, false);
    dt_model_train(m1, false);
    const double e0 = batch_loss(m0, &d0, false), e1 = batch_loss(m1, &d1, false);
    ASSERT(e0 == e1); /* eval: no dropout */
    dt_model_train(m1, true);
    const double t1 = batch_loss(m1, &d1, false), t2 = batch_loss(m1, &d1, false);
    ASSERT(isfinite(t1) && t1 != e1 && t2 != t1);
    /* checkpointing: the same masks when the layers are recomputed */
    uint64_t rs[64];
    const size_t nrs = dt_model_rng_state_size(m1);
    ASSERT(nrs <= 64);
    ASSERT_OK(dt_model_get_rng_state(m1, rs, nrs));
    dt_model_zero_grad(m1);
    const double a = batch_loss(m1, &d1, true);
    float *g0 = malloc(t_numel(m1) * sizeof(float));
    ASSERT(g0 != NULL);
    memcpy(g0, t_grads(m1), t_numel(m1) * sizeof(float));
    int n = 0;
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    ASSERT_OK(dt_model_desc_checkpoint(m1, &d1, &ap, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT_OK(dt_model_set_rng_state(m1, rs, nrs));
    dt_model_zero_grad(m1);
    const double b = batch_loss(m1, &d1, true);
    ASSERT(a == b && a != e1);
    ASSERT_EQ_INT(memcmp(g0, t_grads(m1), t_numel(m1) * sizeof(float)), 0);
    free(g0);
    /* the same model from dt_llama_config's attention_dropout */
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.attention_dropout = 0.3f; /* the float the model config carried */
    dt_model_config mc2 = dt_model_config_default();
    mc2.seq = 16;
    dt_model *m2;
    dt_model_desc d2;
    ASSERT_OK(dt_llama_create(&c, 3, &mc2, &m2, &d2));
    ASSERT_OK(dt_model_set_rng_state(m2, rs, nrs));
    ASSERT_OK(dt_model_set_rng_state(m1, rs, nrs));
    const double c1 = batch_loss(m1, &d1, false), c2 = batch_loss(m2, &d2, false);
    ASSERT(c1 == c2);
    dt_model_free(m2);
    dt_model_free(m1);
    dt_model_free(m0);
}

int main(void)
{
    RUN(names_and_count);
    RUN(trains);
    RUN(attention_dropout);
    RUN(tied_and_meta);
    return TEST_REPORT();
}
