/* Optimizer objects: layout -> work items, parameter checks, the step driver.
 *
 * The step of each kind is one parallel loop over work items (optim_impl.h)
 * calling an element kernel (optim_kernels.c). Scalars that the references
 * compute in double (PyTorch) are computed in double here and rounded to
 * float once, at the same place. LAMB makes three passes: norms of w and g,
 * stage 1 (moments and update u, written into g, plus ‖u‖), stage 2
 * (p -= lr * ratio * u); between them partial sums are reduced per segment
 * in item order and, with a reducer installed, across ranks. */
#include "optim_impl.h"

#include "base/inflight.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- defaults ---------------------------------------------------------------- */

dt_sgd_params dt_sgd_params_default(void)
{
    dt_sgd_params p = {.lr = 0.01, .momentum = 0, .dampening = 0, .weight_decay = 0, .nesterov = false};
    return p;
}

dt_adam_params dt_adam_params_default(void)
{
    dt_adam_params p = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0};
    return p;
}

dt_adam_params dt_adamw_params_default(void)
{
    dt_adam_params p = dt_adam_params_default();
    p.weight_decay = 1e-2;
    return p;
}

dt_lamb_params dt_lamb_params_default(void)
{
    dt_lamb_params p = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-6, .weight_decay = 0.01,
                        .max_grad_norm = 1.0, .bias_correction = true, .adam_w_mode = true,
                        .grad_averaging = true, .use_nvlamb = false};
    return p;
}

const char *dt_optim_kind_name(dt_optim_kind k)
{
    static const char *names[] = {"sgd", "adam", "adamw", "lamb"};
    _Static_assert(DT_OPTIM_KIND_COUNT == 4, "optimizer names");
    return (unsigned)k < DT_OPTIM_KIND_COUNT ? names[k] : "?";
}

/* ---- construction -------------------------------------------------------------- */

static dt_status build_items(dt_optim *o, const dt_optim_layout *l)
{
    if (!l)
        return dt_error(DT_ERR_NULL, "optimizer: layout is NULL");
    if (l->hi < l->lo)
        return dt_error(DT_ERR_INVALID_ARG, "optimizer: range [%zu, %zu) has hi < lo", l->lo, l->hi);
    if (l->nseg && !l->segs)
        return dt_error(DT_ERR_NULL, "optimizer: layout has nseg %zu but segs is NULL", l->nseg);
    dt_optim_segment whole = {l->lo, l->hi - l->lo, false};
    const dt_optim_segment *segs = l->segs ? l->segs : &whole;
    size_t nseg = l->segs ? l->nseg : 1;
    size_t count = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        size_t prev_end = 0;
        for (size_t s = 0; s < nseg; s++) {
            size_t a = segs[s].offset, b = segs[s].offset + segs[s].numel;
            if (b < a || (s > 0 && a < prev_end))
                return dt_error(DT_ERR_INVALID_ARG,
                                "optimizer: segment %zu [%zu, %zu) is not sorted/disjoint after the previous one "
                                "(ends at %zu)", s, a, b, prev_end);
            prev_end = b;
            if (pass == 1)
                o->seg_no_decay[s] = segs[s].no_decay;
            if (a < l->lo)
                a = l->lo;
            if (b > l->hi)
                b = l->hi;
            for (size_t x = a; x < b; x += DT__OPTIM_CHUNK) {
                if (pass == 1) {
                    dt__optim_item *it = &o->items[count];
                    it->start = x - l->lo;
                    it->len = b - x < DT__OPTIM_CHUNK ? b - x : DT__OPTIM_CHUNK;
                    it->seg = s;
                    it->no_decay = segs[s].no_decay;
                }
                count++;
            }
        }
        if (pass == 0) {
            o->items = calloc(count ? count : 1, sizeof *o->items);
            o->item_sums = calloc(2 * (count ? count : 1), sizeof(double));
            o->seg_sums = calloc(2 * nseg, sizeof(double));
            o->seg_ratio = calloc(nseg, sizeof(float));
            o->seg_no_decay = calloc(nseg, sizeof(bool));
            if (!o->items || !o->item_sums || !o->seg_sums || !o->seg_ratio || !o->seg_no_decay)
                return dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory for %zu work items", count);
            count = 0;
        }
    }
    o->nitem = count;
    o->nseg = nseg;
    o->lo = l->lo;
    o->hi = l->hi;
    return DT_OK;
}

static dt_optim *optim_new(dt_optim_kind kind, const dt_optim_layout *l, int nstate, const char *n0,
                           const char *n1)
{
    dt_optim *o = calloc(1, sizeof *o);
    if (!o) {
        dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory");
        return NULL;
    }
    o->kind = kind;
    if (build_items(o, l) < 0)
        goto fail;
    o->nstate = nstate;
    o->state_name[0] = n0;
    o->state_name[1] = n1;
    for (int i = 0; i < nstate; i++) {
        o->state[i] = dt_calloc((o->hi - o->lo) * sizeof(float));
        if (!o->state[i]) {
            dt_error_wrap(DT_ERR_NO_MEMORY, "optimizer state '%s' (%zu floats)", i ? n1 : n0, o->hi - o->lo);
            goto fail;
        }
    }
    return o;
fail:
    dt_optim_free(o);
    return NULL;
}

static bool bad_beta(double b) { return !(b >= 0.0 && b < 1.0); }

dt_optim *dt_optim_sgd_init(const dt_sgd_params *p, const dt_optim_layout *l)
{
    if (!p) {
        dt_error(DT_ERR_NULL, "sgd: params is NULL");
        return NULL;
    }
    if (!(p->lr >= 0) || !(p->momentum >= 0) || !(p->weight_decay >= 0)) {
        dt_error(DT_ERR_INVALID_ARG, "sgd: lr %g, momentum %g, weight_decay %g must be >= 0", p->lr,
                 p->momentum, p->weight_decay);
        return NULL;
    }
    if (p->nesterov && (p->momentum <= 0 || p->dampening != 0)) {
        dt_error(DT_ERR_INVALID_ARG, "sgd: nesterov momentum requires a momentum and zero dampening");
        return NULL;
    }
    dt_optim *o = optim_new(DT_OPTIM_SGD, l, p->momentum != 0 ? 1 : 0, "momentum_buffer", NULL);
    if (o) {
        o->sgd = *p;
        o->lr = p->lr;
    }
    return o;
}

static dt_optim *adam_init(dt_optim_kind kind, const dt_adam_params *p, const dt_optim_layout *l)
{
    const char *name = kind == DT_OPTIM_ADAM ? "adam" : "adamw";
    if (!p) {
        dt_error(DT_ERR_NULL, "%s: params is NULL", name);
        return NULL;
    }
    if (!(p->lr >= 0) || !(p->eps >= 0) || !(p->weight_decay >= 0) || bad_beta(p->beta1) || bad_beta(p->beta2)) {
        dt_error(DT_ERR_INVALID_ARG, "%s: need lr >= 0 (%g), eps >= 0 (%g), weight_decay >= 0 (%g), "
                 "betas in [0, 1) (%g, %g)", name, p->lr, p->eps, p->weight_decay, p->beta1, p->beta2);
        return NULL;
    }
    dt_optim *o = optim_new(kind, l, 2, "exp_avg", "exp_avg_sq");
    if (o) {
        o->adam = *p;
        o->lr = p->lr;
    }
    return o;
}

dt_optim *dt_optim_adam_init(const dt_adam_params *p, const dt_optim_layout *l)
{
    return adam_init(DT_OPTIM_ADAM, p, l);
}

dt_optim *dt_optim_adamw_init(const dt_adam_params *p, const dt_optim_layout *l)
{
    return adam_init(DT_OPTIM_ADAMW, p, l);
}

dt_optim *dt_optim_lamb_init(const dt_lamb_params *p, const dt_optim_layout *l)
{
    if (!p) {
        dt_error(DT_ERR_NULL, "lamb: params is NULL");
        return NULL;
    }
    if (!(p->lr >= 0) || !(p->eps >= 0) || !(p->weight_decay >= 0) || bad_beta(p->beta1) || bad_beta(p->beta2)) {
        dt_error(DT_ERR_INVALID_ARG, "lamb: need lr >= 0 (%g), eps >= 0 (%g), weight_decay >= 0 (%g), "
                 "betas in [0, 1) (%g, %g)", p->lr, p->eps, p->weight_decay, p->beta1, p->beta2);
        return NULL;
    }
    dt_optim *o = optim_new(DT_OPTIM_LAMB, l, 2, "exp_avg", "exp_avg_sq");
    if (o) {
        o->lamb = *p;
        o->lr = p->lr;
    }
    return o;
}

void dt_optim_free(dt_optim *o)
{
    if (!o)
        return;
    for (int i = 0; i < 2; i++)
        dt_free(o->state[i]);
    free(o->items);
    free(o->item_sums);
    free(o->seg_sums);
    free(o->seg_ratio);
    free(o->seg_no_decay);
    free(o);
}

/* ---- accessors ------------------------------------------------------------------ */

void dt_optim_set_reducer(dt_optim *o, dt_optim_reduce_fn fn, void *ctx)
{
    if (!o)
        return;
    o->reduce = fn;
    o->reduce_ctx = ctx;
}

void dt_optim_set_zero_grad(dt_optim *o, bool on)
{
    if (o)
        o->zero_grad = on;
}

dt_optim_kind dt_optim_get_kind(const dt_optim *o) { return o ? o->kind : DT_OPTIM_KIND_COUNT; }
double dt_optim_get_lr(const dt_optim *o) { return o ? o->lr : 0.0; }
void dt_optim_set_lr(dt_optim *o, double lr)
{
    if (o)
        o->lr = lr;
}
int64_t dt_optim_get_step(const dt_optim *o) { return o ? o->step : 0; }
void dt_optim_set_step(dt_optim *o, int64_t step)
{
    if (o && step >= 0)
        o->step = step;
}
double dt_optim_last_grad_norm(const dt_optim *o) { return o ? o->last_gnorm : 0.0; }
int dt_optim_num_states(const dt_optim *o) { return o ? o->nstate : 0; }

dt_status dt_optim_state(dt_optim *o, int i, const char **name, float **data, size_t *n)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_state: optimizer is NULL");
    if (i < 0 || i >= o->nstate)
        return dt_error(DT_ERR_RANGE, "dt_optim_state: index %d, %s has %d state buffers", i,
                        dt_optim_kind_name(o->kind), o->nstate);
    if (name)
        *name = o->state_name[i];
    if (data)
        *data = o->state[i];
    if (n)
        *n = o->hi - o->lo;
    return DT_OK;
}

/* ---- steps ------------------------------------------------------------------------ */

static void step_sgd(dt_optim *o, float *params, float *grads)
{
    const dt_sgd_params *p = &o->sgd;
    dt__sgd_k k = {.wd = (float)p->weight_decay, .momentum = (float)p->momentum,
                   .one_minus_damp = (float)(1.0 - p->dampening), .neg_lr = (float)(-o->lr),
                   .has_wd = p->weight_decay != 0, .has_momentum = p->momentum != 0,
                   .nesterov = p->nesterov, .first = o->step == 0, .zero_grad = o->zero_grad};
    dt__sgd_k k_nd = k;
    k_nd.has_wd = false;
    const size_t ni = o->nitem;
    float *buf = o->state[0];
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        dt__optim_sgd(params + it->start, grads + it->start, buf ? buf + it->start : NULL, it->len,
                      it->no_decay ? &k_nd : &k);
    }
}

static void step_adam(dt_optim *o, float *params, float *grads)
{
    const dt_adam_params *p = &o->adam;
    const double t = (double)(o->step + 1);
    const double bc1 = 1.0 - pow(p->beta1, t), bc2 = 1.0 - pow(p->beta2, t);
    const double step_size = o->lr / bc1;
    const bool decoupled = o->kind == DT_OPTIM_ADAMW;
    dt__adam_k k = {.wd = (float)p->weight_decay, .decay = (float)(1.0 - o->lr * p->weight_decay),
                    .b1 = (float)p->beta1, .omb1 = (float)(1.0 - p->beta1), .b2 = (float)p->beta2,
                    .omb2 = (float)(1.0 - p->beta2), .bc2_sqrt = (float)sqrt(bc2), .eps = (float)p->eps,
                    .neg_step_size = (float)(-step_size), .l2 = !decoupled && p->weight_decay != 0,
                    .decoupled = decoupled && p->weight_decay != 0, .zero_grad = o->zero_grad};
    dt__adam_k k_nd = k;
    k_nd.l2 = k_nd.decoupled = false;
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        size_t s = it->start;
        dt__optim_adam(params + s, grads + s, o->state[0] + s, o->state[1] + s, it->len,
                       it->no_decay ? &k_nd : &k);
    }
}

/* Per-segment sums of the item sums in slot `which` (0 or 1), in item order. */
static void seg_reduce(dt_optim *o, int which, double *out)
{
    memset(out, 0, o->nseg * sizeof(double));
    for (size_t i = 0; i < o->nitem; i++)
        out[o->items[i].seg] += o->item_sums[2 * i + which];
}

static dt_status step_lamb(dt_optim *o, float *params, float *grads)
{
    const dt_lamb_params *p = &o->lamb;
    const size_t ni = o->nitem, ns = o->nseg;
    /* pass A: ‖g‖² and ‖w‖² per item */
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        o->item_sums[2 * i] = dt__sqsum(grads + it->start, it->len);
        o->item_sums[2 * i + 1] = dt__sqsum(params + it->start, it->len);
    }
    double gsq = 0;
    for (size_t i = 0; i < ni; i++)
        gsq += o->item_sums[2 * i];
    if (o->reduce) {
        dt_status st = o->reduce(o->reduce_ctx, &gsq, 1);
        if (st < 0)
            return dt_error_wrap(st, "lamb: reducing the global grad norm");
    }
    /* ‖w‖² per segment, kept in seg_sums[0..ns) until stage 1 is done */
    seg_reduce(o, 1, o->seg_sums);

    const float gnorm = (float)sqrt(gsq), maxn = (float)p->max_grad_norm;
    o->last_gnorm = gnorm;
    const float clip = (p->max_grad_norm > 0 && gnorm > maxn) ? gnorm / maxn : 1.0f;
    const int64_t t = o->step + 1;
    const float b1 = (float)p->beta1, b2 = (float)p->beta2;
    float bc1 = 1.0f, bc2 = 1.0f;
    if (p->bias_correction) { /* apex: 1 - std::pow(float beta, int step), in double */
        bc1 = (float)(1.0 - pow((double)b1, (double)t));
        bc2 = (float)(1.0 - pow((double)b2, (double)t));
    }
    dt__lamb_k k = {.clip = clip, .decay = (float)p->weight_decay, .b1 = b1,
                    .b3 = p->grad_averaging ? 1.0f - b1 : 1.0f, .b2 = b2, .omb2 = 1.0f - b2,
                    .bc1 = bc1, .bc2 = bc2, .eps = (float)p->eps, .adam_w_mode = p->adam_w_mode};
    dt__lamb_k k_nd = k;
    k_nd.decay = 0.0f;
    /* pass B: stage 1, u into grads, ‖u‖² per item */
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        size_t s = it->start;
        o->item_sums[2 * i] = dt__optim_lamb_stage1(params + s, grads + s, o->state[0] + s, o->state[1] + s,
                                                    it->len, it->no_decay ? &k_nd : &k);
    }
    /* seg_sums = [‖w‖² per seg, ‖u‖² per seg] */
    double *usq = o->seg_sums + ns;
    seg_reduce(o, 0, usq);
    if (o->reduce) {
        dt_status st = o->reduce(o->reduce_ctx, o->seg_sums, 2 * ns);
        if (st < 0)
            return dt_error_wrap(st, "lamb: reducing per-tensor norms");
    }
    const float lr = (float)o->lr;
    for (size_t s = 0; s < ns; s++) {
        /* decay of this segment: apex applies the ratio per group when wd != 0 */
        bool decays = p->weight_decay != 0 && !o->seg_no_decay[s];
        float ratio = lr;
        if (p->use_nvlamb || decays) {
            float pn = (float)sqrt(o->seg_sums[s]), un = (float)sqrt(usq[s]);
            ratio = (un != 0.0f && pn != 0.0f) ? lr * (pn / un) : lr;
        }
        o->seg_ratio[s] = ratio;
    }
    /* pass C: stage 2 */
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        dt__optim_lamb_stage2(params + it->start, grads + it->start, it->len, o->seg_ratio[it->seg], o->zero_grad);
    }
    return DT_OK;
}

dt_status dt_optim_step(dt_optim *o, float *params, float *grads)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_step: optimizer is NULL");
    if ((!params || !grads) && o->hi > o->lo)
        return dt_error(DT_ERR_NULL, "dt_optim_step (%s): %s is NULL", dt_optim_kind_name(o->kind),
                        params ? "grads" : "params");
    /* gradients whose reduction is still in flight (DDP without dt_ddp_wait) */
    if (o->hi > o->lo) {
        dt_status st = dt__inflight_check("dt_optim_step", grads, (o->hi - o->lo) * sizeof(float));
        if (st < 0)
            return st;
    }
    switch (o->kind) {
    case DT_OPTIM_SGD:
        step_sgd(o, params, grads);
        break;
    case DT_OPTIM_ADAM:
    case DT_OPTIM_ADAMW:
        step_adam(o, params, grads);
        break;
    case DT_OPTIM_LAMB: {
        dt_status st = step_lamb(o, params, grads);
        if (st < 0)
            return st;
        break;
    }
    default:
        return dt_error(DT_ERR_INTERNAL, "dt_optim_step: bad optimizer kind %d", (int)o->kind);
    }
    o->step++;
    return DT_OK;
}
