/* Reading a tokenizer.json's normalizer and decoder (tok_impl.h), and
 * decoding through a decoder of several steps.
 *
 * Normalizers read: NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace
 * (String or Regex pattern), Strip and Sequence of them (Qwen2's NFC,
 * Llama-2's Sequence [Prepend "▁", Replace " " -> "▁"]). Decoders: ByteLevel,
 * and Replace (String pattern), ByteFallback, Fuse, Strip and Sequence of
 * them (Llama-2's). Anything else is refused naming the file and the key.
 *
 * The steps decode as the library's decode_chain does, except that
 * ByteFallback keeps bytes that are not valid UTF-8 as they are (the library
 * writes U+FFFD for each): dt_tokenizer_decode returns bytes exactly. */
#include "tok_impl.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status kerr(const char *name, dt_status code, const char *key, const char *fmt, ...) DT_PRINTF(4, 5);
static dt_status kerr(const char *name, dt_status code, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(code, "tokenizer.json %s: key %s: %s", name, key, msg);
}

static const cJSON *get(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static dt_status dup_str(const char *name, const char *s, char **out, size_t *len)
{
    *len = strlen(s);
    if (!(*out = strdup(s)))
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer.json %s: out of memory", name);
    return DT_OK;
}

typedef dt_status (*add_fn)(dt_tokenizer *t, const char *name, const cJSON *v, const char *key);

/* A Sequence: each element of v's array `list` through add, named
 * key.list[k] in errors. */
static dt_status add_each(dt_tokenizer *t, const char *name, const cJSON *v, const char *list, const char *key,
                          add_fn add)
{
    const cJSON *arr = get(v, list);
    if (!cJSON_IsArray(arr))
        return kerr(name, DT_ERR_FORMAT, key, "a Sequence needs \"%s\": [...]", list);
    int k = 0;
    for (const cJSON *c = arr->child; c; c = c->next, k++) {
        char sub[128];
        snprintf(sub, sizeof sub, "%s.%s[%d]", key, list, k);
        dt_status st = add(t, name, c, sub);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

static dt_status add_norm(dt_tokenizer *t, const char *name, const cJSON *v, const char *key)
{
    if (!cJSON_IsObject(v))
        return kerr(name, DT_ERR_FORMAT, key, "want an object with a \"type\"");
    const char *type = cJSON_GetStringValue(get(v, "type"));
    if (!type)
        return kerr(name, DT_ERR_FORMAT, key, "missing \"type\"");
    char sub[128];
    dt_status st;
    if (!strcmp(type, "Sequence"))
        return add_each(t, name, v, "normalizers", key, add_norm);
    static const char *forms[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"};
    static const int kinds[] = {NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE};
    int kind = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(type, forms[i]))
            kind = kinds[i];
    if (kind < 0 && strcmp(type, "Prepend") && strcmp(type, "Replace") && strcmp(type, "Strip"))
        return kerr(name, DT_ERR_UNSUPPORTED, key,
                    "normalizer \"%.64s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Strip "
                    "and Sequence are)",
                    type);
    if (t->nnorm == TOK_MAX_NORM)
        return kerr(name, DT_ERR_UNSUPPORTED, key, "more than %d normalizers", TOK_MAX_NORM);
    tok_norm *nm = &t->norm[t->nnorm];
    memset(nm, 0, sizeof *nm);
    nm->kind = kind;
    if (kind >= 0) {
        t->nnorm++;
        return DT_OK;
    }
    if (!strcmp(type, "Strip")) {
        const cJSON *l = get(v, "strip_left"), *r = get(v, "strip_right");
        if ((l && !cJSON_IsBool(l)) || (r && !cJSON_IsBool(r)))
            return kerr(name, DT_ERR_FORMAT, key, "\"strip_left\" and \"strip_right\" must be true or false");
        nm->kind = NORM_STRIP;
        nm->left = cJSON_IsTrue(l);
        nm->right = cJSON_IsTrue(r);
        t->nnorm++;
        return DT_OK;
    }
    if (!strcmp(type, "Prepend")) {
        const char *pre = cJSON_GetStringValue(get(v, "prepend"));
        if (!pre)
            return kerr(name, DT_ERR_FORMAT, key, "a Prepend needs \"prepend\": \"...\"");
        nm->kind = NORM_PREPEND;
        t->nnorm++; /* owned from here: freed with the tokenizer */
        return dup_str(name, pre, &nm->str, &nm->str_len);
    }
    const cJSON *pat = get(v, "pattern");
    const char *rx = cJSON_GetStringValue(get(pat, "Regex")), *lit = cJSON_GetStringValue(get(pat, "String"));
    const char *content = cJSON_GetStringValue(get(v, "content"));
    if (!cJSON_IsObject(pat) || (!rx && !lit) || !content)
        return kerr(name, DT_ERR_FORMAT, key,
                    "a Replace needs \"pattern\": {\"String\": \"...\"} or {\"Regex\": \"...\"} and \"content\"");
    nm->kind = NORM_REPLACE;
    t->nnorm++;
    if ((st = dup_str(name, content, &nm->content, &nm->content_len)) < 0)
        return st;
    if (lit)
        return dup_str(name, lit, &nm->str, &nm->str_len);
    snprintf(sub, sizeof sub, "tokenizer.json %s: key %s.pattern.Regex", name, key);
    return dt__re_compile(rx, sub, &nm->re);
}

dt_status dt__tok_read_normalizer(dt_tokenizer *t, const char *name, const void *root)
{
    const cJSON *v = get(root, "normalizer");
    return v ? add_norm(t, name, v, "normalizer") : DT_OK;
}

/* ---- decoders ----------------------------------------------------------------------------- */

static dt_status add_dec(dt_tokenizer *t, const char *name, const cJSON *v, const char *key)
{
    if (!cJSON_IsObject(v))
        return kerr(name, DT_ERR_FORMAT, key, "want an object with a \"type\"");
    const char *type = cJSON_GetStringValue(get(v, "type"));
    if (!type)
        return kerr(name, DT_ERR_FORMAT, key, "missing \"type\"");
    dt_status st;
    if (!strcmp(type, "Sequence"))
        return add_each(t, name, v, "decoders", key, add_dec);
    if (t->ndec == TOK_MAX_DEC)
        return kerr(name, DT_ERR_UNSUPPORTED, key, "more than %d decoders", TOK_MAX_DEC);
    tok_dec *d = &t->dec[t->ndec];
    memset(d, 0, sizeof *d);
    if (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")) {
        d->kind = type[0] == 'F' ? DEC_FUSE : type[4] == 'L' ? DEC_BYTELEVEL : DEC_BYTEFALLBACK;
        t->ndec++;
        return DT_OK;
    }
    if (!strcmp(type, "Strip")) {
        const char *c = cJSON_GetStringValue(get(v, "content"));
        const cJSON *a = get(v, "start"), *b = get(v, "stop");
        size_t l;
        if (!c || !*c || !dt__utf8_valid((const unsigned char *)c, strlen(c), &l) ||
            (dt__utf8_next((const unsigned char *)c, strlen(c), 0, &l), l != strlen(c)) || !cJSON_IsNumber(a) ||
            !cJSON_IsNumber(b) || a->valuedouble < 0 || b->valuedouble < 0 || a->valuedouble > 1e6 ||
            b->valuedouble > 1e6)
            return kerr(name, DT_ERR_FORMAT, key, "a Strip needs \"content\" (one character), \"start\" and \"stop\" "
                        "(counts)");
        d->kind = DEC_STRIP;
        d->strip_cp = dt__utf8_next((const unsigned char *)c, strlen(c), 0, &l);
        d->strip_start = (int)a->valuedouble;
        d->strip_stop = (int)b->valuedouble;
        t->ndec++;
        return DT_OK;
    }
    if (!strcmp(type, "Replace")) {
        const cJSON *pat = get(v, "pattern");
        const char *lit = cJSON_GetStringValue(get(pat, "String")), *content = cJSON_GetStringValue(get(v, "content"));
        if (!lit || !*lit || !content)
            return kerr(name, DT_ERR_UNSUPPORTED, key,
                        "a Replace decoder needs \"pattern\": {\"String\": \"...\"} (non-empty) and \"content\"");
        d->kind = DEC_REPLACE;
        t->ndec++;
        if ((st = dup_str(name, lit, &d->from, &d->from_len)) < 0)
            return st;
        return dup_str(name, content, &d->to, &d->to_len);
    }
    if (!strcmp(type, "Metaspace")) { /* the replacement back to spaces, the first token's dropped */
        const cJSON *rv = get(v, "replacement"), *ps = get(v, "prepend_scheme"), *aps = get(v, "add_prefix_space");
        const char *rep = rv ? cJSON_GetStringValue(rv) : "\u2581", *scheme = cJSON_GetStringValue(ps);
        size_t l;
        if (!rep || !*rep || !dt__utf8_valid((const unsigned char *)rep, strlen(rep), &l) ||
            (dt__utf8_next((const unsigned char *)rep, strlen(rep), 0, &l), l != strlen(rep)))
            return kerr(name, DT_ERR_FORMAT, key, "a Metaspace's \"replacement\" must be one character");
        if ((ps && (!scheme || (strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never")))) ||
            (aps && !cJSON_IsBool(aps)))
            return kerr(name, DT_ERR_FORMAT, key, "a Metaspace's \"prepend_scheme\" must be always, first or never "
                        "(or the older \"add_prefix_space\" true or false)");
        d->kind = DEC_METASPACE;
        d->strip_cp = dt__utf8_next((const unsigned char *)rep, strlen(rep), 0, &l);
        d->ms_first = scheme ? strcmp(scheme, "never") != 0 : !aps || cJSON_IsTrue(aps);
        t->ndec++;
        return DT_OK;
    }
    return kerr(name, DT_ERR_UNSUPPORTED, key,
                "decoder \"%.64s\" is not supported (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and "
                "Sequence are)", type);
}

dt_status dt__tok_read_decoder(dt_tokenizer *t, const char *name, const void *root)
{
    const cJSON *v = get(root, "decoder");
    t->byte_decoder = false;
    t->ndec = 0;
    if (!v)
        return DT_OK;
    dt_status st = add_dec(t, name, v, "decoder");
    if (st == DT_OK && t->ndec == 1 && t->dec[0].kind == DEC_BYTELEVEL) { /* the fast path of dt_tokenizer_decode */
        t->byte_decoder = true;
        t->ndec = 0;
    }
    return st;
}

/* ---- decoding through the steps ------------------------------------------------------------- */

typedef struct toklist {
    unsigned char *buf; /* the tokens' bytes, one after the other */
    size_t *off, *len;  /* (n) */
    size_t n, used, cap, ncap;
} toklist;

static dt_status tl_add(toklist *l, const void *s, size_t n, bool join)
{
    if (l->used + n > l->cap || !l->buf) {
        size_t cap = l->cap ? l->cap : 256;
        while (cap < l->used + n)
            cap *= 2;
        unsigned char *b = realloc(l->buf, cap);
        if (!b)
            return dt_error(DT_ERR_NO_MEMORY, "tokenizer decode: out of memory");
        l->buf = b;
        l->cap = cap;
    }
    if (!join || l->n == 0) {
        if (l->n == l->ncap) {
            size_t nc = l->ncap ? l->ncap * 2 : 64;
            size_t *o = realloc(l->off, nc * sizeof *o);
            if (o)
                l->off = o;
            size_t *q = realloc(l->len, nc * sizeof *q);
            if (q)
                l->len = q;
            if (!o || !q)
                return dt_error(DT_ERR_NO_MEMORY, "tokenizer decode: out of memory");
            l->ncap = nc;
        }
        l->off[l->n] = l->used;
        l->len[l->n++] = 0;
    }
    if (n)
        memcpy(l->buf + l->used, s, n);
    l->used += n;
    l->len[l->n - 1] += n;
    return DT_OK;
}

static void tl_free(toklist *l)
{
    free(l->buf);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

/* "<0xXX>" (uppercase or lowercase hex): its byte, else -1. */
static int byte_token(const unsigned char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        int c = s[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* One step from in to out. */
static dt_status dec_step(const tok_dec *d, const toklist *in, toklist *out)
{
    dt_status st = DT_OK;
    for (size_t i = 0; i < in->n && st == DT_OK; i++) {
        const unsigned char *s = in->buf + in->off[i];
        size_t n = in->len[i];
        switch (d->kind) {
        case DEC_FUSE:
            st = tl_add(out, s, n, true);
            break;
        case DEC_BYTEFALLBACK: {
            int b = byte_token(s, n);
            unsigned char c = (unsigned char)b;
            /* a run of byte tokens becomes one token of their bytes */
            bool prev_byte = i > 0 && byte_token(in->buf + in->off[i - 1], in->len[i - 1]) >= 0;
            st = b >= 0 ? tl_add(out, &c, 1, prev_byte) : tl_add(out, s, n, false);
            break;
        }
        case DEC_REPLACE: {
            size_t from = 0;
            st = tl_add(out, "", 0, false);
            while (st == DT_OK && from < n) {
                const unsigned char *hit =
                    n - from >= d->from_len ? memmem(s + from, n - from, d->from, d->from_len) : NULL;
                size_t upto = hit ? (size_t)(hit - s) : n;
                st = tl_add(out, s + from, upto - from, true);
                if (st == DT_OK && hit)
                    st = tl_add(out, d->to, d->to_len, true);
                from = hit ? upto + d->from_len : n;
            }
            break;
        }
        case DEC_STRIP: {
            size_t a = 0, b = n, l;
            for (int k = 0; k < d->strip_start && a < b; k++) {
                if (dt__utf8_next(s, n, a, &l) != d->strip_cp)
                    break;
                a += l;
            }
            for (int k = 0; k < d->strip_stop && b > a; k++) {
                size_t j = b - 1;
                while (j > a && (s[j] & 0xC0) == 0x80)
                    j--;
                if (dt__utf8_next(s, n, j, &l) != d->strip_cp)
                    break;
                b = j;
            }
            st = tl_add(out, s + a, b - a, false);
            break;
        }
        case DEC_METASPACE: { /* each replacement a space; in the first token none (prepend_scheme not never) */
            size_t l;
            st = tl_add(out, "", 0, false);
            for (size_t k = 0; k < n && st == DT_OK; k += l) {
                const bool rep = dt__utf8_next(s, n, k, &l) == d->strip_cp;
                if (!rep)
                    st = tl_add(out, s + k, l, true);
                else if (i > 0 || !d->ms_first)
                    st = tl_add(out, " ", 1, true);
            }
            break;
        }
        case DEC_BYTELEVEL: { /* every character one of GPT-2's byte characters: their bytes; else the token */
            size_t l;
            bool all = true;
            for (size_t k = 0; k < n && all; k += l)
                all = dt__tok_char_byte(dt__utf8_next(s, n, k, &l)) >= 0;
            if (!all) {
                st = tl_add(out, s, n, true);
                break;
            }
            st = tl_add(out, "", 0, true);
            for (size_t k = 0; k < n && st == DT_OK; k += l) {
                unsigned char c = (unsigned char)dt__tok_char_byte(dt__utf8_next(s, n, k, &l));
                st = tl_add(out, &c, 1, true);
            }
            break;
        }
        }
    }
    return st;
}

dt_status dt__tok_decode_chain(const dt_tokenizer *t, const unsigned char **toks, const size_t *lens, size_t n,
                               char **text, size_t *len)
{
    toklist a = {0}, b = {0};
    dt_status st = DT_OK;
    for (size_t i = 0; i < n && st == DT_OK; i++)
        st = tl_add(&a, toks[i], lens[i], false);
    for (int k = 0; k < t->ndec && st == DT_OK; k++) {
        b.n = b.used = 0;
        st = dec_step(&t->dec[k], &a, &b);
        toklist x = a;
        a = b;
        b = x;
    }
    char *out = st == DT_OK ? malloc(a.used + 1) : NULL;
    if (st == DT_OK && !out)
        st = dt_error(DT_ERR_NO_MEMORY, "tokenizer decode: out of memory");
    if (st == DT_OK) {
        size_t o = 0;
        for (size_t i = 0; i < a.n; i++) { /* the library joins what the steps leave */
            memcpy(out + o, a.buf + a.off[i], a.len[i]);
            o += a.len[i];
        }
        out[o] = 0;
        *text = out;
        *len = o;
    }
    tl_free(&a);
    tl_free(&b);
    return st;
}
