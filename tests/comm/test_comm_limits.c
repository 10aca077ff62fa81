/* Counts whose byte size overflows, or exceeds any possible buffer, are
 * argument errors returned at once on every rank (DT_ERR_INVALID_ARG with a
 * message), never a collective over a wrapped size: SIZE_MAX elements used
 * to return DT_OK without doing anything, 2^62 floats crashed after seconds. */
// dt-test-timeout: 120
#include "harness.h"
#include "test.h"

#include <stdint.h>

/* Every call here must fail with DT_ERR_INVALID_ARG, naming the function. */
#define BAD(call, fn)                                                                              \
    do {                                                                                           \
        dt_status s_ = (call);                                                                     \
        TH_CHECK(s_ == DT_ERR_INVALID_ARG, "%s: got %s (%s)", #call, dt_status_name(s_),          \
                 dt_last_error());                                                                 \
        TH_CHECK(strstr(dt_last_error(), fn) != NULL, "%s: message '%s'", #call, dt_last_error()); \
    } while (0)

static int body_limits(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[64] = {0};
    const size_t huge[] = {SIZE_MAX, (size_t)1 << 62, ((size_t)1 << 61) + 1, SIZE_MAX / 4 + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        size_t n = huge[i];
        BAD(dt_pg_allreduce(pg, x, y, n, DT_F32, DT_REDUCE_SUM), "dt_pg_allreduce");
        BAD(dt_pg_allreduce(pg, DT_IN_PLACE, y, n, DT_F64, DT_REDUCE_SUM), "dt_pg_allreduce");
        BAD(dt_pg_reduce(pg, x, y, n, DT_F32, DT_REDUCE_SUM, 0), "dt_pg_reduce");
        BAD(dt_pg_broadcast(pg, y, n, DT_F32, 0), "dt_pg_broadcast");
        BAD(dt_pg_allgather(pg, x, y, n, DT_F32), "dt_pg_allgather");
        BAD(dt_pg_reduce_scatter(pg, y, x, n, DT_F32, DT_REDUCE_SUM), "dt_pg_reduce_scatter");
        BAD(dt_pg_gather(pg, x, y, n, DT_F32, 0), "dt_pg_gather");
        BAD(dt_pg_scatter(pg, y, x, n, DT_F32, 0), "dt_pg_scatter");
        BAD(dt_pg_alltoall(pg, x, y, n, DT_F32), "dt_pg_alltoall");
        if (size > 1) {
            BAD(dt_pg_send(pg, x, n, DT_F32, (rank + 1) % size), "dt_pg_send");
            BAD(dt_pg_recv(pg, y, n, DT_F32, (rank + 1) % size), "dt_pg_recv");
        }
        dt_req *r = (dt_req *)1;
        BAD(dt_pg_allreduce_async(pg, x, y, n, DT_F32, DT_REDUCE_SUM, &r), "dt_pg_allreduce");
        TH_CHECK(r == NULL, "no request on an argument error");
    }
    /* Only the gathered side is multiplied by the group size: a count that
     * fits alone but not times the size. */
    if (size > 1) {
        size_t n = (size_t)PTRDIFF_MAX / 4 / (size_t)size + 1;
        BAD(dt_pg_allgather(pg, x, y, n, DT_F32), "dt_pg_allgather");
        BAD(dt_pg_alltoall(pg, x, y, n, DT_F32), "dt_pg_alltoall");
    }
    /* allgatherv: counts whose sum overflows. */
    size_t counts[TH_MAX_RANKS];
    for (int r = 0; r < size; r++)
        counts[r] = size == 1 ? SIZE_MAX : SIZE_MAX / 2 + 1;
    BAD(dt_pg_allgatherv(pg, x, y, counts, NULL, DT_F32), "dt_pg_allgatherv");
    /* A buffer that runs past the end of the address space. */
    BAD(dt_pg_allreduce(pg, DT_IN_PLACE, (void *)(UINTPTR_MAX - 15), 8, DT_F32, DT_REDUCE_SUM),
        "dt_pg_allreduce");
    TH_CHECK(strstr(dt_last_error(), "address space") != NULL, "%s", dt_last_error());

    /* The group is still usable: nothing was posted. */
    for (int i = 0; i < 8; i++)
        x[i] = (float)(rank + 1);
    TH_OK(dt_pg_allreduce(pg, x, y, 8, DT_F32, DT_REDUCE_SUM));
    TH_CHECK(y[7] == (float)(size * (size + 1) / 2), "sum %g", (double)y[7]);
    TH_CHECK(dt_pg_seq(pg) == 1, "seq %llu: an argument error posted something",
             (unsigned long long)dt_pg_seq(pg));
    dt_pg_free(pg);
    return 0;
}

TEST(huge_counts)
{
    setenv("DT_COMM_TIMEOUT", "20", 1);
    for (int n = 1; n <= 3; n++)
        ASSERT_EQ_INT(th_run(n, 60.0, body_limits, NULL, NULL), 0);
    unsetenv("DT_COMM_TIMEOUT");
}

int main(void)
{
    RUN(huge_counts);
    return TEST_REPORT();
}
