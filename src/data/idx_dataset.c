/* Image classification from IDX files (MNIST, Fashion-MNIST) and the
 * directory / spec lookup the CLI uses.
 *
 * Images stay u8 in memory (47 MB for Fashion-MNIST's training set instead
 * of 188 MB as f32) and are scaled to f32 in [0, 1] per batch, x / 255, the
 * same single-precision division torchvision's ToTensor performs. */
#include "arrays.h"
#include "dtrain/data.h"
#include "data/idx_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    dt_idx *images, *labels;
    int64_t n, pix;
} idxset;

static int64_t idxset_length(void *self) { return ((idxset *)self)->n; }

/* v / 255.0f for every byte value: a table lookup gives ToTensor's exact
 * quotients at a fraction of the cost of a division per pixel. */
static float g_scale[256];
static pthread_once_t g_scale_once = PTHREAD_ONCE_INIT;
static void scale_init(void)
{
    for (int v = 0; v < 256; v++)
        g_scale[v] = (float)v / 255.0f;
}

static void scale_u8(const uint8_t *src, float *dst, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        dst[j] = g_scale[src[j]];
}

static dt_status idxset_get_item(void *self, int64_t i, void *x, void *y)
{
    idxset *s = self;
    scale_u8((const uint8_t *)s->images->data + i * s->pix, x, s->pix);
    *(int64_t *)y = ((const uint8_t *)s->labels->data)[i];
    return DT_OK;
}

static dt_status idxset_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    idxset *s = self;
    float *xf = x;
    int64_t *yi = y;
    const uint8_t *img = s->images->data, *lab = s->labels->data;
    for (int64_t k = 0; k < n; k++) {
        scale_u8(img + idx[k] * s->pix, xf + k * s->pix, s->pix);
        yi[k] = lab[idx[k]];
    }
    return DT_OK;
}

static void idxset_free(void *self)
{
    idxset *s = self;
    dt_idx_free(s->images);
    dt_idx_free(s->labels);
    free(s);
}

static const dt_dataset_vtable idxset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "idx",
    .length = idxset_length,
    .get_item = idxset_get_item,
    .get_batch = idxset_get_batch,
    .free = idxset_free,
};

dt_status dt_dataset_idx_from(dt_idx *images, dt_idx *labels, const char *images_name,
                              const char *labels_name, dt_dataset **out)
{
    dt_status st;
    if (!images_name)
        images_name = "<images>";
    if (!labels_name)
        labels_name = "<labels>";
    if (!out) {
        st = dt_error(DT_ERR_INVALID_ARG, "dt_dataset_idx_from: out is NULL");
        goto fail;
    }
    *out = NULL;
    if (!images || !labels) {
        st = dt_error(DT_ERR_INVALID_ARG, "dt_dataset_idx_from: NULL file");
        goto fail;
    }
    if (images->type != DT_IDX_U8 || images->ndim != 3) {
        st = dt_error(DT_ERR_FORMAT,
                      "%s: expected u8 images of 3 dimensions (N, H, W), got %s with %d", images_name,
                      dt_idx_type_name(images->type), images->ndim);
        goto fail;
    }
    if (labels->type != DT_IDX_U8 || labels->ndim != 1) {
        st = dt_error(DT_ERR_FORMAT, "%s: expected u8 labels of 1 dimension (N), got %s with %d",
                      labels_name, dt_idx_type_name(labels->type), labels->ndim);
        goto fail;
    }
    if (images->dims[0] != labels->dims[0]) {
        st = dt_error(DT_ERR_MISMATCH, "%s has %lld images but %s has %lld labels", images_name,
                      (long long)images->dims[0], labels_name, (long long)labels->dims[0]);
        goto fail;
    }
    int max_label = 0;
    const uint8_t *lab = labels->data;
    for (int64_t i = 0; i < labels->dims[0]; i++)
        if (lab[i] > max_label)
            max_label = lab[i];
    pthread_once(&g_scale_once, scale_init);
    idxset *s = calloc(1, sizeof *s);
    if (!s) {
        st = dt_error(DT_ERR_NO_MEMORY, "idx dataset: out of memory");
        goto fail;
    }
    s->images = images;
    s->labels = labels;
    s->n = images->dims[0];
    s->pix = images->dims[1] * images->dims[2];
    dt_dataset_info info = {.x_dtype = DT_F32,
                            .x_ndim = 3,
                            .x_shape = {1, images->dims[1], images->dims[2]},
                            .y_dtype = DT_I64,
                            .y_ndim = 0,
                            .num_classes = max_label + 1};
    st = dt_dataset_init(&idxset_vt, s, &info, out);
    if (st < 0)
        idxset_free(s);
    else
        dt_dataset_set_source(*out, images_name);
    return st;
fail:
    dt_idx_free(images);
    dt_idx_free(labels);
    return st;
}

dt_status dt_dataset_idx_open(const char *images_path, const char *labels_path, dt_dataset **out)
{
    if (!out || !images_path || !labels_path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_idx_open: NULL argument");
    *out = NULL;
    /* Compare the counts in the two headers before reading either payload:
     * a mismatch must not wait for gigabytes to be inflated. A header that
     * cannot be read is left to the full read, which names the problem. */
    dt_idx hi, hl;
    if (dt__idx_peek_file(images_path, &hi) == DT_OK && dt__idx_peek_file(labels_path, &hl) == DT_OK &&
        hi.dims[0] != hl.dims[0])
        return dt_error(DT_ERR_MISMATCH, "%s has %lld images but %s has %lld labels", images_path,
                        (long long)hi.dims[0], labels_path, (long long)hl.dims[0]);
    dt_error_clear();
    dt_idx *im = NULL, *lb = NULL;
    dt_status st = dt_idx_read_file(labels_path, &lb);
    if (st < 0)
        return st;
    st = dt_idx_read_file(images_path, &im);
    if (st < 0) {
        dt_idx_free(lb);
        return st;
    }
    return dt_dataset_idx_from(im, lb, images_path, labels_path, out);
}

static bool is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* First existing spelling of a file in dir. */
static bool find_file(const char *dir, const char *const *names, char *buf, size_t bufn)
{
    for (int i = 0; names[i]; i++) {
        snprintf(buf, bufn, "%s/%s", dir, names[i]);
        if (is_file(buf))
            return true;
    }
    return false;
}

dt_status dt_dataset_mnist_open(const char *dir, dt_split split, dt_dataset **out)
{
    static const char *const train_img[] = {"train-images-idx3-ubyte.gz", "train-images-idx3-ubyte",
                                            "train-images.idx3-ubyte.gz", "train-images.idx3-ubyte",
                                            NULL};
    static const char *const train_lab[] = {"train-labels-idx1-ubyte.gz", "train-labels-idx1-ubyte",
                                            "train-labels.idx1-ubyte.gz", "train-labels.idx1-ubyte",
                                            NULL};
    static const char *const test_img[] = {"t10k-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte",
                                           "t10k-images.idx3-ubyte.gz", "t10k-images.idx3-ubyte",
                                           NULL};
    static const char *const test_lab[] = {"t10k-labels-idx1-ubyte.gz", "t10k-labels-idx1-ubyte",
                                           "t10k-labels.idx1-ubyte.gz", "t10k-labels.idx1-ubyte",
                                           NULL};
    if (!out || !dir)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_mnist_open: NULL argument");
    *out = NULL;
    if (split != DT_SPLIT_TRAIN && split != DT_SPLIT_TEST) /* was read as the test split */
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_mnist_open: split %d (DT_SPLIT_TRAIN or DT_SPLIT_TEST)",
                        (int)split);
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return dt_error(DT_ERR_IO, "data directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_IO, "data directory %s: not a directory", dir);
    const char *const *ni = split == DT_SPLIT_TRAIN ? train_img : test_img;
    const char *const *nl = split == DT_SPLIT_TRAIN ? train_lab : test_lab;
    size_t bn = strlen(dir) + 64;
    char *pi = malloc(bn), *pl = malloc(bn);
    dt_status st;
    if (!pi || !pl) {
        st = dt_error(DT_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    if (!find_file(dir, ni, pi, bn)) {
        st = dt_error(DT_ERR_IO, "data directory %s: no %s (nor %s)", dir, ni[0], ni[1]);
        goto done;
    }
    if (!find_file(dir, nl, pl, bn)) {
        st = dt_error(DT_ERR_IO, "data directory %s: no %s (nor %s)", dir, nl[0], nl[1]);
        goto done;
    }
    st = dt_dataset_idx_open(pi, pl, out);
done:
    free(pi);
    free(pl);
    return st;
}

const char *dt_data_fashion_mnist_dir(void)
{
    const char *e = getenv("DT_FASHION_MNIST_DIR");
    return e && *e ? e : "/usr/share/datasets/fashion-mnist";
}

dt_status dt_dataset_open_spec(const char *spec, dt_split split, dt_dataset **out)
{
    if (!out || !spec)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_open_spec: NULL argument");
    *out = NULL;
    if (!strcmp(spec, "fashion-mnist")) {
        dt_status st = dt_dataset_mnist_open(dt_data_fashion_mnist_dir(), split, out);
        if (st == DT_ERR_IO && !getenv("DT_FASHION_MNIST_DIR"))
            return dt_error_wrap(st, "fashion-mnist (install Debian's dataset-fashion-mnist)");
        return st;
    }
    if (!strncmp(spec, "mnist:", 6) && spec[6])
        return dt_dataset_mnist_open(spec + 6, split, out);
    if (!strncmp(spec, "idx:", 4) && spec[4])
        return dt_dataset_mnist_open(spec + 4, split, out);
    if ((!strncmp(spec, "npy:", 4) || !strncmp(spec, "csv:", 4)) && spec[4])
        return dt__dataset_open_array_spec(spec, split, out);
    return dt_error(DT_ERR_INVALID_ARG,
                    "unknown data '%s' (expected fashion-mnist, mnist:DIR, idx:DIR, npy:X.npy[,Y.npy] or csv:FILE)",
                    spec);
}
