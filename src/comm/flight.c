/* The flight recorder: an always-on ring of each group's last operations,
 * a per-rank status block the peers can read, the cross-rank analysis of a
 * timeout and the dump on failure (see flight.h and "flight recorder" in
 * comm.h).
 *
 * Cost per operation: three updates of one ring entry (posted, started,
 * completed: a few stores and a wall-clock read each) and of the status
 * block, under the group's lock that posting and completion hold anyway;
 * no allocation. Failure paths allocate freely. */
#include "comm/flight.h"
#include "comm/pg.h"
#include "dtrain/trace.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(dt__flight_board) <= DT__FLIGHT_BOARD_BYTES, "status block fits its slot");

static _Atomic int64_t g_step = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_dir[512];
static double g_epoch; /* wall clock of the first group (g_mu) */

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double epoch(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_epoch == 0)
        g_epoch = wall_now();
    double e = g_epoch;
    pthread_mutex_unlock(&g_mu);
    return e;
}

static const char *kind_name(int k)
{
    return k == DT_FLIGHT_SUBGROUP ? "subgroup" : k < 0 ? "?" : dt_coll_kind_name((dt_coll_kind)k);
}

static int is_coll(int k) { return k != DT_COLL_SEND && k != DT_COLL_RECV; }

/* ---- public knobs ---- */

void dt_comm_set_step(int64_t step) { atomic_store_explicit(&g_step, step < 0 ? -1 : step, memory_order_relaxed); }

void dt_flight_set_dir(const char *dir)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_dir, sizeof g_dir, "%s", dir ? dir : "");
    pthread_mutex_unlock(&g_mu);
}

void dt_pg_set_label(dt_pg *pg, const char *label)
{
    if (!pg || !pg->fr.ring)
        return;
    pthread_mutex_lock(&pg->mu);
    snprintf(pg->fr.label, sizeof pg->fr.label, "%s", label ? label : "");
    pthread_mutex_unlock(&pg->mu);
}

void dt_pg_set_labelf(dt_pg *pg, const char *fmt, ...)
{
    if (!pg || !fmt)
        return;
    char buf[DT__FLIGHT_LABEL];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dt_pg_set_label(pg, buf);
}

/* ---- the status block ---- */

/* A seqlock: the version is odd while the block is written. gcc refuses
 * atomic_thread_fence under -fsanitize=thread (-Werror=tsan); that build
 * takes sequentially consistent increments instead (a full barrier on x86;
 * the block is read by other processes, which TSan does not see anyway). */
#if defined(__SANITIZE_THREAD__)
#define DT__FLIGHT_FENCE(order) ((void)0)
#define DT__FLIGHT_VER_ORDER memory_order_seq_cst
#else
#define DT__FLIGHT_FENCE(order) atomic_thread_fence(order)
#define DT__FLIGHT_VER_ORDER memory_order_relaxed
#endif

static void board_begin(dt__flight_board *b)
{
    atomic_fetch_add_explicit(&b->ver, 1, DT__FLIGHT_VER_ORDER);
    DT__FLIGHT_FENCE(memory_order_release);
}

static void board_end(dt__flight_board *b)
{
    DT__FLIGHT_FENCE(memory_order_release);
    atomic_fetch_add_explicit(&b->ver, 1, DT__FLIGHT_VER_ORDER);
}

void dt_flight_board_read(void *dst, const void *board, size_t bytes)
{
    const _Atomic uint32_t *v = board;
    for (int tries = 0; tries < 1000; tries++) {
        uint32_t a = atomic_load_explicit(v, memory_order_acquire);
        if (a & 1) { /* being written */
            sched_yield();
            continue;
        }
        memcpy(dst, board, bytes);
        DT__FLIGHT_FENCE(memory_order_acquire);
        if (atomic_load_explicit(v, DT__FLIGHT_VER_ORDER) == a)
            return;
    }
    memcpy(dst, board, bytes); /* a writer stopped mid-write: take it as it is */
}

dt_status dt__flight_env(uint32_t *cap, double *wait_s)
{
    int64_t n;
    if (dt_env_int("DT_FLIGHT_ENTRIES", 256, 16, 65536, &n) < 0)
        return DT_ERR_INVALID_ARG;
    if (dt_env_double("DT_FLIGHT_WAIT", 2.0, 0.0, 60.0, wait_s) < 0)
        return DT_ERR_INVALID_ARG;
    *cap = (uint32_t)n;
    return DT_OK;
}

int dt__flight_init(dt_pg *pg, uint32_t cap, double wait_s, const char *name)
{
    dt__flight *f = &pg->fr;
    (void)epoch();
    f->ring = calloc(cap, sizeof *f->ring);
    if (!f->ring)
        return 0;
    f->cap = cap;
    f->wait_s = wait_s;
    snprintf(f->name, sizeof f->name, "%s", name);
    f->board = &f->own;
    f->own.rank = pg->rank;
    f->own.pend_kind = f->own.last_kind = -1;
    f->own.pend_step = f->own.last_step = -1;
    return 1;
}

void dt__flight_free(dt_pg *pg)
{
    free(pg->fr.ring);
    pg->fr.ring = NULL;
    free(pg->fr.world);
    pg->fr.world = NULL;
}

int dt__flight_members(dt_pg *pg, const dt_pg *parent, const int *ranks, int n)
{
    int *w = malloc((size_t)n * sizeof *w);
    if (!w)
        return 0;
    for (int i = 0; i < n; i++)
        w[i] = parent->fr.world ? parent->fr.world[ranks[i]] : ranks[i];
    free(pg->fr.world);
    pg->fr.world = w;
    return 1;
}

void dt__flight_attach(dt_pg *pg)
{
    dt__flight *f = &pg->fr;
    void *b = pg->ops->flight_board && pg->ops->flight_gather
                  ? pg->ops->flight_board(pg->ctx, DT__FLIGHT_BOARD_BYTES)
                  : NULL;
    if (!b)
        return;
    dt__flight_board *nb = b;
    board_begin(nb);
    dt__flight_board tmp = f->own;
    memcpy((char *)nb + sizeof nb->ver, (char *)&tmp + sizeof tmp.ver, sizeof tmp - sizeof tmp.ver);
    board_end(nb);
    f->board = nb;
}

/* ---- recording ---- */

uint64_t dt__flight_post(dt_pg *pg, const dt_coll *c)
{
    dt__flight *f = &pg->fr;
    if (!f->ring)
        return 0;
    uint64_t id = f->next++;
    dt_flight_entry *e = &f->ring[id % f->cap];
    double now = wall_now();
    e->id = id;
    e->seq = c->seq;
    e->kind = (int)c->kind;
    e->dtype = c->dtype;
    e->peer = c->root;
    e->status = DT_INPROGRESS;
    e->bytes = c->kind == DT_COLL_BARRIER || (int)c->kind == DT_FLIGHT_SUBGROUP ? 0 : c->count * dt_dtype_size(c->dtype);
    e->t_posted = now - g_epoch;
    e->t_started = e->t_done = 0;
    e->step = atomic_load_explicit(&g_step, memory_order_relaxed);
    memcpy(e->label, f->label, sizeof e->label);
    if (is_coll(e->kind)) {
        dt__flight_board *b = f->board;
        board_begin(b);
        if (b->posted == b->done) { /* nothing pending: this one is the oldest */
            b->pend_kind = e->kind;
            b->t_pend = now;
            b->pend_step = e->step;
            memcpy(b->pend_label, e->label, sizeof b->pend_label);
        }
        b->posted = c->seq + 1;
        board_end(b);
    }
    return id;
}

static dt_flight_entry *entry_of(dt__flight *f, uint64_t id)
{
    if (!f->ring || id >= f->next || f->next - id > f->cap)
        return NULL; /* overwritten since */
    dt_flight_entry *e = &f->ring[id % f->cap];
    return e->id == id ? e : NULL;
}

void dt__flight_start(dt_pg *pg, uint64_t id)
{
    dt_flight_entry *e = entry_of(&pg->fr, id);
    if (e && e->t_started == 0)
        e->t_started = wall_now() - g_epoch;
}

void dt__flight_done(dt_pg *pg, uint64_t id, dt_status st)
{
    dt__flight *f = &pg->fr;
    dt_flight_entry *e = entry_of(f, id);
    if (!e)
        return;
    double now = wall_now();
    e->t_done = now - g_epoch;
    if (e->t_started == 0)
        e->t_started = e->t_done;
    e->status = st;
    if (st >= 0 && e->kind != DT_FLIGHT_SUBGROUP && dt_trace_is_open()) { /* the timeline (trace.h) */
        double t = now - g_epoch;
        bool p2p = e->kind == DT_COLL_SEND || e->kind == DT_COLL_RECV;
        dt_trace_comm(kind_name(e->kind), f->name, f->world ? f->world[0] : 0, pg->size, e->seq, e->bytes,
                      p2p ? (f->world ? f->world[e->peer] : e->peer) : -1, t - e->t_posted, t - e->t_started, 0);
    }
    dt__flight_board *b = f->board;
    if (st < 0 || !is_coll(e->kind) || e->seq != b->done)
        return;
    board_begin(b);
    b->done = e->seq + 1;
    b->last_kind = e->kind;
    b->t_last = now;
    b->last_step = e->step;
    memcpy(b->last_label, e->label, sizeof b->last_label);
    b->pend_kind = -1;
    if (b->posted > b->done) { /* the next collective: usually the next record */
        for (uint64_t j = id + 1; j < f->next; j++) {
            dt_flight_entry *x = entry_of(f, j);
            if (x && is_coll(x->kind) && x->seq == b->done) {
                b->pend_kind = x->kind;
                b->t_pend = x->t_posted + g_epoch;
                b->pend_step = x->step;
                memcpy(b->pend_label, x->label, sizeof b->pend_label);
                break;
            }
        }
    }
    board_end(b);
}

int dt_pg_flight(dt_pg *pg, dt_flight_entry *out, int max)
{
    if (!pg || !out || max <= 0 || !pg->fr.ring)
        return 0;
    pthread_mutex_lock(&pg->mu);
    dt__flight *f = &pg->fr;
    uint64_t have = f->next < f->cap ? f->next : f->cap;
    uint64_t n = have < (uint64_t)max ? have : (uint64_t)max;
    for (uint64_t i = 0; i < n; i++)
        out[i] = f->ring[(f->next - n + i) % f->cap];
    pthread_mutex_unlock(&pg->mu);
    return (int)n;
}

/* ---- dumps ---- */

/* " (label, step N)" or "" into buf. */
static const char *tag(const char *label, int64_t step, char *buf, size_t n)
{
    if (label[0] && step >= 0)
        snprintf(buf, n, " (%.*s, step %lld)", DT__FLIGHT_LABEL, label, (long long)step);
    else if (label[0])
        snprintf(buf, n, " (%.*s)", DT__FLIGHT_LABEL, label);
    else if (step >= 0)
        snprintf(buf, n, " (step %lld)", (long long)step);
    else
        buf[0] = '\0';
    return buf;
}

static const char *state_name(const dt_flight_entry *e)
{
    return e->status == DT_INPROGRESS ? (e->t_started > 0 ? "started" : "posted")
                                      : e->status < 0 ? dt_status_name(e->status) : "completed";
}

static void json_str(FILE *fp, const char *s, size_t max)
{
    fputc('"', fp);
    for (size_t i = 0; i < max && s[i]; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(fp, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(fp, "\\u%04x", ch);
        else
            fputc(ch, fp);
    }
    fputc('"', fp);
}

/* The whole ring as JSON, oldest first, written to DIR/flight-rank<R>-g<NAME>.json
 * (temp + rename; nothing planted there is followed). */
static void dump_file(dt_pg *pg, const dt_flight_entry *e, int n, const char *why, const char *dir)
{
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    if (!fp)
        return;
    fprintf(fp, "{\"version\": 1, \"group\": ");
    json_str(fp, pg->fr.name, sizeof pg->fr.name);
    fprintf(fp, ", \"rank\": %d, \"size\": %d, \"backend\": ", pg->rank, pg->size);
    json_str(fp, pg->backend, sizeof pg->backend);
    fprintf(fp, ", \"epoch_unix_s\": %.6f, \"capacity\": %u, \"why\": ", g_epoch, pg->fr.cap);
    json_str(fp, why, 1024);
    fprintf(fp, ",\n \"entries\": [");
    for (int i = 0; i < n; i++) {
        fprintf(fp, "%s\n  {\"id\": %llu, \"seq\": %llu, \"kind\": \"%s\", \"bytes\": %zu, \"dtype\": \"%s\", "
                    "\"peer\": %d, \"state\": \"%s\", \"t_posted\": %.6f, \"t_started\": %.6f, "
                    "\"t_done\": %.6f, \"step\": %lld, \"label\": ",
                i ? "," : "", (unsigned long long)e[i].id, (unsigned long long)e[i].seq, kind_name(e[i].kind),
                e[i].bytes, dt_dtype_name(e[i].dtype), e[i].peer, state_name(&e[i]), e[i].t_posted,
                e[i].t_started, e[i].t_done, (long long)e[i].step);
        json_str(fp, e[i].label, sizeof e[i].label);
        fputc('}', fp);
    }
    fprintf(fp, "\n]}\n");
    if (fclose(fp) != 0) {
        free(text);
        return;
    }
    char path[700];
    snprintf(path, sizeof path, "%s/flight-rank%d-g%s.json", dir, pg->rank, pg->fr.name);
    dt_file *f = NULL;
    dt_status st = dt_file_open(path, 0644, &f);
    if (st >= 0)
        st = dt_file_write(f, text, len);
    if (st >= 0)
        st = dt_file_commit(f);
    if (st < 0)
        dt_log(DT_LOG_WARN, "flight recorder: cannot write %s: %s", path, dt_last_error());
    else
        dt_log(DT_LOG_WARN, "flight recorder: rank %d wrote group %s's last %d operations to %s", pg->rank,
               pg->fr.name, n, path);
    dt_file_close(f);
    free(text);
}

void dt_pg_flight_dump(dt_pg *pg, const char *why, int nlog)
{
    if (!pg || !pg->fr.ring)
        return;
    int cap = (int)pg->fr.cap;
    dt_flight_entry *e = malloc(sizeof *e * (size_t)cap);
    if (!e)
        return;
    int n = dt_pg_flight(pg, e, cap);
    int from = nlog > 0 && nlog < n ? n - nlog : 0;
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    if (fp) {
        fprintf(fp, "flight recorder: group %s, rank %d of %d (%s), %s: its last %d of %llu operations "
                    "(times in s since this process's first group):",
                pg->fr.name, pg->rank, pg->size, pg->backend, why ? why : "on request", n - from,
                (unsigned long long)pg->fr.next);
        for (int i = from; i < n; i++) {
            char t[96], peer[24] = "";
            if (e[i].peer >= 0)
                snprintf(peer, sizeof peer, " %s %d", e[i].kind == DT_COLL_SEND   ? "to"
                                                      : e[i].kind == DT_COLL_RECV ? "from"
                                                                                  : "root",
                         e[i].peer);
            fprintf(fp, "\n  %s #%llu%s, %zu B %s%s: posted %.3f, started %.3f, done %.3f, %s", kind_name(e[i].kind),
                    (unsigned long long)e[i].seq, peer, e[i].bytes, dt_dtype_name(e[i].dtype),
                    tag(e[i].label, e[i].step, t, sizeof t), e[i].t_posted, e[i].t_started, e[i].t_done,
                    state_name(&e[i]));
        }
        if (fclose(fp) == 0 && text)
            dt_log(DT_LOG_ERROR, "%s", text);
        free(text);
    }
    char dir[512];
    pthread_mutex_lock(&g_mu);
    snprintf(dir, sizeof dir, "%s", g_dir);
    pthread_mutex_unlock(&g_mu);
    if (!dir[0]) {
        const char *d = getenv("DT_FLIGHT_DIR");
        snprintf(dir, sizeof dir, "%s", d ? d : "");
    }
    if (dir[0])
        dump_file(pg, e, n, why ? why : "on request", dir);
    free(e);
}

/* ---- the analysis of a timeout ---- */

/* "0, 2" into buf. */
static void rank_list(const int *r, int n, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && o + 16 < cap; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? ", " : "", r[i]);
}

void dt__flight_timeout(dt_pg *pg, char *msg, size_t n)
{
    dt__flight *f = &pg->fr;
    if (!f->ring || pg->size < 2)
        return;
    const size_t B = DT__FLIGHT_BOARD_BYTES;
    int W = pg->size;
    dt__flight_board me;
    pthread_mutex_lock(&pg->mu);
    board_begin(f->board);
    f->board->analysing = 1;
    board_end(f->board);
    dt_flight_board_read(&me, f->board, sizeof me);
    pthread_mutex_unlock(&pg->mu);
    if (me.posted <= me.done)
        return; /* no collective pending here: not a collective's timeout */
    /* ranks that time out together see each other's flag: the lowest of
     * them reports (the others append the verdict to their errors only) */
    struct timespec settle = {0, 50000000};
    nanosleep(&settle, NULL);
    char *all = calloc((size_t)W, B);
    unsigned char *got = calloc((size_t)W, 1);
    int *miss = malloc(sizeof *miss * (size_t)W), *wait = malloc(sizeof *wait * (size_t)W);
    int *deaf = malloc(sizeof *deaf * (size_t)W);
    char *text = NULL;
    size_t tlen = 0;
    FILE *fp = NULL;
    if (!all || !got || !miss || !wait || !deaf)
        goto out;
    if (pg->ops->flight_gather && pg->ops->flight_board && f->board != &f->own)
        (void)pg->ops->flight_gather(pg->ctx, all, got, B, f->wait_s);
    memcpy(all + (size_t)pg->rank * B, &me, sizeof me);
    got[pg->rank] = 1;

    uint64_t S = me.done;
    char what[160], t[96];
    snprintf(what, sizeof what, "%s #%llu%s", kind_name(me.pend_kind), (unsigned long long)S,
             tag(me.pend_label, me.pend_step, t, sizeof t));
    int nmiss = 0, nwait = 0, ndeaf = 0, reporter = 1;
    double since = 0;
    for (int r = 0; r < W; r++) {
        const dt__flight_board *b = (const dt__flight_board *)(all + (size_t)r * B);
        if (!got[r]) {
            deaf[ndeaf++] = r;
            continue;
        }
        if (r < pg->rank && b->analysing)
            reporter = 0; /* a lower rank reports */
        if (b->posted <= S) {
            miss[nmiss++] = r;
        } else if (b->done <= S) {
            wait[nwait++] = r;
            if (b->done == S && (since == 0 || b->t_pend < since))
                since = b->t_pend;
        }
    }
    /* the verdict, appended to the error */
    fp = open_memstream(&text, &tlen);
    if (!fp)
        goto out;
    fprintf(fp, "; flight recorder:");
    for (int i = 0; i < nmiss; i++) {
        const dt__flight_board *b = (const dt__flight_board *)(all + (size_t)miss[i] * B);
        fprintf(fp, " rank %d has not posted %s;", miss[i], what);
        if (b->done > 0)
            fprintf(fp, " it last completed %s #%llu%s at %.2f s", kind_name(b->last_kind),
                    (unsigned long long)(b->done - 1), tag(b->last_label, b->last_step, t, sizeof t),
                    b->t_last - g_epoch);
        else
            fprintf(fp, " it completed nothing on this group");
        if (b->posted > b->done)
            fprintf(fp, " and waits in %s #%llu since %.2f s", kind_name(b->pend_kind),
                    (unsigned long long)b->done, b->t_pend - g_epoch);
        fputc(';', fp);
    }
    if (ndeaf) {
        char l[256];
        rank_list(deaf, ndeaf, l, sizeof l);
        fprintf(fp, " rank%s %s did not answer within %.3g s (stopped, dead, or busy outside the comm "
                    "layer; not known to have posted %s);",
                ndeaf > 1 ? "s" : "", l, f->wait_s, what);
    }
    if (!nmiss && !ndeaf)
        fprintf(fp, " every rank posted %s and none completed it (a stall inside the backend);", what);
    if (nwait) {
        char l[256];
        rank_list(wait, nwait, l, sizeof l);
        fprintf(fp, " rank%s %s wait%s since %.2f s", nwait > 1 ? "s" : "", l, nwait > 1 ? "" : "s",
                since - g_epoch);
    }
    int bad = fclose(fp) != 0;
    fp = NULL;
    if (bad)
        goto out;
    size_t ml = strlen(msg);
    if (ml < n)
        snprintf(msg + ml, n - ml, "%s", text);
    if (reporter) {
        /* the whole analysis, one line per rank */
        char *full = NULL;
        size_t flen = 0;
        FILE *q = open_memstream(&full, &flen);
        if (q) {
            fprintf(q, "flight recorder: group %s, %s timed out on rank %d; the ranks (times in s since "
                       "rank %d's first group):",
                    f->name, what, pg->rank, pg->rank);
            for (int r = 0; r < W; r++) {
                const dt__flight_board *b = (const dt__flight_board *)(all + (size_t)r * B);
                if (!got[r]) {
                    fprintf(q, "\n  rank %d: no answer within %.3g s", r, f->wait_s);
                    continue;
                }
                fprintf(q, "\n  rank %d: posted %llu collectives, completed %llu", r,
                        (unsigned long long)b->posted, (unsigned long long)b->done);
                if (b->done > 0)
                    fprintf(q, " (last %s #%llu%s at %.2f s)", kind_name(b->last_kind),
                            (unsigned long long)(b->done - 1), tag(b->last_label, b->last_step, t, sizeof t),
                            b->t_last - g_epoch);
                if (b->posted > b->done)
                    fprintf(q, "; waits in %s #%llu%s since %.2f s", kind_name(b->pend_kind),
                            (unsigned long long)b->done, tag(b->pend_label, b->pend_step, t, sizeof t),
                            b->t_pend - g_epoch);
                if (b->posted <= S)
                    fprintf(q, "; has NOT posted #%llu", (unsigned long long)S);
            }
            fprintf(q, "\n  verdict: %s", text + strlen("; flight recorder: "));
            if (fclose(q) == 0 && full)
                dt_log(DT_LOG_ERROR, "%s", full);
            free(full);
        }
    }
out:
    if (fp)
        fclose(fp);
    free(text);
    free(all);
    free(got);
    free(miss);
    free(wait);
    free(deaf);
}
