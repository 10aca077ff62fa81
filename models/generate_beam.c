/* Beam search for dt_model_generate (num_beams > 1): transformers'
 * _beam_search (5.x, its vectorised rewrite) for one prompt; with a
 * temperature > 0 its beam sampling (do_sample): in step 1 the warpers
 * (dt__gen_warp, keeping at least K / num_beams tokens) on each beam's
 * processed log-probabilities divided by the temperature, and in step 2 K
 * pairs drawn without replacement from the softmax of their scores, sorted
 * best first (sample_k; dtrain's Philox draws, not torch's generator).
 *
 * State: num_beams running sequences with their scores (the sum of their
 * tokens' log-probabilities; at the start one beam scores 0 and the others
 * -1e9, so the first step expands the prompt once), and num_beams finished
 * slots (score -1e9 and unfinished at first). Each step:
 *   1. one forward over the running beams as a batch: with the key/value
 *      cache (num_beams sequences) the prompt once, then each beam's new
 *      token alone; else (or past the cache's positions) the uncached
 *      forward over [num_beams, T], cropped to the model's positions as
 *      the greedy loop crops; per beam, log_softmax of the last position's logits,
 *      then the logits processors (dt__gen_process) on those
 *      log-probabilities, plus the beam's score;
 *   2. the K = max(2, 1 + n_eos) * num_beams best (beam, token) pairs of
 *      all num_beams * V; a pair "hits" when its token is a stop token or
 *      the sequence reaches prompt + max_new_tokens;
 *   3. the next running beams: the num_beams best pairs after -1e9 on the
 *      hits (the cache's sequences follow their parents: dt__gen_kv_reorder);
 *   4. the finished slots: the hits among the first num_beams pairs, scored
 *      sum / (new tokens)^length_penalty, compete with the slots held (the
 *      best num_beams stay); no new one once every slot is finished under
 *      early_stopping true, or once the heuristic says no running beam can
 *      improve;
 *   5. the heuristic: with every slot finished, stop improving when the
 *      best running score over (new tokens)^length_penalty (max_new_tokens
 *      under "never" with length_penalty > 0) does not beat the worst slot.
 * The loop ends when the heuristic fails, when early_stopping is true and
 * every slot is finished, or when every pair of the step hit. The answer
 * is the best slot. Scores are f32 and the -1e9 marks are added in f32, as
 * transformers computes them; equal scores rank by index (the lower first).
 *
 * The beams' tokens are those of transformers' cached run, with the cache
 * or without. */
#include "zoo.h"

#include <dtrain/autograd.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float s; /* score */
    int64_t i;
} scored;

/* The k best of s[0..n) into top[0..k) (k <= n), best first, equal scores by index. */
static void top_k(const float *s, int64_t n, int64_t k, scored *top)
{
    int64_t have = 0;
    for (int64_t i = 0; i < n; i++) {
        if (have == k && !(s[i] > top[k - 1].s))
            continue;
        int64_t j = have < k ? have++ : k - 1; /* insertion: shift the worse ones down */
        while (j > 0 && s[i] > top[j - 1].s) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (scored){s[i], i};
    }
}

/* log_softmax of x[0..V) into y (f32 out, the sum in double). */
static void log_softmax(const float *x, int64_t V, float *y)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < V; j++)
        mx = x[j] > mx ? x[j] : mx;
    double sum = 0;
    for (int64_t j = 0; j < V; j++)
        sum += exp((double)x[j] - mx);
    const float ls = (float)log(sum);
    for (int64_t j = 0; j < V; j++)
        y[j] = x[j] - mx - ls;
}

/* Beam sampling's choice (transformers: torch.multinomial(softmax(acc), K)
 * without replacement, then sorted by score): K draws over acc[0..n), each
 * from the weights exp(acc - max) not taken yet, by a Philox draw keyed
 * (seed, DT_RNG_USER, "beam", step), draw k; when no weight is left (fewer
 * than K pairs the warpers kept), the best score not taken. top[0..K):
 * best first, equal scores by index (w: room for n). */
static void sample_k(const float *acc, int64_t n, int64_t K, uint64_t seed, int64_t step, double *w, scored *top)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = acc[i] > mx ? acc[i] : mx;
    double left = 0;
    for (int64_t i = 0; i < n; i++) {
        w[i] = isfinite(mx) && acc[i] > -INFINITY ? exp((double)acc[i] - mx) : 0.0;
        left += w[i];
    }
    const dt_rng_key key = dt_rng_key_make(seed, DT_RNG_USER, 0x6265616d, (uint64_t)step);
    for (int64_t k = 0; k < K; k++) {
        int64_t got = -1;
        if (left > 0) {
            const double u = (double)dt_rng_uniform(key, (uint64_t)k) * left;
            double c = 0;
            for (int64_t i = 0; i < n && got < 0; i++)
                if (w[i] > 0 && u < (c += w[i]))
                    got = i;
            for (int64_t i = n - 1; i >= 0 && got < 0; i--) /* rounding: the last pair with weight */
                if (w[i] > 0)
                    got = i;
        }
        if (got < 0) /* nothing left to draw: the best score not taken */
            for (int64_t i = 0; i < n; i++)
                if (w[i] >= 0 && (got < 0 || acc[i] > acc[got]))
                    got = i;
        left -= w[got] > 0 ? w[got] : 0;
        w[got] = -1.0; /* taken */
        int64_t j = k; /* insertion, best first */
        while (j > 0 && (acc[got] > top[j - 1].s || (acc[got] == top[j - 1].s && got < top[j - 1].i))) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (scored){acc[got], got};
    }
}

static bool stop_token(const dt_generate_params *p, int64_t tok)
{
    for (int i = 0; i < p->n_eos; i++)
        if (p->eos_ids[i] == tok)
            return true;
    return false;
}

dt_status dt__gen_beam(dt_model *m, dt_ctx *ctx, const dt_generate_params *p, dt__gen_kv *kv, int64_t P, int64_t V,
                       int64_t *out, int64_t nprompt, int64_t *nout)
{
    static const char *who = "dt_model_generate";
    *nout = nprompt;
    if (p->max_new_tokens == 0)
        return DT_OK;
    const int64_t B = p->num_beams, K = (p->n_eos + 1 > 2 ? p->n_eos + 1 : 2) * B, L = nprompt + p->max_new_tokens;
    const int64_t X = P > nprompt ? P : nprompt; /* the longest forward input: the window, or a cached prompt */
    /* the buffers' bytes, counted in double: a num_beams near INT64_MAX must be refused, not wrap */
    const double db = (double)B, dk = (double)K;
    const bool sample = p->temperature > 0.0f; /* beam sampling: the warpers' weights and the draws' */
    const double need = ((3 * db + dk) * (double)L + db * (double)X + 4 * db + 2 * dk) * sizeof(int64_t) +
                        (db * (double)V + (double)V + 3 * db + 2 * dk) * sizeof(float) + (double)V + 2 * (db + dk) +
                        (sample ? (db + 1) * (double)V * sizeof(double) + (double)V * sizeof(dt__gen_ranked) : 0);
    if (need > (double)(SIZE_MAX / 4))
        return dt_error(DT_ERR_NO_MEMORY, "%s: num_beams %lld over %lld tokens would need %.3g bytes of buffers",
                        who, (long long)B, (long long)L, need);
    int64_t *run = malloc((size_t)(B * L) * sizeof *run);   /* (B, L) running sequences */
    int64_t *fin = malloc((size_t)(B * L) * sizeof *fin);   /* (B, L) finished slots */
    int64_t *cand = malloc((size_t)(K * L) * sizeof *cand); /* (K, L) this step's pairs */
    int64_t *xin = malloc((size_t)(B * X) * sizeof *xin);   /* (B, T) the forward's input */
    int64_t *parent = malloc((size_t)B * sizeof *parent);  /* the next running beams' sources */
    int64_t *finlen = malloc((size_t)B * sizeof *finlen);
    float *acc = malloc((size_t)(B * V) * sizeof *acc); /* (B, V) scores of every (beam, token) */
    float *lp = malloc((size_t)V * sizeof *lp);
    float *runs = malloc((size_t)B * sizeof *runs), *fins = malloc((size_t)B * sizeof *fins);
    float *merged = malloc((size_t)(B + K) * sizeof *merged), *cs = malloc((size_t)K * sizeof *cs);
    bool *hit = malloc((size_t)K * sizeof *hit), *finished = malloc((size_t)B * sizeof *finished);
    bool *mflag = malloc((size_t)(B + K) * sizeof *mflag);
    scored *top = malloc((size_t)K * sizeof *top), *pick = malloc((size_t)(B + K) * sizeof *pick);
    unsigned char *seen = malloc((size_t)V);
    int64_t *mlen = malloc((size_t)(B + K) * sizeof *mlen), *mseq = malloc((size_t)(B * L) * sizeof *mseq);
    double *w = sample ? malloc((size_t)(B * V) * sizeof *w) : NULL, *wp = sample ? malloc((size_t)V * sizeof *wp) : NULL;
    dt__gen_ranked *wr = sample ? malloc((size_t)V * sizeof *wr) : NULL;
    dt_status st = DT_OK;
    if (!run || !fin || !cand || !xin || !parent || !finlen || !acc || !lp || !runs || !fins || !merged || !cs || !hit ||
        !finished || !mflag || !top || !pick || !seen || !mlen || !mseq || (sample && (!w || !wp || !wr))) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: num_beams %lld over %lld tokens: out of memory for %.3g bytes", who,
                      (long long)B, (long long)L, need);
        goto done;
    }
    for (int64_t b = 0; b < B; b++) {
        memcpy(run + b * L, out, (size_t)nprompt * sizeof *out);
        runs[b] = b ? -1.0e9f : 0.0f;
        fins[b] = -1.0e9f, finished[b] = false, finlen[b] = nprompt;
        memcpy(fin + b * L, out, (size_t)nprompt * sizeof *out);
    }
    bool improvable = true; /* transformers' is_early_stop_heuristic_unsatisfied */
    for (int64_t cur = nprompt;; cur++) {
        const bool cached = kv && cur <= dt__gen_kv_cap(kv);
        const int64_t c = cached ? dt__gen_kv_start(kv, cur) : 0, T = cached ? cur - c : cur < P ? cur : P; /* new tokens */
        for (int64_t b = 0; b < B; b++)
            memcpy(xin + b * T, run + b * L + cur - T, (size_t)T * sizeof *xin);
        dt_ag_set_enabled(ctx, false);
        dt_tensor *x = cached ? NULL : dt_tensor_view_of(ctx, xin, DT_I64, 2, (int64_t[]){B, T});
        dt_tensor *y = cached ? dt__gen_kv_forward(kv, ctx, xin, T) : x ? dt_model_forward(ctx, m, x) : NULL;
        const int64_t Ty = cached ? 1 : T; /* the logits' positions */
        if (y && y->dtype != DT_F32)
            y = dt_cast(ctx, y, DT_F32);
        if (y && !dt_tensor_is_contiguous(y))
            y = dt_contiguous(ctx, y);
        if (!y) {
            st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL, "%s: beam search forward", who);
            break;
        }
        if (y->ndim != 3 || y->shape[0] != B || y->shape[1] != Ty || y->shape[2] != V) {
            st = dt_error(DT_ERR_SHAPE, "%s: the logits are not [%lld, %lld, %lld]", who, (long long)B, (long long)Ty,
                          (long long)V);
            break;
        }
        for (int64_t b = 0; b < B; b++) { /* log_softmax, the processors, plus the beam's score */
            log_softmax((const float *)y->data + (b * Ty + Ty - 1) * V, V, lp);
            dt__gen_process(p, run + b * L, cur, nprompt, lp, V, seen);
            if (sample) /* the warpers (TemperatureLogitsWarper divides the log-probabilities), K / B kept */
                dt__gen_warp(lp, V, p, K / B, wp, wr, seen);
            for (int64_t j = 0; j < V; j++)
                acc[b * V + j] = !sample ? lp[j] + runs[b] : seen[j] ? lp[j] / p->temperature + runs[b] : -INFINITY;
        }
        dt_ctx_reset(ctx);
        if (sample)
            sample_k(acc, B * V, K, p->seed, cur, w, top);
        else
            top_k(acc, B * V, K, top);
        bool all_hit = true;
        for (int64_t k = 0; k < K; k++) {
            const int64_t src = top[k].i / V, tok = top[k].i % V;
            memcpy(cand + k * L, run + src * L, (size_t)cur * sizeof *cand);
            cand[k * L + cur] = tok;
            hit[k] = stop_token(p, tok) || cur + 1 >= L;
            all_hit &= hit[k];
            cs[k] = top[k].s + (hit[k] ? -1.0e9f : 0.0f);
        }
        /* the finished slots: the slots held, then this step's pairs (f32, as transformers adds its marks) */
        bool full = true;
        for (int64_t b = 0; b < B; b++)
            full &= finished[b];
        const float div = (float)pow((double)(cur + 1 - nprompt), (double)p->length_penalty);
        for (int64_t b = 0; b < B; b++)
            merged[b] = fins[b], mflag[b] = finished[b], mlen[b] = finlen[b];
        for (int64_t k = 0; k < K; k++) {
            const bool done_now = hit[k] && k < B;
            float sc = top[k].s / div;
            sc += full && p->early_stopping == DT_EARLY_STOPPING_TRUE ? -1.0e9f : 0.0f;
            sc += improvable ? 0.0f : -1.0e9f;
            sc += done_now ? 0.0f : -1.0e9f;
            merged[B + k] = sc, mflag[B + k] = done_now, mlen[B + k] = cur + 1;
        }
        top_k(merged, B + K, B, pick);
        for (int64_t b = 0; b < B; b++) {
            const int64_t i = pick[b].i;
            memcpy(mseq + b * L, i < B ? fin + i * L : cand + (i - B) * L, (size_t)mlen[i] * sizeof *mseq);
        }
        for (int64_t b = 0; b < B; b++) {
            const int64_t i = pick[b].i;
            fins[b] = pick[b].s, finished[b] = mflag[i], finlen[b] = mlen[i];
        }
        memcpy(fin, mseq, (size_t)(B * L) * sizeof *fin);
        /* the next running beams: the best pairs that did not hit */
        top_k(cs, K, B, pick);
        for (int64_t b = 0; b < B; b++) {
            memcpy(run + b * L, cand + pick[b].i * L, (size_t)(cur + 1) * sizeof *run);
            runs[b] = pick[b].s;
            parent[b] = top[pick[b].i].i / V;
        }
        if (kv && cur + 1 <= dt__gen_kv_cap(kv)) /* the next step reads the cache */
            dt__gen_kv_reorder(kv, parent);
        /* transformers' _check_early_stop_heuristic at the new length */
        const int64_t len = p->early_stopping == DT_EARLY_STOPPING_NEVER && p->length_penalty > 0.0f
                                ? L - nprompt : cur + 1 - nprompt;
        const float best = runs[0] / (float)pow((double)len, (double)p->length_penalty);
        float worst = fins[0];
        for (int64_t b = 1; b < B; b++)
            worst = fins[b] < worst ? fins[b] : worst;
        bool beats = false;
        for (int64_t b = 0; b < B; b++)
            beats |= best > (finished[b] ? worst : -1.0e9f);
        improvable = improvable && beats;
        full = true;
        for (int64_t b = 0; b < B; b++)
            full &= finished[b];
        if (!improvable || (full && p->early_stopping == DT_EARLY_STOPPING_TRUE) || all_hit)
            break;
    }
    if (st == DT_OK) {
        memcpy(out, fin, (size_t)finlen[0] * sizeof *out);
        *nout = finlen[0];
    }
done:
    free(run);
    free(fin);
    free(cand);
    free(xin);
    free(parent);
    free(finlen);
    free(acc);
    free(lp);
    free(runs);
    free(fins);
    free(merged);
    free(cs);
    free(hit);
    free(finished);
    free(mflag);
    free(top);
    free(pick);
    free(seen);
    free(mlen);
    free(mseq);
    free(w);
    free(wp);
    free(wr);
    return st;
}
