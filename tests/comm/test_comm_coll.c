/* Every collective, dtype and reduction on real processes (shm backend):
 * world sizes 1, 2, 3, 4, 8; counts 0, 1, odd, not divisible by W; in place
 * and out of place; plain buffers and dt_pg_alloc buffers; each algorithm
 * of the selection table; the small-message path and the staged path cut
 * into several pieces. Values are small integers so that every dtype
 * (f16, bf16 included) represents sums and products exactly, and results
 * are compared exactly against a reference computed here. */
// dt-test-timeout: 240
#include "harness.h"
#include "test.h"

#include <stdint.h>

/* ---- values ---- */
static double val(int rank, size_t i, int for_prod)
{
    if (for_prod)
        return 1.0 + (double)((rank + i) % 2);
    return (double)((rank * 7 + (int)(i % 1000) * 3) % 11) - 3.0;
}

/* What a rank's input value becomes in the dtype (u8 wraps negatives). */
static double as_dtype(dt_dtype dt, double v)
{
    void *tmp[2];
    dt_dtype_store(dt, tmp, 0, v);
    return dt_dtype_load(dt, tmp, 0);
}

/* The reduction over ranks of element i, as the library must compute it. */
static double expect_red(dt_dtype dt, dt_reduce_op op, int W, size_t i, int block)
{
    int prod = op == DT_REDUCE_PROD;
    double acc = as_dtype(dt, val(0, i + (size_t)block, prod));
    for (int r = 1; r < W; r++) {
        double x = as_dtype(dt, val(r, i + (size_t)block, prod));
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG: acc += x; break;
        case DT_REDUCE_PROD: acc *= x; break;
        case DT_REDUCE_MAX: acc = x > acc ? x : acc; break;
        case DT_REDUCE_MIN: acc = x < acc ? x : acc; break;
        default: break;
        }
    }
    if (dt == DT_U8 && op != DT_REDUCE_MAX && op != DT_REDUCE_MIN)
        acc = (double)((unsigned long long)(long long)acc & 0xff); /* wraps like the data */
    if (op == DT_REDUCE_AVG) {
        if (dt == DT_F32 || dt == DT_F16 || dt == DT_BF16)
            acc = (double)((float)acc / (float)W);
        else if (dt == DT_F64)
            acc = acc / W;
        else
            acc = (double)((long long)acc / W);
    }
    if (dt == DT_U8)
        acc = (double)((unsigned long long)(long long)acc & 0xff);
    return as_dtype(dt, acc);
}

/* ---- the matrix ---- */
typedef struct {
    int kinds_mask;  /* which dt_coll_kind to run */
    int ndt;
    dt_dtype dts[DT_DTYPE_COUNT];
    int nop;
    dt_reduce_op ops[DT_REDUCE_OP_COUNT];
    int ncount;
    size_t counts[6]; /* SIZE_MAX - k means k*W + 3 */
} plan;

#define K(k) (1 << (k))
#define ALL_KINDS 0x0fff

static size_t resolve(size_t c, int W) { return c >= 1000000 ? (c - 1000000) * (size_t)W + 3 : c; }

typedef struct {
    dt_pg *pg;
    int alloc; /* buffers from dt_pg_alloc */
} env_t;

static void *buf_new(env_t *e, size_t bytes)
{
    void *p = e->alloc ? dt_pg_alloc(e->pg, bytes + 64) : malloc(bytes + 64);
    if (p)
        memset(p, 0xcd, bytes + 64);
    return p;
}
static void buf_del(env_t *e, void *p)
{
    if (e->alloc)
        dt_pg_dealloc(e->pg, p);
    else
        free(p);
}

static int fill(dt_dtype dt, void *b, int rank, size_t n, size_t first, int prod)
{
    for (size_t i = 0; i < n; i++)
        dt_dtype_store(dt, b, i, val(rank, first + i, prod));
    return 0;
}

#define CHECK_EQ(got, want, fmt, ...)                                                              \
    do {                                                                                           \
        double g_ = (got), w_ = (want);                                                            \
        TH_CHECK(g_ == w_, "got %g want %g: " fmt, g_, w_, __VA_ARGS__);                           \
    } while (0)

/* The elements a check compares: every one, except in huge vectors (over
 * 100000) of a sanitizer build (dt_test_reduced, tests/test.h), where the
 * checks themselves dominated the run (2 minutes of the ASan pass): both
 * ends in full and a stride of 61 in between. The release pass compares
 * every element; the sanitizer pass still has the library touch them all. */
static size_t next_sampled(size_t i, size_t n)
{
    return n > 100000 && i >= 4096 && i + 4096 < n ? i + 61 : i + 1;
}
static int g_reduced;
static size_t next_i(size_t i, size_t n)
{
    return g_reduced ? next_sampled(i, n) : i + 1;
}

/* One collective, checked. Returns 0 on success. */
static int one(env_t *e, dt_coll_kind k, dt_dtype dt, dt_reduce_op op, size_t n, int inplace)
{
    dt_pg *pg = e->pg;
    int W = dt_pg_size(pg), me = dt_pg_rank(pg);
    size_t es = dt_dtype_size(dt), WN = (size_t)W * n;
    int prod = op == DT_REDUCE_PROD;
    const char *kn = dt_coll_kind_name(k), *dn = dt_dtype_name(dt), *on = dt_reduce_op_name(op);
    void *s = buf_new(e, WN * es + 8), *r = buf_new(e, WN * es + 8);
    TH_CHECK(s && r, "alloc: %s", dt_last_error());
    int root = W - 1;
    switch (k) {
    case DT_COLL_ALLREDUCE: {
        fill(dt, inplace ? r : s, me, n, 0, prod);
        TH_OK(dt_pg_allreduce(pg, inplace ? DT_IN_PLACE : s, r, n, dt, op));
        /* huge vectors: both ends in full, a stride in between */
        for (size_t i = 0; i < n; i = next_sampled(i, n)) {
            double g = dt_dtype_load(dt, r, i), w = expect_red(dt, op, W, i, 0);
            CHECK_EQ(g, w, "%s %s %s n=%zu ip=%d i=%zu", kn, dn, on, n, inplace, i);
        }
        break;
    }
    case DT_COLL_REDUCE: {
        fill(dt, inplace && me == root ? r : s, me, n, 0, prod);
        TH_OK(dt_pg_reduce(pg, inplace && me == root ? DT_IN_PLACE : s, r, n, dt, op, root));
        if (me == root)
            for (size_t i = 0; i < n; i = next_i(i, n)) {
                double g = dt_dtype_load(dt, r, i), w = expect_red(dt, op, W, i, 0);
                CHECK_EQ(g, w, "%s %s %s n=%zu ip=%d i=%zu", kn, dn, on, n, inplace, i);
            }
        break;
    }
    case DT_COLL_REDUCE_SCATTER: {
        fill(dt, s, me, WN, 0, prod);
        void *out = inplace ? (char *)s + (size_t)me * n * es : r;
        TH_OK(dt_pg_reduce_scatter(pg, s, out, n, dt, op));
        for (size_t i = 0; i < n; i = next_i(i, n)) {
            double g = dt_dtype_load(dt, out, i), w = expect_red(dt, op, W, i, (int)((size_t)me * n));
            CHECK_EQ(g, w, "%s %s %s n=%zu ip=%d i=%zu", kn, dn, on, n, inplace, i);
        }
        break;
    }
    case DT_COLL_BROADCAST: {
        if (me == 0)
            fill(dt, r, 77, n, 0, 0);
        TH_OK(dt_pg_broadcast(pg, r, n, dt, 0));
        for (size_t i = 0; i < n; i = next_i(i, n))
            CHECK_EQ(dt_dtype_load(dt, r, i), as_dtype(dt, val(77, i, 0)), "%s %s n=%zu i=%zu", kn, dn, n, i);
        break;
    }
    case DT_COLL_ALLGATHER: {
        void *in = inplace ? (char *)r + (size_t)me * n * es : s;
        fill(dt, in, me, n, 0, 0);
        TH_OK(dt_pg_allgather(pg, inplace ? DT_IN_PLACE : s, r, n, dt));
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < n; i = next_i(i, n))
                CHECK_EQ(dt_dtype_load(dt, r, (size_t)j * n + i), as_dtype(dt, val(j, i, 0)),
                         "%s %s n=%zu ip=%d block %d i=%zu", kn, dn, n, inplace, j, i);
        break;
    }
    case DT_COLL_ALLGATHERV: {
        size_t cnt[64], dis[64], off = 1;
        for (int j = 0; j < W; j++) {
            cnt[j] = (n + (size_t)j) % (n + 2);
            dis[j] = off;
            off += cnt[j] + 1;
        }
        void *big = buf_new(e, (off + 1) * es), *rr = big;
        TH_CHECK(big != NULL, "alloc");
        void *in = inplace ? (char *)rr + dis[me] * es : s;
        fill(dt, in, me, cnt[me], 0, 0);
        TH_OK(dt_pg_allgatherv(pg, inplace ? DT_IN_PLACE : s, rr, cnt, dis, dt));
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < cnt[j]; i = next_i(i, cnt[j]))
                CHECK_EQ(dt_dtype_load(dt, rr, dis[j] + i), as_dtype(dt, val(j, i, 0)),
                         "%s %s n=%zu ip=%d block %d i=%zu", kn, dn, n, inplace, j, i);
        buf_del(e, big);
        break;
    }
    case DT_COLL_GATHER: {
        void *in = inplace && me == root ? (char *)r + (size_t)me * n * es : s;
        fill(dt, in, me, n, 0, 0);
        TH_OK(dt_pg_gather(pg, inplace && me == root ? DT_IN_PLACE : s, r, n, dt, root));
        if (me == root)
            for (int j = 0; j < W; j++)
                for (size_t i = 0; i < n; i = next_i(i, n))
                    CHECK_EQ(dt_dtype_load(dt, r, (size_t)j * n + i), as_dtype(dt, val(j, i, 0)),
                             "%s %s n=%zu ip=%d block %d i=%zu", kn, dn, n, inplace, j, i);
        break;
    }
    case DT_COLL_SCATTER: {
        if (me == root)
            for (int j = 0; j < W; j++)
                fill(dt, (char *)s + (size_t)j * n * es, 100 + j, n, 0, 0);
        void *out = inplace && me == root ? (char *)s + (size_t)me * n * es : r;
        TH_OK(dt_pg_scatter(pg, s, out, n, dt, root));
        for (size_t i = 0; i < n; i = next_i(i, n))
            CHECK_EQ(dt_dtype_load(dt, out, i), as_dtype(dt, val(100 + me, i, 0)),
                     "%s %s n=%zu ip=%d i=%zu", kn, dn, n, inplace, i);
        break;
    }
    case DT_COLL_ALLTOALL: {
        void *in = inplace ? r : s;
        for (int j = 0; j < W; j++)
            fill(dt, (char *)in + (size_t)j * n * es, me * 16 + j, n, 0, 0);
        TH_OK(dt_pg_alltoall(pg, inplace ? DT_IN_PLACE : s, r, n, dt));
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < n; i = next_i(i, n))
                CHECK_EQ(dt_dtype_load(dt, r, (size_t)j * n + i), as_dtype(dt, val(j * 16 + me, i, 0)),
                         "%s %s n=%zu ip=%d block %d i=%zu", kn, dn, n, inplace, j, i);
        break;
    }
    case DT_COLL_BARRIER:
        TH_OK(dt_pg_barrier(pg));
        break;
    case DT_COLL_SEND: { /* ring exchange: send right, receive from left */
        if (W == 1)
            break;
        int right = (me + 1) % W, left = (me + W - 1) % W;
        fill(dt, s, me, n, 0, 0);
        dt_req *rq[2];
        TH_OK(dt_pg_send_async(pg, s, n, dt, right, &rq[0]));
        TH_OK(dt_pg_recv_async(pg, r, n, dt, left, &rq[1]));
        TH_OK(dt_req_wait_all(rq, 2, -1));
        dt_req_free(rq[0]);
        dt_req_free(rq[1]);
        for (size_t i = 0; i < n; i = next_i(i, n))
            CHECK_EQ(dt_dtype_load(dt, r, i), as_dtype(dt, val(left, i, 0)), "%s %s n=%zu i=%zu", kn,
                     dn, n, i);
        break;
    }
    default:
        break;
    }
    buf_del(e, s);
    buf_del(e, r);
    return 0;
}

static int run_plan(int rank, int size, void *arg)
{
    const plan *p = arg;
    env_t e;
    TH_OK(th_pg(rank, size, size == 1 ? "shm" : NULL, &e.pg));
    /* buffers: 0 plain, 1 dt_pg_alloc, 2 mixed (odd ranks shared, even plain) */
    for (int mode = 0; mode < 3; mode++)
        for (int k = 0; k < DT_COLL_KIND_COUNT; k++) {
            e.alloc = mode == 2 ? rank % 2 : mode;
            if (!(p->kinds_mask & K(k)) || k == DT_COLL_RECV)
                continue;
            int reduces = k == DT_COLL_ALLREDUCE || k == DT_COLL_REDUCE ||
                          k == DT_COLL_REDUCE_SCATTER;
            for (int d = 0; d < p->ndt; d++)
                for (int o = 0; o < (reduces ? p->nop : 1); o++)
                    for (int c = 0; c < p->ncount; c++)
                        for (int ip = 0; ip < 2; ip++) {
                            if (ip && (k == DT_COLL_BROADCAST || k == DT_COLL_BARRIER ||
                                       k == DT_COLL_SEND))
                                continue;
                            if (one(&e, (dt_coll_kind)k, p->dts[d], p->ops[o],
                                    resolve(p->counts[c], size), ip))
                                return 1;
                        }
        }
    TH_OK(dt_pg_status(e.pg));
    dt_pg_free(e.pg);
    return 0;
}

static const plan k_full = {
    .kinds_mask = ALL_KINDS,
    .ndt = 7,
    .dts = {DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8},
    .nop = 5,
    .ops = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_MAX, DT_REDUCE_MIN, DT_REDUCE_PROD},
    .ncount = 4,
    .counts = {0, 1, 7, 1000005}, /* 0, 1, odd, 5W+3 */
};

static const plan k_large = {
    .kinds_mask = ALL_KINDS,
    .ndt = 3,
    .dts = {DT_F32, DT_BF16, DT_U8},
    .nop = 3,
    .ops = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_PROD},
    .ncount = 2,
    .counts = {37, 1000000 + 301}, /* 301W + 3: several staging pieces */
};

static const plan k_algos = {
    .kinds_mask = K(DT_COLL_ALLREDUCE) | K(DT_COLL_REDUCE) | K(DT_COLL_BROADCAST),
    .ndt = 4,
    .dts = {DT_F32, DT_F16, DT_I64, DT_U8},
    .nop = 5,
    .ops = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_MAX, DT_REDUCE_MIN, DT_REDUCE_PROD},
    .ncount = 3,
    .counts = {1, 1000002, 1000000 + 301},
};

/* f32 sum/avg past the streaming-store threshold (8 MiB), odd length. */
static const plan k_big = {
    .kinds_mask = K(DT_COLL_ALLREDUCE),
    .ndt = 1,
    .dts = {DT_F32},
    .nop = 2,
    .ops = {DT_REDUCE_SUM, DT_REDUCE_AVG},
    .ncount = 1,
    .counts = {1000000 + 1048600}, /* 1048600W + 3: just past 8 MiB at W=2 */
};

static const int k_sizes[] = {1, 2, 3, 4, 8};

static void set_cfg(const char *slot, const char *stage, const char *algo)
{
    if (slot)
        setenv("DT_SHM_SLOT_BYTES", slot, 1);
    else
        unsetenv("DT_SHM_SLOT_BYTES");
    if (stage)
        setenv("DT_SHM_STAGING_KB", stage, 1);
    else
        unsetenv("DT_SHM_STAGING_KB");
    if (algo)
        setenv("DT_SHM_ALGO", algo, 1);
    else
        unsetenv("DT_SHM_ALGO");
}

static int run_sizes(const plan *p, int min_w)
{
    for (size_t i = 0; i < sizeof k_sizes / sizeof k_sizes[0]; i++) {
        if (k_sizes[i] < min_w)
            continue;
        double t0 = dt_time_s();
        int rc = th_run(k_sizes[i], 90.0, run_plan, (void *)p, NULL);
        fprintf(stderr, "  W=%d: %s (%.2f s)\n", k_sizes[i], rc == 0 ? "ok" : "FAILED",
                dt_time_s() - t0);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Small messages through the slots (the default configuration). */
TEST(small_path_full_matrix)
{
    set_cfg(NULL, NULL, NULL);
    ASSERT_EQ_INT(run_sizes(&k_full, 1), 0);
}

/* No slots, 8 KiB staging: every message takes the staged/zero-copy path,
 * large ones in several pieces. */
TEST(staged_path_full_matrix)
{
    set_cfg("0", "8", NULL);
    ASSERT_EQ_INT(run_sizes(&k_full, 2), 0);
    ASSERT_EQ_INT(run_sizes(&k_large, 2), 0);
}

TEST(algorithm_ring)
{
    set_cfg("0", "8", "allreduce:ring");
    ASSERT_EQ_INT(run_sizes(&k_algos, 2), 0);
}

TEST(algorithm_rechd)
{
    set_cfg("0", "8", "allreduce:rechd");
    ASSERT_EQ_INT(run_sizes(&k_algos, 2), 0);
}

TEST(algorithm_tree)
{
    set_cfg("0", "8", "allreduce:tree;reduce:tree;broadcast:tree");
    ASSERT_EQ_INT(run_sizes(&k_algos, 2), 0);
}

TEST(large_streaming)
{
    set_cfg(NULL, NULL, NULL);
    double t0 = dt_time_s();
    ASSERT_EQ_INT(th_run(2, 90.0, run_plan, (void *)&k_big, NULL), 0);
    fprintf(stderr, "  W=2: ok (%.2f s)\n", dt_time_s() - t0);
}

/* Size ranges: small vectors direct, larger ones ring, in one run. */
TEST(algorithm_table_ranges)
{
    set_cfg("0", "8", "allreduce:0-64:direct,64-inf:ring;broadcast:0-1K:tree,1K-inf:direct");
    ASSERT_EQ_INT(run_sizes(&k_algos, 3), 0);
    set_cfg(NULL, NULL, NULL);
}

int main(void)
{
    g_reduced = dt_test_reduced();
    if (g_reduced)
        fprintf(stderr, "note: a sanitizer build: vectors over 100000 elements are checked at both ends and every "
                        "61st element between (DT_TEST_FULL=1: every element)\n");
    RUN(small_path_full_matrix);
    RUN(staged_path_full_matrix);
    RUN(algorithm_ring);
    RUN(algorithm_rechd);
    RUN(algorithm_tree);
    RUN(algorithm_table_ranges);
    RUN(large_streaming);
    return TEST_REPORT();
}
