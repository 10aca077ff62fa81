/* A NaN or infinity in the data is reported as bad data by the loader
 * (DT_ERR_FORMAT naming the file, the item, the batch and whether input or
 * target), not left to become a non-finite loss that reads as "try a
 * smaller learning rate". */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <math.h>

/* A little-endian float32 .npy of shape (rows, cols) holding v. */
static void write_npy(const char *p, int rows, int cols, const float *v)
{
    ASSERT(du_write_npy_f32(p, rows, cols, v) == 0);
}

/* Every batch of x/y through a loader of batch 4: the first failure. */
static dt_status read_all(const char *x, const char *y)
{
    dt_dataset *ds;
    dt_status st = dt_dataset_npy_open(x, y, &ds);
    if (st < 0)
        return DT_ERR_INTERNAL;
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
    x[9 * 3 + 2] = NAN; /* item 9: batch 3 of 4 */
    write_npy(xp, 16, 3, x);
    ASSERT_STATUS(read_all(xp, yp), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), xp);
    ASSERT_STR_CONTAINS(dt_last_error(), "item 9 (batch 3 of epoch 1)");
    ASSERT_STR_CONTAINS(dt_last_error(), "NaN input at element 2");
    x[9 * 3 + 2] = 0.5f;
    write_npy(xp, 16, 3, x);
    y[14] = INFINITY;
    write_npy(yp, 16, 1, y);
    ASSERT_STATUS(read_all(xp, yp), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "item 14");
    ASSERT_STR_CONTAINS(dt_last_error(), "infinite target");
    tu_rmdir(dir);
}

int main(void)
{
    RUN(nan_and_inf_in_data_named);
    return TEST_REPORT();
}
