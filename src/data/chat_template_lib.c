/* Chat templates (chat_template.h): the filters, tests, methods and
 * globals, and json.dumps as transformers' tojson calls it.
 *
 * Filters: abs, capitalize, count, d/default, dictsort, e/escape, first,
 * float, indent, int, items, join, last, length, list, lower, map, max, min,
 * reject, rejectattr, replace, reverse, round, safe, select, selectattr,
 * sort, string, sum, title, tojson, trim, unique, upper, wordcount; jinja2's
 * others are refused by name. safe is the identity (no autoescape here).
 * Tests: jinja2's, all but 'escaped', 'filter' and 'test' answered
 * as jinja2 does. Methods: str's strip/lstrip/rstrip, split/rsplit,
 * splitlines, startswith/endswith, upper/lower/title/capitalize/swapcase,
 * replace, find/rfind, count, join, removeprefix/removesuffix, is*; dict's
 * get/items/keys/values; list's index/count; loop.cycle. Methods that
 * would change a list or dict are refused as the sandbox refuses them
 * (SecurityError). Globals: raise_exception, strftime_now, namespace,
 * range (at most 100,000 items, as the sandbox), dict. */
#include "chat_template_impl.h"
#include "tok_norm.h"
#include "tok_regex.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- arguments ------------------------------------------------------------------------------------- */

#define MAX_PARAMS 6

/* Bind args to the parameters named in spec ("a b c"): slot i gets the
 * value or CT_ABSENT. Too many positional arguments or an unknown keyword
 * is jinja2's TypeError. */
static void bind(ct_ctx *c, int line, const char *what, const char *spec, size_t n, const ct_val *args,
                 const char *const *kw, ct_val *slot)
{
    const char *names[MAX_PARAMS];
    size_t lens[MAX_PARAMS], np = 0;
    for (const char *s = spec; *s && np < MAX_PARAMS;) {
        while (*s == ' ')
            s++;
        if (!*s)
            break;
        const char *e = strchr(s, ' ');
        lens[np] = e ? (size_t)(e - s) : strlen(s);
        names[np++] = s;
        s += lens[np - 1];
    }
    for (size_t i = 0; i < MAX_PARAMS; i++)
        slot[i].k = CT_ABSENT;
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = pos;
        if (kw && kw[i]) {
            for (j = 0; j < np && (strlen(kw[i]) != lens[j] || memcmp(kw[i], names[j], lens[j])); j++)
                ;
            if (j == np)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s got an unexpected keyword argument '%s'", what,
                        kw[i]);
            if (slot[j].k != CT_ABSENT)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s got multiple values for argument '%s'", what,
                        kw[i]);
        } else if (pos++ >= np) {
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes at most %zu argument(s), %zu given", what, np,
                    n);
        }
        slot[j] = args[i];
    }
}

static bool given(ct_val v)
{
    return v.k != CT_ABSENT;
}

static int64_t want_int(ct_ctx *c, int line, const char *what, ct_val v, int64_t def)
{
    if (!given(v))
        return def;
    if (v.k == CT_INT || v.k == CT_BOOL)
        return v.k == CT_INT ? v.u.i : v.u.b;
    ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s must be an integer, not '%s'", what, ct_type_name(v));
}

static ct_val want_str(ct_ctx *c, int line, const char *what, ct_val v)
{
    if (v.k != CT_STR)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s must be a string, not '%s'", what, ct_type_name(v));
    return v;
}

/* ---- Unicode text ---------------------------------------------------------------------------------- */

static uint32_t cp_at(const char *p, size_t n, size_t i, size_t *len)
{
    return dt__utf8_next((const unsigned char *)p, n, i, len);
}

static void put_cp(ct_buf *b, uint32_t cp)
{
    char u[4];
    size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (k == 1) {
        u[0] = (char)cp;
    } else {
        for (size_t i = k - 1; i > 0; i--, cp >>= 6)
            u[i] = (char)(0x80 | (cp & 0x3F));
        u[0] = (char)((k == 2 ? 0xC0 : k == 3 ? 0xE0 : 0xF0) | cp);
    }
    ct_buf_put(b, u, k);
}

static bool is_space(uint32_t cp)
{
    return dt__unicode_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}


static uint32_t to_upper(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    if (dt__unicode_gc(cp) != DT_GC_Ll)
        return cp;
    for (size_t i = 0; i < dt__unorm_nlower; i++)
        if (dt__unorm_lower[i][1] == cp && dt__unicode_gc(dt__unorm_lower[i][0]) == DT_GC_Lu)
            return dt__unorm_lower[i][0];
    return cp;
}

static bool is_cased(uint32_t cp)
{
    int g = dt__unicode_gc(cp);
    return g == DT_GC_Lu || g == DT_GC_Ll || g == DT_GC_Lt;
}

/* mode: 'l' lower, 'u' upper, 's' swapcase, 't' str.title, 'c' capitalize, 'j' jinja2's title filter */
static ct_val recase(ct_ctx *c, ct_val s, int mode)
{
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    bool prev_cased = false, first = true;
    for (size_t i = 0, len; i < s.u.s.n; i += len) {
        uint32_t cp = cp_at(s.u.s.p, s.u.s.n, i, &len), o = cp;
        switch (mode) {
        case 'l': o = dt__unorm_to_lower(cp); break;
        case 'u': o = to_upper(cp); break;
        case 's': o = dt__unicode_gc(cp) == DT_GC_Lu ? dt__unorm_to_lower(cp) : to_upper(cp); break;
        case 't':
            o = prev_cased ? dt__unorm_to_lower(cp) : to_upper(cp);
            prev_cased = is_cased(cp);
            break;
        case 'c': o = first ? to_upper(cp) : dt__unorm_to_lower(cp); break;
        case 'j': {
            bool sep = is_space(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            o = sep ? cp : prev_cased ? dt__unorm_to_lower(cp) : to_upper(cp);
            prev_cased = !sep; /* "inside a word" */
            break;
        }
        }
        first = false;
        put_cp(&b, o);
    }
    return ct_str(b.p, b.n);
}

static bool in_chars(uint32_t cp, ct_val chars)
{
    if (chars.k != CT_STR)
        return is_space(cp);
    for (size_t i = 0, len; i < chars.u.s.n; i += len)
        if (cp_at(chars.u.s.p, chars.u.s.n, i, &len) == cp)
            return true;
    return false;
}

/* str.strip/lstrip/rstrip (which: 'b', 'l', 'r'); chars CT_STR or whitespace. */
static ct_val strip(ct_val s, ct_val chars, int which)
{
    const char *p = s.u.s.p;
    size_t a = 0, e = s.u.s.n, len;
    if (which != 'r')
        while (a < e && in_chars(cp_at(p, e, a, &len), chars))
            a += len;
    if (which != 'l')
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            if (!in_chars(cp_at(p, e, st, &len), chars))
                break;
            e = st;
        }
    return ct_str(p + a, e - a);
}

void dt__chat_py_strip(const char *s, size_t n, int which, size_t *start, size_t *end)
{
    ct_val r = strip(ct_str(s, n), (ct_val){.k = CT_ABSENT}, which);
    *start = (size_t)(r.u.s.p - s);
    *end = *start + r.u.s.n;
}

static const char *find(const char *h, size_t hn, const char *n, size_t nn)
{
    return nn ? memmem(h, hn, n, nn) : h;
}

static const char *rfind(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn > hn)
        return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, n, nn))
            return h + i;
    return NULL;
}

/* str.split / str.rsplit (rev). sep CT_STR or whitespace runs. */
static ct_val split(ct_ctx *c, int line, ct_val s, ct_val sep, int64_t maxsplit, bool rev)
{
    ct_list *l = ct_list_new(c, 4);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (sep.k == CT_STR) {
        if (!sep.u.s.n)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: empty separator");
        ct_list *parts = ct_list_new(c, 4);
        if (!rev) {
            size_t a = 0;
            const char *f;
            while ((maxsplit < 0 || (int64_t)parts->n < maxsplit) &&
                   (f = find(p + a, n - a, sep.u.s.p, sep.u.s.n))) {
                ct_list_push(c, parts, ct_str(p + a, (size_t)(f - p) - a));
                a = (size_t)(f - p) + sep.u.s.n;
            }
            ct_list_push(c, parts, ct_str(p + a, n - a));
            return ct_list_val(parts);
        }
        size_t e = n;
        const char *f;
        while ((maxsplit < 0 || (int64_t)parts->n < maxsplit) && (f = rfind(p, e, sep.u.s.p, sep.u.s.n))) {
            size_t at = (size_t)(f - p) + sep.u.s.n;
            ct_list_push(c, parts, ct_str(p + at, e - at));
            e = (size_t)(f - p);
        }
        ct_list_push(c, parts, ct_str(p, e));
        for (size_t i = 0; i < parts->n; i++)
            ct_list_push(c, l, parts->v[parts->n - 1 - i]);
        return ct_list_val(l);
    }
    /* whitespace: runs split, no empty strings; the rest after maxsplit kept as is (its far side stripped) */
    size_t len;
    if (!rev) {
        size_t i = 0;
        for (;;) {
            while (i < n && is_space(cp_at(p, n, i, &len)))
                i += len;
            if (i >= n)
                break;
            if (maxsplit >= 0 && (int64_t)l->n == maxsplit) {
                ct_val rest = strip(ct_str(p + i, n - i), (ct_val){.k = CT_NONE}, 'r');
                ct_list_push(c, l, rest);
                break;
            }
            size_t a = i;
            while (i < n && !is_space(cp_at(p, n, i, &len)))
                i += len;
            ct_list_push(c, l, ct_str(p + a, i - a));
        }
        return ct_list_val(l);
    }
    ct_list *parts = ct_list_new(c, 4);
    size_t e = n;
    for (;;) {
        while (e > 0) {
            size_t st = e - 1;
            while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            if (!is_space(cp_at(p, e, st, &len)))
                break;
            e = st;
        }
        if (!e)
            break;
        if (maxsplit >= 0 && (int64_t)parts->n == maxsplit) {
            ct_list_push(c, parts, strip(ct_str(p, e), (ct_val){.k = CT_NONE}, 'l'));
            break;
        }
        size_t a = e;
        while (a > 0) {
            size_t st = a - 1;
            while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80)
                st--;
            if (is_space(cp_at(p, a, st, &len)))
                break;
            a = st;
        }
        ct_list_push(c, parts, ct_str(p + a, e - a));
        e = a;
    }
    for (size_t i = 0; i < parts->n; i++)
        ct_list_push(c, l, parts->v[parts->n - 1 - i]);
    return ct_list_val(l);
}

/* str.splitlines: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029. */
static ct_list *splitlines(ct_ctx *c, ct_val s, bool keepends)
{
    ct_list *l = ct_list_new(c, 4);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, a = 0, len;
    for (size_t i = 0; i < n; i += len) {
        uint32_t cp = cp_at(p, n, i, &len);
        if (cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
            cp == 0x2028 || cp == 0x2029) {
            size_t end = i + len;
            if (cp == '\r' && end < n && p[end] == '\n')
                end++;
            ct_list_push(c, l, ct_str(p + a, (keepends ? end : i) - a));
            a = end;
            len = end - i;
        }
    }
    if (a < n)
        ct_list_push(c, l, ct_str(p + a, n - a));
    return l;
}

static ct_val replace(ct_ctx *c, ct_val s, ct_val old, ct_val new_, int64_t count)
{
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, a = 0;
    int64_t done = 0;
    if (!old.u.s.n) { /* between every code point, and at both ends */
        size_t len;
        for (size_t i = 0; i <= n; i += len) {
            if (count < 0 || done < count) {
                ct_buf_put(&b, new_.u.s.p, new_.u.s.n);
                done++;
            }
            if (i == n)
                break;
            cp_at(p, n, i, &len);
            ct_buf_put(&b, p + i, len);
        }
        return ct_str(b.p, b.n);
    }
    const char *f;
    while ((count < 0 || done < count) && (f = find(p + a, n - a, old.u.s.p, old.u.s.n))) {
        ct_buf_put(&b, p + a, (size_t)(f - p) - a);
        ct_buf_put(&b, new_.u.s.p, new_.u.s.n);
        a = (size_t)(f - p) + old.u.s.n;
        done++;
    }
    ct_buf_put(&b, p + a, n - a);
    return ct_str(b.p, b.n);
}

static int64_t count_sub(ct_val s, ct_val sub)
{
    if (!sub.u.s.n)
        return (int64_t)ct_utf8_count(s.u.s.p, s.u.s.n) + 1;
    int64_t k = 0;
    const char *f;
    for (size_t a = 0; (f = find(s.u.s.p + a, s.u.s.n - a, sub.u.s.p, sub.u.s.n)); k++)
        a = (size_t)(f - s.u.s.p) + sub.u.s.n;
    return k;
}

static ct_val join(ct_ctx *c, int line, ct_val sep, ct_list *items, bool strict)
{
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    for (size_t i = 0; i < items->n; i++) {
        if (i)
            ct_buf_put(&b, sep.u.s.p, sep.u.s.n);
        if (strict && items->v[i].k != CT_STR)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: sequence item %zu: expected str instance, %s found", i,
                    ct_type_name(items->v[i]));
        ct_str_into(&b, items->v[i]);
    }
    return ct_str(b.p, b.n);
}

/* ---- json.dumps ------------------------------------------------------------------------------------ */

typedef struct json_opts {
    bool ascii, indent, sort;
    ct_val ind;              /* the indent string */
    ct_val item_sep, key_sep;
} json_opts;

static void json_str(ct_buf *b, const char *p, size_t n, bool ascii)
{
    ct_buf_put(b, "\"", 1);
    for (size_t i = 0, len; i < n; i += len) {
        uint32_t cp = cp_at(p, n, i, &len);
        switch (cp) {
        case '"': ct_buf_puts(b, "\\\""); continue;
        case '\\': ct_buf_puts(b, "\\\\"); continue;
        case '\n': ct_buf_puts(b, "\\n"); continue;
        case '\r': ct_buf_puts(b, "\\r"); continue;
        case '\t': ct_buf_puts(b, "\\t"); continue;
        case '\b': ct_buf_puts(b, "\\b"); continue;
        case '\f': ct_buf_puts(b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (ascii && cp >= 0x7F)) {
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000;
                ct_buf_printf(b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else {
                ct_buf_printf(b, "\\u%04x", (unsigned)cp);
            }
        } else {
            ct_buf_put(b, p + i, len);
        }
    }
    ct_buf_put(b, "\"", 1);
}

static void json_newline(ct_buf *b, const json_opts *o, int level)
{
    ct_buf_put(b, "\n", 1);
    for (int i = 0; i < level; i++)
        ct_buf_put(b, o->ind.u.s.p, o->ind.u.s.n);
}

static void msort(ct_ctx *c, int line, const ct_val *keys, size_t *idx, size_t *tmp, size_t n, bool reverse);

static void json_val(ct_ctx *c, int line, ct_buf *b, ct_val v, const json_opts *o, int level)
{
    switch (v.k) {
    case CT_NONE: ct_buf_puts(b, "null"); return;
    case CT_BOOL: ct_buf_puts(b, v.u.b ? "true" : "false"); return;
    case CT_INT:
    case CT_FLOAT: ct_str_into(b, v); if (v.k == CT_FLOAT && !isfinite(v.u.f)) {
            b->n -= v.u.f != v.u.f ? 3 : v.u.f < 0 ? 4 : 3;
            ct_buf_puts(b, v.u.f != v.u.f ? "NaN" : v.u.f < 0 ? "-Infinity" : "Infinity");
        }
        return;
    case CT_STR: json_str(b, v.u.s.p, v.u.s.n, o->ascii); return;
    case CT_LIST: {
        const ct_list *l = v.u.l;
        if (l->range)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: tojson: Object of type range is not JSON serializable");
        if (!l->n) {
            ct_buf_puts(b, "[]");
            return;
        }
        if (++c->depth > CT_MAX_DEPTH)
            ct_fail(c, line, DT_ERR_RANGE, "tojson: a value nested deeper than %d levels (the limit)", CT_MAX_DEPTH);
        ct_buf_put(b, "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                ct_buf_put(b, o->item_sep.u.s.p, o->item_sep.u.s.n);
            if (o->indent)
                json_newline(b, o, level + 1);
            json_val(c, line, b, l->v[i], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        ct_buf_put(b, "]", 1);
        c->depth--;
        return;
    }
    case CT_DICT: {
        const ct_dict *d = v.u.d;
        if (!d->n) {
            ct_buf_puts(b, "{}");
            return;
        }
        if (++c->depth > CT_MAX_DEPTH)
            ct_fail(c, line, DT_ERR_RANGE, "tojson: a value nested deeper than %d levels (the limit)", CT_MAX_DEPTH);
        size_t *idx = ct_alloc(c, d->n * sizeof *idx), *tmp = ct_alloc(c, d->n * sizeof *tmp);
        for (size_t i = 0; i < d->n; i++)
            idx[i] = i;
        if (o->sort)
            msort(c, line, d->k, idx, tmp, d->n, false);
        ct_buf_put(b, "{", 1);
        for (size_t j = 0; j < d->n; j++) {
            size_t i = idx[j];
            if (j)
                ct_buf_put(b, o->item_sep.u.s.p, o->item_sep.u.s.n);
            if (o->indent)
                json_newline(b, o, level + 1);
            ct_val k = d->k[i];
            if (k.k == CT_STR) {
                json_str(b, k.u.s.p, k.u.s.n, o->ascii);
            } else if (k.k == CT_NONE || k.k == CT_BOOL || k.k == CT_INT || k.k == CT_FLOAT) {
                ct_buf kb = {.c = c};
                ct_buf_put(&kb, "", 0);
                json_val(c, line, &kb, k, o, level);
                json_str(b, kb.p, kb.n, false);
            } else {
                ct_fail(c, line, DT_ERR_INVALID_ARG,
                        "TypeError: tojson: keys must be str, int, float, bool or None, not %s", ct_type_name(k));
            }
            ct_buf_put(b, o->key_sep.u.s.p, o->key_sep.u.s.n);
            json_val(c, line, b, d->v[i], o, level + 1);
        }
        if (o->indent)
            json_newline(b, o, level);
        ct_buf_put(b, "}", 1);
        c->depth--;
        return;
    }
    default:
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: tojson: Object of type %s is not JSON serializable",
                ct_type_name(v));
    }
}

static ct_val tojson(ct_ctx *c, int line, ct_val v, const ct_val *a)
{
    json_opts o = {.ascii = ct_truthy(a[0]), .sort = ct_truthy(a[3]), .key_sep = ct_cstr(": ")};
    if (given(a[1]) && a[1].k != CT_NONE) {
        o.indent = true;
        if (a[1].k == CT_STR) {
            o.ind = a[1];
        } else {
            int64_t k = want_int(c, line, "tojson's indent", a[1], 0);
            if (k > 4096)
                ct_fail(c, line, DT_ERR_RANGE, "tojson: indent %lld is more than 4096 (the limit)", (long long)k);
            char *sp = ct_alloc(c, (size_t)(k > 0 ? k : 0) + 1);
            memset(sp, ' ', (size_t)(k > 0 ? k : 0));
            o.ind = ct_str(sp, (size_t)(k > 0 ? k : 0));
        }
    }
    o.item_sep = ct_cstr(o.indent ? "," : ", ");
    if (given(a[2]) && a[2].k != CT_NONE) {
        if (a[2].k != CT_LIST || a[2].u.l->n != 2 || a[2].u.l->v[0].k != CT_STR || a[2].u.l->v[1].k != CT_STR)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
        o.item_sep = a[2].u.l->v[0];
        o.key_sep = a[2].u.l->v[1];
    }
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    json_val(c, line, &b, v, &o, 0);
    return ct_str(b.p, b.n);
}

/* ---- sorting: a stable merge sort (errors may longjmp out of it) ------------------------------------- */

static void msort(ct_ctx *c, int line, const ct_val *keys, size_t *idx, size_t *tmp, size_t n, bool reverse)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(c, line, keys, idx, tmp, h, reverse);
    msort(c, line, keys, idx + h, tmp, n - h, reverse);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r = ct_cmp(c, line, keys[idx[j]], keys[idx[i]], "sort");
        if (reverse ? r > 0 : r < 0)
            tmp[k++] = idx[j++];
        else
            tmp[k++] = idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

/* ---- filters --------------------------------------------------------------------------------------- */

/* jinja2's attribute getter: "a.b.0" looks up a, then b, then item 0. */
static ct_val attr_path(ct_ctx *c, int line, ct_val v, ct_val path)
{
    if (path.k == CT_INT)
        return ct_getitem(c, line, v, path);
    want_str(c, line, "attribute", path);
    const char *p = path.u.s.p, *e = p + path.u.s.n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(e - p);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++)
            digits &= p[i] >= '0' && p[i] <= '9';
        ct_val key = digits && n < 18 ? ct_int(strtoll(ct_strdup(c, p, n), NULL, 10)) : ct_str(p, n);
        v = ct_getitem(c, line, v, key);
        if (!dot)
            break;
        p = dot + 1;
    }
    return v;
}

static ct_val lower_key(ct_ctx *c, ct_val v, bool case_sensitive)
{
    return !case_sensitive && v.k == CT_STR ? recase(c, v, 'l') : v;
}

/* Sorted copy of items by key (attribute path, lower-cased strings unless case_sensitive). */
static ct_list *sorted(ct_ctx *c, int line, ct_list *items, ct_val attr, bool case_sensitive, bool reverse)
{
    size_t n = items->n;
    ct_val *keys = ct_alloc(c, (n + 1) * sizeof *keys);
    size_t *idx = ct_alloc(c, (n + 1) * sizeof *idx), *tmp = ct_alloc(c, (n + 1) * sizeof *tmp);
    for (size_t i = 0; i < n; i++) {
        ct_val k = given(attr) && attr.k != CT_NONE ? attr_path(c, line, items->v[i], attr) : items->v[i];
        keys[i] = lower_key(c, k, case_sensitive);
        idx[i] = i;
    }
    ct_tick(c, line, n);
    msort(c, line, keys, idx, tmp, n, reverse);
    ct_list *l = ct_list_new(c, n);
    for (size_t i = 0; i < n; i++)
        l->v[i] = items->v[idx[i]];
    l->n = n;
    return l;
}

static ct_val html_escape(ct_ctx *c, ct_val s)
{
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        const char *r = ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : ch == '"' ? "&#34;"
                      : ch == '\'' ? "&#39;" : NULL;
        if (r)
            ct_buf_puts(&b, r);
        else
            ct_buf_put(&b, &ch, 1);
    }
    return ct_str(b.p, b.n);
}

static ct_val indent(ct_ctx *c, int line, ct_val s, const ct_val *a)
{
    ct_val ind;
    if (given(a[0]) && a[0].k == CT_STR) {
        ind = a[0];
    } else {
        int64_t w = want_int(c, line, "indent's width", a[0], 4);
        if (w > 4096)
            ct_fail(c, line, DT_ERR_RANGE, "indent: width %lld is more than 4096 (the limit)", (long long)w);
        char *sp = ct_alloc(c, (size_t)(w > 0 ? w : 0) + 1);
        memset(sp, ' ', (size_t)(w > 0 ? w : 0));
        ind = ct_str(sp, (size_t)(w > 0 ? w : 0));
    }
    bool first = ct_truthy(a[1]), blank = ct_truthy(a[2]);
    ct_buf t = {.c = c};
    ct_buf_put(&t, s.u.s.p, s.u.s.n);
    ct_buf_put(&t, "\n", 1);
    ct_list *lines = splitlines(c, ct_str(t.p, t.n), false);
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    if (first)
        ct_buf_put(&b, ind.u.s.p, ind.u.s.n);
    for (size_t i = 0; i < lines->n; i++) {
        ct_val ln = lines->v[i];
        if (i) {
            ct_buf_put(&b, "\n", 1);
            if (blank || ln.u.s.n)
                ct_buf_put(&b, ind.u.s.p, ind.u.s.n);
        }
        ct_buf_put(&b, ln.u.s.p, ln.u.s.n);
    }
    return ct_str(b.p, b.n);
}

/* Python's int(str, base) / float(str), for the int and float filters; false if it does not parse. */
static bool parse_int(ct_ctx *c, ct_val s, int base, int64_t *out)
{
    ct_val t = strip(s, (ct_val){.k = CT_NONE}, 'b');
    char *z = ct_strdup(c, t.u.s.p, t.u.s.n), *w = z;
    for (char *r = z; *r; r++) /* underscores between digits */
        if (*r != '_' || r == z || !r[1] || r[1] == '_')
            *w++ = *r;
    *w = 0;
    if (!*z || strchr(z, ' '))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(z, &end, base);
    if (*end || errno)
        return false;
    *out = v;
    return true;
}

static bool parse_float(ct_ctx *c, ct_val s, double *out)
{
    ct_val t = strip(s, (ct_val){.k = CT_NONE}, 'b');
    char *z = ct_strdup(c, t.u.s.p, t.u.s.n), *end;
    if (!*z || (z[0] == '0' && (z[1] | 0x20) == 'x'))
        return false;
    *out = strtod(z, &end);
    return !*end;
}

static ct_val f_length(ct_ctx *c, int line, ct_val v)
{
    switch (v.k) {
    case CT_UNDEF: return ct_int(0);
    case CT_STR: return ct_int((int64_t)ct_utf8_count(v.u.s.p, v.u.s.n));
    case CT_LIST: return ct_int((int64_t)v.u.l->n);
    case CT_DICT: return ct_int((int64_t)v.u.d->n);
    default: ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: object of type '%s' has no len()", ct_type_name(v));
    }
}

static ct_val f_round(ct_ctx *c, int line, ct_val v, const ct_val *a)
{
    int64_t prec = want_int(c, line, "round's precision", a[0], 0);
    const char *method = given(a[1]) ? want_str(c, line, "round's method", a[1]).u.s.p : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        ct_fail(c, line, DT_ERR_INVALID_ARG, "FilterArgumentError: method must be common, ceil or floor");
    if (v.k != CT_INT && v.k != CT_BOOL && v.k != CT_FLOAT)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: round: '%s' is not a number", ct_type_name(v));
    if (prec < -308 || prec > 308)
        prec = prec < 0 ? -308 : 308;
    double x = v.k == CT_FLOAT ? v.u.f : (double)(v.k == CT_INT ? v.u.i : v.u.b), p10 = pow(10, (double)prec);
    if (!strcmp(method, "common")) {
        if (v.k != CT_FLOAT && prec >= 0)
            return v.k == CT_BOOL ? ct_int(v.u.b) : v;
        if (!isfinite(x))
            return ct_float(x);
        if (prec >= 0) { /* correctly rounded, ties to even: what printf does, and Python's round */
            char tmp[400];
            snprintf(tmp, sizeof tmp, "%.*f", (int)prec, x);
            return ct_float(strtod(tmp, NULL));
        }
        double r = rint(x / (1 / p10)) * (1 / p10);
        return v.k == CT_FLOAT ? ct_float(r) : ct_int((int64_t)r);
    }
    double r = (!strcmp(method, "ceil") ? ceil(x * p10) : floor(x * p10)) / p10;
    return ct_float(r);
}

static ct_val minmax(ct_ctx *c, int line, ct_val v, const ct_val *a, bool max)
{
    ct_list *items = ct_iter(c, line, v);
    if (!items->n)
        return ct_undef(c, "No aggregated item, sequence was empty.");
    bool cs = ct_truthy(a[0]);
    ct_val best = items->v[0];
    ct_val bk = lower_key(c, given(a[1]) && a[1].k != CT_NONE ? attr_path(c, line, best, a[1]) : best, cs);
    for (size_t i = 1; i < items->n; i++) {
        ct_val k = lower_key(c, given(a[1]) && a[1].k != CT_NONE ? attr_path(c, line, items->v[i], a[1])
                                                                : items->v[i], cs);
        int r = ct_cmp(c, line, k, bk, max ? ">" : "<");
        if (max ? r > 0 : r < 0) {
            best = items->v[i];
            bk = k;
        }
    }
    ct_tick(c, line, items->n);
    return best;
}

/* select/reject (attr: selectattr/rejectattr): keep the items a test passes (keep) or fails. */
static ct_val select_items(ct_ctx *c, int line, ct_val v, size_t n, const ct_val *args, const char *const *kw,
                           bool attr, bool keep)
{
    ct_list *items = ct_truthy(v) ? ct_iter(c, line, v) : ct_list_new(c, 0), *out = ct_list_new(c, items->n);
    size_t skip = attr ? 2 : 1;
    if (attr && (n < 1 || (kw && kw[0])))
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s needs the attribute to test",
                keep ? "selectattr" : "rejectattr");
    const char *test = NULL;
    if (n >= skip && !(kw && kw[skip - 1])) {
        test = want_str(c, line, "the test's name", args[skip - 1]).u.s.p;
        if (!ct_test_known(test))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TemplateRuntimeError: no test named '%s'", test);
    } else {
        skip--;
    }
    ct_tick(c, line, items->n);
    for (size_t i = 0; i < items->n; i++) {
        ct_val x = attr ? attr_path(c, line, items->v[i], args[0]) : items->v[i];
        bool ok = test ? ct_test(c, line, test, x, n - skip, args + skip, kw ? kw + skip : NULL) : ct_truthy(x);
        if (ok == keep)
            ct_list_push(c, out, items->v[i]);
    }
    return ct_list_val(out);
}

static ct_val f_map(ct_ctx *c, int line, ct_val v, size_t n, const ct_val *args, const char *const *kw)
{
    /* jinja2 maps and selects nothing from a false value, iterable or not */
    ct_list *items = ct_truthy(v) ? ct_iter(c, line, v) : ct_list_new(c, 0), *out = ct_list_new(c, items->n);
    ct_tick(c, line, items->n);
    if (n && !(kw && kw[0])) { /* map('filter', args...) */
        const char *f = want_str(c, line, "map's filter name", args[0]).u.s.p;
        bool supported;
        if (!ct_filter_known(f, &supported) || !supported)
            ct_fail(c, line, supported ? DT_ERR_INVALID_ARG : DT_ERR_UNSUPPORTED, "map: %s filter named '%s'",
                    supported ? "no" : "unsupported:", f);
        for (size_t i = 0; i < items->n; i++)
            ct_list_push(c, out, ct_filter(c, line, f, items->v[i], n - 1, args + 1, kw ? kw + 1 : NULL));
        return ct_list_val(out);
    }
    ct_val a[MAX_PARAMS];
    bind(c, line, "map", "attribute default", n, args, kw, a);
    if (!given(a[0]))
        return ct_list_val(items); /* jinja2: no filter and no attribute maps nothing */
    for (size_t i = 0; i < items->n; i++) {
        ct_val x = attr_path(c, line, items->v[i], a[0]);
        if (x.k == CT_UNDEF && given(a[1]))
            x = a[1];
        ct_list_push(c, out, x);
    }
    return ct_list_val(out);
}

static const char *const FILTERS[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "format", "indent",
    "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace",
    "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim",
    "unique", "upper", "wordcount", NULL};
static const char *const FILTERS_LEFT_OUT[] = {
    "attr", "batch", "center", "filesizeformat", "forceescape", "groupby", "pprint", "random", "slice",
    "striptags", "truncate", "urlencode", "urlize", "wordwrap", "xmlattr", NULL};

bool ct_filter_known(const char *name, bool *supported)
{
    for (size_t i = 0; FILTERS[i]; i++)
        if (!strcmp(FILTERS[i], name))
            return *supported = true;
    for (size_t i = 0; FILTERS_LEFT_OUT[i]; i++)
        if (!strcmp(FILTERS_LEFT_OUT[i], name)) {
            *supported = false;
            return true;
        }
    *supported = true;
    return false;
}

ct_val ct_filter(ct_ctx *c, int line, const char *name, ct_val v, size_t n, const ct_val *args,
                 const char *const *kw)
{
    char what[64];
    snprintf(what, sizeof what, "the '%s' filter", name);
    bool supported;
    if (!ct_filter_known(name, &supported) || !supported)
        ct_fail(c, line, supported ? DT_ERR_FORMAT : DT_ERR_UNSUPPORTED, supported ? "no filter named '%s'"
                : "the '%s' filter", name);
    if (!strcmp(name, "map"))
        return f_map(c, line, v, n, args, kw);
    if (!strcmp(name, "select") || !strcmp(name, "reject") || !strcmp(name, "selectattr") ||
        !strcmp(name, "rejectattr"))
        return select_items(c, line, v, n, args, kw, strstr(name, "attr") != NULL,
                            name[0] == 's');
    if (!strcmp(name, "format")) { /* jinja2's do_format: str(v) % (the positional arguments, or the keyword ones) */
        size_t nk = 0;
        for (size_t i = 0; kw && i < n; i++)
            nk += kw[i] != NULL;
        if (nk && nk < n)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "FilterArgumentError: can't handle positional and keyword arguments "
                    "at the same time");
        ct_val fa;
        if (nk) {
            ct_dict *d = ct_dict_new(c);
            for (size_t i = 0; i < n; i++)
                ct_dict_set(c, d, ct_cstr(kw[i]), args[i]);
            fa = (ct_val){.k = CT_DICT, .u.d = d};
        } else {
            ct_list *t = ct_list_new(c, n);
            for (size_t i = 0; i < n; i++)
                ct_list_push(c, t, args[i]);
            t->tuple = true;
            fa = ct_list_val(t);
        }
        return ct_format(c, line, ct_to_str(c, v), fa);
    }
    ct_val a[MAX_PARAMS];
    const char *spec = !strcmp(name, "trim") ? "chars"
                       : !strcmp(name, "replace") ? "old new count"
                       : !strcmp(name, "default") || !strcmp(name, "d") ? "default_value boolean"
                       : !strcmp(name, "join") ? "d attribute"
                       : !strcmp(name, "sort") ? "reverse case_sensitive attribute"
                       : !strcmp(name, "unique") ? "case_sensitive attribute"
                       : !strcmp(name, "min") || !strcmp(name, "max") ? "case_sensitive attribute"
                       : !strcmp(name, "sum") ? "attribute start"
                       : !strcmp(name, "int") ? "default base"
                       : !strcmp(name, "float") ? "default"
                       : !strcmp(name, "round") ? "precision method"
                       : !strcmp(name, "indent") ? "width first blank"
                       : !strcmp(name, "tojson") ? "ensure_ascii indent separators sort_keys"
                       : !strcmp(name, "dictsort") ? "case_sensitive by reverse"
                       : "";
    bind(c, line, what, spec, n, args, kw, a);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        ct_val def = given(a[0]) ? a[0] : ct_str("", 0);
        return v.k == CT_UNDEF || (ct_truthy(a[1]) && !ct_truthy(v)) ? def : v;
    }
    if (!strcmp(name, "length") || !strcmp(name, "count"))
        return f_length(c, line, v);
    if (!strcmp(name, "tojson"))
        return tojson(c, line, v, a);
    if (!strcmp(name, "safe"))
        return v;
    if (!strcmp(name, "string"))
        return ct_to_str(c, v);
    if (!strcmp(name, "list")) {
        ct_list *it = ct_iter(c, line, v), *l = ct_list_new(c, it->n);
        ct_copy_vals(l->v, it->v, it->n);
        l->n = it->n;
        return ct_list_val(l);
    }
    if (!strcmp(name, "items")) {
        if (v.k == CT_UNDEF)
            return ct_list_val(ct_list_new(c, 0));
        if (v.k != CT_DICT)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: items: can only get item pairs from a mapping");
        ct_list *l = ct_list_new(c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            ct_list *t = ct_list_new(c, 2);
            ct_list_push(c, t, v.u.d->k[i]);
            ct_list_push(c, t, v.u.d->v[i]);
            t->tuple = true;
            ct_list_push(c, l, ct_list_val(t));
        }
        return ct_list_val(l);
    }
    if (!strcmp(name, "dictsort")) {
        if (v.k != CT_DICT)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "FilterArgumentError: dictsort: not a mapping");
        const char *by = given(a[1]) ? want_str(c, line, "dictsort's by", a[1]).u.s.p : "key";
        ct_list *pairs = ct_list_new(c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            ct_list *t = ct_list_new(c, 2);
            ct_list_push(c, t, v.u.d->k[i]);
            ct_list_push(c, t, v.u.d->v[i]);
            t->tuple = true;
            ct_list_push(c, pairs, ct_list_val(t));
        }
        return ct_list_val(sorted(c, line, pairs, ct_int(strcmp(by, "value") ? 0 : 1), ct_truthy(a[0]),
                                  ct_truthy(a[2])));
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        ct_list *it = ct_iter(c, line, v);
        if (!it->n)
            return ct_undef(c, "No %s item, sequence was empty.", name);
        return it->v[name[0] == 'f' ? 0 : it->n - 1];
    }
    if (!strcmp(name, "reverse")) {
        ct_list *it = ct_iter(c, line, v), *l = ct_list_new(c, it->n);
        for (size_t i = 0; i < it->n; i++)
            l->v[i] = it->v[it->n - 1 - i];
        l->n = it->n;
        if (v.k != CT_STR)
            return ct_list_val(l);
        return join(c, line, ct_str("", 0), l, false);
    }
    if (!strcmp(name, "join")) {
        ct_list *it = ct_iter(c, line, v);
        if (given(a[1]) && a[1].k != CT_NONE) {
            ct_list *l = ct_list_new(c, it->n);
            for (size_t i = 0; i < it->n; i++)
                l->v[l->n++] = attr_path(c, line, it->v[i], a[1]);
            it = l;
        }
        ct_tick(c, line, it->n);
        return join(c, line, given(a[0]) ? ct_to_str(c, a[0]) : ct_str("", 0), it, false);
    }
    if (!strcmp(name, "sort"))
        return ct_list_val(sorted(c, line, ct_iter(c, line, v), a[2], ct_truthy(a[1]), ct_truthy(a[0])));
    if (!strcmp(name, "unique")) {
        ct_list *it = ct_iter(c, line, v), *out = ct_list_new(c, it->n), *seen = ct_list_new(c, it->n);
        ct_tick(c, line, it->n);
        for (size_t i = 0; i < it->n; i++) {
            ct_val k = lower_key(c, given(a[1]) && a[1].k != CT_NONE ? attr_path(c, line, it->v[i], a[1]) : it->v[i],
                                 ct_truthy(a[0]));
            if (!ct_contains(c, line, ct_list_val(seen), k)) {
                ct_list_push(c, seen, k);
                ct_list_push(c, out, it->v[i]);
            }
        }
        return ct_list_val(out);
    }
    if (!strcmp(name, "min") || !strcmp(name, "max"))
        return minmax(c, line, v, a, name[1] == 'a');
    if (!strcmp(name, "sum")) {
        ct_list *it = ct_iter(c, line, v);
        ct_val s = given(a[1]) ? a[1] : ct_int(0);
        ct_tick(c, line, it->n);
        for (size_t i = 0; i < it->n; i++)
            s = ct_binop(c, line, '+', s,
                         given(a[0]) && a[0].k != CT_NONE ? attr_path(c, line, it->v[i], a[0]) : it->v[i]);
        return s;
    }
    if (!strcmp(name, "abs")) {
        if (v.k == CT_FLOAT)
            return ct_float(fabs(v.u.f));
        if (v.k == CT_INT || v.k == CT_BOOL) {
            ct_val x = v.k == CT_BOOL ? ct_int(v.u.b) : v;
            return x.u.i < 0 ? ct_neg(c, line, x, true) : x;
        }
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: bad operand type for abs(): '%s'", ct_type_name(v));
    }
    if (!strcmp(name, "round"))
        return f_round(c, line, v, a);
    if (!strcmp(name, "int")) {
        ct_val def = given(a[0]) ? a[0] : ct_int(0);
        int64_t base = want_int(c, line, "int's base", a[1], 10), i;
        double f;
        if (v.k == CT_UNDEF)
            ct_fail_undef(c, line, v);
        if (v.k == CT_INT)
            return v;
        if (v.k == CT_BOOL)
            return ct_int(v.u.b);
        if (v.k == CT_FLOAT) {
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
                ct_fail(c, line, DT_ERR_UNSUPPORTED, "int: %g does not fit 64 bits", v.u.f);
            return ct_int((int64_t)v.u.f);
        }
        if (v.k == CT_STR) {
            if (base >= 2 && base <= 36 && parse_int(c, v, (int)base, &i))
                return ct_int(i);
            if (parse_float(c, v, &f) && isfinite(f) && fabs(f) < 9.2e18)
                return ct_int((int64_t)f);
        }
        return def;
    }
    if (!strcmp(name, "float")) {
        ct_val def = given(a[0]) ? a[0] : ct_float(0);
        double f;
        if (v.k == CT_UNDEF)
            ct_fail_undef(c, line, v);
        if (v.k == CT_FLOAT)
            return v;
        if (v.k == CT_INT || v.k == CT_BOOL)
            return ct_float(v.k == CT_INT ? (double)v.u.i : v.u.b);
        if (v.k == CT_STR && parse_float(c, v, &f))
            return ct_float(f);
        return def;
    }
    /* the rest work on str(value) */
    ct_val s = ct_to_str(c, v);
    if (!strcmp(name, "trim"))
        return strip(s, given(a[0]) ? a[0] : (ct_val){.k = CT_NONE}, 'b');
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "capitalize") || !strcmp(name, "title"))
        return recase(c, s, name[0] == 'u' ? 'u' : name[0] == 'l' ? 'l' : name[0] == 'c' ? 'c' : 'j');
    if (!strcmp(name, "replace")) {
        if (!given(a[0]) || !given(a[1]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: replace needs the old and the new string");
        return replace(c, s, ct_to_str(c, a[0]), ct_to_str(c, a[1]),
                       given(a[2]) && a[2].k != CT_NONE ? want_int(c, line, "replace's count", a[2], -1) : -1);
    }
    if (!strcmp(name, "escape") || !strcmp(name, "e"))
        return html_escape(c, s);
    if (!strcmp(name, "indent")) {
        if (v.k != CT_STR) /* jinja2 appends "\n" to the value itself */
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: indent: '%s' is not a string", ct_type_name(v));
        return indent(c, line, s, a);
    }
    if (!strcmp(name, "wordcount")) {
        int64_t k = 0;
        bool in = false;
        for (size_t i = 0, len; i < s.u.s.n; i += len) {
            bool w = dt__unicode_word(cp_at(s.u.s.p, s.u.s.n, i, &len));
            k += w && !in;
            in = w;
        }
        return ct_int(k);
    }
    ct_fail(c, line, DT_ERR_INTERNAL, "chat template: filter '%s' has no implementation", name);
}

/* ---- tests ------------------------------------------------------------------------------------------- */

static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false", "filter",
    "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=", "lower", "lt", "<",
    "lessthan", "mapping", "ne", "!=", "none", "number", "odd", "sameas", "sequence", "string", "test", "true",
    "undefined", "upper", NULL};

bool ct_test_known(const char *name)
{
    for (size_t i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name))
            return true;
    return false;
}

static bool str_all(ct_val s, int mode)
{
    bool any_cased = false;
    for (size_t i = 0, len; i < s.u.s.n; i += len) {
        uint32_t cp = cp_at(s.u.s.p, s.u.s.n, i, &len);
        int g = dt__unicode_gc(cp);
        switch (mode) {
        case 'l': /* islower: no upper/title case, at least one cased */
        case 'u':
            if (g == DT_GC_Lt || g == (mode == 'l' ? DT_GC_Lu : DT_GC_Ll))
                return false;
            any_cased |= g == DT_GC_Lu || g == DT_GC_Ll;
            break;
        case 'd':
            if (g != DT_GC_Nd && !(cp >= 0xB2 && cp <= 0xB3) && cp != 0xB9 && !(cp >= 0x2070 && cp <= 0x2089))
                return false;
            break;
        case 'a':
            if (!(g >= DT_GC_Lu && g <= DT_GC_Lo))
                return false;
            break;
        case 'n':
            if (!(g >= DT_GC_Lu && g <= DT_GC_Lo) && !(g >= DT_GC_Nd && g <= DT_GC_No))
                return false;
            break;
        case 's':
            if (!is_space(cp))
                return false;
            break;
        }
    }
    return mode == 'l' || mode == 'u' ? any_cased : s.u.s.n > 0;
}

bool ct_test(ct_ctx *c, int line, const char *name, ct_val v, size_t n, const ct_val *args, const char *const *kw)
{
    char what[64];
    snprintf(what, sizeof what, "the '%s' test", name);
    ct_val a[MAX_PARAMS];
    bind(c, line, what, "other", n, args, kw, a);
    ct_val o = given(a[0]) ? a[0] : (ct_val){.k = CT_UNDEF};
    if (!strcmp(name, "defined"))
        return v.k != CT_UNDEF;
    if (!strcmp(name, "undefined"))
        return v.k == CT_UNDEF;
    if (!strcmp(name, "none"))
        return v.k == CT_NONE;
    if (!strcmp(name, "true") || !strcmp(name, "false"))
        return v.k == CT_BOOL && v.u.b == (name[0] == 't');
    if (!strcmp(name, "boolean"))
        return v.k == CT_BOOL;
    if (!strcmp(name, "string"))
        return v.k == CT_STR;
    if (!strcmp(name, "number"))
        return v.k == CT_INT || v.k == CT_FLOAT || v.k == CT_BOOL;
    if (!strcmp(name, "integer"))
        return v.k == CT_INT;
    if (!strcmp(name, "float"))
        return v.k == CT_FLOAT;
    if (!strcmp(name, "mapping"))
        return v.k == CT_DICT;
    if (!strcmp(name, "iterable"))
        return v.k == CT_STR || v.k == CT_LIST || v.k == CT_DICT || v.k == CT_UNDEF;
    if (!strcmp(name, "sequence"))
        return v.k == CT_STR || v.k == CT_LIST || v.k == CT_DICT || v.k == CT_UNDEF;
    if (!strcmp(name, "callable"))
        return v.k == CT_MACRO || v.k == CT_FUNC || v.k == CT_METHOD;
    if (!strcmp(name, "escaped"))
        return false;
    if (!strcmp(name, "filter") || !strcmp(name, "test")) {
        if (v.k != CT_STR)
            return false;
        char *s = ct_strdup(c, v.u.s.p, v.u.s.n);
        bool supported;
        return name[0] == 'f' ? ct_filter_known(s, &supported) : ct_test_known(s);
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "=="))
        return ct_eq(c, v, o);
    if (!strcmp(name, "ne") || !strcmp(name, "!="))
        return !ct_eq(c, v, o);
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan"))
        return ct_cmp(c, line, v, o, "<") < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<="))
        return ct_cmp(c, line, v, o, "<=") <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan"))
        return ct_cmp(c, line, v, o, ">") > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">="))
        return ct_cmp(c, line, v, o, ">=") >= 0;
    if (!strcmp(name, "in"))
        return ct_contains(c, line, o, v);
    if (!strcmp(name, "sameas")) {
        if (v.k != o.k)
            return false;
        if (v.k == CT_NONE || v.k == CT_UNDEF)
            return v.k == CT_NONE;
        if (v.k == CT_BOOL || v.k == CT_INT || v.k == CT_FUNC)
            return v.u.i == o.u.i && (v.k != CT_BOOL || v.u.b == o.u.b);
        if (v.k == CT_STR)
            return v.u.s.p == o.u.s.p && v.u.s.n == o.u.s.n;
        return v.u.l == o.u.l;
    }
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        ct_val r = ct_binop(c, line, '%', v, name[0] == 'd' ? o : ct_int(2));
        return ct_eq(c, r, ct_int(name[0] == 'o' ? 1 : 0));
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        ct_val s = ct_to_str(c, v);
        return str_all(s, name[0] == 'l' ? 'l' : 'u');
    }
    ct_fail(c, line, DT_ERR_INTERNAL, "chat template: test '%s' has no implementation", name);
}

/* ---- methods ---------------------------------------------------------------------------------------- */

static bool starts_or_ends(ct_ctx *c, int line, ct_val s, ct_val affix, bool end)
{
    if (affix.k == CT_LIST && affix.u.l->tuple) {
        for (size_t i = 0; i < affix.u.l->n; i++)
            if (starts_or_ends(c, line, s, affix.u.l->v[i], end))
                return true;
        return false;
    }
    if (affix.k != CT_STR)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s first arg must be str or a tuple of str, not %s",
                end ? "endswith" : "startswith", ct_type_name(affix));
    size_t k = affix.u.s.n;
    return k <= s.u.s.n && !memcmp(s.u.s.p + (end ? s.u.s.n - k : 0), affix.u.s.p, k);
}

static _Noreturn void unsafe(ct_ctx *c, int line, const ct_method *m)
{
    ct_fail(c, line, DT_ERR_INVALID_ARG, "SecurityError: access to attribute '%s' of '%s' object is unsafe "
            "(the sandbox's objects are immutable)", m->name, ct_type_name(m->self));
}

static ct_val str_method(ct_ctx *c, int line, const ct_method *m, size_t n, const ct_val *args,
                         const char *const *kw)
{
    const char *nm = m->name;
    ct_val s = m->self, a[MAX_PARAMS];
    static const char *const done[] = {
        "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
        "title", "capitalize", "swapcase", "replace", "find", "rfind", "count", "join", "removeprefix",
        "removesuffix", "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "islower", "isupper",
        NULL};
    bool implemented = false;
    for (size_t i = 0; done[i]; i++)
        implemented |= !strcmp(done[i], nm);
    if (!implemented)
        ct_fail(c, line, DT_ERR_UNSUPPORTED, "the str method '%s'", nm);
    char what[64];
    snprintf(what, sizeof what, "str.%s", nm);
    const char *spec = !strcmp(nm, "split") || !strcmp(nm, "rsplit") ? "sep maxsplit"
                       : !strcmp(nm, "replace") ? "old new count"
                       : !strcmp(nm, "splitlines") ? "keepends"
                       : strstr(nm, "strip") ? "chars"
                       : !strcmp(nm, "join") ? "iterable"
                       : !strcmp(nm, "startswith") || !strcmp(nm, "endswith") ? "prefix"
                       : !strcmp(nm, "find") || !strcmp(nm, "rfind") || !strcmp(nm, "count") ? "sub"
                       : !strcmp(nm, "removeprefix") || !strcmp(nm, "removesuffix") ? "affix"
                       : "";
    bind(c, line, what, spec, n, args, kw, a);
    if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
        if (given(a[0]) && a[0].k != CT_NONE)
            want_str(c, line, "strip's chars", a[0]);
        return strip(s, given(a[0]) ? a[0] : (ct_val){.k = CT_NONE}, nm[0] == 's' ? 'b' : nm[0]);
    }
    if (!strcmp(nm, "split") || !strcmp(nm, "rsplit")) {
        ct_val sep = given(a[0]) ? a[0] : (ct_val){.k = CT_NONE};
        if (sep.k != CT_NONE)
            want_str(c, line, "split's sep", sep);
        return split(c, line, s, sep, want_int(c, line, "split's maxsplit", a[1], -1), nm[0] == 'r');
    }
    if (!strcmp(nm, "splitlines"))
        return ct_list_val(splitlines(c, s, ct_truthy(a[0])));
    if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
        if (!given(a[0]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes at least 1 argument", what);
        return ct_bool(starts_or_ends(c, line, s, a[0], nm[0] == 'e'));
    }
    if (!strcmp(nm, "upper") || !strcmp(nm, "lower") || !strcmp(nm, "title") || !strcmp(nm, "capitalize") ||
        !strcmp(nm, "swapcase"))
        return recase(c, s, nm[0] == 'u' ? 'u' : nm[0] == 'l' ? 'l' : nm[0] == 't' ? 't' : nm[0] == 'c' ? 'c' : 's');
    if (!strcmp(nm, "replace")) {
        if (!given(a[0]) || !given(a[1]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: str.replace needs the old and the new string");
        return replace(c, s, want_str(c, line, "replace's old", a[0]), want_str(c, line, "replace's new", a[1]),
                       want_int(c, line, "replace's count", a[2], -1));
    }
    if (!strcmp(nm, "find") || !strcmp(nm, "rfind") || !strcmp(nm, "count")) {
        if (!given(a[0]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes at least 1 argument", what);
        ct_val sub = want_str(c, line, "the substring", a[0]);
        if (nm[0] == 'c')
            return ct_int(count_sub(s, sub));
        const char *f = nm[0] == 'f' ? find(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n)
                                     : rfind(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
        return ct_int(f ? (int64_t)ct_utf8_count(s.u.s.p, (size_t)(f - s.u.s.p)) : -1);
    }
    if (!strcmp(nm, "join")) {
        if (!given(a[0]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: str.join takes exactly one argument");
        ct_list *it = ct_iter(c, line, a[0]);
        ct_tick(c, line, it->n);
        return join(c, line, s, it, true);
    }
    if (!strcmp(nm, "removeprefix") || !strcmp(nm, "removesuffix")) {
        if (!given(a[0]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes exactly one argument", what);
        ct_val x = want_str(c, line, "the affix", a[0]);
        bool suffix = nm[6] == 's';
        if (!starts_or_ends(c, line, s, x, suffix))
            return s;
        return ct_str(s.u.s.p + (suffix ? 0 : x.u.s.n), s.u.s.n - x.u.s.n);
    }
    static const char *const is[][2] = {{"isdigit", "d"}, {"isdecimal", "d"}, {"isnumeric", "d"}, {"isalpha", "a"},
                                        {"isalnum", "n"}, {"isspace", "s"},   {"islower", "l"},   {"isupper", "u"}};
    for (size_t i = 0; i < sizeof is / sizeof *is; i++)
        if (!strcmp(nm, is[i][0]))
            return ct_bool(str_all(s, is[i][1][0]));
    ct_fail(c, line, DT_ERR_UNSUPPORTED, "the str method '%s'", nm);
}

ct_val ct_method_call(ct_ctx *c, int line, const ct_method *m, size_t n, const ct_val *args,
                      const char *const *kw)
{
    const char *nm = m->name;
    ct_val self = m->self;
    if (self.k == CT_STR)
        return str_method(c, line, m, n, args, kw);
    if (self.k == CT_LOOP) {
        if (strcmp(nm, "cycle"))
            ct_fail(c, line, DT_ERR_UNSUPPORTED, "loop.%s", nm);
        if (!n)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: no items for cycling given");
        return args[self.u.loop->i % n];
    }
    ct_val a[MAX_PARAMS];
    char what[64];
    snprintf(what, sizeof what, "%s.%s", ct_type_name(self), nm);
    if (self.k == CT_DICT) {
        static const char *const mut[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
        for (size_t i = 0; mut[i]; i++)
            if (!strcmp(nm, mut[i]))
                unsafe(c, line, m);
        if (!strcmp(nm, "get")) {
            bind(c, line, what, "key default", n, args, kw, a);
            if (!given(a[0]))
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: get expected at least 1 argument, got 0");
            ct_val *x = ct_dict_get(c, self.u.d, a[0]);
            return x ? *x : given(a[1]) ? a[1] : (ct_val){.k = CT_NONE};
        }
        bind(c, line, what, "", n, args, kw, a);
        ct_list *l = ct_list_new(c, self.u.d->n);
        if (!strcmp(nm, "keys") || !strcmp(nm, "values")) {
            ct_copy_vals(l->v, nm[0] == 'k' ? self.u.d->k : self.u.d->v, self.u.d->n);
            l->n = self.u.d->n;
            return ct_list_val(l);
        }
        if (!strcmp(nm, "items"))
            return ct_filter(c, line, "items", self, 0, NULL, NULL);
        ct_fail(c, line, DT_ERR_UNSUPPORTED, "the dict method '%s'", nm);
    }
    if (self.k == CT_LIST) {
        static const char *const mut[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort",
                                          NULL};
        for (size_t i = 0; mut[i]; i++)
            if (!strcmp(nm, mut[i]))
                unsafe(c, line, m);
        if (!strcmp(nm, "index") || !strcmp(nm, "count")) {
            bind(c, line, what, "value", n, args, kw, a);
            if (!given(a[0]))
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes exactly one argument", what);
            int64_t k = 0;
            for (size_t i = 0; i < self.u.l->n; i++)
                if (ct_eq(c, self.u.l->v[i], a[0])) {
                    if (nm[0] == 'i')
                        return ct_int((int64_t)i);
                    k++;
                }
            if (nm[0] == 'i')
                ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: %s: the value is not in the list", what);
            return ct_int(k);
        }
        ct_fail(c, line, DT_ERR_UNSUPPORTED, "the list method '%s'", nm);
    }
    ct_fail(c, line, DT_ERR_UNSUPPORTED, "the method '%s' of '%s'", nm, ct_type_name(self));
}

/* ---- globals ---------------------------------------------------------------------------------------- */

static const char *const GLOBALS[] = {"raise_exception", "strftime_now", "namespace", "range", "dict", "cycler",
                                      "joiner", "lipsum", NULL};

bool ct_global_lookup(const char *name, ct_val *out)
{
    for (int i = 0; GLOBALS[i]; i++)
        if (!strcmp(name, GLOBALS[i])) {
            *out = (ct_val){.k = CT_FUNC, .u.i = i};
            return true;
        }
    return false;
}

ct_val ct_global_call(ct_ctx *c, int line, int fn, size_t n, const ct_val *args, const char *const *kw)
{
    ct_val a[MAX_PARAMS];
    switch (fn) {
    case CT_FN_RAISE: {
        bind(c, line, "raise_exception", "message", n, args, kw, a);
        ct_val msg = ct_to_str(c, given(a[0]) ? a[0] : ct_str("", 0));
        ct_fail(c, line, DT_ERR_INVALID_ARG, "the chat template raised an error: %.*s", (int)msg.u.s.n, msg.u.s.p);
    }
    case CT_FN_STRFTIME: {
        bind(c, line, "strftime_now", "format", n, args, kw, a);
        ct_val f = want_str(c, line, "strftime_now's format", given(a[0]) ? a[0] : (ct_val){.k = CT_NONE});
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[1024];
        size_t k = f.u.s.n ? strftime(out, sizeof out, ct_strdup(c, f.u.s.p, f.u.s.n), &tm) : 0;
        if (f.u.s.n && !k)
            ct_fail(c, line, DT_ERR_UNSUPPORTED, "strftime_now: a result longer than %zu bytes, or empty",
                    sizeof out - 1);
        return ct_str(ct_strdup(c, out, k), k);
    }
    case CT_FN_NAMESPACE:
    case CT_FN_DICT: {
        ct_dict *d = ct_dict_new(c);
        for (size_t i = 0; i < n; i++) {
            if (kw && kw[i]) {
                ct_dict_set(c, d, ct_cstr(kw[i]), args[i]);
            } else if (i == 0 && args[i].k == CT_DICT) {
                for (size_t j = 0; j < args[i].u.d->n; j++)
                    ct_dict_set(c, d, args[i].u.d->k[j], args[i].u.d->v[j]);
            } else {
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %s takes keyword arguments (and one mapping)",
                        fn == CT_FN_DICT ? "dict" : "namespace");
            }
        }
        return (ct_val){.k = fn == CT_FN_DICT ? CT_DICT : CT_NS, .u.d = d};
    }
    case CT_FN_RANGE: {
        if (!n || n > 3 || (kw && kw[n - 1]))
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: range expected 1 to 3 positional arguments, got %zu", n);
        int64_t v[3];
        for (size_t i = 0; i < n; i++)
            v[i] = want_int(c, line, "range's arguments", args[i], 0);
        int64_t lo = n > 1 ? v[0] : 0, hi = n > 1 ? v[1] : v[0], st = n > 2 ? v[2] : 1;
        if (!st)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: range() arg 3 must not be zero");
        double cnt = st > 0 ? ceil(((double)hi - (double)lo) / (double)st) : ceil(((double)lo - (double)hi) /
                                                                                    (double)-st);
        if (cnt > 100000)
            ct_fail(c, line, DT_ERR_RANGE, "OverflowError: range too big: the sandbox allows at most 100000 items");
        ct_list *l = ct_list_new(c, cnt > 0 ? (size_t)cnt : 0);
        l->range = true;
        l->r_start = lo;
        l->r_stop = hi;
        l->r_step = st;
        for (size_t k = 0; (double)k < cnt; k++) /* in [lo, hi): no overflow, though k * st may wrap */
            l->v[l->n++] = ct_int((int64_t)((uint64_t)lo + (uint64_t)k * (uint64_t)st));
        return ct_list_val(l);
    }
    default: ct_fail(c, line, DT_ERR_UNSUPPORTED, "the '%s' global", GLOBALS[fn]);
    }
}
