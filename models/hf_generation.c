/* A Hugging Face model directory's generation settings
 * (generate.h dt_hf_generation_config): generation_config.json, or the
 * same keys of config.json without it, as transformers' generate() takes
 * them; a malformed value is refused naming the file and the key, a key
 * that dt_model_generate does not apply is named for the caller. */
#include "zoo.h"

#include <dtrain/generate.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(DT_GENERATE_MAX_EOS == DT_HF_MAX_EOS, "a config.json's stop tokens fit dt_generate_params");

typedef struct {
    const char *path;
    const cJSON *root;
    dt_status st;
} gen_reader;

/* Key k as a number in [lo, hi] (whole when whole): *out, true; absent or null: false. */
static bool gen_num(gen_reader *r, const char *k, double lo, double hi, bool whole, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->root, k);
    if (r->st < 0 || !v || cJSON_IsNull(v))
        return false;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        (whole && v->valuedouble != floor(v->valuedouble))) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be %s in [%g, %g]", r->path, k,
                         whole ? "an integer" : "a number", lo, hi);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

dt_status dt_hf_generation_config(const char *dir, dt_generate_params *gp, char *ignored, size_t n)
{
    if (!dir || !gp)
        return dt_error(DT_ERR_NULL, "dt_hf_generation_config: %s is NULL", dir ? "gp" : "dir");
    if (ignored && n)
        ignored[0] = 0;
    char path[4200];
    char *txt = NULL;
    size_t len = 0;
    dt_status st = DT_ERR_NOT_FOUND;
    for (int i = 0; i < 2 && st == DT_ERR_NOT_FOUND; i++) { /* transformers: the model config's keys without it */
        snprintf(path, sizeof path, "%s/%s", dir, i ? "config.json" : "generation_config.json");
        st = dt_file_read_all(path, 16u << 20, &txt, &len);
    }
    if (st < 0)
        return st == DT_ERR_NOT_FOUND ? dt_error(st, "%s: neither generation_config.json nor config.json (not a "
                                                 "Hugging Face model directory)", dir)
                                      : st;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_error(DT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    gen_reader r = {.path = path, .root = root, .st = DT_OK};
    dt_generate_params g = *gp;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    if (ds && !cJSON_IsNull(ds) && !cJSON_IsBool(ds))
        r.st = dt_error(DT_ERR_FORMAT, "%s: key \"do_sample\" must be true or false", path);
    double v;
    if (cJSON_IsTrue(ds)) { /* GenerationConfig's defaults */
        g.temperature = 1.0f, g.top_k = 50, g.top_p = 1.0f;
        if (gen_num(&r, "temperature", 0, 1e6, false, &v))
            g.temperature = (float)v;
        if (gen_num(&r, "top_k", 0, 1e8, true, &v))
            g.top_k = (int64_t)v;
        if (gen_num(&r, "top_p", 0, 1, false, &v)) {
            if (v > 0)
                g.top_p = (float)v;
            else
                r.st = dt_error(DT_ERR_FORMAT, "%s: key \"top_p\" must be in (0, 1]", path);
        }
        g.min_p = 0.0f, g.typical_p = 1.0f, g.epsilon_cutoff = 0.0f, g.eta_cutoff = 0.0f;
        if (gen_num(&r, "min_p", 0, 1, false, &v))
            g.min_p = (float)v;
        /* transformers adds the two warpers for values in (0, 1) only: 1 or more changes nothing */
        if (gen_num(&r, "epsilon_cutoff", 0, 1e6, false, &v) && v < 1)
            g.epsilon_cutoff = (float)v;
        if (gen_num(&r, "eta_cutoff", 0, 1e6, false, &v) && v < 1)
            g.eta_cutoff = (float)v;
        g.top_h = 0.0f;
        if (gen_num(&r, "top_h", 0, 1, false, &v)) {
            if (v > 0) /* TopHLogitsWarper refuses 0 */
                g.top_h = (float)v;
            else
                r.st = dt_error(DT_ERR_FORMAT, "%s: key \"top_h\" must be in (0, 1]", path);
        }
        if (gen_num(&r, "typical_p", 0, 1, false, &v)) {
            if (v > 0) /* TypicalLogitsWarper refuses 0, and only runs below 1 */
                g.typical_p = (float)v;
            else
                r.st = dt_error(DT_ERR_FORMAT, "%s: key \"typical_p\" must be in (0, 1]", path);
        }
    } else {
        g.temperature = 0.0f;
    }
    if (gen_num(&r, "max_new_tokens", 0, 1e6, true, &v))
        g.max_new_tokens = (int64_t)v;
    g.repetition_penalty = 1.0f; /* applied greedy or sampling, as transformers does */
    if (gen_num(&r, "repetition_penalty", 1e-6, 1e6, false, &v))
        g.repetition_penalty = (float)v;
    /* the processors and beam search, at GenerationConfig's defaults when absent; min_new_tokens wins over
       min_length (transformers' _prepare_generated_length sets min_length from it) */
    g.min_new_tokens = 0, g.min_length = 0, g.no_repeat_ngram_size = 0, g.num_beams = 1, g.length_penalty = 1.0f;
    g.early_stopping = DT_EARLY_STOPPING_FALSE;
    if (gen_num(&r, "min_new_tokens", 0, 1e6, true, &v))
        g.min_new_tokens = (int64_t)v;
    else if (gen_num(&r, "min_length", 0, 1e6, true, &v))
        g.min_length = (int64_t)v;
    if (gen_num(&r, "no_repeat_ngram_size", 0, 1e6, true, &v))
        g.no_repeat_ngram_size = (int64_t)v;
    if (gen_num(&r, "num_beams", 1, 1e5, true, &v))
        g.num_beams = (int64_t)v;
    if (gen_num(&r, "length_penalty", -1e6, 1e6, false, &v))
        g.length_penalty = (float)v;
    const cJSON *es = cJSON_GetObjectItemCaseSensitive(root, "early_stopping");
    if (cJSON_IsBool(es))
        g.early_stopping = cJSON_IsTrue(es) ? DT_EARLY_STOPPING_TRUE : DT_EARLY_STOPPING_FALSE;
    else if (cJSON_IsString(es) && !strcmp(es->valuestring, "never"))
        g.early_stopping = DT_EARLY_STOPPING_NEVER;
    else if (es && !cJSON_IsNull(es) && r.st >= 0)
        r.st = dt_error(DT_ERR_FORMAT, "%s: key \"early_stopping\" must be true, false or \"never\"", path);
    if (r.st >= 0)
        r.st = dt__hf_token_ids(cJSON_GetObjectItemCaseSensitive(root, "eos_token_id"), path, "eos_token_id",
                                g.eos_ids, DT_GENERATE_MAX_EOS, &g.n_eos);
    /* what transformers would do that dt_model_generate does not (a key at its default changes nothing) */
    static const struct {
        const char *key;
        double dflt;
        bool sampling; /* only with do_sample (transformers' warpers) */
    } other[] = {{"penalty_alpha", 0, false}};
    for (size_t i = 0; r.st >= 0 && ignored && n && i < sizeof other / sizeof other[0]; i++) {
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, other[i].key);
        if (other[i].sampling && !cJSON_IsTrue(ds))
            continue;
        if (cJSON_IsNumber(o) && o->valuedouble != other[i].dflt) {
            size_t l = strlen(ignored);
            snprintf(ignored + l, n - l, "%s%s %g", l ? ", " : "", other[i].key, o->valuedouble);
        }
    }
    cJSON_Delete(root);
    if (r.st < 0)
        return r.st;
    *gp = g;
    return DT_OK;
}
