/* Uneven collectives on the shm backend (self at world size 1):
 * reduce_scatterv, allgatherv and alltoallv with counts 0, 1, odd and not divisible by
 * the world size, every dtype, every reduction (sum and max for all dtypes,
 * avg/min/prod on f32 and i32), world sizes 1, 2, 3, 4 and 8; plus the
 * async form overlapping a second request, and NULL / bad arguments.
 * Values are small integers so every dtype (u8, f16, bf16) holds them
 * exactly. */
// dt-test-timeout: 300
#include "comm/harness.h"
#include "test.h"

static const dt_dtype k_dts[] = {DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8};
#define NDT ((int)(sizeof k_dts / sizeof k_dts[0]))

/* Element i of block j as contributed by rank r. */
static double val(int r, int j, size_t i) { return (double)((r + 2 * j + (int)(i % 5)) % 7 + 1); }

static double reduce_ref(dt_reduce_op op, int W, int j, size_t i)
{
    double acc = val(0, j, i);
    for (int r = 1; r < W; r++) {
        double v = val(r, j, i);
        switch (op) {
        case DT_REDUCE_SUM:
        case DT_REDUCE_AVG: acc += v; break;
        case DT_REDUCE_MAX: acc = v > acc ? v : acc; break;
        case DT_REDUCE_MIN: acc = v < acc ? v : acc; break;
        case DT_REDUCE_PROD: acc *= v; break;
        default: break;
        }
    }
    return acc;
}

/* Counts per pattern: all zero but one, ones, odd, not divisible, even. */
static size_t count_of(int pattern, int W, int j)
{
    switch (pattern) {
    case 0: return j == W - 1 ? 3 : 0;
    case 1: return 1;
    case 2: return (size_t)(2 * j + 1);
    case 3: return (size_t)(1000 + 37 * j) % 1001; /* 1000, 36, 73, ... (one block past the slot) */
    case 4: return 9000 + (size_t)j * 4099;           /* staged path */
    default: return 5;                                /* even: plain reduce_scatter */
    }
}
#define NPAT 6

static int vbody(int rank, int W, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    for (int pat = 0; pat < NPAT; pat++) {
        size_t counts[8], total = 0;
        for (int j = 0; j < W; j++) {
            counts[j] = count_of(pat, W, j);
            total += counts[j];
        }
        for (int d = 0; d < NDT; d++) {
            dt_dtype dt = k_dts[d];
            size_t es = dt_dtype_size(dt);
            dt_reduce_op ops[5] = {DT_REDUCE_SUM, DT_REDUCE_MAX, DT_REDUCE_AVG, DT_REDUCE_MIN,
                                   DT_REDUCE_PROD};
            int nops = (dt == DT_F32 || dt == DT_I32) ? 5 : 2;
            char *send = malloc(total * es + 1), *recv = malloc(counts[rank] * es + 1);
            char *all = malloc(total * es + 1);
            TH_CHECK(send && recv && all, "oom");
            for (int o = 0; o < nops; o++) {
                dt_reduce_op op = ops[o];
                if (op == DT_REDUCE_PROD && W > 4)
                    continue; /* 7^8 does not fit the small dtypes */
                size_t off = 0;
                for (int j = 0; j < W; j++)
                    for (size_t i = 0; i < counts[j]; i++)
                        dt_dtype_store(dt, send, off++, val(rank, j, i));
                for (size_t i = 0; i < counts[rank]; i++)
                    dt_dtype_store(dt, recv, i, -1);
                TH_OK(dt_pg_reduce_scatterv(pg, send, recv, counts, dt, op));
                for (size_t i = 0; i < counts[rank]; i++) {
                    double want = reduce_ref(op, W, rank, i);
                    if (op == DT_REDUCE_AVG)
                        want = (dt == DT_I32) ? (double)((long)want / W) : want / W;
                    double got = dt_dtype_load(dt, recv, i);
                    double tol = (dt == DT_F16 || dt == DT_BF16) ? 0.02 * (want < 0 ? -want : want) + 1e-3 : 1e-6 * (want < 0 ? -want : want) + 1e-9;
                    TH_CHECK(got - want <= tol && want - got <= tol,
                             "reduce_scatterv %s %s W=%d pattern %d [%zu]: got %g want %g",
                             dt_dtype_name(dt), dt_reduce_op_name(op), W, pat, i, got, want);
                }
            }
            /* allgatherv of the same counts: block j from rank j. */
            for (size_t i = 0; i < counts[rank]; i++)
                dt_dtype_store(dt, recv, i, val(rank, 0, i));
            TH_OK(dt_pg_allgatherv(pg, recv, all, counts, NULL, dt));
            size_t off = 0;
            for (int j = 0; j < W; j++)
                for (size_t i = 0; i < counts[j]; i++, off++)
                    TH_CHECK(dt_dtype_load(dt, all, off) == val(j, 0, i),
                             "allgatherv %s W=%d pattern %d block %d [%zu]", dt_dtype_name(dt),
                             W, pat, j, i);
            free(send);
            free(recv);
            free(all);
        }
    }
    /* alltoallv: rank i sends f(i, j) elements to rank j (0 included, one
     * pair past the small-message slot), every dtype, packed and with
     * displacements leaving gaps. */
    for (int d = 0; d < NDT; d++) {
        dt_dtype dt = k_dts[d];
        size_t sc[8], rc[8], sd[8], rd[8], so = 0, ro = 0;
        for (int j = 0; j < W; j++) {
            sc[j] = (size_t)((rank * 3 + j * 5) % 4) + (rank == 0 && j == W - 1 ? 5000 : 0);
            rc[j] = (size_t)((j * 3 + rank * 5) % 4) + (j == 0 && rank == W - 1 ? 5000 : 0);
            sd[j] = so;
            rd[j] = ro + 1; /* a gap before each block */
            so += sc[j];
            ro += rc[j] + 1;
        }
        size_t es = dt_dtype_size(dt);
        char *sb = malloc(so * es + 1), *rb = malloc(ro * es + 1), *rp = malloc(ro * es + 1);
        TH_CHECK(sb && rb && rp, "oom");
        for (int j = 0; j < W; j++)
            for (size_t i = 0; i < sc[j]; i++)
                dt_dtype_store(dt, sb, sd[j] + i, val(rank, j, i));
        for (size_t i = 0; i < ro; i++)
            dt_dtype_store(dt, rb, i, 99);
        TH_OK(dt_pg_alltoallv(pg, sb, sc, sd, rb, rc, rd, dt));
        TH_OK(dt_pg_alltoallv(pg, sb, sc, NULL, rp, rc, NULL, dt));
        size_t packed = 0;
        for (int j = 0; j < W; j++) {
            TH_CHECK(dt_dtype_load(dt, rb, rd[j] - 1) == 99, "alltoallv wrote a gap");
            for (size_t i = 0; i < rc[j]; i++, packed++) {
                TH_CHECK(dt_dtype_load(dt, rb, rd[j] + i) == val(j, rank, i),
                         "alltoallv %s W=%d from %d [%zu]", dt_dtype_name(dt), W, j, i);
                TH_CHECK(dt_dtype_load(dt, rp, packed) == val(j, rank, i),
                         "alltoallv packed %s W=%d from %d [%zu]", dt_dtype_name(dt), W, j, i);
            }
        }
        free(sb);
        free(rb);
        free(rp);
    }
    /* Async, overlapping a second request (posted in the same order
     * everywhere). */
    size_t counts[8], total = 0;
    for (int j = 0; j < W; j++)
        total += counts[j] = 3 + (size_t)j * 11;
    float *s = malloc(total * sizeof *s), *r = malloc(counts[rank] * sizeof *r);
    TH_CHECK(s && r, "oom");
    for (size_t i = 0; i < total; i++)
        s[i] = 1.0f;
    float one = 1, cnt = 0;
    dt_req *rq[2];
    TH_OK(dt_pg_reduce_scatterv_async(pg, s, r, counts, DT_F32, DT_REDUCE_SUM, &rq[0]));
    TH_OK(dt_pg_allreduce_async(pg, &one, &cnt, 1, DT_F32, DT_REDUCE_SUM, &rq[1]));
    TH_OK(dt_req_wait_all(rq, 2, -1));
    dt_req_free(rq[0]);
    dt_req_free(rq[1]);
    TH_CHECK(cnt == (float)W, "overlapped allreduce");
    for (size_t i = 0; i < counts[rank]; i++)
        TH_CHECK(r[i] == (float)W, "async reduce_scatterv [%zu] = %g", i, r[i]);
    free(s);
    free(r);
    dt_pg_free(pg);
    return 0;
}

TEST(uneven_collectives_every_dtype_and_size)
{
    static const int sizes[] = {1, 2, 3, 4, 8};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int rc = th_run(sizes[k], 240, vbody, NULL, NULL);
        if (rc)
            fprintf(stderr, "world size %d: rc %d\n", sizes[k], rc);
        ASSERT_EQ_INT(rc, 0);
    }
}

TEST(reduce_scatterv_bad_arguments)
{
    dt_pg_params p = dt_pg_params_default();
    p.rank = 0;
    p.world_size = 1;
    p.backend = "self";
    dt_pg *pg;
    ASSERT_OK(dt_pg_init(&p, &pg));
    float x = 1, y = 0;
    size_t c1 = 1;
    dt_req *rq = (dt_req *)1;
    ASSERT_STATUS(dt_pg_reduce_scatterv(NULL, &x, &y, &c1, DT_F32, DT_REDUCE_SUM), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_reduce_scatterv(pg, &x, &y, NULL, DT_F32, DT_REDUCE_SUM), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_reduce_scatterv(pg, NULL, &y, &c1, DT_F32, DT_REDUCE_SUM), DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_reduce_scatterv(pg, &x, &y, &c1, DT_F32, (dt_reduce_op)99),
                  DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_pg_reduce_scatterv_async(pg, &x, &y, &c1, DT_F32, DT_REDUCE_SUM, NULL),
                  DT_ERR_NULL);
    ASSERT_STATUS(dt_pg_reduce_scatterv_async(pg, &x, &y, &c1, (dt_dtype)99, DT_REDUCE_SUM, &rq),
                  DT_ERR_INVALID_ARG);
    ASSERT(rq == NULL);
    ASSERT_OK(dt_pg_reduce_scatterv(pg, &x, &y, &c1, DT_F32, DT_REDUCE_SUM));
    ASSERT(y == 1.0f);
    dt_pg_free(pg);
}

int main(void)
{
    RUN(reduce_scatterv_bad_arguments);
    RUN(uneven_collectives_every_dtype_and_size);
    return TEST_REPORT();
}
