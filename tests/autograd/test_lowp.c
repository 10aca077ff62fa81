/* Low-precision compute (precision.h): every op's bf16 and f16 forward and
 * backward against the f32 op on the same values, dt_cast, low-precision
 * leaf gradients, autocast, and models holding bf16/f16 parameters.
 *
 * The bounds. Inputs are drawn in f32 and rounded to the dtype first, so
 * the f32 reference sees exactly the values the low-precision op sees, and
 * the upstream gradient R is representable too. u is the unit roundoff of
 * the dtype (bf16 2^-8, f16 2^-11: half its epsilon 2^-7, 2^-10).
 *  - Ops that widen to f32 (everything but the GEMMs) compute the same f32
 *    numbers as the reference and round once: |y - y_ref| <= u |y_ref|.
 *  - GEMMs (matmul, linear, conv2d) accumulate in f32, possibly in another
 *    order than the f32 kernel (native bf16 kernels): |y - y_ref| <=
 *    u |y_ref| + K 2^-23 sum_k |a_k b_k|, K the longest reduction of the
 *    op (forward and both backward products), sum |a b| computed by the
 *    same op on |inputs| (and |R| for the gradients).
 *  - Gradients are rounded at most twice (to the activation's dtype inside
 *    backward, then into the leaf's bf16/f16 gradient): 2u |g_ref| (+ the
 *    GEMM term).
 *  - f16 adds 2^-24 absolute (its smallest subnormal) to every bound.
 *  - Attention over a bf16 qkv on the avx512_bf16 path rounds P and dS to
 *    bf16 before their products (kernels.h): 2^-7 of the largest |y_ref|
 *    (|g_ref|) added.
 * Run under DT_MAX_CPU_ISA=scalar too (tests.cmake): the conversion kernels'
 * scalar and vector paths must give the same answers. */
#include "dtrain/dtrain.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

enum {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_SCALE, OP_RELU, OP_GELU, OP_GELU_TANH, OP_DROPOUT,
    OP_MATMUL, OP_MATMUL_BATCHED, OP_LINEAR, OP_CONV2D, OP_MAXPOOL, OP_AVGPOOL, OP_BATCHNORM,
    OP_LAYERNORM, OP_EMBEDDING, OP_SOFTMAX, OP_LOG_SOFTMAX, OP_CROSS_ENTROPY, OP_MSE, OP_SUM, OP_MEAN,
    OP_TRANSPOSE_CONTIG, OP_ADDMM, OP_ATTENTION, OP_BIAS_GELU
};

typedef struct {
    const char *name;
    int kind;
    int nin;
    int ndim[3];
    int64_t shape[3][4];
    float lo[3], hi[3];
    int64_t gemm_k; /* longest reduction of its GEMMs; 0 for ops that widen */
} op_case;

static const op_case cases[] = {
    {"add", OP_ADD, 2, {2, 2}, {{4, 5}, {1, 5}}, {-1, -1}, {1, 1}, 0},
    {"sub", OP_SUB, 2, {2, 1}, {{4, 5}, {5}}, {-1, -1}, {1, 1}, 0},
    {"mul", OP_MUL, 2, {2, 2}, {{4, 5}, {4, 1}}, {-1, -1}, {1, 1}, 0},
    {"div", OP_DIV, 2, {2, 2}, {{4, 5}, {4, 5}}, {-1, 0.5f}, {1, 1.5f}, 0},
    {"scale", OP_SCALE, 1, {3}, {{2, 3, 4}}, {-2}, {2}, 0},
    {"relu", OP_RELU, 1, {2}, {{6, 7}}, {-1}, {1}, 0},
    {"gelu", OP_GELU, 1, {2}, {{6, 7}}, {-3}, {3}, 0},
    {"gelu_tanh", OP_GELU_TANH, 1, {2}, {{6, 7}}, {-3}, {3}, 0},
    {"dropout", OP_DROPOUT, 1, {2}, {{8, 9}}, {-1}, {1}, 0},
    {"matmul", OP_MATMUL, 2, {4, 2}, {{2, 3, 8, 16}, {16, 12}}, {-1, -1}, {1, 1}, 48},
    {"matmul_batched", OP_MATMUL_BATCHED, 2, {3, 3}, {{2, 8, 16}, {2, 16, 12}}, {-1, -1}, {1, 1}, 16},
    {"linear", OP_LINEAR, 3, {2, 2, 1}, {{6, 16}, {12, 16}, {12}}, {-1, -1, -1}, {1, 1, 1}, 16},
    {"conv2d", OP_CONV2D, 3, {4, 4, 1}, {{2, 3, 8, 8}, {4, 3, 3, 3}, {4}}, {-1, -1, -1}, {1, 1, 1}, 128},
    {"max_pool2d", OP_MAXPOOL, 1, {4}, {{2, 3, 6, 6}}, {-1}, {1}, 0},
    {"avg_pool2d", OP_AVGPOOL, 1, {4}, {{2, 3, 6, 6}}, {-1}, {1}, 0},
    {"batch_norm", OP_BATCHNORM, 3, {4, 1, 1}, {{4, 3, 5, 5}, {3}, {3}}, {-1, 0.5f, -1}, {1, 1.5f, 1}, 0},
    {"layer_norm", OP_LAYERNORM, 3, {3, 1, 1}, {{2, 5, 16}, {16}, {16}}, {-1, 0.5f, -1}, {1, 1.5f, 1}, 0},
    {"embedding", OP_EMBEDDING, 1, {2}, {{7, 6}}, {-1}, {1}, 0},
    {"softmax", OP_SOFTMAX, 1, {2}, {{5, 9}}, {-3}, {3}, 0},
    {"log_softmax", OP_LOG_SOFTMAX, 1, {2}, {{5, 9}}, {-3}, {3}, 0},
    {"cross_entropy", OP_CROSS_ENTROPY, 1, {2}, {{6, 10}}, {-3}, {3}, 0},
    {"mse_loss", OP_MSE, 2, {2, 2}, {{4, 6}, {4, 6}}, {-1, -1}, {1, 1}, 0},
    {"sum", OP_SUM, 1, {2}, {{9, 11}}, {-1}, {1}, 0},
    {"mean", OP_MEAN, 1, {2}, {{9, 11}}, {-1}, {1}, 0},
    {"transpose_contiguous", OP_TRANSPOSE_CONTIG, 1, {3}, {{3, 4, 5}}, {-1}, {1}, 0},
    {"addmm", OP_ADDMM, 3, {3, 2, 1}, {{2, 3, 16}, {16, 12}, {12}}, {-1, -1, -1}, {1, 1, 1}, 16},
    {"attention", OP_ATTENTION, 1, {3}, {{2, 5, 12}}, {-1}, {1}, 0},
    {"bias_gelu_tanh", OP_BIAS_GELU, 2, {2, 1}, {{6, 7}, {7}}, {-2, -1}, {2, 1}, 0},
};

static dt_tensor *run_op(dt_ctx *ctx, int kind, dt_tensor **in, bool abs_mode)
{
    static const int64_t labels[6] = {0, 3, 9, -100, 5, 1};
    static const int64_t ids[4] = {6, 0, 3, 3};
    switch (kind) {
    case OP_ADD: return dt_add(ctx, in[0], in[1]);
    case OP_SUB: return dt_sub(ctx, in[0], in[1]);
    case OP_MUL: return dt_mul(ctx, in[0], in[1]);
    case OP_DIV: return dt_div(ctx, in[0], in[1]);
    case OP_SCALE: return dt_scale(ctx, in[0], 0.37f);
    case OP_RELU: return dt_relu(ctx, in[0]);
    case OP_GELU: return dt_gelu(ctx, in[0]);
    case OP_GELU_TANH: return dt_gelu_tanh(ctx, in[0]);
    case OP_DROPOUT: return dt_dropout(ctx, in[0], 0.3f, true, dt_rng_key_make(5, DT_RNG_DROPOUT, 1, 2));
    case OP_MATMUL:
    case OP_MATMUL_BATCHED: return dt_matmul(ctx, in[0], in[1]);
    case OP_LINEAR: return dt_linear(ctx, in[0], in[1], in[2]);
    case OP_CONV2D: return dt_conv2d(ctx, in[0], in[1], in[2], 1, 1);
    case OP_MAXPOOL: return dt_max_pool2d(ctx, in[0], 2, 2, 0);
    case OP_AVGPOOL: return dt_avg_pool2d(ctx, in[0], 3, 1, 1);
    case OP_BATCHNORM: return dt_batch_norm(ctx, in[0], in[1], in[2], NULL, NULL, true, 0.1f, 1e-5f);
    case OP_LAYERNORM: return dt_layer_norm(ctx, in[0], in[1], in[2], 1e-5f);
    case OP_EMBEDDING:
        return dt_embedding(ctx, in[0], dt_tensor_view_of(ctx, (void *)(uintptr_t)ids, DT_I64, 2, SH(2, 2)));
    case OP_SOFTMAX: return dt_softmax(ctx, in[0]);
    case OP_LOG_SOFTMAX: return dt_log_softmax(ctx, in[0]);
    case OP_CROSS_ENTROPY:
        return dt_cross_entropy(ctx, in[0], dt_tensor_view_of(ctx, (void *)(uintptr_t)labels, DT_I64, 1, SH(6)));
    case OP_MSE: return dt_mse_loss(ctx, in[0], in[1]);
    case OP_SUM: return dt_sum(ctx, in[0]);
    case OP_MEAN: return dt_mean(ctx, in[0]);
    case OP_TRANSPOSE_CONTIG: return dt_contiguous(ctx, dt_transpose(ctx, in[0], 0, 2));
    case OP_ADDMM: return dt_addmm(ctx, in[0], in[1], in[2]);
    case OP_ATTENTION: return dt_attention(ctx, in[0], 2, true, 0.0f, true, dt_rng_key_make(1, DT_RNG_DROPOUT, 0, 0));
    case OP_BIAS_GELU: return dt_bias_gelu_tanh(ctx, in[0], in[1]);
    }
    (void)abs_mode;
    return NULL;
}

/* v rounded to dtype (f32: itself). */
static float rnd(dt_dtype dt, float v)
{
    return dt == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(v)) : dt == DT_F16 ? dt_f16_to_f32(dt_f32_to_f16(v)) : v;
}

typedef struct {
    dt_tensor *in[3];
    dt_tensor *y;     /* the op's output (persistent copy in f32) */
    float *yv;        /* output values, f32 */
    float *gv[3];     /* input gradients, f32 */
    int64_t ny, ng[3];
} run_result;

/* Run case c with inputs in dtype dt (values vals[i], already rounded),
 * upstream gradient R (values of the output's shape, rounded); abs:
 * inputs and R are taken by absolute value (the GEMM bound's sum |a b|). */
static bool run_case(const op_case *c, dt_dtype dt, dt_dtype lowdt, float *const *vals, uint64_t rseed,
                     bool take_abs, run_result *r)
{
    memset(r, 0, sizeof *r);
    dt_ctx *ctx = NULL;
    if (dt_ctx_init(NULL, &ctx) < 0)
        return false;
    bool ok = false;
    for (int i = 0; i < c->nin; i++) {
        dt_tensor *t = dt_tensor_new(dt, c->ndim[i], c->shape[i]);
        int64_t n = dt_tensor_numel(t);
        for (int64_t j = 0; j < n; j++)
            dt_tensor_set(t, j, take_abs ? fabsf(vals[i][j]) : vals[i][j]);
        dt_tensor_set_grad(t, dt_tensor_new(dt, c->ndim[i], c->shape[i])); /* a grad of its own dtype */
        dt_tensor_set_requires_grad(t, true);
        r->in[i] = t;
    }
    dt_tensor *y = run_op(ctx, c->kind, r->in, take_abs);
    if (!y) {
        fprintf(stderr, "%s in %s: %s\n", c->name, dt_dtype_name(dt), dt_last_error());
        goto out;
    }
    if (c->kind != OP_CROSS_ENTROPY && c->kind != OP_MSE && y->dtype != dt) {
        fprintf(stderr, "%s in %s: result is %s\n", c->name, dt_dtype_name(dt), dt_dtype_name(y->dtype));
        goto out;
    }
    r->ny = dt_tensor_numel(y);
    r->yv = malloc((size_t)r->ny * sizeof(float));
    for (int64_t j = 0; j < r->ny; j++)
        r->yv[j] = (float)dt_tensor_get(y, j);
    dt_tensor *loss = y;
    if (r->ny > 1) { /* loss = sum(y * R), R representable in dt */
        dt_tensor *R = dt_tensor_empty(ctx, DT_F32, y->ndim, y->shape);
        dt_rng_fill_uniform(dt_rng_key_make(rseed, DT_RNG_DATA, 9, 9), 0, R->data, (size_t)r->ny, -1.0f, 1.0f);
        float *rv = R->data;
        for (int64_t j = 0; j < r->ny; j++)
            rv[j] = rnd(lowdt, take_abs ? fabsf(rv[j]) : rv[j]);
        loss = dt_sum(ctx, dt_mul(ctx, y, R));
    }
    if (!loss || dt_backward(ctx, loss) < 0) {
        fprintf(stderr, "%s in %s: backward: %s\n", c->name, dt_dtype_name(dt), dt_last_error());
        goto out;
    }
    for (int i = 0; i < c->nin; i++) {
        r->ng[i] = dt_tensor_numel(r->in[i]);
        r->gv[i] = malloc((size_t)r->ng[i] * sizeof(float));
        if (r->in[i]->grad->dtype != dt) {
            fprintf(stderr, "%s: grad of input %d is %s\n", c->name, i, dt_dtype_name(r->in[i]->grad->dtype));
            goto out;
        }
        for (int64_t j = 0; j < r->ng[i]; j++)
            r->gv[i][j] = (float)dt_tensor_get(r->in[i]->grad, j);
    }
    ok = true;
out:
    dt_ctx_free(ctx);
    return ok;
}

static void free_result(run_result *r)
{
    for (int i = 0; i < 3; i++) {
        if (r->in[i] && r->in[i]->grad && !(r->in[i]->flags & DT_TENSOR_OWNS_GRAD))
            dt_tensor_free(r->in[i]->grad); /* attached with dt_tensor_set_grad: borrowed */
        dt_tensor_free(r->in[i]);
        free(r->gv[i]);
    }
    free(r->yv);
}

/* Compare one array against the reference with the stated bound; returns
 * the number of violations (and prints the first). */
static int compare(const char *what, const op_case *c, dt_dtype dt, const float *got, const float *ref,
                   const float *absref, int64_t n, double ucount)
{
    double u = dt == DT_BF16 ? 1.0 / 256 : 1.0 / 2048;
    double atol = dt == DT_F16 ? 1.0 / (1 << 24) : 0.0;
    if (c->kind == OP_ATTENTION && dt == DT_BF16 && dt_k_get_isa() == DT_K_ISA_AVX512_BF16) {
        double big = 0.0; /* P and dS rounded to bf16 before their products (kernels.h) */
        for (int64_t j = 0; j < n; j++)
            big = fabs(ref[j]) > big ? fabs(ref[j]) : big;
        atol += 0x1p-7 * big;
    }
    int bad = 0;
    for (int64_t j = 0; j < n; j++) {
        double bound = ucount * u * fabs(ref[j]) + atol;
        if (c->gemm_k)
            bound += (double)c->gemm_k * ldexp(1.0, -23) * fabs(absref[j]) * (ucount > 1 ? 2 : 1);
        double d = fabs((double)got[j] - (double)ref[j]);
        if (!(d <= bound)) {
            if (!bad)
                fprintf(stderr, "%s %s %s[%lld]: %.9g vs f32 %.9g (diff %.3g > bound %.3g)\n", c->name,
                        dt_dtype_name(dt), what, (long long)j, (double)got[j], (double)ref[j], d, bound);
            bad++;
        }
    }
    return bad;
}

static void check_dtype(dt_dtype dt)
{
    int failures = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const op_case *c = &cases[k];
        float *vals[3] = {NULL};
        for (int i = 0; i < c->nin; i++) {
            int64_t n = 1;
            for (int d = 0; d < c->ndim[i]; d++)
                n *= c->shape[i][d];
            vals[i] = malloc((size_t)n * sizeof(float));
            dt_rng_fill_uniform(dt_rng_key_make(k, DT_RNG_DATA, (uint64_t)i, 0), 0, vals[i], (size_t)n, c->lo[i],
                                c->hi[i]);
            for (int64_t j = 0; j < n; j++)
                vals[i][j] = rnd(dt, vals[i][j]);
        }
        run_result lp, ref, ab;
        bool ok = run_case(c, dt, dt, vals, k, false, &lp) && run_case(c, DT_F32, dt, vals, k, false, &ref) &&
                  (!c->gemm_k || run_case(c, DT_F32, dt, vals, k, true, &ab));
        if (!ok) {
            failures++;
        } else {
            failures += compare("y", c, dt, lp.yv, ref.yv, c->gemm_k ? ab.yv : NULL, ref.ny, 1) != 0;
            for (int i = 0; i < c->nin; i++)
                failures += compare(i == 0 ? "grad0" : i == 1 ? "grad1" : "grad2", c, dt, lp.gv[i], ref.gv[i],
                                    c->gemm_k ? ab.gv[i] : NULL, ref.ng[i], 2) != 0;
        }
        free_result(&lp);
        free_result(&ref);
        if (c->gemm_k)
            free_result(&ab);
        for (int i = 0; i < 3; i++)
            free(vals[i]);
    }
    ASSERT_EQ_INT(failures, 0);
}

TEST(ops_bf16_vs_f32) { check_dtype(DT_BF16); }
TEST(ops_f16_vs_f32) { check_dtype(DT_F16); }

/* dt_cast rounds as dt_f32_to_bf16 does; its backward rounds the gradient
 * of the bf16 result to bf16 before it reaches the f32 input. */
TEST(cast_forward_and_backward)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[5] = {1.0f, 1.00390625f + 1e-4f, -3.3f, 65504.0f * 2, 1e-40f};
    float rv[5] = {0.1f, 0.2f, 0.3f, -0.7f, 1.1f};
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 1, SH(5), xv);
    dt_tensor_set_requires_grad(x, true);
    dt_tensor *y = dt_cast(ctx, x, DT_BF16);
    ASSERT(y && y->dtype == DT_BF16);
    for (int i = 0; i < 5; i++)
        ASSERT_EQ_INT(((uint16_t *)y->data)[i], dt_f32_to_bf16(xv[i]));
    ASSERT(dt_cast(ctx, y, DT_BF16) == y); /* same dtype: the tensor itself */
    dt_tensor *h = dt_cast(ctx, y, DT_F16);
    ASSERT(h && h->dtype == DT_F16);
    ASSERT_EQ_INT(((uint16_t *)h->data)[3], 0x7c00); /* 131008 overflows f16: inf */
    dt_tensor *loss = dt_sum(ctx, dt_mul(ctx, y, dt_tensor_from(ctx, DT_F32, 1, SH(5), rv)));
    ASSERT(loss && loss->dtype == DT_F32);
    ASSERT_OK(dt_backward(ctx, loss));
    for (int i = 0; i < 5; i++) /* the gradient of a bf16 tensor is bf16-valued */
        ASSERT(((float *)x->grad->data)[i] == dt_bf16_to_f32(dt_f32_to_bf16(rv[i])));
    ASSERT(((float *)x->grad->data)[0] != rv[0]); /* 0.1 is not a bf16: it was rounded */
    dt_ctx_free(ctx);
}

static float g_seen[4];
static int g_fired;
static dt_status seen_hook(dt_tensor *leaf, void *ud)
{
    (void)ud;
    g_fired++;
    for (int i = 0; i < 4; i++)
        g_seen[i] = (float)dt_tensor_get(leaf->grad, i);
    return DT_OK;
}

static float rb(float v) { return dt_bf16_to_f32(dt_f32_to_bf16(v)); }

/* A bf16 leaf: the contributions of one backward pass add up in f32 and
 * reach its bf16 grad rounded once, before its grad-ready hook fires; a
 * second backward adds to it (one more rounding). Through one cast node
 * the gradient is round(c1 + c2); through two, each cast rounds its own
 * part: round(round(c1) + round(c2)). */
TEST(bf16_leaf_grad_accumulates_in_f32)
{
    enum { N = 64 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *w = dt_tensor_new(DT_BF16, 1, SH(N));
    dt_tensor_fill(w, 1.0);
    dt_tensor *g = dt_tensor_new(DT_BF16, 1, SH(N));
    ASSERT_OK(dt_tensor_set_grad(w, g));
    ASSERT_OK(dt_ag_add_grad_hook(w, seen_hook, NULL));
    float c1[N], c2[N];
    dt_rng_fill_uniform(dt_rng_key_make(4, DT_RNG_DATA, 0, 0), 0, c1, N, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(4, DT_RNG_DATA, 1, 0), 0, c2, N, -1.0f, 1.0f);
    dt_tensor *wf = dt_cast(ctx, w, DT_F32);
    dt_tensor *loss = dt_add(ctx, dt_sum(ctx, dt_mul(ctx, wf, dt_tensor_from(ctx, DT_F32, 1, SH(N), c1))),
                             dt_sum(ctx, dt_mul(ctx, wf, dt_tensor_from(ctx, DT_F32, 1, SH(N), c2))));
    ASSERT(loss);
    g_fired = 0;
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_EQ_INT(g_fired, 1);
    for (int i = 0; i < N; i++)
        ASSERT(dt_tensor_get(g, i) == rb(c1[i] + c2[i]));
    for (int i = 0; i < 4; i++)
        ASSERT(g_seen[i] == rb(c1[i] + c2[i])); /* final before the hook ran */
    ASSERT_OK(dt_backward(ctx, loss)); /* += */
    for (int i = 0; i < N; i++)
        ASSERT(dt_tensor_get(g, i) == rb(rb(c1[i] + c2[i]) + rb(c1[i] + c2[i])));
    dt_ag_zero_grad(w);
    dt_ctx_reset(ctx);
    loss = dt_add(ctx, dt_sum(ctx, dt_mul(ctx, dt_cast(ctx, w, DT_F32), dt_tensor_from(ctx, DT_F32, 1, SH(N), c1))),
                  dt_sum(ctx, dt_mul(ctx, dt_cast(ctx, w, DT_F32), dt_tensor_from(ctx, DT_F32, 1, SH(N), c2))));
    ASSERT_OK(dt_backward(ctx, loss));
    int differ = 0;
    for (int i = 0; i < N; i++) {
        ASSERT(dt_tensor_get(g, i) == rb(rb(c1[i]) + rb(c2[i])));
        differ += rb(rb(c1[i]) + rb(c2[i])) != rb(c1[i] + c2[i]);
    }
    ASSERT(differ > 0); /* the two cases are told apart */
    /* an f32 grad for a bf16 tensor is allowed too; an i32 one is not */
    dt_tensor *gf = dt_tensor_new(DT_F32, 1, SH(N));
    ASSERT_OK(dt_tensor_set_grad(w, gf));
    dt_tensor *gi = dt_tensor_new(DT_I32, 1, SH(N));
    ASSERT_STATUS(dt_tensor_set_grad(w, gi), DT_ERR_DTYPE);
    dt_tensor_free(gi);
    dt_ctx_free(ctx);
    dt_tensor_free(w);
    dt_tensor_free(g);
    dt_tensor_free(gf);
}

/* A bf16/f16 embedding table is read as it is (no widened copy) and its
 * gradient touches only the looked-up rows: output and gradient equal,
 * bit for bit, the composition it replaces (widen the table, f32
 * embedding, round the result), with repeated indices (summed per row in
 * position order, rounded once per backward), a row looked up only once,
 * rows never looked up, and a second backward adding to the first. */
static void embedding_lp_case(dt_dtype dt)
{
    enum { V = 9, D = 37, M = 10 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float wv[V * D], gv[2][M * D];
    dt_rng_fill_uniform(dt_rng_key_make(7, DT_RNG_DATA, 0, 0), 0, wv, V * D, -1.0f, 1.0f);
    for (int k = 0; k < 2; k++) /* the second pass's gradient differs: its per-row rounding shows */
        dt_rng_fill_uniform(dt_rng_key_make(7, DT_RNG_DATA, 1 + (uint64_t)k, 0), 0, gv[k], M * D, -1.0f, 1.0f);
    const int64_t ids[M] = {3, 1, 3, 3, 0, 8, 1, 3, 5, 1};
    dt_tensor *w[2], *g[2];
    for (int k = 0; k < 2; k++) {
        w[k] = dt_tensor_new(dt, 2, SH(V, D));
        g[k] = dt_tensor_new(dt, 2, SH(V, D));
        ASSERT_OK(dt_k_convert(wv, DT_F32, w[k]->data, dt, V * D));
        ASSERT_OK(dt_tensor_zero(g[k]));
        ASSERT_OK(dt_tensor_set_grad(w[k], g[k]));
    }
    for (int pass = 0; pass < 2; pass++) { /* (arena tensors: made again after each reset) */
        dt_tensor *idx = dt_tensor_view_of(ctx, (void *)(uintptr_t)ids, DT_I64, 2, SH(2, 5));
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(2, 5, D), gv[pass]);
        dt_tensor *y = dt_embedding(ctx, w[0], idx);
        dt_tensor *yr = dt_cast(ctx, dt_embedding(ctx, dt_cast(ctx, w[1], DT_F32), idx), dt);
        ASSERT(y && yr && y->dtype == dt && yr->dtype == dt);
        ASSERT(!memcmp(y->data, yr->data, (size_t)M * D * 2));
        ASSERT_OK(dt_backward_with(ctx, y, R));
        ASSERT_OK(dt_backward_with(ctx, yr, R));
        ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)V * D * 2));
        dt_ctx_reset(ctx);
    }
    int zero_rows = 0, nonzero = 0;
    for (int64_t v = 0; v < V; v++) {
        bool z = true;
        for (int64_t d = 0; d < D; d++)
            z &= dt_tensor_get(g[0], v * D + d) == 0.0;
        zero_rows += z;
        nonzero += !z;
    }
    ASSERT_EQ_INT(zero_rows, 4); /* 2, 4, 6, 7 */
    ASSERT_EQ_INT(nonzero, 5);
    for (int k = 0; k < 2; k++) {
        dt_tensor_free(w[k]);
        dt_tensor_free(g[k]);
    }
    dt_ctx_free(ctx);
}

TEST(embedding_lp_equals_widened)
{
    embedding_lp_case(DT_BF16);
    embedding_lp_case(DT_F16);
}

/* ReLU on a bf16/f16 tensor reads and writes its dtype in one pass
 * (dt_k_relu_*_lp): output and gradient equal, bit for bit, the
 * composition it replaces (widen, f32 relu, round), on plain and nChw16c
 * (flag kept) layouts, with zeros, -0, NaN and an upstream gradient that is
 * not representable in the dtype (its rounding shows). */
static void relu_lp_case(dt_dtype dt, bool blocked)
{
    enum { N = 2, C = 16, H = 3, W = 5, M = N * C * H * W };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[M], gv[M];
    dt_rng_fill_uniform(dt_rng_key_make(9, DT_RNG_DATA, 0, 0), 0, xv, M, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(9, DT_RNG_DATA, 1, 0), 0, gv, M, -1.0f, 1.0f);
    xv[3] = 0.0f;
    xv[4] = -0.0f;
    xv[5] = NAN;
    dt_tensor *x[2], *g[2];
    for (int k = 0; k < 2; k++) {
        x[k] = dt_tensor_new(dt, 4, SH(N, C, H, W));
        g[k] = dt_tensor_new(dt, 4, SH(N, C, H, W));
        ASSERT_OK(dt_k_convert(xv, DT_F32, x[k]->data, dt, M));
        if (blocked)
            x[k]->flags |= DT_TENSOR_BLOCKED16;
        ASSERT_OK(dt_tensor_zero(g[k]));
        ASSERT_OK(dt_tensor_set_grad(x[k], g[k]));
    }
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 4, SH(N, C, H, W), gv);
    dt_tensor *y = dt_relu(ctx, x[0]);
    dt_tensor *yr = dt_cast(ctx, dt_relu(ctx, dt_cast(ctx, x[1], DT_F32)), dt);
    ASSERT(y && yr && y->dtype == dt && yr->dtype == dt);
    ASSERT_EQ_INT((int)(y->flags & DT_TENSOR_BLOCKED), blocked ? (int)DT_TENSOR_BLOCKED16 : 0);
    ASSERT_EQ_INT((int)(yr->flags & DT_TENSOR_BLOCKED), (int)(y->flags & DT_TENSOR_BLOCKED));
    ASSERT(!memcmp(y->data, yr->data, (size_t)M * 2));
    /* a backward is seeded on a plain tensor: through dt_contiguous */
    ASSERT_OK(dt_backward_with(ctx, blocked ? dt_contiguous(ctx, y) : y, R));
    ASSERT_OK(dt_backward_with(ctx, blocked ? dt_contiguous(ctx, yr) : yr, R));
    ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)M * 2));
    int nz = 0;
    for (int64_t i = 0; i < M; i++)
        nz += dt_tensor_get(g[0], i) != 0.0;
    ASSERT(nz > M / 4 && nz < M); /* some pass, some are masked */
    /* the backward kernel itself rounds dy to the dtype first, as the
     * round's cast backward does (in a graph every gradient that reaches a
     * bf16/f16 tensor is rounded already, so only the kernel shows it) */
    static float dx[M], dxr[M], yw[M];
    uint16_t h[M];
    ASSERT_OK(dt_k_relu_bwd_lp(dt, y->data, gv, dx, M));
    ASSERT_OK(dt_k_convert(gv, DT_F32, h, dt, M));
    ASSERT_OK(dt_k_convert(h, dt, dxr, DT_F32, M));
    ASSERT_OK(dt_k_convert(y->data, dt, yw, DT_F32, M));
    ASSERT_OK(dt_k_relu_bwd(yw, dxr, dxr, M));
    ASSERT(!memcmp(dx, dxr, sizeof dx));
    for (int k = 0; k < 2; k++) {
        dt_tensor_free(x[k]);
        dt_tensor_free(g[k]);
    }
    dt_ctx_free(ctx);
}

/* bias + GELU on a bf16/f16 x (dtype dt) reads x as it is, with an f32
 * bias (GPT-2's c_fc under autocast: one tape node where widening recorded
 * two, a cast and the op; the result f32) or a bias of dt (a bf16 model's
 * c_fc: the bias widened, the result rounded to dt in the kernel; two
 * nodes where widening both and rounding recorded four). The result and
 * the gradients of x (rounded to its dtype) and of the bias equal, bit for
 * bit, those of the widening composition, on every ISA path the CPU has. */
static void bias_gelu_lp_case(dt_dtype dt, bool lp_bias)
{
    enum { B = 2, T = 3, N = 203, M = B * T * N };
    const dt_dtype bt = lp_bias ? dt : DT_F32, yt = lp_bias ? dt : DT_F32;
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float xv[M], gv[M], bv[N];
    dt_rng_fill_uniform(dt_rng_key_make(10 + lp_bias, DT_RNG_DATA, 0, 0), 0, xv, M, -5.0f, 5.0f);
    dt_rng_fill_uniform(dt_rng_key_make(10 + lp_bias, DT_RNG_DATA, 1, 0), 0, gv, M, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(10 + lp_bias, DT_RNG_DATA, 2, 0), 0, bv, N, -1.0f, 1.0f);
    xv[3] = -0.0f;
    xv[4] = 60.0f;
    xv[5] = -60.0f;
    const dt_k_isa paths[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (dt_k_set_isa(paths[p]) != DT_OK)
            continue;
        dt_tensor *x[2], *g[2], *b[2], *gb[2];
        for (int k = 0; k < 2; k++) {
            x[k] = dt_tensor_new(dt, 3, SH(B, T, N));
            g[k] = dt_tensor_new(DT_F32, 3, SH(B, T, N));
            b[k] = dt_tensor_new(bt, 1, SH(N));
            gb[k] = dt_tensor_new(DT_F32, 1, SH(N));
            ASSERT_OK(dt_k_convert(xv, DT_F32, x[k]->data, dt, M));
            ASSERT_OK(dt_k_convert(bv, DT_F32, b[k]->data, bt, N));
            ASSERT_OK(dt_tensor_zero(g[k]));
            ASSERT_OK(dt_tensor_zero(gb[k]));
            ASSERT_OK(dt_tensor_set_grad(x[k], g[k]));
            ASSERT_OK(dt_tensor_set_grad(b[k], gb[k]));
        }
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, N), gv);
        size_t t0 = dt_ag_tape_len(ctx);
        dt_tensor *y = dt_bias_gelu_tanh(ctx, x[0], b[0]);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), lp_bias ? 2 : 1); /* the bias's cast, the op; no cast of x */
        dt_tensor *yr = dt_bias_gelu_tanh(ctx, dt_cast(ctx, x[1], DT_F32), lp_bias ? dt_cast(ctx, b[1], DT_F32) : b[1]);
        if (lp_bias)
            yr = dt_cast(ctx, yr, dt);
        ASSERT(y && yr && y->dtype == yt && yr->dtype == yt);
        ASSERT(!memcmp(y->data, yr->data, (size_t)M * dt_dtype_size(yt)));
        ASSERT_OK(dt_backward_with(ctx, y, R));
        ASSERT_OK(dt_backward_with(ctx, yr, R));
        ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)M * 4));
        ASSERT(!memcmp(gb[0]->data, gb[1]->data, (size_t)N * 4));
        int odd = 0, nz = 0, nzb = 0; /* x's gradient holds values of its dtype; the upstream ones mostly do not */
        uint16_t h;
        for (int64_t i = 0; i < M; i++) {
            float v = ((float *)g[0]->data)[i], w;
            ASSERT_OK(dt_k_convert(&v, DT_F32, &h, dt, 1));
            ASSERT_OK(dt_k_convert(&h, dt, &w, DT_F32, 1));
            odd += memcmp(&v, &w, 4) != 0;
            nz += v != 0.0f;
        }
        for (int64_t i = 0; i < N; i++)
            nzb += ((float *)gb[0]->data)[i] != 0.0f;
        ASSERT_EQ_INT(odd, 0);
        ASSERT(nz > M / 2 && nzb > N / 2);
        for (int k = 0; k < 2; k++) {
            dt_tensor_free(x[k]);
            dt_tensor_free(g[k]);
            dt_tensor_free(b[k]);
            dt_tensor_free(gb[k]);
        }
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    dt_ctx_free(ctx);
}

TEST(bias_gelu_lp_equals_widened)
{
    for (int lb = 0; lb < 2; lb++) {
        bias_gelu_lp_case(DT_BF16, lb);
        bias_gelu_lp_case(DT_F16, lb);
    }
}

/* f32 + bf16/f16 of one shape (GPT-2's residual adds under autocast) reads
 * the low-precision operand as it is: one tape node where widening recorded
 * two, and the f32 sum and both gradients (the low one rounded to its
 * dtype, -0 upstream giving +0 as the widened buffer gave) equal the
 * widening composition's bit for bit, in both operand orders and on every
 * ISA path; a broadcast pair still widens (two nodes) with the same result. */
static void add_lp_case(dt_dtype dt)
{
    enum { B = 2, T = 3, C = 301, M = B * T * C };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float av[M], bv[M], gv[M];
    dt_rng_fill_uniform(dt_rng_key_make(11, DT_RNG_DATA, 0, 0), 0, av, M, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(11, DT_RNG_DATA, 1, 0), 0, bv, M, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(11, DT_RNG_DATA, 2, 0), 0, gv, M, -1.0f, 1.0f);
    av[1] = -0.0f, bv[1] = -0.0f, bv[2] = NAN, av[3] = INFINITY;
    gv[4] = -0.0f, gv[5] = 1e-30f;
    const dt_k_isa paths[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (dt_k_set_isa(paths[p]) != DT_OK)
            continue;
        for (int lp_first = 0; lp_first < 2; lp_first++) {
            dt_tensor *a[2], *b[2], *ga[2], *gb[2];
            for (int k = 0; k < 2; k++) {
                a[k] = dt_tensor_new(DT_F32, 3, SH(B, T, C));
                b[k] = dt_tensor_new(dt, 3, SH(B, T, C));
                ga[k] = dt_tensor_new(DT_F32, 3, SH(B, T, C));
                gb[k] = dt_tensor_new(DT_F32, 3, SH(B, T, C));
                memcpy(a[k]->data, av, sizeof av);
                ASSERT_OK(dt_k_convert(bv, DT_F32, b[k]->data, dt, M));
                ASSERT_OK(dt_tensor_zero(ga[k]));
                ASSERT_OK(dt_tensor_zero(gb[k]));
                ASSERT_OK(dt_tensor_set_grad(a[k], ga[k]));
                ASSERT_OK(dt_tensor_set_grad(b[k], gb[k]));
            }
            dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, C), gv);
            /* the low operand through a temporary (dt_scale by 1, in its dtype), as a GEMM's output is */
            dt_tensor *h0 = dt_scale(ctx, b[0], 1.0f), *h1 = dt_scale(ctx, b[1], 1.0f);
            ASSERT(h0 && h1 && h0->dtype == dt);
            size_t t0 = dt_ag_tape_len(ctx);
            dt_tensor *y = lp_first ? dt_add(ctx, h0, a[0]) : dt_add(ctx, a[0], h0);
            ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1); /* no cast node */
            dt_tensor *w = dt_cast(ctx, h1, DT_F32);
            dt_tensor *yr = lp_first ? dt_add(ctx, w, a[1]) : dt_add(ctx, a[1], w);
            ASSERT(y && yr && y->dtype == DT_F32 && yr->dtype == DT_F32);
            ASSERT(!memcmp(y->data, yr->data, (size_t)M * 4));
            ASSERT_OK(dt_backward_with(ctx, y, R));
            ASSERT_OK(dt_backward_with(ctx, yr, R));
            ASSERT(!memcmp(ga[0]->data, ga[1]->data, (size_t)M * 4));
            ASSERT(!memcmp(gb[0]->data, gb[1]->data, (size_t)M * 4));
            ASSERT(memcmp(gb[0]->data, gv, (size_t)M * 4) != 0); /* rounded: not the upstream values */
            for (int k = 0; k < 2; k++) {
                dt_tensor_free(a[k]);
                dt_tensor_free(b[k]);
                dt_tensor_free(ga[k]);
                dt_tensor_free(gb[k]);
            }
            dt_ctx_reset(ctx);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    /* the rounding kernel itself: -0 gives +0 (the zeroed widened buffer's
     * sum), other values are rounded to the dtype */
    const float gin[3] = {-0.0f, 1.0f + 0x1p-12f, -3.0f};
    float gout[3], w3[3];
    uint16_t h3[3];
    ASSERT_OK(dt_k_grad_round_lp(dt, gin, gout, NULL, 3));
    ASSERT_OK(dt_k_convert(gin, DT_F32, h3, dt, 3));
    ASSERT_OK(dt_k_convert(h3, dt, w3, DT_F32, 3));
    ASSERT(!signbit(gout[0]) && gout[0] == 0.0f);
    ASSERT(!memcmp(gout + 1, w3 + 1, 8));
    /* broadcast: the widening path */
    dt_tensor *a = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, C), av);
    dt_tensor *b = dt_tensor_new(dt, 1, SH(C));
    ASSERT_OK(dt_k_convert(bv, DT_F32, b->data, dt, C));
    dt_tensor *bw = dt_cast(ctx, b, DT_F32);
    dt_tensor *y = dt_add(ctx, a, b), *yr = dt_add(ctx, a, bw);
    ASSERT(y && yr && y->dtype == DT_F32);
    ASSERT(!memcmp(y->data, yr->data, (size_t)M * 4));
    dt_tensor_free(b);
    dt_ctx_free(ctx);
}

TEST(add_lp_equals_widened)
{
    add_lp_case(DT_BF16);
    add_lp_case(DT_F16);
}

/* bf16 + bf16 (f16 + f16) of one shape (Llama's residual adds under
 * autocast): one tape node where widening recorded four (two casts, the f32
 * add, the result's cast), and the low-precision sum and both gradients
 * (the upstream rounded to the result's dtype, then each operand's, -0 and
 * a negative subnormal upstream giving +0 as the widened buffers gave)
 * equal the widening composition's bit for bit on every ISA path. */
static void add_lp2_case(dt_dtype dt)
{
    enum { B = 2, T = 3, C = 301, M = B * T * C };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float av[M], bv[M], gv[M];
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 0, 0), 0, av, M, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 1, 0), 0, bv, M, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 2, 0), 0, gv, M, -1.0f, 1.0f);
    av[1] = -0.0f, bv[1] = -0.0f, bv[2] = NAN, av[3] = INFINITY, av[6] = 3e38f, bv[6] = 3e38f;
    gv[4] = -0.0f, gv[5] = 1e-30f, gv[7] = -1e-45f, gv[8] = NAN;
    const dt_k_isa paths[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (dt_k_set_isa(paths[p]) != DT_OK)
            continue;
        dt_tensor *a[2], *b[2], *ga[2], *gb[2];
        for (int k = 0; k < 2; k++) {
            a[k] = dt_tensor_new(dt, 3, SH(B, T, C));
            b[k] = dt_tensor_new(dt, 3, SH(B, T, C));
            ga[k] = dt_tensor_new(DT_F32, 3, SH(B, T, C));
            gb[k] = dt_tensor_new(DT_F32, 3, SH(B, T, C));
            ASSERT_OK(dt_k_convert(av, DT_F32, a[k]->data, dt, M));
            ASSERT_OK(dt_k_convert(bv, DT_F32, b[k]->data, dt, M));
            ASSERT_OK(dt_tensor_zero(ga[k]));
            ASSERT_OK(dt_tensor_zero(gb[k]));
            ASSERT_OK(dt_tensor_set_grad(a[k], ga[k]));
            ASSERT_OK(dt_tensor_set_grad(b[k], gb[k]));
        }
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, C), gv);
        /* both operands through temporaries (dt_scale by 1, in their dtype), as the block's are */
        dt_tensor *h0 = dt_scale(ctx, a[0], 1.0f), *k0 = dt_scale(ctx, b[0], 1.0f);
        dt_tensor *h1 = dt_scale(ctx, a[1], 1.0f), *k1 = dt_scale(ctx, b[1], 1.0f);
        ASSERT(h0 && k0 && h1 && k1 && h0->dtype == dt);
        size_t t0 = dt_ag_tape_len(ctx);
        dt_tensor *y = dt_add(ctx, h0, k0);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1); /* no cast nodes */
        dt_tensor *yr = dt_cast(ctx, dt_add(ctx, dt_cast(ctx, h1, DT_F32), dt_cast(ctx, k1, DT_F32)), dt);
        ASSERT(y && yr && y->dtype == dt && yr->dtype == dt);
        ASSERT(!memcmp(y->data, yr->data, (size_t)M * 2));
        ASSERT_OK(dt_backward_with(ctx, y, R));
        ASSERT_OK(dt_backward_with(ctx, yr, R));
        ASSERT(!memcmp(ga[0]->data, ga[1]->data, (size_t)M * 4));
        ASSERT(!memcmp(gb[0]->data, gb[1]->data, (size_t)M * 4));
        ASSERT(memcmp(ga[0]->data, gv, (size_t)M * 4) != 0); /* rounded: not the upstream values */
        ASSERT(!signbit(((float *)ga[0]->data)[7]));
        for (int k = 0; k < 2; k++) {
            dt_tensor_free(a[k]);
            dt_tensor_free(b[k]);
            dt_tensor_free(ga[k]);
            dt_tensor_free(gb[k]);
        }
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    /* the kernel's arguments */
    uint16_t h[4] = {0};
    ASSERT_STATUS(dt_k_add2_lp(DT_F32, h, h, h, 2), DT_ERR_DTYPE);
    ASSERT_STATUS(dt_k_add2_lp(dt, NULL, h, h, 2), DT_ERR_NULL);
    ASSERT_STATUS(dt_k_add2_lp(dt, h, h, h, -1), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_k_add2_lp(dt, h, h, h, 4)); /* y aliasing both */
    dt_ctx_free(ctx);
}

TEST(add_lp2_equals_widened)
{
    add_lp2_case(DT_BF16);
    add_lp2_case(DT_F16);
}

TEST(relu_lp_equals_widened)
{
    for (int b = 0; b < 2; b++) {
        relu_lp_case(DT_BF16, b);
        relu_lp_case(DT_F16, b);
    }
}

/* Max pooling of a bf16/f16 tensor (pool's low-precision path: no cast
 * passes in the backward) equals, bit for bit, widen + f32 max pool +
 * round: output and gradient, plain and nChw16c, windows 2/2 (disjoint:
 * the second rounding of the gradient skipped) and 3/2 pad 1 (overlapping:
 * the upstream gradient, not representable in the dtype, must be rounded
 * before the windows' contributions add up), with ties, -0 and NaN. */
static void maxpool_lp_case(dt_dtype dt, bool blocked, int k, int stride, int pad)
{
    enum { N = 2, C = 16, H = 6, W = 7, M = N * C * H * W };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[M];
    dt_rng_fill_uniform(dt_rng_key_make(11, DT_RNG_DATA, 0, 0), 0, xv, M, -1.0f, 1.0f);
    xv[0] = xv[1] = 0.5f; /* a tie */
    xv[8] = -0.0f;
    xv[9] = NAN;
    dt_tensor *x[2], *g[2], *y[2];
    for (int i = 0; i < 2; i++) {
        x[i] = dt_tensor_new(dt, 4, SH(N, C, H, W));
        g[i] = dt_tensor_new(dt, 4, SH(N, C, H, W));
        ASSERT_OK(dt_k_convert(xv, DT_F32, x[i]->data, dt, M));
        if (blocked)
            x[i]->flags |= DT_TENSOR_BLOCKED16;
        ASSERT_OK(dt_tensor_zero(g[i]));
        ASSERT_OK(dt_tensor_set_grad(x[i], g[i]));
    }
    y[0] = dt_max_pool2d(ctx, x[0], k, stride, pad);
    y[1] = dt_cast(ctx, dt_max_pool2d(ctx, dt_cast(ctx, x[1], DT_F32), k, stride, pad), dt);
    ASSERT(y[0] && y[1] && y[0]->dtype == dt && y[1]->dtype == dt);
    ASSERT_EQ_INT((int)dt_tensor_block(y[0]), blocked ? 16 : 0);
    ASSERT_EQ_INT((int)dt_tensor_block(y[1]), (int)dt_tensor_block(y[0]));
    int64_t m = dt_tensor_numel(y[0]);
    ASSERT(!memcmp(y[0]->data, y[1]->data, (size_t)m * 2));
    static float gv[M]; /* (m <= M) */
    dt_rng_fill_uniform(dt_rng_key_make(11, DT_RNG_DATA, 1, 0), 0, gv, m, -1.0f, 1.0f);
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 4, y[0]->shape, gv);
    for (int i = 0; i < 2; i++) /* a backward is seeded on a plain tensor */
        ASSERT_OK(dt_backward_with(ctx, blocked ? dt_contiguous(ctx, y[i]) : y[i], R));
    ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)M * 2));
    int nz = 0;
    for (int64_t i = 0; i < M; i++)
        nz += dt_tensor_get(g[0], i) != 0.0;
    ASSERT(nz > 0 && nz < M);
    for (int i = 0; i < 2; i++) {
        dt_tensor_free(x[i]);
        dt_tensor_free(g[i]);
    }
    dt_ctx_free(ctx);
}

TEST(maxpool_lp_equals_widened)
{
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 2; d++) {
            maxpool_lp_case(d ? DT_F16 : DT_BF16, b, 2, 2, 0);
            maxpool_lp_case(d ? DT_F16 : DT_BF16, b, 3, 2, 1);
        }
}

/* Layer norm writing a low-precision result (dt_layer_norm_to: GPT-2's
 * ln_1 / ln_2 / ln_f under bf16 autocast, whose c_attn / c_fc / head would
 * round the f32 result anyway) and layer norm of a bf16/f16 x (dt_layer_norm):
 * one tape node where the cast chain recorded two or three, and the result's
 * bits and the gradients of x, gamma and beta (each rounded as the chain's
 * casts round them) equal the chain's bit for bit, on every ISA path the CPU
 * has; rows longer than the kernel's stack buffer too. */
static void layernorm_lp_case(dt_dtype dt, int64_t R, int64_t D, bool lp_x, dt_dtype pt)
{
    const int64_t M = R * D;
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float *xv = malloc((size_t)M * 4), *gv = malloc((size_t)M * 4), *pv = malloc((size_t)D * 8);
    ASSERT(xv && gv && pv);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 0, 0), 0, xv, M, -4.0f, 6.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 1, 0), 0, gv, M, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 2, 0), 0, pv, 2 * D, -2.0f, 2.0f);
    for (int64_t j = 0; j < D; j++) /* a constant row: variance 0, eps alone */
        xv[j] = 1.5f;
    xv[D] = -0.0f, xv[D + 1] = 300.0f, gv[2] = -0.0f, gv[3] = 1e-30f, gv[4] = 3e-39f;
    const dt_k_isa paths[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (dt_k_set_isa(paths[p]) != DT_OK)
            continue;
        const dt_dtype xt = lp_x ? dt : DT_F32;
        dt_tensor *x[2], *g[2], *b[2], *gx[2], *gg[2], *gb[2];
        for (int k = 0; k < 2; k++) {
            x[k] = dt_tensor_new(xt, 2, SH(R, D));
            g[k] = dt_tensor_new(pt, 1, SH(D));
            b[k] = dt_tensor_new(pt, 1, SH(D));
            gx[k] = dt_tensor_new(DT_F32, 2, SH(R, D));
            gg[k] = dt_tensor_new(DT_F32, 1, SH(D));
            gb[k] = dt_tensor_new(DT_F32, 1, SH(D));
            ASSERT_OK(dt_k_convert(xv, DT_F32, x[k]->data, xt, M));
            ASSERT_OK(dt_k_convert(pv, DT_F32, g[k]->data, pt, D));
            ASSERT_OK(dt_k_convert(pv + D, DT_F32, b[k]->data, pt, D));
            ASSERT_OK(dt_tensor_zero(gx[k]));
            ASSERT_OK(dt_tensor_zero(gg[k]));
            ASSERT_OK(dt_tensor_zero(gb[k]));
            ASSERT_OK(dt_tensor_set_grad(x[k], gx[k]));
            ASSERT_OK(dt_tensor_set_grad(g[k], gg[k]));
            ASSERT_OK(dt_tensor_set_grad(b[k], gb[k]));
        }
        dt_tensor *G = dt_tensor_from(ctx, DT_F32, 2, SH(R, D), gv);
        size_t t0 = dt_ag_tape_len(ctx);
        dt_tensor *y = lp_x ? dt_layer_norm(ctx, x[0], g[0], b[0], 1e-5f)
                            : dt_layer_norm_to(ctx, x[0], g[0], b[0], 1e-5f, dt);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1); /* no cast node */
        dt_tensor *xr = lp_x ? dt_cast(ctx, x[1], DT_F32) : x[1];
        dt_tensor *gr = pt != DT_F32 ? dt_cast(ctx, g[1], DT_F32) : g[1];
        dt_tensor *br = pt != DT_F32 ? dt_cast(ctx, b[1], DT_F32) : b[1];
        dt_tensor *yr = dt_cast(ctx, dt_layer_norm(ctx, xr, gr, br, 1e-5f), dt);
        ASSERT(y && yr && y->dtype == dt && yr->dtype == dt);
        ASSERT(!memcmp(y->data, yr->data, (size_t)M * 2));
        ASSERT_OK(dt_backward_with(ctx, y, G));
        ASSERT_OK(dt_backward_with(ctx, yr, G));
        ASSERT(!memcmp(gx[0]->data, gx[1]->data, (size_t)M * 4));
        ASSERT(!memcmp(gg[0]->data, gg[1]->data, (size_t)D * 4));
        ASSERT(!memcmp(gb[0]->data, gb[1]->data, (size_t)D * 4));
        int nz = 0;
        for (int64_t i = 0; i < M; i++)
            nz += ((float *)gx[0]->data)[i] != 0.0f;
        ASSERT(nz > M / 2);
        { /* the kernel given dy as its dt values (a producer's shadow): what it computes from dy rounded */
            float *st = malloc((size_t)R * 8), *d[2] = {malloc((size_t)M * 4), malloc((size_t)M * 4)};
            float *dg[2] = {malloc((size_t)D * 4), malloc((size_t)D * 4)}, *db[2] = {malloc((size_t)D * 4),
                                                                                   malloc((size_t)D * 4)};
            uint16_t *yh = malloc((size_t)M * 2), *gh = malloc((size_t)M * 2);
            ASSERT(st && d[0] && d[1] && dg[0] && dg[1] && db[0] && db[1] && yh && gh);
            ASSERT_OK(dt_k_layernorm_fwd_lp(x[0]->data, xt, R, D, pv, pv + D, 1e-5f, yh, dt, st, st + R));
            ASSERT_OK(dt_k_convert(gv, DT_F32, gh, dt, M));
            ASSERT_OK(dt_k_layernorm_bwd_lp(x[0]->data, xt, gv, NULL, dt, R, D, pv, st, st + R, d[0], dg[0], db[0]));
            ASSERT_OK(dt_k_layernorm_bwd_lp(x[0]->data, xt, NULL, gh, dt, R, D, pv, st, st + R, d[1], dg[1], db[1]));
            ASSERT(!memcmp(d[0], d[1], (size_t)M * 4));
            ASSERT(!memcmp(dg[0], dg[1], (size_t)D * 4));
            ASSERT(!memcmp(db[0], db[1], (size_t)D * 4));
            ASSERT(dt_k_layernorm_bwd_lp(x[0]->data, xt, NULL, gh, DT_F32, R, D, pv, st, st + R, d[1], NULL, NULL) ==
                   DT_ERR_INVALID_ARG); /* an f32 result's gradient has no dtype of its own */
            free(st), free(yh), free(gh);
            for (int k = 0; k < 2; k++)
                free(d[k]), free(dg[k]), free(db[k]);
        }
        for (int k = 0; k < 2; k++) {
            dt_tensor_free(x[k]);
            dt_tensor_free(g[k]);
            dt_tensor_free(b[k]);
            dt_tensor_free(gx[k]);
            dt_tensor_free(gg[k]);
            dt_tensor_free(gb[k]);
        }
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(xv);
    free(gv);
    free(pv);
    dt_ctx_free(ctx);
}

TEST(layernorm_lp_equals_widened)
{
    layernorm_lp_case(DT_BF16, 6, 203, false, DT_F32);   /* f32 x, bf16 result: autocast */
    layernorm_lp_case(DT_BF16, 2, 4500, false, DT_F32);  /* past the stack buffer */
    layernorm_lp_case(DT_F16, 6, 203, false, DT_F32);
    layernorm_lp_case(DT_BF16, 6, 203, true, DT_F32);    /* bf16 x, f32 gamma/beta */
    layernorm_lp_case(DT_BF16, 5, 64, true, DT_BF16);    /* bf16 parameters too */
    layernorm_lp_case(DT_F16, 6, 203, true, DT_F32);
    layernorm_lp_case(DT_BF16, 6, 203, false, DT_BF16);  /* f32 x, bf16 gamma/beta, bf16 result */
    /* the result dtype must be a float one */
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_new(DT_F32, 2, SH(2, 8));
    ASSERT_OK(dt_tensor_zero(x));
    ASSERT(!dt_layer_norm_to(ctx, x, NULL, NULL, 1e-5f, DT_I32));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_DTYPE);
    dt_tensor *y = dt_layer_norm_to(ctx, x, NULL, NULL, 1e-5f, DT_F32); /* f32: dt_layer_norm itself */
    ASSERT(y && y->dtype == DT_F32);
    dt_tensor_free(x);
    dt_ctx_free(ctx);
}

TEST(autocast_table_and_linear)
{
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_LINEAR), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_MATMUL), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_CONV2D), DT_AMP_LOWER);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_CROSS_ENTROPY), DT_AMP_FP32);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_MSE_LOSS), DT_AMP_FP32);
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_SOFTMAX), DT_AMP_PROMOTE); /* CPU: not forced to f32 */
    ASSERT_EQ_INT(dt_autocast_class(DT_OP_LAYER_NORM), DT_AMP_PROMOTE);
    ASSERT_STR_EQ(dt_op_name(DT_OP_CROSS_ENTROPY), "cross_entropy_loss");
    ASSERT_STR_EQ(dt_amp_class_name(DT_AMP_LOWER), "lower");
    ASSERT_EQ_INT(dt_autocast_class((dt_op)999), DT_AMP_PROMOTE);

    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    ASSERT_EQ_INT(dt_autocast_dtype(ctx), DT_F32);
    ASSERT_STATUS(dt_autocast_set(ctx, DT_I32, NULL), DT_ERR_DTYPE);
    dt_tensor *w = dt_tensor_new(DT_F32, 2, SH(3, 8)), *b = dt_tensor_new(DT_F32, 1, SH(3));
    dt_tensor_rand_uniform(w, dt_rng_key_make(1, DT_RNG_DATA, 0, 0), -1, 1);
    dt_tensor_rand_uniform(b, dt_rng_key_make(1, DT_RNG_DATA, 1, 0), -1, 1);
    dt_tensor_set_requires_grad(w, true);
    dt_tensor_set_requires_grad(b, true);
    dt_tensor *x = dt_tensor_empty(ctx, DT_F32, 2, SH(5, 8));
    dt_tensor_rand_uniform(x, dt_rng_key_make(1, DT_RNG_DATA, 2, 0), -1, 1);
    int64_t lab[5] = {0, 1, 2, 1, 0};
    dt_tensor *y = dt_tensor_view_of(ctx, lab, DT_I64, 1, SH(5));

    /* f32 reference on the bf16-rounded values */
    dt_tensor *xr = dt_cast(ctx, dt_cast(ctx, x, DT_BF16), DT_F32);
    dt_tensor *wr = dt_cast(ctx, dt_cast(ctx, w, DT_BF16), DT_F32);
    dt_tensor *br = dt_cast(ctx, dt_cast(ctx, b, DT_BF16), DT_F32);
    dt_tensor *lin = dt_linear(ctx, xr, wr, br);
    dt_tensor *lref = dt_cross_entropy(ctx, lin, y);
    ASSERT_OK(dt_ag_retain_grad(lin)); /* its gradient is read below */
    ASSERT_OK(dt_backward(ctx, lref));
    float gref[24];
    double gabs[24]; /* sum_r |dlogits[r][o]| |x[r][i]|: the bound's scale */
    for (int i = 0; i < 24; i++) {
        gref[i] = ((float *)w->grad->data)[i];
        gabs[i] = 0;
        for (int r = 0; r < 5; r++)
            gabs[i] += fabs(((float *)lin->grad->data)[r * 3 + i / 8]) * fabs(dt_tensor_get(xr, r * 8 + i % 8));
    }
    dt_ag_zero_grad(w);
    dt_ag_zero_grad(b);
    dt_ctx_reset(ctx);

    dt_dtype old;
    x = dt_tensor_empty(ctx, DT_F32, 2, SH(5, 8));
    dt_tensor_rand_uniform(x, dt_rng_key_make(1, DT_RNG_DATA, 2, 0), -1, 1);
    y = dt_tensor_view_of(ctx, lab, DT_I64, 1, SH(5));
    ASSERT_OK(dt_autocast_set(ctx, DT_BF16, &old));
    ASSERT_EQ_INT(old, DT_F32);
    dt_tensor *logits = dt_linear(ctx, x, w, b);
    ASSERT(logits && logits->dtype == DT_BF16);      /* lower: ran in bf16 */
    dt_tensor *r = dt_relu(ctx, logits);
    ASSERT(r && r->dtype == DT_BF16);                /* promote: stays bf16 */
    dt_tensor *loss = dt_cross_entropy(ctx, logits, y);
    ASSERT(loss && loss->dtype == DT_F32);           /* fp32: a loss */
    ASSERT_OK(dt_autocast_set(ctx, old, NULL));
    ASSERT_EQ_INT(dt_autocast_dtype(ctx), DT_F32);
    ASSERT_OK(dt_backward(ctx, loss));
    ASSERT_EQ_INT(w->grad->dtype, DT_F32);           /* the f32 weight keeps an f32 grad */
    /* bound: the logits (and so their gradient) rounded to bf16 twice on a
     * K = 5 reduction: 3u sum_r |g_r x_r| (u = 2^-8) */
    for (int i = 0; i < 24; i++)
        ASSERT_NEAR(((float *)w->grad->data)[i], gref[i], 3.0 / 256 * gabs[i] + 1e-7, 0);
    dt_tensor *f = dt_linear(ctx, x, w, b); /* autocast off again: f32 */
    ASSERT(f && f->dtype == DT_F32);
    dt_ctx_free(ctx);
    dt_tensor_free(w);
    dt_tensor_free(b);
}

/* Mixed dtypes promote to f32 (PyTorch); bf16 with f16 too. */
TEST(promotion)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *a = dt_tensor_full(ctx, DT_BF16, 2, SH(2, 3), 1.5);
    dt_tensor *b = dt_tensor_full(ctx, DT_F16, 2, SH(2, 3), 0.25);
    dt_tensor *f = dt_tensor_full(ctx, DT_F32, 2, SH(3, 2), 2.0);
    dt_tensor *s = dt_add(ctx, a, b);
    ASSERT(s && s->dtype == DT_F32 && dt_tensor_get(s, 4) == 1.75);
    dt_tensor *m = dt_matmul(ctx, a, f);
    ASSERT(m && m->dtype == DT_F32 && dt_tensor_get(m, 0) == 9.0);
    dt_tensor *mm = dt_matmul(ctx, a, dt_cast(ctx, f, DT_BF16));
    ASSERT(mm && mm->dtype == DT_BF16 && dt_tensor_get(mm, 3) == 9.0);
    /* batch norm keeps x's dtype with f32 parameters (keep_batchnorm_fp32) */
    dt_tensor *gm = dt_tensor_full(ctx, DT_F32, 1, SH(3), 1.0);
    dt_tensor *bn = dt_batch_norm(ctx, dt_tensor_full(ctx, DT_BF16, 2, SH(4, 3), 2.0), gm, NULL, NULL, NULL, true,
                                  0.1f, 1e-5f);
    ASSERT(bn && bn->dtype == DT_BF16);
    dt_ctx_free(ctx);
}

/* Model zoo in bf16/f16: parameters in the low flat (BatchNorm2d's in f32
 * with keep_batchnorm_fp32), equal to the f32 model rounded; a training
 * step under autocast reaches a loss within 2% of the f32 model's and
 * leaves gradients in both flats. */
static void zoo_lowp(const char *name, dt_dtype dt, bool keep_bn)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.mlp_seq = 4, cfg.mlp_dim = 32, cfg.mlp_hidden = 64;
    dt_model *m32 = NULL, *mlp = NULL;
    dt_model_desc d;
    ASSERT_OK(dt_model_create(name, 7, &cfg, &m32, &d));
    cfg.build.param_dtype = dt;
    cfg.build.keep_batchnorm_fp32 = keep_bn;
    ASSERT_OK(dt_model_create(name, 7, &cfg, &mlp, &d));
    size_t nbn = 0;
    for (size_t i = 0; i < dt_model_num_entries(mlp); i++) {
        dt_param_info p, q;
        dt_model_entry(mlp, i, &p);
        dt_model_entry(m32, i, &q);
        bool bn = dt_module_kind(p.module) == DT_NN_BATCHNORM2D;
        dt_dtype want = p.is_buffer ? q.dtype : (bn && keep_bn) ? DT_F32 : dt;
        ASSERT_EQ_INT(p.dtype, want);
        nbn += !p.is_buffer && bn;
        for (size_t j = 0; j < p.numel; j++)
            if (dt_tensor_get(p.tensor, (int64_t)j) != rnd(p.dtype, (float)dt_tensor_get(q.tensor, (int64_t)j)))
                TEST_FAIL_("%s %s[%zu] is not the f32 value rounded", name, p.name, j);
    }
    ASSERT(dt_model_flat(mlp, DT_FLAT_PARAMS, dt) && dt_model_flat(mlp, DT_FLAT_GRADS, dt));
    ASSERT((dt_model_flat(mlp, DT_FLAT_PARAMS, DT_F32) != NULL) == (keep_bn && nbn > 0));

    /* one forward + backward of each; batch of 4 */
    int nd, tnd;
    int64_t xs[DT_MAX_DIMS], ys[DT_MAX_DIMS];
    dt_dtype ydt;
    ASSERT_OK(dt_model_desc_shapes(&d, 4, &nd, xs, &tnd, ys, &ydt));
    float loss[2];
    for (int k = 0; k < 2; k++) {
        dt_model *mm = k ? mlp : m32;
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_tensor *x = dt_tensor_zeros(ctx, d.input_dtype, nd, xs);
        if (d.input_dtype == DT_F32)
            dt_tensor_rand_uniform(x, dt_rng_key_make(3, DT_RNG_DATA, 0, 0), 0, 1);
        else /* token ids */
            for (int64_t i = 0; i < dt_tensor_numel(x); i++)
                dt_tensor_set(x, i, (double)((i * 7 + 3) % 10));
        dt_tensor *y = d.has_target ? dt_tensor_zeros(ctx, ydt, tnd, ys) : NULL;
        for (int64_t i = 0; y && i < dt_tensor_numel(y); i++)
            dt_tensor_set(y, i, (double)((i * 3 + 1) % 10));
        dt_dtype old = DT_F32;
        if (k)
            ASSERT_OK(dt_autocast_set(ctx, dt, &old));
        dt_tensor *out = dt_model_forward(ctx, mm, x);
        dt_autocast_set(ctx, old, NULL);
        dt_tensor *l = dt_model_desc_loss(ctx, &d, out, y);
        if (!l)
            TEST_FAIL_("%s: %s", name, dt_last_error());
        ASSERT_EQ_INT(l->dtype, DT_F32);
        loss[k] = dt_tensor_item(l);
        ASSERT_OK(dt_backward(ctx, l));
        dt_ctx_free(ctx);
    }
    ASSERT_NEAR(loss[1], loss[0], 1e-3, 0.02);
    const dt_flat *g = dt_model_flat(mlp, DT_FLAT_GRADS, dt);
    double s = 0;
    for (size_t i = 0; i < g->used; i++)
        s += fabs(dt_dtype_load(dt, g->base, i));
    ASSERT(s > 0 && isfinite(s));
    if (keep_bn && nbn) {
        const dt_flat *g32 = dt_model_flat(mlp, DT_FLAT_GRADS, DT_F32);
        double s32 = 0;
        for (size_t i = 0; i < g32->used; i++)
            s32 += fabs(((float *)g32->base)[i]);
        ASSERT(s32 > 0 && isfinite(s32));
    }
    dt_model_free(m32);
    dt_model_free(mlp);
}

TEST(convnet_bf16_keep_bn) { zoo_lowp("convnet", DT_BF16, true); }
TEST(convnet_f16_all_low) { zoo_lowp("convnet", DT_F16, false); }
TEST(mlp_bf16) { zoo_lowp("mlp", DT_BF16, true); }
TEST(gpt_micro_bf16) { zoo_lowp("gpt-micro", DT_BF16, true); }

/* GPT-2's ln_1 / ln_2 under bf16 autocast write the bf16 that c_attn / c_fc
 * read (dt_layer_norm_to): the step's loss and every gradient equal, bit for
 * bit, those of the same model whose layer norms carry a forward hook (which
 * keeps the f32 result and the matmul's cast node), and the tape is two
 * nodes per block shorter. */
static dt_status noop_pre(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx, (void)m, (void)x, (void)ud;
    return DT_OK;
}

TEST(gpt_autocast_layernorm_writes_bf16)
{
    dt_model_config cfg = dt_model_config_default();
    dt_model *m[2] = {NULL, NULL};
    dt_model_desc d;
    for (int k = 0; k < 2; k++)
        ASSERT_OK(dt_model_create("gpt-micro", 7, &cfg, &m[k], &d));
    int nblk = 0;
    for (;; nblk++) {
        char p[64];
        snprintf(p, sizeof p, "transformer.h.%d.ln_1", nblk);
        dt_module *l1 = dt_model_find_module(m[1], p);
        snprintf(p, sizeof p, "transformer.h.%d.ln_2", nblk);
        dt_module *l2 = dt_model_find_module(m[1], p);
        if (!l1 || !l2)
            break;
        ASSERT_OK(dt_module_add_forward_pre_hook(l1, noop_pre, NULL, NULL));
        ASSERT_OK(dt_module_add_forward_pre_hook(l2, noop_pre, NULL, NULL));
    }
    ASSERT(nblk > 0);
    int nd, tnd;
    int64_t xs[DT_MAX_DIMS], ys[DT_MAX_DIMS];
    dt_dtype ydt;
    ASSERT_OK(dt_model_desc_shapes(&d, 3, &nd, xs, &tnd, ys, &ydt));
    float loss[2];
    size_t tape[2];
    for (int k = 0; k < 2; k++) {
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_tensor *x = dt_tensor_zeros(ctx, d.input_dtype, nd, xs), *y = dt_tensor_zeros(ctx, ydt, tnd, ys);
        for (int64_t i = 0; i < dt_tensor_numel(x); i++)
            dt_tensor_set(x, i, (double)((i * 7 + 3) % 50));
        for (int64_t i = 0; i < dt_tensor_numel(y); i++)
            dt_tensor_set(y, i, (double)((i * 3 + 1) % 50));
        ASSERT_OK(dt_autocast_set(ctx, DT_BF16, NULL));
        dt_tensor *l = dt_model_desc_loss(ctx, &d, dt_model_forward(ctx, m[k], x), y);
        if (!l)
            TEST_FAIL_("gpt-micro: %s", dt_last_error());
        loss[k] = dt_tensor_item(l);
        tape[k] = dt_ag_tape_len(ctx);
        ASSERT_OK(dt_backward(ctx, l));
        dt_ctx_free(ctx);
    }
    ASSERT(!memcmp(&loss[0], &loss[1], 4));
    ASSERT_EQ_INT((int)(tape[1] - tape[0]), 2 * nblk);
    const dt_flat *g0 = dt_model_flat(m[0], DT_FLAT_GRADS, DT_F32), *g1 = dt_model_flat(m[1], DT_FLAT_GRADS, DT_F32);
    ASSERT(g0 && g1 && g0->used == g1->used && g0->used > 0);
    ASSERT(!memcmp(g0->base, g1->base, g0->used * 4));
    double s = 0;
    for (size_t i = 0; i < g0->used; i++)
        s += fabs(((const float *)g0->base)[i]);
    ASSERT(s > 0 && isfinite(s));
    dt_model_free(m[0]);
    dt_model_free(m[1]);
}

/* A meta bf16 build's shard, filled by dt_model_init_range, equals the
 * same range of a full bf16 build (both generators). */
TEST(init_range_bf16)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.build.param_dtype = DT_BF16;
    cfg.build.world = 3;
    dt_model *full = NULL, *meta = NULL;
    ASSERT_OK(dt_model_create("convnet", 11, &cfg, &full, NULL));
    cfg.build.meta = true;
    ASSERT_OK(dt_model_create("convnet", 11, &cfg, &meta, NULL));
    const dt_flat *ff = dt_model_flat(full, DT_FLAT_PARAMS, DT_BF16);
    ASSERT(ff && dt_model_flat(meta, DT_FLAT_PARAMS, DT_BF16));
    for (int rng = 0; rng < 2; rng++) {
        if (rng == 1)
            ASSERT_OK(dt_model_init_torch(full, 11));
        for (int r = 0; r < 3; r++) {
            dt_flat sh, view;
            ASSERT_OK(dt_flat_alloc_shard(&sh, dt_model_flat(meta, DT_FLAT_PARAMS, DT_BF16), r, 3, NULL));
            ASSERT_OK(dt_model_init_range(meta, (dt_init_rng)rng, 11, &sh));
            ASSERT_OK(dt_flat_shard(ff, r, 3, &view));
            ASSERT(memcmp(sh.base, view.base, dt_flat_nbytes(&sh)) == 0);
            dt_flat_free(&sh);
        }
    }
    dt_model_free(full);
    dt_model_free(meta);
}

/* A bf16 linear layer's weight gradient when the GEMM writes it rounded
 * straight into the gradient tensor (the weight's only use, its buffer
 * lazily zero: DT_TENSOR_GRAD_LAZY over garbage) equals the gradient summed
 * in f32 and rounded by the flush (buffer zeroed, no mark) within one bf16
 * ulp (oneDNN picks its kernel per destination dtype), for both weight
 * layouts; x's gradient is the same in both; a second backward over the
 * same tape (two uses in one gradient now: the f32 path) adds to it.
 * dt_ag_grad_checked_finite, asked in grad-ready hooks: true for the
 * gradient written directly (its GEMM checked every value) and for a lazy
 * one whose f32 sum of two uses the flush rounds over it (checking as it
 * goes); false for one the flush adds to, outside the hooks, and for a
 * gradient that overflows. */
static dt_status checked_hook(dt_tensor *leaf, void *ud)
{
    *(int *)ud = dt_ag_grad_checked_finite(leaf) ? 1 : 0;
    return DT_OK;
}

static void direct_wgrad_case(bool wt)
{
    enum { R = 24, In = 40, Out = 33 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[R * In], wv[In * Out], rv[R * Out];
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 0, 0), 0, xv, R * In, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 1, 0), 0, wv, In * Out, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 2, 0), 0, rv, R * Out, -1.0f, 1.0f);
    dt_tensor *w[2], *gw[2], *y[2];
    for (int i = 0; i < 2; i++) {
        w[i] = dt_tensor_new(DT_BF16, 2, wt ? SH(Out, In) : SH(In, Out));
        gw[i] = dt_tensor_new(DT_BF16, 2, wt ? SH(Out, In) : SH(In, Out));
        ASSERT(w[i] && gw[i]);
        ASSERT_OK(dt_k_convert(wv, DT_F32, w[i]->data, DT_BF16, In * Out));
        ASSERT_OK(dt_tensor_fill(gw[i], i == 0 ? 12345.0 : 0.0)); /* [0]: stale garbage under the mark */
        ASSERT_OK(dt_tensor_set_grad(w[i], gw[i]));
        ASSERT_OK(dt_tensor_set_requires_grad(w[i], true));
    }
    int seen[2] = {-1, -1};
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_ag_add_grad_hook(w[i], checked_hook, &seen[i]));
    w[0]->flags |= DT_TENSOR_GRAD_LAZY;
    dt_tensor *x = dt_cast(ctx, dt_tensor_from(ctx, DT_F32, 2, SH(R, In), xv), DT_BF16);
    dt_tensor *R_ = dt_tensor_from(ctx, DT_F32, 2, SH(R, Out), rv);
    for (int i = 0; i < 2; i++) {
        y[i] = wt ? dt_linear(ctx, x, w[i], NULL) : dt_addmm(ctx, x, w[i], NULL);
        ASSERT(y[i] && y[i]->dtype == DT_BF16);
        ASSERT_OK(dt_backward_with(ctx, y[i], R_));
    }
    ASSERT(!(w[0]->flags & DT_TENSOR_GRAD_LAZY));
    ASSERT_EQ_INT(seen[0], 1); /* the GEMM's check, or (no bf16 result here) the lazy flush's */
    ASSERT_EQ_INT(seen[1], 0);
    ASSERT(!dt_ag_grad_checked_finite(w[0]) && !dt_ag_grad_checked_finite(w[1]));
    int nz = 0;
    for (int64_t i = 0; i < In * Out; i++) {
        double a = dt_tensor_get(gw[0], i), b = dt_tensor_get(gw[1], i);
        nz += a != 0.0;
        if (!(fabs(a - b) <= fabs(b) * 0x1p-7 + 1e-30))
            TEST_FAIL_("%s element %lld: direct %.6g, summed and rounded %.6g", wt ? "linear" : "addmm", (long long)i,
                       a, b);
    }
    ASSERT(nz > In * Out / 2);
    ASSERT_OK(dt_backward_with(ctx, y[0], R_)); /* no mark now: the f32 sum added, rounded once */
    ASSERT_EQ_INT(seen[0], 0);
    for (int64_t i = 0; i < 16; i++) {
        double a = dt_tensor_get(gw[0], i), b = dt_tensor_get(gw[1], i);
        ASSERT_NEAR(a, 2 * b, 0, 3 * 0x1p-7);
    }
    /* the direct path again, the output gradient at 3e38 everywhere: its sums overflow */
    float big[R * Out];
    for (int i = 0; i < R * Out; i++)
        big[i] = 3e38f;
    w[0]->flags |= DT_TENSOR_GRAD_LAZY;
    dt_tensor *y2 = wt ? dt_linear(ctx, x, w[0], NULL) : dt_addmm(ctx, x, w[0], NULL);
    ASSERT(y2);
    seen[0] = -1;
    ASSERT_OK(dt_backward_with(ctx, y2, dt_tensor_from(ctx, DT_F32, 2, SH(R, Out), big)));
    ASSERT_EQ_INT(seen[0], 0);
    ASSERT(dt_k_first_nonfinite(gw[0]->data, DT_BF16, In * Out) < In * Out);
    /* two uses of a lazy leaf: the flush writes their rounded f32 sum, checked; then overflowing */
    for (int big_g = 0; big_g < 2; big_g++) {
        w[1]->flags |= DT_TENSOR_GRAD_LAZY;
        dt_tensor *ya = wt ? dt_linear(ctx, x, w[1], NULL) : dt_addmm(ctx, x, w[1], NULL);
        dt_tensor *yb = wt ? dt_linear(ctx, x, w[1], NULL) : dt_addmm(ctx, x, w[1], NULL);
        dt_tensor *ys = dt_add(ctx, ya, yb);
        ASSERT(ys);
        seen[1] = -1;
        ASSERT_OK(dt_backward_with(ctx, ys, big_g ? dt_tensor_from(ctx, DT_F32, 2, SH(R, Out), big) : R_));
        ASSERT_EQ_INT(seen[1], big_g ? 0 : 1);
        ASSERT(!dt_ag_grad_checked_finite(w[1]));
        ASSERT((dt_k_first_nonfinite(gw[1]->data, DT_BF16, In * Out) < In * Out) == (big_g != 0));
    }
    for (int i = 0; i < 2; i++) {
        dt_tensor_free(w[i]);
        dt_tensor_free(gw[i]);
    }
    dt_ctx_free(ctx);
}

TEST(bf16_weight_grad_written_directly)
{
    direct_wgrad_case(true);
    direct_wgrad_case(false);
}

int main(void)
{
    printf("conversion path %s; bf16 matmul native: %d\n", dt_k_isa_name(dt_k_get_isa()),
           (int)dt_precision_native(DT_BF16));
    RUN(ops_bf16_vs_f32);
    RUN(ops_f16_vs_f32);
    RUN(cast_forward_and_backward);
    RUN(bf16_leaf_grad_accumulates_in_f32);
    RUN(bf16_weight_grad_written_directly);
    RUN(embedding_lp_equals_widened);
    RUN(relu_lp_equals_widened);
    RUN(bias_gelu_lp_equals_widened);
    RUN(add_lp_equals_widened);
    RUN(add_lp2_equals_widened);
    RUN(maxpool_lp_equals_widened);
    RUN(layernorm_lp_equals_widened);
    RUN(autocast_table_and_linear);
    RUN(promotion);
    RUN(convnet_bf16_keep_bn);
    RUN(convnet_f16_all_low);
    RUN(mlp_bf16);
    RUN(gpt_micro_bf16);
    RUN(gpt_autocast_layernorm_writes_bf16);
    RUN(init_range_bf16);
    return TEST_REPORT();
}
