/* Reductions, softmax / log-softmax, losses and embedding.
 *
 * Sums over many elements accumulate in double in a fixed (row-major)
 * order, so a loss is bit-identical whatever the thread count. Softmax-type
 * ops work on the last dim; cross-entropy is fused: one pass computes the
 * row max, log-sum-exp and the loss, and keeps the probabilities for
 * backward ((p - onehot) / N). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- sum / mean ------------------------------------------------------------ */

dt_status dt__bw_sum(dt_ctx *ctx, dt__node *n, const float *gout)
{
    float *gx = dt__grad(ctx, n->in[0]);
    if (!gx)
        return dt_last_status();
    float g = gout[0] * (float)n->f[0];
    int64_t m = dt_tensor_numel(n->in[0]);
    for (int64_t i = 0; i < m; i++)
        gx[i] += g;
    return DT_OK;
}

static dt_tensor *reduce_all(dt_ctx *ctx, const char *op, dt_tensor *x, bool mean)
{
    DT__NEED(ctx, op, x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, reduce_all(ctx, op, lp[0], mean));
    DT__NEED_F32(ctx, op, x);
    const float *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt__out(ctx, 0, NULL);
    if (!xd || !out)
        return NULL;
    int64_t m = dt_tensor_numel(x);
    float s = 0.0f;
    if (dt_k_sum_all(xd, m, &s) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    double scale = mean ? (m ? 1.0 / (double)m : NAN) : 1.0;
    ((float *)out->data)[0] = (float)((double)s * scale);
    if (dt__ag_wants(ctx, 1, &x)) {
        dt__node *n = dt__ag_record(ctx, mean ? DT_OP_MEAN : DT_OP_SUM, out, 1, &x);
        if (!n)
            return NULL;
        n->f[0] = scale;
    }
    return out;
}

dt_tensor *dt_sum(dt_ctx *ctx, dt_tensor *x) { return reduce_all(ctx, "dt_sum", x, false); }
dt_tensor *dt_mean(dt_ctx *ctx, dt_tensor *x) { return reduce_all(ctx, "dt_mean", x, true); }

/* ---- mse ------------------------------------------------------------------------ */

/* saved[0] = a contiguous, saved[1] = b contiguous */
dt_status dt__bw_mse(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const float *a = n->saved[0], *b = n->saved[1];
    int64_t m = dt_tensor_numel(n->in[0]);
    float k = (float)(2.0 / (double)m) * gout[0];
    float *ga = dt__rg(n->in[0]) ? dt__grad(ctx, n->in[0]) : NULL;
    float *gb = dt__rg(n->in[1]) ? dt__grad(ctx, n->in[1]) : NULL;
    if ((dt__rg(n->in[0]) && !ga) || (dt__rg(n->in[1]) && !gb))
        return dt_last_status();
    for (int64_t i = 0; i < m; i++) {
        float d = k * (a[i] - b[i]);
        if (ga)
            ga[i] += d;
        if (gb)
            gb[i] -= d;
    }
    return DT_OK;
}

dt_tensor *dt_mse_loss(dt_ctx *ctx, dt_tensor *a, dt_tensor *b)
{
    const char *op = "dt_mse_loss";
    DT__NEED(ctx, op, a);
    DT__NEED(ctx, op, b);
    dt_tensor *lp[2] = {a, b}; /* a loss: computed and returned in f32 */
    DT__LP_RUN(ctx, 2, lp, DT_F32, dt_mse_loss(ctx, lp[0], lp[1]));
    DT__NEED_F32(ctx, op, a);
    DT__NEED_F32(ctx, op, b);
    if (!dt_tensor_same_shape(a, b)) {
        dt__shape_error(op, "input and target shapes differ", a, b);
        return NULL;
    }
    const float *ad = dt__cdata(ctx, a), *bd = dt__cdata(ctx, b);
    dt_tensor *out = dt__out(ctx, 0, NULL);
    if (!ad || !bd || !out)
        return NULL;
    int64_t m = dt_tensor_numel(a);
    double s = 0.0;
    for (int64_t i = 0; i < m; i++) {
        double d = (double)ad[i] - (double)bd[i];
        s += d * d;
    }
    ((float *)out->data)[0] = (float)(m ? s / (double)m : NAN);
    dt_tensor *in[2] = {a, b};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_MSE_LOSS, out, 2, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)ad;
        n->saved[1] = (void *)(uintptr_t)bd;
    }
    return out;
}

/* ---- softmax / log-softmax ---------------------------------------------------- */

dt_status dt__bw_softmax(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t C = n->i[0], R = dt_tensor_numel(n->out) / (C ? C : 1);
    float *gx = dt__grad_begin(ctx, n->in[0]);
    if (!gx)
        return dt_last_status();
    dt_status st = dt_k_softmax_bwd(n->out->data, gout, gx, R, C, n->i[1] != 0);
    if (st < 0)
        return st;
    return dt__grad_commit(ctx, n->in[0], gx);
}

static dt_tensor *softmax_op(dt_ctx *ctx, const char *op, dt_tensor *x, bool log)
{
    DT__NEED(ctx, op, x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, softmax_op(ctx, op, lp[0], log));
    DT__NEED_F32(ctx, op, x);
    if (x->ndim < 1) {
        char s[64];
        dt_error(DT_ERR_SHAPE, "%s: input %s needs at least one dim", op,
                 dt_tensor_shape_str(x, s, sizeof s));
        return NULL;
    }
    int64_t C = x->shape[x->ndim - 1], R = C ? dt_tensor_numel(x) / C : 0;
    const float *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    if (!xd || !out)
        return NULL;
    if (dt_k_softmax_fwd(xd, out->data, R, C, log) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &x)) {
        dt__node *n = dt__ag_record(ctx, log ? DT_OP_LOG_SOFTMAX : DT_OP_SOFTMAX, out, 1, &x);
        if (!n)
            return NULL;
        n->i[0] = C;
        n->i[1] = log;
    }
    return out;
}

dt_tensor *dt_softmax(dt_ctx *ctx, dt_tensor *x) { return softmax_op(ctx, "dt_softmax", x, false); }
dt_tensor *dt_log_softmax(dt_ctx *ctx, dt_tensor *x)
{
    return softmax_op(ctx, "dt_log_softmax", x, true);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

static int64_t label_at(const dt_tensor *y, int64_t i)
{
    const char *p = (const char *)y->data;
    int64_t off = i * y->strides[0];
    return y->dtype == DT_I64 ? ((const int64_t *)p)[off] : ((const int32_t *)p)[off];
}

/* bf16/f16 logits (one read of their own dtype; no cast nodes, no f32 copy):
 * dt_k_softmax_xent_fwd_lp / _bwd_lp, the numbers of
 * dt_cross_entropy(dt_cast(logits, f32)) bit for bit (each row widened in
 * cache, chunk by chunk). The backward writes each row's f32 gradient
 * rounded to the logits' dtype, as the cast's backward rounds it, and the
 * same values in that dtype as the gradient's shadow (ag_impl.h): the LM
 * head's bf16 GEMMs take them without a conversion pass. */
static dt_status ce_lp_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *x = n->in[0];
    const dt_dtype t = (dt_dtype)n->i[2];
    const int64_t N = n->i[0], C = n->i[1];
    float *gx = dt__grad_begin(ctx, x);
    void *gs = gx ? dt__grad_shadow_new(ctx, x, t) : NULL;
    if (!gs)
        return dt_last_status();
    dt_status st = dt_k_softmax_xent_bwd_lp(t, n->saved[2], n->saved[0], n->saved[1], DT_I64, N, C, gout[0], gx, gs);
    if (st >= 0)
        st = dt__grad_commit(ctx, x, gx);
    if (st >= 0)
        dt__grad_shadow_set(ctx, x, gx, gs, t);
    return st;
}

/* saved[0] = NULL (probabilities are recomputed; low-precision logits: the
 * rows' log-sum-exps from the forward), saved[1] = labels copied at forward as
 * int64 (the caller's label buffer may be refilled before backward), saved[2]
 * = logits (contiguous, in their dtype); i[0] = N, i[1] = C, i[2] = the
 * logits' dtype, i[3] = counted rows */
dt_status dt__bw_ce(dt_ctx *ctx, dt__node *n, const float *gout)
{
    if (n->i[2] != DT_F32)
        return ce_lp_backward(ctx, n, gout);
    float *gx = dt__grad_begin(ctx, n->in[0]);
    if (!gx)
        return dt_last_status();
    dt_status st = dt_k_softmax_xent_bwd(n->saved[2], n->saved[0], n->saved[1], DT_I64, n->i[0],
                                         n->i[1], gout[0], gx);
    if (st < 0)
        return st;
    return dt__grad_commit(ctx, n->in[0], gx);
}

dt_tensor *dt_cross_entropy(dt_ctx *ctx, dt_tensor *logits, dt_tensor *labels)
{
    const char *op = "dt_cross_entropy";
    DT__NEED(ctx, op, logits);
    if (!dt__is_lp(logits) && !dt__check_f32(op, "logits", logits)) /* a loss: computed and returned in f32 */
        return NULL;
    DT__NEED(ctx, op, labels);
    if (labels->dtype != DT_I32 && labels->dtype != DT_I64) {
        char s[64];
        dt_error(DT_ERR_DTYPE, "%s: labels %s are %s, want i32 or i64", op,
                 dt_tensor_shape_str(labels, s, sizeof s), dt_dtype_name(labels->dtype));
        return NULL;
    }
    if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
        dt__shape_error(op, "want logits [N, C] and labels [N]", logits, labels);
        return NULL;
    }
    int64_t N = logits->shape[0], C = logits->shape[1];
    if (N == 0 || C == 0) {
        dt__shape_error(op, "empty batch or no classes", logits, labels);
        return NULL;
    }
    int64_t *lab = dt_arena_alloc(ctx->arena, (size_t)N * sizeof(int64_t)), count = 0;
    if (!lab)
        return NULL;
    for (int64_t r = 0; r < N; r++) {
        int64_t y = lab[r] = label_at(labels, r);
        if ((y < 0 || y >= C) && y != DT_K_IGNORE_INDEX) {
            dt_error(DT_ERR_RANGE, "%s: label %lld at row %lld not in [0, %lld)", op,
                     (long long)y, (long long)r, (long long)C);
            return NULL;
        }
        count += y != DT_K_IGNORE_INDEX;
    }
    const float *x = dt__cdata(ctx, logits);
    const dt_dtype t = logits->dtype;
    /* the backward recomputes the softmax: no [N, C] buffer kept (from the
     * rows' log-sum-exps kept here, N floats, for low-precision logits) */
    float *p = t != DT_F32 && dt__ag_wants(ctx, 1, &logits) ? dt_arena_alloc(ctx->arena, (size_t)N * sizeof(float))
                                                            : NULL;
    dt_tensor *out = dt__out(ctx, 0, NULL);
    if (!x || !out || (!p && t != DT_F32 && dt__ag_wants(ctx, 1, &logits)))
        return NULL;
    if ((t == DT_F32 ? dt_k_softmax_xent_fwd(x, lab, DT_I64, N, C, out->data, p)
                     : dt_k_softmax_xent_fwd_lp(t, x, lab, DT_I64, N, C, out->data, p)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &logits)) {
        dt_tensor *in[2] = {logits, labels};
        dt__node *n = dt__ag_record(ctx, DT_OP_CROSS_ENTROPY, out, 2, in);
        if (!n)
            return NULL;
        n->saved[0] = p;
        n->saved[1] = lab;
        n->saved[2] = (void *)(uintptr_t)x;
        n->i[0] = N;
        n->i[1] = C;
        n->i[2] = t;
        n->i[3] = count;
    }
    return out;
}

/* ---- embedding ------------------------------------------------------------------------ */

static int64_t index_at(const dt_tensor *idx, const int64_t *flat_ids, int64_t i)
{
    (void)idx;
    return flat_ids[i];
}

/* saved[0] = flattened indices (int64) */
static dt_status embedding_backward_f32(dt_ctx *ctx, dt__node *n, const float *gout)
{
    float *gw = dt__grad(ctx, n->in[0]);
    if (!gw)
        return dt_last_status();
    const int64_t *ids = n->saved[0];
    int64_t m = n->i[0], D = n->i[1];
    for (int64_t i = 0; i < m; i++) {
        float *row = gw + index_at(n->in[1], ids, i) * D;
        const float *g = gout + i * D;
        for (int64_t d = 0; d < D; d++)
            row[d] += g[d];
    }
    return DT_OK;
}

/* A bf16/f16 weight: the same arithmetic as widening the table, the f32
 * embedding and rounding its result (DT__LP_RUN), without widening the
 * table. Forward: the rows are copied as they are (widening then rounding
 * is exact). Backward: the output's gradient rows rounded to the dtype
 * (the gradient of the low-precision result), summed per index in position
 * order from zero, each sum rounded (the gradient of the widened table is
 * rounded to the table's dtype by the cast) and added to the weight's
 * gradient: only the rows the indices touch, where the widening path
 * rounded and added a dense [V, D] table.
 * saved[0] = indices, saved[1] = positions sorted by (index, position). */
static dt_status embedding_backward_lp(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *w = n->in[0];
    const int64_t *ids = n->saved[0], *ord = n->saved[1];
    int64_t m = n->i[0], D = n->i[1];
    dt_dtype t = w->dtype;
    float *gw = dt__grad(ctx, w);
    float *s = dt_arena_alloc(ctx->arena, 2 * (size_t)D * sizeof(float) + 4);
    if (!gw || !s)
        return dt_last_status();
    float *r = s + D;
    dt_status st = DT_OK;
    for (int64_t k = 0; k < m && st >= 0;) {
        int64_t id = ids[ord[k]];
        memset(s, 0, (size_t)D * sizeof(float));
        for (; k < m && ids[ord[k]] == id && st >= 0; k++) {
            st = dt__round_to(t, gout + ord[k] * D, r, D);
            for (int64_t d = 0; d < D; d++)
                s[d] += r[d];
        }
        if (st >= 0)
            st = dt__round_to(t, s, s, D);
        float *row = gw + id * D;
        for (int64_t d = 0; st >= 0 && d < D; d++)
            row[d] += s[d];
    }
    return st;
}

/* Positions 0..m-1 sorted by (ids[i], i): a stable merge sort. */
static int64_t *sort_positions(dt_ctx *ctx, const int64_t *ids, int64_t m)
{
    int64_t *a = dt_arena_alloc(ctx->arena, 2 * (size_t)m * sizeof(int64_t) + 8);
    if (!a)
        return NULL;
    int64_t *b = a + m;
    for (int64_t i = 0; i < m; i++)
        a[i] = i;
    for (int64_t w = 1; w < m; w *= 2) {
        for (int64_t lo = 0; lo < m; lo += 2 * w) {
            int64_t mid = lo + w < m ? lo + w : m, hi = lo + 2 * w < m ? lo + 2 * w : m;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                b[k++] = ids[a[j]] < ids[a[i]] ? a[j++] : a[i++];
            while (i < mid)
                b[k++] = a[i++];
            while (j < hi)
                b[k++] = a[j++];
        }
        int64_t *x = a;
        a = b;
        b = x;
    }
    return a;
}

/* The op table's embedding row: a bf16/f16 weight takes the sorted path. */
dt_status dt__bw_embedding(dt_ctx *ctx, dt__node *n, const float *gout)
{
    return dt__is_lp(n->in[0]) ? embedding_backward_lp(ctx, n, gout) : embedding_backward_f32(ctx, n, gout);
}

dt_tensor *dt_embedding(dt_ctx *ctx, dt_tensor *weight, dt_tensor *idx)
{
    const char *op = "dt_embedding";
    DT__NEED(ctx, op, weight);
    const bool lp = dt__is_lp(weight);
    if (!lp)
        DT__NEED_F32(ctx, op, weight);
    DT__NEED(ctx, op, idx);
    if (idx->dtype != DT_I32 && idx->dtype != DT_I64) {
        char s[64];
        dt_error(DT_ERR_DTYPE, "%s: indices %s are %s, want i32 or i64", op,
                 dt_tensor_shape_str(idx, s, sizeof s), dt_dtype_name(idx->dtype));
        return NULL;
    }
    if (weight->ndim != 2 || idx->ndim + 1 > DT_MAX_DIMS) {
        dt__shape_error(op, "want weight [V, D] and indices of at most 7 dims", weight, idx);
        return NULL;
    }
    int64_t V = weight->shape[0], D = weight->shape[1], m = dt_tensor_numel(idx);
    int64_t sh[DT_MAX_DIMS];
    for (int i = 0; i < idx->ndim; i++)
        sh[i] = idx->shape[i];
    sh[idx->ndim] = D;
    dt_tensor *out = dt_tensor_empty(ctx, lp ? weight->dtype : DT_F32, idx->ndim + 1, sh); /* first: checks the size */
    if (!out)
        return NULL;
    int64_t *ids = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(int64_t) + 1);
    if (!ids)
        return NULL;
    for (int64_t i = 0; i < m; i++) {
        double v = dt_tensor_get(idx, i);
        ids[i] = (int64_t)v;
        if (ids[i] < 0 || ids[i] >= V) {
            dt_error(DT_ERR_RANGE, "%s: index %lld at position %lld not in [0, %lld)", op,
                     (long long)ids[i], (long long)i, (long long)V);
            return NULL;
        }
    }
    const char *W = (const char *)dt__cdata(ctx, weight);
    if (!W)
        return NULL;
    const size_t row = (size_t)D * dt_dtype_size(weight->dtype);
    char *y = out->data;
    for (int64_t i = 0; i < m; i++)
        memcpy(y + (size_t)i * row, W + (size_t)ids[i] * row, row);
    if (dt__ag_wants(ctx, 1, &weight)) {
        dt_tensor *in[2] = {weight, idx};
        int64_t *ord = lp ? sort_positions(ctx, ids, m) : NULL;
        dt__node *n = lp && !ord ? NULL : dt__ag_record(ctx, DT_OP_EMBEDDING, out, 2, in);
        if (!n)
            return NULL;
        n->saved[0] = ids;
        n->saved[1] = ord;
        n->i[0] = m;
        n->i[1] = D;
    }
    return out;
}
