/* Layout conversion: a blocked (nChw8c / nChw16c) temporary made plain (NCHW) for
 * an op that does not understand the blocked layout (DT__NEED in
 * ag_impl.h), recorded on the tape like any op. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <stdint.h>

dt_status dt__bw_plain(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *X = n->in[0];
    float *gx = dt__grad_begin(ctx, X);
    if (!gx)
        return dt_last_status();
    dt_status st = dt_k_to_blocked(gout, X->shape[0], X->shape[1], X->shape[2] * X->shape[3], dt_tensor_block(X), gx);
    return st < 0 ? st : dt__grad_commit(ctx, X, gx);
}

dt_tensor *dt__plain(dt_ctx *ctx, const dt_tensor *t)
{
    dt_tensor *x = (dt_tensor *)(uintptr_t)t;
    if (!dt__blocked(x))
        return x;
    if (x->dtype != DT_F32) { /* bf16/f16 (a native bf16 conv2d's output): through f32, exactly */
        dt_tensor *f = dt_cast(ctx, x, DT_F32); /* keeps the block */
        dt_tensor *p = f ? dt__plain(ctx, f) : NULL;
        return p ? dt_cast(ctx, p, x->dtype) : NULL;
    }
    dt_tensor *out = dt__out(ctx, 4, x->shape);
    if (!out)
        return NULL;
    if (dt_k_from_blocked(x->data, x->shape[0], x->shape[1], x->shape[2] * x->shape[3], dt_tensor_block(x),
                          out->data) < 0) {
        dt_error_wrap(dt_last_status(), "to plain layout");
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &x) && !dt__ag_record(ctx, DT_OP_TO_PLAIN, out, 1, &x))
        return NULL;
    return out;
}
