/* `dtrain run -n 2 -- dtrain train ...`: a short two-rank DDP run (one
 * progress display, rank 0's metrics file, sharded evaluation), the DDP
 * flags, and a rank killed mid-epoch: the survivor exits with an error
 * naming the dead rank within 5 s and `dtrain run` exits non-zero. */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "test.h"
#include "tools/train_cli.h"

#include "dtrain/base.h"
#include "dtrain/data.h"

#include <dirent.h>

static const char *k_cli(void) { return getenv("DT_CLI"); }

TEST(two_rank_run)
{
    cli_result *r = calloc(1, sizeof *r);
    char metrics[512];
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", cli_tmpdir());
    char *cli = (char *)k_cli();
    cli_runv(r, 120, NULL,
             (char *[]){"run", "-n", "2", "--", cli, "train", "--model", "convnet", "--data", "fashion-mnist",
                        "--limit-train", "400", "--limit-test", "200", "--batch", "50", "--epochs", "1",
                        "--lr", "0.05", "--momentum", "0.9", "--progress", "plain", "--log-every", "2",
                        "--threads", "1", "--seed", "1", "--metrics", metrics, NULL});
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    /* 400 items over 2 ranks of batch 50: 4 steps per rank */
    ASSERT_STR_CONTAINS(r->out, "[0] training convnet");
    ASSERT_STR_CONTAINS(r->out, "4 steps/epoch of 50");
    ASSERT_STR_CONTAINS(r->out, "[0] data parallel: 2 ranks, batch 50 per rank (100 per step)");
    ASSERT_STR_CONTAINS(r->out, "[0] test accuracy: ");
    ASSERT_STR_CONTAINS(r->out, "(200 items)");
    ASSERT_STR_CONTAINS(r->out, "[0] DDP: 2 ranks (shm), 1 bucket, 4 gradient all-reduces");
    /* one progress display: rank 1 prints nothing */
    ASSERT(strstr(r->out, "[1] ") == NULL);
    ASSERT(file_exists(metrics));
    char buf[8192] = {0};
    FILE *f = fopen(metrics, "r");
    ASSERT(f != NULL);
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    ASSERT_STR_CONTAINS(buf, "\"event\":\"eval\"");
    ASSERT_STR_CONTAINS(buf, "\"test_items\":200");
    free(r);
}

/* The ConvNet in bf16 and fp16 under DDP: its BatchNorm parameters stay
 * f32 (keep_batchnorm_fp32) beside the bf16/f16 convolutions, and DDP
 * reduces each dtype in its own buckets (it refused the model before). */
TEST(two_rank_mixed_precision_convnet)
{
    cli_result *r = calloc(1, sizeof *r);
    char *cli = (char *)k_cli();
    const char *precs[] = {"bf16", "fp16"};
    for (int i = 0; i < 2; i++) {
        cli_runv(r, 120, NULL,
                 (char *[]){"run", "-n", "2", "--", cli, "train", "--model", "convnet", "--data", "fashion-mnist",
                            "--limit-train", "400", "--limit-test", "200", "--batch", "50", "--epochs", "1",
                            "--lr", "0.05", "--momentum", "0.9", "--progress", "plain", "--threads", "1",
                            "--seed", "1", "--precision", (char *)precs[i], NULL});
        if (r->code != 0)
            fprintf(stderr, "%s: stdout:\n%s\nstderr:\n%s\n", precs[i], r->out, r->err);
        ASSERT_EQ_INT(r->code, 0);
        ASSERT_STR_CONTAINS(r->out, "[0] test accuracy: ");
        ASSERT_STR_CONTAINS(r->out, "[0] DDP: 2 ranks (shm), 2 buckets"); /* one per parameter dtype */
    }
    free(r);
}

TEST(flags_sync_bn_accum_buckets)
{
    cli_result *r = calloc(1, sizeof *r);
    char *cli = (char *)k_cli();
    cli_runv(r, 120, NULL,
             (char *[]){"run", "-n", "2", "--", cli, "train", "--model", "convnet", "--data", "fashion-mnist",
                        "--limit-train", "400", "--limit-test", "100", "--batch", "25", "--sync-bn",
                        "--grad-accum", "2", "--bucket-mb", "0.02", "--progress", "none", "--threads", "1",
                        NULL});
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    /* 8 micro-batches per rank, a reduction every 2: 4 iterations (optimizer steps) of several buckets */
    ASSERT_STR_CONTAINS(r->out, "SyncBatchNorm");
    ASSERT_STR_CONTAINS(r->out, "(4 steps)");
    ASSERT(strstr(r->out, "buckets, SyncBatchNorm") != NULL);
    ASSERT_STR_CONTAINS(r->out, "[0] test accuracy: ");
    /* a bad value is one line and exit 2 */
    cli_runv(r, 60, NULL, (char *[]){"train", "--grad-accum", "0", NULL});
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, "--grad-accum");
    free(r);
}

/* ---- a rank killed mid-epoch ---- */

/* pid of the launcher's child whose environment has DT_RANK=<rank>, or -1. */
static pid_t find_rank(pid_t launcher, int rank)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    struct dirent *e;
    pid_t found = -1;
    char want[32];
    snprintf(want, sizeof want, "DT_RANK=%d", rank);
    while ((e = readdir(d)) && found < 0) {
        pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], stat[512];
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        slurp_(path, stat, sizeof stat);
        const char *rp = strrchr(stat, ')');
        int ppid = 0;
        if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1 || ppid != launcher)
            continue;
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char env[16384];
        size_t n = fread(env, 1, sizeof env - 1, f);
        fclose(f);
        env[n] = 0;
        for (size_t i = 0; i < n; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want))
                found = pid;
    }
    closedir(d);
    return found;
}

TEST(rank_killed_mid_epoch)
{
    char po[512], pe[512];
    snprintf(po, sizeof po, "%s/kill.out", cli_tmpdir());
    snprintf(pe, sizeof pe, "%s/kill.err", cli_tmpdir());
    char *cli = (char *)k_cli();
    pid_t launcher = dt_test_fork();
    ASSERT(launcher >= 0);
    if (launcher == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        char *argv[] = {cli, "run", "-n", "2", "--", cli, "train", "--model", "convnet", "--data", "fashion-mnist", "--batch", "10", "--progress", "plain", "--log-every", "1",
                        "--threads", "1", "--no-eval", NULL};
        execv(cli, argv);
        _exit(127);
    }
    /* wait until rank 0 has trained a few steps */
    static char out[65536], err[16384];
    double t0 = dt_time_s();
    while (dt_time_s() - t0 < 60) {
        slurp_(po, out, sizeof out);
        if (strstr(out, "step 3/"))
            break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    pid_t victim = find_rank(launcher, 1);
    if (!strstr(out, "step 3/") || victim <= 0) {
        dt_test_kill(launcher, SIGKILL);
        dt_test_waitpid(launcher, NULL, 0);
        TEST_FAIL_("no progress or no rank 1 (pid %d); out: %s", (int)victim, out);
    }
    dt_test_kill(victim, SIGKILL);
    double t_kill = dt_time_s();
    int status = 0;
    while (dt_test_waitpid(launcher, &status, WNOHANG) == 0 && dt_time_s() - t_kill < 30) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    double took = dt_time_s() - t_kill;
    if (took >= 30) {
        dt_test_kill(launcher, SIGKILL);
        dt_test_waitpid(launcher, &status, 0);
    }
    slurp_(po, out, sizeof out);
    slurp_(pe, err, sizeof err);
    fprintf(stderr, "launcher exited %.2f s after the kill; stderr:\n%s", took, err);
    ASSERT(took < 5.0);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    /* the survivor's own error names the dead rank */
    ASSERT_STR_CONTAINS(err, "[0] dtrain train: training step: ");
    ASSERT_STR_CONTAINS(err, "rank 1 (pid");
}

int main(void)
{
    if (!k_cli()) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    /* every run here trains on Fashion-MNIST */
    if (!file_exists(dt_data_fashion_mnist_dir()))
        DT_TEST_SKIP_ALL_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dt_data_fashion_mnist_dir());
    RUN(two_rank_run);
    RUN(two_rank_mixed_precision_convnet);
    RUN(flags_sync_bn_accum_buckets);
    RUN(rank_killed_mid_epoch);
    cli_cleanup();
    return TEST_REPORT();
}
