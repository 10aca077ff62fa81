/* A DeepSpeed-style config (config.h) into the trainer's params: the
 * optimizer and its hyper-parameters, the LR schedule, clipping, gradient
 * accumulation, precision and the loss scaler, the optimizer offload.
 *
 * DeepSpeed's defaults where its config and dtrain's differ:
 *   - "Adam" builds FusedAdam with adam_w_mode true unless the params say
 *     false: decoupled weight decay, i.e. dtrain's AdamW;
 *   - a type given in the config takes FusedAdam's / FusedLamb's defaults
 *     for what its params do not give (lr 1e-3, betas 0.9/0.999, eps 1e-8,
 *     weight_decay 0; Lamb's max_grad_norm 0), not torch's AdamW default
 *     decay of 1e-2 nor apex LAMB's clipping at 1.0;
 *   - WarmupLR's rate is warmup_max_lr (default 1e-3; "auto": the
 *     optimizer's lr, as the HF Trainer fills it), ramped from 0 over
 *     warmup_num_steps by warmup_type ("log", DeepSpeed's default, or
 *     "linear"): it replaces the optimizer's lr, as DeepSpeed's scheduler
 *     overwrites the param groups'. warmup_num_steps left out or "auto"
 *     keeps the caller's warmup_steps (dtrain train's --warmup, default 0:
 *     no warm-up), not DeepSpeed's silent 1000.
 *   - WarmupDecayLR is WarmupLR followed by a linear decay to 0 at
 *     total_num_steps (required, as in DeepSpeed; "auto": the run's
 *     length): dtrain's linear schedule. */
#include "dtrain/config.h"
#include "dtrain/precision.h"
#include "dtrain/train.h"

#include <math.h>
#include <string.h>

static void take_d(const dt_config *c, const char *key, double *dst)
{
    double v;
    if (dt_config_get_double(c, key, &v) == DT_OK)
        *dst = v;
}

/* The params one optimizer takes and another does not. DeepSpeed passes optimizer.params to the
 * optimizer's constructor, so a key it does not take is a TypeError there (torch.optim.SGD has no
 * betas, FusedAdam no momentum or max_grad_norm); here it is an error naming the key, never a key
 * dropped. */
static dt_status check_optimizer_keys(const dt_config *c, dt_optim_kind kind)
{
    static const struct {
        const char *key;
        unsigned kinds; /* 1u << dt_optim_kind: those that take it */
        const char *names;
    } only[] = {
        {"optimizer.params.momentum", 1u << DT_OPTIM_SGD, "SGD"},
        {"optimizer.params.nesterov", 1u << DT_OPTIM_SGD, "SGD"},
        {"optimizer.params.dampening", 1u << DT_OPTIM_SGD, "SGD"},
        {"optimizer.params.max_grad_norm", 1u << DT_OPTIM_LAMB, "Lamb"},
        {"optimizer.params.grad_averaging", 1u << DT_OPTIM_LAMB, "Lamb"},
        {"optimizer.params.bias_correction", 1u << DT_OPTIM_LAMB | 1u << DT_OPTIM_ADAM | 1u << DT_OPTIM_ADAMW,
         "Adam, AdamW and Lamb"},
    };
    for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
        if (!(only[i].kinds & 1u << kind) && dt_config_origin_of(c, only[i].key) != DT_CONFIG_UNSET)
            return dt_error(DT_ERR_INVALID_ARG, "key %s: applies to %s only (optimizer is %s)", only[i].key,
                            only[i].names, dt_optim_kind_name(kind));
    bool bc = true;
    if ((kind == DT_OPTIM_ADAM || kind == DT_OPTIM_ADAMW) &&
        dt_config_get_bool(c, "optimizer.params.bias_correction", &bc) == DT_OK && !bc)
        return dt_error(DT_ERR_UNSUPPORTED, "key optimizer.params.bias_correction: not supported yet (false: "
                                            "dtrain's Adam and AdamW always correct the moments' bias)");
    return DT_OK;
}

static dt_status apply_optimizer(const dt_config *c, dt_trainer_params *tp)
{
    const char *type = NULL;
    bool awm = true, torch_adam = false;
    dt_config_get_bool(c, "optimizer.params.adam_w_mode", &awm);
    dt_config_get_bool(c, "optimizer.params.torch_adam", &torch_adam);
    if (dt_config_get_str(c, "optimizer.type", &type) == DT_OK) {
        if (!strcmp(type, "SGD")) {
            tp->optimizer = DT_OPTIM_SGD;
            tp->sgd = dt_sgd_params_default();
            tp->sgd.lr = 1e-3;
        } else if (!strcmp(type, "Lamb")) {
            tp->optimizer = DT_OPTIM_LAMB;
            tp->lamb = dt_lamb_params_default();
            tp->lamb.eps = 1e-8;
            tp->lamb.weight_decay = 0;
            tp->lamb.max_grad_norm = 0; /* FusedLamb's: no clipping inside the optimizer (apex's is 1.0) */
        } else { /* Adam, AdamW */
            bool w = !strcmp(type, "AdamW") || awm;
            tp->optimizer = w ? DT_OPTIM_ADAMW : DT_OPTIM_ADAM;
            dt_adam_params *a = w ? &tp->adamw : &tp->adam;
            *a = w ? dt_adamw_params_default() : dt_adam_params_default();
            if (!torch_adam)
                a->weight_decay = 0; /* FusedAdam's default */
        }
    } else if (dt_config_origin_of(c, "optimizer.params.adam_w_mode") != DT_CONFIG_UNSET &&
               (tp->optimizer == DT_OPTIM_ADAM || tp->optimizer == DT_OPTIM_ADAMW)) {
        tp->optimizer = awm ? DT_OPTIM_ADAMW : DT_OPTIM_ADAM;
    }
    double lr = NAN, wd = NAN, eps = NAN, mom = NAN, damp = NAN, mgn = NAN;
    double betas[2] = {NAN, NAN};
    take_d(c, "optimizer.params.lr", &lr);
    take_d(c, "optimizer.params.weight_decay", &wd);
    take_d(c, "optimizer.params.eps", &eps);
    take_d(c, "optimizer.params.momentum", &mom);
    take_d(c, "optimizer.params.dampening", &damp);
    take_d(c, "optimizer.params.max_grad_norm", &mgn);
    const char *stype = NULL;
    if (dt_config_get_str(c, "scheduler.type", &stype) == DT_OK &&
        (!strcmp(stype, "WarmupLR") || !strcmp(stype, "WarmupDecayLR")) &&
        dt_config_get_double(c, "scheduler.params.warmup_max_lr", &lr) != DT_OK &&
        !dt_config_is_auto(c, "scheduler.params.warmup_max_lr"))
        lr = 1e-3; /* WarmupLR's warmup_max_lr default ("auto": the optimizer's lr, taken above) */
    dt_config_get_pair(c, "optimizer.params.betas", betas);
    bool nesterov = false, bc = true, ga = true;
    switch (tp->optimizer) {
    case DT_OPTIM_SGD:
        if (!isnan(lr)) tp->sgd.lr = lr;
        if (!isnan(wd)) tp->sgd.weight_decay = wd;
        if (!isnan(mom)) tp->sgd.momentum = mom;
        if (!isnan(damp)) tp->sgd.dampening = damp;
        if (dt_config_get_bool(c, "optimizer.params.nesterov", &nesterov) == DT_OK)
            tp->sgd.nesterov = nesterov;
        if (nesterov && (!(tp->sgd.momentum > 0) || tp->sgd.dampening != 0)) /* torch.optim.SGD's rule; named
                                                                                 here, not by the trainer */
            return dt_error(DT_ERR_INVALID_ARG, "key optimizer.params.nesterov: true needs optimizer.params.momentum "
                            "> 0 and dampening 0 (momentum %g, dampening %g)", tp->sgd.momentum,
                            tp->sgd.dampening);
        break;
    case DT_OPTIM_ADAM:
    case DT_OPTIM_ADAMW: {
        dt_adam_params *a = tp->optimizer == DT_OPTIM_ADAMW ? &tp->adamw : &tp->adam;
        if (!isnan(lr)) a->lr = lr;
        if (!isnan(wd)) a->weight_decay = wd;
        if (!isnan(eps)) a->eps = eps;
        if (!isnan(betas[0])) a->beta1 = betas[0], a->beta2 = betas[1];
        break;
    }
    case DT_OPTIM_LAMB:
        if (!isnan(lr)) tp->lamb.lr = lr;
        if (!isnan(wd)) tp->lamb.weight_decay = wd;
        if (!isnan(eps)) tp->lamb.eps = eps;
        if (!isnan(mgn)) tp->lamb.max_grad_norm = mgn;
        if (!isnan(betas[0])) tp->lamb.beta1 = betas[0], tp->lamb.beta2 = betas[1];
        if (dt_config_get_bool(c, "optimizer.params.bias_correction", &bc) == DT_OK)
            tp->lamb.bias_correction = bc;
        if (dt_config_get_bool(c, "optimizer.params.adam_w_mode", &awm) == DT_OK)
            tp->lamb.adam_w_mode = awm;
        if (dt_config_get_bool(c, "optimizer.params.grad_averaging", &ga) == DT_OK)
            tp->lamb.grad_averaging = ga;
        break;
    default:
        break;
    }
    return check_optimizer_keys(c, tp->optimizer);
}

static dt_status apply_sched(const dt_config *c, dt_trainer_params *tp)
{
    const char *type = NULL;
    int64_t v;
    double d;
    if (dt_config_get_str(c, "scheduler.type", &type) == DT_OK) {
        if (!strcmp(type, "WarmupLR") || !strcmp(type, "WarmupDecayLR")) {
            /* WarmupDecayLR: WarmupLR's ramp, then warmup_max_lr * (total - step) / max(1, total - warmup), at
               least 0: dtrain's linear schedule, whose floor min_lr is WarmupDecayLR's warmup_min_lr (0) */
            bool decay = !strcmp(type, "WarmupDecayLR");
            tp->sched.kind = decay ? DT_SCHED_LINEAR : DT_SCHED_CONSTANT;
            tp->sched.warmup = DT_WARMUP_LOG; /* WarmupLR's default warmup_type (the key, below, overrides) */
            /* warmup_num_steps unset or "auto": the caller's warmup_steps (below) */
            if (decay) {
                tp->sched.min_lr = 0;
                if (dt_config_origin_of(c, "scheduler.params.total_num_steps") == DT_CONFIG_UNSET &&
                    !dt_config_is_auto(c, "scheduler.params.total_num_steps"))
                    return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.total_num_steps: WarmupDecayLR needs it "
                                                        "(the step its decay reaches 0; DeepSpeed's too), or \"auto\": "
                                                        "the run's length");
                if (dt_config_origin_of(c, "scheduler.params.min_lr") != DT_CONFIG_UNSET)
                    return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.min_lr: not a WarmupDecayLR param (it "
                                                        "decays to warmup_min_lr, 0)");
            }
        } else if (dt_sched_kind_parse(type, &tp->sched.kind) < 0) {
            return dt_error(DT_ERR_INVALID_ARG, "key scheduler.type: '%s' is not a schedule", type);
        }
    }
    const char *wt = NULL;
    if (dt_config_get_str(c, "scheduler.params.warmup_type", &wt) == DT_OK)
        tp->sched.warmup = !strcmp(wt, "log") ? DT_WARMUP_LOG : DT_WARMUP_LINEAR;
    if (dt_config_get_int(c, "scheduler.params.warmup_num_steps", &v) == DT_OK)
        tp->sched.warmup_steps = v;
    if (dt_config_get_int(c, "scheduler.params.step_size", &v) == DT_OK)
        tp->sched.step_size = v;
    if (dt_config_get_int(c, "scheduler.params.total_num_steps", &v) == DT_OK)
        tp->sched.total_steps = v;
    if (dt_config_get_double(c, "scheduler.params.gamma", &d) == DT_OK)
        tp->sched.gamma = d;
    if (dt_config_get_double(c, "scheduler.params.min_lr", &d) == DT_OK)
        tp->sched.min_lr = d;
    return DT_OK;
}

static dt_status apply_precision(const dt_config *c, dt_trainer_params *tp)
{
    dt_dtype dt;
    dt_status st = dt_config_precision(c, &dt);
    if (st < 0 && st != DT_ERR_NOT_FOUND)
        return st;
    if (st == DT_OK) {
        if (dt == DT_DTYPE_UNSET) /* bf16.enabled "auto" */
            dt = dt_precision_auto(NULL);
        tp->precision.param_dtype = dt;
        tp->use_scaler = dt == DT_F16;
    }
    const char *cdt = NULL;
    if (dt_config_get_str(c, "communication_data_type", &cdt) == DT_OK)
        tp->precision.reduce_dtype = !strcmp(cdt, "fp16") ? DT_F16 : !strcmp(cdt, "bf16") ? DT_BF16 : DT_F32;
    /* the fp16 block's scaler settings (they act with fp16 only, as in DeepSpeed) */
    dt_loss_scaler_params *s = &tp->scaler;
    int64_t v;
    double d;
    bool b;
    if (dt_config_get_double(c, "fp16.loss_scale", &d) == DT_OK)
        s->loss_scale = d;
    if (dt_config_get_int(c, "fp16.initial_scale_power", &v) == DT_OK) {
        s->initial_scale_power = (int)v;
        s->init_scale = ldexp(1.0, (int)v);
    }
    if (dt_config_get_int(c, "fp16.loss_scale_window", &v) == DT_OK)
        s->loss_scale_window = s->growth_interval = v;
    if (dt_config_get_int(c, "fp16.hysteresis", &v) == DT_OK)
        s->hysteresis = (int)v;
    if (dt_config_get_bool(c, "fp16.consecutive_hysteresis", &b) == DT_OK)
        s->consecutive_hysteresis = b;
    if (dt_config_get_double(c, "fp16.min_loss_scale", &d) == DT_OK)
        s->min_loss_scale = d;
    return DT_OK;
}

dt_status dt_trainer_params_apply_config(const dt_config *c, dt_trainer_params *tp)
{
    if (!c || !tp)
        return dt_error(DT_ERR_NULL, "dt_trainer_params_apply_config: NULL argument");
    dt_status st;
    if ((st = apply_optimizer(c, tp)) < 0 || (st = apply_sched(c, tp)) < 0 || (st = apply_precision(c, tp)) < 0)
        return st;
    double clip;
    if (dt_config_get_double(c, "gradient_clipping", &clip) == DT_OK)
        tp->clip_grad_norm = clip;
    int64_t gas;
    int stages = dt_config_pipe_stages(c);
    if (stages < 0)
        return (dt_status)stages;
    if (dt_config_get_int(c, "gradient_accumulation_steps", &gas) == DT_OK)
        tp->grad_accum = stages > 1 ? 1 : gas; /* a pipeline's micro-batches (dt_config_pipe_params) */
    /* the timeline: "dtrain": {"trace": DIR, "trace_steps": "A:B"} */
    const char *tr = NULL;
    if (dt_config_get_str(c, "dtrain.trace", &tr) == DT_OK)
        tp->trace.dir = tr[0] ? tr : NULL;
    if (dt_config_get_str(c, "dtrain.trace_steps", &tr) == DT_OK && (st = dt_trace_parse_steps(tr, &tp->trace)) < 0)
        return dt_error(st, "config key dtrain.trace_steps: %s", dt_last_error());
    return dt_config_offload_params(c, &tp->offload);
}
