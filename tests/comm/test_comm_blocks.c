/* Strided layouts (comm.h, dt_pg_block): dt_pg_allgather_blocks and
 * dt_pg_alltoall_blocks against the values they must produce, on the shm
 * backend (which copies to and from the layouts itself), on a copy of shm
 * registered without DT_BACKEND_LAYOUTS (the group layer's pack/unpack,
 * what the mpi backend gets), and on self at world size 1; world sizes 1-4
 * and 8; uneven chunks (zero-length ones included) for the all-gather;
 * f32, f16, u8 and f64; messages in the slot, staged in one piece, and
 * staged in many pieces that cut runs; dt_pg_reduce_scatter_blocks (sum,
 * max) likewise (DT_SHM_STAGING_KB=16); the async
 * forms beside another request; and bad arguments. */
// dt-test-timeout: 300
#include "comm/harness.h"
#include "dtrain/mesh.h"
#include "test.h"

static const dt_dtype k_dts[] = {DT_F32, DT_F16, DT_U8, DT_F64};
#define NDT ((int)(sizeof k_dts / sizeof k_dts[0]))

/* A small integer for global element g (exact in every dtype). */
static double gval(size_t g, int salt) { return (double)((g * 7 + (size_t)salt) % 61); }

typedef struct {
    int64_t A, n, B; /* the global [A, n, B]; gathered along n */
    const char *backend;
} ag_case;

static void chunk(int64_t n, int W, int r, int64_t *st, int64_t *len)
{
    dt_chunk_range(n, W, r, st, len);
}

static int ag_body(int rank, int W, void *arg)
{
    const ag_case *k = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, W == 1 ? NULL : k->backend, &pg));
    int64_t A = k->A, n = k->n, B = k->B;
    dt_pg_block rb[8];
    int64_t st, len;
    for (int r = 0; r < W; r++) {
        chunk(n, W, r, &st, &len);
        rb[r] = (dt_pg_block){(size_t)(st * B), (size_t)A, (size_t)(len * B), (size_t)(n * B)};
    }
    chunk(n, W, rank, &st, &len);
    size_t total = (size_t)(A * n * B), mine = (size_t)(A * len * B);
    for (int d = 0; d < NDT; d++) {
        dt_dtype dt = k_dts[d];
        size_t es = dt_dtype_size(dt);
        char *send = malloc(mine * es + 1), *recv = malloc(total * es + 1);
        TH_CHECK(send && recv, "oom");
        size_t i = 0;
        for (int64_t a = 0; a < A; a++)
            for (int64_t x = 0; x < len * B; x++)
                dt_dtype_store(dt, send, i++, gval((size_t)(a * n * B + st * B + x), d));
        for (size_t g = 0; g < total; g++)
            dt_dtype_store(dt, recv, g, 99);
        if (d % 2) {
            dt_req *rq[2];
            float one = 1, cnt = 0;
            TH_OK(dt_pg_allgather_blocks_async(pg, send, recv, rb, dt, &rq[0]));
            TH_OK(dt_pg_allreduce_async(pg, &one, &cnt, 1, DT_F32, DT_REDUCE_SUM, &rq[1]));
            TH_OK(dt_req_wait_all(rq, 2, -1));
            dt_req_free(rq[0]);
            dt_req_free(rq[1]);
            TH_CHECK(cnt == (float)W, "overlapped allreduce %g", cnt);
        } else {
            TH_OK(dt_pg_allgather_blocks(pg, send, recv, rb, dt));
        }
        for (size_t g = 0; g < total; g++)
            TH_CHECK(dt_dtype_load(dt, recv, g) == gval(g, d),
                     "%s allgather_blocks [%lld,%lld,%lld] W=%d %s: [%zu] = %g, want %g",
                     k->backend ? k->backend : "shm", (long long)A, (long long)n, (long long)B, W,
                     dt_dtype_name(dt), g, dt_dtype_load(dt, recv, g), gval(g, d));
        free(send);
        free(recv);
    }
    dt_pg_free(pg);
    return 0;
}

/* All-to-all: send [A, W*L, B], block j = chunk j of the middle dim; recv
 * [A2, W*L2, B2] with A2*L2*B2 == A*L*B, block j = chunk j. Element i of
 * the block rank s sends to rank t: gval(i + 1000 * (s * W + t)). */
typedef struct {
    int64_t A, L, B, A2, L2, B2;
    const char *backend;
} a2a_case;

static int a2a_body(int rank, int W, void *arg)
{
    const a2a_case *k = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, W == 1 ? NULL : k->backend, &pg));
    size_t count = (size_t)(k->A * k->L * k->B);
    TH_CHECK(count == (size_t)(k->A2 * k->L2 * k->B2), "bad case");
    dt_pg_block sb[8], rb[8];
    for (int j = 0; j < W; j++) {
        sb[j] = (dt_pg_block){(size_t)(j * k->L * k->B), (size_t)k->A, (size_t)(k->L * k->B),
                              (size_t)(W * k->L * k->B)};
        rb[j] = (dt_pg_block){(size_t)(j * k->L2 * k->B2), (size_t)k->A2, (size_t)(k->L2 * k->B2),
                              (size_t)(W * k->L2 * k->B2)};
    }
    for (int d = 0; d < NDT; d++) {
        dt_dtype dt = k_dts[d];
        size_t es = dt_dtype_size(dt), tot = (size_t)W * count;
        char *send = malloc(tot * es + 1), *recv = malloc(tot * es + 1);
        TH_CHECK(send && recv, "oom");
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < count; i++) {
                size_t at = sb[j].off + i / sb[j].run * sb[j].stride + i % sb[j].run;
                dt_dtype_store(dt, send, at, gval(i + 1000 * (size_t)(rank * W + j), d));
            }
        for (size_t g = 0; g < tot; g++)
            dt_dtype_store(dt, recv, g, 99);
        if (d % 2) {
            dt_req *rq;
            TH_OK(dt_pg_alltoall_blocks_async(pg, send, sb, recv, rb, count, dt, &rq));
            TH_OK(dt_req_wait(rq, -1));
            dt_req_free(rq);
        } else {
            TH_OK(dt_pg_alltoall_blocks(pg, send, sb, recv, rb, count, dt));
        }
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < count; i++) {
                size_t at = rb[j].off + i / rb[j].run * rb[j].stride + i % rb[j].run;
                double want = gval(i + 1000 * (size_t)(j * W + rank), d);
                TH_CHECK(dt_dtype_load(dt, recv, at) == want,
                         "%s alltoall_blocks W=%d %s: block %d [%zu] = %g, want %g",
                         k->backend ? k->backend : "shm", W, dt_dtype_name(dt), j, i,
                         dt_dtype_load(dt, recv, at), want);
            }
        free(send);
        free(recv);
    }
    dt_pg_free(pg);
    return 0;
}

/* Reduce-scatter from the a2a_case send layout: element i of block j on
 * rank s is (i + j) % 5 + s; sum and max (exact in u8 for 8 ranks). */
static int rs_body(int rank, int W, void *arg)
{
    const a2a_case *k = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, W == 1 ? NULL : k->backend, &pg));
    size_t count = (size_t)(k->A * k->L * k->B);
    dt_pg_block sb[8];
    for (int j = 0; j < W; j++)
        sb[j] = (dt_pg_block){(size_t)(j * k->L * k->B), (size_t)k->A, (size_t)(k->L * k->B),
                              (size_t)(W * k->L * k->B)};
    for (int d = 0; d < NDT; d++) {
        dt_dtype dt = k_dts[d];
        size_t es = dt_dtype_size(dt), tot = (size_t)W * count;
        char *send = malloc(tot * es + 1), *recv = malloc(count * es + 1);
        TH_CHECK(send && recv, "oom");
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < count; i++) {
                size_t at = sb[j].off + i / sb[j].run * sb[j].stride + i % sb[j].run;
                dt_dtype_store(dt, send, at, (double)((i + (size_t)j) % 5 + (size_t)rank));
            }
        for (int o = 0; o < 2; o++) {
            dt_reduce_op op = o ? DT_REDUCE_MAX : DT_REDUCE_SUM;
            for (size_t i = 0; i < count; i++)
                dt_dtype_store(dt, recv, i, 99);
            if (d % 2) {
                dt_req *rq;
                TH_OK(dt_pg_reduce_scatter_blocks_async(pg, send, sb, recv, count, dt, op, &rq));
                TH_OK(dt_req_wait(rq, -1));
                dt_req_free(rq);
            } else {
                TH_OK(dt_pg_reduce_scatter_blocks(pg, send, sb, recv, count, dt, op));
            }
            for (size_t i = 0; i < count; i++) {
                double b = (double)((i + (size_t)rank) % 5), want = o ? b + W - 1 : W * b + W * (W - 1) / 2;
                TH_CHECK(dt_dtype_load(dt, recv, i) == want,
                         "%s reduce_scatter_blocks W=%d %s %s: [%zu] = %g, want %g",
                         k->backend ? k->backend : "shm", W, dt_dtype_name(dt),
                         dt_reduce_op_name(op), i, dt_dtype_load(dt, recv, i), want);
            }
        }
        free(send);
        free(recv);
    }
    dt_pg_free(pg);
    return 0;
}

static void register_plain_shm(void)
{
    dt_backend_ops ops = *dt_backend_find("shm");
    ops.name = "shm_plain";
    ops.kinds = 0; /* no layouts: the group layer packs and unpacks */
    dt_status st = dt_backend_register(&ops);
    if (st < 0)
        fprintf(stderr, "register: %s\n", dt_last_error());
}

static const char *k_backends[] = {NULL, "shm_plain"};

TEST(allgather_blocks_values)
{
    register_plain_shm();
    static const int sizes[] = {1, 2, 3, 4, 8};
    /* [A, n, B]: slot-sized, uneven with empty chunks (n < W), staged */
    static const int64_t shapes[][3] = {{3, 5, 2}, {4, 2, 3}, {17, 41, 29}, {64, 37, 129}};
    for (int b = 0; b < 2; b++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                if (b && sizes[k] != 2 && sizes[k] != 3)
                    continue; /* the pack/unpack path: two sizes are enough */
                if (sizes[k] == 8 && s + 1 == sizeof shapes / sizeof shapes[0])
                    continue; /* the largest shape: sizes up to 4 (time) */
                ag_case c = {shapes[s][0], shapes[s][1], shapes[s][2], k_backends[b]};
                int rc = th_run(sizes[k], 120, ag_body, &c, NULL);
                if (rc)
                    fprintf(stderr, "world %d, shape %zu, backend %s: rc %d\n", sizes[k], s,
                            b ? k_backends[b] : "shm", rc);
                ASSERT_EQ_INT(rc, 0);
            }
}

TEST(allgather_blocks_many_pieces)
{
    /* a small staging area: pieces end in the middle of runs */
    setenv("DT_SHM_STAGING_KB", "16", 1);
    ag_case c = {33, 23, 31, NULL};
    ASSERT_EQ_INT(th_run(3, 120, ag_body, &c, NULL), 0);
    a2a_case d = {7, 5, 19, 35, 1, 19, NULL};
    ASSERT_EQ_INT(th_run(3, 120, a2a_body, &d, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 120, rs_body, &d, NULL), 0);
    unsetenv("DT_SHM_STAGING_KB");
}

TEST(alltoall_and_reduce_scatter_blocks_values)
{
    register_plain_shm();
    static const int sizes[] = {1, 2, 3, 4, 8};
    /* slot-sized and staged; send and recv layouts of different shapes */
    static const int64_t shapes[][6] = {{2, 1, 3, 3, 2, 1}, {8, 3, 5, 4, 6, 5}, {64, 33, 40, 16, 132, 40}};
    for (int b = 0; b < 2; b++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
                if (b && sizes[k] != 2 && sizes[k] != 3)
                    continue; /* the pack/unpack path: two sizes are enough */
                if (sizes[k] == 8 && s + 1 == sizeof shapes / sizeof shapes[0])
                    continue; /* the largest shape: sizes up to 4 (time) */
                const int64_t *x = shapes[s];
                a2a_case c = {x[0], x[1], x[2], x[3], x[4], x[5], k_backends[b]};
                int rc = th_run(sizes[k], 120, a2a_body, &c, NULL);
                if (!rc)
                    rc = th_run(sizes[k], 120, rs_body, &c, NULL);
                if (rc)
                    fprintf(stderr, "world %d, shape %zu, backend %s: rc %d\n", sizes[k], s,
                            b ? k_backends[b] : "shm", rc);
                ASSERT_EQ_INT(rc, 0);
            }
}

TEST(blocks_bad_arguments)
{
    dt_pg_params p = dt_pg_params_default();
    p.rank = 0;
    p.world_size = 1;
    p.backend = "self";
    dt_pg *pg;
    ASSERT_OK(dt_pg_init(&p, &pg));
    float x[8] = {1, 2, 3, 4}, y[8] = {0};
    dt_pg_block ok = {0, 2, 2, 4}, overlap = {0, 2, 3, 2}, huge = {SIZE_MAX - 2, 2, 2, 4};
    dt_req *rq = (dt_req *)1;
    ASSERT_STATUS(dt_pg_allgather_blocks(pg, x, y, NULL, DT_F32), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_allgather_blocks(pg, x, y, &overlap, DT_F32), DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "overlap"));
    ASSERT_STATUS(dt_pg_allgather_blocks(pg, x, y, &huge, DT_F32), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_allgather_blocks(pg, NULL, y, &ok, DT_F32), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_allgather_blocks_async(pg, x, y, &ok, DT_F32, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_allgather_blocks_async(pg, x, y, &ok, (dt_dtype)99, &rq), DT_ERR_INVALID_ARG);
    ASSERT(rq == NULL);
    ASSERT_STATUS(dt_pg_alltoall_blocks(pg, x, &ok, y, &ok, 3, DT_F32), DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "not count 3"));
    ASSERT_STATUS(dt_pg_alltoall_blocks(pg, x, &ok, x, &ok, 4, DT_F32), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_alltoall_blocks(pg, x, NULL, y, &ok, 4, DT_F32), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_reduce_scatter_blocks(pg, x, &ok, y, 4, DT_F32, (dt_reduce_op)99),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_reduce_scatter_blocks(pg, x, &overlap, y, 6, DT_F32, DT_REDUCE_SUM),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_reduce_scatter_blocks_async(pg, x, &ok, y, 4, DT_F32, DT_REDUCE_SUM, NULL),
                  DT_ERR_NULL);
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8}, z[4] = {0};
    ASSERT_OK(dt_pg_reduce_scatter_blocks(pg, xs, &ok, z, 4, DT_F32, DT_REDUCE_SUM));
    ASSERT(z[0] == 1 && z[1] == 2 && z[2] == 5 && z[3] == 6);
    /* valid: the strided 2 x 2 box of x lands strided in y */
    dt_pg_block to = {1, 2, 2, 3};
    ASSERT_OK(dt_pg_alltoall_blocks(pg, x, &ok, y, &to, 4, DT_F32));
    ASSERT(y[0] == 0 && y[1] == 1 && y[2] == 2 && y[3] == 0 && y[4] == 0 && y[5] == 0);
    x[4] = 5, x[5] = 6;
    ASSERT_OK(dt_pg_alltoall_blocks(pg, x, &ok, y, &to, 4, DT_F32));
    ASSERT(y[4] == 5 && y[5] == 6);
    dt_pg_free(pg);
}

int main(void)
{
    RUN(blocks_bad_arguments);
    RUN(allgather_blocks_values);
    RUN(alltoall_and_reduce_scatter_blocks_values);
    RUN(allgather_blocks_many_pieces);
    return TEST_REPORT();
}
