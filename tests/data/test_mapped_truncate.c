/* A memory-mapped data file truncated while a run reads it (another
 * process rewrote it in place): the next read is an error naming the file
 * (DT_ERR_IO, "truncated"), through the dataset and through the loader's
 * thread, never a SIGBUS that kills the process without a word. Token
 * files (the window dataset) and .npy arrays. */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <fcntl.h>
#include <sys/stat.h>

static char path_[600];
static const char *tpath(const char *dir, const char *name)
{
    snprintf(path_, sizeof path_, "%s/%s", dir, name);
    return path_;
}

/* Read every batch of ds through a loader: the first failure's status. */
static dt_status read_all(dt_dataset *ds, int64_t batch)
{
    dt_sampler *s;
    dt_loader *ld;
    if (dt_sampler_sequential_init(dt_dataset_length(ds), &s) < 0)
        return DT_ERR_INTERNAL;
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = batch;
    if (dt_loader_init(ds, s, &lp, &ld) < 0) {
        dt_sampler_free(s);
        return DT_ERR_INTERNAL;
    }
    dt_status st = dt_loader_start_epoch(ld, 0);
    const dt_batch *bt = NULL;
    while (st == DT_OK && (st = dt_loader_next(ld, &bt)) == DT_OK && bt) {
    }
    dt_loader_free(ld);
    dt_sampler_free(s);
    return st;
}

TEST(token_file_truncated_while_open)
{
    char *dir = tu_tmpdir();
    enum { N = 200000 }; /* 400 KB of tokens: many pages past the cut */
    uint16_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 1000);
    char p[600];
    snprintf(p, sizeof p, "%s", tpath(dir, "t.bin"));
    ASSERT_OK(dt_tokens_write(p, tok, N));
    free(tok);
    dt_tokens_params tp = dt_tokens_params_default();
    tp.seq_len = 64;
    tp.vocab_size = 1000;
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    const int64_t n = dt_dataset_length(ds);
    int64_t x[64], y[64];
    ASSERT_OK(dt_dataset_get_item(ds, n - 1, x, y));
    ASSERT_EQ_INT(truncate(p, 4096), 0); /* the header and a page of tokens */
    ASSERT_STATUS(dt_dataset_get_item(ds, n - 1, x, y), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), p);
    ASSERT_STR_CONTAINS(dt_last_error(), "truncated");
    int64_t idx[2] = {0, n - 1};
    int64_t bx[128], by[128];
    ASSERT_STATUS(dt_dataset_get_batch(ds, idx, 2, bx, by), DT_ERR_IO);
    ASSERT_STATUS(read_all(ds, 8), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), p);
    dt_dataset_free(ds);
    tu_rmdir(dir);
}

/* A little-endian float32 .npy of shape (rows, cols), values i. */
static void write_npy(const char *p, int rows, int cols)
{
    float *v = malloc((size_t)rows * (size_t)cols * sizeof *v);
    ASSERT(v != NULL);
    for (int i = 0; i < rows * cols; i++)
        v[i] = (float)i;
    int rc = du_write_npy_f32(p, rows, cols, v);
    free(v);
    ASSERT(rc == 0);
}

TEST(npy_truncated_while_open)
{
    char *dir = tu_tmpdir();
    char p[600];
    snprintf(p, sizeof p, "%s", tpath(dir, "x.npy"));
    write_npy(p, 4096, 32); /* 512 KB */
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_npy_open(p, NULL, &ds));
    float x[32];
    int64_t y[1];
    ASSERT_OK(dt_dataset_get_item(ds, 4095, x, y));
    ASSERT(x[0] == 4095.0f * 32);
    ASSERT_EQ_INT(truncate(p, 4096), 0);
    ASSERT_STATUS(dt_dataset_get_item(ds, 4095, x, y), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), p);
    ASSERT_STR_CONTAINS(dt_last_error(), "truncated");
    ASSERT_STATUS(read_all(ds, 64), DT_ERR_IO);
    dt_dataset_free(ds);
    tu_rmdir(dir);
}

int main(void)
{
    RUN(token_file_truncated_while_open);
    RUN(npy_truncated_while_open);
    return TEST_REPORT();
}
