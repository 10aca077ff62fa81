/* isa_peak — the instruction throughput limit of this CPU's vector units:
 * what no GEMM (oneDNN's, dtrain's, PyTorch's) can beat here.
 *
 *   isa_peak [--threads N] [--ms 200] [--reps 5] [--gemm GFLOPS] [--json]
 *
 * For each path the CPU has (asked at run time: cpuid through
 * __builtin_cpu_supports, which also checks that the OS saves the
 * registers; nothing is assumed), a register-only loop of independent
 * instructions runs on 1, 2, ... N threads (default: the CPUs online), each
 * thread the same number of iterations (best of --reps runs of about --ms
 * ms). The rate is each thread's FLOPs per second of its own CPU time,
 * summed over the threads: the limit of N cores, which a busy machine's
 * other processes do not lower (they take cores away, not speed: the
 * rate by wall time, as the machine gave it during the run, is printed
 * beside it):
 *   - fma_ymm:   AVX2 vfmadd231ps ymm, 14 accumulators (16 FLOP an instruction)
 *   - fma_zmm:   AVX-512F vfmadd231ps zmm, 24 accumulators (32 FLOP)
 *   - dpbf16_ymm: AVX512_BF16 vdpbf16ps ymm, 24 accumulators (8 lanes x 2
 *     bf16 products, multiply and add: 32 FLOP)
 *   - dpbf16_zmm: AVX512_BF16 vdpbf16ps zmm, 24 accumulators (64 FLOP)
 * The accumulators are independent chains (more than latency x issue width
 * of any current core: 4-6 cycles x 2 pipes), the sources are zeros (no
 * denormals, no NaN), so the loop runs at the issue limit of the
 * instruction. A chain of dependent integer adds (1 a cycle on every x86
 * core since the Pentium 4's successors) gives the clock the loops ran at,
 * so each rate is also given in instructions a cycle.
 *
 * AMX (tdpbf16ps) is not measured: this program has not run on an AMX
 * machine yet.
 *
 * --gemm G (a GEMM rate in GFLOP/s measured on N threads, e.g. the
 * peak_gflops of `dtrain bench step --precision bf16 --json`): prints G as
 * a fraction of each limit at N threads. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__) || !defined(__GNUC__)
int main(void)
{
    fprintf(stderr, "isa_peak: it measures x86-64 vector instructions (GCC or Clang inline assembly); this "
                    "build is not one\n");
    return 2;
}
#else

#define NOINLINE __attribute__((noinline))

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the loops: n iterations, each a fixed block of instructions ------------------ */

/* 240 dependent adds an iteration: 240 cycles. Register operands: some
 * cores fold chains of adds of an immediate at rename. */
#define ADD10 "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t" \
              "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t" "add %2, %1\n\t"
#define ADD_PER_ITER 240
static NOINLINE void loop_add(long n)
{
    long x = 0, one = 1;
    __asm__ volatile("1:\n\t" ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10
                     ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10 ADD10
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     : "+r"(n), "+r"(x)
                     : "r"(one)
                     : "cc");
}

/* AVX2: 14 accumulators ymm0-13, sources ymm14, ymm15; 28 instructions an iteration. */
#define Y(op, i) op " %%ymm14, %%ymm15, %%ymm" #i "\n\t"
#define Y14(op) Y(op, 0) Y(op, 1) Y(op, 2) Y(op, 3) Y(op, 4) Y(op, 5) Y(op, 6) Y(op, 7) Y(op, 8) Y(op, 9) \
                Y(op, 10) Y(op, 11) Y(op, 12) Y(op, 13)
#define YCLOB "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
              "xmm12", "xmm13", "xmm14", "xmm15"
__attribute__((target("avx2,fma"))) static NOINLINE void loop_fma_ymm(long n)
{
    __asm__ volatile("vxorps %%xmm14, %%xmm14, %%xmm14\n\t"
                     "vxorps %%xmm15, %%xmm15, %%xmm15\n\t"
                     "1:\n\t" Y14("vfmadd231ps") Y14("vfmadd231ps")
                     "dec %0\n\t"
                     "jnz 1b\n\t"
                     "vzeroupper\n\t"
                     : "+r"(n)
                     :
                     : "cc", YCLOB);
}

/* AVX-512: 24 accumulators (z)mm0-23, sources 30, 31; 48 instructions an iteration. */
#define Z(op, r, i) op " %%" r "30, %%" r "31, %%" r #i "\n\t"
#define Z24(op, r) Z(op, r, 0) Z(op, r, 1) Z(op, r, 2) Z(op, r, 3) Z(op, r, 4) Z(op, r, 5) Z(op, r, 6) \
                   Z(op, r, 7) Z(op, r, 8) Z(op, r, 9) Z(op, r, 10) Z(op, r, 11) Z(op, r, 12) Z(op, r, 13) \
                   Z(op, r, 14) Z(op, r, 15) Z(op, r, 16) Z(op, r, 17) Z(op, r, 18) Z(op, r, 19) Z(op, r, 20) \
                   Z(op, r, 21) Z(op, r, 22) Z(op, r, 23)
#define ZCLOB YCLOB, "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm30", "xmm31"
#define ZLOOP(r, op)                                                                                               \
    __asm__ volatile("vpxord %%zmm30, %%zmm30, %%zmm30\n\t"                                                       \
                     "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"                                                       \
                     "1:\n\t" Z24(op, r) Z24(op, r)                                                               \
                     "dec %0\n\t"                                                                                 \
                     "jnz 1b\n\t"                                                                                 \
                     "vzeroupper\n\t"                                                                             \
                     : "+r"(n)                                                                                    \
                     :                                                                                            \
                     : "cc", ZCLOB)
__attribute__((target("avx512f"))) static NOINLINE void loop_fma_zmm(long n) { ZLOOP("zmm", "vfmadd231ps"); }
__attribute__((target("avx512f,avx512vl,avx512bf16"))) static NOINLINE void loop_dpbf16_ymm(long n)
{
    ZLOOP("ymm", "vdpbf16ps");
}
__attribute__((target("avx512f,avx512bf16"))) static NOINLINE void loop_dpbf16_zmm(long n)
{
    ZLOOP("zmm", "vdpbf16ps");
}

typedef struct {
    const char *name, *isa; /* the path, and the cpuid feature(s) it needs */
    void (*fn)(long);
    int instr_per_iter;
    double flop_per_instr;
} path;

static bool has(const char *isa)
{
    __builtin_cpu_init();
    if (!strcmp(isa, "avx2,fma"))
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strcmp(isa, "avx512f"))
        return __builtin_cpu_supports("avx512f");
    if (!strcmp(isa, "avx512_bf16"))
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bf16");
    return false;
}

static const path k_paths[] = {
    {"fma_ymm", "avx2,fma", loop_fma_ymm, 28, 16},
    {"fma_zmm", "avx512f", loop_fma_zmm, 48, 32},
    {"dpbf16_ymm", "avx512_bf16", loop_dpbf16_ymm, 48, 32},
    {"dpbf16_zmm", "avx512_bf16", loop_dpbf16_zmm, 48, 64},
};

/* ---- threads ---------------------------------------------------------------------- */

typedef struct {
    void (*fn)(long);
    long iters;
    pthread_barrier_t *go;
    double cpu; /* the thread's CPU seconds for fn */
} job;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *worker(void *p)
{
    job *j = p;
    pthread_barrier_wait(j->go);
    double c0 = thread_cpu_s();
    j->fn(j->iters);
    j->cpu = thread_cpu_s() - c0;
    return NULL;
}

/* One run: the wall seconds, and the threads' summed rate of iterations
 * per CPU-second (what they ran at while on a core). */
typedef struct {
    double wall, iters_per_cpu_s;
} timing;

/* nt threads each running fn(iters), started together (the caller's
 * thread is one of them). */
static timing run_threads(void (*fn)(long), long iters, int nt)
{
    pthread_t th[256];
    job jobs[256];
    pthread_barrier_t go;
    if (nt < 1 || nt > 256 || pthread_barrier_init(&go, NULL, (unsigned)nt)) {
        fprintf(stderr, "isa_peak: no barrier for %d threads\n", nt);
        exit(1);
    }
    int started = 0;
    for (int t = 1; t < nt; t++) {
        jobs[t] = (job){fn, iters, &go, 0};
        if (pthread_create(&th[t], NULL, worker, &jobs[t]))
            break;
        started++;
    }
    if (started != nt - 1) { /* cannot meet at the barrier: let the started ones go alone */
        fprintf(stderr, "isa_peak: could not start %d threads\n", nt);
        exit(1);
    }
    pthread_barrier_wait(&go);
    double t0 = now_s(), c0 = thread_cpu_s();
    fn(iters);
    jobs[0].cpu = thread_cpu_s() - c0;
    for (int t = 1; t < nt; t++)
        pthread_join(th[t], NULL);
    timing r = {now_s() - t0, 0};
    for (int t = 0; t < nt; t++)
        r.iters_per_cpu_s += (double)iters / (jobs[t].cpu > 0 ? jobs[t].cpu : 1e-9);
    pthread_barrier_destroy(&go);
    return r;
}

/* The best of reps runs of fn(iters) on nt threads: shortest wall time,
 * highest rate per CPU-second. */
static timing best_time(void (*fn)(long), long iters, int nt, int reps)
{
    timing best = {1e300, 0};
    for (int r = 0; r < reps; r++) {
        timing t = run_threads(fn, iters, nt);
        best.wall = t.wall < best.wall ? t.wall : best.wall;
        best.iters_per_cpu_s = t.iters_per_cpu_s > best.iters_per_cpu_s ? t.iters_per_cpu_s : best.iters_per_cpu_s;
    }
    return best;
}

/* Iterations of fn that take about ms milliseconds on one thread. */
static long calibrate(void (*fn)(long), double ms)
{
    long n = 1000;
    for (;;) {
        double t = run_threads(fn, n, 1).wall;
        if (t > 0.02 || n > (1L << 40))
            return (long)((double)n * (ms * 1e-3) / (t > 0 ? t : 1e-9)) + 1;
        n *= 8;
    }
}

static long parse_long(const char *what, const char *s, long lo, long hi)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) {
        fprintf(stderr, "isa_peak: %s '%s': a whole number from %ld to %ld\n", what, s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cpus > 0 ? (int)(cpus < 256 ? cpus : 256) : 1, reps = 5;
    double ms = 200, gemm = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json"))
            json = true;
        else if (v && !strcmp(a, "--threads"))
            nthreads = (int)parse_long(a, v, 1, 256), i++;
        else if (v && !strcmp(a, "--reps"))
            reps = (int)parse_long(a, v, 1, 1000), i++;
        else if (v && !strcmp(a, "--ms"))
            ms = (double)parse_long(a, v, 1, 60000), i++;
        else if (v && !strcmp(a, "--gemm")) {
            char *end;
            gemm = strtod(v, &end);
            if (!*v || *end || !(gemm > 0 && gemm < 1e9)) {
                fprintf(stderr, "isa_peak: --gemm '%s': a rate in GFLOP/s (> 0)\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "usage: isa_peak [--threads N] [--ms 200] [--reps 5] [--gemm GFLOPS] [--json]\n");
            return !strcmp(a, "-h") || !strcmp(a, "--help") ? 0 : 2;
        }
    }
    /* the clock each thread count ran at while on a core: dependent adds, one a cycle */
    long add_iters = calibrate(loop_add, ms);
    double ghz[257];
    for (int nt = 1; nt <= nthreads; nt++)
        ghz[nt] = best_time(loop_add, add_iters, nt, reps).iters_per_cpu_s / nt * ADD_PER_ITER * 1e-9;
    if (!json)
        printf("clock (dependent adds, per CPU-second): %.2f GHz on 1 thread, %.2f on %d\n", ghz[1], ghz[nthreads],
               nthreads);
    for (size_t p = 0; p < sizeof k_paths / sizeof k_paths[0]; p++) {
        const path *q = &k_paths[p];
        if (!has(q->isa)) {
            if (json)
                printf("{\"bench\":\"isa_peak\",\"path\":\"%s\",\"available\":false}\n", q->name);
            else
                printf("%-11s not on this CPU (needs %s)\n", q->name, q->isa);
            continue;
        }
        long iters = calibrate(q->fn, ms);
        for (int nt = 1; nt <= nthreads; nt++) {
            timing t = best_time(q->fn, iters, nt, reps);
            double fpi = (double)q->instr_per_iter * q->flop_per_instr; /* FLOPs an iteration */
            double gf = t.iters_per_cpu_s * fpi * 1e-9;                  /* every thread on its own core */
            double wall = (double)iters * nt * fpi / t.wall * 1e-9;     /* as the machine gave it now */
            double ipc = t.iters_per_cpu_s / nt * q->instr_per_iter / (ghz[nt] * 1e9);
            double frac = gemm > 0 && nt == nthreads ? gemm / gf : 0;
            if (json)
                printf("{\"bench\":\"isa_peak\",\"path\":\"%s\",\"available\":true,\"threads\":%d,"
                       "\"flop_per_instr\":%.0f,\"gflops\":%.1f,\"gflops_per_core\":%.1f,\"gflops_wall\":%.1f,"
                       "\"instr_per_cycle\":%.2f,\"ghz\":%.2f,\"gemm_fraction\":%.3f}\n",
                       q->name, nt, q->flop_per_instr, gf, gf / nt, wall, ipc, ghz[nt], frac);
            else {
                printf("%-11s threads %3d: %8.1f GFLOP/s (%.1f a core, %.2f instructions a cycle at %.2f GHz, "
                       "%.0f FLOP each; %.1f by wall time)",
                       q->name, nt, gf, gf / nt, ipc, ghz[nt], q->flop_per_instr, wall);
                if (frac > 0)
                    printf("; --gemm %.1f is %.1f%% of it", gemm, 100 * frac);
                printf("\n");
            }
        }
    }
    return 0;
}
#endif
