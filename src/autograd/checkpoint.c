/* Activation checkpointing (PyTorch's reentrant torch.utils.checkpoint).
 *
 * Forward runs the region in no-grad mode, so none of its activations are
 * kept, and records ONE node whose backward re-runs the region with grad
 * mode on (over aliases of the inputs that act as leaves), then runs a
 * nested backward from the recomputed output with the incoming gradient.
 * The nested backward walks only the recomputed nodes; parameters used in
 * the region receive their gradients (and fire their grad-ready hooks)
 * there, and the aliases' gradients are passed on to the real inputs.
 * Randomness is keyed (dropout takes an explicit Philox key), so the
 * recomputation sees the same masks without saving RNG state.
 *
 * Split backward (dt_backward_input / dt_backward_weight): a region computes
 * its parameters' gradients in the input pass, whole (see dt__bw_ckpt).
 *
 * Memory: the region's temporaries are given back (arena rewind) right
 * after the forward, its output copied into a fresh temporary; the
 * recomputation's temporaries and tape nodes as soon as its gradients are
 * passed on. A step then holds the regions' inputs and outputs plus one
 * region's activations at a time. */
#include "autograd/ag_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_ckpt_fn fn;
    void *ud;
    bool blocked; /* the context's dt_ctx_set_blocked at the first run */
} ckpt_state;

static dt_status recompute(dt_ctx *ctx, dt__node *n, const ckpt_state *cs, const float *gout, float **gin);

dt_status dt__bw_ckpt(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const ckpt_state *cs = n->ud;
    /* the inputs' gradients live on; everything the recomputation allocates
     * after this mark is dead once its gradients are passed on */
    float *gin[DT__MAX_IN] = {NULL};
    for (int i = 0; i < n->nin; i++)
        if (dt__rg(n->in[i]) && !(gin[i] = dt__grad(ctx, n->in[i])))
            return dt_last_status();
    dt_arena_pos mark = dt_arena_mark(ctx->arena);
    size_t tape0 = ctx->tape_len;
    /* Under a split backward (dt_backward_input, ZB-H1's B) the region's
     * weight gradients are computed now, with its input gradients: deferring
     * them would queue nodes of the recomputed tape, which is given back
     * below (the weight pass would run freed nodes), and recomputing the
     * region a second time in the weight pass costs a forward. */
    bool split = ctx->split_input;
    ctx->split_input = false;
    dt_status st = recompute(ctx, n, cs, gout, gin);
    ctx->split_input = split;
    /* the recomputed nodes and their memory: given back (the outer walk is
     * below tape0 and never reads them) */
    ctx->tape_len = tape0;
    dt_arena_rewind(ctx->arena, mark);
    return st;
}

static dt_status recompute(dt_ctx *ctx, dt__node *n, const ckpt_state *cs, const float *gout, float **gin)
{
    dt_tensor *a[DT__MAX_IN] = {NULL};
    for (int i = 0; i < n->nin; i++) {
        a[i] = dt_tensor_alias(ctx, n->in[i]);
        if (!a[i])
            return dt_last_status();
        if (dt__rg(n->in[i]))
            a[i]->flags |= DT_TENSOR_REQUIRES_GRAD;
    }
    bool old = dt_ag_set_enabled(ctx, true);
    bool oldb = dt_ctx_set_blocked(ctx, cs->blocked); /* the first run's layouts: the same values */
    dt_tensor *out = cs->fn(ctx, n->nin, a, cs->ud);
    /* the region's output must be plain (dt__bw_ckpt seeds it) */
    if (out && dt__blocked(out)) /* a blocked input passed through (relu) */
        out = dt__plain(ctx, out);
    dt_ctx_set_blocked(ctx, oldb);
    dt_ag_set_enabled(ctx, old);
    if (!out)
        return dt_error_wrap(dt_last_status(), "checkpoint recomputation");
    if (!dt_tensor_same_shape(out, n->out)) {
        dt__shape_error("dt_ag_checkpoint", "recomputed output differs from the first", out,
                        n->out);
        return DT_ERR_SHAPE;
    }
    if (!dt__rg(out))
        return DT_OK; /* nothing in the region needs a gradient */
    dt_tensor g;
    dt_tensor_init_contiguous(&g, DT_F32, n->out->ndim, n->out->shape, (void *)(uintptr_t)gout);
    dt_status st = dt_backward_with(ctx, out, &g);
    if (st < 0)
        return st;
    for (int i = 0; i < n->nin; i++) {
        if (!gin[i] || !a[i]->grad)
            continue;
        float *gi = gin[i];
        const float *src = a[i]->grad->data;
        int64_t m = dt_tensor_numel(a[i]);
        for (int64_t j = 0; j < m; j++)
            gi[j] += src[j];
    }
    return DT_OK;
}

dt_tensor *dt_ag_checkpoint(dt_ctx *ctx, dt_ckpt_fn fn, int nin, dt_tensor **in, void *ud)
{
    const char *op = "dt_ag_checkpoint";
    if (!ctx || !fn) {
        dt_error(DT_ERR_NULL, "%s: %s is NULL", op, ctx ? "fn" : "context");
        return NULL;
    }
    if (nin < 0 || nin > DT__MAX_IN || (nin > 0 && !in)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: need 0..%d inputs", op, DT__MAX_IN);
        return NULL;
    }
    for (int i = 0; i < nin; i++)
        if (!in[i])
            return dt__null_input(op, "an input");
    bool record = ctx->grad_enabled;
    dt_ag_set_enabled(ctx, false);
    /* The region runs with the caller's layouts (a ConvNet layer keeps its
     * channel-blocked activations), the recomputation with the same; its
     * output is handed on plain (an exact reorder), as dt__bw_ckpt seeds
     * it with a plain gradient. */
    const bool blocked = ctx->blocked_ok;
    dt_arena_pos mark = dt_arena_mark(ctx->arena);
    dt_tensor *y = fn(ctx, nin, in, ud);
    dt_ctx_set_blocked(ctx, blocked); /* as the caller had it, whatever fn did */
    if (y && dt__blocked(y))
        y = dt__plain(ctx, y);
    dt_ag_set_enabled(ctx, record);
    if (!y || !record)
        return y;
    if (!dt_dtype_is_float(y->dtype)) {
        dt_error(DT_ERR_DTYPE, "%s: region output is %s; only f32, bf16 and f16 carry gradients", op,
                 dt_dtype_name(y->dtype));
        return NULL;
    }
    /* Keep only the output: copy it aside, give back everything the region
     * allocated (its intermediates are dead: nothing was recorded), and
     * put the output in a fresh temporary. */
    int64_t numel = dt_tensor_numel(y), shape[DT_MAX_DIMS];
    int ndim = y->ndim;
    memcpy(shape, y->shape, sizeof shape);
    float *keep = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
    if (!keep) {
        dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", op);
        return NULL;
    }
    dt_status rs = dt_tensor_read(y, keep);
    dt_arena_rewind(ctx->arena, mark);
    dt_tensor *out = rs < 0 ? NULL : dt__out(ctx, ndim, shape);
    if (out)
        memcpy(out->data, keep, (size_t)numel * sizeof(float));
    free(keep);
    ckpt_state *cs = dt_ctx_alloc(ctx, sizeof *cs);
    if (!out || !cs)
        return NULL;
    cs->fn = fn;
    cs->ud = ud;
    cs->blocked = blocked;
    dt__node *n = dt__ag_record(ctx, DT_OP_CHECKPOINT, out, nin, in);
    if (!n)
        return NULL;
    n->ud = cs;
    return out;
}
