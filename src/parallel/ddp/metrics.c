/* Metrics reduction and evaluation sharding for data-parallel runs.
 *
 * Evaluation is split into contiguous ranges, one per rank, without the
 * padding a DistributedSampler adds: each item is evaluated exactly once,
 * so summed counts (correct predictions, summed losses, items) reduce to
 * exactly the single-process totals whatever the world size. */
#include "dtrain/parallel.h"

dt_status dt_metrics_allreduce(dt_pg *pg, double *vals, int n, dt_reduce_op op)
{
    if (!pg || (!vals && n > 0))
        return dt_error(DT_ERR_NULL, "dt_metrics_allreduce: %s is NULL", pg ? "vals" : "process group");
    if (n < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_metrics_allreduce: n = %d", n);
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, vals, (size_t)n, DT_F64, op);
    return st < 0 ? dt_error_wrap(st, "dt_metrics_allreduce") : DT_OK;
}

void dt_eval_shard(int64_t n, int rank, int world, int64_t *lo, int64_t *hi)
{
    if (n < 0)
        n = 0;
    if (world < 1)
        world = 1;
    if (rank < 0)
        rank = 0;
    if (rank >= world)
        rank = world - 1;
    const int64_t base = n / world, extra = n % world;
    const int64_t l = rank * base + (rank < extra ? rank : extra);
    if (lo)
        *lo = l;
    if (hi)
        *hi = l + base + (rank < extra ? 1 : 0);
}
