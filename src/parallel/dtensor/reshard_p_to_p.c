/* Partial(a) -> Partial(b): the same op is nothing to do; a different one
 * goes through Replicate (all-reduce(a), then R -> P(b)) instead of the
 * silent relabel that PyTorch DTensor does (a quirk, not followed). */
#include "dtensor_impl.h"

dt_status dt__reshard_p_to_p(const dt__rs_step *s)
{
    if (s->from.op == s->to.op)
        return dt__reshard_same(s);
    dt_status st = dt__reshard_p_to_r(s);
    if (st < 0)
        return st;
    dt__rs_step t = *s;
    t.in = s->out;
    t.in_shape = s->out_shape;
    return dt__reshard_r_to_p(&t);
}
