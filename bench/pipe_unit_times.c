/* A zoo model's pipeline units: the estimated compute (DT_PIPE_BY_COMPUTE)
 * against the measured forward + backward time (DT_PIPE_BY_TIME,
 * dt_pipe_unit_times), and the cut each gives, in one process:
 *
 *     build/bench/pipe_unit_times [--model gpt-mini] [--vocab-size 4096] [--block-size 64] [--rows 2]
 *                                 [--threads 1] [--runs 5] [--reps 3] [-p 2]
 *
 * The input is one micro-batch of --rows sequences of random tokens (the
 * docs/BENCHMARKS.md pipeline runs: batch 16 as 8 micro-batches = 2 rows).
 * Each of --runs measurements is what one rank of the strategy does at
 * attach (one warm-up, --reps passes, each unit's least time); the table
 * shows each unit's share of the whole by the estimate and by each run's
 * times, then the cut into -p stages (the first unit of each later stage)
 * and the busiest stage's share of the measured time under either cut (the
 * runs' median times). */
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The largest stage's share of sum(w) under starts[0..p). */
static double busiest(const double *w, int n, const int *starts, int p)
{
    double tot = 0, mx = 0;
    for (int i = 0; i < n; i++)
        tot += w[i];
    for (int s = 0; s < p; s++) {
        double c = 0;
        for (int i = starts[s]; i < (s + 1 < p ? starts[s + 1] : n); i++)
            c += w[i];
        mx = c > mx ? c : mx;
    }
    return mx / tot;
}

static void print_cut(const char *what, const int *starts, int p)
{
    printf("%s cut:", what);
    for (int s = 1; s < p; s++)
        printf(" %d", starts[s]);
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *model = "gpt-mini";
    int vocab = 4096, block = 64, rows = 2, threads = 1, runs = 5, reps = 3, p = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model"))
            model = v;
        else if (!strcmp(k, "--vocab-size"))
            vocab = atoi(v);
        else if (!strcmp(k, "--block-size"))
            block = atoi(v);
        else if (!strcmp(k, "--rows"))
            rows = atoi(v);
        else if (!strcmp(k, "--threads"))
            threads = atoi(v);
        else if (!strcmp(k, "--runs"))
            runs = atoi(v);
        else if (!strcmp(k, "--reps"))
            reps = atoi(v);
        else if (!strcmp(k, "-p"))
            p = atoi(v);
        else {
            fprintf(stderr, "pipe_unit_times: unknown option %s\n", k);
            return 2;
        }
    }
    if (rows < 1 || runs < 1 || runs > 64 || reps < 1 || p < 1 || block < 1) {
        fprintf(stderr, "pipe_unit_times: bad --rows, --runs (1..64), --reps, -p or --block-size\n");
        return 2;
    }
    dt_set_num_threads(threads);
    dt_model_config c = dt_model_config_default();
    c.vocab_size = vocab, c.block_size = block, c.seq = block;
    dt_model *m;
    dt_model_desc d;
    dt_pipe_unit *u;
    int n;
    if (dt_model_create(model, 1, &c, &m, &d) < 0 || dt_model_pipe_units(m, &u, &n) < 0) {
        fprintf(stderr, "pipe_unit_times: %s\n", dt_last_error());
        return 1;
    }
    int64_t *tok = calloc((size_t)rows * (size_t)block, sizeof *tok);
    double *est = calloc((size_t)n, sizeof *est), *t = calloc((size_t)n * (size_t)runs, sizeof *t),
           *med = calloc((size_t)n, sizeof *med), *col = calloc((size_t)runs, sizeof *col);
    int *se = calloc((size_t)p, sizeof *se), *st = calloc((size_t)p, sizeof *st);
    if (!tok || !est || !t || !med || !col || !se || !st) {
        fprintf(stderr, "pipe_unit_times: out of memory\n");
        return 1;
    }
    uint64_t r = 12345;
    for (int64_t i = 0; i < (int64_t)rows * block; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        tok[i] = (int64_t)((r >> 33) % (uint64_t)vocab);
    }
    dt_tensor x;
    if (dt_tensor_init_contiguous(&x, DT_I64, 2, (int64_t[]){rows, block}, tok) < 0 ||
        dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_COMPUTE, est) < 0) {
        fprintf(stderr, "pipe_unit_times: %s\n", dt_last_error());
        return 1;
    }
    for (int k = 0; k < runs; k++) {
        double *tk = t + (size_t)k * (size_t)n;
        if (dt_pipe_unit_times(m, u, n, &x, DT_F32, reps, tk) < 0 || dt_pipe_balance(tk, n, p, 1, st) < 0) {
            fprintf(stderr, "pipe_unit_times: %s\n", dt_last_error());
            return 1;
        }
        print_cut("run", st, p);
    }
    double se_tot = 0, tt = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < runs; k++)
            col[k] = t[(size_t)k * (size_t)n + (size_t)i];
        qsort(col, (size_t)runs, sizeof *col, cmp_d);
        med[i] = runs % 2 ? col[runs / 2] : 0.5 * (col[runs / 2 - 1] + col[runs / 2]);
        se_tot += est[i];
        tt += med[i];
    }
    printf("%-28s %10s %10s %12s  (model %s, %d x %d tokens, %d thread(s), %d runs of %d reps)\n", "unit",
           "est share", "time share", "median ms", model, rows, block, threads, runs, reps);
    for (int i = 0; i < n; i++)
        printf("%-28s %10.4f %10.4f %12.3f\n", u[i].name, est[i] / se_tot, med[i] / tt, 1e3 * med[i]);
    if (dt_pipe_balance(est, n, p, 1, se) < 0 || dt_pipe_balance(med, n, p, 1, st) < 0) {
        fprintf(stderr, "pipe_unit_times: %s\n", dt_last_error());
        return 1;
    }
    print_cut("compute (estimate)", se, p);
    print_cut("time (median of the runs)", st, p);
    printf("busiest stage's share of the measured time: compute cut %.4f, time cut %.4f (ideal %.4f)\n",
           busiest(med, n, se, p), busiest(med, n, st, p), 1.0 / p);
    dt_free(u);
    dt_model_free(m);
    free(tok);
    free(est);
    free(t);
    free(med);
    free(col);
    free(se);
    free(st);
    return 0;
}
