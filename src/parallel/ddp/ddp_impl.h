/* src/parallel/ddp/ddp_impl.h — DDP internals shared by ddp.c (construction,
 * forward) and ddp_hooks.c (the iteration around the reduction engine). */
#ifndef DT_DDP_IMPL_H
#define DT_DDP_IMPL_H

#include "dtrain/parallel.h"

#define DT__DDP_MAX_DTYPES 3 /* f32, bf16, f16 */

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
    /* One reducer per dtype of trained parameters (f32, bf16, f16), in the
     * order the dtypes first appear in the model: red[0] is dt_ddp_reducer's.
     * A reducer's gradient flat is dt_pg_alloc'd and handed to the model. */
    int nred;
    dt_dtype dtype[DT__DDP_MAX_DTYPES];
    dt_flat gflat[DT__DDP_MAX_DTYPES];
    dt_reducer *red[DT__DDP_MAX_DTYPES]; /* buckets, ordered posting, waiting (reducer.c) */
    int8_t *red_of_entry; /* entry index -> index into red[], -1 for buffers */
    dt_hook_id hook;     /* the model's grad-ready hook */
    dt_powersgd *psgd;   /* comm_hook POWERSGD: the hook's state (powersgd.c), else NULL */
    int np;
    int marks_live;      /* end-of-backward marks recorded and not yet reached */
    dt__ddp_state state;
    dt_status fail_st;
    char fail_msg[512];
    bool no_sync;
    bool hooked;
    size_t nentry;
    int *slot_of_entry;  /* entry index -> parameter slot (used bitmap), -1 for buffers */
    uint8_t *used_local, *used_global; /* per parameter slot */
    dt_req *used_req;
    double t0, t_bwd_end;
    dt_ddp_stats st;
};

/* Over every reducer (ddp_hooks.c): parameters whose gradient arrived. */
int dt__ddp_num_ready(const dt_ddp *d);

/* ddp_hooks.c */
dt_status dt__ddp_grad_ready(dt_model *m, size_t index, const dt_param_info *p, void *ud);
dt_status dt__ddp_end_mark(dt_ctx *ctx, void *ud);
void dt__ddp_begin_iteration(dt_ddp *d);
void dt__ddp_drain(dt_ddp *d);

#endif
