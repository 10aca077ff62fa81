/* conv2d, max_pool2d, avg_pool2d — NCHW, on the kernels layer
 * (oneDNN convolution with cached primitives; plain C pooling).
 *
 * Low precision (precision.h): conv2d with x, w (and bias) all bf16 runs
 * oneDNN's bf16 convolution where the CPU has one (dt_k_conv2d_native:
 * AVX-512): products accumulate in f32, the bf16 output is rounded once,
 * the bias is read as f32. Backward rounds the incoming gradient to bf16
 * (the gradient of a bf16 tensor is bf16, as PyTorch's) and writes f32
 * gradients (a bf16 leaf's contributions are summed in f32 and rounded
 * once, grad.c). Elsewhere (AVX2, fp16, mixed dtypes) the operands are
 * widened to f32 exactly and the result rounded once: the same values up
 * to the f32 summation order.
 *
 * The kernels overwrite their outputs while gradients accumulate, so each
 * backward writes into dt__grad_begin's buffer (the gradient itself when it
 * is the first contribution to a temporary, scratch otherwise) and commits.
 * Max pooling saves the argmax of each output for backward. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <string.h>

/* saved[0] = x data, saved[1] = w data (both of dtype i[1]), saved[2] =
 * kernel shape; i[0] = the kernels' layout bits (x and/or out stored
 * nChw8c / nChw16c), i[1] = the operands' dtype (f32, or bf16 native) */
dt_status dt__bw_conv(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const void *x = n->saved[0], *w = n->saved[1];
    const dt_k_conv2d_shape *s = n->saved[2];
    dt_tensor *X = n->in[0], *Wt = n->in[1], *B = n->nin > 2 ? n->in[2] : NULL;
    unsigned lay = (unsigned)n->i[0];
    dt_dtype t = (dt_dtype)n->i[1];
    const void *g = gout;
    if (t != DT_F32) { /* the gradient rounded to the operands' dtype */
        int64_t m = dt_tensor_numel(n->out);
        void *gl = dt_arena_alloc(ctx->arena, (size_t)m * dt_dtype_size(t) + 2);
        if (!gl || dt_k_convert(gout, DT_F32, gl, t, m) < 0)
            return dt_last_status();
        g = gl;
    }
    dt_status st = DT_OK;
    if (dt__rg(X)) {
        float *gx = dt__grad_begin(ctx, X);
        if (!gx)
            return dt_last_status();
        st = dt_k_conv2d_bwd_data_t(s, g, w, gx, t, lay);
        if (st < 0 || (st = dt__grad_commit(ctx, X, gx)) < 0)
            return st;
    }
    if (dt__rg(Wt) || dt__rg(B)) {
        float *gw = dt_arena_alloc(ctx->arena, (size_t)dt_tensor_numel(Wt) * sizeof(float));
        float *gb = B ? dt_arena_alloc(ctx->arena, (size_t)dt_tensor_numel(B) * sizeof(float)) : NULL;
        if (!gw || (B && !gb))
            return dt_last_status();
        st = dt_k_conv2d_bwd_weights_t(s, x, g, gw, gb, t, lay);
        if (st < 0)
            return st;
        if (dt__rg(Wt) && (st = dt__grad_commit(ctx, Wt, gw)) < 0)
            return st;
        if (dt__rg(B) && (st = dt__grad_commit(ctx, B, gb)) < 0)
            return st;
    }
    return DT_OK;
}

dt_tensor *dt_conv2d(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias, int stride,
                     int pad)
{
    const char *op = "dt_conv2d";
    DT__NEED_ANY(ctx, op, x);
    DT__NEED(ctx, op, w);
    dt_tensor *lp[3] = {x, w, bias};
    if (!dt__autocast(ctx, DT_OP_CONV2D, 3, lp))
        return NULL;
    x = lp[0], w = lp[1], bias = lp[2];
    /* all operands bf16 and a bf16 convolution here: native; else widened */
    dt_dtype t = dt__lp_result(3, lp);
    if (t == DT_F32 || !dt_k_conv2d_native(t)) {
        DT__LP_RUN(ctx, 3, lp, t, dt_conv2d(ctx, lp[0], lp[1], lp[2], stride, pad));
        t = DT_F32;
        DT__NEED_F32_ANY(ctx, op, x);
        DT__NEED_F32(ctx, op, w);
        if (bias && !dt__check_f32(op, "bias", bias))
            return NULL;
    }
    if (x->ndim != 4 || w->ndim != 4 || x->shape[1] != w->shape[1]) {
        dt__shape_error(op, "want x [N,C,H,W] and weight [O,C,kh,kw]", x, w);
        return NULL;
    }
    if (stride < 1 || pad < 0) {
        dt_error(DT_ERR_INVALID_ARG, "%s: stride %d must be >= 1 and pad %d >= 0", op, stride,
                 pad);
        return NULL;
    }
    dt_k_conv2d_shape s = dt_k_conv2d_shape_make(x->shape[0], x->shape[1], x->shape[2],
                                                 x->shape[3], w->shape[0], w->shape[2],
                                                 w->shape[3]);
    s.stride_h = s.stride_w = stride;
    s.pad_h = s.pad_w = pad;
    if (s.H + 2 * pad < s.R || s.W + 2 * pad < s.S) {
        dt__shape_error(op, "kernel larger than the padded input", x, w);
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != s.K)) {
        dt__shape_error(op, "weight [O,C,kh,kw] and bias [O] do not match", w, bias);
        return NULL;
    }
    int64_t P, Q;
    if (dt_k_conv2d_out_size(&s, &P, &Q) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    /* blocked in (an earlier conv's activation) and/or out (when this
     * context allows it and the channels fit the block oneDNN prefers,
     * dt_k_act_block): no reorders around oneDNN */
    int xb = dt_tensor_block(x), ob = ctx->blocked_ok && s.N > 0 ? dt_k_act_block() : 0;
    if (ob && s.K % ob)
        ob = 0;
    bool out_b = ob != 0;
    unsigned lay = (xb == 8 ? DT_K_SRC_BLOCKED8 : xb == 16 ? DT_K_SRC_BLOCKED16 : 0u) |
                   (ob == 8 ? DT_K_DST_BLOCKED8 : ob == 16 ? DT_K_DST_BLOCKED16 : 0u);
    const float *xd = dt__cdata(ctx, x), *wd = dt__cdata(ctx, w); /* of dtype t */
    const float *bd = bias ? dt__cdata_f32(ctx, bias) : NULL;
    dt_tensor *out = dt_tensor_empty(ctx, t, 4, (const int64_t[]){s.N, s.K, P, Q});
    dt_k_conv2d_shape *ss = dt_arena_alloc(ctx->arena, sizeof *ss);
    if (!xd || !wd || (bias && !bd) || !out || !ss)
        return NULL;
    *ss = s;
    if (out_b)
        out->flags |= dt__block_flag(ob);
    if (dt_k_conv2d_fwd_t(&s, xd, wd, bd, out->data, t, t, lay) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    dt_tensor *in[3] = {x, w, bias};
    int nin = bias ? 3 : 2;
    if (dt__ag_wants(ctx, nin, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_CONV2D, out, nin, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = (void *)(uintptr_t)wd;
        n->saved[2] = ss;
        n->i[0] = lay;
        n->i[1] = t;
    }
    return out;
}

/* ---- pooling ------------------------------------------------------------------ */

/* saved[0] = pool shape, saved[1] = argmax (max pool) or NULL (avg pool) */
dt_status dt__bw_pool(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const dt_k_pool2d_shape *s = n->saved[0];
    const int32_t *arg = n->saved[1];
    float *gx = dt__grad_begin(ctx, n->in[0]);
    if (!gx)
        return dt_last_status();
    /* a bf16/f16 max pool (pool's lp path): the gradient rounded to the
     * dtype first and gx after, as the casts' backwards round them; without
     * overlapping windows every gx element is 0 or one rounded gradient
     * element, which the second rounding leaves as it is */
    dt_dtype lp = n->out->dtype;
    if (lp != DT_F32) {
        int64_t m = dt_tensor_numel(n->out);
        float *g = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(float));
        if (!g)
            return dt_last_status();
        dt_status st = dt__round_to(lp, gout, g, m);
        if (st < 0)
            return st;
        gout = g;
    }
    dt_status st = arg && dt__blocked(n->in[0]) ? dt_k_maxpool2d_bwd_blocked(s, dt_tensor_block(n->in[0]), gout, arg, gx)
                   : arg ? dt_k_maxpool2d_bwd(s, gout, arg, gx)
                       : dt_k_avgpool2d_bwd(s, gout, gx, true);
    if (st >= 0 && lp != DT_F32 && (s->sh < s->kh || s->sw < s->kw))
        st = dt__round_to(lp, gx, gx, dt_tensor_numel(n->in[0]));
    if (st < 0)
        return st;
    return dt__grad_commit(ctx, n->in[0], gx);
}

static dt_tensor *pool(dt_ctx *ctx, const char *op, dt_tensor *x, int k, int stride, int pad,
                       bool is_max)
{
    DT__NEED_ANY(ctx, op, x);
    /* max pooling of a bf16/f16 x: read widened (exact), pool in f32 and
     * round the result once, as DT__LP_RUN would, but with no cast passes
     * over the whole gradient in the backward (dt__bw_pool) */
    dt_dtype lpt = is_max && dt__is_lp(x) ? x->dtype : DT_F32;
    if (lpt == DT_F32) {
        dt_tensor *lp[1] = {x};
        DT__LP_RUN(ctx, 1, lp, x->dtype, pool(ctx, op, lp[0], k, stride, pad, is_max));
        DT__NEED_F32_ANY(ctx, op, x);
    }
    if (!is_max && dt__blocked(x) && !(x = dt__plain(ctx, x)))
        return NULL; /* average pooling reads plain NCHW only */
    if (x->ndim != 4) {
        char b[96];
        dt_error(DT_ERR_SHAPE, "%s: want x [N,C,H,W], got %s", op,
                 dt_tensor_shape_str(x, b, sizeof b));
        return NULL;
    }
    if (stride == 0)
        stride = k;
    if (k < 1 || stride < 1 || pad < 0 || pad * 2 > k) {
        dt_error(DT_ERR_INVALID_ARG, "%s: kernel %d, stride %d, pad %d invalid (k >= 1, "
                 "stride >= 1, 0 <= pad <= k/2)", op, k, stride, pad);
        return NULL;
    }
    dt_k_pool2d_shape s = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], k, k,
                           stride, stride, pad, pad};
    if (s.H + 2 * pad < k || s.W + 2 * pad < k) {
        char b[96];
        dt_error(DT_ERR_SHAPE, "%s: window %d larger than padded input %s", op, k,
                 dt_tensor_shape_str(x, b, sizeof b));
        return NULL;
    }
    int64_t P, Q;
    if (dt_k_pool2d_out_size(&s, &P, &Q) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    const float *xd = lpt != DT_F32 ? dt__cdata_f32(ctx, x) : dt__cdata(ctx, x);
    dt_tensor *out = lpt != DT_F32 ? dt_tensor_empty(ctx, lpt, 4, (const int64_t[]){s.N, s.C, P, Q})
                                   : dt__out(ctx, 4, (const int64_t[]){s.N, s.C, P, Q});
    float *yd = lpt != DT_F32 && out ? dt_arena_alloc(ctx->arena, (size_t)(s.N * s.C * P * Q) * 4)
                                     : out ? out->data : NULL;
    int32_t *arg = is_max ? dt_arena_alloc(ctx->arena, (size_t)(s.N * s.C * P * Q) * 4) : NULL;
    dt_k_pool2d_shape *ss = dt_arena_alloc(ctx->arena, sizeof *ss);
    if (!xd || !out || !yd || (is_max && !arg) || !ss)
        return NULL;
    *ss = s;
    int blk = dt_tensor_block(x);
    out->flags |= dt__block_flag(blk);
    dt_status st = blk      ? dt_k_maxpool2d_fwd_blocked(&s, blk, xd, yd, arg)
                   : is_max ? dt_k_maxpool2d_fwd(&s, xd, yd, arg)
                          : dt_k_avgpool2d_fwd(&s, xd, yd, true);
    if (st >= 0 && yd != out->data)
        st = dt_k_convert(yd, DT_F32, out->data, lpt, dt_tensor_numel(out));
    if (st < 0) {
        dt_error_wrap(st, "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &x)) {
        dt__node *n = dt__ag_record(ctx, is_max ? DT_OP_MAX_POOL2D : DT_OP_AVG_POOL2D, out, 1, &x);
        if (!n)
            return NULL;
        n->saved[0] = ss;
        n->saved[1] = arg;
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
