/* A test that cannot create a process must skip, and must never signal
 * anything it did not make. As root, kill -1 with SIGKILL after a failed
 * forkpty (pid -1) ends every process on the machine; that happened when
 * tests ran in a chroot without /dev/pts.
 *
 * Each case runs another test program with signal_shim.so preloaded
 * (tests/tools/signal_shim.c): the shim makes forkpty or fork fail, and
 * refuses and logs any signal aimed outside the program's own process tree,
 * so even a regression harms nothing here while the log shows it.
 *   - test_progress_tty with forkpty failing: exits 77 (skipped), no refusal;
 *   - test_help (CLI runs through train_cli.h) with fork failing: the same;
 *   - test_comm_fail (forked ranks, tests/comm/harness.h) with fork failing;
 *   - the control: a program that signals pid -1 (signal 0) is refused and logged,
 *     so this test can fail. */
// dt-test-timeout: 600
#include "test.h"

#include <fcntl.h>
#include <sys/stat.h>

static char g_log[512];

static const char *bindir(void)
{
    const char *b = getenv("DT_BINARY_DIR");
    return b ? b : DT_BINARY_DIR;
}

static int shim_present(char *shim, size_t n)
{
    snprintf(shim, n, "%s/tests/libdt_signal_shim.so", bindir());
    return access(shim, R_OK) == 0;
}

/* Run argv[0] under the shim with one extra "K=V" in its environment (NULL:
 * none), in a process group of its own; returns its exit code, 128 + signal,
 * or -1. */
static int run_shimmed(char *const argv[], const char *extra)
{
    char shim[512];
    if (!shim_present(shim, sizeof shim))
        return -1;
    unlink(g_log);
    pid_t pid = dt_test_fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setpgid(0, 0);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0)
            dup2(nul, 1);
        setenv("LD_PRELOAD", shim, 1);
        setenv("DT_SHIM_LOG", g_log, 1);
        unsetenv("DT_SHIM_ROOT");
        /* a sanitizer build's runtime must come first in the library list;
         * with the shim preloaded it does not, and that is fine here */
        setenv("ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=0", 1);
        if (extra)
            putenv((char *)extra);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    if (dt_test_waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *read_log(void)
{
    static char buf[65536];
    buf[0] = 0;
    FILE *f = fopen(g_log, "r");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void test_prog(char *path, size_t n, const char *name)
{
    snprintf(path, n, "%s/tests/%s", bindir(), name);
}

TEST(shim_refuses_and_logs_a_signal_to_everyone)
{
    char shim[512], self[4096];
    if (!shim_present(shim, sizeof shim))
        DT_TEST_SKIP("%s not built", shim);
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT(k > 0);
    self[k] = 0;
    char *argv[] = {self, "--signal-everyone", NULL};
    int code = run_shimmed(argv, NULL);
    ASSERT_EQ_INT(code, 0);
    char *log = read_log();
    ASSERT_STR_CONTAINS(log, "loaded ");
    ASSERT_STR_CONTAINS(log, "REFUSED -1 0");
}

static void expect_skip_and_no_stray_signal(const char *prog, const char *fail)
{
    char path[512];
    test_prog(path, sizeof path, prog);
    char *argv[] = {path, NULL};
    int code = run_shimmed(argv, fail);
    char *log = read_log();
    if (code != DT_TEST_SKIP_CODE || strstr(log, "REFUSED"))
        fprintf(stderr, "  %s with %s: exit %d, shim log:\n%s", prog, fail, code, log);
    ASSERT_STR_CONTAINS(log, "loaded ");   /* the shim was in place */
    ASSERT(!strstr(log, "REFUSED"));        /* nothing outside its tree was signalled */
    ASSERT_EQ_INT(code, DT_TEST_SKIP_CODE); /* it could not run: skipped, not passed or failed */
}

TEST(pty_test_without_ptys_skips_and_signals_nothing)
{
    char shim[512];
    if (!shim_present(shim, sizeof shim))
        DT_TEST_SKIP("%s not built", shim);
    expect_skip_and_no_stray_signal("test_progress_tty", "DT_SHIM_FAIL_FORKPTY=1");
}

TEST(cli_tests_without_fork_skip_and_signal_nothing)
{
    char shim[512];
    if (!shim_present(shim, sizeof shim))
        DT_TEST_SKIP("%s not built", shim);
    expect_skip_and_no_stray_signal("test_help", "DT_SHIM_FAIL_FORK=1");
}

TEST(forked_rank_tests_without_fork_skip_and_signal_nothing)
{
    char shim[512];
    if (!shim_present(shim, sizeof shim))
        DT_TEST_SKIP("%s not built", shim);
    expect_skip_and_no_stray_signal("test_comm_fail", "DT_SHIM_FAIL_FORK=1");
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--signal-everyone")) {
        /* signal 0 sends nothing even if the shim were missing */
        int r = kill(-1, 0); /* dt-proc-ok: the shim's control */
        return r == -1 && errno == EPERM ? 0 : 3;
    }
    snprintf(g_log, sizeof g_log, "%s/dt_proc_safety_%d.log", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    RUN(shim_refuses_and_logs_a_signal_to_everyone);
    RUN(pty_test_without_ptys_skips_and_signals_nothing);
    RUN(cli_tests_without_fork_skip_and_signal_nothing);
    RUN(forked_rank_tests_without_fork_skip_and_signal_nothing);
    unlink(g_log);
    return TEST_REPORT();
}
