/* The trainer (train.h): the same arithmetic as the hand-written step it
 * replaced (bit-identical parameters), gradient accumulation, the schedule
 * (warm-up for every kind), clipping and the reported norm, static loss
 * scaling and the skipped overflow step, the divergence error, stop
 * requests, a user strategy called at its fixed points, bad parameters. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"

/* The old loop: zero_grad, forward, loss (/ accum), backward, clip, step. */
static void hand_steps(dt_model *m, int steps, int accum, double clip, const dt_sched_params *sched)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_optim *opt = make_sgd(m);
    for (int s = 0; s < steps; s++) {
        if (sched)
            dt_optim_set_lr(opt, dt_sched_lr(sched, s));
        dt_model_zero_grad(m);
        for (int j = 0; j < accum; j++) {
            ASSERT_OK(fwd_bwd(ctx, m, NULL, &k_mlp_data, (s * accum + j) * 6, 6, accum > 1 ? 1.0f / (float)accum : 1.0f));
            dt_ctx_reset(ctx);
        }
        if (clip > 0)
            ASSERT_OK(dt_clip_grad_norm(t_grads(m), t_numel(m), (float)clip, NULL));
        ASSERT_OK(dt_optim_step(opt));
    }
    dt_optim_free(opt);
    dt_ctx_free(ctx);
}

static bool same_params(const dt_model *a, const dt_model *b)
{
    return !memcmp(t_params(a), t_params(b), t_numel(a) * sizeof(float));
}

TEST(same_arithmetic_as_the_hand_loop)
{
    dt_set_num_threads(1);
    for (int accum = 1; accum <= 3; accum += 2) {
        dt_model *a = mlp_model(11), *b = mlp_model(11);
        hand_steps(a, 4, accum, 0.5, NULL);
        dt_trainer *tr;
        dt_strategy *s;
        ASSERT_OK(dt_strategy_none_init(&s));
        dt_trainer_params tp = dt_trainer_params_default();
        tp.sgd.lr = 0.05;
        tp.sgd.momentum = 0.9;
        tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
        tp.grad_accum = accum;
        tp.clip_grad_norm = 0.5;
        ASSERT_OK(dt_trainer_init(b, s, &tp, &tr));
        for (int st = 0; st < 4; st++) {
            dt_trainer_metrics r;
            ASSERT_OK(trainer_step_on(tr, &k_mlp_data, st * accum * 6, 6, accum, 6, &r));
            ASSERT_EQ_INT(r.step, st);
            ASSERT_EQ_INT(r.nmicro, accum);
            ASSERT_EQ_INT(r.samples, 6 * accum);
            ASSERT(r.grad_norm > 0 && isfinite(r.grad_norm));
            ASSERT(!r.skipped && !r.stop);
        }
        ASSERT_EQ_INT(dt_trainer_steps(tr), 4);
        ASSERT(same_params(a, b)); /* bit-identical */
        dt_model *init = mlp_model(11);
        ASSERT(!same_params(init, b)); /* and they moved */
        dt_model_free(init);
        dt_trainer_free(tr);
        dt_model_free(a);
        dt_model_free(b);
    }
}

TEST(schedule_and_warmup)
{
    /* the warm-up rule the CLI had, now in dt_sched_lr for every kind */
    dt_sched_params sp = dt_sched_params_default();
    sp.kind = DT_SCHED_STEP;
    sp.base_lr = 0.1;
    sp.step_size = 2;
    sp.gamma = 0.5;
    sp.warmup_steps = 4;
    ASSERT_NEAR(dt_sched_lr(&sp, 0), 0.0, 0, 0);
    ASSERT_NEAR(dt_sched_lr(&sp, 1), 0.1 * 0.25, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&sp, 3), 0.1 * 0.5 * 0.75, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&sp, 4), 0.1 * 0.25, 1e-15, 0);
    sp.kind = DT_SCHED_CONSTANT;
    ASSERT_NEAR(dt_sched_lr(&sp, 2), 0.05, 1e-15, 0);
    ASSERT_NEAR(dt_sched_lr(&sp, 9), 0.1, 1e-15, 0);
    /* the trainer steps with the schedule, base_lr = the optimizer's lr */
    dt_model *a = mlp_model(2), *b = mlp_model(2);
    dt_sched_params hs = sp;
    hs.base_lr = 0.05;
    hand_steps(a, 5, 1, 0, &hs);
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.sched = sp; /* base_lr 0.1 is replaced by sgd.lr */
    dt_trainer *tr;
    ASSERT_OK(dt_trainer_init(b, s, &tp, &tr));
    for (int st = 0; st < 5; st++) {
        ASSERT_NEAR(dt_trainer_next_lr(tr), dt_sched_lr(&hs, st), 0, 0);
        dt_trainer_metrics r;
        ASSERT_OK(trainer_step_on(tr, &k_mlp_data, st * 6, 6, 1, 0, &r));
        ASSERT_NEAR(r.lr, dt_sched_lr(&hs, st), 0, 0);
    }
    ASSERT(same_params(a, b));
    dt_trainer_free(tr);
    dt_model_free(a);
    dt_model_free(b);
    /* OneCycle with Adam: each step's first beta from the schedule, the second held at 0.99 (DeepSpeed's);
       with SGD the betas are left alone (torch's SGD has none: DeepSpeed turns the cycling off) */
    for (int k = 0; k < 2; k++) {
        dt_model *c = mlp_model(2);
        ASSERT_OK(dt_strategy_none_init(&s));
        tp = dt_trainer_params_default();
        tp.optimizer = k ? DT_OPTIM_SGD : DT_OPTIM_ADAM;
        tp.adam.lr = tp.sgd.lr = 0.01;
        tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
        tp.sched.kind = DT_SCHED_ONE_CYCLE;
        tp.sched.cycle.first_steps = 2;
        tp.sched.cycle.decay_steps = 1;
        tp.sched.cycle.decay_mom_rate = 0.01;
        ASSERT_OK(dt_trainer_init(c, s, &tp, &tr));
        for (int st = 0; st < 6; st++) {
            dt_trainer_metrics r;
            ASSERT_OK(trainer_step_on(tr, &k_mlp_data, st * 6, 6, 1, 0, &r));
            double b1, b2, want;
            ASSERT(dt_sched_beta1(&tp.sched, st, &want));
            if (k) {
                ASSERT_STATUS(dt_optim_get_betas(dt_trainer_optim(tr), &b1, &b2), DT_ERR_UNSUPPORTED);
                continue;
            }
            ASSERT_OK(dt_optim_get_betas(dt_trainer_optim(tr), &b1, &b2));
            ASSERT_NEAR(b1, want, 0, 0);
            ASSERT_NEAR(b2, 0.99, 0, 0);
        }
        dt_trainer_free(tr);
        dt_model_free(c);
    }
}

TEST(loss_scaling_and_overflow)
{
    dt_model *a = mlp_model(4), *b = mlp_model(4);
    dt_trainer *ta, *tb;
    ASSERT_OK(make_trainer(a, NULL, 1, &ta));
    dt_strategy *s;
    ASSERT_OK(dt_strategy_none_init(&s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 0.05;
    tp.sgd.momentum = 0.9;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.loss_scale = 1024.0f; /* a power of two: scaling is exact */
    ASSERT_OK(dt_trainer_init(b, s, &tp, &tb));
    for (int st = 0; st < 3; st++) {
        dt_trainer_metrics ra, rb;
        ASSERT_OK(trainer_step_on(ta, &k_mlp_data, st * 6, 6, 1, 0, &ra));
        ASSERT_OK(trainer_step_on(tb, &k_mlp_data, st * 6, 6, 1, 0, &rb));
        ASSERT_NEAR(rb.loss, ra.loss, 0, 0); /* the reported loss is unscaled */
    }
    ASSERT(same_params(a, b));
    /* an overflow: an infinite input makes every gradient non-finite; the
     * step is skipped (no update, gradients zeroed), the next one runs */
    const size_t n = t_numel(b);
    float *before = malloc(n * sizeof *before);
    memcpy(before, t_params(b), n * sizeof *before);
    float x[6 * 8];
    int64_t y[6] = {0, 1, 2, 3, 0, 1};
    for (int i = 0; i < 6 * 8; i++)
        x[i] = i == 3 ? INFINITY : 0.5f;
    dt_trainer_batch bad = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){6, 8}, y, DT_I64, 1, (int64_t[]){6});
    dt_trainer_metrics r;
    ASSERT_OK(dt_trainer_step(tb, &bad, 1, &r));
    ASSERT(r.skipped);
    ASSERT_EQ_INT(dt_trainer_steps(tb), 3);
    ASSERT(!memcmp(before, t_params(b), n * sizeof *before));
    for (size_t i = 0; i < n; i++)
        ASSERT(t_grads(b)[i] == 0.0f);
    ASSERT_OK(trainer_step_on(tb, &k_mlp_data, 100, 6, 1, 0, &r));
    ASSERT(!r.skipped);
    ASSERT_EQ_INT(dt_trainer_steps(tb), 4);
    /* without loss scaling the same batch is an error naming the divergence */
    ASSERT_STATUS(dt_trainer_step(ta, &bad, 1, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "diverged");
    ASSERT_OK(trainer_step_on(ta, &k_mlp_data, 100, 6, 1, 0, &r)); /* and the trainer goes on */
    free(before);
    dt_trainer_free(ta);
    dt_trainer_free(tb);
    dt_model_free(a);
    dt_model_free(b);
}

/* A user strategy: counts the calls at each fixed point. */
typedef struct {
    int attach, begin, begin_sync, forward, wait, after;
} counting;

static dt_status c_attach(void *self, dt_model *m)
{
    (void)m;
    ((counting *)self)->attach++;
    return DT_OK;
}
static dt_status c_begin(void *self, bool sync)
{
    counting *c = self;
    c->begin++;
    c->begin_sync += sync;
    return DT_OK;
}
static dt_tensor *c_forward(void *self, dt_ctx *ctx, dt_model *m, dt_tensor *x)
{
    ((counting *)self)->forward++;
    return dt_model_forward(ctx, m, x);
}
static dt_status c_wait(void *self)
{
    ((counting *)self)->wait++;
    return DT_OK;
}
static dt_status c_after(void *self)
{
    ((counting *)self)->after++;
    return DT_OK;
}

TEST(user_strategy_fixed_points_and_stop)
{
    counting c = {0};
    dt_strategy_ops ops = {.version = DT_STRATEGY_OPS_VERSION,
                           .name = "counting",
                           .attach = c_attach,
                           .begin_micro = c_begin,
                           .forward = c_forward,
                           .wait = c_wait,
                           .allreduce_sum = NULL,
                           .owned_range = NULL,
                           .after_step = c_after,
                           .sync_buffers = NULL,
                           .rank = NULL,
                           .world = NULL,
                           .free = NULL};
    dt_strategy *s;
    ASSERT_OK(dt_strategy_init(&ops, &c, &s));
    ASSERT_STR_EQ(dt_strategy_name(s), "counting");
    ASSERT(dt_strategy_ddp(s) == NULL);
    dt_model *m = mlp_model(3);
    dt_trainer *tr;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    tp.grad_accum = 2;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    ASSERT_EQ_INT(c.attach, 1);
    dt_trainer_metrics r;
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 0, 4, 2, 4, &r));
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 8, 4, 2, 4, &r));
    ASSERT_EQ_INT(c.begin, 4);
    ASSERT_EQ_INT(c.begin_sync, 2); /* only the last micro-batch of each step syncs */
    ASSERT_EQ_INT(c.forward, 4);
    ASSERT_EQ_INT(c.wait, 2);
    ASSERT_EQ_INT(c.after, 2);
    ASSERT(!r.stop);
    dt_trainer_request_stop(tr);
    ASSERT_OK(trainer_step_on(tr, &k_mlp_data, 16, 4, 1, 0, &r));
    ASSERT(r.stop);
    dt_trainer_free(tr);
    dt_model_free(m);
}

static dt_tensor *failing_loss(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    (void)ud, (void)ctx, (void)out, (void)y;
    dt_error(DT_ERR_SHAPE, "no loss here");
    return NULL;
}

TEST(bad_parameters)
{
    dt_model *m = mlp_model(3);
    dt_trainer *tr = NULL;
    dt_strategy *s;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.grad_accum = 0;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG); /* s freed */
    tp = dt_trainer_params_default();
    tp.precision.param_dtype = DT_BF16; /* the model holds f32 parameters only */
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "holds no bf16 parameters");
    tp = dt_trainer_params_default();
    tp.precision.reduce_dtype = DT_I32;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "reduce_dtype");
    tp = dt_trainer_params_default();
    tp.use_scaler = true;
    tp.loss_scale = 8;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
    tp = dt_trainer_params_default();
    tp.sgd.lr = -1;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT(dt_trainer_init(m, s, &tp, &tr) < 0);
    ASSERT_STATUS(dt_trainer_init(NULL, NULL, NULL, &tr), DT_ERR_NULL);
    /* a NaN clip was refused by a message that named everything else */
    tp = dt_trainer_params_default();
    tp.clip_grad_norm = NAN;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "clip_grad_norm nan");
    /* schedules trained with before: an unknown kind as constant, a NaN floor or decay as NaN rates, negative
     * step counts (with which dt_sched_lr's differences could overflow) */
    for (int c = 0; c < 6; c++) {
        tp = dt_trainer_params_default();
        if (c == 0)
            tp.sched.kind = (dt_sched_kind)77;
        else if (c == 1)
            tp.sched.min_lr = NAN;
        else if (c == 2)
            tp.sched.gamma = -0.5;
        else if (c == 3)
            tp.sched.warmup_steps = -1;
        else if (c == 4)
            tp.sched.total_steps = -5;
        else
            tp.sched.warmup = (dt_warmup_kind)9;
        ASSERT_OK(dt_strategy_none_init(&s));
        ASSERT_STATUS(dt_trainer_init(m, s, &tp, &tr), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "schedule kind");
    }
    /* a loss that fails fails the step, with its message; the next step runs */
    ASSERT_OK(dt_strategy_none_init(&s));
    tp = dt_trainer_params_default();
    tp.loss_fn = failing_loss;
    ASSERT_OK(dt_trainer_init(m, s, &tp, &tr));
    dt_trainer_metrics r;
    ASSERT_STATUS(trainer_step_on(tr, &k_mlp_data, 0, 4, 1, 0, &r), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "no loss here");
    for (size_t i = 0; i < t_numel(m); i++)
        ASSERT(t_grads(m)[i] == 0.0f);
    ASSERT_STATUS(dt_trainer_step(tr, NULL, 1, &r), DT_ERR_NULL);
    /* a second trainer on the same model (both strategies would hook its parameters: two sets of reductions
       a step): refused while the first lives, taken once it is freed; a refused one leaves the first's claim */
    dt_trainer *tr2 = NULL;
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, NULL, &tr2), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "another dt_trainer");
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_STATUS(dt_trainer_init(m, s, NULL, &tr2), DT_ERR_STATE);
    dt_trainer_batch b = {0};
    ASSERT_STATUS(dt_trainer_step(tr, &b, 0, &r), DT_ERR_INVALID_ARG);
    /* an ndim out of range was clamped by dt_trainer_batch_make: 9 dims ran as the first 8, -1 was "no input" */
    static float xs[8];
    static int64_t ys[2];
    const int64_t shp[9] = {2, 4, 1, 1, 1, 1, 1, 1, 1};
    b = dt_trainer_batch_make(xs, DT_F32, 9, shp, ys, DT_I64, 1, shp);
    ASSERT_EQ_INT(b.x_ndim, 9);
    ASSERT_STATUS(dt_trainer_step(tr, &b, 1, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "x_ndim 9");
    b = dt_trainer_batch_make(xs, DT_F32, -1, NULL, ys, DT_I64, 1, shp);
    ASSERT_STATUS(dt_trainer_step(tr, &b, 1, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "x_ndim -1");
    b = dt_trainer_batch_make(xs, DT_F32, 2, shp, ys, DT_I64, -3, shp);
    ASSERT_STATUS(dt_trainer_step(tr, &b, 1, &r), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "y_ndim -3");
    double v[2] = {1, 2};
    ASSERT_STATUS(dt_trainer_allreduce_sum(tr, v, -1), DT_ERR_INVALID_ARG); /* was DT_OK */
    ASSERT_OK(dt_trainer_allreduce_sum(tr, v, 2));
    ASSERT(v[0] == 1 && v[1] == 2); /* one process: identity */
    ASSERT_STATUS(dt_trainer_save(tr, "", NULL), DT_ERR_INVALID_ARG); /* was DT_ERR_NULL */
    ASSERT_STATUS(dt_trainer_save(tr, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_bind_param(m, 99, NULL, NULL), DT_ERR_RANGE); /* said "data is NULL" */
    ASSERT_STR_CONTAINS(dt_last_error(), "index 99");
    dt_trainer_free(tr);
    ASSERT_OK(dt_strategy_none_init(&s));
    ASSERT_OK(dt_trainer_init(m, s, NULL, &tr2)); /* the model is free again */
    dt_trainer_free(tr2);
    dt_trainer_free(NULL);
    dt_strategy_free(NULL);
    dt_model_free(m);
}

int main(void)
{
    RUN(same_arithmetic_as_the_hand_loop);
    RUN(schedule_and_warmup);
    RUN(loss_scaling_and_overflow);
    RUN(user_strategy_fixed_points_and_stop);
    RUN(bad_parameters);
    return TEST_REPORT();
}
