/* MPI start-up and group creation under the group's timeouts (issue 30
 * item 6), each a separate mpirun job with DT_COMM_TIMEOUT=2 and the
 * start-up's own bound DT_INIT_TIMEOUT (4 s for init, 60 s for the others,
 * whose subject is a later operation: starting 3 processes of MPI can take
 * seconds on a loaded machine):
 *
 *   init   rank 1 never calls dt_pg_init (it sleeps, then exits without
 *          MPI); rank 0's dt_pg_init must fail with DT_ERR_TIMEOUT naming
 *          MPI_Init and DT_INIT_TIMEOUT within 4 s + 5 s instead of waiting
 *          in MPI_Init for ever;
 *   split  3 ranks; rank 2 never joins dt_pg_subgroup; ranks 0 and 1 must
 *          get DT_ERR_TIMEOUT naming the subgroup's creation within the
 *          timeout + 5 s instead of waiting in MPI_Comm_split for ever;
 *   blocking  3 ranks under DT_MPI_BLOCKING=1; rank 1 never joins an
 *          all-reduce; ranks 0 and 2 must get DT_ERR_TIMEOUT (with the
 *          flight recorder's verdict naming rank 1) within the timeout + 5 s
 *          instead of waiting inside the blocking MPI_Allreduce for ever;
 *   h2h    2 ranks each call dt_pg_send (1 MiB) to the other, then
 *          dt_pg_recv: both complete at once with the right data (a
 *          buffered send), not at the timeout; also under `dtrain run`.
 *
 * A rank prints "<mode>: rank R ok" or "FAILED" lines; mpirun may end the
 * job with an error afterwards (a rank that cannot use MPI exits), so the
 * registration (tests/comm/tests.cmake) matches the output. */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TIMEOUT_S 2.0      /* DT_COMM_TIMEOUT in the registration */
#define INIT_TIMEOUT_S 4.0 /* DT_INIT_TIMEOUT of the init mode */

static int env_rank(void)
{
    const char *r = getenv("OMPI_COMM_WORLD_RANK");
    return r ? atoi(r) : -1;
}

static int verdict(const char *mode, int rank, dt_status st, double took, double limit, const char *want)
{
    const char *msg = dt_last_error();
    int ok = st == DT_ERR_TIMEOUT && took < limit + 5 && strstr(msg, want);
    printf("%s: rank %d %s after %.2f s (%s): %s\n", mode, rank, ok ? "ok" : "FAILED", took, dt_status_name(st),
           msg);
    fflush(stdout);
    /* a rank that exits after a timeout aborts the job (MPI cannot finish
     * with a request left): give the other ranks time to print theirs */
    sleep(2);
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int rank = env_rank();
    if (!strcmp(mode, "init")) {
        if (rank != 0) {
            sleep(15); /* never starts MPI; mpirun ends it when rank 0 gives up */
            return 0;
        }
        dt_pg *pg = NULL;
        double t0 = dt_time_s();
        dt_status st = dt_pg_init(NULL, &pg);
        if (st == DT_ERR_TIMEOUT && !strstr(dt_last_error(), "DT_INIT_TIMEOUT")) {
            printf("init: rank 0 FAILED: the message does not name DT_INIT_TIMEOUT: %s\n", dt_last_error());
            return 1;
        }
        return verdict(mode, rank, st, dt_time_s() - t0, INIT_TIMEOUT_S,
                       "MPI_Init did not complete within 4 s on rank 0 of 2");
    }
    if (!strcmp(mode, "split")) {
        dt_pg *world;
        if (dt_pg_init(NULL, &world) < 0) {
            printf("split: rank %d FAILED: dt_pg_init: %s\n", rank, dt_last_error());
            return 1;
        }
        rank = dt_pg_rank(world);
        if (rank == 2) {
            sleep(15); /* never joins; ended with the job */
            return 0;
        }
        int ranks[2] = {0, 1};
        dt_pg *sub = NULL;
        double t0 = dt_time_s();
        dt_status st = dt_pg_subgroup(world, ranks, 2, &sub);
        return verdict(mode, rank, st, dt_time_s() - t0, TIMEOUT_S, "creating a subgroup");
    }
    if (!strcmp(mode, "blocking")) { /* DT_MPI_BLOCKING=1 */
        dt_pg *world;
        if (dt_pg_init(NULL, &world) < 0) {
            printf("blocking: rank %d FAILED: dt_pg_init: %s\n", rank, dt_last_error());
            return 1;
        }
        rank = dt_pg_rank(world);
        if (rank == 1) {
            sleep(15); /* never joins; ended with the job */
            return 0;
        }
        float x[16] = {0};
        double t0 = dt_time_s();
        dt_status st = dt_pg_allreduce(world, DT_IN_PLACE, x, 16, DT_F32, DT_REDUCE_SUM);
        return verdict(mode, rank, st, dt_time_s() - t0, TIMEOUT_S, "flight recorder: rank 1 did not answer");
    }
    if (!strcmp(mode, "h2h")) { /* two blocking sends facing each other */
        dt_pg *pg;
        if (dt_pg_init(NULL, &pg) < 0) {
            printf("h2h: rank %d FAILED: dt_pg_init: %s\n", rank, dt_last_error());
            return 1;
        }
        rank = dt_pg_rank(pg);
        int peer = 1 - rank;
        size_t n = (size_t)1 << 18; /* 1 MiB of f32: past MPI's and shm's eager sizes */
        float *out = malloc(n * sizeof *out), *in = calloc(n, sizeof *in);
        if (!out || !in || dt_pg_size(pg) != 2) {
            printf("h2h: rank %d FAILED: needs 2 ranks and memory\n", rank);
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            out[i] = (float)(rank * 1000003 + (int)i);
        double t0 = dt_time_s();
        dt_status st = dt_pg_send(pg, out, n, DT_F32, peer);
        for (size_t i = 0; i < n; i++)
            out[i] = -1; /* the send's buffer is free again: the peer still gets the values sent */
        if (st >= 0)
            st = dt_pg_recv(pg, in, n, DT_F32, peer);
        double took = dt_time_s() - t0;
        size_t bad = 0;
        for (size_t i = 0; i < n && st >= 0; i++)
            bad += in[i] != (float)(peer * 1000003 + (int)i);
        int ok = st == DT_OK && bad == 0 && took < TIMEOUT_S;
        printf("h2h: rank %d %s after %.2f s (%s, %zu wrong values, backend %s): %s\n", rank, ok ? "ok" : "FAILED",
               took, dt_status_name(st), bad, dt_pg_backend(pg), st < 0 ? dt_last_error() : "");
        fflush(stdout);
        dt_pg_free(pg);
        free(out);
        free(in);
        return ok ? 0 : 1;
    }
    fprintf(stderr, "usage: mpi_timeouts init|split|blocking|h2h\n");
    return 2;
}
