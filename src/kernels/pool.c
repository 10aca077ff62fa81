/* Max and average pooling, NCHW, floor mode (PyTorch defaults).
 *
 * One (n, c) plane per task; the backward of max pooling scatters inside a
 * plane serially (a fixed order when windows overlap), planes in parallel.
 * With padding <= half the window (checked, as PyTorch requires) every
 * floor-mode window ends inside the padded input, so count_include_pad
 * divides by kh*kw and the exclusive count only drops padding. */
#include "kernels_impl.h"

#include <string.h>

#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

dt_status dt_k_pool2d_out_size(const dt_k_pool2d_shape *s, int64_t *P, int64_t *Q)
{
    const char *fn = "pool2d";
    if (!s)
        return dt_error(DT_ERR_NULL, "%s: shape is NULL", fn);
    if (s->N < 0 || s->C < 0 || s->H < 1 || s->W < 1 || s->kh < 1 || s->kw < 1 || s->sh < 1 || s->sw < 1 ||
        s->ph < 0 || s->pw < 0)
        return dt_error(DT_ERR_INVALID_ARG,
                        "%s: bad shape N=%lld C=%lld H=%lld W=%lld window %lldx%lld stride %lldx%lld pad %lldx%lld",
                        fn, (long long)s->N, (long long)s->C, (long long)s->H, (long long)s->W, (long long)s->kh,
                        (long long)s->kw, (long long)s->sh, (long long)s->sw, (long long)s->ph, (long long)s->pw);
    if (2 * s->ph > s->kh || 2 * s->pw > s->kw)
        return dt_error(DT_ERR_INVALID_ARG, "%s: padding %lldx%lld must be at most half the window %lldx%lld", fn,
                        (long long)s->ph, (long long)s->pw, (long long)s->kh, (long long)s->kw);
    if (s->H + 2 * s->ph < s->kh || s->W + 2 * s->pw < s->kw)
        return dt_error(DT_ERR_SHAPE, "%s: window %lldx%lld larger than padded input %lldx%lld", fn,
                        (long long)s->kh, (long long)s->kw, (long long)(s->H + 2 * s->ph),
                        (long long)(s->W + 2 * s->pw));
    if (P)
        *P = (s->H + 2 * s->ph - s->kh) / s->sh + 1;
    if (Q)
        *Q = (s->W + 2 * s->pw - s->kw) / s->sw + 1;
    return DT_OK;
}

static dt_status pool_check(const char *fn, const dt_k_pool2d_shape *s, int64_t *P, int64_t *Q, const void *a,
                            const void *b)
{
    dt_status st = dt_k_pool2d_out_size(s, P, Q);
    if (st < 0)
        return dt_error_wrap(st, "%s", fn);
    int64_t n = s->N * s->C;
    DT__CHECK_PTR(fn, a, n);
    DT__CHECK_PTR(fn, b, n);
    return DT_OK;
}

/* The common 2x2 stride-2 unpadded window, branch-free (random data makes
 * compare-and-branch code mispredict half the time). Ties keep the first
 * element in row-major window order, NaN wins, as the general path. */
#if defined(__SSE4_1__)
/* (v > m) or (v is NaN and m is not): the "take v" mask, as the scalar rule. */
static inline __m128 take_mask(__m128 v, __m128 m)
{
    return _mm_or_ps(_mm_cmpgt_ps(v, m), _mm_and_ps(_mm_cmpunord_ps(v, v), _mm_cmpord_ps(m, m)));
}
#endif

static void max2x2_plane(const float *restrict xp, int64_t W, int64_t P, int64_t Q, float *restrict yp,
                         int32_t *restrict ap)
{
    for (int64_t p = 0; p < P; p++) {
        const float *r0 = xp + 2 * p * W, *r1 = r0 + W;
        int32_t base = (int32_t)(2 * p * W), w32 = (int32_t)W;
        float *yr = yp + p * Q;
        int32_t *ar = ap ? ap + p * Q : NULL;
        int64_t q = 0;
#if defined(__SSE4_1__)
        /* four outputs at a time: deinterleave even/odd columns of both rows */
        for (; q + 4 <= Q; q += 4) {
            __m128 u0 = _mm_loadu_ps(r0 + 2 * q), u1 = _mm_loadu_ps(r0 + 2 * q + 4);
            __m128 v0 = _mm_loadu_ps(r1 + 2 * q), v1 = _mm_loadu_ps(r1 + 2 * q + 4);
            __m128 a = _mm_shuffle_ps(u0, u1, _MM_SHUFFLE(2, 0, 2, 0));
            __m128 b = _mm_shuffle_ps(u0, u1, _MM_SHUFFLE(3, 1, 3, 1));
            __m128 c = _mm_shuffle_ps(v0, v1, _MM_SHUFFLE(2, 0, 2, 0));
            __m128 d = _mm_shuffle_ps(v0, v1, _MM_SHUFFLE(3, 1, 3, 1));
            __m128i ia = _mm_add_epi32(_mm_set1_epi32(base + 2 * (int32_t)q), _mm_setr_epi32(0, 2, 4, 6));
            __m128 t = take_mask(b, a);
            __m128 m = _mm_blendv_ps(a, b, t);
            __m128i im = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(ia),
                                                         _mm_castsi128_ps(_mm_add_epi32(ia, _mm_set1_epi32(1))), t));
            t = take_mask(c, m);
            m = _mm_blendv_ps(m, c, t);
            im = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(im),
                                                _mm_castsi128_ps(_mm_add_epi32(ia, _mm_set1_epi32(w32))), t));
            t = take_mask(d, m);
            m = _mm_blendv_ps(m, d, t);
            im = _mm_castps_si128(_mm_blendv_ps(_mm_castsi128_ps(im),
                                                _mm_castsi128_ps(_mm_add_epi32(ia, _mm_set1_epi32(w32 + 1))), t));
            _mm_storeu_ps(yr + q, m);
            if (ar)
                _mm_storeu_si128((__m128i *)(ar + q), im);
        }
#endif
        for (; q < Q; q++) {
            float a = r0[2 * q], b = r0[2 * q + 1], c = r1[2 * q], d = r1[2 * q + 1];
            int32_t ia = base + 2 * (int32_t)q;
            bool t = (b > a) | ((b != b) & (a == a));
            float m = t ? b : a;
            int32_t im = t ? ia + 1 : ia;
            t = (c > m) | ((c != c) & (m == m));
            m = t ? c : m;
            im = t ? ia + w32 : im;
            t = (d > m) | ((d != d) & (m == m));
            m = t ? d : m;
            im = t ? ia + w32 + 1 : im;
            yr[q] = m;
            if (ar)
                ar[q] = im;
        }
    }
}

dt_status dt_k_maxpool2d_fwd(const dt_k_pool2d_shape *s, const float *x, float *y, int32_t *argmax)
{
    const char *fn = "dt_k_maxpool2d_fwd";
    int64_t P, Q;
    dt_status st = pool_check(fn, s, &P, &Q, x, y);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, planes = s->N * s->C;
    if (H * W > INT32_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: plane of %lld elements exceeds int32 argmax", fn,
                        (long long)(H * W));
    int nt = dt__threads_for(planes * H * W);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * H * W;
        float *yp = y + pl * P * Q;
        int32_t *ap = argmax ? argmax + pl * P * Q : NULL;
        if (s->kh == 2 && s->kw == 2 && s->sh == 2 && s->sw == 2 && s->ph == 0 && s->pw == 0) {
            max2x2_plane(xp, W, P, Q, yp, ap);
            continue;
        }
        for (int64_t p = 0; p < P; p++) {
            int64_t h0, h1;
            dt__pool_window(p, s->sh, s->ph, s->kh, H, &h0, &h1);
            for (int64_t q = 0; q < Q; q++) {
                int64_t w0, w1;
                dt__pool_window(q, s->sw, s->pw, s->kw, W, &w0, &w1);
                float m = xp[h0 * W + w0];
                int64_t best = h0 * W + w0;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        float v = xp[h * W + w];
                        bool take = (v > m) | ((v != v) & (m == m)); /* NaN propagates, as PyTorch */
                        m = take ? v : m;
                        best = take ? h * W + w : best;
                    }
                yp[p * Q + q] = m;
                if (ap)
                    ap[p * Q + q] = (int32_t)best;
            }
        }
    }
    return DT_OK;
}

dt_status dt_k_maxpool2d_bwd(const dt_k_pool2d_shape *s, const float *dy, const int32_t *argmax, float *dx)
{
    const char *fn = "dt_k_maxpool2d_bwd";
    int64_t P, Q;
    dt_status st = pool_check(fn, s, &P, &Q, dy, dx);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, planes = s->N * s->C;
    DT__CHECK_PTR(fn, argmax, planes);
    int nt = dt__threads_for(planes * H * W);
    int bad = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(| : bad)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *xp = dx + pl * H * W;
        const float *gp = dy + pl * P * Q;
        const int32_t *ap = argmax + pl * P * Q;
        memset(xp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t i = 0; i < P * Q; i++) {
            int32_t a = ap[i];
            if (a < 0 || a >= H * W) {
                bad = 1;
                continue;
            }
            xp[a] += gp[i];
        }
    }
    if (bad)
        return dt_error(DT_ERR_RANGE, "%s: argmax index outside the %lldx%lld plane", fn, (long long)H, (long long)W);
    return DT_OK;
}

dt_status dt_k_avgpool2d_fwd(const dt_k_pool2d_shape *s, const float *x, float *y, bool include_pad)
{
    const char *fn = "dt_k_avgpool2d_fwd";
    int64_t P, Q;
    dt_status st = pool_check(fn, s, &P, &Q, x, y);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, planes = s->N * s->C;
    int nt = dt__threads_for(planes * H * W);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = x + pl * H * W;
        float *yp = y + pl * P * Q;
        for (int64_t p = 0; p < P; p++) {
            int64_t h0, h1;
            dt__pool_window(p, s->sh, s->ph, s->kh, H, &h0, &h1);
            for (int64_t q = 0; q < Q; q++) {
                int64_t w0, w1;
                dt__pool_window(q, s->sw, s->pw, s->kw, W, &w0, &w1);
                float acc = 0.0f;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        acc += xp[h * W + w];
                int64_t cnt = include_pad ? s->kh * s->kw : (h1 - h0) * (w1 - w0);
                yp[p * Q + q] = acc / (float)cnt;
            }
        }
    }
    return DT_OK;
}

dt_status dt_k_avgpool2d_bwd(const dt_k_pool2d_shape *s, const float *dy, float *dx, bool include_pad)
{
    const char *fn = "dt_k_avgpool2d_bwd";
    int64_t P, Q;
    dt_status st = pool_check(fn, s, &P, &Q, dy, dx);
    if (st < 0)
        return st;
    int64_t H = s->H, W = s->W, planes = s->N * s->C;
    int nt = dt__threads_for(planes * H * W);
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *xp = dx + pl * H * W;
        const float *gp = dy + pl * P * Q;
        memset(xp, 0, (size_t)(H * W) * sizeof(float));
        for (int64_t p = 0; p < P; p++) {
            int64_t h0, h1;
            dt__pool_window(p, s->sh, s->ph, s->kh, H, &h0, &h1);
            for (int64_t q = 0; q < Q; q++) {
                int64_t w0, w1;
                dt__pool_window(q, s->sw, s->pw, s->kw, W, &w0, &w1);
                int64_t cnt = include_pad ? s->kh * s->kw : (h1 - h0) * (w1 - w0);
                float g = gp[p * Q + q] / (float)cnt;
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++)
                        xp[h * W + w] += g;
            }
        }
    }
    return DT_OK;
}
