/* dt_trainer_prepare: one forward and backward before the first step that
 * leaves no trace in the training (train.h).
 *
 * What the first step would otherwise pay: the context's arena grows block
 * by block while the activations are written (fresh pages: faults and the
 * kernel's zeroing) and is replaced by one committed block at the reset;
 * the matmul and convolution primitives are created (oneDNN JIT) and their
 * packed weights and scratch buffers first sized. dt_trainer_prepare pays all of
 * it on the first batch; the steps after it take no page fault and create
 * no primitive. What it must not change: the parameters, gradients (zero
 * after it, or marked zero where the trainer zeroes lazily, as after a
 * step), the model's buffers (batch-norm running statistics: restored), the
 * random streams (the modules' dropout counters: restored), the optimizer
 * state, the step count and the schedule (not touched). */
#include "train/train_impl.h"

#include <stdlib.h>

dt_status dt_trainer_prepare(dt_trainer *tr, const dt_trainer_batch *b, bool *ran)
{
    if (ran)
        *ran = false;
    if (!tr || !b)
        return dt_error(DT_ERR_NULL, "dt_trainer_prepare: %s is NULL", tr ? "batch" : "trainer");
    if (!dt__trainer_can_prepare(tr))
        return DT_OK; /* the first step sizes what it needs */
    dt_model *m = dt_trainer_model(tr);
    size_t nrng = dt_model_rng_state_size(m);
    uint64_t *rng = malloc((nrng ? nrng : 1) * sizeof *rng);
    void *bufs = NULL;
    size_t bufcap = 0;
    dt_status st;
    if (!rng) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_trainer_prepare: %zu random-stream counters", nrng);
        goto done;
    }
    if ((st = dt_model_get_rng_state(m, rng, nrng)) < 0 || (st = dt__buffers_snapshot(m, &bufs, &bufcap)) < 0)
        goto done;
    st = dt__trainer_prepare_micro(tr, b);
    dt__buffers_restore(m, bufs);
    dt_status rs = dt_model_set_rng_state(m, rng, nrng);
    if (st < 0) {
        dt_error_wrap(st, "dt_trainer_prepare");
        goto done;
    }
    st = rs;
    if (st == DT_OK && ran)
        *ran = true;
done:
    free(rng);
    free(bufs);
    return st;
}
