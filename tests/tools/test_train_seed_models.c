/* The seed's two DeepSpeed configs (003: ZeRO 2 with its
 * activation_checkpointing block, ZeRO 3 with CPU offload after fixing its
 * missing comma) train every zoo model (the ConvNet, the MLP, the GPT) on 2
 * ranks, under `dtrain run` and under `mpirun` (skipped without it): the
 * checkpointing block checkpoints each model's own units (the ConvNet's
 * conv blocks, the MLP's module, the GPT's blocks) and says once, for each
 * of its keys that does nothing on a CPU, why. With --activation-checkpointing
 * the ConvNet and the MLP log the losses they log without it, step for step
 * (the recomputation gives the same values). */
// dt-test-timeout: 600
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#define DATA DT_SOURCE_DIR "/tests/config/data/"

static char g_tok[320], g_val[320];

static void write_tokens(void)
{
    ASSERT_OK(cli_stream_train_val(g_tok, g_val, sizeof g_tok));
}

/* the model flags of zoo model i (the convnet on Fashion-MNIST) */
static int model_args(int i, const char **a)
{
    int n = 0;
    if (i == 0) {
        a[n++] = "--model", a[n++] = "convnet";
        a[n++] = "--data", a[n++] = "fashion-mnist", a[n++] = "--limit-train", a[n++] = "400";
        a[n++] = "--limit-test", a[n++] = "100";
    } else if (i == 1) {
        a[n++] = "--model", a[n++] = "mlp", a[n++] = "--mlp-dim", a[n++] = "16", a[n++] = "--mlp-hidden";
        a[n++] = "64", a[n++] = "--random-items", a[n++] = "64", a[n++] = "--limit-test", a[n++] = "16";
    } else {
        a[n++] = "--model", a[n++] = "gpt-micro", a[n++] = "--vocab-size", a[n++] = "40", a[n++] = "--n-embd";
        a[n++] = "32", a[n++] = "--seq", a[n++] = "16", a[n++] = "--data", a[n++] = g_tok, a[n++] = "--val-data";
        a[n++] = g_val;
    }
    return n;
}

static const char *const k_models[] = {"convnet", "mlp", "gpt-micro"};
static const char *const k_units[] = {"2 Sequential", "1 MLP", "2 GPT2Block"};

/* argv (from index 0) of `train --config cfg <model i> --batch 4 ...` */
static int train_args(char **a, const char *cfg, int model)
{
    int n = 0;
    a[n++] = "train", a[n++] = "--config", a[n++] = (char *)cfg;
    n += model_args(model, (const char **)a + n);
    const char *rest[] = {"--batch", "4", "--optimizer", "adamw", "--lr", "0.01", "--threads", "1", "--progress",
                          "plain", "--max-steps", "6", NULL};
    for (int i = 0; rest[i]; i++)
        a[n++] = (char *)rest[i];
    a[n] = NULL;
    return n;
}

/* What every run of the seeds must show; prefix "[0] " under dtrain run. */
static void check_run(const cli_result *r, const char *cfg, int model, const char *prefix)
{
    if (r->code != 0)
        fprintf(stderr, "%s on %s:\nstdout:\n%s\nstderr:\n%s\n", cfg, k_models[model], r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    char want[160];
    bool z2 = strstr(cfg, "zero2") != NULL;
    snprintf(want, sizeof want, "%sZeRO stage %d: 2 ranks", prefix, z2 ? 2 : 3);
    ASSERT_STR_CONTAINS(r->out, want);
    if (!z2)
        return;
    snprintf(want, sizeof want, "%sactivation checkpointing: %s modules recompute their forward in backward",
             prefix, k_units[model]);
    ASSERT_STR_CONTAINS(r->out, want);
    /* the keys without effect here, each said once, with the reason */
    const char *keys[] = {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                          "synchronize_checkpoint_boundary"};
    for (int k = 0; k < 4; k++) {
        snprintf(want, sizeof want, "warning: activation_checkpointing.%s: no effect here: ", keys[k]);
        const char *p = strstr(r->err, want);
        ASSERT(p != NULL);
        ASSERT(strstr(p + 1, want) == NULL);
    }
    ASSERT(strstr(r->err, "GPT models only") == NULL);
}

static const char *const k_cfgs[] = {DATA "seed_zero2_actckpt.json", DATA "seed_zero3_offload_fixed.json"};

TEST(seeds_train_every_model_under_dtrain_run)
{
    static cli_result r;
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 3; m++) {
            char *a[64] = {"run", "-n", "2", "--", getenv("DT_CLI")};
            train_args(a + 5, k_cfgs[c], m);
            cli_runv(&r, 200, NULL, a);
            check_run(&r, k_cfgs[c], m, "[0] ");
        }
}

/* mpirun -np 2 dtrain train ...: output into r (stdout, stderr) */
static int run_mpirun(cli_result *r, char **train)
{
#ifdef DT_MPIEXEC
    char po[400], pe[400];
    snprintf(po, sizeof po, "%s/mpi.out", cli_tmpdir());
    snprintf(pe, sizeof pe, "%s/mpi.err", cli_tmpdir());
    char *argv[80] = {DT_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "2",
                      getenv("DT_CLI")};
    int n = 8;
    for (int i = 0; train[i]; i++)
        argv[n++] = train[i];
    argv[n] = NULL;
    pid_t pid = dt_test_fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        setenv("ASAN_OPTIONS", "detect_leaks=0", 1); /* Open MPI's own leaks (as the MPI tests) */
        execv(DT_MPIEXEC, argv);
        _exit(127);
    }
    int status = 0;
    for (int t = 0; t < 200 * 50; t++) {
        if (dt_test_waitpid(pid, &status, WNOHANG) == pid)
            goto done;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    dt_test_kill(pid, SIGTERM); /* mpirun ends its ranks */
    dt_test_waitpid(pid, &status, 0);
    status = -1;
done:
    r->code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    slurp_(po, r->out, sizeof r->out);
    slurp_(pe, r->err, sizeof r->err);
    return r->code;
#else
    (void)r, (void)train;
    return -1;
#endif
}

TEST(seeds_train_every_model_under_mpirun)
{
#ifndef DT_MPIEXEC
    DT_TEST_SKIP("mpirun was not found at configure time");
#else
    if (access(DT_MPIEXEC, X_OK) != 0)
        DT_TEST_SKIP("%s is not there", DT_MPIEXEC);
    static cli_result r;
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 3; m++) {
            char *a[64];
            train_args(a, k_cfgs[c], m);
            run_mpirun(&r, a);
            check_run(&r, k_cfgs[c], m, ""); /* ranks print unprefixed under mpirun */
        }
#endif
}

/* the step losses of a metrics file, one per line */
static void step_losses(const char *path, char *out, size_t n)
{
    static char buf[1 << 18];
    slurp_(path, buf, sizeof buf);
    size_t k = 0;
    for (const char *p = buf; (p = strstr(p, "{\"event\":\"step\"")); p++) {
        const char *l = strstr(p, "\"loss\":");
        if (!l)
            break;
        for (l += 7; *l && *l != ',' && k + 2 < n;)
            out[k++] = *l++;
        out[k++] = '\n';
    }
    out[k] = 0;
}

TEST(recomputation_gives_the_same_losses)
{
    static cli_result r;
    static char a[4096], b[4096];
    for (int m = 0; m < 2; m++) {
        for (int ck = 0; ck < 2; ck++) {
            char metrics[300];
            snprintf(metrics, sizeof metrics, "%s/m%d.jsonl", cli_tmpdir(), ck);
            char *args[64] = {"run", "-n", "2", "--", getenv("DT_CLI"), "train"};
            int n = 6;
            n += model_args(m, (const char **)args + n);
            const char *rest[] = {"--batch", "8", "--optimizer", "adamw", "--lr", "0.01", "--threads", "1",
                                  "--progress", "none", "--log-every", "1", "--epochs", "10", "--max-steps", "20", "--no-eval",
                                  "--metrics", metrics, ck ? "--activation-checkpointing" : NULL, NULL};
            for (int i = 0; rest[i]; i++)
                args[n++] = (char *)rest[i];
            args[n] = NULL;
            cli_runv(&r, 200, NULL, args);
            if (r.code != 0)
                fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
            ASSERT_EQ_INT(r.code, 0);
            step_losses(metrics, ck ? b : a, sizeof a);
        }
        ASSERT_EQ_INT(cli_lines(a), 20);
        ASSERT_STR_EQ(a, b);
    }
}

int main(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dt_data_fashion_mnist_dir());
    if (access(p, R_OK) != 0) /* the convnet's runs train on it (--data random is the MLP's only) */
        DT_TEST_SKIP_ALL_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dt_data_fashion_mnist_dir());
    write_tokens();
    RUN(seeds_train_every_model_under_dtrain_run);
    RUN(seeds_train_every_model_under_mpirun);
    RUN(recomputation_gives_the_same_losses);
    return TEST_REPORT();
}
