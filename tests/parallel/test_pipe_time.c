/* Stages balanced by measured time (pipeline.h: DT_PIPE_BY_TIME,
 * dt_pipe_unit_times, dt_pipe_params.sample).
 *
 * The model of the cut tests is a Sequential of three Linear(64, 64) and a
 * "Heavy" unit with 64 parameters whose forward is 300 element-wise
 * multiplies: the lightest unit by parameter count, the heaviest by far in
 * time (each Linear is one small GEMM; Heavy's forward and backward are
 * hundreds of kernel calls: about two orders of magnitude, so the
 * outcomes below hold on a loaded machine; none of them is a time limit).
 * On 2 stages by parameter count the cut is [L, L | L, H] (8320 against
 * 4224 elements); by time it is [L, L, L | H], isolating the heavy unit
 * (that cut wins as soon as H takes more than two Linears).
 *
 *   - dt_pipe_unit_times: positive costs, the model's gradients and
 *     parameters as they were, the heavy unit the most costly; bad input
 *     refused with the unit named;
 *   - the strategy: with dp 2 x pp 2 every rank gets the time cut (and the
 *     parameter cut with DT_PIPE_BY_PARAMS); ranks that would cut
 *     differently by their own times (the heavy unit is first on one rank,
 *     last on the other) still cut alike: the times are agreed;
 *   - training with DT_PIPE_BY_TIME equals single-process training
 *     (pipe_train.h), the GPT and the MLP, also dp 2 x pp 2 and under
 *     tensor parallelism (tp 2 x pp 2: the tp ranks time in step);
 *   - no sample, a sample of the wrong shape, samples of different shapes
 *     on the ranks: clear errors on every rank, no hang. */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "train/pipe_train.h"

#include "dtrain/tp.h"

#define D 64
#define ROWS 16
#define REPEATS 300

/* Heavy: y = x w w ... w (REPEATS times). ud: NULL, or an int* that makes
 * it light (one multiply) when *ud is 0. */
static dt_tensor *heavy_fwd(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    int k = ud && *(const int *)ud == 0 ? 1 : REPEATS;
    dt_tensor *w = dt_module_param(self, 0);
    for (int i = 0; i < k && x; i++)
        x = dt_mul(ctx, x, w);
    return x;
}

static dt_module *heavy(void *ud)
{
    dt_nn_param_spec sp = {.name = "w", .ndim = 1, .shape = {D}, .init = DT_NN_INIT_ONES};
    return dt_nn_custom("Heavy", 1, &sp, heavy_fwd, ud);
}

/* [L, L, L, H]; with flags: [H0, L, L, H3], unit 0 heavy when flags[0], unit 3 when flags[1]. */
static dt_model *seq_model(int *flags)
{
    dt_module *c[4];
    if (flags) {
        c[0] = heavy(&flags[0]);
        c[1] = dt_nn_linear(D, D, true);
        c[2] = dt_nn_linear(D, D, true);
        c[3] = heavy(&flags[1]);
    } else {
        for (int i = 0; i < 3; i++)
            c[i] = dt_nn_linear(D, D, true);
        c[3] = heavy(NULL);
    }
    dt_model *m = NULL;
    dt_model_build_params bp = dt_model_build_params_default();
    if (dt_model_build(dt_nn_seq(4, c), 5, &bp, &m) < 0)
        return NULL;
    return m;
}

static float g_x[ROWS * D];

static void fill_x(void)
{
    for (int i = 0; i < ROWS * D; i++)
        g_x[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
}

static dt_tensor *mean_loss(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    (void)ud, (void)y;
    return dt_mean(ctx, out);
}

/* In a child process (th_run of one rank): OpenMP, once started in the
 * test's own process, would not survive the forks of the later tests. One
 * thread: a multi-threaded GEMM this small costs mostly its threads' wake-up
 * on a loaded machine, which is not what the test is about. */
static int unit_times_body(int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    dt_set_num_threads(1); /* see cut_body */
    fill_x();
    dt_model *m = seq_model(NULL);
    TH_CHECK(m != NULL, "model: %s", dt_last_error());
    dt_pipe_unit *u;
    int n;
    TH_OK(dt_model_pipe_units(m, &u, &n));
    TH_CHECK(n == 4, "%d units", n);
    const dt_flat *pf = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *gf = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    float *p0 = malloc(pf->total * sizeof *p0);
    memcpy(p0, pf->base, pf->total * sizeof *p0);
    dt_tensor x;
    TH_OK(dt_tensor_init_contiguous(&x, DT_F32, 2, (int64_t[]){ROWS, D}, g_x));
    double t[4], c[4];
    TH_OK(dt_pipe_unit_times(m, u, n, &x, DT_F32, 3, t));
    for (int i = 0; i < 4; i++)
        TH_CHECK(t[i] > 0 && isfinite(t[i]), "unit %d: %g s", i, t[i]);
    TH_CHECK(t[3] > t[0] && t[3] > t[1] && t[3] > t[2], "times %g %g %g %g s: the heavy unit not the most costly",
             t[0], t[1], t[2], t[3]);
    /* the model as it was: no gradient left behind, parameters untouched */
    const float *g = gf->base;
    for (size_t i = 0; i < gf->total; i++)
        TH_CHECK(g[i] == 0.0f, "gradient element %zu is %g after the timing", i, g[i]);
    TH_CHECK(memcmp(p0, pf->base, pf->total * sizeof *p0) == 0, "the timing changed the parameters");
    /* the cuts: time isolates the heavy unit, parameter count does not */
    int st[2];
    TH_OK(dt_pipe_balance(t, n, 2, 1, st));
    TH_CHECK(st[1] == 3, "by time the cut is at %d (times %g %g %g %g)", st[1], t[0], t[1], t[2], t[3]);
    TH_OK(dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_PARAMS, c));
    TH_OK(dt_pipe_balance(c, n, 2, 1, st));
    TH_CHECK(st[1] == 2, "by parameters the cut is at %d", st[1]);
    /* bf16 autocast: still positive costs; gradients that are not zero (kept
     * as a copy rather than zeroed again) come back as they were */
    ((float *)gf->base)[5] = 0.25f;
    TH_OK(dt_pipe_unit_times(m, u, n, &x, DT_BF16, 1, t));
    for (int i = 0; i < 4; i++)
        TH_CHECK(t[i] > 0 && isfinite(t[i]), "unit %d: %g s", i, t[i]);
    for (size_t i = 0; i < gf->total; i++)
        TH_CHECK(g[i] == (i == 5 ? 0.25f : 0.0f), "gradient element %zu is %g after the timing", i, g[i]);
    ((float *)gf->base)[5] = 0;
    /* bad input */
    TH_CHECK(dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_TIME, c) == DT_ERR_INVALID_ARG, "BY_TIME costs without an input");
    TH_CHECK(strstr(dt_last_error(), "dt_pipe_unit_times"), "error '%s'", dt_last_error());
    TH_CHECK(dt_pipe_unit_times(m, u, n, &x, DT_F32, 0, t) == DT_ERR_INVALID_ARG, "0 repetitions accepted");
    dt_tensor bad;
    TH_OK(dt_tensor_init_contiguous(&bad, DT_F32, 2, (int64_t[]){ROWS * 2, D / 2}, g_x));
    TH_CHECK(dt_pipe_unit_times(m, u, n, &bad, DT_F32, 1, t) < 0, "an input of the wrong shape accepted");
    TH_CHECK(strstr(dt_last_error(), "unit 0 (0) on its input [32, 32] f32"), "error '%s'", dt_last_error());
    for (size_t i = 0; i < gf->total; i++)
        TH_CHECK(g[i] == 0.0f, "gradient element %zu is %g after the timing", i, g[i]);
    free(p0);
    dt_free(u);
    dt_model_free(m);
    return 0;
}

TEST(unit_times)
{
    int codes[1];
    ASSERT_EQ_INT(th_run(1, 60.0, unit_times_body, NULL, codes), 0);
}

typedef struct {
    dt_pipe_balance_by by;
    int pp;
    bool swap;   /* the heavy unit first on rank 0, last on the others */
    int expect;  /* the cut (the first unit of stage 1); 0: any, but the same everywhere */
} cut_cfg;

static int cut_body(int rank, int size, void *arg)
{
    const cut_cfg *c = arg;
    /* one thread per rank, as a pipeline rank runs: with 4 ranks of 2
     * threads on a 2-core machine a Linear's small GEMM measured 15-19 ms
     * (its threads' wake-ups), the heavy unit 0.8 ms */
    dt_set_num_threads(1);
    fill_x();
    int flags[2] = {rank == 0, rank != 0};
    dt_model *m = seq_model(c->swap ? flags : NULL);
    TH_CHECK(m != NULL, "model: %s", dt_last_error());
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = c->pp;
    pp.balance = c->by;
    dt_trainer_batch b = dt_trainer_batch_make(g_x, DT_F32, 2, (int64_t[]){ROWS, D}, NULL, DT_F32, 0, NULL);
    pp.sample = &b;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.loss_fn = mean_loss;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    dt_pipe_stats stt;
    TH_OK(dt_strategy_pipe_stats(s, &stt));
    /* every rank's range, gathered: a slot per rank */
    double r[2 * 8] = {0};
    r[2 * rank] = stt.unit_lo[0], r[2 * rank + 1] = stt.unit_hi[0];
    TH_OK(dt_metrics_allreduce(pg, r, 2 * size, DT_REDUCE_SUM));
    int cut = (int)r[1];
    for (int q = 0; q < size; q++) {
        int st = q % c->pp; /* pipeline rank */
        int lo = st == 0 ? 0 : cut, hi = st == 0 ? cut : 4;
        TH_CHECK((int)r[2 * q] == lo && (int)r[2 * q + 1] == hi,
                 "rank %d holds units [%g, %g); rank 0's cut is at %d: the ranks cut differently", q, r[2 * q],
                 r[2 * q + 1], cut);
    }
    TH_CHECK(c->expect == 0 || cut == c->expect, "balanced by %s the cut is at unit %d, expected %d",
             c->by == DT_PIPE_BY_TIME ? "time" : "parameters", cut, c->expect);
    /* and it trains */
    dt_trainer_batch tb = dt_trainer_batch_make(g_x, DT_F32, 2, (int64_t[]){ROWS, D}, NULL, DT_F32, 0, NULL);
    dt_trainer_metrics mt;
    TH_OK(dt_trainer_step(tr, &tb, 1, &mt));
    TH_CHECK(isfinite(mt.loss), "loss %g", mt.loss);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

static void run_cut(dt_pipe_balance_by by, int world, int pp, bool swap, int expect)
{
    cut_cfg c = {by, pp, swap, expect};
    int codes[8];
    ASSERT_EQ_INT(th_run(world, 60.0, cut_body, &c, codes), 0);
}

TEST(cut_by_time)
{
    run_cut(DT_PIPE_BY_TIME, 4, 2, false, 3);   /* dp 2 x pp 2: both replicas isolate the heavy unit */
    run_cut(DT_PIPE_BY_PARAMS, 4, 2, false, 2); /* by parameter count: another cut */
    run_cut(DT_PIPE_BY_TIME, 2, 2, true, 0);    /* own times would cut at 3 (rank 0) and 1 (rank 1) */
}

/* Equality with single-process training (pipe_train.h) under DT_PIPE_BY_TIME. */
TEST(time_trains_like_one_process)
{
    run_time("mlp", DT_PIPE_1F1B, 2, 1, 4);
    run_time("gpt", DT_PIPE_1F1B, 2, 1, 4);
    run_time("gpt", DT_PIPE_GPIPE, 2, 2, 2); /* dp 2 x pp 2 */
}

/* tp 2 x pp 2: the GPT built with the mesh's tp group; the tp ranks time
 * in step; every rank of a pipeline stage holds the same units, and a step
 * runs. */
static int tp_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_mesh *mesh;
    TH_OK(dt_pipe_mesh_init(pg, 2, 2, &mesh));
    dt_model_config mc = small_cfg("gpt");
    mc.tp = dt_mesh_dim_group(mesh, 1);
    dt_model *m;
    dt_model_desc d;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &d));
    float xf[1];
    int64_t xi[B_GLOBAL * T_GPT], y[B_GLOBAL * T_GPT];
    make_batch("gpt", 0, B_GLOBAL, xf, xi, y);
    dt_trainer_batch whole = batch_of("gpt", B_GLOBAL, xf, xi, y), micro = batch_of("gpt", B_GLOBAL / 4, xf, xi, y);
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = 2;
    pp.mesh = mesh;
    pp.micro_batches = 4;
    pp.balance = DT_PIPE_BY_TIME;
    pp.sample = &micro;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer *tr;
    TH_OK(trainer_for(m, &d, s, &tr));
    dt_pipe_stats stt;
    TH_OK(dt_strategy_pipe_stats(s, &stt));
    double r[2 * 4] = {0};
    r[2 * rank] = stt.unit_lo[0], r[2 * rank + 1] = stt.unit_hi[0];
    TH_OK(dt_metrics_allreduce(pg, r, 8, DT_REDUCE_SUM));
    /* rank = t pp + s: ranks 0, 2 hold stage 0, ranks 1, 3 stage 1 */
    TH_CHECK(r[0] == 0 && r[1] >= 1 && r[2] == r[1] && r[3] == 7 && r[4] == r[0] && r[5] == r[1] && r[6] == r[2] &&
                 r[7] == r[3],
             "stages of ranks 0-3: [%g %g) [%g %g) [%g %g) [%g %g)", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    dt_trainer_metrics mt;
    TH_OK(dt_trainer_step(tr, &whole, 1, &mt));
    TH_CHECK(isfinite(mt.loss), "loss %g", mt.loss);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_mesh_free(mesh);
    dt_pg_free(pg);
    return 0;
}

TEST(time_with_tp)
{
    int codes[8];
    ASSERT_EQ_INT(th_run(4, 90.0, tp_body, NULL, codes), 0);
}

/* Bad input: 0 no sample (at init), 1 the wrong shape (the MLP takes
 * [b, 4, 8]), 2 rank 1's sample has another batch size than rank 0's. */
static int bad_body(int rank, int size, void *arg)
{
    int what = *(const int *)arg;
    dt_model_config mc = small_cfg("mlp");
    dt_model *m;
    dt_model_desc d;
    TH_OK(dt_model_create("mlp", 11, &mc, &m, &d));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.balance = DT_PIPE_BY_TIME;
    float x[4 * 4 * 8] = {0};
    int64_t b = what == 2 && rank == 1 ? 3 : 2;
    dt_trainer_batch sb = dt_trainer_batch_make(x, DT_F32, 3, (int64_t[]){b, 4, what == 1 ? 5 : 8}, NULL, DT_F32, 0,
                                                NULL);
    dt_strategy *s = NULL;
    if (what == 0) {
        TH_CHECK(dt_strategy_pipe_init(pg, &pp, &s) == DT_ERR_INVALID_ARG && !s, "no sample accepted");
        TH_CHECK(strstr(dt_last_error(), "DT_PIPE_BY_TIME needs params.sample"), "error '%s'", dt_last_error());
        /* with cut points the balance is not used: no sample needed */
        pp.cuts = (int[]){1};
        pp.ncuts = 1;
        TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
        dt_strategy_free(s);
    } else {
        pp.sample = &sb;
        TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
        dt_trainer *tr = NULL;
        TH_CHECK(trainer_for(m, &d, s, &tr) < 0 && !tr, "a bad sample accepted");
        const char *want = what == 1 ? "timing the units (DT_PIPE_BY_TIME): dt_pipe_unit_times: unit 0 (w0) on its "
                                       "input [2, 4, 5] f32"
                                     : "the ranks' samples differ in shape";
        TH_CHECK(strstr(dt_last_error(), want), "error '%s'", dt_last_error());
    }
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(bad_input)
{
    int codes[8];
    for (int what = 0; what < 3; what++)
        ASSERT_EQ_INT(th_run(2, 30.0, bad_body, &what, codes), 0);
}

int main(void)
{
    RUN(unit_times);
    RUN(bad_input);
    RUN(cut_by_time);
    RUN(time_trains_like_one_process);
    RUN(time_with_tp);
    return TEST_REPORT();
}
