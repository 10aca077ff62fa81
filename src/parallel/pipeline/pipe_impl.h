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

#endif
