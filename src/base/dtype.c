/* dtype sizes and names, and scalar f16/bf16 conversions.
 *
 * The conversions are the reference the vectorised kernels are tested
 * against: round-to-nearest-even on the dropped bits, NaN stays NaN (made
 * quiet, sign kept), overflow goes to Inf, and f16 subnormals are produced
 * and consumed exactly. */
#include "dtrain/base.h"

#include <math.h>
#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = {"f32", 4}, [DT_F64] = {"f64", 8}, [DT_F16] = {"f16", 2}, [DT_BF16] = {"bf16", 2},
    [DT_I32] = {"i32", 4}, [DT_I64] = {"i64", 8}, [DT_U8] = {"u8", 1},
};
_Static_assert(DT_DTYPE_COUNT == 7, "update the dtype table");

size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].size : 0; }
const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].name : "?"; }

double dt_dtype_load(dt_dtype t, const void *buf, size_t i)
{
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    case DT_U8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

void dt_dtype_store(dt_dtype t, void *buf, size_t i, double v)
{
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case DT_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break; /* wraps, e.g. -3 -> 253 */
    default: break;
    }
}

dt_status dt_dtype_parse(const char *s, dt_dtype *out)
{
    static const struct { const char *alias; dt_dtype t; } aliases[] = {
        {"f32", DT_F32},  {"float32", DT_F32}, {"fp32", DT_F32}, {"float", DT_F32},
        {"f64", DT_F64},  {"float64", DT_F64}, {"fp64", DT_F64}, {"double", DT_F64},
        {"f16", DT_F16},  {"float16", DT_F16}, {"fp16", DT_F16}, {"half", DT_F16},
        {"bf16", DT_BF16}, {"bfloat16", DT_BF16}, {"i32", DT_I32}, {"int32", DT_I32},
        {"i64", DT_I64},  {"int64", DT_I64},   {"u8", DT_U8},    {"uint8", DT_U8},
    };
    for (size_t i = 0; s && i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(s, aliases[i].alias)) {
            if (out)
                *out = aliases[i].t;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown dtype '%s' (expected f32, f64, f16, bf16, i32, i64 or u8)",
                    s ? s : "(null)");
}

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dt_f32_to_bf16(float x)
{
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)           /* NaN: keep sign and payload top, make quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);                /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float dt_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t dt_f32_to_f16(float x)
{
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                             /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                            /* >= 65520 rounds to Inf (also Inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {                           /* below 2^-14: f16 subnormal or zero */
        if (a < 0x33000000u)                         /* < 2^-25: rounds to zero */
            return sign;
        uint32_t e = a >> 23;                        /* biased f32 exponent, 102..112 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                    /* value = m * 2^(e-150); f16 unit 2^-24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias exponent (127 -> 15) and round the 13 dropped bits */
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float dt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return u2f(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return u2f(sign);
        /* subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}
