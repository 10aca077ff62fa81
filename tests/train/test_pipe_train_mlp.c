/* Pipeline training of the MLP zoo model (two units, two stages) equals
 * single-process training under gpipe, 1f1b and zbh1; interleaved needs
 * more units than the MLP has and m % p == 0, refused with the limit named
 * (pipe_train.h has what is compared and the bound). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "train/pipe_train.h"

TEST(mlp_every_schedule)
{
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++)
        if (k != DT_PIPE_INTERLEAVED)
            run("mlp", (dt_pipe_kind)k, 2, 1, 4);
    /* two units cannot make the 4 stages of pp 2 x v 2 */
    run_expect("mlp", DT_PIPE_INTERLEAVED, 2, 1, 4, "2 units cannot make 4 stages");
    /* interleaved's limit: m % p */
    run_expect("gpt", DT_PIPE_INTERLEAVED, 2, 1, 3, "must be a multiple of the pipeline ranks");
}

/* The memory report of a 2-stage MLP under AdamW: each rank counts its
 * own stage's parameters and gradients, and the optimizer's two states of
 * them; the two ranks together hold the model once. Also the message times
 * (dt_strategy_pipe_msg_times) and the trace (dt_strategy_pipe_trace) of
 * the step. */
static int memory_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_model_config mc = small_cfg("mlp");
    dt_model *m;
    dt_model_desc d;
    TH_OK(dt_model_create("mlp", 11, &mc, &m, &d));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = 2, pp.schedule = DT_PIPE_1F1B, pp.micro_batches = 2;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    float xf[B_GLOBAL * 32];
    make_batch("mlp", 0, B_GLOBAL, xf, NULL, NULL);
    dt_trainer_batch b = batch_of("mlp", B_GLOBAL, xf, NULL, NULL);
    TH_OK(dt_trainer_step(tr, &b, 1, NULL));
    dt_trainer_memory mem;
    TH_OK(dt_trainer_memory_get(tr, &mem));
    size_t whole = 0;
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        TH_OK(dt_model_entry(m, e, &pi));
        whole += pi.is_buffer || pi.tied_to >= 0 ? 0 : pi.numel * sizeof(float);
    }
    double mine[3] = {(double)mem.param_bytes, (double)mem.grad_bytes, (double)mem.optim_bytes}, sum[3];
    TH_OK(dt_pg_allreduce(pg, mine, sum, 3, DT_F64, DT_REDUCE_SUM));
    TH_CHECK(mem.param_bytes > 0 && mem.param_bytes < whole, "rank %d: params %zu of %zu bytes", rank,
             mem.param_bytes, whole);
    TH_CHECK(mem.grad_bytes == mem.param_bytes, "rank %d: grads %zu, params %zu", rank, mem.grad_bytes,
             mem.param_bytes);
    TH_CHECK(mem.optim_bytes == 2 * mem.param_bytes, "rank %d: AdamW state %zu bytes for %zu of parameters",
             rank, mem.optim_bytes, mem.param_bytes);
    TH_CHECK(sum[0] == (double)whole && sum[1] == (double)whole && sum[2] == 2.0 * (double)whole,
             "over the ranks: params %.0f, grads %.0f, state %.0f bytes; the model %zu", sum[0], sum[1], sum[2],
             whole);
    /* the last step's message times: 2 stages x 2 micro-batches, both
     * directions; a message ends its wait no earlier than its post */
    double t[24], all[24];
    TH_CHECK(dt_strategy_pipe_msg_times(s, t, 23) == DT_ERR_INVALID_ARG, "a wrong size was accepted");
    TH_OK(dt_strategy_pipe_msg_times(s, t, 24));
    for (int mb = 0; mb < 2; mb++) {
        int act = 0 * 2 + mb, grad = (1 * 2 + 1) * 2 + mb; /* stage 0's activation, stage 1's gradient */
        int sent = rank == 0 ? act : grad, got = rank == 0 ? grad : act;
        TH_CHECK(t[sent] > 0 && t[8 + sent] == 0, "rank %d: mb %d: post %.6f", rank, mb, t[sent]);
        TH_CHECK(t[8 + got] > 0 && t[16 + got] >= t[8 + got] && t[got] == 0, "rank %d: mb %d: wait %.6f..%.6f",
                 rank, mb, t[8 + got], t[16 + got]);
    }
    TH_OK(dt_pg_allreduce(pg, t, all, 24, DT_F64, DT_REDUCE_SUM));
    for (int k = 0; k < 8; k++)
        TH_CHECK(all[k] == 0 || all[16 + k] >= all[k], "message %d: received at %.6f, posted at %.6f", k,
                 all[16 + k], all[k]);
    /* the trace of the step: this rank's list of the table, each action's
     * times in order, busy = the compute spans, a waiting action starts
     * computing after its message's wait ended */
    const dt_pipe_action *acts, *want;
    const double *tt;
    int n, nwant;
    dt_pipe_stats stt;
    TH_OK(dt_strategy_pipe_stats(s, &stt));
    TH_CHECK(dt_strategy_pipe_trace(NULL, &acts, &tt, &n) == DT_ERR_NULL, "a NULL strategy was accepted");
    TH_OK(dt_strategy_pipe_trace(s, &acts, &tt, &n));
    dt_pipe_schedule *sc;
    TH_OK(dt_pipe_schedule_build(DT_PIPE_1F1B, 2, 2, 1, &sc));
    TH_OK(dt_pipe_schedule_actions(sc, rank, &want, &nwant));
    TH_CHECK(n == nwant, "rank %d: %d actions traced, the table has %d", rank, n, nwant);
    double busy = 0, prev = stt.start_s;
    int ncomp = 0;
    for (int i = 0; i < n; i++) {
        const double *e = tt + DT_PIPE_TRACE_N * i;
        TH_CHECK(acts[i].op == want[i].op && acts[i].stage == want[i].stage && acts[i].mb == want[i].mb,
                 "rank %d: action %d differs from the table's", rank, i);
        TH_CHECK(prev <= e[DT_PIPE_TRACE_BEGIN] && e[DT_PIPE_TRACE_BEGIN] <= e[DT_PIPE_TRACE_RUN] &&
                     e[DT_PIPE_TRACE_RUN] <= e[DT_PIPE_TRACE_DONE] && e[DT_PIPE_TRACE_DONE] <= e[DT_PIPE_TRACE_END],
                 "rank %d: action %d: times out of order (%.6f %.6f %.6f %.6f after %.6f)", rank, i,
                 e[DT_PIPE_TRACE_BEGIN], e[DT_PIPE_TRACE_RUN], e[DT_PIPE_TRACE_DONE], e[DT_PIPE_TRACE_END], prev);
        prev = e[DT_PIPE_TRACE_END];
        bool comp = acts[i].op <= DT_PIPE_BW;
        if (comp) {
            ncomp++;
            busy += e[DT_PIPE_TRACE_DONE] - e[DT_PIPE_TRACE_RUN];
            TH_CHECK(e[DT_PIPE_TRACE_CPU] > 0 && e[DT_PIPE_TRACE_CPU] <= e[DT_PIPE_TRACE_DONE] - e[DT_PIPE_TRACE_RUN] + 1e-3,
                     "rank %d: action %d: CPU %.6f s of %.6f s", rank, i, e[DT_PIPE_TRACE_CPU],
                     e[DT_PIPE_TRACE_DONE] - e[DT_PIPE_TRACE_RUN]);
            /* F on stage 1 waits for the activation, B on stage 0 for the gradient */
            int dir = acts[i].op == DT_PIPE_F ? 0 : 1, from = rank == 1 ? 0 : 1;
            if ((rank == 1) == (acts[i].op == DT_PIPE_F)) {
                int k = (dir * 2 + from) * 2 + acts[i].mb;
                TH_CHECK(t[16 + k] > 0 && e[DT_PIPE_TRACE_BEGIN] <= t[8 + k] && t[16 + k] <= e[DT_PIPE_TRACE_RUN],
                         "rank %d: action %d: wait %.6f..%.6f outside %.6f..%.6f", rank, i, t[8 + k], t[16 + k],
                         e[DT_PIPE_TRACE_BEGIN], e[DT_PIPE_TRACE_RUN]);
            }
        } else {
            TH_CHECK(e[DT_PIPE_TRACE_RUN] == e[DT_PIPE_TRACE_BEGIN] && e[DT_PIPE_TRACE_DONE] == e[DT_PIPE_TRACE_END],
                     "rank %d: action %d (a message) has compute times", rank, i);
            /* its CPU time: the post's, within its wall time (plus the clocks' granularity) */
            TH_CHECK(e[DT_PIPE_TRACE_CPU] >= 0 && e[DT_PIPE_TRACE_CPU] <= e[DT_PIPE_TRACE_END] - e[DT_PIPE_TRACE_BEGIN] + 1e-3,
                     "rank %d: action %d (a message): CPU %.6f s of %.6f s", rank, i, e[DT_PIPE_TRACE_CPU],
                     e[DT_PIPE_TRACE_END] - e[DT_PIPE_TRACE_BEGIN]);
        }
    }
    TH_CHECK(ncomp == 4, "rank %d: %d compute actions, want 4 (F, B of 2 micro-batches)", rank, ncomp);
    TH_CHECK(prev <= stt.end_s, "rank %d: the last action ended after the step", rank);
    TH_CHECK(busy > 0 && busy <= stt.busy_s * (1 + 1e-9) + 1e-12 && busy >= stt.busy_s * (1 - 1e-9) - 1e-12,
             "rank %d: the trace's compute %.9f s, busy_s %.9f s", rank, busy, stt.busy_s);
    dt_pipe_schedule_free(sc);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(mlp_memory_per_stage)
{
    int codes[2];
    ASSERT_EQ_INT(th_run(2, 60.0, memory_body, NULL, codes), 0);
}

/* A failing stage (mode 0: its process dies between steps; mode 1: its
 * loss fails on micro-batch 1 of step 2, mid-schedule): the other rank's
 * step fails within seconds (not at the group's 60 s timeout) with an
 * error naming what happened, without a crash or a hang; a further step
 * fails on the ranks left (the pipeline group has failed: no later message
 * can be matched with one of the abandoned schedule), and everything frees
 * cleanly (ASan: the executor's buffers of the abandoned schedule are
 * neither freed under requests in flight nor lost).
 * world 4 (two replicas of a 2-stage pipeline, mode 1): only pipeline 0's
 * last stage (rank 1) fails; the other pipeline (ranks 2, 3), which waits
 * for pipeline 0's gradients in the data-parallel average, must fail as
 * fast, with the cause, while ranks 0 and 1 stay alive (they wait on the
 * shared page until 2 and 3 have seen the failure), so no dead-peer check
 * can stand in for the failure reaching the replicas. */
typedef struct {
    dt_pipe_kind kind;
    int mode, world;
} fail_cfg;

static int loss_calls, loss_rank;
static dt_model_desc *loss_desc;

static dt_tensor *failing_loss(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    (void)ud;
    if (loss_rank == 1 && ++loss_calls == 4 + 2) { /* step 2 (4 micro-batches a step), micro-batch 1 */
        dt_error(DT_ERR_INVALID_ARG, "test loss: refusing micro-batch 1 of step 2");
        return NULL;
    }
    return dt_model_desc_loss_fn(loss_desc, ctx, out, y);
}

static int fail_body(int rank, int size, void *arg)
{
    const fail_cfg *c = arg;
    dt_model_config mc = small_cfg("mlp");
    dt_model *m;
    dt_model_desc d;
    TH_OK(dt_model_create("mlp", 11, &mc, &m, &d));
    dt_pg_params pgp = dt_pg_params_default();
    pgp.rank = rank, pgp.world_size = size, pgp.job_id = th_job, pgp.backend = "shm", pgp.timeout_s = 60;
    dt_pg *pg;
    TH_OK(dt_pg_init(&pgp, &pg));
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = 2, pp.schedule = c->kind, pp.micro_batches = 4;
    dt_strategy *s;
    TH_OK(dt_strategy_pipe_init(pg, &pp, &s));
    dt_trainer_params tp = dt_trainer_params_default();
    loss_desc = &d, loss_calls = 0, loss_rank = rank;
    tp.loss_fn = c->mode == 1 ? failing_loss : dt_model_desc_loss_fn;
    tp.loss_ud = &d;
    dt_trainer *tr;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    float xf[B_GLOBAL * 32];
    make_batch("mlp", 0, B_GLOBAL, xf, NULL, NULL);
    dt_trainer_batch b = batch_of("mlp", B_GLOBAL, xf, NULL, NULL);
    TH_OK(dt_trainer_step(tr, &b, 1, NULL));
    if (c->mode == 0 && rank == 1) {
        fflush(NULL);
        _exit(0);
    }
    double t0 = dt_time_s();
    dt_status st = dt_trainer_step(tr, &b, 1, NULL);
    double took = dt_time_s() - t0;
    TH_CHECK(st < 0, "a step with a failing pipeline stage succeeded");
    if (c->mode == 0) {
        TH_CHECK(strstr(dt_last_error(), "pipeline: receiving the gradient of stage 0") != NULL,
                 "the error does not name the message: %s", dt_last_error());
    } else {
        TH_CHECK(strstr(dt_last_error(), "pipeline rank 1 broke off its schedule") != NULL &&
                     strstr(dt_last_error(), "test loss: refusing micro-batch 1 of step 2") != NULL,
                 "rank %d: the error does not name the failing rank and its cause: %s", rank, dt_last_error());
    }
    TH_CHECK(took < 15, "the step took %.1f s to notice the failure", took);
    if (size > 2 && rank >= 2)
        th_shared[rank] = 1.0; /* the other pipeline has seen it */
    for (double t1 = dt_time_s(); size > 2 && rank < 2 && !(th_shared[2] && th_shared[3]) && dt_time_s() - t1 < 40;)
        usleep(10000);
    TH_CHECK(dt_trainer_step(tr, &b, 1, NULL) < 0, "a later step after a failed schedule succeeded");
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(mlp_failing_stage)
{
    for (int mode = 0; mode < 2; mode++)
        for (int k = 0; k < DT_PIPE_KIND_COUNT; k++) {
            if (k == DT_PIPE_INTERLEAVED)
                continue;
            fail_cfg c = {(dt_pipe_kind)k, mode, 2};
            int codes[2];
            ASSERT_EQ_INT(th_run(2, 60.0, fail_body, &c, codes), 0);
        }
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++) {
        if (k == DT_PIPE_INTERLEAVED)
            continue;
        fail_cfg c = {(dt_pipe_kind)k, 1, 4};
        int codes[4];
        ASSERT_EQ_INT(th_run(4, 90.0, fail_body, &c, codes), 0);
    }
}

int main(void)
{
    RUN(mlp_every_schedule);
    RUN(mlp_memory_per_stage);
    RUN(mlp_failing_stage);
    return TEST_REPORT();
}
