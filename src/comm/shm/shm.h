/* src/comm/shm/shm.h — the shared-memory backend's private structures.
 *
 * One segment per group, mapped by every rank (POSIX shm, mode 0600,
 * unlinked as soon as every rank has attached):
 *
 *   header      | magic, sizes, attach count, the group's abort record
 *   rank blocks | per rank: tick (progress counter), futex word, pid, state,
 *               | the flight recorder's status block
 *   descriptors | per rank x 2 (sequence parity): the posted operation
 *   bytes moved | W x W counters: bytes rank i's memory handed to rank j's
 *               | (dt_pg_traffic_read; whoever copies adds, relaxed atomics)
 *   slots       | per rank x 2 (parity): small-message payloads
 *   channels    | per ordered pair (src, dst): a byte ring for send/recv
 *   staging     | per rank: IN and OUT areas for plain (non-shared) buffers
 *   heaps       | per rank: dt_pg_alloc memory (zero-copy collectives)
 *
 * Synchronisation: each rank publishes one monotonically increasing 64-bit
 * tick = (sequence << 32) | step. "Wait for rank j at step k of op seq"
 * means tick_j >= (seq << 32 | k); ticks are absolute, so ranks that skip
 * steps (extra ranks in recursive halving, leaves of a tree) stay aligned
 * and a peer that has moved on to a later operation satisfies every wait
 * of an earlier one. A waiter spins briefly, then sleeps on the peer's
 * futex word (bumped after every tick) with a 50 ms timeout, checking the
 * abort record, the operation's deadline and the peers' liveness.
 *
 * Environment (read at group creation, must be equal on all ranks; the
 * fingerprint check catches differences):
 *   DT_SHM_ALGO        algorithm table overrides, see shm_select.c
 *   DT_SHM_HEAP_MB     per-rank dt_pg_alloc arena, MiB (default 1024; sparse)
 *   DT_SHM_STAGING_KB  per-rank staging for plain buffers, KiB (default 8192:
 *                      4 MiB pieces in, 4 MiB out)
 *   DT_SHM_SLOT_BYTES  small-message slot per rank, bytes (default 16384;
 *                      0 disables the small-message path)
 *   DT_SHM_SPIN        pause-spin iterations before yielding, then sleeping
 *                      (default 2000, about 50 us; 100 when there are more
 *                      local ranks than cores)
 *   DT_SHM_SPIN_US     then busy-poll this many microseconds before sleeping
 *                      (default 20000 when local ranks x compute threads fit
 *                      the cores, else 0): a sleeping vCPU can take
 *                      milliseconds to wake, far longer than most waits;
 *                      only where dt__comm_may_poll allows it (not a
 *                      progress thread nobody waits for, not beside
 *                      another group's running progress thread)
 */
#ifndef DT_COMM_SHM_H
#define DT_COMM_SHM_H

#include "comm/backend.h"
#include "comm/shm/chunk.h"

#include <pthread.h>
#include <stdatomic.h>

#define SHM_MAGIC 0x6474736du /* "dtsm" */
#define SHM_VERSION 4
#define SHM_OWNER_TAG 0x6f776e72u /* "ownr": owner[] is written */
#define SHM_NONE UINT64_MAX
#define SHM_ALIGN 64

enum { SHM_STATE_EMPTY = 0, SHM_STATE_ATTACHED = 1, SHM_STATE_LEFT = 2 };

typedef struct {
    _Atomic uint32_t magic;
    uint32_t version;
    uint32_t world;
    uint32_t pad0;
    uint64_t total, slot_bytes, stage_bytes, heap_bytes, chan_bytes;
    _Atomic uint32_t attached;
    _Atomic uint32_t unlinked;  /* the name is gone (set by the last to attach) */
    _Atomic int32_t abort_st;   /* 0, or the dt_status that failed the group */
    _Atomic uint32_t abort_lock;
    int32_t abort_rank;
    char abort_msg[768];
    /* Who can still remove the name: the creator (rank 0, or a subgroup's
     * first rank) and its parent (the launcher under `dtrain run`), each as
     * pid + start time (/proc/PID/stat field 22, against pid reuse). Written
     * right after the segment is sized, before anything slow; owner_tag says
     * they are there. dt_pg_orphan_cleanup removes a segment only when both
     * are dead. */
    _Atomic uint32_t owner_tag;
    int32_t owner_pid[2];
    uint64_t owner_start[2];
} shm_hdr;

typedef struct {
    _Atomic uint64_t tick;
    _Atomic uint32_t word;
    _Atomic uint32_t waiters;
    _Atomic int32_t pid;
    _Atomic uint32_t state;
    _Atomic uint32_t bell;         /* bumped when a peer moved data on a channel to or from us */
    _Atomic uint32_t bell_waiters; /* batched send/recv sleeping on bell */
    char pad[SHM_ALIGN * 2 - 32];
    /* the flight recorder's status block of this rank (flight_board):
     * peers read it after a timeout even while this rank is stopped */
    _Alignas(SHM_ALIGN) unsigned char flight[256];
} shm_rank;

/* The operation a rank posted (the fingerprint plus where its buffers are). */
typedef struct {
    uint64_t seq;
    uint32_t kind, dtype, op;
    int32_t root;
    uint64_t count;
    uint64_t aux;      /* hash of allgatherv counts/displs; 0 otherwise */
    uint64_t config;   /* hash of the algorithm table and sizes */
    uint64_t send_off, recv_off; /* offsets in the segment, or SHM_NONE */
    char pad[SHM_ALIGN * 2 - 72];
} shm_desc;

/* Channel control; the byte ring follows. */
typedef struct {
    _Atomic uint64_t head; /* bytes written by the sender */
    _Atomic uint64_t tail; /* bytes consumed by the receiver */
    _Atomic uint32_t word;
    _Atomic uint32_t waiters;
    char pad[SHM_ALIGN - 24];
} shm_chan;

typedef struct shm_free_block {
    size_t off, size;
    struct shm_free_block *next;
} shm_free_block;

typedef struct shm_alloc_rec {
    size_t off, size;
    struct shm_alloc_rec *next;
} shm_alloc_rec;

/* Algorithms. */
typedef enum {
    SHM_ALG_DIRECT = 0,
    SHM_ALG_RING,
    SHM_ALG_RECHD,
    SHM_ALG_TREE,
    SHM_ALG_COUNT
} shm_alg;

#define SHM_MAX_RULES 16
typedef struct {
    uint64_t lo, hi; /* [lo, hi) bytes */
    shm_alg alg;
} shm_rule;
typedef struct {
    shm_rule rules[DT_COLL_KIND_COUNT][SHM_MAX_RULES];
    int n[DT_COLL_KIND_COUNT];
} shm_table;

/* The groups of one process that descend from one dt_pg_init (the root
 * group, its subgroups and theirs): dt_pg_traffic_read reports bytes per
 * peer over all of them (shm_traffic in backend_shm.c). */
typedef struct shm_family {
    pthread_mutex_t mu;
    int size;                /* the root group's size */
    uint64_t *retired;       /* [size]: bytes sent by freed groups, by root rank */
    struct shm_ctx *members; /* live groups, linked by fam_next */
    int refs;
} shm_family;

typedef struct shm_ctx {
    int rank, size;
    char name[64];
    char *base;
    size_t total;
    shm_hdr *hdr;
    size_t off_ranks, off_desc, off_moved, off_slots, off_chans, off_stage, off_heaps;
    size_t slot_bytes, stage_bytes, heap_bytes, chan_bytes;
    int *pidfd;        /* per peer, -1 if unavailable */
    int fd;            /* the segment, kept open to reserve heap pages (valid if have_fd) */
    int have_fd;
    int spin;
    double spin_s;     /* then busy-poll this long before sleeping (DT_SHM_SPIN_US) */
    double timeout_s;
    int check;
    int (*interrupted)(void *arg); /* during init only: dt_backend_info.interrupted (NULL after) */
    void *interrupted_arg;
    uint64_t config;   /* hash of the table and sizes */
    shm_table table;

    uint64_t seq;      /* collectives run so far (the next one's number) */
    /* the operation being run */
    const dt_coll *cur;
    uint64_t cur_seq;
    double deadline;
    double next_live_check;
    double yield_off_until; /* dt__cpu_yield: no yielding before this time */

    uint32_t bell_snap; /* our bell when the current batch pass began */
    int bell_armed;     /* bell_snap is valid */

    shm_free_block *free_list;
    shm_alloc_rec *allocs;

    shm_family *fam;          /* the traffic family (NULL until attached) */
    int *root_of;             /* [size]: each rank's rank in the family's root group */
    struct shm_ctx *fam_next; /* fam->members link */
} shm_ctx;

/* ---- segment layout accessors ---- */
static inline shm_rank *shm_rank_at(shm_ctx *s, int r)
{
    return (shm_rank *)(s->base + s->off_ranks) + r;
}
static inline shm_desc *shm_desc_at(shm_ctx *s, int r, uint64_t seq)
{
    return (shm_desc *)(s->base + s->off_desc) + 2 * r + (seq & 1);
}
static inline char *shm_slot_at(shm_ctx *s, int r, uint64_t seq)
{
    return s->base + s->off_slots + (2 * (size_t)r + (seq & 1)) * s->slot_bytes;
}
static inline shm_chan *shm_chan_at(shm_ctx *s, int src, int dst)
{
    return (shm_chan *)(s->base + s->off_chans +
                        ((size_t)src * s->size + dst) * (sizeof(shm_chan) + s->chan_bytes));
}
static inline char *shm_chan_ring(shm_chan *c) { return (char *)(c + 1); }
/* Count bytes that rank src's memory handed to rank dst's (a peer read or
 * a write into a peer's buffer); nothing for a rank's own copies. */
static inline void shm_moved(shm_ctx *s, int src, int dst, size_t bytes)
{
    if (src != dst && bytes) {
        _Atomic uint64_t *m = (_Atomic uint64_t *)(s->base + s->off_moved) + (size_t)src * s->size + dst;
        atomic_fetch_add_explicit(m, (uint64_t)bytes, memory_order_relaxed);
    }
}
/* What this rank has handed to rank dst so far. */
static inline uint64_t shm_moved_read(shm_ctx *s, int dst)
{
    _Atomic uint64_t *m = (_Atomic uint64_t *)(s->base + s->off_moved) + (size_t)s->rank * s->size + dst;
    return atomic_load_explicit(m, memory_order_relaxed);
}
/* Staging: IN is the first half, OUT the second. */
static inline char *shm_stage_in(shm_ctx *s, int r)
{
    return s->base + s->off_stage + (size_t)r * s->stage_bytes;
}
static inline char *shm_stage_out(shm_ctx *s, int r)
{
    return shm_stage_in(s, r) + s->stage_bytes / 2;
}
static inline char *shm_heap_at(shm_ctx *s, int r)
{
    return s->base + s->off_heaps + (size_t)r * s->heap_bytes;
}
/* Offset of [p, p+bytes) if it lies inside this rank's heap, else SHM_NONE. */
uint64_t dt__shm_heap_offset(shm_ctx *s, const void *p, size_t bytes);

/* ---- segment (shm_segment.c) ---- */
/* Deterministic segment name for a job id ("/dtrain-<hash>"). */
void dt__shm_segment_name(const char *job_id, char *buf, size_t n);
/* The backend's job_cleanup and orphan_cleanup slots (dt_backend_ops):
 * unlink job_id's segment; unlink the segments whose creator and its
 * parent are both dead (dt_pg_job_cleanup, dt_pg_orphan_cleanup). */
dt_status dt__shm_job_cleanup(const char *job_id, int *removed);
dt_status dt__shm_orphan_cleanup(int *removed);
/* Create or open the segment, map it, register this rank; the last rank
 * to register unlinks the name. */
dt_status dt__shm_attach(shm_ctx *s, const char *name, int create, double timeout_s);
/* Wait until every rank registered (then pids are known). */
dt_status dt__shm_attach_wait(shm_ctx *s, double timeout_s);
/* True when the start-up's interrupted callback asks to stop (never after init). */
bool dt__shm_interrupted(int (*fn)(void *), void *arg);
void dt__shm_detach(shm_ctx *s);
dt_status dt__shm_rendezvous_name(const dt_backend_info *info, char *name, size_t n);
void *dt__shm_mem_alloc(void *ctx, size_t bytes);
void dt__shm_mem_free(void *ctx, void *p);

/* ---- synchronisation (shm_sync.c) ---- */
static inline uint64_t shm_tick_of(uint64_t seq, uint32_t step) { return (seq << 32) | step; }
/* Publish "this rank reached step of the current operation". */
void dt__shm_signal(shm_ctx *s, uint32_t step);
/* Wait until rank r reached step of the current operation. */
dt_status dt__shm_wait(shm_ctx *s, int r, uint32_t step);
/* Wait for every rank (barrier half). */
dt_status dt__shm_wait_all(shm_ctx *s, uint32_t step);
/* signal + wait_all. */
dt_status dt__shm_barrier(shm_ctx *s, uint32_t step);
/* Wait until *v >= target on a channel (send/recv); peer for messages. */
dt_status dt__shm_wait_chan(shm_ctx *s, shm_chan *c, _Atomic uint64_t *v, uint64_t target,
                            int peer, const char *what);
void dt__shm_chan_notify(shm_chan *c);
/* Ring rank r's bell (data moved on a channel to or from r). */
void dt__shm_bell_ring(shm_ctx *s, int r);
/* Sleep up to max_s while our bell still reads snap. */
void dt__shm_bell_wait(shm_ctx *s, uint32_t snap, double max_s);
/* Fail c if the group failed or peer died or left (c names the operation
 * in the message); DT_OK otherwise. */
dt_status dt__shm_check_peer(shm_ctx *s, const dt_coll *c, int peer);
/* Fail the group on every rank (first caller wins); returns st. */
dt_status dt__shm_abort(shm_ctx *s, dt_status st, const char *msg);
/* If the group failed, set the error and return its status, else DT_OK. */
dt_status dt__shm_check_abort(shm_ctx *s);
/* Open pidfds for the peers (after everyone attached). */
void dt__shm_liveness_init(shm_ctx *s);

/* ---- the two paths behind shm_run (backend_shm.c calls them) ---- */
/* A collective larger than a slot (shm_large.c). */
dt_status dt__shm_run_large(shm_ctx *s, const dt_coll *c);
/* send / recv through the pair's byte ring (shm_p2p.c): blocking, and the
 * nonblocking p2p_* slots of the backend table. */
dt_status dt__shm_p2p(shm_ctx *s, const dt_coll *c);
dt_status dt__shm_p2p_start(void *ctx, const dt_coll *c, void **op);
dt_status dt__shm_p2p_test(void *ctx, void *op, int *progressed);
void dt__shm_p2p_idle(void *ctx, int round, double max_s);
void dt__shm_p2p_wake(void *ctx);

/* ---- selection (shm_select.c) ---- */
dt_status dt__shm_table_init(shm_table *t, const char *env);
shm_alg dt__shm_select(const shm_table *t, dt_coll_kind k, uint64_t bytes);
const char *dt__shm_alg_name(shm_alg a);
uint64_t dt__shm_table_hash(const shm_table *t);

/* ---- algorithms: one piece of an all-reduce ----
 * ins[j]: rank j's input piece (readable by all), works[j]: rank j's
 * output/work piece (readable and writable by all). On return every
 * rank's works[me] holds the result (avg already divided). Steps used are
 * *step, *step+1, ...; *step is advanced past them. */
typedef struct {
    shm_ctx *s;
    char *ins[64];
    char *works[64];
    size_t count; /* elements in the piece */
    dt_dtype dt;
    dt_reduce_op op;
    int root;     /* reduce/broadcast root; allreduce: -1 */
    uint32_t step;
    int nt;       /* large message: streaming stores */
    /* Direct all-reduce on staged buffers: this rank's own chunk is read
     * from own_in and written to own_out (the user's buffers) instead of
     * going through staging; NULL when ins/works[me] are the user's. */
    const char *own_in;
    char *own_out;
} shm_piece;


dt_status dt__shm_allreduce_direct(shm_piece *p);
dt_status dt__shm_allreduce_ring(shm_piece *p);
dt_status dt__shm_allreduce_rechd(shm_piece *p);
dt_status dt__shm_allreduce_tree(shm_piece *p);
/* reduce: result in works[root] only. */
dt_status dt__shm_reduce_direct(shm_piece *p);
dt_status dt__shm_reduce_tree(shm_piece *p);
/* broadcast: ins[root] holds the data; result in works[j] of every rank. */
dt_status dt__shm_broadcast_tree(shm_piece *p);

#define SHM_MAX_RANKS 64
/* Messages at least this large use streaming stores. */
#define SHM_NT_BYTES ((size_t)8 << 20)

#endif /* DT_COMM_SHM_H */
