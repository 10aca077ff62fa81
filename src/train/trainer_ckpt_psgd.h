/* src/train/trainer_ckpt_psgd.h — PowerSGD's state in trainer checkpoints
 * (trainer_ckpt_psgd.c; trainer_ckpt.c calls these). */
#ifndef DT_TRAINER_CKPT_PSGD_H
#define DT_TRAINER_CKPT_PSGD_H

#include "dtrain/ckpt.h"
#include "dtrain/train.h"

#define DT__PSGD_META "dtrain.powersgd"
#define DT__PSGD_Q "powersgd.q"
#define DT__PSGD_ERROR "powersgd.error"

/* What a save writes of it (rank 0; the other ranks' fields are empty). */
typedef struct dt__psgd_saved {
    char *meta;          /* the "dtrain.powersgd" metadata (dt_alloc); NULL: no PowerSGD state */
    float *q;            /* nq floats (dt_alloc) */
    size_t nq;
    float *err;          /* world x nerr floats (dt_alloc) */
    size_t nerr;
    int world;
} dt__psgd_saved;

/* Collective over every rank of a save (DDP's group): the run's PowerSGD
 * state, the errors gathered to rank 0. *out zeroed when the run has none. */
dt_status dt__psgd_ckpt_collect(dt_trainer *tr, dt__psgd_saved *out);
/* Entries over c's arrays (borrowed: the caller keeps c's buffers alive). */
dt_status dt__psgd_saved_entries(dt__psgd_saved *c, dt_ckpt_list *l);
void dt__psgd_saved_release(dt__psgd_saved *c);
/* Restore a checkpoint's PowerSGD state into the run's hook (not collective). */
dt_status dt__psgd_ckpt_load(dt_trainer *tr, dt_ckpt *ck, const char *ckname);

#endif
