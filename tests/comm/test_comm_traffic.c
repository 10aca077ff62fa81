/* The backend's byte counters (dt_pg_traffic_read) on shm: exact counts for
 * collectives whose traffic the algorithm fixes, per peer and across
 * (simulated) nodes, subgroups adding to the world group's counts, and the
 * argument errors. Reading is local: rank 0 reads while the others wait in
 * a barrier it has not entered. */
// dt-test-timeout: 240
#include "harness.h"
#include "test.h"

#define N_BIG (1u << 20) /* f32 elements: 4 MiB, past the slot, chunks of equal size */
#define N_SMALL 100u     /* fits the slot */

/* After a barrier: bytes that peers pull are counted when they pull, and a
 * rank may complete an operation before the peers have read its part. */
static int read_peers(dt_pg *pg, uint64_t *peer, dt_pg_traffic *t)
{
    dt_status st = dt_pg_barrier(pg);
    if (st >= 0)
        st = dt_pg_traffic_read(pg, t, peer, dt_pg_size(pg));
    return st < 0 ? -1 : 0;
}

/* All-reduce of N_BIG floats (direct or ring, as DT_SHM_ALGO says; arg =
 * "ring" for the ring), then N_SMALL through the slots: the bytes per peer
 * are what the algorithm moves. */
static int body_allreduce(int rank, int size, void *arg)
{
    int ring = arg != NULL;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pg_topo topo;
    TH_OK(dt_pg_topology(pg, &topo));
    uint64_t p0[8], p1[8], p2[8];
    dt_pg_traffic t0, t1, t2;
    TH_CHECK(read_peers(pg, p0, &t0) == 0, "read: %s", dt_last_error());
    TH_CHECK(t0.counted == 1 && t0.nodes_known == 1, "counted %d nodes_known %d", t0.counted,
             t0.nodes_known);
    float *x = malloc(N_BIG * sizeof *x);
    TH_CHECK(x != NULL, "oom");
    for (uint32_t i = 0; i < N_BIG; i++)
        x[i] = (float)(rank + 1);
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, N_BIG, DT_F32, DT_REDUCE_SUM));
    TH_CHECK(x[N_BIG - 1] == (float)(size * (size + 1) / 2), "sum %g", (double)x[N_BIG - 1]);
    TH_CHECK(read_peers(pg, p1, &t1) == 0, "read: %s", dt_last_error());
    uint64_t share = (uint64_t)N_BIG * 4 / (uint64_t)size; /* one chunk, bytes */
    uint64_t want_total = 2 * (uint64_t)(size - 1) * share;
    TH_CHECK(t1.sent - t0.sent == want_total, "all-reduce of %u f32 on %d ranks: sent %llu, want %llu",
             N_BIG, size, (unsigned long long)(t1.sent - t0.sent), (unsigned long long)want_total);
    for (int j = 0; j < size; j++) {
        uint64_t want = j == rank ? 0 : ring ? (j == (rank + 1) % size ? want_total : 0) : 2 * share;
        TH_CHECK(p1[j] - p0[j] == want, "to rank %d: %llu, want %llu", j,
                 (unsigned long long)(p1[j] - p0[j]), (unsigned long long)want);
    }
    /* nodes of 2 ($DT_SIM_LOCAL_SIZE=2 on 4 ranks): what went to the other node */
    uint64_t cross = 0;
    for (int j = 0; j < size; j++)
        if (j / 2 != rank / 2 && topo.nnodes == 2)
            cross += p1[j] - p0[j];
    TH_CHECK(t1.sent_cross_node - t0.sent_cross_node == cross, "cross-node %llu, want %llu",
             (unsigned long long)(t1.sent_cross_node - t0.sent_cross_node), (unsigned long long)cross);
    TH_CHECK(topo.nnodes == 1 || ring || cross > 0, "no cross-node bytes on %d nodes", topo.nnodes);
    /* small: every peer reads this rank's slot */
    TH_OK(dt_pg_allreduce(pg, DT_IN_PLACE, x, N_SMALL, DT_F32, DT_REDUCE_SUM));
    TH_CHECK(read_peers(pg, p2, &t2) == 0, "read: %s", dt_last_error());
    for (int j = 0; j < size; j++) {
        uint64_t want = j == rank ? 0 : N_SMALL * 4;
        TH_CHECK(p2[j] - p1[j] == want, "small: to rank %d: %llu, want %llu", j,
                 (unsigned long long)(p2[j] - p1[j]), (unsigned long long)want);
    }
    free(x);
    dt_pg_free(pg);
    return 0;
}

/* A subgroup's traffic shows in the world group's counts, at world ranks;
 * a freed subgroup's bytes stay counted. */
static int body_subgroup(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg, *sub;
    TH_OK(th_pg(rank, size, NULL, &pg));
    TH_OK(dt_pg_split(pg, rank % 2, rank, &sub)); /* {0, 2}, {1, 3} */
    uint64_t p0[4], p1[4], s1[2];
    dt_pg_traffic t0, t1, ts;
    TH_CHECK(read_peers(pg, p0, &t0) == 0, "read: %s", dt_last_error());
    float *x = calloc(N_BIG, sizeof *x);
    TH_CHECK(x != NULL, "oom");
    TH_OK(dt_pg_allreduce(sub, DT_IN_PLACE, x, N_BIG, DT_F32, DT_REDUCE_SUM));
    TH_CHECK(dt_pg_traffic_read(sub, &ts, s1, 2) >= 0, "%s", dt_last_error());
    int partner = (rank + 2) % 4;
    TH_CHECK(s1[1 - dt_pg_rank(sub)] >= (uint64_t)N_BIG * 4, "subgroup's own view: %llu",
             (unsigned long long)s1[1 - dt_pg_rank(sub)]);
    dt_pg_free(sub);
    TH_CHECK(read_peers(pg, p1, &t1) == 0, "read: %s", dt_last_error());
    for (int j = 0; j < size; j++) {
        uint64_t want = j == partner ? (uint64_t)N_BIG * 4 : 0; /* 2 (W-1)/W of 4N at W = 2 */
        TH_CHECK(p1[j] - p0[j] == want, "to world rank %d: %llu, want %llu", j,
                 (unsigned long long)(p1[j] - p0[j]), (unsigned long long)want);
    }
    free(x);
    dt_pg_free(pg);
    return 0;
}

/* Reading is local: rank 0 reads (many times) while the others already
 * wait in a barrier; the counts do not move. */
static int body_local(int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    if (rank == 0) {
        dt_pg_traffic a, b;
        TH_OK(dt_pg_traffic_read(pg, &a, NULL, 0));
        for (int i = 0; i < 1000; i++)
            TH_OK(dt_pg_traffic_read(pg, &b, NULL, 0));
        TH_CHECK(a.sent == b.sent && a.counted && !a.nodes_known, "moved: %llu -> %llu",
                 (unsigned long long)a.sent, (unsigned long long)b.sent);
        uint64_t one[1];
        TH_CHECK(dt_pg_traffic_read(pg, &a, one, 1) == DT_ERR_INVALID_ARG, "short per_peer accepted");
        TH_CHECK(strstr(dt_last_error(), "per_peer"), "message: %s", dt_last_error());
        TH_CHECK(dt_pg_traffic_read(pg, NULL, NULL, 0) == DT_ERR_NULL, "NULL out accepted");
        TH_CHECK(dt_pg_traffic_read(NULL, &a, NULL, 0) == DT_ERR_NULL, "NULL pg accepted");
    }
    TH_OK(dt_pg_barrier(pg));
    dt_pg_free(pg);
    return 0;
}

TEST(allreduce_direct_exact)
{
    unsetenv("DT_SHM_ALGO");
    unsetenv("DT_SIM_LOCAL_SIZE");
    ASSERT_EQ_INT(th_run(2, 120.0, body_allreduce, NULL, NULL), 0);
    setenv("DT_SIM_LOCAL_SIZE", "2", 1); /* 2 nodes of 2 */
    ASSERT_EQ_INT(th_run(4, 120.0, body_allreduce, NULL, NULL), 0);
    unsetenv("DT_SIM_LOCAL_SIZE");
}

TEST(allreduce_ring_per_peer)
{
    setenv("DT_SHM_ALGO", "allreduce:ring", 1);
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    int rc = th_run(4, 120.0, body_allreduce, (void *)"ring", NULL);
    unsetenv("DT_SHM_ALGO");
    unsetenv("DT_SIM_LOCAL_SIZE");
    ASSERT_EQ_INT(rc, 0);
}

TEST(subgroup_counts_in_world)
{
    ASSERT_EQ_INT(th_run(4, 120.0, body_subgroup, NULL, NULL), 0);
}

TEST(read_is_local_and_checked)
{
    ASSERT_EQ_INT(th_run(2, 60.0, body_local, NULL, NULL), 0);
}

int main(void)
{
    RUN(allreduce_direct_exact);
    RUN(allreduce_ring_per_peer);
    RUN(subgroup_counts_in_world);
    RUN(read_is_local_and_checked);
    return TEST_REPORT();
}
