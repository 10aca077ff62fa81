/* dtrain train --save / --resume / --max-steps through the CLI (env DT_CLI),
 * on a small generated MNIST-layout set (160 training items, the ConvNet,
 * batch 8): a run stopped mid-epoch and resumed from its checkpoint ends
 * with the same weights and optimizer state, byte for byte, as the run that
 * never stopped, for SGD with momentum and AdamW, on 1 rank and on 2 ranks
 * (dtrain run -n 2); resuming a 2-rank checkpoint on 1 rank works and says
 * that the data order is not kept; dtrain eval --ckpt evaluates a
 * checkpoint with the model and data it was trained on; bad combinations
 * of the flags are refused with one line; a resume with another
 * --grad-accum, --lr-schedule, --warmup, --lr or --limit-train warns naming the
 * old and the new values, one with only a larger --max-steps does not. */
// dt-test-timeout: 300
#include "data/data_util.h"
#include "test.h"
#include "train_cli.h"

#include <errno.h>
#include <stdbool.h>

static char g_data[300]; /* the MNIST-layout directory */
static char g_spec[320]; /* idx:DIR */

static void make_data(void)
{
    snprintf(g_data, sizeof g_data, "%s/mnist", cli_tmpdir());
    mkdir(g_data, 0755);
    tu_write_mnist(g_data, "train", 160, 28, 28, 160, 0);
    tu_write_mnist(g_data, "t10k", 40, 28, 28, 40, 0);
    snprintf(g_spec, sizeof g_spec, "idx:%s", g_data);
}

/* dtrain [run -n ranks --] train <common> <opt flags> extra... ; returns the exit code. */
static int train(cli_result *r, int ranks, const char *opt, char *const *extra)
{
    char *argv[64];
    int n = 0;
    if (ranks > 1) {
        static char nbuf[16];
        snprintf(nbuf, sizeof nbuf, "%d", ranks);
        argv[n++] = "run";
        argv[n++] = "-n";
        argv[n++] = nbuf;
        argv[n++] = "--";
        argv[n++] = getenv("DT_CLI");
    }
    char *common[] = {"train", "--model", "convnet", "--data", g_spec, "--batch", "8", "--epochs", "2",
                      "--progress", "none", "--threads", "1", "--no-eval", "--seed", "3", "--optimizer",
                      (char *)opt, "--lr", !strcmp(opt, "sgd") ? "0.05" : "0.002", NULL};
    for (int i = 0; common[i]; i++)
        argv[n++] = common[i];
    if (!strcmp(opt, "sgd")) {
        argv[n++] = "--momentum";
        argv[n++] = "0.9";
    }
    for (int i = 0; extra[i] && n < 63; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    cli_runv(r, 60, NULL, argv);
    if (r->code != 0)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r->code, r->out, r->err);
    return r->code;
}

/* Uninterrupted to the end (saving every `every` steps on the way) against
 * --max-steps k then --resume: the final checkpoints are identical files.
 * The 160 items make 20 steps per epoch on 1 rank, 10 on 2; k is mid-epoch. */
static void check(int ranks, const char *opt, int k, int every)
{
    char ref[400], run[400], a[600], b[600], ks[16], es[16];
    snprintf(ref, sizeof ref, "%s/ref_%s_%d", cli_tmpdir(), opt, ranks);
    snprintf(run, sizeof run, "%s/run_%s_%d", cli_tmpdir(), opt, ranks);
    snprintf(ks, sizeof ks, "%d", k);
    snprintf(es, sizeof es, "%d", every);
    const int total = 2 * 160 / (8 * ranks);
    cli_result r;
    ASSERT_EQ_INT(train(&r, ranks, opt, (char *[]){"--save", ref, "--save-every", es, NULL}), 0);
    ASSERT_EQ_INT(train(&r, ranks, opt, (char *[]){"--save", run, "--max-steps", ks, "--async-save", NULL}), 0);
    snprintf(a, sizeof a, "%s/step-%08d/index.json", run, k);
    ASSERT(file_exists(a));
    /* the checkpoint at k equals the uninterrupted run's at k (when it saved one) */
    if (k % every == 0) {
        snprintf(a, sizeof a, "%s/step-%08d/rank-00000.safetensors", run, k);
        snprintf(b, sizeof b, "%s/step-%08d/rank-00000.safetensors", ref, k);
        ASSERT(same_file(a, b));
    }
    ASSERT_EQ_INT(train(&r, ranks, opt, (char *[]){"--save", run, "--resume", run, NULL}), 0);
    ASSERT_STR_CONTAINS(r.out, "resumed from ");
    const char *files[] = {"rank-00000.safetensors"};
    for (int i = 0; i < 1; i++) {
        snprintf(a, sizeof a, "%s/step-%08d/%s", run, total, files[i]);
        snprintf(b, sizeof b, "%s/step-%08d/%s", ref, total, files[i]);
        if (!same_file(a, b))
            fprintf(stderr, "%s and %s differ\n", a, b);
        ASSERT(same_file(a, b));
    }
    /* and a checkpoint mid-run is not the final one (the comparison means something) */
    snprintf(a, sizeof a, "%s/step-%08d/rank-00000.safetensors", run, k);
    snprintf(b, sizeof b, "%s/step-%08d/rank-00000.safetensors", ref, total);
    ASSERT(!same_file(a, b));
}

TEST(resume_1_rank_sgd) { check(1, "sgd", 27, 9); }
TEST(resume_1_rank_adamw) { check(1, "adamw", 13, 13); }
TEST(resume_2_ranks_sgd) { check(2, "sgd", 13, 5); }
TEST(resume_2_ranks_adamw) { check(2, "adamw", 7, 7); }

TEST(other_world_size_says_what_it_drops)
{
    char run[400], ck[600], met[600], text[65536];
    snprintf(run, sizeof run, "%s/run_adamw_2", cli_tmpdir());
    snprintf(ck, sizeof ck, "%s/step-00000007", run);
    if (!file_exists(ck))
        DT_TEST_SKIP("needs resume_2_ranks_adamw's checkpoint");
    snprintf(met, sizeof met, "%s/ws.jsonl", cli_tmpdir());
    char out[400];
    snprintf(out, sizeof out, "%s/ws", cli_tmpdir());
    cli_result r;
    ASSERT_EQ_INT(train(&r, 1, "adamw", (char *[]){"--save", out, "--resume", ck, "--metrics", met, "--progress",
                                                   "plain", "--log-every", "1", NULL}), 0);
    ASSERT_STR_CONTAINS(r.err, "the data order is not kept");
    /* the world size of the message is the data-parallel one (issue 32: under --tp/--pp "ranks" misled) */
    ASSERT_STR_CONTAINS(r.err, "saved by 2 data-parallel replicas, this run has 1");
    /* the progress shows where in the epoch the run went on: batch 7 of 10 on 2 ranks is batch 14 of 20 on
       one, so its first step is 15/20 and the epoch ends at 20/20 (issue 32: it showed 8/20 and "done: 13") */
    ASSERT_STR_CONTAINS(r.out, "epoch 1/2 step 15/20 loss");
    ASSERT(strstr(r.out, "epoch 1/2 step 8/20 ") == NULL);
    ASSERT_STR_CONTAINS(r.out, "epoch 1/2 done: 20 steps");
    slurp_(met, text, sizeof text);
    ASSERT_STR_CONTAINS(text, "\"data_order_kept\":false");
    ASSERT_STR_CONTAINS(text, "\"saved_world_size\":2");
    /* it resumed at step 7 and trained on: the last checkpoint is past it */
    char latest[700];
    snprintf(latest, sizeof latest, "%s/step-00000007", out);
    ASSERT(!file_exists(latest));
}

/* dtrain eval --ckpt: the checkpoint's own model and data; the resumed run's
 * final checkpoint evaluates exactly as the uninterrupted one's */
/* An MLP on random data saved at step 4, resumed to step 6 with extra (NULL-terminated); its stderr in r. */
static void resume_with(cli_result *r, const char *dir, char **extra)
{
    char *args[64] = {"train", "--model", "mlp", "--mlp-hidden", "8", "--data", "random", "--random-items", "256",
                      "--batch", "8", "--limit-test", "8", "--progress", "none", "--threads", "1", "--save",
                      (char *)dir, "--resume", (char *)dir, "--max-steps", "6", NULL};
    int n = 0;
    while (args[n])
        n++;
    for (int i = 0; extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cli_runv(r, 120, NULL, args);
    if (r->code)
        fprintf(stderr, "%s%s", r->out, r->err);
}

TEST(changed_settings_warn)
{
    char dir[400], rm[500];
    snprintf(dir, sizeof dir, "%s/settings", cli_tmpdir());
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    char *first[] = {"train", "--model", "mlp", "--mlp-hidden", "8", "--data", "random", "--random-items", "256",
                     "--batch", "8", "--limit-test", "8", "--progress", "none", "--threads", "1", "--save", dir,
                     "--max-steps", "4", "--lr-schedule", "cosine", "--warmup", "2", "--grad-accum", "2",
                     "--limit-train", "128", NULL};
    ASSERT_EQ_INT(cli_runv(r, 120, NULL, first), 0);
    snprintf(rm, sizeof rm, "%s/step-00000006", dir);
    char *same[] = {"--lr-schedule", "cosine", "--warmup", "2", "--grad-accum", "2", "--limit-train", "128", NULL};
    resume_with(r, dir, same);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT(strstr(r->err, "the checkpoint was trained with") == NULL);
    t_rm_rf(rm);
    char *sched[] = {"--lr-schedule", "linear", "--warmup", "5", "--grad-accum", "1", "--limit-train", "128", NULL};
    resume_with(r, dir, sched);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "trained with --grad-accum 2 --lr-schedule cosine --warmup 2, this run has "
                                "--grad-accum 1 --lr-schedule linear --warmup 5");
    t_rm_rf(rm);
    char *limit[] = {"--lr-schedule", "cosine", "--warmup", "2", "--grad-accum", "2", "--limit-train", "64", NULL};
    resume_with(r, dir, limit);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "trained with --limit-train 128, this run has --limit-train 64");
    t_rm_rf(rm);
    char *lr[] = {"--lr-schedule", "cosine", "--warmup", "2", "--grad-accum", "2", "--limit-train", "128", "--lr",
                  "0.0003", NULL};
    resume_with(r, dir, lr);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "trained with --lr 0.01, this run has --lr 0.0003:");
    free(r);
}

TEST(eval_ckpt)
{
    char ref[400], run[400], out1[1024];
    snprintf(ref, sizeof ref, "%s/ref_sgd_2", cli_tmpdir());
    snprintf(run, sizeof run, "%s/run_sgd_2", cli_tmpdir());
    if (!file_exists(ref) || !file_exists(run))
        DT_TEST_SKIP("needs resume_2_ranks_sgd's checkpoints");
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ref, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test loss: ");
    ASSERT_STR_CONTAINS(r.out, "test accuracy: ");
    ASSERT_STR_CONTAINS(r.out, "(40 items)");
    strncpy(out1, r.out, sizeof out1 - 1);
    out1[sizeof out1 - 1] = 0;
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", run, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_EQ(r.out, out1);
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ref, "--limit-test", "10", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "(10 items)");
    cli_runv(&r, 60, NULL, (char *[]){"eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--ckpt");
    /* dtrain eval's errors (from the train code it shares) say dtrain eval */
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ref, "--limit-test", "-5", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!strncmp(r.err, "dtrain eval: --limit-test", 25));
    ASSERT(strstr(r.err, "dtrain train") == NULL);
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ref, "--data", "/nonexistent-dtrain-data", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT(!strncmp(r.err, "dtrain eval: --data", 19));
}

/* An MLP of other widths (--mlp-dim/--mlp-hidden): its checkpoint kept
 * neither, so dtrain eval --ckpt built the default 1024 x 4096 MLP and
 * failed on the first tensor's shape (exit 2); the widths are kept now. */
TEST(eval_ckpt_mlp_widths)
{
    char save[400];
    snprintf(save, sizeof save, "%s/mlp_widths", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "16", "--random-items", "32",
                        "--limit-test", "8", "--batch", "8", "--max-steps", "2", "--no-eval", "--progress", "none",
                        "--threads", "1", "--save", save, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", save, NULL});
    if (r.code)
        fprintf(stderr, "%s", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test loss: ");
    /* a width given still overrides the kept one (here: wrongly, so the shapes disagree) */
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", save, "--mlp-hidden", "8", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "shape");
    /* --weights: its errors name --weights (they said --ckpt); a missing file is bad input (it was exit 1) */
    char missing[420];
    snprintf(missing, sizeof missing, "%s/no-such.safetensors", cli_tmpdir());
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--weights", missing, "--model", "mlp", "--data", "random", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "dtrain eval: --weights ");
    ASSERT_STR_CONTAINS(r.err, "No such file or directory");
    cli_runv(&r, 60, NULL,
             (char *[]){"eval", "--weights", save, "--model", "mlp", "--mlp-dim", "8", "--data", "random", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "dtrain eval: --weights: tensor");
    /* a directory with no checkpoint in it: bad input too (it was an I/O error, exit 1) */
    char empty[420];
    snprintf(empty, sizeof empty, "%s/no-checkpoint-here", cli_tmpdir());
    ASSERT(mkdir(empty, 0755) == 0 || errno == EEXIST);
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--weights", empty, "--model", "mlp", "--data", "random", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "holds no complete checkpoint");
}

TEST(bad_flags)
{
    cli_result r;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/nothing", cli_tmpdir());
    ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--save-every", "3", NULL}), 2);
    ASSERT_STR_CONTAINS(r.err, "--save-every needs --save");
    ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--resume", "auto", NULL}), 2);
    ASSERT_STR_CONTAINS(r.err, "--resume auto needs --save");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--resume", dir, NULL}), 2); /* a missing path: bad input */
    ASSERT_STR_CONTAINS(r.err, "--resume");
    ASSERT_STR_CONTAINS(r.err, "nothing");
    ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--init-from", dir, NULL}), 2);
    ASSERT_STR_CONTAINS(r.err, "nothing");
    /* resuming adamw state into sgd: refused, naming both */
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ref_adamw_1", cli_tmpdir());
    if (file_exists(ck)) {
        ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--resume", ck, NULL}), 2);
        ASSERT_STR_CONTAINS(r.err, "adamw");
    }
    /* --init-from a file that is not safetensors */
    snprintf(ck, sizeof ck, "%s/train-images-idx3-ubyte", g_data);
    ASSERT_EQ_INT(train(&r, 1, "sgd", (char *[]){"--init-from", ck, NULL}), 2);
    ASSERT_STR_CONTAINS(r.err, "--init-from");
}

int main(void)
{
    make_data();
    RUN(resume_1_rank_sgd);
    RUN(resume_1_rank_adamw);
    RUN(resume_2_ranks_sgd);
    RUN(resume_2_ranks_adamw);
    RUN(other_world_size_says_what_it_drops);
    RUN(changed_settings_warn);
    RUN(eval_ckpt);
    RUN(eval_ckpt_mlp_widths);
    RUN(bad_flags);
    cli_cleanup();
    return TEST_REPORT();
}
