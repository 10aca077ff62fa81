/* dt_cast, autocast and the low-precision helpers every op uses.
 *
 * One rule for low precision (precision.h): an op that is not a GEMM
 * (matmul, linear, conv2d: ops_matmul.c, ops_conv.c) and gets bf16/f16
 * inputs widens them with dt_cast to f32, runs its f32 code, and rounds the
 * result with dt_cast back to the result dtype. That is exactly "read low
 * precision, accumulate in f32, round once", and the backward needs no code
 * of its own: the casts are nodes on the tape. The price is one extra pass
 * over the data per cast (the conversion kernels are vectorised,
 * src/kernels/convert.c), cheap next to the GEMMs that dominate a step.
 * Where those passes showed in the ConvNet's bf16 step, ops compute the same
 * numbers without them: relu (dt_k_relu_*_lp, converting block by block in
 * cache) and max_pool2d (no cast nodes, pool_backward rounds); in GPT-2's,
 * bias + GELU on a bf16/f16 input with an f32 bias (dt_k_bias_gelu_*_lp)
 * and the add of an f32 and a bf16/f16 tensor of one shape (dt_k_add_lp,
 * its backward dt_k_grad_round_lp): the residual stream's adds.
 *
 * Gradients stay f32 buffers; dt_cast's backward rounds the gradient to the
 * input's dtype when that is bf16/f16, so the gradient of a low-precision
 * tensor holds values of its dtype (PyTorch's bf16 grads), and only then
 * adds it.
 *
 * Which ops autocast lowers is the amp column of the op table (op_table.c). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"
#include "dtrain/precision.h"

#include <string.h>

/* ---- autocast (the classes are in the op table, op_table.c) -------------------- */

bool dt_dtype_is_float(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

dt_status dt_autocast_set(dt_ctx *ctx, dt_dtype dtype, dt_dtype *prev)
{
    if (!ctx)
        return dt_error(DT_ERR_NULL, "dt_autocast_set: context is NULL");
    if (!dt_dtype_is_float(dtype))
        return dt_error(DT_ERR_DTYPE, "dt_autocast_set: dtype %s; want bf16 or f16 (on) or f32 (off)",
                        dt_dtype_name(dtype));
    if (prev)
        *prev = ctx->autocast;
    ctx->autocast = dtype;
    return DT_OK;
}

dt_dtype dt_autocast_dtype(const dt_ctx *ctx) { return ctx ? ctx->autocast : DT_F32; }

/* ---- helpers for the ops --------------------------------------------------------- */

dt_dtype dt__lp_result(int n, dt_tensor *const *in)
{
    dt_dtype r = DT_F32;
    bool any = false;
    for (int i = 0; i < n; i++) {
        if (!in[i] || !dt_dtype_is_float(in[i]->dtype))
            continue;
        if (in[i]->dtype == DT_F32)
            return DT_F32;
        if (any && in[i]->dtype != r)
            return DT_F32; /* bf16 with f16: f32, as PyTorch promotes */
        r = in[i]->dtype;
        any = true;
    }
    return r;
}

bool dt__any_lp(int n, dt_tensor *const *in)
{
    for (int i = 0; i < n; i++)
        if (dt__is_lp(in[i]))
            return true;
    return false;
}

bool dt__widen_all(dt_ctx *ctx, int n, dt_tensor **in)
{
    for (int i = 0; i < n; i++)
        if (dt__is_lp(in[i]) && !(in[i] = dt_cast(ctx, in[i], DT_F32)))
            return false;
    return true;
}

dt_tensor *dt__lp_round(dt_ctx *ctx, dt_tensor *y, dt_dtype dtype)
{
    if (!y || dtype == DT_F32 || y->dtype == dtype)
        return y;
    return dt_cast(ctx, y, dtype);
}

bool dt__autocast(dt_ctx *ctx, dt_op op, int n, dt_tensor **in)
{
    dt_dtype ac = ctx->autocast;
    if (ac == DT_F32 || dt__op_table[op].amp != DT_AMP_LOWER)
        return true;
    for (int i = 0; i < n; i++) /* every floating input (f16 too under bf16) */
        if (in[i] && dt_dtype_is_float(in[i]->dtype) && in[i]->dtype != ac && !(in[i] = dt_cast(ctx, in[i], ac)))
            return false;
    return true;
}

const float *dt__cdata_f32(dt_ctx *ctx, const dt_tensor *x)
{
    if (x->dtype == DT_F32)
        return dt__cdata(ctx, x);
    const void *src = dt_tensor_is_contiguous(x) ? x->data : NULL;
    if (!src) {
        void *tmp = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(x));
        if (!tmp || dt_tensor_read(x, tmp) < 0)
            return NULL;
        src = tmp;
    }
    int64_t m = dt_tensor_numel(x);
    float *out = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(float));
    if (!out || dt_k_convert(src, x->dtype, out, DT_F32, m) < 0)
        return NULL;
    return out;
}

dt_status dt__round_to(dt_dtype dtype, const float *x, float *y, int64_t n)
{
    return dt__round_to_lp(dtype, x, y, NULL, n);
}

dt_status dt__round_to_lp(dt_dtype dtype, const float *x, float *y, void *lp, int64_t n)
{
    enum { BLK = 4096 };
    const int64_t nb = (n + BLK - 1) / BLK;
    int bad = 0;
#pragma omp parallel for schedule(static) if (nb > 16) reduction(| : bad)
    for (int64_t b = 0; b < nb; b++) {
        uint16_t buf[BLK];
        int64_t i = b * BLK, c = n - i < BLK ? n - i : BLK;
        uint16_t *tmp = lp ? (uint16_t *)lp + i : buf;
        bad |= dt_k_convert(x + i, DT_F32, tmp, dtype, c) < 0 || dt_k_convert(tmp, dtype, y + i, DT_F32, c) < 0;
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", "dt__round_to") : DT_OK;
}

/* ---- dt_cast ------------------------------------------------------------------------ */

dt_status dt__bw_cast(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *x = n->in[0];
    int64_t m = dt_tensor_numel(x);
    /* a bf16/f16 input whose own op takes its gradient in its dtype (an
     * embedding's, a GEMM's) gets the rounded values in that dtype too (the
     * shadow: the same pass; first, as grad_begin gives x its gradient) */
    bool err = false;
    void *gs = x->dtype != DT_F32 ? dt__grad_shadow_maybe(ctx, x, x->dtype, &err) : NULL;
    float *gx = err ? NULL : dt__grad_begin(ctx, x);
    if (!gx)
        return dt_last_status();
    /* the gradient of a low-precision tensor holds values of its dtype:
     * round to the output's dtype (the summed gradient of a bf16 result),
     * then to the input's (a bf16 input's gradient) */
    dt_status st = DT_OK;
    const float *g = gout;
    if (n->out->dtype != DT_F32) {
        st = dt__round_to(n->out->dtype, g, gx, m);
        g = gx;
    }
    if (st >= 0 && x->dtype != DT_F32)
        st = dt__round_to_lp(x->dtype, g, gx, gs, m);
    else if (st >= 0 && g != gx)
        memcpy(gx, g, (size_t)m * sizeof(float));
    if (st >= 0)
        st = dt__grad_commit(ctx, x, gx);
    if (st >= 0 && gs)
        dt__grad_shadow_set(ctx, x, gx, gs, x->dtype);
    return st;
}

dt_tensor *dt_cast(dt_ctx *ctx, dt_tensor *x, dt_dtype dtype)
{
    const char *op = "dt_cast";
    DT__NEED_ANY(ctx, op, x); /* element by element: a blocked layout is kept */
    if (!dt_dtype_is_float(x->dtype) || !dt_dtype_is_float(dtype)) {
        char s[96];
        dt_error(DT_ERR_DTYPE, "%s: %s %s to %s; casts go between f32, bf16 and f16", op,
                 dt_tensor_shape_str(x, s, sizeof s), dt_dtype_name(x->dtype), dt_dtype_name(dtype));
        return NULL;
    }
    if (x->dtype == dtype)
        return x;
    dt_tensor *out = dt_tensor_empty(ctx, dtype, x->ndim, x->shape);
    if (!out)
        return NULL;
    const void *src = x->data;
    if (!dt_tensor_is_contiguous(x)) {
        void *tmp = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(x));
        if (!tmp || dt_tensor_read(x, tmp) < 0)
            return NULL;
        src = tmp;
    }
    if (dt_k_convert(src, x->dtype, out->data, dtype, dt_tensor_numel(x)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    out->name = x->name;
    out->flags |= dt__block_flag(dt_tensor_block(x));
    if (dt__ag_wants(ctx, 1, &x) && !dt__ag_record(ctx, DT_OP_CAST, out, 1, &x))
        return NULL;
    return out;
}

bool dt_precision_native(dt_dtype t) { return dt_k_matmul_native(t); }

dt_dtype dt_precision_auto(const char **why)
{
    const char *w;
    dt_dtype t = DT_F32;
    if (!dt_cpu_detect_hw().avx512_bf16)
        w = "no AVX512_BF16 on this CPU";
    else if (!dt_cpu_detect().avx512_bf16)
        w = "AVX512_BF16 switched off by DT_MAX_CPU_ISA";
    else if (!dt_precision_native(DT_BF16))
        w = "oneDNN runs no native bf16 matmul here: ONEDNN_MAX_CPU_ISA caps it";
    else
        w = "this CPU has AVX512_BF16", t = DT_BF16;
    if (why)
        *why = w;
    return t;
}
