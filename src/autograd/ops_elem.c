/* Elementwise ops: add/sub/mul/div with NumPy broadcasting, scale, relu,
 * gelu, dropout.
 *
 * Broadcasting is done with stride-0 dims: each input is iterated over the
 * output's shape with stride 0 where it is broadcast. In backward the same
 * trick reduces: the input gradient is the (sequential, hence
 * deterministic) target of a stride-0 accumulation. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_COUNT };
static const char *const bin_names[] = {"dt_add", "dt_sub", "dt_mul", "dt_div"};
_Static_assert(sizeof bin_names / sizeof bin_names[0] == BIN_COUNT, "bin_names per op");
static const dt_op bin_ops[] = {DT_OP_ADD, DT_OP_SUB, DT_OP_MUL, DT_OP_DIV};
_Static_assert(sizeof bin_ops / sizeof bin_ops[0] == BIN_COUNT, "bin_ops per op");

/* Row kernels; ud carries the op code. */
enum { R_ADD, R_SUB, R_MUL, R_DIV, R_ACC, R_SUBACC, R_MULACC, R_DIVACC, R_NEGDIVACC, R_MULTO };

static void row_k(int64_t n, char *p0, int64_t s0, char *p1, int64_t s1, char *p2, int64_t s2,
                  void *ud)
{
    int k = *(int *)ud;
    float *o = (float *)p0;
    const float *a = (const float *)p1, *b = (const float *)p2;
    switch (k) {
    case R_ADD: for (int64_t i = 0; i < n; i++) o[i * s0] = a[i * s1] + b[i * s2]; break;
    case R_SUB: for (int64_t i = 0; i < n; i++) o[i * s0] = a[i * s1] - b[i * s2]; break;
    case R_MUL: for (int64_t i = 0; i < n; i++) o[i * s0] = a[i * s1] * b[i * s2]; break;
    case R_DIV: for (int64_t i = 0; i < n; i++) o[i * s0] = a[i * s1] / b[i * s2]; break;
    case R_ACC: for (int64_t i = 0; i < n; i++) o[i * s0] += a[i * s1]; break;
    case R_SUBACC: for (int64_t i = 0; i < n; i++) o[i * s0] -= a[i * s1]; break;
    case R_MULACC: for (int64_t i = 0; i < n; i++) o[i * s0] += a[i * s1] * b[i * s2]; break;
    case R_DIVACC: for (int64_t i = 0; i < n; i++) o[i * s0] += a[i * s1] / b[i * s2]; break;
    case R_NEGDIVACC: for (int64_t i = 0; i < n; i++) o[i * s0] -= a[i * s1] / b[i * s2]; break;
    case R_MULTO: for (int64_t i = 0; i < n; i++) o[i * s0] = a[i * s1] * b[i * s2]; break;
    default: break;
    }
}

static void loop3(int k, int ndim, const int64_t *shape, float *p0, const int64_t *s0,
                  const float *p1, const int64_t *s1, const float *p2, const int64_t *s2)
{
    int64_t st[3][DT_MAX_DIMS];
    memcpy(st[0], s0, sizeof st[0]);
    memcpy(st[1], s1, sizeof st[1]);
    if (s2)
        memcpy(st[2], s2, sizeof st[2]);
    else
        memset(st[2], 0, sizeof st[2]);
    char *p[3] = {(char *)p0, (char *)(uintptr_t)p1, (char *)(uintptr_t)p2};
    size_t es[3] = {4, 4, 4};
    dt__nd_loop(ndim, shape, p2 ? 3 : 2, p, (const int64_t(*)[DT_MAX_DIMS])st, es, row_k, &k);
}

/* Strides of x when iterated over the broadcast shape (ndim dims, x aligned
 * at the end); contig = use x's contiguous strides instead of its own. */
static void bcast_strides(const dt_tensor *x, int ndim, const int64_t *oshape, bool contig,
                          int64_t *st)
{
    int64_t cs[DT_MAX_DIMS];
    dt__contig_strides(x->ndim, x->shape, cs);
    int off = ndim - x->ndim;
    for (int i = 0; i < DT_MAX_DIMS; i++)
        st[i] = 0;
    for (int i = 0; i < ndim; i++) {
        int j = i - off;
        if (j < 0 || (x->shape[j] == 1 && oshape[i] != 1))
            st[i] = 0;
        else
            st[i] = contig ? cs[j] : x->strides[j];
    }
}

#define return_if_err(expr)                                                              \
    do {                                                                                 \
        dt_status st_ = (expr);                                                          \
        if (st_ < 0)                                                                     \
            return st_;                                                                  \
    } while (0)

/* The backward of add_lp: the f32 operand's gradient accumulates gout; the
 * bf16/f16 one's is gout rounded to its dtype (what dt_cast's backward
 * gave after the widened operand's gradient). A bf16/f16 result (add_lp2)
 * rounds gout to its dtype, as the result's cast backward did: in the
 * operands' own rounding where they have its dtype (the same bits). */
static dt_status add_lp_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int64_t m = dt_tensor_numel(n->out);
    /* Operands of the result's own dtype round gout themselves (below):
     * rounding twice to one dtype is rounding once, so the result's rounding
     * pass is needed only for an operand of another dtype. */
    bool own = true;
    for (int k = 0; k < 2; k++)
        own = own && (!dt__rg(n->in[k]) || n->in[k]->dtype == n->out->dtype);
    if (n->out->dtype != DT_F32 && !own) {
        float *r = dt_arena_alloc(ctx->arena, (size_t)m * sizeof(float));
        if (!r)
            return dt_last_status();
        return_if_err(dt__round_to(n->out->dtype, gout, r, m));
        gout = r;
    }
    for (int k = 0; k < 2; k++) {
        dt_tensor *x = n->in[k];
        if (!dt__rg(x))
            continue;
        dt_status st;
        if (x->dtype == DT_F32) {
            float *g = dt__grad(ctx, x);
            if (!g)
                return dt_last_status();
            st = dt_k_axpy(m, 1.0f, gout, g);
        } else {
            bool err = false; /* the shadow first: grad_begin gives x its gradient */
            void *gs = dt__grad_shadow_maybe(ctx, x, x->dtype, &err);
            const bool lp_only = gs && dt__grad_shadow_only(ctx, n, x, x->dtype);
            float *g = err ? NULL : dt__grad_begin(ctx, x);
            if (!g)
                return dt_last_status();
            st = dt_k_grad_round_lp(x->dtype, gout, lp_only ? NULL : g, gs, m);
            if (st >= 0)
                st = dt__grad_commit(ctx, x, g);
            if (st >= 0 && gs)
                dt__grad_shadow_set(ctx, x, g, gs, x->dtype);
            if (st >= 0 && lp_only)
                st = dt__grad_f32_skipped(ctx, x);
        }
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* i[0] = kind, i[1] = 1 for add_lp (an f32 and a bf16/f16 operand) and
 * add_lp2 (two bf16 or two f16 ones) */
dt_status dt__bw_binary(dt_ctx *ctx, dt__node *n, const float *gout)
{
    int kind = (int)n->i[0];
    if (n->i[1])
        return add_lp_backward(ctx, n, gout);
    dt_tensor *a = n->in[0], *b = n->in[1], *out = n->out;
    int nd = out->ndim;
    int64_t gs[DT_MAX_DIMS], as[DT_MAX_DIMS], bs[DT_MAX_DIMS], ga_s[DT_MAX_DIMS],
        gb_s[DT_MAX_DIMS];
    dt__contig_strides(nd, out->shape, gs);
    bcast_strides(a, nd, out->shape, false, as);
    bcast_strides(b, nd, out->shape, false, bs);
    bcast_strides(a, nd, out->shape, true, ga_s);
    bcast_strides(b, nd, out->shape, true, gb_s);
    int64_t m = dt_tensor_numel(out);
    if (dt__rg(a)) {
        float *ga = dt__grad(ctx, a);
        if (!ga)
            return dt_last_status();
        if ((kind == BIN_ADD || kind == BIN_SUB) && dt_tensor_numel(a) == m)
            return_if_err(dt_k_axpy(m, 1.0f, gout, ga));
        else switch (kind) {
        case BIN_ADD:
        case BIN_SUB: loop3(R_ACC, nd, out->shape, ga, ga_s, gout, gs, NULL, NULL); break;
        case BIN_MUL: loop3(R_MULACC, nd, out->shape, ga, ga_s, gout, gs, b->data, bs); break;
        case BIN_DIV: loop3(R_DIVACC, nd, out->shape, ga, ga_s, gout, gs, b->data, bs); break;
        }
    }
    if (dt__rg(b)) {
        float *gb = dt__grad(ctx, b);
        if (!gb)
            return dt_last_status();
        if ((kind == BIN_ADD || kind == BIN_SUB) && dt_tensor_numel(b) == m)
            return_if_err(dt_k_axpy(m, kind == BIN_ADD ? 1.0f : -1.0f, gout, gb));
        else switch (kind) {
        case BIN_ADD: loop3(R_ACC, nd, out->shape, gb, gb_s, gout, gs, NULL, NULL); break;
        case BIN_SUB: loop3(R_SUBACC, nd, out->shape, gb, gb_s, gout, gs, NULL, NULL); break;
        case BIN_MUL: loop3(R_MULACC, nd, out->shape, gb, gb_s, gout, gs, a->data, as); break;
        case BIN_DIV: {
            /* d(a/b)/db = -(a/b)/b = -out/b: t = gout*out, gb -= t/b. */
            float *t = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(out));
            if (!t)
                return dt_last_status();
            loop3(R_MULTO, nd, out->shape, t, gs, gout, gs, out->data, gs);
            loop3(R_NEGDIVACC, nd, out->shape, gb, gb_s, t, gs, b->data, bs);
            break;
        }
        }
    }
    return DT_OK;
}

/* f32 + bf16/f16 of one shape, both contiguous (GPT-2's residual stream
 * plus a projection's autocast output): the f32 sum widening would give,
 * with the low-precision operand read as it is (dt_k_add_lp) instead of
 * through a widened copy and a cast node; NULL with *took false when the
 * operands are not such a pair. */
static dt_tensor *add_lp(dt_ctx *ctx, dt_tensor *a, dt_tensor *b, bool *took)
{
    *took = false;
    bool a_lp = dt__is_lp(a), b_lp = dt__is_lp(b);
    if (a_lp == b_lp || (a_lp ? b : a)->dtype != DT_F32 || a->ndim != b->ndim || !dt_tensor_is_contiguous(a) ||
        !dt_tensor_is_contiguous(b))
        return NULL;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return NULL;
    *took = true;
    dt_tensor *f = a_lp ? b : a, *h = a_lp ? a : b;
    dt_tensor *out = dt__out(ctx, a->ndim, a->shape);
    if (!out)
        return NULL;
    if (dt_k_add_lp(h->dtype, f->data, h->data, a_lp, out->data, dt_tensor_numel(out)) < 0) {
        dt_error_wrap(dt_last_status(), "dt_add");
        return NULL;
    }
    dt_tensor *in[2] = {a, b};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_ADD, out, 2, in);
        if (!n)
            return NULL;
        n->i[0] = BIN_ADD;
        n->i[1] = 1;
    }
    return out;
}

/* Two bf16 (or two f16) operands of one shape, both contiguous, distinct
 * (Llama's residual stream plus a projection's autocast output): the
 * result widening both, adding in f32 and rounding gives (the cast chain's
 * bits: a widening is exact, the f32 sum and its rounding are the same
 * operations), a block at a time in cache (dt_k_add2_lp) instead of two
 * widened copies, an f32 sum and a rounding pass, and one node instead of
 * four (the backward: add_lp_backward). NULL with *took false for other operands. */
static dt_tensor *add_lp2(dt_ctx *ctx, dt_tensor *a, dt_tensor *b, bool *took)
{
    *took = false;
    if (!dt__is_lp(a) || b->dtype != a->dtype || a == b || a->ndim != b->ndim || !dt_tensor_is_contiguous(a) ||
        !dt_tensor_is_contiguous(b))
        return NULL;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return NULL;
    *took = true;
    const dt_dtype t = a->dtype;
    dt_tensor *out = dt_tensor_empty(ctx, t, a->ndim, a->shape);
    if (!out)
        return NULL;
    if (dt_k_add2_lp(t, a->data, b->data, out->data, dt_tensor_numel(out)) < 0) {
        dt_error_wrap(dt_last_status(), "dt_add");
        return NULL;
    }
    dt_tensor *in[2] = {a, b};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *nd = dt__ag_record(ctx, DT_OP_ADD, out, 2, in);
        if (!nd)
            return NULL;
        nd->i[0] = BIN_ADD;
        nd->i[1] = 1;
    }
    return out;
}

static dt_tensor *binary(dt_ctx *ctx, int kind, dt_tensor *a, dt_tensor *b)
{
    const char *op = bin_names[kind];
    DT__NEED(ctx, op, a);
    DT__NEED(ctx, op, b);
    if (kind == BIN_ADD) {
        bool took;
        dt_tensor *y = add_lp(ctx, a, b, &took);
        if (!took)
            y = add_lp2(ctx, a, b, &took);
        if (took)
            return y;
    }
    dt_tensor *lp[2] = {a, b};
    DT__LP_RUN(ctx, 2, lp, dt__lp_result(2, lp), binary(ctx, kind, lp[0], lp[1]));
    if (!dt__check_f32(op, "a", a) || !dt__check_f32(op, "b", b))
        return NULL;
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t sh[DT_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            dt__shape_error(op, "shapes do not broadcast", a, b);
            return NULL;
        }
        sh[i] = da == 1 ? db : da;
    }
    dt_tensor *out = dt__out(ctx, nd, sh);
    if (!out)
        return NULL;
    int64_t os[DT_MAX_DIMS], as[DT_MAX_DIMS], bs[DT_MAX_DIMS];
    dt__contig_strides(nd, sh, os);
    bcast_strides(a, nd, sh, false, as);
    bcast_strides(b, nd, sh, false, bs);
    static const int fk[] = {R_ADD, R_SUB, R_MUL, R_DIV};
    static const dt_k_binop kk[] = {DT_K_ADD, DT_K_SUB, DT_K_MUL, DT_K_DIV};
    /* contiguous operands: the (parallel) kernel; strided ones: the N-d loop */
    if (!dt_tensor_is_contiguous(a) || !dt_tensor_is_contiguous(b) ||
        dt_k_binary(kk[kind], a->data, a->shape, a->ndim, b->data, b->shape, b->ndim,
                    out->data) != DT_OK)
        loop3(fk[kind], nd, sh, out->data, os, a->data, as, b->data, bs);
    dt_tensor *in[2] = {a, b};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *n = dt__ag_record(ctx, bin_ops[kind], out, 2, in);
        if (!n)
            return NULL;
        n->i[0] = kind;
        n->i[1] = 0;
    }
    return out;
}

dt_tensor *dt_add(dt_ctx *ctx, dt_tensor *a, dt_tensor *b) { return binary(ctx, BIN_ADD, a, b); }
dt_tensor *dt_sub(dt_ctx *ctx, dt_tensor *a, dt_tensor *b) { return binary(ctx, BIN_SUB, a, b); }
dt_tensor *dt_mul(dt_ctx *ctx, dt_tensor *a, dt_tensor *b) { return binary(ctx, BIN_MUL, a, b); }
dt_tensor *dt_div(dt_ctx *ctx, dt_tensor *a, dt_tensor *b) { return binary(ctx, BIN_DIV, a, b); }

/* ---- unary ------------------------------------------------------------------ */

enum { U_SCALE, U_RELU, U_GELU, U_DROPOUT, U_GELU_TANH, U_SOFTCAP, U_COUNT };
static const dt_op un_ops[] = {DT_OP_SCALE, DT_OP_RELU, DT_OP_GELU, DT_OP_DROPOUT, DT_OP_GELU_TANH, DT_OP_SOFTCAP};
_Static_assert(sizeof un_ops / sizeof un_ops[0] == U_COUNT, "un_ops per op");

/* Unary ops run on the kernels layer; their backward kernels overwrite, so
 * they write through dt__grad_begin/commit. f[0] = scale, p or the cap;
 * saved[0] = the forward input (gelu) or the dropout key. */
dt_status dt__bw_unary(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *x = n->in[0];
    int64_t m = dt_tensor_numel(n->out);
    float *gx = dt__grad_begin(ctx, x);
    if (!gx)
        return dt_last_status();
    dt_status st = DT_OK;
    switch ((int)n->i[0]) {
    case U_SCALE: st = dt_k_scale(gout, (float)n->f[0], 0.0f, gx, m); break;
    case U_RELU: st = dt_k_relu_bwd(n->out->data, gout, gx, m); break;
    case U_GELU: st = dt_k_gelu_bwd(n->saved[0], gout, gx, m, DT_K_GELU_ERF); break;
    case U_GELU_TANH: st = dt_k_gelu_bwd(n->saved[0], gout, gx, m, DT_K_GELU_TANH); break;
    case U_SOFTCAP: st = dt_k_softcap_bwd(n->out->data, gout, gx, m, (float)n->f[0]); break;
    case U_DROPOUT:
        st = dt_k_dropout_bwd(gout, gx, m, (float)n->f[0], *(const dt_rng_key *)n->saved[0], 0);
        break;
    }
    if (st < 0)
        return st;
    return dt__grad_commit(ctx, x, gx);
}

static dt_tensor *unary(dt_ctx *ctx, const char *op, int kind, dt_tensor *x, float f0,
                        const dt_rng_key *key)
{
    const float *xd = dt__cdata(ctx, x);
    dt_tensor *out = dt__out(ctx, x->ndim, x->shape);
    if (!xd || !out)
        return NULL;
    float *y = out->data;
    int64_t m = dt_tensor_numel(x);
    dt_status st = DT_OK;
    switch (kind) {
    case U_SCALE: st = dt_k_scale(xd, f0, 0.0f, y, m); break;
    case U_RELU: st = dt_k_relu_fwd(xd, y, m); break;
    case U_GELU: st = dt_k_gelu_fwd(xd, y, m, DT_K_GELU_ERF); break;
    case U_GELU_TANH: st = dt_k_gelu_fwd(xd, y, m, DT_K_GELU_TANH); break;
    case U_SOFTCAP: st = dt_k_softcap_fwd(xd, y, m, f0); break;
    case U_DROPOUT: st = dt_k_dropout_fwd(xd, y, m, f0, *key, 0); break;
    }
    if (st < 0) {
        dt_error_wrap(st, "%s", op);
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &x)) {
        dt__node *n = dt__ag_record(ctx, un_ops[kind], out, 1, &x);
        if (!n)
            return NULL;
        n->i[0] = kind;
        n->f[0] = f0;
        if (kind == U_GELU || kind == U_GELU_TANH)
            n->saved[0] = (void *)(uintptr_t)xd;
        if (kind == U_DROPOUT) {
            dt_rng_key *k = dt_arena_alloc(ctx->arena, sizeof *k);
            if (!k)
                return NULL;
            *k = *key;
            n->saved[0] = k;
        }
    }
    return out;
}

dt_tensor *dt_scale(dt_ctx *ctx, dt_tensor *x, float s)
{
    DT__NEED(ctx, "dt_scale", x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_scale(ctx, lp[0], s));
    DT__NEED_F32(ctx, "dt_scale", x);
    return unary(ctx, "dt_scale", U_SCALE, x, s, NULL);
}

/* ReLU on a bf16/f16 x in one pass each way (dt_k_relu_*_lp): the same
 * numbers as widening, dt_relu in f32 and rounding (DT__LP_RUN), without
 * the two casts' passes. */
static dt_status relu_lp_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *x = n->in[0];
    float *gx = dt__grad_begin(ctx, x);
    if (!gx)
        return dt_last_status();
    dt_status st = dt_k_relu_bwd_lp(n->out->dtype, n->out->data, gout, gx, dt_tensor_numel(x));
    if (st < 0)
        return st;
    return dt__grad_commit(ctx, x, gx);
}

/* The op table's relu row: a bf16/f16 output was made by relu_lp. */
dt_status dt__bw_relu(dt_ctx *ctx, dt__node *n, const float *gout)
{
    return dt__is_lp(n->out) ? relu_lp_backward(ctx, n, gout) : dt__bw_unary(ctx, n, gout);
}

static dt_tensor *relu_lp(dt_ctx *ctx, dt_tensor *x)
{
    const char *op = "dt_relu";
    const void *xd = dt__cdata(ctx, x); /* of x's dtype */
    dt_tensor *out = dt_tensor_empty(ctx, x->dtype, x->ndim, x->shape);
    if (!xd || !out)
        return NULL;
    if (dt_k_relu_fwd_lp(x->dtype, xd, out->data, dt_tensor_numel(x)) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    out->flags |= x->flags & DT_TENSOR_BLOCKED;
    if (dt__ag_wants(ctx, 1, &x) && !dt__ag_record(ctx, DT_OP_RELU, out, 1, &x))
        return NULL;
    return out;
}

dt_tensor *dt_relu(dt_ctx *ctx, dt_tensor *x)
{
    DT__NEED_ANY(ctx, "dt_relu", x);
    if (dt__is_lp(x))
        return relu_lp(ctx, x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_relu(ctx, lp[0]));
    DT__NEED_F32_ANY(ctx, "dt_relu", x); /* elementwise: any layout */
    dt_tensor *y = unary(ctx, "dt_relu", U_RELU, x, 0, NULL);
    if (y && dt__blocked(x))
        y->flags |= x->flags & DT_TENSOR_BLOCKED;
    return y;
}

dt_tensor *dt_gelu(dt_ctx *ctx, dt_tensor *x)
{
    DT__NEED(ctx, "dt_gelu", x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_gelu(ctx, lp[0]));
    DT__NEED_F32(ctx, "dt_gelu", x);
    return unary(ctx, "dt_gelu", U_GELU, x, 0, NULL);
}

dt_tensor *dt_gelu_tanh(dt_ctx *ctx, dt_tensor *x)
{
    DT__NEED(ctx, "dt_gelu_tanh", x);
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_gelu_tanh(ctx, lp[0]));
    DT__NEED_F32(ctx, "dt_gelu_tanh", x);
    return unary(ctx, "dt_gelu_tanh", U_GELU_TANH, x, 0, NULL);
}

dt_tensor *dt_softcap(dt_ctx *ctx, dt_tensor *x, float cap)
{
    DT__NEED(ctx, "dt_softcap", x);
    if (!(cap > 0.0f) || !isfinite(cap)) {
        dt_error(DT_ERR_INVALID_ARG, "dt_softcap: the cap %g must be positive and finite", (double)cap);
        return NULL;
    }
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_softcap(ctx, lp[0], cap));
    DT__NEED_F32(ctx, "dt_softcap", x);
    return unary(ctx, "dt_softcap", U_SOFTCAP, x, cap, NULL);
}

dt_tensor *dt_dropout(dt_ctx *ctx, dt_tensor *x, float p, bool training, dt_rng_key key)
{
    const char *op = "dt_dropout";
    DT__NEED(ctx, op, x);
    if (!(p >= 0.0f && p <= 1.0f)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: p = %g not in [0, 1]", op, (double)p);
        return NULL;
    }
    if ((!training || p == 0.0f) && dt_dtype_is_float(x->dtype))
        return x;
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_dropout(ctx, lp[0], p, training, key));
    DT__NEED_F32(ctx, op, x);
    if (p >= 1.0f) /* everything dropped: zeros, and no gradient flows */
        return dt_scale(ctx, x, 0.0f);
    return unary(ctx, op, U_DROPOUT, x, p, &key);
}

/* dt_dropout_at: p, the key, and where the rows' elements sit in the whole sequence's mask */
typedef struct {
    float p;
    dt_rng_key key;
    int64_t B, R, T, E; /* x [B, R, ...]: E values a row, rows at pos[r] of T */
    int64_t *pos;       /* R entries (a copy in the context's arena) */
} dropout_at_saved;

/* Every row of x (or of its gradient) through the dropout kernel with the whole sequence's offsets; y may be x. */
static dt_status dropout_rows(const dropout_at_saved *a, const float *x, float *y, bool bwd)
{
    dt_status st = DT_OK;
    for (int64_t b = 0; b < a->B && st >= 0; b++)
        for (int64_t r = 0; r < a->R && st >= 0; r++) {
            const int64_t at = (b * a->R + r) * a->E;
            const uint64_t off = (uint64_t)((b * a->T + a->pos[r]) * a->E);
            st = bwd ? dt_k_dropout_bwd(x + at, y + at, a->E, a->p, a->key, off)
                     : dt_k_dropout_fwd(x + at, y + at, a->E, a->p, a->key, off);
        }
    return st;
}

static dt_status dropout_at_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    if (!gin[0])
        return DT_OK;
    dt_status st = dropout_rows(ud, gout->data, gin[0]->data, true);
    return st < 0 ? dt_error_wrap(st, "dt_dropout_at backward") : DT_OK;
}

dt_tensor *dt_dropout_at(dt_ctx *ctx, dt_tensor *x, float p, bool training, dt_rng_key key, const int64_t *pos,
                         int64_t T)
{
    const char *op = "dt_dropout_at";
    DT__NEED(ctx, op, x);
    if (!(p >= 0.0f && p <= 1.0f)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: p = %g not in [0, 1]", op, (double)p);
        return NULL;
    }
    if (x->ndim < 2 || !pos || T < x->shape[1]) {
        dt_error(!pos ? DT_ERR_NULL : DT_ERR_SHAPE, "%s: want x [B, R, ...] with R (%lld) rows of a sequence of T "
                 "(%lld) >= R positions, and their positions", op, (long long)(x->ndim > 1 ? x->shape[1] : -1),
                 (long long)T);
        return NULL;
    }
    for (int64_t r = 0; r < x->shape[1]; r++)
        if (pos[r] < 0 || pos[r] >= T) {
            dt_error(DT_ERR_INVALID_ARG, "%s: position %lld of row %lld is outside [0, %lld)", op, (long long)pos[r],
                     (long long)r, (long long)T);
            return NULL;
        }
    if ((!training || p == 0.0f) && dt_dtype_is_float(x->dtype))
        return x;
    dt_tensor *lp[1] = {x};
    DT__LP_RUN(ctx, 1, lp, x->dtype, dt_dropout_at(ctx, lp[0], p, training, key, pos, T));
    DT__NEED_F32(ctx, op, x);
    if (p >= 1.0f) /* everything dropped: zeros, and no gradient flows */
        return dt_scale(ctx, x, 0.0f);
    const int64_t B = x->shape[0], R = x->shape[1], n = dt_tensor_numel(x);
    dropout_at_saved *a = dt_ctx_alloc(ctx, sizeof *a);
    int64_t *pc = a ? dt_ctx_alloc(ctx, (size_t)(R ? R : 1) * sizeof *pc) : NULL;
    dt_tensor *c = pc ? dt_contiguous(ctx, x) : NULL;
    dt_tensor *y = c ? dt_tensor_empty(ctx, DT_F32, x->ndim, x->shape) : NULL;
    if (!y)
        return NULL;
    memcpy(pc, pos, (size_t)R * sizeof *pc);
    *a = (dropout_at_saved){.p = p, .key = key, .B = B, .R = R, .T = T, .E = B && R ? n / (B * R) : 0, .pos = pc};
    dt_status st = dropout_rows(a, c->data, y->data, false);
    if (st < 0) {
        dt_error_wrap(st, "%s", op);
        return NULL;
    }
    return dt_ag_custom(ctx, 1, &x, y, dropout_at_bwd, a);
}
