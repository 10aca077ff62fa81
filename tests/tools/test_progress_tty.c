/* Progress display through the launcher, on a terminal and into a pipe.
 *   - dtrain run on a pty: a rank's "\r..." redraws are forwarded at once
 *     (before the rank prints its newline), the ranks see DT_STDOUT_TTY=1;
 *   - dtrain run into a pipe: DT_STDOUT_TTY=0, and `dtrain train --progress
 *     bar` prints plain lines: no '\r', no escape code;
 *   - a rank started by a launcher without the hint (RANK/WORLD_SIZE set,
 *     stdout a pty as mpirun gives it) prints plain lines too. */
// dt-test-timeout: 300
#include "test.h"
#include "train_cli.h"

#include <poll.h>
#include <pty.h>

/* Run argv on a new pty; collect output for up to secs; *first_at gets the
 * time (s since start) when `marker` first appeared, -1 if never. */
static int run_pty(char *const argv[], const char *env, double secs, const char *marker, double *first_at,
                   char *out, size_t cap)
{
    int master;
    *first_at = -1;
    out[0] = 0;
    pid_t pid = dt_test_forkpty(&master);
    if (pid < 0)
        return -1; /* no pty here: the caller's test fails and RUN() reports it skipped */
    if (pid == 0) {
        if (env)
            putenv((char *)env);
        execv(argv[0], argv);
        _exit(127);
    }
    size_t len = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        double el = (double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec);
        if (el > secs)
            break;
        struct pollfd pf = {master, POLLIN, 0};
        if (poll(&pf, 1, 50) > 0) {
            ssize_t r = read(master, out + len, cap - 1 - len);
            if (r <= 0)
                break;
            len += (size_t)r;
            out[len] = 0;
            if (*first_at < 0 && strstr(out, marker))
                *first_at = el;
        }
    }
    out[len] = 0;
    int status = 0;
    dt_test_kill(pid, SIGKILL);
    dt_test_waitpid(pid, &status, 0);
    close(master);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(bar_updates_are_live_on_a_terminal)
{
    const char *cli = getenv("DT_CLI");
    /* the rank redraws "A", waits 3 s, redraws "B", then ends the line */
    char *argv[] = {(char *)cli, "run", "-n", "1", "--", "sh", "-c",
                    "printf 'tty=%s\\rA-%s\\033[K' $DT_STDOUT_TTY $DT_STDOUT_TTY; sleep 3; "
                    "printf '\\rB\\033[K\\n'; echo done", NULL};
    static char out[65536];
    double at;
    run_pty(argv, NULL, 20, "A-1", &at, out, sizeof out);
    if (at < 0)
        fprintf(stderr, "  output: %s\n", out);
    ASSERT(at >= 0);       /* the rank saw DT_STDOUT_TTY=1 and its redraw came through */
    ASSERT(at < 2.5);      /* ... before the rank's newline (3 s later) */
    ASSERT_STR_CONTAINS(out, "\r[0] B");
    ASSERT_STR_CONTAINS(out, "[0] done");
}

TEST(pipe_gets_plain_lines)
{
    cli_result r;
    cli_runv(&r, 30, NULL, (char *[]){"run", "-n", "1", "--", "sh", "-c", "echo tty=$DT_STDOUT_TTY", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] tty=0");
    /* train with --progress bar under the launcher, into a pipe */
    cli_runv(&r, 280, NULL,
             (char *[]){"run", "-n", "1", "--", (char *)getenv("DT_CLI"), "train", "--model", "mlp", "--batch",
                        "2", "--random-items", "4", "--limit-test", "2", "--log-every", "1", "--progress",
                        "bar", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "[0] epoch 1/1 step 1/2 loss");
    ASSERT(!strchr(r.out, '\r'));
    ASSERT(!strchr(r.out, '\033'));
}

TEST(rank_without_hint_on_a_pty_is_plain)
{
    const char *cli = getenv("DT_CLI");
    char *argv[] = {(char *)cli, "train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test",
                    "2", "--log-every", "1", NULL};
    static char out[65536];
    double at;
    /* SLURM_PROCID: a launcher started it (as srun or mpirun would, on a pty) */
    run_pty(argv, "SLURM_PROCID=0", 280, "test loss:", &at, out, sizeof out);
    ASSERT(at >= 0);
    ASSERT_STR_CONTAINS(out, "epoch 1/1 step 1/2 loss");
    ASSERT(!strchr(out, '\033'));
    /* and without a launcher, the same pty gets the bar */
    run_pty(argv, NULL, 280, "test loss:", &at, out, sizeof out);
    ASSERT(at >= 0);
    ASSERT_STR_CONTAINS(out, "\033[K");
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    RUN(bar_updates_are_live_on_a_terminal);
    RUN(pipe_gets_plain_lines);
    RUN(rank_without_hint_on_a_pty_is_plain);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
