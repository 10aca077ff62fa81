/* Batch norm, ReLU and 2 x 2 max pooling as one op on channel-blocked
 * activations (dt_k_bn_relu_maxpool2x2_*_blocked, the ConvNet block's tail)
 * against the three kernels run one after the other (batch norm, max
 * pooling, ReLU; backward: ReLU's, the pooling's scatter, batch norm's):
 * the same bits in every output and gradient, on both block sizes and 1-4
 * threads (16 channels in nChw16c: the half-block split), with planes whose
 * last row or column no window covers, windows with ties, channels with a
 * negative gamma (the window's argmax is then its minimum of x) and NaNs. */
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>
#include <string.h>

typedef struct {
    int64_t N, C, H, W;
} shape;

static void fill(float *x, int64_t n, uint64_t seed, float lo, float hi)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 7, 8), 0, x, (size_t)n, lo, hi);
}

/* what one run gives, plain layouts: the pooled output, its argmax, the
 * statistics (mean, invstd, running mean, running var), dx, dgamma, dbeta */
typedef struct {
    float *y, *stats, *dx, *dg, *db;
    int32_t *arg;
} outs;

static void outs_alloc(outs *o, const shape *s)
{
    const size_t n = (size_t)(s->N * s->C * s->H * s->W),
                 m = (size_t)(s->N * s->C * (s->H / 2) * (s->W / 2));
    o->y = dt_alloc(m * 4), o->arg = dt_alloc(m * 4), o->stats = dt_alloc((size_t)s->C * 16);
    o->dx = dt_alloc(n * 4), o->dg = dt_alloc((size_t)s->C * 4), o->db = dt_alloc((size_t)s->C * 4);
    ASSERT(o->y && o->arg && o->stats && o->dx && o->dg && o->db);
}

static void outs_free(outs *o)
{
    dt_free(o->y), dt_free(o->arg), dt_free(o->stats), dt_free(o->dx), dt_free(o->dg),
        dt_free(o->db);
}

/* argmax blocked -> plain, by lanes (int32 through the float reorder: bits) */
static void arg_plain(const int32_t *ab, int64_t N, int64_t C, int64_t PQ, int B, int32_t *ap)
{
    ASSERT_OK(dt_k_from_blocked((const float *)(const void *)ab, N, C, PQ, B, (float *)(void *)ap));
}

/* Forward and backward on nChw<B>c, nt threads; fused or the three kernels. */
static void run(const shape *s, int B, int nt, bool fused, const float *x, const float *dyp,
                const float *gamma, const float *beta, outs *o)
{
    const int64_t N = s->N, C = s->C, H = s->H, W = s->W, HW = H * W, P = H / 2, Q = W / 2,
                  PQ = P * Q;
    const size_t n = (size_t)(N * C * HW), m = (size_t)(N * C * PQ);
    float *xb = dt_alloc(n * 4), *dxb = dt_alloc(n * 4), *yb = dt_alloc(m * 4),
          *dyb = dt_alloc(m * 4);
    int32_t *ab = dt_alloc(m * 4);
    ASSERT(xb && dxb && yb && dyb && ab);
    ASSERT_OK(dt_k_to_blocked(x, N, C, HW, B, xb));
    ASSERT_OK(dt_k_to_blocked(dyp, N, C, PQ, B, dyb));
    float *mean = o->stats, *invstd = mean + C, *rm = invstd + C, *rv = rm + C;
    for (int64_t c = 0; c < C; c++)
        rm[c] = 0.1f * (float)c, rv[c] = 1.0f + 0.01f * (float)c;
    const int saved = dt_get_num_threads();
    dt_set_num_threads(nt);
    if (fused) {
        ASSERT_OK(dt_k_bn_relu_maxpool2x2_fwd_blocked(xb, N, C, H, W, B, gamma, beta, 1e-5f, 0.1f,
                                                      rm, rv, yb, ab, mean, invstd));
        ASSERT_OK(dt_k_bn_relu_maxpool2x2_bwd_blocked(xb, yb, ab, dyb, N, C, H, W, B, gamma, mean,
                                                      invstd, dxb, o->dg, o->db));
    } else {
        float *bn = dt_alloc(n * 4), *pooled = dt_alloc(m * 4), *g1 = dt_alloc(m * 4),
              *gbn = dt_alloc(n * 4);
        ASSERT(bn && pooled && g1 && gbn);
        const dt_k_pool2d_shape ps = {N, C, H, W, 2, 2, 2, 2, 0, 0};
        ASSERT_OK(dt_k_batchnorm_train_fwd_blocked(xb, N, C, HW, B, gamma, beta, 1e-5f, 0.1f, rm,
                                                   rv, bn, mean, invstd));
        ASSERT_OK(dt_k_maxpool2d_fwd_blocked(&ps, B, bn, pooled, ab));
        ASSERT_OK(dt_k_relu_fwd(pooled, yb, (int64_t)m));
        ASSERT_OK(dt_k_relu_bwd(yb, dyb, g1, (int64_t)m));
        ASSERT_OK(dt_k_maxpool2d_bwd_blocked(&ps, B, g1, ab, gbn));
        ASSERT_OK(dt_k_batchnorm_bwd_blocked(xb, gbn, N, C, HW, B, gamma, mean, invstd, dxb, o->dg,
                                             o->db));
        dt_free(bn), dt_free(pooled), dt_free(g1), dt_free(gbn);
    }
    dt_set_num_threads(saved);
    ASSERT_OK(dt_k_from_blocked(yb, N, C, PQ, B, o->y));
    arg_plain(ab, N, C, PQ, B, o->arg);
    ASSERT_OK(dt_k_from_blocked(dxb, N, C, HW, B, o->dx));
    dt_free(xb), dt_free(dxb), dt_free(yb), dt_free(dyb), dt_free(ab);
}

static void same(const outs *a, const outs *b, const shape *s, const char *what)
{
    const size_t n = (size_t)(s->N * s->C * s->H * s->W),
                 m = (size_t)(s->N * s->C * (s->H / 2) * (s->W / 2));
    const struct {
        const void *a, *b;
        size_t bytes;
        const char *name;
    } cmp[] = {{a->y, b->y, m * 4, "y"},
               {a->arg, b->arg, m * 4, "argmax"},
               {a->stats, b->stats, (size_t)s->C * 16, "statistics"},
               {a->dx, b->dx, n * 4, "dx"},
               {a->dg, b->dg, (size_t)s->C * 4, "dgamma"},
               {a->db, b->db, (size_t)s->C * 4, "dbeta"}};
    for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++)
        if (memcmp(cmp[k].a, cmp[k].b, cmp[k].bytes))
            TEST_FAIL_("%s, %lldx%lldx%lldx%lld: %s differs from the three kernels'", what,
                       (long long)s->N, (long long)s->C, (long long)s->H, (long long)s->W,
                       cmp[k].name);
}

/* x on a grid of quarters, so windows have ties; one NaN in the last case */
static void one_shape(const shape *s, bool nan)
{
    const int64_t HW = s->H * s->W, n = s->N * s->C * HW, m = s->N * s->C * (s->H / 2) * (s->W / 2);
    float *x = dt_alloc((size_t)n * 4), *dy = dt_alloc((size_t)m * 4),
          *gamma = dt_alloc((size_t)s->C * 4), *beta = dt_alloc((size_t)s->C * 4);
    ASSERT(x && dy && gamma && beta);
    fill(x, n, 11, -2.0f, 3.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = i % 3 ? x[i] : roundf(x[i] * 4.0f) / 4.0f;
    fill(dy, m, 12, -1.0f, 1.0f);
    fill(gamma, s->C, 13, 0.5f, 1.5f);
    for (int64_t c = 0; c < s->C; c += 3)
        gamma[c] = -gamma[c];
    fill(beta, s->C, 14, -0.5f, 0.5f);
    if (nan)
        x[(s->C + 1) * HW + s->W + 1] =
            NAN; /* sample 1, channel 1 (a whole channel's statistics become NaN) */
    for (int B = 8; B <= 16; B += 8) {
        if (s->C % B)
            continue;
        for (int nt = 1; nt <= 4; nt++) {
            outs ref, got;
            outs_alloc(&ref, s), outs_alloc(&got, s);
            run(s, B, nt, false, x, dy, gamma, beta, &ref);
            run(s, B, nt, true, x, dy, gamma, beta, &got);
            char what[64];
            snprintf(what, sizeof what, "B=%d threads=%d%s", B, nt, nan ? " (a NaN)" : "");
            same(&ref, &got, s, what);
            outs_free(&ref), outs_free(&got);
        }
    }
    dt_free(x), dt_free(dy), dt_free(gamma), dt_free(beta);
}

TEST(fused_is_the_three_kernels)
{
    const shape shapes[] = {
        {4, 16, 28, 28}, /* the ConvNet's first layer (one nChw16c block: split over rows) */
        {4, 32, 14, 14}, /* its second */
        {3, 16, 7, 5},   /* a last row and column no window covers */
        {2, 48, 6, 9},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        one_shape(&shapes[i], false);
    one_shape(&shapes[2], true);
}

/* The ReLU's mask and the argmax are what the pooling of batch norm's
 * output says: a value against its own float64 reference. */
TEST(values)
{
    const shape s = {2, 8, 4, 4};
    outs o;
    outs_alloc(&o, &s);
    float x[2 * 8 * 16], dy[2 * 8 * 4], gamma[8], beta[8];
    fill(x, 2 * 8 * 16, 21, -1.0f, 1.0f);
    fill(dy, 2 * 8 * 4, 22, -1.0f, 1.0f);
    for (int c = 0; c < 8; c++)
        gamma[c] = 1.0f, beta[c] = -0.1f;
    run(&s, 8, 1, true, x, dy, gamma, beta, &o);
    const int c = 3;
    double sum = 0, sq = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 16; j++) {
            double v = x[(i * 8 + c) * 16 + j];
            sum += v, sq += v * v;
        }
    double mean = sum / 32, var = sq / 32 - mean * mean;
    /* sample 1, window (1, 0): rows 2-3, columns 0-1 */
    const float *xp = x + (8 + c) * 16;
    int best = 8;
    for (int k = 1; k < 4; k++) {
        int at = (8 + 4 * (k / 2)) + (k % 2);
        if (xp[at] > xp[best])
            best = at;
    }
    double want = (xp[best] - mean) / sqrt(var + 1e-5) - 0.1;
    const int64_t w = (8 + c) * 4 + 2;
    ASSERT_EQ_INT(o.arg[w], best);
    ASSERT_NEAR(o.y[w], want > 0 ? want : 0.0, 1e-5, 1e-5);
    outs_free(&o);
}

TEST(bad_shapes)
{
    float x[64] = {0}, y[16] = {0}, st[8] = {0};
    int32_t a[16] = {0};
    ASSERT_EQ_INT(dt_k_bn_relu_maxpool2x2_fwd_blocked(x, 1, 8, 1, 8, 8, NULL, NULL, 1e-5f, 0.1f,
                                                      NULL, NULL, y, a, st, st + 4),
                  DT_ERR_SHAPE);
    ASSERT_EQ_INT(dt_k_bn_relu_maxpool2x2_fwd_blocked(x, 1, 12, 2, 2, 8, NULL, NULL, 1e-5f, 0.1f,
                                                      NULL, NULL, y, a, st, st + 4) < 0,
                  1);
    ASSERT_EQ_INT(dt_k_bn_relu_maxpool2x2_bwd_blocked(x, y, NULL, y, 1, 8, 2, 2, 8, NULL, st,
                                                      st + 4, x, NULL, NULL) < 0,
                  1);
}

int main(void)
{
    RUN(fused_is_the_three_kernels);
    RUN(values);
    RUN(bad_shapes);
    return TEST_REPORT();
}
