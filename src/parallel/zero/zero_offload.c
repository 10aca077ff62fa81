/* ZeRO-3 parameter offload (parallel.h "Parameter offload"; DeepSpeed's
 * offload_param with device nvme): each non-resident unit's parameter shard
 * lives in a file of an NVMe store (offload.h) and is in memory only while
 * in flight.
 *
 * A unit's shard is in memory exactly while u->pshard is non-NULL: a
 * buffer mapped for it (so that returning it gives the pages back to the
 * system at once) into which a read is posted (u->prd) or complete. The
 * buffer always holds the current shard: only the optimizer step changes a
 * shard, and it steps the buffer and writes it back (u->pwr) before the
 * buffer goes. So a read posted ahead may be used by a gather or by the
 * step, whichever comes first.
 *
 *   gather (post_gather, zero.c)   dt__zo_ready: read (if not ahead), wait
 *   gather complete (wait_gather)  dt__zo_drop: the buffer goes
 *   hooks (fwd_pre, fwd_post, bwd_pre)  dt__zo_readahead along the schedule:
 *                                  the forward order, then the backward (its
 *                                  reverse), up to buffer_count shards held
 *   dt_zero_step                   unit by unit: read (buffer_count - 1
 *                                  ahead), step, write; then read ahead for
 *                                  the next forward
 *
 * Errors. A rank whose read fails inside a module hook cannot return
 * alone: its peers would wait in the unit's all-gather. The error is held
 * (z->perr) and the gather goes on with whatever the buffer holds; at the
 * step's dt_zero_wait every rank learns of it (dt__zo_agree) and fails,
 * the failing one with the message naming the file. The step and init
 * agree the same way. */
#include "dtrain/offload.h"
#include "dtrain/parallel.h"
#include "parallel/zero/zero_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static size_t shard_bytes(const zunit *u) { return u->c * u->es; }

dt_status dt__zo_open(dt_zero *z)
{
    for (int i = 0; i < z->nu; i++)
        z->u[i].preg = -1;
    const dt_offload_params *op = &z->p.offload_param;
    if (op->device == DT_OFFLOAD_CPU && dt_pg_rank(z->wpg) == 0)
        dt_log(DT_LOG_WARN, "offload_param device cpu: nothing changes on a CPU system (the parameters already "
                            "live in host memory)");
    if (op->device != DT_OFFLOAD_NVME)
        return DT_OK;
    if (z->p.stage != 3)
        return dt_error(DT_ERR_INVALID_ARG, "offload_param device nvme: parameters are offloaded with stage 3 only "
                        "(this is stage %d; offload_optimizer works with every stage)", z->p.stage);
    if (op->buffer_count < 1 || op->buffer_size == 0)
        return dt_error(DT_ERR_INVALID_ARG, "offload_param: buffer_count %d (need >= 1), buffer_size %zu (need >= 1)",
                        op->buffer_count, op->buffer_size);
    for (int i = 0; i < z->nu; i++) {
        const zunit *u = &z->u[i];
        if (u->resident)
            continue;
        if (u->dtype != DT_F32)
            return dt_error(DT_ERR_UNSUPPORTED, "offload_param device nvme: unit '%s' holds %s parameters; parameter "
                            "offload keeps f32 shards only (mixed precision is not offloaded yet)", u->name,
                            dt_dtype_name(u->dtype));
        if (u->c > op->buffer_size)
            return dt_error(DT_ERR_INVALID_ARG, "offload_param: unit '%s' has a shard of %zu elements, more than "
                            "buffer_size %zu: raise buffer_size or wrap smaller units (wrap_min_params)", u->name,
                            u->c, op->buffer_size);
    }
    dt_status st = dt_nvme_store_open(op, &z->pstore);
    if (st < 0)
        return dt_error_wrap(st, "offload_param");
    if (dt_pg_rank(z->wpg) == 0)
        dt_log(DT_LOG_WARN, "offload_param device nvme: parameter shards in files under %s (%s I/O), buffer_count %d",
               op->nvme_path, dt_offload_io_name(dt_nvme_store_io(z->pstore)), op->buffer_count);
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        if (u->resident)
            continue;
        char name[64];
        snprintf(name, sizeof name, "unit%d.param", i);
        if ((st = dt_nvme_store_add(z->pstore, name, shard_bytes(u), &u->preg)) < 0) {
            u->preg = -1;
            return dt_error_wrap(st, "offload_param: the shard of unit '%s'", u->name);
        }
    }
    z->p.offload_param.nvme_path = NULL; /* borrowed during init only */
    return DT_OK;
}

/* Map a buffer for u's shard (no read). */
static dt_status take_buffer(dt_zero *z, zunit *u)
{
    const size_t n = shard_bytes(u);
    void *b = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED)
        return dt__zero_unit_err(u, DT_ERR_NO_MEMORY, "a buffer for its offloaded parameter shard");
    u->pshard = b;
    u->pflat.base = b;
    z->pheld += n;
    z->nheld++;
    if (z->pheld > z->pheld_peak)
        z->pheld_peak = z->pheld;
    return DT_OK;
}

dt_status dt__zo_fetch(dt_zero *z, zunit *u)
{
    if (!z->pstore || u->preg < 0 || u->pshard)
        return DT_OK;
    dt_status st = take_buffer(z, u);
    if (st < 0)
        return st;
    if ((st = dt_nvme_store_read(z->pstore, u->preg, 0, u->pshard, shard_bytes(u), &u->prd)) < 0) {
        u->prd = 0;
        st = dt__zero_unit_err(u, st, "reading its parameter shard");
        dt__zo_drop(z, u);
    }
    return st;
}

dt_status dt__zo_ready(dt_zero *z, zunit *u)
{
    if (!z->pstore || u->preg < 0)
        return DT_OK;
    dt_status st = dt__zo_fetch(z, u);
    if (st < 0)
        return st;
    st = dt_nvme_store_wait(z->pstore, u->prd);
    u->prd = 0;
    return st < 0 ? dt__zero_unit_err(u, st, "reading its parameter shard") : DT_OK;
}

void dt__zo_drop(dt_zero *z, zunit *u)
{
    if (!z->pstore || u->preg < 0 || !u->pshard)
        return;
    /* nothing may stay in flight into the buffer; an error here was not
     * waited for by its owner: hold it */
    for (int k = 0; k < 2; k++) {
        uint64_t *t = k ? &u->pwr : &u->prd;
        dt_status st = dt_nvme_store_wait(z->pstore, *t);
        *t = 0;
        if (st < 0)
            dt__zo_hold(z, dt__zero_unit_err(u, st, k ? "writing its parameter shard" : "reading its parameter shard"));
    }
    munmap(u->pshard, shard_bytes(u) ? shard_bytes(u) : 1);
    z->pheld -= shard_bytes(u);
    z->nheld--;
    u->pshard = NULL;
    u->pflat.base = NULL;
}

dt_status dt__zo_write_sync(dt_zero *z, zunit *u)
{
    dt_status st = dt_nvme_store_write(z->pstore, u->preg, 0, u->pshard, shard_bytes(u), &u->pwr);
    if (st >= 0)
        st = dt_nvme_store_wait(z->pstore, u->pwr);
    u->pwr = 0;
    return st < 0 ? dt__zero_unit_err(u, st, "writing its parameter shard") : DT_OK;
}

dt_status dt__zo_buffer(dt_zero *z, zunit *u)
{
    return !z->pstore || u->preg < 0 || u->pshard ? DT_OK : take_buffer(z, u);
}

void dt__zo_readahead(dt_zero *z, int pos)
{
    if (!z->pstore || !z->order_done)
        return;
    const int N = z->norder, cap = z->p.offload_param.buffer_count;
    for (int j = pos + 1; j < 2 * N && z->nheld < cap; j++) {
        zunit *u = &z->u[z->order[j < N ? j : 2 * N - 1 - j]];
        if (u->preg < 0 || u->pshard || u->gathered)
            continue;
        dt_status st = dt__zo_fetch(z, u);
        if (st < 0) {
            dt__zo_hold(z, st);
            return;
        }
    }
}

dt_status dt__zo_hold(dt_zero *z, dt_status st)
{
    if (st >= 0)
        return DT_OK;
    if (dt_pg_size(z->wpg) <= 1)
        return st;
    if (z->perr >= 0) {
        z->perr = st;
        free(z->perr_msg);
        z->perr_msg = strdup(dt_last_error());
    }
    return DT_OK;
}

dt_status dt__zo_agree(dt_zero *z, dt_status st, const char *what)
{
    if (st >= 0 && z->perr < 0) { /* a held error of this rank */
        st = z->perr;
        dt_error(st, "%s", z->perr_msg ? z->perr_msg : "parameter offload I/O failed");
    }
    z->perr = DT_OK;
    free(z->perr_msg);
    z->perr_msg = NULL;
    if (dt_pg_size(z->wpg) <= 1)
        return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st < 0 ? dt_last_error() : "");
    double v = st < 0 ? 1.0 : 0.0;
    dt_status cs = dt_pg_allreduce(z->wpg, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_MAX);
    if (st < 0)
        return dt_error(st, "%s", msg);
    if (cs < 0)
        return dt_error_wrap(cs, "ZeRO parameter offload: agreeing on %s", what);
    if (v > 0)
        return dt_error(DT_ERR_IO, "ZeRO parameter offload: %s failed on another rank (its error names the file)",
                        what);
    return DT_OK;
}

void dt__zo_close(dt_zero *z)
{
    if (!z->pstore)
        return;
    for (int i = 0; i < z->nu; i++)
        dt__zo_drop(z, &z->u[i]);
    dt_nvme_store_close(z->pstore);
    z->pstore = NULL;
    free(z->perr_msg);
    z->perr_msg = NULL;
}

/* ---- the optimizer step ------------------------------------------------------------------ */

/* Wait u's write and give its buffer back; *st keeps the first error. */
static void retire(dt_zero *z, zunit *u, dt_status *st)
{
    if (!z->pstore || u->preg < 0 || !u->pshard)
        return;
    dt_status w = dt_nvme_store_wait(z->pstore, u->pwr);
    u->pwr = 0;
    if (w < 0 && *st >= 0)
        *st = dt__zero_unit_err(u, w, "writing its parameter shard");
    dt__zo_drop(z, u);
}

static dt_status step_units(dt_zero *z, dt_optim *o, dt_offload_optim *d)
{
    const int ahead = z->p.offload_param.buffer_count - 1, cap = z->p.offload_param.buffer_count;
    const int nstate = dt_optim_num_states(o);
    dt_status st = DT_OK;
    int issued = 0, oldest = 0;
    for (int i = 0; i < z->nu && st >= 0; i++) {
        for (; issued < z->nu && issued <= i + ahead && st >= 0; issued++)
            st = dt__zo_fetch(z, &z->u[issued]);
        zunit *u = &z->u[i];
        if (st < 0 || (st = dt__zo_ready(z, u)) < 0)
            break;
        if (d) {
            st = dt_offload_optim_step_range(d, (size_t)i);
        } else {
            float *state[2] = {NULL, NULL};
            for (int k = 0; k < nstate && k < 2 && st >= 0; k++)
                st = dt_optim_state(o, (size_t)i, k, NULL, &state[k], NULL);
            if (st >= 0)
                st = dt_optim_step_part(o, &z->rg[i], state);
        }
        if (st < 0) {
            dt__zero_unit_err(u, st, "the optimizer step");
            break;
        }
        if (u->preg >= 0 &&
            (st = dt_nvme_store_write(z->pstore, u->preg, 0, u->pshard, shard_bytes(u), &u->pwr)) < 0) {
            u->pwr = 0;
            dt__zero_unit_err(u, st, "writing its parameter shard");
            break;
        }
        for (; oldest < i && z->nheld > cap; oldest++)
            retire(z, &z->u[oldest], &st);
    }
    for (int i = 0; i < z->nu; i++) /* the rest written (or, after an error, at least not in flight) */
        retire(z, &z->u[i], &st);
    return st;
}

dt_status dt_zero_step(dt_zero *z, dt_optim *o, dt_offload_optim *d)
{
    if (!z || !o)
        return dt_error(DT_ERR_NULL, "dt_zero_step: %s is NULL", z ? "optimizer" : "handle");
    if (!z->pstore)
        return d ? dt_offload_optim_step(d) : dt_optim_step(o);
    const size_t nr = d ? 0 : dt_optim_num_ranges(o);
    if (!d && nr != (size_t)z->nu)
        return dt_error(DT_ERR_INVALID_ARG, "dt_zero_step: the optimizer has %zu ranges; make it over dt_zero_ranges "
                        "(%d, one per unit)", nr, z->nu);
    const int64_t step = dt_optim_get_step(o);
    dt_status st = step_units(z, o, d);
    if (st >= 0)
        dt_optim_set_step(o, step + 1);
    st = dt__zo_agree(z, st, "the optimizer step");
    if (st >= 0)
        dt__zo_readahead(z, -1); /* the next forward's first units */
    return st;
}

bool dt_zero_params_offloaded(const dt_zero *z) { return z && z->pstore; }

dt_nvme_store *dt_zero_param_store(const dt_zero *z) { return z ? z->pstore : NULL; }
