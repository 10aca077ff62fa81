/* The producers of a bf16/f16 GEMM output's gradient write its shadow: the
 * residual add (add_lp2), RoPE, SwiGLU, the GQA pack's k and v, GPT-2's
 * bias + GELU, attention over a bf16/f16 qkv and the cast to f32, whose
 * backwards round the incoming gradient to the dtype anyway, keep the same
 * values in that dtype beside the f32 gradient, and the GEMM's backward
 * takes them (dt_ag_stats.grad_shadows) instead of converting the f32
 * gradient in a pass of its own (grad_rounds). A producer writes one only
 * where a GEMM will read it (dt__grad_shadow_wanted).
 *
 * Each case runs x -> bf16/f16 linear(s) -> op -> loss twice: the op on the
 * low-precision GEMM outputs (A), and the widening composition cast(f32) ->
 * op -> cast back (B, where the casts' backwards write the gradients and
 * their shadows, rounded by dt_k_convert as a GEMM's own pass would; for
 * attention, whose fast rows on the AVX-512
 * paths are not the widened kernel's bits, B puts a view between the GEMM
 * and the op instead: the view's backward hands the same gradient on, which
 * the GEMM converts). The gradients of x and the weights must be equal
 * bit for bit on every conversion path the CPU has (scalar, AVX2, AVX-512,
 * AVX512_BF16), the linears' bias gradients too (A sums the shadow, B the
 * f32 gradient), and the counters say which way each GEMM took its gradient:
 * A no rounding pass (but the pack's q, whose gradient is a copy), B the
 * casts' shadows (attention: a rounding pass per GEMM). Where the GEMM's
 * backward is the gradient's one reader, bias + GELU, the add and attention
 * write the shadow alone (grad_f32_skipped): the f32 values are never
 * written. */
#include "dtrain/dtrain.h"
#include "isa_paths.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

enum { B = 2, T = 5, K = 24, H = 2, HD = 8, C = H * HD, KVC = HD };

typedef enum { P_ADD, P_ROPE, P_SWIGLU, P_PACK, P_GELU, P_ATTN } producer;

static const char *const g_names[] = {"add_lp2", "rope", "swiglu", "gqa_pack", "bias_gelu", "attention"};

typedef struct {
    dt_tensor *x, *w[3], *b[3]; /* f32 leaves; b: the linears' biases */
} leaves;

static void leaves_free(leaves *l)
{
    dt_tensor_free(l->x);
    for (int k = 0; k < 3; k++)
        dt_tensor_free(l->w[k]), dt_tensor_free(l->b[k]);
}

static dt_tensor *leaf(const float *v, int n, const int64_t *shape)
{
    dt_tensor *t = dt_tensor_new(DT_F32, n, shape);
    if (!t)
        return NULL;
    memcpy(t->data, v, (size_t)dt_tensor_numel(t) * 4);
    if (dt_tensor_set_requires_grad(t, true) < 0) {
        dt_tensor_free(t);
        return NULL;
    }
    return t;
}

/* The weights' output widths: [a, b, c] (0: unused). */
static void widths(producer p, int64_t *o)
{
    o[0] = p == P_ATTN ? 3 * C : C;
    o[1] = p == P_ROPE || p == P_GELU || p == P_ATTN ? 0 : p == P_PACK ? KVC : C;
    o[2] = p == P_PACK ? KVC : 0;
}

/* The loss of one way (widen: B); NULL when an op failed. */
static dt_tensor *build(dt_ctx *ctx, dt_dtype dt, producer p, bool widen, leaves *l, const float *inv_freq,
                        const float *R, dt_tensor *bias)
{
    int64_t o[3];
    widths(p, o);
    dt_tensor *xb = dt_cast(ctx, l->x, dt), *g[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3; k++)
        if (o[k]) {
            g[k] = dt_linear(ctx, xb, dt_cast(ctx, l->w[k], dt), l->b[k]);
            if (!g[k] || g[k]->dtype != dt)
                return NULL;
            if (widen)
                g[k] = p == P_ATTN ? dt_reshape(ctx, g[k], 3, SH(B, T, 3 * C)) : dt_cast(ctx, g[k], DT_F32);
        }
    dt_tensor *y = NULL;
    switch (p) {
    case P_ADD: y = dt_add(ctx, g[0], g[1]); break;
    case P_ROPE: y = dt_rope(ctx, g[0], H, inv_freq, 3); break;
    case P_SWIGLU: y = dt_swiglu(ctx, g[0], g[1]); break;
    case P_PACK: y = dt_gqa_pack(ctx, g[0], g[1], g[2], H, 1); break;
    case P_GELU: y = dt_bias_gelu_tanh(ctx, g[0], bias); break;
    case P_ATTN: y = dt_attention(ctx, g[0], H, true, 0.0f, true, (dt_rng_key){0}); break;
    }
    const dt_dtype yt = p == P_GELU ? DT_F32 : dt; /* the op's result dtype on the GEMM output */
    if (y && widen && y->dtype != yt)
        y = dt_cast(ctx, y, yt);
    if (!y || y->dtype != yt)
        return NULL;
    int64_t n = dt_tensor_numel(y);
    dt_tensor *r = dt_tensor_from(ctx, DT_F32, 1, SH(n), R);
    dt_tensor *yf = dt_cast(ctx, y, DT_F32);
    if (!r || !yf)
        return NULL;
    dt_tensor *flat = dt_reshape(ctx, yf, 1, SH(n));
    return dt_sum(ctx, dt_mul(ctx, flat, r));
}

static void shadow_case(dt_dtype dt, producer p)
{
    int64_t o[3];
    widths(p, o);
    static float xv[B * T * K], wv[3][C * K], R[B * T * 3 * C];
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 0, 0), 0, xv, B * T * K, -2.0f, 2.0f);
    for (int k = 0; k < 3; k++)
        dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 1 + (uint64_t)k, 0), 0, wv[k], C * K, -0.5f, 0.5f);
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 9, 0), 0, R, B * T * 3 * C, -1.0f, 1.0f);
    float inv_freq[HD / 2];
    for (int j = 0; j < HD / 2; j++)
        inv_freq[j] = 1.0f / (float)(1 << (2 * j));
    int ran = 0;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        if (dt_k_set_isa(test_isa_paths[pi]) != DT_OK)
            continue;
        ran++;
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        float bv[C];
        for (int j = 0; j < C; j++)
            bv[j] = 0.125f * (float)(j % 5) - 0.25f;
        dt_tensor *bias = dt_tensor_from(ctx, DT_F32, 1, SH(C), bv);
        ASSERT(bias != NULL);
        leaves l[2];
        dt_ag_stats s[2];
        for (int way = 0; way < 2; way++) {
            l[way].x = leaf(xv, 3, SH(B, T, K));
            ASSERT(l[way].x != NULL);
            for (int k = 0; k < 3; k++) {
                l[way].w[k] = o[k] ? leaf(wv[k], 2, SH(o[k], K)) : NULL;
                l[way].b[k] = o[k] ? leaf(R + 7 * k, 1, SH(o[k])) : NULL;
                ASSERT(!o[k] || (l[way].w[k] && l[way].b[k]));
            }
            dt_tensor *loss = build(ctx, dt, p, way == 1, &l[way], inv_freq, R, bias);
            ASSERT(loss != NULL);
            dt_ag_stats_reset(ctx);
            ASSERT_OK(dt_backward(ctx, loss));
            dt_ag_stats_get(ctx, &s[way]);
        }
        int ngemm = (o[0] > 0) + (o[1] > 0) + (o[2] > 0);
        if (memcmp(l[0].x->grad->data, l[1].x->grad->data, (size_t)(B * T * K) * 4))
            TEST_FAIL_("%s %s path %d: x's gradient differs from the widening composition's", g_names[p],
                       dt_dtype_name(dt), (int)test_isa_paths[pi]);
        for (int k = 0; k < 3; k++)
            if (o[k] && memcmp(l[0].w[k]->grad->data, l[1].w[k]->grad->data, (size_t)(o[k] * K) * 4))
                TEST_FAIL_("%s %s path %d: weight %d's gradient differs from the widening composition's",
                           g_names[p], dt_dtype_name(dt), (int)test_isa_paths[pi], k);
        /* the biases' gradients: column sums of the shadow (A) and of the f32 gradient (B) */
        for (int k = 0; k < 3; k++)
            if (o[k] && memcmp(l[0].b[k]->grad->data, l[1].b[k]->grad->data, (size_t)o[k] * 4))
                TEST_FAIL_("%s %s path %d: bias %d's gradient differs from the widening composition's",
                           g_names[p], dt_dtype_name(dt), (int)test_isa_paths[pi], k);
        /* A: every GEMM took its producer's shadow (the pack's q: a copy, converted) */
        const int copies = p == P_PACK ? 1 : 0;
        ASSERT_EQ_INT((int)s[0].grad_rounds, copies);
        ASSERT_EQ_INT((int)s[0].grad_shadows, ngemm - copies);
        /* B: the casts' backwards wrote the gradients and, in the same
         * rounding, their shadows, which every GEMM took; attention's view
         * between: every GEMM converted */
        const int conv = p == P_ATTN ? ngemm : 0;
        ASSERT_EQ_INT((int)s[1].grad_rounds, conv);
        ASSERT_EQ_INT((int)s[1].grad_shadows, ngemm - conv);
        /* A's bias + GELU, add and attention wrote their inputs' gradients in the GEMMs' dtype alone
         * (each GEMM its one reader) */
        ASSERT_EQ_INT((int)s[0].grad_f32_skipped, p == P_GELU || p == P_ATTN ? 1 : p == P_ADD ? 2 : 0);
        ASSERT_EQ_INT((int)s[1].grad_f32_skipped, 0);
        for (int way = 0; way < 2; way++)
            leaves_free(&l[way]);
        dt_ctx_free(ctx);
    }
    ASSERT(ran >= 1);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

TEST(grad_shadow_add_lp2)
{
    shadow_case(DT_BF16, P_ADD);
    shadow_case(DT_F16, P_ADD);
}

TEST(grad_shadow_rope)
{
    shadow_case(DT_BF16, P_ROPE);
    shadow_case(DT_F16, P_ROPE);
}

TEST(grad_shadow_swiglu)
{
    shadow_case(DT_BF16, P_SWIGLU);
    shadow_case(DT_F16, P_SWIGLU);
}

TEST(grad_shadow_gqa_pack)
{
    shadow_case(DT_BF16, P_PACK);
    shadow_case(DT_F16, P_PACK);
}

TEST(grad_shadow_bias_gelu)
{
    shadow_case(DT_BF16, P_GELU);
    shadow_case(DT_F16, P_GELU);
}

TEST(grad_shadow_attention)
{
    shadow_case(DT_BF16, P_ATTN);
    shadow_case(DT_F16, P_ATTN);
}

/* Llama's head: the logits [B, T, V] of a bf16/f16 linear reshaped to
 * [B T, V] for the loss. The view's backward hands the loss's shadow on to
 * the linear's output (one pass writing the input's gradient instead of a
 * zero fill and an add); the gradients equal the widening composition's
 * (reshape, cast to f32, loss) bit for bit on every path. */
static void head_case(dt_dtype dt)
{
    enum { V = 37 };
    static float xv[B * T * K], wv[V * K];
    int64_t yv[B * T];
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 0, 0), 0, xv, B * T * K, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 1, 0), 0, wv, V * K, -0.5f, 0.5f);
    for (int r = 0; r < B * T; r++)
        yv[r] = r % 4 == 1 ? DT_K_IGNORE_INDEX : (r * 7 + 2) % V;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        if (dt_k_set_isa(test_isa_paths[pi]) != DT_OK)
            continue;
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_tensor *x[2], *w[2];
        dt_ag_stats s[2];
        for (int way = 0; way < 2; way++) {
            x[way] = leaf(xv, 3, SH(B, T, K));
            w[way] = leaf(wv, 2, SH(V, K));
            ASSERT(x[way] && w[way]);
            dt_tensor *lg = dt_linear(ctx, dt_cast(ctx, x[way], dt), dt_cast(ctx, w[way], dt), NULL);
            ASSERT(lg && lg->dtype == dt);
            dt_tensor *flat = dt_reshape(ctx, lg, 2, SH(B * T, V));
            dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(B * T), yv);
            dt_tensor *loss = dt_cross_entropy(ctx, way ? dt_cast(ctx, flat, DT_F32) : flat, y);
            ASSERT(loss != NULL);
            dt_ag_stats_reset(ctx);
            ASSERT_OK(dt_backward(ctx, loss));
            dt_ag_stats_get(ctx, &s[way]);
        }
        ASSERT(!memcmp(x[0]->grad->data, x[1]->grad->data, (size_t)(B * T * K) * 4));
        ASSERT(!memcmp(w[0]->grad->data, w[1]->grad->data, (size_t)(V * K) * 4));
        ASSERT_EQ_INT((int)s[0].grad_rounds, 0);
        ASSERT_EQ_INT((int)s[0].grad_shadows, 1);
        ASSERT_EQ_INT((int)s[0].view_grads_shared, 1); /* the logits' gradient: no copy */
        ASSERT_EQ_INT((int)s[1].grad_rounds, 1);
        ASSERT_EQ_INT((int)s[1].grad_shadows, 0);
        for (int way = 0; way < 2; way++) {
            dt_tensor_free(x[way]);
            dt_tensor_free(w[way]);
        }
        dt_ctx_free(ctx);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

TEST(grad_shadow_through_reshape)
{
    head_case(DT_BF16);
    head_case(DT_F16);
}

/* A reshape's backward: the input's first gradient is the view's own
 * buffer (no copy) when that equals 0 + g bit for bit. A -0 in g (here:
 * the cross-entropy's gradient of a negated loss where a probability
 * underflows to 0) takes the copy, which writes +0 there, as before. A
 * later use's contribution adds onto the shared buffer. */
TEST(view_grad_shared_unless_neg0)
{
    enum { VR = 6, VC = 4, VN = VR * VC };
    static float g0[VN]; /* the plain case's gradient */
    static float xv[VN];
    int64_t yv[VR];
    for (int r = 0; r < VR; r++)
        yv[r] = r % 3;
    for (int kind = 0; kind < 3; kind++) { /* plain, -0 in g, a second use */
        for (int i = 0; i < VN; i++)
            xv[i] = kind == 1 && i % VC == 3 ? -200.0f : 0.1f * (float)i;
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_tensor *x = leaf(xv, 3, SH(2, 3, VC));
        ASSERT(x != NULL);
        dt_tensor *h = dt_scale(ctx, x, 1.0f); /* a temporary: its gradient is the context's */
        dt_tensor *h2 = kind == 2 ? dt_sum(ctx, h) : NULL; /* its backward runs after the view's */
        dt_tensor *v = dt_reshape(ctx, h, 2, SH(VR, VC));
        dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, SH(VR), yv);
        dt_tensor *loss = dt_scale(ctx, dt_cross_entropy(ctx, v, y), -1.0f);
        if (kind == 2)
            loss = dt_add(ctx, loss, h2);
        ASSERT(loss != NULL);
        ASSERT_OK(dt_ag_retain_grad(h)); /* read below */
        ASSERT_OK(dt_ag_retain_grad(v));
        dt_ag_stats_reset(ctx);
        ASSERT_OK(dt_backward(ctx, loss));
        dt_ag_stats s;
        dt_ag_stats_get(ctx, &s);
        ASSERT_EQ_INT((int)s.view_grads_shared, (kind == 1 ? 0 : 1));
        ASSERT(h->grad && v->grad);
        ASSERT((h->grad->data == v->grad->data) == (kind != 1));
        int neg0 = 0;
        for (int i = 0; i < VN; i++) {
            const float gv = ((const float *)v->grad->data)[i], gh = ((const float *)h->grad->data)[i];
            const float want = kind == 2 ? g0[i] + 1.0f : 0.0f + gv;
            if (kind == 0)
                g0[i] = gh;
            uint32_t a, b;
            memcpy(&a, &want, 4);
            memcpy(&b, &gh, 4);
            neg0 += kind == 1 && signbit(gv) && gv == 0.0f;
            ASSERT_EQ_INT((long long)a, (long long)b); /* +0 where the view's gradient holds -0 */
        }
        ASSERT(kind != 1 || neg0 == VR); /* the case holds the -0s it is about */
        dt_tensor_free(x);
        dt_ctx_free(ctx);
    }
}

/* A GEMM output with a second use: the producer's shadow is dropped by the
 * second contribution (and the GEMM converts), the gradients unchanged. */
TEST(grad_shadow_dropped_by_second_use)
{
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float xv[B * T * K], wv[C * K];
    dt_rng_fill_uniform(dt_rng_key_make(33, DT_RNG_DATA, 0, 0), 0, xv, B * T * K, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(33, DT_RNG_DATA, 1, 0), 0, wv, C * K, -0.5f, 0.5f);
    dt_tensor *x = leaf(xv, 3, SH(B, T, K)), *w = leaf(wv, 2, SH(C, K));
    ASSERT(x && w);
    dt_tensor *a = dt_linear(ctx, dt_cast(ctx, x, DT_BF16), dt_cast(ctx, w, DT_BF16), NULL);
    ASSERT(a != NULL);
    dt_tensor *y = dt_add(ctx, a, dt_swiglu(ctx, a, a)); /* a: the add's and swiglu's operand */
    ASSERT(y != NULL);
    dt_tensor *loss = dt_sum(ctx, dt_cast(ctx, y, DT_F32));
    dt_ag_stats s;
    dt_ag_stats_reset(ctx);
    ASSERT_OK(dt_backward(ctx, loss));
    dt_ag_stats_get(ctx, &s);
    ASSERT_EQ_INT((int)s.grad_shadows, 0);
    ASSERT_EQ_INT((int)s.grad_rounds, 1);
    /* the GEMM read the summed gradient: x's equals the f32 GEMMs' on it */
    float *gx = malloc((size_t)(B * T * K) * 4);
    ASSERT(gx != NULL);
    memcpy(gx, x->grad->data, (size_t)(B * T * K) * 4);
    ASSERT_OK(dt_backward(ctx, loss)); /* again: accumulates exactly twice */
    for (int i = 0; i < B * T * K; i++)
        ASSERT(((float *)x->grad->data)[i] == 2.0f * gx[i]);
    free(gx);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_ctx_free(ctx);
}

/* bias + GELU writes its input's gradient in the GEMM's dtype alone only
 * where that GEMM's backward is the one reader: not when another node
 * recorded between them takes the same GEMM output (its contribution adds
 * later, in f32), nor when the output's gradient is retained. Either way
 * x's gradient equals, bit for bit, the one of the same graph with the
 * other use recorded after the GELU (its contribution first: no shadow). */
static dt_tensor *gelu_second_use(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias, bool between,
                                  bool retain, dt_tensor **out)
{
    dt_tensor *a = *out = dt_linear(ctx, dt_cast(ctx, x, DT_BF16), dt_cast(ctx, w, DT_BF16), NULL);
    if (!a || (retain && dt_ag_retain_grad(a) < 0))
        return NULL;
    dt_tensor *c = between ? dt_cast(ctx, a, DT_F32) : NULL; /* recorded between the GEMM and the GELU */
    dt_tensor *g = dt_bias_gelu_tanh(ctx, a, bias);
    if (!retain && !between)
        c = dt_cast(ctx, a, DT_F32); /* after it */
    dt_tensor *y = retain ? g : dt_add(ctx, g, c);
    return y ? dt_sum(ctx, y) : NULL;
}

TEST(grad_f32_written_for_other_readers)
{
    enum { N = B * T * C };
    static float xv[B * T * K], wv[C * K], bv[C], ones[N], dref[N];
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 0, 0), 0, xv, B * T * K, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(35, DT_RNG_DATA, 1, 0), 0, wv, C * K, -0.5f, 0.5f);
    for (int i = 0; i < N; i++)
        ones[i] = 1.0f;
    for (int j = 0; j < C; j++)
        bv[j] = 0.125f * (float)(j % 5) - 0.25f;
    float *ref = malloc((size_t)(B * T * K) * 4);
    ASSERT(ref != NULL);
    for (int k = 0; k < 3; k++) { /* 0: the other use after the GELU (reference), 1: between, 2: retained */
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_tensor *x = leaf(xv, 3, SH(B, T, K)), *w = leaf(wv, 2, SH(C, K)), *a = NULL;
        dt_tensor *bias = dt_tensor_from(ctx, DT_F32, 1, SH(C), bv);
        ASSERT(x && w && bias);
        dt_tensor *loss = gelu_second_use(ctx, x, w, bias, k == 1, k == 2, &a);
        ASSERT(loss != NULL);
        dt_ag_stats s;
        dt_ag_stats_reset(ctx);
        ASSERT_OK(dt_backward(ctx, loss));
        dt_ag_stats_get(ctx, &s);
        ASSERT_EQ_INT((int)s.grad_f32_skipped, 0);
        if (k == 0)
            memcpy(ref, x->grad->data, (size_t)(B * T * K) * 4);
        else if (k == 1 && memcmp(ref, x->grad->data, (size_t)(B * T * K) * 4))
            TEST_FAIL_("x's gradient with the GEMM output's other use recorded before the GELU differs");
        if (k == 2) { /* the retained f32 gradient: GELU's slope at a, rounded to bf16 */
            ASSERT_EQ_INT((int)s.grad_shadows, 1);
            ASSERT(a->grad != NULL && a->grad->dtype == DT_F32);
            ASSERT_OK(dt_k_bias_gelu_bwd_lp(DT_BF16, a->data, bv, ones, NULL, false, B * T, C, dref, NULL, NULL,
                                            DT_K_GELU_TANH));
            if (memcmp(dref, a->grad->data, sizeof dref))
                TEST_FAIL_("the retained gradient of the GELU's input is not its slope rounded to bf16");
        }
        dt_tensor_free(x);
        dt_tensor_free(w);
        dt_ctx_free(ctx);
    }
    free(ref);
}

/* The other way round: a bf16/f16 linear writes its input's gradient in
 * its dtype alone where that input is the rounded result of bias + GELU
 * (the GELU's bias of the input's dtype) or of layer norm (a bf16/f16
 * input, f32 gamma and beta), whose backwards would round the f32 values
 * to that dtype first: x -> linear -> op -> linear -> loss (A) against the
 * same with a view between the op and the second linear (B: the view's
 * gradient is not read in the dtype alone, so the f32 values are written
 * and the op rounds them). The gradients of x, the weights and the biases
 * (the op's bias, or gamma, too) equal B's bit for bit on every conversion
 * path, and where the GEMM writes that dtype itself (dt_k_matmul_writes_lp)
 * A skipped the f32 values once more than B (the GELU's input and output,
 * B the input). */
static dt_tensor *op_between(dt_ctx *ctx, dt_dtype dt, bool ln, leaves *l, dt_tensor *gb, bool view, const float *R)
{
    dt_tensor *a = dt_linear(ctx, dt_cast(ctx, l->x, dt), dt_cast(ctx, l->w[0], dt), l->b[0]);
    dt_tensor *g = !a  ? NULL
                   : ln ? dt_layer_norm(ctx, a, gb, NULL, 1e-5f)
                        : dt_bias_gelu_tanh(ctx, a, dt_cast(ctx, gb, dt));
    if (!g || g->dtype != dt)
        return NULL;
    if (view)
        g = dt_reshape(ctx, g, 2, SH(B * T, C));
    dt_tensor *y = g ? dt_linear(ctx, g, dt_cast(ctx, l->w[1], dt), l->b[1]) : NULL;
    if (!y)
        return NULL;
    int64_t n = dt_tensor_numel(y);
    dt_tensor *r = dt_tensor_from(ctx, DT_F32, 1, SH(n), R);
    dt_tensor *yf = dt_cast(ctx, y, DT_F32);
    return r && yf ? dt_sum(ctx, dt_mul(ctx, dt_reshape(ctx, yf, 1, SH(n)), r)) : NULL;
}

static void op_out_case(dt_dtype dt, bool ln)
{
    static float xv[B * T * K], w0[C * K], w1[K * C], bv[C], R[B * T * K];
    dt_rng_fill_uniform(dt_rng_key_make(37, DT_RNG_DATA, 0, 0), 0, xv, B * T * K, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(37, DT_RNG_DATA, 1, 0), 0, w0, C * K, -0.5f, 0.5f);
    dt_rng_fill_uniform(dt_rng_key_make(37, DT_RNG_DATA, 2, 0), 0, w1, K * C, -0.5f, 0.5f);
    dt_rng_fill_uniform(dt_rng_key_make(37, DT_RNG_DATA, 3, 0), 0, R, B * T * K, -1.0f, 1.0f);
    for (int j = 0; j < C; j++)
        bv[j] = 0.125f * (float)(j % 5) - 0.25f;
    int ran = 0;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        if (dt_k_set_isa(test_isa_paths[pi]) != DT_OK)
            continue;
        ran++;
        dt_ctx *ctx = NULL;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        leaves l[2];
        dt_tensor *gb[2];
        dt_ag_stats s[2];
        for (int way = 0; way < 2; way++) {
            l[way] = (leaves){.x = leaf(xv, 3, SH(B, T, K))};
            l[way].w[0] = leaf(w0, 2, SH(C, K));
            l[way].w[1] = leaf(w1, 2, SH(K, C));
            l[way].b[0] = leaf(R + 3, 1, SH(C));
            l[way].b[1] = leaf(R + 5, 1, SH(K));
            gb[way] = leaf(bv, 1, SH(C));
            ASSERT(l[way].x && l[way].w[0] && l[way].w[1] && l[way].b[0] && l[way].b[1] && gb[way]);
            dt_tensor *loss = op_between(ctx, dt, ln, &l[way], gb[way], way == 1, R);
            ASSERT(loss != NULL);
            dt_ag_stats_reset(ctx);
            ASSERT_OK(dt_backward(ctx, loss));
            dt_ag_stats_get(ctx, &s[way]);
        }
        const struct {
            dt_tensor *a, *b;
            const char *name;
        } g[] = {{l[0].x, l[1].x, "x"},       {l[0].w[0], l[1].w[0], "w0"}, {l[0].w[1], l[1].w[1], "w1"},
                 {l[0].b[0], l[1].b[0], "b0"}, {l[0].b[1], l[1].b[1], "b1"},
                 {gb[0], gb[1], ln ? "gamma" : "the GELU's bias"}};
        for (size_t k = 0; k < sizeof g / sizeof g[0]; k++)
            if (memcmp(g[k].a->grad->data, g[k].b->grad->data, (size_t)dt_tensor_numel(g[k].a) * 4))
                TEST_FAIL_("%s %s path %d: %s's gradient differs with the op's output gradient in f32",
                           ln ? "layer norm" : "bias_gelu", dt_dtype_name(dt), (int)test_isa_paths[pi], g[k].name);
        /* the GELU writes its input's gradient in dt alone (the linear its one reader), layer norm in f32;
         * the linear its input's only where its GEMM writes dt itself (else no pass is saved) */
        const int lin = dt_k_matmul_writes_lp(dt);
        ASSERT_EQ_INT((int)s[0].grad_f32_skipped, (ln ? 0 : 1) + lin);
        ASSERT_EQ_INT((int)s[1].grad_f32_skipped, ln ? 0 : 1);
        for (int way = 0; way < 2; way++)
            leaves_free(&l[way]), dt_tensor_free(gb[way]);
        dt_ctx_free(ctx);
    }
    ASSERT(ran >= 1);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

TEST(grad_op_output_lp_alone)
{
    for (int ln = 0; ln < 2; ln++) {
        op_out_case(DT_BF16, ln);
        op_out_case(DT_F16, ln);
    }
}

/* The embedding of a bf16/f16 table takes its output's gradient as its
 * producer wrote it rounded (the shadow) instead of rounding it again row
 * by row: the add of two embeddings (wte[idx] + wpe[pos] in the table's
 * dtype) or, up, the cast of each to f32 (GPT-2 under autocast: the sum in
 * f32, the cast's backward rounding). It adds an index looked
 * up once without rounding its sum: the tables' gradients equal, bit for
 * bit, the widening composition's (cast(f32) -> f32 embedding -> cast back,
 * where the casts' backwards round), on every conversion path, with
 * repeated and single indices and -0 in the gradient. */
static void embedding_case(dt_dtype dt, bool up)
{
    enum { V = 11, P = 5, D = 19, NB = 2, M = NB * P };
    static float wv[V * D], pv[P * D], rv[M * D];
    dt_rng_fill_uniform(dt_rng_key_make(41, DT_RNG_DATA, 0, 0), 0, wv, V * D, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(41, DT_RNG_DATA, 1, 0), 0, pv, P * D, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(41, DT_RNG_DATA, 2, 0), 0, rv, M * D, -1.0f, 1.0f);
    for (int i = 0; i < M * D; i += 7)
        rv[i] = -0.0f;
    const int64_t ids[M] = {3, 1, 3, 7, 0, 9, 1, 3, 5, 10}; /* 3 and 1 repeated, the rest once */
    const int64_t pids[M] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 4};
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        if (dt_k_set_isa(test_isa_paths[pi]) != DT_OK)
            continue;
        float *g[2][2];
        for (int way = 0; way < 2; way++) { /* 0: the lp embeddings, 1: the widening composition */
            dt_ctx *ctx = NULL;
            ASSERT_OK(dt_ctx_init(NULL, &ctx));
            dt_tensor *w = leaf(wv, 2, SH(V, D)), *p = leaf(pv, 2, SH(P, D));
            ASSERT(w && p);
            dt_tensor *idx = dt_tensor_from(ctx, DT_I64, 2, SH(NB, P), ids);
            dt_tensor *pidx = dt_tensor_from(ctx, DT_I64, 2, SH(NB, P), pids);
            dt_tensor *e[2], *tab[2] = {dt_cast(ctx, w, dt), dt_cast(ctx, p, dt)}, *ix[2] = {idx, pidx};
            for (int k = 0; k < 2; k++) {
                e[k] = way == 0 ? dt_embedding(ctx, tab[k], ix[k])
                                : dt_cast(ctx, dt_embedding(ctx, dt_cast(ctx, tab[k], DT_F32), ix[k]), dt);
                if (up)
                    e[k] = dt_cast(ctx, e[k], DT_F32);
            }
            dt_tensor *x = dt_add(ctx, e[0], e[1]);
            ASSERT(x != NULL && x->dtype == (up ? DT_F32 : dt));
            dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(NB, P, D), rv);
            dt_tensor *loss = dt_sum(ctx, dt_mul(ctx, up ? x : dt_cast(ctx, x, DT_F32), R));
            ASSERT(loss != NULL);
            dt_ag_stats s;
            dt_ag_stats_reset(ctx);
            ASSERT_OK(dt_backward(ctx, loss));
            dt_ag_stats_get(ctx, &s);
            ASSERT_EQ_INT((int)s.grad_shadows, (way == 0 ? 2 : 0)); /* both embeddings took the add's */
            ASSERT_EQ_INT((int)s.grad_rounds, 0);
            for (int k = 0; k < 2; k++) {
                dt_tensor *l = k ? p : w;
                size_t nb = (size_t)dt_tensor_numel(l) * 4;
                g[way][k] = malloc(nb);
                ASSERT(g[way][k] && l->grad);
                memcpy(g[way][k], l->grad->data, nb);
            }
            dt_tensor_free(w);
            dt_tensor_free(p);
            dt_ctx_free(ctx);
        }
        ASSERT(!memcmp(g[0][0], g[1][0], (size_t)V * D * 4));
        ASSERT(!memcmp(g[0][1], g[1][1], (size_t)P * D * 4));
        int neg0 = 0;
        for (int i = 0; i < V * D; i++)
            neg0 += g[0][0][i] == 0.0f && signbit(g[0][0][i]);
        ASSERT_EQ_INT(neg0, 0); /* 0 + -0: the rows never looked up and the -0s are +0 */
        for (int way = 0; way < 2; way++)
            for (int k = 0; k < 2; k++)
                free(g[way][k]);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

TEST(grad_shadow_embedding)
{
    for (int up = 0; up < 2; up++) {
        embedding_case(DT_BF16, up);
        embedding_case(DT_F16, up);
    }
}

int main(void)
{
    RUN(grad_shadow_add_lp2);
    RUN(grad_shadow_rope);
    RUN(grad_shadow_swiglu);
    RUN(grad_shadow_gqa_pack);
    RUN(grad_shadow_bias_gelu);
    RUN(grad_shadow_attention);
    RUN(grad_shadow_through_reshape);
    RUN(view_grad_shared_unless_neg0);
    RUN(grad_shadow_dropped_by_second_use);
    RUN(grad_f32_written_for_other_readers);
    RUN(grad_op_output_lp_alone);
    RUN(grad_shadow_embedding);
    return TEST_REPORT();
}
