/* Checkpoints of pipeline training through the CLI: stages keep the
 * model's global names, so a checkpoint saved by `--pp 2` (each pipeline
 * rank writes the tensors and optimizer state of its own stages) resumes
 * in one process, and one saved by one process resumes under `--pp 2`:
 * the MLP stopped after 8 of 16 steps (--max-steps 8 --save) and resumed
 * gives the uninterrupted single-process run's remaining step losses, both
 * ways; the GPT (tied wte / lm_head on the first and last stage) saved by
 * 2 replicas x 2 stages resumes in one process, and the single process's
 * resumes under --pp 2, with the single-process losses and validation
 * loss. Losses within 1e-5 relative plus the metrics
 * file's printing step, as test_train_pp_cli.c (the pipeline adds the
 * same products in another order; tests/train/pipe_train.h has the
 * bound); a missing optimizer state, a stale stage or a tied weight not
 * restored on its second stage moves the losses far more. The GPT under
 * --tp 2 --pp 2 saves and loads likewise (each tensor-parallel rank its
 * share of its stages' full tensors). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

/* dtrain [run -n ranks --] train <common> extra... --metrics m */
static void run(cli_result *r, int ranks, char *const *common, char *const *extra, const char *m)
{
    char *met[] = {"--metrics", (char *)m, NULL};
    cli_run_ranks(r, 100, NULL, ranks, 3, (char *const *const[]){common, extra, met});
}

/* The resumed run's losses equal the reference's last ones. */
static bool same_tail(const char *resumed, const char *ref, int expect)
{
    double a[64], b[64];
    int na = cli_step_losses(resumed, a, 64), nb = cli_step_losses(ref, b, 64);
    if (na != expect || nb < na) {
        fprintf(stderr, "%d resumed step records (want %d), %d in the reference\n", na, expect, nb);
        return false;
    }
    return cli_same_losses(a, na, b + (nb - na), na, 1.5e-6);
}

TEST(mlp_pp2_checkpoint_resumes_in_one_process_and_back)
{
    static cli_result r;
    char *mlp[] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "64", "--random-items", "64",
                   "--batch", "4", "--limit-test", "16", "--optimizer", "adamw", "--lr", "0.01", "--seed", "2",
                   "--progress", "plain", "--log-every", "1", "--threads", "1", NULL};
    char *ref = cli_path("ref.jsonl"), *c1 = cli_path("ck_pp"), *c2 = cli_path("ck_one");
    run(&r, 1, mlp, NULL, ref);
    ASSERT_EQ_INT(r.code, 0);
    /* --pp 2 saves, one process resumes */
    run(&r, 2, mlp, (char *[]){"--pp", "2", "--max-steps", "8", "--save", c1, NULL}, cli_path("a1.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    char f[400];
    snprintf(f, sizeof f, "%s/step-00000008/rank-00001.safetensors", c1); /* the second stage wrote its part */
    ASSERT(file_exists(f));
    run(&r, 1, mlp, (char *[]){"--resume", c1, NULL}, cli_path("a2.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "resumed from");
    ASSERT(same_tail(cli_path("a2.jsonl"), ref, 8));
    /* one process saves, --pp 2 (zbh1) resumes */
    run(&r, 1, mlp, (char *[]){"--max-steps", "8", "--save", c2, NULL}, cli_path("b1.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    run(&r, 2, mlp, (char *[]){"--pp", "2", "--pp-schedule", "zbh1", "--resume", c2, NULL}, cli_path("b2.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(same_tail(cli_path("b2.jsonl"), ref, 8));
}

TEST(gpt_dp2_pp2_checkpoint_resumes_in_one_process)
{
    static cli_result r;
    char data[320];
    ASSERT_EQ_INT(cli_stream_file("tok.bin", 2000, false, data, sizeof data), DT_OK);
    char *gpt[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                   "16", "--data", data, "--val-data", data, "--limit-train", "32", "--limit-test", "8", "--optimizer",
                   "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress", "plain", "--log-every",
                   "1", NULL};
    char *ref = cli_path("gref.jsonl"), *ck = cli_path("ck_gpt"), *ckr = cli_path("ck_gref");
    run(&r, 1, gpt, (char *[]){"--batch", "8", "--save", ckr, "--save-every", "2", NULL}, ref);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = cli_out_value(r.out, "val loss: ");
    run(&r, 4, gpt, (char *[]){"--batch", "4", "--pp", "2", "--max-steps", "2", "--save", ck, NULL}, cli_path("g1.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    run(&r, 1, gpt, (char *[]){"--batch", "8", "--resume", ck, NULL}, cli_path("g2.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    double v2 = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "gpt val loss: one process %.6f, resumed from dp 2 x pp 2 %.6f\n", v1, v2);
    ASSERT(fabs(v1 - v2) <= 2e-4);
    ASSERT(same_tail(cli_path("g2.jsonl"), ref, 2));
    /* the single process's step-2 checkpoint under --pp 2: the last stage's
       tied head takes wte from the first stage's load */
    char from[400];
    snprintf(from, sizeof from, "%s/step-00000002", ckr);
    run(&r, 2, gpt, (char *[]){"--batch", "8", "--pp", "2", "--resume", from, NULL}, cli_path("g3.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(fabs(cli_out_value(r.out, "val loss: ") - v1) <= 2e-4);
    ASSERT(same_tail(cli_path("g3.jsonl"), ref, 2));
}

/* --tp 2 --pp 2 (4 ranks): each tensor-parallel rank writes its share of
 * its stages' full tensors, so the checkpoint is the single-process one:
 * it resumes in one process and under tp 2 x pp 2 again with the
 * uninterrupted run's losses, and the single process's loads under tp 2 x
 * pp 2 (a slice written twice, a stage's share missing or another stage's
 * stale slice taking its place would move the losses by far more). */
TEST(gpt_tp2_pp2_checkpoint_resumes_in_one_process_and_back)
{
    static cli_result r;
    char data[320];
    ASSERT_EQ_INT(cli_stream_file("tok3.bin", 2000, false, data, sizeof data), DT_OK);
    char *gpt[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                   "16", "--data", data, "--val-data", data, "--limit-train", "32", "--limit-test", "8", "--optimizer",
                   "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress", "plain", "--log-every",
                   "1", "--batch", "8", NULL};
    char *ref = cli_path("tref.jsonl"), *ck = cli_path("ck_tp_pp"), *ckr = cli_path("ck_tref");
    run(&r, 1, gpt, (char *[]){"--save", ckr, "--save-every", "2", NULL}, ref);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = cli_out_value(r.out, "val loss: ");
    char *tpp[] = {"--tp", "2", "--pp", "2", "--micro-batches", "2", NULL};
    run(&r, 4, gpt, (char *[]){"--tp", "2", "--pp", "2", "--micro-batches", "2", "--max-steps", "2", "--save", ck, NULL},
        cli_path("t1.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    char f[400];
    snprintf(f, sizeof f, "%s/step-00000002/rank-00003.safetensors", ck);
    ASSERT(file_exists(f));
    run(&r, 1, gpt, (char *[]){"--resume", ck, NULL}, cli_path("t2.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(fabs(cli_out_value(r.out, "val loss: ") - v1) <= 2e-4);
    ASSERT(same_tail(cli_path("t2.jsonl"), ref, 2));
    run(&r, 4, gpt, (char *[]){"--tp", "2", "--pp", "2", "--micro-batches", "2", "--resume", ck, NULL},
        cli_path("t3.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(same_tail(cli_path("t3.jsonl"), ref, 2));
    char from[400];
    snprintf(from, sizeof from, "%s/step-00000002", ckr);
    run(&r, 4, gpt, (char *[]){tpp[0], tpp[1], tpp[2], tpp[3], tpp[4], tpp[5], "--resume", from, NULL},
        cli_path("t4.jsonl"));
    ASSERT_EQ_INT(r.code, 0);
    double v4 = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "gpt val loss: one process %.6f, tp 2 x pp 2 resumed from its step 2 %.6f\n", v1, v4);
    ASSERT(fabs(v4 - v1) <= 2e-4);
    ASSERT(same_tail(cli_path("t4.jsonl"), ref, 2));
}

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    RUN(mlp_pp2_checkpoint_resumes_in_one_process_and_back);
    RUN(gpt_dp2_pp2_checkpoint_resumes_in_one_process);
    RUN(gpt_tp2_pp2_checkpoint_resumes_in_one_process_and_back);
    cli_cleanup();
    return TEST_REPORT();
}
