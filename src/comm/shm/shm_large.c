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
#include "comm/shm/shm.h"

#include <string.h>

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

/* ---- all-reduce, reduce, broadcast: one vector cut into pieces ----
 *
 * Staged pieces are double-buffered: the staging IN and OUT areas are each
 * split in two, piece k uses half k%2, and one barrier per piece separates
 * "everyone finished the algorithm on piece k and staged piece k+1" from
 * "copy piece k out, run piece k+1". Peers write piece k+1 into the other
 * half while a rank copies piece k out, and nobody reads half k%2 again
 * before the next barrier, so one barrier per piece is enough. */

typedef struct {
    const dt_coll *c;
    const expo *e;
    shm_alg alg;
    int is_ar, is_red, is_bc;
    int in_needed[SHM_MAX_RANKS], zc_in[SHM_MAX_RANKS], zc_work[SHM_MAX_RANKS];
    size_t piece, es;
} vplan;

/* Pointers for piece k (elements [a, a+m)), and my own-chunk bounds. */
static void vpiece(shm_ctx *s, const vplan *v, size_t k, shm_piece *p, size_t *lo, size_t *hi)
{
    const dt_coll *c = v->c;
    int W = s->size, me = s->rank, half = (int)(k & 1);
    size_t es = v->es, a = k * v->piece, m = c->count - a < v->piece ? c->count - a : v->piece;
    size_t hb = s->stage_bytes / 4; /* bytes in one half of IN or OUT */
    p->s = s;
    p->count = m;
    p->dt = c->dtype;
    p->op = c->op;
    p->root = v->is_ar ? -1 : c->root;
    for (int j = 0; j < W; j++) {
        p->ins[j] = v->zc_in[j] ? s->base + v->e->in_off[j] + a * es
                                : shm_stage_in(s, j) + (size_t)half * hb;
        if (v->is_bc && j == c->root)
            p->works[j] = p->ins[j];
        else if (v->zc_work[j] && v->e->zc_out[j])
            p->works[j] = s->base + v->e->out_off[j] + a * es;
        else
            p->works[j] = shm_stage_out(s, j) + (size_t)half * hb;
    }
    p->nt = c->count * es >= SHM_NT_BYTES;
    p->own_in = NULL;
    p->own_out = NULL;
    *lo = *hi = 0;
    if (v->is_ar && v->alg == SHM_ALG_DIRECT) {
        dt__shm_chunk(m, es, W, me, lo, hi);
        if (!v->zc_in[me])
            p->own_in = (const char *)c->send + a * es;
        if (!v->zc_work[me])
            p->own_out = (char *)c->recv + a * es;
    }
}

static void vcopy_in(shm_ctx *s, const vplan *v, size_t k)
{
    shm_piece p;
    size_t lo, hi, a = k * v->piece, es = v->es;
    vpiece(s, v, k, &p, &lo, &hi);
    if (!v->in_needed[s->rank] || v->zc_in[s->rank])
        return;
    const char *src = (const char *)v->c->send + a * es;
    char *dst = p.ins[s->rank];
    if (p.own_in) { /* my own chunk is read from the user's buffer */
        dt__copy(dst, src, lo * es);
        dt__copy(dst + hi * es, src + hi * es, (p.count - hi) * es);
    } else {
        dt__copy(dst, src, p.count * es);
    }
}

static void vcopy_out(shm_ctx *s, const vplan *v, size_t k)
{
    shm_piece p;
    size_t lo, hi, es = v->es;
    int me = s->rank;
    vpiece(s, v, k, &p, &lo, &hi);
    int has_out = v->is_ar || (v->is_red && me == v->c->root) ||
                  (v->is_bc && me != v->c->root && v->alg == SHM_ALG_TREE);
    char *mine = (char *)v->c->recv + k * v->piece * es;
    if (!has_out)
        return;
    if (p.own_out) {
        dt__copy(mine, p.works[me], lo * es);
        dt__copy(mine + hi * es, p.works[me] + hi * es, (p.count - hi) * es);
    } else if (p.works[me] != mine) {
        dt__copy(mine, p.works[me], p.count * es);
    }
}

/* The table's algorithm on one piece (direct broadcast is done inline). */
static dt_status valg(const vplan *v, shm_piece *p)
{
    if (v->is_bc)
        return dt__shm_broadcast_tree(p);
    if (v->is_red)
        return v->alg == SHM_ALG_TREE ? dt__shm_reduce_tree(p) : dt__shm_reduce_direct(p);
    switch (v->alg) {
    case SHM_ALG_RING: return dt__shm_allreduce_ring(p);
    case SHM_ALG_RECHD: return dt__shm_allreduce_rechd(p);
    case SHM_ALG_TREE: return dt__shm_allreduce_tree(p);
    default: return dt__shm_allreduce_direct(p);
    }
}

static dt_status vector_op(shm_ctx *s, const dt_coll *c, const expo *e, shm_alg alg)
{
    int W = s->size, root = c->root;
    vplan v;
    memset(&v, 0, sizeof v);
    v.c = c;
    v.e = e;
    v.alg = alg;
    v.es = dt_dtype_size(c->dtype);
    v.is_ar = c->kind == DT_COLL_ALLREDUCE;
    v.is_red = c->kind == DT_COLL_REDUCE;
    v.is_bc = c->kind == DT_COLL_BROADCAST;
    int all_zc = 1;
    for (int j = 0; j < W; j++) {
        v.in_needed[j] = !v.is_bc || j == root;
        v.zc_in[j] = e->zc_in[j];
        if (v.is_red) /* non-roots work in staging (tree) */
            v.zc_work[j] = j == root ? e->zc_out[j] : 0;
        else if (v.is_bc) /* direct broadcast pulls straight into recv */
            v.zc_work[j] = j == root || alg == SHM_ALG_DIRECT ? 1 : e->zc_out[j];
        else
            v.zc_work[j] = e->zc_out[j];
        if (v.in_needed[j] && !v.zc_in[j])
            all_zc = 0;
        if (!v.zc_work[j] && (v.is_ar || (v.is_red && (j == root || alg == SHM_ALG_TREE)) ||
                              (v.is_bc && alg == SHM_ALG_TREE)))
            all_zc = 0;
    }
    size_t n = c->count;
    v.piece = all_zc ? (n ? n : 1) : (s->stage_bytes / 4) / v.es;
    size_t np = (n + v.piece - 1) / v.piece;
    uint32_t step = 2;
    dt_status st;
    if (np == 0)
        return DT_OK;
    if (!all_zc) {
        vcopy_in(s, &v, 0);
        if ((st = dt__shm_barrier(s, step++)) < 0)
            return st;
    }
    for (size_t k = 0; k < np; k++) {
        shm_piece p;
        size_t lo, hi;
        vpiece(s, &v, k, &p, &lo, &hi);
        p.step = step;
        if (v.is_bc && alg == SHM_ALG_DIRECT) {
            if (s->rank != root) {
                dt__copy((char *)c->recv + k * v.piece * v.es, p.ins[root], p.count * v.es);
                shm_moved(s, root, s->rank, p.count * v.es);
            }
            st = DT_OK;
        } else {
            st = valg(&v, &p);
        }
        if (st < 0)
            return st;
        step = p.step;
        if (k + 1 < np)
            vcopy_in(s, &v, k + 1);
        if ((st = dt__shm_barrier(s, step++)) < 0)
            return st;
        vcopy_out(s, &v, k);
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
    if (piece == 0)
        piece = 1; /* DT_SHM_STAGING_KB >= 8 and W <= 64 keep W*es within a half */
    uint32_t step = 2;
    dt_status st;
    const void *srcs[SHM_MAX_RANKS];
    for (size_t a = 0; a < maxn; a += piece) {
        size_t m = maxn - a < piece ? maxn - a : piece;
        /* copy in: my blocks' elements [a, a+m) */
        if (exposes[me] && !e->zc_in[me]) {
            size_t mine_n = k == DT_COLL_ALLGATHERV ? c->counts[me] : n;
            size_t mm = a < mine_n ? (mine_n - a < m ? mine_n - a : m) : 0;
            if (c->sblocks && mm) { /* from a layout: its blocks in lockstep */
                void *dsts[SHM_MAX_RANKS];
                size_t ms[SHM_MAX_RANKS];
                for (int b = 0; b < nblk; b++) {
                    dsts[b] = shm_stage_in(s, me) + (size_t)b * piece * es;
                    ms[b] = mm;
                }
                dt__blk_gather(dsts, c->send, c->sblocks, a, ms, nblk, es);
            } else {
                for (int b = 0; b < nblk && mm; b++)
                    dt__copy(shm_stage_in(s, me) + (size_t)b * piece * es,
                             (const char *)c->send + ((size_t)b * n + a) * es, mm * es);
            }
        }
        if (!all_zc && (st = dt__shm_barrier(s, step++)) < 0)
            return st;
        switch (k) {
        case DT_COLL_ALLGATHER:
        case DT_COLL_ALLGATHERV:
            if (c->rblocks && k == DT_COLL_ALLGATHERV) { /* into a layout, in lockstep */
                size_t ms[SHM_MAX_RANKS];
                for (int j = 0; j < W; j++) {
                    size_t cj = c->counts[j];
                    ms[j] = a >= cj || (j == me && c->in_place) ? 0 : (cj - a < m ? cj - a : m);
                    srcs[j] = ms[j] ? block_in(s, e, j, 0, cj, a, piece, es) : NULL;
                    shm_moved(s, j, me, ms[j] * es);
                }
                dt__blk_scatter(c->recv, c->rblocks, srcs, a, ms, W, es);
                break;
            }
            for (int j = 0; j < W; j++) {
                size_t cj = k == DT_COLL_ALLGATHERV ? c->counts[j] : n;
                size_t dj = k == DT_COLL_ALLGATHERV ? c->displs[j] : (size_t)j * n;
                if (a >= cj || (j == me && c->in_place))
                    continue;
                size_t mm = cj - a < m ? cj - a : m;
                shm_moved(s, j, me, mm * es);
                if (c->rblocks) /* all-gather into a layout */
                    dt__blk_copy(c->recv, &c->rblocks[j], a, block_in(s, e, j, 0, cj, a, piece, es),
                                 NULL, 0, mm, es);
                else
                    dt__copy((char *)c->recv + (dj + a) * es,
                             block_in(s, e, j, 0, cj, a, piece, es), mm * es);
            }
            break;
        case DT_COLL_GATHER:
            if (me == c->root)
                for (int j = 0; j < W; j++) {
                    if (!exposes[j])
                        continue;
                    shm_moved(s, j, me, m * es);
                    dt__copy((char *)c->recv + ((size_t)j * n + a) * es,
                             block_in(s, e, j, 0, n, a, piece, es), m * es);
                }
            break;
        case DT_COLL_SCATTER:
            if (!(me == c->root && c->in_place)) {
                dt__copy((char *)c->recv + a * es, block_in(s, e, c->root, me, n, a, piece, es),
                         m * es);
                shm_moved(s, c->root, me, m * es);
            }
            break;
        case DT_COLL_ALLTOALL:
            if (c->rblocks) { /* into a layout, in lockstep */
                size_t ms[SHM_MAX_RANKS];
                for (int j = 0; j < W; j++) {
                    ms[j] = m;
                    srcs[j] = block_in(s, e, j, me, n, a, piece, es);
                    shm_moved(s, j, me, m * es);
                }
                dt__blk_scatter(c->recv, c->rblocks, srcs, a, ms, W, es);
            } else {
                for (int j = 0; j < W; j++) {
                    dt__copy((char *)c->recv + ((size_t)j * n + a) * es,
                             block_in(s, e, j, me, n, a, piece, es), m * es);
                    shm_moved(s, j, me, m * es);
                }
            }
            break;
        case DT_COLL_REDUCE_SCATTER:
            for (int j = 0; j < W; j++) {
                srcs[j] = block_in(s, e, j, me, n, a, piece, es);
                shm_moved(s, j, me, m * es);
            }
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
