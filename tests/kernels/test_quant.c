/* Block quantization (dt_k_quantize_blocks / dt_k_dequantize_blocks) against
 * a plain double reference: per-block scale max|x| / qmax, the error bound
 * |x - x'| <= scale / 2 element by element, exact values where x is a
 * multiple of the scale, int4 nibble packing with odd lengths and odd block
 * sizes (blocks that share a byte), blocks of zeros exact, accumulation,
 * and NaN / Inf: the whole block dequantizes to NaN, the other blocks are
 * untouched (an overflow is never hidden). Bad arguments are refused by name. */
#include "dtrain/kernels.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void roundtrip(int64_t n, int64_t block, int bits, uint64_t seed)
{
    float *x = malloc(sizeof *x * (size_t)n), *y = malloc(sizeof *y * (size_t)n);
    int64_t nb = (n + block - 1) / block;
    float *sc = malloc(sizeof *sc * (size_t)nb);
    void *q = malloc((size_t)dt_k_quant_bytes(n, bits));
    ASSERT(x && y && sc && q);
    for (int64_t i = 0; i < n; i++)
        x[i] = frand(&seed) * (float)(1 + i % 7) * 10.0f;
    for (int64_t i = 0; i < n && i < block; i++) /* the first block: zeros */
        x[i] = 0.0f;
    ASSERT_OK(dt_k_quantize_blocks(x, n, block, bits, q, sc));
    ASSERT_OK(dt_k_dequantize_blocks(q, sc, n, block, bits, y, false));
    double qmax = bits == 8 ? 127 : 7;
    for (int64_t b = 0; b < nb; b++) {
        double amax = 0;
        for (int64_t i = b * block; i < n && i < (b + 1) * block; i++)
            amax = fmax(amax, fabs(x[i]));
        ASSERT_NEAR(sc[b], amax / qmax, 0, 1e-6);
        for (int64_t i = b * block; i < n && i < (b + 1) * block; i++) {
            ASSERT(fabs((double)y[i] - x[i]) <= sc[b] / 2 * (1 + 1e-5) + 1e-12);
            /* the reference's integer: round half to even of x / s */
            double want = sc[b] > 0 ? nearbyint(x[i] / (double)sc[b]) : 0;
            ASSERT_NEAR(y[i], want * sc[b], 1e-6 * sc[b] * qmax, 0);
        }
    }
    for (int64_t i = 0; i < n && i < block; i++)
        ASSERT_EQ_INT(y[i] == 0.0f, 1);
    /* accumulate: out = out + x', here x' + x' */
    float *y1 = malloc(sizeof *y1 * (size_t)n);
    ASSERT(y1);
    memcpy(y1, y, sizeof *y1 * (size_t)n);
    ASSERT_OK(dt_k_dequantize_blocks(q, sc, n, block, bits, y, true));
    for (int64_t i = 0; i < n; i++)
        ASSERT_NEAR(y[i], 2.0f * y1[i], 0, 0);
    free(x), free(y), free(y1), free(sc), free(q);
}

TEST(int8_blocks) { roundtrip(10007, 256, 8, 1); }
TEST(int8_one_block) { roundtrip(100, 1000, 8, 2); }
TEST(int4_even_blocks_odd_length) { roundtrip(4097, 64, 4, 3); }
TEST(int4_odd_blocks_share_bytes) { roundtrip(1001, 7, 4, 4); }

TEST(int4_packing)
{
    const float x[3] = {7.0f, -7.0f, 1.0f}; /* one block: scale 1 */
    uint8_t q[2];
    float s;
    ASSERT_OK(dt_k_quantize_blocks(x, 3, 3, 4, q, &s));
    ASSERT_NEAR(s, 1.0, 0, 0);
    ASSERT_EQ_INT(q[0], 0x97); /* 7 low, -7 = 0x9 high */
    ASSERT_EQ_INT(q[1], 0x01);
    ASSERT_EQ_INT(dt_k_quant_bytes(3, 4), 2);
    ASSERT_EQ_INT(dt_k_quant_bytes(3, 8), 3);
    ASSERT_EQ_INT(dt_k_quant_bytes(3, 2), -1);
}

TEST(nonfinite_not_hidden)
{
    for (int bits = 4; bits <= 8; bits += 4) {
        float x[12], y[12], sc[3];
        uint8_t q[12];
        for (int i = 0; i < 12; i++)
            x[i] = (float)i - 5.5f;
        x[5] = INFINITY;
        x[9] = NAN;
        ASSERT_OK(dt_k_quantize_blocks(x, 12, 4, bits, q, sc));
        ASSERT_OK(dt_k_dequantize_blocks(q, sc, 12, 4, bits, y, false));
        for (int i = 0; i < 4; i++) /* block 0 is finite */
            ASSERT(isfinite(y[i]) && fabsf(y[i] - x[i]) <= sc[0] / 2 + 1e-6f);
        for (int i = 4; i < 12; i++) /* blocks 1 (inf) and 2 (nan) */
            ASSERT(isnan(y[i]));
    }
}

TEST(bad_arguments)
{
    float x[4] = {0}, s;
    uint8_t q[4];
    ASSERT_STATUS(dt_k_quantize_blocks(x, 4, 0, 8, q, &s), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "block size");
    ASSERT_STATUS(dt_k_quantize_blocks(x, 4, 4, 3, q, &s), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "3-bit");
    ASSERT_STATUS(dt_k_dequantize_blocks(q, &s, 4, 4, 16, x, false), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_k_quantize_blocks(NULL, 4, 4, 8, q, &s), DT_ERR_NULL);
}

int main(void)
{
    RUN(int8_blocks);
    RUN(int8_one_block);
    RUN(int4_even_blocks_odd_length);
    RUN(int4_odd_blocks_share_bytes);
    RUN(int4_packing);
    RUN(nonfinite_not_hidden);
    RUN(bad_arguments);
    return TEST_REPORT();
}
