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
 * the same tokens on any machine and thread count. Before the
 * temperature, transformers' other logits processors run in its order: the
 * repetition penalty, no_repeat_ngram_size (a token that would repeat an
 * n-gram of the sequence, prompt included, gets -inf) and min_length /
 * min_new_tokens (the stop tokens get -inf until the sequence is that
 * long). Generation stops after
 * max_new_tokens or after a token of eos_ids (which is kept, as
 * transformers' generate keeps it). num_beams > 1 (with temperature 0:
 * transformers' do_sample false) is its beam search instead: the
 * num_beams best running sequences by the sum of their tokens' log_softmax
 * (taken before the processors, which then apply to the log-probabilities,
 * as transformers does), the finished ones ranked by that sum over
 * (new tokens)^length_penalty, early_stopping deciding when to stop; the
 * best finished sequence comes back (with a temperature > 0 its beam
 * sampling: the filters on each beam, the pairs drawn). A key/value cache runs the prompt once
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
 *     gp.no_repeat_ngram_size = 3;           // never the same three tokens twice
 *     // or beam search: gp.temperature = 0, gp.num_beams = 4, gp.length_penalty = 1, gp.min_new_tokens = 8;
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

/* When beam search stops (transformers' early_stopping). */
typedef enum dt_early_stopping {
    DT_EARLY_STOPPING_FALSE = 0, /* transformers' false (default): stop when the best running sequence,
                                    scored at the current length, cannot beat the worst of num_beams finished */
    DT_EARLY_STOPPING_TRUE,      /* true: stop as soon as num_beams sequences have finished */
    DT_EARLY_STOPPING_NEVER,     /* "never": as false, but with length_penalty > 0 the running sequence is
                                    scored at max_new_tokens (the canonical beam search's bound) */
} dt_early_stopping;

/* Options of dt_model_generate (nanoGPT's generate, transformers' filters). */
typedef struct dt_generate_params {
    int64_t max_new_tokens; /* tokens to add; default 64 */
    float temperature;      /* logits are divided by it; 0 = greedy (argmax); default 1 */
    float top_h;            /* Top-H, before top_k (transformers' TopHLogitsWarper): of the 100 most likely
                               tokens (q their probabilities among them, H their entropy), the most likely
                               first while the running sum of -q log q stays within top_h H (the first
                               always); in [0, 1], 0 = off (default). Greedy ignores it */
    int64_t top_k;          /* sample among the k most likely tokens (ties at the k-th kept); 0 = all;
                               default 0 */
    float top_p;            /* nucleus sampling, after top_k (transformers' TopPLogitsWarper): the tokens
                               sorted by probability, those whose cumulative probability from the least
                               likely up is at most 1 - top_p are dropped, the most likely always kept;
                               in (0, 1], 1 = off (default). Greedy ignores it */
    float min_p;            /* after top_p (transformers' MinPLogitsWarper): a token less likely than
                               min_p times the most likely one is dropped; in [0, 1], 0 = off
                               (default). Greedy ignores it */
    float typical_p;        /* typical sampling, after min_p (TypicalLogitsWarper): the tokens ranked by
                               how far their -log p lies from the distribution's entropy, the nearest
                               first, kept until they hold typical_p of the probability (the first
                               one that reaches it included, as are those as near as it); in (0, 1],
                               1 = off (default). Greedy ignores it */
    float epsilon_cutoff;   /* after typical_p (EpsilonLogitsWarper): a token whose probability (of what
                               the filters before left) is below it is dropped, the most likely kept;
                               in [0, 1), 0 = off (default). Greedy ignores it */
    float eta_cutoff;       /* then eta sampling (EtaLogitsWarper): the same with the cutoff
                               min(eta_cutoff, sqrt(eta_cutoff) exp(-H)), H the entropy of those
                               probabilities; in [0, 1), 0 = off (default). Greedy ignores it */
    float repetition_penalty; /* transformers' repetition_penalty: before everything else, the logit of
                                 every token already in the sequence (prompt included, each once) is
                                 divided by it where positive and multiplied where negative (greedy
                                 too); > 0, 1 = off (default) */
    int64_t eos_ids[DT_GENERATE_MAX_EOS]; /* stop tokens: generation ends after one of them (kept in
                                             the output); ids in [0, V) */
    int n_eos;                            /* how many of eos_ids are set; default 0: no stop token */
    int64_t min_new_tokens; /* transformers' MinNewTokensLengthLogitsProcessor: the stop tokens' scores are
                               -inf until this many new tokens are there; >= 0, default 0 */
    int64_t min_length;     /* MinLengthLogitsProcessor: the same until the sequence, prompt included, holds
                               this many tokens; >= 0, default 0 (the larger of the two bounds applies) */
    int64_t no_repeat_ngram_size; /* NoRepeatNGramLogitsProcessor: a token that would complete an n-gram
                                     already in the sequence (prompt included) gets -inf; 0 = off (default) */
    int64_t num_beams;      /* 1 (default): one sequence; > 1: beam search, or with a temperature > 0
                               beam sampling (transformers' do_sample: the warpers on each beam's
                               log-probabilities, keeping at least max(2, 1 + n_eos) tokens, and
                               2 num_beams (beam, token) pairs drawn without replacement from the
                               softmax of their scores; Philox draws keyed by seed and the step).
                               The beams run as one batch of num_beams
                               rows, with kv_cache one cached sequence per beam (a beam that continues
                               another takes its cached positions) */
    float length_penalty;   /* beam search: a finished sequence scores its log-probability sum over
                               (new tokens)^length_penalty; finite, default 1 */
    dt_early_stopping early_stopping; /* beam search: when to stop; default DT_EARLY_STOPPING_FALSE */
    uint64_t seed;          /* sampling draws: Philox (seed, DT_RNG_USER, "gen", token index); default 0 */
    bool kv_cache;          /* true (default): dt_model_generate keeps each block's keys and values,
                               runs the prompt once and then each new token alone while the
                               sequence fits block_size (past it, the window moves: a forward
                               over it per token); false: a forward over the window per token.
                               The tokens are the same; the logits agree to rounding (the
                               cached path's matmuls have other shapes). Not under the pipe
                               strategy (dt_strategy_pipe_generate: always the window). A
                               model with a sliding window (dt_llama_config.sliding_window)
                               runs past it cached or not, each token at its own position seeing
                               the last sliding_window ones in the sliding layers (transformers'
                               generate) */
    int (*on_token)(void *ud, const int64_t *seq, int64_t n); /* dt_model_generate with one sequence
                               (num_beams 1): called after each new token with the sequence so far
                               seq[0..n) (the prompt first; read during the call); a non-zero return
                               stops generation there (DT_OK, *nout n): streaming output, the
                               caller's own stop rules. NULL (default): none. Beam search (its
                               sequence is known at the end) and dt_strategy_pipe_generate do not
                               call it */
    void *on_token_ud;      /* on_token's ud */
} dt_generate_params;
DT_API dt_generate_params dt_generate_params_default(void);
/* Continue prompt[0..nprompt) (token ids in [0, V)) with a GPT-2 or Llama model:
 * out[0..*nout) = the prompt then up to max_new_tokens new tokens (fewer
 * when one of eos_ids ends it), each
 * from the model run on the last block_size tokens in eval mode without
 * gradients (the model's train/eval mode is restored after). cap: room in
 * out (>= nprompt + max_new_tokens). gp NULL: defaults. Same seed and
 * weights give the same tokens. With num_beams > 1: the best finished
 * beam (up to max_new_tokens new tokens, its stop token kept).
 * DT_ERR_UNSUPPORTED for a model that is
 * neither, or num_beams > 1 under the pipe strategy; DT_ERR_RANGE for a prompt token or a stop token outside [0, V);
 * DT_ERR_INVALID_ARG for a top_p or typical_p outside (0, 1], a min_p
 * or top_h outside [0, 1], an epsilon_cutoff or eta_cutoff outside [0, 1), a repetition_penalty
 * not > 0, n_eos outside [0, DT_GENERATE_MAX_EOS], a negative
 * min_new_tokens, min_length or no_repeat_ngram_size, num_beams < 1, a
 * length_penalty that is not finite or an early_stopping outside the enum;
 * DT_ERR_NO_MEMORY (nothing run) when the beams' buffers do not fit.
 * Under the "pipe" strategy no rank holds the whole model: generate with
 * dt_strategy_pipe_generate (pipeline.h), the same loop through the
 * pipeline's stages, on every rank of the pipeline (the same tokens). */
DT_API dt_status dt_model_generate(dt_model *m, const dt_generate_params *gp, const int64_t *prompt, int64_t nprompt,
                                   int64_t *out, int64_t cap, int64_t *nout);
/* The positions of m, a model dt_model_generate takes: a GPT-2 model's
 * n_positions (its position embedding's rows), a Llama model's
 * max_position_embeddings; a sequence longer than that is generated with
 * the window of the last that many tokens moving (each new token sees
 * those alone). 0 for any other model. */
DT_API int64_t dt_generate_positions(const dt_model *m);

/* The generation settings of Hugging Face model directory dir, as
 * transformers' generate() takes them: from dir/generation_config.json, or
 * when it is absent from dir/config.json's same keys. do_sample false or
 * absent: greedy (temperature 0; top_k, top_p, min_p, typical_p and the
 * cutoffs left as gp has them); true: temperature (default 1), top_k
 * (default 50), top_p (default 1), min_p (default none: 0), typical_p
 * (default 1), epsilon_cutoff and eta_cutoff (default 0; transformers
 * applies them only below 1: 1 or more leaves them off) and top_h (default
 * none: 0; in (0, 1]).
 * repetition_penalty (default 1) either way, and min_new_tokens (it wins
 * over min_length, as in transformers), min_length, no_repeat_ngram_size,
 * num_beams, length_penalty and early_stopping (true, false or "never"),
 * each at GenerationConfig's default when absent.
 * eos_token_id (an id or a list of at most DT_GENERATE_MAX_EOS ids; absent
 * or null: none; a longer list is DT_ERR_UNSUPPORTED) sets eos_ids and n_eos; max_new_tokens, when given, sets
 * max_new_tokens. seed and kv_cache are not touched. Keys that change the
 * decoding in ways dt_model_generate does not implement (penalty_alpha:
 * contrastive search) are
 * not refused: they are named in ignored[0, n) ("" when none; may be NULL)
 * for the caller to say so. DT_ERR_FORMAT naming the file and the key for
 * a malformed value, DT_ERR_NOT_FOUND when dir has neither file. */
DT_API dt_status dt_hf_generation_config(const char *dir, dt_generate_params *gp, char *ignored, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_GENERATE_H */
