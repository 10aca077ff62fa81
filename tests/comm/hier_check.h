/* tests/comm/hier_check.h — hierarchical all-reduce against the flat one,
 * shared by the forked-rank test (test_hier.c, nodes simulated with
 * DT_SIM_LOCAL_SIZE) and the mpirun program (mpi_hier.c, run on the test bed
 * of scripts/netbed.sh where the nodes are network namespaces).
 *
 * hc_run(pg, nodes, per_node, quick) makes the hierarchical group, checks its
 * topology (nodes x per_node ranks; per_node 0 = do not check sizes), then
 * for every dtype, reduction, count (0, 1, fewer than a node's ranks, odd,
 * not divisible by anything, large) and placement (in place, out of place,
 * async with several in flight) compares the result with dt_pg_allreduce on
 * the flat group:
 *   - inputs that are small integers: bit-identical (every partial sum is
 *     exact, so the order cannot matter);
 *   - f32/f64 inputs with fractions of mixed sign: within the bound the
 *     header states, 2 (W-1) u sum_r |x_r|, where every rank recomputes all
 *     ranks' inputs to get sum_r |x_r|; and not bit-identical to something
 *     trivially wrong: the values must also be within that bound of the
 *     exact sum computed in long double.
 * Returns the number of failures (each printed with the rank). */
#ifndef DT_TEST_HIER_CHECK_H
#define DT_TEST_HIER_CHECK_H

#include "dtrain/comm.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int hc_fail;
static int hc_rank_;

#define HC_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", hc_rank_, __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            hc_fail++;                                                                             \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define HC_OK(expr) HC_CHECK((expr) >= 0, "%s", dt_last_error())

/* Exact inputs: small integers (products: 1 and 2 only). */
static double hc_int_value(int r, size_t i, dt_reduce_op op)
{
    if (op == DT_REDUCE_PROD)
        return (double)(1 + (i * 3 + (size_t)r) % 2);
    return (double)((i * 5 + (size_t)r * 3) % 11) - 3.0;
}

/* Inexact inputs: mixed magnitudes and signs (a cheap hash of (r, i)). */
static double hc_real_value(int r, size_t i)
{
    uint64_t x = (uint64_t)r * 0x9e3779b97f4a7c15ull ^ (uint64_t)(i + 1) * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    double u = (double)(x >> 11) / 9007199254740992.0; /* [0, 1) */
    double mag = (x & 1) ? 1e3 : 1e-2;
    return (u - 0.5) * mag;
}

static void *hc_alloc(size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p)
        abort();
    return p;
}

/* One count/dtype/op: exact inputs, hierarchical vs flat, bit for bit. */
static void hc_exact(dt_pg *flat, dt_pg *hier, dt_dtype dt, dt_reduce_op op, size_t n, int mode)
{
    int rank = dt_pg_rank(flat);
    size_t es = dt_dtype_size(dt);
    char *a = hc_alloc(n * es), *b = hc_alloc(n * es), *out = hc_alloc(n * es);
    for (size_t i = 0; i < n; i++) {
        double v = hc_int_value(rank, i, op);
        if (dt == DT_U8 && v < 0)
            v = -v;
        dt_dtype_store(dt, a, i, v);
    }
    memcpy(b, a, n * es);
    HC_OK(dt_pg_allreduce(flat, DT_IN_PLACE, a, n, dt, op));
    if (mode == 0) { /* in place */
        HC_OK(dt_pg_allreduce(hier, DT_IN_PLACE, b, n, dt, op));
    } else if (mode == 1) { /* out of place: input untouched */
        char *keep = hc_alloc(n * es);
        memcpy(keep, b, n * es);
        HC_OK(dt_pg_allreduce(hier, b, out, n, dt, op));
        HC_CHECK(!memcmp(keep, b, n * es), "out-of-place input changed");
        free(keep);
        memcpy(b, out, n * es);
    } else { /* async, three in flight, the middle one is ours */
        char *x = hc_alloc(n * es + 8), *y = hc_alloc(n * es + 8);
        memcpy(x, b, n * es);
        memcpy(y, b, n * es);
        dt_req *rq[3];
        HC_OK(dt_pg_allreduce_async(hier, DT_IN_PLACE, x, n, dt, op, &rq[0]));
        HC_OK(dt_pg_allreduce_async(hier, DT_IN_PLACE, b, n, dt, op, &rq[1]));
        HC_OK(dt_pg_allreduce_async(hier, DT_IN_PLACE, y, n, dt, op, &rq[2]));
        HC_OK(dt_req_wait_all(rq, 3, 60));
        for (int k = 0; k < 3; k++)
            dt_req_free(rq[k]);
        HC_CHECK(!memcmp(x, b, n * es) && !memcmp(y, b, n * es), "async results differ");
        free(x);
        free(y);
    }
    for (size_t i = 0; i < n; i++)
        HC_CHECK(!memcmp(a + i * es, b + i * es, es),
                 "%s %s n=%zu mode=%d [%zu]: hierarchical %.17g, flat %.17g", dt_dtype_name(dt),
                 dt_reduce_op_name(op), n, mode, i, dt_dtype_load(dt, b, i), dt_dtype_load(dt, a, i));
    free(a);
    free(b);
    free(out);
}

/* Reduce-scatter, exact inputs: hierarchical vs flat, bit for bit (in place
 * and out of place). */
static void hc_rs(dt_pg *flat, dt_pg *hier, dt_dtype dt, dt_reduce_op op, size_t n, int inpl)
{
    int rank = dt_pg_rank(flat), W = dt_pg_size(flat);
    size_t es = dt_dtype_size(dt), tot = n * (size_t)W;
    char *a = hc_alloc(tot * es), *b = hc_alloc(tot * es), *ra = hc_alloc(n * es), *rb = hc_alloc(n * es);
    for (size_t i = 0; i < tot; i++)
        dt_dtype_store(dt, a, i, hc_int_value(rank, i, op));
    memcpy(b, a, tot * es);
    HC_OK(dt_pg_reduce_scatter(flat, a, ra, n, dt, op));
    char *out = inpl ? b + (size_t)rank * n * es : rb;
    HC_OK(dt_pg_reduce_scatter(hier, b, out, n, dt, op));
    for (size_t i = 0; i < n; i++)
        HC_CHECK(!memcmp(ra + i * es, out + i * es, es),
                 "reduce_scatter %s %s n=%zu inpl=%d [%zu]: hierarchical %.17g, flat %.17g",
                 dt_dtype_name(dt), dt_reduce_op_name(op), n, inpl, i, dt_dtype_load(dt, out, i),
                 dt_dtype_load(dt, ra, i));
    free(a);
    free(b);
    free(ra);
    free(rb);
}

/* Inexact f32/f64 sums and averages: within the stated bound of the flat
 * result and of the exact sum. */
static void hc_inexact(dt_pg *flat, dt_pg *hier, dt_dtype dt, dt_reduce_op op, size_t n)
{
    int rank = dt_pg_rank(flat), W = dt_pg_size(flat);
    size_t es = dt_dtype_size(dt);
    char *a = hc_alloc(n * es), *b = hc_alloc(n * es);
    for (size_t i = 0; i < n; i++) {
        dt_dtype_store(dt, a, i, hc_real_value(rank, i));
        dt_dtype_store(dt, b, i, hc_real_value(rank, i));
    }
    HC_OK(dt_pg_allreduce(flat, DT_IN_PLACE, a, n, dt, op));
    HC_OK(dt_pg_allreduce(hier, DT_IN_PLACE, b, n, dt, op));
    double u = dt == DT_F32 ? FLT_EPSILON / 2 : DBL_EPSILON / 2;
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        long double exact = 0, mag = 0;
        for (int r = 0; r < W; r++) {
            /* the inputs as the dtype holds them */
            char tmp[8];
            dt_dtype_store(dt, tmp, 0, hc_real_value(r, i));
            long double v = dt_dtype_load(dt, tmp, 0);
            exact += v;
            mag += fabsl(v);
        }
        double div = op == DT_REDUCE_AVG ? W : 1;
        double bound = 2.0 * (W - 1) * u * (double)mag / div + (op == DT_REDUCE_AVG ? 2 * u * (double)mag / div : 0);
        double h = dt_dtype_load(dt, b, i), f = dt_dtype_load(dt, a, i);
        differ += h != f;
        HC_CHECK(fabs(h - f) <= bound, "%s %s n=%zu [%zu]: hierarchical %.17g, flat %.17g, bound %.3g",
                 dt_dtype_name(dt), dt_reduce_op_name(op), n, i, h, f, bound);
        HC_CHECK(fabs(h - (double)(exact / div)) <= bound,
                 "%s %s [%zu]: hierarchical %.17g, exact %.17Lg", dt_dtype_name(dt),
                 dt_reduce_op_name(op), i, h, exact / div);
    }
    (void)differ; /* may be 0 or not: the order differs, the bits may not */
    free(a);
    free(b);
}

/* Check hier's topology against nodes x per_node (0: not checked) and
 * compare every case (quick: f32 and i32 only, fewer counts and
 * reductions; for the test bed, where each collective crosses TCP; the
 * f64 inexact sums stay). Returns the number of
 * failures. */
static int hc_run(dt_pg *flat, int nodes, int per_node, int quick)
{
    hc_fail = 0;
    hc_rank_ = dt_pg_rank(flat);
    int W = dt_pg_size(flat);
    dt_pg *hier = NULL;
    dt_status st = dt_pg_hierarchical(flat, &hier);
    if (st < 0) {
        fprintf(stderr, "[rank %d] dt_pg_hierarchical: %s\n", hc_rank_, dt_last_error());
        return 1;
    }
    dt_pg_topo t = dt_pg_hier_topology(hier);
    if (nodes > 0 && t.nnodes != nodes) {
        fprintf(stderr, "[rank %d] topology: %d nodes, expected %d\n", hc_rank_, t.nnodes, nodes);
        hc_fail++;
    }
    if (per_node > 0 && (t.local_size != per_node || t.local_rank != hc_rank_ % per_node ||
                         t.node != hc_rank_ / per_node || !t.homogeneous)) {
        fprintf(stderr, "[rank %d] topology: node %d local %d/%d homogeneous %d, expected node %d "
                        "local %d/%d\n",
                hc_rank_, t.node, t.local_rank, t.local_size, t.homogeneous, hc_rank_ / per_node,
                hc_rank_ % per_node, per_node);
        hc_fail++;
    }
    int want_hier = t.nnodes > 1 && t.nnodes < W;
    if (dt_pg_is_hierarchical(hier) != want_hier) {
        fprintf(stderr, "[rank %d] dt_pg_is_hierarchical = %d, expected %d\n", hc_rank_,
                dt_pg_is_hierarchical(hier), want_hier);
        hc_fail++;
    }
    const size_t counts[] = {0, 1, 2, 5, 7, 64, 1001, 40000};
    const dt_dtype dts[] = {DT_F32, DT_F64, DT_I32, DT_BF16, DT_U8};
    for (int d = 0; d < (quick ? 3 : 5); d++)
        for (int op = 0; op < DT_REDUCE_OP_COUNT; op++)
            for (int ci = 0; ci < 8; ci++) {
                if (quick && (op == DT_REDUCE_MIN || op == DT_REDUCE_PROD || (ci & 1) || d == 1))
                    continue;
                if (dts[d] != DT_F32 && counts[ci] > 2000)
                    continue;
                if (dts[d] == DT_U8 && op == DT_REDUCE_AVG)
                    continue; /* negative inputs folded to |x|: still exact, but keep it short */
                for (int mode = 0; mode < 3; mode++)
                    if (mode == 0 || (op == DT_REDUCE_SUM && d < 2))
                        hc_exact(flat, hier, dts[d], (dt_reduce_op)op, counts[ci], mode);
            }
    for (int ci = 1; ci < 8; ci += quick ? 2 : 1) {
        hc_inexact(flat, hier, DT_F32, DT_REDUCE_SUM, counts[ci]);
        hc_inexact(flat, hier, DT_F32, DT_REDUCE_AVG, counts[ci]);
        hc_inexact(flat, hier, DT_F64, DT_REDUCE_SUM, counts[ci]);
    }
    for (int op = 0; op < DT_REDUCE_OP_COUNT; op++)
        for (int ci = 0; ci < 8; ci++)
            for (int inpl = 0; inpl < 2; inpl++) {
                if ((quick && ((ci & 1) || (op != DT_REDUCE_SUM && op != DT_REDUCE_MAX))) ||
                    counts[ci] > 2000)
                    continue;
                hc_rs(flat, hier, DT_F32, (dt_reduce_op)op, counts[ci], inpl);
                if (!quick && op != DT_REDUCE_PROD)
                    hc_rs(flat, hier, DT_I32, (dt_reduce_op)op, counts[ci], inpl);
            }
    /* other collectives on the hierarchical group still work (flat) */
    int32_t v[4] = {hc_rank_, 0, 0, 0};
    if (dt_pg_broadcast(hier, v, 4, DT_I32, W - 1) < 0 || v[0] != W - 1) {
        fprintf(stderr, "[rank %d] broadcast on the hierarchical group: %d\n", hc_rank_, v[0]);
        hc_fail++;
    }
    dt_pg_free(hier);
    return hc_fail;
}

#endif /* DT_TEST_HIER_CHECK_H */
