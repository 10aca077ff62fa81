/* Shard(i) -> Shard(j): all-to-all(v).
 *
 * This coordinate holds chunk c of dim i and all of dim j. It sends to
 * coordinate r the slice of dim j that r will own (its piece with dim j cut
 * to chunk r), and receives from r the part of r's chunk of dim i that lies
 * in its own chunk of dim j; the received blocks are placed along dim i at
 * r's chunk start. Even chunks: a strided all-to-all (dt_pg_alltoall_blocks)
 * reads and writes the blocks in place. Uneven chunks (even empty ones) are
 * uneven counts, packed and unpacked around dt_pg_alltoallv.
 * Backward (reshard.c): S(j) -> S(i), the same exchange reversed. */
#include "dtensor_impl.h"

/* Both dims divisible: every block on every rank has one size (decided
 * from the global shape, so all ranks choose alike), and the blocks are
 * read and written in place by a strided all-to-all: block r of the input
 * is the chunk r of dim j ([Aj, len, Bj] of [Aj, nj, Bj]), block r of the
 * output the chunk r of dim i. */
static dt_status s_to_s_even(const dt__rs_step *s)
{
    int i = s->from.dim, j = s->to.dim, k = s->k, nd = s->ndim;
    dt_pg_block *b = dt_ctx_alloc(s->ctx, 2 * (size_t)k * sizeof *b);
    if (!b)
        return dt_last_status();
    int64_t Aj = dt__outer(s->in_shape, j), Bj = dt__inner(s->in_shape, nd, j);
    int64_t Ai = dt__outer(s->out_shape, i), Bi = dt__inner(s->out_shape, nd, i);
    int64_t nj = s->in_shape[j], ni = s->out_shape[i], lj = nj / k, li = ni / k;
    for (int r = 0; r < k; r++) {
        b[r] = (dt_pg_block){.off = (size_t)(r * lj * Bj), .runs = (size_t)Aj,
                             .run = (size_t)(lj * Bj), .stride = (size_t)(nj * Bj)};
        b[k + r] = (dt_pg_block){.off = (size_t)(r * li * Bi), .runs = (size_t)Ai,
                                 .run = (size_t)(li * Bi), .stride = (size_t)(ni * Bi)};
    }
    size_t count = (size_t)(Aj * lj * Bj);
    return dt_pg_alltoall_blocks(s->pg, s->in, b, s->out, b + k, count, s->dtype);
}

dt_status dt__reshard_s_to_s(const dt__rs_step *s)
{
    int i = s->from.dim, j = s->to.dim, k = s->k, nd = s->ndim;
    if (s->gshape[i] % k == 0 && s->gshape[j] % k == 0)
        return s_to_s_even(s);
    size_t esz = dt_dtype_size(s->dtype);
    size_t *sc = dt_ctx_alloc(s->ctx, 2 * (size_t)k * sizeof(size_t));
    if (!sc)
        return dt_last_status();
    size_t *rc = sc + k, stot = 0, rtot = 0;
    for (int r = 0; r < k; r++) {
        int64_t lj, li;
        dt_chunk_range(s->gshape[j], k, r, NULL, &lj);
        dt_chunk_range(s->gshape[i], k, r, NULL, &li);
        int64_t ps = lj, pr = li;
        for (int d = 0; d < nd; d++) {
            if (d != j)
                ps *= s->in_shape[d];
            if (d != i)
                pr *= s->out_shape[d];
        }
        sc[r] = (size_t)ps;
        rc[r] = (size_t)pr;
        stot += sc[r];
        rtot += rc[r];
    }
    char *sbuf = dt_ctx_alloc(s->ctx, stot * esz + 1), *rbuf = dt_ctx_alloc(s->ctx, rtot * esz + 1);
    if (!sbuf || !rbuf)
        return dt_last_status();
    int64_t zero[DT_MAX_DIMS] = {0};
    size_t at = 0;
    for (int r = 0; r < k; r++) {
        int64_t st, len, bshape[DT_MAX_DIMS], off[DT_MAX_DIMS] = {0};
        dt_chunk_range(s->gshape[j], k, r, &st, &len);
        for (int d = 0; d < nd; d++)
            bshape[d] = s->in_shape[d];
        bshape[j] = len;
        off[j] = st;
        dt__copy_box(sbuf + at * esz, bshape, zero, s->in, s->in_shape, off, bshape, nd, s->dtype);
        at += sc[r];
    }
    /* uneven: packed blocks through alltoallv (a size agreement and padding) */
    dt_status st = dt_pg_alltoallv(s->pg, sbuf, sc, NULL, rbuf, rc, NULL, s->dtype);
    if (st < 0)
        return st;
    at = 0;
    for (int r = 0; r < k; r++) {
        int64_t ist, len, bshape[DT_MAX_DIMS], off[DT_MAX_DIMS] = {0};
        dt_chunk_range(s->gshape[i], k, r, &ist, &len);
        for (int d = 0; d < nd; d++)
            bshape[d] = s->out_shape[d];
        bshape[i] = len;
        off[i] = ist;
        dt__copy_box(s->out, s->out_shape, off, rbuf + at * esz, bshape, zero, bshape, nd, s->dtype);
        at += rc[r];
    }
    return DT_OK;
}
