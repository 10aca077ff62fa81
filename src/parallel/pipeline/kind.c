/* Schedule names (pipeline.h dt_pipe_kind_name / dt_pipe_kind_parse), in a
 * file of their own: the config layer parses dtrain.pipeline_schedule with
 * them, and its fuzz target links this file without the schedule builder. */
#include "parallel/pipeline/pipe_impl.h"

#include <string.h>

static const char *const k_kind_names[DT_PIPE_KIND_COUNT] = {"gpipe", "1f1b", "interleaved", "zbh1"};
_Static_assert(DT_PIPE_KIND_COUNT == 4, "a name per schedule");

const char *dt_pipe_kind_name(dt_pipe_kind k)
{
    return (unsigned)k < DT_PIPE_KIND_COUNT ? k_kind_names[k] : "custom";
}

dt_status dt_pipe_kind_parse(const char *s, dt_pipe_kind *out)
{
    for (int k = 0; s && k < DT_PIPE_KIND_COUNT; k++)
        if (!strcmp(s, k_kind_names[k])) {
            if (out)
                *out = (dt_pipe_kind)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown pipeline schedule '%s' (gpipe, 1f1b, interleaved, zbh1)",
                    s ? s : "(null)");
}
