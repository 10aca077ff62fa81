/* Private to the trainer's checkpoint files (trainer_ckpt.c: saving and the
 * overview of the format; trainer_ckpt_load.c: loading and the pieces a rank
 * holds; trainer_ckpt_dir.c: the save directory). Include it from those only. */
#ifndef DT_TRAIN_TRAINER_CKPT_IMPL_H
#define DT_TRAIN_TRAINER_CKPT_IMPL_H

#include "train/train_impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define INDEX_FILE "index.json"
#define META_RUN "dtrain.run"
#define META_USER "dtrain.user"

/* One piece of a trained parameter this rank holds (see the overview). */
typedef struct {
    dt_param_info e;     /* the parameter (name, dtype, shape) */
    size_t lo, hi;       /* its elements held, row-major */
    float *val;          /* their f32 values: the parameter, or its fp32 masters */
    void *lowp;          /* bf16/f16 parameter: the compute copy (e.dtype); else NULL */
    size_t range, roff;  /* optimizer range and the first element's index in it */
    float *sv[4];        /* completed over dp (complete_shares): the whole optimizer states; else NULL */
} tpiece;

/* The pieces, one per trained entry of tr's model in entry order (lo == hi:
 * none of it here); *sharded: some rank holds less than the whole. */
dt_status dt__ckpt_collect_pieces(dt_trainer *tr, tpiece **out, bool *sharded);
/* A parameter the optimizer steps (not a buffer, not tied to another). */
static inline bool dt__ckpt_trained(const tpiece *p) { return !p->e.is_buffer && p->e.tied_to < 0; }
/* The model's tensor-parallel group when it has more than one rank, else NULL. */
dt_pg *dt__ckpt_tp_of(dt_trainer *tr);
/* Slices whose group is unknown cannot be saved or loaded (symmetric on all
 * ranks): DT_ERR_UNSUPPORTED naming op. */
dt_status dt__ckpt_tp_known(dt_trainer *tr, const char *op);

/* Temporaries a killed save left in dir (called by the directory's owner only). */
void dt__ckpt_remove_stale(const char *dir);
/* After the save of step `saved`: keep it and the newest keep - 1 complete
 * checkpoints before it (0: all); later steps (another run's) are left alone. */
void dt__ckpt_prune(const char *dir, int keep, int64_t saved);

#endif /* DT_TRAIN_TRAINER_CKPT_IMPL_H */
