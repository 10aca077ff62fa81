/* `dtrain train --pp N` under `dtrain run`: the MLP in 2 pipeline stages
 * (zbh1, 4 micro-batches per batch) gives the single-process run's step
 * losses; 4 ranks as 2 replicas x 2 stages (1f1b) give the 2-rank DDP
 * run's; the option errors are one line with exit 2. Losses are compared within
 * float rounding (relative 1e-5: the pipeline adds the micro-batches'
 * products as partial sums, tests/pipeline/pipe_train.h has the bound),
 * plus the metrics file's printing step (6 decimals). The GPT's pipeline
 * training is checked in tests/pipeline (the CLI's GPT needs token files). */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

static void run_model(cli_result *r, int ranks, const char *model, char *const *extra, const char *m)
{
    char *mlp[] = {"--mlp-dim", "16", "--mlp-hidden", "64", NULL};
    char *base[] = {"train", "--model", (char *)model, "--random-items", "64", "--batch", "4", "--limit-test", "16",
                    "--optimizer", "adamw", "--lr", "0.01", "--seed", "2", "--progress", "plain", "--log-every", "1",
                    "--threads", "1", "--metrics", (char *)m};
    char *args[64];
    int n = 0;
    if (ranks > 1) {
        static char nr[16];
        snprintf(nr, sizeof nr, "%d", ranks);
        args[n++] = "run", args[n++] = "-n", args[n++] = nr, args[n++] = "--", args[n++] = cli();
    }
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    for (char *const *e = mlp; *e; e++)
        args[n++] = *e;
    for (char *const *e = extra; e && *e; e++)
        args[n++] = *e;
    args[n] = NULL;
    cli_runv(r, 200, NULL, args);
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
}

static bool same_losses(const char *pa, const char *pb)
{
    double a[64], b[64];
    int na = cli_step_losses(pa, a, 64), nb = cli_step_losses(pb, b, 64);
    return cli_same_losses(a, na, b, nb, 1.5e-6); /* %.6f in the file */
}

TEST(mlp_pp2_equals_one_process)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/one.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/pp2.jsonl", cli_tmpdir());
    run_model(&r, 1, "mlp", NULL, m1);
    ASSERT_EQ_INT(r.code, 0);
    run_model(&r, 2, "mlp", (char *[]){"--pp", "2", "--pp-schedule", "zbh1", "--micro-batches", "4", NULL}, m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 1 data-parallel, schedule zbh1, 4 micro-batches");
    ASSERT(strstr(r.out, "[1] ") == NULL); /* one display */
    ASSERT(same_losses(m2, m1));
}

TEST(mlp_dp2_pp2_equals_ddp)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/ddp2.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/pp2dp2.jsonl", cli_tmpdir());
    run_model(&r, 2, "mlp", NULL, m1);
    ASSERT_EQ_INT(r.code, 0);
    run_model(&r, 4, "mlp", (char *[]){"--pp", "2", "--micro-batches", "2", NULL}, m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 data-parallel, schedule 1f1b, 2 micro-batches");
    ASSERT(same_losses(m2, m1));
}

TEST(option_errors)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--micro-batches", "4", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "no --pp");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--batch", "6", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "does not split into --micro-batches 4");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--save", "x", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "checkpoints of pipeline training");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--pp-schedule", "zb", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--pp-schedule");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--pp 2 needs a multiple of 2 ranks");
}

int main(void)
{
    RUN(option_errors);
    RUN(mlp_pp2_equals_one_process);
    RUN(mlp_dp2_pp2_equals_ddp);
    cli_cleanup();
    return TEST_REPORT();
}
