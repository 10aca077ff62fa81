/* The built-in communication hooks by name, and AIAK's variables that
 * choose them. The hooks themselves: allreduce and fp16/bf16 are the
 * reduction engine's own posts (reducer.c: reduce_dtype), PowerSGD is
 * powersgd.c. */
#include "dtrain/parallel.h"

#include <string.h>

static const char *const k_names[] = {"allreduce", "fp16", "bf16", "powersgd"};
_Static_assert(sizeof k_names / sizeof k_names[0] == DT_COMM_HOOK_COUNT, "one name per comm hook");

const char *dt_comm_hook_name(dt_comm_hook_kind k)
{
    return (unsigned)k < DT_COMM_HOOK_COUNT ? k_names[k] : "?";
}

dt_status dt_comm_hook_parse(const char *s, dt_comm_hook_kind *out)
{
    for (int k = 0; s && k < DT_COMM_HOOK_COUNT; k++)
        if (!strcmp(s, k_names[k])) {
            if (out)
                *out = (dt_comm_hook_kind)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "comm hook '%s': expected allreduce, fp16, bf16 or powersgd",
                    s ? s : "(null)");
}

dt_status dt_comm_hook_env(dt_comm_hook_kind *kind, dt_powersgd_params *ps)
{
    if (!kind || !ps)
        return dt_error(DT_ERR_NULL, "dt_comm_hook_env: NULL argument");
    int64_t fp16, psgd, rank, start;
    dt_status st;
    if ((st = dt_env_int("AIAK_FP16_COMPRESSION", 0, 0, 1, &fp16)) < 0 ||
        (st = dt_env_int("AIAK_POWERSGD_COMPRESSION", 0, 0, 1, &psgd)) < 0 ||
        (st = dt_env_int("AIAK_MATRIX_APPROXIMATION_RANK", ps->rank, 1, 1024, &rank)) < 0 ||
        (st = dt_env_int("AIAK_START_COMPRESS_ITER", ps->start_iter, 0, INT64_MAX, &start)) < 0)
        return st;
    if (fp16 && psgd)
        return dt_error(DT_ERR_INVALID_ARG,
                        "AIAK_FP16_COMPRESSION=1 and AIAK_POWERSGD_COMPRESSION=1 are both set: choose one "
                        "gradient compression");
    if (fp16)
        *kind = DT_COMM_HOOK_FP16;
    if (psgd)
        *kind = DT_COMM_HOOK_POWERSGD;
    ps->rank = (int)rank;
    ps->start_iter = start;
    return DT_OK;
}
