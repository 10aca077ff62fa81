/* Conversion kernels: every vectorised path (AVX2 + F16C, AVX-512,
 * AVX-512 BF16) must match the scalar references of base.h bit for bit.
 *
 * Run as `test_convert PATH` (PATH = scalar, avx2, avx512, avx512_bf16; one
 * CTest registration each, tests/kernels/tests.cmake) it checks that path
 * and reports skipped (exit 77) when this CPU, as dt_cpu_detect() sees it
 * (DT_MAX_CPU_ISA included), lacks it. Without an argument it runs the
 * path-independent checks (known values, errors, the automatic choice).
 *
 * What "every bit pattern that matters" means here:
 *  - widening (f16 -> f32, bf16 -> f32): all 65536 inputs;
 *  - narrowing (f32 -> f16, f32 -> bf16): for every exponent (0..255) and
 *    both signs, mantissas that put an exact tie, one below and one above
 *    it at every bit position (so round-to-nearest-even both ways at every
 *    shift, f16 subnormal results included), with the kept lsb 0 and 1;
 *    every NaN class (quiet / signalling, payload only in the bits that f16
 *    or bf16 drop, only in the bits they keep, both); +-inf, +-0; f32
 *    subnormals (a sweep, both signs); the f16 and bf16 overflow boundaries;
 *    every f16 and bf16 value widened (they must come back); and 4 Mi random
 *    bit patterns;
 *  - lengths 0..67 at offsets 0..3 (every vector tail of 8-, 16- and
 *    32-element loops) as well as the long arrays. */
#include "dtrain/kernels.h"
#include "isa_paths.h"
#include "test.h"

#include <stdint.h>

static dt_k_isa g_path; /* the path under test */

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void put(uint32_t *u, int64_t *n, uint32_t v)
{
    u[(*n)++] = v;
}

/* The narrowing inputs described at the top; returns the count. */
static int64_t make_f32(uint32_t *u, int64_t cap)
{
    int64_t n = 0;
    (void)cap;
    static const uint32_t hi[] = {0x000000, 0x400000, 0x7fe000, 0x155555 << 1, 0x2aaaaa, 0x7f0000, 0x00e000};
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (size_t h = 0; h < sizeof hi / sizeof hi[0]; h++)
                for (int k = 0; k < 23; k++) {
                    uint32_t half = 1u << k, keep = (hi[h] >> (k + 1)) << (k + 1);
                    for (uint32_t lsb = 0; lsb < 2; lsb++) {
                        uint32_t m = (keep ^ (lsb << (k + 1))) & 0x7fffff;
                        uint32_t base = sign << 31 | e << 23;
                        put(u, &n, base | (m | half));                   /* tie */
                        put(u, &n, base | (m | (half - 1)));             /* just below */
                        put(u, &n, base | ((m | half | 1u) & 0x7fffff)); /* just above (k > 0) */
                    }
                }
    /* NaN classes: payload in the dropped bits, the kept bits, or both */
    static const uint32_t pay[] = {0x000001, 0x001fff, 0x00ffff, 0x002000, 0x010000, 0x200000, 0x3fffff,
                                   0x1fe001, 0x000040, 0x3f0000};
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t q = 0; q < 2; q++)
            for (size_t i = 0; i < sizeof pay / sizeof pay[0]; i++)
                put(u, &n, sign << 31 | 0x7f800000u | q << 22 | pay[i]);
    static const uint32_t sp[] = {
        0x7f800000, 0xff800000, 0x00000000, 0x80000000,             /* inf, zero */
        0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0xc77ff000, /* f16 max, overflow boundary */
        0x7f7f7fff, 0x7f7f8000, 0x7f7fffff, 0xff7f8000,             /* bf16 overflow boundary */
        0x38800000, 0x387fffff, 0x33000000, 0x33000001, 0x32ffffff, /* f16 min normal, half min subnormal */
        0x00800000, 0x007fffff, 0x00000001, 0x80000001};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++)
        put(u, &n, sp[i]);
    /* f32 subnormals, both signs */
    for (uint32_t i = 0; i < 8192; i++) {
        uint32_t m = (i * 1021u + (i >> 3)) & 0x7fffff;
        put(u, &n, m ? m : 1);
        put(u, &n, 0x80000000u | (m ? m : 1));
    }
    /* every f16 and bf16 value, widened */
    for (uint32_t i = 0; i < 65536; i++) {
        put(u, &n, bits(dt_f16_to_f32((uint16_t)i)));
        put(u, &n, i << 16);
    }
    /* random bit patterns */
    dt_rng_key key = dt_rng_key_make(42, DT_RNG_USER, 0, 0);
    for (uint64_t c = 0; c < (4u << 20) / 4; c++) {
        uint32_t out[4];
        dt_rng_block(key, c, out);
        for (int j = 0; j < 4; j++)
            put(u, &n, out[j]);
    }
    put(u, &n, 0x3f808000); /* odd count: a tail on every path */
    return n;
}

#define F32_CAP ((int64_t)6 << 20)

static void check_narrow(const float *x, int64_t n, const char *what)
{
    uint16_t *a = dt_alloc((size_t)n * 2 + 16), *b = dt_alloc((size_t)n * 2 + 16);
    ASSERT(a && b);
    ASSERT_OK(dt_k_f32_to_f16(x, a, n));
    ASSERT_OK(dt_k_f32_to_bf16(x, b, n));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t rf = dt_f32_to_f16(x[i]), rb = dt_f32_to_bf16(x[i]);
        if ((a[i] != rf || b[i] != rb) && bad++ < 5)
            fprintf(stderr, "  %s %s: f32 %08x -> f16 %04x (want %04x), bf16 %04x (want %04x)\n",
                    dt_k_isa_name(g_path), what, bits(x[i]), a[i], rf, b[i], rb);
    }
    dt_free(a);
    dt_free(b);
    if (bad)
        TEST_FAIL_("%s: %lld of %lld inputs differ from the scalar reference", what, (long long)bad, (long long)n);
}

TEST(narrow_bit_patterns)
{
    uint32_t *u = dt_alloc((size_t)F32_CAP * 4);
    ASSERT(u);
    int64_t n = make_f32(u, F32_CAP);
    ASSERT(n <= F32_CAP);
    float *x = (float *)(void *)u;
    check_narrow(x, n, "all patterns");
    if (dt_test_failed_)
        goto out;
    /* tails: lengths 0..67 at offsets 0..3, over the special part */
    for (int off = 0; off < 4; off++)
        for (int64_t len = 0; len < 68; len++) {
            check_narrow(x + 4096 * off + len * 13 + off, len, "tail");
            if (dt_test_failed_)
                goto out;
        }
out:
    dt_free(u);
}

static void check_widen(const uint16_t *h, int64_t n, bool half)
{
    float *y = dt_alloc((size_t)n * 4 + 16);
    ASSERT(y);
    ASSERT_OK(half ? dt_k_f16_to_f32(h, y, n) : dt_k_bf16_to_f32(h, y, n));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        float r = half ? dt_f16_to_f32(h[i]) : dt_bf16_to_f32(h[i]);
        if (bits(r) != bits(y[i]) && bad++ < 5)
            fprintf(stderr, "  %s: %s %04x -> %08x, want %08x\n", dt_k_isa_name(g_path), half ? "f16" : "bf16", h[i],
                    bits(y[i]), bits(r));
    }
    dt_free(y);
    if (bad)
        TEST_FAIL_("%s -> f32: %lld of %lld differ from the scalar reference", half ? "f16" : "bf16",
                   (long long)bad, (long long)n);
}

TEST(widen_exhaustive)
{
    uint16_t *h = dt_alloc(65536 * 2 + 16);
    ASSERT(h);
    for (int i = 0; i < 65536; i++)
        h[i] = (uint16_t)(i * 40503u); /* all 65536 values, in a scrambled order */
    for (int half = 0; half < 2; half++) {
        check_widen(h, 65536, half);
        for (int off = 0; off < 4 && !dt_test_failed_; off++)
            for (int64_t len = 0; len < 68 && !dt_test_failed_; len++)
                check_widen(h + 1000 * off + len + off, len, half);
        if (dt_test_failed_)
            break;
    }
    dt_free(h);
}

/* Large arrays are split over threads in chunks: the same bits. */
TEST(threaded_split)
{
    int64_t n = (1 << 18) + 37;
    float *x = dt_alloc((size_t)n * 4);
    ASSERT(x);
    dt_rng_fill_normal(dt_rng_key_make(5, DT_RNG_USER, 0, 0), 0, x, (size_t)n, 0.0f, 1000.0f);
    check_narrow(x, n, "threaded");
    dt_free(x);
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

/* dt_k_first_nonfinite on the path under test: for each dtype, every
 * non-finite class (+-Inf, quiet and signalling NaNs; the largest finite
 * value next to them is finite) planted alone at every position of short
 * arrays (every vector tail) and at positions of a long, threaded one, and
 * two planted at once (the first is named); the scalar loop's answer is the
 * reference. */
TEST(first_nonfinite)
{
    static const dt_dtype dts[3] = {DT_F32, DT_BF16, DT_F16};
    static const uint32_t bad[3][4] = {{0x7f800000u, 0xff800000u, 0x7fc00001u, 0xff800001u},
                                       {0x7f80u, 0xff80u, 0x7fc1u, 0xff81u},
                                       {0x7c00u, 0xfc00u, 0x7e01u, 0xfc01u}};
    static const uint32_t big[3] = {0x7f7fffffu, 0x7f7fu, 0x7bffu};
    const int64_t n_long = (1 << 18) + 77;
    void *buf = dt_alloc((size_t)n_long * 4);
    ASSERT(buf);
    for (int d = 0; d < 3; d++) {
        const int es = d == 0 ? 4 : 2;
        for (int64_t n = 0; n <= 300; n += n < 140 ? 1 : 37) {
            for (int64_t i = 0; i < n; i++) { /* finite values, the largest among them */
                uint32_t v = i % 5 == 0 ? big[d] : (uint32_t)(i * 2654435761u) & (es == 4 ? 0x3fffffffu : 0x3fffu);
                if (es == 4)
                    ((uint32_t *)buf)[i] = v;
                else
                    ((uint16_t *)buf)[i] = (uint16_t)v;
            }
            ASSERT_EQ_INT(dt_k_first_nonfinite(buf, dts[d], n), n);
            for (int64_t at = 0; at < n; at++)
                for (int k = 0; k < 4; k++) {
                    char *cell = (char *)buf + at * es;
                    uint32_t keep = 0;
                    memcpy(&keep, cell, (size_t)es);
                    memcpy(cell, &bad[d][k], (size_t)es);
                    int64_t got = dt_k_first_nonfinite(buf, dts[d], n);
                    memcpy(cell, &keep, (size_t)es);
                    if (got != at)
                        TEST_FAIL_("%s n=%lld: the non-finite element at %lld reported at %lld", dt_dtype_name(dts[d]),
                                   (long long)n, (long long)at, (long long)got);
                }
        }
        /* lengths from 4 KiB on (the AVX-512 path reads those in four
         * streams, then locates a hit in order): one planted at positions
         * all over each quarter, the blocks after the last whole quarter and
         * the sub-block tail; and one planted late with another early */
        for (int64_t n = 4096 / es; n <= 16384 / es + 200; n += 4096 / es + 67) {
            for (int64_t i = 0; i < n; i++) {
                uint32_t v = i % 7 == 0 ? big[d] : (uint32_t)(i * 2654435761u) & (es == 4 ? 0x3fffffffu : 0x3fffu);
                memcpy((char *)buf + i * es, &v, (size_t)es);
            }
            ASSERT_EQ_INT(dt_k_first_nonfinite(buf, dts[d], n), n);
            for (int64_t at = 0; at < n; at += at + 80 >= n ? 1 : 13)
                for (int k = 0; k < 4; k++) {
                    char *cell = (char *)buf + at * es;
                    uint32_t keep = 0;
                    memcpy(&keep, cell, (size_t)es);
                    memcpy(cell, &bad[d][k], (size_t)es);
                    int64_t got = dt_k_first_nonfinite(buf, dts[d], n);
                    if (at > 0 && k == 0) { /* a second one earlier: named instead */
                        char *early = (char *)buf + (at / 3) * es;
                        uint32_t ke = 0;
                        memcpy(&ke, early, (size_t)es);
                        memcpy(early, &bad[d][1], (size_t)es);
                        int64_t got2 = dt_k_first_nonfinite(buf, dts[d], n);
                        memcpy(early, &ke, (size_t)es);
                        if (got2 != at / 3)
                            TEST_FAIL_("%s n=%lld: non-finite elements at %lld and %lld reported at %lld",
                                       dt_dtype_name(dts[d]), (long long)n, (long long)(at / 3), (long long)at,
                                       (long long)got2);
                    }
                    memcpy(cell, &keep, (size_t)es);
                    if (got != at)
                        TEST_FAIL_("%s n=%lld: the non-finite element at %lld reported at %lld", dt_dtype_name(dts[d]),
                                   (long long)n, (long long)at, (long long)got);
                }
        }
        memset(buf, 0, (size_t)n_long * (size_t)es);
        ASSERT_EQ_INT(dt_k_first_nonfinite(buf, dts[d], n_long), n_long);
        const int64_t at[4] = {n_long - 1, 5 * (1 << 15) + 1, (1 << 16) + 3, 63};
        for (int k = 0; k < 4; k++) { /* planted one by one, each earlier than the last */
            memcpy((char *)buf + at[k] * es, &bad[d][k], (size_t)es);
            ASSERT_EQ_INT(dt_k_first_nonfinite(buf, dts[d], n_long), at[k]);
        }
        ASSERT_EQ_INT(dt_k_first_nonfinite(NULL, dts[d], 5), 5);
        ASSERT_EQ_INT(dt_k_first_nonfinite(buf, DT_I32, 5), 5);
        ASSERT_EQ_INT(dt_k_first_nonfinite(buf, dts[d], -3), 0);
    }
    dt_free(buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        bool found = false;
        for (size_t i = 0; i < TEST_NISA; i++)
            if (!strcmp(argv[1], dt_k_isa_name(test_isa_paths[i])))
                g_path = test_isa_paths[i], found = true;
        if (!found) {
            fprintf(stderr, "usage: test_convert [scalar|avx2|avx512|avx512_bf16]\n");
            return 2;
        }
        char feat[256];
        if (dt_k_set_isa(g_path) < 0) {
            printf("path %s: not on this CPU (features: %s; DT_MAX_CPU_ISA=%s): skipped\n", argv[1],
                   dt_cpu_features_str(dt_cpu_detect(), feat, sizeof feat), dt_cpu_isa_cap_name(dt_cpu_max_isa()));
            return DT_TEST_SKIP_CODE;
        }
        fprintf(stderr, "path under test: %s\n", dt_k_isa_name(dt_k_get_isa()));
        RUN(widen_exhaustive);
        RUN(narrow_bit_patterns);
        RUN(threaded_split);
        RUN(first_nonfinite);
        return TEST_REPORT();
    }
    fprintf(stderr, "conversion path in use: %s\n", dt_k_isa_name(dt_k_get_isa()));
    g_path = dt_k_get_isa();
    RUN(known_values);
    RUN(convert_generic_and_errors);
    RUN(threaded_split);
    return TEST_REPORT();
}
