/* The shm backend's path for messages larger than a slot.
 *
 * Exposures: for each rank, where peers find its input ("ins") and its
 * output or work area ("works") for the current piece. A buffer that came
 * from dt_pg_alloc is exposed as itself (zero copy); otherwise the rank
 * copies its input piece into its staging IN area and works in its staging
 * OUT area, copying the result out at the end of the piece. All ranks take
 * the same decision (the descriptors say whose buffers are shared), so they
 * cut the operation into the same pieces:
 *
 *   [copy in] [barrier if anything is staged] algorithm  barrier [copy out]
 *
 * Collectives that only move data pull it: each rank reads the peers'
 * exposed inputs and writes its own output directly, so outputs never
 * need to be shared (all-gather, gather, scatter, all-to-all, broadcast,
 * reduce-scatter). All-reduce and reduce run the table's algorithm
 * (allreduce_direct.c, allreduce_ring.c, allreduce_rechd.c,
 * allreduce_tree.c) on the exposures. */
#include "comm/shm.h"

#include <string.h>

dt_status dt__shm_run_large(shm_ctx *s, const dt_coll *c);

typedef struct {
    int zc_in[SHM_MAX_RANKS], zc_out[SHM_MAX_RANKS];
    uint64_t in_off[SHM_MAX_RANKS], out_off[SHM_MAX_RANKS];
    int all_in, all_out;
} expo;

static void read_expo(shm_ctx *s, expo *e)
{
    e->all_in = e->all_out = 1;
    for (int j = 0; j < s->size; j++) {
        const shm_desc *d = shm_desc_at(s, j, s->cur_seq);
        e->in_off[j] = d->send_off;
        e->out_off[j] = d->recv_off;
        e->zc_in[j] = d->send_off != SHM_NONE;
        e->zc_out[j] = d->recv_off != SHM_NONE;
        e->all_in &= e->zc_in[j];
        e->all_out &= e->zc_out[j];
    }
}

/* ---- all-reduce, reduce, broadcast: one vector cut into pieces ---- */

static dt_status vector_op(shm_ctx *s, const dt_coll *c, const expo *e, shm_alg alg)
{
    int W = s->size, me = s->rank, root = c->root;
    size_t es = dt_dtype_size(c->dtype), n = c->count;
    int is_ar = c->kind == DT_COLL_ALLREDUCE, is_red = c->kind == DT_COLL_REDUCE,
        is_bc = c->kind == DT_COLL_BROADCAST;
    /* who needs a staged input / work area */
    int in_needed[SHM_MAX_RANKS], zc_in[SHM_MAX_RANKS], zc_work[SHM_MAX_RANKS];
    int all_zc = 1;
    for (int j = 0; j < W; j++) {
        in_needed[j] = !is_bc || j == root;
        zc_in[j] = e->zc_in[j];
        if (is_red)
            zc_work[j] = j == root && alg == SHM_ALG_DIRECT ? e->zc_out[j] : (j == root ? e->zc_out[j] : 0);
        else if (is_bc)
            zc_work[j] = j == root ? 1 : (alg == SHM_ALG_DIRECT ? 1 : e->zc_out[j]);
        else
            zc_work[j] = e->zc_out[j];
        if (in_needed[j] && !zc_in[j])
            all_zc = 0;
        if (!zc_work[j] && (is_ar || (is_red && (j == root || alg == SHM_ALG_TREE)) ||
                            (is_bc && alg == SHM_ALG_TREE)))
            all_zc = 0;
    }
    size_t piece = all_zc ? n : (s->stage_bytes / 2) / es;
    uint32_t step = 2;
    dt_status st;
    char *base = s->base;
    for (size_t a = 0; a < n; a += piece) {
        size_t m = n - a < piece ? n - a : piece;
        shm_piece p;
        p.s = s;
        p.count = m;
        p.dt = c->dtype;
        p.op = c->op;
        p.root = is_ar ? -1 : root;
        for (int j = 0; j < W; j++) {
            p.ins[j] = zc_in[j] ? base + e->in_off[j] + a * es : shm_stage_in(s, j);
            if (is_bc && j == root)
                p.works[j] = p.ins[j];
            else if (zc_work[j] && e->zc_out[j])
                p.works[j] = base + e->out_off[j] + a * es;
            else
                p.works[j] = shm_stage_out(s, j);
        }
        p.nt = n * es >= SHM_NT_BYTES;
        p.own_in = NULL;
        p.own_out = NULL;
        size_t lo = 0, hi = 0; /* my chunk, when it bypasses staging */
        if (is_ar && alg == SHM_ALG_DIRECT) {
            dt__shm_chunk(m, es, W, me, &lo, &hi);
            if (!zc_in[me])
                p.own_in = (const char *)c->send + a * es;
            if (!zc_work[me])
                p.own_out = (char *)c->recv + a * es;
        }
        if (in_needed[me] && !zc_in[me]) {
            const char *src = (const char *)c->send + a * es;
            if (p.own_in) { /* my own chunk is read from the user's buffer */
                dt__copy(p.ins[me], src, lo * es);
                dt__copy(p.ins[me] + hi * es, src + hi * es, (m - hi) * es);
            } else {
                dt__copy(p.ins[me], src, m * es);
            }
        }
        if (!all_zc && (st = dt__shm_barrier(s, step++)) < 0)
            return st;
        p.step = step;
        if (is_bc && alg == SHM_ALG_DIRECT) {
            if (me != root)
                dt__copy((char *)c->recv + a * es, p.ins[root], m * es);
            st = DT_OK;
        } else if (is_bc) {
            st = dt__shm_broadcast_tree(&p);
        } else if (is_red) {
            st = alg == SHM_ALG_TREE ? dt__shm_reduce_tree(&p) : dt__shm_reduce_direct(&p);
        } else {
            switch (alg) {
            case SHM_ALG_RING: st = dt__shm_allreduce_ring(&p); break;
            case SHM_ALG_RECHD: st = dt__shm_allreduce_rechd(&p); break;
            case SHM_ALG_TREE: st = dt__shm_allreduce_tree(&p); break;
            default: st = dt__shm_allreduce_direct(&p); break;
            }
        }
        if (st < 0)
            return st;
        step = p.step;
        if ((st = dt__shm_barrier(s, step++)) < 0)
            return st;
        /* copy out my result if it was computed in staging */
        int has_out = is_ar || (is_red && me == root) || (is_bc && me != root && alg == SHM_ALG_TREE);
        char *mine = (char *)c->recv + a * es;
        if (has_out && p.own_out) {
            dt__copy(mine, p.works[me], lo * es);
            dt__copy(mine + hi * es, p.works[me] + hi * es, (m - hi) * es);
        } else if (has_out && p.works[me] != mine) {
            dt__copy(mine, p.works[me], m * es);
        }
    }
    return DT_OK;
}

/* ---- block collectives: every rank exposes W (or 1) blocks ---- */

/* Where rank j's input block b (elements [a, a+m) of it) is. nblk is how
 * many blocks j exposes (1 or W), count the block length in the user's
 * layout, piece the staged block length. */
static const char *block_in(shm_ctx *s, const expo *e, int j, int b, size_t count, size_t a,
                            size_t piece, size_t es)
{
    if (e->zc_in[j])
        return s->base + e->in_off[j] + ((size_t)b * count + a) * es;
    return shm_stage_in(s, j) + (size_t)b * piece * es;
}

static dt_status block_op(shm_ctx *s, const dt_coll *c, const expo *e)
{
    int W = s->size, me = s->rank;
    size_t es = dt_dtype_size(c->dtype), n = c->count;
    dt_coll_kind k = c->kind;
    int nblk = (k == DT_COLL_REDUCE_SCATTER || k == DT_COLL_ALLTOALL || k == DT_COLL_SCATTER) ? W : 1;
    int exposes[SHM_MAX_RANKS];
    int all_zc = 1;
    size_t maxn = n;
    if (k == DT_COLL_ALLGATHERV) {
        maxn = 0;
        for (int j = 0; j < W; j++)
            maxn = c->counts[j] > maxn ? c->counts[j] : maxn;
    }
    for (int j = 0; j < W; j++) {
        exposes[j] = k == DT_COLL_SCATTER ? j == c->root : 1;
        if (k == DT_COLL_GATHER && j == c->root && c->in_place)
            exposes[j] = 0; /* the root's block is already in place */
        if (exposes[j] && !e->zc_in[j])
            all_zc = 0;
    }
    size_t piece = all_zc ? (maxn ? maxn : 1) : (s->stage_bytes / 2) / ((size_t)nblk * es);
    uint32_t step = 2;
    dt_status st;
    const void *srcs[SHM_MAX_RANKS];
    for (size_t a = 0; a < maxn; a += piece) {
        size_t m = maxn - a < piece ? maxn - a : piece;
        /* copy in: my blocks' elements [a, a+m) */
        if (exposes[me] && !e->zc_in[me]) {
            size_t mine_n = k == DT_COLL_ALLGATHERV ? c->counts[me] : n;
            size_t mm = a < mine_n ? (mine_n - a < m ? mine_n - a : m) : 0;
            for (int b = 0; b < nblk && mm; b++)
                dt__copy(shm_stage_in(s, me) + (size_t)b * piece * es,
                         (const char *)c->send + ((size_t)b * n + a) * es, mm * es);
        }
        if (!all_zc && (st = dt__shm_barrier(s, step++)) < 0)
            return st;
        switch (k) {
        case DT_COLL_ALLGATHER:
        case DT_COLL_ALLGATHERV:
            for (int j = 0; j < W; j++) {
                size_t cj = k == DT_COLL_ALLGATHERV ? c->counts[j] : n;
                size_t dj = k == DT_COLL_ALLGATHERV ? c->displs[j] : (size_t)j * n;
                if (a >= cj || (j == me && c->in_place))
                    continue;
                size_t mm = cj - a < m ? cj - a : m;
                dt__copy((char *)c->recv + (dj + a) * es, block_in(s, e, j, 0, cj, a, piece, es),
                         mm * es);
            }
            break;
        case DT_COLL_GATHER:
            if (me == c->root)
                for (int j = 0; j < W; j++) {
                    if (!exposes[j])
                        continue;
                    dt__copy((char *)c->recv + ((size_t)j * n + a) * es,
                             block_in(s, e, j, 0, n, a, piece, es), m * es);
                }
            break;
        case DT_COLL_SCATTER:
            if (!(me == c->root && c->in_place))
                dt__copy((char *)c->recv + a * es, block_in(s, e, c->root, me, n, a, piece, es),
                         m * es);
            break;
        case DT_COLL_ALLTOALL:
            for (int j = 0; j < W; j++)
                dt__copy((char *)c->recv + ((size_t)j * n + a) * es,
                         block_in(s, e, j, me, n, a, piece, es), m * es);
            break;
        case DT_COLL_REDUCE_SCATTER:
            for (int j = 0; j < W; j++)
                srcs[j] = block_in(s, e, j, me, n, a, piece, es);
            dt__reduce(c->dtype, c->op, (char *)c->recv + a * es, srcs, W, m, W);
            break;
        default:
            break;
        }
        if ((st = dt__shm_barrier(s, step++)) < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt__shm_run_large(shm_ctx *s, const dt_coll *c)
{
    expo e;
    read_expo(s, &e);
    switch (c->kind) {
    case DT_COLL_ALLREDUCE:
    case DT_COLL_REDUCE:
    case DT_COLL_BROADCAST: {
        shm_alg alg = dt__shm_select(&s->table, c->kind, (uint64_t)c->count * dt_dtype_size(c->dtype));
        return vector_op(s, c, &e, alg);
    }
    default:
        return block_op(s, c, &e);
    }
}
