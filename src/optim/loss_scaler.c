/* The loss scaler (optim.h): a small state machine called once per
 * optimizer step with the overflow flag every rank agreed on.
 *
 * DEEPSPEED (runtime/fp16/loss_scaler.py's
 * DynamicLossScaler, the ZeRO path):
 *   overflow: if hysteresis == 1 or the hysteresis left is 1: at the floor
 *             -> error, else scale = max(scale / 2, min); otherwise the
 *             hysteresis left drops by one (scale kept). last_overflow = iter.
 *   clean:    consecutive_hysteresis refills the hysteresis; when
 *             (iter - last_overflow) % window == 0 the scale doubles (and the
 *             hysteresis is refilled in the non-consecutive mode).
 *   iter += 1.
 * So the scale doubles after exactly `window` clean steps in a row.
 *
 * TORCH (GradScaler.update's kernel): overflow:
 * scale *= backoff, tracker = 0; clean: tracker + 1 == interval -> scale *=
 * growth (kept only if finite), tracker = 0, else tracker + 1. The scale is
 * an fp32 value there, so ours is rounded to float after each change.
 * GradScaler has no floor; ours has min_loss_scale (our decision).
 *
 * Both kinds: an overflow while the scale already sits at its floor is an
 * error (DeepSpeed raises there too) instead of an endless run of skipped
 * steps; the step is still counted as skipped. A static scale (loss_scale >
 * 0) never changes; DT_LOSS_SCALER_STATIC_MAX_RUN overflowing steps in a
 * row under it are an error (a scale that overflows every step would
 * otherwise skip the whole run and report success). */
#include "dtrain/optim.h"

#include <math.h>
#include <string.h>

struct dt_loss_scaler {
    dt_loss_scaler_params p;
    dt_loss_scaler_state s;
};

dt_loss_scaler_params dt_loss_scaler_params_default(void)
{
    dt_loss_scaler_params p;
    memset(&p, 0, sizeof p);
    p.kind = DT_LOSS_SCALER_DEEPSPEED;
    p.loss_scale = 0;
    p.initial_scale_power = 16;
    p.loss_scale_window = 1000;
    p.hysteresis = 2;
    p.consecutive_hysteresis = false;
    p.min_loss_scale = 1;
    p.init_scale = 65536.0;
    p.growth_factor = 2.0;
    p.backoff_factor = 0.5;
    p.growth_interval = 2000;
    return p;
}

const char *dt_loss_scaler_kind_name(dt_loss_scaler_kind k)
{
    static const char *names[] = {"deepspeed", "torch"};
    _Static_assert(DT_LOSS_SCALER_KIND_COUNT == 2, "loss scaler names");
    return (unsigned)k < DT_LOSS_SCALER_KIND_COUNT ? names[k] : "?";
}

dt_status dt_loss_scaler_kind_parse(const char *s, dt_loss_scaler_kind *out)
{
    if (!s || !out)
        return dt_error(DT_ERR_NULL, "dt_loss_scaler_kind_parse: NULL argument");
    for (int k = 0; k < DT_LOSS_SCALER_KIND_COUNT; k++)
        if (!strcmp(s, dt_loss_scaler_kind_name((dt_loss_scaler_kind)k))) {
            *out = (dt_loss_scaler_kind)k;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "unknown loss scaler '%s' (deepspeed, torch)", s);
}

static dt_status check_params(const dt_loss_scaler_params *p)
{
    if ((unsigned)p->kind >= DT_LOSS_SCALER_KIND_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "loss scaler: unknown kind %d", (int)p->kind);
    if (!(p->loss_scale >= 0) || !isfinite(p->loss_scale))
        return dt_error(DT_ERR_INVALID_ARG, "loss scaler: loss_scale %g (need 0 = dynamic, or a finite scale > 0)",
                        p->loss_scale);
    if (!(p->min_loss_scale > 0) || !isfinite(p->min_loss_scale))
        return dt_error(DT_ERR_INVALID_ARG, "loss scaler: min_loss_scale %g (need a finite value > 0)",
                        p->min_loss_scale);
    if (p->kind == DT_LOSS_SCALER_DEEPSPEED) {
        if (p->initial_scale_power < 0 || p->initial_scale_power > 127)
            return dt_error(DT_ERR_INVALID_ARG, "loss scaler: initial_scale_power %d (need 0..127)",
                            p->initial_scale_power);
        if (p->loss_scale_window < 1 || p->hysteresis < 1)
            return dt_error(DT_ERR_INVALID_ARG, "loss scaler: loss_scale_window %lld and hysteresis %d must be >= 1",
                            (long long)p->loss_scale_window, p->hysteresis);
    } else {
        if (!(p->growth_factor > 1) || !isfinite(p->growth_factor) || !(p->backoff_factor > 0) ||
            !(p->backoff_factor < 1))
            return dt_error(DT_ERR_INVALID_ARG,
                            "loss scaler: growth_factor %g must be > 1 and backoff_factor %g in (0, 1)",
                            p->growth_factor, p->backoff_factor);
        if (p->growth_interval < 1 || !(p->init_scale > 0) || !isfinite(p->init_scale) ||
            !isfinite((float)p->init_scale))
            return dt_error(DT_ERR_INVALID_ARG,
                            "loss scaler: growth_interval %lld must be >= 1 and init_scale %g finite (in f32) and > 0",
                            (long long)p->growth_interval, p->init_scale);
    }
    return DT_OK;
}

dt_status dt_loss_scaler_init(const dt_loss_scaler_params *pp, dt_loss_scaler **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_loss_scaler_init: out is NULL");
    *out = NULL;
    dt_loss_scaler_params p = pp ? *pp : dt_loss_scaler_params_default();
    dt_status st = check_params(&p);
    if (st < 0)
        return st;
    dt_loss_scaler *s = dt_calloc(sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "dt_loss_scaler_init");
    s->p = p;
    if (p.loss_scale > 0)
        s->s.scale = p.loss_scale;
    else if (p.kind == DT_LOSS_SCALER_DEEPSPEED)
        s->s.scale = ldexp(1.0, p.initial_scale_power);
    else
        s->s.scale = (float)p.init_scale;
    if (p.loss_scale == 0 && s->s.scale < p.min_loss_scale)
        s->s.scale = p.min_loss_scale;
    s->s.last_overflow = -1;
    s->s.hysteresis_left = p.hysteresis;
    *out = s;
    return DT_OK;
}

void dt_loss_scaler_free(dt_loss_scaler *s) { dt_free(s); }

double dt_loss_scaler_scale(const dt_loss_scaler *s) { return s ? s->s.scale : 1.0; }

bool dt_loss_scaler_is_dynamic(const dt_loss_scaler *s) { return s && s->p.loss_scale == 0; }

static dt_status stuck(dt_loss_scaler *s)
{
    return dt_error(DT_ERR_RANGE,
                    "loss scaler (%s): the gradients overflowed at the minimum loss scale %g (min_loss_scale): "
                    "%lld overflowing steps in a row, %lld skipped in all; the gradients are not finite at any "
                    "scale: lower the learning rate, check the data for inf/NaN, or train in bf16",
                    dt_loss_scaler_kind_name(s->p.kind), s->s.scale, (long long)s->s.overflow_run,
                    (long long)s->s.skipped);
}

dt_status dt_loss_scaler_update(dt_loss_scaler *s, bool overflow)
{
    if (!s)
        return dt_error(DT_ERR_NULL, "dt_loss_scaler_update: scaler is NULL");
    dt_loss_scaler_state *x = &s->s;
    const dt_loss_scaler_params *p = &s->p;
    if (overflow) {
        x->skipped++;
        x->overflow_run++;
    } else {
        x->overflow_run = 0;
    }
    if (p->loss_scale > 0) { /* static */
        x->iter++;
        if (x->overflow_run >= DT_LOSS_SCALER_STATIC_MAX_RUN)
            return dt_error(DT_ERR_RANGE,
                            "loss scaler: the gradients overflowed at the static loss scale %g in %lld optimizer "
                            "steps in a row (%lld skipped in all, none applied since): the scale is too large "
                            "for these gradients; lower --loss-scale (fp16.loss_scale) or use dynamic loss "
                            "scaling (loss_scale 0)",
                            x->scale, (long long)x->overflow_run, (long long)x->skipped);
        return DT_OK;
    }
    if (p->kind == DT_LOSS_SCALER_DEEPSPEED) {
        if (overflow) {
            if (p->hysteresis == 1 || x->hysteresis_left == 1) {
                if (x->scale <= p->min_loss_scale)
                    return stuck(s);
                x->scale = fmax(x->scale / 2.0, p->min_loss_scale);
            } else {
                x->hysteresis_left--;
            }
            x->last_overflow = x->iter;
        } else {
            if (p->consecutive_hysteresis)
                x->hysteresis_left = p->hysteresis;
            if ((x->iter - x->last_overflow) % p->loss_scale_window == 0) {
                if (!p->consecutive_hysteresis)
                    x->hysteresis_left = p->hysteresis;
                x->scale *= 2.0;
            }
        }
    } else {
        if (overflow) {
            if (x->scale <= p->min_loss_scale)
                return stuck(s);
            x->scale = fmax((double)(float)(x->scale * p->backoff_factor), p->min_loss_scale);
            x->growth_tracker = 0;
        } else if (x->growth_tracker + 1 == p->growth_interval) {
            float grown = (float)(x->scale * p->growth_factor);
            if (isfinite(grown))
                x->scale = grown;
            x->growth_tracker = 0;
        } else {
            x->growth_tracker++;
        }
    }
    x->iter++;
    return DT_OK;
}

void dt_loss_scaler_get_state(const dt_loss_scaler *s, dt_loss_scaler_state *out)
{
    if (!out)
        return;
    if (!s) {
        memset(out, 0, sizeof *out);
        out->scale = 1.0;
        out->last_overflow = -1;
        return;
    }
    *out = s->s;
}

dt_status dt_loss_scaler_set_state(dt_loss_scaler *s, const dt_loss_scaler_state *st)
{
    if (!s || !st)
        return dt_error(DT_ERR_NULL, "dt_loss_scaler_set_state: NULL argument");
    if (!(st->scale > 0) || !isfinite(st->scale) || st->iter < 0 || st->last_overflow < -1 ||
        st->last_overflow >= st->iter || st->hysteresis_left < 1 ||
        st->hysteresis_left > s->p.hysteresis || st->growth_tracker < 0 || st->skipped < 0 || st->overflow_run < 0 ||
        st->overflow_run > st->skipped)
        return dt_error(DT_ERR_FORMAT,
                        "dt_loss_scaler_set_state: inconsistent state (scale %g, iter %lld, last_overflow %lld, "
                        "hysteresis_left %d of %d, growth_tracker %lld, skipped %lld, overflow_run %lld)",
                        st->scale, (long long)st->iter, (long long)st->last_overflow, st->hysteresis_left,
                        s->p.hysteresis, (long long)st->growth_tracker, (long long)st->skipped,
                        (long long)st->overflow_run);
    s->s = *st;
    return DT_OK;
}
