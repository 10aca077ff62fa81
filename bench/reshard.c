/* reshard — each reshard transition against the collective it runs, on the
 * same bytes (issue 16: overhead target at most 10%).
 *
 *     dtrain run -n 4 -- build/bench/reshard [--rows R] [--cols C] [--reps N] [--warmup N]
 *
 * A 1-d mesh of all ranks and an f32 tensor [R, C] (default 4096 x 256 = 4
 * MiB). For each transition, --reps repetitions (after --warmup): each
 * builds the input dtensor, then times dt_reshard, the communication call
 * it makes ("its op", with the same strided layouts), and the plain
 * collective on the same input buffer and counts (outputs from the same
 * context: warm arena memory, no page faults in any of the three), in an
 * order rotating between repetitions; medians and minima of each, their
 * ratios, and the minima of CPU time. The plain collectives ("ratio", the
 * issue's figure):
 *     S(0) -> R     all-gather of R*C/W per rank
 *     S(1) -> R     all-gather (plus the interleave for a dim other than 0)
 *     P -> R        all-reduce of R*C
 *     P -> S(0)     reduce-scatter of R*C/W
 *     P -> S(1)     reduce-scatter (plus the pack for a dim other than 0)
 *     S(0) -> S(1)  all-to-all of R*C/W^2 per pair
 *     R -> S(1)     local slice vs a memcpy of the slice's bytes
 *     R -> R cross  (even world) from the mesh of the first half of the
 *                   ranks to the second: a send/recv of R*C per pair
 * Its op differs from the plain one for S(1) -> R (dt_pg_allgather_blocks),
 * P -> S(1) (dt_pg_reduce_scatter_blocks), S(0) -> S(1)
 * (dt_pg_alltoall_blocks) and R -> S(1) (the strided row copy, dt__copy_rows
 * of src/base/copy.h); elsewhere it is
 * the same call timed twice (its ratio is the noise). reshard/op is the
 * reshard layer's own cost, op/collective the strided layout's; the op's
 * output is checked bit-equal to the reshard's after the last repetition.
 * Rank 0 prints one line per transition. On a shared machine, run it
 * several times and compare medians (the minima show the unloaded cost).
 * Use rows and cols divisible by the world size (even shards) so the
 * collectives compared are the even ones. */
#include "base/copy.h"

#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this process (every thread: a comm engine's too), s. Under
 * load a descheduled rank's wall time grows but its CPU time does not. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int main(int argc, char **argv)
{
    int64_t rows = 4096, cols = 256, reps = 20, warm = 3;
    const char *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--case")) {
            only = argv[i + 1];
            continue;
        }
        int64_t *t = !strcmp(argv[i], "--rows") ? &rows : !strcmp(argv[i], "--cols") ? &cols
                   : !strcmp(argv[i], "--reps") ? &reps : !strcmp(argv[i], "--warmup") ? &warm : NULL;
        if (!t || dt_parse_int(argv[i], argv[i + 1], 1, 1 << 26, t) < 0) {
            fprintf(stderr, "usage: reshard [--rows R] [--cols C] [--reps N] [--warmup N] [--case NAME]\n");
            return 2;
        }
    }
    dt_pg *w;
    dt_mesh *m;
    dt_ctx *ctx;
    if (dt_pg_init(NULL, &w) < 0 || dt_mesh_init(w, 1, (int[]){dt_pg_size(w)}, NULL, NULL, &m) < 0 ||
        dt_ctx_init(NULL, &ctx) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    int W = dt_pg_size(w), rank = dt_pg_rank(w), h = W / 2;
    dt_pg *g = dt_mesh_dim_group(m, 0);
    /* across meshes: the first half of the ranks to the second (even W) */
    dt_mesh *ma = NULL, *mb = NULL;
    int *hr = malloc((size_t)W * sizeof(int));
    if (!hr)
        return 1;
    for (int r = 0; r < W; r++)
        hr[r] = r;
    if (W % 2 == 0 && (dt_mesh_init(w, 1, &h, hr, NULL, &ma) < 0 ||
                       dt_mesh_init(w, 1, &h, hr + h, NULL, &mb) < 0)) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    int64_t n = rows * cols;
    dt_tensor *full = dt_tensor_new(DT_F32, 2, (int64_t[]){rows, cols});
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    double *t = malloc((size_t)(reps + warm) * sizeof(double));
    if (!full || !a || !b || !t)
        return 1;
    dt_tensor_rand_uniform(full, dt_rng_key_make(1, DT_RNG_DATA, 0, 0), -1, 1);
    memcpy(a, full->data, (size_t)n * sizeof(float));
    struct {
        const char *name;
        dt_placement from, to;
    } cases[] = {
        {"S(0) -> R", dt_shard(0), dt_replicate()},
        {"S(1) -> R", dt_shard(1), dt_replicate()},
        {"P -> R", dt_partial(DT_REDUCE_SUM), dt_replicate()},
        {"P -> S(0)", dt_partial(DT_REDUCE_SUM), dt_shard(0)},
        {"P -> S(1)", dt_partial(DT_REDUCE_SUM), dt_shard(1)},
        {"S(0) -> S(1)", dt_shard(0), dt_shard(1)},
        {"R -> S(1)", dt_replicate(), dt_shard(1)},
        {"R -> R cross", dt_replicate(), dt_replicate()},
    };
    if (rank == 0)
        printf("reshard vs collective: %d ranks, f32 [%lld, %lld] (%.2f MiB), median of %lld\n", W,
               (long long)rows, (long long)cols, (double)n * 4 / (1 << 20), (long long)reps);
    double *tc = malloc((size_t)(reps + warm) * sizeof(double));
    double *te = malloc((size_t)(reps + warm) * sizeof(double));
    double *cr = malloc((size_t)(reps + warm) * sizeof(double));
    double *cc = malloc((size_t)(reps + warm) * sizeof(double));
    double *ce = malloc((size_t)(reps + warm) * sizeof(double));
    dt_pg_block *blk = malloc(2 * (size_t)W * sizeof *blk);
    if (!tc || !te || !cr || !cc || !ce || !blk)
        return 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if ((only && strcmp(only, cases[c].name) != 0) || (c == 7 && !ma))
            continue;
        dt_mesh *mf = c == 7 ? ma : m, *mt = c == 7 ? mb : NULL;
        /* Interleaved: each repetition builds the input dtensor, then times
         * three things on that input's bytes (outputs in the same context),
         * in an order that rotates between repetitions, so all see the same
         * cache state and the same moment of a shared machine's load:
         *   the reshard;
         *   "its op": the communication call the reshard makes, alone, with
         *     the same layouts (the _blocks form for an inner dim; for
         *     R -> S(1) the strided row copy), so reshard / op is what the
         *     reshard layer itself adds (agreement check, planning, output
         *     tensor, dtensor);
         *   "plain": the contiguous collective on the same bytes (for
         *     R -> S(1) one memcpy), so op / plain is what the strided
         *     layout costs. reshard / plain is the issue's figure.
         * Both outputs of the comparisons are checked equal to the
         * reshard's (bit for bit) after the last repetition. */
        size_t per = (size_t)(n / W);
        int64_t lc = cols / W, lr = rows / W;
        bool even = rows % W == 0 && cols % W == 0;
        for (int r = 0; r < W; r++) {
            switch (c) {
            case 1:
            case 4: blk[r] = (dt_pg_block){(size_t)(r * lc), (size_t)rows, (size_t)lc, (size_t)cols}; break;
            case 5:
                blk[r] = (dt_pg_block){(size_t)(r * lc), (size_t)lr, (size_t)lc, (size_t)cols};
                blk[W + r] = (dt_pg_block){(size_t)(r * lr * lc), 1, (size_t)(lr * lc), (size_t)(rows * lc)};
                break;
            default: break;
            }
        }
        for (int64_t r = 0; r < reps + warm; r++) {
            dt_dtensor *x;
            if (dt_shard_tensor(ctx, mf, full, &cases[c].from, &x) < 0)
                return 1;
            const float *in = x->local->data;
            float *out = dt_ctx_alloc(ctx, (size_t)n * sizeof(float));
            float *oute = dt_ctx_alloc(ctx, (size_t)n * sizeof(float));
            if (!out || !oute)
                return 1;
            dt_dtensor *y = NULL;
            for (int k = 0; k < 3; k++) {
                int what = (int)((k + r) % 3); /* 0 reshard, 1 its op, 2 plain */
                if (what == 1 && !even) {
                    te[r] = ce[r] = 0;
                    continue;
                }
                dt_pg_barrier(w);
                double c0 = cpu_s(), t0 = dt_time_s();
                dt_status st = DT_OK;
                if (what == 0) {
                    y = dt_reshard(ctx, x, mt, &cases[c].to);
                    t[r] = dt_time_s() - t0;
                    cr[r] = cpu_s() - c0;
                    if (!y) {
                        fprintf(stderr, "%s: %s\n", cases[c].name, dt_last_error());
                        return 1;
                    }
                    continue;
                }
                float *o = what == 1 ? oute : out;
                switch (c) {
                case 0: st = dt_pg_allgather(g, in, o, per, DT_F32); break;
                case 1:
                    st = what == 1 ? dt_pg_allgather_blocks(g, in, o, blk, DT_F32)
                                   : dt_pg_allgather(g, in, o, per, DT_F32);
                    break;
                case 2: st = dt_pg_allreduce(g, in, o, (size_t)n, DT_F32, DT_REDUCE_SUM); break;
                case 3: st = dt_pg_reduce_scatter(g, in, o, per, DT_F32, DT_REDUCE_SUM); break;
                case 4:
                    st = what == 1 ? dt_pg_reduce_scatter_blocks(g, in, blk, o, per, DT_F32, DT_REDUCE_SUM)
                                   : dt_pg_reduce_scatter(g, in, o, per, DT_F32, DT_REDUCE_SUM);
                    break;
                case 5:
                    st = what == 1 ? dt_pg_alltoall_blocks(g, in, blk, o, blk + W, per / (size_t)W, DT_F32)
                                   : dt_pg_alltoall(g, in, o, per / (size_t)W, DT_F32);
                    break;
                case 7:
                    st = rank < h ? dt_pg_send(w, in, (size_t)n, DT_F32, rank + h)
                                  : dt_pg_recv(w, o, (size_t)n, DT_F32, rank - h);
                    break;
                default:
                    if (what == 1)
                        dt__copy_rows(o, (size_t)lc * sizeof(float), in + rank * lc,
                                      (size_t)cols * sizeof(float), (size_t)rows,
                                      (size_t)lc * sizeof(float));
                    else
                        memcpy(o, in, per * sizeof(float));
                    break;
                }
                (what == 1 ? te : tc)[r] = dt_time_s() - t0;
                (what == 1 ? ce : cc)[r] = cpu_s() - c0;
                if (st < 0) {
                    fprintf(stderr, "%s collective: %s\n", cases[c].name, dt_last_error());
                    return 1;
                }
            }
            if (even && r == reps + warm - 1) {
                /* the op compared is the same work: its output is the reshard's */
                size_t nb = dt_tensor_nbytes(y->local);
                int64_t want = c == 7 ? (rank < h ? 0 : n) : c == 0 || c == 1 || c == 2 ? n : (int64_t)per;
                if ((int64_t)nb != want * 4 ||
                    memcmp(y->local->data, oute, nb) != 0) {
                    fprintf(stderr, "%s: the op compared gives other bytes than the reshard\n",
                            cases[c].name);
                    return 1;
                }
            }
            dt_ctx_reset(ctx);
        }
        double mr = median(t + warm, (int)reps), mc = median(tc + warm, (int)reps);
        double lr0 = t[warm], lc0 = tc[warm]; /* sorted by median(): the minima */
        double me = median(te + warm, (int)reps), le = te[warm];
        median(cr + warm, (int)reps);
        median(cc + warm, (int)reps);
        median(ce + warm, (int)reps);
        if (rank == 0) {
            printf("  %-13s reshard %8.1f us (min %8.1f)   collective %8.1f us (min %8.1f)   "
                   "ratio %.2f (of minima %.2f)\n",
                   cases[c].name, mr * 1e6, lr0 * 1e6, mc * 1e6, lc0 * 1e6, mc > 0 ? mr / mc : 0,
                   lc0 > 0 ? lr0 / lc0 : 0);
            if (even)
                printf("  %-13s its op  %8.1f us (min %8.1f)   reshard/op %.2f (of minima %.2f)   "
                       "op/collective of minima %.2f   cpu minima us: reshard %.1f op %.1f "
                       "collective %.1f\n",
                       "", me * 1e6, le * 1e6, me > 0 ? mr / me : 0, le > 0 ? lr0 / le : 0,
                       lc0 > 0 ? le / lc0 : 0, cr[warm] * 1e6, ce[warm] * 1e6, cc[warm] * 1e6);
        }
    }
    free(blk);
    free(te);
    free(cr);
    free(cc);
    free(ce);
    free(hr);
    dt_mesh_free(mb);
    dt_mesh_free(ma);
    free(tc);
    free(a);
    free(b);
    free(t);
    dt_tensor_free(full);
    dt_ctx_free(ctx);
    dt_mesh_free(m);
    dt_pg_free(w);
    return 0;
}
