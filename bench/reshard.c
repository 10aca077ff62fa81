/* reshard — each reshard transition against the collective it runs, on the
 * same bytes (issue 16: overhead target at most 10%).
 *
 *     dtrain run -n 4 -- build/bench/reshard [--rows R] [--cols C] [--reps N] [--warmup N]
 *
 * A 1-d mesh of all ranks and an f32 tensor [R, C] (default 4096 x 256 = 4
 * MiB). For each transition, --reps repetitions (after --warmup): each
 * builds the input dtensor, then times dt_reshard and the bare collective
 * on the same input buffer and counts (output into the same context), in
 * alternating order; medians and minima of each, and their ratios:
 *     S(0) -> R     all-gather of R*C/W per rank
 *     S(1) -> R     all-gather (plus the interleave for a dim other than 0)
 *     P -> R        all-reduce of R*C
 *     P -> S(0)     reduce-scatter of R*C/W
 *     P -> S(1)     reduce-scatter (plus the pack for a dim other than 0)
 *     S(0) -> S(1)  all-to-all of R*C/W^2 per pair
 *     R -> S(1)     local slice vs a memcpy of the slice's bytes
 * Rank 0 prints one line per transition. On a shared machine, run it
 * several times and compare medians (the minima show the unloaded cost).
 * Use rows and cols divisible by the world size (even shards) so the
 * collectives compared are the even ones. */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    int W = dt_pg_size(w), rank = dt_pg_rank(w);
    dt_pg *g = dt_mesh_dim_group(m, 0);
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
    };
    if (rank == 0)
        printf("reshard vs collective: %d ranks, f32 [%lld, %lld] (%.2f MiB), median of %lld\n", W,
               (long long)rows, (long long)cols, (double)n * 4 / (1 << 20), (long long)reps);
    double *tc = malloc((size_t)(reps + warm) * sizeof(double));
    if (!tc)
        return 1;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (only && strcmp(only, cases[c].name) != 0)
            continue;
        /* Interleaved: each repetition builds the input dtensor, then times
         * the reshard and the bare collective on that input's bytes (into a
         * buffer of the same context), in alternating order, so both see
         * the same cache state and the same moment of a shared machine's
         * load. */
        size_t per = (size_t)(n / W);
        for (int64_t r = 0; r < reps + warm; r++) {
            dt_dtensor *x;
            if (dt_shard_tensor(ctx, m, full, &cases[c].from, &x) < 0)
                return 1;
            const void *in = x->local->data;
            void *out = dt_ctx_alloc(ctx, (size_t)n * sizeof(float));
            if (!out)
                return 1;
            for (int half = 0; half < 2; half++) {
                int do_reshard = (half == 0) == (r % 2 == 0);
                dt_pg_barrier(w);
                double t0 = dt_time_s();
                if (do_reshard) {
                    dt_dtensor *y = dt_reshard(ctx, x, NULL, &cases[c].to);
                    t[r] = dt_time_s() - t0;
                    if (!y) {
                        fprintf(stderr, "%s: %s\n", cases[c].name, dt_last_error());
                        return 1;
                    }
                    continue;
                }
                dt_status st = DT_OK;
                switch (c) {
                case 0:
                case 1: st = dt_pg_allgather(g, in, out, per, DT_F32); break;
                case 2: st = dt_pg_allreduce(g, in, out, (size_t)n, DT_F32, DT_REDUCE_SUM); break;
                case 3:
                case 4: st = dt_pg_reduce_scatter(g, in, out, per, DT_F32, DT_REDUCE_SUM); break;
                case 5: st = dt_pg_alltoall(g, in, out, per / (size_t)W, DT_F32); break;
                default: memcpy(out, in, per * sizeof(float)); break;
                }
                tc[r] = dt_time_s() - t0;
                if (st < 0) {
                    fprintf(stderr, "%s collective: %s\n", cases[c].name, dt_last_error());
                    return 1;
                }
            }
            dt_ctx_reset(ctx);
        }
        double mr = median(t + warm, (int)reps), mc = median(tc + warm, (int)reps);
        double lr = t[warm], lc = tc[warm]; /* sorted by median(): the minima */
        if (rank == 0)
            printf("  %-13s reshard %8.1f us (min %8.1f)   collective %8.1f us (min %8.1f)   "
                   "ratio %.2f (of minima %.2f)\n",
                   cases[c].name, mr * 1e6, lr * 1e6, mc * 1e6, lc * 1e6, mc > 0 ? mr / mc : 0,
                   lc > 0 ? lr / lc : 0);
    }
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
