/* A rank killed (SIGKILL) in the middle of a collective under mpirun is
 * reported by the survivors as DT_ERR_PEER_FAILED naming it (issue 30,
 * item 6), as under `dtrain run`: MPI itself never says that a peer died
 * (its receive just never completes), so the mpi backend checks the
 * processes of the peers on its own machine while it waits.
 *
 * 3 ranks (started by tests/comm/deadrank_test.sh under mpirun); once
 * ranks 0 and 2 have left a first all-reduce, rank 1 posts a second one
 * and kills itself; ranks 0 and 2 wait in that all-reduce and must get
 * DT_ERR_PEER_FAILED naming rank 1 within
 * LIMIT_S, far under the group's timeout (DT_COMM_TIMEOUT=30 in the
 * registration; without the check the wait ends only at the timeout, with
 * DT_ERR_TIMEOUT, or when mpirun kills the job). Each survivor prints one
 * line: "mpi_deadrank: rank R ok: <the error>" or "... FAILED: ...".
 *
 * mpirun SIGTERMs every rank when one dies (and SIGKILLs them
 * odls_base_sigkill_timeout seconds later): like dtrain train, this
 * program handles SIGTERM, so that it can say what happened first. */
#include "dtrain/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/rank_check.h"

#define LIMIT_S 15.0

static volatile sig_atomic_t g_term;
static void on_term(int sig) { g_term = sig; }

int main(void)
{
    struct sigaction sa = {.sa_handler = on_term};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    dt_pg *world;
    if (dt_pg_init(NULL, &world) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(world);
    if (dt_pg_size(world) != 3 || strcmp(dt_pg_backend(world), "mpi")) {
        printf("mpi_deadrank: rank %d FAILED: needs 3 ranks on the mpi backend, got %d on %s\n", g_rank,
               dt_pg_size(world), dt_pg_backend(world));
        return 1;
    }
    float x[1024];
    for (int i = 0; i < 1024; i++)
        x[i] = (float)(g_rank + i);
    dt_status st = dt_pg_allreduce(world, DT_IN_PLACE, x, 1024, DT_F32, DT_REDUCE_SUM); /* all there */
    if (st < 0) {
        printf("mpi_deadrank: rank %d FAILED: first all-reduce: %s\n", g_rank, dt_last_error());
        return 1;
    }
    /* Rank 1 dies only once the others have left the first all-reduce: it
     * can finish it first, and a survivor still inside it would see the
     * death there (CI, under ASan: rank 0 was). The others say so by a
     * file each in DT_DEADRANK_DIR (deadrank_test.sh's directory). */
    const char *dir = getenv("DT_DEADRANK_DIR");
    char path[4096];
    if (!dir || !*dir) {
        printf("mpi_deadrank: rank %d FAILED: DT_DEADRANK_DIR is not set\n", g_rank);
        return 1;
    }
    if (g_rank != 1) {
        snprintf(path, sizeof path, "%s/left.%d", dir, g_rank);
        FILE *f = fopen(path, "w");
        if (!f || fclose(f) != 0) {
            printf("mpi_deadrank: rank %d FAILED: cannot create %s\n", g_rank, path);
            return 1;
        }
    } else {
        double w0 = dt_time_s();
        for (int r = 0; r < 3; r += 2) {
            snprintf(path, sizeof path, "%s/left.%d", dir, r);
            while (access(path, F_OK) != 0 && dt_time_s() - w0 < LIMIT_S)
                usleep(10000);
        }
    }
    if (g_rank == 1) {
        dt_req *rq;
        dt_pg_allreduce_async(world, DT_IN_PLACE, x, 1024, DT_F32, DT_REDUCE_SUM, &rq);
        fflush(stdout);
        raise(SIGKILL);
    }
    double t0 = dt_time_s();
    st = dt_pg_allreduce(world, DT_IN_PLACE, x, 1024, DT_F32, DT_REDUCE_SUM);
    double took = dt_time_s() - t0;
    const char *e = dt_last_error();
    CHECK(st == DT_ERR_PEER_FAILED, "got %s", dt_status_name(st));
    CHECK(strstr(e, "rank 1 (pid ") && strstr(e, "died (exited or was killed)"), "message does not name rank 1");
    CHECK(took < LIMIT_S, "took %.1f s", took);
    printf("mpi_deadrank: rank %d %s after %.2f s (%s): %s\n", g_rank, g_fail ? "FAILED" : "ok", took,
           dt_status_name(st), e);
    fflush(stdout);
    dt_pg_free(world);
    return 1; /* a peer failed: the job failed */
}
