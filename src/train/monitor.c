/* Scalar logs (monitor.h): a monitor fans each value out to its backends,
 * each a small vtable (write, close) over its own state: the
 * TensorBoard event file and the CSV files. */
#include "dtrain/monitor.h"

#include "dtrain/ckpt.h"   /* dt_crc32c */
#include "dtrain/config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_TAG 200

typedef struct backend {
    dt_status (*write)(struct backend *b, const char *tag, double value, int64_t step); /* one write(2) */
    dt_status (*close)(struct backend *b); /* frees b */
} backend;

struct dt_monitor {
    backend *b[2];
    int n;
};

dt_monitor_params dt_monitor_params_default(void) { return (dt_monitor_params){0}; }

char *dt_float_repr(double v, char *buf, size_t n)
{
    if (isnan(v))
        snprintf(buf, n, "nan");
    else if (isinf(v))
        snprintf(buf, n, v > 0 ? "inf" : "-inf");
    if (!isfinite(v))
        return buf;
    char e[40];
    int p = 1;
    for (; p < 17; p++) { /* the fewest significant digits that read back to v */
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, v);
    const int x = atoi(strchr(e, 'e') + 1);
    if (x < -4 || x >= 16) { /* Python's repr: exponent form outside [1e-4, 1e16) */
        snprintf(buf, n, "%s", e);
        return buf;
    }
    snprintf(buf, n, "%.*f", p - 1 - x > 0 ? p - 1 - x : 0, v);
    if (!strchr(buf, '.') && strlen(buf) + 3 <= n)
        strcat(buf, ".0");
    return buf;
}

/* Write all of buf to fd, naming path on an error. */
static dt_status write_all(int fd, const char *path, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return dt_error(DT_ERR_IO, "monitor %s: cannot write: %s", path, strerror(w < 0 ? errno : EIO));
        p += w;
        n -= (size_t)w;
    }
    return DT_OK;
}

/* Open path for appending, never through a symlink; excl: only a new file
 * (*exists then says whether the name was taken). */
static dt_status open_append(const char *path, bool excl, int *fd, bool *exists)
{
    /* O_NONBLOCK: a FIFO at the name fails at once (ENXIO without a reader) rather than blocking the open for
       ever; regular files ignore the flag */
    *fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (excl ? O_EXCL : 0),
               0644);
    const int e = errno;
    if (exists)
        *exists = *fd < 0 && e == EEXIST;
    if (*fd < 0)
        return dt_error(DT_ERR_IO, "monitor %s: cannot open: %s", path,
                        e == ELOOP ? "a symbolic link (not followed)"
                        : e == ENXIO ? "not a regular file (a FIFO or a device)"
                                     : strerror(e));
    struct stat sb;
    if (fstat(*fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
        close(*fd);
        *fd = -1;
        return dt_error(DT_ERR_IO, "monitor %s: not a regular file", path);
    }
    return DT_OK;
}

/* ---- TensorBoard ---- */

typedef struct {
    backend base;
    int fd;
    char path[4200];
} tb_backend;

static size_t put_varint(uint8_t *o, uint64_t v)
{
    size_t n = 0;
    do {
        o[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

static uint32_t masked_crc(const void *p, size_t n)
{
    const uint32_t c = dt_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static double wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One record: the length, its masked CRC, the Event, the Event's masked CRC. */
static dt_status tb_record(tb_backend *t, const uint8_t *ev, size_t n)
{
    uint8_t rec[16 + 512];
    if (n > 512)
        return dt_error(DT_ERR_INVALID_ARG, "monitor %s: event of %zu bytes", t->path, n);
    const uint64_t len = n;
    for (int i = 0; i < 8; i++)
        rec[i] = (uint8_t)(len >> (8 * i));
    uint32_t c = masked_crc(rec, 8);
    for (int i = 0; i < 4; i++)
        rec[8 + i] = (uint8_t)(c >> (8 * i));
    memcpy(rec + 12, ev, n);
    c = masked_crc(ev, n);
    for (int i = 0; i < 4; i++)
        rec[12 + n + i] = (uint8_t)(c >> (8 * i));
    return write_all(t->fd, t->path, rec, n + 16);
}

/* Event { double wall_time = 1; int64 step = 2; then file_version = 3 or summary = 5 } */
static size_t tb_event_head(uint8_t *o, int64_t step)
{
    size_t k = 0;
    const double wt = wall_time();
    uint64_t bits;
    memcpy(&bits, &wt, 8);
    o[k++] = 0x09;
    for (int i = 0; i < 8; i++)
        o[k++] = (uint8_t)(bits >> (8 * i));
    if (step) {
        o[k++] = 0x10;
        k += put_varint(o + k, (uint64_t)step);
    }
    return k;
}

static dt_status tb_write(backend *b, const char *tag, double value, int64_t step)
{
    tb_backend *t = (tb_backend *)b;
    const size_t tl = strlen(tag);
    /* Summary.Value { string tag = 1; float simple_value = 2; } */
    uint8_t val[MAX_TAG + 16], sum[MAX_TAG + 24], ev[MAX_TAG + 64];
    size_t nv = 0, ns = 0;
    val[nv++] = 0x0a;
    nv += put_varint(val + nv, tl);
    memcpy(val + nv, tag, tl);
    nv += tl;
    val[nv++] = 0x15;
    const float f = (float)value;
    uint32_t fb;
    memcpy(&fb, &f, 4);
    for (int i = 0; i < 4; i++)
        val[nv++] = (uint8_t)(fb >> (8 * i));
    /* Summary { repeated Value value = 1; } */
    sum[ns++] = 0x0a;
    ns += put_varint(sum + ns, nv);
    memcpy(sum + ns, val, nv);
    ns += nv;
    size_t ne = tb_event_head(ev, step);
    ev[ne++] = 0x2a;
    ne += put_varint(ev + ne, ns);
    memcpy(ev + ne, sum, ns);
    ne += ns;
    return tb_record(t, ev, ne);
}

static dt_status tb_close(backend *b)
{
    tb_backend *t = (tb_backend *)b;
    dt_status st = DT_OK;
    if (t->fd >= 0 && close(t->fd) < 0)
        st = dt_error(DT_ERR_IO, "monitor %s: close: %s", t->path, strerror(errno));
    free(t);
    return st;
}

static dt_status tb_open(const char *dir, backend **out)
{
    tb_backend *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error(DT_ERR_NO_MEMORY, "monitor: out of memory");
    t->base = (backend){tb_write, tb_close};
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) < 0)
        snprintf(host, sizeof host, "localhost");
    /* SummaryWriter's name; O_EXCL: a second writer in the same second never shares it */
    dt_status st = DT_OK;
    bool taken = true;
    for (int uid = 0; uid < 100 && taken; uid++) {
        snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%010lld.%s.%ld.%d", dir,
                 (long long)time(NULL), host, (long)getpid(), uid);
        st = open_append(t->path, true, &t->fd, &taken);
    }
    if (st < 0) {
        free(t);
        return st;
    }
    uint8_t ev[64];
    size_t ne = tb_event_head(ev, 0);
    static const char version[] = "brain.Event:2";
    ev[ne++] = 0x1a;
    ev[ne++] = (uint8_t)(sizeof version - 1);
    memcpy(ev + ne, version, sizeof version - 1);
    ne += sizeof version - 1;
    if ((st = tb_record(t, ev, ne)) < 0) {
        tb_close(&t->base);
        return st;
    }
    *out = &t->base;
    return DT_OK;
}

/* ---- CSV ---- */

typedef struct {
    char tag[MAX_TAG + 1];
    int fd;
} csv_file;

typedef struct {
    backend base;
    char dir[4096];
    csv_file *files;
    int n, cap;
} csv_backend;

static dt_status csv_file_for(csv_backend *c, const char *tag, csv_file **out, char *path, size_t np)
{
    char name[MAX_TAG + 8];
    snprintf(name, sizeof name, "%s.csv", tag);
    for (char *q = name; *q; q++)
        if (*q == '/' || *q == ' ')
            *q = '_';
    snprintf(path, np, "%s/%s", c->dir, name);
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->files[i].tag, tag)) {
            *out = &c->files[i];
            return DT_OK;
        }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        csv_file *f = realloc(c->files, (size_t)cap * sizeof *f);
        if (!f)
            return dt_error(DT_ERR_NO_MEMORY, "monitor: out of memory");
        c->files = f, c->cap = cap;
    }
    csv_file *f = &c->files[c->n];
    dt_status st = open_append(path, false, &f->fd, NULL);
    if (st < 0)
        return st;
    snprintf(f->tag, sizeof f->tag, "%s", tag);
    c->n++;
    struct stat sb;
    if (fstat(f->fd, &sb) == 0 && sb.st_size == 0) { /* a new file: its header */
        const char *last = strrchr(tag, '/');
        char head[MAX_TAG + 16];
        int k = snprintf(head, sizeof head, "step,%s\r\n", last ? last + 1 : tag);
        if ((st = write_all(f->fd, path, head, (size_t)k)) < 0)
            return st;
    }
    *out = f;
    return DT_OK;
}

static dt_status csv_write(backend *b, const char *tag, double value, int64_t step)
{
    csv_backend *c = (csv_backend *)b;
    char path[4096 + MAX_TAG + 16], line[96], v[40];
    csv_file *f = NULL;
    dt_status st = csv_file_for(c, tag, &f, path, sizeof path);
    if (st < 0)
        return st;
    int k = snprintf(line, sizeof line, "%lld,%s\r\n", (long long)step, dt_float_repr(value, v, sizeof v));
    return write_all(f->fd, path, line, (size_t)k);
}

static dt_status csv_close(backend *b)
{
    csv_backend *c = (csv_backend *)b;
    dt_status st = DT_OK;
    for (int i = 0; i < c->n; i++)
        if (close(c->files[i].fd) < 0 && st == DT_OK)
            st = dt_error(DT_ERR_IO, "monitor %s/%s.csv: close: %s", c->dir, c->files[i].tag, strerror(errno));
    free(c->files);
    free(c);
    return st;
}

static dt_status csv_open(const char *dir, backend **out)
{
    csv_backend *c = calloc(1, sizeof *c);
    if (!c)
        return dt_error(DT_ERR_NO_MEMORY, "monitor: out of memory");
    c->base = (backend){csv_write, csv_close};
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    *out = &c->base;
    return DT_OK;
}

/* ---- the monitor ---- */

dt_status dt_monitor_open(const dt_monitor_params *p, dt_monitor **out)
{
    if (!p || !out)
        return dt_error(DT_ERR_NULL, "dt_monitor_open: %s is NULL", p ? "out" : "params");
    *out = NULL;
    dt_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return dt_error(DT_ERR_NO_MEMORY, "dt_monitor_open: out of memory");
    const char *dirs[2] = {p->tensorboard_dir, p->csv_dir};
    dt_status (*const open_fn[2])(const char *, backend **) = {tb_open, csv_open};
    dt_status st = DT_OK;
    for (int i = 0; i < 2 && st >= 0; i++) {
        if (!dirs[i])
            continue;
        if (strlen(dirs[i]) >= 4000)
            st = dt_error(DT_ERR_INVALID_ARG, "monitor: directory name of %zu bytes", strlen(dirs[i]));
        if (st >= 0)
            st = dt_dir_make(dirs[i]);
        if (st >= 0 && (st = open_fn[i](dirs[i], &m->b[m->n])) >= 0)
            m->n++;
    }
    if (st < 0) {
        dt_monitor_close(m);
        return st;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_monitor_write(dt_monitor *m, const char *tag, double value, int64_t step)
{
    if (!m || !tag)
        return dt_error(DT_ERR_NULL, "dt_monitor_write: %s is NULL", m ? "tag" : "monitor");
    if (!tag[0] || strlen(tag) > MAX_TAG || step < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_monitor_write: tag '%.40s' (1 to %d bytes) at step %lld (>= 0)",
                        tag, MAX_TAG, (long long)step);
    for (int i = 0; i < m->n; i++) {
        dt_status st = m->b[i]->write(m->b[i], tag, value, step);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt_monitor_close(dt_monitor *m)
{
    if (!m)
        return DT_OK;
    dt_status st = DT_OK;
    for (int i = 0; i < m->n; i++) {
        dt_status s = m->b[i]->close(m->b[i]);
        if (st == DT_OK)
            st = s;
    }
    free(m);
    return st;
}

dt_status dt_monitor_open_config(const dt_config *c, dt_monitor **out)
{
    if (!c || !out)
        return dt_error(DT_ERR_NULL, "dt_monitor_open_config: NULL argument");
    *out = NULL;
    static const char *const blocks[2] = {"tensorboard", "csv_monitor"};
    char dirs[2][4096], key[64];
    dt_monitor_params mp = dt_monitor_params_default();
    for (int i = 0; i < 2; i++) {
        bool on = false;
        snprintf(key, sizeof key, "%s.enabled", blocks[i]);
        if (dt_config_get_bool(c, key, &on) != DT_OK || !on)
            continue;
        const char *path = "", *job = "DeepSpeedJobName";
        snprintf(key, sizeof key, "%s.output_path", blocks[i]);
        dt_config_get_str(c, key, &path);
        snprintf(key, sizeof key, "%s.job_name", blocks[i]);
        dt_config_get_str(c, key, &job);
        /* os.path.join(output_path, job_name): an absolute job_name stands alone */
        const size_t np = strlen(path);
        const char *sep = np && path[np - 1] != '/' && job[0] ? "/" : "";
        int n = job[0] == '/' ? snprintf(dirs[i], sizeof dirs[i], "%s", job)
                              : snprintf(dirs[i], sizeof dirs[i], "%s%s%s", path, sep, job);
        if (n < 0 || (size_t)n >= sizeof dirs[i])
            return dt_error(DT_ERR_INVALID_ARG, "config keys %s.output_path and job_name: too long", blocks[i]);
        if (!n)
            snprintf(dirs[i], sizeof dirs[i], "."); /* both empty: the working directory */
        if (i == 0)
            mp.tensorboard_dir = dirs[i];
        else
            mp.csv_dir = dirs[i];
    }
    if (!mp.tensorboard_dir && !mp.csv_dir)
        return DT_OK;
    return dt_monitor_open(&mp, out);
}
