/* Reading a DeepSpeed-style JSON config, setting keys, and printing the
 * effective configuration.
 *
 * A config file goes through three passes:
 *   1. clean: `#` and `//` comments outside strings become spaces up to the
 *      end of their line, and a comma whose next non-blank character is `}`
 *      or `]` becomes a space. Nothing moves, so a byte offset in the
 *      cleaned text is the same line and column in the user's file.
 *   2. cJSON parses the cleaned text. On failure it gives the offset where
 *      it stopped; `describe` looks at the characters around it to say what
 *      is wrong in the user's terms (a missing comma after the value of a
 *      named key, a string not closed, the end of the file inside a block).
 *   3. walk: every member is looked up by its dotted path in the key table
 *      (config_keys.c); a block in the table is walked, anything else
 *      unknown is a warning; values are type- and range-checked and stored
 *      into a scratch config, which is merged into the caller's only when
 *      the whole file is good.
 * Columns count characters (UTF-8 code points), not bytes: the seed
 * configs carry comments in Chinese. */
#include "config_impl.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE ((size_t)16 << 20)
#define MAX_MEMBERS 100000

/* ---- the object ----------------------------------------------------------------- */

dt_status dt_config_init(dt_config **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_config_init: out is NULL");
    *out = NULL;
    dt_config *c = calloc(1, sizeof *c);
    if (!c || !(c->vals = calloc(dt__cfg_nkeys, sizeof *c->vals))) {
        free(c);
        return dt_error(DT_ERR_NO_MEMORY, "config: out of memory");
    }
    *out = c;
    return DT_OK;
}

static void val_clear(int k, dt__cfg_val *v)
{
    if (dt__cfg_keys[k].type == DT__KT_STR && v->origin != DT_CONFIG_UNSET)
        free(v->v.s);
    memset(v, 0, sizeof *v);
}

void dt_config_free(dt_config *c)
{
    if (!c)
        return;
    for (size_t k = 0; k < dt__cfg_nkeys; k++)
        val_clear((int)k, &c->vals[k]);
    for (size_t i = 0; i < c->nwarn; i++)
        free(c->warn[i]);
    free(c->warn);
    free(c->vals);
    free(c);
}

void dt__cfg_warn(dt_config *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    for (size_t i = 0; i < c->nwarn; i++)
        if (!strcmp(c->warn[i], buf))
            return; /* said once */
    char **w = realloc(c->warn, (c->nwarn + 1) * sizeof *w);
    if (!w)
        return;
    c->warn = w;
    if ((w[c->nwarn] = strdup(buf)))
        c->nwarn++;
}

size_t dt_config_num_warnings(const dt_config *c) { return c ? c->nwarn : 0; }

const char *dt_config_warning(const dt_config *c, size_t i) { return c && i < c->nwarn ? c->warn[i] : NULL; }

const dt__cfg_val *dt__cfg_get(const dt_config *c, const char *path)
{
    int k = c ? dt__cfg_find(path) : -1;
    return k >= 0 && c->vals[k].origin != DT_CONFIG_UNSET ? &c->vals[k] : NULL;
}

dt_config_origin dt_config_origin_of(const dt_config *c, const char *key)
{
    const dt__cfg_val *v = dt__cfg_get(c, key);
    return v ? v->origin : DT_CONFIG_UNSET;
}

bool dt_config_is_auto(const dt_config *c, const char *key)
{
    int k = c ? dt__cfg_find(key) : -1;
    return k >= 0 && c->vals[k].origin == DT_CONFIG_UNSET && c->vals[k].is_auto;
}

bool dt_config_key_no_effect(const char *key)
{
    int k = dt__cfg_find(key);
    return k >= 0 && (dt__cfg_keys[k].flags & DT__KF_NOOP);
}

static dt_status get_typed(const dt_config *c, const char *key, dt__kt want, const dt__cfg_val **out)
{
    if (!c || !key) /* an error, not an unset key (it was DT_ERR_NOT_FOUND with no message) */
        return dt_error(DT_ERR_NULL, "dt_config_get: NULL %s", !c ? "config" : "key");
    int k = dt__cfg_find(key);
    if (k < 0 || c->vals[k].origin == DT_CONFIG_UNSET)
        return DT_ERR_NOT_FOUND; /* no message: unset is a normal answer */
    dt__kt t = dt__cfg_keys[k].type;
    if (t != want && !(want == DT__KT_FLOAT && t == DT__KT_INT) && !(want == DT__KT_BOOL && t == DT__KT_OBJECT))
        return dt_error(DT_ERR_DTYPE, "config key '%s' is not of the type asked for", key);
    *out = &c->vals[k];
    return DT_OK;
}

dt_status dt_config_get_bool(const dt_config *c, const char *key, bool *out)
{
    const dt__cfg_val *v = NULL;
    dt_status st = get_typed(c, key, DT__KT_BOOL, &v);
    if (st == DT_OK && out)
        *out = v->v.b;
    return st;
}

dt_status dt_config_get_int(const dt_config *c, const char *key, int64_t *out)
{
    const dt__cfg_val *v = NULL;
    dt_status st = get_typed(c, key, DT__KT_INT, &v);
    if (st == DT_OK && out)
        *out = v->v.i;
    return st;
}

dt_status dt_config_get_double(const dt_config *c, const char *key, double *out)
{
    const dt__cfg_val *v = NULL;
    dt_status st = get_typed(c, key, DT__KT_FLOAT, &v);
    if (st == DT_OK && out)
        *out = dt__cfg_keys[dt__cfg_find(key)].type == DT__KT_INT ? (double)v->v.i : v->v.d;
    return st;
}

dt_status dt_config_get_str(const dt_config *c, const char *key, const char **out)
{
    const dt__cfg_val *v = NULL;
    dt_status st = get_typed(c, key, DT__KT_STR, &v);
    if (st == DT_OK && out)
        *out = v->v.s;
    return st;
}

dt_status dt_config_get_pair(const dt_config *c, const char *key, double out[2])
{
    const dt__cfg_val *v = NULL;
    dt_status st = get_typed(c, key, DT__KT_PAIR, &v);
    if (st == DT_OK && out)
        out[0] = v->v.pair[0], out[1] = v->v.pair[1];
    return st;
}

/* ---- one value ---------------------------------------------------------------------- */

/* item as short JSON text for messages */
static void item_text(const cJSON *item, char *buf, size_t n)
{
    if (cJSON_IsNumber(item) && !isfinite(item->valuedouble)) { /* cJSON prints an overflowed 1e400 as null */
        snprintf(buf, n, "a number beyond double's range (%s)", item->valuedouble < 0 ? "-inf" : "inf");
        return;
    }
    char *s = cJSON_PrintUnformatted(item);
    if (!s) {
        snprintf(buf, n, "(a value)");
        return;
    }
    if (strlen(s) > 60)
        snprintf(buf, n, "%.57s...", s);
    else
        snprintf(buf, n, "%s", s);
    free(s);
}

static const char *type_words(const dt__cfg_key *d, char *buf, size_t n)
{
    switch (d->type) {
    case DT__KT_OBJECT: return "an object";
    case DT__KT_BOOL: return "true or false";
    case DT__KT_INT: snprintf(buf, n, "an integer in [%.15g, %.15g]", d->lo, d->hi); return buf;
    case DT__KT_FLOAT: snprintf(buf, n, "a number in [%.15g, %.15g]", d->lo, d->hi); return buf;
    case DT__KT_PAIR: snprintf(buf, n, "an array of two numbers in [%.15g, %.15g]", d->lo, d->hi); return buf;
    case DT__KT_STR:
        if (d->choices)
            snprintf(buf, n, "one of \"%s\"", d->choices);
        else
            snprintf(buf, n, "a string");
        return buf;
    }
    return "?";
}

/* choice spelled as in the table (case-insensitive match), or NULL */
static const char *match_choice(const char *choices, const char *s)
{
    size_t n = strlen(s);
    for (const char *p = choices; *p;) {
        const char *e = strchr(p, '|');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncasecmp(p, s, n))
            return p;
        p += len + (e ? 1 : 0);
    }
    return NULL;
}

/* item into vals[k] of c (origin/source), after type, range and support
 * checks. "auto" and null (where allowed) leave the key unset. */
static dt_status set_item(dt_config *c, int k, const cJSON *item, dt_config_origin origin, const char *source)
{
    const dt__cfg_key *d = &dt__cfg_keys[k];
    dt__cfg_val *cur = &c->vals[k];
    if (cur->origin > origin)
        return DT_OK; /* a stronger origin set it */
    char got[80], want[160];
    if (cJSON_IsString(item) && (d->flags & DT__KF_AUTO) && !strcmp(item->valuestring, "auto")) {
        val_clear(k, cur);
        cur->is_auto = true;
        snprintf(cur->source, sizeof cur->source, "%s", source);
        return DT_OK;
    }
    if (cJSON_IsNull(item) && (d->flags & DT__KF_NULL)) {
        val_clear(k, cur);
        return DT_OK;
    }
    dt__cfg_val v;
    memset(&v, 0, sizeof v);
    v.origin = origin;
    snprintf(v.source, sizeof v.source, "%s", source);
    bool ok = false;
    switch (d->type) {
    case DT__KT_OBJECT:
        ok = cJSON_IsObject(item);
        v.v.b = true;
        break;
    case DT__KT_BOOL:
        ok = cJSON_IsBool(item);
        v.v.b = cJSON_IsTrue(item);
        break;
    case DT__KT_INT: {
        double x = cJSON_IsNumber(item) ? item->valuedouble : NAN;
        ok = isfinite(x) && x == floor(x) && x >= d->lo && x <= d->hi;
        /* 2^63 is what Python's sys.maxsize (DeepSpeed's default of some sizes) reads as: INT64_MAX, not a
           cast out of range */
        v.v.i = !ok ? 0 : x >= 0x1p63 ? INT64_MAX : (int64_t)x;
        break;
    }
    case DT__KT_FLOAT: {
        double x = cJSON_IsNumber(item) ? item->valuedouble : NAN;
        ok = isfinite(x) && x >= d->lo && x <= d->hi;
        v.v.d = x;
        break;
    }
    case DT__KT_PAIR: {
        ok = cJSON_IsArray(item) && cJSON_GetArraySize(item) == 2;
        for (int i = 0; ok && i < 2; i++) {
            const cJSON *e = cJSON_GetArrayItem(item, i);
            double x = cJSON_IsNumber(e) ? e->valuedouble : NAN;
            ok = isfinite(x) && x >= d->lo && x <= d->hi;
            v.v.pair[i] = x;
        }
        break;
    }
    case DT__KT_STR: {
        const char *s = cJSON_IsString(item) ? item->valuestring : NULL;
        if (s && d->choices)
            s = match_choice(d->choices, s);
        ok = s && (d->choices || *s || (d->flags & DT__KF_EMPTY));
        if (ok) {
            size_t len = d->choices ? (size_t)(strchrnul(s, '|') - s) : strlen(s);
            if (!(v.v.s = strndup(s, len)))
                return dt_error(DT_ERR_NO_MEMORY, "config: out of memory");
        }
        break;
    }
    }
    if (!ok) {
        item_text(item, got, sizeof got);
        return dt_error(DT_ERR_INVALID_ARG, "key %s: expected %s%s, got %s (from %s)", d->path,
                        type_words(d, want, sizeof want), d->flags & DT__KF_AUTO ? " or \"auto\"" : "", got,
                        source);
    }
    dt_status st = dt__cfg_check_support(c, k, &v);
    if (st < 0) {
        if (d->type == DT__KT_STR)
            free(v.v.s);
        return st;
    }
    val_clear(k, cur);
    *cur = v;
    return DT_OK;
}

dt_status dt_config_set(dt_config *c, const char *key, const char *json_value, dt_config_origin origin,
                        const char *source)
{
    if (!c || !key || !json_value)
        return dt_error(DT_ERR_NULL, "dt_config_set: NULL argument");
    if (origin < DT_CONFIG_FROM_FILE || origin > DT_CONFIG_FROM_ENV)
        return dt_error(DT_ERR_INVALID_ARG, "dt_config_set: key %s: origin %d is not FILE, CLI or ENV", key,
                        (int)origin);
    int k = dt__cfg_find(key);
    if (k < 0)
        return dt_error(DT_ERR_NOT_FOUND, "unknown config key '%s'", key);
    if (dt__cfg_keys[k].type == DT__KT_OBJECT)
        return dt_error(DT_ERR_INVALID_ARG, "config key '%s' is a block: set its members", key);
    cJSON *item = cJSON_Parse(json_value);
    if (!item)
        return dt_error(DT_ERR_INVALID_ARG, "key %s: '%s' (from %s) is not a JSON value", key, json_value,
                        source ? source : "?");
    dt_status st = set_item(c, k, item, origin, source ? source : "?");
    cJSON_Delete(item);
    return st;
}

dt_status dt_config_resolve(dt_config *c, const char *key, const char *json_value, const char *why)
{
    if (!c || !key || !json_value || !why)
        return dt_error(DT_ERR_NULL, "dt_config_resolve: NULL argument");
    int k = dt__cfg_find(key);
    if (k < 0)
        return dt_error(DT_ERR_NOT_FOUND, "unknown config key '%s'", key);
    dt__cfg_val *cur = &c->vals[k];
    if (cur->origin != DT_CONFIG_UNSET)
        return DT_OK; /* set: nothing to resolve */
    char src[64];
    snprintf(src, sizeof src, "%s: %s", cur->is_auto ? "auto" : "default", why);
    dt_status st = dt_config_set(c, key, json_value, DT_CONFIG_FROM_FILE, src);
    if (st == DT_OK)
        cur->resolved = true;
    return st;
}

/* ---- positions and parse errors ------------------------------------------------ */

static void line_col(const char *buf, size_t off, int *line, int *col)
{
    int l = 1, cl = 1;
    for (size_t i = 0; i < off; i++) {
        if (buf[i] == '\n')
            l++, cl = 1;
        else if (((unsigned char)buf[i] & 0xC0) != 0x80)
            cl++; /* a UTF-8 continuation byte is part of the previous character */
    }
    *line = l;
    *col = cl;
}

/* Comments and trailing commas to spaces (see the top). */
static void clean(char *b, size_t n)
{
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        if (in_str) {
            if (ch == '\\' && i + 1 < n)
                i++;
            else if (ch == '"' || ch == '\n')
                in_str = false;
            continue;
        }
        if (ch == '"') {
            in_str = true;
        } else if (ch == '#' || (ch == '/' && i + 1 < n && b[i + 1] == '/')) {
            while (i < n && b[i] != '\n')
                b[i++] = ' ';
        } else if (ch == ',') {
            size_t j = i + 1;
            for (;;) {
                while (j < n && isspace((unsigned char)b[j]))
                    j++;
                if (j < n && (b[j] == '#' || (b[j] == '/' && j + 1 < n && b[j + 1] == '/'))) {
                    while (j < n && b[j] != '\n')
                        j++;
                    continue;
                }
                break;
            }
            if (j < n && (b[j] == '}' || b[j] == ']'))
                b[i] = ' ';
        }
    }
}

static bool ends_value(char ch) { return ch == '"' || ch == '}' || ch == ']' || isalnum((unsigned char)ch) || ch == '.'; }

static bool starts_value(char ch)
{
    return ch == '"' || ch == '{' || ch == '[' || ch == '-' || isdigit((unsigned char)ch) || ch == 't' || ch == 'f' ||
           ch == 'n';
}

/* The key whose value ends at b[e] (a scalar or string value), into key;
 * false when the text before it is not `"key": value`. */
static bool key_before(const char *b, size_t e, char *key, size_t kn)
{
    size_t i = e;
    if (b[i] == '"') { /* a string value: back to its opening quote */
        if (i == 0)
            return false;
        i--;
        while (i > 0 && !(b[i] == '"' && b[i - 1] != '\\'))
            i--;
        if (b[i] != '"')
            return false;
    } else if (b[i] == '}' || b[i] == ']') {
        return false;
    } else {
        while (i > 0 && (isalnum((unsigned char)b[i - 1]) || b[i - 1] == '.' || b[i - 1] == '-' || b[i - 1] == '+'))
            i--;
    }
    while (i > 0 && isspace((unsigned char)b[i - 1]))
        i--;
    if (i == 0 || b[i - 1] != ':')
        return false;
    i--;
    while (i > 0 && isspace((unsigned char)b[i - 1]))
        i--;
    if (i == 0 || b[i - 1] != '"')
        return false;
    size_t end = --i; /* the key's closing quote */
    while (i > 0 && !(b[i - 1] == '"' && (i < 2 || b[i - 2] != '\\')))
        i--;
    if (i == 0)
        return false;
    size_t len = end - i;
    if (len >= kn)
        len = kn - 1;
    memcpy(key, b + i, len);
    key[len] = 0;
    return true;
}

static void char_words(char ch, char *buf, size_t n)
{
    if (isprint((unsigned char)ch))
        snprintf(buf, n, "'%c'", ch);
    else
        snprintf(buf, n, "byte 0x%02x", (unsigned char)ch);
}

/* What is wrong at offset off of the cleaned text b[0..n), as a sentence. */
static void describe(const char *b, size_t n, size_t *offp, char *msg, size_t mn)
{
    size_t off = *offp;
    if (off > 0 && off <= n && b[off - 1] == '"' && (off < 2 || b[off - 2] != '\\')) {
        /* cJSON stops just inside a string it cannot finish: point at its opening quote */
        size_t i = off;
        while (i < n && b[i] != '"' && b[i] != '\n')
            i += b[i] == '\\' && i + 1 < n ? 2 : 1;
        if (i >= n || b[i] != '"') {
            *offp = off - 1;
            snprintf(msg, mn, "a string is not closed on its line (a '\"' is missing)");
            return;
        }
    }
    while (off < n && isspace((unsigned char)b[off]))
        off++;
    size_t p = off; /* the last non-blank character before off */
    bool have_prev = false;
    while (p > 0) {
        p--;
        if (!isspace((unsigned char)b[p])) {
            have_prev = true;
            break;
        }
    }
    if (off >= n || b[off] == 0) {
        snprintf(msg, mn, "unexpected end of the file: a '{' or '[' is not closed (or a value is missing)");
        return;
    }
    char ch = b[off], cw[16];
    char_words(ch, cw, sizeof cw);
    if (ch == '"') { /* a string that does not close on its line */
        size_t i = off + 1;
        while (i < n && b[i] != '"' && b[i] != '\n') {
            if (b[i] == '\\' && i + 1 < n) {
                if (!strchr("\"\\/bfnrtu", b[i + 1])) {
                    snprintf(msg, mn, "invalid escape '\\%c' in a string", b[i + 1]);
                    return;
                }
                i++;
            }
            i++;
        }
        if (i >= n || b[i] != '"') {
            snprintf(msg, mn, "a string is not closed on its line (a '\"' is missing)");
            return;
        }
    }
    if (have_prev && b[p] == '"' && p > 0) { /* a key (after '{' or ',') wants its ':' */
        size_t q = p - 1;
        while (q > 0 && !(b[q] == '"' && b[q - 1] != '\\'))
            q--;
        size_t r = q;
        while (r > 0 && isspace((unsigned char)b[r - 1]))
            r--;
        if (b[q] == '"' && r > 0 && (b[r - 1] == '{' || b[r - 1] == ',')) {
            snprintf(msg, mn, "expected ':' after a key, found %s", cw);
            return;
        }
    }
    if (have_prev && ends_value(b[p]) && starts_value(ch)) {
        int l, c;
        char key[96];
        line_col(b, p, &l, &c);
        if (key_before(b, p, key, sizeof key))
            snprintf(msg, mn, "missing ',' after the value of \"%s\" (line %d): expected ',' or a closing "
                              "bracket, found %s", key, l, cw);
        else
            snprintf(msg, mn, "missing ',' after the value ending at line %d, column %d: expected ',' or a "
                              "closing bracket, found %s", l, c, cw);
        return;
    }
    if (have_prev && b[p] == ':') {
        snprintf(msg, mn, "expected a value after ':' (a string, number, object, array, true, false or null), "
                          "found %s", cw);
        return;
    }
    if (have_prev && b[p] == '{') {
        snprintf(msg, mn, "expected a key in double quotes or '}', found %s", cw);
        return;
    }
    if (have_prev && (b[p] == ',' || b[p] == '[')) {
        snprintf(msg, mn, "expected a key or a value, found %s", cw);
        return;
    }
    if (have_prev && b[p] == '"') {
        snprintf(msg, mn, "expected ':' after a key, or ',' or a closing bracket after a value, found %s", cw);
        return;
    }
    snprintf(msg, mn, "unexpected %s", cw);
}

/* ---- the walk ------------------------------------------------------------------------ */

typedef struct walker {
    dt_config *tmp;
    const char *name;
    dt_config *warn_to;
    dt_status refused;  /* the first refusal's status (0: none) */
    int nrefused;
    char *why;          /* the refusals' messages, "; "-separated (malloc'd) */
    size_t len, cap;
} walker;

/* A key the walk refused (its type, range or support): the message is kept so
 * that every refused key of a file is reported in one error, not one per run. */
static dt_status refuse(walker *w, dt_status st)
{
    const char *msg = dt_last_error();
    size_t n = strlen(msg) + 3;
    if (w->len + n >= w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 512;
        while (w->len + n >= cap)
            cap *= 2;
        char *b = realloc(w->why, cap);
        if (!b)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", w->name);
        w->why = b;
        w->cap = cap;
    }
    w->len += (size_t)snprintf(w->why + w->len, w->cap - w->len, "%s%s", w->nrefused ? "; " : "", msg);
    if (!w->nrefused++)
        w->refused = st;
    return DT_OK;
}

/* Edit distance of a and b (insertions, deletions, substitutions), counted up to cap. */
static size_t edit_distance(const char *a, const char *b, size_t cap)
{
    size_t na = strlen(a), nb = strlen(b), row[257];
    if (na > 256 || nb > 256)
        return cap;
    for (size_t j = 0; j <= nb; j++)
        row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0], best;
        best = row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j], v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v)
                v = up + 1;
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            diag = up;
            row[j] = v;
            if (v < best)
                best = v;
        }
        if (best >= cap)
            return cap;
    }
    return row[nb];
}

/* The key of the table an unknown path is most likely a misspelling of (a few characters off, or the
 * key's name cut short at a '_' or '.'), or NULL: the warning names it, so that a key dtrain would
 * have used is not lost to a typo unnoticed. */
static const char *nearest_key(const char *path)
{
    size_t n = strlen(path), best = 4, cap = n / 4 + 1 < 4 ? n / 4 + 1 : 4;
    const char *pick = NULL;
    for (size_t k = 0; k < dt__cfg_nkeys; k++) {
        const char *key = dt__cfg_keys[k].path;
        if (n >= 8 && !strncmp(key, path, n) && (key[n] == '_' || key[n] == '.'))
            return key;
        size_t d = edit_distance(path, key, cap);
        if (d < cap && d < best)
            best = d, pick = key;
    }
    return pick;
}

/* Other spellings DeepSpeed reads for a key of the table: the bf16 block's old name (read only when bf16
 * is not there), and the names of ZeRO's stage-3 fields without their "stage3_" prefix (pydantic
 * aliases: DeepSpeed takes either spelling). */
typedef struct dt__cfg_alias {
    const char *prefix, *alias, *name;
    bool old_name; /* the other spelling beside it: ignored with a warning (else an error) */
} dt__cfg_alias;

static const dt__cfg_alias aliases[] = {
    {"", "bfloat16", "bf16", true},
    {"zero_optimization", "prefetch_bucket_size", "stage3_prefetch_bucket_size", false},
    {"zero_optimization", "param_persistence_threshold", "stage3_param_persistence_threshold", false},
    {"zero_optimization", "model_persistence_threshold", "stage3_model_persistence_threshold", false},
    {"zero_optimization", "max_live_parameters", "stage3_max_live_parameters", false},
    {"zero_optimization", "max_reuse_distance", "stage3_max_reuse_distance", false},
};

static const dt__cfg_alias *alias_of(const char *prefix, const char *name)
{
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(aliases[i].prefix, prefix) && !strcmp(aliases[i].alias, name))
            return &aliases[i];
    return NULL;
}

static dt_status walk(walker *w, const cJSON *obj, const char *prefix)
{
    int count = 0;
    for (const cJSON *m = obj->child; m; m = m->next) {
        if (++count > MAX_MEMBERS)
            return dt_error(DT_ERR_FORMAT, "%s: more than %d members in one object", w->name, MAX_MEMBERS);
        for (const cJSON *o = obj->child; o != m; o = o->next)
            if (!strcmp(o->string, m->string))
                return dt_error(DT_ERR_FORMAT, "%s: key %s%s%s appears twice", w->name, prefix,
                                *prefix ? "." : "", m->string);
        const char *name = m->string;
        const dt__cfg_alias *al = alias_of(prefix, name);
        if (al) {
            const cJSON *both = cJSON_GetObjectItemCaseSensitive(obj, al->name);
            if (both && al->old_name) { /* DeepSpeed reads the old name only without the new one */
                dt__cfg_warn(w->warn_to, "%s: key %s%s%s ignored: %s is given (DeepSpeed reads the old name only "
                                         "without it)", w->name, prefix, *prefix ? "." : "", name, al->name);
                continue;
            }
            if (both)
                return dt_error(DT_ERR_FORMAT, "%s: keys %s%s%s and %s name the same setting: give one", w->name,
                                prefix, *prefix ? "." : "", name, al->name);
            name = al->name;
        }
        char path[256];
        if ((size_t)snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", name) >= sizeof path) {
            dt__cfg_warn(w->warn_to, "%s: unknown key %.80s... (ignored)", w->name, path);
            continue;
        }
        int k = dt__cfg_find(path);
        if (k < 0) {
            const char *near = nearest_key(path);
            dt__cfg_warn(w->warn_to, "%s: unknown key %s (ignored)%s%s%s", w->name, path, near ? "; did you mean " : "",
                         near ? near : "", near ? "?" : "");
            continue;
        }
        dt_status st = set_item(w->tmp, k, m, DT_CONFIG_FROM_FILE, "file");
        if (st == DT_ERR_INVALID_ARG || st == DT_ERR_UNSUPPORTED) { /* refused: note it, go on to the others */
            if ((st = refuse(w, st)) < 0)
                return st;
            continue;
        }
        if (st < 0)
            return dt_error_wrap(st, "%s", w->name);
        if (dt__cfg_keys[k].type == DT__KT_OBJECT && (st = walk(w, m, path)) < 0)
            return st;
    }
    return DT_OK;
}

/* Every key tmp set, into c (file origin: replaces only unset or file values). */
static void merge(dt_config *c, dt_config *tmp)
{
    for (size_t k = 0; k < dt__cfg_nkeys; k++) {
        dt__cfg_val *t = &tmp->vals[k], *d = &c->vals[k];
        if ((t->origin == DT_CONFIG_UNSET && !t->is_auto) || d->origin > DT_CONFIG_FROM_FILE)
            continue;
        val_clear((int)k, d);
        *d = *t;
        memset(t, 0, sizeof *t); /* moved */
    }
}

dt_status dt_config_load_string(dt_config *c, const char *name, const char *text, size_t n)
{
    if (!c || (!text && n))
        return dt_error(DT_ERR_NULL, "dt_config_load_string: NULL argument");
    if (!name)
        name = "config";
    if (n > MAX_FILE)
        return dt_error(DT_ERR_FORMAT, "%s: %zu bytes, more than a config may have (%zu)", name, n, MAX_FILE);
    char *b = malloc(n + 1);
    if (!b)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    if (n)
        memcpy(b, text, n);
    b[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (b[i] == 0) {
            int l, col;
            line_col(b, i, &l, &col);
            free(b);
            return dt_error(DT_ERR_FORMAT, "%s:%d:%d: a NUL byte (is this a text file?)", name, l, col);
        }
    clean(b, n);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(b, n, &end, 0);
    size_t off = end ? (size_t)(end - b) : 0;
    if (root) { /* nothing but blanks may follow the top-level value */
        while (off < n && isspace((unsigned char)b[off]))
            off++;
        if (off < n) {
            cJSON_Delete(root);
            root = NULL;
            int l, col;
            line_col(b, off, &l, &col);
            dt_status st = dt_error(DT_ERR_FORMAT, "%s:%d:%d: unexpected text after the end of the top-level "
                                                   "object (an extra '}'?)", name, l, col);
            free(b);
            return st;
        }
    }
    if (!root) {
        char msg[300];
        int l, col;
        size_t at = off;
        while (at < n && isspace((unsigned char)b[at]))
            at++;
        size_t moved = off;
        describe(b, n, &moved, msg, sizeof msg);
        if (moved != off)
            at = moved;
        line_col(b, at < n ? at : n, &l, &col);
        dt_status st = dt_error(DT_ERR_FORMAT, "%s:%d:%d: %s", name, l, col, msg);
        free(b);
        return st;
    }
    free(b);
    dt_status st = DT_OK;
    if (!cJSON_IsObject(root)) {
        st = dt_error(DT_ERR_FORMAT, "%s: the config must be a JSON object ({...})", name);
        goto out_root;
    }
    dt_config *tmp;
    if ((st = dt_config_init(&tmp)) < 0)
        goto out_root;
    walker w = {.tmp = tmp, .name = name, .warn_to = tmp};
    st = walk(&w, root, "");
    if (st == DT_OK && w.nrefused == 1)
        st = dt_error(w.refused, "%s: %s", name, w.why);
    else if (st == DT_OK && w.nrefused > 1)
        st = dt_error(w.refused, "%s: %d keys refused: %s", name, w.nrefused, w.why);
    free(w.why);
    if (st == DT_OK) {
        merge(c, tmp);
        for (size_t i = 0; i < tmp->nwarn; i++)
            dt__cfg_warn(c, "%s", tmp->warn[i]);
    }
    dt_config_free(tmp);
out_root:
    cJSON_Delete(root);
    return st;
}

dt_status dt_config_load_file(dt_config *c, const char *path)
{
    if (!c || !path)
        return dt_error(DT_ERR_NULL, "dt_config_load_file: NULL argument");
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_error(DT_ERR_IO, "%s: not a regular file", path);
    }
    if ((size_t)sb.st_size > MAX_FILE) {
        close(fd);
        return dt_error(DT_ERR_FORMAT, "%s: %lld bytes, more than a config may have (%zu)", path,
                        (long long)sb.st_size, MAX_FILE);
    }
    size_t n = (size_t)sb.st_size, got = 0;
    char *b = malloc(n + 1);
    if (!b) {
        close(fd);
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    }
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            dt_status st = dt_error(DT_ERR_IO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "short file");
            free(b);
            close(fd);
            return st;
        }
        got += (size_t)r;
    }
    close(fd);
    dt_status st = dt_config_load_string(c, path, b, n);
    free(b);
    return st;
}

/* ---- the effective configuration ---------------------------------------------------- */

static cJSON *val_json(int k, const dt__cfg_val *v)
{
    switch (dt__cfg_keys[k].type) {
    case DT__KT_OBJECT:
    case DT__KT_BOOL: return cJSON_CreateBool(v->v.b);
    case DT__KT_INT: return cJSON_CreateNumber((double)v->v.i);
    case DT__KT_FLOAT: return cJSON_CreateNumber(v->v.d);
    case DT__KT_STR: return cJSON_CreateString(v->v.s);
    case DT__KT_PAIR: return cJSON_CreateDoubleArray(v->v.pair, 2);
    }
    return cJSON_CreateNull();
}

char *dt_config_effective_json(const dt_config *c)
{
    cJSON *root = cJSON_CreateObject(), *vals = cJSON_CreateObject(), *from = cJSON_CreateObject();
    bool ok = root && vals && from;
    if (ok) {
        cJSON_AddItemToObject(root, "values", vals);
        cJSON_AddItemToObject(root, "from", from);
    } else {
        cJSON_Delete(vals);
        cJSON_Delete(from);
    }
    cJSON *noop = NULL;
    for (size_t k = 0; ok && c && k < dt__cfg_nkeys; k++) {
        const dt__cfg_val *v = &c->vals[k];
        if (v->origin == DT_CONFIG_UNSET || dt__cfg_keys[k].type == DT__KT_OBJECT)
            continue;
        cJSON *j = val_json((int)k, v), *s = cJSON_CreateString(v->source);
        ok = j && s && cJSON_AddItemToObject(vals, dt__cfg_keys[k].path, j) &&
             cJSON_AddItemToObject(from, dt__cfg_keys[k].path, s);
        if (ok && (dt__cfg_keys[k].flags & DT__KF_NOOP)) { /* "no_effect": [KEY, ...], only when there is one */
            cJSON *name = cJSON_CreateString(dt__cfg_keys[k].path);
            ok = name && (noop || (noop = cJSON_AddArrayToObject(root, "no_effect"))) &&
                 cJSON_AddItemToArray(noop, name);
        }
    }
    char *out = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out;
}

char *dt_config_effective_text(const dt_config *c)
{
    size_t cap = 256, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    out[0] = 0;
    for (size_t k = 0; c && k < dt__cfg_nkeys; k++) {
        const dt__cfg_val *v = &c->vals[k];
        if (v->origin == DT_CONFIG_UNSET || dt__cfg_keys[k].type == DT__KT_OBJECT)
            continue;
        cJSON *j = val_json((int)k, v);
        char *js = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
        if (!js) {
            free(out);
            return NULL;
        }
        const char *mark = dt__cfg_keys[k].flags & DT__KF_NOOP ? "; no effect in dtrain" : "";
        size_t need = strlen(dt__cfg_keys[k].path) + strlen(js) + strlen(v->source) + strlen(mark) + 16;
        if (len + need >= cap) {
            while (len + need >= cap)
                cap *= 2;
            char *t = realloc(out, cap);
            if (!t) {
                free(js);
                free(out);
                return NULL;
            }
            out = t;
        }
        len += (size_t)snprintf(out + len, cap - len, "  %s = %s  (%s%s)\n", dt__cfg_keys[k].path, js, v->source,
                                mark);
        free(js);
    }
    return out;
}
