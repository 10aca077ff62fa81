/* src/parallel/zero/zero_impl.h — ZeRO internals shared by zero.c (the engine),
 * zero_mem.c (its memory), zero_info.c (introspection), zero_wrap.c (the
 * wrap policy that makes the units) and zero_offload.c (parameter offload). */
#ifndef DT_ZERO_IMPL_H
#define DT_ZERO_IMPL_H

#include "dtrain/optim.h"
#include "dtrain/parallel.h"

/* The page pool (zero.c): at most this many pieces of pages kept from
 * released stage-3 units; a unit's region holds at most one more piece
 * (the part the pool did not cover) while it is gathered. */
#define ZP_SLOTS 16

/* One unit: a module's parameters of one dtype (minus nested units') in
 * one flat. A module whose parameters have two dtypes (bf16 weights, f32
 * norms kept by the precision policy) is two units. */
typedef struct zunit {
    struct dt_zero *z;       /* the owner (module hooks get the unit) */
    char *name;              /* the module's path, "<root>" or "<persistent>" */
    dt_module *mod;          /* NULL for the persistent unit */
    int index;
    dt_dtype dtype;          /* its parameters' (and whole gradients') dtype: f32, bf16, f16 */
    size_t es;               /* its element size */
    dt_dtype rdt;            /* the reduce dtype: the shard's gradient dtype */
    size_t res;              /* its element size */
    size_t *entries;         /* model entry indices, model order */
    size_t *uoff;            /* each one's offset in the unit flat */
    int nent;
    size_t used_numel;       /* parameter elements (without padding) */
    size_t total;            /* padded: a multiple of W * (64 / es) */
    size_t c;                /* total / W: each rank's shard */
    char *full, *gfull;      /* whole parameters / gradients (dtype): mmap'd, fixed addresses */
    char *rfull;             /* rdt != dtype: the whole gradients in rdt (mmap'd); else NULL */
    bool full_sh, gred_sh;   /* full / the reduced whole gradients (rfull, else gfull) are
                                dt_pg_alloc memory (zero.c: shared buffers) instead of regions */
    char *pshard, *gshard;   /* this rank's shard (dtype / rdt): inside full/gfull/rfull, or *_own */
    char *pshard_own, *gshard_own;
    float *master;           /* dtype != f32: the fp32 master weights of the shard; else NULL */
    dt_flat pflat, gflat, mflat; /* the shards as flats (global index = unit index) */
    dt_optim_segment *segs;  /* nent of them */
    bool resident;           /* never freed: stage 1/2, or the persistent unit */
    bool gathered;           /* full holds the current parameters (or their gather is posted) */
    bool grads_live;         /* gfull may hold gradient pages */
    bool posted;             /* its reduction was posted in this iteration */
    dt_req *ag, *rs;         /* in-flight all-gather / reduction */
    int nready;              /* gradients ready in this iteration */
    int fwd_pos;             /* position in the recorded forward order */
    uint64_t gathers;        /* all-gathers posted since the last check */
    bool prefetched;         /* its in-flight gather was posted by a prefetch */
    dt_hook_id hooks[4];
    /* while gathered: the region's pieces in order from its start, each a
     * separate mapping moved in from the pool (the last one may be the
     * region's own, faulted in); npc 0: the region is one mapping */
    size_t pc[ZP_SLOTS + 1];
    int npc;
    /* parameter offload (zero_offload.c): the shard's store region (-1: in
     * memory as above); pshard is then a mapped buffer while the shard is
     * in memory (read posted or done), NULL otherwise */
    int preg;
    uint64_t prd, pwr;       /* in-flight read / write of the shard (0: none) */
    /* ZeRO++ (zero_pp.c) */
    char *qbuf;              /* qwZ gather in flight: this rank's int8 blocks and scales, then
                                every rank's (zero_pp.c has the layout); NULL otherwise */
    char *sec;               /* hpZ: the secondary shard (total / H elements of dtype) kept from
                                the last forward gather, NULL when none */
    bool sec_inflight;       /* the in-flight gather (ag) reads sec (a backward gather in the
                                hpZ group): sec is dropped when it completes */
} zunit;

struct dt_zero {
    dt_pg *pg;               /* the shard group: reductions, after-step gathers (borrowed, or
                                 with hybrid sharding the split below) */
    dt_pg *hpg;              /* params.hierarchical: dt_pg_hierarchical(pg) for the gradient
                                reductions (owned), else NULL */
    dt_pg *wpg;              /* all ranks (the caller's group) */
    dt_pg *spg, *rpg;        /* hybrid: shard group (= pg) and replica group, owned; else NULL */
    dt_pg *gpg;              /* stage 3 all-gathers: a duplicate of pg (owned), else pg */
    dt_model *m;
    dt_zero_params p;
    int rank, W;
    zunit *u;
    int nu;
    int *entry_unit;         /* per model entry: its unit or -1 */
    size_t nentry;
    bool sync;               /* this micro-batch's backward reduces */
    int next_post;           /* next unit to post (descending), -1 when all are */
    int *order, norder;      /* forward order of the first iteration */
    bool order_done;
    bool need_clear;         /* the next micro-batch starts a step: release whole gradients */
    int *inflight, ninflight; /* units with an all-gather in flight, oldest first */
    double *check;           /* 2 * nu: the per-step order check */
    dt_req **rr;             /* nu: hybrid replica all-reduces */
    dt_optim_range *rg;      /* one per unit */
    size_t live, peak_live;  /* bytes of gathered parameters / unsharded gradients */
    dt_zero_stats stats;
    dt_hook_id ready_hook;
    /* the page pool: pages of released stage-3 units kept for the next
     * gathers (moved with mremap, so a gather writes already-faulted
     * memory). Slot k's pages are [base + off, base + off + len), one
     * mapping; len 0: empty. */
    struct {
        char *base;
        size_t off, len;
        size_t bytes;        /* of those, bytes of the released units' buffers (the rest: page rounding) */
    } pool[ZP_SLOTS];
    size_t pool_slot;        /* each slot's mapped length: the largest stage-3 unit region */
    size_t pool_cap;         /* bytes the pool may hold: two of the largest units */
    size_t pool_bytes;       /* unit buffer bytes it holds now (counted with live in peak_live) */
    bool pool_on;
    /* parameter offload */
    dt_nvme_store *pstore;   /* NULL: parameters in memory */
    size_t pheld, pheld_peak;/* bytes of offloaded shards in memory now / at most */
    int nheld;               /* shards in memory */
    dt_status perr;          /* the first I/O error held for the step's check (DT_OK: none) */
    char *perr_msg;
    /* ZeRO++ (zero_pp.c) */
    dt_pg *hzpg;             /* hpZ: the H consecutive ranks of this rank's secondary group (split
                                of gpg, owned); NULL without hpZ */
    struct dt_zpp *zpp;      /* qgZ: the machines of pg and their groups (owned); NULL without */
};

/* zero_wrap.c: apply the wrap policy of p to z->m and fill z->u, z->nu,
 * z->entry_unit, z->nentry (layout only; no memory for the flats). */
dt_status dt__zero_build_units(dt_zero *z, const dt_zero_params *p);
void dt__zero_free_units(dt_zero *z);
/* Bytes of u's whole parameters (dtype) / whole reduced gradients (rdt). */
static inline size_t dt__zero_unit_bytes(const zunit *u) { return u->total * u->es; }
static inline size_t dt__zero_unit_rbytes(const zunit *u) { return u->total * u->res; }

/* zero_mem.c: the memory of the units. */
/* Give a region's pages back (they read as zero afterwards). */
void dt__zero_region_release(void *p, size_t bytes);
/* Count bytes gathered (or unsharded gradients) as live; keeps the peak. */
void dt__zero_live_add(dt_zero *z, size_t bytes);
/* The page pool: set up after the units (sized by the largest stage-3
 * unit), free, and move pool pages under u's region before its gather. */
void dt__zero_pool_init(dt_zero *z);
void dt__zero_pool_free(dt_zero *z);
void dt__zero_pool_take(dt_zero *z, zunit *u);
/* Free a stage-3 unit's gathered parameters (into the pool or to the system). */
void dt__zero_unit_reshard(dt_zero *z, zunit *u);
/* A whole-unit buffer: from dt_pg_alloc when want_shared and it has room
 * (*shared true), else a mapped region; and its release. */
void *dt__zero_buf_map(dt_zero *z, size_t bytes, bool want_shared, bool *shared);
void dt__zero_buf_unmap(dt_zero *z, void *p, size_t bytes, bool shared);
/* Release a unit's whole gradients (reduced, or not needed). */
void dt__zero_release_grads(dt_zero *z, zunit *u);
/* Stage 1, a new step: zero the last step's whole gradients outside rank's range. */
void dt__zero_clear_grads(zunit *u, int rank);
/* A gradient is about to be written into u's whole gradients: count them live. */
void dt__zero_grads_touch(dt_zero *z, zunit *u);

void dt__zero_live_sub(dt_zero *z, size_t bytes);

/* zero_pp.c: ZeRO++ in the engine (parallel.h "ZeRO++"). */
/* Build the hpZ group (after dt_zpp_hpz_check) and qgZ's machine groups
 * (collective over z->pg; after gpg exists). */
dt_status dt__zpp_setup(dt_zero *z);
void dt__zpp_teardown(dt_zero *z);
/* Post u's all-gather the ZeRO++ way, if one applies: a backward gather
 * (bwd) of a unit with a secondary shard runs in the hpZ group; else with
 * qwZ the int8 blocks go out. *posted false: none applies (the caller
 * posts the plain all-gather). The request is u->ag either way. */
dt_status dt__zpp_post_gather(dt_zero *z, zunit *u, bool bwd, bool *posted);
/* u->ag completed with status st: dequantize (qwZ) into u->full, drop a
 * secondary shard the gather read, free the buffers. */
dt_status dt__zpp_finish_gather(dt_zero *z, zunit *u, dt_status st);
/* hpZ, u gathered and about to be freed after its forward: keep its
 * secondary shard (a failed allocation keeps none: the backward then
 * gathers over all ranks, the same values). */
void dt__zpp_keep_secondary(dt_zero *z, zunit *u);
/* Drop u's secondary shard (the parameters changed, or it was used). */
void dt__zpp_drop_secondary(dt_zero *z, zunit *u);
/* qgZ: reduce-scatter u's whole gradients g (u->rdt, u->total) into
 * u->gshard (average), synchronously. */
dt_status dt__zpp_reduce(dt_zero *z, zunit *u, const void *g);

/* zero.c: unmap and free one unit's buffers. */
void dt__zero_unit_unmap(zunit *u);
dt_status dt__zero_unit_err(const zunit *u, dt_status st, const char *what);

/* zero_offload.c: parameter offload. */
/* Open the store and add a region per non-resident unit (init). */
dt_status dt__zo_open(dt_zero *z);
/* Close the store (files removed), after dropping every buffer. */
void dt__zo_close(dt_zero *z);
/* Post the read of u's shard into a new buffer unless it is in memory. */
dt_status dt__zo_fetch(dt_zero *z, zunit *u);
/* u's shard in memory and complete (fetch + wait). */
dt_status dt__zo_ready(dt_zero *z, zunit *u);
/* Return u's buffer (waits for its I/O first). */
void dt__zo_drop(dt_zero *z, zunit *u);
/* A fresh buffer for u's shard, no read (init fills it, then writes it). */
dt_status dt__zo_buffer(dt_zero *z, zunit *u);
/* Write u's shard (init: synchronous). */
dt_status dt__zo_write_sync(dt_zero *z, zunit *u);
/* Post reads for the units after position pos of the schedule (forward
 * order, then backward), up to buffer_count shards in memory. */
void dt__zo_readahead(dt_zero *z, int pos);
/* Hold an I/O error of a hook for the step's check: on one rank it would
 * leave the others waiting in a collective. Returns DT_OK, or st when
 * there are no peers to wait (W == 1). */
dt_status dt__zo_hold(dt_zero *z, dt_status st);
/* Combine st over all ranks (MAX of failure): the failing rank's own
 * error, or DT_ERR_IO naming `what` on the others. */
dt_status dt__zo_agree(dt_zero *z, dt_status st, const char *what);

#endif
