/* `dtrain train --tp 2` checkpoints and gradient clipping, in real
 * processes under `dtrain run`:
 *  - a --tp 2 checkpoint holds the full tensors under the model's global
 *    names (the tp ranks' shares of each slice), equal to the one-process
 *    run's checkpoint within float rounding, optimizer state included;
 *  - exact resume: --tp 2 stopped at step k and resumed gives the
 *    uninterrupted --tp 2 run's final checkpoint byte for byte and its step
 *    losses after k;
 *  - a --tp 2 checkpoint resumes in one process, and a one-process one
 *    under --tp 2, each ending where the one-process run ends (rounding);
 *  - --init-from takes either layout's weights (the same step losses);
 *  - 4 ranks as --tp 2 x 2 data-parallel save what 2-rank DDP saves, and
 *    resume from it;
 *  - the GPT (column-parallel c_attn in 3 chunks, vocabulary 41 over 2 ranks:
 *    a padding row) does the same, with SGD and momentum;
 *  - --clip-grad-norm under --tp 2 clips by the full model's norm (slices
 *    summed over the group, layer norms and row-parallel biases once): the
 *    final weights equal the clipped one-process run's, and differ from the
 *    unclipped run's (the clip binds).
 * Values are compared as max |a - b| <= 1e-5 max |b| + 1e-7 (the runs add
 * the same products in another order; see test_tp.c). */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "ckpt_cmp.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char *cli(void) { return getenv("DT_CLI"); }
static char g_data[480];

/* dtrain [run -n ranks --] train <model> [--tp 2] <extra...> */
static int train_n(int ranks, const char *model, bool tp, char *const *extra)
{
    static cli_result r;
    char *args[96];
    int n = 0;
    if (ranks > 1)
        args[n++] = "run", args[n++] = "-n", args[n++] = ranks == 4 ? "4" : "2", args[n++] = "--", args[n++] = cli();
    char *mlp[] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "64", "--random-items", "64",
                   "--batch", "4", "--limit-test", "16", "--seed", "2", "--progress", "none", "--threads", "1", "--log-every", "1", NULL};
    char *gpt[] = {"train", "--model", "gpt-micro", "--vocab-size", "41", "--n-embd", "32", "--n-head", "4",
                   "--seq", "16", "--data", g_data, "--limit-train", "24", "--no-eval", "--batch", "4", "--seed", "3",
                   "--threads", "1", "--progress", "none", "--log-every", "1", NULL};
    char **base = !strcmp(model, "mlp") ? mlp : gpt;
    for (int i = 0; base[i]; i++)
        args[n++] = base[i];
    for (int i = 0; extra[i] && n < 92; i++)
        args[n++] = extra[i];
    if (tp)
        args[n++] = "--tp", args[n++] = "2";
    args[n] = NULL;
    cli_runv(&r, 200, NULL, args);
    if (r.code != 0)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    return r.code;
}

/* one process, or 2 ranks with --tp 2 */
static int train(const char *model, bool tp, char *const *extra) { return train_n(tp ? 2 : 1, model, tp, extra); }

static const char *path(const char *fmt, const char *a)
{
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    char name[256];
    snprintf(name, sizeof name, fmt, a);
    snprintf(b, 512, "%s/%s", cli_tmpdir(), name);
    return b;
}

static int world_of(const char *ck)
{
    dt_ckpt *c = NULL;
    int w = dt_ckpt_open(ck, &c) >= 0 ? dt_ckpt_world(c) : -1;
    dt_ckpt_close(c);
    return w;
}

/* The cross checks for one model: total steps `total`, a stop at k. */
static void cross(const char *model, int total, int k, int ntensors)
{
    char ks[16], step_k[32], step_n[32];
    snprintf(ks, sizeof ks, "%d", k);
    snprintf(step_k, sizeof step_k, "step-%08d", k);
    snprintf(step_n, sizeof step_n, "step-%08d", total);
    const char *one = path("%s_one", model), *tp = path("%s_tp", model), *part = path("%s_part", model);
    const char *to1 = path("%s_to1", model), *to2 = path("%s_to2", model);
    char c1[600], c2[600], c3[600], m_tp[600], m_part[600];
    snprintf(m_tp, sizeof m_tp, "%s.jsonl", tp);
    snprintf(m_part, sizeof m_part, "%s.jsonl", part);
    /* the GPT with SGD: the key bias's gradient is zero up to rounding (softmax
     * ignores a shift), which Adam would scale up to a full step */
    const bool adam = !strcmp(model, "mlp");
#define WITH(...)                                                                                                 \
    ((char *[]){"--optimizer", adam ? "adamw" : "sgd", "--lr", adam ? "0.01" : "0.1", "--momentum",              \
                adam ? "0" : "0.9", __VA_ARGS__, NULL})
    ASSERT_EQ_INT(train(model, false, WITH("--save", (char *)one, "--save-every", ks)), 0);
    ASSERT_EQ_INT(train(model, true, WITH("--save", (char *)tp, "--metrics", m_tp)), 0);
    /* the --tp 2 checkpoint is the one-process one: global names and shapes, two files */
    snprintf(c1, sizeof c1, "%s/%s", one, step_n);
    snprintf(c2, sizeof c2, "%s/%s", tp, step_n);
    ASSERT_EQ_INT(world_of(c2), 2);
    ASSERT(t_same_ckpt(c2, c1, false) >= ntensors);
    /* exact resume under --tp 2 */
    ASSERT_EQ_INT(train(model, true, WITH("--save", (char *)part, "--max-steps", ks)), 0);
    ASSERT_EQ_INT(train(model, true, WITH("--save", (char *)part, "--resume", (char *)part, "--metrics", m_part)), 0);
    snprintf(c3, sizeof c3, "%s/%s", part, step_n);
    ASSERT(t_same_ckpt(c3, c2, true) >= ntensors);
    for (int f = 0; f < 2; f++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/rank-%05d.safetensors", c3, f);
        snprintf(b, sizeof b, "%s/rank-%05d.safetensors", c2, f);
        ASSERT(same_file(a, b));
    }
    double la[64], lb[64];
    int na = cli_step_losses(m_part, la, 64), nb = cli_step_losses(m_tp, lb, 64);
    ASSERT_EQ_INT(nb, total);
    ASSERT_EQ_INT(na, total - k);
    for (int i = 0; i < na; i++)
        ASSERT(la[i] == lb[k + i]); /* printed with the same digits: the same values */
    /* --tp 2 at step k -> one process; one process at step k -> --tp 2 */
    snprintf(c3, sizeof c3, "%s/%s", part, step_k);
    ASSERT_EQ_INT(train(model, false, WITH("--save", (char *)to1, "--resume", c3)), 0);
    snprintf(c3, sizeof c3, "%s/%s", one, step_k);
    ASSERT_EQ_INT(train(model, true, WITH("--save", (char *)to2, "--resume", c3)), 0);
    snprintf(c3, sizeof c3, "%s/%s", to1, step_n);
    ASSERT(t_same_ckpt(c3, c1, false) >= ntensors);
    snprintf(c3, sizeof c3, "%s/%s", to2, step_n);
    ASSERT_EQ_INT(world_of(c3), 2);
    ASSERT(t_same_ckpt(c3, c1, false) >= ntensors);
    if (adam) { /* --init-from (weights only): across the two layouts, the same losses */
        char m1[600], m2[600];
        snprintf(m1, sizeof m1, "%s_init1.jsonl", one);
        snprintf(m2, sizeof m2, "%s_init2.jsonl", one);
        ASSERT_EQ_INT(train(model, false, WITH("--init-from", c2, "--max-steps", "3", "--metrics", m1)), 0);
        ASSERT_EQ_INT(train(model, true, WITH("--init-from", c1, "--max-steps", "3", "--metrics", m2)), 0);
        na = cli_step_losses(m2, la, 64), nb = cli_step_losses(m1, lb, 64);
        ASSERT_EQ_INT(na, 3);
        ASSERT(cli_same_losses(la, na, lb, nb, 1e-7));
    }
#undef WITH
}

/* mlp: w0, w1 and AdamW's two states of each */
TEST(mlp_tp2_checkpoints) { cross("mlp", 16, 7, 6); }

/* gpt-micro: at least one layer's 12 parameters, wte, wpe, ln_f's 2, and
 * SGD's momentum buffer of each */
TEST(gpt_tp2_checkpoints) { cross("gpt", 6, 4, 32); }

/* 4 ranks as --tp 2 x 2 data-parallel: the tensor-parallel group of
 * data-parallel rank 0 writes; the checkpoint equals 2-rank DDP's, and it
 * resumes at 2 x 2 to DDP's end */
TEST(mlp_tp2_dp2_checkpoint)
{
    const char *ddp = path("%s_ddp2", "mlp"), *tpdp = path("%s_tp2dp2", "mlp"), *res = path("%s_tp2dp2r", "mlp");
    char *o[] = {"--optimizer", "adamw", "--lr", "0.01", "--save", NULL, "--save-every", "4", NULL};
    o[5] = (char *)ddp;
    ASSERT_EQ_INT(train_n(2, "mlp", false, o), 0);
    o[5] = (char *)tpdp;
    ASSERT_EQ_INT(train_n(4, "mlp", true, o), 0);
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/step-00000008", tpdp);
    snprintf(b, sizeof b, "%s/step-00000008", ddp);
    ASSERT_EQ_INT(world_of(a), 2);
    ASSERT(t_same_ckpt(a, b, false) >= 6);
    snprintf(a, sizeof a, "%s/step-00000004", tpdp);
    char *r[] = {"--optimizer", "adamw", "--lr", "0.01", "--save", (char *)res, "--resume", a, NULL};
    ASSERT_EQ_INT(train_n(4, "mlp", true, r), 0);
    snprintf(a, sizeof a, "%s/step-00000008", res);
    ASSERT(t_same_ckpt(a, b, false) >= 6);
}

static void clip(const char *model, const char *max)
{
    const char *one = path("%s_clip1", model), *tp = path("%s_clip2", model), *free_ = path("%s_noclip", model);
    char *sgd[] = {"--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.9", "--clip-grad-norm", (char *)max, "--save",
                   NULL, NULL};
    sgd[9] = (char *)one;
    ASSERT_EQ_INT(train(model, false, sgd), 0);
    sgd[9] = (char *)tp;
    ASSERT_EQ_INT(train(model, true, sgd), 0);
    char *no[] = {"--optimizer", "sgd", "--lr", "0.5", "--momentum", "0.9", "--save", (char *)free_, NULL};
    ASSERT_EQ_INT(train(model, false, no), 0);
    char a[600], b[600], c[600];
    const int total = !strcmp(model, "mlp") ? 16 : 6;
    snprintf(a, sizeof a, "%s/step-%08d", one, total);
    snprintf(b, sizeof b, "%s/step-%08d", tp, total);
    snprintf(c, sizeof c, "%s/step-%08d", free_, total);
    ASSERT(t_same_ckpt(b, a, false) > 0);
    fprintf(stderr, "(a difference below is expected: the clip binds)\n");
    ASSERT(t_same_ckpt(c, a, false) < 0);
}

TEST(mlp_tp2_clip_grad_norm) { clip("mlp", "0.02"); }
TEST(gpt_tp2_clip_grad_norm) { clip("gpt", "0.05"); }

int main(void)
{
    if (!cli())
        DT_TEST_SKIP_ALL("DT_CLI is not set (run under ctest)");
    if (cli_stream_file("tok.bin", 2000, false, g_data, sizeof g_data) < 0) {
        fprintf(stderr, "cannot write %s: %s\n", g_data + 7, dt_last_error());
        return 1;
    }
    RUN(mlp_tp2_checkpoints);
    RUN(gpt_tp2_checkpoints);
    RUN(mlp_tp2_dp2_checkpoint);
    RUN(mlp_tp2_clip_grad_norm);
    RUN(gpt_tp2_clip_grad_norm);
    cli_cleanup();
    return TEST_REPORT();
}
