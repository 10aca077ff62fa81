/* Non-finite values on some ranks (train.h): without loss scaling a NaN/Inf
 * loss or gradient on one rank stops every rank after the same step with
 * one message naming the step, the rank and the parameter (DDP, ZeRO 1-3,
 * a strategy whose gradients stay local), nothing applied; with a loss
 * scaler the step is skipped and the model's buffers (batch norm's running
 * statistics, num_batches_tracked) stay as they were before it; a static
 * scale that overflows step after step is an error. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Rank `bad`'s batch of 6 with one +inf element; the others' are clean. */
static dt_status step_maybe_bad(dt_trainer *tr, int rank, int bad, dt_trainer_metrics *r)
{
    if (rank != bad)
        return trainer_step_on(tr, &k_mlp_data, 100 + rank * 6, 6, 1, 0, r);
    float x[48];
    int64_t y[6];
    for (int i = 0; i < 48; i++)
        x[i] = i == 3 ? INFINITY : 0.5f;
    for (int i = 0; i < 6; i++)
        y[i] = i % 4;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){6, 8}, y, DT_I64, 1, (int64_t[]){6});
    return dt_trainer_step(tr, &b, 1, r);
}

typedef struct {
    const char *strategy; /* "ddp", "zero1", "zero2", "zero3" */
    const char *fault;    /* NULL: rank 1 gets an input with +inf; else DT_FAULT_NONFINITE */
} nf_case;

static int body_one_rank_nonfinite(int rank, int size, void *arg)
{
    const nf_case *c = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    if (c->fault)
        setenv("DT_FAULT_NONFINITE", c->fault, 1);
    dt_strategy *s;
    if (!strcmp(c->strategy, "ddp")) {
        TH_OK(dt_strategy_ddp_init(pg, NULL, &s));
    } else {
        dt_zero_params zp = dt_zero_params_default();
        zp.stage = c->strategy[4] - '0';
        TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    }
    dt_model *m = mlp_model(9);
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 0.1;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    unsetenv("DT_FAULT_NONFINITE");
    dt_trainer_metrics r;
    TH_OK(trainer_step_on(tr, &k_mlp_data, rank * 6, 6, 1, 0, &r));
    dt_status st = c->fault ? trainer_step_on(tr, &k_mlp_data, 50 + rank * 6, 6, 1, 0, &r)
                            : step_maybe_bad(tr, rank, 1, &r);
    /* every rank fails the same step with the same message */
    TH_CHECK(st == DT_ERR_INVALID_ARG, "rank %d: step 2 returned %s (%s)", rank, dt_status_name(st),
             st < 0 ? dt_last_error() : "no error");
    const char *e = dt_last_error();
    TH_CHECK(strstr(e, "non-finite values at optimizer step 2"), "rank %d: %s", rank, e);
    TH_CHECK(dt_trainer_steps(tr) == 1, "rank %d: %lld steps", rank, (long long)dt_trainer_steps(tr));
    if (!c->fault || !strcmp(c->fault, "1:2:loss"))
        TH_CHECK(strstr(e, "the loss is ") && strstr(e, " on rank 1 ("), "rank %d: %s", rank, e);
    if (!c->fault || !strcmp(c->fault, "1:2:grad"))
        TH_CHECK(strstr(e, "the gradient of '"), "rank %d: %s", rank, e);
    if (c->fault && !strcmp(c->fault, "1:2:grad"))
        TH_CHECK(strstr(e, "is not finite on rank 1."), "rank %d: %s", rank, e);
    if (rank == 0)
        fprintf(stderr, "%s %s: %s\n", c->strategy, c->fault ? c->fault : "inf input", e);
    /* no update was applied anywhere: every parameter is still finite */
    if (!strcmp(c->strategy, "ddp")) {
        for (size_t i = 0; i < t_numel(m); i++)
            TH_CHECK(isfinite(t_params(m)[i]), "rank %d: parameter %zu is %g", rank, i, t_params(m)[i]);
    }
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(one_rank_nonfinite_stops_every_rank)
{
    const nf_case cases[] = {
        {"ddp", NULL},          {"ddp", "1:2:grad"},   {"ddp", "1:2:loss"},  {"zero1", NULL},
        {"zero1", "1:2:grad"},  {"zero2", "1:2:grad"}, {"zero3", "1:2:grad"}, {"zero3", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int codes[2] = {-1, -1};
        int rc = th_run(2, 60.0, body_one_rank_nonfinite, (void *)&cases[i], codes);
        if (rc != 0)
            fprintf(stderr, "case %s %s: rc %d (ranks %d %d)\n", cases[i].strategy,
                    cases[i].fault ? cases[i].fault : "inf input", rc, codes[0], codes[1]);
        ASSERT_EQ_INT(rc, 0);
    }
}

/* One process: the gradient of the named parameter, the step, the rank. */
TEST(single_process_names_the_parameter)
{
    setenv("DT_FAULT_NONFINITE", "0:3:grad", 1);
    dt_model *m = mlp_model(3);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    unsetenv("DT_FAULT_NONFINITE");
    dt_trainer_metrics r;
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 0, 6, 1, 0, &r));
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 6, 6, 1, 0, &r));
    ASSERT_STATUS(trainer_step_on(tr, &k_mlp_data, 12, 6, 1, 0, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "non-finite values at optimizer step 3");
    ASSERT_STR_CONTAINS(dt_last_error(), "the gradient of '0.weight' (element 0) is not finite on rank 0");
    ASSERT_EQ_INT(dt_trainer_steps(tr), 2);
    for (size_t i = 0; i < t_numel(m); i++)
        ASSERT(isfinite(t_params(m)[i]));
    /* the next step runs (the gradients were zeroed) */
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 18, 6, 1, 0, &r));
    ASSERT_EQ_INT(dt_trainer_steps(tr), 3);
    dt_trainer_free(tr);
    dt_model_free(m);
    /* a bad fault spec is refused */
    setenv("DT_FAULT_NONFINITE", "1:0:grad", 1);
    m = mlp_model(3);
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "DT_FAULT_NONFINITE");
    unsetenv("DT_FAULT_NONFINITE");
    dt_model_free(m);
}

/* Where the trainer alone reads the gradients (strategy "none", no loss
 * scaler: lazy gradients) the check runs in backward, on each gradient as
 * it becomes final; a hit there, or a fault injected after backward, falls
 * back to the read pass, which names the first non-finite element. */
TEST(check_runs_in_backward)
{
    setenv("DT_FAULT_NONFINITE", "0:4:grad", 1);
    dt_model *m = mlp_model(3);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.clip_grad_norm = 1.0; /* f32 gradients: the norm reads them, no unscale pass */
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    unsetenv("DT_FAULT_NONFINITE");
    dt_trainer_metrics r;
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 0, 6, 1, 0, &r));
    ASSERT(r.grads_checked_in_backward);
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 6, 3, 2, 3, &r)); /* two micro-batches: the last one's */
    ASSERT(r.grads_checked_in_backward);
    /* +inf in the input: the hook sees it, the read pass names it; nothing applied */
    float before[4096];
    ASSERT(t_numel(m) <= 4096);
    memcpy(before, t_params(m), t_numel(m) * sizeof(float));
    ASSERT_STATUS(step_maybe_bad(tr, 0, 0, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "non-finite values at optimizer step 3");
    ASSERT_STR_CONTAINS(dt_last_error(), "the gradient of '");
    ASSERT_STR_CONTAINS(dt_last_error(), "is not finite on rank 0");
    ASSERT(memcmp(before, t_params(m), t_numel(m) * sizeof(float)) == 0);
    ASSERT_EQ_INT(dt_trainer_steps(tr), 2);
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 12, 6, 1, 0, &r));
    ASSERT(r.grads_checked_in_backward);
    /* a gradient poisoned after backward (the fault) is still found, by the read pass */
    ASSERT_STATUS(trainer_step_on(tr, &k_mlp_data, 18, 6, 1, 0, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "non-finite values at optimizer step 4");
    ASSERT_STR_CONTAINS(dt_last_error(), "the gradient of '0.weight' (element 0) is not finite on rank 0");
    dt_trainer_free(tr);
    dt_model_free(m);
    /* with a loss scaler the unscale pass checks (no lazy gradients) */
    m = mlp_model(3);
    ASSERT_OK(dt_strategy_none_init(&s));
    tp = dt_trainer_params_default();
    tp.loss_scale = 1024;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 0, 6, 1, 0, &r));
    ASSERT(!r.grads_checked_in_backward);
    dt_trainer_free(tr);
    dt_model_free(m);
}

/* bf16 parameters with a tied head (GPT-2's wte, two contributions summed
 * in f32 and flushed) and GEMM-written gradients: each one is seen in
 * backward, so no step needs the read pass. */
TEST(check_in_backward_bf16_tied)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = 16;
    cfg.build.param_dtype = DT_BF16;
    dt_model *m;
    dt_model_desc d;
    ASSERT_OK(dt_model_create("gpt-micro", 1, &cfg, &m, &d));
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 3e-3;
    tp.precision.param_dtype = DT_BF16;
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    int64_t x[2 * 16], y[2 * 16];
    for (int i = 0; i < 32; i++)
        x[i] = (i * 11) % 37, y[i] = ((i + 1) * 11) % 37;
    dt_trainer_batch bt = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){2, 16}, y, DT_I64, 2, (int64_t[]){2, 16});
    for (int k = 0; k < 3; k++) {
        dt_trainer_metrics mt;
        ASSERT_OK(dt_trainer_step(tr, &bt, 1, &mt));
        ASSERT(isfinite(mt.loss));
        ASSERT(mt.grads_checked_in_backward);
    }
    dt_trainer_free(tr);
    dt_model_free(m);
}

/* BatchNorm2d(2) over [n, 2, 2, 2], flatten, Linear(8, 4). */
static dt_model *bn_model(void)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_batchnorm2d(2, 1e-5f, 0.1f));
    dt_nn_add(net, NULL, dt_nn_flatten(1, -1));
    dt_nn_add(net, NULL, dt_nn_linear(8, 4, true));
    return t_build(net, 4);
}

/* A copy of every buffer flat (running statistics, num_batches_tracked). */
static size_t buffers_copy(const dt_model *m, unsigned char *out, size_t cap)
{
    size_t off = 0;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (b && b->base && off + dt_flat_nbytes(b) <= cap) {
            memcpy(out + off, b->base, dt_flat_nbytes(b));
            off += dt_flat_nbytes(b);
        }
    }
    return off;
}

TEST(skipped_step_keeps_the_buffers)
{
    dt_model *m = bn_model();
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.use_scaler = true;
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    static const th_data bn_data = {8, 4, {0, 2, 2, 2}, 4};
    dt_trainer_metrics r;
    ASSERT_OK(trainer_step_on(tr, &bn_data, 0, 6, 1, 0, &r));
    ASSERT(!r.skipped);
    unsigned char before[4096], after[4096];
    size_t nb = buffers_copy(m, before, sizeof before);
    ASSERT(nb > 0);
    float x[48];
    int64_t y[6];
    for (int i = 0; i < 48; i++)
        x[i] = i == 3 ? INFINITY : 0.25f * (float)(i % 5);
    for (int i = 0; i < 6; i++)
        y[i] = i % 4;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 4, (int64_t[]){6, 2, 2, 2}, y, DT_I64, 1, (int64_t[]){6});
    ASSERT_OK(dt_trainer_step(tr, &b, 1, &r));
    ASSERT(r.skipped);
    ASSERT_EQ_INT(buffers_copy(m, after, sizeof after), nb);
    ASSERT(!memcmp(before, after, nb)); /* running mean/var and num_batches_tracked untouched */
    /* a clean step after it updates them again */
    ASSERT_OK(trainer_step_on(tr, &bn_data, 6, 6, 1, 0, &r));
    ASSERT(!r.skipped);
    buffers_copy(m, after, sizeof after);
    ASSERT(memcmp(before, after, nb) != 0);
    dt_trainer_free(tr);
    dt_model_free(m);
}

/* A static scale: 9 overflowing steps in a row are skipped, the 10th is an
 * error; a clean step in between starts the count again. */
TEST(static_scale_overflowing_every_step_fails)
{
    dt_loss_scaler_params p = dt_loss_scaler_params_default();
    p.loss_scale = 1024;
    dt_loss_scaler *s;
    ASSERT_OK(dt_loss_scaler_init(&p, &s));
    for (int i = 0; i < DT_LOSS_SCALER_STATIC_MAX_RUN - 1; i++)
        ASSERT_OK(dt_loss_scaler_update(s, true));
    ASSERT_OK(dt_loss_scaler_update(s, false));
    for (int i = 0; i < DT_LOSS_SCALER_STATIC_MAX_RUN - 1; i++)
        ASSERT_OK(dt_loss_scaler_update(s, true));
    ASSERT_STATUS(dt_loss_scaler_update(s, true), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "static loss scale 1024 in 10 optimizer steps in a row");
    ASSERT_EQ_INT(dt_loss_scaler_scale(s), 1024);
    dt_loss_scaler_free(s);
}

int main(void)
{
    /* first: a child forked after the parent ran OpenMP regions can hang in libgomp */
    RUN(one_rank_nonfinite_stops_every_rank);
    RUN(single_process_names_the_parameter);
    RUN(check_runs_in_backward);
    RUN(check_in_backward_bf16_tied);
    RUN(skipped_step_keeps_the_buffers);
    RUN(static_scale_overflowing_every_step_fails);
    return TEST_REPORT();
}
