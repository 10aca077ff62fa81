/* libFuzzer target for the metrics-file reader of `dtrain plot`
 * (tools/train_json.c: one flat JSON object per line).
 *
 * Any line must give either an object or an error with a message; never a
 * crash. An accepted object must be well formed (keys and strings
 * terminated within their buffers, at most DT__JSON_MAX_FIELDS fields), and
 * must survive a round trip: written back as JSON and read again, it gives
 * the same keys, types, strings and (finite) numbers. */
// fuzz-sources: tools/train_json.c
#include "train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Append s as a JSON string to out (capacity cap, at *k). */
static void put_str(char *out, size_t cap, size_t *k, const char *s)
{
    *k += (size_t)snprintf(out + *k, cap - *k, "\"");
    for (; *s && *k + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            *k += (size_t)snprintf(out + *k, cap - *k, "\\%c", c);
        else if (c < 0x20 && strchr("\b\f\n\r\t", c))
            *k += (size_t)snprintf(out + *k, cap - *k, "\\%c", "bfnrt"[strchr("\b\f\n\r\t", c) - "\b\f\n\r\t"]);
        else if (c < 0x20)
            abort(); /* only those five escapes make a control character */
        else
            out[(*k)++] = (char)c;
    }
    *k += (size_t)snprintf(out + *k, cap - *k, "\"");
}

static int same_field(const dt__json_field *a, const dt__json_field *b)
{
    if (strcmp(a->key, b->key) || a->type != b->type)
        return 0;
    if (a->type == DT__JSON_STR)
        return !strcmp(a->str, b->str);
    if (a->type == DT__JSON_NUM && isfinite(a->num))
        return a->num == b->num;
    return a->type != DT__JSON_BOOL || a->num == b->num;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dt__json_obj o, o2;
    static char out[DT__JSON_MAX_FIELDS * 1600];
    char *line = malloc(size + 1);
    if (!line)
        return 0;
    memcpy(line, data, size);
    line[size] = 0;
    char err[128] = "";
    int rc = dt__json_parse_line(line, &o, err, sizeof err);
    free(line);
    if (rc < 0) {
        if (!err[0])
            abort(); /* an error must come with a message */
        return 0;
    }
    if (o.n < 0 || o.n > DT__JSON_MAX_FIELDS)
        abort();
    size_t k = 0;
    k += (size_t)snprintf(out + k, sizeof out - k, "{");
    for (int i = 0; i < o.n; i++) {
        const dt__json_field *f = &o.f[i];
        if (!memchr(f->key, 0, sizeof f->key) || !memchr(f->str, 0, sizeof f->str))
            abort();
        if (dt__json_get(&o, f->key) == NULL)
            abort();
        if (i)
            out[k++] = ',';
        put_str(out, sizeof out, &k, f->key);
        out[k++] = ':';
        switch (f->type) {
        case DT__JSON_STR: put_str(out, sizeof out, &k, f->str); break;
        case DT__JSON_BOOL: k += (size_t)snprintf(out + k, sizeof out - k, f->num ? "true" : "false"); break;
        case DT__JSON_NULL: k += (size_t)snprintf(out + k, sizeof out - k, "null"); break;
        case DT__JSON_NUM:
            /* a number too large for a double reads as +-inf: written as a
             * huge literal, it reads back as the same inf */
            if (isnan(f->num))
                abort(); /* NaN is not a JSON number */
            if (isinf(f->num))
                k += (size_t)snprintf(out + k, sizeof out - k, "%s1e999", f->num < 0 ? "-" : "");
            else
                k += (size_t)snprintf(out + k, sizeof out - k, "%.17g", f->num);
            break;
        }
    }
    k += (size_t)snprintf(out + k, sizeof out - k, "}");
    if (dt__json_parse_line(out, &o2, err, sizeof err) < 0 || o2.n != o.n)
        abort();
    for (int i = 0; i < o.n; i++)
        if (!same_field(&o.f[i], &o2.f[i]))
            abort();
    return 0;
}
