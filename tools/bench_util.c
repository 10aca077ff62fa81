/* Helpers shared by the bench suites. */
#include "cmd.h"

#include <stdlib.h>
#include <sys/resource.h>

int dt__bench_int(const char *who, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out)
{
    if (dt_parse_int(flag, v, lo, hi, out) < 0) {
        dt__cli_err("%s: %s\n", who, dt_last_error());
        return 2;
    }
    return 0;
}

int dt__bench_double(const char *who, const char *flag, const char *v, double lo, double hi, double *out)
{
    if (dt_parse_double(flag, v, lo, hi, out) < 0) {
        dt__cli_err("%s: %s\n", who, dt_last_error());
        return 2;
    }
    return 0;
}

double dt__bench_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dt__bench_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
