/* The trainer with optimizer-state offload (train.h params.offload,
 * offload.h): NVMe offload gives bit-identical parameters to the in-memory
 * optimizer (SGD with momentum and AdamW, gradient accumulation, clipping,
 * several steps, sub-groups smaller than the model), alone, under DDP on
 * two ranks and under ZeRO stages 1, 2 and 3 (a lazily built model for 3)
 * on two and three ranks; device cpu changes nothing; LAMB with NVMe is
 * refused. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"
#include "tmp_util.h"

#include <unistd.h>

static char g_root[256];

static dt_trainer_params params(dt_optim_kind kind, dt_offload_device dev)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = kind;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.adamw.lr = 0.01;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.grad_accum = 2;
    tp.clip_grad_norm = 0.5;
    tp.no_decay_1d = true;
    tp.offload.device = dev;
    tp.offload.nvme_path = g_root;
    tp.offload.sub_group_size = 50; /* the MLP's 212 elements in 5 sub-groups */
    tp.offload.buffer_count = 3;
    return tp;
}

/* Train a fresh MLP (seed 5) for `steps` steps with strategy s on samples
 * offset by `first`; the parameters into out (t_numel floats). */
static dt_status train(dt_strategy *s, const dt_trainer_params *tp, int steps, int64_t first, int64_t stride,
                       float *out, bool *offloaded)
{
    dt_model *m = mlp_model(5);
    if (!m) {
        dt_strategy_free(s);
        return dt_last_status();
    }
    dt_trainer *tr;
    dt_status st = dt_trainer_init(m, s, tp, &tr);
    if (st < 0) {
        dt_model_free(m);
        return st;
    }
    *offloaded = dt_trainer_offload(tr) != NULL;
    for (int i = 0; i < steps && st >= 0; i++) {
        dt_trainer_metrics r;
        st = trainer_step_on(tr, &k_mlp_data, first + i * 24, 6, 2, stride, &r);
    }
    if (st >= 0)
        memcpy(out, t_params(m), t_numel(m) * sizeof(float));
    dt_trainer_free(tr);
    dt_model_free(m);
    return st;
}

TEST(nvme_equals_in_memory_alone)
{
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        float a[256], b[256], c[256];
        bool off;
        dt_strategy *s;
        dt_trainer_params tp = params(kinds[k], DT_OFFLOAD_NONE);
        ASSERT_OK(dt_strategy_none_init(&s));
        ASSERT_OK(train(s, &tp, 5, 0, 6, a, &off));
        ASSERT(!off);
        tp = params(kinds[k], DT_OFFLOAD_NVME);
        ASSERT_OK(dt_strategy_none_init(&s));
        ASSERT_OK(train(s, &tp, 5, 0, 6, b, &off));
        ASSERT(off);
        tp = params(kinds[k], DT_OFFLOAD_CPU); /* a log line, nothing else */
        ASSERT_OK(dt_strategy_none_init(&s));
        ASSERT_OK(train(s, &tp, 5, 0, 6, c, &off));
        ASSERT(!off);
        dt_model *m = mlp_model(5);
        size_t n = t_numel(m);
        ASSERT(n <= 256);
        ASSERT(memcmp(a, t_params(m), n * sizeof(float)) != 0); /* it trained */
        dt_model_free(m);
        if (memcmp(a, b, n * sizeof(float)))
            TEST_FAIL_("%s: nvme offload differs from in memory", dt_optim_kind_name(kinds[k]));
        if (memcmp(a, c, n * sizeof(float)))
            TEST_FAIL_("%s: cpu offload differs from in memory", dt_optim_kind_name(kinds[k]));
    }
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0); /* files removed with the trainer */
}

TEST(lamb_with_nvme_is_refused)
{
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = params(DT_OPTIM_LAMB, DT_OFFLOAD_NVME);
    dt_model *m = mlp_model(5);
    dt_trainer *tr;
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "offload");
    /* checkpoints do not hold offloaded state yet: refused, not silently incomplete */
    tp = params(DT_OPTIM_SGD, DT_OFFLOAD_NVME);
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    ASSERT_STATUS(dt_trainer_save(tr, g_root, NULL), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "offloaded");
    ASSERT_STATUS(dt_trainer_load(tr, g_root, NULL), DT_ERR_UNSUPPORTED);
    dt_trainer_free(tr);
    tp.offload.nvme_path = "/nonexistent-dir-for-dtrain";
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent-dir-for-dtrain");
    dt_model_free(m);
}

/* DDP on two ranks, with and without offload, in one rank body (the group
 * reused): bit-identical parameters. */
static int body_ddp(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAMW};
    for (int k = 0; k < 2; k++) {
        float a[256], b[256];
        bool off;
        dt_strategy *s;
        dt_trainer_params tp = params(kinds[k], DT_OFFLOAD_NONE);
        TH_OK(dt_strategy_ddp_init(pg, NULL, &s));
        TH_OK(train(s, &tp, 4, rank * 6, 12, a, &off));
        tp = params(kinds[k], DT_OFFLOAD_NVME);
        TH_OK(dt_strategy_ddp_init(pg, NULL, &s));
        TH_OK(train(s, &tp, 4, rank * 6, 12, b, &off));
        TH_CHECK(off, "rank %d: not offloaded", rank);
        dt_model *m = mlp_model(5);
        size_t n = t_numel(m);
        dt_model_free(m);
        TH_CHECK(!memcmp(a, b, n * sizeof(float)), "rank %d, %s: DDP with nvme offload differs from DDP", rank,
                 dt_optim_kind_name(kinds[k]));
    }
    dt_pg_free(pg);
    return 0;
}

TEST(nvme_equals_in_memory_under_ddp)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_ddp, NULL, NULL), 0);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

/* ZeRO stage 1/2/3: the same strategy with and without offload, after 3
 * steps, bit-identical full parameters on every rank. */
static dt_model *zmodel(bool meta)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(16, 5, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(5, 4, true));
    dt_model_build_params bp = dt_model_build_params_default();
    bp.meta = meta;
    dt_model *m = NULL;
    return dt_model_build(net, 21, &bp, &m) < 0 ? NULL : m;
}

/* *out: the full parameters (malloc'ed, *n floats: the flat's total) */
static int zero_run(dt_pg *pg, int rank, int W, int stage, dt_optim_kind k, bool nvme, float **out, size_t *n)
{
    dt_model *m = zmodel(stage == 3);
    TH_CHECK(m, "model");
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = stage;
    zp.init_seed = 21;
    zp.wrap_module_type = "Linear"; /* three units: three ranges for the driver */
    dt_strategy *s;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    dt_trainer_params tp = params(k, nvme ? DT_OFFLOAD_NVME : DT_OFFLOAD_NONE);
    tp.grad_accum = 1;
    tp.offload.sub_group_size = 7;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    TH_CHECK((dt_trainer_offload(tr) != NULL) == nvme, "offload driver %s", nvme ? "missing" : "present");
    for (int i = 0; i < 3; i++) {
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, &k_mlp_data, ((int64_t)i * W + rank) * 3, 3, 1, 0, &r));
    }
    dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
    TH_CHECK(z, "no zero handle");
    *n = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32)->total;
    *out = calloc(*n, sizeof(float));
    TH_CHECK(*out, "memory");
    TH_OK(dt_zero_full_params(z, *out));
    dt_trainer_free(tr);
    dt_model_free(m);
    return 0;
}

static int body_zero(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const dt_optim_kind kinds[] = {DT_OPTIM_SGD, DT_OPTIM_ADAMW};
    for (int stage = 1; stage <= 3; stage++)
        for (int k = 0; k < 2; k++) {
            float *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            if (zero_run(pg, rank, W, stage, kinds[k], false, &a, &na) ||
                zero_run(pg, rank, W, stage, kinds[k], true, &b, &nb))
                return 1;
            TH_CHECK(na == nb, "sizes %zu %zu", na, nb);
            TH_CHECK(!memcmp(a, b, na * sizeof(float)), "rank %d of %d, stage %d, %s: offload differs", rank, W,
                     stage, dt_optim_kind_name(kinds[k]));
            dt_model *init = zmodel(false);
            TH_CHECK(max_rel_diff(a, t_params(init), na) > 1e-3, "stage %d: parameters did not move", stage);
            dt_model_free(init);
            free(a);
            free(b);
        }
    dt_pg_free(pg);
    return 0;
}

TEST(nvme_equals_in_memory_under_zero)
{
    for (int W = 2; W <= 3; W++)
        ASSERT_EQ_INT(th_run(W, 90.0, body_zero, NULL, NULL), 0);
    ASSERT_EQ_INT(t_count_entries(g_root, false), 0);
}

int main(void)
{
    if (!t_mkdtemp("troff", g_root, sizeof g_root)) {
        perror("mkdtemp");
        return 1;
    }
    dt_set_num_threads(1);
    RUN(nvme_equals_in_memory_under_ddp); /* first: the ranks are forked (no I/O threads yet) */
    RUN(nvme_equals_in_memory_under_zero);
    RUN(nvme_equals_in_memory_alone);
    RUN(lamb_with_nvme_is_refused);
    rmdir(g_root);
    return TEST_REPORT();
}
