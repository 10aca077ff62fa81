/* CRC-32C (Castagnoli, the iSCSI / ext4 / RFC 3720 checksum; polynomial
 * 0x1EDC6F41, bit-reflected 0x82F63B78, initial value and final XOR
 * 0xFFFFFFFF): the checksum of checkpoint files (ckpt.h).
 *
 * Two implementations giving the same value:
 *   - the SSE4.2 crc32 instruction (x86-64), 8 bytes at a time in three
 *     independent streams (the instruction has a latency of 3 cycles and a
 *     throughput of 1 a cycle, so one stream would use a third of it); the
 *     three partial CRCs are joined by multiplying the first two by
 *     x^(8 * stream length) modulo the polynomial (constants computed once);
 *   - a portable one with eight 256-entry tables (8 bytes a step), used
 *     where the CPU lacks SSE4.2 or DT_MAX_CPU_ISA=scalar caps it (base.h).
 * The choice is made once, at the first call.
 *
 * The algebra (bit-reflected: bit 31 of a word is the coefficient of x^0,
 * bit 0 that of x^31). Without the initial and final inversion, the CRC
 * register after a message M from state c is c * x^(8|M|) + M(x) x^32 mod P,
 * linear in (c, M); with them, crc(A || B) = crc(A) * x^(8|B|) + crc(B)
 * (the inversions of A's final value and B's initial one cancel against the
 * zeros B would have added), which is dt_crc32c_combine. */
#include "dtrain/ckpt.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u

/* ---- arithmetic modulo P --------------------------------------------------------- */

/* a * b mod P, both bit-reflected */
static uint32_t gf_mul(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (int i = 0; i < 32; i++) {
        if (a & (0x80000000u >> i))
            p ^= b;
        b = (b & 1) ? (b >> 1) ^ POLY : b >> 1; /* b * x */
    }
    return p;
}

/* x^(8 n) mod P */
static uint32_t x_pow_8n(uint64_t n)
{
    uint32_t r = 0x80000000u;   /* x^0 */
    uint32_t base = 0x00800000u; /* x^8 */
    while (n) {
        if (n & 1)
            r = gf_mul(r, base);
        base = gf_mul(base, base);
        n >>= 1;
    }
    return r;
}

uint32_t dt_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return gf_mul(x_pow_8n(len_b), crc_a) ^ crc_b;
}

/* ---- portable: slicing by 8 ------------------------------------------------------- */

static uint32_t g_tab[8][256];

static void tables_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        g_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            g_tab[t][i] = (g_tab[t - 1][i] >> 8) ^ g_tab[0][g_tab[t - 1][i] & 0xff];
}

/* the register (no inversions) after p[0..n) */
static uint32_t sw_update(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ g_tab[0][(c ^ *p++) & 0xff];
        n--;
    }
    for (; n >= 8; p += 8, n -= 8) {
        uint32_t lo = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        lo ^= c;
        c = g_tab[7][lo & 0xff] ^ g_tab[6][(lo >> 8) & 0xff] ^ g_tab[5][(lo >> 16) & 0xff] ^ g_tab[4][lo >> 24] ^
            g_tab[3][hi & 0xff] ^ g_tab[2][(hi >> 8) & 0xff] ^ g_tab[1][(hi >> 16) & 0xff] ^ g_tab[0][hi >> 24];
    }
    while (n--)
        c = (c >> 8) ^ g_tab[0][(c ^ *p++) & 0xff];
    return c;
}

/* ---- SSE4.2 ----------------------------------------------------------------------- */

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>

/* bytes per stream of the three-way loop: long enough that joining the
 * streams (two gf_mul) costs little, short enough to stay in L1 */
#define STREAM 4096
static uint32_t g_k1, g_k2; /* x^(8 STREAM), x^(16 STREAM) mod P */

__attribute__((target("sse4.2"))) static uint32_t hw_update(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    while (n >= 3 * STREAM) {
        uint64_t a = c, b = 0, d = 0, x, y, z;
        for (size_t i = 0; i < STREAM; i += 8) {
            memcpy(&x, p + i, 8);
            memcpy(&y, p + STREAM + i, 8);
            memcpy(&z, p + 2 * STREAM + i, 8);
            a = _mm_crc32_u64(a, x);
            b = _mm_crc32_u64(b, y);
            d = _mm_crc32_u64(d, z);
        }
        c = gf_mul(g_k2, (uint32_t)a) ^ gf_mul(g_k1, (uint32_t)b) ^ (uint32_t)d;
        p += 3 * STREAM;
        n -= 3 * STREAM;
    }
    uint64_t a = c, x;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&x, p, 8);
        a = _mm_crc32_u64(a, x);
    }
    c = (uint32_t)a;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}

static bool have_sse42(void)
{
    unsigned a, b, c, d;
    return dt_cpu_max_isa() != DT_CPU_ISA_SCALAR && __get_cpuid(1, &a, &b, &c, &d) && ((c >> 20) & 1);
}
#endif

/* ---- dispatch ------------------------------------------------------------------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint32_t (*g_update)(uint32_t, const uint8_t *, size_t) = sw_update;
static const char *g_impl = "table";

static void init_once(void)
{
    tables_init();
#if defined(__x86_64__)
    g_k1 = x_pow_8n(STREAM);
    g_k2 = x_pow_8n(2 * STREAM);
    if (have_sse42()) {
        g_update = hw_update;
        g_impl = "sse4.2";
    }
#endif
}

uint32_t dt_crc32c(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_once, init_once);
    return n ? ~g_update(~crc, data, n) : crc;
}

uint32_t dt_crc32c_portable(uint32_t crc, const void *data, size_t n)
{
    pthread_once(&g_once, init_once);
    return n ? ~sw_update(~crc, data, n) : crc;
}

const char *dt_crc32c_impl(void)
{
    pthread_once(&g_once, init_once);
    return g_impl;
}
