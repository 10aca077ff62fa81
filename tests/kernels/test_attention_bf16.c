/* Attention over a bf16 qkv on the avx512_bf16 path (dt_k_set_isa; skipped
 * where the CPU lacks AVX512_BF16): the probabilities are rounded to bf16
 * before they multiply v (vdpbf16ps, as kernels.h states), and what the
 * causal mask hides stays hidden although the products run on pairs of
 * rows (a masked key or row beside a visible one in a pair). The bound
 * against the f32 reference on every path is tests/autograd/test_attention_lp. */
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>
#include <string.h>

static float bf16_of(float x)
{
    uint16_t h;
    float r = NAN;
    if (dt_k_convert(&x, DT_F32, &h, DT_BF16, 1) < 0 || dt_k_convert(&h, DT_BF16, &r, DT_F32, 1) < 0)
        return NAN;
    return r;
}

/* v one-hot (v_j = e_j), no mask: y_i[j] = E_ij / l_i with E_ij = exp(s_ij
 * - max) rounded to bf16 and E = 1 for the largest score, so y_i[j] / max_j
 * y_i[j] is a bf16 value (within the one rounding of y). With E in f32
 * (the other paths) almost none is. */
TEST(attention_bf16_rounds_probabilities)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    enum { T = 16, D = 16, C3 = 3 * D };
    static float x[T * C3], y[T * D], lse[T];
    static uint16_t xh[T * C3];
    dt_rng_fill_uniform(dt_rng_key_make(31, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
    for (int j = 0; j < T; j++)
        for (int d = 0; d < D; d++)
            x[j * C3 + 2 * D + d] = d == j ? 1.0f : 0.0f;
    ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
    ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, 1, D, 0, 1, false, 0.0f, (dt_rng_key){0}, y, NULL, lse));
    int off = 0;
    for (int i = 0; i < T; i++) {
        float inv = 0.0f;
        for (int j = 0; j < T; j++)
            inv = y[i * D + j] > inv ? y[i * D + j] : inv;
        ASSERT(inv > 0.0f);
        for (int j = 0; j < T; j++) {
            double e = (double)y[i * D + j] / inv, r = bf16_of((float)e);
            off += !(fabs(e - r) <= 0x1p-22 * e);
        }
    }
    ASSERT_EQ_INT(off, 0);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

/* Causal, T odd and even: an infinite value in the last key's k and v (head
 * 1) and in the first row's q and dy (head 0). The products pair keys (2m, 2m + 1) and rows (2m,
 * 2m + 1), so a row that does not see the last key and a key that row 0
 * does not reach share a pair with them: y, lse and dqkv are NaN exactly
 * where the f32 kernel on the widened qkv gives NaN, and finite elsewhere. */
TEST(attention_bf16_mask_hides_nonfinite)
{
    if (dt_k_set_isa(DT_K_ISA_AVX512_BF16) != DT_OK)
        DT_TEST_SKIP("no avx512_bf16 path on this CPU (or capped by DT_MAX_CPU_ISA)");
    for (int T = 69; T <= 70; T++) {
        enum { TM = 70, H = 2, D = 24, C = H * D, C3 = 3 * C };
        static float x[TM * C3], dy[TM * C], y[2][TM * C], lse[2][H * TM], g[2][TM * C3];
        static uint16_t xh[TM * C3];
        dt_rng_fill_uniform(dt_rng_key_make(32, DT_RNG_DATA, 0, 0), 0, x, T * C3, -2.0f, 2.0f);
        dt_rng_fill_uniform(dt_rng_key_make(32, DT_RNG_DATA, 1, 0), 0, dy, T * C, -1.0f, 1.0f);
        for (int d = D; d < C; d++) { /* head 1: the last key */
            x[(T - 1) * C3 + C + d] = INFINITY;
            x[(T - 1) * C3 + 2 * C + d] = INFINITY;
        }
        x[3] = INFINITY; /* head 0: row 0's q and dy */
        dy[5] = INFINITY;
        ASSERT_OK(dt_k_convert(x, DT_F32, xh, DT_BF16, T * C3));
        const dt_k_isa paths[2] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX512_BF16}; /* the reference: scalar, bit exact */
        for (int r = 0; r < 2; r++) {
            ASSERT_OK(dt_k_set_isa(paths[r]));
            ASSERT_OK(dt_k_attention_fwd_heads_lp(DT_BF16, xh, 1, T, H, D, 0, H, true, 0.0f, (dt_rng_key){0}, y[r],
                                                  NULL, lse[r]));
            ASSERT_OK(dt_k_attention_bwd_heads_lp(DT_BF16, xh, y[0], lse[0], dy, 1, T, H, D, 0, H, true, 0.0f,
                                                  (dt_rng_key){0}, g[r], NULL));
        }
        int64_t nan_y = 0, nan_g = 0, diff = 0;
        for (int64_t i = 0; i < (int64_t)T * C; i++) {
            nan_y += isnan(y[0][i]);
            diff += isnan(y[0][i]) != isnan(y[1][i]) || isinf(y[0][i]) != isinf(y[1][i]);
        }
        for (int64_t i = 0; i < (int64_t)H * T; i++)
            diff += isnan(lse[0][i]) != isnan(lse[1][i]);
        for (int64_t i = 0; i < (int64_t)T * C3; i++) {
            nan_g += isnan(g[0][i]);
            diff += isnan(g[0][i]) != isnan(g[1][i]) || isinf(g[0][i]) != isinf(g[1][i]);
        }
        ASSERT(nan_y > 0 && nan_y < T * C / 2); /* the case does reach NaN, not everywhere */
        ASSERT(nan_g > 0 && nan_g < T * C3 / 2);
        ASSERT_EQ_INT((long long)diff, 0);
    }
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
}

int main(void)
{
    RUN(attention_bf16_rounds_probabilities);
    RUN(attention_bf16_mask_hides_nonfinite);
    return TEST_REPORT();
}
