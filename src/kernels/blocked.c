/* Plain-C kernels on the channel-blocked layouts nChw8c and nChw16c
 * ([N][C/B][HW][B], B = 8 or 16, C % B == 0): the conversions to and from
 * NCHW, training batch norm, max pooling, the C = 1 convolution backward
 * weights and the nChw8c one with 5 taps a row. They let the autograd
 * layer keep convolution activations in the layout oneDNN's direct kernels
 * use (nChw8c on AVX2, nChw16c on AVX-512: dt_k_act_block), so a ConvNet
 * step reorders only at its ends.
 *
 * Each kernel is written once for B lanes (an always-inline body with B a
 * parameter) and instantiated for B = 8 and B = 16, so the compiler sees a
 * constant lane count; the block size changes only which channels sit side
 * by side, never the order of any sum. Batch norm keeps the plain kernel's
 * reduction order per channel: each (n, c) row of HW values is summed in
 * float in s order (B channels side by side, one lane each), the row sums
 * in double in n order, so the result is deterministic and the same for
 * B = 8 and B = 16. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

/* Per-block row kernels (B channel lanes side by side), cloned for AVX2 as
 * the plain batch-norm rows are (DT_CLONES, kernels_impl.h). The bodies are
 * always inlined into the B = 8 and B = 16 clones. */
#define DT_BODY static inline __attribute__((always_inline))
#define MAXB 16
/* Eight lanes as a GCC vector: accumulators declared as these stay in
 * registers. */
typedef float blk_v8 __attribute__((vector_size(32)));

/* The two per-lane sums over HW rows (B values apart) that batch norm
 * takes, L lanes as 8-lane vectors held in registers, with d = x - k:
 * g NULL, the moments (sums of d and d^2, k the channel's first value);
 * else the backward's (sums of g and g d, k the mean). */
DT_BODY void sums2_body(const float *restrict xp, const float *restrict gp, int64_t HW, const float *restrict k,
                        float *restrict ra, float *restrict rb, const int L, const int B)
{
    enum { G = MAXB / 8 };
    blk_v8 a[G] = {{0}}, b[G] = {{0}}, kv[G];
    const int g8 = L / 8;
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++)
        memcpy(&kv[g], k + 8 * g, sizeof(blk_v8));
    for (int64_t s = 0; s < HW; s++)
#pragma GCC unroll 2
        for (int g = 0; g < g8; g++) {
            blk_v8 d;
            memcpy(&d, xp + s * B + 8 * g, sizeof d);
            d -= kv[g];
            if (gp) {
                blk_v8 gv;
                memcpy(&gv, gp + s * B + 8 * g, sizeof gv);
                a[g] += gv;
                b[g] += gv * d;
            } else {
                a[g] += d;
                b[g] += d * d;
            }
        }
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++) {
        memcpy(ra + 8 * g, &a[g], sizeof(blk_v8));
        memcpy(rb + 8 * g, &b[g], sizeof(blk_v8));
    }
}
DT_CLONES static void moments8(const float *restrict xp, int64_t HW, const float *restrict k, float *restrict r1,
                               float *restrict r2)
{
    sums2_body(xp, NULL, HW, k, r1, r2, 8, 8);
}
DT_CLONES static void moments16(const float *restrict xp, int64_t HW, const float *restrict k, float *restrict r1,
                                float *restrict r2)
{
    sums2_body(xp, NULL, HW, k, r1, r2, 16, 16);
}
DT_CLONES static void moments8s16(const float *restrict xp, int64_t HW, const float *restrict k, float *restrict r1,
                                  float *restrict r2)
{
    sums2_body(xp, NULL, HW, k, r1, r2, 8, 16);
}

DT_BODY void affine_body(const float *restrict xp, float *restrict yp, int64_t HW, const float *restrict m,
                         const float *restrict a, const float *restrict b, const int L, const int B)
{
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < L; j++)
            yp[s * B + j] = (xp[s * B + j] - m[j]) * a[j] + b[j];
    }
}
DT_CLONES static void affine8(const float *restrict xp, float *restrict yp, int64_t HW, const float *restrict m,
                              const float *restrict a, const float *restrict b)
{
    affine_body(xp, yp, HW, m, a, b, 8, 8);
}
DT_CLONES static void affine16(const float *restrict xp, float *restrict yp, int64_t HW, const float *restrict m,
                               const float *restrict a, const float *restrict b)
{
    affine_body(xp, yp, HW, m, a, b, 16, 16);
}

DT_CLONES static void bwd_sums8(const float *restrict xp, const float *restrict gp, int64_t HW,
                                const float *restrict m, float *restrict ra, float *restrict rb)
{
    sums2_body(xp, gp, HW, m, ra, rb, 8, 8);
}
DT_CLONES static void bwd_sums16(const float *restrict xp, const float *restrict gp, int64_t HW,
                                 const float *restrict m, float *restrict ra, float *restrict rb)
{
    sums2_body(xp, gp, HW, m, ra, rb, 16, 16);
}
DT_CLONES static void bwd_sums8s16(const float *restrict xp, const float *restrict gp, int64_t HW,
                                   const float *restrict m, float *restrict ra, float *restrict rb)
{
    sums2_body(xp, gp, HW, m, ra, rb, 8, 16);
}

DT_BODY void bwd_dx_body(const float *restrict xp, const float *restrict gp, float *restrict op, int64_t HW,
                         const float *restrict m, const float *restrict is, const float *restrict k,
                         const float *restrict mdy, const float *restrict mdyx, const int L, const int B)
{
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < L; j++) {
            float xh = (xp[s * B + j] - m[j]) * is[j];
            op[s * B + j] = k[j] * (gp[s * B + j] - mdy[j] - xh * mdyx[j]);
        }
    }
}
DT_CLONES static void bwd_dx8(const float *restrict xp, const float *restrict gp, float *restrict op, int64_t HW,
                              const float *restrict m, const float *restrict is, const float *restrict k,
                              const float *restrict mdy, const float *restrict mdyx)
{
    bwd_dx_body(xp, gp, op, HW, m, is, k, mdy, mdyx, 8, 8);
}
DT_CLONES static void bwd_dx16(const float *restrict xp, const float *restrict gp, float *restrict op, int64_t HW,
                               const float *restrict m, const float *restrict is, const float *restrict k,
                               const float *restrict mdy, const float *restrict mdyx)
{
    bwd_dx_body(xp, gp, op, HW, m, is, k, mdy, mdyx, 16, 16);
}

/* ---- batch norm, ReLU and 2 x 2 max pooling as one op ----------------------
 * The ConvNet block's tail: y = ReLU(max over each 2 x 2 window (stride 2) of
 * batch norm's output), as the pooled, rectified [N][C/B][P*Q][B] with
 * P = H / 2, Q = W / 2, and the window's argmax as the plain max pooling
 * writes it (h*W + w). Batch norm's own output and the gradient at it are
 * never stored: the forward pools each normalised value as it is made, the
 * backward makes the gradient at a position from the window's (its argmax,
 * the output's sign: ReLU's mask, and dy) where batch norm's passes read it.
 * Every value is computed by the same expressions in the same order as by
 * batch norm's, ReLU's and max pooling's kernels one after the other (the
 * gradient a window sends its argmax is 0 + dy there, as the pooling's
 * scatter into zeros makes it), so the results are the same bits. */
typedef int32_t blk_i8 __attribute__((vector_size(32)));

typedef struct {
    int64_t H, W, P, Q;
    const float *y;  /* backward: the op's output (ReLU's mask) */
    int32_t *argmax; /* forward: written; backward: read */
} bn_pool;

/* lanes of t (all ones or zeros) chosen from a, the others from b (blk_v8) */
#define BLK_SEL(t, a, b) ((blk_v8)(((blk_i8)(a) & (t)) | ((blk_i8)(b) & ~(t))))

/* One (n, block) row: normalise, pool, rectify (B lanes as 8-lane vectors;
 * the scalar kernels' expressions lane by lane) */
DT_BODY void pool_relu_body(const float *restrict xp, float *restrict yp, int32_t *restrict ap, int64_t W, int64_t P,
                            int64_t Q, const float *restrict m, const float *restrict a, const float *restrict b,
                            const int B)
{
    enum { G = MAXB / 8 };
    blk_v8 mv[G], av[G], bv[G];
    const int g8 = B / 8;
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++) {
        memcpy(&mv[g], m + 8 * g, sizeof(blk_v8));
        memcpy(&av[g], a + 8 * g, sizeof(blk_v8));
        memcpy(&bv[g], b + 8 * g, sizeof(blk_v8));
    }
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
            const int32_t i0 = (int32_t)(2 * p * W + 2 * q);
            const int32_t off[3] = {1, (int32_t)W, (int32_t)W + 1};
            const float *c[4] = {xp + (int64_t)i0 * B, xp + ((int64_t)i0 + 1) * B, xp + ((int64_t)i0 + W) * B,
                                 xp + ((int64_t)i0 + W + 1) * B};
#pragma GCC unroll 2
            for (int g = 0; g < g8; g++) {
                blk_v8 mx, v;
                blk_i8 bi = {0};
                bi += i0;
                memcpy(&mx, c[0] + 8 * g, sizeof mx);
                mx = (mx - mv[g]) * av[g] + bv[g];
#pragma GCC unroll 3
                for (int k = 0; k < 3; k++) {
                    memcpy(&v, c[k + 1] + 8 * g, sizeof v);
                    v = (v - mv[g]) * av[g] + bv[g];
                    const blk_i8 t = (v > mx) | ((v != v) & (mx == mx)); /* NaN propagates, as max pooling */
                    mx = BLK_SEL(t, v, mx);
                    bi = (t & (i0 + off[k])) | (~t & bi);
                }
                mx = (blk_v8)((blk_i8)mx & ((mx > 0.0f) | (mx != mx))); /* ReLU: as dt_k_relu_fwd */
                memcpy(yp + (p * Q + q) * B + 8 * g, &mx, sizeof mx);
                memcpy(ap + (p * Q + q) * B + 8 * g, &bi, sizeof bi);
            }
        }
}
DT_CLONES static void pool_relu8(const float *restrict xp, float *restrict yp, int32_t *restrict ap, int64_t W,
                                 int64_t P, int64_t Q, const float *restrict m, const float *restrict a,
                                 const float *restrict b)
{
    pool_relu_body(xp, yp, ap, W, P, Q, m, a, b, 8);
}
DT_CLONES static void pool_relu16(const float *restrict xp, float *restrict yp, int32_t *restrict ap, int64_t W,
                                  int64_t P, int64_t Q, const float *restrict m, const float *restrict a,
                                  const float *restrict b)
{
    pool_relu_body(xp, yp, ap, W, P, Q, m, a, b, 16);
}

/* The gradient at position s, lanes 8g .. 8g + 7, from its window win's
 * (in: the position is in a window): 0 + dy where the window's argmax is s
 * and its output > 0 (ReLU's mask), else 0, as the pooling's scatter into
 * zeros makes it. Through a pointer: a vector return changes the ABI of
 * the clone without AVX. */
DT_BODY void pos_grad(blk_v8 *gy, bool in, const float *restrict gp, const float *restrict yp,
                      const int32_t *restrict ap, int64_t win, int64_t s, int g, const int B)
{
    *gy = (blk_v8){0};
    if (!in)
        return;
    blk_v8 g0, y0;
    blk_i8 a0;
    memcpy(&g0, gp + win * B + 8 * g, sizeof g0);
    memcpy(&y0, yp + win * B + 8 * g, sizeof y0);
    memcpy(&a0, ap + win * B + 8 * g, sizeof a0);
    g0 = 0.0f + g0;
    *gy = (blk_v8)((blk_i8)g0 & (a0 == (int32_t)s) & (y0 > 0.0f));
}

/* The backward's two sums over one (n, block) row as sums2_body takes them
 * (L lanes, in s order), the gradient at each position made from its
 * window's: gp, yp, ap the row's pooled dy, output and argmax (lane offset
 * applied). */
DT_BODY void pool_sums_body(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                            const int32_t *restrict ap, const bn_pool *pl, const float *restrict k,
                            float *restrict ra, float *restrict rb, const int L, const int B)
{
    enum { G = MAXB / 8 };
    blk_v8 a[G] = {{0}}, b[G] = {{0}}, kv[G];
    const int g8 = L / 8;
    const int64_t H = pl->H, W = pl->W, P2 = 2 * pl->P, Q2 = 2 * pl->Q, Q = pl->Q;
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++)
        memcpy(&kv[g], k + 8 * g, sizeof(blk_v8));
    for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
            const int64_t s = h * W + w, win = (h / 2) * Q + w / 2;
            const bool in = h < P2 && w < Q2;
#pragma GCC unroll 2
            for (int g = 0; g < g8; g++) {
                blk_v8 d, gv;
                memcpy(&d, xp + s * B + 8 * g, sizeof d);
                d -= kv[g];
                pos_grad(&gv, in, gp, yp, ap, win, s, g, B);
                a[g] += gv;
                b[g] += gv * d;
            }
        }
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++) {
        memcpy(ra + 8 * g, &a[g], sizeof(blk_v8));
        memcpy(rb + 8 * g, &b[g], sizeof(blk_v8));
    }
}
DT_CLONES static void pool_sums8(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                                 const int32_t *restrict ap, const bn_pool *pl, const float *restrict k,
                                 float *restrict ra, float *restrict rb)
{
    pool_sums_body(xp, gp, yp, ap, pl, k, ra, rb, 8, 8);
}
DT_CLONES static void pool_sums16(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                                  const int32_t *restrict ap, const bn_pool *pl, const float *restrict k,
                                  float *restrict ra, float *restrict rb)
{
    pool_sums_body(xp, gp, yp, ap, pl, k, ra, rb, 16, 16);
}
DT_CLONES static void pool_sums8s16(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                                    const int32_t *restrict ap, const bn_pool *pl, const float *restrict k,
                                    float *restrict ra, float *restrict rb)
{
    pool_sums_body(xp, gp, yp, ap, pl, k, ra, rb, 8, 16);
}

/* bwd_dx_body with the gradient at each position made from its window's
 * (8-lane vectors; the same expressions lane by lane) */
DT_BODY void pool_dx_body(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                          const int32_t *restrict ap, float *restrict op, const bn_pool *pl, const float *restrict m,
                          const float *restrict is, const float *restrict k, const float *restrict mdy,
                          const float *restrict mdyx, const int B)
{
    enum { G = MAXB / 8 };
    blk_v8 mv[G], iv[G], kv[G], dv[G], xv[G];
    const int g8 = B / 8;
#pragma GCC unroll 2
    for (int g = 0; g < g8; g++) {
        memcpy(&mv[g], m + 8 * g, sizeof(blk_v8));
        memcpy(&iv[g], is + 8 * g, sizeof(blk_v8));
        memcpy(&kv[g], k + 8 * g, sizeof(blk_v8));
        memcpy(&dv[g], mdy + 8 * g, sizeof(blk_v8));
        memcpy(&xv[g], mdyx + 8 * g, sizeof(blk_v8));
    }
    const int64_t H = pl->H, W = pl->W, P2 = 2 * pl->P, Q2 = 2 * pl->Q, Q = pl->Q;
    for (int64_t h = 0; h < H; h++)
        for (int64_t w = 0; w < W; w++) {
            const int64_t s = h * W + w, win = (h / 2) * Q + w / 2;
            const bool in = h < P2 && w < Q2;
#pragma GCC unroll 2
            for (int g = 0; g < g8; g++) {
                blk_v8 x, gy;
                memcpy(&x, xp + s * B + 8 * g, sizeof x);
                pos_grad(&gy, in, gp, yp, ap, win, s, g, B);
                const blk_v8 xh = (x - mv[g]) * iv[g];
                const blk_v8 o = kv[g] * (gy - dv[g] - xh * xv[g]);
                memcpy(op + s * B + 8 * g, &o, sizeof o);
            }
        }
}
DT_CLONES static void pool_dx8(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                               const int32_t *restrict ap, float *restrict op, const bn_pool *pl,
                               const float *restrict m, const float *restrict is, const float *restrict k,
                               const float *restrict mdy, const float *restrict mdyx)
{
    pool_dx_body(xp, gp, yp, ap, op, pl, m, is, k, mdy, mdyx, 8);
}
DT_CLONES static void pool_dx16(const float *restrict xp, const float *restrict gp, const float *restrict yp,
                                const int32_t *restrict ap, float *restrict op, const bn_pool *pl,
                                const float *restrict m, const float *restrict is, const float *restrict k,
                                const float *restrict mdy, const float *restrict mdyx)
{
    pool_dx_body(xp, gp, yp, ap, op, pl, m, is, k, mdy, mdyx, 16);
}

/* The row kernels the batch-norm drivers below call for (n, block) row bl
 * (lanes off .. off + L - 1 for the sums): batch norm's alone (pl NULL), or
 * fused with ReLU and the pooling. */
static void fwd_row(const float *x, float *y, int64_t bl, int64_t HW, int B, const float *m, const float *a,
                    const float *b, const bn_pool *pl)
{
    if (!pl) {
        (B == 16 ? affine16 : affine8)(x + bl * HW * B, y + bl * HW * B, HW, m, a, b);
        return;
    }
    const int64_t o = bl * pl->P * pl->Q * B;
    (B == 16 ? pool_relu16 : pool_relu8)(x + bl * HW * B, y + o, pl->argmax + o, pl->W, pl->P, pl->Q, m, a, b);
}

static void bwd_row_sums(const float *x, const float *dy, int64_t bl, int64_t off, int L, int B, int64_t HW,
                         const float *m, float *ra, float *rb, const bn_pool *pl)
{
    const float *xp = x + bl * HW * B + off;
    if (!pl) {
        const float *gp = dy + bl * HW * B + off;
        (L == 8 && B == 16 ? bwd_sums8s16 : B == 16 ? bwd_sums16 : bwd_sums8)(xp, gp, HW, m, ra, rb);
        return;
    }
    const int64_t o = bl * pl->P * pl->Q * B + off;
    (L == 8 && B == 16 ? pool_sums8s16 : B == 16 ? pool_sums16 : pool_sums8)(xp, dy + o, pl->y + o, pl->argmax + o,
                                                                             pl, m, ra, rb);
}

static void bwd_row_dx(const float *x, const float *dy, float *dx, int64_t bl, int64_t HW, int B, const float *m,
                       const float *is, const float *k, const float *mdy, const float *mdyx, const bn_pool *pl)
{
    const int64_t o = bl * HW * B;
    if (!pl) {
        (B == 16 ? bwd_dx16 : bwd_dx8)(x + o, dy + o, dx + o, HW, m, is, k, mdy, mdyx);
        return;
    }
    const int64_t op = bl * pl->P * pl->Q * B;
    (B == 16 ? pool_dx16 : pool_dx8)(x + o, dy + op, pl->y + op, pl->argmax + op, dx + o, pl, m, is, k, mdy, mdyx);
}

/* 2x2 stride-2 unpadded max pool of one channel block: each output is B
 * lanes (channels); same rule on every path (first max in window order
 * wins, NaN propagates), so every path gives the scalar loop's values and
 * argmax indices. The path follows dt__vec_level(): 16 lanes with AVX-512
 * (B = 16; B = 8 takes the AVX2 loop), 8 with AVX2, the scalar loop on the
 * scalar path. */
static void max2x2_scalar(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                          int32_t *restrict ap, const int B)
{
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
            int32_t i0 = (int32_t)(2 * p * W + 2 * q);
            const float *c0 = xp + (int64_t)i0 * B;
            const float *cs[3] = {c0 + B, c0 + W * B, c0 + W * B + B};
            const int32_t off[3] = {1, (int32_t)W, (int32_t)W + 1};
            float *y = yp + (p * Q + q) * B;
            int32_t *a = ap + (p * Q + q) * B;
            for (int j = 0; j < B; j++) {
                float mx = c0[j], v;
                int32_t bi = i0;
                for (int k = 0; k < 3; k++) {
                    v = cs[k][j];
                    bool t = (v > mx) | ((v != v) & (mx == mx)); /* NaN propagates */
                    mx = t ? v : mx;
                    bi = t ? i0 + off[k] : bi;
                }
                y[j] = mx;
                a[j] = bi;
            }
        }
}

#if DT__X86_VEC
/* one 8-lane step of the window: take v where v > m, or v is NaN and m not */
DT__AVX2 static inline void max8_take(__m256 v, __m256i iv, __m256 *m, __m256i *im)
{
    __m256 t = _mm256_or_ps(_mm256_cmp_ps(v, *m, _CMP_GT_OQ),
                            _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(*m, *m, _CMP_ORD_Q)));
    *m = _mm256_blendv_ps(*m, v, t);
    *im = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(*im), _mm256_castsi256_ps(iv), t));
}

DT__AVX2 static void max2x2_avx2(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                                 int32_t *restrict ap, const int B)
{
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
            int32_t i0 = (int32_t)(2 * p * W + 2 * q);
            const float *c0 = xp + (int64_t)i0 * B, *c1 = c0 + B, *c2 = c0 + W * B, *c3 = c2 + B;
            const __m256i i1 = _mm256_set1_epi32(i0 + 1), i2 = _mm256_set1_epi32(i0 + (int32_t)W),
                          i3 = _mm256_set1_epi32(i0 + (int32_t)W + 1);
            float *y = yp + (p * Q + q) * B;
            int32_t *a = ap + (p * Q + q) * B;
            for (int h = 0; h < B; h += 8) {
                __m256 m = _mm256_loadu_ps(c0 + h);
                __m256i im = _mm256_set1_epi32(i0);
                max8_take(_mm256_loadu_ps(c1 + h), i1, &m, &im);
                max8_take(_mm256_loadu_ps(c2 + h), i2, &m, &im);
                max8_take(_mm256_loadu_ps(c3 + h), i3, &m, &im);
                _mm256_storeu_ps(y + h, m);
                _mm256_storeu_si256((__m256i *)(void *)(a + h), im);
            }
        }
}

DT__AVX512 static inline void max16_take(__m512 v, __m512i iv, __m512 *m, __m512i *im)
{
    __mmask16 t = _mm512_cmp_ps_mask(v, *m, _CMP_GT_OQ) |
                  (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) & _mm512_cmp_ps_mask(*m, *m, _CMP_ORD_Q));
    *m = _mm512_mask_blend_ps(t, *m, v);
    *im = _mm512_mask_blend_epi32(t, *im, iv);
}

/* B = 16 only */
DT__AVX512 static void max2x2_avx512(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                                     int32_t *restrict ap)
{
    enum { B = 16 };
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
            int32_t i0 = (int32_t)(2 * p * W + 2 * q);
            const float *c0 = xp + (int64_t)i0 * B, *c1 = c0 + B, *c2 = c0 + W * B, *c3 = c2 + B;
            __m512 m = _mm512_loadu_ps(c0);
            __m512i im = _mm512_set1_epi32(i0);
            max16_take(_mm512_loadu_ps(c1), _mm512_set1_epi32(i0 + 1), &m, &im);
            max16_take(_mm512_loadu_ps(c2), _mm512_set1_epi32(i0 + (int32_t)W), &m, &im);
            max16_take(_mm512_loadu_ps(c3), _mm512_set1_epi32(i0 + (int32_t)W + 1), &m, &im);
            _mm512_storeu_ps(yp + (p * Q + q) * B, m);
            _mm512_storeu_si512((void *)(ap + (p * Q + q) * B), im);
        }
}
#endif

static void max2x2(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                   int32_t *restrict ap, const int B, const int vec)
{
#if DT__X86_VEC
    if (vec == DT__VEC_AVX512 && B == 16) {
        max2x2_avx512(xp, W, P, Q, yp, ap);
        return;
    }
    if (vec != DT__VEC_SCALAR) {
        max2x2_avx2(xp, W, P, Q, yp, ap, B);
        return;
    }
#endif
    (void)vec;
    max2x2_scalar(xp, W, P, Q, yp, ap, B);
}

static dt_status blk_size_check(const char *fn, int B, int64_t C)
{
    if (B != 8 && B != 16)
        return dt_error(DT_ERR_INVALID_ARG, "%s: channel block %d (8 for nChw8c, 16 for nChw16c)", fn, B);
    if (C % B)
        return dt_error(DT_ERR_INVALID_ARG, "%s: nChw%dc needs C %% %d == 0, got C=%lld", fn, B, B, (long long)C);
    return DT_OK;
}

static dt_status blk_check(const char *fn, int B, const void *x, const void *y, int64_t N, int64_t C, int64_t HW)
{
    if (N < 0 || C < 0 || HW < 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: negative size N=%lld C=%lld HW=%lld", fn, (long long)N,
                        (long long)C, (long long)HW);
    dt_status st = blk_size_check(fn, B, C);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, x, N * C * HW);
    DT__CHECK_PTR(fn, y, N * C * HW);
    return DT_OK;
}

dt_status dt_k_to_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B, float *y)
{
    dt_status st = blk_check("dt_k_to_blocked", B, x, y, N, C, HW);
    if (st < 0)
        return st;
    int64_t CB = C / B;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xp = x + nb * B * HW;
        float *yp = y + nb * B * HW;
        for (int64_t s = 0; s < HW; s++)
            for (int j = 0; j < B; j++)
                yp[s * B + j] = xp[j * HW + s];
    }
    if (N * C * HW > 0)
        dt__stats_reorder();
    return DT_OK;
}

dt_status dt_k_from_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B, float *y)
{
    dt_status st = blk_check("dt_k_from_blocked", B, x, y, N, C, HW);
    if (st < 0)
        return st;
    int64_t CB = C / B;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xp = x + nb * B * HW;
        float *yp = y + nb * B * HW;
        for (int j = 0; j < B; j++)
            for (int64_t s = 0; s < HW; s++)
                yp[j * HW + s] = xp[s * B + j];
    }
    if (N * C * HW > 0)
        dt__stats_reorder();
    return DT_OK;
}

/* The per-channel kernels (batch norm, the C = 1 backward weights) split
 * their work over units of L lanes at stride B: whole blocks (L = B), or,
 * with B = 16 and fewer blocks than threads, half blocks (L = 8, stride 16),
 * so the ConvNet's first layer (16 channels: one nChw16c block) still runs on
 * two threads as it does in nChw8c. Each lane's arithmetic is the same in
 * both (a lane never meets another), so the results do not change. Batch
 * norm's element-wise pass then runs by whole (n, block) pieces, after all
 * the statistics, so two threads never write one cache line. Sets *L
 * and returns the number of units: unit u is block u / (B / L), lanes
 * (u % (B / L)) * L onwards. */
#define SPLIT_MAXC 64 /* half blocks only for this few channels (per-channel scratch on the stack) */
int64_t dt__blk_units(int64_t CB, int B, int nt, int *L)
{
    *L = B == 16 && CB < nt && CB * B <= SPLIT_MAXC ? 8 : B;
    return CB * (B / *L);
}

/* A block too few for the threads (dt__blk_units' half blocks): rather
 * than two threads each reading half of every 64-byte line, the (n, block)
 * rows are shared out whole and each row's per-channel float sums kept,
 * N x C of each kind ([2][N][C]), then summed in double in n order per
 * channel: the same sums as the half blocks'. NULL (the half blocks then)
 * if the scratch cannot be had. */
static float *row_sums_alloc(int64_t N, int64_t C)
{
    float *rs = dt_alloc(sizeof(float) * (size_t)(2 * N * C));
    if (!rs)
        dt_error_clear();
    return rs;
}

/* Called by every thread of a parallel region: each (n, block) row's
 * channel sums into rs (see row_sums_alloc; g NULL: the moments about the
 * channels' first values, else the backward's about m), then each
 * channel's two sums in double in n order into d1, d2. */
static void split_sums(const float *x, const float *g, const float *m, int64_t N, int64_t C, int64_t HW, int B,
                       const bn_pool *pl, float *rs, double *d1, double *d2)
{
    const int64_t CB = C / B;
#pragma omp for schedule(static)
    for (int64_t bl = 0; bl < N * CB; bl++) {
        const int64_t n = bl / CB, cb = bl % CB, o = bl * HW * B;
        const float *k = g ? m + cb * B : x + cb * HW * B;
        float *ra = rs + n * C + cb * B, *rb = rs + (N + n) * C + cb * B;
        if (g)
            bwd_row_sums(x, g, bl, 0, B, B, HW, k, ra, rb, pl);
        else
            (B == 16 ? moments16 : moments8)(x + o, HW, k, ra, rb);
    }
#pragma omp for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        double a = 0, b = 0;
        for (int64_t n = 0; n < N; n++) {
            a += (double)rs[n * C + c];
            b += (double)rs[(N + n) * C + c];
        }
        d1[c] = a, d2[c] = b;
    }
}

/* Training batch norm on blocked x (arguments checked); y its output, or
 * with pl the pooled, rectified output (bn_pool). */
static dt_status bn_fwd(const char *fn, const float *x, int64_t N, int64_t C, int64_t HW, int B, const float *gamma,
                        const float *beta, float eps, float momentum, float *running_mean, float *running_var,
                        float *y, float *save_mean, float *save_invstd, const bn_pool *pl)
{
    if (C == 0)
        return DT_OK;
    int64_t cnt = N * HW;
    dt_status st = dt__bn_train_args(fn, cnt, eps);
    if (st < 0)
        return st;
    int64_t CB = C / B;
    int nt = dt__threads_for(N * C * HW), L;
    int64_t units = dt__blk_units(CB, B, nt, &L), per = B / L;
    const bool split = L < B;
    float sm[SPLIT_MAXC], sa[SPLIT_MAXC], sb[SPLIT_MAXC]; /* split: each channel's mean, scale, shift */
    double d1[SPLIT_MAXC], d2[SPLIT_MAXC];
    float *rs = split ? row_sums_alloc(N, C) : NULL; /* see row_sums_alloc */
    if (rs)
        units = 0;
#pragma omp parallel num_threads(nt)
    {
    if (rs) {
        split_sums(x, NULL, NULL, N, C, HW, B, NULL, rs, d1, d2);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < C; c++)
            dt__bn_finish_channel(c, d1[c], d2[c], x[c / B * HW * B + c % B], cnt, eps, momentum, gamma, beta,
                                  running_mean, running_var, save_mean, save_invstd, &sm[c], &sa[c], &sb[c]);
    }
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        const int64_t cb = u / per, c0 = cb * B + (u % per) * L, off = (u % per) * L;
        float k[MAXB], fm[MAXB], a[MAXB], b[MAXB];
        double s1[MAXB] = {0}, s2[MAXB] = {0};
        for (int j = 0; j < L; j++)
            k[j] = x[cb * HW * B + off + j]; /* first value of the channel (n = 0, s = 0) */
        for (int64_t n = 0; n < N; n++) {
            float r1[MAXB], r2[MAXB];
            const float *xp = x + (n * CB + cb) * HW * B + off;
            if (L == 8 && B == 16)
                moments8s16(xp, HW, k, r1, r2);
            else if (B == 16)
                moments16(xp, HW, k, r1, r2);
            else
                moments8(xp, HW, k, r1, r2);
            for (int j = 0; j < L; j++) {
                s1[j] += (double)r1[j];
                s2[j] += (double)r2[j];
            }
        }
        for (int j = 0; j < L; j++)
            dt__bn_finish_channel(c0 + j, s1[j], s2[j], k[j], cnt, eps, momentum, gamma, beta, running_mean,
                                  running_var, save_mean, save_invstd, &fm[j], &a[j], &b[j]);
        if (split) {
            memcpy(sm + c0, fm, sizeof(float) * (size_t)L);
            memcpy(sa + c0, a, sizeof(float) * (size_t)L);
            memcpy(sb + c0, b, sizeof(float) * (size_t)L);
            continue;
        }
        for (int64_t n = 0; n < N; n++)
            fwd_row(x, y, n * CB + cb, HW, B, fm, a, b, pl);
    }
    if (split) { /* after the implicit barrier: every channel's statistics are in */
#pragma omp for schedule(static)
        for (int64_t bl = 0; bl < N * CB; bl++) {
            const int64_t cb = bl % CB;
            fwd_row(x, y, bl, HW, B, sm + cb * B, sa + cb * B, sb + cb * B, pl);
        }
    }
    }
    dt_free(rs);
    return DT_OK;
}

/* Batch norm's backward on blocked x (arguments checked); dy the gradient
 * at its output, or with pl at the pooled, rectified output (bn_pool). */
static dt_status bn_bwd(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW, int B, const float *gamma,
                        const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta,
                        const bn_pool *pl)
{
    int64_t cnt = N * HW, CB = C / B;
    if (cnt == 0) {
        for (int64_t c = 0; c < C; c++) {
            if (dgamma)
                dgamma[c] = 0.0f;
            if (dbeta)
                dbeta[c] = 0.0f;
        }
        return DT_OK;
    }
    int nt = dt__threads_for(N * C * HW), L;
    int64_t units = dt__blk_units(CB, B, nt, &L), per = B / L;
    const bool split = L < B;
    /* split: each channel's mean, invstd, scale and the two means of the pass over dy */
    float sm[SPLIT_MAXC], sis[SPLIT_MAXC], sk[SPLIT_MAXC], smdy[SPLIT_MAXC], smdyx[SPLIT_MAXC];
    double d1[SPLIT_MAXC], d2[SPLIT_MAXC];
    float *rs = split ? row_sums_alloc(N, C) : NULL; /* see row_sums_alloc */
    if (rs)
        units = 0;
#pragma omp parallel num_threads(nt)
    {
    if (rs) {
        split_sums(x, dy, save_mean, N, C, HW, B, pl, rs, d1, d2);
#pragma omp for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            const double sdy = d1[c], sdyx = d2[c] * (double)save_invstd[c]; /* sum dy * xhat */
            if (dgamma)
                dgamma[c] = (float)sdyx;
            if (dbeta)
                dbeta[c] = (float)sdy;
            sm[c] = save_mean[c];
            sis[c] = save_invstd[c];
            sk[c] = (gamma ? gamma[c] : 1.0f) * save_invstd[c];
            smdy[c] = (float)(sdy / (double)cnt);
            smdyx[c] = (float)(sdyx / (double)cnt);
        }
    }
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; u++) {
        const int64_t cb = u / per, c0 = cb * B + (u % per) * L, off = (u % per) * L;
        float m[MAXB], is[MAXB], k[MAXB], mdy[MAXB], mdyx[MAXB];
        double sdy[MAXB] = {0}, sdyx[MAXB] = {0};
        for (int j = 0; j < L; j++) {
            m[j] = save_mean[c0 + j];
            is[j] = save_invstd[c0 + j];
        }
        for (int64_t n = 0; n < N; n++) {
            float ra[MAXB], rb[MAXB];
            bwd_row_sums(x, dy, n * CB + cb, off, L, B, HW, m, ra, rb, pl);
            for (int j = 0; j < L; j++) {
                sdy[j] += (double)ra[j];
                sdyx[j] += (double)rb[j];
            }
        }
        for (int j = 0; j < L; j++) {
            int64_t c = c0 + j;
            sdyx[j] *= (double)is[j]; /* sum dy * xhat */
            if (dgamma)
                dgamma[c] = (float)sdyx[j];
            if (dbeta)
                dbeta[c] = (float)sdy[j];
            k[j] = (gamma ? gamma[c] : 1.0f) * is[j];
            mdy[j] = (float)(sdy[j] / (double)cnt);
            mdyx[j] = (float)(sdyx[j] / (double)cnt);
        }
        if (!dx)
            continue;
        if (split) {
            const size_t bs = sizeof(float) * (size_t)L;
            memcpy(sm + c0, m, bs);
            memcpy(sis + c0, is, bs);
            memcpy(sk + c0, k, bs);
            memcpy(smdy + c0, mdy, bs);
            memcpy(smdyx + c0, mdyx, bs);
            continue;
        }
        for (int64_t n = 0; n < N; n++)
            bwd_row_dx(x, dy, dx, n * CB + cb, HW, B, m, is, k, mdy, mdyx, pl);
    }
    if (split && dx) { /* after the implicit barrier: every channel's sums are in */
#pragma omp for schedule(static)
        for (int64_t bl = 0; bl < N * CB; bl++) {
            const int64_t c = bl % CB * B;
            bwd_row_dx(x, dy, dx, bl, HW, B, sm + c, sis + c, sk + c, smdy + c, smdyx + c, pl);
        }
    }
    }
    dt_free(rs);
    return DT_OK;
}

dt_status dt_k_batchnorm_train_fwd_blocked(const float *x, int64_t N, int64_t C, int64_t HW, int B,
                                           const float *gamma, const float *beta, float eps, float momentum,
                                           float *running_mean, float *running_var, float *y, float *save_mean,
                                           float *save_invstd)
{
    const char *fn = "dt_k_batchnorm_train_fwd_blocked";
    dt_status st = blk_check(fn, B, x, y, N, C, HW);
    if (st < 0)
        return st;
    return bn_fwd(fn, x, N, C, HW, B, gamma, beta, eps, momentum, running_mean, running_var, y, save_mean,
                  save_invstd, NULL);
}

dt_status dt_k_batchnorm_bwd_blocked(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW, int B,
                                     const float *gamma, const float *save_mean, const float *save_invstd, float *dx,
                                     float *dgamma, float *dbeta)
{
    const char *fn = "dt_k_batchnorm_bwd_blocked";
    dt_status st = blk_check(fn, B, x, dy, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, save_mean, C);
    DT__CHECK_PTR(fn, save_invstd, C);
    return bn_bwd(x, dy, N, C, HW, B, gamma, save_mean, save_invstd, dx, dgamma, dbeta, NULL);
}

/* The fused op's shape (H, W >= 2; a plane indexable by int32) and its
 * pooled size; x and the pooled y / argmax checked as arrays. */
static dt_status bn_pool_check(const char *fn, int B, int64_t N, int64_t C, int64_t H, int64_t W, const void *x,
                               const void *y, const void *argmax, bn_pool *pl)
{
    if (H < 2 || W < 2 || H > INT32_MAX / W)
        return dt_error(DT_ERR_SHAPE, "%s: want a plane of at least 2 x 2 and at most 2^31 - 1 elements, got "
                        "%lld x %lld", fn, (long long)H, (long long)W);
    dt_status st = blk_check(fn, B, x, x, N, C, H * W);
    if (st < 0)
        return st;
    *pl = (bn_pool){.H = H, .W = W, .P = H / 2, .Q = W / 2};
    DT__CHECK_PTR(fn, y, N * C * pl->P * pl->Q);
    DT__CHECK_PTR(fn, argmax, N * C * pl->P * pl->Q);
    return DT_OK;
}

dt_status dt_k_bn_relu_maxpool2x2_fwd_blocked(const float *x, int64_t N, int64_t C, int64_t H, int64_t W, int B,
                                              const float *gamma, const float *beta, float eps, float momentum,
                                              float *running_mean, float *running_var, float *y, int32_t *argmax,
                                              float *save_mean, float *save_invstd)
{
    const char *fn = "dt_k_bn_relu_maxpool2x2_fwd_blocked";
    bn_pool pl;
    dt_status st = bn_pool_check(fn, B, N, C, H, W, x, y, argmax, &pl);
    if (st < 0)
        return st;
    pl.argmax = argmax;
    return bn_fwd(fn, x, N, C, H * W, B, gamma, beta, eps, momentum, running_mean, running_var, y, save_mean,
                  save_invstd, &pl);
}

dt_status dt_k_bn_relu_maxpool2x2_bwd_blocked(const float *x, const float *y, const int32_t *argmax, const float *dy,
                                              int64_t N, int64_t C, int64_t H, int64_t W, int B, const float *gamma,
                                              const float *save_mean, const float *save_invstd, float *dx,
                                              float *dgamma, float *dbeta)
{
    const char *fn = "dt_k_bn_relu_maxpool2x2_bwd_blocked";
    bn_pool pl;
    dt_status st = bn_pool_check(fn, B, N, C, H, W, x, y, argmax, &pl);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, dy, N * C * pl.P * pl.Q);
    DT__CHECK_PTR(fn, save_mean, C);
    DT__CHECK_PTR(fn, save_invstd, C);
    pl.y = y;
    pl.argmax = (int32_t *)(uintptr_t)argmax; /* read only in the backward */
    return bn_bwd(x, dy, N, C, H * W, B, gamma, save_mean, save_invstd, dx, dgamma, dbeta, &pl);
}

static dt_status pool_blk_check(const char *fn, int B, const dt_k_pool2d_shape *s, int64_t *P, int64_t *Q,
                                const void *a, const void *b)
{
    dt_status st = dt_k_pool2d_out_size(s, P, Q);
    if (st < 0)
        return dt_error_wrap(st, "%s", fn);
    if ((st = blk_size_check(fn, B, s->C)) < 0)
        return st;
    if (s->H * s->W > INT32_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: plane of %lld elements exceeds int32 argmax", fn,
                        (long long)(s->H * s->W));
    DT__CHECK_PTR(fn, a, s->N * s->C);
    DT__CHECK_PTR(fn, b, s->N * s->C);
    return DT_OK;
}

dt_status dt_k_maxpool2d_fwd_blocked(const dt_k_pool2d_shape *s, int B, const float *x, float *y, int32_t *argmax)
{
    const char *fn = "dt_k_maxpool2d_fwd_blocked";
    int64_t P, Q;
    dt_status st = pool_blk_check(fn, B, s, &P, &Q, x, y);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, blocks = s->N * (s->C / B);
    int nt = dt__threads_for(blocks * B * H * W);
    const int vec = dt__vec_level();
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bl = 0; bl < blocks; bl++) {
        const float *xp = x + bl * H * W * B;
        float *yp = y + bl * P * Q * B;
        int32_t *ap = argmax ? argmax + bl * P * Q * B : NULL;
        if (ap && s->kh == 2 && s->kw == 2 && s->sh == 2 && s->sw == 2 && s->ph == 0 && s->pw == 0) {
            max2x2(xp, W, P, Q, yp, ap, B, vec);
            continue;
        }
        for (int64_t p = 0; p < P; p++) {
            int64_t h0, h1;
            dt__pool_window(p, s->sh, s->ph, s->kh, H, &h0, &h1);
            for (int64_t q = 0; q < Q; q++) {
                int64_t w0, w1;
                dt__pool_window(q, s->sw, s->pw, s->kw, W, &w0, &w1);
                float m[MAXB];
                int32_t best[MAXB];
                for (int j = 0; j < B; j++) {
                    m[j] = xp[(h0 * W + w0) * B + j];
                    best[j] = (int32_t)(h0 * W + w0);
                }
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        for (int j = 0; j < B; j++) {
                            float v = xp[(h * W + w) * B + j];
                            bool take = (v > m[j]) | ((v != v) & (m[j] == m[j])); /* NaN propagates */
                            m[j] = take ? v : m[j];
                            best[j] = take ? (int32_t)(h * W + w) : best[j];
                        }
                for (int j = 0; j < B; j++) {
                    yp[(p * Q + q) * B + j] = m[j];
                    if (ap)
                        ap[(p * Q + q) * B + j] = best[j];
                }
            }
        }
    }
    return DT_OK;
}

dt_status dt_k_maxpool2d_bwd_blocked(const dt_k_pool2d_shape *s, int B, const float *dy, const int32_t *argmax,
                                     float *dx)
{
    const char *fn = "dt_k_maxpool2d_bwd_blocked";
    int64_t P, Q;
    dt_status st = pool_blk_check(fn, B, s, &P, &Q, dy, dx);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, argmax, s->N * s->C);
    int64_t H = s->H, W = s->W, blocks = s->N * (s->C / B);
    int nt = dt__threads_for(blocks * B * H * W);
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t bl = 0; bl < blocks; bl++) {
        float *xp = dx + bl * H * W * B;
        const float *gp = dy + bl * P * Q * B;
        const int32_t *ap = argmax + bl * P * Q * B;
        memset(xp, 0, (size_t)(H * W * B) * sizeof(float));
        for (int64_t i = 0; i < P * Q; i++)
            for (int j = 0; j < B; j++) {
                int32_t a = ap[i * B + j];
                if (a < 0 || a >= H * W) {
                    bad = 1;
                    continue;
                }
                xp[(int64_t)a * B + j] += gp[i * B + j];
            }
    }
    if (bad)
        return dt_error(DT_ERR_RANGE, "%s: argmax index outside the %lldx%lld plane", fn, (long long)H, (long long)W);
    return DT_OK;
}

/* ---- convolution backward weights for one input channel ------------------
 * The ConvNet's first layer (C = 1) has the worst oneDNN path of the step:
 * its backward weights runs gemm-based on plain layouts (6.3-6.9 ms per
 * batch of 100, about 10 GFLOP/s, plus a 1 ms reorder of dy out of nChw8c)
 * or, blocked, pads the single channel to 8 and is slower still. With dy in
 * nChw8c / nChw16c the product is natural: dW[k][r][s] = sum over n, p, q of
 * dy[n][k][p][q] * xpad[n][p + r][q + s] (stride 1, dilation 1), B output
 * channels per vector, one input row at a time against S accumulators.
 * Work is split over channel blocks (or half blocks: dt__blk_units; with
 * AVX-512 and 5 taps a row, over the kernel's rows instead, keeping 16
 * lanes) only, so every element is summed in the same order (n, then p,
 * then q) whatever the thread count and block size. */
/* The 5 x L accumulators of a 5-wide kernel row as local 8-lane vectors
 * (GCC's vector extension, held in registers; as arrays they went through
 * memory at every q: a load, an add and a store a lane group, 68 GFLOP/s on
 * a Xeon): the same products and sums per lane in the same order. */
DT_BODY void c1_row5(const float *restrict dyrow, const float *restrict xrow, int64_t Q, float *restrict acc,
                     const int L, const int B)
{
    enum { G = MAXB / 8 };
    blk_v8 a[5][G];
    const int g8 = L / 8;
#pragma GCC unroll 5
    for (int t = 0; t < 5; t++)
#pragma GCC unroll 2
        for (int g = 0; g < g8; g++)
            memcpy(&a[t][g], acc + t * L + 8 * g, sizeof(blk_v8));
    for (int64_t q = 0; q < Q; q++) {
        blk_v8 d[G];
#pragma GCC unroll 2
        for (int g = 0; g < g8; g++)
            memcpy(&d[g], dyrow + q * B + 8 * g, sizeof(blk_v8));
#pragma GCC unroll 5
        for (int t = 0; t < 5; t++)
#pragma GCC unroll 2
            for (int g = 0; g < g8; g++)
                a[t][g] += d[g] * xrow[q + t];
    }
#pragma GCC unroll 5
    for (int t = 0; t < 5; t++)
#pragma GCC unroll 2
        for (int g = 0; g < g8; g++)
            memcpy(acc + t * L + 8 * g, &a[t][g], sizeof(blk_v8));
}

/* c1_row5 for one 8-lane group (L = 8), turned around: each input x[j] is
 * broadcast once, from memory (a load; GCC's reuse of the window's x values
 * through register broadcasts cost a shuffle a tap), and meets the dy
 * vectors it multiplies, d[j - t] for tap t, held as a sliding window in
 * registers. Tap t's accumulator still receives d[q] * x[q + t] for q in
 * increasing order: the same products and sums as c1_row5. Q >= 4. */
DT_BODY void c1_row5x8(const float *restrict dyrow, const float *restrict xrow, int64_t Q, float *restrict acc,
                       const int B)
{
    blk_v8 a0, a1, a2, a3, a4, w0, w1, w2, w3, w4 = {0}, x;
    float xs;
    memcpy(&a0, acc, sizeof a0);
    memcpy(&a1, acc + 8, sizeof a1);
    memcpy(&a2, acc + 16, sizeof a2);
    memcpy(&a3, acc + 24, sizeof a3);
    memcpy(&a4, acc + 32, sizeof a4);
#define C1_X(j) (xs = xrow[j], x = (blk_v8){xs, xs, xs, xs, xs, xs, xs, xs})
#define C1_D(j) memcpy(&w0, dyrow + (j) * B, sizeof w0)
    /* the first four inputs: taps 0..j */
    C1_D(0), C1_X(0), a0 += w0 * x;
    w1 = w0, C1_D(1), C1_X(1), a0 += w0 * x, a1 += w1 * x;
    w2 = w1, w1 = w0, C1_D(2), C1_X(2), a0 += w0 * x, a1 += w1 * x, a2 += w2 * x;
    w3 = w2, w2 = w1, w1 = w0, C1_D(3), C1_X(3), a0 += w0 * x, a1 += w1 * x, a2 += w2 * x, a3 += w3 * x;
    for (int64_t j = 4; j < Q; j++) { /* every tap */
        w4 = w3, w3 = w2, w2 = w1, w1 = w0;
        C1_D(j), C1_X(j);
        a0 += w0 * x, a1 += w1 * x, a2 += w2 * x, a3 += w3 * x, a4 += w4 * x;
    }
    /* the last four inputs: taps j - Q + 1..4, no new dy */
    C1_X(Q), a1 += w0 * x, a2 += w1 * x, a3 += w2 * x, a4 += w3 * x;
    C1_X(Q + 1), a2 += w0 * x, a3 += w1 * x, a4 += w2 * x;
    C1_X(Q + 2), a3 += w0 * x, a4 += w1 * x;
    C1_X(Q + 3), a4 += w0 * x;
#undef C1_X
#undef C1_D
    memcpy(acc, &a0, sizeof a0);
    memcpy(acc + 8, &a1, sizeof a1);
    memcpy(acc + 16, &a2, sizeof a2);
    memcpy(acc + 24, &a3, sizeof a3);
    memcpy(acc + 32, &a4, sizeof a4);
}

DT_BODY void c1_row_body(const float *restrict dyrow, const float *restrict xrow, int64_t Q, int S,
                         float *restrict acc, const int L, const int B)
{
    if (S == 5 && L == 8 && Q >= 4) { /* the common 5x5 case, accumulators in registers */
        c1_row5x8(dyrow, xrow, Q, acc, B);
        return;
    }
    if (S == 5) {
        c1_row5(dyrow, xrow, Q, acc, L, B);
        return;
    }
    for (int64_t q = 0; q < Q; q++)
        for (int s = 0; s < S; s++) {
            const float xv = xrow[q + s];
#pragma omp simd
            for (int j = 0; j < L; j++)
                acc[s * L + j] += dyrow[q * B + j] * xv;
        }
}
DT_CLONES static void c1_row8(const float *restrict dyrow, const float *restrict xrow, int64_t Q, int S,
                              float *restrict acc)
{
    c1_row_body(dyrow, xrow, Q, S, acc, 8, 8);
}
DT_CLONES static void c1_row16(const float *restrict dyrow, const float *restrict xrow, int64_t Q, int S,
                               float *restrict acc)
{
    c1_row_body(dyrow, xrow, Q, S, acc, 16, 16);
}
DT_CLONES static void c1_row8s16(const float *restrict dyrow, const float *restrict xrow, int64_t Q, int S,
                                 float *restrict acc)
{
    c1_row_body(dyrow, xrow, Q, S, acc, 8, 16);
}

#if DT__X86_VEC
/* c1_row5 on 16 lanes in one AVX-512 register per tap: the same products
 * and sums per lane in the same order (a multiply, then an add; fused, one
 * rounding, as c1_row5x8_fma's, when `fused`). */
DT__AVX512 static void c1_row16x5_avx512(const float *restrict dyrow, const float *restrict xrow, int64_t Q,
                                         float *restrict acc, bool fused)
{
    __m512 a0 = _mm512_loadu_ps(acc), a1 = _mm512_loadu_ps(acc + 16), a2 = _mm512_loadu_ps(acc + 32),
           a3 = _mm512_loadu_ps(acc + 48), a4 = _mm512_loadu_ps(acc + 64);
    if (fused)
        for (int64_t q = 0; q < Q; q++) {
            const __m512 d = _mm512_loadu_ps(dyrow + q * 16);
            a0 = _mm512_fmadd_ps(d, _mm512_set1_ps(xrow[q]), a0);
            a1 = _mm512_fmadd_ps(d, _mm512_set1_ps(xrow[q + 1]), a1);
            a2 = _mm512_fmadd_ps(d, _mm512_set1_ps(xrow[q + 2]), a2);
            a3 = _mm512_fmadd_ps(d, _mm512_set1_ps(xrow[q + 3]), a3);
            a4 = _mm512_fmadd_ps(d, _mm512_set1_ps(xrow[q + 4]), a4);
        }
    else
        for (int64_t q = 0; q < Q; q++) {
            const __m512 d = _mm512_loadu_ps(dyrow + q * 16);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(d, _mm512_set1_ps(xrow[q])));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(d, _mm512_set1_ps(xrow[q + 1])));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(d, _mm512_set1_ps(xrow[q + 2])));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(d, _mm512_set1_ps(xrow[q + 3])));
            a4 = _mm512_add_ps(a4, _mm512_mul_ps(d, _mm512_set1_ps(xrow[q + 4])));
        }
    _mm512_storeu_ps(acc, a0);
    _mm512_storeu_ps(acc + 16, a1);
    _mm512_storeu_ps(acc + 32, a2);
    _mm512_storeu_ps(acc + 48, a3);
    _mm512_storeu_ps(acc + 64, a4);
}

/* c1_row5x8 with fused multiply-adds (AVX2 and FMA): 8 lanes of dy (rows B
 * values apart) against the input row, tap t's accumulator at acc + t * L:
 * each sum receives the same products in the same order, each rounded
 * once, as c1_row16x5_avx512's fused ones, so nChw8c and nChw16c give the
 * same bits. Twice c1_row5x8's rate: its multiply and add are two
 * instructions on the FP pipes. Q >= 4. */
DT__AVX2 static void c1_row5x8_fma(const float *restrict dyrow, const float *restrict xrow, int64_t Q,
                                   float *restrict acc, int L, int B)
{
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + L), a2 = _mm256_loadu_ps(acc + 2 * L),
           a3 = _mm256_loadu_ps(acc + 3 * L), a4 = _mm256_loadu_ps(acc + 4 * L), w0, w1, w2, w3, w4, x;
#define C1_X(j) (x = _mm256_broadcast_ss(xrow + (j)))
#define C1_D(j) (w0 = _mm256_loadu_ps(dyrow + (j) * B))
#define C1_F(a, w) (a = _mm256_fmadd_ps(w, x, a))
    C1_D(0), C1_X(0), C1_F(a0, w0);
    w1 = w0, C1_D(1), C1_X(1), C1_F(a0, w0), C1_F(a1, w1);
    w2 = w1, w1 = w0, C1_D(2), C1_X(2), C1_F(a0, w0), C1_F(a1, w1), C1_F(a2, w2);
    w3 = w2, w2 = w1, w1 = w0, C1_D(3), C1_X(3), C1_F(a0, w0), C1_F(a1, w1), C1_F(a2, w2), C1_F(a3, w3);
    for (int64_t j = 4; j < Q; j++) {
        w4 = w3, w3 = w2, w2 = w1, w1 = w0;
        C1_D(j), C1_X(j);
        C1_F(a0, w0), C1_F(a1, w1), C1_F(a2, w2), C1_F(a3, w3), C1_F(a4, w4);
    }
    C1_X(Q), C1_F(a1, w0), C1_F(a2, w1), C1_F(a3, w2), C1_F(a4, w3);
    C1_X(Q + 1), C1_F(a2, w0), C1_F(a3, w1), C1_F(a4, w2);
    C1_X(Q + 2), C1_F(a3, w0), C1_F(a4, w1);
    C1_X(Q + 3), C1_F(a4, w0);
#undef C1_X
#undef C1_D
#undef C1_F
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + L, a1), _mm256_storeu_ps(acc + 2 * L, a2);
    _mm256_storeu_ps(acc + 3 * L, a3), _mm256_storeu_ps(acc + 4 * L, a4);
}
#endif

/* sum[j] += the n rows' lane j (rows B values apart), in row order: the
 * lanes as 8-lane vectors (the loop over an array of sums stayed scalar),
 * cloned for AVX2 as the row kernels are. */
DT_CLONES static void row_sums(const float *restrict d, int64_t n, float *restrict sum, int L, int B)
{
    for (int g = 0; g + 8 <= L; g += 8) {
        blk_v8 a;
        memcpy(&a, sum + g, sizeof a);
        for (int64_t i = 0; i < n; i++) {
            blk_v8 v;
            memcpy(&v, d + i * B + g, sizeof v);
            a += v;
        }
        memcpy(sum + g, &a, sizeof a);
    }
}

bool dt__conv_c1_bwd_weights_blk_ok(const dt_k_conv2d_shape *s, int B)
{
    return (B == 8 || B == 16) && s->C == 1 && s->K % B == 0 && s->stride_h == 1 && s->stride_w == 1 &&
           s->dil_h == 1 && s->dil_w == 1 && s->R <= DT__C1_MAX_K && s->S <= DT__C1_MAX_K &&
           s->W + 2 * s->pad_w <= DT__C1_MAX_ROW;
}

void dt__conv_c1_bwd_weights_blk(const dt_k_conv2d_shape *s, int B, int64_t P, int64_t Q, const float *x,
                                 const float *dy, float *dw, float *dbias)
{
    const int64_t N = s->N, H = s->H, W = s->W, K = s->K, CB = K / B, R = s->R, S = s->S;
    const int64_t PQ = P * Q;
    int nt = dt__threads_for(N * K * PQ * R * S), L;
    int64_t units = dt__blk_units(CB, B, nt, &L), per = B / L, rs = 1;
#if DT__X86_VEC
    /* 16 lanes of 5 taps on AVX-512 (c1_row16x5_avx512): a block too few for
     * the threads is split by kernel rows instead of into half blocks */
    bool zmm = B == 16 && S == 5 && dt__vec_level() >= DT__VEC_AVX512;
    if (zmm && L < B && R > 1) {
        L = B, per = 1, rs = 2;
        units = CB * rs;
    }
    zmm = zmm && L == B; /* one kernel row in half blocks: 8-lane rows */
    /* fused multiply-adds for the 5-tap rows of Q >= 4 on every vector path
     * (c1_row5x8_fma, c1_row16x5_avx512), the same bits for both blocks */
    const bool fused = S == 5 && Q >= 4 && dt__vec_avx2();
#else
    const bool zmm = false;
#endif
    const int64_t rper = (R + rs - 1) / rs;
    if (nt > units)
        nt = (int)units;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t u = 0; u < units; u++) {
        const int64_t cb = u / (per * rs), w = u % (per * rs), off = (w / rs) * L, c0 = cb * B + off;
        const int64_t r0 = (w % rs) * rper, r1 = r0 + rper < R ? r0 + rper : R;
        const bool with_bias = dbias && r0 == 0; /* the bias once a channel: by its first rows' unit */
        float acc[DT__C1_MAX_K * DT__C1_MAX_K * MAXB], bias[MAXB] = {0}, row[DT__C1_MAX_ROW + DT__C1_MAX_K];
        memset(acc, 0, sizeof(float) * (size_t)(R * S * L));
        memset(row, 0, sizeof row);
        for (int64_t n = 0; n < N; n++) {
            const float *d = dy + (n * CB + cb) * PQ * B + off;
            for (int64_t p = 0; p < P; p++)
                for (int64_t r = r0; r < r1; r++) {
                    const int64_t h = p + r - s->pad_h;
                    if (h < 0 || h >= H)
                        continue;
                    /* the input row, zero-padded: xpad[q + s] = x[h][q + s - pad_w] */
                    memcpy(row + s->pad_w, x + (n * H + h) * W, (size_t)W * sizeof(float));
#if DT__X86_VEC
                    if (zmm) {
                        c1_row16x5_avx512(d + p * Q * B, row, Q, acc + r * S * L, fused);
                        continue;
                    }
                    if (fused) {
                        for (int g = 0; g < L; g += 8)
                            c1_row5x8_fma(d + p * Q * B + g, row, Q, acc + r * S * L + g, L, B);
                        continue;
                    }
#endif
                    if (L == 8 && B == 16)
                        c1_row8s16(d + p * Q * B, row, Q, (int)S, acc + r * S * L);
                    else if (B == 16)
                        c1_row16(d + p * Q * B, row, Q, (int)S, acc + r * S * L);
                    else
                        c1_row8(d + p * Q * B, row, Q, (int)S, acc + r * S * L);
                }
            if (with_bias)
                row_sums(d, PQ, bias, L, B);
        }
        /* dW is OIHW with I = 1: dw[(k * R + r) * S + s] */
        for (int64_t r = r0; r < r1; r++)
            for (int64_t t = 0; t < S; t++)
                for (int j = 0; j < L; j++)
                    dw[((c0 + j) * R + r) * S + t] = acc[(r * S + t) * L + j];
        if (with_bias)
            for (int j = 0; j < L; j++)
                dbias[c0 + j] = bias[j];
    }
}

/* ---- convolution backward weights, 8-channel blocks, 5 taps a row --------
 * oneDNN 2.6's jit:avx2 backward weights ran the ConvNet's second layer
 * (16 -> 32 channels, 5x5 on 14x14, nChw8c) at 87 GFLOP/s in the step
 * (ONEDNN_VERBOSE), where its forward and backward data reach 115-117; this
 * kernel takes 0.81-0.88 of its time (conv.c). Here, with x and dy both in
 * nChw8c: dW[k][c][r][t] = sum over n, p, q of dy[n][k][p][q] *
 * xpad[n][c][p + r][q + t], stride 1, dilation 1, S = 5. A unit is one
 * pair of input channels against one block of 8 output channels; its row
 * kernel keeps the 5 taps x 2 channels = 10 accumulators (enough
 * independent sums for two FMA pipes) and a sliding window of 5 dy vectors
 * in registers. Each thread takes a fixed range of units and walks the
 * samples in order, so every element is summed in n, then p, then q
 * order whatever the thread count. */

/* Two input rows x0, x1 (zero-padded, Q + 4 values) against one dy row:
 * acc holds [2][5][8], tap t of row i at acc + (i * 5 + t) * 8; each row
 * as c1_row5x8 (tap t's sum receives d[q] * x[q + t] for q in increasing
 * order). The portable path; cw_rows5x2_fma below is the AVX2 one. Q >= 4. */
DT_BODY void cw_row5x8x2(const float *restrict dyrow, const float *restrict x0, const float *restrict x1, int64_t Q,
                         float *restrict acc)
{
    c1_row5x8(dyrow, x0, Q, acc, 8);
    c1_row5x8(dyrow, x1, Q, acc + 40, 8);
}

/* One sample's part of a unit: the R kernel rows of channels c and c + 1
 * (xg: their zero-padded rows, [H][Wp] each, c + 1's after c's) against
 * output block kb's dy. */
DT_CLONES static void cw_sample(const float *restrict dyn, const float *restrict xg, int64_t H, int64_t Wp,
                                int64_t P, int64_t Q, int64_t R, int64_t pad_h, float *restrict acc)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t p = 0; p < P; p++) {
            const int64_t h = p + r - pad_h;
            if (h >= 0 && h < H)
                cw_row5x8x2(dyn + p * Q * 8, xg + h * Wp, xg + (H + h) * Wp, Q, acc + r * 80);
        }
}

#if DT__X86_VEC
/* cw_row5x8x2 with fused multiply-adds (AVX2 and FMA) over `rows`
 * consecutive rows (dy's rows Q * 8 apart, x's Wp apart), the accumulators
 * held in registers across them: the same products summed in the same
 * order, each rounded once instead of twice, and twice the rate (a multiply
 * and an add are two instructions on the FP pipes). pad2: the rows' first
 * two and last two values are padding (pad_w 2, so Q = W): their products
 * are zeros and are not made, as oneDNN makes none with padding. An
 * accumulator starts at +0 and never becomes -0 (x + y is -0 only when
 * both are), so adding a zero product never changes it: the same bits as
 * with them, unless dy holds an inf or NaN (which a zero then no longer
 * meets). */
DT__AVX2 static inline __attribute__((always_inline)) void
cw_rows5x2_fma(const float *restrict dyrow, const float *restrict x0, const float *restrict x1, int64_t rows,
               int64_t Q, int64_t Wp, float *restrict acc, const bool pad2)
{
    __m256 a0 = _mm256_loadu_ps(acc), a1 = _mm256_loadu_ps(acc + 8), a2 = _mm256_loadu_ps(acc + 16),
           a3 = _mm256_loadu_ps(acc + 24), a4 = _mm256_loadu_ps(acc + 32), b0 = _mm256_loadu_ps(acc + 40),
           b1 = _mm256_loadu_ps(acc + 48), b2 = _mm256_loadu_ps(acc + 56), b3 = _mm256_loadu_ps(acc + 64),
           b4 = _mm256_loadu_ps(acc + 72), w0, w1, w2, w3, w4, x;
#define CW_X(row, j) (x = _mm256_broadcast_ss((row) + (j)))
#define CW_D(j) (w0 = _mm256_loadu_ps(dyrow + (j) * 8))
#define CW_F(a, w) (a = _mm256_fmadd_ps(w, x, a))
    for (int64_t i = 0; i < rows; i++, dyrow += Q * 8, x0 += Wp, x1 += Wp) {
        CW_D(0);
        if (!pad2)
            CW_X(x0, 0), CW_F(a0, w0), CW_X(x1, 0), CW_F(b0, w0);
        w1 = w0, CW_D(1);
        if (!pad2) {
            CW_X(x0, 1), CW_F(a0, w0), CW_F(a1, w1);
            CW_X(x1, 1), CW_F(b0, w0), CW_F(b1, w1);
        }
        w2 = w1, w1 = w0, CW_D(2);
        CW_X(x0, 2), CW_F(a0, w0), CW_F(a1, w1), CW_F(a2, w2);
        CW_X(x1, 2), CW_F(b0, w0), CW_F(b1, w1), CW_F(b2, w2);
        w3 = w2, w2 = w1, w1 = w0, CW_D(3);
        CW_X(x0, 3), CW_F(a0, w0), CW_F(a1, w1), CW_F(a2, w2), CW_F(a3, w3);
        CW_X(x1, 3), CW_F(b0, w0), CW_F(b1, w1), CW_F(b2, w2), CW_F(b3, w3);
        for (int64_t j = 4; j < Q; j++) {
            w4 = w3, w3 = w2, w2 = w1, w1 = w0;
            CW_D(j);
            CW_X(x0, j), CW_F(a0, w0), CW_F(a1, w1), CW_F(a2, w2), CW_F(a3, w3), CW_F(a4, w4);
            CW_X(x1, j), CW_F(b0, w0), CW_F(b1, w1), CW_F(b2, w2), CW_F(b3, w3), CW_F(b4, w4);
        }
        CW_X(x0, Q), CW_F(a1, w0), CW_F(a2, w1), CW_F(a3, w2), CW_F(a4, w3);
        CW_X(x1, Q), CW_F(b1, w0), CW_F(b2, w1), CW_F(b3, w2), CW_F(b4, w3);
        CW_X(x0, Q + 1), CW_F(a2, w0), CW_F(a3, w1), CW_F(a4, w2);
        CW_X(x1, Q + 1), CW_F(b2, w0), CW_F(b3, w1), CW_F(b4, w2);
        if (!pad2) {
            CW_X(x0, Q + 2), CW_F(a3, w0), CW_F(a4, w1);
            CW_X(x1, Q + 2), CW_F(b3, w0), CW_F(b4, w1);
            CW_X(x0, Q + 3), CW_F(a4, w0);
            CW_X(x1, Q + 3), CW_F(b4, w0);
        }
    }
#undef CW_X
#undef CW_D
#undef CW_F
    _mm256_storeu_ps(acc, a0), _mm256_storeu_ps(acc + 8, a1), _mm256_storeu_ps(acc + 16, a2);
    _mm256_storeu_ps(acc + 24, a3), _mm256_storeu_ps(acc + 32, a4), _mm256_storeu_ps(acc + 40, b0);
    _mm256_storeu_ps(acc + 48, b1), _mm256_storeu_ps(acc + 56, b2), _mm256_storeu_ps(acc + 64, b3);
    _mm256_storeu_ps(acc + 72, b4);
}

/* cw_sample on fused multiply-adds: each kernel row r meets the input rows
 * h = p + r - pad_h inside the image, in p order, in one register pass. */
DT__AVX2 static void cw_sample_fma(const float *restrict dyn, const float *restrict xg, int64_t H, int64_t Wp,
                                   int64_t P, int64_t Q, int64_t R, int64_t pad_h, float *restrict acc, bool pad2)
{
    for (int64_t r = 0; r < R; r++) {
        const int64_t p0 = pad_h - r > 0 ? pad_h - r : 0, p1 = H + pad_h - r < P ? H + pad_h - r : P;
        if (p1 <= p0)
            continue;
        const float *d = dyn + p0 * Q * 8, *x0 = xg + (p0 + r - pad_h) * Wp, *x1 = x0 + H * Wp;
        if (pad2)
            cw_rows5x2_fma(d, x0, x1, p1 - p0, Q, Wp, acc + r * 80, true);
        else
            cw_rows5x2_fma(d, x0, x1, p1 - p0, Q, Wp, acc + r * 80, false);
    }
}
#endif

/* One sample's 8-channel block of x ([H][W][8]) into zero-padded rows
 * xg[8][H][Wp] (columns pad .. pad + W - 1; the others stay zero). */
static void cw_gather8(const float *restrict xb, int64_t H, int64_t W, int64_t Wp, int64_t pad, float *restrict xg)
{
    for (int c = 0; c < 8; c++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t w = 0; w < W; w++)
                xg[(c * H + h) * Wp + pad + w] = xb[(h * W + w) * 8 + c];
}

#if DT__X86_VEC
/* cw_gather8 with 8 x 8 transposes: 8 positions of a row at a time, the
 * last 8 overlapping the previous ones where W is not a multiple of 8. */
DT__AVX2 static void cw_gather8_avx2(const float *restrict xb, int64_t H, int64_t W, int64_t Wp, int64_t pad,
                                     float *restrict xg)
{
    if (W < 8) {
        cw_gather8(xb, H, W, Wp, pad, xg);
        return;
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t w0 = 0; w0 < W; w0 += 8) {
            const int64_t w = w0 + 8 <= W ? w0 : W - 8;
            const float *p = xb + (h * W + w) * 8;
            __m256 r0 = _mm256_loadu_ps(p), r1 = _mm256_loadu_ps(p + 8), r2 = _mm256_loadu_ps(p + 16),
                   r3 = _mm256_loadu_ps(p + 24), r4 = _mm256_loadu_ps(p + 32), r5 = _mm256_loadu_ps(p + 40),
                   r6 = _mm256_loadu_ps(p + 48), r7 = _mm256_loadu_ps(p + 56);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
                   t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                   t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee),
                   s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee),
                   s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee),
                   s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *o = xg + h * Wp + pad + w;
            const int64_t cs = H * Wp; /* one channel's rows */
            _mm256_storeu_ps(o, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_storeu_ps(o + cs, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_storeu_ps(o + 2 * cs, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_storeu_ps(o + 3 * cs, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_storeu_ps(o + 4 * cs, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_storeu_ps(o + 5 * cs, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_storeu_ps(o + 6 * cs, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_storeu_ps(o + 7 * cs, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
}
#endif

bool dt__conv_bwd_weights_blk8_ok(const dt_k_conv2d_shape *s, int64_t Q)
{
    return s->C % 8 == 0 && s->K % 8 == 0 && s->S == 5 && s->stride_h == 1 && s->stride_w == 1 && s->dil_h == 1 &&
           s->dil_w == 1 && Q >= 4;
}

size_t dt__conv_bwd_weights_blk8_scratch(const dt_k_conv2d_shape *s, int nt)
{
    return (size_t)(s->K * s->C * s->R * 5 + s->K + (int64_t)nt * 8 * s->H * (s->W + 2 * s->pad_w));
}

int dt__conv_bwd_weights_blk8_threads(const dt_k_conv2d_shape *s, int64_t P, int64_t Q)
{
    int nt = dt__threads_for(2 * s->N * s->K * s->C * s->R * 5 * P * Q);
    const int64_t units = s->C / 2 * (s->K / 8);
    return nt > units ? (int)units : nt;
}

void dt__conv_bwd_weights_blk8(const dt_k_conv2d_shape *s, int nt, int64_t P, int64_t Q, const float *x,
                               const float *dy, float *dw, float *dbias, float *scratch)
{
    const int64_t N = s->N, C = s->C, H = s->H, W = s->W, K = s->K, R = s->R, KB = K / 8, CB = C / 8;
    const int64_t Wp = W + 2 * s->pad_w, units = C / 2 * KB, per = R * 80;
    float *acc = scratch, *bias = acc + units * per, *gather = bias + K;
    memset(acc, 0, (size_t)(units * per + K) * sizeof(float));
    const bool fma = dt__vec_avx2();
#pragma omp parallel for schedule(static, 1) num_threads(nt)
    for (int64_t me = 0; me < nt; me++) {
        const int64_t u0 = units * me / nt, u1 = units * (me + 1) / nt;
        float *xg = gather + me * 8 * H * Wp; /* [8][H][Wp], zero-padded rows of one channel block */
        memset(xg, 0, (size_t)(8 * H * Wp) * sizeof(float));
        for (int64_t n = 0; n < N; n++) {
            int64_t have = -1;
            for (int64_t u = u0; u < u1; u++) {
                const int64_t cp = u / KB, kb = u % KB, c = 2 * cp;
                const float *dyn = dy + (n * KB + kb) * P * Q * 8, *xc = xg + (c % 8) * H * Wp;
                if (c / 8 != have) { /* the block holding channels c, c + 1 */
                    const float *xb = x + (n * CB + c / 8) * H * W * 8;
#if DT__X86_VEC
                    if (fma)
                        cw_gather8_avx2(xb, H, W, Wp, s->pad_w, xg);
                    else
#endif
                        cw_gather8(xb, H, W, Wp, s->pad_w, xg);
                    have = c / 8;
                }
#if DT__X86_VEC
                if (fma)
                    cw_sample_fma(dyn, xc, H, Wp, P, Q, R, s->pad_h, acc + u * per, s->pad_w == 2);
                else
#endif
                    cw_sample(dyn, xc, H, Wp, P, Q, R, s->pad_h, acc + u * per);
                if (dbias && cp == 0)
                    row_sums(dyn, P * Q, bias + kb * 8, 8, 8);
            }
        }
    }
    /* to OIHW: dw[((k * C + c) * R + r) * 5 + t] */
    for (int64_t u = 0; u < units; u++) {
        const int64_t cp = u / KB, kb = u % KB;
        for (int64_t r = 0; r < R; r++)
            for (int i = 0; i < 2; i++)
                for (int t = 0; t < 5; t++)
                    for (int j = 0; j < 8; j++)
                        dw[(((kb * 8 + j) * C + 2 * cp + i) * R + r) * 5 + t] =
                            acc[u * per + r * 80 + (i * 5 + t) * 8 + j];
    }
    if (dbias)
        memcpy(dbias, bias, (size_t)K * sizeof(float));
}
