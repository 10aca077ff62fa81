/* isa_peak — the instruction throughput limit of this CPU's vector units:
 * what no GEMM (oneDNN's, dtrain's, PyTorch's) can beat here.
 *
 *   isa_peak [--threads N] [--ms 200] [--reps 5] [--gemm GFLOPS] [--json]
 *
 * For each path the CPU has (asked at run time: cpuid through
 * __builtin_cpu_supports, which also checks that the OS saves the
 * registers; nothing is assumed), a register-only loop of independent
 * instructions (the AMX 2 x 2 paths: with their tile loads) runs on 1, 2,
 * ... N threads (default: the CPUs online), each thread the same number of
 * iterations (best of --reps runs of about --ms
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
 *   - amx_tdpbf16ps: AMX tdpbf16ps, 6 accumulator tiles (tmm0-5, 16 x 16
 *     f32) from two source tiles (tmm6, tmm7: 16 x 32 bf16), 12
 *     instructions an iteration (16 x 16 x 32 multiply-adds each: 16384
 *     FLOP): the matrix unit's issue limit.
 *   - amx_2x2_l1: the step of a GEMM micro-kernel shaped as dtrain's AMX
 *     GEMM's (src/kernels/amx_ukernel.h): a 2 x 2 block of accumulators
 *     (tmm0-3), each K step loading two A tiles (tileloadd; contiguous
 *     here, read in place there) and two B tiles (tileloaddt1) and issuing
 *     4 tdpbf16ps, the sources cycling through 4 steps (16 KiB: they stay
 *     in L1): the limit of a micro-kernel whose operands are in L1.
 *   - amx_2x2_l2: the same, the sources cycling through 1 MiB (512 KiB
 *     each for A and B; L2 is 2 MiB a core on the CPUs with AMX so far): a
 *     micro-kernel whose operands come from L2.
 *   The AMX sources are values like a model's (see g_amx_a), not zeros.
 *   For the AMX paths "instructions a cycle" counts the tdpbf16ps. They run
 *   where the CPU has AMX-TILE and AMX-BF16, the OS saves the tile state
 *   (XCR0) and Linux grants the process the tile data (arch_prctl
 *   ARCH_REQ_XCOMP_PERM); each thread configures its tiles (ldtilecfg) in
 *   the loop's function and releases them after.
 * The vector accumulators are independent chains (more than latency x
 * issue width of any current core: 4-6 cycles x 2 pipes), the sources are
 * zeros (no denormals, no NaN), so the loop runs at the issue limit of the
 * instruction. A chain of dependent integer adds (1 a cycle on every x86
 * core since the Pentium 4's successors) gives the clock the loops ran at,
 * so each rate is also given in instructions a cycle.
 *
 * --gemm G (a GEMM rate in GFLOP/s measured on N threads, e.g. the
 * peak_gflops of `dtrain bench step --precision bf16 --json`): prints G as
 * a fraction of each limit at N threads. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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

/* AMX (GCC's intrinsics: clang spells them otherwise, and its builds
 * measure no AMX path). The tile configuration (palette 1): tiles 0-7 all
 * 16 rows of 64 bytes (16 x 16 f32 or 16 x 32 bf16). */
#define AMX_FLOP (16.0 * 16 * 32 * 2) /* one tdpbf16ps */
#if !defined(__clang__)
#define AMX_BENCH 1
#include <immintrin.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

#define AMX_ATTR __attribute__((target("amx-tile,amx-bf16")))

AMX_ATTR static void amx_configure(void)
{
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++)
        c.colsb[t] = 64, c.rows[t] = 16;
    /* GCC's _tile_loadconfig tells the compiler it reads 8 bytes: the
     * barrier keeps the stores of the other 56 */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&c);
}

/* The sources: A and B regions of 512 KiB each, filled by amx_usable with
 * values like a model's (bf16 of magnitude 2^-7 to 2^-4, A positive, B
 * negative, the mantissas spread): with zeros the 2 x 2 loops ran 20-40%
 * faster on a Xeon with AMX (the register loop did not), and a GEMM never
 * multiplies zeros. In the 2 x 2 loops K step k's tiles lie at k * 2 KiB
 * (A: two tiles of 16 rows, 64 bytes a row; B: a packed panel's two
 * tiles), 4 steps an iteration. */
#define AMX_REGION ((size_t)512 << 10)
static _Alignas(64) uint16_t g_amx_a[AMX_REGION / 2], g_amx_b[AMX_REGION / 2];

/* 6 independent accumulators: more than tdpbf16ps's latency over its issue
 * interval on current cores (about 52 over 16 cycles). */
AMX_ATTR static NOINLINE void loop_amx_regs(long n)
{
    amx_configure();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_loadd(6, g_amx_a, 64);
    _tile_loadd(7, g_amx_b, 64);
    for (long i = 0; i < n; i++) {
        for (int r = 0; r < 2; r++) { /* (unrolled: the tile numbers are constants) */
            _tile_dpbf16ps(0, 6, 7);
            _tile_dpbf16ps(1, 6, 7);
            _tile_dpbf16ps(2, 6, 7);
            _tile_dpbf16ps(3, 6, 7);
            _tile_dpbf16ps(4, 6, 7);
            _tile_dpbf16ps(5, 6, 7);
        }
    }
    _tile_release();
}

AMX_ATTR static inline void amx_2x2(long n, long steps) /* steps: a power of two, 4 or more */
{
    amx_configure();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long i = 0; i < n; i++)
        for (long k = 4 * i; k < 4 * i + 4; k++) {
            const uint16_t *a = g_amx_a + (k & (steps - 1)) * 1024, *b = g_amx_b + (k & (steps - 1)) * 1024;
            _tile_loadd(4, a, 64);
            _tile_stream_loadd(6, b, 64);
            _tile_stream_loadd(7, b + 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a + 512, 64);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    _tile_release();
}
AMX_ATTR static NOINLINE void loop_amx_l1(long n) { amx_2x2(n, 4); }
AMX_ATTR static NOINLINE void loop_amx_l2(long n) { amx_2x2(n, (long)(AMX_REGION / 2048)); }
#else
#define AMX_BENCH 0
static NOINLINE void loop_amx_regs(long n) { (void)n; }
static NOINLINE void loop_amx_l1(long n) { (void)n; }
static NOINLINE void loop_amx_l2(long n) { (void)n; }
#endif

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* AMX-TILE and AMX-BF16 (cpuid 7.0:EDX bits 24, 22), the tile state saved
 * by the OS (XCR0 bits 17, 18) and the tile data granted (asked once). */
static bool amx_usable(void)
{
    if (!AMX_BENCH)
        return false;
    static int ok = -1;
    if (ok >= 0)
        return ok;
    unsigned a, b, c, d;
    ok = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22)))
        return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) /* OSXSAVE: xgetbv is there */
        return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return false;
    ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#if AMX_BENCH
    for (size_t i = 0; i < AMX_REGION / 2; i++) {
        g_amx_a[i] = (uint16_t)(0x3c00 + (uint32_t)(i * 2654435761u >> 20) % 0x180);
        g_amx_b[i] = (uint16_t)(0xbc00 + (uint32_t)(i * 40503u >> 7) % 0x180);
    }
    __asm__ volatile("" ::: "memory"); /* the tile loads' asm names no memory: keep the stores */
#endif
    return ok;
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
    if (!strcmp(isa, "amx_bf16"))
        return amx_usable();
    return false;
}

static const path k_paths[] = {
    {"fma_ymm", "avx2,fma", loop_fma_ymm, 28, 16},
    {"fma_zmm", "avx512f", loop_fma_zmm, 48, 32},
    {"dpbf16_ymm", "avx512_bf16", loop_dpbf16_ymm, 48, 32},
    {"dpbf16_zmm", "avx512_bf16", loop_dpbf16_zmm, 48, 64},
    {"amx_tdpbf16ps", "amx_bf16", loop_amx_regs, 12, AMX_FLOP},
    {"amx_2x2_l1", "amx_bf16", loop_amx_l1, 16, AMX_FLOP},
    {"amx_2x2_l2", "amx_bf16", loop_amx_l2, 16, AMX_FLOP},
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
            else if (!AMX_BENCH && !strcmp(q->isa, "amx_bf16")) /* the CPU may have it: say what is missing */
                printf("%-13s not measured by this build (GCC's AMX intrinsics)\n", q->name);
            else
                printf("%-13s not on this CPU (needs %s)\n", q->name, q->isa);
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
                       "\"instr_per_cycle\":%.3g,\"ghz\":%.2f,\"gemm_fraction\":%.3f}\n",
                       q->name, nt, q->flop_per_instr, gf, gf / nt, wall, ipc, ghz[nt], frac);
            else {
                printf("%-13s threads %3d: %8.1f GFLOP/s (%.1f a core, %.3g instructions a cycle at %.2f GHz, "
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
