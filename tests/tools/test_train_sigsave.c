/* `dtrain train --save DIR` stopped by a signal: the step under way
 * finishes, the checkpoint of that step is written, and the run exits 130
 * with a message naming it; a run resumed from DIR continues from that step.
 * One process with SIGINT, and two ZeRO-2 ranks under `dtrain run` with
 * SIGTERM to the launcher (which forwards it). */
// dt-test-timeout: 240
#include "test.h"
#include "tools/train_cli.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TH_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* Start `dtrain [run -n 2 --] train ...` with stdout/stderr to files. */
static pid_t start(const char *dir, const char *out, const char *err, bool two)
{
    const char *cli = getenv("DT_CLI");
    pid_t pid = dt_test_fork();
    if (pid == 0) {
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        char *args[64];
        int n = 0;
        args[n++] = (char *)cli;
        if (two) {
            args[n++] = "run";
            args[n++] = "-n";
            args[n++] = "2";
            args[n++] = "--";
            args[n++] = (char *)cli;
        }
        const char *rest[] = {"train", "--model", "mlp", "--mlp-hidden", "64", "--data", "random", "--random-items",
                              "2000", "--batch", "2", "--limit-test", "2", "--log-every", "1", "--progress", "plain",
                              "--threads", "1", "--optimizer", "adamw", "--save", dir, "--save-every", "100000",
                              NULL};
        for (int i = 0; rest[i]; i++)
            args[n++] = (char *)rest[i];
        if (two) {
            args[n++] = "--zero";
            args[n++] = "2";
        }
        args[n] = NULL;
        execv(cli, args);
        _exit(127);
    }
    return pid;
}

static char g_buf[1 << 16];

static const char *slurp(const char *p)
{
    g_buf[0] = 0;
    FILE *f = fopen(p, "r");
    if (!f)
        return g_buf;
    size_t n = fread(g_buf, 1, sizeof g_buf - 1, f);
    g_buf[n] = 0;
    fclose(f);
    return g_buf;
}

/* Signal the run once it has taken a few steps ("step 3/" in its output). */
static int run_and_stop(bool two, int sig, const char *dir, char *saved, size_t n)
{
    char out[600], err[600];
    snprintf(out, sizeof out, "%s.out", dir);
    snprintf(err, sizeof err, "%s.err", dir);
    pid_t pid = start(dir, out, err, two);
    TH_CHECK(pid > 0, "cannot start the run");
    int seen = 0;
    for (int i = 0; i < 6000 && !seen; i++) { /* at most 120 s */
        seen = strstr(slurp(out), "step 3/") != NULL;
        if (!seen)
            sleep_ms(20);
    }
    dt_test_kill(pid, sig);
    int status;
    dt_test_waitpid(pid, &status, 0);
    TH_CHECK(seen, "the run never reached step 3: %s", slurp(err));
    /* the ranks exit 130; the launcher, itself signalled, 128 + SIGTERM */
    TH_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == (two ? 128 + SIGTERM : 130), "exit status %d: %s", status,
             slurp(err));
    const char *e = slurp(err);
    char want[64];
    snprintf(want, sizeof want, "interrupted by signal %d at step ", two ? SIGTERM : sig);
    TH_CHECK(strstr(e, want) != NULL, "stderr: %s", e);
    const char *c = strstr(e, "; checkpoint ");
    TH_CHECK(c != NULL, "no checkpoint named: %s", e);
    c += strlen("; checkpoint ");
    size_t k = 0;
    while (c[k] && c[k] != ' ' && k + 1 < n) {
        saved[k] = c[k];
        k++;
    }
    saved[k] = 0;
    char idx[800];
    snprintf(idx, sizeof idx, "%s/index.json", saved);
    TH_CHECK(file_exists(idx), "%s is not a complete checkpoint", saved);
    if (two) {
        snprintf(idx, sizeof idx, "%s/rank-00001.safetensors", saved);
        TH_CHECK(file_exists(idx), "ZeRO: rank 1 wrote no file in %s", saved);
    }
    return 0;
}

static void check(bool two, int sig, const char *name)
{
    char dir[400], saved[700];
    snprintf(dir, sizeof dir, "%s/%s", cli_tmpdir(), name);
    ASSERT_EQ_INT(run_and_stop(two, sig, dir, saved, sizeof saved), 0);
    /* the step in the name is the one the resumed run starts from */
    const char *s = strrchr(saved, '-');
    ASSERT(s != NULL);
    long long step = atoll(s + 1);
    ASSERT(step >= 3);
    cli_result *r = calloc(1, sizeof *r);
    char ms[32];
    snprintf(ms, sizeof ms, "%lld", step + 1);
    char *one[] = {"train", "--model", "mlp", "--mlp-hidden", "64", "--data", "random", "--random-items", "2000",
                   "--batch", "2", "--limit-test", "2", "--progress", "none", "--threads", "1", "--optimizer",
                   "adamw", "--save", dir, "--resume", "auto", "--max-steps", ms, NULL};
    char *args[64] = {"run", "-n", "2", "--", (char *)getenv("DT_CLI")};
    int n = two ? 5 : 0;
    for (int i = 0; one[i]; i++)
        args[n++] = one[i];
    if (two) {
        args[n++] = "--zero";
        args[n++] = "2";
    }
    args[n] = NULL;
    cli_runv(r, 120, NULL, two ? args : one);
    if (r->code)
        fprintf(stderr, "%s%s", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    char want[800];
    snprintf(want, sizeof want, "resumed from %s: step %lld", saved, step);
    ASSERT_STR_CONTAINS(r->out, want);
    free(r);
}

TEST(sigint_saves_one_process) { check(false, SIGINT, "one"); }

TEST(sigterm_saves_zero2_two_ranks) { check(true, SIGTERM, "two"); }

int main(void)
{
    if (!getenv("DT_CLI"))
        return DT_TEST_SKIP_CODE;
    RUN(sigint_saves_one_process);
    RUN(sigterm_saves_zero2_two_ranks);
    cli_cleanup();
    return TEST_REPORT();
}
