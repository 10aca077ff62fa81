/* The per-step context: an arena for temporaries and the autograd tape.
 *
 * Every temporary (struct and data) comes from the arena, so dt_ctx_reset
 * drops a whole step in O(1). The arena coalesces into a single block after
 * the first steps; the tape's pointer array is malloc'd once and only grows
 * when a step records more nodes than any step before. */
#include "tensor/tensor_impl.h"

#include <stdlib.h>
#include <string.h>

dt_ctx_params dt_ctx_params_default(void)
{
    dt_ctx_params p;
    p.arena_block = (size_t)64 << 20;
    return p;
}

dt_status dt_ctx_init(const dt_ctx_params *p, dt_ctx **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_ctx_init: out is NULL");
    *out = NULL;
    dt_ctx_params d = dt_ctx_params_default();
    if (!p)
        p = &d;
    dt_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return dt_error(DT_ERR_NO_MEMORY, "dt_ctx_init: out of memory");
    ctx->arena = dt_arena_init(p->arena_block);
    if (!ctx->arena) {
        free(ctx);
        return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_ctx_init: arena of %zu bytes", p->arena_block);
    }
    ctx->grad_enabled = true;
    *out = ctx;
    return DT_OK;
}

void dt_ctx_free(dt_ctx *ctx)
{
    if (!ctx)
        return;
    dt_arena_free(ctx->arena);
    free(ctx->tape);
    free(ctx->deferred);
    free(ctx->deferred_gout);
    free(ctx);
}

void dt_ctx_reset(dt_ctx *ctx)
{
    if (!ctx)
        return;
    dt_arena_reset(ctx->arena);
    ctx->tape_len = 0;
    ctx->ndeferred = 0;
    ctx->nscratch = ctx->scratch_floor = 0;
}

dt_arena *dt_ctx_arena(dt_ctx *ctx) { return ctx ? ctx->arena : NULL; }

bool dt_ctx_set_blocked(dt_ctx *ctx, bool on)
{
    if (!ctx)
        return false;
    bool old = ctx->blocked_ok;
    ctx->blocked_ok = on;
    return old;
}

bool dt_ctx_set_varying(dt_ctx *ctx, bool on)
{
    if (!ctx)
        return false;
    bool old = ctx->shapes_vary;
    ctx->shapes_vary = on;
    return old;
}

void *dt_ctx_alloc(dt_ctx *ctx, size_t bytes)
{
    if (!ctx) {
        dt_error(DT_ERR_NULL, "dt_ctx_alloc: context is NULL");
        return NULL;
    }
    return dt_arena_alloc(ctx->arena, bytes);
}

dt_tensor *dt__null_input(const char *op, const char *arg)
{
    if (dt_last_status() >= 0)
        dt_error(DT_ERR_NULL, "%s: %s is NULL", op, arg);
    return NULL;
}

dt_tensor *dt__tensor_struct(dt_ctx *ctx)
{
    if (!ctx) {
        dt_error(DT_ERR_NULL, "context is NULL");
        return NULL;
    }
    dt_tensor *t = dt_arena_alloc(ctx->arena, sizeof *t);
    if (t) {
        memset(t, 0, sizeof *t);
        t->flags = DT_TENSOR_TEMP;
    }
    return t;
}

static dt_tensor *temp_new(dt_ctx *ctx, const char *op, dt_dtype dtype, int ndim,
                           const int64_t *shape, void *data, bool alloc)
{
    if (!ctx) {
        dt_error(DT_ERR_NULL, "%s: context is NULL", op);
        return NULL;
    }
    dt_tensor *t = dt__tensor_struct(ctx);
    if (!t)
        return NULL;
    if (dt_tensor_init_contiguous(t, dtype, ndim, shape, data) < 0) {
        dt_error_wrap(dt_last_status(), "%s", op);
        return NULL;
    }
    t->flags = DT_TENSOR_TEMP;
    if (alloc) {
        t->data = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(t));
        if (!t->data)
            return NULL;
    }
    return t;
}

dt_tensor *dt_tensor_empty(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape)
{
    return temp_new(ctx, "dt_tensor_empty", dtype, ndim, shape, NULL, true);
}

dt_tensor *dt_tensor_zeros(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape)
{
    dt_tensor *t = temp_new(ctx, "dt_tensor_zeros", dtype, ndim, shape, NULL, true);
    if (t)
        memset(t->data, 0, dt_tensor_nbytes(t));
    return t;
}

dt_tensor *dt_tensor_full(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape, double v)
{
    dt_tensor *t = temp_new(ctx, "dt_tensor_full", dtype, ndim, shape, NULL, true);
    if (t)
        dt_tensor_fill(t, v);
    return t;
}

dt_tensor *dt_tensor_from(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape,
                          const void *src)
{
    dt_tensor *t = temp_new(ctx, "dt_tensor_from", dtype, ndim, shape, NULL, true);
    if (!t)
        return NULL;
    if (!src && dt_tensor_numel(t) > 0) {
        dt_error(DT_ERR_NULL, "dt_tensor_from: src is NULL");
        return NULL;
    }
    if (src)
        memcpy(t->data, src, dt_tensor_nbytes(t));
    return t;
}

dt_tensor *dt_tensor_view_of(dt_ctx *ctx, void *data, dt_dtype dtype, int ndim,
                             const int64_t *shape)
{
    dt_tensor *t = temp_new(ctx, "dt_tensor_view_of", dtype, ndim, shape, data, false);
    if (t && !data && dt_tensor_numel(t) > 0) {
        dt_error(DT_ERR_NULL, "dt_tensor_view_of: data is NULL");
        return NULL;
    }
    return t;
}

dt_tensor *dt_tensor_clone(dt_ctx *ctx, const dt_tensor *t)
{
    if (!t)
        return dt__null_input("dt_tensor_clone", "t");
    dt_tensor *c = temp_new(ctx, "dt_tensor_clone", t->dtype, t->ndim, t->shape, NULL, true);
    if (!c)
        return NULL;
    dt_tensor_read(t, c->data);
    return c;
}

dt_tensor *dt_tensor_alias(dt_ctx *ctx, const dt_tensor *t)
{
    if (!t)
        return dt__null_input("dt_tensor_alias", "t");
    dt_tensor *a = dt__tensor_struct(ctx);
    if (!a)
        return NULL;
    a->dtype = t->dtype;
    a->ndim = t->ndim;
    memcpy(a->shape, t->shape, sizeof a->shape);
    memcpy(a->strides, t->strides, sizeof a->strides);
    a->data = t->data;
    a->name = t->name;
    a->flags = DT_TENSOR_TEMP | (t->flags & DT_TENSOR_BLOCKED);
    return a;
}
