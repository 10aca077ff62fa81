/* The model zoo: constructors by name, and model descriptors (input and
 * target shapes, loss, FLOPs) that `dtrain train` and `dtrain bench step`
 * use. The descriptor is plain data beside the model, not part of it. */
#include "zoo.h"
#include <dtrain/kernels.h>
#include <dtrain/tp.h>

#include <stdio.h>
#include <string.h>

dt_model_config dt_model_config_default(void)
{
    dt_model_config c = {.num_classes = 10, .mlp_seq = 128, .mlp_dim = 1024, .mlp_hidden = 4096,
                         .n_layer = 0, .n_head = 0, .n_embd = 0, .block_size = 0, .vocab_size = 0, .seq = 0,
                         .dropout = 0.0f, .build = dt_model_build_params_default(),
                         .cp = dt_cp_params_default()};
    return c;
}

static const char *const g_names[] = {"convnet", "mlp", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl",
                                      "gpt-mini", "gpt-micro", "llama-tiny", "llama-100m", NULL};

const char *const *dt_model_zoo_names(void) { return g_names; }

dt_status dt_model_create(const char *name, uint64_t seed, const dt_model_config *cfg, dt_model **model,
                          dt_model_desc *desc)
{
    if (!model)
        return dt_error(DT_ERR_NULL, "dt_model_create: model is NULL");
    *model = NULL;
    dt_model_config c = cfg ? *cfg : dt_model_config_default();
    dt_model_desc d;
    memset(&d, 0, sizeof d);
    dt_status st;
    if (name && !strcmp(name, "convnet") && c.tp && dt_pg_size(c.tp) > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "model 'convnet' has no tensor-parallel form (mlp and the GPT-2 models "
                        "have)");
    const bool cp = c.cp.group && dt_pg_size(c.cp.group) > 1;
    if (cp && (!name || !strcmp(name, "convnet") || !strcmp(name, "mlp")))
        return dt_error(DT_ERR_UNSUPPORTED, "model '%s' has no context-parallel form (it has no sequence to split; "
                        "the GPT-2 and Llama models have)", name ? name : "(null)");
    if (!cp)
        c.cp = dt_cp_params_default();
    if (name && !strcmp(name, "convnet"))
        st = dt__model_convnet(seed, &c, model, &d);
    else if (name && !strcmp(name, "mlp"))
        st = dt__model_mlp(seed, &c, model, &d);
    else if (dt__model_is_gpt2(name))
        st = dt__model_gpt2(name, seed, &c, model, &d);
    else if (name && !strncmp(name, "hf:", 3))
        st = dt__model_hf(name + 3, seed, &c, model, &d);
    else if (dt__model_is_llama(name)) {
        dt_llama_config lc;
        st = dt__llama_config_for(name, &c, &lc);
        if (st >= 0)
            st = dt_llama_create(&lc, seed, &c, model, &d);
    } else
        return dt_error(DT_ERR_NOT_FOUND, "unknown model '%s' (known: convnet, mlp, gpt2, gpt2-medium, gpt2-large, "
                        "gpt2-xl, gpt-mini, gpt-micro, llama-tiny, llama-100m, hf:DIR)", name ? name : "(null)");
    if (st < 0)
        return st;
    /* the initial values: a tensor-parallel model's slices are the single
     * process model's (either generator); torch's stream draws what the
     * build left to it (dt_model_build_params.init) */
    const bool tp = c.tp && dt_pg_size(c.tp) > 1;
    if (!c.build.meta && (tp || c.build.init == DT_INIT_TORCH) &&
        (st = tp ? dt_model_init_tp(*model, name, &c, c.build.init, seed) : dt_model_init_torch(*model, seed)) < 0) {
        dt_model_free(*model);
        *model = NULL;
        return st;
    }
    if (cp) /* the cp ranks of a replica draw its dropout masks */
        dt_model_set_replica_ranks(*model, dt_pg_size(c.cp.group));
    d.tp = tp ? c.tp : NULL;
    d.cp = c.cp;
    snprintf(d.name, sizeof d.name, "%s", name);
    if (desc)
        *desc = d;
    return DT_OK;
}

dt_status dt_model_init_tp(dt_model *m, const char *name, const dt_model_config *cfg, dt_init_rng rng, uint64_t seed)
{
    if (!m || !cfg)
        return dt_error(DT_ERR_NULL, "dt_model_init_tp: %s is NULL", !m ? "model" : "config");
    if (!cfg->tp)
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_init_tp: the config has no tensor-parallel group");
    dt_model_config fc = *cfg;
    fc.tp = NULL;
    fc.cp = dt_cp_params_default(); /* the parameters do not depend on it */
    fc.build.meta = true; /* only the layout: dt_model_init_range draws the values */
    dt_model *full;
    dt_status st = dt_model_create(name, seed, &fc, &full, NULL);
    if (st < 0)
        return dt_error_wrap(st, "dt_model_init_tp: the single-process '%s'", name ? name : "(null)");
    st = dt_model_init_frozen(full, rng, seed); /* frozen parameters (LoRA's base) are copied from full */
    if (st >= 0)
        st = dt_tp_init_from(m, cfg->tp, full, rng, seed);
    dt_model_free(full);
    return st;
}

dt_status dt_model_desc_shapes(const dt_model_desc *d, int64_t batch, int *ndim, int64_t *shape, int *target_ndim,
                               int64_t *target_shape, dt_dtype *target_dtype)
{
    if (!d || !ndim || !shape)
        return dt_error(DT_ERR_NULL, "dt_model_desc_shapes: %s is NULL", !d ? "descriptor" : !ndim ? "ndim" : "shape");
    if (d->input_ndim <= 0 || d->input_ndim >= DT_MAX_DIMS || d->target_ndim < 0 ||
        d->target_ndim >= DT_MAX_DIMS)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_desc_shapes: model '%s' has no usable input shape "
                        "(input_ndim %d, target_ndim %d)", d->name, d->input_ndim, d->target_ndim);
    if (batch < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_desc_shapes: batch %lld (want >= 0)", (long long)batch);
    *ndim = d->input_ndim + 1;
    shape[0] = batch;
    for (int i = 0; i < d->input_ndim; i++)
        shape[i + 1] = d->input_shape[i];
    if (target_ndim)
        *target_ndim = d->has_target ? d->target_ndim + 1 : 0;
    if (target_shape && d->has_target) {
        target_shape[0] = batch;
        for (int i = 0; i < d->target_ndim; i++)
            target_shape[i + 1] = d->target_shape[i];
    }
    if (target_dtype)
        *target_dtype = d->target_dtype;
    return DT_OK;
}

dt_status dt_model_desc_check_dataset(const dt_model_desc *d, const dt_dataset *ds)
{
    if (!d || !ds)
        return dt_error(DT_ERR_NULL, "dt_model_desc_check_dataset: NULL %s", !d ? "descriptor" : "dataset");
    char who[64];
    snprintf(who, sizeof who, "model '%s'", d->name[0] ? d->name : "?");
    dt_status st = dt_dataset_check_input(ds, d->input_dtype, d->input_ndim, d->input_shape, who);
    if (st < 0 || !d->has_target)
        return st;
    const dt_dataset_info *in = dt_dataset_get_info(ds);
    bool same = in->y_dtype == d->target_dtype && in->y_ndim == d->target_ndim;
    for (int i = 0; same && i < d->target_ndim; i++)
        same = in->y_shape[i] == d->target_shape[i];
    if (!same)
        return dt_error(DT_ERR_SHAPE, "%s: targets are %d-dimensional %s, %s wants %d-dimensional %s",
                        dt_dataset_source(ds), in->y_ndim, dt_dtype_name(in->y_dtype), who, d->target_ndim,
                        dt_dtype_name(d->target_dtype));
    return DT_OK;
}

/* A context-parallel language model: output [B, T/P, V] holds the rank's
 * rows; the target [B, T] is the whole sequence. The loss of the target's
 * same rows, taken over the whole sequence (dt_cp_loss: sum and count over
 * the group). */
static dt_tensor *cp_loss(dt_ctx *ctx, const dt_model_desc *d, dt_tensor *output, dt_tensor *target)
{
    dt_cp_layout l;
    if (dt_cp_layout_of(&d->cp, target->shape[1], &l) < 0)
        return NULL;
    dt_tensor *t = dt_cp_local_rows(ctx, &l, target);
    if (!t)
        return NULL;
    int64_t count = 0, n = dt_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        count += dt_tensor_get(t, i) != DT_K_IGNORE_INDEX;
    dt_model_desc local = *d;
    local.cp.group = NULL;
    return dt_cp_loss(ctx, d->cp.group, dt_model_desc_loss(ctx, &local, output, t), count);
}

dt_tensor *dt_model_desc_loss(dt_ctx *ctx, const dt_model_desc *d, dt_tensor *output, dt_tensor *target)
{
    if (!d) {
        dt_error(DT_ERR_NULL, "dt_model_desc_loss: descriptor is NULL");
        return NULL;
    }
    if (!output) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_model_desc_loss: output is NULL");
        return NULL;
    }
    if (d->has_target && !target) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_model_desc_loss (%s): the loss needs a target", d->name);
        return NULL;
    }
    if (d->cp.group && d->loss == DT_LOSS_CROSS_ENTROPY && target && target->ndim == 2 && output->ndim == 3)
        return cp_loss(ctx, d, output, target);
    switch (d->loss) {
    case DT_LOSS_CROSS_ENTROPY:
        if (d->tp) /* the rank's vocabulary columns */
            return dt_tp_vocab_cross_entropy(ctx, d->tp, output, target, d->num_classes);
        if (dt__gpt2_is_hidden(d->lm_head, output)) /* fused_lm_loss: the head in chunks, no logits */
            return dt_linear_cross_entropy(ctx, output, dt_module_param(d->lm_head, 0), target, 0);
        if (output->ndim > 2 && target->ndim == output->ndim - 1) { /* [B, T, V] vs [B, T]: every position */
            output = dt_reshape(ctx, output, 2, (int64_t[]){-1, output->shape[output->ndim - 1]});
            target = dt_reshape(ctx, target, 1, (int64_t[]){-1});
        }
        return dt_cross_entropy(ctx, output, target);
    case DT_LOSS_MEAN: /* a loss: in f32 whatever the output's dtype (precision.h) */
        return dt_mean(ctx, output ? dt_cast(ctx, output, DT_F32) : NULL);
    case DT_LOSS_MSE:
        return dt_mse_loss(ctx, output, target);
    default:
        dt_error(DT_ERR_UNSUPPORTED, "dt_model_desc_loss: model '%s' has no built-in loss", d->name);
        return NULL;
    }
}

dt_tensor *dt_model_desc_loss_fn(void *desc, dt_ctx *ctx, dt_tensor *output, dt_tensor *target)
{
    return dt_model_desc_loss(ctx, desc, output, target);
}

dt_status dt_model_desc_checkpoint(dt_model *m, const dt_model_desc *d, const dt_act_ckpt_params *p, int *count)
{
    if (count)
        *count = 0;
    if (!m || !d)
        return dt_error(DT_ERR_NULL, "dt_model_desc_checkpoint: %s is NULL", m ? "descriptor" : "model");
    if (!d->ckpt_unit[0])
        return dt_error(DT_ERR_UNSUPPORTED, "activation checkpointing: model '%s' names no checkpoint units "
                        "(dt_model_desc.ckpt_unit)", d->name[0] ? d->name : "?");
    return dt_model_checkpoint_type(m, d->ckpt_unit, p, count);
}

/* ---- pipeline units (nn.h, dt_model_set_pipe_units): helpers of the zoo's units functions ---- */

void dt__zoo_unit(dt_pipe_unit *u, const char *name, dt_module *mod, dt_pipe_unit_fn fn, const char *p0,
                  const char *p1)
{
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->module = mod;
    u->fn = fn;
    if (p0)
        snprintf(u->params[0], sizeof u->params[0], "%s", p0);
    if (p1)
        snprintf(u->params[1], sizeof u->params[1], "%s", p1);
}

double dt__zoo_numel(const dt_module *mod, int i)
{
    dt_nn_param_spec sp;
    if (!mod || dt_module_param_spec(mod, i, &sp) != DT_OK)
        return 0;
    double n = 1;
    for (int d = 0; d < sp.ndim; d++)
        n *= (double)sp.shape[d];
    return n;
}

double dt__zoo_weights(const dt_module *parent, const char *name, const char *a, const char *b)
{
    dt_module *c = parent ? dt_module_find_child(parent, name) : NULL;
    return c ? dt__zoo_numel(dt_module_find_child(c, a), 0) + dt__zoo_numel(dt_module_find_child(c, b), 0) : 0;
}
