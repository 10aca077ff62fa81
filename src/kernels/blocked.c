/* Plain-C kernels on the nChw8c layout ([N][C/8][HW][8], C % 8 == 0): the
 * conversions to and from NCHW, training batch norm, and max pooling. They
 * let the autograd layer keep convolution activations in the layout oneDNN's
 * direct kernels use, so a ConvNet step reorders only at its ends.
 *
 * Batch norm keeps the plain kernel's reduction order per channel: each
 * (n, c) row of HW values is summed in float in s order (here 8 channels
 * side by side, one lane each), the row sums in double in n order, so the
 * result is deterministic and matches the plain kernel to rounding. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>
#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

/* Per-block row kernels (8 channel lanes side by side), cloned for AVX2 as
 * the plain batch-norm rows are. */

DT_CLONES static void b8_moments(const float *restrict xp, int64_t HW, const float *restrict k, float *restrict r1,
                                 float *restrict r2)
{
    float a[8] = {0}, b[8] = {0};
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < 8; j++) {
            float d = xp[s * 8 + j] - k[j];
            a[j] += d;
            b[j] += d * d;
        }
    }
    memcpy(r1, a, sizeof a);
    memcpy(r2, b, sizeof b);
}

DT_CLONES static void b8_affine(const float *restrict xp, float *restrict yp, int64_t HW, const float *restrict m,
                                const float *restrict a, const float *restrict b)
{
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < 8; j++)
            yp[s * 8 + j] = (xp[s * 8 + j] - m[j]) * a[j] + b[j];
    }
}

DT_CLONES static void b8_bwd_sums(const float *restrict xp, const float *restrict gp, int64_t HW,
                                  const float *restrict m, float *restrict ra, float *restrict rb)
{
    float a[8] = {0}, b[8] = {0};
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < 8; j++) {
            float g = gp[s * 8 + j];
            a[j] += g;
            b[j] += g * (xp[s * 8 + j] - m[j]);
        }
    }
    memcpy(ra, a, sizeof a);
    memcpy(rb, b, sizeof b);
}

DT_CLONES static void b8_bwd_dx(const float *restrict xp, const float *restrict gp, float *restrict op, int64_t HW,
                                const float *restrict m, const float *restrict is, const float *restrict k,
                                const float *restrict mdy, const float *restrict mdyx)
{
    for (int64_t s = 0; s < HW; s++) {
#pragma omp simd
        for (int j = 0; j < 8; j++) {
            float xh = (xp[s * 8 + j] - m[j]) * is[j];
            op[s * 8 + j] = k[j] * (gp[s * 8 + j] - mdy[j] - xh * mdyx[j]);
        }
    }
}

/* 2x2 stride-2 unpadded max pool of one channel block: each output is 8
 * lanes (channels), two SSE halves; same rule as the scalar path (first max
 * in window order wins, NaN propagates). */
static void b8_max2x2(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                      int32_t *restrict ap)
{
    for (int64_t p = 0; p < P; p++)
        for (int64_t q = 0; q < Q; q++) {
            int32_t i0 = (int32_t)(2 * p * W + 2 * q);
            const float *c0 = xp + (int64_t)i0 * 8, *c1 = c0 + 8, *c2 = c0 + W * 8, *c3 = c2 + 8;
            float *y = yp + (p * Q + q) * 8;
            int32_t *a = ap + (p * Q + q) * 8;
#if defined(__SSE4_1__)
            for (int h = 0; h < 8; h += 4) {
                __m128 m = _mm_loadu_ps(c0 + h);
                __m128i im = _mm_set1_epi32(i0);
                const float *cs[3] = {c1, c2, c3};
                const int32_t off[3] = {1, (int32_t)W, (int32_t)W + 1};
                for (int k = 0; k < 3; k++) {
                    __m128 v = _mm_loadu_ps(cs[k] + h);
                    __m128 t = _mm_or_ps(_mm_cmpgt_ps(v, m), _mm_and_ps(_mm_cmpunord_ps(v, v), _mm_cmpord_ps(m, m)));
                    m = _mm_blendv_ps(m, v, t);
                    im = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(im),
                                                        _mm_castsi128_ps(_mm_set1_epi32(i0 + off[k])), t));
                }
                _mm_storeu_ps(y + h, m);
                _mm_storeu_si128((__m128i *)(void *)(a + h), im);
            }
#else
            for (int j = 0; j < 8; j++) {
                float mx = c0[j], v;
                int32_t bi = i0;
                const float *cs[3] = {c1, c2, c3};
                const int32_t off[3] = {1, (int32_t)W, (int32_t)W + 1};
                for (int k = 0; k < 3; k++) {
                    v = cs[k][j];
                    bool t = (v > mx) | ((v != v) & (mx == mx)); /* NaN propagates */
                    mx = t ? v : mx;
                    bi = t ? i0 + off[k] : bi;
                }
                y[j] = mx;
                a[j] = bi;
            }
#endif
        }
}

static dt_status b8_check(const char *fn, const void *x, const void *y, int64_t N, int64_t C, int64_t HW)
{
    if (N < 0 || C < 0 || HW < 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: negative size N=%lld C=%lld HW=%lld", fn, (long long)N,
                        (long long)C, (long long)HW);
    if (C % 8)
        return dt_error(DT_ERR_INVALID_ARG, "%s: nChw8c needs C %% 8 == 0, got C=%lld", fn, (long long)C);
    DT__CHECK_PTR(fn, x, N * C * HW);
    DT__CHECK_PTR(fn, y, N * C * HW);
    return DT_OK;
}

dt_status dt_k_to_blocked8(const float *x, int64_t N, int64_t C, int64_t HW, float *y)
{
    dt_status st = b8_check("dt_k_to_blocked8", x, y, N, C, HW);
    if (st < 0)
        return st;
    int64_t CB = C / 8;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xp = x + nb * 8 * HW;
        float *yp = y + nb * 8 * HW;
        for (int64_t s = 0; s < HW; s++)
            for (int j = 0; j < 8; j++)
                yp[s * 8 + j] = xp[j * HW + s];
    }
    if (N * C * HW > 0)
        dt__stats_reorder();
    return DT_OK;
}

dt_status dt_k_from_blocked8(const float *x, int64_t N, int64_t C, int64_t HW, float *y)
{
    dt_status st = b8_check("dt_k_from_blocked8", x, y, N, C, HW);
    if (st < 0)
        return st;
    int64_t CB = C / 8;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t nb = 0; nb < N * CB; nb++) {
        const float *xp = x + nb * 8 * HW;
        float *yp = y + nb * 8 * HW;
        for (int j = 0; j < 8; j++)
            for (int64_t s = 0; s < HW; s++)
                yp[j * HW + s] = xp[s * 8 + j];
    }
    if (N * C * HW > 0)
        dt__stats_reorder();
    return DT_OK;
}

dt_status dt_k_batchnorm_train_fwd_b8(const float *x, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                      const float *beta, float eps, float momentum, float *running_mean,
                                      float *running_var, float *y, float *save_mean, float *save_invstd)
{
    const char *fn = "dt_k_batchnorm_train_fwd_b8";
    dt_status st = b8_check(fn, x, y, N, C, HW);
    if (st < 0)
        return st;
    if (C == 0)
        return DT_OK;
    int64_t cnt = N * HW;
    if ((st = dt__bn_train_args(fn, cnt, eps)) < 0)
        return st;
    int64_t CB = C / 8;
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t cb = 0; cb < CB; cb++) {
        float k[8], fm[8], a[8], b[8];
        double s1[8] = {0}, s2[8] = {0};
        for (int j = 0; j < 8; j++)
            k[j] = x[cb * HW * 8 + j]; /* first value of the channel (n = 0, s = 0) */
        for (int64_t n = 0; n < N; n++) {
            float r1[8], r2[8];
            b8_moments(x + (n * CB + cb) * HW * 8, HW, k, r1, r2);
            for (int j = 0; j < 8; j++) {
                s1[j] += (double)r1[j];
                s2[j] += (double)r2[j];
            }
        }
        for (int j = 0; j < 8; j++)
            dt__bn_finish_channel(cb * 8 + j, s1[j], s2[j], k[j], cnt, eps, momentum, gamma, beta, running_mean,
                                  running_var, save_mean, save_invstd, &fm[j], &a[j], &b[j]);
        for (int64_t n = 0; n < N; n++)
            b8_affine(x + (n * CB + cb) * HW * 8, y + (n * CB + cb) * HW * 8, HW, fm, a, b);
    }
    return DT_OK;
}

dt_status dt_k_batchnorm_bwd_b8(const float *x, const float *dy, int64_t N, int64_t C, int64_t HW, const float *gamma,
                                const float *save_mean, const float *save_invstd, float *dx, float *dgamma,
                                float *dbeta)
{
    const char *fn = "dt_k_batchnorm_bwd_b8";
    dt_status st = b8_check(fn, x, dy, N, C, HW);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, save_mean, C);
    DT__CHECK_PTR(fn, save_invstd, C);
    int64_t cnt = N * HW, CB = C / 8;
    if (cnt == 0) {
        for (int64_t c = 0; c < C; c++) {
            if (dgamma)
                dgamma[c] = 0.0f;
            if (dbeta)
                dbeta[c] = 0.0f;
        }
        return DT_OK;
    }
    int nt = dt__threads_for(N * C * HW);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t cb = 0; cb < CB; cb++) {
        float m[8], is[8], k[8], mdy[8], mdyx[8];
        double sdy[8] = {0}, sdyx[8] = {0};
        for (int j = 0; j < 8; j++) {
            m[j] = save_mean[cb * 8 + j];
            is[j] = save_invstd[cb * 8 + j];
        }
        for (int64_t n = 0; n < N; n++) {
            float ra[8], rb[8];
            b8_bwd_sums(x + (n * CB + cb) * HW * 8, dy + (n * CB + cb) * HW * 8, HW, m, ra, rb);
            for (int j = 0; j < 8; j++) {
                sdy[j] += (double)ra[j];
                sdyx[j] += (double)rb[j];
            }
        }
        for (int j = 0; j < 8; j++) {
            int64_t c = cb * 8 + j;
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
        for (int64_t n = 0; n < N; n++) {
            int64_t o = (n * CB + cb) * HW * 8;
            b8_bwd_dx(x + o, dy + o, dx + o, HW, m, is, k, mdy, mdyx);
        }
    }
    return DT_OK;
}

static dt_status pool_b8_check(const char *fn, const dt_k_pool2d_shape *s, int64_t *P, int64_t *Q, const void *a,
                               const void *b)
{
    dt_status st = dt_k_pool2d_out_size(s, P, Q);
    if (st < 0)
        return dt_error_wrap(st, "%s", fn);
    if (s->C % 8)
        return dt_error(DT_ERR_INVALID_ARG, "%s: nChw8c needs C %% 8 == 0, got C=%lld", fn, (long long)s->C);
    if (s->H * s->W > INT32_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: plane of %lld elements exceeds int32 argmax", fn,
                        (long long)(s->H * s->W));
    DT__CHECK_PTR(fn, a, s->N * s->C);
    DT__CHECK_PTR(fn, b, s->N * s->C);
    return DT_OK;
}

dt_status dt_k_maxpool2d_fwd_b8(const dt_k_pool2d_shape *s, const float *x, float *y, int32_t *argmax)
{
    const char *fn = "dt_k_maxpool2d_fwd_b8";
    int64_t P, Q;
    dt_status st = pool_b8_check(fn, s, &P, &Q, x, y);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, blocks = s->N * (s->C / 8);
    int nt = dt__threads_for(blocks * 8 * H * W);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t bl = 0; bl < blocks; bl++) {
        const float *xp = x + bl * H * W * 8;
        float *yp = y + bl * P * Q * 8;
        int32_t *ap = argmax ? argmax + bl * P * Q * 8 : NULL;
        if (ap && s->kh == 2 && s->kw == 2 && s->sh == 2 && s->sw == 2 && s->ph == 0 && s->pw == 0) {
            b8_max2x2(xp, W, P, Q, yp, ap);
            continue;
        }
        for (int64_t p = 0; p < P; p++) {
            int64_t h0, h1;
            dt__pool_window(p, s->sh, s->ph, s->kh, H, &h0, &h1);
            for (int64_t q = 0; q < Q; q++) {
                int64_t w0, w1;
                dt__pool_window(q, s->sw, s->pw, s->kw, W, &w0, &w1);
                float m[8];
                int32_t best[8];
                for (int j = 0; j < 8; j++) {
                    m[j] = xp[(h0 * W + w0) * 8 + j];
                    best[j] = (int32_t)(h0 * W + w0);
                }
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        for (int j = 0; j < 8; j++) {
                            float v = xp[(h * W + w) * 8 + j];
                            bool take = (v > m[j]) | ((v != v) & (m[j] == m[j])); /* NaN propagates */
                            m[j] = take ? v : m[j];
                            best[j] = take ? (int32_t)(h * W + w) : best[j];
                        }
                for (int j = 0; j < 8; j++) {
                    yp[(p * Q + q) * 8 + j] = m[j];
                    if (ap)
                        ap[(p * Q + q) * 8 + j] = best[j];
                }
            }
        }
    }
    return DT_OK;
}

dt_status dt_k_maxpool2d_bwd_b8(const dt_k_pool2d_shape *s, const float *dy, const int32_t *argmax, float *dx)
{
    const char *fn = "dt_k_maxpool2d_bwd_b8";
    int64_t P, Q;
    dt_status st = pool_b8_check(fn, s, &P, &Q, dy, dx);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, argmax, s->N * s->C);
    int64_t H = s->H, W = s->W, blocks = s->N * (s->C / 8);
    int nt = dt__threads_for(blocks * 8 * H * W);
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t bl = 0; bl < blocks; bl++) {
        float *xp = dx + bl * H * W * 8;
        const float *gp = dy + bl * P * Q * 8;
        const int32_t *ap = argmax + bl * P * Q * 8;
        memset(xp, 0, (size_t)(H * W * 8) * sizeof(float));
        for (int64_t i = 0; i < P * Q; i++)
            for (int j = 0; j < 8; j++) {
                int32_t a = ap[i * 8 + j];
                if (a < 0 || a >= H * W) {
                    bad = 1;
                    continue;
                }
                xp[(int64_t)a * 8 + j] += gp[i * 8 + j];
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
 * nChw8c the product is natural: dW[k][r][s] = sum over n, p, q of
 * dy[n][k][p][q] * xpad[n][p + r][q + s] (stride 1, dilation 1), eight
 * output channels per vector, one input row at a time against S
 * accumulators. Work is split over channel blocks only, so every element is
 * summed in the same order (n, then p, then q) whatever the thread count. */
DT_CLONES static void c1_row(const float *restrict dyrow, const float *restrict xrow, int64_t Q, int S,
                             float *restrict acc)
{
    if (S == 5) { /* the common 5x5 case, accumulators in registers */
        float a0[8], a1[8], a2[8], a3[8], a4[8];
        memcpy(a0, acc, sizeof a0);
        memcpy(a1, acc + 8, sizeof a1);
        memcpy(a2, acc + 16, sizeof a2);
        memcpy(a3, acc + 24, sizeof a3);
        memcpy(a4, acc + 32, sizeof a4);
        for (int64_t q = 0; q < Q; q++) {
            const float *d = dyrow + q * 8;
            const float x0 = xrow[q], x1 = xrow[q + 1], x2 = xrow[q + 2], x3 = xrow[q + 3], x4 = xrow[q + 4];
#pragma omp simd
            for (int j = 0; j < 8; j++) {
                a0[j] += d[j] * x0;
                a1[j] += d[j] * x1;
                a2[j] += d[j] * x2;
                a3[j] += d[j] * x3;
                a4[j] += d[j] * x4;
            }
        }
        memcpy(acc, a0, sizeof a0);
        memcpy(acc + 8, a1, sizeof a1);
        memcpy(acc + 16, a2, sizeof a2);
        memcpy(acc + 24, a3, sizeof a3);
        memcpy(acc + 32, a4, sizeof a4);
        return;
    }
    for (int64_t q = 0; q < Q; q++)
        for (int s = 0; s < S; s++) {
            const float xv = xrow[q + s];
#pragma omp simd
            for (int j = 0; j < 8; j++)
                acc[s * 8 + j] += dyrow[q * 8 + j] * xv;
        }
}

bool dt__conv_c1_bwd_weights_b8_ok(const dt_k_conv2d_shape *s)
{
    return s->C == 1 && s->K % 8 == 0 && s->stride_h == 1 && s->stride_w == 1 && s->dil_h == 1 && s->dil_w == 1 &&
           s->R <= DT__C1_MAX_K && s->S <= DT__C1_MAX_K && s->W + 2 * s->pad_w <= DT__C1_MAX_ROW;
}

void dt__conv_c1_bwd_weights_b8(const dt_k_conv2d_shape *s, int64_t P, int64_t Q, const float *x, const float *dy,
                                float *dw, float *dbias)
{
    const int64_t N = s->N, H = s->H, W = s->W, K = s->K, CB = K / 8, R = s->R, S = s->S;
    const int64_t PQ = P * Q;
    int nt = dt__threads_for(N * K * PQ * R * S);
    if (nt > CB)
        nt = (int)CB;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t cb = 0; cb < CB; cb++) {
        float acc[DT__C1_MAX_K * DT__C1_MAX_K * 8], bias[8] = {0}, row[DT__C1_MAX_ROW + DT__C1_MAX_K];
        memset(acc, 0, sizeof(float) * (size_t)(R * S * 8));
        memset(row, 0, sizeof row);
        for (int64_t n = 0; n < N; n++) {
            const float *d = dy + (n * CB + cb) * PQ * 8;
            for (int64_t p = 0; p < P; p++)
                for (int64_t r = 0; r < R; r++) {
                    const int64_t h = p + r - s->pad_h;
                    if (h < 0 || h >= H)
                        continue;
                    /* the input row, zero-padded: xpad[q + s] = x[h][q + s - pad_w] */
                    memcpy(row + s->pad_w, x + (n * H + h) * W, (size_t)W * sizeof(float));
                    c1_row(d + p * Q * 8, row, Q, (int)S, acc + r * S * 8);
                }
            if (dbias)
                for (int64_t i = 0; i < PQ; i++)
                    for (int j = 0; j < 8; j++)
                        bias[j] += d[i * 8 + j];
        }
        /* dW is OIHW with I = 1: dw[(k * R + r) * S + s] */
        for (int64_t r = 0; r < R; r++)
            for (int64_t t = 0; t < S; t++)
                for (int j = 0; j < 8; j++)
                    dw[((cb * 8 + j) * R + r) * S + t] = acc[(r * S + t) * 8 + j];
        if (dbias)
            for (int j = 0; j < 8; j++)
                dbias[cb * 8 + j] = bias[j];
    }
}
