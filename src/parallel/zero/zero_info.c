/* ZeRO's introspection (parallel.h): the optimizer's ranges, the units,
 * the pieces a sharded checkpoint saves, memory and counters. */
#include "parallel/zero/zero_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- introspection ---------------------------------------------------------------------- */

dt_status dt_zero_ranges(dt_zero *z, bool no_decay_1d, const dt_optim_range **r, size_t *n)
{
    if (!z || !r || !n)
        return dt_error(DT_ERR_NULL, "dt_zero_ranges: NULL argument");
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        size_t k = 0, lo = (size_t)z->rank * u->c, hi = lo + u->c;
        for (int j = 0; j < u->nent; j++) {
            dt_param_info e;
            dt_model_entry(z->m, u->entries[j], &e);
            size_t a = u->uoff[j], b = a + e.numel;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            if (a < b)
                u->segs[k++] = (dt_optim_segment){.offset = a, .numel = b - a, .no_decay = no_decay_1d && e.ndim <= 1};
        }
        /* a low-precision unit steps its fp32 masters and rewrites its shard from them */
        z->rg[i] = (dt_optim_range){.params = u->master ? &u->mflat : &u->pflat, .grads = &u->gflat,
                                    .mirror = u->master ? &u->pflat : NULL, .lo = lo, .hi = hi, .segs = u->segs,
                                    .nseg = k};
    }
    *r = z->rg;
    *n = (size_t)z->nu;
    return DT_OK;
}
int dt_zero_num_units(const dt_zero *z) { return z ? z->nu : 0; }

dt_pg *dt_zero_group(const dt_zero *z) { return z ? z->wpg : NULL; }

dt_status dt_zero_unit(const dt_zero *z, int k, dt_zero_unit_info *out)
{
    if (!z || !out)
        return dt_error(DT_ERR_NULL, "dt_zero_unit: NULL argument");
    if (k < 0 || k >= z->nu)
        return dt_error(DT_ERR_RANGE, "dt_zero_unit: unit %d of %d", k, z->nu);
    const zunit *u = &z->u[k];
    out->name = u->name;
    out->module = u->mod;
    out->nparams = u->nent;
    out->numel = u->used_numel;
    out->total = u->total;
    out->shard_lo = (size_t)z->rank * u->c;
    out->shard_hi = out->shard_lo + u->c;
    out->resident = u->resident;
    out->gathered = u->gathered;
    out->fwd_pos = z->order_done && z->p.stage == 3 && !u->resident ? u->fwd_pos : -1;
    out->dtype = u->dtype;
    out->reduce_dtype = u->rdt;
    return DT_OK;
}

dt_status dt_zero_pieces(const dt_zero *z, dt_zero_piece *out, size_t cap, size_t *n)
{
    if (!z || !n)
        return dt_error(DT_ERR_NULL, "dt_zero_pieces: NULL argument");
    if (z->pstore)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_zero_pieces: the parameter shards are offloaded to NVMe files "
                        "(offload_param): sharded checkpoints of offloaded parameters are not supported yet");
    size_t k = 0;
    for (int i = 0; i < z->nu; i++) {
        const zunit *u = &z->u[i];
        size_t lo = (size_t)z->rank * u->c, hi = lo + u->c;
        for (int j = 0; j < u->nent; j++) {
            dt_param_info e;
            dt_model_entry(z->m, u->entries[j], &e);
            size_t a = u->uoff[j], b = a + e.numel;
            a = a < lo ? lo : a;
            b = b > hi ? hi : b;
            if (a >= b)
                continue;
            if (out && k < cap)
                out[k] = (dt_zero_piece){.entry = u->entries[j],
                                         .name = e.name,
                                         .lo = a - u->uoff[j],
                                         .hi = b - u->uoff[j],
                                         .range = (size_t)i,
                                         .range_offset = a - lo,
                                         .param = dt_flat_ptr(u->master ? &u->mflat : &u->pflat, a),
                                         .lowp = u->master ? dt_flat_ptr(&u->pflat, a) : NULL,
                                         .dtype = u->dtype,
                                         .grad = dt_flat_ptr(&u->gflat, a),
                                         .grad_dtype = u->rdt};
            k++;
        }
    }
    *n = k;
    if (out && k > cap)
        return dt_error(DT_ERR_RANGE, "dt_zero_pieces: %zu pieces, room for %zu", k, cap);
    return DT_OK;
}

dt_status dt_zero_memory(const dt_zero *z, size_t *param_bytes, size_t *grad_bytes, size_t *gathered_peak)
{
    if (!z)
        return dt_error(DT_ERR_NULL, "dt_zero_memory: handle is NULL");
    size_t pb = 0, gb = 0;
    for (int i = 0; i < z->nu; i++) {
        const zunit *u = &z->u[i];
        pb += u->resident ? dt__zero_unit_bytes(u) : u->preg >= 0 ? 0 : u->c * u->es;
        /* stage 1: the whole gradients (and their reduce-dtype copy, whose
         * slice the optimizer reads); stages 2/3: the reduced shard */
        gb += z->p.stage == 1 ? dt__zero_unit_bytes(u) + (u->rfull ? dt__zero_unit_rbytes(u) : 0) : u->c * u->res;
    }
    pb += z->pheld_peak; /* parameter offload: the shards' buffers */
    if (param_bytes)
        *param_bytes = pb;
    if (grad_bytes)
        *grad_bytes = gb;
    if (gathered_peak)
        *gathered_peak = z->peak_live;
    return DT_OK;
}

dt_zero_stats dt_zero_get_stats(const dt_zero *z)
{
    dt_zero_stats s;
    memset(&s, 0, sizeof s);
    return z ? z->stats : s;
}
