/* LoRA on tensor-parallel linear layers (tp.h: dt_tp_lora_linear; nn.h:
 * dt_lora_hook). The adapters' output s * B(A(x)) is split as the layer:
 *
 *   column-parallel (the layer's output rows sliced): A [r, in] whole on
 *   every rank, B_r [out/t, r] the rank's rows (chunk by chunk, as the
 *   layer's). u = A x is the same on every rank; the rank adds B_r u to its
 *   output columns. Backward: dA and dx need sum_r B_r^T dy_r, so the
 *   r-wide u goes through f (dt_tp_copy_to_region, backward all-reduce) when
 *   x is the layer's own input (a tp.h ColumnParallelLinear applies f
 *   inside), or A does (its gradient all-reduced) when x has been through f
 *   already (the caller's f then sums dx over the ranks).
 *
 *   row-parallel (input columns sliced): A_r [r, in/t] the rank's columns,
 *   B [out, r] whole. u = g(A_r x_r) (its own all-reduce, N x r floats), then
 *   B u on every rank; g's backward is the identity, so dB, dA_r and dx_r
 *   are exact without further reduction. With lora_dropout the rank's
 *   columns get their part of the single-process mask (row_input).
 *
 * Every replicated adapter thus gets the same full gradient on every rank of
 * the group, and the result equals the single-process layer's within the
 * rounding of the all-reduces.
 *
 * Under sequence parallelism the models run the layers' weights directly
 * and add the adapters with dt_tp_sp_lora: a column layer's on the
 * gathered input (in the region, as IN_REGION), a row layer's on the whole
 * rows, then the rank's rows of their output (dt_tp_sp_scatter, backward
 * all-gather: B's gradient whole on every rank). */
#include "tp_impl.h"
#include "nn/nn_layer.h"

#include <string.h>

enum { IN_REGION = 1, GATHER = 2, SCATTER = 4 };

static dt_tensor *base_forward(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    return m->fwd(ctx, m, x, m->ud);
}

/* the adapters' input: x, through the module's lora_dropout if any */
static dt_tensor *drop(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    dt_module *d = dt_module_find_child(m, "lora_dropout");
    return d ? dt_module_forward(ctx, d, x) : x;
}

static dt_tensor *column_lora(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    const dt_lora_hook *h = ud;
    dt_pg *g = h->group;
    dt_module *a = dt_module_find_child(m, "lora_A"), *b = dt_module_find_child(m, "lora_B");
    dt_tensor *y = base_forward(ctx, m, x);
    if (!y || !a || !b)
        return NULL;
    dt_tensor *xd = drop(ctx, m, x), *u;
    if (h->flags & IN_REGION)
        u = dt_linear(ctx, xd, dt_tp_copy_to_region(ctx, g, a->params[0]), NULL);
    else
        u = dt_tp_copy_to_region(ctx, g, dt_linear(ctx, xd, a->params[0], NULL));
    dt_tensor *d = dt_linear(ctx, u, b->params[0], NULL);
    if (h->flags & GATHER)
        d = dt_tp_gather_last(ctx, g, d);
    return dt__lora_sum(ctx, x, y, d, a->eps);
}

/* The row adapters' input: the rank's columns x_r of the layer's input,
 * through lora_dropout with the rank's columns of the single-process
 * layer's mask (dropout's mask depends on the element's index in the full
 * [.., in] input, so it is drawn over a full-sized tensor of ones and
 * sliced: the same values as one process, at the cost of the full mask). */
static dt_tensor *row_input(dt_ctx *ctx, dt_module *m, const dt_lora_hook *h, dt_tensor *x)
{
    dt_pg *g = h->group;
    dt_module *d = dt_module_find_child(m, "lora_dropout");
    if (h->flags & SCATTER) /* x is the whole input */
        return dt_tp_scatter_last(ctx, g, drop(ctx, m, x));
    if (!x || !d || !d->training || !(d->p > 0))
        return x;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] *= dt_pg_size(g);
    dt_tensor *ones = dt_tensor_full(ctx, x->dtype, x->ndim, shape, 1.0);
    dt_tensor *mask = ones ? dt_dropout(ctx, ones, d->p, true, dt_module_dropout_key(d)) : NULL;
    return mask ? dt_mul(ctx, x, dt_tp_scatter_last(ctx, g, mask)) : NULL;
}

static dt_tensor *row_lora(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    const dt_lora_hook *h = ud;
    dt_pg *g = h->group;
    dt_module *a = dt_module_find_child(m, "lora_A"), *b = dt_module_find_child(m, "lora_B");
    dt_tensor *y = base_forward(ctx, m, x);
    if (!y || !a || !b)
        return NULL;
    dt_tensor *u = dt_tp_reduce_partial(ctx, g, dt_linear(ctx, row_input(ctx, m, h, x), a->params[0], NULL));
    return dt__lora_sum(ctx, x, y, dt_linear(ctx, u, b->params[0], NULL), a->eps);
}

dt_tensor *dt_tp_sp_lora(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, dt_pg *sp)
{
    if (!m || !x || !y) { /* an earlier op's error stands */
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_tp_sp_lora: %s is NULL", !m ? "the layer" : !x ? "x" : "y");
        return NULL;
    }
    const dt_lora_hook *h = m->lora;
    dt_module *a = dt_module_find_child(m, "lora_A"), *b = dt_module_find_child(m, "lora_B");
    if (!a || !b)
        return y;
    if (!h || !h->group) {
        dt_error(DT_ERR_INVALID_ARG, "dt_tp_sp_lora: '%s' carries adapters but is not a tensor-parallel layer",
                 m->path ? m->path : "?");
        return NULL;
    }
    dt_pg *g = h->group;
    dt_tensor *d;
    if (h->split == 1) { /* column: x gathered, in the region (the gather's backward sums its gradient), as IN_REGION */
        dt_tensor *u = dt_linear(ctx, drop(ctx, m, x), dt_tp_copy_to_region(ctx, g, a->params[0]), NULL);
        d = dt_linear(ctx, u, b->params[0], NULL);
    } else { /* row: the adapters' output on the whole rows, then the rank's rows (backward: all-gathered) */
        dt_tensor *u = dt_tp_reduce_partial(ctx, g, dt_linear(ctx, row_input(ctx, m, h, x), a->params[0], NULL));
        d = dt_tp_sp_scatter(ctx, sp, dt_linear(ctx, u, b->params[0], NULL), 1);
    }
    return d ? dt__lora_sum(ctx, x, y, d, a->eps) : NULL;
}

static dt_status tp_lora(dt_module *m, dt_pg *tp, int64_t in, int64_t out, bool column, int chunks, int flags,
                         bool weight_in_out)
{
    dt_lora_hook h = {.in = in, .out = out, .split = column ? 1 : 2, .ranks = dt_pg_size(tp),
                      .chunks = chunks > 1 ? chunks : 1, .weight_in_out = weight_in_out, .group = tp,
                      .flags = flags, .fwd = column ? column_lora : row_lora};
    if (column && m->nparam > 0) /* the output's blocks as the layer's weight has them */
        memcpy(h.chunk_rows, m->specs[0].tp_chunk_rows, sizeof h.chunk_rows);
    return dt_module_set_lora(m, &h);
}

dt_status dt_tp_lora_linear(dt_module *m, dt_pg *tp, int64_t in, int64_t out, bool column, bool in_region)
{
    if (!m || !tp)
        return dt_error(DT_ERR_NULL, "dt_tp_lora_linear: %s is NULL", !m ? "module" : "group");
    if (m->kind != DT_NN_CUSTOM)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tp_lora_linear: '%s' is a %s, not a custom layer", m->name ? m->name : "",
                        dt_module_type(m));
    return tp_lora(m, tp, in, out, column, m->nparam > 0 ? m->specs[0].tp_chunks : 1,
                   column && in_region ? IN_REGION : 0, false);
}

dt_status dt__tp_lora_std(dt_module *m, dt_pg *tp, bool column, bool gather_or_parallel)
{
    /* tp.h's own layers: weight [in, out]; a column layer applies f itself */
    const int flags = column ? (gather_or_parallel ? GATHER : 0) : (gather_or_parallel ? 0 : SCATTER);
    return tp_lora(m, tp, m->in, m->out, column, column ? m->stride : 1, flags, true);
}
