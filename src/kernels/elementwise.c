/* Elementwise kernels: fill, scale, axpy, broadcasting binary ops and their
 * reduction back to an operand's shape, unary math and its derivative,
 * strided copies.
 *
 * Broadcasting: the output index space is walked as (outer rows, inner run)
 * where the inner run is the last output dimension; each operand gets
 * per-dimension strides that are 0 on broadcast dimensions. Rows are split
 * across threads statically; every element is computed independently, so
 * results never depend on the thread count. Equal shapes take a flat loop. */
#include "kernels_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define MAXD 8

dt_status dt_k_fill(float *restrict y, float v, int64_t n)
{
    DT__CHECK_N("dt_k_fill", n);
    DT__CHECK_PTR("dt_k_fill", y, n);
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = v;
    return DT_OK;
}

dt_status dt_k_scale(const float *x, float a, float b, float *y, int64_t n)
{
    DT__CHECK_N("dt_k_scale", n);
    DT__CHECK_PTR("dt_k_scale", x, n);
    DT__CHECK_PTR("dt_k_scale", y, n);
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = a * x[i] + b;
    return DT_OK;
}

dt_status dt_k_axpy(int64_t n, float a, const float *restrict x, float *restrict y)
{
    DT__CHECK_N("dt_k_axpy", n);
    DT__CHECK_PTR("dt_k_axpy", x, n);
    DT__CHECK_PTR("dt_k_axpy", y, n);
    int nt = dt__threads_for(n);
#pragma omp parallel for simd schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
    return DT_OK;
}

/* ---- broadcasting ---------------------------------------------------------------- */
static dt_status check_shape(const char *fn, const char *what, const int64_t *s, int nd)
{
    if (nd < 0 || nd > MAXD)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s has %d dims (0..%d)", fn, what, nd, MAXD);
    if (nd > 0 && !s)
        return dt_error(DT_ERR_NULL, "%s: %s shape is NULL with %d dims", fn, what, nd);
    for (int i = 0; i < nd; i++)
        if (s[i] < 0)
            return dt_error(DT_ERR_INVALID_ARG, "%s: %s dim %d is negative (%lld)", fn, what, i, (long long)s[i]);
    return DT_OK;
}

static int64_t numel(const int64_t *s, int nd)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= s[i];
    return n;
}

static void fmt_shape(char *buf, size_t len, const int64_t *s, int nd)
{
    size_t k = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < nd && k < len; i++)
        k += (size_t)snprintf(buf + k, len - k, i ? ",%lld" : "%lld", (long long)s[i]);
    if (k < len)
        snprintf(buf + k, len - k, "]");
}

dt_status dt_k_broadcast_shape(const int64_t *a, int na, const int64_t *b, int nb, int64_t *out, int *nout)
{
    const char *fn = "dt_k_broadcast_shape";
    dt_status st;
    if ((st = check_shape(fn, "a", a, na)) < 0 || (st = check_shape(fn, "b", b, nb)) < 0)
        return st;
    if (!out || !nout)
        return dt_error(DT_ERR_NULL, "%s: out or nout is NULL", fn);
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            fmt_shape(sa, sizeof sa, a, na);
            fmt_shape(sb, sizeof sb, b, nb);
            return dt_error(DT_ERR_SHAPE, "shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", sa, sb, i,
                            (long long)da, (long long)db);
        }
        out[i] = da == 1 ? db : da;
    }
    *nout = n;
    return DT_OK;
}

/* Strides (in elements) of a contiguous operand of shape s (nd dims) seen in
 * an n-dim output index space: 0 on broadcast dims. */
static void bcast_strides(const int64_t *s, int nd, const int64_t *o, int n, int64_t *st)
{
    int64_t acc = 1;
    for (int i = n - 1; i >= 0; i--) {
        int j = i - (n - nd);
        int64_t d = j >= 0 ? s[j] : 1;
        st[i] = (d == 1 && o[i] != 1) ? 0 : acc;
        acc *= d;
    }
}

static inline float binop(dt_k_binop op, float x, float y)
{
    switch (op) {
    case DT_K_ADD: return x + y;
    case DT_K_SUB: return x - y;
    case DT_K_MUL: return x * y;
    case DT_K_DIV: return x / y;
    case DT_K_MAXIMUM: return (x > y || x != x) ? x : y;
    case DT_K_MINIMUM: return (x < y || x != x) ? x : y;
    default: return 0.0f;
    }
}

/* The inner loop, one instantiation per op so each vectorises. */
#define INNER(OPEXPR)                                                                       \
    do {                                                                                    \
        if (sa1 == 1 && sb1 == 1) {                                                         \
            _Pragma("omp simd") for (int64_t j = 0; j < len; j++) {                         \
                float x = pa[j], y = pb[j];                                                 \
                po[j] = OPEXPR;                                                             \
            }                                                                               \
        } else {                                                                            \
            for (int64_t j = 0; j < len; j++) {                                             \
                float x = pa[j * sa1], y = pb[j * sb1];                                     \
                po[j] = OPEXPR;                                                             \
            }                                                                               \
        }                                                                                   \
    } while (0)

static void run_row(dt_k_binop op, const float *pa, int64_t sa1, const float *pb, int64_t sb1, float *po,
                    int64_t len)
{
    switch (op) {
    case DT_K_ADD: INNER(x + y); break;
    case DT_K_SUB: INNER(x - y); break;
    case DT_K_MUL: INNER(x * y); break;
    case DT_K_DIV: INNER(x / y); break;
    case DT_K_MAXIMUM: INNER((x > y || x != x) ? x : y); break;
    case DT_K_MINIMUM: INNER((x < y || x != x) ? x : y); break;
    default: break;
    }
}

dt_status dt_k_binary(dt_k_binop op, const float *a, const int64_t *shape_a, int na, const float *b,
                      const int64_t *shape_b, int nb, float *out)
{
    const char *fn = "dt_k_binary";
    if ((unsigned)op >= DT_K_BINOP_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    int64_t os[MAXD];
    int n;
    dt_status st = dt_k_broadcast_shape(shape_a, na, shape_b, nb, os, &n);
    if (st < 0)
        return dt_error_wrap(st, "%s", fn);
    int64_t total = numel(os, n);
    if (total == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, a, 1);
    DT__CHECK_PTR(fn, b, 1);
    DT__CHECK_PTR(fn, out, 1);
    int64_t sa[MAXD], sb[MAXD];
    bcast_strides(shape_a, na, os, n, sa);
    bcast_strides(shape_b, nb, os, n, sb);
    int64_t len = n ? os[n - 1] : 1;
    int64_t sa1 = n ? sa[n - 1] : 0, sb1 = n ? sb[n - 1] : 0;
    int64_t rows = total / len;
    if (numel(shape_a, na) == total && numel(shape_b, nb) == total) { /* same shape: flat */
        len = total;
        rows = 1;
        sa1 = sb1 = 1;
    }
    int nt = dt__threads_for(total);
    if (rows == 1 && nt > 1) { /* one long row: split it */
        int64_t chunk = (len + nt - 1) / nt;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int t = 0; t < nt; t++) {
            int64_t lo = t * chunk, hi = lo + chunk < len ? lo + chunk : len;
            if (lo < hi)
                run_row(op, a + lo * sa1, sa1, b + lo * sb1, sb1, out + lo, hi - lo);
        }
        return DT_OK;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, oa = 0, ob = 0;
        for (int d = n - 2; d >= 0; d--) {
            int64_t idx = rem % os[d];
            rem /= os[d];
            oa += idx * sa[d];
            ob += idx * sb[d];
        }
        run_row(op, a + oa, sa1, b + ob, sb1, out + r * len, len);
    }
    return DT_OK;
}

/* Mixed f32 + bf16/f16 sums, block by block through a stack buffer (the
 * widening is dt_k_convert's, exact): the same bits as widening first. */
enum { LP_ADD_BLK = 2048 };

static bool add_lp_dtype(dt_dtype t) { return t == DT_BF16 || t == DT_F16; }

#if DT__X86_VEC
/* bf16 on the avx512 paths, widened and rounded in registers (dt__bf16_*16:
 * the bits of dt_k_convert) with the same f32 operation; the tail goes
 * through the blocks' code. */
DT__AVX512 static int64_t add2_bf16_avx512(const uint16_t *a, const uint16_t *b, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        dt__bf16_store16(y + i, dt__bf16_round16(_mm512_add_ps(dt__bf16_load16(a + i), dt__bf16_load16(b + i))));
    return i;
}

DT__AVX512 static int64_t grad_round_bf16_avx512(const float *g, float *y, uint16_t *h, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 r = dt__bf16_round16(_mm512_add_ps(_mm512_setzero_ps(), _mm512_loadu_ps(g + i)));
        if (y)
            _mm512_storeu_ps(y + i, r);
        if (h)
            dt__bf16_store16(h + i, r);
    }
    return i;
}
#endif

dt_status dt_k_add_lp(dt_dtype t, const float *a, const void *b, bool b_first, float *y, int64_t n)
{
    const char *fn = "dt_k_add_lp";
    if (!add_lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "%s: dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, a, n);
    DT__CHECK_PTR(fn, b, n);
    DT__CHECK_PTR(fn, y, n);
    const int64_t nb = (n + LP_ADD_BLK - 1) / LP_ADD_BLK;
    int nt = dt__threads_for(n), bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t k = 0; k < nb; k++) {
        float v[LP_ADD_BLK];
        int64_t lo = k * LP_ADD_BLK, c = n - lo < LP_ADD_BLK ? n - lo : LP_ADD_BLK;
        bad |= dt_k_convert((const uint16_t *)b + lo, t, v, DT_F32, c) < 0;
        const float *al = a + lo;
        float *yl = y + lo;
        if (b_first) {
#pragma omp simd
            for (int64_t i = 0; i < c; i++)
                yl[i] = v[i] + al[i];
        } else {
#pragma omp simd
            for (int64_t i = 0; i < c; i++)
                yl[i] = al[i] + v[i];
        }
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", fn) : DT_OK;
}

dt_status dt_k_add2_lp(dt_dtype t, const void *a, const void *b, void *y, int64_t n)
{
    const char *fn = "dt_k_add2_lp";
    if (!add_lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "%s: dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, a, n);
    DT__CHECK_PTR(fn, b, n);
    DT__CHECK_PTR(fn, y, n);
    const int64_t nb = (n + LP_ADD_BLK - 1) / LP_ADD_BLK;
    int nt = dt__threads_for(n * 2), bad = 0;
    const bool v16 = t == DT_BF16 && dt__vec_level() >= DT__VEC_AVX512;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t k = 0; k < nb; k++) {
        float va[LP_ADD_BLK], vb[LP_ADD_BLK];
        int64_t lo = k * LP_ADD_BLK, c = n - lo < LP_ADD_BLK ? n - lo : LP_ADD_BLK;
#if DT__X86_VEC
        if (v16) {
            int64_t d = add2_bf16_avx512((const uint16_t *)a + lo, (const uint16_t *)b + lo, (uint16_t *)y + lo, c);
            lo += d, c -= d;
            if (!c)
                continue;
        }
#else
        (void)v16;
#endif
        bad |= dt_k_convert((const uint16_t *)a + lo, t, va, DT_F32, c) < 0 ||
               dt_k_convert((const uint16_t *)b + lo, t, vb, DT_F32, c) < 0;
#pragma omp simd
        for (int64_t i = 0; i < c; i++)
            va[i] = va[i] + vb[i];
        bad |= dt_k_convert(va, DT_F32, (uint16_t *)y + lo, t, c) < 0;
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", fn) : DT_OK;
}

dt_status dt_k_grad_round_lp(dt_dtype t, const float *g, float *y, void *ylp, int64_t n)
{
    const char *fn = "dt_k_grad_round_lp";
    if (!add_lp_dtype(t))
        return dt_error(DT_ERR_DTYPE, "%s: dtype %s; want bf16 or f16", fn, dt_dtype_name(t));
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    if (!ylp)
        DT__CHECK_PTR(fn, y, n);
    const int64_t nb = (n + LP_ADD_BLK - 1) / LP_ADD_BLK;
    int nt = dt__threads_for(n), bad = 0;
    const bool v16 = t == DT_BF16 && dt__vec_level() >= DT__VEC_AVX512;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t k = 0; k < nb; k++) {
        float v[LP_ADD_BLK];
        uint16_t hb[LP_ADD_BLK];
        int64_t lo = k * LP_ADD_BLK, c = n - lo < LP_ADD_BLK ? n - lo : LP_ADD_BLK;
#if DT__X86_VEC
        if (v16) {
            int64_t d = grad_round_bf16_avx512(g + lo, y ? y + lo : NULL, ylp ? (uint16_t *)ylp + lo : NULL, c);
            lo += d, c -= d;
            if (!c)
                continue;
        }
#else
        (void)v16;
#endif
        const float *gl = g + lo;
        uint16_t *h = ylp ? (uint16_t *)ylp + lo : hb;
#pragma omp simd
        for (int64_t i = 0; i < c; i++)
            v[i] = 0.0f + gl[i]; /* as a zeroed buffer accumulating g: -0 becomes +0 */
        bad |= dt_k_convert(v, DT_F32, h, t, c) < 0 || (y && dt_k_convert(h, t, y + lo, DT_F32, c) < 0);
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", fn) : DT_OK;
}

dt_status dt_k_reduce_to_shape(const float *g, const int64_t *gshape, int ng, float *out, const int64_t *oshape,
                               int no)
{
    const char *fn = "dt_k_reduce_to_shape";
    dt_status st;
    if ((st = check_shape(fn, "gradient", gshape, ng)) < 0 || (st = check_shape(fn, "target", oshape, no)) < 0)
        return st;
    if (no > ng)
        return dt_error(DT_ERR_SHAPE, "%s: target has more dims (%d) than the gradient (%d)", fn, no, ng);
    for (int i = 0; i < no; i++) {
        int64_t d = oshape[i], gd = gshape[i + ng - no];
        if (d != gd && d != 1) {
            char s1[128], s2[128];
            fmt_shape(s1, sizeof s1, oshape, no);
            fmt_shape(s2, sizeof s2, gshape, ng);
            return dt_error(DT_ERR_SHAPE, "%s: shape %s does not broadcast to %s", fn, s1, s2);
        }
    }
    int64_t on = numel(oshape, no), gn = numel(gshape, ng);
    DT__CHECK_PTR(fn, out, on);
    DT__CHECK_PTR(fn, g, gn);
    if (on == 0)
        return DT_OK;
    memset(out, 0, (size_t)on * sizeof(float));
    if (gn == 0)
        return DT_OK;
    int64_t so[MAXD];
    bcast_strides(oshape, no, gshape, ng, so);
    int64_t len = ng ? gshape[ng - 1] : 1, s1 = ng ? so[ng - 1] : 0;
    int64_t rows = gn / len;
    /* Rows are added in index order: a fixed summation order. When the last
     * dim is kept (s1 == 1, e.g. a bias gradient) threads split the columns
     * of each row, so every output element still sums in row order whatever
     * the thread count; a reduced last dim is a serial row sum. */
    int nt = s1 == 1 && len >= 512 ? dt__threads_for(gn) : 1;
    int64_t cb = (len + nt - 1) / nt;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int t = 0; t < nt; t++) {
        int64_t j0 = t * cb, j1 = j0 + cb < len ? j0 + cb : len;
        for (int64_t r = 0; r < rows; r++) {
            int64_t rem = r, oo = 0;
            for (int d = ng - 2; d >= 0; d--) {
                oo += (rem % gshape[d]) * so[d];
                rem /= gshape[d];
            }
            const float *restrict gr = g + r * len;
            float *restrict orow = out + oo;
            if (s1 == 1) {
#pragma omp simd
                for (int64_t j = j0; j < j1; j++)
                    orow[j] += gr[j];
            } else {
                float acc = orow[0];
                for (int64_t j = 0; j < len; j++)
                    acc += gr[j];
                orow[0] = acc;
            }
        }
    }
    return DT_OK;
}

/* ---- unary -------------------------------------------------------------------------- */
static inline float unop(dt_k_unop op, float x)
{
    switch (op) {
    case DT_K_NEG: return -x;
    case DT_K_EXP: return expf(x);
    case DT_K_LOG: return logf(x);
    case DT_K_SQRT: return sqrtf(x);
    case DT_K_RSQRT: return 1.0f / sqrtf(x);
    case DT_K_ABS: return fabsf(x);
    case DT_K_SQUARE: return x * x;
    case DT_K_RECIP: return 1.0f / x;
    case DT_K_TANH: return tanhf(x);
    case DT_K_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case DT_K_SIN: return sinf(x);
    case DT_K_COS: return cosf(x);
    default: return 0.0f;
    }
}

dt_status dt_k_unary(dt_k_unop op, const float *x, float *y, int64_t n)
{
    const char *fn = "dt_k_unary";
    if ((unsigned)op >= DT_K_UNOP_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        y[i] = unop(op, x[i]);
    return DT_OK;
}

static inline float unop_grad(dt_k_unop op, float x, float y)
{
    switch (op) {
    case DT_K_NEG: return -1.0f;
    case DT_K_EXP: return y;
    case DT_K_LOG: return 1.0f / x;
    case DT_K_SQRT: return 0.5f / y;
    case DT_K_RSQRT: return -0.5f * y * y * y;
    case DT_K_ABS: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    case DT_K_SQUARE: return 2.0f * x;
    case DT_K_RECIP: return -y * y;
    case DT_K_TANH: return 1.0f - y * y;
    case DT_K_SIGMOID: return y * (1.0f - y);
    case DT_K_SIN: return cosf(x);
    case DT_K_COS: return -sinf(x);
    default: return 0.0f;
    }
}

dt_status dt_k_unary_bwd(dt_k_unop op, const float *x, const float *y, const float *dy, float *dx, int64_t n)
{
    const char *fn = "dt_k_unary_bwd";
    if ((unsigned)op >= DT_K_UNOP_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "%s: unknown op %d", fn, (int)op);
    DT__CHECK_N(fn, n);
    bool uses_y = op == DT_K_EXP || op == DT_K_SQRT || op == DT_K_RSQRT || op == DT_K_RECIP || op == DT_K_TANH ||
                  op == DT_K_SIGMOID;
    bool uses_x = !uses_y && op != DT_K_NEG;
    if (uses_y)
        DT__CHECK_PTR(fn, y, n);
    if (uses_x)
        DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, dy, n);
    DT__CHECK_PTR(fn, dx, n);
    int nt = dt__threads_for(n * 4);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++)
        dx[i] = dy[i] * unop_grad(op, uses_x ? x[i] : 0.0f, uses_y ? y[i] : 0.0f);
    return DT_OK;
}

/* ---- strided copy ------------------------------------------------------------------------ */
dt_status dt_k_copy_strided(const void *src, size_t es, int ndim, const int64_t *shape, const int64_t *strides,
                            void *dst)
{
    const char *fn = "dt_k_copy_strided";
    dt_status st = check_shape(fn, "src", shape, ndim);
    if (st < 0)
        return st;
    if (es != 1 && es != 2 && es != 4 && es != 8)
        return dt_error(DT_ERR_INVALID_ARG, "%s: element size %zu (1, 2, 4 or 8)", fn, es);
    if (ndim > 0 && !strides)
        return dt_error(DT_ERR_NULL, "%s: strides is NULL", fn);
    int64_t total = numel(shape, ndim);
    if (total == 0)
        return DT_OK;
    DT__CHECK_PTR(fn, src, total);
    DT__CHECK_PTR(fn, dst, total);
    int64_t len = ndim ? shape[ndim - 1] : 1, s1 = ndim ? strides[ndim - 1] : 0;
    int64_t rows = total / len;
    int nt = dt__threads_for(total);
    const char *s = src;
    char *d = dst;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, off = 0;
        for (int k = ndim - 2; k >= 0; k--) {
            off += (rem % shape[k]) * strides[k];
            rem /= shape[k];
        }
        const char *sr = s + off * (int64_t)es;
        char *dr = d + r * len * (int64_t)es;
        if (s1 == 1) {
            memcpy(dr, sr, (size_t)len * es);
            continue;
        }
        switch (es) {
        case 1: for (int64_t j = 0; j < len; j++) dr[j] = sr[j * s1]; break;
        case 2: for (int64_t j = 0; j < len; j++) memcpy(dr + 2 * j, sr + 2 * j * s1, 2); break;
        case 4: for (int64_t j = 0; j < len; j++) memcpy(dr + 4 * j, sr + 4 * j * s1, 4); break;
        default: for (int64_t j = 0; j < len; j++) memcpy(dr + 8 * j, sr + 8 * j * s1, 8); break;
        }
    }
    return DT_OK;
}
