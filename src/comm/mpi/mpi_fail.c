/* The mpi backend's failure handling (mpi_impl.h; the whole story is in
 * backend_mpi.c's overview): failure notices sent to and received from the
 * group's peers, the MPI lock of MPI_THREAD_SERIALIZED and the notices it
 * holds back, dead peers on this machine, and the waiting loop that bounds
 * every request by the group's timeout. */
#include "mpi_impl.h"

/* ---- failure notices ------------------------------------------------------
 * abort (the group layer marks the group failed on this rank) sends every
 * other rank of the group one small message (group id, status, rank,
 * message) with MPI_Isend and never waits for it. All groups share one
 * notice communicator, g_ctl (a duplicate of MPI_COMM_WORLD made with the
 * first group and never freed: a notice still in flight when its group is
 * freed must not land in a later communicator that reuses the freed one's
 * context id, which Open MPI's matching would then confuse with that
 * communicator's own messages). While any group lives, one MPI_Irecv from
 * any source is posted on g_ctl; the waiting loops test it beside their own
 * request (one thread at a time, g_note_mu) and hand a notice to the live
 * group it names (one already freed: dropped). Notices are far below every
 * eager limit, so a send completes locally whether or not (or when) the
 * peer receives it; one still incomplete when its group is freed is kept
 * (note_sends_done) and released before MPI_Finalize, which does not wait
 * for a send nobody receives. */
MPI_Comm dt__mpi_ctl = MPI_COMM_NULL;
MPI_Request dt__mpi_note_rq = MPI_REQUEST_NULL;
static mpi_note g_note_in;
static mpi_ctx *g_groups;              /* live groups */
#define NOTE_ORPHANS 8                 /* the last notices that named no live group */
static mpi_note g_orphan[NOTE_ORPHANS];
static unsigned g_norphan;
pthread_mutex_t dt__mpi_note_mu = PTHREAD_MUTEX_INITIALIZER; /* the four above */

static int peer_dead_known(int world_rank);
static void note_dead(int world_rank);

void dt__mpi_send_note(mpi_ctx *m)
{
    for (int r = 0; r < m->size; r++) {
        m->note_sends[r] = MPI_REQUEST_NULL;
        if (r == m->rank || peer_dead_known(m->world[r]))
            continue; /* a dead peer: nothing to tell */
        if (MPI_Isend(m->note_out, NOTE_HEAD + (int)strlen(m->note_out->msg) + 1, MPI_BYTE, m->world[r], NOTE_TAG,
                      dt__mpi_ctl, &m->note_sends[r]) != MPI_SUCCESS)
            m->note_sends[r] = MPI_REQUEST_NULL;
    }
}

MPI_Request dt__mpi_query_rq = MPI_REQUEST_NULL;
static mpi_query g_query_in;

/* Answer the status queries that have arrived (MPI access and g_note_mu
 * held): the block of the named group, if it lives here. */
static void query_take_locked(void)
{
    while (dt__mpi_query_rq != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Test(&dt__mpi_query_rq, &flag, &s) != MPI_SUCCESS || !flag)
            return;
        for (mpi_ctx *m = g_groups; m; m = m->reg_next)
            if (m->gid == g_query_in.gid) {
                mpi_reply rep = {.gid = m->gid, .rank = m->rank};
                dt_flight_board_read(rep.board, m->board, sizeof rep.board);
                /* small: sent eagerly, never waits for the asker */
                MPI_Send(&rep, (int)sizeof rep, MPI_BYTE, s.MPI_SOURCE, reply_tag(m->gid), dt__mpi_ctl);
                break;
            }
        if (MPI_Irecv(&g_query_in, (int)sizeof g_query_in, MPI_BYTE, MPI_ANY_SOURCE, QUERY_TAG, dt__mpi_ctl,
                      &dt__mpi_query_rq) != MPI_SUCCESS)
            dt__mpi_query_rq = MPI_REQUEST_NULL;
    }
}

/* Receive what notices have arrived and mark their groups down, and answer
 * status queries (MPI access and g_note_mu held). */
void dt__mpi_note_take_locked(void)
{
    query_take_locked();
    while (dt__mpi_note_rq != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Test(&dt__mpi_note_rq, &flag, &s) != MPI_SUCCESS || !flag)
            return;
        int n = 0;
        MPI_Get_count(&s, MPI_BYTE, &n);
        if (n > NOTE_HEAD) {
            g_note_in.msg[NOTE_MSG_CAP - 1] = '\0';
            note_dead(g_note_in.dead);
            int found = 0;
            for (mpi_ctx *m = g_groups; m; m = m->reg_next)
                if (m->gid == g_note_in.gid)
                    found = 1, dt__mpi_set_down(m, (dt_status)g_note_in.st, g_note_in.msg,
                                        g_note_in.dead >= 0 ? 0 : g_note_in.done);
            if (!found) /* freed already, or (rarely) not registered yet here */
                g_orphan[g_norphan++ % NOTE_ORPHANS] = g_note_in;
        }
        if (MPI_Irecv(&g_note_in, (int)sizeof g_note_in, MPI_BYTE, MPI_ANY_SOURCE, NOTE_TAG, dt__mpi_ctl,
                      &dt__mpi_note_rq) != MPI_SUCCESS)
            dt__mpi_note_rq = MPI_REQUEST_NULL;
    }
}

/* Enter m into the registry, posting the receive if it is the first group
 * (MPI access held). */
void dt__mpi_note_register(mpi_ctx *m)
{
    pthread_mutex_lock(&dt__mpi_note_mu);
    m->reg_next = g_groups;
    g_groups = m;
    /* a peer may have failed the group before this rank registered it */
    for (unsigned i = 0; i < NOTE_ORPHANS && i < g_norphan; i++)
        if (g_orphan[i].gid == m->gid)
            dt__mpi_set_down(m, (dt_status)g_orphan[i].st, g_orphan[i].msg, g_orphan[i].dead >= 0 ? 0 : g_orphan[i].done);
    if (dt__mpi_note_rq == MPI_REQUEST_NULL &&
        MPI_Irecv(&g_note_in, (int)sizeof g_note_in, MPI_BYTE, MPI_ANY_SOURCE, NOTE_TAG, dt__mpi_ctl, &dt__mpi_note_rq) !=
            MPI_SUCCESS)
        dt__mpi_note_rq = MPI_REQUEST_NULL;
    if (dt__mpi_query_rq == MPI_REQUEST_NULL &&
        MPI_Irecv(&g_query_in, (int)sizeof g_query_in, MPI_BYTE, MPI_ANY_SOURCE, QUERY_TAG, dt__mpi_ctl,
                  &dt__mpi_query_rq) != MPI_SUCCESS)
        dt__mpi_query_rq = MPI_REQUEST_NULL;
    pthread_mutex_unlock(&dt__mpi_note_mu);
}

/* Take m out of the registry; after the last group the receive is cancelled
 * (a local operation), so that nothing is pending at MPI_Finalize; notices
 * that arrive later wait unread on g_ctl (MPI access held). */
void dt__mpi_note_unregister(mpi_ctx *m, int finalized)
{
    pthread_mutex_lock(&dt__mpi_note_mu);
    for (mpi_ctx **p = &g_groups; *p; p = &(*p)->reg_next)
        if (*p == m) {
            *p = m->reg_next;
            break;
        }
    if (!g_groups && dt__mpi_note_rq != MPI_REQUEST_NULL && !finalized) {
        dt__mpi_note_take_locked();
        if (dt__mpi_note_rq != MPI_REQUEST_NULL) {
            MPI_Cancel(&dt__mpi_note_rq);
            MPI_Wait(&dt__mpi_note_rq, MPI_STATUS_IGNORE);
        }
        dt__mpi_note_rq = MPI_REQUEST_NULL;
    }
    if (!g_groups && dt__mpi_query_rq != MPI_REQUEST_NULL && !finalized) {
        MPI_Cancel(&dt__mpi_query_rq);
        MPI_Wait(&dt__mpi_query_rq, MPI_STATUS_IGNORE);
        dt__mpi_query_rq = MPI_REQUEST_NULL;
    }
    pthread_mutex_unlock(&dt__mpi_note_mu);
}

/* Notices abort could not send because another thread held the MPI lock
 * (MPI_THREAD_SERIALIZED only); whoever releases the lock sends them. */
mpi_ctx *dt__mpi_unsent;
_Atomic int dt__mpi_nunsent;
pthread_mutex_t dt__mpi_unsent_mu = PTHREAD_MUTEX_INITIALIZER;

static void flush_unsent(void) /* MPI lock held */
{
    pthread_mutex_lock(&dt__mpi_unsent_mu);
    while (dt__mpi_unsent) {
        mpi_ctx *m = dt__mpi_unsent;
        dt__mpi_unsent = m->unsent_next;
        m->note_queued = 0;
        atomic_fetch_sub(&dt__mpi_nunsent, 1);
        dt__mpi_send_note(m);
    }
    pthread_mutex_unlock(&dt__mpi_unsent_mu);
}

void dt__mpi_lock(void)
{
    if (!dt__mpi_thread_multiple)
        pthread_mutex_lock(&dt__mpi_mu);
}
void dt__mpi_unlock(void)
{
    if (dt__mpi_thread_multiple)
        return;
    for (;;) { /* a notice queued meanwhile goes out now, not at the next operation */
        if (atomic_load(&dt__mpi_nunsent))
            flush_unsent();
        pthread_mutex_unlock(&dt__mpi_mu);
        if (!atomic_load(&dt__mpi_nunsent) || pthread_mutex_trylock(&dt__mpi_mu) != 0)
            return;
    }
}

void dt__mpi_nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Mark the group down on this rank with (st, msg); the first call wins.
 * Returns whether this call did. */
int dt__mpi_set_down(mpi_ctx *m, dt_status st, const char *msg, uint64_t done)
{
    int first = 0;
    pthread_mutex_lock(&m->down_mu);
    if (!atomic_load_explicit(&m->down, memory_order_relaxed)) {
        m->down_st = st < 0 ? st : DT_ERR_PEER_FAILED;
        m->down_done = done;
        snprintf(m->down_msg, sizeof m->down_msg, "%s", msg);
        atomic_store_explicit(&m->down, 1, memory_order_release);
        first = 1;
    }
    pthread_mutex_unlock(&m->down_mu);
    return first;
}

/* The group's failure as this rank's error (the group must be down). */
dt_status dt__mpi_down_error(mpi_ctx *m)
{
    return dt_error(m->down_st, "%s", m->down_msg);
}

/* Whether the group is down: this rank failed it, or (poll: receive the
 * notices that have arrived; MPI access held) a peer's notice names it. A
 * peer's status and message become this rank's, as the shm backend's shared
 * abort record makes them. */
int dt__mpi_group_down(mpi_ctx *m, int poll)
{
    if (atomic_load_explicit(&m->down, memory_order_acquire))
        return 1;
    if (!poll || pthread_mutex_trylock(&dt__mpi_note_mu) != 0) /* another thread is receiving them */
        return 0;
    dt__mpi_note_take_locked();
    pthread_mutex_unlock(&dt__mpi_note_mu);
    return atomic_load_explicit(&m->down, memory_order_acquire);
}

/* ---- dead peers ------------------------------------------------------------
 * Every process's identity (dt__proc_id: machine, pid, start time) is
 * gathered over MPI_COMM_WORLD when the first group is made (g_procs,
 * indexed by world rank). The waiting loops call peer_died every few
 * milliseconds: a peer of the group on this machine whose process has ended
 * fails the group here with DT_ERR_PEER_FAILED naming it (mpi_abort: the
 * other ranks get the same status and message as a notice). */
static dt__proc_id *g_procs;
static int *g_pidfd; /* [world size]: dt__proc_gone's cached pidfds */
static _Atomic int *g_dead; /* [world size]: seen dead */
static int g_nprocs;
static _Atomic long long g_alive_ns; /* when the last check ran */
static pthread_mutex_t g_alive_mu = PTHREAD_MUTEX_INITIALIZER;

static int peer_dead_known(int w)
{
    return g_dead && w >= 0 && w < g_nprocs && atomic_load(&g_dead[w]);
}

/* World rank w died (seen here or reported by a notice): no MPI_Finalize. */
static void note_dead(int w)
{
    if (w < 0)
        return;
    atomic_store(&dt__mpi_dead_seen, 1);
    if (g_dead && w < g_nprocs)
        atomic_store(&g_dead[w], 1);
}

/* Gather the identities (collective over MPI_COMM_WORLD; MPI access held). */
void dt__mpi_procs_gather(void)
{
    int n = 0, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    dt__proc_id *all = calloc((size_t)n, sizeof *all);
    int *fd = malloc(sizeof *fd * (size_t)n);
    _Atomic int *dead = calloc((size_t)n, sizeof *dead);
    dt__proc_id self;
    dt__proc_id_self(&self);
    if (!all || !fd || !dead ||
        MPI_Allgather(&self, (int)sizeof self, MPI_BYTE, all, (int)sizeof self, MPI_BYTE, dt__mpi_ctl) != MPI_SUCCESS) {
        free(all); /* no check: a death is then found by the timeout only */
        free(fd);
        free((void *)dead);
        return;
    }
    for (int i = 0; i < n; i++)
        fd[i] = -2;
    g_pidfd = fd;
    g_dead = dead;
    g_procs = all;
    g_nprocs = n;
}

/* Whether a peer of m on this machine has died; if so the group is failed
 * here with DT_ERR_PEER_FAILED naming it (c: what this rank waited in) and
 * 1 returned. At most one check every 2 ms per process. */
int dt__mpi_peer_died(mpi_ctx *m, const dt_coll *c)
{
    if (!g_procs)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long now = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, last = atomic_load(&g_alive_ns);
    if (now - last < 2000000 || !atomic_compare_exchange_strong(&g_alive_ns, &last, now) ||
        pthread_mutex_trylock(&g_alive_mu) != 0)
        return 0;
    int me = m->world[m->rank], dead = -1;
    for (int r = 0; r < m->size && dead < 0; r++) {
        int w = m->world[r];
        if (r != m->rank && w >= 0 && w < g_nprocs &&
            (atomic_load(&g_dead[w]) || dt__proc_gone(&g_procs[me], &g_procs[w], &g_pidfd[w]))) {
            note_dead(w);
            dead = r;
        }
    }
    pthread_mutex_unlock(&g_alive_mu);
    if (dead < 0)
        return 0;
    char d[160] = "group set-up", msg[NOTE_MSG_CAP];
    if (c)
        dt__coll_describe(c, d, sizeof d);
    snprintf(msg, sizeof msg,
             "mpi backend: rank %d (pid %d, on rank %d's machine) died (exited or was killed) while rank %d was "
             "in %s; the group is failed",
             dead, (int)g_procs[m->world[dead]].pid, m->rank, m->rank, d);
    m->dead_world = m->world[dead];
    dt__mpi_abort(m, DT_ERR_PEER_FAILED, msg);
    return 1;
}

/* Whether the posted operation c must end because the group is down: not
 * when it is a collective that the rank whose notice put the group down
 * had completed (it completes here too; see colls_done). */
int dt__mpi_down_ends(mpi_ctx *m, const dt_coll *c, int poll)
{
    return dt__mpi_group_down(m, poll) && (c->kind == DT_COLL_SEND || c->kind == DT_COLL_RECV ||
                                   m->down_done <= atomic_load(&m->colls_done));
}

/* Complete a posted request within the operation's timeout, or until the
 * group is down (a peer's notice, or this rank failed it): then the request
 * is left incomplete (MPI cannot cancel a collective) and the group's
 * failure is returned. Under MPI_THREAD_SERIALIZED the MPI lock is released
 * while napping, so that abort and other groups can reach MPI. */
/* Test hook (tests/comm/mpi_note_overtake.c): DT_FAULT_MPI_LATE_RANK=R and
 * DT_FAULT_MPI_LATE_SEQ=S make world rank R treat its all-reduce #S (any
 * group) as not yet complete until the group is down (or for 10 s), as a
 * rank that a failure notice reaches before it has seen its last
 * collective complete. */
static int64_t g_late_rank = -2, g_late_seq = -1;
/* Test hook (tests/comm/tests.cmake, comm/mpi_flight_np3):
 * DT_FAULT_MPI_TEST_NAP_US=N naps N us after each test of the spinning
 * phase, as a loaded machine's MPI_Test that yields the CPU each time. */
static int64_t g_test_nap_us = -1;

static int late_look(mpi_ctx *m, const dt_coll *c, double t0)
{
    if (g_late_rank == -2 && (dt_env_int("DT_FAULT_MPI_LATE_RANK", -1, -1, INT32_MAX, &g_late_rank) < 0 ||
                              dt_env_int("DT_FAULT_MPI_LATE_SEQ", -1, -1, INT64_MAX, &g_late_seq) < 0))
        g_late_rank = -1;
    return g_late_rank >= 0 && m->world[m->rank] == g_late_rank && c->kind == DT_COLL_ALLREDUCE &&
           (int64_t)c->seq == g_late_seq && !dt__mpi_group_down(m, 1) && dt_time_s() - t0 < 10.0;
}

dt_status dt__mpi_wait_req(mpi_ctx *m, MPI_Request *rq, const dt_coll *c, MPI_Status *st)
{
    if (g_test_nap_us < 0 && dt_env_int("DT_FAULT_MPI_TEST_NAP_US", 0, 0, 999999, &g_test_nap_us) < 0)
        g_test_nap_us = 0;
    double t0 = 0, tl = dt_time_s();
    for (unsigned long spins = 0;; spins++) {
        int flag = 0;
        int rc = MPI_Test(rq, &flag, st ? st : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return dt__mpi_err(rc, "MPI_Test", c);
        if (flag && !late_look(m, c, tl))
            return DT_OK;
        if (dt__mpi_down_ends(m, c, spins % 64 == 0 || t0 != 0)) {
            m->abandoned = 1;
            return dt__mpi_down_error(m);
        }
        if (flag) { /* the test hook: complete, seen as not yet */
            dt__mpi_unlock();
            dt__mpi_nap(1000000);
            dt__mpi_lock();
            continue;
        }
        /* Spinning first: 2000 tests or 2 ms, whichever ends first (on a
         * loaded machine 2000 tests can take seconds: Open MPI yields the
         * CPU in each when the job is oversubscribed). The timeout counts
         * from the wait's start (tl), the naps' back-off from the end of
         * the spinning (t0). */
        if (t0 == 0) {
            if (g_test_nap_us > 0)
                dt__mpi_nap(g_test_nap_us * 1000);
            if (spins < 2000 && (spins % 64 || dt_time_s() - tl < 0.002))
                continue;
            t0 = dt_time_s();
        }
        double now = dt_time_s();
        if (dt__mpi_peer_died(m, c)) {
            m->abandoned = 1;
            return dt__mpi_down_error(m);
        }
        if (c->timeout_s > 0 && now - tl > c->timeout_s) {
            char d[160];
            m->failed = 1;
            m->abandoned = 1;
            dt__mpi_abandon(*rq);
            return dt_error(DT_ERR_TIMEOUT,
                            "mpi backend: %s timed out after %.3g s on rank %d of %d (the group is now "
                            "unusable)",
                            dt__coll_describe(c, d, sizeof d), c->timeout_s, m->rank, m->size);
        }
        if (now - t0 >= 0.002 || !dt__cpu_yield(&m->yield_off_until)) {
            dt__mpi_unlock();
            dt__mpi_nap(now - t0 < 0.1 ? 20000 : 200000);
            dt__mpi_lock();
        }
    }
}
