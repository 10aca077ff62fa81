/* dtrain/generate.h — autoregressive generation from a GPT-2 or Llama model.
 *
 * Overview
 * --------
 * nanoGPT's generate, with transformers' sampling filters and stop
 * tokens: for each new token, run the model on the sequence so far (no
 * gradients, eval mode: dropout off), take the last position's logits,
 * lower those of the tokens already there (a repetition penalty, off by
 * default), divide them by the temperature, keep the top k, then the top p of the
 * probability (nucleus sampling, as transformers' TopPLogitsWarper), and
 * pick greedily (temperature 0) or by sampling with a Philox draw keyed by
 * (seed, DT_RNG_USER, "gen", token index): the same seed and weights give
 * the same tokens on any machine and thread count. Generation stops after
 * max_new_tokens or after a token of eos_ids (which is kept, as
 * transformers' generate keeps it). A key/value cache runs the prompt once
 * and then each new token alone while the sequence fits the model's
 * positions; past them the window of the last block_size tokens moves, a
 * forward over it per token. The model is a GPT-2 or Llama zoo model
 * (models.h; an hf:DIR directory's too) whose forward maps token ids
 * [1, T] to logits [1, T, V]. The same loop runs through a pipeline's
 * stages (dt_strategy_pipe_generate, pipeline.h).
 *
 * Usage
 * -----
 *     dt_generate_params gp = dt_generate_params_default();
 *     gp.max_new_tokens = 32, gp.temperature = 0.8f, gp.top_k = 40, gp.top_p = 0.9f, gp.seed = 7;
 *     gp.eos_ids[0] = 50256, gp.n_eos = 1; // stop after GPT-2's <|endoftext|>
 *     int64_t out[256], n;
 *     if (dt_model_generate(m, &gp, prompt, nprompt, out, 256, &n) < 0) { report dt_last_error(); }
 *     // out[0..n): the prompt, then the new tokens
 */
#ifndef DTRAIN_GENERATE_H
#define DTRAIN_GENERATE_H

#include "dtrain/base.h"
#include "dtrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most stop tokens dt_generate_params holds (Llama 3's instruct models name three): as many as
 * a config.json's eos_token_id may list (models.h DT_HF_MAX_EOS). */
#define DT_GENERATE_MAX_EOS 16

/* Options of dt_model_generate (nanoGPT's generate, transformers' filters). */
typedef struct dt_generate_params {
    int64_t max_new_tokens; /* tokens to add; default 64 */
    float temperature;      /* logits are divided by it; 0 = greedy (argmax); default 1 */
    int64_t top_k;          /* sample among the k most likely tokens (ties at the k-th kept); 0 = all;
                               default 0 */
    float top_p;            /* nucleus sampling, after top_k (transformers' TopPLogitsWarper): the tokens
                               sorted by probability, those whose cumulative probability from the least
                               likely up is at most 1 - top_p are dropped, the most likely always kept;
                               in (0, 1], 1 = off (default). Greedy ignores it */
    float repetition_penalty; /* transformers' repetition_penalty: before everything else, the logit of
                                 every token already in the sequence (prompt included, each once) is
                                 divided by it where positive and multiplied where negative (greedy
                                 too); > 0, 1 = off (default) */
    int64_t eos_ids[DT_GENERATE_MAX_EOS]; /* stop tokens: generation ends after one of them (kept in
                                             the output); ids in [0, V) */
    int n_eos;                            /* how many of eos_ids are set; default 0: no stop token */
    uint64_t seed;          /* sampling draws: Philox (seed, DT_RNG_USER, "gen", token index); default 0 */
    bool kv_cache;          /* true (default): dt_model_generate keeps each block's keys and values,
                               runs the prompt once and then each new token alone while the
                               sequence fits block_size (past it, the window moves: a forward
                               over it per token); false: a forward over the window per token.
                               The tokens are the same; the logits agree to rounding (the
                               cached path's matmuls have other shapes). Not under the pipe
                               strategy (dt_strategy_pipe_generate: always the window) */
} dt_generate_params;
DT_API dt_generate_params dt_generate_params_default(void);
/* Continue prompt[0..nprompt) (token ids in [0, V)) with a GPT-2 or Llama model:
 * out[0..*nout) = the prompt then up to max_new_tokens new tokens (fewer
 * when one of eos_ids ends it), each
 * from the model run on the last block_size tokens in eval mode without
 * gradients (the model's train/eval mode is restored after). cap: room in
 * out (>= nprompt + max_new_tokens). gp NULL: defaults. Same seed and
 * weights give the same tokens. DT_ERR_UNSUPPORTED for a model that is
 * neither; DT_ERR_RANGE for a prompt token or a stop token outside [0, V);
 * DT_ERR_INVALID_ARG for a top_p outside (0, 1], a repetition_penalty
 * not > 0, or n_eos outside
 * [0, DT_GENERATE_MAX_EOS].
 * Under the "pipe" strategy no rank holds the whole model: generate with
 * dt_strategy_pipe_generate (pipeline.h), the same loop through the
 * pipeline's stages, on every rank of the pipeline (the same tokens). */
DT_API dt_status dt_model_generate(dt_model *m, const dt_generate_params *gp, const int64_t *prompt, int64_t nprompt,
                                   int64_t *out, int64_t cap, int64_t *nout);

/* The generation settings of Hugging Face model directory dir, as
 * transformers' generate() takes them: from dir/generation_config.json, or
 * when it is absent from dir/config.json's same keys. do_sample false or
 * absent: greedy (temperature 0; top_k and top_p left as gp has them);
 * true: temperature (default 1), top_k (default 50) and top_p (default 1).
 * repetition_penalty (default 1) either way.
 * eos_token_id (an id or a list of at most DT_GENERATE_MAX_EOS ids; absent
 * or null: none; a longer list is DT_ERR_UNSUPPORTED) sets eos_ids and n_eos; max_new_tokens, when given, sets
 * max_new_tokens. seed and kv_cache are not touched. Keys that change the
 * decoding in ways dt_model_generate does not implement (num_beams > 1,
 * no_repeat_ngram_size, min_new_tokens, ...) are
 * not refused: they are named in ignored[0, n) ("" when none; may be NULL)
 * for the caller to say so. DT_ERR_FORMAT naming the file and the key for
 * a malformed value, DT_ERR_NOT_FOUND when dir has neither file. */
DT_API dt_status dt_hf_generation_config(const char *dir, dt_generate_params *gp, char *ignored, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_GENERATE_H */
