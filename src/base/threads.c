/* Compute-thread count shared by every OpenMP kernel. */
#include "dtrain/base.h"

#include <stdatomic.h>
#include <stdlib.h>
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
