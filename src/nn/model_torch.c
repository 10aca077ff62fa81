/* The order of PyTorch's draws for a model (dt_model_set_torch_init): what
 * dt_model_init_torch, dt_model_init_range (DT_INIT_TORCH) and
 * dt_model_init_frozen walk. A PyTorch model's weights after
 * torch.manual_seed(s) depend on every draw its construction makes, dropped
 * ones included: a module's constructor draws its defaults (Embedding
 * N(0, 1), Linear kaiming), then a model like transformers' GPT-2 redraws
 * them in its own init (N(0, 0.02), the residual projections a second
 * time). Without a recipe the stream is the entries' own inits in entry
 * order, which is PyTorch's when the constructors' defaults are the init
 * (the ConvNet). */
#include "nn_impl.h"
#include "dtrain/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool dt__random_init(dt_nn_init init)
{
    return init == DT_NN_INIT_UNIFORM || init == DT_NN_INIT_NORMAL || init == DT_NN_INIT_KAIMING ||
           init == DT_NN_INIT_XAVIER;
}

/* Entries torch's stream can draw for: float, and a parameter or a frozen
 * parameter (which lives with the buffers). */
static bool drawable(const dt__entry *e)
{
    return dt_dtype_is_float(e->info.dtype) && !(e->info.is_buffer && !e->info.frozen);
}

size_t dt__torch_ndraws(const dt_model *md) { return md->torch_draws ? md->ntorch_draws : md->nentry; }

bool dt__torch_draw(const dt_model *md, size_t k, dt_torch_draw *out)
{
    if (md->torch_draws) {
        *out = md->torch_draws[k];
        return true; /* checked when set */
    }
    const dt__entry *e = &md->entries[k];
    const dt_nn_param_spec *s = &e->info.module->specs[e->spec];
    if (!drawable(e) || !dt__random_init(s->init))
        return false;
    *out = (dt_torch_draw){.entry = k, .init = s->init, .a = s->a, .keep = e->tied < 0};
    return true;
}

dt_status dt_model_set_torch_init(dt_model *md, const dt_torch_draw *draws, size_t n)
{
    if (!md || (n && !draws))
        return dt_error(DT_ERR_NULL, "dt_model_set_torch_init: %s is NULL", md ? "draws" : "model");
    bool *kept = calloc(md->nentry ? md->nentry : 1, sizeof *kept);
    if (!kept)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_set_torch_init: out of memory");
    dt_status st = DT_OK;
    for (size_t k = 0; k < n && st == DT_OK; k++) {
        const dt_torch_draw *d = &draws[k];
        if (d->entry >= md->nentry)
            st = dt_error(DT_ERR_INVALID_ARG, "dt_model_set_torch_init: draw %zu names entry %zu of %zu", k,
                          d->entry, md->nentry);
        else if (!drawable(&md->entries[d->entry]) || !dt__random_init(d->init) || !isfinite(d->a))
            st = dt_error(DT_ERR_INVALID_ARG, "dt_model_set_torch_init: draw %zu of '%s': init %d (a %g) on a %s "
                          "entry; torch draws random inits (uniform, normal, kaiming, xavier) into float "
                          "parameters", k, md->entries[d->entry].name, (int)d->init, (double)d->a,
                          drawable(&md->entries[d->entry]) ? "float" : "buffer or non-float");
        else if (d->keep)
            kept[d->entry] = true;
    }
    /* the entries the recipe leaves out draw after it, in entry order, each
     * its own init (LoRA's adapters: PEFT adds them to the built model) */
    size_t extra = 0;
    for (size_t i = 0; i < md->nentry && st == DT_OK && n; i++) {
        const dt__entry *e = &md->entries[i];
        kept[i] = !kept[i] && drawable(e) && e->tied < 0 && dt__random_init(e->info.module->specs[e->spec].init);
        extra += kept[i]; /* kept[i] now: left out */
    }
    dt_torch_draw *copy = NULL;
    if (st == DT_OK && n && !(copy = malloc((n + extra) * sizeof *copy)))
        st = dt_error(DT_ERR_NO_MEMORY, "dt_model_set_torch_init: out of memory for %zu draws", n + extra);
    if (st == DT_OK && n) {
        memcpy(copy, draws, n * sizeof *copy);
        for (size_t i = 0, k = n; i < md->nentry; i++) {
            const dt_nn_param_spec *sp = &md->entries[i].info.module->specs[md->entries[i].spec];
            if (kept[i])
                copy[k++] = (dt_torch_draw){.entry = i, .init = sp->init, .a = sp->a, .keep = true};
        }
    }
    free(kept);
    if (st < 0)
        return st;
    free(md->torch_draws);
    md->torch_draws = copy;
    md->ntorch_draws = n ? n + extra : 0;
    return DT_OK;
}
