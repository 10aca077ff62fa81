/* tools/train_ddp.h — the data-parallel side of `dtrain train` (owned by the
 * DDP work; cmd_train.c calls these at a few marked places). Not a public
 * interface.
 *
 * With world size 1 (no launcher) everything here is a no-op and the
 * command trains exactly as before. With world size > 1 (`dtrain run -n N`,
 * torchrun, mpirun...): a process group from the environment, the model
 * wrapped in DDP (optionally with SyncBatchNorm), a DistributedSampler for
 * the training set, the test set split into contiguous per-rank ranges,
 * losses and evaluation sums all-reduced, and only rank 0 printing
 * progress and writing metrics. --grad-accum works at any world size. */
#ifndef DT_TOOLS_TRAIN_DDP_H
#define DT_TOOLS_TRAIN_DDP_H

#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct dt__ddp_run {
    dt_pg *pg;        /* NULL at world size 1 */
    dt_ddp *ddp;      /* NULL at world size 1 */
    int rank, world;
    bool sync_bn;
    double bucket_mb; /* 0 = default (25) */
    int64_t accum;    /* micro-batches per optimizer step (>= 1) */
    int64_t micro;    /* micro-batches done in the current accumulation */
    int nconverted;   /* BatchNorm2d modules switched to SyncBatchNorm */
} dt__ddp_run;

/* Read the world from the environment and, if it has more than one rank,
 * create the process group (collective). Returns 0 or an exit code after
 * printing one line. */
int dt__ddp_setup(dt__ddp_run *r, bool sync_bn, double bucket_mb, int64_t grad_accum);

/* After the model exists: SyncBatchNorm conversion and dt_ddp_init (which
 * broadcasts rank 0's weights). Returns 0 or an exit code. */
int dt__ddp_wrap(dt__ddp_run *r, dt_model *m);

/* The training sampler: distributed at world size > 1, else the random one. */
dt_status dt__ddp_train_sampler(const dt__ddp_run *r, int64_t n, uint64_t seed, dt_shuffle_rng rng,
                                dt_sampler **out);

/* This rank's range [lo, hi) of n evaluation items. */
void dt__ddp_eval_range(const dt__ddp_run *r, int64_t n, int64_t *lo, int64_t *hi);

/* Forward for a training micro-batch (through DDP when there is one). */
dt_tensor *dt__ddp_forward(dt__ddp_run *r, dt_ctx *ctx, dt_model *m, dt_tensor *x);

/* Gradient accumulation: call before each micro-batch's forward with
 * `last_in_epoch` true for the epoch's final batch. Returns true when this
 * micro-batch's backward is followed by an optimizer step; sets no_sync. */
bool dt__ddp_begin_micro(dt__ddp_run *r, bool last_in_epoch);
/* The factor the micro-batch's loss is scaled by before backward (1/accum). */
float dt__ddp_loss_scale(const dt__ddp_run *r);

/* After backward, before the optimizer step: wait for the gradient
 * all-reduces. Returns DT_OK or the error (message set). */
dt_status dt__ddp_sync(dt__ddp_run *r);

/* Before a sharded evaluation: every rank takes rank 0's buffers. */
dt_status dt__ddp_sync_buffers(dt__ddp_run *r);

/* All-reduce n doubles (SUM) when distributed; no-op otherwise. */
dt_status dt__ddp_sum(dt__ddp_run *r, double *v, int n);

/* Whether this rank prints and writes files (rank 0). */
bool dt__ddp_is_main(const dt__ddp_run *r);

/* One line about DDP for the final report ("" at world size 1). */
void dt__ddp_summary(const dt__ddp_run *r, int64_t steps, char *buf, size_t n);

/* Release the DDP handle (before the model) and the group (last). */
void dt__ddp_free_ddp(dt__ddp_run *r);
void dt__ddp_free_group(dt__ddp_run *r);

#endif
