/* Llama-family decoders (Touvron et al. 2023) as Hugging Face's
 * LlamaForCausalLM names them, built on the public API only:
 *
 *   x = embed_tokens[idx]                                        (B, T, C)
 *   per layer:  h = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))),
 *                   n = input_layernorm(x)                        (RMSNorm)
 *               y = h + down_proj(silu(gate_proj(m)) * up_proj(m)),
 *                   m = post_attention_layernorm(h)
 *   logits = lm_head(norm(x))                                    (B, T, V)
 *
 * Attention: q has H heads of hd, k and v KV heads (grouped-query
 * attention: query head h reads kv head h / (H / KV)); RoPE in the
 * rotate-half layout with the configuration's inverse frequencies
 * (dt_llama_inv_freq: theta, linear or llama3 scaling); dt_gqa_pack lays
 * q | k | v out for the blocked causal attention kernel, whose scale is
 * 1/sqrt(hd). Linear weights are [out, in] (dt_linear). Init is
 * transformers' _init_weights: every Linear and the embedding N(0,
 * initializer_range), biases 0, norms 1, no residual rescaling. With
 * PyTorch's stream (dt_model_init_torch) the draws are transformers'
 * LlamaForCausalLM(config) after torch.manual_seed (torch_order below).
 *
 * Phi-3 (dt_llama_config.fused; transformers' Phi3ForCausalLM): the
 * Llama block with q | k | v from one Linear qkv_proj and gate | up from
 * one gate_up_proj, split by columns of their output (narrow); the
 * parameters keep transformers' names, so checkpoints, LoRA targets and
 * exports need no renaming. Phi-3.5 and Phi-4-mini: RoPE on the first
 * rotary_dim values of each head (partial_rotary_factor) and LongRoPE
 * (short or long factors by the forward's sequence length, cos and sin
 * times the attention factor; dt_rope_partial).
 *
 * Gemma (dt_llama_config.gemma; transformers' GemmaForCausalLM): x is
 * embed_tokens[idx] * sqrt(C) (the factor rounded to the embeddings'
 * dtype), every RMSNorm multiplies by (1 + weight) in f32 (GemmaRMSNorm,
 * weights initialised to 0) and the MLP is down_proj(gelu_tanh(gate_proj(m))
 * * up_proj(m)); the rest (GQA, RoPE, 1/sqrt(hd)) is the Llama block's.
 * Gemma 2 (gemma2): the attention and the MLP each between a norm before
 * and a norm after (the latter before the residual add), the attention's
 * scale query_pre_attn_scalar^-1/2, the scores and the logits optionally
 * soft-capped, sliding layers beside full ones. Gemma 3 (with qk_norm and
 * rope_local_theta): Gemma 2's block with Gemma's norm on each head of q
 * and k before RoPE, and the sliding layers rotating with their own base
 * (rope_local_base_freq, unscaled), the full ones with rope_theta and the
 * scaling.
 *
 * Context parallel (dt_model_config.cp; cp.h): the model keeps the rank's
 * rows of the whole [B, T] ids, RoPE rotates them at their global
 * positions (dt_rope_at), attention is dt_cp_attention_ex over the
 * packed q | k | v (GQA's kv heads repeated first; the layer's sliding
 * window, soft cap and dropout), the rest runs on the rows.
 *
 * OLMo 2 (dt_llama_config.olmo2; transformers' Olmo2ForCausalLM): no
 * norm before attention and MLP; each output normalized before its
 * residual add (post_attention_layernorm, post_feedforward_layernorm), q
 * and k normalized over their whole projections before RoPE (under tensor
 * parallelism each rank normalizes its heads' columns by the whole rows'
 * statistics: dt_tp_rms_norm).
 *
 * SmolLM3 (transformers' SmolLM3ForCausalLM): the Llama block, its NoPE
 * layers (nope_layers; every fourth by default) attending without RoPE.
 *
 * Granite (transformers' GraniteForCausalLM): the Llama block with the
 * embeddings times embedding_multiplier, each attention and MLP output
 * times residual_multiplier before its residual add, the attention's scale
 * attention_multiplier (q times it and sqrt(hd), the kernels dividing by
 * sqrt(hd)), and the logits divided by logits_scaling (the final norm's
 * output, before the linear head).
 *
 * Tensor parallel (dt_model_config.tp over t ranks, Megatron's split in
 * the [out, in] layout of the Linear weights; tp.h): q_proj, k_proj,
 * v_proj, gate_proj and up_proj are column-parallel (the rank's out/t
 * rows of the weight and of the bias), o_proj and down_proj
 * row-parallel (the rank's in/t columns; a bias whole, added once after
 * the reduction). The attention's input goes through f once, its output
 * through g once (o_proj), the MLP's alike: one all-reduce each way per
 * half-block. Phi-3's qkv_proj and gate_up_proj are column-parallel per
 * block: the rank holds its rows of q, of k and of v (of gate and of up),
 * side by side (dt_nn_param_spec.tp_chunk_rows: H hd, KV hd, KV hd).
 * Rank r computes query heads [r H/t, (r + 1) H/t) and
 * key/value heads [r KV/t, (r + 1) KV/t): query head h reads kv head
 * h / (H / KV), which is the rank's, so GQA and RoPE run per local head
 * unchanged (H and KV divisible by t, else DT_ERR_INVALID_ARG naming the
 * key). The embedding and the head split the vocabulary
 * (dt_tp_vocab_embedding, dt_tp_vocab_head; the loss is the
 * vocabulary-parallel cross-entropy). The parameters keep their global
 * names with the rank's shapes, so checkpoints are the one-process ones. */
#include "zoo.h"

#include <dtrain/tp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A cached generation step (dt__llama_kv_forward): the cache and the
 * decoder layer whose attention runs next. */
typedef struct {
    dt__kv_cache *c;
    int layer;
} kv_step;

struct llama_rt;

/* A layer's attention's view of the runtime config: its sliding window */
typedef struct {
    const struct llama_rt *rt;
    int64_t window; /* > 0: query i sees the keys (i - window, i]; 0: every earlier one */
    bool local;     /* RoPE with the sliding layers' base (rope_local_theta: Gemma 3's sliding layers) */
    bool nope;      /* no RoPE: q and k as projected (nope_layers: SmolLM3's NoPE layers) */
} attn_ud;

/* What the forwards read: the root owns it (dt_nn_custom_owned), the
 * modules borrow it (the attention modules their attn_ud in it). */
typedef struct llama_rt {
    dt_llama_config c;
    attn_ud *attn;   /* each layer's (num_hidden_layers of them) */
    float *inv_freq; /* rotary width / 2 (hd / 2 without a partial rotary factor) */
    float *inv_long; /* longrope's past original_max_position_embeddings, else NULL */
    float *inv_local; /* the sliding layers' (rope_local_theta), else NULL */
    dt_cp_params cp; /* context parallelism: group NULL for none */
    dt_pg *sp;       /* sequence parallelism: the tensor-parallel group (between the attention and the MLP the
                        residual stream holds the rank's T/t rows); NULL for none */
    kv_step *kv;     /* set during a cached generation step only */
} llama_rt;

/* ---- sequence parallelism (Korthikanti et al.; tp.h), as GPT-2's ----
 * Between the attention and the MLP the residual stream holds the rank's
 * rows of the sequence, [B, T/t, C]: the norms and the residual adds run
 * on them. Entering the attention and the MLP, dt_tp_sp_gather (backward:
 * reduce-scatter) replaces f, with the projections' products (project:
 * dt_tp_sp_gather_products, the gathered rows gathered again for the
 * weights' gradients, not kept); leaving, o_proj's and down_proj's partial
 * products are reduce-scattered over the rows (backward: all-gather) in
 * place of g's all-reduce. The norms' weights and the row-parallel biases,
 * whole on every rank, see only its rows: they enter through f, whose
 * backward sums their gradients over the group. The embeddings are split
 * after the lookup (dt_tp_sp_scatter), and the final norm's output
 * gathered for the vocabulary-parallel head, which then takes no f. */

/* f on x when the block's projections are column-parallel (their group); under sequence parallelism the
 * all-gather of the rank's rows (backward: the reduce-scatter) in its place */
static dt_tensor *enter(dt_ctx *ctx, const llama_rt *rt, dt_module *proj, dt_tensor *x)
{
    if (rt && rt->sp)
        return dt_tp_sp_gather(ctx, rt->sp, x, 1);
    dt_pg *tp = dt_tp_module_group(proj);
    return tp ? dt_tp_copy_to_region(ctx, tp, x) : x;
}

/* The column-parallel projections p[0..n) of x into y[0..n): each module on enter's x, or under sequence
 * parallelism, when no hook or adapter looks at them, their weights' products on the gathered rows
 * (dt_tp_sp_gather_products: the gathered rows are not kept for backward) */
static dt_status project(dt_ctx *ctx, const llama_rt *rt, dt_tensor *x, int n, dt_module *const *p, dt_tensor **y)
{
    bool products = rt && rt->sp;
    for (int i = 0; i < n && products; i++)
        products = dt_module_tree_plain(p[i]);
    if (products) {
        dt_tensor *w[3], *b[3];
        for (int i = 0; i < n; i++) {
            w[i] = dt_module_param(p[i], 0);
            b[i] = dt_module_num_params(p[i]) > 1 ? dt_module_param(p[i], 1) : NULL;
        }
        return dt_tp_sp_gather_products(ctx, rt->sp, x, 1, n, w, b, false, y);
    }
    x = enter(ctx, rt, p[0], x);
    for (int i = 0; i < n; i++)
        if (!(y[i] = dt_module_forward(ctx, p[i], x)))
            return dt_last_status();
    return DT_OK;
}

/* Gemma's norm weight 1 + w in f32 (w stored around 0) */
static dt_tensor *gemma_weight(dt_ctx *ctx, dt_tensor *w);

/* A block's or the final norm (LlamaRMSNorm, GemmaRMSNorm) on x; under sequence parallelism its weight through f */
static dt_tensor *norm_fwd(dt_ctx *ctx, const llama_rt *rt, dt_module *norm, dt_tensor *x)
{
    if (!rt->sp)
        return dt_module_forward(ctx, norm, x);
    dt_tensor *w = dt_tp_copy_to_region(ctx, rt->sp, dt_module_param(norm, 0));
    return x && w ? dt_rms_norm(ctx, x, rt->c.gemma ? gemma_weight(ctx, w) : w, rt->c.rms_norm_eps) : NULL;
}

/* o_proj or down_proj (row-parallel) on the rank's columns x: under sequence parallelism the partial products
 * reduce-scattered over the rows, then the bias (through f) and the rank's rows of its LoRA adapters' output;
 * else the module (g's all-reduce) */
static dt_tensor *leave(dt_ctx *ctx, const llama_rt *rt, dt_module *proj, dt_tensor *x)
{
    if (!rt || !rt->sp)
        return dt_module_forward(ctx, proj, x);
    dt_tensor *y = dt_tp_sp_reduce_scatter_partial(ctx, rt->sp, dt_linear(ctx, x, dt_module_param(proj, 0), NULL), 1);
    if (dt_module_num_params(proj) > 1)
        y = dt_add(ctx, y, dt_tp_copy_to_region(ctx, rt->sp, dt_module_param(proj, 1)));
    return dt_tp_sp_lora(ctx, proj, x, y, rt->sp); /* its LoRA adapters, if any */
}

static void rt_free(void *p)
{
    llama_rt *rt = p;
    if (rt)
        free(rt->inv_freq), free(rt->inv_long), free(rt->inv_local), free(rt->attn);
    free(rt);
}

static dt_module *child(dt_module *m, const char *name) { return dt_module_find_child(m, name); }

/* ---- tensor-parallel Linears ([out, in] weights; tp.h's are [in, out]) ----
 * The column form computes x W_r^T + b_r on x that already went through f
 * (the attention's or the MLP's forward applies f once for its
 * projections); the row form g(x_r W_r^T) + b. ud: the group. */
static dt_tensor *col_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    return dt_linear(ctx, x, dt_module_param(self, 0), dt_module_num_params(self) > 1 ? dt_module_param(self, 1) : NULL);
}

static dt_tensor *row_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    dt_tensor *y = dt_tp_reduce_partial(ctx, ud, dt_linear(ctx, x, dt_module_param(self, 0), NULL));
    return dt_module_num_params(self) > 1 ? dt_add(ctx, y, dt_module_param(self, 1)) : y;
}

/* A Linear [out, in] split over tp along out (column) or in (row), init
 * N(0, std), biases 0. rows (a column layer whose output is nrows blocks,
 * Phi-3's q | k | v and gate | up; NULL: one): each block's size, each
 * split over the ranks (the rank's slice of each, side by side). */
static dt_module *tp_linear(dt_pg *tp, int64_t in, int64_t out, bool bias, float std, bool column,
                            const int64_t *rows, int nrows)
{
    const int64_t t = dt_pg_size(tp);
    dt_nn_param_spec s[2] = {
        {.name = "weight", .ndim = 2, .shape = {column ? out / t : out, column ? in : in / t},
         .init = DT_NN_INIT_NORMAL, .a = std, .tp_dim = column ? 1 : 2, .tp_chunks = rows ? nrows : 0},
        {.name = "bias", .ndim = 1, .shape = {column ? out / t : out}, .init = DT_NN_INIT_ZEROS,
         .tp_dim = column ? 1 : 0, .tp_chunks = rows ? nrows : 0},
    };
    for (int k = 0; rows && k < nrows && k < DT_TP_MAX_CHUNKS; k++)
        s[0].tp_chunk_rows[k] = s[1].tp_chunk_rows[k] = rows[k];
    dt_module *m = dt_nn_custom(column ? "LlamaColumnParallelLinear" : "LlamaRowParallelLinear", bias ? 2 : 1, s,
                                column ? col_forward : row_forward, tp);
    if (m && (dt_tp_module_set_group(m, tp) < 0 || dt_tp_lora_linear(m, tp, in, out, column, true) < 0)) {
        dt_module_free(m);
        return NULL;
    }
    return m;
}

static int tp_size_of(const dt_module *proj)
{
    const dt_pg *tp = dt_tp_module_group(proj);
    return tp ? dt_pg_size(tp) : 1;
}

static dt_tensor *gemma_weight(dt_ctx *ctx, dt_tensor *w)
{
    dt_tensor *one = w ? dt_tensor_full(ctx, DT_F32, 1, w->shape, 1.0) : NULL;
    return one ? dt_add(ctx, w->dtype == DT_F32 ? w : dt_cast(ctx, w, DT_F32), one) : NULL;
}

/* norm (an RMSNorm over hd, eps; Gemma's with gemma) on each of the n heads
 * of x [B, T, n hd]. Under tensor parallelism (tp: the projections' group)
 * each rank has its own heads, so the weight's gradient is a part of the
 * whole: the weight enters through f, whose backward sums it over the group
 * (transformers' "replicated_with_grad_allreduce" for Qwen3's and Gemma 3's
 * q_norm and k_norm). */
static dt_tensor *head_norm(dt_ctx *ctx, dt_module *norm, dt_pg *tp, const dt_llama_config *c, dt_tensor *x, int n)
{
    if (!x)
        return NULL;
    const int64_t B = x->shape[0], T = x->shape[1], hd = c->head_dim;
    dt_tensor *x4 = dt_reshape(ctx, x, 4, (int64_t[]){B, T, n, hd}), *y;
    if (tp) {
        dt_tensor *w = dt_tp_copy_to_region(ctx, tp, dt_module_param(norm, 0));
        y = dt_rms_norm(ctx, x4, c->gemma ? gemma_weight(ctx, w) : w, c->rms_norm_eps);
    } else {
        y = dt_module_forward(ctx, norm, x4);
    }
    return dt_reshape(ctx, y, 3, (int64_t[]){B, T, n * hd});
}

/* ud: the layer's attn_ud (borrowed from the root's runtime config) */
static dt_tensor *attn_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const attn_ud *a = ud;
    const llama_rt *rt = a->rt;
    const int t = tp_size_of(child(self, rt->c.fused ? "qkv_proj" : "q_proj")); /* the rank's heads */
    const int H = (int)rt->c.num_attention_heads / t, KV = (int)rt->c.num_key_value_heads / t;
    dt_tensor *q, *k, *v;
    if (rt->c.fused) { /* Phi-3: q | k | v from qkv_proj's columns (the rank's heads of each) */
        const int64_t hd = rt->c.head_dim;
        dt_tensor *qkv = NULL;
        project(ctx, rt, x, 1, (dt_module *[]){child(self, "qkv_proj")}, &qkv);
        q = dt_contiguous(ctx, dt_narrow(ctx, qkv, 2, 0, H * hd));
        k = dt_contiguous(ctx, dt_narrow(ctx, qkv, 2, H * hd, KV * hd));
        v = dt_contiguous(ctx, dt_narrow(ctx, qkv, 2, (H + KV) * hd, KV * hd));
    } else {
        dt_tensor *y[3] = {NULL, NULL, NULL};
        project(ctx, rt, x, 3, (dt_module *[]){child(self, "q_proj"), child(self, "k_proj"), child(self, "v_proj")},
                y);
        q = y[0], k = y[1], v = y[2];
    }
    if (rt->c.olmo2 || rt->c.whole_qk_norm) { /* OLMo 2, OLMoE: q and k normalized over their whole projections */
        q = dt_module_forward(ctx, child(self, "q_norm"), q);
        k = dt_module_forward(ctx, child(self, "k_norm"), k);
    }
    if (rt->c.qk_norm) { /* Qwen3, Gemma 3: each head's hd normalized */
        dt_pg *tp = dt_tp_module_group(child(self, "q_proj"));
        q = head_norm(ctx, child(self, "q_norm"), tp, &rt->c, q, H);
        k = head_norm(ctx, child(self, "k_norm"), tp, &rt->c, k, KV);
    }
    const int64_t *pos = NULL;
    if (rt->cp.group && q) { /* the rank's rows: RoPE at their global positions */
        dt_cp_layout l;
        if (dt_cp_layout_of(&rt->cp, q->shape[1] * dt_pg_size(rt->cp.group), &l) < 0)
            return NULL;
        int64_t *p = dt_ctx_alloc(ctx, (size_t)l.local_len * sizeof *p);
        if (!p)
            return NULL;
        for (int64_t i = 0; i < l.local_len; i++)
            p[i] = dt_cp_position(&l, i);
        pos = p;
    }
    kv_step *kv = rt->kv; /* generation with the cache: the new rows follow the cached positions */
    /* the sequence's length (its last position + 1): longrope's frequencies depend on it */
    const int64_t rows = q ? q->shape[1] : 0, len = kv ? kv->c->len + rows
                                                : rt->cp.group ? rows * dt_pg_size(rt->cp.group) : rows;
    /* Gemma 3's sliding layers: their own base, unscaled */
    const float *inv = a->local ? rt->inv_local
                       : rt->inv_long && len > rt->c.rope_original_max_position_embeddings ? rt->inv_long
                                                                                          : rt->inv_freq;
    const float scale = !a->local && (rt->c.rope_type == DT_ROPE_LONGROPE || rt->c.rope_type == DT_ROPE_YARN)
                            ? (float)rt->c.rope_attention_factor : 1.0f;
    if (!a->nope) {
        q = dt_rope_partial(ctx, q, H, rt->c.rotary_dim, inv, scale, kv ? kv->c->len : 0, pos);
        k = dt_rope_partial(ctx, k, KV, rt->c.rotary_dim, inv, scale, kv ? kv->c->len : 0, pos);
    }
    /* Granite's attention_multiplier, Gemma 2's query_pre_attn_scalar^-1/2: the kernels' 1/sqrt(hd) undone on q */
    const double am = rt->c.attention_multiplier != 0.0 ? rt->c.attention_multiplier
                      : rt->c.query_pre_attn_scalar > 0.0 ? 1.0 / sqrt(rt->c.query_pre_attn_scalar) : 0.0;
    const float qs = am != 0.0 ? (float)(am * sqrt((double)rt->c.head_dim)) : 1.0f;
    if (q && qs != 1.0f)
        q = dt_scale(ctx, q, qs);
    if (kv)
        return dt_module_forward(ctx, child(self, "o_proj"), dt__kv_attention(ctx, kv->c, kv->layer++, q, k, v, H, KV));
    dt_tensor *qkv = dt_gqa_pack(ctx, q, k, v, H, KV);
    /* causal, the layer's sliding window, Gemma 2's soft cap and the attention's dropout on the rank's heads of
       the layer (tensor parallel: their part of the one-process mask; the key is the same on every rank) */
    dt_attention_spec s = {.n_head = H, .heads_total = H * t, .causal = true, .window = a->window,
                           .softcap = (float)rt->c.attn_logit_softcapping};
    dt_module *drop = child(self, "attn_dropout");
    if (drop) {
        dt_pg *tp = dt_tp_module_group(child(self, rt->c.fused ? "qkv_proj" : "q_proj"));
        s.head0 = tp ? dt_pg_rank(tp) * H : 0;
        s.dropout_p = (float)rt->c.attention_dropout;
        s.training = dt_module_is_training(drop);
        s.key = dt_module_dropout_key(drop);
    }
    dt_tensor *y = rt->cp.group ? dt_cp_attention_ex(ctx, &rt->cp, qkv, &s) : dt_attention_ex(ctx, qkv, &s);
    return leave(ctx, rt, child(self, "o_proj"), y);
}

/* ud: the runtime config (borrowed from the root) */
static dt_tensor *mlp_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const llama_rt *rt = ud;
    dt_tensor *g, *u;
    if (rt->c.fused) { /* Phi-3: gate | up from gate_up_proj's columns (the rank's share of each) */
        const int64_t I = rt->c.intermediate_size / tp_size_of(child(self, "gate_up_proj"));
        dt_tensor *gu = NULL;
        project(ctx, rt, x, 1, (dt_module *[]){child(self, "gate_up_proj")}, &gu);
        g = dt_contiguous(ctx, dt_narrow(ctx, gu, 2, 0, I));
        u = dt_contiguous(ctx, dt_narrow(ctx, gu, 2, I, I));
    } else {
        dt_tensor *y[2] = {NULL, NULL};
        project(ctx, rt, x, 2, (dt_module *[]){child(self, "gate_proj"), child(self, "up_proj")}, y);
        g = y[0], u = y[1];
    }
    dt_tensor *a = rt && rt->c.gemma ? dt_mul(ctx, dt_gelu_tanh(ctx, g), u) /* GemmaMLP: gelu_pytorch_tanh */
                                     : dt_swiglu(ctx, g, u);
    return leave(ctx, rt, child(self, "down_proj"), a);
}

/* GemmaRMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), in f32 and
 * rounded once to x's dtype (dt_rms_norm with the f32 weight 1 + w);
 * weight [D] stored around 0. ud: the runtime config (eps). */
static dt_tensor *gemma_norm_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const llama_rt *rt = ud;
    dt_tensor *w1 = x ? gemma_weight(ctx, dt_module_param(self, 0)) : NULL;
    return w1 ? dt_rms_norm(ctx, x, w1, rt->c.rms_norm_eps) : NULL;
}

/* The block's and the final norm: LlamaRMSNorm, or GemmaRMSNorm (weight
 * initialised to 0: transformers' GemmaPreTrainedModel._init_weights). */
static dt_module *make_norm(const dt_llama_config *c, llama_rt *rt, int64_t dim)
{
    if (!c->gemma)
        return dt_nn_rmsnorm(dim, c->rms_norm_eps);
    dt_nn_param_spec s = {.name = "weight", .ndim = 1, .shape = {dim}, .init = DT_NN_INIT_ZEROS};
    return dt_nn_custom("GemmaRMSNorm", 1, &s, gemma_norm_forward, rt);
}

/* Gemma's embeddings times sqrt(C), the factor in the embeddings' dtype
 * (GemmaTextScaledWordEmbedding: embed_scale.to(weight.dtype)); Granite's
 * times embedding_multiplier (a Python float: not rounded to it). */
static dt_tensor *embed_scale(dt_ctx *ctx, const llama_rt *rt, dt_tensor *x)
{
    if (x && rt->c.embedding_multiplier != 0.0)
        return dt_scale(ctx, x, (float)rt->c.embedding_multiplier);
    if (!x || !rt->c.gemma)
        return x;
    float s = (float)sqrt((double)rt->c.hidden_size);
    if (x->dtype == DT_BF16)
        s = dt_bf16_to_f32(dt_f32_to_bf16(s));
    else if (x->dtype == DT_F16)
        s = dt_f16_to_f32(dt_f32_to_f16(s));
    return dt_scale(ctx, x, s);
}

/* Granite's residual_multiplier on a block's attention or MLP output */
static dt_tensor *residual_scale(dt_ctx *ctx, const llama_rt *rt, dt_tensor *y)
{
    return y && rt->c.residual_multiplier != 0.0 ? dt_scale(ctx, y, (float)rt->c.residual_multiplier) : y;
}

/* Granite's logits_scaling on the final norm's output (the head is linear:
 * its logits divided by it) */
static dt_tensor *logits_scale(dt_ctx *ctx, const llama_rt *rt, dt_tensor *x)
{
    return x && rt->c.logits_scaling != 0.0 ? dt_scale(ctx, x, (float)(1.0 / rt->c.logits_scaling)) : x;
}

/* The layer's MLP: its dense one, or its mixture-of-experts block (Mixtral names it block_sparse_moe) */
static dt_module *mlp_of(dt_module *layer)
{
    dt_module *m = child(layer, "mlp");
    return m ? m : child(layer, "block_sparse_moe");
}

/* ud: the runtime config (borrowed from the root) */
static dt_tensor *layer_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const llama_rt *rt = ud;
    if (rt->c.gemma2) { /* a norm before and a norm after each */
        dt_tensor *a = dt_module_forward(ctx, child(self, "self_attn"),
                                         norm_fwd(ctx, rt, child(self, "input_layernorm"), x));
        dt_tensor *h = dt_add(ctx, x, norm_fwd(ctx, rt, child(self, "post_attention_layernorm"), a));
        dt_tensor *m = dt_module_forward(ctx, child(self, "mlp"),
                                         norm_fwd(ctx, rt, child(self, "pre_feedforward_layernorm"), h));
        return dt_add(ctx, h, norm_fwd(ctx, rt, child(self, "post_feedforward_layernorm"), m));
    }
    if (rt->c.olmo2) { /* the outputs normalized, not the inputs */
        dt_tensor *h = dt_add(ctx, x, norm_fwd(ctx, rt, child(self, "post_attention_layernorm"),
                                               dt_module_forward(ctx, child(self, "self_attn"), x)));
        return dt_add(ctx, h, norm_fwd(ctx, rt, child(self, "post_feedforward_layernorm"),
                                       dt_module_forward(ctx, child(self, "mlp"), h)));
    }
    dt_tensor *a = dt_module_forward(ctx, child(self, "self_attn"),
                                     norm_fwd(ctx, rt, child(self, "input_layernorm"), x));
    dt_tensor *h = dt_add(ctx, x, residual_scale(ctx, rt, a));
    dt_tensor *m = dt_module_forward(ctx, mlp_of(self),
                                     norm_fwd(ctx, rt, child(self, "post_attention_layernorm"), h));
    return dt_add(ctx, h, residual_scale(ctx, rt, m));
}

/* nn.Embedding's padding_idx: the embeddings x [B, T, C] of ids idx where
 * the id is pad pass no gradient back to the table (x k + detach(x) (1 - k),
 * k 0 at those positions: the same values, exactly). Nothing to do for a
 * batch without the id. */
static dt_tensor *pad_no_grad(dt_ctx *ctx, dt_tensor *x, dt_tensor *idx, int64_t pad)
{
    if (!x || !dt_ag_enabled(ctx))
        return x;
    const int64_t n = dt_tensor_numel(idx);
    int64_t hits = 0;
    for (int64_t i = 0; i < n; i++)
        hits += (int64_t)dt_tensor_get(idx, i) == pad;
    if (!hits)
        return x;
    int64_t shape[3] = {idx->shape[0], idx->shape[1], 1};
    dt_tensor *keep = dt_tensor_empty(ctx, DT_F32, 3, shape), *drop = dt_tensor_empty(ctx, DT_F32, 3, shape);
    if (!keep || !drop)
        return NULL;
    float *k = keep->data, *d = drop->data;
    for (int64_t i = 0; i < n; i++) {
        const bool p = (int64_t)dt_tensor_get(idx, i) == pad;
        k[i] = p ? 0.0f : 1.0f;
        d[i] = p ? 1.0f : 0.0f;
    }
    return dt_add(ctx, dt_mul(ctx, x, keep), dt_mul(ctx, dt_detach(ctx, x), drop));
}

/* A sliding window shorter than the positions: the layers that slide see
 * the last sliding_window positions (full_attention_layers: the others
 * every earlier one) */
static bool windowed(const dt_llama_config *c)
{
    return c->sliding_window > 0 && c->sliding_window < c->max_position_embeddings;
}

/* The longest sequence: max_position_embeddings */
static int64_t max_len(const dt_llama_config *c) { return c->max_position_embeddings; }

/* The descriptor's sequence length when none is given: the window of a
 * windowed model (a long max_position_embeddings costs memory the window
 * does not need), else max_len */
static int64_t default_len(const dt_llama_config *c)
{
    return windowed(c) ? c->sliding_window : max_len(c);
}

/* self->ud: the runtime config (borrowed from the root) */
static dt_tensor *model_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    const llama_rt *rt = ud;
    char s[64];
    if (!idx)
        return NULL;
    if ((idx->dtype != DT_I64 && idx->dtype != DT_I32) || idx->ndim != 2) {
        dt_error(DT_ERR_SHAPE, "input %s %s: want token ids [B, T] of i64 or i32", dt_tensor_shape_str(idx, s, sizeof s),
                 dt_dtype_name(idx->dtype));
        return NULL;
    }
    if (idx->shape[1] < 1 || idx->shape[1] > max_len(&rt->c)) {
        dt_error(DT_ERR_SHAPE, "sequence length %lld is outside [1, %lld] (max_position_embeddings)",
                 (long long)idx->shape[1], (long long)max_len(&rt->c));
        return NULL;
    }
    if (rt->cp.group) { /* the rank's rows of the whole sequence */
        dt_cp_layout l;
        if (dt_cp_layout_of(&rt->cp, idx->shape[1], &l) < 0)
            return NULL;
        idx = dt_cp_local_rows(ctx, &l, idx);
    }
    dt_tensor *x = embed_scale(ctx, rt, dt_module_forward(ctx, child(self, "embed_tokens"), idx));
    if (rt->c.has_pad_token)
        x = pad_no_grad(ctx, x, idx, rt->c.pad_token_id);
    if (rt->sp && x) /* the rank's rows */
        x = dt_tp_sp_scatter(ctx, rt->sp, x, 1);
    x = dt_module_forward(ctx, child(self, "layers"), x);
    x = logits_scale(ctx, rt, norm_fwd(ctx, rt, child(self, "norm"), x));
    return rt->sp && x ? dt_tp_sp_gather(ctx, rt->sp, x, 1) : x; /* whole rows for the head */
}

/* Gemma 2's final_logit_softcapping on the head's logits (under tensor
 * parallelism the rank's vocabulary columns: elementwise, the same) */
static dt_tensor *logits_cap(dt_ctx *ctx, const llama_rt *rt, dt_tensor *logits)
{
    return logits && rt->c.final_logit_softcapping > 0.0
               ? dt_softcap(ctx, logits, (float)rt->c.final_logit_softcapping) : logits;
}

static dt_tensor *lm_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    const llama_rt *rt = ud;
    dt_tensor *x = dt_module_forward(ctx, child(self, "model"), idx);
    if (x && rt->kv) /* a generation step: only the last position's logits are read */
        x = dt_contiguous(ctx, dt_narrow(ctx, x, 1, x->shape[1] - 1, 1));
    return logits_cap(ctx, rt, dt_module_forward(ctx, child(self, "lm_head"), x));
}

/* Adds child under name to parent; on any failure (earlier too) frees what it
 * was given and returns false. */
static bool add(dt_module *parent, const char *name, dt_module *c, bool ok)
{
    if (!ok || !parent || !c) {
        dt_module_free(c);
        return false;
    }
    return dt_nn_add(parent, name, c) == DT_OK;
}

/* nn.Linear with transformers' init: weight N(0, std), bias 0. */
static dt_module *linear(int64_t in, int64_t out, bool bias, float std)
{
    dt_module *m = dt_nn_linear(in, out, bias);
    /* a Linear's specs: 0 weight, 1 bias */
    if (m && (dt_module_set_param_init(m, 0, DT_NN_INIT_NORMAL, std) < 0 ||
              (bias && dt_module_set_param_init(m, 1, DT_NN_INIT_ZEROS, 0.0f) < 0))) {
        dt_module_free(m);
        return NULL;
    }
    return m;
}

/* A Linear of the block: plain, or column-/row-parallel over tp. */
static dt_module *proj(dt_pg *tp, int64_t in, int64_t out, bool bias, float std, bool column)
{
    return tp ? tp_linear(tp, in, out, bias, std, column, NULL, 0) : linear(in, out, bias, std);
}

/* Phi-3's fused column projection (qkv_proj, gate_up_proj): its output is
 * nrows blocks of the given sizes; under tp each rank holds its slice of
 * each. */
static dt_module *fused_proj(dt_pg *tp, int64_t in, const int64_t *rows, int nrows, float std)
{
    int64_t out = 0;
    for (int k = 0; k < nrows; k++)
        out += rows[k];
    return tp ? tp_linear(tp, in, out, false, std, true, rows, nrows) : linear(in, out, false, std);
}

static dt_tensor *split_norm_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const llama_rt *rt = ud;
    return dt_tp_rms_norm(ctx, dt_tp_module_group(self), x, dt_module_param(self, 0), rt->c.rms_norm_eps);
}

/* OLMo 2's q_norm or k_norm: an RMSNorm over the whole projection of n
 * values; under tp each rank holds the weight's columns of its heads and
 * the rows' statistics are summed over the group (dt_tp_rms_norm). */
static dt_module *whole_norm(const dt_llama_config *c, llama_rt *rt, dt_pg *tp, int64_t n)
{
    if (!tp)
        return dt_nn_rmsnorm(n, c->rms_norm_eps);
    dt_nn_param_spec s = {.name = "weight", .ndim = 1, .shape = {n / dt_pg_size(tp)}, .init = DT_NN_INIT_ONES,
                          .tp_dim = 1};
    dt_module *m = dt_nn_custom("LlamaSplitRMSNorm", 1, &s, split_norm_forward, rt);
    if (m && dt_tp_module_set_group(m, tp) < 0) {
        dt_module_free(m);
        return NULL;
    }
    return m;
}

static dt_module *layer(const dt_llama_config *c, llama_rt *rt, attn_ud *a, dt_pg *tp, bool moe)
{
    const int64_t C = c->hidden_size, hd = c->head_dim, H = c->num_attention_heads, KV = c->num_key_value_heads;
    const int64_t I = c->intermediate_size;
    const float std = c->initializer_range;
    const bool ab = c->attention_bias, ob = c->attention_bias && !c->qkv_bias_only, mb = c->mlp_bias;
    dt_module *b = dt_nn_custom("LlamaDecoderLayer", 0, NULL, layer_forward, rt);
    dt_module *attn = dt_nn_custom("LlamaAttention", 0, NULL, attn_forward, a);
    /* a mixture-of-experts block in place of the MLP (moe.c; c is rt's, which outlives the modules) */
    dt_module *mlp = moe ? dt__moe_block(c) : dt_nn_custom("LlamaMLP", 0, NULL, mlp_forward, rt);
    bool ok = b && attn && mlp;
    if (c->fused) { /* Phi-3, in Phi3Attention's and Phi3MLP's order (o_proj first) */
        const int64_t qkv[3] = {H * hd, KV * hd, KV * hd}, gu[2] = {I, I};
        ok = add(attn, "o_proj", proj(tp, H * hd, C, false, std, false), ok);
        ok = add(attn, "qkv_proj", fused_proj(tp, C, qkv, 3, std), ok);
        ok = add(mlp, "gate_up_proj", fused_proj(tp, C, gu, 2, std), ok);
        ok = add(mlp, "down_proj", proj(tp, I, C, false, std, false), ok);
    } else {
        ok = add(attn, "q_proj", proj(tp, C, H * hd, ab, std, true), ok);
        ok = add(attn, "k_proj", proj(tp, C, KV * hd, ab, std, true), ok);
        ok = add(attn, "v_proj", proj(tp, C, KV * hd, ab, std, true), ok);
        ok = add(attn, "o_proj", proj(tp, H * hd, C, ob, std, false), ok);
    }
    if (c->attention_dropout > 0.0) /* keys the masks (attn_forward); none without dropout: the modules (and the
                                       random-stream state) of a model without it */
        ok = add(attn, "attn_dropout", dt_nn_dropout((float)c->attention_dropout), ok);
    if (c->olmo2 || c->whole_qk_norm) { /* OLMo 2's, OLMoE's over the whole projection (under tp the rank's heads'
                                              columns) */
        ok = add(attn, "q_norm", whole_norm(c, rt, tp, H * hd), ok);
        ok = add(attn, "k_norm", whole_norm(c, rt, tp, KV * hd), ok);
    } else if (c->qk_norm) { /* Qwen3's and Gemma 3's over each head */
        ok = add(attn, "q_norm", make_norm(c, rt, hd), ok);
        ok = add(attn, "k_norm", make_norm(c, rt, hd), ok);
    }
    if (!c->fused && !moe) {
        ok = add(mlp, "gate_proj", proj(tp, C, I, mb, std, true), ok);
        ok = add(mlp, "up_proj", proj(tp, C, I, mb, std, true), ok);
        ok = add(mlp, "down_proj", proj(tp, I, C, mb, std, false), ok);
    }
    ok = add(b, "self_attn", attn, ok);
    attn = NULL;
    ok = add(b, moe && c->moe_mixtral_names ? "block_sparse_moe" : "mlp", mlp, ok);
    mlp = NULL;
    if (!c->olmo2)
        ok = add(b, "input_layernorm", make_norm(c, rt, C), ok);
    ok = add(b, "post_attention_layernorm", make_norm(c, rt, C), ok);
    if (c->gemma2)
        ok = add(b, "pre_feedforward_layernorm", make_norm(c, rt, C), ok);
    if (c->olmo2 || c->gemma2)
        ok = add(b, "post_feedforward_layernorm", make_norm(c, rt, C), ok);
    if (!ok) {
        dt_module_free(attn);
        dt_module_free(mlp);
        dt_module_free(b);
        return NULL;
    }
    return b;
}

/* Whether layer i's MLP is a mixture-of-experts block */
static bool moe_layer(const dt_llama_config *c, int64_t i)
{
    return c->num_experts > 0 && !(i < DT_LLAMA_MAX_LAYERS && c->dense_layers[i]);
}

bool dt_llama_positions(const dt_model *m, int64_t *P, int64_t *V)
{
    dt_module *root = m ? dt_model_root(m) : NULL;
    if (!root || strcmp(dt_module_type(root), "LlamaForCausalLM") || !dt_module_user_data(root))
        return false;
    const llama_rt *rt = dt_module_user_data(root);
    *P = max_len(&rt->c);
    *V = rt->c.vocab_size;
    return true;
}

bool dt__llama_kv_shape(const dt_model *m, dt__llama_kv_info *out)
{
    int64_t P, V;
    if (!dt_llama_positions(m, &P, &V))
        return false;
    const llama_rt *rt = dt_module_user_data(dt_model_root(m));
    *out = (dt__llama_kv_info){.L = (int)rt->c.num_hidden_layers,
                               .row = rt->c.num_key_value_heads * rt->c.head_dim,
                               .positions = rt->c.max_position_embeddings,
                               .window = windowed(&rt->c) ? rt->c.sliding_window : 0,
                               .restart = rt->c.rope_type == DT_ROPE_LONGROPE
                                              ? rt->c.rope_original_max_position_embeddings : 0,
                               .full = rt->c.full_attention_layers,
                               .softcap = (float)rt->c.attn_logit_softcapping};
    return !rt->cp.group && !rt->sp;
}

dt_tensor *dt__llama_kv_forward(dt_model *m, dt__kv_cache *c, dt_ctx *ctx, const int64_t *tok, int64_t n)
{
    dt_module *root = dt_model_root(m);
    llama_rt *rt = dt_module_user_data(root);
    int64_t *ids = dt_ctx_alloc(ctx, (size_t)(c->B * n) * sizeof *ids);
    if (!ids)
        return NULL;
    memcpy(ids, tok, (size_t)(c->B * n) * sizeof *ids);
    kv_step step = {.c = c};
    rt->kv = &step;
    dt_tensor *y = dt_module_forward(ctx, root, dt_tensor_view_of(ctx, ids, DT_I64, 2, (int64_t[]){c->B, n}));
    rt->kv = NULL;
    if (y && step.layer != c->L) {
        dt_error(DT_ERR_STATE, "generate: the cached forward ran %d attention layers of %d", step.layer, c->L);
        return NULL;
    }
    return y;
}

/* The pipeline units (nn.h, dt_model_set_pipe_units): [model.embed_tokens,
 * model.layers.0, ..., model.norm, lm_head], each by its module's own
 * forward (a decoder layer whole). Costs per token as the GPT's: the
 * weights' elements, attention's T H hd (T the longest sequence), a few
 * per element for the norms and residuals, the head's GEMM and the
 * cross-entropy. */
/* The embedding unit: the table's lookup, with padding_idx's gradient cut
 * (pad_no_grad) as model_forward does; under context parallelism of the
 * rank's rows, under sequence parallelism split into the tensor-parallel
 * rank's rows after the lookup (the pipeline then moves those). */
static dt_tensor *embed_unit(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    const llama_rt *rt = dt_module_user_data(dt_model_root(m));
    if (rt && rt->cp.group && x) {
        dt_cp_layout l;
        if (dt_cp_layout_of(&rt->cp, x->shape[1], &l) < 0)
            return NULL;
        x = dt_cp_local_rows(ctx, &l, x);
    }
    dt_tensor *e = dt_module_forward(ctx, u->module, x);
    if (!rt)
        return e;
    e = embed_scale(ctx, rt, e);
    if (rt->c.has_pad_token)
        e = pad_no_grad(ctx, e, x, rt->c.pad_token_id);
    return rt->sp && e ? dt_tp_sp_scatter(ctx, rt->sp, e, 1) : e;
}

/* The final norm's unit, with Granite's logits_scaling as model_forward has
 * it; under sequence parallelism on the rank's rows, gathered for the head. */
static dt_tensor *norm_unit(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    const llama_rt *rt = dt_module_user_data(dt_model_root(m));
    if (!rt)
        return dt_module_forward(ctx, u->module, x);
    dt_tensor *y = logits_scale(ctx, rt, norm_fwd(ctx, rt, u->module, x));
    return rt->sp && y ? dt_tp_sp_gather(ctx, rt->sp, y, 1) : y;
}

/* The head's unit, with Gemma 2's final_logit_softcapping as lm_forward has it. */
static dt_tensor *head_unit(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    const llama_rt *rt = dt_module_user_data(dt_model_root(m));
    dt_tensor *y = dt_module_forward(ctx, u->module, x);
    return rt ? logits_cap(ctx, rt, y) : y;
}

static dt_status llama_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    dt_module *emb = dt_model_find_module(m, "model.embed_tokens"), *ls = dt_model_find_module(m, "model.layers");
    dt_module *norm = dt_model_find_module(m, "model.norm"), *head = dt_model_find_module(m, "lm_head");
    int64_t T = 0, V = 0;
    if (!emb || !ls || !norm || !head || !dt_llama_positions(m, &T, &V))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a LlamaForCausalLM without model.embed_tokens, "
                        "model.layers, model.norm or lm_head");
    const llama_rt *rt = dt_module_user_data(dt_model_root(m));
    if (rt && rt->c.num_experts > 0)
        return dt_error(DT_ERR_UNSUPPORTED, "pipeline parallelism with mixture-of-experts layers (num_experts %lld) "
                        "is not supported", (long long)rt->c.num_experts);
    int L = dt_module_num_children(ls), k = 0;
    dt_pipe_unit *u = dt_calloc((size_t)(L + 3) * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
    const double C = dt__zoo_numel(norm, 0);
    dt__zoo_unit(&u[k], "model.embed_tokens", emb, embed_unit, "model.embed_tokens", NULL);
    u[k++].cost = 2 * C;
    for (int i = 0; i < L; i++) {
        dt_module *b = dt_module_child(ls, i);
        dt_module *at = dt_module_find_child(b, "self_attn");
        double w = dt__zoo_weights(b, "self_attn", "q_proj", "k_proj") +
                   dt__zoo_weights(b, "self_attn", "v_proj", "o_proj") +
                   dt__zoo_weights(b, "mlp", "gate_proj", "up_proj") +
                   dt__zoo_weights(b, "mlp", "gate_up_proj", "down_proj") + /* Phi-3's fused ones */
                   (at ? dt__zoo_numel(dt_module_find_child(at, "qkv_proj"), 0) : 0);
        double qw = at ? dt__zoo_numel(dt_module_find_child(at, "o_proj"), 0) / (C > 0 ? C : 1) : 0; /* H hd */
        dt__zoo_unit(&u[k], dt_module_path(b), b, NULL, dt_module_path(b), NULL);
        u[k++].cost = w + (double)T * qw + 16 * C;
    }
    dt__zoo_unit(&u[k], "model.norm", norm, norm_unit, "model.norm", NULL);
    u[k++].cost = 4 * C;
    dt__zoo_unit(&u[k], "lm_head", head, head_unit, "lm_head", NULL);
    u[k++].cost = dt__zoo_numel(head, 0) + 4 * (double)V;
    *units = u;
    *n = k;
    return DT_OK;
}

/* ---- PyTorch's draws (dt_model_set_torch_init) ----
 * transformers' LlamaForCausalLM(config) under torch.manual_seed (checked
 * against transformers 5.24, scripts/make_init_goldens.py):
 *   1. LlamaModel's constructors: embed_tokens N(0, 1) (nn.Embedding), then
 *      per layer q, k, v, o, gate, up, down: each nn.Linear's kaiming
 *      weight and, when it has one, its bias U(+-1/sqrt(in)); norms none;
 *   2. LlamaModel's post_init, in module order: embed_tokens, then every
 *      Linear weight N(0, initializer_range) (biases zeroed: no draw);
 *   3. lm_head's constructor (kaiming), then its init N(0, range); tied
 *      to embed_tokens the two change nothing: left out. */
static const char *const g_proj[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                      "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
/* Phi-3's, in its constructors' order (Phi3Attention makes o_proj first) */
static const char *const g_proj_fused[4] = {"self_attn.o_proj", "self_attn.qkv_proj", "mlp.gate_up_proj",
                                            "mlp.down_proj"};

/* Appends a draw for entry `name` to d (false + error when it is missing). */
static bool draw(const dt_model *m, dt_torch_draw *d, size_t *k, const char *name, dt_nn_init init, double a,
                 bool keep)
{
    int64_t e = dt_model_find_entry(m, name);
    if (e < 0) {
        dt_error(DT_ERR_INTERNAL, "llama: no entry '%s'", name);
        return false;
    }
    d[(*k)++] = (dt_torch_draw){.entry = (size_t)e, .init = init, .a = (float)a, .keep = keep};
    return true;
}

static dt_status torch_order(dt_model *m, const dt_llama_config *c)
{
    const int64_t L = c->num_hidden_layers;
    dt_torch_draw *d = malloc((size_t)(4 + 21 * L) * sizeof *d);
    if (!d)
        return dt_error(DT_ERR_NO_MEMORY, "llama: out of memory");
    size_t k = 0;
    char w[128], b[128];
    const char *const *proj_names = c->fused ? g_proj_fused : g_proj;
    const int nproj = c->fused ? 4 : 7;
    bool ok = draw(m, d, &k, "model.embed_tokens.weight", DT_NN_INIT_NORMAL, 1.0, false);
    for (int64_t i = 0; i < L && ok; i++)
        for (int j = 0; j < nproj && ok; j++) {
            snprintf(w, sizeof w, "model.layers.%lld.%s.weight", (long long)i, proj_names[j]);
            snprintf(b, sizeof b, "model.layers.%lld.%s.bias", (long long)i, proj_names[j]);
            dt_param_info p;
            int64_t e = dt_model_find_entry(m, w);
            ok = e >= 0 && dt_model_entry(m, (size_t)e, &p) == DT_OK && p.ndim == 2 && p.shape[1] > 0;
            ok = ok && draw(m, d, &k, w, DT_NN_INIT_KAIMING, 0.0, false);
            if (ok && dt_model_find_entry(m, b) >= 0) /* torch: 1 / math.sqrt(fan_in) */
                ok = draw(m, d, &k, b, DT_NN_INIT_UNIFORM, 1.0 / sqrt((double)p.shape[1]), false);
        }
    ok = ok && draw(m, d, &k, "model.embed_tokens.weight", DT_NN_INIT_NORMAL, c->initializer_range, true);
    for (int64_t i = 0; i < L && ok; i++)
        for (int j = 0; j < nproj && ok; j++) {
            snprintf(w, sizeof w, "model.layers.%lld.%s.weight", (long long)i, proj_names[j]);
            ok = draw(m, d, &k, w, DT_NN_INIT_NORMAL, c->initializer_range, true);
        }
    int64_t head = dt_model_find_entry(m, "lm_head.weight");
    dt_param_info hp;
    if (ok && head >= 0 && dt_model_entry(m, (size_t)head, &hp) == DT_OK && hp.tied_to < 0)
        ok = draw(m, d, &k, "lm_head.weight", DT_NN_INIT_KAIMING, 0.0, false) &&
             draw(m, d, &k, "lm_head.weight", DT_NN_INIT_NORMAL, c->initializer_range, true);
    dt_status st = ok ? dt_model_set_torch_init(m, d, k)
                      : dt_last_status() < 0 ? dt_last_status() : dt_error(DT_ERR_INTERNAL, "llama: bad layer shapes");
    free(d);
    return st;
}

dt_status dt_llama_create(const dt_llama_config *lc, uint64_t seed, const dt_model_config *cfg, dt_model **out,
                          dt_model_desc *d)
{
    if (!lc || !out)
        return dt_error(DT_ERR_NULL, "dt_llama_create: %s is NULL", lc ? "model" : "config");
    *out = NULL;
    dt_model_config c = cfg ? *cfg : dt_model_config_default();
    dt_status st = dt_llama_config_check(lc);
    if (st < 0)
        return st;
    if (!(c.dropout >= 0.0f && c.dropout < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "llama: dropout %g is outside [0, 1)", (double)c.dropout);
    dt_pg *tp = c.tp && dt_pg_size(c.tp) > 1 ? c.tp : NULL;
    if (lc->num_experts > 0) { /* what the mixture-of-experts blocks (moe.c) do not implement */
        const char *no = tp ? "tensor parallelism" : c.cp.group && dt_pg_size(c.cp.group) > 1
                                                         ? "context parallelism" : NULL;
        if (no)
            return dt_error(DT_ERR_UNSUPPORTED, "llama: %s with mixture-of-experts layers (num_experts %lld) is not "
                            "supported", no, (long long)lc->num_experts);
    }
    const bool sp = tp && c.sequence_parallel; /* without tensor parallelism (or a group of one): plain */
    if (tp) {
        const int t = dt_pg_size(tp);
        const struct {
            const char *key;
            int64_t v;
        } split[] = {{"num_attention_heads", lc->num_attention_heads},
                     {"num_key_value_heads", lc->num_key_value_heads},
                     {"intermediate_size", lc->intermediate_size}};
        for (size_t i = 0; i < sizeof split / sizeof split[0]; i++)
            if (split[i].v % t)
                return dt_error(DT_ERR_INVALID_ARG, "llama: %s %lld is not divisible by the tensor-parallel size %d "
                                "(each rank computes whole heads and an equal share of the MLP)", split[i].key,
                                (long long)split[i].v, t);
    }
    int64_t T = c.seq ? c.seq : default_len(lc);
    if (T < 1 || T > max_len(lc))
        return dt_error(DT_ERR_INVALID_ARG, "llama: sequence length %lld is outside [1, %lld] "
                        "(max_position_embeddings)", (long long)T, (long long)max_len(lc));
    const bool cp = c.cp.group && dt_pg_size(c.cp.group) > 1;
    if (cp && (st = dt_cp_check(&c.cp, T, lc->num_attention_heads)) < 0)
        return dt_error_wrap(st, "llama");
    if (cp && c.build.lora && c.build.lora->dropout > 0) /* its masks follow a rank's rows, not the positions */
        return dt_error(DT_ERR_UNSUPPORTED, "llama: LoRA dropout %g with context parallelism is not supported (each "
                        "rank would draw the masks of the other ranks' rows); set it to 0",
                        (double)c.build.lora->dropout);
    const int64_t Tr = cp ? T / dt_pg_size(c.cp.group) : T; /* a cp rank's rows (dt_cp_check: whole) */
    if (sp && Tr % dt_pg_size(tp))
        return dt_error(DT_ERR_INVALID_ARG, "llama: sequence length %lld%s is not divisible by the tensor-parallel "
                        "size %d (sequence parallelism splits the tokens)", (long long)Tr,
                        cp ? " (a context-parallel rank's)" : "", dt_pg_size(tp));
    llama_rt *rt = calloc(1, sizeof *rt);
    const bool lr = lc->rope_type == DT_ROPE_LONGROPE, local = lc->rope_local_theta > 0.0;
    if (!rt || !(rt->attn = calloc((size_t)lc->num_hidden_layers, sizeof *rt->attn)) ||
        !(rt->inv_freq = malloc((size_t)lc->head_dim / 2 * sizeof(float))) ||
        (lr && !(rt->inv_long = malloc((size_t)lc->head_dim / 2 * sizeof(float)))) ||
        (local && !(rt->inv_local = malloc((size_t)lc->head_dim / 2 * sizeof(float))))) {
        rt_free(rt);
        return dt_error(DT_ERR_NO_MEMORY, "llama: out of memory");
    }
    rt->c = *lc;
    if (c.dropout > 0.0f) /* the model config's dropout is the attention's, Llama's only one */
        rt->c.attention_dropout = c.dropout;
    rt->cp = cp ? c.cp : dt_cp_params_default();
    rt->sp = sp ? tp : NULL;
    for (int64_t i = 0; i < lc->num_hidden_layers; i++) { /* a layer slides unless it is a full one */
        const bool full = i < DT_LLAMA_MAX_LAYERS && lc->full_attention_layers[i];
        rt->attn[i] = (attn_ud){.rt = rt, .window = windowed(lc) && !full ? lc->sliding_window : 0,
                                .local = local && !full, .nope = i < DT_LLAMA_MAX_LAYERS && lc->nope_layers[i]};
    }
    dt_llama_inv_freq(lc, 0, rt->inv_freq);
    if (lr)
        dt_llama_inv_freq(lc, lc->rope_original_max_position_embeddings + 1, rt->inv_long);
    if (local) { /* the sliding layers' base, without the full layers' scaling */
        dt_llama_config l = *lc;
        l.rope_theta = lc->rope_local_theta;
        l.rope_type = DT_ROPE_DEFAULT;
        dt_llama_inv_freq(&l, 0, rt->inv_local);
    }
    const int64_t C = lc->hidden_size, V = lc->vocab_size, L = lc->num_hidden_layers;
    /* the root owns rt; every module under it borrows it (freed after them) */
    dt_module *root = dt_nn_custom_owned("LlamaForCausalLM", 0, NULL, lm_forward, rt, rt_free);
    dt_module *inner = dt_nn_custom("LlamaModel", 0, NULL, model_forward, rt);
    dt_module *layers = dt_nn_seq(0, NULL);
    dt_module *emb = tp ? dt_tp_vocab_embedding(tp, V, C) : dt_nn_embedding(V, C);
    dt_module *head = tp ? dt_tp_vocab_head(tp, V, C, sp) : linear(C, V, false, lc->initializer_range);
    bool ok = root && inner && layers && emb && head &&
              dt_module_set_param_init(emb, 0, DT_NN_INIT_NORMAL, lc->initializer_range) == DT_OK &&
              dt_module_set_param_init(head, 0, DT_NN_INIT_NORMAL, lc->initializer_range) == DT_OK;
    /* nn.Embedding(padding_idx=pad_token_id) and transformers' init leave the
     * padding row zero (a tied head shares it); a tensor-parallel model takes
     * its slices of the full model's values (dt_tp_init_from) */
    if (ok && lc->has_pad_token && !tp)
        ok = dt_module_set_param_padding_row(emb, 0, lc->pad_token_id) == DT_OK;
    for (int64_t i = 0; i < L && ok; i++)
        ok = add(layers, NULL, layer(&rt->c, rt, &rt->attn[i], tp, moe_layer(lc, i)), ok);
    if (ok && lc->tie_word_embeddings)
        ok = dt_module_tie(head, "weight", emb, "weight") == DT_OK;
    ok = add(inner, "embed_tokens", emb, ok);
    emb = NULL;
    ok = add(inner, "layers", layers, ok);
    layers = NULL;
    ok = add(inner, "norm", make_norm(lc, rt, C), ok);
    ok = add(root, "model", inner, ok);
    inner = NULL;
    ok = add(root, "lm_head", head, ok);
    head = NULL;
    if (!ok) {
        dt_module_free(emb);
        dt_module_free(layers);
        dt_module_free(inner);
        dt_module_free(head);
        dt_module_free(root);
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NO_MEMORY, "llama: out of memory building the modules");
        return dt_last_status();
    }
    if ((st = dt_model_build(root, seed, &c.build, out)) < 0)
        return st;
    /* a tensor-parallel rank's draws are the whole model's; mixture-of-experts layers: no transformers order (its
       experts are fused in memory), PyTorch's stream then draws each parameter in model order, values a model
       directory's weights replace */
    if (!tp && lc->num_experts == 0 && (st = torch_order(*out, lc)) < 0) {
        dt_model_free(*out);
        *out = NULL;
        return st;
    }
    dt_model_set_pipe_units(*out, llama_units); /* how a pipeline cuts it */
    if (!d)
        return DT_OK;
    memset(d, 0, sizeof *d);
    d->loss = DT_LOSS_CROSS_ENTROPY;
    snprintf(d->ckpt_unit, sizeof d->ckpt_unit, "LlamaDecoderLayer");
    d->input_ndim = 1;
    d->input_shape[0] = T;
    d->input_dtype = DT_I64;
    d->input_classes = V;
    d->has_target = true;
    d->target_ndim = 1;
    d->target_shape[0] = T;
    d->target_dtype = DT_I64;
    d->num_classes = V;
    /* matmul FLOPs per sample (2 per multiply-add): q/k/v/o, the three MLP
     * projections and the head per token, attention's q k^T and p v in full */
    const double tok = (double)T, hd = (double)lc->head_dim, H = (double)lc->num_attention_heads;
    const double KVd = (double)lc->num_key_value_heads, I = (double)lc->intermediate_size;
    double per_tok = (double)L * (2.0 * (double)C * H * hd + 2.0 * (double)C * KVd * hd) + (double)V * (double)C;
    for (int64_t i = 0; i < L; i++) /* a sparse layer: the router and the k experts a token goes to */
        per_tok += moe_layer(lc, i) ? (double)C * (double)lc->num_experts +
                                          3.0 * (double)C * (double)lc->moe_intermediate_size *
                                              (double)lc->num_experts_per_tok
                                    : 3.0 * (double)C * I;
    d->fwd_flops_per_sample = 2.0 * tok * per_tok + 4.0 * (double)L * tok * tok * H * hd;
    d->train_flops_per_sample = 3.0 * d->fwd_flops_per_sample;
    return DT_OK;
}
