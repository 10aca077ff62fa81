/* Group layer without peers: rank discovery and its precedence, backend
 * strings, the registry (custom backends, unsupported operations), requests,
 * and every collective on the `self` backend. */
// dt-test-timeout: 60
// dt-test-labels: threads
#include "dtrain/comm.h"
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const char *k_vars[] = {
    "DT_RANK", "DT_WORLD_SIZE", "DT_LOCAL_RANK", "DT_LOCAL_WORLD_SIZE", "DT_JOB_ID",
    "DT_RESTART_COUNT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_STEP_ID", "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID", "DT_BACKEND",
    "DT_COMM_TIMEOUT", "DT_INIT_TIMEOUT", "DT_COMM_CHECK", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE",
};

static void clear_env(void)
{
    for (size_t i = 0; i < sizeof k_vars / sizeof k_vars[0]; i++)
        unsetenv(k_vars[i]);
}

/* A probe backend that records what init saw and fails on purpose. */
static dt_backend_info g_seen;
static char g_seen_job[160], g_seen_addr[256], g_seen_opts[64];
static dt_status probe_init(const dt_backend_info *info, void **ctx)
{
    g_seen = *info;
    snprintf(g_seen_job, sizeof g_seen_job, "%s", info->job_id);
    snprintf(g_seen_addr, sizeof g_seen_addr, "%s", info->master_addr);
    snprintf(g_seen_opts, sizeof g_seen_opts, "%s", info->options);
    *ctx = NULL;
    return dt_error(DT_ERR_UNSUPPORTED, "probe: not a real backend");
}
static void probe_free(void *ctx) { (void)ctx; }
static dt_status probe_run(void *ctx, const dt_coll *c)
{
    (void)ctx;
    (void)c;
    return DT_OK;
}
static const dt_backend_ops k_probe = {
    .version = DT_BACKEND_VERSION, .name = "probe", .init = probe_init,
    .free = probe_free, .run = probe_run,
};

/* Discover through the probe: returns init's view. */
static dt_status discover(dt_pg_params *p)
{
    dt_pg *pg = NULL;
    memset(&g_seen, 0xff, sizeof g_seen);
    dt_pg_params q = p ? *p : dt_pg_params_default();
    q.backend = "probe";
    dt_status st = dt_pg_init(&q, &pg);
    if (st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "probe: not a real"))
        return DT_OK;
    return st;
}

TEST(discovery_precedence)
{
    ASSERT_OK(dt_backend_register(&k_probe));
    clear_env();
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.rank, 0);
    ASSERT_EQ_INT(g_seen.world_size, 1);

    /* SLURM outside a step is ignored; inside a step it counts. */
    setenv("SLURM_PROCID", "3", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x1),6", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.world_size, 1);
    setenv("SLURM_STEP_ID", "0", 1);
    setenv("SLURM_JOB_ID", "77", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.rank, 3);
    ASSERT_EQ_INT(g_seen.world_size, 8);
    ASSERT_EQ_INT(g_seen.local_rank, 1);
    ASSERT_EQ_INT(g_seen.local_world_size, 6);
    ASSERT_STR_EQ(g_seen_job, "slurm.77.0");

    /* A malformed SLURM_TASKS_PER_NODE, or one without an entry for this
     * node, is an error naming it (a zero repeat passed, and idx + repeat
     * overflowed, undefined behaviour, for huge repeats). */
    static const char *const bad_tpn[][3] = {
        {"-1", "2,3", "SLURM_NODEID"},
        {"0", "2(x0),6", "has no entry for SLURM_NODEID"},
        {"1", "2(x1", "has no entry for SLURM_NODEID"},
        {"2", "2(x1),6", "has no entry for SLURM_NODEID"},
        {"0", "-2,6", "has no entry for SLURM_NODEID"},
        {"2147483647", "1(x2147483647)", "has no entry for SLURM_NODEID"},
    };
    for (size_t i = 0; i < sizeof bad_tpn / sizeof bad_tpn[0]; i++) {
        setenv("SLURM_NODEID", bad_tpn[i][0], 1);
        setenv("SLURM_TASKS_PER_NODE", bad_tpn[i][1], 1);
        ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), bad_tpn[i][2]);
    }
    setenv("SLURM_NODEID", "10", 1);
    setenv("SLURM_TASKS_PER_NODE", "1(x5),6(x9223372036854775807)", 1);
    ASSERT_OK(discover(NULL)); /* nodes 0-4 run 1 task, nodes from 5 on run 6 */
    ASSERT_EQ_INT(g_seen.local_world_size, 6);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "2(x1),6", 1);

    setenv("PMI_RANK", "2", 1);
    setenv("PMI_SIZE", "4", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.rank, 2);
    ASSERT_EQ_INT(g_seen.world_size, 4);
    ASSERT_EQ_INT(g_seen.local_world_size, 4);

    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.rank, 1);
    ASSERT_EQ_INT(g_seen.world_size, 6);
    ASSERT_EQ_INT(g_seen.local_world_size, 3);

    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "7", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "7", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29501", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.rank, 5);
    ASSERT_EQ_INT(g_seen.world_size, 7);
    ASSERT_STR_EQ(g_seen_addr, "127.0.0.1");
    ASSERT_EQ_INT(g_seen.master_port, 29501);

    /* dtrain's own variables win and must agree with RANK/WORLD_SIZE. */
    setenv("DT_RANK", "5", 1);
    setenv("DT_WORLD_SIZE", "7", 1);
    setenv("DT_LOCAL_RANK", "5", 1);
    setenv("DT_LOCAL_WORLD_SIZE", "7", 1);
    setenv("DT_JOB_ID", "abc", 1);
    setenv("DT_RESTART_COUNT", "2", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.local_rank, 5);
    ASSERT_STR_EQ(g_seen_job, "abc");
    setenv("DT_RANK", "4", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "DT_RANK=4");

    /* Explicit params beat everything. */
    dt_pg_params p = dt_pg_params_default();
    p.rank = 1;
    p.world_size = 2;
    p.job_id = "mine";
    ASSERT_OK(discover(&p));
    ASSERT_EQ_INT(g_seen.rank, 1);
    ASSERT_EQ_INT(g_seen.world_size, 2);
    ASSERT_EQ_INT(g_seen.local_world_size, 2);
    ASSERT_STR_EQ(g_seen_job, "mine");
    clear_env();
}

TEST(discovery_errors)
{
    clear_env();
    setenv("RANK", "3", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "WORLD_SIZE");
    setenv("WORLD_SIZE", "3", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG); /* rank >= size */
    ASSERT_STR_CONTAINS(dt_last_error(), "RANK=3");
    setenv("WORLD_SIZE", "x4", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "not an integer");
    /* One strict parser: no leading space, no trailing text, no truncation
     * of 2^32 + 2 to 2, no wrap. */
    static const char *bad_ws[] = {" 4", "4 ", "4x", "+4", "abc", "0", "-4", "4294967298",
                                   "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad_ws / sizeof bad_ws[0]; i++) {
        setenv("WORLD_SIZE", bad_ws[i], 1);
        ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "WORLD_SIZE");
        int ws = -1;
        ASSERT_STATUS(dt_pg_env_world_size(&ws), DT_ERR_INVALID_ARG);
        ASSERT_EQ_INT(ws, -1);
    }
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "4294967296", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "RANK");
    setenv("RANK", "3", 1);
    int ws = -1;
    ASSERT_OK(dt_pg_env_world_size(&ws));
    ASSERT_EQ_INT(ws, 4);
    setenv("LOCAL_RANK", "2", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG); /* local rank >= local size */
    setenv("LOCAL_WORLD_SIZE", "5", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG); /* local size > size */
    unsetenv("LOCAL_WORLD_SIZE");
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG); /* half-set local info */
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.local_rank, 2);
    setenv("MASTER_PORT", "70000", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    clear_env();

    dt_pg_params p = dt_pg_params_default();
    p.rank = 2;
    p.world_size = 2;
    ASSERT_STATUS(discover(&p), DT_ERR_INVALID_ARG);
    p.rank = 0;
    p.local_world_size = 3;
    ASSERT_STATUS(discover(&p), DT_ERR_INVALID_ARG);

    setenv("DT_COMM_TIMEOUT", "soon", 1);
    ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
    /* NaN compares false with every deadline: it would disable the timeout. */
    static const char *bad_t[] = {"nan", "inf", "-inf", "0", "-1", " 2", "1e999"};
    for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
        setenv("DT_COMM_TIMEOUT", bad_t[i], 1);
        ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "DT_COMM_TIMEOUT");
    }
    setenv("DT_COMM_TIMEOUT", "2.5", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_NEAR(g_seen.timeout_s, 2.5, 0, 0);
    ASSERT_NEAR(g_seen.init_timeout_s, 2.5, 0, 0); /* the start-up bound defaults to it */
    /* the start-up's own bound, checked the same way */
    for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
        setenv("DT_INIT_TIMEOUT", bad_t[i], 1);
        ASSERT_STATUS(discover(NULL), DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "DT_INIT_TIMEOUT");
    }
    setenv("DT_INIT_TIMEOUT", "40", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_NEAR(g_seen.timeout_s, 2.5, 0, 0);
    ASSERT_NEAR(g_seen.init_timeout_s, 40, 0, 0);
    clear_env();
    ASSERT_OK(discover(NULL));
    ASSERT_NEAR(g_seen.timeout_s, 300, 0, 0);
    ASSERT_NEAR(g_seen.init_timeout_s, 300, 0, 0);
    ASSERT_EQ_INT(g_seen.check, 1);
    setenv("DT_COMM_CHECK", "0", 1);
    ASSERT_OK(discover(NULL));
    ASSERT_EQ_INT(g_seen.check, 0);
    clear_env();
}

TEST(backend_strings)
{
    char name[32], opt[64];
    ASSERT_OK(dt_backend_parse("shm", "cpu", name, sizeof name, opt, sizeof opt));
    ASSERT_STR_EQ(name, "shm");
    ASSERT_STR_EQ(opt, "");
    ASSERT_OK(dt_backend_parse("cuda:nccl,cpu:shm?algo=ring", "cpu", name, sizeof name, opt,
                               sizeof opt));
    ASSERT_STR_EQ(name, "shm");
    ASSERT_STR_EQ(opt, "algo=ring");
    ASSERT_OK(dt_backend_parse("cpu:shm,cuda:nccl", "cuda", name, sizeof name, opt, sizeof opt));
    ASSERT_STR_EQ(name, "nccl");
    ASSERT_STATUS(dt_backend_parse("cuda:nccl", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_backend_parse("", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_backend_parse("cpu:shm,cpu:mpi", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_backend_parse("cpu:", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_backend_parse(":shm", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_backend_parse("shm,", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_backend_parse("Shm", "cpu", name, sizeof name, opt, sizeof opt),
                  DT_ERR_INVALID_ARG);

    clear_env();
    dt_pg *pg = NULL;
    dt_pg_params p = dt_pg_params_default();
    p.backend = "nosuch";
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "nosuch");
    ASSERT_STR_CONTAINS(dt_last_error(), "self");
    p.backend = "cpu:self,cuda:nccl";
    ASSERT_OK(dt_pg_init(&p, &pg));
    ASSERT_STR_EQ(dt_pg_backend(pg), "self");
    dt_pg_free(pg);
    setenv("DT_BACKEND", "cpu:probe", 1);
    ASSERT_OK(discover(NULL) == DT_OK ? DT_OK : DT_ERR_INTERNAL);
    /* the default for one process is self */
    clear_env();
    ASSERT_OK(dt_pg_init(NULL, &pg));
    ASSERT_STR_EQ(dt_pg_backend(pg), "self");
    ASSERT_EQ_INT(dt_pg_rank(pg), 0);
    ASSERT_EQ_INT(dt_pg_size(pg), 1);
    dt_pg_free(pg);
    /* self refuses more than one rank */
    p = dt_pg_params_default();
    p.rank = 0;
    p.world_size = 2;
    p.backend = "self";
    ASSERT_STATUS(dt_pg_init(&p, &pg), DT_ERR_INVALID_ARG);
}

/* A backend that only does allreduce (sum of one rank = copy) to check the
 * registry, kinds and the unsupported message. */
static int g_runs;
static dt_status mini_init(const dt_backend_info *info, void **ctx)
{
    (void)info;
    *ctx = &g_runs;
    return DT_OK;
}
static dt_status mini_run(void *ctx, const dt_coll *c)
{
    (*(int *)ctx)++;
    if (!c->in_place)
        memcpy(c->recv, c->send, c->count * dt_dtype_size(c->dtype));
    return DT_OK;
}
static const dt_backend_ops k_mini = {
    .version = DT_BACKEND_VERSION, .name = "mini", .init = mini_init, .free = probe_free,
    .run = mini_run, .kinds = 1u << DT_COLL_ALLREDUCE,
};

TEST(registry)
{
    dt_backend_ops bad = k_mini;
    bad.version = 99;
    ASSERT_STATUS(dt_backend_register(&bad), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "version");
    bad = k_mini;
    bad.run = NULL;
    ASSERT_STATUS(dt_backend_register(&bad), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "run");
    bad = k_mini;
    bad.name = "Bad Name";
    ASSERT_STATUS(dt_backend_register(&bad), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_backend_register(&k_mini));
    ASSERT(dt_backend_find("mini") != NULL);
    ASSERT(dt_backend_find("self") != NULL);
    char list[256];
    ASSERT_STR_CONTAINS(dt_backend_list(list, sizeof list), "mini");

    clear_env();
    dt_pg_params p = dt_pg_params_default();
    p.backend = "mini";
    dt_pg *pg;
    ASSERT_OK(dt_pg_init(&p, &pg));
    float a[3] = {1, 2, 3}, b[3] = {0};
    g_runs = 0;
    ASSERT_OK(dt_pg_allreduce(pg, a, b, 3, DT_F32, DT_REDUCE_SUM));
    ASSERT_EQ_INT(g_runs, 1);
    ASSERT_NEAR(b[2], 3, 0, 0);
    ASSERT_STATUS(dt_pg_broadcast(pg, a, 3, DT_F32, 0), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "backend 'mini' does not implement broadcast");
    /* unsupported does not break the group */
    ASSERT_OK(dt_pg_status(pg));
    ASSERT_OK(dt_pg_allreduce(pg, a, b, 3, DT_F32, DT_REDUCE_SUM));
    dt_pg *sub;
    int r0 = 0;
    ASSERT_STATUS(dt_pg_subgroup(pg, &r0, 1, &sub), DT_ERR_UNSUPPORTED);
    /* alloc falls back to plain memory */
    void *m = dt_pg_alloc(pg, 100);
    ASSERT(m != NULL);
    dt_pg_dealloc(pg, m);
    dt_pg_free(pg);
}

TEST(requests_and_args)
{
    clear_env();
    dt_pg *pg;
    ASSERT_OK(dt_pg_init(NULL, &pg));
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    dt_req *rq[3] = {NULL, NULL, NULL};
    ASSERT_OK(dt_pg_allreduce_async(pg, x, y, 4, DT_F32, DT_REDUCE_MAX, &rq[0]));
    ASSERT_OK(dt_pg_barrier_async(pg, &rq[1]));
    ASSERT_OK(dt_pg_broadcast_async(pg, y, 4, DT_F32, 0, &rq[2]));
    ASSERT_OK(dt_req_wait_all(rq, 3, -1));
    ASSERT_OK(dt_req_test(rq[0]));
    ASSERT_STR_EQ(dt_req_message(rq[0]), "");
    ASSERT_NEAR(y[3], 4, 0, 0);
    for (int i = 0; i < 3; i++)
        dt_req_free(rq[i]);
    ASSERT_EQ_U64(dt_pg_seq(pg), 3);
    /* free before completion is allowed */
    dt_req *r;
    ASSERT_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, y, 4, DT_F32, DT_REDUCE_SUM, &r));
    dt_req_free(r);
    ASSERT_OK(dt_pg_allreduce_async(pg, DT_IN_PLACE, y, 4, DT_F32, DT_REDUCE_SUM, &r));
    ASSERT_OK(dt_req_wait(r, 10.0));
    dt_req_free(r);

    /* argument errors come back at once, with no request */
    r = (dt_req *)1;
    ASSERT_STATUS(dt_pg_allreduce_async(pg, x, y, 4, DT_DTYPE_COUNT, DT_REDUCE_SUM, &r),
                  DT_ERR_INVALID_ARG);
    ASSERT(r == NULL);
    ASSERT_STATUS(dt_pg_allreduce(pg, x, y, 4, DT_F32, (dt_reduce_op)42), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_allreduce(pg, x, NULL, 4, DT_F32, DT_REDUCE_SUM), DT_ERR_NULL);
    ASSERT_OK(dt_pg_allreduce(pg, NULL, NULL, 0, DT_F32, DT_REDUCE_SUM));
    ASSERT_STATUS(dt_pg_broadcast(pg, x, 4, DT_F32, 1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "root 1 out of range");
    ASSERT_STATUS(dt_pg_send(pg, x, 4, DT_F32, 0), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_allreduce(NULL, x, y, 4, DT_F32, DT_REDUCE_SUM), DT_ERR_NULL);
    ASSERT_STATUS(dt_req_wait(NULL, 0), DT_ERR_NULL);
    dt_req_free(NULL);
    dt_pg_free(NULL);
    dt_pg_free(pg);
}

/* Every collective on `self`: a copy (or nothing in place), values kept. */
TEST(self_collectives)
{
    clear_env();
    dt_pg *pg;
    ASSERT_OK(dt_pg_init(NULL, &pg));
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        size_t es = dt_dtype_size((dt_dtype)d);
        unsigned char in[7 * 8], out[7 * 8];
        for (size_t i = 0; i < sizeof in; i++)
            in[i] = (unsigned char)(i * 7 + 1);
        for (int op = 0; op < DT_REDUCE_OP_COUNT; op++) {
            memset(out, 0, sizeof out);
            ASSERT_OK(dt_pg_allreduce(pg, in, out, 7, (dt_dtype)d, (dt_reduce_op)op));
            ASSERT(memcmp(in, out, 7 * es) == 0);
            memset(out, 0, sizeof out);
            ASSERT_OK(dt_pg_reduce(pg, in, out, 7, (dt_dtype)d, (dt_reduce_op)op, 0));
            ASSERT(memcmp(in, out, 7 * es) == 0);
            memset(out, 0, sizeof out);
            ASSERT_OK(dt_pg_reduce_scatter(pg, in, out, 7, (dt_dtype)d, (dt_reduce_op)op));
            ASSERT(memcmp(in, out, 7 * es) == 0);
        }
        memset(out, 0, sizeof out);
        ASSERT_OK(dt_pg_allgather(pg, in, out, 7, (dt_dtype)d));
        ASSERT(memcmp(in, out, 7 * es) == 0);
        size_t cnt = 5, disp = 2;
        memset(out, 0, sizeof out);
        ASSERT_OK(dt_pg_allgatherv(pg, in, out, &cnt, &disp, (dt_dtype)d));
        ASSERT(memcmp(in, out + 2 * es, 5 * es) == 0);
        memset(out, 0, sizeof out);
        ASSERT_OK(dt_pg_gather(pg, in, out, 7, (dt_dtype)d, 0));
        ASSERT(memcmp(in, out, 7 * es) == 0);
        memset(out, 0, sizeof out);
        ASSERT_OK(dt_pg_scatter(pg, in, out, 7, (dt_dtype)d, 0));
        ASSERT(memcmp(in, out, 7 * es) == 0);
        memset(out, 0, sizeof out);
        ASSERT_OK(dt_pg_alltoall(pg, in, out, 7, (dt_dtype)d));
        ASSERT(memcmp(in, out, 7 * es) == 0);
        memcpy(out, in, sizeof in);
        ASSERT_OK(dt_pg_broadcast(pg, out, 7, (dt_dtype)d, 0));
        ASSERT_OK(dt_pg_allreduce(pg, DT_IN_PLACE, out, 7, (dt_dtype)d, DT_REDUCE_AVG));
        ASSERT(memcmp(in, out, 7 * es) == 0);
    }
    ASSERT_OK(dt_pg_barrier(pg));
    dt_pg *sub = NULL;
    int r0 = 0;
    ASSERT_OK(dt_pg_subgroup(pg, &r0, 1, &sub));
    ASSERT(sub != NULL);
    ASSERT_EQ_INT(dt_pg_size(sub), 1);
    ASSERT_OK(dt_pg_barrier(sub));
    dt_pg_free(sub);
    int bad[2] = {0, 0};
    ASSERT_STATUS(dt_pg_subgroup(pg, bad, 2, &sub), DT_ERR_INVALID_ARG);
    dt_pg_free(pg);
}

/* Two tables under one name, told apart by what their init says. */
static dt_status flip_a_init(const dt_backend_info *info, void **ctx)
{
    (void)info;
    *ctx = NULL;
    return dt_error(DT_ERR_UNSUPPORTED, "flip: table a");
}
static dt_status flip_b_init(const dt_backend_info *info, void **ctx)
{
    (void)info;
    *ctx = NULL;
    return dt_error(DT_ERR_UNSUPPORTED, "flip: table b");
}
static const dt_backend_ops k_flip[2] = {
    {.version = DT_BACKEND_VERSION, .name = "flip", .init = flip_a_init, .free = probe_free,
     .run = probe_run},
    {.version = DT_BACKEND_VERSION, .name = "flip", .init = flip_b_init, .free = probe_free,
     .run = probe_run},
};
static atomic_int g_flip_stop;

static void *flip_register(void *arg)
{
    (void)arg;
    for (int i = 0; !atomic_load(&g_flip_stop); i++)
        dt_backend_register(&k_flip[i & 1]);
    return NULL;
}

/* dt_backend_register is documented thread-safe, and re-registering a name
 * replaces its table in place: a group created meanwhile must get one
 * whole table, a or b. dt_pg_init copied the table after the registry's
 * lock was released, which ThreadSanitizer reported as a race with the
 * re-registration. */
TEST(register_while_creating_groups)
{
    clear_env();
    ASSERT_OK(dt_backend_register(&k_flip[0]));
    atomic_store(&g_flip_stop, 0);
    pthread_t th;
    ASSERT_EQ_INT(pthread_create(&th, NULL, flip_register, NULL), 0);
    dt_pg_params p = dt_pg_params_default();
    p.backend = "flip";
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
        dt_pg *pg = NULL;
        dt_status st = dt_pg_init(&p, &pg);
        if (st != DT_ERR_UNSUPPORTED || pg || !strstr(dt_last_error(), "flip: table "))
            bad++;
    }
    atomic_store(&g_flip_stop, 1);
    pthread_join(th, NULL);
    ASSERT_EQ_INT(bad, 0);
}

int main(void)
{
    RUN(discovery_precedence);
    RUN(discovery_errors);
    RUN(backend_strings);
    RUN(registry);
    RUN(requests_and_args);
    RUN(self_collectives);
    RUN(register_while_creating_groups);
    return TEST_REPORT();
}
