/* Compute-thread count shared by every OpenMP kernel. */
#include "dtrain/base.h"

#include <stdlib.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_threads;

void dt_set_num_threads(int n)
{
    g_threads = n > 0 ? n : 0;
#ifdef _OPENMP
    omp_set_num_threads(dt_get_num_threads());
#endif
}

int dt_get_num_threads(void)
{
    if (g_threads > 0)
        return g_threads;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e && atoi(e) > 0)
        return atoi(e);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
