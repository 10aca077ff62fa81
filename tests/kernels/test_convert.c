/* Conversion kernels: every available path (scalar, AVX2, AVX-512) must
 * match the scalar references of base.h bit for bit, exhaustively over all
 * 65536 half patterns and over many random and special f32 bit patterns. */
#include "dtrain/kernels.h"
#include "test.h"

#include <stdint.h>

static const dt_k_isa ISAS[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512};

/* Random f32 bit patterns plus specials: zeros, subnormals, rounding ties,
 * the f16 overflow boundary, NaNs with payloads (quiet and signalling). */
static float *make_f32(int64_t *n_out)
{
    int64_t n = 1 << 20;
    float *x = dt_alloc((size_t)n * sizeof(float));
    uint32_t *u = (uint32_t *)x;
    uint32_t out[4];
    dt_rng_key k = dt_rng_key_make(42, DT_RNG_USER, 0, 0);
    for (int64_t i = 0; i < n; i += 4) {
        dt_rng_block(k, (uint64_t)i / 4, out);
        for (int j = 0; j < 4; j++)
            u[i + j] = out[j];
    }
    static const uint32_t sp[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000, 0x7f800000, 0xff800000, 0x7fc00000,
        0xffc00000, 0x7f800001, 0xff800001, 0x7fa00000, 0x7fbfffff, 0x477ff000, 0x477fefff, 0x477fe000,
        0xc77ff000, 0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x3f808000,
        0x3f818000, 0x3f807fff, 0x3f800001, 0x7f7fffff, 0xff7fffff, 0x3f801000, 0x3f803000, 0x34000000,
        0x35800000, 0x35c00000, 0x007fffff, 0x00008000, 0x7f7f8000, 0x7f7f7fff};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        u[i * 7] = sp[i];
    /* A dense sweep around the f16 normal/subnormal boundary and small values. */
    for (int64_t i = 0; i < 65536; i++)
        u[300000 + i] = 0x33000000u + (uint32_t)i * 97u;
    /* f32 subnormals for the bf16 path (vcvtneps2bf16 flushes them). */
    for (int64_t i = 0; i < 4096; i++)
        u[400000 + i] = ((uint32_t)i * 2053u) & 0x807fffffu;
    *n_out = n;
    return x;
}

TEST(f16_to_f32_exhaustive)
{
    uint16_t *h = dt_alloc(65536 * 2 + 2);
    float *y = dt_alloc(65536 * 4 + 4);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (size_t k = 0; k < 3; k++) {
        if (dt_k_set_isa(ISAS[k]) < 0)
            continue;
        /* odd lengths and offsets exercise the scalar tails */
        ASSERT_OK(dt_k_f16_to_f32(h, y, 65536));
        for (int i = 0; i < 65536; i++) {
            float r = dt_f16_to_f32((uint16_t)i);
            if (memcmp(&r, &y[i], 4)) {
                uint32_t got, want;
                memcpy(&got, &y[i], 4);
                memcpy(&want, &r, 4);
                TEST_FAIL_("isa %s: half 0x%04x -> %08x, want %08x", dt_k_isa_name(ISAS[k]), i, got, want);
            }
        }
        ASSERT_OK(dt_k_f16_to_f32(h + 1, y + 1, 65535 - 6));
        for (int i = 1; i < 65530; i++) {
            float r = dt_f16_to_f32((uint16_t)i);
            ASSERT(!memcmp(&r, &y[i], 4));
        }
    }
    dt_k_set_isa(DT_K_ISA_AUTO);
    dt_free(h);
    dt_free(y);
}

TEST(bf16_to_f32_exhaustive)
{
    uint16_t *h = dt_alloc(65536 * 2);
    float *y = dt_alloc(65536 * 4);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    for (size_t k = 0; k < 3; k++) {
        if (dt_k_set_isa(ISAS[k]) < 0)
            continue;
        ASSERT_OK(dt_k_bf16_to_f32(h, y, 65536));
        for (int i = 0; i < 65536; i++) {
            float r = dt_bf16_to_f32((uint16_t)i);
            ASSERT(!memcmp(&r, &y[i], 4));
        }
    }
    dt_k_set_isa(DT_K_ISA_AUTO);
    dt_free(h);
    dt_free(y);
}

TEST(f32_to_half_all_paths)
{
    int64_t n;
    float *x = make_f32(&n);
    uint16_t *a = dt_alloc((size_t)n * 2), *b = dt_alloc((size_t)n * 2);
    /* Every half pattern widened to f32 must narrow back to itself
     * (NaNs come back quieted, as the reference says). */
    float *hx = dt_alloc(65536 * 4);
    for (int i = 0; i < 65536; i++)
        hx[i] = dt_f16_to_f32((uint16_t)i);
    int tested = 0;
    for (size_t k = 0; k < 3; k++) {
        if (dt_k_set_isa(ISAS[k]) < 0)
            continue;
        tested++;
        ASSERT_OK(dt_k_f32_to_f16(x, a, n));
        ASSERT_OK(dt_k_f32_to_bf16(x, b, n));
        for (int64_t i = 0; i < n; i++) {
            uint16_t rf = dt_f32_to_f16(x[i]), rb = dt_f32_to_bf16(x[i]);
            if (a[i] != rf)
                TEST_FAIL_("isa %s f16: f32 %08x -> %04x, want %04x", dt_k_isa_name(ISAS[k]),
                           ((uint32_t *)x)[i], a[i], rf);
            if (b[i] != rb)
                TEST_FAIL_("isa %s bf16: f32 %08x -> %04x, want %04x", dt_k_isa_name(ISAS[k]),
                           ((uint32_t *)x)[i], b[i], rb);
        }
        ASSERT_OK(dt_k_f32_to_f16(hx, a, 65536));
        for (int i = 0; i < 65536; i++) {
            uint16_t want = dt_f32_to_f16(hx[i]);
            ASSERT_EQ_INT(a[i], want);
            if ((i & 0x7c00) != 0x7c00 || !(i & 0x3ff))
                ASSERT_EQ_INT(a[i], i); /* non-NaN halfs round-trip exactly */
        }
    }
    ASSERT(tested >= 1);
    dt_k_set_isa(DT_K_ISA_AUTO);
    dt_free(x);
    dt_free(a);
    dt_free(b);
    dt_free(hx);
}

TEST(known_values)
{
    float x[6] = {1.0f, -2.5f, 65504.0f, 65520.0f, 5.9604645e-08f, 1.00390625f};
    uint16_t h[6], bb[6];
    ASSERT_OK(dt_k_f32_to_f16(x, h, 6));
    ASSERT_EQ_INT(h[0], 0x3c00);
    ASSERT_EQ_INT(h[1], 0xc100);
    ASSERT_EQ_INT(h[2], 0x7bff);
    ASSERT_EQ_INT(h[3], 0x7c00); /* rounds to Inf */
    ASSERT_EQ_INT(h[4], 0x0001); /* smallest subnormal */
    ASSERT_OK(dt_k_f32_to_bf16(x, bb, 6));
    ASSERT_EQ_INT(bb[0], 0x3f80);
    ASSERT_EQ_INT(bb[5], 0x3f80); /* 1 + 2^-8 is a tie: rounds to even */
}

TEST(convert_generic_and_errors)
{
    float x[5] = {1.5f, -0.25f, 3.0f, 1e-3f, 7.0f}, y[5];
    uint16_t h[5], b[5];
    ASSERT_OK(dt_k_convert(x, DT_F32, h, DT_F16, 5));
    ASSERT_OK(dt_k_convert(h, DT_F16, b, DT_BF16, 5));
    ASSERT_OK(dt_k_convert(b, DT_BF16, y, DT_F32, 5));
    for (int i = 0; i < 5; i++)
        ASSERT_EQ_INT(b[i], dt_f32_to_bf16(dt_f16_to_f32(h[i])));
    ASSERT_NEAR(y[0], 1.5, 0, 0);
    ASSERT_STATUS(dt_k_convert(x, DT_I32, y, DT_F32, 5), DT_ERR_UNSUPPORTED);
    ASSERT_STATUS(dt_k_f32_to_f16(NULL, h, 5), DT_ERR_NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "NULL");
    ASSERT_STATUS(dt_k_f32_to_f16(x, h, -1), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_k_f32_to_f16(NULL, NULL, 0));
    ASSERT_STATUS(dt_k_set_isa((dt_k_isa)99), DT_ERR_INVALID_ARG);
    dt_cpu_features f = dt_cpu_detect();
    if (!f.avx512f)
        ASSERT_STATUS(dt_k_set_isa(DT_K_ISA_AVX512), DT_ERR_UNSUPPORTED);
    ASSERT_OK(dt_k_set_isa(DT_K_ISA_AUTO));
    ASSERT(dt_k_get_isa() != DT_K_ISA_AUTO);
}

int main(void)
{
    fprintf(stderr, "conversion path in use: %s\n", dt_k_isa_name(dt_k_get_isa()));
    RUN(f16_to_f32_exhaustive);
    RUN(bf16_to_f32_exhaustive);
    RUN(f32_to_half_all_paths);
    RUN(known_values);
    RUN(convert_generic_and_errors);
    return TEST_REPORT();
}
