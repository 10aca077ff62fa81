/* dtrain bench matmul — f32 and bf16 matmul GFLOP/s through dt_k_matmul,
 * the figure other benchmarks quote as the machine's peak.
 *
 *   dtrain bench matmul [--size 2048] [--reps 5] [--threads N] [--json]
 *
 * Prints the best of --reps timed runs after a warm-up, per dtype. bf16 is
 * marked "emulated" where oneDNN has no native bf16 matmul for the CPU
 * (inputs are widened to f32, so it measures f32 speed plus widening). */
#include "cmd.h"
#include "dtrain/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain bench matmul [--size N] [--reps R] [--threads T] [--json]\n"
               "  n x n x n matmul, best of R runs (defaults: 2048, 5, OMP_NUM_THREADS or all cores)\n");
}

int dt_bench_matmul(int argc, char **argv)
{
    long long n = 2048;
    int reps = 5, threads = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && !strcmp(a, "--size"))
            n = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--reps"))
            reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(a, "--threads"))
            threads = atoi(argv[++i]);
        else {
            dt__cli_err("dtrain bench matmul: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (n <= 0 || reps <= 0 || threads < 0) {
        dt__cli_err("dtrain bench matmul: --size, --reps must be positive, --threads >= 0\n");
        return 2;
    }
    if (threads)
        dt_set_num_threads(threads);
    const dt_dtype types[2] = {DT_F32, DT_BF16};
    int rc = 0;
    for (int t = 0; t < 2; t++) {
        double g = 0.0;
        dt_status st = dt_k_bench_matmul(n, types[t], reps, &g);
        const char *path = types[t] == DT_F32 ? "native" : dt_k_matmul_bf16_native() ? "native" : "emulated";
        if (st < 0) {
            dt__cli_err("dtrain bench matmul: %s: %s: %s\n", dt_dtype_name(types[t]), dt_status_name(st),
                    dt_last_error());
            rc = 1;
            continue;
        }
        if (json)
            printf("{\"bench\":\"matmul\",\"dtype\":\"%s\",\"n\":%lld,\"threads\":%d,\"reps\":%d,"
                   "\"gflops\":%.1f,\"path\":\"%s\"}\n",
                   dt_dtype_name(types[t]), n, dt_get_num_threads(), reps, g, path);
        else
            printf("matmul %-4s %lldx%lldx%lld threads %d: %8.1f GFLOP/s (best of %d, %s)\n",
                   dt_dtype_name(types[t]), n, n, n, dt_get_num_threads(), g, reps, path);
    }
    return rc;
}
