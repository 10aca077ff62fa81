/* conv2d (im2col + GEMM), max_pool2d, avg_pool2d — NCHW, f32.
 *
 * conv2d lowers each image to a [C*kh*kw, Ho*Wo] column matrix and does one
 * GEMM with the [O, C*kh*kw] weight. Backward rebuilds the columns instead
 * of keeping them (memory over time): gW += gout_n @ cols^T, and
 * gx += col2im(W^T @ gout_n). Max pooling saves the argmax of each output
 * (first maximum in window order, as PyTorch) for backward. */
#include "autograd/ag_impl.h"

#include <math.h>
#include <string.h>

typedef struct {
    int64_t N, C, H, W, O, kh, kw, Ho, Wo, stride, pad;
} conv_geom;

static void im2col(const float *x, const conv_geom *g, float *cols)
{
    int64_t HW = g->Ho * g->Wo;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                float *row = cols + ((c * g->kh + i) * g->kw + j) * HW;
                for (int64_t oy = 0; oy < g->Ho; oy++) {
                    int64_t iy = oy * g->stride - g->pad + i;
                    for (int64_t ox = 0; ox < g->Wo; ox++) {
                        int64_t ix = ox * g->stride - g->pad + j;
                        row[oy * g->Wo + ox] = (iy >= 0 && iy < g->H && ix >= 0 && ix < g->W)
                                                   ? x[(c * g->H + iy) * g->W + ix]
                                                   : 0.0f;
                    }
                }
            }
}

static void col2im_add(const float *cols, const conv_geom *g, float *gx)
{
    int64_t HW = g->Ho * g->Wo;
    for (int64_t c = 0; c < g->C; c++)
        for (int64_t i = 0; i < g->kh; i++)
            for (int64_t j = 0; j < g->kw; j++) {
                const float *row = cols + ((c * g->kh + i) * g->kw + j) * HW;
                for (int64_t oy = 0; oy < g->Ho; oy++) {
                    int64_t iy = oy * g->stride - g->pad + i;
                    if (iy < 0 || iy >= g->H)
                        continue;
                    for (int64_t ox = 0; ox < g->Wo; ox++) {
                        int64_t ix = ox * g->stride - g->pad + j;
                        if (ix >= 0 && ix < g->W)
                            gx[(c * g->H + iy) * g->W + ix] += row[oy * g->Wo + ox];
                    }
                }
            }
}

/* saved[0] = x data, saved[1] = w data, saved[2] = geometry */
static dt_status conv_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const float *x = n->saved[0], *w = n->saved[1];
    const conv_geom *g = n->saved[2];
    int64_t K = g->C * g->kh * g->kw, HW = g->Ho * g->Wo;
    float *gx = dt__rg(n->in[0]) ? dt__grad(ctx, n->in[0]) : NULL;
    float *gw = dt__rg(n->in[1]) ? dt__grad(ctx, n->in[1]) : NULL;
    float *gb = n->nin > 2 && dt__rg(n->in[2]) ? dt__grad(ctx, n->in[2]) : NULL;
    if ((dt__rg(n->in[0]) && !gx) || (dt__rg(n->in[1]) && !gw) ||
        (n->nin > 2 && dt__rg(n->in[2]) && !gb))
        return dt_last_status();
    float *cols = dt_arena_alloc(ctx->arena, (size_t)(K * HW) * sizeof(float));
    if (!cols)
        return dt_last_status();
    for (int64_t b = 0; b < g->N; b++) {
        const float *go = gout + b * g->O * HW;
        if (gw) {
            im2col(x + b * g->C * g->H * g->W, g, cols);
            dt__gemm(false, true, g->O, K, HW, 1.0f, go, HW, cols, HW, 1.0f, gw, K);
        }
        if (gx) {
            dt__gemm(true, false, K, HW, g->O, 1.0f, w, K, go, HW, 0.0f, cols, HW);
            col2im_add(cols, g, gx + b * g->C * g->H * g->W);
        }
        if (gb)
            for (int64_t o = 0; o < g->O; o++) {
                double s = 0.0;
                for (int64_t p = 0; p < HW; p++)
                    s += go[o * HW + p];
                gb[o] += (float)s;
            }
    }
    return DT_OK;
}

dt_tensor *dt_conv2d(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias, int stride,
                     int pad)
{
    const char *op = "dt_conv2d";
    DT__NEED_F32(ctx, op, x);
    DT__NEED_F32(ctx, op, w);
    if (bias && !dt__check_f32(op, "bias", bias))
        return NULL;
    if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1]) {
        dt__shape_error(op, "want x [N,C,H,W] and weight [O,C,kh,kw]", x, w);
        return NULL;
    }
    if (stride < 1 || pad < 0) {
        dt_error(DT_ERR_INVALID_ARG, "%s: stride %d must be >= 1 and pad %d >= 0", op, stride,
                 pad);
        return NULL;
    }
    conv_geom g = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2],
                   w->shape[3], 0, 0, stride, pad};
    if (g.H + 2 * pad < g.kh || g.W + 2 * pad < g.kw) {
        dt__shape_error(op, "kernel larger than the padded input", x, w);
        return NULL;
    }
    g.Ho = (g.H + 2 * pad - g.kh) / stride + 1;
    g.Wo = (g.W + 2 * pad - g.kw) / stride + 1;
    if (bias && (bias->ndim != 1 || bias->shape[0] != g.O)) {
        dt__shape_error(op, "weight [O,C,kh,kw] and bias [O] do not match", w, bias);
        return NULL;
    }
    const float *xd = dt__cdata(ctx, x), *wd = dt__cdata(ctx, w);
    const float *bd = bias ? dt__cdata(ctx, bias) : NULL;
    int64_t K = g.C * g.kh * g.kw, HW = g.Ho * g.Wo;
    dt_tensor *out = dt__out(ctx, 4, (const int64_t[]){g.N, g.O, g.Ho, g.Wo});
    float *cols = dt_arena_alloc(ctx->arena, (size_t)(K * HW) * sizeof(float));
    conv_geom *gs = dt_arena_alloc(ctx->arena, sizeof *gs);
    if (!xd || !wd || (bias && !bd) || !out || !cols || !gs)
        return NULL;
    *gs = g;
    float *y = out->data;
    for (int64_t b = 0; b < g.N; b++) {
        im2col(xd + b * g.C * g.H * g.W, &g, cols);
        float *yb = y + b * g.O * HW;
        dt__gemm(false, false, g.O, HW, K, 1.0f, wd, K, cols, HW, 0.0f, yb, HW);
        if (bd)
            for (int64_t o = 0; o < g.O; o++)
                for (int64_t p = 0; p < HW; p++)
                    yb[o * HW + p] += bd[o];
    }
    dt_tensor *in[3] = {x, w, bias};
    int nin = bias ? 3 : 2;
    if (dt__ag_wants(ctx, nin, in)) {
        dt__node *n = dt__ag_record(ctx, op, conv_backward, out, nin, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = (void *)(uintptr_t)wd;
        n->saved[2] = gs;
    }
    return out;
}

/* ---- pooling ------------------------------------------------------------------ */

/* i[0..7] = N,C,H,W,Ho,Wo,k,stride ; f[0] = pad ; saved[0] = argmax (max pool) */
static dt_status pool_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    float *gx = dt__grad(ctx, n->in[0]);
    if (!gx)
        return dt_last_status();
    int64_t NC = n->i[0] * n->i[1], H = n->i[2], W = n->i[3], Ho = n->i[4], Wo = n->i[5];
    int64_t k = n->i[6], s = n->i[7], pad = (int64_t)n->f[0];
    const int32_t *arg = n->saved[0];
    for (int64_t p = 0; p < NC; p++) {
        float *gxp = gx + p * H * W;
        const float *gp = gout + p * Ho * Wo;
        for (int64_t oy = 0; oy < Ho; oy++)
            for (int64_t ox = 0; ox < Wo; ox++) {
                float g = gp[oy * Wo + ox];
                if (arg) {
                    int32_t a = arg[(p * Ho + oy) * Wo + ox];
                    if (a >= 0)
                        gxp[a] += g;
                    continue;
                }
                float gk = g / (float)(k * k);
                for (int64_t i = 0; i < k; i++) {
                    int64_t iy = oy * s - pad + i;
                    if (iy < 0 || iy >= H)
                        continue;
                    for (int64_t j = 0; j < k; j++) {
                        int64_t ix = ox * s - pad + j;
                        if (ix >= 0 && ix < W)
                            gxp[iy * W + ix] += gk;
                    }
                }
            }
    }
    return DT_OK;
}

static dt_tensor *pool(dt_ctx *ctx, const char *op, dt_tensor *x, int k, int stride, int pad,
                       bool is_max)
{
    DT__NEED_F32(ctx, op, x);
    if (x->ndim != 4) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s: want x [N,C,H,W], got %s", op,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    if (stride == 0)
        stride = k;
    if (k < 1 || stride < 1 || pad < 0 || pad * 2 > k) {
        dt_error(DT_ERR_INVALID_ARG, "%s: kernel %d, stride %d, pad %d invalid (k >= 1, "
                 "stride >= 1, 0 <= pad <= k/2)", op, k, stride, pad);
        return NULL;
    }
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    if (H + 2 * pad < k || W + 2 * pad < k) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s: window %d larger than padded input %s", op, k,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t Ho = (H + 2 * pad - k) / stride + 1, Wo = (W + 2 * pad - k) / stride + 1;
    const float *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt__out(ctx, 4, (const int64_t[]){N, C, Ho, Wo});
    int32_t *arg = is_max ? dt_arena_alloc(ctx->arena, (size_t)(N * C * Ho * Wo) * 4) : NULL;
    if (!xd || !out || (is_max && !arg))
        return NULL;
    float *y = out->data;
    for (int64_t p = 0; p < N * C; p++) {
        const float *xp = xd + p * H * W;
        for (int64_t oy = 0; oy < Ho; oy++)
            for (int64_t ox = 0; ox < Wo; ox++) {
                float best = -INFINITY;
                int32_t bi = -1;
                double sum = 0.0;
                for (int64_t i = 0; i < k; i++) {
                    int64_t iy = oy * stride - pad + i;
                    if (iy < 0 || iy >= H)
                        continue;
                    for (int64_t j = 0; j < k; j++) {
                        int64_t ix = ox * stride - pad + j;
                        if (ix < 0 || ix >= W)
                            continue;
                        float v = xp[iy * W + ix];
                        sum += v;
                        if (v > best || bi < 0 || isnan(v)) {
                            if (!(bi >= 0 && isnan(best))) {
                                best = v;
                                bi = (int32_t)(iy * W + ix);
                            }
                        }
                    }
                }
                int64_t o = (p * Ho + oy) * Wo + ox;
                if (is_max) {
                    y[o] = best;
                    arg[o] = bi;
                } else {
                    y[o] = (float)(sum / (double)(k * k));
                }
            }
    }
    if (dt__ag_wants(ctx, 1, &x)) {
        dt__node *n = dt__ag_record(ctx, op, pool_backward, out, 1, &x);
        if (!n)
            return NULL;
        int64_t v[8] = {N, C, H, W, Ho, Wo, k, stride};
        memcpy(n->i, v, sizeof v);
        n->f[0] = pad;
        n->saved[0] = arg;
    }
    return out;
}

dt_tensor *dt_max_pool2d(dt_ctx *ctx, dt_tensor *x, int k, int stride, int pad)
{
    return pool(ctx, "dt_max_pool2d", x, k, stride, pad, true);
}

dt_tensor *dt_avg_pool2d(dt_ctx *ctx, dt_tensor *x, int k, int stride, int pad)
{
    return pool(ctx, "dt_avg_pool2d", x, k, stride, pad, false);
}
