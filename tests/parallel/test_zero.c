/* ZeRO stages 1-3 / FSDP (parallel.h) through the trainer, real processes:
 * after k steps every stage and strategy holds the parameters DDP holds
 * (world sizes 2, 3, 4; SGD and AdamW; parameter counts not divisible by
 * the world size; gradient accumulation; clipping by the global norm over
 * shards; stage 3 with every prefetch mode, forward prefetch, a lazily
 * built (meta) model, and with resident small parameters). Also the model
 * state bytes against the ZeRO formula, the units a wrap policy makes, FSDP's
 * names, a unit skipped on one rank, and stage 3's page pool. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "dtrain/config.h"
#include "test.h"

#include <sys/mman.h>
#include <unistd.h>

typedef struct {
    int stage;                 /* 0: FSDP NO_SHARD (= DDP through dt_strategy_fsdp_init) */
    dt_optim_kind opt;
    int accum;
    double clip;
    const char *wrap;          /* wrap_module_type */
    size_t wrap_min;
    dt_backward_prefetch bp;
    bool fwd_prefetch;
    bool meta;
    bool reshard;
    size_t persist;            /* param_persistence_threshold */
    int hybrid;                /* hybrid_shard_size */
    bool tie;                  /* the tied model (ztied) instead of zmodel */
    bool allreduce;            /* stage 1 with reduce_scatter off (all-reduce, then slice) */
    bool exact;                /* expect bit-identical parameters */
    double tol;                /* else this relative bound */
} zcase;

enum { STEPS = 3, MB = 3 };

/* Linear(dims[0], dims[1]) ReLU Linear(dims[1], dims[2]) ... Linear(.., dims[n-1]),
 * biased, built by seed (meta: specs only). */
static dt_model *zchain(uint64_t seed, bool meta, const int64_t *dims, int n)
{
    dt_module *net = dt_nn_seq(0, NULL);
    for (int i = 0; i + 1 < n; i++) {
        if (i)
            dt_nn_add(net, NULL, dt_nn_relu());
        dt_nn_add(net, NULL, dt_nn_linear(dims[i], dims[i + 1], true));
    }
    dt_model_build_params bp = dt_model_build_params_default();
    bp.meta = meta;
    dt_model *m = NULL;
    return dt_model_build(net, seed, &bp, &m) < 0 ? NULL : m;
}

/* A model whose parameter count (212 + 4 * 16 + 4...) is not a multiple of
 * 3 or 4 after 64-byte alignment per tensor: Linear(8,16) ReLU Linear(16,5)
 * ReLU Linear(5,4). */
static dt_model *zmodel(uint64_t seed, bool meta) { return zchain(seed, meta, (const int64_t[]){8, 16, 5, 4}, 4); }

/* Linear(8,16) ReLU Linear(16,16) ReLU Linear(16,16) ReLU Linear(16,4), the
 * third Linear's weight tied to the second's: a size policy must not put
 * the two in different units. */
static dt_model *ztied(uint64_t seed, bool meta)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_module *a = dt_nn_linear(16, 16, true), *b = dt_nn_linear(16, 16, true);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, a);
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, b);
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(16, 4, true));
    if (dt_module_tie(b, "weight", a, "weight") < 0)
        return NULL;
    dt_model_build_params bp = dt_model_build_params_default();
    bp.meta = meta;
    dt_model *m = NULL;
    return dt_model_build(net, seed, &bp, &m) < 0 ? NULL : m;
}

static dt_trainer_params zparams(const zcase *c)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = c->opt;
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.adamw.lr = 0.01;
    tp.no_decay_1d = c->opt == DT_OPTIM_ADAMW;
    tp.grad_accum = c->accum;
    tp.clip_grad_norm = c->clip;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    return tp;
}

static int train(dt_trainer *tr, int rank, int W, int accum)
{
    for (int s = 0; s < STEPS; s++) {
        dt_trainer_metrics r;
        TH_OK(trainer_step_on(tr, &k_mlp_data, ((int64_t)s * accum * W + rank) * MB, MB, accum, (int64_t)W * MB, &r));
        TH_CHECK(!r.skipped && isfinite(r.loss), "step %d", s);
    }
    return 0;
}

static int body_equiv(int rank, int W, void *arg)
{
    const zcase *c = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_trainer_params tp = zparams(c);
    /* the reference: DDP */
    dt_model *ref = c->tie ? ztied(21, false) : zmodel(21, false);
    TH_CHECK(ref, "model");
    dt_strategy *s;
    dt_trainer *tr;
    TH_OK(dt_strategy_ddp_init(pg, NULL, &s));
    TH_OK(dt_trainer_init(ref, s, &tp, &tr));
    if (train(tr, rank, W, c->accum))
        return 1;
    dt_trainer_free(tr);
    /* the strategy under test */
    dt_model *m = c->tie ? ztied(21, c->meta) : zmodel(21, c->meta);
    TH_CHECK(m, "model");
    dt_zero_params zp = dt_zero_params_default();
    zp.wrap_module_type = c->wrap;
    zp.wrap_min_params = c->wrap_min;
    zp.backward_prefetch = c->bp;
    zp.forward_prefetch = c->fwd_prefetch;
    zp.reshard_after_forward = c->reshard;
    zp.param_persistence_threshold = c->persist;
    zp.hybrid_shard_size = c->hybrid;
    zp.init_seed = 21;
    zp.reduce_scatter = !c->allreduce;
    if (c->stage == 0)
        TH_OK(dt_strategy_fsdp_init(pg, DT_FSDP_NO_SHARD, &zp, &s));
    else if (c->stage == 2 && rank >= 0 && !c->meta && c->bp == DT_PREFETCH_NONE)
        TH_OK(dt_strategy_fsdp_init(pg, DT_FSDP_SHARD_GRAD_OP, &zp, &s)); /* FSDP's name for stage 2 */
    else {
        zp.stage = c->stage;
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    }
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    if (train(tr, rank, W, c->accum))
        return 1;
    const size_t n = t_numel(ref);
    float *got = calloc(n, sizeof *got);
    dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
    /* the tied model: the first Linear is a unit; the tied pair, the
     * Linear after it and the rest stay in the root's */
    if (c->tie)
        TH_CHECK(z && dt_zero_num_units(z) == 2, "%d units, want 2", z ? dt_zero_num_units(z) : -1);
    if (z)
        TH_OK(dt_zero_full_params(z, got));
    else
        memcpy(got, t_params(m), n * sizeof *got);
    const float *want = t_params(ref);
    double d = max_rel_diff(got, want, n);
    if (c->exact)
        TH_CHECK(!memcmp(got, want, n * sizeof *got), "stage %d W %d: not bit-identical to DDP (max rel diff %g)",
                 c->stage, W, d);
    else
        TH_CHECK(d <= c->tol, "stage %d W %d: max rel diff %g > %g", c->stage, W, d, c->tol);
    /* and they moved */
    dt_model *init = c->tie ? ztied(21, false) : zmodel(21, false);
    TH_CHECK(max_rel_diff(got, t_params(init), n) > 1e-3, "parameters did not move");
    dt_model_free(init);
    free(got);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

static void run_case(zcase c, int W)
{
    int codes[8];
    int rc = th_run(W, 60.0, body_equiv, &c, codes);
    if (rc)
        fprintf(stderr, "case stage %d%s opt %d accum %d clip %g wrap %s bp %d W %d failed\n", c.stage,
                c.allreduce ? " (all-reduce)" : "", (int)c.opt, c.accum, c.clip, c.wrap ? c.wrap : "-", (int)c.bp, W);
    ASSERT_EQ_INT(rc, 0);
}

/* Every stage, SGD and AdamW, world sizes 2, 3, 4, one unit per Linear;
 * stage 1 both ways (reduce_scatter on, the default, and off). */
TEST(equivalence_stages)
{
    for (int W = 2; W <= 4; W++)
        for (int stage = W == 2 ? 0 : 1; stage <= 3; stage++) /* NO_SHARD (= DDP) once */
            for (int o = 0; o < 2; o++)
                for (int ar = 0; ar <= (stage == 1 && W < 4); ar++) {
                    zcase c = {.stage = stage, .opt = o ? DT_OPTIM_ADAMW : DT_OPTIM_SGD, .accum = 1,
                               .wrap = "Linear", .bp = DT_PREFETCH_BACKWARD_PRE, .reshard = true, .exact = true,
                               .allreduce = ar};
                    run_case(c, W);
                }
}

/* Gradient accumulation (whole gradients accumulate locally, reduced once)
 * and clipping (the global norm summed over the shards in double: the
 * clipped step may differ from DDP's by the float rounding of the norm). */
TEST(accumulation_and_clipping)
{
    for (int W = 2; W <= 3; W++)
        for (int stage = 0; stage <= 3; stage++) { /* 0: stage 1 all-reducing */
            zcase c = {.stage = stage ? stage : 1, .opt = DT_OPTIM_SGD, .accum = 3, .wrap = "Linear",
                       .bp = DT_PREFETCH_BACKWARD_PRE, .reshard = true, .exact = true, .allreduce = !stage};
            run_case(c, W);
            c.accum = 1;
            c.clip = 0.05; /* small enough to clip every step */
            c.exact = false;
            c.tol = 1e-6;
            run_case(c, W);
        }
}

/* Stage 3: every prefetch mode, forward prefetch, no reshard after forward,
 * one unit (the root), size-based wrapping, a meta model built lazily, and
 * resident small parameters, and a size policy on a model with tied weights;
 * all bit-identical to DDP. */
TEST(stage3_variants)
{
    const dt_backward_prefetch bps[] = {DT_PREFETCH_NONE, DT_PREFETCH_BACKWARD_PRE, DT_PREFETCH_BACKWARD_POST};
    for (int i = 0; i < 3; i++) {
        zcase c = {.stage = 3, .opt = DT_OPTIM_ADAMW, .accum = 2, .wrap = "Linear", .bp = bps[i],
                   .fwd_prefetch = i == 1, .reshard = i != 2, .exact = true};
        run_case(c, 2);
    }
    zcase root = {.stage = 3, .opt = DT_OPTIM_SGD, .accum = 1, .bp = DT_PREFETCH_BACKWARD_PRE, .reshard = true,
                  .exact = true};
    run_case(root, 3);
    zcase size = root;
    size.wrap_min = 80; /* the first Linear (144 elements) and the rest at the root */
    run_case(size, 3);
    zcase tied = size;
    tied.tie = true;
    tied.wrap_min = 100; /* the first Linear (144); the tied pair (272) would split the tie: root */
    run_case(tied, 2);
    zcase meta = root;
    meta.wrap = "Linear";
    meta.meta = true;
    run_case(meta, 4);
    zcase persist = meta;
    persist.persist = 20; /* the biases stay whole */
    run_case(persist, 3);
    zcase s2meta = meta;
    s2meta.stage = 2;
    run_case(s2meta, 3);
}

/* HYBRID_SHARD on 4 ranks: two shard groups of 2, replicated. The
 * gradients are averaged in two steps (over the group, then over the
 * replicas), so they can differ from DDP's single average by rounding. */
TEST(hybrid_shard)
{
    for (int stage = 2; stage <= 3; stage++) {
        zcase c = {.stage = stage, .opt = DT_OPTIM_ADAMW, .accum = 2, .wrap = "Linear",
                   .bp = DT_PREFETCH_BACKWARD_PRE, .reshard = true, .hybrid = 2, .tol = 1e-5};
        run_case(c, 4);
        c.opt = DT_OPTIM_SGD;
        c.accum = 1;
        c.clip = 0.05; /* the norm over one shard group, not over the replicas */
        c.meta = true;
        run_case(c, 4);
    }
}

/* Units and the bytes held, against the ZeRO formula with f32 everywhere:
 * stage 1 holds Psi parameters + Psi gradients + K Psi / N optimizer state,
 * stage 2 Psi + (1 + K) Psi / N, stage 3 (2 + K) Psi / N (Psi in bytes of
 * the padded unit flats, K = 2 for Adam's exp_avg and exp_avg_sq). */
static int body_memory(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    for (int stage = 1; stage <= 3; stage++) {
        dt_model *m = zmodel(5, stage == 3);
        dt_zero_params zp = dt_zero_params_default();
        zp.stage = stage;
        zp.wrap_module_type = "Linear";
        zp.init_seed = 5;
        dt_strategy *s;
        dt_trainer *tr;
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
        zcase c = {.opt = DT_OPTIM_ADAM, .accum = 1};
        dt_trainer_params tp = zparams(&c);
        TH_OK(dt_trainer_init(m, s, &tp, &tr));
        if (train(tr, rank, W, 1))
            return 1;
        dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
        TH_CHECK(dt_zero_num_units(z) == 3, "%d units", dt_zero_num_units(z));
        size_t psi = 0; /* padded elements over the units */
        const size_t wn[3] = {8 * 16, 16 * 5, 5 * 4}, bn[3] = {16, 5, 4};
        const char *names[3] = {"0", "2", "4"};
        for (int k = 0; k < 3; k++) {
            dt_zero_unit_info ui;
            TH_OK(dt_zero_unit(z, k, &ui));
            TH_CHECK(!strcmp(ui.name, names[k]) && ui.nparams == 2, "unit %d '%s'", k, ui.name);
            size_t lay = (wn[k] + 15) / 16 * 16 + (bn[k] + 15) / 16 * 16; /* each tensor 64-byte aligned */
            TH_CHECK(ui.numel == lay, "unit %d layout %zu, want %zu", k, ui.numel, lay);
            TH_CHECK(ui.total % (size_t)(16 * W) == 0 && ui.total >= ui.numel && ui.total < ui.numel + 16 * (size_t)W,
                     "unit %d total %zu", k, ui.total);
            TH_CHECK(ui.shard_hi - ui.shard_lo == ui.total / (size_t)W && ui.shard_lo == (size_t)rank * ui.total / (size_t)W,
                     "unit %d shard", k);
            TH_CHECK(ui.fwd_pos == (stage == 3 ? k : -1), "unit %d forward position %d", k, ui.fwd_pos);
            psi += ui.total;
        }
        const size_t P = psi * 4, N = (size_t)W;
        dt_trainer_memory mem;
        TH_OK(dt_trainer_memory_get(tr, &mem));
        size_t wp = stage == 3 ? P / N : P, wg = stage == 1 ? P : P / N;
        TH_CHECK(mem.param_bytes == wp, "stage %d params %zu, want %zu", stage, mem.param_bytes, wp);
        TH_CHECK(mem.grad_bytes == wg, "stage %d grads %zu, want %zu", stage, mem.grad_bytes, wg);
        TH_CHECK(mem.optim_bytes == 2 * P / N, "stage %d optimizer %zu, want %zu", stage, mem.optim_bytes, 2 * P / N);
        TH_CHECK(mem.master_bytes == 0 && mem.peak_rss > 0, "master %zu rss %zu", mem.master_bytes, mem.peak_rss);
        /* stage 3 gathered at most two units at once plus unsharded gradients; never all three whole */
        if (stage >= 2)
            TH_CHECK(mem.gathered_peak > 0 && mem.gathered_peak < 2 * P, "stage %d gathered peak %zu", stage,
                     mem.gathered_peak);
        size_t np = 0;
        TH_OK(dt_zero_pieces(z, NULL, 0, &np));
        dt_zero_piece pc[16];
        TH_OK(dt_zero_pieces(z, pc, 16, &np));
        size_t owned = 0;
        for (size_t i = 0; i < np; i++) {
            TH_CHECK(pc[i].hi > pc[i].lo && pc[i].range < 3, "piece %zu", i);
            owned += pc[i].hi - pc[i].lo;
        }
        /* the ranks' pieces cover every parameter element exactly once */
        double v = (double)owned;
        TH_OK(dt_metrics_allreduce(pg, &v, 1, DT_REDUCE_SUM));
        TH_CHECK(v == (double)dt_model_param_count(m), "pieces cover %.0f of %zu", v, dt_model_param_count(m));
        dt_trainer_free(tr);
        dt_model_free(m);
    }
    dt_pg_free(pg);
    return 0;
}

TEST(memory_formula_and_units)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_memory, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(4, 60.0, body_memory, NULL, NULL), 0);
}

/* zero_optimization.reduce_scatter (the config key, through
 * dt_config_zero_params) on stage 1, driven by hand: after dt_zero_wait the
 * range this rank owns holds the average over the ranks either way, the
 * same bits; outside it, reduce-scatter leaves this rank's own gradients
 * (exactly) and the all-reduce the average. The next step's
 * dt_zero_set_sync zeroes everything outside the owned range (which the
 * optimizer's pass zeroes; no optimizer runs here, so it stays). */
static int body_rs_ranges(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    /* the references: this rank's gradients, and the average of every rank's */
    dt_model *shape = zmodel(21, false);
    TH_CHECK(shape, "model");
    const size_t n = t_numel(shape), count = dt_model_param_count(shape); /* flat (aligned) / elements */
    dt_model_free(shape);
    float *mine = calloc(n, sizeof *mine), *avg = calloc(n, sizeof *avg), *owned[2] = {NULL, NULL};
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    for (int r = 0; r < W; r++) {
        dt_model *ref = zmodel(21, false);
        TH_CHECK(ref, "model");
        dt_model_zero_grad(ref);
        TH_OK(fwd_bwd(ctx, ref, NULL, &k_mlp_data, r * MB, MB, 1.0f));
        const float *g = dt_model_flat(ref, DT_FLAT_GRADS, DT_F32)->base;
        for (size_t i = 0; i < n; i++)
            avg[i] += g[i] / (float)W;
        if (r == rank)
            memcpy(mine, g, n * sizeof *g);
        dt_ctx_reset(ctx);
        dt_model_free(ref);
    }
    for (int off = 0; off < 2; off++) {
        char json[128];
        snprintf(json, sizeof json, "{\"zero_optimization\": {\"stage\": 1%s}}", off ? ", \"reduce_scatter\": false" : "");
        dt_config *cfg;
        TH_OK(dt_config_init(&cfg));
        TH_OK(dt_config_load_string(cfg, "rs.json", json, strlen(json)));
        int stage = 0;
        dt_zero_params zp = dt_zero_params_default();
        TH_OK(dt_config_zero_params(cfg, &stage, &zp));
        dt_config_free(cfg);
        TH_CHECK(stage == 1 && zp.stage == 1 && zp.reduce_scatter == !off, "config: stage %d reduce_scatter %d",
                 zp.stage, (int)zp.reduce_scatter);
        zp.wrap_module_type = "Linear";
        dt_model *m = zmodel(21, false);
        dt_zero *z;
        TH_OK(dt_zero_init(pg, m, &zp, &z));
        dt_zero_set_sync(z, true);
        TH_OK(fwd_bwd(ctx, m, NULL, &k_mlp_data, rank * MB, MB, 1.0f));
        TH_OK(dt_zero_wait(z));
        dt_zero_piece pc[16];
        size_t np = 0;
        TH_OK(dt_zero_pieces(z, pc, 16, &np));
        owned[off] = calloc(n, sizeof(float));
        /* every parameter element: owned (its piece) or not */
        for (int pass = 0; pass < 2; pass++) {
            size_t at = 0, nown = 0;
            for (size_t e = 0; e < dt_model_num_entries(m); e++) {
                dt_param_info pi;
                dt_model_entry(m, e, &pi);
                if (pi.is_buffer || pi.tied_to >= 0)
                    continue;
                const float *g = pi.tensor->grad->data;
                for (size_t i = 0; i < pi.numel; i++, at++) {
                    const size_t x = pi.offset + i; /* the references' index: the same flat layout */
                    bool own = false;
                    for (size_t k = 0; k < np; k++)
                        own |= pc[k].entry == e && i >= pc[k].lo && i < pc[k].hi;
                    nown += own;
                    if (pass == 1) { /* after the next step's set_sync */
                        TH_CHECK(own ? g[i] == owned[off][x] : g[i] == 0.0f,
                                 "%s reduce_scatter %d: %s[%zu] = %g after the next set_sync", off ? "off" : "on",
                                 !off, pi.name, i, (double)g[i]);
                        continue;
                    }
                    if (own)
                        owned[off][x] = g[i];
                    const float want = own || off ? avg[x] : mine[x];
                    const bool ok = own || off ? fabsf(g[i] - want) <= 1e-6f * (1 + fabsf(want)) : g[i] == want;
                    TH_CHECK(ok, "reduce_scatter %d: %s[%zu] (%s) = %.9g, want %.9g", !off, pi.name, i,
                             own ? "owned" : "not owned", (double)g[i], (double)want);
                }
            }
            TH_CHECK(at == count && nown > 0 && nown < count, "%zu elements, %zu owned", at, nown);
            if (pass == 0)
                dt_zero_set_sync(z, true); /* the next step begins */
        }
        dt_zero_free(z);
        dt_model_free(m);
        dt_ctx_reset(ctx);
    }
    TH_CHECK(!memcmp(owned[0], owned[1], n * sizeof(float)), "the owned range differs between reduce-scatter and "
                                                              "all-reduce");
    dt_ctx_free(ctx);
    free(owned[0]);
    free(owned[1]);
    free(mine);
    free(avg);
    dt_pg_free(pg);
    return 0;
}

TEST(stage1_reduce_scatter_ranges)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_rs_ranges, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 60.0, body_rs_ranges, NULL, NULL), 0);
}

/* Rank 1 skips the middle unit's forward in step 2: an error naming it on
 * every rank, never a hang. */
static dt_tensor *skip_fwd(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    int *skip = ud;
    dt_tensor *h = dt_relu(ctx, dt_module_forward(ctx, dt_module_find_child(self, "a"), x));
    if (!*skip)
        h = dt_relu(ctx, dt_module_forward(ctx, dt_module_find_child(self, "b"), h));
    return dt_module_forward(ctx, dt_module_find_child(self, "c"), h);
}

static int body_skip(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    int skip = 0;
    dt_module *net = dt_nn_custom("Net", 0, NULL, skip_fwd, &skip);
    dt_nn_add(net, "a", dt_nn_linear(8, 16, true));
    dt_nn_add(net, "b", dt_nn_linear(16, 16, true));
    dt_nn_add(net, "c", dt_nn_linear(16, 4, true));
    dt_model *m = t_build(net, 3);
    dt_zero_params zp = dt_zero_params_default();
    zp.wrap_module_type = "Linear";
    dt_strategy *s;
    dt_trainer *tr;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    zcase c = {.opt = DT_OPTIM_SGD, .accum = 1};
    dt_trainer_params tp = zparams(&c);
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    TH_OK(trainer_step_on(tr, &k_mlp_data, rank * MB, MB, 1, 0, NULL));
    skip = rank == 1;
    dt_status st = trainer_step_on(tr, &k_mlp_data, (W + rank) * MB, MB, 1, 0, NULL);
    TH_CHECK(st < 0, "a skipped unit went unnoticed");
    /* rank 0 was gathering 'b' when rank 1 gathered 'c': each names its unit */
    TH_CHECK(strstr(dt_last_error(), rank == 0 ? "ZeRO unit 'b'" : "ZeRO unit"), "the error does not name the unit: %s",
             dt_last_error());
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(skipped_unit_is_an_error)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_skip, NULL, NULL), 0);
}

/* Stage 3's collectives per step: 3 units gathered in forward and again in
 * backward (reshard_after_forward) or once (without); the prefetch modes
 * post gathers ahead of the hooks (none: never). */
static int body_prefetch_counts(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const struct {
        dt_backward_prefetch bp;
        bool fwd, reshard;
        uint64_t gathers, min_prefetched, max_prefetched;
    } cases[] = {
        {DT_PREFETCH_NONE, false, true, 6, 0, 0},
        {DT_PREFETCH_BACKWARD_PRE, false, true, 6, 2, 2},  /* units 2 and 0 ahead of their backward */
        {DT_PREFETCH_BACKWARD_POST, false, true, 6, 2, 2},
        {DT_PREFETCH_BACKWARD_PRE, true, true, 6, 4, 4},   /* and units 2 and 4 ahead of their forward */
        {DT_PREFETCH_NONE, false, false, 3, 0, 0},         /* kept whole from forward to backward */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_model *m = zmodel(7, true);
        dt_zero_params zp = dt_zero_params_default();
        zp.wrap_module_type = "Linear";
        zp.init_seed = 7;
        zp.backward_prefetch = cases[i].bp;
        zp.forward_prefetch = cases[i].fwd;
        zp.reshard_after_forward = cases[i].reshard;
        dt_strategy *s;
        dt_trainer *tr;
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
        zcase c = {.opt = DT_OPTIM_SGD, .accum = 1};
        dt_trainer_params tp = zparams(&c);
        TH_OK(dt_trainer_init(m, s, &tp, &tr));
        /* the first step records the forward order; count the next ones */
        TH_OK(trainer_step_on(tr, &k_mlp_data, rank * MB, MB, 1, 0, NULL));
        dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
        dt_zero_stats a = dt_zero_get_stats(z);
        for (int st = 1; st <= 2; st++)
            TH_OK(trainer_step_on(tr, &k_mlp_data, (st * W + rank) * MB, MB, 1, 0, NULL));
        dt_zero_stats b = dt_zero_get_stats(z);
        uint64_t g = b.gathers - a.gathers, p = b.prefetched - a.prefetched;
        TH_CHECK(g == 2 * cases[i].gathers, "case %zu: %llu gathers in 2 steps, want %llu", i, (unsigned long long)g,
                 (unsigned long long)(2 * cases[i].gathers));
        TH_CHECK(p >= 2 * cases[i].min_prefetched && p <= 2 * cases[i].max_prefetched,
                 "case %zu: %llu prefetched in 2 steps, want %llu", i, (unsigned long long)p,
                 (unsigned long long)(2 * cases[i].min_prefetched));
        TH_CHECK(b.ready_when_needed <= b.prefetched && b.bytes_reduced > a.bytes_reduced, "case %zu counters", i);
        dt_trainer_free(tr);
        dt_model_free(m);
    }
    dt_pg_free(pg);
    return 0;
}

TEST(stage3_prefetch_counts)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_prefetch_counts, NULL, NULL), 0);
}

/* Stage 3's page pool: units of 3, 33, 65 and 3 pages (one per Linear),
 * so gathers take pieces of other units' pages (a part, or several pieces
 * and the rest faulted). The parameters after 3 steps are bit-identical
 * to the same run with the pool off; the pool kept at most two of the
 * largest units, the gathers wrote into its pages, and without it nothing
 * is kept. */
static dt_model *zwide(uint64_t seed) { return zchain(seed, true, (const int64_t[]){8, 256, 128, 512, 4}, 5); }

static int body_page_pool(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const struct {
        dt_backward_prefetch bp;
        bool fwd;
    } cases[] = {{DT_PREFETCH_BACKWARD_PRE, false}, {DT_PREFETCH_BACKWARD_POST, true}, {DT_PREFETCH_NONE, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *got[2] = {NULL, NULL};
        size_t n = 0, peak[2] = {0, 0}, big = 0, psi = 0, kept = 0;
        for (int pool = 0; pool < 2; pool++) {
            dt_model *m = zwide(31);
            TH_CHECK(m, "model");
            dt_zero_params zp = dt_zero_params_default();
            zp.wrap_module_type = "Linear";
            zp.init_seed = 31;
            zp.backward_prefetch = cases[i].bp;
            zp.forward_prefetch = cases[i].fwd;
            zp.page_pool = pool;
            dt_strategy *s;
            dt_trainer *tr;
            TH_OK(dt_strategy_zero_init(pg, &zp, &s));
            zcase c = {.opt = DT_OPTIM_ADAMW, .accum = 1};
            dt_trainer_params tp = zparams(&c);
            TH_OK(dt_trainer_init(m, s, &tp, &tr));
            TH_OK(trainer_step_on(tr, &k_mlp_data, rank * MB, MB, 1, 0, NULL));
            dt_zero *z = dt_strategy_zero(dt_trainer_strategy(tr));
            dt_zero_stats a = dt_zero_get_stats(z);
            for (int st = 1; st <= 2; st++)
                TH_OK(trainer_step_on(tr, &k_mlp_data, (st * W + rank) * MB, MB, 1, 0, NULL));
            dt_zero_stats b = dt_zero_get_stats(z);
            TH_CHECK(dt_zero_num_units(z) == 4, "%d units", dt_zero_num_units(z));
            big = psi = 0;
            for (int k = 0; k < 4; k++) {
                dt_zero_unit_info ui;
                TH_OK(dt_zero_unit(z, k, &ui));
                big = ui.total * 4 > big ? ui.total * 4 : big;
                psi += ui.total * 4;
            }
            if (pool)
                kept = b.pool_peak;
            const uint64_t pooled = b.bytes_pooled - a.bytes_pooled, gathered = b.bytes_gathered - a.bytes_gathered;
            if (pool)
                /* after the first step nearly every gather writes kept pages */
                TH_CHECK(b.pool_peak > 0 && b.pool_peak <= 2 * big && pooled >= gathered / 2,
                         "case %zu: pool kept at most %llu bytes (largest unit %zu), %llu of %llu gathered bytes "
                         "into it", i, (unsigned long long)b.pool_peak, big, (unsigned long long)pooled,
                         (unsigned long long)gathered);
            else
                TH_CHECK(b.pool_peak == 0 && b.bytes_pooled == 0, "case %zu: no pool, yet %llu bytes kept", i,
                         (unsigned long long)b.pool_peak);
            TH_OK(dt_zero_memory(z, NULL, NULL, &peak[pool]));
            n = dt_model_param_count(m);
            TH_CHECK((got[pool] = calloc(n, sizeof(float))), "alloc");
            TH_OK(dt_zero_full_params(z, got[pool]));
            dt_trainer_free(tr);
            dt_model_free(m);
        }
        const bool same = !memcmp(got[0], got[1], n * sizeof(float));
        free(got[0]);
        free(got[1]);
        TH_CHECK(same, "case %zu: the pool changed the parameters", i);
        /* the pool counts in the gathered peak; at most two gathered units,
         * every unsharded gradient (when the reduce-scatters complete is up
         * to timing) and two units in the pool */
        TH_CHECK(peak[1] >= kept && peak[1] <= 4 * big + psi, "case %zu: gathered peak %zu with the pool (%zu kept, "
                 "%zu without), largest unit %zu, all %zu", i, peak[1], kept, peak[0], big, psi);
    }
    dt_pg_free(pg);
    return 0;
}

TEST(stage3_page_pool)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_page_pool, NULL, NULL), 0);
}

TEST(names_and_bad_params)
{
    dt_fsdp_sharding sh;
    ASSERT_OK(dt_fsdp_sharding_parse("full_shard", &sh));
    ASSERT_EQ_INT(sh, DT_FSDP_FULL_SHARD);
    ASSERT(!strcmp(dt_fsdp_sharding_name(DT_FSDP_SHARD_GRAD_OP), "shard_grad_op"));
    ASSERT(dt_fsdp_sharding_parse("full", &sh) == DT_ERR_INVALID_ARG);
    dt_backward_prefetch bp;
    ASSERT_OK(dt_prefetch_parse("backward_post", &bp));
    ASSERT_EQ_INT(bp, DT_PREFETCH_BACKWARD_POST);
    ASSERT(dt_prefetch_parse("post", &bp) == DT_ERR_INVALID_ARG);
    dt_pg *pg;
    dt_pg_params pp = dt_pg_params_default();
    pp.rank = 0;
    pp.world_size = 1;
    pp.backend = "self";
    ASSERT_OK(dt_pg_init(&pp, &pg));
    dt_strategy *s;
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = 4;
    ASSERT(dt_strategy_zero_init(pg, &zp, &s) == DT_ERR_INVALID_ARG);
    if (!strstr(dt_last_error(), "stage 4"))
        fprintf(stderr, "error: %s\n", dt_last_error());
    ASSERT(strstr(dt_last_error(), "stage 4") != NULL);
    zp.stage = 1;
    zp.hybrid_shard_size = 1;
    ASSERT_OK(dt_strategy_zero_init(pg, &zp, &s)); /* checked at attach */
    dt_model *bad = zmodel(9, false);
    dt_trainer *tbad;
    ASSERT(dt_trainer_init(bad, s, NULL, &tbad) == DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "hybrid_shard_size") != NULL);
    dt_model_free(bad);
    zp.hybrid_shard_size = 0;
    /* a wrap type no module has is refused, naming it and the types there are */
    zp.stage = 3;
    zp.wrap_module_type = "Block";
    ASSERT_OK(dt_strategy_zero_init(pg, &zp, &s));
    bad = zmodel(9, true);
    ASSERT(dt_trainer_init(bad, s, NULL, &tbad) == DT_ERR_INVALID_ARG);
    if (!strstr(dt_last_error(), "'Block' names no module") || !strstr(dt_last_error(), "Linear"))
        fprintf(stderr, "error: %s\n", dt_last_error());
    ASSERT(strstr(dt_last_error(), "'Block' names no module") != NULL && strstr(dt_last_error(), "Linear") != NULL);
    dt_model_free(bad);
    /* one rank: stage 3 equals the plain trainer */
    dt_model *a = zmodel(9, false), *b = zmodel(9, true);
    zp.stage = 3;
    zp.wrap_module_type = "Linear";
    zp.init_seed = 9;
    ASSERT_OK(dt_strategy_zero_init(pg, &zp, &s));
    dt_trainer *ta, *tb;
    ASSERT_OK(make_trainer(a, NULL, 1, &ta));
    ASSERT_OK(make_trainer(b, s, 1, &tb));
    for (int st = 0; st < 3; st++) {
        ASSERT_OK(trainer_step_on(ta, &k_mlp_data, st * 6, 6, 1, 0, NULL));
        ASSERT_OK(trainer_step_on(tb, &k_mlp_data, st * 6, 6, 1, 0, NULL));
    }
    float *got = calloc(t_numel(a), sizeof *got);
    ASSERT_OK(dt_zero_full_params(dt_strategy_zero(dt_trainer_strategy(tb)), got));
    ASSERT(!memcmp(got, t_params(a), t_numel(a) * sizeof *got));
    ASSERT(dt_zero_full_params(dt_strategy_zero(dt_trainer_strategy(tb)), NULL) == DT_ERR_STATE); /* meta */
    free(got);
    dt_trainer_free(ta);
    dt_trainer_free(tb);
    dt_model_free(a);
    dt_model_free(b);
    dt_pg_free(pg);
}

/* Stages 1 and 2 on a built model: once the units hold the parameters, the
 * model's own parameter and gradient flats (1 MiB each here, mapped) hold
 * no memory, also after dt_model_zero_grad: no second whole copy of the
 * parameters and gradients beside the units' (ZeRO-1 used more memory than
 * DDP while they stayed). mincore says which pages are resident. */
static size_t resident_pages(const dt_flat *f)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)f->base + pg - 1) / pg * pg;
    const uintptr_t b = ((uintptr_t)f->base + f->total * sizeof(float)) / pg * pg;
    if (b <= a)
        return 0;
    unsigned char v[4096];
    const size_t n = (b - a) / pg;
    if (n > sizeof v || mincore((void *)a, b - a, v) != 0)
        return (size_t)-1;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += v[i] & 1;
    return k;
}

static int body_own_flats(int rank, int W, void *arg)
{
    (void)arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    for (int stage = 1; stage <= 2; stage++) {
        dt_model *m = zchain(7, false, (const int64_t[]){256, 512, 256}, 3);
        TH_CHECK(m, "model");
        const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
        TH_CHECK(P && G && P->mapped && G->mapped, "the flats are not mapped");
        memset(G->base, 0, G->total * sizeof(float)); /* as a trainer's zero_grad before the strategy */
        TH_CHECK(resident_pages(P) > 0 && resident_pages(G) > 0, "nothing resident before ZeRO");
        dt_zero_params zp = dt_zero_params_default();
        zp.stage = stage;
        zp.wrap_module_type = "Linear";
        dt_zero *z;
        TH_OK(dt_zero_init(pg, m, &zp, &z));
        dt_model_zero_grad(m);
        TH_CHECK(resident_pages(P) == 0 && resident_pages(G) == 0,
                 "stage %d: the model's own flats keep %zu + %zu resident pages beside the units'", stage,
                 resident_pages(P), resident_pages(G));
        dt_zero_free(z);
        dt_model_free(m);
    }
    dt_pg_free(pg);
    return 0;
}

TEST(stage12_no_second_copy)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_own_flats, NULL, NULL), 0);
}

int main(void)
{
    RUN(stage12_no_second_copy);
    RUN(names_and_bad_params);
    RUN(equivalence_stages);
    RUN(accumulation_and_clipping);
    RUN(stage3_variants);
    RUN(hybrid_shard);
    RUN(memory_formula_and_units);
    RUN(stage1_reduce_scatter_ranges);
    RUN(skipped_unit_is_an_error);
    RUN(stage3_prefetch_counts);
    RUN(stage3_page_pool);
    return TEST_REPORT();
}
