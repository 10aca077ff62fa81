/* The trainer's step (train.h has the order of operations).
 *
 * Arithmetic is the same as the hand-written loops it replaced (the CLI's,
 * the benchmarks', the DDP tests'): the loss divided by grad_accum only when
 * it is > 1, clipping as dt_clip_grad_norm does it, the fused optimizer pass
 * over the owned range, the learning rate from dt_sched_lr. The one change:
 * the gradients are zeroed inside the optimizer's pass
 * (dt_optim_set_zero_grad), which writes the same zeros the separate
 * zero_grad pass wrote, one pass earlier; a step that does not reach the
 * optimizer (skipped, failed) zeroes them explicitly.
 *
 * Agreement: one all-reduce SUM per step of [stop, non-finite, loss_0 ..
 * loss_{n-1}] over the replicas, after the wait: every rank sees the same
 * mean losses, skips the same overflowed steps and stops after the same
 * step. With one replica nothing is communicated. */
#include "train/train_impl.h"
#include "train/trainer_trace.h"
#include "nn/nn_layer.h"

#include "dtrain/precision.h"
#include "dtrain/tp.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_trainer {
    dt_trainer_params p;
    dt__trainer_trace *trace; /* the timeline's unit hooks; NULL when off */
    double t_trace;           /* the step's start on the timeline (dt_trace_now) */
    dt_model *m;
    dt_strategy *s;
    dt_optim *opt;
    dt_offload_optim *off;   /* NVMe offload: steps opt over the ranges, state in files */
    bool ssteps;             /* the strategy steps the optimizer (optim_setup: ZeRO-3 parameter offload) */
    /* the ranges stepped (rg[0..nrg)): the strategy's (optim_ranges), or
     * one per dtype of trained parameters (f32, bf16, f16): f32 params are
     * stepped in place; bf16/f16 ones through fp32 master weights
     * (masters[k]) with the model's flat as the mirror */
    const dt_optim_range *rg;
    size_t nrg;
    int nrange;
    dt_optim_range ranges[3];
    dt_flat masters[3];
    dt_optim_segment *segs[3];
    bool lowp;               /* some range has low-precision grads */
    bool lazy_grads;         /* zero_grad by marks (dt_model_zero_grad_lazy), see lazy_grads_ok */
    dt__nf_scan nfs;         /* the non-finite check in backward (lazy gradients only) */
    dt_loss_scaler *scaler;  /* NULL: no loss scaling */
    dt_dtype reduce_dtype;   /* the policy's, resolved (reported) */
    const dt_flat *P, *G;    /* the model's params and grads flats of the first range (G follows DDP's swap) */
    dt_ctx *ctx;
    float **gk;              /* the gradient norm's view of each range's f32 gradients (nrg of them) */
    size_t *gn;
    size_t lo, hi;           /* owned range of the flat buffers */
    int rank, world;
    int64_t opt_step;
    dt__trainer_pos pos;     /* where the epoch helper is in the data (checkpoints) */
    void *ckpt;              /* a checkpoint write in flight (trainer_ckpt.c) */
    volatile sig_atomic_t stop_req;
    double *agree;           /* [stop, overflow, non-finite, losses...], capacity 3 + cap_micro */
    double *micro_loss;      /* per micro-batch, mean over replicas */
    int cap_micro;
    /* the step under way (dt_trainer_step or the epoch helper) */
    int nmicro;
    int64_t samples;
    void *bufsave;           /* the buffers before a step that a scaler may skip (running statistics) */
    size_t bufcap;
    dt__fault fault;         /* DT_FAULT_NONFINITE (tests) */
    void *fault_x;           /* the poisoned input copy of the injection */
    bool preparing;           /* dt_trainer_prepare's micro-batch: no fault injected */
    double lr, t_fwd, t_bwd, t0;
    bool cycle_betas;        /* the schedule moves the optimizer's betas (OneCycle's momentum, not with SGD) */
};

dt_trainer_params dt_trainer_params_default(void)
{
    dt_trainer_params p;
    memset(&p, 0, sizeof p);
    p.optimizer = DT_OPTIM_SGD;
    p.sgd = dt_sgd_params_default();
    p.adam = dt_adam_params_default();
    p.adamw = dt_adamw_params_default();
    p.lamb = dt_lamb_params_default();
    p.lion = dt_lion_params_default();
    p.no_decay_1d = false;
    p.sched = dt_sched_params_default();
    p.grad_accum = 1;
    p.clip_grad_norm = 0;
    p.measure_grad_norm = false;
    p.precision = dt_precision_policy_default();
    p.loss_scale = 1.0f;
    p.use_scaler = false;
    p.scaler = dt_loss_scaler_params_default();
    p.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    p.loss_fn = NULL;
    p.loss_ud = NULL;
    p.offload = dt_offload_params_default();
    p.trace = dt_trace_params_default();
    p.same_batch = 1;
    return p;
}

dt_trainer_batch dt_trainer_batch_make(void *x, dt_dtype x_dtype, int x_ndim, const int64_t *x_shape, void *y,
                                       dt_dtype y_dtype, int y_ndim, const int64_t *y_shape)
{
    dt_trainer_batch b;
    memset(&b, 0, sizeof b);
    b.x = x;
    b.x_dtype = x_dtype;
    /* an ndim outside [0, DT_MAX_DIMS] is kept for dt_trainer_step to refuse (it was clamped: 9 dims became
     * the first 8, -1 a batch with no input) */
    b.x_ndim = x_ndim;
    for (int d = 0; d < x_ndim && d < DT_MAX_DIMS && x_shape; d++)
        b.x_shape[d] = x_shape[d];
    b.y = y;
    b.y_dtype = y_dtype;
    b.y_ndim = y_ndim;
    for (int d = 0; d < y_ndim && d < DT_MAX_DIMS && y_shape; d++)
        b.y_shape[d] = y_shape[d];
    return b;
}

/* OneCycle's shape: rates and momenta finite, the momenta betas, counts >= 0 (second_stairs -1: the first's). */
static bool one_cycle_ok(const dt_one_cycle *c)
{
    return isfinite(c->min_ratio) && c->min_ratio >= 0 && c->first_steps >= 0 && c->second_steps >= 0 &&
           c->first_stairs >= 0 && c->second_stairs >= -1 && c->decay_steps >= 0 && isfinite(c->decay_lr_rate) &&
           c->decay_lr_rate >= 0 && c->min_mom >= 0 && c->min_mom < 1 && c->max_mom >= 0 && c->max_mom < 1 &&
           isfinite(c->decay_mom_rate) && c->decay_mom_rate >= 0;
}

double dt_trainer_params_lr(const dt_trainer_params *p)
{
    switch (p->optimizer) {
    case DT_OPTIM_SGD:
        return p->sgd.lr;
    case DT_OPTIM_ADAM:
        return p->adam.lr;
    case DT_OPTIM_ADAMW:
        return p->adamw.lr;
    case DT_OPTIM_LAMB:
        return p->lamb.lr;
    case DT_OPTIM_LION:
        return p->lion.lr;
    default:
        return 0;
    }
}

/* The params struct of the optimizer p names (dt_optim_init's hparams), NULL for an unknown kind. */
static const void *optim_hparams(const dt_trainer_params *p)
{
    switch (p->optimizer) {
    case DT_OPTIM_SGD:
        return &p->sgd;
    case DT_OPTIM_ADAM:
        return &p->adam;
    case DT_OPTIM_ADAMW:
        return &p->adamw;
    case DT_OPTIM_LAMB:
        return &p->lamb;
    case DT_OPTIM_LION:
        return &p->lion;
    default:
        return NULL;
    }
}

/* Segments of the `dtype` parameters clipped to the owned range [lo, hi)
 * (a sharded strategy owns part) into tr->segs[k]; *n gets the count. */
static dt_status range_segments(dt_trainer *tr, int k, dt_dtype dtype, size_t lo, size_t hi, size_t *n)
{
    size_t ne = dt_model_num_entries(tr->m), nseg = 0;
    tr->segs[k] = dt_calloc((ne ? ne : 1) * sizeof *tr->segs[k]);
    if (!tr->segs[k])
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_init: optimizer segments");
    dt_optim_segment *sg = tr->segs[k];
    dt_status st = dt_optim_segments_from_model(tr->m, dtype, tr->p.no_decay_1d, sg, ne ? ne : 1, &nseg);
    if (st < 0)
        return st;
    size_t j = 0;
    for (size_t i = 0; i < nseg; i++) {
        size_t a = sg[i].offset, b = a + sg[i].numel;
        a = a < lo ? lo : a;
        b = b > hi ? hi : b;
        if (a < b)
            sg[j++] = (dt_optim_segment){.offset = a, .numel = b - a, .no_decay = sg[i].no_decay};
    }
    *n = j;
    return DT_OK;
}

/* The ranges: the model's parameter flats of each float dtype; a
 * low-precision one gets fp32 master weights for [lo, hi). */
static dt_status build_ranges(dt_trainer *tr)
{
    static const dt_dtype order[3] = {DT_F32, DT_BF16, DT_F16};
    for (int d = 0; d < 3; d++) {
        const dt_flat *P = dt_model_flat(tr->m, DT_FLAT_PARAMS, order[d]);
        const dt_flat *G = dt_model_flat(tr->m, DT_FLAT_GRADS, order[d]);
        if (!P || P->used == 0)
            continue;
        if (!G || !P->base || !G->base)
            return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: the model has no allocated %s parameters (the "
                                                "trainer steps allocated flats; a meta model needs a sharding "
                                                "strategy)", dt_dtype_name(order[d]));
        int k = tr->nrange;
        if (k == 0) {
            tr->P = P;
            tr->G = G;
            if (tr->hi == SIZE_MAX)
                tr->hi = P->total;
            if (tr->hi > P->total) /* the strategy's owned range is in the first flat's elements */
                return dt_error(DT_ERR_INTERNAL, "dt_trainer_init: strategy '%s' owns [%zu, %zu) of %zu elements",
                                tr->s->ops.name, tr->lo, tr->hi, P->total);
        } else if (tr->lo != 0 || tr->hi != tr->P->total) {
            return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: strategy '%s' owns a part of the %s flat and the "
                                                "model also has %s parameters; a strategy that shards parameters "
                                                "supports one parameter dtype so far",
                            tr->s->ops.name, dt_dtype_name(tr->P->dtype), dt_dtype_name(order[d]));
        }
        const size_t lo = k == 0 ? tr->lo : 0, hi = k == 0 ? tr->hi : P->total;
        size_t nseg = 0;
        dt_status st = range_segments(tr, k, order[d], lo, hi, &nseg);
        if (st < 0)
            return st;
        const dt_flat *params = P, *mirror = NULL;
        if (order[d] != DT_F32) {
            if ((st = dt_optim_master_alloc(P, lo, hi, &tr->masters[k])) < 0)
                return dt_error_wrap(st, "dt_trainer_init: fp32 master weights of the %s parameters",
                                     dt_dtype_name(order[d]));
            params = &tr->masters[k];
            mirror = P;
            tr->lowp = true;
        }
        tr->ranges[k] = (dt_optim_range){.params = params, .grads = G, .mirror = mirror, .lo = lo, .hi = hi,
                                         .segs = tr->segs[k], .nseg = nseg};
        tr->nrange++;
    }
    if (tr->nrange == 0)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: the model has no allocated f32, bf16 or f16 "
                                            "parameters (the trainer steps allocated flats; a meta model needs a "
                                            "sharding strategy)");
    return DT_OK;
}

static dt_status build_optimizer(dt_trainer *tr)
{
    dt_status st;
    /* NVMe offload: the optimizer holds no range (no state in memory); the
     * driver steps it over the ranges with the state in files */
    const bool nvme = tr->p.offload.device == DT_OFFLOAD_NVME;
    if (nvme && (tr->scaler || tr->lowp))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: NVMe offload steps f32 parameters and gradients "
                        "without loss scaling only (mixed precision and loss scaling are not offloaded yet)");
    dt_strategy_optim so = {.kind = tr->p.optimizer, .mixed = tr->lowp, .scaled = tr->scaler != NULL};
    if ((st = dt__strategy_optim_setup(tr->s, &so)) < 0)
        return st;
    tr->ssteps = so.steps;
    const dt_optim_range *rg = nvme ? NULL : tr->rg;
    const size_t nr = nvme ? 0 : tr->nrg;
    if (tr->rank == 0)
        dt_offload_announce(&tr->p.offload);
    const void *hp = optim_hparams(&tr->p);
    if (!hp)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_init: unknown optimizer kind %d", (int)tr->p.optimizer);
    st = dt_optim_init(tr->p.optimizer, hp, rg, nr, &tr->opt);
    if (st < 0)
        return dt_error_wrap(st, "dt_trainer_init: %s", dt_optim_kind_name(tr->p.optimizer));
    dt_optim_set_zero_grad(tr->opt, true);
    if (nvme && (st = dt_offload_optim_init(&tr->p.offload, tr->opt, tr->rg, tr->nrg, &tr->off)) < 0)
        return dt_error_wrap(st, "dt_trainer_init: offload");
    return DT_OK;
}

/* This rank steps every element of the model's flats itself: the strategy
 * gives no ranges of its own (ZeRO, pipeline shares) and the owned range is
 * the whole flat. */
static bool steps_whole_flats(const dt_trainer *tr)
{
    return !tr->s->ops.optim_ranges && tr->P && tr->lo == 0 && tr->hi == tr->P->total;
}

/* Lazy zero_grad (dt_model_zero_grad_lazy): after the optimizer step the
 * gradients are marked zero instead of written, backward's first
 * contribution to each overwrites it (the weight GEMMs run with beta = 0),
 * and after each backward the unreached ones are zero-filled
 * (dt_model_grads_materialize) before anything reads the flat: clipping,
 * the optimizer. Saves the zeros' writes in the optimizer's pass and the
 * GEMMs' reads of the old values. Only where the trainer is the only
 * reader of the gradients between backward and the step: the strategy
 * says so (its grads_private slot: no buckets, shards or pipeline reading
 * them during backward, no tensor parallelism), the whole flats stepped
 * here (f32, and bf16/f16 ones through their masters; no loss scaler, no
 * offload).
 * Elsewhere the optimizer's pass zeroes. */
static bool lazy_grads_ok(const dt_trainer *tr)
{
    return dt__strategy_grads_private(tr->s) && !tr->off && !tr->ssteps && !tr->scaler && steps_whole_flats(tr);
}

static dt_status reserve_micro(dt_trainer *tr, int n)
{
    if (n <= tr->cap_micro)
        return DT_OK;
    int cap = tr->cap_micro ? tr->cap_micro : 4;
    while (cap < n)
        cap *= 2;
    double *a = dt_calloc((size_t)(cap + 3) * sizeof *a), *l = dt_calloc((size_t)cap * sizeof *l);
    if (!a || !l) {
        dt_free(a);
        dt_free(l);
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer: %d micro-batches", n);
    }
    dt_free(tr->agree);
    dt_free(tr->micro_loss);
    tr->agree = a;
    tr->micro_loss = l;
    tr->cap_micro = cap;
    return DT_OK;
}

/* The dtype of the model's first trained flat (f32, bf16, f16 in that order). */
static dt_dtype model_dtype(const dt_model *m)
{
    static const dt_dtype order[3] = {DT_F32, DT_BF16, DT_F16};
    for (int d = 0; d < 3; d++) {
        const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, order[d]);
        if (P && P->used > 0)
            return order[d];
    }
    return DT_F32;
}

/* The model's parameters must be in the policy's dtype: a policy in bf16
 * over a model that holds only f32 parameters would silently train in f32. */
static dt_status check_policy(dt_trainer *tr)
{
    const dt_dtype want = tr->p.precision.param_dtype;
    if (want == DT_DTYPE_UNSET || want == DT_F32)
        return DT_OK;
    for (int k = 0; k < tr->nrange; k++)
        if (tr->ranges[k].mirror && tr->ranges[k].mirror->dtype == want)
            return DT_OK;
    return dt_error(DT_ERR_UNSUPPORTED,
                    "dt_trainer_init: the precision policy computes in %s but the model holds no %s parameters "
                    "(%s only): build the model with its parameters in %s",
                    dt_dtype_name(want), dt_dtype_name(want), dt_dtype_name(tr->P->dtype), dt_dtype_name(want));
}

/* The buffers must be in the policy's buffer_dtype where the model casts
 * them (dt_model_build_params.buffer_dtype; batch norm's stay f32 under
 * keep_batchnorm_fp32, so only a policy without it is checked for a
 * missing cast). */
static dt_status check_buffer_policy(dt_trainer *tr)
{
    const dt_dtype want = tr->p.precision.buffer_dtype;
    if (want == DT_DTYPE_UNSET)
        return DT_OK;
    size_t n[DT_DTYPE_COUNT] = {0};
    static const dt_dtype fl[3] = {DT_F32, DT_BF16, DT_F16};
    for (size_t i = 0; i < dt_model_num_entries(tr->m); i++) { /* frozen parameters (LoRA's base) take param_dtype */
        dt_param_info e;
        if (dt_model_entry(tr->m, i, &e) >= 0 && e.is_buffer && !e.frozen && e.tied_to < 0)
            n[e.dtype] += e.numel;
    }
    for (int d = 0; d < 3; d++)
        if (fl[d] != want && fl[d] != DT_F32 && n[fl[d]])
            goto bad;
    if (want != DT_F32 && !n[want] && n[DT_F32] && !tr->p.precision.keep_batchnorm_fp32)
        goto bad;
    return DT_OK;
bad:
    return dt_error(DT_ERR_UNSUPPORTED,
                    "dt_trainer_init: the precision policy keeps buffers in %s but the model holds them in %s%s%s: "
                    "build the model with buffer_dtype %s",
                    dt_dtype_name(want), n[DT_F32] ? "f32 " : "", n[DT_BF16] ? "bf16 " : "", n[DT_F16] ? "f16" : "",
                    dt_dtype_name(want));
}

/* The loss scaler: params.scaler under use_scaler, a static one for
 * loss_scale != 1, else none. */
static dt_status make_scaler(dt_trainer *tr)
{
    dt_loss_scaler_params sp;
    if (tr->p.use_scaler) {
        sp = tr->p.scaler;
    } else if (tr->p.loss_scale != 1.0f) {
        sp = dt_loss_scaler_params_default();
        sp.loss_scale = tr->p.loss_scale;
    } else {
        return DT_OK;
    }
    dt_status st = dt_loss_scaler_init(&sp, &tr->scaler);
    return st < 0 ? dt_error_wrap(st, "dt_trainer_init") : DT_OK;
}

dt_status dt_trainer_init(dt_model *m, dt_strategy *s, const dt_trainer_params *pp, dt_trainer **out)
{
    dt_status st;
    if (!out) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_NULL, "dt_trainer_init: out is NULL");
    }
    *out = NULL;
    if (!m || !s) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_NULL, "dt_trainer_init: %s is NULL", m ? "strategy" : "model");
    }
    dt_trainer_params p = pp ? *pp : dt_trainer_params_default();
    if ((st = dt_precision_policy_check(&p.precision)) < 0) {
        dt_strategy_free(s);
        return dt_error_wrap(st, "dt_trainer_init");
    }
    if (p.use_scaler && p.loss_scale != 1.0f) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_init: loss_scale %g and use_scaler both set: a static scale "
                                            "is scaler.loss_scale under use_scaler", (double)p.loss_scale);
    }
    if (p.grad_accum < 1 || p.grad_accum > (1 << 20) || !(p.loss_scale > 0) || !isfinite(p.loss_scale) ||
        (unsigned)p.loss > DT_TRAINER_LOSS_MEAN || isnan(p.clip_grad_norm)) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_trainer_init: grad_accum %lld (need 1 to 1048576), loss_scale %g (need > 0, finite), "
                        "loss %d, clip_grad_norm %g (need a number)",
                        (long long)p.grad_accum, (double)p.loss_scale, (int)p.loss, p.clip_grad_norm);
    }
    /* the schedule sets every step's learning rate (base_lr is the optimizer's, checked by its init): an
     * unknown kind was the constant schedule, a NaN or negative min_lr or gamma a NaN or negative rate */
    const dt_sched_params *sp = &p.sched;
    if ((unsigned)sp->kind >= DT_SCHED_KIND_COUNT || (unsigned)sp->warmup > DT_WARMUP_LOG ||
        !(isfinite(sp->min_lr) && sp->min_lr >= 0) || !(isfinite(sp->gamma) && sp->gamma >= 0) ||
        !(isfinite(sp->warmup_start) && sp->warmup_start >= 0) || !(isfinite(sp->min_ratio) && sp->min_ratio >= 0) ||
        !(isfinite(sp->step_rate) && sp->step_rate >= 0) || sp->warmup_steps < 0 || sp->total_steps < 0 ||
        sp->step_size < 0 || sp->lag < 0 || !one_cycle_ok(&sp->cycle)) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_trainer_init: schedule kind %d, warmup kind %d, min_lr %g, gamma %g, warmup_start %g, "
                        "min_ratio %g, step_rate %g, warmup_steps %lld, total_steps %lld, step_size %lld, lag %lld "
                        "(need known kinds, finite rates and ratios >= 0, steps >= 0; OneCycle's: counts >= 0, momenta "
                        "in [0, 1))",
                        (int)sp->kind, (int)sp->warmup, sp->min_lr, sp->gamma, sp->warmup_start, sp->min_ratio,
                        sp->step_rate, (long long)sp->warmup_steps, (long long)sp->total_steps,
                        (long long)sp->step_size, (long long)sp->lag);
    }
    const char *sl = dt_tp_model_slice(m);
    if (sl && !dt_tp_model_group(m) && (p.clip_grad_norm > 0 || p.measure_grad_norm)) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_init: '%s' is a tensor-parallel slice of a module with no "
                        "group (dt_tp_module_set_group): the global gradient norm cannot be taken", sl);
    }
    dt_trainer *tr = dt_calloc(sizeof *tr);
    if (!tr) {
        dt_strategy_free(s);
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_init");
    }
    tr->p = p;
    tr->p.sched.base_lr = dt_trainer_params_lr(&p);
    /* DeepSpeed's OneCycle cycles an optimizer's betas; torch's SGD has none, so it leaves SGD's momentum */
    tr->cycle_betas = p.sched.kind == DT_SCHED_ONE_CYCLE && p.sched.cycle.cycle_momentum && p.optimizer != DT_OPTIM_SGD;
    tr->m = m;
    tr->s = s;
    tr->reduce_dtype = dt_precision_reduce_dtype(&p.precision);
    if ((st = dt__model_claim(m, tr)) < 0 || (st = dt__strategy_attach(s, m, &p.precision, model_dtype(m))) < 0)
        goto fail;
    tr->rank = s->ops.rank ? s->ops.rank(s->self) : 0;
    tr->world = s->ops.world ? s->ops.world(s->self) : 1;
    tr->lo = 0;
    tr->hi = SIZE_MAX; /* default: the whole first flat */
    if (s->ops.optim_ranges) {
        if ((st = s->ops.optim_ranges(s->self, m, p.no_decay_1d, &tr->rg, &tr->nrg)) < 0)
            goto fail;
        for (size_t k = 0; k < tr->nrg; k++)
            tr->lowp |= tr->rg[k].grads && tr->rg[k].grads->dtype != DT_F32;
    } else if (s->ops.owned_range && (st = s->ops.owned_range(s->self, m, &tr->lo, &tr->hi)) < 0) {
        goto fail;
    }
    if (tr->lo > tr->hi) {
        st = dt_error(DT_ERR_INTERNAL, "dt_trainer_init: strategy '%s' owns [%zu, %zu)", s->ops.name, tr->lo, tr->hi);
        goto fail;
    }
    if (s->ops.optim_ranges) { /* the strategy keeps its own buffers (ZeRO) */
        tr->P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
        tr->G = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    } else if ((st = build_ranges(tr)) < 0 || (st = check_policy(tr)) < 0) {
        goto fail;
    } else {
        tr->rg = tr->ranges;
        tr->nrg = (size_t)tr->nrange;
    }
    if ((st = check_buffer_policy(tr)) < 0 || (st = make_scaler(tr)) < 0)
        goto fail;
    tr->gk = dt_calloc((tr->nrg ? tr->nrg : 1) * sizeof *tr->gk);
    tr->gn = dt_calloc((tr->nrg ? tr->nrg : 1) * sizeof *tr->gn);
    if (!tr->gk || !tr->gn) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_trainer_init: %zu ranges", tr->nrg);
        goto fail;
    }
    if ((st = build_optimizer(tr)) < 0 || (st = reserve_micro(tr, (int)p.grad_accum)) < 0)
        goto fail;
    if ((st = dt_ctx_init(NULL, &tr->ctx)) < 0) {
        dt_error_wrap(st, "dt_trainer_init: context");
        goto fail;
    }
    /* a bf16/f16 model runs its forward under autocast in that dtype
     * (precision.h: the f32 input of the first layer is cast; losses in f32) */
    if ((p.precision.param_dtype == DT_BF16 || p.precision.param_dtype == DT_F16) &&
        (st = dt_autocast_set(tr->ctx, p.precision.param_dtype, NULL)) < 0) {
        dt_error_wrap(st, "dt_trainer_init: autocast");
        goto fail;
    }
    if ((st = dt__fault_parse(&tr->fault)) < 0)
        goto fail;
    dt_model_zero_grad(m); /* the optimizer's pass keeps them zeroed from here on (or the marks) */
    tr->lazy_grads = lazy_grads_ok(tr);
    if (tr->lazy_grads) { /* the first step's backward as every later one's: overwriting (beta = 0 GEMMs) */
        dt_optim_set_zero_grad(tr->opt, false);
        dt_model_zero_grad_lazy(m);
        if ((st = dt__nf_scan_init(&tr->nfs, m)) < 0)
            goto fail;
    }
    dt_model_train(m, true);
    /* a strategy that runs its own schedule (a pipeline) numbers the trace
     * by the ranks of its whole group (the one its checkpoints are saved
     * over), not by the replica's rank the trainer has */
    dt_pg *pw = NULL;
    if (s->ops.forward_backward) {
        dt_strategy_ckpt lay = {0};
        if (dt__strategy_ckpt_layout(s, &lay) >= 0)
            pw = lay.save_group;
    }
    if ((st = dt__trainer_trace_init(m, !s->ops.forward_backward, &p.trace, pw ? dt_pg_rank(pw) : tr->rank,
                                     pw ? dt_pg_size(pw) : tr->world, &tr->trace)) < 0)
        goto fail;
    if ((st = dt__trainer_dora_start(tr)) < 0) /* DoRA's magnitudes from the base weights the model starts with */
        goto fail;
    *out = tr;
    return DT_OK;
fail:
    dt_trainer_free(tr);
    return st;
}

void dt_trainer_free(dt_trainer *tr)
{
    if (!tr)
        return;
    dt__trainer_ckpt_free(tr); /* waits for a checkpoint still being written */
    dt__trainer_trace_free(tr->trace, tr->m);
    dt__nf_scan_free(&tr->nfs);
    dt_ctx_free(tr->ctx);
    dt_offload_optim_free(tr->off);
    dt_optim_free(tr->opt);
    for (int k = 0; k < 3; k++) {
        dt_free(tr->segs[k]);
        dt_flat_free(&tr->masters[k]);
    }
    dt_loss_scaler_free(tr->scaler);
    dt_free(tr->agree);
    dt_free(tr->micro_loss);
    free(tr->bufsave);
    free(tr->fault_x);
    dt_strategy_free(tr->s);
    dt__model_unclaim(tr->m, tr);
    dt_free(tr->gk);
    dt_free(tr->gn);
    dt_free(tr);
}

/* Whether the ranks agree each step (losses, overflow, stop, the gradient
 * norm): with more than one replica, and always under a strategy that runs
 * the micro-batches itself (a pipeline of one replica spans ranks too). */
static bool agrees(const dt_trainer *tr) { return tr->world > 1 || tr->s->ops.forward_backward; }

/* The trainer's loss on any context (ud is the trainer). */
static dt_tensor *loss_on(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    dt_trainer *tr = ud;
    if (tr->p.loss_fn)
        return tr->p.loss_fn(tr->p.loss_ud, ctx, out, y);
    switch (tr->p.loss) {
    case DT_TRAINER_LOSS_MSE:
        return dt_mse_loss(ctx, out, y);
    case DT_TRAINER_LOSS_MEAN:
        return dt_mean(ctx, out);
    case DT_TRAINER_LOSS_CROSS_ENTROPY:
    default:
        return dt_cross_entropy(ctx, out, y);
    }
}

dt_tensor *dt__trainer_loss(dt_trainer *tr, dt_tensor *out, dt_tensor *y) { return loss_on(tr, tr->ctx, out, y); }

/* A strategy that runs the micro-batch itself (forward_backward: a pipeline). */
static dt_status strategy_micro(dt_trainer *tr, dt_tensor *x, dt_tensor *y, double *loss)
{
    dt_strategy *s = tr->s;
    float scale = tr->p.grad_accum > 1 ? 1.0f / (float)tr->p.grad_accum : 1.0f;
    if (tr->scaler)
        scale *= (float)dt_loss_scaler_scale(tr->scaler);
    dt_strategy_fb fb = {.x = x, .y = y, .loss = loss_on, .loss_ud = tr, .scale = scale, .loss_value = 0};
    if (!x)
        return dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL;
    dt_status st = s->ops.forward_backward(s->self, tr->ctx, tr->m, &fb);
    *loss = fb.loss_value;
    return st;
}

/* After a failure mid-step: no reduction left in flight, no stale gradients. */
static dt_status abandon(dt_trainer *tr, dt_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    if (tr->s->ops.wait)
        tr->s->ops.wait(tr->s->self);
    dt_model_zero_grad(tr->m);
    dt_ctx_reset(tr->ctx);
    tr->nmicro = 0;
    return dt_error(st, "%s", msg);
}

/* Micro-batch: forward, loss, backward; the loss value is kept. */
dt_status dt__trainer_micro(dt_trainer *tr, const dt_trainer_batch *b, bool sync)
{
    if (!b || !b->x)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_step: micro-batch %d has no input", tr->nmicro);
    if (b->x_ndim < 1 || b->x_ndim > DT_MAX_DIMS || b->y_ndim < 0 || b->y_ndim > DT_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_step: micro-batch %d: x_ndim %d (need 1..%d), y_ndim %d "
                        "(need 0..%d)", tr->nmicro, b->x_ndim, DT_MAX_DIMS, b->y_ndim, DT_MAX_DIMS);
    dt_status st = reserve_micro(tr, tr->nmicro + 1);
    if (st < 0)
        return st;
    if (tr->nmicro == 0) {
        dt_trace_step(tr->opt_step + 1);
        tr->t_trace = dt_trace_now();
        tr->t0 = dt_time_s();
        tr->lr = dt_sched_lr(&tr->p.sched, tr->opt_step);
        if ((st = dt_optim_set_lr(tr->opt, tr->lr)) < 0)
            return st;
        double b1; /* DeepSpeed's OneCycle moves Adam's first beta and holds the second at 0.99 */
        if (tr->cycle_betas && dt_sched_beta1(&tr->p.sched, tr->opt_step, &b1) &&
            dt_optim_set_betas(tr->opt, b1, 0.99) < 0)
            return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_step: OneCycle's momentum for step %lld is %g, not a "
                            "beta in [0, 1) (its decay_mom_rate grows it by %g every %lld steps after the cycle)",
                            (long long)tr->opt_step + 1, b1, tr->p.sched.cycle.decay_mom_rate,
                            (long long)tr->p.sched.cycle.decay_steps);
        tr->samples = 0;
        tr->t_fwd = tr->t_bwd = 0;
        /* a step the scaler skips leaves the buffers (running statistics)
         * as they were: forward updated them from a non-finite batch */
        if (tr->scaler && (st = dt__buffers_snapshot(tr->m, &tr->bufsave, &tr->bufcap)) < 0)
            return st;
    }
    free(tr->fault_x);
    tr->fault_x = NULL;
    const bool inject = !tr->preparing && tr->fault.what != DT__FAULT_NONE && tr->fault.rank == tr->rank &&
                        tr->fault.step == tr->opt_step + 1 && tr->nmicro == 0;
    const dt__fault_what fw = inject ? tr->fault.what : DT__FAULT_NONE;
    dt_strategy *s = tr->s;
    if (s->ops.begin_micro && (st = s->ops.begin_micro(s->self, sync)) < 0)
        return abandon(tr, st);
    double t = dt_time_s(), t_tr = dt_trace_now();
    void *xd = b->x;
    if (fw == DT__FAULT_INPUT) {
        size_t ne = 1;
        for (int d = 0; d < b->x_ndim; d++)
            ne *= (size_t)b->x_shape[d];
        if ((tr->fault_x = dt__fault_input(b->x, b->x_dtype, ne)))
            xd = tr->fault_x;
    }
    if (fw != DT__FAULT_NONE && fw != DT__FAULT_GRAD) /* once */
        tr->fault.what = DT__FAULT_NONE;
    dt_tensor *x = dt_tensor_view_of(tr->ctx, xd, b->x_dtype, b->x_ndim, b->x_shape);
    dt_tensor *y = b->y ? dt_tensor_view_of(tr->ctx, b->y, b->y_dtype, b->y_ndim, b->y_shape) : NULL;
    if (s->ops.forward_backward) {
        double lv = 0;
        if ((st = strategy_micro(tr, x, y, &lv)) < 0)
            return abandon(tr, st);
        tr->micro_loss[tr->nmicro++] = fw == DT__FAULT_LOSS ? NAN : lv;
        tr->samples += b->x_shape[0];
        dt_ctx_reset(tr->ctx);
        tr->t_fwd += dt_time_s() - t; /* forward and backward interleave: all counted as forward */
        return DT_OK;
    }
    dt_tensor *out = !x ? NULL : s->ops.forward ? s->ops.forward(s->self, tr->ctx, tr->m, x)
                                                : dt_model_forward(tr->ctx, tr->m, x);
    dt_tensor *loss = out ? dt__trainer_loss(tr, out, y) : NULL;
    dt_tensor *bl = loss;
    if (bl && tr->p.grad_accum > 1)
        bl = dt_scale(tr->ctx, bl, 1.0f / (float)tr->p.grad_accum);
    if (bl && tr->scaler)
        bl = dt_scale(tr->ctx, bl, (float)dt_loss_scaler_scale(tr->scaler));
    double t1 = dt_time_s(), tb = dt_trace_now();
    dt_trace_span(DT_TRACE_FORWARD, "forward", t_tr);
    if (!bl)
        return abandon(tr, dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL);
    dt__nf_scan_arm(&tr->nfs, sync && !tr->preparing); /* the last micro-batch's gradients are the step's */
    if ((st = dt_backward(tr->ctx, bl)) < 0)
        return abandon(tr, st);
    if (tr->lazy_grads) /* the parameters backward did not reach: zeros in the flat */
        dt_model_grads_materialize(tr->m);
    dt_trace_span(DT_TRACE_BACKWARD, "backward", tb);
    tr->micro_loss[tr->nmicro++] = fw == DT__FAULT_LOSS ? NAN : dt_tensor_item(loss);
    tr->samples += b->x_shape[0];
    dt_ctx_reset(tr->ctx);
    tr->t_fwd += t1 - t;
    tr->t_bwd += dt_time_s() - t1;
    return DT_OK;
}

/* The f32 gradients of range k: the optimizer's (it widens low-precision
 * ones); under NVMe offload (f32 gradients only, the optimizer holds no
 * range) the flat's own. */
static dt_status grads_f32(dt_trainer *tr, size_t k, float **g, size_t *n)
{
    if (!tr->off && !tr->ssteps) /* (parameter offload: f32 only, and the shards are not in memory) */
        return dt_optim_grads_f32(tr->opt, k, g, n);
    const dt_optim_range *r = &tr->rg[k];
    *n = r->hi - r->lo;
    *g = *n ? dt_flat_ptr(r->grads, r->lo) : NULL;
    return DT_OK;
}

/* Wait, unscale and check (one fused pass), agree, clip, step, gather;
 * fill *out. */
/* The step's scalars for the monitor (train.h: dt_trainer_params.monitor):
 * what DeepSpeed's engine writes after its step, lr after its scheduler
 * stepped (the next step's rate). */
static dt_status monitor_step(dt_trainer *tr, const dt_trainer_metrics *r, bool scaled)
{
    dt_monitor *mon = tr->p.monitor;
    const int64_t at = tr->pos.samples;
    dt_status st = DT_OK;
    if (mon && (st = dt_monitor_write(mon, "Train/Samples/train_loss", r->loss, at)) >= 0 &&
        (st = dt_monitor_write(mon, "Train/Samples/lr", dt_trainer_next_lr(tr), at)) >= 0 && scaled)
        st = dt_monitor_write(mon, "Train/Samples/loss_scale", dt_loss_scaler_scale(tr->scaler), at); /* updated */
    if (!mon || st < 0 || !tr->p.wall_clock_breakdown)
        return st;
    const struct {
        const char *tag;
        double s;
    } t[] = {{"Train/Samples/elapsed_time_ms_forward", r->forward_s},
             {"Train/Samples/elapsed_time_ms_backward", r->backward_s + r->wait_s},
             {"Train/Samples/elapsed_time_ms_backward_inner", r->backward_s},
             {"Train/Samples/elapsed_time_ms_backward_allreduce", r->wait_s},
             {"Train/Samples/elapsed_time_ms_step", r->optim_s}};
    for (size_t i = 0; i < sizeof t / sizeof t[0] && st >= 0; i++)
        st = dt_monitor_write(mon, t[i].tag, 1e3 * t[i].s, at);
    return st;
}

dt_status dt__trainer_finish(dt_trainer *tr, dt_trainer_metrics *out)
{
    dt_strategy *s = tr->s;
    const int n = tr->nmicro;
    if (n == 0)
        return dt_error(DT_ERR_STATE, "dt_trainer_step: no micro-batch ran");
    dt_status st;
    double tw = dt_time_s(), to_tr = dt_trace_now();
    if (s->ops.wait && (st = s->ops.wait(s->self)) < 0)
        return abandon(tr, st);
    tw = dt_time_s() - tw;
    const bool scaled = tr->scaler != NULL;
    const bool sharded = s->ops.owned_range || s->ops.optim_ranges;
    const double scale = dt_loss_scaler_scale(tr->scaler);
    bool inf = false;
    /* GradScaler's unscale_: multiply by 1/scale and look for inf/NaN in
     * one pass (low-precision grads are widened into f32 in the same pass;
     * without a scaler that pass is needed only where the norm reads the f32
     * grads: otherwise the optimizer's step widens each piece as it steps) */
    const bool need_norm = tr->p.clip_grad_norm > 0 || tr->p.measure_grad_norm;
    const bool inject = tr->fault.what == DT__FAULT_GRAD && tr->fault.rank == tr->rank &&
                        tr->fault.step == tr->opt_step + 1;
    if (inject) { /* DT_FAULT_NONFINITE: this rank's own gradient, after the reduction (once) */
        dt__fault_grad(tr->rg, tr->nrg);
        tr->fault.what = DT__FAULT_NONE;
    }
    const bool unscale = scaled || (tr->lowp && need_norm);
    if (unscale && (st = dt_optim_unscale_grads(tr->opt, (float)(1.0 / scale), &inf)) < 0)
        return abandon(tr, st);
    /* without a scaler every rank checks its own losses and the gradients
     * it steps (one read pass); the flag rides in the agreement below */
    dt__nonfinite nf = {0};
    /* every gradient seen finite as backward finished it: no read pass */
    const bool seen_finite = dt__nf_scan_clean(&tr->nfs) && !inject && !unscale && !scaled;
    if (!scaled) {
        for (int i = 0; i < n && !nf.loss_micro; i++)
            if (!isfinite(tr->micro_loss[i])) {
                nf.loss_micro = i + 1;
                nf.loss_value = tr->micro_loss[i];
            }
        if (!unscale && !seen_finite)
            nf.grad = dt__grads_nonfinite(tr->rg, tr->nrg, NULL, &nf.range, &nf.index);
        else if (inf) {
            /* the unscale pass read the gradients (no second pass) and,
             * where the optimizer zeroes them, zeroed the low-precision
             * ones after widening: its flag answers, and its f32 copies
             * name the first non-finite one */
            for (size_t k = 0; k < tr->nrg; k++)
                if ((st = dt_optim_grads_f32(tr->opt, k, &tr->gk[k], &tr->gn[k])) < 0)
                    return abandon(tr, st);
            nf.grad = true;
            if (!dt__grads_nonfinite(tr->rg, tr->nrg, tr->gk, &nf.range, &nf.index))
                nf.range = 0, nf.index = 0; /* (not reached: the pass reads the same pieces) */
        }
    }
    double *v = tr->agree;
    v[0] = tr->stop_req ? 1.0 : 0.0;
    v[1] = scaled && inf ? 1.0 : 0.0;
    v[2] = nf.loss_micro || nf.grad ? 1.0 : 0.0;
    for (int i = 0; i < n; i++)
        v[3 + i] = tr->micro_loss[i];
    if (agrees(tr) && s->ops.allreduce_sum && (st = s->ops.allreduce_sum(s->self, v, n + 3)) < 0)
        return abandon(tr, dt_error_wrap(st, "dt_trainer_step: agreeing on losses, overflow and stopping"));
    /* an overflow (or a non-finite value) in one rank's part of a replica
     * (tensor parallel: its slice) skips (stops) the step on all */
    if ((st = dt__strategy_agree_flags(s, &v[1], 2)) < 0)
        return abandon(tr, dt_error_wrap(st, "dt_trainer_step"));
    if (v[2] > 0) { /* every rank stops here, after the same step */
        const int64_t step = tr->opt_step + 1;
        tr->nmicro = 0;
        st = dt__trainer_nonfinite_error(tr, &nf, step, n);
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_model_zero_grad(tr->m);
        return dt_error(st, "%s", msg);
    }
    double lsum = 0;
    for (int i = 0; i < n; i++) {
        tr->micro_loss[i] = tr->world > 1 ? v[3 + i] / tr->world : v[3 + i];
        lsum += tr->micro_loss[i];
    }
    dt_trainer_metrics r;
    memset(&r, 0, sizeof r);
    r.step = tr->opt_step;
    r.loss = lsum / n;
    r.micro_loss = tr->micro_loss;
    r.nmicro = n;
    r.lr = tr->lr;
    r.grad_norm = NAN;
    r.samples = tr->samples * tr->world / (tr->p.same_batch > 1 ? tr->p.same_batch : 1);
    r.stop = v[0] > 0;
    r.skipped = v[1] > 0;
    r.loss_scale = scale;
    r.forward_s = tr->t_fwd;
    r.backward_s = tr->t_bwd;
    r.wait_s = tw;
    r.grads_checked_in_backward = seen_finite;
    tr->nmicro = 0;
    double to = dt_time_s();
    if (r.skipped) {
        /* an overflowed step changes nothing: parameters, optimizer state and
         * step count, schedule (DeepSpeed: the LR scheduler is not stepped),
         * buffers (the running statistics its forward wrote) */
        dt_model_zero_grad(tr->m);
        dt__buffers_restore(tr->m, tr->bufsave);
    } else {
        if (tr->p.clip_grad_norm > 0 || tr->p.measure_grad_norm) {
            /* the global norm: the strategy sums the squares of the owned ranges */
            double sq = 0;
            for (size_t k = 0; k < tr->nrg; k++)
                if ((st = grads_f32(tr, k, &tr->gk[k], &tr->gn[k])) < 0)
                    return abandon(tr, st);
            const dt_strategy_grads sg = {.m = tr->m, .rg = tr->rg, .nrg = tr->nrg, .g = tr->gk, .n = tr->gn,
                                          .sharded = sharded, .agree = agrees(tr)};
            if ((st = dt__strategy_grad_sqnorm(s, &sg, &sq)) < 0)
                return abandon(tr, dt_error_wrap(st, "dt_trainer_step: the global gradient norm"));
            float norm = (float)sqrt(sq);
            r.grad_norm = norm;
            for (size_t k = 0; k < tr->nrg && tr->p.clip_grad_norm > 0; k++) {
                float *g;
                size_t ng;
                if ((st = grads_f32(tr, k, &g, &ng)) < 0)
                    return abandon(tr, st);
                dt_grad_clip_apply(g, ng, norm, (float)tr->p.clip_grad_norm);
            }
        }
        if ((st = dt__strategy_optim_step(s, tr->ssteps, tr->opt, tr->off)) < 0)
            return abandon(tr, st);
        if (tr->lazy_grads)
            dt_model_zero_grad_lazy(tr->m);
        if (s->ops.after_step && (st = s->ops.after_step(s->self)) < 0)
            return abandon(tr, dt_error_wrap(st, "dt_trainer_step: strategy '%s' after the step", s->ops.name));
        tr->opt_step++;
    }
    if (scaled) {
        /* every rank updates with the same agreed flag: the scales stay equal */
        st = dt_loss_scaler_update(tr->scaler, r.skipped);
        dt_loss_scaler_state ls;
        dt_loss_scaler_get_state(tr->scaler, &ls);
        r.skipped_steps = ls.skipped;
        if (st < 0)
            return dt_error_wrap(st, "dt_trainer_step: optimizer step %lld", (long long)tr->opt_step + 1);
    }
    r.optim_s = dt_time_s() - to;
    r.step_s = dt_time_s() - tr->t0;
    dt_trace_span(DT_TRACE_OPTIM, "optimizer", to_tr);
    dt__trainer_trace_counters(tr->scaler);
    dt_trace_span(DT_TRACE_STEP, "step", tr->t_trace);
    tr->pos.samples += r.samples; /* DeepSpeed's global_samples: skipped steps count too */
    if (out)
        *out = r;
    return monitor_step(tr, &r, scaled);
}

/* dt_trainer_prepare (trainer_prepare.c): whether its micro-batch can run
 * here without a trace, and running it then dropping what it left. */
bool dt__trainer_can_prepare(const dt_trainer *tr)
{
    dt_pg *tp = dt_tp_model_group(tr->m); /* a tensor-parallel model: the strategy reduces over its group */
    return !tr->s->ops.forward_backward && !tr->s->ops.optim_ranges && !tr->s->ops.owned_range &&
           !(tp && dt_pg_size(tp) > 1) && !tr->off && !tr->ssteps;
}

dt_status dt__trainer_prepare_micro(dt_trainer *tr, const dt_trainer_batch *b)
{
    tr->preparing = true;
    dt_status st = dt__trainer_micro(tr, b, false);
    tr->preparing = false;
    tr->nmicro = 0;
    if (tr->s->ops.wait)
        tr->s->ops.wait(tr->s->self);
    if (tr->lazy_grads) /* as after a step: marked zero, the next backward overwrites */
        dt_model_zero_grad_lazy(tr->m);
    else
        dt_model_zero_grad(tr->m);
    return st;
}

dt_status dt_trainer_step(dt_trainer *tr, const dt_trainer_batch *micro, int n, dt_trainer_metrics *out)
{
    if (!tr || (!micro && n > 0))
        return dt_error(DT_ERR_NULL, "dt_trainer_step: %s is NULL", tr ? "batch" : "trainer");
    if (n < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_step: %d micro-batches (need >= 1)", n);
    if (tr->nmicro)
        return dt_error(DT_ERR_STATE, "dt_trainer_step: a step is already under way");
    dt_comm_set_step(tr->opt_step + 1); /* the flight recorder's step */
    for (int i = 0; i < n; i++) {
        dt_status st = dt__trainer_micro(tr, &micro[i], i == n - 1);
        if (st < 0)
            return st;
    }
    return dt__trainer_finish(tr, out);
}

void dt_trainer_request_stop(dt_trainer *tr)
{
    if (tr)
        tr->stop_req = 1;
}

dt_model *dt_trainer_model(const dt_trainer *tr) { return tr ? tr->m : NULL; }
dt_loss_scaler *dt_trainer_loss_scaler(const dt_trainer *tr) { return tr ? tr->scaler : NULL; }
dt_dtype dt_trainer_reduce_dtype(const dt_trainer *tr) { return tr ? tr->reduce_dtype : DT_DTYPE_UNSET; }

dt_optim *dt_trainer_optim(const dt_trainer *tr) { return tr ? tr->opt : NULL; }
dt_offload_optim *dt_trainer_offload(const dt_trainer *tr) { return tr ? tr->off : NULL; }
dt_strategy *dt_trainer_strategy(const dt_trainer *tr) { return tr ? tr->s : NULL; }
dt_ctx *dt_trainer_ctx(const dt_trainer *tr) { return tr ? tr->ctx : NULL; }
int64_t dt_trainer_steps(const dt_trainer *tr) { return tr ? tr->opt_step : 0; }
double dt_trainer_next_lr(const dt_trainer *tr) { return tr ? dt_sched_lr(&tr->p.sched, tr->opt_step) : 0; }
int dt_trainer_rank(const dt_trainer *tr) { return tr ? tr->rank : 0; }
int dt_trainer_world(const dt_trainer *tr) { return tr ? tr->world : 1; }
int dt__trainer_replicas(const dt_trainer *tr)
{
    return !tr ? 1 : tr->p.same_batch > 1 ? tr->world / tr->p.same_batch : tr->world;
}
int64_t dt__trainer_grad_accum(const dt_trainer *tr) { return tr->p.grad_accum; }
dt__trainer_pos *dt__trainer_position(dt_trainer *tr) { return &tr->pos; }
const dt_trainer_params *dt__trainer_params(const dt_trainer *tr) { return &tr->p; }
void dt__trainer_set_steps(dt_trainer *tr, int64_t steps) { tr->opt_step = steps; }
void **dt__trainer_ckpt_slot(dt_trainer *tr) { return &tr->ckpt; }
void dt__trainer_owned(const dt_trainer *tr, size_t *lo, size_t *hi)
{
    *lo = tr->lo;
    *hi = tr->hi;
}
void dt__trainer_ranges(const dt_trainer *tr, const dt_optim_range **r, size_t *n)
{
    *r = tr->rg;
    *n = tr->nrg;
}
bool dt__trainer_whole_state(const dt_trainer *tr)
{
    /* one range over the whole f32 flat: not sharded, no low-precision masters */
    return steps_whole_flats(tr) && dt_optim_num_ranges(tr->opt) == 1;
}

dt_status dt_trainer_allreduce_sum(dt_trainer *tr, double *v, int n)
{
    if (!tr || (!v && n > 0))
        return dt_error(DT_ERR_NULL, "dt_trainer_allreduce_sum: NULL argument");
    if (n < 0) /* was DT_OK, summing nothing */
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_allreduce_sum: n %d (want n >= 0)", n);
    if (!agrees(tr) || !tr->s->ops.allreduce_sum || n == 0)
        return DT_OK;
    return tr->s->ops.allreduce_sum(tr->s->self, v, n);
}

static size_t peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) {
            kb = (size_t)strtoull(line + 6, NULL, 10);
            break;
        }
    if (f)
        fclose(f);
    return kb * 1024;
}

dt_status dt_trainer_memory_get(const dt_trainer *tr, dt_trainer_memory *out)
{
    if (!tr || !out)
        return dt_error(DT_ERR_NULL, "dt_trainer_memory_get: %s is NULL", tr ? "out" : "trainer");
    memset(out, 0, sizeof *out);
    dt_strategy_memory sm = {0};
    if (tr->s->ops.memory) {
        dt_status st = tr->s->ops.memory(tr->s->self, &sm);
        if (st < 0)
            return st;
    } else { /* every float flat of the model */
        static const dt_dtype fl[3] = {DT_F32, DT_BF16, DT_F16};
        for (int d = 0; d < 3; d++) {
            const dt_flat *P = dt_model_flat(tr->m, DT_FLAT_PARAMS, fl[d]);
            const dt_flat *G = dt_model_flat(tr->m, DT_FLAT_GRADS, fl[d]);
            sm.param_bytes += P ? dt_flat_nbytes(P) : 0;
            sm.grad_bytes += G ? dt_flat_nbytes(G) : 0;
        }
    }
    out->param_bytes = sm.param_bytes;
    out->grad_bytes = sm.grad_bytes;
    out->gathered_peak = sm.gathered_peak;
    /* what each range steps (dt_optim_range_held: not the other stages an
     * interleaved pipeline rank's range spans): its states, fp32 masters of
     * low-precision parameters (f32 ones are their own master), and the
     * optimizer's f32 copies of low-precision gradients */
    const int ns = dt_optim_num_states(tr->opt);
    const bool ranged = !tr->off; /* NVMe offload: the optimizer has no ranges in memory */
    for (size_t k = 0; k < tr->nrg; k++) {
        const dt_optim_range *r = &tr->rg[k];
        const size_t held = ranged ? dt_optim_range_held(tr->opt, k) : r->hi - r->lo;
        out->optim_bytes += held * (size_t)ns * sizeof(float);
        if (r->mirror)
            out->master_bytes += held * sizeof(float);
        if (r->grads && r->grads->dtype != DT_F32)
            out->grad_f32_bytes += held * sizeof(float);
    }
    if (tr->off) /* NVMe offload: the state is in files; only the driver's buffers are held */
        out->optim_bytes = dt_offload_optim_buffer_bytes(tr->off);
    out->peak_rss = peak_rss_bytes();
    for (size_t i = 0, ne = dt_model_num_entries(tr->m); i < ne; i++) {
        dt_param_info p;
        if (dt_model_entry(tr->m, i, &p) >= 0 && p.frozen && p.tied_to < 0 && p.tensor) /* held here */
            out->frozen_bytes += p.numel * dt_dtype_size(p.dtype);
    }
    return DT_OK;
}

dt_status dt__trainer_sync_buffers(dt_trainer *tr)
{
    return tr->s->ops.sync_buffers ? tr->s->ops.sync_buffers(tr->s->self) : DT_OK;
}

bool dt__trainer_stop_now(const dt_trainer *tr) { return !agrees(tr) && tr->stop_req; }
