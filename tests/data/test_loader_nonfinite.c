/* A NaN or infinity in the data is reported as bad data (DT_ERR_FORMAT), not
 * left to become a non-finite loss that reads as "try a smaller learning
 * rate": a .npy row dataset names the file, its own row and the element
 * (through a held-out split too, and a float64 beyond float32 as such); the
 * loader names any other data set's item, batch and input or target. */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <math.h>

/* A little-endian float32 .npy of shape (rows, cols) holding v. */
static void write_npy(const char *p, int rows, int cols, const float *v)
{
    ASSERT(du_write_npy_f32(p, rows, cols, v) == 0);
}

/* Every batch of ds through a loader of batch 4 (ds freed): the first failure. */
static dt_status read_set(dt_dataset *ds)
{
    dt_status st;
    dt_sampler *s;
    dt_loader *ld;
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = 4;
    if (dt_sampler_sequential_init(dt_dataset_length(ds), &s) < 0 || dt_loader_init(ds, s, &lp, &ld) < 0)
        return DT_ERR_INTERNAL;
    st = dt_loader_start_epoch(ld, 0);
    const dt_batch *bt = NULL;
    while (st == DT_OK && (st = dt_loader_next(ld, &bt)) == DT_OK && bt) {
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_loader_free(ld);
    dt_sampler_free(s);
    dt_dataset_free(ds);
    return st < 0 ? dt_error(st, "%s", msg) : st;
}

static dt_status read_all(const char *x, const char *y)
{
    dt_dataset *ds;
    return dt_dataset_npy_open(x, y, &ds) < 0 ? DT_ERR_INTERNAL : read_set(ds);
}

/* 16 items of 3 f32 inputs, item 9's element 2 NaN (a set that is not a file's rows). */
static int64_t len16(void *self) { return (void)self, 16; }
static dt_status nan_item(void *self, int64_t i, void *x, void *y)
{
    (void)self;
    for (int k = 0; k < 3; k++)
        ((float *)x)[k] = i == 9 && k == 2 ? NAN : 0.5f;
    *(int64_t *)y = 0;
    return DT_OK;
}

TEST(nan_and_inf_in_data_named)
{
    char *dir = tu_tmpdir();
    char xp[600], yp[600];
    snprintf(xp, sizeof xp, "%s/x.npy", dir);
    snprintf(yp, sizeof yp, "%s/y.npy", dir);
    float x[16 * 3], y[16];
    for (int i = 0; i < 16 * 3; i++)
        x[i] = (float)i / 10.0f;
    for (int i = 0; i < 16; i++)
        y[i] = 1.0f;
    write_npy(xp, 16, 3, x);
    write_npy(yp, 16, 1, y);
    ASSERT_OK(read_all(xp, yp)); /* clean data reads */
    x[9 * 3 + 2] = NAN; /* row 9 */
    write_npy(xp, 16, 3, x);
    ASSERT_STATUS(read_all(xp, yp), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), xp);
    ASSERT_STR_CONTAINS(dt_last_error(), "row 9, element 2 is NaN");
    /* through a held-out split the file's row is named, not the split's item index (the loader said "item 7") */
    dt_dataset *all, *train;
    ASSERT_OK(dt_dataset_npy_open(xp, yp, &all));
    ASSERT_OK(dt_dataset_holdout_init(all, 0.25, 0, DT_SPLIT_TRAIN, &train));
    ASSERT_STATUS(read_set(train), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "row 9, element 2 is NaN");
    x[9 * 3 + 2] = 0.5f;
    write_npy(xp, 16, 3, x);
    y[14] = INFINITY;
    write_npy(yp, 16, 1, y);
    ASSERT_STATUS(read_all(xp, yp), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), yp);
    ASSERT_STR_CONTAINS(dt_last_error(), "row 14, element 0 is an infinity");
    /* a float64 beyond float32 is not called infinite */
    double xd[16 * 3];
    for (int i = 0; i < 16 * 3; i++)
        xd[i] = i == 5 * 3 + 1 ? -1e300 : 0.25;
    char dp[600];
    snprintf(dp, sizeof dp, "%s/xd.npy", dir);
    ASSERT(du_write_npy(dp, "<f8", 16, 3, xd, sizeof xd) == 0);
    y[14] = 1.0f;
    write_npy(yp, 16, 1, y);
    ASSERT_STATUS(read_all(dp, yp), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "row 5, element 1 is -1e+300, beyond float32");
    /* any other data set: the loader names the item, the batch and where */
    static const dt_dataset_vtable vt = {.version = DT_DATASET_VTABLE_VERSION, .name = "nan", .length = len16,
                                         .get_item = nan_item};
    dt_dataset_info info = {.x_dtype = DT_F32, .x_ndim = 1, .x_shape = {3}, .y_dtype = DT_I64};
    dt_dataset *ds;
    ASSERT_OK(dt_dataset_init(&vt, NULL, &info, &ds));
    ASSERT_STATUS(read_set(ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "item 9 (batch 3 of epoch 1)");
    ASSERT_STR_CONTAINS(dt_last_error(), "NaN input at element 2");
    tu_rmdir(dir);
}

int main(void)
{
    RUN(nan_and_inf_in_data_named);
    return TEST_REPORT();
}
