/* A group's progress thread does not busy-poll a late peer while its rank
 * computes (dt__comm_may_poll): the poll would take the core the rank
 * computes on (ZeRO-3 and DDP reduce in the background; with a rank's
 * compute and progress threads outnumbering its cores, every piece of a
 * reduce-scatter that waited for the peer burnt up to DT_SHM_SPIN_US of
 * that core). A thread blocked in dt_req_wait still lets the backend poll.
 *
 * Rank 1 joins an all-reduce 1.2 s late; rank 0 posted it asynchronously
 * and sleeps (its "compute") meanwhile, with DT_SHM_SPIN_US at 2 s so a
 * polling progress thread shows as a second of CPU time. The bound is
 * generous (0.3 s of the process's CPU over the 0.9 s sleep): a loaded
 * machine only lowers a poll's CPU time, and the sleeping path costs
 * milliseconds. Then the same with rank 0 waiting in dt_req_wait (values
 * only: it may poll there). Last, rank 0 blocks in an all-reduce of the
 * world group while a second group's progress thread runs one: the
 * waiter does not poll either (two threads of one rank would take both
 * cores of a 2-core machine from the peer). */
// dt-test-timeout: 120
// dt-test-labels: idle
#include "harness.h"
#include "test.h"

#include <time.h>

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define N (1u << 20) /* 4 MiB: through the staging areas, piece by piece */

static int body(int rank, int size, void *arg)
{
    (void)arg;
    setenv("DT_SHM_SPIN_US", "2000000", 1); /* read at group creation */
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float *x = malloc(N * sizeof *x);
    TH_CHECK(x != NULL, "malloc");
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < N; i++)
            x[i] = (float)(rank + 1) * (float)(i % 7);
        TH_OK(dt_pg_barrier(pg));
        if (rank == 1) {
            th_nap_ms(1200);
            TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM));
        } else {
            dt_req *rq = NULL;
            TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM, &rq));
            if (round == 0) { /* the rank computes while the progress thread waits for rank 1 */
                th_nap_ms(150); /* the progress thread has taken the request and reached the wait */
                const double c0 = cpu_s();
                th_nap_ms(900);
                const double used = cpu_s() - c0;
                TH_CHECK(used < 0.3, "the progress thread polled: %.3f s of CPU while the rank slept 0.9 s", used);
            }
            TH_OK(dt_req_wait(rq, -1));
            dt_req_free(rq);
        }
        for (size_t i = 0; i < N; i += 4099)
            TH_CHECK(x[i] == 3.0f * (float)(i % 7), "round %d: x[%zu] = %g", round, i, (double)x[i]);
    }
    /* rank 0 blocks in an all-reduce of the world group while a second group's progress thread
       runs one too (ZeRO-3: a gather waited for while a reduce-scatter goes on): neither polls */
    dt_pg *dup = NULL;
    TH_OK(dt_pg_dup(pg, &dup));
    float *y = malloc(N * sizeof *y);
    TH_CHECK(y != NULL, "malloc");
    for (size_t i = 0; i < N; i++)
        x[i] = (float)(rank + 1), y[i] = (float)(2 * rank + 1);
    TH_OK(dt_pg_barrier(pg));
    if (rank == 1) {
        th_nap_ms(1200);
        TH_OK(dt_pg_allreduce(dup, DT_IN_PLACE, y, N, DT_F32, DT_REDUCE_SUM));
        TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM));
    } else {
        dt_req *rq = NULL;
        TH_OK(dt_pg_allreduce_async(dup, DT_IN_PLACE, y, N, DT_F32, DT_REDUCE_SUM, &rq));
        th_nap_ms(150);
        const double c0 = cpu_s();
        TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, N, DT_F32, DT_REDUCE_SUM));
        const double used = cpu_s() - c0;
        TH_CHECK(used < 0.3, "a waiter polled beside a running progress thread: %.3f s of CPU in ~1 s", used);
        TH_OK(dt_req_wait(rq, -1));
        dt_req_free(rq);
    }
    TH_CHECK(x[N - 1] == 3.0f && y[N - 1] == 4.0f, "sums %g %g", (double)x[N - 1], (double)y[N - 1]);
    free(y);
    dt_pg_free(dup);
    free(x);
    dt_pg_free(pg);
    return 0;
}

TEST(progress_thread_does_not_poll)
{
    setenv("DT_COMM_TIMEOUT", "60", 1);
    int rc = th_run(2, 60.0, body, NULL, NULL);
    if (rc == -1)
        DT_TEST_SKIP("cannot fork the ranks");
    ASSERT_EQ_INT(rc, 0);
}

int main(void)
{
    RUN(progress_thread_does_not_poll);
    return TEST_REPORT();
}
