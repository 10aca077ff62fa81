/* Rank output forwarding for `dtrain run`.
 *
 * Each rank writes into its own pair of pipes (stdout, stderr). The launcher
 * is single-threaded and forwards only complete lines, each with one write()
 * of "[rank] line\n", so lines of different ranks never interleave inside a
 * line. A partial line stays buffered until its newline arrives, the rank
 * closes the pipe (flushed with a newline added), or it grows past
 * DT_RUN_MAX_LINE (forwarded in pieces so a rank that never prints a newline
 * cannot make the launcher grow without bound).
 *
 * A stdout line that is a whole JSON object or array (what --json modes
 * print) is forwarded without the prefix, so `dtrain run ... --json | jq .`
 * reads valid JSON; every other line, and every stderr line, is prefixed. */
#include "run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DT_RUN_MAX_LINE (1u << 20)
#define DT_RUN_READ_CHUNK 65536

int dt__run_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static bool is_json_line(const char *line, size_t n)
{
    size_t i = 0;
    while (i < n && (line[i] == ' ' || line[i] == '\t'))
        i++;
    if (i == n || (line[i] != '{' && line[i] != '['))
        return false;
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line + i, n - i, &end, false);
    bool ok = j != NULL;
    for (const char *q = end; ok && q < line + n; q++)
        ok = *q == ' ' || *q == '\t' || *q == '\r';
    cJSON_Delete(j);
    return ok;
}

/* Forward one line (without its newline) to the console with the prefix and
 * to the tee file without it. Output errors (a closed console) are ignored:
 * the job keeps running and the tee file keeps receiving. */
static void emit_line(dt__run_stream *s, const char *line, size_t n)
{
    char prefix[24];
    int plen = s->dst == 1 && is_json_line(line, n) ? 0 : snprintf(prefix, sizeof prefix, "[%d] ", s->rank);
    char small[4096];
    size_t total = (size_t)plen + n + 1;
    char *out = total <= sizeof small ? small : malloc(total);
    if (out) {
        memcpy(out, prefix, (size_t)plen);
        memcpy(out + plen, line, n);
        out[total - 1] = '\n';
        (void)dt__run_write_all(s->dst, out, total);
        if (out != small)
            free(out);
    }
    if (s->tee >= 0) {
        (void)dt__run_write_all(s->tee, line, n);
        (void)dt__run_write_all(s->tee, "\n", 1);
    }
}

static int reserve(dt__run_stream *s, size_t extra)
{
    if (s->len + extra <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + extra)
        cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b)
        return -1;
    s->buf = b;
    s->cap = cap;
    return 0;
}

int dt__run_stream_pump(dt__run_stream *s)
{
    if (s->fd < 0)
        return 0;
    if (reserve(s, DT_RUN_READ_CHUNK) < 0)
        return -1;
    ssize_t r = read(s->fd, s->buf + s->len, DT_RUN_READ_CHUNK);
    if (r < 0) {
        if (errno == EINTR || errno == EAGAIN)
            return 1;
        dt__run_stream_close(s);
        return -1;
    }
    if (r == 0) {
        dt__run_stream_close(s);
        return 0;
    }
    size_t scan = s->len;
    s->len += (size_t)r;
    size_t start = 0;
    for (size_t i = scan; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(s, s->buf + start, i - start);
            start = i + 1;
        }
    }
    if (s->len - start >= DT_RUN_MAX_LINE) {
        emit_line(s, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    return 1;
}

void dt__run_stream_close(dt__run_stream *s)
{
    if (s->len > 0)
        emit_line(s, s->buf, s->len);
    s->len = 0;
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}
