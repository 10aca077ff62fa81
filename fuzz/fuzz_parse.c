/* libFuzzer target for the strict number parser of environment variables
 * and command-line flags (src/base/parse.c: dt_parse_int, dt_parse_uint,
 * dt_parse_double) and for dt_escape, which every message passes through.
 *
 * Input: byte 0 picks the function, bytes 1-16 give the range [lo, hi]
 * (two int64, uint64 or doubles), the rest is the text (up to its first
 * NUL). Checked against an independent oracle: a number is accepted exactly
 * when the whole text is a plain number (-?[0-9]+ for integers, [0-9]+
 * unsigned, a finite decimal for reals), strtoll/strtoull/strtod read it
 * without overflow, and the value lies in [lo, hi]; an accepted value
 * equals the oracle's and reads back from its own printed form; a rejected
 * one leaves *out untouched and sets a message. dt_escape's output fits
 * its buffer and holds no control character. */
// fuzz-sources: src/base/*.c
// fuzz-libs: -lcjson
#include "dtrain/base.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plain_number.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_error(dt_status st)
{
    if (st >= 0 || dt_last_error()[0] == 0)
        abort(); /* a rejection must be an error with a message */
}

static void fuzz_int(const char *s, int64_t lo, int64_t hi)
{
    int64_t v = 0x5a5a5a5a5a5a5a5a, w;
    dt_error_clear();
    dt_status st = dt_parse_int("fuzz", s, lo, hi, &v);
    errno = 0;
    char *end;
    long long x = plain_int(s, 1) ? strtoll(s, &end, 10) : 0;
    int ok = plain_int(s, 1) && errno == 0 && x >= lo && x <= hi;
    if (!ok) {
        check_error(st);
        if (v != 0x5a5a5a5a5a5a5a5a)
            abort(); /* *out written on failure */
        return;
    }
    if (st != DT_OK || v != x)
        abort();
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    if (dt_parse_int("fuzz", buf, lo, hi, &w) != DT_OK || w != v)
        abort();
}

static void fuzz_uint(const char *s, uint64_t lo, uint64_t hi)
{
    uint64_t v = 0x5a5a5a5a5a5a5a5a, w;
    dt_error_clear();
    dt_status st = dt_parse_uint("fuzz", s, lo, hi, &v);
    errno = 0;
    char *end;
    unsigned long long x = plain_int(s, 0) ? strtoull(s, &end, 10) : 0;
    int ok = plain_int(s, 0) && errno == 0 && x >= lo && x <= hi;
    if (!ok) {
        check_error(st);
        if (v != 0x5a5a5a5a5a5a5a5a)
            abort();
        return;
    }
    if (st != DT_OK || v != x)
        abort();
    char buf[32];
    snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
    if (dt_parse_uint("fuzz", buf, lo, hi, &w) != DT_OK || w != v)
        abort();
}

static void fuzz_double(const char *s, double lo, double hi)
{
    double v = 12345.0, w;
    dt_error_clear();
    dt_status st = dt_parse_double("fuzz", s, lo, hi, &v);
    double x = plain_real(s) ? strtod(s, NULL) : NAN;
    int ok = plain_real(s) && isfinite(x) && x >= lo && x <= hi;
    if (!ok) {
        check_error(st);
        if (v != 12345.0)
            abort();
        return;
    }
    if (st != DT_OK || !isfinite(v) || v != x)
        abort();
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    if (dt_parse_double("fuzz", buf, lo, hi, &w) != DT_OK || w != v)
        abort();
}

static void fuzz_escape(const char *s, size_t n)
{
    char buf[300];
    memset(buf, 0x7f, sizeof buf);
    if (dt_escape(s, buf, n) != buf)
        abort();
    size_t len = strnlen(buf, n);
    if (len >= n)
        abort(); /* not terminated inside the buffer */
    if (n < sizeof buf && (unsigned char)buf[n] != 0x7f)
        abort(); /* wrote past n */
    int has_ctl = 0;
    for (const char *p = s; *p; p++)
        has_ctl |= (unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] == 0x7f)
            abort();
    if (!has_ctl && strlen(s) < n && strcmp(buf, s) != 0)
        abort(); /* plain text that fits comes back as it is */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 17 || size > 4096)
        return 0;
    uint8_t which = data[0];
    char *s = malloc(size - 17 + 1);
    if (!s)
        return 0;
    memcpy(s, data + 17, size - 17);
    s[size - 17] = 0;
    switch (which % 4) {
    case 0: {
        int64_t lo, hi;
        memcpy(&lo, data + 1, 8);
        memcpy(&hi, data + 9, 8);
        fuzz_int(s, lo, hi);
        break;
    }
    case 1: {
        uint64_t lo, hi;
        memcpy(&lo, data + 1, 8);
        memcpy(&hi, data + 9, 8);
        fuzz_uint(s, lo, hi);
        break;
    }
    case 2: {
        double lo, hi;
        memcpy(&lo, data + 1, 8);
        memcpy(&hi, data + 9, 8);
        fuzz_double(s, lo, hi);
        break;
    }
    default:
        fuzz_escape(s, 1 + data[1] % 299);
        break;
    }
    free(s);
    return 0;
}
