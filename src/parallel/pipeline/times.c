/* Measuring the units' compute (pipeline.h, dt_pipe_unit_times): what
 * DT_PIPE_BY_TIME balances.
 *
 * Each unit runs as a stage runs it (exec.c): on a context of its own,
 * under the same autocast, its input a leaf that requires grad (but the
 * first unit's: the model's input), its output made contiguous, then
 * backward from it with an f32 gradient of its shape. A unit's cost is its
 * forward plus that backward, in wall seconds; the input of unit i + 1 is
 * unit i's output. The units are timed in turn inside each repetition
 * (after one warm-up), so a burst of load from other processes spreads
 * over the units instead of landing on all of one unit's repetitions, and
 * the least of a unit's repetitions is kept (load only ever adds time).
 *
 * The model must come out as it went in: the backward passes accumulate
 * into its gradients and a training forward moves its buffers (running
 * statistics) and its dropout counters, so the three are saved before and
 * put back after (gradients that are all zero, as at a strategy's attach,
 * are zeroed again instead of copied). */
#include "parallel/pipeline/pipe_impl.h"

#include "dtrain/autograd.h"
#include "dtrain/precision.h"

#include <stdlib.h>
#include <string.h>

/* Copies of the model's state that a forward and backward can change. */
typedef struct {
    void *grads[DT_DTYPE_COUNT], *bufs[DT_DTYPE_COUNT];
    bool zero[DT_DTYPE_COUNT]; /* the gradients were all zero bytes: restored by zeroing, no copy kept */
    uint64_t *rng;
    size_t nrng;
} saved_state;

static bool all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

static dt_status save_state(dt_model *m, saved_state *sv)
{
    memset(sv, 0, sizeof *sv);
    dt_model_grads_materialize(m); /* lazy marks read as zeros: make them zeros */
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, (dt_dtype)d), *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        size_t es = dt_dtype_size((dt_dtype)d);
        if (g && g->base && g->total && all_zero(g->base, g->total * es))
            sv->zero[d] = true; /* (the usual case at attach: the copy would double the gradients' memory) */
        else if (g && g->base && g->total && !(sv->grads[d] = dt_alloc(g->total * es)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_unit_times: a copy of the %s gradients", dt_dtype_name((dt_dtype)d));
        if (sv->grads[d])
            memcpy(sv->grads[d], g->base, g->total * es);
        if (b && b->base && b->total && !(sv->bufs[d] = dt_alloc(b->total * es)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_unit_times: a copy of the %s buffers", dt_dtype_name((dt_dtype)d));
        if (sv->bufs[d])
            memcpy(sv->bufs[d], b->base, b->total * es);
    }
    sv->nrng = dt_model_rng_state_size(m);
    if (sv->nrng && !(sv->rng = dt_alloc(sv->nrng * sizeof *sv->rng)))
        return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_unit_times: the model's dropout counters");
    return sv->nrng ? dt_model_get_rng_state(m, sv->rng, sv->nrng) : DT_OK;
}

static void restore_state(dt_model *m, saved_state *sv)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, (dt_dtype)d), *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        size_t es = dt_dtype_size((dt_dtype)d);
        if (sv->grads[d])
            memcpy(g->base, sv->grads[d], g->total * es);
        else if (sv->zero[d])
            memset(g->base, 0, g->total * es);
        if (sv->bufs[d])
            memcpy(b->base, sv->bufs[d], b->total * es);
        dt_free(sv->grads[d]);
        dt_free(sv->bufs[d]);
    }
    if (sv->rng)
        dt_model_set_rng_state(m, sv->rng, sv->nrng);
    dt_free(sv->rng);
    memset(sv, 0, sizeof *sv);
}

/* A buffer of at least n bytes (grown, contents not kept). */
static void *room(void **buf, size_t *cap, size_t n)
{
    if (n > *cap) {
        dt_free(*buf);
        *cap = 0;
        if (!(*buf = dt_alloc(n)))
            return NULL;
        *cap = n;
    }
    return *buf;
}

static const char *shape_str(const dt_tensor *x, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < x->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "] %s", dt_dtype_name(x->dtype));
    return buf;
}

/* One pass over the units: cost[i] = min(cost[i], unit i's seconds)
 * (record false: the warm-up, nothing kept). */
static dt_status one_pass(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *units, int n, const dt_tensor *x0,
                          bool record, double *cost, void **io, size_t *cap, void **ones, size_t *ocap)
{
    char sh[160];
    /* io[0] holds unit i's input (i > 0), io[1] receives its output */
    dt_dtype in_dt = x0->dtype;
    int in_nd = x0->ndim;
    int64_t in_shape[DT_MAX_DIMS];
    memcpy(in_shape, x0->shape, sizeof in_shape);
    for (int i = 0; i < n; i++) {
        dt_ctx_reset(ctx);
        dt_tensor *x = i == 0 ? dt_tensor_view_of(ctx, x0->data, in_dt, in_nd, in_shape)
                              : dt_tensor_view_of(ctx, io[0], in_dt, in_nd, in_shape);
        if (!x)
            return dt_last_status();
        dt_status st;
        if (i > 0 && (st = dt_tensor_set_requires_grad(x, true)) < 0)
            return st;
        const dt_pipe_unit *u = &units[i];
        double t0 = dt_time_s();
        dt_tensor *y = u->fn ? u->fn(ctx, m, u, x) : dt_module_forward(ctx, u->module, x);
        if (y && !dt_tensor_is_contiguous(y))
            y = dt_contiguous(ctx, y);
        if (!y)
            return dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL,
                                 "dt_pipe_unit_times: unit %d (%s) on its input %s", i, u->name,
                                 shape_str(x, sh, sizeof sh));
        if (y->flags & DT_TENSOR_REQUIRES_GRAD) { /* a unit with no parameters on the model's input has no backward */
            size_t ny = (size_t)dt_tensor_numel(y);
            float *g = room(ones, ocap, ny * sizeof(float));
            if (!g)
                return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_unit_times: a gradient of %zu elements", ny);
            for (size_t k = 0; k < ny; k++)
                g[k] = 1.0f;
            dt_tensor gt;
            if ((st = dt_tensor_init_contiguous(&gt, DT_F32, y->ndim, y->shape, g)) < 0)
                return st;
            if ((st = dt_backward_with(ctx, y, &gt)) < 0)
                return dt_error_wrap(st, "dt_pipe_unit_times: the backward of unit %d (%s)", i, u->name);
        }
        double t = dt_time_s() - t0;
        if (record && t < cost[i])
            cost[i] = t;
        /* its output is the next unit's input */
        size_t bytes = (size_t)dt_tensor_numel(y) * dt_dtype_size(y->dtype);
        if (i + 1 < n) {
            if (!room(&io[1], &cap[1], bytes ? bytes : 1))
                return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_unit_times: unit %d's output (%zu bytes)", i, bytes);
            memcpy(io[1], y->data, bytes);
            void *tb = io[0];
            size_t tc = cap[0];
            io[0] = io[1], cap[0] = cap[1];
            io[1] = tb, cap[1] = tc;
            in_dt = y->dtype;
            in_nd = y->ndim;
            memset(in_shape, 0, sizeof in_shape);
            memcpy(in_shape, y->shape, (size_t)y->ndim * sizeof *in_shape);
        }
    }
    dt_ctx_reset(ctx);
    return DT_OK;
}

dt_status dt_pipe_unit_times(dt_model *m, const dt_pipe_unit *units, int n, const dt_tensor *x, dt_dtype autocast,
                             int reps, double *cost)
{
    if (!m || !units || !x || !cost)
        return dt_error(DT_ERR_NULL, "dt_pipe_unit_times: an argument is NULL");
    if (n < 1 || reps < 1 || reps > 1000)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_times: %d units, %d repetitions (need n >= 1, 1 <= reps "
                        "<= 1000)", n, reps);
    if (autocast != DT_F32 && autocast != DT_BF16 && autocast != DT_F16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_times: autocast dtype %s (f32: off, bf16 or f16)",
                        dt_dtype_name(autocast));
    if (x->ndim < 1 || !x->data || !dt_tensor_is_contiguous(x) || x->shape[0] < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_times: the sample input must be a contiguous tensor with "
                        "a batch dim of at least one row");
    for (int i = 0; i < n; i++)
        cost[i] = 1e300;
    dt_ctx_params cp = dt_ctx_params_default();
    cp.arena_block = (size_t)1 << 20;
    dt_ctx *ctx = NULL;
    dt_status st = dt_ctx_init(&cp, &ctx);
    if (st >= 0 && autocast != DT_F32)
        st = dt_autocast_set(ctx, autocast, NULL);
    saved_state sv;
    memset(&sv, 0, sizeof sv);
    if (st >= 0)
        st = save_state(m, &sv);
    void *io[2] = {NULL, NULL}, *ones = NULL;
    size_t cap[2] = {0, 0}, ocap = 0;
    for (int r = 0; r <= reps && st >= 0; r++) /* r = 0: the warm-up */
        st = one_pass(ctx, m, units, n, x, r > 0, cost, io, cap, &ones, &ocap);
    restore_state(m, &sv);
    dt_free(io[0]);
    dt_free(io[1]);
    dt_free(ones);
    dt_ctx_free(ctx);
    return st;
}
