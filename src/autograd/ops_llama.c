/* The ops of a Llama-family block: RMSNorm, rotary embeddings, SwiGLU and
 * the grouped-query packing of q, k, v for the attention kernel.
 *
 * Each is one node over a kernel of src/kernels/llm_ops.c (the packing is a
 * copy). Low precision follows the common rule (ops_cast.c): bf16/f16
 * inputs are widened, computed in f32 and the result rounded once; RMSNorm
 * and RoPE of a low-precision input, SwiGLU and the packing of two / three inputs of
 * one low-precision dtype compute those numbers without the cast passes
 * (block by block in cache; a copy). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

/* ---- RMSNorm ------------------------------------------------------------------- */

/* i[0] = R, i[1] = D, i[2] = x's dtype; saved: x, rstd, w (contiguous, f32) */
dt_status dt__bw_rms(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t R = n->i[0], D = n->i[1];
    const dt_dtype t = (dt_dtype)n->i[2];
    dt_tensor *X = n->in[0], *W = n->nin > 1 ? n->in[1] : NULL;
    float *gx = dt__rg(X) ? dt__grad_begin(ctx, X) : NULL;
    float *gw = dt__rg(W) ? dt__grad_begin(ctx, W) : NULL;
    if ((dt__rg(X) && !gx) || (dt__rg(W) && !gw))
        return dt_last_status();
    dt_status st = t == DT_F32 ? dt_k_rmsnorm_bwd(n->saved[0], gout, R, D, n->saved[2], n->saved[1], gx, gw)
                               : dt_k_rmsnorm_bwd_lp(n->saved[0], t, gout, R, D, n->saved[2], n->saved[1], gx, gw);
    if (st >= 0 && gw && dt__is_lp(W)) /* a low-precision weight's gradient holds its dtype's values */
        st = dt__round_to(W->dtype, gw, gw, D);
    if (st >= 0 && gx)
        st = dt__grad_commit(ctx, X, gx);
    if (st >= 0 && gw)
        st = dt__grad_commit(ctx, W, gw);
    return st;
}

dt_tensor *dt_rms_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *weight, float eps)
{
    const char *op = "dt_rms_norm";
    DT__NEED(ctx, op, x);
    dt_tensor *lp[2] = {x, weight}; /* statistics in f32; the result in x's dtype */
    /* bf16 (or f16) x with a weight of that dtype, f32 or none: one kernel
     * reads x and writes the result in its dtype, with the numbers of the
     * common rule's casts (ops_cast.c); the weight is widened (D values) */
    const dt_dtype dt = dt__is_lp(x) && !dt__blocked(x) &&
                                (!weight || (!dt__blocked(weight) &&
                                             (weight->dtype == x->dtype || weight->dtype == DT_F32)))
                            ? x->dtype : DT_F32;
    if (dt == DT_F32) {
        DT__LP_RUN(ctx, 2, lp, x->dtype, dt_rms_norm(ctx, lp[0], lp[1], eps));
        DT__NEED_F32(ctx, op, x);
        if (weight && (!dt__check_f32(op, "weight", weight) || dt__blocked(weight)))
            return NULL;
    }
    if (x->ndim < 1 || (weight && (weight->ndim != 1 || weight->shape[0] != x->shape[x->ndim - 1]))) {
        dt__shape_error(op, "want x [..., D] and weight [D]", x, weight ? weight : x);
        return NULL;
    }
    int64_t D = x->shape[x->ndim - 1], R = D ? dt_tensor_numel(x) / D : 0;
    const void *xd = dt__cdata(ctx, x);
    const float *wd = weight ? dt__cdata_f32(ctx, weight) : NULL;
    dt_tensor *out = dt == DT_F32 ? dt__out(ctx, x->ndim, x->shape) : dt_tensor_empty(ctx, dt, x->ndim, x->shape);
    float *rstd = dt_arena_alloc(ctx->arena, (size_t)(R ? R : 1) * 4);
    if (!xd || (weight && !wd) || !out || !rstd)
        return NULL;
    if ((dt == DT_F32 ? dt_k_rmsnorm_fwd(xd, R, D, wd, eps, out->data, rstd)
                      : dt_k_rmsnorm_fwd_lp(xd, dt, R, D, wd, eps, out->data, rstd)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    dt_tensor *in[2] = {x, weight};
    int nin = weight ? 2 : 1;
    if (dt__ag_wants(ctx, nin, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_RMS_NORM, out, nin, in);
        if (!n)
            return NULL;
        n->i[0] = R, n->i[1] = D, n->i[2] = dt;
        n->saved[0] = (void *)(uintptr_t)xd;
        n->saved[1] = rstd;
        n->saved[2] = (void *)(uintptr_t)wd;
    }
    return out;
}

/* ---- rotary embeddings ---------------------------------------------------------- */

/* i[0..3] = B, T, H, hd, i[4] = x's dtype, i[5] = the rotary width; saved:
 * cos, sin tables (the scale in them) */
dt_status dt__bw_rope(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *X = n->in[0];
    const dt_dtype t = (dt_dtype)n->i[4];
    bool err = false;
    void *gs = dt__grad_shadow_maybe(ctx, X, t, &err); /* before grad_begin gives X its gradient */
    float *gx = err ? NULL : dt__grad_begin(ctx, X);
    if (!gx)
        return dt_last_status();
    dt_status st = t == DT_F32
                       ? dt_k_rope(gout, n->i[0], n->i[1], n->i[2], n->i[3], n->i[5], n->saved[0], n->saved[1], true,
                                   gx)
                       : dt_k_rope_bwd_lp(gout, t, n->i[0], n->i[1], n->i[2], n->i[3], n->i[5], n->saved[0],
                                          n->saved[1], gx, gs);
    if (st >= 0)
        st = dt__grad_commit(ctx, X, gx);
    if (st >= 0 && gs)
        dt__grad_shadow_set(ctx, X, gx, gs, t);
    return st;
}

dt_tensor *dt_rope(dt_ctx *ctx, dt_tensor *x, int n_head, const float *inv_freq, int64_t pos0)
{
    return dt_rope_at(ctx, x, n_head, inv_freq, pos0, NULL);
}

dt_tensor *dt_rope_at(dt_ctx *ctx, dt_tensor *x, int n_head, const float *inv_freq, int64_t pos0, const int64_t *pos)
{
    return dt_rope_partial(ctx, x, n_head, 0, inv_freq, 1.0f, pos0, pos);
}

dt_tensor *dt_rope_partial(dt_ctx *ctx, dt_tensor *x, int n_head, int64_t rot, const float *inv_freq, float scale,
                           int64_t pos0, const int64_t *pos)
{
    const char *op = "dt_rope";
    DT__NEED(ctx, op, x);
    /* bf16 (or f16) x: one kernel reads it and writes the result in its
     * dtype, with the numbers of the common rule's casts (ops_cast.c) */
    const dt_dtype dt = dt__is_lp(x) && !dt__blocked(x) ? x->dtype : DT_F32;
    dt_tensor *lp[1] = {x};
    if (dt == DT_F32) {
        DT__LP_RUN(ctx, 1, lp, x->dtype, dt_rope_partial(ctx, lp[0], n_head, rot, inv_freq, scale, pos0, pos));
        DT__NEED_F32(ctx, op, x);
    }
    if (x->ndim != 3 || n_head < 1 || x->shape[2] % n_head || (x->shape[2] / n_head) % 2) {
        dt_error(DT_ERR_SHAPE, "%s: want x [B, T, n_head * hd] with an even head size hd, got %dD x (last dim %lld) "
                 "and n_head %d", op, x->ndim, (long long)(x->ndim ? x->shape[x->ndim - 1] : 0), n_head);
        return NULL;
    }
    if (rot == 0)
        rot = x->shape[2] / n_head;
    if (rot < 2 || rot % 2 || rot > x->shape[2] / n_head || !(scale > 0.0f) || !isfinite(scale)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: %s", op, !(scale > 0.0f) || !isfinite(scale)
                 ? "the scale of cos and sin is not a positive finite number"
                 : "the rotary width is not an even number in [2, head size]");
        return NULL;
    }
    for (int64_t t = 0; pos && x->ndim == 3 && t < x->shape[1]; t++)
        if (pos[t] < 0) {
            dt_error(DT_ERR_INVALID_ARG, "%s: position %lld of row %lld is negative", op, (long long)pos[t],
                     (long long)t);
            return NULL;
        }
    if (!inv_freq || pos0 < 0) {
        dt_error(inv_freq ? DT_ERR_INVALID_ARG : DT_ERR_NULL, "%s: %s", op,
                 inv_freq ? "the first position is negative" : "inv_freq is NULL");
        return NULL;
    }
    if (!pos && pos0 > INT64_MAX - x->shape[1]) { /* pos0 + t below would overflow */
        dt_error(DT_ERR_INVALID_ARG, "%s: positions from %lld for %lld rows pass INT64_MAX", op, (long long)pos0,
                 (long long)x->shape[1]);
        return NULL;
    }
    int64_t B = x->shape[0], T = x->shape[1], hd = x->shape[2] / n_head, half = rot / 2;
    float *ct = dt_arena_alloc(ctx->arena, (size_t)(T * half + 1) * 4);
    float *sn = dt_arena_alloc(ctx->arena, (size_t)(T * half + 1) * 4);
    const void *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt == DT_F32 ? dt__out(ctx, 3, x->shape) : dt_tensor_empty(ctx, dt, 3, x->shape);
    if (!ct || !sn || !xd || !out)
        return NULL;
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < half; j++) {
            float a = (float)(pos ? pos[t] : pos0 + t) * inv_freq[j]; /* f32, as position_ids.float() * inv_freq */
            ct[t * half + j] = cosf(a) * scale; /* emb.cos() * attention_scaling, in f32 */
            sn[t * half + j] = sinf(a) * scale;
        }
    if ((dt == DT_F32 ? dt_k_rope(xd, B, T, n_head, hd, rot, ct, sn, false, out->data)
                      : dt_k_rope_lp(xd, dt, B, T, n_head, hd, rot, ct, sn, out->data)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    dt_tensor *in[1] = {x};
    if (dt__ag_wants(ctx, 1, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_ROPE, out, 1, in);
        if (!n)
            return NULL;
        n->i[0] = B, n->i[1] = T, n->i[2] = n_head, n->i[3] = hd, n->i[4] = dt, n->i[5] = rot;
        n->saved[0] = ct;
        n->saved[1] = sn;
    }
    return out;
}

/* ---- SwiGLU -------------------------------------------------------------------- */

/* i[0] = n, i[1] = the inputs' dtype; saved: gate, up */
dt_status dt__bw_swiglu(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *G = n->in[0], *U = n->in[1];
    dt_dtype t = (dt_dtype)n->i[1];
    bool err = false; /* the shadows before grad_begin gives G and U their gradients */
    void *sg = dt__rg(G) && G != U ? dt__grad_shadow_maybe(ctx, G, t, &err) : NULL;
    void *su = !err && dt__rg(U) && G != U ? dt__grad_shadow_maybe(ctx, U, t, &err) : NULL;
    if (err)
        return dt_last_status();
    float *gg = dt__rg(G) ? dt__grad_begin(ctx, G) : NULL;
    float *gu = dt__rg(U) ? dt__grad_begin(ctx, U) : NULL;
    if ((dt__rg(G) && !gg) || (dt__rg(U) && !gu))
        return dt_last_status();
    dt_status st = t == DT_F32 ? dt_k_swiglu_bwd(n->saved[0], n->saved[1], gout, n->i[0], gg, gu)
                               : dt_k_swiglu_bwd_lp(n->saved[0], n->saved[1], t, gout, n->i[0], gg, gu, sg, su);
    if (st >= 0 && gg)
        st = dt__grad_commit(ctx, G, gg);
    if (st >= 0 && gu)
        st = dt__grad_commit(ctx, U, gu);
    if (st >= 0 && sg)
        dt__grad_shadow_set(ctx, G, gg, sg, t);
    if (st >= 0 && su)
        dt__grad_shadow_set(ctx, U, gu, su, t);
    return st;
}

dt_tensor *dt_swiglu(dt_ctx *ctx, dt_tensor *gate, dt_tensor *up)
{
    const char *op = "dt_swiglu";
    DT__NEED(ctx, op, gate);
    DT__NEED(ctx, op, up);
    dt_tensor *lp[2] = {gate, up};
    /* both bf16 (or both f16): one kernel reads them and writes the result in
     * their dtype, with the numbers of the common rule's casts (ops_cast.c) */
    const dt_dtype t = dt__is_lp(gate) && up->dtype == gate->dtype && !dt__blocked(gate) && !dt__blocked(up)
                           ? gate->dtype : DT_F32;
    if (t == DT_F32)
        DT__LP_RUN(ctx, 2, lp, dt__lp_result(2, lp), dt_swiglu(ctx, lp[0], lp[1]));
    if (t == DT_F32 && (!dt__check_f32(op, "gate", gate) || !dt__check_f32(op, "up", up)))
        return NULL;
    bool same = gate->ndim == up->ndim;
    for (int d = 0; same && d < gate->ndim; d++)
        same = gate->shape[d] == up->shape[d];
    if (!same) {
        dt__shape_error(op, "gate and up must have one shape", gate, up);
        return NULL;
    }
    int64_t n = dt_tensor_numel(gate);
    const float *gd = dt__cdata(ctx, gate), *ud = dt__cdata(ctx, up);
    dt_tensor *out = t == DT_F32 ? dt__out(ctx, gate->ndim, gate->shape) : dt_tensor_empty(ctx, t, gate->ndim, gate->shape);
    if (!gd || !ud || !out)
        return NULL;
    if ((t == DT_F32 ? dt_k_swiglu_fwd(gd, ud, n, out->data) : dt_k_swiglu_fwd_lp(gd, ud, t, n, out->data)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    dt_tensor *in[2] = {gate, up};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *nd = dt__ag_record(ctx, DT_OP_SWIGLU, out, 2, in);
        if (!nd)
            return NULL;
        nd->i[0] = n, nd->i[1] = t;
        nd->saved[0] = (void *)(uintptr_t)gd;
        nd->saved[1] = (void *)(uintptr_t)ud;
    }
    return out;
}

/* ---- grouped-query packing ----------------------------------------------------------- */

/* q, k, v rows (elements of es bytes) copied into qkv rows; rows = B T, H
 * heads of q, KV of k and v, hd each. */
static void pack_fwd(const char *q, const char *k, const char *v, char *qkv, int64_t rows, int64_t H, int64_t KV,
                     int64_t hd, size_t es)
{
    const int64_t C = H * hd, Ck = KV * hd, rep = H / KV;
    for (int64_t r = 0; r < rows; r++) {
        char *o = qkv + (size_t)(r * 3 * C) * es;
        const char *qr = q + (size_t)(r * C) * es, *kr = k + (size_t)(r * Ck) * es, *vr = v + (size_t)(r * Ck) * es;
        memcpy(o, qr, (size_t)C * es);
        for (int64_t h = 0; h < H; h++) {
            memcpy(o + (size_t)(C + h * hd) * es, kr + (size_t)((h / rep) * hd) * es, (size_t)hd * es);
            memcpy(o + (size_t)(2 * C + h * hd) * es, vr + (size_t)((h / rep) * hd) * es, (size_t)hd * es);
        }
    }
}

/* The qkv gradient gathered back into the q, k, v gradients (any may be
 * NULL), the kv ones summed over their copies in head order. */
static void pack_bwd(float *q, float *k, float *v, const float *qkv, int64_t rows, int64_t H, int64_t KV, int64_t hd)
{
    const int64_t C = H * hd, Ck = KV * hd, rep = H / KV;
    for (int64_t r = 0; r < rows; r++) {
        const float *o = qkv + r * 3 * C;
        float *qr = q ? q + r * C : NULL, *kr = k ? k + r * Ck : NULL, *vr = v ? v + r * Ck : NULL;
        if (qr)
            memcpy(qr, o, (size_t)C * 4);
        if (kr)
            memset(kr, 0, (size_t)Ck * 4);
        if (vr)
            memset(vr, 0, (size_t)Ck * 4);
        for (int64_t h = 0; h < H; h++) {
            const float *ok = o + C + h * hd, *ov = o + 2 * C + h * hd;
            float *dk = kr ? kr + (h / rep) * hd : NULL, *dv = vr ? vr + (h / rep) * hd : NULL;
            for (int64_t j = 0; dk && j < hd; j++)
                dk[j] += ok[j];
            for (int64_t j = 0; dv && j < hd; j++)
                dv[j] += ov[j];
        }
    }
}

/* i[0..3] = rows, H, KV, hd, i[4] = the dtype. Low precision as the casts
 * around an f32 pack would do it: the incoming gradient rounded to the
 * dtype, gathered, the kv sums rounded (q's is a copy: rounded already). */
dt_status dt__bw_pack(dt_ctx *ctx, dt__node *n, const float *gout)
{
    float *g[3] = {NULL, NULL, NULL};
    void *gs[3] = {NULL, NULL, NULL}; /* k's and v's shadows (their sums are rounded here) */
    const int64_t rows = n->i[0], H = n->i[1], KV = n->i[2], hd = n->i[3];
    const dt_dtype t = (dt_dtype)n->i[4];
    bool err = false;
    for (int i = 1; i < 3 && !err; i++)
        if (dt__rg(n->in[i]) && n->in[i] != n->in[3 - i])
            gs[i] = dt__grad_shadow_maybe(ctx, n->in[i], t, &err);
    if (err)
        return dt_last_status();
    for (int i = 0; i < 3; i++)
        if (dt__rg(n->in[i]) && !(g[i] = dt__grad_begin(ctx, n->in[i])))
            return dt_last_status();
    dt_status st = DT_OK;
    if (t != DT_F32)
        st = dt_k_gqa_pack_bwd_lp(gout, t, rows, H, KV, hd, g[0], g[1], g[2], g[1] ? gs[1] : NULL,
                                  g[2] ? gs[2] : NULL);
    else
        pack_bwd(g[0], g[1], g[2], gout, rows, H, KV, hd);
    for (int i = 0; i < 3 && st >= 0; i++)
        if (g[i])
            st = dt__grad_commit(ctx, n->in[i], g[i]);
    for (int i = 1; i < 3 && st >= 0; i++)
        if (gs[i])
            dt__grad_shadow_set(ctx, n->in[i], g[i], gs[i], t);
    return st;
}

dt_tensor *dt_gqa_pack(dt_ctx *ctx, dt_tensor *q, dt_tensor *k, dt_tensor *v, int n_head, int n_kv_head)
{
    const char *op = "dt_gqa_pack";
    DT__NEED(ctx, op, q);
    DT__NEED(ctx, op, k);
    DT__NEED(ctx, op, v);
    dt_tensor *lp[3] = {q, k, v};
    /* all three bf16 (or f16): packed as they are (a copy), no cast passes */
    const dt_dtype t = dt__is_lp(q) && k->dtype == q->dtype && v->dtype == q->dtype ? q->dtype : DT_F32;
    if (t == DT_F32)
        DT__LP_RUN(ctx, 3, lp, dt__lp_result(3, lp), dt_gqa_pack(ctx, lp[0], lp[1], lp[2], n_head, n_kv_head));
    if (t == DT_F32 && (!dt__check_f32(op, "q", q) || !dt__check_f32(op, "k", k) || !dt__check_f32(op, "v", v)))
        return NULL;
    if (n_head < 1 || n_kv_head < 1 || n_head % n_kv_head) {
        dt_error(DT_ERR_INVALID_ARG, "%s: n_kv_head %d must divide n_head %d (both >= 1)", op, n_kv_head, n_head);
        return NULL;
    }
    bool ok = q->ndim == 3 && k->ndim == 3 && v->ndim == 3 && q->shape[2] % n_head == 0;
    int64_t hd = ok ? q->shape[2] / n_head : 0;
    for (int d = 0; ok && d < 2; d++)
        ok = k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d];
    ok = ok && k->shape[2] == n_kv_head * hd && v->shape[2] == n_kv_head * hd;
    if (!ok) {
        dt__shape_error(op, "want q [B, T, n_head * hd], k and v [B, T, n_kv_head * hd]", q, k);
        return NULL;
    }
    int64_t rows = q->shape[0] * q->shape[1];
    const void *qd = dt__cdata(ctx, q), *kd = dt__cdata(ctx, k), *vd = dt__cdata(ctx, v);
    dt_tensor *out = dt_tensor_empty(ctx, t, 3, (int64_t[]){q->shape[0], q->shape[1], 3 * q->shape[2]});
    if (!qd || !kd || !vd || !out)
        return NULL;
    pack_fwd(qd, kd, vd, out->data, rows, n_head, n_kv_head, hd, dt_dtype_size(t));
    dt_tensor *in[3] = {q, k, v};
    if (dt__ag_wants(ctx, 3, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_GQA_PACK, out, 3, in);
        if (!n)
            return NULL;
        n->i[0] = rows, n->i[1] = n_head, n->i[2] = n_kv_head, n->i[3] = hd, n->i[4] = t;
    }
    return out;
}
