/* Autoregressive generation from a GPT-2 or Llama zoo model (nanoGPT's
 * generate): for each new token, run the model on the last block_size
 * tokens of the sequence so far (no-grad, eval mode: dropout off), take the
 * last position's logits, divide by the temperature, keep top_h's, the
 * top k, the top p (transformers' nucleus filter), min_p's, typical_p's and
 * the epsilon and eta cutoffs' tokens (its processors first: a repetition
 * penalty, the n-gram ban, the minimum length), and pick
 * greedily (temperature 0) or by sampling with a Philox draw keyed by
 * (seed, DT_RNG_USER, 0x67656e, token index): the same seed gives the
 * same text on any machine and thread count. In one process a key/value
 * cache (generate_kv.c; dt_generate_params.kv_cache, on by default) runs the
 * prompt once and then each new token alone, while the sequence fits the
 * window; past it, and without the cache, each token costs one forward over
 * the window. A model with a sliding window (Mistral's) runs past the
 * window as transformers does, every token at its position seeing the last
 * window positions (in its sliding layers), cached or not. num_beams > 1 is
 * transformers' beam search instead (generate_beam.c).
 *
 * Under the "pipe" strategy (dt_strategy_pipe_generate) the same loop runs
 * on every rank of the pipeline with the forward through the stages
 * (the evaluation's, dt_strategy_eval_forward): the last stage has
 * the logits and picks the token with the same pick and draw, then sends it
 * to every rank of its pipeline (dt_strategy_eval_share), so all of
 * them extend the same sequence. Still no cache: each token is a forward of
 * the whole window through the stages. */
#include "zoo.h"

#include <dtrain/generate.h>
#include <dtrain/models.h>
#include <dtrain/pipe_strategy.h>
#include <dtrain/tp.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

dt_generate_params dt_generate_params_default(void)
{
    dt_generate_params p = {.max_new_tokens = 64, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .typical_p = 1.0f,
                            .repetition_penalty = 1.0f, .seed = 0, .kv_cache = true, .num_beams = 1,
                            .length_penalty = 1.0f, .early_stopping = DT_EARLY_STOPPING_FALSE};
    return p;
}

typedef dt__gen_ranked ranked;

/* The k-th largest weight of prob[0..V) (1 <= k <= V; r: room for V). */
static double kth_weight(const double *prob, int64_t V, int64_t k, ranked *r)
{
    if (k <= 1) {
        double mx = 0;
        for (int64_t j = 0; j < V; j++)
            mx = prob[j] > mx ? prob[j] : mx;
        return mx;
    }
    for (int64_t j = 0; j < V; j++)
        r[j] = (ranked){prob[j], j};
    for (int64_t i = 0; i < k && i < V; i++) { /* partial selection: k passes, k is small */
        int64_t m = i;
        for (int64_t j = i + 1; j < V; j++)
            if (r[j].p > r[m].p)
                m = j;
        ranked t = r[i];
        r[i] = r[m], r[m] = t;
    }
    return r[(k < V ? k : V) - 1].p;
}

/* Most likely first; equal ones by id, the larger first (the reverse of
 * an ascending sort by (probability, id)), the same order everywhere. */
static int by_prob(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return x->p > y->p ? -1 : x->p < y->p ? 1 : (x->i < y->i) - (x->i > y->i);
}

/* transformers' TopPLogitsWarper on the weights prob[0..V) (sum: their sum):
 * from the least likely up, every token whose cumulative share is at most
 * 1 - top_p goes; that is, a token stays while the tokens more likely than
 * it hold less than top_p, and the most likely one always stays. Only the
 * candidates are sorted: the tokens of weight >= t, t lowered from the
 * largest weight until they hold top_p; every token below t has them above
 * it and goes. keep: the most likely that stay whatever their share
 * (transformers' min_tokens_to_keep). The new sum. */
static double top_p_filter(double *prob, int64_t V, double sum, float top_p, int64_t keep, ranked *r)
{
    double t = 0;
    for (int64_t j = 0; j < V; j++)
        t = prob[j] > t ? prob[j] : t;
    for (int pass = 0;; pass++) {
        double mass = 0;
        int64_t count = 0;
        for (int64_t j = 0; j < V; j++)
            mass += prob[j] >= t ? prob[j] : 0.0, count += prob[j] > 0 && prob[j] >= t;
        if ((mass >= (double)top_p * sum && count >= keep) || t == 0)
            break;
        t = pass < 6 ? t / 16 : 0; /* six passes span 2^24 of the largest weight; then every token */
    }
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++) {
        if (prob[j] > 0 && prob[j] >= t)
            r[n++] = (ranked){prob[j], j};
        else
            prob[j] = 0;
    }
    qsort(r, (size_t)n, sizeof *r, by_prob);
    double above = 0, kept = 0;
    for (int64_t k = 0; k < n; k++) {
        if (k < keep || above / sum < (double)top_p)
            kept += r[k].p;
        else
            prob[r[k].i] = 0;
        above += r[k].p;
    }
    return kept;
}

/* transformers' MinPLogitsWarper on the weights prob[0..V): a token of
 * weight below min_p times the largest goes (the keep largest stay). The
 * new sum. */
static double min_p_filter(double *prob, int64_t V, float min_p, int64_t keep, ranked *r)
{
    const double mx = kth_weight(prob, V, 1, r), kth = kth_weight(prob, V, keep, r);
    const double t = (double)min_p * mx;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) {
        prob[j] = prob[j] < t && prob[j] < kth ? 0.0 : prob[j];
        sum += prob[j];
    }
    return sum;
}

/* transformers' EpsilonLogitsWarper (eta false) and EtaLogitsWarper (eta)
 * on the weights prob[0..V) (sum: their sum): a token whose probability
 * prob / sum is below the cutoff goes, the most likely (and those tied with
 * it) stays; the cutoff is eps, or for eta min(eps, sqrt(eps) e^-H), H the
 * entropy of those probabilities. The new sum. */
static double cutoff_filter(double *prob, int64_t V, double sum, float eps, bool eta, int64_t keep, ranked *r)
{
    double cut = (double)eps, kept = 0;
    if (eta) {
        double ent = 0;
        for (int64_t j = 0; j < V; j++)
            if (prob[j] > 0)
                ent -= prob[j] / sum * log(prob[j] / sum);
        cut = fmin(cut, sqrt(cut) * exp(-ent));
    }
    const double mx = kth_weight(prob, V, keep, r); /* the keep most likely stay */
    for (int64_t j = 0; j < V; j++) {
        if (prob[j] / sum < cut && prob[j] < mx)
            prob[j] = 0;
        kept += prob[j];
    }
    return kept;
}

/* Nearest to the entropy first; equal ones by id, the smaller first. */
static int by_shift(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    return x->p < y->p ? -1 : x->p > y->p ? 1 : (x->i > y->i) - (x->i < y->i);
}

/* transformers' TypicalLogitsWarper on the weights prob[0..V) (sum: their
 * sum): q = prob / sum, H = -sum q log q; the tokens ranked by |-log q - H|
 * ascending; with c the number of them whose running total of q stays
 * below mass, every token ranked farther than the (c+1)-th goes (the
 * (c+1)-th and those tied with it stay). The new sum. */
static double typical_filter(double *prob, int64_t V, double sum, float mass, int64_t keep, ranked *r)
{
    double ent = 0;
    for (int64_t j = 0; j < V; j++)
        if (prob[j] > 0)
            ent -= prob[j] / sum * log(prob[j] / sum);
    int64_t n = 0;
    for (int64_t j = 0; j < V; j++)
        if (prob[j] > 0)
            r[n++] = (ranked){fabs(-log(prob[j] / sum) - ent), j};
    qsort(r, (size_t)n, sizeof *r, by_shift);
    int64_t c = 0;
    double cum = 0;
    for (int64_t k = 0; k < n; k++) {
        cum += prob[r[k].i] / sum;
        c += cum < (double)mass;
    }
    if (c >= n) /* transformers' threshold is then a dropped token's (infinite): every token stays */
        return sum;
    const int64_t first = keep < n ? keep : n; /* the nearest keep stay */
    const double thr = r[c].p > r[first - 1].p ? r[c].p : r[first - 1].p;
    double kept = 0;
    for (int64_t k = 0; k < n; k++) {
        if (r[k].p > thr)
            prob[r[k].i] = 0;
        kept += prob[r[k].i];
    }
    return kept;
}

/* transformers' logits processors in its order (_get_logits_processor) on s[0..V), in place, for the
 * sequence seq[0..n) whose first nprompt tokens are the prompt (the argument's doc: zoo.h). */
void dt__gen_process(const dt_generate_params *p, const int64_t *seq, int64_t n, int64_t nprompt, float *s,
                     int64_t V, unsigned char *seen)
{
    if (p->repetition_penalty != 1.0f) { /* RepetitionPenaltyLogitsProcessor: each token of seq once */
        memset(seen, 0, (size_t)V);
        for (int64_t i = 0; i < n; i++) {
            const int64_t t = seq[i];
            if (seen[t])
                continue;
            seen[t] = 1;
            s[t] = s[t] < 0 ? s[t] * p->repetition_penalty : s[t] / p->repetition_penalty;
        }
    }
    const int64_t N = p->no_repeat_ngram_size;
    if (N > 0 && n >= N) { /* NoRepeatNGramLogitsProcessor: every window whose first N - 1 tokens are the
                              sequence's last N - 1 bans its last token */
        const int64_t *suffix = seq + n - (N - 1);
        for (int64_t w = 0; w + N <= n; w++)
            if (!memcmp(seq + w, suffix, (size_t)(N - 1) * sizeof *seq) && seq[w + N - 1] < V)
                s[seq[w + N - 1]] = -INFINITY;
    }
    if (n < p->min_length || n - nprompt < p->min_new_tokens) /* MinLength, MinNewTokensLength */
        for (int i = 0; i < p->n_eos; i++)
            s[p->eos_ids[i]] = -INFINITY;
}

/* The processed logits: logits[0..V) copied to work, then dt__gen_process. */
static const float *processed(const float *logits, int64_t V, const dt_generate_params *p, const int64_t *seq,
                              int64_t n, int64_t nprompt, float *work, unsigned char *seen)
{
    memcpy(work, logits, (size_t)V * sizeof *work);
    dt__gen_process(p, seq, n, nprompt, work, V, seen);
    return work;
}

/* The k largest of logits[0..V) to s[0..k), largest first (s: room for V;
 * a partial selection sort: k passes over V, k is small). */
static void largest(const float *logits, int64_t V, int64_t k, double *s)
{
    for (int64_t j = 0; j < V; j++)
        s[j] = logits[j];
    for (int64_t i = 0; i < k; i++) { /* move the i-th largest to s[i] */
        int64_t m = i;
        for (int64_t j = i + 1; j < V; j++)
            if (s[j] > s[m])
                m = j;
        double t = s[i];
        s[i] = s[m], s[m] = t;
    }
}

/* transformers' TopHLogitsWarper on logits[0..V) at temperature temp: of
 * the n = min(100, V) largest, q their softmax (of logit / temp) and
 * tau = top_h H(q); the most likely first, those whose running sum of
 * -q log q stays within tau are kept (the first always): the smallest logit
 * kept (s: room for V). */
static double top_h_threshold(const float *logits, int64_t V, float temp, float top_h, double *s)
{
    const int64_t n = V < 100 ? V : 100;
    largest(logits, V, n, s);
    double z = 0, ent = 0, cum = 0;
    for (int64_t i = 0; i < n; i++)
        z += exp((s[i] - s[0]) / (double)temp);
    for (int64_t i = 0; i < n; i++) {
        const double q = exp((s[i] - s[0]) / (double)temp) / z;
        ent -= q > 0 ? q * log(q) : 0;
    }
    int64_t c = 1;
    for (int64_t i = 0; i < n; i++) {
        const double q = exp((s[i] - s[0]) / (double)temp) / z;
        cum -= q > 0 ? q * log(q) : 0;
        if (i > 0 && cum <= ent * (double)top_h)
            c = i + 1;
    }
    return s[c - 1];
}

double dt__gen_warp(const float *logits, int64_t V, const dt_generate_params *p, int64_t keep, double *prob,
                    dt__gen_ranked *r, unsigned char *kept)
{
    int64_t best = 0;
    for (int64_t j = 1; j < V; j++)
        if (logits[j] > logits[best])
            best = j;
    /* top_h keeps a prefix of the tokens by likelihood, then top_k the k most likely of them (at least keep):
       the smallest logit kept by either (ties kept, as torch.topk + masking < v[-1]) */
    double thr = p->top_h > 0.0f ? top_h_threshold(logits, V, p->temperature, p->top_h, prob) : -INFINITY;
    const int64_t k = p->top_k > 0 && p->top_k < keep ? keep : p->top_k;
    if (k > 0 && k < V) {
        largest(logits, V, k, prob);
        thr = prob[k - 1] > thr ? prob[k - 1] : thr;
    }
    double mx = logits[best] / (double)p->temperature, sum = 0;
    for (int64_t j = 0; j < V; j++) {
        double e = logits[j] < thr ? 0.0 : exp(logits[j] / (double)p->temperature - mx);
        prob[j] = e;
        sum += e;
    }
    if (p->top_p < 1.0f)
        sum = top_p_filter(prob, V, sum, p->top_p, keep, r);
    if (p->min_p > 0.0f)
        sum = min_p_filter(prob, V, p->min_p, keep, r);
    if (p->typical_p < 1.0f)
        sum = typical_filter(prob, V, sum, p->typical_p, keep, r);
    if (p->epsilon_cutoff > 0.0f)
        sum = cutoff_filter(prob, V, sum, p->epsilon_cutoff, false, keep, r);
    if (p->eta_cutoff > 0.0f)
        sum = cutoff_filter(prob, V, sum, p->eta_cutoff, true, keep, r);
    /* the tokens the warpers leave a finite score: past top_h and top_k, and through the filters that weigh
       probabilities (a token whose weight underflowed is in their tails, as in transformers'; without them it
       stays, with its tiny score) */
    const bool weighed = p->top_p < 1.0f || p->min_p > 0.0f || p->typical_p < 1.0f || p->epsilon_cutoff > 0.0f ||
                         p->eta_cutoff > 0.0f;
    for (int64_t j = 0; kept && j < V; j++)
        kept[j] = logits[j] >= thr && logits[j] > -INFINITY && (!weighed || prob[j] > 0);
    return sum;
}

/* Index of the token chosen from logits[0..V) (prob, r: room for V). */
static int64_t pick(const float *logits, int64_t V, const dt_generate_params *p, int64_t step, double *prob,
                    ranked *r)
{
    int64_t best = 0;
    for (int64_t j = 1; j < V; j++)
        if (logits[j] > logits[best])
            best = j;
    if (p->temperature <= 0.0f)
        return best;
    const double sum = dt__gen_warp(logits, V, p, 1, prob, r, NULL);
    double u = (double)dt_rng_uniform(dt_rng_key_make(p->seed, DT_RNG_USER, 0x67656e, 0), (uint64_t)step) * sum, c = 0;
    for (int64_t j = 0; j < V; j++) {
        c += prob[j];
        if (u < c && prob[j] > 0)
            return j;
    }
    for (int64_t j = V - 1; j >= 0; j--) /* rounding: the last token with mass */
        if (prob[j] > 0)
            return j;
    return best;
}

/* How the loop runs the model: forward gives the logits [1, T, V] on the
 * rank that picks (NULL on the others, which get the token from share);
 * share (NULL: one process) sends the picking rank's token to every rank,
 * failed < 0 saying that this rank cannot go on (it must fail the others). */
typedef struct {
    const char *who; /* the function, for messages */
    dt_status (*forward)(void *ud, dt_ctx *ctx, dt_tensor *x, dt_tensor **y);
    dt_status (*share)(void *ud, int64_t *token, dt_status failed);
    void *ud;
} gen_ops;

int64_t dt_generate_positions(const dt_model *m)
{
    int64_t P = 0, V = 0, wpe = m ? dt_model_find_entry(m, "transformer.wpe.weight") : -1;
    dt_param_info pi;
    if (m && dt_llama_positions(m, &P, &V))
        return P;
    return wpe >= 0 && dt_model_entry(m, (size_t)wpe, &pi) == DT_OK ? pi.shape[0] : 0;
}

/* The arguments' checks; *P, *V: the model's positions and vocabulary. */
static dt_status check(dt_model *m, const char *who, const dt_generate_params *p, const int64_t *prompt,
                       int64_t nprompt, const int64_t *out, int64_t cap, const int64_t *nout, int64_t *P, int64_t *V)
{
    if (!m || !prompt || !out || !nout)
        return dt_error(DT_ERR_NULL, "%s: NULL argument", who);
    int64_t wte = dt_model_find_entry(m, "transformer.wte.weight");
    bool llama = dt_llama_positions(m, P, V);
    *P = dt_generate_positions(m);
    if (*P <= 0 || (!llama && wte < 0))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: not a GPT-2 or Llama model (no transformer.wpe.weight)", who);
    if (dt_model_is_meta(m))
        return dt_error(DT_ERR_STATE, "%s: the model is meta (no weights)", who);
    if (!llama) {
        dt_param_info ti;
        dt_model_entry(m, (size_t)wte, &ti);
        *V = ti.shape[0];
    }
    if (nprompt < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: the prompt needs at least one token", who);
    if (p->max_new_tokens < 0 || p->top_k < 0 || !(p->temperature >= 0.0f) || isinf(p->temperature))
        return dt_error(DT_ERR_INVALID_ARG, "%s: max_new_tokens %lld, top_k %lld >= 0 and a finite "
                        "temperature >= 0 (got %g) please", who, (long long)p->max_new_tokens, (long long)p->top_k,
                        (double)p->temperature);
    if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
        return dt_error(DT_ERR_INVALID_ARG, "%s: repetition_penalty %g: want a finite number > 0 (1: none)", who,
                        (double)p->repetition_penalty);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f) || !(p->typical_p > 0.0f && p->typical_p <= 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: top_p %g or typical_p %g is outside (0, 1] (1: off)", who,
                        (double)p->top_p, (double)p->typical_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: min_p %g is outside [0, 1] (0: off)", who, (double)p->min_p);
    if (!(p->top_h >= 0.0f && p->top_h <= 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: top_h %g is outside [0, 1] (0: off)", who, (double)p->top_h);
    if (!(p->epsilon_cutoff >= 0.0f && p->epsilon_cutoff < 1.0f) || !(p->eta_cutoff >= 0.0f && p->eta_cutoff < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: epsilon_cutoff %g or eta_cutoff %g is outside [0, 1) (0: off)", who,
                        (double)p->epsilon_cutoff, (double)p->eta_cutoff);
    if (p->min_new_tokens < 0 || p->min_length < 0 || p->no_repeat_ngram_size < 0 || p->num_beams < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: min_new_tokens %lld, min_length %lld, no_repeat_ngram_size %lld "
                        ">= 0 and num_beams %lld >= 1 please", who, (long long)p->min_new_tokens,
                        (long long)p->min_length, (long long)p->no_repeat_ngram_size, (long long)p->num_beams);
    if (!isfinite(p->length_penalty) || (unsigned)p->early_stopping > DT_EARLY_STOPPING_NEVER)
        return dt_error(DT_ERR_INVALID_ARG, "%s: length_penalty %g (finite) or early_stopping %d (a "
                        "dt_early_stopping) out of range", who, (double)p->length_penalty, (int)p->early_stopping);
    if (p->n_eos < 0 || p->n_eos > DT_GENERATE_MAX_EOS)
        return dt_error(DT_ERR_INVALID_ARG, "%s: n_eos %d is outside [0, %d]", who, p->n_eos, DT_GENERATE_MAX_EOS);
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_ids[i] < 0 || p->eos_ids[i] >= *V)
            return dt_error(DT_ERR_RANGE, "%s: stop token %lld is outside the vocabulary [0, %lld)", who,
                            (long long)p->eos_ids[i], (long long)*V);
    /* not cap < nprompt + max_new_tokens: the sum overflowed for a max_new_tokens near INT64_MAX, the check
     * passed and generation ran on (past the room, for ever) */
    if (cap < nprompt || p->max_new_tokens > cap - nprompt)
        return dt_error(DT_ERR_RANGE, "%s: room for %lld tokens, need %lld prompt tokens and %lld new", who,
                        (long long)cap, (long long)nprompt, (long long)p->max_new_tokens);
    for (int64_t i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= *V)
            return dt_error(DT_ERR_RANGE, "%s: prompt token %lld at %lld is outside [0, %lld)", who,
                            (long long)prompt[i], (long long)i, (long long)*V);
    return DT_OK;
}

/* p's on_token after a new token (one process only): whether it says stop. */
static bool told_stop(const dt_generate_params *p, const gen_ops *ops, const int64_t *out, int64_t n)
{
    return p->on_token && !ops->share && p->on_token(p->on_token_ud, out, n) != 0;
}

/* Whether tok is one of p's stop tokens. */
static bool is_eos(const dt_generate_params *p, int64_t tok)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_ids[i] == tok)
            return true;
    return false;
}

static dt_status generate(dt_model *m, const gen_ops *ops, const dt_generate_params *gp, const int64_t *prompt,
                          int64_t nprompt, int64_t *out, int64_t cap, int64_t *nout)
{
    const char *who = ops->who;
    if (nout)
        *nout = 0;
    dt_generate_params p = gp ? *gp : dt_generate_params_default();
    int64_t P = 0, V = 0;
    dt_status st = check(m, who, &p, prompt, nprompt, out, cap, nout, &P, &V);
    if (st < 0) /* a pipeline's ranks must not wait for this one */
        return ops->share ? ops->share(ops->ud, &(int64_t){-1}, st) : st;
    memmove(out, prompt, (size_t)nprompt * sizeof *out);
    int64_t n = nprompt;
    dt_ctx *ctx = NULL;
    double *prob = malloc((size_t)V * sizeof *prob);
    const bool ranks = p.top_p < 1.0f || p.typical_p < 1.0f;
    ranked *r = ranks ? malloc((size_t)V * sizeof *r) : NULL; /* top_p's and typical_p's candidates */
    float *work = malloc((size_t)V * sizeof *work); /* the processed logits */
    unsigned char *seen = malloc((size_t)V);
    st = dt_ctx_init(NULL, &ctx);
    if (st == DT_OK && (!prob || (ranks && !r) || !work || !seen))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", who);
    dt_module *root = dt_model_root(m);
    bool was_training = dt_module_is_training(root);
    dt_model_train(m, false);
    bool shared = !ops->share; /* one process: nobody to tell */
    dt__gen_kv *kv = NULL;
    if (st == DT_OK && p.kv_cache && !ops->share && p.max_new_tokens > 0)
        st = dt__gen_kv_init(m, p.num_beams, nprompt, p.max_new_tokens, &kv);
    if (st == DT_OK && p.num_beams > 1) /* one process (dt_strategy_pipe_generate refuses beams) */
        st = dt__gen_beam(m, ctx, &p, kv, P, V, out, nprompt, &n);
    for (int64_t k = 0; st == DT_OK && p.num_beams == 1 && k < p.max_new_tokens && !(k > 0 && is_eos(&p, out[n - 1]));
         k++) {
        dt_ag_set_enabled(ctx, false);
        if (kv && n <= dt__gen_kv_cap(kv)) { /* positions fixed: the tokens not cached yet, alone */
            int64_t c = dt__gen_kv_start(kv, n);
            dt_tensor *y = dt__gen_kv_forward(kv, ctx, out + c, n - c);
            if (!y) {
                st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL, "%s: cached forward", who);
                break;
            }
            out[n] = pick(processed((const float *)y->data, V, &p, out, n, nprompt, work, seen), V, &p, k, prob, r);
            n++;
            dt_ctx_reset(ctx);
            if (told_stop(&p, ops, out, n))
                break;
            continue;
        }
        int64_t T = n < P ? n : P;
        dt_tensor *x = dt_tensor_view_of(ctx, out + n - T, DT_I64, 2, (int64_t[]){1, T});
        dt_tensor *y = NULL;
        if (!x) {
            st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NO_MEMORY, "%s: the input", who);
            break;
        }
        if ((st = ops->forward(ops->ud, ctx, x, &y)) < 0) {
            shared = true; /* a failed forward through the stages failed the pipeline already */
            st = dt_error_wrap(st, "%s: forward", who);
            break;
        }
        int64_t tok = -1;
        if (y) { /* the picking rank: f32 logits of the last position */
            if (y->dtype != DT_F32)
                y = dt_cast(ctx, y, DT_F32);
            if (y && !dt_tensor_is_contiguous(y))
                y = dt_contiguous(ctx, y);
            if (!y)
                st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL, "%s: the logits", who);
            else if (y->ndim != 3 || y->shape[1] != T || y->shape[2] != V)
                st = dt_error(DT_ERR_SHAPE, "%s: the logits are not [1, %lld, %lld]", who, (long long)T,
                              (long long)V);
            else
                tok = pick(processed((const float *)y->data + (T - 1) * V, V, &p, out, n, nprompt, work, seen), V,
                           &p, k, prob, r);
        }
        if (ops->share && (st = ops->share(ops->ud, &tok, st)) < 0) {
            shared = true; /* share failed the pipeline, or was told of the failure */
            break;
        }
        if (st < 0)
            break;
        out[n++] = tok;
        dt_ctx_reset(ctx);
        if (told_stop(&p, ops, out, n))
            break;
    }
    if (st < 0 && !shared) /* failed outside the forward (no memory): the pipeline must not wait */
        st = ops->share(ops->ud, &(int64_t){-1}, st);
    dt_model_train(m, was_training);
    dt__gen_kv_free(kv);
    free(prob);
    free(r);
    free(work);
    free(seen);
    dt_ctx_free(ctx);
    *nout = n;
    return st;
}

static dt_status model_forward(void *ud, dt_ctx *ctx, dt_tensor *x, dt_tensor **y)
{
    *y = dt_model_forward(ctx, ud, x);
    return *y ? DT_OK : dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
}

dt_status dt_model_generate(dt_model *m, const dt_generate_params *gp, const int64_t *prompt, int64_t nprompt,
                            int64_t *out, int64_t cap, int64_t *nout)
{
    gen_ops ops = {.who = "dt_model_generate", .forward = model_forward, .ud = m};
    return generate(m, &ops, gp, prompt, nprompt, out, cap, nout);
}

static dt_status pipe_forward(void *ud, dt_ctx *ctx, dt_tensor *x, dt_tensor **y)
{
    return dt_strategy_eval_forward(ud, ctx, x, y);
}

static dt_status pipe_share(void *ud, int64_t *token, dt_status failed)
{
    double v = (double)*token; /* token ids are exact in a double */
    dt_status st = dt_strategy_eval_share(ud, &v, 1, failed);
    *token = (int64_t)v;
    return st;
}

dt_status dt_strategy_pipe_generate(dt_strategy *s, const dt_generate_params *gp, const int64_t *prompt,
                                    int64_t nprompt, int64_t *out, int64_t cap, int64_t *nout)
{
    if (nout)
        *nout = 0;
    dt_model *m = dt_strategy_model(s);
    if (!m)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_generate: strategy '%s' is not attached to a model "
                        "(dt_trainer_init)", s ? dt_strategy_name(s) : "(NULL)");
    const dt_pg *tp = dt_tp_model_group(m);
    if (tp && dt_pg_size(tp) > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_strategy_pipe_generate: not with tensor parallelism (tp %d) yet: the "
                        "head is vocabulary-parallel, each tp rank of the last stage holds a slice of the logits",
                        dt_pg_size(tp));
    if (gp && gp->num_beams > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_strategy_pipe_generate: num_beams %lld: beam search runs in one "
                        "process (dt_model_generate), not through a pipeline's stages yet", (long long)gp->num_beams);
    gen_ops ops = {.who = "dt_strategy_pipe_generate", .forward = pipe_forward, .share = pipe_share, .ud = s};
    return generate(m, &ops, gp, prompt, nprompt, out, cap, nout);
}
