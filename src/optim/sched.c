/* Learning-rate schedules as pure functions of the step index, so a run
 * resumed from a checkpoint at step s gets exactly the rates it would have
 * had. Cosine follows Hugging Face's get_cosine_schedule_with_warmup
 * (num_cycles 0.5), linear its get_linear_schedule_with_warmup, both with a
 * floor min_lr like torch's CosineAnnealingLR eta_min. The "log" warm-up is
 * DeepSpeed WarmupLR's default ramp (its warmup_num_steps raised to 2);
 * warmup_cosine, range_test and one_cycle are DeepSpeed's WarmupCosineLR,
 * LRRangeTest and OneCycle (lag: the step its engine's scheduler is behind
 * the optimizer; the last two count it in). */
#include "dtrain/optim.h"

#include <math.h>
#include <string.h>

dt_sched_params dt_sched_params_default(void)
{
    dt_sched_params p = {.kind = DT_SCHED_CONSTANT, .base_lr = 1e-3, .step_size = 1, .gamma = 0.1,
                         .warmup_steps = 0, .total_steps = 1000, .min_lr = 0.0, .warmup = DT_WARMUP_LINEAR,
                         .warmup_start = 0.0, .min_ratio = 1e-4, .step_rate = 1.0, .staircase = false, .lag = 0,
                         .cycle = {.min_ratio = 0.1, .first_steps = 2000, .second_steps = 0, .first_stairs = 0,
                                   .second_stairs = -1, .decay_steps = 0, .decay_lr_rate = 0, .cycle_momentum = true,
                                   .min_mom = 0.8, .max_mom = 0.9, .decay_mom_rate = 0}};
    return p;
}

/* The warm-up factor for step < warmup_steps (callers check). */
static double warm(const dt_sched_params *p, int64_t step)
{
    double w;
    if (p->warmup == DT_WARMUP_LOG) {
        int64_t n = p->warmup_steps > 2 ? p->warmup_steps : 2;
        w = log((double)step + 1.0) / log((double)n);
    } else {
        w = (double)step / (double)p->warmup_steps;
    }
    return p->warmup_start + (1.0 - p->warmup_start) * w;
}

/* OneCycle's halves: the rise and the fall (0: as long as the rise). */
static double cycle_first(const dt_one_cycle *c) { return (double)(c->first_steps > 0 ? c->first_steps : 1); }
static double cycle_second(const dt_one_cycle *c)
{
    return c->second_steps > 0 ? (double)c->second_steps : cycle_first(c);
}
static double cycle_total(const dt_one_cycle *c) { return cycle_first(c) + cycle_second(c); }

/* OneCycle's place in its cycle, 0 at the low end and 1 at the top, for
 * step <= first + second (DeepSpeed's _get_scale_factor at batch iteration
 * `step`: its engine's scheduler is at last_batch_iteration step - 1). */
static double cycle_scale(const dt_one_cycle *c, int64_t step)
{
    const double first = cycle_first(c), second = cycle_second(c), total = first + second;
    const double ratio = first / total, it = (double)step;
    const double x = 1.0 + it / total - floor(1.0 + it / total);
    double f = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
    const int64_t stairs = x <= ratio ? c->first_stairs : c->second_stairs >= 0 ? c->second_stairs : c->first_stairs;
    if (stairs > 0) { /* from the integer place in the half, not from f (DeepSpeed's too) */
        const double ci = fmod(it, total);
        const double pos = ci <= first ? ci * (double)stairs / first : (total - ci) * (double)stairs / second;
        f = floor(pos) / (double)stairs;
    }
    return f;
}

static double sched_base(const dt_sched_params *p, int64_t step)
{
    if (!p)
        return 0.0;
    if (step < 0)
        step = 0;
    switch (p->kind) {
    case DT_SCHED_STEP: {
        int64_t ss = p->step_size > 0 ? p->step_size : 1;
        return p->base_lr * pow(p->gamma, (double)(step / ss));
    }
    case DT_SCHED_LINEAR: {
        if (step < p->warmup_steps)
            return p->base_lr * warm(p, step);
        /* in double: the differences of int64 fields a caller may set to anything overflowed (undefined) */
        double span = (double)p->total_steps - (double)p->warmup_steps;
        double left = ((double)p->total_steps - (double)step) / (span > 1 ? span : 1);
        return p->min_lr + (p->base_lr - p->min_lr) * (left > 0 ? left : 0.0);
    }
    case DT_SCHED_COSINE: {
        if (step < p->warmup_steps)
            return p->base_lr * warm(p, step);
        double span = (double)p->total_steps - (double)p->warmup_steps;
        double prog = ((double)step - (double)p->warmup_steps) / (span > 1 ? span : 1);
        if (prog > 1.0)
            prog = 1.0;
        return p->min_lr + (p->base_lr - p->min_lr) * 0.5 * (1.0 + cos(M_PI * prog));
    }
    case DT_SCHED_WARMUP_COSINE: {
        if (step < p->warmup_steps)
            return p->base_lr * warm(p, step);
        double span = (double)p->total_steps - (double)p->warmup_steps;
        double prog = ((double)step - (double)p->warmup_steps + 1.0) / (span > 1 ? span : 1);
        if (prog > 1.0)
            prog = 1.0;
        double r = p->min_ratio + (1.0 - p->min_ratio) * 0.5 * (1.0 + cos(M_PI * prog));
        return p->base_lr * (r > 0 ? r : 0.0);
    }
    case DT_SCHED_RANGE_TEST: {
        double ss = p->step_size > 0 ? (double)p->step_size : 1.0;
        double i = (double)step / ss;
        return p->base_lr * (1.0 + p->step_rate * (p->staircase ? floor(i) : i));
    }
    case DT_SCHED_ONE_CYCLE: {
        const dt_one_cycle *c = &p->cycle;
        const double lo = p->base_lr * c->min_ratio, t = (double)step - cycle_total(c);
        if (t <= 0)
            return lo + (p->base_lr - lo) * cycle_scale(c, step);
        if (c->decay_steps <= 0 || c->decay_lr_rate == 0)
            return lo;
        return lo / (1.0 + c->decay_lr_rate * t / (double)c->decay_steps);
    }
    case DT_SCHED_CONSTANT:
    default:
        return p->base_lr;
    }
}

double dt_sched_lr(const dt_sched_params *p, int64_t step)
{
    if (!p)
        return 0.0;
    if (step < 0)
        step = 0;
    if (p->lag > 0) { /* DeepSpeed's engine: the scheduler steps after the optimizer */
        if (step < p->lag)
            return p->kind == DT_SCHED_WARMUP_COSINE ? 0.0 : p->base_lr * p->warmup_start;
        step -= p->lag;
    }
    double lr = sched_base(p, step);
    /* cosine, linear and warmup_cosine have their own warm-up (above); the
     * others ramp the same way, on top of their value (this was the CLI's rule) */
    if (p->kind != DT_SCHED_COSINE && p->kind != DT_SCHED_LINEAR && p->kind != DT_SCHED_WARMUP_COSINE &&
        p->warmup_steps > 0 && step < p->warmup_steps)
        lr *= warm(p, step);
    return lr;
}

bool dt_sched_beta1(const dt_sched_params *p, int64_t step, double *beta1)
{
    if (!p || !beta1 || p->kind != DT_SCHED_ONE_CYCLE || !p->cycle.cycle_momentum)
        return false;
    const dt_one_cycle *c = &p->cycle;
    if (step < 0)
        step = 0;
    const double t = (double)step - cycle_total(c);
    if (step == 0) /* DeepSpeed's constructor sets the low end; its first scheduler step the cycle's */
        *beta1 = c->min_mom;
    else if (t <= 0)
        *beta1 = c->max_mom - (c->max_mom - c->min_mom) * cycle_scale(c, step);
    else if (c->decay_steps <= 0 || c->decay_mom_rate == 0)
        *beta1 = c->max_mom;
    else
        *beta1 = c->max_mom * (1.0 + c->decay_mom_rate * t / (double)c->decay_steps);
    return true;
}

static const char *const g_sched_names[] = {"constant",      "step",       "cosine",   "linear",
                                            "warmup_cosine", "range_test", "one_cycle"};
_Static_assert(DT_SCHED_KIND_COUNT == 7, "schedule names");

const char *dt_sched_kind_name(dt_sched_kind k)
{
    return (unsigned)k < DT_SCHED_KIND_COUNT ? g_sched_names[k] : "?";
}

dt_status dt_sched_kind_parse(const char *s, dt_sched_kind *out)
{
    for (int k = 0; s && k < DT_SCHED_KIND_COUNT; k++)
        if (!strcmp(s, g_sched_names[k])) {
            if (out)
                *out = (dt_sched_kind)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown LR schedule '%s' (constant, step, cosine, linear, warmup_cosine, "
                    "range_test, one_cycle)", s ? s : "(null)");
}
