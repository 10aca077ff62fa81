/* Partial(op) -> Replicate: all-reduce(op) over the mesh dim's line.
 * Backward (reshard.c): the gradient stays Replicate (identity; for avg the
 * piece's gradient is the whole one over k). */
#include "dtensor_impl.h"

dt_status dt__reshard_p_to_r(const dt__rs_step *s)
{
    return dt_pg_allreduce(s->pg, s->in, s->out, (size_t)dt__numel(s->in_shape, s->ndim), s->dtype,
                           s->from.op);
}
