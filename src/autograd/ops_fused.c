/* Fused transformer ops: multi-head attention over a packed qkv (the
 * blocked online-softmax kernel, kernels/attention.c) and bias + GELU.
 *
 * Both keep only what their backward cannot cheaply recompute: attention
 * keeps qkv, its output and one log-sum-exp per row (B*H*T floats, not the
 * (T, T) probabilities); bias + GELU keeps its input and the bias (x + b is
 * recomputed). A bf16/f16 input with an f32 bias is read as it is (no
 * widened copy), with the numbers of widening it. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <math.h>

/* ---- attention -------------------------------------------------------------------- */

typedef struct {
    const void *qkv; /* f32, or bf16/f16 (i[6]) read as it is */
    const float *y;  /* the f32 output (a bf16/f16 qkv: before its rounding) */
    float *lse;
    dt_attention_spec s; /* heads_total set; dropout_p 0 when not training */
} attn_saved;

/* i[0..3] = B, T, H, D, i[6] = qkv's dtype */
dt_status dt__bw_attn(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const attn_saved *a = n->saved[0];
    const dt_attention_spec *s = &a->s;
    const dt_dtype t = (dt_dtype)n->i[6];
    bool err = false; /* the shadow before grad_begin gives qkv its gradient */
    void *gs = dt__grad_shadow_maybe(ctx, n->in[0], t, &err);
    /* qkv's GEMM the gradient's one reader: written in t alone (decided before grad_begin) */
    const bool lp_only = gs && !err && dt__grad_shadow_only(ctx, n, n->in[0], t);
    float *g = err ? NULL : dt__grad_begin(ctx, n->in[0]);
    if (!g)
        return dt_last_status();
    const int64_t B = n->i[0], T = n->i[1], H = n->i[2], D = n->i[3];
    dt_status st = dt_k_attention_ex_bwd(t, a->qkv, a->y, a->lse, gout, B, T, H, D, s->head0, s->heads_total,
                                         s->causal, s->window, s->softcap, s->dropout_p, s->key, lp_only ? NULL : g,
                                         gs);
    if (st < 0 || (st = dt__grad_commit(ctx, n->in[0], g)) < 0)
        return st;
    if (gs)
        dt__grad_shadow_set(ctx, n->in[0], g, gs, t);
    if (lp_only && (st = dt__grad_f32_skipped(ctx, n->in[0])) < 0)
        return st;
    return DT_OK;
}

/* A bf16/f16 qkv (autocast's "lower": GPT-2's c_attn output, Llama's
 * dt_gqa_pack) is read as it is: the kernel widens its tiles, keeps the f32
 * output for the backward and writes the result rounded to qkv's dtype, and
 * the backward rounds dy and the qkv gradient as the casts' backward do.
 * The same bits as dt_cast to f32, the f32 op and dt_cast back, without the
 * two cast nodes and their passes over qkv and y. */
static dt_tensor *attention(dt_ctx *ctx, const char *op, dt_tensor *qkv, const dt_attention_spec *spec)
{
    DT__NEED(ctx, op, qkv);
    if (!spec) {
        dt_error(DT_ERR_NULL, "%s: the attention's description is NULL", op);
        return NULL;
    }
    dt_tensor *lp[1] = {qkv}; /* autocast "lower" (PyTorch's sdpa) */
    if (!dt__autocast(ctx, DT_OP_ATTENTION, 1, lp))
        return NULL;
    qkv = lp[0];
    const dt_dtype t = dt__is_lp(qkv) && !dt__blocked(qkv) ? qkv->dtype : DT_F32;
    if (t == DT_F32) {
        DT__LP_RUN(ctx, 1, lp, qkv->dtype, attention(ctx, op, lp[0], spec));
        DT__NEED_F32(ctx, op, qkv);
    }
    dt_attention_spec s = *spec;
    const int n_head = s.n_head;
    if (qkv->ndim != 3 || n_head <= 0 || qkv->shape[2] % (3 * (int64_t)n_head) != 0) {
        char b[64];
        dt_error(DT_ERR_SHAPE, "%s: qkv %s must be [B, T, 3C] with C a multiple of %d heads", op,
                 dt_tensor_shape_str(qkv, b, sizeof b), n_head);
        return NULL;
    }
    if (!s.heads_total)
        s.heads_total = n_head;
    if (!(s.dropout_p >= 0.0f && s.dropout_p < 1.0f) || s.window < 0 || !(s.softcap >= 0.0f) ||
        !isfinite(s.softcap) || (!s.causal && (s.window > 0 || s.softcap > 0.0f)) || s.head0 < 0 ||
        s.heads_total - n_head < s.head0) {
        dt_error(DT_ERR_INVALID_ARG, "%s: dropout %g (want [0, 1)), window %lld and soft cap %g (>= 0, with the "
                 "causal mask only), heads [%d, %d) of %d: not an attention", op, (double)s.dropout_p,
                 (long long)s.window, (double)s.softcap, s.head0, s.head0 + n_head, s.heads_total);
        return NULL;
    }
    if (!s.training)
        s.dropout_p = 0.0f;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head, D = C / H;
    const void *x = dt__cdata(ctx, qkv);
    dt_tensor *out = t == DT_F32 ? dt__out(ctx, 3, (int64_t[]){B, T, C}) : dt_tensor_empty(ctx, t, 3, (int64_t[]){B, T, C});
    float *y = !out ? NULL : t == DT_F32 ? out->data : dt_arena_alloc(ctx->arena, (size_t)(B * T * C) * 4 + 4);
    float *lse = dt_arena_alloc(ctx->arena, (size_t)(B * H * T > 0 ? B * H * T : 1) * sizeof(float));
    if (!x || !out || !y || !lse)
        return NULL;
    dt_status st = dt_k_attention_ex_fwd(t, x, B, T, H, D, s.head0, s.heads_total, s.causal, s.window, s.softcap,
                                         s.dropout_p, s.key, y, t == DT_F32 ? NULL : out->data, lse);
    if (st < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &qkv)) {
        attn_saved *a = dt_arena_alloc(ctx->arena, sizeof *a);
        dt__node *n = a ? dt__ag_record(ctx, DT_OP_ATTENTION, out, 1, &qkv) : NULL;
        if (!n)
            return NULL;
        *a = (attn_saved){.qkv = x, .y = y, .lse = lse, .s = s};
        n->saved[0] = a;
        n->i[0] = B, n->i[1] = T, n->i[2] = H, n->i[3] = D, n->i[6] = t;
    }
    return out;
}

dt_tensor *dt_attention_ex(dt_ctx *ctx, dt_tensor *qkv, const dt_attention_spec *s)
{
    return attention(ctx, "dt_attention_ex", qkv, s);
}

dt_tensor *dt_attention(dt_ctx *ctx, dt_tensor *qkv, int n_head, bool causal, float dropout_p, bool training,
                        dt_rng_key key)
{
    const dt_attention_spec s = {.n_head = n_head, .causal = causal, .dropout_p = dropout_p, .training = training,
                                 .key = key};
    return attention(ctx, "dt_attention", qkv, &s);
}

dt_tensor *dt_attention_heads(dt_ctx *ctx, dt_tensor *qkv, int n_head, int head0, int heads_total, bool causal,
                              float dropout_p, bool training, dt_rng_key key)
{
    /* heads_total 0 is the spec's "all": here a layer of no heads, refused */
    const dt_attention_spec s = {.n_head = n_head, .head0 = head0, .heads_total = heads_total ? heads_total : -1,
                                 .causal = causal, .dropout_p = dropout_p, .training = training, .key = key};
    return attention(ctx, "dt_attention", qkv, &s);
}

/* a window of T or more, or 0, without a cap gives dt_attention's bits (kernels.h) */
dt_tensor *dt_attention_window(dt_ctx *ctx, dt_tensor *qkv, int n_head, int64_t window, float softcap)
{
    const dt_attention_spec s = {.n_head = n_head, .causal = true, .window = window, .softcap = softcap};
    return attention(ctx, "dt_attention_window", qkv, &s);
}

/* ---- bias + GELU (tanh) ---------------------------------------------------------- */

/* saved[0] = x (contiguous), saved[1] = bias data or NULL; i[0] = rows, i[1] = cols,
 * i[2] = x's dtype (f32, or bf16/f16 read as it is: bias_gelu_lp), i[3] = the result's */
dt_status dt__bw_bias_gelu(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t R = n->i[0], N = n->i[1];
    dt_dtype t = (dt_dtype)n->i[2];
    dt_tensor *X = n->in[0], *bias = n->nin > 1 ? n->in[1] : NULL;
    bool err = false; /* the shadow before grad_begin gives X its gradient */
    void *gs = dt__rg(X) && X != bias ? dt__grad_shadow_maybe(ctx, X, t, &err) : NULL;
    if (err)
        return dt_last_status();
    /* (decided before grad_begin gives X a gradient) */
    const bool lp_only = gs && dt__grad_shadow_only(ctx, n, X, t);
    /* a rounded result's gradient as its producer wrote it in t (beside the
     * f32 values or alone: glp_alone), the values the kernel would round to */
    const void *gys = dt__grad_out_lp(ctx, n, t);
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gb = dt__rg(bias) ? dt_arena_alloc(ctx->arena, (size_t)N * sizeof(float)) : NULL;
    if ((dt__rg(X) && !gx) || (dt__rg(bias) && !gb))
        return dt_last_status();
    dt_status st = t == DT_F32
                       ? dt_k_bias_gelu_bwd(n->saved[0], n->saved[1], gout, R, N, gx, gb, DT_K_GELU_TANH)
                       : dt_k_bias_gelu_bwd_lp(t, n->saved[0], n->saved[1], gys ? NULL : gout, gys,
                                               n->i[3] != DT_F32, R, N, lp_only ? NULL : gx, gs, gb,
                                               DT_K_GELU_TANH);
    if (st < 0)
        return st;
    if (gx && (st = dt__grad_commit(ctx, X, gx)) < 0)
        return st;
    if (gs)
        dt__grad_shadow_set(ctx, X, gx, gs, t);
    if (lp_only && (st = dt__grad_f32_skipped(ctx, X)) < 0)
        return st;
    if (gb && (st = dt__grad_commit(ctx, bias, gb)) < 0)
        return st;
    return DT_OK;
}

static bool bias_gelu_shape_ok(const char *op, const dt_tensor *x, const dt_tensor *bias)
{
    if (x->ndim < 1 || (bias && (bias->ndim != 1 || bias->shape[0] != x->shape[x->ndim - 1]))) {
        dt__shape_error(op, "want x [..., N] and bias [N]", x, bias ? bias : x);
        return false;
    }
    return true;
}

static dt_tensor *bias_gelu_record(dt_ctx *ctx, dt_tensor *x, dt_tensor *bias, dt_tensor *out, const void *xd,
                                   const float *bd, int64_t R, int64_t N)
{
    dt_tensor *in[2] = {x, bias};
    int nin = bias ? 2 : 1;
    if (dt__ag_wants(ctx, nin, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_BIAS_GELU_TANH, out, nin, in);
        if (!n)
            return NULL;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = (void *)(uintptr_t)bd;
        n->i[0] = R, n->i[1] = N, n->i[2] = x->dtype, n->i[3] = out->dtype;
        /* a result rounded to x's dtype: the backward rounds its gradient to
         * that dtype first, so takes a producer's shadow instead, alone */
        n->glp_want = n->glp_alone = x->dtype != DT_F32 && out->dtype == x->dtype;
        n->glp_dtype = x->dtype;
    }
    return out;
}

/* x bf16/f16 with an f32 bias (an autocast GEMM's output and the layer's
 * own bias): the result is of dtype yt, f32 as widening x would give (or
 * x's dtype: the f32 result rounded, as a bf16 model's layer does), and x
 * is read as it is (dt_k_bias_gelu_fwd_lp) instead of through a widened
 * copy on the tape; the backward rounds x's gradient to its dtype as
 * dt_cast's would (and first the gradient of a rounded result). The same
 * bits as the widening path, one pass over x fewer each way. */
static dt_tensor *bias_gelu_lp(dt_ctx *ctx, const char *op, dt_tensor *x, dt_tensor *bias, dt_dtype yt)
{
    if (dt__blocked(bias) && !(bias = dt__plain(ctx, bias)))
        return NULL;
    if (!bias_gelu_shape_ok(op, x, bias))
        return NULL;
    int64_t N = x->shape[x->ndim - 1], R = N ? dt_tensor_numel(x) / N : 0;
    const void *xd = dt__cdata(ctx, x);
    const float *bd = dt__cdata(ctx, bias);
    dt_tensor *out = yt == DT_F32 ? dt__out(ctx, x->ndim, x->shape) : dt_tensor_empty(ctx, yt, x->ndim, x->shape);
    if (!xd || !bd || !out)
        return NULL;
    if (dt_k_bias_gelu_fwd_lp(x->dtype, xd, bd, R, N, out->data, yt, DT_K_GELU_TANH) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    return bias_gelu_record(ctx, x, bias, out, xd, bd, R, N);
}

dt_tensor *dt_bias_gelu_tanh(dt_ctx *ctx, dt_tensor *x, dt_tensor *bias)
{
    const char *op = "dt_bias_gelu_tanh";
    DT__NEED(ctx, op, x);
    if (dt__is_lp(x) && bias && bias->dtype == DT_F32)
        return bias_gelu_lp(ctx, op, x, bias, DT_F32);
    if (dt__is_lp(x) && bias && bias->dtype == x->dtype) {
        /* a bf16/f16 model's layer: the widened composition below, with x
         * read as it is: the bias widened (exact; its cast's backward rounds
         * the bias gradient as the composition's does), the f32 result
         * rounded to x's dtype in the kernel as the composition rounds it
         * (and its gradient in the backward), and x's gradient rounded in
         * the kernel (with its shadow) instead of by a cast of x (bit for
         * bit the same: test_lowp) */
        dt_tensor *bw = dt_cast(ctx, bias, DT_F32);
        return bw ? bias_gelu_lp(ctx, op, x, bw, x->dtype) : NULL;
    }
    dt_tensor *lp[2] = {x, bias}; /* other low precision: computed in f32, rounded once */
    DT__LP_RUN(ctx, 2, lp, dt__lp_result(2, lp), dt_bias_gelu_tanh(ctx, lp[0], lp[1]));
    DT__NEED_F32(ctx, op, x);
    if (bias && (!dt__check_f32(op, "bias", bias) || dt__blocked(bias)))
        return NULL;
    if (!bias_gelu_shape_ok(op, x, bias))
        return NULL;
    int64_t N = x->shape[x->ndim - 1], R = N ? dt_tensor_numel(x) / N : 0;
    const float *xd = dt__cdata(ctx, x), *bd = bias ? dt__cdata(ctx, bias) : NULL;
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    if (!xd || (bias && !bd) || !out)
        return NULL;
    if (dt_k_bias_gelu_fwd(xd, bd, R, N, out->data, DT_K_GELU_TANH) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    return bias_gelu_record(ctx, x, bias, out, xd, bd, R, N);
}
