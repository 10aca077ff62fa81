/* Replicate -> Partial(op), no communication. sum: coordinate 0 keeps the
 * value and the others hold zeros (Paddle's r_to_p: exact, also for
 * integers, where DTensor's value / k is not); avg, max, min: every
 * coordinate keeps the value. Backward (reshard.c): the identity. */
#include "dtensor_impl.h"

#include <string.h>

dt_status dt__reshard_r_to_p(const dt__rs_step *s)
{
    size_t bytes = (size_t)dt__numel(s->in_shape, s->ndim) * dt_dtype_size(s->dtype);
    if (s->to.op == DT_REDUCE_SUM && s->coord != 0)
        memset(s->out, 0, bytes);
    else if (s->out != s->in)
        memcpy(s->out, s->in, bytes);
    return DT_OK;
}
