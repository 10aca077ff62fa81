/* Differentiable views: reshape, transpose, permute, narrow, flatten,
 * contiguous, detach.
 *
 * A view shares its input's data. Its backward needs to know where each
 * output element sits inside the input; since gradients are always
 * contiguous, the node saves the view's geometry in the coordinates of the
 * input's CONTIGUOUS layout (offset + strides), and backward scatters
 * gout into the input's gradient through those strides. */
#include "autograd/ag_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    int64_t offset;
    int64_t strides[DT_MAX_DIMS];
} view_geom;

static void row_acc(int64_t n, char *p0, int64_t s0, char *p1, int64_t s1, char *p2, int64_t s2,
                    void *ud)
{
    (void)p2; (void)s2; (void)ud;
    float *d = (float *)p0;
    const float *s = (const float *)p1;
    if (s0 == 1 && s1 == 1) {
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            d[i * s0] += s[i * s1];
    }
}

/* Whether the view maps element k of its output to element k of its
 * input, for every k (a reshape of a contiguous tensor, a flatten). */
static bool plain_view(const dt__node *n, const view_geom *g)
{
    if (g->offset != 0 || dt_tensor_numel(n->out) != dt_tensor_numel(n->in[0]))
        return false;
    int64_t cs[DT_MAX_DIMS];
    dt__contig_strides(n->out->ndim, n->out->shape, cs);
    for (int i = 0; i < n->out->ndim; i++)
        if (n->out->shape[i] != 1 && g->strides[i] != cs[i])
            return false;
    return true;
}

/* Whether some element of g[0..n) is -0 or a signalling NaN: the values
 * that 0 + g would change (to +0, to the quiet NaN). */
static bool any_neg0_or_snan(const float *g, int64_t n)
{
    const uint32_t *w = (const uint32_t *)(const void *)g;
    enum { BLK = 4096 };
    for (int64_t lo = 0; lo < n; lo += BLK) {
        const int64_t hi = n - lo < BLK ? n : lo + BLK;
        uint32_t bad = 0;
#pragma omp simd reduction(| : bad)
        for (int64_t i = lo; i < hi; i++) {
            const uint32_t u = w[i];
            bad |= (uint32_t)(u == 0x80000000u) |
                   ((uint32_t)((u & 0x7fc00000u) == 0x7f800000u) & (uint32_t)((u & 0x003fffffu) != 0));
        }
        if (bad)
            return true;
    }
    return false;
}

dt_status dt__bw_view(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const view_geom *g = n->saved[0];
    dt_tensor *x = n->in[0];
    if (!x->grad && (x->flags & DT_TENSOR_TEMP) && !(x->flags & DT_TENSOR_BLOCKED) && plain_view(n, g)) {
        /* the input's first gradient, element for element the view's: one
         * pass writing 0 + gout (the zero-filled buffer's sum, -0 made +0)
         * instead of a zero fill and an add, and the view's low-precision
         * shadow (e.g. a loss's on reshaped bf16 logits) passes to the
         * input, for the GEMM that produced it, unless gout held a -0 (its
         * shadow's -0 would no longer be the gradient's value) */
        const dt_dtype lt = n->out->glp_dtype_;
        const void *sh = n->out->glp_ ? dt__grad_shadow(ctx, n->out, lt) : NULL;
        const int64_t m = dt_tensor_numel(x);
        if (n->out->grad && n->out->grad->data == gout && !any_neg0_or_snan(gout, m)) {
            /* 0 + gout is gout, bit for bit: the input's gradient is the
             * view's own buffer (the context's; final, and read by nothing
             * after this node), no copy (a ~100M Llama's logits: 32 MiB
             * read and written per step) */
            dt_tensor *ga = dt_tensor_view_of(ctx, (void *)(uintptr_t)gout, DT_F32, x->ndim, x->shape);
            if (!ga)
                return dt_last_status();
            x->glp_ = NULL;
            x->grad = ga;
            if (sh)
                dt__grad_shadow_set(ctx, x, gout, (void *)(uintptr_t)sh, lt);
            dt__grad_hand_over(n->out, x);
            ctx->ag_stats.view_grads_shared++;
            return DT_OK;
        }
        float *gx = dt__grad_begin(ctx, x);
        if (!gx)
            return dt_last_status();
        enum { BLK = 16384 };
        const int64_t nb = (m + BLK - 1) / BLK;
        int neg0 = 0;
#pragma omp parallel for schedule(static) if (nb > 16) reduction(| : neg0)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t lo = b * BLK, hi = lo + BLK < m ? lo + BLK : m;
            for (int64_t i = lo; i < hi; i++) {
                uint32_t u;
                memcpy(&u, gout + i, sizeof u);
                neg0 |= u == 0x80000000u;
                gx[i] = 0.0f + gout[i];
            }
        }
        dt_status st = dt__grad_commit(ctx, x, gx);
        if (st >= 0 && sh && !neg0) {
            dt__grad_shadow_set(ctx, x, gx, (void *)(uintptr_t)sh, lt);
            dt__grad_hand_over(n->out, x);
        }
        return st;
    }
    float *gin = dt__grad(ctx, x);
    if (!gin)
        return dt_last_status();
    int64_t st[2][DT_MAX_DIMS];
    memcpy(st[0], g->strides, sizeof st[0]);
    dt__contig_strides(n->out->ndim, n->out->shape, st[1]);
    char *p[2] = {(char *)(gin + g->offset), (char *)(uintptr_t)gout};
    size_t es[2] = {4, 4};
    dt__nd_loop(n->out->ndim, n->out->shape, 2, p, (const int64_t(*)[DT_MAX_DIMS])st, es, row_acc,
                NULL);
    return DT_OK;
}

/* Make a view struct of x with the given shape/strides/data and record the
 * node if needed (geometry in x's contiguous coordinates). */
static dt_tensor *make_view(dt_ctx *ctx, dt_op kind, dt_tensor *x, int ndim,
                            const int64_t *shape, const int64_t *strides, int64_t elem_offset,
                            const int64_t *cstrides, int64_t coffset)
{
    dt_tensor *v = dt__tensor_struct(ctx);
    if (!v)
        return NULL;
    v->dtype = x->dtype;
    v->ndim = ndim;
    for (int i = 0; i < DT_MAX_DIMS; i++) {
        v->shape[i] = i < ndim ? shape[i] : 1;
        v->strides[i] = i < ndim ? strides[i] : 1;
    }
    v->data = (char *)x->data + elem_offset * (int64_t)dt_dtype_size(x->dtype);
    v->name = x->name;
    if (dt__ag_wants(ctx, 1, &x)) {
        view_geom *g = dt_arena_alloc(ctx->arena, sizeof *g);
        if (!g)
            return NULL;
        g->offset = coffset;
        for (int i = 0; i < DT_MAX_DIMS; i++)
            g->strides[i] = i < ndim ? cstrides[i] : 1;
        dt__node *n = dt__ag_record(ctx, kind, v, 1, &x);
        if (!n)
            return NULL;
        n->saved[0] = g;
    }
    return v;
}

static int norm_dim(int d, int ndim) { return d < 0 ? d + ndim : d; }

dt_status dt__bw_contiguous(dt_ctx *ctx, dt__node *n, const float *gout)
{
    float *gin = dt__grad(ctx, n->in[0]);
    if (!gin)
        return dt_last_status();
    int64_t m = dt_tensor_numel(n->out);
    for (int64_t i = 0; i < m; i++)
        gin[i] += gout[i];
    return DT_OK;
}

dt_tensor *dt_contiguous(dt_ctx *ctx, dt_tensor *x)
{
    const char *op = "dt_contiguous";
    DT__NEED(ctx, op, x);
    if (dt_tensor_is_contiguous(x))
        return x;
    dt_tensor *y = dt_tensor_clone(ctx, x);
    if (!y)
        return NULL;
    if (dt__ag_wants(ctx, 1, &x) && !dt__ag_record(ctx, DT_OP_CONTIGUOUS, y, 1, &x))
        return NULL;
    return y;
}

dt_tensor *dt_detach(dt_ctx *ctx, dt_tensor *x)
{
    DT__NEED(ctx, "dt_detach", x);
    return dt_tensor_alias(ctx, x);
}

dt_tensor *dt_reshape(dt_ctx *ctx, dt_tensor *x, int ndim, const int64_t *shape)
{
    const char *op = "dt_reshape";
    DT__NEED(ctx, op, x);
    if (ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: ndim %d not in [0, %d]", op, ndim, DT_MAX_DIMS);
        return NULL;
    }
    int64_t sh[DT_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        sh[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0) {
                dt_error(DT_ERR_INVALID_ARG, "%s: more than one -1 in the new shape", op);
                return NULL;
            }
            infer = i;
        } else if (shape[i] < 0) {
            dt_error(DT_ERR_INVALID_ARG, "%s: negative size %lld in the new shape", op,
                     (long long)shape[i]);
            return NULL;
        } else {
            known *= shape[i];
        }
    }
    int64_t numel = dt_tensor_numel(x);
    if (infer >= 0)
        sh[infer] = known ? numel / known : 0;
    int64_t total = 1;
    for (int i = 0; i < ndim; i++)
        total *= sh[i];
    if (total != numel) {
        char s1[128], s2[128] = "[";
        size_t k = 1;
        for (int i = 0; i < ndim && k < sizeof s2; i++)
            k += (size_t)snprintf(s2 + k, sizeof s2 - k, "%s%lld", i ? "," : "",
                                  (long long)shape[i]);
        if (k < sizeof s2 - 1)
            strcat(s2, "]");
        dt_error(DT_ERR_SHAPE, "%s: cannot reshape %s (%lld elements) to %s", op,
                 dt_tensor_shape_str(x, s1, sizeof s1), (long long)numel, s2);
        return NULL;
    }
    dt_tensor *c = dt_contiguous(ctx, x);
    if (!c)
        return NULL;
    int64_t st[DT_MAX_DIMS];
    dt__contig_strides(ndim, sh, st);
    return make_view(ctx, DT_OP_RESHAPE, c, ndim, sh, st, 0, st, 0);
}

dt_tensor *dt_permute(dt_ctx *ctx, dt_tensor *x, const int *perm)
{
    const char *op = "dt_permute";
    DT__NEED(ctx, op, x);
    if (!perm && x->ndim > 0) {
        dt_error(DT_ERR_NULL, "%s: perm is NULL", op);
        return NULL;
    }
    int seen[DT_MAX_DIMS] = {0};
    int64_t sh[DT_MAX_DIMS], st[DT_MAX_DIMS], cst[DT_MAX_DIMS], xc[DT_MAX_DIMS];
    dt__contig_strides(x->ndim, x->shape, xc);
    for (int i = 0; i < x->ndim; i++) {
        int p = norm_dim(perm[i], x->ndim);
        if (p < 0 || p >= x->ndim || seen[p]) {
            char s[96];
            dt_error(DT_ERR_INVALID_ARG, "%s: perm[%d] = %d is not a permutation of the dims of %s",
                     op, i, perm[i], dt_tensor_shape_str(x, s, sizeof s));
            return NULL;
        }
        seen[p] = 1;
        sh[i] = x->shape[p];
        st[i] = x->strides[p];
        cst[i] = xc[p];
    }
    return make_view(ctx, DT_OP_PERMUTE, x, x->ndim, sh, st, 0, cst, 0);
}

dt_tensor *dt_transpose(dt_ctx *ctx, dt_tensor *x, int d0, int d1)
{
    const char *op = "dt_transpose";
    DT__NEED(ctx, op, x);
    int a = norm_dim(d0, x->ndim), b = norm_dim(d1, x->ndim);
    if (a < 0 || a >= x->ndim || b < 0 || b >= x->ndim) {
        char s[96];
        dt_error(DT_ERR_INVALID_ARG, "%s: dims %d, %d out of range for %s", op, d0, d1,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int perm[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        perm[i] = i;
    perm[a] = b;
    perm[b] = a;
    return dt_permute(ctx, x, perm);
}

dt_tensor *dt_narrow(dt_ctx *ctx, dt_tensor *x, int dim, int64_t start, int64_t length)
{
    const char *op = "dt_narrow";
    DT__NEED(ctx, op, x);
    int d = norm_dim(dim, x->ndim);
    char s[96];
    if (d < 0 || d >= x->ndim) {
        dt_error(DT_ERR_INVALID_ARG, "%s: dim %d out of range for %s", op, dim,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    /* length > size - start, not start + length > size: the sum overflowed for a start or length near
     * INT64_MAX and the view was made (a [2^63 - 1]-row view of 4 rows) */
    if (start < 0 || length < 0 || start > x->shape[d] || length > x->shape[d] - start) {
        dt_error(DT_ERR_RANGE, "%s: %lld from %lld out of range for dim %d of %s", op, (long long)length,
                 (long long)start, d, dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t sh[DT_MAX_DIMS], xc[DT_MAX_DIMS];
    memcpy(sh, x->shape, sizeof sh);
    sh[d] = length;
    dt__contig_strides(x->ndim, x->shape, xc);
    return make_view(ctx, DT_OP_NARROW, x, x->ndim, sh, x->strides, start * x->strides[d], xc,
                     start * xc[d]);
}

dt_tensor *dt_flatten(dt_ctx *ctx, dt_tensor *x, int start_dim, int end_dim)
{
    const char *op = "dt_flatten";
    DT__NEED(ctx, op, x);
    if (x->ndim == 0)
        return dt_reshape(ctx, x, 1, (const int64_t[]){1});
    int a = norm_dim(start_dim, x->ndim), b = norm_dim(end_dim, x->ndim);
    if (a < 0 || a >= x->ndim || b < 0 || b >= x->ndim || a > b) {
        char s[96];
        dt_error(DT_ERR_INVALID_ARG, "%s: dims %d..%d invalid for %s", op, start_dim, end_dim,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t sh[DT_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < a; i++)
        sh[k++] = x->shape[i];
    int64_t m = 1;
    for (int i = a; i <= b; i++)
        m *= x->shape[i];
    sh[k++] = m;
    for (int i = b + 1; i < x->ndim; i++)
        sh[k++] = x->shape[i];
    return dt_reshape(ctx, x, k, sh);
}
