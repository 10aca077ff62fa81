/* The element-wise pieces of a Llama-family block: rotary position
 * embeddings (rotate-half layout) and SwiGLU, forward and backward, and the
 * low-precision backward of grouped-query packing (RMSNorm: rmsnorm.c).
 *
 * RoPE takes precomputed cos/sin tables (T, rot/2): the caller computes the
 * angles (position x inverse frequency) in f32 as transformers does. The
 * first rot of every head's hd values rotate (pairs (j, j + rot/2)), the
 * rest pass unchanged (Phi's partial rotary factor; rot == hd: all). The
 * backward of a rotation is the rotation by the opposite angle. */
#include "kernels_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The rotation of n pairs (a_j, b_j) by the angles of c, s (sgn -1: the
 * inverse), into (ya_j, yb_j); the outputs may alias the inputs. */
__attribute__((noinline)) static void rope_pairs(const float *a, const float *b, const float *c, const float *s, float sgn, int64_t n,
                       float *ya, float *yb)
{
    for (int64_t j = 0; j < n; j++) {
        float aj = a[j], bj = b[j], sn = sgn * s[j];
        ya[j] = aj * c[j] - bj * sn;
        yb[j] = bj * c[j] + aj * sn;
    }
}

/* The head size and rotary width checks every RoPE kernel makes. */
static dt_status rope_dims(const char *fn, int64_t hd, int64_t rot)
{
    if (hd % 2)
        return dt_error(DT_ERR_INVALID_ARG, "%s: head size %lld is odd (pairs (j, j + hd/2) need it even)", fn,
                        (long long)hd);
    if (rot < 2 || rot > hd || rot % 2)
        return dt_error(DT_ERR_INVALID_ARG, "%s: rotary width %lld is not an even number in [2, %lld] (the head "
                        "size)", fn, (long long)rot, (long long)hd);
    return DT_OK;
}

dt_status dt_k_rope(const float *x, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t rot, const float *cos_t,
                    const float *sin_t, bool inverse, float *y)
{
    const char *fn = "dt_k_rope";
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, T);
    DT__CHECK_N(fn, H);
    DT__CHECK_N(fn, hd);
    dt_status st = rope_dims(fn, hd, rot);
    if (st < 0)
        return st;
    int64_t n = B * T * H * hd, half = rot / 2;
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, y, n);
    DT__CHECK_PTR(fn, cos_t, T * half);
    DT__CHECK_PTR(fn, sin_t, T * half);
    const float sgn = inverse ? -1.0f : 1.0f;
    int nt = dt__threads_for(n * 2);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const float *c = cos_t + (bt % T) * half, *s = sin_t + (bt % T) * half;
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (bt * H + h) * hd;
            float *yr = y + (bt * H + h) * hd;
            rope_pairs(xr, xr + half, c, s, sgn, half, yr, yr + half);
            if (rot < hd && yr != xr) /* the values past the rotary width pass */
                memcpy(yr + rot, xr + rot, (size_t)(hd - rot) * sizeof(float));
        }
    }
    return DT_OK;
}

/* ---- RoPE on low-precision data -------------------------------------------------
 * One pass reads t, rotates in f32 with rope_pairs (the same operations as
 * dt_k_rope) and writes the result rounded once: the bits of widening,
 * dt_k_rope and rounding, without the two cast passes and the f32 copies.
 * A row of up to RP_ROW elements is converted at once; wider rows go head
 * by head, a head's pairs in chunks of RP_BLK through stack buffers, so any
 * head size works. */
enum { RP_BLK = 512, RP_ROW = 4096 };

/* x[0, n) rounded to t values in place, RP_BLK at a time through h16 */
static void round_row(float *x, dt_dtype t, int64_t n, uint16_t *h16)
{
    for (int64_t i = 0; i < n; i += RP_BLK) {
        const int64_t c = n - i < RP_BLK ? n - i : RP_BLK;
        dt_k_convert(x + i, DT_F32, h16, t, c);
        dt_k_convert(h16, t, x + i, DT_F32, c);
    }
}

#if DT__X86_VEC
/* One row of H heads (half % 16 == 0) as rope_lp_rows's one-pass branch
 * does it, for bf16 on the avx512 paths, widening and rounding in
 * registers: rope_pairs's operations in its order on 16 pairs at a time. A
 * group with a NaN input goes through rope_pairs itself (which operand of
 * the commutative add carries a NaN is the compiler's choice). */
DT__AVX512 static void rope_row_bf16_avx512(const void *x, bool x_f32, int64_t H, int64_t hd, int64_t rot,
                                            const float *c, const float *s, float sgn, uint16_t *y_lp, float *y_f32)
{
    const int64_t half = rot / 2;
    const __m512 sv = _mm512_set1_ps(sgn);
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < half; j += 16) {
            const int64_t ia = h * hd + j, ib = ia + half;
            __m512 a, b;
            if (x_f32)
                a = dt__bf16_round16(_mm512_loadu_ps((const float *)x + ia)),
                b = dt__bf16_round16(_mm512_loadu_ps((const float *)x + ib));
            else
                a = dt__bf16_load16((const uint16_t *)x + ia), b = dt__bf16_load16((const uint16_t *)x + ib);
            __m512 ya, yb;
            if (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q)) {
                float af[16], bf[16];
                _mm512_storeu_ps(af, a);
                _mm512_storeu_ps(bf, b);
                rope_pairs(af, bf, c + j, s + j, sgn, 16, af, bf);
                ya = _mm512_loadu_ps(af), yb = _mm512_loadu_ps(bf);
            } else {
                __m512 cv = _mm512_loadu_ps(c + j), sn = _mm512_mul_ps(sv, _mm512_loadu_ps(s + j));
                ya = _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sn));
                yb = _mm512_add_ps(_mm512_mul_ps(b, cv), _mm512_mul_ps(a, sn));
            }
            ya = dt__bf16_round16(ya), yb = dt__bf16_round16(yb);
            if (y_lp)
                dt__bf16_store16(y_lp + ia, ya), dt__bf16_store16(y_lp + ib, yb);
            if (y_f32)
                _mm512_storeu_ps(y_f32 + ia, ya), _mm512_storeu_ps(y_f32 + ib, yb);
        }
}
#endif

/* Elements [i, i + m) of x passed to y unrotated (past the rotary width):
 * as t, rounded once when x holds f32 (m <= RP_BLK). */
static void pass_lp(const void *x, bool x_f32, dt_dtype t, int64_t i, int64_t m, void *y_lp, float *y_f32,
                    uint16_t *h16)
{
    const uint16_t *v = (const uint16_t *)x + i;
    if (x_f32) {
        dt_k_convert((const float *)x + i, DT_F32, h16, t, m);
        v = h16;
    }
    if (y_lp && (const void *)((uint16_t *)y_lp + i) != (const void *)v)
        memmove((uint16_t *)y_lp + i, v, (size_t)m * sizeof(uint16_t));
    if (y_f32)
        dt_k_convert(y_lp ? (const uint16_t *)y_lp + i : v, t, y_f32 + i, DT_F32, m);
}

/* x (t values, or f32 when x_f32: a gradient, rounded to t first) rotated
 * by sgn times the angles, rounded to t and stored as t (y_lp) and/or as
 * f32 holding t values (y_f32; with both, widened from y_lp). */
static void rope_lp_rows(const void *x, bool x_f32, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd,
                         int64_t rot, const float *cos_t, const float *sin_t, float sgn, void *y_lp, float *y_f32)
{
    const int64_t half = rot / 2;
    int nt = dt__threads_for(B * T * H * hd * 4);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bt = 0; bt < B * T; bt++) {
        float a[RP_BLK], b[RP_BLK], ya[RP_BLK], yb[RP_BLK], row[RP_ROW];
        uint16_t h16[RP_BLK];
        const float *c = cos_t + (bt % T) * half, *s = sin_t + (bt % T) * half;
        if (H * hd <= RP_ROW) { /* the row in one conversion each way */
            const int64_t o = bt * H * hd, m = H * hd;
#if DT__X86_VEC
            if (t == DT_BF16 && rot == hd && half % 16 == 0 && dt__vec_level() == DT__VEC_AVX512) {
                rope_row_bf16_avx512(x_f32 ? (const void *)((const float *)x + o) : (const uint16_t *)x + o, x_f32,
                                     H, hd, rot, c, s, sgn, y_lp ? (uint16_t *)y_lp + o : NULL,
                                     y_f32 ? y_f32 + o : NULL);
                continue;
            }
#endif
            if (x_f32) {
                memcpy(row, (const float *)x + o, (size_t)m * sizeof(float));
                round_row(row, t, m, h16);
            } else
                dt_k_convert((const uint16_t *)x + o, t, row, DT_F32, m);
            for (int64_t h = 0; h < H; h++)
                rope_pairs(row + h * hd, row + h * hd + half, c, s, sgn, half, row + h * hd, row + h * hd + half);
            if (y_lp) {
                dt_k_convert(row, DT_F32, (uint16_t *)y_lp + o, t, m);
                if (y_f32)
                    dt_k_convert((const uint16_t *)y_lp + o, t, y_f32 + o, DT_F32, m);
            } else {
                memcpy(y_f32 + o, row, (size_t)m * sizeof(float));
                round_row(y_f32 + o, t, m, h16);
            }
            continue;
        }
        for (int64_t h = 0; h < H; h++) {
            const int64_t o = (bt * H + h) * hd;
            for (int64_t j0 = 0; j0 < half; j0 += RP_BLK) {
                const int64_t m = half - j0 < RP_BLK ? half - j0 : RP_BLK, ia = o + j0, ib = o + half + j0;
                if (x_f32) { /* a gradient: rounded to t first (it belongs to a t result) */
                    dt_k_convert((const float *)x + ia, DT_F32, h16, t, m);
                    dt_k_convert(h16, t, a, DT_F32, m);
                    dt_k_convert((const float *)x + ib, DT_F32, h16, t, m);
                    dt_k_convert(h16, t, b, DT_F32, m);
                } else {
                    dt_k_convert((const uint16_t *)x + ia, t, a, DT_F32, m);
                    dt_k_convert((const uint16_t *)x + ib, t, b, DT_F32, m);
                }
                rope_pairs(a, b, c + j0, s + j0, sgn, m, ya, yb);
                if (y_lp) {
                    dt_k_convert(ya, DT_F32, (uint16_t *)y_lp + ia, t, m);
                    dt_k_convert(yb, DT_F32, (uint16_t *)y_lp + ib, t, m);
                    if (y_f32) {
                        dt_k_convert((const uint16_t *)y_lp + ia, t, y_f32 + ia, DT_F32, m);
                        dt_k_convert((const uint16_t *)y_lp + ib, t, y_f32 + ib, DT_F32, m);
                    }
                } else {
                    dt_k_convert(ya, DT_F32, h16, t, m);
                    dt_k_convert(h16, t, y_f32 + ia, DT_F32, m);
                    dt_k_convert(yb, DT_F32, h16, t, m);
                    dt_k_convert(h16, t, y_f32 + ib, DT_F32, m);
                }
            }
            for (int64_t i = rot; i < hd; i += RP_BLK)
                pass_lp(x, x_f32, t, o + i, hd - i < RP_BLK ? hd - i : RP_BLK, y_lp, y_f32, h16);
        }
    }
}

static dt_status rope_lp_args(const char *fn, const void *x, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd,
                              int64_t rot, const float *cos_t, const float *sin_t, const void *y)
{
    DT__CHECK_N(fn, B);
    DT__CHECK_N(fn, T);
    DT__CHECK_N(fn, H);
    DT__CHECK_N(fn, hd);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    dt_status st = rope_dims(fn, hd, rot);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, x, B * T * H * hd);
    DT__CHECK_PTR(fn, y, B * T * H * hd);
    DT__CHECK_PTR(fn, cos_t, T * (rot / 2));
    DT__CHECK_PTR(fn, sin_t, T * (rot / 2));
    return DT_OK;
}

dt_status dt_k_rope_lp(const void *x, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t rot,
                       const float *cos_t, const float *sin_t, void *y)
{
    dt_status st = rope_lp_args("dt_k_rope_lp", x, t, B, T, H, hd, rot, cos_t, sin_t, y);
    if (st >= 0)
        rope_lp_rows(x, false, t, B, T, H, hd, rot, cos_t, sin_t, 1.0f, y, NULL);
    return st;
}

dt_status dt_k_rope_bwd_lp(const float *dy, dt_dtype t, int64_t B, int64_t T, int64_t H, int64_t hd, int64_t rot,
                           const float *cos_t, const float *sin_t, float *dx, void *dx_lp)
{
    dt_status st = rope_lp_args("dt_k_rope_bwd_lp", dy, t, B, T, H, hd, rot, cos_t, sin_t, dx);
    if (st >= 0)
        rope_lp_rows(dy, true, t, B, T, H, hd, rot, cos_t, sin_t, -1.0f, dx_lp, dx);
    return st;
}

/* ---- SwiGLU: y = silu(g) u, silu(g) = g / (1 + e^-g) ----------------------------
 * The row loops: scalar with dt__expf, and 8 / 16 lanes with dt__expf8 /
 * dt__expf16 doing the same operations in the same order (the build does
 * not contract FMAs), so every path gives the same bits. */
static void swiglu_fwd_rows(const float *g, const float *u, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + dt__expf(-g[i]));
        y[i] = g[i] * sg * u[i];
    }
}

/* dg = dy u sg (1 + g (1 - sg)), du = dy g sg (either may be NULL) */
static void swiglu_bwd_rows(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du)
{
    for (int64_t i = 0; i < n; i++) {
        float sg = 1.0f / (1.0f + dt__expf(-g[i])), silu = g[i] * sg;
        if (dg)
            dg[i] = dy[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
        if (du)
            du[i] = dy[i] * silu;
    }
}

#if DT__X86_VEC
DT__AVX2 static __m256 sigmoid8(__m256 g)
{
    __m256 ng = _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(g), _mm256_set1_epi32((int)0x80000000u)));
    return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), dt__expf8(ng)));
}

DT__AVX2 static void swiglu_fwd_avx2(const float *g, const float *u, int64_t n, float *y)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 sg = sigmoid8(gv);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(gv, sg), _mm256_loadu_ps(u + i)));
    }
    swiglu_fwd_rows(g + i, u + i, n - i, y + i);
}

DT__AVX2 static void swiglu_bwd_avx2(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), d = _mm256_loadu_ps(dy + i), sg = sigmoid8(gv);
        if (dg) {
            __m256 a = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(u + i)), sg);
            __m256 b = _mm256_add_ps(one, _mm256_mul_ps(gv, _mm256_sub_ps(one, sg)));
            _mm256_storeu_ps(dg + i, _mm256_mul_ps(a, b));
        }
        if (du)
            _mm256_storeu_ps(du + i, _mm256_mul_ps(d, _mm256_mul_ps(gv, sg)));
    }
    swiglu_bwd_rows(g + i, u + i, dy + i, n - i, dg ? dg + i : NULL, du ? du + i : NULL);
}

DT__AVX512 static __m512 sigmoid16(__m512 g)
{
    __m512 ng = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), _mm512_set1_epi32((int)0x80000000u)));
    return _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(_mm512_set1_ps(1.0f), dt__expf16(ng)));
}

DT__AVX512 __attribute__((noinline)) static void swiglu_fwd_avx512(const float *g, const float *u, int64_t n, float *y)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 sg = sigmoid16(gv);
        _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(gv, sg), _mm512_loadu_ps(u + i)));
    }
    swiglu_fwd_avx2(g + i, u + i, n - i, y + i);
}

DT__AVX512 __attribute__((noinline)) static void swiglu_bwd_avx512(const float *g, const float *u, const float *dy,
                                                                 int64_t n, float *dg, float *du)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i), d = _mm512_loadu_ps(dy + i), sg = sigmoid16(gv);
        if (dg) {
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_loadu_ps(u + i)), sg);
            __m512 b = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sg)));
            _mm512_storeu_ps(dg + i, _mm512_mul_ps(a, b));
        }
        if (du)
            _mm512_storeu_ps(du + i, _mm512_mul_ps(d, _mm512_mul_ps(gv, sg)));
    }
    swiglu_bwd_avx2(g + i, u + i, dy + i, n - i, dg ? dg + i : NULL, du ? du + i : NULL);
}
#endif

static void swiglu_fwd_any(const float *g, const float *u, int64_t n, float *y)
{
#if DT__X86_VEC
    int v = dt__vec_level();
    if (v == DT__VEC_AVX512) {
        swiglu_fwd_avx512(g, u, n, y);
        return;
    }
    if (v == DT__VEC_AVX2) {
        swiglu_fwd_avx2(g, u, n, y);
        return;
    }
#endif
    swiglu_fwd_rows(g, u, n, y);
}

static void swiglu_bwd_any(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du)
{
#if DT__X86_VEC
    int v = dt__vec_level();
    if (v == DT__VEC_AVX512) {
        swiglu_bwd_avx512(g, u, dy, n, dg, du);
        return;
    }
    if (v == DT__VEC_AVX2) {
        swiglu_bwd_avx2(g, u, dy, n, dg, du);
        return;
    }
#endif
    swiglu_bwd_rows(g, u, dy, n, dg, du);
}

enum { SW_BLK = 2048 }; /* elements per work item (in cache) */

dt_status dt_k_swiglu_fwd(const float *g, const float *u, int64_t n, float *y)
{
    const char *fn = "dt_k_swiglu_fwd";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, y, n);
    const int64_t nb = (n + SW_BLK - 1) / SW_BLK;
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i = b * SW_BLK, c = n - i < SW_BLK ? n - i : SW_BLK;
        swiglu_fwd_any(g + i, u + i, c, y + i);
    }
    return DT_OK;
}

dt_status dt_k_swiglu_bwd(const float *g, const float *u, const float *dy, int64_t n, float *dg, float *du)
{
    const char *fn = "dt_k_swiglu_bwd";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, dy, n);
    const int64_t nb = (n + SW_BLK - 1) / SW_BLK;
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i = b * SW_BLK, c = n - i < SW_BLK ? n - i : SW_BLK;
        swiglu_bwd_any(g + i, u + i, dy + i, c, dg ? dg + i : NULL, du ? du + i : NULL);
    }
    return DT_OK;
}

#if DT__X86_VEC
/* ---- bf16 SwiGLU on the avx512 paths: widening and rounding in registers ----------
 * The same bits as the block path below (widen with dt_k_convert, the f32
 * row loop, round with dt_k_convert): the conversions of bf16_load16 /
 * bf16_round16 and swiglu_*_avx512's arithmetic, operation for operation. A NaN
 * input's sign and payload reach the result through whichever operand of
 * a commutative multiply the compiler put first, so a group of 16 with a
 * NaN input goes through swiglu_*_avx512 itself (kept out of line: one
 * compiled body decides those bits for both routes). Each returns how many
 * leading elements it did (a multiple of 16). */
DT__AVX512 static int64_t swiglu_fwd_bf16_avx512(const uint16_t *g, const uint16_t *u, int64_t n, uint16_t *y)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = dt__bf16_load16(g + i), uv = dt__bf16_load16(u + i);
        if (_mm512_cmp_ps_mask(gv, uv, _CMP_UNORD_Q)) {
            float gf[16], uf[16];
            _mm512_storeu_ps(gf, gv);
            _mm512_storeu_ps(uf, uv);
            swiglu_fwd_avx512(gf, uf, 16, gf);
            dt__bf16_store16(y + i, dt__bf16_round16(_mm512_loadu_ps(gf)));
            continue;
        }
        __m512 sg = sigmoid16(gv);
        dt__bf16_store16(y + i, dt__bf16_round16(_mm512_mul_ps(_mm512_mul_ps(gv, sg), uv)));
    }
    return i;
}

DT__AVX512 static int64_t swiglu_bwd_bf16_avx512(const uint16_t *g, const uint16_t *u, const float *dy, int64_t n,
                                                 float *dg, float *du, uint16_t *dg_lp, uint16_t *du_lp)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gv = dt__bf16_load16(g + i), uv = dt__bf16_load16(u + i), d = dt__bf16_round16(_mm512_loadu_ps(dy + i));
        if (_mm512_cmp_ps_mask(gv, uv, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(d, d, _CMP_UNORD_Q)) {
            float gf[16], uf[16], df[16], a[16], b[16];
            _mm512_storeu_ps(gf, gv);
            _mm512_storeu_ps(uf, uv);
            _mm512_storeu_ps(df, d);
            swiglu_bwd_avx512(gf, uf, df, 16, dg ? a : NULL, du ? b : NULL);
            if (dg) {
                __m512 r = dt__bf16_round16(_mm512_loadu_ps(a));
                _mm512_storeu_ps(dg + i, r);
                if (dg_lp)
                    dt__bf16_store16(dg_lp + i, r);
            }
            if (du) {
                __m512 r = dt__bf16_round16(_mm512_loadu_ps(b));
                _mm512_storeu_ps(du + i, r);
                if (du_lp)
                    dt__bf16_store16(du_lp + i, r);
            }
            continue;
        }
        __m512 sg = sigmoid16(gv);
        if (dg) {
            __m512 a = _mm512_mul_ps(_mm512_mul_ps(d, uv), sg);
            __m512 b = _mm512_add_ps(one, _mm512_mul_ps(gv, _mm512_sub_ps(one, sg)));
            __m512 r = dt__bf16_round16(_mm512_mul_ps(a, b));
            _mm512_storeu_ps(dg + i, r);
            if (dg_lp)
                dt__bf16_store16(dg_lp + i, r);
        }
        if (du) {
            __m512 r = dt__bf16_round16(_mm512_mul_ps(d, _mm512_mul_ps(gv, sg)));
            _mm512_storeu_ps(du + i, r);
            if (du_lp)
                dt__bf16_store16(du_lp + i, r);
        }
    }
    return i;
}
#endif

/* x[0, c) rounded to dtype t in place (f32 -> t -> f32), the t values
 * also kept at lp when it is not NULL. */
static void round_block(float *x, dt_dtype t, int64_t c, uint16_t *lp)
{
    uint16_t hb[SW_BLK], *h = lp ? lp : hb;
    dt_k_convert(x, DT_F32, h, t, c);
    dt_k_convert(h, t, x, DT_F32, c);
}

dt_status dt_k_swiglu_fwd_lp(const void *g, const void *u, dt_dtype t, int64_t n, void *y)
{
    const char *fn = "dt_k_swiglu_fwd_lp";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, y, n);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    const int64_t nb = (n + SW_BLK - 1) / SW_BLK;
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        float gf[SW_BLK], uf[SW_BLK];
        int64_t i = b * SW_BLK, c = n - i < SW_BLK ? n - i : SW_BLK;
#if DT__X86_VEC
        if (t == DT_BF16 && dt__vec_level() == DT__VEC_AVX512) { /* whole vectors in registers */
            const int64_t v = swiglu_fwd_bf16_avx512((const uint16_t *)g + i, (const uint16_t *)u + i, c,
                                                     (uint16_t *)y + i);
            i += v, c -= v;
            if (!c)
                continue;
        }
#endif
        dt_k_convert((const uint16_t *)g + i, t, gf, DT_F32, c);
        dt_k_convert((const uint16_t *)u + i, t, uf, DT_F32, c);
        swiglu_fwd_any(gf, uf, c, gf);
        dt_k_convert(gf, DT_F32, (uint16_t *)y + i, t, c);
    }
    return DT_OK;
}

dt_status dt_k_swiglu_bwd_lp(const void *g, const void *u, dt_dtype t, const float *dy, int64_t n, float *dg,
                             float *du, void *dg_lp, void *du_lp)
{
    const char *fn = "dt_k_swiglu_bwd_lp";
    DT__CHECK_N(fn, n);
    DT__CHECK_PTR(fn, g, n);
    DT__CHECK_PTR(fn, u, n);
    DT__CHECK_PTR(fn, dy, n);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    const int64_t nb = (n + SW_BLK - 1) / SW_BLK;
    int nt = dt__threads_for(n * 8);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t b = 0; b < nb; b++) {
        float gf[SW_BLK], uf[SW_BLK], d[SW_BLK];
        int64_t i = b * SW_BLK, c = n - i < SW_BLK ? n - i : SW_BLK;
#if DT__X86_VEC
        if (t == DT_BF16 && dt__vec_level() == DT__VEC_AVX512) { /* whole vectors in registers */
            const int64_t v = swiglu_bwd_bf16_avx512((const uint16_t *)g + i, (const uint16_t *)u + i, dy + i, c,
                                                     dg ? dg + i : NULL, du ? du + i : NULL,
                                                     dg && dg_lp ? (uint16_t *)dg_lp + i : NULL,
                                                     du && du_lp ? (uint16_t *)du_lp + i : NULL);
            i += v, c -= v;
            if (!c)
                continue;
        }
#endif
        dt_k_convert((const uint16_t *)g + i, t, gf, DT_F32, c);
        dt_k_convert((const uint16_t *)u + i, t, uf, DT_F32, c);
        memcpy(d, dy + i, (size_t)c * sizeof(float));
        round_block(d, t, c, NULL); /* the gradient of a t result holds t values */
        swiglu_bwd_any(gf, uf, d, c, dg ? dg + i : NULL, du ? du + i : NULL);
        if (dg)
            round_block(dg + i, t, c, dg_lp ? (uint16_t *)dg_lp + i : NULL);
        if (du)
            round_block(du + i, t, c, du_lp ? (uint16_t *)du_lp + i : NULL);
    }
    return DT_OK;
}

/* ---- grouped-query packing, backward on low-precision data -------------------------- */

/* y[0, n) = x rounded to t values (y may be x), also stored as t at lp when
 * it is not NULL: bf16 by dt__bf16_round (the bits of dt_f32_to_bf16),
 * f16 through dt_k_convert in RP_BLK pieces. */
#if DT__X86_VEC
/* round_to_t's bf16 case at 16 lanes; returns how many leading elements it
 * did (a multiple of 16) */
DT__AVX512 static int64_t round_bf16_avx512(const float *x, float *y, int64_t n, uint16_t *lp)
{
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 r = dt__bf16_round16(_mm512_loadu_ps(x + j));
        _mm512_storeu_ps(y + j, r);
        if (lp)
            dt__bf16_store16(lp + j, r);
    }
    return j;
}
#endif

static void round_to_t(const float *x, float *y, dt_dtype t, int64_t n, uint16_t *lp)
{
    if (t == DT_BF16) {
        int64_t j = 0;
#if DT__X86_VEC
        if (dt__vec_level() == DT__VEC_AVX512)
            j = round_bf16_avx512(x, y, n, lp);
#endif
        for (; j < n; j++) {
            float r = dt__bf16_round(x[j]);
            y[j] = r;
            if (lp) {
                uint32_t u;
                memcpy(&u, &r, sizeof u);
                lp[j] = (uint16_t)(u >> 16);
            }
        }
        return;
    }
    uint16_t h16[RP_BLK];
    for (int64_t i = 0; i < n; i += RP_BLK) {
        const int64_t c = n - i < RP_BLK ? n - i : RP_BLK;
        uint16_t *h = lp ? lp + i : h16;
        dt_k_convert(x + i, DT_F32, h, t, c);
        dt_k_convert(h, t, y + i, DT_F32, c);
    }
}

dt_status dt_k_gqa_pack_bwd_lp(const float *dqkv, dt_dtype t, int64_t rows, int64_t H, int64_t KV, int64_t hd,
                               float *dq, float *dk, float *dv, void *dk_lp, void *dv_lp)
{
    const char *fn = "dt_k_gqa_pack_bwd_lp";
    DT__CHECK_N(fn, rows);
    DT__CHECK_N(fn, H);
    DT__CHECK_N(fn, KV);
    DT__CHECK_N(fn, hd);
    if (t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: dtype %s (bf16 or f16)", fn, dt_dtype_name(t));
    if (KV < 1 || H % KV)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %lld kv heads must divide %lld heads", fn, (long long)KV,
                        (long long)H);
    const int64_t C = H * hd, Ck = KV * hd, rep = H / KV;
    DT__CHECK_PTR(fn, dqkv, rows * 3 * C);
    int nt = dt__threads_for(rows * 3 * C * 2);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t r = 0; r < rows; r++) {
        float cp[RP_BLK];
        const float *o = dqkv + r * 3 * C;
        if (dq)
            round_to_t(o, dq + r * C, t, C, NULL);
        for (int s = 1; s <= 2; s++) {
            float *d = s == 1 ? dk : dv;
            uint16_t *lp = s == 1 ? dk_lp : dv_lp;
            if (!d)
                continue;
            d += r * Ck;
            memset(d, 0, (size_t)Ck * sizeof(float));
            for (int64_t h = 0; h < H; h++) {
                const float *src = o + s * C + h * hd;
                float *dst = d + (h / rep) * hd;
                for (int64_t j0 = 0; j0 < hd; j0 += RP_BLK) {
                    const int64_t c = hd - j0 < RP_BLK ? hd - j0 : RP_BLK;
                    round_to_t(src + j0, cp, t, c, NULL);
                    for (int64_t j = 0; j < c; j++)
                        dst[j0 + j] += cp[j];
                }
            }
            round_to_t(d, d, t, Ck, lp ? lp + r * Ck : NULL);
        }
    }
    return DT_OK;
}
