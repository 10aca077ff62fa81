/* dt_model_generate's nucleus filter (top_p), min_p and typical_p, repetition penalty and stop tokens (eos_ids),
 * its other logits processors (no_repeat_ngram_size, min_new_tokens, min_length) on hand-made
 * logits, the checks of its beam search options, and dt_hf_generation_config.
 *
 * top_p against a reference written another way: transformers'
 * TopPLogitsWarper drops, from the least likely up, the tokens whose
 * cumulative probability is at most 1 - top_p; that is, a token stays when
 * the tokens more likely than it hold less than top_p. The reference keeps
 * those and draws with the documented Philox draw (seed, DT_RNG_USER,
 * "gen", token index), so the first new token must be the reference's for
 * every seed and top_p. Stop tokens: generation ends right after the first
 * one, with and without the key/value cache; a stop token in the prompt
 * does not end it. repetition_penalty against a reference applied to
 * each step's logits of a full forward. The model: gpt-micro with its weights scaled up, so that
 * its logits are far from uniform. */
#include "../models/zoo.h"
#include "model_util.h"
#include "test.h"

#include "dtrain/autograd.h"
#include "dtrain/generate.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "tmp_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 512

/* The last position's logits of the prompt. */
static void last_logits(dt_model *m, const int64_t *prompt, int64_t np, float *out)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_ag_set_enabled(ctx, false);
    dt_tensor *x = dt_tensor_view_of(ctx, (void *)prompt, DT_I64, 2, (int64_t[]){1, np});
    dt_tensor *y = x ? dt_model_forward(ctx, m, x) : NULL;
    ASSERT(y && y->dtype == DT_F32 && y->shape[2] == V);
    memcpy(out, (const float *)y->data + (np - 1) * V, V * sizeof *out);
    dt_ctx_free(ctx);
}

/* The reference's token for seed (the documented Philox draw over the tokens kept); *kept: how many tokens
 * the filters keep: top_p as the header says, then min_p and typical_p (transformers' MinPLogitsWarper, then
 * TypicalLogitsWarper), written from their definitions: min_p keeps a token at least min_p times as likely as
 * the most likely one; typical_p ranks the tokens left by |-log q - H| (q their renormalised probabilities, H
 * the entropy; ties by id), counts c, the tokens whose cumulative q, in rank order, stays below typical_p, and
 * keeps every token ranked no farther than the (c+1)-th; then epsilon_cutoff and eta_cutoff (EpsilonLogitsWarper,
 * EtaLogitsWarper): a token whose q is below the cutoff goes unless it is the most likely, the cutoff eps, or
 * min(eta, sqrt(eta) e^-H) with H the entropy of the q left. */
/* The documented draw of the first new token over the tokens kept (weights w): Philox (seed, DT_RNG_USER,
 * "gen", 0) times their sum, walked in id order. */
static int64_t ref_draw(const bool *keep, const double *w, uint64_t seed)
{
    double sum = 0, c = 0;
    for (int j = 0; j < V; j++)
        sum += keep[j] ? w[j] : 0;
    const double u = (double)dt_rng_uniform(dt_rng_key_make(seed, DT_RNG_USER, 0x67656e, 0), 0) * sum;
    for (int j = 0; j < V; j++)
        if (keep[j] && u < (c += w[j]))
            return j;
    return -1;
}

static int64_t ref_pick(const float *logits, float temp, float top_p, float min_p, float typical, float eps,
                        float eta, uint64_t seed, int *kept)
{
    static double p[V], shift[V], before[V];
    static bool keep[V];
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++)
        mx = fmax(mx, logits[j] / (double)temp);
    for (int j = 0; j < V; j++)
        sum += p[j] = exp(logits[j] / (double)temp - mx);
    double best = 0;
    for (int j = 0; j < V; j++) {
        double above = 0;
        for (int i = 0; i < V; i++)
            if (p[i] > p[j])
                above += p[i] / sum;
        keep[j] = above < top_p;
        best = keep[j] ? fmax(best, p[j]) : best;
    }
    double ksum = 0;
    for (int j = 0; j < V; j++) {
        keep[j] = keep[j] && p[j] >= (double)min_p * best;
        ksum += keep[j] ? p[j] : 0;
    }
    if (typical < 1.0f) {
        double ent = 0;
        for (int j = 0; j < V; j++)
            ent -= keep[j] ? p[j] / ksum * log(p[j] / ksum) : 0;
        for (int j = 0; j < V; j++)
            shift[j] = keep[j] ? fabs(-log(p[j] / ksum) - ent) : INFINITY;
        int c = 0, nk = 0;
        for (int j = 0; j < V; j++) { /* the mass ranked before j */
            before[j] = 0;
            for (int i = 0; i < V; i++)
                if (keep[i] && (shift[i] < shift[j] || (shift[i] == shift[j] && i < j)))
                    before[j] += p[i] / ksum;
            nk += keep[j];
            c += keep[j] && before[j] + p[j] / ksum < typical;
        }
        double thr = INFINITY; /* the (c+1)-th's distance */
        for (int j = 0; j < V && c < nk; j++) {
            int rank = 0;
            for (int i = 0; i < V; i++)
                rank += keep[i] && (shift[i] < shift[j] || (shift[i] == shift[j] && i < j));
            if (keep[j] && rank == c)
                thr = shift[j];
        }
        ksum = 0;
        for (int j = 0; j < V; j++) {
            keep[j] = keep[j] && shift[j] <= thr;
            ksum += keep[j] ? p[j] : 0;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        const double e = pass ? eta : eps;
        if (e <= 0)
            continue;
        double cut = e, top = 0, ent = 0, left = 0;
        for (int j = 0; j < V; j++)
            if (keep[j]) {
                top = fmax(top, p[j]);
                ent -= p[j] / ksum * log(p[j] / ksum);
            }
        if (pass)
            cut = fmin(e, sqrt(e) * exp(-ent));
        for (int j = 0; j < V; j++) {
            keep[j] = keep[j] && (p[j] / ksum >= cut || p[j] >= top);
            left += keep[j] ? p[j] : 0;
        }
        ksum = left;
    }
    *kept = 0;
    for (int j = 0; j < V; j++)
        *kept += keep[j];
    return ref_draw(keep, p, seed);
}

TEST(top_p_against_the_reference)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {17, 301, 44};
    float lg[V];
    last_logits(m, prompt, 3, lg);
    const float tps[] = {0.05f, 0.3f, 0.6f, 0.9f};
    int kept_first = 0, kept_last = 0;
    for (int t = 0; t < 4; t++) {
        int distinct = 0;
        bool seen[V] = {false};
        for (uint64_t seed = 0; seed < 40; seed++) {
            dt_generate_params gp = dt_generate_params_default();
            gp.temperature = 0.7f, gp.top_p = tps[t], gp.seed = seed, gp.max_new_tokens = 1;
            int64_t out[8], n = 0;
            ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, out, 8, &n));
            ASSERT_EQ_INT(n, 4);
            int kept = 0;
            int64_t want = ref_pick(lg, 0.7f, tps[t], 0.0f, 1.0f, 0.0f, 0.0f, seed, &kept);
            if (out[3] != want)
                fprintf(stderr, "  top_p %g seed %llu: got %lld, the reference %lld\n", (double)tps[t],
                        (unsigned long long)seed, (long long)out[3], (long long)want);
            ASSERT_EQ_INT(out[3], want);
            distinct += !seen[out[3]];
            seen[out[3]] = true;
            if (t == 0)
                kept_first = kept;
            kept_last = kept;
        }
        fprintf(stderr, "  top_p %.2f: %d distinct tokens in 40 draws\n", (double)tps[t], distinct);
    }
    ASSERT(kept_first >= 1 && kept_first < kept_last); /* the filter did something, and more with a larger p */
    ASSERT(kept_last < V);
    /* top_p 1: every token, the draws of no filter at all (top_k 0) */
    dt_generate_params a = dt_generate_params_default(), b = a;
    b.top_p = 1.0f;
    int64_t oa[16], ob[16], na = 0, nb = 0;
    a.max_new_tokens = b.max_new_tokens = 10;
    ASSERT_OK(dt_model_generate(m, &a, prompt, 3, oa, 16, &na));
    ASSERT_OK(dt_model_generate(m, &b, prompt, 3, ob, 16, &nb));
    ASSERT(na == nb && !memcmp(oa, ob, (size_t)na * sizeof *oa));
    dt_model_free(m);
}

TEST(min_p_and_typical_p_against_the_reference)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {17, 301, 44};
    float lg[V];
    last_logits(m, prompt, 3, lg);
    const struct {
        float top_p, min_p, typical;
    } cases[] = {{1.0f, 0.05f, 1.0f}, {1.0f, 0.3f, 1.0f}, {1.0f, 0.0f, 0.2f}, {1.0f, 0.0f, 0.9f},
                 {0.9f, 0.02f, 0.5f}, {1.0f, 1.0f, 1.0f}};
    int kept[6] = {0};
    for (int t = 0; t < 6; t++) {
        for (uint64_t seed = 0; seed < 30; seed++) {
            dt_generate_params gp = dt_generate_params_default();
            gp.temperature = 0.7f, gp.top_p = cases[t].top_p, gp.min_p = cases[t].min_p;
            gp.typical_p = cases[t].typical, gp.seed = seed, gp.max_new_tokens = 1;
            int64_t out[8], n = 0;
            ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, out, 8, &n));
            ASSERT_EQ_INT(n, 4);
            int64_t want = ref_pick(lg, 0.7f, cases[t].top_p, cases[t].min_p, cases[t].typical, 0.0f, 0.0f, seed,
                                    &kept[t]);
            if (out[3] != want)
                fprintf(stderr, "  top_p %g min_p %g typical_p %g seed %llu: got %lld, the reference %lld\n",
                        (double)cases[t].top_p, (double)cases[t].min_p, (double)cases[t].typical,
                        (unsigned long long)seed, (long long)out[3], (long long)want);
            ASSERT_EQ_INT(out[3], want);
        }
        fprintf(stderr, "  top_p %.2f min_p %.2f typical_p %.2f: %d tokens kept\n", (double)cases[t].top_p,
                (double)cases[t].min_p, (double)cases[t].typical, kept[t]);
    }
    /* each filter did something, more with a stricter value; min_p 1 keeps the most likely alone */
    ASSERT(kept[1] >= 1 && kept[1] < kept[0] && kept[0] < V);
    ASSERT(kept[2] >= 1 && kept[2] < kept[3] && kept[3] < V);
    ASSERT_EQ_INT(kept[5], 1);
    /* out of range: refused */
    const float bad[][2] = {{-0.1f, 1.0f}, {1.5f, 1.0f}, {0.0f, 0.0f}, {0.0f, 1.2f}, {NAN, 1.0f}, {0.0f, NAN}};
    for (int i = 0; i < 6; i++) {
        dt_generate_params gp = dt_generate_params_default();
        gp.min_p = bad[i][0], gp.typical_p = bad[i][1];
        int64_t out[8], n = 0;
        ASSERT_STATUS(dt_model_generate(m, &gp, prompt, 3, out, 8, &n), DT_ERR_INVALID_ARG);
    }
    dt_model_free(m);
}

/* epsilon_cutoff and eta_cutoff, alone and after min_p and typical_p, against the reference (30 seeds each);
 * a larger cutoff keeps fewer tokens, the most likely always stays; out of [0, 1): refused. */
TEST(epsilon_and_eta_cutoffs_against_the_reference)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {17, 301, 44};
    float lg[V];
    last_logits(m, prompt, 3, lg);
    const struct {
        float min_p, typical, eps, eta;
    } cases[] = {{0.0f, 1.0f, 0.002f, 0.0f}, {0.0f, 1.0f, 0.02f, 0.0f}, {0.0f, 1.0f, 0.0f, 0.003f},
                 {0.0f, 1.0f, 0.0f, 0.3f},   {0.01f, 0.9f, 0.004f, 0.05f}, {0.0f, 1.0f, 0.99f, 0.0f}};
    int kept[6] = {0};
    for (int t = 0; t < 6; t++) {
        for (uint64_t seed = 0; seed < 30; seed++) {
            dt_generate_params gp = dt_generate_params_default();
            gp.temperature = 0.7f, gp.min_p = cases[t].min_p, gp.typical_p = cases[t].typical;
            gp.epsilon_cutoff = cases[t].eps, gp.eta_cutoff = cases[t].eta, gp.seed = seed, gp.max_new_tokens = 1;
            int64_t out[8], n = 0;
            ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, out, 8, &n));
            ASSERT_EQ_INT(n, 4);
            int64_t want = ref_pick(lg, 0.7f, 1.0f, cases[t].min_p, cases[t].typical, cases[t].eps, cases[t].eta,
                                    seed, &kept[t]);
            if (out[3] != want)
                fprintf(stderr, "  min_p %g typical_p %g epsilon %g eta %g seed %llu: got %lld, the reference %lld\n",
                        (double)cases[t].min_p, (double)cases[t].typical, (double)cases[t].eps,
                        (double)cases[t].eta, (unsigned long long)seed, (long long)out[3], (long long)want);
            ASSERT_EQ_INT(out[3], want);
        }
        fprintf(stderr, "  min_p %.2f typical_p %.2f epsilon %.3f eta %.3f: %d tokens kept\n", (double)cases[t].min_p,
                (double)cases[t].typical, (double)cases[t].eps, (double)cases[t].eta, kept[t]);
    }
    ASSERT(kept[1] >= 1 && kept[1] < kept[0] && kept[0] < V);
    ASSERT(kept[3] >= 1 && kept[3] < kept[2] && kept[2] < V);
    ASSERT_EQ_INT(kept[5], 1); /* nothing is that likely: the most likely alone */
    const float bad[][2] = {{-0.1f, 0.0f}, {1.0f, 0.0f}, {NAN, 0.0f}, {0.0f, 1.0f}, {0.0f, -1e-3f}, {0.0f, NAN}};
    for (int i = 0; i < 6; i++) {
        dt_generate_params gp = dt_generate_params_default();
        gp.epsilon_cutoff = bad[i][0], gp.eta_cutoff = bad[i][1];
        int64_t out[8], n = 0;
        ASSERT_STATUS(dt_model_generate(m, &gp, prompt, 3, out, 8, &n), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "epsilon_cutoff");
    }
    dt_model_free(m);
}

/* Top-H (transformers' TopHLogitsWarper), written from its definition: of the 100 largest logits (ties by id),
 * q their softmax at the temperature, H its entropy; the first c of them kept, c the number whose running sum of
 * -q log q stays within top_h H (at least 1); with top_k, the first min(c, k). The documented draw over them. */
static int64_t ref_top_h(const float *logits, float temp, float top_h, int64_t top_k, uint64_t seed, int *kept)
{
    static int order[V];
    for (int j = 0; j < V; j++)
        order[j] = j;
    for (int i = 0; i < V; i++) /* insertion sort, largest first, ties by id */
        for (int j = i; j > 0 && logits[order[j]] > logits[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    const int n = V < 100 ? V : 100;
    const double top = logits[order[0]] / (double)temp;
    double z = 0, ent = 0, cum = 0;
    for (int i = 0; i < n; i++)
        z += exp(logits[order[i]] / (double)temp - top);
    for (int i = 0; i < n; i++) {
        double q = exp(logits[order[i]] / (double)temp - top) / z;
        ent -= q * log(q);
    }
    int c = 0;
    for (int i = 0; i < n; i++) {
        double q = exp(logits[order[i]] / (double)temp - top) / z;
        cum -= q * log(q);
        c += i == 0 || cum <= top_h * ent;
    }
    if (top_k > 0 && top_k < c)
        c = (int)top_k;
    *kept = c;
    static bool keep[V];
    static double w[V];
    memset(keep, 0, sizeof keep);
    for (int i = 0; i < c; i++)
        keep[order[i]] = true;
    for (int j = 0; j < V; j++)
        w[j] = exp(logits[j] / (double)temp - top);
    return ref_draw(keep, w, seed);
}

/* top_h alone and before top_k against the reference (30 seeds each); a larger top_h keeps more; out of
 * [0, 1]: refused. */
TEST(top_h_against_the_reference)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {17, 301, 44};
    float lg[V];
    last_logits(m, prompt, 3, lg);
    const struct {
        float top_h;
        int64_t top_k;
    } cases[] = {{0.1f, 0}, {0.4f, 0}, {0.8f, 0}, {1.0f, 0}, {0.8f, 3}};
    int kept[5] = {0};
    for (int t = 0; t < 5; t++) {
        for (uint64_t seed = 0; seed < 30; seed++) {
            dt_generate_params gp = dt_generate_params_default();
            gp.temperature = 0.7f, gp.top_h = cases[t].top_h, gp.top_k = cases[t].top_k, gp.seed = seed;
            gp.max_new_tokens = 1;
            int64_t out[8], n = 0;
            ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, out, 8, &n));
            int64_t want = ref_top_h(lg, 0.7f, cases[t].top_h, cases[t].top_k, seed, &kept[t]);
            if (out[3] != want)
                fprintf(stderr, "  top_h %g top_k %lld seed %llu: got %lld, the reference %lld\n",
                        (double)cases[t].top_h, (long long)cases[t].top_k, (unsigned long long)seed,
                        (long long)out[3], (long long)want);
            ASSERT_EQ_INT(out[3], want);
        }
        fprintf(stderr, "  top_h %.1f top_k %lld: %d tokens kept\n", (double)cases[t].top_h,
                (long long)cases[t].top_k, kept[t]);
    }
    ASSERT(kept[0] >= 1 && kept[0] < kept[1] && kept[1] < kept[2] && kept[2] <= kept[3] && kept[3] <= 100);
    ASSERT_EQ_INT(kept[4], 3);
    const float bad[] = {-0.1f, 1.5f, NAN};
    for (int i = 0; i < 3; i++) {
        dt_generate_params gp = dt_generate_params_default();
        gp.top_h = bad[i];
        int64_t out[8], n = 0;
        ASSERT_STATUS(dt_model_generate(m, &gp, prompt, 3, out, 8, &n), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "top_h");
    }
    dt_model_free(m);
}

TEST(stop_tokens)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {5, 6, 7};
    int64_t full[40], n = 0;
    dt_generate_params gp = dt_generate_params_default();
    gp.temperature = 0.0f, gp.max_new_tokens = 20;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, full, 40, &n));
    ASSERT_EQ_INT(n, 23);
    int64_t stop = full[3 + 4], first = 4; /* the fifth new token; where it first appears */
    for (int64_t k = 0; k < 4; k++)
        if (full[3 + k] == stop) {
            first = k;
            break;
        }
    for (int cache = 0; cache < 2; cache++) {
        dt_generate_params g = gp;
        g.kv_cache = cache;
        g.eos_ids[0] = V - 1, g.eos_ids[1] = stop, g.n_eos = 2;
        int64_t out[40];
        ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
        ASSERT_EQ_INT(n, 3 + first + 1); /* the stop token is kept, nothing after it */
        ASSERT(!memcmp(out, full, (size_t)n * sizeof *out));
    }
    /* the prompt's own last token as the stop token: generation still runs */
    dt_generate_params g = gp;
    g.eos_ids[0] = prompt[2], g.n_eos = 1;
    int64_t out[40];
    bool in_new = false;
    for (int64_t k = 0; k < 20; k++)
        in_new |= full[3 + k] == prompt[2];
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT(n > 3);
    if (!in_new)
        ASSERT_EQ_INT(n, 23);
    /* bad arguments */
    g = gp;
    g.top_p = 0.0f;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_INVALID_ARG);
    g.top_p = NAN;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_INVALID_ARG);
    g.top_p = 1.5f;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_INVALID_ARG);
    g = gp;
    g.n_eos = DT_GENERATE_MAX_EOS + 1;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_INVALID_ARG);
    g.n_eos = 1, g.eos_ids[0] = V;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "stop token 512");
    dt_model_free(m);
}

/* repetition_penalty, greedy, against the reference: each step's logits
 * from a forward over the whole sequence, every token seen so far (each
 * once) divided by the penalty where positive and multiplied where
 * negative, then the largest. */
TEST(repetition_penalty_against_the_reference)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    /* a prompt whose greedy next token is its first one: there the penalty must matter */
    int64_t seq[16] = {0, 9, 300, 41};
    int64_t n = 4;
    for (int64_t c = 0; c < V; c++) {
        float lg[V];
        seq[0] = c;
        last_logits(m, seq, 4, lg);
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (lg[j] > lg[best])
                best = j;
        if (best == c)
            break;
        ASSERT(c < V - 1);
    }
    const float pen = 1.7f;
    for (int k = 0; k < 8; k++) {
        float lg[V];
        last_logits(m, seq, n, lg);
        bool seen[V] = {false};
        for (int64_t i = 0; i < n; i++)
            if (!seen[seq[i]]) {
                seen[seq[i]] = true;
                lg[seq[i]] = lg[seq[i]] < 0 ? lg[seq[i]] * pen : lg[seq[i]] / pen;
            }
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (lg[j] > lg[best])
                best = j;
        seq[n++] = best;
    }
    int changed = 0; /* the penalty must matter here: greedy without it differs */
    for (int cache = 0; cache < 2; cache++) {
        dt_generate_params gp = dt_generate_params_default();
        gp.temperature = 0.0f, gp.max_new_tokens = 8, gp.repetition_penalty = pen, gp.kv_cache = cache;
        int64_t out[16], got = 0;
        ASSERT_OK(dt_model_generate(m, &gp, seq, 4, out, 16, &got));
        ASSERT_EQ_INT(got, 12);
        ASSERT(!memcmp(out, seq, 12 * sizeof *out));
        gp.repetition_penalty = 1.0f;
        ASSERT_OK(dt_model_generate(m, &gp, seq, 4, out, 16, &got));
        changed += memcmp(out, seq, 12 * sizeof *out) != 0;
    }
    ASSERT_EQ_INT(changed, 2);
    dt_generate_params gp = dt_generate_params_default();
    int64_t out[16], got = 0;
    gp.repetition_penalty = 0.0f;
    ASSERT_STATUS(dt_model_generate(m, &gp, seq, 4, out, 16, &got), DT_ERR_INVALID_ARG);
    gp.repetition_penalty = INFINITY;
    ASSERT_STATUS(dt_model_generate(m, &gp, seq, 4, out, 16, &got), DT_ERR_INVALID_ARG);
    dt_model_free(m);
}

/* Whether s[0..8) is ref with exactly the tokens of ban at -inf. */
static bool banned_only(const float *s, const float *ref, const int64_t *ban, int nban)
{
    for (int64_t j = 0; j < 8; j++) {
        bool b = false;
        for (int i = 0; i < nban; i++)
            b |= ban[i] == j;
        if (b ? !(isinf(s[j]) && s[j] < 0) : s[j] != ref[j]) {
            fprintf(stderr, "  token %lld: %g (reference %g, banned %d)\n", (long long)j, (double)s[j],
                    (double)ref[j], b);
            return false;
        }
    }
    return true;
}

/* transformers' processors on 8 hand-made logits: NoRepeatNGramLogitsProcessor bans the last token of every
 * window of the sequence (prompt included) that starts with its last n - 1 tokens; MinNewTokensLength and
 * MinLength give the stop tokens -inf while the sequence is short; the repetition penalty runs first. */
TEST(logits_processors)
{
    const float ref[8] = {0.5f, -1.0f, 2.0f, 3.0f, -0.25f, 1.5f, 0.75f, -2.0f};
    const int64_t seq[5] = {1, 2, 3, 1, 2}; /* the prompt: the first 3 */
    unsigned char seen[8];
    float s[8];
    dt_generate_params p = dt_generate_params_default();
    const struct {
        int64_t n;
        int nban;
        int64_t ban[3];
    } ngram[] = {{1, 3, {1, 2, 3}}, /* every token seen */
                 {2, 1, {3}},       /* after 2 came 3 */
                 {3, 1, {3}},       /* after 1 2 came 3 */
                 {4, 0, {0}},       /* 3 1 2 never came before */
                 {6, 0, {0}}};      /* longer than the sequence */
    for (int c = 0; c < 5; c++) {
        p.no_repeat_ngram_size = ngram[c].n;
        memcpy(s, ref, sizeof s);
        dt__gen_process(&p, seq, 5, 3, s, 8, seen);
        ASSERT(banned_only(s, ref, ngram[c].ban, ngram[c].nban));
    }
    /* a prefix that matches twice bans both continuations */
    const int64_t twice[6] = {4, 5, 4, 6, 0, 4};
    p.no_repeat_ngram_size = 2;
    memcpy(s, ref, sizeof s);
    dt__gen_process(&p, twice, 6, 6, s, 8, seen);
    ASSERT(banned_only(s, ref, (int64_t[]){5, 6}, 2));
    p.no_repeat_ngram_size = 0;
    /* the stop tokens 4 and 6 while fewer than min_new_tokens new tokens (2 here) or min_length tokens (5) */
    p.eos_ids[0] = 4, p.eos_ids[1] = 6, p.n_eos = 2;
    const struct {
        int64_t min_new, min_len;
        bool ban;
    } mins[] = {{3, 0, true}, {2, 0, false}, {0, 6, true}, {0, 5, false}, {0, 0, false}, {2, 6, true}};
    for (int c = 0; c < 6; c++) {
        p.min_new_tokens = mins[c].min_new, p.min_length = mins[c].min_len;
        memcpy(s, ref, sizeof s);
        dt__gen_process(&p, seq, 5, 3, s, 8, seen);
        ASSERT(banned_only(s, ref, (int64_t[]){4, 6}, mins[c].ban ? 2 : 0));
    }
    p.n_eos = 0, p.min_new_tokens = 9; /* no stop token: nothing to ban */
    memcpy(s, ref, sizeof s);
    dt__gen_process(&p, seq, 5, 3, s, 8, seen);
    ASSERT(banned_only(s, ref, NULL, 0));
    /* all three: the penalty on the seen tokens (1 negative: times 2; 2, 3: halved), then the bans */
    p.repetition_penalty = 2.0f, p.no_repeat_ngram_size = 2, p.eos_ids[0] = 4, p.n_eos = 1, p.min_new_tokens = 3;
    float want[8];
    memcpy(want, ref, sizeof want);
    want[1] = -2.0f, want[2] = 1.0f;
    memcpy(s, ref, sizeof s);
    dt__gen_process(&p, seq, 5, 3, s, 8, seen);
    ASSERT(banned_only(s, want, (int64_t[]){3, 4}, 2));
}

/* The options' checks: bad values are DT_ERR_INVALID_ARG (never another decoding); the beam search itself is
 * checked against transformers in test_hf_cli. */
TEST(beam_and_processor_checks)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {5, 6, 7};
    int64_t out[40], n = 0;
    dt_generate_params gp = dt_generate_params_default();
    gp.temperature = 0.0f, gp.max_new_tokens = 6;
    const struct {
        int64_t min_new, min_len, ngram, beams;
        float lp;
        int es;
        dt_status want;
    } bad[] = {{-1, 0, 0, 1, 1.0f, 0, DT_ERR_INVALID_ARG}, {0, -1, 0, 1, 1.0f, 0, DT_ERR_INVALID_ARG},
               {0, 0, -2, 1, 1.0f, 0, DT_ERR_INVALID_ARG}, {0, 0, 0, 0, 1.0f, 0, DT_ERR_INVALID_ARG},
               {0, 0, 0, 3, NAN, 0, DT_ERR_INVALID_ARG},   {0, 0, 0, 3, INFINITY, 0, DT_ERR_INVALID_ARG},
               {0, 0, 0, 3, 1.0f, 3, DT_ERR_INVALID_ARG},  {0, 0, 0, 3, 1.0f, -1, DT_ERR_INVALID_ARG}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt_generate_params g = gp;
        g.min_new_tokens = bad[i].min_new, g.min_length = bad[i].min_len, g.no_repeat_ngram_size = bad[i].ngram;
        g.num_beams = bad[i].beams, g.length_penalty = bad[i].lp, g.early_stopping = (dt_early_stopping)bad[i].es;
        ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), bad[i].want);
        ASSERT_EQ_INT(n, 0);
    }
    dt_generate_params g = gp;
    /* beams over a model whose buffers cannot exist: refused before anything runs */
    g.temperature = 0.0f, g.num_beams = INT64_MAX / 4;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, out, 40, &n), DT_ERR_NO_MEMORY);
    ASSERT_STR_CONTAINS(dt_last_error(), "num_beams");
    /* one beam is greedy; beams with max_new_tokens 0 give the prompt back */
    int64_t greedy[40], ng = 0;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, greedy, 40, &ng));
    g.num_beams = 1;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT(n == ng && !memcmp(out, greedy, (size_t)n * sizeof *out));
    g.num_beams = 3, g.max_new_tokens = 0;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT_EQ_INT(n, 3);
    g.max_new_tokens = 6;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT_EQ_INT(n, 9);
    ASSERT(!memcmp(out, prompt, sizeof prompt));
    dt_model_free(m);
}

/* Beam sampling (num_beams > 1 with a temperature: transformers' do_sample beam search): the same seed gives the
 * same tokens, with the key/value cache and without; seeds differ in their tokens; at a temperature of 1e-4 the
 * draws take the best pairs, so the tokens are beam search's; the warpers keep at least 2 tokens a beam (top_k
 * 1 still samples among 2); every returned sequence continues the prompt. */
TEST(beam_sampling)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t prompt[3] = {17, 301, 44};
    int64_t ref[40], out[40], nref = 0, n = 0;
    dt_generate_params g = dt_generate_params_default();
    g.num_beams = 3, g.max_new_tokens = 10, g.temperature = 0.0f;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, ref, 40, &nref));
    g.temperature = 1e-4f;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT(n == nref && !memcmp(out, ref, (size_t)n * sizeof *out));
    g.temperature = 1.2f;
    int differ = 0;
    for (uint64_t seed = 0; seed < 8; seed++) {
        int64_t a[40], b[40], na = 0, nb = 0;
        g.seed = seed, g.kv_cache = true;
        ASSERT_OK(dt_model_generate(m, &g, prompt, 3, a, 40, &na));
        g.kv_cache = false;
        ASSERT_OK(dt_model_generate(m, &g, prompt, 3, b, 40, &nb));
        ASSERT(na == nb && !memcmp(a, b, (size_t)na * sizeof *a));
        ASSERT(na == 13 && !memcmp(a, prompt, sizeof prompt));
        differ += memcmp(a, ref, (size_t)na * sizeof *a) != 0;
        g.kv_cache = true;
        ASSERT_OK(dt_model_generate(m, &g, prompt, 3, b, 40, &nb));
        ASSERT(na == nb && !memcmp(a, b, (size_t)na * sizeof *a)); /* the same seed again */
    }
    fprintf(stderr, "  beam sampling at temperature 1.2: %d of 8 seeds differ from beam search\n", differ);
    ASSERT(differ >= 4);
    g.top_k = 1, g.seed = 3; /* at least 2 tokens a beam */
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, out, 40, &n));
    ASSERT_EQ_INT(n, 13);
    dt_model_free(m);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    ASSERT(t_write_in(dir, name, text));
}

TEST(hf_generation_config)
{
    char dir[400];
    snprintf(dir, sizeof dir, "%s", t_tmpdir("genconf"));
    dt_generate_params gp = dt_generate_params_default();
    char ign[256];
    /* neither file */
    ASSERT_STATUS(dt_hf_generation_config(dir, &gp, ign, sizeof ign), DT_ERR_NOT_FOUND);
    /* config.json alone: its keys (transformers' GenerationConfig.from_model_config) */
    write_file(dir, "config.json", "{\"eos_token_id\": 2, \"bos_token_id\": 1}");
    ASSERT_OK(dt_hf_generation_config(dir, &gp, ign, sizeof ign));
    ASSERT(gp.temperature == 0.0f && gp.n_eos == 1 && gp.eos_ids[0] == 2 && gp.max_new_tokens == 64);
    ASSERT_STR_EQ(ign, "");
    /* generation_config.json wins; do_sample: its temperature, top_k 50 by default, top_p */
    write_file(dir, "generation_config.json",
               "{\"do_sample\": true, \"temperature\": 0.6, \"top_p\": 0.9, \"eos_token_id\": [128001, 128008, "
               "128009], \"max_new_tokens\": 12, \"repetition_penalty\": 1.1, \"num_beams\": 1}");
    gp = dt_generate_params_default();
    ASSERT_OK(dt_hf_generation_config(dir, &gp, ign, sizeof ign));
    ASSERT(fabsf(gp.temperature - 0.6f) < 1e-7f && gp.top_k == 50 && fabsf(gp.top_p - 0.9f) < 1e-7f);
    ASSERT(gp.n_eos == 3 && gp.eos_ids[0] == 128001 && gp.eos_ids[2] == 128009 && gp.max_new_tokens == 12);
    ASSERT(fabsf(gp.repetition_penalty - 1.1f) < 1e-7f);
    ASSERT_STR_EQ(ign, ""); /* num_beams 1 changes nothing */
    ASSERT(gp.num_beams == 1 && gp.no_repeat_ngram_size == 0 && gp.min_new_tokens == 0 && gp.min_length == 0);
    ASSERT(gp.min_p == 0.0f && gp.typical_p == 1.0f); /* absent under do_sample: off */
    /* do_sample's min_p, typical_p and cutoffs (1 or more: no warper, as transformers); keys dtrain does not
       apply are named (the warpers' only with do_sample) */
    write_file(dir, "generation_config.json", "{\"do_sample\": true, \"min_p\": 0.05, \"typical_p\": 0.8, "
               "\"epsilon_cutoff\": 0.0003, \"eta_cutoff\": 1.5, \"top_h\": 0.4, \"penalty_alpha\": 0.6}");
    ASSERT_OK(dt_hf_generation_config(dir, &gp, ign, sizeof ign));
    ASSERT(fabsf(gp.min_p - 0.05f) < 1e-7f && fabsf(gp.typical_p - 0.8f) < 1e-7f);
    ASSERT(fabsf(gp.epsilon_cutoff - 0.0003f) < 1e-10f && gp.eta_cutoff == 0.0f && fabsf(gp.top_h - 0.4f) < 1e-7f);
    ASSERT_STR_EQ(ign, "penalty_alpha 0.6");
    write_file(dir, "generation_config.json", "{\"num_beams\": 4, \"no_repeat_ngram_size\": 3, \"min_length\": 7, "
               "\"length_penalty\": 0.5, \"early_stopping\": \"never\", \"typical_p\": 0.5, "
               "\"epsilon_cutoff\": 0.0003, \"penalty_alpha\": 0.6}");
    gp.min_p = 0.5f, gp.typical_p = 0.5f; /* greedy: left as they were, as transformers ignores the warpers */
    ASSERT_OK(dt_hf_generation_config(dir, &gp, ign, sizeof ign));
    ASSERT_STR_EQ(ign, "penalty_alpha 0.6");
    ASSERT(gp.min_p == 0.5f && gp.typical_p == 0.5f);
    ASSERT(gp.temperature == 0.0f && gp.repetition_penalty == 1.0f && gp.n_eos == 0);
    ASSERT(gp.num_beams == 4 && gp.no_repeat_ngram_size == 3 && gp.min_length == 7 && gp.min_new_tokens == 0);
    ASSERT(gp.length_penalty == 0.5f && gp.early_stopping == DT_EARLY_STOPPING_NEVER);
    /* min_new_tokens wins over min_length (transformers sets min_length from it) */
    write_file(dir, "generation_config.json", "{\"min_new_tokens\": 4, \"min_length\": 7, \"early_stopping\": true}");
    ASSERT_OK(dt_hf_generation_config(dir, &gp, ign, sizeof ign));
    ASSERT(gp.min_new_tokens == 4 && gp.min_length == 0 && gp.early_stopping == DT_EARLY_STOPPING_TRUE);
    ASSERT(gp.num_beams == 1 && gp.length_penalty == 1.0f); /* absent: GenerationConfig's defaults */
    /* malformed values name the file and the key; gp is left as it was */
    const char *bad[][2] = {{"{\"do_sample\": \"yes\"}", "do_sample"},
                            {"{\"do_sample\": true, \"top_p\": 0}", "top_p"},
                            {"{\"do_sample\": true, \"typical_p\": 0}", "typical_p"},
                            {"{\"do_sample\": true, \"min_p\": 1.5}", "min_p"},
                            {"{\"do_sample\": true, \"temperature\": -1}", "temperature"},
                            {"{\"eos_token_id\": [1, 2.5]}", "eos_token_id"},
                            {"{\"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "eos_token_id"},
                            {"{\"max_new_tokens\": -3}", "max_new_tokens"},
                            {"{\"num_beams\": 0}", "num_beams"},
                            {"{\"num_beams\": 2.5}", "num_beams"},
                            {"{\"min_new_tokens\": -1}", "min_new_tokens"},
                            {"{\"min_length\": 1.5}", "min_length"},
                            {"{\"no_repeat_ngram_size\": -2}", "no_repeat_ngram_size"},
                            {"{\"length_penalty\": \"long\"}", "length_penalty"},
                            {"{\"early_stopping\": \"sometimes\"}", "early_stopping"},
                            {"{\"do_sample\": true, \"eta_cutoff\": -0.1}", "eta_cutoff"},
                            {"{\"do_sample\": true, \"top_h\": 0}", "top_h"},
                            {"[1, 2]", "not a JSON object"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(dir, "generation_config.json", bad[i][0]);
        dt_generate_params g = dt_generate_params_default();
        dt_status st = dt_hf_generation_config(dir, &g, ign, sizeof ign);
        ASSERT(st == DT_ERR_FORMAT || (i == 6 && st == DT_ERR_UNSUPPORTED)); /* 17 stop tokens: more than taken */
        ASSERT_STR_CONTAINS(dt_last_error(), "generation_config.json");
        ASSERT_STR_CONTAINS(dt_last_error(), bad[i][1]);
        ASSERT(g.temperature == 1.0f && g.n_eos == 0);
    }
    t_rm_rf(dir);
}

int main(void)
{
    RUN(top_p_against_the_reference);
    RUN(min_p_and_typical_p_against_the_reference);
    RUN(epsilon_and_eta_cutoffs_against_the_reference);
    RUN(top_h_against_the_reference);
    RUN(beam_sampling);
    RUN(stop_tokens);
    RUN(repetition_penalty_against_the_reference);
    RUN(logits_processors);
    RUN(beam_and_processor_checks);
    RUN(hf_generation_config);
    return TEST_REPORT();
}
