/* src/train/strategy_pipe_impl.h — the "pipe" strategy's state, shared by
 * its two files: strategy_pipe.c (attach, the slots, the public calls of
 * pipe_strategy.h) and strategy_pipe_stages.c (what a rank holds and
 * steps: the stages' entries, the optimizer ranges and their ZeRO-1
 * shares, measured unit costs, keeping and initialising only the stages'
 * parameters). Private to src/train. */
#ifndef DT_STRATEGY_PIPE_IMPL_H
#define DT_STRATEGY_PIPE_IMPL_H

#include "train/train_impl.h"

#include "dtrain/pipe_strategy.h"
#include "nn/nn_layer.h"
#include "parallel/pipeline/pipe_exec.h"

typedef struct {
    dt_pg *g;          /* the ranks that use it */
    int root;          /* the owner's rank in g */
    int k;             /* its range (the dtype of its storage) */
    size_t off, numel; /* in that dtype's flats */
} tie;

#define NDT 3
static const dt_dtype k_dts[NDT] = {DT_F32, DT_BF16, DT_F16}; /* the dtypes a rank may step */

/* This rank's parameters of one dtype: the entries of its stages (fsegs,
 * spanning [lo, hi) of the model's flats of that dtype) and, under ZeRO-1,
 * its share [a, b) of them over the replicas (segs: fsegs clipped to it). */
typedef struct {
    const dt_flat *P, *G;        /* the model's flats of this dtype (NULL: none) */
    dt_flat master;              /* bf16/f16: f32 master weights of [a, b) */
    bool has_master;
    dt_optim_segment *fsegs, *segs;
    size_t nfseg, nseg;
    size_t lo, hi, a, b;
    size_t *counts, *displs;     /* ZeRO-1: the replicas' shares of [lo, hi) (D each) */
    size_t *runs, nrun;          /* the runs [runs[2i], runs[2i+1]) of fsegs separated by padding only:
                                    the replicas' collectives go over each (interleaved: not over the
                                    other stages between this rank's chunks, which it does not hold) */
    size_t *rcounts, *rdispls;   /* ZeRO-1: per run, the replicas' shares clipped to it (D each) */
    void *rs;                    /* ZeRO-1: the reduce-scatter's output (b - a elements) */
} prange;

typedef struct {
    dt_pg *world, *pp, *dp; /* pp, dp: the mesh's groups (borrowed) */
    dt_mesh *mesh, *own_mesh;
    dt_pipe_params p;
    int *cuts;
    int P, D, T, pr, v, S;
    dt_model *m;
    dt_pipe_unit *units;
    int nunits;
    int *starts;
    dt_pipe_schedule *sched;
    dt__pipe_exec *ex;
    prange rk[NDT];
    dt_optim_range range[NDT];
    size_t nrange;
    dt_dtype amp;           /* autocast dtype of the stages' contexts (DT_F32: off) */
    tie *ties;
    int nties;
    size_t stage_bytes;     /* bytes of the parameters this rank's stages use (shared ones included) */
    int *eown;              /* per entry: the pipeline rank that steps its storage (-1: a buffer, a tied
                               entry or a dtype not trained) */
    void *sample;           /* DT_PIPE_BY_TIME: a copy of params.sample's x */
    dt_dtype sample_dt;
    int sample_nd;
    int64_t sample_shape[DT_MAX_DIMS];
} pipe_strategy;

/* The index of dtype t in k_dts, -1 for another. */
int dt__pipe_dt_index(dt_dtype t);
/* Stage of every entry's storage: the first stage using it (-1: none), and
 * which pipeline ranks use it (users[key * P + rank]). */
dt_status dt__pipe_ownership(pipe_strategy *s, int *owner, bool *users);
/* Range k from its entries (fsegs): the span, this rank's ZeRO-1 share,
 * the clipped segments and the optimizer's view (appended to s->range). */
dt_status dt__pipe_make_range(pipe_strategy *s, int k);
/* DT_PIPE_BY_TIME: the units' measured costs, agreed over the world. */
dt_status dt__pipe_timed_costs(pipe_strategy *s, dt_model *m, double *cost);
/* This rank keeps only its stages' parts of the flats (the pages outside
 * go back to the system). */
dt_status dt__pipe_keep_stages(pipe_strategy *s, const bool *users);
/* A meta model: keep, map and initialise only this rank's stages' entries. */
dt_status dt__pipe_init_stages(pipe_strategy *s, const bool *users);
/* DT_PIPE_BY_TIME: keep a copy of params.sample's x. */
dt_status dt__pipe_copy_sample(pipe_strategy *s);

#endif
