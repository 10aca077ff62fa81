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

/* before any exchange: a bad mask fails every rank alike, none waiting */
static dt_status mask_args(const char *fn, bool causal, int64_t window, float cap)
{
    if (window < 0 || !(cap >= 0.0f) || !isfinite(cap) || (!causal && (window > 0 || cap > 0.0f)))
        return dt_error(DT_ERR_INVALID_ARG, "%s: sliding window %lld must be >= 0 and soft cap %g finite and >= 0, "
                        "either only with the causal mask", fn, (long long)window, (double)cap);
    return DT_OK;
}

/* Dropout on the probabilities of heads [h0, h0 + H) of a layer of Ht (p 0: none): the ring's blocks draw their
 * part of the whole sequence's mask (dt_k_att_drop), Ulysses' kernel that of the rank's heads after the exchange
 * ([h0 + r Hp, h0 + (r+1) Hp) on rank r); checked before any exchange, alike on every rank */
typedef struct {
    float p;
    dt_rng_key key;
    int64_t h0, Ht;
} cp_drop;

static dt_status drop_args(const char *fn, int64_t H, const cp_drop *dr)
{
    if (!(dr->p >= 0.0f && dr->p < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "%s: dropout probability %g is outside [0, 1)", fn, (double)dr->p);
    if (dr->h0 < 0 || dr->Ht < dr->h0 + H)
        return dt_error(DT_ERR_INVALID_ARG, "%s: heads [%lld, %lld) are not inside a layer of %lld", fn,
                        (long long)dr->h0, (long long)(dr->h0 + H), (long long)dr->Ht);
    return DT_OK;
}

/* The block kernel's dropout for batch b of a sequence of T positions (heads h0.. of Ht) */
static dt_k_att_drop block_drop(const cp_drop *dr, int64_t b, int64_t T)
{
    return (dt_k_att_drop){.p = dr->p, .key = dr->key, .bh0 = b * dr->Ht + dr->h0, .Ht = dr->Ht, .T = T};
}

/* the ring's forward; with causal: window > 0 a sliding window (the blocks before every row's window skipped),
 * cap > 0 a soft cap of the scores; dr its dropout */
static dt_status ring_fwd(const char *fn, dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                          int64_t D, bool causal, int64_t window, float cap, const cp_drop *dr, float *y, float *lse)
{
    dt_status st = cp_args(fn, cp, l, B, H, D);
    if (st >= 0)
        st = mask_args(fn, causal, window, cap);
    if (st >= 0)
        st = drop_args(fn, H, dr);
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
                    const dt_k_att_drop kd = block_drop(dr, b, l->T);
                    st = dt_k_attention_part_fwd(qkv + (b * Tl + a * ch) * 3 * C, 3 * C, k, 2 * C, k + C, 2 * C, 1,
                                                 ch, ch, H, D, l->start[a], src.start[c], causal, window, cap, &kd,
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

/* the ring's backward, window and cap as ring_fwd's */
static dt_status ring_bwd(const char *fn, dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                          const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, bool causal,
                          int64_t window, float cap, const cp_drop *dr, float *dqkv)
{
    dt_status st = cp_args(fn, cp, l, B, H, D);
    if (st >= 0)
        st = mask_args(fn, causal, window, cap);
    if (st >= 0)
        st = drop_args(fn, H, dr);
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
                    const dt_k_att_drop kd = block_drop(dr, b, l->T);
                    st = dt_k_attention_part_bwd(qkv + qo * 3 * C, 3 * C, k, 2 * C, k + C, 2 * C, y + qo * C, C,
                                                 lse + b * H * Tl + a * ch, Tl, dy + qo * C, C, 1, ch, ch, H, D,
                                                 l->start[a], src.start[c], causal, window, cap, &kd,
                                                 dqkv + qo * 3 * C, 3 * C, dk, 2 * C, dk + C, 2 * C);
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

/* ---- DeepSpeed-Ulysses: all-to-all from sequence chunks to head groups ---- */

/* Rank r's rows of x (B, Tl, parts * H * D) (parts of H heads each, q | k | v
 * for 3) go out as P segments, segment j holding heads [j Hp, (j+1) Hp) of
 * every part of every row; the segments received (rank i's rows, in i's
 * layout order) land at their global positions in xg (B, T, parts * Hp D).
 * back = true runs it the other way (xg to x). */
static dt_status heads_exchange(dt_pg *cp, const dt_cp_layout *l, float *x, int64_t B, int parts, int64_t H,
                                int64_t D, float *xg, bool back)
{
    const int P = l->size;
    const int64_t Tl = l->local_len, T = l->T, Hp = H / P, C = H * D, Cp = Hp * D;
    const size_t seg = (size_t)(B * Tl * parts * Cp);
    /* calloc: every element is written below, but gcc cannot see it through the loops */
    float *sb = calloc(seg * (size_t)P, sizeof *sb), *rb = malloc(seg * (size_t)P * sizeof *rb);
    if (!sb || !rb) {
        free(sb);
        free(rb);
        return dt_error(DT_ERR_NO_MEMORY, "Ulysses attention: no memory for the all-to-all (%zu floats)",
                        seg * (size_t)P);
    }
    dt_status st = DT_OK;
    for (int j = 0; j < P && st >= 0; j++) {
        dt_cp_layout lj;
        st = dt_cp_layout_make(j, P, T, l->balance, &lj);
        for (int64_t b = 0; b < B && st >= 0; b++)
            for (int64_t i = 0; i < Tl; i++)
                for (int p = 0; p < parts; p++) {
                    /* forward: my row i, heads of rank j -> segment j; back: rank j's row i of my heads -> segment j */
                    float *s = sb + (size_t)j * seg + (size_t)(((b * Tl + i) * parts + p) * Cp);
                    if (!back)
                        memcpy(s, x + (b * Tl + i) * parts * C + p * C + j * Cp, (size_t)Cp * sizeof *s);
                    else
                        memcpy(s, xg + (b * T + dt_cp_position(&lj, i)) * parts * Cp + p * Cp,
                               (size_t)Cp * sizeof *s);
                }
    }
    if (st >= 0)
        st = dt_pg_alltoall(cp, sb, rb, seg, DT_F32);
    for (int j = 0; j < P && st >= 0; j++) {
        dt_cp_layout lj;
        st = dt_cp_layout_make(j, P, T, l->balance, &lj);
        for (int64_t b = 0; b < B && st >= 0; b++)
            for (int64_t i = 0; i < Tl; i++)
                for (int p = 0; p < parts; p++) {
                    const float *s = rb + (size_t)j * seg + (size_t)(((b * Tl + i) * parts + p) * Cp);
                    if (!back) /* rank j's row i, my heads */
                        memcpy(xg + (b * T + dt_cp_position(&lj, i)) * parts * Cp + p * Cp, s,
                               (size_t)Cp * sizeof *s);
                    else /* my row i, rank j's heads */
                        memcpy(x + (b * Tl + i) * parts * C + p * C + j * Cp, s, (size_t)Cp * sizeof *s);
                }
    }
    free(sb);
    free(rb);
    return st;
}

/* lse (B, H, Tl) of my rows <-> lseg (B, Hp, T) of my heads: the same
 * exchange with one value per (row, head) (the rows made head-minor). */
static dt_status lse_exchange(dt_pg *cp, const dt_cp_layout *l, float *lse, int64_t B, int64_t H, float *lseg,
                              bool back)
{
    const int64_t Tl = l->local_len, T = l->T, Hp = H / l->size;
    float *x = malloc(sizeof *x * (size_t)(B * Tl * H)), *xg = malloc(sizeof *xg * (size_t)(B * T * Hp));
    dt_status st = x && xg ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "Ulysses attention: no memory for lse");
    if (st >= 0 && !back)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Tl; i++)
                    x[(b * Tl + i) * H + h] = lse[(b * H + h) * Tl + i];
    if (st >= 0 && back)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hp; h++)
                for (int64_t t = 0; t < T; t++)
                    xg[(b * T + t) * Hp + h] = lseg[(b * Hp + h) * T + t];
    if (st >= 0)
        st = heads_exchange(cp, l, x, B, 1, H, 1, xg, back);
    if (st >= 0 && !back)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hp; h++)
                for (int64_t t = 0; t < T; t++)
                    lseg[(b * Hp + h) * T + t] = xg[(b * T + t) * Hp + h];
    if (st >= 0 && back)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < Tl; i++)
                    lse[(b * H + h) * Tl + i] = x[(b * Tl + i) * H + h];
    free(x);
    free(xg);
    return st;
}

static dt_status ulysses_args(const char *fn, dt_pg *cp, const dt_cp_layout *l, int64_t B, int64_t H, int64_t D)
{
    dt_status st = cp_args(fn, cp, l, B, H, D);
    if (st >= 0 && H % l->size != 0)
        st = dt_error(DT_ERR_INVALID_ARG,
                      "Ulysses attention: %lld heads do not divide over a cp degree of %d (each rank takes H/cp "
                      "heads); use ring attention or a degree that divides the heads",
                      (long long)H, l->size);
    return st;
}


static dt_status ulysses_fwd(const char *fn, dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                             int64_t D, bool causal, int64_t window, float cap, const cp_drop *dr, float *y,
                             float *lse)
{
    dt_status st = ulysses_args(fn, cp, l, B, H, D);
    if (st >= 0)
        st = mask_args(fn, causal, window, cap);
    if (st >= 0)
        st = drop_args(fn, H, dr);
    if (st < 0)
        return st;
    if (!qkv || !y || !lse)
        return dt_error(DT_ERR_NULL, "%s: NULL qkv, y or lse", fn);
    const int64_t T = l->T, Hp = H / l->size, Cp = Hp * D;
    float *qg = malloc(sizeof *qg * (size_t)(B * T * 3 * Cp)), *yg = malloc(sizeof *yg * (size_t)(B * T * Cp));
    float *lg = malloc(sizeof *lg * (size_t)(B * Hp * T));
    if (!qg || !yg || !lg)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: no memory for the whole sequence of %lld heads", fn, (long long)Hp);
    if (st >= 0)
        st = heads_exchange(cp, l, (float *)qkv, B, 3, H, D, qg, false);
    if (st >= 0)
        st = dt_k_attention_ex_fwd(DT_F32, qg, B, T, Hp, D, dr->h0 + l->rank * Hp, dr->Ht, causal, window, cap,
                                   dr->p, dr->key, yg, NULL, lg);
    if (st >= 0)
        st = heads_exchange(cp, l, y, B, 1, H, D, yg, true);
    if (st >= 0)
        st = lse_exchange(cp, l, lse, B, H, lg, true);
    free(qg);
    free(yg);
    free(lg);
    return st;
}

static dt_status ulysses_bwd(const char *fn, dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                             const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, bool causal,
                             int64_t window, float cap, const cp_drop *dr, float *dqkv)
{
    dt_status st = ulysses_args(fn, cp, l, B, H, D);
    if (st >= 0)
        st = mask_args(fn, causal, window, cap);
    if (st >= 0)
        st = drop_args(fn, H, dr);
    if (st < 0)
        return st;
    if (!qkv || !y || !lse || !dy || !dqkv)
        return dt_error(DT_ERR_NULL, "%s: NULL qkv, y, lse, dy or dqkv", fn);
    const int64_t T = l->T, Hp = H / l->size, Cp = Hp * D;
    float *qg = malloc(sizeof *qg * (size_t)(B * T * 3 * Cp)), *dq = malloc(sizeof *dq * (size_t)(B * T * 3 * Cp));
    float *yg = malloc(sizeof *yg * (size_t)(B * T * Cp)), *dg = malloc(sizeof *dg * (size_t)(B * T * Cp));
    float *lg = malloc(sizeof *lg * (size_t)(B * Hp * T));
    if (!qg || !dq || !yg || !dg || !lg)
        st = dt_error(DT_ERR_NO_MEMORY, "%s: no memory for the whole sequence of %lld heads", fn, (long long)Hp);
    if (st >= 0)
        st = heads_exchange(cp, l, (float *)qkv, B, 3, H, D, qg, false);
    if (st >= 0)
        st = heads_exchange(cp, l, (float *)y, B, 1, H, D, yg, false);
    if (st >= 0)
        st = heads_exchange(cp, l, (float *)dy, B, 1, H, D, dg, false);
    if (st >= 0)
        st = lse_exchange(cp, l, (float *)lse, B, H, lg, false);
    if (st >= 0)
        st = dt_k_attention_ex_bwd(DT_F32, qg, yg, lg, dg, B, T, Hp, D, dr->h0 + l->rank * Hp, dr->Ht, causal, window,
                                   cap, dr->p, dr->key, dq, NULL);
    if (st >= 0)
        st = heads_exchange(cp, l, dqkv, B, 3, H, D, dq, true);
    free(qg);
    free(dq);
    free(yg);
    free(dg);
    free(lg);
    return st;
}

static cp_drop no_drop(int64_t H) { return (cp_drop){.p = 0.0f, .h0 = 0, .Ht = H}; }

dt_status dt_cp_ulysses_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                            bool causal, float *y, float *lse)
{
    const cp_drop dr = no_drop(H);
    return ulysses_fwd("dt_cp_ulysses_fwd", cp, l, qkv, B, H, D, causal, 0, 0.0f, &dr, y, lse);
}

dt_status dt_cp_ulysses_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                            const float *dy, int64_t B, int64_t H, int64_t D, bool causal, float *dqkv)
{
    const cp_drop dr = no_drop(H);
    return ulysses_bwd("dt_cp_ulysses_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, 0, 0.0f, &dr, dqkv);
}

dt_status dt_cp_ulysses_heads_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                                  int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y, float *lse)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ulysses_fwd("dt_cp_ulysses_heads_fwd", cp, l, qkv, B, H, D, causal, 0, 0.0f, &dr, y, lse);
}

dt_status dt_cp_ulysses_heads_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                                  const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                                  float p, dt_rng_key key, float *dqkv)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ulysses_bwd("dt_cp_ulysses_heads_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, 0, 0.0f, &dr, dqkv);
}

/* window and cap as dt_k_attention_window_fwd takes them (checked there, on every rank alike) */
dt_status dt_cp_ulysses_window_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                                   int64_t window, float cap, float *y, float *lse)
{
    const cp_drop dr = no_drop(H);
    return ulysses_fwd("dt_cp_ulysses_window_fwd", cp, l, qkv, B, H, D, true, window, cap, &dr, y, lse);
}

dt_status dt_cp_ulysses_window_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                   const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t window,
                                   float cap, float *dqkv)
{
    const cp_drop dr = no_drop(H);
    return ulysses_bwd("dt_cp_ulysses_window_bwd", cp, l, qkv, y, lse, dy, B, H, D, true, window, cap, &dr, dqkv);
}

dt_status dt_cp_attention_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                              bool causal, float *y, float *lse)
{
    const cp_drop dr = no_drop(H);
    return ring_fwd("dt_cp_attention_fwd", cp, l, qkv, B, H, D, causal, 0, 0.0f, &dr, y, lse);
}

dt_status dt_cp_attention_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                              const float *dy, int64_t B, int64_t H, int64_t D, bool causal, float *dqkv)
{
    const cp_drop dr = no_drop(H);
    return ring_bwd("dt_cp_attention_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, 0, 0.0f, &dr, dqkv);
}

dt_status dt_cp_attention_heads_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                    int64_t D, int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *y,
                                    float *lse)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ring_fwd("dt_cp_attention_heads_fwd", cp, l, qkv, B, H, D, causal, 0, 0.0f, &dr, y, lse);
}

dt_status dt_cp_attention_heads_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                    const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0,
                                    int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ring_bwd("dt_cp_attention_heads_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, 0, 0.0f, &dr, dqkv);
}

dt_status dt_cp_attention_window_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                     int64_t D, int64_t window, float cap, float *y, float *lse)
{
    const cp_drop dr = no_drop(H);
    return ring_fwd("dt_cp_attention_window_fwd", cp, l, qkv, B, H, D, true, window, cap, &dr, y, lse);
}

dt_status dt_cp_attention_window_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                     const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t window,
                                     float cap, float *dqkv)
{
    const cp_drop dr = no_drop(H);
    return ring_bwd("dt_cp_attention_window_bwd", cp, l, qkv, y, lse, dy, B, H, D, true, window, cap, &dr, dqkv);
}

dt_status dt_cp_attention_ex_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                                 int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p,
                                 dt_rng_key key, float *y, float *lse)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ring_fwd("dt_cp_attention_ex_fwd", cp, l, qkv, B, H, D, causal, window, cap, &dr, y, lse);
}

dt_status dt_cp_attention_ex_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                                 const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                                 int64_t window, float cap, float p, dt_rng_key key, float *dqkv)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ring_bwd("dt_cp_attention_ex_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, window, cap, &dr, dqkv);
}

dt_status dt_cp_ulysses_ex_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                               int64_t h0, int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                               float *y, float *lse)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ulysses_fwd("dt_cp_ulysses_ex_fwd", cp, l, qkv, B, H, D, causal, window, cap, &dr, y, lse);
}

dt_status dt_cp_ulysses_ex_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                               const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0, int64_t Ht, bool causal,
                               int64_t window, float cap, float p, dt_rng_key key, float *dqkv)
{
    const cp_drop dr = {.p = p, .key = key, .h0 = h0, .Ht = Ht};
    return ulysses_bwd("dt_cp_ulysses_ex_bwd", cp, l, qkv, y, lse, dy, B, H, D, causal, window, cap, &dr, dqkv);
}
