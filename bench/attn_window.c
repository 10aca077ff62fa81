/* attn_window — dt_attention_window's forward and backward (a soft cap
 * and/or a sliding window) and, for the scale, dt_attention's blocked
 * causal kernel on the same qkv, interleaved in one process. qkv f32 or
 * bf16 (--dtype), wall time.
 *
 *     build/bench/attn_window [--batch 1] [--seq 1024] [--heads 8] [--hdim 64] [--window 0] [--cap 50]
 *                             [--dtype f32] [--reps 7] [--threads 2]
 *
 * Prints one line per kernel: the median forward and backward ms over the
 * repetitions (bench/attn_window_peer.sh sets them beside PyTorch's eager
 * soft-capped attention). */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cpu.h"

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One forward + backward: the seconds of each, or -1 on an error. */
static int run(dt_ctx *ctx, dt_tensor *x, int H, int64_t window, float cap, bool windowed, double *f, double *b)
{
    double t0 = wall_s();
    dt_tensor *y = windowed ? dt_attention_window(ctx, x, H, window, cap)
                         : dt_attention(ctx, x, H, true, 0.0f, false, (dt_rng_key){0});
    double t1 = wall_s();
    if (!y || dt_backward(ctx, dt_sum(ctx, y)) < 0)
        return -1;
    *f = t1 - t0, *b = wall_s() - t1;
    dt_ctx_reset(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    int64_t B = 1, T = 1024, H = 8, D = 64, window = 0, reps = 7, threads = 2;
    double cap = 50;
    dt_dtype dt = DT_F32;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t *t = !strcmp(argv[i], "--batch")     ? &B
                     : !strcmp(argv[i], "--seq")     ? &T
                     : !strcmp(argv[i], "--heads")   ? &H
                     : !strcmp(argv[i], "--hdim")    ? &D
                     : !strcmp(argv[i], "--window")  ? &window
                     : !strcmp(argv[i], "--reps")    ? &reps
                     : !strcmp(argv[i], "--threads") ? &threads
                                                     : NULL;
        if (!strcmp(argv[i], "--cap"))
            cap = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype") && (!strcmp(argv[i + 1], "f32") || !strcmp(argv[i + 1], "bf16")))
            dt = strcmp(argv[i + 1], "f32") ? DT_BF16 : DT_F32;
        else if (t)
            *t = atoll(argv[i + 1]);
        else {
            fprintf(stderr, "attn_window: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (B < 1 || T < 1 || H < 1 || D < 1 || D > 256 || reps < 1 || reps > 1000 || threads < 1 || window < 0 ||
        !(cap >= 0)) {
        fprintf(stderr, "attn_window: bad sizes\n");
        return 2;
    }
    dt_set_num_threads((int)threads);
    dt_ctx *ctx;
    dt_tensor *xf = dt_tensor_new(DT_F32, 3, (int64_t[]){B, T, 3 * H * D}), *x = xf;
    if (dt_ctx_init(NULL, &ctx) < 0 || !xf ||
        dt_tensor_rand_normal(xf, dt_rng_key_make(1, DT_RNG_USER, 1, 0), 0.0f, 1.0f) < 0 ||
        (dt == DT_BF16 && (!(x = dt_tensor_new(DT_BF16, 3, xf->shape)) ||
                           dt_k_convert(xf->data, DT_F32, x->data, DT_BF16, dt_tensor_numel(xf)) < 0)) ||
        dt_tensor_set_requires_grad(x, true) < 0) {
        fprintf(stderr, "attn_window: %s\n", dt_last_error());
        return 1;
    }
    double *v = malloc((size_t)(4 * reps) * sizeof *v), fw, bw;
    for (int64_t r = 0; r < reps + 1; r++) /* the first round warms up */
        for (int k = 0; k < 2; k++) {
            if (run(ctx, x, (int)H, window, (float)cap, k == 0, &fw, &bw) < 0) {
                fprintf(stderr, "attn_window: %s\n", dt_last_error());
                return 1;
            }
            if (r > 0)
                v[(2 * k) * reps + r - 1] = fw * 1e3, v[(2 * k + 1) * reps + r - 1] = bw * 1e3;
        }
    printf("dt_attention_window (window %lld, cap %g, %s): forward %.2f ms, backward %.2f ms\n", (long long)window,
           cap, dt_dtype_name(dt), median(v, (int)reps), median(v + reps, (int)reps));
    printf("dt_attention (blocked, causal):          forward %.2f ms, backward %.2f ms\n",
           median(v + 2 * reps, (int)reps), median(v + 3 * reps, (int)reps));
    free(v);
    if (x != xf)
        dt_tensor_free(x);
    dt_tensor_free(xf);
    dt_ctx_free(ctx);
    return 0;
}
