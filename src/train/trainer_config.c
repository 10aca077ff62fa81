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
#include "train_impl.h"

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
        {"optimizer.params.eps", 1u << DT_OPTIM_LAMB | 1u << DT_OPTIM_ADAM | 1u << DT_OPTIM_ADAMW,
         "Adam, AdamW and Lamb"},
        {"optimizer.params.adam_w_mode", 1u << DT_OPTIM_LAMB | 1u << DT_OPTIM_ADAM | 1u << DT_OPTIM_ADAMW,
         "Adam, AdamW and Lamb"},
        {"optimizer.params.torch_adam", 1u << DT_OPTIM_ADAM | 1u << DT_OPTIM_ADAMW, "Adam and AdamW"},
        {"optimizer.params.betas", 1u << DT_OPTIM_LAMB | 1u << DT_OPTIM_ADAM | 1u << DT_OPTIM_ADAMW |
         1u << DT_OPTIM_LION, "Adam, AdamW, Lamb and Lion"},
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
        } else if (!strcmp(type, "Lion")) { /* DeepSpeed's FusedLion */
            tp->optimizer = DT_OPTIM_LION;
            tp->lion = dt_lion_params_default();
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
    if (stype && !strcmp(stype, "OneCycle") &&
        dt_config_get_double(c, "scheduler.params.cycle_max_lr", &lr) != DT_OK &&
        !dt_config_is_auto(c, "scheduler.params.cycle_max_lr"))
        return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.cycle_max_lr: OneCycle needs it (the cycle's top, "
                                            "DeepSpeed's constructor too; \"auto\": the optimizer's lr)");
    if (stype && !strcmp(stype, "LRRangeTest") &&
        dt_config_get_double(c, "scheduler.params.lr_range_test_min_lr", &lr) != DT_OK &&
        !dt_config_is_auto(c, "scheduler.params.lr_range_test_min_lr"))
        lr = 1e-3; /* LRRangeTest's lr_range_test_min_lr default: it sets the optimizer's lr too */
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
    case DT_OPTIM_LION:
        if (!isnan(lr)) tp->lion.lr = lr;
        if (!isnan(wd)) tp->lion.weight_decay = wd;
        if (!isnan(betas[0])) tp->lion.beta1 = betas[0], tp->lion.beta2 = betas[1];
        break;
    default:
        break;
    }
    return check_optimizer_keys(c, tp->optimizer);
}

/* DeepSpeed hands scheduler.params to the scheduler's constructor, so a key its type does not take is a
 * TypeError there; here an error naming the key. Types are bits: WarmupLR, WarmupDecayLR, WarmupCosineLR,
 * LRRangeTest, dtrain's own (constant, step, cosine, linear), OneCycle. */
enum { S_WLR = 1, S_WDLR = 2, S_WCOS = 4, S_LRRT = 8, S_OWN = 16, S_1CYC = 32 };

static dt_status check_sched_keys(const dt_config *c, const char *type, unsigned t)
{
    static const struct {
        const char *key;
        unsigned types;
    } only[] = {
        {"scheduler.params.warmup_min_lr", S_WLR | S_WDLR},
        {"scheduler.params.warmup_max_lr", S_WLR | S_WDLR},
        {"scheduler.params.warmup_num_steps", S_WLR | S_WDLR | S_WCOS | S_OWN},
        {"scheduler.params.warmup_type", S_WLR | S_WDLR | S_WCOS | S_OWN},
        {"scheduler.params.total_num_steps", S_WDLR | S_WCOS | S_OWN},
        {"scheduler.params.warmup_min_ratio", S_WCOS},
        {"scheduler.params.cos_min_ratio", S_WCOS},
        {"scheduler.params.lr_range_test_min_lr", S_LRRT},
        {"scheduler.params.lr_range_test_step_size", S_LRRT},
        {"scheduler.params.lr_range_test_step_rate", S_LRRT},
        {"scheduler.params.lr_range_test_staircase", S_LRRT},
        {"scheduler.params.cycle_min_lr", S_1CYC},
        {"scheduler.params.cycle_max_lr", S_1CYC},
        {"scheduler.params.decay_lr_rate", S_1CYC},
        {"scheduler.params.cycle_first_step_size", S_1CYC},
        {"scheduler.params.cycle_second_step_size", S_1CYC},
        {"scheduler.params.cycle_first_stair_count", S_1CYC},
        {"scheduler.params.cycle_second_stair_count", S_1CYC},
        {"scheduler.params.decay_step_size", S_1CYC},
        {"scheduler.params.cycle_momentum", S_1CYC},
        {"scheduler.params.cycle_min_mom", S_1CYC},
        {"scheduler.params.cycle_max_mom", S_1CYC},
        {"scheduler.params.decay_mom_rate", S_1CYC},
        {"scheduler.params.step_size", S_OWN},
        {"scheduler.params.gamma", S_OWN},
        {"scheduler.params.min_lr", S_OWN},
    };
    for (size_t i = 0; i < sizeof only / sizeof only[0]; i++)
        if (!(only[i].types & t) && (dt_config_origin_of(c, only[i].key) != DT_CONFIG_UNSET ||
                                     dt_config_is_auto(c, only[i].key)))
            return dt_error(DT_ERR_INVALID_ARG, "key %s: not a parameter of scheduler.type %s%s", only[i].key, type,
                            (t & (S_LRRT | S_1CYC)) && strstr(only[i].key, "warmup") ? " (it has no warm-up; "
                                                                                        "--warmup sets this key)" : "");
    return DT_OK;
}

/* A key of the schedule DeepSpeed requires (no default there): "auto" is the run's length. */
static dt_status need_total(const dt_config *c, const char *type, const char *what)
{
    if (dt_config_origin_of(c, "scheduler.params.total_num_steps") == DT_CONFIG_UNSET &&
        !dt_config_is_auto(c, "scheduler.params.total_num_steps"))
        return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.total_num_steps: %s needs it (the step its %s; "
                        "DeepSpeed's too), or \"auto\": the run's length", type, what);
    return DT_OK;
}

static dt_status apply_sched(const dt_config *c, dt_trainer_params *tp)
{
    const char *type = NULL;
    int64_t v;
    double d;
    unsigned t = S_OWN;
    dt_sched_params *sp = &tp->sched;
    dt_status st;
    if (dt_config_get_str(c, "scheduler.type", &type) == DT_OK) {
        t = !strcmp(type, "WarmupLR") ? S_WLR : !strcmp(type, "WarmupDecayLR") ? S_WDLR
            : !strcmp(type, "WarmupCosineLR") ? S_WCOS : !strcmp(type, "LRRangeTest") ? S_LRRT
            : !strcmp(type, "OneCycle") ? S_1CYC : S_OWN;
        if (t == S_OWN && dt_sched_kind_parse(type, &sp->kind) < 0)
            return dt_error(DT_ERR_INVALID_ARG, "key scheduler.type: '%s' is not a schedule", type);
    }
    if ((st = check_sched_keys(c, type ? type : dt_sched_kind_name(sp->kind), t)) < 0)
        return st;
    if (type) {
        /* warmup_num_steps unset or "auto": the caller's warmup_steps (below) */
        if (t & (S_WLR | S_WDLR | S_WCOS))
            sp->warmup = DT_WARMUP_LOG; /* DeepSpeed's default warmup_type (the key, below, overrides) */
        if (t & (S_WLR | S_WDLR)) {
            /* WarmupDecayLR: WarmupLR's ramp, then min + (max - min) * (total - step) / max(1, total - warmup),
               at least min: dtrain's linear schedule with its floor min_lr at warmup_min_lr */
            sp->kind = t == S_WDLR ? DT_SCHED_LINEAR : DT_SCHED_CONSTANT;
            if (t == S_WDLR && (st = need_total(c, type, "decay reaches warmup_min_lr")) < 0)
                return st;
            double lo = 0, hi = dt_trainer_params_lr(tp); /* warmup_max_lr, set as the optimizer's lr */
            if (dt_config_get_double(c, "scheduler.params.warmup_min_lr", &lo) == DT_OK && lo != 0 && !(hi > 0))
                return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.warmup_min_lr: %g with warmup_max_lr %g: "
                                "dtrain ramps from a fraction of a rate > 0", lo, hi);
            sp->warmup_start = hi > 0 ? lo / hi : 0;
            sp->min_lr = t == S_WDLR ? lo : 0;
        } else if (t == S_WCOS) {
            /* the optimizer's lr times DeepSpeed's ratio */
            sp->kind = DT_SCHED_WARMUP_COSINE;
            if ((st = need_total(c, type, "cosine reaches cos_min_ratio")) < 0)
                return st;
            sp->warmup_start = 0;
            sp->min_ratio = 1e-4;
            if (dt_config_get_double(c, "scheduler.params.warmup_min_ratio", &d) == DT_OK)
                sp->warmup_start = d;
            if (dt_config_get_double(c, "scheduler.params.cos_min_ratio", &d) == DT_OK)
                sp->min_ratio = d;
        } else if (t == S_LRRT) {
            /* lr_range_test_min_lr is the optimizer's lr (apply_optimizer); DeepSpeed's defaults */
            sp->kind = DT_SCHED_RANGE_TEST;
            sp->warmup_steps = 0;
            sp->step_size = 2000;
            sp->step_rate = 1.0;
            sp->staircase = false;
            if (dt_config_get_int(c, "scheduler.params.lr_range_test_step_size", &v) == DT_OK)
                sp->step_size = v;
            if (dt_config_get_double(c, "scheduler.params.lr_range_test_step_rate", &d) == DT_OK)
                sp->step_rate = d;
            dt_config_get_bool(c, "scheduler.params.lr_range_test_staircase", &sp->staircase);
        } else if (t == S_1CYC) {
            /* cycle_max_lr is the optimizer's lr (apply_optimizer); the rest DeepSpeed's defaults */
            sp->kind = DT_SCHED_ONE_CYCLE;
            sp->warmup_steps = 0;
            sp->cycle = dt_sched_params_default().cycle;
            dt_one_cycle *cy = &sp->cycle;
            if (dt_config_get_double(c, "scheduler.params.cycle_min_lr", &d) != DT_OK)
                return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.cycle_min_lr: OneCycle needs it (the "
                                                    "cycle's low end; DeepSpeed's constructor too)");
            const double hi = dt_trainer_params_lr(tp);
            if (d != 0 && !(hi > 0))
                return dt_error(DT_ERR_INVALID_ARG, "key scheduler.params.cycle_min_lr: %g with cycle_max_lr %g: "
                                "dtrain cycles from a fraction of a rate > 0", d, hi);
            cy->min_ratio = hi > 0 ? d / hi : 0;
            if (dt_config_get_int(c, "scheduler.params.cycle_first_step_size", &v) == DT_OK)
                cy->first_steps = v;
            if (dt_config_get_int(c, "scheduler.params.cycle_second_step_size", &v) == DT_OK)
                cy->second_steps = v;
            if (dt_config_get_int(c, "scheduler.params.cycle_first_stair_count", &v) == DT_OK)
                cy->first_stairs = v;
            if (dt_config_get_int(c, "scheduler.params.cycle_second_stair_count", &v) == DT_OK)
                cy->second_stairs = v;
            if (dt_config_get_int(c, "scheduler.params.decay_step_size", &v) == DT_OK)
                cy->decay_steps = v;
            if (dt_config_get_double(c, "scheduler.params.decay_lr_rate", &d) == DT_OK)
                cy->decay_lr_rate = d;
            dt_config_get_bool(c, "scheduler.params.cycle_momentum", &cy->cycle_momentum);
            if (dt_config_get_double(c, "scheduler.params.cycle_min_mom", &d) == DT_OK)
                cy->min_mom = d;
            if (dt_config_get_double(c, "scheduler.params.cycle_max_mom", &d) == DT_OK)
                cy->max_mom = d;
            if (dt_config_get_double(c, "scheduler.params.decay_mom_rate", &d) == DT_OK)
                cy->decay_mom_rate = d;
        }
    }
    const char *wt = NULL;
    if (dt_config_get_str(c, "scheduler.params.warmup_type", &wt) == DT_OK)
        sp->warmup = !strcmp(wt, "log") ? DT_WARMUP_LOG : DT_WARMUP_LINEAR;
    if (dt_config_get_int(c, "scheduler.params.warmup_num_steps", &v) == DT_OK)
        /* DeepSpeed's schedules raise a count of 1 to 2 (0: dtrain's no warm-up; DeepSpeed refuses it) */
        sp->warmup_steps = v == 1 && t != S_OWN ? 2 : v;
    if (dt_config_get_int(c, "scheduler.params.step_size", &v) == DT_OK)
        sp->step_size = v;
    if (dt_config_get_int(c, "scheduler.params.total_num_steps", &v) == DT_OK)
        sp->total_steps = v;
    if (dt_config_get_double(c, "scheduler.params.gamma", &d) == DT_OK)
        sp->gamma = d;
    if (dt_config_get_double(c, "scheduler.params.min_lr", &d) == DT_OK)
        sp->min_lr = d;
    /* DeepSpeed's engine steps the scheduler after each optimizer step: step s trains at the rate its
       constructor set (s = 0) or at last_batch_iteration s - 1 (LRRangeTest counts from 1 itself). Without a
       warm-up (dtrain's 0, which DeepSpeed raises to 2) the rate is the schedule's from the first step. */
    sp->lag = (t & (S_WLR | S_WDLR | S_WCOS)) && sp->warmup_steps > 0 ? 1 : 0;
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
    bool wcb;
    if (dt_config_get_bool(c, "wall_clock_breakdown", &wcb) == DT_OK)
        tp->wall_clock_breakdown = wcb;
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
