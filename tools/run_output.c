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
 * reads valid JSON; every other line, and every stderr line, is prefixed.
 *
 * A progress bar redraws one line with "\r...": when the launcher's stdout is
 * a terminal (live streams) a partial line holding a '\r' is forwarded at
 * once, each '\r' followed by the prefix again, so rank 0's bar moves live;
 * the --tee file gets only the line's final state, without escape codes. */
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

/* p[0..n) to the console: the prefix first when at_start, again after every
 * '\r'; a newline at the end when newline. */
static void console_raw(dt__run_stream *s, const char *p, size_t n, bool at_start, bool newline)
{
    char prefix[24];
    int plen = snprintf(prefix, sizeof prefix, "[%d] ", s->rank);
    size_t ncr = 0;
    for (size_t i = 0; i < n; i++)
        ncr += p[i] == '\r';
    size_t total = (at_start ? (size_t)plen : 0) + n + ncr * (size_t)plen + (newline ? 1 : 0);
    char *out = malloc(total ? total : 1);
    if (!out)
        return;
    size_t k = 0;
    if (at_start)
        memcpy(out, prefix, (size_t)plen), k = (size_t)plen;
    for (size_t i = 0; i < n; i++) {
        out[k++] = p[i];
        if (p[i] == '\r')
            memcpy(out + k, prefix, (size_t)plen), k += (size_t)plen;
    }
    if (newline)
        out[k++] = '\n';
    (void)dt__run_write_all(s->dst, out, k);
    free(out);
}

/* The tee file gets a redrawn line's final state: the text after its last
 * '\r', without the erase-to-end escape. */
static void tee_line(dt__run_stream *s, const char *line, size_t n)
{
    const char *cr = NULL;
    for (size_t i = 0; i < n; i++)
        if (line[i] == '\r')
            cr = line + i;
    if (cr) {
        n -= (size_t)(cr + 1 - line);
        line = cr + 1;
    }
    size_t start = 0;
    for (size_t i = 0; i + 3 <= n; i++) {
        if (line[i] == '\033' && line[i + 1] == '[' && line[i + 2] == 'K') {
            (void)dt__run_write_all(s->tee, line + start, i - start);
            start = i + 3;
            i += 2;
        }
    }
    (void)dt__run_write_all(s->tee, line + start, n - start);
    (void)dt__run_write_all(s->tee, "\n", 1);
}

/* Forward one line (without its newline) to the console with the prefix and
 * to the tee file without it. Output errors (a closed console) are ignored:
 * the job keeps running and the tee file keeps receiving. */
static void emit_line(dt__run_stream *s, const char *line, size_t n)
{
    if (s->sent > 0 || memchr(line, '\r', n)) {
        size_t sent = s->sent < n ? s->sent : n;
        console_raw(s, line + sent, n - sent, sent == 0, true);
        s->sent = 0;
        if (s->tee >= 0)
            tee_line(s, line, n);
        return;
    }
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
    if (start > 0)
        s->sent = 0; /* emit_line consumed it; the next line starts fresh */
    if (s->len - start >= DT_RUN_MAX_LINE) {
        emit_line(s, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    /* a bar redrawn with '\r': forward what is new now, not at the newline */
    if (s->live && s->len > s->sent && memchr(s->buf + s->sent, '\r', s->len - s->sent)) {
        console_raw(s, s->buf + s->sent, s->len - s->sent, s->sent == 0, false);
        s->sent = s->len;
    }
    return 1;
}

void dt__run_stream_close(dt__run_stream *s)
{
    if (s->len > 0)
        emit_line(s, s->buf, s->len);
    s->len = 0;
    s->sent = 0;
    free(s->buf);
    s->buf = NULL;
    s->cap = 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}
