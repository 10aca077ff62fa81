/* Internals of the pipeline layer (pipeline.h): the table and its lists. */
#ifndef DT_PIPE_IMPL_H
#define DT_PIPE_IMPL_H

#include "dtrain/pipeline.h"

#define DT_PIPE_MAX_RANKS 256
#define DT_PIPE_MAX_MICRO 4096
#define DT_PIPE_MAX_STAGES 1024

/* One rank's actions, growing while a table is built. */
typedef struct dt__pipe_list {
    dt_pipe_action *a;
    int n, cap;
} dt__pipe_list;

struct dt_pipe_schedule {
    dt_pipe_kind kind;   /* DT_PIPE_KIND_COUNT: from explicit actions */
    int p, m, v;
    dt__pipe_list *lists; /* p of them */
};
typedef struct dt_pipe_schedule dt__pipe_sched;

/* check.c: check s (structure, message order, deadlock freedom by replay)
 * and set every action's time step (unit costs). */
dt_status dt__pipe_check_and_time(dt__pipe_sched *s);
/* "F(stage 2, mb 5)", "SEND_B(stage 3, mb 0 -> rank 1)" into buf. */
const char *dt__pipe_action_str(const dt_pipe_action *a, char *buf, size_t n);

/* pipe_units.c: does unit u use parameter entry `entry` (by name)? */
bool dt__pipe_unit_uses(const dt_pipe_unit *u, const char *entry);

/* exec.c: one rank's runner of a table. */
typedef struct dt__pipe_exec dt__pipe_exec;
/* pg: the pipeline group (borrowed); units and starts (S + 1 entries, the
 * last = the unit count) borrowed / copied; sched borrowed. */
dt_status dt__pipe_exec_init(dt_pg *pg, dt_model *m, const dt_pipe_unit *units, const int *starts, int S,
                             const dt_pipe_schedule *sched, dt__pipe_exec **out);
/* Run the table on fb's micro-batch (split into m). */
dt_status dt__pipe_exec_run(dt__pipe_exec *e, dt_strategy_fb *fb);
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
