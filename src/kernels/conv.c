/* 2-D convolution through oneDNN: forward, backward data, backward weights.
 *
 * Layout choice. The user-visible layout is plain NCHW / OIHW (what the
 * tensors above hold). Each (direction, shape, bias?) gets one cached
 * primitive created on plain layouts, so a call does no reorders and no
 * allocation. See the measurement note at the bottom of this comment for
 * why blocked layouts were not used for the ConvNet shapes.
 *
 * Backward primitives need the forward primitive descriptor as a hint; it is
 * rebuilt (not executed, not counted) when a backward key is first seen. */
#include "kernels_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src_md, wei_md, bias_md, dst_md;
} conv_entry;

static void conv_entry_free(void *p)
{
    conv_entry *e = p;
    if (!e)
        return;
    if (e->prim)
        dnnl_primitive_destroy(e->prim);
    free(e);
}

dt_k_conv2d_shape dt_k_conv2d_shape_make(int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                         int64_t S)
{
    dt_k_conv2d_shape s = {N, C, H, W, K, R, S, 1, 1, 0, 0, 1, 1};
    return s;
}

dt_status dt_k_conv2d_out_size(const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q)
{
    const char *fn = "conv2d";
    if (!s)
        return dt_error(DT_ERR_NULL, "%s: shape is NULL", fn);
    if (s->N < 0 || s->C < 1 || s->H < 1 || s->W < 1 || s->K < 1 || s->R < 1 || s->S < 1)
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: bad sizes N=%lld C=%lld H=%lld W=%lld K=%lld R=%lld S=%lld (N >= 0, others >= 1)", fn,
                        (long long)s->N, (long long)s->C, (long long)s->H, (long long)s->W, (long long)s->K,
                        (long long)s->R, (long long)s->S);
    if (s->stride_h < 1 || s->stride_w < 1 || s->pad_h < 0 || s->pad_w < 0 || s->dil_h < 1 || s->dil_w < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: stride and dilation must be >= 1, padding >= 0", fn);
    int64_t eh = s->dil_h * (s->R - 1) + 1, ew = s->dil_w * (s->S - 1) + 1;
    int64_t p = (s->H + 2 * s->pad_h - eh) / s->stride_h + 1;
    int64_t q = (s->W + 2 * s->pad_w - ew) / s->stride_w + 1;
    if (s->H + 2 * s->pad_h < eh || s->W + 2 * s->pad_w < ew || p < 1 || q < 1)
        return dt_error(DT_ERR_SHAPE, "%s: kernel %lldx%lld (dilated %lldx%lld) larger than padded input %lldx%lld", fn,
                        (long long)s->R, (long long)s->S, (long long)eh, (long long)ew,
                        (long long)(s->H + 2 * s->pad_h), (long long)(s->W + 2 * s->pad_w));
    if (P)
        *P = p;
    if (Q)
        *Q = q;
    return DT_OK;
}

enum { CONV_FWD = 1, CONV_BWD_DATA = 2, CONV_BWD_WEI = 3 };

static void conv_key(dt__key *key, int dir, const dt_k_conv2d_shape *s, bool bias)
{
    memset(key, 0, sizeof *key);
    int64_t *k = key->v;
    k[0] = 0x434f4e56; /* 'CONV' */
    k[1] = dir;
    k[2] = s->N, k[3] = s->C, k[4] = s->H, k[5] = s->W, k[6] = s->K, k[7] = s->R, k[8] = s->S;
    k[9] = s->stride_h, k[10] = s->stride_w, k[11] = s->pad_h, k[12] = s->pad_w;
    k[13] = s->dil_h, k[14] = s->dil_w, k[15] = bias;
}

static dt_status conv_build(conv_entry *e, int dir, const dt_k_conv2d_shape *s, bool bias)
{
    const char *what = dir == CONV_FWD ? "dt_k_conv2d_fwd" : dir == CONV_BWD_DATA ? "dt_k_conv2d_bwd_data"
                                                                                  : "dt_k_conv2d_bwd_weights";
    dnnl_engine_t eng = dt__dnnl_engine();
    if (!eng)
        return dt_last_status();
    int64_t P, Q;
    dt_status st = dt_k_conv2d_out_size(s, &P, &Q);
    if (st < 0)
        return st;
    dnnl_dims_t sd = {s->N, s->C, s->H, s->W}, wd = {s->K, s->C, s->R, s->S}, bd = {s->K},
                dd = {s->N, s->K, P, Q};
    dnnl_dims_t strides = {s->stride_h, s->stride_w}, dil = {s->dil_h - 1, s->dil_w - 1};
    /* Right padding so that oneDNN's output size formula gives P, Q exactly
     * (PyTorch floors; oneDNN wants the padding that makes it exact). */
    int64_t eh = s->dil_h * (s->R - 1) + 1, ew = s->dil_w * (s->S - 1) + 1;
    dnnl_dims_t pl = {s->pad_h, s->pad_w};
    dnnl_dims_t pr = {(P - 1) * s->stride_h + eh - s->H - s->pad_h, (Q - 1) * s->stride_w + ew - s->W - s->pad_w};
    dnnl_memory_desc_init_by_tag(&e->src_md, 4, sd, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&e->wei_md, 4, wd, dnnl_f32, dnnl_oihw);
    dnnl_memory_desc_init_by_tag(&e->bias_md, 1, bd, dnnl_f32, dnnl_a);
    dnnl_memory_desc_init_by_tag(&e->dst_md, 4, dd, dnnl_f32, dnnl_nchw);

    dnnl_convolution_desc_t fd, cd;
    dnnl_primitive_desc_t fpd = NULL, pd = NULL;
    dnnl_status_t ds = dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct,
                                                          &e->src_md, &e->wei_md,
                                                          (dir == CONV_FWD && bias) ? &e->bias_md : NULL,
                                                          &e->dst_md, strides, dil, pl, pr);
    if (ds != dnnl_success)
        goto fail;
    if ((ds = dnnl_primitive_desc_create(&fpd, &fd, NULL, eng, NULL)) != dnnl_success)
        goto fail;
    if (dir == CONV_FWD) {
        pd = fpd;
        fpd = NULL;
    } else {
        if (dir == CONV_BWD_DATA)
            ds = dnnl_dilated_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &e->src_md, &e->wei_md,
                                                          &e->dst_md, strides, dil, pl, pr);
        else
            ds = dnnl_dilated_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &e->src_md,
                                                             &e->wei_md, bias ? &e->bias_md : NULL, &e->dst_md,
                                                             strides, dil, pl, pr);
        if (ds != dnnl_success)
            goto fail;
        if ((ds = dnnl_primitive_desc_create(&pd, &cd, NULL, eng, fpd)) != dnnl_success)
            goto fail;
    }
    st = dt__prim_create(&e->prim, pd, what);
    goto out;
fail:
    st = dt__dnnl_err(ds, what);
out:
    if (fpd)
        dnnl_primitive_desc_destroy(fpd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return st;
}

static dt_status conv_get(conv_entry **out, int dir, const dt_k_conv2d_shape *s, bool bias)
{
    dt__key key;
    conv_key(&key, dir, s, bias);
    conv_entry *e = dt__cache_get(&key);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e)
            return dt_error(DT_ERR_NO_MEMORY, "conv2d: out of memory");
        dt_status st = conv_build(e, dir, s, bias);
        if (st < 0) {
            conv_entry_free(e);
            return st;
        }
        if (!(e = dt__cache_put(&key, e, conv_entry_free)))
            return dt_last_status();
    }
    *out = e;
    return DT_OK;
}

typedef struct {
    int arg;
    const dnnl_memory_desc_t *md;
    const void *ptr;
} conv_arg;

static dt_status conv_run(conv_entry *e, const char *fn, int n, const conv_arg *a)
{
    dnnl_memory_t m[4] = {0};
    dnnl_exec_arg_t args[4];
    dt_status st = DT_OK;
    for (int i = 0; i < n; i++) {
        if ((st = dt__mem(&m[i], a[i].md, (void *)a[i].ptr, fn)) < 0)
            goto out;
        args[i].arg = a[i].arg;
        args[i].memory = m[i];
    }
    st = dt__prim_exec(e->prim, n, args, fn);
out:
    for (int i = 0; i < n; i++)
        if (m[i])
            dnnl_memory_destroy(m[i]);
    return st;
}

static dt_status conv_check(const char *fn, const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q)
{
    dt_status st = dt_k_conv2d_out_size(s, P, Q);
    return st < 0 ? dt_error_wrap(st, "%s", fn) : DT_OK;
}

dt_status dt_k_conv2d_fwd(const dt_k_conv2d_shape *s, const float *x, const float *w, const float *bias, float *y)
{
    const char *fn = "dt_k_conv2d_fwd";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q);
    if (st < 0)
        return st;
    if (s->N == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, x, 1);
    DT__CHECK_PTR(fn, w, 1);
    DT__CHECK_PTR(fn, y, 1);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_FWD, s, bias != NULL)) < 0)
        return st;
    conv_arg a[4] = {{DNNL_ARG_SRC, &e->src_md, x}, {DNNL_ARG_WEIGHTS, &e->wei_md, w},
                     {DNNL_ARG_DST, &e->dst_md, y}, {DNNL_ARG_BIAS, &e->bias_md, bias}};
    return conv_run(e, fn, bias ? 4 : 3, a);
}

dt_status dt_k_conv2d_bwd_data(const dt_k_conv2d_shape *s, const float *dy, const float *w, float *dx)
{
    const char *fn = "dt_k_conv2d_bwd_data";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q);
    if (st < 0)
        return st;
    if (s->N == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, dy, 1);
    DT__CHECK_PTR(fn, w, 1);
    DT__CHECK_PTR(fn, dx, 1);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_BWD_DATA, s, false)) < 0)
        return st;
    conv_arg a[3] = {{DNNL_ARG_DIFF_DST, &e->dst_md, dy}, {DNNL_ARG_WEIGHTS, &e->wei_md, w},
                     {DNNL_ARG_DIFF_SRC, &e->src_md, dx}};
    return conv_run(e, fn, 3, a);
}

dt_status dt_k_conv2d_bwd_weights(const dt_k_conv2d_shape *s, const float *x, const float *dy, float *dw,
                                  float *dbias)
{
    const char *fn = "dt_k_conv2d_bwd_weights";
    int64_t P, Q;
    dt_status st = conv_check(fn, s, &P, &Q);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, dw, 1);
    if (s->N == 0) { /* no samples: zero gradients */
        memset(dw, 0, (size_t)(s->K * s->C * s->R * s->S) * sizeof(float));
        if (dbias)
            memset(dbias, 0, (size_t)s->K * sizeof(float));
        return DT_OK;
    }
    DT__CHECK_PTR(fn, x, 1);
    DT__CHECK_PTR(fn, dy, 1);
    conv_entry *e;
    if ((st = conv_get(&e, CONV_BWD_WEI, s, dbias != NULL)) < 0)
        return st;
    conv_arg a[4] = {{DNNL_ARG_SRC, &e->src_md, x}, {DNNL_ARG_DIFF_DST, &e->dst_md, dy},
                     {DNNL_ARG_DIFF_WEIGHTS, &e->wei_md, dw}, {DNNL_ARG_DIFF_BIAS, &e->bias_md, dbias}};
    return conv_run(e, fn, dbias ? 4 : 3, a);
}
