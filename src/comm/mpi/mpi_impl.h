/* The mpi backend's shared state and functions (private to src/comm/mpi/):
 * backend_mpi.c (start-up, groups, shutdown, the flight recorder's blocks,
 * the backend's table), mpi_fail.c (failure notices, dead peers, waiting
 * under the timeout), mpi_coll.c (the mismatch check and the collectives),
 * mpi_p2p.c (nonblocking send/recv). backend_mpi.c says how it all works. */
#ifndef DT_COMM_MPI_IMPL_H
#define DT_COMM_MPI_IMPL_H

#include "comm/backend.h"
#include "base/cpu_cached.h"
#include "comm/proc_alive.h"
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

/* A failure notice: rank `rank` of group `gid` failed it (status, message);
 * dead: the world rank whose death it reports (-1: none; see "dead peers"). */
#define NOTE_TAG 1
#define NOTE_MSG_CAP 768
typedef struct {
    uint64_t gid;
    int32_t st, rank;
    int32_t dead, pad;
    uint64_t done; /* the collectives its sender had completed on the group */
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
static inline int reply_tag(uint64_t gid) { return 1000 + (int)(gid % 30000u); }

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
    /* Collectives completed on this rank (colls_done), and by the rank
     * whose notice put the group down when it failed it (down_done; 0 for
     * this rank's own failure). A notice may overtake the last messages of
     * a collective its sender completed (another communicator): this
     * rank's posted collective number colls_done then still completes, and
     * is waited for, not failed (bounded by the timeout), so that no rank
     * fails an operation that succeeded on the others. */
    _Atomic uint64_t colls_done;
    uint64_t down_done;
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
    int dead_world;          /* the dead peer this rank found (world rank; -1: none), for the notice */
    double yield_off_until;  /* dt__cpu_yield: no yielding before this time */
} mpi_ctx;


/* The worker thread of a group with DT_MPI_BLOCKING=1 (mpi_coll.c run_on_worker;
 * mpi_free ends it). */
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

/* backend_mpi.c */
extern int dt__mpi_stuck;
extern _Atomic int dt__mpi_dead_seen;
void dt__mpi_abandon(MPI_Request rq);
extern int dt__mpi_thread_multiple;
extern pthread_mutex_t dt__mpi_mu;
int dt__mpi_note_sends_done(mpi_ctx *m);
void dt__mpi_finalize_at_exit(void);
void dt__mpi_free(void *ctx);
void dt__mpi_abort(void *ctx, dt_status st, const char *msg);

/* mpi_traffic.c: the traffic slot (Open MPI's monitoring counters through
 * MPI_T); start binds the counters once MPI is up (first group). */
void dt__mpi_traffic_start(void);
dt_status dt__mpi_traffic(void *ctx, uint64_t *sent, int n);
/* Without the layer: bytes sent on TCP connections to other machines. */
dt_status dt__mpi_traffic_off_node(void *ctx, uint64_t *left);

/* mpi_fail.c */
extern MPI_Comm dt__mpi_ctl;
extern MPI_Request dt__mpi_note_rq;
extern pthread_mutex_t dt__mpi_note_mu;
void dt__mpi_send_note(mpi_ctx *m);
extern MPI_Request dt__mpi_query_rq;
void dt__mpi_note_take_locked(void);
void dt__mpi_note_register(mpi_ctx *m);
void dt__mpi_note_unregister(mpi_ctx *m, int finalized);
extern mpi_ctx *dt__mpi_unsent;
extern _Atomic int dt__mpi_nunsent;
extern pthread_mutex_t dt__mpi_unsent_mu;
void dt__mpi_lock(void);
void dt__mpi_unlock(void);
void dt__mpi_nap(long ns);
int dt__mpi_set_down(mpi_ctx *m, dt_status st, const char *msg, uint64_t done);
dt_status dt__mpi_down_error(mpi_ctx *m);
int dt__mpi_group_down(mpi_ctx *m, int poll);
void dt__mpi_procs_gather(void);
int dt__mpi_peer_died(mpi_ctx *m, const dt_coll *c);
int dt__mpi_down_ends(mpi_ctx *m, const dt_coll *c, int poll);
dt_status dt__mpi_wait_req(mpi_ctx *m, MPI_Request *rq, const dt_coll *c, MPI_Status *st);

/* mpi_coll.c */
dt_status dt__mpi_err(int code, const char *what, const dt_coll *c);
MPI_Datatype dt__mpi_type(dt_dtype dt);
int dt__mpi_fits_int(size_t n);
dt_status dt__mpi_run(void *ctx, const dt_coll *c);

/* mpi_p2p.c */
dt_status dt__mpi_p2p_start(void *ctx, const dt_coll *c, void **op);
dt_status dt__mpi_p2p_test(void *ctx, void *op, int *progressed);
void dt__mpi_p2p_idle(void *ctx, int round, double max_s);

#endif
