/* src/comm/pg.h — the group layer's private structures (pg.c, req.c,
 * coll.c, env.c, registry.c). Backends do not include this. */
#ifndef DT_COMM_PG_H
#define DT_COMM_PG_H

#include "comm/backend.h"
#include "comm/flight.h"

#include <pthread.h>
#include <stdatomic.h>

#define DT__MSG_CAP DT_PG_MSG_CAP

/* Where the ranks came from (decides the default backend). */
typedef enum {
    DT__SRC_PARAMS = 0,
    DT__SRC_DTRAIN,
    DT__SRC_TORCHRUN,
    DT__SRC_OMPI,
    DT__SRC_PMI,
    DT__SRC_MV2,
    DT__SRC_SLURM,
    DT__SRC_NONE
} dt__rank_source;

typedef struct dt__rank_env {
    int rank, size, local_rank, local_size;
    dt__rank_source src;
    char job_id[160];
    char master_addr[256];
    int master_port;
} dt__rank_env;

/* Rank discovery (env.c): params first, then the environment in the order
 * of comm.h. */
dt_status dt__rank_discover(const dt_pg_params *p, dt__rank_env *out);
const char *dt__rank_source_name(dt__rank_source s);

/* Registry (registry.c): make sure the built-ins are registered. */
void dt__registry_init(void);
/* Copy the table registered under name into *out under the registry's lock;
 * 0 if none is. */
int dt__backend_copy(const char *name, dt_backend_ops *out);

struct dt_req {
    dt_pg *pg;
    dt_coll c;
    _Atomic int state;    /* DT_INPROGRESS, then the final status */
    int freed;            /* user called dt_req_free (under pg->mu) */
    dt_req *next;         /* queue link */
    size_t *own_displs;   /* allgatherv displacements we computed */
    uint64_t fr_id;       /* its flight recorder entry */
    /* Forms the group layer builds from a backend operation (the padded
     * reduce_scatterv and alltoallv): pre runs on the executor before the
     * backend's run (it may run backend operations itself and rewrite c;
     * an error fails the request), post after the run succeeded; xf is
     * their state, freed with the request. */
    dt_status (*pre)(dt_req *r);
    void (*post)(dt_req *r);
    void *xf;
    void (*xf_free)(void *xf); /* NULL: free(xf); may be set by pre */
    int pre_done;         /* set by pre when it did the whole operation itself
                           * (the hierarchical all-reduce): the backend's run
                           * is skipped, post still runs */
    char msg[DT__MSG_CAP];
};

struct dt_pg {
    int rank, size, local_rank, local_size;
    const dt_backend_ops *ops; /* = &ops_copy */
    dt_backend_ops ops_copy;   /* the table at creation (registry may change) */
    void *ctx;
    char backend[64];
    double timeout_s;
    int timeout_src;           /* where timeout_s came from: 0 the default, 1 $DT_COMM_TIMEOUT, 2 params */
    size_t eager_bytes;        /* blocking sends up to this size are buffered ($DT_P2P_EAGER_KB) */
    int check;
    dt_pg *parent;
    int children;              /* live subgroups */

    pthread_mutex_t mu;        /* guards everything below */
    pthread_cond_t cv;         /* any request completed / queue changed (waiters of requests) */
    pthread_cond_t pcv;        /* the progress thread's own: work it may take (dt__pg_kick_locked);
                                * a completion does not wake it */
    dt_req *head, *tail;       /* posted, not yet started */
    int busy;                  /* an executor is inside ops->run */
    int thread_on, stop;
    pthread_t thread;
    uint64_t seq;              /* next collective sequence number */
    uint64_t *p2p_seq;         /* [2*size]: next send seq to r, next recv seq from r */
    int pending;               /* posted and not completed */
    struct dt__p2p_slot *bv;   /* the batch of send/recv in flight (req.c), touched only by the
                                * executor that holds busy, so it outlives one executor */
    int bn, bcap;
    int drivers;               /* threads inside an unbounded dt_req_wait: they run the queue
                                * themselves, the progress thread leaves it to them */
    int spin;                  /* -1 unknown; 1: every thread of this machine's ranks has a core,
                                * so a waiter that runs a batch polls instead of napping */
    _Atomic int waiting;       /* threads blocked in dt_req_wait on this group (read without mu by
                                * the progress thread's backend waits: dt__comm_may_poll) */
    dt_status fail_st;         /* DT_OK while healthy */
    char fail_msg[DT__MSG_CAP];

    pthread_mutex_t mem_mu;    /* serialises mem_alloc/mem_free */

    dt__flight fr;             /* the flight recorder (flight.c; ring and labels under mu) */

    struct dt__hier *hier;     /* dt_pg_hierarchical: the two levels; else NULL */
    dt_pg_topo topo;           /* dt_pg_hierarchical: the nodes; else zeros */
    int *node_of;              /* [size]: each rank's node, once dt_pg_topology ran (under mu);
                                * else NULL (dt_pg_traffic_read's cross-node split) */
};

/* Post a normalised operation (coll.c → req.c); takes ownership of
 * own_displs. start_thread: start the progress thread if not running. */
dt_status dt__pg_post(dt_pg *pg, const dt_coll *c, size_t *own_displs, int start_thread,
                      dt_req **out);
/* dt__pg_post with pre/post hooks and their state (taken over, freed with
 * the request, also on error). */
dt_status dt__pg_post_ex(dt_pg *pg, const dt_coll *c, size_t *own_displs, dt_status (*pre)(dt_req *),
                         void (*post)(dt_req *), void *xf, int start_thread, dt_req **out);
/* A blocking call: run c on this thread when the engine is idle (no
 * request allocated), else queue it and wait. */
dt_status dt__pg_run_blocking(dt_pg *pg, const dt_coll *c);
/* Run queued requests on this thread until the queue is empty and no
 * executor is busy (mu held). */
void dt__pg_drain_locked(dt_pg *pg);
/* Wake the progress thread when there is work it may take now (queued or
 * batched requests, no executor busy, no waiter driving) or it must stop
 * (mu held). */
void dt__pg_kick_locked(dt_pg *pg);
/* Drain, then stop and join the progress thread. */
void dt__pg_engine_stop(dt_pg *pg);

/* The two levels of a dt_pg_hierarchical group. */
struct dt__hier {
    dt_pg *intra;            /* this node's ranks, in group order */
    dt_pg *inter;            /* the cross group; NULL on ranks outside it (unequal nodes) */
    size_t *counts, *displs; /* allgatherv layout scratch (intra size each) */
    int *slot;               /* slot[r] = local(r) * nnodes + node(r), W entries */
    size_t chunk_bytes;      /* all-reduce pipeline chunk ($DT_HIER_CHUNK_KB) */
};

/* Hierarchical reduce-scatter (reduce_scatter_hier.c), homogeneous nodes
 * only: post c (checked, normalised) as intra then inter reduce-scatter. */
dt_status dt__hier_reduce_scatter(dt_pg *pg, const dt_coll *c, dt_req **req);

/* Hierarchical all-reduce (allreduce_hier.c): post c (a checked, normalised
 * all-reduce on a group with pg->hier) as the two-level composition; req
 * NULL = blocking. dt__hier_free releases the two subgroups (before pg). */
dt_status dt__hier_allreduce(dt_pg *pg, const dt_coll *c, dt_req **req);
void dt__hier_free(struct dt__hier *h);

#endif /* DT_COMM_PG_H */
