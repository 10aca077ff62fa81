/* tests/comm/harness.h — run a function in N forked ranks under a timeout.
 *
 *     static int body(int rank, int size, void *arg) { ...; return 0; }
 *     int codes[8];
 *     int rc = th_run(4, 10.0, body, NULL, codes);   // 0 = all ranks returned 0
 *
 * Every child gets a fresh job id (th_job), so th_pg() builds a group whose
 * shm segment no other test shares. A child that does not finish within
 * the timeout is killed: th_run returns TH_HANG and the test fails instead
 * of hanging CI. codes[r] is the child's exit status, or 128 + signal.
 * When a rank cannot be forked, the ranks already started are killed and
 * reaped and th_run returns -1 (the calling test is then reported skipped).
 *
 * Each rank computes on at most max(1, cores / N) threads unless
 * OMP_NUM_THREADS is set, as `dtrain run` gives its ranks (a body may set
 * its own with dt_set_num_threads): N ranks of all the cores' threads each
 * spin at OpenMP's barriers for the cores the others compute on (4 ranks of
 * 2 threads on 2 cores took 5x as long as 1 thread each). */
#ifndef DT_TEST_HARNESS_H
#define DT_TEST_HARNESS_H

#include "dtrain/comm.h"
#include "proc.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TH_HANG (-100)
#define TH_MAX_RANKS 64

typedef int (*th_fn)(int rank, int size, void *arg);

static char th_job[64];
static int th_rank_ = -1;
/* A page shared by the parent and all ranks of the current th_run (zeroed
 * before each run): ranks can leave timestamps there for each other. */
static volatile double *th_shared;

/* Sleep ms milliseconds (the rest of it again after a signal; any other
 * failure, a bad ms, ends the nap instead of spinning on it). */
static inline void th_nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Wait for cond, a flag another rank or process sets (in th_shared, say),
 * 1 ms naps at a time, for at most about ms milliseconds; the caller reads
 * cond again to tell which ended the wait:
 *
 *     TH_WAIT_UNTIL(th_shared[1] != 0, 5000);
 *     TH_CHECK(th_shared[1] != 0, "rank 1 never posted");
 */
#define TH_WAIT_UNTIL(cond, ms)                                                                    \
    for (long th_k_ = 0; th_k_ < (ms) && !(cond); th_k_++)                                         \
    th_nap_ms(1)

/* Print a failure from inside a rank and return 1 from the body. */
#define TH_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s: ", th_rank_, __FILE__, __LINE__,    \
                    #cond);                                                                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

#define TH_OK(expr)                                                                                \
    do {                                                                                           \
        dt_status st_ = (expr);                                                                    \
        TH_CHECK(st_ >= 0, "%s: %s", dt_status_name(st_), dt_last_error());                        \
    } while (0)

/* A group for this rank of a th_run job. backend NULL = "shm" (or "self" at size 1). */
static inline dt_status th_pg(int rank, int size, const char *backend, dt_pg **pg)
{
    dt_pg_params p = dt_pg_params_default();
    p.rank = rank;
    p.world_size = size;
    p.job_id = th_job;
    p.backend = backend ? backend : (size == 1 ? "self" : "shm");
    return dt_pg_init(&p, pg);
}

/* The threads a rank of an n-rank th_run computes on (above): the caller's
 * count, at most dt_threads_per_rank(n) unless OMP_NUM_THREADS is set. */
static inline int th_rank_threads(int n)
{
    int t = dt_get_num_threads();
    const char *omp = getenv("OMP_NUM_THREADS");
    if (omp && *omp)
        return t;
    int share = dt_threads_per_rank(n);
    return t < share ? t : share;
}

static inline int th_run(int n, double timeout_s, th_fn fn, void *arg, int *codes)
{
    static unsigned counter;
    pid_t pids[TH_MAX_RANKS];
    int local_codes[TH_MAX_RANKS];
    if (!codes)
        codes = local_codes;
    if (n > TH_MAX_RANKS)
        return -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(th_job, sizeof th_job, "test-%d-%u-%ld", (int)getpid(), counter++, (long)ts.tv_nsec);
    if (!th_shared) {
        void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        th_shared = m == MAP_FAILED ? NULL : m;
    }
    if (th_shared)
        memset((void *)th_shared, 0, 4096);
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pid_t p = dt_test_fork();
        if (p < 0) {
            for (int q = 0; q < r; q++) {
                dt_test_kill(pids[q], SIGKILL);
                dt_test_waitpid(pids[q], NULL, 0);
            }
            return -1;
        }
        if (p == 0) {
            th_rank_ = r;
            dt_set_num_threads(th_rank_threads(n));
            alarm((unsigned)(timeout_s + 5)); /* belt and braces */
            int rc = fn(r, n, arg);
            fflush(NULL);
            exit(rc);
        }
        pids[r] = p;
        codes[r] = -1;
    }
    int left = n, hang = 0;
    struct timespec t_start;
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    while (left > 0) {
        int reaped = 0;
        for (int r = 0; r < n; r++) {
            int status;
            if (codes[r] != -1 || dt_test_waitpid(pids[r], &status, WNOHANG) != pids[r])
                continue;
            codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            left--;
            reaped = 1;
        }
        if (reaped)
            continue;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - t_start.tv_sec) + (now.tv_nsec - t_start.tv_nsec) * 1e-9;
        if (el > timeout_s) {
            hang = 1;
            for (int r = 0; r < n; r++)
                if (codes[r] == -1) {
                    fprintf(stderr, "th_run: rank %d did not finish within %.1f s: killed\n", r,
                            timeout_s);
                    dt_test_kill(pids[r], SIGKILL);
                    dt_test_waitpid(pids[r], NULL, 0);
                    codes[r] = 128 + SIGKILL;
                }
            break;
        }
        th_nap_ms(2);
    }
    if (hang)
        return TH_HANG;
    for (int r = 0; r < n; r++)
        if (codes[r] != 0)
            return codes[r];
    return 0;
}

/* Number of /dev/shm entries whose name starts with prefix. */
static inline int th_shm_count(const char *prefix)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix)))
            n++;
    closedir(d);
    return n;
}

#endif /* DT_TEST_HARNESS_H */
