/* `dtrain train` stopped by SIGINT/SIGTERM while its process group waits
 * for the other ranks (the start-up): it exits 130 at once, naming the
 * ranks it was waiting for, instead of waiting the start-up bound out
 * (DT_INIT_TIMEOUT, 300 s by default; 120 s here, so the old behaviour is a
 * failure of this test, not a hang). Rank 0 of the TCP rendezvous
 * (MASTER_ADDR/MASTER_PORT) with rank 1 never started; rank 1 connected to a
 * rank 0 that never answers (this test plays it); rank 0 of a DT_JOB_ID
 * job, whose shared segment must be gone afterwards. */
// dt-test-timeout: 300
#include "test.h"
#include "tools/train_cli.h"
#include "comm/shm/shm.h" /* dt__shm_segment_name */

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&ts, NULL);
}

/* A TCP port on 127.0.0.1 that was free a moment ago; 0 if none. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* `dtrain train` (a small MLP) with env (NULL-terminated "K=V") added, stderr to err. */
static pid_t start(char *const *env, const char *err)
{
    pid_t pid = dt_test_fork();
    if (pid == 0) {
        int fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644), fo = open("/dev/null", O_WRONLY);
        dup2(fe, 2);
        dup2(fo, 1);
        for (int i = 0; env[i]; i++)
            putenv(env[i]);
        const char *cli = getenv("DT_CLI");
        execl(cli, cli, "train", "--model", "mlp", "--mlp-hidden", "8", "--data", "random", "--random-items", "64",
              "--batch", "8", "--epochs", "1", "--threads", "1", "--progress", "none", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Signal pid, then wait at most 60 s for it (a hang bound, far below the
 * 120 s start-up bound; SIGKILL after it). Its wait status, or -1. */
static int stop_and_wait(pid_t pid, int sig)
{
    if (dt_test_kill(pid, sig) < 0)
        return -1;
    int status = -1;
    for (int i = 0; i < 600; i++) {
        if (dt_test_waitpid(pid, &status, WNOHANG) == pid)
            return status;
        sleep_ms(100);
    }
    dt_test_kill(pid, SIGKILL);
    dt_test_waitpid(pid, &status, 0);
    return -1;
}

static char g_err[1 << 14];

static const char *read_err(const char *path)
{
    slurp_(path, g_err, sizeof g_err);
    return g_err;
}

/* Rank 0 of two over MASTER_PORT, rank 1 never started: ready once the port
 * accepts a connection (one that sends nothing is ignored). */
TEST(rank0_tcp_sigint)
{
    int port = free_port();
    ASSERT(port > 0);
    char ps[32], err[600];
    snprintf(ps, sizeof ps, "MASTER_PORT=%d", port);
    snprintf(err, sizeof err, "%s/r0.err", cli_tmpdir());
    char *env[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", ps, "DT_INIT_TIMEOUT=120", NULL};
    pid_t pid = start(env, err);
    ASSERT(pid > 0);
    bool up = false;
    for (int i = 0; i < 600 && !up; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        up = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (fd >= 0)
            close(fd);
        if (!up)
            sleep_ms(100);
    }
    int st = stop_and_wait(pid, SIGINT);
    ASSERT(up);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 130))
        fprintf(stderr, "status %d: %s\n", st, read_err(err));
    ASSERT(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 130);
    ASSERT_STR_CONTAINS(read_err(err), "interrupted by signal 2 during start-up");
    ASSERT_STR_CONTAINS(read_err(err), "interrupted while waiting for rank 1 to connect");
}

/* Rank 1 of two whose rank 0 (this test) takes its hello and never answers. */
TEST(rank1_tcp_sigterm)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    ASSERT(lfd >= 0);
    ASSERT(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
    ASSERT(getsockname(lfd, (struct sockaddr *)&sa, &len) == 0);
    char ps[32], err[600];
    snprintf(ps, sizeof ps, "MASTER_PORT=%d", ntohs(sa.sin_port));
    snprintf(err, sizeof err, "%s/r1.err", cli_tmpdir());
    char *env[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", ps, "DT_INIT_TIMEOUT=120", NULL};
    pid_t pid = start(env, err);
    ASSERT(pid > 0);
    struct timeval tv = {60, 0};
    setsockopt(lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int c = accept(lfd, NULL, NULL);
    char hello[64];
    bool got = c >= 0 && (setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 1) &&
               recv(c, hello, sizeof hello, MSG_WAITALL) == (ssize_t)sizeof hello;
    int st = stop_and_wait(pid, SIGTERM);
    if (c >= 0)
        close(c);
    close(lfd);
    ASSERT(got);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 130))
        fprintf(stderr, "status %d: %s\n", st, read_err(err));
    ASSERT(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 130);
    ASSERT_STR_CONTAINS(read_err(err), "interrupted by signal 15 during start-up");
    ASSERT_STR_CONTAINS(read_err(err), "rank 1: interrupted while waiting for rank 0");
}

/* Rank 0 of a DT_JOB_ID job of two: ready once its segment exists; after
 * SIGINT the segment is gone. */
TEST(rank0_job_id_sigint)
{
    char job[64], jobenv[96], seg[64], path[128], err[600];
    snprintf(job, sizeof job, "startint-%d", (int)getpid());
    snprintf(jobenv, sizeof jobenv, "DT_JOB_ID=%s", job);
    dt__shm_segment_name(job, seg, sizeof seg);
    snprintf(path, sizeof path, "/dev/shm%s", seg);
    snprintf(err, sizeof err, "%s/job.err", cli_tmpdir());
    char *env[] = {jobenv, "RANK=0", "WORLD_SIZE=2", "DT_INIT_TIMEOUT=120", NULL};
    pid_t pid = start(env, err);
    ASSERT(pid > 0);
    bool up = false;
    for (int i = 0; i < 600 && !(up = access(path, F_OK) == 0); i++)
        sleep_ms(100);
    int st = stop_and_wait(pid, SIGINT);
    ASSERT(up);
    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 130))
        fprintf(stderr, "status %d: %s\n", st, read_err(err));
    ASSERT(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 130);
    ASSERT_STR_CONTAINS(read_err(err), "interrupted while waiting for rank 1 to join");
    ASSERT(access(path, F_OK) != 0);
}

int main(void)
{
    if (!getenv("DT_CLI"))
        return DT_TEST_SKIP_CODE;
    RUN(rank0_tcp_sigint);
    RUN(rank1_tcp_sigterm);
    RUN(rank0_job_id_sigint);
    cli_cleanup();
    return TEST_REPORT();
}
