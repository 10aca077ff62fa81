/* `dtrain train --pp N` under `dtrain run`: the MLP in 2 pipeline stages
 * (zbh1, 4 micro-batches per batch) gives the single-process run's step
 * losses; 4 ranks as 2 replicas x 2 stages (1f1b) give the 2-rank DDP
 * run's; the option errors are one line with exit 2. Losses are compared within
 * float rounding (relative 1e-5: the pipeline adds the micro-batches'
 * products as partial sums, tests/train/pipe_train.h has the bound),
 * plus the metrics file's printing step (6 decimals). The GPT (token files)
 * in 2 stages under the interleaved schedule (4 chunks of its 5 units
 * over 2 ranks) gives the single-process step losses and validation loss
 * (evaluation under --pp runs through the stages) and prints the same
 * --sample-every samples (generated through the stages, the last stage
 * picking each token with the single process's sampler and seed: the
 * weights differ from the single process's by rounding only, far below
 * what would move a top-40 draw or an argmax of this learnt stream);
 * test_train_3d_cli.c adds --tp and --dp.
 * --pp-balance params and time train the same (the MLP dp 2 x pp 2 and the
 * GPT balanced by time: the units timed on the data's first micro-batch).
 * The GPT at dp 2 x pp 2 prints the 2-rank DDP run's samples. */
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

/* The "sample at step N: ..." lines of a run's output, one after the
 * other (rank 0's: the runner's "[0] " prefix is not part of them). */
static int samples(const char *out, char *buf, size_t cap)
{
    int n = 0;
    size_t len = 0;
    buf[0] = 0;
    for (const char *p = strstr(out, "sample at step "); p; p = strstr(p + 1, "sample at step ")) {
        const char *e = strchr(p, '\n');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (len + l + 2 > cap)
            break;
        memcpy(buf + len, p, l);
        len += l;
        buf[len++] = '\n';
        buf[len] = 0;
        n++;
    }
    return n;
}

static bool same_losses(const char *pa, const char *pb)
{
    return cli_same_metrics(pa, pb, -1, 1.5e-6); /* %.6f in the file */
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

/* An epoch whose short last batch does not split into the micro-batches
 * (66 items, batch 4: 2 left, 4 micro-batches): that batch is dropped and
 * said; the run stopped at the epoch's end with exit 1 before. The steps
 * before it are the one-process run's. */
TEST(short_last_batch_dropped)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/tail_one.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/tail_pp2.jsonl", cli_tmpdir());
    char *const items[] = {"--random-items", "66", "--max-steps", "17", NULL};
    run_model(&r, 1, "mlp", items, m1);
    ASSERT_EQ_INT(r.code, 0);
    run_model(&r, 2, "mlp", (char *[]){"--random-items", "66", "--max-steps", "17", "--pp", "2", "--micro-batches",
                                       "4", NULL}, m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "last 2 samples (per replica) do not split into 4 micro-batches: dropped");
    double a[32], b[32];
    ASSERT_EQ_INT(cli_step_losses(m2, a, 32), 17);
    ASSERT_EQ_INT(cli_step_losses(m1, b, 32), 17);
    ASSERT(cli_same_losses(a, 16, b, 16, 1.5e-6)); /* the first epoch's 16 full batches */
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
    char data[320], m1[300], m2[300];
    ASSERT_EQ_INT(cli_stream_file("tok.bin", 2000, false, data, sizeof data), DT_OK);
    snprintf(m1, sizeof m1, "%s/g1.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/g2.jsonl", cli_tmpdir());
    char *one[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                   "16", "--data", data, "--val-data", data, "--limit-train", "24", "--limit-test", "8", "--batch",
                   "4", "--optimizer", "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress", "plain",
                   "--log-every", "1", "--metrics", m1, "--sample-every", "4", "--sample-tokens", "12", NULL};
    cli_runv(&r, 200, NULL, one);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = cli_out_value(r.out, "val loss: ");
    /* at step 4 and at the end (step 6): 8 prompt tokens | 12 new ones */
    static char s1[4096], s2[4096];
    ASSERT_EQ_INT(samples(r.out, s1, sizeof s1), 2);
    ASSERT_STR_CONTAINS(s1, "sample at step 4: ");
    ASSERT_STR_CONTAINS(s1, "sample at step 6: ");
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
    ASSERT_EQ_INT(samples(r.out, s2, sizeof s2), 2);
    fprintf(stderr, "one process:\n%s--pp 2 interleaved:\n%s", s1, s2);
    ASSERT_STR_EQ(s2, s1);
    ASSERT(fabs(v1 - v2) <= 2e-4); /* printed with 4 decimals */
    ASSERT(cli_same_metrics(m2, m1, 6, 1.5e-6));
    /* the stages balanced by parameter count (--pp-balance params): the same training */
    n -= 4; /* keeps --pp 2 */
    two[n++] = "--pp-schedule", two[n++] = "1f1b", two[n++] = "--pp-balance", two[n++] = "params";
    two[n++] = "--micro-batches", two[n++] = "2", two[n] = NULL;
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(cli_same_metrics(m2, m1, 6, 1.5e-6));
    ASSERT_EQ_INT(samples(r.out, s2, sizeof s2), 2);
    ASSERT_STR_EQ(s2, s1);
    /* ... by measured time (--pp-balance time: timed on the first micro-batch of the data) */
    two[n - 3] = "time";
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "pipeline stages balanced by measured time: stage 0 has units [0, ");
    ASSERT(cli_same_metrics(m2, m1, 6, 1.5e-6));
    ASSERT_EQ_INT(samples(r.out, s2, sizeof s2), 2);
    ASSERT_STR_EQ(s2, s1);
}

/* dp 2 x pp 2: each replica's pipeline generates; rank 0 prints the
 * 2-rank DDP run's sample */
TEST(gpt_dp2_pp2_samples_equal_ddp)
{
    if (!cli())
        DT_TEST_SKIP("DT_CLI is not set (run under ctest)");
    static cli_result r;
    static char s1[4096], s2[4096];
    char data[320];
    ASSERT_EQ_INT(cli_stream_file("tok_dp.bin", 2000, false, data, sizeof data), DT_OK);
    char *args[64] = {"run", "-n", "2", "--", cli(), "train", "--model", "gpt-micro", "--vocab-size", "41",
                      "--n-embd", "32", "--n-head", "4", "--seq", "16", "--data", data, "--val-data", data,
                      "--limit-train", "48", "--limit-test", "8", "--batch", "4", "--optimizer", "adamw", "--lr",
                      "0.01", "--seed", "3", "--threads", "1", "--progress", "plain", "--sample-every", "3",
                      "--sample-tokens", "10", NULL};
    int n = 0;
    while (args[n])
        n++;
    cli_runv(&r, 200, NULL, args);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(samples(r.out, s1, sizeof s1), 2); /* steps 3 and 6 */
    args[2] = "4";
    args[n++] = "--pp", args[n++] = "2", args[n++] = "--micro-batches", args[n++] = "2", args[n] = NULL;
    cli_runv(&r, 200, NULL, args);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 data-parallel");
    ASSERT_EQ_INT(samples(r.out, s2, sizeof s2), 2);
    fprintf(stderr, "DDP 2:\n%s--dp 2 x --pp 2:\n%s", s1, s2);
    ASSERT_STR_EQ(s2, s1);
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
    /* the ConvNet has no pipeline stages: refused with the options, before the ranks are counted (on
     * 2 ranks it exited 1 from the trainer's set-up) */
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--pp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "do not combine with --model convnet (the ConvNet cannot be cut into pipeline stages");

    /* --sample-every works with --pp, not with --tp (refused with the reason) */
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--tp", "2", "--pp", "2", "--sample-every", "2",
                                     "--data", "tokens:/nonexistent", "--val-data", "tokens:/nonexistent", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 does not combine with --sample-every (the vocabulary-parallel head");
}

int main(void)
{
    RUN(option_errors);
    RUN(mlp_pp2_equals_one_process);
    RUN(mlp_dp2_pp2_equals_ddp);
    RUN(short_last_batch_dropped);
    RUN(gpt_pp2_equals_one_process);
    RUN(gpt_dp2_pp2_samples_equal_ddp);
    cli_cleanup();
    return TEST_REPORT();
}
