/* src/comm/shm/chunk.h — how an operation is cut into per-rank chunks.
 *
 * Shared by the algorithms (allreduce_*.c) and the large-message path
 * (shm_large.c); a header of its own so the algorithm files need nothing
 * from the backend that calls them. */
#ifndef DT_COMM_SHM_CHUNK_H
#define DT_COMM_SHM_CHUNK_H

#include <stddef.h>

/* Element range [*lo, *hi) of chunk i when n elements of es bytes are cut
 * into parts chunks. Chunks start on 64-byte boundaries where possible (a
 * cache line belongs to one chunk, so ranks writing neighbouring chunks do
 * not share lines); trailing chunks may be empty when n is small. */
static inline void dt__shm_chunk(size_t n, size_t es, int parts, int i, size_t *lo, size_t *hi)
{
    size_t unit = es >= 64 ? 1 : 64 / es;
    size_t units = (n + unit - 1) / unit;
    size_t a = units * (size_t)i / (size_t)parts, b = units * (size_t)(i + 1) / (size_t)parts;
    *lo = a * unit < n ? a * unit : n;
    *hi = b * unit < n ? b * unit : n;
}

#endif /* DT_COMM_SHM_CHUNK_H */
