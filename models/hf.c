/* Hugging Face model directories as zoo models: dt_model_create("hf:DIR")
 * reads DIR/config.json (hf_config.c: transformers' PretrainedConfig keys), builds the
 * Llama-family decoder (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM, GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (also
 * Gemma3ForConditionalGeneration's language model), Phi3ForCausalLM,
 * GraniteForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, SmolLM3ForCausalLM, MinistralForCausalLM, the
 * mixtures of experts MixtralForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM and OlmoeForCausalLM) or
 * GPT-2 (GPT2LMHeadModel) it describes, initialised from the seed, and checks that the weights in DIR
 * (model.safetensors or the shards of model.safetensors.index.json; read
 * through dt_ckpt_open) agree with the configuration's vocabulary, width and
 * layer count, every parameter they hold at the shape it describes (on a
 * meta build), and that a tied configuration's weights hold no other head.
 * The weights themselves are loaded by the caller, through
 * dt_trainer_load_weights(DIR), so that every strategy reads only its
 * ranges. Every refusal names the file and the key. */
#include "zoo.h"

#include <dtrain/ckpt.h>

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CONFIG_NAME "config.json"

/* Whether the weights hold layer i's first norm (either GPT-2 spelling). */
static bool has_layer(const dt_ckpt *ck, const dt_hf_config *h, int64_t i)
{
    char a[96], b[96];
    if (!h->is_gpt2) { /* every family's layer has this norm (OLMo 2's normalizes the attention's output) */
        snprintf(a, sizeof a, "model.layers.%lld.post_attention_layernorm.weight", (long long)i);
        return dt_ckpt_find(ck, a) >= 0;
    }
    snprintf(a, sizeof a, "transformer.h.%lld.ln_1.weight", (long long)i);
    snprintf(b, sizeof b, "h.%lld.ln_1.weight", (long long)i);
    return dt_ckpt_find(ck, a) >= 0 || dt_ckpt_find(ck, b) >= 0;
}

/* A tied configuration (tie_word_embeddings, GPT-2's default) whose weights
 * also hold an lm_head.weight: it must be the embedding, byte for byte
 * (some exporters write the tied head twice). A different head is refused:
 * transformers 5 then unties the two and uses it, older versions tie them
 * and drop it, and dtrain's tied model would drop it silently. Read in
 * pieces of 1 Mi elements (a 128k x 4k head is 2 GB). */
static dt_status check_tied_head(dt_ckpt *ck, const char *dir, int64_t emb)
{
    int64_t head = dt_ckpt_find(ck, "lm_head.weight");
    dt_ckpt_tensor e, h;
    if (head < 0 || dt_ckpt_tensor_at(ck, (size_t)emb, &e) < 0 || dt_ckpt_tensor_at(ck, (size_t)head, &h) < 0)
        return DT_OK;
    bool same = e.dtype == h.dtype && e.numel == h.numel && e.ndim == h.ndim &&
                !memcmp(e.shape, h.shape, (size_t)e.ndim * sizeof e.shape[0]);
    const size_t es = dt_st_dtype_size(e.dtype), step = (size_t)1 << 20;
    char *a = same ? malloc(step * es) : NULL, *b = same ? malloc(step * es) : NULL;
    dt_status st = !same || (a && b) ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", dir);
    for (uint64_t lo = 0; same && st >= 0 && lo < e.numel; lo += step) {
        uint64_t hi = e.numel - lo < step ? e.numel : lo + step;
        if ((st = dt_ckpt_read(ck, (size_t)emb, lo, hi, a, true)) >= 0 &&
            (st = dt_ckpt_read(ck, (size_t)head, lo, hi, b, true)) >= 0)
            same = !memcmp(a, b, (size_t)(hi - lo) * es);
    }
    free(a);
    free(b);
    if (st >= 0 && !same)
        st = dt_error(DT_ERR_MISMATCH, "%s/%s: key \"tie_word_embeddings\" is true (or absent, for GPT-2), but the "
                      "weights' lm_head.weight differs from %s: set it false for a Llama-family model to use that "
                      "head, or leave lm_head.weight out", dir, CONFIG_NAME, e.name);
    return st;
}

dt_status dt__hf_meta_model(const dt_hf_config *h, dt_model **m)
{
    dt_model_config mc = dt_model_config_default();
    mc.build.meta = true;
    if (h->is_gpt2) {
        mc.n_layer = h->gpt2.n_layer, mc.n_head = h->gpt2.n_head, mc.n_embd = h->gpt2.n_embd;
        mc.block_size = h->gpt2.block_size, mc.vocab_size = h->gpt2.vocab_size;
        dt_model_desc d;
        return dt__model_gpt2("gpt2", 0, &mc, m, &d);
    }
    return dt_llama_create(&h->llama, 0, &mc, m, NULL);
}

static bool ends_with(const char *s, const char *tail)
{
    const size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* Every parameter of the model h describes that the weights hold, at the
 * weights' shape: checked on a meta build (no storage), so that sizes in
 * config.json the weights do not have (intermediate_size 2^22 over 64,
 * 2^20 heads) are refused before the model is built at them (gigabytes
 * and half a minute for the first, then the loader's shape error; or an
 * out-of-memory refusal, exit 1). */
static dt_status check_shapes(dt_ckpt *ck, const char *dir, const dt_hf_config *h)
{
    dt_model *m = NULL;
    dt_status st = dt__hf_meta_model(h, &m);
    if (st < 0)
        return dt_error_wrap(st, "%s/%s", dir, CONFIG_NAME);
    for (size_t i = 0, ne = dt_model_num_entries(m); st >= 0 && i < ne; i++) {
        dt_param_info pi;
        dt_ckpt_tensor t;
        if (dt_model_entry(m, i, &pi) < 0 || pi.is_buffer || pi.tied_to >= 0)
            continue;
        int64_t k = dt_ckpt_find(ck, pi.name);
        if (k < 0 && !strncmp(pi.name, "transformer.", 12)) /* a base model's file */
            k = dt_ckpt_find(ck, pi.name + 12);
        if (k < 0 || dt_ckpt_tensor_at(ck, (size_t)k, &t) < 0) /* missing: the loader names it */
            continue;
        if (t.ndim != pi.ndim || memcmp(t.shape, pi.shape, (size_t)t.ndim * sizeof t.shape[0])) {
            char a[160], b[160];
            dt_shape_str(pi.ndim, pi.shape, a, sizeof a);
            dt_shape_str(t.ndim, t.shape, b, sizeof b);
            st = dt_error(DT_ERR_MISMATCH, "%s/%s describes '%s' as %s, but the weights' is %s (a size in the "
                          "file disagrees with the weights)", dir, CONFIG_NAME, pi.name, a, b);
        }
    }
    /* Tensors of the weights the model has no place for are left unread, as transformers leaves its
       "unexpected keys" (with a warning): said, never silent. Not counted: the buffers older exporters saved
       (GPT-2's attn.bias and attn.masked_bias, rotary_emb.inv_freq), which transformers ignores quietly, and a
       tied head (checked equal to the embedding) */
    size_t unused = 0;
    const char *first = NULL;
    for (size_t i = 0, n = dt_ckpt_num_tensors(ck); st >= 0 && i < n; i++) {
        dt_ckpt_tensor t;
        char full[600];
        if (dt_ckpt_tensor_at(ck, i, &t) < 0)
            continue;
        snprintf(full, sizeof full, "transformer.%s", t.name); /* a GPT-2 base model's names */
        const bool quiet = ends_with(t.name, ".attn.bias") || ends_with(t.name, ".attn.masked_bias") ||
                           ends_with(t.name, ".rotary_emb.inv_freq") ||
                           (!strcmp(t.name, "lm_head.weight") && (h->is_gpt2 || h->llama.tie_word_embeddings));
        if (!quiet && dt_model_find_entry(m, t.name) < 0 && (!h->is_gpt2 || dt_model_find_entry(m, full) < 0)) {
            if (!unused++)
                first = t.name;
        }
    }
    static char warned[4200]; /* once per directory and process: a run builds its model more than once (the
                                 memory check's meta build, the model itself) */
    if (st >= 0 && unused && strcmp(warned, dir)) {
        snprintf(warned, sizeof warned, "%s", dir);
        dt_log(DT_LOG_WARN, "%s: %zu tensor%s of the weights %s no parameter of the %s that %s/%s describes and "
               "%s not used (the first: '%s'; transformers leaves them out too, with a warning)", dir, unused,
               unused == 1 ? "" : "s", unused == 1 ? "is" : "are", h->architecture, dir, CONFIG_NAME,
               unused == 1 ? "is" : "are", first);
    }
    dt_model_free(m);
    return st;
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
        else if (h->is_gpt2 || h->llama.tie_word_embeddings)
            st = check_tied_head(ck, dir, k);
        break;
    }
    if (st >= 0 && !has_layer(ck, h, L - 1))
        st = dt_error(DT_ERR_MISMATCH, "%s/%s: key \"%s\" is %lld, but the weights have no layer %lld",
                      dir, CONFIG_NAME, lkey, (long long)L, (long long)(L - 1));
    if (st >= 0)
        st = check_shapes(ck, dir, h);
    dt_ckpt_close(ck);
    return st;
}

dt_status dt__model_hf(const char *dir, uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d)
{
    dt_hf_config h;
    dt_status st = dt_hf_config_read(dir, &h);
    if (st < 0)
        return st;
    if (!dt_ckpt_is_hf_dir(dir)) { /* an older directory may hold PyTorch's pickle, which dtrain does not read */
        char bin[4200];
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
        const bool pickle = access(bin, F_OK) == 0;
        return dt_error(DT_ERR_NOT_FOUND, "%s: no %s or %s (the model's weights)%s", dir, DT_HF_WEIGHTS_NAME,
                        DT_HF_INDEX_NAME, pickle ? "; its pytorch_model.bin is PyTorch's pickle, which dtrain does "
                        "not read: save the model with transformers' save_pretrained (safetensors, its default)" : "");
    }
    if ((st = check_weights(dir, &h)) < 0)
        return st;
    if (h.is_gpt2) {
        dt_model_config gc = *c;
        gc.n_layer = h.gpt2.n_layer, gc.n_head = h.gpt2.n_head, gc.n_embd = h.gpt2.n_embd;
        gc.block_size = h.gpt2.block_size, gc.vocab_size = h.gpt2.vocab_size;
        gc.dropout = h.gpt2.dropout;
        return dt__model_gpt2("gpt2", seed, &gc, out, d);
    }
    dt_model_config lcfg = *c; /* config.json's attention_dropout, as GPT-2's pdrops above */
    lcfg.dropout = 0.0f;
    return dt_llama_create(&h.llama, seed, &lcfg, out, d);
}
