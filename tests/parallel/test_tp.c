/* Tensor parallelism (tp.h), real processes over shm:
 *
 *   - f, g, gather and scatter along the last dim, and sequence
 *     parallelism's gather / reduce-scatter / scatter along dim 1: forward
 *     values and gradients against their definitions (2 and 3 ranks); the
 *     forms on a partial sum the caller gives up (dt_tp_reduce_partial,
 *     dt_tp_sp_reduce_scatter_partial): the same values and gradients, the
 *     product's memory reused; sequence parallelism's column products
 *     (dt_tp_sp_gather_products) against the gather and the products, the
 *     gathered rows' memory overwritten before backward;
 *   - RMSNorm over a last dim the ranks split (OLMo 2's q_norm) against
 *     dt_rms_norm over the whole rows: values and gradients (2 and 3
 *     ranks), bf16;
 *   - the vocabulary-parallel cross-entropy against dt_cross_entropy of the
 *     whole logits (loss and gradient), a vocabulary not divisible by the
 *     group (padding) and an ignored label;
 *   - column / row parallel layers in a Sequential equal the single-process
 *     Linear pair at step 0 (exact) and in forward;
 *   - slicing a weight of blocks of different sizes (Phi-3's q | k | v)
 *     and putting the slices back;
 *   - the zoo's tensor-parallel MLP on 2 ranks: exactly the single-process
 *     weights at step 0, and within the rounding bound after k SGD steps;
 *   - (the tensor-parallel GPT: test_tp_gpt.c);
 *   - clear errors: n_head or the MLP's hidden width not divisible by the
 *     group, convnet; the trainer refuses ZeRO over a tensor-parallel model,
 *     and the norm, saving and loading of slices with no known group
 *     (checkpoints, clipping and dropout under --tp: test_train_tp_ckpt.c,
 *     test_train_tp_cli.c).
 *
 * The rounding bound (test_tp_mlp_steps): tensor parallelism computes the
 * same products with the contraction of w1 (length K = hidden) summed as t
 * partial sums that g then adds, i.e. the same terms in another order. A
 * reordered float sum of K terms differs by at most gamma_K * sum|terms|,
 * gamma_K = K u / (1 - K u), u = 2^-24 (Higham, Accuracy and Stability,
 * 3.1); the gradients are two such products deep (forward, backward), so
 * each gradient element differs relatively by at most ~2 gamma_K, and after
 * k SGD steps (no momentum) the weights by at most 2 gamma_K * sum_k lr |g|
 * = 2 gamma_K |w_k - w_0| per element, plus the rounding of the update
 * itself (u |w| a step). The test asserts that bound with a factor 2 of
 * margin. */
// dt-test-timeout: 120
#include "test.h"
#include "parallel/tp_util.h"
#include "dtrain/precision.h"

/* ---- f, g, gather, scatter ------------------------------------------------------------- */

enum { M = 3, N = 4 };

static int ops_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    float xv[M * N], w[M * N * 8], full[M * N * 8];
    /* f: y = x; loss = sum(y * w_r) -> dx = sum_r w_r */
    fill(xv, M * N, 1, 0);
    fill(w, M * N, 2, (uint64_t)rank * M * N);
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, xv);
    dt_tensor_set_requires_grad(x, true);
    dt_tensor *y = dt_tp_copy_to_region(ctx, pg, x);
    dt_tensor *wt = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, w);
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, wt))));
    for (int i = 0; i < M * N; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) {
            float wr;
            fill(&wr, 1, 2, (uint64_t)(r * M * N + i));
            want += wr;
        }
        TH_CHECK(dt_tensor_get(y, i) == xv[i], "f forward [%d]", i);
        TH_CHECK(fabs(dt_tensor_get(x->grad, i) - want) < 1e-6, "f backward [%d]: %g, want %g", i,
                 dt_tensor_get(x->grad, i), want);
    }
    dt_ctx_reset(ctx);
    /* g: y = sum_r x_r; loss = sum(y * w) (w the same everywhere) -> dx_r = w */
    fill(xv, M * N, 3, (uint64_t)rank * M * N);
    fill(w, M * N, 4, 0);
    x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, xv);
    dt_tensor_set_requires_grad(x, true);
    y = dt_tp_reduce_from_region(ctx, pg, x);
    wt = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, w);
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, wt))));
    for (int i = 0; i < M * N; i++) {
        double want = 0;
        for (int r = 0; r < size; r++) {
            float v;
            fill(&v, 1, 3, (uint64_t)(r * M * N + i));
            want += v;
        }
        TH_CHECK(fabs(dt_tensor_get(y, i) - want) < 1e-6, "g forward [%d]: %g, want %g", i, dt_tensor_get(y, i),
                 want);
        TH_CHECK(dt_tensor_get(x->grad, i) == w[i], "g backward [%d]", i);
    }
    dt_ctx_reset(ctx);
    /* gather: y[m, r N + j] = x_r[m, j]; loss = sum(y * W) -> dx_r = W[:, r N..] */
    fill(xv, M * N, 5, (uint64_t)rank * M * N);
    fill(w, M * N * size, 6, 0);
    x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, xv);
    dt_tensor_set_requires_grad(x, true);
    y = dt_tp_gather_last(ctx, pg, x);
    TH_CHECK(y && y->shape[1] == N * size, "gather shape");
    wt = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N * size}, w);
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, wt))));
    for (int m = 0; m < M; m++)
        for (int r = 0; r < size; r++)
            for (int j = 0; j < N; j++) {
                float v;
                fill(&v, 1, 5, (uint64_t)(r * M * N + m * N + j));
                TH_CHECK(dt_tensor_get(y, m * N * size + r * N + j) == v, "gather forward");
                if (r == rank)
                    TH_CHECK(dt_tensor_get(x->grad, m * N + j) == w[m * N * size + r * N + j], "gather backward");
            }
    dt_ctx_reset(ctx);
    /* scatter: x [M, N size] the same everywhere, y = x[:, rank N..]; loss = sum(y * w_r)
     * -> dx = the w_r side by side (all-gathered) */
    fill(full, M * N * size, 7, 0);
    fill(w, M * N, 8, (uint64_t)rank * M * N);
    x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N * size}, full);
    dt_tensor_set_requires_grad(x, true);
    y = dt_tp_scatter_last(ctx, pg, x);
    TH_CHECK(y && y->shape[1] == N, "scatter shape");
    wt = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N}, w);
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, wt))));
    for (int m = 0; m < M; m++)
        for (int r = 0; r < size; r++)
            for (int j = 0; j < N; j++) {
                float v;
                fill(&v, 1, 8, (uint64_t)(r * M * N + m * N + j));
                if (r == rank)
                    TH_CHECK(dt_tensor_get(y, m * N + j) == full[m * N * size + r * N + j], "scatter forward");
                TH_CHECK(dt_tensor_get(x->grad, m * N * size + r * N + j) == v, "scatter backward");
            }
    dt_ctx_reset(ctx);
    /* the scatter of a last dim that the group does not divide is an error */
    if (size > 1) {
        x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){M, N * size + 1}, full);
        TH_CHECK(!dt_tp_scatter_last(ctx, pg, x) && dt_last_status() == DT_ERR_SHAPE, "scatter of %d columns",
                 N * size + 1);
    }
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

/* Sequence parallelism along dim 1 of [SB, ST, SC] (ST the chunk of one rank). */
enum { SB = 2, ST = 2, SC = 3 };

/* value of element (b, t, c) of rank q's tensor of stream s, T positions along dim 1 */
static float sv(int s, int q, int T, int b, int t, int c)
{
    float v;
    fill(&v, 1, (uint64_t)s, (uint64_t)(q * SB * T * SC + (b * T + t) * SC + c));
    return v;
}

static int sp_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    const int T = ST * size, nl = SB * ST * SC, nf = SB * T * SC;
    float *xl = malloc(sizeof(float) * (size_t)nf), *wl = malloc(sizeof(float) * (size_t)nf);
    TH_CHECK(xl && wl, "memory");
    /* scatter: x full (the same everywhere); dx = every rank's w side by side (all-gather) */
    fill(xl, nf, 20, 0);
    fill(wl, nl, 21, (uint64_t)rank * nl);
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, xl);
    dt_tensor_set_requires_grad(x, true);
    dt_tensor *y = dt_tp_sp_scatter(ctx, pg, x, 1);
    TH_CHECK(y && y->shape[1] == ST, "sp scatter: %s", dt_last_error());
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, ST, SC}, wl)))));
    for (int b = 0; b < SB; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < SC; c++) {
                int q = t / ST;
                if (q == rank)
                    TH_CHECK(dt_tensor_get(y, (b * ST + t % ST) * SC + c) == xl[(b * T + t) * SC + c], "sp scatter fwd");
                TH_CHECK(dt_tensor_get(x->grad, (b * T + t) * SC + c) == sv(21, q, ST, b, t % ST, c), "sp scatter bwd");
            }
    dt_ctx_reset(ctx);
    /* gather: x_r the rank's chunk, y the chunks side by side; loss sum(y * W_r), W_r
     * per rank -> dx_r = sum_q W_q over chunk r (reduce-scatter) */
    fill(xl, nl, 22, (uint64_t)rank * nl);
    fill(wl, nf, 23, (uint64_t)rank * nf);
    x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, ST, SC}, xl);
    dt_tensor_set_requires_grad(x, true);
    y = dt_tp_sp_gather(ctx, pg, x, -2);
    TH_CHECK(y && y->shape[1] == T, "sp gather: %s", dt_last_error());
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, wl)))));
    for (int b = 0; b < SB; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < SC; c++) {
                TH_CHECK(dt_tensor_get(y, (b * T + t) * SC + c) == sv(22, t / ST, ST, b, t % ST, c), "sp gather fwd");
                if (t / ST != rank)
                    continue;
                double want = 0;
                for (int q = 0; q < size; q++)
                    want += sv(23, q, T, b, t, c);
                TH_CHECK(fabs(dt_tensor_get(x->grad, (b * ST + t % ST) * SC + c) - want) < 1e-6, "sp gather bwd");
            }
    dt_ctx_reset(ctx);
    /* reduce-scatter: y = chunk r of sum_q x_q; loss sum(y * w_r) -> dx_r = the w_q side by side */
    fill(xl, nf, 24, (uint64_t)rank * nf);
    fill(wl, nl, 25, (uint64_t)rank * nl);
    x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, xl);
    dt_tensor_set_requires_grad(x, true);
    y = dt_tp_sp_reduce_scatter(ctx, pg, x, 1);
    TH_CHECK(y && y->shape[1] == ST, "sp reduce-scatter: %s", dt_last_error());
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, ST, SC}, wl)))));
    for (int b = 0; b < SB; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < SC; c++) {
                if (t / ST == rank) {
                    double want = 0;
                    for (int q = 0; q < size; q++)
                        want += sv(24, q, T, b, t, c);
                    TH_CHECK(fabs(dt_tensor_get(y, (b * ST + t % ST) * SC + c) - want) < 1e-6, "sp rs fwd");
                }
                TH_CHECK(dt_tensor_get(x->grad, (b * T + t) * SC + c) == sv(25, t / ST, ST, b, t % ST, c), "sp rs bwd");
            }
    /* a dim the group does not divide, a dim outside the tensor */
    x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, xl);
    int bad = size == 3 ? 0 : 2; /* SB = 2 or SC = 3 positions: not divisible by the group */
    TH_CHECK(!dt_tp_sp_scatter(ctx, pg, x, bad) && dt_last_status() == DT_ERR_SHAPE, "scatter of dim %d", bad);
    TH_CHECK(!dt_tp_sp_gather(ctx, pg, x, 3) && dt_last_status() == DT_ERR_SHAPE, "gather of dim 3");
    free(xl);
    free(wl);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

/* The forms on a partial sum the caller gives up (a row-parallel layer's product): the same values and gradients
 * as g and the reduce-scatter, the all-reduce's sum in the product's own memory, the reduce-scatter's product
 * given back to the arena (the next allocation of its size reuses it); a leaf is not given up (copied, kept). */
static int partial_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    const int T = ST * size, nf = SB * T * SC, nl = SB * ST * SC;
    float *xl = malloc(sizeof(float) * (size_t)nf), *wl = malloc(sizeof(float) * (size_t)nf);
    float *want_y = malloc(sizeof(float) * (size_t)nf), *want_g = malloc(sizeof(float) * (size_t)nf);
    TH_CHECK(xl && wl && want_y && want_g, "memory");
    fill(xl, nf, 30, (uint64_t)rank * nf);
    fill(wl, nf, 31, (uint64_t)rank * nf);
    for (int sp = 0; sp < 2; sp++)
        for (int given = 0; given < 2; given++) { /* the plain op first: its values are the wanted ones */
            const int64_t yshape[3] = {SB, sp ? ST : T, SC};
            dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, xl);
            dt_tensor_set_requires_grad(x, true);
            dt_tensor *two = dt_tensor_full(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, 2.0);
            dt_tensor *prod = dt_mul(ctx, x, two); /* an op's own output */
            TH_CHECK(prod, "product");
            dt_tensor *y = !given ? (sp ? dt_tp_sp_reduce_scatter(ctx, pg, prod, 1) : dt_tp_reduce_from_region(ctx, pg, prod))
                                  : sp ? dt_tp_sp_reduce_scatter_partial(ctx, pg, prod, 1)
                                       : dt_tp_reduce_partial(ctx, pg, prod);
            TH_CHECK(y && y->shape[1] == yshape[1], "%s%s: %s", sp ? "reduce-scatter" : "g", given ? " partial" : "",
                     dt_last_error());
            if (given && !sp)
                TH_CHECK(y->data == prod->data, "the partial g's sum is not in the product's memory");
            if (given && sp) {
                dt_tensor *again = dt_tensor_empty(ctx, DT_F32, 3, (int64_t[]){SB, T, SC});
                TH_CHECK(again && again->data == prod->data, "the partial reduce-scatter kept its product");
            }
            TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 3, yshape, wl)))));
            const int ny = sp ? nl : nf;
            for (int i = 0; i < ny; i++) {
                if (!given)
                    want_y[i] = dt_tensor_get(y, i);
                else
                    TH_CHECK(dt_tensor_get(y, i) == want_y[i], "%s partial forward [%d]", sp ? "rs" : "g", i);
            }
            for (int i = 0; i < nf; i++) {
                if (!given)
                    want_g[i] = dt_tensor_get(x->grad, i);
                else
                    TH_CHECK(dt_tensor_get(x->grad, i) == want_g[i], "%s partial backward [%d]", sp ? "rs" : "g", i);
            }
            dt_ctx_reset(ctx);
        }
    /* a leaf is not the caller's to give up: summed into a copy, itself unchanged */
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, SC}, xl);
    dt_tensor *y = dt_tp_reduce_partial(ctx, pg, x);
    TH_CHECK(y && y->data != x->data && dt_tensor_get(x, 0) == xl[0], "g partial of a leaf");
    y = dt_tp_sp_reduce_scatter_partial(ctx, pg, x, 1);
    TH_CHECK(y && dt_tensor_get(x, nf - 1) == xl[nf - 1], "reduce-scatter partial of a leaf");
    free(xl), free(wl), free(want_y), free(want_g);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_partial_sums_reuse_their_memory)
{
    ASSERT_EQ_INT(th_run(2, 30, partial_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30, partial_body, NULL, NULL), 0);
}

/* dt_tp_sp_gather_products against dt_tp_sp_gather and the products (f32 and under bf16 autocast; two weights in
 * the [in, out] layout, one with a bias, and one [out, in]): the same values and gradients, bit for bit, while the
 * gathered rows' memory, handed out again and filled with NaN before backward, is not read. */
enum { PC = 4, PO0 = 6, PO1 = 5 };

static int products_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    const int T = ST * size, nl = SB * ST * PC;
    float xl[SB * ST * PC], w0[PC * PO0], w1[PC * PO1], b0[PO0], u[SB * 4 * ST * (PO0 + PO1)];
    float want[2][SB * ST * PC + PC * (PO0 + PO1) + PO0];
    fill(xl, nl, 40, (uint64_t)rank * nl);
    fill(w0, PC * PO0, 41, 0);
    fill(w1, PC * PO1, 42, 0);
    fill(b0, PO0, 43, 0);
    fill(u, SB * T * (PO0 + PO1), 44, (uint64_t)rank * 1000);
    for (int bf = 0; bf < 2; bf++)
        for (int fused = 0; fused < 2; fused++)
            for (int wio = 0; wio < 2; wio++) {
                if (bf)
                    TH_OK(dt_autocast_set(ctx, DT_BF16, NULL));
                dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, ST, PC}, xl);
                /* [in, out] as given, or the same weights stored [out, in] */
                dt_tensor *W[2] = {dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){PC, PO0}, w0),
                                   dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){PC, PO1}, w1)};
                if (!wio)
                    for (int i = 0; i < 2; i++)
                        W[i] = dt_contiguous(ctx, dt_transpose(ctx, W[i], 0, 1));
                dt_tensor *B[2] = {dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){PO0}, b0), NULL};
                dt_tensor_set_requires_grad(x, true);
                for (int i = 0; i < 2; i++)
                    dt_tensor_set_requires_grad(W[i], true);
                dt_tensor_set_requires_grad(B[0], true);
                dt_tensor *y[2];
                if (fused) {
                    TH_OK(dt_tp_sp_gather_products(ctx, pg, x, 1, 2, W, B, wio, y));
                    /* the gathered rows' memory (the most recent given back of its size) handed out again */
                    dt_tensor *again = dt_tensor_empty(ctx, DT_F32, 3, (int64_t[]){SB, T, PC});
                    TH_CHECK(again, "memory");
                    for (int i = 0; i < SB * T * PC; i++)
                        ((float *)again->data)[i] = NAN;
                } else {
                    dt_tensor *g = dt_tp_sp_gather(ctx, pg, x, 1);
                    for (int i = 0; i < 2; i++)
                        y[i] = wio ? dt_addmm(ctx, g, W[i], B[i]) : dt_linear(ctx, g, W[i], B[i]);
                }
                TH_CHECK(y[0] && y[1] && y[0]->shape[1] == T && y[1]->shape[2] == PO1, "products: %s",
                         dt_last_error());
                dt_tensor *l0 = dt_sum(ctx, dt_mul(ctx, y[0], dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, PO0}, u)));
                dt_tensor *l1 = dt_sum(ctx, dt_mul(ctx, y[1], dt_tensor_from(ctx, DT_F32, 3, (int64_t[]){SB, T, PO1},
                                                                             u + SB * T * PO0)));
                TH_OK(dt_backward(ctx, dt_add(ctx, l0, l1)));
                float got[SB * ST * PC + PC * (PO0 + PO1) + PO0];
                int k = 0;
                for (int i = 0; i < nl; i++)
                    got[k++] = dt_tensor_get(x->grad, i);
                for (int j = 0; j < 2; j++) /* in the [in, out] order */
                    for (int a = 0; a < PC; a++)
                        for (int o = 0; o < (j ? PO1 : PO0); o++)
                            got[k++] = dt_tensor_get(W[j]->grad, wio ? a * (j ? PO1 : PO0) + o : o * PC + a);
                for (int o = 0; o < PO0; o++)
                    got[k++] = dt_tensor_get(B[0]->grad, o);
                for (int i = 0; i < k; i++) {
                    if (!fused)
                        want[bf][i] = got[i];
                    else
                        TH_CHECK(got[i] == want[bf][i] && isfinite(got[i]), "%s %s: gradient %d: %g, the gather and "
                                 "products %g", bf ? "bf16" : "f32", wio ? "[in, out]" : "[out, in]", i, got[i],
                                 want[bf][i]);
                }
                dt_ctx_reset(ctx);
                TH_OK(dt_autocast_set(ctx, DT_F32, NULL));
            }
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_sequence_parallel_products_gather_again)
{
    ASSERT_EQ_INT(th_run(2, 30, products_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30, products_body, NULL, NULL), 0);
}

TEST(tp_ops_grad)
{
    ASSERT_EQ_INT(th_run(2, 30, ops_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30, ops_body, NULL, NULL), 0);
}

TEST(tp_sequence_parallel_ops)
{
    ASSERT_EQ_INT(th_run(2, 30, sp_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30, sp_body, NULL, NULL), 0);
}

/* ---- RMSNorm over a split last dim (OLMo 2's q_norm) ------------------------------------------- */

enum { NR = 5, NC = 4 }; /* rows, each rank's columns */

/* The rank's columns [r NC, (r + 1) NC) of rows of size NC t, and its slice of
 * the weight: forward and the gradients of x and of the weight against
 * dt_rms_norm over the whole rows (loss = sum(y * u), u the same everywhere);
 * in bf16 the result in bf16 against the f32 one rounded. */
static int norm_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    const int W = NC * size;
    float xv[NR * NC * 4], wv[NC * 4], uv[NR * NC * 4], xl[NR * NC], wl[NC], ul[NR * NC];
    fill(xv, NR * W, 11, 0);
    fill(wv, W, 12, 0);
    fill(uv, NR * W, 13, 0);
    for (int i = 0; i < NR * W; i++)
        xv[i] *= (float)(1 + i % 3); /* rows of different scales */
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NC; j++)
            xl[i * NC + j] = xv[i * W + rank * NC + j], ul[i * NC + j] = uv[i * W + rank * NC + j];
    for (int j = 0; j < NC; j++)
        wl[j] = wv[rank * NC + j];
    dt_tensor *xf = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){NR, W}, xv);
    dt_tensor *wf = dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){W}, wv);
    dt_tensor_set_requires_grad(xf, true);
    dt_tensor_set_requires_grad(wf, true);
    dt_tensor *ref = dt_rms_norm(ctx, xf, wf, 1e-6f);
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, ref, dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){NR, W}, uv)))));
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){NR, NC}, xl);
    dt_tensor *w = dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){NC}, wl);
    dt_tensor_set_requires_grad(x, true);
    dt_tensor_set_requires_grad(w, true);
    dt_tensor *y = dt_tp_rms_norm(ctx, pg, x, w, 1e-6f);
    TH_CHECK(y && y->dtype == DT_F32 && y->shape[1] == NC, "%s", dt_last_error());
    TH_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){NR, NC}, ul)))));
    double wy = 0, wx = 0, ww = 0;
    for (int i = 0; i < NR; i++)
        for (int j = 0; j < NC; j++) {
            const int f = i * W + rank * NC + j;
            wy = fmax(wy, fabs(dt_tensor_get(y, i * NC + j) - dt_tensor_get(ref, f)));
            wx = fmax(wx, fabs(dt_tensor_get(x->grad, i * NC + j) - dt_tensor_get(xf->grad, f)));
        }
    for (int j = 0; j < NC; j++) /* the weight's gradient: the rank's slice, not a sum over the group */
        ww = fmax(ww, fabs(dt_tensor_get(w->grad, j) - dt_tensor_get(wf->grad, rank * NC + j)));
    TH_CHECK(wy <= 1e-6 && wx <= 2e-6 && ww <= 2e-6, "rank %d of %d: y %.3g, dx %.3g, dw %.3g from dt_rms_norm's",
             rank, size, wy, wx, ww);
    /* bf16 x: the result in bf16, the f32 one rounded (within one bf16 step) */
    dt_tensor *xb = dt_cast(ctx, dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){NR, NC}, xl), DT_BF16);
    dt_tensor *yb = dt_tp_rms_norm(ctx, pg, xb, w, 1e-6f);
    TH_CHECK(yb && yb->dtype == DT_BF16, "bf16: %s", yb ? dt_dtype_name(yb->dtype) : dt_last_error());
    for (int i = 0; i < NR * NC; i++) {
        const double a = dt_tensor_get(yb, i), b = dt_tensor_get(y, i);
        TH_CHECK(fabs(a - b) <= 1.6e-2 * fabs(b) + 1e-6, "bf16 [%d]: %g, f32 %g", i, a, b);
    }
    /* a weight of another width */
    TH_CHECK(!dt_tp_rms_norm(ctx, pg, x, dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){NC - 1}, wl), 1e-6f) &&
                 dt_last_status() == DT_ERR_SHAPE,
             "weight of %d", NC - 1);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_rms_norm_split_rows)
{
    ASSERT_EQ_INT(th_run(2, 30, norm_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(3, 30, norm_body, NULL, NULL), 0);
}

/* ---- vocabulary-parallel cross-entropy ----------------------------------------------------- */

enum { CE_N = 6, CE_V = 11 };

static int ce_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    float L[CE_N * CE_V];
    fill(L, CE_N * CE_V, 9, 0);
    for (int i = 0; i < CE_N * CE_V; i++)
        L[i] *= 4.0f;
    int64_t y[CE_N] = {0, 10, 5, -100, 7, 3};
    dt_tensor *lf = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){CE_N, CE_V}, L);
    dt_tensor *yt = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){CE_N}, y);
    dt_tensor_set_requires_grad(lf, true);
    dt_tensor *ref = dt_cross_entropy(ctx, lf, yt);
    TH_OK(dt_backward(ctx, ref));
    int64_t lo, nv, Vl;
    dt_tp_vocab_range(pg, CE_V, &lo, &nv, &Vl);
    TH_CHECK(Vl == (CE_V + size - 1) / size, "local rows %lld", (long long)Vl);
    float loc[CE_N * CE_V];
    for (int i = 0; i < CE_N; i++)
        for (int j = 0; j < Vl; j++) /* padding columns hold garbage: they must be ignored */
            loc[i * Vl + j] = j < nv ? L[i * CE_V + lo + j] : 1e3f;
    dt_tensor *ll = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){CE_N, Vl}, loc);
    dt_tensor_set_requires_grad(ll, true);
    dt_tensor *loss = dt_tp_vocab_cross_entropy(ctx, pg, ll, yt, CE_V);
    TH_CHECK(loss, "%s", dt_last_error());
    TH_OK(dt_backward(ctx, loss));
    float a = dt_tensor_item(loss), b = dt_tensor_item(ref);
    TH_CHECK(fabsf(a - b) <= 4e-7f * fabsf(b) + 1e-7f, "loss %.9g, dt_cross_entropy %.9g", a, b);
    for (int i = 0; i < CE_N; i++)
        for (int j = 0; j < Vl; j++) {
            double g = dt_tensor_get(ll->grad, i * Vl + j);
            double want = j < nv ? dt_tensor_get(lf->grad, i * CE_V + lo + j) : 0.0;
            TH_CHECK(fabs(g - want) <= 1e-7, "grad [%d, %d]: %g, want %g", i, j, g, want);
        }
    /* rows x columns past the threads' threshold (2 ranks): the same again, and the rank's logits read where they
       are (a copy grew the arena by their size) */
    enum { BN = 40, BV = 4099 };
    float *big = malloc(sizeof(float) * BN * BV), *bl = malloc(sizeof(float) * BN * BV);
    int64_t by[BN];
    TH_CHECK(big && bl, "memory");
    fill(big, BN * BV, 11, 0);
    for (int i = 0; i < BN; i++)
        by[i] = i == 3 ? -100 : (i * 97) % BV;
    dt_tensor *bf = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){BN, BV}, big);
    dt_tensor *byt = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){BN}, by);
    dt_tensor_set_requires_grad(bf, true);
    ref = dt_cross_entropy(ctx, bf, byt);
    TH_OK(dt_backward(ctx, ref));
    dt_tp_vocab_range(pg, BV, &lo, &nv, &Vl);
    for (int i = 0; i < BN; i++)
        for (int j = 0; j < Vl; j++)
            bl[i * Vl + j] = j < nv ? big[i * BV + lo + j] : -1e3f;
    dt_tensor *bll = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){BN, Vl}, bl);
    dt_tensor_set_requires_grad(bll, true);
    const size_t used = dt_arena_used(dt_ctx_arena(ctx));
    loss = dt_tp_vocab_cross_entropy(ctx, pg, bll, byt, BV);
    TH_CHECK(loss, "%s", dt_last_error());
    TH_CHECK(dt_arena_used(dt_ctx_arena(ctx)) - used < dt_tensor_nbytes(bll), "the loss kept %zu bytes beside %zu of "
             "logits", dt_arena_used(dt_ctx_arena(ctx)) - used, dt_tensor_nbytes(bll));
    TH_OK(dt_backward(ctx, loss));
    a = dt_tensor_item(loss), b = dt_tensor_item(ref);
    TH_CHECK(fabsf(a - b) <= 4e-7f * fabsf(b) + 1e-7f, "large: loss %.9g, dt_cross_entropy %.9g", a, b);
    for (int i = 0; i < BN; i++)
        for (int j = 0; j < Vl; j++) {
            double g = dt_tensor_get(bll->grad, i * Vl + j);
            double want = j < nv ? dt_tensor_get(bf->grad, i * BV + lo + j) : 0.0;
            TH_CHECK(fabs(g - want) <= 1e-7, "large: grad [%d, %d]: %g, want %g", i, j, g, want);
        }
    free(big);
    free(bl);
    /* a label outside the vocabulary */
    y[1] = CE_V;
    yt = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){CE_N}, y);
    TH_CHECK(!dt_tp_vocab_cross_entropy(ctx, pg, ll, yt, CE_V) && dt_last_status() == DT_ERR_RANGE, "label %d",
             CE_V);
    dt_ctx_free(ctx);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_vocab_cross_entropy)
{
    ASSERT_EQ_INT(th_run(2, 30, ce_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(4, 30, ce_body, NULL, NULL), 0);
}

/* ---- the zoo's MLP ---------------------------------------------------------------------------- */

enum { MLP_B = 4, MLP_T = 3, MLP_D = 8, MLP_H = 32, MLP_STEPS = 4 };

static int mlp_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_model_config c = dt_model_config_default();
    c.mlp_seq = MLP_T, c.mlp_dim = MLP_D, c.mlp_hidden = MLP_H;
    dt_model *ref, *m, *m0;
    dt_model_desc dr, dm;
    TH_OK(dt_model_create("mlp", 5, &c, &ref, &dr));
    c.tp = pg;
    TH_OK(dt_model_create("mlp", 5, &c, &m, &dm));
    TH_OK(dt_model_create("mlp", 5, &c, &m0, NULL)); /* the initial weights, kept */
    char worst[128] = "";
    double ex;
    double d0 = slice_diff(m, ref, rank, NULL, worst, &ex);
    TH_CHECK(d0 == 0.0, "step 0 differs: %s", worst);
    dt_trainer *tr, *trr;
    TH_OK(make_sgd(ref, &dr, 0.5, &trr));
    TH_OK(make_sgd(m, &dm, 0.5, &tr));
    float x[MLP_B * MLP_T * MLP_D];
    for (int k = 0; k < MLP_STEPS; k++) {
        fill(x, MLP_B * MLP_T * MLP_D, 10, (uint64_t)k * MLP_B * MLP_T * MLP_D);
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 3, (int64_t[]){MLP_B, MLP_T, MLP_D}, NULL, 0, 0, NULL);
        dt_trainer_metrics a, e;
        TH_OK(dt_trainer_step(trr, &b, 1, &e));
        TH_OK(dt_trainer_step(tr, &b, 1, &a));
        TH_CHECK(fabs(a.loss - e.loss) <= 1e-6 * fabs(e.loss) + 1e-7, "step %d: loss %.9g, single process %.9g", k,
                 a.loss, e.loss);
    }
    /* the bound of the header: 2 gamma_K |w_k - w_0| + k u |w|, times 2 */
    const double u = ldexp(1.0, -24), K = MLP_H, gam = K * u / (1 - K * u);
    double moved = slice_diff(m, m0, 0, NULL, worst, &ex); /* max |w_k - w_0| (same layout) */
    double tol[2] = {2.0 * MLP_STEPS * u, 2.0 * 2.0 * gam * moved};
    double dk = slice_diff(m, ref, rank, tol, worst, &ex);
    TH_CHECK(ex == 0.0, "after %d steps: max difference %.3g (%s) beyond the bound %.3g |w| + %.3g", MLP_STEPS, dk,
             worst, tol[0], tol[1]);
    TH_CHECK(moved > 1e-3, "the weights moved only %g: the test would not see a wrong gradient", moved);
    if (rank == 0)
        fprintf(stderr, "tp mlp on %d ranks: max |w_tp - w_1| %.3g after %d steps (bound %.3g |w| + %.3g)\n", size,
                dk, MLP_STEPS, tol[0], tol[1]);
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(m0);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_mlp_steps) { ASSERT_EQ_INT(th_run(2, 60, mlp_body, NULL, NULL), 0); }

/* ---- errors ------------------------------------------------------------------------------------ */

static int err_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_model_config c;
    gpt_config(&c);
    c.tp = pg;
    c.n_head = 3, c.n_embd = 48;
    dt_model *m = NULL;
    dt_status st = dt_model_create("gpt-micro", 1, &c, &m, NULL);
    TH_CHECK(st == DT_ERR_INVALID_ARG && !m && strstr(dt_last_error(), "n_head 3"), "n_head 3 over 2: %s",
             dt_last_error());
    gpt_config(&c); /* sequence parallelism: dropout builds (dt_dropout_at), tokens divisible by the group */
    c.tp = pg, c.sequence_parallel = true, c.dropout = 0.1f;
    st = dt_model_create("gpt-micro", 1, &c, &m, NULL);
    TH_CHECK(st == DT_OK && m, "sp dropout: %s", dt_last_error());
    dt_model_free(m);
    m = NULL;
    gpt_config(&c);
    c.tp = pg, c.sequence_parallel = true, c.seq = 7;
    st = dt_model_create("gpt-micro", 1, &c, &m, NULL);
    TH_CHECK(st == DT_ERR_INVALID_ARG && !m && strstr(dt_last_error(), "sequence length 7"), "sp seq 7: %s",
             dt_last_error());
    /* LoRA with sequence parallelism builds (its forwards add the adapters: dt_tp_sp_lora; the values:
       test_train_lora_par) */
    static const char *const targets[] = {"c_attn", NULL};
    dt_lora_params lp = dt_lora_params_default();
    lp.targets = targets;
    gpt_config(&c);
    c.tp = pg, c.sequence_parallel = true, c.build.lora = &lp;
    st = dt_model_create("gpt-micro", 1, &c, &m, NULL);
    TH_CHECK(st == DT_OK && m, "sp lora: %s", dt_last_error());
    dt_model_free(m);
    m = NULL;
    /* dt_tp_sp_lora refuses a NULL operand and a layer with adapters but no tensor-parallel hook (one process's
       LoRA layer: it would add the adapters on the rank's rows without the collectives) */
    dt_ctx *ctx;
    TH_OK(dt_ctx_init(NULL, &ctx));
    float xv[2 * 48] = {0};
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){2, 48}, xv);
    dt_error_clear(); /* a NULL operand after a failed op keeps that op's error */
    TH_CHECK(!dt_tp_sp_lora(ctx, NULL, x, x, pg) && dt_last_status() == DT_ERR_NULL &&
                 strstr(dt_last_error(), "the layer"),
             "sp lora NULL layer: %s", dt_last_error());
    gpt_config(&c);
    c.build.lora = &lp;
    TH_OK(dt_model_create("gpt-micro", 1, &c, &m, NULL));
    dt_module *lin = dt_model_find_module(m, "transformer.h.0.attn.c_attn");
    TH_CHECK(lin && dt_module_find_child(lin, "lora_A"), "one process's gpt-micro c_attn has adapters");
    TH_CHECK(!dt_tp_sp_lora(ctx, lin, x, x, pg) && dt_last_status() == DT_ERR_INVALID_ARG &&
                 strstr(dt_last_error(), "not a tensor-parallel layer"),
             "sp lora without a hook: %s", dt_last_error());
    dt_ctx_free(ctx);
    dt_model_free(m);
    m = NULL;
    c = dt_model_config_default();
    c.tp = pg;
    c.mlp_hidden = 33;
    st = dt_model_create("mlp", 1, &c, &m, NULL);
    TH_CHECK(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "33"), "mlp hidden 33: %s", dt_last_error());
    c.mlp_hidden = 32;
    st = dt_model_create("convnet", 1, &c, &m, NULL);
    TH_CHECK(st == DT_ERR_UNSUPPORTED, "convnet: %s", dt_last_error());
    TH_CHECK(!dt_tp_column_linear(pg, 8, 6, true, false, 2) && dt_last_status() == DT_ERR_INVALID_ARG,
             "column 6 outputs in 2 chunks over 2 ranks");
    TH_CHECK(!dt_tp_row_linear(NULL, 8, 6, true, true) && dt_last_status() == DT_ERR_NULL, "NULL group");
    /* what the trainer does not do over slices is refused, naming the slice:
     * ZeRO whose group is not a data-parallel one (here the tp group itself:
     * it would average different slices), ZeRO stages 2 and 3 over a
     * tensor-parallel model; the norm, saving and loading of slices whose
     * group is unknown (dt_tp_module_set_group) */
    c = dt_model_config_default();
    c.tp = pg, c.mlp_seq = 2, c.mlp_dim = 4, c.mlp_hidden = 8;
    dt_model_desc d;
    TH_OK(dt_model_create("mlp", 1, &c, &m, &d));
    TH_CHECK(dt_tp_model_slice(m) && !strcmp(dt_tp_model_slice(m), "w0"), "first slice");
    TH_CHECK(dt_tp_model_group(m) == pg, "the MLP's group");
    dt_strategy *s;
    dt_trainer_params tp = dt_trainer_params_default();
    dt_trainer *tr = NULL;
    dt_zero_params zp = dt_zero_params_default();
    zp.stage = 1;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    st = dt_trainer_init(m, s, &tp, &tr);
    TH_CHECK(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "'w0'") &&
                 strstr(dt_last_error(), "different tensor-parallel ranks"),
             "zero over tp: %s", dt_last_error());
    zp.stage = 2;
    TH_OK(dt_strategy_zero_init(pg, &zp, &s));
    st = dt_trainer_init(m, s, &tp, &tr);
    TH_CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "'w0'") && strstr(dt_last_error(), "ZeRO stage 2"),
             "zero 2: %s", dt_last_error());
    TH_OK(dt_tp_module_set_group(dt_model_root(m), NULL));
    TH_CHECK(dt_tp_model_group(m) == NULL, "group cleared");
    TH_OK(dt_strategy_none_init(&s));
    tp.clip_grad_norm = 1.0;
    st = dt_trainer_init(m, s, &tp, &tr);
    TH_CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "'w0'"), "clip: %s", dt_last_error());
    TH_OK(dt_strategy_none_init(&s));
    tp.clip_grad_norm = 0;
    TH_OK(dt_trainer_init(m, s, &tp, &tr));
    st = dt_trainer_save(tr, "/nonexistent-dir-tp", NULL);
    TH_CHECK(st == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "dt_tp_module_set_group"), "save: %s",
             dt_last_error());
    st = dt_trainer_load(tr, "/nonexistent-dir-tp", NULL);
    TH_CHECK(st == DT_ERR_UNSUPPORTED, "load: %s", dt_last_error());
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_errors) { ASSERT_EQ_INT(th_run(2, 30, err_body, NULL, NULL), 0); }

/* Blocks of different sizes (dt_nn_param_spec.tp_chunk_rows; Phi-3's q | k
 * | v with fewer kv heads): a [16, 3] weight whose rows are q 8, k 4, v 4,
 * over 2 ranks: rank r takes its half of each block, side by side, and
 * putting both slices back gives the whole; sizes that do not split over
 * the ranks or do not add up are refused. */
TEST(tp_slice_blocks_of_given_sizes)
{
    float full[48], back[48], slice[24];
    for (int i = 0; i < 48; i++)
        full[i] = (float)i;
    dt_param_info p = {.name = "qkv", .ndim = 2, .shape = {8, 3}, .numel = 24, .dtype = DT_F32, .tp_dim = 1,
                       .tp_chunks = 3, .tp_chunk_rows = {8, 4, 4}};
    int64_t fs[DT_MAX_DIMS];
    ASSERT_OK(dt_tp_full_shape(&p, 2, fs));
    ASSERT(fs[0] == 16 && fs[1] == 3);
    const int want[2][8] = {{0, 1, 2, 3, 8, 9, 12, 13}, {4, 5, 6, 7, 10, 11, 14, 15}}; /* full rows */
    memset(back, 0, sizeof back);
    for (int r = 0; r < 2; r++) {
        ASSERT_OK(dt_tp_slice_get(&p, 2, r, full, slice, sizeof(float)));
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < 3; j++)
                ASSERT(slice[k * 3 + j] == full[want[r][k] * 3 + j]);
        ASSERT_OK(dt_tp_slice_put(&p, 2, r, slice, back, sizeof(float)));
    }
    ASSERT(!memcmp(back, full, sizeof full));
    p.tp_chunk_rows[1] = 3, p.tp_chunk_rows[2] = 5; /* 3 rows over 2 ranks */
    ASSERT_STATUS(dt_tp_full_shape(&p, 2, fs), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "of given sizes");
    p.tp_chunk_rows[1] = 4, p.tp_chunk_rows[2] = 6; /* 18 rows, not 2 x 8 */
    ASSERT_STATUS(dt_tp_full_shape(&p, 2, fs), DT_ERR_SHAPE);
}

int main(void)
{
    RUN(tp_ops_grad);
    RUN(tp_partial_sums_reuse_their_memory);
    RUN(tp_sequence_parallel_ops);
    RUN(tp_sequence_parallel_products_gather_again);
    RUN(tp_rms_norm_split_rows);
    RUN(tp_vocab_cross_entropy);
    RUN(tp_mlp_steps);
    RUN(tp_errors);
    RUN(tp_slice_blocks_of_given_sizes);
    return TEST_REPORT();
}
