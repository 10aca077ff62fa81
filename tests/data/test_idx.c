/* IDX reader and the image dataset: good files (plain, gzip, every type),
 * bad files (each gets its own error naming the file), the real
 * Fashion-MNIST files when installed. */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <sys/stat.h>

TEST(plain_u8)
{
    uint32_t dims[3] = {2, 3, 4};
    unsigned char pay[24];
    for (int i = 0; i < 24; i++)
        pay[i] = (unsigned char)(i * 10);
    size_t len;
    unsigned char *b = tu_idx(0x08, 3, dims, pay, 24, &len);
    dt_idx *idx = NULL;
    ASSERT_OK(dt_idx_read_mem(b, len, "t", &idx));
    ASSERT_EQ_INT(idx->type, DT_IDX_U8);
    ASSERT_EQ_INT(idx->ndim, 3);
    ASSERT_EQ_INT(idx->dims[0], 2);
    ASSERT_EQ_INT(idx->dims[1], 3);
    ASSERT_EQ_INT(idx->dims[2], 4);
    ASSERT_EQ_INT(idx->nbytes, 24);
    ASSERT_EQ_INT(((unsigned char *)idx->data)[23], 230);
    dt_idx_free(idx);
    free(b);
}

TEST(big_endian_types)
{
    /* i32 0x01020304 and -2; i16 0x0102; f32 1.5 (0x3fc00000); f64 -2.0 */
    unsigned char p32[8] = {1, 2, 3, 4, 0xff, 0xff, 0xff, 0xfe};
    uint32_t d2[1] = {2};
    size_t len;
    unsigned char *b = tu_idx(0x0C, 1, d2, p32, 8, &len);
    dt_idx *idx = NULL;
    ASSERT_OK(dt_idx_read_mem(b, len, "i32", &idx));
    ASSERT_EQ_INT(((int32_t *)idx->data)[0], 0x01020304);
    ASSERT_EQ_INT(((int32_t *)idx->data)[1], -2);
    dt_idx_free(idx);
    free(b);
    unsigned char p16[2] = {1, 2};
    uint32_t d1[1] = {1};
    b = tu_idx(0x0B, 1, d1, p16, 2, &len);
    ASSERT_OK(dt_idx_read_mem(b, len, "i16", &idx));
    ASSERT_EQ_INT(((int16_t *)idx->data)[0], 0x0102);
    dt_idx_free(idx);
    free(b);
    unsigned char pf[4] = {0x3f, 0xc0, 0, 0};
    b = tu_idx(0x0D, 1, d1, pf, 4, &len);
    ASSERT_OK(dt_idx_read_mem(b, len, "f32", &idx));
    ASSERT_NEAR(((float *)idx->data)[0], 1.5, 0, 0);
    dt_idx_free(idx);
    free(b);
    unsigned char pd[8] = {0xc0, 0, 0, 0, 0, 0, 0, 0};
    b = tu_idx(0x0E, 1, d1, pd, 8, &len);
    ASSERT_OK(dt_idx_read_mem(b, len, "f64", &idx));
    ASSERT_NEAR(((double *)idx->data)[0], -2.0, 0, 0);
    ASSERT_STR_EQ(dt_idx_type_name(idx->type), "f64");
    dt_idx_free(idx);
    free(b);
}

TEST(gzip_roundtrip)
{
    uint32_t dims[2] = {1000, 70};
    unsigned char *pay = malloc(70000);
    for (int i = 0; i < 70000; i++)
        pay[i] = (unsigned char)((i * 31) ^ (i >> 7));
    size_t len, zl;
    unsigned char *b = tu_idx(0x08, 2, dims, pay, 70000, &len);
    unsigned char *z = tu_gzip(b, len, &zl);
    dt_idx *idx = NULL;
    ASSERT_OK(dt_idx_read_mem(z, zl, "z", &idx));
    ASSERT_EQ_INT(idx->dims[0], 1000);
    ASSERT_EQ_INT(idx->nbytes, 70000);
    ASSERT(memcmp(idx->data, pay, 70000) == 0);
    dt_idx_free(idx);
    free(z);
    free(b);
    free(pay);
}

/* Expect a DT_ERR_FORMAT whose message names the file and contains what. */
static int bad(const void *b, size_t n, const char *what)
{
    dt_idx *idx = (dt_idx *)1;
    dt_status st = dt_idx_read_mem(b, n, "bad.idx", &idx);
    if (st != DT_ERR_FORMAT || idx != NULL || !strstr(dt_last_error(), "bad.idx") ||
        !strstr(dt_last_error(), what)) {
        fprintf(stderr, "  want FORMAT error with '%s', got %s: %s\n", what, dt_status_name(st),
                dt_last_error());
        return 0;
    }
    return 1;
}

TEST(bad_plain)
{
    uint32_t dims[2] = {4, 4};
    unsigned char pay[16] = {0};
    size_t len;
    unsigned char *b = tu_idx(0x08, 2, dims, pay, 16, &len);
    ASSERT(bad(b, 0, "truncated"));
    ASSERT(bad(b, 3, "truncated"));
    ASSERT(bad(b, 6, "truncated header"));
    ASSERT(bad(b, len - 1, "truncated"));
    unsigned char *c = malloc(len + 5);
    memcpy(c, b, len);
    ASSERT(bad(c, len + 5, "trailing"));
    c[0] = 0x12;
    ASSERT(bad(c, len, "wrong magic"));
    memcpy(c, b, len);
    c[2] = 0x07; /* unknown type */
    ASSERT(bad(c, len, "wrong magic"));
    memcpy(c, b, len);
    c[3] = 0; /* zero dims */
    ASSERT(bad(c, len, "wrong magic"));
    memcpy(c, b, len);
    c[3] = 9; /* too many dims */
    ASSERT(bad(c, len, "dimensions"));
    memcpy(c, b, len);
    c[4] = c[5] = c[6] = c[7] = 0; /* a zero dimension */
    ASSERT(bad(c, len, "dimension 0 is 0"));
    free(c);
    free(b);
    /* absurd: 65535 x 65535 x 65535 f64 -- rejected before allocating */
    uint32_t huge[3] = {65535, 65535, 65535};
    b = tu_idx(0x0E, 3, huge, NULL, 0, &len);
    ASSERT(bad(b, len, "absurd dimensions"));
    free(b);
    uint32_t big[2] = {0xffffffffu, 0xffffffffu};
    b = tu_idx(0x08, 2, big, NULL, 0, &len);
    ASSERT(bad(b, len, "absurd dimensions"));
    free(b);
}

TEST(bad_gzip)
{
    uint32_t dims[2] = {100, 100};
    unsigned char *pay = malloc(10000);
    for (int i = 0; i < 10000; i++)
        pay[i] = (unsigned char)(i * 13 + (i >> 5));
    size_t len, zl;
    unsigned char *b = tu_idx(0x08, 2, dims, pay, 10000, &len);
    unsigned char *z = tu_gzip(b, len, &zl);
    /* truncated stream */
    ASSERT(bad(z, zl / 2, "truncated"));
    ASSERT(bad(z, 12, "truncated"));
    /* corrupt deflate data: flip bytes in the middle */
    unsigned char *c = malloc(zl);
    memcpy(c, z, zl);
    for (size_t i = zl / 3; i < zl / 3 + 8; i++)
        c[i] ^= 0x5a;
    ASSERT(bad(c, zl, "gzip"));
    /* corrupt CRC at the end */
    memcpy(c, z, zl);
    c[zl - 6] ^= 0xff;
    ASSERT(bad(c, zl, "corrupt gzip"));
    /* bad gzip header method byte */
    memcpy(c, z, zl);
    c[2] = 7;
    ASSERT(bad(c, zl, "corrupt gzip"));
    free(c);
    free(z);
    /* the stream inflates to less / more than the header says */
    z = tu_gzip(b, len - 10, &zl);
    ASSERT(bad(z, zl, "truncated"));
    free(z);
    unsigned char *longer = malloc(len + 10);
    memcpy(longer, b, len);
    memset(longer + len, 1, 10);
    z = tu_gzip(longer, len + 10, &zl);
    ASSERT(bad(z, zl, "more than"));
    free(z);
    free(longer);
    /* a gzip stream whose content has the wrong magic */
    b[1] = 0x99;
    z = tu_gzip(b, len, &zl);
    ASSERT(bad(z, zl, "wrong magic"));
    free(z);
    /* a gzip stream claiming a huge payload but holding little */
    uint32_t huge[2] = {60000, 60000};
    free(b);
    b = tu_idx(0x08, 2, huge, pay, 100, &len);
    z = tu_gzip(b, len, &zl);
    ASSERT(bad(z, zl, "truncated"));
    free(z);
    free(b);
    free(pay);
}

TEST(file_errors)
{
    dt_idx *idx = NULL;
    ASSERT_STATUS(dt_idx_read_file("/nonexistent/dir/x.idx", &idx), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent/dir/x.idx");
    ASSERT(idx == NULL);
    char *dir = tu_tmpdir();
    char p[512];
    snprintf(p, sizeof p, "%s/short.gz", dir);
    tu_write(p, "\x1f\x8b\x08", 3);
    ASSERT_STATUS(dt_idx_read_file(p, &idx), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "short.gz");
    /* a directory is not a file */
    ASSERT(dt_idx_read_file(dir, &idx) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), dir);
    /* nor is a FIFO: refused at once (fopen blocked for ever waiting for a writer), by the reader and by the
       dataset's header check */
    snprintf(p, sizeof p, "%s/images.fifo", dir);
    ASSERT_EQ_INT(mkfifo(p, 0600), 0);
    ASSERT_STATUS(dt_idx_read_file(p, &idx), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a regular file");
    dt_dataset *ds = NULL;
    ASSERT(dt_dataset_idx_open(p, p, &ds) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a regular file");
    unlink(p);
    tu_rmdir(dir);
}

TEST(mnist_dir_plain_and_gzip)
{
    for (int gz = 0; gz < 2; gz++) {
        char *dir = tu_tmpdir();
        tu_write_mnist(dir, "train", 50, 5, 6, 50, gz);
        tu_write_mnist(dir, "t10k", 7, 5, 6, 7, gz);
        dt_dataset *tr = NULL, *te = NULL;
        ASSERT_OK(dt_dataset_mnist_open(dir, DT_SPLIT_TRAIN, &tr));
        ASSERT_OK(dt_dataset_mnist_open(dir, DT_SPLIT_TEST, &te));
        ASSERT_EQ_INT(dt_dataset_length(tr), 50);
        ASSERT_EQ_INT(dt_dataset_length(te), 7);
        const dt_dataset_info *info = dt_dataset_get_info(tr);
        ASSERT_EQ_INT(info->x_ndim, 3);
        ASSERT_EQ_INT(info->x_shape[0], 1);
        ASSERT_EQ_INT(info->x_shape[1], 5);
        ASSERT_EQ_INT(info->x_shape[2], 6);
        ASSERT_EQ_INT(info->x_dtype, DT_F32);
        ASSERT_EQ_INT(info->y_dtype, DT_I64);
        ASSERT_EQ_INT(info->num_classes, 10);
        ASSERT_EQ_INT(dt_dataset_x_bytes(tr), 30 * 4);
        float x[30];
        int64_t y;
        ASSERT_OK(dt_dataset_get_item(tr, 13, x, &y));
        ASSERT_EQ_INT(y, 3);
        for (int p = 0; p < 30; p++)
            ASSERT_NEAR(x[p], (float)((13 * 7 + p) % 256) / 255.0f, 0, 0);
        int64_t idx[3] = {49, 0, 21};
        float xb[90];
        int64_t yb[3];
        ASSERT_OK(dt_dataset_get_batch(tr, idx, 3, xb, yb));
        ASSERT_EQ_INT(yb[0], 9);
        ASSERT_EQ_INT(yb[1], 0);
        ASSERT_EQ_INT(yb[2], 1);
        ASSERT_NEAR(xb[60 + 4], (float)((21 * 7 + 4) % 256) / 255.0f, 0, 0);
        ASSERT_STATUS(dt_dataset_get_item(tr, 50, x, &y), DT_ERR_RANGE);
        idx[1] = -1;
        ASSERT_STATUS(dt_dataset_get_batch(tr, idx, 3, xb, yb), DT_ERR_RANGE);
        /* spec form */
        char spec[300];
        snprintf(spec, sizeof spec, "idx:%s", dir);
        dt_dataset *s2 = NULL;
        ASSERT_OK(dt_dataset_open_spec(spec, DT_SPLIT_TEST, &s2));
        ASSERT_EQ_INT(dt_dataset_length(s2), 7);
        dt_dataset_free(s2);
        dt_dataset_free(tr);
        dt_dataset_free(te);
        tu_rmdir(dir);
    }
}

TEST(mnist_dir_errors)
{
    dt_dataset *ds = NULL;
    ASSERT_STATUS(dt_dataset_mnist_open("/nonexistent/mnist", DT_SPLIT_TRAIN, &ds), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent/mnist");
    ASSERT_STATUS(dt_dataset_open_spec("cifar", DT_SPLIT_TRAIN, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "cifar");
    ASSERT_STATUS(dt_dataset_open_spec("mnist:", DT_SPLIT_TRAIN, &ds), DT_ERR_INVALID_ARG);
    char *dir = tu_tmpdir();
    /* a split that is neither was read as the test split */
    ASSERT_STATUS(dt_dataset_mnist_open(dir, (dt_split)5, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "split 5");
    /* empty directory: names the missing file */
    ASSERT_STATUS(dt_dataset_mnist_open(dir, DT_SPLIT_TRAIN, &ds), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "train-images-idx3-ubyte");
    /* count mismatch */
    tu_write_mnist(dir, "train", 20, 4, 4, 19, 1);
    ASSERT_STATUS(dt_dataset_mnist_open(dir, DT_SPLIT_TRAIN, &ds), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "20 images");
    ASSERT_STR_CONTAINS(dt_last_error(), "19 labels");
    ASSERT(ds == NULL);
    /* labels file holding images: wrong shape, names the labels file */
    char p[512], q[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(q, sizeof q, "%s/train-labels-idx1-ubyte.gz", dir);
    ASSERT_STATUS(dt_dataset_idx_open(p, p, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "expected u8 labels");
    ASSERT_STATUS(dt_dataset_idx_open(q, q, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "expected u8 images");
    /* truncated images file (counts that agree: a mismatch is found from
     * the headers, before any truncation) */
    tu_write_mnist(dir, "train", 20, 4, 4, 20, 1);
    FILE *f = fopen(p, "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    tu_write(p, buf, n / 2);
    ASSERT_STATUS(dt_dataset_idx_open(p, q, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "train-images-idx3-ubyte.gz: truncated");
    tu_rmdir(dir);
}

TEST(fashion_mnist_real)
{
    struct stat sb;
    const char *dir = dt_data_fashion_mnist_dir();
    if (stat(dir, &sb) != 0)
        DT_TEST_SKIP_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dir);
    dt_dataset *tr = NULL, *te = NULL;
    ASSERT_OK(dt_dataset_open_spec("fashion-mnist", DT_SPLIT_TRAIN, &tr));
    ASSERT_OK(dt_dataset_open_spec("fashion-mnist", DT_SPLIT_TEST, &te));
    ASSERT_EQ_INT(dt_dataset_length(tr), 60000);
    ASSERT_EQ_INT(dt_dataset_length(te), 10000);
    ASSERT_EQ_INT(dt_dataset_get_info(tr)->x_shape[1], 28);
    ASSERT_EQ_INT(dt_dataset_get_info(tr)->num_classes, 10);
    /* values checked against Python's gzip module */
    static const int first_train[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    static const int first_test[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    float x[784];
    int64_t y;
    for (int i = 0; i < 10; i++) {
        ASSERT_OK(dt_dataset_get_item(tr, i, x, &y));
        ASSERT_EQ_INT(y, first_train[i]);
        ASSERT_OK(dt_dataset_get_item(te, i, x, &y));
        ASSERT_EQ_INT(y, first_test[i]);
    }
    ASSERT_OK(dt_dataset_get_item(tr, 0, x, &y));
    double s = 0, mx = 0;
    for (int p = 0; p < 784; p++) {
        s += x[p];
        mx = x[p] > mx ? x[p] : mx;
    }
    ASSERT_NEAR(s, 76247.0 / 255.0, 1e-3, 0);
    ASSERT_NEAR(mx, 1.0, 0, 0);
    dt_dataset_free(tr);
    dt_dataset_free(te);
}

/* Issue 10 item 9: images and labels whose header counts disagree are
 * reported from the headers alone, before any payload is inflated: here the
 * images file declares 5 million 28x28 images (3.9 GB) and holds a 64 MB
 * prefix of them; the error must name both files and both counts and come
 * at once, not after the images were inflated. */
TEST(count_mismatch_found_from_headers)
{
    char *dir = tu_tmpdir();
    char pi[512], pl[512];
    snprintf(pi, sizeof pi, "%s/big-images.gz", dir);
    snprintf(pl, sizeof pl, "%s/small-labels.gz", dir);
    size_t part = 64u << 20, len, zl;
    unsigned char *zeros = calloc(1, part);
    ASSERT(zeros);
    uint32_t di[3] = {5000000, 28, 28}, dl[1] = {60000};
    unsigned char *raw = tu_idx(8, 3, di, zeros, part, &len);
    unsigned char *z = tu_gzip(raw, len, &zl);
    tu_write(pi, z, zl);
    free(raw), free(z), free(zeros);
    unsigned char lab[60000] = {0};
    raw = tu_idx(8, 1, dl, lab, sizeof lab, &len);
    z = tu_gzip(raw, len, &zl);
    tu_write(pl, z, zl);
    free(raw), free(z);
    dt_dataset *ds = NULL;
    double t0 = dt_time_s();
    ASSERT_STATUS(dt_dataset_idx_open(pi, pl, &ds), DT_ERR_MISMATCH);
    double secs = dt_time_s() - t0;
    ASSERT(ds == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "big-images.gz has 5000000 images");
    ASSERT_STR_CONTAINS(dt_last_error(), "small-labels.gz has 60000 labels");
    ASSERT(secs < 1.0); /* headers only (inflating the 3.9 GB would take many seconds) */
    tu_rmdir(dir);
}

int main(void)
{
    RUN(plain_u8);
    RUN(big_endian_types);
    RUN(gzip_roundtrip);
    RUN(bad_plain);
    RUN(bad_gzip);
    RUN(file_errors);
    RUN(mnist_dir_plain_and_gzip);
    RUN(mnist_dir_errors);
    RUN(count_mismatch_found_from_headers);
    RUN(fashion_mnist_real);
    return TEST_REPORT();
}
