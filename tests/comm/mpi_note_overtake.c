/* A failure notice that overtakes the last messages of a collective its
 * sender completed must not fail that collective on the rank it reaches
 * (train/mpi_pipe_fail_np4 flaked so: under load, rank 3's all-reduce
 * of step 1 failed with rank 1's "broke off" of step 2, while ranks 0-2
 * had completed step 1; a program that saves a checkpoint after the error
 * would then save rank 3 one step behind the others). The notice says how
 * many collectives its sender completed on the group; a posted collective
 * below that count completes, and the group's failure comes with the next
 * operation.
 *
 * 3 ranks under mpirun; the race is made certain by the backend's test hook
 * (DT_FAULT_MPI_LATE_RANK=2, DT_FAULT_MPI_LATE_SEQ=1 in the registration):
 * rank 2 looks at its all-reduce #1 only once the group is down. Rank 1
 * completes that all-reduce and fails the group (dt_pg_fail); rank 2's
 * all-reduce must succeed with the right sum, and its next one fail with
 * rank 1's message. */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/rank_check.h"

int main(void)
{
    dt_pg *root, *w;
    if (dt_pg_init(NULL, &root) < 0 || dt_pg_dup(root, &w) < 0) {
        fprintf(stderr, "set-up: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(root);
    const int W = dt_pg_size(root);
    const char *msg = "test: rank 1 gives up after all-reduce #1";
    CHECK(W == 3 && !strcmp(dt_pg_backend(w), "mpi"), "needs 3 ranks on mpi, got %d on %s", W, dt_pg_backend(w));
    double x[64];
    for (int i = 0; i < 64; i++)
        x[i] = g_rank + 1;
    CHECK(dt_pg_allreduce(w, DT_IN_PLACE, x, 64, DT_F64, DT_REDUCE_SUM) == DT_OK, "#0: %s", dt_last_error());
    for (int i = 0; i < 64; i++)
        x[i] = g_rank + 1;
    dt_status st = dt_pg_allreduce(w, DT_IN_PLACE, x, 64, DT_F64, DT_REDUCE_SUM);
    CHECK(st == DT_OK, "all-reduce #1 failed here though rank 1 completed it: %s", dt_last_error());
    CHECK(st < 0 || x[0] == W * (W + 1) / 2, "all-reduce #1: sum %g", x[0]);
    if (g_rank == 1)
        dt_pg_fail(w, DT_ERR_PEER_FAILED, msg);
    st = dt_pg_allreduce(w, DT_IN_PLACE, x, 64, DT_F64, DT_REDUCE_SUM);
    CHECK(st == DT_ERR_PEER_FAILED && strstr(dt_last_error(), msg), "all-reduce #2: %s: %s", dt_status_name(st),
          dt_last_error());
    dt_pg_free(w);
    int64_t bad = g_fail;
    if (dt_pg_allreduce(root, DT_IN_PLACE, &bad, 1, DT_I64, DT_REDUCE_SUM) < 0)
        bad = 1;
    if (g_rank == 0)
        printf("mpi_note_overtake: %d ranks: %s (%lld failures)\n", W, bad ? "FAILED" : "ok", (long long)bad);
    dt_pg_free(root);
    return bad ? 1 : 0;
}
