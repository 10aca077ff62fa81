/* The reshard table: one function per (from, to) placement kind of one mesh
 * dim (Paddle's reshard function registry, as a static table). Same kinds
 * with the same parameters never reach it (the planner skips them), except
 * S(i) -> S(j) and P(a) -> P(b). */
#include "dtensor_impl.h"

#include <string.h>

dt_status dt__reshard_same(const dt__rs_step *s)
{
    if (s->out != s->in)
        memcpy(s->out, s->in, (size_t)dt__numel(s->in_shape, s->ndim) * dt_dtype_size(s->dtype));
    return DT_OK;
}

#define NK 3
_Static_assert(DT_PLACE_PARTIAL + 1 == NK, "reshard table covers every placement kind");

static const struct {
    dt__rs_fn fn;
    const char *name;
} table[NK][NK] = {
    [DT_PLACE_REPLICATE][DT_PLACE_REPLICATE] = {dt__reshard_same, "r_to_r"},
    [DT_PLACE_REPLICATE][DT_PLACE_SHARD] = {dt__reshard_r_to_s, "r_to_s"},
    [DT_PLACE_REPLICATE][DT_PLACE_PARTIAL] = {dt__reshard_r_to_p, "r_to_p"},
    [DT_PLACE_SHARD][DT_PLACE_REPLICATE] = {dt__reshard_s_to_r, "s_to_r"},
    [DT_PLACE_SHARD][DT_PLACE_SHARD] = {dt__reshard_s_to_s, "s_to_s"},
    [DT_PLACE_SHARD][DT_PLACE_PARTIAL] = {dt__reshard_s_to_p, "s_to_p"},
    [DT_PLACE_PARTIAL][DT_PLACE_REPLICATE] = {dt__reshard_p_to_r, "p_to_r"},
    [DT_PLACE_PARTIAL][DT_PLACE_SHARD] = {dt__reshard_p_to_s, "p_to_s"},
    [DT_PLACE_PARTIAL][DT_PLACE_PARTIAL] = {dt__reshard_p_to_p, "p_to_p"},
};

dt__rs_fn dt__reshard_fn(dt_placement_kind from, dt_placement_kind to)
{
    if ((unsigned)from >= NK || (unsigned)to >= NK)
        return NULL;
    return table[from][to].fn;
}

const char *dt__reshard_name(dt_placement_kind from, dt_placement_kind to)
{
    if ((unsigned)from >= NK || (unsigned)to >= NK)
        return "?";
    return table[from][to].name;
}
