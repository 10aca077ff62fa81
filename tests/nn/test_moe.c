/* The mixture-of-experts blocks (models/moe.c) through dt_llama_create:
 * finite-difference gradients of the logits (against fixed random weights,
 * gradcheck.h) with respect to a router's weight, experts' projections, the
 * shared expert's gate and the embedding, for Mixtral's block (the weights
 * renormalised) and Qwen's (not renormalised; with Qwen2-MoE's shared
 * expert), on 6 tokens routed to 2 of 4 experts (so an expert can get
 * none); and the configuration checks. The routers' weights are drawn
 * large (8 times initializer_range 0.2) so that each token's routing
 * probabilities are far apart and a step of h changes no token's experts. */
#include "../autograd/gradcheck.h"
#include "test.h"

#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A 2-layer model with 4 experts, 2 a token, in each layer (Qwen: the second layer dense, and with shared a
 * shared expert). */
static dt_llama_config tiny(bool mixtral, bool shared)
{
    dt_llama_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 32, c.hidden_size = 16, c.intermediate_size = 24, c.num_hidden_layers = 2;
    c.num_attention_heads = 2, c.num_key_value_heads = 1, c.head_dim = 8, c.max_position_embeddings = 16;
    c.rms_norm_eps = 1e-6f, c.initializer_range = 0.2f, c.rope_theta = 10000.0, c.rope_factor = 1.0;
    c.num_experts = 4, c.num_experts_per_tok = 2, c.moe_intermediate_size = 8;
    c.norm_topk_prob = mixtral, c.moe_mixtral_names = mixtral;
    c.shared_expert_intermediate_size = shared ? 12 : 0;
    c.dense_layers[1] = !mixtral;
    return c;
}

typedef struct {
    dt_model *m;
    int64_t ids[6];
} moe_case;

static dt_tensor *logits(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    (void)in;
    moe_case *k = ud;
    return dt_model_forward(ctx, k->m, dt_tensor_view_of(ctx, k->ids, DT_I64, 2, (int64_t[]){1, 6}));
}

static dt_tensor *param(dt_model *m, const char *module)
{
    dt_module *mod = dt_model_find_module(m, module);
    if (!mod)
        fprintf(stderr, "no module %s\n", module);
    return mod ? dt_module_param(mod, 0) : NULL;
}

static void check(bool mixtral, bool shared)
{
    dt_llama_config c = tiny(mixtral, shared);
    dt_model_config mc = dt_model_config_default();
    mc.seq = 6;
    moe_case k = {.ids = {3, 17, 5, 30, 9, 3}};
    ASSERT_OK(dt_llama_create(&c, 7, &mc, &k.m, NULL));
    if (!k.m)
        return;
    dt_model_train(k.m, false);
    const char *blk = mixtral ? "model.layers.0.block_sparse_moe" : "model.layers.0.mlp";
    char a[128], b[128], d[128], e[128];
    snprintf(a, sizeof a, "%s.gate", blk);
    for (int l = 0; l < 2; l++) { /* the routers' logits spread out: the probabilities far apart */
        char r[128];
        snprintf(r, sizeof r, "model.layers.%d.%s.gate", l, mixtral ? "block_sparse_moe" : "mlp");
        dt_module *g = dt_model_find_module(k.m, r); /* (none in Qwen's dense layer 1) */
        dt_tensor *w = g ? dt_module_param(g, 0) : NULL;
        for (int64_t i = 0; w && i < dt_tensor_numel(w); i++)
            dt_tensor_set(w, i, 8.0 * dt_tensor_get(w, i));
    }
    snprintf(b, sizeof b, "%s.experts.1.%s", blk, mixtral ? "w1" : "gate_proj");
    snprintf(d, sizeof d, "%s.experts.2.%s", blk, mixtral ? "w2" : "down_proj");
    snprintf(e, sizeof e, "%s", shared ? "model.layers.0.mlp.shared_expert_gate" : "model.embed_tokens");
    dt_tensor *in[4] = {param(k.m, a), param(k.m, b), param(k.m, d), param(k.m, e)};
    ASSERT(in[0] && in[1] && in[2] && in[3]);
    if (in[0] && in[1] && in[2] && in[3]) {
        char name[64];
        snprintf(name, sizeof name, "%s%s", mixtral ? "mixtral" : "qwen", shared ? " shared expert" : "");
        ASSERT_EQ_INT(gradcheck(name, 4, in, logits, &k, 3e-3, 2e-3, 1e-2), 0);
    }
    dt_model_free(k.m);
}

TEST(mixtral_block_gradients) { check(true, false); }
TEST(qwen_block_gradients) { check(false, false); }
TEST(qwen2_shared_expert_gradients) { check(false, true); }

/* The experts' row counts change with the routing: a forward and backward
 * on other tokens creates no oneDNN primitive once the first has run (the
 * experts' products run marked varying, dt_ctx_set_varying), and the
 * context's setting is restored after the block. */
TEST(varying_rows_create_nothing)
{
    dt_llama_config c = tiny(true, false);
    dt_model_config mc = dt_model_config_default();
    mc.seq = 6;
    dt_model *m = NULL;
    ASSERT_OK(dt_llama_create(&c, 7, &mc, &m, NULL));
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    if (!m || !ctx) {
        dt_model_free(m);
        dt_ctx_free(ctx);
        return;
    }
    dt_model_train(m, true);
    static const int64_t ids[4][6] = {{3, 17, 5, 30, 9, 3}, {1, 1, 2, 8, 31, 0}, {12, 25, 7, 7, 19, 4},
                                      {30, 29, 28, 27, 26, 25}};
    dt_k_stats s0, s1;
    for (int i = 0; i < 4; i++) {
        if (i == 1)
            dt_k_stats_get(&s0);
        dt_tensor *x = dt_tensor_view_of(ctx, (void *)ids[i], DT_I64, 2, (int64_t[]){1, 6});
        dt_tensor *y = dt_model_forward(ctx, m, x);
        ASSERT(y != NULL);
        ASSERT(!dt_ctx_set_varying(ctx, false)); /* the block put the context's setting back */
        if (y)
            ASSERT_OK(dt_backward(ctx, dt_sum(ctx, y)));
        dt_model_zero_grad(m);
        dt_ctx_reset(ctx);
    }
    dt_k_stats_get(&s1);
    ASSERT_EQ_U64(s1.primitives_created - s0.primitives_created, 0);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* dt_llama_config_check's refusals, naming the key */
TEST(config_checks)
{
    dt_llama_config c = tiny(true, false);
    ASSERT_OK(dt_llama_config_check(&c));
    c.num_experts_per_tok = 5;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "num_experts_per_tok 5 is outside [1, num_experts 4]");
    c = tiny(true, false);
    c.moe_intermediate_size = 0;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "moe_intermediate_size");
    c = tiny(true, false);
    c.gemma = true;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "experts in a Phi-3, Gemma or OLMo 2 block");
}

int main(void)
{
    RUN(mixtral_block_gradients);
    RUN(qwen_block_gradients);
    RUN(qwen2_shared_expert_gradients);
    RUN(config_checks);
    RUN(varying_rows_create_nothing);
    return TEST_REPORT();
}
