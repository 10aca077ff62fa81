/* The fault-injection matrix: real processes, both backends. fault_prog
 * (two ranks) is started by `dtrain run -n 2` (shm) and by mpirun -np 2
 * (mpi), and rank 1 (rank 0 in one case) is killed with SIGKILL, stopped
 * with SIGSTOP past the timeout, or exits early, during the rendezvous, in
 * the middle of a collective and between steps. Every run must end:
 *   - with a nonzero exit status and a message naming the faulty rank
 *     (the launcher's or the surviving rank's);
 *   - within the promised time: DT_COMM_TIMEOUT (3 s) + 5 s, plus start-up;
 *   - with no rank process left running 5 s after the job ended (a stopped
 *     rank included);
 *   - with no shared-memory segment of the job left in /dev/shm.
 * The mpi column is skipped (reported) when MPI was not found. */
// dt-test-timeout: 400
#include "test.h"
#include "tmp_util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void dt__shm_segment_name(const char *job_id, char *buf, size_t n);

#define TIMEOUT_S 3
/* The promise is timeout + 5 s after the fault; start-up and a loaded CI
 * machine get a few seconds on top. */
#define LIMIT_S (TIMEOUT_S + 5 + 6)
/* Under mpirun the survivor prints its error within the same time (timeout
 * + 1 s, then MPI_Abort), but the job ends only when mpirun has killed the
 * stopped rank; in a fresh debootstrapped root that took 14-19 s (seen in
 * make fresh-check). The job-end bound for mpi is wider by that; the
 * message check below is unchanged. */
#define LIMIT_MPI_S (LIMIT_S + 10)
/* How long a rank may outlive the job's end while its kill is delivered. */
#define GRACE_S 5

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void slurp(const char *path, char *buf, size_t n)
{
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = 0;
    fclose(f);
}

/* A process that exists and is not a zombie. */
static int alive(pid_t pid)
{
    char path[64], st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    slurp(path, st, sizeof st);
    if (!st[0])
        return 0;
    const char *p = strrchr(st, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

typedef struct {
    const char *backend; /* "shm" or "mpi" */
    const char *point, *action;
    int victim;
} fcase;

static int run_case(const fcase *c)
{
    char dir[256], out[300];
    if (!t_mkdtemp("fault", dir, sizeof dir))
        return fprintf(stderr, "mkdtemp failed\n"), 0;
    snprintf(out, sizeof out, "%s/out", dir);
    char prog[512];
    snprintf(prog, sizeof prog, "%s/tests/fault_prog", DT_BINARY_DIR);
    char victim[16];
    snprintf(victim, sizeof victim, "%d", c->victim);
    double t0 = now_s();
    pid_t pid = dt_test_fork();
    if (pid < 0)
        return 0;
    if (pid == 0) {
        setpgid(0, 0);
        setenv("DT_FAULT_RANK", victim, 1);
        setenv("DT_FAULT_POINT", c->point, 1);
        setenv("DT_FAULT_ACTION", c->action, 1);
        setenv("DT_FAULT_DIR", dir, 1);
        setenv("DT_COMM_TIMEOUT", "3", 1);
        setenv("OMP_NUM_THREADS", "1", 1);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        if (!strcmp(c->backend, "shm")) {
            setenv("DT_BACKEND", "shm", 1);
            const char *cli = getenv("DT_CLI");
            execl(cli, cli, "run", "-n", "2", "--grace", "1", "--", prog, (char *)NULL);
        }
#ifdef DT_MPIEXEC
        setenv("DT_BACKEND", "mpi", 1);
        execl(DT_MPIEXEC, DT_MPIEXEC, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
              "-np", "2", prog, (char *)NULL);
#endif
        _exit(127);
    }
    int status = 0, done = 0;
    double elapsed = 0;
    while (!done) {
        pid_t w = dt_test_waitpid(pid, &status, WNOHANG);
        elapsed = now_s() - t0;
        if (w == pid)
            done = 1;
        else if (elapsed > 60) {
            dt_test_killpg(pid, SIGKILL);
            dt_test_waitpid(pid, &status, 0);
            break;
        } else
            usleep(20000);
    }
    char text[16384];
    slurp(out, text, sizeof text);
    int ok = 1;
    char why[256] = "";
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (!done)
        ok = 0, snprintf(why, sizeof why, "the launcher did not end within 60 s");
    else if (code == 0)
        ok = 0, snprintf(why, sizeof why, "exit status 0 after a fault");
    else if (elapsed > (!strcmp(c->backend, "mpi") ? LIMIT_MPI_S : LIMIT_S))
        ok = 0, snprintf(why, sizeof why, "took %.1f s (limit %d s)", elapsed,
                         !strcmp(c->backend, "mpi") ? LIMIT_MPI_S : LIMIT_S);
    char want[32], ompi[32];
    snprintf(want, sizeof want, "rank %d", c->victim);
    snprintf(ompi, sizeof ompi, ",1],%d]", c->victim); /* Open MPI's "Process name: [[job,1],R]" */
    /* The message must name the faulty rank, other than in its own
     * "injecting" line. Under MPI a rank that stopped is named by the flight
     * recorder as the peer that did not answer the survivor's query. */
    char fr[64];
    snprintf(fr, sizeof fr, "flight recorder: rank %d did not answer", c->victim);
    int named = strstr(text, ompi) != NULL ||
                (!strcmp(c->backend, "mpi") && !strcmp(c->action, "stop") && strstr(text, fr));
    /* A rank killed before MPI_Init is reported by mpirun alone (the other
     * rank is still inside MPI_Init and is killed there, with nothing to
     * say). Open MPI normally adds "mpirun noticed that process rank 0 ...
     * exited on signal 9", but under load it sometimes prints only its
     * "1 process returned a non-zero exit code" banner and exits with
     * 128 + 9 (seen in 2 of 6 runs started together): then that status is
     * all there is to name the fault, and it is checked exactly. The same
     * banner alone was seen for a victim that exits (status 3, which only
     * the victim uses; the survivor exits 1) under load in a full ctest. */
    const int victim_code = !strcmp(c->action, "kill") ? 128 + SIGKILL : !strcmp(c->action, "exit") ? 3 : -1;
    if (!strcmp(c->backend, "mpi") && !strcmp(c->point, "rendezvous") && code == victim_code &&
        strstr(text, "1 process returned\na non-zero exit code"))
        named = 1;
    for (const char *p = text; (p = strstr(p, want)) != NULL; p++) {
        const char *ls = p;
        while (ls > text && ls[-1] != '\n')
            ls--;
        const char *le = strchr(p, '\n');
        size_t n = le ? (size_t)(le - ls) : strlen(ls);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line - 1 ? n : sizeof line - 1), ls);
        if (!strstr(line, "injecting"))
            named = 1;
    }
    if (ok && !named)
        ok = 0, snprintf(why, sizeof why, "no message names %s", want);
    /* No process left, no segment left. */
    for (int r = 0; r < 2; r++) {
        char pf[320], line[256];
        snprintf(pf, sizeof pf, "%s/rank%d", dir, r);
        slurp(pf, line, sizeof line);
        int rp = 0;
        char job[200] = "-";
        if (sscanf(line, "%d %199s", &rp, job) < 1)
            continue; /* the victim may die before writing (it does not here) */
        /* mpirun may return while its daemon is still delivering the kill
         * to the other rank (seen under load: "still running" right after
         * the job ended, gone a moment later): a rank counts as left
         * running only if it outlives the job by GRACE_S. */
        for (double g0 = now_s(); rp > 0 && alive(rp) && now_s() - g0 < GRACE_S;)
            usleep(20000);
        if (rp > 0 && alive(rp)) {
            if (ok)
                snprintf(why, sizeof why, "rank %d (pid %d) is still running", r, rp);
            ok = 0;
            dt_test_kill(rp, SIGKILL);
        }
        if (strcmp(job, "-")) {
            char name[128], path[160];
            dt__shm_segment_name(job, name, sizeof name);
            snprintf(path, sizeof path, "/dev/shm%s", name);
            if (access(path, F_OK) == 0) {
                if (ok)
                    snprintf(why, sizeof why, "segment %s left behind", path);
                ok = 0;
                unlink(path);
            }
        }
        unlink(pf);
    }
    fprintf(stderr, "  %s %-10s %-4s victim %d: exit %d after %.1f s%s%s\n", c->backend, c->point,
            c->action, c->victim, code, elapsed, ok ? "" : " -- FAIL: ", why);
    if (!ok)
        fprintf(stderr, "----- output -----\n%s------------------\n", text);
    unlink(out);
    rmdir(dir);
    return ok;
}

static const char *k_points[] = {"rendezvous", "collective", "between"};
static const char *k_actions[] = {"kill", "stop", "exit"};

static void matrix(const char *backend)
{
    int bad = 0;
    for (size_t p = 0; p < 3; p++)
        for (size_t a = 0; a < 3; a++) {
            fcase c = {backend, k_points[p], k_actions[a], 1};
            /* Known gap, left out: under mpirun a rank stopped before
             * MPI_Init leaves the others blocked inside MPI_Init_thread,
             * which has no timeout (Open MPI's start-up fence). */
            if (!strcmp(backend, "mpi") && p == 0 && a == 1)
                continue;
            bad += !run_case(&c);
        }
    /* rank 0 hosts the rendezvous */
    fcase c0 = {backend, "rendezvous", "kill", 0};
    bad += !run_case(&c0);
    fcase c1 = {backend, "collective", "stop", 0};
    bad += !run_case(&c1);
    ASSERT_EQ_INT(bad, 0);
}

TEST(shm_under_dtrain_run) { matrix("shm"); }

TEST(mpi_under_mpirun)
{
#ifdef DT_MPIEXEC
    matrix("mpi");
#else
    DT_TEST_SKIP_NEED("mpi", "MPI was not found at configure time");
#endif
}

int main(void)
{
    if (!getenv("DT_CLI")) {
        fprintf(stderr, "DT_CLI is not set\n");
        return 1;
    }
    RUN(shm_under_dtrain_run);
    RUN(mpi_under_mpirun);
    return TEST_REPORT();
}
