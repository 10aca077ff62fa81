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

/* Fills of at least RNG_PAR elements run on the compute threads in runs of
 * RNG_RUN elements: every element is a pure function of (key, index), so
 * the values do not depend on the thread count, and each thread first
 * touches the pages of its own runs (a model's weights are written here
 * first: their pages are committed on every core at once). */
#define RNG_RUN ((size_t)1 << 16)
#define RNG_PAR ((size_t)1 << 18)

static void fill_uniform_run(dt_rng_key k, uint64_t first, float *out, size_t n, float lo, float span)
{
    size_t j = 0;
    while (j < n) {
        uint64_t i = first + j;
        uint32_t o[4];
        dt_rng_block(k, i >> 2, o);
        for (unsigned lane = (unsigned)(i & 3); lane < 4 && j < n; lane++, j++)
            out[j] = lo + span * u32_to_unit(o[lane]);
    }
}

/* Element i uses the pair (2*i', 2*i'+1) of uniform lanes of block i/2:
 * Box-Muller gives two normals per pair, the even element the cosine one
 * and the odd element the sine one. Both elements of a pair written here
 * share the block, the logarithm and the angle. */
static void fill_normal_run(dt_rng_key k, uint64_t first, float *out, size_t n, float mean, float std)
{
    size_t j = 0;
    while (j < n) {
        uint64_t i = first + j;
        uint32_t o[4];
        dt_rng_block(k, i >> 1, o);
        double u1 = ((double)(o[0] >> 8) + 1.0) / 16777217.0; /* (0, 1] */
        double u2 = (double)(o[1] >> 8) / 16777216.0;
        double r = sqrt(-2.0 * log(u1));
        double th = 6.283185307179586 * u2;
        if (!(i & 1)) {
            double z = r * cos(th);
            out[j++] = (float)(mean + std * z);
            if (j == n)
                break;
        }
        double z = r * sin(th);
        out[j++] = (float)(mean + std * z);
    }
}

/* f over elements [first, first + n) into out, in runs on the compute
 * threads from RNG_PAR elements on (see above). */
typedef void (*fill_run_fn)(dt_rng_key k, uint64_t first, float *out, size_t n, float a, float b);

static void fill_runs(fill_run_fn f, dt_rng_key k, uint64_t first, float *out, size_t n, float a, float b)
{
    if (n < RNG_PAR) {
        f(k, first, out, n, a, b);
        return;
    }
    const int64_t runs = (int64_t)((n + RNG_RUN - 1) / RNG_RUN);
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads())
    for (int64_t r = 0; r < runs; r++) {
        size_t at = (size_t)r * RNG_RUN, len = n - at < RNG_RUN ? n - at : RNG_RUN;
        f(k, first + at, out + at, len, a, b);
    }
}

void dt_rng_fill_uniform(dt_rng_key k, uint64_t first, float *out, size_t n, float lo, float hi)
{
    fill_runs(fill_uniform_run, k, first, out, n, lo, hi - lo);
}

void dt_rng_fill_normal(dt_rng_key k, uint64_t first, float *out, size_t n, float mean, float std)
{
    fill_runs(fill_normal_run, k, first, out, n, mean, std);
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

/* ---- PyTorch's CPU generator -------------------------------------------
 * MT19937 (Matsumoto & Nishimura 1998) seeded as torch seeds it, and the
 * draw patterns of torch's CPU distribution kernels (see base.h). */
void dt_torch_rng_seed(dt_torch_rng *g, uint64_t seed)
{
    g->s[0] = (uint32_t)seed;
    for (int i = 1; i < 624; i++)
        g->s[i] = 1812433253u * (g->s[i - 1] ^ (g->s[i - 1] >> 30)) + (uint32_t)i;
    g->i = 624;
    g->has_cached_normal = false;
    g->cached_normal = 0;
}

static inline uint32_t mt_twist(uint32_t a, uint32_t b)
{
    uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
    return (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
}

uint32_t dt_torch_rng_next(dt_torch_rng *g)
{
    if (g->i >= 624) { /* the twist, in three loops without the index wrap */
        uint32_t *s = g->s;
        int k = 0;
        for (; k < 624 - 397; k++)
            s[k] = s[k + 397] ^ mt_twist(s[k], s[k + 1]);
        for (; k < 623; k++)
            s[k] = s[k + 397 - 624] ^ mt_twist(s[k], s[k + 1]);
        s[623] = s[396] ^ mt_twist(s[623], s[0]);
        g->i = 0;
    }
    uint32_t y = g->s[g->i++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

static uint64_t torch_next64(dt_torch_rng *g)
{
    uint64_t hi = dt_torch_rng_next(g);
    return (hi << 32) | dt_torch_rng_next(g);
}

/* uniform_real_distribution<float>(0, 1): 24 bits */
static float torch_u24(dt_torch_rng *g) { return (float)(dt_torch_rng_next(g) & 0xFFFFFFu) * (1.0f / 16777216.0f); }

void dt_torch_rng_uniform(dt_torch_rng *g, float *x, size_t n, double from, double to)
{
    const float f = (float)from, t = (float)to, span = t - f;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(dt_torch_rng_next(g) & 0xFFFFFFu) * (1.0 / 16777216.0);
        x[i] = (float)(u * (double)span + (double)f);
    }
}

static void torch_normal16(float *d, float mean, float std)
{
    for (int j = 0; j < 8; j++) {
        const float u1 = 1.0f - d[j], u2 = d[j + 8];
        const float radius = sqrtf(-2.0f * logf(u1)), theta = 2.0f * (float)M_PI * u2;
        d[j] = radius * cosf(theta) * std + mean;
        d[j + 8] = radius * sinf(theta) * std + mean;
    }
}

void dt_torch_rng_normal(dt_torch_rng *g, float *x, size_t n, double mean, double std)
{
    if (n >= 16) {
        const float m = (float)mean, s = (float)std;
        for (size_t i = 0; i < n; i++)
            x[i] = torch_u24(g);
        for (size_t i = 0; i + 16 <= n; i += 16)
            torch_normal16(x + i, m, s);
        if (n % 16) {
            for (size_t i = n - 16; i < n; i++)
                x[i] = torch_u24(g);
            torch_normal16(x + n - 16, m, s);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        double z;
        if (g->has_cached_normal) {
            z = g->cached_normal;
            g->has_cached_normal = false;
        } else {
            const double u1 = (double)(torch_next64(g) & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
            const double u2 = (double)(torch_next64(g) & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
            const double r = sqrt(-2.0 * log(1.0 - u2)), theta = 2.0 * M_PI * u1;
            g->cached_normal = r * sin(theta);
            g->has_cached_normal = true;
            z = r * cos(theta);
        }
        x[i] = (float)(z * std + mean);
    }
}

void dt_torch_rng_uniform_part(dt_torch_rng *g, size_t n, size_t lo, size_t hi, float *out, double from, double to)
{
    const float f = (float)from, t = (float)to, span = t - f;
    for (size_t i = 0; i < n; i++) {
        uint32_t r = dt_torch_rng_next(g);
        if (i >= lo && i < hi) {
            double u = (double)(r & 0xFFFFFFu) * (1.0 / 16777216.0);
            out[i - lo] = (float)(u * (double)span + (double)f);
        }
    }
}

void dt_torch_rng_normal_part(dt_torch_rng *g, size_t n, size_t lo, size_t hi, float *out, double mean, double std)
{
    if (n < 16) { /* the scalar path: small enough to draw whole */
        float tmp[16];
        dt_torch_rng_normal(g, tmp, n, mean, std);
        for (size_t i = lo; i < hi && i < n; i++)
            out[i - lo] = tmp[i];
        return;
    }
    /* dt_torch_rng_normal draws n uniforms and transforms them in blocks of
     * 16; when n % 16 != 0 the last 16 elements are then redrawn and
     * transformed again. Element i < n - 16 (or every i when n % 16 == 0)
     * comes from its block; the rest from the redrawn tail. */
    const float m = (float)mean, sd = (float)std;
    const size_t tail_from = n % 16 ? n - 16 : n;
    /* The blocks wholly inside [lo, min(hi, tail_from)) get their uniforms
     * written in place, in order, and transformed afterwards, on the compute
     * threads from RNG_PAR elements on (each block alone: the same bits on
     * any thread count); a block cut by the range is transformed here. */
    const size_t top = hi < tail_from ? hi : tail_from;
    const size_t w0 = (lo + 15) / 16 * 16, w1 = top / 16 * 16 > w0 ? top / 16 * 16 : w0;
    float blk[16];
    for (size_t b = 0; b + 16 <= n; b += 16) {
        if (b >= w0 && b < w1) {
            for (int j = 0; j < 16; j++)
                out[b - lo + (size_t)j] = torch_u24(g);
            continue;
        }
        for (int j = 0; j < 16; j++)
            blk[j] = torch_u24(g);
        size_t a0 = b > lo ? b : lo, a1 = b + 16 < hi ? b + 16 : hi;
        if (a1 > tail_from)
            a1 = tail_from;
        if (a0 < a1) {
            torch_normal16(blk, m, sd);
            for (size_t i = a0; i < a1; i++)
                out[i - lo] = blk[i - b];
        }
    }
    const int64_t nb = (int64_t)((w1 - w0) / 16);
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if ((size_t)nb * 16 >= RNG_PAR)
    for (int64_t q = 0; q < nb; q++)
        torch_normal16(out + (w0 - lo) + (size_t)q * 16, m, sd);
    for (size_t i = n / 16 * 16; i < n; i++)
        (void)torch_u24(g); /* the first pass's draws past the last full block */
    if (n % 16) {
        for (int j = 0; j < 16; j++)
            blk[j] = torch_u24(g);
        torch_normal16(blk, m, sd);
        for (size_t i = tail_from > lo ? tail_from : lo; i < hi && i < n; i++)
            out[i - lo] = blk[i - tail_from];
    }
}

dt_status dt_torch_randperm(uint64_t seed, int64_t *out, int64_t n)
{
    if (n < 0 || (n > 0 && !out))
        return dt_error(DT_ERR_INVALID_ARG, "dt_torch_randperm: bad arguments (n=%lld)", (long long)n);
    dt_torch_rng g;
    dt_torch_rng_seed(&g, seed);
    for (int64_t i = 0; i < n; i++)
        out[i] = i;
    const bool wide = n >= (int64_t)(UINT32_MAX / 20);
    for (int64_t i = 0; i + 1 < n; i++) {
        const uint64_t r = wide ? torch_next64(&g) : dt_torch_rng_next(&g);
        const int64_t z = (int64_t)(r % (uint64_t)(n - i));
        const int64_t t = out[i];
        out[i] = out[i + z];
        out[i + z] = t;
    }
    return DT_OK;
}
