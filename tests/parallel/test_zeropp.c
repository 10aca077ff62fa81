/* ZeRO++'s collectives (zeropp.h) on real processes, machines simulated
 * with DT_SIM_LOCAL_SIZE:
 *   - qwZ: the int8 all-gather gives every rank's shard within half a block
 *     scale, and exactly what quantizing that shard locally gives;
 *   - qgZ: the two-hop quantized reduce-scatter (2 machines x 2 ranks, 1 x
 *     4, 4 x 1; int8 and int4; sum and average) is within the quantization
 *     bound of the exact sum, int8 closer than int4, and identical on a
 *     second run (fixed summation order);
 *   - a NaN in one rank's gradient makes that piece NaN on its owner only;
 *   - ranks not numbered machine by machine are refused by name. */
// dt-test-labels: threads
#include "comm/harness.h"
#include "test.h"

#include "dtrain/kernels.h"
#include "dtrain/zeropp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_EL 1000 /* elements per piece: not a multiple of the block */
#define BLOCK 64

static float val(int rank, size_t i) /* rank r's value i: smooth, signed, per-rank */
{
    return sinf(0.37f * (float)i + (float)rank) * (1.0f + (float)(i % 5));
}

static int body_allgather(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    float *shard = malloc(sizeof(float) * N_EL), *out = malloc(sizeof(float) * N_EL * (size_t)W);
    float *ref = malloc(sizeof(float) * N_EL), sc[(N_EL + BLOCK - 1) / BLOCK];
    int8_t *q = malloc(N_EL);
    TH_CHECK(shard && out && ref && q, "out of memory");
    for (size_t i = 0; i < N_EL; i++)
        shard[i] = val(rank, i);
    TH_OK(dt_zpp_allgather_q8(pg, shard, N_EL, BLOCK, out));
    for (int r = 0; r < W; r++) {
        for (size_t i = 0; i < N_EL; i++)
            shard[i] = val(r, i);
        TH_OK(dt_k_quantize_blocks(shard, N_EL, BLOCK, 8, q, sc));
        TH_OK(dt_k_dequantize_blocks(q, sc, N_EL, BLOCK, 8, ref, false));
        for (size_t i = 0; i < N_EL; i++) {
            TH_CHECK(out[(size_t)r * N_EL + i] == ref[i], "rank %d's element %zu: %g, local quantization %g", r, i,
                     out[(size_t)r * N_EL + i], ref[i]);
            TH_CHECK(fabsf(out[(size_t)r * N_EL + i] - shard[i]) <= sc[i / BLOCK] / 2 * 1.0001f,
                     "rank %d's element %zu off by more than half a scale", r, i);
        }
    }
    free(shard), free(out), free(ref), free(q);
    dt_pg_free(pg);
    return 0;
}

typedef struct {
    int bits;
    bool average, nan;
} rs_case;

static int body_rs(int rank, int W, void *arg)
{
    const rs_case *c = arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_zpp *z;
    TH_OK(dt_zpp_init(pg, &z));
    const int L = dt_zpp_local_size(z);
    float *in = malloc(sizeof(float) * N_EL * (size_t)W), *out = malloc(sizeof(float) * N_EL);
    float *out2 = malloc(sizeof(float) * N_EL);
    TH_CHECK(in && out && out2, "out of memory");
    for (int p = 0; p < W; p++)
        for (size_t i = 0; i < N_EL; i++)
            in[(size_t)p * N_EL + i] = val(rank * 31 + p, i);
    if (c->nan && rank == 1)
        in[(size_t)2 * N_EL + 17] = NAN; /* rank 1's gradient for rank 2's piece */
    TH_OK(dt_zpp_reduce_scatter_q(z, in, out, N_EL, BLOCK, c->bits, c->average));
    TH_OK(dt_zpp_reduce_scatter_q(z, in, out2, N_EL, BLOCK, c->bits, c->average));
    TH_CHECK(!memcmp(out, out2, sizeof(float) * N_EL), "two runs differ");
    if (c->nan) {
        for (size_t i = 0; i < N_EL; i++)
            TH_CHECK(rank == 2 ? isnan(out[i]) == (i / BLOCK == 17 / BLOCK) : isfinite(out[i]),
                     "rank %d element %zu: %g (only block %d of rank 2's piece may be NaN)", rank, i, out[i],
                     17 / BLOCK);
    } else {
        /* per hop an element is off by at most half its block's scale; the
         * scale of a block is at most max |x| / qmax; local sums of L ranks,
         * then the machines' sums: a loose bound of (L + W) max|x| / qmax */
        double qmax = c->bits == 8 ? 127 : 7, worst = 0, amax = 6.0; /* |val| <= 5 */
        for (size_t i = 0; i < N_EL; i++) {
            double exact = 0;
            for (int r = 0; r < W; r++)
                exact += val(r * 31 + rank, i);
            if (c->average)
                exact /= W;
            double e = fabs(out[i] - exact);
            worst = e > worst ? e : worst;
        }
        double bound = (L + W) * amax / qmax / (c->average ? W : 1);
        TH_CHECK(worst <= bound, "%d bits: error %.4g above the bound %.4g", c->bits, worst, bound);
        TH_CHECK(worst > 0, "%d bits: no quantization error at all (not quantized?)", c->bits);
        th_shared[rank] = worst;
    }
    free(in), free(out), free(out2);
    dt_zpp_free(z);
    dt_pg_free(pg);
    return 0;
}

static double rs(int W, const char *sim, int bits, bool average)
{
    setenv("DT_SIM_LOCAL_SIZE", sim, 1);
    rs_case c = {bits, average, false};
    int rc = th_run(W, 60.0, body_rs, &c, NULL);
    unsetenv("DT_SIM_LOCAL_SIZE");
    if (rc != 0)
        return -1;
    double w = 0;
    for (int r = 0; r < W; r++)
        w = th_shared[r] > w ? th_shared[r] : w;
    return w;
}

TEST(qwz_allgather) { ASSERT_EQ_INT(th_run(3, 60.0, body_allgather, NULL, NULL), 0); }

TEST(qgz_2x2_int8_closer_than_int4)
{
    double e8 = rs(4, "2", 8, false), e4 = rs(4, "2", 4, false);
    ASSERT(e8 > 0 && e4 > 0);
    ASSERT(e8 < e4);
}

TEST(qgz_shapes_and_average)
{
    ASSERT(rs(4, "4", 4, true) > 0); /* one machine of 4 */
    ASSERT(rs(4, "1", 8, true) > 0); /* 4 machines of 1 */
    ASSERT(rs(4, "2", 4, true) > 0);
}

TEST(qgz_nan_reaches_its_owner)
{
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    rs_case c = {4, false, true};
    ASSERT_EQ_INT(th_run(4, 60.0, body_rs, &c, NULL), 0);
    unsetenv("DT_SIM_LOCAL_SIZE");
}

static int body_layout(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_zpp *z = NULL;
    dt_status st = dt_zpp_init(pg, &z); /* 3 ranks as machines of 2: the last machine is smaller */
    TH_CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "machine by machine") && !z,
             "rank %d: %s: %s", rank, dt_status_name(st), dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(uneven_machines_refused)
{
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    ASSERT_EQ_INT(th_run(3, 60.0, body_layout, NULL, NULL), 0);
    unsetenv("DT_SIM_LOCAL_SIZE");
}

/* Forked ranks only until the end: the parent runs no OpenMP kernel (a
 * child of a process whose OpenMP pool has started can hang). */
int main(void)
{
    RUN(qwz_allgather);
    RUN(qgz_2x2_int8_closer_than_int4);
    RUN(qgz_shapes_and_average);
    RUN(qgz_nan_reaches_its_owner);
    RUN(uneven_machines_refused);
    return TEST_REPORT();
}
