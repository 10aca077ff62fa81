/* ZeRO stages 1-3 and DDP with bf16/fp16 parameters (parallel.h, "Mixed
 * precision"), real processes, 2 ranks: every stage trained in bf16 holds
 * the parameters DDP in bf16 holds (bound stated per case); the model-state
 * bytes per rank follow the mixed-precision ZeRO formula (2 + 2 + 12 bytes
 * per parameter for AdamW, the sharded parts / N); a model with f32 and
 * bf16 parameters (the policy's per-module f32 list) makes one unit per
 * dtype and reduces the f32 unit in f32; reduce_dtype f32 over bf16
 * parameters; fp16 with a forced overflow on one rank skips the step on
 * every rank and leaves the state as it was. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "dtrain/kernels.h"
#include "test.h"

enum { STEPS = 3, MB = 3 };

/* Linear(8,16) ReLU Linear(16,5) ReLU Linear(5,4) in `dt`; f32_mid keeps
 * the middle Linear ("2") f32 through the per-module list. */
static dt_model *lp_model(uint64_t seed, dt_dtype dt, bool f32_mid)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(16, 5, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(5, 4, true));
    static const char *const mid[] = {"2", NULL};
    dt_model_build_params bp = dt_model_build_params_default();
    bp.param_dtype = dt;
    bp.f32_modules = f32_mid ? mid : NULL;
    dt_model *m = NULL;
    return dt_model_build(net, seed, &bp, &m) < 0 ? NULL : m;
}

/* Every parameter of m widened to f32, in entry order, into out (room for
 * dt_model_param_count floats). */
static void params_f32(const dt_model *m, float *out)
{
    size_t k = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info e;
        dt_model_entry(m, i, &e);
        if (e.is_buffer || e.tied_to >= 0)
            continue;
        const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, e.dtype);
        dt_k_convert(dt_flat_ptr(P, e.offset), e.dtype, out + k, DT_F32, (int64_t)e.numel);
        k += e.numel;
    }
}

typedef struct {
    int stage;           /* 1-3 */
    dt_dtype dt;         /* parameter dtype */
    bool f32_mid;        /* the middle Linear kept f32 */
    dt_dtype reduce;     /* the policy's reduce dtype (DT_DTYPE_UNSET: inherit) */
    const char *wrap;    /* wrap_module_type, NULL: one (root) unit per dtype */
    double tol;          /* bound on max |a - b| / (1 + |b|) against DDP; 0: bit-identical */
} mcase;

static dt_trainer_params mparams(const mcase *c)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 0.01;
    tp.no_decay_1d = true;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.precision.param_dtype = c->dt;
    tp.precision.reduce_dtype = c->reduce;
    return tp;
}

static int train(dt_trainer *tr, int rank, int W, double *losses)
{
    for (int s = 0; s < STEPS; s++) {
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, &k_mlp_data, ((int64_t)s * W + rank) * MB, MB, 1, (int64_t)W * MB, &r));
        TH_CHECK(!r.skipped && isfinite(r.loss), "step %d", s);
        losses[s] = r.loss;
    }
    return 0;
}

/* The reference: DDP with the same bf16/f16 parameters, reducing in that
 * dtype; for f32_mid (two parameter dtypes) DDP's two reducers: the bf16
 * gradients in bf16, the f32 ones in f32, as ZeRO's two root units. */
static int body_equiv(int rank, int W, void *arg)
{
    const mcase *c = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_trainer_params tp = mparams(c);
    double lref[STEPS], lgot[STEPS];
    dt_model *ref = lp_model(21, c->dt, c->f32_mid);
    TH_CHECK(ref, "model");
    dt_strategy *s;
    dt_trainer *tr;
    {
        dt_ddp_params dp = dt_ddp_params_default();
        dp.reduce_dtype = c->dt;
        dt_trainer_params tr_ref = tp;
        tr_ref.precision.reduce_dtype = DT_DTYPE_UNSET; /* DDP reduces bf16/f16 parameters in their dtype */
        TH_OK(dt_strategy_ddp_init(pg, &dp, &s));
        TH_OK(dt_trainer_init(ref, s, &tr_ref, &tr));
        if (train(tr, rank, W, lref))
            return 1;
        if (c->f32_mid) /* one reducer per parameter dtype */
            TH_CHECK(dt_ddp_num_buckets(dt_strategy_ddp(dt_trainer_strategy(tr))) == 2, "DDP buckets: %d",
                     dt_ddp_num_buckets(dt_strategy_ddp(dt_trainer_strategy(tr))));
    }
    dt_trainer_free(tr);
    dt_model *m = lp_model(21, c->dt, c->f32_mid);
    TH_CHECK(m, "model");
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = c->stage;
    zp.wrap_module_type = c->wrap;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    if (train(tr, rank, W, lgot))
        return 1;
    dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
    TH_OK(dt_zero_full_params(z, NULL));
    const size_t n = dt_model_param_count(m);
    float *got = calloc(n, sizeof *got), *want = calloc(n, sizeof *want), *init = calloc(n, sizeof *init);
    params_f32(m, got);
    params_f32(ref, want);
    dt_model *m0 = lp_model(21, c->dt, c->f32_mid);
    params_f32(m0, init);
    dt_model_free(m0);
    double d = max_rel_diff(got, want, n);
    TH_CHECK(d <= c->tol, "stage %d %s: max rel diff %g to the reference > %g", c->stage, dt_dtype_name(c->dt), d,
             c->tol);
    for (int k = 0; k < STEPS; k++)
        TH_CHECK(fabs(lgot[k] - lref[k]) <= 1e-2 * (1 + fabs(lref[k])) || (c->tol == 0 && lgot[k] == lref[k]),
                 "step %d loss %g vs %g", k, lgot[k], lref[k]);
    TH_CHECK(max_rel_diff(got, init, n) > 1e-3, "parameters did not move");

    /* the units: one dtype each; f32_mid with the root unit makes two */
    int nlow = 0, nf32 = 0;
    size_t T2 = 0, T4 = 0; /* padded elements of the 2-byte and the f32 units */
    for (int k = 0; k < dt_zero_num_units(z); k++) {
        dt_zero_unit_info ui;
        TH_OK(dt_zero_unit(z, k, &ui));
        const bool low = ui.dtype != DT_F32;
        TH_CHECK(ui.dtype == (c->f32_mid && (!strcmp(ui.name, "2") || !strcmp(ui.name, "<root>")) ? DT_F32 : c->dt),
                 "unit '%s' is %s", ui.name, dt_dtype_name(ui.dtype));
        /* the policy's reduce dtype, except the f32 unit of a mixed model: f32 */
        const dt_dtype wr = !low && c->f32_mid ? DT_F32 : c->reduce == DT_DTYPE_UNSET ? c->dt : c->reduce;
        TH_CHECK(ui.reduce_dtype == wr, "unit '%s' reduces in %s", ui.name, dt_dtype_name(ui.reduce_dtype));
        if (low) {
            nlow++;
            T2 += ui.total;
        } else {
            nf32++;
            T4 += ui.total;
        }
    }
    if (c->f32_mid && !c->wrap) /* the root split in two: "<root>" (f32) and "<root>/bf16" */
        TH_CHECK(nlow == 1 && nf32 == 1 && dt_zero_num_units(z) == 2, "units: %d low, %d f32", nlow, nf32);
    if (c->f32_mid && c->wrap) /* one per Linear: "0", "2" (f32), "4" */
        TH_CHECK(nlow == 2 && nf32 == 1, "units: %d low, %d f32", nlow, nf32);
    /* model-state bytes per rank (AdamW): 2-byte units: parameters 2T (stage
     * 3: 2T/W), gradients 2T (stage 1) or 2T/W in the reduce dtype's size,
     * fp32 masters 4T/W and two moments 8T/W; f32 units: 4 + 4 + 8 */
    dt_trainer_memory mem;
    TH_OK(dt_trainer_memory_get(tr, &mem));
    const size_t rs2 = c->reduce == DT_F32 ? 4 : 2;
    size_t wp = c->stage < 3 ? 2 * T2 + 4 * T4 : (2 * T2 + 4 * T4) / (size_t)W;
    size_t wg = c->stage == 1 ? 2 * T2 + 4 * T4 + (rs2 == 4 ? 4 * T2 : 0) : (rs2 * T2 + 4 * T4) / (size_t)W;
    TH_CHECK(mem.param_bytes == wp, "stage %d params %zu, want %zu", c->stage, mem.param_bytes, wp);
    TH_CHECK(mem.grad_bytes == wg, "stage %d grads %zu, want %zu", c->stage, mem.grad_bytes, wg);
    TH_CHECK(mem.master_bytes == 4 * T2 / (size_t)W, "masters %zu, want %zu", mem.master_bytes, 4 * T2 / (size_t)W);
    TH_CHECK(mem.optim_bytes == 8 * (T2 + T4) / (size_t)W, "optimizer %zu, want %zu", mem.optim_bytes,
             8 * (T2 + T4) / (size_t)W);
    if (!c->f32_mid && c->reduce != DT_F32) /* the mixed-precision formula: 2 + 2 + 12 */
        TH_CHECK(mem.param_bytes + mem.grad_bytes + mem.master_bytes + mem.optim_bytes ==
                     (c->stage == 1 ? 4 * T2 + 12 * T2 / 2 : c->stage == 2 ? 2 * T2 + 14 * T2 / 2 : 16 * T2 / 2),
                 "stage %d: total %zu", c->stage,
                 mem.param_bytes + mem.grad_bytes + mem.master_bytes + mem.optim_bytes);
    free(got);
    free(want);
    free(init);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

static void run_case(mcase c)
{
    int rc = th_run(2, 60.0, body_equiv, &c, NULL);
    if (rc)
        fprintf(stderr, "case stage %d %s f32_mid %d reduce %s wrap %s failed\n", c.stage, dt_dtype_name(c.dt),
                c.f32_mid, c.reduce == DT_DTYPE_UNSET ? "-" : dt_dtype_name(c.reduce), c.wrap ? c.wrap : "-");
    ASSERT_EQ_INT(rc, 0);
}

/* ZeRO 1/2/3 in bf16 and fp16 against DDP in the same dtype: the same
 * element-wise operations (bf16 gradients averaged by the collective with
 * f32 accumulation and rounded once, AdamW on fp32 masters, rounded into
 * the parameters), so the parameters are bit-identical. */
TEST(stages_equal_ddp_lowp)
{
    for (int stage = 1; stage <= 3; stage++) {
        run_case((mcase){.stage = stage, .dt = DT_BF16, .reduce = DT_DTYPE_UNSET, .wrap = "Linear", .tol = 0});
        run_case((mcase){.stage = stage, .dt = DT_F16, .reduce = DT_DTYPE_UNSET, .wrap = NULL, .tol = 0});
    }
}

/* A model with an f32 Linear among bf16 ones: one unit per dtype (the root
 * split in two), the f32 unit reduced in f32; stages 2 and 3 against stage
 * 1 with the root units: bit-identical. reduce_dtype f32 over bf16
 * parameters (FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=f32)):
 * the reference DDP reduces in bf16, so the bound is bf16's rounding of
 * the averaged gradients moving AdamW's steps: 3 steps of lr 0.01, each
 * element at most 3 * lr apart -> 0.05 relative. */
TEST(mixed_units_and_f32_reduce)
{
    for (int stage = 2; stage <= 3; stage++)
        run_case((mcase){.stage = stage, .dt = DT_BF16, .f32_mid = true, .reduce = DT_DTYPE_UNSET, .tol = 0});
    run_case((mcase){.stage = 3, .dt = DT_BF16, .f32_mid = true, .reduce = DT_DTYPE_UNSET, .wrap = "Linear", .tol = 0});
    run_case((mcase){.stage = 2, .dt = DT_BF16, .reduce = DT_F32, .wrap = "Linear", .tol = 0.05});
}

/* fp16, ZeRO-2: rank 1 trains on a batch whose gradients overflow, rank 0
 * on a clean one; the flag is reduced across the ranks (ShardedGradScaler),
 * so both skip, keep their masters, moments, step count and shards, and
 * both halve the scale (hysteresis 1). */
static int body_overflow(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    mcase c = {.stage = 2, .dt = DT_F16, .reduce = DT_DTYPE_UNSET};
    dt_trainer_params tp = mparams(&c);
    tp.use_scaler = true;
    tp.scaler.hysteresis = 1;
    dt_model *m = lp_model(5, DT_F16, false);
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = 2;
    zp.wrap_module_type = "Linear";
    dt_strategy *s;
    dt_trainer *tr;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    dt_trainer_metrics r;
    TH_OK(trainer_step_on(tr, &k_mlp_data, rank * 6, 6, 1, 0, &r));
    TH_CHECK(!r.skipped && r.loss_scale == 65536, "first step skipped, scale %g", r.loss_scale);
    dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
    size_t np = 0;
    TH_OK(dt_zero_pieces(z, NULL, 0, &np));
    dt_zero_piece pc[16];
    TH_CHECK(np <= 16, "%zu pieces", np);
    TH_OK(dt_zero_pieces(z, pc, 16, &np));
    /* the state before: masters and the first moment of every piece */
    float before[4096], after[4096];
    size_t k = 0;
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < pc[i].hi - pc[i].lo && k < 2048; j++) {
            float *mom;
            size_t nm;
            TH_OK(dt_optim_state(dt_trainer_optim(tr), pc[i].range, 0, NULL, &mom, &nm));
            before[k++] = pc[i].param[j];
            before[k++] = mom[pc[i].range_offset + j];
        }
    float x[48];
    int64_t y[6];
    for (int i = 0; i < 48; i++)
        x[i] = 3.0e4f * (float)((i % 7) - 3); /* f16-representable, gradients far past 65504 */
    for (int i = 0; i < 6; i++)
        y[i] = i % 4;
    dt_trainer_batch bad = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){6, 8}, y, DT_I64, 1, (int64_t[]){6});
    if (rank == 1)
        TH_OK(dt_trainer_step(tr, &bad, 1, &r));
    else
        TH_OK(trainer_step_on(tr, &k_mlp_data, 100, 6, 1, 0, &r));
    TH_CHECK(r.skipped, "rank %d did not skip", rank);
    TH_CHECK(r.skipped_steps == 1 && dt_trainer_steps(tr) == 1, "skipped %lld, steps %lld",
             (long long)r.skipped_steps, (long long)dt_trainer_steps(tr));
    TH_CHECK(dt_loss_scaler_scale(dt_trainer_loss_scaler(tr)) == 32768, "scale %g",
             dt_loss_scaler_scale(dt_trainer_loss_scaler(tr)));
    k = 0;
    for (size_t i = 0; i < np; i++)
        for (size_t j = 0; j < pc[i].hi - pc[i].lo && k < 2048; j++) {
            float *mom;
            size_t nm;
            TH_OK(dt_optim_state(dt_trainer_optim(tr), pc[i].range, 0, NULL, &mom, &nm));
            after[k++] = pc[i].param[j];
            after[k++] = mom[pc[i].range_offset + j];
        }
    TH_CHECK(!memcmp(before, after, k * sizeof *before), "rank %d: a skipped step changed the state", rank);
    TH_OK(trainer_step_on(tr, &k_mlp_data, 200 + rank * 6, 6, 1, 0, &r));
    TH_CHECK(!r.skipped && dt_trainer_steps(tr) == 2, "the step after the skip");
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(fp16_overflow_skips_on_every_rank)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_overflow, NULL, NULL), 0);
}

/* DDP refuses what it cannot reduce, with a message naming it; a model of
 * bf16 and f32 parameters it takes (a reducer per dtype), unless PowerSGD
 * would compress its bf16 gradients. */
static int body_ddp_refusals(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = lp_model(3, DT_BF16, true);
    dt_ddp *d = NULL;
    dt_ddp_params mp = dt_ddp_params_default();
    mp.reduce_dtype = DT_BF16;
    TH_OK(dt_ddp_init(pg, m, &mp, &d));
    TH_CHECK(dt_ddp_num_buckets(d) == 2, "buckets %d (one per dtype)", dt_ddp_num_buckets(d));
    dt_ddp_free(d);
    d = NULL;
    mp = dt_ddp_params_default();
    mp.comm_hook = DT_COMM_HOOK_POWERSGD;
    TH_CHECK(dt_ddp_init(pg, m, &mp, &d) == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "powersgd"),
             "powersgd over bf16: %s", dt_last_error());
    dt_model_free(m);
    m = lp_model(3, DT_BF16, false);
    dt_ddp_params dp = dt_ddp_params_default(); /* reduce_dtype f32 */
    TH_CHECK(dt_ddp_init(pg, m, &dp, &d) == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "reduce_dtype is f32"),
             "bf16 with f32 reduce: %s", dt_last_error());
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(ddp_refusals)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_ddp_refusals, NULL, NULL), 0);
}

int main(void)
{
    RUN(stages_equal_ddp_lowp);
    RUN(mixed_units_and_f32_reduce);
    RUN(fp16_overflow_skips_on_every_rank);
    RUN(ddp_refusals);
    return TEST_REPORT();
}
