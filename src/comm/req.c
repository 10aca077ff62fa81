/* Requests and the per-group progress engine.
 *
 * A group keeps a FIFO of posted requests. Exactly one executor at a time
 * (pg->busy) takes the head and calls the backend's blocking `run`, so the
 * operations of a group run one after another in posting order, the same on
 * every rank. Two kinds of executor share the queue:
 *
 *  - a progress thread, started on the first asynchronous post, which
 *    drains the queue while the application computes (the overlap DDP and
 *    FSDP need), and sleeps on the condition variable when it is empty;
 *  - the caller itself, inside dt_req_wait(req, -1) (and so inside every
 *    blocking wrapper): when no executor is busy it runs queued requests up
 *    to its own on its own thread. A blocking collective thus costs no
 *    thread hand-off, which is what keeps small-message latency low.
 *
 * Consecutive send/recv requests are the exception: with a backend that
 * has the p2p_* slots they run as one batch, all in flight together (see
 * run_p2p_locked), so no posted pattern of them can deadlock.
 *
 * A failure marks the group failed (fail_st/fail_msg); queued and later
 * requests then fail at once with the same status and message.
 */
#include "comm/pg.h"
#include "dtrain/trace.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void req_release(dt_req *r)
{
    if (r->xf_free)
        r->xf_free(r->xf);
    else
        free(r->xf);
    free(r->own_displs);
    free(r);
}

/* Record the group's failure (first one wins) and tell the backend. */
static void pg_mark_failed(dt_pg *pg, dt_status st, const char *msg)
{
    int first = 0;
    pthread_mutex_lock(&pg->mu);
    if (pg->fail_st == DT_OK) {
        pg->fail_st = st;
        snprintf(pg->fail_msg, sizeof pg->fail_msg, "%s", msg);
        first = 1;
    }
    pthread_mutex_unlock(&pg->mu);
    if (first && pg->ops->abort)
        pg->ops->abort(pg->ctx, st, msg);
    if (first) {
        char why[DT__MSG_CAP + 32];
        snprintf(why, sizeof why, "failed: %s", msg);
        dt_pg_flight_dump(pg, why, 16);
    }
}

/* A collective failed on this rank with st and msg: a timeout gets the
 * flight recorder's verdict appended; then the group is marked failed. */
static void coll_failed(dt_pg *pg, dt_status st, char *msg, size_t n)
{
    /* a timeout of this rank's (one passed on from a peer carries the
     * peer's verdict already) */
    if (st == DT_ERR_TIMEOUT && !strstr(msg, "(DT_COMM_TIMEOUT=") && !strstr(msg, "timeout is ")) {
        if (!strstr(msg, "; flight recorder:"))
            dt__flight_timeout(pg, msg, n);
        size_t l = strlen(msg);
        if (l < n)
            snprintf(msg + l, n - l, "%s%.3g s%s", pg->timeout_src == 2 ? " (the group's timeout is "
                                                    : pg->timeout_src == 1 ? " (DT_COMM_TIMEOUT="
                                                                           : " (the timeout is the default ",
                     pg->timeout_s, pg->timeout_src == 0 ? "; set DT_COMM_TIMEOUT=SECONDS to change it)" : ")");
    }
    pg_mark_failed(pg, st, msg);
}

dt_status dt_pg_fail(dt_pg *pg, dt_status st, const char *msg)
{
    if (pg && st < 0)
        pg_mark_failed(pg, st, msg);
    return st;
}

static int is_p2p(dt_coll_kind k) { return k == DT_COLL_SEND || k == DT_COLL_RECV; }

void dt__pg_kick_locked(dt_pg *pg)
{
    if (pg->thread_on && (pg->stop || ((pg->head || pg->bn > 0) && !pg->busy && pg->drivers == 0)))
        pthread_cond_signal(&pg->pcv);
}

/* Finish r with status st and message msg (mu held). */
static void complete_locked(dt_pg *pg, dt_req *r, dt_status st, const char *msg)
{
    dt__flight_done(pg, r->fr_id, st);
    snprintf(r->msg, sizeof r->msg, "%s", st < 0 ? msg : "");
    atomic_store_explicit(&r->state, (int)st, memory_order_release);
    pg->pending--;
    if (r->freed)
        req_release(r);
    pthread_cond_broadcast(&pg->cv);
}

/* The message for a backend error on c (dt_last_error() if set). */
static void backend_msg(dt_pg *pg, const dt_coll *c, dt_status st, char *msg, size_t n)
{
    const char *e = dt_last_error();
    char d[160];
    if (e[0])
        snprintf(msg, n, "%s", e);
    else
        snprintf(msg, n, "%s failed in backend '%s': %s", dt__coll_describe(c, d, sizeof d),
                 pg->ops->name, dt_status_str(st));
}

/* ---- batched point to point ----
 * When the head of the queue is a send or recv and the backend has the
 * p2p_* slots, the executor takes every consecutive send/recv at the head
 * (and those posted while it runs) into the group's batch (pg->bv) and
 * keeps them in flight together: each pass tests every started one; an op
 * starts when no earlier op of the same direction and peer is still open
 * (messages of a pair stay in order). The batch lives in the group, not in
 * one executor, so it can change hands:
 *
 *  - posting a send or recv runs one pass at once on the poster's thread
 *    when no executor is busy (a send that fits the backend's buffer is
 *    out before the poster computes on, with no thread hand-off);
 *  - a thread waiting for a request (dt_req_wait, unbounded) runs the
 *    batch itself until its request is done; while a waiter exists the
 *    progress thread hands the batch over (p2p_wake interrupts its nap);
 *  - the progress thread runs what is left otherwise.
 *
 * A waiter that finds nothing to move polls, without napping, for up to
 * DT__P2P_SPIN_S when every thread of this machine's ranks has a core of
 * its own (it computes nothing meanwhile, and a nap costs a wake-up);
 * otherwise, and after that, it naps as the progress thread does
 * (p2p_idle), so 8 ranks on 2 cores leave the CPU to the ranks at work.
 * The batch ends when nothing is open and the head is not a send or recv,
 * so a later collective waits for it. An op that makes no progress for the
 * group's timeout fails with DT_ERR_TIMEOUT. */
#define DT__P2P_SPIN_S 0.02

typedef struct dt__p2p_slot {
    dt_req *r;
    void *op;        /* backend state once started */
    int started;
    double last;     /* time of the last progress */
} p2p_slot;

/* May a waiting thread poll? (mu held) Counted over the ranks of the
 * world group on this machine (a subgroup's own size says nothing about
 * how many ranks share the cores). */
static int spin_ok(dt_pg *pg)
{
    if (pg->spin < 0) {
        const dt_pg *w = pg;
        while (w->parent)
            w = w->parent;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        long want = (long)(w->local_size > 0 ? w->local_size : 1) * dt_get_num_threads();
        pg->spin = ncpu > 0 && want <= ncpu;
    }
    return pg->spin;
}

/* Run the batch; mu held and busy set by the caller; returns with mu held.
 * mine: the request the calling thread waits for (return once it is done),
 * or NULL (the progress thread: return when a waiter wants the batch);
 * once: one pass only (a post). */
static void run_p2p_locked(dt_pg *pg, const dt_req *mine, int once)
{
    int idle = 0;
    double spin_until = -1;
    for (;;) {
        /* take the send/recv requests at the head */
        while (pg->head && is_p2p(pg->head->c.kind)) {
            if (pg->bn == pg->bcap) {
                int nc = pg->bcap ? 2 * pg->bcap : 16;
                p2p_slot *nv = realloc(pg->bv, (size_t)nc * sizeof *nv);
                if (!nv)
                    break; /* run what we have; the rest waits for the next pass */
                pg->bv = nv;
                pg->bcap = nc;
            }
            dt_req *r = pg->head;
            pg->head = r->next;
            if (!pg->head)
                pg->tail = NULL;
            r->next = NULL;
            pg->bv[pg->bn++] = (p2p_slot){.r = r, .last = dt_time_s()};
            dt__flight_start(pg, r->fr_id);
        }
        if (pg->bn == 0)
            break;
        if (mine && atomic_load_explicit(&((dt_req *)mine)->state, memory_order_acquire) != DT_INPROGRESS)
            break;
        if (!mine && !once && pg->drivers > 0)
            break; /* a waiter takes the batch over */
        dt_status fst = pg->fail_st;
        char fmsg[DT__MSG_CAP];
        snprintf(fmsg, sizeof fmsg, "%s", pg->fail_msg);
        p2p_slot *v = pg->bv; /* only the busy executor changes the batch */
        int n = pg->bn;
        pthread_mutex_unlock(&pg->mu);

        int progressed = 0;
        for (int i = 0; i < n; i++) {
            p2p_slot *q = &v[i];
            dt_status st = DT_INPROGRESS;
            char msg[DT__MSG_CAP];
            msg[0] = '\0';
            if (fst != DT_OK) {
                st = fst;
                snprintf(msg, sizeof msg, "%s", fmsg);
                if (q->started) /* abandon: the backend releases its state */
                    (void)pg->ops->p2p_test(pg->ctx, q->op, NULL);
            } else if (!q->started) {
                int blocked = 0;
                for (int j = 0; j < i && !blocked; j++)
                    blocked = v[j].r->c.kind == q->r->c.kind && v[j].r->c.root == q->r->c.root;
                if (blocked)
                    continue;
                dt_error_clear();
                st = pg->ops->p2p_start(pg->ctx, &q->r->c, &q->op);
                if (st >= 0) {
                    q->started = 1;
                    q->last = dt_time_s();
                    progressed = 1;
                    st = DT_INPROGRESS;
                }
            }
            if (st == DT_INPROGRESS && q->started) {
                int moved = 0;
                dt_error_clear();
                st = pg->ops->p2p_test(pg->ctx, q->op, &moved);
                if (moved) {
                    progressed = 1;
                    q->last = dt_time_s();
                } else if (st == DT_INPROGRESS && dt_time_s() - q->last > pg->timeout_s) {
                    char d[160];
                    st = DT_ERR_TIMEOUT;
                    dt_error(st, "%s on rank %d made no progress for %.3g s: rank %d did not %s",
                             dt__coll_describe(&q->r->c, d, sizeof d), pg->rank, pg->timeout_s,
                             q->r->c.root,
                             q->r->c.kind == DT_COLL_SEND ? "receive (no matching recv posted?)"
                                                          : "send (no matching send posted?)");
                    (void)pg->ops->p2p_test(pg->ctx, q->op, NULL); /* abandon */
                }
            }
            if (st == DT_INPROGRESS)
                continue;
            if (st < 0 && !msg[0])
                backend_msg(pg, &q->r->c, st, msg, sizeof msg);
            if (st < 0 && st != DT_ERR_UNSUPPORTED && fst == DT_OK) {
                pg_mark_failed(pg, st, msg);
                fst = st;
                snprintf(fmsg, sizeof fmsg, "%s", msg);
            }
            pthread_mutex_lock(&pg->mu);
            complete_locked(pg, q->r, st < 0 ? st : DT_OK, msg);
            pthread_mutex_unlock(&pg->mu);
            memmove(v + i, v + i + 1, (size_t)(n - i - 1) * sizeof *v);
            n--;
            i--;
            progressed = 1;
        }
        pthread_mutex_lock(&pg->mu);
        pg->bn = n;
        if (once)
            break;
        if (progressed) {
            idle = 0;
            spin_until = -1;
            continue;
        }
        if (n == 0 || (mine && atomic_load_explicit(&((dt_req *)mine)->state, memory_order_acquire) != DT_INPROGRESS))
            continue; /* the loop's checks end it */
        if (!mine && pg->drivers > 0)
            continue;
        if (mine && spin_ok(pg)) { /* a waiter with a core of its own: poll */
            double now = dt_time_s();
            if (spin_until < 0)
                spin_until = now + DT__P2P_SPIN_S;
            if (now < spin_until)
                continue;
        }
        pthread_mutex_unlock(&pg->mu);
        pg->ops->p2p_idle(pg->ctx, idle++, 0.05);
        pthread_mutex_lock(&pg->mu);
    }
}

/* Run one request (called with busy set and mu released). */
static void exec_one(dt_pg *pg, dt_req *r)
{
    dt_status st;
    char msg[DT__MSG_CAP];
    msg[0] = '\0';

    pthread_mutex_lock(&pg->mu);
    dt_status fst = pg->fail_st;
    if (fst != DT_OK)
        snprintf(msg, sizeof msg, "%s", pg->fail_msg);
    pthread_mutex_unlock(&pg->mu);

    if (fst != DT_OK) {
        st = fst;
    } else if (pg->ops->kinds && !(pg->ops->kinds & (1u << r->c.kind))) {
        st = DT_ERR_UNSUPPORTED;
        snprintf(msg, sizeof msg, "backend '%s' does not implement %s", pg->ops->name,
                 dt_coll_kind_name(r->c.kind));
    } else {
        dt_error_clear();
        st = r->pre ? r->pre(r) : DT_OK;
        if (st >= 0 && !r->pre_done)
            st = pg->ops->run(pg->ctx, &r->c);
        if (st >= 0 && r->post)
            r->post(r);
        if (st < 0) {
            backend_msg(pg, &r->c, st, msg, sizeof msg);
            /* Unsupported operations do not break the group. */
            if (st != DT_ERR_UNSUPPORTED)
                coll_failed(pg, st, msg, sizeof msg);
        } else {
            st = DT_OK;
        }
    }

    pthread_mutex_lock(&pg->mu);
    complete_locked(pg, r, st, msg);
    pthread_mutex_unlock(&pg->mu);
}

/* Continue the batch or pop the head and run it; called with mu held and
 * busy clear, returns with mu held. mine: see run_p2p_locked. */
static void run_head_locked(dt_pg *pg, const dt_req *mine)
{
    if (pg->bn > 0 || (is_p2p(pg->head->c.kind) && pg->ops->p2p_start)) {
        pg->busy = 1;
        run_p2p_locked(pg, mine, 0);
        pg->busy = 0;
        pthread_cond_broadcast(&pg->cv);
        dt__pg_kick_locked(pg);
        return;
    }
    dt_req *r = pg->head;
    pg->head = r->next;
    if (!pg->head)
        pg->tail = NULL;
    r->next = NULL;
    pg->busy = 1;
    dt__flight_start(pg, r->fr_id);
    pthread_mutex_unlock(&pg->mu);
    exec_one(pg, r);
    pthread_mutex_lock(&pg->mu);
    pg->busy = 0;
    pthread_cond_broadcast(&pg->cv);
    dt__pg_kick_locked(pg);
}

/* The group whose progress thread this is (NULL on the application's threads). */
static _Thread_local const dt_pg *progress_of;
/* Progress threads of this process running an operation now (every group's). */
static _Atomic int progress_running;

int dt__comm_may_poll(void)
{
    const dt_pg *pg = progress_of;
    if (pg && atomic_load_explicit(&((dt_pg *)pg)->waiting, memory_order_relaxed) == 0)
        return 0; /* in the background: the rank computes meanwhile */
    /* another group's progress thread copying at the same time (ZeRO-3's reduce-scatters while the
       application waits for a gather) already takes the core that waiting frees */
    return atomic_load_explicit(&progress_running, memory_order_relaxed) - (pg ? 1 : 0) <= 0;
}

static void *progress_main(void *arg)
{
    dt_pg *pg = arg;
    progress_of = pg;
    pthread_mutex_lock(&pg->mu);
    int yielded = 0;
    for (;;) {
        /* waiters run the queue themselves */
        while (!pg->stop && ((pg->head == NULL && pg->bn == 0) || pg->busy || pg->drivers > 0)) {
            pthread_cond_wait(&pg->pcv, &pg->mu);
            yielded = 0;
        }
        if ((pg->head == NULL && pg->bn == 0) || pg->busy || pg->drivers > 0) {
            if (pg->stop)
                break;
            continue;
        }
        if (!yielded && (pg->bn > 0 || is_p2p(pg->head->c.kind))) {
            /* woken by a post of a send/recv: the poster may be about to
             * wait for it; let it come and run the batch itself (no
             * hand-over) when it shares this core */
            yielded = 1;
            pthread_mutex_unlock(&pg->mu);
            sched_yield();
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        atomic_fetch_add_explicit(&progress_running, 1, memory_order_relaxed);
        run_head_locked(pg, NULL);
        atomic_fetch_sub_explicit(&progress_running, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

dt_status dt__pg_post(dt_pg *pg, const dt_coll *c, size_t *own_displs, int start_thread,
                      dt_req **out)
{
    return dt__pg_post_ex(pg, c, own_displs, NULL, NULL, NULL, start_thread, out);
}

dt_status dt__pg_post_ex(dt_pg *pg, const dt_coll *c, size_t *own_displs, dt_status (*pre)(dt_req *),
                         void (*post)(dt_req *), void *xf, int start_thread, dt_req **out)
{
    *out = NULL;
    dt_req *r = calloc(1, sizeof *r);
    if (!r) {
        free(own_displs);
        free(xf);
        return dt_error(DT_ERR_NO_MEMORY, "comm: out of memory posting %s",
                        dt_coll_kind_name(c->kind));
    }
    r->pre = pre;
    r->post = post;
    r->xf = xf;
    r->pg = pg;
    r->c = *c;
    r->own_displs = own_displs;
    if (own_displs)
        r->c.displs = own_displs;
    atomic_init(&r->state, DT_INPROGRESS);

    pthread_mutex_lock(&pg->mu);
    if (pg->fail_st != DT_OK) {
        dt_status st = pg->fail_st;
        dt_error(st, "%s", pg->fail_msg);
        pthread_mutex_unlock(&pg->mu);
        req_release(r);
        return st;
    }
    if (c->kind == DT_COLL_SEND)
        r->c.seq = pg->p2p_seq[2 * c->root]++;
    else if (c->kind == DT_COLL_RECV)
        r->c.seq = pg->p2p_seq[2 * c->root + 1]++;
    else
        r->c.seq = pg->seq++;
    r->c.timeout_s = pg->timeout_s;
    r->fr_id = dt__flight_post(pg, &r->c);
    if (pg->tail)
        pg->tail->next = r;
    else
        pg->head = r;
    pg->tail = r;
    pg->pending++;
    if (start_thread && !pg->thread_on) {
        if (pthread_create(&pg->thread, NULL, progress_main, pg) == 0)
            pg->thread_on = 1;
        /* Without a thread, waits still drive the queue. */
    }
    /* a send or recv at the head: one pass here and now (see run_p2p_locked) */
    if (is_p2p(c->kind) && pg->ops->p2p_start && !pg->busy && pg->head && is_p2p(pg->head->c.kind)) {
        pg->busy = 1;
        run_p2p_locked(pg, NULL, 1);
        pg->busy = 0;
    } else if (is_p2p(c->kind) && pg->busy && pg->bn > 0 && pg->ops->p2p_wake) {
        /* the executor may be napping on a batch that waits for a peer:
         * wake it so that it takes this one in now (a send would otherwise
         * wait for the peer's data or the end of the nap) */
        pg->ops->p2p_wake(pg->ctx);
    }
    pthread_cond_broadcast(&pg->cv);
    dt__pg_kick_locked(pg);
    pthread_mutex_unlock(&pg->mu);
    *out = r;
    return DT_OK;
}

dt_status dt__pg_run_blocking(dt_pg *pg, const dt_coll *c)
{
    pthread_mutex_lock(&pg->mu);
    if (pg->head || pg->busy || pg->bn) { /* others first: queue behind them */
        pthread_mutex_unlock(&pg->mu);
        dt_req *r;
        dt_status st = dt__pg_post(pg, c, NULL, 0, &r);
        if (st < 0)
            return st;
        st = dt_req_wait(r, -1);
        dt_req_free(r);
        return st;
    }
    if (pg->fail_st != DT_OK) {
        dt_status st = dt_error(pg->fail_st, "%s", pg->fail_msg);
        pthread_mutex_unlock(&pg->mu);
        return st;
    }
    /* Idle engine: run it right here, without a request. */
    dt_coll cc = *c;
    if (c->kind == DT_COLL_SEND)
        cc.seq = pg->p2p_seq[2 * c->root]++;
    else if (c->kind == DT_COLL_RECV)
        cc.seq = pg->p2p_seq[2 * c->root + 1]++;
    else
        cc.seq = pg->seq++;
    cc.timeout_s = pg->timeout_s;
    uint64_t fr_id = dt__flight_post(pg, &cc);
    dt__flight_start(pg, fr_id);
    pg->busy = 1;
    pthread_mutex_unlock(&pg->mu);

    dt_status st;
    const double tw = dt_trace_now(); /* the caller is blocked for all of it */
    if (pg->ops->kinds && !(pg->ops->kinds & (1u << cc.kind))) {
        st = dt_error(DT_ERR_UNSUPPORTED, "backend '%s' does not implement %s", pg->ops->name,
                      dt_coll_kind_name(cc.kind));
    } else {
        dt_error_clear();
        st = pg->ops->run(pg->ctx, &cc);
        if (st < 0) {
            char d[160], msg[DT__MSG_CAP];
            if (dt_last_error()[0])
                snprintf(msg, sizeof msg, "%s", dt_last_error());
            else
                snprintf(msg, sizeof msg, "%s failed in backend '%s': %s",
                         dt__coll_describe(&cc, d, sizeof d), pg->ops->name, dt_status_str(st));
            if (st != DT_ERR_UNSUPPORTED)
                coll_failed(pg, st, msg, sizeof msg);
            dt_error(st, "%s", msg);
        } else {
            st = DT_OK;
        }
    }
    pthread_mutex_lock(&pg->mu);
    dt__flight_done(pg, fr_id, st);
    pg->busy = 0;
    pthread_cond_broadcast(&pg->cv);
    dt__pg_kick_locked(pg);
    pthread_mutex_unlock(&pg->mu);
    dt_trace_span(DT_TRACE_WAIT, dt_coll_kind_name(cc.kind), tw);
    return st;
}

/* Drain the whole queue (used by dt_pg_free and dt_pg_subgroup); mu held. */
void dt__pg_drain_locked(dt_pg *pg)
{
    for (;;) {
        if (pg->head == NULL && pg->bn == 0 && !pg->busy)
            return;
        if (!pg->busy)
            run_head_locked(pg, NULL);
        else
            pthread_cond_wait(&pg->cv, &pg->mu);
    }
}

dt_status dt_req_test(dt_req *req)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_req_test: NULL request");
    int st = atomic_load_explicit(&req->state, memory_order_acquire);
    if (st < 0)
        dt_error((dt_status)st, "%s", req->msg);
    return (dt_status)st;
}

dt_status dt_req_status(const dt_req *req)
{
    if (!req)
        return DT_ERR_NULL;
    return (dt_status)atomic_load_explicit(&((dt_req *)req)->state, memory_order_acquire);
}

const char *dt_req_message(const dt_req *req)
{
    if (!req)
        return "";
    if (atomic_load_explicit(&((dt_req *)req)->state, memory_order_acquire) == DT_INPROGRESS)
        return "";
    return req->msg;
}

dt_status dt_req_wait(dt_req *req, double timeout_s)
{
    if (!req)
        return dt_error(DT_ERR_NULL, "dt_req_wait: NULL request");
    dt_pg *pg = req->pg;
    struct timespec dl = {0, 0};
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &dl);
        double s = (double)dl.tv_sec + dl.tv_nsec * 1e-9 + timeout_s;
        dl.tv_sec = (time_t)s;
        dl.tv_nsec = (long)((s - (double)dl.tv_sec) * 1e9);
    }
    /* the timeline: this thread blocked on the request (not a poll) */
    const double tw = timeout_s != 0 && atomic_load_explicit(&req->state, memory_order_acquire) == DT_INPROGRESS
                          ? dt_trace_now()
                          : 0;
    const int blocked = timeout_s != 0 && atomic_load_explicit(&req->state, memory_order_acquire) == DT_INPROGRESS;
    if (blocked) /* the progress thread running it may poll now (dt__comm_may_poll) */
        atomic_fetch_add_explicit(&pg->waiting, 1, memory_order_relaxed);
    pthread_mutex_lock(&pg->mu);
    int driver = 0;
    for (;;) {
        if (atomic_load_explicit(&req->state, memory_order_acquire) != DT_INPROGRESS)
            break;
        /* Drive the queue ourselves; only for unbounded waits, since an
         * operation cannot be left half-way. The progress thread leaves
         * the queue to us and hands a batch over (woken from its nap). */
        if (timeout_s < 0 && !driver) {
            driver = 1;
            pg->drivers++;
            if (pg->busy && pg->bn > 0 && pg->ops->p2p_wake)
                pg->ops->p2p_wake(pg->ctx);
        }
        if (timeout_s < 0 && !pg->busy && (pg->head || pg->bn)) {
            run_head_locked(pg, req);
            continue;
        }
        if (timeout_s < 0) {
            pthread_cond_wait(&pg->cv, &pg->mu);
        } else if (pthread_cond_timedwait(&pg->cv, &pg->mu, &dl) != 0) {
            if (atomic_load_explicit(&req->state, memory_order_acquire) == DT_INPROGRESS) {
                pthread_mutex_unlock(&pg->mu);
                if (blocked)
                    atomic_fetch_sub_explicit(&pg->waiting, 1, memory_order_relaxed);
                return DT_INPROGRESS;
            }
        }
    }
    if (driver) {
        pg->drivers--;
        pthread_cond_broadcast(&pg->cv);
        dt__pg_kick_locked(pg); /* the progress thread takes what is left */
    }
    pthread_mutex_unlock(&pg->mu);
    if (blocked)
        atomic_fetch_sub_explicit(&pg->waiting, 1, memory_order_relaxed);
    dt_trace_span(DT_TRACE_WAIT, dt_coll_kind_name(req->c.kind), tw);
    return dt_req_test(req);
}

dt_status dt_req_wait_all(dt_req *const *reqs, int n, double timeout_s)
{
    double t0 = dt_time_s();
    dt_status first = DT_OK;
    int running = 0;
    for (int i = 0; i < n; i++) {
        if (!reqs[i])
            continue;
        double left = timeout_s;
        if (timeout_s >= 0) {
            left = timeout_s - (dt_time_s() - t0);
            if (left < 0)
                left = 0;
        }
        dt_status st = dt_req_wait(reqs[i], left);
        if (st == DT_INPROGRESS)
            running = 1;
        else if (st < 0 && first == DT_OK)
            first = st;
    }
    if (first < 0) {
        for (int i = 0; i < n; i++)
            if (reqs[i] && dt_req_status(reqs[i]) == first) {
                dt_error(first, "%s", reqs[i]->msg);
                break;
            }
        return first;
    }
    return running ? DT_INPROGRESS : DT_OK;
}

void dt_req_free(dt_req *req)
{
    if (!req)
        return;
    dt_pg *pg = req->pg;
    pthread_mutex_lock(&pg->mu);
    if (atomic_load_explicit(&req->state, memory_order_acquire) == DT_INPROGRESS) {
        req->freed = 1; /* exec_one releases it */
        pthread_mutex_unlock(&pg->mu);
        return;
    }
    pthread_mutex_unlock(&pg->mu);
    req_release(req);
}

/* Stop the progress thread after the queue is empty (dt_pg_free). */
void dt__pg_engine_stop(dt_pg *pg)
{
    pthread_mutex_lock(&pg->mu);
    dt__pg_drain_locked(pg);
    pg->stop = 1;
    pthread_cond_broadcast(&pg->cv);
    dt__pg_kick_locked(pg);
    int on = pg->thread_on;
    pthread_mutex_unlock(&pg->mu);
    if (on)
        pthread_join(pg->thread, NULL);
}
