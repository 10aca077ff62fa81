/* tests/proc.h — checked process control for tests (included by test.h).
 *
 * Tests run as root in CI. There, kill(-1, sig) signals every process on the
 * machine, and kill(0, sig) or waitpid(-1, ...) act on processes the test
 * never made. So a test never calls fork, forkpty, kill, killpg or waitpid
 * directly (tests/tools/test_proc_rules.c checks the tree); it calls these:
 *
 *     pid_t pid = dt_test_fork();
 *     if (pid < 0) DT_TEST_SKIP("cannot fork");   // or: the harness skips for it
 *     if (pid == 0) { ...; _exit(0); }
 *     dt_test_kill(pid, SIGKILL);                 // refuses pid <= 0
 *     dt_test_waitpid(pid, &status, 0);           // refuses pid <= 0
 *
 * A failed fork/forkpty prints why and marks the running test as unable to
 * run: if that test then fails, RUN() reports it skipped (exit 77), since it
 * could not create what it needs; a test that passes anyway stays passed.
 * dt_test_kill/dt_test_killpg/dt_test_waitpid refuse a pid <= 0 (a process
 * group <= 1), print the refusal and return -1 with errno EINVAL, so a
 * missed check upstream can never widen into "every process". */
#ifndef DT_TEST_PROC_H
#define DT_TEST_PROC_H

#include <errno.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* Set when the running test could not fork; RUN() turns its failure into a skip. */
static int dt_test_cannot_fork_;

static inline pid_t dt_test_fork(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "cannot fork: %s\n", strerror(errno));
        dt_test_cannot_fork_ = 1;
    }
    return pid;
}

/* forkpty(3) with the same check; *master is -1 on failure. A chroot or a
 * minimal container without /dev/pts is where this fails. */
static inline pid_t dt_test_forkpty(int *master)
{
    fflush(NULL);
    *master = -1;
    pid_t pid = forkpty(master, NULL, NULL, NULL);
    if (pid < 0) {
        fprintf(stderr, "cannot forkpty (is /dev/pts mounted?): %s\n", strerror(errno));
        dt_test_cannot_fork_ = 1;
        *master = -1;
    }
    return pid;
}

static inline int dt_test_refuse_(const char *what, pid_t pid)
{
    fprintf(stderr, "test harness: refusing %s(%d): not a process this test made\n", what, (int)pid);
    errno = EINVAL;
    return -1;
}

/* kill(2) for one process this test made; refuses pid <= 0. */
static inline int dt_test_kill(pid_t pid, int sig)
{
    return pid <= 0 ? dt_test_refuse_("kill", pid) : kill(pid, sig);
}

/* Signal the process group pgid (a child made its own with setpgid or
 * setsid); refuses pgid <= 1. */
static inline int dt_test_killpg(pid_t pgid, int sig)
{
    return pgid <= 1 ? dt_test_refuse_("killpg", pgid) : kill(-pgid, sig);
}

/* waitpid(2) for one child; refuses pid <= 0 (any child, a group). */
static inline pid_t dt_test_waitpid(pid_t pid, int *status, int flags)
{
    return pid <= 0 ? dt_test_refuse_("waitpid", pid) : waitpid(pid, status, flags);
}

#endif /* DT_TEST_PROC_H */
