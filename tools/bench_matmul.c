/* dtrain bench matmul — f32 and bf16 matmul GFLOP/s through dt_k_matmul,
 * the figure other benchmarks quote as the machine's peak.
 *
 *   dtrain bench matmul [--size 2048] [--reps 5] [--threads N] [--json]
 *   dtrain bench matmul --gpt2 [--rows 256] [--n-layer 12] [--n-embd 768] [--vocab 50257] ...
 *
 * Prints the best of --reps timed runs after a warm-up, per dtype. bf16 is
 * marked "emulated" where oneDNN has no native bf16 matmul for the CPU
 * (inputs are widened to f32, so it measures f32 speed plus widening).
 *
 * --gpt2 times, in f32, every GEMM of one GPT-2 training step exactly as
 * the step issues them (dt_k_matmul with the same transposes, beta and
 * fused bias; --rows = batch x sequence): per layer the four Conv1D
 * projections' forward (x W, W stored [in, out]), input gradient (g W^T)
 * and weight gradient (x^T g), and the fused LM head's logits (x E^T),
 * input gradient (g E) and embedding gradient (g^T x). Each line gives the
 * best of --reps calls, its GFLOP/s and its share of the n^3 peak of the
 * same run (--size); the last line sums count x time over the step. */
#include "cmd.h"
#include "dtrain/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain bench matmul [--size N] [--reps R] [--threads T] [--json]\n"
               "       dtrain bench matmul --gpt2 [--rows R] [--n-layer L] [--n-embd C] [--vocab V] [--size N] ...\n"
               "  n x n x n matmul, best of R runs (defaults: 2048, 5, OMP_NUM_THREADS or all cores)\n"
               "  --gpt2: every f32 GEMM of a GPT-2 training step as the step calls it, against that peak\n"
               "          (defaults: rows 256 = batch 4 x seq 64, 12 layers, 768, vocabulary 50257)\n");
}

/* One GEMM of a GPT-2 step: C[M, N] = op(A) op(B) (+ bias), count calls a step. */
typedef struct {
    const char *pass, *name;
    bool ta, tb, bias;
    long long M, N, K, count;
} gpt2_gemm;

/* The GEMMs of one f32 GPT-2 step (models/gpt2.c, ops_matmul.c dense(), ops_lmhead.c):
 * R rows, L layers, width C, vocabulary V; returns how many were written. */
static int gpt2_gemms(gpt2_gemm *g, long long R, long long L, long long C, long long V)
{
    static const char *proj[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    const long long in[4] = {C, C, C, 4 * C}, out[4] = {3 * C, C, 4 * C, C};
    const bool bias[4] = {true, true, false, true}; /* c_fc's bias goes to the fused bias + GELU */
    int n = 0;
    for (int i = 0; i < 4; i++) /* y = x W (+ b) */
        g[n++] = (gpt2_gemm){"fwd", proj[i], false, false, bias[i], R, out[i], in[i], L};
    for (int i = 0; i < 4; i++) /* dx = g W^T */
        g[n++] = (gpt2_gemm){"bwd-dx", proj[i], false, true, false, R, in[i], out[i], L};
    for (int i = 0; i < 4; i++) /* dW = x^T g */
        g[n++] = (gpt2_gemm){"bwd-dw", proj[i], true, false, false, in[i], out[i], R, L};
    g[n++] = (gpt2_gemm){"fwd", "lm_head", false, true, false, R, V, C, 1};
    g[n++] = (gpt2_gemm){"bwd-dx", "lm_head", false, false, false, R, C, V, 1};
    g[n++] = (gpt2_gemm){"bwd-dw", "lm_head", true, false, false, V, C, R, 1};
    return n;
}

/* Times every GEMM of gpt2_gemms against the peak: 0, or 1 on an error. */
static int bench_gpt2(long long R, long long L, long long C, long long V, long long size, int reps, bool json)
{
    double peak = 0.0;
    if (size > 0 && dt_k_bench_matmul(size, DT_F32, reps, &peak) < 0) {
        dt__cli_err("dtrain bench matmul --gpt2: peak: %s\n", dt_last_error());
        return 1;
    }
    gpt2_gemm g[16];
    int n = gpt2_gemms(g, R, L, C, V);
    long long most = 0;
    for (int i = 0; i < n; i++) {
        long long a = g[i].M * g[i].K, b = g[i].K * g[i].N, c = g[i].M * g[i].N;
        long long m = a > b ? a : b;
        m = m > c ? m : c;
        most = m > most ? m : most;
    }
    float *A = dt_alloc((size_t)most * sizeof(float)), *B = dt_alloc((size_t)most * sizeof(float));
    float *Cm = dt_alloc((size_t)most * sizeof(float)), *bias = dt_alloc((size_t)(4 * C + V) * sizeof(float));
    int rc = 0;
    if (!A || !B || !Cm || !bias) {
        dt__cli_err("dtrain bench matmul --gpt2: out of memory for %lld floats\n", most);
        rc = 1;
        goto out;
    }
    dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, 0, 0), 0, A, (size_t)most, -1.0f, 1.0f);
    memcpy(B, A, (size_t)most * sizeof(float));
    memset(Cm, 0, (size_t)most * sizeof(float));
    memset(bias, 0, (size_t)(4 * C + V) * sizeof(float));
    double step_s = 0.0, step_flop = 0.0;
    for (int i = 0; i < n; i++) {
        const gpt2_gemm *e = &g[i];
        double best = 1e30;
        for (int r = 0; r <= reps; r++) { /* the first call builds the primitive: untimed */
            double t0 = dt_time_s();
            if (dt_k_matmul(e->ta, e->tb, e->M, e->N, e->K, 1.0f, A, B, DT_F32, 0.0f, Cm, e->bias ? bias : NULL) < 0) {
                dt__cli_err("dtrain bench matmul --gpt2: %s %s: %s\n", e->pass, e->name, dt_last_error());
                rc = 1;
                goto out;
            }
            double t = dt_time_s() - t0;
            if (r > 0 && t < best)
                best = t;
        }
        double flop = 2.0 * (double)e->M * (double)e->N * (double)e->K, gf = flop / best * 1e-9;
        double pct = peak > 0 ? 100.0 * gf / peak : 0.0;
        step_s += best * (double)e->count;
        step_flop += flop * (double)e->count;
        const char *op = e->ta ? "A^T B" : e->tb ? "A B^T" : "A B";
        if (json)
            printf("{\"bench\":\"matmul_gpt2\",\"pass\":\"%s\",\"gemm\":\"%s\",\"op\":\"%s\",\"m\":%lld,"
                   "\"n\":%lld,\"k\":%lld,\"bias\":%s,\"count\":%lld,\"threads\":%d,\"ms\":%.4f,\"gflops\":%.2f,"
                   "\"peak_gflops\":%.2f,\"pct_of_peak\":%.1f}\n",
                   e->pass, e->name, op, e->M, e->N, e->K, e->bias ? "true" : "false", e->count,
                   dt_get_num_threads(), best * 1e3, gf, peak, pct);
        else
            printf("%-6s %-12s %-6s M %6lld N %6lld K %6lld%s x%-3lld %9.3f ms %7.1f GFLOP/s %6.1f%%\n", e->pass,
                   e->name, op, e->M, e->N, e->K, e->bias ? " +b" : "   ", e->count, best * 1e3, gf, pct);
    }
    double gf = step_flop / step_s * 1e-9;
    if (json)
        printf("{\"bench\":\"matmul_gpt2_step\",\"rows\":%lld,\"layers\":%lld,\"embd\":%lld,\"vocab\":%lld,"
               "\"threads\":%d,\"gflop\":%.4f,\"ms\":%.3f,\"gflops\":%.2f,\"peak_gflops\":%.2f,\"pct_of_peak\":%.1f}\n",
               R, L, C, V, dt_get_num_threads(), step_flop * 1e-9, step_s * 1e3, gf, peak,
               peak > 0 ? 100.0 * gf / peak : 0.0);
    else
        printf("step: %.3f GFLOP of GEMMs in %.1f ms (sum of count x best), %.1f GFLOP/s, %.1f%% of the %.1f GFLOP/s "
               "%lld^3 peak, threads %d\n",
               step_flop * 1e-9, step_s * 1e3, gf, peak > 0 ? 100.0 * gf / peak : 0.0, peak, size,
               dt_get_num_threads());
out:
    dt_free(A);
    dt_free(B);
    dt_free(Cm);
    dt_free(bias);
    return rc;
}

/* --gpt2's shape options and their ranges (dt_parse_int: at least 1). */
static const struct {
    const char *name;
    int64_t hi;
} k_gpt2_dims[4] = {{"--rows", 1LL << 24}, {"--n-layer", 1024}, {"--n-embd", 1LL << 16}, {"--vocab", 1LL << 24}};

/* Which of k_gpt2_dims option a is, or -1. */
static int gpt2_dim(const char *a)
{
    for (int d = 0; d < 4; d++)
        if (!strcmp(a, k_gpt2_dims[d].name))
            return d;
    return -1;
}

int dt_bench_matmul(int argc, char **argv)
{
    long long n = 2048;
    int64_t dims[4] = {256, 12, 768, 50257}; /* the order of k_gpt2_dims */
    int reps = 5, threads = 0, d;
    bool json = false, gpt2 = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--gpt2"))
            gpt2 = true;
        else if (i + 1 < argc && (d = gpt2_dim(a)) >= 0) {
            if (dt_parse_int(k_gpt2_dims[d].name, argv[++i], 1, k_gpt2_dims[d].hi, &dims[d]) < 0) {
                dt__cli_err("dtrain bench matmul: %s\n", dt_last_error());
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && (!strcmp(a, "--size") || !strcmp(a, "--reps") || !strcmp(a, "--threads"))) {
            int64_t x; /* --threads 0: all cores */
            if (dt__bench_int("dtrain bench matmul", a, argv[++i], !strcmp(a, "--threads") ? 0 : 1,
                              !strcmp(a, "--threads") ? 4096 : 1 << 20, &x))
                return 2;
            if (!strcmp(a, "--size"))
                n = x;
            else
                *(!strcmp(a, "--reps") ? &reps : &threads) = (int)x;
        } else {
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
    if (gpt2)
        return bench_gpt2(dims[0], dims[1], dims[2], dims[3], n, reps, json);
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
