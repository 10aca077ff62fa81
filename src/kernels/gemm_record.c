/* The GEMMs a piece of work issues, recorded and timed (dt_k_gemm_record_*,
 * dt_k_gemm_bench).
 *
 * dt_k_matmul_batched and dt_k_matmul_batched_lp (and so dt_k_matmul) call
 * dt__gemm_record after their product while a recording runs (one that
 * started during the product is not seen), with the product's wall time.
 * The table holds each distinct call once (every argument but the data,
 * alpha and beta by value) with a count and the calls' summed time, which
 * is their time inside the recorded work (operands where that work left
 * them): against the bench's best on its own operands it shows what the
 * surroundings cost each GEMM. It is a plain array searched linearly:
 * a training step issues a few hundred calls of a few dozen shapes. One
 * mutex guards it (calls may come from several threads); with no recording
 * the matmuls pay one relaxed atomic load.
 *
 * dt_k_gemm_bench replays each call through the public entry that recorded
 * it, so the same path runs (oneDNN's kernel for that dtype, the widening
 * emulation where oneDNN has none, dtrain's AMX GEMM for bf16 on AMX), on
 * operands of its own: one A, B and C buffer each sized for the largest
 * call, filled once with uniform [-1, 1) values (pages touched before any
 * timing). The best of `reps` runs stands for the call; the rate weighs
 * each call by its count, so a list recorded over one training step gives
 * the rate of that step's GEMMs if each ran at its best. */
#include "kernels_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool g_on;
static dt_k_gemm_shape *g_tab; /* g_n distinct calls, room for g_cap */
static int g_n, g_cap;
static bool g_oom; /* a distinct call found no room: the recording is incomplete */

bool dt__gemm_recording(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }

static bool same_call(const dt_k_gemm_shape *a, const dt_k_gemm_shape *b)
{
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->batch == b->batch && a->M == b->M &&
           a->N == b->N && a->K == b->K && a->stride_a == b->stride_a && a->stride_b == b->stride_b &&
           a->stride_c == b->stride_c && !memcmp(&a->alpha, &b->alpha, sizeof a->alpha) &&
           !memcmp(&a->beta, &b->beta, sizeof a->beta) && a->ab_type == b->ab_type && a->c_type == b->c_type &&
           a->bias == b->bias;
}

void dt__gemm_record(const dt_k_gemm_shape *call)
{
    pthread_mutex_lock(&g_lock);
    if (!atomic_load_explicit(&g_on, memory_order_relaxed))
        goto out; /* stopped since the caller looked */
    for (int i = 0; i < g_n; i++)
        if (same_call(&g_tab[i], call)) {
            g_tab[i].count++;
            g_tab[i].seconds += call->seconds;
            goto out;
        }
    if (g_n == g_cap) {
        int cap = g_cap ? 2 * g_cap : 64;
        dt_k_gemm_shape *t = cap < (1 << 20) ? realloc(g_tab, (size_t)cap * sizeof *t) : NULL;
        if (!t) {
            g_oom = true;
            goto out;
        }
        g_tab = t;
        g_cap = cap;
    }
    g_tab[g_n] = *call;
    g_tab[g_n++].count = 1;
out:
    pthread_mutex_unlock(&g_lock);
}

dt_status dt_k_gemm_record_start(void)
{
    dt_status st = DT_OK;
    pthread_mutex_lock(&g_lock);
    if (atomic_load(&g_on))
        st = dt_error(DT_ERR_INVALID_ARG, "dt_k_gemm_record_start: a recording is already running "
                                          "(stop it with dt_k_gemm_record_stop first)");
    else {
        g_n = 0;
        g_oom = false;
        atomic_store(&g_on, true);
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

dt_status dt_k_gemm_record_stop(dt_k_gemm_shape *out, int cap, int *n)
{
    const char *fn = "dt_k_gemm_record_stop";
    if (!n)
        return dt_error(DT_ERR_NULL, "%s: n is NULL", fn);
    if (cap < 0 || (cap > 0 && !out))
        return dt_error(DT_ERR_INVALID_ARG, "%s: cap %d with out %s", fn, cap, out ? "set" : "NULL");
    dt_status st = DT_OK;
    pthread_mutex_lock(&g_lock);
    if (!atomic_load(&g_on))
        st = dt_error(DT_ERR_INVALID_ARG, "%s: no recording is running (dt_k_gemm_record_start)", fn);
    else if (g_oom)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the table of recorded calls", fn);
    atomic_store(&g_on, false);
    if (st == DT_OK) {
        *n = g_n;
        if (out && g_n > 0)
            memcpy(out, g_tab, (size_t)(g_n < cap ? g_n : cap) * sizeof *g_tab);
    }
    free(g_tab);
    g_tab = NULL;
    g_n = g_cap = 0;
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* Elements a call's operand spans: one matrix of rows x cols, or batch of
 * them stride apart (stride 0 broadcasts one). */
static int64_t span(int64_t batch, int64_t stride, int64_t rows, int64_t cols)
{
    return batch > 1 && stride ? (batch - 1) * stride + rows * cols : rows * cols;
}

static bool lowp(dt_dtype t) { return t == DT_BF16 || t == DT_F16; }

/* One run of call g on a, b, c (bias: zeros). */
static dt_status run_call(const dt_k_gemm_shape *g, const void *a, const void *b, void *c, const float *bias)
{
    int64_t sa = g->batch > 1 ? g->stride_a : 0, sb = g->batch > 1 ? g->stride_b : 0,
            sc = g->batch > 1 ? g->stride_c : 0;
    if (g->c_type != DT_F32)
        return dt_k_matmul_batched_lp(g->trans_a, g->trans_b, g->batch, g->M, g->N, g->K, g->alpha, a, sa, b, sb,
                                      g->ab_type, c, sc, g->bias ? bias : NULL);
    return dt_k_matmul_batched(g->trans_a, g->trans_b, g->batch, g->M, g->N, g->K, g->alpha, a, sa, b, sb,
                               g->ab_type, g->beta, c, sc, g->bias ? bias : NULL);
}

/* n elements of dtype t, uniform [-1, 1) (through f32 for a half dtype). */
static dt_status fill(void *p, dt_dtype t, int64_t n, uint64_t stream)
{
    if (n <= 0)
        return DT_OK;
    if (t == DT_F32) {
        dt_rng_fill_uniform(dt_rng_key_make(7, DT_RNG_DATA, stream, 0), 0, p, (size_t)n, -1.0f, 1.0f);
        return DT_OK;
    }
    float *tmp = dt_alloc((size_t)n * sizeof(float));
    if (!tmp)
        return dt_error(DT_ERR_NO_MEMORY, "dt_k_gemm_bench: out of memory for %lld floats", (long long)n);
    dt_rng_fill_uniform(dt_rng_key_make(7, DT_RNG_DATA, stream, 0), 0, tmp, (size_t)n, -1.0f, 1.0f);
    dt_status st = dt_k_convert(tmp, DT_F32, p, t, n);
    dt_free(tmp);
    return st;
}

/* Process CPU seconds (user + system, every thread). */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

/* Checks call i of dt_k_gemm_bench and widens *ab, *bb, *cb (bytes of A, B
 * and C) and *nb (bias floats) to it. */
static dt_status check_call(const dt_k_gemm_shape *e, int i, size_t *ab, size_t *bb, size_t *cb, int64_t *nb)
{
    const char *fn = "dt_k_gemm_bench";
    if (e->batch < 0 || e->M < 0 || e->N < 0 || e->K < 0 || e->stride_a < 0 || e->stride_b < 0 ||
        e->stride_c < 0 || e->count < 0 || !(e->seconds >= 0 && e->seconds < 1e300))
        return dt_error(DT_ERR_INVALID_ARG, "%s: call %d has a negative size, stride, count or time", fn, i);
    if (e->ab_type != DT_F32 && !lowp(e->ab_type))
        return dt_error(DT_ERR_UNSUPPORTED, "%s: call %d: operand dtype %s (f32, bf16 or f16)", fn, i,
                        dt_dtype_name(e->ab_type));
    if (e->c_type != DT_F32 && e->c_type != e->ab_type)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: call %d: result dtype %s with operands %s", fn, i,
                        dt_dtype_name(e->c_type), dt_dtype_name(e->ab_type));
    const double lim = 1e13; /* elements of one operand: beyond any memory, and no int64 overflow */
    if ((double)e->batch * ((double)e->M * (double)e->K + (double)e->stride_a) > lim ||
        (double)e->batch * ((double)e->K * (double)e->N + (double)e->stride_b) > lim ||
        (double)e->batch * ((double)e->M * (double)e->N + (double)e->stride_c) > lim)
        return dt_error(DT_ERR_INVALID_ARG, "%s: call %d is too large for memory", fn, i);
    size_t es = dt_dtype_size(e->ab_type), cs = dt_dtype_size(e->c_type);
    size_t a = (size_t)span(e->batch, e->stride_a, e->M, e->K) * es;
    size_t b = (size_t)span(e->batch, e->stride_b, e->K, e->N) * es;
    size_t c = (size_t)span(e->batch, e->stride_c, e->M, e->N) * cs;
    *ab = a > *ab ? a : *ab;
    *bb = b > *bb ? b : *bb;
    *cb = c > *cb ? c : *cb;
    *nb = e->N > *nb ? e->N : *nb;
    return DT_OK;
}

dt_status dt_k_gemm_bench(const dt_k_gemm_shape *g, int n, int reps, double *best_s, dt_k_gemm_rate *out)
{
    const char *fn = "dt_k_gemm_bench";
    if (!g || !out)
        return dt_error(DT_ERR_NULL, "%s: %s is NULL", fn, !g ? "g" : "out");
    if (n < 1 || reps < 1)
        return dt_error(DT_ERR_INVALID_ARG, "%s: n = %d and reps = %d must be at least 1", fn, n, reps);
    size_t ab = 0, bb = 0, cb = 0;
    int64_t nb = 0;
    dt_status st = DT_OK;
    for (int i = 0; i < n && st == DT_OK; i++)
        st = check_call(&g[i], i, &ab, &bb, &cb, &nb);
    if (st < 0)
        return st;
    void *A = dt_alloc(ab + 64), *B = dt_alloc(bb + 64), *C = dt_alloc(cb + 64);
    float *bias = dt_calloc(((size_t)nb + 16) * sizeof(float));
    if (!A || !B || !C || !bias) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for operands of %zu, %zu and %zu bytes", fn, ab, bb, cb);
        goto out;
    }
    memset(C, 0, cb); /* touched now (beta != 0 reads it: zeros stay finite) */
    dt_dtype filled = DT_DTYPE_COUNT; /* the dtype A and B hold values of (none yet) */
    double sum_flop = 0, sum_s = 0, sum_cpu = 0, sum_rec = 0;
    for (int i = 0; i < n; i++) {
        const dt_k_gemm_shape *e = &g[i];
        sum_rec += e->seconds;
        size_t es = dt_dtype_size(e->ab_type);
        if (e->ab_type != filled) { /* whole buffers, so each call reads values of its dtype */
            if ((st = fill(A, e->ab_type, (int64_t)(ab / es), 1)) < 0 ||
                (st = fill(B, e->ab_type, (int64_t)(bb / es), 2)) < 0)
                goto out;
            filled = e->ab_type;
        }
        double best = 1e300, c0 = cpu_s();
        for (int r = 0; r < reps; r++) {
            double t0 = dt_time_s();
            if ((st = run_call(e, A, B, C, bias)) < 0) {
                dt_error_wrap(st, "%s: call %d (%s %s M %lld N %lld K %lld batch %lld %s)", fn, i,
                              e->trans_a ? "A^T" : "A", e->trans_b ? "B^T" : "B", (long long)e->M, (long long)e->N,
                              (long long)e->K, (long long)e->batch, dt_dtype_name(e->ab_type));
                goto out;
            }
            double t = dt_time_s() - t0;
            best = t < best ? t : best;
        }
        double cpu = (cpu_s() - c0) / reps;
        double flop = 2.0 * (double)e->batch * (double)e->M * (double)e->N * (double)e->K;
        if (best_s)
            best_s[i] = best;
        sum_flop += (double)e->count * flop;
        sum_s += (double)e->count * best;
        sum_cpu += (double)e->count * cpu;
    }
    out->gflop = sum_flop * 1e-9;
    out->seconds = sum_s;
    out->recorded_seconds = sum_rec;
    out->gflops = sum_s > 0 ? sum_flop / sum_s * 1e-9 : 0.0;
    out->cpu_gflops = sum_cpu > 0 ? sum_flop / sum_cpu * 1e-9 : 0.0;
out:
    dt_free(A);
    dt_free(B);
    dt_free(C);
    dt_free(bias);
    return st;
}
