/* Tensor parallelism (Megatron-LM): the conjugate
 * operators f and g, all-gather / split along the last dim, column- and
 * row-parallel linear layers, the vocabulary-parallel embedding and
 * cross-entropy, and the initialisation of a tensor-parallel model from the
 * single-process model's values.
 *
 * Each operator is an autograd custom op whose backward is the adjoint
 * collective: f (identity) <-> all-reduce, g (all-reduce) <-> identity,
 * gather (all-gather) <-> slice, scatter (slice) <-> all-gather. Gradients
 * are f32 (autograd.h), so backward collectives run in f32 whatever the
 * activations' dtype.
 *
 * The vocabulary-parallel cross-entropy follows Megatron's
 * _VocabParallelCrossEntropy: the row max and the sum of exponentials are
 * combined over the group (a MAX all-reduce of N floats, then one SUM
 * all-reduce of [sum exp, target logit] in double), so no rank forms the
 * full [N, V] logits; the backward softmax(l) - onehot is local. */
#include "tp_impl.h"
#include "nn/nn_layer.h"
#include "autograd/ag_refetch.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- groups ------------------------------------------------------------------------- */

dt_status dt_tp_groups(dt_pg *world, int tp_size, dt_pg **tp, dt_pg **dp)
{
    if (!world || !tp || !dp)
        return dt_error(DT_ERR_NULL, "dt_tp_groups: %s is NULL", !world ? "world" : !tp ? "tp" : "dp");
    *tp = *dp = NULL;
    int W = dt_pg_size(world), r = dt_pg_rank(world);
    if (tp_size < 1 || W % tp_size)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tp_groups: tensor-parallel size %d does not divide the world size %d",
                        tp_size, W);
    dt_status st = dt_pg_split(world, r / tp_size, r, tp);
    if (st < 0)
        return dt_error_wrap(st, "dt_tp_groups: tensor-parallel groups");
    if ((st = dt_pg_split(world, r % tp_size, r, dp)) < 0) {
        dt_pg_free(*tp);
        *tp = NULL;
        return dt_error_wrap(st, "dt_tp_groups: data-parallel groups");
    }
    return DT_OK;
}

/* ---- conjugate operators ------------------------------------------------------------ */

static bool tp_trivial(dt_pg *tp) { return dt_pg_size(tp) <= 1; }

static dt_tensor *need(const char *op, dt_pg *tp, dt_tensor *x)
{
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: input is NULL", op);
        return NULL;
    }
    if (!tp) {
        dt_error(DT_ERR_NULL, "%s: group is NULL", op);
        return NULL;
    }
    return x;
}

static dt_status copy_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    if (!gin[0])
        return DT_OK;
    memcpy(gin[0]->data, gout->data, dt_tensor_nbytes(gin[0]));
    dt_status st = dt_pg_allreduce(ud, DT_IN_PLACE, gin[0]->data, (size_t)dt_tensor_numel(gin[0]), DT_F32,
                                   DT_REDUCE_SUM);
    return st < 0 ? dt_error_wrap(st, "tensor parallel f (copy to region) backward: all-reduce") : DT_OK;
}

dt_tensor *dt_tp_copy_to_region(dt_ctx *ctx, dt_pg *tp, dt_tensor *x)
{
    if (!need("dt_tp_copy_to_region", tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    dt_tensor *out = dt_tensor_alias(ctx, x);
    return out ? dt_ag_custom(ctx, 1, &x, out, copy_bwd, tp) : NULL;
}

static dt_status ident_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin, (void)ud;
    if (gin[0])
        memcpy(gin[0]->data, gout->data, dt_tensor_nbytes(gin[0]));
    return DT_OK;
}

/* x the caller gives up (tp.h): an op's own contiguous output, which neither its producer's backward nor g's reads */
static bool given_up(const dt_tensor *x) { return x->node_ && dt_tensor_is_contiguous(x); }

/* g: the sum into a copy of x, or with in_place into x's own memory (the result aliases x) */
static dt_tensor *reduce_g(const char *op, dt_ctx *ctx, dt_pg *tp, dt_tensor *x, bool in_place)
{
    if (!need(op, tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    dt_tensor *out = in_place && given_up(x) ? dt_tensor_alias(ctx, x) : dt_tensor_clone(ctx, x);
    if (!out)
        return NULL;
    dt_status st = dt_pg_allreduce(tp, DT_IN_PLACE, out->data, (size_t)dt_tensor_numel(out), out->dtype,
                                   DT_REDUCE_SUM);
    if (st < 0) {
        dt_error_wrap(st, "tensor parallel g (reduce from region): all-reduce");
        return NULL;
    }
    return dt_ag_custom(ctx, 1, &x, out, ident_bwd, tp);
}

dt_tensor *dt_tp_reduce_from_region(dt_ctx *ctx, dt_pg *tp, dt_tensor *x)
{
    return reduce_g("dt_tp_reduce_from_region", ctx, tp, x, false);
}

dt_tensor *dt_tp_reduce_partial(dt_ctx *ctx, dt_pg *tp, dt_tensor *x)
{
    return reduce_g("dt_tp_reduce_partial", ctx, tp, x, true);
}

/* Rows M and the last dim n of x (ndim >= 1). */
static void rows_cols(const dt_tensor *x, int64_t *M, int64_t *n)
{
    *n = x->ndim ? x->shape[x->ndim - 1] : 1;
    *M = *n ? dt_tensor_numel(x) / *n : 0;
}

/* dst[m, off + j] = src[m, j] for j < n (dst rows of N, src rows of n). */
static void put_cols(char *dst, const char *src, int64_t M, int64_t N, int64_t n, int64_t off, size_t es)
{
    for (int64_t m = 0; m < M; m++)
        memcpy(dst + (size_t)(m * N + off) * es, src + (size_t)(m * n) * es, (size_t)n * es);
}

/* dst[m, j] = src[m, off + j]. */
static void get_cols(char *dst, const char *src, int64_t M, int64_t N, int64_t n, int64_t off, size_t es)
{
    for (int64_t m = 0; m < M; m++)
        memcpy(dst + (size_t)(m * n) * es, src + (size_t)(m * N + off) * es, (size_t)n * es);
}

static dt_status gather_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    if (!gin[0])
        return DT_OK;
    int64_t M, n;
    rows_cols(gin[0], &M, &n);
    get_cols(gin[0]->data, gout->data, M, n * dt_pg_size(ud), n, n * dt_pg_rank(ud), sizeof(float));
    return DT_OK;
}

/* All-gather of x's rows [M, n] into out [M, t n] (x contiguous, any dtype). */
static dt_status gather_rows(dt_ctx *ctx, dt_pg *tp, const void *x, void *out, int64_t M, int64_t n, dt_dtype dt)
{
    const int t = dt_pg_size(tp);
    const size_t es = dt_dtype_size(dt);
    if (M == 1) /* the ranks' pieces lie side by side in out already */
        return dt_pg_allgather(tp, x, out, (size_t)n, dt);
    const size_t bytes = (size_t)(t * M * n) * es + 1;
    char *buf = dt_ctx_alloc(ctx, bytes); /* [t, M, n], given back at once: staging, not an activation */
    if (!buf)
        return dt_last_status();
    dt_status st = dt_pg_allgather(tp, x, buf, (size_t)(M * n), dt);
    for (int r = 0; r < t && st >= 0; r++)
        put_cols(out, buf + (size_t)(r * M * n) * es, M, t * n, n, r * n, es);
    dt_arena_give_back(dt_ctx_arena(ctx), buf, bytes);
    return st;
}

dt_tensor *dt_tp_gather_last(dt_ctx *ctx, dt_pg *tp, dt_tensor *x)
{
    if (!need("dt_tp_gather_last", tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    if (x->ndim < 1) {
        dt_error(DT_ERR_SHAPE, "dt_tp_gather_last: x is a scalar (needs a last dim)");
        return NULL;
    }
    dt_tensor *c = dt_tensor_clone(ctx, x);
    if (!c)
        return NULL;
    int64_t M, n, shape[DT_MAX_DIMS];
    rows_cols(c, &M, &n);
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = n * dt_pg_size(tp);
    dt_tensor *out = dt_tensor_empty(ctx, x->dtype, x->ndim, shape);
    if (!out)
        return NULL;
    dt_status st = gather_rows(ctx, tp, c->data, out->data, M, n, x->dtype);
    if (st < 0) {
        dt_error_wrap(st, "dt_tp_gather_last: all-gather");
        return NULL;
    }
    return dt_ag_custom(ctx, 1, &x, out, gather_bwd, tp);
}

static dt_status scatter_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)nin;
    if (!gin[0])
        return DT_OK;
    int64_t M, n;
    rows_cols(gout, &M, &n);
    dt_status st = gather_rows(ctx, ud, gout->data, gin[0]->data, M, n, DT_F32);
    return st < 0 ? dt_error_wrap(st, "dt_tp_scatter_last backward: all-gather") : DT_OK;
}

dt_tensor *dt_tp_scatter_last(dt_ctx *ctx, dt_pg *tp, dt_tensor *x)
{
    if (!need("dt_tp_scatter_last", tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    const int t = dt_pg_size(tp);
    if (x->ndim < 1 || x->shape[x->ndim - 1] % t) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "dt_tp_scatter_last: x %s: the last dim is not divisible by the group size %d",
                 dt_tensor_shape_str(x, s, sizeof s), t);
        return NULL;
    }
    dt_tensor *c = dt_tensor_clone(ctx, x);
    if (!c)
        return NULL;
    int64_t M, N, shape[DT_MAX_DIMS];
    rows_cols(c, &M, &N);
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = N / t;
    dt_tensor *out = dt_tensor_empty(ctx, x->dtype, x->ndim, shape);
    if (!out)
        return NULL;
    get_cols(out->data, c->data, M, N, N / t, N / t * dt_pg_rank(tp), dt_dtype_size(x->dtype));
    return dt_ag_custom(ctx, 1, &x, out, scatter_bwd, tp);
}

/* ---- sequence parallelism: the same along any dim ---------------------------------------- */

/* x viewed as [outer, n, inner] around dim: the rank's chunk is `outer`
 * runs of n*inner elements; the t chunks of the full tensor side by side
 * along dim are [outer, t n inner]. */
typedef struct {
    int dim;
    int64_t outer, n, inner; /* n: the LOCAL extent along dim */
} sp_geom;

static bool sp_geom_of(const char *op, const dt_tensor *x, int dim, int64_t div, sp_geom *g)
{
    char s[96];
    int d = dim < 0 ? dim + x->ndim : dim;
    if (d < 0 || d >= x->ndim || (div > 1 && x->shape[d] % div)) {
        dt_error(DT_ERR_SHAPE, "%s: x %s: dim %d %s", op, dt_tensor_shape_str(x, s, sizeof s), dim,
                 d < 0 || d >= x->ndim ? "is outside its dims" : "is not divisible by the group size");
        return false;
    }
    g->dim = d;
    g->outer = g->inner = 1;
    for (int i = 0; i < d; i++)
        g->outer *= x->shape[i];
    for (int i = d + 1; i < x->ndim; i++)
        g->inner *= x->shape[i];
    g->n = x->shape[d] / (div > 1 ? div : 1);
    return true;
}

typedef struct {
    dt_pg *tp;
    sp_geom g;
} sp_save;

/* all-gather of the local [outer, n inner] into out [outer, t n inner] */
static dt_status sp_allgather(dt_ctx *ctx, dt_pg *tp, const void *x, void *out, const sp_geom *g, dt_dtype dt)
{
    return gather_rows(ctx, tp, x, out, g->outer, g->n * g->inner, dt);
}

/* reduce-scatter (sum) of the full [outer, t n inner] into out [outer, n inner]:
 * the chunks are laid out rank by rank first (contiguous blocks) */
static dt_status sp_reduce_scatter(dt_ctx *ctx, dt_pg *tp, const void *full, void *out, const sp_geom *g,
                                   dt_dtype dt)
{
    const int t = dt_pg_size(tp);
    const size_t es = dt_dtype_size(dt);
    const int64_t w = g->n * g->inner, cnt = g->outer * w;
    if (g->outer == 1) /* the chunks are contiguous blocks rank by rank already */
        return dt_pg_reduce_scatter(tp, full, out, (size_t)cnt, dt, DT_REDUCE_SUM);
    const size_t bytes = (size_t)(t * cnt) * es + 1;
    char *blk = dt_ctx_alloc(ctx, bytes); /* staging, given back at once */
    if (!blk)
        return dt_last_status();
    for (int r = 0; r < t; r++)
        get_cols(blk + (size_t)(r * cnt) * es, full, g->outer, t * w, w, r * w, es);
    dt_status st = dt_pg_reduce_scatter(tp, blk, out, (size_t)cnt, dt, DT_REDUCE_SUM);
    dt_arena_give_back(dt_ctx_arena(ctx), blk, bytes);
    return st;
}

static dt_status sp_gather_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)nin;
    sp_save *s = ud;
    if (!gin[0])
        return DT_OK;
    dt_status st = sp_reduce_scatter(ctx, s->tp, gout->data, gin[0]->data, &s->g, DT_F32);
    return st < 0 ? dt_error_wrap(st, "dt_tp_sp_gather backward: reduce-scatter") : DT_OK;
}

static dt_status sp_allgather_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)nin;
    sp_save *s = ud;
    if (!gin[0])
        return DT_OK;
    dt_status st = sp_allgather(ctx, s->tp, gout->data, gin[0]->data, &s->g, DT_F32);
    return st < 0 ? dt_error_wrap(st, "tensor parallel sequence chunk backward: all-gather") : DT_OK;
}

/* Shared front of the three: checks, x's data contiguous (a copy only
 * when it is not: sp_end gives it back), the geometry (div: the group size
 * when x is full along dim, 1 when it is a chunk) and the output with
 * `extent` along dim. */
static dt_tensor *sp_begin(const char *op, dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim, bool full_in,
                           bool full_out, dt_tensor **c, sp_save **s)
{
    if (!(*c = dt_tensor_is_contiguous(x) ? x : dt_tensor_clone(ctx, x)) || !(*s = dt_ctx_alloc(ctx, sizeof **s)))
        return NULL;
    const int t = dt_pg_size(tp);
    if (!sp_geom_of(op, x, dim, full_in ? t : 1, &(*s)->g))
        return NULL;
    (*s)->tp = tp;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[(*s)->g.dim] = (*s)->g.n * (full_out ? t : 1);
    return dt_tensor_empty(ctx, x->dtype, x->ndim, shape);
}

/* The op has read c: a copy of x (sp_begin) goes back to the arena */
static void sp_end(dt_ctx *ctx, const dt_tensor *x, dt_tensor *c)
{
    if (c && c != x)
        dt_arena_give_back(dt_ctx_arena(ctx), c->data, dt_tensor_nbytes(c));
}

dt_tensor *dt_tp_sp_gather(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim)
{
    const char *op = "dt_tp_sp_gather";
    if (!need(op, tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    dt_tensor *c, *out;
    sp_save *s;
    if (!(out = sp_begin(op, ctx, tp, x, dim, false, true, &c, &s)))
        return NULL;
    dt_status st = sp_allgather(ctx, tp, c->data, out->data, &s->g, x->dtype);
    sp_end(ctx, x, c);
    if (st < 0) {
        dt_error_wrap(st, "%s: all-gather", op);
        return NULL;
    }
    return dt_ag_custom(ctx, 1, &x, out, sp_gather_bwd, s);
}

/* dt_tp_sp_reduce_scatter, and with partial its form on a partial sum the caller gives up: x's memory goes back to
 * the step's arena once reduced (the all-gather backward reads only the gradient) */
static dt_tensor *sp_reduce_scatter_op(const char *op, dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim, bool partial)
{
    if (!need(op, tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    dt_tensor *c, *out;
    sp_save *s;
    if (!(out = sp_begin(op, ctx, tp, x, dim, true, false, &c, &s)))
        return NULL;
    dt_status st = sp_reduce_scatter(ctx, tp, c->data, out->data, &s->g, x->dtype);
    sp_end(ctx, x, c);
    if (st < 0) {
        dt_error_wrap(st, "%s: reduce-scatter", op);
        return NULL;
    }
    if (partial && given_up(x))
        dt_arena_give_back(dt_ctx_arena(ctx), x->data, dt_tensor_nbytes(x));
    return dt_ag_custom(ctx, 1, &x, out, sp_allgather_bwd, s);
}

dt_tensor *dt_tp_sp_reduce_scatter(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim)
{
    return sp_reduce_scatter_op("dt_tp_sp_reduce_scatter", ctx, tp, x, dim, false);
}

dt_tensor *dt_tp_sp_reduce_scatter_partial(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim)
{
    return sp_reduce_scatter_op("dt_tp_sp_reduce_scatter_partial", ctx, tp, x, dim, true);
}

dt_tensor *dt_tp_sp_scatter(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim)
{
    const char *op = "dt_tp_sp_scatter";
    if (!need(op, tp, x))
        return NULL;
    if (tp_trivial(tp))
        return x;
    dt_tensor *c, *out;
    sp_save *s;
    if (!(out = sp_begin(op, ctx, tp, x, dim, true, false, &c, &s)))
        return NULL;
    const int64_t w = s->g.n * s->g.inner;
    get_cols(out->data, c->data, s->g.outer, w * dt_pg_size(tp), w, w * dt_pg_rank(tp), dt_dtype_size(x->dtype));
    sp_end(ctx, x, c);
    return dt_ag_custom(ctx, 1, &x, out, sp_allgather_bwd, s);
}

/* ---- sequence parallelism's column-parallel products --------------------------------------- */

/* The gathered input of dt_tp_sp_gather_products, fetched again for the weights' gradients */
typedef struct {
    dt__refetch r; /* first: the products' backwards hold &r */
    dt_pg *tp;
    const dt_tensor *x; /* the rank's rows (contiguous; the gather's input, kept) */
    sp_geom g;
    int users;   /* products whose weight trains: each gets and puts once a backward */
    int pending; /* of them, still to put the gathered input back */
    void *buf;   /* the gathered input while pending */
    size_t bytes;
    dt_dtype dtype;
} sp_refetch;

static const void *refetch_get(dt_ctx *ctx, dt__refetch *r, dt_dtype t)
{
    sp_refetch *s = (sp_refetch *)r;
    if (s->buf && s->dtype == t)
        return s->buf;
    if (s->buf) {
        dt_error(DT_ERR_STATE, "dt_tp_sp_gather_products backward: its products want the input in %s and %s",
                 dt_dtype_name(s->dtype), dt_dtype_name(t));
        return NULL;
    }
    const int64_t n = dt_tensor_numel(s->x) * dt_pg_size(s->tp);
    const size_t xs = dt_dtype_size(s->x->dtype), xbytes = (size_t)n * xs;
    s->bytes = (size_t)n * dt_dtype_size(t);
    if (!(s->buf = dt_ctx_alloc(ctx, s->bytes)))
        return NULL;
    void *tmp = s->x->dtype == t ? s->buf : dt_ctx_alloc(ctx, xbytes);
    dt_status st = tmp ? sp_allgather(ctx, s->tp, s->x->data, tmp, &s->g, s->x->dtype) : dt_last_status();
    if (st >= 0 && tmp != s->buf)
        st = dt_k_convert(tmp, s->x->dtype, s->buf, t, n);
    if (tmp && tmp != s->buf)
        dt_arena_give_back(dt_ctx_arena(ctx), tmp, xbytes);
    if (st < 0) {
        dt_error_wrap(st, "dt_tp_sp_gather_products backward: all-gather of the input");
        dt_arena_give_back(dt_ctx_arena(ctx), s->buf, s->bytes);
        s->buf = NULL;
        return NULL;
    }
    s->dtype = t;
    s->pending = s->users;
    return s->buf;
}

static void refetch_put(dt_ctx *ctx, dt__refetch *r)
{
    sp_refetch *s = (sp_refetch *)r;
    if (s->pending > 0 && --s->pending == 0) {
        dt_arena_give_back(dt_ctx_arena(ctx), s->buf, s->bytes);
        s->buf = NULL;
    }
}

dt_status dt_tp_sp_gather_products(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim, int n, dt_tensor *const *w,
                                   dt_tensor *const *b, bool weight_in_out, dt_tensor **y)
{
    const char *op = "dt_tp_sp_gather_products";
    if (!y || !w || n < 1 || n > 8)
        return dt_error(!y || !w ? DT_ERR_NULL : DT_ERR_INVALID_ARG, "%s: %s", op,
                        !y ? "y is NULL" : !w ? "w is NULL" : "n must be 1 to 8");
    for (int i = 0; i < n; i++)
        y[i] = NULL;
    dt_tensor *g = dt_tp_sp_gather(ctx, tp, x, dim);
    if (!g)
        return dt_last_status();
    for (int i = 0; i < n; i++) {
        dt_tensor *bi = b ? b[i] : NULL;
        if (!(y[i] = weight_in_out ? dt_addmm(ctx, g, w[i], bi) : dt_linear(ctx, g, w[i], bi))) {
            for (int j = 0; j < i; j++)
                y[j] = NULL;
            return dt_error_wrap(dt_last_status(), "%s: product %d", op, i);
        }
    }
    if (g == x || !g->node_ || !dt_tensor_is_contiguous(x)) /* one rank, no-grad mode, or the rows copied */
        return DT_OK;
    sp_refetch *s = dt_ctx_alloc(ctx, sizeof *s);
    if (s)
        *s = (sp_refetch){.r = {refetch_get, refetch_put}, .tp = tp, .x = x};
    if (!s || !sp_geom_of(op, x, dim, 1, &s->g)) { /* (the gather took the same dim) */
        for (int i = 0; i < n; i++)
            y[i] = NULL;
        return dt_last_status();
    }
    int set = 0;
    for (int i = 0; i < n; i++)
        if (dt__dense_refetch(ctx, y[i], g, &s->r)) {
            set++;
            s->users += (w[i]->flags & DT_TENSOR_REQUIRES_GRAD) != 0;
        }
    if (set == n) /* no product holds it: the gather's backward reads only the gradient */
        dt_arena_give_back(dt_ctx_arena(ctx), g->data, dt_tensor_nbytes(g));
    return DT_OK;
}

/* ---- layers --------------------------------------------------------------------------- */

/* Module fields used: in, out = the full layer's sizes; k = gather_output
 * (column) / input_is_parallel (row); stride = chunks; ud = the group. */

static bool is_tp_type(const dt_module *m)
{
    const char *t = m && m->kind == DT_NN_CUSTOM ? m->type : NULL;
    return t && (!strcmp(t, "ColumnParallelLinear") || !strcmp(t, "RowParallelLinear") ||
                 !strcmp(t, "VocabParallelEmbedding") || !strcmp(t, "VocabParallelLMHead"));
}

dt_pg *dt_tp_module_group(const dt_module *m) { return !m ? NULL : m->tp ? m->tp : is_tp_type(m) ? m->ud : NULL; }

dt_status dt_tp_module_set_group(dt_module *m, dt_pg *tp)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_tp_module_set_group: module is NULL");
    m->tp = tp;
    return DT_OK;
}

const char *dt_tp_model_slice(const dt_model *m)
{
    for (size_t i = 0; m && i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        if (dt_model_entry(m, i, &p) >= 0 && !p.is_buffer && p.tp_dim)
            return p.name;
    }
    return NULL;
}

dt_pg *dt_tp_model_group(const dt_model *m)
{
    for (size_t i = 0; m && i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        dt_pg *g;
        if (dt_model_entry(m, i, &p) >= 0 && !p.is_buffer && p.tp_dim && (g = dt_tp_module_group(p.module)))
            return g;
    }
    return NULL;
}

static dt_tensor *check_in(dt_module *self, dt_tensor *x, int64_t want)
{
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s (%s): input is NULL", self->path, self->type);
        return NULL;
    }
    if (x->ndim < 1 || x->shape[x->ndim - 1] != want) {
        char s[96];
        dt_error(DT_ERR_SHAPE, "%s (%s): input %s, expected [..., %lld]", self->path, self->type,
                 dt_tensor_shape_str(x, s, sizeof s), (long long)want);
        return NULL;
    }
    return x;
}

static dt_tensor *column_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    if (!check_in(self, x, self->in))
        return NULL;
    dt_tensor *y = dt_addmm(ctx, dt_tp_copy_to_region(ctx, ud, x), self->params[0],
                            self->nparam > 1 ? self->params[1] : NULL);
    return self->k ? dt_tp_gather_last(ctx, ud, y) : y;
}

static dt_tensor *row_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const int64_t local_in = self->params[0]->shape[0];
    if (!check_in(self, x, self->k ? local_in : self->in))
        return NULL;
    if (!self->k)
        x = dt_tp_scatter_last(ctx, ud, x);
    dt_tensor *y = dt_tp_reduce_partial(ctx, ud, dt_addmm(ctx, x, self->params[0], NULL));
    return self->nparam > 1 ? dt_add(ctx, y, self->params[1]) : y;
}

static bool check_group(const char *what, dt_pg *tp)
{
    if (!tp) {
        dt_error(DT_ERR_NULL, "%s: the tensor-parallel group is NULL", what);
        return false;
    }
    return true;
}

dt_module *dt_tp_column_linear(dt_pg *tp, int64_t in, int64_t out, bool bias, bool gather_output, int chunks)
{
    if (!check_group("dt_tp_column_linear", tp))
        return NULL;
    const int t = dt_pg_size(tp);
    if (chunks < 1)
        chunks = 1;
    if (in < 1 || out < 1 || out % ((int64_t)t * chunks) || (gather_output && chunks > 1)) {
        dt_error(DT_ERR_INVALID_ARG, "dt_tp_column_linear: [in %lld, out %lld] with %d chunks over %d ranks: out "
                 "must be a multiple of ranks x chunks%s", (long long)in, (long long)out, chunks, t,
                 gather_output && chunks > 1 ? " (and gather_output needs one chunk)" : "");
        return NULL;
    }
    dt_nn_param_spec s[2] = {
        {.name = "weight", .ndim = 2, .shape = {in, out / t}, .init = DT_NN_INIT_NORMAL, .a = 0.02f, .tp_dim = 2,
         .tp_chunks = chunks},
        {.name = "bias", .ndim = 1, .shape = {out / t}, .init = DT_NN_INIT_ZEROS, .tp_dim = 1, .tp_chunks = chunks},
    };
    dt_module *m = dt_nn_custom("ColumnParallelLinear", bias ? 2 : 1, s, column_forward, tp);
    if (m) {
        m->in = in, m->out = out, m->k = gather_output, m->stride = chunks;
        if (dt__tp_lora_std(m, tp, true, gather_output) < 0) {
            dt_module_free(m);
            return NULL;
        }
    }
    return m;
}

dt_module *dt_tp_row_linear(dt_pg *tp, int64_t in, int64_t out, bool bias, bool input_is_parallel)
{
    if (!check_group("dt_tp_row_linear", tp))
        return NULL;
    const int t = dt_pg_size(tp);
    if (in < 1 || out < 1 || in % t) {
        dt_error(DT_ERR_INVALID_ARG, "dt_tp_row_linear: [in %lld, out %lld] over %d ranks: in must be a multiple "
                 "of the ranks", (long long)in, (long long)out, t);
        return NULL;
    }
    dt_nn_param_spec s[2] = {
        {.name = "weight", .ndim = 2, .shape = {in / t, out}, .init = DT_NN_INIT_NORMAL, .a = 0.02f, .tp_dim = 1},
        {.name = "bias", .ndim = 1, .shape = {out}, .init = DT_NN_INIT_ZEROS},
    };
    dt_module *m = dt_nn_custom("RowParallelLinear", bias ? 2 : 1, s, row_forward, tp);
    if (m) {
        m->in = in, m->out = out, m->k = input_is_parallel, m->stride = 1;
        if (dt__tp_lora_std(m, tp, false, input_is_parallel) < 0) {
            dt_module_free(m);
            return NULL;
        }
    }
    return m;
}

void dt_tp_vocab_range(dt_pg *tp, int64_t V, int64_t *lo, int64_t *n, int64_t *local_rows)
{
    const int t = tp ? dt_pg_size(tp) : 1, r = tp ? dt_pg_rank(tp) : 0;
    const int64_t Vl = (V + t - 1) / t, l = (int64_t)r * Vl;
    int64_t k = V - l;
    if (lo)
        *lo = l;
    if (n)
        *n = k < 0 ? 0 : k > Vl ? Vl : k;
    if (local_rows)
        *local_rows = Vl;
}

/* self->in = V */
static dt_tensor *vocab_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    char s[96];
    if (!idx) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s (%s): input is NULL", self->path, self->type);
        return NULL;
    }
    if (idx->dtype != DT_I64 && idx->dtype != DT_I32) {
        dt_error(DT_ERR_DTYPE, "%s (%s): ids %s are %s, want i32 or i64", self->path, self->type,
                 dt_tensor_shape_str(idx, s, sizeof s), dt_dtype_name(idx->dtype));
        return NULL;
    }
    const int64_t V = self->in;
    int64_t lo, n;
    dt_tp_vocab_range(ud, V, &lo, &n, NULL);
    dt_tensor *c = dt_tensor_clone(ctx, idx);
    if (!c)
        return NULL;
    const int64_t N = dt_tensor_numel(c);
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, idx->shape, sizeof shape);
    shape[idx->ndim] = 1;
    dt_tensor *lid = dt_tensor_empty(ctx, DT_I64, idx->ndim, idx->shape);
    dt_tensor *mask = dt_tensor_empty(ctx, DT_F32, idx->ndim + 1, shape);
    if (!lid || !mask)
        return NULL;
    int64_t *li = lid->data;
    float *mk = mask->data;
    for (int64_t i = 0; i < N; i++) {
        int64_t v = c->dtype == DT_I64 ? ((const int64_t *)c->data)[i] : ((const int32_t *)c->data)[i];
        if (v < 0 || v >= V) {
            dt_error(DT_ERR_RANGE, "%s (%s): id %lld at position %lld is outside [0, %lld)", self->path, self->type,
                     (long long)v, (long long)i, (long long)V);
            return NULL;
        }
        bool mine = v >= lo && v < lo + n;
        li[i] = mine ? v - lo : 0;
        mk[i] = mine ? 1.0f : 0.0f;
    }
    dt_tensor *e = dt_mul(ctx, dt_embedding(ctx, self->params[0], lid), mask);
    return dt_tp_reduce_partial(ctx, ud, e);
}

dt_module *dt_tp_vocab_embedding(dt_pg *tp, int64_t num_embeddings, int64_t dim)
{
    if (!check_group("dt_tp_vocab_embedding", tp))
        return NULL;
    if (num_embeddings < 1 || dim < 1) {
        dt_error(DT_ERR_INVALID_ARG, "dt_tp_vocab_embedding: [%lld, %lld]: sizes must be >= 1",
                 (long long)num_embeddings, (long long)dim);
        return NULL;
    }
    int64_t Vl;
    dt_tp_vocab_range(tp, num_embeddings, NULL, NULL, &Vl);
    dt_nn_param_spec s = {.name = "weight", .ndim = 2, .shape = {Vl, dim}, .init = DT_NN_INIT_NORMAL, .a = 1.0f,
                          .tp_dim = 1};
    dt_module *m = dt_nn_custom("VocabParallelEmbedding", 1, &s, vocab_forward, tp);
    if (m) {
        m->in = num_embeddings, m->out = dim;
    }
    return m;
}

/* self->in = V, self->k = input_is_gathered */
static dt_tensor *vocab_head_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    if (!check_in(self, x, self->out))
        return NULL;
    return dt_linear(ctx, self->k ? x : dt_tp_copy_to_region(ctx, ud, x), self->params[0], NULL);
}

dt_module *dt_tp_vocab_head(dt_pg *tp, int64_t num_embeddings, int64_t dim, bool input_is_gathered)
{
    if (!check_group("dt_tp_vocab_head", tp))
        return NULL;
    if (num_embeddings < 1 || dim < 1) {
        dt_error(DT_ERR_INVALID_ARG, "dt_tp_vocab_head: [%lld, %lld]: sizes must be >= 1", (long long)num_embeddings,
                 (long long)dim);
        return NULL;
    }
    int64_t Vl;
    dt_tp_vocab_range(tp, num_embeddings, NULL, NULL, &Vl);
    dt_nn_param_spec s = {.name = "weight", .ndim = 2, .shape = {Vl, dim}, .init = DT_NN_INIT_NORMAL, .a = 0.02f,
                          .tp_dim = 1};
    dt_module *m = dt_nn_custom("VocabParallelLMHead", 1, &s, vocab_head_forward, tp);
    if (m) {
        m->in = num_embeddings, m->out = dim, m->k = input_is_gathered;
    }
    return m;
}

/* ---- vocabulary-parallel cross-entropy -------------------------------------------------- */

/* Rows x columns above which the rows are spread over the threads (each row's sums stay in their order) */
#define VCE_PAR ((int64_t)1 << 16)

typedef struct {
    const float *logits; /* [N, Vl] contiguous: the logits' own memory (their producer's output), or a copy */
    const int64_t *labels;
    const float *mx;     /* [N] global row max */
    const double *sum;   /* [N] global sum of exp(l - max) */
    int64_t N, Vl, lo, nv, count;
} vce_save;

static dt_status vce_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const vce_save *s = ud;
    if (!gin[0] || !s->count)
        return DT_OK;
    const float g = ((const float *)gout->data)[0] / (float)s->count;
    float *d = gin[0]->data;
#pragma omp parallel for schedule(static) if (s->N * s->nv > VCE_PAR)
    for (int64_t i = 0; i < s->N; i++) {
        const int64_t y = s->labels[i];
        if (y == -100)
            continue;
        const float *l = s->logits + i * s->Vl;
        float *o = d + i * s->Vl;
        const float m = s->mx[i];
        const double inv = 1.0 / s->sum[i];
        for (int64_t j = 0; j < s->nv; j++)
            o[j] = (float)((double)expf(l[j] - m) * inv) * g;
        if (y >= s->lo && y < s->lo + s->nv)
            o[y - s->lo] -= g;
    }
    return DT_OK;
}

dt_tensor *dt_tp_vocab_cross_entropy(dt_ctx *ctx, dt_pg *tp, dt_tensor *logits, dt_tensor *labels, int64_t V)
{
    const char *op = "dt_tp_vocab_cross_entropy";
    char s1[96], s2[96];
    if (!need(op, tp, logits) || !labels) {
        if (logits && tp && dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: labels are NULL", op);
        return NULL;
    }
    int64_t lo, nv, Vl;
    dt_tp_vocab_range(tp, V, &lo, &nv, &Vl);
    if ((logits->dtype == DT_BF16 || logits->dtype == DT_F16) && !(logits = dt_cast(ctx, logits, DT_F32)))
        return NULL; /* a loss is f32 (precision.h); the cast carries the gradient back */
    const bool lab_ok = labels->dtype == DT_I64 || labels->dtype == DT_I32;
    if (logits->dtype != DT_F32 || !lab_ok || logits->ndim < 2 || logits->shape[logits->ndim - 1] != Vl ||
        labels->ndim != logits->ndim - 1 || dt_tensor_numel(labels) * Vl != dt_tensor_numel(logits)) {
        dt_error(DT_ERR_SHAPE, "%s: logits %s %s and labels %s %s: want f32 logits [..., %lld] (vocabulary %lld "
                 "over %d ranks) and i32/i64 labels of the leading shape", op,
                 dt_tensor_shape_str(logits, s1, sizeof s1), dt_dtype_name(logits->dtype),
                 dt_tensor_shape_str(labels, s2, sizeof s2), dt_dtype_name(labels->dtype), (long long)Vl,
                 (long long)V, dt_pg_size(tp));
        return NULL;
    }
    const int64_t N = dt_tensor_numel(labels);
    /* the logits as they are where contiguous: nothing writes them after their producer (a copy kept a second
       [N, Vl] f32 until the step's end) */
    dt_tensor *lc = dt_tensor_is_contiguous(logits) ? logits : dt_tensor_clone(ctx, logits);
    dt_tensor *yc = dt_tensor_clone(ctx, labels);
    vce_save *s = dt_ctx_alloc(ctx, sizeof *s);
    int64_t *y = dt_ctx_alloc(ctx, (size_t)N * sizeof *y + 8);
    float *mx = dt_ctx_alloc(ctx, (size_t)N * sizeof *mx + 8);
    double *red = dt_ctx_alloc(ctx, (size_t)(2 * N) * sizeof *red + 8); /* [sum exp (N), target logit (N)] */
    dt_tensor *out = dt_tensor_empty(ctx, DT_F32, 0, NULL);
    if (!lc || !yc || !s || !y || !mx || !red || !out)
        return NULL;
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) {
        y[i] = yc->dtype == DT_I64 ? ((const int64_t *)yc->data)[i] : ((const int32_t *)yc->data)[i];
        if (y[i] != -100 && (y[i] < 0 || y[i] >= V)) {
            dt_error(DT_ERR_RANGE, "%s: label %lld at row %lld is outside [0, %lld) (and not -100)", op,
                     (long long)y[i], (long long)i, (long long)V);
            return NULL;
        }
        count += y[i] != -100;
    }
    const float *L = lc->data;
#pragma omp parallel for schedule(static) if (N * nv > VCE_PAR)
    for (int64_t i = 0; i < N; i++) {
        float m = -INFINITY;
        for (int64_t j = 0; j < nv; j++)
            m = fmaxf(m, L[i * Vl + j]);
        mx[i] = m;
    }
    dt_status st = dt_pg_allreduce(tp, DT_IN_PLACE, mx, (size_t)N, DT_F32, DT_REDUCE_MAX);
    if (st < 0) {
        dt_error_wrap(st, "%s: all-reduce of the row maxima", op);
        return NULL;
    }
#pragma omp parallel for schedule(static) if (N * nv > VCE_PAR)
    for (int64_t i = 0; i < N; i++) {
        double e = 0;
        for (int64_t j = 0; j < nv; j++)
            e += (double)expf(L[i * Vl + j] - mx[i]);
        red[i] = e;
        red[N + i] = y[i] >= lo && y[i] < lo + nv ? (double)L[i * Vl + y[i] - lo] : 0.0;
    }
    if ((st = dt_pg_allreduce(tp, DT_IN_PLACE, red, (size_t)(2 * N), DT_F64, DT_REDUCE_SUM)) < 0) {
        dt_error_wrap(st, "%s: all-reduce of the sums of exponentials", op);
        return NULL;
    }
    double loss = 0;
    for (int64_t i = 0; i < N; i++)
        if (y[i] != -100)
            loss += log(red[i]) + (double)mx[i] - red[N + i];
    ((float *)out->data)[0] = count ? (float)(loss / (double)count) : 0.0f;
    *s = (vce_save){.logits = L, .labels = y, .mx = mx, .sum = red, .N = N, .Vl = Vl, .lo = lo, .nv = nv,
                    .count = count};
    return dt_ag_custom(ctx, 1, &logits, out, vce_bwd, s);
}

/* ---- initialisation from the single-process model --------------------------------------- */

/* Between the rank's slice of p (shape p->shape) and the full entry (shape
 * fs): dims other than d = tp_dim - 1 equal; along d, p's tp_chunks blocks:
 * equal ones of fs[d] / c full rows and ls[d] / c of the rank's each (a
 * block's last rank may hold padding), or of the given full sizes
 * (tp_chunk_rows, at most DT_TP_MAX_CHUNKS, checked by the callers), each
 * divided by the ranks; the rank's lb rows of a block start at r lb within
 * its fb full rows; rows past the block's end are padding (vocabulary):
 * zero in the slice when taking it (to_slice), skipped when putting it
 * back. */
static void slice_move(char *slice, char *full, const dt_param_info *p, const int64_t *fs, int r, size_t es,
                       bool to_slice)
{
    const int64_t *ls = p->shape;
    const int d = p->tp_dim - 1;
    const int c = p->tp_chunks > 1 ? p->tp_chunks : 1;
    const bool given = p->tp_chunk_rows[0] > 0;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; i++)
        outer *= ls[i];
    for (int i = d + 1; i < p->ndim; i++)
        inner *= ls[i];
    const int64_t Feq = fs[d] / c, Leq = ls[d] / c, ranks = given ? fs[d] / ls[d] : 1;
    const size_t row = (size_t)inner * es;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0, b = 0, lo = 0, fo = 0; k < ls[d]; k++) {
            int64_t lb = Leq, B = Feq; /* local row k's block: its sizes; lo, fo its first rows */
            if (!given) {
                lo = k / Leq * Leq, fo = k / Leq * Feq;
            } else {
                while (b + 1 < c && k >= lo + p->tp_chunk_rows[b] / ranks)
                    lo += p->tp_chunk_rows[b] / ranks, fo += p->tp_chunk_rows[b], b++;
                B = p->tp_chunk_rows[b], lb = B / ranks;
            }
            const int64_t w = (int64_t)r * lb + (k - lo);
            char *sl = slice + (size_t)((o * ls[d] + k) * inner) * es;
            char *fl = full + (size_t)((o * fs[d] + fo + w) * inner) * es;
            if (w >= B) {
                if (to_slice)
                    memset(sl, 0, row);
            } else if (to_slice) {
                memcpy(sl, fl, row);
            } else {
                memcpy(fl, sl, row);
            }
        }
}

dt_status dt_tp_full_shape(const dt_param_info *p, int t, int64_t *shape)
{
    if (!p || !shape)
        return dt_error(DT_ERR_NULL, "dt_tp_full_shape: NULL argument");
    memcpy(shape, p->shape, sizeof p->shape);
    if (!p->tp_dim || t <= 1)
        return DT_OK;
    const int d = p->tp_dim - 1, c = p->tp_chunks > 1 ? p->tp_chunks : 1;
    const bool given = p->tp_chunk_rows[0] > 0;
    bool fits = d >= 0 && d < p->ndim && c <= DT_TP_MAX_CHUNKS;
    if (fits && given) { /* blocks of given sizes, each split evenly over the ranks */
        int64_t rows = 0;
        fits = dt__tp_rows_split(p->tp_chunk_rows, c, t, &rows) && rows == p->shape[d] * t;
    } else if (fits) {
        fits = p->shape[d] % c == 0;
    }
    if (!fits)
        return dt_error(DT_ERR_SHAPE, "dt_tp_full_shape: '%s': slice dim %d (%d chunks%s) does not fit its %d dims "
                        "over %d ranks", p->name, d, c, given ? " of given sizes" : "", p->ndim, t);
    const char *ty = p->module && p->module->kind == DT_NN_CUSTOM ? p->module->type : NULL;
    if (ty && !strncmp(ty, "VocabParallel", 13)) { /* padded rows: the module knows V */
        const int64_t V = p->module->in;
        if (c != 1 || V < 1 || (V + t - 1) / t != p->shape[d])
            return dt_error(DT_ERR_SHAPE, "dt_tp_full_shape: '%s': %lld local rows are not ceil(%lld / %d)", p->name,
                            (long long)p->shape[d], (long long)V, t);
        shape[d] = V;
    } else {
        shape[d] = p->shape[d] * t;
    }
    return DT_OK;
}

static dt_status full_of(const char *op, const dt_param_info *p, int t, int64_t *fs)
{
    dt_status st = dt_tp_full_shape(p, t, fs);
    return st < 0 ? dt_error_wrap(st, "%s", op) : DT_OK;
}

dt_status dt_tp_slice_get(const dt_param_info *p, int t, int r, const void *full, void *slice, size_t es)
{
    int64_t fs[DT_MAX_DIMS];
    dt_status st = full_of("dt_tp_slice_get", p, t, fs);
    if (st < 0)
        return st;
    if (!p->tp_dim || t <= 1)
        memcpy(slice, full, p->numel * es);
    else
        slice_move(slice, (char *)full, p, fs, r, es, true);
    return DT_OK;
}

dt_status dt_tp_slice_put(const dt_param_info *p, int t, int r, const void *slice, void *full, size_t es)
{
    int64_t fs[DT_MAX_DIMS];
    dt_status st = full_of("dt_tp_slice_put", p, t, fs);
    if (st < 0)
        return st;
    if (!p->tp_dim || t <= 1)
        memcpy(full, slice, p->numel * es);
    else
        slice_move((char *)slice, full, p, fs, r, es, false);
    return DT_OK;
}

dt_status dt_tp_gather_full(dt_pg *tp, const dt_param_info *p, const void *slice, void *full, size_t es)
{
    if (!tp || !p || !slice || !full)
        return dt_error(DT_ERR_NULL, "dt_tp_gather_full: NULL argument");
    const int t = dt_pg_size(tp);
    if (!p->tp_dim || t <= 1)
        return dt_tp_slice_put(p, 1, 0, slice, full, es);
    const size_t n = p->numel * es;
    char *all = malloc(n * (size_t)t + 1);
    if (!all)
        return dt_error(DT_ERR_NO_MEMORY, "dt_tp_gather_full: '%s': out of memory (%zu bytes)", p->name,
                        n * (size_t)t);
    dt_status st = dt_pg_allgather(tp, slice, all, n, DT_U8);
    if (st < 0)
        st = dt_error_wrap(st, "dt_tp_gather_full: '%s'", p->name);
    for (int s = 0; s < t && st >= 0; s++)
        st = dt_tp_slice_put(p, t, s, all + (size_t)s * n, full, es);
    free(all);
    return st;
}

static dt_status check_slice(const dt_param_info *p, const dt_param_info *f, int t)
{
    char s1[96], s2[96];
    bool ok = p->ndim == f->ndim && p->dtype == f->dtype && p->tp_dim >= 0 && p->tp_dim <= p->ndim;
    const int d = p->tp_dim - 1, c = p->tp_chunks > 1 ? p->tp_chunks : 1;
    for (int i = 0; ok && i < p->ndim; i++) {
        if (i != d)
            ok = p->shape[i] == f->shape[i];
        else if (p->tp_chunk_rows[0] > 0) { /* blocks of given sizes: each divided evenly */
            int64_t rows = 0;
            ok = dt__tp_rows_split(p->tp_chunk_rows, c, t, &rows) && rows == f->shape[i] && rows == p->shape[i] * t;
        } else
            ok = f->shape[i] % c == 0 && p->shape[i] % c == 0 &&
                 p->shape[i] / c == (f->shape[i] / c + t - 1) / t; /* ceil: Megatron's padding */
    }
    if (ok)
        return DT_OK;
    dt_tensor a = {.ndim = p->ndim}, b = {.ndim = f->ndim};
    memcpy(a.shape, p->shape, sizeof a.shape);
    memcpy(b.shape, f->shape, sizeof b.shape);
    return dt_error(DT_ERR_SHAPE, "dt_tp_init_from: '%s' is %s %s here and %s %s in the full model: not its slice "
                    "along dim %d (%d chunk%s) over %d ranks", p->name, dt_tensor_shape_str(&a, s1, sizeof s1),
                    dt_dtype_name(p->dtype), dt_tensor_shape_str(&b, s2, sizeof s2), dt_dtype_name(f->dtype), d, c,
                    c == 1 ? "" : "s", t);
}

dt_status dt_tp_init_from(dt_model *m, dt_pg *tp, const dt_model *full, dt_init_rng rng, uint64_t seed)
{
    if (!m || !tp || !full)
        return dt_error(DT_ERR_NULL, "dt_tp_init_from: %s is NULL", !m ? "model" : !tp ? "group" : "full model");
    if (dt_model_is_meta(m))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_tp_init_from: the tensor-parallel model is meta (no parameters to "
                        "fill)");
    const int t = dt_pg_size(tp), r = dt_pg_rank(tp);
    void *vals[DT_DTYPE_COUNT] = {NULL};
    dt_status st = DT_OK;
    /* the full model's parameter flats, one per dtype, drawn in one pass each */
    for (int dt = 0; dt < DT_DTYPE_COUNT && st >= 0; dt++) {
        const dt_flat *ff = dt_model_flat(full, DT_FLAT_PARAMS, (dt_dtype)dt);
        if (!ff || !ff->total)
            continue;
        vals[dt] = malloc(ff->total * dt_dtype_size((dt_dtype)dt));
        if (!vals[dt]) {
            st = dt_error(DT_ERR_NO_MEMORY, "dt_tp_init_from: out of memory for the full model's %s parameters "
                          "(%zu elements)", dt_dtype_name((dt_dtype)dt), ff->total);
            break;
        }
        dt_flat w;
        if ((st = dt_flat_wrap(&w, (dt_dtype)dt, vals[dt], ff->total)) >= 0)
            st = dt_model_init_range(full, rng, seed, &w);
    }
    for (size_t i = 0; i < dt_model_num_entries(m) && st >= 0; i++) {
        dt_param_info p, f;
        if ((st = dt_model_entry(m, i, &p)) < 0)
            break;
        if ((p.is_buffer && !p.frozen) || p.tied_to >= 0)
            continue;
        int64_t j = dt_model_find_entry(full, p.name);
        if (j < 0) {
            st = dt_error(DT_ERR_NOT_FOUND, "dt_tp_init_from: '%s' is not a parameter of the full model", p.name);
            break;
        }
        if ((st = dt_model_entry(full, (size_t)j, &f)) < 0 || (st = check_slice(&p, &f, t)) < 0)
            break;
        if (p.frozen != f.frozen || (p.frozen ? !f.tensor || !p.tensor : !vals[p.dtype])) {
            st = dt_error(DT_ERR_STATE, "dt_tp_init_from: the full model has no %s %s values for '%s'",
                          p.frozen != f.frozen ? "matching (frozen or trained)" : dt_dtype_name(p.dtype),
                          p.frozen ? "frozen" : "parameter", p.name);
            break;
        }
        const size_t es = dt_dtype_size(p.dtype);
        /* a frozen parameter lives with the buffers: the full model's own values */
        const char *src = p.frozen ? (const char *)f.tensor->data : (const char *)vals[p.dtype] + f.offset * es;
        if (!p.tp_dim)
            memcpy(p.tensor->data, src, p.numel * es);
        else
            slice_move(p.tensor->data, (char *)src, &p, f.shape, r, es, true);
    }
    for (int dt = 0; dt < DT_DTYPE_COUNT; dt++)
        free(vals[dt]);
    return st;
}
