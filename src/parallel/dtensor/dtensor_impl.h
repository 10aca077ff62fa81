/* Internals shared by the dtensor and reshard files. Not a public header. */
#ifndef DT_DTENSOR_IMPL_H
#define DT_DTENSOR_IMPL_H

#include "dtrain/autograd.h"
#include "dtrain/mesh.h"
#include "dtrain/precision.h"

/* One mesh dim's transition, as the planner hands it to a table entry. The
 * input is this rank's contiguous local piece (shape in_shape); the output
 * buffer is contiguous with shape out_shape (computed by the planner from
 * the placements). pg is the line along the mesh dim: k ranks, this one at
 * coord. gshape is the global shape. */
typedef struct dt__rs_step {
    dt_ctx *ctx;        /* scratch (arena) */
    dt_pg *pg;
    int k, coord;
    dt_placement from, to;
    dt_dtype dtype;
    int ndim;
    const int64_t *gshape;
    const void *in;
    const int64_t *in_shape;
    void *out;
    const int64_t *out_shape;
} dt__rs_step;

typedef dt_status (*dt__rs_fn)(const dt__rs_step *s);

/* The transitions, one per file (reshard_<from>_<to>.c). */
dt_status dt__reshard_r_to_s(const dt__rs_step *s);
dt_status dt__reshard_s_to_r(const dt__rs_step *s);
dt_status dt__reshard_p_to_r(const dt__rs_step *s);
dt_status dt__reshard_p_to_s(const dt__rs_step *s);
dt_status dt__reshard_s_to_s(const dt__rs_step *s);
dt_status dt__reshard_r_to_p(const dt__rs_step *s);
dt_status dt__reshard_s_to_p(const dt__rs_step *s);
dt_status dt__reshard_p_to_p(const dt__rs_step *s);
dt_status dt__reshard_same(const dt__rs_step *s);

/* The table: the function for from.kind -> to.kind (reshard_table.c). */
dt__rs_fn dt__reshard_fn(dt_placement_kind from, dt_placement_kind to);
/* Name for errors and benchmarks ("s_to_r"). */
const char *dt__reshard_name(dt_placement_kind from, dt_placement_kind to);

/* Product of shape[0..d), shape[d+1..ndim). */
int64_t dt__outer(const int64_t *shape, int d);
int64_t dt__inner(const int64_t *shape, int ndim, int d);
int64_t dt__numel(const int64_t *shape, int ndim);

/* Copy a box: dst (contiguous, dshape) at offset doff <- src (contiguous,
 * sshape) at offset soff, extent len, all per dim. */
void dt__copy_box(void *dst, const int64_t *dshape, const int64_t *doff, const void *src,
                  const int64_t *sshape, const int64_t *soff, const int64_t *len, int ndim,
                  dt_dtype dt);

/* Check placements for a tensor of ndim dims on m and normalise negative
 * Shard dims into out (may alias pl). what names the tensor. */
dt_status dt__placements_check(const dt_mesh *m, const dt_placement *pl, int ndim,
                               const char *what, dt_placement *out);

/* The piece of a global shape that coords hold (no checks). */
void dt__box(const dt_mesh *m, const dt_placement *pl, int ndim, const int64_t *shape,
             const int *coords, int64_t *start, int64_t *len);

/* A temporary dtensor struct on ctx around local (no checks). */
dt_dtensor *dt__dtensor_make(dt_ctx *ctx, dt_mesh *m, dt_tensor *local, const dt_placement *pl,
                             int ndim, const int64_t *shape, const char *name);

/* Reshard the contiguous local data of a dtensor from (mf, pf) to (mt, pt),
 * no autograd: into a new temporary tensor of ctx (*out). rg (may be NULL):
 * across meshes, in: this rank's requires-grad flag, sent with each box it
 * sends; out: OR of the flags it received (unchanged when none). */
dt_status dt__reshard_data(dt_ctx *ctx, dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                           const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                           const dt_tensor *in, int *rg, dt_tensor **out);

/* The agreement check (reshard_check.c): the ranks of mf, then those of mt
 * (when another mesh), compare placements, global shape, dtype and meshes
 * with a small all-reduce per mesh dim; DT_ERR_MISMATCH naming what (the
 * tensor) and both variants when they differ. Off with DT_RESHARD_CHECK=0. */
dt_status dt__reshard_agree(dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                            const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                            const char *what);

/* Cross-mesh move of Partial-free data (reshard_cross.c): in is this rank's
 * piece on (mf, pf) (ignored outside mf), out its zeroed piece on (mt, pt)
 * (ignored outside mt). rg as in dt__reshard_data. */
dt_status dt__reshard_cross(dt_ctx *ctx, dt_mesh *mf, const dt_placement *pf, dt_mesh *mt,
                            const dt_placement *pt, int ndim, const int64_t *shape, dt_dtype dt,
                            const void *in, void *out, int *rg);

#endif
