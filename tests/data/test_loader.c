/* The prefetching loader: order and content equal a synchronous pass,
 * every prefetch depth, short last batch and drop_last, early stop and
 * restart, errors from the loading thread, subset and random datasets. */
// dt-test-labels: threads
#include "dtrain/data.h"
#include "test.h"

#include <time.h>

/* A dataset whose item i is x = (i, i+0.5), y = 3i, failing at fail_at, and
 * optionally slow (so the consumer really waits on the thread). */
typedef struct {
    int64_t n, fail_at;
    int slow_us;
} toy;
static int64_t toy_len(void *self) { return ((toy *)self)->n; }
static dt_status toy_item(void *self, int64_t i, void *x, void *y)
{
    toy *t = self;
    if (i == t->fail_at)
        return dt_error(DT_ERR_FORMAT, "toy: item %lld is broken", (long long)i);
    if (t->slow_us) {
        struct timespec ts = {0, t->slow_us * 1000L};
        nanosleep(&ts, NULL);
    }
    ((float *)x)[0] = (float)i;
    ((float *)x)[1] = (float)i + 0.5f;
    *(int64_t *)y = 3 * i;
    return DT_OK;
}
static const dt_dataset_vtable toy_vt = {
    .version = DT_DATASET_VTABLE_VERSION, .name = "toy", .length = toy_len, .get_item = toy_item};

static dt_dataset *toy_open(toy *t)
{
    dt_dataset_info info = {.x_dtype = DT_F32, .x_ndim = 1, .x_shape = {2}, .y_dtype = DT_I64};
    dt_dataset *ds = NULL;
    if (dt_dataset_init(&toy_vt, t, &info, &ds) < 0)
        return NULL;
    return ds;
}

/* Run one epoch, checking every batch against the sampler's order. */
static int check_epoch(dt_loader *ld, dt_sampler *s, int64_t epoch, int64_t batch, bool drop_last,
                       int64_t *nbatches_out)
{
    int64_t n = dt_sampler_length(s);
    int64_t *order = malloc((size_t)(n + 1) * sizeof *order);
    dt_sampler_indices(s, epoch, order);
    if (dt_loader_start_epoch(ld, epoch) < 0)
        return 0;
    const dt_batch *b;
    int64_t pos = 0, nb = 0;
    int ok = 1;
    while (dt_loader_next(ld, &b) == DT_OK && b) {
        if (b->index != nb || b->epoch != epoch)
            ok = 0;
        for (int64_t k = 0; k < b->size; k++) {
            int64_t i = order[pos + k];
            if (b->indices[k] != i || ((float *)b->x)[2 * k] != (float)i ||
                ((float *)b->x)[2 * k + 1] != (float)i + 0.5f || ((int64_t *)b->y)[k] != 3 * i)
                ok = 0;
        }
        if (b->size != batch && !(b->size == n % batch && pos + b->size == n))
            ok = 0;
        pos += b->size;
        nb++;
    }
    if (drop_last ? pos != (n / batch) * batch : pos != n)
        ok = 0;
    *nbatches_out = nb;
    free(order);
    return ok;
}

TEST(order_and_content)
{
    toy t = {.n = 103, .fail_at = -1};
    dt_dataset *ds = toy_open(&t);
    ASSERT(ds);
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_random_init(103, 1, &s));
    for (int bg = 0; bg < 2; bg++)
        for (int pf = 1; pf <= 4; pf++)
            for (int dl = 0; dl < 2; dl++) {
                dt_loader_params p = dt_loader_params_default();
                p.batch_size = 10;
                p.prefetch = pf;
                p.drop_last = dl;
                p.background = bg;
                dt_loader *ld = NULL;
                ASSERT_OK(dt_loader_init(ds, s, &p, &ld));
                ASSERT_EQ_INT(dt_loader_num_batches(ld), dl ? 10 : 11);
                for (int64_t e = 0; e < 3; e++) {
                    int64_t nb = 0;
                    ASSERT(check_epoch(ld, s, e, 10, dl, &nb));
                    ASSERT_EQ_INT(nb, dl ? 10 : 11);
                }
                /* after the end, next keeps returning the end */
                const dt_batch *b = (const dt_batch *)1;
                ASSERT_OK(dt_loader_next(ld, &b));
                ASSERT(b == NULL);
                dt_loader_free(ld);
            }
    dt_sampler_free(s);
    dt_dataset_free(ds);
}

TEST(slow_dataset_and_early_stop)
{
    toy t = {.n = 40, .fail_at = -1, .slow_us = 300};
    dt_dataset *ds = toy_open(&t);
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_sequential_init(40, &s));
    dt_loader_params p = dt_loader_params_default();
    p.batch_size = 4;
    dt_loader *ld = NULL;
    ASSERT_OK(dt_loader_init(ds, s, &p, &ld));
    int64_t nb;
    ASSERT(check_epoch(ld, s, 0, 4, false, &nb));
    ASSERT_EQ_INT(nb, 10);
    /* abandon an epoch after two batches; the next epoch starts cleanly */
    ASSERT_OK(dt_loader_start_epoch(ld, 1));
    const dt_batch *b;
    ASSERT_OK(dt_loader_next(ld, &b));
    ASSERT_OK(dt_loader_next(ld, &b));
    ASSERT_EQ_INT(b->index, 1);
    ASSERT(check_epoch(ld, s, 2, 4, false, &nb));
    /* free in the middle of an epoch */
    ASSERT_OK(dt_loader_start_epoch(ld, 3));
    ASSERT_OK(dt_loader_next(ld, &b));
    dt_loader_free(ld);
    /* free right after starting */
    ASSERT_OK(dt_loader_init(ds, s, &p, &ld));
    ASSERT_OK(dt_loader_start_epoch(ld, 0));
    dt_loader_free(ld);
    dt_sampler_free(s);
    dt_dataset_free(ds);
}

TEST(error_propagates_in_order)
{
    toy t = {.n = 50, .fail_at = 23};
    dt_dataset *ds = toy_open(&t);
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_sequential_init(50, &s));
    for (int bg = 0; bg < 2; bg++) {
        dt_loader_params p = dt_loader_params_default();
        p.batch_size = 5;
        p.background = bg;
        dt_loader *ld = NULL;
        ASSERT_OK(dt_loader_init(ds, s, &p, &ld));
        ASSERT_OK(dt_loader_start_epoch(ld, 0));
        const dt_batch *b;
        int good = 0;
        dt_status st;
        while ((st = dt_loader_next(ld, &b)) == DT_OK && b)
            good++;
        ASSERT_EQ_INT(good, 4); /* batches 0..3; batch 4 holds item 23 */
        ASSERT_STATUS(st, DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "item 23 is broken");
        /* the epoch is over; a call without a new epoch is a state error */
        ASSERT_STATUS(dt_loader_next(ld, &b), DT_ERR_STATE);
        /* a new epoch works again up to the error */
        ASSERT_OK(dt_loader_start_epoch(ld, 1));
        ASSERT_OK(dt_loader_next(ld, &b));
        ASSERT(b && b->index == 0);
        dt_loader_free(ld);
    }
    dt_sampler_free(s);
    dt_dataset_free(ds);
}

TEST(subset_and_random_dataset)
{
    dt_random_dataset_params rp = dt_random_dataset_params_default();
    rp.length = 64;
    rp.x_shape[0] = 16;
    rp.num_classes = 4;
    rp.seed = 3;
    dt_dataset *r = NULL, *sub = NULL;
    ASSERT_OK(dt_dataset_random_init(&rp, &r));
    ASSERT_EQ_INT(dt_dataset_length(r), 64);
    ASSERT_EQ_INT(dt_dataset_x_numel(r), 16);
    float x1[16], x2[16];
    int64_t y1, y2;
    ASSERT_OK(dt_dataset_get_item(r, 10, x1, &y1));
    ASSERT_OK(dt_dataset_get_item(r, 10, x2, &y2));
    ASSERT(memcmp(x1, x2, sizeof x1) == 0);
    ASSERT_EQ_INT(y1, y2);
    ASSERT(y1 >= 0 && y1 < 4);
    /* labels use every class (balanced-ish over 64 items) */
    int count[4] = {0};
    for (int i = 0; i < 64; i++) {
        ASSERT_OK(dt_dataset_get_item(r, i, x1, &y1));
        count[y1]++;
    }
    for (int c = 0; c < 4; c++)
        ASSERT(count[c] > 0);
    ASSERT_OK(dt_dataset_subset_init(r, 10, 20, &sub));
    ASSERT_EQ_INT(dt_dataset_length(sub), 20);
    ASSERT_OK(dt_dataset_get_item(sub, 0, x1, &y1));
    ASSERT_OK(dt_dataset_get_item(r, 10, x2, &y2));
    ASSERT(memcmp(x1, x2, sizeof x1) == 0);
    int64_t idx[2] = {19, 0};
    float xb[32];
    int64_t yb[2];
    ASSERT_OK(dt_dataset_get_batch(sub, idx, 2, xb, yb));
    ASSERT_OK(dt_dataset_get_item(r, 29, x2, &y2));
    ASSERT(memcmp(xb, x2, sizeof x2) == 0);
    ASSERT_EQ_INT(yb[0], y2);
    ASSERT_STATUS(dt_dataset_get_item(sub, 20, x1, &y1), DT_ERR_RANGE);
    dt_dataset *bad = NULL;
    ASSERT_STATUS(dt_dataset_subset_init(r, 50, 20, &bad), DT_ERR_RANGE);
    /* start + n overflowed in the message (undefined behaviour) */
    ASSERT_STATUS(dt_dataset_subset_init(r, INT64_MAX, 2, &bad), DT_ERR_RANGE);
    ASSERT_STATUS(dt_dataset_subset_init(r, 2, INT64_MAX, &bad), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "from 2");
    ASSERT_STATUS(dt_dataset_random_init(NULL, &bad), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "params is NULL");
    rp.num_classes = 1;
    ASSERT_STATUS(dt_dataset_random_init(&rp, &bad), DT_ERR_INVALID_ARG);
    /* a 2-D item shape */
    rp.num_classes = 3;
    rp.x_ndim = 2;
    rp.x_shape[0] = 4;
    rp.x_shape[1] = 8;
    ASSERT_OK(dt_dataset_random_init(&rp, &bad));
    ASSERT_EQ_INT(dt_dataset_x_numel(bad), 32);
    ASSERT_EQ_INT(dt_dataset_get_info(bad)->x_shape[1], 8);
    ASSERT_OK(dt_dataset_get_item(bad, 5, xb, &y1));
    ASSERT(y1 >= 0 && y1 < 3);
    dt_dataset_free(bad);
    dt_dataset_free(sub);
    dt_dataset_free(r);
}

TEST(bad_params)
{
    toy t = {.n = 5, .fail_at = -1};
    dt_dataset *ds = toy_open(&t);
    dt_sampler *s = NULL;
    ASSERT_OK(dt_sampler_sequential_init(5, &s));
    dt_loader_params p = dt_loader_params_default();
    dt_loader *ld = NULL;
    p.batch_size = 0;
    ASSERT_STATUS(dt_loader_init(ds, s, &p, &ld), DT_ERR_INVALID_ARG);
    p.batch_size = 2;
    p.prefetch = 0;
    ASSERT_STATUS(dt_loader_init(ds, s, &p, &ld), DT_ERR_INVALID_ARG);
    p.prefetch = 2;
    ASSERT_OK(dt_loader_init(ds, s, &p, &ld));
    const dt_batch *b;
    ASSERT_STATUS(dt_loader_next(ld, &b), DT_ERR_STATE); /* no epoch started */
    dt_loader_free(ld);
    dt_loader_free(NULL);
    dt_sampler_free(s);
    dt_dataset_free(ds);
    /* an item shape whose product overflows is refused, not wrapped */
    dt_dataset_info info = {.x_dtype = DT_F32, .x_ndim = 3, .x_shape = {709551615, 40000000000, 3},
                            .y_dtype = DT_I64};
    ds = (dt_dataset *)1;
    ASSERT_STATUS(dt_dataset_init(&toy_vt, &t, &info, &ds), DT_ERR_INVALID_ARG);
    ASSERT(ds == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "multiplies past");
    info.x_shape[0] = 1 << 25; /* 2^25 x 4e10 x 3 x 4 bytes > 2^62 */
    ASSERT_STATUS(dt_dataset_init(&toy_vt, &t, &info, &ds), DT_ERR_INVALID_ARG);
}

int main(void)
{
    RUN(order_and_content);
    RUN(slow_dataset_and_early_stop);
    RUN(error_propagates_in_order);
    RUN(subset_and_random_dataset);
    RUN(bad_params);
    return TEST_REPORT();
}
