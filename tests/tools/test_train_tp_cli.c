/* `dtrain train --tp N` under `dtrain run`: the tensor-parallel MLP on 2
 * ranks gives the single-process run's step losses; 4 ranks as 2 x 2
 * (tensor x data parallel) give the 2-rank DDP run's; a tensor-parallel
 * GPT on 2 ranks gives the single-process step and validation losses, with
 * dropout too (the same masks) and with --sequence-parallel (with dropout
 * too: each rank's tokens draw their part of the masks; and inside 2
 * pipeline stages); and the option
 * errors (no launcher, a --tp that does not divide the ranks, convnet,
 * ZeRO 2/3 and FSDP; --zero 1 composes: test_train_tp_zero_cli.c) are
 * one line with exit 2. Losses are compared within float
 * rounding (relative 1e-5: the runs add the same products in another
 * order, see test_tp.c). */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

/* dtrain [run -n ranks --] train --model mlp ... [--tp tp] with metrics into m. */
static void run_mlp(cli_result *r, int ranks, const char *tp, const char *m)
{
    char *base[] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "64", "--random-items", "64",
                    "--batch", "4", "--limit-test", "16", "--optimizer", "adamw", "--lr", "0.01", "--seed", "2",
                    "--progress", "plain", "--log-every", "1", "--threads", "1", "--metrics", (char *)m};
    char *args[64];
    int n = 0;
    if (ranks > 1) {
        static char nr[16];
        snprintf(nr, sizeof nr, "%d", ranks);
        args[n++] = "run", args[n++] = "-n", args[n++] = nr, args[n++] = "--", args[n++] = cli();
    }
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        args[n++] = base[i];
    if (tp)
        args[n++] = "--tp", args[n++] = (char *)tp;
    args[n] = NULL;
    cli_runv(r, 200, NULL, args);
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
}

TEST(mlp_tp2_equals_one_process)
{
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/one.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/tp2.jsonl", cli_tmpdir());
    run_mlp(&r, 1, NULL, m1);
    ASSERT_EQ_INT(r.code, 0);
    run_mlp(&r, 2, "2", m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] tensor parallel: 2 ranks per group (each holds 1/2 of the weights), 1 "
                               "data-parallel group");
    ASSERT(strstr(r.out, "[1] ") == NULL); /* one display */
    ASSERT_STR_CONTAINS(r.out, "[0] training mlp (1024 parameters in this rank's slice)"); /* 16 x 64 x 2 / 2 */
    ASSERT(cli_same_metrics(m2, m1, 16, 1e-7));
}

TEST(mlp_tp2_dp2_equals_ddp)
{
    static cli_result r;
    char m1[300], m2[300];
    snprintf(m1, sizeof m1, "%s/ddp2.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/tp2dp2.jsonl", cli_tmpdir());
    run_mlp(&r, 2, NULL, m1);
    ASSERT_EQ_INT(r.code, 0);
    run_mlp(&r, 4, "2", m2);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] tensor parallel: 2 ranks per group (each holds 1/2 of the weights), 2 "
                               "data-parallel groups");
    ASSERT_STR_CONTAINS(r.out, "[0] DDP: 2 ranks");
    ASSERT(cli_same_metrics(m2, m1, 8, 1e-7));
}

static double val_loss(const char *out)
{
    const char *p = strstr(out, "val loss: ");
    return p ? atof(p + 10) : NAN;
}

/* The GPT on 2 tensor-parallel ranks against one process: the step losses
 * (and the validation loss) within float rounding; with dropout > 0 too
 * (the same masks: see models/gpt2.c). */
static void gpt_tp2_pp(const char *dropout, bool sp, bool pp)
{
    static cli_result r;
    char data[320], m1[400], m2[400];
    ASSERT_EQ_INT(cli_stream_file("tok.bin", 2000, false, data, sizeof data), DT_OK);
    snprintf(m1, sizeof m1, "%s/g1_%s%s.jsonl", cli_tmpdir(), dropout, sp ? "_sp" : "");
    snprintf(m2, sizeof m2, "%s/g2_%s%s%s.jsonl", cli_tmpdir(), dropout, sp ? "_sp" : "", pp ? "_pp" : "");
    char *one[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                   "16", "--data", data, "--val-data", data, "--limit-train", "24", "--limit-test", "8", "--batch",
                   "4", "--optimizer", "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress", "plain",
                   "--log-every", "1", "--metrics", m1, "--dropout", (char *)dropout, NULL};
    cli_runv(&r, 200, NULL, one);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    double v1 = val_loss(r.out);
    char *two[64] = {"run", "-n", pp ? "4" : "2", "--", cli()};
    int n = 5;
    for (int i = 0; one[i]; i++)
        two[n++] = !strcmp(one[i], m1) ? m2 : one[i];
    two[n++] = "--tp", two[n++] = "2";
    if (sp)
        two[n++] = "--sequence-parallel";
    if (pp)
        two[n++] = "--pp", two[n++] = "2", two[n++] = "--micro-batches", two[n++] = "2";
    two[n] = NULL;
    cli_runv(&r, 200, NULL, two);
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    if (sp)
        ASSERT_STR_CONTAINS(r.out, "; sequence parallel (each holds 1/N of the tokens between the blocks)");
    if (pp)
        ASSERT_STR_CONTAINS(r.out, "pipeline parallel: 2 stages x 2 tensor-parallel");
    double v2 = val_loss(r.out);
    fprintf(stderr, "gpt val loss: one process %.6f, --tp 2 %.6f\n", v1, v2);
    ASSERT(fabs(v1 - v2) <= 2e-4); /* printed with 4 decimals */
    ASSERT(cli_same_metrics(m2, m1, 6, 1e-7));
}

static void gpt_tp2(const char *dropout, bool sp) { gpt_tp2_pp(dropout, sp, false); }

TEST(gpt_tp2_equals_one_process) { gpt_tp2("0", false); }

/* --sequence-parallel: the same losses as one process and as --tp 2
 * without it (that run's metrics, from gpt_tp2_equals_one_process, compared
 * directly), the layer norms on half the tokens each */
TEST(gpt_tp2_sequence_parallel_equals_one_process)
{
    gpt_tp2("0", true);
    char tp[300], sp[300];
    snprintf(tp, sizeof tp, "%s/g2_0.jsonl", cli_tmpdir());
    snprintf(sp, sizeof sp, "%s/g2_0_sp.jsonl", cli_tmpdir());
    double a[64], b[64];
    int na = cli_step_losses(sp, a, 64), nb = cli_step_losses(tp, b, 64);
    ASSERT_EQ_INT(na, 6);
    ASSERT_EQ_INT(nb, 6);
    ASSERT(cli_same_losses(a, na, b, nb, 1e-7));
}

/* dropout 0.2 in the embedding, attention, residual and MLP dropouts: the
 * losses equal one process's with the same masks, and differ from the runs
 * without dropout (the masks act; runs after gpt_tp2_equals_one_process) */
TEST(gpt_tp2_dropout_equals_one_process)
{
    gpt_tp2("0.2", false);
    char m0[300], m2[300];
    snprintf(m0, sizeof m0, "%s/g1_0.jsonl", cli_tmpdir());
    snprintf(m2, sizeof m2, "%s/g1_0.2.jsonl", cli_tmpdir());
    double a[64], b[64];
    int na = cli_step_losses(m2, a, 64), nb = cli_step_losses(m0, b, 64);
    ASSERT_EQ_INT(na, 6);
    ASSERT_EQ_INT(nb, 6);
    int differ = 0;
    for (int i = 0; i < na; i++)
        differ += fabs(a[i] - b[i]) > 1e-3;
    ASSERT(differ > 0);
}

/* --sequence-parallel with dropout 0.2: the residual and MLP dropouts on each rank's half of the tokens draw
 * their part of the whole sequence's masks (dt_dropout_at), so the losses equal one process's with dropout */
TEST(gpt_tp2_sequence_parallel_dropout_equals_one_process) { gpt_tp2("0.2", true); }

/* --sequence-parallel inside pipeline stages (4 ranks: tp 2 x pp 2, two micro-batches): the embeddings' unit
 * splits the rows, the stages pass each tp rank's rows, ln_f's unit gathers them for the head; the one-process
 * losses (without dropout: a pipeline draws each micro-batch's masks) */
TEST(gpt_tp2_sequence_parallel_pp2_equals_one_process) { gpt_tp2_pp("0", true, true); }

TEST(tp_option_errors)
{
    static cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--tp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 needs a multiple of 2 ranks");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--tp", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 does not combine with --model convnet");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--tp", "2", "--zero", "2", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 does not combine with --zero 2|3 or --fsdp");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--tp", "2", "--fsdp", "full_shard", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp 2 does not combine with --zero 2|3 or --fsdp");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--tp", "2", "--sequence-parallel", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--sequence-parallel needs a GPT or Llama model and --tp N > 1");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "mlp", "--tp", "0", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tp");
    cli_runv(&r, 60, NULL, (char *[]){"run", "-n", "2", "--", cli(), "train", "--model", "mlp", "--tp", "3", NULL});
    ASSERT(r.code != 0);
    ASSERT_STR_CONTAINS(r.err, "--tp 3 needs a multiple of 3 ranks");
}

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    RUN(tp_option_errors);
    RUN(mlp_tp2_equals_one_process);
    RUN(mlp_tp2_dp2_equals_ddp);
    RUN(gpt_tp2_equals_one_process);
    RUN(gpt_tp2_dropout_equals_one_process);
    RUN(gpt_tp2_sequence_parallel_equals_one_process);
    RUN(gpt_tp2_sequence_parallel_dropout_equals_one_process);
    RUN(gpt_tp2_sequence_parallel_pp2_equals_one_process);
    cli_cleanup();
    return TEST_REPORT();
}
