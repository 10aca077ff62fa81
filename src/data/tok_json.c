/* Reading tokenizer.json (tokenizer.h): the BPE model, the added tokens,
 * the pre-tokenizer, decoder and post-processor.
 *
 * Every key is checked as the library's deserializer checks it, and every
 * error names the file and the key ("model.merges[12]"). Ids of added
 * tokens follow the library, not the file: a content already in the vocab
 * keeps its vocab id, a new one gets the next id after the vocab (the file's
 * id is what the library wrote, so for its own files they agree).
 *
 * The vocab can hold 150,000 entries; duplicates are found with the string
 * map, not the strict JSON reader (whose duplicate check is quadratic in an
 * object's size). */
#include "base/json_strict.h"
#include "mapfile.h"
#include "tok_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_ID ((uint32_t)1 << 24) /* ids at or above are refused (the largest vocabularies hold ~260k) */

/* ---- pool and string map -------------------------------------------------------------- */

dt_status dt__tok_pool_add(tok_pool *p, const char *s, size_t n, uint32_t *off)
{
    if (p->n + n + 1 > UINT32_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "tokenizer: more than 4 GiB of token text");
    if (p->n + n + 1 > p->cap) {
        size_t cap = p->cap ? p->cap : 4096;
        while (cap < p->n + n + 1)
            cap *= 2;
        char *nw = realloc(p->p, cap);
        if (!nw)
            return dt_error(DT_ERR_NO_MEMORY, "tokenizer: out of memory");
        p->p = nw;
        p->cap = cap;
    }
    memcpy(p->p + p->n, s, n);
    p->p[p->n + n] = 0;
    *off = (uint32_t)p->n;
    p->n += n + 1;
    return DT_OK;
}

static uint64_t str_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

uint32_t dt__tok_strmap_get(const tok_strmap *m, const tok_pool *p, const char *s, size_t n)
{
    if (!m->cap)
        return TOK_NONE;
    for (size_t i = str_hash(s, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->len[i] == UINT32_MAX)
            return TOK_NONE;
        if (m->len[i] == n && !memcmp(p->p + m->off[i], s, n))
            return m->val[i];
    }
}

static dt_status strmap_grow(tok_strmap *m, const tok_pool *p)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint32_t *off = malloc(cap * sizeof *off), *len = malloc(cap * sizeof *len), *val = malloc(cap * sizeof *val);
    if (!off || !len || !val) {
        free(off);
        free(len);
        free(val);
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    memset(len, 0xff, cap * sizeof *len);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->len[i] == UINT32_MAX)
            continue;
        size_t j = str_hash(p->p + m->off[i], m->len[i]) & (cap - 1);
        while (len[j] != UINT32_MAX)
            j = (j + 1) & (cap - 1);
        off[j] = m->off[i];
        len[j] = m->len[i];
        val[j] = m->val[i];
    }
    dt__tok_strmap_free(m);
    m->off = off;
    m->len = len;
    m->val = val;
    m->cap = cap;
    return DT_OK;
}

dt_status dt__tok_strmap_put(tok_strmap *m, const tok_pool *p, uint32_t off, uint32_t len, uint32_t val, bool *had)
{
    if (had)
        *had = false;
    if ((m->n + 1) * 2 > m->cap) {
        size_t n = m->n;
        dt_status st = strmap_grow(m, p);
        if (st < 0)
            return st;
        m->n = n;
    }
    size_t i = str_hash(p->p + off, len) & (m->cap - 1);
    for (; m->len[i] != UINT32_MAX; i = (i + 1) & (m->cap - 1))
        if (m->len[i] == len && !memcmp(p->p + m->off[i], p->p + off, len)) {
            if (had)
                *had = true;
            return DT_OK;
        }
    m->off[i] = off;
    m->len[i] = len;
    m->val[i] = val;
    m->n++;
    return DT_OK;
}

void dt__tok_strmap_free(tok_strmap *m)
{
    free(m->off);
    free(m->len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* ---- GPT-2's byte characters ------------------------------------------------------------ */

static bool printable_byte(unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

/* The 68 others, in byte order, are 256 + n: bytes 0..32 are n = 0..32,
 * 127..160 are 33..66, 173 is 67. */
uint32_t dt__tok_byte_char(unsigned char b)
{
    if (printable_byte(b))
        return b;
    return 256 + (b <= 32 ? b : b <= 160 ? 33u + (b - 127u) : 67u);
}

int dt__tok_char_byte(uint32_t cp)
{
    if (cp < 256)
        return printable_byte(cp) ? (int)cp : -1;
    if (cp >= 256 + 68)
        return -1;
    uint32_t n = cp - 256;
    return (int)(n < 33 ? n : n < 67 ? 127 + (n - 33) : 173);
}

size_t dt__utf8_put(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

const char dt__tok_gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- the reader ------------------------------------------------------------------------------ */

typedef struct rd {
    const char *name;
    dt_tokenizer *t;
} rd;

static dt_status kerr(const rd *r, dt_status code, const char *key, const char *fmt, ...) DT_PRINTF(4, 5);
static dt_status kerr(const rd *r, dt_status code, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(code, "tokenizer.json %s: key %s: %s", r->name, key, msg);
}

/* obj[key] unless absent or null. */
static const cJSON *get(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* An optional boolean. */
static dt_status opt_bool(const rd *r, const cJSON *obj, const char *key, const char *path, bool dflt, bool *out)
{
    const cJSON *v = get(obj, key);
    *out = dflt;
    if (!v)
        return DT_OK;
    if (!cJSON_IsBool(v))
        return kerr(r, DT_ERR_FORMAT, path, "want true or false");
    *out = cJSON_IsTrue(v);
    return DT_OK;
}

/* An optional string (NULL when absent or null). */
static dt_status opt_str(const rd *r, const cJSON *obj, const char *key, const char *path, const char **out)
{
    const cJSON *v = get(obj, key);
    *out = NULL;
    if (!v)
        return DT_OK;
    if (!cJSON_IsString(v))
        return kerr(r, DT_ERR_FORMAT, path, "want a string");
    *out = v->valuestring;
    return DT_OK;
}

static bool as_id(const cJSON *v, uint32_t *id)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_ID || floor(v->valuedouble) != v->valuedouble)
        return false;
    *id = (uint32_t)v->valuedouble;
    return true;
}

static dt_status read_vocab(rd *r, const cJSON *model, uint32_t *maxid)
{
    dt_tokenizer *t = r->t;
    const cJSON *vocab = get(model, "vocab");
    if (!vocab)
        return kerr(r, DT_ERR_FORMAT, "model.vocab", "missing (a BPE model needs its vocab: {\"token\": id, ...})");
    if (!cJSON_IsObject(vocab))
        return kerr(r, DT_ERR_FORMAT, "model.vocab", "want an object {\"token\": id, ...}");
    uint32_t n = 0;
    for (const cJSON *c = vocab->child; c; c = c->next) {
        uint32_t id;
        if (!as_id(c, &id))
            return kerr(r, DT_ERR_FORMAT, "model.vocab", "the id of \"%.64s\" is not an integer in 0..%u", c->string,
                        MAX_ID - 1);
        uint32_t off;
        size_t len = strlen(c->string);
        dt_status st = dt__tok_pool_add(&t->pool, c->string, len, &off);
        bool had;
        if (st == DT_OK)
            st = dt__tok_strmap_put(&t->vocab, &t->pool, off, (uint32_t)len, id, &had);
        if (st < 0)
            return st;
        if (had)
            return kerr(r, DT_ERR_FORMAT, "model.vocab", "the token \"%.64s\" appears twice", c->string);
        *maxid = id > *maxid ? id : *maxid;
        n++;
    }
    t->model_vocab_len = n;
    return DT_OK;
}

/* After the vocab and the added tokens: every id's token (the first entry
 * of the file with an id wins). */
static dt_status index_vocab(rd *r, const cJSON *root)
{
    dt_tokenizer *t = r->t;
    t->id_off = malloc(t->nid * sizeof *t->id_off);
    t->id_len = malloc(t->nid * sizeof *t->id_len);
    t->added_by_id = malloc(t->nid * sizeof *t->added_by_id);
    if (!t->id_off || !t->id_len || !t->added_by_id)
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
    memset(t->id_len, 0xff, t->nid * sizeof *t->id_len);
    memset(t->added_by_id, 0xff, t->nid * sizeof *t->added_by_id);
    const cJSON *vocab = get(get(root, "model"), "vocab");
    for (const cJSON *c = vocab->child; c; c = c->next) {
        uint32_t id = (uint32_t)c->valuedouble;
        if (t->id_len[id] != TOK_NONE)
            continue;
        size_t len = strlen(c->string);
        for (size_t i = str_hash(c->string, len) & (t->vocab.cap - 1);; i = (i + 1) & (t->vocab.cap - 1))
            if (t->vocab.len[i] == len && !memcmp(t->pool.p + t->vocab.off[i], c->string, len)) {
                t->id_off[id] = t->vocab.off[i];
                t->id_len[id] = t->vocab.len[i];
                break;
            }
    }
    return DT_OK;
}

static dt_status vocab_id(rd *r, const char *key, const char *tok, uint32_t *id)
{
    *id = dt__tok_strmap_get(&r->t->vocab, &r->t->pool, tok, strlen(tok));
    if (*id == TOK_NONE)
        return kerr(r, DT_ERR_FORMAT, key, "the token \"%.64s\" is not in model.vocab", tok);
    return DT_OK;
}

static dt_status read_merges(rd *r, const cJSON *model)
{
    dt_tokenizer *t = r->t;
    const cJSON *merges = get(model, "merges");
    if (!merges)
        return kerr(r, DT_ERR_FORMAT, "model.merges", "missing (a BPE model needs its merges, [] when none)");
    if (!cJSON_IsArray(merges))
        return kerr(r, DT_ERR_FORMAT, "model.merges", "want a list of [\"a\", \"b\"] pairs or \"a b\" strings");
    int n = cJSON_GetArraySize(merges);
    t->merge_new = malloc((size_t)(n ? n : 1) * sizeof *t->merge_new);
    if (!t->merge_new)
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
    const cJSON *first = merges->child;
    bool legacy = first && cJSON_IsString(first);
    size_t plen = t->prefix ? strlen(t->prefix) : 0;
    char *buf = NULL;
    size_t bufcap = 0;
    dt_status st = DT_OK;
    uint32_t rank = 0;
    int k = 0;
    for (const cJSON *c = merges->child; c; c = c->next, k++) {
        char key[64];
        snprintf(key, sizeof key, "model.merges[%d]", k);
        const char *a, *b;
        size_t al, bl;
        if (legacy) {
            if (!cJSON_IsString(c)) {
                st = kerr(r, DT_ERR_FORMAT, key, "want a string \"a b\" like the entries before it");
                break;
            }
            const char *s = c->valuestring;
            if (!strncmp(s, "#version", 8))
                continue;
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                st = kerr(r, DT_ERR_FORMAT, key,
                          "\"%.64s\" is not two tokens separated by one space (write [\"a\", \"b\"] for tokens "
                          "with spaces)", s);
                break;
            }
            a = s;
            al = (size_t)(sp - s);
            b = sp + 1;
            bl = strlen(b);
        } else {
            if (!cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2 || !cJSON_IsString(c->child) ||
                !cJSON_IsString(c->child->next)) {
                st = kerr(r, DT_ERR_FORMAT, key, "want a pair [\"a\", \"b\"] like the entries before it");
                break;
            }
            a = c->child->valuestring;
            b = c->child->next->valuestring;
            al = strlen(a);
            bl = strlen(b);
        }
        uint32_t ia = dt__tok_strmap_get(&t->vocab, &t->pool, a, al);
        uint32_t ib = dt__tok_strmap_get(&t->vocab, &t->pool, b, bl);
        if (ia == TOK_NONE || ib == TOK_NONE) {
            st = kerr(r, DT_ERR_FORMAT, key, "the token \"%.*s\" is not in model.vocab",
                      (int)(ia == TOK_NONE ? (al > 64 ? 64 : al) : (bl > 64 ? 64 : bl)), ia == TOK_NONE ? a : b);
            break;
        }
        if (bl < plen || (plen && memcmp(b, t->prefix, plen))) {
            st = kerr(r, DT_ERR_FORMAT, key, "the right token does not start with continuing_subword_prefix");
            break;
        }
        if (al + bl - plen + 1 > bufcap) {
            bufcap = (al + bl) * 2 + 16;
            char *nb = realloc(buf, bufcap);
            if (!nb) {
                st = dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
                break;
            }
            buf = nb;
        }
        memcpy(buf, a, al);
        memcpy(buf + al, b + plen, bl - plen);
        uint32_t inew = dt__tok_strmap_get(&t->vocab, &t->pool, buf, al + bl - plen);
        if (inew == TOK_NONE) {
            st = kerr(r, DT_ERR_FORMAT, key, "the merged token \"%.*s\" is not in model.vocab",
                      (int)((al + bl - plen) > 64 ? 64 : al + bl - plen), buf);
            break;
        }
        /* a pair listed twice takes its later rank, as in the library's map */
        if ((st = dt__pairmap_put(&t->merges, ia, ib, rank)) < 0)
            break;
        t->merge_new[rank++] = inew;
    }
    free(buf);
    t->nmerges = rank;
    return st;
}

static dt_status read_model(rd *r, const cJSON *root, uint32_t *maxid)
{
    dt_tokenizer *t = r->t;
    const cJSON *model = get(root, "model");
    if (!model)
        return kerr(r, DT_ERR_FORMAT, "model", "missing");
    if (!cJSON_IsObject(model))
        return kerr(r, DT_ERR_FORMAT, "model", "want an object");
    const char *type;
    dt_status st = opt_str(r, model, "type", "model.type", &type);
    if (st < 0)
        return st;
    if (type && strcmp(type, "BPE"))
        return kerr(r, DT_ERR_UNSUPPORTED, "model.type",
                    "\"%.64s\" is not supported (dtrain reads BPE models: GPT-2, Llama-3, Qwen2 style)", type);
    if (!type && !get(model, "merges"))
        return kerr(r, DT_ERR_FORMAT, "model.type", "missing (dtrain reads BPE models: \"type\": \"BPE\")");
    const cJSON *dropout = get(model, "dropout");
    if (dropout) {
        if (!cJSON_IsNumber(dropout) || dropout->valuedouble < 0 || dropout->valuedouble > 1)
            return kerr(r, DT_ERR_FORMAT, "model.dropout", "want null or a number in [0, 1]");
        if (dropout->valuedouble > 0)
            return kerr(r, DT_ERR_UNSUPPORTED, "model.dropout",
                        "%g: BPE dropout skips merges at random; dtrain encodes deterministically (set it to null)",
                        dropout->valuedouble);
    }
    const char *prefix, *suffix, *unk;
    if ((st = opt_str(r, model, "continuing_subword_prefix", "model.continuing_subword_prefix", &prefix)) < 0 ||
        (st = opt_str(r, model, "end_of_word_suffix", "model.end_of_word_suffix", &suffix)) < 0 ||
        (st = opt_str(r, model, "unk_token", "model.unk_token", &unk)) < 0 ||
        (st = opt_bool(r, model, "fuse_unk", "model.fuse_unk", false, &t->fuse_unk)) < 0 ||
        (st = opt_bool(r, model, "byte_fallback", "model.byte_fallback", false, &t->byte_fallback)) < 0 ||
        (st = opt_bool(r, model, "ignore_merges", "model.ignore_merges", false, &t->ignore_merges)) < 0)
        return st;
    if ((prefix && !(t->prefix = strdup(prefix))) || (suffix && !(t->suffix = strdup(suffix))))
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
    if ((st = read_vocab(r, model, maxid)) < 0)
        return st;
    t->unk = TOK_NONE;
    if (unk && (st = vocab_id(r, "model.unk_token", unk, &t->unk)) < 0)
        return st;
    return read_merges(r, model);
}

/* "added_tokens": ids as the library assigns them (see the top). */
static dt_status read_added(rd *r, const cJSON *root, uint32_t *maxid)
{
    dt_tokenizer *t = r->t;
    const cJSON *arr = get(root, "added_tokens");
    if (!arr)
        return DT_OK;
    if (!cJSON_IsArray(arr))
        return kerr(r, DT_ERR_FORMAT, "added_tokens", "want a list of {id, content, special, ...}");
    int n = cJSON_GetArraySize(arr);
    t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
    if (!t->added)
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
    uint32_t next_id = t->model_vocab_len;
    int k = 0;
    for (const cJSON *c = arr->child; c; c = c->next, k++) {
        char key[64];
        snprintf(key, sizeof key, "added_tokens[%d]", k);
        const char *content;
        uint32_t fid;
        tok_added a = {0};
        dt_status st;
        if (!cJSON_IsObject(c))
            return kerr(r, DT_ERR_FORMAT, key, "want an object {id, content, special, ...}");
        if ((st = opt_str(r, c, "content", key, &content)) < 0)
            return st;
        if (!content)
            return kerr(r, DT_ERR_FORMAT, key, "missing \"content\"");
        if (!get(c, "id") || !as_id(get(c, "id"), &fid))
            return kerr(r, DT_ERR_FORMAT, key, "\"id\" missing or not an integer in 0..%u", MAX_ID - 1);
        if ((st = opt_bool(r, c, "special", key, false, &a.special)) < 0 ||
            (st = opt_bool(r, c, "single_word", key, false, &a.single_word)) < 0 ||
            (st = opt_bool(r, c, "lstrip", key, false, &a.lstrip)) < 0 ||
            (st = opt_bool(r, c, "rstrip", key, false, &a.rstrip)) < 0 ||
            (st = opt_bool(r, c, "normalized", key, !a.special, &a.normalized)) < 0)
            return st;
        size_t len = strlen(content);
        if (len == 0)
            continue;
        uint32_t prev = dt__tok_strmap_get(&t->added_map, &t->pool, content, len);
        if (prev != TOK_NONE) {
            tok_added *p = &t->added[prev];
            if (p->special == a.special && p->single_word == a.single_word && p->lstrip == a.lstrip &&
                p->rstrip == a.rstrip && p->normalized == a.normalized)
                continue; /* the same token again */
            a.id = p->id;
        } else {
            uint32_t vid = dt__tok_strmap_get(&t->vocab, &t->pool, content, len);
            a.id = vid != TOK_NONE ? vid : next_id++;
        }
        if (a.id >= MAX_ID)
            return kerr(r, DT_ERR_FORMAT, key, "id %u is too large", a.id);
        if ((st = dt__tok_pool_add(&t->pool, content, len, &a.off)) < 0)
            return st;
        a.len = (uint32_t)len;
        uint32_t idx = t->nadded++;
        t->added[idx] = a;
        if (prev != TOK_NONE) {
            /* update the content's entry: the newest token with it */
            for (size_t i = 0; i < t->added_map.cap; i++)
                if (t->added_map.len[i] != UINT32_MAX && t->added_map.val[i] == prev)
                    t->added_map.val[i] = idx;
        } else if ((st = dt__tok_strmap_put(&t->added_map, &t->pool, a.off, a.len, idx, NULL)) < 0) {
            return st;
        }
        *maxid = a.id > *maxid ? a.id : *maxid;
    }
    return DT_OK;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The added tokens of one kind (normalized or not), sorted by first byte,
 * then longest first. */
static dt_status build_set(dt_tokenizer *t, tok_addset *s, bool normalized)
{
    uint64_t *keys = malloc((size_t)(t->nadded ? t->nadded : 1) * sizeof *keys);
    s->idx = malloc((size_t)(t->nadded ? t->nadded : 1) * sizeof *s->idx);
    if (!s->idx || !keys) {
        free(keys);
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer: out of memory");
    }
    uint32_t n = 0;
    for (uint32_t id = 0; id < t->nid; id++) {
        uint32_t i = t->added_by_id[id];
        if (i == TOK_NONE || t->added[i].normalized != normalized)
            continue;
        uint64_t b = (unsigned char)t->pool.p[t->added[i].off];
        uint64_t l = t->added[i].len < 0xFFFFFF ? t->added[i].len : 0xFFFFFF;
        keys[n++] = b << 56 | (0xFFFFFF - l) << 32 | i;
    }
    qsort(keys, n, sizeof *keys, cmp_u64);
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        s->start[b] = k;
        while (k < n && (keys[k] >> 56) == (uint64_t)b)
            k++;
    }
    s->start[256] = n;
    for (uint32_t i = 0; i < n; i++)
        s->idx[i] = (uint32_t)keys[i];
    s->n = n;
    free(keys);
    return DT_OK;
}

static dt_status add_pretok(rd *r, const cJSON *v, const char *key)
{
    dt_tokenizer *t = r->t;
    if (!cJSON_IsObject(v))
        return kerr(r, DT_ERR_FORMAT, key, "want an object with a \"type\"");
    const char *type = cJSON_GetStringValue(get(v, "type"));
    if (!type)
        return kerr(r, DT_ERR_FORMAT, key, "missing \"type\"");
    char sub[96];
    dt_status st;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(v, "pretokenizers");
        if (!cJSON_IsArray(list))
            return kerr(r, DT_ERR_FORMAT, key, "a Sequence needs \"pretokenizers\": [...]");
        int k = 0;
        for (const cJSON *c = list->child; c; c = c->next, k++) {
            snprintf(sub, sizeof sub, "%s.pretokenizers[%d]", key, k);
            if ((st = add_pretok(r, c, sub)) < 0)
                return st;
        }
        return DT_OK;
    }
    if (t->npretok == TOK_MAX_PRETOK)
        return kerr(r, DT_ERR_UNSUPPORTED, key, "more than %d pre-tokenizers", TOK_MAX_PRETOK);
    tok_pretok *p = &t->pretok[t->npretok];
    memset(p, 0, sizeof *p);
    if (!strcmp(type, "ByteLevel")) {
        bool use_regex, trim;
        if ((st = opt_bool(r, v, "add_prefix_space", key, true, &p->add_prefix_space)) < 0 ||
            (st = opt_bool(r, v, "trim_offsets", key, true, &trim)) < 0 ||
            (st = opt_bool(r, v, "use_regex", key, true, &use_regex)) < 0)
            return st;
        p->kind = PT_BYTELEVEL;
        if (use_regex && (st = dt__re_compile(dt__tok_gpt2_pattern, "GPT-2's pre-tokenizer regex", &p->re)) < 0)
            return st;
        t->npretok++;
        return DT_OK;
    }
    if (!strcmp(type, "Split")) {
        static const char *beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        const char *b = cJSON_GetStringValue(get(v, "behavior"));
        const cJSON *pat = get(v, "pattern"), *inv = get(v, "invert");
        p->behavior = -1;
        for (int i = 0; b && i < 5; i++)
            if (!strcmp(b, beh[i]))
                p->behavior = i;
        if (p->behavior < 0)
            return kerr(r, DT_ERR_FORMAT, key,
                        "\"behavior\" must be Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
        if (!cJSON_IsBool(inv))
            return kerr(r, DT_ERR_FORMAT, key, "\"invert\" must be true or false");
        p->invert = cJSON_IsTrue(inv);
        const char *rx = cJSON_GetStringValue(get(pat, "Regex")), *lit = cJSON_GetStringValue(get(pat, "String"));
        if (!cJSON_IsObject(pat) || (!rx && !lit))
            return kerr(r, DT_ERR_FORMAT, key, "\"pattern\" must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
        p->kind = PT_SPLIT;
        t->npretok++; /* owned from here: freed with the tokenizer */
        if (rx) {
            snprintf(sub, sizeof sub, "tokenizer.json %s: key %s.pattern.Regex", r->name, key);
            return dt__re_compile(rx, sub, &p->re);
        }
        p->literal_len = strlen(lit);
        if (!(p->literal = strdup(lit)))
            return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
        return DT_OK;
    }
    if (!strcmp(type, "Metaspace")) { /* SentencePiece's: spaces as the replacement, one before a piece */
        const char *rep = "\u2581", *scheme;
        const cJSON *rv = get(v, "replacement");
        size_t l;
        if (rv && (!(rep = cJSON_GetStringValue(rv)) || !*rep || !dt__utf8_valid((const unsigned char *)rep,
                                                                                  strlen(rep), &l) ||
                   (dt__utf8_next((const unsigned char *)rep, strlen(rep), 0, &l), l != strlen(rep))))
            return kerr(r, DT_ERR_FORMAT, key, "a Metaspace's \"replacement\" must be one character");
        bool aps;
        if ((st = opt_str(r, v, "prepend_scheme", key, &scheme)) < 0 ||
            (st = opt_bool(r, v, "add_prefix_space", key, true, &aps)) < 0 ||
            (st = opt_bool(r, v, "split", key, true, &p->split)) < 0)
            return st;
        /* without prepend_scheme, the older add_prefix_space: always or never */
        p->prepend = !scheme ? (aps ? MS_ALWAYS : MS_NEVER) : !strcmp(scheme, "always") ? MS_ALWAYS
                     : !strcmp(scheme, "first") ? MS_FIRST : !strcmp(scheme, "never") ? MS_NEVER : -1;
        if (p->prepend < 0)
            return kerr(r, DT_ERR_FORMAT, key, "a Metaspace's \"prepend_scheme\" must be always, first or never");
        p->kind = PT_METASPACE;
        p->behavior = SB_MERGED_NEXT;
        t->npretok++; /* owned from here: freed with the tokenizer */
        p->literal_len = strlen(rep);
        if (!(p->literal = strdup(rep)))
            return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
        return DT_OK;
    }
    return kerr(r, DT_ERR_UNSUPPORTED, key,
                "pre-tokenizer \"%.64s\" is not supported (ByteLevel, Split, Metaspace and Sequence are)", type);
}

static dt_status push_ids(rd *r, uint32_t **arr, uint32_t *n, const uint32_t *ids, uint32_t k, bool front)
{
    uint32_t *nw = realloc(*arr, (size_t)(*n + k + 1) * sizeof *nw);
    if (!nw)
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r->name);
    if (front) {
        memmove(nw + k, nw, (size_t)*n * sizeof *nw);
        memcpy(nw, ids, (size_t)k * sizeof *nw);
    } else {
        memcpy(nw + *n, ids, (size_t)k * sizeof *nw);
    }
    *arr = nw;
    *n += k;
    return DT_OK;
}

/* One post-processor: its ids before and after the sequence, wrapped
 * around what the earlier ones added. */
static dt_status add_post(rd *r, const cJSON *v, const char *key)
{
    dt_tokenizer *t = r->t;
    const char *type = cJSON_GetStringValue(get(v, "type"));
    char sub[96];
    dt_status st;
    if (!type)
        return kerr(r, DT_ERR_FORMAT, key, "missing \"type\"");
    if (!strcmp(type, "ByteLevel"))
        return DT_OK;
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = get(v, "processors");
        if (!cJSON_IsArray(list))
            return kerr(r, DT_ERR_FORMAT, key, "a Sequence needs \"processors\": [...]");
        int k = 0;
        for (const cJSON *c = list->child; c; c = c->next, k++) {
            snprintf(sub, sizeof sub, "%s.processors[%d]", key, k);
            if ((st = add_post(r, c, sub)) < 0)
                return st;
        }
        return DT_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const cJSON *cls = get(v, "cls"), *sep = get(v, "sep");
        uint32_t a, b;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 ||
            cJSON_GetArraySize(sep) != 2 || !as_id(cls->child->next, &a) || !as_id(sep->child->next, &b))
            return kerr(r, DT_ERR_FORMAT, key, "\"cls\" and \"sep\" must be [\"token\", id]");
        if ((st = push_ids(r, &t->pre_ids, &t->npre, &a, 1, true)) < 0)
            return st;
        return push_ids(r, &t->post_ids, &t->npost, &b, 1, false);
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = get(v, "single"), *specials = get(v, "special_tokens");
        if (!cJSON_IsArray(single))
            return kerr(r, DT_ERR_FORMAT, key, "\"single\" must be a list of pieces");
        uint32_t *pre = NULL, *post = NULL, npre = 0, npost = 0;
        bool seen_a = false;
        st = DT_OK;
        for (const cJSON *c = single->child; c && st == DT_OK; c = c->next) {
            const cJSON *sp = get(c, "SpecialToken");
            if (get(c, "Sequence")) {
                if (seen_a)
                    st = kerr(r, DT_ERR_UNSUPPORTED, key, "\"single\" names the sequence twice");
                seen_a = true;
                continue;
            }
            const char *name = cJSON_GetStringValue(get(sp, "id"));
            const cJSON *tokdef = name ? get(specials, name) : NULL, *ids = get(tokdef, "ids");
            if (!cJSON_IsArray(ids)) {
                st = kerr(r, DT_ERR_FORMAT, key, "special token \"%.64s\" of \"single\" has no \"ids\" in special_tokens",
                          name ? name : "?");
                break;
            }
            for (const cJSON *i = ids->child; i && st == DT_OK; i = i->next) {
                uint32_t id;
                if (!as_id(i, &id))
                    st = kerr(r, DT_ERR_FORMAT, key, "special token \"%.64s\": ids must be integers", name);
                else
                    st = seen_a ? push_ids(r, &post, &npost, &id, 1, false) : push_ids(r, &pre, &npre, &id, 1, false);
            }
        }
        if (st == DT_OK && !seen_a)
            st = kerr(r, DT_ERR_FORMAT, key, "\"single\" has no {\"Sequence\": ...} piece");
        if (st == DT_OK && npre)
            st = push_ids(r, &t->pre_ids, &t->npre, pre, npre, true);
        if (st == DT_OK && npost)
            st = push_ids(r, &t->post_ids, &t->npost, post, npost, false);
        free(pre);
        free(post);
        return st;
    }
    return kerr(r, DT_ERR_UNSUPPORTED, key, "post-processor \"%.64s\" is not supported", type);
}

void dt_tokenizer_free(dt_tokenizer *t)
{
    if (!t)
        return;
    free(t->pool.p);
    dt__tok_strmap_free(&t->vocab);
    dt__tok_strmap_free(&t->added_map);
    free(t->id_off);
    free(t->id_len);
    dt__pairmap_free(&t->merges);
    free(t->merge_new);
    free(t->prefix);
    free(t->suffix);
    free(t->added);
    free(t->added_by_id);
    free(t->raw_set.idx);
    free(t->norm_set.idx);
    for (int i = 0; i < t->npretok; i++) {
        dt__re_free(t->pretok[i].re);
        free(t->pretok[i].literal);
    }
    for (int i = 0; i < t->nnorm; i++)
        dt__tok_norm_free(&t->norm[i]);
    for (int i = 0; i < t->ndec; i++) {
        free(t->dec[i].from);
        free(t->dec[i].to);
    }
    free(t->pre_ids);
    free(t->post_ids);
    free(t->chat_template);
    free(t->chat_template_src);
    free(t->cfg_pad);
    free(t);
}

static dt_status check_ids(rd *r, const uint32_t *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] >= r->t->nid || (r->t->id_len[ids[i]] == TOK_NONE && r->t->added_by_id[ids[i]] == TOK_NONE))
            return kerr(r, DT_ERR_FORMAT, "post_processor", "special token id %u is neither in the vocab nor added",
                        ids[i]);
    return DT_OK;
}

dt_status dt_tokenizer_load_mem(const void *json, size_t n, const char *name, dt_tokenizer **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_load_mem: out is NULL");
    *out = NULL;
    if (!json && n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_load_mem: NULL buffer");
    rd r = {.name = name ? name : "<memory>"};
    size_t bad = 0; /* the tokenizers library reads the file as UTF-8 first ("stream did not contain valid UTF-8") */
    if (!dt__utf8_valid(json, n, &bad))
        return dt_error(DT_ERR_FORMAT, "tokenizer.json %s: not valid UTF-8 (byte %zu)", r.name, bad);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, n, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = at && at >= (const char *)json && at <= (const char *)json + n ? (size_t)(at - (const char *)json) : 0;
        return dt_error(DT_ERR_FORMAT, "tokenizer.json %s: not valid JSON (near byte %zu)", r.name, pos);
    }
    dt_status st = DT_OK;
    for (const char *p = end ? end : (const char *)json + n; p < (const char *)json + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            st = dt_error(DT_ERR_FORMAT, "tokenizer.json %s: text after the JSON value (byte %zu)", r.name,
                          (size_t)(p - (const char *)json));
            break;
        }
    if (st == DT_OK && !cJSON_IsObject(root))
        st = dt_error(DT_ERR_FORMAT, "tokenizer.json %s: not a JSON object", r.name);
    dt_tokenizer *t = st == DT_OK ? calloc(1, sizeof *t) : NULL;
    if (st == DT_OK && !t)
        st = dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", r.name);
    r.t = t;
    const cJSON *ver = st == DT_OK ? get(root, "version") : NULL;
    if (ver && (!cJSON_IsString(ver) || strcmp(ver->valuestring, "1.0")))
        st = kerr(&r, DT_ERR_FORMAT, "version", "\"%.32s\" is not a known tokenizer version (want \"1.0\")",
                  cJSON_IsString(ver) ? ver->valuestring : "?");
    uint32_t maxid = 0;
    if (st == DT_OK)
        st = read_model(&r, root, &maxid);
    if (st == DT_OK)
        st = read_added(&r, root, &maxid);
    if (st == DT_OK) {
        t->nid = maxid + 1;
        st = index_vocab(&r, root);
    }
    for (uint32_t i = 0; st == DT_OK && i < t->nadded; i++)
        t->added_by_id[t->added[i].id] = i; /* the last token given an id holds it */
    if (st == DT_OK && (st = build_set(t, &t->raw_set, false)) == DT_OK)
        st = build_set(t, &t->norm_set, true);
    if (st == DT_OK)
        st = dt__tok_read_normalizer(t, r.name, root);
    const cJSON *pt = st == DT_OK ? get(root, "pre_tokenizer") : NULL;
    if (pt)
        st = add_pretok(&r, pt, "pre_tokenizer");
    if (st == DT_OK)
        st = dt__tok_read_decoder(t, r.name, root);
    const cJSON *pp = st == DT_OK ? get(root, "post_processor") : NULL;
    if (pp && (st = add_post(&r, pp, "post_processor")) == DT_OK && (st = check_ids(&r, t->pre_ids, t->npre)) == DT_OK)
        st = check_ids(&r, t->post_ids, t->npost);
    cJSON_Delete(root);
    if (st < 0) {
        dt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

/* Key `key` ("bos_token", "eos_token") of tokenizer_config.json root cfg: a string, or an object whose "content" is
 * one (older files write an AddedToken); null or absent: none (*has false). A token that is not one of t's
 * (transformers would add it as a new id, past the model's vocabulary): an error naming the file and the key. */
static dt_status config_token(const dt_tokenizer *t, const cJSON *root, const char *cfg, const char *key,
                              uint32_t *id, bool *has)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, key);
    if (cJSON_IsObject(e))
        e = cJSON_GetObjectItemCaseSensitive(e, "content");
    *has = false;
    if (!e || cJSON_IsNull(e))
        return DT_OK;
    if (!cJSON_IsString(e))
        return dt_error(DT_ERR_FORMAT, "%s: key \"%s\": want a token's text (or null)", cfg, key);
    if (dt_tokenizer_token_id(t, e->valuestring, id) < 0)
        return dt_error(DT_ERR_FORMAT, "%s: key \"%s\": \"%.64s\" is not a token of the tokenizer (transformers "
                        "would add it as a new id, past the model's vocabulary)", cfg, key, e->valuestring);
    *has = true;
    return DT_OK;
}

dt_status dt_tokenizer_apply_config(dt_tokenizer *t, const char *json, size_t n, const char *name)
{
    if (!t || !json || !name)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_apply_config: NULL argument");
    cJSON *root = NULL;
    dt_status st = dt__json_parse_strict(json, n, name, &root);
    if (st < 0)
        return st;
    uint32_t bos = 0, eos = 0;
    bool hb = false, he = false;
    char *chat = NULL, *src = NULL, *pad = NULL;
    if (!cJSON_IsObject(root))
        st = dt_error(DT_ERR_FORMAT, "%s: not a JSON object", name);
    else if ((st = config_token(t, root, name, "eos_token", &eos, &he)) >= 0 &&
             (st = config_token(t, root, name, "bos_token", &bos, &hb)) >= 0)
        st = dt__tok_config_chat(root, name, &chat);
    if (st >= 0) { /* the pad token's text: only a chat template reads it (pad_token) */
        const cJSON *pe = cJSON_GetObjectItemCaseSensitive(root, "pad_token");
        if (cJSON_IsObject(pe))
            pe = cJSON_GetObjectItemCaseSensitive(pe, "content");
        if (cJSON_IsString(pe) && !(pad = strdup(pe->valuestring)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    }
    if (st >= 0 && chat) {
        size_t k = strlen(name) + 32;
        if ((src = malloc(k)))
            snprintf(src, k, "%s's chat_template", name);
        else
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    }
    cJSON_Delete(root);
    if (st < 0) {
        free(chat);
        free(src);
        free(pad);
        return st;
    }
    /* all or nothing */
    t->cfg_bos = bos, t->has_cfg_bos = hb, t->cfg_eos = eos, t->has_cfg_eos = he;
    free(t->chat_template);
    free(t->chat_template_src);
    free(t->cfg_pad);
    t->chat_template = chat, t->chat_template_src = src, t->cfg_pad = pad;
    return st;
}

/* transformers' tokenizer.bos_token, .eos_token and .chat_template: those a tokenizer_config.json beside the
 * tokenizer.json at path names, when there is one (dt_tokenizer_apply_config), and the template of a
 * chat_template.jinja beside it, which replaces the config's (as transformers reads them). No files: nothing. */
dt_status dt_tokenizer_apply_beside(dt_tokenizer *t, const char *path)
{
    if (!t || !path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_apply_beside: NULL argument");
    char cfg[4200];
    const char *slash = strrchr(path, '/');
    const int dl = slash ? (int)(slash - path) : 0;
    snprintf(cfg, sizeof cfg, "%.*s%stokenizer_config.json", dl, path, slash ? "/" : "");
    char *txt = NULL;
    size_t len = 0;
    dt_status st = dt_file_read_all(cfg, (size_t)64 << 20, &txt, &len);
    if (st == DT_ERR_NOT_FOUND)
        dt_error_clear();
    else if (st >= 0)
        st = dt_tokenizer_apply_config(t, txt, len, cfg);
    free(txt);
    txt = NULL;
    if (st < 0 && st != DT_ERR_NOT_FOUND)
        return st;
    snprintf(cfg, sizeof cfg, "%.*s%schat_template.jinja", dl, path, slash ? "/" : "");
    st = dt_file_read_all(cfg, (size_t)1 << 20, &txt, &len);
    if (st == DT_ERR_NOT_FOUND) {
        dt_error_clear();
        return DT_OK;
    }
    if (st >= 0)
        st = dt_tokenizer_set_chat_template(t, txt, len, cfg);
    free(txt);
    return st;
}

dt_status dt_tokenizer_load(const char *path, dt_tokenizer **out)
{
    if (!out || !path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_load: NULL argument");
    *out = NULL;
    char full[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (snprintf(full, sizeof full, "%s/tokenizer.json", path) >= (int)sizeof full)
            return dt_error(DT_ERR_INVALID_ARG, "tokenizer %s: path too long", path);
        path = full;
    }
    const char *why;
    FILE *f = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    if (!f)
        return dt_error(DT_ERR_IO, "tokenizer.json %s: cannot open: %s", path, why);
    size_t cap = 1 << 16, len = 0, got;
    char *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = cap <= DT_TOKENIZER_MAX_FILE ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    dt_status st;
    if (!buf)
        st = dt_error(DT_ERR_IO, "tokenizer.json %s: larger than %zu MiB or out of memory", path,
                      DT_TOKENIZER_MAX_FILE >> 20);
    else if (err)
        st = dt_error(DT_ERR_IO, "tokenizer.json %s: read error", path);
    else
        st = dt_tokenizer_load_mem(buf, len, path, out);
    free(buf);
    if (st >= 0 && (st = dt_tokenizer_apply_beside(*out, path)) < 0) {
        dt_tokenizer_free(*out);
        *out = NULL;
    }
    return st;
}

int64_t dt_tokenizer_vocab_size(const dt_tokenizer *t) { return t ? t->nid : 0; }

dt_status dt_tokenizer_token_id(const dt_tokenizer *t, const char *s, uint32_t *id)
{
    if (!t || !s || !id)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_token_id: NULL argument");
    size_t n = strlen(s);
    uint32_t a = dt__tok_strmap_get(&t->added_map, &t->pool, s, n);
    *id = a != TOK_NONE ? t->added[a].id : dt__tok_strmap_get(&t->vocab, &t->pool, s, n);
    if (*id == TOK_NONE)
        return dt_error(DT_ERR_NOT_FOUND, "tokenizer: no token \"%.64s\"", s);
    return DT_OK;
}

dt_status dt_tokenizer_eos(const dt_tokenizer *t, uint32_t *id)
{
    static const char *names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"};
    if (!t || !id)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_eos: NULL argument");
    if (t->has_cfg_eos) { /* tokenizer_config.json's eos_token: transformers' tokenizer.eos_token */
        *id = t->cfg_eos;
        return DT_OK;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        uint32_t a = dt__tok_strmap_get(&t->added_map, &t->pool, names[i], strlen(names[i]));
        if (a != TOK_NONE && t->added[a].special) {
            *id = t->added[a].id;
            return DT_OK;
        }
    }
    return dt_error(DT_ERR_NOT_FOUND,
                    "tokenizer: no end-of-document token (none of <|endoftext|>, <|end_of_text|>, </s>, <eos>, "
                    "<|im_end|> is a special added token): name one as \"eos_token\" in a tokenizer_config.json "
                    "beside the tokenizer.json, as transformers reads it");
}
