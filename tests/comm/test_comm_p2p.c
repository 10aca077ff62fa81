/* Batched point to point, concurrent groups (dt_pg_dup) and dt_pg_split on
 * the shm backend (self at world size 1), in forked ranks.
 *
 *  - rings of 64 MiB messages through 256 KiB channels, every rank posting
 *    its receive first, and every rank posting its send first (this
 *    deadlocked when send/recv ran one at a time), world sizes 1-4 and 8;
 *  - an all-to-all of posted sends then receives (any pattern completes);
 *  - a request on a duplicate group completes while a request on the
 *    parent still waits for a late peer (checked, not just "both finish");
 *  - 2x2 and 2x3 meshes from dt_pg_split, with collectives on the row and
 *    column groups while a parent all-reduce is in flight; key order and
 *    color < 0. */
// dt-test-timeout: 300
#include "comm/harness.h"
#include "test.h"

#include <stdint.h>

static int32_t pat(int src, size_t i) { return (int32_t)((uint32_t)src * 2654435761u + (uint32_t)i); }

/* ---- rings ---------------------------------------------------------------- */

typedef struct {
    size_t count;
    int send_first;
} ring_arg;

static int ring_body(int rank, int size, void *argp)
{
    const ring_arg *a = argp;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    if (size == 1) {
        /* Nothing to exchange; a sendrecv with no halves is fine, a send to
         * oneself is an error. */
        TH_OK(dt_pg_sendrecv(pg, NULL, 0, -1, NULL, 0, -1, DT_I32));
        dt_req *rq = NULL;
        TH_CHECK(dt_pg_send_async(pg, &rank, 1, DT_I32, 0, &rq) == DT_ERR_INVALID_ARG, "self send");
        dt_pg_free(pg);
        return 0;
    }
    int32_t *s = malloc(a->count * sizeof *s), *r = malloc(a->count * sizeof *r);
    TH_CHECK(s && r, "out of memory");
    for (size_t i = 0; i < a->count; i++) {
        s[i] = pat(rank, i);
        r[i] = -1;
    }
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    dt_req *rq[2];
    if (a->send_first) {
        TH_OK(dt_pg_send_async(pg, s, a->count, DT_I32, next, &rq[0]));
        TH_OK(dt_pg_recv_async(pg, r, a->count, DT_I32, prev, &rq[1]));
    } else {
        TH_OK(dt_pg_recv_async(pg, r, a->count, DT_I32, prev, &rq[1]));
        TH_OK(dt_pg_send_async(pg, s, a->count, DT_I32, next, &rq[0]));
    }
    TH_OK(dt_req_wait_all(rq, 2, -1));
    dt_req_free(rq[0]);
    dt_req_free(rq[1]);
    for (size_t i = 0; i < a->count; i++)
        TH_CHECK(r[i] == pat(prev, i), "r[%zu] = %d, want %d", i, r[i], pat(prev, i));
    /* The same shift again through the blocking batch call, the other way. */
    for (size_t i = 0; i < a->count; i++)
        r[i] = -1;
    TH_OK(dt_pg_sendrecv(pg, s, a->count, prev, r, a->count, next, DT_I32));
    for (size_t i = 0; i < a->count; i += 4099)
        TH_CHECK(r[i] == pat(next, i), "sendrecv r[%zu] = %d, want %d", i, r[i], pat(next, i));
    TH_CHECK(r[a->count - 1] == pat(next, a->count - 1), "sendrecv last");
    free(s);
    free(r);
    dt_pg_free(pg);
    return 0;
}

static void ring(int send_first)
{
    static const int sizes[] = {1, 2, 3, 4, 8};
    ring_arg a = {.count = ((size_t)64 << 20) / sizeof(int32_t), .send_first = send_first};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int rc = th_run(sizes[k], 240, ring_body, &a, NULL);
        if (rc != 0)
            fprintf(stderr, "ring of %d ranks, %s first: rc %d\n", sizes[k],
                    send_first ? "send" : "recv", rc);
        ASSERT_EQ_INT(rc, 0);
    }
}

TEST(ring_64mib_recv_posted_first) { ring(0); }
TEST(ring_64mib_send_posted_first) { ring(1); }

/* Every rank posts sends to every peer (odd sizes, some larger than the
 * ring), then the receives: all in flight together. */
static int alltoall_body(int rank, int size, void *argp)
{
    (void)argp;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    size_t n[8];
    int32_t *s[8], *r[8];
    dt_req *rq[16];
    int k = 0;
    for (int p = 0; p < size; p++) {
        n[p] = 1 + (size_t)((rank + p) % 3) * 100003; /* same for (a->b) and (b->a) */
        s[p] = malloc(n[p] * sizeof(int32_t));
        r[p] = malloc(n[p] * sizeof(int32_t));
        TH_CHECK(s[p] && r[p], "oom");
        for (size_t i = 0; i < n[p]; i++) {
            s[p][i] = pat(rank * 16 + p, i);
            r[p][i] = 0;
        }
    }
    for (int p = 0; p < size; p++)
        if (p != rank)
            TH_OK(dt_pg_send_async(pg, s[p], n[p], DT_I32, p, &rq[k++]));
    for (int p = 0; p < size; p++)
        if (p != rank)
            TH_OK(dt_pg_recv_async(pg, r[p], n[p], DT_I32, p, &rq[k++]));
    TH_OK(dt_req_wait_all(rq, k, -1));
    for (int i = 0; i < k; i++)
        dt_req_free(rq[i]);
    for (int p = 0; p < size; p++) {
        if (p != rank)
            for (size_t i = 0; i < n[p]; i++)
                TH_CHECK(r[p][i] == pat(p * 16 + rank, i), "from %d [%zu]", p, i);
        free(s[p]);
        free(r[p]);
    }
    /* A collective after the batch runs after it, in order. */
    int32_t v = rank, sum = 0;
    TH_OK(dt_pg_allreduce(pg, &v, &sum, 1, DT_I32, DT_REDUCE_SUM));
    TH_CHECK(sum == size * (size - 1) / 2, "sum %d", sum);
    dt_pg_free(pg);
    return 0;
}

TEST(alltoall_of_posted_sends_then_recvs)
{
    ASSERT_EQ_INT(th_run(4, 120, alltoall_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 120, alltoall_body, NULL, NULL), 0);
}

/* A recv whose sender never sends times out with a message naming the peer
 * (not a hang), on both ranks. */
static int p2p_timeout_body(int rank, int size, void *argp)
{
    (void)argp;
    (void)size;
    dt_pg_params p = dt_pg_params_default();
    p.rank = rank;
    p.world_size = 2;
    p.job_id = th_job;
    p.backend = "shm";
    p.timeout_s = 1.0;
    dt_pg *pg;
    TH_OK(dt_pg_init(&p, &pg));
    int32_t x = 0;
    if (rank == 1) {
        dt_req *rq;
        TH_OK(dt_pg_recv_async(pg, &x, 1, DT_I32, 0, &rq));
        dt_status st = dt_req_wait(rq, -1);
        TH_CHECK(st == DT_ERR_TIMEOUT, "got %s", dt_status_name(st));
        TH_CHECK(strstr(dt_req_message(rq), "rank 0 did not send"), "%s", dt_req_message(rq));
        dt_req_free(rq);
    } else {
        th_nap_ms(2000);
    }
    dt_pg_free(pg);
    return 0;
}

TEST(unmatched_recv_times_out)
{
    ASSERT_EQ_INT(th_run(2, 60, p2p_timeout_body, NULL, NULL), 0);
}

/* ---- concurrency ---------------------------------------------------------- */

/* Rank 0 is late for an all-reduce on pg; meanwhile an all-gather on a
 * duplicate completes on every rank, and ranks != 0 see the all-reduce
 * still in progress after it (rank 0 does not post the all-reduce before
 * they have looked: th_shared[1 + r] = 1). */
static int concurrent_body(int rank, int size, void *argp)
{
    (void)argp;
    dt_pg *pg, *dup;
    TH_OK(th_pg(rank, size, NULL, &pg));
    TH_OK(dt_pg_dup(pg, &dup));
    TH_CHECK(dup && dt_pg_size(dup) == size && dt_pg_rank(dup) == rank, "dup shape");
    size_t n = 100000; /* past the small-message slot */
    float *a = malloc(n * sizeof *a), *g = malloc(n * size * sizeof *g), *mine = malloc(n * sizeof *mine);
    TH_CHECK(a && g && mine, "oom");
    for (size_t i = 0; i < n; i++) {
        a[i] = (float)(rank + 1);
        mine[i] = (float)(rank * 1000 + (int)(i % 1000));
    }
    dt_req *ar = NULL, *ag = NULL;
    if (rank != 0)
        TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, a, n, DT_F32, DT_REDUCE_SUM, &ar));
    TH_OK(dt_pg_allgather_async(dup, mine, g, n, DT_F32, &ag));
    TH_OK(dt_req_wait(ag, 60));
    dt_req_free(ag);
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < n; i += 997)
            TH_CHECK(g[(size_t)r * n + i] == (float)(r * 1000 + (int)(i % 1000)), "gather");
    if (rank != 0) {
        TH_CHECK(dt_req_test(ar) == DT_INPROGRESS, "the all-reduce finished without rank 0");
        th_shared[1 + rank] = 1;
    } else {
        for (int r = 1; r < size; r++) {
            TH_WAIT_UNTIL(th_shared[1 + r] != 0, 60000);
            TH_CHECK(th_shared[1 + r] != 0, "rank %d never checked", r);
        }
        TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, a, n, DT_F32, DT_REDUCE_SUM, &ar));
    }
    TH_OK(dt_req_wait(ar, -1));
    dt_req_free(ar);
    float want = (float)(size * (size + 1) / 2);
    for (size_t i = 0; i < n; i += 101)
        TH_CHECK(a[i] == want, "allreduce %g want %g", a[i], want);
    dt_pg_free(dup);
    dt_pg_free(pg);
    free(a);
    free(g);
    free(mine);
    return 0;
}

TEST(dup_request_completes_while_parent_waits_for_late_peer)
{
    ASSERT_EQ_INT(th_run(2, 120, concurrent_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 120, concurrent_body, NULL, NULL), 0);
}

/* ---- split ---------------------------------------------------------------- */

typedef struct {
    int rows, cols;
} mesh_arg;

static int mesh_body(int rank, int size, void *argp)
{
    const mesh_arg *m = argp;
    dt_pg *pg, *row, *col, *rev, *none;
    TH_OK(th_pg(rank, size, NULL, &pg));
    int r = rank / m->cols, c = rank % m->cols;
    /* A parent all-reduce in flight while the mesh is used. */
    size_t n = 50001;
    double *big = malloc(n * sizeof *big);
    TH_CHECK(big, "oom");
    for (size_t i = 0; i < n; i++)
        big[i] = rank + (double)i;
    dt_req *pr;
    TH_OK(dt_pg_split(pg, r, c, &row));
    TH_OK(dt_pg_split(pg, c, r, &col));
    TH_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, big, n, DT_F64, DT_REDUCE_SUM, &pr));
    TH_CHECK(row && dt_pg_size(row) == m->cols && dt_pg_rank(row) == c, "row group");
    TH_CHECK(col && dt_pg_size(col) == m->rows && dt_pg_rank(col) == r, "col group");
    int64_t v = rank, rs = 0, cs = 0;
    TH_OK(dt_pg_allreduce(row, &v, &rs, 1, DT_I64, DT_REDUCE_SUM));
    TH_OK(dt_pg_allreduce(col, &v, &cs, 1, DT_I64, DT_REDUCE_SUM));
    int64_t want_r = 0, want_c = 0;
    for (int k = 0; k < m->cols; k++)
        want_r += r * m->cols + k;
    for (int k = 0; k < m->rows; k++)
        want_c += k * m->cols + c;
    TH_CHECK(rs == want_r && cs == want_c, "row sum %lld (want %lld), col sum %lld (want %lld)",
             (long long)rs, (long long)want_r, (long long)cs, (long long)want_c);
    /* Larger data on the row group (staged path) concurrently with pg. */
    size_t rn = 30011;
    float *rb = malloc(rn * sizeof *rb);
    TH_CHECK(rb, "oom");
    for (size_t i = 0; i < rn; i++)
        rb[i] = (float)c;
    TH_OK(dt_pg_allreduce(row, DT_IN_PLACE, rb, rn, DT_F32, DT_REDUCE_MAX));
    for (size_t i = 0; i < rn; i += 7)
        TH_CHECK(rb[i] == (float)(m->cols - 1), "row max");
    free(rb);
    TH_OK(dt_req_wait(pr, -1));
    dt_req_free(pr);
    double wsum0 = (double)size * (size - 1) / 2;
    for (size_t i = 0; i < n; i += 1009)
        TH_CHECK(big[i] == wsum0 + size * (double)i, "parent allreduce [%zu]", i);
    free(big);
    /* Keys reverse the order; ties keep the parent order; color < 0 = none. */
    TH_OK(dt_pg_split(pg, 0, -rank, &rev));
    TH_CHECK(rev && dt_pg_rank(rev) == size - 1 - rank, "reversed rank %d", dt_pg_rank(rev));
    int got = -1;
    int32_t ranks[8];
    TH_OK(dt_pg_allgather(rev, &rank, ranks, 1, DT_I32));
    for (int k = 0; k < size; k++)
        TH_CHECK(ranks[k] == size - 1 - k, "rev order [%d] = %d", k, ranks[k]);
    (void)got;
    TH_OK(dt_pg_split(pg, rank % 2 ? 5 : DT_PG_NO_COLOR, 7, &none));
    TH_CHECK((rank % 2) ? none != NULL : none == NULL, "color < 0 gets no group");
    if (none)
        TH_CHECK(dt_pg_rank(none) == rank / 2 && dt_pg_size(none) == size / 2, "odd group");
    dt_pg_free(none);
    dt_pg_free(rev);
    dt_pg_free(col);
    dt_pg_free(row);
    dt_pg_free(pg);
    return 0;
}

TEST(split_2x2_and_2x3_meshes)
{
    mesh_arg a22 = {2, 2}, a23 = {2, 3}, a11 = {1, 1};
    ASSERT_EQ_INT(th_run(4, 120, mesh_body, &a22, NULL), 0);
    ASSERT_EQ_INT(th_run(6, 120, mesh_body, &a23, NULL), 0);
    ASSERT_EQ_INT(th_run(1, 60, mesh_body, &a11, NULL), 0); /* self backend */
}

TEST(split_null_arguments)
{
    dt_pg *out = (dt_pg *)1;
    ASSERT_STATUS(dt_pg_split(NULL, 0, 0, &out), DT_ERR_NULL);
    ASSERT(out == (dt_pg *)1 || out == NULL);
    ASSERT_STATUS(dt_pg_dup(NULL, &out), DT_ERR_NULL);
}

int main(void)
{
    RUN(split_null_arguments);
    RUN(ring_64mib_recv_posted_first);
    RUN(ring_64mib_send_posted_first);
    RUN(alltoall_of_posted_sends_then_recvs);
    RUN(unmatched_recv_times_out);
    RUN(dup_request_completes_while_parent_waits_for_late_peer);
    RUN(split_2x2_and_2x3_meshes);
    return TEST_REPORT();
}
