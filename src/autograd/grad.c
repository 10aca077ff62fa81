/* Gradient buffers of tensors during backward: the accumulate-into
 * gradient of a tensor (allocated zeroed on first use: an arena temporary
 * for temporaries, owned memory for persistent leaves), and the
 * begin/commit pair that lets a backward function write a temporary's
 * first contribution in place instead of adding it. Used by the tape and
 * the op files; calls nothing of either.
 *
 * A leaf marked DT_TENSOR_GRAD_LAZY (tensor.h: its gradient is zero, its
 * buffer not yet written) is unmarked by its first access here: a GEMM
 * (dt__grad_gemm) or a commit writes the contribution over the buffer, every
 * other access zero-fills the buffer first, and a leaf whose gradient is
 * final without any contribution is zero-filled before its hooks
 * (dt__grad_flush). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <string.h>

/* A leaf whose gradient tensor is bf16/f16 (a low-precision parameter):
 * the contributions of one backward pass add up in an f32 arena buffer
 * (gacc_, tagged with the pass's epoch) and dt__grad_flush adds that sum to
 * the gradient tensor once, rounding once, when the leaf's gradient is
 * final (just before its grad-ready hooks). */
static float *lp_acc(dt_ctx *ctx, dt_tensor *t)
{
    if (t->gacc_ && t->gacc_epoch_ == ctx->epoch)
        return t->gacc_;
    size_t nb = (size_t)dt_tensor_numel(t) * sizeof(float);
    float *a = dt_arena_alloc(ctx->arena, nb ? nb : sizeof(float));
    if (!a)
        return NULL;
    memset(a, 0, nb);
    t->gacc_ = a;
    t->gacc_epoch_ = ctx->epoch;
    return a;
}

/* A lazily zeroed leaf's buffer filled with zeros, the mark cleared. */
static void lazy_fill(dt_tensor *t)
{
    t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
    if (t->grad)
        dt_tensor_zero(t->grad);
}

dt_status dt__grad_flush(dt_ctx *ctx, dt_tensor *t)
{
    if (t->flags & DT_TENSOR_GRAD_LAZY) /* final without a contribution: zero */
        lazy_fill(t);
    if (!t->grad || t->grad->dtype == DT_F32 || !t->gacc_ || t->gacc_epoch_ != ctx->epoch)
        return DT_OK;
    dt_dtype gt = t->grad->dtype;
    int64_t n = dt_tensor_numel(t);
    const float *acc = t->gacc_;
    uint16_t *g = t->grad->data;
    float tmp[1024];
    for (int64_t i = 0; i < n; i += 1024) {
        int64_t c = n - i < 1024 ? n - i : 1024;
        dt_status st = dt_k_convert(g + i, gt, tmp, DT_F32, c);
        for (int64_t j = 0; st >= 0 && j < c; j++)
            tmp[j] += acc[i + j];
        if (st < 0 || (st = dt_k_convert(tmp, DT_F32, g + i, gt, c)) < 0)
            return st;
    }
    t->gacc_ = NULL;
    return DT_OK;
}

float *dt__grad(dt_ctx *ctx, dt_tensor *t)
{
    if (t->flags & DT_TENSOR_GRAD_LAZY)
        lazy_fill(t);
    if (t->grad)
        return t->grad->dtype == DT_F32 ? t->grad->data : lp_acc(ctx, t);
    dt_tensor *g;
    if (t->flags & DT_TENSOR_TEMP) {
        g = dt_tensor_zeros(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
    } else { /* a persistent leaf: a gradient of its own dtype */
        g = dt_tensor_new(t->dtype, t->ndim, t->shape);
        if (!g)
            return NULL;
        t->grad = g;
        t->flags |= DT_TENSOR_OWNS_GRAD;
        if (g->dtype != DT_F32)
            return lp_acc(ctx, t);
    }
    return g->data;
}

float *dt__grad_begin(dt_ctx *ctx, dt_tensor *t)
{
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        /* first contribution to a temporary's gradient: write in place */
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        return g->data;
    }
    return dt_arena_alloc(ctx->arena, (size_t)dt_tensor_numel(t) * sizeof(float) + 4); // f32 whatever t's dtype
}

float *dt__grad_gemm(dt_ctx *ctx, dt_tensor *t, float *beta)
{
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        *beta = 0.0f;
        return g->data;
    }
    if ((t->flags & DT_TENSOR_GRAD_LAZY) && t->grad && t->grad->dtype == DT_F32) {
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY; /* the GEMM overwrites the buffer */
        *beta = 0.0f;
        return t->grad->data;
    }
    *beta = 1.0f;
    return dt__grad(ctx, t);
}

dt_status dt__grad_commit(dt_ctx *ctx, dt_tensor *t, float *buf)
{
    if (t->grad && t->grad->dtype == DT_F32 && t->grad->data == buf)
        return DT_OK;
    if ((t->flags & DT_TENSOR_GRAD_LAZY) && t->grad && t->grad->dtype == DT_F32) {
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
        memcpy(t->grad->data, buf, (size_t)dt_tensor_numel(t) * sizeof(float));
        return DT_OK;
    }
    float *g = dt__grad(ctx, t);
    if (!g)
        return dt_last_status();
    return dt_k_axpy(dt_tensor_numel(t), 1.0f, buf, g);
}
