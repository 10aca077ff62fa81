/* Monotonic clocks. */
#define _POSIX_C_SOURCE 200809L
#include "dtrain/base.h"

#include <time.h>

uint64_t dt_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dt_time_s(void) { return (double)dt_time_ns() * 1e-9; }
