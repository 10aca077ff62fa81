/* Generation through a pipeline's stages (dt_strategy_pipe_generate,
 * pipeline.h) on real processes: a GPT of 4 blocks with its wte tied to the
 * head (held by the first and the last stage) is trained 2 steps under
 * "pipe" (1f1b on 2 ranks; interleaved, 4 stages on 2 ranks; interleaved
 * with 2 replicas), saved, and loaded into a single-process trainer, so the
 * two hold the same weights bit for bit (test_pipe_stage_memory checks
 * that load). Then every rank of the pipeline generates and must return
 * exactly the tokens dt_model_generate gives on the single-process model:
 * greedy, sampled with top-k, and sampled from all tokens (the same
 * Philox draws), with a sequence longer than block_size so that the window
 * slides; greedy to a stop token (every rank stops at it) and top-p with a
 * repetition penalty. The sampled runs must differ from the greedy one (else the draw
 * would not be tested). Last, a rank failing mid-generation (its ln_f
 * fails on the 4th token) and a rank given bad arguments fail every rank
 * at once with its message (the group's timeout is 300 s, past the
 * harness's limit). */
// dt-test-timeout: 300
// dt-test-labels: threads
#include "comm/harness.h"
#include "model_util.h"
#include "test.h"
#include "tmp_util.h"

#include "dtrain/models.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define T_SEQ 8
#define B_ROWS 8
#define BLOCK 16
#define NEW 24 /* 3 prompt tokens + 24 > BLOCK: the window slides */

static dt_model_config cfg(void)
{
    dt_model_config c = dt_model_config_default();
    c.n_layer = 4, c.n_head = 2, c.n_embd = 64, c.block_size = BLOCK, c.vocab_size = 512, c.seq = T_SEQ;
    return c;
}

typedef struct {
    const char *dir;
    dt_pipe_kind kind;
    int dp; /* replicas (world = 2 dp) */
} cfg_arg;

static dt_status trainer_for(dt_model *m, dt_model_desc *d, dt_strategy *s, dt_trainer **tr)
{
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 1e-2;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = d;
    return dt_trainer_init(m, s, &tp, tr);
}

static dt_status pipe_trainer(dt_pg *pg, int pp, dt_pipe_kind kind, dt_model *m, dt_model_desc *d, dt_trainer **tr)
{
    dt_pipe_params p = dt_pipe_params_default();
    p.pp = pp;
    p.schedule = kind;
    p.micro_batches = 2;
    dt_strategy *s;
    dt_status st = dt_strategy_pipe_init(pg, &p, &s);
    return st < 0 ? st : trainer_for(m, d, s, tr);
}

static int body(int rank, int size, void *arg)
{
    const cfg_arg *a = arg;
    dt_model_config mc = cfg();
    dt_model *m, *ref;
    dt_model_desc dm, dref;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &dm));
    TH_OK(dt_model_create("gpt-micro", 12, &mc, &ref, &dref)); /* other weights until the load */
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_strategy *none;
    TH_OK(dt_strategy_none_init(&none));
    dt_trainer *tr, *trr;
    TH_OK(pipe_trainer(pg, size / a->dp, a->kind, m, &dm, &tr));
    TH_OK(trainer_for(ref, &dref, none, &trr));

    int64_t x[B_ROWS * T_SEQ], y[B_ROWS * T_SEQ];
    for (int64_t i = 0; i < B_ROWS * T_SEQ; i++)
        x[i] = (i * 7 + 3) % 512, y[i] = (i * 5 + 1) % 512;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){B_ROWS, T_SEQ}, y, DT_I64, 2,
                                               (int64_t[]){B_ROWS, T_SEQ});
    for (int step = 0; step < 2; step++) {
        dt_trainer_metrics mp;
        TH_OK(dt_trainer_step(tr, &b, 1, &mp));
    }
    char dir[400];
    snprintf(dir, sizeof dir, "%s/dp%d_%s", a->dir, a->dp, dt_pipe_kind_name(a->kind));
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    TH_OK(dt_trainer_save(tr, dir, &sp));
    TH_OK(dt_trainer_load(trr, dir, NULL));

    const int64_t prompt[3] = {5, 17, 300};
    dt_generate_params gp[5];
    for (int k = 0; k < 5; k++)
        gp[k] = dt_generate_params_default();
    const char *what[5] = {"greedy", "top-k 40, temperature 1", "all tokens, temperature 0.7",
                           "greedy to a stop token", "top-p 0.8, repetition penalty 1.3"};
    gp[0].temperature = 0.0f;
    gp[1].top_k = 40, gp[1].seed = 1234;
    gp[2].temperature = 0.7f, gp[2].seed = 7;
    gp[3].temperature = 0.0f, gp[3].n_eos = 1; /* its stop token: greedy's fifth, below */
    gp[4].top_p = 0.8f, gp[4].repetition_penalty = 1.3f, gp[4].seed = 3;
    int64_t got[5][3 + NEW], want[5][3 + NEW];
    for (int k = 0; k < 5; k++) {
        gp[k].max_new_tokens = NEW;
        if (k == 3)
            gp[k].eos_ids[0] = want[0][3 + 4];
        int64_t n = 0, nr = 0, len = 3 + NEW;
        for (int i = 0; k == 3 && i < 5; i++) /* where greedy first gave it: the sequence ends there */
            if (want[0][3 + i] == gp[k].eos_ids[0] && len == 3 + NEW)
                len = 3 + i + 1;
        TH_OK(dt_strategy_pipe_generate(dt_trainer_strategy(tr), &gp[k], prompt, 3, got[k], 3 + NEW, &n));
        TH_OK(dt_model_generate(ref, &gp[k], prompt, 3, want[k], 3 + NEW, &nr));
        TH_CHECK(n == len && nr == len, "rank %d, %s: %lld and %lld tokens, want %lld", rank, what[k], (long long)n,
                 (long long)nr, (long long)len);
        for (int i = 0; i < len; i++)
            TH_CHECK(got[k][i] == want[k][i], "rank %d, %s: token %d is %lld through the stages, %lld in one process",
                     rank, what[k], i, (long long)got[k][i], (long long)want[k][i]);
    }
    TH_CHECK(memcmp(got[0], got[1], sizeof got[0]) && memcmp(got[0], got[2], sizeof got[0]),
             "rank %d: the sampled sequences equal the greedy one (the draws are not tested)", rank);
    if (rank == 0) {
        fprintf(stderr, "dp %d, %s: greedy", a->dp, dt_pipe_kind_name(a->kind));
        for (int i = 0; i < 3 + NEW; i++)
            fprintf(stderr, " %lld", (long long)got[0][i]);
        fprintf(stderr, "\n");
    }
    /* the model's mode is restored: still training */
    TH_CHECK(dt_module_is_training(dt_model_root(m)), "rank %d: the model was left in eval mode", rank);
    dt_trainer_metrics mp;
    TH_OK(dt_trainer_step(tr, &b, 1, &mp)); /* and the pipeline still trains after generating */
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

static int calls;
static dt_status fail_4th(dt_ctx *ctx, dt_module *mod, dt_tensor *x, void *ud)
{
    (void)ctx, (void)mod, (void)x, (void)ud;
    return ++calls == 4 ? dt_error(DT_ERR_INVALID_ARG, "an injected ln_f failure") : DT_OK;
}

/* how: 0 the ln_f (on the last stage) fails on the 4th token; 1 the last
 * rank is given top_k -1 */
static int body_fail(int rank, int size, void *arg)
{
    const int how = *(const int *)arg;
    dt_model_config mc = cfg();
    dt_model *m;
    dt_model_desc dm;
    TH_OK(dt_model_create("gpt-micro", 11, &mc, &m, &dm));
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_trainer *tr;
    TH_OK(pipe_trainer(pg, size, DT_PIPE_1F1B, m, &dm, &tr));
    int64_t x[B_ROWS * T_SEQ], y[B_ROWS * T_SEQ];
    for (int64_t i = 0; i < B_ROWS * T_SEQ; i++)
        x[i] = (i * 7 + 3) % 512, y[i] = (i * 5 + 1) % 512;
    dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){B_ROWS, T_SEQ}, y, DT_I64, 2,
                                               (int64_t[]){B_ROWS, T_SEQ});
    dt_trainer_metrics mp;
    TH_OK(dt_trainer_step(tr, &b, 1, &mp));
    dt_pipe_stats stt;
    TH_OK(dt_strategy_pipe_stats(dt_trainer_strategy(tr), &stt));
    const bool last = stt.stage_first + (stt.stage_count - 1) * size == size - 1;
    dt_generate_params gp = dt_generate_params_default();
    gp.max_new_tokens = 10;
    if (how == 0)
        TH_OK(dt_module_add_forward_pre_hook(dt_model_find_module(m, "transformer.ln_f"), fail_4th, NULL, NULL));
    else if (last)
        gp.top_k = -1;
    const int64_t prompt[2] = {1, 2};
    int64_t out[12], n = -1;
    dt_status st = dt_strategy_pipe_generate(dt_trainer_strategy(tr), &gp, prompt, 2, out, 12, &n);
    const char *want = how == 0 ? "an injected ln_f failure" : "top_k";
    TH_CHECK(st < 0, "rank %d: the generation succeeded", rank);
    TH_CHECK(strstr(dt_last_error(), want), "rank %d: error '%s'", rank, dt_last_error());
    TH_CHECK(how == 1 || !last || calls == 4, "rank %d: ln_f ran %d times", rank, calls);
    fprintf(stderr, "rank %d (n %lld): %s\n", rank, (long long)n, dt_last_error());
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

static void run_kind(dt_pipe_kind kind, int dp)
{
    cfg_arg a = {t_tmpdir("pipe_generate"), kind, dp};
    ASSERT_NE_INT(a.dir[0], 0);
    int codes[4];
    ASSERT_EQ_INT(th_run(2 * dp, 90.0, body, &a, codes), 0);
}

TEST(two_stages_generate_the_single_process_tokens) { run_kind(DT_PIPE_1F1B, 1); }

TEST(interleaved_four_stages_on_two_ranks) { run_kind(DT_PIPE_INTERLEAVED, 1); }

TEST(interleaved_two_replicas) { run_kind(DT_PIPE_INTERLEAVED, 2); }

TEST(a_rank_failing_mid_generation_fails_every_rank_at_once)
{
    unsetenv("DT_COMM_TIMEOUT"); /* 300 s: a rank left waiting outlives the harness's 60 */
    int codes[2], how = 0;
    ASSERT_EQ_INT(th_run(2, 60.0, body_fail, &how, codes), 0);
}

TEST(a_rank_given_bad_arguments_fails_every_rank_at_once)
{
    unsetenv("DT_COMM_TIMEOUT");
    int codes[2], how = 1;
    ASSERT_EQ_INT(th_run(2, 60.0, body_fail, &how, codes), 0);
}

TEST(not_a_pipe_strategy)
{
    dt_strategy *none;
    ASSERT_OK(dt_strategy_none_init(&none));
    int64_t prompt[1] = {1}, out[4], n = -1;
    ASSERT_STATUS(dt_strategy_pipe_generate(none, NULL, prompt, 1, out, 4, &n), DT_ERR_INVALID_ARG);
    ASSERT_EQ_INT((int)n, 0);
    dt_strategy_free(none);
}

int main(void)
{
    RUN(two_stages_generate_the_single_process_tokens);
    RUN(interleaved_four_stages_on_two_ranks);
    RUN(interleaved_two_replicas);
    RUN(a_rank_failing_mid_generation_fails_every_rank_at_once);
    RUN(a_rank_given_bad_arguments_fails_every_rank_at_once);
    RUN(not_a_pipe_strategy);
    t_rm_rf(t_tmpdir("pipe_generate"));
    return TEST_REPORT();
}
