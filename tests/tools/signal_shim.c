/* signal_shim.so — an LD_PRELOAD shim for tests/tools/test_proc_safety.c.
 *
 * Loaded into a test program, it makes process creation fail on request and
 * stands between the program and every signal it sends:
 *   DT_SHIM_FAIL_FORKPTY=1   forkpty() fails with ENOENT (no /dev/pts)
 *   DT_SHIM_FAIL_FORK=1      fork() fails with EAGAIN
 *   DT_SHIM_LOG=FILE         one line per kill()/killpg(): "sent PID SIG" or
 *                            "REFUSED PID SIG" for a target outside the tree
 *                            of processes rooted at the first process that
 *                            loaded the shim (DT_SHIM_ROOT, set on load;
 *                            that process logs "loaded PID").
 * A refused signal is not sent: with the shim in place even a test that
 * would kill(-1, SIGKILL) as root harms nothing, and the log shows it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* the build hides symbols by default; these must interpose */
#define SHIM_API __attribute__((visibility("default")))

static pid_t shim_root(void)
{
    const char *r = getenv("DT_SHIM_ROOT");
    return r ? (pid_t)atoi(r) : 0;
}

static void shim_log(const char *fmt, ...);

__attribute__((constructor)) static void shim_init(void)
{
    if (!getenv("DT_SHIM_ROOT")) {
        char b[32];
        snprintf(b, sizeof b, "%d", (int)getpid());
        setenv("DT_SHIM_ROOT", b, 1);
        shim_log("loaded %d\n", (int)getpid());
    }
}

static void shim_log(const char *fmt, ...)
{
    const char *path = getenv("DT_SHIM_LOG");
    if (!path)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (n > 0 && write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0)
        n = 0;
    close(fd);
}

/* The parent of pid from /proc, or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    int ppid;
    if (!p || sscanf(p + 1, " %*c %d", &ppid) != 1)
        return -1;
    return (pid_t)ppid;
}

/* pid is the root or one of its descendants. */
static int in_tree(pid_t pid)
{
    pid_t root = shim_root();
    for (int depth = 0; pid > 1 && depth < 64; depth++) {
        if (pid == root)
            return 1;
        pid = parent_of(pid);
    }
    return 0;
}

SHIM_API int kill(pid_t pid, int sig)
{
    static int (*real)(pid_t, int);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "kill"); /* POSIX: dlsym returns functions this way */
    /* a process group (-pid) counts as inside when its leader is */
    int inside = pid > 0 ? in_tree(pid) : pid < -1 ? in_tree(-pid) : 0;
    if (!inside) {
        shim_log("REFUSED %d %d\n", (int)pid, sig);
        errno = EPERM;
        return -1;
    }
    shim_log("sent %d %d\n", (int)pid, sig);
    return real(pid, sig);
}

SHIM_API int killpg(pid_t pgrp, int sig)
{
    return kill(pgrp > 0 ? -pgrp : pgrp == 0 ? 0 : -1, sig);
}

SHIM_API pid_t fork(void)
{
    static pid_t (*real)(void);
    if (getenv("DT_SHIM_FAIL_FORK")) {
        errno = EAGAIN;
        return -1;
    }
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "fork");
    return real();
}

SHIM_API pid_t forkpty(int *amaster, char *name, const struct termios *termp, const struct winsize *winp)
{
    static pid_t (*real)(int *, char *, const struct termios *, const struct winsize *);
    if (getenv("DT_SHIM_FAIL_FORKPTY")) {
        errno = ENOENT;
        return -1;
    }
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "forkpty");
    return real(amaster, name, termp, winp);
}
