/* Hugging Face model directories as zoo models: dt_model_create("hf:DIR")
 * reads DIR/config.json (hf_config.c: transformers' PretrainedConfig keys), builds the
 * Llama-family decoder (LlamaForCausalLM, MistralForCausalLM without a
 * sliding window, Qwen2ForCausalLM) or GPT-2 (GPT2LMHeadModel) it
 * describes, initialised from the seed, and checks that the weights in DIR
 * (model.safetensors or the shards of model.safetensors.index.json; read
 * through dt_ckpt_open) agree with the configuration's vocabulary, width and
 * layer count. The
 * weights themselves are loaded by the caller, through
 * dt_trainer_load_weights(DIR), so that every strategy reads only its
 * ranges. Every refusal names the file and the key. */
#include "zoo.h"

#include <dtrain/ckpt.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONFIG_NAME "config.json"

/* Whether the weights hold layer i's first norm (either GPT-2 spelling). */
static bool has_layer(const dt_ckpt *ck, const dt_hf_config *h, int64_t i)
{
    char a[96], b[96];
    if (!h->is_gpt2) {
        snprintf(a, sizeof a, "model.layers.%lld.input_layernorm.weight", (long long)i);
        return dt_ckpt_find(ck, a) >= 0;
    }
    snprintf(a, sizeof a, "transformer.h.%lld.ln_1.weight", (long long)i);
    snprintf(b, sizeof b, "h.%lld.ln_1.weight", (long long)i);
    return dt_ckpt_find(ck, a) >= 0 || dt_ckpt_find(ck, b) >= 0;
}

/* The weights' embedding [rows, width] and layer count against the
 * configuration, before the model is built: a config.json that says more
 * layers or a wider model than its weights would otherwise build (and
 * initialise) all of it first. Fewer layers than the weights hold is
 * taken (the weights' other layers are extra tensors, ignored as
 * dt_trainer_load_weights ignores them: the first layers of a model). */
static dt_status check_weights(const char *dir, const dt_hf_config *h)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st < 0)
        return st;
    const char *names[] = {"model.embed_tokens.weight", "transformer.wte.weight", "wte.weight"};
    int64_t V = h->is_gpt2 ? h->gpt2.vocab_size : h->llama.vocab_size;
    int64_t C = h->is_gpt2 ? h->gpt2.n_embd : h->llama.hidden_size;
    int64_t L = h->is_gpt2 ? h->gpt2.n_layer : h->llama.num_hidden_layers;
    const char *ckey = h->is_gpt2 ? "n_embd" : "hidden_size", *lkey = h->is_gpt2 ? "n_layer" : "num_hidden_layers";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t k = dt_ckpt_find(ck, names[i]);
        dt_ckpt_tensor t;
        if (k < 0 || dt_ckpt_tensor_at(ck, (size_t)k, &t) < 0)
            continue;
        if (t.ndim != 2 || t.shape[0] != V)
            st = dt_error(DT_ERR_MISMATCH, "%s/%s: key \"vocab_size\" is %lld, but the weights' tensor '%s' has "
                          "%lld rows", dir, CONFIG_NAME, (long long)V, names[i],
                          (long long)(t.ndim ? t.shape[0] : 0));
        else if (t.shape[1] != C)
            st = dt_error(DT_ERR_MISMATCH, "%s/%s: key \"%s\" is %lld, but the weights' tensor '%s' has %lld "
                          "columns", dir, CONFIG_NAME, ckey, (long long)C, names[i], (long long)t.shape[1]);
        break;
    }
    if (st >= 0 && !has_layer(ck, h, L - 1))
        st = dt_error(DT_ERR_MISMATCH, "%s/%s: key \"%s\" is %lld, but the weights have no layer %lld",
                      dir, CONFIG_NAME, lkey, (long long)L, (long long)(L - 1));
    dt_ckpt_close(ck);
    return st;
}

dt_status dt__model_hf(const char *dir, uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d)
{
    dt_hf_config h;
    dt_status st = dt_hf_config_read(dir, &h);
    if (st < 0)
        return st;
    if (!dt_ckpt_is_hf_dir(dir))
        return dt_error(DT_ERR_NOT_FOUND, "%s: no %s or %s (the model's weights)", dir, DT_HF_WEIGHTS_NAME,
                        DT_HF_INDEX_NAME);
    if ((st = check_weights(dir, &h)) < 0)
        return st;
    if (h.is_gpt2) {
        dt_model_config gc = *c;
        gc.n_layer = h.gpt2.n_layer, gc.n_head = h.gpt2.n_head, gc.n_embd = h.gpt2.n_embd;
        gc.block_size = h.gpt2.block_size, gc.vocab_size = h.gpt2.vocab_size;
        gc.dropout = h.gpt2.dropout;
        return dt__model_gpt2("gpt2", seed, &gc, out, d);
    }
    return dt_llama_create(&h.llama, seed, c, out, d);
}
