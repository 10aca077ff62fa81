/* examples/allreduce.c — the smallest distributed dtrain program.
 *
 *     dtrain run -n 4 -- build/examples/example_allreduce
 *     mpirun -np 4 build/examples/example_allreduce        (MPI builds)
 *
 * Every rank contributes rank + 1 in each element; after an average
 * all-reduce every element holds (W + 1) / 2 on every rank. The group reads
 * its rank and size from the environment the launcher set (dtrain run,
 * torchrun, mpirun, srun), so the same binary runs under any of them. */
#include <dtrain/comm.h>

#include <stdio.h>

int main(void)
{
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_pg_rank(pg), w = dt_pg_size(pg);
    enum { N = 1 << 16 };
    float *x = dt_pg_alloc(pg, N * sizeof(float)); /* shared memory: zero copy */
    if (!x) {
        fprintf(stderr, "dt_pg_alloc: %s\n", dt_last_error());
        dt_pg_free(pg);
        return 1;
    }
    for (int i = 0; i < N; i++)
        x[i] = (float)(rank + 1);
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_AVG);
    int bad = 0;
    for (int i = 0; i < N && st == DT_OK; i++)
        bad += x[i] != (float)(w + 1) / 2;
    if (st < 0)
        fprintf(stderr, "rank %d: allreduce failed: %s\n", rank, dt_last_error());
    else
        printf("rank %d of %d (backend %s): average = %g, %s\n", rank, w, dt_pg_backend(pg), x[0],
               bad ? "WRONG" : "ok");
    dt_pg_dealloc(pg, x);
    dt_pg_free(pg);
    return st < 0 || bad ? 1 : 0;
}
