/* Reshard (mesh.h) in real processes: every transition of SEMANTICS 4.3
 * between every pair of placements on 1-d meshes of 1, 2, 3 and 4 ranks
 * (R, S(d), P(sum|avg|max|min); on the first shape f32, i32 and i64 for
 * every pair, bf16 and f16 for a third of them) and of 8 ranks (R, S(d), P(sum); f32, bf16), and on 2-d meshes
 * (2x2 with ranks [3,1,0,2], four dtypes; the permuted 2x3
 * [[2,4,5],[0,1,3]], f32); shapes uneven (dims smaller than the mesh, not
 * divisible) and even (the plain collectives). Each rank's local piece is
 * exactly its box of the global tensor (Partial results: their reduction,
 * and the R -> P rule exactly). Backward: the input's gradient is exactly
 * the box of the seeded global gradient (the adjoint: <reshard(x), g> =
 * <x, reshard_bwd(g)> on the global tensors, checked elementwise);
 * Partial(max|min) sends the gradient to the piece holding the extreme,
 * split evenly among ties. Cross-mesh: disjoint meshes (the
 * pipeline seed's mesh0 -> mesh1 with [S(0), S(2)]) and overlapping ones,
 * forward and backward. */
// dt-test-timeout: 200
#include "parallel/mesh_util.h"
#include "test.h"

static const dt_dtype dtypes[] = {DT_F32, DT_BF16, DT_F16, DT_I32, DT_I64};

/* Placements to try on one mesh dim of a tensor of ndim dims. */
static int candidates(int ndim, dt_placement *out, bool all_ops)
{
    int n = 0;
    out[n++] = dt_replicate();
    for (int d = 0; d < ndim; d++)
        out[n++] = dt_shard(d);
    out[n++] = dt_partial(DT_REDUCE_SUM);
    if (all_ops) {
        out[n++] = dt_partial(DT_REDUCE_AVG);
        out[n++] = dt_partial(DT_REDUCE_MAX);
        out[n++] = dt_partial(DT_REDUCE_MIN);
    }
    return n;
}

static bool valid(const dt_mesh *m, const dt_placement *p, int ndim)
{
    int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
    int64_t shape[DT_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 1};
    dt_status s = dt_dtensor_local_box(m, p, ndim, shape, (int[]){0, 0, 0, 0}, "v", st, len);
    dt_error_clear();
    return s >= 0;
}

/* One reshard from pf to pt of global tensor `seed`; check the values. */
static int n_checked; /* reshards checked by this rank (printed by rank 0) */

static int one(dt_ctx *ctx, dt_mesh *m, const dt_placement *pf, const dt_placement *pt,
               dt_dtype dt, int ndim, const int64_t *shape, int seed)
{
    int mn = dt_mesh_ndim(m);
    char a[128], b[128], what[400];
    snprintf(what, sizeof what, "%s -> %s %s shape[%lld,%lld,%lld]",
             dt_placements_str(pf, mn, a, sizeof a), dt_placements_str(pt, mn, b, sizeof b),
             dt_dtype_name(dt), (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 0),
             (long long)(ndim > 2 ? shape[2] : 0));
    dt_dtensor *x = mu_make(ctx, m, pf, seed, dt, ndim, shape);
    TH_CHECK(x, "%s: make: %s", what, dt_last_error());
    dt_dtensor *y = dt_reshard(ctx, x, NULL, pt);
    TH_CHECK(y, "%s: %s", what, dt_last_error());
    n_checked++;
    bool partial = false;
    for (int i = 0; i < mn; i++)
        partial |= pt[i].kind == DT_PLACE_PARTIAL;
    if (!partial)
        return mu_check_box(y->local, m, pt, seed, ndim, shape, what);
    /* R -> P exactly (coordinate 0 keeps the value for sum) */
    bool from_rs = true;
    for (int i = 0; i < mn; i++)
        from_rs &= pf[i].kind != DT_PLACE_PARTIAL;
    if (from_rs && mn == 1) {
        bool zero = pt[0].op == DT_REDUCE_SUM && dt_mesh_coord(m, 0) != 0;
        int64_t n = dt_tensor_numel(y->local);
        dt_placement r[1] = {dt_replicate()};
        if (zero) {
            for (int64_t e = 0; e < n; e++)
                TH_CHECK(dt_tensor_get(y->local, e) == 0, "%s: R->P element %lld not zero", what,
                         (long long)e);
        } else if (mu_check_box(y->local, m, r, seed, ndim, shape, what)) {
            return 1;
        }
    }
    /* the reduction of the partial pieces is the tensor */
    dt_tensor *f = dt_dtensor_full(ctx, y);
    TH_CHECK(f, "%s: full: %s", what, dt_last_error());
    dt_placement r[DT_MESH_MAX_DIMS];
    for (int i = 0; i < mn; i++)
        r[i] = dt_replicate();
    return mu_check_box(f, m, r, seed, ndim, shape, what);
}

typedef struct {
    int ndim_mesh;
    int mshape[2];
    const int *ids;
    bool all_ops;  /* avg/max/min too */
    int ndt;       /* how many of dtypes[] */
} cfg;

/* Every valid pair of placements, several shapes, the dtypes asked for. */
static int body_pairs(int rank, int size, void *arg)
{
    const cfg *c = arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, c->ndim_mesh, c->mshape, c->ids, NULL, &m));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int k = dt_mesh_size(m, -1);
    /* shapes: uneven, smaller than the mesh on some dim, and even (the
     * plain all-gather / all-to-all paths) */
    int64_t shapes[4][3] = {{(int64_t)k + 1, 3, 0}, {2, (int64_t)2 * k + 1, 3}, {1, 5, 0},
                            {(int64_t)2 * k, (int64_t)k, 0}};
    int ndims[4] = {2, 3, 2, 2};
    int nshape = c->ndim_mesh == 1 ? 4 : 2;
    for (int si = 0; si < nshape; si++) {
        int nd = ndims[si];
        dt_placement cand[8];
        int nc = candidates(nd, cand, c->all_ops);
        int total = 1;
        for (int i = 0; i < c->ndim_mesh; i++)
            total *= nc;
        for (int fi = 0; fi < total; fi++) {
            dt_placement pf[2];
            for (int i = 0, q = fi; i < c->ndim_mesh; i++, q /= nc)
                pf[i] = cand[q % nc];
            if (!valid(m, pf, nd))
                continue;
            for (int ti = 0; ti < total; ti++) {
                dt_placement pt[2];
                for (int i = 0, q = ti; i < c->ndim_mesh; i++, q /= nc)
                    pt[i] = cand[q % nc];
                if (!valid(m, pt, nd))
                    continue;
                int ndt = (si == 0) ? c->ndt : 1;
                for (int di = 0; di < ndt; di++) {
                    dt_dtype dt = dtypes[di];
                    bool lowp = dt == DT_BF16 || dt == DT_F16;
                    /* low precision: sum/avg partials lose nothing with these small
                     * integers, but keep the count of runs down */
                    if (lowp && (fi + ti) % 3 != 0)
                        continue;
                    if (one(ctx, m, pf, pt, dt, nd, shapes[si], si + 1 + fi))
                        return 1;
                    dt_ctx_reset(ctx);
                }
            }
        }
    }
    if (rank == 0)
        printf("%d ranks: %d reshards checked\n", size, n_checked);
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(pairs_1d)
{
    int worlds[] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++) {
        cfg c = {1, {worlds[i], 1}, NULL, true, 5};
        ASSERT_EQ_INT(th_run(worlds[i], 60.0, body_pairs, &c, NULL), 0);
    }
}

TEST(pairs_1d_8)
{
    cfg c = {1, {8, 1}, NULL, false, 2};
    ASSERT_EQ_INT(th_run(8, 90.0, body_pairs, &c, NULL), 0);
}

TEST(pairs_2d)
{
    cfg c = {2, {2, 2}, (const int[]){3, 1, 0, 2}, false, 4};
    ASSERT_EQ_INT(th_run(4, 90.0, body_pairs, &c, NULL), 0);
}

TEST(pairs_2d_permuted_6)
{
    static const int ids[] = {2, 4, 5, 0, 1, 3};
    cfg c = {2, {2, 3}, ids, false, 1};
    ASSERT_EQ_INT(th_run(6, 120.0, body_pairs, &c, NULL), 0);
}

/* Backward: seed the output with the box of global gradient G (times the
 * output's avg factor), expect the input's gradient to be the box of G
 * (over the input's avg factor). */
static double avgf(const dt_mesh *m, const dt_placement *p)
{
    double f = 1;
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (p[i].kind == DT_PLACE_PARTIAL && p[i].op == DT_REDUCE_AVG)
            f *= dt_mesh_size(m, i);
    return f;
}

static int grad_one(dt_ctx *ctx, dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                    const dt_placement *pt, int ndim, const int64_t *shape)
{
    char a[128], b[128], what[300];
    snprintf(what, sizeof what, "backward %s -> %s%s",
             dt_placements_str(pf, dt_mesh_ndim(mf), a, sizeof a),
             dt_placements_str(pt, dt_mesh_ndim(mt), b, sizeof b), mf == mt ? "" : " (cross)");
    dt_dtensor *x = mu_make(ctx, mf, pf, 5, DT_F32, ndim, shape);
    TH_CHECK(x, "%s: %s", what, dt_last_error());
    /* the input is a leaf that wants gradients */
    dt_tensor *leaf = x->local;
    TH_OK(dt_tensor_set_requires_grad(leaf, true));
    dt_dtensor *y = dt_reshard(ctx, x, mt, pt);
    TH_CHECK(y, "%s: %s", what, dt_last_error());
    /* gradient seed: box of G (seed 9) in the output's placements; on a
     * Partial(max|min) output dim the pieces' gradients add up, so only
     * coordinate 0 holds G there */
    dt_placement q[DT_MESH_MAX_DIMS];
    bool seed_zero = false, want_zero = false;
    for (int i = 0; i < dt_mesh_ndim(mt); i++) {
        q[i] = pt[i].kind == DT_PLACE_PARTIAL ? dt_replicate() : pt[i];
        seed_zero |= mu_maxmin(pt[i]) && dt_mesh_coord(mt, i) != 0;
    }
    /* the input's gradient: G's box, except that on a Partial(max|min)
     * input dim only the piece holding the extreme (mu_make: coordinate 0,
     * no ties) gets it */
    for (int i = 0; i < dt_mesh_ndim(mf); i++)
        want_zero |= mu_maxmin(pf[i]) && dt_mesh_coord(mf, i) != 0;
    dt_dtensor *g = mu_make(ctx, mt, q, 9, DT_F32, ndim, shape);
    TH_CHECK(g, "%s: seed: %s", what, dt_last_error());
    double fo = avgf(mt, pt), fi = avgf(mf, pf);
    int64_t n = dt_tensor_numel(g->local);
    for (int64_t e = 0; e < n; e++)
        ((float *)g->local->data)[e] = seed_zero ? 0.0f : ((float *)g->local->data)[e] / (float)fo;
    if (y->local->node_ || dt_tensor_numel(y->local) > 0 || dt_mesh_contains_self(mf))
        TH_OK(dt_backward_with(ctx, y->local, g->local));
    if (!dt_mesh_contains_self(mf))
        return 0;
    TH_CHECK(leaf->grad, "%s: no gradient", what);
    dt_tensor *gx = dt_tensor_clone(ctx, leaf->grad);
    int64_t m = dt_tensor_numel(gx);
    for (int64_t e = 0; e < m; e++)
        ((float *)gx->data)[e] *= (float)fi;
    dt_placement p2[DT_MESH_MAX_DIMS];
    for (int i = 0; i < dt_mesh_ndim(mf); i++)
        p2[i] = pf[i].kind == DT_PLACE_PARTIAL ? dt_replicate() : pf[i];
    if (want_zero) {
        for (int64_t e = 0; e < m; e++)
            TH_CHECK(((float *)gx->data)[e] == 0.0f, "%s: element %lld is %g, not 0 (a piece "
                     "that does not hold the extreme)", what, (long long)e, ((float *)gx->data)[e]);
        return 0;
    }
    return mu_check_box(gx, mf, p2, 9, ndim, shape, what);
}

static int body_grad(int rank, int size, void *arg)
{
    const cfg *c = arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, c->ndim_mesh, c->mshape, c->ids, NULL, &m));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int k = dt_mesh_size(m, -1);
    int64_t shape[2] = {(int64_t)k + 1, 3};
    dt_placement cand[8];
    int nc = candidates(2, cand, false);
    cand[nc++] = dt_partial(DT_REDUCE_AVG);
    cand[nc++] = dt_partial(DT_REDUCE_MAX);
    if (c->ndim_mesh == 1) /* 2-d: max stands for both (7 x 7 pairs per dim is slow) */
        cand[nc++] = dt_partial(DT_REDUCE_MIN);
    int total = c->ndim_mesh == 1 ? nc : nc * nc;
    for (int fi = 0; fi < total; fi++)
        for (int ti = 0; ti < total; ti++) {
            dt_placement pf[2], pt[2];
            for (int i = 0, q = fi; i < c->ndim_mesh; i++, q /= nc)
                pf[i] = cand[q % nc];
            for (int i = 0, q = ti; i < c->ndim_mesh; i++, q /= nc)
                pt[i] = cand[q % nc];
            if (!valid(m, pf, 2) || !valid(m, pt, 2))
                continue;
            if (grad_one(ctx, m, pf, m, pt, 2, shape))
                return 1;
            dt_ctx_reset(ctx);
        }
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(backward_1d)
{
    int worlds[] = {1, 3, 4};
    for (int i = 0; i < 3; i++) {
        cfg c = {1, {worlds[i], 1}, NULL, false, 1};
        ASSERT_EQ_INT(th_run(worlds[i], 60.0, body_grad, &c, NULL), 0);
    }
}

TEST(backward_2d)
{
    cfg c = {2, {2, 2}, NULL, false, 1};
    ASSERT_EQ_INT(th_run(4, 90.0, body_grad, &c, NULL), 0);
}

/* Partial(max|min) backward with ties: piece r of element e is 7 (max; -7
 * for min) where bit r of e is set, else (e % 5) - 3 (the same on every
 * piece, so an element with no bit set ties on all pieces). The input's
 * gradient is G * [piece == extreme] / (number of pieces holding it), for
 * P -> R and P -> S(0) on a 1-d mesh and [P, P] -> [R, R] (ties over the
 * product of both dims) and [P, P] -> [S(0), P] (ties over dim 0 only) on a
 * 2x2 mesh; f32 and bf16 inputs. */
static float tie_piece(int64_t e, int r, int sign)
{
    return (e >> r) & 1 ? 7.0f * (float)sign : (float)(e % 5 - 3);
}

static int body_ties(int rank, int size, void *arg)
{
    const cfg *c = arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, c->ndim_mesh, c->mshape, NULL, NULL, &m));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int mn = c->ndim_mesh;
    int64_t shape[1] = {1 << size};
    int64_t n = shape[0];
    dt_dtype dts[2] = {DT_F32, DT_BF16};
    for (int op = 0; op < 2; op++)
        for (int di = 0; di < 2; di++)
            for (int tc = 0; tc < 2; tc++) {
                dt_reduce_op rop = op ? DT_REDUCE_MIN : DT_REDUCE_MAX;
                int sign = op ? -1 : 1;
                dt_placement pf[2] = {dt_partial(rop), dt_partial(rop)}, pt[2];
                /* tc 0: every dim reduced (Replicate); 1: dim 0 to Shard(0), the rest kept */
                pt[0] = tc ? dt_shard(0) : dt_replicate();
                pt[1] = tc ? dt_partial(rop) : dt_replicate();
                /* the pieces reduced together: over dim 0 only (tc 1 on 2-d), else all */
                int k0 = dt_mesh_size(m, 0), c0 = dt_mesh_coord(m, 0);
                int grp = tc && mn == 2 ? k0 : size, me = tc && mn == 2 ? c0 : rank;
                int stride = tc && mn == 2 ? dt_mesh_size(m, 1) : 1;
                dt_tensor *loc = dt_tensor_empty(ctx, dts[di], 1, shape);
                for (int64_t e = 0; e < n; e++)
                    dt_tensor_set(loc, e, tie_piece(e, rank, sign));
                dt_dtensor *x;
                TH_OK(dt_dtensor_from_local(ctx, m, loc, pf, shape, &x));
                TH_OK(dt_tensor_set_requires_grad(loc, true));
                dt_dtensor *y = dt_reshard(ctx, x, NULL, pt);
                TH_CHECK(y, "ties: %s", dt_last_error());
                /* seed: G[e] = e + 1 in the output's box (a kept P dim: coordinate 0 only) */
                int64_t st = 0, len = n;
                if (tc)
                    dt_chunk_range(n, k0, c0, &st, &len);
                bool zero = tc && mn == 2 && dt_mesh_coord(m, 1) != 0;
                dt_tensor *g = dt_tensor_empty(ctx, DT_F32, 1, (int64_t[]){len});
                for (int64_t e = 0; e < len; e++)
                    ((float *)g->data)[e] = zero ? 0.0f : (float)(st + e + 1);
                TH_OK(dt_backward_with(ctx, y->local, g));
                const float *gx = loc->grad->data;
                for (int64_t e = 0; e < n; e++) {
                    /* the group's pieces: ranks me' * stride + (rank - me * stride) */
                    int other = rank - me * stride, cnt = 0;
                    float ext = 0;
                    for (int q = 0; q < grp; q++) {
                        float v = tie_piece(e, other + q * stride, sign);
                        if (q == 0 || (sign > 0 ? v > ext : v < ext))
                            ext = v;
                    }
                    for (int q = 0; q < grp; q++)
                        cnt += tie_piece(e, other + q * stride, sign) == ext;
                    float mine = tie_piece(e, rank, sign);
                    float want = zero || mine != ext ? 0.0f : (float)(e + 1) / (float)cnt;
                    TH_CHECK(gx[e] == want, "ties %s %s tc %d: element %lld: gradient %g, want %g "
                             "(%d pieces hold the extreme)", op ? "min" : "max",
                             dt_dtype_name(dts[di]), tc, (long long)e, gx[e], want, cnt);
                }
                dt_ctx_reset(ctx);
            }
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(backward_maxmin_ties)
{
    cfg c1 = {1, {3, 1}, NULL, false, 1};
    ASSERT_EQ_INT(th_run(3, 60.0, body_ties, &c1, NULL), 0);
    cfg c2 = {2, {2, 2}, NULL, false, 1};
    ASSERT_EQ_INT(th_run(4, 60.0, body_ties, &c2, NULL), 0);
}

/* Cross-mesh, 8 ranks: the pipeline seed (mesh0 [[0,1],[2,3]], mesh1
 * [[4,5],[6,7]]; y [B=2, S, H] from [S(0), P(sum)] on mesh0 to [S(0),
 * S(2)] on mesh1), then overlapping meshes (a 1-d mesh of 3 ranks to a
 * permuted 2x2 mesh sharing two of them) and back; forward values exact,
 * backward gradients exact. */
static int body_cross(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m0, *m1, *ma, *mb;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){0, 1, 2, 3}, (const char *[]){"x", "y"}, &m0));
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){4, 5, 6, 7}, (const char *[]){"x", "y"}, &m1));
    TH_OK(dt_mesh_init(w, 1, (int[]){3}, (int[]){0, 5, 2}, NULL, &ma));
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){2, 6, 7, 0}, NULL, &mb));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int64_t shape[3] = {2, 3, 5};
    struct {
        dt_mesh *f, *t;
        dt_placement pf[2], pt[2];
    } cases[] = {
        {m0, m1, {dt_shard(0), dt_partial(DT_REDUCE_SUM)}, {dt_shard(0), dt_shard(2)}},
        {m0, m1, {dt_shard(0), dt_shard(2)}, {dt_shard(2), dt_shard(1)}},
        {m1, m0, {dt_replicate(), dt_shard(1)}, {dt_partial(DT_REDUCE_SUM), dt_replicate()}},
        {ma, mb, {dt_shard(2)}, {dt_shard(1), dt_shard(0)}},
        {mb, ma, {dt_replicate(), dt_shard(2)}, {dt_shard(1)}},
        {ma, mb, {dt_partial(DT_REDUCE_AVG)}, {dt_replicate(), dt_partial(DT_REDUCE_AVG)}},
        {ma, mb, {dt_partial(DT_REDUCE_MAX)}, {dt_replicate(), dt_partial(DT_REDUCE_MAX)}},
        {mb, ma, {dt_shard(1), dt_partial(DT_REDUCE_MIN)}, {dt_shard(0)}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_dtype dts[] = {DT_F32, DT_BF16, DT_I32};
        for (int di = 0; di < 3; di++) {
            dt_dtensor *x = mu_make(ctx, cases[i].f, cases[i].pf, 3, dts[di], 3, shape);
            TH_CHECK(x, "cross %zu make: %s", i, dt_last_error());
            dt_dtensor *y = dt_reshard(ctx, x, cases[i].t, cases[i].pt);
            TH_CHECK(y, "cross %zu: %s", i, dt_last_error());
            TH_CHECK(y->mesh == cases[i].t, "mesh");
            bool partial = cases[i].pt[0].kind == DT_PLACE_PARTIAL ||
                           cases[i].pt[1].kind == DT_PLACE_PARTIAL;
            dt_tensor *loc = y->local;
            if (partial && dt_mesh_ndim(cases[i].t) == 2) {
                loc = dt_dtensor_full(ctx, y);
                TH_CHECK(loc, "full: %s", dt_last_error());
            }
            dt_placement r[2] = {dt_replicate(), dt_replicate()};
            char what[64];
            snprintf(what, sizeof what, "cross case %zu %s", i, dt_dtype_name(dts[di]));
            if (mu_check_box(loc, cases[i].t, partial ? r : cases[i].pt, 3, 3, shape, what))
                return 1;
            dt_ctx_reset(ctx);
        }
        if (grad_one(ctx, cases[i].f, cases[i].pf, cases[i].t, cases[i].pt, 3, shape))
            return 1;
        dt_ctx_reset(ctx);
    }
    dt_ctx_free(ctx);
    dt_mesh_free(mb);
    dt_mesh_free(ma);
    dt_mesh_free(m1);
    dt_mesh_free(m0);
    dt_pg_free(w);
    return 0;
}

TEST(cross_mesh_8)
{
    ASSERT_EQ_INT(th_run(8, 90.0, body_cross, NULL, NULL), 0);
}

/* Ranks that pass different placements (or shapes) to the same reshard
 * get DT_ERR_MISMATCH on every rank, naming the tensor and both variants
 * (the agreement check), and the group stays usable: a 2x2 mesh where rank
 * 3 asks for another target; then rank 1 with another global shape; then
 * across meshes (ranks {0,1} -> {2,3}, covering the world) with rank 2
 * asking for another target; then a correct reshard. */
static int body_agree(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m, *ma, *mb;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, NULL, NULL, &m));
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, (int[]){0, 1}, NULL, &ma));
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, (int[]){2, 3}, NULL, &mb));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int64_t shape[2] = {4, 6}, other[2] = {4, 7};
    dt_placement pf[2] = {dt_shard(0), dt_replicate()};
    dt_placement pt[2] = {rank == 3 ? dt_shard(1) : dt_replicate(), dt_replicate()};
    dt_dtensor *x = mu_make(ctx, m, pf, 1, DT_F32, 2, shape);
    TH_CHECK(x, "make: %s", dt_last_error());
    x->name = "w0";
    dt_dtensor *y = dt_reshard(ctx, x, NULL, pt);
    TH_CHECK(!y && dt_last_status() == DT_ERR_MISMATCH, "placements: got %s",
             y ? "a result" : dt_last_error());
    const char *e = dt_last_error();
    TH_CHECK(strstr(e, "w0") && strstr(e, "Shard(1)") && strstr(e, "Replicate") &&
                 strstr(e, "disagree"),
             "message: %s", e);
    dt_ctx_reset(ctx);
    x = mu_make(ctx, m, pf, 1, DT_F32, 2, rank == 1 ? other : shape);
    TH_CHECK(x, "make: %s", dt_last_error());
    x->name = "w1";
    dt_placement r2[2] = {dt_replicate(), dt_replicate()};
    y = dt_reshard(ctx, x, NULL, r2);
    TH_CHECK(!y && dt_last_status() == DT_ERR_MISMATCH, "shape: got %s",
             y ? "a result" : dt_last_error());
    TH_CHECK(strstr(dt_last_error(), "w1") && strstr(dt_last_error(), "shape"), "message: %s",
             dt_last_error());
    dt_ctx_reset(ctx);
    dt_placement s0 = dt_shard(0), tb = rank == 2 ? dt_shard(1) : dt_shard(0);
    x = mu_make(ctx, ma, &s0, 2, DT_F32, 2, shape);
    TH_CHECK(x, "make: %s", dt_last_error());
    x->name = "y";
    y = dt_reshard(ctx, x, mb, &tb);
    TH_CHECK(!y && dt_last_status() == DT_ERR_MISMATCH, "cross: got %s",
             y ? "a result" : dt_last_error());
    TH_CHECK(strstr(dt_last_error(), "y") && strstr(dt_last_error(), "Shard(1)"), "message: %s",
             dt_last_error());
    dt_ctx_reset(ctx);
    x = mu_make(ctx, m, pf, 1, DT_F32, 2, shape);
    TH_CHECK(x, "make: %s", dt_last_error());
    y = dt_reshard(ctx, x, NULL, r2);
    TH_CHECK(y, "after the mismatches: %s", dt_last_error());
    if (mu_check_box(y->local, m, r2, 1, 2, shape, "after the mismatches"))
        return 1;
    dt_ctx_free(ctx);
    dt_mesh_free(mb);
    dt_mesh_free(ma);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(agreement_check_4)
{
    ASSERT_EQ_INT(th_run(4, 90.0, body_agree, NULL, NULL), 0);
}

int main(void)
{
    RUN(pairs_1d);
    RUN(pairs_2d);
    RUN(backward_1d);
    RUN(backward_2d);
    RUN(backward_maxmin_ties);
    RUN(cross_mesh_8);
    RUN(agreement_check_4);
    RUN(pairs_1d_8);
    RUN(pairs_2d_permuted_6);
    return TEST_REPORT();
}
