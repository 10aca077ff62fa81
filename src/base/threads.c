/* Threads and the machine's cores: the compute-thread count shared by every
 * OpenMP kernel, the cores a process may run on and a rank's share, the
 * machine's load (OpenMP's waiting choice), and a yield for waiting loops
 * that stops once it gave the core away for a time slice. */
#include "dtrain/base.h"

#include "base/cpu_cached.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Set by the application's thread, read by every thread that runs a kernel
 * (the loader's, a progress thread reducing): an atomic, relaxed, as it
 * publishes nothing else. */
static _Atomic int g_threads;

void dt_set_num_threads(int n)
{
    atomic_store_explicit(&g_threads, n > 0 ? n : 0, memory_order_relaxed);
#ifdef _OPENMP
    omp_set_num_threads(dt_get_num_threads());
#endif
}

int dt_get_num_threads(void)
{
    int n_set = atomic_load_explicit(&g_threads, memory_order_relaxed);
    if (n_set > 0)
        return n_set;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e && atoi(e) > 0)
        return atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dt_cpu_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dt_threads_per_rank(int ranks)
{
    int t = ranks > 0 ? dt_cpu_cores() / ranks : 1;
    return t > 1 ? t : 1;
}

/* /proc/loadavg: "0.96 1.77 2.58 3/612 12345" (the fourth field: runnable
 * scheduling entities now, the reader included / all of them). */
static int read_loadavg(double *load1, int *running)
{
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f)
        return -1;
    double l5, l15;
    long run, total;
    int n = fscanf(f, "%lf %lf %lf %ld/%ld", load1, &l5, &l15, &run, &total);
    fclose(f);
    if (n != 5 || !(*load1 >= 0) || !isfinite(*load1) || run < 1 || run > (1 << 24))
        return -1;
    *running = (int)(run - 1);
    return 0;
}

#define DT_YIELD_SLOW_S 1e-3
#define DT_YIELD_OFF_S 0.1

int dt__cpu_yield(double *off_until)
{
    double t0 = dt_time_s();
    if (t0 < *off_until)
        return 0;
    sched_yield();
    double t1 = dt_time_s();
    if (t1 - t0 > DT_YIELD_SLOW_S)
        *off_until = t1 + DT_YIELD_OFF_S;
    return 1;
}

dt_status dt_cpu_load_read(double *load1, int *running)
{
    if (!load1 || !running)
        return dt_error(DT_ERR_NULL, "dt_cpu_load_read: null output");
    *load1 = -1;
    *running = -1;
    const char *e = getenv("DT_LOADAVG");
    if (e && *e) {
        char l[64];
        const char *comma = strchr(e, ',');
        size_t n = comma ? (size_t)(comma - e) : strlen(e);
        if (n >= sizeof l)
            return dt_error(DT_ERR_INVALID_ARG, "environment variable DT_LOADAVG: too long (\"L\" or \"L,R\")");
        memcpy(l, e, n);
        l[n] = 0;
        double load;
        int64_t r;
        if (dt_parse_double("environment variable DT_LOADAVG (the load)", l, 0, 1e6, &load) < 0)
            return dt_last_status();
        if (comma) {
            if (dt_parse_int("environment variable DT_LOADAVG (the runnable tasks after the comma)", comma + 1, 0,
                             1 << 24, &r) < 0)
                return dt_last_status();
        } else {
            r = (int64_t)floor(load);
        }
        *load1 = load;
        *running = (int)r;
        return DT_OK;
    }
    double load = -1;
    int run = -1;
    if (read_loadavg(&load, &run) < 0)
        return dt_error(DT_ERR_IO, "/proc/loadavg: cannot read the load average (no /proc?)");
    *load1 = load;
    *running = run;
    return DT_OK;
}

bool dt_omp_wait_passive(double load1, int running, int cores, int threads)
{
    if (!(load1 >= 0))
        return true;
    double busy = running >= 0 && running < load1 ? (double)running : load1;
    if (cores < 1)
        cores = 1;
    if (threads < 1)
        threads = 1;
    return busy > (double)cores - (double)threads + 0.5;
}

/* The waiting choice over a short window. One reading of the runnable
 * count is one instant: a shell, a kernel thread or the ssh session that
 * started us is runnable at that instant on an idle machine, and the old
 * rule (the largest of three readings 1 ms apart) then chose passive
 * waiting and cost an idle 2-core machine ~25% of the ConvNet step. So:
 * when the 1-minute load alone says the cores are free, spin at once (one
 * reading, no wait); else take readings DT_OMP_SAMPLE_GAP_NS apart until
 * DT_OMP_SAMPLES / 2 + 1 of them agree (at most DT_OMP_SAMPLES readings,
 * ~40 ms) and decide on their median: busy now means busy at most of the
 * instants, not at one. */
#define DT_OMP_SAMPLES 9
#define DT_OMP_SAMPLE_GAP_NS 5000000L

static dt_status proc_sample(void *ud, double *load1, int *running)
{
    (void)ud;
    return dt_cpu_load_read(load1, running);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

bool dt_omp_wait_choose(int cores, int threads, dt_load_sample_fn sample, void *ud, dt_omp_wait_reading *out)
{
    dt_omp_wait_reading r = {.load1 = -1, .running = -1, .readings = 0};
    /* the default reads /proc/loadavg, DT_LOADAVG (a fixed reading) once */
    const char *env = getenv("DT_LOADAVG");
    const bool fixed = !sample && env && *env;
    const bool paced = !sample;
    if (!sample)
        sample = proc_sample;
    int runs[DT_OMP_SAMPLES], nrun = 0, busy = 0, free_ = 0;
    double load = -1;
    int running = -1;
    bool passive = true;
    if (sample(ud, &load, &running) < 0 || !(load >= 0)) { /* unknown: passive, which never collapses */
        r.readings = 1;
        goto done;
    }
    r.load1 = load;
    r.running = running;
    r.readings = 1;
    if (fixed || running < 0 || !dt_omp_wait_passive(load, -1, cores, threads)) {
        passive = dt_omp_wait_passive(load, running, cores, threads); /* the load decides, or one reading is all */
        goto done;
    }
    for (int k = 0;; k++) {
        if (running >= 0) {
            runs[nrun++] = running;
            if (dt_omp_wait_passive(load, running, cores, threads))
                busy++;
            else
                free_++;
        }
        if (busy > DT_OMP_SAMPLES / 2 || free_ > DT_OMP_SAMPLES / 2 || k + 1 >= DT_OMP_SAMPLES)
            break;
        if (paced)
            nanosleep(&(struct timespec){.tv_nsec = DT_OMP_SAMPLE_GAP_NS}, NULL);
        double l2;
        if (sample(ud, &l2, &running) < 0)
            running = -1; /* an unreadable instant counts for nothing */
        r.readings++;
    }
    qsort(runs, (size_t)nrun, sizeof *runs, cmp_int);
    r.running = nrun ? runs[(nrun - 1) / 2] : -1; /* the lower median */
    passive = dt_omp_wait_passive(load, r.running, cores, threads);
done:
    if (out)
        *out = r;
    return passive;
}
