/* Module constructors and setters beyond the built-in kinds: custom modules
 * that own their configuration, per-parameter init, and RMSNorm (a custom
 * module over dt_rms_norm, so the models of the zoo build on it through
 * the public API). */
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

void *dt_module_user_data(const dt_module *m) { return m && m->kind == DT_NN_CUSTOM ? m->ud : NULL; }

dt_status dt_module_set_init(dt_module *m, const char *param, dt_nn_init init, float a)
{
    if (!m || !param)
        return dt_error(DT_ERR_NULL, "dt_module_set_init: %s is NULL", m ? "param" : "module");
    if (m->model)
        return dt_error(DT_ERR_STATE, "dt_module_set_init: the module is built already (set inits before "
                        "dt_model_build)");
    for (int i = 0; i < m->nparam; i++)
        if (m->specs[i].name && !strcmp(m->specs[i].name, param)) {
            m->specs[i].init = init;
            m->specs[i].a = a;
            return DT_OK;
        }
    return dt_error(DT_ERR_NOT_FOUND, "dt_module_set_init: module of type '%s' has no parameter '%s'",
                    dt_module_type(m), param);
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
