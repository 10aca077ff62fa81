/* PowerSGD's state in trainer checkpoints (real processes, shm):
 *   - exact resume: DDP with the PowerSGD hook (rank 1 with warm start and
 *     one bucket; rank 2 without warm start over one bucket per parameter,
 *     so each step draws new Qs), checkpoints saved before start_iter and
 *     after it; a fresh run loaded from each trains to the end with the
 *     same loss at every step, bit for bit, and its final checkpoint equals
 *     the uninterrupted run's tensor for tensor (parameters, AdamW state,
 *     Qs, every rank's error memory);
 *   - the state matters: the error rows of the two ranks differ (per-rank
 *     memories), and a resume whose error memories are zeroed after the
 *     load does not reproduce the losses;
 *   - mismatches are refused naming the difference: another matrix rank,
 *     another bucket layout, another world size, error feedback off. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "dtrain/ckpt.h"
#include "ckpt_cmp.h"
#include "test.h"
#include "tmp_util.h"

#include <sys/stat.h>

static const char *tmpdir(void) { return t_tmpdir("psgdck"); }

#define STEPS 7

typedef struct {
    int rank;             /* matrix approximation rank */
    bool warm;
    double bucket_mb;     /* bucket_cap_mb (first_bucket_mb alike) */
    int64_t start;        /* start_iter */
    bool ef;
} cfg;

/* Linear(8,16) ReLU Linear(16,4): 16x8 is compressed at rank 1 and 2, 4x16
 * at rank 1 only; the biases never. */
static dt_status make(dt_pg *pg, const cfg *c, dt_model **m, dt_trainer **tr)
{
    *m = mlp_model(5);
    if (!*m)
        return DT_ERR_NO_MEMORY;
    dt_ddp_params dp = dt_ddp_params_default();
    dp.comm_hook = DT_COMM_HOOK_POWERSGD;
    dp.powersgd.rank = c->rank;
    dp.powersgd.warm_start = c->warm;
    dp.powersgd.use_error_feedback = c->ef;
    dp.powersgd.start_iter = c->start;
    dp.bucket_cap_mb = c->bucket_mb;
    dp.first_bucket_mb = c->bucket_mb;
    dt_strategy *s;
    dt_status st = dt_strategy_ddp_init(pg, &dp, &s);
    if (st < 0)
        return st;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 0.02;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    return dt_trainer_init(*m, s, &tp, tr);
}

/* Steps [from, to): step s takes samples [s * 16, + 16), rank r its 8. */
static dt_status steps(dt_trainer *tr, int rank, int from, int to, double *loss)
{
    for (int s = from; s < to; s++) {
        dt_trainer_metrics mt;
        dt_status st = trainer_step_on(tr, &k_mlp_data, s * 16 + rank * 8, 8, 1, 0, &mt);
        if (st < 0)
            return st;
        loss[s] = mt.loss;
    }
    return DT_OK;
}

typedef struct {
    cfg c;
    char dir[300];
} rcase;

static int body_resume(int rank, int W, void *arg)
{
    const rcase *rc = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    char a[400], b[400];
    snprintf(a, sizeof a, "%s/a", rc->dir);
    double ref[STEPS], got[STEPS];
    dt_model *m;
    dt_trainer *tr;
    /* uninterrupted, saving before start_iter (step 1) and after it (step 4) */
    TH_OK(make(pg, &rc->c, &m, &tr));
    TH_OK(steps(tr, rank, 0, 1, ref));
    TH_OK(dt_trainer_save(tr, a, NULL));
    TH_OK(steps(tr, rank, 1, 4, ref));
    TH_OK(dt_trainer_save(tr, a, NULL));
    TH_CHECK(dt_powersgd_iter(dt_ddp_powersgd(dt_strategy_ddp(dt_trainer_strategy(tr)))) == 4, "iter %lld",
             (long long)dt_powersgd_iter(dt_ddp_powersgd(dt_strategy_ddp(dt_trainer_strategy(tr)))));
    TH_OK(steps(tr, rank, 4, STEPS, ref));
    TH_OK(dt_trainer_save(tr, a, NULL));
    dt_trainer_free(tr);
    dt_model_free(m);
    /* resumed from each */
    const int from[2] = {1, 4};
    for (int k = 0; k < 2; k++) {
        char ck[500];
        snprintf(ck, sizeof ck, "%s/step-%08d", a, from[k]);
        snprintf(b, sizeof b, "%s/b%d", rc->dir, k);
        TH_OK(make(pg, &rc->c, &m, &tr));
        TH_OK(dt_trainer_load(tr, ck, NULL));
        TH_OK(steps(tr, rank, from[k], STEPS, got));
        for (int s = from[k]; s < STEPS; s++)
            TH_CHECK(got[s] == ref[s], "resumed at %d: step %d loss %.9g, uninterrupted %.9g", from[k], s, got[s],
                     ref[s]);
        TH_OK(dt_trainer_save(tr, b, NULL));
        dt_trainer_free(tr);
        dt_model_free(m);
        if (rank == 0) {
            char pa[500], pb[500];
            snprintf(pa, sizeof pa, "%s/step-%08d", a, STEPS);
            snprintf(pb, sizeof pb, "%s/step-%08d", b, STEPS);
            if (t_same_ckpt(pa, pb, true) < 0)
                return 1;
        }
    }
    /* the same resume with the error memories zeroed: the losses must move */
    char ck[500];
    snprintf(ck, sizeof ck, "%s/step-00000004", a);
    TH_OK(make(pg, &rc->c, &m, &tr));
    TH_OK(dt_trainer_load(tr, ck, NULL));
    dt_powersgd *ps = dt_ddp_powersgd(dt_strategy_ddp(dt_trainer_strategy(tr)));
    size_t zeroed = 0;
    for (int k = 0; k < dt_ddp_num_buckets(dt_strategy_ddp(dt_trainer_strategy(tr))); k++) {
        float *e;
        size_t n;
        TH_OK(dt_powersgd_state_array(ps, k, DT_POWERSGD_ERROR, &e, &n));
        memset(e, 0, n * sizeof *e);
        zeroed += n;
    }
    TH_CHECK(zeroed > 0, "no error memory after the load");
    TH_OK(steps(tr, rank, 4, STEPS, got));
    TH_CHECK(got[4] == ref[4], "step 4 is computed before the update the errors change");
    TH_CHECK(got[5] != ref[5] && got[6] != ref[6], "zeroed errors left the losses as they were (%.9g)", got[6]);
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

/* The checkpoint of step 4 holds both ranks' errors, and they differ. */
static void check_rows(const char *dir, bool warm)
{
    char ck[500];
    snprintf(ck, sizeof ck, "%s/a/step-00000004", dir);
    dt_ckpt *c;
    ASSERT_OK(dt_ckpt_open(ck, &c));
    ASSERT(dt_ckpt_meta(c, "dtrain.powersgd") != NULL);
    int64_t i = dt_ckpt_find(c, "powersgd.error");
    ASSERT(i >= 0);
    ASSERT(warm == (dt_ckpt_find(c, "powersgd.q") >= 0)); /* without warm start Q is drawn afresh */
    dt_ckpt_tensor t;
    ASSERT_OK(dt_ckpt_tensor_at(c, (size_t)i, &t));
    ASSERT_EQ_INT(t.ndim, 2);
    ASSERT_EQ_INT(t.shape[0], 2);
    const size_t n = (size_t)t.shape[1];
    float *e = malloc(2 * n * sizeof *e);
    ASSERT_OK(dt_ckpt_read(c, (size_t)i, 0, 2 * n, e, true));
    double diff = 0, mag = 0;
    for (size_t k = 0; k < n; k++) {
        diff += fabs((double)e[k] - e[n + k]);
        mag += fabs((double)e[k]);
    }
    ASSERT(mag > 0);
    ASSERT(diff > 0);
    free(e);
    dt_ckpt_close(c);
}

TEST(resume_exact_rank1_warm)
{
    rcase c = {.c = {.rank = 1, .warm = true, .bucket_mb = 25, .start = 2, .ef = true}};
    snprintf(c.dir, sizeof c.dir, "%s/warm", tmpdir());
    ASSERT(mkdir(c.dir, 0755) == 0);
    ASSERT_EQ_INT(th_run(2, 60.0, body_resume, &c, NULL), 0);
    check_rows(c.dir, true);
}

TEST(resume_exact_rank2_draws_buckets)
{
    /* 1e-4 MiB: one bucket per parameter; no warm start: a draw per step */
    rcase c = {.c = {.rank = 2, .warm = false, .bucket_mb = 1e-4, .start = 2, .ef = true}};
    snprintf(c.dir, sizeof c.dir, "%s/cold", tmpdir());
    ASSERT(mkdir(c.dir, 0755) == 0);
    ASSERT_EQ_INT(th_run(2, 60.0, body_resume, &c, NULL), 0);
    check_rows(c.dir, false);
}

/* ---- what a resume without the state gives, and mismatches ------------------------------- */

typedef struct {
    cfg c;
    char ck[500];
    const char *want;     /* error text, NULL: loads */
    bool diverges;        /* loads, but its losses must differ from the saved run's */
} mcase;

static int body_mismatch(int rank, int W, void *arg)
{
    const mcase *mc = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m;
    dt_trainer *tr;
    TH_OK(make(pg, &mc->c, &m, &tr));
    dt_status st = dt_trainer_load(tr, mc->ck, NULL);
    if (mc->want) {
        TH_CHECK(st == DT_ERR_MISMATCH || (st < 0 && rank != 0), "load: %s (%s)", dt_status_name(st),
                 dt_last_error());
        if (rank == 0 || W == 2)
            TH_CHECK(st < 0 && strstr(dt_last_error(), mc->want), "rank %d: '%s' lacks '%s'", rank, dt_last_error(),
                     mc->want);
    } else {
        TH_OK(st);
    }
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(mismatch_refused)
{
    /* a checkpoint of the first case, saved at step 4 */
    rcase base = {.c = {.rank = 1, .warm = true, .bucket_mb = 25, .start = 2, .ef = true}};
    snprintf(base.dir, sizeof base.dir, "%s/mm", tmpdir());
    ASSERT(mkdir(base.dir, 0755) == 0);
    ASSERT_EQ_INT(th_run(2, 60.0, body_resume, &base, NULL), 0);
    mcase mc = {.c = base.c};
    snprintf(mc.ck, sizeof mc.ck, "%s/a/step-00000004", base.dir);
    mc.c.rank = 2;
    mc.want = "matrix approximation rank 1 in the checkpoint, 2 in this run";
    ASSERT_EQ_INT(th_run(2, 60.0, body_mismatch, &mc, NULL), 0);
    mc.c = base.c;
    mc.c.bucket_mb = 1e-4;
    mc.want = "PowerSGD state of 1 gradient buckets in the checkpoint, 3 in this run";
    ASSERT_EQ_INT(th_run(2, 60.0, body_mismatch, &mc, NULL), 0);
    mc.c = base.c;
    mc.c.ef = false;
    mc.want = "error feedback on in the checkpoint, off in this run";
    ASSERT_EQ_INT(th_run(2, 60.0, body_mismatch, &mc, NULL), 0);
    mc.c = base.c;
    mc.want = "holds the PowerSGD error feedback of 2 ranks, this run has 3";
    ASSERT_EQ_INT(th_run(3, 60.0, body_mismatch, &mc, NULL), 0);
    /* another start_iter is allowed (iter is restored) */
    mc.c = base.c;
    mc.c.start = 5;
    mc.want = NULL;
    ASSERT_EQ_INT(th_run(2, 60.0, body_mismatch, &mc, NULL), 0);
}

/* dt_powersgd_state_load on malformed input: an error naming the field,
 * the state left as it was. */
TEST(state_bad_input)
{
    dt_powersgd *s;
    ASSERT_OK(dt_powersgd_init(NULL, &s));
    char *js;
    ASSERT_OK(dt_powersgd_state_save(s, &js));
    size_t nb = 10;
    ASSERT_OK(dt_powersgd_state_load(s, js, &nb, 1)); /* a fresh state (no buckets yet) loads anywhere */
    ASSERT_EQ_INT(dt_powersgd_state_load(s, "[1,2]", &nb, 1), DT_ERR_FORMAT);
    ASSERT_EQ_INT(dt_powersgd_state_load(s, "{\"version\":1", &nb, 1), DT_ERR_FORMAT);
    char bad[16384];
    const struct {
        const char *from, *to;
        dt_status st;
        const char *msg;
    } cases[] = {
        {"\"version\":1", "\"version\":2", DT_ERR_UNSUPPORTED, "version 2"},
        {"\"rank\":1", "\"rank\":-1", DT_ERR_FORMAT, "\"rank\""},
        {"\"iter\":0", "\"iter\":0.5", DT_ERR_FORMAT, "\"iter\""},
        {"\"warm_start\":true", "\"warm_start\":1", DT_ERR_FORMAT, "\"warm_start\""},
        {"\"seeder\":[", "\"seeder\":[625,", DT_ERR_FORMAT, "\"seeder\""},
        {"\"buckets\":[]", "\"buckets\":[{\"numel\":11,\"q\":0,\"error\":true}]", DT_ERR_MISMATCH,
         "gradient bucket 0 has 11 elements in the checkpoint, 10 in this run"},
        {"\"buckets\":[]", "\"buckets\":[{\"numel\":10,\"q\":\"x\",\"error\":true}]", DT_ERR_FORMAT,
         "\"q\""},
        {"\"random_seed\":0", "\"random_seed\":7", DT_ERR_MISMATCH, "random_seed 7 in the checkpoint, 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *at = strstr(js, cases[i].from);
        ASSERT(at != NULL);
        snprintf(bad, sizeof bad, "%.*s%s%s", (int)(at - js), js, cases[i].to, at + strlen(cases[i].from));
        ASSERT_EQ_INT(dt_powersgd_state_load(s, bad, &nb, 1), cases[i].st);
        ASSERT_STR_CONTAINS(dt_last_error(), cases[i].msg);
    }
    ASSERT_EQ_INT(dt_powersgd_iter(s), 0);
    dt_free(js);
    dt_powersgd_free(s);
}

int main(void)
{
    RUN(state_bad_input);
    RUN(resume_exact_rank1_warm);
    RUN(resume_exact_rank2_draws_buckets);
    RUN(mismatch_refused);
    return TEST_REPORT();
}
