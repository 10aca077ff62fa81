/* Context parallelism: ring attention over a `cp` group (cp.h).
 *
 * Forward: each rank packs its rows' keys and values into a block (B, Tl,
 * 2C) and the blocks go around the ring: at step s rank r holds the block of
 * rank (r - s) mod P, posts the block's send to r+1 and the next block's
 * receive from r-1, and meanwhile adds the attention of each of its query
 * chunks to each of the block's chunks (dt_k_attention_part_fwd: positions
 * decide the causal mask; pairs the mask hides entirely return at once).
 *
 * Backward: the blocks go around again with a gradient accumulator (dk |
 * dv, (B, Tl, 2C)) attached: each rank adds its queries' terms to the block
 * it holds (dt_k_attention_part_bwd with the final y and lse) and passes
 * both on; after P steps the accumulator of rank r's block is at rank r-1
 * and one more send brings it home. Every sum over blocks runs in ring
 * order, the same on every run. */
#include "dtrain/cp.h"

#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_cp_layout_make(int rank, int size, int64_t T, bool balance, dt_cp_layout *out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_cp_layout_make: NULL out");
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size)
        return dt_error(DT_ERR_INVALID_ARG, "dt_cp_layout_make: rank %d of %d", rank, size);
    int64_t parts = balance ? 2 * (int64_t)size : size;
    if (T <= 0 || T % parts != 0)
        return dt_error(DT_ERR_INVALID_ARG,
                        "context parallelism: the sequence length %lld does not divide into %lld equal chunks (cp "
                        "degree %d%s); uneven chunks are not supported: choose a length that is a multiple of %lld",
                        (long long)T, (long long)parts, size, balance ? ", two chunks per rank for causal balance" : "",
                        (long long)parts);
    out->rank = rank;
    out->size = size;
    out->balance = balance;
    out->T = T;
    out->chunk = T / parts;
    out->nchunks = balance ? 2 : 1;
    out->local_len = out->chunk * out->nchunks;
    out->start[0] = (int64_t)rank * out->chunk;
    out->start[1] = balance ? (2 * (int64_t)size - 1 - rank) * out->chunk : -1;
    return DT_OK;
}

int64_t dt_cp_position(const dt_cp_layout *l, int64_t i)
{
    if (!l || i < 0 || i >= l->local_len || l->chunk <= 0)
        return -1;
    int64_t c = i / l->chunk;
    return l->start[c] + i % l->chunk;
}

static dt_status cp_args(const char *fn, dt_pg *cp, const dt_cp_layout *l, int64_t B, int64_t H, int64_t D)
{
    if (!cp || !l)
        return dt_error(DT_ERR_NULL, "%s: NULL group or layout", fn);
    if (l->size != dt_pg_size(cp) || l->rank != dt_pg_rank(cp))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the layout is rank %d of %d, the group's rank %d of %d", fn, l->rank,
                        l->size, dt_pg_rank(cp), dt_pg_size(cp));
    if (B <= 0 || H <= 0 || D <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: B %lld, H %lld, D %lld must be > 0", fn, (long long)B, (long long)H,
                        (long long)D);
    return DT_OK;
}

/* kv (B, Tl, 2C) = columns [C, 3C) of qkv (B, Tl, 3C). */
static void pack_kv(const float *qkv, int64_t rows, int64_t C, float *kv)
{
    for (int64_t i = 0; i < rows; i++)
        memcpy(kv + i * 2 * C, qkv + i * 3 * C + C, (size_t)(2 * C) * sizeof *kv);
}

/* Post the ring's exchange of n floats: send `out` to r+1, receive `in` from r-1. */
static dt_status ring_post(dt_pg *cp, const float *out, float *in, size_t n, dt_req **rq)
{
    int r = dt_pg_rank(cp), P = dt_pg_size(cp);
    rq[0] = rq[1] = NULL;
    dt_status st = dt_pg_recv_async(cp, in, n, DT_F32, (r + P - 1) % P, &rq[1]);
    if (st >= 0)
        st = dt_pg_send_async(cp, out, n, DT_F32, (r + 1) % P, &rq[0]);
    return st;
}

static dt_status ring_wait(dt_req **rq)
{
    dt_status st = dt_req_wait_all(rq, 2, -1.0);
    dt_req_free(rq[0]);
    dt_req_free(rq[1]);
    rq[0] = rq[1] = NULL;
    return st;
}

dt_status dt_cp_attention_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                              bool causal, float *y, float *lse)
{
    const char *fn = "dt_cp_attention_fwd";
    dt_status st = cp_args(fn, cp, l, B, H, D);
    if (st < 0)
        return st;
    if (!qkv || !y || !lse)
        return dt_error(DT_ERR_NULL, "%s: NULL qkv, y or lse", fn);
    const int64_t C = H * D, Tl = l->local_len, ch = l->chunk;
    const int r = l->rank, P = l->size;
    const size_t nkv = (size_t)(B * Tl * 2 * C);
    float *cur = malloc(nkv * sizeof *cur), *nxt = P > 1 ? malloc(nkv * sizeof *nxt) : NULL;
    if (!cur || (P > 1 && !nxt)) {
        free(cur);
        free(nxt);
        return dt_error(DT_ERR_NO_MEMORY, "%s: no memory for two key/value blocks of %zu floats", fn, nkv);
    }
    pack_kv(qkv, B * Tl, C, cur);
    for (int64_t i = 0; i < B * H * Tl; i++)
        lse[i] = -INFINITY;
    memset(y, 0, (size_t)(B * Tl * C) * sizeof *y);
    dt_req *rq[2] = {NULL, NULL};
    for (int s = 0; s < P && st >= 0; s++) {
        dt_cp_layout src;
        st = dt_cp_layout_make((r - s + P) % P, P, l->T, l->balance, &src);
        if (st >= 0 && s < P - 1)
            st = ring_post(cp, cur, nxt, nkv, rq);
        for (int64_t b = 0; b < B && st >= 0; b++)
            for (int a = 0; a < l->nchunks && st >= 0; a++)
                for (int c = 0; c < src.nchunks && st >= 0; c++) {
                    const float *k = cur + (b * Tl + c * ch) * 2 * C;
                    st = dt_k_attention_part_fwd(qkv + (b * Tl + a * ch) * 3 * C, 3 * C, k, 2 * C, k + C, 2 * C, 1,
                                                 ch, ch, H, D, l->start[a], src.start[c], causal,
                                                 y + (b * Tl + a * ch) * C, C, lse + b * H * Tl + a * ch, Tl);
                }
        if (rq[0] || rq[1]) {
            dt_status w = ring_wait(rq);
            st = st < 0 ? st : w;
            float *t = cur;
            cur = nxt;
            nxt = t;
        }
    }
    free(cur);
    free(nxt);
    return st;
}

dt_status dt_cp_attention_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                              const float *dy, int64_t B, int64_t H, int64_t D, bool causal, float *dqkv)
{
    const char *fn = "dt_cp_attention_bwd";
    dt_status st = cp_args(fn, cp, l, B, H, D);
    if (st < 0)
        return st;
    if (!qkv || !y || !lse || !dy || !dqkv)
        return dt_error(DT_ERR_NULL, "%s: NULL qkv, y, lse, dy or dqkv", fn);
    const int64_t C = H * D, Tl = l->local_len, ch = l->chunk;
    const int r = l->rank, P = l->size;
    /* a block: keys and values (B, Tl, 2C), then their gradient accumulator (B, Tl, 2C) */
    const size_t nkv = (size_t)(B * Tl * 2 * C), nblk = 2 * nkv;
    float *cur = malloc(nblk * sizeof *cur), *nxt = P > 1 ? malloc(nblk * sizeof *nxt) : NULL;
    if (!cur || (P > 1 && !nxt)) {
        free(cur);
        free(nxt);
        return dt_error(DT_ERR_NO_MEMORY, "%s: no memory for two key/value blocks of %zu floats", fn, nblk);
    }
    pack_kv(qkv, B * Tl, C, cur);
    memset(cur + nkv, 0, nkv * sizeof *cur);
    memset(dqkv, 0, (size_t)(B * Tl * 3 * C) * sizeof *dqkv);
    dt_req *rq[2] = {NULL, NULL};
    for (int s = 0; s < P && st >= 0; s++) {
        dt_cp_layout src;
        st = dt_cp_layout_make((r - s + P) % P, P, l->T, l->balance, &src);
        for (int64_t b = 0; b < B && st >= 0; b++)
            for (int a = 0; a < l->nchunks && st >= 0; a++)
                for (int c = 0; c < src.nchunks && st >= 0; c++) {
                    const int64_t qo = (b * Tl + a * ch), ko = (b * Tl + c * ch);
                    const float *k = cur + ko * 2 * C;
                    float *dk = cur + nkv + ko * 2 * C;
                    st = dt_k_attention_part_bwd(qkv + qo * 3 * C, 3 * C, k, 2 * C, k + C, 2 * C, y + qo * C, C,
                                                 lse + b * H * Tl + a * ch, Tl, dy + qo * C, C, 1, ch, ch, H, D,
                                                 l->start[a], src.start[c], causal, dqkv + qo * 3 * C, 3 * C, dk,
                                                 2 * C, dk + C, 2 * C);
                }
        if (st >= 0 && P > 1) {
            /* pass the block and its accumulator on; after the last step only
             * the accumulator, which then reaches its owner */
            if (s < P - 1)
                st = ring_post(cp, cur, nxt, nblk, rq);
            else
                st = ring_post(cp, cur + nkv, nxt + nkv, nkv, rq);
            dt_status w = rq[0] || rq[1] ? ring_wait(rq) : DT_OK;
            st = st < 0 ? st : w;
            float *t = cur;
            cur = nxt;
            nxt = t;
        }
    }
    if (st >= 0) /* this rank's own keys' and values' gradients */
        for (int64_t i = 0; i < B * Tl; i++) {
            const float *g = cur + nkv + i * 2 * C;
            float *o = dqkv + i * 3 * C + C;
            for (int64_t d = 0; d < 2 * C; d++)
                o[d] += g[d];
        }
    free(cur);
    free(nxt);
    return st;
}
