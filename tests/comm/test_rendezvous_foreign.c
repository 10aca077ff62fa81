/* Two torchrun-style jobs without DT_JOB_ID on one MASTER_PORT must not mix
 * their ranks: a second process claiming rank 1 at the rendezvous makes
 * every process of it fail at once with DT_ERR_MISMATCH naming the shared
 * port (before, rank 0 took whichever rank 1 came first and trained with
 * it); a rank of a job of another world size is turned away alone and the
 * right job goes on. */
// dt-test-timeout: 120
#include "harness.h"
#include "test.h"

#include <sched.h>

typedef struct {
    int rank[4], world[4];
    int port;
} plan;

/* Every process waits for the others, so that all reach the rendezvous together. */
static void start_together(int me, int size)
{
    th_shared[me] = 1;
    double t0 = dt_time_s();
    for (int r = 0; r < size && dt_time_s() - t0 < 20; r++)
        while (th_shared[r] == 0 && dt_time_s() - t0 < 20)
            sched_yield();
}

static int pg_result(int me, const plan *p, dt_pg **pg)
{
    char b[16];
    snprintf(b, sizeof b, "%d", p->rank[me]);
    setenv("RANK", b, 1);
    setenv("LOCAL_RANK", b, 1);
    snprintf(b, sizeof b, "%d", p->world[me]);
    setenv("WORLD_SIZE", b, 1);
    setenv("LOCAL_WORLD_SIZE", b, 1);
    snprintf(b, sizeof b, "%d", p->port);
    setenv("MASTER_PORT", b, 1);
    start_together(me, 3);
    return dt_pg_init(NULL, pg);
}

/* processes 0, 1: job A (ranks 0, 1 of 2); process 2: rank 1 of another job of 2 */
static int body_duplicate(int me, int size, void *arg)
{
    (void)size;
    dt_pg *pg = NULL;
    double t0 = dt_time_s();
    dt_status st = pg_result(me, arg, &pg);
    TH_CHECK(st == DT_ERR_MISMATCH, "process %d: got %s: %s", me, dt_status_name(st),
             st < 0 ? dt_last_error() : "a group");
    TH_CHECK(strstr(dt_last_error(), "MASTER_ADDR:MASTER_PORT"), "process %d: %s", me, dt_last_error());
    TH_CHECK(dt_time_s() - t0 < 10, "process %d took %.1f s (the timeout is 30 s)", me, dt_time_s() - t0);
    if (me == 0)
        TH_CHECK(strstr(dt_last_error(), "two processes claim rank 1"), "%s", dt_last_error());
    dt_pg_free(pg);
    return 0;
}

/* processes 0, 1: job A (ranks 0, 1 of 2); process 2: rank 1 of a job of 3 */
static int body_other_world(int me, int size, void *arg)
{
    (void)size;
    const plan *p = arg;
    dt_pg *pg = NULL;
    dt_status st = pg_result(me, p, &pg);
    if (me < 2) {
        TH_CHECK(st == DT_OK, "process %d: %s: %s", me, dt_status_name(st), dt_last_error());
        TH_CHECK(dt_pg_size(pg) == 2 && dt_pg_rank(pg) == me, "process %d: rank %d of %d", me, dt_pg_rank(pg),
                 dt_pg_size(pg));
        TH_OK(dt_pg_barrier(pg));
    } else {
        TH_CHECK(st == DT_ERR_MISMATCH, "process 2: got %s: %s", dt_status_name(st),
                 st < 0 ? dt_last_error() : "a group");
        TH_CHECK(strstr(dt_last_error(), "another job: world size 2"), "%s", dt_last_error());
    }
    dt_pg_free(pg);
    return 0;
}

TEST(second_rank_one_refuses_the_job)
{
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("DT_COMM_TIMEOUT", "30", 1);
    unsetenv("DT_JOB_ID");
    unsetenv("TORCHELASTIC_RUN_ID");
    plan p = {{0, 1, 1}, {2, 2, 2}, 20000 + (int)(getpid() % 20000)};
    ASSERT_EQ_INT(th_run(3, 60.0, body_duplicate, &p, NULL), 0);
    plan q = {{0, 1, 1}, {2, 2, 3}, 20000 + (int)((getpid() + 7) % 20000)};
    ASSERT_EQ_INT(th_run(3, 60.0, body_other_world, &q, NULL), 0);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("DT_COMM_TIMEOUT");
}

int main(void)
{
    RUN(second_rank_one_refuses_the_job);
    return TEST_REPORT();
}
