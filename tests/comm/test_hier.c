/* Hierarchical all-reduce with simulated nodes (DT_SIM_LOCAL_SIZE), forked
 * ranks on the shm backend: 2 nodes x 2 ranks and 2 x 3 (the ISSUE's
 * shapes), 3 x 2, an uneven 3 + 2 (local rank 0s only across nodes) and the
 * degenerate cases (one node; one rank per node) that stay flat. Every case
 * is compared with the flat all-reduce (tests/comm/hier_check.h: bit for bit
 * on exact inputs, within the stated bound on inexact ones). Also: node
 * detection without simulation (one machine = one node), a bad
 * DT_SIM_LOCAL_SIZE failing on every rank instead of hanging, and counts
 * that differ between ranks failing with DT_ERR_MISMATCH, not a hang. */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "comm/harness.h"
#include "comm/hier_check.h"
#include "test.h"

typedef struct {
    int nodes, per_node; /* expected topology (per_node 0: not checked) */
    int quick;           /* hc_run's quick set */
} shape;

static int body(int rank, int size, void *arg)
{
    const shape *s = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    int fails = hc_run(pg, s->nodes, s->per_node, s->quick);
    dt_pg_free(pg);
    return fails ? 1 : 0;
}

static int run_sim(int W, const char *sim, int nodes, int per_node)
{
    setenv("DT_SIM_LOCAL_SIZE", sim, 1);
    shape s = {nodes, per_node, 0};
    int rc = th_run(W, 90, body, &s, NULL);
    unsetenv("DT_SIM_LOCAL_SIZE");
    return rc;
}

TEST(two_by_two) { ASSERT_EQ_INT(run_sim(4, "2", 2, 2), 0); }
TEST(two_by_three) { ASSERT_EQ_INT(run_sim(6, "3", 2, 3), 0); }
TEST(three_by_two) { ASSERT_EQ_INT(run_sim(6, "2", 3, 2), 0); }
/* 5 ranks in nodes of 3: nodes of 3 and 2, unequal: rooted variant */
TEST(uneven_nodes) { ASSERT_EQ_INT(run_sim(5, "3", 2, 0), 0); }
/* The all-reduce pipeline in chunks of 1 KiB ($DT_HIER_CHUNK_KB; 4 MiB by
 * default, so the cases above are one chunk up to 1 Mi elements): many
 * chunks, a short last chunk, a remainder in the last chunk only, rings of
 * 2 and 3 nodes; still equal to the flat all-reduce. */
static int run_chunked(int W, const char *sim, int nodes, int per_node)
{
    setenv("DT_SIM_LOCAL_SIZE", sim, 1);
    setenv("DT_HIER_CHUNK_KB", "1", 1);
    shape s = {nodes, per_node, 1};
    int rc = th_run(W, 90, body, &s, NULL);
    unsetenv("DT_HIER_CHUNK_KB");
    unsetenv("DT_SIM_LOCAL_SIZE");
    return rc;
}
TEST(chunked_pipeline)
{
    ASSERT_EQ_INT(run_chunked(6, "3", 2, 3), 0);
    ASSERT_EQ_INT(run_chunked(6, "2", 3, 2), 0);
}

/* one node, and one rank per node: the all-reduce stays flat */
TEST(degenerate_stay_flat)
{
    ASSERT_EQ_INT(run_sim(3, "3", 1, 3), 0);
    ASSERT_EQ_INT(run_sim(3, "1", 3, 1), 0);
}

/* Without simulation every forked rank is on this machine: one node. */
static int detect_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pg_topo t;
    TH_OK(dt_pg_topology(pg, &t));
    TH_CHECK(t.nnodes == 1 && t.node == 0 && t.local_rank == rank && t.local_size == size &&
                 t.homogeneous && !t.simulated,
             "nnodes %d node %d local %d/%d", t.nnodes, t.node, t.local_rank, t.local_size);
    dt_pg *h;
    TH_OK(dt_pg_hierarchical(pg, &h));
    TH_CHECK(!dt_pg_is_hierarchical(h), "one node must stay flat");
    dt_pg_free(h);
    dt_pg_free(pg);
    return 0;
}

TEST(one_machine_is_one_node)
{
    unsetenv("DT_SIM_LOCAL_SIZE");
    ASSERT_EQ_INT(th_run(3, 30, detect_body, NULL, NULL), 0);
}

/* Rank 1 has a malformed DT_SIM_LOCAL_SIZE: every rank gets the error. */
static int bad_env_body(int rank, int size, void *arg)
{
    (void)arg;
    setenv("DT_SIM_LOCAL_SIZE", rank == 1 ? "two" : "2", 1);
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pg *h = NULL;
    dt_status st = dt_pg_hierarchical(pg, &h);
    TH_CHECK(st == DT_ERR_INVALID_ARG && h == NULL, "status %s", dt_status_name(st));
    TH_CHECK(strstr(dt_last_error(), "DT_SIM_LOCAL_SIZE") != NULL, "message: %s", dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(bad_sim_env_fails_everywhere) { ASSERT_EQ_INT(th_run(4, 30, bad_env_body, NULL, NULL), 0); }

/* $DT_HIER_CHUNK_KB malformed on rank 2 (every rank gets an error naming
 * it), or different between ranks (DT_ERR_MISMATCH everywhere). */
static int bad_chunk_body(int rank, int size, void *arg)
{
    int differ = *(const int *)arg;
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    setenv("DT_HIER_CHUNK_KB", rank == 2 ? (differ ? "64" : "0") : "32", 1);
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_pg *h = NULL;
    dt_status st = dt_pg_hierarchical(pg, &h);
    TH_CHECK(st == (differ ? DT_ERR_MISMATCH : DT_ERR_INVALID_ARG) && h == NULL, "status %s",
             dt_status_name(st));
    TH_CHECK(strstr(dt_last_error(), "DT_HIER_CHUNK_KB") != NULL, "message: %s", dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(bad_chunk_env_fails_everywhere)
{
    int differ = 0;
    ASSERT_EQ_INT(th_run(4, 30, bad_chunk_body, &differ, NULL), 0);
    differ = 1;
    ASSERT_EQ_INT(th_run(4, 30, bad_chunk_body, &differ, NULL), 0);
    unsetenv("DT_HIER_CHUNK_KB");
}

/* Rank 3 all-reduces one element more than the others: an error on every
 * rank (the subgroups' cross-rank check), within the timeout, not a hang. */
static int mismatch_body(int rank, int size, void *arg)
{
    (void)arg;
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    dt_pg_params p = dt_pg_params_default();
    p.rank = rank;
    p.world_size = size;
    p.job_id = th_job;
    p.backend = "shm";
    p.timeout_s = 5;
    dt_pg *pg;
    TH_OK(dt_pg_init(&p, &pg));
    dt_pg *h;
    TH_OK(dt_pg_hierarchical(pg, &h));
    float v[64] = {0};
    dt_status st = dt_pg_allreduce(h, DT_IN_PLACE, v, rank == 3 ? 41 : 40, DT_F32, DT_REDUCE_SUM);
    TH_CHECK(st == DT_ERR_MISMATCH || st == DT_ERR_PEER_FAILED || st == DT_ERR_TIMEOUT,
             "status %s: %s", dt_status_name(st), dt_last_error());
    TH_CHECK(dt_pg_status(h) < 0, "the hierarchical group must be marked failed");
    dt_pg_free(h);
    dt_pg_free(pg);
    return 0;
}

TEST(mismatched_counts_fail)
{
    int codes[4];
    ASSERT_EQ_INT(th_run(4, 40, mismatch_body, NULL, codes), 0);
}

int main(void)
{
    RUN(two_by_two);
    RUN(two_by_three);
    RUN(three_by_two);
    RUN(uneven_nodes);
    RUN(chunked_pipeline);
    RUN(degenerate_stay_flat);
    RUN(one_machine_is_one_node);
    RUN(bad_sim_env_fails_everywhere);
    RUN(bad_chunk_env_fails_everywhere);
    RUN(mismatched_counts_fail);
    return TEST_REPORT();
}
