/* The low-precision backward without its conversion passes: cross-entropy
 * on bf16/f16 logits reads them as they are (no cast node, no f32 copy) and
 * its backward writes the logits' gradient rounded to their dtype together
 * with the same values in that dtype (the gradient's shadow), which the LM
 * head's bf16/f16 GEMMs take instead of converting the f32 gradient again.
 *
 * Each case compares against the widening composition
 * dt_cross_entropy(dt_cast(logits, f32)) that dtrain ran before: the loss
 * and every gradient must be equal bit for bit (the same roundings in the
 * same order), on every conversion path (scalar, AVX2, AVX-512,
 * AVX512_BF16 where the CPU has them), at row counts below and above the
 * loss kernel's 16-row blocks of 1024 (its double partial sums: a grouping
 * that differs would still round to the same float but for rare ties), with
 * ignored rows. The tape length and dt_ag_stats show the passes that went:
 * one node instead of two, the GEMM's rounding pass replaced by the shadow.
 * When the logits have a second use, the shadow must not survive it. */
#include "dtrain/dtrain.h"
#include "isa_paths.h"
#include "test.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})

typedef struct {
    dt_tensor *x, *w;   /* f32 leaves with f32 gradients */
    dt_tensor *logits;  /* dt_linear(cast(x), cast(w)) in the low dtype */
} head;

static void make_head(head *hp, dt_ctx *ctx, dt_dtype dt, int64_t N, int64_t K, int64_t C, const float *xv,
                      const float *wv)
{
    head h = {0};
    *hp = h;
    h.x = dt_tensor_new(DT_F32, 2, SH(N, K));
    h.w = dt_tensor_new(DT_F32, 2, SH(C, K));
    ASSERT(h.x && h.w);
    memcpy(h.x->data, xv, (size_t)(N * K) * 4);
    memcpy(h.w->data, wv, (size_t)(C * K) * 4);
    ASSERT_OK(dt_tensor_set_requires_grad(h.x, true));
    ASSERT_OK(dt_tensor_set_requires_grad(h.w, true));
    h.logits = dt_linear(ctx, dt_cast(ctx, h.x, dt), dt_cast(ctx, h.w, dt), NULL);
    *hp = h;
    ASSERT(h.logits && h.logits->dtype == dt);
    ASSERT_OK(dt_ag_retain_grad(h.logits)); /* expect_same_grads reads it */
}

static void free_head(head *h)
{
    dt_tensor_free(h->x);
    dt_tensor_free(h->w);
}

static void expect_same_grads(const head *a, const head *b, const char *what)
{
    ASSERT(a->x->grad && b->x->grad && a->w->grad && b->w->grad);
    int64_t nx = dt_tensor_numel(a->x), nw = dt_tensor_numel(a->w);
    if (memcmp(a->x->grad->data, b->x->grad->data, (size_t)nx * 4) ||
        memcmp(a->w->grad->data, b->w->grad->data, (size_t)nw * 4))
        TEST_FAIL_("%s: the gradients differ from the widening composition's", what);
    ASSERT(a->logits->grad && b->logits->grad); /* the logits' own f32 gradient: rounded as the cast's backward rounds */
    if (memcmp(a->logits->grad->data, b->logits->grad->data, (size_t)dt_tensor_numel(a->logits) * 4))
        TEST_FAIL_("%s: the logits' gradient differs from the widening composition's", what);
    const float *g = a->w->grad->data;
    int nz = 0;
    for (int64_t i = 0; i < nw; i++)
        nz += g[i] != 0.0f;
    ASSERT(nz > nw / 2); /* not trivially equal */
}

static void fill_case(int64_t N, int64_t K, int64_t C, float *xv, float *wv, int64_t *yv, uint64_t seed)
{
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_DATA, 0, 0), 0, xv, N * K, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(seed, DT_RNG_DATA, 1, 0), 0, wv, C * K, -2.0f, 2.0f);
    for (int64_t r = 0; r < N; r++)
        yv[r] = r % 7 == 3 ? DT_K_IGNORE_INDEX : (r * 5 + 3) % C;
}

/* The fused loss against the widening composition, one dtype, one shape. */
static void ce_case(dt_dtype dt, int64_t N, int64_t K, int64_t C)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float *xv = malloc((size_t)(N * K) * 4), *wv = malloc((size_t)(C * K) * 4);
    int64_t *yv = malloc((size_t)N * 8);
    ASSERT(xv && wv && yv);
    fill_case(N, K, C, xv, wv, yv, 41 + (uint64_t)N);
    for (size_t p = 0; p < TEST_NISA; p++) {
        if (dt_k_set_isa(test_isa_paths[p]) != DT_OK)
            continue;
        dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(N), yv);
        head a, b;
        make_head(&a, ctx, dt, N, K, C, xv, wv);
        make_head(&b, ctx, dt, N, K, C, xv, wv);
        size_t t0 = dt_ag_tape_len(ctx);
        dt_tensor *la = dt_cross_entropy(ctx, a.logits, y);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1); /* no cast node */
        t0 = dt_ag_tape_len(ctx);
        dt_tensor *lb = dt_cross_entropy(ctx, dt_cast(ctx, b.logits, DT_F32), y);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 2);
        ASSERT(la && lb && la->dtype == DT_F32);
        ASSERT(!memcmp(la->data, lb->data, 4));
        ASSERT(((float *)la->data)[0] > 0.0f);
        dt_ag_stats s;
        dt_ag_stats_reset(ctx);
        ASSERT_OK(dt_backward(ctx, la));
        dt_ag_stats_get(ctx, &s);
        ASSERT_EQ_INT((int)s.grad_shadows, 1); /* the head's GEMMs took the loss's bf16 gradient */
        ASSERT_EQ_INT((int)s.grad_rounds, 0);
        ASSERT_OK(dt_backward(ctx, lb));
        dt_ag_stats_get(ctx, &s);
        ASSERT_EQ_INT((int)s.grad_shadows, 2); /* the composition's cast rounded into a shadow too */
        ASSERT_EQ_INT((int)s.grad_rounds, 0);
        ASSERT_EQ_INT((int)s.grad_round_elems, 0);
        expect_same_grads(&a, &b, dt_dtype_name(dt));
        free_head(&a);
        free_head(&b);
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(xv);
    free(wv);
    free(yv);
    dt_ctx_free(ctx);
}

TEST(ce_lp_equals_widened)
{
    ce_case(DT_BF16, 6, 8, 10);
    ce_case(DT_F16, 6, 8, 10);
    ce_case(DT_BF16, 16 * 1024 + 37, 8, 5); /* 17-row blocks: past the kernel's 16 */
    ce_case(DT_F16, 3000, 4, 5);
    ce_case(DT_BF16, 33, 16, 3001); /* rows longer than the kernel's column chunks */
}

/* The logits have a second use, whose backward runs after (second) or
 * before (first) the loss's: the gradient the GEMMs see is the sum, never
 * the loss's shadow alone. */
static void second_use_case(dt_dtype dt, bool ce_first)
{
    enum { N = 40, K = 12, C = 9 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[N * K], wv[C * K];
    int64_t yv[N];
    fill_case(N, K, C, xv, wv, yv, 77);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(N), yv);
    head h[2];
    dt_tensor *loss[2];
    for (int k = 0; k < 2; k++) {
        make_head(&h[k], ctx, dt, N, K, C, xv, wv);
        dt_tensor *ce = NULL, *other = NULL;
        /* k = 0: the fused loss; k = 1: the widening composition */
        if (ce_first)
            ce = dt_cross_entropy(ctx, k ? dt_cast(ctx, h[k].logits, DT_F32) : h[k].logits, y);
        other = dt_scale(ctx, dt_sum(ctx, dt_cast(ctx, h[k].logits, DT_F32)), 0.37f);
        if (!ce_first)
            ce = dt_cross_entropy(ctx, k ? dt_cast(ctx, h[k].logits, DT_F32) : h[k].logits, y);
        loss[k] = dt_add(ctx, ce, other);
        ASSERT(loss[k]);
    }
    ASSERT(!memcmp(loss[0]->data, loss[1]->data, 4));
    dt_ag_stats s;
    dt_ag_stats_reset(ctx);
    ASSERT_OK(dt_backward(ctx, loss[0]));
    dt_ag_stats_get(ctx, &s);
    ASSERT_EQ_INT((int)s.grad_shadows, 0);
    ASSERT_EQ_INT((int)s.grad_rounds, 1);
    ASSERT_OK(dt_backward(ctx, loss[1]));
    expect_same_grads(&h[0], &h[1], ce_first ? "loss recorded first" : "loss recorded second");
    /* a second backward over the same tape: the shadow of the first is gone */
    ASSERT_OK(dt_backward(ctx, loss[0]));
    ASSERT_OK(dt_backward(ctx, loss[1]));
    expect_same_grads(&h[0], &h[1], "second backward");
    free_head(&h[0]);
    free_head(&h[1]);
    dt_ctx_free(ctx);
}

TEST(ce_lp_shadow_dropped_by_second_use)
{
    second_use_case(DT_BF16, true);
    second_use_case(DT_BF16, false);
    second_use_case(DT_F16, true);
}

/* Backward twice over one tape with the fused loss alone: each pass uses
 * its own shadow, and the accumulated gradients are twice the first's. */
TEST(ce_lp_backward_twice)
{
    enum { N = 24, K = 8, C = 11 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xv[N * K], wv[C * K];
    int64_t yv[N];
    fill_case(N, K, C, xv, wv, yv, 5);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(N), yv);
    head h;
    make_head(&h, ctx, DT_BF16, N, K, C, xv, wv);
    dt_tensor *l = dt_cross_entropy(ctx, h.logits, y);
    ASSERT_OK(dt_backward(ctx, l));
    float g1[C * K];
    memcpy(g1, h.w->grad->data, sizeof g1);
    ASSERT_OK(dt_backward(ctx, l));
    const float *g2 = h.w->grad->data;
    for (int i = 0; i < C * K; i++)
        ASSERT(g2[i] == 2.0f * g1[i]);
    dt_ag_stats s;
    dt_ag_stats_get(ctx, &s);
    ASSERT_EQ_INT((int)s.grad_shadows, 2);
    ASSERT_EQ_INT((int)s.grad_rounds, 0);
    free_head(&h);
    dt_ctx_free(ctx);
}

/* The fused LM head (dt_linear_cross_entropy) in bf16 with one chunk: the
 * same GEMM call as dt_linear's forward and the same row-wise loss and
 * rounding as dt_cross_entropy on bf16 logits, so loss and gradients equal
 * the unfused composition's bit for bit, on every conversion path; where
 * oneDNN writes bf16 itself the op keeps no f32 [N, V] buffer (its arena
 * use stays under N*V*3 bytes, where the f32 logits took N*V*4 before). */
TEST(lmhead_lp_equals_unfused)
{
    enum { N = 48, K = 16, V = 3001 };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float xv[N * K], wv[V * K];
    int64_t yv[N];
    fill_case(N, K, V, xv, wv, yv, 9);
    for (int i = 0; i < V * K; i++)
        wv[i] *= 0.25f;
    for (size_t p = 0; p < TEST_NISA; p++) {
        if (dt_k_set_isa(test_isa_paths[p]) != DT_OK)
            continue;
        dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(N), yv);
        head a, b;
        make_head(&a, ctx, DT_BF16, N, K, V, xv, wv); /* b's logits: the unfused head */
        make_head(&b, ctx, DT_BF16, N, K, V, xv, wv);
        dt_tensor *xa = dt_cast(ctx, a.x, DT_BF16), *wa = dt_cast(ctx, a.w, DT_BF16);
        size_t used = dt_arena_used(dt_ctx_arena(ctx));
        dt_tensor *la = dt_linear_cross_entropy(ctx, xa, wa, y, 0);
        size_t op_bytes = dt_arena_used(dt_ctx_arena(ctx)) - used;
        dt_tensor *lb = dt_cross_entropy(ctx, b.logits, y);
        ASSERT(la && lb);
        ASSERT(!memcmp(la->data, lb->data, 4));
        if (dt_k_matmul_writes_lp(DT_BF16) && !(op_bytes < (size_t)N * V * 3))
            TEST_FAIL_("the fused head took %zu arena bytes for %d x %d logits", op_bytes, N, V);
        ASSERT_OK(dt_backward(ctx, la));
        ASSERT_OK(dt_backward(ctx, lb));
        if (memcmp(a.x->grad->data, b.x->grad->data, sizeof xv) || memcmp(a.w->grad->data, b.w->grad->data, sizeof wv))
            TEST_FAIL_("isa %s: the fused head's gradients differ from the unfused one's",
                       dt_k_isa_name(test_isa_paths[p]));
        free_head(&a);
        free_head(&b);
        dt_ctx_reset(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    dt_ctx_free(ctx);
}

int main(void)
{
    printf("conversion path %s; bf16 matmul native: %d\n", dt_k_isa_name(dt_k_get_isa()),
           (int)dt_precision_native(DT_BF16));
    RUN(ce_lp_equals_widened);
    RUN(ce_lp_shadow_dropped_by_second_use);
    RUN(ce_lp_backward_twice);
    RUN(lmhead_lp_equals_unfused);
    return TEST_REPORT();
}
