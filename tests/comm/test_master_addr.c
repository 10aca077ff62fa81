/* A torchrun-style launch whose MASTER_ADDR does not resolve fails at once on
 * every rank with a message naming the address (it was reported as "only 1
 * of 2 ranks connected" after the whole timeout). */
// dt-test-timeout: 120
#include "harness.h"
#include "test.h"

static int body(int rank, int size, void *arg)
{
    (void)arg;
    char b[16];
    snprintf(b, sizeof b, "%d", rank);
    setenv("RANK", b, 1);
    setenv("LOCAL_RANK", b, 1);
    snprintf(b, sizeof b, "%d", size);
    setenv("WORLD_SIZE", b, 1);
    setenv("LOCAL_WORLD_SIZE", b, 1);
    double t0 = dt_time_s();
    dt_pg *pg = NULL;
    dt_status st = dt_pg_init(NULL, &pg);
    TH_CHECK(st == DT_ERR_INVALID_ARG, "got %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(strstr(dt_last_error(), "MASTER_ADDR 'no-such-host.invalid'"), "message: %s",
             dt_last_error());
    TH_CHECK(dt_time_s() - t0 < 5, "took %.1f s (the timeout is 20 s)", dt_time_s() - t0);
    dt_pg_free(pg);
    return 0;
}

TEST(unresolvable_master_addr)
{
    setenv("MASTER_ADDR", "no-such-host.invalid", 1);
    setenv("MASTER_PORT", "29999", 1);
    setenv("DT_COMM_TIMEOUT", "20", 1);
    unsetenv("DT_JOB_ID");
    ASSERT_EQ_INT(th_run(2, 60.0, body, NULL, NULL), 0);
    unsetenv("MASTER_ADDR");
    unsetenv("MASTER_PORT");
    unsetenv("DT_COMM_TIMEOUT");
}

int main(void)
{
    RUN(unresolvable_master_addr);
    return TEST_REPORT();
}
