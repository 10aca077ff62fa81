/* The dataset vtable wrapper, the subset view and the synthetic random set.
 *
 * The wrapper checks handles and indices so implementations can assume valid
 * arguments, and supplies get_batch when an implementation has only
 * get_item. */
#include "dtrain/data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_dataset {
    const dt_dataset_vtable *vt;
    void *self;
    dt_dataset_info info;
    size_t x_bytes, y_bytes;
    char source[512]; /* for messages: the file it reads, else the vtable's name */
};

static int64_t shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Whether one item of this shape and element size fits in memory's sizes:
   its element count, and its bytes, below 2^62 (shapes are positive). */
static bool item_fits(int ndim, const int64_t *shape, size_t elem)
{
    int64_t n = (int64_t)elem, lim = (int64_t)1 << 62;
    for (int d = 0; d < ndim; d++) {
        if (n > lim / shape[d])
            return false;
        n *= shape[d];
    }
    return true;
}

dt_status dt_dataset_init(const dt_dataset_vtable *vt, void *self, const dt_dataset_info *info,
                          dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: out is NULL");
    *out = NULL;
    if (!vt || !info)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: NULL vtable or info");
    if (vt->version != DT_DATASET_VTABLE_VERSION || !vt->length || !vt->get_item)
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_dataset_init: vtable '%s' has version %d (want %d) or lacks a "
                        "required slot (length, get_item)",
                        vt->name ? vt->name : "?", vt->version, DT_DATASET_VTABLE_VERSION);
    if (info->x_ndim < 0 || info->x_ndim > DT_DATA_MAX_DIMS || info->y_ndim < 0 ||
        info->y_ndim > DT_DATA_MAX_DIMS || !dt_dtype_size(info->x_dtype) ||
        !dt_dtype_size(info->y_dtype))
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: bad item description");
    for (int d = 0; d < info->x_ndim; d++)
        if (info->x_shape[d] <= 0)
            return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: x_shape[%d] = %lld", d,
                            (long long)info->x_shape[d]);
    for (int d = 0; d < info->y_ndim; d++)
        if (info->y_shape[d] <= 0)
            return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: y_shape[%d] = %lld", d,
                            (long long)info->y_shape[d]);
    if (!item_fits(info->x_ndim, info->x_shape, dt_dtype_size(info->x_dtype)) ||
        !item_fits(info->y_ndim, info->y_shape, dt_dtype_size(info->y_dtype)))
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_init: '%s': an item's shape multiplies past any "
                        "array size", vt->name ? vt->name : "dataset");
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return dt_error(DT_ERR_NO_MEMORY, "dt_dataset_init: out of memory");
    ds->vt = vt;
    ds->self = self;
    ds->info = *info;
    snprintf(ds->source, sizeof ds->source, "%s", vt->name ? vt->name : "dataset");
    ds->x_bytes = (size_t)shape_numel(info->x_ndim, info->x_shape) * dt_dtype_size(info->x_dtype);
    ds->y_bytes = (size_t)shape_numel(info->y_ndim, info->y_shape) * dt_dtype_size(info->y_dtype);
    *out = ds;
    return DT_OK;
}

void dt_dataset_free(dt_dataset *ds)
{
    if (!ds)
        return;
    if (ds->vt->free)
        ds->vt->free(ds->self);
    free(ds);
}

void dt_dataset_set_source(dt_dataset *ds, const char *source)
{
    if (ds && source)
        snprintf(ds->source, sizeof ds->source, "%s", source);
}

const char *dt_dataset_source(const dt_dataset *ds) { return ds ? ds->source : "(null)"; }

static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t o = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (o < n)
        snprintf(buf + o, n - o, ")");
    return buf;
}

dt_status dt_dataset_check_input(const dt_dataset *ds, dt_dtype dtype, int ndim, const int64_t *shape,
                                 const char *consumer)
{
    if (!ds || (ndim > 0 && !shape))
        return dt_error(DT_ERR_NULL, "dt_dataset_check_input: NULL argument");
    const dt_dataset_info *in = &ds->info;
    bool same = in->x_dtype == dtype && in->x_ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = in->x_shape[d] == shape[d];
    if (same)
        return DT_OK;
    char a[160], b[160];
    return dt_error(DT_ERR_SHAPE, "%s: items are %s %s, %s takes %s %s", ds->source,
                    shape_str(in->x_ndim, in->x_shape, a, sizeof a), dt_dtype_name(in->x_dtype),
                    consumer ? consumer : "the consumer", shape_str(ndim, shape, b, sizeof b),
                    dt_dtype_name(dtype));
}

int64_t dt_dataset_length(const dt_dataset *ds) { return ds ? ds->vt->length(ds->self) : 0; }
const dt_dataset_info *dt_dataset_get_info(const dt_dataset *ds) { return ds ? &ds->info : NULL; }
int64_t dt_dataset_x_numel(const dt_dataset *ds)
{
    return ds ? shape_numel(ds->info.x_ndim, ds->info.x_shape) : 0;
}
int64_t dt_dataset_y_numel(const dt_dataset *ds)
{
    return ds ? shape_numel(ds->info.y_ndim, ds->info.y_shape) : 0;
}
size_t dt_dataset_x_bytes(const dt_dataset *ds) { return ds ? ds->x_bytes : 0; }
size_t dt_dataset_y_bytes(const dt_dataset *ds) { return ds ? ds->y_bytes : 0; }

dt_status dt_dataset_get_item(dt_dataset *ds, int64_t i, void *x, void *y)
{
    if (!ds || !x || !y)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_get_item: NULL argument");
    int64_t n = ds->vt->length(ds->self);
    if (i < 0 || i >= n)
        return dt_error(DT_ERR_RANGE, "dataset '%s': index %lld out of range [0, %lld)",
                        ds->vt->name ? ds->vt->name : "?", (long long)i, (long long)n);
    return ds->vt->get_item(ds->self, i, x, y);
}

dt_status dt_dataset_get_batch(dt_dataset *ds, const int64_t *idx, int64_t n, void *x, void *y)
{
    if (!ds || (n > 0 && (!idx || !x || !y)) || n < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_get_batch: bad arguments");
    int64_t len = ds->vt->length(ds->self);
    for (int64_t k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= len)
            return dt_error(DT_ERR_RANGE, "dataset '%s': index %lld out of range [0, %lld)",
                            ds->vt->name ? ds->vt->name : "?", (long long)idx[k], (long long)len);
    if (ds->vt->get_batch)
        return ds->vt->get_batch(ds->self, idx, n, x, y);
    for (int64_t k = 0; k < n; k++) {
        dt_status st = ds->vt->get_item(ds->self, idx[k], (char *)x + (size_t)k * ds->x_bytes,
                                        (char *)y + (size_t)k * ds->y_bytes);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* ---- subset ------------------------------------------------------------- */
typedef struct {
    dt_dataset *base;
    int64_t start, n;
    int64_t *scratch; /* shifted indices for get_batch */
    int64_t scratch_n;
} subset;

static int64_t subset_length(void *self) { return ((subset *)self)->n; }

static dt_status subset_get_item(void *self, int64_t i, void *x, void *y)
{
    subset *s = self;
    return dt_dataset_get_item(s->base, s->start + i, x, y);
}

static dt_status subset_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    subset *s = self;
    if (n > s->scratch_n) {
        int64_t *p = realloc(s->scratch, (size_t)n * sizeof *p);
        if (!p)
            return dt_error(DT_ERR_NO_MEMORY, "subset: out of memory");
        s->scratch = p;
        s->scratch_n = n;
    }
    for (int64_t k = 0; k < n; k++)
        s->scratch[k] = s->start + idx[k];
    return dt_dataset_get_batch(s->base, s->scratch, n, x, y);
}

static void subset_free(void *self)
{
    subset *s = self;
    free(s->scratch);
    free(s);
}

static const dt_dataset_vtable subset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "subset",
    .length = subset_length,
    .get_item = subset_get_item,
    .get_batch = subset_get_batch,
    .free = subset_free,
};

dt_status dt_dataset_subset_init(dt_dataset *base, int64_t start, int64_t n, dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_subset_init: out is NULL");
    *out = NULL;
    if (!base)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_subset_init: base is NULL");
    int64_t len = dt_dataset_length(base);
    if (start < 0 || n < 0 || start > len || n > len - start)
        return dt_error(DT_ERR_RANGE, "subset of %lld items from %lld outside the dataset's %lld items",
                        (long long)n, (long long)start, (long long)len); /* start + n may overflow */
    subset *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_dataset_subset_init: out of memory");
    s->base = base;
    s->start = start;
    s->n = n;
    dt_status st = dt_dataset_init(&subset_vt, s, &base->info, out);
    if (st < 0)
        subset_free(s);
    else
        dt_dataset_set_source(*out, base->source);
    return st;
}

/* ---- synthetic random classification set -------------------------------- */
/* x_i ~ N(0, 1)^F from Philox (key seed/DT_RNG_DATA, element i*F + j); the
 * label is argmax_c (W x_i)_c for a fixed W ~ N(0, 1/F) drawn from another
 * stream of the same seed. A linear model can learn it exactly, an MLP
 * quickly, so loss curves on it mean something. */
typedef struct {
    dt_random_dataset_params p;
    int64_t F; /* flattened input size */
    float *w;  /* (C, F) */
} randset;

dt_random_dataset_params dt_random_dataset_params_default(void)
{
    dt_random_dataset_params p = {
        .length = 6000, .x_ndim = 1, .x_shape = {784}, .num_classes = 10, .seed = 0};
    return p;
}

static int64_t randset_length(void *self) { return ((randset *)self)->p.length; }

static dt_status randset_get_item(void *self, int64_t i, void *x, void *y)
{
    randset *r = self;
    int64_t F = r->F, C = r->p.num_classes;
    float *xf = x;
    dt_rng_key k = dt_rng_key_make(r->p.seed, DT_RNG_DATA, 0, 0);
    dt_rng_fill_normal(k, (uint64_t)(i * F), xf, (size_t)F, 0.0f, 1.0f);
    int64_t best = 0;
    double bestv = -INFINITY;
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        const float *wc = r->w + c * F;
        for (int64_t j = 0; j < F; j++)
            s += (double)wc[j] * xf[j];
        if (s > bestv) {
            bestv = s;
            best = c;
        }
    }
    *(int64_t *)y = best;
    return DT_OK;
}

static void randset_free(void *self)
{
    randset *r = self;
    dt_free(r->w);
    free(r);
}

static const dt_dataset_vtable randset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "random",
    .length = randset_length,
    .get_item = randset_get_item,
    .get_batch = NULL,
    .free = randset_free,
};

dt_status dt_dataset_random_init(const dt_random_dataset_params *p, dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_random_init: out is NULL");
    *out = NULL;
    if (!p)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_random_init: params is NULL");
    int64_t F = 1;
    bool ok = p->length >= 0 && p->x_ndim >= 1 && p->x_ndim <= DT_DATA_MAX_DIMS &&
              p->num_classes >= 2 && p->num_classes <= (1 << 16);
    for (int d = 0; ok && d < p->x_ndim; d++) {
        ok = p->x_shape[d] >= 1 && p->x_shape[d] <= (1 << 24);
        F *= ok ? p->x_shape[d] : 1;
        ok = ok && F <= (1 << 24);
    }
    if (!ok)
        return dt_error(DT_ERR_INVALID_ARG,
                        "random dataset: need length >= 0, 1..%d input dims of at most 2^24 "
                        "elements in all, 2 <= num_classes <= 65536",
                        DT_DATA_MAX_DIMS);
    randset *r = calloc(1, sizeof *r);
    if (!r)
        return dt_error(DT_ERR_NO_MEMORY, "random dataset: out of memory");
    r->p = *p;
    r->F = F;
    r->w = dt_alloc((size_t)(F * p->num_classes) * sizeof(float));
    if (!r->w) {
        free(r);
        return DT_ERR_NO_MEMORY;
    }
    dt_rng_fill_normal(dt_rng_key_make(p->seed, DT_RNG_DATA, 1, 0), 0, r->w,
                       (size_t)(F * p->num_classes), 0.0f, (float)(1.0 / sqrt((double)F)));
    dt_dataset_info info = {.x_dtype = DT_F32,
                            .x_ndim = p->x_ndim,
                            .y_dtype = DT_I64,
                            .y_ndim = 0,
                            .num_classes = p->num_classes};
    for (int d = 0; d < p->x_ndim; d++)
        info.x_shape[d] = p->x_shape[d];
    dt_status st = dt_dataset_init(&randset_vt, r, &info, out);
    if (st < 0)
        randset_free(r);
    return st;
}
