/* conv_bwd_weights — dtrain's two backward-weights kernels against oneDNN's
 * primitive on the same operands, as a ConvNet step calls them: batch 100,
 * 5x5 pad 2, conv1 1 -> 16 on 28x28 (plain x, dy in nChw8c:
 * dt__conv_c1_bwd_weights_blk) and conv2 16 -> 32 on 14x14 (x and dy in
 * nChw8c: dt__conv_bwd_weights_blk8).
 *
 *     build/bench/conv_bwd_weights [--rounds N] [--calls N] [--sets N] [--batch N]
 *
 * Each round times --calls calls of one side, then of the other (the
 * first side alternating between rounds), on --sets
 * operand sets taken in turn (8 by default: 30 MB for conv2, colder than
 * one set reused); prints the median of the rounds' mean ms for each side,
 * the median and range of the rounds' ratios (dtrain / oneDNN), and the
 * largest difference between the two results. DT_CONV_LAYOUT is set to
 * "blocked" here, so dt_k_conv2d_bwd_weights_l calls oneDNN. f32 only. */
#include "bench_cpu.h"
#include "kernels/kernels_impl.h"

#include <dtrain/dtrain.h>
#include <dtrain/kernels.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int die(const char *what)
{
    fprintf(stderr, "conv_bwd_weights: %s: %s\n", what, dt_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    int rounds = 15, calls = 20, sets = 8;
    int64_t batch = 100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sets") && i + 1 < argc)
            sets = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: conv_bwd_weights [--rounds N] [--calls N] [--sets N] [--batch N]\n");
            return 2;
        }
    }
    if (rounds < 1 || calls < 1 || sets < 1 || sets > 64 || batch < 1) {
        fprintf(stderr, "conv_bwd_weights: --rounds, --calls and --batch must be >= 1, --sets 1-64\n");
        return 2;
    }
    setenv("DT_CONV_LAYOUT", "blocked", 1); /* the public call: oneDNN's primitive */
    printf("oneDNN isa %s, dtrain isa %s, batch %lld, %d rounds of %d calls a side, %d operand sets; ms a call\n",
           dt_k_onednn_isa(), dt_k_isa_name(dt_k_get_isa()), (long long)batch, rounds, calls, sets);
    printf("%-20s %10s %10s %8s %15s %12s\n", "conv", "dtrain", "oneDNN", "ratio", "rounds", "max |diff|");
    double *t = malloc(sizeof(double) * 3 * (size_t)rounds);
    if (!t)
        return 1;
    for (int c = 0; c < 2; c++) {
        dt_k_conv2d_shape s = c ? dt_k_conv2d_shape_make(batch, 16, 14, 14, 32, 5, 5)
                                : dt_k_conv2d_shape_make(batch, 1, 28, 28, 16, 5, 5);
        s.pad_h = s.pad_w = 2;
        int64_t P, Q;
        if (dt_k_conv2d_out_size(&s, &P, &Q) < 0)
            return die("shape");
        const unsigned lay = c ? DT_K_SRC_BLOCKED8 | DT_K_DST_BLOCKED8 : DT_K_DST_BLOCKED8;
        if (c ? !dt__conv_bwd_weights_blk8_ok(&s, Q) : !dt__conv_c1_bwd_weights_blk_ok(&s, 8))
            return die("the kernel does not take this shape");
        size_t nx = (size_t)(s.N * s.C * s.H * s.W), ny = (size_t)(s.N * s.K * P * Q), nw = (size_t)(s.K * s.C * 25);
        float *x[64], *dy[64], *dw = dt_alloc(nw * 4), *dw1 = dt_alloc(nw * 4), *scratch = NULL;
        const int nt = dt__conv_bwd_weights_blk8_threads(&s, P, Q);
        if (c && !(scratch = dt_alloc(dt__conv_bwd_weights_blk8_scratch(&s, nt) * 4)))
            return die("scratch");
        for (int k = 0; k < sets; k++) {
            x[k] = dt_alloc(nx * 4), dy[k] = dt_alloc(ny * 4);
            if (!x[k] || !dy[k] || !dw || !dw1)
                return die("operands");
            dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_USER, (uint64_t)k, 0), 0, x[k], nx, -1, 1);
            dt_rng_fill_uniform(dt_rng_key_make(2, DT_RNG_USER, (uint64_t)k, 0), 0, dy[k], ny, -1, 1);
        }
        for (int r = -1; r < rounds; r++) { /* round -1: warm-up (primitive creation) */
            double ms[2];
            for (int j = 0; j < 2; j++) { /* which side goes first alternates */
                const int side = r & 1 ? 1 - j : j;
                const double t0 = now_ms();
                for (int i = 0; i < calls; i++) {
                    const int k = i % sets;
                    if (side == 1) {
                        if (dt_k_conv2d_bwd_weights_l(&s, x[k], dy[k], dw1, NULL, lay) < 0)
                            return die("oneDNN");
                    } else if (c) {
                        dt__conv_bwd_weights_blk8(&s, nt, P, Q, x[k], dy[k], dw, NULL, scratch);
                    } else {
                        dt__conv_c1_bwd_weights_blk(&s, 8, P, Q, x[k], dy[k], dw, NULL);
                    }
                }
                ms[side] = (now_ms() - t0) / calls;
            }
            if (r >= 0)
                t[r] = ms[0], t[rounds + r] = ms[1], t[2 * rounds + r] = ms[0] / ms[1];
        }
        double maxd = 0; /* both last ran on the same set */
        for (size_t i = 0; i < nw; i++)
            maxd = fmax(maxd, fabs((double)dw[i] - dw1[i]));
        const double md = median(t, rounds), mo = median(t + rounds, rounds);
        const double mr = median(t + 2 * rounds, rounds), lo = t[2 * rounds], hi = t[3 * rounds - 1];
        printf("%-20s %10.3f %10.3f %8.3f %7.3f-%-7.3f %12.3g\n", c ? "conv2 16->32 14x14" : "conv1 1->16 28x28", md,
               mo, mr, lo, hi, maxd);
        for (int k = 0; k < sets; k++)
            dt_free(x[k]), dt_free(dy[k]);
        dt_free(dw), dt_free(dw1), dt_free(scratch);
    }
    free(t);
    return 0;
}
