/* src/base/sbuf.h — a growing byte string for the library's own text
 * (safetensors headers, vocabulary files).
 *
 * Start from `dt__sbuf b = {0};`, append with dt__sbuf_put, free(b.p) at the
 * end. The text stays NUL-terminated. An allocation failure sets b.oom and
 * makes every later append a no-op, so a writer appends freely and checks
 * oom once before using the text.
 *
 * Layer-internal: base's byte string for every layer that writes text (ckpt:
 * safetensors headers; data: vocabulary files). Not installed, not for users. */
#ifndef DT_BASE_SBUF_H
#define DT_BASE_SBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dt__sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} dt__sbuf;

/* Append n bytes of s (grows by doubling from 256 bytes). */
void dt__sbuf_put(dt__sbuf *b, const char *s, size_t n);

#endif
