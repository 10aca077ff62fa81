/* models/zoo.h — constructors of the zoo's models (internal). Each builds
 * its model into *out and fills the descriptor. */
#ifndef DT_MODELS_ZOO_H
#define DT_MODELS_ZOO_H

#include <dtrain/generate.h>
#include <dtrain/models.h>

dt_status dt__model_convnet(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);
/* GPT-2 by configuration name (gpt2.c); dt__model_is_gpt2 says whether a
 * name is one. */
dt_status dt__model_gpt2(const char *name, uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);
bool dt__model_is_gpt2(const char *name);
/* A GPT-2 configuration's own sizes and dropout: every size >= 1, n_head
 * divides n_embd, a head of at most 256 (the attention kernel), dropout in
 * [0, 1). hf_config.c checks config.json's with it. */
dt_status dt__gpt2_config_check(const dt_gpt2_config *g);
/* A token id key of a Hugging Face JSON file (v: its value; path and key
 * for messages): null or absent (0 ids), one id, or a list of at most cap
 * (Llama 3 instruct's eos_token_id), into ids[0, *n). DT_ERR_FORMAT for an
 * id outside [0, 2^31), DT_ERR_UNSUPPORTED for a longer list, each naming
 * the file and the key. hf_config.c and hf_generation.c read them so. */
struct cJSON;
dt_status dt__hf_token_ids(const struct cJSON *v, const char *path, const char *key, int64_t *ids, int cap, int *n);
/* The GPT's embeddings: drop(wte[idx] + wpe[0..T)) for the GPT2Model module
 * (the first pipeline unit and the model's own forward). */
dt_tensor *dt__gpt2_embed(dt_ctx *ctx, dt_module *transformer, dt_tensor *idx);
/* Half of a GPT2Block: x + attn(ln_1(x)) (half 0) or x + mlp(ln_2(x))
 * (half 1); the block's forward is the two in turn. The pipeline cuts a
 * block between them (gpt2.c's units) unless the block itself carries hooks,
 * a forward override or activation checkpointing
 * (dt__gpt2_block_hooked), which its whole forward runs. */
dt_tensor *dt__gpt2_block_half(dt_ctx *ctx, dt_module *block, dt_tensor *x, int half);
bool dt__gpt2_block_hooked(const dt_module *block);
/* Is out the hidden states that a fused_lm_loss GPT-2's training forward
 * returned in place of the logits (head: dt_model_desc.lm_head)? */
bool dt__gpt2_is_hidden(const dt_module *head, const dt_tensor *out);
/* Is name a named Llama configuration (llama.c)? */
bool dt__model_is_llama(const char *name);
/* The named Llama configuration with the zoo config's size overrides
 * (n_layer, n_head, n_embd, block_size, vocab_size). */
dt_status dt__llama_config_for(const char *name, const dt_model_config *c, dt_llama_config *lc);
/* A Llama model's positions (max_position_embeddings) and vocabulary, for
 * generation; false for another model. */
/* The model DIR/config.json describes (hf.c; dt_model_create("hf:DIR")). */
dt_status dt__model_hf(const char *dir, uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);
/* A meta build (names and shapes, no storage) of the model h describes:
 * the parameters an export writes (hf_save.c) and a directory's weights are
 * checked against (hf.c). */
dt_status dt__hf_meta_model(const dt_hf_config *h, dt_model **m);
/* The sparse mixture-of-experts block of a decoder layer of c (moe.c: c->num_experts experts, its router
 * "gate" and "experts.N.*" under Mixtral's or Qwen's names). c is borrowed for the module's life. */
dt_module *dt__moe_block(const dt_llama_config *c);
dt_status dt__model_mlp(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d);

/* The key/value cache of dt_model_generate (generate_kv.c). init: *out a
 * cache for B sequences (beams) of nprompt + nnew tokens for model m (cap:
 * as many of them as the model's positions hold), or NULL (DT_OK) where the
 * model is not a plain one-process GPT-2 or Llama-family zoo tree or the
 * prompt alone is longer than its positions. cap: the positions it holds;
 * the sequences run cached while they fit them. forward: the logits
 * [B, 1, V] (f32) of the last of each sequence's n tokens tok[b n + i]
 * (i < n), run at the positions after the ones cached, whose keys and
 * values it adds (no-grad context, eval mode: the caller's). len: positions
 * cached so far. reorder: sequence b continues sequence parent[b] (beam
 * search's choice; the cached positions are copied). */
typedef struct dt__gen_kv dt__gen_kv;
dt_status dt__gen_kv_init(dt_model *m, int64_t B, int64_t nprompt, int64_t nnew, dt__gen_kv **out);
int64_t dt__gen_kv_cap(const dt__gen_kv *kv);
void dt__gen_kv_reorder(dt__gen_kv *kv, const int64_t *parent);
void dt__gen_kv_free(dt__gen_kv *kv);
int64_t dt__gen_kv_len(const dt__gen_kv *kv);
/* Where a forward continuing a sequence of n tokens starts: len, or 0 when
 * the model recomputes its cache at n (Phi-3 with LongRoPE, as transformers'
 * Phi3ForCausalLM generates: the first time the sequence passes
 * original_max_position_embeddings, the keys cached with the short factors
 * are dropped and every position runs again with the long ones). */
int64_t dt__gen_kv_start(dt__gen_kv *kv, int64_t n);
dt_tensor *dt__gen_kv_forward(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n);
/* The keys and values themselves: L layers of B sequences of cap
 * positions of row (KV heads times hd) floats each, k and v
 * [L][B][cap][row]; len positions held (the same in every sequence).
 * window > 0: a query at position p sees the keys of positions
 * (p - window, p] only (Mistral's sliding window, transformers'
 * sliding_window_overlay) in the layers l where full is NULL or full[l]
 * is 0; 0: every earlier one. softcap > 0: Gemma 2's scores
 * softcap tanh(s / softcap). scratch: reorder's, one layer's
 * [B][cap][row] (B > 1). */
typedef struct {
    float *k, *v, *scratch;
    int L;
    int64_t B, row, cap, len, window;
    const uint8_t *full; /* borrowed from the model */
    float softcap;
} dt__kv_cache;
/* Sequence b continues sequence parent[b] (each in [0, B)): the len cached
 * positions of every layer copied so. */
void dt__kv_reorder(dt__kv_cache *c, const int64_t *parent);
/* Layer l's attention for n new rows at positions [c->len, c->len + n): q
 * [B, n, H hd], k and v [B, n, KV hd] (B: the cache's; any float dtype; views too), KV
 * dividing H (query head h reads kv head h / (H / KV)). Their keys and
 * values go into the cache; query i attends to positions [0, c->len + i]
 * (the last c->window of them when the cache has a window and layer l
 * slides; softmax of q.k / sqrt(hd), soft-capped with c->softcap, in
 * f32). Returns [B, n, H hd] in q's dtype;
 * c->len is the caller's to advance, after the last layer. NULL with
 * DT_ERR_SHAPE when the rows do not fit the cache. */
dt_tensor *dt__kv_attention(dt_ctx *ctx, dt__kv_cache *c, int l, dt_tensor *q, dt_tensor *k, dt_tensor *v, int H,
                            int KV);
/* A Llama-family model's side of the cache (llama.c). shape: whether m is a
 * Llama-family model whose forward can run cached (no context
 * parallelism; the caller checks that the tree is plain), with its layers,
 * the row of keys per position (KV hd), its positions
 * (max_position_embeddings) and its sliding window (0: none). forward: the model's own
 * forward over the B sequences' tokens tok[b n + i] (i < n) at positions
 * [c->len, c->len + n), each decoder
 * layer's attention through dt__kv_attention (RoPE at those positions),
 * the head on the last position only: logits [B, 1, V] in the model's
 * dtype; c->len unchanged. window: the sliding window of a Llama-family
 * model that has one (shorter than its positions), else 0; full: its layers' kinds
 * (dt_llama_config.full_attention_layers; borrowed from the model).
 * restart: LongRoPE's original_max_position_embeddings (dt__gen_kv_start),
 * else 0. softcap: Gemma 2's attn_logit_softcapping, else 0. */
typedef struct {
    int L;
    int64_t row, positions, window, restart;
    const uint8_t *full;
    float softcap;
} dt__llama_kv_info;
bool dt__llama_kv_shape(const dt_model *m, dt__llama_kv_info *out);
dt_tensor *dt__llama_kv_forward(dt_model *m, dt__kv_cache *c, dt_ctx *ctx, const int64_t *tok, int64_t n);

/* dt_model_generate's logits processors (generate.c), transformers' in its order: the repetition penalty
 * on every token of seq[0..n) (the sequence so far; its first nprompt tokens the prompt), no_repeat_ngram_size's
 * -inf on each token that would repeat an n-gram of seq, then min_length's and min_new_tokens' -inf on the stop
 * tokens while seq is shorter; s[0..V) (logits, or log-probabilities in beam search) in place. seen: V bytes
 * of scratch. */
void dt__gen_process(const dt_generate_params *p, const int64_t *seq, int64_t n, int64_t nprompt, float *s,
                     int64_t V, unsigned char *seen);
/* A token and its weight (or distance), for the sampling filters. */
typedef struct {
    double p;
    int64_t i;
} dt__gen_ranked;
/* transformers' sampling warpers in its order on scores[0..V) (logits, or a beam's processed
 * log-probabilities) at p's temperature > 0: top_h, top_k, top_p, min_p, typical_p, the epsilon and eta
 * cutoffs, each keeping at least keep tokens (min_tokens_to_keep: 1, beam sampling's max(2, 1 + n_eos)):
 * prob[j] = exp(s_j / T - max) for the tokens kept, 0 for the others; their sum returned (prob, r: room
 * for V). kept (V bytes, may be NULL): 1 for the tokens the warpers leave a finite score (a weight may
 * underflow to 0 and the token stay). generate.c. */
double dt__gen_warp(const float *scores, int64_t V, const dt_generate_params *p, int64_t keep, double *prob,
                    dt__gen_ranked *r, unsigned char *kept);
/* transformers' beam search (generate_beam.c) for dt_model_generate with p->num_beams > 1 (checked, one
 * process, eval mode): the prompt out[0..nprompt) continued, *nout the best finished sequence's length; kv: a
 * cache of num_beams sequences (dt__gen_kv_init) or NULL (the uncached forward); P, V: the model's positions and
 * vocabulary; ctx: the caller's (reset here). A temperature > 0 is beam sampling (transformers'
 * do_sample with num_beams > 1). */
dt_status dt__gen_beam(dt_model *m, dt_ctx *ctx, const dt_generate_params *p, dt__gen_kv *kv, int64_t P, int64_t V,
                       int64_t *out, int64_t nprompt, int64_t *nout);

/* Helpers of the models' pipeline units functions (zoo.c;
 * dt_model_set_pipe_units): fill unit u (name, module, function, the
 * parameter prefixes p0 and p1, or NULL; cost 0); the elements of module
 * mod's parameter i from its spec (0 if absent: a meta model's parameters
 * have no tensors yet); the elements of the weights (parameter 0) of
 * children a and b of parent's child `name`. */
void dt__zoo_unit(dt_pipe_unit *u, const char *name, dt_module *mod, dt_pipe_unit_fn fn, const char *p0,
                  const char *p1);
double dt__zoo_numel(const dt_module *mod, int i);
double dt__zoo_weights(const dt_module *parent, const char *name, const char *a, const char *b);

#endif
