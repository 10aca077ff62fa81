/* Distributed tensors: placements, the box each rank holds, construction.
 *
 * A rank's piece is a box of the global tensor: for each tensor dim d, the
 * torch.chunk range of the mesh dim that shards d at this rank's coordinate
 * there (the whole extent when no mesh dim shards it). Every check happens
 * before any communication and depends only on arguments that every rank
 * passes alike, so a bad placement is the same error everywhere. */
#include "dtensor_impl.h"
#include "tensor/tensor_impl.h"
#include "base/copy.h"

#include <stdio.h>
#include <string.h>

int64_t dt__outer(const int64_t *shape, int d)
{
    int64_t a = 1;
    for (int i = 0; i < d; i++)
        a *= shape[i];
    return a;
}

int64_t dt__inner(const int64_t *shape, int ndim, int d)
{
    int64_t b = 1;
    for (int i = d + 1; i < ndim; i++)
        b *= shape[i];
    return b;
}

int64_t dt__numel(const int64_t *shape, int ndim)
{
    return dt__outer(shape, ndim);
}

/* Recursive box copy: the two innermost dims are one strided row copy
 * (dt__copy_rows: the row loop inside one function). */
static void copy_rec(char *dst, const int64_t *dstr, const char *src, const int64_t *sstr,
                     const int64_t *len, int ndim, int d, size_t esz)
{
    if (d == ndim - 1) {
        memcpy(dst, src, (size_t)len[d] * esz);
        return;
    }
    if (d == ndim - 2) {
        dt__copy_rows(dst, (size_t)dstr[d] * esz, src, (size_t)sstr[d] * esz, (size_t)len[d],
                      (size_t)len[d + 1] * esz);
        return;
    }
    for (int64_t i = 0; i < len[d]; i++)
        copy_rec(dst + (size_t)(i * dstr[d]) * esz, dstr, src + (size_t)(i * sstr[d]) * esz, sstr,
                 len, ndim, d + 1, esz);
}

void dt__copy_box(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                  const int64_t *sshape, const int64_t *soff, const int64_t *len, int ndim,
                  dt_dtype dt)
{
    size_t esz = dt_dtype_size(dt);
    if (ndim == 0) {
        memcpy(dst, src, esz);
        return;
    }
    for (int d = 0; d < ndim; d++)
        if (len[d] == 0)
            return;
    /* Trailing dims the box covers whole in both tensors are one run with
     * the dim before them ([A, len, 1] copies rows of len, not single
     * elements: a memcpy per element made S(1) -> R 19x its all-gather). */
    int64_t dsh[DT_MAX_DIMS], ssh[DT_MAX_DIMS], dof[DT_MAX_DIMS], sof[DT_MAX_DIMS], ln[DT_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        dsh[d] = dshape[d], ssh[d] = sshape[d], dof[d] = doff[d], sof[d] = soff[d], ln[d] = len[d];
    while (ndim > 1 && ln[ndim - 1] == dsh[ndim - 1] && ln[ndim - 1] == ssh[ndim - 1]) {
        int l = ndim - 1, p = ndim - 2; /* dof[l] == sof[l] == 0: the box is the whole extent */
        dof[p] *= dsh[l], sof[p] *= ssh[l];
        dsh[p] *= dsh[l], ssh[p] *= ssh[l], ln[p] *= ln[l];
        ndim--;
    }
    int64_t dstr[DT_MAX_DIMS], sstr[DT_MAX_DIMS];
    int64_t ds = 1, ss = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        dstr[d] = ds;
        sstr[d] = ss;
        ds *= dsh[d];
        ss *= ssh[d];
    }
    int64_t od = 0, os = 0;
    for (int d = 0; d < ndim; d++) {
        od += dof[d] * dstr[d];
        os += sof[d] * sstr[d];
    }
    copy_rec((char *)dst + (size_t)od * esz, dstr, (const char *)src + (size_t)os * esz, sstr, ln,
             ndim, 0, esz);
}

void dt_chunk_range(int64_t n, int k, int i, int64_t *start, int64_t *len)
{
    int64_t c = k > 0 ? (n + k - 1) / k : n;
    int64_t s = (int64_t)i * c, e = s + c;
    if (s > n)
        s = n;
    if (e > n)
        e = n;
    if (start)
        *start = s;
    if (len)
        *len = e - s;
}

char *dt_placements_str(const dt_placement *p, int n, char *buf, size_t len)
{
    if (!buf || len == 0)
        return buf;
    size_t k = 0;
    k += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && p; i++) {
        const char *sep = i ? ", " : "";
        switch (p[i].kind) {
        case DT_PLACE_REPLICATE:
            k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%sReplicate()", sep);
            break;
        case DT_PLACE_SHARD:
            k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%sShard(%d)", sep, p[i].dim);
            break;
        case DT_PLACE_PARTIAL:
            k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%sPartial(%s)", sep,
                                  dt_reduce_op_name(p[i].op));
            break;
        default:
            k += (size_t)snprintf(buf + k, k < len ? len - k : 0, "%s?", sep);
        }
    }
    snprintf(buf + k, k < len ? len - k : 0, "]");
    return buf;
}

dt_status dt__placements_check(const dt_mesh *m, const dt_placement *pl, int ndim,
                               const char *what, dt_placement *out)
{
    char ms[256], ps[256];
    if (!what)
        what = "tensor";
    if (!m || !pl)
        return dt_error(DT_ERR_NULL, "%s: NULL mesh or placements", what);
    int mn = dt_mesh_ndim(m);
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "%s: %d dims", what, ndim);
    dt_placement tmp[DT_MESH_MAX_DIMS];
    int shard_by[DT_MAX_DIMS];
    for (int d = 0; d < DT_MAX_DIMS; d++)
        shard_by[d] = -1;
    int pop = -1;
    for (int i = 0; i < mn; i++) {
        tmp[i] = pl[i];
        switch (pl[i].kind) {
        case DT_PLACE_REPLICATE:
            tmp[i].dim = 0;
            tmp[i].op = DT_REDUCE_SUM;
            break;
        case DT_PLACE_SHARD: {
            int d = pl[i].dim;
            if (d < -ndim || d >= ndim)
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: Shard(%d) on mesh dim %d ('%s') of %s, but the tensor has %d "
                                "dim%s (valid: %d to %d)",
                                what, d, i, dt_mesh_dim_name(m, i), dt_mesh_str(m, ms, sizeof ms),
                                ndim, ndim == 1 ? "" : "s", -ndim, ndim - 1);
            if (d < 0)
                d += ndim;
            if (shard_by[d] >= 0)
                return dt_error(DT_ERR_UNSUPPORTED,
                                "%s: tensor dim %d is sharded by mesh dims %d and %d of %s "
                                "(placements %s); nested sharding is not supported",
                                what, d, shard_by[d], i, dt_mesh_str(m, ms, sizeof ms),
                                dt_placements_str(pl, mn, ps, sizeof ps));
            shard_by[d] = i;
            tmp[i].dim = d;
            tmp[i].op = DT_REDUCE_SUM;
            break;
        }
        case DT_PLACE_PARTIAL:
            if (pl[i].op != DT_REDUCE_SUM && pl[i].op != DT_REDUCE_AVG &&
                pl[i].op != DT_REDUCE_MAX && pl[i].op != DT_REDUCE_MIN)
                return dt_error(DT_ERR_INVALID_ARG,
                                "%s: Partial on mesh dim %d of %s: op must be sum, avg, max or min",
                                what, i, dt_mesh_str(m, ms, sizeof ms));
            if (pop >= 0 && (int)pl[i].op != pop)
                return dt_error(DT_ERR_UNSUPPORTED,
                                "%s: placements %s mix Partial(%s) and Partial(%s); one op per tensor",
                                what, dt_placements_str(pl, mn, ps, sizeof ps),
                                dt_reduce_op_name((dt_reduce_op)pop), dt_reduce_op_name(pl[i].op));
            pop = (int)pl[i].op;
            tmp[i].dim = 0;
            break;
        default:
            return dt_error(DT_ERR_INVALID_ARG, "%s: placement %d of %s has an unknown kind %d",
                            what, i, dt_mesh_str(m, ms, sizeof ms), (int)pl[i].kind);
        }
    }
    if (out)
        memcpy(out, tmp, (size_t)mn * sizeof *out);
    return DT_OK;
}

void dt__box(const dt_mesh *m, const dt_placement *pl, int ndim, const int64_t *shape,
             const int *coords, int64_t *start, int64_t *len)
{
    for (int d = 0; d < ndim; d++) {
        start[d] = 0;
        len[d] = shape[d];
    }
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (pl[i].kind == DT_PLACE_SHARD) {
            int d = pl[i].dim;
            dt_chunk_range(shape[d], dt_mesh_size(m, i), coords[i], &start[d], &len[d]);
        }
}

dt_status dt_dtensor_local_box(const dt_mesh *m, const dt_placement *pl, int ndim,
                               const int64_t *shape, const int *coords, const char *what,
                               int64_t *start, int64_t *len)
{
    dt_placement p[DT_MESH_MAX_DIMS];
    dt_status st = dt__placements_check(m, pl, ndim, what, p);
    if (st < 0)
        return st;
    if (!shape || !start || !len)
        return dt_error(DT_ERR_NULL, "dt_dtensor_local_box: NULL argument");
    int c[DT_MESH_MAX_DIMS];
    if (!coords) {
        if (!dt_mesh_contains_self(m))
            return DT_ERR_NOT_FOUND;
        for (int i = 0; i < dt_mesh_ndim(m); i++)
            c[i] = dt_mesh_coord(m, i);
        coords = c;
    }
    dt__box(m, p, ndim, shape, coords, start, len);
    return DT_OK;
}

/* This rank's local shape (all zeros outside the mesh). */
static void local_shape(const dt_mesh *m, const dt_placement *p, int ndim, const int64_t *shape,
                        int64_t *out)
{
    if (!dt_mesh_contains_self(m)) {
        for (int d = 0; d < ndim; d++)
            out[d] = 0;
        return;
    }
    int c[DT_MESH_MAX_DIMS];
    int64_t st[DT_MAX_DIMS];
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        c[i] = dt_mesh_coord(m, i);
    dt__box(m, p, ndim, shape, c, st, out);
}

dt_dtensor *dt__dtensor_make(dt_ctx *ctx, dt_mesh *m, dt_tensor *local, const dt_placement *pl,
                             int ndim, const int64_t *shape, const char *name)
{
    dt_dtensor *x = ctx ? dt_ctx_alloc(ctx, sizeof *x) : dt_calloc(sizeof *x);
    if (!x) {
        dt_error(DT_ERR_NO_MEMORY, "dtensor: out of memory");
        return NULL;
    }
    memset(x, 0, sizeof *x);
    x->mesh = m;
    x->local = local;
    memcpy(x->placements, pl, (size_t)dt_mesh_ndim(m) * sizeof *pl);
    x->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        x->shape[d] = shape[d];
    x->dtype = local->dtype;
    x->name = name;
    x->flags = ctx ? 0 : DT_DTENSOR_PERSISTENT;
    return x;
}

dt_status dt_dtensor_from_local(dt_ctx *ctx, dt_mesh *m, dt_tensor *local, const dt_placement *pl,
                                const int64_t *shape, dt_dtensor **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_dtensor_from_local: NULL out");
    *out = NULL;
    if (!local || !m)
        return dt_error(DT_ERR_NULL, "dt_dtensor_from_local: NULL local or mesh");
    const char *what = local->name ? local->name : "tensor";
    dt_placement p[DT_MESH_MAX_DIMS];
    dt_status st = dt__placements_check(m, pl, local->ndim, what, p);
    if (st < 0)
        return st;
    int64_t g[DT_MAX_DIMS], ls[DT_MAX_DIMS];
    for (int d = 0; d < local->ndim; d++)
        g[d] = shape ? shape[d] : local->shape[d];
    if (!shape)
        for (int i = 0; i < dt_mesh_ndim(m); i++)
            if (p[i].kind == DT_PLACE_SHARD)
                g[p[i].dim] *= dt_mesh_size(m, i);
    local_shape(m, p, local->ndim, g, ls);
    bool ok = dt_mesh_contains_self(m) || local->ndim == 0 || dt_tensor_numel(local) == 0;
    for (int d = 0; ok && d < local->ndim && dt_mesh_contains_self(m); d++)
        ok = ls[d] == local->shape[d];
    if (!ok || !dt_tensor_is_contiguous(local) || (local->flags & DT_TENSOR_BLOCKED)) {
        char a[96], ms[256], ps[256];
        return dt_error(DT_ERR_SHAPE,
                        "dt_dtensor_from_local: %s: local piece %s (must be contiguous) does not fit "
                        "placements %s of the global shape on %s",
                        what, dt_tensor_shape_str(local, a, sizeof a),
                        dt_placements_str(p, dt_mesh_ndim(m), ps, sizeof ps),
                        dt_mesh_str(m, ms, sizeof ms));
    }
    *out = dt__dtensor_make(ctx, m, local, p, local->ndim, g, local->name);
    return *out ? DT_OK : dt_last_status();
}

/* A local piece: temporary of ctx, or owned persistent tensor. */
static dt_tensor *new_local(dt_ctx *ctx, dt_dtype dt, int ndim, const int64_t *shape)
{
    return ctx ? dt_tensor_zeros(ctx, dt, ndim, shape) : dt_tensor_new(dt, ndim, shape);
}

/* Zero the piece if a Partial(sum) placement leaves this coordinate empty
 * (R -> P: coordinate 0 keeps the value). */
static bool partial_zero(const dt_mesh *m, const dt_placement *p)
{
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (p[i].kind == DT_PLACE_PARTIAL && p[i].op == DT_REDUCE_SUM && dt_mesh_coord(m, i) != 0)
            return true;
    return false;
}

dt_status dt_shard_tensor(dt_ctx *ctx, dt_mesh *m, dt_tensor *full, const dt_placement *pl,
                          dt_dtensor **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_shard_tensor: NULL out");
    *out = NULL;
    if (!full || !m)
        return dt_error(DT_ERR_NULL, "dt_shard_tensor: NULL tensor or mesh");
    const char *what = full->name ? full->name : "tensor";
    dt_placement p[DT_MESH_MAX_DIMS];
    dt_status st = dt__placements_check(m, pl, full->ndim, what, p);
    if (st < 0)
        return st;
    if (ctx && dt_ag_enabled(ctx) && (full->flags & DT_TENSOR_REQUIRES_GRAD)) {
        /* differentiable: full as a replicated dtensor, resharded */
        dt_placement r[DT_MESH_MAX_DIMS];
        for (int i = 0; i < dt_mesh_ndim(m); i++)
            r[i] = dt_replicate();
        dt_tensor *src = full;
        if (!dt_tensor_is_contiguous(full) || (full->flags & DT_TENSOR_BLOCKED))
            src = dt_contiguous(ctx, full);
        if (!src)
            return dt_last_status();
        dt_dtensor *x = dt__dtensor_make(ctx, m, src, r, full->ndim, full->shape, full->name);
        if (!x)
            return dt_last_status();
        if (!dt_mesh_contains_self(m)) {
            /* outside the mesh the piece is empty */
            int64_t z[DT_MAX_DIMS] = {0};
            x->local = dt_tensor_zeros(ctx, full->dtype, full->ndim, z);
            if (!x->local)
                return dt_last_status();
        }
        *out = dt_reshard(ctx, x, NULL, p);
        return *out ? DT_OK : dt_last_status();
    }
    int64_t ls[DT_MAX_DIMS], start[DT_MAX_DIMS];
    local_shape(m, p, full->ndim, full->shape, ls);
    dt_tensor *loc = new_local(ctx, full->dtype, full->ndim, ls);
    if (!loc)
        return dt_last_status();
    if (dt_mesh_contains_self(m) && !partial_zero(m, p)) {
        int c[DT_MESH_MAX_DIMS];
        for (int i = 0; i < dt_mesh_ndim(m); i++)
            c[i] = dt_mesh_coord(m, i);
        dt__box(m, p, full->ndim, full->shape, c, start, ls);
        dt_tensor v = *full;
        v.flags &= ~(uint32_t)(DT_TENSOR_OWNS_DATA | DT_TENSOR_OWNS_GRAD | DT_TENSOR_TEMP);
        size_t esz = dt_dtype_size(full->dtype);
        for (int d = 0; d < full->ndim; d++) {
            v.data = (char *)v.data + (size_t)(start[d] * full->strides[d]) * esz;
            v.shape[d] = ls[d];
        }
        st = dt_tensor_copy(loc, &v);
        if (st < 0) {
            if (!ctx)
                dt_tensor_free(loc);
            return st;
        }
    }
    loc->name = full->name;
    *out = dt__dtensor_make(ctx, m, loc, p, full->ndim, full->shape, full->name);
    if (!*out) {
        if (!ctx)
            dt_tensor_free(loc);
        return dt_last_status();
    }
    return DT_OK;
}

dt_status dt_shard_tensor_from_root(dt_ctx *ctx, dt_mesh *m, const dt_tensor *full,
                                    dt_dtype dtype, int ndim, const int64_t *shape,
                                    const dt_placement *pl, dt_dtensor **out)
{
    const char *f = "dt_shard_tensor_from_root";
    if (!out)
        return dt_error(DT_ERR_NULL, "%s: NULL out", f);
    *out = NULL;
    if (!m || (!shape && ndim > 0))
        return dt_error(DT_ERR_NULL, "%s: NULL mesh or shape", f);
    const char *what = full && full->name ? full->name : "tensor";
    dt_placement p[DT_MESH_MAX_DIMS];
    dt_status st = dt__placements_check(m, pl, ndim, what, p);
    if (st < 0)
        return st;
    dt_pg *w = dt_mesh_world(m);
    int me = dt_pg_rank(w), root = dt_mesh_ranks(m)[0];
    bool is_root = me == root;
    if (is_root && (!full || full->dtype != dtype || full->ndim != ndim))
        return dt_error(DT_ERR_INVALID_ARG, "%s: %s: the root (world rank %d) must pass the full "
                        "tensor, of the dtype and dims given", f, what, root);
    for (int d = 0; is_root && d < ndim; d++)
        if (full->shape[d] != shape[d])
            return dt_error(DT_ERR_SHAPE, "%s: %s: the full tensor's dim %d is %lld, the shape says %lld",
                            f, what, d, (long long)full->shape[d], (long long)shape[d]);
    int64_t ls[DT_MAX_DIMS];
    local_shape(m, p, ndim, shape, ls);
    dt_tensor *loc = new_local(ctx, dtype, ndim, ls);
    if (!loc)
        return dt_last_status();
    if (dt_mesh_contains_self(m)) {
        /* header: dtype, ndim, shape — so a rank with a different idea fails */
        int64_t hdr[2 + DT_MAX_DIMS] = {(int64_t)dtype, ndim};
        for (int d = 0; d < ndim; d++)
            hdr[2 + d] = shape[d];
        int n = dt_mesh_size(m, -1), mn = dt_mesh_ndim(m);
        if (is_root) {
            dt_tensor *cf = (dt_tensor *)full;
            dt_req **rq = dt_calloc((size_t)(2 * n) * sizeof *rq);
            void **bufs = dt_calloc((size_t)n * sizeof *bufs);
            if (!rq || !bufs)
                st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
            int nr = 0;
            int64_t zero[DT_MAX_DIMS] = {0}, fs[DT_MAX_DIMS];
            void *fdata = NULL;
            if (st >= 0) {
                fdata = dt_alloc(dt_tensor_nbytes(cf) + 1);
                if (!fdata)
                    st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
                else
                    st = dt_tensor_read(cf, fdata);
            }
            for (int d = 0; d < ndim; d++)
                fs[d] = shape[d];
            for (int i = 0; i < n && st >= 0; i++) {
                int c[DT_MESH_MAX_DIMS], r = dt_mesh_ranks(m)[i];
                dt_mesh_coords_of(m, r, c);
                int64_t bs[DT_MAX_DIMS], bl[DT_MAX_DIMS];
                dt__box(m, p, ndim, shape, c, bs, bl);
                void *dst = r == me ? loc->data : NULL;
                if (r != me) {
                    bufs[i] = dt_alloc((size_t)dt__numel(bl, ndim) * dt_dtype_size(dtype) + 1);
                    if (!bufs[i]) {
                        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
                        break;
                    }
                    dst = bufs[i];
                }
                dt__copy_box(dst, bl, zero, fdata, fs, bs, bl, ndim, dtype);
                if (r == me)
                    continue;
                st = dt_pg_send_async(w, hdr, 2 + DT_MAX_DIMS, DT_I64, r, &rq[nr++]);
                if (st >= 0)
                    st = dt_pg_send_async(w, bufs[i], (size_t)dt__numel(bl, ndim), dtype, r,
                                          &rq[nr++]);
            }
            if (nr > 0) {
                dt_status ws = dt_req_wait_all(rq, nr, -1);
                if (st >= 0)
                    st = ws;
            }
            for (int i = 0; i < nr; i++)
                dt_req_free(rq[i]);
            for (int i = 0; bufs && i < n; i++)
                dt_free(bufs[i]);
            dt_free(bufs);
            dt_free(rq);
            dt_free(fdata);
        } else {
            int64_t rh[2 + DT_MAX_DIMS];
            st = dt_pg_recv(w, rh, 2 + DT_MAX_DIMS, DT_I64, root);
            if (st >= 0 && memcmp(rh, hdr, sizeof hdr) != 0)
                st = dt_error(DT_ERR_MISMATCH, "%s: %s: this rank's dtype/shape differ from the "
                              "root's (world rank %d)", f, what, root);
            if (st >= 0)
                st = dt_pg_recv(w, loc->data, (size_t)dt_tensor_numel(loc), dtype, root);
        }
        (void)mn;
        if (st >= 0 && partial_zero(m, p))
            st = dt_tensor_zero(loc);
    }
    if (st < 0) {
        if (!ctx)
            dt_tensor_free(loc);
        return st;
    }
    *out = dt__dtensor_make(ctx, m, loc, p, ndim, shape, full ? full->name : NULL);
    if (!*out) {
        if (!ctx)
            dt_tensor_free(loc);
        return dt_last_status();
    }
    return DT_OK;
}

dt_tensor *dt_dtensor_full(dt_ctx *ctx, dt_dtensor *x)
{
    if (!x)
        return dt__null_input("dt_dtensor_full", "x");
    dt_placement r[DT_MESH_MAX_DIMS];
    for (int i = 0; i < dt_mesh_ndim(x->mesh); i++)
        r[i] = dt_replicate();
    dt_dtensor *y = dt_reshard(ctx, x, NULL, r);
    return y ? y->local : NULL;
}

void dt_dtensor_free(dt_dtensor *x)
{
    if (!x || !(x->flags & DT_DTENSOR_PERSISTENT))
        return;
    dt_tensor_free(x->local);
    dt_free(x);
}

char *dt_dtensor_str(const dt_dtensor *x, char *buf, size_t n)
{
    if (!buf || n == 0)
        return buf;
    if (!x) {
        snprintf(buf, n, "NULL dtensor");
        return buf;
    }
    char sh[96] = "[", ms[256], ps[256];
    size_t k = 1;
    for (int d = 0; d < x->ndim; d++)
        k += (size_t)snprintf(sh + k, k < sizeof sh ? sizeof sh - k : 0, "%s%lld", d ? "," : "",
                              (long long)x->shape[d]);
    snprintf(sh + k, k < sizeof sh ? sizeof sh - k : 0, "]");
    snprintf(buf, n, "%s: shape %s %s on %s %s", x->name ? x->name : "tensor", sh,
             dt_dtype_name(x->dtype), dt_mesh_str(x->mesh, ms, sizeof ms),
             dt_placements_str(x->placements, dt_mesh_ndim(x->mesh), ps, sizeof ps));
    return buf;
}
