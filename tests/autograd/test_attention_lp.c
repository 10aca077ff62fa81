/* Attention over a bf16/f16 qkv reads it as it is (the kernel widens its
 * tiles while packing them): one tape node where the widening composition
 * dt_cast(f32) -> attention -> dt_cast(back) recorded three. Its result and
 * the qkv gradient its backward gives (which goes through the saved
 * log-sum-exp, dy rounded to the result's dtype and the gradient rounded to
 * qkv's) are checked against the composition (the f32 kernel: the
 * reference) on every ISA path the CPU has (dt_k_set_isa: scalar, avx2,
 * avx512, avx512_bf16):
 *   - scalar and avx2: equal bit for bit;
 *   - avx512 and avx512_bf16 (the fast rows: fused multiply-adds, the
 *     16-lane exponential, partial sums): within the kernel's stated bound,
 *     element by element |got - want| <= u |want| + A max|want|, with u one
 *     unit in the last place of the dtype relative (2^-7 bf16, 2^-10 f16; a
 *     result whose f32 value lies by a rounding boundary may round the
 *     other way) or 0 for f32 results, A = 2^-19 (the f32 sums' rounding,
 *     over the tensor's largest value), NaN where the reference has NaN and
 *     the same infinities; on avx512_bf16 with a bf16 qkv A = 2^-7 (P and
 *     dS rounded to bf16 before the products with v, k, q and dy; about
 *     2^-8.3 measured).
 *
 * Cases: GPT-2's packed qkv (causal and not, dropout on and off, head sizes
 * that take the kernels' 64-, 32-, 8-column and scalar-tail loops, T past
 * one key block; dt_attention_window's sliding windows without a cap,
 * which run the same kernel), and Llama's path (q and k roped, dt_gqa_pack
 * with grouped kv heads, under bf16 autocast) with q, k, v leaves'
 * gradients. */
#include "dtrain/dtrain.h"
#include "isa_paths.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

/* Whether path isa runs the fast rows on a bf16/f16 qkv (then the bound,
 * else the bits). */
static bool fast_path(dt_k_isa isa)
{
    return isa >= DT_K_ISA_AVX512;
}

/* A: the kernels' own results (f32 sums' rounding); A_DOWN: results that
 * pass through more bf16/f16 ops after the attention's rounded gradient
 * (gqa_pack's sum, rope's rotation), where a one-unit flip of a summand
 * shows as u times the summand, not the result. */
#define A_KERNEL 0x1p-19
#define A_DOWN(dt) ((dt) == DT_BF16 ? 0x1p-7 : 0x1p-10)

/* The elements of got (f32) outside the bound around want: |got - want| <=
 * u |want| + A max|want| (the largest finite); a NaN want needs a NaN, an
 * infinite one the same value. */
static int64_t outside(const float *got, const float *want, int64_t n, double u, double A)
{
    double big = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(want[i]) && fabs(want[i]) > big)
            big = fabs(want[i]);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = got[i], b = want[i];
        if (isnan(b) || isinf(b))
            bad += isnan(b) ? !isnan(a) : a != b;
        else
            bad += !(fabs(a - b) <= u * fabs(b) + A * big);
    }
    return bad;
}

/* outside() for n elements stored as st (f32, bf16 or f16) holding values
 * rounded to rt (u: one unit in rt's last place, 0 for f32), A as
 * outside(); 0 when they are the same bits. */
static int64_t outside_dt(dt_dtype st, dt_dtype rt, double A, const void *got, const void *want, int64_t n)
{
    size_t es = st == DT_F32 ? 4 : 2;
    if (!memcmp(got, want, (size_t)n * es))
        return 0;
    double u = rt == DT_BF16 ? 0x1p-7 : rt == DT_F16 ? 0x1p-10 : 0.0;
    if (st == DT_F32)
        return outside(got, want, n, u, A);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    int64_t bad = n;
    if (a && b && dt_k_convert(got, st, a, DT_F32, n) >= 0 && dt_k_convert(want, st, b, DT_F32, n) >= 0)
        bad = outside(a, b, n, u, A);
    free(a);
    free(b);
    return bad;
}

/* A on path isa: the avx512_bf16 path rounds P and dS to bf16 before they
 * multiply v, k, q and dy (kernels.h): A_BF16 of the largest |value|
 * for a bf16 qkv there. */
#define A_BF16 0x1p-7
static double a_path(dt_k_isa isa, dt_dtype qkv, double A)
{
    return isa == DT_K_ISA_AVX512_BF16 && qkv == DT_BF16 && A < A_BF16 ? A_BF16 : A;
}

/* got equals want bit for bit on a bit-exact path, within the bound on a
 * fast one: n elements stored as st, rounded to rt, A as outside(). */
#define ASSERT_MATCH(isa, st, rt, A, got, want, n)                                                               \
    do {                                                                                                       \
        if (fast_path(isa))                                                                                    \
            ASSERT_EQ_INT((long long)outside_dt(st, rt, A, got, want, n), 0);                                     \
        else                                                                                                   \
            ASSERT(!memcmp(got, want, (size_t)(n) * ((st) == DT_F32 ? 4 : 2)));                                \
    } while (0)

static int64_t held_in_dtype(dt_dtype dt, const float *g, int64_t n, int *odd)
{
    int64_t nz = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = g[i], w;
        uint16_t h;
        if (dt_k_convert(&v, DT_F32, &h, dt, 1) < 0 || dt_k_convert(&h, dt, &w, DT_F32, 1) < 0)
            ++*odd;
        *odd += memcmp(&v, &w, 4) != 0;
        nz += v != 0.0f;
    }
    return nz;
}

static dt_tensor *leaf(dt_dtype dt, int64_t b, int64_t t, int64_t c, const float *v, dt_tensor **grad)
{
    dt_tensor *x = dt_tensor_new(dt, 3, SH(b, t, c));
    *grad = dt_tensor_new(DT_F32, 3, SH(b, t, c));
    if (!x || !*grad || dt_k_convert(v, DT_F32, x->data, dt, b * t * c) < 0 || dt_tensor_zero(*grad) < 0 ||
        dt_tensor_set_grad(x, *grad) < 0)
        return NULL;
    return x;
}

/* GPT-2: qkv [B, T, 3 H D] of dt; y = attention(qkv) against the widening
 * composition on the same values, then the backward of both with one f32
 * upstream gradient (specials: with a subnormal, a value that rounds to
 * infinity in dt, a signalling NaN, and so NaN gradients downstream, all
 * compared by bits). window > 0: dt_attention_window's sliding window
 * (causal, no dropout, no cap; the same blocked kernel) instead. */
static void gpt_case(dt_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D, bool causal, float p, bool specials,
                     int64_t window)
{
    const int64_t C = H * D, M = B * T * 3 * C, N = B * T * C;
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float *xv = malloc((size_t)M * 4), *gv = malloc((size_t)N * 4);
    ASSERT(xv && gv);
    dt_rng_fill_uniform(dt_rng_key_make(21, DT_RNG_DATA, 0, 0), 0, xv, M, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(21, DT_RNG_DATA, 1, 0), 0, gv, N, -1.0f, 1.0f);
    const dt_rng_key key = dt_rng_key_make(22, DT_RNG_DROPOUT, 0, 0);
    if (specials) {
        gv[N - 3] = 1e-40f;
        gv[N - 2] = 3.3961e38f;
        gv[N - 1 - C] = -0.0f;
        const uint32_t snan = 0x7f800001u; /* signalling: rounding must quiet it, not make it infinite */
        memcpy(&gv[N - 4], &snan, 4);
    }
    int ran = 0;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        const dt_k_isa isa = test_isa_paths[pi];
        if (dt_k_set_isa(isa) != DT_OK)
            continue;
        ran++;
        dt_tensor *x[2], *g[2];
        for (int k = 0; k < 2; k++)
            ASSERT((x[k] = leaf(dt, B, T, 3 * C, xv, &g[k])) != NULL);
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, C), gv);
        size_t t0 = dt_ag_tape_len(ctx);
        dt_tensor *y = window > 0 ? dt_attention_window(ctx, x[0], (int)H, window, 0.0f)
                                  : dt_attention(ctx, x[0], (int)H, causal, p, true, key);
        ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1); /* no cast nodes */
        dt_tensor *xw = dt_cast(ctx, x[1], DT_F32);
        dt_tensor *yw = window > 0 ? dt_attention_window(ctx, xw, (int)H, window, 0.0f)
                                   : dt_attention(ctx, xw, (int)H, causal, p, true, key);
        dt_tensor *yr = dt_cast(ctx, yw, dt);
        ASSERT(y && yr && y->dtype == dt && yr->dtype == dt);
        ASSERT_MATCH(isa, dt, dt, a_path(isa, dt, A_KERNEL), y->data, yr->data, N);
        ASSERT_OK(dt_backward_with(ctx, y, R));
        ASSERT_OK(dt_backward_with(ctx, yr, R));
        ASSERT_MATCH(isa, DT_F32, dt, a_path(isa, dt, A_KERNEL), g[0]->data, g[1]->data, M);
        int odd = 0; /* qkv's gradient holds values of its dtype */
        int64_t nz = held_in_dtype(dt, g[0]->data, M, &odd);
        ASSERT_EQ_INT(odd, 0);
        ASSERT(nz > M / 2);
        for (int k = 0; k < 2; k++) {
            dt_tensor_free(x[k]);
            dt_tensor_free(g[k]);
        }
        dt_ctx_reset(ctx);
    }
    ASSERT(ran >= 1);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(xv);
    free(gv);
    dt_ctx_free(ctx);
}

TEST(attention_lp_equals_widened)
{
    gpt_case(DT_BF16, 2, 70, 3, 40, true, 0.0f, false, 0);  /* two key blocks, 32 + 8 columns */
    gpt_case(DT_BF16, 1, 37, 2, 64, false, 0.0f, false, 0); /* 64 columns, no mask */
    gpt_case(DT_BF16, 2, 20, 2, 13, true, 0.2f, false, 0);  /* dropout, scalar tail */
    gpt_case(DT_BF16, 2, 20, 2, 16, true, 0.0f, true, 0);   /* subnormal, overflow, NaN */
    gpt_case(DT_F16, 2, 33, 2, 24, true, 0.0f, false, 0);
    gpt_case(DT_F16, 2, 20, 2, 16, true, 0.0f, true, 0);
    /* sliding windows: odd and even, a key block's, no multiple of a block; the tiles from 96 tokens */
    gpt_case(DT_BF16, 2, 150, 2, 40, true, 0.0f, false, 37);
    gpt_case(DT_BF16, 1, 150, 2, 64, true, 0.0f, false, 64);
    gpt_case(DT_BF16, 2, 70, 3, 24, true, 0.0f, false, 2);
    gpt_case(DT_BF16, 2, 45, 2, 16, true, 0.0f, true, 9);
    gpt_case(DT_F16, 2, 131, 2, 24, true, 0.0f, false, 65);
}

/* Llama: q [B, T, H hd], k and v [B, T, KV hd] of dt; q and k roped, then
 * dt_gqa_pack and attention under bf16 autocast, against the same with the
 * attention's input widened; q, k, v's gradients compared. */
static void llama_case(dt_dtype dt, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd)
{
    const int64_t C = H * hd, Ck = KV * hd;
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float inv[128];
    for (int64_t i = 0; i < hd / 2; i++)
        inv[i] = 1.0f / (1.0f + (float)i * 0.37f);
    float *qv = malloc((size_t)(B * T * C) * 4), *kv = malloc((size_t)(B * T * Ck) * 4);
    float *vv = malloc((size_t)(B * T * Ck) * 4), *gv = malloc((size_t)(B * T * C) * 4);
    ASSERT(qv && kv && vv && gv);
    dt_rng_fill_uniform(dt_rng_key_make(23, DT_RNG_DATA, 0, 0), 0, qv, B * T * C, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(23, DT_RNG_DATA, 1, 0), 0, kv, B * T * Ck, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(23, DT_RNG_DATA, 2, 0), 0, vv, B * T * Ck, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(23, DT_RNG_DATA, 3, 0), 0, gv, B * T * C, -1.0f, 1.0f);
    int ran = 0;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        const dt_k_isa isa = test_isa_paths[pi];
        if (dt_k_set_isa(isa) != DT_OK)
            continue;
        ran++;
        dt_tensor *q[2], *k[2], *v[2], *gq[2], *gk[2], *gvv[2], *y[2];
        for (int r = 0; r < 2; r++) {
            ASSERT((q[r] = leaf(dt, B, T, C, qv, &gq[r])) != NULL);
            ASSERT((k[r] = leaf(dt, B, T, Ck, kv, &gk[r])) != NULL);
            ASSERT((v[r] = leaf(dt, B, T, Ck, vv, &gvv[r])) != NULL);
            dt_tensor *qkv = dt_gqa_pack(ctx, dt_rope(ctx, q[r], (int)H, inv, 0), dt_rope(ctx, k[r], (int)KV, inv, 0),
                                         v[r], (int)H, (int)KV);
            ASSERT(qkv && qkv->dtype == dt);
            if (r == 0) { /* as the model runs it: under autocast, one node */
                ASSERT_OK(dt_autocast_set(ctx, DT_BF16, NULL));
                size_t t0 = dt_ag_tape_len(ctx);
                y[0] = dt_attention(ctx, qkv, (int)H, true, 0.0f, true, (dt_rng_key){0});
                ASSERT_EQ_INT((int)(dt_ag_tape_len(ctx) - t0), 1);
                ASSERT_OK(dt_autocast_set(ctx, DT_F32, NULL));
            } else {
                y[1] = dt_cast(ctx, dt_attention(ctx, dt_cast(ctx, qkv, DT_F32), (int)H, true, 0.0f, true,
                                                 (dt_rng_key){0}),
                               dt);
            }
            ASSERT(y[r] && y[r]->dtype == dt);
        }
        ASSERT_MATCH(isa, dt, dt, a_path(isa, dt, A_KERNEL), y[0]->data, y[1]->data, B * T * C);
        dt_tensor *R = dt_tensor_from(ctx, DT_F32, 3, SH(B, T, C), gv);
        ASSERT_OK(dt_backward_with(ctx, y[0], R));
        ASSERT_OK(dt_backward_with(ctx, y[1], R));
        ASSERT_MATCH(isa, DT_F32, dt, a_path(isa, dt, A_DOWN(dt)), gq[0]->data, gq[1]->data, B * T * C);
        ASSERT_MATCH(isa, DT_F32, dt, a_path(isa, dt, A_DOWN(dt)), gk[0]->data, gk[1]->data, B * T * Ck);
        ASSERT_MATCH(isa, DT_F32, dt, a_path(isa, dt, A_DOWN(dt)), gvv[0]->data, gvv[1]->data, B * T * Ck);
        int odd = 0;
        ASSERT(held_in_dtype(dt, gk[0]->data, B * T * Ck, &odd) > B * T * Ck / 2);
        ASSERT_EQ_INT(odd, 0);
        for (int r = 0; r < 2; r++) {
            dt_tensor_free(q[r]);
            dt_tensor_free(k[r]);
            dt_tensor_free(v[r]);
            dt_tensor_free(gq[r]);
            dt_tensor_free(gk[r]);
            dt_tensor_free(gvv[r]);
        }
        dt_ctx_reset(ctx);
    }
    ASSERT(ran >= 1);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    free(qv);
    free(kv);
    free(vv);
    free(gv);
    dt_ctx_free(ctx);
}

TEST(attention_lp_llama_gqa_equals_widened)
{
    llama_case(DT_BF16, 2, 67, 4, 2, 32);
    llama_case(DT_BF16, 1, 19, 6, 3, 16);
}

/* The kernels against the widening by dt_k_convert, for a layer's middle
 * heads (h0 = 1 of 4) with dropout: y, lse and the rounded result equal
 * the f32 kernel's on the widened qkv; the backward with dy holding a
 * signalling NaN (quieted by the rounding, not made infinite), a value that
 * rounds to infinity and a subnormal equals rounding dy, the f32 backward
 * and rounding dqkv, bit for bit, on every ISA path. */
static void kernel_case(dt_dtype dt)
{
    enum { B = 2, T = 21, H = 2, D = 24, C = H * D, M = B * T * 3 * C, N = B * T * C };
    static float xv[M], yv[2][N], lse[2][B * H * T], dyv[N], dyr[N], g[2][M];
    static uint16_t x16[M], ylp[N], h16[M];
    const dt_rng_key key = dt_rng_key_make(24, DT_RNG_DROPOUT, 0, 0);
    dt_rng_fill_uniform(dt_rng_key_make(24, DT_RNG_DATA, 0, 0), 0, xv, M, -2.0f, 2.0f);
    dt_rng_fill_uniform(dt_rng_key_make(24, DT_RNG_DATA, 1, 0), 0, dyv, N, -1.0f, 1.0f);
    const uint32_t snan = 0x7f800001u;
    memcpy(&dyv[N - 1], &snan, 4);
    dyv[N - 2] = 3.3961e38f;
    dyv[N - 3] = 1e-40f;
    ASSERT_OK(dt_k_convert(xv, DT_F32, x16, dt, M));
    ASSERT_OK(dt_k_convert(x16, dt, xv, DT_F32, M)); /* the widened qkv */
    int ran = 0;
    for (size_t pi = 0; pi < TEST_NISA; pi++) {
        const dt_k_isa isa = test_isa_paths[pi];
        if (dt_k_set_isa(isa) != DT_OK)
            continue;
        ran++;
        ASSERT_OK(dt_k_attention_fwd_heads(xv, B, T, H, D, 1, 4, true, 0.1f, key, yv[0], lse[0]));
        ASSERT_OK(dt_k_convert(yv[0], DT_F32, h16, dt, N));
        for (int nt = 1; nt <= 4; nt += 3) { /* 1 thread: a task per head; 4: one per query block */
            dt_set_num_threads(nt);
            memset(yv[1], 0, sizeof yv[1]);
            memset(ylp, 0, sizeof ylp);
            ASSERT_OK(dt_k_attention_fwd_heads_lp(dt, x16, B, T, H, D, 1, 4, true, 0.1f, key, yv[1], ylp, lse[1]));
            ASSERT_MATCH(isa, DT_F32, DT_F32, a_path(isa, dt, A_KERNEL), yv[1], yv[0], N);
            ASSERT_MATCH(isa, DT_F32, DT_F32, A_KERNEL, lse[1], lse[0], B * H * T);
            ASSERT_MATCH(isa, dt, dt, a_path(isa, dt, A_KERNEL), ylp, h16, N);
        }
        dt_set_num_threads(0);
        ASSERT_OK(dt_k_convert(dyv, DT_F32, h16, dt, N));
        ASSERT_OK(dt_k_convert(h16, dt, dyr, DT_F32, N));
        ASSERT_OK(dt_k_attention_bwd_heads(xv, yv[0], lse[0], dyr, B, T, H, D, 1, 4, true, 0.1f, key, g[0]));
        ASSERT_OK(dt_k_convert(g[0], DT_F32, h16, dt, M));
        ASSERT_OK(dt_k_convert(h16, dt, g[0], DT_F32, M));
        ASSERT_OK(dt_k_attention_bwd_heads_lp(dt, x16, yv[0], lse[0], dyv, B, T, H, D, 1, 4, true, 0.1f, key, g[1], NULL));
        ASSERT_MATCH(isa, DT_F32, dt, a_path(isa, dt, A_KERNEL), g[1], g[0], M);
    }
    ASSERT(ran >= 1);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

TEST(attention_lp_kernels_equal_widened)
{
    kernel_case(DT_BF16);
    kernel_case(DT_F16);
}

/* The kernels refuse a dtype they do not read, by name. */
TEST(attention_lp_kernel_dtype)
{
    float q[6 * 3] = {0}, y[6], lse[2], g[18];
    ASSERT(dt_k_attention_fwd_heads_lp(DT_F32, q, 1, 2, 1, 3, 0, 1, false, 0.0f, (dt_rng_key){0}, y, NULL, lse) ==
           DT_ERR_DTYPE);
    ASSERT(dt_k_attention_bwd_heads_lp(DT_I32, q, y, lse, y, 1, 2, 1, 3, 0, 1, false, 0.0f, (dt_rng_key){0}, g, NULL) ==
           DT_ERR_DTYPE);
}

int main(void)
{
    RUN(attention_lp_equals_widened);
    RUN(attention_lp_llama_gqa_equals_widened);
    RUN(attention_lp_kernels_equal_widened);
    RUN(attention_lp_kernel_dtype);
    return TEST_REPORT();
}
