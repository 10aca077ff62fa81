/* Shard(d) -> Partial(op): all-gather to Replicate, then R -> P (DTensor
 * refuses this in forward; Paddle's s_to_p does the same two steps). */
#include "dtensor_impl.h"

dt_status dt__reshard_s_to_p(const dt__rs_step *s)
{
    dt_status st = dt__reshard_s_to_r(s);
    if (st < 0)
        return st;
    dt__rs_step t = *s;
    t.in = s->out;
    t.in_shape = s->out_shape;
    return dt__reshard_r_to_p(&t);
}
