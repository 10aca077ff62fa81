/* A strict parser for flat JSON objects, one per line: the records of a
 * metrics file. Values may be numbers, strings (with escapes), true, false
 * or null; nested objects and arrays are rejected as malformed (the metrics
 * file never holds them). */
#include "train.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *ws(const char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
        s++;
    return s;
}

/* Parse a string at s (at the opening quote) into buf; returns the char
 * after the closing quote or NULL. */
static const char *str(const char *s, char *buf, size_t n, char *err, size_t errn)
{
    size_t k = 0;
    s++;
    while (*s && *s != '"') {
        char c = *s++;
        if ((unsigned char)c < 0x20) {
            snprintf(err, errn, "control character in a string");
            return NULL;
        }
        if (c == '\\') {
            char e = *s++;
            switch (e) {
            case '"': c = '"'; break;
            case '\\': c = '\\'; break;
            case '/': c = '/'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u':
                for (int i = 0; i < 4; i++)
                    if (!isxdigit((unsigned char)s[i])) {
                        snprintf(err, errn, "bad \\u escape");
                        return NULL;
                    }
                s += 4;
                c = '?';
                break;
            default:
                snprintf(err, errn, "bad escape in a string");
                return NULL;
            }
        }
        if (k + 1 < n)
            buf[k++] = c;
    }
    if (*s != '"') {
        snprintf(err, errn, "unterminated string");
        return NULL;
    }
    buf[k] = 0;
    return s + 1;
}

/* Length of the JSON number at s (RFC 8259: -?(0|[1-9][0-9]*)(.[0-9]+)?
 * ([eE][+-]?[0-9]+)?), 0 if there is none. strtod alone would also take
 * "-nan", "-inf", "0x1p3" and leading zeros. */
static size_t number_len(const char *s)
{
    const char *p = s;
    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (isdigit((unsigned char)*p))
            p++;
    else
        return 0;
    if (*p == '.' && isdigit((unsigned char)p[1]))
        for (p++; isdigit((unsigned char)*p);)
            p++;
    if ((*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (*q == '+' || *q == '-')
            q++;
        if (isdigit((unsigned char)*q)) {
            while (isdigit((unsigned char)*q))
                q++;
            p = q;
        }
    }
    return (size_t)(p - s);
}

int dt__json_parse_line(const char *line, dt__json_obj *o, char *err, size_t errn)
{
    o->n = 0;
    const char *s = ws(line);
    if (*s != '{') {
        snprintf(err, errn, "expected '{'");
        return -1;
    }
    s = ws(s + 1);
    if (*s == '}')
        goto end;
    for (;;) {
        if (o->n == DT__JSON_MAX_FIELDS) {
            snprintf(err, errn, "more than %d fields", DT__JSON_MAX_FIELDS);
            return -1;
        }
        dt__json_field *f = &o->f[o->n];
        memset(f, 0, sizeof *f);
        if (*s != '"') {
            snprintf(err, errn, "expected a key string");
            return -1;
        }
        if (!(s = str(s, f->key, sizeof f->key, err, errn)))
            return -1;
        s = ws(s);
        if (*s != ':') {
            snprintf(err, errn, "expected ':' after \"%s\"", f->key);
            return -1;
        }
        s = ws(s + 1);
        if (*s == '"') {
            f->type = DT__JSON_STR;
            if (!(s = str(s, f->str, sizeof f->str, err, errn)))
                return -1;
        } else if (!strncmp(s, "true", 4) || !strncmp(s, "false", 5)) {
            f->type = DT__JSON_BOOL;
            f->num = *s == 't';
            s += *s == 't' ? 4 : 5;
        } else if (!strncmp(s, "null", 4)) {
            f->type = DT__JSON_NULL;
            s += 4;
        } else if (*s == '-' || isdigit((unsigned char)*s)) {
            char *end;
            size_t len = number_len(s);
            f->type = DT__JSON_NUM;
            f->num = strtod(s, &end);
            if (len == 0 || end != s + len) {
                snprintf(err, errn, "bad number for \"%s\"", f->key);
                return -1;
            }
            s = end;
        } else {
            snprintf(err, errn, "unsupported value for \"%s\"", f->key);
            return -1;
        }
        o->n++;
        s = ws(s);
        if (*s == ',') {
            s = ws(s + 1);
            continue;
        }
        if (*s == '}')
            break;
        snprintf(err, errn, "expected ',' or '}'");
        return -1;
    }
end:
    s = ws(s + 1);
    if (*s) {
        snprintf(err, errn, "text after the object");
        return -1;
    }
    return 0;
}

const dt__json_field *dt__json_get(const dt__json_obj *o, const char *key)
{
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->f[i].key, key))
            return &o->f[i];
    return NULL;
}
