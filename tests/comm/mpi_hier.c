/* Hierarchical all-reduce under mpirun: the group from Open MPI's
 * environment (the `mpi` backend), its hierarchical form compared with the
 * flat all-reduce (tests/comm/hier_check.h). Run by tests/comm/tests.cmake
 * with simulated nodes (DT_SIM_LOCAL_SIZE) under a plain `mpirun -np 4`,
 * and on the test bed of scripts/netbed.sh (tests/comm/netbed_test.sh),
 * where the nodes are network namespaces and must be detected as such:
 * DT_EXPECT_NODES and DT_EXPECT_PER_NODE give the topology to expect,
 * DT_HC_QUICK=1 runs the shorter list of cases (hier_check.h).
 * Rank 0 prints one summary line; the exit code is non-zero on any failure
 * (mpirun returns it). */
#include "comm/hier_check.h"

#include <stdlib.h>

static int env_count(const char *name)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : 0;
}

int main(void)
{
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "mpi_hier: %s\n", dt_last_error());
        return 1;
    }
    int nodes = env_count("DT_EXPECT_NODES"), per = env_count("DT_EXPECT_PER_NODE");
    int fails = hc_run(pg, nodes, per, env_count("DT_HC_QUICK"));
    int64_t total = fails;
    if (dt_pg_allreduce(pg, DT_IN_PLACE, &total, 1, DT_I64, DT_REDUCE_SUM) < 0)
        total = -1;
    if (dt_pg_rank(pg) == 0)
        printf("mpi_hier: %d ranks, backend %s, %s: %s (%lld failures)\n", dt_pg_size(pg),
               dt_pg_backend(pg), getenv("DT_SIM_LOCAL_SIZE") ? "simulated nodes" : "detected nodes",
               total == 0 ? "ok" : "FAILED", (long long)total);
    dt_pg_free(pg);
    return total == 0 ? 0 : 1;
}
