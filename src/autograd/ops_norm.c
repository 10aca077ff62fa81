/* batch_norm and layer_norm on the kernels layer.
 *
 * Training batch norm and layer norm save (mean, invstd) per channel / row
 * and use the kernels' closed-form backward
 *     gx = invstd / M * (M * gxh - sum(gxh) - xhat * sum(gxh * xhat)),
 * gxh = g * gamma. In batch-norm evaluation the statistics are constants:
 * gx = g * gamma * invstd, computed here. The kernels' reductions that feed
 * parameter gradients have a fixed order (deterministic). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

/* Batch norm's gradients, as its backward made them, into the tape. */
static dt_status bn_commit(dt_ctx *ctx, dt_tensor *X, float *gx, dt_tensor *gamma, float *gg, dt_tensor *beta,
                           float *gb)
{
    dt_status st;
    if (gx && (st = dt__grad_commit(ctx, X, gx)) < 0)
        return st;
    if (dt__rg(gamma) && (st = dt__grad_commit(ctx, gamma, gg)) < 0)
        return st;
    if (dt__rg(beta) && (st = dt__grad_commit(ctx, beta, gb)) < 0)
        return st;
    return DT_OK;
}

/* i[0..4] = N, C, S, training, x's channel block (0 plain, 8, 16); saved: x, mean, invstd, gamma (contiguous) */
dt_status dt__bw_bn(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t N = n->i[0], C = n->i[1], S = n->i[2];
    bool training = n->i[3] != 0;
    const float *x = n->saved[0], *mean = n->saved[1], *invstd = n->saved[2], *gm = n->saved[3];
    dt_tensor *X = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gg = gamma ? dt_arena_alloc(ctx->arena, (size_t)C * 4) : NULL;
    float *gb = beta ? dt_arena_alloc(ctx->arena, (size_t)C * 4) : NULL;
    if ((dt__rg(X) && !gx) || (gamma && !gg) || (beta && !gb))
        return dt_last_status();
    dt_status st = DT_OK;
    if (training && n->i[4]) {
        st = dt_k_batchnorm_bwd_blocked(x, gout, N, C, S, (int)n->i[4], gm, mean, invstd, gx,
                                        dt__rg(gamma) ? gg : NULL, dt__rg(beta) ? gb : NULL);
    } else if (training) {
        st = dt_k_batchnorm_bwd(x, gout, N, C, S, gm, mean, invstd, gx, dt__rg(gamma) ? gg : NULL,
                                dt__rg(beta) ? gb : NULL);
    } else {
        for (int64_t c = 0; c < C; c++) {
            double sg = 0.0, sgx = 0.0;
            float k = (gm ? gm[c] : 1.0f) * invstd[c];
            for (int64_t b = 0; b < N; b++) {
                const float *g = gout + (b * C + c) * S, *xp = x + (b * C + c) * S;
                for (int64_t s = 0; s < S; s++) {
                    sg += g[s];
                    sgx += (double)g[s] * ((xp[s] - mean[c]) * invstd[c]);
                }
                if (gx) {
                    float *o = gx + (b * C + c) * S;
                    for (int64_t s = 0; s < S; s++)
                        o[s] = g[s] * k;
                }
            }
            if (gg)
                gg[c] = (float)sgx;
            if (gb)
                gb[c] = (float)sg;
        }
    }
    return st < 0 ? st : bn_commit(ctx, X, gx, gamma, gg, beta, gb);
}

static bool check_vec(const char *op, const char *arg, const dt_tensor *v, int64_t C,
                      const dt_tensor *x, bool need_contig)
{
    if (!v)
        return true;
    if (!dt__check_f32(op, arg, v))
        return false;
    if (v->ndim != 1 || v->shape[0] != C) {
        char s1[96], s2[96];
        dt_error(DT_ERR_SHAPE, "%s: %s is %s, want [%lld] for input %s", op, arg,
                 dt_tensor_shape_str(v, s1, sizeof s1), (long long)C,
                 dt_tensor_shape_str(x, s2, sizeof s2));
        return false;
    }
    if (need_contig && !dt_tensor_is_contiguous(v)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: %s must be contiguous (it is updated in place)", op,
                 arg);
        return false;
    }
    return true;
}

dt_tensor *dt_batch_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                         dt_tensor *running_mean, dt_tensor *running_var, bool training,
                         float momentum, float eps)
{
    const char *op = "dt_batch_norm";
    DT__NEED_ANY(ctx, op, x);
    /* bf16/f16 running statistics (FSDP's buffer_dtype): used and updated in
     * f32, the updated values rounded back (to nearest even) into the buffers */
    if ((running_mean && running_mean->dtype != DT_F32) || (running_var && running_var->dtype != DT_F32)) {
        dt_tensor *rs[2] = {running_mean, running_var}, *rf[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            dt_tensor *r = rs[k];
            if (!r)
                continue;
            if ((r->dtype != DT_F32 && r->dtype != DT_BF16 && r->dtype != DT_F16) || r->ndim != 1 ||
                !dt_tensor_is_contiguous(r)) {
                dt_error(DT_ERR_DTYPE, "%s: %s must be a contiguous [C] tensor of f32, bf16 or f16 (it is %s)", op,
                         k ? "running_var" : "running_mean", dt_dtype_name(r->dtype));
                return NULL;
            }
            if (!(rf[k] = dt__out(ctx, 1, r->shape)) ||
                dt_k_convert(r->data, r->dtype, rf[k]->data, DT_F32, r->shape[0]) < 0)
                return NULL;
        }
        dt_tensor *y = dt_batch_norm(ctx, x, gamma, beta, rf[0], rf[1], training, momentum, eps);
        for (int k = 0; y && training && k < 2; k++)
            if (rs[k] && dt_k_convert(rf[k]->data, DT_F32, rs[k]->data, rs[k]->dtype, rs[k]->shape[0]) < 0)
                return NULL;
        return y;
    }
    dt_tensor *lp[3] = {x, gamma, beta}; /* statistics in f32; the result in x's dtype */
    DT__LP_RUN(ctx, 3, lp, x->dtype,
               dt_batch_norm(ctx, lp[0], lp[1], lp[2], running_mean, running_var, training, momentum, eps));
    DT__NEED_F32_ANY(ctx, op, x);
    /* channel-blocked input: training runs on it directly; evaluation converts */
    if (!training && dt__blocked(x) && !(x = dt__plain(ctx, x)))
        return NULL;
    int blk = dt_tensor_block(x);
    if (x->ndim < 2) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s: want x [N,C,...], got %s", op,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t N = x->shape[0], C = x->shape[1], S = 1;
    for (int i = 2; i < x->ndim; i++)
        S *= x->shape[i];
    if (!check_vec(op, "gamma", gamma, C, x, false) || !check_vec(op, "beta", beta, C, x, false) ||
        !check_vec(op, "running_mean", running_mean, C, x, true) ||
        !check_vec(op, "running_var", running_var, C, x, true))
        return NULL;
    if ((running_mean == NULL) != (running_var == NULL)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: give both running_mean and running_var or neither", op);
        return NULL;
    }
    if (!training && !running_mean) {
        dt_error(DT_ERR_INVALID_ARG, "%s: evaluation mode needs running statistics", op);
        return NULL;
    }
    if (training && N * S <= 1) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s: training needs more than one value per channel, input %s",
                 op, dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    const float *xd = dt__cdata(ctx, x);
    const float *gm = gamma ? dt__cdata(ctx, gamma) : NULL;
    const float *bt = beta ? dt__cdata(ctx, beta) : NULL;
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    float *mean = dt_arena_alloc(ctx->arena, (size_t)C * 4);
    float *invstd = dt_arena_alloc(ctx->arena, (size_t)C * 4);
    if (!xd || (gamma && !gm) || (beta && !bt) || !out || !mean || !invstd)
        return NULL;
    dt_status st;
    if (blk) {
        out->flags |= dt__block_flag(blk);
        st = dt_k_batchnorm_train_fwd_blocked(xd, N, C, S, blk, gm, bt, eps, momentum,
                                              running_mean ? running_mean->data : NULL,
                                              running_var ? running_var->data : NULL, out->data, mean,
                                              invstd);
    } else if (training) {
        st = dt_k_batchnorm_train_fwd(xd, N, C, S, gm, bt, eps, momentum,
                                      running_mean ? running_mean->data : NULL,
                                      running_var ? running_var->data : NULL, out->data, mean,
                                      invstd);
    } else {
        const float *rm = running_mean->data, *rv = running_var->data;
        for (int64_t c = 0; c < C; c++) {
            mean[c] = rm[c];
            invstd[c] = (float)(1.0 / sqrt((double)rv[c] + (double)eps));
        }
        st = dt_k_batchnorm_eval_fwd(xd, N, C, S, gm, bt, rm, rv, eps, out->data);
    }
    if (st < 0) {
        dt_error_wrap(st, "%s", op);
        return NULL;
    }
    dt_tensor *in[3] = {x, gamma, beta};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_BATCH_NORM, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = N;
        n->i[1] = C;
        n->i[2] = S;
        n->i[3] = training;
        n->i[4] = blk;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = mean;
        n->saved[2] = invstd;
        n->saved[3] = (void *)(uintptr_t)gm;
    }
    return out;
}

/* ---- batch norm, ReLU and 2 x 2 max pooling in one node ----------------------- */

/* saved[3] of the fused node */
typedef struct {
    const float *gamma;
    const int32_t *argmax;
} bn_pool_saved;

/* i[0..4] = N, C, H, W, x's channel block; saved: x, mean, invstd, bn_pool_saved */
dt_status dt__bw_bn_pool(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const int64_t N = n->i[0], C = n->i[1], H = n->i[2], W = n->i[3];
    const bn_pool_saved *sv = n->saved[3];
    dt_tensor *X = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gg = dt_arena_alloc(ctx->arena, (size_t)C * 4), *gb = dt_arena_alloc(ctx->arena, (size_t)C * 4);
    if ((dt__rg(X) && !gx) || !gg || !gb)
        return dt_last_status();
    dt_status st = dt_k_bn_relu_maxpool2x2_bwd_blocked(n->saved[0], n->out->data, sv->argmax, gout, N, C, H, W,
                                                       (int)n->i[4], sv->gamma, n->saved[1], n->saved[2], gx,
                                                       dt__rg(gamma) ? gg : NULL, dt__rg(beta) ? gb : NULL);
    return st < 0 ? st : bn_commit(ctx, X, gx, gamma, gg, beta, gb);
}

/* a plain f32 [C] vector (gamma, beta, running statistics) */
static bool vec_c(const dt_tensor *v, int64_t C)
{
    return v && v->dtype == DT_F32 && v->ndim == 1 && v->shape[0] == C && !dt__blocked(v) &&
           dt_tensor_is_contiguous(v);
}

dt_tensor *dt_batch_norm_relu_max_pool2x2(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                          dt_tensor *running_mean, dt_tensor *running_var, bool training,
                                          float momentum, float eps)
{
    const int64_t C = x && x->ndim == 4 ? x->shape[1] : 0;
    const bool stats = running_mean ? vec_c(running_mean, C) && vec_c(running_var, C) : !running_var;
    if (!ctx || !x || !training || !dt__blocked(x) || x->dtype != DT_F32 || x->ndim != 4 || x->shape[0] < 1 ||
        x->shape[2] < 2 || x->shape[3] < 2 || !vec_c(gamma, C) || !vec_c(beta, C) || !stats) {
        /* anything else: the three ops (they say what is wrong, if anything) */
        dt_tensor *y = dt_batch_norm(ctx, x, gamma, beta, running_mean, running_var, training, momentum, eps);
        y = y ? dt_max_pool2d(ctx, y, 2, 2, 0) : NULL;
        return y ? dt_relu(ctx, y) : NULL;
    }
    const char *op = "dt_batch_norm_relu_max_pool2x2";
    const int64_t N = x->shape[0], H = x->shape[2], W = x->shape[3], P = H / 2, Q = W / 2;
    const int blk = dt_tensor_block(x);
    const float *xd = dt__cdata(ctx, x), *gm = dt__cdata(ctx, gamma), *bt = dt__cdata(ctx, beta);
    dt_tensor *out = dt__out(ctx, 4, (const int64_t[]){N, C, P, Q});
    float *mean = dt_arena_alloc(ctx->arena, (size_t)C * 4), *invstd = dt_arena_alloc(ctx->arena, (size_t)C * 4);
    int32_t *arg = dt_arena_alloc(ctx->arena, (size_t)(N * C * P * Q) * 4);
    bn_pool_saved *sv = dt_arena_alloc(ctx->arena, sizeof *sv);
    if (!xd || !gm || !bt || !out || !mean || !invstd || !arg || !sv)
        return NULL;
    out->flags |= dt__block_flag(blk);
    dt_status st = dt_k_bn_relu_maxpool2x2_fwd_blocked(xd, N, C, H, W, blk, gm, bt, eps, momentum,
                                                       running_mean ? running_mean->data : NULL,
                                                       running_var ? running_var->data : NULL, out->data, arg,
                                                       mean, invstd);
    if (st < 0) {
        dt_error_wrap(st, "%s", op);
        return NULL;
    }
    dt_tensor *in[3] = {x, gamma, beta};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_BN_RELU_POOL, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = N, n->i[1] = C, n->i[2] = H, n->i[3] = W, n->i[4] = blk;
        *sv = (bn_pool_saved){.gamma = gm, .argmax = arg};
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = mean;
        n->saved[2] = invstd;
        n->saved[3] = sv;
    }
    return out;
}

/* i[0] = R, i[1] = D, i[2] = x's dtype, i[3] = the result's; saved: x (its
 * dtype), mean, rstd, gamma (contiguous f32) */
dt_status dt__bw_ln(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t R = n->i[0], D = n->i[1];
    const dt_dtype xt = (dt_dtype)n->i[2], yt = (dt_dtype)n->i[3];
    dt_tensor *X = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    /* a rounded result's gradient as its producer wrote it in yt (beside the
     * f32 values or alone: glp_alone), the values the kernel would round to */
    const void *gys = dt__grad_out_lp(ctx, n, yt);
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gg = dt__rg(gamma) ? dt_arena_alloc(ctx->arena, (size_t)D * 4) : NULL;
    float *gb = dt__rg(beta) ? dt_arena_alloc(ctx->arena, (size_t)D * 4) : NULL;
    if ((dt__rg(X) && !gx) || (dt__rg(gamma) && !gg) || (dt__rg(beta) && !gb))
        return dt_last_status();
    dt_status st = dt_k_layernorm_bwd_lp(n->saved[0], xt, gys ? NULL : gout, gys, yt, R, D, n->saved[3], n->saved[1],
                                         n->saved[2], gx, gg, gb);
    /* a low-precision gamma/beta's gradient holds its dtype's values (its widening cast's backward) */
    if (st >= 0 && gg && dt__is_lp(gamma))
        st = dt__round_to(gamma->dtype, gg, gg, D);
    if (st >= 0 && gb && dt__is_lp(beta))
        st = dt__round_to(beta->dtype, gb, gb, D);
    if (st < 0)
        return st;
    if (gx && (st = dt__grad_commit(ctx, X, gx)) < 0)
        return st;
    if (gg && (st = dt__grad_commit(ctx, gamma, gg)) < 0)
        return st;
    if (gb && (st = dt__grad_commit(ctx, beta, gb)) < 0)
        return st;
    return DT_OK;
}

/* gamma/beta that the one-node path takes: none, or a plain [D]-shaped
 * float vector (a low-precision one is widened: D values) */
static bool ln_vec_direct(const dt_tensor *v)
{
    return !v || (dt_dtype_is_float(v->dtype) && !dt__blocked(v));
}

/* Layer norm of x (f32, bf16 or f16; plain layout) with the result in yt:
 * statistics and normalisation in f32, the result rounded once (one node,
 * one kernel pass; dt_k_layernorm_fwd_lp). */
static dt_tensor *ln_direct(dt_ctx *ctx, const char *op, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps,
                            dt_dtype yt)
{
    if (x->ndim < 1) {
        dt_error(DT_ERR_SHAPE, "%s: input needs at least one dim", op);
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1], R = D ? dt_tensor_numel(x) / D : 0;
    for (int k = 0; k < 2; k++) {
        const dt_tensor *v = k ? beta : gamma;
        if (v && (v->ndim != 1 || v->shape[0] != D)) {
            char s1[96], s2[96];
            dt_error(DT_ERR_SHAPE, "%s: %s is %s, want [%lld] for input %s", op, k ? "beta" : "gamma",
                     dt_tensor_shape_str(v, s1, sizeof s1), (long long)D, dt_tensor_shape_str(x, s2, sizeof s2));
            return NULL;
        }
    }
    const void *xd = dt__cdata(ctx, x);
    const float *gm = gamma ? dt__cdata_f32(ctx, gamma) : NULL;
    const float *bt = beta ? dt__cdata_f32(ctx, beta) : NULL;
    dt_tensor *out = yt == DT_F32 ? dt__out(ctx, x->ndim, x->shape) : dt_tensor_empty(ctx, yt, x->ndim, x->shape);
    float *mean = dt_arena_alloc(ctx->arena, (size_t)(R ? R : 1) * 4);
    float *rstd = dt_arena_alloc(ctx->arena, (size_t)(R ? R : 1) * 4);
    if (!xd || (gamma && !gm) || (beta && !bt) || !out || !mean || !rstd)
        return NULL;
    if (dt_k_layernorm_fwd_lp(xd, x->dtype, R, D, gm, bt, eps, out->data, yt, mean, rstd) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    dt_tensor *in[3] = {x, gamma, beta};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_LAYER_NORM, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = R;
        n->i[1] = D;
        n->i[2] = x->dtype;
        n->i[3] = yt;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = mean;
        n->saved[2] = rstd;
        n->saved[3] = (void *)(uintptr_t)gm;
        /* a result rounded to yt: the backward rounds its gradient to yt
         * first, so takes a producer's shadow instead, alone */
        n->glp_want = n->glp_alone = yt != DT_F32;
        n->glp_dtype = yt;
    }
    return out;
}

dt_tensor *dt_layer_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps)
{
    const char *op = "dt_layer_norm";
    DT__NEED(ctx, op, x);
    /* a bf16/f16 x with float gamma/beta: one kernel reads x and writes the
     * result in its dtype, the numbers of the common rule's casts */
    if (dt__is_lp(x) && ln_vec_direct(gamma) && ln_vec_direct(beta))
        return ln_direct(ctx, op, x, gamma, beta, eps, x->dtype);
    dt_tensor *lp[3] = {x, gamma, beta}; /* statistics in f32; the result in x's dtype */
    DT__LP_RUN(ctx, 3, lp, x->dtype, dt_layer_norm(ctx, lp[0], lp[1], lp[2], eps));
    DT__NEED_F32(ctx, op, x);
    if (x->ndim < 1) {
        dt_error(DT_ERR_SHAPE, "%s: input needs at least one dim", op);
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1];
    if (!check_vec(op, "gamma", gamma, D, x, false) || !check_vec(op, "beta", beta, D, x, false))
        return NULL;
    return ln_direct(ctx, op, x, gamma, beta, eps, DT_F32);
}

dt_tensor *dt_layer_norm_to(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps, dt_dtype dtype)
{
    const char *op = "dt_layer_norm_to";
    DT__NEED(ctx, op, x);
    if (!dt_dtype_is_float(dtype)) {
        dt_error(DT_ERR_DTYPE, "%s: result dtype %s (want f32, bf16 or f16)", op, dt_dtype_name(dtype));
        return NULL;
    }
    if (x->dtype == DT_F32 && dtype != DT_F32 && ln_vec_direct(gamma) && ln_vec_direct(beta))
        return ln_direct(ctx, op, x, gamma, beta, eps, dtype);
    dt_tensor *y = dt_layer_norm(ctx, x, gamma, beta, eps);
    return y && y->dtype != dtype ? dt_cast(ctx, y, dtype) : y;
}
