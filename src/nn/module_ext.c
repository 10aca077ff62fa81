/* Module constructors and setters beyond the built-in kinds: custom modules
 * that own their configuration, per-parameter init, and RMSNorm (a custom
 * module over dt_rms_norm, so the models of the zoo build on it through
 * the public API), and a model's pipeline units function. */
#include "nn_impl.h"

#include <stdlib.h>
#include <string.h>

dt_module *dt_nn_custom_owned(const char *type, int nparams, const dt_nn_param_spec *params,
                              dt_nn_forward_fn forward, void *ud, void (*free_ud)(void *))
{
    dt_module *m = dt_nn_custom(type, nparams, params, forward, ud);
    if (!m) {
        if (free_ud)
            free_ud(ud);
        return NULL;
    }
    m->ud_free = free_ud;
    return m;
}

static dt_tensor *rmsnorm_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    return dt_rms_norm(ctx, x, dt_module_param(self, 0), self->eps);
}

dt_module *dt_nn_rmsnorm(int64_t dim, float eps)
{
    if (dim < 1 || !(eps > 0.0f)) {
        dt_error(DT_ERR_INVALID_ARG, "dt_nn_rmsnorm: dim %lld and eps %g must be > 0", (long long)dim, (double)eps);
        return NULL;
    }
    dt_nn_param_spec s = {.name = "weight", .ndim = 1, .shape = {dim}, .init = DT_NN_INIT_ONES};
    dt_module *m = dt_nn_custom("RMSNorm", 1, &s, rmsnorm_forward, NULL);
    if (m) {
        m->eps = eps;
        m->in = dim;
    }
    return m;
}

dt_status dt_model_set_pipe_units(dt_model *m, dt_model_units_fn fn)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_model_set_pipe_units: the model is NULL");
    m->pipe_units = fn;
    return DT_OK;
}

dt_model_units_fn dt_model_get_pipe_units(const dt_model *m) { return m ? m->pipe_units : NULL; }
