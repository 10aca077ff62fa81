/* tests/parallel/mesh_util.h — helpers for the mesh / dtensor tests:
 * deterministic global tensors of small integers (exact in every dtype),
 * Partial pieces whose reduction is exactly the global tensor, and the
 * expected local box of any placement. */
#ifndef DT_TEST_MESH_UTIL_H
#define DT_TEST_MESH_UTIL_H

#include "comm/harness.h"
#include "dtrain/dtrain.h"

/* Global element i of tensor `seed`: a small integer in [-11, 11]. */
static inline double mu_val(int seed, int64_t i)
{
    return (double)(((i * 7 + seed * 13) % 23 + 23) % 23 - 11);
}

/* Fill a contiguous tensor with the global tensor's box [st, st+len). */
static inline void mu_fill_box(dt_tensor *t, int seed, int ndim, const int64_t *gshape,
                               const int64_t *st, const int64_t *len)
{
    int64_t n = dt_tensor_numel(t);
    for (int64_t e = 0; e < n; e++) {
        int64_t rem = e, g = 0, mul = 1;
        int64_t idx[DT_MAX_DIMS];
        for (int d = ndim - 1; d >= 0; d--) {
            idx[d] = rem % len[d];
            rem /= len[d];
        }
        for (int d = ndim - 1; d >= 0; d--) {
            g += (idx[d] + st[d]) * mul;
            mul *= gshape[d];
        }
        dt_tensor_set(t, e, mu_val(seed, g));
    }
}

/* Is p Partial(max) or Partial(min)? */
static inline bool mu_maxmin(dt_placement p)
{
    return p.kind == DT_PLACE_PARTIAL && (p.op == DT_REDUCE_MAX || p.op == DT_REDUCE_MIN);
}

/* Combined index and count of this rank over the Partial mesh dims. */
static inline void mu_partial_index(const dt_mesh *m, const dt_placement *p, int *r, int *K)
{
    *r = 0;
    *K = 1;
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        if (p[i].kind == DT_PLACE_PARTIAL) {
            *r = *r * dt_mesh_size(m, i) + dt_mesh_coord(m, i);
            *K *= dt_mesh_size(m, i);
        }
}

/* A dtensor on ctx holding this rank's piece of global tensor `seed` with
 * placements p. Partial pieces reduce exactly to the global tensor:
 * sum: piece 0 = X - sum of the others, others small integers; avg:
 * X + 2r - (K-1); max: X - r; min: X + r. */
static inline dt_dtensor *mu_make(dt_ctx *ctx, dt_mesh *m, const dt_placement *p, int seed,
                                  dt_dtype dt, int ndim, const int64_t *shape)
{
    int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS] = {0};
    if (dt_mesh_contains_self(m) &&
        dt_dtensor_local_box(m, p, ndim, shape, NULL, "mu_make", st, len) < 0)
        return NULL;
    if (!dt_mesh_contains_self(m)) {
        for (int d = 0; d < ndim; d++)
            len[d] = 0;
    }
    dt_tensor *loc = dt_tensor_zeros(ctx, dt, ndim, len);
    if (!loc)
        return NULL;
    if (dt_mesh_contains_self(m)) {
        mu_fill_box(loc, seed, ndim, shape, st, len);
        int r, K;
        mu_partial_index(m, p, &r, &K);
        dt_reduce_op op = DT_REDUCE_SUM;
        for (int i = 0; i < dt_mesh_ndim(m); i++)
            if (p[i].kind == DT_PLACE_PARTIAL)
                op = p[i].op;
        int64_t n = dt_tensor_numel(loc);
        for (int64_t e = 0; K > 1 && e < n; e++) {
            double x = dt_tensor_get(loc, e), v = x;
            switch (op) {
            case DT_REDUCE_SUM:
                if (r == 0) {
                    for (int q = 1; q < K; q++)
                        v -= (double)((e + 3 * q) % 5 - 2);
                } else {
                    v = (double)((e + 3 * r) % 5 - 2);
                }
                break;
            case DT_REDUCE_AVG: v = x + 2 * r - (K - 1); break;
            case DT_REDUCE_MAX: v = x - r; break;
            case DT_REDUCE_MIN: v = x + r; break;
            default: break;
            }
            dt_tensor_set(loc, e, v);
        }
    }
    dt_dtensor *x;
    if (dt_dtensor_from_local(ctx, m, loc, p, shape, &x) < 0)
        return NULL;
    return x;
}

/* Does local hold exactly the box of global tensor `seed` for placements p
 * (Partial read as Replicate)? Prints the first difference. */
static inline int mu_check_box(const dt_tensor *local, const dt_mesh *m, const dt_placement *p,
                               int seed, int ndim, const int64_t *shape, const char *what)
{
    dt_placement q[DT_MESH_MAX_DIMS];
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        q[i] = p[i].kind == DT_PLACE_PARTIAL ? dt_replicate() : p[i];
    int64_t st[DT_MAX_DIMS], len[DT_MAX_DIMS];
    if (!dt_mesh_contains_self(m)) {
        if (dt_tensor_numel(local) != (ndim == 0 ? 1 : 0)) {
            fprintf(stderr, "[rank %d] %s: outside the mesh the local has %lld elements\n",
                    th_rank_, what, (long long)dt_tensor_numel(local));
            return 1;
        }
        return 0;
    }
    if (dt_dtensor_local_box(m, q, ndim, shape, NULL, what, st, len) < 0) {
        fprintf(stderr, "[rank %d] %s: %s\n", th_rank_, what, dt_last_error());
        return 1;
    }
    for (int d = 0; d < ndim; d++)
        if (local->shape[d] != len[d]) {
            fprintf(stderr, "[rank %d] %s: local dim %d is %lld, want %lld\n", th_rank_, what, d,
                    (long long)local->shape[d], (long long)len[d]);
            return 1;
        }
    dt_tensor *want = dt_tensor_new(DT_F64, ndim, len);
    mu_fill_box(want, seed, ndim, shape, st, len);
    int64_t n = dt_tensor_numel(want);
    int bad = 0;
    for (int64_t e = 0; e < n && !bad; e++) {
        double a = dt_tensor_get(local, e), b = dt_tensor_get(want, e);
        if (a != b) {
            fprintf(stderr, "[rank %d] %s: element %lld is %g, want %g\n", th_rank_, what,
                    (long long)e, a, b);
            bad = 1;
        }
    }
    dt_tensor_free(want);
    return bad;
}

#endif
