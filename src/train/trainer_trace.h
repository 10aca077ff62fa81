/* src/train/trainer_trace.h — the trainer's hooks into the timeline
 * (trainer_trace.c, called from trainer.c). */
#ifndef DT_TRAIN_TRAINER_TRACE_H
#define DT_TRAIN_TRAINER_TRACE_H

#include "dtrain/trace.h"
#include "dtrain/train.h"

#include <stdio.h>

typedef struct dt__trainer_trace dt__trainer_trace;

/* Open the tracer when p->dir is set and none is open; when one is open,
 * hook m's units if `units` (*out; NULL when tracing is off: nothing
 * allocated). A strategy that runs the micro-batches itself (a pipeline,
 * which cuts the model before the trainer starts and records its actions)
 * gets no unit hooks. */
dt_status dt__trainer_trace_init(dt_model *m, bool units, const dt_trace_params *p, int rank, int world,
                                 dt__trainer_trace **out);
/* Remove the hooks; close (write) the tracer if opened by init. NULL: no-op. */
void dt__trainer_trace_free(dt__trainer_trace *t, dt_model *m);
/* The step's counters (loss scale, memory in use) while recording. */
void dt__trainer_trace_counters(const dt_loss_scaler *scaler);

#endif
