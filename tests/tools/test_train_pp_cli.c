/* `dtrain train --pp N` under `dtrain run`: the MLP in 2 pipeline stages
 * (zbh1, 4 micro-batches per batch) gives the single-process run's step
 * losses; 4 ranks as 2 replicas x 2 stages (1f1b) give the 2-rank DDP
 * run's; the option errors are one line with exit 2. Losses are compared within
 * float rounding (relative 1e-5: the pipeline adds the micro-batches'
 * products as partial sums, tests/pipeline/pipe_train.h has the bound),
 * plus the metrics file's printing step (6 decimals). The GPT (token files)
 * in 2 stages under the interleaved schedule (4 chunks of its 5 units
 * over 2 ranks) gives the single-process step losses and validation loss
 * (evaluation under --pp: every rank takes the other stages' parameters,
 * then runs the whole model); test_train_3d_cli.c adds --tp and --dp.
 * --pp-balance params and time train the same (the MLP dp 2 x pp 2 and the
 * GPT balanced by time: the units timed on the data's first micro-batch). */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

static void run_model(cli_result *r, int ranks, const char *model, char *const *extra, const char *m)
{
    char *mlp[] = {"--mlp-dim", "16", "--mlp-hidden", "64", NULL};
    char *base[] = {"train", "--model", (char *)model, "--random-items", "64", "--batch", "4", "--limit-test", "16",
                    "--optimizer", "adamw", "--lr", "0.01", "--seed", "2", "--progress", "plain", "--log-every", "1",
                    "--threads", "1", "--metrics", (char *)m, NULL};
    cli_run_ranks(r, 200, NULL, ranks, 3, (char *const *const[]){base, mlp, extra});
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
    /* balanced by measured time (the MLP's two units make the only cut: the
     * replicas' timing and agreement on it run, from the data's first rows) */
    run_model(&r, 4, "mlp", (char *[]){"--pp", "2", "--micro-batches", "2", "--pp-balance", "time", NULL}, m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 data-parallel, schedule 1f1b, 2 micro-batches");
    ASSERT_STR_CONTAINS(r.out, "pipeline stages balanced by measured time: stage 0 has units [0, 1)");
    ASSERT(same_losses(m2, m1));
}

TEST(gpt_pp2_equals_one_process)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    char bin[300], data[320], m1[300], m2[300];
    uint16_t tok[2000];
    for (int i = 0; i < 2000; i++)
        tok[i] = (uint16_t)((i % 7) * 5 + (i / 7) % 2);
    snprintf(bin, sizeof bin, "%s/tok.bin", cli_tmpdir());
    ASSERT_EQ_INT(dt_tokens_write(bin, tok, 2000), DT_OK);
    snprintf(data, sizeof data, "tokens:%s", bin);
    snprintf(m1, sizeof m1, "%s/g1.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/g2.jsonl", cli_tmpdir());
    char *one[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                   "16", "--data", data, "--val-data", data, "--limit-train", "24", "--limit-test", "8", "--batch",
                   "4", "--optimizer", "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress", "plain",
                   "--log-every", "1", "--metrics", m1, NULL};
    cli_runv(&r, 200, NULL, one);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = cli_out_value(r.out, "val loss: ");
    char *two[64] = {"run", "-n", "2", "--", cli()};
    int n = 5;
    for (int i = 0; one[i]; i++)
        two[n++] = !strcmp(one[i], m1) ? m2 : one[i];
    two[n++] = "--pp", two[n++] = "2", two[n++] = "--pp-schedule", two[n++] = "interleaved";
    two[n++] = "--micro-batches", two[n++] = "2", two[n] = NULL;
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 1 data-parallel, schedule interleaved");
    double v2 = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "gpt val loss: one process %.6f, --pp 2 %.6f\n", v1, v2);
    ASSERT(fabs(v1 - v2) <= 2e-4); /* printed with 4 decimals */
    double a[64], b[64];
    int na = cli_step_losses(m2, a, 64), nb = cli_step_losses(m1, b, 64);
    ASSERT_EQ_INT(na, 6);
    ASSERT(cli_same_losses(a, na, b, nb, 1.5e-6));
    /* the stages balanced by parameter count (--pp-balance params): the same training */
    n -= 4; /* keeps --pp 2 */
    two[n++] = "--pp-schedule", two[n++] = "1f1b", two[n++] = "--pp-balance", two[n++] = "params";
    two[n++] = "--micro-batches", two[n++] = "2", two[n] = NULL;
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    na = cli_step_losses(m2, a, 64);
    ASSERT_EQ_INT(na, 6);
    ASSERT(cli_same_losses(a, na, b, nb, 1.5e-6));
    /* ... by measured time (--pp-balance time: timed on the first micro-batch of the data) */
    two[n - 3] = "time";
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "pipeline stages balanced by measured time: stage 0 has units [0, ");
    na = cli_step_losses(m2, a, 64);
    ASSERT_EQ_INT(na, 6);
    ASSERT(cli_same_losses(a, na, b, nb, 1.5e-6));
}

TEST(option_errors)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--micro-batches", "4", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "no --pp");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp-balance", "params", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "no --pp");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--pp-balance", "flops", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--pp-balance");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--batch", "6", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "does not split into --micro-batches 4");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--pp", "2", "--zero", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "do not combine with --zero 2|3 or --fsdp");
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
    RUN(gpt_pp2_equals_one_process);
    cli_cleanup();
    return TEST_REPORT();
}
