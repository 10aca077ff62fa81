/* onednn_matmul — GPT-2's per-layer GEMMs through one oneDNN (2.x or 3.x
 * API, chosen by the headers it is compiled against) or through dtrain's
 * dt_k_matmul (compiled with -DBENCH_DTRAIN), so bench/onednn_matmul.sh can
 * run the builds interleaved and set their rates side by side.
 *
 *   onednn_matmul [--rows 2048] [--embd 768] [--vocab 50304] [--reps 3]
 *                 [--types f32,bf16,bf16o] [--only NAME]
 *
 * Shapes (R rows = batch x sequence, C width, V vocabulary), each as the
 * training step issues it, with plain row-major operands (transposes as
 * strides, as dtrain passes them):
 *   fwd     x W:    qkv R x 3C x C, proj R x C x C, fc R x 4C x C, fc2 R x C x 4C,
 *                   lm_head x E^T: R x V x C
 *   bwd-dx  g W^T:  the same four with N and K swapped; lm_head g E: R x C x V
 *   bwd-dw  x^T g:  qkv C x 3C x R, ...; lm_head g^T x: V x C x R
 * Types: f32 (f32 x f32 -> f32), bf16 (bf16 x bf16 -> f32), bf16o (bf16 x
 * bf16 -> bf16; through dtrain: dt_k_matmul_batched_lp, when
 * dt_k_matmul_writes_lp says it writes bf16 directly).
 *
 * Each (shape, type) builds its primitive, runs once untimed, then --reps
 * timed runs; a line gives the median wall time, its GFLOP/s and the
 * process CPU time per run, the mean over the timed runs (threads x wall on
 * an idle machine; less when the machine's other work takes the cores; a
 * mean because the CPU clock of the process's other threads advances at
 * scheduler ticks, a few ms: single runs of a 10 ms GEMM read 6 or 8 ms). The threads are OpenMP's
 * (OMP_NUM_THREADS). Output lines (one per shape and type):
 *   lib PASS NAME OP M N K TYPE impl=IMPL ms=MEDIAN gflops=G cpu_ms=CPU
 * An error prints "lib ... error=..." and the program goes on (exit status
 * 1 at the end). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef BENCH_DTRAIN
#include "dtrain/dtrain.h"
#include "dtrain/kernels.h"
#define LIB "dtrain"
#define DTRAIN_PATH 1
#define DTRAIN_WRITES_BF16() dt_k_matmul_writes_lp(DT_BF16)
#else
#define DTRAIN_PATH 0
#define DTRAIN_WRITES_BF16() 1
#include "oneapi/dnnl/dnnl.h"
#if DNNL_VERSION_MAJOR >= 3
#define LIB "onednn3"
#else
#define LIB "onednn2"
#endif
#endif

typedef struct {
    const char *pass, *name;
    int ta, tb;
    int64_t M, N, K;
} shape;

enum { T_F32, T_BF16, T_BF16O, T_COUNT };
static const char *const k_type_name[T_COUNT] = {"f32", "bf16", "bf16o"};

static double now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The mean of n values: the CPU time of a run, whose clock advances for the
 * process's other threads only at scheduler ticks (a few ms), is the mean
 * over the timed runs, not a median of single runs. */
static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return s / n;
}

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1); /* round to nearest even (inputs are finite) */
    return (uint16_t)(u >> 16);
}

/* Whether the comma-separated list has the word name. */
static int has_type(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n))
            return 1;
        p += len + (e ? 1 : 0);
    }
    return 0;
}

static int n_shapes(shape *s, int64_t R, int64_t C, int64_t V)
{
    static const char *proj[4] = {"qkv", "proj", "fc", "fc2"};
    const int64_t in[4] = {C, C, C, 4 * C}, out[4] = {3 * C, C, 4 * C, C};
    int n = 0;
    for (int i = 0; i < 4; i++)
        s[n++] = (shape){"fwd", proj[i], 0, 0, R, out[i], in[i]};
    s[n++] = (shape){"fwd", "lm_head", 0, 1, R, V, C};
    for (int i = 0; i < 4; i++)
        s[n++] = (shape){"bwd-dx", proj[i], 0, 1, R, in[i], out[i]};
    s[n++] = (shape){"bwd-dx", "lm_head", 0, 0, R, C, V};
    for (int i = 0; i < 4; i++)
        s[n++] = (shape){"bwd-dw", proj[i], 1, 0, in[i], out[i], R};
    s[n++] = (shape){"bwd-dw", "lm_head", 1, 0, V, C, R};
    return n;
}

#ifndef BENCH_DTRAIN
/* ---- oneDNN, 2.x or 3.x API ------------------------------------------------- */
static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;

/* Strides of a rows x cols operand stored row-major, or transposed. */
static void strides(dnnl_dims_t st, int64_t rows, int64_t cols, int trans)
{
    st[0] = trans ? 1 : cols;
    st[1] = trans ? rows : 1;
}

#if DNNL_VERSION_MAJOR >= 3
typedef dnnl_memory_desc_t md_t; /* a handle */
static dnnl_status_t md_make(md_t *md, int64_t r, int64_t c, int trans, dnnl_data_type_t t)
{
    dnnl_dims_t d = {r, c}, st;
    strides(st, r, c, trans);
    return dnnl_memory_desc_create_with_strides(md, 2, d, t, st);
}
static const_dnnl_memory_desc_t md_ptr(const md_t *md) { return *md; }
static void md_free(md_t *md)
{
    if (*md)
        dnnl_memory_desc_destroy(*md);
}
static dnnl_status_t pd_make(dnnl_primitive_desc_t *pd, md_t *a, md_t *b, md_t *c)
{
    return dnnl_matmul_primitive_desc_create(pd, g_eng, *a, *b, NULL, *c, NULL);
}
#else
typedef dnnl_memory_desc_t md_t; /* a struct */
static dnnl_status_t md_make(md_t *md, int64_t r, int64_t c, int trans, dnnl_data_type_t t)
{
    dnnl_dims_t d = {r, c}, st;
    strides(st, r, c, trans);
    return dnnl_memory_desc_init_by_strides(md, 2, d, t, st);
}
static const dnnl_memory_desc_t *md_ptr(const md_t *md) { return md; }
static void md_free(md_t *md) { (void)md; }
static dnnl_status_t pd_make(dnnl_primitive_desc_t *pd, md_t *a, md_t *b, md_t *c)
{
    dnnl_matmul_desc_t op;
    dnnl_status_t s = dnnl_matmul_desc_init(&op, a, b, NULL, c);
    return s != dnnl_success ? s : dnnl_primitive_desc_create(pd, &op, NULL, g_eng, NULL);
}
#endif

static int lib_init(void)
{
    if (dnnl_engine_create(&g_eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "onednn_matmul: no oneDNN CPU engine\n");
        return -1;
    }
    const dnnl_version_t *v = dnnl_version();
    fprintf(stderr, "onednn_matmul: oneDNN %d.%d.%d (%s)\n", v->major, v->minor, v->patch, v->hash);
    return 0;
}

/* Times one shape: median wall seconds and CPU seconds of reps runs. */
static int run_one(const shape *s, int type, void *A, void *B, void *C, int reps, double *wall, double *cpu,
                   char *impl, size_t implsz)
{
    dnnl_data_type_t in = type == T_F32 ? dnnl_f32 : dnnl_bf16, out = type == T_BF16O ? dnnl_bf16 : dnnl_f32;
    md_t a, b, c;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&c, 0, sizeof c);
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    int rc = -1;
    dnnl_status_t st;
    if ((st = md_make(&a, s->M, s->K, s->ta, in)) || (st = md_make(&b, s->K, s->N, s->tb, in)) ||
        (st = md_make(&c, s->M, s->N, 0, out)) || (st = pd_make(&pd, &a, &b, &c)) ||
        (st = dnnl_primitive_create(&prim, pd)) || (st = dnnl_memory_create(&ma, md_ptr(&a), g_eng, A)) ||
        (st = dnnl_memory_create(&mb, md_ptr(&b), g_eng, B)) || (st = dnnl_memory_create(&mc, md_ptr(&c), g_eng, C))) {
        snprintf(impl, implsz, "status-%d", (int)st);
        goto out;
    }
    const char *name = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    snprintf(impl, implsz, "%s", name ? name : "?");
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
    double *w = calloc((size_t)reps, sizeof *w), *u = calloc((size_t)reps, sizeof *u);
    if (!w || !u) {
        free(w);
        free(u);
        snprintf(impl, implsz, "out-of-memory");
        goto out;
    }
    for (int r = -1; r < reps; r++) {
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        st = dnnl_primitive_execute(prim, g_stream, 3, args);
        if (st == dnnl_success)
            st = dnnl_stream_wait(g_stream);
        if (st != dnnl_success) {
            snprintf(impl, implsz, "execute-status-%d", (int)st);
            free(w);
            free(u);
            goto out;
        }
        if (r >= 0) {
            w[r] = now(CLOCK_MONOTONIC) - t0;
            u[r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    }
    qsort(w, (size_t)reps, sizeof *w, cmp_double);
    *wall = w[reps / 2];
    *cpu = mean(u, reps);
    free(w);
    free(u);
    rc = 0;
out:
    if (ma)
        dnnl_memory_destroy(ma);
    if (mb)
        dnnl_memory_destroy(mb);
    if (mc)
        dnnl_memory_destroy(mc);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    md_free(&a);
    md_free(&b);
    md_free(&c);
    return rc;
}
#else
/* ---- dtrain's dt_k_matmul ----------------------------------------------------- */
static int lib_init(void)
{
    return 0;
}

static int run_one(const shape *s, int type, void *A, void *B, void *C, int reps, double *wall, double *cpu,
                   char *impl, size_t implsz)
{
    dt_dtype t = type == T_F32 ? DT_F32 : DT_BF16;
    if (type == T_BF16O && !dt_k_matmul_writes_lp(DT_BF16)) {
        snprintf(impl, implsz, "no direct bf16 result (dt_k_matmul_writes_lp)");
        return -1;
    }
    snprintf(impl, implsz, "%s", t == DT_BF16 && dt_k_matmul_amx(NULL) ? "dtrain-amx" : "dt_k_matmul");
    double *w = calloc((size_t)reps, sizeof *w), *u = calloc((size_t)reps, sizeof *u);
    int rc = -1;
    if (!w || !u)
        goto out;
    for (int r = -1; r < reps; r++) {
        double t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
        dt_status st = type == T_BF16O
                           ? dt_k_matmul_batched_lp(s->ta, s->tb, 1, s->M, s->N, s->K, 1.0f, A, 0, B, 0, t, C, 0, NULL)
                           : dt_k_matmul(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, B, t, 0.0f, C, NULL);
        if (st < 0) {
            snprintf(impl, implsz, "error: %s", dt_last_error());
            goto out;
        }
        if (r >= 0) {
            w[r] = now(CLOCK_MONOTONIC) - t0;
            u[r] = now(CLOCK_PROCESS_CPUTIME_ID) - c0;
        }
    }
    qsort(w, (size_t)reps, sizeof *w, cmp_double);
    *wall = w[reps / 2];
    *cpu = mean(u, reps);
    rc = 0;
out:
    free(w);
    free(u);
    return rc;
}
#endif

int main(int argc, char **argv)
{
    int64_t R = 2048, C = 768, V = 50304;
    int reps = 3;
    const char *types = "f32,bf16,bf16o", *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--rows"))
            R = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--embd"))
            C = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--vocab"))
            V = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--types"))
            types = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--only"))
            only = argv[++i];
        else {
            fprintf(stderr, "usage: onednn_matmul [--rows R] [--embd C] [--vocab V] [--reps N] "
                            "[--types f32,bf16,bf16o] [--only NAME]\n");
            return 2;
        }
    }
    if (R < 1 || C < 1 || V < 1 || reps < 1 || R > (1 << 20) || C > (1 << 16) || V > (1 << 20)) {
        fprintf(stderr, "onednn_matmul: --rows, --embd, --vocab, --reps out of range\n");
        return 2;
    }
    if (lib_init() < 0)
        return 1;
    shape s[16];
    int n = n_shapes(s, R, C, V), failed = 0;
    int64_t most = 0;
    for (int i = 0; i < n; i++) {
        int64_t m[3] = {s[i].M * s[i].K, s[i].K * s[i].N, s[i].M * s[i].N};
        for (int j = 0; j < 3; j++)
            most = m[j] > most ? m[j] : most;
    }
    float *A = malloc((size_t)most * 4), *B = malloc((size_t)most * 4), *Cm = malloc((size_t)most * 4);
    uint16_t *Ah = malloc((size_t)most * 2), *Bh = malloc((size_t)most * 2);
    if (!A || !B || !Cm || !Ah || !Bh) {
        fprintf(stderr, "onednn_matmul: out of memory\n");
        return 1;
    }
    uint64_t x = 88172645463325252ULL;
    for (int64_t i = 0; i < most; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        A[i] = (float)((double)(x >> 40) / (double)(1ULL << 24) - 0.5);
        B[i] = A[i] * 0.5f;
        Ah[i] = to_bf16(A[i]);
        Bh[i] = to_bf16(B[i]);
        Cm[i] = 0.0f;
    }
    for (int i = 0; i < n; i++) {
        if (only && strcmp(only, s[i].name))
            continue;
        for (int t = 0; t < T_COUNT; t++) {
            if (!has_type(types, k_type_name[t]) || (t == T_BF16O && !DTRAIN_WRITES_BF16()))
                continue; /* no direct bf16 result through dtrain here */
            char impl[128];
            double wall = 0, cpu = 0;
            void *a = t == T_F32 ? (void *)A : Ah, *b = t == T_F32 ? (void *)B : Bh;
            const char *op = s[i].ta ? "AtB" : s[i].tb ? "ABt" : "AB";
            int rc = run_one(&s[i], t, a, b, Cm, reps, &wall, &cpu, impl, sizeof impl);
            printf("%s %s %s %s %lld %lld %lld %s ", LIB, s[i].pass, s[i].name, op, (long long)s[i].M,
                   (long long)s[i].N, (long long)s[i].K, k_type_name[t]);
            if (rc < 0) {
                printf("error=%s\n", impl);
                failed = 1;
            }
            else
                printf("impl=%s ms=%.6f gflops=%.1f cpu_ms=%.6f\n", impl, wall * 1e3,
                       2.0 * (double)s[i].M * (double)s[i].N * (double)s[i].K / wall * 1e-9, cpu * 1e3);
            fflush(stdout);
        }
    }
    free(A);
    free(B);
    free(Cm);
    free(Ah);
    free(Bh);
    return failed;
}
