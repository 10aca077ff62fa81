/* Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11). A counter-based generator: the value at (key, counter) is a
 * pure function, so streams can be split across threads, ranks and steps
 * without any shared state, and results never depend on thread count.
 *
 * Layout: key = 64-bit mix of the seed; counter = (block index lo, hi,
 * stream lo, hi) where the stream is a 64-bit mix of (purpose, a, b).
 * Element i of a stream is lane i%4 of block i/4. */
#include "dtrain/base.h"

#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void dt_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

dt_rng_key dt_rng_key_make(uint64_t seed, uint32_t purpose, uint64_t a, uint64_t b)
{
    dt_rng_key k;
    uint64_t s = splitmix64(seed);
    k.k[0] = (uint32_t)s;
    k.k[1] = (uint32_t)(s >> 32);
    k.stream = splitmix64(splitmix64(splitmix64((uint64_t)purpose) ^ a) ^ b);
    return k;
}

void dt_rng_block(dt_rng_key k, uint64_t i, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)i, (uint32_t)(i >> 32), (uint32_t)k.stream,
                       (uint32_t)(k.stream >> 32)};
    dt_philox4x32(ctr, k.k, out);
}

static inline float u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

float dt_rng_uniform(dt_rng_key k, uint64_t i)
{
    uint32_t o[4];
    dt_rng_block(k, i >> 2, o);
    return u32_to_unit(o[i & 3]);
}

void dt_rng_fill_uniform(dt_rng_key k, uint64_t first, float *out, size_t n, float lo, float hi)
{
    float span = hi - lo;
    size_t j = 0;
    while (j < n) {
        uint64_t i = first + j;
        uint32_t o[4];
        dt_rng_block(k, i >> 2, o);
        for (unsigned lane = (unsigned)(i & 3); lane < 4 && j < n; lane++, j++)
            out[j] = lo + span * u32_to_unit(o[lane]);
    }
}

void dt_rng_fill_normal(dt_rng_key k, uint64_t first, float *out, size_t n, float mean, float std)
{
    /* Element i uses the pair (2*i', 2*i'+1) of uniform lanes of block i/2:
     * Box-Muller gives two normals per pair; element parity picks cos or sin.
     * Each element stays a pure function of (key, index). */
    for (size_t j = 0; j < n; j++) {
        uint64_t i = first + j;
        uint32_t o[4];
        dt_rng_block(k, i >> 1, o);
        double u1 = ((double)(o[0] >> 8) + 1.0) / 16777217.0; /* (0, 1] */
        double u2 = (double)(o[1] >> 8) / 16777216.0;
        double r = sqrt(-2.0 * log(u1));
        double th = 6.283185307179586 * u2;
        double z = (i & 1) ? r * sin(th) : r * cos(th);
        out[j] = (float)(mean + std * z);
    }
}

dt_status dt_rng_permutation(dt_rng_key k, int64_t *out, int64_t n)
{
    if (n < 0 || (n > 0 && !out))
        return dt_error(DT_ERR_INVALID_ARG, "dt_rng_permutation: bad arguments (n=%lld)", (long long)n);
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t o[4];
        dt_rng_block(k, (uint64_t)i, o);
        uint64_t r = ((uint64_t)o[0] << 32) | o[1];
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
    return DT_OK;
}
