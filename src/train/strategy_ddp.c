/* The "ddp" strategy: DistributedDataParallel (parallel.h) at the
 * trainer's fixed points. attach wraps the model (dt_ddp_init); each
 * micro-batch but the step's last runs under no_sync (local accumulation);
 * the forward is dt_ddp_forward (buffer broadcast, the iteration's tape
 * mark); wait is dt_ddp_wait; metrics are summed over the group. Every rank
 * owns the whole flat buffer and steps it (replicated optimizer). */
#include "train/train_impl.h"

#include <string.h>

typedef struct {
    dt_pg *pg;
    dt_ddp_params p;
    dt_ddp *ddp;
} ddp_strategy;

static dt_status s_attach(void *self, dt_model *m)
{
    ddp_strategy *s = self;
    dt_model_set_rank(m, dt_pg_rank(s->pg));
    return dt_ddp_init(s->pg, m, &s->p, &s->ddp);
}

/* The policy's reduce dtype becomes the all-reduce's (before attach). */
static dt_status s_set_precision(void *self, const dt_precision_policy *p)
{
    ddp_strategy *s = self;
    dt_dtype rd = dt_precision_reduce_dtype(p);
    if (rd != DT_DTYPE_UNSET)
        s->p.reduce_dtype = rd;
    return DT_OK;
}

static dt_status s_begin_micro(void *self, bool sync)
{
    ddp_strategy *s = self;
    dt_ddp_set_no_sync(s->ddp, !sync);
    return DT_OK;
}

static dt_tensor *s_forward(void *self, dt_ctx *ctx, dt_model *m, dt_tensor *x)
{
    (void)m;
    return dt_ddp_forward(ctx, ((ddp_strategy *)self)->ddp, x);
}

static dt_status s_wait(void *self) { return dt_ddp_wait(((ddp_strategy *)self)->ddp); }

static dt_status s_allreduce_sum(void *self, double *v, int n)
{
    return dt_metrics_allreduce(((ddp_strategy *)self)->pg, v, n, DT_REDUCE_SUM);
}

static dt_status s_sync_buffers(void *self) { return dt_ddp_sync_buffers(((ddp_strategy *)self)->ddp); }

static int s_rank(void *self) { return dt_pg_rank(((ddp_strategy *)self)->pg); }

static int s_world(void *self) { return dt_pg_size(((ddp_strategy *)self)->pg); }

/* A PowerSGD hook's state rides in checkpoints. */
static dt_powersgd *s_compress_state(void *self, dt_pg **group, dt_reducer **buckets)
{
    ddp_strategy *s = self;
    *group = s->ddp ? dt_ddp_pg(s->ddp) : NULL;
    *buckets = s->ddp ? dt_ddp_reducer(s->ddp) : NULL;
    return s->ddp ? dt_ddp_powersgd(s->ddp) : NULL;
}

static void s_free(void *self)
{
    ddp_strategy *s = self;
    dt_ddp_free(s->ddp);
    dt_free(s);
}

static const dt_strategy_ops k_ddp_ops = {
    .version = DT_STRATEGY_OPS_VERSION,
    .name = "ddp",
    .attach = s_attach,
    .begin_micro = s_begin_micro,
    .forward = s_forward,
    .wait = s_wait,
    .allreduce_sum = s_allreduce_sum,
    .owned_range = NULL, /* replicated: every rank steps everything */
    .optim_ranges = NULL,
    .shard_sum = NULL,
    .memory = NULL,
    .after_step = NULL,
    .sync_buffers = s_sync_buffers,
    .rank = s_rank,
    .world = s_world,
    .free = s_free,
    .set_precision = s_set_precision,
    .forward_backward = NULL,
    .compress_state = s_compress_state,
};

dt_status dt_strategy_ddp_init(dt_pg *pg, const dt_ddp_params *p, dt_strategy **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_strategy_ddp_init: out is NULL");
    *out = NULL;
    if (!pg)
        return dt_error(DT_ERR_NULL, "dt_strategy_ddp_init: process group is NULL");
    ddp_strategy *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_strategy_ddp_init");
    s->pg = pg;
    s->p = p ? *p : dt_ddp_params_default();
    dt_status st = dt_strategy_init(&k_ddp_ops, s, out);
    if (st < 0)
        dt_free(s);
    return st;
}

dt_ddp *dt__strategy_ddp_handle(const dt_strategy *s)
{
    return s->ops.attach == s_attach ? ((ddp_strategy *)s->self)->ddp : NULL;
}
