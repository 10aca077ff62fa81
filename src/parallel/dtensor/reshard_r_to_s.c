/* Replicate -> Shard(d): keep this coordinate's torch.chunk slice of dim d.
 * No communication. Backward (reshard.c): the gradient's S -> R, an
 * all-gather. */
#include "dtensor_impl.h"

dt_status dt__reshard_r_to_s(const dt__rs_step *s)
{
    int d = s->to.dim;
    int64_t start, len, zero[DT_MAX_DIMS] = {0}, off[DT_MAX_DIMS] = {0};
    dt_chunk_range(s->gshape[d], s->k, s->coord, &start, &len);
    off[d] = start;
    dt__copy_box(s->out, s->out_shape, zero, s->in, s->in_shape, off, s->out_shape, s->ndim,
                 s->dtype);
    return DT_OK;
}
