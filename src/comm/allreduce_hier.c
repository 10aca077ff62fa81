/* Hierarchical all-reduce: a composition over two subgroups (SEMANTICS.md
 * 7.1, Horovod's NCCLHierarchicalAllreduce with MPI across nodes).
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
 * Homogeneous nodes of L ranks, n elements, l = local rank, per = n / L,
 * tail = n - L*per (< L), slices of per elements except the last, which
 * also takes the tail (Horovod's root L-1 for the remainder):
 *   1. intra reduce-scatter of the L*per body: rank l owns slice l, reduced
 *      over the node;
 *   2. tail > 0: intra all-reduce of the tail (l = L-1 keeps it with its
 *      slice, which it now extends contiguously);
 *   3. inter all-reduce of the owned range (per, or per + tail on l = L-1)
 *      with the ranks of the other nodes that own the same range;
 *   4. intra all-gather (v: the last block is per + tail) of the ranges.
 * Network volume per node: one all-reduce of n elements spread over the L
 * cross groups, against L times that for a flat ring whose ranks all talk
 * across nodes. Unequal nodes: reduce to local rank 0, all-reduce among the
 * local rank 0s, broadcast from local rank 0.
 *
 * avg is a sum at every level and one division by W at the end (so integer
 * averages truncate as the flat ones do); max, min, prod and sum compose
 * with themselves. Every rank runs the same sequence of subgroup
 * collectives for the same count, so a count that differs between ranks is
 * caught by the subgroups' cross-rank check (DT_ERR_MISMATCH) like a flat
 * mismatch, and a failure in a subgroup fails the request and the group. */
#include "comm/pg.h"

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

static dt_status hier_homogeneous(dt_pg *pg, struct dt__hier *h, char *buf, size_t n, dt_dtype dt,
                                  dt_reduce_op op)
{
    const int L = h->intra->size, l = h->intra->rank;
    const size_t es = dt_dtype_size(dt), per = n / (size_t)L, tail = n - per * (size_t)L;
    (void)pg;
    char *mine = buf + (size_t)l * per * es;
    dt_status st = level(dt_pg_reduce_scatter(h->intra, buf, mine, per, dt, op),
                         "intra-node reduce-scatter");
    if (st == DT_OK && tail)
        st = level(dt_pg_allreduce(h->intra, DT_IN_PLACE, buf + (size_t)L * per * es, tail, dt, op),
                   "intra-node all-reduce of the remainder");
    size_t own = per + (l == L - 1 ? tail : 0);
    if (st == DT_OK)
        st = level(dt_pg_allreduce(h->inter, DT_IN_PLACE, mine, own, dt, op),
                   "inter-node all-reduce");
    if (st == DT_OK) {
        for (int j = 0; j < L; j++) {
            h->counts[j] = per + (j == L - 1 ? tail : 0);
            h->displs[j] = (size_t)j * per;
        }
        st = level(dt_pg_allgatherv(h->intra, DT_IN_PLACE, buf, h->counts, h->displs, dt),
                   "intra-node all-gather");
    }
    return st;
}

static dt_status hier_rooted(struct dt__hier *h, char *buf, size_t n, dt_dtype dt, dt_reduce_op op)
{
    int root = h->intra->rank == 0;
    dt_status st = level(dt_pg_reduce(h->intra, root ? DT_IN_PLACE : buf, root ? buf : NULL, n, dt,
                                      op, 0),
                         "intra-node reduce");
    if (st == DT_OK && h->inter)
        st = level(dt_pg_allreduce(h->inter, DT_IN_PLACE, buf, n, dt, op),
                   "inter-node all-reduce");
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
    dt_status st = pg->topo.homogeneous ? hier_homogeneous(pg, h, buf, c->count, c->dtype, op)
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

dt_status dt_pg_hierarchical(dt_pg *pg, dt_pg **out)
{
    if (!pg || !out)
        return dt_error(DT_ERR_NULL, "dt_pg_hierarchical: NULL argument");
    *out = NULL;
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
        if (st == DT_OK && t.homogeneous) { /* where each rank's block goes (reduce-scatter) */
            int32_t me = t.local_rank * t.nnodes + t.node;
            h->slot = malloc((size_t)pg->size * sizeof *h->slot);
            st = h->slot ? dt_pg_allgather(g, &me, h->slot, 1, DT_I32)
                         : dt_error(DT_ERR_NO_MEMORY, "out of memory");
        }
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
