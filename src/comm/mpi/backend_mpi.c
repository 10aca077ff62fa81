/* The `mpi` backend: dtrain collectives on an MPI communicator.
 *
 * This is the engine for ranks across machines (mpirun, srun). It is built
 * only when CMake finds MPI (files named *_mpi.c are filtered otherwise) and
 * is registered as "mpi"; the group layer chooses it by default when the
 * ranks came from Open MPI / PMI / Slurm variables. The code: this file
 * (start-up, groups, shutdown, the flight recorder's blocks), mpi_fail.c
 * (failure notices, dead peers, the waiting loop), mpi_coll.c (the
 * collectives), mpi_p2p.c (send/recv), their shared state in mpi_impl.h.
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
 * operation failed here, or dt_pg_fail: the pipeline breaking off its
 * schedule), abort sends each other rank of the group a notice (status and
 * message; see "failure notices" below); their waiting loops (collectives
 * and send/recv) poll for notices beside their own request, so their
 * pending and later operations on that group fail within milliseconds with
 * the same status and message as on this rank, as the shm backend's abort
 * record makes them, not at the timeout (a notice names how many
 * collectives its sender had completed: one of those still pending here
 * completes rather than fails, see colls_done). Two limits: a blocking collective
 * (DT_MPI_BLOCKING=1) cannot be interrupted once inside MPI when MPI gives
 * only MPI_THREAD_SERIALIZED (a notice that arrived before keeps it from
 * starting; send/recv are always nonblocking),
 * and an operation left by a failure cannot be cancelled if it is a
 * collective or a send: its communicator is then never freed, and MPI may
 * still read or write its buffers (as after a timeout). A dead rank: MPI
 * never says (a receive from it just never completes), so each rank learns
 * its peers' process identities when the first group is made, and its
 * waiting loops check the peers that run on its own machine (see "dead
 * peers"): a rank that died there fails the group with DT_ERR_PEER_FAILED
 * naming it, within milliseconds, and the notice carries that to the ranks
 * on other machines. Open MPI's mpirun meanwhile ends the job (SIGTERM to
 * every rank at once, SIGKILL odls_base_sigkill_timeout = 1 s later): a
 * survivor that handles SIGTERM (dtrain train does) reports in that time;
 * `mpirun --mca odls_base_sigkill_timeout 10` makes it certain, and without
 * that setting the first group's rank 0 says so once (dt_log, warn).
 * Errors from MPI calls come back as values (the communicator uses
 * MPI_ERRORS_RETURN) and carry MPI's error string.
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
#include "mpi_impl.h"

static int we_initialised;
/* Requests abandoned by a timeout (kept to see at exit whether they
 * completed after all); more than fit counts as one that never will. */
#define MPI_MAX_ABANDONED 16
static MPI_Request g_abandoned_rq[MPI_MAX_ABANDONED];
static int g_nabandoned;
static pthread_mutex_t g_abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
int dt__mpi_stuck; /* a blocking call's worker never came back from MPI: abort at exit */
_Atomic int dt__mpi_dead_seen; /* a peer process died (see "dead peers"): no MPI_Finalize at exit */

void dt__mpi_abandon(MPI_Request rq)
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
int dt__mpi_thread_multiple;
pthread_mutex_t dt__mpi_mu = PTHREAD_MUTEX_INITIALIZER;

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
int dt__mpi_note_sends_done(mpi_ctx *m)
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

void dt__mpi_finalize_at_exit(void)
{
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin || dt__mpi_dead_seen) /* a peer died: MPI_Finalize would wait for it for ever; leave without */
        return;
    leftover_release(1.0);
    if (dt__mpi_note_rq != MPI_REQUEST_NULL) { /* groups left unfreed: their notice receive */
        MPI_Cancel(&dt__mpi_note_rq);
        MPI_Wait(&dt__mpi_note_rq, MPI_STATUS_IGNORE);
    }
    if (dt__mpi_query_rq != MPI_REQUEST_NULL) {
        MPI_Cancel(&dt__mpi_query_rq);
        MPI_Wait(&dt__mpi_query_rq, MPI_STATUS_IGNORE);
    }
    if (dt__mpi_stuck || (g_nabandoned && !abandoned_all_done(1.0))) {
        fprintf(stderr, "mpi backend: a collective abandoned after a timeout never completed; "
                        "aborting the job (MPI_Finalize would wait for ever)\n");
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return;
    }
    MPI_Finalize();
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
    dt__mpi_lock();
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
            st = dt__mpi_err(rc, "MPI_Bcast (the group's id)", NULL);
    }
    if (st < 0) {
        MPI_Comm_free(&comm);
        dt__mpi_unlock();
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
    m->dead_world = -1;
    atomic_init(&m->down, 0);
    pthread_mutex_init(&m->down_mu, NULL);
    dt__mpi_note_register(m);
    dt__mpi_unlock();
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
    bool stop = false;
    while (g_init == 1) {
        double left = until - dt_time_s();
        if (left <= 0 || (stop = info->interrupted && info->interrupted(info->interrupted_arg)))
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
    if (state != 2 && stop)
        return dt_error(DT_ERR_CANCELED, "mpi backend: rank %d of %d: interrupted while waiting in MPI_Init for "
                        "the job's other processes", info->rank, info->world_size);
    if (state != 2)
        return dt_error(DT_ERR_TIMEOUT,
                        "mpi backend: MPI_Init did not complete within %.3g s on rank %d of %d: a process of "
                        "the job did not start or did not reach dt_pg_init (DT_INIT_TIMEOUT sets the limit, "
                        "else DT_COMM_TIMEOUT)",
                        info->init_timeout_s, info->rank, info->world_size);
    if (rc != MPI_SUCCESS)
        return dt__mpi_err(rc, "MPI_Init_thread", NULL);
    return DT_OK;
}

/* Under Open MPI's mpirun, a rank's death makes the launcher SIGTERM every
 * other rank at once and SIGKILL them odls_base_sigkill_timeout seconds
 * later (1 by default): too short, on a loaded machine, for a survivor to
 * be sure to report which rank died. Say so once (rank 0) unless the job
 * was started with at least 10 s. */
static void warn_sigkill(int rank)
{
    const char *w = getenv("OMPI_COMM_WORLD_SIZE"), *t = getenv("OMPI_MCA_odls_base_sigkill_timeout");
    if (rank != 0 || !w || atoi(w) < 2 || (t && atoi(t) >= 10))
        return;
    dt_log(DT_LOG_WARN, "mpi backend: when a rank dies, mpirun kills the others %s s later, maybe before they "
                        "can say which rank died; start the job with `mpirun --mca odls_base_sigkill_timeout 10 "
                        "...` to give them the time",
           t ? t : "1");
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
            atexit(dt__mpi_finalize_at_exit);
        }
        if (provided < MPI_THREAD_SERIALIZED)
            return dt_error(DT_ERR_UNSUPPORTED, "mpi backend: this MPI provides thread level %d, "
                                                "dtrain needs MPI_THREAD_SERIALIZED", provided);
        dt__mpi_thread_multiple = provided >= MPI_THREAD_MULTIPLE;
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
        dt__mpi_thread_multiple = level >= MPI_THREAD_MULTIPLE;
    }
    MPI_Comm comm;
    dt__mpi_lock();
    int rc = MPI_SUCCESS;
    if (dt__mpi_ctl == MPI_COMM_NULL && (rc = MPI_Comm_dup(MPI_COMM_WORLD, &dt__mpi_ctl)) == MPI_SUCCESS) {
        MPI_Comm_set_errhandler(dt__mpi_ctl, MPI_ERRORS_RETURN);
        dt__mpi_procs_gather();
        warn_sigkill(info->rank);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    dt__mpi_unlock();
    if (rc != MPI_SUCCESS)
        return dt__mpi_err(rc, "MPI_Comm_dup", NULL);
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (rank != info->rank || size != info->world_size) {
        dt_status st = dt_error(DT_ERR_INVALID_ARG,
                                "mpi backend: MPI says rank %d of %d but the group was set up as "
                                "rank %d of %d (start the program with mpirun/srun, or choose "
                                "another backend, e.g. DT_BACKEND=shm under dtrain run)",
                                rank, size, info->rank, info->world_size);
        dt__mpi_lock();
        MPI_Comm_free(&comm);
        dt__mpi_unlock();
        return st;
    }
    dt__mpi_traffic_start();
    const char *b = getenv("DT_MPI_BLOCKING");
    int blocking = (b && !strcmp(b, "1")) || (info->options && strstr(info->options, "blocking=1"));
    return ctx_make(comm, info->check, blocking, info->timeout_s, (mpi_ctx **)out);
}

void dt__mpi_free(void *ctx)
{
    mpi_ctx *m = ctx;
    if (!m)
        return;
    if (m->stuck) { /* its worker is still inside MPI with m: keep it all */
        dt__mpi_lock();
        dt__mpi_note_unregister(m, 0);
        dt__mpi_unlock();
        return;
    }
    int fin = 0;
    MPI_Finalized(&fin);
    dt__mpi_lock();
    pthread_mutex_lock(&dt__mpi_unsent_mu); /* a notice still waiting for the lock goes out now */
    if (m->note_queued) {
        for (mpi_ctx **p = &dt__mpi_unsent; *p; p = &(*p)->unsent_next)
            if (*p == m) {
                *p = m->unsent_next;
                break;
            }
        m->note_queued = 0;
        atomic_fetch_sub(&dt__mpi_nunsent, 1);
        if (!fin)
            dt__mpi_send_note(m);
    }
    pthread_mutex_unlock(&dt__mpi_unsent_mu);
    dt__mpi_note_unregister(m, fin);
    if (!fin) {
        /* The notice sends stay with MPI if incomplete; g_ctl is never freed. */
        dt__mpi_note_sends_done(m);
        /* A communicator with a request left incomplete is not freed. */
        if (!m->abandoned)
            MPI_Comm_free(&m->comm);
    }
    dt__mpi_unlock();
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
void dt__mpi_abort(void *ctx, dt_status st, const char *msg)
{
    mpi_ctx *m = ctx;
    if (!m || !dt__mpi_set_down(m, st, msg, 0) || m->size < 2 || !m->note_out)
        return;
    m->note_out->gid = m->gid;
    m->note_out->st = (int32_t)m->down_st;
    m->note_out->rank = m->rank;
    m->note_out->dead = m->dead_world;
    m->note_out->done = atomic_load(&m->colls_done);
    snprintf(m->note_out->msg, sizeof m->note_out->msg, "%s", m->down_msg);
    if (dt__mpi_thread_multiple) {
        dt__mpi_send_note(m);
        return;
    }
    pthread_mutex_lock(&dt__mpi_unsent_mu);
    m->note_queued = 1;
    m->unsent_next = dt__mpi_unsent;
    dt__mpi_unsent = m;
    atomic_fetch_add(&dt__mpi_nunsent, 1);
    pthread_mutex_unlock(&dt__mpi_unsent_mu);
    if (pthread_mutex_trylock(&dt__mpi_mu) == 0)
        dt__mpi_unlock(); /* sends what is queued */
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
    dt__mpi_lock();
    int rc = MPI_Ibarrier(m->comm, &brq);
    dt_status bst = rc == MPI_SUCCESS ? dt__mpi_wait_req(m, &brq, &bc, NULL) : dt__mpi_err(rc, "MPI_Ibarrier", NULL);
    if (bst < 0) {
        dt__mpi_unlock();
        return dt_error(bst, "mpi backend: creating a subgroup (MPI_Comm_split) of rank %d of %d: %s", m->rank,
                        m->size, dt_last_error());
    }
    rc = MPI_Comm_split(m->comm, new_rank >= 0 ? 0 : MPI_UNDEFINED, new_rank, &sub);
    dt__mpi_unlock();
    if (rc != MPI_SUCCESS)
        return dt__mpi_err(rc, "MPI_Comm_split", NULL);
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
    dt__mpi_lock();
    for (int r = 0; r < W; r++) {
        rq[r] = sq[r] = MPI_REQUEST_NULL;
        if (r == m->rank)
            continue;
        if (MPI_Irecv(&rep[r], (int)sizeof rep[r], MPI_BYTE, m->world[r], reply_tag(m->gid), dt__mpi_ctl, &rq[r]) !=
            MPI_SUCCESS)
            rq[r] = MPI_REQUEST_NULL;
        else if (MPI_Isend(q, (int)sizeof *q, MPI_BYTE, m->world[r], QUERY_TAG, dt__mpi_ctl, &sq[r]) != MPI_SUCCESS)
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
        if (pthread_mutex_trylock(&dt__mpi_note_mu) == 0) {
            dt__mpi_note_take_locked();
            pthread_mutex_unlock(&dt__mpi_note_mu);
        }
        if (!open || dt_time_s() - t0 > wait_s)
            break;
        dt__mpi_unlock();
        dt__mpi_nap(1000000);
        dt__mpi_lock();
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
    dt__mpi_unlock();
    if (sent)
        free(q);
    free(rep);
    free(rq);
    free(sq);
    return DT_OK;
}

const dt_backend_ops dt__backend_mpi = {
    .version = DT_BACKEND_VERSION,
    .name = "mpi",
    .init = mpi_init,
    .free = dt__mpi_free,
    .run = dt__mpi_run,
    .kinds = 0,
    .mem_alloc = NULL,
    .mem_free = NULL,
    .subgroup = mpi_subgroup,
    .traffic = dt__mpi_traffic,
    .traffic_off_node = dt__mpi_traffic_off_node,
    .abort = dt__mpi_abort,
    .p2p_start = dt__mpi_p2p_start,
    .p2p_test = dt__mpi_p2p_test,
    .p2p_idle = dt__mpi_p2p_idle,
    .flight_board = mpi_flight_board,
    .flight_gather = mpi_flight_gather,
};
