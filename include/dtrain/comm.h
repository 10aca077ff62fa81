/* dtrain/comm.h — process groups, asynchronous collectives, backends.
 *
 * Overview
 * --------
 * A process group (dt_pg) is the set of ranks that take part in collectives.
 * dt_pg_init() builds one from explicit parameters or from the environment a
 * launcher left behind, and picks a backend:
 *
 *   self   a group of one (world size 1);
 *   shm    ranks on one machine talking through a shared-memory segment;
 *   mpi    Open MPI (built when MPI is found), for ranks across machines;
 *   NAME   any backend registered with dt_backend_register().
 *
 * Rank discovery, first source that is present wins:
 *   1. explicit dt_pg_params (rank >= 0 and world_size > 0);
 *   2. dtrain's own DT_RANK, DT_WORLD_SIZE, DT_LOCAL_RANK,
 *      DT_LOCAL_WORLD_SIZE, DT_JOB_ID (set by `dtrain run`);
 *   3. torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *      MASTER_ADDR, MASTER_PORT;
 *   4. Open MPI's OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE;
 *   5. PMI_RANK / PMI_SIZE with MPI_LOCALRANKID / MPI_LOCALNRANKS (Hydra),
 *      then MV2_COMM_WORLD_* (MVAPICH2);
 *   6. SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID inside an srun step;
 *   7. nothing: rank 0 of a group of 1.
 * Inconsistent values (rank >= size, local rank >= local size, a rank
 * without a size, DT_RANK disagreeing with RANK, text that is not a number)
 * are an error naming the variables, never a guess.
 *
 * The backend string (params.backend, else $DT_BACKEND, else the default) is
 * either a name ("shm") or a per-device list ("cpu:shm,cuda:nccl"); only the
 * cpu entry is used today, other devices are parsed and kept for later. The
 * default is `self` for world size 1, `mpi` when the ranks came from an MPI
 * launcher (sources 4-6) and the MPI backend is built, otherwise `shm` when
 * every rank is on this machine.
 *
 * Collectives work on raw buffers (pointer, element count, dt_dtype) like
 * MPI and NCCL. Every collective is asynchronous: dt_pg_<coll>_async() posts
 * it and returns a request; dt_pg_<coll>() is the blocking wrapper (post +
 * wait forever + free). Supported dtypes: f32, f64, f16, bf16, i32, i64, u8;
 * f16 and bf16 reduce with f32 accumulation and move as 16 bits on every
 * backend (mpi: an all-to-all of 16-bit chunks, each rank's chunk summed in
 * f32 in rank order and rounded once, an all-gather). Reductions: sum, avg, max, min,
 * prod (avg of integers truncates toward zero).
 *
 * Lifecycle rules (they hold for every request and every group):
 *  - Requests run in the order they were posted, on every rank the same
 *    order; all ranks of a group must post the same collectives in the same
 *    order (send/recv are matched per pair, in order). A per-group progress
 *    engine executes them: a background thread, started on the first
 *    asynchronous post, runs queued requests while the caller computes;
 *    blocking calls and dt_req_wait(req, -1) run queued requests on the
 *    calling thread when the engine is idle, so a blocking collective costs
 *    no thread hand-off.
 *  - Buffers passed to a collective belong to the request until it completes:
 *    do not read or write them (or free them) before dt_req_test/wait says so.
 *  - dt_req_free() may be called at any time; a request freed before it
 *    completed still runs and releases itself when it finishes.
 *  - A failure (timeout, mismatch, a dead peer) fails the request and marks
 *    the group failed: every pending and every later collective on it fails
 *    with the same status and message. Free the group and start over (the
 *    launcher restarts the job).
 *  - dt_pg_free() waits for posted requests to finish, then releases the
 *    group. Free subgroups before their parent.
 *  - Exception to one-at-a-time: consecutive send/recv requests run as one
 *    batch, all in flight together (NCCL's grouped point to point), so any
 *    pattern of posted sends and receives completes whatever its size.
 *  - Concurrency is per group: each group has its own engine, so requests
 *    on different groups make progress at the same time. For a second
 *    stream over the same ranks (an all-gather prefetch while a
 *    reduce-scatter runs) use dt_pg_dup(); for mesh rows and columns,
 *    dt_pg_split(). The posting-order rule holds within each group.
 *  - A group may be used from several threads, but posts must then be
 *    ordered by the caller (the posting order is the collective order).
 *
 * Failures are errors, never hangs:
 *  - every operation has a timeout (params.timeout_s, else $DT_COMM_TIMEOUT
 *    in seconds, finite and > 0, default 300): DT_ERR_TIMEOUT names the operation, its
 *    sequence number, the ranks that did not arrive (the flight recorder's
 *    verdict, below) and the timeout and where it came from; under mpi,
 *    a subgroup's creation is bounded by it too. The start-up (every rank
 *    joining: MPI_Init under mpirun, the shared segment or the rendezvous
 *    under shm) is bounded by $DT_INIT_TIMEOUT (seconds, finite and > 0),
 *    else by the same timeout (a slow start on a loaded or containerised
 *    machine need not share the collectives' short limit);
 *  - ranks that post different collectives at the same sequence number
 *    (operation, count, dtype, reduction or root) all get DT_ERR_MISMATCH
 *    describing both sides (on by default; $DT_COMM_CHECK=0 turns it off);
 *  - a rank that dies makes every peer's pending and later collectives fail
 *    with DT_ERR_PEER_FAILED naming it, within a few seconds (shm; mpi: the
 *    ranks on the dead one's machine see its process gone and tell the
 *    others; start mpirun with `--mca odls_base_sigkill_timeout 10`, or its
 *    SIGKILL of the survivors may come first);
 *  - a failure on one rank fails the group on the others too: their pending
 *    and later operations on it fail at once with that rank's status and
 *    message (shm: the shared abort record; mpi: a notice to each rank,
 *    which their waits poll for; a blocking collective of $DT_MPI_BLOCKING=1
 *    runs on a worker thread and is interrupted too, except when MPI gives
 *    only MPI_THREAD_SERIALIZED). This is how a protocol above
 *    the group that breaks off midway (a pipeline schedule) stops its peers
 *    without a wait for the timeout.
 *
 * The flight recorder (always on; see "flight recorder" below): every group
 * keeps a ring of its last operations on each rank (sequence number, kind,
 * bytes, dtype, peer, posted/started/completed times and the caller's
 * label, set with dt_pg_set_label). When an operation times out, the rank
 * reads the other ranks' state (shm: from the shared segment, so a stopped
 * rank is read too; mpi: it asks each peer point to point, waiting at most
 * $DT_FLIGHT_WAIT seconds, default 2) and appends the verdict to the error:
 *     allreduce(count=29034, f32, avg) #4711 timed out after 10 s on rank 0:
 *     rank 1 did not arrive; flight recorder: rank 1 has not posted
 *     allreduce #4711 (DDP bucket 3, step 812); it last completed
 *     reduce_scatter #4710 at 12.31 s; ranks 0, 2 wait since 12.35 s
 * (times: seconds since the first group of the reporting process was
 * created). One rank logs the whole analysis, one line per rank; on any
 * failure of a group every rank that can still run logs the group's last
 * operations and, with dt_flight_set_dir (the CLI passes --save) or
 * $DT_FLIGHT_DIR, writes its whole ring to DIR/flight-rank<R>-g<ID>.json.
 *
 * In-place operation: pass send = NULL (DT_IN_PLACE), or the aliasing that
 * MPI/NCCL use: send == recv for allreduce/reduce/broadcast, send == recv +
 * rank*count elements for allgather, recv == send + rank*count elements for
 * reduce_scatter.
 *
 * Strided layouts: dt_pg_allgather_blocks, dt_pg_reduce_scatter_blocks and
 * dt_pg_alltoall_blocks read and write each rank's block as runs of a
 * strided box (dt_pg_block) in place, e.g. a gather along an inner dim of
 * a row-major tensor straight into the full tensor:
 *     dt_pg_block b[W];                       // rank r holds [A, len_r, B]
 *     for (int r = 0; r < W; r++)             //   of [A, n, B] at st_r
 *         b[r] = (dt_pg_block){st[r] * B, A, len[r] * B, n * B};
 *     dt_pg_allgather_blocks(pg, mine, full, b, DT_F32);
 *
 * Shared buffers: dt_pg_alloc() returns memory that every rank of the group
 * on this machine can read (for shm, the group's segment). Collectives whose
 * buffers come from dt_pg_alloc() on every rank take a zero-copy path that
 * reduces straight out of the peers' buffers; any other memory works too
 * and is copied through the segment.
 *
 * Usage
 * -----
 *     dt_pg *pg;
 *     if (dt_pg_init(NULL, &pg) < 0)               // from the environment
 *         fail(dt_last_error());
 *     float *g = dt_pg_alloc(pg, n * sizeof(float));
 *     ... fill g ...
 *     dt_req *rq;
 *     dt_pg_allreduce_async(pg, DT_IN_PLACE, g, n, DT_F32, DT_REDUCE_AVG, &rq);
 *     ... compute while it runs ...
 *     if (dt_req_wait(rq, -1) < 0)
 *         fprintf(stderr, "%s\n", dt_req_message(rq));
 *     dt_req_free(rq);
 *     dt_pg_dealloc(pg, g);
 *     dt_pg_free(pg);
 *
 * A 2 x (W/2) mesh, a prefetch channel, and a ring shift of any size:
 *     dt_pg *row, *col, *prefetch;
 *     int r = dt_pg_rank(pg), cols = dt_pg_size(pg) / 2;
 *     dt_pg_split(pg, r / cols, r % cols, &row);   // ranks of my row
 *     dt_pg_split(pg, r % cols, r / cols, &col);   // ranks of my column
 *     dt_pg_dup(pg, &prefetch);
 *     dt_req *rs, *ag;
 *     dt_pg_reduce_scatter_async(pg, grads, shard, n, DT_F32, DT_REDUCE_AVG, &rs);
 *     dt_pg_allgather_async(prefetch, next_shard, next_full, m, DT_F32, &ag);
 *     ...                                          // both run at once
 *     int W = dt_pg_size(pg);
 *     dt_pg_sendrecv(pg, out, n, (r + 1) % W, in, n, (r + W - 1) % W, DT_F32);
 *     dt_pg_free(prefetch); dt_pg_free(col); dt_pg_free(row);   // before pg
 *
 * Two levels across machines (Horovod's hierarchical all-reduce):
 *     dt_pg *h;
 *     dt_pg_hierarchical(pg, &h);       // collective; nodes by host + netns
 *     dt_pg_allreduce(h, DT_IN_PLACE, g, n, DT_F32, DT_REDUCE_AVG);
 *     dt_pg_free(h);                    // before pg
 *
 * Environment variables read here: DT_BACKEND, DT_COMM_TIMEOUT, DT_INIT_TIMEOUT,
 * DT_COMM_CHECK, DT_SIM_LOCAL_SIZE (dt_pg_topology), DT_HIER_CHUNK_KB
 * (dt_pg_hierarchical), and those of rank
 * discovery above. The shm backend's own
 * (DT_SHM_ALGO, DT_SHM_HEAP_MB, DT_SHM_STAGING_KB, DT_SHM_SLOT_BYTES,
 * DT_SHM_SPIN) are described in src/comm/shm/shm.h; the DT_SHM_ALGO syntax
 * (per-collective size ranges → direct | ring | rechd | tree) in
 * src/comm/shm/shm_select.c, e.g.
 *     DT_SHM_ALGO="allreduce:0-64K:direct,64K-inf:ring;broadcast:tree"
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A process group (opaque). */
typedef struct dt_pg dt_pg;
/* A posted collective (opaque). */
typedef struct dt_req dt_req;

/* Pass as the send buffer to operate in place. */
#define DT_IN_PLACE NULL

/* Reductions. */
typedef enum dt_reduce_op {
    DT_REDUCE_SUM = 0,
    DT_REDUCE_AVG,   /* sum / world size; integers truncate toward zero */
    DT_REDUCE_MAX,
    DT_REDUCE_MIN,
    DT_REDUCE_PROD,
    DT_REDUCE_OP_COUNT
} dt_reduce_op;
/* "sum", "avg", ... ("?" if invalid). */
DT_API const char *dt_reduce_op_name(dt_reduce_op op);

/* Kinds of operations (what a backend is asked to do). */
typedef enum dt_coll_kind {
    DT_COLL_ALLREDUCE = 0,
    DT_COLL_REDUCE,
    DT_COLL_BROADCAST,
    DT_COLL_ALLGATHER,
    DT_COLL_ALLGATHERV,
    DT_COLL_REDUCE_SCATTER,
    DT_COLL_GATHER,
    DT_COLL_SCATTER,
    DT_COLL_ALLTOALL,
    DT_COLL_BARRIER,
    DT_COLL_SEND,
    DT_COLL_RECV,
    DT_COLL_KIND_COUNT
} dt_coll_kind;
/* "allreduce", "reduce_scatter", ... ("?" if invalid). */
DT_API const char *dt_coll_kind_name(dt_coll_kind k);

/* ---- process groups ------------------------------------------------- */

typedef struct dt_pg_params {
    int rank;             /* this rank; -1 = from the environment (default -1) */
    int world_size;       /* ranks in the group; -1 = from the environment (default -1) */
    int local_rank;       /* rank among this machine's ranks; -1 = environment, else rank (default -1) */
    int local_world_size; /* ranks on this machine; -1 = environment, else world_size (default -1) */
    const char *backend;  /* backend string ("shm", "cpu:shm,cuda:nccl"); NULL = $DT_BACKEND, else automatic (default NULL) */
    const char *job_id;   /* job identifier shared by all ranks; NULL = $DT_JOB_ID etc. (default NULL) */
    const char *master_addr; /* rendezvous host for torchrun-style launches; NULL = $MASTER_ADDR (default NULL) */
    int master_port;      /* rendezvous TCP port; 0 = $MASTER_PORT (default 0) */
    double timeout_s;     /* per-operation timeout in seconds; 0 = $DT_COMM_TIMEOUT, else 300 (default 0) */
    int check;            /* cross-rank collective fingerprint check: 1 on, 0 off, -1 = $DT_COMM_CHECK, else on (default -1) */
    /* Polled while dt_pg_init waits for the other ranks (a few times a second): nonzero stops the start-up
       with DT_ERR_CANCELED, the message naming the ranks still awaited, and whatever it made (a shared
       segment, a socket) is released. A program that blocks SIGINT returns "one is pending" here (NULL:
       never interrupted; default NULL) */
    int (*interrupted)(void *arg);
    void *interrupted_arg; /* passed to interrupted (default NULL) */
} dt_pg_params;

/* Defaults: everything from the environment. */
DT_API dt_pg_params dt_pg_params_default(void);

/* Create the group. p may be NULL (= dt_pg_params_default()). Collective:
 * every rank of the group must call it. Several groups may live at once
 * (even with the same job id) if every rank creates them in the same order. On success *out owns the group
 * (free with dt_pg_free). Errors: DT_ERR_INVALID_ARG (inconsistent ranks, a
 * bad backend string), DT_ERR_NOT_FOUND (unknown backend), DT_ERR_TIMEOUT
 * (peers did not show up), DT_ERR_IO. */
DT_API dt_status dt_pg_init(const dt_pg_params *p, dt_pg **out);

/* The world size the launcher's environment describes (1 when no launcher
 * variables are set), read and validated exactly as dt_pg_init reads them
 * (strict numbers, rank < size, consistent sources) but without creating a
 * group: a program decides with it whether to start distributed at all.
 * Errors: DT_ERR_INVALID_ARG naming the variable ("WORLD_SIZE=abc"). */
DT_API dt_status dt_pg_env_world_size(int *out);

/* Wait for the group's posted requests, then release it. NULL is a no-op.
 * Not collective, but peers still running collectives with this rank will
 * see it as failed: call it after the last collective has completed. */
DT_API void dt_pg_free(dt_pg *pg);

/* Make a subgroup of the ranks listed (parent ranks, in the new rank order;
 * no duplicates). Collective over the parent: every parent rank calls it
 * with the same list, after all its earlier parent requests were posted.
 * Members get the new group in *out, others get NULL. The subgroup uses the
 * parent's backend; free it before the parent. */
DT_API dt_status dt_pg_subgroup(dt_pg *parent, const int *ranks, int n, dt_pg **out);

/* For launchers, after a job's processes have ended: remove what its
 * groups left behind, through every registered backend's job_cleanup slot
 * (dt_backend_ops; backends without one leave nothing). The shm backend
 * removes the job's shared memory: it unlinks its segment as soon as every
 * rank has attached, so only a rank that crashed during start-up leaves
 * one. *removed gets the number of objects removed over all backends (0
 * or 1 with the built-in ones). Errors: DT_ERR_INVALID_ARG (NULL
 * argument), DT_ERR_IO, or a backend's error (the backends after it are
 * not asked). */
DT_API dt_status dt_pg_job_cleanup(const char *job_id, int *removed);

/* For launchers, before and after a job: through every registered
 * backend's orphan_cleanup slot (dt_backend_ops), remove what jobs whose
 * processes are all dead left behind; *removed gets the number removed over
 * all backends, a backend's error stops the walk and is returned. The shm
 * backend removes the segments of any job whose owners are all dead (a
 * launcher killed by SIGKILL while its ranks were still rendezvousing
 * leaves one). Only regular files in /dev/shm named
 * like the backend's segments, owned by this user, are considered, never
 * through a symlink; a segment is removed only if its creator and the
 * creator's parent (the launcher) have both exited (pid and start time are
 * checked, so a reused pid counts as dead); a segment still being created or
 * of any other format is kept. *removed gets the number removed.
 * Errors: DT_ERR_INVALID_ARG (NULL argument). */
DT_API dt_status dt_pg_orphan_cleanup(int *removed);

/* Split the group as MPI_Comm_split does. Collective over pg: every rank
 * calls it, after all its earlier requests on pg were posted. Ranks giving
 * the same color >= 0 form one new group, ordered by key, then by their
 * rank in pg; a rank giving color < 0 (DT_PG_NO_COLOR) gets *out = NULL.
 * The new groups use pg's backend and need no new rendezvous (shm: one
 * segment per new group, its name passed through pg; mpi: MPI_Comm_split);
 * each has its own progress engine, so its requests run concurrently with
 * pg's and with the other new groups'. Free them before pg.
 * Errors: DT_ERR_NULL, DT_ERR_UNSUPPORTED (backend without subgroups),
 * the collective's errors. */
#define DT_PG_NO_COLOR (-1)
DT_API dt_status dt_pg_split(dt_pg *pg, int color, int key, dt_pg **out);

/* A second channel over the same ranks in the same order (MPI_Comm_dup;
 * = dt_pg_split(pg, 0, rank)). Requests on pg and on the duplicate make
 * progress at the same time: post an all-gather prefetch on one while a
 * reduce-scatter runs on the other. The posting-order rule holds per
 * group. Memory from dt_pg_alloc(pg) works on the duplicate but is copied
 * through its own segment there (zero copy needs the group's own alloc).
 * Collective over pg; free the duplicate before pg. */
DT_API dt_status dt_pg_dup(dt_pg *pg, dt_pg **out);

/* ---- nodes and hierarchical all-reduce ------------------------------------
 * Which ranks share a machine ("node"): every rank contributes a node key,
 * its host name together with its network namespace (so that the namespaces
 * of scripts/netbed.sh count as machines, as they do for Open MPI), and the
 * keys are all-gathered. $DT_SIM_LOCAL_SIZE=S instead makes nodes of S
 * consecutive ranks (rank / S; the last node may be smaller): hierarchical
 * code can then be tested on one machine without namespaces. */
typedef struct dt_pg_topo {
    int node;        /* this rank's node, 0..nnodes-1, numbered by each node's lowest rank */
    int nnodes;      /* number of nodes */
    int local_rank;  /* place among its node's ranks, in group-rank order */
    int local_size;  /* ranks on this rank's node */
    int homogeneous; /* 1 when every node has local_size ranks */
    int simulated;   /* 1 when $DT_SIM_LOCAL_SIZE made the nodes */
} dt_pg_topo;

/* Find the nodes of pg (one small all-gather). Collective over pg.
 * Errors: DT_ERR_NULL, DT_ERR_INVALID_ARG ($DT_SIM_LOCAL_SIZE not a count
 * >= 1), the all-gather's errors. */
DT_API dt_status dt_pg_topology(dt_pg *pg, dt_pg_topo *out);

/* ---- bytes on the wire -----------------------------------------------------
 * The backend counts the bytes this rank sends to each peer, as its
 * algorithms move them, and dt_pg_traffic reads the counters: how much left
 * this rank, and how much of it left the node (the number a multi-machine
 * job's network sees). The counts are the process's, per peer: every group
 * of this process on the same backend instance (pg, the group it was split
 * from, their subgroups, hierarchical and duplicate groups) adds to them,
 * so reading the world group after a training step gives the step's whole
 * traffic. Read twice and subtract for the bytes of what ran in between.
 *
 *   dt_pg_topo t; dt_pg_topology(world, &t);   // once: peers' nodes known
 *   dt_pg_traffic a, b;
 *   dt_pg_traffic_read(world, &a, NULL, 0);
 *   ... a step ...
 *   dt_pg_traffic_read(world, &b, NULL, 0);
 *   // b.sent - a.sent: bytes sent; b.sent_cross_node - a.sent_cross_node
 *
 * What each backend counts:
 *   self  nothing to count (every field 0, counted = 1).
 *   shm   the payload bytes one rank's memory hands to another's: a peer
 *         reading this rank's input or partial result, this rank writing
 *         into a peer's buffer, a send through the pair's channel. Staging
 *         copies inside one rank are not traffic. Exact, and the same on
 *         every run: an all-reduce of N f32 values on W ranks by the direct
 *         algorithm (the default for large messages) sends 2 (W-1)/W * 4N
 *         bytes per rank (chunks cut as the algorithm cuts them). One
 *         relaxed atomic add per copied block; nothing is exchanged to read.
 *   mpi   per peer: Open MPI's own counters of its point-to-point layer
 *         (collectives included: they are made of messages), read through
 *         MPI_T, when the job was started with the monitoring layer on:
 *         `mpirun --mca pml_monitoring_enable 1 ...` (payload bytes).
 *         Otherwise, per machine (per_peer = 0): the kernel's count of the
 *         bytes this process sent on its TCP connections to other machines
 *         (TCP_INFO's bytes_sent of every connected TCP socket whose peer
 *         address is not this socket's own or loopback: MPI's TCP transport
 *         between nodes, TCP payload with retransmissions, no headers), so
 *         sent = sent_cross_node = what left the node; traffic inside the
 *         node (shared memory) is not seen. No TCP socket counted, no
 *         layer: counted = 0.
 *   user backends: the optional `traffic` slot of dt_backend_ops.
 * Counting never communicates and costs nothing until read; reading is a
 * local call (not collective) that any thread may make. On shm the bytes a
 * peer pulls from this rank are counted when the peer pulls them, which may
 * be after this rank completed the operation: read after a barrier (or the
 * next collective of the group) for an operation's complete count. */
typedef struct dt_pg_traffic {
    int counted;              /* 1: the backend counts (the fields below are valid); 0: it does not */
    int nodes_known;          /* 1: sent_cross_node is valid (dt_pg_topology ran on pg, or the
                               * backend counts what leaves the machine itself) */
    int per_peer;             /* 1: counted per peer (per_peer[] and sent cover all traffic);
                               * 0: only the bytes that left the machine are known (per_peer[]
                               * all 0, sent = sent_cross_node) */
    uint64_t sent;            /* bytes this process sent to the other ranks of pg, all groups */
    uint64_t sent_cross_node; /* of which to ranks on another node than this rank's */
} dt_pg_traffic;

/* Read this rank's byte counters (see "bytes on the wire"). per_peer, when
 * not NULL, gets n >= dt_pg_size(pg) entries: per_peer[r] = bytes sent to
 * rank r of pg (0 for this rank). A backend that does not count gives
 * counted = 0 and zeros (DT_OK). Errors: DT_ERR_NULL (pg or out),
 * DT_ERR_INVALID_ARG (per_peer with n < the group's size), the backend's. */
DT_API dt_status dt_pg_traffic_read(dt_pg *pg, dt_pg_traffic *out, uint64_t *per_peer, int n);

/* A group over pg's ranks (like dt_pg_dup) whose all-reduce is hierarchical
 * (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE): intra-node
 * reduce-scatter, all-reduce of each local shard among the ranks of the
 * other nodes that hold the same shard (the "cross" group: one rank per
 * node, same local rank), intra-node all-gather. Per node only the data
 * volume of one all-reduce crosses the network, shared by the node's ranks,
 * instead of every rank's full share. With equal nodes the all-reduce runs
 * in chunks of $DT_HIER_CHUNK_KB KiB (default 4096; the same on every
 * rank, else an error here): the cross step of each chunk is a ring
 * (reduce-scatter, all-gather) that sends 2 (N-1)/N of the shard each way
 * (N nodes), every local rank's ring at once, while the intra-node steps
 * of the neighbouring chunks run over the node's shared memory; so a
 * node's link carries 2 (N-1)/N of the data in each direction, the minimum
 * for any all-reduce over N nodes. With equal nodes its reduce-scatter
 * is two-level too (ZeRO-2/3's gradients): the input blocks are reordered
 * node-major into scratch (W * count elements while it runs), reduce-
 * scattered within the node, then among the cross group. Every other
 * collective on the group runs flat, as on a dup. With nodes of unequal size the inter-node step
 * runs on local rank 0 of each node only (reduce to it, all-reduce among
 * them, broadcast), as Horovod does; with one node, or one rank per node,
 * the all-reduce stays flat (the two-level one would only add steps).
 *
 * Results: max/min and integer sums are exact and equal the flat ones;
 * floating-point sums are added in a different order than the flat
 * all-reduce (per node first, then across nodes), so each element differs
 * from the flat result by at most 2 (W-1) u sum_r |x_r| (u = unit roundoff
 * of the dtype; both are within (W-1) u sum|x| of the exact sum), and is
 * bit-identical when the partial sums are exact. avg = sum / W at the end.
 * f16/bf16 round once inside the node and once per ring step across nodes
 * (N-1 times).
 *
 * Collective over pg (it runs dt_pg_topology and three dt_pg_split calls);
 * *out owns the group and its two subgroups: dt_pg_free(*out) releases all
 * three, before pg. Errors: those of dt_pg_topology and dt_pg_split;
 * DT_ERR_INVALID_ARG ($DT_HIER_CHUNK_KB not a count in 1..1048576 on some
 * rank) and DT_ERR_MISMATCH (different values on different ranks), on
 * every rank. */
DT_API dt_status dt_pg_hierarchical(dt_pg *pg, dt_pg **out);
/* 1 when pg's all-reduce runs the two-level algorithm (a group from
 * dt_pg_hierarchical over more than one node with several ranks on some
 * node), else 0. */
DT_API int dt_pg_is_hierarchical(const dt_pg *pg);
/* The topology a group from dt_pg_hierarchical was built on; for other
 * groups all zeros. NULL-safe. */
DT_API dt_pg_topo dt_pg_hier_topology(const dt_pg *pg);

/* This rank, the group size, the rank and size on this machine. */
DT_API int dt_pg_rank(const dt_pg *pg);
DT_API int dt_pg_size(const dt_pg *pg);
DT_API int dt_pg_local_rank(const dt_pg *pg);
DT_API int dt_pg_local_size(const dt_pg *pg);
/* Backend name ("shm"). Borrowed; valid while pg lives. */
DT_API const char *dt_pg_backend(const dt_pg *pg);
/* DT_OK while healthy; after a failure its status (and dt_last_error()
 * gets the message). */
DT_API dt_status dt_pg_status(const dt_pg *pg);
/* The longest message a group keeps for its failure (dt_pg_fail, a failed
 * operation's), with the terminating NUL; longer ones are cut. */
#define DT_PG_MSG_CAP 768
/* Fail the group on behalf of its user: a protocol above it (a pipeline
 * schedule) broke off midway, and its peers must neither wait for the rest
 * nor match later messages with the abandoned ones. The group's pending and
 * later operations fail with st and msg (copied, at most DT_PG_MSG_CAP - 1 bytes) on this rank, and the
 * backend tells the other ranks (its abort slot: shm writes the abort
 * record their waits check; mpi sends a notice their waits poll for), so
 * their operations fail too instead of hanging. The first failure wins.
 * A no-op for pg NULL or st >= 0. Returns st. */
DT_API dt_status dt_pg_fail(dt_pg *pg, dt_status st, const char *msg);
/* Number of collectives posted so far (the next one gets this sequence
 * number). send/recv are not counted. */
DT_API uint64_t dt_pg_seq(const dt_pg *pg);

/* This rank's monotonic clock (dt_time_ns) less rank 0's, in µs
 * (*offset_us; 0 on rank 0), and one reading of rank 0's clock that every
 * rank receives alike (*base_us): the alignment of the ranks' timelines
 * (dt_trace_set_offset, trace.h). Collective over pg (a few barriers and
 * small all-reduces); accurate to about a barrier's latency. */
DT_API dt_status dt_pg_clock_offset(dt_pg *pg, double *offset_us, double *base_us);

/* ---- flight recorder ------------------------------------------------------
 * Each group records its last $DT_FLIGHT_ENTRIES operations (default 256,
 * 16 to 65536) on each rank in a ring that is written in place: O(1) and no
 * allocation per operation. What it is for: see the overview. Usage:
 *
 *     dt_pg_set_label(pg, "DDP bucket 3");   // later posts on pg carry it
 *     dt_comm_set_step(812);                 // and this step number
 *     ...
 *     dt_flight_entry e[16];
 *     int n = dt_pg_flight(pg, e, 16);       // the last n, oldest first
 */

/* One recorded operation. Times are seconds since the first group of this
 * process was created; 0 = not yet. */
typedef struct dt_flight_entry {
    uint64_t id;          /* record number in this group, from 0 */
    uint64_t seq;         /* sequence number (collectives: per group; send/recv: per peer and direction) */
    int kind;             /* a dt_coll_kind, or DT_FLIGHT_SUBGROUP (a subgroup creation) */
    dt_dtype dtype;
    int peer;             /* root or send/recv peer; -1 */
    dt_status status;     /* DT_INPROGRESS until it completed */
    size_t bytes;         /* count x element size (allgatherv: this rank's part) */
    double t_posted, t_started, t_done;
    int64_t step;         /* dt_comm_set_step when posted; -1 if never set */
    char label[48];       /* dt_pg_set_label when posted; "" if none */
} dt_flight_entry;
#define DT_FLIGHT_SUBGROUP DT_COLL_KIND_COUNT

/* The caller's label for the operations posted next on pg (truncated to 47
 * bytes; NULL or "" clears it): the DDP bucket, ZeRO unit, pipeline action
 * or checkpoint phase a hang report names. Cheap (a copy under the group's
 * lock); NULL pg is a no-op. */
DT_API void dt_pg_set_label(dt_pg *pg, const char *label);
/* The same with a printf format. */
DT_API void dt_pg_set_labelf(dt_pg *pg, const char *fmt, ...) DT_PRINTF(2, 3);
/* The training step that operations posted from now on record (process-wide;
 * < 0: none). */
DT_API void dt_comm_set_step(int64_t step);
/* Where failing groups write their whole ring (process-wide; NULL or "":
 * only $DT_FLIGHT_DIR, else the log only). The directory must exist. */
DT_API void dt_flight_set_dir(const char *dir);
/* Copy the last min(max, recorded) entries of pg's ring into out, oldest
 * first; returns how many (0 for NULL). */
DT_API int dt_pg_flight(dt_pg *pg, dt_flight_entry *out, int max);
/* Log pg's last n entries (n <= 0: all) with a heading naming why, and
 * write the whole ring to the flight directory if one is set. Done on every
 * failure of a group; callable at any time. */
DT_API void dt_pg_flight_dump(dt_pg *pg, const char *why, int n);

/* Memory that every rank of the group on this machine can read and write
 * (the zero-copy path). 64-byte aligned; not collective; contents undefined.
 * Backends without shared memory return ordinary memory. Returns NULL and
 * sets the error when the group's arena is exhausted (shm: $DT_SHM_HEAP_MB
 * per rank). Free with dt_pg_dealloc before dt_pg_free. */
DT_API void *dt_pg_alloc(dt_pg *pg, size_t bytes);
/* Release memory from dt_pg_alloc. NULL is a no-op. */
DT_API void dt_pg_dealloc(dt_pg *pg, void *p);

/* ---- requests ---------------------------------------------------------- */

/* DT_OK when done, DT_INPROGRESS while running, or the error. Never blocks. */
DT_API dt_status dt_req_test(dt_req *req);
/* Wait up to timeout_s seconds (< 0: until done). Returns DT_OK, the error,
 * or DT_INPROGRESS if the wait ran out first (the request is still valid and
 * running). On error dt_last_error() gets the request's message. */
DT_API dt_status dt_req_wait(dt_req *req, double timeout_s);
/* Wait for n requests (NULL entries are skipped); returns the first error
 * in array order, else DT_OK or DT_INPROGRESS. */
DT_API dt_status dt_req_wait_all(dt_req *const *reqs, int n, double timeout_s);
/* Status without waiting (same as dt_req_test). */
DT_API dt_status dt_req_status(const dt_req *req);
/* The error message of a failed request ("" while ok or running). Borrowed;
 * valid until dt_req_free. */
DT_API const char *dt_req_message(const dt_req *req);
/* Release a request. A request still running completes on its own and is
 * then released; its buffers stay in use until then. NULL is a no-op. */
DT_API void dt_req_free(dt_req *req);

/* ---- collectives -----------------------------------------------------------
 * Each has an _async form that returns DT_OK and a request in *req (free it
 * with dt_req_free), or an error and *req = NULL when the call itself is
 * invalid or the group has failed; and a blocking form that returns the
 * operation's status. Counts are elements; W is the group size. */

/* recv[i] = op over ranks of send[i]; count elements each. */
DT_API dt_status dt_pg_allreduce_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                       dt_dtype dt, dt_reduce_op op, dt_req **req);
DT_API dt_status dt_pg_allreduce(dt_pg *pg, const void *send, void *recv, size_t count,
                                 dt_dtype dt, dt_reduce_op op);

/* Like allreduce, but only root's recv gets the result (recv may be NULL
 * on other ranks). */
DT_API dt_status dt_pg_reduce_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                    dt_dtype dt, dt_reduce_op op, int root, dt_req **req);
DT_API dt_status dt_pg_reduce(dt_pg *pg, const void *send, void *recv, size_t count,
                              dt_dtype dt, dt_reduce_op op, int root);

/* root's buf (count elements) is copied to every rank's buf. */
DT_API dt_status dt_pg_broadcast_async(dt_pg *pg, void *buf, size_t count, dt_dtype dt,
                                       int root, dt_req **req);
DT_API dt_status dt_pg_broadcast(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int root);

/* recv (W*count) = the ranks' send blocks (count each) in rank order.
 * In place: send NULL or send == recv + rank*count. */
DT_API dt_status dt_pg_allgather_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                       dt_dtype dt, dt_req **req);
DT_API dt_status dt_pg_allgather(dt_pg *pg, const void *send, void *recv, size_t count,
                                 dt_dtype dt);

/* Rank r contributes counts[r] elements; they land at recv + displs[r]
 * (displs NULL: packed in rank order). counts/displs (W entries each) must
 * be equal on all ranks and stay valid until the request completes.
 * In place: send NULL (this rank's block is already at its place). */
DT_API dt_status dt_pg_allgatherv_async(dt_pg *pg, const void *send, void *recv,
                                        const size_t *counts, const size_t *displs, dt_dtype dt,
                                        dt_req **req);
DT_API dt_status dt_pg_allgatherv(dt_pg *pg, const void *send, void *recv, const size_t *counts,
                                  const size_t *displs, dt_dtype dt);

/* send holds W blocks of count elements; rank r's recv (count) = op over
 * ranks of block r. In place: recv == send + rank*count (NCCL style); send
 * may not be NULL. */
DT_API dt_status dt_pg_reduce_scatter_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                            dt_dtype dt, dt_reduce_op op, dt_req **req);
DT_API dt_status dt_pg_reduce_scatter(dt_pg *pg, const void *send, void *recv, size_t count,
                                      dt_dtype dt, dt_reduce_op op);

/* Uneven reduce_scatter: send holds W blocks packed in rank order, block j
 * of counts[j] elements; rank r's recv (counts[r]) = op over ranks of block
 * r. counts (W entries) must be equal on all ranks (copied at the call).
 * Counts may be 0. Even counts run as dt_pg_reduce_scatter; uneven ones as a
 * reduce_scatter of the largest block through a zero-padded copy, costing
 * (W + 1) * max(counts) elements of memory while the request lives. */
DT_API dt_status dt_pg_reduce_scatterv_async(dt_pg *pg, const void *send, void *recv,
                                             const size_t *counts, dt_dtype dt, dt_reduce_op op,
                                             dt_req **req);
DT_API dt_status dt_pg_reduce_scatterv(dt_pg *pg, const void *send, void *recv,
                                       const size_t *counts, dt_dtype dt, dt_reduce_op op);

/* root's recv (W*count) = every rank's send (count) in rank order. recv may
 * be NULL elsewhere. In place at root: send NULL. */
DT_API dt_status dt_pg_gather_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                    dt_dtype dt, int root, dt_req **req);
DT_API dt_status dt_pg_gather(dt_pg *pg, const void *send, void *recv, size_t count,
                              dt_dtype dt, int root);

/* Rank r's recv (count) = block r of root's send (W*count). send may be
 * NULL elsewhere. */
DT_API dt_status dt_pg_scatter_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                     dt_dtype dt, int root, dt_req **req);
DT_API dt_status dt_pg_scatter(dt_pg *pg, const void *send, void *recv, size_t count,
                               dt_dtype dt, int root);

/* Block j of send (count) goes to rank j; block j of recv comes from rank j.
 * In place: send NULL (recv holds the outgoing blocks). */
DT_API dt_status dt_pg_alltoall_async(dt_pg *pg, const void *send, void *recv, size_t count,
                                      dt_dtype dt, dt_req **req);
DT_API dt_status dt_pg_alltoall(dt_pg *pg, const void *send, void *recv, size_t count,
                                dt_dtype dt);

/* Uneven all-to-all (MPI_Alltoallv): sendcounts[j] elements at send +
 * sdispls[j] go to rank j; recvcounts[j] elements from rank j land at recv +
 * rdispls[j] (displs NULL: packed in rank order). Rank i's sendcounts[j]
 * must equal rank j's recvcounts[i]. Arrays are copied at the call; counts
 * may be 0. Runs as a small all-reduce (the largest block) and one
 * all-to-all through zero-padded copies: 2 * W * max-block elements of
 * memory while it runs. */
DT_API dt_status dt_pg_alltoallv_async(dt_pg *pg, const void *send, const size_t *sendcounts,
                                       const size_t *sdispls, void *recv,
                                       const size_t *recvcounts, const size_t *rdispls,
                                       dt_dtype dt, dt_req **req);
DT_API dt_status dt_pg_alltoallv(dt_pg *pg, const void *send, const size_t *sendcounts,
                                 const size_t *sdispls, void *recv, const size_t *recvcounts,
                                 const size_t *rdispls, dt_dtype dt);

/* Strided block layouts. A dt_pg_block is `runs` runs of `run` consecutive
 * elements, the first at element `off` of a buffer, each run `stride`
 * elements after the one before (stride >= run when runs > 1); its elements,
 * runs * run of them, are taken in that order. A row-major box [A, len, B]
 * cut from [A, n, B] at start st is {st * B, A, len * B, n * B}. The _blocks
 * collectives move the same data as their contiguous forms, but read or
 * write those runs in place, so the copy a backend makes anyway (the shm
 * backend's staging and copy-out) lands the data where it belongs: a
 * gather along an inner dim costs what a plain all-gather costs. Backends
 * without layouts (kinds lacks DT_BACKEND_LAYOUTS) get the contiguous form
 * plus a pack/unpack on the executor. blocks arrays have W entries and are
 * copied at the call. */
typedef struct dt_pg_block {
    size_t off, runs, run, stride;
} dt_pg_block;

/* All-gather into a layout: rank r contributes rblocks[r].runs * run
 * contiguous elements (uneven counts, 0 included), which land in recv at
 * rblocks[r] on every rank. rblocks must be equal on all ranks and the
 * blocks must not overlap. Not in place. */
DT_API dt_status dt_pg_allgather_blocks_async(dt_pg *pg, const void *send, void *recv,
                                              const dt_pg_block *rblocks, dt_dtype dt,
                                              dt_req **req);
DT_API dt_status dt_pg_allgather_blocks(dt_pg *pg, const void *send, void *recv,
                                        const dt_pg_block *rblocks, dt_dtype dt);

/* Reduce-scatter from a layout: block j of send is sblocks[j] (count
 * elements each, as in dt_pg_reduce_scatter); rank r's recv (count,
 * contiguous) = op over ranks of their block r. Not in place. */
DT_API dt_status dt_pg_reduce_scatter_blocks_async(dt_pg *pg, const void *send,
                                                   const dt_pg_block *sblocks, void *recv,
                                                   size_t count, dt_dtype dt, dt_reduce_op op,
                                                   dt_req **req);
DT_API dt_status dt_pg_reduce_scatter_blocks(dt_pg *pg, const void *send,
                                             const dt_pg_block *sblocks, void *recv, size_t count,
                                             dt_dtype dt, dt_reduce_op op);

/* All-to-all through layouts: sblocks[j] of send (count elements) goes to
 * rank j; the count elements from rank j land at rblocks[j] of recv. Every
 * block holds exactly count elements (as in dt_pg_alltoall; use
 * dt_pg_alltoallv for uneven blocks). Not in place. */
DT_API dt_status dt_pg_alltoall_blocks_async(dt_pg *pg, const void *send,
                                             const dt_pg_block *sblocks, void *recv,
                                             const dt_pg_block *rblocks, size_t count,
                                             dt_dtype dt, dt_req **req);
DT_API dt_status dt_pg_alltoall_blocks(dt_pg *pg, const void *send, const dt_pg_block *sblocks,
                                       void *recv, const dt_pg_block *rblocks, size_t count,
                                       dt_dtype dt);

/* Returns when every rank has entered it. */
DT_API dt_status dt_pg_barrier_async(dt_pg *pg, dt_req **req);
DT_API dt_status dt_pg_barrier(dt_pg *pg);

/* Whether every rank of pg was given the same n settings (collective: each
 * rank passes its own values of the same names in the same order; a NULL
 * value is "(unset)"). Ranks started with other options run other
 * collectives and would fail later, hang on two groups at once, or train
 * apart and end "successfully"; called once at start, before any of that.
 * One all-reduce of n + 1 hashes per rank. DT_ERR_MISMATCH, the same
 * message on every rank, naming each differing setting and the ranks whose
 * value is not rank 0's ("the ranks were given different settings: --lr
 * differs on rank 1 ..."). One rank: DT_OK. */
DT_API dt_status dt_pg_check_same(dt_pg *pg, const char *const *names, const char *const *values, int n);

/* Point to point, matched in posting order per (sender, receiver) pair; count
 * and dtype must agree (else DT_ERR_MISMATCH). peer != this rank.
 * Batched (NCCL's grouped send/recv): consecutive send/recv requests posted
 * with the _async forms are all in flight together, so any pattern of
 * posted sends and receives completes whatever its size, e.g. every rank
 * posting its send to rank+1 before its receive from rank-1. A blocking
 * dt_pg_send of up to $DT_P2P_EAGER_KB KiB (default 1024) is buffered: a
 * copy goes out as an asynchronous send and the call returns at once, so
 * two ranks that both send (up to that size) before they receive do not
 * deadlock; a failure of a buffered send fails the group, and a later
 * operation reports it. Larger sends wait for their receiver to take the
 * data, so two ranks that both send them first deadlock (then time out);
 * use the _async forms or dt_pg_sendrecv. A collective posted after
 * send/recv requests starts when they have completed. */
DT_API dt_status dt_pg_send_async(dt_pg *pg, const void *buf, size_t count, dt_dtype dt,
                                  int peer, dt_req **req);
DT_API dt_status dt_pg_send(dt_pg *pg, const void *buf, size_t count, dt_dtype dt, int peer);
DT_API dt_status dt_pg_recv_async(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int peer,
                                  dt_req **req);
DT_API dt_status dt_pg_recv(dt_pg *pg, void *buf, size_t count, dt_dtype dt, int peer);

/* Send sendbuf (scount elements) to dst and receive rcount elements from
 * src into recvbuf, both in flight together (a ring shift: dst = rank+1,
 * src = rank-1, on every rank at once, whatever the size). Blocking; dst
 * or src may be -1 to skip that half. Same matching rules as send/recv. */
DT_API dt_status dt_pg_sendrecv(dt_pg *pg, const void *sendbuf, size_t scount, int dst,
                                void *recvbuf, size_t rcount, int src, dt_dtype dt);

/* ---- writing a backend ---------------------------------------------------
 * A backend is a table of functions with a version, registered by name.
 * The group layer checks arguments, assigns sequence numbers, queues
 * requests and calls `run` for one operation at a time, in posting order,
 * from one executor thread at a time (never concurrently for one group). A
 * backend therefore only implements blocking operations. See examples/ for
 * a complete backend and src/comm/backend_self.c for the smallest one. */

#define DT_BACKEND_VERSION 3

/* One operation, as the group layer hands it to a backend. Arguments are
 * already checked and in-place forms normalised: `send` always points at
 * the input (for in-place calls it aliases recv as described above) and
 * in_place says so. */
typedef struct dt_coll {
    dt_coll_kind kind;
    const void *send;      /* input; NULL for barrier/recv and non-root scatter */
    void *recv;            /* output; NULL for barrier/send and non-root reduce/gather */
    size_t count;          /* elements, meaning as in the dt_pg_<kind> call */
    dt_dtype dtype;
    dt_reduce_op op;       /* reductions only */
    int root;              /* reduce/broadcast/gather/scatter root; send/recv peer; else -1 */
    const size_t *counts;  /* allgatherv: W element counts */
    const size_t *displs;  /* allgatherv: W element displacements (never NULL here) */
    int in_place;          /* 1 if send aliases recv */
    /* Layouts (only for a backend whose kinds has DT_BACKEND_LAYOUTS; NULL
     * otherwise, and for contiguous buffers): allgatherv: rblocks[r] is
     * where rank r's block lands in recv (instead of displs[r]); alltoall:
     * sblocks[j] / rblocks[j] are block j of send / recv (instead of
     * send + j * count, recv + j * count); reduce_scatter: sblocks[j] is
     * block j of send. */
    const struct dt_pg_block *sblocks, *rblocks;
    uint64_t seq;          /* sequence number (collectives: per group; p2p: per peer pair) */
    double timeout_s;      /* the group's per-operation timeout */
} dt_coll;

/* What a backend's init gets. Strings are borrowed for the call. */
typedef struct dt_backend_info {
    int rank, world_size, local_rank, local_world_size;
    const char *job_id;      /* "" if unknown */
    const char *master_addr; /* "" if unknown */
    int master_port;         /* 0 if unknown */
    double timeout_s;        /* per-operation timeout */
    int check;               /* 1: fingerprint collectives across ranks */
    const char *options;     /* text after the name in the backend string ("shm?x=1" → "x=1"), "" if none */
    double init_timeout_s;   /* bound on the start-up (every rank of the job joining the group):
                                $DT_INIT_TIMEOUT, else timeout_s */
    /* dt_pg_params.interrupted, or NULL: a backend polls it while it waits for peers during init and returns
       DT_ERR_CANCELED (with a message naming the ranks awaited) when it says nonzero */
    int (*interrupted)(void *arg);
    void *interrupted_arg;
} dt_backend_info;

/* Bits of dt_backend_ops.kinds beyond the kinds: every kind, and "run
 * reads and writes the strided layouts of dt_coll.sblocks / rblocks". */
#define DT_BACKEND_ALL_KINDS ((1u << DT_COLL_KIND_COUNT) - 1u)
#define DT_BACKEND_LAYOUTS (1u << 31)

typedef struct dt_backend_ops {
    int version;        /* required: DT_BACKEND_VERSION */
    const char *name;   /* required: registry name, [a-z0-9_]+ */
    /* Required. Set up this rank's state (collective across ranks). On
     * error return the status with dt_error() set. */
    dt_status (*init)(const dt_backend_info *info, void **ctx);
    /* Required. Release the state (after the last operation). */
    void (*free)(void *ctx);
    /* Required. Run one operation to completion. Return DT_OK or an error
     * with dt_error() set; the message is copied into the request. */
    dt_status (*run)(void *ctx, const dt_coll *c);
    /* Optional (0 = all kinds): bit (1u << kind) set for each kind `run`
     * handles; others fail with DT_ERR_UNSUPPORTED naming backend and kind.
     * Add DT_BACKEND_LAYOUTS (with the kinds' bits, DT_BACKEND_ALL_KINDS
     * for all) when run honours dt_coll.sblocks / rblocks. */
    uint32_t kinds;
    /* Optional (default: dt_alloc / dt_free; collectives get plain memory). */
    void *(*mem_alloc)(void *ctx, size_t bytes);
    void (*mem_free)(void *ctx, void *p);
    /* Optional (default: DT_ERR_UNSUPPORTED). Make a subgroup of the listed
     * parent ranks; called on every parent rank when the parent is idle;
     * new_rank is this rank's place in the list or -1, in which case
     * *child must be set to NULL. */
    dt_status (*subgroup)(void *ctx, const int *ranks, int n, int new_rank, void **child);
    /* Optional (default: none). Called when the group layer marks the group
     * failed on this rank, so the backend can tell its peers. */
    void (*abort)(void *ctx, dt_status st, const char *msg);
    /* Optional, all three or none (default: send/recv go through `run` one
     * at a time, so a send larger than what the backend buffers waits for
     * its receiver, and two ranks that both send first deadlock).
     * Nonblocking point to point: the group layer keeps every posted
     * send/recv of a run of consecutive ones in flight at once, at most one
     * per (direction, peer), so any pattern completes.
     * p2p_start: begin c (DT_COLL_SEND or DT_COLL_RECV), state in *op.
     * p2p_test: move op forward without blocking; set *progressed when
     *   anything moved; return DT_INPROGRESS, or DT_OK / an error (with
     *   dt_error()), after which op is released and not used again.
     *   progressed == NULL: abandon op (the group failed or it timed out):
     *   release it without waiting; the return value is ignored.
     * p2p_idle: nothing moved in the last pass over all ops; wait a little
     *   (round = consecutive idle passes, 0, 1, ...; at most max_s seconds)
     *   for a peer to make room or data. */
    dt_status (*p2p_start)(void *ctx, const dt_coll *c, void **op);
    dt_status (*p2p_test)(void *ctx, void *op, int *progressed);
    void (*p2p_idle)(void *ctx, int round, double max_s);
    /* Optional (only with the p2p slots). Called from another thread of
     * this rank: make a p2p_idle that is waiting return soon (a thread
     * waiting for one of the batch's requests takes the batch over). */
    void (*p2p_wake)(void *ctx);
    /* Optional, both or none (default: the flight recorder's analysis of a
     * timeout sees this rank only). flight_board: where this rank's status
     * block of `bytes` bytes lives; the group layer rewrites it on every
     * post and completion under a sequence lock. Return memory the peers
     * read themselves (shm: the segment, so a stopped rank is still read),
     * or memory of ctx that flight_gather serves to peers that ask (mpi).
     * flight_gather: after a timeout, copy rank r's block into
     * all + r * bytes (read it with dt_flight_board_read) and set got[r] = 1,
     * for every rank that could be read within wait_s seconds (this rank's
     * own included); meanwhile answer the same request of peers. Called
     * when no operation of the group runs on this rank. */
    void *(*flight_board)(void *ctx, size_t bytes);
    dt_status (*flight_gather)(void *ctx, void *all, unsigned char *got, size_t bytes, double wait_s);
    /* Optional (default: the backend leaves nothing behind; 0 removed).
     * Called without a group, from a launcher, by dt_pg_job_cleanup and
     * dt_pg_orphan_cleanup (which validate the arguments and call the slot
     * of every registered backend, adding up *removed): remove what this
     * backend's groups of job job_id left on the machine after the job's
     * processes ended (job_cleanup), or what any job whose processes are
     * all dead left (orphan_cleanup). Set *removed to the number of objects
     * removed; return DT_OK or an error with dt_error() set. The shm
     * backend removes its shared-memory segments here. */
    dt_status (*job_cleanup)(const char *job_id, int *removed);
    dt_status (*orphan_cleanup)(int *removed);
    /* Optional (default: the backend does not count; dt_pg_traffic_read
     * reports counted = 0). Set sent[r], r < the group's size, to the bytes
     * this process has sent to rank r of this group so far, over every
     * group of the same backend instance (see "bytes on the wire");
     * sent[own rank] = 0. Return DT_OK, DT_ERR_UNSUPPORTED when this
     * instance does not count (e.g. a monitoring layer is off), or an error
     * with dt_error(). Called from any thread, concurrently with run:
     * read counters, never communicate. (Added in DT_BACKEND_VERSION 3.) */
    dt_status (*traffic)(void *ctx, uint64_t *sent, int n);
    /* Optional (used when traffic is NULL or says DT_ERR_UNSUPPORTED). Set
     * *left to the bytes this process has sent off its machine so far, as
     * the transport counts them, for a backend that cannot say per peer.
     * Same rules as traffic. (DT_BACKEND_VERSION 3.) */
    dt_status (*traffic_off_node)(void *ctx, uint64_t *left);
} dt_backend_ops;

/* Copy a consistent snapshot of a status block (flight_board) into dst,
 * whatever thread or process is rewriting it. */
DT_API void dt_flight_board_read(void *dst, const void *board, size_t bytes);

/* Register a backend under ops->name (the table is copied; the name string
 * must outlive the program, e.g. a literal). Re-registering a name
 * replaces it. Errors: DT_ERR_INVALID_ARG (version, name or a required slot
 * missing). Thread-safe. */
DT_API dt_status dt_backend_register(const dt_backend_ops *ops);
/* The registered table for name, or NULL. The pointer stays valid for the
 * life of the process, but re-registering the name rewrites the table it
 * points to: copy it only while no thread registers that name. (dt_pg_init
 * takes its copy under the registry's lock.) */
DT_API const dt_backend_ops *dt_backend_find(const char *name);
/* Registered names, comma-separated, into buf; returns buf. */
DT_API char *dt_backend_list(char *buf, size_t n);

/* Parse a backend string: the entry for `device` ("cpu"; entries without a
 * device prefix are cpu) into name (and options after '?', "" if none).
 * Returns DT_ERR_NOT_FOUND if there is no entry for the device,
 * DT_ERR_INVALID_ARG for malformed text. */
DT_API dt_status dt_backend_parse(const char *s, const char *device, char *name, size_t name_cap,
                                  char *options, size_t options_cap);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */
