/* Convolution through oneDNN: forward against a naive loop for strides,
 * padding and dilation, against PyTorch reference values, finite-difference
 * checks of both backward kernels, the primitive cache, bad arguments. */
#include "dtrain/kernels.h"
#include "kernels/kernels_impl.h"
#include "test.h"

static void fill(float *x, int64_t n, uint64_t seed)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 3, 4), 0, x, (size_t)n, -1.0f, 1.0f);
}

static void ref_conv(const dt_k_conv2d_shape *s, const float *x, const float *w, const float *b, float *y)
{
    int64_t P, Q;
    dt_k_conv2d_out_size(s, &P, &Q);
    for (int64_t n = 0; n < s->N; n++)
        for (int64_t k = 0; k < s->K; k++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++) {
                    double acc = b ? b[k] : 0.0;
                    for (int64_t c = 0; c < s->C; c++)
                        for (int64_t r = 0; r < s->R; r++)
                            for (int64_t t = 0; t < s->S; t++) {
                                int64_t h = p * s->stride_h - s->pad_h + r * s->dil_h;
                                int64_t v = q * s->stride_w - s->pad_w + t * s->dil_w;
                                if (h < 0 || h >= s->H || v < 0 || v >= s->W)
                                    continue;
                                acc += (double)x[((n * s->C + c) * s->H + h) * s->W + v] *
                                       w[((k * s->C + c) * s->R + r) * s->S + t];
                            }
                    y[((n * s->K + k) * P + p) * Q + q] = (float)acc;
                }
}

static dt_k_conv2d_shape shapes[4];
static void init_shapes(void)
{
    shapes[0] = dt_k_conv2d_shape_make(2, 3, 9, 8, 4, 3, 3);
    shapes[1] = dt_k_conv2d_shape_make(2, 8, 7, 6, 3, 5, 5); /* C = 8: blocked backward in auto mode */
    shapes[1].pad_h = shapes[1].pad_w = 2; /* the ConvNet's 5x5 pad 2 */
    shapes[2] = dt_k_conv2d_shape_make(1, 2, 10, 9, 3, 3, 2);
    shapes[2].stride_h = 2, shapes[2].stride_w = 3, shapes[2].pad_h = 1, shapes[2].pad_w = 0;
    shapes[3] = dt_k_conv2d_shape_make(2, 2, 12, 11, 2, 3, 3);
    shapes[3].dil_h = 2, shapes[3].dil_w = 3, shapes[3].pad_h = 2, shapes[3].pad_w = 1, shapes[3].stride_h = 2;
}

static int64_t xsz(const dt_k_conv2d_shape *s) { return s->N * s->C * s->H * s->W; }
static int64_t wsz(const dt_k_conv2d_shape *s) { return s->K * s->C * s->R * s->S; }
static int64_t ysz(const dt_k_conv2d_shape *s)
{
    int64_t P, Q;
    dt_k_conv2d_out_size(s, &P, &Q);
    return s->N * s->K * P * Q;
}

/* The weight and bias gradients in double: ref[0 .. K*C*R*S) OIHW, then
 * ref[K*C*R*S + k] = the bias gradient of channel k. x, dy plain NCHW. */
static void ref_bwd_weights(const dt_k_conv2d_shape *s, int64_t P, int64_t Q, const float *x, const float *dy,
                            double *ref)
{
    const int64_t nw = wsz(s);
    for (int64_t k = 0; k < s->K; k++) {
        for (int64_t c = 0; c < s->C; c++)
            for (int64_t r = 0; r < s->R; r++)
                for (int64_t t = 0; t < s->S; t++) {
                    double acc = 0;
                    for (int64_t n = 0; n < s->N; n++)
                        for (int64_t p = 0; p < P; p++)
                            for (int64_t q = 0; q < Q; q++) {
                                int64_t h = p - s->pad_h + r, v = q - s->pad_w + t;
                                if (h >= 0 && h < s->H && v >= 0 && v < s->W)
                                    acc += (double)dy[((n * s->K + k) * P + p) * Q + q] *
                                           x[((n * s->C + c) * s->H + h) * s->W + v];
                            }
                    ref[((k * s->C + c) * s->R + r) * s->S + t] = acc;
                }
        double bsum = 0;
        for (int64_t n = 0; n < s->N; n++)
            for (int64_t pq = 0; pq < P * Q; pq++)
                bsum += dy[(n * s->K + k) * P * Q + pq];
        ref[nw + k] = bsum;
    }
}

TEST(conv_fwd_vs_naive)
{
    for (int i = 0; i < 4; i++) {
        const dt_k_conv2d_shape *s = &shapes[i];
        float *x = dt_alloc(xsz(s) * 4), *w = dt_alloc(wsz(s) * 4), *b = dt_alloc(s->K * 4),
              *y = dt_alloc(ysz(s) * 4), *r = dt_alloc(ysz(s) * 4);
        fill(x, xsz(s), 1);
        fill(w, wsz(s), 2);
        fill(b, s->K, 3);
        for (int hb = 0; hb < 2; hb++) {
            ASSERT_OK(dt_k_conv2d_fwd(s, x, w, hb ? b : NULL, y));
            ref_conv(s, x, w, hb ? b : NULL, r);
            for (int64_t j = 0; j < ysz(s); j++)
                if (!(fabsf(y[j] - r[j]) <= 1e-4f))
                    TEST_FAIL_("shape %d bias %d: y[%lld] = %g, want %g", i, hb, (long long)j, (double)y[j],
                               (double)r[j]);
        }
        dt_free(x);
        dt_free(w);
        dt_free(b);
        dt_free(y);
        dt_free(r);
    }
}

/* L = sum(y * g) for a fixed random g: dL/dx and dL/dw by central differences
 * (in double through the naive forward, which conv_fwd_vs_naive shows equal
 * to the kernel's forward) against the backward kernels. */
TEST(conv_bwd_finite_difference)
{
    for (int i = 0; i < 4; i++) {
        const dt_k_conv2d_shape *s = &shapes[i];
        int64_t nx = xsz(s), nw = wsz(s), ny = ysz(s);
        float *x = dt_alloc(nx * 4), *w = dt_alloc(nw * 4), *g = dt_alloc(ny * 4), *y = dt_alloc(ny * 4),
              *dx = dt_alloc(nx * 4), *dw = dt_alloc(nw * 4), db[8];
        fill(x, nx, 5);
        fill(w, nw, 6);
        fill(g, ny, 7);
        ASSERT_OK(dt_k_conv2d_bwd_data(s, g, w, dx));
        ASSERT_OK(dt_k_conv2d_bwd_weights(s, x, g, dw, db));
        /* the loss is linear in x and in w, so differences are exact up to rounding */
        const float h = 0.5f;
        for (int64_t j = 0; j < nx; j += 3) {
            float keep = x[j];
            double lp = 0, lm = 0;
            x[j] = keep + h;
            ref_conv(s, x, w, NULL, y);
            for (int64_t t = 0; t < ny; t++)
                lp += (double)y[t] * g[t];
            x[j] = keep - h;
            ref_conv(s, x, w, NULL, y);
            for (int64_t t = 0; t < ny; t++)
                lm += (double)y[t] * g[t];
            x[j] = keep;
            ASSERT_NEAR(dx[j], (lp - lm) / (2 * h), 2e-4, 1e-4);
        }
        for (int64_t j = 0; j < nw; j += 2) {
            float keep = w[j];
            double lp = 0, lm = 0;
            w[j] = keep + h;
            ref_conv(s, x, w, NULL, y);
            for (int64_t t = 0; t < ny; t++)
                lp += (double)y[t] * g[t];
            w[j] = keep - h;
            ref_conv(s, x, w, NULL, y);
            for (int64_t t = 0; t < ny; t++)
                lm += (double)y[t] * g[t];
            w[j] = keep;
            ASSERT_NEAR(dw[j], (lp - lm) / (2 * h), 2e-4, 1e-4);
        }
        /* same inputs, same thread count: the same bits */
        float *dw2 = dt_alloc(nw * 4), db2[8];
        ASSERT_OK(dt_k_conv2d_bwd_weights(s, x, g, dw2, db2));
        ASSERT(!memcmp(dw, dw2, (size_t)nw * 4));
        ASSERT(!memcmp(db, db2, (size_t)s->K * 4));
        dt_free(dw2);
        /* bias gradient = sum of g over (N, P, Q) */
        int64_t P, Q;
        dt_k_conv2d_out_size(s, &P, &Q);
        for (int64_t k = 0; k < s->K; k++) {
            double acc = 0;
            for (int64_t n = 0; n < s->N; n++)
                for (int64_t t = 0; t < P * Q; t++)
                    acc += g[(n * s->K + k) * P * Q + t];
            ASSERT_NEAR(db[k], acc, 1e-4, 1e-4);
        }
        dt_free(x);
        dt_free(w);
        dt_free(g);
        dt_free(y);
        dt_free(dx);
        dt_free(dw);
    }
}

TEST(conv_cache_and_errors)
{
    const dt_k_conv2d_shape *s = &shapes[1];
    float *x = dt_alloc(xsz(s) * 4), *w = dt_alloc(wsz(s) * 4), *y = dt_alloc(ysz(s) * 4);
    fill(x, xsz(s), 1);
    fill(w, wsz(s), 2);
    dt_k_cache_clear();
    dt_k_stats a, b, c;
    dt_k_stats_get(&c);
    ASSERT_OK(dt_k_conv2d_fwd(s, x, w, NULL, y));
    ASSERT_OK(dt_k_conv2d_bwd_data(s, y, w, x));
    dt_k_stats_get(&a);
    ASSERT(a.primitives_created - c.primitives_created >= 2); /* + reorders in blocked mode */
    dt_k_stats_get(&a);
    for (int i = 0; i < 3; i++) {
        ASSERT_OK(dt_k_conv2d_fwd(s, x, w, NULL, y));
        ASSERT_OK(dt_k_conv2d_bwd_data(s, y, w, x));
    }
    dt_k_stats_get(&b);
    ASSERT_EQ_U64(b.primitives_created - a.primitives_created, 0); /* steady state creates none */
    /* a new thread count gets its own primitives (oneDNN sizes scratchpads
     * per thread count at creation) and the same results */
    int saved = dt_get_num_threads();
    float *y1 = dt_alloc(ysz(s) * 4);
    fill(x, xsz(s), 1); /* the loop above overwrote x with gradients */
    ASSERT_OK(dt_k_conv2d_fwd(s, x, w, NULL, y1));
    dt_set_num_threads(saved == 1 ? 2 : 1);
    ASSERT_OK(dt_k_conv2d_fwd(s, x, w, NULL, y));
    dt_k_stats_get(&c);
    dt_set_num_threads(saved);
    ASSERT(c.primitives_created > b.primitives_created);
    for (int64_t i = 0; i < ysz(s); i++)
        ASSERT_NEAR(y[i], y1[i], 1e-5, 1e-5);
    dt_free(y1);
    dt_k_conv2d_shape bad = *s;
    bad.R = 40;
    ASSERT_STATUS(dt_k_conv2d_fwd(&bad, x, w, NULL, y), DT_ERR_SHAPE);
    bad = *s;
    bad.stride_h = 0;
    ASSERT_STATUS(dt_k_conv2d_fwd(&bad, x, w, NULL, y), DT_ERR_INVALID_ARG);
    bad = *s;
    bad.C = -2;
    ASSERT_STATUS(dt_k_conv2d_fwd(&bad, x, w, NULL, y), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_conv2d_fwd(s, NULL, w, NULL, y), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_conv2d_fwd(NULL, x, w, NULL, y), DT_ERR_NULL);
    dt_free(x);
    dt_free(w);
    dt_free(y);
}

/* Backward weights with one input channel and dy in nChw8c / nChw16c (the
 * ConvNet's first layer; a direct kernel in blocked.c in the default layout
 * policy, oneDNN under DT_CONV_LAYOUT=plain|blocked) against a
 * double-precision loop: 5x5 pad 2 (the register-blocked row; also on rows
 * of 3, 4 and 5 outputs, where the 8-lane row's head and tail meet), 3x3
 * pad 1 on a non-square image, 1x4 with uneven padding, 1x5 split into
 * half blocks over two threads (on AVX-512 that took the 16-lane row over
 * 8-lane units); with and without bias. Both blocks give bit-identical
 * results (same summation order per channel, whichever row a unit takes:
 * 8 or 16 lanes, see blocked.c). */
TEST(conv_c1_bwd_weights_blocked_dy)
{
    dt_k_conv2d_shape sh[7] = {dt_k_conv2d_shape_make(3, 1, 28, 28, 16, 5, 5), dt_k_conv2d_shape_make(2, 1, 7, 9, 16, 3, 3),
                               dt_k_conv2d_shape_make(2, 1, 6, 5, 16, 1, 4), dt_k_conv2d_shape_make(2, 1, 5, 3, 16, 5, 5),
                               dt_k_conv2d_shape_make(2, 1, 5, 4, 16, 5, 5), dt_k_conv2d_shape_make(2, 1, 5, 5, 16, 5, 5),
                               dt_k_conv2d_shape_make(12, 1, 6, 7, 16, 1, 5)};
    sh[0].pad_h = sh[0].pad_w = 2;
    sh[1].pad_h = sh[1].pad_w = 1;
    sh[2].pad_h = 0, sh[2].pad_w = 2;
    for (int i = 3; i < 6; i++) /* rows of 3, 4, 5 outputs: the 5-tap row's edges alone, and with one full step */
        sh[i].pad_h = sh[i].pad_w = 2;
    sh[6].pad_w = 2; /* one kernel row, work enough for two threads: half blocks of 8 lanes */
    for (int i = 0; i < 7; i++) {
        const dt_k_conv2d_shape *s = &sh[i];
        int64_t P, Q;
        ASSERT_OK(dt_k_conv2d_out_size(s, &P, &Q));
        float *x = dt_alloc((size_t)xsz(s) * 4), *dy = dt_alloc((size_t)ysz(s) * 4), *dyb = dt_alloc((size_t)ysz(s) * 4);
        float *dw = dt_alloc((size_t)wsz(s) * 4), *db = dt_alloc((size_t)s->K * 4);
        float *dw8 = dt_alloc((size_t)wsz(s) * 4), *db8 = dt_alloc((size_t)s->K * 4);
        double *ref = dt_alloc((size_t)(wsz(s) + s->K) * sizeof(double));
        ASSERT(x && dy && dyb && dw && db && dw8 && db8 && ref);
        fill(x, xsz(s), 11 + (uint64_t)i);
        fill(dy, ysz(s), 21 + (uint64_t)i);
        ref_bwd_weights(s, P, Q, x, dy, ref);
        for (int B = 8; B <= 16; B += 8) {
            ASSERT_OK(dt_k_to_blocked(dy, s->N, s->K, P * Q, B, dyb));
            for (int with_bias = 0; with_bias < 2; with_bias++) {
                ASSERT_OK(dt_k_conv2d_bwd_weights_l(s, x, dyb, dw, with_bias ? db : NULL,
                                                    B == 8 ? DT_K_DST_BLOCKED8 : DT_K_DST_BLOCKED16));
                for (int64_t j = 0; j < wsz(s); j++)
                    ASSERT_NEAR(dw[j], ref[j], 1e-4, 1e-4);
                for (int64_t k = 0; with_bias && k < s->K; k++)
                    ASSERT_NEAR(db[k], ref[wsz(s) + k], 1e-4, 1e-4);
            }
            if (B == 8) {
                memcpy(dw8, dw, (size_t)wsz(s) * 4);
                memcpy(db8, db, (size_t)s->K * 4);
            } else {
                ASSERT(!memcmp(dw8, dw, (size_t)wsz(s) * 4));
                ASSERT(!memcmp(db8, db, (size_t)s->K * 4));
            }
        }
        dt_free(x), dt_free(dy), dt_free(dyb), dt_free(dw), dt_free(db), dt_free(dw8), dt_free(db8), dt_free(ref);
    }
}

/* Backward weights with x and dy both in nChw8c and 5 taps a kernel row (a
 * direct kernel in blocked.c in the default layout policy, the ConvNet's
 * second layer; oneDNN under DT_CONV_LAYOUT=plain|blocked) against a
 * double-precision loop: 5x5 pad 2 (the rows whose padding products are
 * skipped; rows of 14, 9 and 5 inputs: the 8-position transposes that
 * gather x overlap, or do not fit), 3x5 on a non-square image, pad 1
 * (rows of 11) and pad 0 (every product made; Q = 4, the row's head
 * meeting its tail), three channel blocks, with and without bias.
 * The kernel itself, called with 1-5 threads, gives the same bits as with
 * one, and its portable path (dtrain's scalar ISA) lies within the same
 * bound; as dt_k_conv2d_bwd_weights_l's result does whichever policy runs. */
TEST(conv_blk8_bwd_weights)
{
    dt_k_conv2d_shape sh[5] = {
        dt_k_conv2d_shape_make(3, 16, 14, 14, 32, 5, 5), dt_k_conv2d_shape_make(2, 8, 7, 9, 16, 3, 5),
        dt_k_conv2d_shape_make(2, 16, 6, 11, 8, 5, 5), dt_k_conv2d_shape_make(2, 8, 5, 8, 24, 1, 5),
        dt_k_conv2d_shape_make(2, 24, 5, 5, 8, 5, 5)};
    sh[0].pad_h = sh[0].pad_w = 2;
    sh[1].pad_h = 1, sh[1].pad_w = 2;
    sh[2].pad_h = sh[2].pad_w = 1;
    sh[4].pad_h = sh[4].pad_w = 2;
    const dt_k_isa isa0 = dt_k_get_isa();
    for (int i = 0; i < 5; i++) {
        const dt_k_conv2d_shape *s = &sh[i];
        int64_t P, Q;
        ASSERT_OK(dt_k_conv2d_out_size(s, &P, &Q));
        ASSERT(dt__conv_bwd_weights_blk8_ok(s, Q));
        const int64_t nw = wsz(s);
        float *x = dt_alloc((size_t)xsz(s) * 4), *dy = dt_alloc((size_t)ysz(s) * 4), *xb = dt_alloc((size_t)xsz(s) * 4);
        float *dyb = dt_alloc((size_t)ysz(s) * 4), *dw = dt_alloc((size_t)nw * 4), *db = dt_alloc((size_t)s->K * 4);
        float *dw1 = dt_alloc((size_t)nw * 4), *db1 = dt_alloc((size_t)s->K * 4);
        double *ref = dt_alloc((size_t)(nw + s->K) * sizeof(double));
        float *scratch = dt_alloc(dt__conv_bwd_weights_blk8_scratch(s, 5) * 4);
        ASSERT(x && dy && xb && dyb && dw && db && dw1 && db1 && ref && scratch);
        fill(x, xsz(s), 41 + (uint64_t)i);
        fill(dy, ysz(s), 51 + (uint64_t)i);
        ASSERT_OK(dt_k_to_blocked(x, s->N, s->C, s->H * s->W, 8, xb));
        ASSERT_OK(dt_k_to_blocked(dy, s->N, s->K, P * Q, 8, dyb));
        ref_bwd_weights(s, P, Q, x, dy, ref);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            ASSERT_OK(dt_k_conv2d_bwd_weights_l(s, xb, dyb, dw, with_bias ? db : NULL,
                                                DT_K_SRC_BLOCKED8 | DT_K_DST_BLOCKED8));
            for (int64_t j = 0; j < nw; j++)
                ASSERT_NEAR(dw[j], ref[j], 1e-4, 1e-4);
            for (int64_t k = 0; with_bias && k < s->K; k++)
                ASSERT_NEAR(db[k], ref[nw + k], 1e-4, 1e-4);
            /* the kernel alone: one thread, then more, the same bits; the portable rows */
            for (int scalar = 0; scalar < 2; scalar++) {
                if (scalar)
                    ASSERT_OK(dt_k_set_isa(DT_K_ISA_SCALAR));
                dt__conv_bwd_weights_blk8(s, 1, P, Q, xb, dyb, dw1, with_bias ? db1 : NULL, scratch);
                for (int64_t j = 0; j < nw; j++)
                    ASSERT_NEAR(dw1[j], ref[j], 1e-4, 1e-4);
                for (int64_t k = 0; with_bias && k < s->K; k++)
                    ASSERT_NEAR(db1[k], ref[nw + k], 1e-4, 1e-4);
                for (int nt = 2; nt <= 5; nt++) {
                    if (nt > s->C / 2 * (s->K / 8))
                        break;
                    dt__conv_bwd_weights_blk8(s, nt, P, Q, xb, dyb, dw, with_bias ? db : NULL, scratch);
                    if (memcmp(dw, dw1, (size_t)nw * 4) || (with_bias && memcmp(db, db1, (size_t)s->K * 4)))
                        TEST_FAIL_("shape %d, %d threads%s: not the bits of one thread", i, nt,
                                   scalar ? " (scalar)" : "");
                }
                ASSERT_OK(dt_k_set_isa(isa0));
            }
        }
        dt_free(x), dt_free(dy), dt_free(xb), dt_free(dyb), dt_free(dw), dt_free(db), dt_free(dw1), dt_free(db1);
        dt_free(ref), dt_free(scratch);
    }
}

/* Every caller layout (plain, nChw8c, nChw16c for the activation and for
 * the output) gives bit-identical results to the plain call in all three
 * directions: the primitive is the same, only reorders around it change.
 * And the layout bits are checked. */
TEST(conv_blocked_layouts_agree)
{
    dt_k_conv2d_shape sh = dt_k_conv2d_shape_make(3, 16, 9, 7, 32, 3, 3);
    dt_k_conv2d_shape *s = &sh;
    s->pad_h = s->pad_w = 1;
    int64_t P, Q;
    ASSERT_OK(dt_k_conv2d_out_size(s, &P, &Q));
    size_t nx = (size_t)xsz(s), ny = (size_t)ysz(s), nw = (size_t)wsz(s);
    float *x = dt_alloc(nx * 4), *w = dt_alloc(nw * 4), *b = dt_alloc((size_t)s->K * 4), *dy = dt_alloc(ny * 4);
    float *y0 = dt_alloc(ny * 4), *dx0 = dt_alloc(nx * 4), *dw0 = dt_alloc(nw * 4), *db0 = dt_alloc((size_t)s->K * 4);
    float *xb = dt_alloc(nx * 4), *dyb = dt_alloc(ny * 4), *yb = dt_alloc(ny * 4), *dxb = dt_alloc(nx * 4);
    float *t = dt_alloc((nx > ny ? nx : ny) * 4), *dw = dt_alloc(nw * 4), *db = dt_alloc((size_t)s->K * 4);
    fill(x, (int64_t)nx, 31);
    fill(w, (int64_t)nw, 32);
    fill(b, s->K, 33);
    fill(dy, (int64_t)ny, 34);
    ASSERT_OK(dt_k_conv2d_fwd(s, x, w, b, y0));
    ASSERT_OK(dt_k_conv2d_bwd_data(s, dy, w, dx0));
    ASSERT_OK(dt_k_conv2d_bwd_weights(s, x, dy, dw0, db0));
    static const int blocks[3] = {0, 8, 16};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            int sb = blocks[i], ob = blocks[j];
            unsigned lay = (sb == 8 ? DT_K_SRC_BLOCKED8 : sb == 16 ? DT_K_SRC_BLOCKED16 : 0u) |
                           (ob == 8 ? DT_K_DST_BLOCKED8 : ob == 16 ? DT_K_DST_BLOCKED16 : 0u);
            const float *xin = x, *dyin = dy;
            if (sb) {
                ASSERT_OK(dt_k_to_blocked(x, s->N, s->C, s->H * s->W, sb, xb));
                xin = xb;
            }
            if (ob) {
                ASSERT_OK(dt_k_to_blocked(dy, s->N, s->K, P * Q, ob, dyb));
                dyin = dyb;
            }
            ASSERT_OK(dt_k_conv2d_fwd_l(s, xin, w, b, yb, lay));
            ASSERT_OK(dt_k_conv2d_bwd_data_l(s, dyin, w, dxb, lay));
            ASSERT_OK(dt_k_conv2d_bwd_weights_l(s, xin, dyin, dw, db, lay));
            const float *yp = yb, *dxp = dxb;
            if (ob) {
                ASSERT_OK(dt_k_from_blocked(yb, s->N, s->K, P * Q, ob, t));
                memcpy(yb, t, ny * 4);
            }
            if (sb) {
                ASSERT_OK(dt_k_from_blocked(dxb, s->N, s->C, s->H * s->W, sb, t));
                memcpy(dxb, t, nx * 4);
            }
            if (memcmp(yp, y0, ny * 4) || memcmp(dxp, dx0, nx * 4) || memcmp(dw, dw0, nw * 4) ||
                memcmp(db, db0, (size_t)s->K * 4))
                TEST_FAIL_("layout src %d dst %d: results differ from the plain call", sb, ob);
        }
    /* conversions round-trip; bad blocks and bad bits are errors */
    for (int B = 8; B <= 16; B += 8) {
        ASSERT_OK(dt_k_to_blocked(x, s->N, s->C, s->H * s->W, B, xb));
        ASSERT_OK(dt_k_from_blocked(xb, s->N, s->C, s->H * s->W, B, t));
        ASSERT(!memcmp(t, x, nx * 4));
    }
    ASSERT_STATUS(dt_k_to_blocked(x, s->N, s->C, s->H * s->W, 4, xb), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_to_blocked(x, s->N, 24, 1, 16, xb), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_conv2d_fwd_l(s, x, w, b, yb, DT_K_SRC_BLOCKED8 | DT_K_SRC_BLOCKED16), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_conv2d_fwd_l(s, x, w, b, yb, 16u), DT_ERR_INVALID_ARG);
    dt_k_conv2d_shape s24 = dt_k_conv2d_shape_make(1, 24, 4, 4, 8, 1, 1);
    ASSERT_STATUS(dt_k_conv2d_fwd_l(&s24, x, w, NULL, yb, DT_K_SRC_BLOCKED16), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_k_conv2d_fwd_l(&s24, x, w, NULL, yb, DT_K_SRC_BLOCKED8));
    dt_free(x), dt_free(w), dt_free(b), dt_free(dy), dt_free(y0), dt_free(dx0), dt_free(dw0), dt_free(db0);
    dt_free(xb), dt_free(dyb), dt_free(yb), dt_free(dxb), dt_free(t), dt_free(dw), dt_free(db);
}

int main(void)
{
    init_shapes();
    RUN(conv_fwd_vs_naive);
    RUN(conv_bwd_finite_difference);
    RUN(conv_cache_and_errors);
    RUN(conv_c1_bwd_weights_blocked_dy);
    RUN(conv_blk8_bwd_weights);
    RUN(conv_blocked_layouts_agree);
    return TEST_REPORT();
}
