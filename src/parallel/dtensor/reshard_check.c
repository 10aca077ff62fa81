/* The reshard agreement check: before any data moves, the ranks of each
 * mesh taking part compare what they were asked to do, so ranks that pass
 * different placements (or shapes, dtypes, target meshes) to the same
 * reshard get an error naming the tensor and both variants, on every rank,
 * instead of a collective mismatch or timeout later.
 *
 * One all-reduce(max) of four int64 per mesh dim (over the dim's line, so
 * after all dims every rank holds the mesh-wide max): [e, h, -e, -h] with e
 * the source and target placements packed in 6 bits each and h a 62-bit
 * hash of the global shape, dtype and both meshes. max and -max(-x) give
 * the largest and smallest value any rank has; they differ iff some ranks
 * disagree, and each is one rank's actual value, so the message can decode
 * both. Across meshes that together hold every rank of the world, one
 * all-reduce over the world group; otherwise each mesh checks by itself (a
 * disagreement between the two meshes alone is then left to the comm
 * layer's checks and timeout). On by default (about one small all-reduce per mesh dim, a few
 * microseconds on shm, but a point where every rank of the line must be
 * running: for a local transition such as R -> S the only one, so on a
 * loaded machine it can cost more than the local copy); DT_RESHARD_CHECK=0 turns it off. */
#include "dtensor_impl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 6 bits: kind (2) and Shard dim or Partial op (4). */
static int64_t enc_list(const dt_placement *p, int mn)
{
    int64_t e = mn;
    for (int i = 0; i < mn; i++) {
        int par = p[i].kind == DT_PLACE_SHARD ? p[i].dim
                : p[i].kind == DT_PLACE_PARTIAL ? (int)p[i].op : 0;
        e |= (int64_t)(((unsigned)p[i].kind & 3u) << 4 | ((unsigned)par & 15u)) << (3 + 6 * i);
    }
    return e;
}

static void dec_list(int64_t e, dt_placement *p, int *mn)
{
    *mn = (int)(e & 7);
    for (int i = 0; i < *mn; i++) {
        unsigned b = (unsigned)(e >> (3 + 6 * i)) & 63u;
        int kind = (int)(b >> 4), par = (int)(b & 15u);
        p[i] = kind == DT_PLACE_SHARD ? dt_shard(par)
             : kind == DT_PLACE_PARTIAL ? dt_partial((dt_reduce_op)par) : dt_replicate();
    }
}

static uint64_t mesh_hash(const dt_mesh *m, uint64_t h)
{
    int n = dt_mesh_ndim(m), size = 1;
    for (int i = 0; i < n; i++) {
        int s = dt_mesh_size(m, i);
        h = dt_hash64(&s, sizeof s, h);
        size *= s;
    }
    return dt_hash64(dt_mesh_ranks(m), (size_t)size * sizeof(int), h);
}

static int check_on(void)
{
    static _Atomic int on = -1;
    int v = atomic_load(&on);
    if (v < 0) {
        int64_t x = 1;
        if (dt_env_int("DT_RESHARD_CHECK", 1, 0, 1, &x) < 0)
            x = 1; /* a malformed value keeps the check (the parser's error is dropped) */
        v = (int)x;
        atomic_store(&on, v);
    }
    return v;
}

/* Max of v (4 entries) over the world group (m NULL: both meshes cover
 * it), else over mesh m by its lines, dim after dim. */
static dt_status mesh_max(dt_mesh *m, dt_pg *world, int64_t *v)
{
    if (!m)
        return dt_pg_allreduce(world, DT_IN_PLACE, v, 4, DT_I64, DT_REDUCE_MAX);
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (dt_mesh_size(m, i) > 1) {
            dt_status st = dt_pg_allreduce(dt_mesh_dim_group(m, i), DT_IN_PLACE, v, 4, DT_I64,
                                           DT_REDUCE_MAX);
            if (st < 0)
                return st;
        }
    return DT_OK;
}

static dt_status agree_on(dt_mesh *m /* NULL: world */, const char *side, dt_mesh *mf, const dt_placement *pf,
                          dt_mesh *mt, const dt_placement *pt, int ndim, const int64_t *shape,
                          dt_dtype dt, const char *what)
{
    int mnf = dt_mesh_ndim(mf), mnt = dt_mesh_ndim(mt);
    int64_t e = enc_list(pf, mnf) | enc_list(pt, mnt) << 27;
    uint64_t h = dt_hash64(shape, (size_t)ndim * sizeof *shape, (uint64_t)ndim * 131 + (uint64_t)dt);
    h = mesh_hash(mt, mesh_hash(mf, h)) >> 2;
    int64_t v[4] = {e, (int64_t)h, -e, -(int64_t)h};
    dt_status st = mesh_max(m, dt_mesh_world(mf), v);
    if (st < 0)
        return dt_error_wrap(st, "reshard of %s: the placement agreement check", what);
    if (v[0] == -v[2] && v[1] == -v[3])
        return DT_OK;
    char ms[256];
    if (m)
        dt_mesh_str(m, ms, sizeof ms);
    else
        snprintf(ms, sizeof ms, "(every rank)");
    if (v[0] == -v[2])
        return dt_error(DT_ERR_MISMATCH,
                        "reshard of %s: the ranks of the %s %s pass the same placements but "
                        "a different global shape, dtype or mesh (this rank: %s, %d dims)",
                        what, side, ms, dt_dtype_name(dt), ndim);
    char a[4][160];
    int64_t ev[2] = {v[0], -v[2]};
    for (int k = 0; k < 2; k++) {
        dt_placement p[DT_MESH_MAX_DIMS];
        int n;
        dec_list(ev[k] & ((1 << 27) - 1), p, &n);
        dt_placements_str(p, n, a[2 * k], sizeof a[0]);
        dec_list(ev[k] >> 27, p, &n);
        dt_placements_str(p, n, a[2 * k + 1], sizeof a[0]);
    }
    char mine_f[160], mine_t[160];
    dt_placements_str(pf, mnf, mine_f, sizeof mine_f);
    dt_placements_str(pt, mnt, mine_t, sizeof mine_t);
    return dt_error(DT_ERR_MISMATCH,
                    "reshard of %s: the ranks of the %s %s disagree on the placements: "
                    "some pass %s -> %s, others %s -> %s (this rank: %s -> %s)",
                    what, side, ms, a[0], a[1], a[2], a[3], mine_f, mine_t);
}

/* Is every world rank in mf or mt? */
static bool covers_world(const dt_mesh *mf, const dt_mesh *mt)
{
    int W = dt_pg_size(dt_mesh_world(mf));
    char *in = calloc((size_t)W, 1);
    if (!in)
        return false;
    const dt_mesh *ms[2] = {mf, mt};
    for (int k = 0; k < 2; k++) {
        int n = 1;
        for (int i = 0; i < dt_mesh_ndim(ms[k]); i++)
            n *= dt_mesh_size(ms[k], i);
        for (int i = 0; i < n; i++)
            if (dt_mesh_ranks(ms[k])[i] >= 0 && dt_mesh_ranks(ms[k])[i] < W)
                in[dt_mesh_ranks(ms[k])[i]] = 1;
    }
    bool all = true;
    for (int r = 0; r < W; r++)
        all = all && in[r];
    free(in);
    return all;
}

dt_status dt__reshard_agree(dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                            const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                            const char *what)
{
    if (!check_on())
        return DT_OK;
    if (mt != mf && covers_world(mf, mt)) /* one check: every rank sees every variant */
        return agree_on(NULL, "source and target meshes", mf, pf, mt, pt, ndim, shape, dt, what);
    /* each mesh by itself; a rank in both runs both checks whatever the
     * first said, so no rank is left waiting in the second */
    dt_status st = DT_OK, st2 = DT_OK;
    if (dt_mesh_contains_self(mf))
        st = agree_on(mf, "source mesh", mf, pf, mt, pt, ndim, shape, dt, what);
    if (mt != mf && dt_mesh_contains_self(mt)) {
        char keep[512];
        snprintf(keep, sizeof keep, "%s", st < 0 ? dt_last_error() : "");
        st2 = agree_on(mt, "target mesh", mf, pf, mt, pt, ndim, shape, dt, what);
        if (st < 0)
            return dt_error(st, "%s", keep);
    }
    return st < 0 ? st : st2;
}
