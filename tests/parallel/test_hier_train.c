/* Hierarchical gradient reductions in training (dt_ddp_params.hierarchical,
 * dt_zero_params.hierarchical), nodes simulated with DT_SIM_LOCAL_SIZE on
 * forked shm ranks: after three steps DDP with the hierarchical all-reduce,
 * and ZeRO stages 1, 2 and 3 with hierarchical reductions, hold the
 * parameters that flat DDP holds, within a relative 1e-5 (the sums are
 * added in another order: per node first), at 2 nodes x 2 ranks and
 * 2 x 3. And they really ran on the hierarchical group: the caller's group
 * sees fewer collectives during the steps than with flat reductions (the
 * buckets went to the strategy's own hierarchical group). */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"

enum { STEPS = 3, MB = 3 };

typedef struct {
    int stage; /* 0: DDP */
} hcase;

static dt_model *hmodel(void)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(16, 5, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(5, 4, true));
    return t_build(net, 21);
}

static int train(dt_trainer *tr, int rank, int W)
{
    for (int s = 0; s < STEPS; s++) {
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, &k_mlp_data, ((int64_t)s * W + rank) * MB, MB, 1, (int64_t)W * MB, &r));
        TH_CHECK(!r.skipped && isfinite(r.loss), "step %d", s);
    }
    return 0;
}

/* Train with strategy s; *seq = collectives the caller's group saw during the steps. */
static int run(dt_pg *pg, dt_strategy *s, dt_model *m, int rank, int W, uint64_t *seq)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_SGD;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    uint64_t s0 = dt_pg_seq(pg); /* the steps only (making the groups posts on pg too) */
    if (train(tr, rank, W))
        return 1;
    *seq = dt_pg_seq(pg) - s0;
    dt_trainer_free(tr);
    return 0;
}

static int body(int rank, int W, void *arg)
{
    const hcase *c = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    uint64_t seq_flat, seq_hier;
    dt_strategy *s;
    /* reference: flat DDP */
    dt_model *ref = hmodel();
    TH_CHECK(ref, "model");
    TH_OK(dt_strategy_ddp_init(pg, NULL, &s));
    if (run(pg, s, ref, rank, W, &seq_flat))
        return 1;
    dt_model *m = hmodel();
    TH_CHECK(m, "model");
    uint64_t seq_flat_same = seq_flat;
    if (c->stage == 0) {
        dt_ddp_params dp = dt_ddp_params_default();
        dp.hierarchical = true;
        TH_OK(dt_strategy_ddp_init(pg, &dp, &s));
    } else {
        /* the flat run of the same stage, for the collective count */
        dt_model *mf = hmodel();
        dt_zero_params zp = dt_zero_params_default();
        zp.stage = c->stage;
        zp.init_seed = 21;
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
        if (run(pg, s, mf, rank, W, &seq_flat_same))
            return 1;
        dt_model_free(mf);
        zp.hierarchical = true;
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    }
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_SGD;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    uint64_t s0 = dt_pg_seq(pg); /* the steps only (making the groups posts on pg too) */
    if (train(tr, rank, W))
        return 1;
    seq_hier = dt_pg_seq(pg) - s0;
    const size_t n = t_numel(ref);
    float *got = calloc(n, sizeof *got);
    dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
    if (z)
        TH_OK(dt_zero_full_params(z, got));
    else
        memcpy(got, t_params(m), n * sizeof *got);
    double d = max_rel_diff(got, t_params(ref), n);
    TH_CHECK(d <= 1e-5, "stage %d W %d: hierarchical vs flat DDP: max rel diff %g", c->stage, W, d);
    dt_model *init = hmodel();
    TH_CHECK(max_rel_diff(got, t_params(init), n) > 1e-3, "parameters did not move");
    TH_CHECK(seq_hier < seq_flat_same, "stage %d: the caller's group saw %llu collectives, flat %llu: "
             "the reductions did not go to the hierarchical group", c->stage,
             (unsigned long long)seq_hier, (unsigned long long)seq_flat_same);
    dt_model_free(init);
    free(got);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

static void run_case(int stage, int W, const char *sim)
{
    setenv("DT_SIM_LOCAL_SIZE", sim, 1);
    hcase c = {stage};
    int rc = th_run(W, 90.0, body, &c, NULL);
    unsetenv("DT_SIM_LOCAL_SIZE");
    if (rc)
        fprintf(stderr, "case stage %d W %d (nodes of %s) failed\n", stage, W, sim);
    ASSERT_EQ_INT(rc, 0);
}

TEST(ddp_2x2) { run_case(0, 4, "2"); }
TEST(ddp_2x3) { run_case(0, 6, "3"); }
TEST(zero_stages_2x2)
{
    run_case(1, 4, "2");
    run_case(2, 4, "2");
    run_case(3, 4, "2");
}

int main(void)
{
    RUN(ddp_2x2);
    RUN(ddp_2x3);
    RUN(zero_stages_2x2);
    return TEST_REPORT();
}
