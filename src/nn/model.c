/* Models: the flat parameter / gradient / buffer layout, names, init, hooks.
 *
 * dt_model_build walks the module tree in pre-order (a module's own
 * parameters, then its buffers, then its children: PyTorch's state_dict
 * order), gives every entry an offset rounded up to 64 bytes in its flat
 * buffer, allocates the buffers, wraps one tensor view per entry (and one
 * grad view per parameter) and initialises the values. Entry i is
 * initialised from the Philox stream (seed, DT_RNG_INIT, i, 0), so a value
 * depends only on the seed and the model structure. */
#include "nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN_ELEMS(bytes, esz) ((((bytes) + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN) / (esz))

static void count_tree(dt_module *m, int *nmod, size_t *nent)
{
    (*nmod)++;
    *nent += (size_t)m->nparam;
    for (int i = 0; i < m->nchild; i++)
        count_tree(m->children[i], nmod, nent);
}

static char *join_path(const char *a, const char *b)
{
    size_t na = a ? strlen(a) : 0, nb = strlen(b);
    char *s = malloc(na + nb + 2);
    if (!s)
        return NULL;
    if (na) {
        memcpy(s, a, na);
        s[na] = '.';
        memcpy(s + na + 1, b, nb + 1);
    } else {
        memcpy(s, b, nb + 1);
    }
    return s;
}

/* Pre-order: paths, module list, entries (name, shape, dtype, is_buffer). */
static dt_status collect(dt_model *md, dt_module *m, const char *parent_path)
{
    if (m->model)
        return dt_error(DT_ERR_STATE, "dt_model_build: module '%s' already belongs to a model", m->path);
    m->model = md;
    m->index = md->nmodules;
    md->modules[md->nmodules++] = m;
    free(m->path);
    m->path = m->name ? join_path(parent_path, m->name) : calloc(1, 1);
    if (!m->path)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_build: out of memory");
    for (int pass = 0; pass < 2; pass++) /* parameters first, then buffers */
        for (int i = 0; i < m->nparam; i++) {
            const dt_nn_param_spec *s = &m->specs[i];
            if (s->is_buffer != (pass == 1))
                continue;
            dt__entry *e = &md->entries[md->nentry];
            e->index = md->nentry++;
            e->model = md;
            e->name = join_path(m->path, s->name);
            if (!e->name)
                return dt_error(DT_ERR_NO_MEMORY, "dt_model_build: out of memory");
            dt_param_info *p = &e->info;
            p->name = e->name;
            p->ndim = s->ndim;
            p->numel = 1;
            for (int d = 0; d < DT_MAX_DIMS; d++) {
                p->shape[d] = d < s->ndim ? s->shape[d] : 1;
                if (d < s->ndim) {
                    if (s->shape[d] <= 0)
                        return dt_error(DT_ERR_INVALID_ARG, "dt_model_build: '%s' has dim %d of size %lld",
                                        e->name, d, (long long)s->shape[d]);
                    p->numel *= (size_t)s->shape[d];
                }
            }
            p->is_buffer = s->is_buffer;
            p->dtype = !strcmp(s->name, "num_batches_tracked") && m->kind == DT_NN_BATCHNORM2D ? DT_I64 : DT_F32;
            p->module = m;
            e->spec = i;
        }
    for (int i = 0; i < m->nchild; i++) {
        dt_status st = collect(md, m->children[i], m->path);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

static void fill_init(dt_model *md, dt__entry *e, const dt_nn_param_spec *s)
{
    dt_param_info *p = &e->info;
    if (p->dtype != DT_F32)
        return; /* num_batches_tracked: zero */
    float *x = p->tensor->data;
    dt_rng_key key = dt_rng_key_make(md->seed, DT_RNG_INIT, e->index, 0);
    double fan_in = p->ndim >= 2 ? (double)p->numel / (double)p->shape[0] : (double)p->numel;
    switch (s->init) {
    case DT_NN_INIT_ZEROS:
        break;
    case DT_NN_INIT_ONES:
        for (size_t i = 0; i < p->numel; i++)
            x[i] = 1.0f;
        break;
    case DT_NN_INIT_UNIFORM:
        dt_rng_fill_uniform(key, 0, x, p->numel, -s->a, s->a);
        break;
    case DT_NN_INIT_NORMAL:
        dt_rng_fill_normal(key, 0, x, p->numel, 0.0f, s->a);
        break;
    case DT_NN_INIT_KAIMING: {
        float b = (float)(1.0 / sqrt(fan_in));
        dt_rng_fill_uniform(key, 0, x, p->numel, -b, b);
        break;
    }
    case DT_NN_INIT_XAVIER: {
        double fo = p->ndim >= 2 ? (double)p->shape[1] : fan_in, fi = p->ndim >= 2 ? (double)p->shape[0] : fan_in;
        if (p->ndim > 2) { /* receptive field as in torch's xavier */
            double rf = (double)p->numel / ((double)p->shape[0] * (double)p->shape[1]);
            fi *= rf, fo *= rf;
        }
        float b = (float)sqrt(6.0 / (fi + fo));
        dt_rng_fill_uniform(key, 0, x, p->numel, -b, b);
        break;
    }
    }
}

dt_status dt_model_init_torch(dt_model *md, uint64_t seed)
{
    if (!md)
        return dt_error(DT_ERR_NULL, "dt_model_init_torch: model is NULL");
    dt_torch_rng g;
    dt_torch_rng_seed(&g, seed);
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        const dt_param_info *p = &e->info;
        if (p->is_buffer || p->dtype != DT_F32)
            continue;
        const dt_nn_param_spec *s = &p->module->specs[e->spec];
        float *x = p->tensor->data;
        double fan_in = p->ndim >= 2 ? (double)p->numel / (double)p->shape[0] : (double)p->numel;
        switch (s->init) {
        case DT_NN_INIT_ZEROS:
        case DT_NN_INIT_ONES:
            break;
        case DT_NN_INIT_UNIFORM:
            dt_torch_rng_uniform(&g, x, p->numel, -(double)s->a, (double)s->a);
            break;
        case DT_NN_INIT_NORMAL:
            dt_torch_rng_normal(&g, x, p->numel, 0.0, (double)s->a);
            break;
        case DT_NN_INIT_KAIMING: { /* kaiming_uniform_(a = sqrt(5)) as torch computes the bound */
            double b = sqrt(3.0) * (sqrt(2.0 / (1.0 + 5.0)) / sqrt(fan_in));
            dt_torch_rng_uniform(&g, x, p->numel, -b, b);
            break;
        }
        case DT_NN_INIT_XAVIER: {
            double fo = p->ndim >= 2 ? (double)p->shape[1] : fan_in, fi = p->ndim >= 2 ? (double)p->shape[0] : fan_in;
            if (p->ndim > 2) {
                double rf = (double)p->numel / ((double)p->shape[0] * (double)p->shape[1]);
                fi *= rf, fo *= rf;
            }
            double b = sqrt(3.0) * sqrt(2.0 / (fi + fo));
            dt_torch_rng_uniform(&g, x, p->numel, -b, b);
            break;
        }
        }
    }
    return DT_OK;
}

static dt_status grad_ready_tramp(dt_tensor *leaf, void *ud)
{
    (void)leaf;
    dt__entry *e = ud;
    dt_model *md = e->model;
    for (int i = 0; i < md->nready; i++) {
        dt_status st = md->ready[i].fn(md, e->index, &e->info, md->ready[i].ud);
        if (st < 0)
            return dt_error_wrap(st, "grad-ready hook %d of '%s'", i, e->name);
    }
    return DT_OK;
}

dt_model *dt_model_build(dt_module *root, uint64_t seed)
{
    if (!root) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_model_build: root module is NULL");
        return NULL;
    }
    if (root->model || root->parent) {
        /* not ours to free: it belongs to a model or a container already */
        dt_error(DT_ERR_STATE, "dt_model_build: module '%s' (%s) already belongs to a %s", dt_module_path(root),
                 dt_module_type(root), root->model ? "model" : "container");
        return NULL;
    }
    dt_model *md = calloc(1, sizeof *md);
    if (!md) {
        dt_module_free(root);
        dt_error(DT_ERR_NO_MEMORY, "dt_model_build: out of memory");
        return NULL;
    }
    md->root = root;
    md->seed = seed;
    int nmod = 0;
    size_t nent = 0;
    count_tree(root, &nmod, &nent);
    md->modules = calloc((size_t)nmod, sizeof *md->modules);
    md->entries = calloc(nent ? nent : 1, sizeof *md->entries);
    if (!md->modules || !md->entries) {
        dt_error(DT_ERR_NO_MEMORY, "dt_model_build: out of memory");
        goto fail;
    }
    if (collect(md, root, NULL) < 0)
        goto fail;
    /* offsets */
    size_t pn = 0, bb = 0;
    for (size_t i = 0; i < md->nentry; i++) {
        dt_param_info *p = &md->entries[i].info;
        size_t esz = dt_dtype_size(p->dtype);
        if (p->is_buffer) {
            p->offset = bb / esz;
            bb += (p->numel * esz + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN;
        } else {
            p->offset = pn;
            pn += ALIGN_ELEMS(p->numel * sizeof(float), sizeof(float));
            md->nparams++;
            md->param_count += p->numel;
        }
    }
    md->flat_numel = pn;
    md->buf_nbytes = bb;
    md->params = dt_calloc(pn * sizeof(float));
    md->grads = dt_calloc(pn * sizeof(float));
    md->buffers = dt_calloc(bb);
    md->grads_owned = true;
    if (!md->params || !md->grads || !md->buffers) {
        dt_error_wrap(DT_ERR_NO_MEMORY, "dt_model_build: flat buffers of %zu floats", pn);
        goto fail;
    }
    /* views, grads, init */
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        dt_param_info *p = &e->info;
        int spec_i = e->spec;
        dt_module *m = p->module;
        void *base = p->is_buffer ? (void *)(md->buffers + p->offset * dt_dtype_size(p->dtype))
                                  : (void *)(md->params + p->offset);
        p->tensor = dt_tensor_wrap(base, p->dtype, p->ndim, p->shape);
        if (!p->tensor)
            goto fail;
        p->tensor->name = e->name;
        m->params[spec_i] = p->tensor;
        if (!p->is_buffer) {
            e->grad = dt_tensor_wrap(md->grads + p->offset, DT_F32, p->ndim, p->shape);
            if (!e->grad || dt_tensor_set_grad(p->tensor, e->grad) < 0 ||
                dt_ag_add_grad_hook(p->tensor, grad_ready_tramp, e) < 0)
                goto fail;
        }
        fill_init(md, e, &m->specs[spec_i]);
    }
    return md;
fail:
    dt_error_wrap(dt_last_status() ? dt_last_status() : DT_ERR_INTERNAL, "dt_model_build");
    dt_model_free(md);
    return NULL;
}

void dt_model_free(dt_model *md)
{
    if (!md)
        return;
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        if (e->info.tensor) {
            dt_tensor_set_grad(e->info.tensor, NULL);
            dt_tensor_free(e->info.tensor);
        }
        dt_tensor_free(e->grad);
        free(e->name);
    }
    free(md->entries);
    free(md->modules);
    dt_module_free(md->root);
    dt_free(md->params);
    if (md->grads_owned)
        dt_free(md->grads);
    dt_free(md->buffers);
    free(md);
}

/* ---- accessors ---------------------------------------------------------------------------- */

dt_tensor *dt_model_forward(dt_ctx *ctx, dt_model *m, dt_tensor *x)
{
    if (!m) {
        dt_error(DT_ERR_NULL, "dt_model_forward: model is NULL");
        return NULL;
    }
    bool blk = m->blocked_acts;
    for (int i = 0; blk && i < m->nmodules; i++) {
        const dt_module *md = m->modules[i];
        if (md->fwd_override)
            blk = false;
        for (int k = 0; k < DT__HOOK_KINDS; k++)
            if (md->nhooks[k])
                blk = false;
    }
    if (!blk || !ctx)
        return dt_module_forward(ctx, m->root, x);
    bool old = dt_ctx_set_blocked(ctx, true);
    dt_tensor *y = dt_module_forward(ctx, m->root, x);
    dt_ctx_set_blocked(ctx, old);
    return y;
}

dt_module *dt_model_root(const dt_model *m) { return m ? m->root : NULL; }

dt_module *dt_model_find_module(const dt_model *m, const char *path)
{
    for (int i = 0; m && path && i < m->nmodules; i++)
        if (!strcmp(m->modules[i]->path, path))
            return m->modules[i];
    return NULL;
}

void dt_model_train(dt_model *m, bool training)
{
    for (int i = 0; m && i < m->nmodules; i++)
        m->modules[i]->training = training;
}

void dt_model_set_rank(dt_model *m, int rank)
{
    if (m)
        m->rank = rank;
}

size_t dt_model_num_entries(const dt_model *m) { return m ? m->nentry : 0; }

dt_status dt_model_entry(const dt_model *m, size_t i, dt_param_info *out)
{
    if (!m || !out)
        return dt_error(DT_ERR_NULL, "dt_model_entry: %s is NULL", m ? "out" : "model");
    if (i >= m->nentry)
        return dt_error(DT_ERR_RANGE, "dt_model_entry: index %zu, model has %zu entries", i, m->nentry);
    *out = m->entries[i].info;
    return DT_OK;
}

int64_t dt_model_find_entry(const dt_model *m, const char *name)
{
    for (size_t i = 0; m && name && i < m->nentry; i++)
        if (!strcmp(m->entries[i].name, name))
            return (int64_t)i;
    return -1;
}

size_t dt_model_num_params(const dt_model *m) { return m ? m->nparams : 0; }
size_t dt_model_param_count(const dt_model *m) { return m ? m->param_count : 0; }
float *dt_model_params(const dt_model *m) { return m ? m->params : NULL; }
size_t dt_model_flat_numel(const dt_model *m) { return m ? m->flat_numel : 0; }
float *dt_model_grads(const dt_model *m) { return m ? m->grads : NULL; }
void *dt_model_buffers(const dt_model *m) { return m ? m->buffers : NULL; }
size_t dt_model_buffers_nbytes(const dt_model *m) { return m ? m->buf_nbytes : 0; }

dt_status dt_model_set_grad_buffer(dt_model *m, float *grads)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_model_set_grad_buffer: model is NULL");
    float *owned = NULL;
    if (!grads) {
        owned = dt_calloc(m->flat_numel * sizeof(float));
        if (!owned)
            return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_model_set_grad_buffer");
        grads = owned;
    }
    for (size_t i = 0; i < m->nentry; i++) {
        dt__entry *e = &m->entries[i];
        if (!e->info.is_buffer)
            dt_tensor_rebind(e->grad, grads + e->info.offset);
    }
    if (m->grads_owned)
        dt_free(m->grads);
    m->grads = grads;
    m->grads_owned = owned != NULL;
    return DT_OK;
}

void dt_model_zero_grad(dt_model *m)
{
    if (m && m->grads)
        memset(m->grads, 0, m->flat_numel * sizeof(float));
}

dt_status dt_model_on_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ud)
{
    if (!m || !fn)
        return dt_error(DT_ERR_NULL, "dt_model_on_grad_ready: %s is NULL", m ? "fn" : "model");
    if (m->nready >= DT_NN_MAX_HOOKS)
        return dt_error(DT_ERR_RANGE, "dt_model_on_grad_ready: at most %d callbacks", DT_NN_MAX_HOOKS);
    m->ready[m->nready].fn = fn;
    m->ready[m->nready].ud = ud;
    m->nready++;
    return DT_OK;
}

dt_status dt_model_remove_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ud)
{
    if (!m || !fn)
        return dt_error(DT_ERR_NULL, "dt_model_remove_grad_ready: %s is NULL", m ? "fn" : "model");
    for (int i = 0; i < m->nready; i++)
        if (m->ready[i].fn == fn && m->ready[i].ud == ud) {
            for (int j = i + 1; j < m->nready; j++)
                m->ready[j - 1] = m->ready[j];
            m->nready--;
            return DT_OK;
        }
    return dt_error(DT_ERR_NOT_FOUND, "dt_model_remove_grad_ready: callback not registered");
}
