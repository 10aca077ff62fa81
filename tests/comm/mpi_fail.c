/* Failing a group on purpose reaches its other ranks at once (issue 17,
 * "never a hang"): one rank fails a group (dt_pg_fail, as the pipeline
 * does when a rank breaks off its schedule) while the others wait on it,
 * and their waits end within seconds with that rank's status and exactly
 * its message, not at the group's timeout (DT_COMM_TIMEOUT=30 in the
 * registration: a regression fails the `took` check, or the status check
 * with DT_ERR_TIMEOUT).
 *
 *  1. collective: a dup of the world group; rank 1 fails it while the
 *     others wait in an all-reduce (with DT_MPI_BLOCKING=1, whose blocking
 *     calls cannot be interrupted, the others post theirs after the
 *     failure: the notice keeps the call from starting). Rank 1 first
 *     posts an all-reduce on a third group that the others join only
 *     later, so that under MPI_THREAD_SERIALIZED its progress thread holds
 *     the MPI lock while the notice is sent (the deferred send).
 *  2. point to point: a split of the world in reverse order; its rank 0
 *     (the last world rank) fails it while it waits in a receive nobody
 *     sends (its own wait ends too), one rank waits in a receive from it
 *     and, with 3 or more ranks, another in a 4 MB send to it.
 *  3. every later operation on the failed groups fails at once, on every
 *     rank; the groups free, and the job ends (no MPI_Finalize hang).
 *
 * Registered by tests/comm/tests.cmake under mpirun -np 3 (mpi; also with
 * DT_MPI_BLOCKING=1, and with "serialized": the program initialises MPI at
 * MPI_THREAD_SERIALIZED and finalises it) and under `dtrain run -n 3`
 * (shm): the expected messages are the same strings on both backends. */
#include "dtrain/comm.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/rank_check.h"

static int g_w;

#define LIMIT_S 10.0 /* far under the 30 s timeout */

static void nap_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* st and the thread's error are the failing rank's. */
static void check_failure(const char *what, dt_status st, double took, dt_status want, const char *msg)
{
    CHECK(st == want, "%s: got %s (want %s): %s", what, dt_status_name(st), dt_status_name(want),
          dt_last_error());
    CHECK(!strcmp(dt_last_error(), msg), "%s: message '%s', want '%s'", what, dt_last_error(), msg);
    CHECK(took < LIMIT_S, "%s: noticed the failure after %.1f s", what, took);
}

static void test_collective(dt_pg *world, int blocking)
{
    const int F = 1;
    const char *msg = "test: rank 1 of the collective group gives up (its cause)";
    dt_pg *pg, *aux;
    if (dt_pg_dup(world, &pg) < 0 || dt_pg_dup(world, &aux) < 0) {
        CHECK(0, "dt_pg_dup: %s", dt_last_error());
        return;
    }
    float x[16] = {0}, y[4] = {0};
    if (g_rank == F) {
        dt_req *late;
        CHECK(dt_pg_allreduce_async(aux, DT_IN_PLACE, y, 4, DT_F32, DT_REDUCE_SUM, &late) == DT_OK, "%s",
              dt_last_error());
        if (!blocking)
            nap_s(0.3); /* the others are in their all-reduce */
        dt_status st = dt_pg_fail(pg, DT_ERR_INVALID_ARG, msg);
        CHECK(st == DT_ERR_INVALID_ARG && dt_pg_status(pg) == DT_ERR_INVALID_ARG, "failing rank: %s",
              dt_status_name(dt_pg_status(pg)));
        if (blocking)
            CHECK(dt_pg_barrier(world) == DT_OK, "%s", dt_last_error());
        CHECK(dt_req_wait(late, -1) == DT_OK, "aux all-reduce: %s", dt_last_error());
        dt_req_free(late);
    } else {
        if (blocking)
            CHECK(dt_pg_barrier(world) == DT_OK, "%s", dt_last_error());
        double t0 = dt_time_s();
        dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, x, 16, DT_F32, DT_REDUCE_SUM);
        check_failure("all-reduce", st, dt_time_s() - t0, DT_ERR_INVALID_ARG, msg);
        CHECK(dt_pg_allreduce(aux, DT_IN_PLACE, y, 4, DT_F32, DT_REDUCE_SUM) == DT_OK, "aux all-reduce: %s",
              dt_last_error());
    }
    /* later operations fail at once, on every rank */
    double t0 = dt_time_s();
    check_failure("later barrier", dt_pg_barrier(pg), dt_time_s() - t0, DT_ERR_INVALID_ARG, msg);
    dt_pg_free(aux);
    dt_pg_free(pg);
}

static void test_p2p(dt_pg *world)
{
    const char *msg = "test: rank 0 of the reversed group (the last world rank) gives up";
    dt_pg *pg;
    if (dt_pg_split(world, 0, g_w - g_rank, &pg) < 0) {
        CHECK(0, "dt_pg_split: %s", dt_last_error());
        return;
    }
    int me = dt_pg_rank(pg);
    CHECK(me == g_w - 1 - g_rank, "reversed group: rank %d", me);
    const size_t big = (size_t)1 << 20; /* 4 MB of f32: past every eager limit */
    float *buf = calloc(big, sizeof *buf);
    if (!buf) {
        CHECK(0, "out of memory");
        dt_pg_free(pg);
        return;
    }
    if (me == 0) {
        dt_req *r;
        CHECK(dt_pg_recv_async(pg, buf, 4, DT_F32, 1, &r) == DT_OK, "%s", dt_last_error());
        nap_s(0.3); /* the others are in their receive and send */
        double t0 = dt_time_s();
        dt_pg_fail(pg, DT_ERR_PEER_FAILED, msg);
        check_failure("own receive", dt_req_wait(r, -1), dt_time_s() - t0, DT_ERR_PEER_FAILED, msg);
        dt_req_free(r);
    } else {
        double t0 = dt_time_s();
        dt_status st = me == 1 ? dt_pg_recv(pg, buf, 4, DT_F32, 0) : dt_pg_send(pg, buf, big, DT_F32, 0);
        check_failure(me == 1 ? "receive" : "4 MB send", st, dt_time_s() - t0, DT_ERR_PEER_FAILED, msg);
    }
    double t0 = dt_time_s();
    check_failure("later send", dt_pg_send(pg, buf, 1, DT_F32, (me + 1) % g_w), dt_time_s() - t0,
                  DT_ERR_PEER_FAILED, msg);
    dt_pg_free(pg);
    free(buf);
}

int main(int argc, char **argv)
{
    int own_mpi = argc > 1 && !strcmp(argv[1], "serialized");
    if (own_mpi) {
        int provided = 0;
        if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS ||
            provided < MPI_THREAD_SERIALIZED) {
            fprintf(stderr, "MPI_Init_thread(MPI_THREAD_SERIALIZED) failed\n");
            return 1;
        }
    }
    dt_pg *world;
    if (dt_pg_init(NULL, &world) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(world);
    g_w = dt_pg_size(world);
    const char *want = getenv("DT_EXPECT_BACKEND");
    if (want && strcmp(want, dt_pg_backend(world)))
        CHECK(0, "backend is '%s', expected '%s'", dt_pg_backend(world), want);
    const char *b = getenv("DT_MPI_BLOCKING");
    int blocking = b && !strcmp(b, "1") && !strcmp(dt_pg_backend(world), "mpi");
    if (g_w < 2) {
        CHECK(0, "needs 2 or more ranks, got %d", g_w);
    } else {
        test_collective(world, blocking);
        test_p2p(world);
    }
    int64_t bad = g_fail;
    dt_status st = dt_pg_allreduce(world, DT_IN_PLACE, &bad, 1, DT_I64, DT_REDUCE_SUM);
    if (st < 0) {
        fprintf(stderr, "[rank %d] final all-reduce: %s\n", g_rank, dt_last_error());
        bad = 1;
    }
    if (g_rank == 0)
        printf("mpi_fail: %d ranks, backend %s%s%s: %s (%lld failures)\n", g_w, dt_pg_backend(world),
               blocking ? ", blocking" : "", own_mpi ? ", MPI_THREAD_SERIALIZED" : "", bad ? "FAILED" : "ok",
               (long long)bad);
    dt_pg_free(world);
    if (own_mpi)
        MPI_Finalize();
    return bad ? 1 : 0;
}
