/* optim_lowp — the per-parameter passes of a bf16 training step, alone:
 * the non-finite scan of the bf16 gradients (dt_k_first_nonfinite) and the
 * AdamW step over f32 masters with bf16 gradients and a bf16 weight copy
 * (dt_optim_step: widen, step, round the copy), on N parameters cut into
 * tensors of the ~100M Llama's sizes.
 *
 *     build/bench/optim_lowp [--mparams 100] [--reps 5]
 *
 * Prints the median CPU time of each pass (ms) over the repetitions, the
 * bytes each moves and the GB/s that makes. */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_cpu.h"

int main(int argc, char **argv)
{
    int64_t mp = 100, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t *t = !strcmp(argv[i], "--mparams") ? &mp : !strcmp(argv[i], "--reps") ? &reps : NULL;
        if (!t || dt_parse_int(argv[i], argv[i + 1], 1, 1000, t) < 0) {
            fprintf(stderr, "usage: optim_lowp [--mparams M] [--reps N]\n");
            return 2;
        }
    }
    const size_t n = (size_t)mp * 1000000;
    uint16_t *lp = dt_alloc(n * 2), *lg = dt_alloc(n * 2);
    if (!lp || !lg)
        return 1;
    for (size_t i = 0; i < n; i++) {
        lp[i] = dt_f32_to_bf16((float)((int)(i % 2001) - 1000) * 1e-4f);
        lg[i] = dt_f32_to_bf16((float)((int)((i * 7) % 3001) - 1500) * 1e-6f);
    }
    dt_flat P, G, M;
    if (dt_flat_wrap(&P, DT_BF16, lp, n) < 0 || dt_flat_wrap(&G, DT_BF16, lg, n) < 0 ||
        dt_optim_master_alloc(&P, 0, n, &M) < 0)
        return 1;
    /* tensors of 768 x 2048 (the Llama MLP's), the last one shorter */
    const size_t seg = 768 * 2048, nseg = (n + seg - 1) / seg;
    dt_optim_segment *segs = calloc(nseg, sizeof *segs);
    for (size_t s = 0; s < nseg; s++)
        segs[s] = (dt_optim_segment){s * seg, s + 1 < nseg ? seg : n - s * seg, false};
    dt_optim_range r = {.params = &M, .grads = &G, .mirror = &P, .lo = 0, .hi = n, .segs = segs, .nseg = nseg};
    dt_adam_params ap = dt_adamw_params_default();
    dt_optim *o;
    if (dt_optim_adamw_init(&ap, &r, 1, &o) < 0) {
        fprintf(stderr, "optim_lowp: %s\n", dt_last_error());
        return 1;
    }
    double *ts = calloc((size_t)reps, sizeof *ts), *to = calloc((size_t)reps, sizeof *to);
    int64_t found = 0;
    dt_optim_step(o); /* first touch of the states */
    for (int64_t k = 0; k < reps; k++) {
        double t0 = cpu_s();
        found += dt_k_first_nonfinite(lg, DT_BF16, (int64_t)n);
        double t1 = cpu_s();
        if (dt_optim_step(o) < 0) {
            fprintf(stderr, "optim_lowp: %s\n", dt_last_error());
            return 1;
        }
        double t2 = cpu_s();
        ts[k] = 1e3 * (t1 - t0);
        to[k] = 1e3 * (t2 - t1);
    }
    const double ms_s = median(ts, (int)reps), ms_o = median(to, (int)reps);
    /* scan: 2 bytes read; step: g 2, p/m/v 4 read + 4 written each, copy 2 written */
    printf("optim_lowp: %zu params (%lld M), isa %s, median CPU ms of %lld (scan found %lld)\n", n, (long long)mp,
           dt_k_isa_name(dt_k_get_isa()), (long long)reps, (long long)(found / reps));
    printf("  nonfinite scan   %8.2f ms  %6.1f GB/s\n", ms_s, 2.0 * (double)n / ms_s * 1e-6);
    printf("  adamw step       %8.2f ms  %6.1f GB/s\n", ms_o, 28.0 * (double)n / ms_o * 1e-6);
    printf("  both             %8.2f ms\n", ms_s + ms_o);
    dt_optim_free(o);
    dt_flat_free(&M);
    dt_free(lp);
    dt_free(lg);
    free(segs);
    free(ts);
    free(to);
    return 0;
}
