/* The precision policy (train.h): FSDP's MixedPrecision fields plus apex
 * O2's keep_batchnorm_fp32 and a per-module f32 override, and the rules
 * that resolve them (reduce inherits param, overrides by path prefix). */
#include "dtrain/precision.h"
#include "dtrain/train.h"

#include <string.h>

dt_precision_policy dt_precision_policy_default(void)
{
    dt_precision_policy p;
    memset(&p, 0, sizeof p);
    p.param_dtype = DT_DTYPE_UNSET;
    p.reduce_dtype = DT_DTYPE_UNSET;
    p.buffer_dtype = DT_DTYPE_UNSET;
    p.keep_batchnorm_fp32 = true;
    p.f32_modules = NULL;
    return p;
}

dt_status dt_precision_policy_parse(const char *name, dt_precision_policy *out)
{
    if (!name || !out)
        return dt_error(DT_ERR_NULL, "dt_precision_policy_parse: NULL argument");
    dt_precision_policy p = dt_precision_policy_default();
    if (!strcmp(name, "auto"))
        name = dt_precision_auto(NULL) == DT_BF16 ? "bf16" : "fp32";
    if (!strcmp(name, "fp32") || !strcmp(name, "f32"))
        p.param_dtype = DT_F32;
    else if (!strcmp(name, "bf16"))
        p.param_dtype = DT_BF16;
    else if (!strcmp(name, "fp16") || !strcmp(name, "f16"))
        p.param_dtype = DT_F16;
    else
        return dt_error(DT_ERR_INVALID_ARG, "unknown precision '%s' (fp32, bf16, fp16, auto)", name);
    p.reduce_dtype = p.param_dtype;
    p.buffer_dtype = DT_F32;
    *out = p;
    return DT_OK;
}

static bool ok_dtype(dt_dtype t) { return t == DT_DTYPE_UNSET || t == DT_F32 || t == DT_BF16 || t == DT_F16; }

dt_status dt_precision_policy_check(const dt_precision_policy *p)
{
    if (!p)
        return dt_error(DT_ERR_NULL, "precision policy is NULL");
    const dt_dtype v[3] = {p->param_dtype, p->reduce_dtype, p->buffer_dtype};
    static const char *const names[3] = {"param_dtype", "reduce_dtype", "buffer_dtype"};
    for (int i = 0; i < 3; i++)
        if (!ok_dtype(v[i]))
            return dt_error(DT_ERR_INVALID_ARG, "precision policy: %s is %s (f32, bf16, f16 or unset)", names[i],
                            dt_dtype_name(v[i]));
    return DT_OK;
}

dt_dtype dt_precision_reduce_dtype(const dt_precision_policy *p)
{
    if (!p)
        return DT_DTYPE_UNSET;
    return p->reduce_dtype != DT_DTYPE_UNSET ? p->reduce_dtype : p->param_dtype;
}

dt_dtype dt_precision_param_dtype(const dt_precision_policy *p, const char *path, bool is_batchnorm)
{
    if (!p || p->param_dtype == DT_DTYPE_UNSET)
        return DT_F32;
    if (is_batchnorm && p->keep_batchnorm_fp32)
        return DT_F32;
    for (const char *const *m = p->f32_modules; m && *m; m++)
        if (dt_module_path_within(path ? path : "", *m))
            return DT_F32;
    return p->param_dtype;
}

dt_status dt_precision_policy_build_params(const dt_precision_policy *p, dt_model_build_params *b)
{
    if (!p || !b)
        return dt_error(DT_ERR_NULL, "dt_precision_policy_build_params: NULL argument");
    dt_status st = dt_precision_policy_check(p);
    if (st < 0)
        return st;
    b->param_dtype = p->param_dtype == DT_DTYPE_UNSET ? DT_F32 : p->param_dtype;
    b->keep_batchnorm_fp32 = p->keep_batchnorm_fp32;
    b->buffer_dtype = p->buffer_dtype == DT_DTYPE_UNSET ? DT_F32 : p->buffer_dtype;
    b->f32_modules = p->f32_modules;
    return DT_OK;
}
