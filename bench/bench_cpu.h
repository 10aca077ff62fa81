/* bench_cpu.h — the CPU clock and median the one-process bench programs
 * share (header-only: each bench is a single source file). */
#ifndef DT_BENCH_CPU_H
#define DT_BENCH_CPU_H

#include <stdlib.h>
#include <time.h>

/* CPU time of this process (every thread), s. */
static inline double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n) (n > 0); sorts v. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
