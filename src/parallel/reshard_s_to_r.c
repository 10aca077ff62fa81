/* Shard(d) -> Replicate: all-gather(v) along d.
 *
 * The pieces are [A, len_r, B] (A: dims before d, B: dims after, len_r the
 * torch.chunk length of coordinate r, possibly 0). For d with A == 1 the
 * pieces land in place (displacement start_r * B); otherwise they are
 * gathered packed in coordinate order and then interleaved into [A, n, B].
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
    size_t esz = dt_dtype_size(s->dtype);
    char *tmp = dt_ctx_alloc(s->ctx, packed * esz + 1);
    if (!tmp)
        return dt_last_status();
    dt_status rc = dt_pg_allgatherv(s->pg, s->in, tmp, counts, displs, s->dtype);
    if (rc < 0)
        return rc;
    int64_t oshape[3] = {A, n, B}, zero[3] = {0, 0, 0};
    for (int r = 0; r < k; r++) {
        int64_t st, len;
        dt_chunk_range(n, k, r, &st, &len);
        int64_t bshape[3] = {A, len, B}, off[3] = {0, st, 0};
        dt__copy_box(s->out, oshape, off, tmp + displs[r] * esz, bshape, zero, bshape, 3, s->dtype);
    }
    return DT_OK;
}
