/* Optimizer segments from a model's parameter table (nn.h). */
#include "dtrain/nn.h"
#include "dtrain/optim.h"

#include <string.h>

dt_status dt_optim_segments_from_model(const dt_model *m, dt_dtype dtype, bool no_decay_1d, dt_optim_segment *segs, size_t cap,
                                       size_t *n)
{
    if (!m || !n)
        return dt_error(DT_ERR_NULL, "dt_optim_segments_from_model: %s is NULL", m ? "n" : "model");
    size_t k = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        dt_status st = dt_model_entry(m, i, &p);
        if (st < 0)
            return st;
        if (p.is_buffer || p.dtype != dtype || p.tied_to >= 0)
            continue;
        if (segs && k < cap)
            segs[k] = (dt_optim_segment){.offset = p.offset, .numel = p.numel, .no_decay = no_decay_1d && p.ndim <= 1};
        k++;
    }
    *n = k;
    if (k > cap)
        return dt_error(DT_ERR_RANGE, "dt_optim_segments_from_model: %zu segments, room for %zu", k, cap);
    return DT_OK;
}

dt_status dt_optim_kind_parse(const char *s, dt_optim_kind *out)
{
    for (int k = 0; s && k < DT_OPTIM_KIND_COUNT; k++)
        if (!strcmp(s, dt_optim_kind_name((dt_optim_kind)k))) {
            if (out)
                *out = (dt_optim_kind)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown optimizer '%s' (sgd, adam, adamw, lamb)", s ? s : "(null)");
}
