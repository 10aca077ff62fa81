/* attn_lp — attention over a bf16 qkv, forward + backward through the
 * tape, two ways in one process, interleaved: "direct" (dt_attention reads
 * the bf16 qkv as it is: one node) and "widened" (dt_cast to f32, the f32
 * op, dt_cast back to bf16: the composition the direct op replaces, with
 * the same bits). Single thread by default.
 *
 *     build/bench/attn_lp [--batch 4] [--seq 64] [--heads 12] [--hdim 64] [--reps 21] [--threads 1]
 *
 * Prints each way's median CPU ms per forward + backward over the
 * repetitions and the ratio direct / widened (the median of the per-pair
 * ratios). */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cpu.h"

/* One forward + backward; the CPU seconds it took, or -1 on an error. */
static double run(dt_ctx *ctx, dt_tensor *x, dt_tensor *R, int H, bool direct)
{
    double t0 = cpu_s();
    dt_tensor *y = direct ? dt_attention(ctx, x, H, true, 0.0f, true, (dt_rng_key){0})
                          : dt_cast(ctx, dt_attention(ctx, dt_cast(ctx, x, DT_F32), H, true, 0.0f, true,
                                                      (dt_rng_key){0}),
                                    DT_BF16);
    if (!y || dt_backward_with(ctx, y, R) < 0)
        return -1.0;
    double t = cpu_s() - t0;
    dt_ctx_reset(ctx);
    return t;
}

int main(int argc, char **argv)
{
    int64_t B = 4, T = 64, H = 12, D = 64, reps = 21, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t *t = !strcmp(argv[i], "--batch")     ? &B
                     : !strcmp(argv[i], "--seq")     ? &T
                     : !strcmp(argv[i], "--heads")   ? &H
                     : !strcmp(argv[i], "--hdim")    ? &D
                     : !strcmp(argv[i], "--reps")    ? &reps
                     : !strcmp(argv[i], "--threads") ? &threads
                                                     : NULL;
        if (!t || dt_parse_int(argv[i], argv[i + 1], 1, 4096, t) < 0) {
            fprintf(stderr, "usage: attn_lp [--batch B] [--seq T] [--heads H] [--hdim D] [--reps N] [--threads N]\n");
            return 2;
        }
    }
    if (D > 256) {
        fprintf(stderr, "attn_lp: --hdim %lld is above the kernel's 256\n", (long long)D);
        return 2;
    }
    dt_set_num_threads((int)threads);
    const int64_t C = H * D, M = B * T * 3 * C, N = B * T * C;
    dt_ctx *ctx = NULL;
    float *xv = malloc((size_t)M * 4), *gv = malloc((size_t)N * 4);
    if (!xv || !gv || dt_ctx_init(NULL, &ctx) < 0)
        return 1;
    dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, 0, 0), 0, xv, M, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, 1, 0), 0, gv, N, -1.0f, 1.0f);
    dt_tensor *x = dt_tensor_new(DT_BF16, 3, (const int64_t[]){B, T, 3 * C});
    dt_tensor *g = dt_tensor_new(DT_F32, 3, (const int64_t[]){B, T, 3 * C});
    dt_tensor *R = dt_tensor_new(DT_F32, 3, (const int64_t[]){B, T, C});
    if (!x || !g || !R || dt_k_convert(xv, DT_F32, x->data, DT_BF16, M) < 0 || dt_tensor_zero(g) < 0 ||
        dt_tensor_set_grad(x, g) < 0)
        return 1;
    memcpy(R->data, gv, (size_t)N * 4);
    double *td = calloc((size_t)reps, sizeof *td), *tw = calloc((size_t)reps, sizeof *tw);
    double *ratio = calloc((size_t)reps, sizeof *ratio);
    for (int w = 0; w < 2; w++) /* warm-up: the arena's pages */
        if (run(ctx, x, R, (int)H, true) < 0 || run(ctx, x, R, (int)H, false) < 0) {
            fprintf(stderr, "attn_lp: %s\n", dt_last_error());
            return 1;
        }
    for (int64_t k = 0; k < reps; k++) {
        bool first = k % 2 == 0; /* A B, then B A */
        double a = run(ctx, x, R, (int)H, first), b = run(ctx, x, R, (int)H, !first);
        if (a < 0 || b < 0) {
            fprintf(stderr, "attn_lp: %s\n", dt_last_error());
            return 1;
        }
        td[k] = 1e3 * (first ? a : b);
        tw[k] = 1e3 * (first ? b : a);
        ratio[k] = td[k] / tw[k];
    }
    printf("attn_lp: B %lld T %lld H %lld D %lld, %lld thread(s), isa %s, median CPU ms of %lld pairs\n",
           (long long)B, (long long)T, (long long)H, (long long)D, (long long)threads, dt_k_isa_name(dt_k_get_isa()),
           (long long)reps);
    printf("  direct   %8.3f ms\n  widened  %8.3f ms\n  ratio    %8.3f (direct / widened)\n", median(td, (int)reps),
           median(tw, (int)reps), median(ratio, (int)reps));
    free(td);
    free(tw);
    free(ratio);
    dt_tensor_free(x);
    dt_tensor_free(g);
    dt_tensor_free(R);
    dt_ctx_free(ctx);
    free(xv);
    free(gv);
    return 0;
}
