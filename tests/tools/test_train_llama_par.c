/* The Llama decoder (llama-tiny: 4 query heads sharing 2 key/value heads)
 * under tensor parallelism and its compositions, through `dtrain run`:
 *  - --tp 2 gives the one-process run's step losses and validation loss
 *    (f32), and runs in bf16 (its losses within 2e-2 of the one-process
 *    bf16 run's: bf16 rounds each product's operands, and the two runs
 *    round different partial sums);
 *  - --dp 2 --tp 2 --pp 2 on 8 ranks, plain and with --zero 1, gives the
 *    one-process step losses and validation loss;
 *  - a checkpoint saved under one strategy resumes under another: --tp 2
 *    at step 2 resumed under DDP on 2 ranks and under --pp 2, DDP's and
 *    --pp 2's resumed under --tp 2, each giving the uninterrupted
 *    one-process run's later losses and its final checkpoint (values and
 *    momentum; SGD there, see g_opt);
 *  - --tp 2 --sequence-parallel (the residual stream's rows split over the
 *    tp ranks), alone and with --pp 2 (the stages pass those rows), gives
 *    them too;
 *  - a --tp that does not divide the heads is one line naming the key and
 *    the size, exit 2; --sequence-parallel with LoRA on some projections
 *    runs (its values: test_train_lora_par.c).
 * The bound is test_train_3d_cli.c's: the runs add the same products in
 * another order, so each step loss is within 1e-5 relative plus the
 * metrics file's printing step (1.5e-6), the printed validation loss
 * (4 decimals) within 2e-4, checkpoints within ckpt_cmp.h's 1e-5. A
 * slice summed twice, a kv head paired with the wrong query heads or a
 * replica not averaged is off by far more. Small runs (4 steps of 8
 * sequences of 16 tokens, one thread a rank) with generous timeouts: 8
 * ranks on a loaded 2-core machine. */
// dt-test-timeout: 600
// dt-test-labels: threads
#include "dtrain/data.h"
#include "ckpt_cmp.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char g_data[320];
/* optimizer, lr, momentum: AdamW for the loss curves; SGD with momentum
 * for the checkpoint checks (AdamW scales a gradient that is zero up to
 * rounding to a full lr step, so its weights differ by more than the
 * rounding; test_train_tp_ckpt.c does the same) */
static char *g_opt[3] = {"adamw", "0.01", "0"};

/* dtrain [run -n ranks --] train --model llama-tiny ... extra, metrics into m. */
static void run(cli_result *r, int ranks, const char *batch, const char *m, char *const *extra)
{
    char *base[] = {"train", "--model", "llama-tiny", "--seq", "16", "--data", g_data, "--val-data", g_data,
                    "--limit-train", "32", "--limit-test", "8", "--batch", (char *)batch, "--optimizer", g_opt[0],
                    "--lr", g_opt[1], "--momentum", g_opt[2], "--seed", "3", "--threads", "1", "--progress", "plain", "--log-every", "1",
                    "--metrics", (char *)m, NULL};
    cli_run_ranks(r, 300, "DT_INIT_TIMEOUT=120", ranks, 2, (char *const *const[]){base, extra});
}

static double g_one[64], g_val;
static int g_n;

/* the one-process run of the current optimizer: its losses, validation
 * loss and checkpoints (one_ck/step-2, step-4) */
static void one_process(void)
{
    static cli_result r;
    const char *m = cli_path("one.jsonl");
    g_n = 0;
    run(&r, 1, "8", m, (char *[]){"--save", (char *)cli_path("one_ck"), "--save-every", "2", NULL});
    if (r.code != 0)
        return;
    g_val = cli_out_value(r.out, "val loss: ");
    g_n = cli_step_losses(m, g_one, 64);
}

/* the losses in m are the one-process run's from step `from` on */
static bool follows(const char *m, int from)
{
    double a[64];
    int na = cli_step_losses(m, a, 64);
    return cli_same_losses(a, na, g_one + from, g_n - from, 1.5e-6);
}

TEST(tp2_follows_one_process)
{
    static cli_result r;
    ASSERT_EQ_INT(g_n, 4);
    const char *m = cli_path("tp2.jsonl");
    run(&r, 2, "8", m, (char *[]){"--tp", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] tensor parallel: 2 ranks per group");
    double v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "llama val loss: one process %.6f, --tp 2 %.6f\n", g_val, v);
    ASSERT(fabs(v - g_val) <= 2e-4);
    ASSERT(follows(m, 0));
    const char *ms = cli_path("tp2sp.jsonl");
    run(&r, 2, "8", ms, (char *[]){"--tp", "2", "--sequence-parallel", NULL});
    ASSERT_EQ_INT(r.code, 0);
    v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "llama val loss: --tp 2 --sequence-parallel %.6f\n", v);
    ASSERT(fabs(v - g_val) <= 2e-4);
    ASSERT(follows(ms, 0));
}

TEST(tp2_bf16_runs)
{
    static cli_result r;
    const char *m1 = cli_path("bf1.jsonl"), *m2 = cli_path("bf2.jsonl");
    run(&r, 1, "8", m1, (char *[]){"--precision", "bf16", NULL});
    ASSERT_EQ_INT(r.code, 0);
    run(&r, 2, "8", m2, (char *[]){"--precision", "bf16", "--tp", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    double a[64], b[64];
    int na = cli_step_losses(m2, a, 64), nb = cli_step_losses(m1, b, 64);
    ASSERT_EQ_INT(na, 4);
    ASSERT_EQ_INT(nb, 4);
    for (int i = 0; i < na; i++) {
        fprintf(stderr, "bf16 step %d: --tp 2 %.6f, one process %.6f\n", i, a[i], b[i]);
        ASSERT(isfinite(a[i]) && fabs(a[i] - b[i]) <= 2e-2);
    }
}

static void three_d(bool zero)
{
    static cli_result r;
    const char *m = cli_path(zero ? "3d_z1.jsonl" : "3d.jsonl");
    char *extra[] = {"--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2", zero ? "--zero" : NULL, "1", NULL};
    run(&r, 8, "4", m, extra);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, zero ? "2 stages x 2 tensor-parallel x 2 data-parallel (ZeRO-1)"
                                    : "2 stages x 2 tensor-parallel x 2 data-parallel");
    double v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "llama val loss: one process %.6f, dp 2 x tp 2 x pp 2%s %.6f\n", g_val, zero ? " ZeRO-1" : "", v);
    ASSERT(fabs(v - g_val) <= 2e-4);
    ASSERT(follows(m, 0));
}

TEST(dp2_tp2_pp2_follows_one_process) { three_d(false); }

/* sequence parallelism inside the pipeline's stages: the embedding unit
 * splits the rows, the stages pass each tp rank's rows, the final norm's
 * unit gathers them for the head */
TEST(tp2_sp_pp2_follows_one_process)
{
    static cli_result r;
    const char *m = cli_path("sp_pp.jsonl");
    run(&r, 4, "8", m, (char *[]){"--tp", "2", "--sequence-parallel", "--pp", "2", "--micro-batches", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 tensor-parallel");
    ASSERT_STR_CONTAINS(r.out, "sequence parallel (each holds 1/N of the tokens");
    double v = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "llama val loss: one process %.6f, tp 2 sequence-parallel x pp 2 %.6f\n", g_val, v);
    ASSERT(fabs(v - g_val) <= 2e-4);
    ASSERT(follows(m, 0));
}
TEST(dp2_tp2_pp2_zero1_follows_one_process) { three_d(true); }

/* Saved by `from` (ranks, batch, flags) at step 2, resumed by `to`: the
 * one-process run's last two losses and its final checkpoint. */
typedef struct {
    const char *name;
    int ranks;
    const char *batch;
    char *flags[5];
} strat;

static void cross(const strat *from, const strat *to)
{
    static cli_result r;
    ASSERT_EQ_INT(g_n, 4);
    char save[400], res[400], ck[600], tail[420], one_end[600];
    snprintf(save, sizeof save, "%s_%s_part", from->name, to->name);
    snprintf(save, sizeof save, "%s", cli_path(save));
    snprintf(res, sizeof res, "%s_to_%s", from->name, to->name);
    snprintf(res, sizeof res, "%s", cli_path(res));
    snprintf(tail, sizeof tail, "%s.jsonl", res);
    char *sv[12] = {"--save", save, "--max-steps", "2"}, *rs[12] = {"--save", res, "--resume", ck};
    int n = 4, k = 4;
    for (int i = 0; from->flags[i]; i++)
        sv[n++] = from->flags[i];
    for (int i = 0; to->flags[i]; i++)
        rs[k++] = to->flags[i];
    sv[n] = rs[k] = NULL;
    run(&r, from->ranks, from->batch, cli_path("part.jsonl"), sv);
    ASSERT_EQ_INT(r.code, 0);
    snprintf(ck, sizeof ck, "%s/step-00000002", save);
    run(&r, to->ranks, to->batch, tail, rs);
    ASSERT_EQ_INT(r.code, 0);
    bool same = follows(tail, 2);
    if (!same)
        fprintf(stderr, "  saved under %s, resumed under %s\n", from->name, to->name);
    ASSERT(same);
    snprintf(ck, sizeof ck, "%s/step-00000004", res);
    snprintf(one_end, sizeof one_end, "%s/step-00000004", cli_path("one_ck"));
    ASSERT(t_same_ckpt(ck, one_end, false) >= 2 * 20); /* 20 parameters and their momentum buffers */
}

static const strat g_tp = {"tp2", 2, "8", {"--tp", "2", NULL}};
static const strat g_ddp = {"ddp2", 2, "4", {NULL}};
static const strat g_pp = {"pp2", 2, "8", {"--pp", "2", "--micro-batches", "2", NULL}};

TEST(tp2_checkpoint_resumes_under_ddp) { cross(&g_tp, &g_ddp); }
TEST(tp2_checkpoint_resumes_under_pp2) { cross(&g_tp, &g_pp); }
TEST(ddp_checkpoint_resumes_under_tp2) { cross(&g_ddp, &g_tp); }
TEST(pp2_checkpoint_resumes_under_tp2) { cross(&g_pp, &g_tp); }

TEST(tp_errors)
{
    static cli_result r;
    run(&r, 4, "4", cli_path("tp4.jsonl"), (char *[]){"--tp", "4", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "num_key_value_heads 2 is not divisible by the tensor-parallel size 4");
    /* LoRA with sequence parallelism runs (the values: test_train_lora_par), adapters on some projections only */
    run(&r, 2, "8", cli_path("sp.jsonl"),
        (char *[]){"--tp", "2", "--sequence-parallel", "--lora-targets", "q_proj,v_proj", NULL});
    ASSERT_EQ_INT(r.code, 0);
}

int main(void)
{
    if (!getenv("DT_CLI"))
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    if (cli_stream_file("tok.bin", 2000, true, g_data, sizeof g_data) < 0)
        DT_TEST_SKIP_ALL("could not write the token file");
    one_process();
    RUN(tp2_follows_one_process);
    RUN(tp2_bf16_runs);
    RUN(dp2_tp2_pp2_follows_one_process);
    RUN(tp2_sp_pp2_follows_one_process);
    RUN(dp2_tp2_pp2_zero1_follows_one_process);
    g_opt[0] = "sgd", g_opt[1] = "0.1", g_opt[2] = "0.9";
    one_process();
    RUN(tp2_checkpoint_resumes_under_ddp);
    RUN(tp2_checkpoint_resumes_under_pp2);
    RUN(ddp_checkpoint_resumes_under_tp2);
    RUN(pp2_checkpoint_resumes_under_tp2);
    RUN(tp_errors);
    cli_cleanup();
    return TEST_REPORT();
}
