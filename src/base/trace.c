/* The timeline recorder (trace.h): a process-wide ring of fixed-size
 * events, written as Chrome trace JSON at close.
 *
 * Cost when off: every record call first reads g_rec (relaxed) and returns;
 * nothing is allocated until dt_trace_open. When on, a writer announces
 * itself (g_writers), rechecks g_rec, takes a slot with one fetch-add and
 * fills it in place, then stamps it (so a slot being written while the
 * file is written is skipped, not read half-done). Close stops recording,
 * waits for the writers in flight to leave, then reads the ring: a writer
 * never touches freed memory.
 *
 * Events are complete spans (ph "X": start and duration), recorded at
 * their end, so nothing is kept per open span and the ring may overwrite
 * old events without leaving an unmatched begin. The file lists them per
 * thread in start order (a parent before the children it encloses).
 *
 * A trace directory belongs to one job while it records: rank 0 holds
 * flock(LOCK_EX) on the directory from open to close, so that a second job
 * given the same directory is refused at its start instead of replacing
 * the first's rank files under it (and a merge mixing the two). The kernel
 * drops the lock when the process dies. */
#define _POSIX_C_SOURCE 200809L
#include "dtrain/trace.h"

#include "base/sbuf.h"
#include "base/trace_impl.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME_CAP 40
#define MAX_GROUPS 64
#define COMM_TID0 1000

typedef struct ev {
    _Atomic uint64_t stamp; /* slot index + 1 once written */
    double ts, dur;         /* µs on this rank's clock */
    double aux;             /* pipe: compute start (µs); comm: queued µs; counter: value */
    uint64_t seq, bytes;    /* bytes: comm; the FLOPs of other spans (0: none) */
    int64_t step;
    int32_t tid, mb;        /* mb: micro-batch (pipe) or peer (comm) */
    int16_t cat, grp;       /* grp: comm group index, -1 */
    char ph;                /* 'X' or 'C' */
    char name[NAME_CAP];
} ev;

typedef struct group_ent {
    char name[40];
    int lead, size;
} group_ent;

static const char *const cat_names[DT_TRACE_CAT_COUNT] = {
    "step", "forward", "backward", "recompute", "optimizer", "data", "checkpoint", "pipeline", "comm", "wait", "other",
};
_Static_assert(DT_TRACE_CAT_COUNT == 11, "one name per category");

static _Atomic int g_open;      /* a tracer exists */
static _Atomic int g_rec;       /* open and the step lies in the window */
static _Atomic int g_writers;   /* writers inside record() */
static _Atomic uint64_t g_head; /* next slot */
static _Atomic int g_next_tid = 2;
static _Atomic int g_gen;      /* opens so far: a thread's cached id is from this one */
static _Thread_local int t_tid, t_gen;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER; /* groups */

static struct {
    ev *ring;
    size_t cap;
    dt_trace_params p;
    char dir[4096];
    int rank, world;
    double offset_us, base_us;
    pthread_t main;
    _Atomic int64_t step, last_step; /* the step now; the last one recorded (read by any thread) */
    _Atomic double t_on, t_off;      /* when recording last began / ended (µs) */
    group_ent groups[MAX_GROUPS];
    int ngroups;
    int lock_fd; /* rank 0: the directory, locked (-1: none) */
} T;

const char *dt_trace_cat_name(dt_trace_cat c) { return (unsigned)c < DT_TRACE_CAT_COUNT ? cat_names[c] : "other"; }

dt_trace_params dt_trace_params_default(void)
{
    return (dt_trace_params){.dir = NULL, .step_begin = 3, .step_end = 5, .capacity = 65536};
}

dt_status dt_trace_parse_steps(const char *s, dt_trace_params *p)
{
    if (!s || !p)
        return dt_error(DT_ERR_NULL, "dt_trace_parse_steps: an argument is NULL");
    char *e;
    long long a = strtoll(s, &e, 10);
    if (e == s || *e != ':' || a < 1)
        return dt_error(DT_ERR_INVALID_ARG, "trace steps '%s': expected A:B (steps A to B-1, A >= 1), e.g. 3:5", s);
    const char *q = e + 1;
    long long b = 0;
    if (*q) {
        b = strtoll(q, &e, 10);
        if (e == q || *e || b <= a)
            return dt_error(DT_ERR_INVALID_ARG,
                            "trace steps '%s': expected A:B with B > A (steps A to B-1), e.g. 3:5", s);
    }
    p->step_begin = a;
    p->step_end = b;
    return DT_OK;
}

static double now_us(void) { return (double)dt_time_ns() * 1e-3; }

bool dt_trace_is_open(void) { return atomic_load_explicit(&g_open, memory_order_acquire) != 0; }

void dt__trace_file(char *buf, size_t n, const char *dir, int rank)
{
    if (rank >= 0)
        snprintf(buf, n, "%s/rank-%d.json", dir, rank);
    else
        snprintf(buf, n, "%s/trace.json", dir);
}

dt_status dt_trace_open(const dt_trace_params *p, int rank, int world)
{
    if (!p || !p->dir || !p->dir[0])
        return dt_error(DT_ERR_INVALID_ARG, "dt_trace_open: no directory given");
    if (p->capacity < 16 || p->capacity > ((size_t)1 << 26))
        return dt_error(DT_ERR_INVALID_ARG, "dt_trace_open: capacity %zu events (16 to 67108864)", p->capacity);
    if (rank < 0 || world < 1 || rank >= world)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trace_open: rank %d of %d", rank, world);
    struct stat sb;
    if (lstat(p->dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "trace directory '%s' does not exist or is not a directory (create it)",
                        p->dir);
    if (strlen(p->dir) >= sizeof T.dir - 32)
        return dt_error(DT_ERR_INVALID_ARG, "trace directory '%s': path too long", p->dir);
    /* the files written at the end (this rank's, the merged one on rank 0): refused now, not after the run, when
       they name what a rename must not replace (a FIFO, a device, a directory, a symlink) */
    char f[sizeof T.dir + 32];
    dt__trace_file(f, sizeof f, p->dir, rank);
    dt_status fst = dt_file_check_target(f);
    if (fst >= 0 && rank == 0) {
        dt__trace_file(f, sizeof f, p->dir, -1);
        fst = dt_file_check_target(f);
    }
    if (fst < 0)
        return dt_error_wrap(DT_ERR_INVALID_ARG, "trace");
    if (dt_trace_is_open())
        return dt_error(DT_ERR_STATE, "dt_trace_open: a tracer is already open in this process");
    int lock_fd = -1;
    dt_status lst = rank == 0 ? dt_dir_lock(p->dir, &lock_fd) : DT_OK;
    if (lst < 0) {
        char why[600];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_error(lst, "trace directory %s%s", why,
                        lst == DT_ERR_STATE ? "; give each job its own trace directory" : "");
    }
    ev *ring = calloc(p->capacity, sizeof *ring);
    if (!ring) {
        if (lock_fd >= 0)
            close(lock_fd);
        return dt_error(DT_ERR_NO_MEMORY, "dt_trace_open: %zu events", p->capacity);
    }
    memset(&T, 0, sizeof T); /* (before any writer: g_open is 0) */
    T.lock_fd = lock_fd;
    T.ring = ring;
    T.cap = p->capacity;
    T.p = *p;
    snprintf(T.dir, sizeof T.dir, "%s", p->dir);
    T.p.dir = T.dir;
    T.rank = rank;
    T.world = world;
    T.main = pthread_self();
    T.step = 0;
    atomic_store(&g_head, 0);
    atomic_fetch_add(&g_gen, 1);
    atomic_store(&g_next_tid, 2);
    atomic_store_explicit(&g_open, 1, memory_order_release);
    return DT_OK;
}

void dt_trace_set_offset(double offset_us, double base_us)
{
    if (!dt_trace_is_open())
        return;
    T.offset_us = offset_us;
    T.base_us = base_us;
}

void dt_trace_step(int64_t step)
{
    if (!dt_trace_is_open())
        return;
    bool in = step >= T.p.step_begin && (T.p.step_end <= 0 || step < T.p.step_end);
    bool was = atomic_load_explicit(&g_rec, memory_order_relaxed) != 0;
    if (in && !was) {
        atomic_store(&T.t_off, 1e300);
        atomic_store(&T.t_on, now_us());
    } else if (!in && was) {
        atomic_store(&T.t_off, now_us());
    }
    if (was)
        atomic_store(&T.last_step, atomic_load(&T.step));
    atomic_store(&T.step, step);
    atomic_store_explicit(&g_rec, in ? 1 : 0, memory_order_release);
}

double dt_trace_now(void)
{
    if (!atomic_load_explicit(&g_rec, memory_order_relaxed))
        return 0;
    return now_us();
}

static int my_tid(void)
{
    int gen = atomic_load_explicit(&g_gen, memory_order_relaxed);
    if (t_gen != gen) {
        t_gen = gen;
        t_tid = 0;
    }
    if (!t_tid)
        t_tid = pthread_equal(pthread_self(), T.main) ? 1 : atomic_fetch_add(&g_next_tid, 1);
    return t_tid;
}

/* A slot to fill, or NULL (off; outside the window unless `open` is
 * enough); on non-NULL call put() after filling. */
static ev *take_if(_Atomic int *flag)
{
    if (!atomic_load_explicit(flag, memory_order_relaxed))
        return NULL;
    atomic_fetch_add_explicit(&g_writers, 1, memory_order_acq_rel);
    if (!atomic_load_explicit(flag, memory_order_acquire) || !atomic_load_explicit(&g_open, memory_order_acquire)) {
        atomic_fetch_sub_explicit(&g_writers, 1, memory_order_release);
        return NULL;
    }
    uint64_t i = atomic_fetch_add_explicit(&g_head, 1, memory_order_relaxed);
    ev *e = &T.ring[i % T.cap];
    atomic_store_explicit(&e->stamp, 0, memory_order_relaxed);
    e->seq = e->bytes = 0;
    e->aux = 0;
    e->mb = -1;
    e->grp = -1;
    e->ph = 'X';
    e->step = atomic_load_explicit(&T.step, memory_order_relaxed);
    e->tid = my_tid();
    e->seq = i; /* reused below: callers overwrite for comm */
    return e;
}

static ev *take(void) { return take_if(&g_rec); }

static void put(ev *e, uint64_t slot)
{
    atomic_store_explicit(&e->stamp, slot + 1, memory_order_release);
    atomic_fetch_sub_explicit(&g_writers, 1, memory_order_release);
}

static void set_name(ev *e, const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n >= NAME_CAP)
        n = NAME_CAP - 1;
    if (n)
        memcpy(e->name, name, n);
    e->name[n] = 0;
}

void dt_trace_span_ex(dt_trace_cat cat, const char *name, double t0, double t1, int mb, double run_us)
{
    if (t0 <= 0)
        return;
    ev *e = take();
    if (!e)
        return;
    uint64_t slot = e->seq;
    e->seq = 0;
    if (t1 <= 0)
        t1 = now_us();
    e->ts = t0;
    e->dur = t1 > t0 ? t1 - t0 : 0;
    e->cat = (int16_t)cat;
    e->mb = mb;
    e->aux = run_us;
    set_name(e, name);
    put(e, slot);
}

void dt_trace_span(dt_trace_cat cat, const char *name, double t0) { dt_trace_span_ex(cat, name, t0, 0, -1, 0); }

void dt_trace_span_flop(dt_trace_cat cat, const char *name, double t0, double flop)
{
    if (t0 <= 0)
        return;
    ev *e = take();
    if (!e)
        return;
    uint64_t slot = e->seq;
    e->seq = 0;
    double t1 = now_us();
    e->ts = t0;
    e->dur = t1 > t0 ? t1 - t0 : 0;
    e->cat = (int16_t)cat;
    e->bytes = flop >= 1 && flop < 1.8e19 ? (uint64_t)(flop + 0.5) : 0; /* bounded before the cast */
    set_name(e, name);
    put(e, slot);
}

static int group_index(const char *group, int lead, int size)
{
    pthread_mutex_lock(&g_mu);
    int g = -1;
    for (int i = 0; i < T.ngroups && g < 0; i++)
        if (T.groups[i].lead == lead && !strcmp(T.groups[i].name, group))
            g = i;
    if (g < 0 && T.ngroups < MAX_GROUPS) {
        g = T.ngroups++;
        snprintf(T.groups[g].name, sizeof T.groups[g].name, "%s", group);
        T.groups[g].lead = lead;
        T.groups[g].size = size;
    }
    pthread_mutex_unlock(&g_mu);
    return g;
}

void dt_trace_comm(const char *kind, const char *group, int group_lead, int group_size, uint64_t seq,
                   size_t bytes, int peer, double ago_posted, double ago_started, double ago_done)
{
    /* a collective counts when it was posted inside the window, wherever it
     * ends: posting is in program order, the same on every rank, so every
     * rank keeps the same ones */
    if (!atomic_load_explicit(&g_open, memory_order_relaxed))
        return;
    const double now = now_us(), posted = now - ago_posted * 1e6;
    const double on = atomic_load(&T.t_on), off = atomic_load(&T.t_off);
    if (on <= 0 || posted < on || posted >= off)
        return;
    const bool rec = atomic_load_explicit(&g_rec, memory_order_acquire);
    ev *e = take_if(&g_open);
    if (!e)
        return;
    uint64_t slot = e->seq;
    if (!rec)
        e->step = atomic_load(&T.last_step);
    int g = group_index(group ? group : "?", group_lead, group_size);
    e->ts = now - ago_started * 1e6;
    e->dur = (ago_started - ago_done) * 1e6;
    if (e->dur < 0)
        e->dur = 0;
    e->aux = (ago_posted - ago_started) * 1e6;
    e->seq = seq;
    e->bytes = bytes;
    e->mb = peer;
    e->cat = DT_TRACE_COMM;
    e->grp = (int16_t)g;
    e->tid = COMM_TID0 + (g < 0 ? MAX_GROUPS : g);
    set_name(e, kind);
    put(e, slot);
}

void dt_trace_counter(const char *name, double value)
{
    ev *e = take();
    if (!e)
        return;
    uint64_t slot = e->seq;
    e->seq = 0;
    e->ph = 'C';
    e->ts = now_us();
    e->dur = 0;
    e->aux = value;
    e->cat = DT_TRACE_OTHER;
    set_name(e, name);
    put(e, slot);
}

void dt_trace_stats(size_t *kept, size_t *dropped, size_t *bytes)
{
    size_t k = 0, d = 0, b = 0;
    if (dt_trace_is_open()) {
        uint64_t h = atomic_load(&g_head);
        k = h < T.cap ? (size_t)h : T.cap;
        d = h > T.cap ? (size_t)(h - T.cap) : 0;
        b = T.cap * sizeof(ev);
    }
    if (kept)
        *kept = k;
    if (dropped)
        *dropped = d;
    if (bytes)
        *bytes = b;
}

/* ---- writing ---- */

static int ev_cmp(const void *a, const void *b)
{
    const ev *x = *(const ev *const *)a, *y = *(const ev *const *)b;
    if (x->tid != y->tid)
        return x->tid < y->tid ? -1 : 1;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    if (x->dur != y->dur) /* the enclosing span first */
        return x->dur > y->dur ? -1 : 1;
    return 0;
}

static void putf(dt__sbuf *b, const char *fmt, ...) DT_PRINTF(2, 3);
static void putf(dt__sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        dt__sbuf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* name as a JSON string body (names are ours: escape quotes, backslashes
 * and control bytes anyway). */
static void put_str(dt__sbuf *b, const char *s)
{
    dt__sbuf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char t[2] = {'\\', (char)c};
            dt__sbuf_put(b, t, 2);
        } else if (c < 0x20 || c >= 0x7f) {
            dt__sbuf_put(b, "?", 1);
        } else {
            dt__sbuf_put(b, (const char *)&c, 1);
        }
    }
    dt__sbuf_put(b, "\"", 1);
}

static void write_event(dt__sbuf *b, const ev *e, double t0)
{
    double ts = e->ts - t0;
    if (e->ph == 'C') {
        putf(b, ",\n{\"ph\":\"C\",\"pid\":%d,\"tid\":0,\"ts\":%.3f,\"name\":", T.rank, ts);
        put_str(b, e->name);
        putf(b, ",\"args\":{\"value\":%.17g}}", e->aux);
        return;
    }
    putf(b, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"cat\":\"%s\",\"name\":", T.rank, e->tid,
         ts, e->dur, dt_trace_cat_name((dt_trace_cat)e->cat));
    put_str(b, e->name);
    putf(b, ",\"args\":{\"step\":%lld", (long long)e->step);
    if (e->cat == DT_TRACE_COMM && e->grp >= 0) {
        const group_ent *g = &T.groups[e->grp];
        putf(b, ",\"seq\":%llu,\"bytes\":%llu,\"group\":", (unsigned long long)e->seq, (unsigned long long)e->bytes);
        put_str(b, g->name);
        putf(b, ",\"group_lead\":%d,\"group_size\":%d,\"queued_us\":%.3f", g->lead, g->size, e->aux);
        if (e->mb >= 0)
            putf(b, ",\"peer\":%d", e->mb);
    } else {
        if (e->mb >= 0)
            putf(b, ",\"mb\":%d", e->mb);
        if (e->aux > e->ts)
            putf(b, ",\"wait_us\":%.3f", e->aux - e->ts);
        if (e->bytes)
            putf(b, ",\"flop\":%llu", (unsigned long long)e->bytes);
    }
    dt__sbuf_put(b, "}}", 2);
}

static dt_status write_file(void)
{
    uint64_t h = atomic_load(&g_head);
    size_t n = h < T.cap ? (size_t)h : T.cap;
    const ev **list = malloc((n ? n : 1) * sizeof *list);
    if (!list)
        return dt_error(DT_ERR_NO_MEMORY, "trace: sorting %zu events", n);
    size_t k = 0;
    for (uint64_t i = h - n; i < h; i++) {
        ev *e = &T.ring[i % T.cap];
        if (atomic_load_explicit(&e->stamp, memory_order_acquire) == i + 1)
            list[k++] = e;
    }
    qsort(list, k, sizeof *list, ev_cmp);
    /* the rank's clock, aligned: rank 0's time minus the base */
    const double t0 = T.offset_us + T.base_us;
    dt__sbuf b = {0};
    putf(&b,
         "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"world\":%d,\"step_begin\":%lld,\"step_end\":%lld,"
         "\"dropped\":%llu},\n\"traceEvents\":[\n",
         T.rank, T.world, (long long)T.p.step_begin, (long long)T.p.step_end,
         (unsigned long long)(h > T.cap ? h - T.cap : 0));
    putf(&b, "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}}", T.rank,
         T.rank);
    putf(&b, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
         T.rank, T.rank);
    int last = -1;
    for (size_t i = 0; i < k; i++) {
        if (list[i]->ph != 'X' || list[i]->tid == last)
            continue;
        last = list[i]->tid;
        char nm[64];
        if (last == 1)
            snprintf(nm, sizeof nm, "main");
        else if (last >= COMM_TID0 && last - COMM_TID0 < T.ngroups)
            snprintf(nm, sizeof nm, "comm %.40s", T.groups[last - COMM_TID0].name);
        else
            snprintf(nm, sizeof nm, "thread %d", last);
        putf(&b, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", T.rank, last);
        put_str(&b, nm);
        putf(&b, "}},\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
             T.rank, last, last);
    }
    for (size_t i = 0; i < k; i++)
        write_event(&b, list[i], t0);
    dt__sbuf_put(&b, "\n]}\n", 4);
    free(list);
    if (b.oom) {
        free(b.p);
        return dt_error(DT_ERR_NO_MEMORY, "trace: the text of %zu events", k);
    }
    char path[4200];
    dt__trace_file(path, sizeof path, T.dir, T.rank);
    dt_status st = dt_file_write_atomic(path, b.p, b.n, 0644);
    free(b.p);
    return st < 0 ? dt_error_wrap(st, "trace: writing %s", path) : DT_OK;
}

dt_status dt_trace_close(void)
{
    if (!dt_trace_is_open())
        return DT_OK;
    atomic_store_explicit(&g_rec, 0, memory_order_release);
    while (atomic_load_explicit(&g_writers, memory_order_acquire) > 0)
        sched_yield();
    dt_status st = write_file();
    atomic_store_explicit(&g_open, 0, memory_order_release);
    free(T.ring);
    T.ring = NULL;
    T.cap = 0;
    if (T.lock_fd >= 0) /* this rank's file is written: the next job may take the directory */
        close(T.lock_fd);
    T.lock_fd = -1;
    return st;
}
