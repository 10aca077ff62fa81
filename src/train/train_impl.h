/* src/train/train_impl.h — the strategy handle shared by strategy*.c and
 * trainer*.c. */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include "dtrain/train.h"

#include <stdatomic.h>

struct dt_strategy {
    dt_strategy_ops ops;
    void *self;
    bool attached;
    dt_model *m;  /* the model attached */
    dt_pg *tp;    /* its tensor-parallel group (tp.h) when of more than one rank, else NULL */
};

/* The "ddp" strategy's handle, or NULL (strategy_ddp.c). */
dt_ddp *dt__strategy_ddp_handle(const dt_strategy *s);

/* strategy.c: the trainer's calls into its strategy. Each runs the slot,
 * or the default train.h gives for a NULL slot; the trainer never asks
 * which strategy it holds. */
/* set_precision (or the refusal of a reduce dtype the strategy cannot
 * honour; model_dtype: the model's first trained dtype), then attach. */
dt_status dt__strategy_attach(dt_strategy *s, dt_model *m, const dt_precision_policy *p, dt_dtype model_dtype);
dt_status dt__strategy_optim_setup(dt_strategy *s, dt_strategy_optim *o);
dt_status dt__strategy_optim_step(dt_strategy *s, bool steps, dt_optim *opt, dt_offload_optim *off);
dt_status dt__strategy_grad_sqnorm(dt_strategy *s, const dt_strategy_grads *g, double *sq);
/* The default grad_sqnorm with a map of pieces (ZeRO's; pc NULL: the
 * ranges are the model's flats). */
dt_status dt__strategy_grad_sqnorm_pieces(dt_strategy *s, const dt_strategy_grads *g, const dt_zero_piece *pc,
                                          size_t npc, double *sq);
dt_status dt__strategy_agree_flags(dt_strategy *s, double *flags, int n);
bool dt__strategy_grads_private(const dt_strategy *s);
/* The pieces in a new array (free()), *n of them; NULL and 0 without the slot. */
dt_status dt__strategy_pieces(dt_strategy *s, dt_zero_piece **out, size_t *n);
dt_status dt__strategy_ckpt_layout(dt_strategy *s, dt_strategy_ckpt *out);
dt_status dt__strategy_after_load(dt_strategy *s);
dt_status dt__strategy_eval_forward(dt_strategy *s, dt_ctx *ctx, dt_tensor *x, dt_tensor **out);
dt_status dt__strategy_eval_share(dt_strategy *s, double *v, int n, dt_status failed);
dt_powersgd *dt__strategy_compress_state(dt_strategy *s, dt_pg **group, dt_reducer **buckets);

/* Where the epoch helper is (trainer_epoch.c keeps it; a checkpoint
 * records it, trainer_state.c). */
typedef struct dt__trainer_pos {
    int64_t epoch;       /* the epoch of the next batch */
    int64_t batch;       /* the next batch within it */
    int64_t batches;     /* micro-batches run by the epoch helper, all epochs */
    int64_t samples;     /* samples over all replicas, every step's (dt__trainer_finish) */
    int64_t epoch_batches; /* batches per epoch of the loader (0 before an epoch ran) */
    int64_t saved_batches; /* a loaded checkpoint's epoch_batches */
    bool order_kept;     /* a loaded checkpoint was saved at this world size */
    bool resume;         /* a loaded checkpoint: the next dt_trainer_epoch(epoch) starts at batch */
} dt__trainer_pos;
dt__trainer_pos *dt__trainer_position(dt_trainer *tr);
/* The data-parallel replicas: the strategy's ranks over those that share a
 * batch (dt_trainer_params.same_batch). */
int dt__trainer_replicas(const dt_trainer *tr);
const dt_trainer_params *dt__trainer_params(const dt_trainer *tr);
void dt__trainer_set_steps(dt_trainer *tr, int64_t steps);
/* The owned range of the f32 flats. */
void dt__trainer_owned(const dt_trainer *tr, size_t *lo, size_t *hi);
/* True when this rank's optimizer steps the whole f32 flat (no sharding). */
bool dt__trainer_whole_state(const dt_trainer *tr);
/* The ranges the optimizer steps (index = the optimizer's range index). */
void dt__trainer_ranges(const dt_trainer *tr, const dt_optim_range **r, size_t *n);
/* The checkpoint write in flight (trainer_ckpt.c owns what it points to);
 * freeing it joins the writer. */
void **dt__trainer_ckpt_slot(dt_trainer *tr);
void dt__trainer_ckpt_free(dt_trainer *tr);

/* trainer.c, for the epoch helpers (trainer_epoch.c) */
/* One micro-batch (sync: the step's last); then the rest of the step. */
dt_status dt__trainer_micro(dt_trainer *tr, const dt_trainer_batch *b, bool sync);
/* dt_trainer_prepare's pieces (trainer.c): whether the strategy and options
 * let a micro-batch run without a trace (no collective, no sharded or
 * offloaded gradients), and that micro-batch (forward and backward without
 * reduction, no fault injected) followed by the gradients' zeroing. */
bool dt__trainer_can_prepare(const dt_trainer *tr);
dt_status dt__trainer_prepare_micro(dt_trainer *tr, const dt_trainer_batch *b);
dt_status dt__trainer_finish(dt_trainer *tr, dt_trainer_metrics *out);
int64_t dt__trainer_grad_accum(const dt_trainer *tr);
/* With one replica a stop request needs no agreement: stop now. */
bool dt__trainer_stop_now(const dt_trainer *tr);
dt_status dt__trainer_sync_buffers(dt_trainer *tr);
/* DoRA: every magnitude of the model (dt_lora_params.dora) this rank holds set to its layer's base weight row
 * norms, then the strategy's copies refreshed (collective, as after a load). None: nothing. trainer_ckpt_load.c. */
dt_status dt__trainer_dora_start(dt_trainer *tr);
/* The trainer's loss (params.loss / loss_fn) on its context. */
dt_tensor *dt__trainer_loss(dt_trainer *tr, dt_tensor *out, dt_tensor *y);

/* trainer_finite.c: non-finite values in a step without loss scaling. */
typedef struct dt__nonfinite {
    int loss_micro;    /* 1-based micro-batch whose local loss is not finite; 0: all finite */
    double loss_value; /* that loss */
    bool grad;         /* some owned gradient is not finite (after the reduction) */
    size_t range, index; /* the first: element `index` of range `range` (relative to its lo) */
} dt__nonfinite;
/* Whether some gradient of the ranges' [lo, hi) is not finite; the first one's range and index.
 * g32 NULL: the ranges' own gradients (their dtype) are read; else g32[k] holds range k's
 * gradients as f32, element i at g32[k][i] (relative to lo): the optimizer's copies, which
 * its unscale pass filled (dt_optim_grads_f32), when the pass may have zeroed the own ones. */
bool dt__grads_nonfinite(const dt_optim_range *rg, size_t nrg, float *const *g32, size_t *range, size_t *index);
/* The check of each gradient as backward finishes it (trainer_finite.c),
 * where the trainer is its only reader and steps whole flats (lazy
 * gradients): the grad-ready hook reads each parameter's final gradient
 * while it is still in cache (or takes the word of what wrote it,
 * dt_ag_grad_checked_finite), so a step whose every gradient was seen
 * finite there skips the read pass over the flats. Armed per micro-batch:
 * only the last one before the step (its gradients are the final sums). A
 * hit or a gradient the hook did not see leaves the answer to
 * dt__grads_nonfinite (which names the first non-finite element). The
 * hook may fire on backward's worker threads: the fields it writes are
 * atomic. */
typedef struct dt__nf_scan {
    dt_model *m;
    dt_hook_id id;
    bool hooked;
    size_t nent;            /* the model's entries */
    size_t need;            /* distinct gradients (tied entries once) to see */
    atomic_bool armed, hit;
    atomic_size_t got;      /* of need seen since arming */
    atomic_uchar *seen;     /* per entry (by the entry a tied one shares): seen since arming */
    int64_t *root;          /* per entry: the entry whose gradient it is (tied_to, or itself); -1: none */
} dt__nf_scan;
/* Add the hook to m (the trainer's model; removed by dt__nf_scan_free). */
dt_status dt__nf_scan_init(dt__nf_scan *s, dt_model *m);
void dt__nf_scan_free(dt__nf_scan *s);
/* Before a micro-batch's backward: arm the check (its gradients will be the
 * step's) or disarm it, forgetting what was seen. No-op when not hooked. */
void dt__nf_scan_arm(dt__nf_scan *s, bool on);
/* After the last micro-batch: true when the check was armed for it, saw
 * every gradient and found each finite (then no read pass is needed). */
bool dt__nf_scan_clean(dt__nf_scan *s);
/* Collective over the replicas, called by every rank once the agreed flag
 * says some rank saw a non-finite loss or gradient: the error naming the
 * step, the ranks, the loss and the first parameter (DT_ERR_INVALID_ARG). */
dt_status dt__trainer_nonfinite_error(dt_trainer *tr, const dt__nonfinite *loc, int64_t step, int nmicro);
/* A copy of the model's buffers into *save (grown to *cap bytes), and back. */
dt_status dt__buffers_snapshot(dt_model *m, void **save, size_t *cap);
void dt__buffers_restore(dt_model *m, const void *save);
/* DT_FAULT_NONFINITE=RANK:STEP:WHAT (tests): at optimizer step STEP (1-based)
 * rank RANK makes its loss NaN (loss), its first owned gradient NaN after
 * the reduction (grad), or its input's first element +inf (input). */
typedef enum { DT__FAULT_NONE, DT__FAULT_LOSS, DT__FAULT_GRAD, DT__FAULT_INPUT } dt__fault_what;
typedef struct dt__fault {
    int rank;
    int64_t step;
    dt__fault_what what;
} dt__fault;
dt_status dt__fault_parse(dt__fault *f);
void dt__fault_grad(const dt_optim_range *rg, size_t nrg);
/* A malloc'd copy of x (n elements) with its first element +inf; NULL for another dtype. */
void *dt__fault_input(const void *x, dt_dtype dt, size_t n);

#endif
