/* The Llama-family ops: RMSNorm, rotary embeddings (rotate-half layout),
 * SwiGLU, the grouped-query packing, sliding-window attention and Gemma
 * 2's soft caps (the attention's scores and the logits). Finite-difference gradients of
 * each (test_gradcheck's tolerances), forward values against plain
 * double-precision references written from transformers' formulas, the
 * rope scalings' inverse frequencies against the same formulas
 * (modeling_rope_utils: linear, llama3) in double, and bad inputs. */
#include "dtrain/kernels.h"
#include "gradcheck.h"

#include "dtrain/models.h"

#define SH(...) ((const int64_t[]){__VA_ARGS__})
#define NARG(...) (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define T(seed, ...) gc_tensor(NARG(__VA_ARGS__), SH(__VA_ARGS__), seed, true)

static void free_all(int n, dt_tensor **t)
{
    for (int i = 0; i < n; i++)
        dt_tensor_free(t[i]);
}

#define GRADCHECK_OP(name, nin, in, fn, ud, h)                                          \
    do {                                                                                \
        int bad_ = gradcheck(name, nin, in, fn, ud, h, 2e-3, 2e-2);                     \
        free_all(nin, in);                                                              \
        ASSERT_EQ_INT(bad_, 0);                                                         \
    } while (0)

static dt_tensor *f_rms(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_rms_norm(c, in[0], in[1], 1e-5f);
}

TEST(rms_norm_grad)
{
    dt_tensor *in[2] = {T(1, 2, 3, 10), T(2, 10)};
    GRADCHECK_OP("rms_norm", 2, in, f_rms, NULL, 1e-2);
}

static const float g_inv[4] = {1.0f, 0.3f, 0.05f, 0.001f};

static dt_tensor *f_rope(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_rope(c, in[0], 2, g_inv, 3);
}

TEST(rope_grad)
{
    dt_tensor *in[1] = {T(3, 2, 5, 16)};
    GRADCHECK_OP("rope", 1, in, f_rope, NULL, 1e-2);
}

/* the first 6 of each head's 8 values rotate (3 frequencies), cos and sin
 * scaled by 1.3 */
static dt_tensor *f_rope_partial(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_rope_partial(c, in[0], 2, 6, g_inv, 1.3f, 2, NULL);
}

TEST(rope_partial_grad)
{
    dt_tensor *in[1] = {T(3, 2, 5, 16)};
    GRADCHECK_OP("rope_partial", 1, in, f_rope_partial, NULL, 1e-2);
}

static dt_tensor *f_swiglu(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_swiglu(c, in[0], in[1]);
}

TEST(swiglu_grad)
{
    dt_tensor *in[2] = {T(4, 3, 7), T(5, 3, 7)};
    GRADCHECK_OP("swiglu", 2, in, f_swiglu, NULL, 1e-2);
}

static dt_tensor *f_pack(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u; /* 4 query heads over 2 kv heads, hd 3 */
    return dt_gqa_pack(c, in[0], in[1], in[2], 4, 2);
}

TEST(gqa_pack_grad)
{
    dt_tensor *in[3] = {T(6, 2, 3, 12), T(7, 2, 3, 6), T(8, 2, 3, 6)};
    GRADCHECK_OP("gqa_pack", 3, in, f_pack, NULL, 1e-2);
}

/* attention over a GQA pack, the whole path of a Llama attention */
static dt_tensor *f_gqa_attn(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    dt_tensor *q = dt_rope(c, in[0], 4, g_inv, 0), *k = dt_rope(c, in[1], 2, g_inv, 0);
    return dt_attention(c, dt_gqa_pack(c, q, k, in[2], 4, 2), 4, true, 0, false, (dt_rng_key){0});
}

TEST(gqa_attention_grad)
{
    dt_tensor *in[3] = {T(9, 1, 5, 32), T(10, 1, 5, 16), T(11, 1, 5, 16)};
    GRADCHECK_OP("gqa attention", 3, in, f_gqa_attn, NULL, 1e-2);
}

/* forward values against double references */
TEST(forward_reference)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = gc_tensor(3, SH(2, 3, 8), 21, false), *w = gc_tensor(1, SH(8), 22, false);
    dt_tensor *u = gc_tensor(3, SH(2, 3, 8), 23, false);
    const float *xd = x->data, *wd = w->data, *ud = u->data;
    /* RMSNorm */
    dt_tensor *y = dt_rms_norm(ctx, x, w, 1e-6f);
    ASSERT(y != NULL);
    for (int r = 0; r < 6; r++) {
        double s = 0;
        for (int j = 0; j < 8; j++)
            s += (double)xd[r * 8 + j] * xd[r * 8 + j];
        double rs = 1.0 / sqrt(s / 8 + 1e-6);
        for (int j = 0; j < 8; j++)
            ASSERT_NEAR(dt_tensor_get(y, r * 8 + j), wd[j] * xd[r * 8 + j] * rs, 1e-6, 1e-5);
    }
    /* RoPE: 2 heads of 4, positions 5.., pairs (j, j + 2) */
    const float inv[2] = {0.7f, 0.01f};
    y = dt_rope(ctx, x, 2, inv, 5);
    ASSERT(y != NULL);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 2; j++) {
                    int o = (b * 3 + t) * 8 + h * 4;
                    double a = (double)(float)((float)(5 + t) * inv[j]);
                    double x1 = xd[o + j], x2 = xd[o + j + 2];
                    ASSERT_NEAR(dt_tensor_get(y, o + j), x1 * cos(a) - x2 * sin(a), 1e-6, 1e-5);
                    ASSERT_NEAR(dt_tensor_get(y, o + j + 2), x2 * cos(a) + x1 * sin(a), 1e-6, 1e-5);
                }
    /* partial RoPE: 2 heads of 4, the first 2 of each rotate (pair (0, 1),
     * one frequency), the last 2 pass; cos and sin times 1.25 */
    const int64_t at[3] = {9, 0, 4};
    y = dt_rope_partial(ctx, x, 2, 2, inv, 1.25f, 0, at);
    ASSERT(y != NULL);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 3; t++)
            for (int h = 0; h < 2; h++) {
                int o = (b * 3 + t) * 8 + h * 4;
                double a = (double)(float)((float)at[t] * inv[0]), c = 1.25 * cos(a), sn = 1.25 * sin(a);
                double x1 = xd[o], x2 = xd[o + 1];
                ASSERT_NEAR(dt_tensor_get(y, o), x1 * c - x2 * sn, 1e-6, 1e-5);
                ASSERT_NEAR(dt_tensor_get(y, o + 1), x2 * c + x1 * sn, 1e-6, 1e-5);
                ASSERT_NEAR(dt_tensor_get(y, o + 2), xd[o + 2], 0, 0);
                ASSERT_NEAR(dt_tensor_get(y, o + 3), xd[o + 3], 0, 0);
            }
    /* SwiGLU */
    y = dt_swiglu(ctx, x, u);
    ASSERT(y != NULL);
    for (int i = 0; i < 48; i++)
        ASSERT_NEAR(dt_tensor_get(y, i), xd[i] / (1 + exp(-(double)xd[i])) * ud[i], 1e-6, 1e-5);
    /* GQA: q 2 heads of 2, kv 1 head: both query heads read kv head 0 */
    dt_tensor *q4 = dt_reshape(ctx, x, 3, SH(2, 6, 4)), *k2 = dt_narrow(ctx, dt_reshape(ctx, u, 3, SH(2, 6, 4)), 2, 0, 2);
    y = dt_gqa_pack(ctx, q4, dt_contiguous(ctx, k2), dt_contiguous(ctx, k2), 2, 1);
    ASSERT(y != NULL);
    ASSERT_EQ_INT((int)y->shape[2], 12);
    for (int r = 0; r < 12; r++)
        for (int j = 0; j < 2; j++) {
            double kv = ud[r * 4 + j];
            ASSERT_NEAR(dt_tensor_get(y, r * 12 + 4 + j), kv, 0, 0);
            ASSERT_NEAR(dt_tensor_get(y, r * 12 + 6 + j), kv, 0, 0);
            ASSERT_NEAR(dt_tensor_get(y, r * 12 + 8 + j), kv, 0, 0);
            ASSERT_NEAR(dt_tensor_get(y, r * 12 + 10 + j), kv, 0, 0);
        }
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_tensor_free(u);
    dt_ctx_free(ctx);
}

/* Low precision: bf16 inputs give bf16 results equal to the f32 op rounded
 * once (computed in f32 inside). */
TEST(bf16_inputs)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = gc_tensor(3, SH(1, 4, 8), 31, false);
    dt_tensor *xb = dt_cast(ctx, x, DT_BF16), *xr = dt_cast(ctx, xb, DT_F32);
    dt_tensor *y = dt_rms_norm(ctx, xb, NULL, 1e-5f), *yr = dt_rms_norm(ctx, xr, NULL, 1e-5f);
    ASSERT(y && yr);
    ASSERT_EQ_INT(y->dtype, DT_BF16);
    for (int i = 0; i < 32; i++)
        ASSERT_NEAR(dt_tensor_get(y, i), dt_tensor_get(yr, i), 0, 8e-3);
    dt_tensor_free(x);
    dt_ctx_free(ctx);
}

/* ---- sliding windows and soft caps (Mistral's, Gemma 2's) ---- */

/* causal attention over q | k | v of 3 heads of 4: ud = {window, cap}; the
 * cap 0.6 well away from linear (the scores here reach a few units) */
static dt_tensor *f_window_attn(dt_ctx *c, dt_tensor **in, void *u)
{
    const float *wc = u;
    return dt_attention_window(c, in[0], 3, (int64_t)wc[0], wc[1]);
}

static dt_tensor *f_softcap(dt_ctx *c, dt_tensor **in, void *u)
{
    (void)u;
    return dt_softcap(c, in[0], 1.5f);
}

/* The ISA paths the CPU has (dt_k_set_isa): the window kernel's rows run 1, 8 or 16 lanes wide; a bf16 qkv
   without a cap runs the avx512_bf16 path's own products (vdpbf16ps rows, or tiles from 96 tokens on a CPU
   without AMX, 64 with it) */
static const dt_k_isa g_isas[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};

/* Sliding windows with and without a cap (0.3, 0.6, 1, 50), all on the blocked kernel: windows 1 and 2 (a row's
   keys and a key's rows split by the edge), 9; T 100 with window 9, so that the rows from 72 on skip the first key
   block and the key block from 64 is seen from row 64 on, without a cap and with one */
TEST(window_softcap_grads)
{
    static float cases[9][2] = {{0, 0.6f}, {9, 0.6f}, {9, 0}, {1, 0}, {2, 0}, {9, 0}, {0, 0.3f}, {2, 50.0f}, {9, 1.0f}};
    for (int pi = 0; pi < 4; pi++) {
        if (dt_k_set_isa(g_isas[pi]) != DT_OK)
            continue;
        for (int k = 0; k < 9; k++) { /* rows of up to 10 keys, or T 100 */
            dt_tensor *in[1] = {k == 5 || k == 8 ? T(41 + k, 1, 100, 36) : T(41 + k, 1, 10, 36)};
            char name[96];
            snprintf(name, sizeof name, "attention, window %g, cap %g (%s)", (double)cases[k][0],
                     (double)cases[k][1], dt_k_isa_name(g_isas[pi]));
            GRADCHECK_OP(name, 1, in, f_window_attn, cases[k], 1e-2);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    dt_tensor *in[1] = {T(45, 3, 7)};
    GRADCHECK_OP("softcap", 1, in, f_softcap, NULL, 1e-2);
}

/* Forward values against a double reference of transformers' eager
 * attention (scores / cap, tanh, times cap, then the sliding-window causal
 * mask and the softmax), and of the elementwise cap; a window of T or more
 * without a cap is dt_attention (its kernel: the same bits), a window
 * shorter than T is not; a cap far above the scores gives dt_attention's
 * result; bf16 inputs give the f32 result rounded; bad windows and caps
 * are refused. */
TEST(window_softcap_forward_reference)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    enum { B = 2, TT = 21, H = 2, D = 8, C = H * D }; /* rows of up to 21 keys: 8- and 16-lane steps and tails */
    dt_tensor *qkv = gc_tensor(3, SH(B, TT, 3 * C), 44, false);
    const float *x = qkv->data;
    const double scale = 1 / sqrt((double)D);
    const struct {
        int64_t window;
        double cap;
    } cases[4] = {{0, 0.8}, {11, 0.8}, {11, 0}, {1, 0}};
    for (int kk = 0; kk < 16; kk++) { /* each case on each ISA path the CPU has */
        const int k = kk % 4;
        if (dt_k_set_isa(g_isas[kk / 4]) != DT_OK)
            continue;
        const double cap = cases[k].cap;
        const int64_t w = cases[k].window;
        dt_tensor *y = dt_attention_window(ctx, qkv, H, w, (float)cap);
        ASSERT(y && y->dtype == DT_F32);
        double worst = 0;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < TT; i++) {
                    double sc[TT], mx = -INFINITY, sum = 0;
                    const int j0 = w > 0 && i + 1 > w ? i + 1 - (int)w : 0;
                    for (int j = j0; j <= i; j++) {
                        double d = 0;
                        for (int e = 0; e < D; e++)
                            d += (double)x[(b * TT + i) * 3 * C + h * D + e] * x[(b * TT + j) * 3 * C + C + h * D + e];
                        sc[j] = cap > 0 ? cap * tanh(d * scale / cap) : d * scale;
                        mx = fmax(mx, sc[j]);
                    }
                    for (int j = j0; j <= i; j++)
                        sum += exp(sc[j] - mx);
                    for (int e = 0; e < D; e++) {
                        double o = 0;
                        for (int j = j0; j <= i; j++)
                            o += exp(sc[j] - mx) / sum * x[(b * TT + j) * 3 * C + 2 * C + h * D + e];
                        worst = fmax(worst, fabs(dt_tensor_get(y, (b * TT + i) * C + h * D + e) - o));
                    }
                }
        fprintf(stderr, "  attention, window %lld, cap %g (%s): within %.3g of the double reference\n", (long long)w,
                cap, dt_k_isa_name(g_isas[kk / 4]), worst);
        ASSERT(worst <= 2e-6);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    /* a window of T or more without a cap: dt_attention's kernel; a shorter one differs */
    dt_tensor *r = dt_attention(ctx, qkv, H, true, 0.0f, false, (dt_rng_key){0});
    dt_tensor *full = dt_attention_window(ctx, qkv, H, TT, 0.0f), *none = dt_attention_window(ctx, qkv, H, 0, 0.0f);
    dt_tensor *shorter = dt_attention_window(ctx, qkv, H, TT - 1, 0.0f);
    ASSERT(r && full && none && shorter);
    double dshort = 0;
    for (int i = 0; i < B * TT * C; i++) {
        ASSERT(dt_tensor_get(full, i) == dt_tensor_get(r, i) && dt_tensor_get(none, i) == dt_tensor_get(r, i));
        dshort = fmax(dshort, fabs(dt_tensor_get(shorter, i) - dt_tensor_get(r, i)));
    }
    ASSERT(dshort > 1e-3);
    /* a cap of 1e4: tanh is the identity to f32's precision at these scores */
    dt_tensor *a = dt_attention_window(ctx, qkv, H, 0, 1e4f);
    ASSERT(a);
    for (int i = 0; i < B * TT * C; i++)
        ASSERT_NEAR(dt_tensor_get(a, i), dt_tensor_get(r, i), 2e-6, 1e-5);
    /* bf16, read as it is by the blocked kernel: on the scalar and avx2 paths the f32 op on the widened input,
       rounded once, bit for bit; on the avx512 ones within 2^-7 of the largest |value| (kernels.h's bound in the
       tests) and a rounding */
    dt_tensor *qb = dt_cast(ctx, qkv, DT_BF16);
    for (int pi = 0; pi < 4; pi++) {
        if (dt_k_set_isa(g_isas[pi]) != DT_OK)
            continue;
        dt_tensor *yb = dt_attention_window(ctx, qb, H, 11, 0.8f);
        dt_tensor *yr = dt_cast(ctx, dt_attention_window(ctx, dt_cast(ctx, qb, DT_F32), H, 11, 0.8f), DT_BF16);
        ASSERT(yb && yr && yb->dtype == DT_BF16);
        double big = 0;
        for (int i = 0; i < B * TT * C; i++)
            big = fmax(big, fabs(dt_tensor_get(yr, i)));
        for (int i = 0; i < B * TT * C; i++)
            if (g_isas[pi] <= DT_K_ISA_AVX2)
                ASSERT(dt_tensor_get(yb, i) == dt_tensor_get(yr, i));
            else
                ASSERT_NEAR(dt_tensor_get(yb, i), dt_tensor_get(yr, i), (0x1p-7 + 0x1p-8) * big, 0);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    /* the elementwise cap */
    dt_tensor *v = dt_softcap(ctx, qkv, 1.5f);
    ASSERT(v);
    for (int i = 0; i < B * TT * 3 * C; i++)
        ASSERT_NEAR(dt_tensor_get(v, i), 1.5 * tanh(x[i] / 1.5), 1e-6, 1e-6);
    /* windows below 0, caps that are negative or not finite */
    ASSERT(!dt_attention_window(ctx, qkv, H, -1, 0.0f));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    const float bad[3] = {0.0f, -1.0f, INFINITY};
    for (int k = 0; k < 3; k++) {
        if (k) {
            ASSERT(!dt_attention_window(ctx, qkv, H, 0, bad[k]));
            ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
            ASSERT_STR_CONTAINS(dt_last_error(), "soft cap");
        }
        ASSERT(!dt_softcap(ctx, qkv, bad[k]));
        ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    }
    /* dt_attention_ex: in eval its dropout is none (dt_attention_window's bits); in training the mask acts; a
       window or a cap without the causal mask, heads outside the layer, no description: refused */
    dt_attention_spec sp = {.n_head = H, .causal = true, .window = 5, .softcap = 0.8f, .dropout_p = 0.3f,
                            .key = dt_rng_key_make(9, DT_RNG_DROPOUT, 1, 0)};
    dt_tensor *ye = dt_attention_ex(ctx, qkv, &sp), *yw = dt_attention_window(ctx, qkv, H, 5, 0.8f);
    ASSERT(ye && yw);
    ASSERT_EQ_INT(memcmp(ye->data, yw->data, (size_t)dt_tensor_numel(yw) * sizeof(float)), 0);
    sp.training = true;
    dt_tensor *yd = dt_attention_ex(ctx, qkv, &sp);
    ASSERT(yd);
    ASSERT(memcmp(yd->data, yw->data, (size_t)dt_tensor_numel(yw) * sizeof(float)) != 0);
    sp.causal = false;
    ASSERT(!dt_attention_ex(ctx, qkv, &sp));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "causal");
    sp.causal = true, sp.head0 = 1;
    ASSERT(!dt_attention_ex(ctx, qkv, &sp)); /* heads [1, H + 1) of H */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT(!dt_attention_ex(ctx, qkv, NULL));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    dt_tensor_free(qkv);
    dt_ctx_free(ctx);
}

/* ---- the sliding window on the blocked kernel (no cap) ---- */

/* Causal attention with the sliding window (query i sees the keys (i - window, i]) and the soft cap (cap > 0: the
   scores s replaced by cap tanh(s / cap)) in double over qkv values x (B, T, 3C), as transformers' eager attention
   computes it (scores, the cap, the mask, softmax), and its gradient for the upstream gradient R (B, T, C): y (B, T,
   C), g (B, T, 3C). */
static void window_ref(const float *x, const float *R, int64_t B, int64_t T, int64_t H, int64_t D, int64_t window,
                       double cap, double *y, double *g)
{
    const int64_t C = H * D, C3 = 3 * C;
    const double scale = 1 / sqrt((double)D);
    double *P = malloc((size_t)(T * T) * sizeof *P), *dP = malloc((size_t)T * sizeof *dP);
    double *dc = malloc((size_t)T * sizeof *dc); /* a row's d c / d s: 1 - tanh^2, or 1 */
    memset(g, 0, (size_t)(B * T * C3) * sizeof *g);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *X = x + b * T * C3 + h * D, *G = R + b * T * C + h * D;
            double *gq = g + b * T * C3 + h * D, *gk = gq + C, *gv = gq + 2 * C;
            for (int64_t i = 0; i < T; i++) {
                const int64_t j0 = window > 0 && i + 1 > window ? i + 1 - window : 0;
                double mx = -INFINITY, sum = 0, Di = 0;
                for (int64_t j = 0; j < T; j++) {
                    double s = 0;
                    for (int64_t e = 0; e < D; e++)
                        s += (double)X[i * C3 + e] * X[j * C3 + C + e];
                    const double th = cap > 0 ? tanh(s * scale / cap) : 0;
                    dc[j] = cap > 0 ? 1 - th * th : 1;
                    P[i * T + j] = j >= j0 && j <= i ? cap > 0 ? cap * th : s * scale : -INFINITY;
                    mx = fmax(mx, P[i * T + j]);
                }
                for (int64_t j = 0; j < T; j++)
                    sum += P[i * T + j] = exp(P[i * T + j] - mx);
                for (int64_t e = 0; e < D; e++)
                    y[(b * T + i) * C + h * D + e] = 0;
                for (int64_t j = 0; j < T; j++) {
                    P[i * T + j] /= sum;
                    dP[j] = 0;
                    for (int64_t e = 0; e < D; e++) {
                        y[(b * T + i) * C + h * D + e] += P[i * T + j] * X[j * C3 + 2 * C + e];
                        dP[j] += (double)G[i * C + e] * X[j * C3 + 2 * C + e];
                        gv[j * C3 + e] += P[i * T + j] * G[i * C + e];
                    }
                    Di += P[i * T + j] * dP[j];
                }
                for (int64_t j = 0; j < T; j++) {
                    const double dS = P[i * T + j] * (dP[j] - Di) * dc[j] * scale;
                    for (int64_t e = 0; e < D; e++) {
                        gq[i * C3 + e] += dS * X[j * C3 + C + e];
                        gk[j * C3 + e] += dS * X[i * C3 + e];
                    }
                }
            }
        }
    free(P);
    free(dP);
    free(dc);
}

/* The largest |got - want| over n elements divided by the bound a + r max|want| (a pass: <= 1). */
static double worst_ratio(const float *got, const double *want, int64_t n, double a, double r)
{
    double big = 0, w = 0;
    for (int64_t i = 0; i < n; i++)
        big = fmax(big, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - want[i]);
        w = isnan(e) ? INFINITY : fmax(w, e / (a + r * big));
    }
    return w;
}

/* A leaf [B, T, N] of dtype dt holding v (v already holds dt's values), with an f32 gradient buffer. */
static dt_tensor *window_leaf(dt_dtype dt, int64_t B, int64_t T, int64_t N, const float *v)
{
    dt_tensor *x = dt_tensor_new(dt, 3, SH(B, T, N));
    if (!x || dt_k_convert(v, DT_F32, x->data, dt, B * T * N) < 0 || dt_tensor_set_requires_grad(x, true) < 0)
        return NULL;
    return x;
}

/* The sliding window without a cap (dt_attention_window on the blocked kernel, key blocks outside the window
   skipped, the edge masked inside a block), f32 and bf16, forward and backward, against window_ref on every ISA path
   the CPU has: windows 1 and 2, a query block (16), a tile block (32), a key block (64), 37 and 100 (no multiple of
   a block), T 150 (no multiple of a block; a bf16 qkv takes the avx512_bf16 path's tiles there) and 50 (its rows), B
   2 and 3 heads. f32: y within 2e-6 (the bound above), dqkv within 2e-6 of its largest |value| (a tenth of
   tests/kernels/test_attention's bound); bf16 (probabilities rounded to bf16 on the avx512_bf16 path, the result and
   the gradient rounded to bf16): within 2^-7 of the largest |value| (kernels.h's bound in the tests) plus one
   rounding. Then a window of T or more, or 0, is dt_attention, bit for bit, forward and backward, both dtypes. */
/* dt_attention_window(window w, cap) of the values xs (qkv [B, TT, 3 H D]) and its backward with the output
 * gradient rs, both held in dt, on every ISA path the CPU has, against the double reference yr, gr
 * (window_ref): y and dqkv within their bounds (f32: y |err| <= ya + yrel |ref|, dqkv <= grel of the largest;
 * bf16: 2^-7 + 2^-8 relative), the worst fractions of the bounds kept in *wy and *wg */
static void window_on_paths(dt_ctx *ctx, dt_dtype dt, int64_t B, int64_t TT, int64_t H, int64_t D, int64_t w,
                            float cap, const float *xs, const float *rs, const double *yr, const double *gr, double ya,
                            double yrel, double grel, double *wy, double *wg)
{
    const int64_t C = H * D;
    for (int pi = 0; pi < 4; pi++) {
        if (dt_k_set_isa(g_isas[pi]) != DT_OK)
            continue;
        dt_tensor *x = window_leaf(dt, B, TT, 3 * C, xs);
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, TT, C), (float *)rs);
        dt_tensor *y = x && R ? dt_attention_window(ctx, x, (int)H, w, cap) : NULL;
        ASSERT(y && y->dtype == dt);
        ASSERT_OK(dt_backward_with(ctx, y, R));
        float *yf = malloc((size_t)(B * TT * C) * 4), *gf = malloc((size_t)(B * TT * 3 * C) * 4);
        ASSERT_OK(dt_k_convert(y->data, dt, yf, DT_F32, B * TT * C));
        ASSERT_OK(dt_k_convert(x->grad->data, x->grad->dtype, gf, DT_F32, B * TT * 3 * C)); /* dt's grad */
        const double ey = dt == DT_F32 ? worst_ratio(yf, yr, B * TT * C, ya, yrel)
                                       : worst_ratio(yf, yr, B * TT * C, 0, 0x1p-7 + 0x1p-8);
        const double eg = dt == DT_F32 ? worst_ratio(gf, gr, B * TT * 3 * C, 0, grel)
                                       : worst_ratio(gf, gr, B * TT * 3 * C, 0, 0x1p-7 + 0x1p-8);
        if (!(ey <= 1 && eg <= 1))
            fprintf(stderr, "  %s, T %lld, D %lld, window %lld, cap %g (%s): y at %.3g of its bound, dqkv at %.3g\n",
                    dt_dtype_name(dt), (long long)TT, (long long)D, (long long)w, (double)cap,
                    dt_k_isa_name(g_isas[pi]), ey, eg);
        ASSERT(ey <= 1 && eg <= 1);
        *wy = fmax(*wy, ey);
        *wg = fmax(*wg, eg);
        free(yf);
        free(gf);
        dt_tensor_free(x);
        dt_ctx_reset(ctx);
    }
}

TEST(window_blocked_reference)
{
    enum { B = 2, H = 3, D = 16, C = H * D, TM = 150 };
    const struct {
        int64_t T, window;
    } cases[] = {{150, 1}, {150, 2}, {150, 16}, {150, 32}, {150, 37}, {150, 64}, {150, 100}, {50, 2}, {50, 37}};
    const dt_dtype dts[2] = {DT_F32, DT_BF16};
    float *xv = malloc((size_t)(B * TM * 3 * C) * 4), *rv = malloc((size_t)(B * TM * C) * 4);
    double *yr = malloc((size_t)(B * TM * C) * 8), *gr = malloc((size_t)(B * TM * 3 * C) * 8);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    for (int di = 0; di < 2; di++) {
        const dt_dtype dt = dts[di];
        /* the values, held in dt (so the reference starts from the kernel's inputs) */
        dt_rng_fill_normal(dt_rng_key_make(51, DT_RNG_USER, 0, 0), 0, xv, (size_t)(B * TM * 3 * C), 0.0f, 1.0f);
        dt_rng_fill_normal(dt_rng_key_make(51, DT_RNG_USER, 1, 0), 0, rv, (size_t)(B * TM * C), 0.0f, 1.0f);
        for (int64_t i = 0; i < B * TM * 3 * C && dt != DT_F32; i++)
            xv[i] = dt_bf16_to_f32(dt_f32_to_bf16(xv[i]));
        for (int64_t i = 0; i < B * TM * C && dt != DT_F32; i++)
            rv[i] = dt_bf16_to_f32(dt_f32_to_bf16(rv[i]));
        double worst_y = 0, worst_g = 0;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const int64_t TT = cases[k].T, w = cases[k].window;
            /* the reference on the first T rows of each sequence: the values of a [B, T] qkv */
            float *xs = malloc((size_t)(B * TT * 3 * C) * 4), *rs = malloc((size_t)(B * TT * C) * 4);
            for (int64_t b = 0; b < B; b++) {
                memcpy(xs + b * TT * 3 * C, xv + b * TM * 3 * C, (size_t)(TT * 3 * C) * 4);
                memcpy(rs + b * TT * C, rv + b * TM * C, (size_t)(TT * C) * 4);
            }
            window_ref(xs, rs, B, TT, H, D, w, 0, yr, gr);
            window_on_paths(ctx, dt, B, TT, H, D, w, 0.0f, xs, rs, yr, gr, 2e-6, 0, 2e-6, &worst_y, &worst_g);
            free(xs);
            free(rs);
        }
        fprintf(stderr, "  %s sliding windows, blocked kernel: y within %.3g of its bound, dqkv %.3g\n",
                dt_dtype_name(dt), worst_y, worst_g);
        /* a window of T or more, or 0: dt_attention's bits, forward and backward (T 150: a bf16 qkv on the
           tiles on the avx512_bf16 path) */
        for (int pi = 0; pi < 4; pi++) {
            if (dt_k_set_isa(g_isas[pi]) != DT_OK)
                continue;
            const int64_t windows[3] = {0, TM, TM + 5};
            dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, TM, C), rv);
            dt_tensor *x0 = window_leaf(dt, B, TM, 3 * C, xv);
            dt_tensor *y0 = x0 && R ? dt_attention(ctx, x0, H, true, 0.0f, false, (dt_rng_key){0}) : NULL;
            ASSERT(y0);
            ASSERT_OK(dt_backward_with(ctx, y0, R));
            for (int k = 0; k < 3; k++) {
                dt_tensor *x1 = window_leaf(dt, B, TM, 3 * C, xv);
                dt_tensor *y1 = x1 ? dt_attention_window(ctx, x1, H, windows[k], 0.0f) : NULL;
                ASSERT(y1);
                ASSERT_OK(dt_backward_with(ctx, y1, R));
                const size_t es = dt == DT_F32 ? 4 : 2; /* y and the leaf's gradient hold dt */
                ASSERT(y1->dtype == dt && x1->grad->dtype == dt && x0->grad->dtype == dt);
                ASSERT(!memcmp(y0->data, y1->data, (size_t)(B * TM * C) * es));
                ASSERT(!memcmp(x0->grad->data, x1->grad->data, (size_t)(B * TM * 3 * C) * es));
                dt_tensor_free(x1);
            }
            dt_tensor_free(x0);
            dt_ctx_reset(ctx);
        }
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(xv);
    free(rv);
    free(yr);
    free(gr);
    dt_ctx_free(ctx);
}

/* Soft caps on the blocked kernel (dt_attention_window: the scores capped where each block's are computed), f32 and
   bf16, forward and backward, against window_ref on every ISA path the CPU has: caps 0.3 (most scores on tanh's flat
   ends), 1 and 50 (Gemma 2's: almost linear), with no window and with 37, D 8, 64 and 256, T 50 (a bf16 qkv on the
   rows) and 150 (on the avx512_bf16 path a bf16 qkv takes the tiles from dt_k_attention_lp_tiles' length on: 96
   without AMX, 64 with it), B 2 and 2 heads; and scores far beyond the cap (inputs of standard deviation 10: scores
   of about 100 against caps 1 and 50, what the cap is for; a kernel that took the softmax's max before the cap
   would see every exponential underflow); the bounds of window_blocked_reference, for f32 there 1e-5 of the largest
   |value| of y and of dqkv (the f32 scores of about 100 carry their rounding, some 1e-5, into the exponentials;
   1 - tanh^2 from the f32 tanh t keeps t's absolute error, relative 2^-24 / (1 - t^2) near the cap's ends). */
TEST(window_cap_blocked_reference)
{
    enum { B = 2, H = 2 };
    const struct {
        int64_t T, D, window;
        float cap, sd; /* sd: the inputs' standard deviation */
    } cases[] = {{50, 8, 0, 0.3f, 1},   {150, 8, 37, 1.0f, 1},   {150, 64, 0, 50.0f, 1}, {50, 64, 37, 0.3f, 1},
                 {150, 64, 37, 1.0f, 1}, {150, 256, 0, 0.3f, 1}, {50, 256, 37, 50.0f, 1}, {150, 64, 37, 1.0f, 10},
                 {50, 64, 0, 50.0f, 10}};
    const dt_dtype dts[2] = {DT_F32, DT_BF16};
    int64_t min_t = 0;
    const char *tiles = dt_k_attention_lp_tiles(&min_t);
    fprintf(stderr, "  bf16 tiles: %s from T %lld\n", tiles ? tiles : "none", (long long)min_t);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    for (int di = 0; di < 2; di++) {
        const dt_dtype dt = dts[di];
        double worst_y = 0, worst_g = 0;
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const int64_t TT = cases[k].T, D = cases[k].D, C = H * D, w = cases[k].window;
            const float cap = cases[k].cap;
            float *xs = malloc((size_t)(B * TT * 3 * C) * 4), *rs = malloc((size_t)(B * TT * C) * 4);
            double *yr = malloc((size_t)(B * TT * C) * 8), *gr = malloc((size_t)(B * TT * 3 * C) * 8);
            /* the values, held in dt (so the reference starts from the kernel's inputs) */
            dt_rng_fill_normal(dt_rng_key_make(52 + k, DT_RNG_USER, 0, 0), 0, xs, (size_t)(B * TT * 3 * C), 0.0f,
                               cases[k].sd);
            dt_rng_fill_normal(dt_rng_key_make(52 + k, DT_RNG_USER, 1, 0), 0, rs, (size_t)(B * TT * C), 0.0f, 1.0f);
            for (int64_t i = 0; i < B * TT * 3 * C && dt != DT_F32; i++)
                xs[i] = dt_bf16_to_f32(dt_f32_to_bf16(xs[i]));
            for (int64_t i = 0; i < B * TT * C && dt != DT_F32; i++)
                rs[i] = dt_bf16_to_f32(dt_f32_to_bf16(rs[i]));
            window_ref(xs, rs, B, TT, H, D, w, cap, yr, gr);
            const double sd = cases[k].sd;
            window_on_paths(ctx, dt, B, TT, H, D, w, cap, xs, rs, yr, gr, sd > 1 ? 0 : 2e-6, sd > 1 ? 1e-5 : 0,
                            sd > 1 ? 1e-5 : 2e-6, &worst_y, &worst_g);
            free(xs);
            free(rs);
            free(yr);
            free(gr);
        }
        fprintf(stderr, "  %s soft caps, blocked kernel: y within %.3g of its bound, dqkv %.3g\n", dt_dtype_name(dt),
                worst_y, worst_g);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    dt_ctx_free(ctx);
}

/* Rope scalings (head_dim 16, theta 10000): none; linear factor 4; llama3
 * factor 8, low 1, high 4, original 32 (some frequencies kept, some
 * divided, one on the ramp). */
TEST(rope_scaling_freqs)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    float inv[8];
    ASSERT_OK(dt_llama_inv_freq(&c, 0, inv));
    for (int i = 0; i < 8; i++)
        ASSERT_NEAR(inv[i], pow(10000.0, -(double)(2 * i) / 16), 0, 2e-6);
    c.rope_type = DT_ROPE_LINEAR;
    c.rope_factor = 4;
    ASSERT_OK(dt_llama_inv_freq(&c, 0, inv));
    for (int i = 0; i < 8; i++)
        ASSERT_NEAR(inv[i], pow(10000.0, -(double)(2 * i) / 16) / 4, 0, 2e-6);
    c.rope_type = DT_ROPE_LLAMA3;
    c.rope_factor = 8, c.rope_low_freq_factor = 1, c.rope_high_freq_factor = 4;
    c.rope_original_max_position_embeddings = 32;
    ASSERT_OK(dt_llama_inv_freq(&c, 0, inv));
    for (int i = 0; i < 8; i++) {
        double f = pow(10000.0, -(double)(2 * i) / 16), wl = 2 * M_PI / f, want;
        if (wl < 8)
            want = f;
        else if (wl > 32)
            want = f / 8;
        else {
            double s = (32 / wl - 1) / 3;
            want = (1 - s) * f / 8 + s * f;
        }
        ASSERT_NEAR(inv[i], want, 0, 2e-6);
    }
    c.rope_low_freq_factor = 5; /* high must exceed low */
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
}

/* YaRN (head_dim 16, theta 10000, factor 8 over 32 original positions):
 * beta 32 and 1 truncated (the ramp's ends whole: [0, 2]), and beta 4 and
 * 0.5 not ([0.21, 2.02]), against transformers' formulas in double. */
TEST(yarn_freqs)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.rope_type = DT_ROPE_YARN;
    c.rope_factor = 8, c.rope_original_max_position_embeddings = 32, c.rope_attention_factor = 1.2;
    for (int pass = 0; pass < 2; pass++) {
        c.rope_beta_fast = pass ? 4 : 32, c.rope_beta_slow = pass ? 0.5 : 1, c.rope_truncate = !pass;
        ASSERT_OK(dt_llama_config_check(&c));
        float inv[8];
        ASSERT_OK(dt_llama_inv_freq(&c, 0, inv));
        double lo = 16 * log(32 / (c.rope_beta_fast * 2 * M_PI)) / (2 * log(10000.0));
        double hi = 16 * log(32 / (c.rope_beta_slow * 2 * M_PI)) / (2 * log(10000.0));
        if (c.rope_truncate)
            lo = floor(lo), hi = ceil(hi);
        lo = fmax(lo, 0), hi = fmin(hi, 15);
        int mixed = 0;
        for (int i = 0; i < 8; i++) {
            double f = pow(10000.0, -(double)(2 * i) / 16), ramp = fmin(fmax((i - lo) / (hi - lo), 0), 1);
            ASSERT_NEAR(inv[i], f / 8 * ramp + f * (1 - ramp), 0, 2e-6);
            mixed += ramp > 0 && ramp < 1;
        }
        ASSERT(mixed > 0); /* frequencies between interpolation and extrapolation: the ramp is exercised */
    }
    c.rope_beta_slow = 0;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "yarn");
}

/* LongRoPE with a partial rotary width (Phi-4-mini's shape at head_dim 16:
 * 12 of 16 values rotate, 6 frequencies over the width 12): the short
 * factors up to original_max_position_embeddings positions, the long ones
 * past it; the checks of the factors and the width. */
TEST(longrope_freqs)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.rope_type = DT_ROPE_LONGROPE;
    c.rotary_dim = 12;
    c.rope_original_max_position_embeddings = 32;
    c.rope_attention_factor = 1.2;
    for (int i = 0; i < 6; i++)
        c.rope_short_factor[i] = 1.0f + 0.25f * (float)i, c.rope_long_factor[i] = 2.0f + (float)i;
    ASSERT_OK(dt_llama_config_check(&c));
    float inv[8];
    for (int pass = 0; pass < 3; pass++) {
        const int64_t len = pass == 0 ? 0 : pass == 1 ? 32 : 33;
        ASSERT_OK(dt_llama_inv_freq(&c, len, inv));
        for (int i = 0; i < 6; i++) {
            double f = pow(10000.0, -(double)(2 * i) / 12);
            ASSERT_NEAR(inv[i], f / (len > 32 ? 2.0 + i : 1.0 + 0.25 * i), 0, 2e-6);
        }
    }
    c.rope_long_factor[5] = 0.0f;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "entry 5");
    c.rope_long_factor[5] = 1.0f;
    c.rope_attention_factor = 0.0;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    c.rope_attention_factor = 1.0;
    c.rotary_dim = 7;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "rotary width 7");
    c.rotary_dim = 18;
    ASSERT_STATUS(dt_llama_config_check(&c), DT_ERR_INVALID_ARG);
}

TEST(bad_inputs)
{
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_new(DT_F32, 3, SH(1, 4, 12)), *w = dt_tensor_new(DT_F32, 1, SH(5));
    ASSERT(dt_rms_norm(ctx, x, w, 1e-5f) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_rope(ctx, x, 5, g_inv, 0) == NULL); /* 12 is not 5 heads */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_rope(ctx, x, 4, g_inv, 0) == NULL); /* head size 3 is odd */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_rope(ctx, x, 2, NULL, 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT(dt_rope_partial(ctx, x, 1, 14, g_inv, 1.0f, 0, NULL) == NULL); /* wider than the head */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT(dt_rope_partial(ctx, x, 1, 5, g_inv, 1.0f, 0, NULL) == NULL); /* odd */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT(dt_rope_partial(ctx, x, 1, 4, g_inv, NAN, 0, NULL) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "scale");
    ASSERT(dt_swiglu(ctx, x, w) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_gqa_pack(ctx, x, x, x, 4, 3) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    ASSERT(dt_gqa_pack(ctx, x, x, x, 4, 2) == NULL); /* k is as wide as q: not 2 kv heads */
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT(dt_rms_norm(ctx, NULL, w, 1e-5f) == NULL);
    dt_tensor_free(x);
    dt_tensor_free(w);
    dt_ctx_free(ctx);
}

/* SwiGLU of two bf16/f16 tensors (one kernel reading and writing the low
 * precision: no cast passes) equals, bit for bit, widen + f32 SwiGLU +
 * round: the result and both gradients (leaves of that dtype), with -0,
 * large magnitudes and a NaN among the gates. */
static void swiglu_lp_case(dt_dtype dt)
{
    enum { M = 3 * 5 * 700 }; /* more than one kernel block, a tail */
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float gv[M], uv[M], rv[M];
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 0, 0), 0, gv, M, -9.0f, 9.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 1, 0), 0, uv, M, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(12, DT_RNG_DATA, 2, 0), 0, rv, M, -1.0f, 1.0f);
    gv[3] = -0.0f, gv[4] = 100.0f, gv[5] = -100.0f, gv[6] = NAN;
    dt_tensor *g[2], *u[2], *gg[2], *gu[2], *y[2];
    for (int i = 0; i < 2; i++) {
        g[i] = dt_tensor_new(dt, 3, SH(3, 5, 700));
        u[i] = dt_tensor_new(dt, 3, SH(3, 5, 700));
        gg[i] = dt_tensor_new(dt, 3, SH(3, 5, 700));
        gu[i] = dt_tensor_new(dt, 3, SH(3, 5, 700));
        ASSERT(g[i] && u[i] && gg[i] && gu[i]);
        ASSERT_OK(dt_k_convert(gv, DT_F32, g[i]->data, dt, M));
        ASSERT_OK(dt_k_convert(uv, DT_F32, u[i]->data, dt, M));
        ASSERT_OK(dt_tensor_zero(gg[i]));
        ASSERT_OK(dt_tensor_zero(gu[i]));
        ASSERT_OK(dt_tensor_set_grad(g[i], gg[i]));
        ASSERT_OK(dt_tensor_set_grad(u[i], gu[i]));
    }
    y[0] = dt_swiglu(ctx, g[0], u[0]);
    y[1] = dt_cast(ctx, dt_swiglu(ctx, dt_cast(ctx, g[1], DT_F32), dt_cast(ctx, u[1], DT_F32)), dt);
    ASSERT(y[0] && y[1] && y[0]->dtype == dt && y[1]->dtype == dt);
    ASSERT(!memcmp(y[0]->data, y[1]->data, (size_t)M * 2));
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, y[0]->shape, rv);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_backward_with(ctx, y[i], R));
    ASSERT(!memcmp(gg[0]->data, gg[1]->data, (size_t)M * 2));
    ASSERT(!memcmp(gu[0]->data, gu[1]->data, (size_t)M * 2));
    int nz = 0;
    for (int64_t i = 0; i < M; i++)
        nz += dt_tensor_get(gg[0], i) != 0.0;
    ASSERT(nz > M / 2);
    for (int i = 0; i < 2; i++) {
        dt_tensor_free(g[i]);
        dt_tensor_free(u[i]);
        dt_tensor_free(gg[i]);
        dt_tensor_free(gu[i]);
    }
    dt_ctx_free(ctx);
}

TEST(swiglu_lp_equals_widened)
{
    swiglu_lp_case(DT_BF16);
    swiglu_lp_case(DT_F16);
}

/* The grouped-query packing of three bf16/f16 tensors (a copy, no cast
 * passes) equals widen + f32 pack + round: the packed result and the q, k,
 * v gradients (k's and v's summed over their copies, then rounded). */
static void gqa_lp_case(dt_dtype dt)
{
    enum { B = 2, T = 5, H = 4, KV = 2, HD = 6, NQ = B * T * H * HD, NK = B * T * KV * HD };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float qv[NQ], kv[NK], vv[NK], rv[3 * NQ];
    dt_rng_fill_uniform(dt_rng_key_make(13, DT_RNG_DATA, 0, 0), 0, qv, NQ, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(13, DT_RNG_DATA, 1, 0), 0, kv, NK, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(13, DT_RNG_DATA, 2, 0), 0, vv, NK, -3.0f, 3.0f);
    dt_rng_fill_uniform(dt_rng_key_make(13, DT_RNG_DATA, 3, 0), 0, rv, 3 * NQ, -1.0f, 1.0f);
    dt_tensor *x[2][3], *g[2][3], *y[2];
    const float *src[3] = {qv, kv, vv};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            int64_t c = j ? KV * HD : H * HD;
            x[i][j] = dt_tensor_new(dt, 3, SH(B, T, c));
            g[i][j] = dt_tensor_new(dt, 3, SH(B, T, c));
            ASSERT(x[i][j] && g[i][j]);
            ASSERT_OK(dt_k_convert(src[j], DT_F32, x[i][j]->data, dt, B * T * c));
            ASSERT_OK(dt_tensor_zero(g[i][j]));
            ASSERT_OK(dt_tensor_set_grad(x[i][j], g[i][j]));
        }
    y[0] = dt_gqa_pack(ctx, x[0][0], x[0][1], x[0][2], H, KV);
    y[1] = dt_cast(ctx, dt_gqa_pack(ctx, dt_cast(ctx, x[1][0], DT_F32), dt_cast(ctx, x[1][1], DT_F32),
                                    dt_cast(ctx, x[1][2], DT_F32), H, KV), dt);
    ASSERT(y[0] && y[1] && y[0]->dtype == dt && y[1]->dtype == dt);
    ASSERT(!memcmp(y[0]->data, y[1]->data, (size_t)3 * NQ * 2));
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, y[0]->shape, rv);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_backward_with(ctx, y[i], R));
    for (int j = 0; j < 3; j++)
        ASSERT(!memcmp(g[0][j]->data, g[1][j]->data, (size_t)dt_tensor_numel(g[0][j]) * 2));
    ASSERT(dt_tensor_get(g[0][1], 0) != 0.0);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            dt_tensor_free(x[i][j]);
            dt_tensor_free(g[i][j]);
        }
    dt_ctx_free(ctx);
}

TEST(gqa_lp_equals_widened)
{
    gqa_lp_case(DT_BF16);
    gqa_lp_case(DT_F16);
}

/* The kernel alone (dt_k_gqa_pack_bwd_lp) against round -> gather and sum
 * from zero -> round, computed here with dt_k_convert: every output, the t
 * copies, NULL outputs, a head size over its 512-element piece (520), and
 * NaN, -0 (a sum of -0 copies is +0), values whose sum rounds to infinity;
 * bad arguments fail. */
static void gqa_kernel_case(dt_dtype dt, int64_t H, int64_t KV, int64_t hd)
{
    const int64_t rows = 3, C = H * hd, Ck = KV * hd, rep = H / KV, n = rows * 3 * C;
    float *d = malloc(n * 4), *w = malloc(n * 4), *ref[3], *got[3];
    uint16_t *h = malloc(n * 2), *lp[2], *rl = malloc(n * 2);
    ASSERT(d && w && h && rl);
    for (int i = 0; i < 3; i++)
    {
        ref[i] = calloc(rows * C, 4), got[i] = calloc(rows * C, 4);
        ASSERT(ref[i] && got[i]);
    }
    lp[0] = malloc(rows * Ck * 2), lp[1] = malloc(rows * Ck * 2);
    dt_rng_fill_uniform(dt_rng_key_make(16, DT_RNG_DATA, 0, 0), 0, d, n, -2.0f, 2.0f);
    d[C + 1] = NAN, d[2 * C + 3] = -0.0f, d[C + 2] = 6e4f, d[C + hd + 2] = 6e4f; /* f16: 65504 max */
    d[C + 5] = 3.3e38f, d[C + hd + 5] = 3.3e38f;
    for (int64_t h2 = 0; h2 < H; h2++)
        d[2 * C + h2 * hd + 7] = -0.0f;
    ASSERT_OK(dt_k_convert(d, DT_F32, h, dt, n));
    ASSERT_OK(dt_k_convert(h, dt, w, DT_F32, n));
    for (int64_t r = 0; r < rows; r++) {
        const float *o = w + r * 3 * C;
        memcpy(ref[0] + r * C, o, C * 4);
        for (int64_t h2 = 0; h2 < H; h2++)
            for (int64_t j = 0; j < hd; j++) {
                ref[1][r * Ck + (h2 / rep) * hd + j] += o[C + h2 * hd + j];
                ref[2][r * Ck + (h2 / rep) * hd + j] += o[2 * C + h2 * hd + j];
            }
    }
    for (int i = 1; i < 3; i++) {
        ASSERT_OK(dt_k_convert(ref[i], DT_F32, rl, dt, rows * Ck));
        ASSERT_OK(dt_k_convert(rl, dt, ref[i], DT_F32, rows * Ck));
    }
    ASSERT_OK(dt_k_gqa_pack_bwd_lp(d, dt, rows, H, KV, hd, got[0], got[1], got[2], lp[0], lp[1]));
    ASSERT(!memcmp(got[0], ref[0], rows * C * 4));
    ASSERT(!memcmp(got[1], ref[1], rows * Ck * 4));
    ASSERT(!memcmp(got[2], ref[2], rows * Ck * 4));
    for (int i = 0; i < 2; i++) {
        ASSERT_OK(dt_k_convert(ref[1 + i], DT_F32, rl, dt, rows * Ck));
        ASSERT(!memcmp(lp[i], rl, rows * Ck * 2));
    }
    memset(got[2], 0, rows * Ck * 4);
    ASSERT_OK(dt_k_gqa_pack_bwd_lp(d, dt, rows, H, KV, hd, NULL, NULL, got[2], NULL, NULL)); /* v alone */
    ASSERT(!memcmp(got[2], ref[2], rows * Ck * 4));
    ASSERT_STATUS(dt_k_gqa_pack_bwd_lp(d, DT_F32, rows, H, KV, hd, got[0], NULL, NULL, NULL, NULL),
                  DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_gqa_pack_bwd_lp(d, dt, 1, 4, 3, 2, got[0], NULL, NULL, NULL, NULL), DT_ERR_INVALID_ARG);
    for (int i = 0; i < 3; i++)
        free(ref[i]), free(got[i]);
    free(d), free(w), free(h), free(rl), free(lp[0]), free(lp[1]);
}

TEST(gqa_kernel_equals_chain)
{
    for (int k = 0; k < 2; k++) {
        dt_dtype dt = k ? DT_F16 : DT_BF16;
        gqa_kernel_case(dt, 4, 2, 6);
        gqa_kernel_case(dt, 6, 2, 520);
        gqa_kernel_case(dt, 3, 3, 16);
    }
}

/* RoPE of a bf16/f16 tensor (one kernel reading and writing the low
 * precision: no cast passes) equals, bit for bit, widen + f32 RoPE + round:
 * the result and the gradient (a leaf of that dtype), with -0, large
 * magnitudes and a NaN among the inputs; and the kernels alone against the
 * same chain at a head size whose pairs span more than one of their
 * chunks (hd 1030: 515 pairs; rows of 4 heads, wider than the one-pass row). */
static void rope_lp_case(dt_dtype dt)
{
    enum { B = 2, T = 5, H = 3, HD = 12, N = B * T * H * HD };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float xv[N], rv[N];
    dt_rng_fill_uniform(dt_rng_key_make(14, DT_RNG_DATA, 0, 0), 0, xv, N, -50.0f, 50.0f);
    dt_rng_fill_uniform(dt_rng_key_make(14, DT_RNG_DATA, 1, 0), 0, rv, N, -1.0f, 1.0f);
    xv[3] = -0.0f, xv[4] = 3e4f, xv[7] = NAN;
    const float inv[6] = {1.0f, 0.37f, 0.11f, 0.031f, 0.009f, 0.0021f};
    dt_tensor *x[2], *g[2], *y[2];
    for (int i = 0; i < 2; i++) {
        x[i] = dt_tensor_new(dt, 3, SH(B, T, H * HD));
        g[i] = dt_tensor_new(dt, 3, SH(B, T, H * HD));
        ASSERT(x[i] && g[i]);
        ASSERT_OK(dt_k_convert(xv, DT_F32, x[i]->data, dt, N));
        ASSERT_OK(dt_tensor_zero(g[i]));
        ASSERT_OK(dt_tensor_set_grad(x[i], g[i]));
    }
    y[0] = dt_rope(ctx, x[0], H, inv, 7);
    y[1] = dt_cast(ctx, dt_rope(ctx, dt_cast(ctx, x[1], DT_F32), H, inv, 7), dt);
    ASSERT(y[0] && y[1] && y[0]->dtype == dt && y[1]->dtype == dt);
    ASSERT(!memcmp(y[0]->data, y[1]->data, (size_t)N * 2));
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, y[0]->shape, rv);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_backward_with(ctx, y[i], R));
    ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)N * 2));
    int nz = 0;
    for (int64_t i = 0; i < N; i++)
        nz += dt_tensor_get(g[0], i) != 0.0;
    ASSERT(nz > N / 2);
    for (int i = 0; i < 2; i++) {
        dt_tensor_free(x[i]);
        dt_tensor_free(g[i]);
    }
    dt_ctx_free(ctx);

    enum { KT = 3, KD = 1030, KN = KT * 4 * KD, KH = KD / 2 }; /* rows of 4120: head by head */
    static float a[KN], ref[KN], got[KN], cs[KT * KH], sn[KT * KH];
    static uint16_t al[KN], yl[KN];
    dt_rng_fill_uniform(dt_rng_key_make(14, DT_RNG_DATA, 2, 0), 0, a, KN, -4.0f, 4.0f);
    for (int64_t i = 0; i < KT * KH; i++)
        cs[i] = cosf(0.01f * (float)i), sn[i] = sinf(0.01f * (float)i);
    ASSERT_OK(dt_k_convert(a, DT_F32, al, dt, KN));
    ASSERT_OK(dt_k_rope_lp(al, dt, 1, KT, 4, KD, KD, cs, sn, yl));
    ASSERT_OK(dt_k_convert(al, dt, ref, DT_F32, KN));
    ASSERT_OK(dt_k_rope(ref, 1, KT, 4, KD, KD, cs, sn, false, ref));
    ASSERT_OK(dt_k_convert(ref, DT_F32, al, dt, KN));
    ASSERT(!memcmp(al, yl, sizeof al));
    /* backward: a (f32) rounded, rotated back, rounded */
    ASSERT_OK(dt_k_rope_bwd_lp(a, dt, 1, KT, 4, KD, KD, cs, sn, got, NULL));
    ASSERT_OK(dt_k_convert(a, DT_F32, al, dt, KN));
    ASSERT_OK(dt_k_convert(al, dt, ref, DT_F32, KN));
    ASSERT_OK(dt_k_rope(ref, 1, KT, 4, KD, KD, cs, sn, true, ref));
    ASSERT_OK(dt_k_convert(ref, DT_F32, al, dt, KN));
    ASSERT_OK(dt_k_convert(al, dt, ref, DT_F32, KN));
    ASSERT(!memcmp(ref, got, sizeof ref));
    ASSERT_STATUS(dt_k_rope_lp(al, DT_F32, 1, KT, 2, KD, KD, cs, sn, yl), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_rope_lp(al, dt, 1, KT, 2, 7, 7, cs, sn, yl), DT_ERR_INVALID_ARG);
}

/* RMSNorm of a bf16/f16 tensor (one kernel reading and writing the low
 * precision) equals, bit for bit, widen + f32 RMSNorm + round: the result
 * and the gradients of x and of a weight of x's dtype, of an f32 weight, and
 * without a weight; rows wider than the kernel's column block (300) and a
 * row of zeros, large magnitudes and -0. */
static void rms_lp_case(dt_dtype dt, dt_dtype wdt, bool has_w)
{
    enum { B = 3, T = 4, D = 300, N = B * T * D };
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    static float xv[N], rv[N], wv[D];
    dt_rng_fill_uniform(dt_rng_key_make(15, DT_RNG_DATA, 0, 0), 0, xv, N, -20.0f, 20.0f);
    dt_rng_fill_uniform(dt_rng_key_make(15, DT_RNG_DATA, 1, 0), 0, rv, N, -1.0f, 1.0f);
    dt_rng_fill_uniform(dt_rng_key_make(15, DT_RNG_DATA, 2, 0), 0, wv, D, 0.5f, 1.5f);
    xv[3] = -0.0f, xv[4] = 2e4f;
    memset(xv + D, 0, D * sizeof(float)); /* a row of zeros: rstd 1/sqrt(eps) */
    dt_tensor *x[2], *g[2], *w[2], *gw[2], *y[2];
    for (int i = 0; i < 2; i++) {
        x[i] = dt_tensor_new(dt, 3, SH(B, T, D));
        g[i] = dt_tensor_new(dt, 3, SH(B, T, D));
        w[i] = dt_tensor_new(wdt, 1, SH(D));
        gw[i] = dt_tensor_new(wdt, 1, SH(D));
        ASSERT(x[i] && g[i] && w[i] && gw[i]);
        ASSERT_OK(dt_k_convert(xv, DT_F32, x[i]->data, dt, N));
        ASSERT_OK(dt_k_convert(wv, DT_F32, w[i]->data, wdt, D));
        ASSERT_OK(dt_tensor_zero(g[i]));
        ASSERT_OK(dt_tensor_zero(gw[i]));
        ASSERT_OK(dt_tensor_set_grad(x[i], g[i]));
        ASSERT_OK(dt_tensor_set_grad(w[i], gw[i]));
    }
    y[0] = dt_rms_norm(ctx, x[0], has_w ? w[0] : NULL, 1e-5f);
    y[1] = dt_cast(ctx, dt_rms_norm(ctx, dt_cast(ctx, x[1], DT_F32), has_w ? dt_cast(ctx, w[1], DT_F32) : NULL,
                                    1e-5f), dt);
    ASSERT(y[0] && y[1] && y[0]->dtype == dt && y[1]->dtype == dt);
    ASSERT(!memcmp(y[0]->data, y[1]->data, (size_t)N * 2));
    dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, y[0]->shape, rv);
    for (int i = 0; i < 2; i++)
        ASSERT_OK(dt_backward_with(ctx, y[i], R));
    ASSERT(!memcmp(g[0]->data, g[1]->data, (size_t)N * 2));
    ASSERT(!memcmp(gw[0]->data, gw[1]->data, dt_tensor_nbytes(gw[0])));
    ASSERT(dt_tensor_get(g[0], 5) != 0.0);
    ASSERT(!has_w || dt_tensor_get(gw[0], 7) != 0.0);
    for (int i = 0; i < 2; i++) {
        dt_tensor_free(x[i]);
        dt_tensor_free(g[i]);
        dt_tensor_free(w[i]);
        dt_tensor_free(gw[i]);
    }
    dt_ctx_free(ctx);
}

TEST(rms_lp_equals_widened)
{
    rms_lp_case(DT_BF16, DT_BF16, true);
    rms_lp_case(DT_BF16, DT_F32, true);
    rms_lp_case(DT_BF16, DT_BF16, false);
    rms_lp_case(DT_F16, DT_F16, true);
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    ASSERT_STATUS(dt_k_rmsnorm_fwd_lp(xs, DT_F32, 1, 8, NULL, 1e-5f, y, NULL), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_rmsnorm_fwd_lp(xs, DT_BF16, 1, 8, NULL, 0.0f, y, NULL), DT_ERR_INVALID_ARG);
}

TEST(rope_lp_equals_widened)
{
    rope_lp_case(DT_BF16);
    rope_lp_case(DT_F16);
}

int main(void)
{
    (void)gc_distinct;
    (void)gc_away_from_zero;
    RUN(rms_norm_grad);
    RUN(rope_grad);
    RUN(rope_partial_grad);
    RUN(swiglu_grad);
    RUN(gqa_pack_grad);
    RUN(gqa_attention_grad);
    RUN(forward_reference);
    RUN(bf16_inputs);
    RUN(window_softcap_grads);
    RUN(window_softcap_forward_reference);
    RUN(window_blocked_reference);
    RUN(window_cap_blocked_reference);
    RUN(swiglu_lp_equals_widened);
    RUN(gqa_lp_equals_widened);
    RUN(rope_lp_equals_widened);
    RUN(gqa_kernel_equals_chain);
    RUN(rms_lp_equals_widened);
    RUN(rope_scaling_freqs);
    RUN(longrope_freqs);
    RUN(yarn_freqs);
    RUN(bad_inputs);
    return TEST_REPORT();
}
