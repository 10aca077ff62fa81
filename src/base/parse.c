/* Strict parsing of numbers from the environment and the command line, and
 * the escaping of untrusted text in messages.
 *
 * strtol/strtod are too lenient for values that decide a job's shape: they
 * skip leading spaces, accept "0x", "nan" and "inf", stop at the first bad
 * character, and an unsigned parse wraps "-1" to 2^64-1. Here the grammar is
 * written out (digits are read by hand, overflow is checked on every digit),
 * and strtod is only asked to convert text that already matched
 * [+-]digits[.digits][(e|E)[+-]digits]. */
#include "dtrain/base.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *dt_shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    if (!buf || n == 0)
        return buf;
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
    return buf;
}

char *dt_escape(const char *s, char *buf, size_t n)
{
    if (!buf || !n)
        return buf;
    if (!s)
        s = "(null)";
    size_t o = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char tmp[5];
        size_t k;
        if (c == '\n')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\n");
        else if (c == '\t')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\t");
        else if (c == '\r')
            k = (size_t)snprintf(tmp, sizeof tmp, "\\r");
        else if (c < 0x20 || c == 0x7f)
            k = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        else
            tmp[0] = (char)c, tmp[1] = 0, k = 1;
        if (o + k + 1 > n) {
            /* Truncate, marking it, without splitting an escape. */
            size_t m = n > 4 ? n - 4 : 0;
            if (o > m)
                o = m;
            if (n > 4)
                memcpy(buf + o, "...", 3), o += 3;
            break;
        }
        memcpy(buf + o, tmp, k);
        o += k;
    }
    buf[o] = '\0';
    return buf;
}

static dt_status not_a(const char *what, const char *s, const char *kind)
{
    if (!s || !*s)
        return dt_error(DT_ERR_INVALID_ARG, "%s: missing value (expected %s)", what ? what : "value",
                        kind);
    return dt_error(DT_ERR_INVALID_ARG, "%s: '%s' is not %s", what ? what : "value", s, kind);
}

/* Reads [0-9]+ to the end of s into *mag; -1 if not all digits, -2 on
 * overflow of uint64. */
static int read_digits(const char *s, uint64_t *mag)
{
    uint64_t v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -2;
        v = v * 10 + d;
    }
    *mag = v;
    return 0;
}

dt_status dt_parse_int(const char *what, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    if (!s || !*s)
        return not_a(what, s, "an integer");
    bool neg = *s == '-';
    uint64_t mag = 0;
    int r = read_digits(s + neg, &mag);
    if (r == -1)
        return not_a(what, s, "an integer");
    /* INT64_MIN's magnitude is INT64_MAX + 1. */
    if (r == -2 || mag > (uint64_t)INT64_MAX + (neg ? 1u : 0u))
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is out of range [%lld, %lld]", what ? what : "value",
                        s, (long long)lo, (long long)hi);
    int64_t v = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    if (v < lo || v > hi)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is out of range [%lld, %lld]", what ? what : "value",
                        s, (long long)lo, (long long)hi);
    if (out)
        *out = v;
    return DT_OK;
}

dt_status dt_parse_uint(const char *what, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v = 0;
    int r = s ? read_digits(s, &v) : -1;
    if (r == -1)
        return not_a(what, s, "a non-negative integer");
    if (r == -2 || v < lo || v > hi)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is out of range [%llu, %llu]", what ? what : "value",
                        s, (unsigned long long)lo, (unsigned long long)hi);
    if (out)
        *out = v;
    return DT_OK;
}

/* [+-]? digits ( '.' digits? )? | [+-]? '.' digits, then ([eE][+-]?digits)? */
static bool real_syntax(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    size_t nd = 0;
    while (*s >= '0' && *s <= '9')
        s++, nd++;
    if (*s == '.') {
        s++;
        while (*s >= '0' && *s <= '9')
            s++, nd++;
    }
    if (!nd)
        return false;
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!(*s >= '0' && *s <= '9'))
            return false;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    return *s == '\0';
}

dt_status dt_parse_double(const char *what, const char *s, double lo, double hi, double *out)
{
    if (!s || !*s || !real_syntax(s))
        return not_a(what, s, "a finite number");
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || !isfinite(v))
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is out of range [%g, %g]", what ? what : "value", s, lo,
                        hi);
    if (!(v >= lo && v <= hi))
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s is out of range [%g, %g]", what ? what : "value", s, lo,
                        hi);
    if (out)
        *out = v;
    return DT_OK;
}

static const char *env_what(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "environment variable %s", name);
    return buf;
}

dt_status dt_env_int(const char *name, int64_t def, int64_t lo, int64_t hi, int64_t *out)
{
    const char *s = name ? getenv(name) : NULL;
    if (!s || !*s) {
        if (out)
            *out = def;
        return DT_OK;
    }
    char w[160];
    return dt_parse_int(env_what(name, w, sizeof w), s, lo, hi, out);
}

dt_status dt_env_double(const char *name, double def, double lo, double hi, double *out)
{
    const char *s = name ? getenv(name) : NULL;
    if (!s || !*s) {
        if (out)
            *out = def;
        return DT_OK;
    }
    char w[160];
    return dt_parse_double(env_what(name, w, sizeof w), s, lo, hi, out);
}
