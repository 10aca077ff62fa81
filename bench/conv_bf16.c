/* conv_bf16 — each direction of the ConvNet's two convolutions in f32 and in
 * bf16 (dt_k_conv2d_*_l against dt_k_conv2d_*_t), as a ConvNet step calls
 * them: batch 100, 5x5 pad 2, conv1 1 -> 16 on 28x28 (plain input, blocked
 * output), conv2 16 -> 32 on 14x14 (blocked both sides), in the block
 * dt_k_act_block() picks (nChw16c on AVX-512).
 *
 *     build/bench/conv_bf16 [--reps N] [--batch N]
 *
 * f32 and bf16 alternate call by call (f32 bf16 f32 bf16 ...); prints the
 * median wall and process-CPU ms of each and the ratio of the medians.
 * Needs a CPU with bf16 convolutions (dt_k_conv2d_native); elsewhere it
 * says so and exits 2. */
#include "bench_cpu.h"

#include <dtrain/dtrain.h>
#include <dtrain/kernels.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what)
{
    fprintf(stderr, "conv_bf16: %s: %s\n", what, dt_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    int reps = 30;
    int64_t batch = 100;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            batch = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: conv_bf16 [--reps N] [--batch N]\n");
            return 2;
        }
    }
    if (reps < 1 || batch < 1) {
        fprintf(stderr, "conv_bf16: --reps and --batch must be >= 1\n");
        return 2;
    }
    if (!dt_k_conv2d_native(DT_BF16)) {
        printf("no bf16 convolution on this CPU (oneDNN isa %s): nothing to compare\n", dt_k_onednn_isa());
        return 2;
    }
    int B = dt_k_act_block();
    unsigned sb16 = B == 16 ? DT_K_SRC_BLOCKED16 : B == 8 ? DT_K_SRC_BLOCKED8 : 0u;
    unsigned db16 = B == 16 ? DT_K_DST_BLOCKED16 : B == 8 ? DT_K_DST_BLOCKED8 : 0u;
    struct {
        const char *name;
        dt_k_conv2d_shape s;
        unsigned lay;
    } convs[2] = {
        {"conv1 1->16 28x28", dt_k_conv2d_shape_make(batch, 1, 28, 28, 16, 5, 5), db16},
        {"conv2 16->32 14x14", dt_k_conv2d_shape_make(batch, 16, 14, 14, 32, 5, 5), sb16 | db16},
    };
    printf("oneDNN isa %s, activations %s, batch %lld, %d reps, f32/bf16 alternating; median ms (wall, "
           "process CPU)\n",
           dt_k_onednn_isa(), dt_k_block_name(B), (long long)batch, reps);
    printf("%-20s %-12s %10s %10s %10s %10s %8s %8s\n", "conv", "direction", "f32 wall", "bf16 wall", "f32 cpu",
           "bf16 cpu", "wall x", "cpu x");
    double *t = malloc(sizeof(double) * 4 * (size_t)reps);
    for (int c = 0; c < 2; c++) {
        dt_k_conv2d_shape *s = &convs[c].s;
        s->pad_h = s->pad_w = 2;
        int64_t P, Q;
        if (dt_k_conv2d_out_size(s, &P, &Q) < 0)
            return die("shape");
        size_t nx = (size_t)(s->N * s->C * s->H * s->W), nw = (size_t)(s->K * s->C * s->R * s->S),
               ny = (size_t)(s->N * s->K * P * Q);
        float *x = dt_alloc(nx * 4), *w = dt_alloc(nw * 4), *b = dt_alloc((size_t)s->K * 4), *dy = dt_alloc(ny * 4);
        float *y = dt_alloc(ny * 4), *dx = dt_alloc(nx * 4), *dw = dt_alloc(nw * 4), *db = dt_alloc((size_t)s->K * 4);
        uint16_t *xh = dt_alloc(nx * 2), *wh = dt_alloc(nw * 2), *dyh = dt_alloc(ny * 2), *yh = dt_alloc(ny * 2);
        dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_USER, 0, 0), 0, x, nx, -1, 1);
        dt_rng_fill_uniform(dt_rng_key_make(2, DT_RNG_USER, 0, 0), 0, w, nw, -1, 1);
        dt_rng_fill_uniform(dt_rng_key_make(3, DT_RNG_USER, 0, 0), 0, b, (size_t)s->K, -1, 1);
        dt_rng_fill_uniform(dt_rng_key_make(4, DT_RNG_USER, 0, 0), 0, dy, ny, -1, 1);
        dt_k_convert(x, DT_F32, xh, DT_BF16, (int64_t)nx);
        dt_k_convert(w, DT_F32, wh, DT_BF16, (int64_t)nw);
        dt_k_convert(dy, DT_F32, dyh, DT_BF16, (int64_t)ny);
        unsigned lay = convs[c].lay;
        for (int dir = 0; dir < 3; dir++) {
            /* one warm-up call of each (primitive creation), then alternate */
            for (int r = -1; r < reps; r++)
                for (int bf = 0; bf < 2; bf++) {
                    double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID);
                    dt_status st;
                    if (dir == 0)
                        st = bf ? dt_k_conv2d_fwd_t(s, xh, wh, b, yh, DT_BF16, DT_BF16, lay)
                                : dt_k_conv2d_fwd_l(s, x, w, b, y, lay);
                    else if (dir == 1)
                        st = bf ? dt_k_conv2d_bwd_data_t(s, dyh, wh, dx, DT_BF16, lay)
                                : dt_k_conv2d_bwd_data_l(s, dy, w, dx, lay);
                    else
                        st = bf ? dt_k_conv2d_bwd_weights_t(s, xh, dyh, dw, db, DT_BF16, lay)
                                : dt_k_conv2d_bwd_weights_l(s, x, dy, dw, db, lay);
                    if (st < 0)
                        return die(convs[c].name);
                    if (r >= 0) {
                        t[(2 * bf) * reps + r] = 1e3 * (now_s(CLOCK_MONOTONIC) - w0);
                        t[(2 * bf + 1) * reps + r] = 1e3 * (now_s(CLOCK_PROCESS_CPUTIME_ID) - c0);
                    }
                }
            double fw = median(t, reps), fc = median(t + reps, reps), bw = median(t + 2 * reps, reps),
                   bc = median(t + 3 * reps, reps);
            static const char *dn[3] = {"forward", "bwd data", "bwd weights"};
            printf("%-20s %-12s %10.2f %10.2f %10.2f %10.2f %8.2f %8.2f\n", convs[c].name, dn[dir], fw, bw, fc, bc,
                   fw / bw, fc / bc);
        }
        dt_free(x), dt_free(w), dt_free(b), dt_free(dy), dt_free(y), dt_free(dx), dt_free(dw), dt_free(db);
        dt_free(xh), dt_free(wh), dt_free(dyh), dt_free(yh);
    }
    free(t);
    return 0;
}
