/* dt_linear_cross_entropy, the LM head fused with the cross-entropy:
 * finite-difference gradients (uneven chunks, an ignored row), equality
 * with the unfused dt_cross_entropy(dt_linear(x, w)) for several chunk
 * sizes and an upstream gradient other than 1 (loss within 1e-6 relative,
 * gradients within 1e-5 of the largest entry: float rounding of per-chunk
 * means and per-chunk dW sums), the same in bf16 and under bf16 autocast
 * (the loss within 1e-5, gradients within one bf16 rounding, 8e-3 of the
 * largest entry), the default chunking holding a GPT-2-sized bf16 head in
 * one chunk (no recomputation), all rows ignored, and bad inputs. */
#include "dtrain/kernels.h"
#include "dtrain/precision.h"
#include "gradcheck.h"

#include <math.h>


enum { B = 2, T = 5, C = 8, V = 37 };

static dt_tensor *labels_new(bool ignore_one)
{
    dt_tensor *lab = dt_tensor_new(DT_I64, 2, SH(B, T));
    int64_t *l = lab->data;
    for (int64_t i = 0; i < B * T; i++)
        l[i] = (i * 11 + 3) % V;
    if (ignore_one)
        l[4] = DT_K_IGNORE_INDEX;
    return lab;
}

typedef struct {
    dt_tensor *lab;
    int64_t rows;
} fused_ud;

static dt_tensor *f_fused(dt_ctx *c, dt_tensor **in, void *u)
{
    const fused_ud *f = u;
    return dt_linear_cross_entropy(c, in[0], in[1], f->lab, f->rows);
}

TEST(gradcheck_chunks)
{
    dt_tensor *in[2] = {gc_tensor(3, SH(B, T, C), 5, true), gc_tensor(2, SH(V, C), 6, true)};
    fused_ud u = {labels_new(true), 3}; /* chunks of 3, 3, 3, 1 rows */
    int bad = gradcheck("linear_cross_entropy", 2, in, f_fused, &u, 1e-2, 2e-3, 2e-2);
    dt_tensor_free(in[0]);
    dt_tensor_free(in[1]);
    dt_tensor_free(u.lab);
    ASSERT_EQ_INT(bad, 0);
}

/* Loss and the gradients of x and w (with upstream gradient g) of the fused
 * op (rows >= 0) or the unfused ops (rows < 0). autocast: run under bf16
 * autocast. */
static dt_status run_once(dt_tensor *x, dt_tensor *w, dt_tensor *lab, int64_t rows, bool autocast, float g,
                          float *loss, float *gx, float *gw)
{
    dt_ctx *ctx;
    dt_status st = dt_ctx_init(NULL, &ctx);
    if (st < 0)
        return st;
    if (autocast)
        dt_autocast_set(ctx, DT_BF16, NULL);
    dt_ag_zero_grad(x);
    dt_ag_zero_grad(w);
    dt_tensor *l;
    if (rows >= 0)
        l = dt_linear_cross_entropy(ctx, x, w, lab, rows);
    else
        l = dt_cross_entropy(ctx, dt_reshape(ctx, dt_linear(ctx, x, w, NULL), 2, SH(-1, V)),
                             dt_reshape(ctx, lab, 1, SH(-1)));
    if (!l) {
        dt_ctx_free(ctx);
        return dt_last_status();
    }
    *loss = (float)dt_tensor_item(l);
    st = dt_backward_with(ctx, l, dt_tensor_from(ctx, DT_F32, 0, NULL, &g));
    if (st == DT_OK) {
        float *dst[2] = {gx, gw};
        dt_tensor *src[2] = {x, w};
        for (int i = 0; i < 2; i++) { /* the gradient, widened to f32 from its own dtype */
            int64_t n = dt_tensor_numel(src[i]);
            dt_k_convert(src[i]->grad->data, src[i]->grad->dtype, dst[i], DT_F32, n);
        }
    }
    dt_ctx_free(ctx);
    return st;
}

static double max_abs(const float *a, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i]));
    return m;
}

/* fused (each chunk size) against unfused: |loss diff| <= lrel |loss|, every
 * gradient entry within grel of the largest one. */
static int compare(dt_tensor *x, dt_tensor *w, dt_tensor *lab, bool autocast, double lrel, double grel)
{
    float l0, l1, gx0[B * T * C], gw0[V * C], gx1[B * T * C], gw1[V * C];
    if (run_once(x, w, lab, -1, autocast, 0.37f, &l0, gx0, gw0) < 0) {
        fprintf(stderr, "unfused: %s\n", dt_last_error());
        return 1;
    }
    int bad = 0;
    const int64_t rows[] = {0, 1, 4, 7, B * T, 1000};
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        if (run_once(x, w, lab, rows[k], autocast, 0.37f, &l1, gx1, gw1) < 0) {
            fprintf(stderr, "fused rows %lld: %s\n", (long long)rows[k], dt_last_error());
            return 1;
        }
        double mx = max_abs(gx0, B * T * C), mw = max_abs(gw0, V * C);
        if (!(fabs(l1 - l0) <= lrel * fabs(l0)))
            bad++, fprintf(stderr, "rows %lld: loss %.9g vs unfused %.9g\n", (long long)rows[k], l1, l0);
        for (int64_t i = 0; i < B * T * C; i++)
            if (!(fabs(gx1[i] - gx0[i]) <= grel * mx))
                bad++, fprintf(stderr, "rows %lld: dx[%lld] %.9g vs %.9g\n", (long long)rows[k], (long long)i,
                               gx1[i], gx0[i]);
        for (int64_t i = 0; i < V * C; i++)
            if (!(fabs(gw1[i] - gw0[i]) <= grel * mw))
                bad++, fprintf(stderr, "rows %lld: dw[%lld] %.9g vs %.9g\n", (long long)rows[k], (long long)i,
                               gw1[i], gw0[i]);
        if (mx == 0 || mw == 0)
            bad++, fprintf(stderr, "zero gradients\n");
    }
    return bad;
}

TEST(equals_unfused_f32)
{
    dt_tensor *x = gc_tensor(3, SH(B, T, C), 7, true), *w = gc_tensor(2, SH(V, C), 8, true);
    dt_tensor *lab = labels_new(true);
    int bad = compare(x, w, lab, false, 1e-6, 1e-5);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_tensor_free(lab);
    ASSERT_EQ_INT(bad, 0);
}

/* A persistent bf16 leaf holding the bf16 rounding of an N(0, 1) draw. */
static dt_tensor *bf16_leaf(int ndim, const int64_t *shape, uint64_t seed)
{
    dt_tensor *f = gc_tensor(ndim, shape, seed, false);
    dt_tensor *t = dt_tensor_new(DT_BF16, ndim, shape);
    dt_k_convert(f->data, DT_F32, t->data, DT_BF16, dt_tensor_numel(f));
    dt_tensor_set_requires_grad(t, true);
    dt_tensor_free(f);
    return t;
}

TEST(equals_unfused_bf16)
{
    dt_tensor *lab = labels_new(false);
    dt_tensor *x = bf16_leaf(3, SH(B, T, C), 9), *w = bf16_leaf(2, SH(V, C), 10);
    int bad = compare(x, w, lab, false, 1e-5, 8e-3);
    dt_tensor_free(x);
    dt_tensor_free(w);
    /* f32 leaves under bf16 autocast: both paths cast them to bf16 */
    x = gc_tensor(3, SH(B, T, C), 11, true), w = gc_tensor(2, SH(V, C), 12, true);
    bad += compare(x, w, lab, true, 1e-5, 8e-3);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_tensor_free(lab);
    ASSERT_EQ_INT(bad, 0);
}

/* The default chunking (chunk_rows 0) keeps a GPT-2-sized bf16 head in one
 * chunk: 1,400 rows of 50,304 bf16 logits (141 MB) take one forward GEMM and
 * one dx and one dW GEMM, with no recomputed chunk (at the old 64 MB counted
 * in f32 bytes they took 5 chunks: 19 GEMM calls). Where oneDNN writes no
 * bf16 (an AVX2-only CPU, or ONEDNN_MAX_CPU_ISA below AVX-512) each row
 * also holds its f32 result, 6 bytes a logit: 889 rows fit the 256 MiB, so
 * 880 rows there. */
TEST(default_chunks_bf16_one_chunk)
{
    enum { VB = 50304, CB = 8 };
    const int64_t N = dt_k_matmul_writes_lp(DT_BF16) ? 1400 : 880;
    dt_tensor *x = bf16_leaf(2, SH(N, CB), 21), *w = bf16_leaf(2, SH(VB, CB), 22);
    dt_tensor *lab = dt_tensor_new(DT_I64, 1, SH(N));
    ASSERT(x && w && lab);
    for (int64_t i = 0; i < N; i++)
        ((int64_t *)lab->data)[i] = (i * 7919) % VB;
    dt_ctx *ctx = NULL;
    ASSERT_EQ_INT(dt_ctx_init(NULL, &ctx), DT_OK);
    ASSERT_EQ_INT(dt_k_gemm_record_start(), DT_OK);
    dt_tensor *l = dt_linear_cross_entropy(ctx, x, w, lab, 0);
    ASSERT(l != NULL);
    ASSERT_EQ_INT(dt_backward(ctx, l), DT_OK);
    dt_k_gemm_shape g[16];
    int n = 0;
    ASSERT_EQ_INT(dt_k_gemm_record_stop(g, 16, &n), DT_OK);
    int64_t calls = 0, rows = 0;
    for (int i = 0; i < n && i < 16; i++) {
        calls += g[i].count;
        if (!g[i].trans_a && g[i].trans_b && g[i].K == CB) /* the forward's logits x W^T */
            rows += g[i].M * g[i].count;
    }
    fprintf(stderr, "%lld GEMM calls, %lld logit rows computed\n", (long long)calls, (long long)rows);
    ASSERT_EQ_INT((int)rows, N); /* every row's logits once: no recomputed chunk */
    ASSERT_EQ_INT((int)calls, 3);
    ASSERT(isfinite(dt_tensor_item(l)) && w->grad != NULL);
    dt_ctx_free(ctx);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_tensor_free(lab);
}

TEST(all_ignored)
{
    dt_tensor *x = gc_tensor(3, SH(B, T, C), 13, true), *w = gc_tensor(2, SH(V, C), 14, true);
    dt_tensor *lab = labels_new(false);
    for (int64_t i = 0; i < B * T; i++)
        ((int64_t *)lab->data)[i] = DT_K_IGNORE_INDEX;
    float l, gx[B * T * C], gw[V * C];
    ASSERT_OK(run_once(x, w, lab, 3, false, 1.0f, &l, gx, gw));
    ASSERT(l == 0.0f);
    ASSERT(max_abs(gx, B * T * C) == 0.0 && max_abs(gw, V * C) == 0.0);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_tensor_free(lab);
}

TEST(bad_inputs)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_new(DT_F32, 3, SH(B, T, C)), *w = dt_tensor_new(DT_F32, 2, SH(V, C));
    dt_tensor *w2 = dt_tensor_new(DT_F32, 2, SH(V, C + 1)), *lab = labels_new(false);
    dt_tensor *lab2 = dt_tensor_new(DT_I64, 1, SH(B * T - 1)), *labf = dt_tensor_new(DT_F32, 2, SH(B, T));
    ASSERT(dt_linear_cross_entropy(ctx, x, w2, lab, 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "[37,9]");
    ASSERT(dt_linear_cross_entropy(ctx, x, w, lab2, 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_linear_cross_entropy(ctx, x, w, labf, 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_DTYPE);
    ASSERT(dt_linear_cross_entropy(ctx, x, w, lab, -2) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ((int64_t *)lab->data)[3] = V;
    ASSERT(dt_linear_cross_entropy(ctx, x, w, lab, 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_RANGE);
    ASSERT(dt_linear_cross_entropy(ctx, NULL, w, lab, 0) == NULL);
    dt_tensor *all[] = {x, w, w2, lab, lab2, labf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_tensor_free(all[i]);
    dt_ctx_free(ctx);
}

int main(void)
{
    (void)gc_distinct;
    (void)gc_away_from_zero;
    RUN(gradcheck_chunks);
    RUN(equals_unfused_f32);
    RUN(equals_unfused_bf16);
    RUN(default_chunks_bf16_one_chunk);
    RUN(all_ignored);
    RUN(bad_inputs);
    return TEST_REPORT();
}
