/* The `mpi` backend: dtrain collectives on an MPI communicator.
 *
 * This is the engine for ranks across machines (mpirun, srun). It is built
 * only when CMake finds MPI (files named *_mpi.c are filtered otherwise) and
 * is registered as "mpi"; the group layer chooses it by default when the
 * ranks came from Open MPI / PMI / Slurm variables.
 *
 * Each operation is posted as a nonblocking MPI collective (MPI_Iallreduce,
 * MPI_Ireduce_scatter_block, ...) and then polled with MPI_Test, so that the
 * group's per-operation timeout holds: a collective that does not complete
 * in c->timeout_s fails with DT_ERR_TIMEOUT. MPI cannot cancel a posted
 * collective, so after a timeout the group is unusable (the group layer
 * marks it failed anyway) and its buffers may still be written by MPI: end
 * the job. The waiting loop spins on MPI_Test briefly, then yields, then
 * sleeps in short naps, so that 8 ranks on 2 cores still make progress.
 * $DT_MPI_BLOCKING=1 uses the blocking calls instead (sometimes faster
 * because Open MPI's tuned blocking algorithms differ from libnbc's); with
 * MPI_THREAD_MULTIPLE they run on a worker thread of the group while the
 * caller waits under the timeout (see run_on_worker), so they too time out
 * and are interrupted by a peer's failure notice. MPI_Init (on a helper
 * thread) and a subgroup's creation (a nonblocking barrier first) are
 * bounded by the timeout as well. After a timeout the rank asks its peers
 * point to point for their flight recorder status (see "status queries"):
 * the error names the ranks that did not answer.
 *
 * Reductions: MPI's own for f32, f64, i32, i64, u8; avg = sum, then divide.
 * f16 and bf16 travel as 16 bits (an all-to-all, a local f32 reduction
 * rounded once: the "f32 accumulation" promise, and an all-gather; see
 * run_reduction_half), so 16-bit gradient compression halves the bytes.
 *
 * Mismatch check (info->check): before each collective the ranks allreduce
 * (MAX) a fingerprint of (kind, count, dtype, op, root, counts) together with
 * its complement; a difference on any rank shows up on every rank, which then
 * gathers all descriptions and fails with DT_ERR_MISMATCH naming both sides.
 * This costs one small allreduce per collective.
 *
 * Failures: when the group layer marks a group failed on this rank (an
 * operation failed here, or dt__pg_fail: the pipeline breaking off its
 * schedule), abort sends each other rank of the group a notice (status and
 * message; see "failure notices" below); their waiting loops (collectives
 * and send/recv) poll for notices beside their own request, so their
 * pending and later operations on that group fail within milliseconds with
 * the same status and message as on this rank, as the shm backend's abort
 * record makes them, not at the timeout. Two limits: a blocking collective
 * (DT_MPI_BLOCKING=1) cannot be interrupted once inside MPI when MPI gives
 * only MPI_THREAD_SERIALIZED (a notice that arrived before keeps it from
 * starting; send/recv are always nonblocking),
 * and an operation left by a failure cannot be cancelled if it is a
 * collective or a send: its communicator is then never freed, and MPI may
 * still read or write its buffers (as after a timeout). A dead rank is not
 * noticed by this backend: by default Open MPI's mpirun kills the whole job
 * when one rank dies, so peers end rather than hang; this backend does not
 * report DT_ERR_PEER_FAILED for it. Errors from MPI calls come back as
 * values (the communicator uses MPI_ERRORS_RETURN) and carry MPI's error
 * string.
 *
 * MPI is initialised with MPI_THREAD_MULTIPLE when available (each group's
 * progress thread calls MPI, and groups run concurrently), at least
 * MPI_THREAD_SERIALIZED (then a process-wide lock serialises the groups) unless
 * the program initialised it already; MPI_Finalize then runs at exit.
 *
 * Ending the job after a timeout: a collective abandoned by a timeout may
 * never complete (a rank stopped), and MPI_Finalize (a collective over the
 * world) would then block for ever waiting for the rank that stopped. So when a request this
 * process abandoned is still incomplete at exit (after up to 1 s more: a
 * late peer may have completed it), the exit handler calls MPI_Abort on
 * MPI_COMM_WORLD instead: mpirun/srun then kill every rank (a stopped one
 * included) and the job ends right after the rank that saw the timeout
 * exits. A program that initialised MPI itself must do the same: after a
 * DT_ERR_TIMEOUT from this backend, call MPI_Abort, not MPI_Finalize.
 * Requests left because of a failure notice do not count: the rank that
 * sent it is alive, and MPI_Finalize does not wait for incomplete requests
 * when every rank reaches it (Open MPI 4.1.4), so a program that catches
 * the error, saves a checkpoint and exits ends normally. */
#include "comm/backend.h"
#include "dtrain/kernels.h"

#include <mpi.h>
#include <pthread.h>
#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A failure notice: rank `rank` of group `gid` failed it (status, message). */
#define NOTE_TAG 1
#define NOTE_MSG_CAP 768
typedef struct {
    uint64_t gid;
    int32_t st, rank;
    char msg[NOTE_MSG_CAP];
} mpi_note;
#define NOTE_HEAD ((int)offsetof(mpi_note, msg))

/* Status queries of the flight recorder: a rank that timed out asks every
 * peer for its status block in the group gid (QUERY_TAG); the answer comes
 * back with tag reply_tag(gid). */
#define QUERY_TAG 2
#define FLIGHT_BYTES 256
typedef struct {
    uint64_t gid;
    int32_t rank;
    int32_t pad;
} mpi_query;
typedef struct {
    uint64_t gid;
    int32_t rank, pad;
    unsigned char board[FLIGHT_BYTES];
} mpi_reply;
static int reply_tag(uint64_t gid) { return 1000 + (int)(gid % 30000u); }

typedef struct mpi_ctx {
    MPI_Comm comm;
    int rank, size;
    int check;
    int blocking;
    double timeout_s;  /* the group's timeout (its creation's subgroups) */
    int failed;        /* a posted MPI request was abandoned (timeout) */
    int abandoned;     /* a request on comm was left incomplete: comm is not freed */
    /* The group is down on this rank: a peer's notice arrived, or this rank
     * failed the group (abort). down_st/down_msg are written once, before
     * down is set (release). */
    _Atomic int down;
    dt_status down_st;
    char down_msg[NOTE_MSG_CAP];
    pthread_mutex_t down_mu;
    uint64_t gid;      /* the group's id, the same on its ranks (notices name it) */
    int *world;        /* [size]: each rank's rank in MPI_COMM_WORLD (notices go there) */
    struct mpi_ctx *reg_next; /* the registry of live groups (g_note_mu) */
    /* This rank's own notice: sent by abort, or, under MPI_THREAD_SERIALIZED
     * when another thread holds the MPI lock, by the next thread to release
     * it (the unsent list). note_out and note_sends outlive the group when
     * a send is still incomplete at free (see note_sends_done). */
    mpi_note *note_out;
    MPI_Request *note_sends; /* [size] */
    int note_queued;         /* on the unsent list (g_unsent_mu) */
    struct mpi_ctx *unsent_next;
    /* The flight recorder's status block of this rank (flight_board),
     * served to peers that ask (see "status queries"). */
    unsigned char board[FLIGHT_BYTES];
    uint64_t *chk;           /* [2]: the collective check's buffer (see check_same) */
    struct mpi_worker *worker; /* DT_MPI_BLOCKING=1: runs the blocking calls (run_on_worker) */
    int stuck;               /* the worker never came back: m is never freed */
} mpi_ctx;

static int we_initialised;
/* Requests abandoned by a timeout (kept to see at exit whether they
 * completed after all); more than fit counts as one that never will. */
#define MPI_MAX_ABANDONED 16
static MPI_Request g_abandoned_rq[MPI_MAX_ABANDONED];
static int g_nabandoned;
static pthread_mutex_t g_abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_stuck; /* a blocking call's worker never came back from MPI: abort at exit */

static void abandon(MPI_Request rq)
{
    pthread_mutex_lock(&g_abandoned_mu);
    if (g_nabandoned < MPI_MAX_ABANDONED)
        g_abandoned_rq[g_nabandoned] = rq;
    g_nabandoned++;
    pthread_mutex_unlock(&g_abandoned_mu);
}

/* Whether every abandoned request completed (a late peer arrived), waiting
 * up to wait_s for them: then MPI_Finalize can complete. */
static int abandoned_all_done(double wait_s)
{
    if (g_nabandoned > MPI_MAX_ABANDONED)
        return 0;
    double t0 = dt_time_s();
    for (;;) {
        int pending = 0;
        for (int i = 0; i < g_nabandoned; i++) {
            int flag = 1;
            if (g_abandoned_rq[i] != MPI_REQUEST_NULL &&
                MPI_Test(&g_abandoned_rq[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                return 0;
            pending += !flag;
        }
        if (!pending)
            return 1;
        if (dt_time_s() - t0 > wait_s)
            return 0;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}
/* Several groups (dt_pg_split, dt_pg_dup) have their own progress threads
 * and may call MPI at the same time. With MPI_THREAD_MULTIPLE (asked for
 * when dtrain initialises MPI) that is allowed; below it, one process-wide
 * lock serialises MPI calls: an operation holds it from its start to its
 * end except while its waiting loop naps (after ~2 ms), and a blocking
 * call (DT_MPI_BLOCKING=1) holds it throughout, so groups overlap only in
 * those naps (an operation on one group that needs another group's to
 * finish first on a peer may wait for the timeout). */
static int thread_multiple;
static pthread_mutex_t mpi_mu = PTHREAD_MUTEX_INITIALIZER;

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
static MPI_Comm g_ctl = MPI_COMM_NULL;
static MPI_Request g_note_rq = MPI_REQUEST_NULL;
static mpi_note g_note_in;
static mpi_ctx *g_groups;              /* live groups */
#define NOTE_ORPHANS 8                 /* the last notices that named no live group */
static mpi_note g_orphan[NOTE_ORPHANS];
static unsigned g_norphan;
static pthread_mutex_t g_note_mu = PTHREAD_MUTEX_INITIALIZER; /* the four above */
static int set_down(mpi_ctx *m, dt_status st, const char *msg);

static void send_note(mpi_ctx *m)
{
    for (int r = 0; r < m->size; r++)
        if (r != m->rank && MPI_Isend(m->note_out, NOTE_HEAD + (int)strlen(m->note_out->msg) + 1, MPI_BYTE,
                                      m->world[r], NOTE_TAG, g_ctl, &m->note_sends[r]) != MPI_SUCCESS)
            m->note_sends[r] = MPI_REQUEST_NULL; /* a dead peer: nothing to tell */
}

static MPI_Request g_query_rq = MPI_REQUEST_NULL;
static mpi_query g_query_in;

/* Answer the status queries that have arrived (MPI access and g_note_mu
 * held): the block of the named group, if it lives here. */
static void query_take_locked(void)
{
    while (g_query_rq != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Test(&g_query_rq, &flag, &s) != MPI_SUCCESS || !flag)
            return;
        for (mpi_ctx *m = g_groups; m; m = m->reg_next)
            if (m->gid == g_query_in.gid) {
                mpi_reply rep = {.gid = m->gid, .rank = m->rank};
                dt_flight_board_read(rep.board, m->board, sizeof rep.board);
                /* small: sent eagerly, never waits for the asker */
                MPI_Send(&rep, (int)sizeof rep, MPI_BYTE, s.MPI_SOURCE, reply_tag(m->gid), g_ctl);
                break;
            }
        if (MPI_Irecv(&g_query_in, (int)sizeof g_query_in, MPI_BYTE, MPI_ANY_SOURCE, QUERY_TAG, g_ctl,
                      &g_query_rq) != MPI_SUCCESS)
            g_query_rq = MPI_REQUEST_NULL;
    }
}

/* Receive what notices have arrived and mark their groups down, and answer
 * status queries (MPI access and g_note_mu held). */
static void note_take_locked(void)
{
    query_take_locked();
    while (g_note_rq != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status s;
        if (MPI_Test(&g_note_rq, &flag, &s) != MPI_SUCCESS || !flag)
            return;
        int n = 0;
        MPI_Get_count(&s, MPI_BYTE, &n);
        if (n > NOTE_HEAD) {
            g_note_in.msg[NOTE_MSG_CAP - 1] = '\0';
            int found = 0;
            for (mpi_ctx *m = g_groups; m; m = m->reg_next)
                if (m->gid == g_note_in.gid)
                    found = 1, set_down(m, (dt_status)g_note_in.st, g_note_in.msg);
            if (!found) /* freed already, or (rarely) not registered yet here */
                g_orphan[g_norphan++ % NOTE_ORPHANS] = g_note_in;
        }
        if (MPI_Irecv(&g_note_in, (int)sizeof g_note_in, MPI_BYTE, MPI_ANY_SOURCE, NOTE_TAG, g_ctl,
                      &g_note_rq) != MPI_SUCCESS)
            g_note_rq = MPI_REQUEST_NULL;
    }
}

/* Enter m into the registry, posting the receive if it is the first group
 * (MPI access held). */
static void note_register(mpi_ctx *m)
{
    pthread_mutex_lock(&g_note_mu);
    m->reg_next = g_groups;
    g_groups = m;
    /* a peer may have failed the group before this rank registered it */
    for (unsigned i = 0; i < NOTE_ORPHANS && i < g_norphan; i++)
        if (g_orphan[i].gid == m->gid)
            set_down(m, (dt_status)g_orphan[i].st, g_orphan[i].msg);
    if (g_note_rq == MPI_REQUEST_NULL &&
        MPI_Irecv(&g_note_in, (int)sizeof g_note_in, MPI_BYTE, MPI_ANY_SOURCE, NOTE_TAG, g_ctl, &g_note_rq) !=
            MPI_SUCCESS)
        g_note_rq = MPI_REQUEST_NULL;
    if (g_query_rq == MPI_REQUEST_NULL &&
        MPI_Irecv(&g_query_in, (int)sizeof g_query_in, MPI_BYTE, MPI_ANY_SOURCE, QUERY_TAG, g_ctl,
                  &g_query_rq) != MPI_SUCCESS)
        g_query_rq = MPI_REQUEST_NULL;
    pthread_mutex_unlock(&g_note_mu);
}

/* Take m out of the registry; after the last group the receive is cancelled
 * (a local operation), so that nothing is pending at MPI_Finalize; notices
 * that arrive later wait unread on g_ctl (MPI access held). */
static void note_unregister(mpi_ctx *m, int finalized)
{
    pthread_mutex_lock(&g_note_mu);
    for (mpi_ctx **p = &g_groups; *p; p = &(*p)->reg_next)
        if (*p == m) {
            *p = m->reg_next;
            break;
        }
    if (!g_groups && g_note_rq != MPI_REQUEST_NULL && !finalized) {
        note_take_locked();
        if (g_note_rq != MPI_REQUEST_NULL) {
            MPI_Cancel(&g_note_rq);
            MPI_Wait(&g_note_rq, MPI_STATUS_IGNORE);
        }
        g_note_rq = MPI_REQUEST_NULL;
    }
    if (!g_groups && g_query_rq != MPI_REQUEST_NULL && !finalized) {
        MPI_Cancel(&g_query_rq);
        MPI_Wait(&g_query_rq, MPI_STATUS_IGNORE);
        g_query_rq = MPI_REQUEST_NULL;
    }
    pthread_mutex_unlock(&g_note_mu);
}

/* Notices abort could not send because another thread held the MPI lock
 * (MPI_THREAD_SERIALIZED only); whoever releases the lock sends them. */
static mpi_ctx *g_unsent;
static _Atomic int g_nunsent;
static pthread_mutex_t g_unsent_mu = PTHREAD_MUTEX_INITIALIZER;

static void flush_unsent(void) /* MPI lock held */
{
    pthread_mutex_lock(&g_unsent_mu);
    while (g_unsent) {
        mpi_ctx *m = g_unsent;
        g_unsent = m->unsent_next;
        m->note_queued = 0;
        atomic_fetch_sub(&g_nunsent, 1);
        send_note(m);
    }
    pthread_mutex_unlock(&g_unsent_mu);
}

static void mpi_lock(void)
{
    if (!thread_multiple)
        pthread_mutex_lock(&mpi_mu);
}
static void mpi_unlock(void)
{
    if (thread_multiple)
        return;
    for (;;) { /* a notice queued meanwhile goes out now, not at the next operation */
        if (atomic_load(&g_nunsent))
            flush_unsent();
        pthread_mutex_unlock(&mpi_mu);
        if (!atomic_load(&g_nunsent) || pthread_mutex_trylock(&mpi_mu) != 0)
            return;
    }
}

/* Notice sends still incomplete when their group was freed, with their
 * buffers (MPI may still read them). */
typedef struct leftover {
    MPI_Request *rq;
    int n;
    mpi_note *buf;
    struct leftover *next;
} leftover;
static leftover *g_leftover;
static pthread_mutex_t g_leftover_mu = PTHREAD_MUTEX_INITIALIZER;

/* Whether every send of m's notice completed (MPI access held); if not,
 * the sends and the buffer move to the leftover list (1 returned either
 * way only when nothing is left). */
static int note_sends_done(mpi_ctx *m)
{
    if (!m->note_sends)
        return 1;
    int done = 0;
    if (MPI_Testall(m->size, m->note_sends, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && done) {
        free(m->note_sends);
        m->note_sends = NULL;
        return 1;
    }
    leftover *l = malloc(sizeof *l);
    if (!l) { /* cannot keep them: let MPI finish them on its own */
        for (int r = 0; r < m->size; r++)
            if (m->note_sends[r] != MPI_REQUEST_NULL)
                MPI_Request_free(&m->note_sends[r]);
        free(m->note_sends);
        m->note_sends = NULL;
        m->note_out = NULL; /* MPI may still read it: never freed */
        return 0;
    }
    *l = (leftover){m->note_sends, m->size, m->note_out, NULL};
    pthread_mutex_lock(&g_leftover_mu);
    l->next = g_leftover;
    g_leftover = l;
    pthread_mutex_unlock(&g_leftover_mu);
    m->note_sends = NULL;
    m->note_out = NULL;
    return 0;
}

/* At exit, before MPI_Finalize: give leftover notice sends up to wait_s to
 * complete, then free them (MPI completes them on its own, or drops them at
 * MPI_Finalize; their buffers stay allocated). */
static void leftover_release(double wait_s)
{
    double t0 = dt_time_s();
    for (leftover *l = g_leftover; l; l = l->next) {
        int done = 0;
        while (MPI_Testall(l->n, l->rq, &done, MPI_STATUSES_IGNORE) == MPI_SUCCESS && !done &&
               dt_time_s() - t0 < wait_s) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        for (int r = 0; r < l->n; r++)
            if (l->rq[r] != MPI_REQUEST_NULL)
                MPI_Request_free(&l->rq[r]);
    }
}

static void finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin)
        return;
    leftover_release(1.0);
    if (g_note_rq != MPI_REQUEST_NULL) { /* groups left unfreed: their notice receive */
        MPI_Cancel(&g_note_rq);
        MPI_Wait(&g_note_rq, MPI_STATUS_IGNORE);
    }
    if (g_query_rq != MPI_REQUEST_NULL) {
        MPI_Cancel(&g_query_rq);
        MPI_Wait(&g_query_rq, MPI_STATUS_IGNORE);
    }
    if (g_stuck || (g_nabandoned && !abandoned_all_done(1.0))) {
        fprintf(stderr, "mpi backend: a collective abandoned after a timeout never completed; "
                        "aborting the job (MPI_Finalize would wait for ever)\n");
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return;
    }
    MPI_Finalize();
}

static dt_status mpi_err(int code, const char *what, const dt_coll *c)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, s, &len);
    char d[160] = "";
    if (c)
        dt__coll_describe(c, d, sizeof d);
    return dt_error(DT_ERR_IO, "mpi backend: %s failed%s%s: %s", what, c ? " in " : "", d, s);
}

static MPI_Datatype mpi_type(dt_dtype dt)
{
    switch (dt) {
    case DT_F32: return MPI_FLOAT;
    case DT_F64: return MPI_DOUBLE;
    case DT_F16:
    case DT_BF16: return MPI_UINT16_T; /* moved as bits; reduced via f32 */
    case DT_I32: return MPI_INT32_T;
    case DT_I64: return MPI_INT64_T;
    case DT_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(dt_reduce_op op)
{
    switch (op) {
    case DT_REDUCE_SUM:
    case DT_REDUCE_AVG: return MPI_SUM;
    case DT_REDUCE_MAX: return MPI_MAX;
    case DT_REDUCE_MIN: return MPI_MIN;
    case DT_REDUCE_PROD: return MPI_PROD;
    default: return MPI_OP_NULL;
    }
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Mark the group down on this rank with (st, msg); the first call wins.
 * Returns whether this call did. */
static int set_down(mpi_ctx *m, dt_status st, const char *msg)
{
    int first = 0;
    pthread_mutex_lock(&m->down_mu);
    if (!atomic_load_explicit(&m->down, memory_order_relaxed)) {
        m->down_st = st < 0 ? st : DT_ERR_PEER_FAILED;
        snprintf(m->down_msg, sizeof m->down_msg, "%s", msg);
        atomic_store_explicit(&m->down, 1, memory_order_release);
        first = 1;
    }
    pthread_mutex_unlock(&m->down_mu);
    return first;
}

/* The group's failure as this rank's error (the group must be down). */
static dt_status down_error(mpi_ctx *m)
{
    return dt_error(m->down_st, "%s", m->down_msg);
}

/* Whether the group is down: this rank failed it, or (poll: receive the
 * notices that have arrived; MPI access held) a peer's notice names it. A
 * peer's status and message become this rank's, as the shm backend's shared
 * abort record makes them. */
static int group_down(mpi_ctx *m, int poll)
{
    if (atomic_load_explicit(&m->down, memory_order_acquire))
        return 1;
    if (!poll || pthread_mutex_trylock(&g_note_mu) != 0) /* another thread is receiving them */
        return 0;
    note_take_locked();
    pthread_mutex_unlock(&g_note_mu);
    return atomic_load_explicit(&m->down, memory_order_acquire);
}

/* Complete a posted request within the operation's timeout, or until the
 * group is down (a peer's notice, or this rank failed it): then the request
 * is left incomplete (MPI cannot cancel a collective) and the group's
 * failure is returned. Under MPI_THREAD_SERIALIZED the MPI lock is released
 * while napping, so that abort and other groups can reach MPI. */
static dt_status wait_req(mpi_ctx *m, MPI_Request *rq, const dt_coll *c, MPI_Status *st)
{
    double t0 = 0;
    for (unsigned long spins = 0;; spins++) {
        int flag = 0;
        int rc = MPI_Test(rq, &flag, st ? st : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_err(rc, "MPI_Test", c);
        if (flag)
            return DT_OK;
        if (group_down(m, spins % 64 == 0 || spins >= 2000)) {
            m->abandoned = 1;
            return down_error(m);
        }
        if (spins < 2000)
            continue;
        double now = dt_time_s();
        if (t0 == 0)
            t0 = now;
        if (c->timeout_s > 0 && now - t0 > c->timeout_s) {
            char d[160];
            m->failed = 1;
            m->abandoned = 1;
            abandon(*rq);
            return dt_error(DT_ERR_TIMEOUT,
                            "mpi backend: %s timed out after %.3g s on rank %d of %d (the group is now "
                            "unusable)",
                            dt__coll_describe(c, d, sizeof d), c->timeout_s, m->rank, m->size);
        }
        if (now - t0 < 0.002) {
            sched_yield();
        } else {
            mpi_unlock();
            nap(now - t0 < 0.1 ? 20000 : 200000);
            mpi_lock();
        }
    }
}

/* ---- fingerprint check ---------------------------------------------- */

typedef struct {
    int64_t kind, count, dtype, op, root, counts_hash;
} coll_desc;

static void describe_desc(const coll_desc *d, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s(count=%lld, %s", dt_coll_kind_name((dt_coll_kind)d->kind),
                     (long long)d->count, dt_dtype_name((dt_dtype)d->dtype));
    if (k > 0 && (size_t)k < n && d->op >= 0)
        k += snprintf(buf + k, n - (size_t)k, ", %s", dt_reduce_op_name((dt_reduce_op)d->op));
    if (k > 0 && (size_t)k < n && d->root >= 0)
        k += snprintf(buf + k, n - (size_t)k, ", root=%lld", (long long)d->root);
    if (k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ")");
}

static dt_status check_same(mpi_ctx *m, const dt_coll *c)
{
    coll_desc me = {c->kind, (int64_t)c->count, c->dtype, -1, -1, 0};
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE_SCATTER: me.op = c->op; break;
    case DT_COLL_REDUCE: me.op = c->op; me.root = c->root; break;
    case DT_COLL_BROADCAST:
    case DT_COLL_GATHER:
    case DT_COLL_SCATTER: me.root = c->root; break;
    case DT_COLL_ALLGATHERV:
        me.count = 0;
        me.counts_hash = (int64_t)dt_hash64(c->counts, sizeof(size_t) * (size_t)m->size, 0);
        break;
    case DT_COLL_BARRIER: me.count = 0; me.dtype = 0; break;
    default: break;
    }
    uint64_t fp = dt_hash64(&me, sizeof me, 0x6d7069);
    /* in the context, not on the stack: a request abandoned by a timeout
     * may still be completed by a late rank and write it (mpi_free keeps it
     * then) */
    uint64_t *v = m->chk;
    v[0] = fp;
    v[1] = ~fp;
    MPI_Request rq;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, m->comm, &rq);
    if (rc != MPI_SUCCESS)
        return mpi_err(rc, "MPI_Iallreduce (collective check)", c);
    dt_status st = wait_req(m, &rq, c, NULL);
    if (st < 0)
        return st;
    if (v[0] == fp && v[1] == ~fp)
        return DT_OK;
    /* Somebody differs: collect every rank's description and name one
     * rank that disagrees with this one (or with rank 0). */
    coll_desc *all = malloc(sizeof *all * (size_t)m->size);
    if (!all)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: collective check");
    rc = MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, m->comm, &rq);
    if (rc != MPI_SUCCESS) {
        free(all);
        return mpi_err(rc, "MPI_Iallgather (collective check)", c);
    }
    st = wait_req(m, &rq, c, NULL);
    if (st < 0) {
        free(all);
        return st;
    }
    int other = -1;
    for (int r = 0; r < m->size && other < 0; r++)
        if (memcmp(&all[r], &me, sizeof me))
            other = r;
    char a[160], b[160];
    describe_desc(&me, a, sizeof a);
    if (other < 0)
        other = 0;
    describe_desc(&all[other], b, sizeof b);
    free(all);
    return dt_error(DT_ERR_MISMATCH,
                    "mpi backend: collective #%llu differs between ranks: rank %d posted %s, "
                    "rank %d posted %s",
                    (unsigned long long)c->seq, m->rank, a, other, b);
}

/* ---- the operations ------------------------------------------------------ */

static int fits_int(size_t n)
{
    return n <= (size_t)INT_MAX;
}

/* In-place all-reduces of at least this many bytes on 4 or more ranks run
 * out of place from a copy (libnbc's choice, see run_reduction). */
#define INPLACE_COPY_BYTES 65536

/* Reductions (allreduce, reduce, reduce_scatter) on dtypes MPI can reduce. */
static dt_status run_reduction(mpi_ctx *m, const dt_coll *c, const void *send, void *recv,
                               MPI_Datatype t)
{
    MPI_Op op = mpi_op(c->op);
    size_t es = dt_dtype_size(c->dtype);
    MPI_Request rq;
    int rc = MPI_SUCCESS;
    if (c->kind == DT_COLL_ALLREDUCE || c->kind == DT_COLL_REDUCE) {
        int is_root = c->kind == DT_COLL_ALLREDUCE || c->root == m->rank;
        /* Chunks of at most INT_MAX elements (MPI counts are int). */
        for (size_t off = 0; off < c->count || off == 0; off += (size_t)INT_MAX) {
            size_t n = c->count - off < (size_t)INT_MAX ? c->count - off : (size_t)INT_MAX;
            const char *s = (const char *)send + off * es;
            char *r = recv ? (char *)recv + off * es : NULL;
            const void *sb = (is_root && r == s) ? MPI_IN_PLACE : (const void *)s;
            void *copy = NULL;
            if (c->kind == DT_COLL_ALLREDUCE && !m->blocking && sb == MPI_IN_PLACE &&
                m->size >= 4 && n * es >= INPLACE_COPY_BYTES && (copy = malloc(n * es))) {
                /* Open MPI's libnbc runs an in-place MPI_Iallreduce as a
                 * binomial reduce + broadcast (its ring and reduce-scatter/
                 * all-gather need a separate input): across nodes that sends
                 * twice the data out of the root's node, one direction at a
                 * time. A copy of the input takes the out-of-place algorithm. */
                dt__copy(copy, r, n * es);
                sb = copy;
            }
            if (c->kind == DT_COLL_ALLREDUCE) {
                if (m->blocking)
                    rc = MPI_Allreduce(sb, r, (int)n, t, op, m->comm);
                else
                    rc = MPI_Iallreduce(sb, r, (int)n, t, op, m->comm, &rq);
            } else {
                if (m->blocking)
                    rc = MPI_Reduce(sb, r, (int)n, t, op, c->root, m->comm);
                else
                    rc = MPI_Ireduce(sb, r, (int)n, t, op, c->root, m->comm, &rq);
            }
            if (rc != MPI_SUCCESS) {
                free(copy);
                return mpi_err(rc, c->kind == DT_COLL_ALLREDUCE ? "MPI_Iallreduce" : "MPI_Ireduce", c);
            }
            if (!m->blocking) {
                dt_status st = wait_req(m, &rq, c, NULL);
                if (st == DT_OK) /* else MPI may still read it (abandoned): leave it */
                    free(copy);
                if (st < 0)
                    return st;
            }
            if (c->count == 0)
                break;
        }
        return DT_OK;
    }
    /* reduce_scatter: MPI's in-place form (input in recv, result at its
     * start) is not NCCL's (recv = send + rank*count), so an aliased output
     * goes through a temporary. */
    if (!fits_int(c->count))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: reduce_scatter of %zu elements per rank "
                                            "exceeds MPI's int count", c->count);
    void *out = recv;
    void *tmp = NULL;
    if (c->in_place || (const char *)send + (size_t)m->rank * c->count * es == (char *)recv) {
        tmp = dt_alloc(c->count * es + 1);
        if (!tmp)
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: reduce_scatter temporary");
        out = tmp;
    }
    if (m->blocking)
        rc = MPI_Reduce_scatter_block(send, out, (int)c->count, t, op, m->comm);
    else
        rc = MPI_Ireduce_scatter_block(send, out, (int)c->count, t, op, m->comm, &rq);
    dt_status st = rc == MPI_SUCCESS ? DT_OK : mpi_err(rc, "MPI_Ireduce_scatter_block", c);
    if (st == DT_OK && !m->blocking)
        st = wait_req(m, &rq, c, NULL);
    if (st == DT_OK && tmp)
        memcpy(recv, tmp, c->count * es);
    dt_free(tmp);
    return st;
}

/* ---- f16 / bf16 reductions with 16-bit payloads -------------------------
 *
 * MPI cannot add 16-bit floats, and a user op would round at every step
 * of MPI's algorithm. So the reduction is done as a reduce-scatter made of
 * an all-to-all plus a local reduction, followed by an all-gather:
 *   1. the n elements are split into W chunks (the first n % W one longer);
 *      MPI_Ialltoallv deals rank r chunk r of every rank's input, as the
 *      16-bit values themselves;
 *   2. rank r combines its chunk's W contributions in rank order in f32
 *      (dt__reduce: the average divided by W, one rounding to 16 bits);
 *   3. all-reduce: MPI_Iallgatherv of the 16-bit chunks; reduce: MPI_Igatherv
 *      to the root; reduce-scatter: nothing (the chunk is the rank's block).
 * Bytes each rank sends for an all-reduce: 2 (W-1)/W n x 2 bytes, those of a
 * ring all-reduce on 16-bit data (the f32 widening this replaced sent twice
 * as many). Bits: sources in rank order, accumulated in f32 and rounded once,
 * as the shm backend's direct all-reduce (its ring rounds at every step). An
 * all-reduce or reduce of more than 2^30 elements runs in 2^30-element
 * pieces (MPI counts and displacements are int). */

/* Post (or run, blocking) one MPI collective and complete it. */
#define MPI_DO(m, c, what, blocking_call, nonblocking_call)                                        \
    do {                                                                                           \
        MPI_Request rq_;                                                                           \
        int rc_ = (m)->blocking ? (blocking_call) : (nonblocking_call);                            \
        if (rc_ != MPI_SUCCESS)                                                                    \
            return mpi_err(rc_, what, c);                                                          \
        if (!(m)->blocking) {                                                                      \
            dt_status st_ = wait_req((m), &rq_, (c), NULL);                                        \
            if (st_ < 0)                                                                           \
                return st_;                                                                        \
        }                                                                                          \
    } while (0)

/* One piece: n elements of every rank at send (rank r's chunk at disp[r],
 * cnt[r] long; for a reduce-scatter chunk r is block r), this rank's
 * reduced chunk into out (all-reduce: recv[disp], the whole n; reduce: the
 * root's recv; reduce-scatter: recv). tmp: W x cnt[me] 16-bit elements,
 * mine: cnt[me]. */
static dt_status half_piece(mpi_ctx *m, const dt_coll *c, const uint16_t *send, uint16_t *recv, int *cnt,
                            int *disp, int *rcnt, int *rdisp, uint16_t *tmp, uint16_t *mine)
{
    const int W = m->size, me = m->rank;
    const void *srcs_stack[64];
    const void **srcs = W <= 64 ? srcs_stack : malloc((size_t)W * sizeof *srcs);
    if (!srcs)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: %d source pointers", W);
    for (int r = 0; r < W; r++) {
        rcnt[r] = cnt[me];
        rdisp[r] = r * cnt[me];
        srcs[r] = tmp + (size_t)r * (size_t)cnt[me];
    }
    dt_status st = DT_OK;
    do {
        MPI_DO(m, c, "MPI_Ialltoallv (16-bit reduction)",
               MPI_Alltoallv(send, cnt, disp, MPI_UINT16_T, tmp, rcnt, rdisp, MPI_UINT16_T, m->comm),
               MPI_Ialltoallv(send, cnt, disp, MPI_UINT16_T, tmp, rcnt, rdisp, MPI_UINT16_T, m->comm, &rq_));
        uint16_t *dst = c->kind == DT_COLL_REDUCE_SCATTER ? recv : mine;
        dt__reduce(c->dtype, c->op, dst, srcs, W, (size_t)cnt[me], W);
        if (c->kind == DT_COLL_ALLREDUCE)
            MPI_DO(m, c, "MPI_Iallgatherv (16-bit reduction)",
                   MPI_Allgatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, m->comm),
                   MPI_Iallgatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, m->comm, &rq_));
        else if (c->kind == DT_COLL_REDUCE)
            MPI_DO(m, c, "MPI_Igatherv (16-bit reduction)",
                   MPI_Gatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, c->root, m->comm),
                   MPI_Igatherv(mine, cnt[me], MPI_UINT16_T, recv, cnt, disp, MPI_UINT16_T, c->root, m->comm,
                                &rq_));
    } while (0);
    if (srcs != srcs_stack)
        free(srcs);
    return st;
}

static dt_status run_reduction_half(mpi_ctx *m, const dt_coll *c)
{
    const int W = m->size, me = m->rank;
    const size_t piece_max = (size_t)1 << 30;
    const bool rs = c->kind == DT_COLL_REDUCE_SCATTER;
    if (rs && (c->count > (size_t)INT_MAX / (size_t)W))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: reduce_scatter of %zu %s elements per rank over %d "
                        "ranks exceeds MPI's int displacements", c->count, dt_dtype_name(c->dtype), W);
    if (c->count == 0)
        return DT_OK;
    const size_t piece = rs ? c->count : (c->count < piece_max ? c->count : piece_max);
    const size_t mine_n = rs ? c->count : (piece + (size_t)W - 1) / (size_t)W;
    int *ints = malloc(4 * (size_t)W * sizeof *ints);
    uint16_t *tmp = dt_alloc((size_t)W * mine_n * 2 + 2), *mine = dt_alloc(mine_n * 2 + 2);
    dt_status st = DT_OK;
    if (!ints || !tmp || !mine) {
        st = dt_error(DT_ERR_NO_MEMORY, "mpi backend: buffers of a %s reduction (%zu elements)",
                      dt_dtype_name(c->dtype), c->count);
        goto out;
    }
    int *cnt = ints, *disp = ints + W, *rcnt = ints + 2 * W, *rdisp = ints + 3 * W;
    const uint16_t *send = c->send;
    uint16_t *recv = c->recv;
    const bool gets = c->kind != DT_COLL_REDUCE || c->root == me;
    for (size_t off = 0; off < (rs ? 1 : c->count) && st >= 0; off += piece) {
        const size_t n = rs ? c->count * (size_t)W : (c->count - off < piece ? c->count - off : piece);
        for (int r = 0, at = 0; r < W; r++) {
            cnt[r] = rs ? (int)c->count : (int)(n / (size_t)W + ((size_t)r < n % (size_t)W));
            disp[r] = at;
            at += cnt[r];
        }
        st = half_piece(m, c, send + (rs ? 0 : off), rs ? recv : (gets ? recv + off : NULL), cnt, disp, rcnt, rdisp,
                        tmp, mine);
    }
out:
    free(ints);
    dt_free(tmp);
    dt_free(mine);
    return st;
}

static dt_status run_avg_finish(mpi_ctx *m, const dt_coll *c, dt_status st)
{
    if (st != DT_OK || c->op != DT_REDUCE_AVG || !c->recv)
        return st;
    if (c->kind == DT_COLL_REDUCE && c->root != m->rank)
        return st;
    dt__avg_finish(c->dtype, c->recv, c->count, m->size);
    return st;
}

static dt_status run_other(mpi_ctx *m, const dt_coll *c, MPI_Datatype t)
{
    size_t es = dt_dtype_size(c->dtype);
    int n = (int)c->count;
    if (!fits_int(c->count) || !fits_int(c->count * (size_t)m->size))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: %s of %zu elements exceeds MPI's int count",
                        dt_coll_kind_name(c->kind), c->count);
    MPI_Request rq;
    MPI_Status status;
    int rc;
    const char *what = dt_coll_kind_name(c->kind);
    int *counts = NULL, *displs = NULL;
    switch (c->kind) {
    case DT_COLL_BROADCAST: {
        void *buf = c->recv ? c->recv : (void *)c->send;
        rc = MPI_Ibcast(buf, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLGATHER: {
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Iallgather(sb, n, t, c->recv, n, t, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLGATHERV: {
        counts = malloc(sizeof(int) * (size_t)m->size);
        displs = malloc(sizeof(int) * (size_t)m->size);
        if (!counts || !displs) {
            free(counts);
            free(displs);
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: allgatherv counts");
        }
        for (int r = 0; r < m->size; r++) {
            if (!fits_int(c->counts[r]) || !fits_int(c->displs[r])) {
                free(counts);
                free(displs);
                return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: allgatherv block of rank %d "
                                                    "exceeds MPI's int count", r);
            }
            counts[r] = (int)c->counts[r];
            displs[r] = (int)c->displs[r];
        }
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Iallgatherv(sb, counts[m->rank], t, c->recv, counts, displs, t, m->comm, &rq);
        break;
    }
    case DT_COLL_GATHER: {
        int root = c->root == m->rank;
        const void *sb = root && c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Igather(sb, n, t, c->recv, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_SCATTER: {
        int root = c->root == m->rank;
        void *rb = root && c->in_place ? MPI_IN_PLACE : c->recv;
        rc = MPI_Iscatter(c->send, n, t, rb, n, t, c->root, m->comm, &rq);
        break;
    }
    case DT_COLL_ALLTOALL: {
        const void *sb = c->in_place ? MPI_IN_PLACE : c->send;
        rc = MPI_Ialltoall(sb, n, t, c->recv, n, t, m->comm, &rq);
        break;
    }
    case DT_COLL_BARRIER:
        rc = MPI_Ibarrier(m->comm, &rq);
        break;
    case DT_COLL_SEND:
        rc = MPI_Isend(c->send, n, t, c->root, 0, m->comm, &rq);
        break;
    case DT_COLL_RECV:
        rc = MPI_Irecv(c->recv, n, t, c->root, 0, m->comm, &rq);
        break;
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: operation %s", what);
    }
    (void)es;
    dt_status st = rc == MPI_SUCCESS ? DT_OK : mpi_err(rc, what, c);
    if (st == DT_OK)
        st = wait_req(m, &rq, c, &status);
    free(counts);
    free(displs);
    if (st == DT_OK && c->kind == DT_COLL_RECV) {
        int got = 0;
        MPI_Get_count(&status, t, &got);
        if (got != n)
            return dt_error(DT_ERR_MISMATCH, "mpi backend: recv #%llu from rank %d expected %d "
                                             "elements of %s, the sender sent %d",
                            (unsigned long long)c->seq, c->root, n, dt_dtype_name(c->dtype), got);
    }
    return st;
}

static dt_status mpi_run_locked(void *ctx, const dt_coll *c);

/* ---- blocking calls under the timeout ----
 * With DT_MPI_BLOCKING=1 and MPI_THREAD_MULTIPLE, a blocking call runs on
 * the group's worker thread while the caller waits for it with the
 * operation's timeout, polling failure notices and answering the flight
 * recorder's queries: a peer's failure or the timeout ends the wait (the
 * worker stays inside MPI; the group is unusable, its context and
 * communicator are never freed and the process aborts the job at exit, as
 * after any timeout). Under MPI_THREAD_SERIALIZED the call runs on the
 * caller's thread and cannot be interrupted. */
typedef struct mpi_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const dt_coll *job; /* posted, not yet taken */
    int busy;           /* a job is running or done but not collected */
    int done;
    int stop;           /* mpi_free: end the thread */
    dt_status st;
    char msg[NOTE_MSG_CAP];
} mpi_worker;


static void *worker_main(void *arg)
{
    mpi_ctx *m = arg;
    mpi_worker *w = m->worker;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop)
            break;
        const dt_coll *c = w->job;
        w->job = NULL;
        pthread_mutex_unlock(&w->mu);
        dt_error_clear();
        dt_status st = mpi_run_locked(m, c);
        pthread_mutex_lock(&w->mu);
        w->st = st;
        snprintf(w->msg, sizeof w->msg, "%s", st < 0 ? dt_last_error() : "");
        w->done = 1;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static dt_status run_on_worker(mpi_ctx *m, const dt_coll *c)
{
    mpi_worker *w = m->worker;
    if (!w) {
        w = calloc(1, sizeof *w);
        if (!w)
            return dt_error(DT_ERR_NO_MEMORY, "mpi backend: worker");
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
        m->worker = w;
        if (pthread_create(&w->thread, NULL, worker_main, m) != 0) {
            m->worker = NULL;
            free(w);
            return mpi_run_locked(m, c); /* no thread: uninterruptible, as under SERIALIZED */
        }
    }
    if (group_down(m, 1)) /* known down: the call would not start anyway */
        return down_error(m);
    pthread_mutex_lock(&w->mu);
    w->job = c;
    w->busy = 1;
    w->done = 0;
    pthread_cond_broadcast(&w->cv);
    double t0 = dt_time_s();
    for (unsigned long spins = 0; !w->done; spins++) {
        pthread_mutex_unlock(&w->mu);
        double now = dt_time_s();
        dt_status st = DT_OK;
        if (group_down(m, spins % 64 == 0))
            st = down_error(m);
        else if (c->timeout_s > 0 && now - t0 > c->timeout_s) {
            char d[160];
            m->failed = 1;
            st = dt_error(DT_ERR_TIMEOUT, "mpi backend: %s timed out after %.3g s on rank %d of %d (a blocking "
                                          "call, DT_MPI_BLOCKING=1; the group is now unusable)",
                          dt__coll_describe(c, d, sizeof d), c->timeout_s, m->rank, m->size);
        }
        if (st < 0) {
            /* a short grace: a call that was about to end need not be left */
            for (int i = 0; i < 100; i++) {
                pthread_mutex_lock(&w->mu);
                int d = w->done;
                pthread_mutex_unlock(&w->mu);
                if (d)
                    break;
                nap(1000000);
            }
            pthread_mutex_lock(&w->mu);
            if (w->done)
                break; /* it came back meanwhile */
            pthread_mutex_unlock(&w->mu);
            m->abandoned = 1; /* the worker still uses m and its communicator */
            m->stuck = 1;
            g_stuck = 1;
            return st;
        }
        if (spins < 1000)
            sched_yield();
        else
            nap(now - t0 < 0.1 ? 20000 : 200000);
        pthread_mutex_lock(&w->mu);
    }
    w->busy = 0;
    dt_status st = w->st;
    if (st < 0)
        dt_error(st, "%s", w->msg);
    pthread_mutex_unlock(&w->mu);
    return st;
}

static dt_status mpi_run(void *ctx, const dt_coll *c)
{
    mpi_ctx *m = ctx;
    if (m->blocking && thread_multiple && c->kind != DT_COLL_SEND && c->kind != DT_COLL_RECV)
        return run_on_worker(m, c);
    mpi_lock();
    dt_status st = mpi_run_locked(ctx, c);
    mpi_unlock();
    return st;
}

static dt_status mpi_run_locked(void *ctx, const dt_coll *c)
{
    mpi_ctx *m = ctx;
    /* Blocking calls cannot be interrupted: a notice that has arrived keeps
     * the operation from starting. Nonblocking ones are posted even when
     * the group is known to be down, and fail in wait_req unless complete
     * at once: a rank late into a collective that timed out on the others
     * (their timeout's notice has reached it) thus still completes their
     * abandoned requests, so that their MPI_Finalize can (see
     * finalize_at_exit). The group layer posts nothing after that failure. */
    if (m->blocking && group_down(m, 1))
        return down_error(m);
    if (m->failed)
        return dt_error(DT_ERR_STATE, "mpi backend: an earlier operation timed out; the "
                                      "communicator is unusable");
    MPI_Datatype t = mpi_type(c->dtype);
    if (c->kind != DT_COLL_BARRIER && t == MPI_DATATYPE_NULL)
        return dt_error(DT_ERR_INVALID_ARG, "mpi backend: dtype %d", (int)c->dtype);
    if (m->check && c->kind != DT_COLL_SEND && c->kind != DT_COLL_RECV) {
        dt_status st = check_same(m, c);
        if (st < 0)
            return st;
    }
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
    case DT_COLL_REDUCE_SCATTER:
        if (mpi_op(c->op) == MPI_OP_NULL)
            return dt_error(DT_ERR_INVALID_ARG, "mpi backend: reduction %d", (int)c->op);
        if (c->dtype == DT_F16 || c->dtype == DT_BF16)
            return run_reduction_half(m, c);
        return run_avg_finish(m, c, run_reduction(m, c, c->send, c->recv, t));
    default:
        return run_other(m, c, t);
    }
}

/* A group's context on comm (taken over; freed on error): its id, chosen by
 * its rank 0 and broadcast (collective over comm), its ranks' world ranks
 * (where notices go), and its entry in the notice registry. */
static dt_status ctx_make(MPI_Comm comm, int check, int blocking, double timeout_s, mpi_ctx **out)
{
    *out = NULL;
    int size = 0;
    MPI_Comm_size(comm, &size);
    mpi_ctx *m = calloc(1, sizeof *m);
    mpi_note *note = calloc(1, sizeof *note);
    MPI_Request *sends = malloc(sizeof *sends * (size_t)size);
    int *world = malloc(sizeof *world * (size_t)size), *mine = malloc(sizeof *mine * (size_t)size);
    uint64_t *chk = malloc(2 * sizeof *chk);
    dt_status st = DT_OK;
    mpi_lock();
    if (!m || !note || !sends || !world || !mine || !chk) {
        st = dt_error(DT_ERR_NO_MEMORY, "mpi backend: context");
    } else {
        m->comm = comm;
        MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
        MPI_Comm_rank(comm, &m->rank);
        m->size = size;
        static _Atomic uint64_t made;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t seed[3] = {(uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec, (uint64_t)getpid(),
                            atomic_fetch_add(&made, 1)};
        m->gid = dt_hash64(seed, sizeof seed, 0x6e6f7465);
        MPI_Group g, gw;
        int rc = MPI_Bcast(&m->gid, 1, MPI_UINT64_T, 0, comm);
        if (rc == MPI_SUCCESS && (rc = MPI_Comm_group(comm, &g)) == MPI_SUCCESS) {
            MPI_Comm_group(MPI_COMM_WORLD, &gw);
            for (int r = 0; r < size; r++)
                mine[r] = r;
            rc = MPI_Group_translate_ranks(g, size, mine, gw, world);
            MPI_Group_free(&g);
            MPI_Group_free(&gw);
        }
        if (rc != MPI_SUCCESS)
            st = mpi_err(rc, "MPI_Bcast (the group's id)", NULL);
    }
    if (st < 0) {
        MPI_Comm_free(&comm);
        mpi_unlock();
        free(m);
        free(note);
        free(sends);
        free(world);
        free(mine);
        free(chk);
        return st;
    }
    free(mine);
    m->chk = chk;
    for (int r = 0; r < size; r++)
        sends[r] = MPI_REQUEST_NULL;
    m->world = world;
    m->note_out = note;
    m->note_sends = sends;
    m->check = check;
    m->blocking = blocking;
    m->timeout_s = timeout_s;
    atomic_init(&m->down, 0);
    pthread_mutex_init(&m->down_mu, NULL);
    note_register(m);
    mpi_unlock();
    *out = m;
    return DT_OK;
}

/* MPI_Init_thread under the group's timeout: it waits for every process of
 * the job, and one that never starts (or hangs before dt_pg_init) would
 * keep it waiting for ever. It runs on a helper thread; when it has not
 * returned within timeout_s, dt_pg_init fails with DT_ERR_TIMEOUT and the
 * helper is left inside MPI (the process should end: it cannot use MPI).
 * The bound is info->init_timeout_s ($DT_INIT_TIMEOUT, else the group's timeout).
 * g_init: 0 not started, 1 running, 2 returned (g_init_rc, g_init_level). */
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_init_cv = PTHREAD_COND_INITIALIZER;
static int g_init, g_init_rc, g_init_level;

static void *init_main(void *arg)
{
    (void)arg;
    int provided = 0;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    pthread_mutex_lock(&g_init_mu);
    g_init_rc = rc;
    g_init_level = provided;
    g_init = 2;
    pthread_cond_broadcast(&g_init_cv);
    pthread_mutex_unlock(&g_init_mu);
    return NULL;
}

static dt_status init_with_timeout(const dt_backend_info *info, int *provided)
{
    pthread_mutex_lock(&g_init_mu);
    if (g_init == 0) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        int e = pthread_create(&t, &a, init_main, NULL);
        pthread_attr_destroy(&a);
        if (e != 0) {
            pthread_mutex_unlock(&g_init_mu);
            return dt_error(DT_ERR_IO, "mpi backend: cannot start a thread for MPI_Init_thread");
        }
        g_init = 1;
    }
    double until = dt_time_s() + info->init_timeout_s;
    while (g_init == 1) {
        double left = until - dt_time_s();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double w = left < 0.5 ? left : 0.5;
        ts.tv_sec += (time_t)w;
        ts.tv_nsec += (long)((w - (double)(time_t)w) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g_init_cv, &g_init_mu, &ts);
    }
    int state = g_init, rc = g_init_rc;
    *provided = g_init_level;
    pthread_mutex_unlock(&g_init_mu);
    if (state != 2)
        return dt_error(DT_ERR_TIMEOUT,
                        "mpi backend: MPI_Init did not complete within %.3g s on rank %d of %d: a process of "
                        "the job did not start or did not reach dt_pg_init (DT_INIT_TIMEOUT sets the limit, "
                        "else DT_COMM_TIMEOUT)",
                        info->init_timeout_s, info->rank, info->world_size);
    if (rc != MPI_SUCCESS)
        return mpi_err(rc, "MPI_Init_thread", NULL);
    return DT_OK;
}

static dt_status mpi_init(const dt_backend_info *info, void **out)
{
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited || g_init == 1) {
        int provided = 0;
        dt_status ist = init_with_timeout(info, &provided);
        if (ist < 0)
            return ist;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        if (!we_initialised) {
            we_initialised = 1;
            atexit(finalize_at_exit);
        }
        if (provided < MPI_THREAD_SERIALIZED)
            return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: this MPI provides thread level %d, "
                                                "dtrain needs MPI_THREAD_SERIALIZED", provided);
        thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    } else {
        /* The program initialised MPI: the group's progress thread calls
         * MPI too, which needs at least MPI_THREAD_SERIALIZED. */
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_SERIALIZED)
            return dt_error(DT_ERR_UNSUPPORTED,
                            "mpi backend: MPI was initialised with thread level %d; dtrain calls "
                            "MPI from its progress thread and needs MPI_THREAD_SERIALIZED (use "
                            "MPI_Init_thread(..., MPI_THREAD_SERIALIZED, ...), or let dtrain "
                            "initialise MPI)", level);
        thread_multiple = level >= MPI_THREAD_MULTIPLE;
    }
    MPI_Comm comm;
    mpi_lock();
    int rc = MPI_SUCCESS;
    if (g_ctl == MPI_COMM_NULL && (rc = MPI_Comm_dup(MPI_COMM_WORLD, &g_ctl)) == MPI_SUCCESS)
        MPI_Comm_set_errhandler(g_ctl, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mpi_err(rc, "MPI_Comm_dup", NULL);
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank != info->rank || size != info->world_size) {
        dt_status st = dt_error(DT_ERR_INVALID_ARG,
                                "mpi backend: MPI says rank %d of %d but the group was set up as "
                                "rank %d of %d (start the program with mpirun/srun, or choose "
                                "another backend, e.g. DT_BACKEND=shm under dtrain run)",
                                rank, size, info->rank, info->world_size);
        mpi_lock();
        MPI_Comm_free(&comm);
        mpi_unlock();
        return st;
    }
    const char *b = getenv("DT_MPI_BLOCKING");
    int blocking = (b && !strcmp(b, "1")) || (info->options && strstr(info->options, "blocking=1"));
    return ctx_make(comm, info->check, blocking, info->timeout_s, (mpi_ctx **)out);
}

static void mpi_free(void *ctx)
{
    mpi_ctx *m = ctx;
    if (!m)
        return;
    if (m->stuck) { /* its worker is still inside MPI with m: keep it all */
        mpi_lock();
        note_unregister(m, 0);
        mpi_unlock();
        return;
    }
    int fin = 0;
    MPI_Finalized(&fin);
    mpi_lock();
    pthread_mutex_lock(&g_unsent_mu); /* a notice still waiting for the lock goes out now */
    if (m->note_queued) {
        for (mpi_ctx **p = &g_unsent; *p; p = &(*p)->unsent_next)
            if (*p == m) {
                *p = m->unsent_next;
                break;
            }
        m->note_queued = 0;
        atomic_fetch_sub(&g_nunsent, 1);
        if (!fin)
            send_note(m);
    }
    pthread_mutex_unlock(&g_unsent_mu);
    note_unregister(m, fin);
    if (!fin) {
        /* The notice sends stay with MPI if incomplete; g_ctl is never freed. */
        note_sends_done(m);
        /* A communicator with a request left incomplete is not freed. */
        if (!m->abandoned)
            MPI_Comm_free(&m->comm);
    }
    mpi_unlock();
    pthread_mutex_destroy(&m->down_mu);
    if (m->worker) { /* idle */
        mpi_worker *w = m->worker;
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
    }
    if (!m->abandoned) /* else MPI may still write it */
        free(m->chk);
    free(m->world);
    free(m->note_sends);
    free(m->note_out);
    free(m);
}

/* Tell the group's other ranks that this rank failed the group (st, msg),
 * and end this rank's own waits on it. Never waits: the sends are
 * nonblocking, and under MPI_THREAD_SERIALIZED a thread that holds the MPI
 * lock sends them when it releases it (a nonblocking wait releases it
 * while it naps). Nothing is sent when the failure came from a peer's
 * notice (every rank got that one from its sender). */
static void mpi_abort(void *ctx, dt_status st, const char *msg)
{
    mpi_ctx *m = ctx;
    if (!m || !set_down(m, st, msg) || m->size < 2 || !m->note_out)
        return;
    m->note_out->gid = m->gid;
    m->note_out->st = (int32_t)m->down_st;
    m->note_out->rank = m->rank;
    snprintf(m->note_out->msg, sizeof m->note_out->msg, "%s", m->down_msg);
    if (thread_multiple) {
        send_note(m);
        return;
    }
    pthread_mutex_lock(&g_unsent_mu);
    m->note_queued = 1;
    m->unsent_next = g_unsent;
    g_unsent = m;
    atomic_fetch_add(&g_nunsent, 1);
    pthread_mutex_unlock(&g_unsent_mu);
    if (pthread_mutex_trylock(&mpi_mu) == 0)
        mpi_unlock(); /* sends what is queued */
}

static dt_status mpi_subgroup(void *ctx, const int *ranks, int n, int new_rank, void **child)
{
    (void)ranks;
    (void)n;
    mpi_ctx *m = ctx;
    *child = NULL;
    MPI_Comm sub;
    /* MPI_Comm_split blocks until every rank calls it: first a nonblocking
     * barrier under the group's timeout, so that a rank that never comes
     * is an error, not a hang (the split itself then finds everyone) */
    dt_coll bc = {.kind = DT_COLL_BARRIER, .root = -1, .timeout_s = m->timeout_s};
    MPI_Request brq;
    mpi_lock();
    int rc = MPI_Ibarrier(m->comm, &brq);
    dt_status bst = rc == MPI_SUCCESS ? wait_req(m, &brq, &bc, NULL) : mpi_err(rc, "MPI_Ibarrier", NULL);
    if (bst < 0) {
        mpi_unlock();
        return dt_error(bst, "mpi backend: creating a subgroup (MPI_Comm_split) of rank %d of %d: %s", m->rank,
                        m->size, dt_last_error());
    }
    rc = MPI_Comm_split(m->comm, new_rank >= 0 ? 0 : MPI_UNDEFINED, new_rank, &sub);
    mpi_unlock();
    if (rc != MPI_SUCCESS)
        return mpi_err(rc, "MPI_Comm_split", NULL);
    if (new_rank < 0)
        return DT_OK;
    return ctx_make(sub, m->check, m->blocking, m->timeout_s, (mpi_ctx **)child);
}

/* ---- the flight recorder's status blocks ---- */

static void *mpi_flight_board(void *ctx, size_t bytes)
{
    mpi_ctx *m = ctx;
    return m && bytes <= sizeof m->board ? m->board : NULL;
}

/* Ask every peer for its block and wait up to wait_s for the answers,
 * answering the queries of others meanwhile (a peer that timed out at the
 * same moment asks this rank). A stopped, dead or busy peer does not
 * answer: got stays 0 for it. */
static dt_status mpi_flight_gather(void *ctx, void *all, unsigned char *got, size_t bytes, double wait_s)
{
    mpi_ctx *m = ctx;
    int W = m->size;
    mpi_reply *rep = calloc((size_t)W, sizeof *rep);
    MPI_Request *rq = malloc(sizeof *rq * (size_t)W), *sq = malloc(sizeof *sq * (size_t)W);
    mpi_query *q = malloc(sizeof *q);
    if (!rep || !rq || !sq || !q || bytes > FLIGHT_BYTES) {
        free(rep);
        free(rq);
        free(sq);
        free(q);
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: flight recorder query");
    }
    *q = (mpi_query){.gid = m->gid, .rank = m->rank};
    mpi_lock();
    for (int r = 0; r < W; r++) {
        rq[r] = sq[r] = MPI_REQUEST_NULL;
        if (r == m->rank)
            continue;
        if (MPI_Irecv(&rep[r], (int)sizeof rep[r], MPI_BYTE, m->world[r], reply_tag(m->gid), g_ctl, &rq[r]) !=
            MPI_SUCCESS)
            rq[r] = MPI_REQUEST_NULL;
        else if (MPI_Isend(q, (int)sizeof *q, MPI_BYTE, m->world[r], QUERY_TAG, g_ctl, &sq[r]) != MPI_SUCCESS)
            sq[r] = MPI_REQUEST_NULL; /* a dead peer */
    }
    double t0 = dt_time_s();
    for (;;) {
        int open = 0;
        for (int r = 0; r < W; r++) {
            if (rq[r] == MPI_REQUEST_NULL)
                continue;
            int flag = 0;
            if (MPI_Test(&rq[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
                rq[r] = MPI_REQUEST_NULL;
            } else if (flag) {
                if (rep[r].gid == m->gid && rep[r].rank == r) {
                    memcpy((char *)all + (size_t)r * bytes, rep[r].board, bytes);
                    got[r] = 1;
                }
            } else {
                open++;
            }
        }
        if (pthread_mutex_trylock(&g_note_mu) == 0) {
            note_take_locked();
            pthread_mutex_unlock(&g_note_mu);
        }
        if (!open || dt_time_s() - t0 > wait_s)
            break;
        mpi_unlock();
        nap(1000000);
        mpi_lock();
    }
    int sent = 1;
    for (int r = 0; r < W; r++) {
        if (rq[r] != MPI_REQUEST_NULL) { /* no answer: a receive cancels locally */
            MPI_Cancel(&rq[r]);
            MPI_Wait(&rq[r], MPI_STATUS_IGNORE);
        }
        int flag = 1;
        if (sq[r] != MPI_REQUEST_NULL && (MPI_Test(&sq[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag)) {
            MPI_Request_free(&sq[r]); /* MPI finishes it on its own; q stays allocated */
            sent = 0;
        }
    }
    mpi_unlock();
    if (sent)
        free(q);
    free(rep);
    free(rq);
    free(sq);
    return DT_OK;
}

/* ---- nonblocking send/recv (the group layer batches them) ---- */

typedef struct {
    dt_coll c;
    MPI_Request rq;
} mpi_p2p_op;

static dt_status mpi_p2p_start(void *ctx, const dt_coll *c, void **op)
{
    mpi_ctx *m = ctx;
    *op = NULL;
    if (group_down(m, 0))
        return down_error(m);
    if (m->failed)
        return dt_error(DT_ERR_STATE, "mpi backend: an earlier operation timed out; the "
                                      "communicator is unusable");
    if (!fits_int(c->count))
        return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: %s of %zu elements exceeds MPI's int count",
                        dt_coll_kind_name(c->kind), c->count);
    mpi_p2p_op *o = calloc(1, sizeof *o);
    if (!o)
        return dt_error(DT_ERR_NO_MEMORY, "mpi backend: out of memory");
    o->c = *c;
    MPI_Datatype t = mpi_type(c->dtype);
    mpi_lock();
    int rc = c->kind == DT_COLL_SEND
                 ? MPI_Isend(c->send, (int)c->count, t, c->root, 0, m->comm, &o->rq)
                 : MPI_Irecv(c->recv, (int)c->count, t, c->root, 0, m->comm, &o->rq);
    mpi_unlock();
    if (rc != MPI_SUCCESS) {
        free(o);
        return mpi_err(rc, c->kind == DT_COLL_SEND ? "MPI_Isend" : "MPI_Irecv", c);
    }
    *op = o;
    return DT_OK;
}

/* Give up an incomplete send or receive and release op (MPI access held).
 * A receive is cancelled (local: MPI_Wait returns at once); a send MPI may
 * not cancel, so it is left to complete (or not) and the communicator is not
 * freed; its buffer is the caller's to keep (the pipeline keeps those of
 * sends it could not settle). */
static void p2p_drop(mpi_ctx *m, mpi_p2p_op *o)
{
    int flag = 0;
    if (MPI_Test(&o->rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && o->c.kind == DT_COLL_RECV &&
        MPI_Cancel(&o->rq) == MPI_SUCCESS) {
        /* A receive already matched with a large message cannot be
         * cancelled and completes only with its sender: wait for that up to
         * a second, not for ever. */
        double t0 = dt_time_s();
        while (MPI_Test(&o->rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && dt_time_s() - t0 < 1.0)
            nap(100000);
    }
    if (!flag)
        m->abandoned = 1;
    free(o);
}

static dt_status mpi_p2p_test(void *ctx, void *op, int *progressed)
{
    mpi_ctx *m = ctx;
    mpi_p2p_op *o = op;
    if (!progressed) { /* abandoned (the group failed or it timed out) */
        mpi_lock();
        p2p_drop(m, o);
        mpi_unlock();
        return DT_OK;
    }
    *progressed = 0;
    int flag = 0;
    MPI_Status status;
    mpi_lock();
    int rc = MPI_Test(&o->rq, &flag, &status);
    int down = rc == MPI_SUCCESS && !flag && group_down(m, 1);
    if (down)
        p2p_drop(m, o);
    mpi_unlock();
    if (down)
        return down_error(m);
    dt_status st = DT_INPROGRESS;
    if (rc != MPI_SUCCESS) {
        st = mpi_err(rc, "MPI_Test", &o->c);
    } else if (flag) {
        *progressed = 1;
        st = DT_OK;
        if (o->c.kind == DT_COLL_RECV) {
            int got = 0;
            MPI_Get_count(&status, mpi_type(o->c.dtype), &got);
            if ((size_t)got != o->c.count)
                st = dt_error(DT_ERR_MISMATCH,
                              "mpi backend: recv #%llu from rank %d expected %zu elements of "
                              "%s, the sender sent %d",
                              (unsigned long long)o->c.seq, o->c.root, o->c.count,
                              dt_dtype_name(o->c.dtype), got);
        }
    }
    if (st != DT_INPROGRESS)
        free(o);
    return st;
}

static void mpi_p2p_idle(void *ctx, int round, double max_s)
{
    (void)ctx;
    if (round < 64)
        return; /* MPI progresses inside MPI_Test: poll again */
    if (round < 128) {
        sched_yield();
        return;
    }
    long ns = round < 1024 ? 50000L : 1000000L;
    if (ns > (long)(max_s * 1e9))
        ns = (long)(max_s * 1e9);
    nap(ns);
}

const dt_backend_ops dt__backend_mpi = {
    .version = DT_BACKEND_VERSION,
    .name = "mpi",
    .init = mpi_init,
    .free = mpi_free,
    .run = mpi_run,
    .kinds = 0,
    .mem_alloc = NULL,
    .mem_free = NULL,
    .subgroup = mpi_subgroup,
    .abort = mpi_abort,
    .p2p_start = mpi_p2p_start,
    .p2p_test = mpi_p2p_test,
    .p2p_idle = mpi_p2p_idle,
    .flight_board = mpi_flight_board,
    .flight_gather = mpi_flight_gather,
};
