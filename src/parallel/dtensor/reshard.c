/* Reshard: the planner over mesh dims, and its autograd op.
 *
 * Same mesh: the mesh dims whose placement changes are done one at a time,
 * each by its table entry (reshard_table.c) over the dim's line group. The
 * order moves the fewest bytes: a step is taken from the cheapest class
 * that is valid now,
 *     0 R->S (local slice: shrinks the data for what follows)
 *     1 P->S (reduce-scatter: shrinks it too)
 *     2 S->S (all-to-all: same size)
 *     3 P->R, P->P (all-reduce)
 *     4 S->R (all-gather: grows the data, so last among collectives)
 *     5 R->P, 6 S->P (local after the gathers)
 * where valid means the state after the step has no tensor dim sharded by
 * two mesh dims and one Partial op. When no step is valid (S(0),S(1) ->
 * S(1),S(0), or P(sum),P(sum) -> P(avg),P(avg)) the first pending Shard
 * (else Partial) mesh dim goes to Replicate first.
 * Every rank computes the same plan from the same placements.
 *
 * Across meshes: Partial sources are reduced to Replicate on their own mesh,
 * the boxes move point to point (reshard_cross.c), and Partial targets are
 * applied locally on the target mesh.
 *
 * Autograd (see mesh.h): the local gradient of a dtensor is the global
 * gradient G in its placements with Partial read as Replicate, divided by
 * k for each Partial(avg) mesh dim of size k. The backward of a reshard
 * therefore multiplies by the output's avg factors, reshards G from the
 * output's Partial-free placements back to the input's, and divides by the
 * input's avg factors.
 *
 * Partial(max|min) (mesh.h states the rule): the local gradient of a
 * max/min piece is the gradient of that piece itself. A mesh dim where the
 * input is P(max|min) and the reshard reduces it (anything but the same
 * Partial) sends the global gradient, resharded to Replicate there, to the
 * coordinates whose piece equals the reduced value, split evenly among
 * ties (torch.amax's rule): backward recomputes the reduction from a copy
 * of the input, the tie count with one all-reduce(sum) per such dim, and
 * scales. A dim where the output is P(max|min) carries the pieces'
 * gradients as Partial(sum) back to the input's placement (so R -> P(max)
 * sums them: every piece was a copy of the input). */
#include "dtensor_impl.h"

#include <string.h>

static int step_class(dt_placement f, dt_placement t)
{
    static const int cls[3][3] = {
        [DT_PLACE_REPLICATE] = {[DT_PLACE_SHARD] = 0, [DT_PLACE_PARTIAL] = 5},
        [DT_PLACE_SHARD] = {[DT_PLACE_SHARD] = 2, [DT_PLACE_REPLICATE] = 4, [DT_PLACE_PARTIAL] = 6},
        [DT_PLACE_PARTIAL] = {[DT_PLACE_SHARD] = 1, [DT_PLACE_REPLICATE] = 3, [DT_PLACE_PARTIAL] = 3},
    };
    return cls[f.kind][t.kind];
}

static bool same_placement(dt_placement a, dt_placement b)
{
    if (a.kind != b.kind)
        return false;
    if (a.kind == DT_PLACE_SHARD)
        return a.dim == b.dim;
    if (a.kind == DT_PLACE_PARTIAL)
        return a.op == b.op;
    return true;
}

/* Would cur with mesh dim i set to t be a valid state? */
static bool valid_after(const dt_placement *cur, int mn, int i, dt_placement t)
{
    for (int j = 0; j < mn; j++) {
        if (j == i)
            continue;
        if (t.kind == DT_PLACE_SHARD && cur[j].kind == DT_PLACE_SHARD && cur[j].dim == t.dim)
            return false;
        if (t.kind == DT_PLACE_PARTIAL && cur[j].kind == DT_PLACE_PARTIAL && cur[j].op != t.op)
            return false;
    }
    return true;
}

/* One mesh dim's transition of the local data: *data/shape in, replaced by
 * the output (a temporary of ctx). */
static dt_status do_step(dt_ctx *ctx, dt_mesh *m, int i, dt_placement *cur, dt_placement t,
                         int ndim, const int64_t *shape, dt_dtype dt, void **data, int64_t *lshape)
{
    dt_placement nxt[DT_MESH_MAX_DIMS];
    int mn = dt_mesh_ndim(m);
    memcpy(nxt, cur, (size_t)mn * sizeof *cur);
    nxt[i] = t;
    int c[DT_MESH_MAX_DIMS];
    for (int j = 0; j < mn; j++)
        c[j] = dt_mesh_coord(m, j);
    int64_t st[DT_MAX_DIMS], oshape[DT_MAX_DIMS];
    dt__box(m, nxt, ndim, shape, c, st, oshape);
    dt_tensor *out = dt_tensor_empty(ctx, dt, ndim, oshape);
    if (!out)
        return dt_last_status();
    dt__rs_step s = {
        .ctx = ctx,
        .pg = dt_mesh_dim_group(m, i),
        .k = dt_mesh_size(m, i),
        .coord = c[i],
        .from = cur[i],
        .to = t,
        .dtype = dt,
        .ndim = ndim,
        .gshape = shape,
        .in = *data,
        .in_shape = lshape,
        .out = out->data,
        .out_shape = oshape,
    };
    dt__rs_fn fn = dt__reshard_fn(cur[i].kind, t.kind);
    dt_status rc = fn(&s);
    if (rc < 0) {
        char ms[256];
        return dt_error_wrap(rc, "reshard %s on mesh dim %d ('%s') of %s",
                             dt__reshard_name(cur[i].kind, t.kind), i, dt_mesh_dim_name(m, i),
                             dt_mesh_str(m, ms, sizeof ms));
    }
    *data = out->data;
    memcpy(lshape, oshape, sizeof oshape);
    cur[i] = t;
    return DT_OK;
}

/* Same-mesh plan and execution on contiguous local data. */
static dt_status reshard_same_mesh(dt_ctx *ctx, dt_mesh *m, const dt_placement *pf,
                                   const dt_placement *pt, int ndim, const int64_t *shape,
                                   dt_dtype dt, const dt_tensor *in, dt_tensor **out)
{
    int mn = dt_mesh_ndim(m);
    if (!dt_mesh_contains_self(m)) {
        int64_t z[DT_MAX_DIMS] = {0};
        *out = dt_tensor_zeros(ctx, dt, ndim, z);
        return *out ? DT_OK : dt_last_status();
    }
    dt_placement cur[DT_MESH_MAX_DIMS];
    memcpy(cur, pf, (size_t)mn * sizeof *pf);
    int64_t lshape[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        lshape[d] = in->shape[d];
    void *data = in->data;
    bool moved = false;
    for (;;) {
        int best = -1, bcls = 99;
        bool pending = false;
        for (int i = 0; i < mn; i++) {
            if (same_placement(cur[i], pt[i]))
                continue;
            pending = true;
            int cl = step_class(cur[i], pt[i]);
            if (cl < bcls && valid_after(cur, mn, i, pt[i])) {
                best = i;
                bcls = cl;
            }
        }
        if (!pending)
            break;
        dt_status st;
        if (best >= 0) {
            st = do_step(ctx, m, best, cur, pt[best], ndim, shape, dt, &data, lshape);
        } else {
            /* a cycle (S(0),S(1) -> S(1),S(0); P(sum),P(sum) -> P(avg),P(avg)):
             * take the first pending Shard, else Partial, dim to Replicate */
            int i = 0;
            while (i < mn && (same_placement(cur[i], pt[i]) || cur[i].kind != DT_PLACE_SHARD))
                i++;
            if (i == mn) {
                i = 0;
                while (i < mn &&
                       (same_placement(cur[i], pt[i]) || cur[i].kind != DT_PLACE_PARTIAL))
                    i++;
            }
            if (i == mn)
                return dt_error(DT_ERR_INTERNAL, "reshard: no plan (internal)");
            st = do_step(ctx, m, i, cur, dt_replicate(), ndim, shape, dt, &data, lshape);
        }
        if (st < 0)
            return st;
        moved = true;
    }
    if (!moved) {
        *out = dt_tensor_from(ctx, dt, ndim, lshape, data);
        return *out ? DT_OK : dt_last_status();
    }
    dt_tensor *o = dt_tensor_view_of(ctx, data, dt, ndim, lshape);
    if (!o)
        return dt_last_status();
    *out = o;
    return DT_OK;
}

static void drop_partial(const dt_placement *p, int mn, dt_placement *out)
{
    for (int i = 0; i < mn; i++)
        out[i] = p[i].kind == DT_PLACE_PARTIAL ? dt_replicate() : p[i];
}

static bool has_partial(const dt_placement *p, int mn)
{
    for (int i = 0; i < mn; i++)
        if (p[i].kind == DT_PLACE_PARTIAL)
            return true;
    return false;
}

dt_status dt__reshard_data(dt_ctx *ctx, dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                           const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                           const dt_tensor *in, int *rg, dt_tensor **out)
{
    if (mf == mt)
        return reshard_same_mesh(ctx, mf, pf, pt, ndim, shape, dt, in, out);
    dt_placement rf[DT_MESH_MAX_DIMS], rt[DT_MESH_MAX_DIMS];
    drop_partial(pf, dt_mesh_ndim(mf), rf);
    drop_partial(pt, dt_mesh_ndim(mt), rt);
    const dt_tensor *src = in;
    dt_tensor *tmp = NULL;
    dt_status st;
    if (has_partial(pf, dt_mesh_ndim(mf))) {
        st = reshard_same_mesh(ctx, mf, pf, rf, ndim, shape, dt, in, &tmp);
        if (st < 0)
            return st;
        src = tmp;
    }
    int64_t lshape[DT_MAX_DIMS] = {0}, bst[DT_MAX_DIMS];
    if (dt_mesh_contains_self(mt)) {
        int c[DT_MESH_MAX_DIMS];
        for (int j = 0; j < dt_mesh_ndim(mt); j++)
            c[j] = dt_mesh_coord(mt, j);
        dt__box(mt, rt, ndim, shape, c, bst, lshape);
    }
    /* not zero-filled: the source boxes cover the tensor, so the transfers
     * write every element of this rank's box (reshard_cross.c) */
    dt_tensor *o = dt_tensor_empty(ctx, dt, ndim, lshape);
    if (!o)
        return dt_last_status();
    st = dt__reshard_cross(ctx, mf, rf, mt, rt, ndim, shape, dt, src->data, o->data, rg);
    if (st < 0)
        return st;
    if (has_partial(pt, dt_mesh_ndim(mt)))
        return reshard_same_mesh(ctx, mt, rt, pt, ndim, shape, dt, o, out);
    *out = o;
    return DT_OK;
}

/* ---- autograd ------------------------------------------------------------------ */

typedef struct {
    dt_mesh *mf, *mt;
    dt_placement pf[DT_MESH_MAX_DIMS], pt[DT_MESH_MAX_DIMS];
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    const char *name;
    dt_tensor *xin; /* a copy of the input when it reduces a Partial(max|min) */
} rs_save;

static bool is_maxmin(dt_placement p)
{
    return p.kind == DT_PLACE_PARTIAL && (p.op == DT_REDUCE_MAX || p.op == DT_REDUCE_MIN);
}

/* Does the reshard from pf (on mf) to pt (on mt) reduce mesh dim i of the
 * input, a Partial(max|min) dim? Across meshes every Partial is reduced. */
static bool reduces_maxmin(const dt_mesh *mf, const dt_placement *pf, const dt_mesh *mt,
                           const dt_placement *pt, int i)
{
    if (!is_maxmin(pf[i]))
        return false;
    return mf != mt || pt[i].kind != DT_PLACE_PARTIAL || pt[i].op != pf[i].op;
}

/* The gradient's placements: Partial(sum|avg) as Replicate; a
 * Partial(max|min) output dim as Partial(sum) (its pieces' gradients add
 * up); an input Partial(max|min) dim as Replicate where the reshard reduces
 * it (the mask is applied after), else Partial(sum). */
static void grad_placements(const dt_mesh *m, const dt_placement *p, const bool *reduced,
                            dt_placement *out)
{
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        out[i] = !(p[i].kind == DT_PLACE_PARTIAL) ? p[i]
               : is_maxmin(p[i]) && !(reduced && reduced[i]) ? dt_partial(DT_REDUCE_SUM)
                                                            : dt_replicate();
}

/* g (f32, the input's box) *= [x == y] / (ties over the reduced dims):
 * y is x reduced over those dims (max or min, in x's dtype), the tie count
 * an all-reduce(sum) over the same dims. */
static dt_status maxmin_mask(dt_ctx *ctx, const rs_save *s, const bool *red, float *g)
{
    dt_mesh *m = s->mf;
    int mn = dt_mesh_ndim(m);
    dt_placement from[DT_MESH_MAX_DIMS], to[DT_MESH_MAX_DIMS];
    for (int i = 0; i < mn; i++) {
        from[i] = red[i] ? s->pf[i] : s->pf[i].kind == DT_PLACE_PARTIAL ? dt_replicate() : s->pf[i];
        to[i] = red[i] ? dt_replicate() : from[i];
    }
    dt_tensor *y;
    dt_status st = dt__reshard_data(ctx, m, from, m, to, s->ndim, s->shape, s->xin->dtype, s->xin,
                                    NULL, &y);
    if (st < 0)
        return st;
    int64_t n = dt_tensor_numel(s->xin);
    dt_tensor *mask = dt_tensor_empty(ctx, DT_F32, s->ndim, s->xin->shape);
    if (!mask)
        return dt_last_status();
    float *mk = mask->data;
    if (s->xin->dtype == DT_F32) {
        const float *a = s->xin->data, *b = y->data;
        for (int64_t e = 0; e < n; e++)
            mk[e] = a[e] == b[e] ? 1.0f : 0.0f;
    } else {
        for (int64_t e = 0; e < n; e++)
            mk[e] = dt_tensor_get(s->xin, e) == dt_tensor_get(y, e) ? 1.0f : 0.0f;
    }
    for (int i = 0; i < mn; i++)
        if (red[i])
            from[i] = dt_partial(DT_REDUCE_SUM);
    dt_tensor *cnt;
    st = dt__reshard_data(ctx, m, from, m, to, s->ndim, s->shape, DT_F32, mask, NULL, &cnt);
    if (st < 0)
        return st;
    const float *c = cnt->data;
    for (int64_t e = 0; e < n; e++)
        g[e] = mk[e] != 0.0f && c[e] > 0.0f ? g[e] / c[e] : 0.0f;
    return DT_OK;
}

/* Product of the sizes of the Partial(avg) mesh dims. */
static double avg_factor(const dt_mesh *m, const dt_placement *p)
{
    double f = 1;
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (p[i].kind == DT_PLACE_PARTIAL && p[i].op == DT_REDUCE_AVG)
            f *= dt_mesh_size(m, i);
    return f;
}

static void scale_f32(float *x, int64_t n, double s)
{
    if (s == 1)
        return;
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(x[i] * s);
}

static dt_status rs_backward(dt_ctx *ctx, const dt_tensor *grad_out, int nin, dt_tensor **grad_in,
                             void *ud)
{
    (void)nin;
    rs_save *s = ud;
    if (!grad_in[0])
        return DT_OK;
    bool red[DT_MESH_MAX_DIMS] = {false}, any_red = false;
    for (int i = 0; i < dt_mesh_ndim(s->mf); i++)
        any_red |= red[i] = reduces_maxmin(s->mf, s->pf, s->mt, s->pt, i);
    dt_placement rf[DT_MESH_MAX_DIMS], rt[DT_MESH_MAX_DIMS];
    grad_placements(s->mf, s->pf, red, rf);
    grad_placements(s->mt, s->pt, NULL, rt);
    dt_tensor *g = dt_tensor_clone(ctx, grad_out);
    if (!g)
        return dt_last_status();
    scale_f32(g->data, dt_tensor_numel(g), avg_factor(s->mt, s->pt));
    dt_tensor *gi;
    dt_status st = dt__reshard_data(ctx, s->mt, rt, s->mf, rf, s->ndim, s->shape, DT_F32, g,
                                    NULL, &gi);
    if (st < 0)
        return dt_error_wrap(st, "backward of reshard of %s", s->name ? s->name : "tensor");
    if (dt_tensor_numel(gi) != dt_tensor_numel(grad_in[0]))
        return dt_error(DT_ERR_INTERNAL, "backward of reshard of %s: gradient size %lld, input %lld",
                        s->name ? s->name : "tensor", (long long)dt_tensor_numel(gi),
                        (long long)dt_tensor_numel(grad_in[0]));
    if (any_red && s->xin && dt_mesh_contains_self(s->mf) &&
        (st = maxmin_mask(ctx, s, red, gi->data)) < 0)
        return dt_error_wrap(st, "backward of reshard of %s: the Partial(max/min) mask",
                             s->name ? s->name : "tensor");
    memcpy(grad_in[0]->data, gi->data, (size_t)dt_tensor_numel(gi) * sizeof(float));
    scale_f32(grad_in[0]->data, dt_tensor_numel(gi), 1.0 / avg_factor(s->mf, s->pf));
    return DT_OK;
}

dt_dtensor *dt_reshard(dt_ctx *ctx, dt_dtensor *x, dt_mesh *to, const dt_placement *pl)
{
    const char *op = "dt_reshard";
    if (!ctx) {
        dt_error(DT_ERR_NULL, "%s: NULL context", op);
        return NULL;
    }
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: NULL input", op);
        return NULL;
    }
    const char *what = x->name ? x->name : "tensor";
    dt_mesh *mt = to ? to : x->mesh;
    if (dt_mesh_world(mt) != dt_mesh_world(x->mesh)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: %s: the target mesh is built over another world group",
                 op, what);
        return NULL;
    }
    dt_placement pt[DT_MESH_MAX_DIMS];
    if (dt__placements_check(mt, pl, x->ndim, what, pt) < 0)
        return NULL;
    dt_tensor *in = x->local;
    if (!in || !dt_tensor_is_contiguous(in) || (in->flags & DT_TENSOR_BLOCKED)) {
        in = dt_contiguous(ctx, x->local);
        if (!in)
            return NULL;
    }
    int mnf = dt_mesh_ndim(x->mesh);
    bool want = dt_ag_enabled(ctx) && dt_dtype_is_float(x->dtype) &&
                (in->flags & DT_TENSOR_REQUIRES_GRAD);
    bool cross = mt != x->mesh;
    /* across meshes a rank only in the target mesh learns from its sources
     * whether they record (reshard_cross.c sends the flag with every box) */
    int rg = want;
    if (dt__reshard_agree(x->mesh, x->placements, mt, pt, x->ndim, x->shape, x->dtype, what) < 0)
        return NULL;
    dt_tensor *out;
    if (dt__reshard_data(ctx, x->mesh, x->placements, mt, pt, x->ndim, x->shape, x->dtype, in,
                         &rg, &out) < 0)
        return NULL;
    out->name = x->name;
    if (cross && !want && !dt_mesh_contains_self(x->mesh) && rg &&
        dt_ag_enabled(ctx) && dt_dtype_is_float(x->dtype)) {
        /* only in the target mesh, and the sources record: record too, over
         * an empty stand-in for the input, so backward sends the gradient */
        int64_t z[DT_MAX_DIMS] = {0};
        in = dt_tensor_zeros(ctx, x->dtype, x->ndim, z);
        if (!in || dt_tensor_set_requires_grad(in, true) < 0)
            return NULL;
        want = true;
    }
    if (want) {
        rs_save *s = dt_ctx_alloc(ctx, sizeof *s);
        if (!s)
            return NULL;
        memset(s, 0, sizeof *s);
        s->mf = x->mesh;
        s->mt = mt;
        memcpy(s->pf, x->placements, sizeof s->pf);
        memcpy(s->pt, pt, sizeof s->pt);
        s->ndim = x->ndim;
        memcpy(s->shape, x->shape, sizeof s->shape);
        s->name = x->name;
        bool red = false;
        for (int i = 0; i < mnf; i++)
            red |= reduces_maxmin(x->mesh, x->placements, mt, pt, i);
        /* the mask needs the input as it was (a later in-place change must
         * not move it) */
        if (red && dt_mesh_contains_self(x->mesh)) {
            if (!(s->xin = dt_tensor_empty(ctx, in->dtype, in->ndim, in->shape)))
                return NULL;
            memcpy(s->xin->data, in->data, dt_tensor_nbytes(in));
        }
        if (!dt_ag_custom(ctx, 1, &in, out, rs_backward, s))
            return NULL;
    }
    return dt__dtensor_make(ctx, mt, out, pt, x->ndim, x->shape, x->name);
}
