/* Models: the typed flat parameter / gradient / buffer layout, names, init,
 * hooks.
 *
 * dt_model_build walks the module tree in pre-order (a module's own
 * parameters, then its buffers, then its children: PyTorch's state_dict
 * order), gives every entry an offset rounded up to 64 bytes in the flat of
 * its role (parameter or buffer) and dtype, allocates the flats (padded for
 * the build's world size), wraps one tensor view per entry (and one grad
 * view per parameter) and initialises the values. Element j of entry i is
 * drawn from the Philox stream (seed, DT_RNG_INIT, i, j), so a value depends
 * only on the seed, the model structure and its own position: any range of
 * a flat can be initialised alone (dt_model_init_range), which is what a
 * meta build followed by a sharded allocation needs. */
#include "nn_impl.h"
#include "dtrain/kernels.h"
#include "dtrain/precision.h"

#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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
            /* PEFT's bias: every "bias", or an adapted layer's own */
            const bool bias = !strcmp(s->name, "bias") &&
                              (md->lora_bias == DT_LORA_BIAS_ALL ||
                               (md->lora_bias == DT_LORA_BIAS_LORA_ONLY && dt_module_find_child(m, "lora_A")));
            p->frozen = !s->is_buffer && md->lora && !dt__lora_param(m) && !dt__lora_saved(m, md->lora_saved) && !bias;
            if (!s->is_buffer && md->lora && !dt__lora_param(m) && !p->frozen && s->tp_dim)
                return dt_error(DT_ERR_UNSUPPORTED, "LoRA modules_to_save: '%s' is a tensor-parallel slice (modules "
                                "to save train without --tp)", e->name);
            for (const char *const *f = md->frozen; f && *f && !s->is_buffer && !p->frozen; f++)
                p->frozen = fnmatch(*f, e->name, 0) == 0;
            p->is_buffer = s->is_buffer || p->frozen; /* frozen: stored and kept like a buffer */
            if ((unsigned)s->dtype >= DT_DTYPE_COUNT)
                return dt_error(DT_ERR_INVALID_ARG, "dt_model_build: '%s' has an unknown dtype %d", e->name,
                                (int)s->dtype);
            p->dtype = s->dtype;
            /* a low-precision model (apex O2 / FSDP param_dtype): f32 parameters
             * take param_dtype, batch norm's stay f32 if asked */
            bool keep = md->keep_bn_fp32 && m->kind == DT_NN_BATCHNORM2D;
            for (const char *const *f = md->f32_modules; f && *f && !keep; f++)
                keep = dt_module_path_within(m->path, *f); /* the policy's per-module f32 list */
            if (!s->is_buffer && s->dtype == DT_F32 && md->param_dtype != DT_F32 && !keep)
                p->dtype = md->param_dtype;
            if (s->is_buffer && s->dtype == DT_F32 && md->buffer_dtype != DT_F32 && !keep)
                p->dtype = md->buffer_dtype; /* FSDP's buffer_dtype */
            p->module = m;
            p->tp_dim = s->tp_dim;
            p->tp_chunks = s->tp_chunks > 1 ? s->tp_chunks : 1;
            memcpy(p->tp_chunk_rows, s->tp_chunk_rows, sizeof p->tp_chunk_rows);
            e->spec = i;
            e->tied = p->tied_to = -1;
        }
    for (int i = 0; i < m->nchild; i++) {
        dt_status st = collect(md, m->children[i], m->path);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* Point every tied entry at the entry of its (ultimate) source. */
static dt_status resolve_ties(dt_model *md)
{
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        const dt_module *src = e->info.module;
        int spec = e->spec;
        if (!src->ties[spec].src)
            continue;
        while (src->ties[spec].src) {
            const struct dt__tie *t = &src->ties[spec];
            src = t->src;
            spec = t->spec;
        }
        int64_t found = -1;
        for (size_t j = 0; j < md->nentry && found < 0; j++)
            if (md->entries[j].info.module == src && md->entries[j].spec == spec)
                found = (int64_t)j;
        if (found < 0)
            return dt_error(DT_ERR_INVALID_ARG, "dt_model_build: '%s' is tied to a parameter of a %s that is not "
                            "in this model", e->name, dt_module_type(src));
        e->tied = e->info.tied_to = found;
    }
    return DT_OK;
}

/* The U(-b, b) bound of a KAIMING or XAVIER init. Philox uses the short
 * formulas, torch's stream the ones torch evaluates (same value to an ulp). */
static double init_bound(const dt_param_info *p, dt_nn_init init, bool torch)
{
    double fan_in = p->ndim >= 2 ? (double)p->numel / (double)p->shape[0] : (double)p->numel;
    if (init == DT_NN_INIT_KAIMING) /* kaiming_uniform_(a = sqrt(5)) */
        return torch ? sqrt(3.0) * (sqrt(2.0 / (1.0 + 5.0)) / sqrt(fan_in)) : 1.0 / sqrt(fan_in);
    double fo = p->ndim >= 2 ? (double)p->shape[1] : fan_in, fi = p->ndim >= 2 ? (double)p->shape[0] : fan_in;
    if (p->ndim > 2) { /* receptive field as in torch's xavier */
        double rf = (double)p->numel / ((double)p->shape[0] * (double)p->shape[1]);
        fi *= rf, fo *= rf;
    }
    return torch ? sqrt(3.0) * sqrt(2.0 / (fi + fo)) : sqrt(6.0 / (fi + fo));
}

static const dt_nn_param_spec *entry_spec(const dt__entry *e) { return &e->info.module->specs[e->spec]; }

/* Zeroes the part of out (elements [lo, hi) of the entry with spec s) that
 * lies in s's padding row (dt_module_set_param_padding_row). */
static void zero_padding_row(const dt_param_info *p, const dt_nn_param_spec *s, size_t lo, size_t hi, float *out)
{
    if (!s->has_padding_row || !out || p->ndim < 1 || p->shape[0] < 1)
        return;
    size_t row = p->numel / (size_t)p->shape[0], a = (size_t)s->padding_row * row, b = a + row;
    a = a > lo ? a : lo, b = b < hi ? b : hi;
    if (a < b)
        dt_memzero(out + (a - lo), (b - a) * sizeof(float));
}

/* Elements [lo, hi) of f32 entry e's initial value into out, Philox. */
static void philox_part(const dt_model *md, const dt__entry *e, const dt_nn_param_spec *s, uint64_t seed,
                        size_t lo, size_t hi, float *out)
{
    const dt_param_info *p = &e->info;
    dt_rng_key key = dt_rng_key_make(seed, DT_RNG_INIT, e->index, 0);
    size_t n = hi - lo;
    (void)md;
    switch (s->init) {
    case DT_NN_INIT_ZEROS:
        dt_memzero(out, n * sizeof(float));
        break;
    case DT_NN_INIT_ONES:
        for (size_t i = 0; i < n; i++)
            out[i] = 1.0f;
        break;
    case DT_NN_INIT_UNIFORM:
        dt_rng_fill_uniform(key, lo, out, n, -s->a, s->a);
        break;
    case DT_NN_INIT_NORMAL:
        dt_rng_fill_normal(key, lo, out, n, 0.0f, s->a);
        break;
    case DT_NN_INIT_KAIMING:
    case DT_NN_INIT_XAVIER: {
        float b = (float)init_bound(p, s->init, false);
        dt_rng_fill_uniform(key, lo, out, n, -b, b);
        break;
    }
    }
    zero_padding_row(p, s, lo, hi, out);
}

/* out (n elements of dtype dt) from the f32 values in tmp (n floats):
 * low-precision entries are initialised in f32 and rounded once. */
static void store_init(dt_dtype dt, const float *tmp, void *out, size_t n)
{
    if (dt != DT_F32 && n)
        dt_k_convert(tmp, DT_F32, out, dt, (int64_t)n);
}

/* Where an init of n elements of dtype dt writes f32 values: out itself
 * for f32, else a malloc'd buffer (NULL + error when out of memory). */
static float *init_target(dt_dtype dt, void *out, size_t n)
{
    if (dt == DT_F32 || !out)
        return out;
    float *t = malloc(n ? n * sizeof(float) : 1);
    if (!t)
        dt_error(DT_ERR_NO_MEMORY, "model init: out of memory for %zu values", n);
    return t;
}

/* One draw d from torch's stream g for entry e (all numel numbers, in
 * order), keeping elements [lo, hi) into out (out may be NULL when lo == hi). */
static void torch_part(dt_torch_rng *g, const dt__entry *e, const dt_torch_draw *d, size_t lo, size_t hi, float *out)
{
    const dt_param_info *p = &e->info;
    switch (d->init) {
    case DT_NN_INIT_ZEROS:
    case DT_NN_INIT_ONES:
        break;
    case DT_NN_INIT_UNIFORM:
        dt_torch_rng_uniform_part(g, p->numel, lo, hi, out, -(double)d->a, (double)d->a);
        break;
    case DT_NN_INIT_NORMAL:
        dt_torch_rng_normal_part(g, p->numel, lo, hi, out, 0.0, (double)d->a);
        break;
    case DT_NN_INIT_KAIMING:
    case DT_NN_INIT_XAVIER: {
        double b = init_bound(p, d->init, true);
        dt_torch_rng_uniform_part(g, p->numel, lo, hi, out, -b, b);
        break;
    }
    }
    zero_padding_row(p, entry_spec(e), lo, hi, out);
}

/* Elements [lo, hi) of entry e into dst (dtype e's): the f32 values of
 * fill(..., out) rounded once for low-precision entries. With a draw d from
 * g, else its constant init (Philox's writer). */
static dt_status write_part(const dt_model *md, const dt__entry *e, dt_torch_rng *g, const dt_torch_draw *d,
                            uint64_t seed, size_t lo, size_t hi, void *dst)
{
    float *t = init_target(e->info.dtype, dst, hi - lo);
    if (dst && !t)
        return dt_last_status();
    if (d)
        torch_part(g, e, d, lo, hi, t);
    else
        philox_part(md, e, entry_spec(e), seed, lo, hi, t);
    if (t != dst) {
        store_init(e->info.dtype, t, dst, hi - lo);
        free(t);
    }
    return DT_OK;
}

/* Writes entry e's constant init (zeros, ones) when it has one and `want`. */
static dt_status write_constant(const dt_model *md, const dt__entry *e, uint64_t seed, bool want)
{
    const dt_param_info *p = &e->info;
    if (!want || e->tied >= 0 || !p->tensor || !p->numel || !dt_dtype_is_float(p->dtype) ||
        (p->is_buffer && !p->frozen) || dt__random_init(entry_spec(e)->init))
        return DT_OK;
    return write_part(md, e, NULL, NULL, seed, 0, p->numel, p->tensor->data);
}

/* Walks torch's stream for md (dt__torch_draw): every draw in order (the
 * stream's time is the whole model's), writing the part of each kept draw
 * that is ours and dropping the rest. Ours: with dst, the draw's elements
 * inside dst's range of the parameter flat of dst's dtype (frozen entries
 * live in the buffers, other dtypes in other flats); without, whole entries
 * into their tensors (only the frozen ones with frozen_only). */
static dt_status torch_walk(const dt_model *md, uint64_t seed, bool frozen_only, const dt_flat *dst)
{
    dt_torch_rng g;
    dt_torch_rng_seed(&g, seed);
    for (size_t k = 0; k < dt__torch_ndraws(md); k++) {
        dt_torch_draw d;
        if (!dt__torch_draw(md, k, &d))
            continue;
        const dt__entry *e = &md->entries[d.entry];
        const dt_param_info *p = &e->info;
        size_t a = 0, b = 0; /* the entry's elements [a, b) written to out */
        void *out = NULL;
        if (d.keep && e->tied < 0 && dst) {
            size_t lo = dst->offset, hi = dst->offset + dst->numel;
            size_t x = p->offset > lo ? p->offset : lo, y = p->offset + p->numel < hi ? p->offset + p->numel : hi;
            if (!p->is_buffer && p->dtype == dst->dtype && x < y)
                a = x - p->offset, b = y - p->offset, out = dt_flat_ptr(dst, x);
        } else if (d.keep && e->tied < 0 && p->tensor && (!frozen_only || p->frozen)) {
            b = p->numel, out = p->tensor->data;
        }
        dt_status st = write_part(md, e, &g, &d, seed, a, b, out);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt_model_init_torch(dt_model *md, uint64_t seed)
{
    if (!md)
        return dt_error(DT_ERR_NULL, "dt_model_init_torch: model is NULL");
    if (md->meta)
        return dt_error(DT_ERR_STATE, "dt_model_init_torch: the model is meta (no storage): use "
                                      "dt_model_init_range(m, DT_INIT_TORCH, seed, shard)");
    /* the stream is drawn on one thread: the parameters' fresh pages (a
     * build with init DT_INIT_TORCH left them unwritten) are committed on
     * every compute thread first */
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        dt_prefault(md->flats[DT_FLAT_PARAMS][d].base, dt_flat_nbytes(&md->flats[DT_FLAT_PARAMS][d]));
    /* constant inits draw nothing from torch's stream; they are written
     * here too (a low-precision entry may hold unset values) */
    for (size_t i = 0; i < md->nentry; i++) {
        dt_status st = write_constant(md, &md->entries[i], seed, true);
        if (st < 0)
            return st;
    }
    return torch_walk(md, seed, false, NULL);
}

dt_status dt_model_init_frozen(dt_model *md, dt_init_rng rng, uint64_t seed)
{
    if (!md)
        return dt_error(DT_ERR_NULL, "dt_model_init_frozen: model is NULL");
    if ((unsigned)rng >= DT_INIT_RNG_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_init_frozen: unknown generator %d", (int)rng);
    if (rng == DT_INIT_PHILOX)
        return DT_OK; /* the build drew them so */
    for (size_t i = 0; i < md->nentry; i++) {
        dt_status st = write_constant(md, &md->entries[i], seed, md->entries[i].info.frozen);
        if (st < 0)
            return st;
    }
    return torch_walk(md, seed, true, NULL);
}

dt_status dt_model_init_range(const dt_model *md, dt_init_rng rng, uint64_t seed, dt_flat *dst)
{
    if (!md || !dst)
        return dt_error(DT_ERR_NULL, "dt_model_init_range: %s is NULL", md ? "destination" : "model");
    if ((unsigned)rng >= DT_INIT_RNG_COUNT || (unsigned)dst->dtype >= DT_DTYPE_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_init_range: unknown generator %d or dtype %d", (int)rng,
                        (int)dst->dtype);
    const dt_flat *full = &md->flats[DT_FLAT_PARAMS][dst->dtype];
    size_t lo = dst->offset, hi = dst->offset + dst->numel;
    if (hi < lo || hi > full->total)
        return dt_error(DT_ERR_RANGE, "dt_model_init_range: range [%zu, %zu) outside the %s parameter flat of %zu "
                        "elements", lo, hi, dt_dtype_name(dst->dtype), full->total);
    if (!dst->base && hi > lo)
        return dt_error(DT_ERR_NULL, "dt_model_init_range: destination has no memory");
    if (hi > lo)
        memset(dst->base, 0, dt_flat_nbytes(dst));
    if (!dt_dtype_is_float(dst->dtype))
        return DT_OK; /* non-float entries start at zero */
    /* Philox's values, and torch's constant inits: each entry's part of the range */
    for (size_t i = 0; i < md->nentry; i++) {
        const dt__entry *e = &md->entries[i];
        const dt_param_info *p = &e->info;
        if (p->is_buffer || p->dtype != dst->dtype || e->tied >= 0 ||
            (rng == DT_INIT_TORCH && dt__random_init(entry_spec(e)->init)))
            continue;
        size_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel < hi ? p->offset + p->numel : hi;
        dt_status st = a < b ? write_part(md, e, NULL, NULL, seed, a - p->offset, b - p->offset, dt_flat_ptr(dst, a))
                             : DT_OK;
        if (st < 0)
            return st;
    }
    if (rng != DT_INIT_TORCH)
        return DT_OK;
    return torch_walk(md, seed, false, dst); /* the range's part of torch's stream */
}

static dt_status grad_ready_tramp(dt_tensor *leaf, void *ud)
{
    (void)leaf;
    dt__entry *e = ud;
    dt_model *md = e->model;
    for (int i = 0; i < md->ready.n; i++) {
        dt_status st = ((dt_grad_ready_fn)md->ready.h[i].fn)(md, e->index, &e->info, md->ready.h[i].ud);
        if (st < 0)
            return dt_error_wrap(st, "grad-ready hook %d of '%s'", i, e->name);
    }
    return DT_OK;
}

/* Entry e's views as dt_model_build makes them: its tensor on data (named,
 * in its module's slot) and, for a parameter, its gradient view on grad,
 * attached with the grad-ready hook when the dtype is f32, bf16 or f16
 * (differentiable, precision.h); other dtypes keep theirs unattached (the
 * mirror layout). On failure what was made stays for the caller to free;
 * dt_last_error() says why. */
static dt_status entry_views(dt__entry *e, void *data, void *grad)
{
    dt_param_info *p = &e->info;
    if (!(p->tensor = dt_tensor_wrap(data, p->dtype, p->ndim, p->shape)))
        return dt_last_status() ? dt_last_status() : DT_ERR_NO_MEMORY;
    p->tensor->name = e->name;
    p->module->params[e->spec] = p->tensor;
    if (p->is_buffer)
        return DT_OK;
    if (!(e->grad = dt_tensor_wrap(grad, p->dtype, p->ndim, p->shape)))
        return dt_last_status() ? dt_last_status() : DT_ERR_NO_MEMORY;
    dt_status st = DT_OK;
    if (dt_dtype_is_float(p->dtype) && ((st = dt_tensor_set_grad(p->tensor, e->grad)) < 0 ||
                                        (st = dt_ag_add_grad_hook(p->tensor, grad_ready_tramp, e)) < 0))
        return st;
    return DT_OK;
}

dt_model_build_params dt_model_build_params_default(void)
{
    dt_model_build_params p = {.world = 1, .meta = false, .param_dtype = DT_F32, .keep_batchnorm_fp32 = true,
                               .f32_modules = NULL, .buffer_dtype = DT_F32, .init = DT_INIT_PHILOX};
    return p;
}

dt_status dt_model_build(dt_module *root, uint64_t seed, const dt_model_build_params *bp, dt_model **out)
{
    if (!out) {
        dt_module_free(root);
        return dt_error(DT_ERR_NULL, "dt_model_build: out is NULL");
    }
    *out = NULL;
    if (!root)
        return dt_last_status() < 0 ? dt_last_status() : dt_error(DT_ERR_NULL, "dt_model_build: root module is NULL");
    if (root->model || root->parent) /* not ours to free: it belongs to a model or a container already */
        return dt_error(DT_ERR_STATE, "dt_model_build: module '%s' (%s) already belongs to a %s",
                        dt_module_path(root), dt_module_type(root), root->model ? "model" : "container");
    dt_model_build_params defp = dt_model_build_params_default();
    if (!bp)
        bp = &defp;
    if (bp->world < 1) {
        dt_module_free(root);
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_build: world %d must be >= 1", bp->world);
    }
    if ((unsigned)bp->init >= DT_INIT_RNG_COUNT) {
        dt_module_free(root);
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_build: unknown init generator %d", (int)bp->init);
    }
    if (!dt_dtype_is_float(bp->param_dtype)) {
        dt_module_free(root);
        return dt_error(DT_ERR_DTYPE, "dt_model_build: param_dtype %s; want f32, bf16 or f16",
                        dt_dtype_name(bp->param_dtype));
    }
    if (bp->buffer_dtype != DT_F32 && bp->buffer_dtype != DT_BF16 && bp->buffer_dtype != DT_F16) {
        dt_module_free(root);
        return dt_error(DT_ERR_DTYPE, "dt_model_build: buffer_dtype %s; want f32, bf16 or f16",
                        dt_dtype_name(bp->buffer_dtype));
    }
    dt_model *md = calloc(1, sizeof *md);
    if (!md) {
        dt_module_free(root);
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_build: out of memory");
    }
    md->root = root;
    md->seed = seed;
    md->world = bp->world;
    md->meta = bp->meta;
    md->param_dtype = bp->param_dtype;
    md->buffer_dtype = bp->buffer_dtype;
    md->keep_bn_fp32 = bp->keep_batchnorm_fp32;
    md->f32_modules = bp->f32_modules;
    md->frozen = bp->frozen;
    md->lora = bp->lora != NULL;
    md->lora_saved = bp->lora ? bp->lora->modules_to_save : NULL;
    md->lora_bias = bp->lora ? bp->lora->bias : DT_LORA_BIAS_NONE;
    if (bp->lora && dt__lora_apply(root, bp->lora) < 0) {
        dt_status st = dt_last_status();
        dt_module_free(root);
        free(md);
        return st;
    }
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
    md->lora_saved = NULL; /* borrowed for collect */
    if (resolve_ties(md) < 0)
        goto fail;
    /* a weight tied to a module to save trains (PEFT's ensure_weight_tying) */
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i], *t = e->tied >= 0 ? &md->entries[e->tied] : NULL;
        if (t && md->lora && !e->info.frozen && t->info.frozen)
            t->info.frozen = t->info.is_buffer = false;
    }
    for (size_t i = 0; i < md->nentry; i++) { /* a tied entry is stored (and frozen or not) as its source */
        dt__entry *e = &md->entries[i];
        if (e->tied >= 0) {
            e->info.frozen = md->entries[e->tied].info.frozen;
            e->info.is_buffer = md->entries[e->tied].info.is_buffer;
        }
    }
    /* offsets: per role and dtype, each entry on a 64-byte boundary */
    size_t used[DT_FLAT_ROLE_COUNT][DT_DTYPE_COUNT] = {{0}};
    for (size_t i = 0; i < md->nentry; i++) {
        dt_param_info *p = &md->entries[i].info;
        if (p->tied_to >= 0)
            continue;
        size_t esz = dt_dtype_size(p->dtype);
        size_t *u = &used[p->is_buffer ? DT_FLAT_BUFFERS : DT_FLAT_PARAMS][p->dtype];
        p->offset = *u;
        *u += (p->numel * esz + DT_ALIGN - 1) / DT_ALIGN * DT_ALIGN / esz;
        if (!p->is_buffer) {
            md->nparams++;
            md->param_count += p->numel;
            md->nparams_f32 += dt_dtype_is_float(p->dtype);
        }
    }
    for (size_t i = 0; i < md->nentry; i++)
        if (md->entries[i].tied >= 0)
            md->entries[i].info.offset = md->entries[md->entries[i].tied].info.offset;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        used[DT_FLAT_GRADS][d] = used[DT_FLAT_PARAMS][d];
        for (int r = 0; r < DT_FLAT_ROLE_COUNT; r++) {
            dt_flat *f = &md->flats[r][d];
            if (!used[r][d])
                continue;
            if (md->meta && r != DT_FLAT_BUFFERS) { /* the geometry only */
                size_t total = dt_flat_padded((dt_dtype)d, used[r][d], bp->world);
                *f = (dt_flat){.dtype = (dt_dtype)d, .numel = total, .total = total, .used = used[r][d],
                               .world = bp->world};
                continue;
            }
            if (dt_flat_alloc(f, (dt_dtype)d, used[r][d], bp->world, NULL) < 0) {
                dt_error_wrap(dt_last_status(), "dt_model_build: %s flat", dt_dtype_name((dt_dtype)d));
                goto fail;
            }
        }
    }
    /* views, grads, init; tied entries take their source's tensor after */
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        dt_param_info *p = &e->info;
        dt_module *m = p->module;
        const dt_nn_param_spec *s = &m->specs[e->spec];
        if (e->tied >= 0)
            continue;
        void *base = dt_flat_ptr(&md->flats[p->is_buffer ? DT_FLAT_BUFFERS : DT_FLAT_PARAMS][p->dtype], p->offset);
        if (!base)
            continue; /* meta parameter (or an empty buffer) */
        if (entry_views(e, base, p->is_buffer ? NULL : dt_flat_ptr(&md->flats[DT_FLAT_GRADS][p->dtype], p->offset)) < 0)
            goto fail;
        if (bp->init == DT_INIT_TORCH && !p->is_buffer && dt__random_init(s->init))
            continue; /* torch's stream draws it next (the flat's mapping reads zero until then) */
        if (dt_dtype_is_float(p->dtype) && (!p->is_buffer || p->dtype != DT_F32)) {
            float *t = init_target(p->dtype, base, p->numel);
            if (!t)
                goto fail;
            philox_part(md, e, s, seed, 0, p->numel, t);
            if (t != base) {
                store_init(p->dtype, t, base, p->numel);
                free(t);
            }
        } else if (p->dtype == DT_F32) {
            philox_part(md, e, s, seed, 0, p->numel, base);
        }
    }
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        if (e->tied >= 0) {
            e->info.tensor = md->entries[e->tied].info.tensor;
            e->info.module->params[e->spec] = e->info.tensor;
        }
    }
    *out = md;
    return DT_OK;
fail:;
    dt_status st = dt_error_wrap(dt_last_status() ? dt_last_status() : DT_ERR_INTERNAL, "dt_model_build");
    dt_model_free(md);
    return st;
}

void dt_model_free(dt_model *md)
{
    if (!md)
        return;
    for (size_t i = 0; i < md->nentry; i++) {
        dt__entry *e = &md->entries[i];
        if (e->info.tensor && e->tied < 0) {
            dt_tensor_set_grad(e->info.tensor, NULL);
            dt_tensor_free(e->info.tensor);
        }
        dt_tensor_free(e->grad);
        free(e->name);
    }
    free(md->entries);
    free(md->modules);
    dt_module_free(md->root);
    for (int r = 0; r < DT_FLAT_ROLE_COUNT; r++)
        for (int d = 0; d < DT_DTYPE_COUNT; d++)
            dt_flat_free(&md->flats[r][d]);
    dt__hooks_free(&md->ready);
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        free(md->keep[d]);
    free(md->torch_draws);
    free(md);
}

/* ---- accessors ---------------------------------------------------------------------------- */

dt_tensor *dt_model_forward(dt_ctx *ctx, dt_model *m, dt_tensor *x)
{
    if (!m) {
        dt_error(DT_ERR_NULL, "dt_model_forward: model is NULL");
        return NULL;
    }
    if (m->meta && m->nbound < m->nparams_f32) {
        dt_error(DT_ERR_STATE, "dt_model_forward: the model is meta (its parameters have no storage; a sharding "
                               "strategy binds them: dt_model_bind_param)");
        return NULL;
    }
    return dt_module_forward(ctx, m->root, x);
}

bool dt_module_path_within(const char *path, const char *prefix)
{
    if (!path || !prefix)
        return false;
    size_t n = strlen(prefix);
    return n == 0 || (!strncmp(path, prefix, n) && (path[n] == 0 || path[n] == '.'));
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

void dt_model_set_replica_ranks(dt_model *m, int n)
{
    if (m)
        m->replica_ranks = n;
}

size_t dt_model_rng_state_size(const dt_model *m) { return m ? (size_t)m->nmodules : 0; }

dt_status dt_model_get_rng_state(const dt_model *m, uint64_t *out, size_t n)
{
    if (!m || (!out && m->nmodules > 0))
        return dt_error(DT_ERR_NULL, "dt_model_get_rng_state: NULL %s", m ? "out" : "model");
    if (n < (size_t)m->nmodules)
        return dt_error(DT_ERR_RANGE, "dt_model_get_rng_state: room for %zu counters, the model has %d", n,
                        m->nmodules);
    for (int i = 0; i < m->nmodules; i++)
        out[i] = m->modules[i]->fwd_count;
    return DT_OK;
}

dt_status dt_model_set_rng_state(dt_model *m, const uint64_t *in, size_t n)
{
    if (!m || (!in && n > 0))
        return dt_error(DT_ERR_NULL, "dt_model_set_rng_state: NULL %s", m ? "counters" : "model");
    if (n != (size_t)m->nmodules)
        return dt_error(DT_ERR_MISMATCH, "random-stream state of %zu modules, the model has %d (another model?)", n,
                        m->nmodules);
    for (int i = 0; i < m->nmodules; i++)
        m->modules[i]->fwd_count = in[i];
    return DT_OK;
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
int dt_model_world(const dt_model *m) { return m ? m->world : 0; }
bool dt_model_is_meta(const dt_model *m) { return m && m->meta; }

const dt_flat *dt_model_flat(const dt_model *m, dt_flat_role role, dt_dtype dtype)
{
    if (!m || (unsigned)role >= DT_FLAT_ROLE_COUNT || (unsigned)dtype >= DT_DTYPE_COUNT ||
        !m->flats[role][dtype].total)
        return NULL;
    return &m->flats[role][dtype];
}

dt_status dt_model_set_grads(dt_model *m, dt_dtype dtype, const dt_flat *g)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_model_set_grads: model is NULL");
    if ((unsigned)dtype >= DT_DTYPE_COUNT || !m->flats[DT_FLAT_GRADS][dtype].total)
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_set_grads: the model has no %s gradients", dt_dtype_name(dtype));
    if (m->meta)
        return dt_error(DT_ERR_STATE, "dt_model_set_grads: the model is meta (no gradient views)");
    dt_flat *cur = &m->flats[DT_FLAT_GRADS][dtype];
    dt_flat next;
    if (g) {
        if (g->dtype != dtype || g->offset != 0 || g->numel != cur->total || !g->base)
            return dt_error(DT_ERR_SHAPE, "dt_model_set_grads: need a full %s flat of %zu elements, got %s [%zu, +%zu)",
                            dt_dtype_name(dtype), cur->total, dt_dtype_name(g->dtype), g->offset, g->numel);
        next = *g;
        next.owned = false;
        next.used = cur->used;
        next.world = cur->world;
        next.total = cur->total;
    } else if (dt_flat_alloc(&next, dtype, cur->used, cur->world, NULL) < 0) {
        return dt_error_wrap(dt_last_status(), "dt_model_set_grads");
    }
    for (size_t i = 0; i < m->nentry; i++) {
        dt__entry *e = &m->entries[i];
        if (!e->info.is_buffer && e->info.dtype == dtype && e->grad)
            dt_tensor_rebind(e->grad, dt_flat_ptr(&next, e->info.offset));
    }
    dt_flat_free(cur);
    *cur = next;
    return DT_OK;
}

dt_status dt_model_bind_param(dt_model *m, size_t i, void *data, void *grad)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_model_bind_param: model is NULL");
    if (i >= m->nentry) /* first: an index past the end is the error, whatever the buffers */
        return dt_error(DT_ERR_RANGE, "dt_model_bind_param: index %zu, model has %zu entries", i, m->nentry);
    if (!data || !grad)
        return dt_error(DT_ERR_NULL, "dt_model_bind_param: %s is NULL", !data ? "data" : "grad");
    dt__entry *e = &m->entries[i];
    dt_param_info *p = &e->info;
    if (p->is_buffer || e->tied >= 0 || !dt_dtype_is_float(p->dtype))
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_bind_param: entry '%s' is %s", e->name,
                        p->is_buffer ? "a buffer" : e->tied >= 0 ? "tied (bind its source)" : "not f32/bf16/f16");
    if (p->tensor) { /* re-home the existing views */
        dt_tensor_rebind(p->tensor, data);
        dt_tensor_rebind(e->grad, grad);
        return DT_OK;
    }
    /* a meta model's entry: create the views as dt_model_build would */
    dt_tensor *slot = p->module->params[e->spec];
    dt_status st = entry_views(e, data, grad);
    if (st < 0) {
        if (p->tensor)
            dt_tensor_set_grad(p->tensor, NULL);
        p->module->params[e->spec] = slot;
        dt_tensor_free(p->tensor);
        dt_tensor_free(e->grad);
        p->tensor = e->grad = NULL;
        return dt_error_wrap(st, "dt_model_bind_param '%s'", e->name);
    }
    for (size_t j = 0; j < m->nentry; j++) /* entries tied to this one share its tensor */
        if (m->entries[j].tied == (int64_t)i) {
            m->entries[j].info.tensor = p->tensor;
            m->entries[j].info.module->params[m->entries[j].spec] = p->tensor;
        }
    m->nbound++;
    return DT_OK;
}

dt_status dt__model_materialize(dt_model *m)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt__model_materialize: model is NULL");
    if (!m->meta)
        return DT_OK;
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        for (int r = 0; r < 2; r++) {
            dt_flat *f = &m->flats[r ? DT_FLAT_GRADS : DT_FLAT_PARAMS][d];
            dt_flat g;
            if (!f->used || f->base)
                continue;
            if (dt_flat_alloc(&g, (dt_dtype)d, f->used, m->world, NULL) < 0)
                return dt_error_wrap(dt_last_status(), "dt__model_materialize: %s %s flat", dt_dtype_name((dt_dtype)d),
                                     r ? "gradient" : "parameter");
            *f = g;
        }
    for (size_t i = 0; i < m->nentry; i++) {
        dt__entry *e = &m->entries[i];
        dt_param_info *p = &e->info;
        if (p->is_buffer || e->tied >= 0 || p->tensor)
            continue;
        void *data = dt_flat_ptr(&m->flats[DT_FLAT_PARAMS][p->dtype], p->offset);
        void *grad = dt_flat_ptr(&m->flats[DT_FLAT_GRADS][p->dtype], p->offset);
        if (dt_dtype_is_float(p->dtype)) {
            dt_status st = dt_model_bind_param(m, i, data, grad);
            if (st < 0)
                return dt_error_wrap(st, "dt__model_materialize");
            continue;
        }
        /* as dt_model_build: a view and an unattached gradient view (the mirror layout) */
        dt_status st = entry_views(e, data, grad);
        if (st < 0)
            return dt_error_wrap(st, "dt__model_materialize '%s'", e->name);
    }
    m->meta = false;
    return DT_OK;
}

void dt_model_zero_grad(dt_model *m)
{
    for (size_t i = 0; m && i < m->nentry; i++)
        if (m->entries[i].info.tensor)
            m->entries[i].info.tensor->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
    for (int d = 0; m && d < DT_DTYPE_COUNT; d++) {
        const dt_flat *g = &m->flats[DT_FLAT_GRADS][d];
        if (!g->base)
            continue;
        if (!m->keep[d]) {
            dt_memzero(g->base, dt_flat_nbytes(g));
            continue;
        }
        /* only the spans this rank holds: a write elsewhere would commit the
         * pages dt__model_release gave back */
        const size_t es = dt_dtype_size(g->dtype);
        for (size_t i = 0; i < m->nkeep[d]; i++)
            dt_memzero((char *)g->base + m->keep[d][2 * i] * es, (m->keep[d][2 * i + 1] - m->keep[d][2 * i]) * es);
    }
}

/* ---- resident spans (pipeline stages) ------------------------------------------------------ */

/* Give back the whole pages inside elements [lo, hi) of mapped flat f. */
static size_t release_span(const dt_flat *f, size_t lo, size_t hi)
{
    if (!f->mapped || !f->base || hi <= lo)
        return 0;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    const size_t es = dt_dtype_size(f->dtype);
    uintptr_t a = (uintptr_t)f->base + lo * es, b = (uintptr_t)f->base + hi * es;
    a = (a + pg - 1) / pg * pg;
    b = b / pg * pg;
    if (b <= a)
        return 0;
    /* no huge page may later cover (and commit) what is given back */
    madvise((void *)a, b - a, MADV_NOHUGEPAGE);
    return madvise((void *)a, b - a, MADV_DONTNEED) == 0 ? b - a : 0;
}

dt_status dt__model_claim(dt_model *m, const void *by)
{
    if (m->trainer && m->trainer != by)
        return dt_error(DT_ERR_STATE, "dt_trainer_init: the model is trained by another dt_trainer already (free that "
                        "one first: both would attach their strategy to its parameters)");
    m->trainer = by;
    return DT_OK;
}

void dt__model_unclaim(dt_model *m, const void *by)
{
    if (m && m->trainer == by)
        m->trainer = NULL;
}

size_t dt__model_release(dt_model *m)
{
    size_t n = 0;
    for (int d = 0; m && d < DT_DTYPE_COUNT; d++) {
        if (!m->keep[d])
            continue;
        for (int r = 0; r < 2; r++) {
            const dt_flat *f = &m->flats[r ? DT_FLAT_GRADS : DT_FLAT_PARAMS][d];
            size_t prev = 0;
            for (size_t i = 0; i < m->nkeep[d]; i++) {
                n += release_span(f, prev, m->keep[d][2 * i]);
                prev = m->keep[d][2 * i + 1];
            }
            n += release_span(f, prev, f->total);
        }
    }
    return n;
}

dt_status dt__model_keep_only(dt_model *m, dt_dtype dtype, const size_t *spans, size_t nspan)
{
    if (!m || (unsigned)dtype >= DT_DTYPE_COUNT || (nspan && !spans))
        return dt_error(DT_ERR_INVALID_ARG, "dt__model_keep_only: bad arguments");
    const dt_flat *P = &m->flats[DT_FLAT_PARAMS][dtype];
    for (size_t i = 0; i < nspan; i++)
        if (spans[2 * i] > spans[2 * i + 1] || spans[2 * i + 1] > P->total || (i && spans[2 * i] < spans[2 * i - 1]))
            return dt_error(DT_ERR_INVALID_ARG, "dt__model_keep_only: span %zu [%zu, %zu) is not sorted inside the "
                            "%s flat of %zu elements", i, spans[2 * i], spans[2 * i + 1], dt_dtype_name(dtype),
                            P->total);
    size_t *k = malloc((2 * nspan + 1) * sizeof *k);
    if (!k)
        return dt_error(DT_ERR_NO_MEMORY, "dt__model_keep_only: %zu spans", nspan);
    if (nspan)
        memcpy(k, spans, 2 * nspan * sizeof *k);
    free(m->keep[dtype]);
    m->keep[dtype] = k;
    m->nkeep[dtype] = nspan;
    dt__model_release(m);
    return DT_OK;
}

/* The parameters whose gradient is the model's own view (f32, bf16 or f16;
 * not rebound by a strategy to memory of its own): the ones a lazy zero may
 * mark. */
static bool lazy_ok(const dt__entry *e)
{
    const dt_tensor *t = e->info.tensor;
    return !e->info.is_buffer && e->tied < 0 && t && e->grad && t->grad == e->grad && dt_dtype_is_float(e->grad->dtype);
}

void dt_model_zero_grad_lazy(dt_model *m)
{
    for (size_t i = 0; m && i < m->nentry; i++) {
        dt__entry *e = &m->entries[i];
        if (lazy_ok(e))
            e->info.tensor->flags |= DT_TENSOR_GRAD_LAZY;
        else if (!e->info.is_buffer && e->tied < 0 && e->grad)
            dt_tensor_zero(e->grad);
    }
}

void dt_model_grads_materialize(dt_model *m)
{
    for (size_t i = 0; m && i < m->nentry; i++) {
        dt_tensor *t = m->entries[i].info.tensor;
        if (t && (t->flags & DT_TENSOR_GRAD_LAZY)) {
            t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
            if (t->grad)
                dt_tensor_zero(t->grad);
        }
    }
}

dt_status dt_model_add_grad_ready_hook(dt_model *m, dt_grad_ready_fn fn, void *ud, dt_hook_id *id)
{
    if (!m || !fn)
        return dt_error(DT_ERR_NULL, "dt_model_add_grad_ready_hook: %s is NULL", m ? "fn" : "model");
    return dt__hooks_add(&m->ready, (void (*)(void))fn, ud, &m->next_hook_id, id);
}

dt_status dt_model_remove_hook(dt_model *m, dt_hook_id id)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_model_remove_hook: model is NULL");
    if (!dt__hooks_remove(&m->ready, id))
        return dt_error(DT_ERR_NOT_FOUND, "dt_model_remove_hook: no grad-ready hook %llu", (unsigned long long)id);
    return DT_OK;
}
