/* The strategy handle: a copied vtable plus its state, and the "none"
 * strategy (one process: every slot left to the trainer's defaults). */
#include "train/train_impl.h"

#include <string.h>

dt_status dt_strategy_init(const dt_strategy_ops *ops, void *self, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_init: out is NULL");
    *out = NULL;
    if (!ops)
        return dt_error(DT_ERR_NULL, "dt_strategy_init: ops is NULL");
    if (ops->version != DT_STRATEGY_OPS_VERSION)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_strategy_init: strategy '%s' has ops version %d, this library %d",
                        ops->name ? ops->name : "?", ops->version, DT_STRATEGY_OPS_VERSION);
    if (!ops->attach || !ops->name)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_init: a strategy needs a name and an attach slot");
    dt_strategy *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_init");
    s->ops = *ops;
    s->self = self;
    *out = s;
    return DT_OK;
}

void dt_strategy_free(dt_strategy *s)
{
    if (!s)
        return;
    if (s->ops.free)
        s->ops.free(s->self);
    dt_free(s);
}

const char *dt_strategy_name(const dt_strategy *s) { return s ? s->ops.name : ""; }

dt_ddp *dt_strategy_ddp(const dt_strategy *s) { return s ? dt__strategy_ddp_handle(s) : NULL; }

static dt_status none_attach(void *self, dt_model *m)
{
    (void)self;
    (void)m;
    return DT_OK;
}

dt_status dt_strategy_none_init(dt_strategy **out)
{
    static const dt_strategy_ops ops = {
        .version = DT_STRATEGY_OPS_VERSION,
        .name = "none",
        .attach = none_attach,
        .begin_micro = NULL,
        .forward = NULL,
        .wait = NULL,
        .allreduce_sum = NULL,
        .owned_range = NULL,
        .optim_ranges = NULL,
        .shard_sum = NULL,
        .memory = NULL,
        .after_step = NULL,
        .sync_buffers = NULL,
        .rank = NULL,
        .world = NULL,
        .free = NULL,
        .set_precision = NULL, /* no reduction: any policy */
        .forward_backward = NULL,
    };
    return dt_strategy_init(&ops, NULL, out);
}
