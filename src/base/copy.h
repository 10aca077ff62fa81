/* src/base/copy.h — the library's strided copy: rows of bytes between two
 * strided layouts, one tight loop.
 *
 * Every strided copy goes through it: the comm layer's block layouts
 * (src/comm/blocks.c: dt__blk_copy, dt__blk_gather, dt__blk_scatter, so the
 * shm backend's _blocks collectives and the packed fallback) and the
 * dtensor box copies (dt__copy_box: the reshard's local slice R -> S, the
 * packs around the v-collectives, the cross-mesh boxes).
 *
 *     // column block [0, 64) of a [4096, 256] f32 matrix into a packed [4096, 64]
 *     dt__copy_rows(out, 64 * 4, in, 256 * 4, 4096, 64 * 4);
 *
 * Layer-internal: base's strided copy for every layer that moves boxes of
 * memory (comm: block layouts; parallel: reshard). Not installed, not for
 * users. */
#ifndef DT_BASE_COPY_H
#define DT_BASE_COPY_H

#include <stddef.h>

/* Copy rows rows of bytes bytes each: row i from src + i * sstride to
 * dst + i * dstride (strides in bytes). The source and destination rows
 * must not overlap. With AVX2 (dt_cpu_detect(), so DT_MAX_CPU_ISA=scalar
 * takes the fallback) the row loop runs inside one function with 32-byte
 * vector loads and stores (no call per row); without it, memcpy per row.
 * Rows laid end to end on both sides are one memcpy. */
void dt__copy_rows(void *dst, size_t dstride, const void *src, size_t sstride, size_t rows,
                   size_t bytes);

/* n copies of that shape at once, in lockstep: row 0 of pair 0, row 0 of
 * pair 1, ..., then row 1 of each. Blocks that interleave (the W column
 * blocks of a matrix: a gather or scatter along an inner dim) are then
 * walked in address order, one pass, the row loop still inside. The n
 * pairs share strides, row count and width; dt__copy_rows is n = 1. */
void dt__copy_rows_multi(void *const *dst, size_t dstride, const void *const *src, size_t sstride,
                         int n, size_t rows, size_t bytes);

#endif
