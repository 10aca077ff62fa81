/* Collectives under mpirun: every collective, dtype and reduction, counts 0,
 * 1, odd and not divisible by the world size, in place and out of place, on
 * the group that dt_pg_init() builds from Open MPI's environment (and so on
 * the `mpi` backend unless DT_BACKEND says otherwise). Also subgroups, the
 * cross-rank mismatch check and the per-operation timeout.
 *
 * Registered by tests/comm/tests.cmake as `mpirun -np N` tests (N = 1, 2, 3,
 * 4, 8) when MPI is found; not a test_*.c file, so it is not also run as a
 * single plain process. With DT_EXPECT_BACKEND set, the group's backend must
 * be that one. Each rank prints its failures; the exit code is non-zero on
 * any failure, and mpirun returns it. */
#include "dtrain/comm.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rank_check.h" /* g_rank, g_fail, CHECK_RET: a failed check returns from the test */

static int g_w;

#define CHECK_OK(expr)                                                                    \
    do {                                                                                  \
        dt_status st_ = (expr);                                                           \
        CHECK_RET(st_ == DT_OK, "%s: %s", dt_status_name(st_), dt_last_error());              \
    } while (0)

static const dt_dtype k_dtypes[] = {DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8};
#define N_DTYPES 7

/* Input element i of rank r: small integers, exact in every dtype. Products
 * use 1 and 2 only, so 2^W stays exact in u8 and f16 for W <= 7. */
static double value(int r, size_t i, dt_reduce_op op)
{
    if (op == DT_REDUCE_PROD)
        return (double)(1 + (i + (size_t)r) % 2);
    return (double)((i * 5 + (size_t)r * 3) % 7 + 1);
}

static int is_int(dt_dtype dt)
{
    return dt == DT_I32 || dt == DT_I64 || dt == DT_U8;
}

/* The reduction of element index i over all ranks, as the dtype holds it. */
static double expect_reduce(dt_dtype dt, dt_reduce_op op, size_t i)
{
    double acc = value(0, i, op);
    for (int r = 1; r < g_w; r++) {
        double v = value(r, i, op);
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG: acc += v; break;
        case DT_REDUCE_MAX: acc = v > acc ? v : acc; break;
        case DT_REDUCE_MIN: acc = v < acc ? v : acc; break;
        case DT_REDUCE_PROD: acc *= v; break;
        default: break;
        }
    }
    if (op == DT_REDUCE_AVG)
        acc = is_int(dt) ? trunc(acc / g_w) : acc / g_w;
    return acc;
}

static int close_enough(dt_dtype dt, double got, double want)
{
    double tol = dt == DT_F16 ? 1e-3 : dt == DT_BF16 ? 8e-3 : dt == DT_F32 ? 1e-6 : 1e-12;
    return fabs(got - want) <= tol * fabs(want);
}

static void *xalloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p)
        abort();
    return p;
}

static const size_t k_counts[] = {0, 1, 7, 1001};
#define N_COUNTS 4

/* allreduce, reduce, reduce_scatter over every dtype, op, count, placement. */
static void test_reductions(dt_pg *pg)
{
    for (int d = 0; d < N_DTYPES; d++) {
        dt_dtype dt = k_dtypes[d];
        size_t es = dt_dtype_size(dt);
        for (int op = 0; op < DT_REDUCE_OP_COUNT; op++) {
            for (int ci = 0; ci < N_COUNTS; ci++) {
                size_t n = k_counts[ci];
                for (int inpl = 0; inpl < 2; inpl++) {
                    /* allreduce */
                    char *s = xalloc(n * es), *r = xalloc(n * es);
                    for (size_t i = 0; i < n; i++)
                        dt_dtype_store(dt, s, i, value(g_rank, i, (dt_reduce_op)op));
                    CHECK_OK(dt_pg_allreduce(pg, inpl ? DT_IN_PLACE : s, inpl ? s : r, n, dt,
                                             (dt_reduce_op)op));
                    const char *out = inpl ? s : r;
                    for (size_t i = 0; i < n; i++) {
                        double want = expect_reduce(dt, (dt_reduce_op)op, i);
                        CHECK_RET(close_enough(dt, dt_dtype_load(dt, out, i), want),
                              "allreduce %s %s n=%zu inpl=%d [%zu]: %g != %g", dt_dtype_name(dt),
                              dt_reduce_op_name((dt_reduce_op)op), n, inpl, i, dt_dtype_load(dt, out, i), want);
                    }
                    /* reduce to a root that moves with the count */
                    int root = (int)(n % (size_t)g_w);
                    for (size_t i = 0; i < n; i++)
                        dt_dtype_store(dt, s, i, value(g_rank, i, (dt_reduce_op)op));
                    memset(r, 0, n * es);
                    int rin = inpl && g_rank == root; /* in place only at the root */
                    CHECK_OK(dt_pg_reduce(pg, rin ? DT_IN_PLACE : s, inpl ? s : r, n, dt,
                                          (dt_reduce_op)op, root));
                    for (size_t i = 0; g_rank == root && i < n; i++) {
                        double want = expect_reduce(dt, (dt_reduce_op)op, i);
                        CHECK_RET(close_enough(dt, dt_dtype_load(dt, out, i), want),
                              "reduce %s %s n=%zu root=%d [%zu]: %g != %g", dt_dtype_name(dt),
                              dt_reduce_op_name((dt_reduce_op)op), n, root, i, dt_dtype_load(dt, out, i),
                              want);
                    }
                    free(s);
                    free(r);
                    /* reduce_scatter: n per rank, W*n in */
                    size_t tot = n * (size_t)g_w;
                    s = xalloc(tot * es);
                    r = xalloc(n * es);
                    for (size_t i = 0; i < tot; i++)
                        dt_dtype_store(dt, s, i, value(g_rank, i, (dt_reduce_op)op));
                    char *rs_out = inpl ? s + (size_t)g_rank * n * es : r;
                    CHECK_OK(dt_pg_reduce_scatter(pg, s, rs_out, n, dt, (dt_reduce_op)op));
                    for (size_t i = 0; i < n; i++) {
                        double want = expect_reduce(dt, (dt_reduce_op)op, (size_t)g_rank * n + i);
                        CHECK_RET(close_enough(dt, dt_dtype_load(dt, rs_out, i), want),
                              "reduce_scatter %s %s n=%zu inpl=%d [%zu]: %g != %g",
                              dt_dtype_name(dt), dt_reduce_op_name((dt_reduce_op)op), n, inpl, i,
                              dt_dtype_load(dt, rs_out, i), want);
                    }
                    free(s);
                    free(r);
                }
            }
        }
    }
}

/* broadcast, allgather, allgatherv, gather, scatter, alltoall: data movement
 * only, so one float and one 1-byte dtype cover the byte paths. */
static void test_movement(dt_pg *pg)
{
    const dt_dtype dts[] = {DT_F32, DT_U8, DT_BF16, DT_I64};
    size_t W = (size_t)g_w, me = (size_t)g_rank;
    for (int d = 0; d < 4; d++) {
        dt_dtype dt = dts[d];
        size_t es = dt_dtype_size(dt);
        for (int ci = 0; ci < N_COUNTS; ci++) {
            size_t n = k_counts[ci];
            for (int inpl = 0; inpl < 2; inpl++) {
                int root = (int)((n + 1) % W);
                /* broadcast */
                char *b = xalloc(n * es);
                for (size_t i = 0; i < n; i++)
                    dt_dtype_store(dt, b, i, g_rank == root ? value(root, i, DT_REDUCE_SUM) : 0);
                CHECK_OK(dt_pg_broadcast(pg, b, n, dt, root));
                for (size_t i = 0; i < n; i++)
                    CHECK_RET(dt_dtype_load(dt, b, i) == value(root, i, DT_REDUCE_SUM), "broadcast n=%zu [%zu]",
                          n, i);
                free(b);
                /* allgather */
                char *s = xalloc(n * es), *r = xalloc(W * n * es);
                for (size_t i = 0; i < n; i++) {
                    dt_dtype_store(dt, s, i, value(g_rank, i, DT_REDUCE_SUM));
                    dt_dtype_store(dt, r, me * n + i, value(g_rank, i, DT_REDUCE_SUM));
                }
                CHECK_OK(dt_pg_allgather(pg, inpl ? DT_IN_PLACE : s, r, n, dt));
                for (size_t i = 0; i < W * n; i++)
                    CHECK_RET(dt_dtype_load(dt, r, i) == value((int)(i / n), i % n, DT_REDUCE_SUM),
                          "allgather %s n=%zu inpl=%d [%zu]", dt_dtype_name(dt), n, inpl, i);
                /* gather at root */
                memset(r, 0, W * n * es);
                if (g_rank == root)
                    for (size_t i = 0; i < n; i++)
                        dt_dtype_store(dt, r, me * n + i, value(g_rank, i, DT_REDUCE_SUM));
                CHECK_OK(dt_pg_gather(pg, inpl && g_rank == root ? DT_IN_PLACE : s,
                                      g_rank == root ? r : NULL, n, dt, root));
                for (size_t i = 0; g_rank == root && i < W * n; i++)
                    CHECK_RET(dt_dtype_load(dt, r, i) == value((int)(i / n), i % n, DT_REDUCE_SUM),
                          "gather n=%zu inpl=%d [%zu]", n, inpl, i);
                /* scatter from root: block j of root's buffer goes to rank j */
                for (size_t i = 0; i < W * n; i++)
                    dt_dtype_store(dt, r, i, value(root, i, DT_REDUCE_SUM));
                memset(s, 0, n * es);
                CHECK_OK(dt_pg_scatter(pg, g_rank == root ? r : NULL, s, n, dt, root));
                for (size_t i = 0; i < n; i++)
                    CHECK_RET(dt_dtype_load(dt, s, i) == value(root, me * n + i, DT_REDUCE_SUM),
                          "scatter n=%zu [%zu]", n, i);
                free(s);
                free(r);
                /* alltoall: block j of rank r holds (r, j) */
                s = xalloc(W * n * es);
                r = xalloc(W * n * es);
                for (size_t j = 0; j < W; j++)
                    for (size_t i = 0; i < n; i++)
                        dt_dtype_store(dt, inpl ? r : s, j * n + i, (double)((me * 3 + j + i) % 11));
                CHECK_OK(dt_pg_alltoall(pg, inpl ? DT_IN_PLACE : s, r, n, dt));
                for (size_t j = 0; j < W; j++)
                    for (size_t i = 0; i < n; i++)
                        CHECK_RET(dt_dtype_load(dt, r, j * n + i) == (double)((j * 3 + me + i) % 11),
                              "alltoall n=%zu inpl=%d block %zu [%zu]", n, inpl, j, i);
                free(s);
                free(r);
                /* allgatherv: rank q contributes n + q elements, packed */
                size_t *counts = xalloc(W * sizeof(size_t)), tot = 0, off = 0;
                for (size_t q = 0; q < W; q++)
                    counts[q] = n + q, tot += n + q;
                for (size_t q = 0; q < me; q++)
                    off += counts[q];
                s = xalloc(counts[me] * es);
                r = xalloc(tot * es);
                for (size_t i = 0; i < counts[me]; i++) {
                    dt_dtype_store(dt, s, i, value(g_rank, i, DT_REDUCE_SUM));
                    dt_dtype_store(dt, r, off + i, value(g_rank, i, DT_REDUCE_SUM));
                }
                CHECK_OK(dt_pg_allgatherv(pg, inpl ? DT_IN_PLACE : s, r, counts, NULL, dt));
                off = 0;
                for (size_t q = 0; q < W; q++) {
                    for (size_t i = 0; i < counts[q]; i++)
                        CHECK_RET(dt_dtype_load(dt, r, off + i) == value((int)q, i, DT_REDUCE_SUM),
                              "allgatherv n=%zu inpl=%d rank %zu [%zu]", n, inpl, q, i);
                    off += counts[q];
                }
                free(counts);
                free(s);
                free(r);
            }
        }
    }
    CHECK_OK(dt_pg_barrier(pg));
}

/* The strided-layout collectives (the group layer's pack/unpack on this
 * backend): a gather along the middle dim of [3, n, 5] with uneven chunks
 * (rank q holds q + 1 rows of it), an all-to-all and a reduce-scatter whose
 * blocks are the chunks of the middle dim of [3, W*2, 5]. f32 and u8. */
static void test_blocks(dt_pg *pg)
{
    size_t W = (size_t)g_w, me = (size_t)g_rank, A = 3, B = 5, n = W * (W + 1) / 2;
    dt_dtype dts[2] = {DT_F32, DT_U8};
    for (int d = 0; d < 2; d++) {
        dt_dtype dt = dts[d];
        size_t es = dt_dtype_size(dt), st = me * (me + 1) / 2, len = me + 1;
        dt_pg_block *rb = xalloc(W * sizeof *rb), *sb = xalloc(W * sizeof *sb);
        for (size_t q = 0; q < W; q++)
            rb[q] = (dt_pg_block){q * (q + 1) / 2 * B, A, (q + 1) * B, n * B};
        char *s = xalloc(A * len * B * es + 1), *r = xalloc(A * n * B * es + 1);
        for (size_t a = 0, i = 0; a < A; a++)
            for (size_t x = 0; x < len * B; x++)
                dt_dtype_store(dt, s, i++, (double)((a * n * B + st * B + x) % 97));
        CHECK_OK(dt_pg_allgather_blocks(pg, s, r, rb, dt));
        for (size_t g = 0; g < A * n * B; g++)
            CHECK_RET(dt_dtype_load(dt, r, g) == (double)(g % 97), "allgather_blocks %s [%zu]",
                  dt_dtype_name(dt), g);
        free(s);
        free(r);
        size_t L = 2, cnt = A * L * B, tot = W * cnt;
        for (size_t q = 0; q < W; q++)
            sb[q] = (dt_pg_block){q * L * B, A, L * B, W * L * B};
        s = xalloc(tot * es + 1);
        r = xalloc(tot * es + 1);
        for (size_t q = 0; q < W; q++)
            for (size_t i = 0; i < cnt; i++)
                dt_dtype_store(dt, s, sb[q].off + i / sb[q].run * sb[q].stride + i % sb[q].run,
                               (double)((me * 7 + q * 3 + i) % 11));
        CHECK_OK(dt_pg_alltoall_blocks(pg, s, sb, r, sb, cnt, dt));
        for (size_t q = 0; q < W; q++)
            for (size_t i = 0; i < cnt; i++)
                CHECK_RET(dt_dtype_load(dt, r, sb[q].off + i / sb[q].run * sb[q].stride +
                                               i % sb[q].run) == (double)((q * 7 + me * 3 + i) % 11),
                      "alltoall_blocks %s block %zu [%zu]", dt_dtype_name(dt), q, i);
        CHECK_OK(dt_pg_reduce_scatter_blocks(pg, s, sb, r, cnt, dt, DT_REDUCE_MAX));
        for (size_t i = 0; i < cnt; i++) {
            double want = 0;
            for (size_t q = 0; q < W; q++) {
                double v = (double)((q * 7 + me * 3 + i) % 11);
                want = v > want ? v : want;
            }
            CHECK_RET(dt_dtype_load(dt, r, i) == want, "reduce_scatter_blocks %s [%zu]",
                  dt_dtype_name(dt), i);
        }
        free(s);
        free(r);
        free(rb);
        free(sb);
    }
}

/* Send around a ring, asynchronously, then a subgroup of the even ranks. */
static void test_p2p_and_subgroup(dt_pg *pg)
{
    if (g_w > 1) {
        int to = (g_rank + 1) % g_w, from = (g_rank + g_w - 1) % g_w;
        int32_t out[5], in[5] = {0};
        for (int i = 0; i < 5; i++)
            out[i] = g_rank * 100 + i;
        dt_req *rs, *rr;
        /* Requests run in posting order, so even ranks send first and odd
         * ranks receive first (no reliance on eager sends). */
        if (g_rank % 2 == 0) {
            CHECK_OK(dt_pg_send_async(pg, out, 5, DT_I32, to, &rs));
            CHECK_OK(dt_pg_recv_async(pg, in, 5, DT_I32, from, &rr));
        } else {
            CHECK_OK(dt_pg_recv_async(pg, in, 5, DT_I32, from, &rr));
            CHECK_OK(dt_pg_send_async(pg, out, 5, DT_I32, to, &rs));
        }
        dt_req *both[2] = {rs, rr};
        CHECK_OK(dt_req_wait_all(both, 2, 30));
        dt_req_free(rs);
        dt_req_free(rr);
        for (int i = 0; i < 5; i++)
            CHECK_RET(in[i] == from * 100 + i, "recv [%d] = %d", i, in[i]);
    }
    int ranks[8], n = 0;
    for (int r = 0; r < g_w; r += 2)
        ranks[n++] = r;
    dt_pg *sub = NULL;
    dt_status st = dt_pg_subgroup(pg, ranks, n, &sub);
    CHECK_RET(st == DT_OK, "subgroup: %s", dt_last_error());
    if (g_rank % 2 == 0) {
        CHECK_RET(sub != NULL, "member without a subgroup");
        CHECK_RET(dt_pg_size(sub) == n && dt_pg_rank(sub) == g_rank / 2, "sub rank %d size %d",
              dt_pg_rank(sub), dt_pg_size(sub));
        int64_t v = g_rank;
        CHECK_OK(dt_pg_allreduce(sub, DT_IN_PLACE, &v, 1, DT_I64, DT_REDUCE_SUM));
        int64_t want = 0;
        for (int i = 0; i < n; i++)
            want += ranks[i];
        CHECK_RET(v == want, "subgroup sum %lld != %lld", (long long)v, (long long)want);
        dt_pg_free(sub);
    } else {
        CHECK_RET(sub == NULL, "non-member got a subgroup");
    }
    CHECK_OK(dt_pg_barrier(pg));
}

/* Ranks that post different counts at the same sequence number all get
 * DT_ERR_MISMATCH, on a group of their own. */
/* Batched send/recv (a ring where every rank posts its send first, 8 MiB
 * each), dt_pg_split into two colors with keys reversing the order, a
 * dup whose request completes while the parent's waits for a late rank 0,
 * and reduce_scatterv with uneven counts. */
static void test_batch_split_dup_v(dt_pg *pg)
{
    int W = g_w, me = g_rank;
    if (W > 1) {
        size_t n = (size_t)2 << 20;
        int32_t *s = xalloc(n * sizeof *s), *r = xalloc(n * sizeof *r);
        for (size_t i = 0; i < n; i++) {
            s[i] = me * 7 + (int32_t)i;
            r[i] = -1;
        }
        int next = (me + 1) % W, prev = (me + W - 1) % W;
        dt_req *rq[2];
        CHECK_OK(dt_pg_send_async(pg, s, n, DT_I32, next, &rq[0]));
        CHECK_OK(dt_pg_recv_async(pg, r, n, DT_I32, prev, &rq[1]));
        CHECK_OK(dt_req_wait_all(rq, 2, -1));
        dt_req_free(rq[0]);
        dt_req_free(rq[1]);
        for (size_t i = 0; i < n; i += 4097)
            CHECK_RET(r[i] == prev * 7 + (int32_t)i, "ring [%zu] = %d", i, r[i]);
        CHECK_OK(dt_pg_sendrecv(pg, s, n, prev, r, n, next, DT_I32));
        CHECK_RET(r[n - 1] == next * 7 + (int32_t)(n - 1), "sendrecv last = %d", r[n - 1]);
        free(s);
        free(r);
    }
    dt_pg *half = NULL;
    CHECK_OK(dt_pg_split(pg, me % 2, -me, &half));
    if (half) {
        int hs = (W - me % 2 + 1) / 2; /* ranks of my parity */
        CHECK_RET(dt_pg_size(half) == hs, "split size %d want %d", dt_pg_size(half), hs);
        CHECK_RET(dt_pg_rank(half) == hs - 1 - me / 2, "split rank %d", dt_pg_rank(half));
        int64_t v = me, sum = 0, want = 0;
        for (int k = me % 2; k < W; k += 2)
            want += k;
        CHECK_OK(dt_pg_allreduce(half, &v, &sum, 1, DT_I64, DT_REDUCE_SUM));
        CHECK_RET(sum == want, "split sum %lld want %lld", (long long)sum, (long long)want);
        dt_pg_free(half);
    } else {
        CHECK_RET(0, "no split group");
    }
    dt_pg *dup = NULL;
    CHECK_OK(dt_pg_dup(pg, &dup));
    if (dup && W > 1) {
        float a = 1, asum = 0, b = (float)me, bg[8];
        dt_req *ar = NULL, *ag = NULL;
        if (me != 0)
            CHECK_OK(dt_pg_allreduce_async(pg, &a, &asum, 1, DT_F32, DT_REDUCE_SUM, &ar));
        CHECK_OK(dt_pg_allgather_async(dup, &b, bg, 1, DT_F32, &ag));
        CHECK_OK(dt_req_wait(ag, 60));
        dt_req_free(ag);
        for (int k = 0; k < W; k++)
            CHECK_RET(bg[k] == (float)k, "dup allgather [%d]", k);
        if (me != 0)
            CHECK_RET(dt_req_test(ar) == DT_INPROGRESS, "parent allreduce finished without rank 0");
        /* Tell rank 0 (through the dup) that everyone has looked. */
        CHECK_OK(dt_pg_barrier(dup));
        if (me == 0)
            CHECK_OK(dt_pg_allreduce_async(pg, &a, &asum, 1, DT_F32, DT_REDUCE_SUM, &ar));
        CHECK_OK(dt_req_wait(ar, -1));
        dt_req_free(ar);
        CHECK_RET(asum == (float)W, "parent allreduce %g", asum);
    }
    dt_pg_free(dup);
    size_t counts[8], total = 0;
    for (int j = 0; j < W; j++)
        total += counts[j] = (size_t)(j * 3 + 1) % 5; /* 1, 4, 2, 0, 3, ... */
    for (size_t d = 0; d < sizeof k_dtypes / sizeof k_dtypes[0]; d++) {
        dt_dtype dt = k_dtypes[d];
        char *s = xalloc(total * dt_dtype_size(dt) + 1), *r = xalloc(8 * dt_dtype_size(dt));
        for (size_t i = 0; i < total; i++)
            dt_dtype_store(dt, s, i, (double)((me + (int)i) % 3 + 1));
        CHECK_OK(dt_pg_reduce_scatterv(pg, s, r, counts, dt, DT_REDUCE_SUM));
        size_t off = 0;
        for (int j = 0; j < me; j++)
            off += counts[j];
        for (size_t i = 0; i < counts[me]; i++) {
            double want = 0;
            for (int q = 0; q < W; q++)
                want += (double)((q + (int)(off + i)) % 3 + 1);
            CHECK_RET(dt_dtype_load(dt, r, i) == want, "reduce_scatterv %s [%zu] = %g want %g",
                  dt_dtype_name(dt), i, dt_dtype_load(dt, r, i), want);
        }
        free(s);
        free(r);
    }
}

/* alltoallv with uneven (and zero) blocks. */
static void test_alltoallv(dt_pg *pg)
{
    int W = g_w, me = g_rank;
    size_t sc[8], rc[8], so = 0, ro = 0;
    for (int j = 0; j < W; j++) {
        so += sc[j] = (size_t)((me * 3 + j * 5) % 4);
        ro += rc[j] = (size_t)((j * 3 + me * 5) % 4);
    }
    for (size_t d = 0; d < sizeof k_dtypes / sizeof k_dtypes[0]; d++) {
        dt_dtype dt = k_dtypes[d];
        char *s = xalloc(so * dt_dtype_size(dt) + 1), *r = xalloc(ro * dt_dtype_size(dt) + 1);
        size_t k = 0;
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < sc[j]; i++)
                dt_dtype_store(dt, s, k++, (double)((me * 5 + j * 3 + (int)i) % 9));
        CHECK_OK(dt_pg_alltoallv(pg, s, sc, NULL, r, rc, NULL, dt));
        k = 0;
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < rc[j]; i++, k++)
                CHECK_RET(dt_dtype_load(dt, r, k) == (double)((j * 5 + me * 3 + (int)i) % 9),
                      "alltoallv %s from %d [%zu]", dt_dtype_name(dt), j, i);
        free(s);
        free(r);
    }
}

static void test_mismatch(void)
{
    if (g_w < 2)
        return;
    dt_pg_params p = dt_pg_params_default();
    p.check = 1;
    dt_pg *pg;
    CHECK_OK(dt_pg_init(&p, &pg));
    float x[8] = {0};
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, x, g_rank == 0 ? 5 : 6, DT_F32, DT_REDUCE_SUM);
    CHECK_RET(st == DT_ERR_MISMATCH, "got %s: %s", dt_status_name(st), dt_last_error());
    CHECK_RET(strstr(dt_last_error(), "count=5") && strstr(dt_last_error(), "count=6"),
          "message names both sides: %s", dt_last_error());
    dt_pg_free(pg);
}

/* Rank 0 arrives late; the others' 0.3 s timeout fires first. Rank 0 posts
 * only after every other rank has seen its timeout (a barrier on the world
 * group, which the others enter after their timeout), so a rank descheduled
 * for seconds on a loaded machine cannot find rank 0 already there. The
 * others' failure notices (their timeouts fail the group) reach rank 0, whose
 * allreduce then either completes first or fails with their timeout's
 * message; either way it was posted, and completes the others' abandoned
 * requests in the background, so nothing is left pending at exit. */
static void test_timeout(dt_pg *world)
{
    const char *blocking = getenv("DT_MPI_BLOCKING");
    if (g_w < 2 || (blocking && !strcmp(blocking, "1")))
        return; /* blocking MPI calls have no timeout (documented) */
    dt_pg_params p = dt_pg_params_default();
    p.check = 0;
    p.timeout_s = g_rank == 0 ? 30 : 0.3;
    dt_pg *pg;
    CHECK_OK(dt_pg_init(&p, &pg));
    static float x[4];
    if (g_rank == 0)
        CHECK_OK(dt_pg_barrier(world));
    dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, x, 4, DT_F32, DT_REDUCE_SUM);
    if (g_rank == 0) {
        CHECK_RET(st == DT_OK || (st == DT_ERR_TIMEOUT && strstr(dt_last_error(), "allreduce") &&
                              strstr(dt_last_error(), "timed out after 0.3 s on rank ")),
              "late rank: %s: %s", dt_status_name(st), dt_last_error());
    } else {
        CHECK_RET(st == DT_ERR_TIMEOUT, "got %s: %s", dt_status_name(st), dt_last_error());
        CHECK_RET(strstr(dt_last_error(), "allreduce"), "message names the operation: %s",
              dt_last_error());
        CHECK_OK(dt_pg_barrier(world));
    }
    dt_pg_free(pg);
}

/* f16/bf16 reductions travel as 16 bits and are accumulated in f32 in rank
 * order, divided by W for an average and rounded once: the same bits as a
 * reference that does exactly that (the shm backend's direct all-reduce).
 * Values spread over 2^20 so that, in bf16, the f32 sums round and the
 * order shows; counts that split unevenly over the ranks. */
static uint16_t half_value(dt_dtype dt, int r, size_t i)
{
    float v = (float)((double)((int)((i * 37 + (size_t)r * 101) % 1000) - 500) / 61.0 *
                      ldexp(1.0, (int)((i + (size_t)r) % 21) - 10));
    if (dt == DT_F16) /* keep within f16's range */
        v = (float)((double)((int)((i * 37 + (size_t)r * 101) % 1000) - 500) / 61.0 *
                    ldexp(1.0, (int)((i + (size_t)r) % 9) - 4));
    uint16_t h;
    dt_k_convert(&v, DT_F32, &h, dt, 1);
    return h;
}

static uint16_t half_expect(dt_dtype dt, dt_reduce_op op, size_t i)
{
    float acc = 0;
    for (int r = 0; r < g_w; r++) {
        uint16_t h = half_value(dt, r, i);
        float f;
        dt_k_convert(&h, dt, &f, DT_F32, 1);
        if (r == 0)
            acc = f;
        else if (op == DT_REDUCE_MAX)
            acc = f > acc ? f : acc;
        else
            acc += f;
    }
    if (op == DT_REDUCE_AVG)
        acc /= (float)g_w;
    uint16_t h;
    dt_k_convert(&acc, DT_F32, &h, dt, 1);
    return h;
}

static void test_half_exact(dt_pg *pg)
{
    const dt_dtype dts[] = {DT_F16, DT_BF16};
    const dt_reduce_op ops[] = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_MAX};
    const size_t counts[] = {1, 5, 1001, 20001};
    for (int d = 0; d < 2; d++)
        for (int o = 0; o < 3; o++)
            for (int ci = 0; ci < 4; ci++) {
                const dt_dtype dt = dts[d];
                const dt_reduce_op op = ops[o];
                const size_t n = counts[ci];
                uint16_t *s = xalloc(n * (size_t)g_w * 2), *r = xalloc(n * (size_t)g_w * 2);
                for (int inpl = 0; inpl < 2; inpl++) {
                    for (size_t i = 0; i < n; i++)
                        s[i] = half_value(dt, g_rank, i);
                    CHECK_OK(dt_pg_allreduce(pg, inpl ? DT_IN_PLACE : s, inpl ? s : r, n, dt, op));
                    const uint16_t *out = inpl ? s : r;
                    for (size_t i = 0; i < n; i++)
                        CHECK_RET(out[i] == half_expect(dt, op, i), "allreduce %s %s n=%zu inpl=%d [%zu]: 0x%04x, "
                              "want 0x%04x", dt_dtype_name(dt), dt_reduce_op_name(op), n, inpl, i, out[i],
                              half_expect(dt, op, i));
                }
                /* reduce to the last rank */
                for (size_t i = 0; i < n; i++)
                    s[i] = half_value(dt, g_rank, i);
                memset(r, 0, n * 2);
                CHECK_OK(dt_pg_reduce(pg, s, r, n, dt, op, g_w - 1));
                for (size_t i = 0; g_rank == g_w - 1 && i < n; i++)
                    CHECK_RET(r[i] == half_expect(dt, op, i), "reduce %s n=%zu [%zu]", dt_dtype_name(dt), n, i);
                /* reduce-scatter: n per rank, the input is W blocks */
                for (size_t i = 0; i < n * (size_t)g_w; i++)
                    s[i] = half_value(dt, g_rank, i);
                CHECK_OK(dt_pg_reduce_scatter(pg, s, r, n, dt, op));
                for (size_t i = 0; i < n; i++)
                    CHECK_RET(r[i] == half_expect(dt, op, (size_t)g_rank * n + i), "reduce_scatter %s n=%zu [%zu]",
                          dt_dtype_name(dt), n, i);
                free(s);
                free(r);
            }
}

int main(void)
{
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(pg);
    g_w = dt_pg_size(pg);
    const char *want = getenv("DT_EXPECT_BACKEND");
    if (want && strcmp(want, dt_pg_backend(pg))) {
        fprintf(stderr, "[rank %d] backend is '%s', expected '%s'\n", g_rank, dt_pg_backend(pg),
                want);
        g_fail++;
    }
    test_reductions(pg);
    test_half_exact(pg);
    test_movement(pg);
    test_blocks(pg);
    test_p2p_and_subgroup(pg);
    test_batch_split_dup_v(pg);
    test_alltoallv(pg);
    test_mismatch();
    test_timeout(pg);
    /* Everyone agrees on the outcome. */
    int64_t bad = g_fail;
    dt_pg_barrier(pg);
    dt_pg_allreduce(pg, DT_IN_PLACE, &bad, 1, DT_I64, DT_REDUCE_SUM);
    dt_pg_free(pg);
    if (g_rank == 0)
        printf("mpi_coll: %d ranks, backend %s: %s (%lld failures)\n", g_w,
               want ? want : "default", bad ? "FAILED" : "ok", (long long)bad);
    return bad ? 1 : 0;
}
