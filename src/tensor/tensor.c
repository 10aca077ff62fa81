/* Tensors: shape helpers, persistent tensors, element access and copies.
 *
 * Strides are in elements. Element access goes through a generic N-d loop
 * (dt__nd_loop) that walks the innermost dimension with a stride and the
 * outer ones with an index counter; it is sequential so that anything that
 * reduces through it is deterministic. */
#include "tensor/tensor_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t dt_tensor_numel(const dt_tensor *t)
{
    if (!t)
        return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

bool dt_tensor_is_contiguous(const dt_tensor *t)
{
    if (!t)
        return false;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

bool dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b)
{
    if (!a || !b || a->ndim != b->ndim || a->dtype != b->dtype)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t n)
{
    if (!t && buf && n)
        snprintf(buf, n, "NULL");
    return t ? dt_shape_str(t->ndim, t->shape, buf, n) : buf;
}

size_t dt_tensor_nbytes(const dt_tensor *t)
{
    return t ? (size_t)dt_tensor_numel(t) * dt_dtype_size(t->dtype) : 0;
}

dt_status dt_tensor_init_contiguous(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape,
                                    void *data)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "tensor init: tensor is NULL");
    if ((unsigned)dtype >= DT_DTYPE_COUNT)
        return dt_error(DT_ERR_DTYPE, "tensor init: invalid dtype %d", (int)dtype);
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "tensor init: ndim %d not in [0, %d]", ndim,
                        DT_MAX_DIMS);
    if (ndim > 0 && !shape)
        return dt_error(DT_ERR_NULL, "tensor init: shape is NULL");
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < DT_MAX_DIMS; i++) {
        t->shape[i] = 1;
        t->strides[i] = 1;
    }
    /* nz: the product of the non-zero sizes, so that a zero anywhere does not hide an overflow of the
     * others (dt_tensor_numel multiplies them in order: [2^62, 4, 0] overflowed there) */
    int64_t s = 1, nz = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0)
            return dt_error(DT_ERR_INVALID_ARG, "tensor init: dim %d has negative size %lld", i,
                            (long long)shape[i]);
        t->shape[i] = shape[i];
        t->strides[i] = s;
        if (shape[i] > 0 && nz > INT64_MAX / shape[i])
            return dt_error(DT_ERR_RANGE, "tensor init: shape overflows int64");
        if (shape[i] > 0)
            nz *= shape[i];
        s *= shape[i];
    }
    if (s > INT64_MAX / 8)
        return dt_error(DT_ERR_RANGE, "tensor init: %lld elements is too large",
                        (long long)s);
    t->data = data;
    return DT_OK;
}

/* ---- persistent -------------------------------------------------------- */

dt_tensor *dt_tensor_new(dt_dtype dtype, int ndim, const int64_t *shape)
{
    dt_tensor *t = malloc(sizeof *t);
    if (!t) {
        dt_error(DT_ERR_NO_MEMORY, "dt_tensor_new: out of memory");
        return NULL;
    }
    if (dt_tensor_init_contiguous(t, dtype, ndim, shape, NULL) < 0) {
        free(t);
        return NULL;
    }
    t->data = dt_calloc(dt_tensor_nbytes(t));
    if (!t->data) {
        free(t);
        return NULL;
    }
    t->flags = DT_TENSOR_OWNS_DATA;
    return t;
}

dt_tensor *dt_tensor_wrap(void *data, dt_dtype dtype, int ndim, const int64_t *shape)
{
    dt_tensor *t = malloc(sizeof *t);
    if (!t) {
        dt_error(DT_ERR_NO_MEMORY, "dt_tensor_wrap: out of memory");
        return NULL;
    }
    if (dt_tensor_init_contiguous(t, dtype, ndim, shape, data) < 0) {
        free(t);
        return NULL;
    }
    if (!data && dt_tensor_numel(t) > 0) {
        dt_error(DT_ERR_NULL, "dt_tensor_wrap: data is NULL for %lld elements",
                 (long long)dt_tensor_numel(t));
        free(t);
        return NULL;
    }
    return t;
}

void dt_tensor_free(dt_tensor *t)
{
    if (!t || (t->flags & DT_TENSOR_TEMP))
        return;
    if (t->flags & DT_TENSOR_OWNS_GRAD)
        dt_tensor_free(t->grad);
    if (t->flags & DT_TENSOR_OWNS_DATA)
        dt_free(t->data);
    free(t);
}

dt_status dt_tensor_rebind(dt_tensor *t, void *data)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_rebind: tensor is NULL");
    if (!data && dt_tensor_numel(t) > 0)
        return dt_error(DT_ERR_NULL, "dt_tensor_rebind: data is NULL");
    if (t->flags & DT_TENSOR_OWNS_DATA) {
        dt_free(t->data);
        t->flags &= ~(uint32_t)DT_TENSOR_OWNS_DATA;
    }
    t->data = data;
    return DT_OK;
}

dt_status dt_tensor_set_requires_grad(dt_tensor *t, bool on)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_set_requires_grad: tensor is NULL");
    if (on && t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
        return dt_error(DT_ERR_DTYPE, "dt_tensor_set_requires_grad: only f32, bf16 and f16 "
                                      "tensors can require grad, got %s",
                        dt_dtype_name(t->dtype));
    if (on)
        t->flags |= DT_TENSOR_REQUIRES_GRAD;
    else
        t->flags &= ~(uint32_t)DT_TENSOR_REQUIRES_GRAD;
    return DT_OK;
}

dt_status dt_tensor_set_grad(dt_tensor *t, dt_tensor *grad)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_set_grad: tensor is NULL");
    if (grad) {
        char s1[96], s2[96];
        bool lp = t->dtype == DT_BF16 || t->dtype == DT_F16;
        if ((t->dtype != DT_F32 && !lp) || (grad->dtype != DT_F32 && grad->dtype != t->dtype) ||
            (lp && (t->flags & DT_TENSOR_TEMP) && grad->dtype != DT_F32))
            return dt_error(DT_ERR_DTYPE, "dt_tensor_set_grad: tensor %s and grad %s: want an f32 "
                            "grad, or a grad of the tensor's own dtype for a persistent bf16/f16 "
                            "tensor", dt_dtype_name(t->dtype), dt_dtype_name(grad->dtype));
        if (t->ndim != grad->ndim || memcmp(t->shape, grad->shape, sizeof(int64_t) * (size_t)t->ndim))
            return dt_error(DT_ERR_SHAPE, "dt_tensor_set_grad: tensor %s, grad %s",
                            dt_tensor_shape_str(t, s1, sizeof s1),
                            dt_tensor_shape_str(grad, s2, sizeof s2));
        if (!dt_tensor_is_contiguous(grad))
            return dt_error(DT_ERR_INVALID_ARG, "dt_tensor_set_grad: grad must be contiguous");
    }
    if ((t->flags & DT_TENSOR_OWNS_GRAD) && t->grad != grad)
        dt_tensor_free(t->grad);
    t->flags &= ~(uint32_t)(DT_TENSOR_OWNS_GRAD | DT_TENSOR_GRAD_OWN); /* backward gives back none of it */
    t->grad = grad;
    if (grad)
        t->flags |= DT_TENSOR_REQUIRES_GRAD;
    return DT_OK;
}

/* ---- the N-d loop -------------------------------------------------------- */

void dt__nd_loop(int ndim, const int64_t *shape, int nops, char *const *ptr,
                 const int64_t (*strides)[DT_MAX_DIMS], const size_t *esize, dt__row_fn fn,
                 void *ud)
{
    char *p[3] = {NULL, NULL, NULL};
    int64_t s[3] = {0, 0, 0};
    for (int k = 0; k < nops; k++)
        p[k] = ptr[k];
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return;
    if (ndim == 0) {
        fn(1, p[0], 0, p[1], 0, p[2], 0, ud);
        return;
    }
    int inner = ndim - 1;
    for (int k = 0; k < nops; k++)
        s[k] = strides[k][inner];
    int64_t idx[DT_MAX_DIMS] = {0};
    for (;;) {
        fn(shape[inner], p[0], s[0], p[1], s[1], p[2], s[2], ud);
        int d = inner - 1;
        for (; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < nops; k++)
                p[k] += strides[k][d] * (int64_t)esize[k];
            if (idx[d] < shape[d])
                break;
            for (int k = 0; k < nops; k++)
                p[k] -= strides[k][d] * shape[d] * (int64_t)esize[k];
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* ---- element access ---------------------------------------------------------- */

typedef struct { size_t es; dt_dtype dt; double v; } fill_ud;

static void row_fill(int64_t n, char *p0, int64_t s0, char *p1, int64_t s1, char *p2, int64_t s2,
                     void *ud)
{
    (void)p1; (void)s1; (void)p2; (void)s2;
    fill_ud *f = ud;
    if (f->v == 0.0 && s0 == 1) {
        memset(p0, 0, (size_t)n * f->es);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dt_dtype_store(f->dt, p0 + i * s0 * (int64_t)f->es, 0, f->v);
}

dt_status dt_tensor_fill(dt_tensor *t, double v)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_fill: tensor is NULL");
    fill_ud f = {dt_dtype_size(t->dtype), t->dtype, v};
    char *p = t->data;
    dt__nd_loop(t->ndim, t->shape, 1, &p, (const int64_t(*)[DT_MAX_DIMS])t->strides, &f.es,
                row_fill, &f);
    return DT_OK;
}

dt_status dt_tensor_zero(dt_tensor *t) { return dt_tensor_fill(t, 0.0); }

static void row_copy(int64_t n, char *p0, int64_t s0, char *p1, int64_t s1, char *p2, int64_t s2,
                     void *ud)
{
    (void)p2; (void)s2;
    size_t es = *(size_t *)ud;
    if (s0 == 1 && s1 == 1) {
        memcpy(p0, p1, (size_t)n * es);
        return;
    }
    if (es == 4) {
        for (int64_t i = 0; i < n; i++)
            memcpy(p0 + i * s0 * 4, p1 + i * s1 * 4, 4);
    } else {
        for (int64_t i = 0; i < n; i++)
            memcpy(p0 + i * s0 * (int64_t)es, p1 + i * s1 * (int64_t)es, es);
    }
}

/* Copy with explicit layouts (used by copy/read/write). */
static void copy_strided(int ndim, const int64_t *shape, void *dst, const int64_t *dst_strides,
                         const void *src, const int64_t *src_strides, size_t es)
{
    int64_t st[2][DT_MAX_DIMS];
    memcpy(st[0], dst_strides, sizeof st[0]);
    memcpy(st[1], src_strides, sizeof st[1]);
    char *p[2] = {dst, (char *)(uintptr_t)src};
    size_t esz[2] = {es, es};
    dt__nd_loop(ndim, shape, 2, p, (const int64_t(*)[DT_MAX_DIMS])st, esz, row_copy, &es);
}

static char *elem_ptr(const dt_tensor *t, int64_t flat);

/* Element-by-element copy in logical order when either side is channel-blocked. */
static void copy_blocked(dt_tensor *dst, const dt_tensor *src, void *dbuf, const void *sbuf)
{
    size_t es = dt_dtype_size(dst ? dst->dtype : src->dtype);
    int64_t n = dt_tensor_numel(dst ? dst : src);
    for (int64_t i = 0; i < n; i++) {
        char *d = dst ? elem_ptr(dst, i) : (char *)dbuf + i * (int64_t)es;
        const char *s = src ? elem_ptr(src, i) : (const char *)sbuf + i * (int64_t)es;
        memcpy(d, s, es);
    }
}

static void contiguous_strides(const dt_tensor *t, int64_t *st)
{
    int64_t s = 1;
    for (int i = DT_MAX_DIMS - 1; i >= 0; i--)
        st[i] = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        st[i] = s;
        s *= t->shape[i];
    }
}

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src)
{
    if (!dst || !src)
        return dt_error(DT_ERR_NULL, "dt_tensor_copy: %s is NULL", dst ? "src" : "dst");
    if (!dt_tensor_same_shape(dst, src)) {
        char s1[96], s2[96];
        return dt_error(DT_ERR_SHAPE, "dt_tensor_copy: dst %s %s, src %s %s",
                        dt_dtype_name(dst->dtype), dt_tensor_shape_str(dst, s1, sizeof s1),
                        dt_dtype_name(src->dtype), dt_tensor_shape_str(src, s2, sizeof s2));
    }
    if ((dst->flags | src->flags) & DT_TENSOR_BLOCKED) {
        copy_blocked(dst, src, NULL, NULL);
        return DT_OK;
    }
    copy_strided(dst->ndim, dst->shape, dst->data, dst->strides, src->data, src->strides,
                 dt_dtype_size(dst->dtype));
    return DT_OK;
}

dt_status dt_tensor_read(const dt_tensor *t, void *dst)
{
    if (!t || !dst)
        return dt_error(DT_ERR_NULL, "dt_tensor_read: %s is NULL", t ? "dst" : "tensor");
    if (t->flags & DT_TENSOR_BLOCKED) {
        copy_blocked(NULL, t, dst, NULL);
        return DT_OK;
    }
    int64_t st[DT_MAX_DIMS];
    contiguous_strides(t, st);
    copy_strided(t->ndim, t->shape, dst, st, t->data, t->strides, dt_dtype_size(t->dtype));
    return DT_OK;
}

dt_status dt_tensor_write(dt_tensor *t, const void *src)
{
    if (!t || !src)
        return dt_error(DT_ERR_NULL, "dt_tensor_write: %s is NULL", t ? "src" : "tensor");
    if (t->flags & DT_TENSOR_BLOCKED) {
        copy_blocked(t, NULL, NULL, src);
        return DT_OK;
    }
    int64_t st[DT_MAX_DIMS];
    contiguous_strides(t, st);
    copy_strided(t->ndim, t->shape, t->data, t->strides, src, st, dt_dtype_size(t->dtype));
    return DT_OK;
}

static char *elem_ptr(const dt_tensor *t, int64_t flat)
{
    int64_t off = 0;
    int B = dt_tensor_block(t);
    if (B) { /* nChw8c / nChw16c: see tensor.h */
        int64_t C = t->shape[1], H = t->shape[2], W = t->shape[3];
        int64_t w = flat % W, h = flat / W % H, c = flat / (W * H) % C, n = flat / (W * H * C);
        off = ((n * (C / B) + c / B) * H * W + h * W + w) * B + c % B;
        return (char *)t->data + off * (int64_t)dt_dtype_size(t->dtype);
    }
    for (int d = t->ndim - 1; d >= 0; d--) {
        int64_t i = flat % t->shape[d];
        flat /= t->shape[d];
        off += i * t->strides[d];
    }
    return (char *)t->data + off * (int64_t)dt_dtype_size(t->dtype);
}

double dt_tensor_get(const dt_tensor *t, int64_t i)
{
    if (!t) {
        dt_error(DT_ERR_NULL, "dt_tensor_get: tensor is NULL");
        return NAN;
    }
    if (i < 0 || i >= dt_tensor_numel(t)) {
        dt_error(DT_ERR_RANGE, "dt_tensor_get: index %lld out of [0, %lld)", (long long)i,
                 (long long)dt_tensor_numel(t));
        return NAN;
    }
    return dt_dtype_load(t->dtype, elem_ptr(t, i), 0);
}

dt_status dt_tensor_set(dt_tensor *t, int64_t i, double v)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_set: tensor is NULL");
    if (i < 0 || i >= dt_tensor_numel(t))
        return dt_error(DT_ERR_RANGE, "dt_tensor_set: index %lld out of [0, %lld)",
                        (long long)i, (long long)dt_tensor_numel(t));
    dt_dtype_store(t->dtype, elem_ptr(t, i), 0, v);
    return DT_OK;
}

float dt_tensor_item(const dt_tensor *t)
{
    if (!t) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_tensor_item: tensor is NULL");
        return NAN;
    }
    if (dt_tensor_numel(t) != 1) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "dt_tensor_item: tensor %s has %lld elements, want 1",
                 dt_tensor_shape_str(t, s, sizeof s), (long long)dt_tensor_numel(t));
        return NAN;
    }
    return (float)dt_dtype_load(t->dtype, t->data, 0);
}

static dt_status rand_fill(dt_tensor *t, dt_rng_key key, float a, float b, bool normal)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_tensor_rand: tensor is NULL");
    if (t->dtype != DT_F32)
        return dt_error(DT_ERR_DTYPE, "dt_tensor_rand: tensor is %s, want f32",
                        dt_dtype_name(t->dtype));
    /* torch's uniform_ and normal_ refuse these too; filled, they gave values outside [lo, hi) or NaN */
    if (!normal && !(isfinite(a) && isfinite(b) && a <= b))
        return dt_error(DT_ERR_INVALID_ARG, "dt_tensor_rand_uniform: range [%g, %g) (want finite lo <= hi)",
                        (double)a, (double)b);
    if (normal && !(isfinite(a) && isfinite(b) && b >= 0))
        return dt_error(DT_ERR_INVALID_ARG, "dt_tensor_rand_normal: mean %g, std %g (want finite, std >= 0)",
                        (double)a, (double)b);
    int64_t n = dt_tensor_numel(t);
    if (dt_tensor_is_contiguous(t)) {
        if (normal)
            dt_rng_fill_normal(key, 0, t->data, (size_t)n, a, b);
        else
            dt_rng_fill_uniform(key, 0, t->data, (size_t)n, a, b);
        return DT_OK;
    }
    float *tmp = dt_alloc((size_t)n * sizeof(float));
    if (!tmp)
        return DT_ERR_NO_MEMORY;
    if (normal)
        dt_rng_fill_normal(key, 0, tmp, (size_t)n, a, b);
    else
        dt_rng_fill_uniform(key, 0, tmp, (size_t)n, a, b);
    dt_status st = dt_tensor_write(t, tmp);
    dt_free(tmp);
    return st;
}

dt_status dt_tensor_rand_uniform(dt_tensor *t, dt_rng_key key, float lo, float hi)
{
    return rand_fill(t, key, lo, hi, false);
}

dt_status dt_tensor_rand_normal(dt_tensor *t, dt_rng_key key, float mean, float std)
{
    return rand_fill(t, key, mean, std, true);
}
