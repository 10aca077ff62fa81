/* `dtrain train --dp 2 --tp 2 --pp 2` under `dtrain run -n 8`: the GPT on
 * one dp x tp x pp mesh (2 replicas, each layer split over 2 ranks, 2
 * pipeline stages, 1f1b with 2 micro-batches) gives the single-process
 * run's step losses and validation loss (the single process takes the
 * global batch of 8: the distributed sampler's two shares of a step are
 * the random sampler's batch of the same seed), and the placement option
 * errors are one line with exit 2, as are ranks started with other options
 * under --tp or --pp. The MLP as tp 2 x pp 2 (zbh1) on 4
 * ranks gives the single-process step losses too.
 *
 * The bound. Both runs compute the same sums in another order: the
 * loss is a mean over the N = B T = 128 rows of a batch, each row's
 * logits sums of C = 32 products, the vocabulary-parallel loss a sum over
 * two halves of the vocabulary, the gradients m = 2 micro-batch partial
 * sums averaged over 2 replicas. Step 1's loss is then within about
 * N u |loss| (u = 2^-24: 7.6e-6 relative) of the single process's, and
 * the AdamW steps after it move both runs' weights by the same lr-sized
 * updates computed from gradients that differ by rounding (8 N u max|g|,
 * tests/train/pipe_train.h), so we allow 1e-5 relative plus the
 * metrics file's printing step (6 decimals: 1.5e-6) on each step's loss,
 * and the printed validation loss (4 decimals) within 2e-4. A replica
 * whose gradients are not averaged, a tensor-parallel slice summed twice,
 * a stage whose parameters the evaluation does not see, or a loss counted
 * once per rank instead of once per replica is off by far more. */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

/* dtrain [run -n ranks --] train --model gpt-micro ... extra, metrics into m. */
static void run_gpt(cli_result *r, int ranks, const char *batch, char *const *extra, const char *m)
{
    static char data[320];
    if (!data[0]) {
        if (cli_stream_file("tok.bin", 2000, false, data, sizeof data) < 0)
            fprintf(stderr, "writing %s failed: %s\n", data + 7, dt_last_error());
    }
    char *base[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                    "16", "--data", data, "--val-data", data, "--limit-train", "32", "--limit-test", "8", "--batch",
                    (char *)batch, "--optimizer", "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1",
                    "--progress", "plain", "--log-every", "1", "--metrics", (char *)m, NULL};
    cli_run_ranks(r, 100, NULL, ranks, 2, (char *const *const[]){base, extra});
}

TEST(gpt_dp2_tp2_pp2_equals_one_process)
{
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/one.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/3d.jsonl", cli_tmpdir());
    run_gpt(&r, 1, "8", NULL, m1);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = cli_out_value(r.out, "val loss: ");
    run_gpt(&r, 8, "4", (char *[]){"--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2", NULL}, m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] pipeline parallel: 2 stages x 2 tensor-parallel x 2 data-parallel, schedule "
                               "1f1b, 2 micro-batches per batch");
    ASSERT(strstr(r.out, "[1] ") == NULL); /* one display */
    double v2 = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "gpt val loss: one process %.6f, dp 2 x tp 2 x pp 2 %.6f\n", v1, v2);
    ASSERT(fabs(v1 - v2) <= 2e-4);
    ASSERT(cli_same_metrics(m2, m1, 4, 1.5e-6));
}

/* The MLP's two weights in two stages, each split over 2 ranks (what
 * crosses the stages is each rank's hidden slice): 4 ranks as tp 2 x pp 2
 * give the single-process step losses. */
TEST(mlp_tp2_pp2_equals_one_process)
{
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/m1.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/m2.jsonl", cli_tmpdir());
    char *one[] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "64", "--random-items", "64",
                   "--batch", "4", "--limit-test", "16", "--optimizer", "adamw", "--lr", "0.01", "--seed", "2",
                   "--progress", "plain", "--log-every", "1", "--threads", "1", "--metrics", m1, NULL};
    cli_runv(&r, 100, NULL, one);
    ASSERT_EQ_INT(r.code, 0);
    char *four[64] = {"run", "-n", "4", "--", cli()};
    int n = 5;
    for (int i = 0; one[i]; i++)
        four[n++] = !strcmp(one[i], m1) ? m2 : one[i];
    four[n++] = "--tp", four[n++] = "2", four[n++] = "--pp", four[n++] = "2", four[n++] = "--pp-schedule";
    four[n++] = "zbh1", four[n] = NULL;
    cli_runv(&r, 100, NULL, four);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 tensor-parallel x 1 data-parallel, schedule zbh1");
    ASSERT(cli_same_metrics(m2, m1, 16, 1.5e-6));
}

TEST(placement_errors)
{
    static cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"run", "-n", "4", "--", cli(), "train", "--model", "mlp", "--dp", "2", "--tp", "2", "--pp",
                        "2", NULL});
    ASSERT(r.code != 0);
    ASSERT_STR_CONTAINS(r.err, "--dp 2 x --tp 2 x --pp 2 is 8 ranks; this job has 4");
    cli_runv(&r, 60, NULL,
             (char *[]){"run", "-n", "6", "--", cli(), "train", "--model", "mlp", "--tp", "2", "--pp", "2", NULL});
    ASSERT(r.code != 0);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 x --pp 2 (4 ranks per replica) does not divide this job's 6 ranks");
}

/* Ranks started with other options under --tp or --pp (a --max-steps that
 * differs: rank 0 waited for the memory report on the world group while
 * rank 1 waited in a tensor-parallel all-reduce of step 3, until the
 * 300 s communication timeout: the 60 s limit here fails it; another
 * --lr trained apart and exited 0): every rank compares its options over
 * the whole world at start and exits 2 naming them. */
TEST(ranks_with_other_options_refuse_under_tp_and_pp)
{
    static char data[320];
    if (cli_stream_file("tok.bin", 2000, false, data, sizeof data) < 0) {
        fprintf(stderr, "writing the token file failed: %s\n", dt_last_error());
        ASSERT(0);
    }
    const char *layouts[] = {"--tp", "--pp"};
    for (int i = 0; i < 2; i++) {
        char script[1600];
        snprintf(script, sizeof script,
                 "if [ \"$DT_RANK\" = 1 ]; then n=3; lr=0.02; else n=2; lr=0.01; fi; exec \"%s\" train --model "
                 "gpt-micro --vocab-size 41 --n-embd 32 --n-head 4 --seq 16 --data '%s' --limit-train 32 --no-eval "
                 "--batch 4 --threads 1 --progress plain %s 2 --max-steps $n --lr $lr",
                 cli(), data, layouts[i]);
        static cli_result r;
        cli_runv(&r, 60, NULL, (char *[]){"run", "-n", "2", "--grace", "1", "--", "/bin/sh", "-c", script, NULL});
        if (r.code != 2)
            fprintf(stderr, "%s 2: exit %d\nstdout:\n%s\nstderr:\n%s\n", layouts[i], r.code, r.out, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "the ranks were given different settings: --lr differs on rank 1; --max-steps "
                                   "differs on rank 1");
        ASSERT(!strstr(r.out, "train loss"));
    }
}

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    RUN(placement_errors);
    RUN(ranks_with_other_options_refuse_under_tp_and_pp);
    RUN(mlp_tp2_pp2_equals_one_process);
    RUN(gpt_dp2_tp2_pp2_equals_one_process);
    cli_cleanup();
    return TEST_REPORT();
}
