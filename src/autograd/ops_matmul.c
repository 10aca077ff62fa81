/* matmul, linear (w [out, in]) and addmm (w [in, out], GPT-2 Conv1D).
 *
 * Both flatten the leading dims of the left operand into rows, so
 * x[B,T,K] @ w[K,N] is one [B*T,K] x [K,N] GEMM. Gradients accumulate
 * straight into the gradient buffers with beta = 1 (they are "+=" by
 * definition), so no temporaries are needed in backward.
 *
 * Low precision (precision.h): with both operands bf16 (or both f16) the
 * GEMMs take them as they are (dt_k_matmul: oneDNN's bf16 kernels with f32
 * accumulation where the CPU has them, else widened to f32 exactly) and the
 * result is rounded once to the operands' dtype: by oneDNN as it stores
 * (dt_k_matmul_batched_lp, no f32 result in memory, as PyTorch's bf16
 * matmul) where it has the native kernels (dtrain's AMX GEMM too), else by
 * a pass over an f32 result (the emulation writes f32). Backward
 * rounds the incoming gradient to that dtype (the gradient of a bf16
 * tensor is bf16, as PyTorch's) and runs the same low-precision GEMMs into
 * the f32 gradient buffers; when the op that produced the gradient already
 * wrote it in that dtype (a shadow, ag_impl.h), the GEMMs take that copy
 * and the rounding pass is skipped (dt_ag_stats counts both). Mixed dtypes promote to f32; under autocast
 * every floating operand is first cast to the autocast dtype. */
#include "autograd/ag_impl.h"
#include "autograd/ag_refetch.h"
#include "dtrain/kernels.h"

static int64_t lead_rows(const dt_tensor *x, int keep)
{
    int64_t r = 1;
    for (int i = 0; i < x->ndim - keep; i++)
        r *= x->shape[i];
    return r;
}

/* The operands' shared dtype when the GEMMs run in low precision (both
 * bf16 or both f16), else f32 (after the autocast casts in[] in place). */
static dt_dtype gemm_dtype(dt_ctx *ctx, dt_op op, int n, dt_tensor **in, bool *ok)
{
    *ok = dt__autocast(ctx, op, n, in);
    return *ok ? dt__lp_result(2, in) : DT_F32;
}

/* n's output gradient gout (m elements) in dtype t for the backward GEMMs:
 * the copy its producer wrote in t (dt__grad_shadow), else gout rounded to t
 * in arena memory by a pass of its own. Either holds the same values. */
static const void *grad_lp(dt_ctx *ctx, const dt__node *n, const float *gout, int64_t m, dt_dtype t)
{
    const void *s = dt__grad_out_lp(ctx, n, t);
    if (s) {
        ctx->ag_stats.grad_shadows++;
        return s;
    }
    void *g = dt_arena_alloc(ctx->arena, (size_t)m * 2 + 2);
    if (g && dt_k_convert(gout, DT_F32, g, t, m) < 0)
        return NULL;
    dt__grad_scratch(ctx, g, (size_t)m * 2 + 2); /* dead when n's backward ends */
    ctx->ag_stats.grad_rounds++;
    ctx->ag_stats.grad_round_elems += (uint64_t)m;
    return g;
}

/* The f32 result C (m elements) rounded into out (dtype t). */
static bool store_lp(dt_tensor *out, const float *C, int64_t m)
{
    return dt_k_convert(C, DT_F32, out->data, out->dtype, m) >= 0;
}

/* Low-precision backward of matmul: i[5] = dtype. */
static dt_status matmul_backward_lp(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const void *A = n->saved[0], *B = n->saved[1];
    int64_t batch = n->i[0], M = n->i[1], K = n->i[2], N = n->i[3];
    bool b2d = n->i[4] != 0;
    dt_dtype t = (dt_dtype)n->i[5];
    const void *G = grad_lp(ctx, n, gout, batch * M * N, t);
    if (!G)
        return dt_last_status();
    float beta;
    dt_status st = DT_OK;
    if (dt__rg(n->in[0])) {
        float *ga = dt__grad_gemm(ctx, n->in[0], &beta);
        if (!ga)
            return dt_last_status();
        st = b2d ? dt_k_matmul(false, true, batch * M, K, N, 1.0f, G, B, t, beta, ga, NULL)
                 : dt_k_matmul_batched(false, true, batch, M, K, N, 1.0f, G, M * N, B, K * N, t, beta, ga,
                                       M * K, NULL);
        if (st < 0)
            return st;
    }
    if (dt__rg(n->in[1])) {
        float *gb = dt__grad_gemm(ctx, n->in[1], &beta);
        if (!gb)
            return dt_last_status();
        st = b2d ? dt_k_matmul(true, false, K, N, batch * M, 1.0f, A, G, t, beta, gb, NULL)
                 : dt_k_matmul_batched(true, false, batch, K, N, M, 1.0f, A, M * K, G, M * N, t, beta, gb,
                                       K * N, NULL);
    }
    return st;
}

/* saved[0] = A data (contiguous), saved[1] = B data; i[0] = batch, i[1..3] = M,K,N */
dt_status dt__bw_matmul(dt_ctx *ctx, dt__node *n, const float *gout)
{
    if (n->i[5] != DT_F32)
        return matmul_backward_lp(ctx, n, gout);
    const float *A = n->saved[0], *B = n->saved[1];
    int64_t batch = n->i[0], M = n->i[1], K = n->i[2], N = n->i[3];
    bool b2d = n->i[4] != 0;
    float beta;
    if (dt__rg(n->in[0])) {
        float *ga = dt__grad_gemm(ctx, n->in[0], &beta);
        if (!ga)
            return dt_last_status();
        if (b2d) /* gA = gout @ B^T, all rows at once */
            dt__gemm(false, true, batch * M, K, N, 1.0f, gout, N, B, N, beta, ga, K);
        else
            for (int64_t t = 0; t < batch; t++)
                dt__gemm(false, true, M, K, N, 1.0f, gout + t * M * N, N, B + t * K * N, N, beta,
                         ga + t * M * K, K);
    }
    if (dt__rg(n->in[1])) {
        float *gb = dt__grad_gemm(ctx, n->in[1], &beta);
        if (!gb)
            return dt_last_status();
        if (b2d) /* gB = A^T @ gout over all rows */
            dt__gemm(true, false, K, N, batch * M, 1.0f, A, K, gout, N, beta, gb, N);
        else
            for (int64_t t = 0; t < batch; t++)
                dt__gemm(true, false, K, N, M, 1.0f, A + t * M * K, K, gout + t * M * N, N,
                         beta, gb + t * K * N, N);
    }
    return DT_OK;
}

dt_tensor *dt_matmul(dt_ctx *ctx, dt_tensor *a, dt_tensor *b)
{
    const char *op = "dt_matmul";
    DT__NEED(ctx, op, a);
    DT__NEED(ctx, op, b);
    dt_tensor *lp[2] = {a, b};
    bool ok;
    dt_dtype t = gemm_dtype(ctx, DT_OP_MATMUL, 2, lp, &ok);
    if (!ok)
        return NULL;
    a = lp[0], b = lp[1];
    if (t == DT_F32) /* f32, or mixed dtypes: promoted */
        DT__LP_RUN(ctx, 2, lp, DT_F32, dt_matmul(ctx, lp[0], lp[1]));
    if ((t == DT_F32 && (!dt__check_f32(op, "a", a) || !dt__check_f32(op, "b", b))))
        return NULL;
    if (a->ndim < 2 || b->ndim < 2) {
        dt__shape_error(op, "both operands need at least 2 dims", a, b);
        return NULL;
    }
    int64_t M = a->shape[a->ndim - 2], K = a->shape[a->ndim - 1];
    int64_t K2 = b->shape[b->ndim - 2], N = b->shape[b->ndim - 1];
    if (K != K2) {
        dt__shape_error(op, "inner dims differ", a, b);
        return NULL;
    }
    bool b2d = b->ndim == 2;
    if (!b2d) {
        bool same = b->ndim == a->ndim;
        for (int i = 0; same && i < a->ndim - 2; i++)
            same = a->shape[i] == b->shape[i];
        if (!same) {
            dt__shape_error(op, "batch dims differ (b must be 2-D or have a's batch dims)", a,
                            b);
            return NULL;
        }
    }
    int64_t batch = lead_rows(a, 2);
    int64_t sh[DT_MAX_DIMS];
    for (int i = 0; i < a->ndim; i++)
        sh[i] = a->shape[i];
    sh[a->ndim - 1] = N;
    const float *A = dt__cdata(ctx, a), *B = dt__cdata(ctx, b);
    dt_tensor *out = dt_tensor_empty(ctx, t, a->ndim, sh);
    if (!A || !B || !out)
        return NULL;
    if (t != DT_F32 && dt_k_matmul_writes_lp(t)) { /* oneDNN rounds its f32 sums into out */
        if (dt_k_matmul_batched_lp(false, false, b2d ? 1 : batch, b2d ? batch * M : M, N, K, 1.0f, A, b2d ? 0 : M * K,
                                   B, b2d ? 0 : K * N, t, out->data, b2d ? 0 : M * N, NULL) < 0) {
            dt_error_wrap(dt_last_status(), "%s", op);
            return NULL;
        }
    } else if (t != DT_F32) {
        int64_t m = dt_tensor_numel(out);
        float *C = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(float) + 4);
        if (!C)
            return NULL;
        dt_status st = b2d ? dt_k_matmul(false, false, batch * M, N, K, 1.0f, A, B, t, 0.0f, C, NULL)
                           : dt_k_matmul_batched(false, false, batch, M, N, K, 1.0f, A, M * K, B, K * N, t, 0.0f,
                                                 C, M * N, NULL);
        if (st < 0 || !store_lp(out, C, m)) {
            dt_error_wrap(dt_last_status(), "%s", op);
            return NULL;
        }
    }
    float *C = out->data;
    if (t == DT_F32 && b2d)
        dt__gemm(false, false, batch * M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    else if (t == DT_F32)
        for (int64_t j = 0; j < batch; j++)
            dt__gemm(false, false, M, N, K, 1.0f, A + j * M * K, K, B + j * K * N, N, 0.0f,
                     C + j * M * N, N);
    dt_tensor *in[2] = {a, b};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_MATMUL, out, 2, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)A;
        n->saved[1] = (void *)(uintptr_t)B;
        n->i[0] = batch;
        n->i[1] = M;
        n->i[2] = K;
        n->i[3] = N;
        n->i[4] = b2d;
        n->i[5] = t;
        n->glp_want = t != DT_F32; /* grad_lp: a producer's shadow of the gradient saves its pass */
        n->glp_dtype = t;
    }
    return out;
}

/* ---- linear and addmm: one dense layer, two weight layouts ------------------------ */

/* linear: w stored [out, in], y = x w^T + b. addmm: w stored [in, out]
 * (GPT-2's Conv1D), y = x w + b. wt says which (true = [out, in]).
 * saved[0] = X [R, In] (NULL when saved[2], a dt__refetch, fetches it
 * again), saved[1] = W; i[0] = R, i[1] = In, i[2] = Out, i[3] = GEMM
 * dtype, i[4] = wt, i[5] = the row count varies (dt_ctx_set_varying) */
static dt_status bw_dense_run(dt_ctx *ctx, dt__node *n, const float *gout, const float *X)
{
    const float *W = n->saved[1];
    int64_t R = n->i[0], In = n->i[1], Out = n->i[2];
    dt_dtype t = (dt_dtype)n->i[3];
    bool wt = n->i[4] != 0;
    const void *G = t == DT_F32 ? gout : grad_lp(ctx, n, gout, R * Out, t);
    if (!G)
        return dt_last_status();
    float beta;
    dt_status st;
    if (dt__rg(n->in[0])) { /* gX = g W (linear) or g W^T (addmm) */
        dt_tensor *x = n->in[0];
        /* x's gradient in t alone, rounded as the GEMM stores it, where x's
         * own backward takes it in t and reads that alone (a rounded bias +
         * GELU's or layer norm's: it would round the f32 values itself) and
         * nothing else does; decided before x has a gradient. Only where
         * the GEMM writes t itself: elsewhere its f32 result would be
         * rounded by a pass of its own, one pass more than the reader's */
        const bool lp_only = t != DT_F32 && dt_k_matmul_writes_lp(t) && dt__grad_shadow_only(ctx, n, x, t);
        void *gs = lp_only ? dt__grad_shadow_new(ctx, x, t) : NULL;
        float *gx = !lp_only || gs ? dt__grad_gemm(ctx, x, &beta) : NULL;
        if (!gx)
            return dt_last_status();
        if (t == DT_F32)
            dt__gemm(false, !wt, R, In, Out, 1.0f, gout, Out, W, wt ? In : Out, beta, gx, In);
        else if ((st = lp_only ? dt_k_matmul_batched_lp(false, !wt, 1, R, In, Out, 1.0f, G, 0, W, 0, t, gs, 0, NULL)
                               : dt_k_matmul(false, !wt, R, In, Out, 1.0f, G, W, t, beta, gx, NULL)) < 0)
            return st;
        if (lp_only) {
            dt__grad_shadow_set(ctx, x, gx, gs, t);
            if ((st = dt__grad_f32_skipped(ctx, x)) < 0)
                return st;
        }
    }
    void *gwl = t != DT_F32 && dt__rg(n->in[1]) ? dt__grad_gemm_lp(ctx, n->in[1], t) : NULL;
    /* else a tied table's (its other uses lookups): rounded as stored but for the looked-up rows */
    float *gwa = NULL;
    const int32_t *keep = NULL;
    const int split = !gwl && t != DT_F32 && dt__rg(n->in[1])
                         ? dt__grad_gemm_rows(ctx, n, n->in[1], t, wt ? Out : In, wt ? In : Out, R, &gwl, &gwa, &keep)
                         : 0;
    if (split < 0)
        return split;
    if (gwl) { /* the weight's only contribution (or the tied table's), rounded into its gradient as it is
                * stored and checked */
        bool finite;
        if (split)
            st = wt ? dt_k_matmul_lp_rows(true, false, Out, In, R, G, X, t, gwl, keep, gwa, &finite)
                    : dt_k_matmul_lp_rows(true, false, In, Out, R, X, G, t, gwl, keep, gwa, &finite);
        else
            st = wt ? dt_k_matmul_lp_checked(true, false, Out, In, R, G, X, t, gwl, &finite)
                    : dt_k_matmul_lp_checked(true, false, In, Out, R, X, G, t, gwl, &finite);
        if (st < 0)
            return st;
        if (split)
            dt__grad_gemm_rows_done(n->in[1], finite);
        else
            dt__grad_gemm_lp_done(n->in[1], finite);
    } else if (dt__rg(n->in[1])) { /* gW = g^T X [out, in] (linear) or X^T g [in, out] (addmm) */
        float *gw = dt__grad_gemm(ctx, n->in[1], &beta);
        if (!gw)
            return dt_last_status();
        if (t == DT_F32 && wt)
            dt__gemm(true, false, Out, In, R, 1.0f, gout, Out, X, In, beta, gw, In);
        else if (t == DT_F32)
            dt__gemm(true, false, In, Out, R, 1.0f, X, In, gout, Out, beta, gw, Out);
        else if ((st = wt ? dt_k_matmul(true, false, Out, In, R, 1.0f, G, X, t, beta, gw, NULL)
                          : dt_k_matmul(true, false, In, Out, R, 1.0f, X, G, t, beta, gw, NULL)) < 0)
            return st;
    }
    if (n->nin > 2 && dt__rg(n->in[2])) { /* gb = column sums of g, row order fixed */
        /* g's shadow holds g's values (ag_impl.h): summed widened, the same
         * bits from half the bytes */
        const void *gs = t == DT_F32 ? NULL : dt__grad_shadow(ctx, n->out, t);
        float *gb = dt__grad(ctx, n->in[2]);
        if (!gb)
            return dt_last_status();
        if ((st = gs ? dt_k_sum_rows_acc_lp(t, gs, R, Out, gb) : dt_k_sum_rows_acc(gout, R, Out, gb)) < 0)
            return st;
    }
    return DT_OK;
}

/* bw_dense_run with the products marked varying where the forward's were */
static dt_status bw_dense(dt_ctx *ctx, dt__node *n, const float *gout, const float *X)
{
    const bool vary = n->i[5] != 0, was = vary && dt_k_matmul_set_varying(true);
    dt_status st = bw_dense_run(ctx, n, gout, X);
    if (vary)
        dt_k_matmul_set_varying(was);
    return st;
}

dt_status dt__bw_dense(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt__refetch *r = n->saved[2];
    if (!r || !dt__rg(n->in[1])) /* X is read only for the weight's gradient */
        return bw_dense(ctx, n, gout, n->saved[0]);
    const float *X = r->get(ctx, r, n->in[0]->dtype);
    if (!X)
        return dt_last_status() < 0 ? dt_last_status() : dt_error(DT_ERR_STATE, "dt_linear backward: no input");
    dt_status st = bw_dense(ctx, n, gout, X);
    r->put(ctx, r);
    return st;
}

bool dt__dense_refetch(dt_ctx *ctx, dt_tensor *y, const dt_tensor *x, dt__refetch *r)
{
    dt__node *n = y && x && r ? y->node_ : NULL;
    if (!n || n->out != y || (n->op != DT_OP_LINEAR && n->op != DT_OP_ADDMM) || n->saved[2])
        return false;
    dt_tensor *in = n->in[0];
    const bool cast = in != x; /* autocast's copy of x in the GEMM's dtype */
    if (cast && !(in->node_ && in->node_->op == DT_OP_CAST && in->node_->in[0] == x))
        return false;
    if (n->saved[0] != in->data || !dt_tensor_is_contiguous(in)) /* the product read a copy of its own */
        return false;
    n->saved[0] = NULL;
    n->saved[2] = r;
    if (cast) /* its backward reads no values */
        dt_arena_give_back(ctx->arena, in->data, dt_tensor_nbytes(in));
    return true;
}

/* dense's product into out (R x Out, dtype t): x W^T or x W, plus the bias,
 * marked varying where the context says (dt_ctx_set_varying). false after
 * an error (reported, naming op). */
static bool dense_product(dt_ctx *ctx, const char *op, bool wt, int64_t R, int64_t In, int64_t Out, const float *X,
                          const float *W, const float *Bv, dt_dtype t, dt_tensor *out)
{
    const bool vary = ctx->shapes_vary, was = vary && dt_k_matmul_set_varying(true);
    bool ok = true;
    float *Y = out->data;
    if (t != DT_F32 && dt_k_matmul_writes_lp(t)) { /* oneDNN rounds its f32 sums (bias added) into out */
        ok = dt_k_matmul_batched_lp(false, wt, 1, R, Out, In, 1.0f, X, 0, W, 0, t, out->data, 0, Bv) >= 0;
    } else if (t != DT_F32) { /* low precision: f32 result in scratch, rounded once */
        int64_t m = dt_tensor_numel(out);
        Y = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(float) + 4);
        ok = Y && dt_k_matmul(false, wt, R, Out, In, 1.0f, X, W, t, 0.0f, Y, Bv) >= 0 && store_lp(out, Y, m);
    } else if (R == 0 || Out == 0 || In == 0 || /* one oneDNN call with the bias fused, or the reference */
               dt_k_matmul(false, wt, R, Out, In, 1.0f, X, W, DT_F32, 0.0f, Y, Bv) != DT_OK) {
        dt__gemm(false, wt, R, Out, In, 1.0f, X, In, W, wt ? In : Out, 0.0f, Y, Out);
        if (Bv)
            for (int64_t r = 0; r < R; r++)
                for (int64_t j = 0; j < Out; j++)
                    Y[r * Out + j] += Bv[j];
    }
    if (vary)
        dt_k_matmul_set_varying(was);
    if (!ok && Y)
        dt_error_wrap(dt_last_status(), "%s", op);
    return ok;
}

static dt_tensor *dense(dt_ctx *ctx, const char *op, dt_op kind, bool wt, dt_tensor *x, dt_tensor *w,
                        dt_tensor *bias)
{
    DT__NEED(ctx, op, x);
    DT__NEED(ctx, op, w);
    dt_tensor *lp[3] = {x, w, bias};
    bool ok;
    dt_dtype t = gemm_dtype(ctx, kind, bias ? 3 : 2, lp, &ok);
    if (!ok)
        return NULL;
    x = lp[0], w = lp[1], bias = lp[2];
    if (t == DT_F32) /* f32, or mixed dtypes: promoted */
        DT__LP_RUN(ctx, 3, lp, DT_F32, dense(ctx, op, kind, wt, lp[0], lp[1], lp[2]));
    if (t == DT_F32 && (!dt__check_f32(op, "x", x) || !dt__check_f32(op, "weight", w)))
        return NULL;
    if (bias && !dt_dtype_is_float(bias->dtype)) {
        dt__check_f32(op, "bias", bias);
        return NULL;
    }
    int64_t In = w->ndim == 2 ? w->shape[wt ? 1 : 0] : -1, Out = w->ndim == 2 ? w->shape[wt ? 0 : 1] : -1;
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != In) {
        dt__shape_error(op, wt ? "x [..., in] and weight [out, in] do not match"
                               : "x [..., in] and weight [in, out] do not match", x, w);
        return NULL;
    }
    if (bias && (bias->ndim != 1 || bias->shape[0] != Out)) {
        dt__shape_error(op, wt ? "weight [out, in] and bias [out] do not match"
                               : "weight [in, out] and bias [out] do not match", w, bias);
        return NULL;
    }
    int64_t R = lead_rows(x, 1);
    int64_t sh[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        sh[i] = x->shape[i];
    sh[x->ndim - 1] = Out;
    const float *X = dt__cdata(ctx, x), *W = dt__cdata(ctx, w);
    const float *Bv = bias ? dt__cdata_f32(ctx, bias) : NULL;
    dt_tensor *out = dt_tensor_empty(ctx, t, x->ndim, sh);
    if (!X || !W || (bias && !Bv) || !out)
        return NULL;
    if (!dense_product(ctx, op, wt, R, In, Out, X, W, Bv, t, out))
        return NULL;
    dt_tensor *in[3] = {x, w, bias};
    int nin = bias ? 3 : 2;
    if (dt__ag_wants(ctx, nin, in)) {
        dt__node *n = dt__ag_record(ctx, kind, out, nin, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)X;
        n->saved[1] = (void *)(uintptr_t)W;
        n->i[0] = R;
        n->i[1] = In;
        n->i[2] = Out;
        n->i[3] = t;
        n->i[4] = wt;
        n->i[5] = ctx->shapes_vary;
        /* grad_lp: a producer's shadow of the gradient saves its pass; bw_dense reads it alone */
        n->glp_want = n->glp_alone = t != DT_F32;
        n->glp_dtype = t;
    }
    return out;
}

dt_tensor *dt_linear(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias)
{
    return dense(ctx, "dt_linear", DT_OP_LINEAR, true, x, w, bias);
}

dt_tensor *dt_addmm(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias)
{
    return dense(ctx, "dt_addmm", DT_OP_ADDMM, false, x, w, bias);
}
