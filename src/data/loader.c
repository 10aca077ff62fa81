/* The prefetching loader: one background thread per epoch fills a ring of
 * prefetch + 1 batch slots in the batch sampler's order.
 *
 * Batch b lives in slot b % nslots. The consumer holds the slot of the batch
 * it was last given until its next call, so the producer may fill batch b
 * only while b < released + nslots (released = batches the consumer has
 * given back by asking for the next one). One
 * producer writing batches in order makes the sequence independent of
 * timing. An error on the producer stops it at batch err_at; the consumer
 * still receives every batch before err_at, then the error (its message
 * copied across threads, since dt_last_error is thread-local). Stopping
 * (a new epoch, or free) sets a flag the producer checks between batches
 * and under every wait, then joins it. */
#include "dtrain/data.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_batch b;
    void *x, *y;
} slot;

struct dt_loader {
    dt_dataset *ds;
    dt_batch_sampler *bs;
    dt_loader_params p;
    int nslots;
    slot *slots;
    size_t xb, yb;   /* bytes per sample */
    int64_t nb;      /* batches per epoch */
    int64_t epoch;
    int64_t first;   /* the epoch's first batch (dt_loader_start_epoch_at) */
    bool active;     /* an epoch has been started */
    bool thread_live;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv_prod, cv_cons;
    int64_t produced, consumed, released;
    bool stop;
    dt_status err;
    int64_t err_at;
    char errmsg[1024];
};

dt_loader_params dt_loader_params_default(void)
{
    dt_loader_params p = {.batch_size = 64, .drop_last = false, .prefetch = 2, .background = true};
    return p;
}

int64_t dt_loader_num_batches(const dt_loader *ld) { return ld ? ld->nb : 0; }

/* A NaN or infinity in a batch's f32 inputs or targets is bad data, not a
 * learning rate too large: fail naming the data set, the epoch's batch and
 * the item (its index in the data set) and where in it, before the step
 * turns it into a non-finite loss. One pass over the batch (memory-bound,
 * small beside the step it feeds). */
static dt_status check_finite(const dt_loader *ld, const void *buf, dt_dtype dt, size_t per_item, int64_t n,
                              const int64_t *idx, int64_t b, const char *what)
{
    if (dt != DT_F32 || per_item == 0)
        return DT_OK;
    const float *v = buf;
    const size_t total = per_item * (size_t)n;
    for (size_t k = 0; k < total; k++)
        if (!isfinite(v[k])) {
            char src[300];
            const char *name = dt_dataset_source(ld->ds);
            dt_escape(name ? name : "the data set", src, sizeof src);
            const size_t item = k / per_item;
            return dt_error(DT_ERR_FORMAT, "%s: item %lld (batch %lld of epoch %lld) has %s %s at element %zu: the "
                            "data holds non-finite values; clean it (or leave the item out) and rerun", src,
                            (long long)idx[item], (long long)b + 1, (long long)ld->epoch + 1,
                            isnan(v[k]) ? "a NaN" : "an infinite", what, k % per_item);
        }
    return DT_OK;
}

/* Fill batch b into its slot (no lock held: the slot is the producer's). */
static dt_status load_batch(dt_loader *ld, int64_t b)
{
    slot *s = &ld->slots[b % ld->nslots];
    const int64_t *idx;
    int64_t n;
    dt_status st = dt_batch_sampler_get(ld->bs, b, &idx, &n);
    if (st < 0)
        return st;
    st = dt_dataset_get_batch(ld->ds, idx, n, s->x, s->y);
    if (st < 0)
        return st;
    const dt_dataset_info *info = dt_dataset_get_info(ld->ds);
    if ((st = check_finite(ld, s->x, info->x_dtype, ld->xb / dt_dtype_size(info->x_dtype), n, idx, b, "input")) < 0 ||
        (st = check_finite(ld, s->y, info->y_dtype, ld->yb / dt_dtype_size(info->y_dtype), n, idx, b, "target")) < 0)
        return st;
    s->b = (dt_batch){.epoch = ld->epoch, .index = b, .size = n, .x = s->x, .y = s->y, .indices = idx};
    return DT_OK;
}

static void *producer(void *arg)
{
    dt_loader *ld = arg;
    for (int64_t b = ld->first; b < ld->nb; b++) {
        pthread_mutex_lock(&ld->mu);
        while (!ld->stop && b >= ld->released + ld->nslots)
            pthread_cond_wait(&ld->cv_prod, &ld->mu);
        bool stop = ld->stop;
        pthread_mutex_unlock(&ld->mu);
        if (stop)
            break;
        dt_status st = load_batch(ld, b);
        pthread_mutex_lock(&ld->mu);
        if (st < 0) {
            ld->err = st;
            ld->err_at = b;
            snprintf(ld->errmsg, sizeof ld->errmsg, "%s", dt_last_error());
        } else {
            ld->produced = b + 1;
        }
        pthread_cond_signal(&ld->cv_cons);
        pthread_mutex_unlock(&ld->mu);
        if (st < 0)
            break;
    }
    return NULL;
}

static void stop_thread(dt_loader *ld)
{
    if (!ld->thread_live)
        return;
    pthread_mutex_lock(&ld->mu);
    ld->stop = true;
    pthread_cond_broadcast(&ld->cv_prod);
    pthread_mutex_unlock(&ld->mu);
    pthread_join(ld->th, NULL);
    ld->thread_live = false;
}

dt_status dt_loader_init(dt_dataset *ds, dt_sampler *s, const dt_loader_params *p, dt_loader **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_loader_init: out is NULL");
    *out = NULL;
    if (!ds || !s)
        return dt_error(DT_ERR_INVALID_ARG, "dt_loader_init: NULL dataset or sampler");
    dt_loader_params pp = p ? *p : dt_loader_params_default();
    if (pp.batch_size < 1)
        return dt_error(DT_ERR_INVALID_ARG, "loader: batch size %lld < 1", (long long)pp.batch_size);
    if (pp.prefetch < 1 || pp.prefetch > 64)
        return dt_error(DT_ERR_INVALID_ARG, "loader: prefetch %d outside 1..64", pp.prefetch);
    dt_loader *ld = calloc(1, sizeof *ld);
    if (!ld)
        return dt_error(DT_ERR_NO_MEMORY, "loader: out of memory");
    ld->ds = ds;
    ld->p = pp;
    ld->xb = dt_dataset_x_bytes(ds);
    ld->yb = dt_dataset_y_bytes(ds);
    ld->nslots = pp.background ? pp.prefetch + 1 : 1;
    pthread_mutex_init(&ld->mu, NULL);
    pthread_cond_init(&ld->cv_prod, NULL);
    pthread_cond_init(&ld->cv_cons, NULL);
    dt_status st = dt_batch_sampler_init(s, pp.batch_size, pp.drop_last, &ld->bs);
    if (st < 0)
        goto fail;
    ld->nb = dt_batch_sampler_length(ld->bs);
    /* Slots as large as a batch can be: no batch holds more items than the
     * sampler gives (a 16-item test set with batch 500 needs 16 rows, not
     * 500), and no more slots than an epoch has batches. */
    int64_t rows = pp.batch_size < dt_sampler_length(s) ? pp.batch_size : dt_sampler_length(s);
    rows = rows > 0 ? rows : 1;
    if (ld->nb >= 1 && ld->nb < ld->nslots)
        ld->nslots = (int)ld->nb;
    ld->slots = calloc((size_t)ld->nslots, sizeof *ld->slots);
    if (!ld->slots) {
        st = dt_error(DT_ERR_NO_MEMORY, "loader: out of memory");
        goto fail;
    }
    for (int i = 0; i < ld->nslots; i++) {
        ld->slots[i].x = dt_alloc((size_t)rows * ld->xb);
        ld->slots[i].y = dt_alloc((size_t)rows * ld->yb);
        if (!ld->slots[i].x || !ld->slots[i].y) {
            st = dt_error(DT_ERR_NO_MEMORY, "loader: cannot allocate %d batches of %lld samples (%zu bytes)",
                          ld->nslots, (long long)rows, (size_t)ld->nslots * (size_t)rows * (ld->xb + ld->yb));
            goto fail;
        }
    }
    *out = ld;
    return DT_OK;
fail:
    dt_loader_free(ld);
    return st;
}

void dt_loader_free(dt_loader *ld)
{
    if (!ld)
        return;
    stop_thread(ld);
    if (ld->slots)
        for (int i = 0; i < ld->nslots; i++) {
            dt_free(ld->slots[i].x);
            dt_free(ld->slots[i].y);
        }
    free(ld->slots);
    dt_batch_sampler_free(ld->bs);
    pthread_mutex_destroy(&ld->mu);
    pthread_cond_destroy(&ld->cv_prod);
    pthread_cond_destroy(&ld->cv_cons);
    free(ld);
}

dt_status dt_loader_start_epoch(dt_loader *ld, int64_t epoch) { return dt_loader_start_epoch_at(ld, epoch, 0); }

dt_status dt_loader_start_epoch_at(dt_loader *ld, int64_t epoch, int64_t first_batch)
{
    if (!ld)
        return dt_error(DT_ERR_INVALID_ARG, "dt_loader_start_epoch: NULL loader");
    if (first_batch < 0 || first_batch > ld->nb)
        return dt_error(DT_ERR_RANGE, "dt_loader_start_epoch_at: batch %lld of an epoch of %lld batches",
                        (long long)first_batch, (long long)ld->nb);
    stop_thread(ld);
    ld->active = false;
    dt_status st = dt_batch_sampler_set_epoch(ld->bs, epoch);
    if (st < 0)
        return st;
    ld->epoch = epoch;
    ld->first = first_batch;
    /* batches before first count as produced and handed back: the ring
     * arithmetic (slot b % nslots, b < released + nslots) is unchanged */
    ld->produced = ld->consumed = ld->released = first_batch;
    ld->stop = false;
    ld->err = DT_OK;
    ld->err_at = -1;
    ld->errmsg[0] = 0;
    ld->active = true;
    if (ld->p.background && ld->nb > first_batch) {
        int rc = pthread_create(&ld->th, NULL, producer, ld);
        if (rc != 0) {
            ld->active = false;
            return dt_error(DT_ERR_INTERNAL, "loader: cannot start the prefetch thread (%s)",
                            strerror(rc));
        }
        ld->thread_live = true;
    }
    return DT_OK;
}

dt_status dt_loader_next(dt_loader *ld, const dt_batch **out)
{
    if (!ld || !out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_loader_next: NULL argument");
    *out = NULL;
    if (!ld->active)
        return dt_error(DT_ERR_STATE, "loader: no epoch in progress (call dt_loader_start_epoch)");
    if (!ld->p.background) {
        if (ld->consumed >= ld->nb)
            return DT_OK;
        dt_status st = load_batch(ld, ld->consumed);
        if (st < 0) {
            ld->active = false;
            return st;
        }
        *out = &ld->slots[ld->consumed % ld->nslots].b;
        ld->consumed++;
        return DT_OK;
    }
    pthread_mutex_lock(&ld->mu);
    int64_t b = ld->consumed;
    if (b >= ld->nb) {
        pthread_mutex_unlock(&ld->mu);
        stop_thread(ld);
        return DT_OK;
    }
    /* The caller is done with batch b - 1: its slot may be refilled. */
    ld->released = b;
    pthread_cond_signal(&ld->cv_prod);
    while (ld->produced <= b && ld->err_at != b)
        pthread_cond_wait(&ld->cv_cons, &ld->mu);
    if (ld->err_at == b) {
        dt_status st = ld->err;
        pthread_mutex_unlock(&ld->mu);
        stop_thread(ld);
        ld->active = false;
        return dt_error(st, "%s", ld->errmsg);
    }
    ld->consumed = b + 1;
    *out = &ld->slots[b % ld->nslots].b;
    pthread_mutex_unlock(&ld->mu);
    return DT_OK;
}
