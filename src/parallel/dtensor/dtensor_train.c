/* Training with distributed tensors: shard_optimizer and shard_dataloader.
 *
 * shard_optimizer: each parameter's local piece is one range of the fused
 * optimizer (optim.h) over flats wrapping the piece and its gradient, so
 * the optimizer state has exactly the piece's layout: it is placed like the
 * parameter. With a ZeRO-1 mesh dim z, a parameter that is Replicate on z
 * has its piece cut into torch.chunk ranges of its elements over z's
 * coordinates; each rank keeps state for and updates only its range, then
 * the updated piece is all-gathered(v) over z's line. (A parameter sharded
 * on z is already distinct per coordinate and is stepped whole.) The
 * gradients must be whole before the step, which the dtensor ops ensure
 * (mesh.h: gradients of Replicate inputs are all-reduced).
 *
 * shard_dataloader: the data-parallel coordinate along the shard dim of
 * whichever mesh holds this rank picks the replica of a distributed
 * sampler (PyTorch's DistributedSampler semantics), so the ranks of one
 * coordinate read the same share and the shares of the coordinates make up
 * the global batch; the share becomes the local piece of a dtensor of the
 * global batch with Shard(0) on that mesh dim and Replicate on the others.
 * Inputs go on the first mesh, labels on the last (a pipeline's first and
 * last stage). */
#include "dtensor_impl.h"
#include "dtrain/data.h"
#include "dtrain/optim.h"

#include <string.h>

struct dt_shard_optim {
    dt_optim *opt;              /* NULL when this rank holds no elements */
    dt_optim_kind kind;
    int n;
    dt_dtensor **params;
    dt_flat *pf, *gf;           /* per parameter */
    dt_tensor **own_grads;      /* gradients this optimizer attached */
    int zero_dim;
    size_t *lo, *hi;            /* per parameter: the range stepped */
    int nr;                     /* ranges (parameters with hi > lo) */
    int *rparam;                /* per range: its parameter */
    double *red;                /* LAMB: 2 n doubles for the reductions */
};

/* ---- LAMB: whole-parameter norms over the pieces ----
 * LAMB's trust ratio needs ‖w‖ and ‖u‖ of each WHOLE parameter and its
 * clipping the global ‖g‖, but each rank holds pieces: a parameter Shard
 * on some mesh dims (and, with ZeRO-1, cut into ranges along the zero dim)
 * and Replicate on others. The reducer sums each parameter's squared norm
 * over the mesh dims that split it and counts its replicas once: mesh dim
 * by mesh dim, over that dim's line, a parameter not split by the dim
 * contributes only from coordinate 0 (others add an exact 0). The vectors
 * have one entry per parameter in parameter order on every rank, whatever
 * pieces a rank holds, so every rank of the mesh makes the same calls. */

/* Is parameter i split along mesh dim d (its pieces differ there)? */
static bool lamb_split(const dt_shard_optim *o, int i, int d)
{
    const dt_placement *pl = o->params[i]->placements;
    return pl[d].kind == DT_PLACE_SHARD ||
           (d == o->zero_dim && pl[d].kind == DT_PLACE_REPLICATE);
}

/* v[i * per + j]: entries of parameter i; sum over the splitting dims. */
static dt_status lamb_sum(dt_shard_optim *o, double *v, int per)
{
    dt_mesh *m = o->params[0]->mesh;
    for (int d = 0; d < dt_mesh_ndim(m); d++) {
        if (dt_mesh_size(m, d) == 1)
            continue;
        for (int i = 0; i < o->n; i++)
            if (!lamb_split(o, i, d) && dt_mesh_coord(m, d) != 0)
                for (int j = 0; j < per; j++)
                    v[i * per + j] = 0;
        dt_status st = dt_pg_allreduce(dt_mesh_dim_group(m, d), DT_IN_PLACE, v,
                                       (size_t)(o->n * per), DT_F64, DT_REDUCE_SUM);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

static dt_status lamb_reduce(void *ctx, double *sums, size_t n)
{
    dt_shard_optim *o = ctx;
    double *v = o->red;
    if (n == 1) {
        /* the global ‖g‖²: each parameter's own part, summed whole, then
         * added in parameter order (the same bits on every rank) */
        for (int i = 0; i < o->n; i++) {
            const float *g = o->params[i]->local->grad ? o->params[i]->local->grad->data : NULL;
            double a = 0;
            for (size_t k = o->lo[i]; g && k < o->hi[i]; k++)
                a += (double)g[k] * g[k];
            v[i] = a;
        }
        dt_status st = lamb_sum(o, v, 1);
        if (st < 0)
            return st;
        double t = 0;
        for (int i = 0; i < o->n; i++)
            t += v[i];
        sums[0] = t;
        return DT_OK;
    }
    /* [‖w‖² per range, ‖u‖² per range] -> per parameter (2 each), summed */
    size_t ns = n / 2;
    memset(v, 0, 2 * (size_t)o->n * sizeof *v);
    for (size_t s = 0; s < ns && s < (size_t)o->nr; s++) {
        v[2 * o->rparam[s]] = sums[s];
        v[2 * o->rparam[s] + 1] = sums[ns + s];
    }
    dt_status st = lamb_sum(o, v, 2);
    if (st < 0)
        return st;
    for (size_t s = 0; s < ns && s < (size_t)o->nr; s++) {
        sums[s] = v[2 * o->rparam[s]];
        sums[ns + s] = v[2 * o->rparam[s] + 1];
    }
    return DT_OK;
}

dt_status dt_shard_optimizer(dt_optim_kind kind, const void *hparams, dt_dtensor *const *params,
                             int n, int zero_dim, dt_shard_optim **out)
{
    const char *f = "dt_shard_optimizer";
    if (!out)
        return dt_error(DT_ERR_NULL, "%s: NULL out", f);
    *out = NULL;
    if (!params || n < 1 || !hparams)
        return dt_error(DT_ERR_INVALID_ARG, "%s: need parameters and hyper-parameters", f);
    for (int i = 0; i < n; i++) {
        if (!params[i] || !params[i]->local)
            return dt_error(DT_ERR_NULL, "%s: parameter %d is NULL", f, i);
        dt_tensor *t = params[i]->local;
        if (t->dtype != DT_F32 || (t->flags & DT_TENSOR_TEMP) || !dt_tensor_is_contiguous(t))
            return dt_error(DT_ERR_INVALID_ARG,
                            "%s: parameter %d ('%s') must be a persistent contiguous f32 dtensor "
                            "(dt_shard_tensor with ctx NULL)",
                            f, i, params[i]->name ? params[i]->name : "?");
        if (zero_dim >= dt_mesh_ndim(params[i]->mesh))
            return dt_error(DT_ERR_INVALID_ARG, "%s: ZeRO mesh dim %d, but parameter %d's mesh has %d",
                            f, zero_dim, i, dt_mesh_ndim(params[i]->mesh));
    }
    if (kind == DT_OPTIM_LAMB)
        for (int i = 0; i < n; i++) {
            char a[256], b[256];
            const char *nm = params[i]->name ? params[i]->name : "?";
            if (params[i]->mesh != params[0]->mesh)
                return dt_error(DT_ERR_UNSUPPORTED,
                                "%s: LAMB: parameter %d ('%s') is on mesh %s, parameter 0 on %s: "
                                "its norms are reduced over one mesh",
                                f, i, nm, dt_mesh_str(params[i]->mesh, a, sizeof a),
                                dt_mesh_str(params[0]->mesh, b, sizeof b));
            for (int d = 0; d < dt_mesh_ndim(params[i]->mesh); d++)
                if (params[i]->placements[d].kind == DT_PLACE_PARTIAL)
                    return dt_error(DT_ERR_UNSUPPORTED,
                                    "%s: LAMB: parameter %d ('%s') is %s: a Partial parameter "
                                    "has no norm of its own; reduce it first",
                                    f, i, nm,
                                    dt_placements_str(params[i]->placements,
                                                      dt_mesh_ndim(params[i]->mesh), a, sizeof a));
        }
    dt_shard_optim *o = dt_calloc(sizeof *o);
    if (!o)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
    o->n = n;
    o->kind = kind;
    o->zero_dim = zero_dim < 0 ? -1 : zero_dim;
    o->params = dt_calloc((size_t)n * sizeof *o->params);
    o->pf = dt_calloc((size_t)n * sizeof *o->pf);
    o->gf = dt_calloc((size_t)n * sizeof *o->gf);
    o->own_grads = dt_calloc((size_t)n * sizeof *o->own_grads);
    o->lo = dt_calloc((size_t)n * sizeof(size_t));
    o->hi = dt_calloc((size_t)n * sizeof(size_t));
    o->rparam = dt_calloc((size_t)n * sizeof(int));
    o->red = dt_calloc(2 * (size_t)n * sizeof(double));
    dt_optim_range *r = dt_calloc((size_t)n * sizeof *r);
    dt_status st = DT_OK;
    if (!o->params || !o->pf || !o->gf || !o->own_grads || !o->lo || !o->hi || !o->rparam ||
        !o->red || !r) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
        goto done;
    }
    int nr = 0;
    for (int i = 0; i < n; i++) {
        dt_dtensor *p = params[i];
        dt_tensor *t = p->local;
        o->params[i] = p;
        size_t numel = (size_t)dt_tensor_numel(t);
        if (!t->grad) {
            /* attach a gradient now, so the flat wrapping it stays put */
            o->own_grads[i] = dt_tensor_new(DT_F32, t->ndim, t->shape);
            if (!o->own_grads[i] || (st = dt_tensor_set_grad(t, o->own_grads[i])) < 0) {
                st = st < 0 ? st : dt_last_status();
                goto done;
            }
        }
        if (t->grad->dtype != DT_F32 || !dt_tensor_is_contiguous(t->grad)) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: parameter %d's gradient must be contiguous f32", f, i);
            goto done;
        }
        if ((st = dt_flat_wrap(&o->pf[i], DT_F32, numel ? t->data : NULL, numel)) < 0 ||
            (st = dt_flat_wrap(&o->gf[i], DT_F32, numel ? t->grad->data : NULL, numel)) < 0)
            goto done;
        size_t lo = 0, hi = numel;
        int z = o->zero_dim;
        if (z >= 0 && dt_mesh_contains_self(p->mesh) && p->placements[z].kind == DT_PLACE_REPLICATE) {
            int64_t s, l;
            dt_chunk_range((int64_t)numel, dt_mesh_size(p->mesh, z), dt_mesh_coord(p->mesh, z), &s, &l);
            lo = (size_t)s;
            hi = (size_t)(s + l);
        }
        o->lo[i] = lo;
        o->hi[i] = hi;
        if (hi > lo) {
            o->rparam[nr] = i;
            r[nr++] = (dt_optim_range){.params = &o->pf[i], .grads = &o->gf[i], .lo = lo, .hi = hi};
        }
    }
    o->nr = nr;
    if (nr > 0) {
        st = dt_optim_init(kind, hparams, r, (size_t)nr, &o->opt);
        if (st == DT_OK && kind == DT_OPTIM_LAMB)
            dt_optim_set_reducer(o->opt, lamb_reduce, o);
    }
done:
    dt_free(r);
    if (st < 0) {
        dt_shard_optimizer_free(o);
        return st;
    }
    *out = o;
    return DT_OK;
}

void dt_shard_optimizer_free(dt_shard_optim *o)
{
    if (!o)
        return;
    dt_optim_free(o->opt);
    for (int i = 0; o->own_grads && i < o->n; i++)
        if (o->own_grads[i]) {
            dt_tensor_set_grad(o->params[i]->local, NULL);
            dt_tensor_free(o->own_grads[i]);
        }
    dt_free(o->own_grads);
    dt_free(o->params);
    dt_free(o->pf);
    dt_free(o->gf);
    dt_free(o->lo);
    dt_free(o->hi);
    dt_free(o->rparam);
    dt_free(o->red);
    dt_free(o);
}

dt_status dt_shard_optimizer_step(dt_shard_optim *o)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_shard_optimizer_step: NULL optimizer");
    dt_status st = DT_OK;
    if (o->opt) {
        st = dt_optim_step(o->opt);
    } else if (o->kind == DT_OPTIM_LAMB && dt_mesh_contains_self(o->params[0]->mesh)) {
        /* no elements here, but the mesh's norm reductions need this rank:
         * the same two calls LAMB makes, with nothing to add */
        double g = 0;
        st = lamb_reduce(o, &g, 1);
        if (st == DT_OK)
            st = lamb_reduce(o, &g, 0);
    }
    if (st < 0 || o->zero_dim < 0)
        return st;
    int z = o->zero_dim;
    for (int i = 0; i < o->n; i++) {
        dt_dtensor *p = o->params[i];
        if (!dt_mesh_contains_self(p->mesh) || p->placements[z].kind != DT_PLACE_REPLICATE)
            continue;
        int k = dt_mesh_size(p->mesh, z);
        if (k == 1)
            continue;
        size_t *counts = dt_alloc(2 * (size_t)k * sizeof(size_t));
        if (!counts)
            return dt_error(DT_ERR_NO_MEMORY, "dt_shard_optimizer_step: out of memory");
        size_t numel = (size_t)dt_tensor_numel(p->local);
        for (int c = 0; c < k; c++) {
            int64_t s, l;
            dt_chunk_range((int64_t)numel, k, c, &s, &l);
            counts[c] = (size_t)l;
            counts[k + c] = (size_t)s;
        }
        st = dt_pg_allgatherv(dt_mesh_dim_group(p->mesh, z), DT_IN_PLACE, p->local->data, counts,
                              counts + k, DT_F32);
        dt_free(counts);
        if (st < 0)
            return dt_error_wrap(st, "dt_shard_optimizer_step: gathering parameter %d", i);
    }
    return DT_OK;
}

dt_status dt_shard_optimizer_zero_grad(dt_shard_optim *o)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_shard_optimizer_zero_grad: NULL optimizer");
    for (int i = 0; i < o->n; i++)
        dt_ag_zero_grad(o->params[i]->local);
    return DT_OK;
}

dt_optim *dt_shard_optimizer_inner(dt_shard_optim *o) { return o ? o->opt : NULL; }

/* ---- shard_dataloader ---------------------------------------------------------------- */

struct dt_shard_loader {
    dt_dataset *ds;
    dt_mesh *mx, *my;        /* meshes of inputs and labels */
    int dx, dy;              /* their shard dims */
    int64_t global_batch, local_batch;
    dt_sampler *sampler;
    dt_loader *loader;
    bool in;                 /* this rank reads */
};

dt_status dt_shard_dataloader_init(dt_dataset *ds, dt_mesh *const *meshes, int nmesh,
                                   const char *shard_dim, int64_t global_batch, bool shuffle,
                                   uint64_t seed, dt_shard_loader **out)
{
    const char *f = "dt_shard_dataloader_init";
    if (!out)
        return dt_error(DT_ERR_NULL, "%s: NULL out", f);
    *out = NULL;
    if (!ds || !meshes || nmesh < 1)
        return dt_error(DT_ERR_NULL, "%s: need a dataset and at least one mesh", f);
    dt_shard_loader *l = dt_calloc(sizeof *l);
    if (!l)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f);
    l->ds = ds;
    l->mx = meshes[0];
    l->my = meshes[nmesh - 1];
    l->global_batch = global_batch;
    int k = -1, coord = -1;
    dt_status st = DT_OK;
    for (int i = 0; i < nmesh; i++) {
        char ms[256];
        if (!meshes[i]) {
            st = dt_error(DT_ERR_NULL, "%s: mesh %d is NULL", f, i);
            goto fail;
        }
        int d = shard_dim ? dt_mesh_dim_index(meshes[i], shard_dim) : 0;
        if (d < 0) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: %s has no dim named '%s'", f,
                          dt_mesh_str(meshes[i], ms, sizeof ms), shard_dim);
            goto fail;
        }
        if (k >= 0 && dt_mesh_size(meshes[i], d) != k) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: the shard dim of %s has size %d, the first mesh's %d",
                          f, dt_mesh_str(meshes[i], ms, sizeof ms), dt_mesh_size(meshes[i], d), k);
            goto fail;
        }
        k = dt_mesh_size(meshes[i], d);
        if (i == 0)
            l->dx = d;
        if (i == nmesh - 1)
            l->dy = d;
        if (coord < 0 && dt_mesh_contains_self(meshes[i]))
            coord = dt_mesh_coord(meshes[i], d);
    }
    if (global_batch < 1 || global_batch % k != 0) {
        st = dt_error(DT_ERR_INVALID_ARG, "%s: global batch %lld must be a positive multiple of the "
                      "shard dim's size %d", f, (long long)global_batch, k);
        goto fail;
    }
    l->local_batch = global_batch / k;
    l->in = coord >= 0;
    if (l->in) {
        dt_distributed_sampler_params sp = dt_distributed_sampler_params_default();
        sp.length = dt_dataset_length(ds);
        sp.world_size = k;
        sp.rank = coord;
        sp.shuffle = shuffle;
        sp.seed = seed;
        sp.drop_last = true;
        dt_loader_params lp = dt_loader_params_default();
        lp.batch_size = l->local_batch;
        lp.drop_last = true;
        if ((st = dt_sampler_distributed_init(&sp, &l->sampler)) < 0 ||
            (st = dt_loader_init(ds, l->sampler, &lp, &l->loader)) < 0)
            goto fail;
    }
    *out = l;
    return DT_OK;
fail:
    dt_shard_dataloader_free(l);
    return st;
}

void dt_shard_dataloader_free(dt_shard_loader *l)
{
    if (!l)
        return;
    dt_loader_free(l->loader);
    dt_sampler_free(l->sampler);
    dt_free(l);
}

int64_t dt_shard_dataloader_num_batches(const dt_shard_loader *l)
{
    if (!l)
        return 0;
    if (l->loader)
        return dt_loader_num_batches(l->loader);
    return 0;
}

dt_status dt_shard_dataloader_start_epoch(dt_shard_loader *l, int64_t epoch)
{
    if (!l)
        return dt_error(DT_ERR_NULL, "dt_shard_dataloader_start_epoch: NULL loader");
    return l->loader ? dt_loader_start_epoch(l->loader, epoch) : DT_OK;
}

/* The dtensor of one side of the batch on mesh m with Shard(0) on dim d. */
static dt_status wrap(dt_ctx *ctx, dt_mesh *m, int d, const void *data, dt_dtype dt, int ndim,
                      const int64_t *item_shape, int64_t lb, int64_t gb, dt_dtensor **out)
{
    int64_t ls[DT_MAX_DIMS], gs[DT_MAX_DIMS];
    ls[0] = dt_mesh_contains_self(m) ? lb : 0;
    gs[0] = gb;
    for (int i = 0; i < ndim; i++) {
        ls[i + 1] = dt_mesh_contains_self(m) ? item_shape[i] : 0;
        gs[i + 1] = item_shape[i];
    }
    dt_tensor *t = data && dt_mesh_contains_self(m) ? dt_tensor_from(ctx, dt, ndim + 1, ls, data)
                                                    : dt_tensor_zeros(ctx, dt, ndim + 1, ls);
    if (!t)
        return dt_last_status();
    dt_placement p[DT_MESH_MAX_DIMS];
    for (int i = 0; i < dt_mesh_ndim(m); i++)
        p[i] = i == d ? dt_shard(0) : dt_replicate();
    return dt_dtensor_from_local(ctx, m, t, p, gs, out);
}

dt_status dt_shard_dataloader_next(dt_shard_loader *l, dt_ctx *ctx, dt_dtensor **x, dt_dtensor **y)
{
    if (!l || !ctx || !x)
        return dt_error(DT_ERR_NULL, "dt_shard_dataloader_next: NULL argument");
    *x = NULL;
    if (y)
        *y = NULL;
    if (!l->loader)
        return DT_OK;
    const dt_batch *b;
    dt_status st = dt_loader_next(l->loader, &b);
    if (st < 0 || !b)
        return st;
    const dt_dataset_info *info = dt_dataset_get_info(l->ds);
    st = wrap(ctx, l->mx, l->dx, b->x, info->x_dtype, info->x_ndim, info->x_shape, b->size,
              l->global_batch, x);
    if (st >= 0 && y)
        st = wrap(ctx, l->my, l->dy, b->y, info->y_dtype, info->y_ndim, info->y_shape, b->size,
                  l->global_batch, y);
    return st;
}
