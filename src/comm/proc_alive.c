/* Whether a peer process on this machine has ended (see proc_alive.h). */
#include "comm/proc_alive.h"
#include "dtrain/base.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The process's state letter and start time from /proc/PID/stat (0 when
 * unreadable: no such process, or no /proc). */
static int read_stat(int32_t pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
    if (!p || p[1] != ' ')
        return 0;
    *state = p[2];
    /* fields after the state: ppid(4) ... starttime is field 22 */
    unsigned long long st = 0;
    int field = 3;
    for (const char *q = p + 2; *q && field < 22; q++)
        if (*q == ' ' && ++field == 22)
            sscanf(q + 1, "%llu", &st);
    *start = st;
    return 1;
}

void dt__proc_id_self(dt__proc_id *me)
{
    memset(me, 0, sizeof *me);
    me->pid = (int32_t)getpid();
    char key[512] = "";
    size_t k = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        k = fread(key, 1, 64, f);
        fclose(f);
    }
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) == 0)
        k += (size_t)snprintf(key + k, sizeof key - k, "|%llu:%llu", (unsigned long long)ns.st_dev,
                              (unsigned long long)ns.st_ino);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    k += (size_t)snprintf(key + k, sizeof key - k, "|%s", host);
    char state;
    uint64_t start = 0;
    /* without /proc (no boot id, no namespace, no start time) no peer is
     * judged: a pid alone could name a process of another machine */
    if (read_stat(me->pid, &state, &start) && start) {
        me->start = start;
        me->host = dt_hash64(key, k, 0x616c6976) | 1;
    }
}

int dt__proc_id_local(const dt__proc_id *me, const dt__proc_id *p)
{
    return me->host && p->host == me->host && p->pid > 0 && p->pid != me->pid;
}

int dt__proc_gone(const dt__proc_id *me, const dt__proc_id *p, int *pidfd)
{
    if (!dt__proc_id_local(me, p))
        return 0;
    char state = 0;
    uint64_t start = 0;
    if (*pidfd == -2) { /* first look: a pidfd for the process that is the rank (start time checked) */
        *pidfd = -1;
#ifdef SYS_pidfd_open
        long fd = syscall(SYS_pidfd_open, (pid_t)p->pid, 0);
        if (fd >= 0) {
            if (read_stat(p->pid, &state, &start) && start == p->start)
                *pidfd = (int)fd;
            else
                close((int)fd);
        }
#endif
    }
    if (*pidfd >= 0) {
        struct pollfd pf = {.fd = *pidfd, .events = POLLIN};
        return poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP | POLLERR));
    }
    if (!read_stat(p->pid, &state, &start))
        return 1;
    return state == 'Z' || state == 'X' || start != p->start;
}

void dt__proc_id_close(int *pidfd)
{
    if (*pidfd >= 0)
        close(*pidfd);
    *pidfd = -2;
}
