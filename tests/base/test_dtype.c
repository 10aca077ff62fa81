/* Scalar f16/bf16 conversions: exhaustive round trips and rounding against
 * a double-precision reference (also used to check the vector kernels). */
#include "dtrain/base.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

TEST(dtype_table)
{
    ASSERT_EQ_INT(dt_dtype_size(DT_BF16), 2);
    ASSERT_EQ_INT(dt_dtype_size(DT_I64), 8);
    ASSERT_STR_EQ(dt_dtype_name(DT_U8), "u8");
    dt_dtype t;
    ASSERT_OK(dt_dtype_parse("float16", &t));
    ASSERT_EQ_INT(t, DT_F16);
    ASSERT_STATUS(dt_dtype_parse("f8", &t), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "'f8'");
}

TEST(f16_roundtrip_all)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_f16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_f16(f);
        if (((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) { /* NaN: stays NaN, quiet */
            ASSERT(f != f);
            ASSERT_EQ_INT(back & 0x7e00, 0x7e00);
            ASSERT_EQ_INT(back & 0x8000, h & 0x8000);
        } else {
            ASSERT_EQ_INT(back, h);
        }
    }
}

TEST(bf16_roundtrip_all)
{
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_bf16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_bf16(f);
        if (((h >> 7) & 0xff) == 0xff && (h & 0x7f))
            ASSERT(f != f && (back & 0x40));
        else
            ASSERT_EQ_INT(back, h);
    }
}

/* Reference: the nearest f16 by exhaustive comparison in double, ties to even. */
static uint16_t f16_ref(float x)
{
    if (x != x)
        return 0x7e00;
    double ax = fabs((double)x);
    uint16_t sign = (f2u(x) >> 16) & 0x8000;
    if (ax >= 65520.0)
        return sign | 0x7c00;
    uint16_t best = 0;
    double bd = 1e300;
    /* binary search for the neighbours among positive finite f16 */
    uint16_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if ((double)dt_f16_to_f32(mid) <= ax) lo = mid; else hi = mid - 1;
    }
    for (int c = lo; c <= lo + 1 && c <= 0x7c00; c++) {
        double d = fabs((double)dt_f16_to_f32((uint16_t)c) - ax);
        if (d < bd || (d == bd && (c & 1) == 0)) { bd = d; best = (uint16_t)c; }
    }
    return sign | best;
}

TEST(f16_rounding_vs_reference)
{
    dt_rng_key k = dt_rng_key_make(9, DT_RNG_USER, 0, 0);
    for (uint64_t i = 0; i < 200000; i++) {
        uint32_t o[4];
        dt_rng_block(k, i, o);
        /* exponents spread over the f16 range and beyond, plus exact ties */
        uint32_t e = 100 + o[1] % 45;
        uint32_t m = o[2] & 0x7fffffu;
        if (i % 4 == 0) m = (m & ~0x1fffu) | 0x1000u; /* exact half-way case */
        float x = u2f((o[0] & 0x80000000u) | (e << 23) | m);
        ASSERT_EQ_INT(dt_f32_to_f16(x), f16_ref(x));
    }
    ASSERT_EQ_INT(dt_f32_to_f16(u2f(0x7f800000u)), 0x7c00);
    ASSERT_EQ_INT(dt_f32_to_f16(u2f(0xff800000u)), 0xfc00);
    ASSERT_EQ_INT(dt_f32_to_f16(65519.0f), 0x7bff);
    ASSERT_EQ_INT(dt_f32_to_f16(65520.0f), 0x7c00);
    ASSERT_EQ_INT(dt_f32_to_f16(u2f(0x33000000u)), 0);      /* 2^-25 ties to even: 0 */
    ASSERT_EQ_INT(dt_f32_to_f16(u2f(0x33000001u)), 1);
}

TEST(bf16_rounding)
{
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x3f808000u)), 0x3f80); /* tie, even stays */
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x3f808001u)), 0x3f81);
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x7f7fffffu)), 0x7f80); /* max float overflows to Inf */
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x00000001u)), 0x0000); /* smallest subnormal */
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0x00018000u)), 0x0002);
    ASSERT_EQ_INT(dt_f32_to_bf16(u2f(0xff800000u)), 0xff80);
    uint16_t n = dt_f32_to_bf16(u2f(0x7f800001u));
    ASSERT((n & 0x7f80) == 0x7f80 && (n & 0x7f));
}

/* Element load/store as double in every dtype: values that each dtype holds
 * exactly come back unchanged, f16/bf16 round to nearest even, u8 wraps
 * modulo 256, an invalid dtype loads NaN and stores nothing. */
TEST(element_load_store)
{
    unsigned char buf[4 * 8];
    const double vals[4] = {0.0, 1.0, 100.0, 7.0};
    for (int t = 0; t < DT_DTYPE_COUNT; t++) {
        memset(buf, 0, sizeof buf);
        for (size_t i = 0; i < 4; i++)
            dt_dtype_store((dt_dtype)t, buf, i, vals[i]);
        for (size_t i = 0; i < 4; i++)
            ASSERT_NEAR(dt_dtype_load((dt_dtype)t, buf, i), vals[i], 0, 0);
    }
    dt_dtype_store(DT_F16, buf, 0, 1.0 + 1.0 / 4096); /* halfway between 1 and 1 + 2^-10: even */
    ASSERT_NEAR(dt_dtype_load(DT_F16, buf, 0), 1.0, 0, 0);
    dt_dtype_store(DT_BF16, buf, 1, 3.0 / 256 + 1.0); /* 1 + 3 * 2^-8 -> 1 + 2^-6 */
    ASSERT_NEAR(dt_dtype_load(DT_BF16, buf, 1), 1.0 + 1.0 / 64, 0, 0);
    dt_dtype_store(DT_U8, buf, 2, -3.0);
    ASSERT_NEAR(dt_dtype_load(DT_U8, buf, 2), 253.0, 0, 0);
    dt_dtype_store(DT_U8, buf, 3, 300.0);
    ASSERT_NEAR(dt_dtype_load(DT_U8, buf, 3), 44.0, 0, 0);
    memset(buf, 0x5a, sizeof buf);
    dt_dtype_store((dt_dtype)99, buf, 0, 1.0);
    ASSERT(buf[0] == 0x5a);
    ASSERT(isnan(dt_dtype_load((dt_dtype)99, buf, 0)));
}

int main(void)
{
    RUN(dtype_table);
    RUN(f16_roundtrip_all);
    RUN(bf16_roundtrip_all);
    RUN(f16_rounding_vs_reference);
    RUN(bf16_rounding);
    RUN(element_load_store);
    return TEST_REPORT();
}
