/* Users' own arrays: .npy files (versions 1-3, every numeric dtype, both
 * byte orders, written here and by numpy), CSV files (header, label by
 * name or index, quotes, CRLF, blank lines), the held-out split and the
 * reshaped view, the "npy:"/"csv:" data specs, and bad input: fortran
 * order, object/string/structured dtypes, truncated or padded data, row
 * counts that differ, negative labels, ragged CSV rows, non-numeric cells,
 * each an error naming the file (and the line). */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <math.h>

static char path_[4][600];
static const char *tp(int slot, const char *dir, const char *name)
{
    snprintf(path_[slot], sizeof path_[slot], "%s/%s", dir, name);
    return path_[slot];
}

/* A .npy image: version major, header dict text, then data. */
static unsigned char *npy_image(int major, const char *dict, const void *data, size_t nbytes, size_t *len)
{
    size_t dl = strlen(dict), pre = major == 1 ? 10 : 12;
    size_t hl = dl + 1;
    hl += (64 - (pre + hl) % 64) % 64; /* pad to 64 as numpy does */
    unsigned char *b = calloc(1, pre + hl + nbytes + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    b[8] = (unsigned char)hl;
    b[9] = (unsigned char)(hl >> 8);
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', hl - dl - 1);
    b[pre + hl - 1] = '\n';
    if (nbytes)
        memcpy(b + pre + hl, data, nbytes);
    *len = pre + hl + nbytes;
    return b;
}

static void write_npy(const char *path, int major, const char *dict, const void *data, size_t nbytes)
{
    size_t len;
    unsigned char *b = npy_image(major, dict, data, nbytes, &len);
    tu_write(path, b, len);
    free(b);
}

TEST(npy_dtypes_and_versions)
{
    char *dir = tu_tmpdir();
    /* x: (3, 2) in each dtype, y: (3) labels */
    struct {
        const char *descr;
        unsigned char bytes[48];
        int itemsize;
        double want[6];
    } cases[] = {
        {"<f4", {0}, 4, {1.5, -2, 0, 3, 4, 5}},
        {"<f8", {0}, 8, {1.5, -2, 0, 3, 4, 5}},
        {"<f2", {0}, 2, {1.5, -2, 0, 3, 4, 5}},
        {"|i1", {0}, 1, {1, -2, 0, 3, 4, 5}},
        {"<i2", {0}, 2, {1, -2, 0, 3, 4, 5}},
        {"<i4", {0}, 4, {1, -2, 0, 3, 4, 5}},
        {"<i8", {0}, 8, {1, -2, 0, 3, 4, 5}},
        {"|u1", {0}, 1, {1, 200, 0, 3, 4, 5}},
        {"<u2", {0}, 2, {1, 60000, 0, 3, 4, 5}},
        {"<u4", {0}, 4, {1, 2, 0, 3, 4, 5}},
        {"<u8", {0}, 8, {1, 2, 0, 3, 4, 5}},
        {"|b1", {0}, 1, {1, 0, 0, 1, 1, 1}},
        {">f4", {0}, 4, {1.5, -2, 0, 3, 4, 5}},
        {">i8", {0}, 8, {1, -2, 0, 3, 4, 5}},
    };
    int64_t lab[3] = {2, 0, 1};
    write_npy(tp(1, dir, "y.npy"), 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", lab, 24);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int sz = cases[c].itemsize;
        bool be = cases[c].descr[0] == '>';
        for (int i = 0; i < 6; i++) {
            double v = cases[c].want[i];
            unsigned char e[8];
            char k = cases[c].descr[1];
            if (k == 'f' && sz == 2) {
                uint16_t h = dt_f32_to_f16((float)v);
                memcpy(e, &h, 2);
            } else if (k == 'f' && sz == 4) {
                float f = (float)v;
                memcpy(e, &f, 4);
            } else if (k == 'f') {
                memcpy(e, &v, 8);
            } else {
                int64_t iv = (int64_t)v;
                memcpy(e, &iv, 8); /* little-endian host: the low bytes first */
            }
            for (int q = 0; q < sz; q++)
                cases[c].bytes[i * sz + q] = be ? e[sz - 1 - q] : e[q];
        }
        char dict[128];
        int major = 1 + (int)(c % 3);
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3, 2), }", cases[c].descr);
        write_npy(tp(0, dir, "x.npy"), major, dict, cases[c].bytes, (size_t)(6 * sz));
        dt_dataset *ds = NULL;
        if (dt_dataset_npy_open(tp(0, dir, "x.npy"), tp(1, dir, "y.npy"), &ds) != DT_OK) {
            fprintf(stderr, "  %s v%d: %s\n", cases[c].descr, major, dt_last_error());
            ASSERT(0);
        }
        ASSERT_EQ_INT(dt_dataset_length(ds), 3);
        const dt_dataset_info *info = dt_dataset_get_info(ds);
        ASSERT_EQ_INT(info->x_ndim, 1);
        ASSERT_EQ_INT(info->x_shape[0], 2);
        ASSERT_EQ_INT(info->x_dtype, DT_F32);
        ASSERT_EQ_INT(info->y_dtype, DT_I64);
        ASSERT_EQ_INT(info->num_classes, 3);
        for (int r = 0; r < 3; r++) {
            float x[2];
            int64_t y;
            ASSERT_OK(dt_dataset_get_item(ds, r, x, &y));
            ASSERT_NEAR(x[0], cases[c].want[2 * r], 0, 0);
            ASSERT_NEAR(x[1], cases[c].want[2 * r + 1], 0, 0);
            ASSERT_EQ_INT(y, lab[r]);
        }
        dt_dataset_free(ds);
    }
    /* float targets stay values; no targets: label 0 */
    float yt[6] = {0.5f, 1, 2, 3, 4, 5};
    write_npy(tp(2, dir, "yf.npy"), 2, "{'shape': (3, 2), 'descr': '<f4', 'fortran_order': False}", yt, 24);
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_npy_open(tp(0, dir, "x.npy"), tp(2, dir, "yf.npy"), &ds));
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->y_dtype, DT_F32);
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->y_shape[0], 2);
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->num_classes, 0);
    float x[2], yv[2];
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, yv));
    ASSERT_NEAR(yv[0], 0.5, 0, 0);
    dt_dataset_free(ds);
    ASSERT_OK(dt_dataset_npy_open(tp(0, dir, "x.npy"), NULL, &ds));
    int64_t y0 = -1;
    ASSERT_OK(dt_dataset_get_item(ds, 2, x, &y0));
    ASSERT_EQ_INT(y0, 0);
    dt_dataset_free(ds);
    tu_rmdir(dir);
}

TEST(npy_bad_files)
{
    float d[8] = {0};
    struct {
        int major;
        const char *dict;
        size_t nbytes;
        const char *msg;
    } cases[] = {
        {1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 2), }", 24, "fortran_order is True"},
        {1, "{'descr': '|O', 'fortran_order': False, 'shape': (3, 2), }", 24, "dtype '|O' is not numeric"},
        {1, "{'descr': '<U3', 'fortran_order': False, 'shape': (3, 2), }", 24, "dtype '<U3' is not numeric"},
        {1, "{'descr': '<c8', 'fortran_order': False, 'shape': (3, 2), }", 24, "is not numeric"},
        {1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", 12, "structured dtype"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 20, "truncated: the shape needs 24"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", 28, "bytes after the data"},
        {1, "{'descr': '<f4', 'fortran_order': False, }", 24, "lacks 'shape'"},
        {1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24, "'descr' twice"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), 'x': 1}", 24, "unknown header key 'x'"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, -2), }", 24, "other than sizes"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 24, "multiply past"},
        /* no rows, but a row of 709551615 x 40000000000 x 3 x 2: the fuzzer's overflow */
        {1, "{'descr': '<i1', 'fortran_order': False, 'shape': (0, 709551615, 40000000000, 3, 2), }", 0,
         "multiply past"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1), }", 4, "more than 5 dims"},
        {1, "['descr']", 24, "not a dict"},
        {4, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24, "format version 4.0"},
        {1, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } x", 24, "text after the header dict"},
    };
    char *dir = tu_tmpdir();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len;
        unsigned char *b = npy_image(cases[c].major, cases[c].dict, d, cases[c].nbytes, &len);
        dt_npy_header h;
        dt_status st = dt_npy_parse_header(b, len, "bad.npy", &h);
        if (st != DT_ERR_FORMAT || !strstr(dt_last_error(), cases[c].msg) || !strstr(dt_last_error(), "bad.npy")) {
            fprintf(stderr, "  case %zu: status %d, '%s'\n", c, st, dt_last_error());
            ASSERT(0);
        }
        free(b);
    }
    /* truncated inside the header, no magic */
    ASSERT_STATUS(dt_npy_parse_header("\x93NUMPY\x01\x00\xff\x00{", 11, "t.npy", &(dt_npy_header){0}),
                  DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "truncated");
    ASSERT_STATUS(dt_npy_parse_header("PK\x03\x04", 4, "z.npz", &(dt_npy_header){0}), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "not a .npy file");
    /* fortran order of a vector is C order: accepted */
    size_t len;
    unsigned char *b = npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (6,), }", d, 24, &len);
    ASSERT_OK(dt_npy_parse_header(b, len, "v.npy", &(dt_npy_header){0}));
    free(b);
    /* through files: x and y row counts differ; negative labels; scalars */
    write_npy(tp(0, dir, "x.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", d, 24);
    int32_t yl[4] = {0, 1, -1, 2};
    write_npy(tp(1, dir, "y4.npy"), 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", yl, 16);
    write_npy(tp(2, dir, "yneg.npy"), 1, "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", yl, 12);
    dt_dataset *ds = (dt_dataset *)1;
    ASSERT_STATUS(dt_dataset_npy_open(tp(0, dir, "x.npy"), tp(1, dir, "y4.npy"), &ds), DT_ERR_MISMATCH);
    ASSERT(ds == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "x.npy has 3 rows");
    ASSERT_STR_CONTAINS(dt_last_error(), "y4.npy has 4");
    ASSERT_STATUS(dt_dataset_npy_open(tp(0, dir, "x.npy"), tp(2, dir, "yneg.npy"), &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "yneg.npy: label -1 at element 2");
    write_npy(tp(3, dir, "s.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", d, 4);
    ASSERT_STATUS(dt_dataset_npy_open(tp(3, dir, "s.npy"), NULL, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "a scalar");
    ASSERT_STATUS(dt_dataset_npy_open(tp(3, dir, "missing.npy"), NULL, &ds), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "missing.npy");
    tu_rmdir(dir);
}

/* Files numpy wrote: the committed pair (big-endian f8 (2, 3), i2 labels),
 * and more written now by /usr/bin/python3 when it has numpy. */
TEST(numpy_written)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", __FILE__);
    *strrchr(dir, '/') = 0;
    char x[700], y[700];
    snprintf(x, sizeof x, "%s/files/numpy_x_f8be.npy", dir);
    snprintf(y, sizeof y, "%s/files/numpy_y_i2.npy", dir);
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_npy_open(x, y, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    float xv[3];
    int64_t yv;
    ASSERT_OK(dt_dataset_get_item(ds, 1, xv, &yv));
    ASSERT_NEAR(xv[0], 4.0, 0, 0);
    ASSERT_NEAR(xv[2], -6.75, 0, 0);
    ASSERT_EQ_INT(yv, 1);
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->num_classes, 4);
    dt_dataset_free(ds);
    if (access("/usr/bin/python3", X_OK) != 0)
        DT_TEST_SKIP_NEED("numpy", "no /usr/bin/python3 for the numpy-written files");
    char *t = tu_tmpdir(), cmd[2000];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import numpy as np; "
             "np.save('%s/a.npy', np.arange(24, dtype=np.float16).reshape(4, 2, 3)); "
             "np.save('%s/b.npy', np.array([True, False, True, True])); "
             "np.save('%s/f.npy', np.asfortranarray(np.ones((4, 6), dtype=np.float32)))\" 2>/dev/null",
             t, t, t);
    if (system(cmd) != 0) {
        tu_rmdir(t);
        DT_TEST_SKIP_NEED("numpy", "/usr/bin/python3 has no numpy");
    }
    ASSERT_OK(dt_dataset_npy_open(tp(0, t, "a.npy"), tp(1, t, "b.npy"), &ds));
    const dt_dataset_info *info = dt_dataset_get_info(ds);
    ASSERT_EQ_INT(info->x_ndim, 2);
    ASSERT_EQ_INT(info->x_shape[0], 2);
    ASSERT_EQ_INT(info->x_shape[1], 3);
    ASSERT_EQ_INT(info->num_classes, 2);
    float a[6];
    ASSERT_OK(dt_dataset_get_item(ds, 3, a, &yv));
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(a[i], 18 + i, 0, 0);
    ASSERT_EQ_INT(yv, 1);
    dt_dataset_free(ds);
    ASSERT_STATUS(dt_dataset_npy_open(tp(2, t, "f.npy"), NULL, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "fortran_order is True");
    tu_rmdir(t);
}

TEST(csv_good)
{
    const char *text = "a, b ,label,c\r\n1,2,0,3\r\n\r\n\"4.5\", -5e1 ,2, 6\r\n7,8,1,9";
    dt_dataset *ds = NULL;
    dt_csv_params p = dt_csv_params_default();
    p.label = "label";
    ASSERT_OK(dt_dataset_csv_from_mem(text, strlen(text), "t.csv", &p, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 3);
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->x_shape[0], 3);
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->num_classes, 3);
    float x[3];
    int64_t y;
    ASSERT_OK(dt_dataset_get_item(ds, 1, x, &y));
    ASSERT_NEAR(x[0], 4.5, 0, 0);
    ASSERT_NEAR(x[1], -50, 0, 0);
    ASSERT_NEAR(x[2], 6, 0, 0);
    ASSERT_EQ_INT(y, 2);
    dt_dataset_free(ds);
    /* label by index; no header; the default label is the last column */
    p.label = "0";
    const char *nh = "1,2,3\n0,5,6\n";
    ASSERT_OK(dt_dataset_csv_from_mem(nh, strlen(nh), "n.csv", &p, &ds));
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, &y));
    ASSERT_EQ_INT(y, 1);
    ASSERT_NEAR(x[0], 2, 0, 0);
    dt_dataset_free(ds);
    ASSERT_OK(dt_dataset_csv_from_mem(nh, strlen(nh), "n.csv", NULL, &ds));
    ASSERT_OK(dt_dataset_get_item(ds, 1, x, &y));
    ASSERT_EQ_INT(y, 6);
    ASSERT_NEAR(x[1], 5, 0, 0);
    dt_dataset_free(ds);
    /* a UTF-8 byte order mark is skipped: a header-less file keeps its first
     * row, a header keeps its first column's name */
    const char *bom = "\xef\xbb\xbf" "1,2,3\n0,5,6\n";
    ASSERT_OK(dt_dataset_csv_from_mem(bom, strlen(bom), "bom.csv", NULL, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, &y));
    ASSERT_EQ_INT(y, 3);
    ASSERT_NEAR(x[0], 1, 0, 0);
    dt_dataset_free(ds);
    /* quoted header names hold commas and "" (RFC 4180); a header of names beside an empty cell (pandas' index
       column) is still a header */
    const char *qh = "\"x, \"\"y\"\"\",\"p\"\"q\",c\n1,0,3\n2,1,4\n";
    p.label = "p\"q";
    ASSERT_OK(dt_dataset_csv_from_mem(qh, strlen(qh), "qh.csv", &p, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    ASSERT_OK(dt_dataset_get_item(ds, 1, x, &y));
    ASSERT_EQ_INT(y, 1);
    ASSERT_NEAR(x[0], 2, 0, 0);
    ASSERT_NEAR(x[1], 4, 0, 0);
    dt_dataset_free(ds);
    const char *ix = ",a,label\n0,1.5,1\n1,2.5,0\n";
    ASSERT_OK(dt_dataset_csv_from_mem(ix, strlen(ix), "ix.csv", NULL, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    dt_dataset_free(ds);
    const char *bomh = "\xef\xbb\xbf" "label,b\n1,2\n0,5\n";
    p.label = "label";
    ASSERT_OK(dt_dataset_csv_from_mem(bomh, strlen(bomh), "bomh.csv", &p, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    ASSERT_OK(dt_dataset_get_item(ds, 1, x, &y));
    ASSERT_EQ_INT(y, 0);
    dt_dataset_free(ds);
}

TEST(csv_bad)
{
    struct {
        const char *text, *label, *msg;
    } cases[] = {
        {"a,b\n1,2\n3\n", NULL, "b.csv:3: 1 cells, line 1 has 2"},
        {"1,2\n3,4,5\n", NULL, "b.csv:2: 3 cells, line 1 has 2"},
        {"a,b\n1,x\n", NULL, "b.csv:2: column 2: 'x' is not a number"},
        {"a,b\n1,2\nnan,1\n", NULL, "b.csv:3: column 1: 'nan' is not a number"},
        {"a,b\n1,2\n1,inf\n", NULL, "b.csv:3: column 2"},
        {"a,b\n1,2.5\n", NULL, "b.csv:2: column 2: label 2.5 is not a class id"},
        {"a,b\n1,-1\n", NULL, "label -1 is not a class id"},
        {"a,b\n", NULL, "a header and no data rows"},
        {"", NULL, "b.csv: no rows"},
        {"\n\n", NULL, "no rows"},
        {"a\n1\n", NULL, "one column only"},
        {"a,b\n1,2\n", "zz", "no column 'zz'"},
        {"1,2\n3,4\n", "b", "the file has no header"},
        {"1,2\n3,4\n", "2", "no column '2'"},
        {"a,b\n1,,\n", NULL, "b.csv:2: 3 cells"},
        {"a,b\n,1\n", NULL, "b.csv:2: column 1: an empty cell"},
        /* a first row with a missing value is data, not a header silently skipped */
        {"1,nan,0\n1,2,0\n", NULL, "b.csv:1: column 2: 'nan' is not a number"},
        {"1,,0\n1,2,0\n", NULL, "b.csv:1: column 2: an empty cell"},
        {"1,-inf,0\n1,2,0\n", NULL, "b.csv:1: column 2"},
        {"1,1e999,0\n1,2,0\n", NULL, "b.csv:1: column 2"},
        /* features beyond float32 became infinities (the loader's error named no line) */
        {"a,b\n1,0\n1e39,1\n", NULL, "b.csv:3: column 1: 1e39 is outside float32's range"},
        {"a,b,c\n1,-3.5e38,1\n", NULL, "b.csv:2: column 2: -3.5e38 is outside float32's range"},
        /* quoted cells: a comma inside is text (was "3 cells, line 1 has 2") */
        {"a,b\n\"1,5\",1\n", NULL, "b.csv:2: column 1: '1,5' is not a number"},
        {"a,b\n1,\"2\n", NULL, "b.csv:2: a quoted cell does not close on its line"},
        {"a,b\n\"1\"x,2\n", NULL, "b.csv:2: a quoted cell"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        dt_csv_params p = dt_csv_params_default();
        p.label = cases[c].label;
        dt_dataset *ds = (dt_dataset *)1;
        dt_status st = dt_dataset_csv_from_mem(cases[c].text, strlen(cases[c].text), "b.csv", &p, &ds);
        if (st >= 0 || ds != NULL || !strstr(dt_last_error(), cases[c].msg)) {
            fprintf(stderr, "  case %zu: status %d, '%s'\n", c, st, dt_last_error());
            ASSERT(0);
        }
    }
}

TEST(holdout_reshape_specs)
{
    char *dir = tu_tmpdir();
    /* 50 rows of 4 features (x = row, 0, 0, 0), label row % 3 */
    char text[4000];
    int o = snprintf(text, sizeof text, "f0,f1,f2,f3,y\n");
    for (int r = 0; r < 50; r++)
        o += snprintf(text + o, sizeof text - (size_t)o, "%d,0,0,0,%d\n", r, r % 3);
    tu_write(tp(0, dir, "d.csv"), text, (size_t)o);
    char spec[700];
    snprintf(spec, sizeof spec, "csv:%s,test=0.2,shape=2x2", tp(0, dir, "d.csv"));
    dt_dataset *tr = NULL, *te = NULL;
    ASSERT_OK(dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &tr));
    ASSERT_OK(dt_dataset_open_spec(spec, DT_SPLIT_TEST, &te));
    ASSERT_EQ_INT(dt_dataset_length(tr), 40);
    ASSERT_EQ_INT(dt_dataset_length(te), 10);
    ASSERT_EQ_INT(dt_dataset_get_info(tr)->x_ndim, 2);
    ASSERT_EQ_INT(dt_dataset_get_info(tr)->x_shape[1], 2);
    ASSERT_STR_CONTAINS(dt_dataset_source(te), "d.csv (test split)");
    /* disjoint, together every row once; the training split keeps its order */
    int seen[50] = {0};
    float x[4];
    int64_t y, prev = -1;
    for (int64_t i = 0; i < 40; i++) {
        ASSERT_OK(dt_dataset_get_item(tr, i, x, &y));
        ASSERT((int64_t)x[0] > prev);
        prev = (int64_t)x[0];
        ASSERT_EQ_INT(y, (int64_t)x[0] % 3);
        seen[(int)x[0]]++;
    }
    for (int64_t i = 0; i < 10; i++) {
        ASSERT_OK(dt_dataset_get_item(te, i, x, &y));
        seen[(int)x[0]]++;
    }
    for (int r = 0; r < 50; r++)
        ASSERT_EQ_INT(seen[r], 1);
    /* a random choice, not the tail */
    int tail = 0;
    for (int64_t i = 0; i < 10; i++) {
        ASSERT_OK(dt_dataset_get_item(te, i, x, &y));
        tail += x[0] >= 40;
    }
    ASSERT(tail < 10);
    dt_dataset_free(tr);
    dt_dataset_free(te);
    /* a split that is neither was taken as the training split */
    snprintf(spec, sizeof spec, "csv:%s,test=0.2", tp(0, dir, "d.csv"));
    ASSERT_STATUS(dt_dataset_open_spec(spec, (dt_split)7, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "split 7");
    ASSERT(tr == NULL);
    /* bad specs */
    snprintf(spec, sizeof spec, "csv:%s,shape=3x2", tp(0, dir, "d.csv"));
    ASSERT_STATUS(dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &tr), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "4 elements cannot be viewed");
    snprintf(spec, sizeof spec, "csv:%s,test=1", tp(0, dir, "d.csv"));
    ASSERT_STATUS(dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &tr), DT_ERR_INVALID_ARG);
    snprintf(spec, sizeof spec, "csv:%s,colour=red", tp(0, dir, "d.csv"));
    ASSERT_STATUS(dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "unknown option 'colour=red'");
    ASSERT_STATUS(dt_dataset_open_spec("npy:a.npy,b.npy,c.npy", DT_SPLIT_TRAIN, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_dataset_open_spec("npy:/nonexistent/a.npy", DT_SPLIT_TRAIN, &tr), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent/a.npy");
    /* npy spec with test=0: everything is training, the test split is empty */
    float xs[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    write_npy(tp(1, dir, "x.npy"), 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (8,), }", xs, 32);
    snprintf(spec, sizeof spec, "npy:%s,test=0", tp(1, dir, "x.npy"));
    ASSERT_OK(dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &tr));
    ASSERT_EQ_INT(dt_dataset_length(tr), 8);
    ASSERT_EQ_INT(dt_dataset_get_info(tr)->x_ndim, 0);
    dt_dataset_free(tr);
    ASSERT_OK(dt_dataset_open_spec(spec, DT_SPLIT_TEST, &te));
    ASSERT_EQ_INT(dt_dataset_length(te), 0);
    dt_dataset_free(te);
    tu_rmdir(dir);
}

int main(void)
{
    RUN(npy_dtypes_and_versions);
    RUN(npy_bad_files);
    RUN(numpy_written);
    RUN(csv_good);
    RUN(csv_bad);
    RUN(holdout_reshape_specs);
    return TEST_REPORT();
}
