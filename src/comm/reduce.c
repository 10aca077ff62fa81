/* Reduction kernels for collectives: dst = op(src0, src1, ...) over raw
 * buffers, in blocks that stay in L1 so that dst may alias a source.
 *
 * Sources are combined in array order, so a given algorithm gives the same
 * bits on every run. f16/bf16 are widened to f32, combined, and rounded
 * once (round to nearest even). Integer sum/prod wrap around (computed in
 * unsigned arithmetic, no undefined overflow); integer avg truncates. */
#include "comm/backend.h"

#include <string.h>

#define BLK 256

static inline float bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static inline uint16_t f32_to_bf16(float x)
{
    union { float f; uint32_t u; } v = {.f = x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, keep sign */
        return (uint16_t)((v.u >> 16) | 0x40);
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* Combine n = count (<= BLK) values of source s into acc. */
#define COMBINE_LOOP(T, acc, s, m, op)                                                             \
    switch (op) {                                                                                  \
    case DT_REDUCE_SUM:                                                                            \
    case DT_REDUCE_AVG:                                                                            \
        for (size_t j = 0; j < (m); j++)                                                           \
            (acc)[j] = (T)((acc)[j] + (s)[j]);                                                     \
        break;                                                                                     \
    case DT_REDUCE_PROD:                                                                           \
        for (size_t j = 0; j < (m); j++)                                                           \
            (acc)[j] = (T)((acc)[j] * (s)[j]);                                                     \
        break;                                                                                     \
    case DT_REDUCE_MAX:                                                                            \
        for (size_t j = 0; j < (m); j++)                                                           \
            (acc)[j] = (s)[j] > (acc)[j] ? (s)[j] : (acc)[j];                                      \
        break;                                                                                     \
    case DT_REDUCE_MIN:                                                                            \
        for (size_t j = 0; j < (m); j++)                                                           \
            (acc)[j] = (s)[j] < (acc)[j] ? (s)[j] : (acc)[j];                                      \
        break;                                                                                     \
    default:                                                                                       \
        break;                                                                                     \
    }

/* Floating types reduce directly. */
#define DEF_FLOAT(NAME, T)                                                                         \
    static void NAME(dt_reduce_op op, T *dst, const void *const *srcs, int n, size_t count,        \
                     int div)                                                                      \
    {                                                                                              \
        T acc[BLK];                                                                                \
        for (size_t i = 0; i < count; i += BLK) {                                                  \
            size_t m = count - i < BLK ? count - i : BLK;                                          \
            memcpy(acc, (const T *)srcs[0] + i, m * sizeof(T));                                    \
            for (int k = 1; k < n; k++) {                                                          \
                const T *s = (const T *)srcs[k] + i;                                               \
                COMBINE_LOOP(T, acc, s, m, op)                                                     \
            }                                                                                      \
            if (div)                                                                               \
                for (size_t j = 0; j < m; j++)                                                     \
                    acc[j] = acc[j] / (T)div;                                                      \
            memcpy(dst + i, acc, m * sizeof(T));                                                   \
        }                                                                                          \
    }
DEF_FLOAT(red_f32, float)
DEF_FLOAT(red_f64, double)

/* Integers: U is the unsigned twin used for wrapping sum/prod. */
#define DEF_INT(NAME, T, U)                                                                        \
    static void NAME(dt_reduce_op op, T *dst, const void *const *srcs, int n, size_t count,        \
                     int div)                                                                      \
    {                                                                                              \
        T acc[BLK];                                                                                \
        for (size_t i = 0; i < count; i += BLK) {                                                  \
            size_t m = count - i < BLK ? count - i : BLK;                                          \
            memcpy(acc, (const T *)srcs[0] + i, m * sizeof(T));                                    \
            for (int k = 1; k < n; k++) {                                                          \
                const T *s = (const T *)srcs[k] + i;                                               \
                if (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG) {                                  \
                    for (size_t j = 0; j < m; j++)                                                 \
                        acc[j] = (T)((U)acc[j] + (U)s[j]);                                         \
                } else if (op == DT_REDUCE_PROD) {                                                 \
                    for (size_t j = 0; j < m; j++)                                                 \
                        acc[j] = (T)((U)acc[j] * (U)s[j]);                                         \
                } else if (op == DT_REDUCE_MAX) {                                                  \
                    for (size_t j = 0; j < m; j++)                                                 \
                        acc[j] = s[j] > acc[j] ? s[j] : acc[j];                                    \
                } else {                                                                           \
                    for (size_t j = 0; j < m; j++)                                                 \
                        acc[j] = s[j] < acc[j] ? s[j] : acc[j];                                    \
                }                                                                                  \
            }                                                                                      \
            if (div)                                                                               \
                for (size_t j = 0; j < m; j++)                                                     \
                    acc[j] = (T)(acc[j] / (int64_t)div);                                                 \
            memcpy(dst + i, acc, m * sizeof(T));                                                   \
        }                                                                                          \
    }
DEF_INT(red_i32, int32_t, uint32_t)
DEF_INT(red_i64, int64_t, uint64_t)
DEF_INT(red_u8, uint8_t, uint32_t)

/* 16-bit floats: widen, combine in f32, round once. */
static void red_half(int is_bf16, dt_reduce_op op, uint16_t *dst, const void *const *srcs, int n,
                     size_t count, int div)
{
    float acc[BLK], tmp[BLK];
    for (size_t i = 0; i < count; i += BLK) {
        size_t m = count - i < BLK ? count - i : BLK;
        for (int k = 0; k < n; k++) {
            const uint16_t *s = (const uint16_t *)srcs[k] + i;
            float *t = k ? tmp : acc;
            if (is_bf16)
                for (size_t j = 0; j < m; j++)
                    t[j] = bf16_to_f32(s[j]);
            else
                for (size_t j = 0; j < m; j++)
                    t[j] = dt_f16_to_f32(s[j]);
            if (k) {
                COMBINE_LOOP(float, acc, tmp, m, op)
            }
        }
        if (div)
            for (size_t j = 0; j < m; j++)
                acc[j] /= (float)div;
        if (is_bf16)
            for (size_t j = 0; j < m; j++)
                dst[i + j] = f32_to_bf16(acc[j]);
        else
            for (size_t j = 0; j < m; j++)
                dst[i + j] = dt_f32_to_f16(acc[j]);
    }
}

void dt__reduce(dt_dtype dt, dt_reduce_op op, void *dst, const void *const *srcs, int nsrc,
                size_t count, int avg_div)
{
    int div = op == DT_REDUCE_AVG ? avg_div : 0;
    if (nsrc < 1 || count == 0)
        return;
    if (dt == DT_F32 && (op == DT_REDUCE_SUM || op == DT_REDUCE_AVG)) {
        float *d = dst;
        dt__reduce_f32_multi(&d, 1, (const float *const *)srcs, nsrc, count, div, 0);
        return;
    }
    switch (dt) {
    case DT_F32: red_f32(op, dst, srcs, nsrc, count, div); break;
    case DT_F64: red_f64(op, dst, srcs, nsrc, count, div); break;
    case DT_F16: red_half(0, op, dst, srcs, nsrc, count, div); break;
    case DT_BF16: red_half(1, op, dst, srcs, nsrc, count, div); break;
    case DT_I32: red_i32(op, dst, srcs, nsrc, count, div); break;
    case DT_I64: red_i64(op, dst, srcs, nsrc, count, div); break;
    case DT_U8: red_u8(op, dst, srcs, nsrc, count, div); break;
    default: break;
    }
}

void dt__avg_finish(dt_dtype dt, void *buf, size_t count, int w)
{
    const void *src[1] = {buf};
    if (w > 1)
        dt__reduce(dt, DT_REDUCE_AVG, buf, src, 1, count, w);
}

void dt__copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes)
        memmove(dst, src, bytes);
}
