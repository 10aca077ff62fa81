/* FNV-1a, 64-bit: cheap, stable across platforms, good enough for
 * fingerprints of collective descriptions and primitive-cache keys. */
#include "dtrain/base.h"

uint64_t dt_hash64(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = seed ? seed : 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
