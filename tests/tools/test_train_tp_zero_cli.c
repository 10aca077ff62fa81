/* ZeRO-1 on the data-parallel dimension of a tensor-parallel model, through
 * the CLI under `dtrain run` (issues 16/17):
 *  - the MLP as dp 2 x tp 2 with --zero 1 (each data-parallel rank steps
 *    half of its tensor-parallel slice's elements, then they are
 *    all-gathered) gives dp 2 x tp 2 DDP's step losses, with a gradient
 *    clip that binds (the unclipped run's losses differ): the global norm
 *    sums the slices over tp and the replicated tensors (the row-parallel
 *    bias) once, over the ZeRO shards of both;
 *  - its checkpoints (the shares gathered over dp, then written as DDP's
 *    tensor-parallel group writes them) equal DDP's tensor for tensor, byte
 *    for byte, optimizer state included; and a DDP dp 2 x tp 2 checkpoint
 *    resumes under --zero 1 (each rank reads its share of its slice of the
 *    full tensors) and continues with the uninterrupted DDP run's losses;
 *  - the GPT as dp 2 x tp 2 x pp 2 (8 ranks) with --zero 1 gives the DDP
 *    3-D run's step losses and validation loss, with clipping, and the
 *    same checkpoint byte for byte; DDP's 3-D checkpoint resumes under it.
 * The bound. Both runs average the same two gradients (a + b is exact in
 * either order) and step the same elements with the same AdamW
 * arithmetic; only the squared norm's partial sums are added in another
 * order (per ZeRO share, then over the shares, against per rank), in
 * double, before the norm is rounded to float: 1e-16 relative, far below
 * float's 6e-8. So the losses are equal to the printed digits, which is
 * what is asserted (a share stepped twice or not at all, a replicated
 * tensor counted once per tp rank, or a norm summed over the shares of
 * one tp rank only moves them by 1e-3 and more). */
// dt-test-timeout: 180
// dt-test-labels: threads
#include "dtrain/data.h"
#include "ckpt_cmp.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }

/* dtrain run -n ranks -- dtrain train <base> extra...; 0 on success. */
static int run(cli_result *r, int ranks, char *const *base, char *const *extra)
{
    return cli_run_ranks(r, 150, NULL, ranks, 2, (char *const *const[]){base, extra});
}

/* The same step losses to the printed digits (at least 2). */
static bool equal_losses(const char *ma, const char *mb, int skip_b)
{
    double a[64], b[64];
    int na = cli_step_losses(ma, a, 64), nb = cli_step_losses(mb, b, 64);
    if (na < 2 || na + skip_b != nb) {
        fprintf(stderr, "%d vs %d - %d step records\n", na, nb, skip_b);
        return false;
    }
    for (int i = 0; i < na; i++)
        if (a[i] != b[skip_b + i]) {
            fprintf(stderr, "step record %d: %.9g vs %.9g\n", i, a[i], b[skip_b + i]);
            return false;
        }
    return true;
}

static char *k_mlp[] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "64", "--random-items", "64",
                        "--batch", "4", "--limit-test", "16", "--optimizer", "adamw", "--lr", "0.01", "--seed", "2",
                        "--progress", "plain", "--log-every", "1", "--threads", "1", "--tp", "2", NULL};

TEST(mlp_dp2_tp2_zero1_equals_ddp)
{
    static cli_result r;
    const char *ddp = cli_path("ddp.jsonl"), *z = cli_path("z1.jsonl"), *free_ = cli_path("noclip.jsonl");
    const char *ck = cli_path("ddp_ck"), *res = cli_path("res.jsonl");
    ASSERT_EQ_INT(run(&r, 4, k_mlp,
                      (char *[]){"--clip-grad-norm", "0.05", "--metrics", (char *)ddp, "--save", (char *)ck,
                                 "--save-every", "4", NULL}),
                  0);
    ASSERT_STR_CONTAINS(r.out, "[0] DDP: 2 ranks");
    const char *zck = cli_path("z_ck");
    ASSERT_EQ_INT(run(&r, 4, k_mlp,
                      (char *[]){"--clip-grad-norm", "0.05", "--metrics", (char *)z, "--zero", "1", "--save",
                                 (char *)zck, NULL}),
                  0);
    ASSERT_STR_CONTAINS(r.out, "[0] ZeRO stage 1: 2 ranks");
    ASSERT(equal_losses(z, ddp, 0));
    char ca[600], cb[600];
    snprintf(ca, sizeof ca, "%s/step-00000008", zck);
    snprintf(cb, sizeof cb, "%s/step-00000008", ck);
    ASSERT(t_same_ckpt(ca, cb, true) >= 6); /* w0, w1 and AdamW's two states of each (and the bias) */
    /* the clip binds: without it the losses differ */
    ASSERT_EQ_INT(run(&r, 4, k_mlp, (char *[]){"--metrics", (char *)free_, "--zero", "1", NULL}), 0);
    double a[64], b[64];
    int na = cli_step_losses(free_, a, 64), nb = cli_step_losses(ddp, b, 64);
    ASSERT_EQ_INT(na, 8);
    ASSERT_EQ_INT(nb, 8);
    int differ = 0;
    for (int i = 0; i < na; i++)
        differ += fabs(a[i] - b[i]) > 1e-4;
    ASSERT(differ > 0);
    /* DDP's step-4 checkpoint resumed under ZeRO-1: DDP's last 4 losses */
    char c4[600];
    snprintf(c4, sizeof c4, "%s/step-00000004", ck);
    ASSERT_EQ_INT(run(&r, 4, k_mlp,
                      (char *[]){"--clip-grad-norm", "0.05", "--metrics", (char *)res, "--zero", "1", "--resume", c4,
                                 NULL}),
                  0);
    ASSERT(equal_losses(res, ddp, 4));
}

/* The 3-D GPT (tests/tools/test_train_3d_cli.c's) under --zero 1 */
TEST(gpt_dp2_tp2_pp2_zero1_equals_ddp)
{
    static cli_result r;
    char data[320];
    ASSERT_EQ_INT(cli_stream_file("tok.bin", 2000, false, data, sizeof data), DT_OK);
    const char *ddp = cli_path("g_ddp.jsonl"), *z = cli_path("g_z1.jsonl");
    char *base[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4", "--seq",
                    "16", "--data", data, "--val-data", data, "--limit-train", "32", "--limit-test", "8", "--batch",
                    "4", "--optimizer", "adamw", "--lr", "0.01", "--seed", "3", "--threads", "1", "--progress",
                    "plain", "--log-every", "1", "--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2",
                    "--clip-grad-norm", "0.1", NULL};
    const char *dck = cli_path("g_ddp_ck"), *zck = cli_path("g_z1_ck");
    ASSERT_EQ_INT(run(&r, 8, base, (char *[]){"--metrics", (char *)ddp, "--save", (char *)dck, "--save-every", "2",
                                              NULL}),
                  0);
    double v1 = cli_out_value(r.out, "val loss: ");
    ASSERT_EQ_INT(run(&r, 8, base, (char *[]){"--metrics", (char *)z, "--zero", "1", "--save", (char *)zck, NULL}),
                  0);
    ASSERT_STR_CONTAINS(r.out, "2 stages x 2 tensor-parallel x 2 data-parallel (ZeRO-1)");
    double v2 = cli_out_value(r.out, "val loss: ");
    fprintf(stderr, "gpt val loss: DDP %.6f, ZeRO-1 %.6f\n", v1, v2);
    ASSERT(!isnan(v1) && v1 == v2);
    ASSERT(equal_losses(z, ddp, 0));
    char ca[600], cb[600];
    snprintf(ca, sizeof ca, "%s/step-00000004", zck);
    snprintf(cb, sizeof cb, "%s/step-00000004", dck);
    ASSERT(t_same_ckpt(ca, cb, true) >= 32);
    /* DDP's step-2 checkpoint resumed by the 3-D ZeRO-1 run (each rank reads
     * its share of its stages' slices): DDP's last two losses */
    const char *res = cli_path("g_res.jsonl");
    snprintf(cb, sizeof cb, "%s/step-00000002", dck);
    ASSERT_EQ_INT(run(&r, 8, base, (char *[]){"--metrics", (char *)res, "--zero", "1", "--resume", cb, NULL}), 0);
    ASSERT(equal_losses(res, ddp, 2));
}

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    RUN(mlp_dp2_tp2_zero1_equals_ddp);
    RUN(gpt_dp2_tp2_pp2_zero1_equals_ddp);
    cli_cleanup();
    return TEST_REPORT();
}
