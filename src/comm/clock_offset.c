/* dt_pg_clock_offset (comm.h): how far this rank's monotonic clock is from
 * rank 0's, measured through the group.
 *
 * Each of a few rounds is a barrier and then every rank reads its clock;
 * the readings are gathered (a sum of vectors that are zero but for each
 * rank's own entry). Leaving a barrier happens at nearly the same moment
 * everywhere (within its latency), so reading_r - reading_0 estimates the
 * offset; the median over the rounds drops a round where a rank was
 * descheduled. On one machine the monotonic clock is shared and the offset
 * comes out near 0. */
#include "dtrain/comm.h"

#include <stdlib.h>
#include <string.h>

#define ROUNDS 5

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

dt_status dt_pg_clock_offset(dt_pg *pg, double *offset_us, double *base_us)
{
    if (!pg || !offset_us || !base_us)
        return dt_error(DT_ERR_NULL, "dt_pg_clock_offset: an argument is NULL");
    int W = dt_pg_size(pg), r = dt_pg_rank(pg);
    double *v = calloc((size_t)W, sizeof *v), d[ROUNDS];
    if (!v)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pg_clock_offset: %d ranks", W);
    dt_status st = DT_OK;
    for (int k = 0; k < ROUNDS && st >= 0; k++) {
        if ((st = dt_pg_barrier(pg)) < 0)
            break;
        memset(v, 0, (size_t)W * sizeof *v);
        v[r] = (double)dt_time_ns() * 1e-3;
        if ((st = dt_pg_allreduce(pg, DT_IN_PLACE, v, (size_t)W, DT_F64, DT_REDUCE_SUM)) < 0)
            break;
        d[k] = v[r] - v[0];
        if (k == 0)
            *base_us = v[0];
    }
    free(v);
    if (st < 0)
        return dt_error_wrap(st, "dt_pg_clock_offset: measuring the clocks");
    qsort(d, ROUNDS, sizeof *d, cmp_d);
    *offset_us = d[ROUNDS / 2];
    return DT_OK;
}
