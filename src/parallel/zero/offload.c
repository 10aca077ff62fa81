/* The NVMe store (offload.h): regions of bytes in files of a per-run
 * directory, read and written by asynchronous requests.
 *
 * A request is one contiguous transfer between a caller buffer and one
 * region, identified by a ticket (a counter, never reused). Requests live
 * in individually allocated slots (an aiocb or an io_uring user_data points
 * at its slot, so slots never move) and are retired when waited for. Each
 * engine serves the same three operations: submit a slot, and complete
 * slots until a given one is done. A short transfer is resubmitted for the
 * remainder (io_uring and AIO may return short counts on regular files; a
 * single io_uring request moves at most 1 GiB); a transfer that makes no
 * progress (0 bytes: end of file, or a write the file-size limit stops) or
 * fails is recorded in the slot and reported by the wait, with the file,
 * offset and errno text.
 *
 * Engines: io_uring (liburing; the kernel may refuse it in a sandbox, and
 * AUTO then falls through), POSIX AIO (glibc runs it on its own threads),
 * and two helper threads doing pread/pwrite (so a read and a write can be
 * in flight at once). All three complete requests in any order; waits name
 * the ticket they need.
 *
 * Files: the directory is made with mkdtemp (mkdir: the final name is new,
 * never a followed symlink), opened O_DIRECTORY|O_NOFOLLOW, and every file
 * created inside it with openat(O_CREAT|O_EXCL|O_NOFOLLOW), then sized with
 * posix_fallocate so that a full disk (ENOSPC) or a file-size limit (EFBIG)
 * shows at dt_nvme_store_add, naming the file, instead of mid-step. */
#include "dtrain/offload.h"

#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if DT_HAVE_URING
#include <liburing.h>
#endif

#define URING_DEPTH 64
#define URING_MAX_LEN ((size_t)1 << 30)

typedef struct region {
    char *name;
    int fd;
    size_t size;
} region;

typedef struct slot {
    uint64_t ticket;    /* 0: free */
    int region;
    size_t off, len, done;
    char *buf;
    bool write;
    bool complete;      /* done == len or err set */
    bool queued;        /* thread engine: waiting for a worker */
    int err;            /* errno of a failure; -1: no progress (end of file / size limit) */
    struct aiocb cb;    /* AIO engine */
    struct slot *next;  /* thread engine queue */
} slot;

struct dt_nvme_store {
    char *dir;
    int dirfd;
    region *reg;
    int nreg, capreg;
    slot **slots;
    int nslot;
    uint64_t next_ticket;
    dt_offload_io io;
    dt_nvme_stats st;
    /* the first error of a request retired by wait_all without its own wait */
    /* io_uring */
#if DT_HAVE_URING
    struct io_uring ring;
    bool ring_up;
    int ring_inflight;
#endif
    /* thread engine */
    pthread_t th[2];
    int nth;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    slot *qhead, *qtail;
    bool stopping;
    bool sync_up;
};

dt_offload_params dt_offload_params_default(void)
{
    dt_offload_params p;
    memset(&p, 0, sizeof p);
    p.device = DT_OFFLOAD_NONE;
    p.nvme_path = NULL;
    p.sub_group_size = 1000000000;
    p.buffer_count = 4;
    p.pin_memory = false;
    p.fast_init = false;
    p.io = DT_OFFLOAD_IO_AUTO;
    p.buffer_size = 100000000;
    p.max_in_cpu = 1000000000;
    return p;
}

static const char *const io_names[DT_OFFLOAD_IO_COUNT] = {"auto", "uring", "aio", "thread"};
_Static_assert(DT_OFFLOAD_IO_COUNT == 4, "io_names must name every engine");

const char *dt_offload_io_name(dt_offload_io io)
{
    return (unsigned)io < DT_OFFLOAD_IO_COUNT ? io_names[io] : "?";
}

dt_status dt_offload_io_parse(const char *s, dt_offload_io *out)
{
    for (int i = 0; s && i < DT_OFFLOAD_IO_COUNT; i++)
        if (!strcmp(s, io_names[i])) {
            *out = (dt_offload_io)i;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "offload I/O engine '%s': expected auto, uring, aio or thread",
                    s ? s : "(null)");
}

dt_status dt_offload_parse(const char *spec, dt_offload_params *p)
{
    if (!spec || !p)
        return dt_error(DT_ERR_NULL, "dt_offload_parse: NULL argument");
    if (!strcmp(spec, "cpu")) {
        p->device = DT_OFFLOAD_CPU;
        return DT_OK;
    }
    if (!strncmp(spec, "nvme:", 5) && spec[5]) {
        p->device = DT_OFFLOAD_NVME;
        p->nvme_path = spec + 5;
        return DT_OK;
    }
    return dt_error(DT_ERR_INVALID_ARG, "offload '%s': expected cpu or nvme:DIR", spec);
}

void dt_offload_announce(const dt_offload_params *p)
{
    if (!p || p->device == DT_OFFLOAD_NONE)
        return;
    if (p->device == DT_OFFLOAD_CPU) {
        dt_log(DT_LOG_WARN, "offload device cpu: nothing changes on a CPU system (the optimizer state already "
                            "lives in host memory and the step already runs on the CPU)");
        return;
    }
    dt_log(DT_LOG_WARN, "offload device nvme: optimizer state in files under %s, sub-groups of %zu elements, %d "
                        "buffers", p->nvme_path ? p->nvme_path : "(no path)", p->sub_group_size, p->buffer_count);
}

/* ---- requests ------------------------------------------------------------------ */

static slot *find(dt_nvme_store *s, uint64_t ticket)
{
    for (int i = 0; i < s->nslot; i++)
        if (s->slots[i]->ticket == ticket)
            return s->slots[i];
    return NULL;
}

static slot *new_slot(dt_nvme_store *s)
{
    for (int i = 0; i < s->nslot; i++)
        if (!s->slots[i]->ticket)
            return s->slots[i];
    slot **ns = realloc(s->slots, (size_t)(s->nslot + 1) * sizeof *ns);
    if (!ns)
        return NULL;
    s->slots = ns;
    slot *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    s->slots[s->nslot++] = q;
    return q;
}

/* Account a transfer of r bytes (r < 0: -errno) into q; true when q is complete. */
static bool progress(dt_nvme_store *s, slot *q, long long r)
{
    if (r < 0) {
        q->err = (int)-r;
    } else if (r == 0) {
        q->err = -1;
    } else {
        q->done += (size_t)r;
        if (q->write)
            s->st.bytes_written += (uint64_t)r;
        else
            s->st.bytes_read += (uint64_t)r;
    }
    q->complete = q->err != 0 || q->done == q->len;
    return q->complete;
}

/* ---- engine: io_uring ------------------------------------------------------------- */

#if DT_HAVE_URING
static dt_status uring_post(dt_nvme_store *s, slot *q)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);
    if (!sqe) { /* the submission queue is full: hand it to the kernel, then retry */
        io_uring_submit(&s->ring);
        sqe = io_uring_get_sqe(&s->ring);
        if (!sqe)
            return dt_error(DT_ERR_IO, "offload store: io_uring submission queue full");
    }
    size_t n = q->len - q->done;
    n = n > URING_MAX_LEN ? URING_MAX_LEN : n;
    int fd = s->reg[q->region].fd;
    if (q->write)
        io_uring_prep_write(sqe, fd, q->buf + q->done, (unsigned)n, (uint64_t)(q->off + q->done));
    else
        io_uring_prep_read(sqe, fd, q->buf + q->done, (unsigned)n, (uint64_t)(q->off + q->done));
    io_uring_sqe_set_data(sqe, q);
    int r = io_uring_submit(&s->ring);
    if (r < 0)
        return dt_error(DT_ERR_IO, "offload store: io_uring submit: %s", strerror(-r));
    s->ring_inflight++;
    return DT_OK;
}

static dt_status uring_until(dt_nvme_store *s, slot *want)
{
    while (!want->complete) {
        struct io_uring_cqe *cqe;
        int r = io_uring_wait_cqe(&s->ring, &cqe);
        if (r == -EINTR)
            continue;
        if (r < 0)
            return dt_error(DT_ERR_IO, "offload store: io_uring wait: %s", strerror(-r));
        slot *q = io_uring_cqe_get_data(cqe);
        long long res = cqe->res;
        io_uring_cqe_seen(&s->ring, cqe);
        s->ring_inflight--;
        if (res == -EINTR || res == -EAGAIN)
            res = LLONG_MIN; /* retry the same piece */
        if (res == LLONG_MIN || !progress(s, q, res)) {
            dt_status st = uring_post(s, q);
            if (st < 0)
                return st;
        }
    }
    return DT_OK;
}
#endif

/* ---- engine: POSIX AIO ------------------------------------------------------------- */

static dt_status aio_post(dt_nvme_store *s, slot *q)
{
    memset(&q->cb, 0, sizeof q->cb);
    q->cb.aio_fildes = s->reg[q->region].fd;
    q->cb.aio_offset = (off_t)(q->off + q->done);
    q->cb.aio_buf = q->buf + q->done;
    q->cb.aio_nbytes = q->len - q->done;
    q->cb.aio_sigevent.sigev_notify = SIGEV_NONE;
    int r = q->write ? aio_write(&q->cb) : aio_read(&q->cb);
    if (r < 0)
        return dt_error(DT_ERR_IO, "offload store: aio_%s on %s/%s: %s", q->write ? "write" : "read", s->dir,
                        s->reg[q->region].name, strerror(errno));
    return DT_OK;
}

static dt_status aio_until(dt_nvme_store *s, slot *q)
{
    while (!q->complete) {
        const struct aiocb *list[1] = {&q->cb};
        int e;
        while ((e = aio_error(&q->cb)) == EINPROGRESS)
            aio_suspend(list, 1, NULL);
        ssize_t r = aio_return(&q->cb);
        if (e == EINTR || e == EAGAIN) {
            /* resubmit the same piece */
        } else if (progress(s, q, e ? -(long long)e : (long long)r)) {
            break;
        }
        dt_status st = aio_post(s, q);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* ---- engine: helper threads ----------------------------------------------------------- */

static void *worker(void *arg)
{
    dt_nvme_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->qhead && !s->stopping)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (!s->qhead)
            break;
        slot *q = s->qhead;
        s->qhead = q->next;
        if (!s->qhead)
            s->qtail = NULL;
        q->queued = false;
        int fd = s->reg[q->region].fd;
        pthread_mutex_unlock(&s->mu);
        int err = 0;
        size_t done = 0;
        while (done < q->len) {
            ssize_t r = q->write ? pwrite(fd, q->buf + done, q->len - done, (off_t)(q->off + done))
                                 : pread(fd, q->buf + done, q->len - done, (off_t)(q->off + done));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                err = r < 0 ? errno : -1;
                break;
            }
            done += (size_t)r;
        }
        pthread_mutex_lock(&s->mu);
        q->err = err;
        progress(s, q, (long long)done);
        if (err)
            q->err = err;
        q->complete = true;
        pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static dt_status thread_post(dt_nvme_store *s, slot *q)
{
    pthread_mutex_lock(&s->mu);
    q->next = NULL;
    q->queued = true;
    if (s->qtail)
        s->qtail->next = q;
    else
        s->qhead = q;
    s->qtail = q;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return DT_OK;
}

static dt_status thread_until(dt_nvme_store *s, slot *q)
{
    pthread_mutex_lock(&s->mu);
    while (!q->complete)
        pthread_cond_wait(&s->cv_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return DT_OK;
}

/* ---- engine selection ------------------------------------------------------------------ */

static dt_status start_thread_engine(dt_nvme_store *s)
{
    if (pthread_mutex_init(&s->mu, NULL) != 0)
        return dt_error(DT_ERR_IO, "offload store: mutex");
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    s->sync_up = true;
    for (int i = 0; i < 2; i++) {
        if (pthread_create(&s->th[i], NULL, worker, s) != 0)
            return dt_error(DT_ERR_IO, "offload store: cannot start an I/O thread");
        s->nth++;
    }
    return DT_OK;
}

static dt_status start_engine(dt_nvme_store *s, dt_offload_io want)
{
    if (want == DT_OFFLOAD_IO_AUTO) {
        const char *e = getenv("DT_OFFLOAD_IO");
        if (e && *e && dt_offload_io_parse(e, &want) < 0)
            return dt_error(DT_ERR_INVALID_ARG, "DT_OFFLOAD_IO=%s: expected auto, uring, aio or thread", e);
    }
    if (want == DT_OFFLOAD_IO_AUTO || want == DT_OFFLOAD_IO_URING) {
#if DT_HAVE_URING
        int r = io_uring_queue_init(URING_DEPTH, &s->ring, 0);
        if (r == 0) {
            s->ring_up = true;
            s->io = DT_OFFLOAD_IO_URING;
            return DT_OK;
        }
        if (want == DT_OFFLOAD_IO_URING)
            return dt_error(DT_ERR_UNSUPPORTED, "offload I/O engine uring: the kernel refused io_uring (%s); use "
                            "aio or thread", strerror(-r));
#else
        if (want == DT_OFFLOAD_IO_URING)
            return dt_error(DT_ERR_UNSUPPORTED, "offload I/O engine uring: dtrain was built without liburing "
                            "(install liburing-dev, scripts/deps.sh, and rebuild); use aio or thread");
#endif
    }
    if (want == DT_OFFLOAD_IO_AUTO || want == DT_OFFLOAD_IO_AIO) {
        s->io = DT_OFFLOAD_IO_AIO;
        return DT_OK;
    }
    s->io = DT_OFFLOAD_IO_THREAD;
    return start_thread_engine(s);
}

static dt_status post(dt_nvme_store *s, slot *q)
{
    switch (s->io) {
#if DT_HAVE_URING
    case DT_OFFLOAD_IO_URING:
        return uring_post(s, q);
#endif
    case DT_OFFLOAD_IO_AIO:
        return aio_post(s, q);
    case DT_OFFLOAD_IO_THREAD:
        return thread_post(s, q);
    default:
        return dt_error(DT_ERR_INTERNAL, "offload store: engine %d", (int)s->io);
    }
}

static dt_status until(dt_nvme_store *s, slot *q)
{
    switch (s->io) {
#if DT_HAVE_URING
    case DT_OFFLOAD_IO_URING:
        return uring_until(s, q);
#endif
    case DT_OFFLOAD_IO_AIO:
        return aio_until(s, q);
    case DT_OFFLOAD_IO_THREAD:
        return thread_until(s, q);
    default:
        return dt_error(DT_ERR_INTERNAL, "offload store: engine %d", (int)s->io);
    }
}

/* ---- the store ------------------------------------------------------------------------- */

dt_status dt_nvme_store_open(const dt_offload_params *p, dt_nvme_store **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_nvme_store_open: out is NULL");
    *out = NULL;
    if (!p || p->device != DT_OFFLOAD_NVME || !p->nvme_path || !*p->nvme_path)
        return dt_error(DT_ERR_INVALID_ARG, "offload: device nvme needs nvme_path (a directory on a fast disk)");
    struct stat sb;
    /* what the user named: bad input (DT_ERR_INVALID_ARG, the command's exit 2), not a failure of the run */
    if (stat(p->nvme_path, &sb) < 0)
        return dt_error(DT_ERR_INVALID_ARG, "offload nvme_path '%s': %s (it must be an existing directory)",
                        p->nvme_path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "offload nvme_path '%s': not a directory", p->nvme_path);
    dt_nvme_store *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_nvme_store_open");
    s->dirfd = -1;
    s->next_ticket = 1;
    dt_status st;
    size_t n = strlen(p->nvme_path) + 64;
    s->dir = malloc(n);
    if (!s->dir) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_nvme_store_open");
        goto fail;
    }
    snprintf(s->dir, n, "%s/dtrain-offload-%ld-XXXXXX", p->nvme_path, (long)getpid());
    if (!mkdtemp(s->dir)) {
        int e = errno;
        snprintf(s->dir, n, "%s", p->nvme_path); /* not ours: close must not remove it */
        st = dt_error(DT_ERR_IO, "offload nvme_path '%s': cannot create the run directory: %s (it must be a "
                      "writable directory)", p->nvme_path, strerror(e));
        free(s->dir);
        s->dir = NULL;
        goto fail;
    }
    s->dirfd = open(s->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (s->dirfd < 0) {
        st = dt_error(DT_ERR_IO, "offload: cannot open the run directory '%s': %s", s->dir, strerror(errno));
        goto fail;
    }
    if ((st = start_engine(s, p->io)) < 0)
        goto fail;
    *out = s;
    return DT_OK;
fail:
    dt_nvme_store_close(s);
    return st;
}

dt_status dt_nvme_store_wait_all(dt_nvme_store *s)
{
    if (!s)
        return dt_error(DT_ERR_NULL, "dt_nvme_store_wait_all: store is NULL");
    dt_status first = DT_OK;
    for (int i = 0; i < s->nslot; i++)
        if (s->slots[i]->ticket) {
            dt_status st = dt_nvme_store_wait(s, s->slots[i]->ticket);
            if (st < 0 && first == DT_OK)
                first = st;
        }
    return first;
}

void dt_nvme_store_close(dt_nvme_store *s)
{
    if (!s)
        return;
    if (s->io != DT_OFFLOAD_IO_AUTO) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", dt_last_error());
        dt_status kst = dt_last_status();
        dt_nvme_store_wait_all(s);
        if (kst < 0)
            dt_error(kst, "%s", keep); /* the caller's error stays the last one */
    }
#if DT_HAVE_URING
    if (s->ring_up)
        io_uring_queue_exit(&s->ring);
#endif
    if (s->sync_up) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->cv_work);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->nth; i++)
            pthread_join(s->th[i], NULL);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv_work);
        pthread_cond_destroy(&s->cv_done);
    }
    for (int i = 0; i < s->nreg; i++) {
        if (s->reg[i].fd >= 0)
            close(s->reg[i].fd);
        if (s->dirfd >= 0)
            unlinkat(s->dirfd, s->reg[i].name, 0);
        free(s->reg[i].name);
    }
    free(s->reg);
    if (s->dirfd >= 0) {
        close(s->dirfd);
        rmdir(s->dir);
    }
    for (int i = 0; i < s->nslot; i++)
        free(s->slots[i]);
    free(s->slots);
    free(s->dir);
    free(s);
}

static bool good_name(const char *n)
{
    if (!n || !*n || !strcmp(n, ".") || !strcmp(n, "..") || strlen(n) > 200)
        return false;
    for (const char *c = n; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '_' || *c == '-'))
            return false;
    return true;
}

dt_status dt_nvme_store_add(dt_nvme_store *s, const char *name, size_t nbytes, int *id)
{
    if (!s || !id)
        return dt_error(DT_ERR_NULL, "dt_nvme_store_add: NULL argument");
    if (!good_name(name))
        return dt_error(DT_ERR_INVALID_ARG, "offload store: region name '%s' (letters, digits, '.', '_', '-')",
                        name ? name : "(null)");
    if (nbytes > (size_t)INT64_MAX)
        return dt_error(DT_ERR_INVALID_ARG, "offload store: region '%s' of %zu bytes", name, nbytes);
    if (s->nreg == s->capreg) {
        int cap = s->capreg ? 2 * s->capreg : 8;
        region *r = realloc(s->reg, (size_t)cap * sizeof *r);
        if (!r)
            return dt_error(DT_ERR_NO_MEMORY, "offload store: regions");
        s->reg = r;
        s->capreg = cap;
    }
    int fd = openat(s->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "offload store: cannot create %s/%s: %s", s->dir, name, strerror(errno));
    region *r = &s->reg[s->nreg];
    r->name = strdup(name);
    r->fd = fd;
    r->size = nbytes;
    if (!r->name) {
        close(fd);
        unlinkat(s->dirfd, name, 0);
        return dt_error(DT_ERR_NO_MEMORY, "offload store: region name");
    }
    s->nreg++; /* from here on close() removes the file */
    if (nbytes) {
        int e = posix_fallocate(fd, 0, (off_t)nbytes);
        if (e == EOPNOTSUPP || e == EINVAL) /* no fallocate on this file system: a sparse file */
            e = ftruncate(fd, (off_t)nbytes) < 0 ? errno : 0;
        if (e)
            return dt_error(DT_ERR_IO, "offload store: cannot reserve %zu bytes for %s/%s: %s%s", nbytes, s->dir,
                            name, strerror(e),
                            e == ENOSPC ? " (the disk is full: free space or choose another nvme_path)"
                            : e == EFBIG ? " (over the file-size limit, ulimit -f)" : "");
    }
    *id = s->nreg - 1;
    return DT_OK;
}

static dt_status submit(dt_nvme_store *s, int id, size_t off, void *buf, size_t n, bool write, uint64_t *ticket)
{
    if (!s || !ticket || (!buf && n))
        return dt_error(DT_ERR_NULL, "dt_nvme_store_%s: NULL argument", write ? "write" : "read");
    *ticket = 0;
    if (id < 0 || id >= s->nreg)
        return dt_error(DT_ERR_RANGE, "offload store: region %d of %d", id, s->nreg);
    if (off > s->reg[id].size || n > s->reg[id].size - off)
        return dt_error(DT_ERR_RANGE, "offload store: %s of bytes [%zu, %zu) of %s/%s, which holds %zu",
                        write ? "write" : "read", off, off + n, s->dir, s->reg[id].name, s->reg[id].size);
    slot *q = new_slot(s);
    if (!q)
        return dt_error(DT_ERR_NO_MEMORY, "offload store: request");
    q->ticket = s->next_ticket++;
    q->region = id;
    q->off = off;
    q->len = n;
    q->done = 0;
    q->buf = buf;
    q->write = write;
    q->err = 0;
    q->complete = n == 0;
    if (write)
        s->st.writes++;
    else
        s->st.reads++;
    if (n) {
        dt_status st = post(s, q);
        if (st < 0) {
            q->ticket = 0;
            return st;
        }
    }
    *ticket = q->ticket;
    return DT_OK;
}

dt_status dt_nvme_store_read(dt_nvme_store *s, int id, size_t off, void *buf, size_t n, uint64_t *ticket)
{
    return submit(s, id, off, buf, n, false, ticket);
}

dt_status dt_nvme_store_write(dt_nvme_store *s, int id, size_t off, const void *buf, size_t n, uint64_t *ticket)
{
    return submit(s, id, off, (void *)buf, n, true, ticket);
}

dt_status dt_nvme_store_wait(dt_nvme_store *s, uint64_t ticket)
{
    if (!s)
        return dt_error(DT_ERR_NULL, "dt_nvme_store_wait: store is NULL");
    if (!ticket)
        return DT_OK;
    slot *q = find(s, ticket);
    if (!q)
        return dt_error(DT_ERR_INVALID_ARG, "offload store: ticket %llu is unknown or already waited for",
                        (unsigned long long)ticket);
    double t0 = dt_time_s();
    dt_status st = until(s, q);
    s->st.wait_s += dt_time_s() - t0;
    q->ticket = 0; /* retired, whatever happened */
    if (st < 0)
        return st;
    if (q->err) {
        const region *r = &s->reg[q->region];
        return dt_error(DT_ERR_IO, "offload store: %s of %zu bytes at offset %zu of %s/%s failed after %zu bytes: %s",
                        q->write ? "write" : "read", q->len, q->off, s->dir, r->name, q->done,
                        q->err > 0 ? strerror(q->err)
                        : q->write ? "no progress (file-size limit or full disk)"
                                   : "unexpected end of file");
    }
    return DT_OK;
}

dt_offload_io dt_nvme_store_io(const dt_nvme_store *s) { return s ? s->io : DT_OFFLOAD_IO_AUTO; }
const char *dt_nvme_store_dir(const dt_nvme_store *s) { return s ? s->dir : NULL; }

void dt_nvme_store_stats(const dt_nvme_store *s, dt_nvme_stats *out)
{
    if (!out)
        return;
    if (!s) {
        memset(out, 0, sizeof *out);
        return;
    }
    if (s->sync_up)
        pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->st;
    if (s->sync_up)
        pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
}
