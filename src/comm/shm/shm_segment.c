/* The shm segment: naming, creation/attachment, the TCP rendezvous for
 * torchrun-style launches, and the per-rank dt_pg_alloc arena.
 *
 * Naming: with a job id (DT_JOB_ID, which the launcher makes random, or
 * the MPI/Slurm job ids), every rank derives the same name from it:
 * "/dtrain-<64-bit hash of job id>-<second hash>". Without one, rank 0
 * draws a random name and hands it to the others over a TCP connection to
 * MASTER_ADDR:MASTER_PORT. Rank 0 creates the segment with O_EXCL and mode
 * 0600 (a pre-existing name is an error, never reused); the others open it
 * only if it belongs to this user and no one else can read it. The last
 * rank to attach unlinks the name, so after start-up nothing exists in
 * /dev/shm that could outlive a crash; the mapping lives until the last
 * rank unmaps or dies. */
#include "comm/shm/shm.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

void dt__shm_segment_name(const char *job_id, char *buf, size_t n)
{
    uint64_t h1 = dt_hash64(job_id, strlen(job_id), 0x9e3779b97f4a7c15ull);
    uint64_t h2 = dt_hash64(job_id, strlen(job_id), h1 ^ 0xc2b2ae3d27d4eb4full);
    snprintf(buf, n, "/dtrain-%016llx%08llx", (unsigned long long)h1,
             (unsigned long long)(h2 & 0xffffffffull));
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

bool dt__shm_interrupted(int (*fn)(void *), void *arg) { return fn && fn(arg); }

/* The start time of process pid (clock ticks since boot, /proc/PID/stat
 * field 22). 1: found; 0: no such process, or a zombie (it can remove
 * nothing any more); -1: cannot tell. */
static int proc_start_time(int32_t pid, uint64_t *out)
{
    if (pid <= 0)
        return 0;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return n == 0 || errno == ESRCH ? 0 : -1;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: the
     * fields after it start at the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p++;
    if (p[0] == ' ' && (p[1] == 'Z' || p[1] == 'X'))
        return 0;
    for (int field = 3; field < 22; field++) { /* skip fields 3..21 */
        p = strchr(p + 1, ' ');
        if (!p)
            return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p + 1, &end, 10);
    if (errno || end == p + 1)
        return -1;
    *out = v;
    return 1;
}

/* Record the creator and its parent in the header of the segment open as fd
 * (before it is mapped or reserved, so a crash in either leaves a segment
 * that can be told orphaned). */
static void write_owners(int fd)
{
    int32_t pid[2] = {(int32_t)getpid(), (int32_t)getppid()};
    uint64_t st[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        if (proc_start_time(pid[i], &st[i]) != 1)
            pid[i] = 0; /* unknown: never treated as dead by itself */
    uint32_t tag = SHM_OWNER_TAG;
    if (pwrite(fd, pid, sizeof pid, offsetof(shm_hdr, owner_pid)) != (ssize_t)sizeof pid ||
        pwrite(fd, st, sizeof st, offsetof(shm_hdr, owner_start)) != (ssize_t)sizeof st)
        return;
    if (pwrite(fd, &tag, sizeof tag, offsetof(shm_hdr, owner_tag)) != (ssize_t)sizeof tag)
        return;
}

/* Is the segment's owner i gone? A process whose start time differs is a
 * reused pid: gone. Unknown (pid 0) or unreadable: not gone. */
static int owner_gone(int32_t pid, uint64_t start)
{
    if (pid <= 0)
        return 0;
    uint64_t now;
    int r = proc_start_time(pid, &now);
    return r == 0 || (r == 1 && now != start);
}

static int is_segment_name(const char *n)
{
    if (strncmp(n, "dtrain-", 7) != 0 || strlen(n) != 7 + 24)
        return 0;
    for (const char *p = n + 7; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return 0;
    return 1;
}

dt_status dt__shm_orphan_cleanup(int *removed)
{
    if (!removed)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pg_orphan_cleanup: removed must not be NULL");
    *removed = 0;
    DIR *d = opendir("/dev/shm");
    if (!d)
        return DT_OK; /* no /dev/shm: nothing of ours can be there */
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_segment_name(e->d_name))
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue; /* a symlink (ELOOP), gone, or not ours */
        struct stat st;
        shm_hdr h;
        int orphan = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                     (size_t)st.st_size >= sizeof h &&
                     pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h &&
                     atomic_load(&h.owner_tag) == SHM_OWNER_TAG &&
                     (h.owner_pid[0] > 0 || h.owner_pid[1] > 0) &&
                     owner_gone(h.owner_pid[0], h.owner_start[0]) &&
                     (h.owner_pid[1] <= 0 || owner_gone(h.owner_pid[1], h.owner_start[1]));
        close(fd);
        /* Remove the very file examined, not one that replaced it since. */
        struct stat now;
        if (orphan && fstatat(dirfd(d), e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            now.st_dev == st.st_dev && now.st_ino == st.st_ino && unlinkat(dirfd(d), e->d_name, 0) == 0)
            (*removed)++;
    }
    closedir(d);
    return DT_OK;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Layout from the sizes already in s. */
static void layout(shm_ctx *s)
{
    size_t W = (size_t)s->size, off = align_up(sizeof(shm_hdr), 4096);
    s->off_ranks = off;
    off += W * sizeof(shm_rank);
    s->off_desc = align_up(off, SHM_ALIGN);
    off = s->off_desc + 2 * W * sizeof(shm_desc);
    s->off_moved = align_up(off, SHM_ALIGN);
    off = s->off_moved + W * W * sizeof(uint64_t);
    s->off_slots = align_up(off, 4096);
    off = s->off_slots + 2 * W * s->slot_bytes;
    s->off_chans = align_up(off, 4096);
    off = s->off_chans + W * W * (sizeof(shm_chan) + s->chan_bytes);
    s->off_stage = align_up(off, 4096);
    off = s->off_stage + W * s->stage_bytes;
    s->off_heaps = align_up(off, 2u << 20);
    off = s->off_heaps + W * s->heap_bytes;
    s->total = off;
}

/* Reserve the segment's pages in [off, off + len) now. tmpfs allocates
 * them lazily, and a page touched when /dev/shm is full is a SIGBUS with no
 * message (Docker's default /dev/shm is 64 MB): reserving turns that into an
 * error at start (the fixed part) or from dt_pg_alloc (the arena). */
static dt_status reserve(int fd, size_t off, size_t len, const char *what)
{
    int e = posix_fallocate(fd, (off_t)off, (off_t)len);
    if (e == 0 || e == EINVAL || e == EOPNOTSUPP)
        return DT_OK; /* a file system that cannot reserve: pages come on demand */
    struct statvfs v;
    double free_mb = statvfs("/dev/shm", &v) == 0 ? (double)v.f_bavail * (double)v.f_frsize / 1048576.0 : -1;
    return dt_error(DT_ERR_NO_MEMORY,
                    "shm: /dev/shm is too small: %s needs %.1f MiB more, %.1f MiB are free (%s); "
                    "raise its size (docker run --shm-size=2g, or mount -o remount,size=4G /dev/shm) "
                    "or need less (DT_SHM_STAGING_KB, fewer ranks, smaller dt_pg_alloc buffers)",
                    what, (double)len / 1048576.0, free_mb, strerror(e));
}

dt_status dt__shm_attach(shm_ctx *s, const char *name, int create, double timeout_s)
{
    layout(s);
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = -1;
    double t0 = dt_time_s();
    if (create) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0)
            return dt_error(DT_ERR_IO,
                            "shm: cannot create segment /dev/shm%s: %s%s", name, strerror(errno),
                            errno == EEXIST ? " (left by a crashed run with the same job id? "
                                              "remove it or use a fresh DT_JOB_ID)"
                                            : "");
        if (ftruncate(fd, (off_t)s->total) != 0) {
            int e = errno;
            close(fd);
            shm_unlink(name);
            return dt_error(DT_ERR_IO, "shm: cannot size segment %s to %zu bytes: %s", name,
                            s->total, strerror(e));
        }
        write_owners(fd);
        /* Everything but the arenas is used by every collective. */
        char what[96];
        snprintf(what, sizeof what, "the segment of %d ranks (without dt_pg_alloc arenas)", s->size);
        dt_status rs = reserve(fd, 0, s->off_heaps, what);
        if (rs < 0) {
            close(fd);
            shm_unlink(name);
            return rs;
        }
    } else {
        int ms = 1;
        for (;;) {
            fd = shm_open(name, O_RDWR, 0);
            if (fd >= 0) {
                struct stat st;
                if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077)) {
                    close(fd);
                    return dt_error(DT_ERR_IO,
                                    "shm: segment %s is not owned by this user with mode 0600; "
                                    "refusing to use it",
                                    name);
                }
                if ((size_t)st.st_size == s->total)
                    break;
                if (st.st_size != 0) {
                    close(fd);
                    return dt_error(DT_ERR_MISMATCH,
                                    "shm: segment %s has %lld bytes, this rank expects %zu: do the "
                                    "ranks have different world sizes or DT_SHM_* variables?",
                                    name, (long long)st.st_size, s->total);
                }
                close(fd);
            } else if (errno != ENOENT) {
                return dt_error(DT_ERR_IO, "shm: cannot open %s: %s", name, strerror(errno));
            }
            if (dt_time_s() - t0 > timeout_s)
                return dt_error(DT_ERR_TIMEOUT,
                                "shm: rank %d waited %.0f s for rank 0 to create the segment "
                                "(is rank 0 running with the same job id?)",
                                s->rank, timeout_s);
            if (dt__shm_interrupted(s->interrupted, s->interrupted_arg))
                return dt_error(DT_ERR_CANCELED, "shm: rank %d: interrupted while waiting for rank 0 to create "
                                "the segment", s->rank);
            nap_ms(ms);
            if (ms < 20)
                ms *= 2;
        }
    }
    void *m = mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        close(fd);
        if (create)
            shm_unlink(name);
        /* the usual cause is the address-space limit (ulimit -v): say it,
         * and what the segment is made of (its heap is DT_SHM_HEAP_MB) */
        struct rlimit rl;
        char lim[160] = "";
        if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            snprintf(lim, sizeof lim, "; the address-space limit (ulimit -v) is %llu MiB",
                     (unsigned long long)(rl.rlim_cur >> 20));
        return dt_error(e == ENOMEM ? DT_ERR_NO_MEMORY : DT_ERR_IO,
                        "shm: cannot map the job's shared-memory segment, %zu bytes (%.0f MiB, with a heap of %zu MiB "
                        "per rank: DT_SHM_HEAP_MB): %s%s; raise the limit or lower DT_SHM_HEAP_MB", s->total,
                        (double)s->total / 1048576.0, s->heap_bytes >> 20, strerror(e), lim);
    }
    s->fd = fd;
    s->have_fd = 1;
    s->base = m;
    s->hdr = (shm_hdr *)m;
    if (create) {
        s->hdr->version = SHM_VERSION;
        s->hdr->world = (uint32_t)s->size;
        s->hdr->total = s->total;
        s->hdr->slot_bytes = s->slot_bytes;
        s->hdr->stage_bytes = s->stage_bytes;
        s->hdr->heap_bytes = s->heap_bytes;
        s->hdr->chan_bytes = s->chan_bytes;
        atomic_store(&s->hdr->magic, SHM_MAGIC);
    } else {
        while (atomic_load(&s->hdr->magic) != SHM_MAGIC) {
            if (dt_time_s() - t0 > timeout_s) {
                dt__shm_detach(s);
                return dt_error(DT_ERR_TIMEOUT, "shm: segment %s never got initialised", name);
            }
            nap_ms(1);
        }
        if (s->hdr->world != (uint32_t)s->size || s->hdr->slot_bytes != s->slot_bytes ||
            s->hdr->stage_bytes != s->stage_bytes || s->hdr->heap_bytes != s->heap_bytes) {
            dt__shm_detach(s);
            return dt_error(DT_ERR_MISMATCH,
                            "shm: segment %s was made for a different configuration (world "
                            "size or DT_SHM_* sizes differ between ranks)",
                            name);
        }
    }
    shm_rank *me = shm_rank_at(s, s->rank);
    if (atomic_load(&me->state) != SHM_STATE_EMPTY) {
        dt__shm_detach(s);
        return dt_error(DT_ERR_INVALID_ARG, "shm: two processes claim rank %d in %s", s->rank,
                        name);
    }
    atomic_store(&me->pid, (int32_t)getpid());
    atomic_store(&me->state, SHM_STATE_ATTACHED);
    uint32_t n = atomic_fetch_add(&s->hdr->attached, 1) + 1;
    if (n == (uint32_t)s->size) { /* everyone is in: remove the name */
        shm_unlink(name);
        atomic_store(&s->hdr->unlinked, 1);
    }
    return DT_OK;
}

dt_status dt__shm_attach_wait(shm_ctx *s, double timeout_s)
{
    double t0 = dt_time_s();
    const char *name = s->name;
    /* Wait for the others, so that pids are known for liveness checks. */
    /* Also wait for the unlink, so that a group created next with the same
     * job id never finds the old name. */
    while (atomic_load(&s->hdr->attached) < (uint32_t)s->size || !atomic_load(&s->hdr->unlinked)) {
        bool stop = dt__shm_interrupted(s->interrupted, s->interrupted_arg);
        if (stop || dt_time_s() - t0 > timeout_s) {
            char missing[256] = "";
            size_t o = 0;
            int nmiss = 0;
            for (int r = 0; r < s->size && o < sizeof missing - 8; r++)
                if (atomic_load(&shm_rank_at(s, r)->state) == SHM_STATE_EMPTY) {
                    o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%d", o ? "," : "", r);
                    nmiss++;
                }
            shm_unlink(name);
            dt__shm_detach(s);
            if (stop)
                return dt_error(DT_ERR_CANCELED, "shm: interrupted while waiting for %s %s to join (segment %s "
                                "removed)", nmiss == 1 ? "rank" : "ranks", missing, name);
            return dt_error(DT_ERR_TIMEOUT,
                            "shm: %s %s did not join within %.0f s (segment %s removed)",
                            nmiss == 1 ? "rank" : "ranks", missing, timeout_s, name);
        }
        nap_ms(1);
    }
    return DT_OK;
}

void dt__shm_detach(shm_ctx *s)
{
    if (s->have_fd)
        close(s->fd);
    s->have_fd = 0;
    if (s->base)
        munmap(s->base, s->total);
    s->base = NULL;
    s->hdr = NULL;
}

/* ---- rendezvous: rank 0 serves a random name on MASTER_ADDR:MASTER_PORT ---- */

static int tcp_listen(const char *addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(addr, NULL, &hints, &res) == 0 && res) {
        sa.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
        freeaddrinfo(res);
    } else {
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int tcp_connect(const char *addr, int port)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    if (getaddrinfo(addr, ps, &hints, &res) != 0 || !res)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* The launch's own identity, when the launcher gives one: torchrun's
 * rendezvous id (random under --standalone); "" otherwise. */
static void launch_id(char *buf, size_t n)
{
    const char *e = getenv("TORCHELASTIC_RUN_ID");
    snprintf(buf, n, "%s", e && *e && strcmp(e, "none") ? e : "");
}

/* A client's 64-byte hello: "DTRV2 <rank> <world> <launch id hash>". */
static void hello_make(char *msg, size_t n, int rank, int world)
{
    char id[256];
    launch_id(id, sizeof id);
    memset(msg, 0, n);
    snprintf(msg, n, "DTRV2 %d %d %016llx", rank, world,
             (unsigned long long)(id[0] ? dt_hash64(id, strlen(id), 0x2545f4914f6cdd1dull) : 0));
}

/* Read exactly n bytes (the socket has a receive timeout); false on a short read. */
static bool read_full(int fd, char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

/* A rank's wait for rank 0's answer: read exactly n bytes from a socket whose receive timeout is a
 * slice, polling the start-up's interrupted callback and bound between slices. 1: read; 0: closed or
 * failed; -1: interrupted; -2: the start-up bound passed. */
static int read_waiting(int fd, char *buf, size_t n, const dt_backend_info *info, double t0)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return 0;
        if (dt__shm_interrupted(info->interrupted, info->interrupted_arg))
            return -1;
        if (dt_time_s() - t0 > info->init_timeout_s)
            return -2;
    }
    return 1;
}

static void reply(int fd, const char *text)
{
    char msg[64];
    memset(msg, 0, sizeof msg);
    snprintf(msg, sizeof msg, "%s", text);
    ssize_t w = write(fd, msg, sizeof msg);
    (void)w;
}

/* Rank 0: collect one hello from each other rank, keep the connections,
 * then hand every one the name. A second process claiming a rank (a
 * second job without DT_JOB_ID on the same MASTER_PORT) is refused and so
 * is the whole job, on every rank that connected, before anyone trains; a
 * hello of another world size or launch id is a foreign job's rank and is
 * turned away alone. After the last rank joined, rank 0 still listens for
 * LINGER_S for such a duplicate. */
#define LINGER_S 0.3
static dt_status serve_name(const dt_backend_info *info, int lfd, const char *addr, int port, double t0,
                            const char *name)
{
    const int world = info->world_size;
    int *fds = malloc((size_t)world * sizeof *fds);
    if (!fds)
        return dt_error(DT_ERR_NO_MEMORY, "shm: rendezvous: out of memory");
    for (int r = 0; r < world; r++)
        fds[r] = -1;
    char mine[64];
    hello_make(mine, sizeof mine, 0, world);
    const char *my_id = mine + strlen(mine) - 16;
    int joined = 0, dup = -1, refused = 0;
    double full_at = world == 1 ? dt_time_s() : 0;
    dt_status st = DT_OK;
    while (world > 1 && dup < 0 && (joined < world - 1 || dt_time_s() - full_at < LINGER_S)) {
        struct timeval tv = {0, joined < world - 1 ? 500000 : 50000};
        setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        int c = accept(lfd, NULL, NULL);
        if (c >= 0) {
            struct timeval ht = {2, 0};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &ht, sizeof ht);
            char h[64];
            int r = -1, w = -1, used = 0;
            char id[20] = "";
            if (!read_full(c, h, sizeof h) || (h[63] = '\0', sscanf(h, "DTRV2 %d %d %16s%n", &r, &w, id, &used) != 3)) {
                close(c); /* not a dtrain rank (or an older one): ignored */
            } else if (w != world || strcmp(id, my_id) || r < 1 || r >= world) {
                char why[64];
                snprintf(why, sizeof why, "!another job: world size %d, rank %d", world, r);
                reply(c, why);
                close(c);
                refused++;
            } else if (fds[r] >= 0) {
                reply(c, "!two processes claim this rank");
                close(c);
                dup = r;
            } else {
                fds[r] = c;
                if (++joined == world - 1)
                    full_at = dt_time_s();
            }
        }
        bool stop = dup < 0 && joined < world - 1 && dt__shm_interrupted(info->interrupted, info->interrupted_arg);
        if (stop || (dup < 0 && joined < world - 1 && dt_time_s() - t0 > info->init_timeout_s)) {
            char missing[256];
            size_t k = 0;
            int nmiss = 0;
            for (int r = 1; r < world && k < sizeof missing; r++)
                if (fds[r] < 0) {
                    k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", r);
                    nmiss++;
                }
            if (stop)
                st = dt_error(DT_ERR_CANCELED, "shm: rendezvous on %s:%d: interrupted while waiting for %s %s to "
                              "connect", addr, port, nmiss == 1 ? "rank" : "ranks", missing);
            else
                st = dt_error(DT_ERR_TIMEOUT, "shm: rendezvous on %s:%d: only %d of %d ranks connected in %.0f s "
                              "(missing: %s)%s", addr, port, joined + 1, world, info->init_timeout_s, missing,
                              refused ? "; ranks of another job were turned away (two jobs share MASTER_PORT?)" : "");
            break;
        }
    }
    if (dup >= 0)
        st = dt_error(DT_ERR_MISMATCH, "shm: rendezvous on %s:%d: two processes claim rank %d: another job without "
                      "DT_JOB_ID uses the same MASTER_ADDR:MASTER_PORT; nothing was trained (give each job its own "
                      "MASTER_PORT or DT_JOB_ID)", addr, port, dup);
    for (int r = 1; r < world; r++)
        if (fds[r] >= 0) {
            reply(fds[r], st == DT_OK ? name : dup >= 0 ? "!two processes claim one rank" : "!rank 0 gave up");
            close(fds[r]);
        }
    free(fds);
    return st;
}

dt_status dt__shm_rendezvous_name(const dt_backend_info *info, char *name, size_t n)
{
    const char *addr = info->master_addr[0] ? info->master_addr : "127.0.0.1";
    int port = info->master_port;
    double t0 = dt_time_s(), tmo = info->init_timeout_s;
    char msg[64];
    /* An address that does not resolve is named now, on every rank, rather
     * than seen as ranks that never connected. */
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int gai = getaddrinfo(addr, NULL, &hints, &res);
    if (gai != 0 || !res)
        return dt_error(DT_ERR_INVALID_ARG, "shm: rendezvous: MASTER_ADDR '%s' does not resolve to an "
                        "IPv4 address: %s", addr, gai ? gai_strerror(gai) : "no address");
    freeaddrinfo(res);
    if (info->rank == 0) {
        uint64_t rnd[2];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            return dt_error(DT_ERR_IO, "shm: getrandom failed: %s", strerror(errno));
        snprintf(name, n, "/dtrain-%016llx%08llx", (unsigned long long)rnd[0],
                 (unsigned long long)(rnd[1] & 0xffffffffull));
        int lfd = tcp_listen(addr, port);
        if (lfd < 0)
            return errno == EADDRINUSE
                       ? dt_error(DT_ERR_MISMATCH, "shm: rank 0 cannot listen on %s:%d: the port is in use (another "
                                  "job's rank 0 without DT_JOB_ID? give each job its own MASTER_PORT or DT_JOB_ID)",
                                  addr, port)
                       : dt_error(DT_ERR_IO, "shm: rank 0 cannot listen on %s:%d: %s", addr, port, strerror(errno));
        dt_status st = serve_name(info, lfd, addr, port, t0, name);
        close(lfd);
        return st;
    }
    int ms = 5;
    char hello[64];
    hello_make(hello, sizeof hello, info->rank, info->world_size);
    for (;;) {
        int fd = tcp_connect(addr, port);
        int rd = 0;
        if (fd >= 0) {
            struct timeval tv = {0, 200000}; /* rank 0 answers once every rank joined: wait in slices */
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            if (write(fd, hello, sizeof hello) == (ssize_t)sizeof hello)
                rd = read_waiting(fd, msg, sizeof msg, info, t0);
            bool got = rd == 1;
            close(fd);
            msg[sizeof msg - 1] = '\0';
            if (got && !strncmp(msg, "/dtrain-", 8)) {
                snprintf(name, n, "%s", msg);
                return DT_OK;
            }
            if (got && msg[0] == '!')
                return dt_error(DT_ERR_MISMATCH, "shm: rank %d was refused by the rank 0 at %s:%d (%s): another job "
                                "without DT_JOB_ID uses the same MASTER_ADDR:MASTER_PORT; nothing was trained (give "
                                "each job its own MASTER_PORT or DT_JOB_ID)", info->rank, addr, port, msg + 1);
        }
        if (rd == -1 || dt__shm_interrupted(info->interrupted, info->interrupted_arg))
            return dt_error(DT_ERR_CANCELED, "shm: rank %d: interrupted while waiting for rank 0 at %s:%d %s",
                            info->rank, addr, port, fd >= 0 ? "to hand out the segment name (it answers once every "
                            "rank has connected)" : "to listen");
        if (rd == -2 || dt_time_s() - t0 > tmo)
            return dt_error(DT_ERR_TIMEOUT,
                            "shm: rank %d could not get the segment name from rank 0 at %s:%d "
                            "within %.0f s",
                            info->rank, addr, port, tmo);
        nap_ms(ms);
        if (ms < 100)
            ms *= 2;
    }
}

/* ---- the per-rank arena: first fit over a sorted free list ---- */

uint64_t dt__shm_heap_offset(shm_ctx *s, const void *p, size_t bytes)
{
    const char *h = shm_heap_at(s, s->rank), *c = p;
    if (!p || c < h || c + bytes > h + s->heap_bytes || c + bytes < c)
        return SHM_NONE;
    return (uint64_t)(c - s->base);
}

void *dt__shm_mem_alloc(void *ctx, size_t bytes)
{
    shm_ctx *s = ctx;
    size_t need = align_up(bytes ? bytes : 1, SHM_ALIGN);
    shm_free_block **pp = &s->free_list;
    for (; *pp; pp = &(*pp)->next) {
        shm_free_block *b = *pp;
        if (b->size < need)
            continue;
        if (s->have_fd) {
            char what[64];
            snprintf(what, sizeof what, "dt_pg_alloc(%zu bytes)", bytes);
            size_t at = (size_t)(shm_heap_at(s, s->rank) - s->base) + b->off;
            if (reserve(s->fd, at, need, what) < 0)
                return NULL;
        }
        shm_alloc_rec *rec = malloc(sizeof *rec);
        if (!rec)
            break;
        rec->off = b->off;
        rec->size = need;
        rec->next = s->allocs;
        s->allocs = rec;
        b->off += need;
        b->size -= need;
        if (b->size == 0) {
            *pp = b->next;
            free(b);
        }
        return shm_heap_at(s, s->rank) + rec->off;
    }
    dt_error(DT_ERR_NO_MEMORY,
             "shm: dt_pg_alloc(%zu bytes): the group's shared arena (%zu MiB per rank) is full; "
             "raise DT_SHM_HEAP_MB",
             bytes, s->heap_bytes >> 20);
    return NULL;
}

void dt__shm_mem_free(void *ctx, void *p)
{
    shm_ctx *s = ctx;
    size_t off = (size_t)((char *)p - shm_heap_at(s, s->rank));
    shm_alloc_rec **rp = &s->allocs;
    while (*rp && (*rp)->off != off)
        rp = &(*rp)->next;
    if (!*rp) {
        dt_log(DT_LOG_WARN, "dt_pg_dealloc: %p was not allocated from this group", p);
        return;
    }
    shm_alloc_rec *rec = *rp;
    *rp = rec->next;
    size_t size = rec->size;
    free(rec);
    /* Insert sorted and coalesce with neighbours. */
    shm_free_block **pp = &s->free_list, *prev = NULL;
    while (*pp && (*pp)->off < off) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    shm_free_block *next = *pp;
    if (prev && prev->off + prev->size == off) {
        prev->size += size;
        if (next && prev->off + prev->size == next->off) {
            prev->size += next->size;
            prev->next = next->next;
            free(next);
        }
        return;
    }
    if (next && off + size == next->off) {
        next->off = off;
        next->size += size;
        return;
    }
    shm_free_block *b = malloc(sizeof *b);
    if (!b)
        return; /* leaks the range, never corrupts */
    b->off = off;
    b->size = size;
    b->next = next;
    *pp = b;
}

dt_status dt__shm_job_cleanup(const char *job_id, int *removed)
{
    if (removed)
        *removed = 0;
    if (!job_id || !removed)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pg_job_cleanup: job_id and removed must not be NULL");
    char seg[64];
    dt__shm_segment_name(job_id, seg, sizeof seg);
    if (shm_unlink(seg) == 0)
        *removed = 1;
    else if (errno != ENOENT)
        return dt_error(DT_ERR_IO, "dt_pg_job_cleanup: removing shared memory %s: %s", seg,
                        strerror(errno));
    return DT_OK;
}
