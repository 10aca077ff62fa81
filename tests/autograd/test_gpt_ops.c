/* Finite-difference gradients of the transformer ops (attention over a
 * packed qkv, causal and not, with dropout; fused bias + GELU; addmm with
 * [in, out] weights; cross-entropy over rows wider than one vocabulary
 * chunk), and their bad-input errors. Same tolerances as test_gradcheck. */
#include "gradcheck.h"

typedef struct {
    bool causal;
    float p;
} attn_ud;

static dt_tensor *f_attn(dt_ctx *c, dt_tensor **in, void *u)
{
    const attn_ud *a = u;
    return dt_attention(c, in[0], 2, a->causal, a->p, true, dt_rng_key_make(3, DT_RNG_DROPOUT, 0, 1));
}

TEST(attention_causal)
{
    attn_ud u = {true, 0};
    dt_tensor *in[1] = {T(1, 2, 5, 18)};
    GRADCHECK("attention causal", 1, in, f_attn, &u, 1e-2);
}

TEST(attention_full_odd)
{
    attn_ud u = {false, 0};
    dt_tensor *in[1] = {T(2, 1, 7, 12)};
    GRADCHECK("attention", 1, in, f_attn, &u, 1e-2);
}

TEST(attention_dropout)
{
    attn_ud u = {true, 0.25f};
    dt_tensor *in[1] = {T(3, 2, 6, 12)};
    GRADCHECK("attention dropout", 1, in, f_attn, &u, 1e-2);
}

static dt_tensor *f_bias_gelu(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_bias_gelu_tanh(c, in[0], in[1]);
}

TEST(bias_gelu_tanh)
{
    dt_tensor *in[2] = {T(4, 3, 4, 9), T(5, 9)};
    GRADCHECK("bias_gelu_tanh", 2, in, f_bias_gelu, NULL, 1e-2);
}

static dt_tensor *f_addmm(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_addmm(c, in[0], in[1], in[2]);
}

TEST(addmm)
{
    dt_tensor *in[3] = {T(6, 2, 3, 5), T(7, 5, 4), T(8, 4)};
    GRADCHECK("addmm", 3, in, f_addmm, NULL, 1e-2);
}

static dt_tensor *f_xent(dt_ctx *c, dt_tensor **in, void *u)
{
    return dt_cross_entropy(c, in[0], u);
}

TEST(cross_entropy_wide)
{
    dt_tensor *lab = dt_tensor_new(DT_I64, 1, SH(3));
    int64_t *l = lab->data;
    l[0] = 4000, l[1] = 17, l[2] = 2999;
    dt_tensor *in[1] = {T(9, 3, 4100)};
    GRADCHECK("cross_entropy wide", 1, in, f_xent, lab, 1e-2);
    dt_tensor_free(lab);
}

TEST(bad_inputs)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *q = dt_tensor_new(DT_F32, 3, SH(1, 4, 12)), *w = dt_tensor_new(DT_F32, 2, SH(5, 4));
    dt_rng_key k = dt_rng_key_make(0, DT_RNG_DROPOUT, 0, 0);
    ASSERT(dt_attention(ctx, q, 5, true, 0, false, k) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "[1,4,12]");
    ASSERT(dt_attention(ctx, q, 2, true, 1.5f, true, k) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT(dt_attention(ctx, NULL, 2, true, 0, true, k) == NULL);
    ASSERT(dt_addmm(ctx, q, w, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_bias_gelu_tanh(ctx, q, w) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    dt_tensor_free(q);
    dt_tensor_free(w);
    dt_ctx_free(ctx);
}

int main(void)
{
    (void)gc_distinct;
    (void)gc_away_from_zero;
    RUN(attention_causal);
    RUN(attention_full_odd);
    RUN(attention_dropout);
    RUN(bias_gelu_tanh);
    RUN(addmm);
    RUN(cross_entropy_wide);
    RUN(bad_inputs);
    return TEST_REPORT();
}
