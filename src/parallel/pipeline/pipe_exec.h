/* src/parallel/pipeline/pipe_exec.h — Layer-internal: the pipeline
 * executor, one rank's runner of a schedule's table (exec.c).
 *
 * Included from outside src/parallel by src/train/strategy_pipe_impl.h only:
 * the "pipe" strategy (pipe_strategy.h) drives it. It knows nothing of the
 * trainer: a micro-batch comes as a dt__pipe_batch (the input, the target,
 * the loss to apply on the last stage and the backward scale). */
#ifndef DT_PIPE_EXEC_H
#define DT_PIPE_EXEC_H

#include "dtrain/pipeline.h"

/* The loss the last stage applies: a scalar tensor on ctx, or NULL with the
 * error set (the trainer's dt_trainer_loss_fn has this type). */
typedef dt_tensor *(*dt__pipe_loss_fn)(void *ud, dt_ctx *ctx, dt_tensor *output, dt_tensor *target);

/* One run of the table: a micro-batch split into the schedule's m. */
typedef struct dt__pipe_batch {
    dt_tensor *x;              /* the input (contiguous, batch first) */
    dt_tensor *y;              /* its target, NULL when the loss takes none */
    dt__pipe_loss_fn loss;     /* the loss on the last stage's output */
    void *loss_ud;             /* its first argument */
    float scale;               /* backward runs from loss x scale / m per part */
    double loss_value;         /* out: the mean loss over the m parts on the last stage's rank, 0 on
                                  the others */
} dt__pipe_batch;

/* exec.c: one rank's runner of a table. */
typedef struct dt__pipe_exec dt__pipe_exec;
/* pg: the pipeline group (borrowed); units and starts (S + 1 entries, the
 * last = the unit count) borrowed / copied; sched borrowed. */
dt_status dt__pipe_exec_init(dt_pg *pg, dt_model *m, const dt_pipe_unit *units, const int *starts, int S,
                             const dt_pipe_schedule *sched, dt__pipe_exec **out);
/* Run the table on fb's micro-batch (split into m); sets fb->loss_value. */
dt_status dt__pipe_exec_run(dt__pipe_exec *e, dt__pipe_batch *fb);
/* Evaluation: x (the whole batch) forward through the stages on ctx
 * (gradients as ctx has them: the caller disables them), in stage order,
 * activations sent on between the ranks. *out: the last stage's output on
 * its rank, NULL on the others. A failure fails the pipeline group (as a
 * broken schedule does). */
dt_status dt__pipe_exec_forward(dt__pipe_exec *e, dt_ctx *ctx, dt_tensor *x, dt_tensor **out);
/* Contexts made from now on compute under autocast in dt (bf16/f16). */
void dt__pipe_exec_set_autocast(dt__pipe_exec *e, dt_dtype dt);
void dt__pipe_exec_stats(const dt__pipe_exec *e, dt_pipe_stats *out);
dt_status dt__pipe_exec_msg_times(const dt__pipe_exec *e, double *t, size_t n);
/* This rank's list and its trace of the last step (borrowed). */
void dt__pipe_exec_trace(const dt__pipe_exec *e, const dt_pipe_action **acts, const double **t, int *n);
void dt__pipe_exec_free(dt__pipe_exec *e);

#endif
