/* Cross-mesh reshard: point-to-point transfers of intersecting boxes.
 *
 * Source and target placements are Partial-free here (reshard.c reduces
 * and re-applies Partial on each side). Every rank computes the same plan:
 * the source ranks are grouped by the box they hold (replicas hold the same
 * box, in mesh order); for each target rank t (mesh order, index ti) and
 * each source box B intersecting t's box, the replica number ti % |B| of B
 * sends the intersection. So one replica serves each destination, and the
 * destinations spread over the replicas. A rank that is both the sender
 * and the receiver copies locally. Each (sender, receiver) pair carries at
 * most one box, preceded by a one-int message with the sender's
 * requires-grad flag. A box that is one contiguous run of the sender's
 * piece is sent from the piece, one that is a run of the receiver's piece
 * is received into it (else packed / unpacked through a buffer of ctx);
 * the receiver's piece is not zero-filled first: the source boxes cover
 * the tensor, so every element of it arrives. All sends and receives of a rank are posted as one
 * batch on the world group (comm.h: batched point to point), so the order
 * of posting cannot deadlock. */
#include "dtensor_impl.h"

#include <string.h>

typedef struct {
    int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
} box;

static bool box_eq(const box *a, const box *b, int nd)
{
    for (int d = 0; d < nd; d++)
        if (a->st[d] != b->st[d] || a->len[d] != b->len[d])
            return false;
    return true;
}

/* a ∩ b into o; false when empty. */
static bool box_meet(const box *a, const box *b, int nd, box *o)
{
    for (int d = 0; d < nd; d++) {
        int64_t lo = a->st[d] > b->st[d] ? a->st[d] : b->st[d];
        int64_t ea = a->st[d] + a->len[d], eb = b->st[d] + b->len[d];
        int64_t hi = ea < eb ? ea : eb;
        if (hi <= lo)
            return false;
        o->st[d] = lo;
        o->len[d] = hi - lo;
    }
    return true;
}

/* Is the box (off, len) of a tensor of shape sh one contiguous run? (Dims
 * before some dim d are 1 long, dims after it whole.) Its first element in
 * *at. An empty box is not. */
static bool box_run(const int64_t *sh, const int64_t *off, const int64_t *len, int nd, int64_t *at)
{
    int d = 0;
    while (d < nd - 1 && len[d] == 1)
        d++;
    for (int e = d + 1; e < nd; e++)
        if (len[e] != sh[e])
            return false;
    int64_t a = 0, str = 1;
    for (int e = nd - 1; e >= 0; e--) {
        if (len[e] <= 0)
            return false;
        a += off[e] * str;
        str *= sh[e];
    }
    *at = a;
    return true;
}

static void box_of(const dt_mesh *m, const dt_placement *p, int nd, const int64_t *shape, int rank,
                   box *b)
{
    int c[DT_MESH_MAX_DIMS];
    dt_mesh_coords_of(m, rank, c);
    dt__box(m, p, nd, shape, c, b->st, b->len);
}

dt_status dt__reshard_cross(dt_ctx *ctx, dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                            const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                            const void *in, void *out, int *rg)
{
    dt_pg *w = dt_mesh_world(mf);
    int me = dt_pg_rank(w);
    bool in_f = dt_mesh_contains_self(mf), in_t = dt_mesh_contains_self(mt);
    if (!in_f && !in_t)
        return DT_OK;
    int nf = dt_mesh_size(mf, -1), nt = dt_mesh_size(mt, -1);
    const int *rf = dt_mesh_ranks(mf), *rt = dt_mesh_ranks(mt);
    size_t esz = dt_dtype_size(dt);
    /* source boxes, grouped: grp[i] = group id of source i, reps of a group in order */
    box *sb = dt_ctx_alloc(ctx, (size_t)nf * sizeof *sb);
    int *grp = dt_ctx_alloc(ctx, (size_t)nf * sizeof(int));
    int *nrep = dt_ctx_alloc(ctx, (size_t)nf * sizeof(int));
    int *rep = dt_ctx_alloc(ctx, (size_t)nf * (size_t)nf * sizeof(int)); /* [group][replica] */
    if (!sb || !grp || !nrep || !rep)
        return dt_last_status();
    int ng = 0;
    for (int i = 0; i < nf; i++) {
        box_of(mf, pf, ndim, shape, rf[i], &sb[i]);
        int g = 0;
        while (g < ng && !box_eq(&sb[rep[g * nf]], &sb[i], ndim))
            g++;
        if (g == ng)
            nrep[ng++] = 0;
        grp[i] = g;
        rep[g * nf + nrep[g]++] = i;
    }
    box mybox_f = {{0}, {0}}, mybox_t = {{0}, {0}};
    if (in_f)
        box_of(mf, pf, ndim, shape, me, &mybox_f);
    if (in_t)
        box_of(mt, pt, ndim, shape, me, &mybox_t);
    /* at most one send and one receive per target, per group: count first */
    int maxreq = 2 * 2 * (nt * ng) + 2;
    dt_req **rq = dt_ctx_alloc(ctx, (size_t)maxreq * sizeof *rq);
    int32_t *flags = dt_ctx_alloc(ctx, (size_t)(nt * ng + 1) * sizeof(int32_t));
    struct pend {
        void *buf;
        box b;
    } *pend = dt_ctx_alloc(ctx, (size_t)(nt * ng + 1) * sizeof *pend);
    if (!rq || !flags || !pend)
        return dt_last_status();
    int nr = 0, np = 0;
    int32_t myflag = rg ? *rg : 0;
    int64_t zero[DT_MAX_DIMS] = {0};
    dt_status st = DT_OK;
    for (int ti = 0; ti < nt && st >= 0; ti++) {
        int t = rt[ti];
        box tb;
        box_of(mt, pt, ndim, shape, t, &tb);
        for (int g = 0; g < ng && st >= 0; g++) {
            int src = rf[rep[g * nf + ti % nrep[g]]];
            if (src != me && t != me)
                continue;
            box x;
            if (!box_meet(&sb[rep[g * nf]], &tb, ndim, &x))
                continue;
            int64_t n = dt__numel(x.len, ndim);
            int64_t soff[DT_MAX_DIMS], toff[DT_MAX_DIMS];
            for (int d = 0; d < ndim; d++) {
                soff[d] = x.st[d] - mybox_f.st[d];
                toff[d] = x.st[d] - mybox_t.st[d];
            }
            if (src == me && t == me) {
                dt__copy_box(out, mybox_t.len, toff, in, mybox_f.len, soff, x.len, ndim, dt);
                continue;
            }
            int64_t at;
            if (src == me) {
                /* a box that is one run of the input is sent from there */
                const void *buf;
                if (!box_run(mybox_f.len, soff, x.len, ndim, &at)) {
                    void *pk = dt_ctx_alloc(ctx, (size_t)n * esz + 1);
                    if (!pk)
                        return dt_last_status();
                    dt__copy_box(pk, x.len, zero, in, mybox_f.len, soff, x.len, ndim, dt);
                    buf = pk;
                } else {
                    buf = (const char *)in + (size_t)at * esz;
                }
                st = dt_pg_send_async(w, &myflag, 1, DT_I32, t, &rq[nr++]);
                if (st >= 0)
                    st = dt_pg_send_async(w, buf, (size_t)n, dt, t, &rq[nr++]);
            } else {
                /* one run of the output: received in place, no unpack */
                bool direct = box_run(mybox_t.len, toff, x.len, ndim, &at);
                void *buf = direct ? (char *)out + (size_t)at * esz
                                   : dt_ctx_alloc(ctx, (size_t)n * esz + 1);
                if (!buf)
                    return dt_last_status();
                flags[np] = 0;
                pend[np].buf = direct ? NULL : buf;
                pend[np].b = x;
                st = dt_pg_recv_async(w, &flags[np], 1, DT_I32, src, &rq[nr++]);
                if (st >= 0)
                    st = dt_pg_recv_async(w, buf, (size_t)n, dt, src, &rq[nr++]);
                np++;
            }
        }
    }
    if (st >= 0 && nr > 0)
        st = dt_req_wait_all(rq, nr, -1);
    for (int i = 0; i < nr; i++)
        dt_req_free(rq[i]);
    if (st < 0) {
        char a[256], b[256];
        return dt_error_wrap(st, "cross-mesh reshard from %s to %s", dt_mesh_str(mf, a, sizeof a),
                             dt_mesh_str(mt, b, sizeof b));
    }
    int32_t any = 0;
    for (int i = 0; i < np; i++) {
        any |= flags[i];
        if (!pend[i].buf)
            continue; /* received in place */
        int64_t toff[DT_MAX_DIMS];
        for (int d = 0; d < ndim; d++)
            toff[d] = pend[i].b.st[d] - mybox_t.st[d];
        dt__copy_box(out, mybox_t.len, toff, pend[i].buf, pend[i].b.len, zero, pend[i].b.len, ndim,
                     dt);
    }
    if (rg && np > 0 && !in_f)
        *rg = any != 0;
    return DT_OK;
}
