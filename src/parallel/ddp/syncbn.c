/* SyncBatchNorm as an autograd custom op.
 *
 * Forward (training): each rank computes per-channel mean and M2 (sum of
 * squared deviations) of its local N x HW elements in double, packs
 * [mean(C), M2(C), count] and all-gathers it (all-gather, not all-reduce,
 * because counts may differ; a rank with an empty batch sends count 0 and
 * drops out of the combination). The global mean and M2 come from Chan's
 * pairwise combination weighted by count, so the statistics equal those of
 * the concatenated batch up to double rounding. Normalisation uses the
 * biased variance M2/n; the running variance the unbiased M2/(n-1).
 *
 * Backward: local per-channel sum_dy and sum_dy_xmu, all-reduced (SUM) in
 * double; then
 *     dx = gamma * invstd * (dy - sum_dy/n - (x - mean) * invstd^2 * sum_dy_xmu/n)
 * with the GLOBAL sums and count. dgamma = local sum_dy_xmu * invstd and
 * dbeta = local sum_dy are not synchronised here: DDP's gradient all-reduce
 * averages them. With every rank's loss a mean over its own batch, this
 * reproduces single-process batch norm over the union of the batches. */
#include "dtrain/parallel.h"
#include "dtrain/precision.h"

#include <math.h>
#include <string.h>

typedef struct {
    dt_pg *pg;
    const float *x;    /* (N, C, HW), contiguous */
    const float *gamma; /* C or NULL */
    float *mean, *invstd; /* C each, global statistics */
    int64_t N, C, HW;
    double count;      /* global element count per channel */
    int ix, ig, ib;    /* positions of x, gamma, beta among the op's inputs (-1: absent) */
} sbn_save;

static dt_status sbn_backward(dt_ctx *ctx, const dt_tensor *grad_out, int nin, dt_tensor **grad_in, void *ud)
{
    (void)nin;
    sbn_save *s = ud;
    const int64_t N = s->N, C = s->C, HW = s->HW;
    const float *dy = grad_out->data;
    if (!dt_tensor_is_contiguous(grad_out)) {
        dt_tensor *c = dt_tensor_clone(ctx, grad_out);
        if (!c)
            return dt_last_status();
        dy = c->data;
    }
    double *sums = dt_ctx_alloc(ctx, (size_t)(2 * C) * sizeof(double)); /* [sum_dy(C), sum_dy_xmu(C)] */
    double *loc = dt_ctx_alloc(ctx, (size_t)(2 * C) * sizeof(double));
    if (!sums || !loc)
        return dt_last_status();
    for (int64_t c = 0; c < C; c++) {
        double sdy = 0, sdx = 0;
        const double mu = s->mean[c];
        for (int64_t n = 0; n < N; n++) {
            const float *xp = s->x + (n * C + c) * HW, *gp = dy + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) {
                sdy += gp[i];
                sdx += gp[i] * (xp[i] - mu);
            }
        }
        loc[c] = sdy;
        loc[C + c] = sdx;
    }
    dt_tensor *gx = s->ix >= 0 ? grad_in[s->ix] : NULL;
    if (gx) {
        memcpy(sums, loc, (size_t)(2 * C) * sizeof(double));
        dt_status st = dt_pg_allreduce(s->pg, DT_IN_PLACE, sums, (size_t)(2 * C), DT_F64, DT_REDUCE_SUM);
        if (st < 0)
            return dt_error_wrap(st, "SyncBatchNorm backward: all-reduce of [sum_dy, sum_dy_xmu]");
        float *dx = gx->data;
        for (int64_t c = 0; c < C; c++) {
            const float is = s->invstd[c], mu = s->mean[c];
            const float g = s->gamma ? s->gamma[c] : 1.0f;
            const float mdy = (float)(sums[c] / s->count);
            const float k = (float)(sums[C + c] / s->count) * is * is;
            const float gi = g * is;
            for (int64_t n = 0; n < N; n++) {
                const float *xp = s->x + (n * C + c) * HW, *gp = dy + (n * C + c) * HW;
                float *o = dx + (n * C + c) * HW;
                for (int64_t i = 0; i < HW; i++)
                    o[i] = gi * (gp[i] - mdy - (xp[i] - mu) * k);
            }
        }
    }
    if (s->ig >= 0 && grad_in[s->ig]) {
        float *dg = grad_in[s->ig]->data;
        for (int64_t c = 0; c < C; c++)
            dg[c] = (float)(loc[C + c] * s->invstd[c]);
    }
    if (s->ib >= 0 && grad_in[s->ib]) {
        float *db = grad_in[s->ib]->data;
        for (int64_t c = 0; c < C; c++)
            db[c] = (float)loc[c];
    }
    return DT_OK;
}

static dt_tensor *null_err(dt_status st, const char *fmt, const char *a)
{
    dt_error(st, fmt, a);
    return NULL;
}

dt_tensor *dt_sync_batch_norm(dt_ctx *ctx, dt_pg *pg, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                              dt_tensor *running_mean, dt_tensor *running_var, dt_tensor *num_batches,
                              bool training, float momentum, float eps)
{
    if (!ctx || !pg)
        return null_err(DT_ERR_NULL, "dt_sync_batch_norm: %s is NULL", ctx ? "process group" : "context");
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_sync_batch_norm: input is NULL");
        return NULL;
    }
    if (!training)
        return dt_batch_norm(ctx, x, gamma, beta, running_mean, running_var, false, momentum, eps);
    if (dt_dtype_is_float(x->dtype) && (x->dtype != DT_F32 || (gamma && gamma->dtype != DT_F32) ||
                                        (beta && beta->dtype != DT_F32))) {
        /* low precision (precision.h): statistics and normalisation in f32,
         * the result rounded to x's dtype; running statistics stay f32 */
        dt_dtype xt = x->dtype;
        dt_tensor *g = gamma ? dt_cast(ctx, gamma, DT_F32) : NULL, *b = beta ? dt_cast(ctx, beta, DT_F32) : NULL;
        dt_tensor *xf = dt_cast(ctx, x, DT_F32);
        if (!xf || (gamma && !g) || (beta && !b))
            return NULL;
        dt_tensor *y = dt_sync_batch_norm(ctx, pg, xf, g, b, running_mean, running_var, num_batches, true,
                                          momentum, eps);
        return y ? dt_cast(ctx, y, xt) : NULL;
    }
    if (x->dtype != DT_F32 || (x->ndim != 2 && x->ndim != 4)) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "dt_sync_batch_norm: input must be f32 [N,C] or [N,C,H,W], got %s %s",
                 dt_dtype_name(x->dtype), dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    const int64_t N = x->shape[0], C = x->shape[1], HW = x->ndim == 4 ? x->shape[2] * x->shape[3] : 1;
    const dt_tensor *cs[4] = {gamma, beta, running_mean, running_var};
    for (int i = 0; i < 4; i++)
        if (cs[i] && (cs[i]->dtype != DT_F32 || dt_tensor_numel(cs[i]) != C || !dt_tensor_is_contiguous(cs[i]))) {
            char s[96];
            dt_error(DT_ERR_SHAPE, "dt_sync_batch_norm: %s must be contiguous f32 [%lld], got %s",
                     (const char *[]){"weight", "bias", "running_mean", "running_var"}[i], (long long)C,
                     dt_tensor_shape_str(cs[i], s, sizeof s));
            return NULL;
        }
    dt_tensor *xc = dt_contiguous(ctx, x);
    if (!xc)
        return NULL;
    const float *xp = xc->data;
    const int W = dt_pg_size(pg);
    const size_t per = (size_t)(2 * C + 1);
    double *mine = dt_ctx_alloc(ctx, per * sizeof(double));
    double *all = dt_ctx_alloc(ctx, per * (size_t)W * sizeof(double));
    sbn_save *s = dt_ctx_alloc(ctx, sizeof *s);
    float *mean = dt_ctx_alloc(ctx, (size_t)C * sizeof(float));
    float *invstd = dt_ctx_alloc(ctx, (size_t)C * sizeof(float));
    dt_tensor *y = dt_tensor_empty(ctx, DT_F32, x->ndim, x->shape);
    if (!mine || !all || !s || !mean || !invstd || !y)
        return NULL;

    /* local statistics, two passes in double */
    const double cnt = (double)N * (double)HW;
    for (int64_t c = 0; c < C; c++) {
        double sum = 0, m2 = 0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = xp + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++)
                sum += p[i];
        }
        const double mu = cnt > 0 ? sum / cnt : 0.0;
        for (int64_t n = 0; n < N; n++) {
            const float *p = xp + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) {
                const double dv = p[i] - mu;
                m2 += dv * dv;
            }
        }
        mine[c] = mu;
        mine[C + c] = m2;
    }
    mine[2 * C] = cnt;
    dt_status st = dt_pg_allgather(pg, mine, all, per, DT_F64);
    if (st < 0) {
        dt_error_wrap(st, "SyncBatchNorm forward: all-gather of [mean, M2, count]");
        return NULL;
    }
    /* combine by count (Chan et al.), ranks with count 0 drop out */
    double n_tot = 0;
    for (int r = 0; r < W; r++)
        n_tot += all[(size_t)r * per + (size_t)(2 * C)];
    if (n_tot < 2) {
        dt_error(DT_ERR_INVALID_ARG,
                 "dt_sync_batch_norm: expected more than 1 value per channel over all ranks in training, got %.0f",
                 n_tot);
        return NULL;
    }
    float *rm = running_mean ? running_mean->data : NULL, *rv = running_var ? running_var->data : NULL;
    for (int64_t c = 0; c < C; c++) {
        double mu = 0;
        for (int r = 0; r < W; r++) {
            const double *a = all + (size_t)r * per;
            mu += a[2 * C] * a[c];
        }
        mu /= n_tot;
        double m2 = 0;
        for (int r = 0; r < W; r++) {
            const double *a = all + (size_t)r * per;
            if (a[2 * C] < 1)
                continue;
            const double dm = a[c] - mu;
            m2 += a[C + c] + a[2 * C] * dm * dm;
        }
        const double var = m2 / n_tot;
        mean[c] = (float)mu;
        invstd[c] = (float)(1.0 / sqrt(var + (double)eps));
        if (rm)
            rm[c] = (1.0f - momentum) * rm[c] + momentum * (float)mu;
        if (rv)
            rv[c] = (1.0f - momentum) * rv[c] + momentum * (float)(m2 / (n_tot - 1));
    }
    if (num_batches && num_batches->dtype == DT_I64 && dt_tensor_numel(num_batches) == 1)
        ((int64_t *)num_batches->data)[0] += 1;

    float *yp = y->data;
    const float *g = gamma ? gamma->data : NULL, *b = beta ? beta->data : NULL;
    for (int64_t c = 0; c < C; c++) {
        const float sc = (g ? g[c] : 1.0f) * invstd[c], mu = mean[c], sh = b ? b[c] : 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *p = xp + (n * C + c) * HW;
            float *o = yp + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++)
                o[i] = (p[i] - mu) * sc + sh;
        }
    }

    *s = (sbn_save){.pg = pg, .x = xp, .gamma = g, .mean = mean, .invstd = invstd, .N = N, .C = C, .HW = HW,
                    .count = n_tot, .ix = 0, .ig = -1, .ib = -1};
    dt_tensor *in[3] = {xc, NULL, NULL};
    int nin = 1;
    if (gamma) {
        s->ig = nin;
        in[nin++] = gamma;
    }
    if (beta) {
        s->ib = nin;
        in[nin++] = beta;
    }
    return dt_ag_custom(ctx, nin, in, y, sbn_backward, s);
}

/* ---- conversion of a model's BatchNorm2d modules ------------------------------ */

static dt_tensor *sbn_module_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    dt_pg *pg = ud;
    float eps = 1e-5f, momentum = 0.1f;
    if (dt_module_norm_config(self, &eps, &momentum) < 0)
        return NULL;
    dt_tensor *w = dt_module_param(self, 0);
    if (!x || !w)
        return NULL;
    if ((x->ndim != 4 && x->ndim != 2) || x->shape[1] != dt_tensor_numel(w)) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "SyncBatchNorm: input %s, want [N, %lld, H, W] or [N, %lld]",
                 dt_tensor_shape_str(x, s, sizeof s), (long long)dt_tensor_numel(w),
                 (long long)dt_tensor_numel(w));
        return NULL;
    }
    return dt_sync_batch_norm(ctx, pg, x, w, dt_module_param(self, 1), dt_module_param(self, 2),
                              dt_module_param(self, 3), dt_module_param(self, 4), dt_module_is_training(self),
                              momentum, eps);
}

static dt_status convert_tree(dt_module *m, dt_pg *pg, int *n)
{
    if (dt_module_kind(m) == DT_NN_BATCHNORM2D) {
        dt_status st = dt_module_set_forward(m, sbn_module_forward, pg);
        if (st < 0)
            return st;
        (*n)++;
    }
    for (int i = 0; i < dt_module_num_children(m); i++) {
        dt_status st = convert_tree(dt_module_child(m, i), pg, n);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt_syncbn_convert(dt_model *m, dt_pg *pg, int *n)
{
    if (!m || !pg)
        return dt_error(DT_ERR_NULL, "dt_syncbn_convert: %s is NULL", m ? "process group" : "model");
    int cnt = 0;
    dt_status st = convert_tree(dt_model_root(m), pg, &cnt);
    if (n)
        *n = cnt;
    return st;
}
