/* Communication hooks on the reduction engine (real processes, shm):
 * fp16/bf16 compression against hand-computed roundings, PowerSGD against a
 * hand-computed rank-1 case and against PyTorch 2.15's powerSGD_hook
 * (powersgd_ref.h, from gen_powersgd_ref.py), the error-feedback identity,
 * 1-d and small tensors uncompressed, plain all-reduce before start_iter,
 * determinism, DDP's comm_hook selection, a user hook with stages (the
 * engine's call order, the bucket layout and step it sees), AIAK's
 * variables, bad input. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "parallel/powersgd_ref.h"
#include "test.h"

#include <stdio.h>

/* Tensors of the PyTorch comparison model, model order:
 * 0.weight [4,3], 0.bias [4], 1.weight [8,6], 1.bias [8], 2.weight [4,3],
 * 3.weight [5,2,2,2], 3.bias [5]. */
static dt_model *ref_model(void)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(3, 4, true));
    dt_nn_add(net, NULL, dt_nn_linear(6, 8, true));
    dt_nn_add(net, NULL, dt_nn_linear(3, 4, false));
    dt_nn_add(net, NULL, dt_nn_conv2d(2, 5, 2, 1, 0, true));
    return t_build(net, 1);
}
enum { REF_N = 129 };

/* gen_powersgd_ref.py's G */
static float ref_g(int rank, int t, int i) { return (float)((i * 37 + t * 53 + rank * 71) % 97 - 48) / 64.0f; }

/* One engine over a model's gradients, with hook `h` (NULL: default) and
 * reduce dtype `rd`. */
typedef struct {
    dt_model *m;
    float *g;
    size_t n;
    dt_reducer *r;
    dt_powersgd *ps;
} eng;

static dt_status eng_init(eng *e, dt_pg *pg, dt_model *m, const dt_powersgd_params *pp, dt_dtype rd,
                          dt_reducer_collective coll)
{
    memset(e, 0, sizeof *e);
    e->m = m;
    e->n = t_numel(m);
    e->g = calloc(e->n, sizeof *e->g);
    dt_flat gf;
    dt_status st = dt_flat_wrap(&gf, DT_F32, e->g, e->n);
    dt_reducer_params p = dt_reducer_params_default();
    p.reduce_dtype = rd;
    p.collective = coll;
    if (st >= 0)
        st = dt_reducer_init(pg, m, &gf, &p, &e->r);
    if (st >= 0 && pp && (st = dt_powersgd_init(pp, &e->ps)) >= 0)
        st = dt_reducer_register_comm_hook(e->r, dt_powersgd_hook(), e->ps);
    return st;
}

static void eng_free(eng *e)
{
    dt_reducer_free(e->r);
    dt_powersgd_free(e->ps);
    free(e->g);
}

/* Element i of the concatenated tensors (model order, no padding) -> flat offset. */
static size_t flat_at(const dt_model *m, size_t i)
{
    for (size_t k = 0; k < dt_model_num_entries(m); k++) {
        dt_param_info pi;
        dt_model_entry(m, k, &pi);
        if (pi.is_buffer)
            continue;
        if (i < pi.numel)
            return pi.offset + i;
        i -= pi.numel;
    }
    return (size_t)-1;
}

static dt_status eng_step(eng *e)
{
    dt_reducer_begin(e->r);
    for (size_t k = 0; k < dt_model_num_entries(e->m); k++) {
        dt_status st = dt_reducer_grad_ready(e->r, k);
        if (st < 0)
            return st;
    }
    dt_status st = dt_reducer_finish(e->r);
    return st < 0 ? st : dt_reducer_wait(e->r);
}

/* ---- fp16 / bf16 ---------------------------------------------------------------- */

/* Three ranks send 0.1, 0.2, 0.3 (element 0) and 60000 (element 1); one
 * rank 1 - 2^-12 (element 2; the others 1). Hand-computed:
 *   f16: 0.1 -> 0.0999755859375, 0.2 -> 0.199951171875, 0.3 -> 0.300048828125;
 *        the sum 0.5999755859375 / 3 = 0.1999918620 rounds to 0.199951171875
 *        (ulp 2^-13 there). 60000 is exact in f16 and the f32 accumulation
 *        keeps 180000 (Horovod's f16 sum would overflow to inf). 1 - 2^-12
 *        rounds to 1 (half an f16 ulp below 1 is 2^-12: ties to even).
 *   bf16: 0.1 -> 0.10009765625, 0.2 -> 0.2001953125, 0.3 -> 0.30078125;
 *        sum 0.60107421875 / 3 = 0.20035807 rounds to 0.2001953125 (ulp 2^-10);
 *        60000 -> 59904 (ulp 256 there: 60000 = 234.375 * 256 -> 234 * 256);
 *        1 - 2^-12 -> 1. */
static int body_lowp(int rank, int W, void *arg)
{
    const dt_comm_hook_kind kind = *(const dt_comm_hook_kind *)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = mlp_model(1);
    /* the hook selects the engine's reduce dtype, as DDP does */
    dt_ddp_params dp = dt_ddp_params_default();
    dp.comm_hook = kind;
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, &dp, &ddp));
    eng e;
    TH_OK(eng_init(&e, pg, m, NULL, kind == DT_COMM_HOOK_FP16 ? DT_F16 : DT_BF16, DT_REDUCER_ALLREDUCE));
    for (size_t i = 0; i < e.n; i++)
        e.g[i] = 1.0f;
    e.g[flat_at(m, 0)] = 0.1f * (float)(rank + 1);
    e.g[flat_at(m, 1)] = 60000.0f;
    if (rank == 0)
        e.g[flat_at(m, 2)] = 1.0f - 1.0f / 4096.0f;
    TH_OK(eng_step(&e));
    const float want0 = kind == DT_COMM_HOOK_FP16 ? 0.199951171875f : 0.2001953125f;
    const float want1 = kind == DT_COMM_HOOK_FP16 ? 60000.0f : 59904.0f;
    TH_CHECK(e.g[flat_at(m, 0)] == want0, "%s: element 0 = %.10g, want %.10g", dt_comm_hook_name(kind),
             e.g[flat_at(m, 0)], want0);
    TH_CHECK(e.g[flat_at(m, 1)] == want1, "%s: element 1 = %.10g, want %.10g", dt_comm_hook_name(kind),
             e.g[flat_at(m, 1)], want1);
    TH_CHECK(e.g[flat_at(m, 2)] == 1.0f, "%s: element 2 = %.10g, want 1", dt_comm_hook_name(kind), e.g[flat_at(m, 2)]);
    eng_free(&e);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(fp16_bf16_hand)
{
    dt_comm_hook_kind k[2] = {DT_COMM_HOOK_FP16, DT_COMM_HOOK_BF16};
    for (int i = 0; i < 2; i++)
        ASSERT_EQ_INT(th_run(3, 60.0, body_lowp, &k[i], NULL), 0);
}

/* DDP with comm_hook fp16 gives the same bits as reduce_dtype f16 (one
 * implementation), different bits from f32; bad combinations are refused. */
static int body_ddp_select(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    float *res[3] = {0};
    for (int v = 0; v < 3; v++) {
        dt_model *m = mlp_model(3);
        dt_ddp_params dp = dt_ddp_params_default();
        if (v == 0)
            dp.comm_hook = DT_COMM_HOOK_FP16;
        if (v == 1)
            dp.reduce_dtype = DT_F16;
        dt_ddp *ddp;
        TH_OK(dt_ddp_init(pg, m, &dp, &ddp));
        dt_ctx *ctx;
        TH_OK(dt_ctx_init(NULL, &ctx));
        dt_model_zero_grad(m);
        TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, rank * 4, 4, 1.0f));
        TH_OK(dt_ddp_wait(ddp));
        res[v] = malloc(t_numel(m) * sizeof(float));
        memcpy(res[v], t_grads(m), t_numel(m) * sizeof(float));
        const size_t n = t_numel(m);
        dt_ctx_free(ctx);
        dt_ddp_free(ddp);
        dt_model_free(m);
        if (v == 2) {
            TH_CHECK(!memcmp(res[0], res[1], n * sizeof(float)), "comm hook fp16 != reduce_dtype f16");
            TH_CHECK(memcmp(res[0], res[2], n * sizeof(float)) != 0, "fp16 gave the f32 bits");
        }
    }
    for (int v = 0; v < 3; v++)
        free(res[v]);
    /* refused combinations */
    dt_model *m = mlp_model(3);
    dt_ddp *ddp = NULL;
    dt_ddp_params dp = dt_ddp_params_default();
    dp.comm_hook = DT_COMM_HOOK_FP16;
    dp.reduce_dtype = DT_BF16;
    TH_CHECK(dt_ddp_init(pg, m, &dp, &ddp) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "fp16"), "%s",
             dt_last_error());
    dp = dt_ddp_params_default();
    dp.comm_hook = DT_COMM_HOOK_POWERSGD;
    dp.reduce_dtype = DT_BF16;
    TH_CHECK(dt_ddp_init(pg, m, &dp, &ddp) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "powersgd"), "%s",
             dt_last_error());
    dp.reduce_dtype = DT_F32;
    dp.powersgd.rank = 0;
    TH_CHECK(dt_ddp_init(pg, m, &dp, &ddp) == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "rank"), "%s",
             dt_last_error());
    dp.powersgd.rank = 1;
    TH_OK(dt_ddp_init(pg, m, &dp, &ddp));
    TH_CHECK(dt_ddp_powersgd(ddp) != NULL, "no PowerSGD state");
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(ddp_selects_hook)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_ddp_select, NULL, NULL), 0);
}

/* ---- PowerSGD by hand ------------------------------------------------------------ */

/* Linear(3,4): weight [4,3], bias [4]; rank 1, min_compression_rate 1 (so
 * the 4x3 is compressed: (4+3)*1 < 12), start 0, Q preset to [1,0,0].
 * With u = [1,2,2,0], v = [2,1,2] (|u| = |v| = 3) and M_r = a_r u v^T,
 * a = (1, 3):
 *   step 0: P_r = M_r q = 2 a_r u; sum 8u; orthogonalised u/3.
 *           Q_r = M_r^T u/3 = 3 a_r v; sum/2 = 6v.  M = (u/3)(6v)^T = 2 u v^T.
 *           errors: rank 0: -u v^T, rank 1: +u v^T.
 *           bias_r = (r+1)[1,2,3,4]: averaged 1.5[1,2,3,4] (uncompressed);
 *           error_r = bias_r - 1.5[..] = -0.5[..], +0.5[..].
 *   step 1 (same gradients): x_0 = 0, x_1 = 4 u v^T; warm Q = 6v -> v/3;
 *           P: 0 and 12u -> u/3; Q: 0 and 12v, /2 -> 6v; M = 2 u v^T again;
 *           errors -2 u v^T, +2 u v^T; bias x = 0.5[..], 2.5[..] -> 1.5[..],
 *           errors -1[..], +1[..] (as in PyTorch, the error of an uncompressed
 *           tensor is the rank's deviation from the average; it sums to zero
 *           over the ranks, so the averages are unaffected). */
static int body_hand(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(3, 4, true));
    dt_model *m = t_build(net, 1);
    dt_powersgd_params pp = dt_powersgd_params_default();
    pp.min_compression_rate = 1;
    pp.start_iter = 0;
    eng e;
    TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_ALLREDUCE));
    TH_CHECK(dt_reducer_num_buckets(e.r) == 1, "%d buckets", dt_reducer_num_buckets(e.r));
    TH_OK(dt_powersgd_set_q(e.ps, 0, (const float[]){1, 0, 0}, 3));
    const float u[4] = {1, 2, 2, 0}, v[3] = {2, 1, 2}, a = rank == 0 ? 1.0f : 3.0f;
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < 3; j++)
                e.g[flat_at(m, (size_t)(i * 3 + j))] = a * u[i] * v[j];
            e.g[flat_at(m, (size_t)(12 + i))] = (float)(rank + 1) * (float)(i + 1);
        }
        TH_OK(eng_step(&e));
        const float *err;
        size_t en;
        TH_OK(dt_powersgd_error(e.ps, 0, &err, &en));
        const float sign = rank == 0 ? -1.0f : 1.0f;
        for (int i = 0; i < 4; i++) {
            for (int j = 0; j < 3; j++) {
                const size_t at = flat_at(m, (size_t)(i * 3 + j));
                const float want = 2.0f * u[i] * v[j], werr = sign * (float)(step + 1) * u[i] * v[j];
                TH_CHECK(fabsf(e.g[at] - want) <= 1e-5f, "step %d M[%d][%d] = %.8g, want %g", step, i, j, e.g[at],
                         want);
                TH_CHECK(fabsf(err[at] - werr) <= 1e-5f, "step %d error[%d][%d] = %.8g, want %g", step, i, j,
                         err[at], werr);
            }
            const size_t at = flat_at(m, (size_t)(12 + i));
            TH_CHECK(e.g[at] == 1.5f * (float)(i + 1), "step %d bias[%d] = %.8g, want %g", step, i, e.g[at],
                     1.5 * (i + 1));
            TH_CHECK(err[at] == sign * 0.5f * (float)(step + 1) * (float)(i + 1), "step %d bias error[%d] = %.8g", step,
                     i, err[at]);
        }
    }
    uint64_t before, after;
    dt_powersgd_stats(e.ps, &before, &after);
    TH_CHECK(before == 2 * 16 && after == 2 * (4 + 4 + 3), "stats %llu -> %llu", (unsigned long long)before,
             (unsigned long long)after);
    eng_free(&e);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(powersgd_hand)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_hand, NULL, NULL), 0);
}

/* ---- PowerSGD against PyTorch ---------------------------------------------------- */

typedef struct {
    const char *name;
    int rank;
    int64_t start;
    bool ef, warm;
    uint64_t seed;
    int steps;
    const float *out, *err0, *err1;
} ref_case;

static const ref_case k_refs[] = {
    {"ef_warm_r2", 2, 2, true, true, 0, 5, ref_ef_warm_r2_out, ref_ef_warm_r2_err0, ref_ef_warm_r2_err1},
    {"plain_r1", 1, 0, false, false, 7, 3, ref_plain_r1_out, ref_plain_r1_err0, ref_plain_r1_err1},
    {"ef_warm_r3", 3, 2, true, true, 3, 4, ref_ef_warm_r3_out, ref_ef_warm_r3_err0, ref_ef_warm_r3_err1},
};

static int body_torch(int rank, int W, void *arg)
{
    const ref_case *c = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = ref_model();
    TH_CHECK(m && t_numel(m) >= REF_N, "model: %s", dt_last_error());
    dt_powersgd_params pp = dt_powersgd_params_default();
    pp.rank = c->rank;
    pp.start_iter = c->start;
    pp.min_compression_rate = 1;
    pp.use_error_feedback = c->ef;
    pp.warm_start = c->warm;
    pp.random_seed = c->seed;
    eng e;
    TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_ALLREDUCE));
    TH_CHECK(dt_reducer_num_buckets(e.r) == 1, "%d buckets", dt_reducer_num_buckets(e.r));
    double worst = 0;
    for (int t = 0; t < c->steps; t++) {
        for (int i = 0; i < REF_N; i++)
            e.g[flat_at(m, (size_t)i)] = ref_g(rank, t, i);
        TH_OK(eng_step(&e));
        for (int i = 0; i < REF_N; i++) {
            const float got = e.g[flat_at(m, (size_t)i)], want = c->out[t * REF_N + i];
            const double d = fabs((double)got - want) / (1.0 + fabs((double)want));
            worst = d > worst ? d : worst;
            TH_CHECK(d <= 2e-5, "%s step %d element %d: %.8g, torch %.8g", c->name, t, i, got, want);
        }
    }
    if (c->ef) {
        const float *err, *want = rank == 0 ? c->err0 : c->err1;
        size_t en;
        TH_OK(dt_powersgd_error(e.ps, 0, &err, &en));
        for (int i = 0; i < REF_N; i++) {
            const float got = err[flat_at(m, (size_t)i) - flat_at(m, 0)];
            TH_CHECK(fabs((double)got - want[i]) <= 2e-5 * (1.0 + fabs((double)want[i])),
                     "%s error element %d: %.8g, torch %.8g", c->name, i, got, want[i]);
        }
    } else {
        const float *err;
        size_t en;
        TH_CHECK(dt_powersgd_error(e.ps, 0, &err, &en) == DT_ERR_RANGE, "error memory without error feedback");
    }
    if (rank == 0)
        printf("  %s: largest relative difference from torch %.2g\n", c->name, worst);
    eng_free(&e);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(powersgd_vs_torch)
{
    for (size_t k = 0; k < sizeof k_refs / sizeof k_refs[0]; k++)
        ASSERT_EQ_INT(th_run(2, 60.0, body_torch, (void *)&k_refs[k], NULL), 0);
}

/* ---- properties ------------------------------------------------------------------ */

/* Error feedback: sum_t out_t + mean_i error_i,T = sum_t mean_i g_i,t, up to
 * f32 rounding (bound: 1e-4 (1 + sum_t |mean g_t|) per element), over 20
 * steps at rank 1 and 3 ranks. Two engines run the same gradients: PowerSGD
 * and the plain all-reduce (the exact mean). Also: before start_iter = 3 the
 * PowerSGD engine gives the plain all-reduce's bits; from step 3 it differs;
 * 1-d tensors and the 4x3 matrices (too small at rate 2) are always exact
 * averages; the P/Q draws are identical on every rank (the outputs agree
 * bit for bit across ranks). */
static int body_props(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = ref_model();
    dt_powersgd_params pp = dt_powersgd_params_default();
    pp.start_iter = 3;
    eng e, ref;
    TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_ALLREDUCE));
    TH_OK(eng_init(&ref, pg, m, NULL, DT_F32, DT_REDUCER_ALLREDUCE));
    const int T = 20;
    double sum_out[REF_N] = {0}, sum_mean[REF_N] = {0}, sum_abs[REF_N] = {0};
    /* which elements are exact averages: 1-d tensors and the [4,3]s */
    bool exact[REF_N];
    for (int i = 0; i < REF_N; i++)
        exact[i] = i < 16 || (i >= 48 + 16 && i < 48 + 16 + 8 + 12) || i >= REF_N - 5;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < REF_N; i++)
            e.g[flat_at(m, (size_t)i)] = ref.g[flat_at(m, (size_t)i)] = ref_g(rank, t, i) + 0.25f * (float)(i % 5);
        TH_OK(eng_step(&e));
        TH_OK(eng_step(&ref));
        bool same = true;
        for (int i = 0; i < REF_N; i++) {
            const size_t at = flat_at(m, (size_t)i);
            same = same && e.g[at] == ref.g[at];
            if (exact[i])
                TH_CHECK(fabsf(e.g[at] - ref.g[at]) <= 1e-5f * (1 + fabsf(ref.g[at])),
                         "step %d element %d (uncompressed) %.8g != mean %.8g", t, i, e.g[at], ref.g[at]);
            sum_out[i] += e.g[at];
            sum_mean[i] += ref.g[at];
            sum_abs[i] += fabs(ref.g[at]);
        }
        if (t < 3)
            TH_CHECK(same, "step %d before start_iter differs from the plain all-reduce", t);
        else
            TH_CHECK(!same, "step %d: PowerSGD gave the plain all-reduce's bits", t);
        /* every rank holds the same bits */
        float chk[2] = {e.g[flat_at(m, 20)], e.g[flat_at(m, 100)]}, mx[2];
        memcpy(mx, chk, sizeof mx);
        TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, mx, 2, DT_F32, DT_REDUCE_MAX));
        TH_CHECK(!memcmp(chk, mx, sizeof mx), "step %d: ranks disagree", t);
    }
    const float *err;
    size_t en;
    TH_OK(dt_powersgd_error(e.ps, 0, &err, &en));
    float *me = malloc(en * sizeof *me);
    memcpy(me, err, en * sizeof *me);
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, me, en, DT_F32, DT_REDUCE_AVG));
    double worst = 0, errmax = 0;
    for (int i = 0; i < REF_N; i++) {
        const double e_i = me[flat_at(m, (size_t)i) - flat_at(m, 0)];
        const double d = fabs(sum_out[i] + e_i - sum_mean[i]);
        TH_CHECK(d <= 1e-4 * (1 + sum_abs[i]), "element %d: sum of updates %.8g + mean error %.8g != sum of means %.8g",
                 i, sum_out[i], e_i, sum_mean[i]);
        worst = d > worst ? d : worst;
        errmax = fabs(e_i) > errmax ? fabs(e_i) : errmax;
    }
    if (rank == 0)
        printf("  error feedback: |sum out + mean error - sum mean| <= %.2g; |mean error| <= %.3g after %d steps\n",
               worst, errmax, T);
    free(me);
    eng_free(&e);
    eng_free(&ref);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(powersgd_properties)
{
    ASSERT_EQ_INT(th_run(3, 60.0, body_props, NULL, NULL), 0);
}

/* Two runs from the same start give the same bits (random Q draws without
 * warm start included). */
static int body_determinism(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = ref_model();
    float *first = NULL;
    for (int run = 0; run < 2; run++) {
        dt_powersgd_params pp = dt_powersgd_params_default();
        pp.start_iter = 1;
        pp.rank = 2;
        pp.warm_start = false;
        pp.random_seed = 5;
        eng e;
        TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_ALLREDUCE));
        for (int t = 0; t < 4; t++) {
            for (int i = 0; i < REF_N; i++)
                e.g[flat_at(m, (size_t)i)] = ref_g(rank, t, i);
            TH_OK(eng_step(&e));
        }
        if (run == 0) {
            first = malloc(e.n * sizeof *first);
            memcpy(first, e.g, e.n * sizeof *first);
        } else {
            TH_CHECK(!memcmp(first, e.g, e.n * sizeof *first), "two runs differ");
        }
        eng_free(&e);
    }
    free(first);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(powersgd_determinism)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_determinism, NULL, NULL), 0);
}

/* ---- a user hook with stages ------------------------------------------------------- */

/* post: SUM all-reduce of the bucket; then 1: divide by W and post a second
 * (1-float) all-reduce; then 2: done. The log shows the engine's order:
 * every post in bucket order, then round 1 in bucket order, then round 2. */
typedef struct {
    int log[64], n;
    float scratch[8][1];
    int stage[8];
    uint64_t step;
    int bad_layout;
} staged_state;

static dt_status staged_post(void *st, dt_pg *pg, const dt_grad_bucket *b, dt_req **req)
{
    staged_state *s = st;
    s->log[s->n++] = b->index;
    s->stage[b->index] = 1;
    s->step = b->step;
    /* one parameter per bucket here: its shape and place */
    if (b->nparams != 1 || b->params[0].offset != 0 || b->params[0].numel > b->numel || b->nbuckets != 7)
        s->bad_layout++;
    size_t numel = 1;
    for (int d = 0; d < b->params[0].ndim; d++)
        numel *= (size_t)b->params[0].shape[d];
    if (numel != b->params[0].numel)
        s->bad_layout++;
    return dt_pg_allreduce_async(pg, DT_IN_PLACE, b->data, b->numel, DT_F32, DT_REDUCE_SUM, req);
}

static dt_status staged_then(void *st, dt_pg *pg, const dt_grad_bucket *b, dt_req **req)
{
    staged_state *s = st;
    s->log[s->n++] = 100 * s->stage[b->index] + b->index;
    if (s->stage[b->index]++ == 1) {
        for (size_t i = 0; i < b->numel; i++)
            b->data[i] /= (float)dt_pg_size(pg);
        s->scratch[b->index][0] = (float)b->index;
        return dt_pg_allreduce_async(pg, DT_IN_PLACE, s->scratch[b->index], 1, DT_F32, DT_REDUCE_SUM, req);
    }
    *req = NULL;
    return DT_OK;
}

static int body_staged(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = ref_model();
    eng e;
    memset(&e, 0, sizeof e);
    e.m = m;
    e.n = t_numel(m);
    e.g = calloc(e.n, sizeof *e.g);
    dt_flat gf;
    TH_OK(dt_flat_wrap(&gf, DT_F32, e.g, e.n));
    dt_reducer_params p = dt_reducer_params_default();
    p.bucket_cap_mb = p.first_bucket_mb = 1e-9; /* a bucket per tensor */
    TH_OK(dt_reducer_init(pg, m, &gf, &p, &e.r));
    TH_CHECK(dt_reducer_num_buckets(e.r) == 7, "%d buckets", dt_reducer_num_buckets(e.r));
    staged_state s;
    memset(&s, 0, sizeof s);
    const dt_comm_hook h = {.name = "staged", .post = staged_post, .then = staged_then};
    TH_OK(dt_reducer_register_comm_hook(e.r, &h, &s));
    for (int it = 0; it < 3; it++) {
        s.n = 0;
        for (int i = 0; i < REF_N; i++)
            e.g[flat_at(m, (size_t)i)] = ref_g(rank, it, i);
        TH_OK(eng_step(&e));
        TH_CHECK(s.step == (uint64_t)it, "iteration %d: the hook saw step %llu", it, (unsigned long long)s.step);
        TH_CHECK(s.n == 21 && !s.bad_layout, "iteration %d: %d hook calls, %d layout errors", it, s.n, s.bad_layout);
        for (int k = 0; k < 7; k++)
            TH_CHECK(s.log[k] == k && s.log[7 + k] == 100 + k && s.log[14 + k] == 200 + k,
                     "iteration %d: call order %d %d %d at bucket %d", it, s.log[k], s.log[7 + k], s.log[14 + k], k);
        for (int k = 0; k < 7; k++)
            TH_CHECK(s.scratch[k][0] == (float)(k * W), "stage 2 of bucket %d: %g", k, s.scratch[k][0]);
        for (int i = 0; i < REF_N; i++) {
            double want = 0;
            for (int q = 0; q < W; q++)
                want += ref_g(q, it, i);
            want /= W;
            TH_CHECK(fabs(e.g[flat_at(m, (size_t)i)] - want) <= 1e-6, "element %d: %g, want %g", i,
                     e.g[flat_at(m, (size_t)i)], want);
        }
    }
    /* registering while reductions are outstanding is refused */
    dt_reducer_begin(e.r);
    for (size_t k = 0; k < dt_model_num_entries(m); k++)
        TH_OK(dt_reducer_grad_ready(e.r, k));
    TH_CHECK(dt_reducer_register_comm_hook(e.r, NULL, NULL) == DT_ERR_STATE, "re-registered in flight");
    TH_OK(dt_reducer_finish(e.r));
    TH_OK(dt_reducer_wait(e.r));
    eng_free(&e);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(user_hook_stages)
{
    for (int W = 2; W <= 3; W++)
        ASSERT_EQ_INT(th_run(W, 60.0, body_staged, NULL, NULL), 0);
}

/* ---- errors and the hook API -------------------------------------------------------- */

static int body_bad(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = ref_model();
    dt_powersgd_params pp = dt_powersgd_params_default();
    pp.start_iter = 0;
    eng e;
    /* a reduce-scatter engine: PowerSGD refuses at the first post (every rank) */
    TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_REDUCE_SCATTER));
    dt_status st = eng_step(&e);
    TH_CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "reduce-scatter"), "%s: %s", dt_status_name(st),
             dt_last_error());
    dt_reducer_drain(e.r);
    eng_free(&e);
    /* a Q preset of the wrong size */
    TH_OK(eng_init(&e, pg, m, &pp, DT_F32, DT_REDUCER_ALLREDUCE));
    TH_OK(dt_powersgd_set_q(e.ps, 0, (const float[]){1, 2}, 2));
    st = eng_step(&e);
    TH_CHECK(st == DT_ERR_MISMATCH && strstr(dt_last_error(), "preset"), "%s: %s", dt_status_name(st),
             dt_last_error());
    dt_reducer_drain(e.r);
    eng_free(&e);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(powersgd_bad_input)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_bad, NULL, NULL), 0);
    dt_powersgd *s = NULL;
    dt_powersgd_params p = dt_powersgd_params_default();
    p.start_iter = -1;
    ASSERT_STATUS(dt_powersgd_init(&p, &s), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "start_iter");
    p = dt_powersgd_params_default();
    p.min_compression_rate = -1;
    ASSERT_STATUS(dt_powersgd_init(&p, &s), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_powersgd_init(NULL, &s));
    const float *err;
    size_t n;
    ASSERT_STATUS(dt_powersgd_error(s, 0, &err, &n), DT_ERR_RANGE);
    dt_powersgd_free(s);
    dt_powersgd_free(NULL);
    const dt_comm_hook nopost = {.name = "broken", .post = NULL, .then = NULL};
    dt_pg *pg;
    dt_pg_params pp = dt_pg_params_default();
    pp.rank = 0, pp.world_size = 1, pp.backend = "self";
    ASSERT_OK(dt_pg_init(&pp, &pg));
    dt_model *m = ref_model();
    eng e;
    ASSERT_OK(eng_init(&e, pg, m, NULL, DT_F32, DT_REDUCER_ALLREDUCE));
    ASSERT_STATUS(dt_reducer_register_comm_hook(e.r, &nopost, NULL), DT_ERR_INVALID_ARG);
    eng_free(&e);
    dt_model_free(m);
    dt_pg_free(pg);
}

TEST(names_and_env)
{
    dt_comm_hook_kind k = DT_COMM_HOOK_ALLREDUCE;
    for (int i = 0; i < DT_COMM_HOOK_COUNT; i++) {
        ASSERT_OK(dt_comm_hook_parse(dt_comm_hook_name((dt_comm_hook_kind)i), &k));
        ASSERT_EQ_INT((int)k, i);
    }
    ASSERT_STATUS(dt_comm_hook_parse("fp8", &k), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "powersgd");
    dt_powersgd_params p = dt_powersgd_params_default();
    k = DT_COMM_HOOK_ALLREDUCE;
    unsetenv("AIAK_FP16_COMPRESSION");
    unsetenv("AIAK_POWERSGD_COMPRESSION");
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    unsetenv("AIAK_START_COMPRESS_ITER");
    ASSERT_OK(dt_comm_hook_env(&k, &p));
    ASSERT_EQ_INT((int)k, DT_COMM_HOOK_ALLREDUCE);
    ASSERT_EQ_INT(p.rank, 1);
    ASSERT_EQ_INT((int)p.start_iter, 1000);
    setenv("AIAK_POWERSGD_COMPRESSION", "1", 1);
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "4", 1);
    setenv("AIAK_START_COMPRESS_ITER", "10", 1);
    ASSERT_OK(dt_comm_hook_env(&k, &p));
    ASSERT_EQ_INT((int)k, DT_COMM_HOOK_POWERSGD);
    ASSERT_EQ_INT(p.rank, 4);
    ASSERT_EQ_INT((int)p.start_iter, 10);
    setenv("AIAK_FP16_COMPRESSION", "1", 1);
    ASSERT_STATUS(dt_comm_hook_env(&k, &p), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_FP16_COMPRESSION");
    setenv("AIAK_POWERSGD_COMPRESSION", "0", 1);
    k = DT_COMM_HOOK_ALLREDUCE;
    ASSERT_OK(dt_comm_hook_env(&k, &p));
    ASSERT_EQ_INT((int)k, DT_COMM_HOOK_FP16);
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "0", 1);
    ASSERT_STATUS(dt_comm_hook_env(&k, &p), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_MATRIX_APPROXIMATION_RANK");
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "1", 1);
    setenv("AIAK_START_COMPRESS_ITER", "soon", 1);
    ASSERT_STATUS(dt_comm_hook_env(&k, &p), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "AIAK_START_COMPRESS_ITER");
    unsetenv("AIAK_FP16_COMPRESSION");
    unsetenv("AIAK_POWERSGD_COMPRESSION");
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    unsetenv("AIAK_START_COMPRESS_ITER");
}

int main(void)
{
    RUN(fp16_bf16_hand);
    RUN(ddp_selects_hook);
    RUN(powersgd_hand);
    RUN(powersgd_vs_torch);
    RUN(powersgd_properties);
    RUN(powersgd_determinism);
    RUN(user_hook_stages);
    RUN(powersgd_bad_input);
    RUN(names_and_env);
    return TEST_REPORT();
}
