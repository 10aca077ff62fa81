/* dtrain/generate.h — autoregressive generation from a GPT-2 model.
 *
 * Overview
 * --------
 * nanoGPT's generate: for each new token, run the model on the last
 * block_size tokens of the sequence so far (no gradients, eval mode: dropout
 * off), take the last position's logits, divide them by the temperature,
 * keep the top k, and pick greedily (temperature 0) or by sampling with a
 * Philox draw keyed by (seed, DT_RNG_USER, "gen", token index): the same
 * seed and weights give the same tokens on any machine and thread count.
 * There is no key/value cache: each token costs one forward over its
 * window. The model is any dt_model with GPT-2's embedding names
 * (transformer.wte.weight, transformer.wpe.weight: the zoo's "gpt2"
 * family, models.h) whose forward maps token ids [1, T] to logits
 * [1, T, V]. It lives in the train layer because the same loop runs through
 * a pipeline's stages (dt_strategy_pipe_generate, pipeline.h).
 *
 * Usage
 * -----
 *     dt_generate_params gp = dt_generate_params_default();
 *     gp.max_new_tokens = 32, gp.temperature = 0.8f, gp.top_k = 40, gp.seed = 7;
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

/* Options of dt_model_generate (nanoGPT's generate). */
typedef struct dt_generate_params {
    int64_t max_new_tokens; /* tokens to add; default 64 */
    float temperature;      /* logits are divided by it; 0 = greedy (argmax); default 1 */
    int64_t top_k;          /* sample among the k most likely tokens (ties at the k-th kept); 0 = all;
                               default 0 */
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
/* Continue prompt[0..nprompt) (token ids in [0, V)) with a GPT-2 zoo model:
 * out[0..*nout) = the prompt then up to max_new_tokens new tokens, each
 * from the model run on the last block_size tokens in eval mode without
 * gradients (the model's train/eval mode is restored after). cap: room in
 * out (>= nprompt + max_new_tokens). gp NULL: defaults. Same seed and
 * weights give the same tokens. DT_ERR_UNSUPPORTED for a model without
 * GPT-2's embeddings; DT_ERR_RANGE for a prompt token outside [0, V).
 * Under the "pipe" strategy no rank holds the whole model: generate with
 * dt_strategy_pipe_generate (pipeline.h), the same loop through the
 * pipeline's stages, on every rank of the pipeline (the same tokens). */
DT_API dt_status dt_model_generate(dt_model *m, const dt_generate_params *gp, const int64_t *prompt, int64_t nprompt,
                                   int64_t *out, int64_t cap, int64_t *nout);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_GENERATE_H */
