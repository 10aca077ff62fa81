/* Partial(op) -> Shard(d): reduce-scatter(v)(op) along d.
 *
 * The input [A, n, B] is cut into the coordinates' blocks [A, len_r, B].
 * A == 1: the blocks already are packed in coordinate order. Even chunks
 * of an inner dim: a reduce-scatter reads the blocks' runs in place
 * (dt_pg_reduce_scatter_blocks). Otherwise they are packed, and
 * reduce-scattered with uneven counts. Backward (reshard.c): the
 * gradient's S -> R, an all-gather. */
#include "dtensor_impl.h"

dt_status dt__reshard_p_to_s(const dt__rs_step *s)
{
    int d = s->to.dim, k = s->k;
    int64_t n = s->gshape[d];
    int64_t A = dt__outer(s->in_shape, d), B = dt__inner(s->in_shape, s->ndim, d);
    size_t *counts = dt_ctx_alloc(s->ctx, (size_t)k * sizeof(size_t));
    if (!counts)
        return dt_last_status();
    size_t total = 0;
    for (int r = 0; r < k; r++) {
        int64_t len;
        dt_chunk_range(n, k, r, NULL, &len);
        counts[r] = (size_t)(A * len * B);
        total += counts[r];
    }
    const void *send = s->in;
    if (A != 1 && n % k == 0) {
        /* even chunks of an inner dim: reduce-scatter straight from the
         * input's runs (the backend's staging copy is the pack) */
        dt_pg_block *sb = dt_ctx_alloc(s->ctx, (size_t)k * sizeof *sb);
        if (!sb)
            return dt_last_status();
        for (int r = 0; r < k; r++) {
            int64_t st, len;
            dt_chunk_range(n, k, r, &st, &len);
            sb[r] = (dt_pg_block){.off = (size_t)(st * B), .runs = (size_t)A,
                                  .run = (size_t)(len * B), .stride = (size_t)(n * B)};
        }
        return dt_pg_reduce_scatter_blocks(s->pg, s->in, sb, s->out, counts[0], s->dtype,
                                           s->from.op);
    }
    if (A != 1) {
        size_t esz = dt_dtype_size(s->dtype);
        char *tmp = dt_ctx_alloc(s->ctx, total * esz + 1);
        if (!tmp)
            return dt_last_status();
        int64_t ishape[3] = {A, n, B}, zero[3] = {0, 0, 0};
        size_t at = 0;
        for (int r = 0; r < k; r++) {
            int64_t st, len;
            dt_chunk_range(n, k, r, &st, &len);
            int64_t bshape[3] = {A, len, B}, off[3] = {0, st, 0};
            dt__copy_box(tmp + at * esz, bshape, zero, s->in, ishape, off, bshape, 3, s->dtype);
            at += counts[r];
        }
        send = tmp;
    }
    return dt_pg_reduce_scatterv(s->pg, send, s->out, counts, s->dtype, s->from.op);
}
