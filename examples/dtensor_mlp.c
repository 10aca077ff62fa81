/* dtensor_mlp — the MLP programs of the Paddle auto-parallel notes (seed
 * 001) in C: z = x[B, S, H] @ w0[H, F] @ w1[F, H], loss = mean(z), AdamW
 * (lr 1e-3), shard_optimizer, shard_dataloader. Defaults are the seed's
 * sizes (B 4, S 128, H 1024, F 4096, 100 random items).
 *
 *     dtrain run -n 4 -- build/examples/example_dtensor_mlp --mode dp
 *     dtrain run -n 4 -- build/examples/example_dtensor_mlp --mode tp
 *     dtrain run -n 4 -- build/examples/example_dtensor_mlp --mode dp_tp
 *     dtrain run -n 8 -- build/examples/example_dtensor_mlp --mode pp
 *
 * Modes (every mesh is 2-d, dims "x" (data) and "y" (model); the seed's 1-d
 * meshes are the W x 1 and 1 x W cases):
 *   dp     mesh W x 1: x Shard(0), w0 and w1 Replicate (seed 4.1; the
 *          gradients are all-reduced by the matmul's backward);
 *   tp     mesh 1 x W: w0 Shard(1) (column), w1 Shard(0) (row), so z is
 *          Partial(sum) (seed 4.2);
 *   dp_tp  mesh 2 x W/2: x [Shard(0), Replicate], w0 [Replicate, Shard(1)],
 *          w1 [Replicate, Shard(0)];
 *   pp     8 ranks, mesh0 [[0,1],[2,3]] and mesh1 [[4,5],[6,7]] (seed 4.4):
 *          w0 on mesh0 [Replicate, Shard(1)], w1 on mesh1 [Replicate,
 *          Shard(0)], y = x @ w0 resharded to mesh1 [Shard(0), Shard(2)]
 *          (point to point between the meshes), z = y @ w1.
 * --zero adds ZeRO-1 along "x" (optimizer state of Replicate parameters
 * split over the data-parallel coordinates).
 *
 * Every rank also runs the same steps in one process on the full tensors
 * (the global batch read from the dataset with the same sampler) and, after
 * --steps steps, compares its full parameters with that run: the largest
 * difference must be <= --tol (default 1e-5; the parameters are about
 * 1/sqrt(H) and the updates lr = 1e-3, so a wrong gradient or a missing
 * reduction is far above it; the distributed run differs only by the order
 * of float additions). --no-check skips the reference. Exit code 0 = equal. */
#include <dtrain/dtrain.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *mode;
    int64_t B, S, H, F, items;
    int steps;
    double lr, tol;
    bool zero, check;
} args;

static int parse(int argc, char **argv, args *a)
{
    *a = (args){"dp", 4, 128, 1024, 4096, 100, 3, 1e-3, 1e-5, false, true};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t *t = !strcmp(k, "--batch") ? &a->B : !strcmp(k, "--seq") ? &a->S
                   : !strcmp(k, "--hidden") ? &a->H : !strcmp(k, "--ffn") ? &a->F
                   : !strcmp(k, "--items") ? &a->items : NULL;
        if (t && v) {
            if (dt_parse_int(k, v, 1, 1 << 20, t) < 0)
                return -1;
            i++;
        } else if (!strcmp(k, "--steps") && v) {
            int64_t s;
            if (dt_parse_int(k, v, 1, 100000, &s) < 0)
                return -1;
            a->steps = (int)s;
            i++;
        } else if (!strcmp(k, "--lr") && v) {
            if (dt_parse_double(k, v, 0, 10, &a->lr) < 0)
                return -1;
            i++;
        } else if (!strcmp(k, "--tol") && v) {
            if (dt_parse_double(k, v, 0, 1, &a->tol) < 0)
                return -1;
            i++;
        } else if (!strcmp(k, "--mode") && v) {
            a->mode = v;
            i++;
        } else if (!strcmp(k, "--zero")) {
            a->zero = true;
        } else if (!strcmp(k, "--no-check")) {
            a->check = false;
        } else {
            dt_error(DT_ERR_INVALID_ARG, "unknown or incomplete option '%s' (see the comment at "
                     "the top of examples/dtensor_mlp.c)", k);
            return -1;
        }
    }
    return 0;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((expr) < 0) {                                                                          \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #expr, dt_last_error());                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
#define TRYP(p)                                                                                    \
    do {                                                                                           \
        if (!(p)) {                                                                                \
            fprintf(stderr, "rank %d: %s: %s\n", rank, #p, dt_last_error());                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* Largest |a - b| (a may be empty outside its mesh: 0). */
static double maxdiff(const dt_tensor *a, const dt_tensor *b)
{
    double m = 0;
    int64_t n = dt_tensor_numel(a);
    if (n != dt_tensor_numel(b))
        return n == 0 ? 0 : INFINITY;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(dt_tensor_get(a, i) - dt_tensor_get(b, i));
        m = d > m ? d : m;
    }
    return m;
}

int main(int argc, char **argv)
{
    args a;
    int rank = 0;
    if (parse(argc, argv, &a) < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 2;
    }
    dt_pg *w;
    TRY(dt_pg_init(NULL, &w));
    rank = dt_pg_rank(w);
    int W = dt_pg_size(w);
    /* meshes and placements */
    dt_mesh *m0 = NULL, *m1 = NULL;
    const char *names[2] = {"x", "y"};
    dt_placement R = dt_replicate();
    dt_placement pw0[2] = {R, R}, pw1[2] = {R, R}, py1[2] = {dt_shard(0), dt_shard(2)};
    bool pp = !strcmp(a.mode, "pp");
    if (!strcmp(a.mode, "dp")) {
        TRY(dt_mesh_init(w, 2, (int[]){W, 1}, NULL, names, &m0));
    } else if (!strcmp(a.mode, "tp")) {
        TRY(dt_mesh_init(w, 2, (int[]){1, W}, NULL, names, &m0));
        pw0[1] = dt_shard(1);
        pw1[1] = dt_shard(0);
    } else if (!strcmp(a.mode, "dp_tp") && W % 2 == 0) {
        TRY(dt_mesh_init(w, 2, (int[]){2, W / 2}, NULL, names, &m0));
        pw0[1] = dt_shard(1);
        pw1[1] = dt_shard(0);
    } else if (pp && W == 8) {
        TRY(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){0, 1, 2, 3}, names, &m0));
        TRY(dt_mesh_init(w, 2, (int[]){2, 2}, (int[]){4, 5, 6, 7}, names, &m1));
        pw0[1] = dt_shard(1);
        pw1[1] = dt_shard(0);
    } else {
        fprintf(stderr, "mode '%s' with %d ranks: want dp, tp, dp_tp (even ranks) or pp (8 ranks)\n",
                a.mode, W);
        return 2;
    }
    dt_mesh *mw1 = pp ? m1 : m0;
    /* full initial weights, the same on every rank */
    const int64_t H = a.H, F = a.F, B = a.B, S = a.S;
    dt_tensor *w0f = dt_tensor_new(DT_F32, 2, (int64_t[]){H, F});
    dt_tensor *w1f = dt_tensor_new(DT_F32, 2, (int64_t[]){F, H});
    TRYP(w0f && w1f);
    w0f->name = "w0";
    w1f->name = "w1";
    TRY(dt_tensor_rand_uniform(w0f, dt_rng_key_make(7, DT_RNG_INIT, 0, 0), -1 / sqrtf((float)H),
                               1 / sqrtf((float)H)));
    TRY(dt_tensor_rand_uniform(w1f, dt_rng_key_make(7, DT_RNG_INIT, 1, 0), -1 / sqrtf((float)F),
                               1 / sqrtf((float)F)));
    dt_dtensor *w0, *w1;
    TRY(dt_shard_tensor(NULL, m0, w0f, pw0, &w0));
    TRY(dt_shard_tensor(NULL, mw1, w1f, pw1, &w1));
    TRY(dt_tensor_set_requires_grad(w0->local, true));
    TRY(dt_tensor_set_requires_grad(w1->local, true));
    dt_adam_params ap = dt_adamw_params_default();
    ap.lr = a.lr;
    dt_shard_optim *opt;
    TRY(dt_shard_optimizer(DT_OPTIM_ADAMW, &ap, (dt_dtensor *[]){w0, w1}, 2, a.zero ? 0 : -1, &opt));
    /* the reference: full copies, their gradients, one AdamW over both */
    dt_tensor *r0 = dt_tensor_new(DT_F32, 2, w0f->shape), *r1 = dt_tensor_new(DT_F32, 2, w1f->shape);
    dt_tensor *g0 = dt_tensor_new(DT_F32, 2, w0f->shape), *g1 = dt_tensor_new(DT_F32, 2, w1f->shape);
    TRYP(r0 && r1 && g0 && g1);
    TRY(dt_tensor_copy(r0, w0f));
    TRY(dt_tensor_copy(r1, w1f));
    TRY(dt_tensor_set_grad(r0, g0));
    TRY(dt_tensor_set_grad(r1, g1));
    dt_flat fp[2], fg[2];
    dt_optim *ropt = NULL;
    if (a.check) {
        TRY(dt_flat_wrap(&fp[0], DT_F32, r0->data, (size_t)(H * F)));
        TRY(dt_flat_wrap(&fg[0], DT_F32, g0->data, (size_t)(H * F)));
        TRY(dt_flat_wrap(&fp[1], DT_F32, r1->data, (size_t)(H * F)));
        TRY(dt_flat_wrap(&fg[1], DT_F32, g1->data, (size_t)(H * F)));
        dt_optim_range rr[2] = {{.params = &fp[0], .grads = &fg[0], .lo = 0, .hi = (size_t)(H * F)},
                                {.params = &fp[1], .grads = &fg[1], .lo = 0, .hi = (size_t)(H * F)}};
        TRY(dt_optim_adamw_init(&ap, rr, 2, &ropt));
    }
    /* data: random items [S, H] (the seed's RandomDataset), sharded along "x" */
    dt_random_dataset_params dp = dt_random_dataset_params_default();
    dp.length = a.items;
    dp.x_ndim = 2;
    dp.x_shape[0] = S;
    dp.x_shape[1] = H;
    dp.seed = 11;
    dt_dataset *ds;
    TRY(dt_dataset_random_init(&dp, &ds));
    dt_mesh *meshes[2] = {m0, pp ? m1 : m0};
    dt_shard_loader *dl;
    TRY(dt_shard_dataloader_init(ds, meshes, pp ? 2 : 1, "x", B, false, 0, &dl));
    TRY(dt_shard_dataloader_start_epoch(dl, 0));
    /* the reference reads the global batch through the same samplers */
    int k = dt_mesh_size(m0, 0);
    int64_t lb = B / k;
    dt_sampler **smp = calloc((size_t)k, sizeof *smp);
    int64_t **idx = calloc((size_t)k, sizeof *idx);
    TRYP(smp && idx);
    for (int c = 0; c < k && a.check; c++) {
        dt_distributed_sampler_params sp = dt_distributed_sampler_params_default();
        sp.length = a.items;
        sp.world_size = k;
        sp.rank = c;
        sp.shuffle = false;
        sp.drop_last = true;
        TRY(dt_sampler_distributed_init(&sp, &smp[c]));
        idx[c] = calloc((size_t)dt_sampler_length(smp[c]) + 1, sizeof(int64_t));
        TRYP(idx[c]);
        TRY(dt_sampler_indices(smp[c], 0, idx[c]));
    }
    float *xb = calloc((size_t)(B * S * H), sizeof(float));
    int64_t *yb = calloc((size_t)B + 1, sizeof(int64_t));
    TRYP(xb && yb);
    dt_ctx *ctx;
    TRY(dt_ctx_init(NULL, &ctx));
    double t0 = dt_time_s();
    int step = 0;
    for (; step < a.steps; step++) {
        dt_dtensor *x;
        TRY(dt_shard_dataloader_next(dl, ctx, &x, NULL));
        if (!x && dt_mesh_contains_self(m0))
            break; /* end of the epoch */
        if (!x) {  /* a rank outside the input mesh: the batch's empty piece */
            dt_placement px[2] = {dt_shard(0), R};
            dt_tensor *e = dt_tensor_zeros(ctx, DT_F32, 3, (int64_t[]){0, 0, 0});
            TRYP(e);
            TRY(dt_dtensor_from_local(ctx, m0, e, px, (int64_t[]){B, S, H}, &x));
        }
        dt_dtensor *y = dt_dtensor_matmul(ctx, x, w0);
        if (pp)
            y = dt_reshard(ctx, y, m1, py1);
        dt_dtensor *z = dt_dtensor_matmul(ctx, y, w1);
        dt_dtensor *loss = dt_dtensor_mean(ctx, z);
        TRYP(loss);
        TRY(dt_backward(ctx, loss->local));
        TRY(dt_shard_optimizer_step(opt));
        TRY(dt_shard_optimizer_zero_grad(opt));
        bool was = dt_ag_set_enabled(ctx, false);
        dt_tensor *lf = dt_dtensor_full(ctx, loss);
        dt_ag_set_enabled(ctx, was);
        TRYP(lf);
        float lv = dt_tensor_item(lf);
        if (a.check) {
            for (int c = 0; c < k; c++)
                TRY(dt_dataset_get_batch(ds, idx[c] + step * lb, lb, xb + (size_t)(c * lb * S * H),
                                         yb + c * lb));
            dt_tensor *xr = dt_tensor_view_of(ctx, xb, DT_F32, 3, (int64_t[]){B, S, H});
            dt_tensor *lr = dt_mean(ctx, dt_matmul(ctx, dt_matmul(ctx, xr, r0), r1));
            TRYP(lr);
            TRY(dt_backward(ctx, lr));
            TRY(dt_optim_step(ropt));
            TRY(dt_tensor_zero(g0));
            TRY(dt_tensor_zero(g1));
            if (dt_mesh_contains_self(mw1))
                printf("rank %d step %d: loss %.7g (single process %.7g)\n", rank, step, lv,
                       dt_tensor_item(lr));
        } else if (rank == dt_mesh_ranks(mw1)[0]) {
            printf("step %d: loss %.7g\n", step, lv);
        }
        dt_ctx_reset(ctx);
    }
    double dt = dt_time_s() - t0;
    int rc = 0;
    if (a.check) {
        dt_tensor *f0 = dt_dtensor_full(ctx, w0), *f1 = dt_dtensor_full(ctx, w1);
        TRYP(f0 && f1);
        double d[2] = {maxdiff(f0, r0), maxdiff(f1, r1)};
        double all[2] = {d[0], d[1]};
        TRY(dt_pg_allreduce(w, DT_IN_PLACE, all, 2, DT_F64, DT_REDUCE_MAX));
        if (rank == 0)
            printf("mode %s%s, %d ranks, %d steps: max |w - w_single| = %.3g (w0), %.3g (w1); "
                   "bound %.3g: %s (%.2f s)\n",
                   a.mode, a.zero ? " + ZeRO-1" : "", W, step, all[0], all[1], a.tol,
                   all[0] <= a.tol && all[1] <= a.tol && step == a.steps ? "ok" : "WRONG", dt);
        rc = all[0] <= a.tol && all[1] <= a.tol && step == a.steps ? 0 : 1;
    }
    dt_ctx_free(ctx);
    for (int c = 0; c < k; c++) {
        dt_sampler_free(smp[c]);
        free(idx[c]);
    }
    free(smp);
    free(idx);
    free(xb);
    free(yb);
    dt_shard_dataloader_free(dl);
    dt_dataset_free(ds);
    dt_optim_free(ropt);
    dt_shard_optimizer_free(opt);
    dt_tensor_free(r0);
    dt_tensor_free(r1);
    dt_tensor_free(g0);
    dt_tensor_free(g1);
    dt_dtensor_free(w0);
    dt_dtensor_free(w1);
    dt_tensor_free(w0f);
    dt_tensor_free(w1f);
    dt_mesh_free(m1);
    dt_mesh_free(m0);
    dt_pg_free(w);
    return rc;
}
