/* Gradient buffers of tensors during backward: the accumulate-into
 * gradient of a tensor (allocated zeroed on first use: an arena temporary
 * for temporaries, owned memory for persistent leaves), and the
 * begin/commit pair that lets a backward function write a temporary's
 * first contribution in place instead of adding it. Used by the tape and
 * the op files; calls nothing of either. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

float *dt__grad(dt_ctx *ctx, dt_tensor *t)
{
    if (t->grad)
        return t->grad->data;
    dt_tensor *g;
    if (t->flags & DT_TENSOR_TEMP) {
        g = dt_tensor_zeros(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
    } else {
        g = dt_tensor_new(DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        t->grad = g;
        t->flags |= DT_TENSOR_OWNS_GRAD;
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
    return dt_arena_alloc(ctx->arena, dt_tensor_nbytes(t));
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
    *beta = 1.0f;
    return dt__grad(ctx, t);
}

dt_status dt__grad_commit(dt_ctx *ctx, dt_tensor *t, float *buf)
{
    if (t->grad && t->grad->data == buf)
        return DT_OK;
    float *g = dt__grad(ctx, t);
    if (!g)
        return dt_last_status();
    return dt_k_axpy(dt_tensor_numel(t), 1.0f, buf, g);
}
