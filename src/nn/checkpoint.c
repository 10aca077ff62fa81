/* Activation checkpointing of modules (torch.utils.checkpoint on a module's
 * forward; DeepSpeed's activation_checkpointing options).
 *
 * A checkpointed module runs its body through dt_ag_checkpoint: forward in
 * no-grad mode (only its input is kept), the body re-run in backward. The
 * module's own hooks stay outside the region and fire once, as with
 * PyTorch's checkpoint_wrapper inside an FSDP unit; children's hooks fire
 * again during the recomputation.
 *
 * RNG: dropout masks are Philox keyed by (seed, module, forward count), so
 * "preserving the RNG state" means the recomputation must see the forward
 * counts the first run saw. At the first run the region stashes the count
 * of every module in its subtree; the recomputation sets them back, runs,
 * and restores the counts the rest of the model has reached since (PyTorch's
 * fork_rng: the surrounding stream is left untouched). */
#include "nn/nn_impl.h"
#include "dtrain/trace.h"

#include <stdlib.h>
#include <string.h>

typedef struct dt__ckpt {
    dt_act_ckpt_params p;
    double fwd_s, recompute_s; /* profile */
    uint64_t regions;
} dt__ckpt;

/* One run of a region (arena memory, lives until the context reset). */
typedef struct {
    dt_module *m;
    int n;               /* modules in m's subtree (pre-order, contiguous in model->modules) */
    uint64_t *counts;    /* their fwd_count at the first run */
    bool ran;
} region;

dt_act_ckpt_params dt_act_ckpt_params_default(void)
{
    dt_act_ckpt_params p = {.number_checkpoints = 0, .partition_activations = false, .cpu_checkpointing = false,
                            .contiguous_memory_optimization = false, .synchronize_checkpoint_boundary = false,
                            .profile = false};
    return p;
}

static int subtree_size(const dt_module *m)
{
    int n = 1;
    for (int i = 0; i < m->nchild; i++)
        n += subtree_size(m->children[i]);
    return n;
}

static dt_tensor *region_fn(dt_ctx *ctx, int nin, dt_tensor **in, void *ud)
{
    (void)nin;
    region *r = ud;
    dt_module **mods = r->m->model->modules + r->m->index;
    double t0 = r->m->ckpt->p.profile ? dt_time_s() : 0;
    dt_tensor *y;
    if (!r->ran) {
        for (int i = 0; i < r->n; i++)
            r->counts[i] = mods[i]->fwd_count;
        r->ran = true;
        y = dt__module_body(ctx, r->m, in[0]);
        if (r->m->ckpt->p.profile)
            r->m->ckpt->fwd_s += dt_time_s() - t0, r->m->ckpt->regions++;
        return y;
    }
    uint64_t *now = dt_ctx_alloc(ctx, (size_t)r->n * sizeof *now);
    if (!now)
        return NULL;
    for (int i = 0; i < r->n; i++) {
        now[i] = mods[i]->fwd_count;
        mods[i]->fwd_count = r->counts[i];
    }
    const double tt = dt_trace_now();
    y = dt__module_body(ctx, r->m, in[0]);
    dt_trace_span(DT_TRACE_RECOMPUTE, r->m->path, tt);
    for (int i = 0; i < r->n; i++)
        mods[i]->fwd_count = now[i];
    if (r->m->ckpt->p.profile)
        r->m->ckpt->recompute_s += dt_time_s() - t0;
    return y;
}

dt_tensor *dt__module_checkpointed(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    region *r = dt_ctx_alloc(ctx, sizeof *r);
    int n = subtree_size(m);
    uint64_t *counts = dt_ctx_alloc(ctx, (size_t)n * sizeof *counts);
    if (!r || !counts)
        return NULL;
    *r = (region){.m = m, .n = n, .counts = counts, .ran = false};
    return dt_ag_checkpoint(ctx, region_fn, 1, &x, r);
}

dt_status dt_module_set_checkpoint(dt_module *m, const dt_act_ckpt_params *p)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_set_checkpoint: module is NULL");
    if (!p) {
        free(m->ckpt);
        m->ckpt = NULL;
        return DT_OK;
    }
    if (p->partition_activations)
        return dt_error(DT_ERR_UNSUPPORTED, "activation checkpointing of '%s': partition_activations needs tensor "
                        "parallelism, which this build does not have", m->path ? m->path : dt_module_type(m));
    if (p->number_checkpoints < 0)
        return dt_error(DT_ERR_INVALID_ARG, "activation checkpointing: number_checkpoints %d is negative",
                        p->number_checkpoints);
    if (!m->model || !m->model->modules)
        return dt_error(DT_ERR_STATE, "dt_module_set_checkpoint: module '%s' is not part of a built model",
                        dt_module_type(m));
    if (!m->ckpt && !(m->ckpt = calloc(1, sizeof *m->ckpt)))
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    m->ckpt->p = *p;
    return DT_OK;
}

dt_status dt_model_checkpoint_fn(dt_model *md, dt_ckpt_check_fn check, void *ud, const dt_act_ckpt_params *p,
                                 int *count)
{
    if (count)
        *count = 0;
    if (!md || !check)
        return dt_error(DT_ERR_NULL, "dt_model_checkpoint_fn: %s is NULL", md ? "check" : "model");
    int limit = p ? p->number_checkpoints : 0, k = 0;
    for (int i = 0; i < md->nmodules; i++) {
        dt_module *m = md->modules[i];
        if (!check(m, ud))
            continue;
        bool on = p && (limit == 0 || k < limit);
        dt_status st = dt_module_set_checkpoint(m, on ? p : NULL);
        if (st < 0)
            return st;
        k += on;
    }
    if (count)
        *count = k;
    return DT_OK;
}

static bool type_is(const dt_module *m, void *ud) { return !strcmp(dt_module_type(m), ud); }

dt_status dt_model_checkpoint_type(dt_model *md, const char *type, const dt_act_ckpt_params *p, int *count)
{
    if (count)
        *count = 0;
    if (!md || !type)
        return dt_error(DT_ERR_NULL, "dt_model_checkpoint_type: %s is NULL", md ? "type" : "model");
    return dt_model_checkpoint_fn(md, type_is, (void *)(uintptr_t)type, p, count);
}

dt_status dt_model_checkpoint_profile(const dt_model *md, double *forward_s, double *recompute_s,
                                      uint64_t *regions)
{
    if (!md)
        return dt_error(DT_ERR_NULL, "dt_model_checkpoint_profile: model is NULL");
    double f = 0, r = 0;
    uint64_t n = 0;
    for (int i = 0; i < md->nmodules; i++) {
        const dt__ckpt *c = md->modules[i]->ckpt;
        if (c)
            f += c->fwd_s, r += c->recompute_s, n += c->regions;
    }
    if (forward_s)
        *forward_s = f;
    if (recompute_s)
        *recompute_s = r;
    if (regions)
        *regions = n;
    return DT_OK;
}
