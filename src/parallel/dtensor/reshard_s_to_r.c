/* Shard(d) -> Replicate: all-gather(v) along d.
 *
 * The pieces are [A, len_r, B] (A: dims before d, B: dims after, len_r the
 * torch.chunk length of coordinate r, possibly 0). For d with A == 1 the
 * pieces land in place (displacement start_r * B); otherwise each lands as
 * a strided block (dt_pg_allgather_blocks: A runs of len_r * B elements,
 * n * B apart, at start_r * B), so no staging buffer and no interleave.
 * Backward (reshard.c): R -> S, a local slice. */
#include "dtensor_impl.h"

dt_status dt__reshard_s_to_r(const dt__rs_step *s)
{
    int d = s->from.dim, k = s->k;
    int64_t n = s->gshape[d];
    int64_t A = dt__outer(s->out_shape, d), B = dt__inner(s->out_shape, s->ndim, d);
    size_t *counts = dt_ctx_alloc(s->ctx, 2 * (size_t)k * sizeof(size_t));
    if (!counts)
        return dt_last_status();
    size_t *displs = counts + k;
    size_t packed = 0;
    for (int r = 0; r < k; r++) {
        int64_t st, len;
        dt_chunk_range(n, k, r, &st, &len);
        counts[r] = (size_t)(A * len * B);
        displs[r] = A == 1 ? (size_t)(st * B) : packed;
        packed += counts[r];
    }
    bool even = n % k == 0;
    if (A == 1 && even) /* the plain all-gather: its blocks are already in place */
        return dt_pg_allgather(s->pg, s->in, s->out, counts[0], s->dtype);
    if (A == 1)
        return dt_pg_allgatherv(s->pg, s->in, s->out, counts, displs, s->dtype);
    /* an inner dim: each piece lands as A runs of len_r * B, n * B apart,
     * straight from the backend's copy (no staging, no interleave pass) */
    dt_pg_block *rb = dt_ctx_alloc(s->ctx, (size_t)k * sizeof *rb);
    if (!rb)
        return dt_last_status();
    for (int r = 0; r < k; r++) {
        int64_t st, len;
        dt_chunk_range(n, k, r, &st, &len);
        rb[r] = (dt_pg_block){.off = (size_t)(st * B), .runs = (size_t)A,
                              .run = (size_t)(len * B), .stride = (size_t)(n * B)};
    }
    return dt_pg_allgather_blocks(s->pg, s->in, s->out, rb, s->dtype);
}
