/* Hugging Face model directories out: dt_hf_save writes what
 * transformers' save_pretrained writes (config.json,
 * generation_config.json, model.safetensors or, above the shard size, the
 * shards model-0000i-of-0000n.safetensors with model.safetensors.index.json)
 * from any checkpoint dtrain reads (a dtrain checkpoint of any strategy, a
 * safetensors file, a model directory), so AutoModelForCausalLM.from_pretrained
 * loads it with no missing or unexpected keys.
 *
 * The tensors are the model's parameters in model order, each read whole
 * (its fp32 master when the checkpoint has one), converted to the output
 * dtype; a tied head is left out, as safetensors' shared-tensor rule makes
 * transformers do. Sharding is huggingface_hub's: greedy in that order, a
 * new shard when the next tensor would pass the size. Everything is written
 * into a fresh temporary directory beside OUT, then renamed to OUT: the
 * directory appears complete or not at all. With a tokenizer, its
 * tokenizer.json is copied byte for byte and tokenizer_config.json and
 * special_tokens_map.json are written beside it (dt_tokenizer_hf_files).
 *
 * OUT belongs to one writer at a time: dt_hf_save_lock_open makes it (an
 * empty directory) and holds it (dt_dir_lock: flock), so that a second job
 * given the same OUT is refused at its start rather than after its
 * training; dt_hf_save takes the lock itself when its caller holds none.
 * The kernel drops the lock when the process dies. A rename that fails at
 * the very end (OUT filled meanwhile by a writer that took no lock) keeps
 * the complete temporary directory and names it: nothing written is lost. */
#include "zoo.h"

#include <dtrain/ckpt.h>
#include <dtrain/generate.h>
#include <dtrain/kernels.h>
#include <dtrain/tokenizer.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The temporary directory's path, and room for it plus a file name in it. */
enum { TMP_PATH = 4200, FILE_PATH = TMP_PATH + 64 };

dt_hf_save_params dt_hf_save_params_default(void)
{
    dt_hf_save_params p = {.max_shard_bytes = 5000000000ull, .dtype = DT_F32, .lora_scaling = 0.0f, .lora = NULL};
    return p;
}

struct dt_hf_save_lock {
    dt_dir_hold *hold;
};

dt_status dt_hf_save_lock_open(const char *out, dt_hf_save_lock **lock)
{
    if (!out || !lock)
        return dt_error(DT_ERR_NULL, "dt_hf_save_lock_open: NULL argument");
    *lock = NULL;
    char name[TMP_PATH - 16];
    dt_status st = dt_path_trim_slashes(out, name, sizeof name);
    if (st < 0 || (st = dt_hf_save_check_out(name)) < 0)
        return st;
    dt_hf_save_lock *l = calloc(1, sizeof *l);
    if (!l)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", out);
    if ((st = dt_dir_hold_open(name, &l->hold)) < 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", dt_last_error());
        st = dt_error(st, "the output directory %s%s", why,
                      st == DT_ERR_STATE ? "; give each job its own output directory" : "");
        goto fail;
    }
    /* filled or replaced between the check and the lock: another writer was first */
    if (!dt_dir_hold_same(l->hold) || (st = dt_hf_save_check_out(name)) < 0) {
        if (st >= 0)
            st = dt_error(DT_ERR_STATE, "the output directory %s was replaced while it was being locked; another "
                          "job writes there: give each job its own output directory", out);
        goto fail;
    }
    *lock = l;
    return DT_OK;
fail:
    dt_hf_save_lock_close(l);
    return st;
}

void dt_hf_save_lock_close(dt_hf_save_lock *l)
{
    if (!l)
        return;
    /* a directory this lock made (and parents) that nothing filled: removed (a run that failed before its save
       leaves no trace), while the name still leads to it: never another job's, nor the saved one renamed over it */
    dt_dir_hold_close(l->hold, true);
    free(l);
}

dt_status dt_model_hf_config(const char *name, const dt_model_config *c, dt_hf_config *out)
{
    if (!name || !out)
        return dt_error(DT_ERR_NULL, "dt_model_hf_config: %s is NULL", name ? "out" : "name");
    memset(out, 0, sizeof *out);
    dt_model_config mc = c ? *c : dt_model_config_default();
    if (!strncmp(name, "hf:", 3))
        return dt_hf_config_read(name + 3, out);
    out->bos_token_id = -1;
    if (dt__model_is_llama(name)) {
        snprintf(out->architecture, sizeof out->architecture, "LlamaForCausalLM");
        return dt__llama_config_for(name, &mc, &out->llama);
    }
    dt_status st = dt_gpt2_config_by_name(name, &out->gpt2);
    if (st < 0)
        return dt_error(DT_ERR_UNSUPPORTED, "model '%s' has no Hugging Face form (GPT-2, Llama and hf:DIR models "
                        "have)", name);
    dt_gpt2_config *g = &out->gpt2;
    if (mc.n_layer)
        g->n_layer = mc.n_layer;
    if (mc.n_head)
        g->n_head = mc.n_head;
    if (mc.n_embd)
        g->n_embd = mc.n_embd;
    if (mc.block_size)
        g->block_size = mc.block_size;
    if (mc.vocab_size)
        g->vocab_size = mc.vocab_size;
    g->dropout = mc.dropout;
    if (g->vocab_size == 50257) /* GPT-2's own vocabulary: <|endoftext|> */
        out->bos_token_id = out->eos_token_ids[0] = 50256, out->n_eos = 1;
    out->is_gpt2 = true;
    snprintf(out->architecture, sizeof out->architecture, "GPT2LMHeadModel");
    return DT_OK;
}

/* A float config value as the double whose shortest decimal form gives the
 * float back (1e-05, not 9.99999974737875e-06). */
/* A float-typed key (transformers' strict config dataclasses refuse an
 * integer there: Gemma2Config's soft caps): an integral value written with
 * its ".0", others as cJSON writes them (the shortest that reads back). */
static void add_float(cJSON *o, const char *key, double v)
{
    char b[64];
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(b, sizeof b, "%.1f", v);
        cJSON_AddRawToObject(o, key, b);
    } else {
        cJSON_AddNumberToObject(o, key, v);
    }
}

static double fnum(float f)
{
    char b[48];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof b, "%.*g", p, (double)f);
        double v = strtod(b, NULL);
        if ((float)v == f)
            return v;
    }
    return (double)f;
}

static const char *torch_dtype(dt_dtype t)
{
    return t == DT_BF16 ? "bfloat16" : t == DT_F16 ? "float16" : "float32";
}

/* key: null (n 0), the id (n 1) or the list of n ids. */
static void add_tokens(cJSON *o, const char *key, const int64_t *ids, int n)
{
    if (n == 1) {
        cJSON_AddNumberToObject(o, key, (double)ids[0]);
    } else if (n > 1) {
        cJSON *a = cJSON_AddArrayToObject(o, key);
        for (int i = 0; a && i < n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ids[i]));
    } else {
        cJSON_AddNullToObject(o, key);
    }
}

/* dir/generation_config.json's text into *text, *len bytes (NULL when dir has none),
 * after dt_hf_generation_config has read it. */
static dt_status read_generation(const char *dir, char **text, size_t *len)
{
    char path[4200], blob[PATH_MAX];
    struct stat sb;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    *text = NULL;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? DT_OK : dt_error(DT_ERR_IO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode) && !dt_file_hf_cache_link(path, blob, sizeof blob))
        return dt_error(DT_ERR_FORMAT, "%s: not a regular file (symlinks are not followed)", path);
    dt_generate_params g = dt_generate_params_default();
    dt_status st = dt_hf_generation_config(dir, &g, NULL, 0);
    return st < 0 ? st : dt_file_read_all(path, 16u << 20, text, len);
}

/* config.json and generation_config.json as text (cJSON_Print; free both). */
static dt_status config_json(const dt_hf_config *h, dt_dtype dt, char **cfg, char **gen)
{
    cJSON *o = cJSON_CreateObject(), *g = cJSON_CreateObject();
    cJSON *ar = cJSON_CreateArray();
    if (!o || !g || !ar) {
        cJSON_Delete(o);
        cJSON_Delete(g);
        cJSON_Delete(ar);
        return dt_error(DT_ERR_NO_MEMORY, "config.json: out of memory");
    }
    cJSON_AddItemToArray(ar, cJSON_CreateString(h->architecture));
    cJSON_AddItemToObject(o, "architectures", ar);
    if (h->is_gpt2) {
        const dt_gpt2_config *c = &h->gpt2;
        cJSON_AddStringToObject(o, "model_type", "gpt2");
        cJSON_AddStringToObject(o, "activation_function", "gelu_new");
        cJSON_AddNumberToObject(o, "n_embd", (double)c->n_embd);
        cJSON_AddNumberToObject(o, "n_layer", (double)c->n_layer);
        cJSON_AddNumberToObject(o, "n_head", (double)c->n_head);
        cJSON_AddNumberToObject(o, "n_positions", (double)c->block_size);
        cJSON_AddNumberToObject(o, "n_ctx", (double)c->block_size);
        cJSON_AddNullToObject(o, "n_inner");
        cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
        cJSON_AddNumberToObject(o, "layer_norm_epsilon", 1e-5);
        cJSON_AddNumberToObject(o, "initializer_range", 0.02);
        cJSON_AddNumberToObject(o, "embd_pdrop", fnum(c->dropout));
        cJSON_AddNumberToObject(o, "resid_pdrop", fnum(c->dropout));
        cJSON_AddNumberToObject(o, "attn_pdrop", fnum(c->dropout));
        cJSON_AddBoolToObject(o, "tie_word_embeddings", 1);
    } else {
        const dt_llama_config *c = &h->llama;
        const char *mt = !strcmp(h->architecture, "MistralForCausalLM") ? "mistral"
                       : !strcmp(h->architecture, "Qwen2ForCausalLM") ? "qwen2"
                       : !strcmp(h->architecture, "Qwen3ForCausalLM") ? "qwen3"
                       : !strcmp(h->architecture, "GemmaForCausalLM") ? "gemma"
                       : !strcmp(h->architecture, "Gemma2ForCausalLM") ? "gemma2"
                       : !strcmp(h->architecture, "Gemma3ForCausalLM") ? "gemma3_text"
                       : !strcmp(h->architecture, "Phi3ForCausalLM") ? "phi3"
                       : !strcmp(h->architecture, "GraniteForCausalLM") ? "granite"
                       : !strcmp(h->architecture, "Olmo2ForCausalLM") ? "olmo2"
                       : !strcmp(h->architecture, "Olmo3ForCausalLM") ? "olmo3"
                       : !strcmp(h->architecture, "SmolLM3ForCausalLM") ? "smollm3"
                       : !strcmp(h->architecture, "MinistralForCausalLM") ? "ministral"
                       : !strcmp(h->architecture, "MixtralForCausalLM") ? "mixtral"
                       : !strcmp(h->architecture, "Qwen3MoeForCausalLM") ? "qwen3_moe"
                       : !strcmp(h->architecture, "Qwen2MoeForCausalLM") ? "qwen2_moe"
                       : !strcmp(h->architecture, "OlmoeForCausalLM") ? "olmoe" : "llama";
        const bool gemma3 = !strcmp(mt, "gemma3_text"), gemma2 = !strcmp(mt, "gemma2") || gemma3;
        const bool gemma = !strcmp(mt, "gemma") || gemma2;
        const bool olmo3 = !strcmp(mt, "olmo3"), olmo2 = !strcmp(mt, "olmo2") || olmo3;
        const bool phi3 = !strcmp(mt, "phi3"), granite = !strcmp(mt, "granite");
        const bool smollm3 = !strcmp(mt, "smollm3"), ministral = !strcmp(mt, "ministral");
        const bool mixtral = !strcmp(mt, "mixtral"), qwen2moe = !strcmp(mt, "qwen2_moe");
        const bool qwen3moe = !strcmp(mt, "qwen3_moe") || qwen2moe; /* the keys of Qwen's experts */
        const bool olmoe = !strcmp(mt, "olmoe");
        cJSON_AddStringToObject(o, "model_type", mt);
        cJSON_AddNumberToObject(o, "vocab_size", (double)c->vocab_size);
        cJSON_AddNumberToObject(o, "hidden_size", (double)c->hidden_size);
        cJSON_AddNumberToObject(o, "intermediate_size", (double)c->intermediate_size);
        cJSON_AddNumberToObject(o, "num_hidden_layers", (double)c->num_hidden_layers);
        cJSON_AddNumberToObject(o, "num_attention_heads", (double)c->num_attention_heads);
        cJSON_AddNumberToObject(o, "num_key_value_heads", (double)c->num_key_value_heads);
        cJSON_AddNumberToObject(o, "head_dim", (double)c->head_dim);
        cJSON_AddStringToObject(o, "hidden_act", gemma ? "gelu_pytorch_tanh" : "silu");
        if (gemma2) /* Gemma2Config and Gemma3TextConfig read this one */
            cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh");
        cJSON_AddNumberToObject(o, "max_position_embeddings", (double)c->max_position_embeddings);
        cJSON_AddNumberToObject(o, "initializer_range", fnum(c->initializer_range));
        cJSON_AddNumberToObject(o, "rms_norm_eps", fnum(c->rms_norm_eps));
        /* OLMo 3: rope_parameters, one object a layer kind (Olmo3Config gives a legacy rope_theta to the full
           layers only); the others the legacy keys */
        cJSON *rp = olmo3 ? cJSON_AddObjectToObject(o, "rope_parameters") : NULL;
        cJSON *rfull = rp ? cJSON_AddObjectToObject(rp, "full_attention") : NULL;
        cJSON *rslide = rp ? cJSON_AddObjectToObject(rp, "sliding_attention") : NULL;
        cJSON_AddNumberToObject(rfull ? rfull : o, "rope_theta", c->rope_theta);
        if (gemma3) /* the sliding layers' base (Gemma3TextConfig reads the legacy key into rope_parameters) */
            cJSON_AddNumberToObject(o, "rope_local_base_freq", c->rope_local_theta > 0.0 ? c->rope_local_theta
                                                                                         : c->rope_theta);
        if (rslide) {
            cJSON_AddStringToObject(rslide, "rope_type", "default");
            cJSON_AddNumberToObject(rslide, "rope_theta", c->rope_local_theta > 0.0 ? c->rope_local_theta
                                                                                     : c->rope_theta);
        }
        if (c->rope_type == DT_ROPE_DEFAULT) {
            if (rfull)
                cJSON_AddStringToObject(rfull, "rope_type", "default");
            else
                cJSON_AddNullToObject(o, "rope_scaling");
        } else {
            cJSON *rs = rfull ? rfull : cJSON_AddObjectToObject(o, "rope_scaling");
            if (rs && c->rope_type == DT_ROPE_LONGROPE) { /* the factors as their f32 values read back; the resolved attention factor */
                const int64_t half = (c->rotary_dim ? c->rotary_dim : c->head_dim) / 2;
                cJSON_AddStringToObject(rs, "rope_type", "longrope");
                cJSON *sf = cJSON_AddArrayToObject(rs, "short_factor"), *lf = cJSON_AddArrayToObject(rs, "long_factor");
                for (int64_t i = 0; sf && lf && i < half; i++) {
                    cJSON_AddItemToArray(sf, cJSON_CreateNumber(fnum(c->rope_short_factor[i])));
                    cJSON_AddItemToArray(lf, cJSON_CreateNumber(fnum(c->rope_long_factor[i])));
                }
                cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attention_factor);
            } else if (rs && c->rope_type == DT_ROPE_YARN) {
                cJSON_AddStringToObject(rs, "rope_type", "yarn");
                cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
                cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                        (double)c->rope_original_max_position_embeddings);
                cJSON_AddNumberToObject(rs, "beta_fast", c->rope_beta_fast);
                cJSON_AddNumberToObject(rs, "beta_slow", c->rope_beta_slow);
                cJSON_AddBoolToObject(rs, "truncate", c->rope_truncate);
                cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attention_factor);
            } else if (rs) {
                cJSON_AddStringToObject(rs, "rope_type", c->rope_type == DT_ROPE_LINEAR ? "linear" : "llama3");
                cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
                if (c->rope_type == DT_ROPE_LLAMA3) {
                    cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
                    cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
                    cJSON_AddNumberToObject(rs, "original_max_position_embeddings",
                                            (double)c->rope_original_max_position_embeddings);
                }
            }
        }
        if (strcmp(mt, "qwen2") && !phi3 && !mixtral && !qwen2moe)
            cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias);
        if (qwen2moe) /* Qwen2MoeConfig's: q, k and v only */
            cJSON_AddBoolToObject(o, "qkv_bias", c->attention_bias);
        if (strcmp(mt, "qwen2") && strcmp(mt, "qwen3") && !gemma && !phi3 && !olmo2 && !mixtral && !qwen3moe && !olmoe)
            cJSON_AddBoolToObject(o, "mlp_bias", c->mlp_bias);
        if (mixtral || qwen3moe || olmoe) { /* the configs' experts (no auxiliary loss: hf_config.c) */
            cJSON_AddNumberToObject(o, mixtral ? "num_local_experts" : "num_experts", (double)c->num_experts);
            cJSON_AddNumberToObject(o, "num_experts_per_tok", (double)c->num_experts_per_tok);
            cJSON_AddBoolToObject(o, "output_router_logits", 0);
            add_float(o, "router_aux_loss_coef", olmoe ? 0.01 : 0.001); /* (floats: MixtralConfig refuses an int 0) */
            if (mixtral)
                add_float(o, "router_jitter_noise", 0.0);
            if (olmoe) {
                cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
                cJSON_AddNullToObject(o, "clip_qkv");
            }
        }
        if (qwen3moe) { /* the dense layers named one by one (decoder_sparse_step 1) */
            cJSON_AddNumberToObject(o, "moe_intermediate_size", (double)c->moe_intermediate_size);
            if (qwen2moe)
                cJSON_AddNumberToObject(o, "shared_expert_intermediate_size",
                                        (double)c->shared_expert_intermediate_size);
            cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
            cJSON_AddNumberToObject(o, "decoder_sparse_step", 1);
            cJSON *ml = cJSON_AddArrayToObject(o, "mlp_only_layers");
            for (int64_t i = 0; ml && i < c->num_hidden_layers && i < DT_LLAMA_MAX_LAYERS; i++)
                if (c->dense_layers[i])
                    cJSON_AddItemToArray(ml, cJSON_CreateNumber((double)i));
        }
        if (phi3) { /* Phi3Config's keys (its dropouts: none in dtrain) */
            cJSON_AddNumberToObject(o, "resid_pdrop", 0.0);
            cJSON_AddNumberToObject(o, "embd_pdrop", 0.0);
            cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                                    (double)(c->rope_type == DT_ROPE_LONGROPE ? c->rope_original_max_position_embeddings
                                                                              : c->max_position_embeddings));
            if (c->rotary_dim) { /* the factor whose int(head_dim * factor) is rotary_dim again */
                double f = (double)c->rotary_dim / (double)c->head_dim;
                while ((int64_t)((double)c->head_dim * f) < c->rotary_dim)
                    f = nextafter(f, 2.0);
                cJSON_AddNumberToObject(o, "partial_rotary_factor", f);
            }
        }
        /* layers of two kinds */
        const bool kinds = !strcmp(mt, "qwen2") || !strcmp(mt, "qwen3") || gemma2 || smollm3 || olmo3 || ministral;
        if (!strcmp(mt, "qwen2") || !strcmp(mt, "qwen3") || smollm3 || qwen3moe)
            cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0);
        if (c->sliding_window > 0)
            cJSON_AddNumberToObject(o, "sliding_window", (double)c->sliding_window);
        else if (!strcmp(mt, "mistral") || phi3 || gemma2 || smollm3 || olmo3 || ministral || mixtral || qwen3moe)
            cJSON_AddNullToObject(o, "sliding_window");
        cJSON *nr = smollm3 ? cJSON_AddArrayToObject(o, "no_rope_layers") : NULL; /* 1: RoPE, 0: NoPE */
        for (int64_t i = 0; nr && i < c->num_hidden_layers; i++)
            cJSON_AddItemToArray(nr, cJSON_CreateNumber(i < DT_LLAMA_MAX_LAYERS && c->nope_layers[i] ? 0 : 1));
        /* Gemma 3's and OLMo 3's kinds also choose each layer's RoPE base, with a window or without */
        cJSON *lt = kinds && (c->sliding_window > 0 || gemma3 || olmo3) ? cJSON_AddArrayToObject(o, "layer_types")
                                                                           : NULL;
        for (int64_t i = 0; lt && i < c->num_hidden_layers && i < DT_LLAMA_MAX_LAYERS; i++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(c->full_attention_layers[i] ? "full_attention"
                                                                                    : "sliding_attention"));
        if (gemma2) { /* 0: none, null */
            cJSON_AddNumberToObject(o, "query_pre_attn_scalar",
                                    c->query_pre_attn_scalar > 0.0 ? c->query_pre_attn_scalar : (double)c->head_dim);
            const char *key[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
            const double v[2] = {c->attn_logit_softcapping, c->final_logit_softcapping};
            for (int k = 0; k < 2; k++)
                if (v[k] > 0.0)
                    add_float(o, key[k], v[k]);
                else
                    cJSON_AddNullToObject(o, key[k]);
        }
        add_float(o, "attention_dropout", fnum((float)c->attention_dropout)); /* the model's p is a float */
        if (!gemma && !phi3 && !granite && !olmo2 && !smollm3 && !mixtral && !qwen3moe && !olmoe)
            cJSON_AddNumberToObject(o, "pretraining_tp", 1);
        if (granite) { /* 0: none, GraniteConfig's 1 */
            cJSON_AddNumberToObject(o, "embedding_multiplier", c->embedding_multiplier ? c->embedding_multiplier : 1);
            cJSON_AddNumberToObject(o, "residual_multiplier", c->residual_multiplier ? c->residual_multiplier : 1);
            cJSON_AddNumberToObject(o, "attention_multiplier", c->attention_multiplier);
            cJSON_AddNumberToObject(o, "logits_scaling", c->logits_scaling ? c->logits_scaling : 1);
        }
        cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
        if (c->has_pad_token)
            cJSON_AddNumberToObject(o, "pad_token_id", (double)c->pad_token_id);
        else if (gemma || phi3 || olmo2 || smollm3 || olmoe) /* Gemma(2)Config's default is 0, Phi3Config's 32000,
                                                                 Olmo2Config's, Olmo3Config's and OlmoeConfig's 1,
                                                                 SmolLM3Config's 128004 */
            cJSON_AddNullToObject(o, "pad_token_id");
    }
    add_tokens(o, "bos_token_id", &h->bos_token_id, h->bos_token_id >= 0);
    add_tokens(o, "eos_token_id", h->eos_token_ids, h->n_eos);
    cJSON_AddStringToObject(o, "torch_dtype", torch_dtype(dt));
    cJSON_AddBoolToObject(o, "use_cache", 1);
    add_tokens(g, "bos_token_id", &h->bos_token_id, h->bos_token_id >= 0);
    add_tokens(g, "eos_token_id", h->eos_token_ids, h->n_eos);
    cJSON_AddBoolToObject(g, "_from_model_config", 1);
    *cfg = cJSON_Print(o);
    *gen = cJSON_Print(g);
    cJSON_Delete(o);
    cJSON_Delete(g);
    if (!*cfg || !*gen) {
        cJSON_free(*cfg);
        cJSON_free(*gen);
        *cfg = *gen = NULL;
        return dt_error(DT_ERR_NO_MEMORY, "config.json: out of memory");
    }
    return DT_OK;
}

typedef struct item {
    const char *name;  /* the model's entry name (borrowed from the model) */
    int64_t src;       /* the checkpoint tensor it is read from */
    size_t numel;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    int shard;
    int64_t lora_a, lora_b; /* LoRA adapters merged into it (checkpoint tensors), else -1 */
    int64_t lora_m;         /* and DoRA's magnitudes, else -1 */
    int64_t r;              /* their rank */
    float scaling;          /* their scaling (the layer's own: dt_hf_save_params.lora) */
    bool fan_in_fan_out;    /* a Conv1D ([in, out]): the update is transposed */
} item;

/* Read tensor src of ck whole into f32 at dst (n elements). */
static dt_status read_f32(dt_ckpt *ck, int64_t src, float *dst, size_t n, void *tmp)
{
    dt_ckpt_tensor t;
    dt_status st = dt_ckpt_tensor_at(ck, (size_t)src, &t);
    dt_dtype sd;
    if (st >= 0 && (st = dt_st_dtype_to(t.dtype, &sd)) >= 0 && sd != DT_F32 && sd != DT_BF16 && sd != DT_F16)
        st = dt_error(DT_ERR_DTYPE, "tensor '%s' is %s, not a float dtype", t.name, dt_st_dtype_name(t.dtype));
    if (st >= 0)
        st = dt_ckpt_read(ck, (size_t)src, 0, n, sd == DT_F32 ? (void *)dst : tmp, true);
    if (st >= 0 && sd != DT_F32)
        st = dt_k_convert(tmp, sd, dst, DT_F32, (int64_t)n);
    return st;
}

static dt_status write_text(const char *dir, const char *name, const char *text)
{
    char p[FILE_PATH];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t n = strlen(text);
    char *t = malloc(n + 2);
    if (!t)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", p);
    memcpy(t, text, n);
    t[n] = '\n';
    dt_status st = dt_file_write_atomic(p, t, n + 1, 0644);
    free(t);
    return st;
}

/* rmdir tmp after unlinking the names we may have written in it. */
static void remove_tmp(const char *tmp, int nshard)
{
    char p[FILE_PATH];
    const char *fixed[] = {"config.json",    "generation_config.json", DT_HF_WEIGHTS_NAME,       DT_HF_INDEX_NAME,
                           "tokenizer.json", "tokenizer_config.json",  "special_tokens_map.json"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, fixed[i]);
        unlink(p);
    }
    for (int s = 0; s < nshard; s++) {
        snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", tmp, s + 1, nshard);
        unlink(p);
    }
    rmdir(tmp);
}

/* PEFT's merge_and_unload: w += scaling * (B @ A) (transposed for a
 * Conv1D), B @ A summed in double and rounded to f32 as torch's f32 matmul
 * gives it to within its rounding; with DoRA's magnitudes m, each output
 * feature's row of that sum then times m / its norm. */
static dt_status merge_lora(dt_ckpt *ck, const item *t, float *w)
{
    const float scaling = t->scaling;
    const int64_t out = t->fan_in_fan_out ? t->shape[1] : t->shape[0];
    const int64_t in = t->fan_in_fan_out ? t->shape[0] : t->shape[1], r = t->r;
    float *a = malloc((size_t)(r * in) * sizeof *a), *b = malloc((size_t)(out * r) * sizeof *b);
    void *tmp = malloc((size_t)(r * (in > out ? in : out)) * sizeof(float));
    dt_status st = a && b && tmp ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "merging LoRA adapters: out of memory");
    if (st >= 0)
        st = read_f32(ck, t->lora_a, a, (size_t)(r * in), tmp);
    if (st >= 0)
        st = read_f32(ck, t->lora_b, b, (size_t)(out * r), tmp);
    for (int64_t o = 0; st >= 0 && o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            double s = 0;
            for (int64_t k = 0; k < r; k++)
                s += (double)b[o * r + k] * (double)a[k * in + i];
            float d = (float)s * scaling;
            w[t->fan_in_fan_out ? i * out + o : o * in + i] += d;
        }
    float *mg = st >= 0 && t->lora_m >= 0 ? malloc((size_t)out * sizeof *mg) : NULL;
    if (st >= 0 && t->lora_m >= 0 && !mg)
        st = dt_error(DT_ERR_NO_MEMORY, "merging DoRA adapters: out of memory");
    if (mg && st >= 0)
        st = read_f32(ck, t->lora_m, mg, (size_t)out, tmp);
    for (int64_t o = 0; mg && st >= 0 && o < out; o++) {
        const size_t at = t->fan_in_fan_out ? (size_t)o : (size_t)(o * in), step = t->fan_in_fan_out ? (size_t)out : 1;
        double ss = 0;
        for (int64_t i = 0; i < in; i++)
            ss += (double)w[at + (size_t)i * step] * w[at + (size_t)i * step];
        const float f = mg[o] / (float)sqrt(ss);
        for (int64_t i = 0; i < in; i++)
            w[at + (size_t)i * step] *= f;
    }
    free(mg);
    free(a);
    free(b);
    free(tmp);
    return st;
}

static dt_status write_shards(dt_ckpt *ck, const char *tmp, item *it, size_t n, int nshard, dt_dtype odt,
                              const char *what)
{
    dt_status st = DT_OK;
    size_t maxn = 0;
    for (size_t i = 0; i < n; i++)
        maxn = it[i].numel > maxn ? it[i].numel : maxn;
    float *f = malloc((maxn ? maxn : 1) * sizeof(float));
    void *tmpb = malloc((maxn ? maxn : 1) * sizeof(float));
    dt_st_desc *d = calloc(n ? n : 1, sizeof *d);
    size_t *ix = calloc(n ? n : 1, sizeof *ix);
    if (!f || !tmpb || !d || !ix)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", what);
    const dt_st_kv meta = {.key = "format", .value = "pt"};
    for (int s = 0; s < nshard && st >= 0; s++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (it[i].shard == s) {
                d[k] = (dt_st_desc){.name = it[i].name, .dtype = dt_st_dtype_from(odt), .ndim = it[i].ndim};
                memcpy(d[k].shape, it[i].shape, sizeof d[k].shape);
                ix[k++] = i;
            }
        char p[FILE_PATH];
        if (nshard == 1)
            snprintf(p, sizeof p, "%s/%s", tmp, DT_HF_WEIGHTS_NAME);
        else
            snprintf(p, sizeof p, "%s/model-%05d-of-%05d.safetensors", tmp, s + 1, nshard);
        dt_st_writer *w = NULL;
        st = dt_st_writer_open(p, d, k, &meta, 1, &w);
        for (size_t j = 0; j < k && st >= 0; j++) {
            const item *t = &it[ix[j]];
            if ((st = read_f32(ck, t->src, f, t->numel, tmpb)) < 0)
                break;
            if (t->lora_a >= 0 && (st = merge_lora(ck, t, f)) < 0)
                break;
            if (odt != DT_F32 && (st = dt_k_convert(f, DT_F32, tmpb, odt, (int64_t)t->numel)) < 0)
                break;
            st = dt_st_writer_write(w, j, odt == DT_F32 ? (void *)f : tmpb, t->numel * dt_dtype_size(odt));
        }
        if (st >= 0)
            st = dt_st_writer_commit(w, NULL);
        dt_st_writer_close(w);
    }
    free(f);
    free(tmpb);
    free(d);
    free(ix);
    return st;
}

static dt_status write_index(const char *tmp, const item *it, size_t n, int nshard, uint64_t total)
{
    cJSON *o = cJSON_CreateObject(), *md = o ? cJSON_AddObjectToObject(o, "metadata") : NULL;
    cJSON *wm = o ? cJSON_AddObjectToObject(o, "weight_map") : NULL;
    if (!md || !wm) {
        cJSON_Delete(o);
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", DT_HF_INDEX_NAME);
    }
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    /* sorted keys, as save_pretrained writes them (json.dumps(sort_keys=True)) */
    const item **s = malloc((n ? n : 1) * sizeof *s);
    if (!s) {
        cJSON_Delete(o);
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", DT_HF_INDEX_NAME);
    }
    for (size_t i = 0; i < n; i++)
        s[i] = &it[i];
    for (size_t i = 1; i < n; i++) /* insertion sort: a few hundred names */
        for (size_t j = i; j > 0 && strcmp(s[j - 1]->name, s[j]->name) > 0; j--) {
            const item *x = s[j];
            s[j] = s[j - 1], s[j - 1] = x;
        }
    char fn[64];
    for (size_t i = 0; i < n; i++) {
        snprintf(fn, sizeof fn, "model-%05d-of-%05d.safetensors", s[i]->shard + 1, nshard);
        cJSON_AddStringToObject(wm, s[i]->name, fn);
    }
    free(s);
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    if (!txt)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", DT_HF_INDEX_NAME);
    dt_status st = write_text(tmp, DT_HF_INDEX_NAME, txt);
    cJSON_free(txt);
    return st;
}

/* Checkpoint tensor `name` ("master." first), else -1. */
static int64_t find_either(dt_ckpt *ck, const char *name)
{
    char mname[800];
    snprintf(mname, sizeof mname, "master.%s", name);
    int64_t k = dt_ckpt_find(ck, mname);
    return k >= 0 ? k : dt_ckpt_find(ck, name);
}

/* The LoRA adapters of parameter x ("L.weight": "L.lora_A.weight" [r, in],
 * "L.lora_B.weight" [out, r], DoRA's "L.lora_magnitude_vector.weight"
 * [out] if any) in ck, to merge; *nmerged counts their tensors. */
static dt_status find_lora(dt_ckpt *ck, const dt_model *m, const char *src, const dt_hf_save_params *p, item *x,
                           size_t *nmerged)
{
    x->lora_a = x->lora_b = x->lora_m = -1;
    size_t l = strlen(x->name);
    if (l < 8 || strcmp(x->name + l - 7, ".weight") || x->ndim != 2)
        return DT_OK;
    char an[720], bn[720], mn[720], layer[600];
    snprintf(layer, sizeof layer, "%.*s", (int)(l - 7), x->name);
    snprintf(an, sizeof an, "%s.lora_A.weight", layer);
    snprintf(bn, sizeof bn, "%s.lora_B.weight", layer);
    snprintf(mn, sizeof mn, "%s." DT_LORA_MAGNITUDE ".weight", layer);
    int64_t a = find_either(ck, an), b = find_either(ck, bn), mg = find_either(ck, mn);
    if (a < 0 && b < 0 && mg < 0)
        return DT_OK;
    if (a < 0 || b < 0)
        return dt_error(DT_ERR_NOT_FOUND, "%s has '%s' but not '%s' (LoRA adapters come in pairs)", src,
                        a >= 0 ? an : b >= 0 ? bn : mn, a < 0 ? an : bn);
    if (!(p->lora_scaling > 0) && !p->lora)
        return dt_error(DT_ERR_INVALID_ARG, "%s holds LoRA adapters ('%s'): merging them needs their scaling "
                        "(alpha / r; dt_hf_save_params.lora_scaling), and leaving them out would write the "
                        "base model", src, an);
    const dt_module *lm = dt_model_find_module(m, layer);
    x->fan_in_fan_out = lm && !strcmp(dt_module_type(lm), "Conv1D");
    const int64_t out = x->fan_in_fan_out ? x->shape[1] : x->shape[0];
    const int64_t in = x->fan_in_fan_out ? x->shape[0] : x->shape[1];
    dt_ckpt_tensor ta, tb, tm;
    dt_status st = dt_ckpt_tensor_at(ck, (size_t)a, &ta);
    if (st >= 0)
        st = dt_ckpt_tensor_at(ck, (size_t)b, &tb);
    if (st >= 0 && mg >= 0)
        st = dt_ckpt_tensor_at(ck, (size_t)mg, &tm);
    if (st < 0)
        return st;
    if (mg >= 0 && (tm.ndim != 1 || tm.shape[0] != out))
        return dt_error(DT_ERR_SHAPE, "%s: DoRA magnitudes '%s' [%lld] do not fit '%s' (out %lld)", src, mn,
                        (long long)tm.shape[0], x->name, (long long)out);
    if (ta.ndim != 2 || tb.ndim != 2 || ta.shape[1] != in || tb.shape[0] != out || tb.shape[1] != ta.shape[0])
        return dt_error(DT_ERR_SHAPE, "%s: LoRA adapters '%s' [%lld, %lld] and '%s' [%lld, %lld] do not fit '%s' "
                        "(in %lld, out %lld)", src, an, (long long)ta.shape[0], (long long)(ta.ndim > 1 ? ta.shape[1] : 0),
                        bn, (long long)tb.shape[0], (long long)(tb.ndim > 1 ? tb.shape[1] : 0), x->name,
                        (long long)in, (long long)out);
    x->scaling = p->lora_scaling;
    int64_t r = ta.shape[0];
    if (p->lora && (st = dt_lora_layer_scaling(p->lora, layer, &r, &x->scaling)) < 0)
        return st;
    if (r != ta.shape[0])
        return dt_error(DT_ERR_SHAPE, "%s: LoRA adapter '%s' is of rank %lld, but its layer's is %lld (r, "
                        "rank_pattern)", src, an, (long long)ta.shape[0], (long long)r);
    x->lora_a = a, x->lora_b = b, x->lora_m = mg, x->r = ta.shape[0];
    *nmerged += mg >= 0 ? 3 : 2;
    return DT_OK;
}

/* Every LoRA adapter pair of ck was merged into a parameter written. */
static dt_status all_merged(dt_ckpt *ck, const char *src, size_t nmerged)
{
    size_t n = 0;
    const char *one = NULL;
    for (size_t i = 0; i < dt_ckpt_num_tensors(ck); i++) {
        dt_ckpt_tensor t;
        if (dt_ckpt_tensor_at(ck, i, &t) < 0 || !strncmp(t.name, "optim.", 6) || !strncmp(t.name, "master.", 7) || !dt_lora_is_adapter(t.name))
            continue;
        n++;
        one = t.name;
    }
    if (n != nmerged)
        return dt_error(DT_ERR_NOT_FOUND, "%s holds %zu LoRA adapter tensors (e.g. '%s') of which %zu belong to no "
                        "parameter of the model: not merged", src, n, one ? one : "?", n - nmerged);
    return DT_OK;
}

/* The tokenizer files: path (a tokenizer.json or a directory holding one)
 * read whole into *json (its bytes, to copy) and checked by loading it
 * with the files beside it; *cfg and *map are tokenizer_config.json and
 * special_tokens_map.json, the former with chat_template (non-NULL) in
 * place of the tokenizer's own. */
static dt_status read_tokenizer(const char *path, int64_t max_len, const char *chat_template, char **json, size_t *n,
                                char **cfg, char **map)
{
    char full[FILE_PATH];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(full, sizeof full, "%s/tokenizer.json", path);
        path = full;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "tokenizer.json %s: cannot open: %s", path, strerror(errno));
    dt_status st = DT_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > DT_TOKENIZER_MAX_FILE)
        st = dt_error(DT_ERR_IO, "tokenizer.json %s: not a regular file of at most %zu MiB", path,
                      DT_TOKENIZER_MAX_FILE >> 20);
    size_t len = st == DT_OK ? (size_t)sb.st_size : 0, got = 0;
    char *buf = st == DT_OK ? malloc(len + 1) : NULL;
    if (st == DT_OK && !buf)
        st = dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", path);
    while (st == DT_OK && got < len) {
        ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            st = dt_error(DT_ERR_IO, "tokenizer.json %s: read error%s", path, r == 0 ? " (the file shrank)" : "");
        else
            got += (size_t)r;
    }
    close(fd);
    dt_tokenizer *t = NULL;
    /* the files beside it too (its tokenizer_config.json's special tokens and chat template, a chat_template.jinja),
       then the template given in place of its own */
    if (st == DT_OK && (st = dt_tokenizer_load_mem(buf, len, path, &t)) == DT_OK &&
        (st = dt_tokenizer_apply_beside(t, path)) == DT_OK &&
        (!chat_template || (st = dt_tokenizer_set_chat_template(t, chat_template, strlen(chat_template),
                                                                "the chat template given")) == DT_OK))
        st = dt_tokenizer_hf_files(t, max_len, cfg, map);
    dt_tokenizer_free(t);
    if (st < 0) {
        free(buf);
        return st;
    }
    *json = buf;
    *n = len;
    return DT_OK;
}

dt_status dt_hf_save(const char *src, const dt_hf_config *h, const char *out, const dt_hf_save_params *pp)
{
    if (!src || !h || !out)
        return dt_error(DT_ERR_NULL, "dt_hf_save: %s is NULL", !src ? "src" : !h ? "config" : "out");
    dt_hf_save_params p = pp ? *pp : dt_hf_save_params_default();
    if (p.dtype != DT_F32 && p.dtype != DT_BF16 && p.dtype != DT_F16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_hf_save: dtype %s (f32, bf16 or f16)", dt_dtype_name(p.dtype));
    if (p.max_shard_bytes < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_hf_save: max_shard_bytes must be >= 1");
    /* "OUT/" names the directory OUT: its temporary goes beside it, not inside */
    char obuf[TMP_PATH - 16];
    if (dt_path_trim_slashes(out, obuf, sizeof obuf) < 0)
        return dt_error_wrap(DT_ERR_INVALID_ARG, "dt_hf_save: the output directory");
    out = obuf;
    /* out held for this save: the caller's lock, or one of its own (which checks out, and makes its missing
       parents as save_pretrained's os.makedirs does: the temporary goes beside out) */
    dt_hf_save_lock *own = NULL;
    const dt_hf_save_lock *lock = p.lock;
    dt_status st;
    if (lock && strcmp(dt_dir_hold_path(lock->hold), out))
        return dt_error(DT_ERR_INVALID_ARG, "dt_hf_save: the lock given is on %s, not on %s",
                        dt_dir_hold_path(lock->hold), out);
    if (lock ? (st = dt_hf_save_check_out(out)) < 0 : (st = dt_hf_save_lock_open(out, &own)) < 0)
        return st;
    if (!lock)
        lock = own;
    dt_model *m = NULL;
    dt_ckpt *ck = NULL;
    item *it = NULL;
    char *cfg = NULL, *gen = NULL, *tok = NULL, *tok_cfg = NULL, *tok_map = NULL, *gen_src = NULL;
    size_t tok_n = 0, gen_n = 0;
    char tmp[TMP_PATH] = "", gp[TMP_PATH + 32];
    int nshard = 0;
    if (p.tokenizer && (st = read_tokenizer(p.tokenizer, h->is_gpt2 ? h->gpt2.block_size
                                                                      : h->llama.max_position_embeddings,
                                            p.chat_template, &tok, &tok_n, &tok_cfg, &tok_map)) < 0)
        goto out;
    if (p.generation_from && (st = read_generation(p.generation_from, &gen_src, &gen_n)) < 0)
        goto out;
    if ((st = dt__hf_meta_model(h, &m)) < 0 || (st = dt_ckpt_open(src, &ck)) < 0)
        goto out;
    size_t ne = dt_model_num_entries(m), n = 0;
    if (!(it = calloc(ne ? ne : 1, sizeof *it))) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_hf_save: out of memory");
        goto out;
    }
    uint64_t cur = 0, total = 0;
    size_t nmerged = 0;
    const size_t esz = dt_dtype_size(p.dtype);
    for (size_t i = 0; i < ne; i++) {
        dt_param_info pi;
        dt_model_entry(m, i, &pi);
        if (pi.is_buffer || pi.tied_to >= 0) /* a tied head is stored once, under its source's name */
            continue;
        char mname[600];
        snprintf(mname, sizeof mname, "master.%s", pi.name);
        int64_t k = dt_ckpt_find(ck, mname);
        if (k < 0)
            k = dt_ckpt_find(ck, pi.name);
        if (k < 0 && !strncmp(pi.name, "transformer.", 12)) /* a base model's file */
            k = dt_ckpt_find(ck, pi.name + 12);
        dt_ckpt_tensor t;
        if (k < 0 || dt_ckpt_tensor_at(ck, (size_t)k, &t) < 0) {
            st = dt_error(DT_ERR_NOT_FOUND, "%s has no tensor '%s' (the %s's parameter)", src, pi.name,
                          h->architecture);
            goto out;
        }
        bool same = t.ndim == pi.ndim && t.numel == pi.numel;
        for (int d = 0; same && d < pi.ndim; d++)
            same = t.shape[d] == pi.shape[d];
        if (!same) {
            st = dt_error(DT_ERR_SHAPE, "%s: tensor '%s' has %llu elements in another shape than the configuration's",
                          src, pi.name, (unsigned long long)t.numel);
            goto out;
        }
        item *x = &it[n++];
        x->name = pi.name, x->src = k, x->numel = pi.numel, x->ndim = pi.ndim;
        memcpy(x->shape, pi.shape, sizeof x->shape);
        if ((st = find_lora(ck, m, src, &p, x, &nmerged)) < 0)
            goto out;
        uint64_t b = (uint64_t)pi.numel * esz;
        if (cur > 0 && cur + b > p.max_shard_bytes) { /* huggingface_hub: greedy, in order */
            nshard++;
            cur = 0;
        }
        x->shard = nshard;
        cur += b;
        total += b;
    }
    nshard++;
    if ((st = all_merged(ck, src, nmerged)) < 0)
        goto out;
    if ((st = config_json(h, p.dtype, &cfg, &gen)) < 0)
        goto out;
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", out);
    if (!mkdtemp(tmp)) {
        st = dt_error(DT_ERR_IO, "%s: cannot create a temporary directory beside it: %s", out, strerror(errno));
        tmp[0] = 0;
        goto out;
    }
    chmod(tmp, 0755);
    if ((st = write_shards(ck, tmp, it, n, nshard, p.dtype, out)) < 0 ||
        (nshard > 1 && (st = write_index(tmp, it, n, nshard, total)) < 0) ||
        (st = write_text(tmp, "config.json", cfg)) < 0 ||
        (!gen_src && (st = write_text(tmp, "generation_config.json", gen)) < 0))
        goto out;
    snprintf(gp, sizeof gp, "%s/generation_config.json", tmp);
    if (gen_src && (st = dt_file_write_atomic(gp, gen_src, gen_n, 0644)) < 0) /* the source's, byte for byte */
        goto out;
    if (tok) {
        char tp[4300];
        snprintf(tp, sizeof tp, "%s/tokenizer.json", tmp);
        if ((st = dt_file_write_atomic(tp, tok, tok_n, 0644)) < 0 ||
            (st = write_text(tmp, "tokenizer_config.json", tok_cfg)) < 0 ||
            (st = write_text(tmp, "special_tokens_map.json", tok_map)) < 0)
            goto out;
    }
    /* out is the empty directory locked above (or gone): it is replaced. Anything else there now was put by
       a writer that took no lock: the complete model stays in tmp, named */
    struct stat sb;
    const bool ours = lstat(out, &sb) != 0 || dt_dir_hold_same(lock->hold);
    if (ours)
        rmdir(out);
    if (ours && (st = dt_file_rename(tmp, out)) >= 0) {
        tmp[0] = 0;
    } else {
        char why[600];
        snprintf(why, sizeof why, "%s", ours ? dt_last_error() : "it was created meanwhile by another writer");
        st = dt_error(DT_ERR_IO, "%s: the model is written whole in %s but could not be moved to %s (%s); it is "
                      "kept there: rename it yourself", out, tmp, out, why);
        tmp[0] = 0;
    }
out:
    if (tmp[0])
        remove_tmp(tmp, nshard);
    dt_hf_save_lock_close(own);
    cJSON_free(cfg);
    cJSON_free(gen);
    free(gen_src);
    free(tok);
    free(tok_cfg);
    free(tok_map);
    free(it);
    dt_ckpt_close(ck);
    dt_model_free(m);
    return st;
}

bool dt_hf_dir_tokenizer(const char *name, char *path, size_t n)
{
    struct stat sb;
    if (!name || !path || strncmp(name, "hf:", 3) || snprintf(path, n, "%s/tokenizer.json", name + 3) >= (int)n)
        return false;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

dt_status dt_hf_save_check_out(const char *out)
{
    if (!out || !out[0])
        return dt_error(DT_ERR_INVALID_ARG, "the output directory name is empty");
    char name[4096]; /* lstat of "link/" follows the link: the name without its trailing slashes */
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/')
        n--;
    snprintf(name, sizeof name, "%.*s", (int)n, out);
    struct stat sb;
    if (lstat(name, &sb) != 0)
        return errno == ENOENT ? DT_OK : dt_error(DT_ERR_IO, "%s: %s", out, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "%s is a symlink (not followed; name a new directory)", out);
    if (!S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "%s exists and is not a directory (name a new directory)", out);
    DIR *d = opendir(out);
    if (!d)
        return dt_error(DT_ERR_IO, "%s: %s", out, strerror(errno));
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    if (!empty)
        return dt_error(DT_ERR_INVALID_ARG, "%s exists and is not empty (remove it, or name a new directory: nothing "
                        "is replaced)", out);
    return DT_OK;
}
