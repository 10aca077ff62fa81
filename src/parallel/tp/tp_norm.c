/* RMSNorm over a dimension the tensor-parallel ranks split (tp.h,
 * dt_tp_rms_norm): OLMo 2's q_norm and k_norm normalize each row of the
 * whole q (k) projection, of which every rank holds its heads.
 *
 * Forward: each rank sums its rows' squares in double; one all-reduce of
 * [sums (R), count] gives every rank the whole rows' sums and the whole
 * width D; y = x rstd w with rstd = 1 / sqrt(sum / D + eps).
 *
 * Backward, dy the rank's part of the whole row's gradient:
 *     dx_j = rstd w_j dy_j - x_j rstd^3 / D * sum_k x_k w_k dy_k
 * where the sum runs over the whole row: each rank's part, all-reduced
 * (R doubles); dw_j = sum over rows of x_j rstd dy_j is the rank's slice of
 * the weight's gradient, local as a column-parallel layer's. So forward
 * and backward are the single-process norm's up to the order of the sums. */
#include "tp_impl.h"
#include "dtrain/precision.h"

#include <math.h>
#include <string.h>

typedef struct {
    dt_pg *tp;
    const float *x, *w; /* x [R, D] contiguous, w [D] or NULL */
    const float *rstd;  /* [R] */
    int64_t R, D;
    double width;       /* the whole row's width (sum of D over the group) */
    bool has_w;
} tp_norm_save;

static dt_status tp_norm_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)nin;
    const tp_norm_save *s = ud;
    const int64_t R = s->R, D = s->D;
    const float *dy = gout->data;
    if (!dt_tensor_is_contiguous(gout)) {
        dt_tensor *c = dt_tensor_clone(ctx, gout);
        if (!c)
            return dt_last_status();
        dy = c->data;
    }
    if (gin[0]) { /* the whole row's sum of x w dy, over the group */
        double *a = dt_ctx_alloc(ctx, (size_t)(R ? R : 1) * sizeof *a);
        if (!a)
            return dt_last_status();
        for (int64_t r = 0; r < R; r++) {
            const float *xr = s->x + r * D, *gr = dy + r * D;
            double acc = 0;
            for (int64_t j = 0; j < D; j++)
                acc += (double)xr[j] * (s->w ? s->w[j] : 1.0f) * gr[j];
            a[r] = acc;
        }
        dt_status st = dt_pg_allreduce(s->tp, DT_IN_PLACE, a, (size_t)R, DT_F64, DT_REDUCE_SUM);
        if (st < 0)
            return dt_error_wrap(st, "tensor-parallel RMSNorm backward: all-reduce of the rows' sums");
        float *dx = gin[0]->data;
        for (int64_t r = 0; r < R; r++) {
            const float rs = s->rstd[r], k = (float)(a[r] / s->width) * rs * rs * rs;
            const float *xr = s->x + r * D, *gr = dy + r * D;
            for (int64_t j = 0; j < D; j++)
                dx[r * D + j] = rs * (s->w ? s->w[j] : 1.0f) * gr[j] - xr[j] * k;
        }
    }
    if (s->has_w && gin[1]) {
        float *dw = gin[1]->data;
        for (int64_t j = 0; j < D; j++) {
            double acc = 0;
            for (int64_t r = 0; r < R; r++)
                acc += (double)s->x[r * D + j] * s->rstd[r] * dy[r * D + j];
            dw[j] = (float)acc;
        }
    }
    return DT_OK;
}

dt_tensor *dt_tp_rms_norm(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, dt_tensor *weight, float eps)
{
    const char *op = "dt_tp_rms_norm";
    if (!ctx || !tp) {
        dt_error(DT_ERR_NULL, "%s: %s is NULL", op, ctx ? "group" : "context");
        return NULL;
    }
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: input is NULL", op);
        return NULL;
    }
    if (dt_pg_size(tp) <= 1)
        return dt_rms_norm(ctx, x, weight, eps);
    if (!(eps > 0.0f)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: eps %g must be > 0", op, (double)eps);
        return NULL;
    }
    if (x->dtype != DT_F32 || (weight && weight->dtype != DT_F32)) {
        /* bf16 or f16: the statistics and the normalisation in f32, the result
         * in x's dtype, as dt_rms_norm's */
        if (!dt_dtype_is_float(x->dtype) || (weight && !dt_dtype_is_float(weight->dtype))) {
            dt_error(DT_ERR_DTYPE, "%s: x and weight must be floating point, got %s and %s", op,
                     dt_dtype_name(x->dtype), weight ? dt_dtype_name(weight->dtype) : "none");
            return NULL;
        }
        dt_tensor *xf = dt_cast(ctx, x, DT_F32), *wf = weight ? dt_cast(ctx, weight, DT_F32) : NULL;
        if (!xf || (weight && !wf))
            return NULL;
        dt_tensor *y = dt_tp_rms_norm(ctx, tp, xf, wf, eps);
        return y ? dt_cast(ctx, y, x->dtype) : NULL;
    }
    const int64_t D = x->ndim ? x->shape[x->ndim - 1] : 0;
    if (x->ndim < 1 || (weight && (weight->ndim != 1 || weight->shape[0] != D))) {
        char a[96], b[96];
        dt_error(DT_ERR_SHAPE, "%s: want x [..., D] and weight [D], got %s and %s", op,
                 dt_tensor_shape_str(x, a, sizeof a), weight ? dt_tensor_shape_str(weight, b, sizeof b) : "none");
        return NULL;
    }
    const int64_t R = D ? dt_tensor_numel(x) / D : 0;
    dt_tensor *xc = dt_contiguous(ctx, x), *wc = weight ? dt_contiguous(ctx, weight) : NULL;
    dt_tensor *y = dt_tensor_empty(ctx, DT_F32, x->ndim, x->shape);
    double *ss = dt_ctx_alloc(ctx, (size_t)(R + 1) * sizeof *ss);
    float *rstd = dt_ctx_alloc(ctx, (size_t)(R ? R : 1) * sizeof *rstd);
    tp_norm_save *s = dt_ctx_alloc(ctx, sizeof *s);
    if (!xc || (weight && !wc) || !y || !ss || !rstd || !s)
        return NULL;
    const float *xp = xc->data, *wp = wc ? wc->data : NULL;
    for (int64_t r = 0; r < R; r++) {
        double acc = 0;
        for (int64_t j = 0; j < D; j++)
            acc += (double)xp[r * D + j] * xp[r * D + j];
        ss[r] = acc;
    }
    ss[R] = (double)D;
    dt_status st = dt_pg_allreduce(tp, DT_IN_PLACE, ss, (size_t)(R + 1), DT_F64, DT_REDUCE_SUM);
    if (st < 0) {
        dt_error_wrap(st, "tensor-parallel RMSNorm forward: all-reduce of the rows' sums of squares");
        return NULL;
    }
    if (!(ss[R] > 0)) {
        dt_error(DT_ERR_SHAPE, "%s: the rows are empty on every rank", op);
        return NULL;
    }
    float *yp = y->data;
    for (int64_t r = 0; r < R; r++) {
        rstd[r] = (float)(1.0 / sqrt(ss[r] / ss[R] + (double)eps));
        for (int64_t j = 0; j < D; j++)
            yp[r * D + j] = xp[r * D + j] * rstd[r] * (wp ? wp[j] : 1.0f);
    }
    *s = (tp_norm_save){.tp = tp, .x = xp, .w = wp, .rstd = rstd, .R = R, .D = D, .width = ss[R],
                        .has_w = weight != NULL};
    dt_tensor *in[2] = {xc, wc};
    return dt_ag_custom(ctx, weight ? 2 : 1, in, y, tp_norm_bwd, s);
}
