/* src/parallel/ddp_impl.h — DDP internals shared by ddp.c (construction,
 * forward) and ddp_reducer.c (buckets, hooks, posting, waiting). */
#ifndef DT_DDP_IMPL_H
#define DT_DDP_IMPL_H

#include "dtrain/parallel.h"

typedef struct dt__ddp_param {
    size_t entry;        /* model entry index */
    size_t offset;       /* element offset in the flat buffers */
    size_t numel;
    const char *name;    /* borrowed from the model */
    int bucket;
    bool ready;          /* its gradient landed in this iteration */
} dt__ddp_param;

typedef struct dt__ddp_bucket {
    size_t offset, numel, bytes;
    int p_lo, p_hi;      /* parameter slots [p_lo, p_hi), model order */
    int pending;         /* parameters not yet ready in this iteration */
    bool complete, posted;
    dt_req *req;
    double ready_s, posted_s, done_s;
} dt__ddp_bucket;

typedef enum {
    DT__DDP_IDLE = 0,    /* no iteration under way */
    DT__DDP_PREPARED,    /* forward ran; backward not finished */
    DT__DDP_REDUCING,    /* backward finished; reductions may be outstanding */
    DT__DDP_FAILED,      /* a reduction or the end-of-backward check failed */
} dt__ddp_state;

struct dt_ddp {
    dt_pg *pg;
    dt_model *m;
    dt_ddp_params p;
    int rank, world;
    dt_flat gflat;       /* the f32 gradient flat, dt_pg_alloc'd (handed to the model) */
    float *grads;        /* gflat.base */
    dt_hook_id hook;     /* the model's grad-ready hook */
    size_t flat_numel;
    dt__ddp_param *params;
    int np;
    int *slot_of_entry;  /* entry index -> parameter slot, -1 for buffers */
    size_t nentry;
    dt__ddp_bucket *b;
    int nb;
    int next_post;       /* lowest bucket index not yet posted */
    int nready;
    int marks_live;      /* end-of-backward marks recorded and not yet reached */
    dt__ddp_state state;
    dt_status fail_st;
    char fail_msg[512];
    bool no_sync;
    bool hooked;
    uint8_t *used_local, *used_global; /* per parameter slot */
    dt_req *used_req;
    double t0, t_bwd_end;
    dt_ddp_stats st;
};

/* ddp_reducer.c */
dt_status dt__ddp_build_buckets(dt_ddp *d);
dt_status dt__ddp_grad_ready(dt_model *m, size_t index, const dt_param_info *p, void *ud);
dt_status dt__ddp_end_mark(dt_ctx *ctx, void *ud);
void dt__ddp_begin_iteration(dt_ddp *d);
void dt__ddp_drain(dt_ddp *d);

#endif
