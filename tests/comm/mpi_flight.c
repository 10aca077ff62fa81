/* The flight recorder names a stopped rank under mpirun (issue 30 items 4
 * and 10): in a 3-rank job on the `mpi` backend rank 1 stops itself
 * (SIGSTOP) after a reduce-scatter; ranks 0 and 2 time out in the next
 * all-reduce (DT_COMM_TIMEOUT=3 in the registration) and, having asked
 * every peer for its state point to point, fail with an error that names
 * rank 1 as the one that did not answer, the operation it has not posted
 * (with the caller's label and step) and since when the others wait,
 * within the timeout + 5 s. The group under test is a second group of
 * the job's ranks (its timeout from the environment); after the check rank
 * 0, told by rank 2 that it has its verdict too, continues rank 1 (SIGCONT)
 * and all three tally the result on the first group, whose timeout is 60
 * s. Also run under `dtrain run -n 3` (shm: there the stopped rank's own
 * state is read from shared memory).
 * Registered by tests/comm/tests.cmake. */
#include "dtrain/comm.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/rank_check.h"
#include "proc.h"

#define TIMEOUT_S 3.0

int main(void)
{
    /* The world group, for the pids, the hand-over and the final tally, has
     * a long timeout of its own: rank 1 reaches the tally seconds after the
     * others (continued after both verdicts, its late #2 fails first), and
     * a loaded machine (CI's sanitizer build) stretches that past the 3 s
     * that DT_COMM_TIMEOUT gives the group under test. */
    dt_pg *world, *pg;
    dt_pg_params wp = dt_pg_params_default();
    wp.timeout_s = 60;
    if (dt_pg_init(&wp, &world) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(world);
    int W = dt_pg_size(world);
    const char *want = getenv("DT_EXPECT_BACKEND");
    if (want && strcmp(want, dt_pg_backend(world)))
        CHECK(0, "backend is '%s', expected '%s'", dt_pg_backend(world), want);
    int64_t pids[3] = {0, 0, 0}, me = (int64_t)getpid();
    if (W != 3 || dt_pg_allgather(world, &me, pids, 1, DT_I64) < 0 || dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "[rank %d] needs 3 ranks (got %d): %s\n", g_rank, W, dt_last_error());
        return 1;
    }
    float buf[3 * 64];
    for (int i = 0; i < 3 * 64; i++)
        buf[i] = 1;
    dt_comm_set_step(811);
    dt_pg_set_label(pg, "DDP bucket 2");
    CHECK(dt_pg_allreduce(pg, DT_IN_PLACE, buf, 64, DT_F32, DT_REDUCE_SUM) == DT_OK, "%s", dt_last_error());
    dt_pg_set_label(pg, "ZeRO unit 7");
    CHECK(dt_pg_reduce_scatter(pg, buf, buf + 64 * g_rank, 64, DT_F32, DT_REDUCE_SUM) == DT_OK, "%s",
          dt_last_error());
    dt_comm_set_step(812);
    dt_pg_set_label(pg, "DDP bucket 3");
    if (g_rank == 1) {
        raise(SIGSTOP); /* continued by rank 0 after its check */
        /* late: fails with the others' verdict, or completes what they
         * abandoned; either way the group is failed afterwards */
        (void)dt_pg_allreduce(pg, DT_IN_PLACE, buf, 64, DT_F32, DT_REDUCE_SUM);
    } else {
        double t0 = dt_time_s();
        dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, buf, 64, DT_F32, DT_REDUCE_SUM);
        double took = dt_time_s() - t0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        fprintf(stderr, "[rank %d] after %.2f s: %s\n", g_rank, took, msg);
        CHECK(st == DT_ERR_TIMEOUT, "status %s", dt_status_name(st));
        CHECK(took < TIMEOUT_S + 5, "the error came after %.1f s", took);
        CHECK(strstr(msg, "allreduce(count=64, f32, sum) #2 timed out after 3 s on rank "),
              "not the timeout: %s", msg);
        if (!strcmp(dt_pg_backend(pg), "mpi")) { /* the stopped rank cannot answer */
            CHECK(strstr(msg, "flight recorder: rank 1 did not answer within "), "rank 1 is not named: %s", msg);
            CHECK(strstr(msg, "not known to have posted allreduce #2 (DDP bucket 3, step 812)"),
                  "the operation is not named: %s", msg);
        } else { /* shm: its state is read from the segment */
            CHECK(strstr(msg, "flight recorder: rank 1 has not posted allreduce #2 (DDP bucket 3, step 812); it "
                              "last completed reduce_scatter #1 (ZeRO unit 7, step 811) at "),
                  "rank 1 is not named: %s", msg);
        }
        CHECK(strstr(msg, "ranks 0, 2 wait since "), "the waiting ranks are not named: %s", msg);
        CHECK(strstr(msg, "(DT_COMM_TIMEOUT=3 s)"), "the timeout's source is not named: %s", msg);
        CHECK(!strstr(msg, "MPI does not say"), "%s", msg);
        /* rank 1 is continued once rank 2 has its verdict too (continued,
         * rank 1 posts #2 and would answer a late query) */
        int32_t had = 1;
        if (g_rank == 2)
            CHECK(dt_pg_send(world, &had, 1, DT_I32, 0) == DT_OK, "%s", dt_last_error());
        if (g_rank == 0) {
            CHECK(dt_pg_recv(world, &had, 1, DT_I32, 2) == DT_OK, "%s", dt_last_error());
            dt_test_kill((pid_t)pids[1], SIGCONT); /* refuses a pid <= 0 */
        }
    }
    dt_pg_free(pg);
    int64_t bad = g_fail;
    if (dt_pg_allreduce(world, DT_IN_PLACE, &bad, 1, DT_I64, DT_REDUCE_SUM) < 0) {
        fprintf(stderr, "[rank %d] final all-reduce: %s\n", g_rank, dt_last_error());
        bad = 1;
    }
    if (g_rank == 0)
        printf("mpi_flight: %d ranks, backend %s: %s (%lld failures)\n", W, dt_pg_backend(world),
               bad ? "FAILED" : "ok", (long long)bad);
    dt_pg_free(world);
    return bad ? 1 : 0;
}
