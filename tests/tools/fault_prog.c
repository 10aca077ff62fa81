/* A small distributed program with a fault injected on one rank, for the
 * fault-injection matrix (test_fault_matrix.c). Runs under `dtrain run`
 * (shm) or mpirun (mpi): creates a group, then 4 steps of a 1 MiB
 * all-reduce with a barrier between steps.
 *
 *   DT_FAULT_RANK    the victim rank
 *   DT_FAULT_POINT   rendezvous (before dt_pg_init, while the others wait in
 *                    it), collective (step 2: post the all-reduce, then fault
 *                    while it is in flight), between (after step 1's barrier)
 *   DT_FAULT_ACTION  kill (SIGKILL itself), stop (SIGSTOP itself), exit
 *                    (exit(3) without freeing the group)
 *   DT_FAULT_DIR     each rank writes DIR/rank<R> = "<pid> <job id>"
 *
 * A rank that gets an error prints "fault_prog rank R: <message>" and exits 1. */
#include "dtrain/dtrain.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int g_rank = -1;

static void fault(const char *action)
{
    fprintf(stderr, "fault_prog rank %d: injecting %s\n", g_rank, action);
    fflush(stderr);
    if (!strcmp(action, "kill"))
        raise(SIGKILL);
    else if (!strcmp(action, "stop"))
        raise(SIGSTOP);
    else
        _exit(3);
}

static int fail(const char *what)
{
    fprintf(stderr, "fault_prog rank %d: %s: %s\n", g_rank, what, dt_last_error());
    return 1;
}

int main(void)
{
    int64_t r = -1, victim = -1;
    if (dt_env_int("DT_RANK", -1, 0, 1 << 20, &r) < 0 || (r < 0 && dt_env_int("OMPI_COMM_WORLD_RANK", -1, 0, 1 << 20, &r) < 0) ||
        dt_env_int("DT_FAULT_RANK", -1, -1, 1 << 20, &victim) < 0) {
        fprintf(stderr, "fault_prog: %s\n", dt_last_error());
        return 2;
    }
    g_rank = (int)r;
    const char *point = getenv("DT_FAULT_POINT") ? getenv("DT_FAULT_POINT") : "";
    const char *action = getenv("DT_FAULT_ACTION") ? getenv("DT_FAULT_ACTION") : "exit";
    const char *dir = getenv("DT_FAULT_DIR");
    if (dir) {
        char path[512];
        snprintf(path, sizeof path, "%s/rank%d", dir, g_rank);
        FILE *f = fopen(path, "w");
        if (f) {
            const char *job = getenv("DT_JOB_ID");
            fprintf(f, "%d %s\n", (int)getpid(), job && *job ? job : "-");
            fclose(f);
        }
    }
    int me = g_rank == victim;
    if (me && !strcmp(point, "rendezvous"))
        fault(action);
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0)
        return fail("dt_pg_init");
    enum { N = 1 << 18 };
    float *x = malloc(N * sizeof *x);
    if (!x)
        return 1;
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < N; i++)
            x[i] = (float)(g_rank + 1);
        if (me && step == 2 && !strcmp(point, "collective")) {
            dt_req *rq;
            if (dt_pg_allreduce_async(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM, &rq) < 0)
                return fail("allreduce");
            fault(action);
        }
        if (dt_pg_allreduce(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM) < 0)
            return fail("allreduce");
        if (dt_pg_barrier(pg) < 0)
            return fail("barrier");
        if (me && step == 1 && !strcmp(point, "between"))
            fault(action);
    }
    free(x);
    dt_pg_free(pg);
    return 0;
}
