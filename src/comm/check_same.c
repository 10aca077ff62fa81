/* dt_pg_check_same: whether every rank of a group was given the same
 * settings, one all-reduce of a table of hashes (base/same_check.h). */
#include "comm/pg.h"

#include "base/same_check.h"

static dt_status sum_group(void *pg, double *v, int n)
{
    return dt_pg_allreduce(pg, DT_IN_PLACE, v, (size_t)n, DT_F64, DT_REDUCE_SUM);
}

dt_status dt_pg_check_same(dt_pg *pg, const char *const *names, const char *const *values, int n)
{
    if (!pg || n < 0 || (n > 0 && (!names || !values)))
        return dt_error(DT_ERR_NULL, "dt_pg_check_same: NULL argument");
    return dt__same_check(dt_pg_size(pg), dt_pg_rank(pg), names, values, n, sum_group, pg, "dt_pg_check_same");
}
