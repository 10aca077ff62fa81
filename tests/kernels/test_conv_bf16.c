/* bf16 convolution (dt_k_conv2d_*_t, and dt_conv2d on bf16 tensors).
 *
 * Native part (kernels): oneDNN's bf16 forward, backward-data and
 * backward-weights against the f32 convolution of the same bf16-rounded
 * operands, for C = 1, C = 3 and C = 16, stride, padding, dilation, and
 * every caller layout (plain, nChw8c, nChw16c where the channels allow).
 * Where this CPU has no bf16 convolution (dt_k_conv2d_native: AVX2, or the
 * isa caps) that part reports skipped. The bound, per output element i:
 *
 *     |got_i - ref_i| <= u_out |ref_i| + 2 n 2^-24 A_i
 *
 * ref = the f32 oneDNN convolution of the rounded operands; A = the same
 * convolution of their absolute values (sum |a b| over the n products of
 * element i: n = C R S forward, K R S backward data, N P Q backward
 * weights); u_out = 2^-8 for a bf16 output (round to nearest even: at most
 * half an ulp, 2^-8 relative with bf16's 8 significant bits), 0 for the
 * f32 outputs (dx, dw, dbias). The products of two bf16 values are exact
 * in f32, so what remains is the f32 summation of both sides in different
 * orders: at most n 2^-24 A_i each (the standard gamma_n bound). A
 * truncating rounding (up to 2^-7), an operand read in the wrong dtype or
 * layout, or an f32 primitive reused for bf16 (a key without the dtype:
 * each shape runs in f32 first) fails it.
 *
 * Op part (autograd, runs everywhere): dt_conv2d on bf16 x, w, bias, in a
 * blocked region and out of one, forward and backward against the f32
 * op on the same values with the same bound; where the native path is on,
 * the op's output is bit-identical to the native kernel's (so the op does
 * take it), and where it is off (isa caps) dt_k_conv2d_native says so and
 * the low-precision kernels refuse bf16 with DT_ERR_UNSUPPORTED.
 *
 * `test_conv_bf16 fallback` runs the op part only (the isa_avx2
 * registration, tests.cmake). */
#include "dtrain/dtrain.h"
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static dt_k_conv2d_shape shapes[5];
static void init_shapes(void)
{
    shapes[0] = dt_k_conv2d_shape_make(2, 1, 9, 8, 16, 5, 5); /* C = 1, the ConvNet's first layer */
    shapes[0].pad_h = shapes[0].pad_w = 2;
    shapes[1] = dt_k_conv2d_shape_make(2, 3, 10, 9, 5, 3, 3); /* C = 3, odd K, stride 2 */
    shapes[1].stride_h = shapes[1].stride_w = 2, shapes[1].pad_h = shapes[1].pad_w = 1;
    shapes[2] = dt_k_conv2d_shape_make(1, 3, 12, 11, 8, 3, 3); /* dilation, unequal strides */
    shapes[2].dil_h = 2, shapes[2].dil_w = 3, shapes[2].pad_h = 2, shapes[2].pad_w = 1, shapes[2].stride_h = 2;
    shapes[3] = dt_k_conv2d_shape_make(3, 16, 9, 7, 32, 3, 3); /* blocked both sides */
    shapes[3].pad_h = shapes[3].pad_w = 1;
    shapes[4] = dt_k_conv2d_shape_make(4, 16, 14, 14, 32, 5, 5); /* the ConvNet's second layer */
    shapes[4].pad_h = shapes[4].pad_w = 2;
}

static int64_t xsz(const dt_k_conv2d_shape *s) { return s->N * s->C * s->H * s->W; }
static int64_t wsz(const dt_k_conv2d_shape *s) { return s->K * s->C * s->R * s->S; }
static int64_t ysz(const dt_k_conv2d_shape *s, int64_t *P, int64_t *Q)
{
    dt_k_conv2d_out_size(s, P, Q);
    return s->N * s->K * *P * *Q;
}

/* uniform in [-1, 1) rounded to bf16 (f32 copy in v, bf16 in h when h) */
static void fill_bf16(float *v, uint16_t *h, int64_t n, uint64_t seed)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_USER, 5, 6), 0, v, (size_t)n, -1.0f, 1.0f);
    for (int64_t i = 0; i < n; i++) {
        uint16_t b = dt_f32_to_bf16(v[i]);
        v[i] = dt_bf16_to_f32(b);
        if (h)
            h[i] = b;
    }
}

static void absv(const float *x, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = fabsf(x[i]);
}

/* The bound above; returns the number of elements outside it (prints the first). */
static int check_bound(const char *what, const float *got, const float *ref, const float *A, int64_t m,
                       double u_out, int64_t nterms)
{
    int bad = 0;
    double worst = 0;
    for (int64_t i = 0; i < m; i++) {
        double err = fabs((double)got[i] - ref[i]);
        double tol = u_out * fabs((double)ref[i]) + 2.0 * (double)nterms * 0x1p-24 * A[i];
        if (!(err <= tol)) {
            if (!bad)
                fprintf(stderr, "%s: element %lld: got %.9g, want %.9g (error %.3g > bound %.3g)\n", what,
                        (long long)i, got[i], ref[i], err, tol);
            bad++;
        }
        if (tol > 0 && err / tol > worst)
            worst = err / tol;
    }
    if (getenv("DT_TEST_VERBOSE"))
        fprintf(stderr, "%s: worst error / bound %.3f\n", what, worst);
    return bad;
}

static unsigned lay_bits(int sb, int ob)
{
    return (sb == 8 ? DT_K_SRC_BLOCKED8 : sb == 16 ? DT_K_SRC_BLOCKED16 : 0u) |
           (ob == 8 ? DT_K_DST_BLOCKED8 : ob == 16 ? DT_K_DST_BLOCKED16 : 0u);
}

/* f32 data (N, C, HW) as bf16 in block B (0: plain) */
static void to_bf16_lay(const float *x, int64_t N, int64_t C, int64_t HW, int B, float *tmp, uint16_t *out)
{
    const float *src = x;
    if (B) {
        dt_k_to_blocked(x, N, C, HW, B, tmp);
        src = tmp;
    }
    dt_k_convert(src, DT_F32, out, DT_BF16, N * C * HW);
}

TEST(native_kernels)
{
    if (!dt_k_conv2d_native(DT_BF16))
        DT_TEST_SKIP("no bf16 convolution on this CPU (oneDNN isa %s; oneDNN 2.6 has bf16 convolutions on "
                     "AVX-512 only)", dt_k_onednn_isa());
    static const int blocks[3] = {0, 8, 16};
    for (int si = 0; si < 5; si++) {
        const dt_k_conv2d_shape *s = &shapes[si];
        int64_t P, Q, nx = xsz(s), nw = wsz(s), ny = ysz(s, &P, &Q), K = s->K;
        int64_t big = nx > ny ? nx : ny;
        float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc(K * 4), *dy = malloc(ny * 4);
        float *ax = malloc(nx * 4), *aw = malloc(nw * 4), *ab = malloc(K * 4), *ady = malloc(ny * 4);
        float *y0 = malloc(ny * 4), *dx0 = malloc(nx * 4), *dw0 = malloc(nw * 4), *db0 = malloc(K * 4);
        float *Ay = malloc(ny * 4), *Adx = malloc(nx * 4), *Adw = malloc(nw * 4), *Adb = malloc(K * 4);
        float *y = malloc(ny * 4), *dx = malloc(nx * 4), *dw = malloc(nw * 4), *db = malloc(K * 4);
        float *tmp = malloc(big * 4), *tmp2 = malloc(big * 4);
        uint16_t *xh = malloc(nx * 2), *wh = malloc(nw * 2), *dyh = malloc(ny * 2), *yh = malloc(ny * 2);
        fill_bf16(x, NULL, nx, 10 + si);
        fill_bf16(w, wh, nw, 20 + si);
        dt_rng_fill_uniform(dt_rng_key_make(30 + si, DT_RNG_USER, 5, 6), 0, b, (size_t)K, -1.0f, 1.0f);
        fill_bf16(dy, NULL, ny, 40 + si);
        absv(x, ax, nx), absv(w, aw, nw), absv(b, ab, K), absv(dy, ady, ny);
        /* the f32 reference first: its primitives are cached under the same shape */
        ASSERT_OK(dt_k_conv2d_fwd(s, x, w, b, y0));
        ASSERT_OK(dt_k_conv2d_bwd_data(s, dy, w, dx0));
        ASSERT_OK(dt_k_conv2d_bwd_weights(s, x, dy, dw0, db0));
        ASSERT_OK(dt_k_conv2d_fwd(s, ax, aw, ab, Ay));
        ASSERT_OK(dt_k_conv2d_bwd_data(s, ady, aw, Adx));
        ASSERT_OK(dt_k_conv2d_bwd_weights(s, ax, ady, Adw, Adb));
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {
                int sb = blocks[i], ob = blocks[j];
                if ((sb && s->C % sb) || (ob && s->K % ob))
                    continue;
                unsigned lay = lay_bits(sb, ob);
                char what[96];
                to_bf16_lay(x, s->N, s->C, s->H * s->W, sb, tmp, xh);
                to_bf16_lay(dy, s->N, s->K, P * Q, ob, tmp, dyh);
                ASSERT_OK(dt_k_conv2d_fwd_t(s, xh, wh, b, yh, DT_BF16, DT_BF16, lay));
                ASSERT_OK(dt_k_conv2d_bwd_data_t(s, dyh, wh, dx, DT_BF16, lay));
                ASSERT_OK(dt_k_conv2d_bwd_weights_t(s, xh, dyh, dw, db, DT_BF16, lay));
                dt_k_convert(yh, DT_BF16, y, DT_F32, ny);
                if (ob) {
                    dt_k_from_blocked(y, s->N, s->K, P * Q, ob, tmp2);
                    memcpy(y, tmp2, (size_t)ny * 4);
                }
                if (sb) {
                    dt_k_from_blocked(dx, s->N, s->C, s->H * s->W, sb, tmp2);
                    memcpy(dx, tmp2, (size_t)nx * 4);
                }
                int bad = 0;
                snprintf(what, sizeof what, "shape %d src %d dst %d forward", si, sb, ob);
                bad += check_bound(what, y, y0, Ay, ny, 0x1p-8, s->C * s->R * s->S + 1);
                snprintf(what, sizeof what, "shape %d src %d dst %d backward data", si, sb, ob);
                bad += check_bound(what, dx, dx0, Adx, nx, 0, s->K * s->R * s->S);
                snprintf(what, sizeof what, "shape %d src %d dst %d backward weights", si, sb, ob);
                bad += check_bound(what, dw, dw0, Adw, nw, 0, s->N * P * Q);
                snprintf(what, sizeof what, "shape %d src %d dst %d backward bias", si, sb, ob);
                bad += check_bound(what, db, db0, Adb, K, 0, s->N * P * Q);
                if (bad)
                    TEST_FAIL_("shape %d, layout src %d dst %d: %d elements outside the bound", si, sb, ob, bad);
                /* an f32 output of bf16 operands: the same sums, not rounded */
                ASSERT_OK(dt_k_conv2d_fwd_t(s, xh, wh, NULL, tmp, DT_BF16, DT_F32, lay));
                if (ob) {
                    dt_k_from_blocked(tmp, s->N, s->K, P * Q, ob, tmp2);
                    memcpy(tmp, tmp2, (size_t)ny * 4);
                }
                for (int64_t e = 0; e < ny; e++) /* the bias back in: the bound's reference has it */
                    tmp[e] += b[(e / (P * Q)) % K];
                snprintf(what, sizeof what, "shape %d src %d dst %d forward, f32 output", si, sb, ob);
                if (check_bound(what, tmp, y0, Ay, ny, 0, s->C * s->R * s->S + 2))
                    TEST_FAIL_("shape %d: the f32 output of a bf16 forward is outside the bound", si);
            }
        free(x), free(w), free(b), free(dy), free(ax), free(aw), free(ab), free(ady);
        free(y0), free(dx0), free(dw0), free(db0), free(Ay), free(Adx), free(Adw), free(Adb);
        free(y), free(dx), free(dw), free(db), free(tmp), free(tmp2), free(xh), free(wh), free(dyh), free(yh);
    }
}

/* dtypes the kernels refuse, wherever this runs */
TEST(dtype_errors)
{
    dt_k_conv2d_shape s = dt_k_conv2d_shape_make(1, 2, 4, 4, 2, 3, 3);
    uint16_t x[32] = {0}, w[36] = {0}, y[8];
    float dx[32], dw[36];
    ASSERT_STATUS(dt_k_conv2d_fwd_t(&s, x, w, NULL, y, DT_I32, DT_I32, 0), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_conv2d_fwd_t(&s, x, w, NULL, y, DT_BF16, DT_F16, 0), DT_ERR_UNSUPPORTED);
    ASSERT(!dt_k_conv2d_native(DT_I32));
    ASSERT(dt_k_conv2d_native(DT_F32));
    if (!dt_k_conv2d_native(DT_F16)) { /* oneDNN 2.6: no f16 convolution on x86 */
        ASSERT_STATUS(dt_k_conv2d_fwd_t(&s, x, w, NULL, y, DT_F16, DT_F16, 0), DT_ERR_UNSUPPORTED);
        ASSERT_STATUS(dt_k_conv2d_bwd_data_t(&s, y, w, dx, DT_F16, 0), DT_ERR_UNSUPPORTED);
    }
    if (!dt_k_conv2d_native(DT_BF16)) {
        ASSERT_STATUS(dt_k_conv2d_fwd_t(&s, x, w, NULL, y, DT_BF16, DT_BF16, 0), DT_ERR_UNSUPPORTED);
        ASSERT_STATUS(dt_k_conv2d_bwd_data_t(&s, y, w, dx, DT_BF16, 0), DT_ERR_UNSUPPORTED);
        ASSERT_STATUS(dt_k_conv2d_bwd_weights_t(&s, x, y, dw, NULL, DT_BF16, 0), DT_ERR_UNSUPPORTED);
    }
    /* the isa caps turn the native path off */
    const char *cap = getenv("DT_MAX_CPU_ISA");
    if (cap && (!strcmp(cap, "avx2") || !strcmp(cap, "scalar")))
        ASSERT(!dt_k_conv2d_native(DT_BF16));
}

/* dt_conv2d on bf16 (dt) or f32 leaves holding vals; loss = sum(y * R). The
 * output (f32 values, plain) in *yv, the leaves' gradients in g[0..2];
 * *ysame: whether the op ran the native kernels (bf16 on a machine that has
 * them: y equals the native forward bit for bit and no primitive was
 * created; true elsewhere). */
static bool run_op(dt_dtype dt, bool blocked, const dt_k_conv2d_shape *s, float *const *vals, const float *R,
                   float *yv, float **g, bool *ysame)
{
    dt_ctx *ctx = NULL;
    if (dt_ctx_init(NULL, &ctx) < 0)
        return false;
    bool ok = false;
    const int64_t shp[3][4] = {{s->N, s->C, s->H, s->W}, {s->K, s->C, s->R, s->S}, {s->K}};
    const int nd[3] = {4, 4, 1};
    dt_tensor *in[3] = {0};
    for (int i = 0; i < 3; i++) {
        in[i] = dt_tensor_new(dt, nd[i], shp[i]);
        int64_t n = dt_tensor_numel(in[i]);
        for (int64_t j = 0; j < n; j++)
            dt_tensor_set(in[i], j, vals[i][j]);
        dt_tensor_set_requires_grad(in[i], true);
    }
    /* Native: the cache emptied, then primed by the native kernels with the
     * op's layouts; the op (forward and backward) must then create no
     * primitive (the widening path would create f32 ones), and its output
     * is the native forward's, bit for bit. */
    bool native = dt == DT_BF16 && dt_k_conv2d_native(DT_BF16);
    int ab = dt_k_act_block(), ob = blocked && ab && s->K % ab == 0 ? ab : 0;
    int64_t P, Q, ny0 = ysz(s, &P, &Q);
    uint16_t *yref = native ? malloc((size_t)ny0 * 2) : NULL;
    if (native) {
        float *tx = malloc((size_t)xsz(s) * 4), *tw = malloc((size_t)wsz(s) * 4), *tb = malloc((size_t)s->K * 4);
        dt_k_cache_clear();
        bool pr = dt_k_conv2d_fwd_t(s, in[0]->data, in[1]->data, vals[2], yref, DT_BF16, DT_BF16,
                                    lay_bits(0, ob)) == DT_OK &&
                  dt_k_conv2d_bwd_data_t(s, yref, in[1]->data, tx, DT_BF16, lay_bits(0, ob)) == DT_OK &&
                  dt_k_conv2d_bwd_weights_t(s, in[0]->data, yref, tw, tb, DT_BF16, lay_bits(0, ob)) == DT_OK;
        free(tx), free(tw), free(tb);
        if (!pr) {
            fprintf(stderr, "native kernels: %s\n", dt_last_error());
            goto out;
        }
        dt_k_stats_reset();
    }
    bool oldb = dt_ctx_set_blocked(ctx, blocked);
    dt_tensor *y = dt_conv2d(ctx, in[0], in[1], in[2], (int)s->stride_h, (int)s->pad_h);
    dt_ctx_set_blocked(ctx, oldb);
    if (!y || y->dtype != dt) {
        fprintf(stderr, "dt_conv2d in %s: %s\n", dt_dtype_name(dt), y ? "wrong result dtype" : dt_last_error());
        goto out;
    }
    if (dt_tensor_block(y) != ob) { /* the widening path keeps the layout too */
        fprintf(stderr, "dt_conv2d wrote layout %d, want %d\n", dt_tensor_block(y), ob);
        goto out;
    }
    *ysame = !native || !memcmp(yref, y->data, (size_t)ny0 * 2);
    dt_tensor *yp = dt_contiguous(ctx, dt_cast(ctx, y, DT_F32)); /* plain f32 */
    if (!yp)
        goto out;
    int64_t ny = dt_tensor_numel(yp);
    memcpy(yv, yp->data, (size_t)ny * 4);
    dt_tensor *Rt = dt_tensor_empty(ctx, DT_F32, 4, yp->shape);
    memcpy(Rt->data, R, (size_t)ny * 4);
    dt_tensor *loss = dt_sum(ctx, dt_mul(ctx, yp, Rt));
    if (!loss || dt_backward(ctx, loss) < 0) {
        fprintf(stderr, "backward: %s\n", dt_last_error());
        goto out;
    }
    for (int i = 0; i < 3; i++) {
        int64_t n = dt_tensor_numel(in[i]);
        for (int64_t j = 0; j < n; j++)
            g[i][j] = (float)dt_tensor_get(in[i]->grad, j);
    }
    if (native) {
        dt_k_stats st;
        dt_k_stats_get(&st);
        if (st.primitives_created)
            *ysame = false;
    }
    ok = true;
out:
    free(yref);
    for (int i = 0; i < 3; i++)
        dt_tensor_free(in[i]);
    dt_ctx_free(ctx);
    return ok;
}

TEST(op_bf16_vs_f32)
{
    printf("bf16 convolution native: %s (oneDNN isa %s)\n", dt_k_conv2d_native(DT_BF16) ? "yes" : "no",
           dt_k_onednn_isa());
    for (int si = 0; si < 5; si++) {
        dt_k_conv2d_shape s = shapes[si];
        if (s.stride_h != s.stride_w || s.pad_h != s.pad_w || s.dil_h != 1 || s.dil_w != 1)
            continue; /* dt_conv2d: one stride and padding, no dilation */
        int64_t P, Q, ny = ysz(&s, &P, &Q);
        int64_t n[3] = {xsz(&s), wsz(&s), s.K};
        float *v[3], *av[3], *g[3], *g0[3], *A[3];
        float *R = malloc(ny * 4), *aR = malloc(ny * 4), *y = malloc(ny * 4), *y0 = malloc(ny * 4),
              *Ay = malloc(ny * 4);
        for (int i = 0; i < 3; i++) {
            v[i] = malloc(n[i] * 4), av[i] = malloc(n[i] * 4), g[i] = malloc(n[i] * 4);
            g0[i] = malloc(n[i] * 4), A[i] = malloc(n[i] * 4);
            fill_bf16(v[i], NULL, n[i], 50 + 3 * si + i);
            absv(v[i], av[i], n[i]);
        }
        fill_bf16(R, NULL, ny, 60 + si);
        absv(R, aR, ny);
        bool same = true, same0 = true;
        ASSERT(run_op(DT_F32, false, &s, v, R, y0, g0, &same0));
        ASSERT(run_op(DT_F32, false, &s, av, aR, Ay, A, &same0));
        for (int blk = 0; blk < 2; blk++) {
            ASSERT(run_op(DT_BF16, blk, &s, v, R, y, g, &same));
            if (!same)
                TEST_FAIL_("shape %d blocked %d: dt_conv2d in bf16 did not run the native kernels", si, blk);
            int bad = check_bound("op forward", y, y0, Ay, ny, 0x1p-8, s.C * s.R * s.S + 1);
            /* the gradient of y is rounded to bf16 (R is bf16-valued: exact) */
            bad += check_bound("op dx", g[0], g0[0], A[0], n[0], 0x1p-8, s.K * s.R * s.S);
            bad += check_bound("op dw", g[1], g0[1], A[1], n[1], 0x1p-8, s.N * P * Q);
            bad += check_bound("op dbias", g[2], g0[2], A[2], n[2], 0x1p-8, s.N * P * Q);
            if (bad)
                TEST_FAIL_("shape %d blocked %d: %d elements outside the bound", si, blk, bad);
        }
        for (int i = 0; i < 3; i++)
            free(v[i]), free(av[i]), free(g[i]), free(g0[i]), free(A[i]);
        free(R), free(aR), free(y), free(y0), free(Ay);
    }
}

int main(int argc, char **argv)
{
    init_shapes();
    bool fallback_only = argc > 1 && !strcmp(argv[1], "fallback");
    if (fallback_only && dt_k_conv2d_native(DT_BF16)) {
        fprintf(stderr, "fallback: bf16 convolution still native (run under ONEDNN_MAX_CPU_ISA=AVX2 / "
                        "DT_MAX_CPU_ISA=avx2)\n");
        return 1;
    }
    if (!fallback_only)
        RUN(native_kernels);
    RUN(dtype_errors);
    RUN(op_bf16_vs_f32);
    return TEST_REPORT();
}
