/* The model zoo: constructors by name, and the per-model metadata (input
 * shape, loss, FLOPs) that `dtrain train` and `dtrain bench step` use. */
#include "nn/nn_impl.h"
#include "zoo.h"

#include <stdio.h>
#include <string.h>

dt_model_config dt_model_config_default(void)
{
    dt_model_config c = {.num_classes = 10, .mlp_seq = 128, .mlp_dim = 1024, .mlp_hidden = 4096};
    return c;
}

static const char *const g_names[] = {"convnet", "mlp", NULL};

const char *const *dt_model_zoo_names(void) { return g_names; }

dt_model *dt_model_create(const char *name, uint64_t seed, const dt_model_config *cfg)
{
    dt_model_config c = cfg ? *cfg : dt_model_config_default();
    dt_model *m = NULL;
    if (name && !strcmp(name, "convnet"))
        m = dt__model_convnet(seed, &c);
    else if (name && !strcmp(name, "mlp"))
        m = dt__model_mlp(seed, &c);
    else {
        dt_error(DT_ERR_NOT_FOUND, "unknown model '%s' (known: convnet, mlp)", name ? name : "(null)");
        return NULL;
    }
    if (m)
        snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

const char *dt_model_name(const dt_model *m) { return m ? m->name : ""; }

dt_status dt_model_input_shape(const dt_model *m, int64_t batch, int *ndim, int64_t *shape, int *target_ndim,
                               int64_t *target_shape, dt_dtype *target_dtype)
{
    if (!m || !ndim || !shape)
        return dt_error(DT_ERR_NULL, "dt_model_input_shape: NULL argument");
    if (m->in_ndim == 0)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_input_shape: model '%s' has no known input shape", m->name);
    *ndim = m->in_ndim + 1;
    shape[0] = batch;
    for (int i = 0; i < m->in_ndim; i++)
        shape[i + 1] = m->in_shape[i];
    if (target_ndim)
        *target_ndim = m->target_labels ? 1 : 0;
    if (target_shape && m->target_labels)
        target_shape[0] = batch;
    if (target_dtype)
        *target_dtype = DT_I64;
    return DT_OK;
}

dt_tensor *dt_model_loss(dt_ctx *ctx, dt_model *m, dt_tensor *output, dt_tensor *target)
{
    if (!m) {
        dt_error(DT_ERR_NULL, "dt_model_loss: model is NULL");
        return NULL;
    }
    if (!output) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_model_loss: output is NULL");
        return NULL;
    }
    switch (m->loss) {
    case DT__LOSS_CE:
        if (!target) {
            dt_error(DT_ERR_NULL, "dt_model_loss (%s): cross-entropy needs the labels", m->name);
            return NULL;
        }
        return dt_cross_entropy(ctx, output, target);
    case DT__LOSS_MEAN:
        return dt_mean(ctx, output);
    default:
        dt_error(DT_ERR_UNSUPPORTED, "dt_model_loss: model '%s' has no built-in loss", m->name);
        return NULL;
    }
}

double dt_model_flops(const dt_model *m, int64_t batch, double *train_step_flops)
{
    if (train_step_flops)
        *train_step_flops = m ? m->train_flops_per_sample * (double)batch : 0;
    return m ? m->fwd_flops_per_sample * (double)batch : 0;
}
