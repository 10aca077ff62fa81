/* Reductions, softmax / log-softmax, the fused softmax cross-entropy and MSE.
 *
 * Determinism: every output element is reduced in a fixed order by one
 * thread (threads split outputs, never one sum), and whole-array sums
 * (dt_k_sum_all, dt_k_sumsq, the losses) add fixed-size blocks in double and
 * then the block partials serially; the block size depends only on n. So
 * none of these results depends on the thread count. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

/* ---- axis reduction ---------------------------------------------------------------- */
#define IB 256 /* inner block per task */

dt_status dt_k_reduce(dt_k_redop op, const float *x, int64_t outer, int64_t len, int64_t inner, float *y,
                      int64_t *arg)
{
    const char *fn = "dt_k_reduce";
    if ((unsigned)op > DT_K_MIN)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    DT__CHECK_N(fn, outer);
    DT__CHECK_N(fn, len);
    DT__CHECK_N(fn, inner);
    if (outer * inner == 0)
        return DT_OK;
    if (len == 0 && op != DT_K_SUM)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s over an empty axis", fn,
                        op == DT_K_MEAN ? "mean" : op == DT_K_MAX ? "max" : "min");
    DT__CHECK_PTR(fn, x, outer * len * inner);
    DT__CHECK_PTR(fn, y, outer * inner);
    if (arg && op != DT_K_MAX && op != DT_K_MIN)
        return dt_error(DT_ERR_INVALID_ARG, "%s: arg indices only for max/min", fn);
    int64_t nib = (inner + IB - 1) / IB, tasks = outer * nib;
    int nt = dt__threads_for(outer * len * inner);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t o = t / nib, i0 = (t % nib) * IB, ilen = inner - i0 < IB ? inner - i0 : IB;
        const float *xb = x + o * len * inner + i0;
        float *yb = y + o * inner + i0;
        if (inner == 1) { /* contiguous row */
            float acc;
            if (op == DT_K_SUM || op == DT_K_MEAN) {
                acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t l = 0; l < len; l++)
                    acc += xb[l];
                yb[0] = op == DT_K_MEAN ? acc / (float)len : acc;
            } else {
                int64_t best = 0;
                acc = xb[0];
                for (int64_t l = 1; l < len && acc == acc; l++) {
                    float v = xb[l];
                    if (op == DT_K_MAX ? (v > acc || v != v) : (v < acc || v != v)) {
                        acc = v;
                        best = l;
                    }
                }
                yb[0] = acc;
                if (arg)
                    arg[o * inner + i0] = best;
            }
            continue;
        }
        float acc[IB];
        int64_t best[IB];
        for (int64_t i = 0; i < ilen; i++) {
            acc[i] = (op == DT_K_SUM || op == DT_K_MEAN) ? 0.0f : xb[i];
            best[i] = 0;
        }
        if (op == DT_K_SUM || op == DT_K_MEAN) {
            for (int64_t l = 0; l < len; l++) {
                const float *xr = xb + l * inner;
#pragma omp simd
                for (int64_t i = 0; i < ilen; i++)
                    acc[i] += xr[i];
            }
            float s = op == DT_K_MEAN ? 1.0f / (float)len : 1.0f;
            for (int64_t i = 0; i < ilen; i++)
                yb[i] = op == DT_K_MEAN ? acc[i] * s : acc[i];
        } else {
            for (int64_t l = 1; l < len; l++) {
                const float *xr = xb + l * inner;
                for (int64_t i = 0; i < ilen; i++) {
                    float v = xr[i], a = acc[i];
                    bool take = a == a && (op == DT_K_MAX ? (v > a || v != v) : (v < a || v != v));
                    if (take) {
                        acc[i] = v;
                        best[i] = l;
                    }
                }
            }
            for (int64_t i = 0; i < ilen; i++) {
                yb[i] = acc[i];
                if (arg)
                    arg[o * inner + i0 + i] = best[i];
            }
        }
    }
    return DT_OK;
}

/* y[j] += x[0][j] + x[1][j] + ... in row order, one column block per task:
 * the adds of the serial loop `for r, for j: y[j] += x[r][j]` in the same
 * order (so the same bits), vectorised across the block's columns (16
 * lanes on the AVX-512 paths, 8 on AVX2). A block is 128 columns: 512
 * contiguous bytes of each row (GPT-2's 768 columns make 6 tasks). Rows of
 * bf16/f16 (_lp) are widened exactly as they are read: the bits of the f32
 * sum over the widened rows. */
#define CB 128
DT_CLONES static void sum_rows_block(const float *x, int64_t rows, int64_t cols, int64_t n, float *y)
{
    float acc[CB];
    for (int64_t j = 0; j < n; j++)
        acc[j] = y[j];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        for (int64_t j = 0; j < n; j++)
            acc[j] += xr[j];
    }
    for (int64_t j = 0; j < n; j++)
        y[j] = acc[j];
}

/* Low-precision rows: each row's n columns widened into a buffer first. */
DT_CLONES static void sum_rows_block_lp(dt_dtype t, const uint16_t *x, int64_t rows, int64_t cols, int64_t n, float *y)
{
    float acc[CB], v[CB];
    for (int64_t j = 0; j < n; j++)
        acc[j] = y[j];
    for (int64_t r = 0; r < rows; r++) {
        (void)dt_k_convert(x + r * cols, t, v, DT_F32, n); /* valid arguments: cannot fail */
        for (int64_t j = 0; j < n; j++)
            acc[j] += v[j];
    }
    for (int64_t j = 0; j < n; j++)
        y[j] = acc[j];
}

#if DT__X86_VEC
/* 16 lanes, 8 accumulators; a partial block's lanes masked. bf16 widened
 * in registers (the bits shifted up 16: exact, as dt_bf16_to_f32). */
DT__AVX512 static void sum_rows_block_avx512(dt_dtype t, const void *x, int64_t rows, int64_t cols, int64_t n,
                                             float *y)
{
    enum { NV = CB / 16 };
    __m512 acc[NV];
    __mmask16 mk[NV];
    for (int k = 0; k < NV; k++) {
        int64_t left = n - 16 * k;
        mk[k] = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
        acc[k] = _mm512_maskz_loadu_ps(mk[k], y + 16 * k);
    }
    if (t == DT_F32) {
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = (const float *)x + r * cols;
            for (int k = 0; k < NV; k++)
                acc[k] = _mm512_add_ps(acc[k], _mm512_maskz_loadu_ps(mk[k], xr + 16 * k));
        }
    } else {
        for (int64_t r = 0; r < rows; r++) {
            const uint16_t *xr = (const uint16_t *)x + r * cols;
            for (int k = 0; k < NV; k++) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mk[k], xr + 16 * k));
                acc[k] = _mm512_add_ps(acc[k], _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
        }
    }
    for (int k = 0; k < NV; k++)
        _mm512_mask_storeu_ps(y + 16 * k, mk[k], acc[k]);
}
#endif

static dt_status sum_rows(const char *fn, dt_dtype t, const void *x, int64_t rows, int64_t cols, float *y)
{
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (rows * cols == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, cols);
    const size_t es = dt_dtype_size(t);
    int64_t nb = (cols + CB - 1) / CB;
    int nt = dt__threads_for(rows * cols);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        int64_t j0 = b * CB, n = cols - j0 < CB ? cols - j0 : CB;
        const void *xb = (const char *)x + (size_t)j0 * es;
#if DT__X86_VEC
        if (vec >= DT__VEC_AVX512 && t != DT_F16) {
            sum_rows_block_avx512(t, xb, rows, cols, n, y + j0);
            continue;
        }
#endif
        (void)vec;
        if (t == DT_F32)
            sum_rows_block(xb, rows, cols, n, y + j0);
        else
            sum_rows_block_lp(t, xb, rows, cols, n, y + j0);
    }
    return DT_OK;
}

dt_status dt_k_sum_rows_acc(const float *x, int64_t rows, int64_t cols, float *y)
{
    return sum_rows("dt_k_sum_rows_acc", DT_F32, x, rows, cols, y);
}

dt_status dt_k_sum_rows_acc_lp(dt_dtype t, const void *x, int64_t rows, int64_t cols, float *y)
{
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_DTYPE, "dt_k_sum_rows_acc_lp: rows are %s; want bf16 or f16", dt_dtype_name(t));
    return sum_rows("dt_k_sum_rows_acc_lp", t, x, rows, cols, y);
}
#undef CB

/* ---- whole-array sums ---------------------------------------------------------------- */
#define MAXBLK 1024

static int64_t block_size(int64_t n)
{
    int64_t b = (n + MAXBLK - 1) / MAXBLK;
    return b < 4096 ? 4096 : b;
}

/* Sum over blocks of f(i) in double; mode 0: x, 1: x^2, 2: (x - t)^2. */
static double block_sum(const float *x, const float *t, int64_t n, int mode)
{
    if (n <= 0)
        return 0.0;
    int64_t bs = block_size(n), nb = (n + bs - 1) / bs;
    double part[MAXBLK];
    int nt = dt__threads_for(n);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        int64_t lo = b * bs, hi = lo + bs < n ? lo + bs : n;
        double acc = 0.0;
        if (mode == 0) {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = lo; i < hi; i++)
                acc += (double)x[i];
        } else if (mode == 1) {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = lo; i < hi; i++)
                acc += (double)x[i] * (double)x[i];
        } else {
#pragma omp simd reduction(+ : acc)
            for (int64_t i = lo; i < hi; i++) {
                double d = (double)x[i] - (double)t[i];
                acc += d * d;
            }
        }
        part[b] = acc;
    }
    double s = 0.0;
    for (int64_t b = 0; b < nb; b++)
        s += part[b];
    return s;
}

dt_status dt_k_sum_all(const float *x, int64_t n, float *out)
{
    DT__CHECK_N("dt_k_sum_all", n);
    DT__CHECK_PTR("dt_k_sum_all", x, n);
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_k_sum_all: out is NULL");
    *out = (float)block_sum(x, NULL, n, 0);
    return DT_OK;
}

dt_status dt_k_sumsq(const float *x, int64_t n, double *out)
{
    DT__CHECK_N("dt_k_sumsq", n);
    DT__CHECK_PTR("dt_k_sumsq", x, n);
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_k_sumsq: out is NULL");
    *out = block_sum(x, NULL, n, 1);
    return DT_OK;
}

dt_status dt_k_mse_fwd(const float *pred, const float *target, int64_t n, float *loss)
{
    const char *fn = "dt_k_mse_fwd";
    DT__CHECK_N(fn, n);
    if (n == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: mean over 0 elements", fn);
    DT__CHECK_PTR(fn, pred, n);
    DT__CHECK_PTR(fn, target, n);
    if (!loss)
        return dt_error(DT_ERR_NULL, "%s: loss is NULL", fn);
    *loss = (float)(block_sum(pred, target, n, 2) / (double)n);
    return DT_OK;
}

dt_status dt_k_mse_bwd(const float *pred, const float *target, int64_t n, float dloss, float *dpred)
{
    const char *fn = "dt_k_mse_bwd";
    DT__CHECK_N(fn, n);
    if (n == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: mean over 0 elements", fn);
    DT__CHECK_PTR(fn, pred, n);
    DT__CHECK_PTR(fn, target, n);
    DT__CHECK_PTR(fn, dpred, n);
    float s = 2.0f * dloss / (float)n;
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        dpred[i] = s * (pred[i] - target[i]);
    return DT_OK;
}

/* ---- softmax ------------------------------------------------------------------------ */
static void softmax_row(const float *x, float *y, int64_t cols, bool log)
{
    float m = x[0];
    for (int64_t j = 1; j < cols; j++)
        m = x[j] > m ? x[j] : m;
    float s = 0.0f;
    if (log) {
        for (int64_t j = 0; j < cols; j++)
            s += expf(x[j] - m);
        float lse = m + logf(s);
        for (int64_t j = 0; j < cols; j++)
            y[j] = x[j] - lse;
    } else {
        for (int64_t j = 0; j < cols; j++) {
            y[j] = expf(x[j] - m);
            s += y[j];
        }
        float r = 1.0f / s;
        for (int64_t j = 0; j < cols; j++)
            y[j] *= r;
    }
}

static dt_status rows_check(const char *fn, int64_t rows, int64_t cols)
{
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, cols);
    if (rows > 0 && cols == 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: softmax over 0 columns", fn);
    return DT_OK;
}

dt_status dt_k_softmax_fwd(const float *x, float *y, int64_t rows, int64_t cols, bool log)
{
    const char *fn = "dt_k_softmax_fwd";
    dt_status st = rows_check(fn, rows, cols);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, x, rows * cols);
    DT__CHECK_PTR(fn, y, rows * cols);
    int nt = dt__threads_for(rows * cols * 4);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++)
        softmax_row(x + r * cols, y + r * cols, cols, log);
    return DT_OK;
}

dt_status dt_k_softmax_bwd(const float *y, const float *dy, float *dx, int64_t rows, int64_t cols, bool log)
{
    const char *fn = "dt_k_softmax_bwd";
    dt_status st = rows_check(fn, rows, cols);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, y, rows * cols);
    DT__CHECK_PTR(fn, dy, rows * cols);
    DT__CHECK_PTR(fn, dx, rows * cols);
    int nt = dt__threads_for(rows * cols * 2);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *gr = dy + r * cols;
        float *xr = dx + r * cols;
        float s = 0.0f;
        if (log) {
            for (int64_t j = 0; j < cols; j++)
                s += gr[j];
            for (int64_t j = 0; j < cols; j++)
                xr[j] = gr[j] - expf(yr[j]) * s;
        } else {
            for (int64_t j = 0; j < cols; j++)
                s += gr[j] * yr[j];
            for (int64_t j = 0; j < cols; j++)
                xr[j] = yr[j] * (gr[j] - s);
        }
    }
    return DT_OK;
}

/* ---- softmax cross-entropy -------------------------------------------------------------- */
static inline int64_t label_at(const void *labels, dt_dtype t, int64_t r)
{
    return t == DT_I64 ? ((const int64_t *)labels)[r] : (int64_t)((const int32_t *)labels)[r];
}

/* log(sum(exp(x))) of one row in one pass over chunks of XCHUNK columns
 * (online rescaling of the running sum when a chunk raises the max), so a
 * vocabulary-sized row (50257 logits) is read once from memory and each
 * chunk twice from L1/L2. The exponentials are dt__expf (within 2 ulp of
 * expf), eight lanes at a time on AVX2 (dt__expf8); a chunk's sum runs in 8
 * lane accumulators (element j into lane j mod 8) added up in lane order,
 * the same in the scalar and the vector loops, so both paths give the same
 * bits. */
#define XCHUNK 2048
static float lanes_sum(const float acc[8])
{
    float s = acc[0];
    for (int k = 1; k < 8; k++)
        s += acc[k];
    return s;
}

static float chunk_sumexp_scalar(const float *x, int64_t n, float m, float acc[8])
{
    for (int64_t j = 0; j < n; j++)
        acc[j & 7] += dt__expf(x[j] - m);
    return lanes_sum(acc);
}

/* d = s * exp(x - lse), the softmax scaled (the cross-entropy gradient before the label's -s). */
static void row_scaled_softmax_scalar(const float *x, float *d, int64_t n, float lse, float s)
{
    for (int64_t j = 0; j < n; j++)
        d[j] = s * dt__expf(x[j] - lse);
}

#if DT__X86_VEC
DT__AVX2 static float chunk_sumexp_avx2(const float *x, int64_t n, float m)
{
    __m256 a = _mm256_setzero_ps();
    const __m256 vm = _mm256_set1_ps(m);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        a = _mm256_add_ps(a, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm)));
    float acc[8];
    _mm256_storeu_ps(acc, a);
    return chunk_sumexp_scalar(x + j, n - j, m, acc); /* j is a multiple of 8: lanes line up */
}

DT__AVX2 static void row_scaled_softmax_avx2(const float *x, float *d, int64_t n, float lse, float s)
{
    const __m256 vl = _mm256_set1_ps(lse), vs = _mm256_set1_ps(s);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(d + j, _mm256_mul_ps(vs, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(x + j), vl))));
    row_scaled_softmax_scalar(x + j, d + j, n - j, lse, s);
}

/* The exponentials on 16 lanes (dt__expf16, the same bits as dt__expf), the
 * sums still in the 8 lanes of the other paths: the low half of each 16 is
 * added before the high half, so lane k sums elements j = k mod 8 in order. */
DT__AVX512 static float chunk_sumexp_avx512(const float *x, int64_t n, float m)
{
    __m256 a = _mm256_setzero_ps();
    const __m512 vm = _mm512_set1_ps(m);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 e = dt__expf16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vm));
        a = _mm256_add_ps(a, _mm512_castps512_ps256(e));
        a = _mm256_add_ps(a, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
    }
    if (j + 8 <= n) {
        a = _mm256_add_ps(a, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(x + j), _mm512_castps512_ps256(vm))));
        j += 8;
    }
    float acc[8];
    _mm256_storeu_ps(acc, a);
    return chunk_sumexp_scalar(x + j, n - j, m, acc); /* j is a multiple of 8: lanes line up */
}

/* row_lse of a bf16 row on the avx512 paths: each chunk's max and
 * exponentials taken from the bf16 values widened in registers (twice
 * from L1) instead of through a widened copy, with chunk_max's and
 * chunk_sumexp_avx512's operations in their order: the same bits. */
DT__AVX512 static float row_lse_bf16_avx512(const uint16_t *x, int64_t cols)
{
    float m = -INFINITY, s = 0.0f;
    for (int64_t c0 = 0; c0 < cols; c0 += XCHUNK) {
        const int64_t n = c0 + XCHUNK < cols ? XCHUNK : cols - c0;
        const uint16_t *xc = x + c0;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            dt__prefetch_ahead(xc + j);
            mx = _mm512_max_ps(dt__bf16_load16(xc + j), mx); /* a NaN ignored, as chunk_max does */
        }
        float cm = _mm512_reduce_max_ps(mx);
        for (; j < n; j++) {
            const float v = dt_bf16_to_f32(xc[j]);
            cm = v > cm ? v : cm;
        }
        if (cm > m) {
            s = m == -INFINITY ? 0.0f : s * expf(m - cm);
            m = cm;
        }
        __m256 a = _mm256_setzero_ps();
        const __m512 vm = _mm512_set1_ps(m);
        for (j = 0; j + 16 <= n; j += 16) {
            __m512 e = dt__expf16(_mm512_sub_ps(dt__bf16_load16(xc + j), vm));
            a = _mm256_add_ps(a, _mm512_castps512_ps256(e));
            a = _mm256_add_ps(a, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1)));
        }
        float t[16], acc[8];
        const int64_t r = n - j;
        for (int64_t k = 0; k < r; k++)
            t[k] = dt_bf16_to_f32(xc[j + k]);
        int64_t k0 = 0;
        if (r >= 8) {
            a = _mm256_add_ps(a, dt__expf8(_mm256_sub_ps(_mm256_loadu_ps(t), _mm512_castps512_ps256(vm))));
            k0 = 8;
        }
        _mm256_storeu_ps(acc, a);
        s += chunk_sumexp_scalar(t + k0, r - k0, m, acc); /* j + k0 is a multiple of 8: lanes line up */
    }
    return m + logf(s);
}

DT__AVX512 static void row_scaled_softmax_avx512(const float *x, float *d, int64_t n, float lse, float s)
{
    const __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(s);
    int64_t j = 0;
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(d + j, _mm512_mul_ps(vs, dt__expf16(_mm512_sub_ps(_mm512_loadu_ps(x + j), vl))));
    row_scaled_softmax_avx2(x + j, d + j, n - j, lse, s);
}
#endif

/* The widest path vec (dt__vec_level()) allows. */
static float chunk_sumexp(int vec, const float *x, int64_t n, float m)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512)
        return chunk_sumexp_avx512(x, n, m);
    if (vec)
        return chunk_sumexp_avx2(x, n, m);
#endif
    (void)vec;
    float acc[8] = {0};
    return chunk_sumexp_scalar(x, n, m, acc);
}

static void row_scaled_softmax(int vec, const float *x, float *d, int64_t n, float lse, float s)
{
#if DT__X86_VEC
    if (vec >= DT__VEC_AVX512) {
        row_scaled_softmax_avx512(x, d, n, lse, s);
        return;
    }
    if (vec) {
        row_scaled_softmax_avx2(x, d, n, lse, s);
        return;
    }
#endif
    (void)vec;
    row_scaled_softmax_scalar(x, d, n, lse, s);
}

DT_CLONES static float chunk_max(const float *restrict x, int64_t n)
{
    float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
    for (int64_t j = 0; j < n; j++)
        cm = x[j] > cm ? x[j] : cm;
    return cm;
}

/* Columns [c0, c0 + n) of a row of logits in dtype t as f32: an f32 row in
 * place, a bf16/f16 one widened (exactly) into buf (XCHUNK floats, in L1),
 * so the low-precision rows take the f32 loops' bits with no widened row in
 * memory. The arguments are valid here: the conversion cannot fail. */
static const float *chunk_f32(dt_dtype t, const void *x, int64_t c0, int64_t n, float *buf)
{
    if (t == DT_F32)
        return (const float *)x + c0;
    (void)dt_k_convert((const uint16_t *)x + c0, t, buf, DT_F32, n);
    return buf;
}

static float logit_at(dt_dtype t, const void *x, int64_t j)
{
    if (t == DT_F32)
        return ((const float *)x)[j];
    uint16_t h = ((const uint16_t *)x)[j];
    return t == DT_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
}

static float row_lse(int vec, dt_dtype t, const void *x, int64_t cols, float *buf)
{
#if DT__X86_VEC
    if (t == DT_BF16 && vec >= DT__VEC_AVX512)
        return row_lse_bf16_avx512(x, cols);
#endif
    float m = -INFINITY, s = 0.0f;
    for (int64_t c0 = 0; c0 < cols; c0 += XCHUNK) {
        int64_t c1 = c0 + XCHUNK < cols ? c0 + XCHUNK : cols;
        const float *xc = chunk_f32(t, x, c0, c1 - c0, buf);
        float cm = chunk_max(xc, c1 - c0);
        if (cm > m) {
            s = m == -INFINITY ? 0.0f : s * expf(m - cm);
            m = cm;
        }
        s += chunk_sumexp(vec, xc, c1 - c0, m);
    }
    return m + logf(s);
}

/* Validate labels; count the rows that take part. */
static dt_status xent_labels(const char *fn, const void *labels, dt_dtype t, int64_t rows, int64_t cols,
                             int64_t *count)
{
    if (t != DT_I64 && t != DT_I32)
        return dt_error(DT_ERR_DTYPE, "%s: labels must be i64 or i32, got %s", fn, dt_dtype_name(t));
    DT__CHECK_PTR(fn, labels, rows);
    int64_t c = 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t l = label_at(labels, t, r);
        if (l == DT_K_IGNORE_INDEX)
            continue;
        if (l < 0 || l >= cols)
            return dt_error(DT_ERR_RANGE, "%s: label %lld of row %lld is outside [0, %lld)", fn, (long long)l,
                            (long long)r, (long long)cols);
        c++;
    }
    *count = c;
    return DT_OK;
}

/* dt_k_softmax_xent_fwd, and with save_lse (prob NULL) each row's
 * log-sum-exp; logits of dtype t (f32, or bf16/f16 with prob NULL) */
static dt_status xent_fwd(const char *fn, dt_dtype t, const void *logits, const void *labels, dt_dtype lt,
                          int64_t rows, int64_t cols, float *loss, float *prob, float *save_lse)
{
    dt_status st = rows_check(fn, rows, cols);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, logits, rows * cols);
    if (!loss)
        return dt_error(DT_ERR_NULL, "%s: loss is NULL", fn);
    int64_t count;
    if ((st = xent_labels(fn, labels, lt, rows, cols, &count)) < 0)
        return st;
    int64_t bs = (rows + MAXBLK - 1) / MAXBLK;
    if (bs < 16)
        bs = 16;
    int64_t nb = (rows + bs - 1) / bs;
    double part[MAXBLK];
    int nt = dt__threads_for(rows * cols * 4);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        double acc = 0.0;
        float buf[XCHUNK];
        int64_t hi = (b + 1) * bs < rows ? (b + 1) * bs : rows;
        for (int64_t r = b * bs; r < hi; r++) {
            const void *xr = (const char *)logits + (size_t)(r * cols) * dt_dtype_size(t);
            const float *x = xr; /* f32 rows only (prob) */
            float m = 0.0f, s = 0.0f;
            if (prob) {
                m = x[0];
                for (int64_t j = 1; j < cols; j++)
                    m = x[j] > m ? x[j] : m;
                float *p = prob + r * cols;
                for (int64_t j = 0; j < cols; j++) {
                    p[j] = expf(x[j] - m);
                    s += p[j];
                }
                float inv = 1.0f / s;
                for (int64_t j = 0; j < cols; j++)
                    p[j] *= inv;
            } else {
                m = row_lse(vec, t, xr, cols, buf), s = 1.0f; /* m + logf(s) = lse */
                if (save_lse)
                    save_lse[r] = m;
            }
            int64_t l = label_at(labels, lt, r);
            if (l != DT_K_IGNORE_INDEX)
                acc += (double)(m + logf(s) - logit_at(t, xr, l));
        }
        part[b] = acc;
    }
    double tot = 0.0;
    for (int64_t b = 0; b < nb; b++)
        tot += part[b];
    *loss = count ? (float)(tot / (double)count) : 0.0f;
    return DT_OK;
}

dt_status dt_k_softmax_xent_fwd(const float *logits, const void *labels, dt_dtype lt, int64_t rows, int64_t cols,
                                float *loss, float *prob)
{
    return xent_fwd("dt_k_softmax_xent_fwd", DT_F32, logits, labels, lt, rows, cols, loss, prob, NULL);
}

dt_status dt_k_softmax_xent_fwd_lse(const float *logits, const void *labels, dt_dtype lt, int64_t rows,
                                    int64_t cols, float *loss, float *save_lse)
{
    const char *fn = "dt_k_softmax_xent_fwd_lse";
    DT__CHECK_PTR(fn, save_lse, rows);
    return xent_fwd(fn, DT_F32, logits, labels, lt, rows, cols, loss, NULL, save_lse);
}

static bool lp_logits(dt_dtype t) { return t == DT_BF16 || t == DT_F16; }

dt_status dt_k_softmax_xent_fwd_lp(dt_dtype t, const void *logits, const void *labels, dt_dtype lt, int64_t rows,
                                   int64_t cols, float *loss, float *save_lse)
{
    const char *fn = "dt_k_softmax_xent_fwd_lp";
    if (!lp_logits(t))
        return dt_error(DT_ERR_DTYPE, "%s: logits are %s; want bf16 or f16", fn, dt_dtype_name(t));
    return xent_fwd(fn, t, logits, labels, lt, rows, cols, loss, NULL, save_lse);
}

#if DT__X86_VEC
/* row_grad's bf16 row on the avx512 paths: the logits widened and the
 * gradient rounded in registers, row_scaled_softmax_avx512's operations
 * (every path's bits) with the label's s subtracted in its lane before the
 * rounding, as the chunks do; returns the columns done (a multiple of 16). */
DT__AVX512 static int64_t row_grad_bf16_avx512(const uint16_t *x, int64_t cols, float lse, float s, int64_t l,
                                               float *d, uint16_t *h)
{
    const __m512 vl = _mm512_set1_ps(lse), vs = _mm512_set1_ps(s);
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
        dt__prefetch_ahead(x + j);
        __m512 v = _mm512_mul_ps(vs, dt__expf16(_mm512_sub_ps(dt__bf16_load16(x + j), vl)));
        if (l >= j && l < j + 16)
            v = _mm512_mask_sub_ps(v, (__mmask16)(1u << (l - j)), v, vs);
        __m512 r = dt__bf16_round16(v);
        dt__bf16_store16(h + j, r);
        if (d)
            _mm512_storeu_ps(d + j, r);
    }
    return j;
}
#endif

/* Row r's gradient from its logits x (dtype t) and lse, chunk by chunk:
 * f32 logits straight into d; low-precision ones widened into buf, the
 * chunk's gradient rounded to t into dl (and widened back into d, if any). */
static void row_grad(int vec, dt_dtype t, const void *x, int64_t cols, float lse, float s, int64_t l, float *d,
                     void *dl, float *buf)
{
    if (t == DT_F32) {
        row_scaled_softmax(vec, x, d, cols, lse, s);
        d[l] -= s;
        return;
    }
    int64_t c0 = 0;
#if DT__X86_VEC
    if (t == DT_BF16 && vec >= DT__VEC_AVX512)
        c0 = row_grad_bf16_avx512(x, cols, lse, s, l, d, dl);
#endif
    for (; c0 < cols; c0 += XCHUNK) {
        int64_t n = c0 + XCHUNK < cols ? XCHUNK : cols - c0;
        uint16_t *h = (uint16_t *)dl + c0;
        row_scaled_softmax(vec, chunk_f32(t, x, c0, n, buf), buf, n, lse, s);
        if (l >= c0 && l < c0 + n)
            buf[l - c0] -= s;
        (void)dt_k_convert(buf, DT_F32, h, t, n);
        if (d)
            (void)dt_k_convert(h, t, d + c0, DT_F32, n);
    }
}

/* dt_k_softmax_xent_bwd, and with lse (prob NULL) the forward's row
 * log-sum-exps; logits of dtype t (f32, or bf16/f16 with prob NULL: the
 * gradient rounded to t into dlp, and in f32 into dlogits if not NULL) */
static dt_status xent_bwd(const char *fn, dt_dtype t, const void *logits, const float *prob, const float *lse,
                          const void *labels, dt_dtype lt, int64_t rows, int64_t cols, float dloss, float *dlogits,
                          void *dlp)
{
    dt_status st = rows_check(fn, rows, cols);
    if (st < 0)
        return st;
    if (!prob)
        DT__CHECK_PTR(fn, logits, rows * cols);
    if (t == DT_F32)
        DT__CHECK_PTR(fn, dlogits, rows * cols);
    else
        DT__CHECK_PTR(fn, dlp, rows * cols);
    int64_t count;
    if ((st = xent_labels(fn, labels, lt, rows, cols, &count)) < 0)
        return st;
    float s = count ? dloss / (float)count : 0.0f;
    int nt = dt__threads_for(rows * cols * 2);
    const int vec = dt__vec_level();
    const size_t es = dt_dtype_size(t);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        float *d = dlogits ? dlogits + r * cols : NULL, buf[XCHUNK];
        void *dl = t == DT_F32 ? NULL : (char *)dlp + (size_t)(r * cols) * es;
        int64_t l = label_at(labels, lt, r);
        if (l == DT_K_IGNORE_INDEX) {
            if (d)
                memset(d, 0, (size_t)cols * sizeof(float));
            if (dl)
                memset(dl, 0, (size_t)cols * es);
            continue;
        }
        if (prob) {
            const float *p = prob + r * cols;
            for (int64_t j = 0; j < cols; j++)
                d[j] = s * p[j];
            d[l] -= s;
        } else { /* softmax recomputed from the logits: no (rows, cols) buffer kept */
            const void *x = (const char *)logits + (size_t)(r * cols) * es;
            row_grad(vec, t, x, cols, lse ? lse[r] : row_lse(vec, t, x, cols, buf), s, l, d, dl, buf);
        }
    }
    return DT_OK;
}

dt_status dt_k_softmax_xent_bwd(const float *logits, const float *prob, const void *labels, dt_dtype lt,
                                int64_t rows, int64_t cols, float dloss, float *dlogits)
{
    return xent_bwd("dt_k_softmax_xent_bwd", DT_F32, logits, prob, NULL, labels, lt, rows, cols, dloss, dlogits,
                    NULL);
}

dt_status dt_k_softmax_xent_bwd_lse(const float *logits, const float *lse, const void *labels, dt_dtype lt,
                                    int64_t rows, int64_t cols, float dloss, float *dlogits)
{
    const char *fn = "dt_k_softmax_xent_bwd_lse";
    DT__CHECK_PTR(fn, lse, rows);
    return xent_bwd(fn, DT_F32, logits, NULL, lse, labels, lt, rows, cols, dloss, dlogits, NULL);
}

dt_status dt_k_softmax_xent_bwd_lp(dt_dtype t, const void *logits, const float *lse, const void *labels,
                                   dt_dtype lt, int64_t rows, int64_t cols, float dloss, float *dlogits,
                                   void *dlogits_lp)
{
    const char *fn = "dt_k_softmax_xent_bwd_lp";
    if (!lp_logits(t))
        return dt_error(DT_ERR_DTYPE, "%s: logits are %s; want bf16 or f16", fn, dt_dtype_name(t));
    return xent_bwd(fn, t, logits, NULL, lse, labels, lt, rows, cols, dloss, dlogits, dlogits_lp);
}
