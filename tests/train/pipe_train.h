/* tests/train/pipe_train.h — pipeline training equals single-process
 * training (real processes), shared by test_pipe_train_{mlp,gpt,hybrid}.c:
 * the MLP zoo model (two units, two stages) and a small GPT (embeddings,
 * 2 blocks, ln_f, the tied head: 5 units) under every schedule (gpipe,
 * 1f1b, interleaved with v = 2, zbh1) on 2 pipeline ranks, the GPT on 3,
 * and dp 2 x pp 2 on 4 ranks. Every rank also trains the same model in
 * one process on the whole batch (the "none" strategy) and compares:
 *
 *   - the gradient of every parameter its stages use, after step 1
 *     (SGD with lr 1, no momentum: g = p0 - p1), the tied wte/lm_head
 *     included (summed between the first and the last stage);
 *   - the parameters after step 2, and the losses the trainer reports.
 *
 * The bound: a gradient element is a sum over the N = B T rows of the
 * batch; the pipeline sums it as m partial sums (one per micro-batch, and
 * the replicas' averages under dp) and the matmul kernels may block a
 * smaller M differently, so the two results differ by rounding only:
 * |fl(sum) - sum| <= N u sum|terms| (u = 2^-24). With sum|terms| no more
 * than a few times the largest |g| here, we allow 8 N u max|g| per
 * tensor (N = 32 rows: 1.5e-5 of the tensor's largest gradient), plus
 * 1e-7 absolute; a wrong micro-batch, a missed 1/m, a gradient not summed
 * across stages or replicas is off by O(max|g|), far outside it. */
#ifndef DT_TEST_PIPE_TRAIN_H
#define DT_TEST_PIPE_TRAIN_H
#include "comm/harness.h"
#include "model_util.h"
#include "test.h"

#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"
#include "parallel/pipeline/pipe_impl.h"
#include "train/pipe_entries.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *model; /* "mlp" or "gpt" */
    dt_pipe_kind kind;
    int pp, dp, m;
    const char *expect_err; /* the trainer must refuse with this (NULL: must train) */
    dt_pipe_balance_by balance; /* default DT_PIPE_BY_COMPUTE; DT_PIPE_BY_TIME: timed on one micro-batch */
} run_cfg;

#define B_GLOBAL 8 /* rows over all replicas */
#define T_GPT 4

static inline dt_model_config small_cfg(const char *model)
{
    dt_model_config c = dt_model_config_default();
    if (!strcmp(model, "mlp")) {
        c.mlp_seq = 4, c.mlp_dim = 8, c.mlp_hidden = 16;
    } else {
        c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.block_size = 8, c.vocab_size = 32, c.seq = T_GPT;
    }
    return c;
}

static inline const char *zoo_name(const char *model) { return !strcmp(model, "mlp") ? "mlp" : "gpt-micro"; }

/* Batch rows [first, first + n): deterministic. */
static inline void make_batch(const char *model, int64_t first, int64_t n, float *xf, int64_t *xi, int64_t *y)
{
    if (!strcmp(model, "mlp")) {
        for (int64_t i = 0; i < n * 4 * 8; i++)
            xf[i] = (float)(((first * 32 + i) * 37) % 23) / 11.0f - 1.0f;
    } else {
        for (int64_t i = 0; i < n * T_GPT; i++) {
            xi[i] = ((first * T_GPT + i) * 7 + 3) % 32;
            y[i] = ((first * T_GPT + i) * 5 + 1) % 32;
        }
    }
}

static inline dt_trainer_batch batch_of(const char *model, int64_t n, float *xf, int64_t *xi, int64_t *y)
{
    if (!strcmp(model, "mlp"))
        return dt_trainer_batch_make(xf, DT_F32, 3, (int64_t[]){n, 4, 8}, NULL, DT_I64, 0, NULL);
    return dt_trainer_batch_make(xi, DT_I64, 2, (int64_t[]){n, T_GPT}, y, DT_I64, 2, (int64_t[]){n, T_GPT});
}

static inline dt_status trainer_for(dt_model *m, dt_model_desc *d, dt_strategy *s, dt_trainer **tr)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 1.0;
    tp.sgd.momentum = 0;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = d;
    return dt_trainer_init(m, s, &tp, tr);
}

/* Params flat of model m as a copy. */
static inline float *snapshot(const dt_model *m)
{
    float *c = malloc(t_numel(m) * sizeof *c);
    memcpy(c, t_params(m), t_numel(m) * sizeof *c);
    return c;
}

static inline int body(int rank, int size, void *arg)
{
    const run_cfg *c = arg;
    dt_model_config mc = small_cfg(c->model);
    dt_model *ref = NULL, *m = NULL;
    dt_model_desc dref, dm;
    TH_OK(dt_model_create(zoo_name(c->model), 11, &mc, &ref, &dref));
    TH_OK(dt_model_create(zoo_name(c->model), 11, &mc, &m, &dm));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = c->pp;
    pp.schedule = c->kind;
    pp.micro_batches = c->m;
    pp.balance = c->balance;
    float sxf[B_GLOBAL * 32];
    int64_t sxi[B_GLOBAL * T_GPT], sy[B_GLOBAL * T_GPT], srows = B_GLOBAL / c->dp / c->m;
    srows = srows > 0 ? srows : 1;
    make_batch(c->model, 0, srows, sxf, sxi, sy);
    dt_trainer_batch sample = batch_of(c->model, srows, sxf, sxi, sy);
    pp.sample = &sample;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer *tr, *trr;
    if (c->expect_err) {
        TH_CHECK(trainer_for(m, &dm, s, &tr) < 0, "the trainer accepted %s", c->expect_err);
        TH_CHECK(strstr(dt_last_error(), c->expect_err), "error '%s'", dt_last_error());
        dt_model_free(m);
        dt_model_free(ref);
        dt_pg_free(pg);
        return 0;
    }
    TH_OK(trainer_for(m, &dm, s, &tr));
    dt_strategy *none;
    TH_OK(dt_strategy_none_init(&none));
    TH_OK(trainer_for(ref, &dref, none, &trr));

    int64_t Bl = B_GLOBAL / c->dp, first = (rank / c->pp) * Bl;
    float *xf = calloc(B_GLOBAL * 32, sizeof *xf);
    int64_t *xi = calloc(B_GLOBAL * T_GPT, sizeof *xi), *y = calloc(B_GLOBAL * T_GPT, sizeof *y);
    make_batch(c->model, 0, B_GLOBAL, xf, xi, y);
    size_t per_x = !strcmp(c->model, "mlp") ? 32 : T_GPT;
    dt_trainer_batch whole = batch_of(c->model, B_GLOBAL, xf, xi, y);
    dt_trainer_batch mine = batch_of(c->model, Bl, xf + first * (int64_t)per_x, xi + first * T_GPT, y + first * T_GPT);

    /* which entries this rank's stages use */
    size_t ne = dt_model_num_entries(m);
    bool *mine_e = pipe_rank_entries(dt_trainer_strategy(tr), m, false);
    TH_CHECK(mine_e, "rank %d: the stages' entries: %s", rank, dt_last_error());
    int nmine = 0;
    for (size_t e = 0; e < ne; e++)
        nmine += mine_e[e];
    TH_CHECK(nmine > 0, "rank %d uses no parameter", rank);

    float *p0 = snapshot(m), *r0 = snapshot(ref);
    TH_CHECK(memcmp(p0, r0, t_numel(m) * sizeof *p0) == 0, "models differ before training");
    dt_trainer_metrics mp, mr;
    const double N = (double)B_GLOBAL * (strcmp(c->model, "mlp") ? T_GPT : 4), u = ldexp(1.0, -24);
    for (int step = 0; step < 2; step++) {
        TH_OK(dt_trainer_step(tr, &mine, 1, &mp));
        TH_OK(dt_trainer_step(trr, &whole, 1, &mr));
        TH_CHECK(fabs(mp.loss - mr.loss) <= 1e-5 * fabs(mr.loss) + 1e-6, "step %d: loss %.9g, single process %.9g",
                 step, mp.loss, mr.loss);
        float *p1 = t_params(m), *r1 = t_params(ref);
        for (size_t e = 0; e < ne; e++) {
            if (!mine_e[e])
                continue;
            dt_param_info pi;
            dt_model_entry(m, e, &pi);
            double gmax = 0, dmax = 0;
            for (size_t i = pi.offset; i < pi.offset + pi.numel; i++) {
                double gr = step == 0 ? (double)r0[i] - r1[i] : r1[i];
                double gp = step == 0 ? (double)p0[i] - p1[i] : p1[i];
                gmax = fabs(gr) > gmax ? fabs(gr) : gmax;
                dmax = fabs(gp - gr) > dmax ? fabs(gp - gr) : dmax;
            }
            double tol = 8 * N * u * gmax + 1e-7;
            if (step == 1) /* parameters after two steps: the step-1 error carried, plus one more */
                tol = 2 * 8 * N * u * gmax + 1e-6;
            TH_CHECK(dmax <= tol, "step %d, %s: %s differs by %.3g (bound %.3g, max %.3g)", step, pi.name,
                     step == 0 ? "gradient" : "parameter", dmax, tol, gmax);
            if (step == 0)
                TH_CHECK(gmax > 0, "%s: no gradient", pi.name);
        }
    }
    /* the memory report counts this rank's stages only: the parameters
     * its units use (a shared one's storage on each rank using it) */
    bool *held = calloc(ne, sizeof *held);
    size_t expect = 0, model_bytes = 0;
    for (size_t e = 0; e < ne; e++) {
        dt_param_info pi;
        TH_OK(dt_model_entry(m, e, &pi));
        if (mine_e[e])
            held[pi.tied_to >= 0 ? (size_t)pi.tied_to : e] = true;
    }
    for (size_t e = 0; e < ne; e++) {
        dt_param_info pi;
        TH_OK(dt_model_entry(m, e, &pi));
        if (pi.is_buffer || pi.tied_to >= 0)
            continue;
        model_bytes += pi.numel * dt_dtype_size(pi.dtype);
        expect += held[e] ? pi.numel * dt_dtype_size(pi.dtype) : 0;
    }
    dt_trainer_memory mem;
    TH_OK(dt_trainer_memory_get(tr, &mem));
    TH_CHECK(mem.param_bytes == expect && mem.grad_bytes == expect,
             "rank %d: memory report: params %zu, grads %zu bytes; its stages use %zu (model_bytes model %zu)", rank,
             mem.param_bytes, mem.grad_bytes, expect, model_bytes);
    TH_CHECK(c->pp == 1 || expect < model_bytes, "rank %d: its stages use the model_bytes model (%zu bytes)", rank, model_bytes);
    free(held);
    free(mine_e);
    free(p0);
    free(r0);
    free(xf);
    free(xi);
    free(y);
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

static inline void run_cfg_expect(const run_cfg *c)
{
    int codes[8];
    int rc = th_run(c->pp * c->dp, 60.0, body, (void *)c, codes);
    if (rc != 0)
        fprintf(stderr, "%s %s pp %d dp %d m %d%s: failed\n", c->model, dt_pipe_kind_name(c->kind), c->pp, c->dp, c->m,
                c->balance == DT_PIPE_BY_TIME ? " balanced by time" : "");
    ASSERT_EQ_INT(rc, 0);
}

static inline void run_expect(const char *model, dt_pipe_kind kind, int pp, int dp, int m, const char *err)
{
    run_cfg c = {model, kind, pp, dp, m, err, DT_PIPE_BY_COMPUTE};
    run_cfg_expect(&c);
}

/* Stages balanced by the units' measured time (DT_PIPE_BY_TIME). */
static inline void run_time(const char *model, dt_pipe_kind kind, int pp, int dp, int m)
{
    run_cfg c = {model, kind, pp, dp, m, NULL, DT_PIPE_BY_TIME};
    run_cfg_expect(&c);
}

static inline void run(const char *model, dt_pipe_kind kind, int pp, int dp, int m)
{
    run_expect(model, kind, pp, dp, m, NULL);
}

#endif
