/* Symmetric block quantization to int8 and int4, for communication that
 * carries fewer bytes (ZeRO++: quantized weight all-gather and gradient
 * reduce-scatter).
 *
 * x is cut into blocks of `block` consecutive elements (the last may be
 * shorter); each block b gets one scale s_b = max_i |x_i| / qmax (qmax 127
 * for int8, 7 for int4) and each element q_i = round_half_even(x_i / s_b),
 * which lies in [-qmax, qmax]; dequantization is x'_i = q_i s_b, so
 * |x_i - x'_i| <= s_b / 2 (and x' = x exactly for a block of zeros, s_b = 0).
 * int4 values are packed two per byte, element 2k in the low nibble and
 * 2k+1 in the high one, as two's complement.
 *
 * Non-finite values are never hidden: a block holding a NaN or an infinity
 * gets a NaN scale, so every element of it dequantizes to NaN and the
 * overflow checks after the communication (the loss scaler, the gradient
 * norm) see it, as they would have seen the value unquantized. */
#include "kernels_impl.h"

#include <math.h>
#include <string.h>

static dt_status quant_args(const char *fn, int64_t n, int64_t block, int bits)
{
    DT__CHECK_N(fn, n);
    if (block <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: block size %lld must be > 0", fn, (long long)block);
    if (bits != 8 && bits != 4)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %d-bit quantization (8 or 4 bits are supported)", fn, bits);
    return DT_OK;
}

int64_t dt_k_quant_bytes(int64_t n, int bits)
{
    if (n < 0 || (bits != 8 && bits != 4))
        return -1;
    return bits == 8 ? n : (n + 1) / 2;
}

dt_status dt_k_quantize_blocks(const float *x, int64_t n, int64_t block, int bits, void *q, float *scales)
{
    const char *fn = "dt_k_quantize_blocks";
    dt_status st = quant_args(fn, n, block, bits);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, x, n);
    DT__CHECK_PTR(fn, q, n);
    DT__CHECK_PTR(fn, scales, n);
    const float qmax = bits == 8 ? 127.0f : 7.0f;
    const int64_t nb = (n + block - 1) / block;
    int8_t *q8 = q;
    uint8_t *q4 = q;
    if (bits == 4)
        memset(q4, 0, (size_t)dt_k_quant_bytes(n, 4));
    int nt = dt__threads_for(2 * n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        const int64_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t i = i0; i < i1; i++) {
            float a = fabsf(x[i]);
            finite &= isfinite(a);
            amax = a > amax ? a : amax;
        }
        float s = !finite ? NAN : amax / qmax;
        scales[b] = s;
        const float inv = finite && s > 0.0f ? 1.0f / s : 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            float v = finite ? nearbyintf(x[i] * inv) : 0.0f; /* round half to even (the default mode) */
            v = v > qmax ? qmax : v < -qmax ? -qmax : v;
            int iv = (int)v;
            if (bits == 8)
                q8[i] = (int8_t)iv;
            else if (block % 2 == 0) /* the block owns whole bytes */
                q4[i / 2] |= (uint8_t)((iv & 0xf) << (4 * (i & 1)));
            else
#pragma omp atomic
                q4[i / 2] |= (uint8_t)((iv & 0xf) << (4 * (i & 1)));
        }
    }
    return DT_OK;
}

dt_status dt_k_dequantize_blocks(const void *q, const float *scales, int64_t n, int64_t block, int bits, float *out,
                                 bool accumulate)
{
    const char *fn = "dt_k_dequantize_blocks";
    dt_status st = quant_args(fn, n, block, bits);
    if (st < 0)
        return st;
    DT__CHECK_PTR(fn, q, n);
    DT__CHECK_PTR(fn, scales, n);
    DT__CHECK_PTR(fn, out, n);
    const int8_t *q8 = q;
    const uint8_t *q4 = q;
    int nt = dt__threads_for(n);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        int iv;
        if (bits == 8) {
            iv = q8[i];
        } else {
            iv = (q4[i / 2] >> (4 * (i & 1))) & 0xf;
            iv = iv >= 8 ? iv - 16 : iv;
        }
        float s = scales[i / block];
        float v = (float)iv * s; /* a NaN scale (a non-finite block) makes every element NaN, a zero too */
        out[i] = accumulate ? out[i] + v : v;
    }
    return DT_OK;
}
