/* Optimizer objects: ranges -> work items, parameter checks, the step driver.
 *
 * The step of each kind is one parallel loop over the work items of all
 * ranges (optim_impl.h)
 * calling an element kernel (optim_kernels.c). Scalars that the references
 * compute in double (PyTorch) are computed in double here and rounded to
 * float once, at the same place. LAMB makes three passes: norms of w and g,
 * stage 1 (moments and update u, written into g, plus ‖u‖), stage 2
 * (p -= lr * ratio * u); between them partial sums are reduced per segment
 * in item order and, with a reducer installed, across ranks. */
#include "optim_impl.h"

#include "base/inflight.h"
#include "dtrain/kernels.h"

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

dt_lion_params dt_lion_params_default(void)
{
    dt_lion_params p = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .weight_decay = 0};
    return p;
}

int dt_optim_kind_num_states(dt_optim_kind k, bool sgd_momentum)
{
    switch (k) {
    case DT_OPTIM_SGD:
        return sgd_momentum ? 1 : 0;
    case DT_OPTIM_ADAM:
    case DT_OPTIM_ADAMW:
    case DT_OPTIM_LAMB:
        return 2;
    case DT_OPTIM_LION:
        return 1;
    default:
        return -1;
    }
}

const char *dt_optim_kind_name(dt_optim_kind k)
{
    static const char *names[] = {"sgd", "adam", "adamw", "lamb", "lion"};
    _Static_assert(DT_OPTIM_KIND_COUNT == 5, "optimizer names");
    return (unsigned)k < DT_OPTIM_KIND_COUNT ? names[k] : "?";
}

/* ---- construction -------------------------------------------------------------- */

typedef struct seg_key {
    const dt_flat *flat;
    size_t offset, numel;
} seg_key;

/* Index of (flat, offset, numel) in the table, appending it when new. */
static size_t seg_index(seg_key *tab, size_t *n, const dt_flat *flat, const dt_optim_segment *sg, bool *fresh)
{
    for (size_t i = *n; i-- > 0;)
        if (tab[i].flat == flat && tab[i].offset == sg->offset && tab[i].numel == sg->numel) {
            *fresh = false;
            return i;
        }
    tab[*n] = (seg_key){flat, sg->offset, sg->numel};
    *fresh = true;
    return (*n)++;
}

static bool float_dtype(dt_dtype t) { return t == DT_F32 || t == DT_BF16 || t == DT_F16; }

dt_status dt__optim_check_range(const dt_optim_range *r, size_t i)
{
    if (!r->params || !r->grads)
        return dt_error(DT_ERR_NULL, "optimizer: range %zu has no %s flat", i, r->params ? "grads" : "params");
    if (r->params->dtype != DT_F32 || !float_dtype(r->grads->dtype) || (r->mirror && !float_dtype(r->mirror->dtype)))
        return dt_error(DT_ERR_DTYPE,
                        "optimizer: range %zu has params %s, grads %s, mirror %s; params must be f32 (the master "
                        "weights under mixed precision), grads and mirror f32, bf16 or f16",
                        i, dt_dtype_name(r->params->dtype), dt_dtype_name(r->grads->dtype),
                        r->mirror ? dt_dtype_name(r->mirror->dtype) : "none");
    if (r->mirror == r->params || r->mirror == r->grads || r->grads == r->params)
        return dt_error(DT_ERR_INVALID_ARG, "optimizer: range %zu names one flat twice (params, grads, mirror)", i);
    if (r->hi < r->lo)
        return dt_error(DT_ERR_INVALID_ARG, "optimizer: range %zu [%zu, %zu) has hi < lo", i, r->lo, r->hi);
    if (r->nseg && !r->segs)
        return dt_error(DT_ERR_NULL, "optimizer: range %zu has nseg %zu but segs is NULL", i, r->nseg);
    return DT_OK;
}

static size_t item_gstart(const dt_optim *o, size_t i)
{
    return o->ranges[o->items[i].range].lo + o->items[i].start;
}

/* Item a before item b: by segment, then by global position. */
static bool item_before(const dt_optim *o, size_t a, size_t b)
{
    const dt__optim_item *x = &o->items[a], *y = &o->items[b];
    if (x->seg != y->seg)
        return x->seg < y->seg;
    return item_gstart(o, a) < item_gstart(o, b);
}

/* Stable bottom-up merge sort of idx[0..n) (qsort has no context argument,
 * and optimizers are created concurrently by ranks that are threads). */
static void sort_items(const dt_optim *o, size_t *idx, size_t *tmp, size_t n)
{
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = item_before(o, idx[j], idx[i]) ? idx[j++] : idx[i++];
            while (i < mid)
                tmp[k++] = idx[i++];
            while (j < hi)
                tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, n * sizeof *idx);
    }
}

/* Norm units (optim_impl.h): items sorted by (segment, position), runs of
 * one chunk that are contiguous in one flat pair merged. */
static dt_status build_units(dt_optim *o)
{
    size_t n = o->nitem;
    o->uitems = calloc(n ? n : 1, sizeof *o->uitems);
    o->units = calloc(n ? n : 1, sizeof *o->units);
    o->unit_sums = calloc(2 * (n ? n : 1), sizeof(double));
    if (!o->uitems || !o->units || !o->unit_sums)
        return dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory for %zu work items", n);
    for (size_t i = 0; i < n; i++)
        o->uitems[i] = i;
    size_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp)
        return dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory for %zu work items", n);
    sort_items(o, o->uitems, tmp, n);
    free(tmp);
    size_t nu = 0;
    for (size_t j = 0; j < n; j++) {
        size_t i = o->uitems[j];
        const dt__optim_item *it = &o->items[i];
        size_t g = item_gstart(o, i);
        dt__optim_unit *u = nu ? &o->units[nu - 1] : NULL;
        if (u) {
            const dt__optim_range *ru = &o->ranges[u->range], *ri = &o->ranges[it->range];
            size_t off = o->seg_off[it->seg];
            bool same_chunk = (u->gstart - off) / DT__OPTIM_CHUNK == (g - off) / DT__OPTIM_CHUNK;
            /* low-precision grads are read from per-range f32 copies: no run across ranges */
            if (u->seg == it->seg && same_chunk && u->gstart + u->len == g && ru->params == ri->params &&
                ru->grads == ri->grads && (u->range == it->range || !ri->g32)) {
                u->len += it->len;
                u->count++;
                continue;
            }
        }
        o->units[nu++] = (dt__optim_unit){.seg = it->seg, .gstart = g, .len = it->len, .range = it->range,
                                          .first = j, .count = 1};
    }
    o->nunit = nu;
    return DT_OK;
}

static dt_status build_items(dt_optim *o, const dt_optim_range *rs, size_t nr)
{
    if (!rs && nr)
        return dt_error(DT_ERR_NULL, "optimizer: ranges is NULL (nrange %zu)", nr);
    size_t total_segs = 0;
    for (size_t r = 0; r < nr; r++) {
        dt_status st = dt__optim_check_range(&rs[r], r);
        if (st < 0)
            return st;
        for (size_t q = 0; q < r; q++) /* ranges over one flat must not overlap */
            if (rs[q].params == rs[r].params && rs[q].lo < rs[r].hi && rs[r].lo < rs[q].hi)
                return dt_error(DT_ERR_INVALID_ARG, "optimizer: ranges %zu [%zu, %zu) and %zu [%zu, %zu) overlap in "
                                "one params flat", q, rs[q].lo, rs[q].hi, r, rs[r].lo, rs[r].hi);
        total_segs += rs[r].segs ? rs[r].nseg : 1;
    }
    o->nrange = nr;
    o->ranges = calloc(nr ? nr : 1, sizeof *o->ranges);
    o->pbase = calloc(nr ? nr : 1, sizeof *o->pbase);
    o->gbase = calloc(nr ? nr : 1, sizeof *o->gbase);
    o->mbase = calloc(nr ? nr : 1, sizeof *o->mbase);
    seg_key *tab = calloc(total_segs ? total_segs : 1, sizeof *tab);
    size_t *idx = calloc(total_segs ? total_segs : 1, sizeof *idx);
    bool *nd = calloc(total_segs ? total_segs : 1, sizeof *nd);
    dt_status st = DT_OK;
    if (!o->ranges || !o->pbase || !o->gbase || !o->mbase || !tab || !idx || !nd) {
        st = dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory for %zu ranges", nr);
        goto done;
    }
    /* the segment table, in order of first appearance */
    size_t ntab = 0, k = 0;
    for (size_t r = 0; r < nr; r++) {
        const dt_optim_range *l = &rs[r];
        dt_optim_segment whole = {l->lo, l->hi - l->lo, false};
        const dt_optim_segment *segs = l->segs ? l->segs : &whole;
        size_t nseg = l->segs ? l->nseg : 1, prev_end = 0;
        for (size_t s = 0; s < nseg; s++, k++) {
            size_t a = segs[s].offset, b = segs[s].offset + segs[s].numel;
            if (b < a || (s > 0 && a < prev_end)) {
                st = dt_error(DT_ERR_INVALID_ARG,
                              "optimizer: range %zu segment %zu [%zu, %zu) is not sorted/disjoint after the previous "
                              "one (ends at %zu)", r, s, a, b, prev_end);
                goto done;
            }
            prev_end = b;
            bool fresh;
            idx[k] = seg_index(tab, &ntab, l->params, &segs[s], &fresh);
            if (fresh)
                nd[idx[k]] = segs[s].no_decay;
        }
    }
    size_t count = 0;
    for (int pass = 0; pass < 2; pass++) {
        k = 0;
        count = 0;
        for (size_t r = 0; r < nr; r++) {
            const dt_optim_range *l = &rs[r];
            dt_optim_segment whole = {l->lo, l->hi - l->lo, false};
            const dt_optim_segment *segs = l->segs ? l->segs : &whole;
            size_t nseg = l->segs ? l->nseg : 1;
            for (size_t s = 0; s < nseg; s++, k++) {
                size_t a = segs[s].offset, b = segs[s].offset + segs[s].numel;
                if (a < l->lo)
                    a = l->lo;
                if (b > l->hi)
                    b = l->hi;
                /* cut at the segment's fixed chunk boundaries */
                for (size_t x = a; x < b;) {
                    size_t off = segs[s].offset, e = off + ((x - off) / DT__OPTIM_CHUNK + 1) * DT__OPTIM_CHUNK;
                    if (e > b)
                        e = b;
                    if (pass == 1)
                        o->items[count] = (dt__optim_item){.range = r, .start = x - l->lo, .len = e - x,
                                                           .seg = idx[k], .no_decay = nd[idx[k]]};
                    count++;
                    x = e;
                }
            }
        }
        if (pass == 0) {
            o->items = calloc(count ? count : 1, sizeof *o->items);
            o->item_sums = calloc(2 * (count ? count : 1), sizeof(double));
            o->seg_sums = calloc(2 * (ntab ? ntab : 1), sizeof(double));
            o->seg_ratio = calloc(ntab ? ntab : 1, sizeof(float));
            o->seg_no_decay = calloc(ntab ? ntab : 1, sizeof(bool));
            if (!o->items || !o->item_sums || !o->seg_sums || !o->seg_ratio || !o->seg_no_decay) {
                st = dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory for %zu work items", count);
                goto done;
            }
        }
    }
    memcpy(o->seg_no_decay, nd, ntab * sizeof(bool));
    o->nitem = count;
    o->nseg = ntab;
    for (size_t r = 0; r < nr; r++)
        o->ranges[r] = (dt__optim_range){.params = rs[r].params, .grads = rs[r].grads, .mirror = rs[r].mirror,
                                         .lo = rs[r].lo, .hi = rs[r].hi};
    for (size_t r = 0; r < nr; r++) /* before build_units, which must not merge across these */
        if (rs[r].grads->dtype != DT_F32 && rs[r].hi > rs[r].lo &&
            !(o->ranges[r].g32 = dt_alloc((rs[r].hi - rs[r].lo) * sizeof(float)))) {
            st = dt_error_wrap(DT_ERR_NO_MEMORY, "optimizer: f32 copy of the %s gradients of range %zu (%zu floats)",
                               dt_dtype_name(rs[r].grads->dtype), r, rs[r].hi - rs[r].lo);
            goto done;
        }
    o->seg_off = calloc(ntab ? ntab : 1, sizeof *o->seg_off);
    if (!o->seg_off) {
        st = dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory");
        goto done;
    }
    for (size_t i = 0; i < ntab; i++)
        o->seg_off[i] = tab[i].offset;
    st = build_units(o);
done:
    free(tab);
    free(idx);
    free(nd);
    return st;
}

/* Zero state buffer st of range r (n floats): the elements its items step
 * are written (committed now, so the first step takes no page fault); the
 * elements no item covers are zeroed by giving their whole pages back
 * (dt_decommit). Within a range that is alignment padding (no whole page),
 * but an interleaved pipeline rank's range spans the other ranks' stages
 * between its chunks: their state is never touched and holds no memory.
 * Adjacent items (a parameter's chunks) are written as one span by
 * dt_memzero, on the compute threads: zeroed item by item, the moments of
 * GPT-2 124M (1 GB of fresh pages) took one core about 4 s on a VM. */
static void zero_state(const dt_optim *o, size_t r, float *st, size_t n)
{
    size_t prev = 0, run = 0; /* [run, prev): the items' elements not written yet */
    for (size_t i = 0; i < o->nitem; i++) {
        const dt__optim_item *it = &o->items[i];
        if (it->range != r)
            continue;
        if (it->start > prev) {
            dt_memzero(st + run, (prev - run) * sizeof *st);
            dt_decommit(st + prev, (it->start - prev) * sizeof *st);
            run = it->start;
        } else if (it->start < run) { /* before the current span (items out of order) */
            dt_memzero(st + it->start, it->len * sizeof *st);
        }
        if (it->start + it->len > prev)
            prev = it->start + it->len;
    }
    dt_memzero(st + run, (prev - run) * sizeof *st);
    if (n > prev)
        dt_decommit(st + prev, (n - prev) * sizeof *st);
}

static dt_status optim_new(dt_optim_kind kind, const dt_optim_range *rs, size_t nr, int nstate, const char *n0,
                           const char *n1, dt_optim **out)
{
    dt_optim *o = calloc(1, sizeof *o);
    if (!o)
        return dt_error(DT_ERR_NO_MEMORY, "optimizer: out of memory");
    o->kind = kind;
    dt_status st = build_items(o, rs, nr);
    if (st < 0)
        goto fail;
    o->nstate = nstate;
    o->state_name[0] = n0;
    o->state_name[1] = n1;
    for (size_t r = 0; r < o->nrange; r++)
        for (int i = 0; i < nstate; i++) {
            dt__optim_range *rg = &o->ranges[r];
            rg->state[i] = dt_alloc((rg->hi - rg->lo) * sizeof(float));
            if (!rg->state[i] && rg->hi > rg->lo) {
                st = dt_error_wrap(DT_ERR_NO_MEMORY, "optimizer state '%s' (%zu floats)", i ? n1 : n0, rg->hi - rg->lo);
                goto fail;
            }
            if (rg->state[i])
                zero_state(o, r, rg->state[i], rg->hi - rg->lo);
        }
    *out = o;
    return DT_OK;
fail:
    dt_optim_free(o);
    return st;
}

static bool bad_beta(double b) { return !(b >= 0.0 && b < 1.0); }

#define OUT_CHECK(name)                                                                                          \
    do {                                                                                                         \
        if (!out)                                                                                                \
            return dt_error(DT_ERR_NULL, "%s: out is NULL", name);                                                \
        *out = NULL;                                                                                             \
        if (!p)                                                                                                  \
            return dt_error(DT_ERR_NULL, "%s: params is NULL", name);                                             \
    } while (0)

dt_status dt_optim_sgd_init(const dt_sgd_params *p, const dt_optim_range *ranges, size_t nrange, dt_optim **out)
{
    OUT_CHECK("sgd");
    if (!(p->lr >= 0) || !(p->momentum >= 0) || !(p->weight_decay >= 0))
        return dt_error(DT_ERR_INVALID_ARG, "sgd: lr %g, momentum %g, weight_decay %g must be >= 0", p->lr,
                        p->momentum, p->weight_decay);
    if (p->nesterov && (p->momentum <= 0 || p->dampening != 0))
        return dt_error(DT_ERR_INVALID_ARG, "sgd: nesterov momentum requires a momentum and zero dampening");
    dt_status st = optim_new(DT_OPTIM_SGD, ranges, nrange, p->momentum != 0 ? 1 : 0, "momentum_buffer", NULL, out);
    if (st >= 0) {
        (*out)->sgd = *p;
        (*out)->lr = p->lr;
    }
    return st;
}

static dt_status adam_init(dt_optim_kind kind, const dt_adam_params *p, const dt_optim_range *ranges, size_t nrange,
                           dt_optim **out)
{
    const char *name = kind == DT_OPTIM_ADAM ? "adam" : "adamw";
    OUT_CHECK(name);
    if (!(p->lr >= 0) || !(p->eps >= 0) || !(p->weight_decay >= 0) || bad_beta(p->beta1) || bad_beta(p->beta2))
        return dt_error(DT_ERR_INVALID_ARG, "%s: need lr >= 0 (%g), eps >= 0 (%g), weight_decay >= 0 (%g), "
                        "betas in [0, 1) (%g, %g)", name, p->lr, p->eps, p->weight_decay, p->beta1, p->beta2);
    dt_status st = optim_new(kind, ranges, nrange, 2, "exp_avg", "exp_avg_sq", out);
    if (st >= 0) {
        (*out)->adam = *p;
        (*out)->lr = p->lr;
    }
    return st;
}

dt_status dt_optim_adam_init(const dt_adam_params *p, const dt_optim_range *ranges, size_t nrange, dt_optim **out)
{
    return adam_init(DT_OPTIM_ADAM, p, ranges, nrange, out);
}

dt_status dt_optim_adamw_init(const dt_adam_params *p, const dt_optim_range *ranges, size_t nrange, dt_optim **out)
{
    return adam_init(DT_OPTIM_ADAMW, p, ranges, nrange, out);
}

dt_status dt_optim_lamb_init(const dt_lamb_params *p, const dt_optim_range *ranges, size_t nrange, dt_optim **out)
{
    OUT_CHECK("lamb");
    if (!(p->lr >= 0) || !(p->eps >= 0) || !(p->weight_decay >= 0) || bad_beta(p->beta1) || bad_beta(p->beta2))
        return dt_error(DT_ERR_INVALID_ARG, "lamb: need lr >= 0 (%g), eps >= 0 (%g), weight_decay >= 0 (%g), "
                        "betas in [0, 1) (%g, %g)", p->lr, p->eps, p->weight_decay, p->beta1, p->beta2);
    dt_status st = optim_new(DT_OPTIM_LAMB, ranges, nrange, 2, "exp_avg", "exp_avg_sq", out);
    if (st >= 0) {
        (*out)->lamb = *p;
        (*out)->lr = p->lr;
    }
    return st;
}

dt_status dt_optim_lion_init(const dt_lion_params *p, const dt_optim_range *ranges, size_t nrange, dt_optim **out)
{
    OUT_CHECK("lion");
    if (!(p->lr >= 0) || !isfinite(p->lr) || !(p->weight_decay >= 0) || bad_beta(p->beta1) || bad_beta(p->beta2))
        return dt_error(DT_ERR_INVALID_ARG, "lion: need lr >= 0 (%g), weight_decay >= 0 (%g), betas in [0, 1) "
                        "(%g, %g)", p->lr, p->weight_decay, p->beta1, p->beta2);
    dt_status st = optim_new(DT_OPTIM_LION, ranges, nrange, 1, "exp_avg", NULL, out);
    if (st >= 0) {
        (*out)->lion = *p;
        (*out)->lr = p->lr;
    }
    return st;
}

dt_status dt_optim_init(dt_optim_kind kind, const void *hparams, const dt_optim_range *ranges, size_t nrange,
                        dt_optim **out)
{
    switch (kind) {
    case DT_OPTIM_SGD:
        return dt_optim_sgd_init(hparams, ranges, nrange, out);
    case DT_OPTIM_ADAM:
        return dt_optim_adam_init(hparams, ranges, nrange, out);
    case DT_OPTIM_ADAMW:
        return dt_optim_adamw_init(hparams, ranges, nrange, out);
    case DT_OPTIM_LAMB:
        return dt_optim_lamb_init(hparams, ranges, nrange, out);
    case DT_OPTIM_LION:
        return dt_optim_lion_init(hparams, ranges, nrange, out);
    default:
        if (out)
            *out = NULL;
        return dt_error(DT_ERR_INVALID_ARG, "dt_optim_init: unknown optimizer kind %d", (int)kind);
    }
}

void dt_optim_free(dt_optim *o)
{
    if (!o)
        return;
    for (size_t r = 0; o->ranges && r < o->nrange; r++)
    {
        for (int i = 0; i < 2; i++)
            dt_free(o->ranges[r].state[i]);
        dt_free(o->ranges[r].g32);
    }
    free(o->ranges);
    free(o->pbase);
    free(o->gbase);
    free(o->mbase);
    free(o->items);
    free(o->units);
    free(o->uitems);
    free(o->unit_sums);
    free(o->seg_off);
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
dt_status dt_optim_set_lr(dt_optim *o, double lr)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_set_lr: optimizer is NULL");
    if (!(lr >= 0) || !isfinite(lr))
        return dt_error(DT_ERR_INVALID_ARG, "dt_optim_set_lr: learning rate %g must be finite and >= 0 (kept %g)",
                        lr, o->lr);
    o->lr = lr;
    return DT_OK;
}
int64_t dt_optim_get_step(const dt_optim *o) { return o ? o->step : 0; }
dt_status dt_optim_set_step(dt_optim *o, int64_t step)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_set_step: optimizer is NULL");
    if (step < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_optim_set_step: step %lld must be >= 0", (long long)step);
    o->step = step;
    return DT_OK;
}
dt_status dt_optim_set_betas(dt_optim *o, double beta1, double beta2)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_set_betas: optimizer is NULL");
    if (o->kind == DT_OPTIM_SGD)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_optim_set_betas: sgd has no betas");
    if (bad_beta(beta1) || bad_beta(beta2))
        return dt_error(DT_ERR_INVALID_ARG, "dt_optim_set_betas: betas (%g, %g) must be in [0, 1)", beta1, beta2);
    if (o->kind == DT_OPTIM_LAMB)
        o->lamb.beta1 = beta1, o->lamb.beta2 = beta2;
    else if (o->kind == DT_OPTIM_LION)
        o->lion.beta1 = beta1, o->lion.beta2 = beta2;
    else
        o->adam.beta1 = beta1, o->adam.beta2 = beta2;
    return DT_OK;
}
dt_status dt_optim_get_betas(const dt_optim *o, double *beta1, double *beta2)
{
    if (!o || !beta1 || !beta2)
        return dt_error(DT_ERR_NULL, "dt_optim_get_betas: NULL argument");
    if (o->kind == DT_OPTIM_SGD)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_optim_get_betas: sgd has no betas");
    const bool l = o->kind == DT_OPTIM_LAMB, n = o->kind == DT_OPTIM_LION;
    *beta1 = l ? o->lamb.beta1 : n ? o->lion.beta1 : o->adam.beta1;
    *beta2 = l ? o->lamb.beta2 : n ? o->lion.beta2 : o->adam.beta2;
    return DT_OK;
}
double dt_optim_last_grad_norm(const dt_optim *o) { return o ? o->last_gnorm : 0.0; }
int dt_optim_num_states(const dt_optim *o) { return o ? o->nstate : 0; }

size_t dt_optim_num_ranges(const dt_optim *o) { return o ? o->nrange : 0; }

size_t dt_optim_range_held(const dt_optim *o, size_t range)
{
    if (!o || range >= o->nrange)
        return 0;
    const dt__optim_range *rg = &o->ranges[range];
    size_t idle = 0, end = 0;
    bool first = true;
    for (size_t i = 0; i < o->nitem; i++) { /* a range's items are in offset order */
        const dt__optim_item *it = &o->items[i];
        if (it->range != range)
            continue;
        if (!first && it->start > end + DT_ALIGN) /* more than an entry's alignment padding */
            idle += it->start - end;
        first = false;
        if (it->start + it->len > end)
            end = it->start + it->len;
    }
    return rg->hi - rg->lo - idle;
}

dt_status dt_optim_state(dt_optim *o, size_t range, int i, const char **name, float **data, size_t *n)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_state: optimizer is NULL");
    if (i < 0 || i >= o->nstate || range >= o->nrange)
        return dt_error(DT_ERR_RANGE, "dt_optim_state: state %d of range %zu; %s has %d state buffers and %zu ranges",
                        i, range, dt_optim_kind_name(o->kind), o->nstate, o->nrange);
    if (name)
        *name = o->state_name[i];
    if (data)
        *data = o->ranges[range].state[i];
    if (n)
        *n = o->ranges[range].hi - o->ranges[range].lo;
    return DT_OK;
}

int dt_optim_state_find(const dt_optim *o, const char *name)
{
    for (int i = 0; o && name && i < o->nstate; i++)
        if (!strcmp(o->state_name[i], name))
            return i;
    return -1;
}

/* The range over params that owns global element x, or NULL. */
static const dt__optim_range *owner_of(const dt_optim *o, const dt_flat *params, size_t x)
{
    for (size_t r = 0; r < o->nrange; r++) {
        const dt__optim_range *rg = &o->ranges[r];
        if (rg->params == params && rg->lo <= x && x < rg->hi)
            return rg;
    }
    return NULL;
}

/* Copy [lo, hi) of state i between the owning ranges and buf (out: to buf). */
static dt_status state_copy(const dt_optim *o, const dt_flat *params, int i, size_t lo, size_t hi, float *buf,
                            bool out, const char *fn)
{
    if (!o || !params || (!buf && hi > lo))
        return dt_error(DT_ERR_NULL, "%s: NULL %s", fn, !o ? "optimizer" : !params ? "params flat" : "buffer");
    if (i < 0 || i >= o->nstate)
        return dt_error(DT_ERR_RANGE, "%s: state %d; %s has %d state buffers", fn, i, dt_optim_kind_name(o->kind),
                        o->nstate);
    if (hi < lo)
        return dt_error(DT_ERR_INVALID_ARG, "%s: range [%zu, %zu)", fn, lo, hi);
    for (size_t x = lo; x < hi;) { /* check first: nothing is copied on error */
        const dt__optim_range *rg = owner_of(o, params, x);
        if (!rg)
            return dt_error(DT_ERR_RANGE, "%s: element %zu of the params flat is not owned by this optimizer", fn,
                            x);
        x = rg->hi < hi ? rg->hi : hi;
    }
    for (size_t x = lo; x < hi;) {
        const dt__optim_range *rg = owner_of(o, params, x);
        size_t end = rg->hi < hi ? rg->hi : hi;
        float *st = rg->state[i] + (x - rg->lo);
        if (out)
            memcpy(buf + (x - lo), st, (end - x) * sizeof(float));
        else
            memcpy(st, buf + (x - lo), (end - x) * sizeof(float));
        x = end;
    }
    return DT_OK;
}

dt_status dt_optim_state_read(const dt_optim *o, const dt_flat *params, int i, size_t lo, size_t hi, float *dst)
{
    return state_copy(o, params, i, lo, hi, dst, true, "dt_optim_state_read");
}

dt_status dt_optim_state_write(dt_optim *o, const dt_flat *params, int i, size_t lo, size_t hi, const float *src)
{
    return state_copy(o, params, i, lo, hi, (float *)src, false, "dt_optim_state_write");
}

/* ---- steps ------------------------------------------------------------------------ */

void dt__optim_sgd_k_make(const dt_optim *o, dt__sgd_k *k, dt__sgd_k *k_nd)
{
    const dt_sgd_params *p = &o->sgd;
    *k = (dt__sgd_k){.wd = (float)p->weight_decay, .momentum = (float)p->momentum,
                     .one_minus_damp = (float)(1.0 - p->dampening), .neg_lr = (float)(-o->lr),
                     .has_wd = p->weight_decay != 0, .has_momentum = p->momentum != 0,
                     .nesterov = p->nesterov, .first = o->step == 0, .zero_grad = o->zero_grad};
    *k_nd = *k;
    k_nd->has_wd = false;
}

void dt__optim_lion_k_make(const dt_optim *o, dt__lion_k *k, dt__lion_k *k_nd)
{
    const dt_lion_params *p = &o->lion;
    *k = (dt__lion_k){.b1 = (float)p->beta1, .omb1 = (float)(1.0 - p->beta1), .b2 = (float)p->beta2,
                      .omb2 = (float)(1.0 - p->beta2), .neg_lr = (float)(-o->lr),
                      .decay = (float)(1.0 - o->lr * p->weight_decay), .zero_grad = o->zero_grad};
    *k_nd = *k;
    k_nd->decay = 1.0f;
}

static void step_lion(dt_optim *o)
{
    dt__lion_k k, k_nd;
    dt__optim_lion_k_make(o, &k, &k_nd);
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        dt__optim_lion(o->pbase[it->range] + it->start, o->gbase[it->range] + it->start,
                       o->ranges[it->range].state[0] + it->start, it->len, it->no_decay ? &k_nd : &k);
    }
}

static void step_sgd(dt_optim *o)
{
    dt__sgd_k k, k_nd;
    dt__optim_sgd_k_make(o, &k, &k_nd);
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        float *buf = o->ranges[it->range].state[0];
        dt__optim_sgd(o->pbase[it->range] + it->start, o->gbase[it->range] + it->start,
                      buf ? buf + it->start : NULL, it->len, it->no_decay ? &k_nd : &k);
    }
}

void dt__optim_adam_k_make(const dt_optim *o, dt__adam_k *k, dt__adam_k *k_nd)
{
    const dt_adam_params *p = &o->adam;
    const double t = (double)(o->step + 1);
    const double bc1 = 1.0 - pow(p->beta1, t), bc2 = 1.0 - pow(p->beta2, t);
    const double step_size = o->lr / bc1;
    const bool decoupled = o->kind == DT_OPTIM_ADAMW;
    *k = (dt__adam_k){.wd = (float)p->weight_decay, .decay = (float)(1.0 - o->lr * p->weight_decay),
                      .b1 = (float)p->beta1, .omb1 = (float)(1.0 - p->beta1), .b2 = (float)p->beta2,
                      .omb2 = (float)(1.0 - p->beta2), .bc2_sqrt = (float)sqrt(bc2), .eps = (float)p->eps,
                      .neg_step_size = (float)(-step_size), .l2 = !decoupled && p->weight_decay != 0,
                      .decoupled = decoupled && p->weight_decay != 0, .zero_grad = o->zero_grad};
    *k_nd = *k;
    k_nd->l2 = k_nd->decoupled = false;
}

static void step_adam(dt_optim *o)
{
    dt__adam_k k, k_nd;
    dt__optim_adam_k_make(o, &k, &k_nd);
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        size_t s = it->start;
        float *const *st = o->ranges[it->range].state;
        dt__optim_adam(o->pbase[it->range] + s, o->gbase[it->range] + s, st[0] + s, st[1] + s, it->len,
                       it->no_decay ? &k_nd : &k);
    }
}

/* Per-segment sums of the unit sums in slot `which` (0 or 1), in unit order. */
static void seg_reduce(dt_optim *o, int which, double *out)
{
    memset(out, 0, o->nseg * sizeof(double));
    for (size_t i = 0; i < o->nunit; i++)
        out[o->units[i].seg] += o->unit_sums[2 * i + which];
}

static dt_status step_lamb(dt_optim *o)
{
    const dt_lamb_params *p = &o->lamb;
    const size_t ni = o->nitem, ns = o->nseg, nu = o->nunit;
    /* pass A: ‖g‖² and ‖w‖² per norm unit */
#pragma omp parallel for schedule(static) if (nu > 1)
    for (size_t i = 0; i < nu; i++) {
        const dt__optim_unit *u = &o->units[i];
        const dt__optim_range *r = &o->ranges[u->range];
        o->unit_sums[2 * i] = dt__sqsum(o->gbase[u->range] + (u->gstart - r->lo), u->len);
        o->unit_sums[2 * i + 1] = dt__sqsum(dt_flat_ptr(r->params, u->gstart), u->len);
    }
    double gsq = 0;
    for (size_t i = 0; i < nu; i++)
        gsq += o->unit_sums[2 * i];
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
        float *const *st = o->ranges[it->range].state;
        o->item_sums[2 * i] = dt__optim_lamb_stage1(o->pbase[it->range] + s, o->gbase[it->range] + s, st[0] + s,
                                                    st[1] + s, it->len, it->no_decay ? &k_nd : &k);
    }
    /* ‖u‖² per unit: the fused value of a one-item unit, else the run read
     * again in one piece */
#pragma omp parallel for schedule(static) if (nu > 1)
    for (size_t i = 0; i < nu; i++) {
        const dt__optim_unit *u = &o->units[i];
        o->unit_sums[2 * i] = u->count == 1 ? o->item_sums[2 * o->uitems[u->first]]
                                            : dt__sqsum(o->gbase[u->range] + (u->gstart - o->ranges[u->range].lo),
                                                        u->len);
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
        dt__optim_lamb_stage2(o->pbase[it->range] + it->start, o->gbase[it->range] + it->start, it->len,
                              o->seg_ratio[it->seg], o->zero_grad);
    }
    return DT_OK;
}

/* Resolve every range's element lo in its flats (they may have moved since
 * the last step: DDP rebinds gradients, a strategy re-points a shard). */
static dt_status resolve(dt_optim *o)
{
    for (size_t r = 0; r < o->nrange; r++) {
        const dt__optim_range *rg = &o->ranges[r];
        if (rg->hi == rg->lo) {
            o->pbase[r] = o->gbase[r] = NULL;
            o->mbase[r] = NULL;
            continue;
        }
        static const char *const what[3] = {"params", "grads", "mirror"};
        const dt_flat *fl[3] = {rg->params, rg->grads, rg->mirror};
        for (int k = 0; k < 3; k++)
            if (fl[k] && (!fl[k]->base || rg->lo < fl[k]->offset || rg->hi > fl[k]->offset + fl[k]->numel))
                return dt_error(fl[k]->base ? DT_ERR_RANGE : DT_ERR_NULL,
                                "dt_optim_step (%s): range %zu [%zu, %zu) is not held by its %s flat ([%zu, %zu)%s)",
                                dt_optim_kind_name(o->kind), r, rg->lo, rg->hi, what[k],
                                fl[k]->offset, fl[k]->offset + fl[k]->numel, fl[k]->base ? "" : ", no memory");
        o->pbase[r] = dt_flat_ptr(rg->params, rg->lo);
        o->gbase[r] = rg->g32 ? rg->g32 : (float *)dt_flat_ptr(rg->grads, rg->lo);
        o->mbase[r] = rg->mirror ? dt_flat_ptr(rg->mirror, rg->lo) : NULL;
    }
    return DT_OK;
}

/* Gradients still being reduced (DDP without dt_ddp_wait): refuse to read them. */
static dt_status inflight(dt_optim *o, const char *who)
{
    for (size_t r = 0; r < o->nrange; r++) {
        const dt__optim_range *rg = &o->ranges[r];
        if (rg->hi == rg->lo)
            continue;
        dt_status st = dt__inflight_check(who, dt_flat_ptr(rg->grads, rg->lo),
                                          (rg->hi - rg->lo) * dt_dtype_size(rg->grads->dtype));
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* g[0..n) *= inv (skipped for 1) in f32; true when an element is not finite
 * (checked after the multiply: an overflow of the product counts too). */
static bool scale_check(float *g, size_t n, float inv)
{
    float acc = 0.0f; /* inf * 0 and NaN * 0 are NaN, and NaN propagates */
    if (inv == 1.0f) {
        for (size_t i = 0; i < n; i++)
            acc += g[i] * 0.0f;
    } else {
        for (size_t i = 0; i < n; i++) {
            float v = g[i] * inv;
            g[i] = v;
            acc += v * 0.0f;
        }
    }
    return acc != 0.0f;
}

/* The fused unscale/widen/check pass over every item (optim.h). */
static void unscale_pass(dt_optim *o, float inv, bool *found)
{
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        const dt__optim_range *rg = &o->ranges[it->range];
        float *g = o->gbase[it->range] + it->start;
        if (rg->g32) {
            void *src = dt_flat_ptr(rg->grads, rg->lo + it->start);
            dt_k_convert(src, rg->grads->dtype, g, DT_F32, (int64_t)it->len);
            if (o->zero_grad)
                memset(src, 0, it->len * dt_dtype_size(rg->grads->dtype));
        }
        o->item_sums[2 * i] = scale_check(g, it->len, inv) ? 1.0 : 0.0;
    }
    bool bad = false;
    for (size_t i = 0; i < ni; i++)
        bad |= o->item_sums[2 * i] != 0.0;
    if (found)
        *found = bad;
    o->grads_ready = true;
}

dt_status dt_optim_unscale_grads(dt_optim *o, float inv_scale, bool *found_inf)
{
    if (found_inf)
        *found_inf = false;
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_unscale_grads: optimizer is NULL");
    if (!(inv_scale > 0) || !isfinite(inv_scale))
        return dt_error(DT_ERR_INVALID_ARG, "dt_optim_unscale_grads: inv_scale %g (need a finite value > 0)",
                        (double)inv_scale);
    dt_status st = resolve(o);
    if (st < 0 || (st = inflight(o, "dt_optim_unscale_grads")) < 0)
        return st;
    unscale_pass(o, inv_scale, found_inf);
    return DT_OK;
}

dt_status dt_optim_grads_f32(dt_optim *o, size_t r, float **g, size_t *n)
{
    if (!o || !g || !n)
        return dt_error(DT_ERR_NULL, "dt_optim_grads_f32: NULL argument");
    if (r >= o->nrange)
        return dt_error(DT_ERR_RANGE, "dt_optim_grads_f32: range %zu of %zu", r, o->nrange);
    dt_status st = resolve(o);
    if (st < 0)
        return st;
    *g = o->gbase[r];
    *n = o->ranges[r].hi - o->ranges[r].lo;
    return DT_OK;
}

/* mirror[lo, hi) = round(master[lo, hi)) for every range with a mirror. */
static void refresh_mirrors(dt_optim *o)
{
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        const dt__optim_item *it = &o->items[i];
        const dt__optim_range *rg = &o->ranges[it->range];
        if (!rg->mirror)
            continue;
        char *m = (char *)o->mbase[it->range] + it->start * dt_dtype_size(rg->mirror->dtype);
        dt_k_convert(o->pbase[it->range] + it->start, DT_F32, m, rg->mirror->dtype, (int64_t)it->len);
    }
}

dt_status dt_optim_master_alloc(const dt_flat *lp, size_t lo, size_t hi, dt_flat *master)
{
    return dt_optim_master_alloc_segments(lp, lo, hi, NULL, 0, master);
}

dt_status dt_optim_master_alloc_segments(const dt_flat *lp, size_t lo, size_t hi, const dt_optim_segment *segs,
                                         size_t nseg, dt_flat *master)
{
    if (!lp || !master)
        return dt_error(DT_ERR_NULL, "dt_optim_master_alloc: %s is NULL", lp ? "master" : "flat");
    memset(master, 0, sizeof *master);
    if (!float_dtype(lp->dtype))
        return dt_error(DT_ERR_DTYPE, "dt_optim_master_alloc: a %s flat has no master weights (f32, bf16, f16)",
                        dt_dtype_name(lp->dtype));
    if (hi < lo || (hi > lo && (!lp->base || lo < lp->offset || hi > lp->offset + lp->numel)))
        return dt_error(hi < lo || lp->base ? DT_ERR_RANGE : DT_ERR_NULL,
                        "dt_optim_master_alloc: [%zu, %zu) is not held by the flat ([%zu, %zu)%s)", lo, hi,
                        lp->offset, lp->offset + lp->numel, lp->base ? "" : ", no memory");
    float *base = NULL;
    if (hi > lo) {
        for (size_t i = 0; i < nseg; i++)
            if (!segs || (i > 0 && segs[i].offset < segs[i - 1].offset + segs[i - 1].numel))
                return dt_error(DT_ERR_INVALID_ARG, "dt_optim_master_alloc_segments: segment %zu [%zu, +%zu) is not "
                                "sorted and disjoint after the one before", i, segs ? segs[i].offset : 0,
                                segs ? segs[i].numel : 0);
        if (!(base = dt_alloc((hi - lo) * sizeof(float))))
            return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_optim_master_alloc: %zu f32 master weights", hi - lo);
        if (!nseg) {
            dt_k_convert(dt_flat_ptr(lp, lo), lp->dtype, base, DT_F32, (int64_t)(hi - lo));
        } else { /* the segments' values; what lies between them reads as zero and holds no memory */
            size_t prev = lo;
            for (size_t i = 0; i < nseg; i++) {
                size_t a = segs[i].offset < lo ? lo : segs[i].offset, b = segs[i].offset + segs[i].numel;
                b = b > hi ? hi : b;
                if (b <= a)
                    continue;
                if (a > prev)
                    dt_decommit(base + (prev - lo), (a - prev) * sizeof(float));
                dt_k_convert(dt_flat_ptr(lp, a), lp->dtype, base + (a - lo), DT_F32, (int64_t)(b - a));
                prev = b;
            }
            if (hi > prev)
                dt_decommit(base + (prev - lo), (hi - prev) * sizeof(float));
        }
    }
    *master = (dt_flat){.dtype = DT_F32, .base = base, .offset = lo, .numel = hi - lo, .total = lp->total,
                        .used = lp->used, .world = lp->world, .pg = NULL, .owned = true};
    return DT_OK;
}

/* SGD and Adam(W) over ranges with low-precision grads, when no unscale
 * pass ran (no loss scaler, no clipping): one parallel loop in which each
 * work item widens its grads into a buffer on the stack (zeroing the
 * source when the optimizer zeroes grads), steps, and rounds its masters
 * into the mirror, while the item is in cache. Adam(W) over bf16 grads
 * with a bf16 (or no) mirror does all of that in one sweep of registers
 * (dt__optim_adam_bf16: each array read and written once). The same
 * operations per element as unscale_pass + step + refresh_mirrors, so the
 * same bits; the f32 gradient copy (g32) is not touched. */
static void step_fused_lowp(dt_optim *o)
{
    dt__sgd_k sk, sk_nd;
    dt__adam_k ak, ak_nd;
    const bool sgd = o->kind == DT_OPTIM_SGD;
    if (sgd)
        dt__optim_sgd_k_make(o, &sk, &sk_nd);
    else
        dt__optim_adam_k_make(o, &ak, &ak_nd);
    const size_t ni = o->nitem;
#pragma omp parallel for schedule(static) if (ni > 1)
    for (size_t i = 0; i < ni; i++) {
        float tmp[DT__OPTIM_CHUNK];
        const dt__optim_item *it = &o->items[i];
        const dt__optim_range *rg = &o->ranges[it->range];
        const size_t s = it->start;
        float *g = o->gbase[it->range] + s;
        if (!sgd && rg->grads->dtype == DT_BF16 && (!rg->mirror || rg->mirror->dtype == DT_BF16)) {
            /* bf16 grads and copy: the one-sweep kernel (the same bits) */
            dt__optim_adam_bf16(o->pbase[it->range] + s, (uint16_t *)dt_flat_ptr(rg->grads, rg->lo + s),
                                rg->state[0] + s, rg->state[1] + s,
                                rg->mirror ? (uint16_t *)o->mbase[it->range] + s : NULL, it->len,
                                it->no_decay ? &ak_nd : &ak);
            continue;
        }
        if (rg->g32) {
            void *src = dt_flat_ptr(rg->grads, rg->lo + s);
            dt_k_convert(src, rg->grads->dtype, tmp, DT_F32, (int64_t)it->len);
            if (o->zero_grad)
                memset(src, 0, it->len * dt_dtype_size(rg->grads->dtype));
            g = tmp;
        }
        float *p = o->pbase[it->range] + s;
        float *const *st = rg->state;
        if (sgd)
            dt__optim_sgd(p, g, st[0] ? st[0] + s : NULL, it->len, it->no_decay ? &sk_nd : &sk);
        else
            dt__optim_adam(p, g, st[0] + s, st[1] + s, it->len, it->no_decay ? &ak_nd : &ak);
        if (rg->mirror)
            dt_k_convert(p, DT_F32, (char *)o->mbase[it->range] + s * dt_dtype_size(rg->mirror->dtype),
                         rg->mirror->dtype, (int64_t)it->len);
    }
}

dt_status dt_optim_step(dt_optim *o)
{
    if (!o)
        return dt_error(DT_ERR_NULL, "dt_optim_step: optimizer is NULL");
    dt_status st = resolve(o);
    if (st < 0 || (st = inflight(o, "dt_optim_step")) < 0)
        return st;
    bool widen = false;
    for (size_t r = 0; r < o->nrange; r++)
        widen |= o->ranges[r].g32 != NULL;
    if (widen && !o->grads_ready && o->kind != DT_OPTIM_LAMB && o->kind != DT_OPTIM_LION) {
        step_fused_lowp(o);
        o->step++;
        return DT_OK;
    }
    if (widen && !o->grads_ready)
        unscale_pass(o, 1.0f, NULL);
    o->grads_ready = false;
    switch (o->kind) {
    case DT_OPTIM_SGD:
        step_sgd(o);
        break;
    case DT_OPTIM_ADAM:
    case DT_OPTIM_ADAMW:
        step_adam(o);
        break;
    case DT_OPTIM_LAMB:
        if ((st = step_lamb(o)) < 0)
            return st;
        break;
    case DT_OPTIM_LION:
        step_lion(o);
        break;
    default:
        return dt_error(DT_ERR_INTERNAL, "dt_optim_step: bad optimizer kind %d", (int)o->kind);
    }
    refresh_mirrors(o);
    o->step++;
    return DT_OK;
}
