/* One optimizer step over part of a range, with the state in caller memory
 * (dt_optim_step_part, optim.h): what the offload driver (offload.h) calls
 * once per sub-group, its state swapped in from files.
 *
 * SGD, Adam, AdamW and Lion are element-wise: an element's new value depends on
 * its own parameter, gradient and state only, and the kernels compute the
 * same bits whatever the split (the SIMD body and the scalar tail are
 * bit-identical, optim_kernels.c). So a part is cut into the same pieces a
 * range would be (per segment, at its fixed chunk boundaries), the pieces
 * run in parallel, and the result equals dt_optim_step over the whole range
 * bit for bit. LAMB needs per-tensor norms over whole tensors before any
 * element moves, which parts cannot give: unsupported. */
#include "base/inflight.h"
#include "optim/optim_impl.h"

#include <stdlib.h>

typedef struct piece {
    size_t start, len; /* local to the part (global - lo) */
    bool no_decay;
} piece;

/* Pieces of [lo, hi) per segment, cut at chunk boundaries; count only when out is NULL. */
static size_t cut(const dt_optim_range *r, piece *out)
{
    dt_optim_segment whole = {r->lo, r->hi - r->lo, false};
    const dt_optim_segment *segs = r->segs ? r->segs : &whole;
    size_t nseg = r->segs ? r->nseg : 1, n = 0;
    for (size_t s = 0; s < nseg; s++) {
        size_t a = segs[s].offset, b = segs[s].offset + segs[s].numel;
        a = a < r->lo ? r->lo : a;
        b = b > r->hi ? r->hi : b;
        for (size_t x = a; x < b;) {
            size_t off = segs[s].offset, e = off + ((x - off) / DT__OPTIM_CHUNK + 1) * DT__OPTIM_CHUNK;
            e = e > b ? b : e;
            if (out)
                out[n] = (piece){.start = x - r->lo, .len = e - x, .no_decay = segs[s].no_decay};
            n++;
            x = e;
        }
    }
    return n;
}

dt_status dt_optim_step_part(dt_optim *o, const dt_optim_range *part, float *const *state)
{
    if (!o || !part)
        return dt_error(DT_ERR_NULL, "dt_optim_step_part: %s is NULL", o ? "part" : "optimizer");
    if (o->kind == DT_OPTIM_LAMB)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_optim_step_part: %s needs norms over whole tensors; only sgd, "
                        "adam, adamw and lion step by parts", dt_optim_kind_name(o->kind));
    dt_status st = dt__optim_check_range(part, 0);
    if (st < 0)
        return dt_error_wrap(st, "dt_optim_step_part");
    if (part->mirror || part->grads->dtype != DT_F32)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_optim_step_part: f32 gradients without a mirror only (mixed "
                        "precision is not stepped by parts yet)");
    if (part->hi == part->lo)
        return DT_OK;
    const bool need_state = o->nstate > 0; /* SGD without momentum has none */
    if (need_state && (!state || !state[0] || (o->nstate > 1 && !state[1])))
        return dt_error(DT_ERR_NULL, "dt_optim_step_part: %s needs %d state buffers", dt_optim_kind_name(o->kind),
                        o->nstate);
    const dt_flat *fl[2] = {part->params, part->grads};
    for (int k = 0; k < 2; k++)
        if (!fl[k]->base || part->lo < fl[k]->offset || part->hi > fl[k]->offset + fl[k]->numel)
            return dt_error(fl[k]->base ? DT_ERR_RANGE : DT_ERR_NULL,
                            "dt_optim_step_part: [%zu, %zu) is not held by its %s flat ([%zu, %zu)%s)", part->lo,
                            part->hi, k ? "grads" : "params", fl[k]->offset, fl[k]->offset + fl[k]->numel,
                            fl[k]->base ? "" : ", no memory");
    float *p = dt_flat_ptr(part->params, part->lo), *g = dt_flat_ptr(part->grads, part->lo);
    if ((st = dt__inflight_check("dt_optim_step_part", g, (part->hi - part->lo) * sizeof(float))) < 0)
        return st;
    for (size_t s = 1; part->segs && s < part->nseg; s++)
        if (part->segs[s].offset < part->segs[s - 1].offset + part->segs[s - 1].numel)
            return dt_error(DT_ERR_INVALID_ARG, "dt_optim_step_part: segment %zu is not sorted/disjoint", s);
    size_t np = cut(part, NULL);
    piece *pc = malloc((np ? np : 1) * sizeof *pc);
    if (!pc)
        return dt_error(DT_ERR_NO_MEMORY, "dt_optim_step_part: %zu pieces", np);
    cut(part, pc);
    if (o->kind == DT_OPTIM_SGD) {
        dt__sgd_k k, k_nd;
        dt__optim_sgd_k_make(o, &k, &k_nd);
        float *buf = need_state ? state[0] : NULL;
#pragma omp parallel for schedule(static) if (np > 1)
        for (size_t i = 0; i < np; i++)
            dt__optim_sgd(p + pc[i].start, g + pc[i].start, buf ? buf + pc[i].start : NULL, pc[i].len,
                          pc[i].no_decay ? &k_nd : &k);
    } else if (o->kind == DT_OPTIM_LION) {
        dt__lion_k k, k_nd;
        dt__optim_lion_k_make(o, &k, &k_nd);
#pragma omp parallel for schedule(static) if (np > 1)
        for (size_t i = 0; i < np; i++)
            dt__optim_lion(p + pc[i].start, g + pc[i].start, state[0] + pc[i].start, pc[i].len,
                           pc[i].no_decay ? &k_nd : &k);
    } else {
        dt__adam_k k, k_nd;
        dt__optim_adam_k_make(o, &k, &k_nd);
        float *m = state[0], *v = state[1];
#pragma omp parallel for schedule(static) if (np > 1)
        for (size_t i = 0; i < np; i++)
            dt__optim_adam(p + pc[i].start, g + pc[i].start, m + pc[i].start, v + pc[i].start, pc[i].len,
                           pc[i].no_decay ? &k_nd : &k);
    }
    free(pc);
    return DT_OK;
}
