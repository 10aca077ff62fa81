/* Chat templates (chat_template.h): what values are and do, with Python's
 * semantics: truth, ==, <, str() and repr(), json.dumps, attribute and
 * item lookup (jinja2's: a dict's key by either syntax, a missing one is
 * Undefined), slicing, iteration, arithmetic.
 *
 * Strings are UTF-8; lengths, indices and slices count code points as
 * Python's str does. Floats print as Python's repr: the shortest digits
 * that read back to the same double, in fixed notation from 1e-4 up to
 * 1e16 and exponent notation outside. */
#include "chat_template_impl.h"
#include "tok_regex.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- constructors ---------------------------------------------------------------------------- */

ct_val ct_str(const char *p, size_t n)
{
    return (ct_val){.k = CT_STR, .u.s = {p, n}};
}

ct_val ct_cstr(const char *p)
{
    return ct_str(p, strlen(p));
}

ct_val ct_int(int64_t i)
{
    return (ct_val){.k = CT_INT, .u.i = i};
}

ct_val ct_float(double f)
{
    return (ct_val){.k = CT_FLOAT, .u.f = f};
}

ct_val ct_bool(bool b)
{
    return (ct_val){.k = CT_BOOL, .u.b = b};
}

ct_val ct_undef(ct_ctx *c, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    size_t n = k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1;
    return (ct_val){.k = CT_UNDEF, .u.s = {ct_strdup(c, tmp, n), n}};
}

_Noreturn void ct_fail_undef(ct_ctx *c, int line, ct_val u)
{
    ct_fail(c, line, DT_ERR_INVALID_ARG, "UndefinedError: %.*s", (int)u.u.s.n, u.u.s.p);
}

ct_list *ct_list_new(ct_ctx *c, size_t cap)
{
    ct_list *l = ct_alloc(c, sizeof *l);
    memset(l, 0, sizeof *l);
    if (cap) {
        l->v = ct_alloc(c, cap * sizeof *l->v);
        l->cap = cap;
    }
    return l;
}

void ct_list_push(ct_ctx *c, ct_list *l, ct_val v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        ct_val *nv = ct_alloc(c, cap * sizeof *nv);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

ct_val ct_list_val(ct_list *l)
{
    return (ct_val){.k = CT_LIST, .u.l = l};
}

ct_dict *ct_dict_new(ct_ctx *c)
{
    ct_dict *d = ct_alloc(c, sizeof *d);
    memset(d, 0, sizeof *d);
    return d;
}

ct_val *ct_dict_get(ct_ctx *c, const ct_dict *d, ct_val k)
{
    for (size_t i = 0; i < d->n; i++)
        if (ct_eq(c, d->k[i], k))
            return &d->v[i];
    return NULL;
}

void ct_dict_set(ct_ctx *c, ct_dict *d, ct_val k, ct_val v)
{
    ct_val *old = ct_dict_get(c, d, k);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        ct_val *nk = ct_alloc(c, cap * sizeof *nk), *nv = ct_alloc(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}

static void deeper(ct_ctx *c, int line)
{
    if (++c->depth > CT_MAX_DEPTH)
        ct_fail(c, line, DT_ERR_RANGE, "a value nested deeper than %d levels (the limit)", CT_MAX_DEPTH);
}

ct_val ct_from_json(ct_ctx *c, const cJSON *j, int depth)
{
    if (depth > CT_MAX_DEPTH)
        ct_fail(c, 0, DT_ERR_RANGE, "a variable nested deeper than %d levels (the limit)", CT_MAX_DEPTH);
    if (cJSON_IsNull(j))
        return (ct_val){.k = CT_NONE};
    if (cJSON_IsBool(j))
        return ct_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double x = j->valuedouble;
        if (x == trunc(x) && x >= -9223372036854775808.0 && x < 9223372036854775808.0)
            return ct_int((int64_t)x);
        return ct_float(x);
    }
    if (cJSON_IsString(j)) {
        size_t n = strlen(j->valuestring), bad;
        if (!dt__utf8_valid((const unsigned char *)j->valuestring, n, &bad))
            ct_fail(c, 0, DT_ERR_FORMAT, "variable '%s': a string that is not valid UTF-8", j->string ? j->string
                                                                                                      : "?");
        return ct_str(ct_strdup(c, j->valuestring, n), n);
    }
    if (cJSON_IsArray(j)) {
        ct_list *l = ct_list_new(c, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *e = j->child; e; e = e->next)
            ct_list_push(c, l, ct_from_json(c, e, depth + 1));
        return ct_list_val(l);
    }
    if (cJSON_IsObject(j)) {
        ct_dict *d = ct_dict_new(c);
        for (const cJSON *e = j->child; e; e = e->next)
            if (e->string)
                ct_dict_set(c, d, ct_str(ct_strdup(c, e->string, strlen(e->string)), strlen(e->string)),
                            ct_from_json(c, e, depth + 1));
        return (ct_val){.k = CT_DICT, .u.d = d};
    }
    return (ct_val){.k = CT_NONE};
}

/* ---- UTF-8 ------------------------------------------------------------------------------------ */

size_t ct_utf8_count(const char *p, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)p[i] & 0xC0) != 0x80;
    return k;
}

/* ---- truth, equality, order ---------------------------------------------------------------------- */

const char *ct_type_name(ct_val v)
{
    switch (v.k) {
    case CT_UNDEF: return "Undefined";
    case CT_NONE: return "NoneType";
    case CT_BOOL: return "bool";
    case CT_INT: return "int";
    case CT_FLOAT: return "float";
    case CT_STR: return "str";
    case CT_LIST: return v.u.l->range ? "range" : v.u.l->tuple ? "tuple" : "list";
    case CT_DICT: return "dict";
    case CT_NS: return "Namespace";
    case CT_LOOP: return "LoopContext";
    case CT_MACRO: return "Macro";
    case CT_FUNC: return "function";
    case CT_METHOD: return "builtin_function_or_method";
    default: return "?";
    }
}

bool ct_truthy(ct_val v)
{
    switch (v.k) {
    case CT_UNDEF:
    case CT_NONE:
    case CT_ABSENT: return false;
    case CT_BOOL: return v.u.b;
    case CT_INT: return v.u.i != 0;
    case CT_FLOAT: return v.u.f != 0;
    case CT_STR: return v.u.s.n != 0;
    case CT_LIST: return v.u.l->n != 0;
    case CT_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(ct_val v)
{
    return v.k == CT_BOOL || v.k == CT_INT || v.k == CT_FLOAT;
}

static double num_f(ct_val v)
{
    return v.k == CT_FLOAT ? v.u.f : v.k == CT_INT ? (double)v.u.i : v.u.b;
}

static int64_t num_i(ct_val v)
{
    return v.k == CT_INT ? v.u.i : v.u.b;
}

bool ct_eq(ct_ctx *c, ct_val a, ct_val b)
{
    if (is_num(a) && is_num(b)) {
        if (a.k != CT_FLOAT && b.k != CT_FLOAT)
            return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case CT_UNDEF:
    case CT_NONE: return true;
    case CT_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case CT_LIST: {
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n)
            return false;
        deeper(c, 0);
        bool eq = true;
        for (size_t i = 0; i < a.u.l->n && eq; i++)
            eq = ct_eq(c, a.u.l->v[i], b.u.l->v[i]);
        c->depth--;
        return eq;
    }
    case CT_DICT: {
        if (a.u.d->n != b.u.d->n)
            return false;
        deeper(c, 0);
        bool eq = true;
        for (size_t i = 0; i < a.u.d->n && eq; i++) {
            ct_val *o = ct_dict_get(c, b.u.d, a.u.d->k[i]);
            eq = o && ct_eq(c, a.u.d->v[i], *o);
        }
        c->depth--;
        return eq;
    }
    case CT_NS: return a.u.d == b.u.d;
    case CT_LOOP: return a.u.loop == b.u.loop;
    case CT_MACRO: return a.u.m == b.u.m;
    case CT_FUNC: return a.u.i == b.u.i;
    default: return false;
    }
}

/* <0, 0, >0 as Python orders a and b; a TypeError where it cannot. */
int ct_cmp(ct_ctx *c, int line, ct_val a, ct_val b, const char *op)
{
    if (a.k == CT_UNDEF)
        ct_fail_undef(c, line, a);
    if (b.k == CT_UNDEF)
        ct_fail_undef(c, line, b);
    if (is_num(a) && is_num(b)) {
        if (a.k != CT_FLOAT && b.k != CT_FLOAT)
            return (num_i(a) > num_i(b)) - (num_i(a) < num_i(b));
        double x = num_f(a), y = num_f(b);
        return (x > y) - (x < y);
    }
    if (a.k == CT_STR && b.k == CT_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, n);
        return r ? r : (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if (a.k == CT_LIST && b.k == CT_LIST && a.u.l->tuple == b.u.l->tuple) {
        deeper(c, line);
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++)
            if (!ct_eq(c, a.u.l->v[i], b.u.l->v[i])) {
                int r = ct_cmp(c, line, a.u.l->v[i], b.u.l->v[i], op);
                c->depth--;
                return r;
            }
        c->depth--;
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: '%s' not supported between instances of '%s' and '%s'",
            strcmp(op, "sort") ? op : "<", ct_type_name(a), ct_type_name(b));
}

/* ---- str() and repr() ------------------------------------------------------------------------------ */

/* Python's repr of a double (float_repr_style 'short'). */
static void float_repr(ct_buf *b, double x, bool json)
{
    if (isnan(x)) {
        ct_buf_puts(b, json ? "NaN" : "nan");
        return;
    }
    if (isinf(x)) {
        ct_buf_puts(b, x < 0 ? (json ? "-Infinity" : "-inf") : (json ? "Infinity" : "inf"));
        return;
    }
    char tmp[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(tmp, sizeof tmp, "%.*e", p - 1, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    /* tmp: [-]d[.ddd]e[+-]xx */
    const char *s = tmp;
    if (*s == '-') {
        ct_buf_put(b, "-", 1);
        s++;
    }
    char dig[20];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            dig[nd++] = *s;
    int exp = atoi(s + 1), decpt = exp + 1;
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            ct_buf_put(b, "0.", 2);
            for (int i = 0; i < -decpt; i++)
                ct_buf_put(b, "0", 1);
            ct_buf_put(b, dig, (size_t)nd);
        } else if (decpt >= nd) {
            ct_buf_put(b, dig, (size_t)nd);
            for (int i = nd; i < decpt; i++)
                ct_buf_put(b, "0", 1);
            ct_buf_put(b, ".0", 2);
        } else {
            ct_buf_put(b, dig, (size_t)decpt);
            ct_buf_put(b, ".", 1);
            ct_buf_put(b, dig + decpt, (size_t)(nd - decpt));
        }
    } else {
        ct_buf_put(b, dig, 1);
        if (nd > 1) {
            ct_buf_put(b, ".", 1);
            ct_buf_put(b, dig + 1, (size_t)(nd - 1));
        }
        ct_buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static bool printable(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 0x20 && cp < 0x7F;
    int g = dt__unicode_gc(cp);
    return !(g == DT_GC_Cc || g == DT_GC_Cf || g == DT_GC_Cs || g == DT_GC_Co || g == DT_GC_Cn || g == DT_GC_Zl ||
             g == DT_GC_Zp || g == DT_GC_Zs);
}

static void str_repr(ct_buf *b, const char *p, size_t n)
{
    char q = memchr(p, '\'', n) && !memchr(p, '"', n) ? '"' : '\'';
    ct_buf_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        size_t len;
        uint32_t cp = dt__utf8_next((const unsigned char *)p, n, i, &len);
        if (cp == (uint32_t)q || cp == '\\')
            ct_buf_printf(b, "\\%c", (char)cp);
        else if (cp == '\t')
            ct_buf_puts(b, "\\t");
        else if (cp == '\n')
            ct_buf_puts(b, "\\n");
        else if (cp == '\r')
            ct_buf_puts(b, "\\r");
        else if (printable(cp))
            ct_buf_put(b, p + i, len);
        else if (cp < 0x100)
            ct_buf_printf(b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000)
            ct_buf_printf(b, "\\u%04x", (unsigned)cp);
        else
            ct_buf_printf(b, "\\U%08x", (unsigned)cp);
        i += len;
    }
    ct_buf_put(b, &q, 1);
}

static void repr_dict(ct_buf *b, const ct_dict *d)
{
    ct_buf_put(b, "{", 1);
    for (size_t i = 0; i < d->n; i++) {
        if (i)
            ct_buf_put(b, ", ", 2);
        ct_repr_into(b, d->k[i]);
        ct_buf_put(b, ": ", 2);
        ct_repr_into(b, d->v[i]);
    }
    ct_buf_put(b, "}", 1);
}

void ct_repr_into(ct_buf *b, ct_val v)
{
    switch (v.k) {
    case CT_UNDEF: ct_buf_puts(b, "Undefined"); return;
    case CT_STR: str_repr(b, v.u.s.p, v.u.s.n); return;
    case CT_LIST: {
        const ct_list *l = v.u.l;
        if (l->range) {
            ct_buf_printf(b, "range(%lld, %lld", (long long)l->r_start, (long long)l->r_stop);
            if (l->r_step != 1)
                ct_buf_printf(b, ", %lld", (long long)l->r_step);
            ct_buf_puts(b, ")");
            return;
        }
        deeper(b->c, 0);
        ct_buf_put(b, l->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                ct_buf_put(b, ", ", 2);
            ct_repr_into(b, l->v[i]);
        }
        ct_buf_puts(b, l->tuple ? (l->n == 1 ? ",)" : ")") : "]");
        b->c->depth--;
        return;
    }
    case CT_DICT:
        deeper(b->c, 0);
        repr_dict(b, v.u.d);
        b->c->depth--;
        return;
    default: ct_str_into(b, v);
    }
}

void ct_str_into(ct_buf *b, ct_val v)
{
    static const char *const fn_names[] = {"raise_exception", "strftime_now", "namespace", "range", "dict",
                                           "cycler", "joiner", "lipsum"};
    switch (v.k) {
    case CT_UNDEF:
    case CT_ABSENT: return;
    case CT_NONE: ct_buf_puts(b, "None"); return;
    case CT_BOOL: ct_buf_puts(b, v.u.b ? "True" : "False"); return;
    case CT_INT: ct_buf_printf(b, "%lld", (long long)v.u.i); return;
    case CT_FLOAT: float_repr(b, v.u.f, false); return;
    case CT_STR: ct_buf_put(b, v.u.s.p, v.u.s.n); return;
    case CT_LIST:
    case CT_DICT: ct_repr_into(b, v); return;
    case CT_NS:
        deeper(b->c, 0);
        ct_buf_puts(b, "<Namespace ");
        repr_dict(b, v.u.d);
        ct_buf_puts(b, ">");
        b->c->depth--;
        return;
    case CT_LOOP: ct_buf_printf(b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->items->n); return;
    case CT_MACRO:
        ct_buf_printf(b, "<Macro '%s'>", v.u.m->def->k == N_MACRO ? v.u.m->def->name : "caller");
        return;
    case CT_FUNC: ct_buf_printf(b, "<function %s>", fn_names[v.u.i]); return;
    case CT_METHOD:
        ct_buf_printf(b, "<built-in method %s of %s object>", v.u.me->name, ct_type_name(v.u.me->self));
        return;
    }
}

ct_val ct_to_str(ct_ctx *c, ct_val v)
{
    if (v.k == CT_STR)
        return v;
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    ct_str_into(&b, v);
    return ct_str(b.p, b.n);
}

/* ---- lookup ------------------------------------------------------------------------------------------ */

static bool in_list(const char *name, const char *const *names)
{
    for (size_t i = 0; names[i]; i++)
        if (!strcmp(name, names[i]))
            return true;
    return false;
}

static const char *const STR_METHODS[] = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
    "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
    "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill",
    NULL};
static const char *const DICT_METHODS[] = {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem",
                                           "setdefault", "update", "values", NULL};
static const char *const LIST_METHODS[] = {"append", "clear", "copy", "count", "extend", "index", "insert", "pop",
                                           "remove", "reverse", "sort", NULL};
static const char *const TUPLE_METHODS[] = {"count", "index", NULL};

static ct_val method(ct_ctx *c, ct_val self, const char *name)
{
    ct_method *m = ct_alloc(c, sizeof *m);
    m->self = self;
    m->name = name;
    return (ct_val){.k = CT_METHOD, .u.me = m};
}

ct_val ct_getattr(ct_ctx *c, int line, ct_val v, const char *name)
{
    switch (v.k) {
    case CT_UNDEF: ct_fail_undef(c, line, v);
    case CT_DICT: {
        if (in_list(name, DICT_METHODS))
            return method(c, v, name);
        ct_val *x = ct_dict_get(c, v.u.d, ct_cstr(name));
        return x ? *x : ct_undef(c, "'dict object' has no attribute '%s'", name);
    }
    case CT_NS: {
        ct_val *x = ct_dict_get(c, v.u.d, ct_cstr(name));
        return x ? *x : ct_undef(c, "'Namespace object' has no attribute '%s'", name);
    }
    case CT_STR:
        if (in_list(name, STR_METHODS))
            return method(c, v, name);
        break;
    case CT_LIST:
        if (in_list(name, v.u.l->tuple ? TUPLE_METHODS : LIST_METHODS))
            return method(c, v, name);
        break;
    case CT_LOOP: {
        const ct_loop *lp = v.u.loop;
        size_t i = lp->i, n = lp->items->n;
        if (!strcmp(name, "index"))
            return ct_int((int64_t)i + 1);
        if (!strcmp(name, "index0"))
            return ct_int((int64_t)i);
        if (!strcmp(name, "revindex"))
            return ct_int((int64_t)(n - i));
        if (!strcmp(name, "revindex0"))
            return ct_int((int64_t)(n - i - 1));
        if (!strcmp(name, "first"))
            return ct_bool(i == 0);
        if (!strcmp(name, "last"))
            return ct_bool(i + 1 == n);
        if (!strcmp(name, "length"))
            return ct_int((int64_t)n);
        if (!strcmp(name, "depth"))
            return ct_int(1);
        if (!strcmp(name, "depth0"))
            return ct_int(0);
        if (!strcmp(name, "previtem"))
            return i ? lp->items->v[i - 1] : ct_undef(c, "there is no previous item");
        if (!strcmp(name, "nextitem"))
            return i + 1 < n ? lp->items->v[i + 1] : ct_undef(c, "there is no next item");
        if (!strcmp(name, "cycle") || !strcmp(name, "changed"))
            return method(c, v, name);
        break;
    }
    case CT_NONE: return ct_undef(c, "'None' has no attribute '%s'", name);
    default: break;
    }
    return ct_undef(c, "'%s object' has no attribute '%s'", ct_type_name(v), name);
}

/* Python's index into a sequence of n: a negative one counts from the end; -1 if outside. */
static int64_t seq_index(ct_val key, size_t n)
{
    int64_t i = num_i(key);
    if (i < 0)
        i += (int64_t)n;
    return i >= 0 && (uint64_t)i < n ? i : -1;
}

/* Byte offset of code point k of p[0, n) (k <= count). */
static size_t cp_offset(const char *p, size_t n, size_t k)
{
    size_t i = 0;
    for (; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80 && k-- == 0)
            return i;
    return n;
}

ct_val ct_getitem(ct_ctx *c, int line, ct_val v, ct_val key)
{
    if (v.k == CT_UNDEF)
        ct_fail_undef(c, line, v);
    bool int_key = key.k == CT_INT || key.k == CT_BOOL;
    if (v.k == CT_DICT) {
        ct_val *x = ct_dict_get(c, v.u.d, key);
        if (x)
            return *x;
    } else if (v.k == CT_LIST && int_key) {
        int64_t i = seq_index(key, v.u.l->n);
        if (i >= 0)
            return v.u.l->v[i];
    } else if (v.k == CT_STR && int_key) {
        int64_t i = seq_index(key, ct_utf8_count(v.u.s.p, v.u.s.n));
        if (i >= 0) {
            size_t a = cp_offset(v.u.s.p, v.u.s.n, (size_t)i), len;
            dt__utf8_next((const unsigned char *)v.u.s.p, v.u.s.n, a, &len);
            return ct_str(v.u.s.p + a, len);
        }
    }
    if (key.k == CT_STR && v.k != CT_DICT) /* jinja2: then the attribute */
        return ct_getattr(c, line, v, ct_strdup(c, key.u.s.p, key.u.s.n));
    if (key.k == CT_STR)
        return ct_undef(c, "'dict object' has no attribute '%.*s'", (int)key.u.s.n, key.u.s.p);
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    ct_repr_into(&b, key);
    return ct_undef(c, "'%s object' has no element %s", ct_type_name(v), b.p);
}

/* Python's slice.indices(n): the positions a[lo:hi:step] takes, written to idx (count returned). */
static size_t slice_positions(ct_ctx *c, int line, ct_val lo, ct_val hi, ct_val st, size_t n, int64_t **idx,
                              int64_t *out_start, int64_t *out_stop)
{
    int64_t step = st.k == CT_NONE ? 1 : num_i(st), len = (int64_t)n, start, stop;
    if (step == 0)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: slice step cannot be zero");
    if (lo.k == CT_NONE) {
        start = step < 0 ? len - 1 : 0;
    } else {
        start = num_i(lo);
        if (start < 0 && (start += len) < 0)
            start = step < 0 ? -1 : 0;
        else if (start >= len)
            start = step < 0 ? len - 1 : len;
    }
    if (hi.k == CT_NONE) {
        stop = step < 0 ? -1 : len;
    } else {
        stop = num_i(hi);
        if (stop < 0 && (stop += len) < 0)
            stop = step < 0 ? -1 : 0;
        else if (stop >= len)
            stop = step < 0 ? len - 1 : len;
    }
    size_t k = 0;
    *out_start = start;
    *out_stop = stop;
    *idx = ct_alloc(c, (n + 1) * sizeof **idx);
    if (step > 0)
        for (int64_t i = start; i < stop; i += step)
            (*idx)[k++] = i;
    else
        for (int64_t i = start; i > stop; i += step)
            (*idx)[k++] = i;
    return k;
}

ct_val ct_slice(ct_ctx *c, int line, ct_val v, ct_val lo, ct_val hi, ct_val step)
{
    if (v.k == CT_UNDEF)
        ct_fail_undef(c, line, v);
    bool ok = (lo.k == CT_NONE || lo.k == CT_INT || lo.k == CT_BOOL) &&
              (hi.k == CT_NONE || hi.k == CT_INT || hi.k == CT_BOOL) &&
              (step.k == CT_NONE || step.k == CT_INT || step.k == CT_BOOL);
    if (!ok || (v.k != CT_LIST && v.k != CT_STR))
        return ct_undef(c, "'%s object' has no element slice", ct_type_name(v));
    int64_t *idx, sa, sb;
    if (v.k == CT_LIST) {
        const ct_list *src = v.u.l;
        size_t k = slice_positions(c, line, lo, hi, step, src->n, &idx, &sa, &sb);
        ct_list *l = ct_list_new(c, k);
        for (size_t i = 0; i < k; i++)
            l->v[i] = src->v[idx[i]];
        l->n = k;
        l->tuple = src->tuple;
        if (src->range) { /* a range's slice is a range, as Python's */
            l->range = true;
            l->r_start = src->r_start + sa * src->r_step;
            l->r_stop = src->r_start + sb * src->r_step;
            l->r_step = src->r_step * (step.k == CT_NONE ? 1 : num_i(step));
        }
        return ct_list_val(l);
    }
    const char *p = v.u.s.p;
    size_t n = v.u.s.n, ncp = ct_utf8_count(p, n);
    size_t *off = ct_alloc(c, (ncp + 1) * sizeof *off), j = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)p[i] & 0xC0) != 0x80)
            off[j++] = i;
    off[ncp] = n;
    size_t k = slice_positions(c, line, lo, hi, step, ncp, &idx, &sa, &sb);
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    for (size_t i = 0; i < k; i++)
        ct_buf_put(&b, p + off[idx[i]], off[idx[i] + 1] - off[idx[i]]);
    return ct_str(b.p, b.n);
}

ct_list *ct_iter(ct_ctx *c, int line, ct_val v)
{
    switch (v.k) {
    case CT_UNDEF: return ct_list_new(c, 0);
    case CT_LIST: return v.u.l;
    case CT_DICT: {
        ct_list *l = ct_list_new(c, v.u.d->n);
        ct_copy_vals(l->v, v.u.d->k, v.u.d->n);
        l->n = v.u.d->n;
        return l;
    }
    case CT_STR: {
        ct_list *l = ct_list_new(c, v.u.s.n);
        for (size_t i = 0, len; i < v.u.s.n; i += len) {
            dt__utf8_next((const unsigned char *)v.u.s.p, v.u.s.n, i, &len);
            l->v[l->n++] = ct_str(v.u.s.p + i, len);
        }
        return l;
    }
    default: ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: '%s' object is not iterable", ct_type_name(v));
    }
}

bool ct_contains(ct_ctx *c, int line, ct_val hay, ct_val needle)
{
    switch (hay.k) {
    case CT_UNDEF: return false;
    case CT_STR:
        if (needle.k != CT_STR)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: 'in <string>' requires string as left operand, not %s",
                    ct_type_name(needle));
        return !needle.u.s.n || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n);
    case CT_LIST:
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (ct_eq(c, hay.u.l->v[i], needle))
                return true;
        return false;
    case CT_DICT:
        if (needle.k == CT_LIST && !needle.u.l->tuple) /* a tuple hashes if its items do: taken as hashable */
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: unhashable type: 'list'");
        if (needle.k == CT_DICT || needle.k == CT_NS)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: unhashable type: '%s'", ct_type_name(needle));
        return ct_dict_get(c, hay.u.d, needle) != NULL;
    default:
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: argument of type '%s' is not iterable", ct_type_name(hay));
    }
}

/* ---- arithmetic -------------------------------------------------------------------------------------- */

static _Noreturn void overflow(ct_ctx *c, int line)
{
    ct_fail(c, line, DT_ERR_UNSUPPORTED, "integer overflow (jinja2's integers are unbounded, these are 64-bit)");
}

static ct_val repeat(ct_ctx *c, int line, ct_val seq, int64_t times)
{
    if (times < 0)
        times = 0;
    size_t unit = seq.k == CT_STR ? seq.u.s.n : seq.u.l->n * sizeof(ct_val);
    if (!unit)
        times = 0;
    if (unit && (uint64_t)times > c->lim.max_output / unit)
        ct_fail(c, line, DT_ERR_RANGE, "a repeated %s larger than the output limit (%zu MiB)", ct_type_name(seq),
                c->lim.max_output >> 20);
    if (seq.k == CT_STR) {
        ct_buf b = {.c = c};
        ct_buf_put(&b, "", 0);
        for (int64_t i = 0; i < times; i++)
            ct_buf_put(&b, seq.u.s.p, seq.u.s.n);
        return ct_str(b.p, b.n);
    }
    ct_list *l = ct_list_new(c, (size_t)times * seq.u.l->n);
    for (int64_t i = 0; i < times; i++)
        for (size_t j = 0; j < seq.u.l->n; j++)
            l->v[l->n++] = seq.u.l->v[j];
    l->tuple = seq.u.l->tuple;
    return ct_list_val(l);
}

static double py_fmod(double x, double y)
{
    double m = fmod(x, y);
    if (m != 0) {
        if ((y < 0) != (m < 0))
            m += y;
    } else {
        m = copysign(0.0, y);
    }
    return m;
}

static double py_floordiv(double x, double y)
{
    double m = fmod(x, y), div = (x - m) / y;
    if (m != 0 && (y < 0) != (m < 0))
        div -= 1.0;
    if (div == 0)
        return copysign(0.0, x / y);
    double fl = floor(div);
    return div - fl > 0.5 ? fl + 1.0 : fl;
}

/* ---- printf-style formatting: Python's str % args (and jinja2's format filter) --------------------------- */

#define MAX_FIELD (1 << 24) /* a width or precision past this is a limit, not an allocation */

/* Code point cp as UTF-8 into out (4 bytes at most); its length. */
static size_t utf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80)
        return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800)
        return o[0] = (unsigned char)(0xC0 | cp >> 6), o[1] = (unsigned char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return o[0] = (unsigned char)(0xE0 | cp >> 12), o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)),
               o[2] = (unsigned char)(0x80 | (cp & 0x3F)), 3;
    return o[0] = (unsigned char)(0xF0 | cp >> 18), o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F)),
           o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)), o[3] = (unsigned char)(0x80 | (cp & 0x3F)), 4;
}

/* The next positional argument of args[*at] (n of them), or TypeError. */
static ct_val next_arg(ct_ctx *c, int line, const ct_val *args, size_t n, size_t *at)
{
    if (*at >= n)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: not enough arguments for format string");
    return args[(*at)++];
}

/* A '*' width or precision: an int argument. */
static int64_t star_arg(ct_ctx *c, int line, const ct_val *args, size_t n, size_t *at)
{
    ct_val v = next_arg(c, line, args, n, at);
    if (v.k != CT_INT && v.k != CT_BOOL)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: * wants int");
    return v.k == CT_BOOL ? v.u.b : v.u.i;
}

/* s[0, n) into b padded to width characters (left-justified with '-'), cut to prec characters first (prec >= 0). */
static void put_padded(ct_buf *b, const char *s, size_t n, int64_t width, int64_t prec, bool left)
{
    if (prec >= 0) { /* characters, not bytes */
        size_t i = 0;
        for (int64_t k = 0; k < prec && i < n; k++)
            for (i++; i < n && ((unsigned char)s[i] & 0xC0) == 0x80; i++)
                ;
        n = i;
    }
    const size_t chars = ct_utf8_count(s, n);
    for (int64_t k = (int64_t)chars; !left && k < width; k++)
        ct_buf_put(b, " ", 1);
    ct_buf_put(b, s, n);
    for (int64_t k = (int64_t)chars; left && k < width; k++)
        ct_buf_put(b, " ", 1);
}

/* An integer conversion (d i u o x X): sign, '#' prefix, at least prec digits, then width with '0' or spaces. */
static void put_int(ct_buf *b, int64_t v, char type, const char *flags, int64_t width, int64_t prec)
{
    char digits[80], num[200];
    const uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    snprintf(digits, sizeof digits, type == 'o' ? "%llo" : type == 'x' ? "%llx" : type == 'X' ? "%llX" : "%llu",
             (unsigned long long)mag);
    const char *sign = v < 0 ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
    const char *pre = !strchr(flags, '#') ? "" : type == 'o' ? "0o" : type == 'x' ? "0x" : type == 'X' ? "0X" : "";
    const int64_t nd = (int64_t)strlen(digits), zeros = prec > nd ? prec - nd : 0;
    const int64_t len = (int64_t)(strlen(sign) + strlen(pre)) + zeros + nd;
    const bool left = strchr(flags, '-') != NULL, zpad = !left && strchr(flags, '0') != NULL;
    for (int64_t k = len; !left && !zpad && k < width; k++)
        ct_buf_put(b, " ", 1);
    snprintf(num, sizeof num, "%s%s", sign, pre);
    ct_buf_puts(b, num);
    for (int64_t k = len; zpad && k < width; k++)
        ct_buf_put(b, "0", 1);
    for (int64_t k = 0; k < zeros; k++)
        ct_buf_put(b, "0", 1);
    ct_buf_puts(b, digits);
    for (int64_t k = len; left && k < width; k++)
        ct_buf_put(b, " ", 1);
}

/* Python's fmt % args: args a tuple (positional), a dict (%(name)s keys; else one argument) or one value. The
 * conversions s r a d i u o x X e E f F g G c %, flags #0- +, width and precision (digits or *); errors as
 * Python's (TypeError, ValueError). */
static ct_val printf_format(ct_ctx *c, int line, ct_val fmt, ct_val args)
{
    const bool tuple = args.k == CT_LIST && args.u.l->tuple && !args.u.l->range;
    const ct_val *av = tuple ? args.u.l->v : &args;
    const size_t an = tuple ? args.u.l->n : 1;
    size_t at = 0;
    bool named = false;
    const char *f = fmt.u.s.p;
    const size_t n = fmt.u.s.n;
    ct_buf b = {.c = c};
    ct_buf_put(&b, "", 0);
    for (size_t i = 0; i < n;) {
        const char *pct = memchr(f + i, '%', n - i);
        const size_t upto = pct ? (size_t)(pct - f) : n;
        ct_buf_put(&b, f + i, upto - i);
        if (!pct)
            break;
        if (upto + 1 < n && f[upto + 1] == '%') { /* "%%" */
            ct_buf_put(&b, "%", 1);
            i = upto + 2;
            continue;
        }
        i = upto + 1;
        ct_val v = {.k = CT_ABSENT};
        if (i < n && f[i] == '(') { /* %(name)s: a key of the mapping */
            const char *close = memchr(f + i, ')', n - i);
            if (!close)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: incomplete format key");
            if (args.k == CT_UNDEF)
                ct_fail_undef(c, line, args);
            if (args.k != CT_DICT)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: format requires a mapping");
            ct_val *hit = ct_dict_get(c, args.u.d, ct_str(f + i + 1, (size_t)(close - f - i - 1)));
            if (!hit)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "KeyError: '%.*s'", (int)(close - f - i - 1), f + i + 1);
            v = *hit;
            named = true;
            i = (size_t)(close - f) + 1;
        }
        char flags[8] = "";
        while (i < n && strchr("#0- +", f[i]) && strlen(flags) < sizeof flags - 1) {
            if (!strchr(flags, f[i]))
                flags[strlen(flags)] = f[i];
            i++;
        }
        int64_t width = 0, prec = -1;
        if (i < n && f[i] == '*') {
            width = star_arg(c, line, av, an, &at);
            i++;
        } else {
            for (; i < n && f[i] >= '0' && f[i] <= '9'; i++)
                width = width < MAX_FIELD ? width * 10 + (f[i] - '0') : width;
        }
        if (width < 0 && strlen(flags) < sizeof flags - 1 && !strchr(flags, '-')) /* a negative '*': left */
            flags[strlen(flags)] = '-';
        width = width < 0 ? -width : width;
        if (i < n && f[i] == '.') {
            i++;
            prec = 0;
            if (i < n && f[i] == '*') {
                prec = star_arg(c, line, av, an, &at);
                prec = prec < 0 ? 0 : prec;
                i++;
            } else {
                for (; i < n && f[i] >= '0' && f[i] <= '9'; i++)
                    prec = prec < MAX_FIELD ? prec * 10 + (f[i] - '0') : prec;
            }
        }
        if (width > MAX_FIELD || prec > MAX_FIELD)
            ct_fail(c, line, DT_ERR_RANGE, "a %% format's width or precision past %d (a limit)", MAX_FIELD);
        while (i < n && strchr("hlL", f[i]))
            i++;
        if (i >= n)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: incomplete format");
        const char type = f[i++];
        if (type == '%' && v.k == CT_ABSENT) /* '%' after a flag, width or precision: a conversion (that fails) */
            next_arg(c, line, av, an, &at);
        if (!strchr("sradiuoxXeEfFgGc", type)) {
            const size_t idx = ct_utf8_count(f, i - 1);
            if ((unsigned char)type < 0x80)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: unsupported format character '%c' (0x%x) at "
                        "index %zu", type, (unsigned)type, idx);
            ct_fail(c, line, DT_ERR_INVALID_ARG, "ValueError: unsupported format character at index %zu", idx);
        }
        if (v.k == CT_ABSENT) /* (a dict given and no key named: the dict is the one argument) */
            v = next_arg(c, line, av, an, &at);
        if (v.k == CT_UNDEF && !strchr("sra", type)) /* str() of it is '', repr() 'Undefined'; int() fails */
            ct_fail_undef(c, line, v);
        const bool left = strchr(flags, '-') != NULL;
        if (type == 's' || type == 'r' || type == 'a') {
            ct_buf t = {.c = c};
            ct_buf_put(&t, "", 0);
            if (type == 's')
                ct_str_into(&t, v);
            else
                ct_repr_into(&t, v);
            if (type == 'a') { /* ascii(): the repr with every non-ASCII character escaped */
                ct_buf e = {.c = c};
                ct_buf_put(&e, "", 0);
                for (size_t k = 0, len; k < t.n; k += len) {
                    const uint32_t cp = dt__utf8_next((const unsigned char *)t.p, t.n, k, &len);
                    if (cp < 0x80)
                        ct_buf_put(&e, t.p + k, len);
                    else
                        ct_buf_printf(&e, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x",
                                      (unsigned)cp);
                }
                t = e;
            }
            put_padded(&b, t.p, t.n, width, prec, left);
        } else if (type == 'c') {
            char ch[8];
            size_t cl;
            if (v.k == CT_INT || v.k == CT_BOOL) {
                const int64_t cp = v.k == CT_BOOL ? v.u.b : v.u.i;
                if (cp < 0 || cp > 0x10FFFF)
                    ct_fail(c, line, DT_ERR_INVALID_ARG, "OverflowError: %%c arg not in range(0x110000)");
                cl = utf8_put((uint32_t)cp, ch);
            } else if (v.k == CT_STR && ct_utf8_count(v.u.s.p, v.u.s.n) == 1 && v.u.s.n < sizeof ch) {
                memcpy(ch, v.u.s.p, v.u.s.n);
                cl = v.u.s.n;
            } else {
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %%c requires int or char");
            }
            put_padded(&b, ch, cl, width, -1, left);
        } else if (strchr("diuoxX", type)) {
            const bool real = strchr("diu", type) != NULL;
            if (v.k != CT_INT && v.k != CT_BOOL && !(real && v.k == CT_FLOAT))
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: %%%c format: %s is required, not %s", type,
                        real ? "a real number" : "an integer", ct_type_name(v));
            if (v.k == CT_FLOAT && !(fabs(v.u.f) < 9.2e18)) /* int() of it: inf, nan, past int64 */
                ct_fail(c, line, DT_ERR_INVALID_ARG, "OverflowError: %%%c format of %g", type, v.u.f);
            const int64_t iv = v.k == CT_BOOL ? v.u.b : v.k == CT_FLOAT ? (int64_t)v.u.f : v.u.i;
            put_int(&b, iv, type == 'i' || type == 'u' ? 'd' : type, flags, width, prec);
        } else { /* e E f F g G: C's printf formats them as Python does */
            if (v.k != CT_INT && v.k != CT_BOOL && v.k != CT_FLOAT)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: must be real number, not %s", ct_type_name(v));
            const double d = v.k == CT_FLOAT ? v.u.f : v.k == CT_BOOL ? v.u.b : (double)v.u.i;
            char spec[32];
            snprintf(spec, sizeof spec, "%%%s*.*%c", flags, type);
            const int len = snprintf(NULL, 0, spec, (int)width, (int)(prec < 0 ? 6 : prec), d);
            char *tmp = ct_alloc(c, (size_t)len + 1);
            snprintf(tmp, (size_t)len + 1, spec, (int)width, (int)(prec < 0 ? 6 : prec), d);
            ct_buf_put(&b, tmp, (size_t)len);
        }
        ct_tick(c, line, 1 + b.n / 256);
    }
    if (!named && args.k != CT_DICT && at < an)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: not all arguments converted during string formatting");
    return ct_str(b.p, b.n);
}

ct_val ct_format(ct_ctx *c, int line, ct_val fmt, ct_val args)
{
    return printf_format(c, line, fmt, args);
}

ct_val ct_binop(ct_ctx *c, int line, int op, ct_val a, ct_val b)
{
    if (op == '%' && a.k == CT_STR) /* str.__mod__: an Undefined argument prints as str() does, '' */
        return printf_format(c, line, a, b);
    if (a.k == CT_UNDEF)
        ct_fail_undef(c, line, a);
    if (b.k == CT_UNDEF)
        ct_fail_undef(c, line, b);
    static const char *const names[] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/", ['f'] = "//",
                                        ['%'] = "%", ['p'] = "**"};
    if (is_num(a) && is_num(b)) {
        bool fl = a.k == CT_FLOAT || b.k == CT_FLOAT;
        if ((op == '/' || op == 'f' || op == '%') && num_f(b) == 0)
            ct_fail(c, line, DT_ERR_INVALID_ARG, "ZeroDivisionError: %s by zero",
                    op == '%' ? "modulo" : fl || op == '/' ? "division" : "integer division");
        if (op == '/')
            return ct_float(num_f(a) / num_f(b));
        if (fl) {
            double x = num_f(a), y = num_f(b);
            switch (op) {
            case '+': return ct_float(x + y);
            case '-': return ct_float(x - y);
            case '*': return ct_float(x * y);
            case 'f': return ct_float(py_floordiv(x, y));
            case '%': return ct_float(py_fmod(x, y));
            default:
                if (x == 0 && y < 0)
                    ct_fail(c, line, DT_ERR_INVALID_ARG, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
                return ct_float(pow(x, y));
            }
        }
        int64_t x = num_i(a), y = num_i(b), r;
        switch (op) {
        case '+':
            if (__builtin_add_overflow(x, y, &r))
                overflow(c, line);
            return ct_int(r);
        case '-':
            if (__builtin_sub_overflow(x, y, &r))
                overflow(c, line);
            return ct_int(r);
        case '*':
            if (__builtin_mul_overflow(x, y, &r))
                overflow(c, line);
            return ct_int(r);
        case 'f':
        case '%': {
            if (x == INT64_MIN && y == -1)
                overflow(c, line);
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return ct_int(op == 'f' ? q : m);
        }
        default:
            if (y < 0) {
                if (x == 0)
                    ct_fail(c, line, DT_ERR_INVALID_ARG, "ZeroDivisionError: 0.0 cannot be raised to a negative power");
                return ct_float(pow((double)x, (double)y));
            }
            r = 1;
            for (int64_t base = x, e = y; e; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(r, base, &r))
                    overflow(c, line);
                if (e > 1 && __builtin_mul_overflow(base, base, &base))
                    overflow(c, line);
            }
            return ct_int(r);
        }
    }
    if (op == '+' && a.k == CT_STR && b.k == CT_STR) {
        ct_buf s = {.c = c};
        ct_buf_put(&s, a.u.s.p, a.u.s.n);
        ct_buf_put(&s, b.u.s.p, b.u.s.n);
        return ct_str(s.p, s.n);
    }
    if (op == '+' && a.k == CT_LIST && b.k == CT_LIST && a.u.l->tuple == b.u.l->tuple && !a.u.l->range &&
        !b.u.l->range) {
        ct_list *l = ct_list_new(c, a.u.l->n + b.u.l->n);
        ct_copy_vals(l->v, a.u.l->v, a.u.l->n);
        ct_copy_vals(l->v + a.u.l->n, b.u.l->v, b.u.l->n);
        l->n = a.u.l->n + b.u.l->n;
        l->tuple = a.u.l->tuple;
        return ct_list_val(l);
    }
    bool seq_a = a.k == CT_STR || (a.k == CT_LIST && !a.u.l->range);
    bool seq_b = b.k == CT_STR || (b.k == CT_LIST && !b.u.l->range);
    if (op == '*' && seq_a && (b.k == CT_INT || b.k == CT_BOOL))
        return repeat(c, line, a, num_i(b));
    if (op == '*' && seq_b && (a.k == CT_INT || a.k == CT_BOOL))
        return repeat(c, line, b, num_i(a));
    if (op == '+' && (a.k == CT_STR || a.k == CT_LIST))
        ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: can only concatenate %s (not \"%s\") to %s",
                ct_type_name(a), ct_type_name(b), ct_type_name(a));
    ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", names[op],
            ct_type_name(a), ct_type_name(b));
}

ct_val ct_neg(ct_ctx *c, int line, ct_val a, bool minus)
{
    if (a.k == CT_UNDEF)
        ct_fail_undef(c, line, a);
    if (a.k == CT_FLOAT)
        return ct_float(minus ? -a.u.f : a.u.f);
    if (a.k == CT_INT || a.k == CT_BOOL) {
        int64_t x = num_i(a);
        if (minus && x == INT64_MIN)
            overflow(c, line);
        return ct_int(minus ? -x : x);
    }
    ct_fail(c, line, DT_ERR_INVALID_ARG, "TypeError: bad operand type for unary %c: '%s'", minus ? '-' : '+',
            ct_type_name(a));
}
