/* Ops on distributed tensors (mesh.h) against the same ops in one process:
 * matmul for every pair of input placements (R, S(0), S(1), P(sum)) on
 * 1-d meshes of 3 and 4 ranks and on a 2x2 mesh, 3-d activations with 2-d
 * and batched weights, elementwise ops with broadcasting, sum/mean ->
 * Partial, softmax, layer norm and cross-entropy with sharded rows. Each
 * case checks the full result and the gradients of the (replicated) full
 * inputs after backward from the distributed loss: matmul values are small
 * integers, so those must match exactly; the rest within 1e-5 relative. */
// dt-test-timeout: 200
#include "parallel/mesh_util.h"
#include "test.h"

/* A persistent full tensor of global values `seed`, scaled, requiring grad. */
static dt_tensor *leaf(int seed, int ndim, const int64_t *shape, float scale)
{
    dt_tensor *t = dt_tensor_new(DT_F32, ndim, shape);
    int64_t z[DT_MAX_DIMS] = {0};
    mu_fill_box(t, seed, ndim, shape, z, shape);
    for (int64_t e = 0; e < dt_tensor_numel(t); e++)
        ((float *)t->data)[e] *= scale;
    dt_tensor_set_requires_grad(t, true);
    return t;
}

static int close_all(const dt_tensor *a, const dt_tensor *b, double tol, const char *what)
{
    TH_CHECK(dt_tensor_numel(a) == dt_tensor_numel(b), "%s: %lld vs %lld elements", what,
             (long long)dt_tensor_numel(a), (long long)dt_tensor_numel(b));
    for (int64_t e = 0; e < dt_tensor_numel(a); e++) {
        double x = dt_tensor_get(a, e), y = dt_tensor_get(b, e);
        double d = x - y;
        if (d < 0)
            d = -d;
        double s = y < 0 ? -y : y;
        TH_CHECK(d <= tol * (1 + s), "%s: element %lld: %.9g vs %.9g", what, (long long)e, x, y);
    }
    return 0;
}

typedef dt_tensor *(*ref_fn)(dt_ctx *, dt_tensor **);
typedef dt_dtensor *(*dist_fn)(dt_ctx *, dt_dtensor **);

/* Run fn on full leaves in one process and distributed with placements pl
 * (per input), loss = sum(out * W); compare out, loss and the leaves'
 * gradients. */
static int compare(dt_ctx *ctx, dt_mesh *m, int nin, dt_tensor **full, dt_placement (*pl)[2],
                   ref_fn rf, dist_fn df, double tol, const char *what)
{
    int mn = dt_mesh_ndim(m);
    /* reference */
    for (int j = 0; j < nin; j++)
        dt_ag_zero_grad(full[j]);
    dt_tensor *ro = rf(ctx, full);
    TH_CHECK(ro, "%s: reference: %s", what, dt_last_error());
    dt_tensor *W = leaf(77, ro->ndim, ro->shape, 0.5f);
    dt_tensor_set_requires_grad(W, false);
    dt_tensor *rl = dt_sum(ctx, dt_mul(ctx, ro, W));
    TH_OK(dt_backward(ctx, rl));
    dt_tensor *rg[3];
    for (int j = 0; j < nin; j++) {
        rg[j] = dt_tensor_clone(ctx, full[j]->grad);
        dt_ag_zero_grad(full[j]);
    }
    float rloss = dt_tensor_item(rl);
    /* distributed */
    dt_dtensor *in[3];
    for (int j = 0; j < nin; j++)
        TH_OK(dt_shard_tensor(ctx, m, full[j], pl[j], &in[j]));
    dt_dtensor *y = df(ctx, in);
    TH_CHECK(y, "%s: %s", what, dt_last_error());
    dt_placement R[2] = {dt_replicate(), dt_replicate()};
    dt_dtensor *w;
    TH_OK(dt_shard_tensor(ctx, m, W, R, &w));
    dt_dtensor *l = dt_dtensor_sum(ctx, dt_dtensor_mul(ctx, y, w));
    TH_CHECK(l, "%s: loss: %s", what, dt_last_error());
    bool was = dt_ag_set_enabled(ctx, false);
    dt_tensor *yf = dt_dtensor_full(ctx, y), *lf = dt_dtensor_full(ctx, l);
    dt_ag_set_enabled(ctx, was);
    TH_CHECK(yf && lf, "%s: full: %s", what, dt_last_error());
    char w2[300];
    snprintf(w2, sizeof w2, "%s: out", what);
    if (close_all(yf, ro, tol, w2))
        return 1;
    TH_CHECK(fabs(dt_tensor_item(lf) - rloss) <= tol * (1 + fabs(rloss)), "%s: loss %g vs %g",
             what, dt_tensor_item(lf), rloss);
    TH_OK(dt_backward(ctx, l->local));
    for (int j = 0; j < nin; j++) {
        if (!full[j]->grad || !rg[j])
            continue;
        char ps[96];
        snprintf(w2, sizeof w2, "%s: grad of input %d %s", what, j,
                 dt_placements_str(pl[j], mn, ps, sizeof ps));
        if (close_all(full[j]->grad, rg[j], tol, w2))
            return 1;
        dt_ag_zero_grad(full[j]);
    }
    dt_tensor_free(W);
    return 0;
}

static dt_tensor *r_matmul(dt_ctx *c, dt_tensor **x) { return dt_matmul(c, x[0], x[1]); }
static dt_dtensor *d_matmul(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_matmul(c, x[0], x[1]); }
static dt_tensor *r_add(dt_ctx *c, dt_tensor **x) { return dt_add(c, x[0], x[1]); }
static dt_dtensor *d_add(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_add(c, x[0], x[1]); }
static dt_tensor *r_mul(dt_ctx *c, dt_tensor **x) { return dt_mul(c, x[0], x[1]); }
static dt_dtensor *d_mul(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_mul(c, x[0], x[1]); }
static dt_tensor *r_div(dt_ctx *c, dt_tensor **x) { return dt_div(c, x[0], x[1]); }
static dt_dtensor *d_div(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_div(c, x[0], x[1]); }
static dt_tensor *r_softmax(dt_ctx *c, dt_tensor **x) { return dt_softmax(c, x[0]); }
static dt_dtensor *d_softmax(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_softmax(c, x[0]); }
static dt_tensor *r_gelu(dt_ctx *c, dt_tensor **x) { return dt_gelu(c, x[0]); }
static dt_dtensor *d_gelu(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_gelu(c, x[0]); }
static dt_tensor *r_ln(dt_ctx *c, dt_tensor **x) { return dt_layer_norm(c, x[0], x[1], x[2], 1e-5f); }
static dt_dtensor *d_ln(dt_ctx *c, dt_dtensor **x)
{
    return dt_dtensor_layer_norm(c, x[0], x[1], x[2], 1e-5f);
}
static dt_tensor *r_mean(dt_ctx *c, dt_tensor **x) { return dt_mean(c, x[0]); }
static dt_dtensor *d_mean(dt_ctx *c, dt_dtensor **x) { return dt_dtensor_mean(c, x[0]); }

static int n_cases;

/* every pair of placements from cand for two inputs of ndims na, nb */
/* sample > 1: only every sample-th pair (the 2-d mesh has hundreds) */
static int all_pairs(dt_ctx *ctx, dt_mesh *m, dt_tensor **full, ref_fn rf, dist_fn df, double tol,
                     const char *name, bool with_partial, int sample)
{
    int mn = dt_mesh_ndim(m);
    dt_placement cand[8];
    int nc = 0;
    cand[nc++] = dt_replicate();
    int maxd = full[0]->ndim > full[1]->ndim ? full[0]->ndim : full[1]->ndim;
    for (int d = 0; d < maxd; d++)
        cand[nc++] = dt_shard(d);
    if (with_partial)
        cand[nc++] = dt_partial(DT_REDUCE_SUM);
    int per = mn == 1 ? nc : nc * nc;
    for (int a = 0; a < per; a++)
        for (int b = 0; b < per; b++) {
            if (sample > 1 && (a * per + b) % sample != 0)
                continue;
            dt_placement pl[2][2];
            for (int i = 0, q = a; i < mn; i++, q /= nc)
                pl[0][i] = cand[q % nc];
            for (int i = 0, q = b; i < mn; i++, q /= nc)
                pl[1][i] = cand[q % nc];
            int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
            bool ok = true;
            for (int j = 0; j < 2 && ok; j++) {
                ok = dt_dtensor_local_box(m, pl[j], full[j]->ndim, full[j]->shape,
                                          (int[]){0, 0}, "", st, len) >= 0;
                dt_error_clear();
            }
            if (!ok)
                continue;
            char pa[96], pb[96], what[300];
            snprintf(what, sizeof what, "%s %s x %s", name, dt_placements_str(pl[0], mn, pa, sizeof pa),
                     dt_placements_str(pl[1], mn, pb, sizeof pb));
            if (compare(ctx, m, 2, full, pl, rf, df, tol, what))
                return 1;
            n_cases++;
            dt_ctx_reset(ctx);
        }
    return 0;
}

/* arg: 0 = 1-d mesh, every op and pair; 1 = 2x2 mesh, sampled pairs;
 * 2 = 1-d mesh, matmul pairs and cross-entropy only */
static int body_ops(int rank, int size, void *arg)
{
    int two_d = *(int *)arg == 1, quick = *(int *)arg == 2;
    int smp = two_d ? 5 : 1;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    if (two_d)
        TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){2, 0, 3, 1}, NULL, &m));
    else
        TH_OK(dt_mesh_init(w, 1, (int[]){size}, NULL, NULL, &m));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    /* matmul 2-d x 2-d, uneven: [5, 7] @ [7, 3] */
    dt_tensor *f[3];
    f[0] = leaf(1, 2, (int64_t[]){5, 7}, 1);
    f[1] = leaf(2, 2, (int64_t[]){7, 3}, 1);
    if (all_pairs(ctx, m, f, r_matmul, d_matmul, 0, "matmul", true, smp))
        return 1;
    dt_tensor_free(f[0]);
    if (quick) {
        dt_tensor_free(f[1]);
        goto ce;
    }
    /* 3-d activation x[B, T, K] @ w[K, N] (the seed's MLP shape) */
    f[0] = leaf(3, 3, (int64_t[]){2, 3, 7}, 1);
    if (all_pairs(ctx, m, f, r_matmul, d_matmul, 0, "matmul3", !two_d, 2 * smp))
        return 1;
    dt_tensor_free(f[1]);
    /* batched: [2, 3, 7] @ [2, 7, 3] */
    f[1] = leaf(4, 3, (int64_t[]){2, 7, 3}, 1);
    if (!two_d && all_pairs(ctx, m, f, r_matmul, d_matmul, 0, "bmm", false, 1))
        return 1;
    dt_tensor_free(f[0]);
    dt_tensor_free(f[1]);
    /* elementwise with broadcasting: [5, 4] op [4] and [5, 1] */
    f[0] = leaf(5, 2, (int64_t[]){5, 4}, 0.25f);
    f[1] = leaf(6, 1, (int64_t[]){4}, 0.25f);
    if (all_pairs(ctx, m, f, r_add, d_add, 1e-6, "add", true, smp) ||
        all_pairs(ctx, m, f, r_mul, d_mul, 1e-6, "mul", !two_d, 2 * smp))
        return 1;
    dt_tensor_free(f[1]);
    f[1] = leaf(7, 2, (int64_t[]){5, 1}, 0.25f);
    for (int64_t e = 0; e < 5; e++)
        ((float *)f[1]->data)[e] += 5; /* no zero divisors */
    if (!two_d && all_pairs(ctx, m, f, r_div, d_div, 1e-5, "div", true, 1))
        return 1;
    dt_tensor_free(f[1]);
    /* unary and row-wise: every placement of x [5, 4] */
    dt_placement cand[4] = {dt_replicate(), dt_shard(0), dt_shard(1), dt_partial(DT_REDUCE_SUM)};
    for (int a = 0; a < (two_d ? 16 : 4); a++) {
        dt_placement pl[3][2] = {{cand[a % 4], cand[a / 4]},
                                 {dt_replicate(), dt_replicate()},
                                 {dt_replicate(), dt_replicate()}};
        if (two_d && cand[a % 4].kind == DT_PLACE_SHARD && cand[a / 4].kind == DT_PLACE_SHARD &&
            cand[a % 4].dim == cand[a / 4].dim)
            continue;
        if (compare(ctx, m, 1, f, pl, r_softmax, d_softmax, 1e-5, "softmax") ||
            compare(ctx, m, 1, f, pl, r_gelu, d_gelu, 1e-5, "gelu") ||
            compare(ctx, m, 1, f, pl, r_mean, d_mean, 1e-5, "mean"))
            return 1;
        f[1] = leaf(8, 1, (int64_t[]){4}, 0.5f);
        f[2] = leaf(9, 1, (int64_t[]){4}, 0.5f);
        if (compare(ctx, m, 3, f, pl, r_ln, d_ln, 1e-5, "layer_norm"))
            return 1;
        dt_tensor_free(f[1]);
        dt_tensor_free(f[2]);
        n_cases += 4;
        dt_ctx_reset(ctx);
    }
    dt_tensor_free(f[0]);
ce:;
    /* cross-entropy: logits [7, 5] with rows sharded (one label ignored) */
    dt_tensor *lg = leaf(10, 2, (int64_t[]){7, 5}, 0.3f);
    dt_tensor *lab = dt_tensor_new(DT_I64, 1, (int64_t[]){7});
    for (int i = 0; i < 7; i++)
        dt_tensor_set(lab, i, i == 2 ? -100 : (i * 3) % 5);
    dt_tensor *rl = dt_cross_entropy(ctx, lg, lab);
    TH_OK(dt_backward(ctx, rl));
    dt_tensor *rg = dt_tensor_new(DT_F32, 2, lg->shape);
    TH_OK(dt_tensor_copy(rg, lg->grad));
    float rv = dt_tensor_item(rl);
    for (int a = 0; a < (two_d ? 4 : 2); a++) {
        dt_placement pl[2] = {a & 1 ? dt_shard(0) : dt_replicate(),
                              a & 2 ? dt_shard(1) : dt_replicate()};
        dt_placement pk[2] = {a & 1 ? dt_replicate() : dt_shard(0), dt_replicate()};
        dt_ag_zero_grad(lg);
        dt_dtensor *dl, *dk;
        TH_OK(dt_shard_tensor(ctx, m, lg, pl, &dl));
        TH_OK(dt_shard_tensor(ctx, m, lab, pk, &dk));
        dt_dtensor *loss = dt_dtensor_cross_entropy(ctx, dl, dk);
        TH_CHECK(loss, "ce: %s", dt_last_error());
        bool was = dt_ag_set_enabled(ctx, false);
        dt_tensor *lf = dt_dtensor_full(ctx, loss);
        dt_ag_set_enabled(ctx, was);
        TH_CHECK(lf && fabs(dt_tensor_item(lf) - rv) < 1e-5, "ce loss %g vs %g",
                 lf ? dt_tensor_item(lf) : -1, rv);
        TH_OK(dt_backward(ctx, loss->local));
        if (close_all(lg->grad, rg, 1e-5, "ce grad"))
            return 1;
        n_cases++;
        dt_ctx_reset(ctx);
    }
    dt_tensor_free(rg);
    dt_tensor_free(lg);
    dt_tensor_free(lab);
    if (rank == 0)
        printf("%s mesh of %d: %d op cases checked\n", two_d ? "2x2" : "1-d", size, n_cases);
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(ops_1d_3)
{
    int two_d = 0;
    ASSERT_EQ_INT(th_run(3, 90.0, body_ops, &two_d, NULL), 0);
}

TEST(ops_1d_4)
{
    int two_d = 2;
    ASSERT_EQ_INT(th_run(4, 90.0, body_ops, &two_d, NULL), 0);
}

TEST(ops_2d_4)
{
    int two_d = 1;
    ASSERT_EQ_INT(th_run(4, 120.0, body_ops, &two_d, NULL), 0);
}

/* Errors name the op and the placements; inputs on different meshes. */
static int body_errors(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m, *m2;
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, NULL, NULL, &m));
    TH_OK(dt_mesh_init(w, 1, (int[]){2}, (int[]){1, 0}, NULL, &m2));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *a = leaf(1, 2, (int64_t[]){4, 4}, 1);
    dt_dtensor *x, *y;
    TH_OK(dt_shard_tensor(ctx, m, a, (dt_placement[]){dt_shard(0)}, &x));
    TH_OK(dt_shard_tensor(ctx, m2, a, (dt_placement[]){dt_shard(0)}, &y));
    TH_CHECK(!dt_dtensor_matmul(ctx, x, y) && strstr(dt_last_error(), "dt_dtensor_matmul") &&
                 strstr(dt_last_error(), "different meshes"),
             "meshes: %s", dt_last_error());
    /* a Partial(max) input is differentiable: R -> P(max) keeps a copy on
     * both coordinates, relu reduces it first (the copies tie: g/2 each),
     * and the copies' gradients add up to relu's derivative */
    TH_OK(dt_shard_tensor(ctx, m, a, (dt_placement[]){dt_partial(DT_REDUCE_MAX)}, &y));
    dt_dtensor *r = dt_dtensor_relu(ctx, y);
    TH_CHECK(r && r->placements[0].kind != DT_PLACE_PARTIAL, "relu of max: %s", dt_last_error());
    dt_dtensor *ls = dt_dtensor_sum(ctx, r);
    TH_CHECK(ls, "sum: %s", dt_last_error());
    TH_OK(dt_backward(ctx, ls->local));
    TH_CHECK(a->grad, "max: no gradient");
    for (int64_t e = 0; e < dt_tensor_numel(a); e++) {
        float v = ((float *)a->data)[e], gv = ((float *)a->grad->data)[e];
        TH_CHECK(gv == (v > 0 ? 1.0f : 0.0f), "max: d relu(x)/dx at %g is %g", v, gv);
    }
    /* without gradients too */
    dt_tensor_set_requires_grad(a, false);
    TH_OK(dt_shard_tensor(ctx, m, a, (dt_placement[]){dt_partial(DT_REDUCE_MAX)}, &y));
    r = dt_dtensor_relu(ctx, y);
    TH_CHECK(r && r->placements[0].kind != DT_PLACE_PARTIAL, "relu of max: %s", dt_last_error());
    dt_tensor_free(a);
    dt_ctx_free(ctx);
    dt_mesh_free(m2);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(op_errors_2)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_errors, NULL, NULL), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) { /* one test by name, for timing */
        if (!strcmp(argv[1], "errors"))
            RUN(op_errors_2);
        if (!strcmp(argv[1], "3"))
            RUN(ops_1d_3);
        if (!strcmp(argv[1], "4"))
            RUN(ops_1d_4);
        if (!strcmp(argv[1], "2d"))
            RUN(ops_2d_4);
        return TEST_REPORT();
    }
    RUN(op_errors_2);
    RUN(ops_1d_3);
    RUN(ops_1d_4);
    RUN(ops_2d_4);
    return TEST_REPORT();
}
