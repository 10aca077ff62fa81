/* batch_norm and layer_norm.
 *
 * Both normalise to xhat = (x - mean) * invstd and keep xhat and invstd for
 * backward, which is the standard closed form
 *     gx = invstd / M * (M * gxh - sum(gxh) - xhat * sum(gxh * xhat)),
 * gxh = g * gamma, sums over the M elements that shared a mean (batch norm
 * in training; layer norm always). In batch-norm eval the statistics are
 * constants and gx = g * gamma * invstd. Statistics accumulate in double in
 * a fixed order. */
#include "autograd/ag_impl.h"

#include <math.h>
#include <string.h>

/* i[0] = N, i[1] = C, i[2] = S (spatial), i[3] = training; saved: xhat, invstd */
static dt_status bn_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t N = n->i[0], C = n->i[1], S = n->i[2];
    bool training = n->i[3] != 0;
    const float *xhat = n->saved[0], *invstd = n->saved[1];
    dt_tensor *gamma = n->in[1], *beta = n->in[2];
    const float *gm = gamma ? gamma->data : NULL;
    float *gx = dt__rg(n->in[0]) ? dt__grad(ctx, n->in[0]) : NULL;
    float *gg = dt__rg(gamma) ? dt__grad(ctx, gamma) : NULL;
    float *gb = dt__rg(beta) ? dt__grad(ctx, beta) : NULL;
    if ((dt__rg(n->in[0]) && !gx) || (dt__rg(gamma) && !gg) || (dt__rg(beta) && !gb))
        return dt_last_status();
    double M = (double)(N * S);
    for (int64_t c = 0; c < C; c++) {
        double sg = 0.0, sgx = 0.0;
        for (int64_t b = 0; b < N; b++) {
            const float *g = gout + (b * C + c) * S, *xh = xhat + (b * C + c) * S;
            for (int64_t s = 0; s < S; s++) {
                sg += g[s];
                sgx += (double)g[s] * xh[s];
            }
        }
        if (gg)
            gg[c] += (float)sgx;
        if (gb)
            gb[c] += (float)sg;
        if (!gx)
            continue;
        float gam = gm ? gm[c * gamma->strides[0]] : 1.0f;
        float is = invstd[c];
        for (int64_t b = 0; b < N; b++) {
            const float *g = gout + (b * C + c) * S, *xh = xhat + (b * C + c) * S;
            float *o = gx + (b * C + c) * S;
            if (training) {
                float k = (float)(is / M), a = (float)sg, bb = (float)sgx;
                for (int64_t s = 0; s < S; s++)
                    o[s] += gam * k * ((float)M * g[s] - a - xh[s] * bb);
            } else {
                for (int64_t s = 0; s < S; s++)
                    o[s] += g[s] * gam * is;
            }
        }
    }
    return DT_OK;
}

static bool check_vec(const char *op, const char *arg, const dt_tensor *v, int64_t C,
                      const dt_tensor *x)
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
    return true;
}

static float vec_at(const dt_tensor *v, int64_t i, float dflt)
{
    return v ? ((const float *)v->data)[i * v->strides[0]] : dflt;
}

dt_tensor *dt_batch_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                         dt_tensor *running_mean, dt_tensor *running_var, bool training,
                         float momentum, float eps)
{
    const char *op = "dt_batch_norm";
    DT__NEED_F32(ctx, op, x);
    if (x->ndim < 2) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s: want x [N,C,...], got %s", op,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t N = x->shape[0], C = x->shape[1], S = 1;
    for (int i = 2; i < x->ndim; i++)
        S *= x->shape[i];
    if (!check_vec(op, "gamma", gamma, C, x) || !check_vec(op, "beta", beta, C, x) ||
        !check_vec(op, "running_mean", running_mean, C, x) ||
        !check_vec(op, "running_var", running_var, C, x))
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
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    float *xhat = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(x));
    float *invstd = dt_arena_alloc(ctx->arena, (size_t)C * sizeof(float));
    if (!xd || !out || !xhat || !invstd)
        return NULL;
    float *y = out->data;
    double M = (double)(N * S);
    for (int64_t c = 0; c < C; c++) {
        double mean, var;
        if (training) {
            double s = 0.0, s2 = 0.0;
            for (int64_t b = 0; b < N; b++) {
                const float *xp = xd + (b * C + c) * S;
                for (int64_t i = 0; i < S; i++)
                    s += xp[i];
            }
            mean = s / M;
            for (int64_t b = 0; b < N; b++) {
                const float *xp = xd + (b * C + c) * S;
                for (int64_t i = 0; i < S; i++) {
                    double d = xp[i] - mean;
                    s2 += d * d;
                }
            }
            var = s2 / M;
            if (running_mean) {
                float *rm = (float *)running_mean->data + c * running_mean->strides[0];
                float *rv = (float *)running_var->data + c * running_var->strides[0];
                *rm = (float)((1.0 - momentum) * *rm + momentum * mean);
                *rv = (float)((1.0 - momentum) * *rv + momentum * (s2 / (M - 1.0)));
            }
        } else {
            mean = vec_at(running_mean, c, 0.0f);
            var = vec_at(running_var, c, 1.0f);
        }
        float is = (float)(1.0 / sqrt(var + (double)eps));
        float m = (float)mean;
        invstd[c] = is;
        float gm = vec_at(gamma, c, 1.0f), bt = vec_at(beta, c, 0.0f);
        for (int64_t b = 0; b < N; b++) {
            const float *xp = xd + (b * C + c) * S;
            float *xh = xhat + (b * C + c) * S, *yp = y + (b * C + c) * S;
            for (int64_t i = 0; i < S; i++) {
                xh[i] = (xp[i] - m) * is;
                yp[i] = xh[i] * gm + bt;
            }
        }
    }
    dt_tensor *in[3] = {x, gamma, beta};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, op, bn_backward, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = N;
        n->i[1] = C;
        n->i[2] = S;
        n->i[3] = training;
        n->saved[0] = xhat;
        n->saved[1] = invstd;
    }
    return out;
}

/* i[0] = R, i[1] = D; saved: xhat [R, D], invstd [R] */
static dt_status ln_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t R = n->i[0], D = n->i[1];
    const float *xhat = n->saved[0], *invstd = n->saved[1];
    dt_tensor *gamma = n->in[1], *beta = n->in[2];
    float *gx = dt__rg(n->in[0]) ? dt__grad(ctx, n->in[0]) : NULL;
    float *gg = dt__rg(gamma) ? dt__grad(ctx, gamma) : NULL;
    float *gb = dt__rg(beta) ? dt__grad(ctx, beta) : NULL;
    if ((dt__rg(n->in[0]) && !gx) || (dt__rg(gamma) && !gg) || (dt__rg(beta) && !gb))
        return dt_last_status();
    for (int64_t r = 0; r < R; r++) {
        const float *g = gout + r * D, *xh = xhat + r * D;
        if (gg)
            for (int64_t d = 0; d < D; d++)
                gg[d] += g[d] * xh[d];
        if (gb)
            for (int64_t d = 0; d < D; d++)
                gb[d] += g[d];
        if (!gx)
            continue;
        double a = 0.0, b = 0.0;
        for (int64_t d = 0; d < D; d++) {
            double gh = (double)g[d] * vec_at(gamma, d, 1.0f);
            a += gh;
            b += gh * xh[d];
        }
        float k = invstd[r] / (float)D;
        float *o = gx + r * D;
        for (int64_t d = 0; d < D; d++) {
            float gh = g[d] * vec_at(gamma, d, 1.0f);
            o[d] += k * ((float)D * gh - (float)a - xh[d] * (float)b);
        }
    }
    return DT_OK;
}

dt_tensor *dt_layer_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta, float eps)
{
    const char *op = "dt_layer_norm";
    DT__NEED_F32(ctx, op, x);
    if (x->ndim < 1) {
        dt_error(DT_ERR_SHAPE, "%s: input needs at least one dim", op);
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1], R = D ? dt_tensor_numel(x) / D : 0;
    if (!check_vec(op, "gamma", gamma, D, x) || !check_vec(op, "beta", beta, D, x))
        return NULL;
    const float *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    float *xhat = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(x));
    float *invstd = dt_arena_alloc(ctx->arena, (size_t)R * sizeof(float) + 1);
    if (!xd || !out || !xhat || !invstd)
        return NULL;
    float *y = out->data;
    for (int64_t r = 0; r < R; r++) {
        const float *xr = xd + r * D;
        double s = 0.0, s2 = 0.0;
        for (int64_t d = 0; d < D; d++)
            s += xr[d];
        double mean = s / (double)D;
        for (int64_t d = 0; d < D; d++)
            s2 += (xr[d] - mean) * (xr[d] - mean);
        float is = (float)(1.0 / sqrt(s2 / (double)D + (double)eps)), m = (float)mean;
        invstd[r] = is;
        for (int64_t d = 0; d < D; d++) {
            float xh = (xr[d] - m) * is;
            xhat[r * D + d] = xh;
            y[r * D + d] = xh * vec_at(gamma, d, 1.0f) + vec_at(beta, d, 0.0f);
        }
    }
    dt_tensor *in[3] = {x, gamma, beta};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, op, ln_backward, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = R;
        n->i[1] = D;
        n->saved[0] = xhat;
        n->saved[1] = invstd;
    }
    return out;
}
