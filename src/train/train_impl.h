/* src/train/train_impl.h — the strategy handle shared by strategy*.c and
 * trainer*.c. */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include "dtrain/train.h"

struct dt_strategy {
    dt_strategy_ops ops;
    void *self;
    bool attached;
};

/* The "ddp" strategy's handle, or NULL (strategy_ddp.c). */
dt_ddp *dt__strategy_ddp_handle(const dt_strategy *s);

/* trainer.c, for the epoch helpers (trainer_epoch.c) */
/* One micro-batch (sync: the step's last); then the rest of the step. */
dt_status dt__trainer_micro(dt_trainer *tr, const dt_trainer_batch *b, bool sync);
dt_status dt__trainer_finish(dt_trainer *tr, dt_trainer_metrics *out);
int64_t dt__trainer_grad_accum(const dt_trainer *tr);
/* With one replica a stop request needs no agreement: stop now. */
bool dt__trainer_stop_now(const dt_trainer *tr);
dt_status dt__trainer_sync_buffers(dt_trainer *tr);
/* The trainer's loss (params.loss / loss_fn) on its context. */
dt_tensor *dt__trainer_loss(dt_trainer *tr, dt_tensor *out, dt_tensor *y);

#endif
