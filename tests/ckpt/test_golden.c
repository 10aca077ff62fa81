/* Golden files written by the `safetensors` Python package (numpy and
 * PyTorch state dicts; tests/ckpt/gen_golden.py, committed under
 * tests/ckpt/data/): dtrain reads them with PyTorch's names, shapes, dtypes
 * and values, loads them as checkpoints, and its writer reproduces each
 * file byte for byte from the same tensors and metadata. */
#include "dtrain/ckpt.h"
#include "test.h"
#include "tmp_util.h"

#include <stdint.h>
#include <unistd.h>

static char g_dir[64];

static const char *golden(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/tests/ckpt/data/%s", DT_SOURCE_DIR, name);
    return buf[k];
}

/* element i of every float tensor of the golden files: i * 0.125 - 0.5 */
static double gv(size_t i)
{
    return (double)i * 0.125 - 0.5;
}

static double elem(dt_st_dtype t, const void *p, size_t i)
{
    switch (t) {
    case DT_ST_F32: return ((const float *)p)[i];
    case DT_ST_F64: return ((const double *)p)[i];
    case DT_ST_F16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_ST_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_ST_I64: return (double)((const int64_t *)p)[i];
    case DT_ST_I32: return ((const int32_t *)p)[i];
    case DT_ST_U8:
    case DT_ST_BOOL: return ((const uint8_t *)p)[i];
    default: return NAN;
    }
}

/* Tensor `name` must have dtype and shape, and element values want[i]
 * (want NULL: the formula gv). */
static int check(const dt_st_file *f, const char *name, dt_st_dtype dt, int nd, const int64_t *shape,
                 const double *want)
{
    const dt_st_tensor *t = dt_st_find(f, name);
    if (!t) {
        fprintf(stderr, "%s: no tensor '%s'\n", dt_st_path(f), name);
        return 1;
    }
    int bad = t->dtype != dt || t->ndim != nd;
    for (int d = 0; !bad && d < nd; d++)
        bad = t->shape[d] != shape[d];
    if (bad) {
        fprintf(stderr, "%s: '%s': dtype %s ndim %d\n", dt_st_path(f), name, dt_st_dtype_name(t->dtype), t->ndim);
        return 1;
    }
    void *buf = malloc(t->nbytes + 1);
    if (dt_st_read(f, t, 0, t->nbytes, buf) < 0) {
        free(buf);
        return 1;
    }
    for (size_t i = 0; i < t->numel; i++) {
        double w = want ? want[i] : gv(i);
        if (elem(dt, buf, i) != w) {
            fprintf(stderr, "%s: '%s'[%zu] = %g, want %g\n", dt_st_path(f), name, i, elem(dt, buf, i), w);
            free(buf);
            return 1;
        }
    }
    free(buf);
    return 0;
}

TEST(numpy_file)
{
    dt_st_file *f;
    ASSERT_OK(dt_st_open(golden("golden_numpy.safetensors"), &f));
    ASSERT_EQ_U64(dt_st_count(f), 10);
    ASSERT_STR_EQ(dt_st_meta(f, "format"), "np");
    ASSERT_STR_EQ(dt_st_meta(f, "note"), "dtrain golden");
    int bad = 0;
    bad += check(f, "fc.weight", DT_ST_F32, 2, (int64_t[]){3, 4}, NULL);
    bad += check(f, "fc.bias", DT_ST_F32, 1, (int64_t[]){3}, NULL);
    bad += check(f, "half", DT_ST_F16, 2, (int64_t[]){2, 2}, NULL);
    bad += check(f, "double", DT_ST_F64, 1, (int64_t[]){2}, NULL);
    bad += check(f, "ids", DT_ST_I64, 1, (int64_t[]){4}, (double[]){1, -2, 3000000000000.0, -4});
    bad += check(f, "i32", DT_ST_I32, 2, (int64_t[]){1, 2}, (double[]){7, -8});
    bad += check(f, "bytes", DT_ST_U8, 1, (int64_t[]){3}, (double[]){0, 255, 17});
    bad += check(f, "mask", DT_ST_BOOL, 1, (int64_t[]){3}, (double[]){1, 0, 1});
    bad += check(f, "scalar", DT_ST_F32, 0, NULL, (double[]){2.5});
    bad += check(f, "empty", DT_ST_F32, 2, (int64_t[]){0, 3}, NULL);
    ASSERT_EQ_INT(bad, 0);
    dt_st_close(f);
}

static const char *const torch_names[] = {"layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.bias",
                                          "layer1.1.running_mean", "layer1.1.running_var", "fc.weight", "fc.bias"};
static const int64_t torch_shapes[][4] = {{2, 1, 2, 2}, {2}, {2}, {2}, {2}, {2}, {3, 4}, {3}};
static const int torch_nd[] = {4, 1, 1, 1, 1, 1, 2, 1};

TEST(torch_files)
{
    const char *files[2] = {"golden_torch.safetensors", "golden_torch_bf16.safetensors"};
    for (int k = 0; k < 2; k++) {
        dt_st_file *f;
        ASSERT_OK(dt_st_open(golden(files[k]), &f));
        ASSERT_EQ_U64(dt_st_count(f), 9 + (size_t)k);
        ASSERT_STR_EQ(dt_st_meta(f, "format"), "pt");
        int bad = 0;
        for (int i = 0; i < 8; i++)
            bad += check(f, torch_names[i], k ? DT_ST_BF16 : DT_ST_F32, torch_nd[i], torch_shapes[i], NULL);
        bad += check(f, "layer1.1.num_batches_tracked", DT_ST_I64, 0, NULL, (double[]){5});
        if (k)
            bad += check(f, "extra.f16", DT_ST_F16, 1, (int64_t[]){3}, NULL);
        ASSERT_EQ_INT(bad, 0);
        dt_st_close(f);
    }
    /* a PyTorch file loads as a checkpoint: a part of fc.weight into dtrain's dtypes */
    float part[5];
    dt_ckpt_entry e = {.name = "fc.weight", .dtype = DT_F32, .ndim = 2, .shape = {3, 4}, .lo = 6, .hi = 11,
                       .data = part};
    ASSERT_OK(dt_ckpt_load(golden("golden_torch.safetensors"), &e, 1, NULL, NULL));
    for (int i = 0; i < 5; i++)
        ASSERT_EQ_INT(part[i] == (float)gv((size_t)(6 + i)), 1);
    int64_t nbt = 0;
    dt_ckpt_entry c = {.name = "layer1.1.num_batches_tracked", .dtype = DT_I64, .ndim = 0, .lo = 0, .hi = 1,
                       .data = &nbt};
    ASSERT_OK(dt_ckpt_load(golden("golden_torch_bf16.safetensors"), &c, 1, NULL, NULL));
    ASSERT_EQ_INT(nbt, 5);
    e.dtype = DT_F32;
    ASSERT_STATUS(dt_ckpt_load(golden("golden_torch_bf16.safetensors"), &e, 1, NULL, NULL), DT_ERR_DTYPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "tensor 'fc.weight': dtype BF16 in checkpoint, F32 here");
}

/* dtrain's writer, given the same tensors (in reverse order) and metadata,
 * writes the same bytes as the Python package. */
TEST(writer_reproduces_package_bytes)
{
    const char *files[3] = {"golden_numpy.safetensors", "golden_torch.safetensors", "golden_torch_bf16.safetensors"};
    for (int k = 0; k < 3; k++) {
        dt_st_file *f;
        ASSERT_OK(dt_st_open(golden(files[k]), &f));
        size_t n = dt_st_count(f), nm = dt_st_meta_count(f);
        dt_st_desc d[16];
        dt_st_kv meta[4];
        ASSERT(n <= 16 && nm <= 4);
        for (size_t i = 0; i < n; i++) {
            const dt_st_tensor *t = dt_st_tensor_at(f, n - 1 - i);
            d[i] = (dt_st_desc){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
            memcpy(d[i].shape, t->shape, sizeof d[i].shape);
        }
        for (size_t i = 0; i < nm; i++)
            ASSERT_OK(dt_st_meta_at(f, i, &meta[i].key, &meta[i].value));
        char out[256];
        snprintf(out, sizeof out, "%s/%s", g_dir, files[k]);
        dt_st_writer *w;
        ASSERT_OK(dt_st_writer_open(out, d, n, meta, nm, &w));
        for (size_t i = 0; i < n; i++) {
            const dt_st_tensor *t = dt_st_tensor_at(f, n - 1 - i);
            void *buf = malloc(t->nbytes + 1);
            ASSERT_OK(dt_st_read(f, t, 0, t->nbytes, buf));
            ASSERT_OK(dt_st_writer_write(w, i, buf, t->nbytes));
            free(buf);
        }
        ASSERT_OK(dt_st_writer_commit(w, NULL));
        dt_st_writer_close(w);
        dt_st_close(f);
        size_t na, nb;
        uint8_t *a = (uint8_t *)t_slurp(golden(files[k]), &na), *b = (uint8_t *)t_slurp(out, &nb);
        ASSERT(a && b);
        if (na != nb || memcmp(a, b, na) != 0) {
            fprintf(stderr, "%s: %zu bytes from the package, %zu from dtrain\n", files[k], na, nb);
            ASSERT(0);
        }
        free(a);
        free(b);
    }
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-golden-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(numpy_file);
    RUN(torch_files);
    RUN(writer_reproduces_package_bytes);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
