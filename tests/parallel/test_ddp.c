/* DDP with real processes (shm backend): bucket assignment, equivalence with
 * single-process training at world sizes 2, 3, 4 (MLP; ConvNet with
 * SyncBatchNorm), no_sync accumulation, the cross-rank model check, unused
 * parameters (the error and find_unused_parameters), in-order posting and
 * overlap during backward, metrics and evaluation sharding. */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "ddp_util.h"
#include "test.h"
#include "model_util.h"

/* ---- bucket assignment (one rank, self backend) ---- */

static dt_model *three_linears(uint64_t seed)
{
    dt_module *net = dt_nn_seq(0, NULL);
    for (int i = 0; i < 3; i++)
        dt_nn_add(net, NULL, dt_nn_linear(10, 10, true)); /* weight 400 B, bias 40 B */
    return t_build(net, seed);
}

TEST(bucket_assignment)
{
    dt_pg *pg;
    dt_pg_params pp = dt_pg_params_default();
    pp.rank = 0, pp.world_size = 1, pp.backend = "self";
    ASSERT_OK(dt_pg_init(&pp, &pg));
    dt_model *m = three_linears(1);
    ASSERT(m);
    /* model order bytes 400,40,400,40,400,40; first limit 500 closes after
     * the third tensor (840 B); the cap 800 is never reached by the rest */
    dt_ddp_params p = dt_ddp_params_default();
    p.first_bucket_mb = 500.0 / 1048576.0;
    p.bucket_cap_mb = 800.0 / 1048576.0;
    dt_ddp *d;
    ASSERT_OK(dt_ddp_init(pg, m, &p, &d));
    ASSERT_EQ_INT(dt_ddp_num_buckets(d), 2);
    dt_ddp_bucket_info b0, b1;
    ASSERT_OK(dt_ddp_bucket(d, 0, &b0));
    ASSERT_OK(dt_ddp_bucket(d, 1, &b1));
    /* reversed: bucket 0 holds the last parameters */
    dt_param_info e3, e5, e0, e2;
    ASSERT_OK(dt_model_entry(m, 3, &e3));
    ASSERT_OK(dt_model_entry(m, 5, &e5));
    ASSERT_OK(dt_model_entry(m, 0, &e0));
    ASSERT_OK(dt_model_entry(m, 2, &e2));
    ASSERT_STR_EQ(e3.name, "1.bias");
    ASSERT_EQ_INT(b0.nparams, 3);
    ASSERT_EQ_INT(b0.first_entry, 3);
    ASSERT_EQ_INT(b0.last_entry, 5);
    ASSERT_EQ_INT(b0.bytes, 480);
    ASSERT_EQ_INT(b0.offset, e3.offset);
    ASSERT_EQ_INT(b0.offset + b0.numel, e5.offset + e5.numel);
    ASSERT_EQ_INT(b1.nparams, 3);
    ASSERT_EQ_INT(b1.first_entry, 0);
    ASSERT_EQ_INT(b1.bytes, 840);
    ASSERT_EQ_INT(b1.offset, e0.offset);
    ASSERT_EQ_INT(b1.offset + b1.numel, e2.offset + e2.numel);
    ASSERT_STATUS(dt_ddp_bucket(d, 2, &b0), DT_ERR_RANGE);
    /* the gradient buffer is now DDP's */
    ASSERT(t_grads(m) != NULL);
    dt_ddp_free(d);

    /* a cap below every tensor: one bucket per tensor, in reverse */
    p.first_bucket_mb = p.bucket_cap_mb = 1e-9;
    ASSERT_OK(dt_ddp_init(pg, m, &p, &d));
    ASSERT_EQ_INT(dt_ddp_num_buckets(d), 6);
    for (int k = 0; k < 6; k++) {
        ASSERT_OK(dt_ddp_bucket(d, k, &b0));
        ASSERT_EQ_INT(b0.first_entry, 5 - k);
    }
    dt_ddp_free(d);
    /* defaults: the ConvNet (about 120 KB of gradients) fits in the 1 MiB bucket */
    dt_model *cn = t_create("convnet", 1, NULL);
    ASSERT_OK(dt_ddp_init(pg, cn, NULL, &d));
    ASSERT_EQ_INT(dt_ddp_num_buckets(d), 1);
    dt_ddp_free(d);
    /* bad parameters */
    p = dt_ddp_params_default();
    p.bucket_cap_mb = 0;
    ASSERT_STATUS(dt_ddp_init(pg, cn, &p, &d), DT_ERR_INVALID_ARG);
    dt_model_free(cn);
    dt_model_free(m);
    dt_pg_free(pg);
}

/* ---- equivalence: N ranks x batch b == one process x batch N*b ---- */

typedef struct {
    int convnet;      /* 0: MLP; 1: ConvNet with SyncBatchNorm */
    int64_t b;        /* per-rank batch */
    int steps;
    double cap_mb;    /* bucket cap (small = many buckets) */
    bool predivide;
} eq_arg;

static int body_equivalence(int rank, int W, void *argp)
{
    const eq_arg *a = argp;
    dt_set_num_threads(1);
    const th_data *dd = a->convnet ? &k_img_data : &k_mlp_data;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    /* ranks start from different weights: DDP must broadcast rank 0's */
    dt_model *m = a->convnet ? t_create("convnet", 7 + (uint64_t)rank, NULL) : mlp_model(7 + (uint64_t)rank);
    TH_CHECK(m != NULL, "%s", dt_last_error());
    if (a->convnet) {
        int n = 0;
        TH_OK(dt_syncbn_convert(m, pg, &n));
        TH_CHECK(n == 2, "converted %d BatchNorm2d", n);
    }
    dt_ddp_params p = dt_ddp_params_default();
    p.bucket_cap_mb = p.first_bucket_mb = a->cap_mb;
    p.predivide = a->predivide;
    dt_strategy *strat;
    TH_OK(dt_strategy_ddp_init(pg, &p, &strat));
    dt_trainer *tr;
    TH_OK(make_trainer(m, strat, 1, &tr));
    dt_ddp *ddp = dt_strategy_ddp(strat);
    TH_CHECK(ddp != NULL, "the ddp strategy has no DDP handle after attach");
    const int64_t gb = a->b * W;
    for (int s = 0; s < a->steps; s++) {
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, dd, s * gb + rank * a->b, a->b, 1, 0, &r));
        TH_CHECK(r.samples == gb && r.step == s && isfinite(r.loss), "metrics: samples %lld step %lld loss %g",
                 (long long)r.samples, (long long)r.step, r.loss);
    }
    dt_ddp_stats st = dt_ddp_get_stats(ddp);
    TH_CHECK(st.iterations == (uint64_t)a->steps, "iterations %llu", (unsigned long long)st.iterations);
    TH_CHECK(st.buckets_posted == (uint64_t)(a->steps * dt_ddp_num_buckets(ddp)), "posted %llu",
             (unsigned long long)st.buckets_posted);

    /* the single-process reference, from rank 0's initial weights */
    dt_model *ref = a->convnet ? t_create("convnet", 7, NULL) : mlp_model(7);
    TH_OK(train_reference(ref, dd, gb, a->steps));
    size_t n = t_numel(m);
    double dp = max_rel_diff(t_params(m), t_params(ref), n);
    TH_CHECK(dp < 2e-5, "W=%d: parameters differ from the single process by %.3g", W, dp);
    /* and they changed (the test can fail) */
    dt_model *init = a->convnet ? t_create("convnet", 7, NULL) : mlp_model(7);
    TH_CHECK(max_rel_diff(t_params(m), t_params(init), n) > 1e-3, "parameters did not move");
    if (a->convnet) { /* running statistics: rank 0's after broadcast == single process */
        size_t nb = t_buffers_nbytes(m);
        TH_CHECK(nb == t_buffers_nbytes(ref), "buffer sizes");
        for (size_t i = 0; i < dt_model_num_entries(m); i++) {
            dt_param_info e, er;
            TH_OK(dt_model_entry(m, i, &e));
            TH_OK(dt_model_entry(ref, i, &er));
            if (!e.is_buffer)
                continue;
            if (e.dtype == DT_I64) {
                TH_CHECK(*(int64_t *)e.tensor->data == a->steps, "%s = %lld", e.name,
                         (long long)*(int64_t *)e.tensor->data);
                continue;
            }
            double db = max_rel_diff(e.tensor->data, er.tensor->data, e.numel);
            TH_CHECK(db < 2e-5, "W=%d: buffer %s differs by %.3g", W, e.name, db);
        }
    }
    dt_model_free(init);
    dt_model_free(ref);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(equivalence_mlp)
{
    for (int W = 2; W <= 4; W++) {
        eq_arg a = {.convnet = 0, .b = 5, .steps = 4, .cap_mb = 25};
        ASSERT_EQ_INT(th_run(W, 60.0, body_equivalence, &a, NULL), 0);
        /* one bucket per tensor, and PyTorch's pre-division */
        a.cap_mb = 1e-9;
        a.predivide = true;
        ASSERT_EQ_INT(th_run(W, 60.0, body_equivalence, &a, NULL), 0);
    }
}

TEST(equivalence_convnet_syncbn)
{
    for (int W = 2; W <= 4; W++) {
        eq_arg a = {.convnet = 1, .b = 3, .steps = 2, .cap_mb = W == 3 ? 0.01 : 25};
        ASSERT_EQ_INT(th_run(W, 90.0, body_equivalence, &a, NULL), 0);
    }
}

/* ---- no_sync: k micro-batches == one step on their union ---- */

static int body_no_sync(int rank, int W, void *argp)
{
    (void)argp;
    dt_set_num_threads(1);
    const int k = 3;
    const int64_t b = 4, gb = b * W * k;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = mlp_model(3);
    dt_ddp_params p = dt_ddp_params_default();
    p.bucket_cap_mb = p.first_bucket_mb = 1e-9;
    dt_strategy *strat;
    TH_OK(dt_strategy_ddp_init(pg, &p, &strat));
    dt_trainer *tr;
    TH_OK(make_trainer(m, strat, k, &tr)); /* each micro-batch loss / k */
    dt_ddp *ddp = dt_strategy_ddp(strat);
    for (int s = 0; s < 2; s++) {
        uint64_t seq0 = dt_pg_seq(pg);
        /* this rank's k micro-batches: slices of the step's union */
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, &k_mlp_data, s * gb + rank * k * b, b, k, b, &r));
        TH_CHECK(r.nmicro == k && r.samples == gb, "nmicro %d samples %lld", r.nmicro, (long long)r.samples);
        /* only the last micro-batch communicated: one all-reduce per bucket
         * plus the trainer's agreement */
        uint64_t want = (uint64_t)dt_ddp_num_buckets(ddp) + 1;
        TH_CHECK(dt_pg_seq(pg) - seq0 == want, "step %d posted %llu collectives, want %llu", s,
                 (unsigned long long)(dt_pg_seq(pg) - seq0), (unsigned long long)want);
    }
    TH_CHECK(dt_ddp_get_stats(ddp).iterations == 2, "iterations");
    dt_model *ref = mlp_model(3);
    TH_OK(train_reference(ref, &k_mlp_data, gb, 2));
    double d = max_rel_diff(t_params(m), t_params(ref), t_numel(m));
    TH_CHECK(d < 2e-5, "no_sync accumulation differs from the union step by %.3g", d);
    dt_model_free(ref);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(no_sync_accumulation)
{
    ASSERT_EQ_INT(th_run(2, 30.0, body_no_sync, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30.0, body_no_sync, NULL, NULL), 0);
}

/* ---- the model check at construction ---- */

static int body_mismatch(int rank, int W, void *argp)
{
    int variant = *(int *)argp;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, rank == 1 && variant == 0 ? 17 : 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    if (!(rank == 2 && variant == 1))
        dt_nn_add(net, NULL, dt_nn_linear(16, 4, true));
    dt_model *m = t_build(net, 1);
    dt_ddp *ddp = NULL;
    dt_status st = dt_ddp_init(pg, m, NULL, &ddp);
    TH_CHECK(st == DT_ERR_MISMATCH, "got %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(ddp == NULL, "handle on failure");
    const char *msg = dt_last_error();
    if (variant == 0)
        TH_CHECK(strstr(msg, "entry 0 is parameter f32 0.weight [16,8] on rank 0 but parameter f32 0.weight "
                             "[17,8] on rank 1"),
                 "message: %s", msg);
    else
        TH_CHECK(strstr(msg, "rank 0 has entry 2 (parameter f32 2.weight [4,16]) but rank 2 has only 2 entries"),
                 "message: %s", msg);
    /* the gradient buffer was left alone; the group still works */
    TH_OK(dt_pg_barrier(pg));
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(mismatch_at_construction)
{
    int v = 0;
    ASSERT_EQ_INT(th_run(2, 20.0, body_mismatch, &v, NULL), 0);
    v = 1;
    ASSERT_EQ_INT(th_run(3, 20.0, body_mismatch, &v, NULL), 0);
}

/* ---- unused parameters ---- */

/* A module with weights "a" [4, 8] and "b" [4, 8]; forward uses a, and b
 * only when ud says so for this rank. */
static int g_use_b;
static dt_tensor *fwd_branchy(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *y = dt_linear(ctx, x, dt_module_param(self, 0), NULL);
    if (g_use_b)
        y = dt_add(ctx, y, dt_linear(ctx, x, dt_module_param(self, 1), NULL));
    return y;
}

static dt_model *branchy_model(void)
{
    dt_nn_param_spec s[2] = {{.name = "a", .ndim = 2, .shape = {4, 8}, .init = DT_NN_INIT_UNIFORM, .a = 0.5f},
                             {.name = "b", .ndim = 2, .shape = {4, 8}, .init = DT_NN_INIT_UNIFORM, .a = 0.5f}};
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, "branchy", dt_nn_custom("Branchy", 2, s, fwd_branchy, NULL));
    return t_build(net, 5);
}

static int body_unused(int rank, int W, void *argp)
{
    int variant = *(int *)argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = branchy_model();
    TH_CHECK(m, "%s", dt_last_error());
    dt_ddp_params p = dt_ddp_params_default();
    p.find_unused_parameters = variant != 0;
    p.bucket_cap_mb = p.first_bucket_mb = 1e-9; /* a bucket each */
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, &p, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    /* variant 0/1: nobody uses b; variant 2: only rank 0 does */
    g_use_b = variant == 2 && rank == 0;
    dt_model_zero_grad(m);
    dt_status st = fwd_bwd(ctx, m, ddp, &k_mlp_data, rank * 4, 4, 1.0f);
    if (variant == 0) {
        TH_CHECK(st == DT_ERR_STATE, "got %s: %s", dt_status_name(st), dt_last_error());
        TH_CHECK(strstr(dt_last_error(), "1 parameter got no gradient in this backward: 'branchy.b'"),
                 "message: %s", dt_last_error());
        TH_CHECK(strstr(dt_last_error(), "find_unused_parameters"), "message: %s", dt_last_error());
        TH_CHECK(dt_ddp_wait(ddp) == DT_ERR_STATE, "wait after the failure");
    } else {
        TH_OK(st);
        TH_OK(dt_ddp_wait(ddp));
        int64_t ia = dt_model_find_entry(m, "branchy.a"), ib = dt_model_find_entry(m, "branchy.b");
        TH_CHECK(dt_ddp_param_used(ddp, (size_t)ia), "a used");
        TH_CHECK(dt_ddp_param_used(ddp, (size_t)ib) == (variant == 2), "b used on some rank: %d",
                 dt_ddp_param_used(ddp, (size_t)ib));
        dt_param_info eb;
        TH_OK(dt_model_entry(m, (size_t)ib, &eb));
        const float *gb = t_grads(m) + eb.offset;
        double s = 0;
        for (size_t i = 0; i < eb.numel; i++)
            s += fabs(gb[i]);
        if (variant == 1)
            TH_CHECK(s == 0, "unused b has gradient %g", s);
        else
            TH_CHECK(s > 0, "b used on rank 0 has no averaged gradient");
        /* a second iteration works as well */
        dt_ctx_reset(ctx);
        dt_model_zero_grad(m);
        TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, 100 + rank * 4, 4, 1.0f));
        TH_OK(dt_ddp_wait(ddp));
        TH_CHECK(dt_ddp_get_stats(ddp).iterations == 2, "iterations");
    }
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(unused_parameters)
{
    for (int v = 0; v < 3; v++)
        ASSERT_EQ_INT(th_run(2, 20.0, body_unused, &v, NULL), 0);
}

/* ---- in-order posting and overlap ---- */

/* Parameters declared a then b, but forward applies b first: a's gradient
 * lands first, so bucket 1 (a) completes before bucket 0 (b) and must wait. */
static dt_tensor *fwd_swapped(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *h = dt_relu(ctx, dt_linear(ctx, x, dt_module_param(self, 1), NULL)); /* b: [16, 8] */
    return dt_linear(ctx, h, dt_module_param(self, 0), NULL);                       /* a: [4, 16] */
}

static int body_order(int rank, int W, void *argp)
{
    (void)argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_nn_param_spec s[2] = {{.name = "a", .ndim = 2, .shape = {4, 16}, .init = DT_NN_INIT_UNIFORM, .a = 0.3f},
                             {.name = "b", .ndim = 2, .shape = {16, 8}, .init = DT_NN_INIT_UNIFORM, .a = 0.3f}};
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, "sw", dt_nn_custom("Swapped", 2, s, fwd_swapped, NULL));
    dt_model *m = t_build(net, 9);
    dt_ddp_params p = dt_ddp_params_default();
    p.bucket_cap_mb = p.first_bucket_mb = 1e-9;
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, &p, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_model_zero_grad(m);
    TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, rank * 6, 6, 1.0f));
    TH_OK(dt_ddp_wait(ddp));
    dt_ddp_bucket_info b0, b1;
    TH_OK(dt_ddp_bucket(ddp, 0, &b0));
    TH_OK(dt_ddp_bucket(ddp, 1, &b1));
    TH_CHECK(b0.first_entry == 1 && b1.first_entry == 0, "bucket 0 holds b, bucket 1 holds a");
    TH_CHECK(b1.ready_s >= 0 && b0.ready_s >= 0 && b1.ready_s <= b0.ready_s, "a ready first: %g %g", b1.ready_s,
             b0.ready_s);
    TH_CHECK(b1.posted_s >= b0.posted_s && b1.posted_s >= b0.ready_s, "bucket 1 waited for bucket 0: %g %g",
             b1.posted_s, b0.posted_s);
    /* the average is right: compare with a reduction done by hand */
    size_t n = t_numel(m);
    float *mine = malloc(n * sizeof(float));
    dt_model_zero_grad(m);
    dt_ctx_reset(ctx);
    dt_ddp_set_no_sync(ddp, true);
    TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, rank * 6, 6, 1.0f));
    memcpy(mine, t_grads(m), n * sizeof(float));
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, mine, n, DT_F32, DT_REDUCE_AVG));
    dt_model_zero_grad(m);
    dt_ctx_reset(ctx);
    dt_ddp_set_no_sync(ddp, false);
    TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, rank * 6, 6, 1.0f));
    TH_OK(dt_ddp_wait(ddp));
    TH_CHECK(max_rel_diff(t_grads(m), mine, n) < 1e-6, "averaged gradients");
    free(mine);
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(in_order_posting)
{
    ASSERT_EQ_INT(th_run(2, 20.0, body_order, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 20.0, body_order, NULL, NULL), 0);
}

/* Deeper MLP, a bucket per tensor: the all-reduces of the last layers are
 * posted while the first layers' gradients are still being computed. */
static int body_overlap(int rank, int W, void *argp)
{
    (void)argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 256, true));
    for (int i = 0; i < 4; i++) {
        dt_nn_add(net, NULL, dt_nn_relu());
        dt_nn_add(net, NULL, dt_nn_linear(256, 256, true));
    }
    dt_nn_add(net, NULL, dt_nn_linear(256, 4, true));
    dt_model *m = t_build(net, 2);
    dt_ddp_params p = dt_ddp_params_default();
    p.bucket_cap_mb = p.first_bucket_mb = 0.1; /* ~ one linear per bucket */
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, &p, &ddp));
    const int nb = dt_ddp_num_buckets(ddp);
    TH_CHECK(nb >= 4, "%d buckets", nb);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    for (int s = 0; s < 3; s++) {
        dt_model_zero_grad(m);
        TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, (s * W + rank) * 32, 32, 1.0f));
        TH_OK(dt_ddp_wait(ddp));
        dt_ctx_reset(ctx);
    }
    dt_ddp_stats st = dt_ddp_get_stats(ddp);
    /* posted during backward: all but possibly none (every bucket completes
     * from a grad-ready hook in a model where every parameter is used) */
    TH_CHECK(st.posted_in_backward == (uint64_t)(3 * nb), "posted in backward %llu of %d",
             (unsigned long long)st.posted_in_backward, 3 * nb);
    dt_ddp_bucket_info first, last;
    TH_OK(dt_ddp_bucket(ddp, 0, &first));
    TH_OK(dt_ddp_bucket(ddp, nb - 1, &last));
    /* bucket 0 (the last layer) was posted before the first layer's gradients landed */
    TH_CHECK(first.posted_s >= 0 && first.posted_s < last.ready_s, "bucket 0 posted at %g, last ready at %g",
             first.posted_s, last.ready_s);
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(overlap)
{
    ASSERT_EQ_INT(th_run(2, 30.0, body_overlap, NULL, NULL), 0);
}

/* ---- buffers: local BatchNorm running stats differ until re-broadcast ---- */

static int body_buffers(int rank, int W, void *argp)
{
    (void)argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = t_create("convnet", 3, NULL);
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, NULL, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_model_zero_grad(m);
    TH_OK(fwd_bwd(ctx, m, ddp, &k_img_data, rank * 3, 3, 1.0f));
    TH_OK(dt_ddp_wait(ddp));
    int64_t i = dt_model_find_entry(m, "layer1.1.running_mean");
    dt_param_info e;
    TH_OK(dt_model_entry(m, (size_t)i, &e));
    float mine[16], all[4 * 16];
    memcpy(mine, e.tensor->data, sizeof mine);
    TH_OK(dt_pg_allgather(pg, mine, all, 16, DT_F32));
    TH_CHECK(memcmp(all, all + 16, sizeof mine) != 0, "ranks saw different batches, stats should differ");
    TH_OK(dt_ddp_sync_buffers(ddp));
    TH_OK(dt_pg_allgather(pg, e.tensor->data, all, 16, DT_F32));
    for (int r = 1; r < W; r++)
        TH_CHECK(memcmp(all, all + 16 * r, sizeof mine) == 0, "rank %d differs after sync", r);
    if (rank == 0)
        TH_CHECK(memcmp(all, mine, sizeof mine) == 0, "rank 0's own stats");
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(sync_buffers)
{
    ASSERT_EQ_INT(th_run(2, 30.0, body_buffers, NULL, NULL), 0);
}

/* ---- world size 1, forward outside DDP, evaluation ---- */

TEST(single_rank_and_misuse)
{
    dt_pg *pg;
    dt_pg_params pp = dt_pg_params_default();
    pp.rank = 0, pp.world_size = 1, pp.backend = "self";
    ASSERT_OK(dt_pg_init(&pp, &pg));
    dt_model *m = mlp_model(4), *ref = mlp_model(4);
    dt_ddp *ddp;
    ASSERT_OK(dt_ddp_init(pg, m, NULL, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_optim *opt = make_sgd(m);
    for (int s = 0; s < 3; s++) {
        dt_model_zero_grad(m);
        ASSERT_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, s * 6, 6, 1.0f));
        ASSERT_OK(dt_ddp_wait(ddp));
        ASSERT_OK(dt_optim_step(opt));
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(train_reference(ref, &k_mlp_data, 6, 3));
    ASSERT(max_rel_diff(t_params(m), t_params(ref), t_numel(m)) == 0);
    /* evaluation under no-grad: no iteration, no collectives */
    dt_ag_set_enabled(ctx, false);
    uint64_t seq = dt_pg_seq(pg);
    float x[16] = {0};
    dt_tensor *o = dt_ddp_forward(ctx, ddp, dt_tensor_view_of(ctx, x, DT_F32, 2, (int64_t[]){2, 8}));
    ASSERT(o != NULL);
    ASSERT_EQ_U64(dt_pg_seq(pg), seq);
    ASSERT_OK(dt_ddp_wait(ddp));
    dt_ag_set_enabled(ctx, true);
    dt_ctx_reset(ctx);
    /* backward after a plain dt_model_forward: a clear error */
    dt_tensor *xt = dt_tensor_view_of(ctx, x, DT_F32, 2, (int64_t[]){2, 8});
    dt_tensor *loss = dt_mean(ctx, dt_model_forward(ctx, m, xt));
    ASSERT_STATUS(dt_backward(ctx, loss), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "dt_ddp_forward");
    dt_ctx_reset(ctx);
    dt_optim_free(opt);
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    /* after free the model has its own gradient buffer again and trains alone */
    dt_model_zero_grad(m);
    ASSERT_OK(train_reference(m, &k_mlp_data, 6, 1));
    dt_model_free(ref);
    dt_model_free(m);
    dt_pg_free(pg);
}

static int body_metrics(int rank, int W, void *argp)
{
    (void)argp;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    /* 10 items over W ranks: every item exactly once */
    int64_t lo, hi, covered = 0;
    dt_eval_shard(10, rank, W, &lo, &hi);
    double v[3] = {0, (double)(hi - lo), (double)rank};
    for (int64_t i = lo; i < hi; i++)
        v[0] += (double)i;
    covered = hi - lo;
    TH_OK(dt_metrics_allreduce(pg, v, 2, DT_REDUCE_SUM));
    TH_CHECK(v[0] == 45 && v[1] == 10, "sum %g count %g (mine %lld)", v[0], v[1], (long long)covered);
    TH_OK(dt_metrics_allreduce(pg, v + 2, 1, DT_REDUCE_MAX));
    TH_CHECK(v[2] == W - 1, "max %g", v[2]);
    dt_pg_free(pg);
    return 0;
}

TEST(metrics_and_eval_shard)
{
    int64_t lo, hi;
    dt_eval_shard(10, 0, 3, &lo, &hi);
    ASSERT_EQ_INT(lo, 0);
    ASSERT_EQ_INT(hi, 4);
    dt_eval_shard(10, 2, 3, &lo, &hi);
    ASSERT_EQ_INT(lo, 7);
    ASSERT_EQ_INT(hi, 10);
    dt_eval_shard(2, 3, 4, &lo, &hi);
    ASSERT_EQ_INT(hi - lo, 0);
    ASSERT_EQ_INT(th_run(3, 20.0, body_metrics, NULL, NULL), 0);
}

int main(void)
{
    /* forked tests first: OpenMP (oneDNN) used in the parent before a fork
     * can deadlock the children */
    RUN(metrics_and_eval_shard);
    RUN(equivalence_mlp);
    RUN(equivalence_convnet_syncbn);
    RUN(no_sync_accumulation);
    RUN(mismatch_at_construction);
    RUN(unused_parameters);
    RUN(in_order_posting);
    RUN(overlap);
    RUN(sync_buffers);
    RUN(bucket_assignment);
    RUN(single_rank_and_misuse);
    return TEST_REPORT();
}
