/* The tape and reverse-mode backward.
 *
 * Ops append nodes in execution order, which is a topological order. The
 * backward walk therefore visits the tape in reverse from the loss's node.
 *
 * Pre-pass (cheap, flags only): mark the nodes the loss depends on
 * ("needed"), and count for every leaf that requires grad how many input
 * slots of needed nodes refer to it (leaf->pending_). The walk then calls
 * each needed node's backward and decrements its leaves' counts; a leaf
 * whose count reaches zero has its final gradient for this pass, and its
 * grad-ready hooks fire right there, while the rest of backward still runs.
 * This is what lets DDP post a bucket's all-reduce early.
 *
 * Intermediate gradients are arena temporaries, allocated zeroed on first
 * contribution and dropped (pointer reset) at the start of each backward,
 * so backward can run twice over one tape and leaves accumulate both.
 *
 * Split backward (zero-bubble pipelines): dt_backward_input walks like
 * dt_backward_with, but a node with a parameter input (a persistent leaf)
 * has those inputs' requires-grad flag lifted while its backward runs, so
 * the op computes only its other inputs' gradients (a matmul does dX and
 * skips dW: the op's own dt__rg test), and the node is queued with its
 * output gradient (an arena temporary, alive until reset).
 * dt_backward_weight later runs each queued node's backward with the
 * non-parameter inputs lifted instead, then flushes the parameters and
 * fires their grad-ready hooks. No op needed changing; a node whose only
 * differentiable inputs are parameters (an embedding lookup) is skipped in
 * the first pass. Regions under dt_ag_checkpoint are not split (their
 * parameters are not node inputs): their weight gradients land in the
 * first pass. */
#include "autograd/ag_impl.h"

#include <stdlib.h>
#include <string.h>

bool dt_ag_set_enabled(dt_ctx *ctx, bool on)
{
    if (!ctx)
        return false;
    bool old = ctx->grad_enabled;
    ctx->grad_enabled = on;
    return old;
}

bool dt_ag_enabled(const dt_ctx *ctx) { return ctx && ctx->grad_enabled; }

size_t dt_ag_tape_len(const dt_ctx *ctx) { return ctx ? ctx->tape_len : 0; }

void dt_ag_stats_get(const dt_ctx *ctx, dt_ag_stats *out)
{
    if (!out)
        return;
    if (ctx)
        *out = ctx->ag_stats;
    else
        memset(out, 0, sizeof *out);
}

void dt_ag_stats_reset(dt_ctx *ctx)
{
    if (ctx)
        memset(&ctx->ag_stats, 0, sizeof ctx->ag_stats);
}

bool dt__ag_wants(const dt_ctx *ctx, int nin, dt_tensor *const *in)
{
    if (!ctx->grad_enabled)
        return false;
    for (int i = 0; i < nin; i++)
        if (dt__rg(in[i]))
            return true;
    return false;
}

static dt__node *push_node(dt_ctx *ctx, dt_op op)
{
    if (ctx->tape_len == ctx->tape_cap) {
        size_t cap = ctx->tape_cap ? ctx->tape_cap * 2 : 256;
        dt__node **t = realloc(ctx->tape, cap * sizeof *t);
        if (!t) {
            dt_error(DT_ERR_NO_MEMORY, "%s: out of memory growing the tape", dt__op_table[op].fn);
            return NULL;
        }
        ctx->tape = t;
        ctx->tape_cap = cap;
    }
    dt__node *n = dt_arena_alloc(ctx->arena, sizeof *n);
    if (!n)
        return NULL;
    memset(n, 0, sizeof *n);
    n->op = op;
    n->idx = ctx->tape_len;
    ctx->tape[ctx->tape_len++] = n;
    return n;
}

dt__node *dt__ag_record(dt_ctx *ctx, dt_op op, dt_tensor *out, int nin, dt_tensor *const *in)
{
    dt__node *n = push_node(ctx, op);
    if (!n)
        return NULL;
    n->out = out;
    n->nin = nin;
    for (int i = 0; i < nin; i++)
        n->in[i] = in[i];
    out->node_ = n;
    out->flags |= DT_TENSOR_REQUIRES_GRAD;
    return n;
}

dt_status dt_ag_add_grad_hook(dt_tensor *leaf, dt_grad_hook_fn fn, void *ud)
{
    if (!leaf || !fn)
        return dt_error(DT_ERR_NULL, "dt_ag_add_grad_hook: %s is NULL", leaf ? "fn" : "tensor");
    if (leaf->nhooks_ >= DT_MAX_GRAD_HOOKS)
        return dt_error(DT_ERR_RANGE, "dt_ag_add_grad_hook: tensor '%s' already has %d hooks",
                        leaf->name ? leaf->name : "?", DT_MAX_GRAD_HOOKS);
    leaf->hooks_[leaf->nhooks_].fn = fn;
    leaf->hooks_[leaf->nhooks_].ud = ud;
    leaf->nhooks_++;
    return DT_OK;
}

void dt_ag_clear_grad_hooks(dt_tensor *t)
{
    if (t)
        t->nhooks_ = 0;
}

dt_status dt_ag_retain_grad(dt_tensor *t)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_ag_retain_grad: tensor is NULL");
    t->flags |= DT_TENSOR_RETAIN_GRAD;
    return DT_OK;
}

dt_status dt_ag_zero_grad(dt_tensor *t)
{
    if (!t)
        return dt_error(DT_ERR_NULL, "dt_ag_zero_grad: tensor is NULL");
    t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
    if (t->grad)
        return dt_tensor_zero(t->grad);
    return DT_OK;
}

dt_status dt_ag_mark(dt_ctx *ctx, dt_mark_fn fn, void *ud)
{
    if (!ctx || !fn)
        return dt_error(DT_ERR_NULL, "dt_ag_mark: %s is NULL", ctx ? "fn" : "context");
    if (!ctx->grad_enabled)
        return DT_OK;
    dt__node *n = push_node(ctx, DT_OP_MARK);
    if (!n)
        return dt_last_status();
    n->mark = fn;
    n->ud = ud;
    return DT_OK;
}

/* ---- custom ops ------------------------------------------------------------ */

dt_status dt__bw_custom(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *gin[DT__MAX_IN] = {NULL};
    for (int i = 0; i < n->nin; i++) {
        if (dt__rg(n->in[i])) {
            gin[i] = dt_tensor_zeros(ctx, DT_F32, n->in[i]->ndim, n->in[i]->shape);
            if (!gin[i])
                return dt_last_status();
            dt__grad_scratch(ctx, gin[i]->data, dt_tensor_nbytes(gin[i])); /* added below, then dead */
        }
    }
    dt_tensor *go = dt_tensor_view_of(ctx, (void *)(uintptr_t)gout, DT_F32, n->out->ndim,
                                      n->out->shape);
    if (!go)
        return dt_last_status();
    dt_status st = n->custom(ctx, go, n->nin, gin, n->ud);
    if (st < 0)
        return st;
    for (int i = 0; i < n->nin; i++) {
        if (!gin[i])
            continue;
        float *g = dt__grad(ctx, n->in[i]);
        if (!g)
            return dt_last_status();
        const float *s = gin[i]->data;
        int64_t m = dt_tensor_numel(gin[i]);
        for (int64_t j = 0; j < m; j++)
            g[j] += s[j];
    }
    return DT_OK;
}

dt_tensor *dt_ag_custom(dt_ctx *ctx, int nin, dt_tensor **in, dt_tensor *out,
                        dt_custom_backward_fn fn, void *ud)
{
    const char *op = "dt_ag_custom";
    DT__NEED(ctx, op, out);
    if (nin < 0 || nin > DT__MAX_IN || (nin > 0 && !in) || !fn) {
        dt_error(DT_ERR_INVALID_ARG, "%s: need 0..%d inputs and a backward function", op,
                 DT__MAX_IN);
        return NULL;
    }
    for (int i = 0; i < nin; i++) {
        if (!in[i])
            return dt__null_input(op, "an input");
        if (dt__blocked(in[i])) {
            dt_error(DT_ERR_INVALID_ARG, "%s: input %d is stored nChw8c (a conv activation inside a "
                     "dt_ctx_set_blocked region); convert it with an op such as dt_contiguous first", op, i);
            return NULL;
        }
    }
    if (!(out->flags & DT_TENSOR_TEMP) || out->node_) {
        dt_error(DT_ERR_INVALID_ARG, "%s: out must be a fresh temporary of this context", op);
        return NULL;
    }
    if (!dt__ag_wants(ctx, nin, in))
        return out;
    if (!dt_dtype_is_float(out->dtype)) {
        dt_error(DT_ERR_DTYPE, "%s: out is %s; only f32, bf16 and f16 outputs carry gradients", op,
                 dt_dtype_name(out->dtype));
        return NULL;
    }
    dt__node *n = dt__ag_record(ctx, DT_OP_CUSTOM, out, nin, in);
    if (!n)
        return NULL;
    n->custom = fn;
    n->ud = ud;
    return out;
}

/* ---- backward ------------------------------------------------------------------ */

static dt_status fire_hooks(dt_tensor *leaf)
{
    dt_status st = DT_OK;
    for (int h = 0; h < leaf->nhooks_ && st >= 0; h++)
        st = leaf->hooks_[h].fn(leaf, leaf->hooks_[h].ud);
    leaf->gfinite_ = false; /* dt_ag_grad_checked_finite answers inside the hooks only */
    return st;
}

static bool is_leaf_rg(const dt_tensor *t) { return dt__rg(t) && !t->node_; }

/* Add src (t's shape, any strides, f32/bf16/f16) into the f32 buffer g. */
static dt_status add_strided(dt_ctx *ctx, float *g, const dt_tensor *src)
{
    const float *s = dt__cdata_f32(ctx, src);
    if (!s)
        return dt_last_status();
    int64_t m = dt_tensor_numel(src);
    for (int64_t j = 0; j < m; j++)
        g[j] += s[j];
    return DT_OK;
}

static uint64_t next_epoch(void)
{
    static _Atomic uint64_t counter;
    return ++counter;
}

/* Count one more pending use of a leaf in the current pass. */
static void count_use(dt_ctx *ctx, dt_tensor *leaf)
{
    if (leaf->epoch_ != ctx->epoch) {
        leaf->epoch_ = ctx->epoch;
        leaf->pending_ = 0;
    }
    leaf->pending_++;
}

/* A parameter: a persistent leaf that requires grad. */
static bool is_weight(const dt_tensor *t) { return is_leaf_rg(t) && !(t->flags & DT_TENSOR_TEMP); }

/* Lift the requires-grad flag of n's inputs that are (weights) or are not
 * (!weights) parameters; the lifted ones are bits of the result. */
static unsigned lift(dt__node *n, bool weights)
{
    unsigned mask = 0;
    for (int j = 0; j < n->nin; j++)
        if (dt__rg(n->in[j]) && is_weight(n->in[j]) == weights) {
            n->in[j]->flags &= ~(uint32_t)DT_TENSOR_REQUIRES_GRAD;
            mask |= 1u << j;
        }
    return mask;
}

static void unlift(dt__node *n, unsigned mask)
{
    for (int j = 0; j < n->nin; j++)
        if (mask & (1u << j))
            n->in[j]->flags |= DT_TENSOR_REQUIRES_GRAD;
}

static dt_status defer_node(dt_ctx *ctx, dt__node *n, const float *gout)
{
    if (ctx->ndeferred == ctx->deferred_cap) {
        size_t cap = ctx->deferred_cap ? 2 * ctx->deferred_cap : 64;
        dt__node **d = realloc(ctx->deferred, cap * sizeof *d);
        if (d)
            ctx->deferred = d;
        const float **g = d ? realloc(ctx->deferred_gout, cap * sizeof *g) : NULL;
        if (!g)
            return dt_error(DT_ERR_NO_MEMORY, "dt_backward_input: out of memory queueing weight gradients");
        ctx->deferred_gout = g;
        ctx->deferred_cap = cap;
    }
    ctx->deferred[ctx->ndeferred] = n;
    ctx->deferred_gout[ctx->ndeferred++] = gout;
    return DT_OK;
}

/* One node of the walk: its backward (split or whole), then its leaves. */
static dt_status walk_node(dt_ctx *ctx, dt__node *n, const float *gout)
{
    bool split = ctx->split_input;
    unsigned lifted = split ? lift(n, true) : 0;
    dt_status st = DT_OK;
    bool any = !lifted;
    for (int j = 0; j < n->nin && !any; j++)
        any = dt__rg(n->in[j]);
    if (any)
        st = dt__op_table[n->op].backward(ctx, n, gout);
    unlift(n, lifted);
    if (st < 0)
        return st;
    if (lifted && (st = defer_node(ctx, n, gout)) < 0)
        return st;
    for (int j = 0; j < n->nin && st >= 0; j++) {
        dt_tensor *in = n->in[j];
        if (split && is_weight(in))
            continue;
        if (is_leaf_rg(in) && --in->pending_ == 0 && (st = dt__grad_flush(ctx, in)) >= 0)
            st = fire_hooks(in);
    }
    return st;
}

dt_status dt_backward_with(dt_ctx *ctx, dt_tensor *out, const dt_tensor *grad_out)
{
    const char *op = "dt_backward";
    if (!ctx)
        return dt_error(DT_ERR_NULL, "%s: context is NULL", op);
    if (!out) {
        dt__null_input(op, "loss");
        return dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
    }
    if (!grad_out)
        return dt_error(DT_ERR_NULL, "%s: grad_out is NULL", op);
    if (!dt_dtype_is_float(out->dtype) || !dt_dtype_is_float(grad_out->dtype))
        return dt_error(DT_ERR_DTYPE, "%s: output is %s and grad %s, want f32, bf16 or f16", op,
                        dt_dtype_name(out->dtype), dt_dtype_name(grad_out->dtype));
    if (dt__blocked(out) || dt__blocked(grad_out))
        return dt_error(DT_ERR_INVALID_ARG, "%s: output or grad_out is stored nChw8c; convert it to "
                        "plain (e.g. dt_contiguous) before seeding a backward", op);
    if (out->ndim != grad_out->ndim ||
        memcmp(out->shape, grad_out->shape, sizeof(int64_t) * (size_t)out->ndim)) {
        dt__shape_error(op, "output and grad_out differ", out, grad_out);
        return DT_ERR_SHAPE;
    }
    if (!dt__rg(out))
        return dt_error(DT_ERR_STATE, "%s: the output does not require grad (no parameter or "
                                      "input that requires grad reaches it, or no-grad mode)",
                        op);
    bool nested = ctx->in_backward;
    size_t lo = nested ? ctx->child_floor : 0;

    if (!out->node_) { /* a leaf: its gradient is grad_out itself */
        if (!nested)
            ctx->epoch = next_epoch();
        float *g = dt__grad(ctx, out);
        if (!g || add_strided(ctx, g, grad_out) < 0)
            return dt_last_status();
        dt_status st = dt__grad_flush(ctx, out);
        return st < 0 ? st : fire_hooks(out);
    }
    dt__node *root = out->node_;
    if (root->idx >= ctx->tape_len || ctx->tape[root->idx] != root)
        return dt_error(DT_ERR_STATE, "%s: the output's node is not on this context's tape "
                                      "(was the context reset since the forward?)",
                        op);
    size_t start = root->idx;
    if (start < lo)
        return dt_error(DT_ERR_STATE, "%s: a backward started inside another may only begin "
                                      "from a node recorded after the enclosing backward began",
                        op);
    if (!nested)
        ctx->epoch = next_epoch();
    dt__node **tape = ctx->tape;

    /* Pre-pass over [lo, start]: needed flags, reset intermediate grads,
     * leaf use counts. Nodes below lo belong to an enclosing walk: their
     * outputs receive gradient contributions but are not walked here. */
    for (size_t i = lo; i <= start; i++)
        tape[i]->needed = 0;
    root->needed = 1;
    for (size_t k = start + 1; k-- > lo;) {
        dt__node *n = tape[k];
        if (!n->needed || !dt__op_table[n->op].backward)
            continue;
        n->out->grad = NULL; /* a retained one's from an earlier pass: not given back */
        n->out->glp_ = NULL;
        n->out->flags &= ~(uint32_t)(DT_TENSOR_GRAD_OWN | DT_TENSOR_GLP_OWN);
        for (int j = 0; j < n->nin; j++) {
            dt_tensor *in = n->in[j];
            if (!dt__rg(in))
                continue;
            if (!in->node_) {
                if (!(ctx->split_input && is_weight(in)))
                    count_use(ctx, in);
            }
            else if (in->node_->idx >= lo)
                in->node_->needed = 1;
        }
    }

    /* Seed. */
    float *g0 = dt__grad(ctx, out);
    if (!g0 || add_strided(ctx, g0, grad_out) < 0)
        return dt_last_status();

    /* Walk. */
    dt_status st = DT_OK;
    size_t saved_floor = ctx->child_floor;
    int saved_scratch = ctx->scratch_floor; /* the enclosing node's scratch is its own */
    ctx->child_floor = ctx->tape_len;
    ctx->scratch_floor = ctx->nscratch;
    const size_t saved_lo = ctx->walk_lo;
    ctx->walk_lo = lo;
    ctx->in_backward = true;
    for (size_t k = start + 1; k-- > lo;) {
        dt__node *n = ctx->tape[k];
        if (n->mark) {
            st = n->mark(ctx, n->ud);
            if (st < 0) {
                dt_error_wrap(st, "%s: mark callback", op);
                break;
            }
            continue;
        }
        if (!n->needed)
            continue;
        float *gout = dt__grad_out(ctx, n->out); /* its shadow kept for n's GEMMs */
        if (!gout) {
            st = dt_last_status();
            break;
        }
        if ((st = walk_node(ctx, n, gout)) < 0) {
            dt_error_wrap(st, "%s: backward of %s", op, dt__op_table[n->op].fn);
            break;
        }
        dt__grad_drop(ctx, ctx->split_input ? NULL : n->out); /* passed on, unless queued with n */
    }
    ctx->in_backward = nested;
    ctx->walk_lo = saved_lo;
    ctx->child_floor = saved_floor;
    ctx->nscratch = ctx->scratch_floor; /* none left but after an error: forgotten (a checkpoint's rewind may
                                           hand that memory out again) */
    ctx->scratch_floor = saved_scratch;
    return st;
}

dt_status dt_backward(dt_ctx *ctx, dt_tensor *loss)
{
    if (!ctx)
        return dt_error(DT_ERR_NULL, "dt_backward: context is NULL");
    if (!loss) {
        dt__null_input("dt_backward", "loss");
        return dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
    }
    if (dt_tensor_numel(loss) != 1) {
        char s[96];
        return dt_error(DT_ERR_SHAPE, "dt_backward: loss has shape %s; backward needs a scalar "
                                      "(use dt_backward_with for other outputs)",
                        dt_tensor_shape_str(loss, s, sizeof s));
    }
    float one = 1.0f;
    dt_tensor g;
    dt_tensor_init_contiguous(&g, DT_F32, loss->ndim, loss->shape, &one);
    return dt_backward_with(ctx, loss, &g);
}

dt_status dt_backward_input(dt_ctx *ctx, dt_tensor *out, const dt_tensor *grad_out)
{
    if (!ctx)
        return dt_error(DT_ERR_NULL, "dt_backward_input: context is NULL");
    if (ctx->in_backward)
        return dt_error(DT_ERR_STATE, "dt_backward_input: called from inside a backward");
    if (out && !out->node_)
        return dt_error(DT_ERR_INVALID_ARG, "dt_backward_input: the output is a leaf (nothing to split)");
    ctx->split_input = true;
    dt_status st = dt_backward_with(ctx, out, grad_out);
    ctx->split_input = false;
    return st;
}

dt_status dt_backward_weight(dt_ctx *ctx)
{
    if (!ctx)
        return dt_error(DT_ERR_NULL, "dt_backward_weight: context is NULL");
    if (ctx->in_backward)
        return dt_error(DT_ERR_STATE, "dt_backward_weight: called from inside a backward");
    size_t nd = ctx->ndeferred;
    ctx->ndeferred = 0;
    ctx->epoch = next_epoch();
    for (size_t k = 0; k < nd; k++) {
        dt__node *n = ctx->deferred[k];
        for (int j = 0; j < n->nin; j++)
            if (is_weight(n->in[j]))
                count_use(ctx, n->in[j]);
    }
    dt_status st = DT_OK;
    ctx->in_backward = true;
    for (size_t k = 0; k < nd && st >= 0; k++) {
        dt__node *n = ctx->deferred[k];
        unsigned lifted = lift(n, false);
        st = dt__op_table[n->op].backward(ctx, n, ctx->deferred_gout[k]);
        unlift(n, lifted);
        dt__grad_drop(ctx, NULL); /* its scratch */
        if (st < 0) {
            dt_error_wrap(st, "dt_backward_weight: backward of %s", dt__op_table[n->op].fn);
            break;
        }
        for (int j = 0; j < n->nin && st >= 0; j++) {
            dt_tensor *in = n->in[j];
            if (is_weight(in) && --in->pending_ == 0 && (st = dt__grad_flush(ctx, in)) >= 0)
                st = fire_hooks(in);
        }
    }
    ctx->in_backward = false;
    return st;
}
