/* The --metrics file: JSON lines, one record per line, each written with a
 * single write(2) the moment it happens, so nothing is lost when the run
 * stops.
 *
 * The file rule (docs/TRAINING.md): records go to PATH.partial while the run
 * lasts (an older PATH.partial is replaced; an older PATH is left alone).
 * The last record is {"event":"end","status":...}. A run that finished
 * ("ok") renames PATH.partial to PATH; a run that was interrupted or failed
 * leaves PATH untouched and its records, end record included, in
 * PATH.partial. So PATH only ever holds a finished run, and a run's records
 * are never deleted. Neither name is written through a symlink
 * (dt_file, base.h).
 *
 * A resumed run continues the history it resumes (dt__metrics_open with
 * resume_step >= 0): the newer of PATH.partial (an interrupted attempt) and
 * PATH (a finished one) is read, its records up to the checkpoint's step
 * are kept and those after it dropped (the earlier attempt went on past the
 * checkpoint; TensorBoard's purge_step does the same), and the new
 * PATH.partial starts with them (written whole, then renamed over the old
 * one: a crash leaves the old or the new, never a mix). */
#include "train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double unix_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The whole of a regular file (not through a symlink) into *buf (malloc'd). */
static dt_status slurp(const char *path, char **buf, size_t *n)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "cannot read %s: %s", path,
                        errno == ELOOP ? "a symbolic link (dtrain does not follow them)" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dt_error(DT_ERR_IO, "cannot read %s: not a regular file", path);
    }
    size_t cap = (size_t)st.st_size, got = 0;
    char *b = malloc(cap + 1);
    if (!b) {
        close(fd);
        return dt_error(DT_ERR_NO_MEMORY, "out of memory reading %s", path);
    }
    while (got < cap) {
        ssize_t r = read(fd, b + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* shorter than fstat said: take what is there */
        got += (size_t)r;
    }
    close(fd);
    b[got] = 0;
    *buf = b;
    *n = got;
    return DT_OK;
}

/* Whether another live run writes PATH.partial: each run holds an exclusive flock on the file it writes, so a
 * shared one that cannot be had means a run that would lose its records (its file replaced now, ours renamed over
 * its at the end). Taken without blocking; anything but a regular file is left to dt_file's refusal. */
static dt_status check_not_in_use(const char *partial, const char *path)
{
    int fd = open(partial, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return DT_OK;
    struct stat st;
    dt_status s = DT_OK;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK)
        s = dt_error(DT_ERR_STATE, "--metrics %s: another run is writing it now (%s is locked); give each run its "
                                   "own file", path, partial);
    close(fd);
    return s;
}

/* The records of buf to keep when resuming at step: every JSON-object line
 * whose "step" (when it has one) is <= step, appended to the open file. */
static dt_status keep_history(dt__metrics *m, const char *buf, size_t n, int64_t step)
{
    for (size_t i = 0; i < n;) {
        const char *e = memchr(buf + i, '\n', n - i);
        size_t len = e ? (size_t)(e - (buf + i)) : n - i;
        cJSON *j = len ? cJSON_ParseWithLength(buf + i, len) : NULL;
        if (len && !(j && cJSON_IsObject(j))) {
            m->bad++; /* e.g. a line cut short by a crash */
        } else if (len) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
            if (cJSON_IsNumber(s) && s->valuedouble > (double)step) {
                m->dropped++;
            } else {
                dt_status st = dt_file_write(m->f, buf + i, len);
                if (st == DT_OK)
                    st = dt_file_write(m->f, "\n", 1);
                if (st < 0) {
                    cJSON_Delete(j);
                    return st;
                }
                m->kept++;
            }
        }
        cJSON_Delete(j);
        i += len + 1;
    }
    return DT_OK;
}

dt_status dt__metrics_open(dt__metrics *m, const char *path, int64_t resume_step)
{
    memset(m, 0, sizeof *m);
    size_t n = strlen(path);
    m->path = malloc(n + 1);
    m->partial = malloc(n + 9);
    if (!m->path || !m->partial) {
        free(m->path);
        free(m->partial);
        m->path = m->partial = NULL;
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(m->path, path, n + 1);
    snprintf(m->partial, n + 9, "%s.partial", path);
    /* Refuse now, not after the whole run, a PATH the final rename would refuse. */
    dt_status s = dt_file_check_target(path);
    if (s < 0)
        dt_error_wrap(s, "--metrics");
    else if ((s = check_not_in_use(m->partial, path)) < 0)
        ;
    else if ((s = dt_file_open(m->partial, 0644, &m->f)) < 0)
        dt_error_wrap(s, "--metrics %s", path);
    else if (flock(dt_file_fd(m->f), LOCK_EX | LOCK_NB) != 0) /* a fresh file: only a race with another start */
        s = dt_error(DT_ERR_STATE, "--metrics %s: another run is writing it now; give each run its own file", path);
    if (s == DT_OK && resume_step >= 0) { /* continue the newer of PATH.partial and PATH */
        struct stat sp, sf;
        bool hp = lstat(m->partial, &sp) == 0, hf = lstat(path, &sf) == 0;
        bool newer = hp && (!hf || sp.st_mtim.tv_sec > sf.st_mtim.tv_sec ||
                            (sp.st_mtim.tv_sec == sf.st_mtim.tv_sec && sp.st_mtim.tv_nsec >= sf.st_mtim.tv_nsec));
        const char *from = newer ? m->partial : hf ? path : NULL;
        char *buf = NULL;
        size_t len = 0;
        if (from && (s = slurp(from, &buf, &len)) == DT_OK) {
            m->from = newer ? ".partial" : "";
            s = keep_history(m, buf, len, resume_step);
        }
        free(buf);
        if (s < 0)
            dt_error_wrap(s, "--metrics %s", path);
    }
    if (s == DT_OK && (s = dt_file_commit(m->f)) < 0)
        dt_error_wrap(s, "--metrics %s", path);
    if (s < 0) {
        dt_file_close(m->f);
        free(m->path);
        free(m->partial);
        memset(m, 0, sizeof *m);
    }
    return s;
}

/* printf writes a non-finite double as nan, -nan, inf or -inf: not JSON.
 * Outside strings each such bare value becomes null, so every record stays
 * one JSON object that any parser (and dtrain plot) reads. out has room for
 * 2n + 1 bytes; returns the new length. */
static size_t json_nonfinite(const char *in, size_t n, char *out)
{
    bool str = false;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = in[i];
        if (str) {
            out[k++] = c;
            if (c == '\\' && i + 1 < n)
                out[k++] = in[++i];
            else if (c == '"')
                str = false;
            continue;
        }
        if (c == '"')
            str = true;
        const bool at_value = k == 0 || out[k - 1] == ':' || out[k - 1] == ',' || out[k - 1] == '[';
        if (at_value && (c == 'n' || c == 'i' || c == '-')) {
            size_t j = i + (c == '-'), w = 0;
            if (j + 3 <= n && (!strncmp(in + j, "nan", 3) || !strncmp(in + j, "inf", 3)))
                w = j + 8 <= n && !strncmp(in + j, "infinity", 8) ? 8 : 3;
            if (w && (j + w == n || in[j + w] == ',' || in[j + w] == '}' || in[j + w] == ']')) {
                memcpy(out + k, "null", 4);
                k += 4;
                i = j + w - 1;
                continue;
            }
        }
        out[k++] = c;
    }
    return k;
}

dt_status dt__metrics_write(dt__metrics *m, const char *fmt, ...)
{
    if (!m->f)
        return DT_OK;
    char small[1024], *buf = small;
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    /* {BODY,"time":1763900000.123}\n */
    size_t cap = (size_t)(n > 0 ? n : 0) + 48;
    if (n >= 0 && cap > sizeof small) {
        buf = malloc(cap);
        if (!buf) {
            va_end(ap2);
            return dt_error(DT_ERR_NO_MEMORY, "out of memory");
        }
    }
    if (n < 0) {
        va_end(ap2);
        return dt_error(DT_ERR_INVALID_ARG, "--metrics: bad record format");
    }
    buf[0] = '{';
    vsnprintf(buf + 1, cap - 1, fmt, ap2);
    va_end(ap2);
    int k = 1 + n;
    if (strstr(buf + 1, "nan") || strstr(buf + 1, "inf")) {
        char *fixed = malloc(2 * (size_t)k + 48);
        if (!fixed) {
            if (buf != small)
                free(buf);
            return dt_error(DT_ERR_NO_MEMORY, "out of memory");
        }
        k = (int)json_nonfinite(buf, (size_t)k, fixed);
        if (buf != small)
            free(buf);
        buf = fixed;
        cap = 2 * (size_t)(1 + n) + 48;
    }
    k += snprintf(buf + k, cap - (size_t)k, "%s\"time\":%.3f}\n", n ? "," : "", unix_time());
    dt_status st = dt_file_write(m->f, buf, (size_t)k);
    if (buf != small)
        free(buf);
    if (st < 0)
        return dt_error_wrap(st, "--metrics");
    return DT_OK;
}

void dt__json_quote(const char *s, char *buf, size_t n)
{
    cJSON *j = cJSON_CreateString(s ? s : "");
    char *q = j ? cJSON_PrintUnformatted(j) : NULL;
    /* a quoted string that does not fit would be invalid JSON: use null */
    snprintf(buf, n, "%s", q && strlen(q) < n ? q : "null");
    cJSON_free(q);
    cJSON_Delete(j);
}

dt_status dt__metrics_close(dt__metrics *m, const char *status, int64_t step, int exit_code,
                            const dt__metrics_measured *me)
{
    dt_status st = DT_OK;
    if (m->f) {
        char extra[512] = "";
        size_t k = 0;
        if (me && me->peak_rss_bytes > 0 && me->step_ms > 0)
            k = (size_t)snprintf(extra, sizeof extra, ",\"peak_rss_bytes\":%.0f,\"step_ms\":%.3f",
                                 me->peak_rss_bytes, me->step_ms);
        if (me && me->step_cpu_ms > 0 && k < sizeof extra)
            k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"step_cpu_ms\":%.3f", me->step_cpu_ms);
        if (me && me->predicted_peak_rss_bytes > 0 && me->predicted_step_ms > 0 && k < sizeof extra)
            k += (size_t)snprintf(extra + k, sizeof extra - k,
                                  ",\"predicted_peak_rss_bytes\":%.0f,\"predicted_step_ms\":%.3f",
                                  me->predicted_peak_rss_bytes, me->predicted_step_ms);
        if (me && me->comm_counted && me->comm_steps > 0 && k < sizeof extra)
            k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"comm_bytes_sent\":%.0f", me->comm_bytes_sent);
        if (me && me->comm_counted && me->comm_steps > 0 && me->comm_nodes_known && k < sizeof extra)
            k += (size_t)snprintf(extra + k, sizeof extra - k, ",\"comm_bytes_cross_node\":%.0f",
                                  me->comm_bytes_cross_node);
        if (me && me->comm_counted && me->comm_steps > 0 && k < sizeof extra)
            snprintf(extra + k, sizeof extra - k, ",\"comm_steps\":%.0f", me->comm_steps);
        st = dt__metrics_write(m, "\"event\":\"end\",\"status\":\"%s\",\"step\":%lld,\"exit_code\":%d%s",
                               status, (long long)step, exit_code, extra);
        /* PATH.partial still ours? (a run that did not lock, or started in the same instant, may have replaced
           it): never rename another run's file over PATH */
        struct stat mine, now;
        if (st == DT_OK && !strcmp(status, "ok") &&
            (fstat(dt_file_fd(m->f), &mine) != 0 || lstat(m->partial, &now) != 0 || mine.st_dev != now.st_dev ||
             mine.st_ino != now.st_ino))
            st = dt_error(DT_ERR_STATE, "--metrics: %s was replaced by another process while this run wrote it: "
                                        "this run's records are lost and %s is left as it was", m->partial, m->path);
        dt_status cs = dt_file_close(m->f);
        m->f = NULL;
        if (st == DT_OK)
            st = cs;
        if (st == DT_OK && !strcmp(status, "ok")) {
            st = dt_file_rename(m->partial, m->path);
            if (st < 0)
                dt_error_wrap(st, "--metrics");
        }
    }
    free(m->path);
    free(m->partial);
    m->path = m->partial = NULL;
    return st;
}
