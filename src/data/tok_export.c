/* dtrain's byte-level BPE (data.h) written as a tokenizer.json
 * (tokenizer.h: dt_bpe_save_tokenizer_json).
 *
 * The file must make the `tokenizers` library give dt_bpe_encode's ids for
 * every text. dt_bpe's ids 0..255 are the bytes, so the vocab maps GPT-2's
 * byte character of b to b and merge k's token (the byte characters of
 * its bytes) to 256 + k. dt_bpe's chunker is GPT-2's regex over byte
 * classes (letters: A-Z, a-z and every byte >= 0x80; digits 0-9; spaces
 * \t..\r and ' '): over the characters of valid UTF-8 text the same classes
 * are [A-Za-z\x{80}-\x{10FFFF}], [0-9] and [\t-\r ], so a Split with that
 * regex cuts exactly where dt_bpe does, and ByteLevel without its own regex
 * maps the pieces to byte characters. Merging by rank, leftmost among
 * equals, is the same in both. */
#include "tok_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char chunk_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z\\x{80}-\\x{10FFFF}]+| ?[0-9]+"
                                    "| ?[^A-Za-z0-9\\t-\\r \\x{80}-\\x{10FFFF}]+"
                                    "|[\\t-\\r ]+(?![^\\t-\\r ])|[\\t-\\r ]+";

/* The byte characters of bytes[0, n) as a NUL-terminated string (malloc'd). */
static char *byte_chars(const unsigned char *bytes, size_t n)
{
    char *s = malloc(2 * n + 1);
    if (!s)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += dt__utf8_put(dt__tok_byte_char(bytes[i]), (unsigned char *)s + o);
    s[o] = 0;
    return s;
}

static cJSON *bytelevel(bool add_prefix_space, bool trim_offsets, bool use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

dt_status dt_bpe_save_tokenizer_json(const dt_bpe *bpe, const char *eos, const char *path)
{
    if (!bpe || !path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_save_tokenizer_json: NULL argument");
    int64_t V = dt_bpe_vocab_size(bpe);
    char **tok = calloc((size_t)V, sizeof *tok);
    tok_pool pool = {0};
    tok_strmap seen = {0};
    cJSON *root = cJSON_CreateObject();
    dt_status st = tok && root ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", path);
    for (int64_t id = 0; st == DT_OK && id < V; id++) {
        const unsigned char *b;
        size_t n;
        uint32_t off;
        bool had;
        if ((st = dt_bpe_token_bytes(bpe, id, &b, &n)) < 0)
            break;
        if (!(tok[id] = byte_chars(b, n))) {
            st = dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", path);
            break;
        }
        size_t l = strlen(tok[id]);
        if ((st = dt__tok_pool_add(&pool, tok[id], l, &off)) < 0 ||
            (st = dt__tok_strmap_put(&seen, &pool, off, (uint32_t)l, (uint32_t)id, &had)) < 0)
            break;
        if (had)
            st = dt_error(DT_ERR_UNSUPPORTED,
                          "tokenizer.json %s: ids %u and %lld have the same bytes; a tokenizer.json vocab maps each "
                          "token to one id (keep the dtrain vocab file)",
                          path, dt__tok_strmap_get(&seen, &pool, tok[id], l), (long long)id);
    }
    char *text = NULL;
    if (st == DT_OK) {
        cJSON_AddStringToObject(root, "version", "1.0");
        cJSON_AddNullToObject(root, "truncation");
        cJSON_AddNullToObject(root, "padding");
        cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
        if (eos) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)V);
            cJSON_AddStringToObject(a, "content", eos);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", true);
            cJSON_AddItemToArray(added, a);
        }
        cJSON_AddNullToObject(root, "normalizer");
        cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
        cJSON_AddStringToObject(pre, "type", "Sequence");
        cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
        cJSON *split = cJSON_CreateObject();
        cJSON_AddStringToObject(split, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", chunk_pattern);
        cJSON_AddStringToObject(split, "behavior", "Isolated");
        cJSON_AddBoolToObject(split, "invert", false);
        cJSON_AddItemToArray(list, split);
        cJSON_AddItemToArray(list, bytelevel(false, true, false));
        cJSON_AddNullToObject(root, "post_processor");
        cJSON_AddItemToObject(root, "decoder", bytelevel(true, true, true));
        cJSON *model = cJSON_AddObjectToObject(root, "model");
        cJSON_AddStringToObject(model, "type", "BPE");
        cJSON_AddNullToObject(model, "dropout");
        cJSON_AddNullToObject(model, "unk_token");
        cJSON_AddNullToObject(model, "continuing_subword_prefix");
        cJSON_AddNullToObject(model, "end_of_word_suffix");
        cJSON_AddBoolToObject(model, "fuse_unk", false);
        cJSON_AddBoolToObject(model, "byte_fallback", false);
        cJSON_AddBoolToObject(model, "ignore_merges", false);
        cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
        for (int64_t id = 0; id < V; id++)
            cJSON_AddNumberToObject(vocab, tok[id], (double)id);
        cJSON *merges = cJSON_AddArrayToObject(model, "merges");
        for (int64_t k = 0; k + 256 < V; k++) {
            uint32_t l, r;
            dt_bpe_merge(bpe, k, &l, &r);
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(tok[l]));
            cJSON_AddItemToArray(pair, cJSON_CreateString(tok[r]));
            cJSON_AddItemToArray(merges, pair);
        }
        text = cJSON_Print(root);
        if (!text)
            st = dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", path);
    }
    if (st == DT_OK)
        st = dt_file_write_atomic(path, text, strlen(text), 0644);
    cJSON_free(text);
    cJSON_Delete(root);
    for (int64_t id = 0; tok && id < V; id++)
        free(tok[id]);
    free(tok);
    free(pool.p);
    dt__tok_strmap_free(&seen);
    return st;
}

/* The first special added token among names (NULL if none). */
static const tok_added *special_named(const dt_tokenizer *t, const char *const *names, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a = dt__tok_strmap_get(&t->added_map, &t->pool, names[i], strlen(names[i]));
        if (a != TOK_NONE && t->added[a].special)
            return &t->added[a];
    }
    return NULL;
}

char *dt__tok_text_of(const dt_tokenizer *t, uint32_t id)
{
    char *s = NULL;
    if (id < t->nid && t->added_by_id[id] != TOK_NONE)
        s = strdup(t->pool.p + t->added[t->added_by_id[id]].off);
    else if (id < t->nid && t->id_len[id] != TOK_NONE && (s = malloc((size_t)t->id_len[id] + 1))) {
        memcpy(s, t->pool.p + t->id_off[id], t->id_len[id]);
        s[t->id_len[id]] = 0;
    }
    return s;
}

/* Token id's text (dt__tok_text_of) into o's key; a token that is not there: null. */
static void add_content(cJSON *o, const char *key, const dt_tokenizer *t, bool has, uint32_t id)
{
    char *s = has ? dt__tok_text_of(t, id) : NULL;
    if (s)
        cJSON_AddStringToObject(o, key, s);
    else
        cJSON_AddNullToObject(o, key);
    free(s);
}

dt_status dt_tokenizer_hf_files(const dt_tokenizer *t, int64_t model_max_length, char **config_json,
                                char **special_map_json)
{
    if (!t || !config_json || !special_map_json)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_hf_files: NULL argument");
    *config_json = *special_map_json = NULL;
    /* bos and eos: a tokenizer_config.json's beside the tokenizer.json it came from, else the first special
       added token of the names below (eos: dt_tokenizer_eos's, the token its documents end with) */
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<bos>", "<|endoftext|>"};
    const tok_added *bos_a = special_named(t, bos_names, sizeof bos_names / sizeof bos_names[0]);
    uint32_t bos = t->has_cfg_bos ? t->cfg_bos : bos_a ? bos_a->id : 0, eos = 0;
    const bool has_bos = t->has_cfg_bos || bos_a, has_eos = dt_tokenizer_eos(t, &eos) == DT_OK;
    if (!has_eos)
        dt_error_clear(); /* none: eos_token null */
    const bool has_unk = t->unk != TOK_NONE && t->added_by_id[t->unk] != TOK_NONE;
    cJSON *cfg = cJSON_CreateObject(), *map = cJSON_CreateObject();
    cJSON *dec = cfg ? cJSON_AddObjectToObject(cfg, "added_tokens_decoder") : NULL;
    for (uint32_t id = 0; dec && id < t->nid; id++) { /* ids in order, each its holder (added_by_id) */
        uint32_t i = t->added_by_id[id];
        if (i == TOK_NONE)
            continue;
        const tok_added *a = &t->added[i];
        char key[16];
        snprintf(key, sizeof key, "%u", id);
        cJSON *o = cJSON_AddObjectToObject(dec, key);
        cJSON_AddStringToObject(o, "content", t->pool.p + a->off);
        cJSON_AddBoolToObject(o, "lstrip", a->lstrip);
        cJSON_AddBoolToObject(o, "normalized", a->normalized);
        cJSON_AddBoolToObject(o, "rstrip", a->rstrip);
        cJSON_AddBoolToObject(o, "single_word", a->single_word);
        cJSON_AddBoolToObject(o, "special", a->special);
    }
    char *ctext = NULL, *mtext = NULL;
    if (dec && map) {
        add_content(cfg, "bos_token", t, has_bos, bos);
        if (t->chat_template) /* (a chat_template.jinja's too: transformers reads it from either) */
            cJSON_AddStringToObject(cfg, "chat_template", t->chat_template);
        cJSON_AddBoolToObject(cfg, "clean_up_tokenization_spaces", false);
        add_content(cfg, "eos_token", t, has_eos, eos);
        if (model_max_length > 0)
            cJSON_AddNumberToObject(cfg, "model_max_length", (double)model_max_length);
        cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
        if (has_unk)
            add_content(cfg, "unk_token", t, true, t->unk);
        if (has_bos)
            add_content(map, "bos_token", t, true, bos);
        if (has_eos)
            add_content(map, "eos_token", t, true, eos);
        if (has_unk)
            add_content(map, "unk_token", t, true, t->unk);
        ctext = cJSON_Print(cfg);
        mtext = cJSON_Print(map);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(map);
    char *c = ctext ? strdup(ctext) : NULL, *m = mtext ? strdup(mtext) : NULL; /* the caller free()s them */
    cJSON_free(ctext);
    cJSON_free(mtext);
    if (!c || !m) {
        free(c);
        free(m);
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    *config_json = c;
    *special_map_json = m;
    return DT_OK;
}
