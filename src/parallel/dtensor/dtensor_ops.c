/* Ops on distributed tensors with sharding propagation.
 *
 * Each op lists, per mesh dim, the strategies it can run locally: the
 * placements its inputs must have and the placement the output then has
 * (matmul: [R,R]->R, [S(m),R]->S(m), [R,S(n)]->S(-1), [S(k),S(k)]->P(sum),
 * [S(b),S(b)]->S(b), a Partial operand with a Replicate one -> Partial). The
 * product over mesh dims is searched for the combination whose input
 * reshards move the fewest bytes (weights: S->R 1, P->R 2, P->S 1,
 * S(i)->S(j) 1/2, local slices 0), skipping combinations that nest or mix
 * Partial ops; ties go to the earlier strategy. The inputs are resharded
 * (differentiably) and the op runs on the local pieces with the ordinary
 * autograd op.
 *
 * Gradients (the convention of mesh.h): an input that is Replicate on a
 * mesh dim where the output is not (the weight of a data-parallel matmul,
 * the activation of a column-parallel one) gets on each rank only that
 * rank's contribution to its gradient; a grad-sync op (identity forward,
 * all-reduce sum over those mesh dims backward: Megatron's f) makes it
 * whole. Ranks outside the mesh compute nothing: they get empty outputs
 * that still record (their backward is empty), so a pipeline's backward
 * passes through them. */
#include "dtensor_impl.h"

#include <stdio.h>
#include <string.h>

#define MAXS 24 /* strategies per mesh dim */
#define MAXIN 3

typedef struct {
    dt_placement in[MAXIN];
    dt_placement out;
} strat;

typedef dt_tensor *(*local_fn)(dt_ctx *ctx, dt_tensor **in, void *ud);

typedef struct {
    const char *op;
    int nin;
    dt_dtensor **in;
    int out_ndim;
    const int64_t *out_shape;
    /* per mesh dim candidates */
    strat cand[DT_MESH_MAX_DIMS][MAXS];
    int ncand[DT_MESH_MAX_DIMS];
    local_fn fn;
    void *ud;
    dt_placement pout[DT_MESH_MAX_DIMS]; /* the chosen output placements (set before fn runs) */
} opdesc;

static double step_cost(dt_placement f, dt_placement t)
{
    if (f.kind == t.kind) {
        if (f.kind == DT_PLACE_SHARD && f.dim != t.dim)
            return 0.5;
        if (f.kind == DT_PLACE_PARTIAL && f.op != t.op)
            return 2;
        return 0;
    }
    if (f.kind == DT_PLACE_REPLICATE)
        return 0;
    if (f.kind == DT_PLACE_SHARD)
        return 1;
    return t.kind == DT_PLACE_REPLICATE ? 2 : 1;
}

static bool pl_eq(dt_placement a, dt_placement b)
{
    return a.kind == b.kind && (a.kind != DT_PLACE_SHARD || a.dim == b.dim) &&
           (a.kind != DT_PLACE_PARTIAL || a.op == b.op);
}

static bool pl_valid(const dt_mesh *m, const dt_placement *p, int ndim)
{
    dt_status s = dt__placements_check(m, p, ndim, "", NULL);
    if (s < 0)
        dt_error_clear();
    return s >= 0;
}

/* Grad-sync: identity forward; backward all-reduces the gradient over the
 * mesh dims in mask. */
typedef struct {
    dt_mesh *m;
    unsigned mask;
} gsync;

static dt_status gsync_backward(dt_ctx *ctx, const dt_tensor *grad_out, int nin, dt_tensor **grad_in,
                                void *ud)
{
    (void)ctx;
    (void)nin;
    gsync *g = ud;
    if (!grad_in[0])
        return DT_OK;
    size_t n = (size_t)dt_tensor_numel(grad_out);
    memcpy(grad_in[0]->data, grad_out->data, n * sizeof(float));
    if (!dt_mesh_contains_self(g->m))
        return DT_OK;
    for (int i = 0; i < dt_mesh_ndim(g->m); i++) {
        if (!(g->mask & (1u << i)) || dt_mesh_size(g->m, i) == 1)
            continue;
        dt_status st = dt_pg_allreduce(dt_mesh_dim_group(g->m, i), DT_IN_PLACE, grad_in[0]->data, n,
                                       DT_F32, DT_REDUCE_SUM);
        if (st < 0)
            return dt_error_wrap(st, "gradient all-reduce over mesh dim %d", i);
    }
    return DT_OK;
}

static dt_tensor *grad_sync(dt_ctx *ctx, dt_mesh *m, dt_tensor *x, unsigned mask)
{
    if (!mask || !dt_ag_enabled(ctx) || !(x->flags & DT_TENSOR_REQUIRES_GRAD))
        return x;
    gsync *g = dt_ctx_alloc(ctx, sizeof *g);
    dt_tensor *out = dt_tensor_alias(ctx, x);
    if (!g || !out)
        return NULL;
    g->m = m;
    g->mask = mask;
    return dt_ag_custom(ctx, 1, &x, out, gsync_backward, g);
}

/* Backward of an op on a rank outside the mesh: nothing to add. */
static dt_status empty_backward(dt_ctx *ctx, const dt_tensor *grad_out, int nin, dt_tensor **grad_in,
                                void *ud)
{
    (void)ctx, (void)grad_out, (void)nin, (void)grad_in, (void)ud;
    return DT_OK;
}

static dt_dtensor *run_op(dt_ctx *ctx, opdesc *o)
{
    dt_mesh *m = o->in[0]->mesh;
    int mn = dt_mesh_ndim(m);
    char ms[256];
    for (int j = 1; j < o->nin; j++)
        if (o->in[j]->mesh != m) {
            dt_error(DT_ERR_INVALID_ARG, "%s: inputs on different meshes (%s and another); "
                     "dt_reshard one of them first", o->op, dt_mesh_str(m, ms, sizeof ms));
            return NULL;
        }
    /* search the product of per-dim strategies */
    int idx[DT_MESH_MAX_DIMS] = {0}, best[DT_MESH_MAX_DIMS];
    double bcost = 1e300;
    bool found = false;
    for (;;) {
        dt_placement pin[MAXIN][DT_MESH_MAX_DIMS], pout[DT_MESH_MAX_DIMS];
        double cost = 0;
        for (int i = 0; i < mn; i++) {
            const strat *s = &o->cand[i][idx[i]];
            pout[i] = s->out;
            for (int j = 0; j < o->nin; j++) {
                pin[j][i] = s->in[j];
                double bytes = (double)dt__numel(o->in[j]->shape, o->in[j]->ndim) *
                               (double)dt_dtype_size(o->in[j]->dtype);
                cost += step_cost(o->in[j]->placements[i], s->in[j]) * bytes;
            }
        }
        if (cost < bcost) {
            bool ok = pl_valid(m, pout, o->out_ndim);
            for (int j = 0; ok && j < o->nin; j++)
                ok = pl_valid(m, pin[j], o->in[j]->ndim);
            if (ok) {
                bcost = cost;
                memcpy(best, idx, sizeof best);
                found = true;
            }
        }
        int i = mn - 1;
        while (i >= 0 && ++idx[i] == o->ncand[i]) {
            idx[i] = 0;
            i--;
        }
        if (i < 0)
            break;
    }
    if (!found) {
        char buf[512];
        size_t k = 0;
        for (int j = 0; j < o->nin; j++) {
            char ps[128];
            k += (size_t)snprintf(buf + k, k < sizeof buf ? sizeof buf - k : 0, "%s%s %s",
                                  j ? ", " : "", o->in[j]->name ? o->in[j]->name : "input",
                                  dt_placements_str(o->in[j]->placements, mn, ps, sizeof ps));
        }
        dt_error(DT_ERR_UNSUPPORTED, "%s: no sharding strategy for %s on %s", o->op, buf,
                 dt_mesh_str(m, ms, sizeof ms));
        return NULL;
    }
    /* reshard the inputs */
    dt_tensor *loc[MAXIN];
    dt_placement pout[DT_MESH_MAX_DIMS];
    unsigned sync[MAXIN] = {0};
    for (int i = 0; i < mn; i++)
        pout[i] = o->pout[i] = o->cand[i][best[i]].out;
    for (int j = 0; j < o->nin; j++) {
        dt_placement req[DT_MESH_MAX_DIMS];
        bool same = true;
        for (int i = 0; i < mn; i++) {
            req[i] = o->cand[i][best[i]].in[j];
            same &= pl_eq(req[i], o->in[j]->placements[i]);
            if (req[i].kind == DT_PLACE_REPLICATE && pout[i].kind != DT_PLACE_REPLICATE)
                sync[j] |= 1u << i;
        }
        dt_dtensor *x = same ? o->in[j] : dt_reshard(ctx, o->in[j], NULL, req);
        if (!x)
            return NULL;
        loc[j] = x->local;
    }
    dt_tensor *out;
    if (!dt_mesh_contains_self(m)) {
        int64_t z[DT_MAX_DIMS] = {0};
        out = dt_tensor_zeros(ctx, o->in[0]->dtype, o->out_ndim, z);
        if (!out)
            return NULL;
        if (dt_ag_enabled(ctx)) {
            dt_tensor *rin[MAXIN];
            int nr = 0;
            for (int j = 0; j < o->nin; j++)
                if (loc[j]->flags & DT_TENSOR_REQUIRES_GRAD)
                    rin[nr++] = loc[j];
            if (nr && !dt_ag_custom(ctx, nr, rin, out, empty_backward, NULL))
                return NULL;
        }
    } else {
        for (int j = 0; j < o->nin; j++) {
            loc[j] = grad_sync(ctx, m, loc[j], sync[j]);
            if (!loc[j])
                return NULL;
        }
        out = o->fn(ctx, loc, o->ud);
        if (!out)
            return NULL;
        int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
        int c[DT_MESH_MAX_DIMS];
        for (int i = 0; i < mn; i++)
            c[i] = dt_mesh_coord(m, i);
        dt__box(m, pout, o->out_ndim, o->out_shape, c, st, len);
        bool ok = out->ndim == o->out_ndim;
        for (int d = 0; ok && d < out->ndim; d++)
            ok = out->shape[d] == len[d];
        if (!ok) {
            char a[96];
            dt_error(DT_ERR_INTERNAL, "%s: local result %s does not fit its placements (internal)",
                     o->op, dt_tensor_shape_str(out, a, sizeof a));
            return NULL;
        }
        if (!dt_tensor_is_contiguous(out)) {
            out = dt_contiguous(ctx, out);
            if (!out)
                return NULL;
        }
    }
    return dt__dtensor_make(ctx, m, out, pout, o->out_ndim, o->out_shape, NULL);
}

static void add(opdesc *o, int i, dt_placement a, dt_placement b, dt_placement c, dt_placement out)
{
    if (o->ncand[i] >= MAXS)
        return;
    strat *s = &o->cand[i][o->ncand[i]++];
    s->in[0] = a;
    s->in[1] = b;
    s->in[2] = c;
    s->out = out;
}

static bool check_in(const char *op, dt_ctx *ctx, int n, dt_dtensor **in)
{
    if (!ctx) {
        dt_error(DT_ERR_NULL, "%s: NULL context", op);
        return false;
    }
    for (int j = 0; j < n; j++)
        if (!in[j] || !in[j]->local) {
            if (dt_last_status() == DT_OK)
                dt_error(DT_ERR_NULL, "%s: NULL input %d", op, j);
            return false;
        }
    return true;
}

/* ---- matmul ------------------------------------------------------------------ */

static dt_tensor *f_matmul(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    (void)ud;
    return dt_matmul(ctx, in[0], in[1]);
}

dt_dtensor *dt_dtensor_matmul(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b)
{
    const char *op = "dt_dtensor_matmul";
    dt_dtensor *in[2] = {a, b};
    if (!check_in(op, ctx, 2, in))
        return NULL;
    int na = a->ndim, nb = b->ndim;
    bool batched = nb > 2;
    if (na < 2 || nb < 2 || (batched && nb != na) || a->shape[na - 1] != b->shape[nb - 2]) {
        dt_error(DT_ERR_SHAPE, "%s: %s [.., %lld] @ %s [%lld, ..]: want a[..., M, K] @ b[K, N] or "
                 "batched b[..., K, N]", op, a->name ? a->name : "a",
                 (long long)a->shape[na - 1], b->name ? b->name : "b",
                 (long long)b->shape[nb - 2]);
        return NULL;
    }
    opdesc o;
    memset(&o, 0, sizeof o);
    o.op = op;
    o.nin = 2;
    o.in = in;
    o.out_ndim = na;
    int64_t oshape[DT_MAX_DIMS];
    memcpy(oshape, a->shape, sizeof oshape);
    oshape[na - 1] = b->shape[nb - 1];
    o.out_shape = oshape;
    o.fn = f_matmul;
    dt_placement R = dt_replicate();
    for (int i = 0; i < dt_mesh_ndim(a->mesh); i++) {
        add(&o, i, R, R, R, R);
        for (int d = 0; d < na - 1; d++) {
            if (batched && d < na - 2)
                add(&o, i, dt_shard(d), dt_shard(d), R, dt_shard(d)); /* batch */
            else
                add(&o, i, dt_shard(d), R, R, dt_shard(d));           /* rows */
        }
        add(&o, i, R, dt_shard(nb - 1), R, dt_shard(na - 1));                        /* column */
        add(&o, i, dt_shard(na - 1), dt_shard(nb - 2), R, dt_partial(DT_REDUCE_SUM)); /* row */
        dt_placement pa = a->placements[i], pb = b->placements[i];
        if (pa.kind == DT_PLACE_PARTIAL && (pa.op == DT_REDUCE_SUM || pa.op == DT_REDUCE_AVG))
            add(&o, i, pa, R, R, pa);
        if (pb.kind == DT_PLACE_PARTIAL && (pb.op == DT_REDUCE_SUM || pb.op == DT_REDUCE_AVG))
            add(&o, i, R, pb, R, pb);
    }
    dt_dtensor *y = run_op(ctx, &o);
    return y;
}

/* ---- elementwise --------------------------------------------------------------- */

typedef enum { EW_ADD, EW_SUB, EW_MUL, EW_DIV } ew_kind;

static dt_tensor *f_ew(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    switch (*(ew_kind *)ud) {
    case EW_ADD: return dt_add(ctx, in[0], in[1]);
    case EW_SUB: return dt_sub(ctx, in[0], in[1]);
    case EW_MUL: return dt_mul(ctx, in[0], in[1]);
    default: return dt_div(ctx, in[0], in[1]);
    }
}

static dt_dtensor *elementwise(dt_ctx *ctx, const char *op, ew_kind kind, dt_dtensor *a,
                               dt_dtensor *b)
{
    dt_dtensor *in[2] = {a, b};
    if (!check_in(op, ctx, 2, in))
        return NULL;
    int no = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t oshape[DT_MAX_DIMS];
    for (int d = 0; d < no; d++) {
        int da = d - (no - a->ndim), db = d - (no - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            dt_error(DT_ERR_SHAPE, "%s: shapes do not broadcast at dim %d (%lld vs %lld)", op, d,
                     (long long)sa, (long long)sb);
            return NULL;
        }
        oshape[d] = sa == 1 ? sb : sa;
    }
    opdesc o;
    ew_kind k;
    memset(&o, 0, sizeof o);
    k = kind;
    o.op = op;
    o.nin = 2;
    o.in = in;
    o.out_ndim = no;
    o.out_shape = oshape;
    o.fn = f_ew;
    o.ud = &k;
    dt_placement R = dt_replicate();
    for (int i = 0; i < dt_mesh_ndim(a->mesh); i++) {
        add(&o, i, R, R, R, R);
        for (int j = 0; j < no; j++) {
            dt_placement req[2];
            int nsh = 0;
            for (int q = 0; q < 2; q++) {
                dt_dtensor *x = in[q];
                int dx = j - (no - x->ndim);
                bool real = dx >= 0 && x->shape[dx] == oshape[j] && oshape[j] != 1;
                req[q] = real ? dt_shard(dx) : R;
                nsh += real;
            }
            if (nsh)
                add(&o, i, req[0], req[1], R, dt_shard(j));
        }
        for (int q = 0; q < 2; q++) {
            dt_placement p = in[q]->placements[i];
            if (p.kind != DT_PLACE_PARTIAL || (p.op != DT_REDUCE_SUM && p.op != DT_REDUCE_AVG))
                continue;
            if (kind == EW_ADD || kind == EW_SUB)
                add(&o, i, p, p, R, p);
            else if (kind == EW_MUL || q == 0)
                add(&o, i, q == 0 ? p : R, q == 1 ? p : R, R, p);
        }
    }
    return run_op(ctx, &o);
}

dt_dtensor *dt_dtensor_add(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b)
{
    return elementwise(ctx, "dt_dtensor_add", EW_ADD, a, b);
}
dt_dtensor *dt_dtensor_sub(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b)
{
    return elementwise(ctx, "dt_dtensor_sub", EW_SUB, a, b);
}
dt_dtensor *dt_dtensor_mul(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b)
{
    return elementwise(ctx, "dt_dtensor_mul", EW_MUL, a, b);
}
dt_dtensor *dt_dtensor_div(dt_ctx *ctx, dt_dtensor *a, dt_dtensor *b)
{
    return elementwise(ctx, "dt_dtensor_div", EW_DIV, a, b);
}

/* ---- unary and row-wise ops -------------------------------------------------------- */

typedef enum { UN_RELU, UN_GELU, UN_SOFTMAX, UN_LOG_SOFTMAX } un_kind;

static dt_tensor *f_un(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    switch (*(un_kind *)ud) {
    case UN_RELU: return dt_relu(ctx, in[0]);
    case UN_GELU: return dt_gelu(ctx, in[0]);
    case UN_SOFTMAX: return dt_softmax(ctx, in[0]);
    default: return dt_log_softmax(ctx, in[0]);
    }
}

/* Pointwise (all dims may be sharded) or row-wise over the last dim (which
 * must not be). Partial inputs are reduced first: these ops are not linear. */
static dt_dtensor *unary(dt_ctx *ctx, const char *op, un_kind kind, dt_dtensor *x)
{
    dt_dtensor *in[1] = {x};
    if (!check_in(op, ctx, 1, in))
        return NULL;
    if (x->ndim < 1) {
        dt_error(DT_ERR_SHAPE, "%s: needs at least one dim", op);
        return NULL;
    }
    opdesc o;
    un_kind k;
    memset(&o, 0, sizeof o);
    k = kind;
    o.op = op;
    o.nin = 1;
    o.in = in;
    o.out_ndim = x->ndim;
    o.out_shape = x->shape;
    o.fn = f_un;
    o.ud = &k;
    dt_placement R = dt_replicate();
    int last = kind == UN_RELU || kind == UN_GELU ? x->ndim : x->ndim - 1;
    for (int i = 0; i < dt_mesh_ndim(x->mesh); i++) {
        add(&o, i, R, R, R, R);
        for (int d = 0; d < last; d++)
            add(&o, i, dt_shard(d), R, R, dt_shard(d));
    }
    return run_op(ctx, &o);
}

dt_dtensor *dt_dtensor_relu(dt_ctx *ctx, dt_dtensor *x)
{
    return unary(ctx, "dt_dtensor_relu", UN_RELU, x);
}
dt_dtensor *dt_dtensor_gelu(dt_ctx *ctx, dt_dtensor *x)
{
    return unary(ctx, "dt_dtensor_gelu", UN_GELU, x);
}
dt_dtensor *dt_dtensor_softmax(dt_ctx *ctx, dt_dtensor *x)
{
    return unary(ctx, "dt_dtensor_softmax", UN_SOFTMAX, x);
}
dt_dtensor *dt_dtensor_log_softmax(dt_ctx *ctx, dt_dtensor *x)
{
    return unary(ctx, "dt_dtensor_log_softmax", UN_LOG_SOFTMAX, x);
}

static dt_tensor *f_ln(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    return dt_layer_norm(ctx, in[0], in[1], in[2], *(float *)ud);
}

dt_dtensor *dt_dtensor_layer_norm(dt_ctx *ctx, dt_dtensor *x, dt_dtensor *gamma, dt_dtensor *beta,
                                  float eps)
{
    const char *op = "dt_dtensor_layer_norm";
    dt_dtensor *in[3] = {x, gamma, beta};
    if (!check_in(op, ctx, 3, in))
        return NULL;
    if (x->ndim < 1 || gamma->ndim != 1 || beta->ndim != 1 ||
        gamma->shape[0] != x->shape[x->ndim - 1] || beta->shape[0] != gamma->shape[0]) {
        dt_error(DT_ERR_SHAPE, "%s: gamma and beta must be [D] with D the last dim of x", op);
        return NULL;
    }
    opdesc o;
    float e;
    memset(&o, 0, sizeof o);
    e = eps;
    o.op = op;
    o.nin = 3;
    o.in = in;
    o.out_ndim = x->ndim;
    o.out_shape = x->shape;
    o.fn = f_ln;
    o.ud = &e;
    dt_placement R = dt_replicate();
    for (int i = 0; i < dt_mesh_ndim(x->mesh); i++) {
        add(&o, i, R, R, R, R);
        for (int d = 0; d < x->ndim - 1; d++)
            add(&o, i, dt_shard(d), R, R, dt_shard(d));
    }
    return run_op(ctx, &o);
}

/* ---- reductions ------------------------------------------------------------------ */

typedef struct {
    bool mean;
    double scale; /* mean: 1 / global numel */
} red_ud;

static dt_tensor *f_red(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    red_ud *r = ud;
    dt_tensor *s = dt_sum(ctx, in[0]);
    return r->mean ? dt_scale(ctx, s, (float)r->scale) : s;
}

static dt_dtensor *reduction(dt_ctx *ctx, const char *op, bool mean, dt_dtensor *x)
{
    dt_dtensor *in[1] = {x};
    if (!check_in(op, ctx, 1, in))
        return NULL;
    opdesc o;
    red_ud r;
    static const int64_t scalar[1] = {1};
    memset(&o, 0, sizeof o);
    r.mean = mean;
    r.scale = 1.0 / (double)dt__numel(x->shape, x->ndim);
    o.op = op;
    o.nin = 1;
    o.in = in;
    o.out_ndim = 0;
    o.out_shape = scalar;
    o.fn = f_red;
    o.ud = &r;
    dt_placement R = dt_replicate(), P = dt_partial(DT_REDUCE_SUM);
    for (int i = 0; i < dt_mesh_ndim(x->mesh); i++) {
        add(&o, i, R, R, R, R);
        for (int d = 0; d < x->ndim; d++)
            add(&o, i, dt_shard(d), R, R, P);
        dt_placement p = x->placements[i];
        if (p.kind == DT_PLACE_PARTIAL && (p.op == DT_REDUCE_SUM || p.op == DT_REDUCE_AVG))
            add(&o, i, p, R, R, p);
    }
    return run_op(ctx, &o);
}

dt_dtensor *dt_dtensor_sum(dt_ctx *ctx, dt_dtensor *x)
{
    return reduction(ctx, "dt_dtensor_sum", false, x);
}
dt_dtensor *dt_dtensor_mean(dt_ctx *ctx, dt_dtensor *x)
{
    return reduction(ctx, "dt_dtensor_mean", true, x);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

/* ud: the opdesc; the rows are sharded on the mesh dims where the chosen
 * output is Partial. */
static dt_tensor *f_ce(dt_ctx *ctx, dt_tensor **in, void *ud)
{
    const opdesc *o = ud;
    dt_mesh *m = o->in[0]->mesh;
    dt_tensor *loss = dt_cross_entropy(ctx, in[0], in[1]);
    unsigned rows = 0;
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (o->pout[i].kind == DT_PLACE_PARTIAL)
            rows |= 1u << i;
    if (!loss || !rows)
        return loss;
    /* the local mean is over this rank's counted rows (label -100 is not
     * counted); the global mean is over all of them */
    int64_t n = in[1]->shape[0], cnt = 0;
    for (int64_t r = 0; r < n; r++)
        cnt += dt_tensor_get(in[1], r) != -100;
    int64_t tot = cnt;
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (rows & (1u << i)) {
            dt_status st = dt_pg_allreduce(dt_mesh_dim_group(m, i), DT_IN_PLACE, &tot, 1, DT_I64,
                                           DT_REDUCE_SUM);
            if (st < 0) {
                dt_error_wrap(st, "dt_dtensor_cross_entropy: counting rows");
                return NULL;
            }
        }
    return dt_scale(ctx, loss, tot ? (float)((double)cnt / (double)tot) : 0.0f);
}

dt_dtensor *dt_dtensor_cross_entropy(dt_ctx *ctx, dt_dtensor *logits, dt_dtensor *labels)
{
    const char *op = "dt_dtensor_cross_entropy";
    dt_dtensor *in[2] = {logits, labels};
    if (!check_in(op, ctx, 2, in))
        return NULL;
    if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0]) {
        dt_error(DT_ERR_SHAPE, "%s: want logits [N, C] and labels [N]", op);
        return NULL;
    }
    opdesc o;
    static const int64_t scalar[1] = {1};
    memset(&o, 0, sizeof o);
    o.op = op;
    o.nin = 2;
    o.in = in;
    o.out_ndim = 0;
    o.out_shape = scalar;
    o.fn = f_ce;
    o.ud = &o;
    dt_placement R = dt_replicate();
    for (int i = 0; i < dt_mesh_ndim(logits->mesh); i++) {
        add(&o, i, R, R, R, R);
        add(&o, i, dt_shard(0), dt_shard(0), R, dt_partial(DT_REDUCE_SUM));
    }
    return run_op(ctx, &o);
}
