/* Reading a Hugging Face model directory's config.json
 * (models.h: dt_hf_config_read): transformers' PretrainedConfig keys with
 * their defaults for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM, GemmaForCausalLM (Gemma 1), Gemma2ForCausalLM, Gemma3ForCausalLM (and the language model of
 * Gemma3ForConditionalGeneration: its text_config), Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4-mini),
 * GraniteForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, SmolLM3ForCausalLM, MinistralForCausalLM, the mixtures of
 * experts MixtralForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM and OlmoeForCausalLM (their experts' keys:
 * read_moe), and GPT2LMHeadModel; every value dtrain does not implement is refused naming the file and the key. hf.c
 * builds the model it describes. */
#include "base/json_strict.h"
#include "zoo.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_NAME "config.json"
#define MAX_CONFIG_BYTES (16u << 20)

typedef struct {
    const char *path; /* DIR/config.json, for messages */
    const cJSON *root;
    dt_status st;
} cfg_reader;

static const cJSON *item(const cJSON *o, const char *key)
{
    return o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* An integer key: missing or null -> def; else a whole number in [lo, hi]. */
static int64_t get_int(cfg_reader *r, const cJSON *o, const char *key, int64_t def, int64_t lo, int64_t hi)
{
    const cJSON *v = item(o, key);
    if (r->st < 0 || !v || cJSON_IsNull(v))
        return def;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be an integer in [%lld, %lld]", r->path, key,
                         (long long)lo, (long long)hi);
        return def;
    }
    return (int64_t)v->valuedouble;
}

static double get_num(cfg_reader *r, const cJSON *o, const char *key, double def)
{
    const cJSON *v = item(o, key);
    if (r->st < 0 || !v || cJSON_IsNull(v))
        return def;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a number", r->path, key);
        return def;
    }
    return v->valuedouble;
}

/* A number whose null means none (0): Gemma2Config's soft caps */
static double get_num_or_none(cfg_reader *r, const cJSON *o, const char *key, double def)
{
    const cJSON *v = item(o, key);
    return v && cJSON_IsNull(v) ? 0.0 : get_num(r, o, key, def);
}

static bool get_bool(cfg_reader *r, const cJSON *o, const char *key, bool def)
{
    const cJSON *v = item(o, key);
    if (r->st < 0 || !v || cJSON_IsNull(v))
        return def;
    if (!cJSON_IsBool(v)) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be true or false", r->path, key);
        return def;
    }
    return cJSON_IsTrue(v);
}

static const char *get_str(cfg_reader *r, const cJSON *o, const char *key, const char *def)
{
    const cJSON *v = item(o, key);
    if (r->st < 0 || !v || cJSON_IsNull(v))
        return def;
    if (!cJSON_IsString(v)) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a string", r->path, key);
        return def;
    }
    return v->valuestring;
}

dt_status dt__hf_token_ids(const cJSON *v, const char *path, const char *key, int64_t *ids, int cap, int *n)
{
    *n = 0;
    if (!v || cJSON_IsNull(v))
        return DT_OK;
    const bool list = cJSON_IsArray(v);
    if (list && cJSON_GetArraySize(v) > cap)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: key \"%s\" lists %d token ids (at most %d)", path, key,
                        cJSON_GetArraySize(v), cap);
    for (const cJSON *e = list ? v->child : v; e; e = list ? e->next : NULL) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0 && e->valuedouble <= (double)INT32_MAX) ||
            e->valuedouble != floor(e->valuedouble)) {
            *n = 0;
            return dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a token id in [0, 2^31) (or a list of them)",
                            path, key);
        }
        ids[(*n)++] = (int64_t)e->valuedouble;
    }
    return DT_OK;
}

/* dt__hf_token_ids of o's key, after no earlier error: how many. */
static int get_tokens(cfg_reader *r, const cJSON *o, const char *key, int64_t *ids, int cap)
{
    int n = 0;
    if (r->st >= 0)
        r->st = dt__hf_token_ids(item(o, key), r->path, key, ids, cap, &n);
    return n;
}

static void unsupported(cfg_reader *r, const char *key, const char *why)
{
    if (r->st >= 0)
        r->st = dt_error(DT_ERR_UNSUPPORTED, "%s: key \"%s\": %s", r->path, key, why);
}

/* Key `key` of o (named `where`.`key`), a list of n positive numbers, into
 * out as f32 (torch.tensor(factors, dtype=float32)). */
static void get_factors(cfg_reader *r, const cJSON *o, const char *where, const char *key, int64_t n, float *out)
{
    const cJSON *v = item(o, key);
    if (r->st < 0)
        return;
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != n) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s.%s\" must be a list of %lld numbers (the rotary width / 2)",
                         r->path, where, key, (long long)n);
        return;
    }
    int64_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || !(e->valuedouble > 0.0) ||
            !((float)e->valuedouble > 0.0f) || !isfinite((float)e->valuedouble)) {
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s.%s\": entry %lld must be a positive number", r->path,
                             where, key, (long long)i);
            return;
        }
        out[i] = (float)e->valuedouble;
    }
}

/* LongRoPE's keys (transformers' _compute_longrope_parameters): short_factor
 * and long_factor (rotary width / 2 each), Phi3Config's top-level
 * original_max_position_embeddings (default 4096; transformers puts it over
 * the one in rs), attention_factor or its default from factor (or
 * max_position_embeddings / original). */
static void read_longrope(cfg_reader *r, const cJSON *rs, const char *where, dt_llama_config *c)
{
    const int64_t half = (c->rotary_dim ? c->rotary_dim : c->head_dim) / 2;
    get_factors(r, rs, where, "short_factor", half, c->rope_short_factor);
    get_factors(r, rs, where, "long_factor", half, c->rope_long_factor);
    c->rope_original_max_position_embeddings = get_int(r, r->root, "original_max_position_embeddings", 4096, 1,
                                                       INT32_MAX);
    const double factor = get_num(r, rs, "factor", (double)c->max_position_embeddings /
                                                       (double)c->rope_original_max_position_embeddings);
    c->rope_factor = factor > 0.0 ? factor : 1.0;
    c->rope_attention_factor = get_num(r, rs, "attention_factor", factor <= 1.0 ? 1.0
                                       : sqrt(1.0 + log(factor) / log((double)c->rope_original_max_position_embeddings)));
    if (r->st >= 0 && !(c->rope_attention_factor > 0.0))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s.attention_factor\" must be positive", r->path, where);
}

/* YaRN's keys (transformers' _compute_yarn_parameters): factor (null:
 * max_position_embeddings / original), original_max_position_embeddings
 * (config.json's top level first, then rs's, then max_position_embeddings),
 * beta_fast and beta_slow (0 or null: 32 and 1), truncate (true), and
 * attention_factor or its default: 0.1 ln(factor) + 1, or with mscale and
 * mscale_all_dim both non-zero the ratio of their two such values. */
static void read_yarn(cfg_reader *r, const cJSON *rs, const char *where, dt_llama_config *c)
{
    const int64_t orig = get_int(r, rs, "original_max_position_embeddings", c->max_position_embeddings, 1, INT32_MAX);
    c->rope_original_max_position_embeddings = get_int(r, r->root, "original_max_position_embeddings", orig, 1,
                                                       INT32_MAX);
    const double factor = get_num(r, rs, "factor", (double)c->max_position_embeddings /
                                                       (double)c->rope_original_max_position_embeddings);
    c->rope_factor = factor;
    const double bf = get_num(r, rs, "beta_fast", 0.0), bs = get_num(r, rs, "beta_slow", 0.0);
    c->rope_beta_fast = bf != 0.0 ? bf : 32.0; /* `get("beta_fast") or 32` */
    c->rope_beta_slow = bs != 0.0 ? bs : 1.0;
    c->rope_truncate = get_bool(r, rs, "truncate", true);
    const double ms = get_num(r, rs, "mscale", 0.0), msa = get_num(r, rs, "mscale_all_dim", 0.0);
#define YARN_MSCALE(m) (factor <= 1.0 ? 1.0 : 0.1 * (m) * log(factor) + 1.0)
    c->rope_attention_factor = get_num(r, rs, "attention_factor", ms != 0.0 && msa != 0.0
                                       ? YARN_MSCALE(ms) / YARN_MSCALE(msa) : YARN_MSCALE(1.0));
#undef YARN_MSCALE
    if (r->st >= 0 && !(factor > 0.0))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s.factor\" must be positive", r->path, where);
    if (r->st >= 0 && (!(c->rope_attention_factor > 0.0) || !(c->rope_beta_fast > 0.0) ||
                       !(c->rope_beta_slow > 0.0)))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\": yarn's attention_factor (or mscale / mscale_all_dim), "
                         "beta_fast and beta_slow must give positive numbers", r->path, where);
}

/* The scaling rs (rope_scaling's object or rope_parameters', named where;
 * NULL or null: none): its rope_type and that type's keys into c. phi3:
 * Phi3Config's reading (its "su" and "yarn" are longrope, the only scaling
 * it has). */
static void read_scaling(cfg_reader *r, const cJSON *rs, const char *where, dt_llama_config *c, bool phi3)
{
    if (r->st < 0 || !rs || cJSON_IsNull(rs))
        return;
    if (!cJSON_IsObject(rs)) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be an object or null", r->path, where);
        return;
    }
    const char *type = get_str(r, rs, "rope_type", get_str(r, rs, "type", "default"));
    char key[64];
    snprintf(key, sizeof key, "%s.rope_type", where);
    if (r->st < 0)
        return;
    if (!strcmp(type, "default"))
        return;
    if (phi3 && (!strcmp(type, "longrope") || !strcmp(type, "su") || !strcmp(type, "yarn"))) {
        c->rope_type = DT_ROPE_LONGROPE;
        read_longrope(r, rs, where, c);
        return;
    }
    if (!phi3 && !strcmp(type, "dynamic")) {
        /* NTK-aware scaling: transformers changes the frequencies only in a forward past
           max_position_embeddings, which dtrain's never reach (generation's window moves within them) */
        if (!(get_num(r, rs, "factor", NAN) > 0.0) && r->st >= 0)
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\": rope scaling 'dynamic' needs a factor > 0", r->path,
                             where);
        return;
    }
    if (!phi3 && !strcmp(type, "yarn")) {
        c->rope_type = DT_ROPE_YARN;
        read_yarn(r, rs, where, c);
        return;
    }
    if (!phi3 && !strcmp(type, "linear"))
        c->rope_type = DT_ROPE_LINEAR;
    else if (!phi3 && !strcmp(type, "llama3"))
        c->rope_type = DT_ROPE_LLAMA3;
    else {
        char why[200];
        snprintf(why, sizeof why, "rope scaling '%s' is not supported (known: %s)", type,
                 phi3 ? "default, longrope (su, yarn: Phi3Config reads them as longrope)"
                      : "default, linear, llama3, yarn, dynamic; longrope for Phi-3");
        unsupported(r, key, why);
        return;
    }
    c->rope_factor = get_num(r, rs, "factor", NAN);
    if (c->rope_type == DT_ROPE_LLAMA3) {
        c->rope_low_freq_factor = get_num(r, rs, "low_freq_factor", NAN);
        c->rope_high_freq_factor = get_num(r, rs, "high_freq_factor", NAN);
        c->rope_original_max_position_embeddings =
            get_int(r, rs, "original_max_position_embeddings", 0, 1, INT32_MAX);
    }
    if (r->st >= 0 && (isnan(c->rope_factor) || (c->rope_type == DT_ROPE_LLAMA3 &&
                                                 (isnan(c->rope_low_freq_factor) ||
                                                  isnan(c->rope_high_freq_factor) ||
                                                  !c->rope_original_max_position_embeddings))))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\": rope scaling '%s' needs factor%s", r->path, where, type,
                         c->rope_type == DT_ROPE_LLAMA3 ? ", low_freq_factor, high_freq_factor and "
                                                          "original_max_position_embeddings" : "");
}

/* rope_theta and rope_scaling, or transformers 5's rope_parameters */
static void read_rope(cfg_reader *r, dt_llama_config *c, bool phi3)
{
    const cJSON *rp = item(r->root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp)) {
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"rope_parameters\" must be an object", r->path);
            return;
        }
        const double top = get_num(r, r->root, "rope_theta", NAN);
        c->rope_theta = get_num(r, rp, "rope_theta", isnan(top) ? c->rope_theta : top);
        static char warned[4200]; /* once per file and process: a run reads its config.json more than once */
        if (r->st >= 0 && !isnan(top) && top != c->rope_theta && strcmp(warned, r->path)) {
            snprintf(warned, sizeof warned, "%s", r->path);
            dt_log(DT_LOG_WARN, "%s: key \"rope_theta\" (%g) and key \"rope_parameters.rope_theta\" (%g) disagree: "
                   "the latter is used, as transformers 5 reads rope_parameters (transformers 4 read rope_theta)",
                   r->path, top, c->rope_theta);
        }
        read_scaling(r, rp, "rope_parameters", c, phi3);
    } else {
        c->rope_theta = get_num(r, r->root, "rope_theta", c->rope_theta);
        read_scaling(r, item(r->root, "rope_scaling"), "rope_scaling", c, phi3);
    }
}

/* Two kinds of RoPE, Gemma3TextConfig's and Olmo3Config's: the full layers' rope_theta (Gemma 3's 1e6, OLMo 3's
 * 5e5) with rope_scaling, the sliding layers' base without scaling (Gemma 3's rope_local_base_freq, 1e4; OLMo 3's
 * 5e5: Olmo3Config gives the legacy top-level rope_theta to the full layers only); or transformers 5's
 * rope_parameters with one object per layer kind ("full_attention", "sliding_attention"; a missing one takes the
 * top-level keys' values, a legacy rope_scaling still scales the full layers, as the configs read them). A flat
 * rope_parameters is refused: these configs would ignore its rope_theta. */
static void read_kinds_rope(cfg_reader *r, dt_llama_config *c, bool olmo3)
{
    const cJSON *rp = item(r->root, "rope_parameters"), *rs = item(r->root, "rope_scaling");
    const cJSON *full = NULL, *slide = NULL;
    if (rp && !cJSON_IsNull(rp)) {
        full = item(rp, "full_attention"), slide = item(rp, "sliding_attention");
        if (!cJSON_IsObject(rp) || (!full && !slide) || (full && !cJSON_IsNull(full) && !cJSON_IsObject(full)) ||
            (slide && !cJSON_IsNull(slide) && !cJSON_IsObject(slide))) {
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"rope_parameters\" must be an object of one object per layer "
                             "kind (\"full_attention\", \"sliding_attention\") for %s", r->path,
                             olmo3 ? "OLMo 3" : "Gemma 3");
            return;
        }
    }
    c->rope_theta = get_num(r, full, "rope_theta", get_num(r, r->root, "rope_theta", olmo3 ? 5e5 : 1e6));
    c->rope_local_theta = get_num(r, slide, "rope_theta",
                                  olmo3 ? 5e5 : get_num(r, r->root, "rope_local_base_freq", 1e4));
    if (r->st >= 0 && !(c->rope_local_theta > 0.0))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a number > 0", r->path,
                         slide ? "rope_parameters.sliding_attention.rope_theta" : "rope_local_base_freq");
    static char warned[4200]; /* once per file and process: a run reads its config.json more than once */
    if (r->st >= 0 && olmo3 && !item(slide, "rope_theta") && c->rope_local_theta != c->rope_theta &&
        strcmp(warned, r->path)) {
        snprintf(warned, sizeof warned, "%s", r->path);
        dt_log(DT_LOG_WARN, "%s: the sliding layers rotate with base %g, Olmo3Config's default, not the full "
               "layers' rope_theta %g (transformers 5 reads the top-level rope_theta into the full layers' "
               "parameters only; rope_parameters.sliding_attention.rope_theta sets theirs)", r->path,
               c->rope_local_theta, c->rope_theta);
    }
    const char *type = get_str(r, slide, "rope_type", "default");
    if (r->st >= 0 && strcmp(type, "default"))
        unsupported(r, "rope_parameters.sliding_attention.rope_type", "the sliding layers rotate with the "
                    "default RoPE only (their base unscaled)");
    if (rs && !cJSON_IsNull(rs))
        read_scaling(r, rs, "rope_scaling", c, false);
    else
        read_scaling(r, full, "rope_parameters.full_attention", c, false);
}

/* SmolLM3Config's NoPE layers: no_rope_layers (1 a layer with RoPE, 0 one without, one entry a layer at least;
 * Python's truth of each), or without it every no_rope_layer_interval-th layer (4) without. */
static void read_nope(cfg_reader *r, dt_llama_config *c)
{
    const cJSON *nl = item(r->root, "no_rope_layers");
    const int64_t L = c->num_hidden_layers;
    const int64_t every = nl && !cJSON_IsNull(nl) ? 0 : get_int(r, r->root, "no_rope_layer_interval", 4, 1, INT32_MAX);
    if (nl && !cJSON_IsNull(nl) && (!cJSON_IsArray(nl) || cJSON_GetArraySize(nl) < L) && r->st >= 0) {
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"no_rope_layers\" must be a list of 0 and 1 with an entry for each "
                         "of the %lld layers", r->path, (long long)L);
        return;
    }
    const cJSON *e = cJSON_IsArray(nl) ? nl->child : NULL;
    for (int64_t i = 0; i < L && r->st >= 0; i++, e = e ? e->next : NULL) {
        if (e && !cJSON_IsNumber(e) && !cJSON_IsBool(e)) {
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"no_rope_layers\": entry %lld is not a number", r->path,
                             (long long)i);
            return;
        }
        const bool nope = e ? (cJSON_IsBool(e) ? cJSON_IsFalse(e) : e->valuedouble == 0.0) : (i + 1) % every == 0;
        if (nope && i >= DT_LLAMA_MAX_LAYERS)
            unsupported(r, "no_rope_layers", "a layer without RoPE past the first 256 layers is not supported");
        else if (i < DT_LLAMA_MAX_LAYERS)
            c->nope_layers[i] = nope;
    }
}

/* Keys of other mixture-of-experts models, whose blocks these are not: refused rather than ignored */
static const char *const g_foreign_moe[] = {
    "shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts", "moe_layer_freq",
    "first_k_dense_replace", "topk_method", "scoring_func", "routed_scaling_factor", "n_group", "topk_group",
    "n_routed_experts", "moe_topk", "router_bias", "expert_bias"};

/* MixtralConfig's, Qwen3MoeConfig's, Qwen2MoeConfig's and OlmoeConfig's experts: num_local_experts or
 * num_experts (one attribute maps to the other), num_experts_per_tok, norm_topk_prob, Qwen's moe_intermediate_size,
 * decoder_sparse_step and mlp_only_layers, Qwen2-MoE's shared_expert_intermediate_size (Mixtral and OLMoE: every
 * layer sparse, intermediate_size each expert's; Mixtral's weights renormalised); OLMoE's clip_qkv and
 * sliding_window refused;
 * what dtrain does not implement refused: the router's auxiliary loss (output_router_logits), its jitter, a
 * Qwen3-MoE sliding window, keys of other MoE designs. */
static void read_moe(cfg_reader *r, const char *arch, dt_llama_config *c)
{
    const bool mixtral = !strcmp(arch, "MixtralForCausalLM"), qwen2moe = !strcmp(arch, "Qwen2MoeForCausalLM");
    const bool olmoe = !strcmp(arch, "OlmoeForCausalLM");
    const cJSON *o = r->root;
    const int64_t big = INT32_MAX, L = c->num_hidden_layers;
    const char *ek = item(o, "num_local_experts") || !item(o, "num_experts") ? "num_local_experts" : "num_experts";
    c->num_experts = get_int(r, o, ek, mixtral ? 8 : qwen2moe ? 60 : olmoe ? 64 : 128, 0, 1 << 16);
    c->num_experts_per_tok = get_int(r, o, "num_experts_per_tok", mixtral ? 2 : qwen2moe ? 4 : 8, 1, big);
    c->moe_intermediate_size = mixtral || olmoe ? c->intermediate_size /* OLMoE's experts: intermediate_size */
                                                : get_int(r, o, "moe_intermediate_size", qwen2moe ? 1408 : 768, 1, big);
    if (qwen2moe)
        c->shared_expert_intermediate_size = get_int(r, o, "shared_expert_intermediate_size", 5632, 1, big);
    c->norm_topk_prob = mixtral || get_bool(r, o, "norm_topk_prob", false);
    c->moe_mixtral_names = mixtral;
    if (r->st >= 0 && c->num_experts > 0 && c->num_experts_per_tok > c->num_experts)
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"num_experts_per_tok\" (%lld) must be at most key \"%s\" (%lld): "
                         "each token goes to that many distinct experts", r->path, (long long)c->num_experts_per_tok,
                         ek, (long long)c->num_experts);
    if (get_bool(r, o, "output_router_logits", false))
        unsupported(r, "output_router_logits", "the router's auxiliary load-balancing loss is not implemented (false "
                    "only: transformers then trains on the language-model loss alone)");
    if (get_num(r, o, "router_jitter_noise", 0.0) != 0.0)
        unsupported(r, "router_jitter_noise", "jitter on the router's input is not supported (0 only)");
    if (!mixtral && !olmoe && get_bool(r, o, "use_sliding_window", false))
        unsupported(r, "use_sliding_window", "a sliding window in a Qwen3-MoE or Qwen2-MoE model is not supported "
                    "(false only)");
    if (olmoe && item(o, "sliding_window") && !cJSON_IsNull(item(o, "sliding_window")))
        unsupported(r, "sliding_window", "a sliding window in an OLMoE model is not supported (null only)");
    if (olmoe && item(o, "clip_qkv") && !cJSON_IsNull(item(o, "clip_qkv")))
        unsupported(r, "clip_qkv", "clipping q, k and v is not supported (null only)");
    if (olmoe && r->st >= 0 && c->num_attention_heads * c->head_dim != c->hidden_size) /* q_norm's [C] on [H hd] */
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"head_dim\" (%lld) times num_attention_heads (%lld) must be "
                         "hidden_size (%lld): OLMoE normalizes q over hidden_size values", r->path,
                         (long long)c->head_dim, (long long)c->num_attention_heads, (long long)c->hidden_size);
    for (size_t i = 0; i < sizeof g_foreign_moe / sizeof g_foreign_moe[0]; i++)
        if (item(o, g_foreign_moe[i]) && !cJSON_IsNull(item(o, g_foreign_moe[i])) &&
            !(qwen2moe && !strcmp(g_foreign_moe[i], "shared_expert_intermediate_size")))
            unsupported(r, g_foreign_moe[i], !strcmp(arch, "Qwen3MoeForCausalLM")
                                                 ? "not a key of Qwen3MoeForCausalLM's experts (another "
                                                   "mixture-of-experts design, such as Qwen2-MoE's shared expert): "
                                                   "not supported"
                                                 : "not a key of this model's experts (another mixture-of-experts "
                                                   "design): not supported");
    if (mixtral || olmoe || r->st < 0) /* every layer sparse */
        return;
    const int64_t step = get_int(r, o, "decoder_sparse_step", 1, 1, big);
    const cJSON *only = item(o, "mlp_only_layers");
    if (only && !cJSON_IsNull(only) && !cJSON_IsArray(only) && r->st >= 0)
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"mlp_only_layers\" must be a list of layer indices", r->path);
    for (const cJSON *e = cJSON_IsArray(only) ? only->child : NULL; e && r->st >= 0; e = e->next)
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
            e->valuedouble >= (double)L)
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"mlp_only_layers\": each entry must be a layer index in [0, "
                             "%lld)", r->path, (long long)L);
        else if (e->valuedouble < DT_LLAMA_MAX_LAYERS)
            c->dense_layers[(int)e->valuedouble] = 1;
    for (int64_t i = 0; i < L && i < DT_LLAMA_MAX_LAYERS; i++) /* Qwen3MoeDecoderLayer's choice */
        c->dense_layers[i] |= (i + 1) % step != 0;
}

static void read_llama(cfg_reader *r, const char *arch, dt_llama_config *c)
{
    const cJSON *o = r->root;
    const int64_t big = INT32_MAX;
    const bool qwen2 = !strcmp(arch, "Qwen2ForCausalLM"), qwen3 = !strcmp(arch, "Qwen3ForCausalLM");
    const bool gemma = !strcmp(arch, "GemmaForCausalLM"), phi3 = !strcmp(arch, "Phi3ForCausalLM");
    const bool olmo3 = !strcmp(arch, "Olmo3ForCausalLM"), gemma3 = !strcmp(arch, "Gemma3ForCausalLM");
    const bool olmo2 = !strcmp(arch, "Olmo2ForCausalLM") || olmo3; /* OLMo 3: OLMo 2's block and sliding layers */
    const bool gemma2 = !strcmp(arch, "Gemma2ForCausalLM") || gemma3; /* Gemma 3: Gemma 2's block and more */
    const bool smollm3 = !strcmp(arch, "SmolLM3ForCausalLM"), ministral = !strcmp(arch, "MinistralForCausalLM");
    const bool mixtral = !strcmp(arch, "MixtralForCausalLM"), qwen3moe = !strcmp(arch, "Qwen3MoeForCausalLM");
    const bool qwen2moe = !strcmp(arch, "Qwen2MoeForCausalLM"), olmoe = !strcmp(arch, "OlmoeForCausalLM");
    memset(c, 0, sizeof *c);
    /* the defaults of LlamaConfig, or Qwen3Config's, GemmaConfig's, Gemma2Config's, Gemma3TextConfig's,
       Phi3Config's, Olmo2Config's, SmolLM3Config's, MinistralConfig's, MixtralConfig's, Qwen3MoeConfig's and
       Qwen2MoeConfig's where they differ */
    const bool qmoe = qwen3moe || qwen2moe;
    c->vocab_size = get_int(r, o, "vocab_size",
                            gemma3 ? 262208 : gemma || gemma2 ? 256000 : qwen3 || qmoe ? 151936 : phi3 ? 32064
                                : olmo2 || olmoe ? 50304 : smollm3 ? 128256 : 32000, 1, big);
    c->hidden_size = get_int(r, o, "hidden_size", gemma || phi3 ? 3072 : gemma2 ? 2304 : smollm3 || qmoe ? 2048 : 4096,
                             1, big);
    c->intermediate_size = get_int(r, o, "intermediate_size",
                                   gemma ? 24576 : gemma2 ? 9216 : qwen3 ? 22016 : phi3 ? 8192
                                       : ministral || mixtral ? 14336 : qwen3moe ? 6144 : qwen2moe ? 5632
                                       : olmoe ? 2048 : 11008,
                                   1, big);
    c->num_hidden_layers = get_int(r, o, "num_hidden_layers",
                                   gemma ? 28 : gemma2 ? 26 : smollm3 ? 36 : qmoe ? 24 : olmoe ? 16 : 32, 1, big);
    c->num_attention_heads = get_int(r, o, "num_attention_heads",
                                     gemma || smollm3 || qwen2moe || olmoe ? 16 : gemma2 ? 8 : 32, 1, big);
    c->num_key_value_heads = get_int(r, o, "num_key_value_heads",
                                     gemma2 || smollm3 || qwen3moe ? 4 : ministral || mixtral ? 8
                                         : c->num_attention_heads, 1, big);
    c->head_dim = get_int(r, o, "head_dim",
                          gemma || gemma2 ? 256 : qwen3 ? 128
                                : c->hidden_size / (c->num_attention_heads ? c->num_attention_heads : 1),
                          1, big);
    c->max_position_embeddings = get_int(r, o, "max_position_embeddings",
                                         gemma3 || ministral || mixtral ? 131072 : gemma || gemma2 ? 8192
                                             : qwen3 || smollm3 || qmoe ? 32768 : phi3 || olmoe ? 4096 : 2048,
                                         1, big);
    c->rms_norm_eps = (float)get_num(r, o, "rms_norm_eps", phi3 || olmo2 || mixtral || olmoe ? 1e-5 : 1e-6);
    c->initializer_range = (float)get_num(r, o, "initializer_range", 0.02);
    c->rope_theta = smollm3 ? 2e6 : mixtral ? 1e6 : 10000.0; /* the configs' default_theta */
    c->rope_type = DT_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    if (phi3) { /* Phi-3.5/Phi-4-mini: RoPE on int(head_dim * partial_rotary_factor) values of each head */
        /* Phi3Config: rope_parameters' (or the legacy rope_scaling's, which it becomes) over the top level's */
        const cJSON *rp = item(o, "rope_parameters"), *rs = item(o, "rope_scaling");
        double prf = get_num(r, o, "partial_rotary_factor", 1.0);
        if (cJSON_IsObject(rp))
            prf = get_num(r, rp, "partial_rotary_factor", prf);
        else if (cJSON_IsObject(rs))
            prf = get_num(r, rs, "partial_rotary_factor", prf);
        const double w = (double)c->head_dim * prf;
        if (r->st >= 0 && (!(prf > 0.0 && prf <= 1.0) || w < 2.0 || (int64_t)w % 2))
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"partial_rotary_factor\": %g of head_dim %lld gives %g "
                             "rotary values; it must be in (0, 1] and give an even number >= 2", r->path, prf,
                             (long long)c->head_dim, floor(w > 0 ? w : 0)); /* (a huge w fits no integer) */
        else if (r->st >= 0 && (int64_t)w != c->head_dim)
            c->rotary_dim = (int64_t)w; /* int() truncates, as transformers' */
    }
    if (gemma3 || olmo3)
        read_kinds_rope(r, c, olmo3);
    else
        read_rope(r, c, phi3);
    /* MixtralConfig has no attention_bias: transformers ignores the key */
    c->attention_bias = qwen2 ? true : qwen2moe ? get_bool(r, o, "qkv_bias", true) /* Qwen2MoeConfig's key */
                        : !mixtral && get_bool(r, o, "attention_bias", false);
    c->qkv_bias_only = qwen2 || qwen2moe;
    c->qk_norm = qwen3 || gemma3 || qwen3moe;
    c->olmo2 = olmo2;
    c->whole_qk_norm = olmoe;
    c->gemma = gemma || gemma2;
    c->gemma2 = gemma2;
    c->fused = phi3;
    const cJSON *pad = item(o, "pad_token_id");
    if ((gemma || gemma2 || phi3 || olmo2 || smollm3 || olmoe) && !pad) { /* Gemma(2, 3)Config's pad_token_id 0,
                                                                    Phi3Config's 32000, Olmo2Config's and
                                                                    OlmoeConfig's 1, SmolLM3Config's 128004 */
        c->pad_token_id = gemma || gemma2 ? 0 : olmo2 || olmoe ? 1 : smollm3 ? 128004 : 32000;
        c->has_pad_token = c->pad_token_id < c->vocab_size;
        if (!c->has_pad_token)
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"pad_token_id\" is absent: %s's default %lld is outside the "
                             "vocabulary (vocab_size %lld); give it (null for none)", r->path,
                             gemma ? "GemmaConfig" : gemma3 ? "Gemma3TextConfig" : gemma2 ? "Gemma2Config"
                             : olmo3 ? "Olmo3Config" : olmo2 ? "Olmo2Config" : smollm3 ? "SmolLM3Config"
                             : olmoe ? "OlmoeConfig"
                             : "Phi3Config",
                             (long long)c->pad_token_id, (long long)c->vocab_size);
    } else if (pad && !cJSON_IsNull(pad)) { /* nn.Embedding(padding_idx=pad_token_id): an id of the vocabulary */
        c->pad_token_id = get_int(r, o, "pad_token_id", -1, 0, c->vocab_size > 0 ? c->vocab_size - 1 : 0);
        c->has_pad_token = r->st >= 0;
    }
    /* theirs have no MLP biases (nor Phi-3 attention biases) */
    c->mlp_bias = qwen2 || qwen3 || gemma || gemma2 || phi3 || olmo2 || mixtral || qwen3moe || qwen2moe || olmoe
                      ? false : get_bool(r, o, "mlp_bias", false);
    if (phi3) {
        c->attention_bias = false;
        /* Phi3Config: the dropouts act in training only (resid_pdrop after attention and MLP, embd_pdrop unused
           by transformers 5); dtrain's Llama block has none */
        if (get_num(r, o, "resid_pdrop", 0.0) != 0.0)
            unsupported(r, "resid_pdrop", "residual dropout is not supported (0 only)");
        if (get_num(r, o, "embd_pdrop", 0.0) != 0.0)
            unsupported(r, "embd_pdrop", "embedding dropout is not supported (0 only)");
    }
    if (!strcmp(arch, "GraniteForCausalLM")) { /* GraniteConfig: LlamaConfig's keys and four multipliers */
        const char *key[4] = {"embedding_multiplier", "residual_multiplier", "attention_multiplier",
                              "logits_scaling"};
        double *v[4] = {&c->embedding_multiplier, &c->residual_multiplier, &c->attention_multiplier,
                        &c->logits_scaling};
        for (int k = 0; k < 4; k++) {
            *v[k] = get_num(r, o, key[k], 1.0);
            if (r->st >= 0 && !(*v[k] > 0.0))
                r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a number > 0", r->path, key[k]);
            if (k != 2 && *v[k] == 1.0) /* none; an attention_multiplier of 1 is a scale of 1, not 1/sqrt(hd) */
                *v[k] = 0.0;
        }
    }
    c->tie_word_embeddings = get_bool(r, o, "tie_word_embeddings", gemma || gemma2 || smollm3);
    if (gemma2) { /* Gemma2Config, Gemma3TextConfig: hidden_activation (a hidden_act is not read), the scale,
                     the soft caps (Gemma 3's none by default) */
        const char *act = get_str(r, o, "hidden_activation", "gelu_pytorch_tanh");
        if (r->st >= 0 && strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_python_tanh"))
            unsupported(r, "hidden_activation", "only GELU's tanh form is supported for Gemma 2 and 3 "
                        "(\"gelu_pytorch_tanh\" or \"gelu_python_tanh\")");
        c->query_pre_attn_scalar = get_num(r, o, "query_pre_attn_scalar", 256.0);
        c->attn_logit_softcapping = get_num_or_none(r, o, "attn_logit_softcapping", gemma3 ? 0.0 : 50.0);
        c->final_logit_softcapping = get_num_or_none(r, o, "final_logit_softcapping", gemma3 ? 0.0 : 30.0);
        const char *key[3] = {"query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"};
        const double v[3] = {c->query_pre_attn_scalar, c->attn_logit_softcapping, c->final_logit_softcapping};
        for (int k = 0; k < 3 && r->st >= 0; k++)
            if (!(v[k] > 0.0) && !(k > 0 && v[k] == 0.0 && (cJSON_IsNull(item(o, key[k])) ||
                                                            (gemma3 && !item(o, key[k])))))
                r->st = dt_error(DT_ERR_FORMAT, "%s: key \"%s\" must be a number > 0%s", r->path, key[k],
                                 k ? " (or null for none)" : "");
        if (get_bool(r, o, "use_bidirectional_attention", false))
            unsupported(r, "use_bidirectional_attention", "bidirectional attention is not supported (causal only)");
    } else if (gemma) {
        /* GemmaMLP: ACT2FN[hidden_act]; GemmaConfig turns the legacy "gelu" into "gelu_pytorch_tanh" (and
           transformers 5 reads no hidden_activation: the key is ignored, as it ignores it) */
        const char *act = get_str(r, o, "hidden_act", "gelu_pytorch_tanh");
        if (r->st >= 0 && strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu") && strcmp(act, "gelu_python_tanh"))
            unsupported(r, "hidden_act", "only GELU's tanh form is supported for Gemma (\"gelu_pytorch_tanh\", "
                        "\"gelu_python_tanh\" or the legacy \"gelu\", which GemmaConfig reads as "
                        "\"gelu_pytorch_tanh\")");
        if (get_bool(r, o, "use_bidirectional_attention", false))
            unsupported(r, "use_bidirectional_attention", "bidirectional attention is not supported (causal only)");
    } else {
        const char *act = get_str(r, o, "hidden_act", "silu");
        if (r->st >= 0 && strcmp(act, "silu"))
            unsupported(r, "hidden_act", "only \"silu\" (SwiGLU) is supported");
    }
    c->attention_dropout = get_num(r, o, "attention_dropout", 0.0); /* in training only */
    if (r->st >= 0 && !(c->attention_dropout >= 0.0 && c->attention_dropout < 1.0))
        r->st = dt_error(DT_ERR_FORMAT, "%s: key \"attention_dropout\" must be a number in [0, 1) (got %g)", r->path,
                         c->attention_dropout);
    if (get_int(r, o, "pretraining_tp", 1, 0, big) > 1)
        unsupported(r, "pretraining_tp", "pretraining_tp > 1 is not supported (1 only)");
    /* Sliding windows: Mistral's (and Phi-3's) on every layer, Qwen2's and Qwen3's with use_sliding_window on
       the layers from max_window_layers on, Gemma 2's on every other layer from the first, Gemma 3's on all but
       every sliding_window_pattern-th (6), OLMo 3's on three of every four, SmolLM3's (use_sliding_window) on its
       NoPE layers, Ministral's on every layer, or on those layer_types names (LlamaConfig and MistralConfig have
       none: the key is ignored, as transformers ignores it). The layers' kinds (full_attention_layers) set each one's window in
       the forward and the cache (llama.c) and Gemma 3's RoPE base, with a window or without. */
    const bool mistral = !strcmp(arch, "MistralForCausalLM") || mixtral; /* Mixtral's window: Mistral's */
    const cJSON *swv = item(o, "sliding_window");
    int64_t sw = !(mistral || qwen2 || qwen3 || phi3 || gemma2 || smollm3 || olmo3 || ministral) ||
                         (swv && cJSON_IsNull(swv))
                     ? 0 : get_int(r, o, "sliding_window", gemma2 || olmo3 || ministral ? 4096 : 0, 0, INT64_MAX / 2);
    const int64_t pattern = gemma3 ? get_int(r, o, "sliding_window_pattern", 6, 1, big) : 0;
    if ((qwen2 || qwen3 || smollm3) && !get_bool(r, o, "use_sliding_window", false))
        sw = 0;
    if (smollm3)
        read_nope(r, c);
    if (qwen2 || qwen3 || gemma2 || smollm3 || olmo3 || ministral) {
        const cJSON *lt = item(o, "layer_types");
        const int64_t L = c->num_hidden_layers;
        for (const cJSON *e = cJSON_IsArray(lt) ? lt->child : NULL; e && r->st >= 0; e = e->next)
            if (!cJSON_IsString(e) ||
                (strcmp(e->valuestring, "full_attention") && strcmp(e->valuestring, "sliding_attention")))
                unsupported(r, "layer_types", "only \"full_attention\" and \"sliding_attention\" layers are known");
        if (lt && !cJSON_IsNull(lt) && !cJSON_IsArray(lt) && r->st >= 0)
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"layer_types\" must be a list", r->path);
        if (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) != L && r->st >= 0)
            r->st = dt_error(DT_ERR_FORMAT, "%s: key \"layer_types\" has %d entries for num_hidden_layers %lld",
                             r->path, cJSON_GetArraySize(lt), (long long)L);
        const int64_t from = gemma2 || smollm3 || olmo3 || ministral ? 0
                                                                     : get_int(r, o, "max_window_layers", 28, 0, big);
        bool any = false; /* a sliding layer */
        const cJSON *e = cJSON_IsArray(lt) ? lt->child : NULL;
        for (int64_t i = 0; i < L && r->st >= 0; i++, e = e ? e->next : NULL) {
            /* the configs' defaults, or the list */
            const bool full = e ? !strcmp(e->valuestring, "full_attention")
                              : gemma3 ? (i + 1) % pattern == 0 : olmo3 ? (i + 1) % 4 == 0 : gemma2 ? i % 2 == 1
                              : smollm3 ? !sw || i >= DT_LLAMA_MAX_LAYERS || !c->nope_layers[i]
                              : ministral ? !sw : i < from;
            any |= !full;
            if (i < DT_LLAMA_MAX_LAYERS)
                c->full_attention_layers[i] = full;
        }
        if (!any) {
            sw = 0;
            c->rope_local_theta = 0.0; /* no sliding layer to rotate otherwise */
        }
    }
    c->sliding_window = sw;
    if (mixtral || qwen3moe || qwen2moe || olmoe)
        read_moe(r, arch, c);
}

static void read_gpt2(cfg_reader *r, dt_gpt2_config *g)
{
    const cJSON *o = r->root;
    const int64_t big = INT32_MAX;
    g->vocab_size = get_int(r, o, "vocab_size", 50257, 1, big);
    g->n_embd = get_int(r, o, "n_embd", 768, 1, big);
    g->n_layer = get_int(r, o, "n_layer", 12, 1, big);
    g->n_head = get_int(r, o, "n_head", 12, 1, big);
    g->block_size = get_int(r, o, "n_positions", 1024, 1, big);
    double pe = get_num(r, o, "embd_pdrop", 0.1), pr = get_num(r, o, "resid_pdrop", 0.1);
    double pa = get_num(r, o, "attn_pdrop", 0.1);
    if (r->st >= 0 && (pe != pr || pe != pa))
        unsupported(r, "attn_pdrop", "embd_pdrop, resid_pdrop and attn_pdrop must be equal (dtrain's GPT-2 has one "
                    "dropout)");
    g->dropout = (float)pe;
    if (get_int(r, o, "n_inner", 4 * g->n_embd, 1, big) != 4 * g->n_embd)
        unsupported(r, "n_inner", "only 4 * n_embd (null) is supported");
    const char *act = get_str(r, o, "activation_function", "gelu_new");
    if (r->st >= 0 && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
        unsupported(r, "activation_function", "only \"gelu_new\" (GELU, tanh form) is supported");
    if (fabs(get_num(r, o, "layer_norm_epsilon", 1e-5) - 1e-5) > 1e-12)
        unsupported(r, "layer_norm_epsilon", "only 1e-5 is supported");
    if (!get_bool(r, o, "tie_word_embeddings", true))
        unsupported(r, "tie_word_embeddings", "only a tied head (true) is supported for GPT-2");
    /* the key named is the one set otherwise (all three were named scale_attn_weights) */
    if (!get_bool(r, o, "scale_attn_weights", true))
        unsupported(r, "scale_attn_weights", "only true (scores divided by sqrt(head size)) is supported");
    if (get_bool(r, o, "scale_attn_by_inverse_layer_idx", false))
        unsupported(r, "scale_attn_by_inverse_layer_idx", "only false (no per-layer scaling) is supported");
    if (get_bool(r, o, "reorder_and_upcast_attn", false))
        unsupported(r, "reorder_and_upcast_attn", "only false is supported");
}

/* One part of a repository id: a letter or digit, then letters, digits, '-', '_', '.' (no ".."). */
static bool repo_part(const char *s, size_t n)
{
    if (n == 0 || n > 96 || !isalnum((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '_' || s[i] == '.') ||
            (s[i] == '.' && i + 1 < n && s[i + 1] == '.'))
            return false;
    return true;
}

dt_status dt_hf_hub_snapshot(const char *repo_id, char *out, size_t n)
{
    if (!repo_id || !out || !n)
        return dt_error(DT_ERR_NULL, "dt_hf_hub_snapshot: NULL argument");
    out[0] = 0;
    const char *slash = strchr(repo_id, '/');
    const size_t len = strlen(repo_id);
    const size_t org = slash ? (size_t)(slash - repo_id) : len;
    if (!(slash ? repo_part(repo_id, org) && repo_part(slash + 1, len - org - 1) : repo_part(repo_id, len)))
        return dt_error(DT_ERR_INVALID_ARG, "'%s' is not a Hugging Face Hub repository id (ORG/NAME)", repo_id);
    const char *e, *home = getenv("HOME");
    char cache[4096];
    if ((e = getenv("HF_HUB_CACHE")) && *e)
        snprintf(cache, sizeof cache, "%s", e);
    else if ((e = getenv("HUGGINGFACE_HUB_CACHE")) && *e) /* the older name */
        snprintf(cache, sizeof cache, "%s", e);
    else if ((e = getenv("HF_HOME")) && *e)
        snprintf(cache, sizeof cache, "%s/hub", e);
    else if ((e = getenv("XDG_CACHE_HOME")) && *e)
        snprintf(cache, sizeof cache, "%s/huggingface/hub", e);
    else
        snprintf(cache, sizeof cache, "%s/.cache/huggingface/hub", home && *home ? home : "");
    char repo[4300], ref[4400], rev[128] = "";
    snprintf(repo, sizeof repo, "%s/models--%.*s%s%s", cache, slash ? (int)(slash - repo_id) : (int)len, repo_id,
             slash ? "--" : "", slash ? slash + 1 : "");
    snprintf(ref, sizeof ref, "%s/refs/main", repo);
    char *txt = NULL;
    size_t tl = 0;
    if (dt_file_read_all(ref, 256, &txt, &tl) >= 0) { /* the commit main names (a hex name: nothing else is taken) */
        size_t k = 0;
        while (k < tl && k + 1 < sizeof rev && isxdigit((unsigned char)txt[k]))
            rev[k] = txt[k], k++;
        rev[k] = 0;
    }
    free(txt);
    dt_error_clear();
    struct stat sb;
    char snap[4800] = "";
    if (rev[0])
        snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, rev);
    if (!rev[0] || stat(snap, &sb) != 0 || !S_ISDIR(sb.st_mode)) { /* no ref: its only snapshot */
        snap[0] = 0;
        char sd[4400];
        snprintf(sd, sizeof sd, "%s/snapshots", repo);
        DIR *d = opendir(sd);
        int found = 0;
        for (struct dirent *de; d && (de = readdir(d));)
            if (de->d_name[0] != '.' && found++ == 0)
                snprintf(snap, sizeof snap, "%s/%s", sd, de->d_name);
        if (d)
            closedir(d);
        if (found != 1)
            snap[0] = 0;
    }
    if (!snap[0] || (size_t)snprintf(out, n, "%s", snap) >= n) {
        out[0] = 0;
        return dt_error(DT_ERR_NOT_FOUND, "the Hugging Face hub cache %s holds no snapshot of %s (download it "
                        "first: hf download %s)", cache, repo_id, repo_id);
    }
    return DT_OK;
}

dt_status dt_hf_config_read(const char *dir, dt_hf_config *out)
{
    if (!dir || !out)
        return dt_error(DT_ERR_NULL, "dt_hf_config_read: %s is NULL", dir ? "out" : "dir");
    memset(out, 0, sizeof *out);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, CONFIG_NAME);
    char *txt = NULL;
    size_t len = 0;
    dt_status st = dt_file_read_all(path, MAX_CONFIG_BYTES, &txt, &len);
    struct stat sb;
    char snap[4600];
    dt_status hub = st == DT_ERR_NOT_FOUND && stat(dir, &sb) != 0 ? dt_hf_hub_snapshot(dir, snap, sizeof snap)
                                                                  : DT_ERR_INVALID_ARG;
    if (hub == DT_ERR_NOT_FOUND) /* a repository id the cache lacks */
        return dt_error(st, "%s: no such directory; as a Hugging Face Hub id: %s", dir, dt_last_error());
    if (hub == DT_OK)
        return dt_error(st, "%s: no such directory; the Hugging Face hub cache holds it at %s: give that directory",
                        dir, snap);
    if (st < 0)
        return st == DT_ERR_NOT_FOUND ? dt_error(st, "%s: no %s (not a Hugging Face model directory)", dir,
                                                 CONFIG_NAME)
                                      : st;
    cJSON *root = NULL; /* strict: a key given twice reads as its last in transformers, its first in cJSON */
    st = dt__json_parse_strict(txt, len, path, &root);
    free(txt);
    if (st < 0)
        return st;
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_error(DT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    cfg_reader r = {.path = path, .root = root, .st = DT_OK};
    const cJSON *archs = item(root, "architectures");
    const char *arch = cJSON_IsArray(archs) && cJSON_IsString(archs->child) ? archs->child->valuestring : NULL;
    const char *mt = get_str(&r, root, "model_type", NULL);
    /* the model type's causal LM: the class transformers' AutoModelForCausalLM builds (NULL: a type dtrain does
       not know) */
    const char *mt_arch = !mt ? NULL : !strcmp(mt, "llama") ? "LlamaForCausalLM"
                          : !strcmp(mt, "mistral") ? "MistralForCausalLM"
                          : !strcmp(mt, "qwen2") ? "Qwen2ForCausalLM" : !strcmp(mt, "qwen3") ? "Qwen3ForCausalLM"
                          : !strcmp(mt, "gemma") ? "GemmaForCausalLM" : !strcmp(mt, "gemma2") ? "Gemma2ForCausalLM"
                          : !strcmp(mt, "gemma3_text") ? "Gemma3ForCausalLM"
                          : !strcmp(mt, "gemma3") ? "Gemma3ForConditionalGeneration"
                          : !strcmp(mt, "phi3") ? "Phi3ForCausalLM"
                          : !strcmp(mt, "granite") ? "GraniteForCausalLM" : !strcmp(mt, "olmo2") ? "Olmo2ForCausalLM"
                          : !strcmp(mt, "smollm3") ? "SmolLM3ForCausalLM" : !strcmp(mt, "olmo3") ? "Olmo3ForCausalLM"
                          : !strcmp(mt, "ministral") ? "MinistralForCausalLM"
                          : !strcmp(mt, "mixtral") ? "MixtralForCausalLM"
                          : !strcmp(mt, "qwen3_moe") ? "Qwen3MoeForCausalLM"
                          : !strcmp(mt, "qwen2_moe") ? "Qwen2MoeForCausalLM" : !strcmp(mt, "olmoe") ? "OlmoeForCausalLM"
                          : !strcmp(mt, "gpt2") ? "GPT2LMHeadModel" : NULL;
    if (!arch && mt) /* no architectures: the model type's causal LM */
        arch = mt_arch ? mt_arch : mt;
    /* both given and naming two models: AutoModelForCausalLM builds the model type's, so building the
       architectures' class would load other numerics (a Qwen3 directory named LlamaForCausalLM lost its q/k
       norms without a word); a directory whose two keys disagree is refused, naming both */
    if (r.st >= 0 && arch && mt_arch && strcmp(arch, mt_arch) &&
        !(!strcmp(mt, "gemma3") && !strcmp(arch, "Gemma3ForCausalLM")))
        r.st = dt_error(DT_ERR_UNSUPPORTED, "%s: key \"architectures\" names %s, but key \"model_type\" is \"%s\", "
                        "whose model is %s (the class transformers' AutoModelForCausalLM builds): make the two "
                        "agree", path, arch, mt, mt_arch);
    if (r.st >= 0 && !arch)
        r.st = dt_error(DT_ERR_FORMAT, "%s: key \"architectures\" is missing (and no \"model_type\")", path);
    /* Gemma 3's image-text model: its language model (text_config; Gemma3TextConfig's defaults without one),
       whose weights its directory holds under language_model.model. (dt_ckpt_open's view) */
    const bool mm = r.st >= 0 && arch && !strcmp(arch, "Gemma3ForConditionalGeneration");
    const cJSON *tc = mm ? item(root, "text_config") : NULL;
    cJSON *none = mm && (!tc || cJSON_IsNull(tc)) ? cJSON_CreateObject() : NULL;
    char tpath[4300];
    snprintf(tpath, sizeof tpath, "%s (text_config)", path);
    cfg_reader tr = {.path = tpath, .root = none ? none : tc, .st = DT_OK};
    if (mm && !none && !cJSON_IsObject(tc))
        r.st = dt_error(DT_ERR_FORMAT, "%s: key \"text_config\" must be an object", path);
    else if (mm && !tr.root)
        r.st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    else if (mm) {
        snprintf(out->architecture, sizeof out->architecture, "Gemma3ForCausalLM"); /* what dtrain builds */
        read_llama(&tr, "Gemma3ForCausalLM", &out->llama);
        if (tr.st >= 0 && (st = dt_llama_config_check(&out->llama)) < 0)
            tr.st = dt_error_wrap(st, "%s", tpath);
        r.st = tr.st;
    } else if (r.st >= 0 && arch) {
        snprintf(out->architecture, sizeof out->architecture, "%s", arch);
        if (!strcmp(arch, "GPT2LMHeadModel")) {
            out->is_gpt2 = true;
            read_gpt2(&r, &out->gpt2);
            if (r.st >= 0 && (st = dt__gpt2_config_check(&out->gpt2)) < 0)
                r.st = dt_error_wrap(st, "%s", path);
        } else if (!strcmp(arch, "LlamaForCausalLM") || !strcmp(arch, "MistralForCausalLM") ||
                   !strcmp(arch, "Qwen2ForCausalLM") || !strcmp(arch, "Qwen3ForCausalLM") ||
                   !strcmp(arch, "GemmaForCausalLM") || !strcmp(arch, "Gemma2ForCausalLM") ||
                   !strcmp(arch, "Gemma3ForCausalLM") || !strcmp(arch, "Phi3ForCausalLM") ||
                   !strcmp(arch, "GraniteForCausalLM") || !strcmp(arch, "Olmo2ForCausalLM") ||
                   !strcmp(arch, "SmolLM3ForCausalLM") || !strcmp(arch, "Olmo3ForCausalLM") ||
                   !strcmp(arch, "MinistralForCausalLM") || !strcmp(arch, "MixtralForCausalLM") ||
                   !strcmp(arch, "Qwen3MoeForCausalLM") || !strcmp(arch, "Qwen2MoeForCausalLM") ||
                   !strcmp(arch, "OlmoeForCausalLM")) {
            read_llama(&r, arch, &out->llama);
            if (r.st >= 0 && (st = dt_llama_config_check(&out->llama)) < 0)
                r.st = dt_error_wrap(st, "%s", path);
        } else {
            r.st = dt_error(DT_ERR_UNSUPPORTED, "%s: key \"architectures\": '%s' is not supported (known: "
                            "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                            "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, "
                            "GraniteForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, SmolLM3ForCausalLM, "
                            "MinistralForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, "
                            "OlmoeForCausalLM, GPT2LMHeadModel; "
                            "Gemma3ForConditionalGeneration "
                            "as its language model)", path, arch);
        }
    }
    /* the special tokens, kept for the export (hf_save.c) as they are given (an image-text model's at its top
       level, else its text_config's) */
    int64_t bos[DT_HF_MAX_EOS];
    const cJSON *bo = mm && !item(root, "bos_token_id") ? tr.root : root;
    const cJSON *eo = mm && !item(root, "eos_token_id") ? tr.root : root;
    out->bos_token_id = get_tokens(&r, bo, "bos_token_id", bos, DT_HF_MAX_EOS) ? bos[0] : -1;
    out->n_eos = get_tokens(&r, eo, "eos_token_id", out->eos_token_ids, DT_HF_MAX_EOS);
    cJSON_Delete(none);
    cJSON_Delete(root);
    return r.st;
}
