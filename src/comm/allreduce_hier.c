/* Hierarchical all-reduce: a composition over two subgroups (Horovod's
 * NCCLHierarchicalAllreduce with MPI across nodes).
 *
 * A group made by dt_pg_hierarchical holds two subgroups split from it:
 * intra (the ranks of this node, in group order) and inter (homogeneous
 * nodes: the ranks with this rank's local rank on every node, in node
 * order; otherwise only local rank 0 of each node). Its all-reduce is posted
 * on the group like any request (so it keeps the group's posting order), and
 * the request's `pre` step, on the group's executor, runs the levels as
 * blocking collectives on the subgroups; the group's own backend does not
 * run (pre_done).
 *
 * Homogeneous nodes of L ranks: pipelined in chunks ($DT_HIER_CHUNK_KB,
 * default 4096 KiB), each chunk intra reduce-scatter (local rank l owns
 * slice l; a remainder of fewer than L elements is all-reduced in the node
 * and kept by l = L-1), ring all-reduce of the owned slice among the ranks
 * that own it on the other nodes, intra all-gather; the intra steps of the
 * neighbouring chunks run over shm while a chunk is on the network (see
 * hier_homogeneous). Network volume per node and direction: 2 (N-1)/N of
 * the data (the minimum for an all-reduce of N nodes), carried by all L
 * local ranks at once; a flat ring whose ranks are numbered node by node
 * sends 2 (W-1)/W of the data over each node's link. Unequal nodes: reduce
 * to local rank 0, ring all-reduce among the local rank 0s, broadcast from
 * local rank 0.
 *
 * avg is a sum at every level and one division by W at the end (so integer
 * averages truncate as the flat ones do); max, min, prod and sum compose
 * with themselves. Every rank runs the same sequence of subgroup
 * collectives for the same count, so a count that differs between ranks is
 * caught by the subgroups' cross-rank check (DT_ERR_MISMATCH) like a flat
 * mismatch, and a failure in a subgroup fails the request and the group. */
#include "comm/pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt__hier_free(struct dt__hier *h)
{
    if (!h)
        return;
    dt_pg_free(h->inter);
    dt_pg_free(h->intra);
    free(h->counts);
    free(h->slot);
    free(h);
}

static dt_status level(dt_status st, const char *what)
{
    return st < 0 ? dt_error_wrap(st, "hierarchical all-reduce, %s", what) : st;
}

/* Ring all-reduce of buf (n elements) over the cross group g (one rank per
 * node): a reduce-scatter then an all-gather around the ring, so every
 * rank sends and receives 2 (N-1)/N of the data and both directions of
 * every node's link carry traffic at once (Open MPI's nonblocking
 * all-reduce of 2 ranks is a reduce to one rank and a broadcast back: one
 * direction at a time, half the link). Block j = [n j / N, n (j+1) / N);
 * each final block is reduced on one rank and copied to the others, so all
 * ranks get the same bits. tmp holds one block. */
static dt_status ring_allreduce(dt_pg *g, char *buf, size_t n, dt_dtype dt, dt_reduce_op op,
                                char *tmp)
{
    const int N = g->size, p = g->rank, nx = (p + 1) % N, pv = (p + N - 1) % N;
    const size_t es = dt_dtype_size(dt);
    if (N < 2 || n == 0)
        return DT_OK;
#define RB(j) (n * (size_t)(j) / (size_t)N)
#define RLEN(j) (RB((j) + 1) - RB(j))
    for (int s = 0; s < N - 1; s++) {
        int sb = (p - s + 2 * N) % N, rb = (p - s - 1 + 2 * N) % N;
        size_t sn = RLEN(sb), rn = RLEN(rb);
        dt_status st = dt_pg_sendrecv(g, buf + RB(sb) * es, sn, sn ? nx : -1, tmp, rn,
                                      rn ? pv : -1, dt);
        if (st < 0)
            return st;
        const void *srcs[2] = {buf + RB(rb) * es, tmp};
        dt__reduce(dt, op, buf + RB(rb) * es, srcs, 2, rn, 0);
    }
    for (int s = 0; s < N - 1; s++) {
        int sb = (p + 1 - s + N) % N, rb = (p - s + N) % N;
        size_t sn = RLEN(sb), rn = RLEN(rb);
        dt_status st = dt_pg_sendrecv(g, buf + RB(sb) * es, sn, sn ? nx : -1, buf + RB(rb) * es,
                                      rn, rn ? pv : -1, dt);
        if (st < 0)
            return st;
    }
#undef RB
#undef RLEN
    return DT_OK;
}

/* Wait for *r (if any) and free it; keep the first error in *st. */
static void settle(dt_req **r, dt_status *st, const char *what)
{
    if (!*r)
        return;
    dt_status s = dt_req_wait(*r, -1);
    dt_req_free(*r);
    *r = NULL;
    if (s < 0 && *st == DT_OK)
        *st = level(s, what);
}

/* Homogeneous nodes, pipelined in chunks of h->chunk elements (a multiple
 * of L; the last chunk may be shorter). For chunk c of m elements, per =
 * m / L, tail = m - L per:
 *   RS(c)  intra reduce-scatter: local rank l owns slice l (per elements),
 *          reduced over the node; a tail is all-reduced within the node and
 *          kept by l = L-1 with its slice;
 *   X(c)   inter ring all-reduce of the owned slice with the ranks that own
 *          it on the other nodes (this thread, blocking);
 *   AG(c)  intra all-gather of the slices.
 * RS and AG are posted asynchronously on the intra group (its executor runs
 * them in posting order: RS0 RS1 AG0 RS2 AG1 ...), so RS(c+1) and AG(c-1)
 * run over shared memory while X(c) is on the network: the link is idle
 * only for RS(0) and AG(last). All L local ranks run their X at once, each
 * on 1/L of the chunk, so a node's link carries 2 (N-1)/N of the data in
 * each direction, its ranks' transfers overlapping. */
static dt_status hier_homogeneous(struct dt__hier *h, char *buf, size_t n, dt_dtype dt,
                                  dt_reduce_op op)
{
    const int L = h->intra->size, l = h->intra->rank, N = h->inter->size;
    const size_t es = dt_dtype_size(dt);
    if (n == 0)
        return level(dt_pg_allreduce(h->intra, DT_IN_PLACE, buf, 0, dt, op), "intra-node");
    size_t C = h->chunk_bytes / es / (size_t)L * (size_t)L;
    if (C < (size_t)L)
        C = (size_t)L;
    const size_t K = (n + C - 1) / C;
    const size_t maxown = (C < n ? C : n) / (size_t)L + (size_t)L;
    char *tmp = malloc((maxown / (size_t)N + 1) * es);
    size_t *lay = malloc(4 * (size_t)L * sizeof *lay); /* counts, displs; two chunks in flight */
    if (!tmp || !lay) {
        free(tmp);
        free(lay);
        return dt_error(DT_ERR_NO_MEMORY, "hierarchical all-reduce: out of memory");
    }
    dt_req *rs = NULL, *tl = NULL, *ag[2] = {NULL, NULL};
    dt_status st = DT_OK;
#define CHUNK(c, base, m)                                                                          \
    size_t base = (c) * C, m = n - base < C ? n - base : C
    { /* RS(0) */
        CHUNK(0, b0, m0);
        size_t per = m0 / (size_t)L, tail = m0 - per * (size_t)L;
        st = level(dt_pg_reduce_scatter_async(h->intra, buf, buf + (size_t)l * per * es, per, dt,
                                              op, &rs),
                   "intra-node reduce-scatter");
        if (st == DT_OK && tail)
            st = level(dt_pg_allreduce_async(h->intra, DT_IN_PLACE, buf + (size_t)L * per * es,
                                             tail, dt, op, &tl),
                       "intra-node all-reduce of the remainder");
        (void)b0;
    }
    for (size_t c = 0; c < K && st == DT_OK; c++) {
        CHUNK(c, base, m);
        const size_t per = m / (size_t)L, tail = m - per * (size_t)L;
        char *cb = buf + base * es;
        settle(&rs, &st, "intra-node reduce-scatter");
        settle(&tl, &st, "intra-node all-reduce of the remainder");
        settle(&ag[c % 2], &st, "intra-node all-gather"); /* AG(c-2): queued before RS(c), done */
        if (st != DT_OK)
            break;
        if (c + 1 < K) { /* RS(c+1), overlapping X(c) */
            CHUNK(c + 1, nb, nm);
            size_t np = nm / (size_t)L, nt = nm - np * (size_t)L;
            char *nbuf = buf + nb * es;
            st = level(dt_pg_reduce_scatter_async(h->intra, nbuf, nbuf + (size_t)l * np * es, np,
                                                  dt, op, &rs),
                       "intra-node reduce-scatter");
            if (st == DT_OK && nt)
                st = level(dt_pg_allreduce_async(h->intra, DT_IN_PLACE,
                                                 nbuf + (size_t)L * np * es, nt, dt, op, &tl),
                           "intra-node all-reduce of the remainder");
            if (st != DT_OK)
                break;
        }
        size_t own = per + (l == L - 1 ? tail : 0);
        st = level(ring_allreduce(h->inter, cb + (size_t)l * per * es, own, dt, op, tmp),
                   "inter-node all-reduce");
        if (st != DT_OK)
            break;
        size_t *cnt = lay + (c % 2) * 2 * (size_t)L, *dsp = cnt + L;
        for (int j = 0; j < L; j++) {
            cnt[j] = per + (j == L - 1 ? tail : 0);
            dsp[j] = (size_t)j * per;
        }
        st = level(dt_pg_allgatherv_async(h->intra, DT_IN_PLACE, cb, cnt, dsp, dt, &ag[c % 2]),
                   "intra-node all-gather");
    }
#undef CHUNK
    settle(&rs, &st, "intra-node reduce-scatter");
    settle(&tl, &st, "intra-node all-reduce of the remainder");
    settle(&ag[0], &st, "intra-node all-gather");
    settle(&ag[1], &st, "intra-node all-gather");
    free(tmp);
    free(lay);
    return st;
}

static dt_status hier_rooted(struct dt__hier *h, char *buf, size_t n, dt_dtype dt, dt_reduce_op op)
{
    int root = h->intra->rank == 0;
    dt_status st = level(dt_pg_reduce(h->intra, root ? DT_IN_PLACE : buf, root ? buf : NULL, n, dt,
                                      op, 0),
                         "intra-node reduce");
    if (st == DT_OK && h->inter && n) {
        char *tmp = malloc((n / (size_t)h->inter->size + 1) * dt_dtype_size(dt));
        st = tmp ? level(ring_allreduce(h->inter, buf, n, dt, op, tmp), "inter-node all-reduce")
                 : dt_error(DT_ERR_NO_MEMORY, "hierarchical all-reduce: out of memory");
        free(tmp);
    }
    if (st == DT_OK)
        st = level(dt_pg_broadcast(h->intra, buf, n, dt, 0), "intra-node broadcast");
    return st;
}

static dt_status hier_pre(dt_req *r)
{
    dt_pg *pg = r->pg;
    struct dt__hier *h = pg->hier;
    const dt_coll *c = &r->c;
    size_t es = dt_dtype_size(c->dtype);
    char *buf = c->recv;
    if (!c->in_place && c->count)
        memcpy(buf, c->send, c->count * es);
    dt_reduce_op op = c->op == DT_REDUCE_AVG ? DT_REDUCE_SUM : c->op;
    dt_status st = pg->topo.homogeneous ? hier_homogeneous(h, buf, c->count, c->dtype, op)
                                        : hier_rooted(h, buf, c->count, c->dtype, op);
    if (st == DT_OK && c->op == DT_REDUCE_AVG && c->count)
        dt__avg_finish(c->dtype, buf, c->count, pg->size);
    r->pre_done = 1;
    return st;
}

dt_status dt__hier_allreduce(dt_pg *pg, const dt_coll *c, dt_req **req)
{
    dt_req *r;
    dt_status st = dt__pg_post_ex(pg, c, NULL, hier_pre, NULL, NULL, req != NULL, &r);
    if (st < 0 || req) {
        if (req)
            *req = st < 0 ? NULL : r;
        return st;
    }
    st = dt_req_wait(r, -1);
    dt_req_free(r);
    return st;
}

/* One all-gather of (slot, chunk KiB) over g: slot[r] = local(r) * nnodes +
 * node(r) (where rank r's block goes in the reduce-scatter) and
 * $DT_HIER_CHUNK_KB, which must be valid and equal on every rank (-1 =
 * invalid here: every rank fails instead of some waiting). slot stays only
 * for equal nodes (coll.c runs the two-level reduce-scatter where it is set). */
static dt_status agree(dt_pg *g, struct dt__hier *h, const dt_pg_topo *t, int32_t kb,
                       const char *kb_err)
{
    const int W = g->size;
    int32_t me[2] = {t->local_rank * t->nnodes + t->node, kb};
    int32_t *all = malloc(2 * (size_t)W * sizeof *all);
    h->slot = malloc((size_t)W * sizeof *h->slot);
    dt_status st = all && h->slot ? dt_pg_allgather(g, me, all, 2, DT_I32)
                                  : dt_error(DT_ERR_NO_MEMORY, "out of memory");
    for (int r = 0; st == DT_OK && r < W; r++) {
        h->slot[r] = all[2 * r];
        if (all[2 * r + 1] < 0)
            st = kb < 0 ? dt_error(DT_ERR_INVALID_ARG, "%s", kb_err)
                        : dt_error(DT_ERR_INVALID_ARG, "rank %d has an invalid DT_HIER_CHUNK_KB "
                                                       "(it says which)", r);
    }
    for (int r = 0; st == DT_OK && r < W; r++) {
        if (all[2 * r + 1] != kb)
            st = dt_error(DT_ERR_MISMATCH, "DT_HIER_CHUNK_KB differs between ranks (%d on rank "
                                           "%d, %d here)", (int)all[2 * r + 1], r, (int)kb);
    }
    h->chunk_bytes = (size_t)(kb > 0 ? kb : 1) * 1024;
    free(all);
    if (!t->homogeneous) { /* the two-level reduce-scatter needs equal nodes */
        free(h->slot);
        h->slot = NULL;
    }
    return st;
}

dt_status dt_pg_hierarchical(dt_pg *pg, dt_pg **out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_hierarchical: NULL argument");
    *out = NULL;
    int64_t kb = 0;
    char kb_err[256] = "";
    int kb_ok = dt_env_int("DT_HIER_CHUNK_KB", 4096, 1, 1 << 20, &kb) == DT_OK;
    if (!kb_ok)
        snprintf(kb_err, sizeof kb_err, "%s", dt_last_error());
    dt_pg_topo t;
    dt_status st = dt_pg_topology(pg, &t);
    if (st < 0)
        return st;
    dt_pg *g = NULL;
    st = dt_pg_dup(pg, &g);
    if (st < 0)
        return dt_error_wrap(st, "dt_pg_hierarchical");
    g->topo = t;
    if (t.nnodes > 1 && t.nnodes < pg->size) {
        struct dt__hier *h = calloc(1, sizeof *h);
        if (h)
            h->counts = malloc(2 * (size_t)t.local_size * sizeof *h->counts);
        if (!h || !h->counts) {
            free(h);
            dt_pg_free(g);
            return dt_error(DT_ERR_NO_MEMORY, "dt_pg_hierarchical: out of memory");
        }
        h->displs = h->counts + t.local_size;
        st = dt_pg_split(g, t.node, t.local_rank, &h->intra);
        int inter_color = t.homogeneous ? t.local_rank : (t.local_rank == 0 ? 0 : DT_PG_NO_COLOR);
        if (st == DT_OK)
            st = dt_pg_split(g, inter_color, t.node, &h->inter);
        if (st == DT_OK)
            st = agree(g, h, &t, kb_ok ? (int32_t)kb : -1, kb_err);
        if (st < 0) {
            dt__hier_free(h);
            dt_pg_free(g);
            return dt_error_wrap(st, "dt_pg_hierarchical: making the node groups");
        }
        g->hier = h;
    }
    *out = g;
    return DT_OK;
}

int dt_pg_is_hierarchical(const dt_pg *pg)
{
    return pg && pg->hier ? 1 : 0;
}

dt_pg_topo dt_pg_hier_topology(const dt_pg *pg)
{
    dt_pg_topo z;
    memset(&z, 0, sizeof z);
    return pg ? pg->topo : z;
}
