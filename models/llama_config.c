/* Llama-family configurations (models.h): the named ones (llama-tiny,
 * llama-100m) with the zoo's size overrides, the checks of a configuration,
 * and the rotary inverse frequencies with their scaling (theta, linear,
 * llama3) as transformers computes them. The decoder built from a
 * configuration is llama.c's. */
#include "zoo.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    dt_llama_config c;
} named_config;

#define LLAMA_DEFAULTS                                                                                               \
    .rms_norm_eps = 1e-5f, .initializer_range = 0.02f, .rope_theta = 10000.0, .rope_type = DT_ROPE_DEFAULT,          \
    .rope_factor = 1.0

static const named_config g_configs[] = {
    {"llama-tiny", {.vocab_size = 512, .hidden_size = 64, .intermediate_size = 176, .num_hidden_layers = 2,
                    .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16,
                    .max_position_embeddings = 128, LLAMA_DEFAULTS}},
    {"llama-100m", {.vocab_size = 32000, .hidden_size = 768, .intermediate_size = 2048, .num_hidden_layers = 12,
                    .num_attention_heads = 12, .num_key_value_heads = 4, .head_dim = 64,
                    .max_position_embeddings = 1024, .tie_word_embeddings = true, LLAMA_DEFAULTS}},
};

dt_status dt_llama_config_by_name(const char *name, dt_llama_config *out)
{
    if (!name || !out)
        return dt_error(DT_ERR_NULL, "dt_llama_config_by_name: %s is NULL", name ? "out" : "name");
    for (size_t i = 0; i < sizeof g_configs / sizeof g_configs[0]; i++)
        if (!strcmp(name, g_configs[i].name)) {
            *out = g_configs[i].c;
            return DT_OK;
        }
    return dt_error(DT_ERR_NOT_FOUND, "unknown Llama configuration '%s' (known: llama-tiny, llama-100m)", name);
}

bool dt__model_is_llama(const char *name)
{
    for (size_t i = 0; name && i < sizeof g_configs / sizeof g_configs[0]; i++)
        if (!strcmp(name, g_configs[i].name))
            return true;
    return false;
}

dt_status dt__llama_config_for(const char *name, const dt_model_config *c, dt_llama_config *lc)
{
    dt_status st = dt_llama_config_by_name(name, lc);
    if (st < 0)
        return st;
    /* the zoo's GPT-style size overrides apply to the Llama sizes too */
    if (c->n_layer)
        lc->num_hidden_layers = c->n_layer;
    if (c->n_embd)
        lc->hidden_size = c->n_embd;
    if (c->n_head) {
        lc->num_attention_heads = c->n_head;
        if (lc->num_key_value_heads > c->n_head || c->n_head % lc->num_key_value_heads)
            lc->num_key_value_heads = c->n_head;
    }
    if (c->n_embd || c->n_head)
        lc->head_dim = lc->hidden_size / lc->num_attention_heads;
    if (c->block_size)
        lc->max_position_embeddings = c->block_size;
    if (c->vocab_size)
        lc->vocab_size = c->vocab_size;
    lc->attention_dropout = c->dropout; /* Llama's only dropout */
    return DT_OK;
}

dt_status dt_llama_config_check(const dt_llama_config *lc)
{
    if (!lc)
        return dt_error(DT_ERR_NULL, "dt_llama_config_check: config is NULL");
    const struct {
        const char *key;
        int64_t v;
    } sizes[] = {{"vocab_size", lc->vocab_size},
                 {"hidden_size", lc->hidden_size},
                 {"intermediate_size", lc->intermediate_size},
                 {"num_hidden_layers", lc->num_hidden_layers},
                 {"num_attention_heads", lc->num_attention_heads},
                 {"num_key_value_heads", lc->num_key_value_heads},
                 {"head_dim", lc->head_dim},
                 {"max_position_embeddings", lc->max_position_embeddings}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v < 1 || sizes[i].v > (1ll << 31))
            return dt_error(DT_ERR_INVALID_ARG, "llama: %s %lld is outside [1, 2^31]", sizes[i].key,
                            (long long)sizes[i].v);
    if (lc->num_attention_heads % lc->num_key_value_heads)
        return dt_error(DT_ERR_INVALID_ARG, "llama: num_key_value_heads %lld does not divide num_attention_heads %lld",
                        (long long)lc->num_key_value_heads, (long long)lc->num_attention_heads);
    if (lc->head_dim % 2 || lc->head_dim > 256)
        return dt_error(DT_ERR_UNSUPPORTED, "llama: head_dim %lld must be even and at most 256 (the attention "
                        "kernel's limit)", (long long)lc->head_dim);
    if (!(lc->rms_norm_eps > 0.0f) || !(lc->rope_theta > 0.0) || !(lc->initializer_range >= 0.0f))
        return dt_error(DT_ERR_INVALID_ARG, "llama: rms_norm_eps %g and rope_theta %g must be > 0, initializer_range "
                        "%g >= 0", (double)lc->rms_norm_eps, lc->rope_theta, (double)lc->initializer_range);
    if ((unsigned)lc->rope_type >= DT_ROPE_KIND_COUNT)
        return dt_error(DT_ERR_UNSUPPORTED, "llama: rope_scaling type %d is unknown", (int)lc->rope_type);
    if (lc->rope_type != DT_ROPE_DEFAULT && !(lc->rope_factor > 0.0))
        return dt_error(DT_ERR_INVALID_ARG, "llama: rope_scaling.factor %g must be > 0", lc->rope_factor);
    if (lc->rope_type == DT_ROPE_LLAMA3 &&
        (!(lc->rope_low_freq_factor > 0.0) || !(lc->rope_high_freq_factor > lc->rope_low_freq_factor) ||
         lc->rope_original_max_position_embeddings < 1))
        return dt_error(DT_ERR_INVALID_ARG, "llama: rope_scaling llama3 needs low_freq_factor > 0, high_freq_factor > "
                        "low_freq_factor and original_max_position_embeddings >= 1 (got %g, %g, %lld)",
                        lc->rope_low_freq_factor, lc->rope_high_freq_factor,
                        (long long)lc->rope_original_max_position_embeddings);
    const struct {
        const char *key;
        double v;
    } mult[] = {{"embedding_multiplier", lc->embedding_multiplier},
                {"residual_multiplier", lc->residual_multiplier},
                {"attention_multiplier", lc->attention_multiplier},
                {"logits_scaling", lc->logits_scaling},
                {"query_pre_attn_scalar", lc->query_pre_attn_scalar},
                {"attn_logit_softcapping", lc->attn_logit_softcapping},
                {"final_logit_softcapping", lc->final_logit_softcapping},
                {"rope_local_base_freq", lc->rope_local_theta}};
    for (size_t i = 0; i < sizeof mult / sizeof mult[0]; i++)
        if (!(mult[i].v >= 0.0) || !isfinite(mult[i].v))
            return dt_error(DT_ERR_INVALID_ARG, "llama: %s %g must be a finite number > 0 (0: none)", mult[i].key,
                            mult[i].v);
    if (!(lc->attention_dropout >= 0.0 && lc->attention_dropout < 1.0))
        return dt_error(DT_ERR_INVALID_ARG, "llama: attention_dropout %g is outside [0, 1)", lc->attention_dropout);
    if (lc->gemma2 && !lc->gemma)
        return dt_error(DT_ERR_INVALID_ARG, "llama: gemma2 needs gemma (Gemma 2 has Gemma's norms, embedding scale "
                        "and MLP)");
    if ((lc->sliding_window > 0 || lc->rope_local_theta > 0.0) && lc->num_hidden_layers > DT_LLAMA_MAX_LAYERS)
        return dt_error(DT_ERR_UNSUPPORTED, "llama: %lld layers with a sliding window or a local RoPE base (at most "
                        "%d)", (long long)lc->num_hidden_layers, DT_LLAMA_MAX_LAYERS);
    for (int i = 0; i < DT_LLAMA_MAX_LAYERS; i++)
        if (lc->nope_layers[i] > 1 || (lc->nope_layers[i] && i >= lc->num_hidden_layers))
            return dt_error(DT_ERR_INVALID_ARG, "llama: nope_layers[%d] is %d: want 0 or 1, and 0 past the %lld "
                            "layers", i, lc->nope_layers[i], (long long)lc->num_hidden_layers);
    if (lc->num_experts < 0 || lc->num_experts > (1 << 16))
        return dt_error(DT_ERR_INVALID_ARG, "llama: num_experts %lld is outside [0, 65536]",
                        (long long)lc->num_experts);
    if (lc->num_experts > 0) {
        if (lc->num_experts_per_tok < 1 || lc->num_experts_per_tok > lc->num_experts)
            return dt_error(DT_ERR_INVALID_ARG, "llama: num_experts_per_tok %lld is outside [1, num_experts %lld]",
                            (long long)lc->num_experts_per_tok, (long long)lc->num_experts);
        if (lc->moe_intermediate_size < 1 || lc->moe_intermediate_size > (1ll << 31))
            return dt_error(DT_ERR_INVALID_ARG, "llama: moe_intermediate_size %lld is outside [1, 2^31]",
                            (long long)lc->moe_intermediate_size);
        if (lc->num_hidden_layers > DT_LLAMA_MAX_LAYERS)
            return dt_error(DT_ERR_UNSUPPORTED, "llama: %lld layers with experts (at most %d)",
                            (long long)lc->num_hidden_layers, DT_LLAMA_MAX_LAYERS);
        if (lc->shared_expert_intermediate_size < 0 || lc->shared_expert_intermediate_size > (1ll << 31))
            return dt_error(DT_ERR_INVALID_ARG, "llama: shared_expert_intermediate_size %lld is outside [0, 2^31]",
                            (long long)lc->shared_expert_intermediate_size);
        if (lc->fused || lc->gemma || lc->olmo2)
            return dt_error(DT_ERR_UNSUPPORTED, "llama: experts in a Phi-3, Gemma or OLMo 2 block are not "
                            "supported");
    }
    const int64_t rot = lc->rotary_dim ? lc->rotary_dim : lc->head_dim;
    if (rot < 2 || rot % 2 || rot > lc->head_dim)
        return dt_error(DT_ERR_INVALID_ARG, "llama: the rotary width %lld (head_dim times partial_rotary_factor) is "
                        "not an even number in [2, head_dim %lld]", (long long)rot, (long long)lc->head_dim);
    if (lc->rope_type == DT_ROPE_YARN &&
        (lc->rope_original_max_position_embeddings < 1 || !(lc->rope_attention_factor > 0.0) ||
         !isfinite(lc->rope_attention_factor) || !(lc->rope_beta_fast > 0.0) || !(lc->rope_beta_slow > 0.0) ||
         !isfinite(lc->rope_beta_fast) || !isfinite(lc->rope_beta_slow)))
        return dt_error(DT_ERR_INVALID_ARG, "llama: rope_scaling yarn needs original_max_position_embeddings >= 1, "
                        "beta_fast and beta_slow > 0 and an attention factor > 0 (got %lld, %g, %g, %g)",
                        (long long)lc->rope_original_max_position_embeddings, lc->rope_beta_fast,
                        lc->rope_beta_slow, lc->rope_attention_factor);
    if (lc->rope_type == DT_ROPE_LONGROPE) {
        if (lc->rope_original_max_position_embeddings < 1 || !(lc->rope_attention_factor > 0.0) ||
            !isfinite(lc->rope_attention_factor))
            return dt_error(DT_ERR_INVALID_ARG, "llama: rope_scaling longrope needs original_max_position_embeddings "
                            ">= 1 and an attention factor > 0 (got %lld, %g)",
                            (long long)lc->rope_original_max_position_embeddings, lc->rope_attention_factor);
        for (int64_t i = 0; i < rot / 2; i++)
            if (!(lc->rope_short_factor[i] > 0.0f) || !(lc->rope_long_factor[i] > 0.0f) ||
                !isfinite(lc->rope_short_factor[i]) || !isfinite(lc->rope_long_factor[i]))
                return dt_error(DT_ERR_INVALID_ARG, "llama: rope_scaling longrope's short_factor and long_factor "
                                "must be positive finite numbers (entry %lld: %g, %g)", (long long)i,
                                (double)lc->rope_short_factor[i], (double)lc->rope_long_factor[i]);
    }
    return DT_OK;
}

/* YaRN's correction range [lo, hi] over the d / 2 frequencies: the
 * dimensions where beta_fast and beta_slow rotations fit the original
 * positions, in double as Python computes them (hi nudged past lo when they
 * meet, as transformers does). */
static void yarn_range(const dt_llama_config *lc, int64_t d, double *lo, double *hi)
{
    const double orig = (double)lc->rope_original_max_position_embeddings, lb = 2.0 * log(lc->rope_theta);
    double l = ((double)d * log(orig / (lc->rope_beta_fast * 2.0 * M_PI))) / lb;
    double h = ((double)d * log(orig / (lc->rope_beta_slow * 2.0 * M_PI))) / lb;
    if (lc->rope_truncate)
        l = floor(l), h = ceil(h);
    l = l > 0.0 ? l : 0.0;
    h = h < (double)(d - 1) ? h : (double)(d - 1);
    if (l == h)
        h += 0.001;
    *lo = l, *hi = h;
}

dt_status dt_llama_inv_freq(const dt_llama_config *lc, int64_t seq_len, float *out)
{
    if (!lc || !out)
        return dt_error(DT_ERR_NULL, "dt_llama_inv_freq: %s is NULL", lc ? "out" : "config");
    const int64_t d = lc->rotary_dim ? lc->rotary_dim : lc->head_dim, half = d / 2;
    const float base = (float)lc->rope_theta, factor = (float)lc->rope_factor;
    const bool longf = seq_len > lc->rope_original_max_position_embeddings;
    for (int64_t i = 0; i < half; i++) {
        /* 1 / (base ** (arange(0, d, 2).float() / d)), all f32 */
        float inv = 1.0f / powf(base, (float)(2 * i) / (float)d);
        if (lc->rope_type == DT_ROPE_LONGROPE) { /* 1 / (ext_factors * base ** (...)), f32 */
            const float ext = longf ? lc->rope_long_factor[i] : lc->rope_short_factor[i];
            inv = 1.0f / (ext * powf(base, (float)(2 * i) / (float)d));
        } else if (lc->rope_type == DT_ROPE_YARN) { /* transformers' _compute_yarn_parameters */
            double lo, hi;
            yarn_range(lc, d, &lo, &hi);
            const float pos = powf(base, (float)(2 * i) / (float)d), extra = 1.0f / pos, inter = 1.0f / (factor * pos);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float ef = 1.0f - ramp; /* extrapolation's share */
            inv = inter * (1.0f - ef) + extra * ef;
        } else if (lc->rope_type == DT_ROPE_LINEAR) {
            inv = inv / factor;
        } else if (lc->rope_type == DT_ROPE_LLAMA3) {
            const float orig = (float)lc->rope_original_max_position_embeddings;
            const float lo = (float)lc->rope_low_freq_factor, hi = (float)lc->rope_high_freq_factor;
            const float lo_wl = orig / lo, hi_wl = orig / hi;
            const float wl = (float)(2.0 * M_PI) / inv;
            if (wl > lo_wl) {
                inv = inv / factor;
            } else if (!(wl < hi_wl)) { /* hi_wl <= wl <= lo_wl: the smooth ramp */
                const float s = (orig / wl - lo) / (hi - lo);
                inv = (1.0f - s) * inv / factor + s * inv;
            }
        }
        out[i] = inv;
    }
    return DT_OK;
}
