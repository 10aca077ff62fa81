/* Hierarchical reduce-scatter: a composition over the two subgroups of a
 * dt_pg_hierarchical group with homogeneous nodes (N nodes of L ranks), so
 * that ZeRO-2/3's gradient reduce-scatter also sends only a node's share
 * across the network.
 *
 * Rank r must end with block r (count elements) reduced over all W ranks.
 * The intra-node reduce-scatter gives local rank l the l-th of L segments
 * of its input, reduced over the node; the inter-node reduce-scatter among
 * the ranks with local rank l (in node order) gives node n's one the n-th
 * block of that segment. So the input is first copied block by block into
 * a scratch buffer in the order slot(r) = l(r) * N + n(r) (ranks need not
 * be numbered node by node: `mpirun --map-by node` interleaves them); then
 * segment l holds exactly the blocks of the ranks with local rank l, in
 * node order, and the two reduce-scatters leave block r on rank r.
 *
 * Cost: one copy of the W blocks into scratch (W * count elements while
 * the request runs), against the network volume of a node's share only.
 * avg = sum at both levels, one division by W at the end. */
#include "comm/pg.h"

#include <stdlib.h>
#include <string.h>

static dt_status rs_pre(dt_req *r)
{
    dt_pg *pg = r->pg;
    struct dt__hier *h = pg->hier;
    const dt_coll *c = &r->c;
    const size_t es = dt_dtype_size(c->dtype), blk = c->count * es;
    const int W = pg->size, L = h->intra->size, N = W / L, l = h->intra->rank;
    r->pre_done = 1;
    char *tmp = malloc((size_t)W * blk + 1);
    if (!tmp)
        return dt_error(DT_ERR_NO_MEMORY, "hierarchical reduce-scatter: %zu bytes of scratch",
                        (size_t)W * blk);
    for (int q = 0; q < W; q++)
        memcpy(tmp + (size_t)h->slot[q] * blk, (const char *)c->send + (size_t)q * blk, blk);
    dt_reduce_op op = c->op == DT_REDUCE_AVG ? DT_REDUCE_SUM : c->op;
    char *seg = tmp + (size_t)l * N * blk;
    dt_status st = dt_pg_reduce_scatter(h->intra, tmp, seg, (size_t)N * c->count, c->dtype, op);
    if (st < 0)
        st = dt_error_wrap(st, "hierarchical reduce-scatter, intra-node");
    if (st == DT_OK) {
        st = dt_pg_reduce_scatter(h->inter, seg, c->recv, c->count, c->dtype, op);
        if (st < 0)
            st = dt_error_wrap(st, "hierarchical reduce-scatter, inter-node");
    }
    if (st == DT_OK && c->op == DT_REDUCE_AVG && c->count)
        dt__avg_finish(c->dtype, c->recv, c->count, W);
    free(tmp);
    return st;
}

dt_status dt__hier_reduce_scatter(dt_pg *pg, const dt_coll *c, dt_req **req)
{
    dt_req *r;
    dt_status st = dt__pg_post_ex(pg, c, NULL, rs_pre, NULL, NULL, req != NULL, &r);
    if (st < 0 || req) {
        if (req)
            *req = st < 0 ? NULL : r;
        return st;
    }
    st = dt_req_wait(r, -1);
    dt_req_free(r);
    return st;
}
