/* The row dataset over numeric arrays (arrays.h) and the held-out split
 * (data.h dt_dataset_holdout_init).
 *
 * Rows are converted element by element to f32 (features, float targets)
 * or i64 (integer targets: labels) when a batch is read; the arrays stay as
 * the files have them (mapped .npy, parsed CSV). Labels are checked once at
 * open (all >= 0, integral), so a batch never carries a bad one. */
#include "arrays.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void load_swapped(const unsigned char *p, int size, bool swap, unsigned char *out)
{
    for (int k = 0; k < size; k++)
        out[k] = swap ? p[size - 1 - k] : p[k];
}

double dt__array_get(const dt__array *a, size_t i)
{
    unsigned char b[8];
    load_swapped(a->data + i * (size_t)a->itemsize, a->itemsize, a->swap, b);
    switch (a->kind) {
    case 'f':
        if (a->itemsize == 2) {
            uint16_t h;
            memcpy(&h, b, 2);
            return dt_f16_to_f32(h);
        } else if (a->itemsize == 4) {
            float f;
            memcpy(&f, b, 4);
            return f;
        } else {
            double d;
            memcpy(&d, b, 8);
            return d;
        }
    case 'i':
        switch (a->itemsize) {
        case 1: return (int8_t)b[0];
        case 2: { int16_t v; memcpy(&v, b, 2); return v; }
        case 4: { int32_t v; memcpy(&v, b, 4); return v; }
        default: { int64_t v; memcpy(&v, b, 8); return (double)v; }
        }
    case 'u':
        switch (a->itemsize) {
        case 1: return b[0];
        case 2: { uint16_t v; memcpy(&v, b, 2); return v; }
        case 4: { uint32_t v; memcpy(&v, b, 4); return v; }
        default: { uint64_t v; memcpy(&v, b, 8); return (double)v; }
        }
    default: /* 'b' */
        return b[0] != 0;
    }
}

void dt__array_release(dt__array *a)
{
    if (!a)
        return;
    dt__map_close(&a->map);
    free(a->owned);
    a->owned = NULL;
    a->data = NULL;
}

typedef struct rowset {
    dt__array x, y;
    bool has_y, labels;
    int64_t n;
    size_t xnum, ynum; /* elements per row */
} rowset;

static int64_t rowset_length(void *self) { return ((rowset *)self)->n; }

/* Row i's element k of a, converted to f32: NaN, an infinity or a value
 * beyond float32 (a float64 1e300 became an infinity) is an error naming
 * the file's own row and the element. The loader's check would name the
 * item's index in a held-out split instead, and call 1e300 infinite. */
static dt_status get_f32(const dt__array *a, int64_t i, size_t num, size_t k, float *out)
{
    double v = dt__array_get(a, (size_t)i * num + k);
    *out = (float)v;
    if (isfinite(*out))
        return DT_OK;
    char what[64];
    if (isnan(v))
        snprintf(what, sizeof what, "NaN");
    else if (isinf(v))
        snprintf(what, sizeof what, "an infinity");
    else
        snprintf(what, sizeof what, "%g, beyond float32 (+-3.4e38)", v);
    return dt_error(DT_ERR_FORMAT, "%s: row %lld, element %zu is %s: clean the data (or leave the row out) and rerun",
                    a->name, (long long)i, k, what);
}

static dt_status rowset_get_item(void *self, int64_t i, void *x, void *y)
{
    rowset *r = self;
    dt_status st; /* a mapped .npy truncated since it was opened: an error, not SIGBUS */
    if ((st = dt__map_check(&r->x.map)) < 0 || (r->has_y && (st = dt__map_check(&r->y.map)) < 0))
        return st;
    float *xf = x;
    for (size_t k = 0; k < r->xnum; k++)
        if ((st = get_f32(&r->x, i, r->xnum, k, &xf[k])) < 0)
            return st;
    if (!r->has_y) {
        *(int64_t *)y = 0;
    } else if (r->labels) {
        int64_t *yl = y;
        for (size_t k = 0; k < r->ynum; k++)
            yl[k] = (int64_t)dt__array_get(&r->y, (size_t)i * r->ynum + k);
    } else {
        float *yf = y;
        for (size_t k = 0; k < r->ynum; k++)
            if ((st = get_f32(&r->y, i, r->ynum, k, &yf[k])) < 0)
                return st;
    }
    return DT_OK;
}

static void rowset_free(void *self)
{
    rowset *r = self;
    if (!r)
        return;
    dt__array_release(&r->x);
    dt__array_release(&r->y);
    free(r);
}

static const dt_dataset_vtable rowset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "rows",
    .length = rowset_length,
    .get_item = rowset_get_item,
    .get_batch = NULL,
    .free = rowset_free,
};

dt_status dt__dataset_rows(dt__array *x, dt__array *y, dt_dataset **out)
{
    *out = NULL;
    dt_status st = DT_OK;
    rowset *r = calloc(1, sizeof *r);
    if (!r) {
        dt__array_release(x);
        dt__array_release(y);
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", x->name);
    }
    r->x = *x;
    memset(x, 0, sizeof *x);
    if (y) {
        r->y = *y;
        r->has_y = true;
        memset(y, 0, sizeof *y);
    }
    dt_dataset_info info = {.x_dtype = DT_F32, .y_dtype = DT_I64};
    if (r->x.ndim < 1 || r->x.ndim > DT_DATA_MAX_DIMS + 1) {
        st = dt_error(DT_ERR_FORMAT, "%s: features of %d dims (want 1 to %d: rows, then up to %d item dims)",
                      r->x.name, r->x.ndim, DT_DATA_MAX_DIMS + 1, DT_DATA_MAX_DIMS);
        goto fail;
    }
    r->n = r->x.shape[0];
    r->xnum = 1;
    info.x_ndim = r->x.ndim - 1;
    for (int d = 1; d < r->x.ndim; d++) {
        info.x_shape[d - 1] = r->x.shape[d];
        r->xnum *= (size_t)r->x.shape[d];
    }
    if (r->xnum == 0) {
        st = dt_error(DT_ERR_FORMAT, "%s: rows of 0 elements", r->x.name);
        goto fail;
    }
    r->ynum = 1;
    if (r->has_y) {
        if (r->y.ndim < 1 || r->y.ndim > DT_DATA_MAX_DIMS + 1) {
            st = dt_error(DT_ERR_FORMAT, "%s: targets of %d dims (want 1 to %d)", r->y.name, r->y.ndim,
                          DT_DATA_MAX_DIMS + 1);
            goto fail;
        }
        if (r->y.shape[0] != r->n) {
            st = dt_error(DT_ERR_MISMATCH, "%s has %lld rows, %s has %lld: features and targets must have one row "
                          "each per item", r->x.name, (long long)r->n, r->y.name, (long long)r->y.shape[0]);
            goto fail;
        }
        info.y_ndim = r->y.ndim - 1;
        for (int d = 1; d < r->y.ndim; d++) {
            info.y_shape[d - 1] = r->y.shape[d];
            r->ynum *= (size_t)r->y.shape[d];
        }
        if (r->ynum == 0) {
            st = dt_error(DT_ERR_FORMAT, "%s: rows of 0 elements", r->y.name);
            goto fail;
        }
        r->labels = r->y.kind != 'f';
        if (r->labels) {
            double mx = -1;
            size_t total = (size_t)r->n * r->ynum;
            for (size_t i = 0; i < total; i++) {
                double v = dt__array_get(&r->y, i);
                if (v < 0 || v > (double)INT32_MAX) {
                    st = dt_error(DT_ERR_FORMAT, "%s: label %.0f at element %zu: labels are class ids 0..2^31-1",
                                  r->y.name, v, i);
                    goto fail;
                }
                mx = v > mx ? v : mx;
            }
            info.num_classes = (int64_t)mx + 1;
        } else {
            info.y_dtype = DT_F32;
        }
    }
    st = dt_dataset_init(&rowset_vt, r, &info, out);
    if (st < 0)
        goto fail;
    dt_dataset_set_source(*out, r->x.name);
    return DT_OK;
fail:
    rowset_free(r);
    return st;
}

/* ---- the held-out split ---------------------------------------------------- */

typedef struct holdout {
    dt_dataset *base;
    int64_t *idx; /* base indices of this split, n of them */
    int64_t n;
} holdout;

static int64_t holdout_length(void *self) { return ((holdout *)self)->n; }

static dt_status holdout_get_item(void *self, int64_t i, void *x, void *y)
{
    holdout *h = self;
    return dt_dataset_get_item(h->base, h->idx[i], x, y);
}

static dt_status holdout_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    holdout *h = self;
    size_t xb = dt_dataset_x_bytes(h->base), yb = dt_dataset_y_bytes(h->base);
    for (int64_t b = 0; b < n; b++) {
        dt_status st = dt_dataset_get_item(h->base, h->idx[idx[b]], (char *)x + (size_t)b * xb,
                                           (char *)y + (size_t)b * yb);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

static void holdout_free(void *self)
{
    holdout *h = self;
    if (!h)
        return;
    dt_dataset_free(h->base);
    free(h->idx);
    free(h);
}

static const dt_dataset_vtable holdout_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "holdout",
    .length = holdout_length,
    .get_item = holdout_get_item,
    .get_batch = holdout_get_batch,
    .free = holdout_free,
};

dt_status dt_dataset_holdout_init(dt_dataset *base, double test_fraction, uint64_t seed, dt_split split,
                                  dt_dataset **out)
{
    if (!out) {
        dt_dataset_free(base);
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_holdout_init: out is NULL");
    }
    *out = NULL;
    if (!base)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_holdout_init: base is NULL");
    if (split != DT_SPLIT_TRAIN && split != DT_SPLIT_TEST) { /* was taken as the training split */
        dt_dataset_free(base);
        return dt_error(DT_ERR_INVALID_ARG, "held-out split: split %d (DT_SPLIT_TRAIN or DT_SPLIT_TEST)", (int)split);
    }
    if (!(test_fraction >= 0 && test_fraction < 1)) {
        dt_dataset_free(base);
        return dt_error(DT_ERR_INVALID_ARG, "held-out split: test fraction %g (want 0 <= F < 1)", test_fraction);
    }
    int64_t N = dt_dataset_length(base), nt = (int64_t)llround(test_fraction * (double)N);
    holdout *h = calloc(1, sizeof *h);
    int64_t *perm = malloc((size_t)(N ? N : 1) * sizeof *perm);
    bool *test = calloc((size_t)(N ? N : 1), sizeof *test);
    dt_status st = DT_OK;
    if (!h || !perm || !test || !(h->idx = malloc((size_t)(N ? N : 1) * sizeof *h->idx))) {
        st = dt_error(DT_ERR_NO_MEMORY, "held-out split: out of memory");
        goto fail;
    }
    if ((st = dt_rng_permutation(dt_rng_key_make(seed, DT_RNG_DATA, 7, 0), perm, N)) < 0)
        goto fail;
    for (int64_t i = 0; i < nt; i++)
        test[perm[i]] = true;
    for (int64_t i = 0; i < N; i++)
        if (test[i] == (split == DT_SPLIT_TEST))
            h->idx[h->n++] = i;
    h->base = base;
    free(perm);
    free(test);
    st = dt_dataset_init(&holdout_vt, h, dt_dataset_get_info(base), out);
    if (st < 0) {
        holdout_free(h);
        return st;
    }
    char src[600];
    snprintf(src, sizeof src, "%s (%s split)", dt_dataset_source(base), split == DT_SPLIT_TEST ? "test" : "training");
    dt_dataset_set_source(*out, src);
    return DT_OK;
fail:
    if (h)
        free(h->idx);
    free(h);
    free(perm);
    free(test);
    dt_dataset_free(base);
    return st;
}

/* ---- the reshaped view ------------------------------------------------------- */

static int64_t view_length(void *self) { return dt_dataset_length(self); }
static dt_status view_get_item(void *self, int64_t i, void *x, void *y) { return dt_dataset_get_item(self, i, x, y); }
static dt_status view_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    return dt_dataset_get_batch(self, idx, n, x, y);
}
static void view_free(void *self) { dt_dataset_free(self); }

static const dt_dataset_vtable view_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "reshape",
    .length = view_length,
    .get_item = view_get_item,
    .get_batch = view_get_batch,
    .free = view_free,
};

dt_status dt_dataset_reshape_init(dt_dataset *base, int ndim, const int64_t *shape, dt_dataset **out)
{
    if (!out || !base || (!shape && ndim)) {
        dt_dataset_free(base);
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_reshape_init: NULL argument");
    }
    *out = NULL;
    dt_dataset_info info = *dt_dataset_get_info(base);
    int64_t n = 1;
    for (int d = 0; d < ndim && d < DT_DATA_MAX_DIMS; d++)
        n = shape[d] > 0 && n <= INT64_MAX / shape[d] ? n * shape[d] : -1;
    if (ndim < 0 || ndim > DT_DATA_MAX_DIMS || n != dt_dataset_x_numel(base)) {
        dt_error(DT_ERR_SHAPE, "%s: items of %lld elements cannot be viewed as %d dims of %lld elements",
                 dt_dataset_source(base), (long long)dt_dataset_x_numel(base), ndim, (long long)n);
        dt_dataset_free(base);
        return DT_ERR_SHAPE;
    }
    info.x_ndim = ndim;
    memset(info.x_shape, 0, sizeof info.x_shape);
    for (int d = 0; d < ndim; d++)
        info.x_shape[d] = shape[d];
    char src[600];
    snprintf(src, sizeof src, "%s", dt_dataset_source(base));
    dt_status st = dt_dataset_init(&view_vt, base, &info, out);
    if (st < 0) {
        dt_dataset_free(base);
        return st;
    }
    dt_dataset_set_source(*out, src);
    return DT_OK;
}

/* ---- "npy:..." and "csv:..." data specs --------------------------------------- */

dt_status dt__dataset_open_array_spec(const char *spec, dt_split split, dt_dataset **out)
{
    bool npy = !strncmp(spec, "npy:", 4);
    char buf[2048];
    if (strlen(spec + 4) >= sizeof buf)
        return dt_error(DT_ERR_INVALID_ARG, "data '%s': too long", spec);
    snprintf(buf, sizeof buf, "%s", spec + 4);
    const char *files[3] = {NULL, NULL, NULL};
    int nf = 0;
    double test = 0.1;
    int sdim = 0;
    int64_t shape[DT_DATA_MAX_DIMS];
    dt_csv_params cp = dt_csv_params_default();
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strncmp(tok, "test=", 5)) {
            if (dt_parse_double("test", tok + 5, 0, 0.999999, &test) < 0)
                return dt_error(DT_ERR_INVALID_ARG, "data '%s': test=%s: want a fraction 0 <= F < 1", spec, tok + 5);
        } else if (!strncmp(tok, "shape=", 6)) {
            char *save2 = NULL;
            sdim = 0;
            for (char *d = strtok_r(tok + 6, "x", &save2); d; d = strtok_r(NULL, "x", &save2)) {
                if (sdim == DT_DATA_MAX_DIMS || dt_parse_int("shape", d, 1, (int64_t)1 << 32, &shape[sdim]) < 0)
                    return dt_error(DT_ERR_INVALID_ARG, "data '%s': shape=: want 1 to %d sizes joined by x (1x28x28)",
                                    spec, DT_DATA_MAX_DIMS);
                sdim++;
            }
            if (!sdim)
                return dt_error(DT_ERR_INVALID_ARG, "data '%s': shape= is empty", spec);
        } else if (!npy && !strncmp(tok, "label=", 6) && tok[6]) {
            cp.label = tok + 6;
        } else if (strchr(tok, '=')) {
            return dt_error(DT_ERR_INVALID_ARG, "data '%s': unknown option '%s' (%s)", spec, tok,
                            npy ? "npy:X.npy[,Y.npy][,test=F][,shape=AxBxC]"
                                : "csv:FILE[,label=COL][,test=F][,shape=AxBxC]");
        } else if (nf < 3) {
            files[nf++] = tok;
        }
    }
    if (npy ? (nf < 1 || nf > 2) : nf != 1)
        return dt_error(DT_ERR_INVALID_ARG, "data '%s': want %s", spec,
                        npy ? "npy:X.npy[,Y.npy][,test=F]" : "csv:FILE[,label=COL][,test=F]");
    dt_dataset *all = NULL;
    dt_status st = npy ? dt_dataset_npy_open(files[0], files[1], &all) : dt_dataset_csv_open(files[0], &cp, &all);
    if (st < 0)
        return st;
    if (sdim && (st = dt_dataset_reshape_init(all, sdim, shape, &all)) < 0)
        return st;
    return dt_dataset_holdout_init(all, test, 0, split, out);
}
