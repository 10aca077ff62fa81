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
    dt_rng_key key;
    float p;
    int64_t window; /* dt_attention_window's: > 0 a sliding window, */
    float softcap;  /* > 0 a soft cap */
    bool windowed;  /* dt_attention_window (kernels.h's dt_k_attention_window_*) */
    bool causal;
} attn_saved;

/* i[0..5] = B, T, H, D, h0, Ht, i[6] = qkv's dtype */
dt_status dt__bw_attn(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const attn_saved *s = n->saved[0];
    const dt_dtype t = (dt_dtype)n->i[6];
    bool err = false; /* the shadow before grad_begin gives qkv its gradient */
    void *gs = dt__grad_shadow_maybe(ctx, n->in[0], t, &err);
    float *g = err ? NULL : dt__grad_begin(ctx, n->in[0]);
    if (!g)
        return dt_last_status();
    const int64_t B = n->i[0], T = n->i[1], H = n->i[2], D = n->i[3];
    dt_status st;
    if (s->windowed)
        st = t == DT_F32 ? dt_k_attention_window_bwd(s->qkv, s->y, s->lse, gout, B, T, H, D, s->window, s->softcap, g)
                         : dt_k_attention_window_bwd_lp(t, s->qkv, s->y, s->lse, gout, B, T, H, D, s->window,
                                                        s->softcap, g, gs);
    else
        st = t == DT_F32 ? dt_k_attention_bwd_heads(s->qkv, s->y, s->lse, gout, B, T, H, D, n->i[4], n->i[5],
                                                    s->causal, s->p, s->key, g)
                         : dt_k_attention_bwd_heads_lp(t, s->qkv, s->y, s->lse, gout, B, T, H, D, n->i[4], n->i[5],
                                                       s->causal, s->p, s->key, g, gs);
    if (st < 0 || (st = dt__grad_commit(ctx, n->in[0], g)) < 0)
        return st;
    if (gs)
        dt__grad_shadow_set(ctx, n->in[0], g, gs, t);
    return DT_OK;
}

dt_tensor *dt_attention(dt_ctx *ctx, dt_tensor *qkv, int n_head, bool causal, float dropout_p, bool training,
                        dt_rng_key key)
{
    return dt_attention_heads(ctx, qkv, n_head, 0, n_head, causal, dropout_p, training, key);
}

/* A bf16/f16 qkv (autocast's "lower": GPT-2's c_attn output, Llama's
 * dt_gqa_pack) is read as it is: the kernel widens its tiles, keeps the f32
 * output for the backward and writes the result rounded to qkv's dtype, and
 * the backward rounds dy and the qkv gradient as the casts' backward do.
 * The same bits as dt_cast to f32, the f32 op and dt_cast back, without the
 * two cast nodes and their passes over qkv and y. windowed:
 * dt_attention_window's kernels (kernels.h, dt_k_attention_window_fwd and
 * _lp: the blocked kernel) with its window and soft cap, a bf16/f16 qkv
 * read as it is there too. */
static dt_tensor *attention(dt_ctx *ctx, const char *op, dt_tensor *qkv, int n_head, int head0, int heads_total,
                            bool causal, float dropout_p, bool training, dt_rng_key key, bool windowed,
                            int64_t window, float softcap)
{
    DT__NEED(ctx, op, qkv);
    dt_tensor *lp[1] = {qkv}; /* autocast "lower" (PyTorch's sdpa) */
    if (!dt__autocast(ctx, DT_OP_ATTENTION, 1, lp))
        return NULL;
    qkv = lp[0];
    const dt_dtype t = dt__is_lp(qkv) && !dt__blocked(qkv) ? qkv->dtype : DT_F32;
    if (t == DT_F32) {
        DT__LP_RUN(ctx, 1, lp, qkv->dtype,
                   attention(ctx, op, lp[0], n_head, head0, heads_total, causal, dropout_p, training, key, windowed,
                             window, softcap));
        DT__NEED_F32(ctx, op, qkv);
    }
    if (qkv->ndim != 3 || n_head <= 0 || qkv->shape[2] % (3 * (int64_t)n_head) != 0) {
        char s[64];
        dt_error(DT_ERR_SHAPE, "%s: qkv %s must be [B, T, 3C] with C a multiple of %d heads", op,
                 dt_tensor_shape_str(qkv, s, sizeof s), n_head);
        return NULL;
    }
    if (!(dropout_p >= 0.0f && dropout_p < 1.0f)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: dropout probability %g is outside [0, 1)", op, (double)dropout_p);
        return NULL;
    }
    float p = training ? dropout_p : 0.0f;
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head, D = C / H;
    const void *x = dt__cdata(ctx, qkv);
    dt_tensor *out = t == DT_F32 ? dt__out(ctx, 3, (int64_t[]){B, T, C}) : dt_tensor_empty(ctx, t, 3, (int64_t[]){B, T, C});
    float *y = !out ? NULL : t == DT_F32 ? out->data : dt_arena_alloc(ctx->arena, (size_t)(B * T * C) * 4 + 4);
    float *lse = dt_arena_alloc(ctx->arena, (size_t)(B * H * T > 0 ? B * H * T : 1) * sizeof(float));
    if (!x || !out || !y || !lse)
        return NULL;
    dt_status st;
    if (windowed)
        st = t == DT_F32 ? dt_k_attention_window_fwd(x, B, T, H, D, window, softcap, y, lse)
                         : dt_k_attention_window_fwd_lp(t, x, B, T, H, D, window, softcap, y, out->data, lse);
    else
        st = t == DT_F32 ? dt_k_attention_fwd_heads(x, B, T, H, D, head0, heads_total, causal, p, key, y, lse)
                         : dt_k_attention_fwd_heads_lp(t, x, B, T, H, D, head0, heads_total, causal, p, key, y,
                                                       out->data, lse);
    if (st < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &qkv)) {
        attn_saved *s = dt_arena_alloc(ctx->arena, sizeof *s);
        dt__node *n = s ? dt__ag_record(ctx, DT_OP_ATTENTION, out, 1, &qkv) : NULL;
        if (!n)
            return NULL;
        *s = (attn_saved){.qkv = x, .y = y, .lse = lse, .key = key, .p = p, .window = window, .softcap = softcap,
                          .windowed = windowed, .causal = causal};
        n->saved[0] = s;
        n->i[0] = B, n->i[1] = T, n->i[2] = H, n->i[3] = D, n->i[4] = head0, n->i[5] = heads_total, n->i[6] = t;
    }
    return out;
}

dt_tensor *dt_attention_heads(dt_ctx *ctx, dt_tensor *qkv, int n_head, int head0, int heads_total, bool causal,
                              float dropout_p, bool training, dt_rng_key key)
{
    return attention(ctx, "dt_attention", qkv, n_head, head0, heads_total, causal, dropout_p, training, key, false, 0,
                     0.0f);
}

dt_tensor *dt_attention_window(dt_ctx *ctx, dt_tensor *qkv, int n_head, int64_t window, float softcap)
{
    const char *op = "dt_attention_window";
    if (window < 0 || !(softcap >= 0.0f) || !isfinite(softcap)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: the window %lld must be >= 0 and the soft cap %g finite and >= 0 (0: "
                 "none)", op, (long long)window, (double)softcap);
        return NULL;
    }
    /* the blocked kernel with the window and the cap (kernels.h; a window of T or more, or 0, without a cap
       gives dt_attention's bits) */
    return attention(ctx, op, qkv, n_head, 0, n_head, true, 0.0f, false, (dt_rng_key){0}, true, window, softcap);
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
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gb = dt__rg(bias) ? dt_arena_alloc(ctx->arena, (size_t)N * sizeof(float)) : NULL;
    if ((dt__rg(X) && !gx) || (dt__rg(bias) && !gb))
        return dt_last_status();
    dt_status st = t == DT_F32
                       ? dt_k_bias_gelu_bwd(n->saved[0], n->saved[1], gout, R, N, gx, gb, DT_K_GELU_TANH)
                       : dt_k_bias_gelu_bwd_lp(t, n->saved[0], n->saved[1], gout, n->i[3] != DT_F32, R, N, gx, gs,
                                               gb, DT_K_GELU_TANH);
    if (st < 0)
        return st;
    if (gx && (st = dt__grad_commit(ctx, X, gx)) < 0)
        return st;
    if (gs)
        dt__grad_shadow_set(ctx, X, gx, gs, t);
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
