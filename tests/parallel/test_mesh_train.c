/* shard_dataloader and shard_optimizer (mesh.h) in real processes:
 * each data-parallel coordinate of a 2x2 mesh reads its DistributedSampler
 * share (the ranks of one coordinate the same items, the coordinates
 * disjoint items), the batch arrives as a [Shard(0), Replicate] dtensor of
 * the global batch; bad arguments are errors. The optimizer's state has
 * the layout of each parameter's local piece; with ZeRO-1 along the data
 * dim each coordinate keeps state for its chunk only, and after three AdamW
 * steps the parameters are bit-identical to the run without ZeRO. LAMB
 * (whole-parameter norms reduced over the pieces) equals a single-process
 * LAMB, with and without ZeRO-1. */
// dt-test-timeout: 120
#include "parallel/mesh_util.h"
#include "test.h"

#include <math.h>
#include <string.h>

static int body_loader(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){3, 2, 1, 0}, (const char *[]){"dp", "mp"}, &m));
    dt_random_dataset_params dp = dt_random_dataset_params_default();
    dp.length = 20;
    dp.x_ndim = 1;
    dp.x_shape[0] = 3;
    dt_dataset *ds;
    TH_OK(dt_dataset_random_init(&dp, &ds));
    dt_shard_loader *l;
    TH_CHECK(dt_shard_dataloader_init(ds, &m, 1, "dp", 3, false, 0, &l) == DT_ERR_INVALID_ARG,
             "batch 3 over 2");
    TH_CHECK(dt_shard_dataloader_init(ds, &m, 1, "zz", 4, false, 0, &l) == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "zz"),
             "bad dim name");
    TH_OK(dt_shard_dataloader_init(ds, &m, 1, "dp", 4, true, 5, &l));
    TH_CHECK(dt_shard_dataloader_num_batches(l) == 5, "batches %lld",
             (long long)dt_shard_dataloader_num_batches(l));
    TH_OK(dt_shard_dataloader_start_epoch(l, 0));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    int nb = 0;
    float item[3];
    int64_t yi;
    for (;;) {
        dt_dtensor *x, *y;
        TH_OK(dt_shard_dataloader_next(l, ctx, &x, &y));
        if (!x)
            break;
        TH_CHECK(x->shape[0] == 4 && x->local->shape[0] == 2 && x->placements[0].kind == DT_PLACE_SHARD &&
                     x->placements[1].kind == DT_PLACE_REPLICATE && y->shape[0] == 4,
                 "batch layout");
        /* the full batch: rows 0-1 from coordinate 0, 2-3 from coordinate 1 */
        dt_tensor *f = dt_dtensor_full(ctx, x);
        TH_CHECK(f, "full: %s", dt_last_error());
        /* every row is a dataset item, and the 4 rows are 4 different items */
        int64_t found[4];
        for (int r = 0; r < 4; r++) {
            found[r] = -1;
            for (int64_t i = 0; i < 20 && found[r] < 0; i++) {
                TH_OK(dt_dataset_get_item(ds, i, item, &yi));
                bool eq = true;
                for (int c = 0; c < 3; c++)
                    eq &= dt_tensor_get(f, r * 3 + c) == item[c];
                if (eq)
                    found[r] = i;
            }
            TH_CHECK(found[r] >= 0, "row %d is no item", r);
            for (int q = 0; q < r; q++)
                TH_CHECK(found[q] != found[r], "rows %d and %d are item %lld", q, r, (long long)found[r]);
        }
        nb++;
        dt_ctx_reset(ctx);
    }
    TH_CHECK(nb == 5, "%d batches", nb);
    dt_ctx_free(ctx);
    dt_shard_dataloader_free(l);
    dt_dataset_free(ds);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(loader_2x2)
{
    ASSERT_EQ_INT(th_run(4, 60.0, body_loader, NULL, NULL), 0);
}

/* Three AdamW steps on w [5, 6] Replicate and v [7] Shard(0) over a 2x2
 * mesh, the gradient a fixed function of rank-independent values: with and
 * without ZeRO-1 along dim 0 the parameters end bit-identical. */
static int body_optim(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, NULL, NULL, &m));
    dt_tensor *fw = dt_tensor_new(DT_F32, 2, (int64_t[]){5, 6}), *fv = dt_tensor_new(DT_F32, 1, (int64_t[]){7});
    int64_t z[2] = {0, 0};
    mu_fill_box(fw, 1, 2, fw->shape, z, fw->shape);
    mu_fill_box(fv, 2, 1, fv->shape, z, fv->shape);
    float out[2][37];
    memset(out, 0, sizeof out);
    for (int zero = 0; zero < 2; zero++) {
        dt_dtensor *pw, *pv;
        TH_OK(dt_shard_tensor(NULL, m, fw, (dt_placement[]){dt_replicate(), dt_replicate()}, &pw));
        TH_OK(dt_shard_tensor(NULL, m, fv, (dt_placement[]){dt_replicate(), dt_shard(0)}, &pv));
        TH_OK(dt_tensor_set_requires_grad(pw->local, true));
        TH_OK(dt_tensor_set_requires_grad(pv->local, true));
        dt_adam_params ap = dt_adamw_params_default();
        ap.lr = 0.1;
        dt_shard_optim *o;
        TH_OK(dt_shard_optimizer(DT_OPTIM_ADAMW, &ap, (dt_dtensor *[]){pw, pv}, 2, zero ? 0 : -1, &o));
        /* the state is placed like the parameter: one range per piece (or chunk) */
        const char *nm;
        float *st;
        size_t n;
        TH_OK(dt_optim_state(dt_shard_optimizer_inner(o), 0, 0, &nm, &st, &n));
        int64_t cs, cl;
        dt_chunk_range(30, 2, dt_mesh_coord(m, 0), &cs, &cl);
        TH_CHECK(n == (zero ? (size_t)cl : 30), "state of w has %zu elements", n);
        TH_OK(dt_optim_state(dt_shard_optimizer_inner(o), 1, 0, &nm, &st, &n));
        /* v is Replicate on the ZeRO dim too: its local piece is chunked */
        dt_chunk_range(dt_tensor_numel(pv->local), 2, dt_mesh_coord(m, 0), &cs, &cl);
        TH_CHECK(n == (zero ? (size_t)cl : (size_t)dt_tensor_numel(pv->local)),
                 "state of v has %zu elements", n);
        for (int s = 0; s < 3; s++) {
            float *gw = pw->local->grad->data, *gv = pv->local->grad->data;
            for (int i = 0; i < 30; i++)
                gw[i] = (float)((i * 5 + s * 3) % 7) - 3;
            for (int64_t i = 0; i < dt_tensor_numel(pv->local); i++)
                gv[i] = (float)((i + s) % 3) - 1;
            TH_OK(dt_shard_optimizer_step(o));
            TH_OK(dt_shard_optimizer_zero_grad(o));
            TH_CHECK(gw[0] == 0, "zero_grad");
        }
        memcpy(out[zero], pw->local->data, 30 * sizeof(float));
        memcpy(out[zero] + 30, pv->local->data, (size_t)dt_tensor_numel(pv->local) * sizeof(float));
        /* the parameter moved */
        TH_CHECK(out[zero][0] != dt_tensor_get(fw, 0), "w did not change");
        dt_shard_optimizer_free(o);
        TH_CHECK(pw->local->grad == NULL, "free detaches the gradient it attached");
        dt_dtensor_free(pw);
        dt_dtensor_free(pv);
    }
    TH_CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "ZeRO-1 differs from plain AdamW");
    dt_tensor_free(fw);
    dt_tensor_free(fv);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(optimizer_zero1_2x2)
{
    ASSERT_EQ_INT(th_run(4, 60.0, body_optim, NULL, NULL), 0);
}

/* LAMB over dtensors equals a single-process LAMB on the whole tensors:
 * on a 2x2 mesh, w [5, 6] [Replicate, Shard(1)], v [7] [Shard(0),
 * Replicate] (uneven: 4 + 3), b [3] Replicate
 * (uneven over 2 with ZeRO-1: 2 + 1) and e [1] Shard(0) (one coordinate
 * holds nothing), four steps with clipping active (the global grad norm is
 * above max_grad_norm), with and without ZeRO-1 along dim 0. The trust
 * ratio of each parameter uses its WHOLE norms and the clipping the whole
 * global norm, so a wrong reduction (replicas counted twice, shards not
 * summed) moves the result far beyond the bound. Bound: 1e-6 relative to
 * the parameter scale (the norms are summed in another order; the update is
 * lr * trust ratio * direction with lr 0.05). Refusals: a Partial parameter
 * and parameters on two meshes, by name. */
static void lamb_grad(dt_tensor *g, int which, int step)
{
    float *d = g->data;
    for (int64_t i = 0; i < dt_tensor_numel(g); i++)
        d[i] = (float)(((i * 7 + which * 5 + step * 3) % 11) - 5) * (0.5f + 0.25f * (float)which);
}

static int body_lamb(int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    dt_pg *w;
    TH_OK(th_pg(rank, size, NULL, &w));
    dt_mesh *m;
    TH_OK(dt_mesh_init(w, 2, (int[]){2, 2}, NULL, NULL, &m));
    enum { NP = 4, STEPS = 4 };
    int64_t shp[NP][2] = {{5, 6}, {7, 0}, {3, 0}, {1, 0}};
    int nd[NP] = {2, 1, 1, 1};
    dt_placement pl[NP][2] = {{dt_replicate(), dt_shard(1)},
                              {dt_shard(0), dt_replicate()},
                              {dt_replicate(), dt_replicate()},
                              {dt_shard(0), dt_replicate()}};
    dt_tensor *full[NP], *ref[NP], *rg[NP];
    dt_flat fp[NP], fg[NP];
    dt_optim_range rr[NP];
    for (int i = 0; i < NP; i++) {
        full[i] = dt_tensor_new(DT_F32, nd[i], shp[i]);
        ref[i] = dt_tensor_new(DT_F32, nd[i], shp[i]);
        rg[i] = dt_tensor_new(DT_F32, nd[i], shp[i]);
        int64_t z[2] = {0, 0};
        mu_fill_box(full[i], 10 + i, nd[i], full[i]->shape, z, full[i]->shape);
        memcpy(ref[i]->data, full[i]->data, (size_t)dt_tensor_numel(full[i]) * sizeof(float));
        size_t ne = (size_t)dt_tensor_numel(full[i]);
        TH_OK(dt_flat_wrap(&fp[i], DT_F32, ref[i]->data, ne));
        TH_OK(dt_flat_wrap(&fg[i], DT_F32, rg[i]->data, ne));
        rr[i] = (dt_optim_range){.params = &fp[i], .grads = &fg[i], .lo = 0, .hi = ne};
    }
    dt_lamb_params lp = dt_lamb_params_default();
    lp.lr = 0.05;
    lp.max_grad_norm = 1.0;
    dt_optim *single;
    TH_OK(dt_optim_lamb_init(&lp, rr, NP, &single));
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < NP; i++)
            lamb_grad(rg[i], i, s);
        TH_OK(dt_optim_step(single));
    }
    TH_CHECK(dt_optim_last_grad_norm(single) > 2 * lp.max_grad_norm, "clipping is not exercised");
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    for (int zero = 0; zero < 2; zero++) {
        dt_dtensor *p[NP];
        for (int i = 0; i < NP; i++) {
            TH_OK(dt_shard_tensor(NULL, m, full[i], pl[i], &p[i]));
            TH_OK(dt_tensor_set_requires_grad(p[i]->local, true));
        }
        dt_shard_optim *o;
        TH_OK(dt_shard_optimizer(DT_OPTIM_LAMB, &lp, p, NP, zero ? 0 : -1, &o));
        for (int s = 0; s < STEPS; s++) {
            for (int i = 0; i < NP; i++) {
                dt_tensor *g = dt_tensor_new(DT_F32, nd[i], shp[i]);
                lamb_grad(g, i, s);
                dt_dtensor *gd;
                TH_OK(dt_shard_tensor(ctx, m, g, pl[i], &gd));
                if (dt_tensor_numel(gd->local))
                    memcpy(p[i]->local->grad->data, gd->local->data,
                           (size_t)dt_tensor_numel(gd->local) * sizeof(float));
                dt_tensor_free(g);
            }
            TH_OK(dt_shard_optimizer_step(o));
            TH_OK(dt_shard_optimizer_zero_grad(o));
            dt_ctx_reset(ctx);
        }
        dt_optim *in = dt_shard_optimizer_inner(o);
        if (in)
            TH_CHECK(fabs(dt_optim_last_grad_norm(in) - dt_optim_last_grad_norm(single)) <
                         1e-5 * dt_optim_last_grad_norm(single),
                     "zero %d: global grad norm %g, single process %g", zero,
                     dt_optim_last_grad_norm(in), dt_optim_last_grad_norm(single));
        for (int i = 0; i < NP; i++) {
            dt_dtensor *r = dt_reshard(ctx, p[i], NULL, (dt_placement[]){dt_replicate(), dt_replicate()});
            TH_CHECK(r != NULL, "gather: %s", dt_last_error());
            const float *a = r->local->data, *b = ref[i]->data, *f0 = full[i]->data;
            double moved = 0;
            for (int64_t k = 0; k < dt_tensor_numel(ref[i]); k++) {
                TH_CHECK(fabsf(a[k] - b[k]) <= 1e-6f * (1 + fabsf(b[k])),
                         "zero %d, parameter %d [%lld]: %.9g, single-process LAMB %.9g", zero, i,
                         (long long)k, a[k], b[k]);
                moved += fabs(b[k] - f0[k]);
            }
            TH_CHECK(moved > 1e-3, "parameter %d did not move", i);
            dt_ctx_reset(ctx);
        }
        dt_shard_optimizer_free(o);
        for (int i = 0; i < NP; i++)
            dt_dtensor_free(p[i]);
    }
    /* refusals, by name */
    dt_dtensor *pp;
    dt_shard_optim *o;
    TH_OK(dt_shard_tensor(NULL, m, full[0], (dt_placement[]){dt_partial(DT_REDUCE_SUM), dt_replicate()}, &pp));
    pp->name = "wp";
    TH_CHECK(dt_shard_optimizer(DT_OPTIM_LAMB, &lp, &pp, 1, -1, &o) == DT_ERR_UNSUPPORTED &&
                 strstr(dt_last_error(), "LAMB") && strstr(dt_last_error(), "wp") &&
                 strstr(dt_last_error(), "Partial"),
             "a Partial parameter: %s", dt_last_error());
    dt_dtensor_free(pp);
    dt_mesh *m1;
    TH_OK(dt_mesh_init(w, 1, (int[]){4}, NULL, NULL, &m1));
    dt_dtensor *two[2];
    TH_OK(dt_shard_tensor(NULL, m, full[0], pl[0], &two[0]));
    TH_OK(dt_shard_tensor(NULL, m1, full[1], (dt_placement[]){dt_shard(0)}, &two[1]));
    TH_CHECK(dt_shard_optimizer(DT_OPTIM_LAMB, &lp, two, 2, -1, &o) == DT_ERR_UNSUPPORTED &&
                 strstr(dt_last_error(), "mesh"),
             "two meshes: %s", dt_last_error());
    dt_dtensor_free(two[0]);
    dt_dtensor_free(two[1]);
    dt_mesh_free(m1);
    dt_optim_free(single);
    for (int i = 0; i < NP; i++) {
        dt_tensor_free(full[i]);
        dt_tensor_free(ref[i]);
        dt_tensor_free(rg[i]);
    }
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}

TEST(lamb_2x2)
{
    ASSERT_EQ_INT(th_run(4, 60.0, body_lamb, NULL, NULL), 0);
}

int main(void)
{
    RUN(loader_2x2);
    RUN(optimizer_zero1_2x2);
    RUN(lamb_2x2);
    return TEST_REPORT();
}
