/* dtrain/models.h — the model zoo: models by name, each with a descriptor.
 *
 * Overview
 * --------
 * A zoo model is a dt_model (nn.h) plus a dt_model_desc: the plain data a
 * training loop needs to feed it and that the model itself does not hold —
 * its loss, the per-sample shapes and dtypes of input and target, and its
 * FLOPs per sample. The `dtrain` CLI and benchmarks train zoo models by
 * name; a user's own model built with dt_model_build can have a descriptor
 * too (fill the struct).
 *
 *   "convnet": the classic MNIST ConvNet (PyTorch names layer1.{0,1}.*,
 *     layer2.{0,1}.*, fc.*): conv5x5 1->16 pad 2, BN, ReLU, maxpool 2;
 *     conv5x5 16->32 pad 2, BN, ReLU, maxpool 2; flatten; linear 1568->10.
 *     Input [B, 1, 28, 28] f32, target [B] i64 labels, cross-entropy loss.
 *   "mlp": Paddle's auto-parallel MLP: x[B,128,1024] @ w0[1024,4096] @
 *     w1[4096,1024], loss = mean of the output (no bias, no activation;
 *     Xavier-uniform init as Paddle's create_parameter). No target.
 *   "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-mini", "gpt-micro":
 *     GPT-2 with Hugging Face's names and shapes:
 *     transformer.wte.weight [V, C], transformer.wpe.weight [P, C],
 *     transformer.h.{i}.ln_1.{weight,bias}, .attn.c_attn.{weight [C, 3C],
 *     bias}, .attn.c_proj.{weight [C, C], bias}, .ln_2.*, .mlp.c_fc.{weight
 *     [C, 4C], bias}, .mlp.c_proj.{weight [4C, C], bias} (Conv1D: weights
 *     [in, out]), transformer.ln_f.*, lm_head.weight tied to wte (listed,
 *     stored once). Pre-LN blocks, causal attention, GELU (tanh), LayerNorm
 *     eps 1e-5, no bias on the head; nanoGPT's init (N(0, 0.02), biases 0,
 *     c_proj weights N(0, 0.02/sqrt(2 n_layer))) from the Philox stream.
 *     Blocks are modules of type "GPT2Block" (wrap policies and
 *     dt_model_checkpoint_type select them; its checkpoint units). Input [B, T] i64 token ids
 *     (T <= block_size), output logits [B, T, V]; target [B, T] i64, the
 *     next tokens; loss: mean cross-entropy over all B*T positions.
 *
 * Each builder registers how its model is cut into pipeline stages (nn.h,
 * dt_model_set_pipe_units; pipeline.h reads it): the GPT into its
 * embeddings, each block's attention and MLP halves, ln_f and the tied
 * head; the Llama into its embeddings, each decoder layer, the norm and
 * the head; the MLP into w0 and w1; each unit with its compute per token.
 * The ConvNet registers none (it is not pipelined).
 *
 * Usage
 * -----
 *     dt_model *m;  dt_model_desc d;
 *     if (dt_model_create("convnet", 42, NULL, &m, &d) < 0) { report dt_last_error(); }
 *     int nd, tnd;  int64_t xs[DT_MAX_DIMS], ys[DT_MAX_DIMS];  dt_dtype ydt;
 *     dt_model_desc_shapes(&d, batch, &nd, xs, &tnd, ys, &ydt);
 *     ... x = dt_tensor_view_of(ctx, images, d.input_dtype, nd, xs) ...
 *     dt_tensor *loss = dt_model_desc_loss(ctx, &d, dt_model_forward(ctx, m, x), y);
 *     dt_model_free(m);
 */
#ifndef DTRAIN_MODELS_H
#define DTRAIN_MODELS_H

#include "dtrain/comm.h"
#include "dtrain/cp.h"
#include "dtrain/data.h"
#include "dtrain/generate.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The training loss of a model's output. */
typedef enum {
    DT_LOSS_NONE = 0,      /* none built in: the caller computes it */
    DT_LOSS_CROSS_ENTROPY, /* mean cross-entropy of logits [B, C] vs labels [B], or of [B, T, V]
                              vs [B, T] over all B*T rows (language models) */
    DT_LOSS_MEAN,          /* mean of the output (the MLP benchmark) */
    DT_LOSS_MSE,           /* mean squared error against a target of the output's shape */
    DT_LOSS_KIND_COUNT
} dt_loss_kind;

/* What a model consumes and costs, per sample. */
typedef struct dt_model_desc {
    char name[32];                        /* zoo name ("convnet"); "" for others */
    char ckpt_unit[32];                   /* the module type of its activation-checkpointing units
                                             (dt_model_desc_checkpoint): "Sequential" (the ConvNet's
                                             conv blocks layer1, layer2), "MLP" (the MLP's one module,
                                             both its layers), "GPT2Block"; "" none */
    dt_loss_kind loss;                    /* the training loss */
    int input_ndim;                       /* dims of one sample (the batch dim excluded) */
    int64_t input_shape[DT_MAX_DIMS];     /* one sample's input shape */
    dt_dtype input_dtype;                 /* f32; i64 for token ids */
    int64_t input_classes;                /* integer inputs: values lie in [0, input_classes) (the
                                             vocabulary); 0 otherwise */
    bool has_target;                      /* false: the loss takes no target */
    int target_ndim;                      /* dims of one sample's target (0: a scalar label) */
    int64_t target_shape[DT_MAX_DIMS];
    dt_dtype target_dtype;                /* i64 labels for cross-entropy */
    int64_t num_classes;                  /* labels lie in [0, num_classes); 0 if no labels */
    double fwd_flops_per_sample;          /* matmul/conv FLOPs of one forward (2 per multiply-add) */
    double train_flops_per_sample;        /* forward + backward (backward computes two products
                                             per layer, minus the first layer's input gradient) */
    dt_pg *tp;                            /* a tensor-parallel model's group (dt_model_config.tp;
                                             borrowed): the output is this rank's share (GPT-2:
                                             logits [B, T, ceil(V/t)], the loss the
                                             vocabulary-parallel cross-entropy); NULL otherwise */
    dt_cp_params cp;                      /* a context-parallel model's (dt_model_config.cp; group
                                             NULL otherwise): the output holds the rank's rows of
                                             the sequence, the loss takes the target's same rows and
                                             is the whole sequence's mean (dt_cp_loss) */
    dt_module *lm_head;                   /* GPT-2 built with dt_model_config.fused_lm_loss: its
                                             (tied) head, borrowed; the loss of a training-mode
                                             output applies it fused with the cross-entropy
                                             (dt_linear_cross_entropy). NULL otherwise */
} dt_model_desc;

/* A GPT-2 configuration. */
typedef struct dt_gpt2_config {
    int64_t n_layer, n_head, n_embd, block_size, vocab_size;
    float dropout;
} dt_gpt2_config;
/* The named configuration into *out: "gpt2" (124M: 12 layers, 12 heads,
 * 768, 1024 positions, 50257 tokens), "gpt2-medium" (24, 16, 1024),
 * "gpt2-large" (36, 20, 1280), "gpt2-xl" (48, 25, 1600), and the small
 * ones "gpt-mini" (6, 6, 384, 256 positions, 50257 tokens) and "gpt-micro"
 * (2, 2, 64, 64 positions, 512 tokens), dropout 0. DT_ERR_NOT_FOUND for
 * another name. */
DT_API dt_status dt_gpt2_config_by_name(const char *name, dt_gpt2_config *out);

/* Zoo options. */
typedef struct dt_model_config {
    int64_t num_classes;          /* convnet: output classes; default 10 */
    int64_t mlp_seq;              /* mlp: tokens per sample; default 128 */
    int64_t mlp_dim;              /* mlp: input/output width; default 1024 */
    int64_t mlp_hidden;           /* mlp: hidden width; default 4096 */
    /* GPT-2 ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-mini", "gpt-micro"): 0 keeps the
       named configuration's value (dt_gpt2_config_by_name) */
    int64_t n_layer;              /* transformer blocks */
    int64_t n_head;               /* attention heads; must divide n_embd */
    int64_t n_embd;               /* width C */
    int64_t block_size;           /* positions (wpe rows) */
    int64_t vocab_size;           /* tokens (wte rows); 50257 for the OpenAI sizes */
    int64_t seq;                  /* tokens per sample in the descriptor; default block_size */
    float dropout;                /* embd/attn/resid dropout probability; default 0 (off) */
    dt_model_build_params build;  /* layout options (world padding, meta) and the parameters'
                                     dtype (param_dtype, keep_batchnorm_fp32: a bf16/f16
                                     model, precision.h); default
                                     dt_model_build_params_default() */
    dt_pg *tp;                    /* tensor parallelism (tp.h) over this group (borrowed; must
                                     outlive the model), NULL = none (default). "mlp": w0
                                     column-split, w1 row-split (Paddle's/Megatron's MLP);
                                     GPT-2: heads, MLP and vocabulary split (n_head divisible
                                     by the group size; the vocabulary is padded). Parameters
                                     keep their global names with the rank's slice, initialised
                                     to the single-process model's values (dt_model_init_tp) */
    bool sequence_parallel;       /* GPT-2 and Llama with tp: sequence parallelism (tp.h; Korthikanti
                                     et al.): the norms and residuals on the rank's T/t tokens, all-gather
                                     and reduce-scatter in place of f and g; the same values as
                                     without (dropout too: a rank's tokens draw their part of
                                     the masks, dt_dropout_at). Needs seq (with cp: a cp
                                     rank's seq / cp, which it splits again) divisible by the
                                     group size (else DT_ERR_INVALID_ARG); not with LoRA
                                     (DT_ERR_UNSUPPORTED); ignored
                                     without tp (or a group of one) and by the MLP. Default
                                     false */
    dt_cp_params cp;              /* context parallelism (cp.h) over cp.group (borrowed; must outlive
                                     the model; NULL or one rank: none), GPT-2 and Llama: the
                                     forward takes the whole sequence [B, T] on every rank of
                                     the group, keeps the rank's rows (chunks r and 2P-1-r with
                                     cp.balance), embeds them at their global positions
                                     (learned positions, RoPE), runs ring (cp.impl DT_CP_RING)
                                     or Ulysses attention over the group and everything else on
                                     its rows; the output is [B, T/P, V] of those rows and the
                                     loss the whole sequence's mean (dt_model_desc_loss). Needs
                                     seq a multiple of P (2P balanced) and for Ulysses the heads
                                     a multiple of P (after tp's split) (DT_ERR_INVALID_ARG naming
                                     them); with tp, the heads split first. GPT-2's dropout draws
                                     one process's masks (the cp ranks of a replica keyed as it:
                                     dt_model_set_replica_ranks); a bf16/f16 model's attention
                                     runs in f32 (dt_cp_attention). Default
                                     dt_cp_params_default() (none) */
    bool fused_lm_loss;           /* GPT-2 without tp: in training mode (dt_model_train) the
                                     forward returns the final hidden states [B, T, C] (after
                                     ln_f) instead of the logits, and dt_model_desc_loss applies
                                     the tied head fused with the cross-entropy in chunks of rows
                                     (dt_linear_cross_entropy): the [B*T, V] logits and their
                                     gradient never exist. In eval mode (evaluation, generation)
                                     the forward returns the logits as usual. Ignored when the
                                     head carries hooks (ZeRO-3, user hooks) or under tensor
                                     parallelism. Same values within float rounding. Default
                                     false */
} dt_model_config;
DT_API dt_model_config dt_model_config_default(void);

/* ---- Llama-family decoders ------------------------------------------------------- */

/* Rotary-embedding frequency scaling (config.json "rope_scaling"). */
typedef enum {
    DT_ROPE_DEFAULT = 0, /* none: inv_freq[i] = theta^(-2i/hd) */
    DT_ROPE_LINEAR,      /* inv_freq / factor */
    DT_ROPE_LLAMA3,      /* Llama 3.1's: low frequencies / factor, high ones kept, a smooth ramp between */
    DT_ROPE_LONGROPE,    /* Phi-3's (LongRoPE): inv_freq[i] / short_factor[i], or / long_factor[i] in a
                            forward whose positions pass original_max_position_embeddings; cos and sin
                            times the attention factor */
    DT_ROPE_YARN,        /* YaRN: inv_freq / factor for the low frequencies, kept for the high ones, a
                            linear ramp between (beta_fast, beta_slow rotations over the original
                            positions); cos and sin times the attention factor */
    DT_ROPE_KIND_COUNT
} dt_rope_kind;

/* The most rotary frequencies a head has (head_dim <= 256). */
#define DT_LLAMA_MAX_ROPE_PAIRS 128
/* The most layers a model with a sliding window has (their kinds:
 * dt_llama_config.full_attention_layers). */
#define DT_LLAMA_MAX_LAYERS 256

/* A Llama-family decoder (Hugging Face LlamaConfig's keys; Mistral,
 * Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, Phi-3, Granite and OLMo 2 are the
 * same block: Qwen2 with attention_bias, Qwen3 with qk_norm, Gemma with
 * gemma, Gemma 2 with gemma, gemma2 and its soft caps, Gemma 3 with gemma,
 * gemma2, qk_norm and rope_local_theta, Phi-3 with fused, Granite with its
 * four multipliers, OLMo 2 with olmo2). */
typedef struct dt_llama_config {
    int64_t vocab_size;               /* V */
    int64_t hidden_size;              /* C */
    int64_t intermediate_size;        /* I, the SwiGLU width */
    int64_t num_hidden_layers;        /* L */
    int64_t num_attention_heads;      /* H */
    int64_t num_key_value_heads;      /* KV (grouped-query attention); divides H */
    int64_t head_dim;                 /* hd, independent of C / H (q_proj out = H hd) */
    int64_t max_position_embeddings;  /* the longest sequence the descriptor and generation use */
    float rms_norm_eps;               /* RMSNorm eps (1e-6 in LlamaConfig, 1e-5 in Llama 3) */
    float initializer_range;          /* init std of every Linear and the embedding (0.02) */
    double rope_theta;                /* RoPE base (10000; Llama 3: 500000) */
    dt_rope_kind rope_type;           /* rope_scaling's rope_type */
    double rope_factor;               /* linear and llama3: factor */
    double rope_low_freq_factor;      /* llama3 */
    double rope_high_freq_factor;     /* llama3 */
    int64_t rope_original_max_position_embeddings; /* llama3, longrope, yarn (the pretraining length) */
    double rope_beta_fast, rope_beta_slow; /* yarn (32 and 1 by default) */
    bool rope_truncate;               /* yarn: the correction range's ends rounded out (floor, ceil) */
    float rope_short_factor[DT_LLAMA_MAX_ROPE_PAIRS]; /* longrope: rotary width / 2 of each, > 0 */
    float rope_long_factor[DT_LLAMA_MAX_ROPE_PAIRS];
    double rope_attention_factor;     /* longrope and yarn: cos and sin times it (> 0; transformers'
                                         attention_scaling, from the config's attention_factor or its
                                         default: longrope's sqrt(1 + ln(factor) / ln(original)),
                                         yarn's 0.1 ln(factor) + 1 (mscale)) */
    double rope_local_theta;          /* > 0: the RoPE base of the layers that slide (full_attention_layers
                                         0), without scaling (Gemma 3's rope_local_base_freq, transformers 5's
                                         rope_parameters.sliding_attention); rope_theta and the scaling above are
                                         then the full layers'. 0: every layer rotates alike */
    int64_t rotary_dim;               /* RoPE on the first rotary_dim values of each head, the rest passing
                                         (Phi-3's partial_rotary_factor: head_dim times it; even, >= 2);
                                         0: the whole head */
    bool attention_bias;              /* q/k/v/o biases (Qwen2: q/k/v only, qkv_bias_only) */
    bool qkv_bias_only;               /* with attention_bias: o_proj has none (Qwen2) */
    bool mlp_bias;                    /* gate/up/down biases */
    bool tie_word_embeddings;         /* lm_head.weight is model.embed_tokens.weight */
    bool qk_norm;                     /* Qwen3: RMSNorm over each head's hd of q and of k (self_attn.q_norm,
                                         k_norm, weights [hd]) after their projections, before RoPE (with gemma:
                                         Gemma's (1 + weight) norms, Gemma 3) */
    bool olmo2;                       /* OLMo 2 and 3 (Olmo2ForCausalLM, Olmo3ForCausalLM): no norm before
                                         attention and MLP; their outputs normalized (post_attention_layernorm,
                                         post_feedforward_layernorm) before the residual add; q and k
                                         RMS-normalized over their whole projections (self_attn.q_norm [H hd],
                                         k_norm [KV hd]) before RoPE; under tensor parallelism each
                                         rank normalizes its heads by the whole rows' statistics
                                         (dt_tp_rms_norm) */
    bool whole_qk_norm;               /* OLMoE (OlmoeForCausalLM): q and k RMS-normalized over their whole
                                         projections (self_attn.q_norm [H hd], k_norm [KV hd]) before RoPE, as
                                         OLMo 2's, in the Llama block (its norms before attention and MLP) */
    bool gemma;                       /* Gemma (GemmaForCausalLM, Gemma 1): the embeddings times sqrt(C) (in
                                         their dtype), every RMSNorm times (1 + weight) (weights 0 at init,
                                         GemmaRMSNorm), the MLP's activation GELU's tanh form, not SiLU */
    bool gemma2;                      /* Gemma 2 (Gemma2ForCausalLM; with gemma): the attention and the MLP
                                         each between a norm before and a norm after, the latter before the
                                         residual add (input_layernorm and post_attention_layernorm,
                                         pre_feedforward_layernorm and post_feedforward_layernorm) */
    double query_pre_attn_scalar;     /* Gemma 2: the attention's scale is its inverse square root; 0:
                                         1/sqrt(head_dim) */
    double attn_logit_softcapping;    /* Gemma 2: the attention's scores s become cap tanh(s / cap) before
                                         the softmax (dt_attention_window); 0: none */
    double final_logit_softcapping;   /* Gemma 2: the logits become cap tanh(logits / cap) (dt_softcap); 0:
                                         none */
    bool fused;                       /* Phi-3 (Phi3ForCausalLM): q, k and v are one Linear self_attn.qkv_proj
                                         ([(H + 2 KV) hd, C]: q's rows, then k's, then v's) and gate and up
                                         one mlp.gate_up_proj ([2 I, C]: gate's rows, then up's); no biases;
                                         under tensor parallelism each rank holds its rows of each */
    double embedding_multiplier;      /* Granite (GraniteForCausalLM): the embeddings times it; 0: none */
    double residual_multiplier;       /* Granite: each block's attention and MLP outputs times it, before
                                         their residual add; 0: none */
    double attention_multiplier;      /* Granite: the attention's scale, in place of 1/sqrt(head_dim); 0:
                                         1/sqrt(head_dim) */
    double logits_scaling;            /* Granite: the logits divided by it (the final norm's output, in
                                         dtrain: the head is linear); 0: none */
    int64_t sliding_window;           /* > 0: sliding-window attention (each query sees the last
                                         sliding_window positions; dt_attention_window) in the layers that
                                         slide, up to max_position_embeddings; the descriptor's default
                                         sequence is the window; 0: none */
    uint8_t full_attention_layers[DT_LLAMA_MAX_LAYERS]; /* with sliding_window or rope_local_theta: 1 for a
                                         layer that sees every earlier position (transformers' layer_types
                                         "full_attention": Gemma 2's odd layers, Gemma 3's every sixth, Qwen2's
                                         below max_window_layers), 0 for one that slides (Mistral's every
                                         layer). At most DT_LLAMA_MAX_LAYERS layers with a window or a local
                                         RoPE base */
    uint8_t nope_layers[DT_LLAMA_MAX_LAYERS]; /* 1 for a layer whose q and k are not rotated (no
                                         positional encoding, NoPE: SmolLM3's no_rope_layers 0, every fourth
                                         layer by default); 0 for one with RoPE (every layer of the others). At
                                         most DT_LLAMA_MAX_LAYERS layers with a NoPE one */
    double attention_dropout;         /* dropout on the attention's probabilities in training (transformers'
                                         attention_dropout; every query head its own mask, with the window
                                         and the soft cap where the layer has them), in [0, 1); 0: none */
    bool has_pad_token;               /* config.json's pad_token_id is set: */
    int64_t pad_token_id;             /* the embedding row whose lookups pass no gradient back, as
                                         transformers' nn.Embedding(padding_idx=pad_token_id) (a tied
                                         head's use of the row still trains it), and which a model
                                         built from scratch starts at zero, as transformers' init */
    /* Mixture of experts (Mixtral, Qwen3-MoE): a sparse block in place of the MLP of every layer that
       dense_layers leaves 0. A linear router (gate.weight [E, C], no bias) scores the E experts; the
       softmax of its logits in f32 picks each token's top num_experts_per_tok, whose probabilities
       (renormalised to sum 1 with norm_topk_prob) weight the outputs of those experts' SwiGLU MLPs
       (w1/gate_proj, w3/up_proj [I, C], w2/down_proj [C, I] with I moe_intermediate_size), added up.
       Each expert runs on the tokens routed to it only. No auxiliary load-balancing loss. */
    int64_t num_experts;              /* E; 0: no experts (every layer's MLP dense) */
    int64_t num_experts_per_tok;      /* k, in [1, E] */
    int64_t moe_intermediate_size;    /* each expert's I */
    bool norm_topk_prob;              /* the k weights divided by their sum (Mixtral always) */
    bool moe_mixtral_names;           /* Mixtral's names: block_sparse_moe.{gate, experts.N.{w1, w2, w3}};
                                         else Qwen's: mlp.{gate, experts.N.{gate_proj, up_proj, down_proj}} */
    int64_t shared_expert_intermediate_size; /* > 0: Qwen2-MoE's shared expert beside the routed ones, a SwiGLU
                                         MLP of this size (mlp.shared_expert.{gate,up,down}_proj) on every token,
                                         its output times sigmoid(mlp.shared_expert_gate(x)) ([1, C]) added to
                                         theirs; 0: none */
    uint8_t dense_layers[DT_LLAMA_MAX_LAYERS]; /* with num_experts: 1 for a layer whose MLP is the dense one
                                         (intermediate_size; Qwen's mlp_only_layers and decoder_sparse_step),
                                         0 for a sparse one. At most DT_LLAMA_MAX_LAYERS layers with experts */
} dt_llama_config;

/* The named configuration into *out: "llama-tiny" (for tests: V 512, C 64,
 * I 176, L 2, H 4, KV 2, hd 16, 128 positions, untied head, eps 1e-5) and
 * "llama-100m" (V 32000, C 768, I 2048, L 12, H 12, KV 4, hd 64, 1024
 * positions, tied head: 100,092,672 parameters); theta 10000, no rope scaling, no
 * biases, init std 0.02. DT_ERR_NOT_FOUND for another name. */
DT_API dt_status dt_llama_config_by_name(const char *name, dt_llama_config *out);
/* Check a configuration: sizes >= 1, KV divides H, hd even and <= 256 (the
 * attention kernel), eps > 0, theta > 0, the scaling's factors. A message
 * naming the key on failure (DT_ERR_INVALID_ARG / DT_ERR_UNSUPPORTED). */
DT_API dt_status dt_llama_config_check(const dt_llama_config *lc);
/* The rotary inverse frequencies of lc (rotary width / 2 of them: hd/2
 * without a rotary_dim) with its scaling into out, in f32 as transformers
 * computes them, for a forward whose positions are below seq_len (longrope
 * takes its long factors when seq_len passes
 * rope_original_max_position_embeddings; the other kinds ignore it). */
DT_API dt_status dt_llama_inv_freq(const dt_llama_config *lc, int64_t seq_len, float *out);
/* Build a Llama decoder with Hugging Face's names (model.embed_tokens,
 * model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
 * post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head;
 * Linear weights [out, in]) and init (every Linear and the embedding
 * N(0, initializer_range), biases 0, norms 1; no residual rescaling) from
 * the Philox stream of seed. Blocks are modules of type
 * "LlamaDecoderLayer" (activation-checkpoint units). c supplies the build
 * options and seq (tokens per sample in the descriptor; 0 =
 * max_position_embeddings); c's GPT-2 fields are not read (NULL:
 * defaults). Input [B, T] i64 ids, output logits [B, T, V], loss the mean
 * next-token cross-entropy. Pipeline units: registered on the model
 * (dt_model_set_pipe_units, read by dt_model_pipe_units). Tensor parallelism with c->tp (Megatron's split of
 * q/k/v/o and gate/up/down, the key/value heads divided over the ranks,
 * the vocabulary split; the parameters keep their global names with the
 * rank's shapes): num_attention_heads, num_key_value_heads and
 * intermediate_size must be divisible by the group's size
 * (DT_ERR_INVALID_ARG naming the key); dt_model_create fills the slices
 * from the one-process init (dt_model_init_tp). c->dropout > 0 is the
 * attention's dropout in place of lc->attention_dropout (Llama has no
 * other); each attention module then has a Dropout child "attn_dropout"
 * that keys its masks (none at 0: the same modules, and random-stream
 * state, as a model without dropout), a tensor-parallel rank drawing its
 * heads' part of the one-process mask, a context-parallel one its rows'.
 * c->sequence_parallel with tp: Megatron's sequence parallelism, the norms
 * and residual adds on the rank's T/t rows (T divisible by t, else
 * DT_ERR_INVALID_ARG; with cp a cp rank's T/cp rows split again; not with
 * LoRA: DT_ERR_UNSUPPORTED); its
 * pipeline units then pass the rank's rows between stages (the embedding
 * unit splits them, the final norm's gathers them for the head).
 * With lc->num_experts > 0 the layers dense_layers leaves 0 have a sparse
 * mixture-of-experts block in place of the MLP (type
 * "MixtralSparseMoeBlock", named block_sparse_moe, with moe_mixtral_names;
 * else "Qwen3MoeSparseMoeBlock" (Qwen3-MoE, OLMoE), or
 * "Qwen2MoeSparseMoeBlock" with a shared expert, named mlp): its router
 * gate.weight [E, C]
 * and experts.{j}.{w1, w2, w3} (Mixtral) or experts.{j}.{gate_proj,
 * up_proj, down_proj}, each [I, C] or [C, I] (transformers 5's checkpoint
 * names); the router and the experts' projections are not Linear modules,
 * so LoRA refuses them as targets and "all-linear" passes them by. Tensor
 * and context parallelism and the pipeline's units are refused with
 * experts (DT_ERR_UNSUPPORTED); data parallelism and ZeRO 1-3 train them.
 * PyTorch's initial values (DT_INIT_TORCH) draw each of such a model's
 * parameters in model order, not transformers' order. */
DT_API dt_status dt_llama_create(const dt_llama_config *lc, uint64_t seed, const dt_model_config *c, dt_model **model,
                                 dt_model_desc *desc);
/* True when m is a Llama-family model of dt_llama_create; then *P = its
 * positions (max_position_embeddings) and *V = its vocabulary. Generation
 * and the pipeline units read them. */
DT_API bool dt_llama_positions(const dt_model *m, int64_t *P, int64_t *V);

/* ---- Hugging Face model directories ------------------------------------------------- */

/* The most ids config.json's eos_token_id may list. */
#define DT_HF_MAX_EOS 16

/* What DIR/config.json describes. */
typedef struct dt_hf_config {
    char architecture[64];  /* architectures[0]: "LlamaForCausalLM", "MistralForCausalLM",
                               "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
                               "Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                               "GraniteForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM",
                               "SmolLM3ForCausalLM", "MinistralForCausalLM", the mixtures of experts
                               "MixtralForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM" and
                               "OlmoeForCausalLM" (dt_llama_config.num_experts), or "GPT2LMHeadModel";
                               Gemma 3's image-text model, "Gemma3ForConditionalGeneration", is read
                               as its language model, "Gemma3ForCausalLM", from text_config (its
                               weights: dt_ckpt_open's view of the directory) */
    bool is_gpt2;           /* GPT2LMHeadModel: gpt2 holds it; else llama */
    dt_llama_config llama;  /* LlamaConfig's keys with its defaults; rope_theta and rope_scaling or
                               transformers 5's rope_parameters */
    dt_gpt2_config gpt2;    /* n_layer, n_head, n_embd, n_positions, vocab_size, the (equal) pdrops */
    int64_t bos_token_id;   /* bos_token_id (a list's first); -1: none (null or absent) */
    int64_t eos_token_ids[DT_HF_MAX_EOS]; /* eos_token_id: one id, or the list as given (Llama 3
                                             instruct: 128001, 128008, 128009), written back so */
    int n_eos;              /* ids in eos_token_ids; 0: none (null, [] or absent) */
} dt_hf_config;
/* Read and check DIR/config.json. Errors name the file and the key:
 * DT_ERR_UNSUPPORTED for an unknown architecture or a value dtrain does not
 * implement (a rope_scaling type other than default/linear/llama3/yarn/
 * dynamic (NTK-aware: the default frequencies within
 * max_position_embeddings, where dtrain runs), or
 * for Phi-3 other than default/longrope (its su and yarn are read as
 * longrope, as Phi3Config reads them), hidden_act other than silu (Gemma:
 * GELU's tanh form), a rope type other than default for Gemma 3's sliding
 * layers, Phi-3's residual and embedding dropouts, ...; attention_dropout
 * is read, in [0, 1), else DT_ERR_FORMAT),
 * DT_ERR_FORMAT for a malformed value, DT_ERR_NOT_FOUND without the file.
 * dt_model_create("hf:DIR", ...) builds the model it describes (after
 * checking the weights' embedding against vocab_size and the width, and a
 * tied configuration's lm_head.weight, if the weights hold one, against the
 * embedding: DT_ERR_MISMATCH);
 * the weights are then loaded with dt_trainer_load_weights(tr, DIR) (train.h),
 * which reads model.safetensors or the shards of
 * model.safetensors.index.json (ckpt.h dt_ckpt_open) in f32, bf16 or f16. */
DT_API dt_status dt_hf_config_read(const char *dir, dt_hf_config *out);
/* The configuration of zoo model `name` built with c (NULL: defaults), as
 * a Hugging Face config: GPT-2 sizes -> GPT2LMHeadModel, Llama sizes ->
 * LlamaForCausalLM (c's size overrides applied as dt_model_create does),
 * "hf:DIR" -> DIR/config.json. DT_ERR_UNSUPPORTED for the ConvNet and the
 * MLP. */
DT_API dt_status dt_model_hf_config(const char *name, const dt_model_config *c, dt_hf_config *out);

/* An output directory held for dt_hf_save (dt_hf_save_lock_open). */
typedef struct dt_hf_save_lock dt_hf_save_lock;

/* Options of dt_hf_save. */
typedef struct dt_hf_save_params {
    uint64_t max_shard_bytes; /* a shard's tensor bytes at most (one larger tensor gets a shard of its
                                 own); one shard is model.safetensors, more are
                                 model-0000i-of-0000n.safetensors with model.safetensors.index.json;
                                 default 5,000,000,000 (save_pretrained's "5GB") */
    dt_dtype dtype;           /* the weights' dtype: DT_F32 (default), DT_BF16 or DT_F16 */
    float lora_scaling;       /* a source holding LoRA adapters ("L.lora_A.weight" [r, in],
                                 "L.lora_B.weight" [out, r] beside "L.weight"): each is merged as
                                 PEFT's merge_and_unload does, L.weight += lora_scaling * B @ A
                                 (transposed for a GPT-2 Conv1D), in f32; lora_scaling is alpha / r
                                 (alpha / sqrt(r) with rsLoRA). Default 0: a source with adapters
                                 is refused (DT_ERR_INVALID_ARG), never exported as its base */
    const dt_lora_params *lora; /* the adapters' settings (NULL: default): with them each layer's
                                 scaling is its own (dt_lora_layer_scaling: PEFT's rank_pattern
                                 and alpha_pattern), in place of lora_scaling; an adapter whose
                                 rank is not its layer's is DT_ERR_SHAPE naming it (borrowed
                                 during the call) */
    const char *tokenizer;    /* a tokenizer.json (or a directory holding one) to write with the model:
                                 copied byte for byte, with tokenizer_config.json and
                                 special_tokens_map.json (tokenizer.h dt_tokenizer_hf_files), so
                                 AutoTokenizer.from_pretrained(out) loads it; checked by loading it
                                 before anything is written (its errors name the file and the key);
                                 NULL (default): no tokenizer files */
    const char *chat_template; /* with tokenizer: the chat template tokenizer_config.json gets in place of the
                                  tokenizer's own (a run's --chat-template; NULL (default): its own) */
    const char *generation_from; /* a Hugging Face model directory (an hf:DIR model's own) whose
                                    generation_config.json is written in place of the one made from h's
                                    special tokens, byte for byte, so its sampling settings (do_sample,
                                    temperature, top_k, top_p, repetition_penalty, stop tokens) stay;
                                    read first as dt_hf_generation_config reads it (generate.h; its
                                    errors name the file and the key). A directory without one, or NULL
                                    (default): the one made from h */
    const dt_hf_save_lock *lock; /* out's lock, held by the caller since before out was checked
                                    (dt_hf_save_lock_open: a training run takes it at its start); NULL
                                    (default): dt_hf_save takes it for the length of the save */
} dt_hf_save_params;
DT_API dt_hf_save_params dt_hf_save_params_default(void);
/* Write the Hugging Face model directory `out` (config.json from h,
 * generation_config.json, the weights) from src, anything dt_ckpt_open
 * reads: a dtrain checkpoint of any strategy (each parameter whole; its
 * fp32 master when it has one), a safetensors file, a model directory.
 * The tensors are h's model's parameters under transformers' names (a tied
 * head left out, as save_pretrained does), so
 * AutoModelForCausalLM.from_pretrained(out) finds no missing or unexpected
 * key; with p->tokenizer, the tokenizer files too. out must not exist or be
 * an empty directory (dt_hf_save_check_out), and is locked for the save
 * (dt_hf_save_lock_open) unless p->lock holds it already;
 * everything is written into a temporary directory beside it and renamed:
 * out appears complete or not at all (a rename that fails, out filled
 * meanwhile by a writer that took no lock, leaves the complete temporary
 * directory, named in the error). Errors: a tensor src lacks or holds
 * in another shape (DT_ERR_NOT_FOUND / DT_ERR_SHAPE, naming it), I/O. p
 * NULL: defaults. */
DT_API dt_status dt_hf_save(const char *src, const dt_hf_config *h, const char *out, const dt_hf_save_params *p);
/* DT_OK when out can be written by dt_hf_save: it does not exist, or is an
 * empty directory; else DT_ERR_INVALID_ARG naming it (a file, a symlink, a
 * directory with something in it). */
DT_API dt_status dt_hf_save_check_out(const char *out);
/* Hold out for a dt_hf_save to come, so that a second writer given the
 * same out is refused now, not when it saves: out is checked as
 * dt_hf_save_check_out does, made (with its missing parents) when it does
 * not exist, and locked (flock; dt_dir_hold, base.h) until
 * dt_hf_save_lock_close or the process's end. DT_ERR_STATE when another
 * process holds it; a file system without flock on directories leaves it
 * unlocked (the checks stand). Pass the lock to dt_hf_save in
 * dt_hf_save_params.lock. */
DT_API dt_status dt_hf_save_lock_open(const char *out, dt_hf_save_lock **lock);
/* Let go of out; when the lock made it and it is still the empty directory
 * locked, it is removed, with the parents the lock made (a run that failed
 * before it saved leaves nothing). NULL: nothing. */
DT_API void dt_hf_save_lock_close(dt_hf_save_lock *lock);
/* The local copy of Hugging Face Hub model repo_id ("org/name", or
 * "name") that huggingface_hub's cache holds (from_pretrained,
 * snapshot_download and `hf download` leave it there), into out[0, n):
 * CACHE/models--org--name/snapshots/REV, REV the commit its refs/main
 * names (else its only snapshot); CACHE is $HF_HUB_CACHE, else
 * $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub, huggingface_hub's order. DT_ERR_NOT_FOUND
 * naming the directory looked in when the cache holds no snapshot of it;
 * DT_ERR_INVALID_ARG when repo_id is not a repository id (a path: one
 * starting with / or ., two slashes, characters other than letters,
 * digits, '-', '_' and '.'). */
DT_API dt_status dt_hf_hub_snapshot(const char *repo_id, char *out, size_t n);
/* True when model name is "hf:DIR" and DIR/tokenizer.json is a regular
 * file; its path is then in path[0, n). The tokenizer a run from DIR writes
 * with dt_hf_save when not told another. */
DT_API bool dt_hf_dir_tokenizer(const char *name, char *path, size_t n);


/* Build zoo model `name` (initialised from seed as dt_model_build does, or
 * with cfg->build.init DT_INIT_TORCH as dt_model_init_torch does: PyTorch's
 * initial values, drawn once) into *model and its descriptor into *desc
 * (may be NULL). cfg NULL: defaults.
 * DT_ERR_NOT_FOUND for an unknown name, DT_ERR_INVALID_ARG for a bad cfg. */
DT_API dt_status dt_model_create(const char *name, uint64_t seed, const dt_model_config *cfg, dt_model **model,
                                 dt_model_desc *desc);
/* (Re)initialise m, built by dt_model_create(name, .., cfg) with cfg->tp
 * set, to its slices of the single-process model's initial values: those
 * of dt_model_build (DT_INIT_PHILOX, what dt_model_create already did) or
 * of dt_model_init_torch (DT_INIT_TORCH) with `seed`. Builds the
 * single-process model meta for its layout (dt_tp_init_from: time and
 * memory of one full model's parameters). Collective over nothing; every
 * rank calls it for its own slices. */
DT_API dt_status dt_model_init_tp(dt_model *m, const char *name, const dt_model_config *cfg, dt_init_rng rng,
                                  uint64_t seed);
/* The zoo's names, NULL-terminated. */
DT_API const char *const *dt_model_zoo_names(void);

/* Shapes of a batch of B: the input (ndim into *ndim, dims into shape[]),
 * the target (*target_ndim 0 when there is none; may be NULL with the next
 * two) and its dtype. DT_ERR_INVALID_ARG for B < 0. */
DT_API dt_status dt_model_desc_shapes(const dt_model_desc *d, int64_t batch, int *ndim, int64_t *shape,
                                      int *target_ndim, int64_t *target_shape, dt_dtype *target_dtype);
/* Check that ds's items are the model's input (dtype and shape of one
 * sample) and, for a model with a target, that its targets have the
 * target's dtype and dimensions. DT_ERR_SHAPE naming the dataset's source
 * and both shapes ("/d/t10k-images-idx3-ubyte: items are (1, 14, 14) f32,
 * model 'convnet' takes (1, 28, 28) f32"). Call it for every split. */
DT_API dt_status dt_model_desc_check_dataset(const dt_model_desc *d, const dt_dataset *ds);
/* Activation checkpointing of the model's own units (d->ckpt_unit: every
 * module of that type, the first p->number_checkpoints of them when > 0;
 * dt_model_checkpoint_type) with options p; p NULL turns them off. *count
 * (may be NULL): modules checkpointed. DT_ERR_UNSUPPORTED when d names no
 * unit. Losses are bit for bit those without checkpointing. */
DT_API dt_status dt_model_desc_checkpoint(dt_model *m, const dt_model_desc *d, const dt_act_ckpt_params *p,
                                          int *count);
/* The descriptor's loss of output against target (NULL when has_target is
 * false). DT_ERR_UNSUPPORTED for DT_LOSS_NONE. NULL inputs propagate. */
DT_API dt_tensor *dt_model_desc_loss(dt_ctx *ctx, const dt_model_desc *d, dt_tensor *output, dt_tensor *target);
/* The same with the argument order of a trainer's custom loss (train.h
 * dt_trainer_loss_fn; desc is a dt_model_desc *): tp.loss_fn =
 * dt_model_desc_loss_fn, tp.loss_ud = &desc trains a zoo model with its loss. */
DT_API dt_tensor *dt_model_desc_loss_fn(void *desc, dt_ctx *ctx, dt_tensor *output, dt_tensor *target);

/* Generation from a GPT-2 model (dt_model_generate): generate.h, included here. */

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_MODELS_H */
