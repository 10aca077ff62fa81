/* The offload optimizer driver (offload.h): an optimizer step over ranges
 * whose state lives in an NVMe store, sub-group by sub-group.
 *
 * The ranges are cut into sub-groups of at most sub_group_size elements
 * (range by range, in order). Sub-group i uses buffer slot i % nbuf, which
 * holds its state (nstate arrays of up to S floats). The pipeline, with
 * ahead = nbuf - 1:
 *
 *     post reads of sub-groups 0 .. ahead          (each into its slot)
 *     for i in 0 .. G-1:
 *         post the read of sub-group i + ahead     (its slot's previous write
 *                                                   must be complete: wait it)
 *         wait the reads of i; step i in its slot  (dt_optim_step_part)
 *         post the writes of i
 *     wait every write
 *
 * so while sub-group i is stepped, i+1 .. i+ahead are being read and i-1
 * (and older, up to the slot they share) written. nbuf = 1 is the
 * synchronous order (read, step, write, one at a time); every nbuf gives the
 * same bits, since each element's update depends only on its own state and
 * every state element is read after its previous write completed.
 *
 * Memory: nbuf * nstate * S * 4 bytes of buffers, whatever the model size;
 * nbuf is capped at the number of sub-groups. */
#include "dtrain/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct group {
    size_t r, lo, hi;
} group;

struct dt_offload_optim {
    dt_optim *o;               /* borrowed */
    dt_nvme_store *store;      /* owned */
    size_t nrange;
    dt_optim_range *ranges;    /* copies; segs point into segs[] */
    dt_optim_segment **segs;   /* per range, owned copies */
    int nstate;
    int *region;               /* [r * nstate + i] */
    size_t ngroup;
    group *groups;
    int nbuf;
    size_t S;                  /* elements per buffer */
    float **buf;               /* [b * nstate + i], S floats each */
    uint64_t *rt, *wt;         /* outstanding read / write tickets, [b * nstate + i] */
};

void dt_offload_optim_free(dt_offload_optim *d)
{
    if (!d)
        return;
    dt_nvme_store_close(d->store); /* waits for what is in flight before the buffers go */
    for (size_t r = 0; d->segs && r < d->nrange; r++)
        free(d->segs[r]);
    free(d->segs);
    free(d->ranges);
    free(d->region);
    free(d->groups);
    for (int i = 0; d->buf && i < d->nbuf * d->nstate; i++)
        dt_free(d->buf[i]);
    free(d->buf);
    free(d->rt);
    free(d->wt);
    free(d);
}

dt_status dt_offload_optim_init(const dt_offload_params *p, dt_optim *o, const dt_optim_range *ranges,
                                size_t nrange, dt_offload_optim **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_offload_optim_init: out is NULL");
    *out = NULL;
    if (!p || !o || (!ranges && nrange))
        return dt_error(DT_ERR_NULL, "dt_offload_optim_init: %s is NULL", !p ? "params" : !o ? "optimizer" : "ranges");
    dt_optim_kind kind = dt_optim_get_kind(o);
    if (kind == DT_OPTIM_LAMB)
        return dt_error(DT_ERR_UNSUPPORTED, "offload: %s needs norms over whole tensors before any update, which "
                        "sub-groups cannot give; offload works with sgd, adam, adamw and lion",
                        dt_optim_kind_name(kind));
    if (dt_optim_num_ranges(o) != 0)
        return dt_error(DT_ERR_INVALID_ARG, "offload: the optimizer must be created over no ranges (it has %zu, "
                        "with state in memory); the driver holds the ranges", dt_optim_num_ranges(o));
    if (p->buffer_count < 1 || p->sub_group_size == 0)
        return dt_error(DT_ERR_INVALID_ARG, "offload: buffer_count %d (need >= 1), sub_group_size %zu (need >= 1)",
                        p->buffer_count, p->sub_group_size);
    for (size_t r = 0; r < nrange; r++) {
        const dt_optim_range *g = &ranges[r];
        if (!g->params || !g->grads)
            return dt_error(DT_ERR_NULL, "offload: range %zu has no %s flat", r, g->params ? "grads" : "params");
        if (g->params->dtype != DT_F32 || g->grads->dtype != DT_F32 || g->mirror)
            return dt_error(DT_ERR_DTYPE, "offload: range %zu: f32 params and grads without a mirror only", r);
        if (g->hi < g->lo || (g->nseg && !g->segs))
            return dt_error(DT_ERR_INVALID_ARG, "offload: range %zu [%zu, %zu) (nseg %zu)", r, g->lo, g->hi, g->nseg);
    }
    dt_offload_optim *d = calloc(1, sizeof *d);
    if (!d)
        return dt_error(DT_ERR_NO_MEMORY, "dt_offload_optim_init");
    dt_status st;
    d->o = o;
    d->nrange = nrange;
    d->nstate = dt_optim_num_states(o);
    d->ranges = calloc(nrange ? nrange : 1, sizeof *d->ranges);
    d->segs = calloc(nrange ? nrange : 1, sizeof *d->segs);
    d->region = calloc((nrange ? nrange : 1) * (size_t)(d->nstate ? d->nstate : 1), sizeof *d->region);
    if (!d->ranges || !d->segs || !d->region) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_offload_optim_init");
        goto fail;
    }
    size_t ngroup = 0, S = 0;
    for (size_t r = 0; r < nrange; r++) {
        d->ranges[r] = ranges[r];
        if (ranges[r].segs && ranges[r].nseg) {
            d->segs[r] = malloc(ranges[r].nseg * sizeof **d->segs);
            if (!d->segs[r]) {
                st = dt_error(DT_ERR_NO_MEMORY, "dt_offload_optim_init: segments");
                goto fail;
            }
            memcpy(d->segs[r], ranges[r].segs, ranges[r].nseg * sizeof **d->segs);
            d->ranges[r].segs = d->segs[r];
        }
        size_t n = ranges[r].hi - ranges[r].lo;
        ngroup += (n + p->sub_group_size - 1) / p->sub_group_size;
        size_t s = n < p->sub_group_size ? n : p->sub_group_size;
        S = s > S ? s : S;
    }
    d->ngroup = ngroup;
    d->S = S;
    d->groups = calloc(ngroup ? ngroup : 1, sizeof *d->groups);
    if (!d->groups) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_offload_optim_init: %zu sub-groups", ngroup);
        goto fail;
    }
    size_t k = 0;
    for (size_t r = 0; r < nrange; r++)
        for (size_t a = ranges[r].lo; a < ranges[r].hi; a += p->sub_group_size) {
            size_t b = ranges[r].hi - a > p->sub_group_size ? a + p->sub_group_size : ranges[r].hi;
            d->groups[k++] = (group){.r = r, .lo = a, .hi = b};
        }
    d->nbuf = (size_t)p->buffer_count > ngroup ? (int)(ngroup ? ngroup : 1) : p->buffer_count;
    if ((st = dt_nvme_store_open(p, &d->store)) < 0)
        goto fail;
    for (size_t r = 0; r < nrange; r++)
        for (int i = 0; i < d->nstate; i++) {
            char name[64];
            snprintf(name, sizeof name, "range%zu.state%d", r, i);
            if ((st = dt_nvme_store_add(d->store, name, (ranges[r].hi - ranges[r].lo) * sizeof(float),
                                        &d->region[r * (size_t)d->nstate + (size_t)i])) < 0)
                goto fail;
        }
    size_t nb = (size_t)d->nbuf * (size_t)d->nstate;
    d->buf = calloc(nb ? nb : 1, sizeof *d->buf);
    d->rt = calloc(nb ? nb : 1, sizeof *d->rt);
    d->wt = calloc(nb ? nb : 1, sizeof *d->wt);
    if (!d->buf || !d->rt || !d->wt) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_offload_optim_init");
        goto fail;
    }
    for (size_t i = 0; i < nb; i++)
        if (S && !(d->buf[i] = dt_alloc(S * sizeof(float)))) {
            st = dt_error_wrap(DT_ERR_NO_MEMORY, "offload: state buffers (%d x %d x %zu floats)", d->nbuf, d->nstate,
                               S);
            goto fail;
        }
    *out = d;
    return DT_OK;
fail:
    dt_offload_optim_free(d);
    return st;
}

/* Post the reads of sub-group g's state into slot b (after the slot's last
 * writes are complete). */
static dt_status post_reads(dt_offload_optim *d, size_t g, int b)
{
    const group *gr = &d->groups[g];
    const dt_optim_range *rg = &d->ranges[gr->r];
    for (int i = 0; i < d->nstate; i++) {
        size_t j = (size_t)b * (size_t)d->nstate + (size_t)i;
        dt_status st = dt_nvme_store_wait(d->store, d->wt[j]);
        d->wt[j] = 0;
        if (st < 0)
            return st;
        st = dt_nvme_store_read(d->store, d->region[gr->r * (size_t)d->nstate + (size_t)i],
                                (gr->lo - rg->lo) * sizeof(float), d->buf[j], (gr->hi - gr->lo) * sizeof(float),
                                &d->rt[j]);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* Step sub-groups [g0, G). */
static dt_status step_groups(dt_offload_optim *d, size_t g0, size_t G)
{
    const size_t ahead = (size_t)d->nbuf - 1;
    size_t issued = g0;
    dt_status st;
    float *state[2] = {NULL, NULL};
    for (size_t g = g0; g < G; g++) {
        for (; issued < G && issued <= g + ahead; issued++)
            if ((st = post_reads(d, issued, (int)((issued - g0) % (size_t)d->nbuf))) < 0)
                return st;
        const int b = (int)((g - g0) % (size_t)d->nbuf);
        for (int i = 0; i < d->nstate; i++) {
            size_t j = (size_t)b * (size_t)d->nstate + (size_t)i;
            st = dt_nvme_store_wait(d->store, d->rt[j]);
            d->rt[j] = 0;
            if (st < 0)
                return st;
            state[i] = d->buf[j];
        }
        const group *gr = &d->groups[g];
        dt_optim_range part = d->ranges[gr->r];
        part.lo = gr->lo;
        part.hi = gr->hi;
        if ((st = dt_optim_step_part(d->o, &part, state)) < 0)
            return st;
        for (int i = 0; i < d->nstate; i++) {
            size_t j = (size_t)b * (size_t)d->nstate + (size_t)i;
            const dt_optim_range *rg = &d->ranges[gr->r];
            st = dt_nvme_store_write(d->store, d->region[gr->r * (size_t)d->nstate + (size_t)i],
                                     (gr->lo - rg->lo) * sizeof(float), d->buf[j], (gr->hi - gr->lo) * sizeof(float),
                                     &d->wt[j]);
            if (st < 0)
                return st;
        }
    }
    size_t nb = (size_t)d->nbuf * (size_t)d->nstate;
    for (size_t j = 0; j < nb; j++) {
        st = dt_nvme_store_wait(d->store, d->wt[j]);
        d->wt[j] = 0;
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* Step sub-groups [g0, g1); on an error nothing stays in flight. */
static dt_status step_span(dt_offload_optim *d, size_t g0, size_t g1)
{
    dt_status st = step_groups(d, g0, g1);
    if (st < 0) {
        /* nothing may stay in flight into the buffers; the first error stands */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_nvme_store_wait_all(d->store);
        size_t nb = (size_t)d->nbuf * (size_t)d->nstate;
        memset(d->rt, 0, nb * sizeof *d->rt);
        memset(d->wt, 0, nb * sizeof *d->wt);
        return dt_error(st, "%s", msg);
    }
    return DT_OK;
}

dt_status dt_offload_optim_step(dt_offload_optim *d)
{
    if (!d)
        return dt_error(DT_ERR_NULL, "dt_offload_optim_step: driver is NULL");
    dt_status st = step_span(d, 0, d->ngroup);
    if (st < 0)
        return st;
    dt_optim_set_step(d->o, dt_optim_get_step(d->o) + 1);
    return DT_OK;
}

dt_status dt_offload_optim_step_range(dt_offload_optim *d, size_t r)
{
    if (!d)
        return dt_error(DT_ERR_NULL, "dt_offload_optim_step_range: driver is NULL");
    if (r >= d->nrange)
        return dt_error(DT_ERR_RANGE, "dt_offload_optim_step_range: range %zu of %zu", r, d->nrange);
    size_t g0 = 0;
    while (g0 < d->ngroup && d->groups[g0].r < r)
        g0++;
    size_t g1 = g0;
    while (g1 < d->ngroup && d->groups[g1].r == r)
        g1++;
    return step_span(d, g0, g1);
}

dt_status dt_offload_optim_read_state(dt_offload_optim *d, size_t r, int i, size_t lo, size_t n, float *dst)
{
    if (!d || (!dst && n))
        return dt_error(DT_ERR_NULL, "dt_offload_optim_read_state: NULL argument");
    if (r >= d->nrange || i < 0 || i >= d->nstate)
        return dt_error(DT_ERR_RANGE, "dt_offload_optim_read_state: state %d of range %zu (%d states, %zu ranges)", i,
                        r, d->nstate, d->nrange);
    const dt_optim_range *rg = &d->ranges[r];
    if (lo < rg->lo || lo > rg->hi || n > rg->hi - lo)
        return dt_error(DT_ERR_RANGE, "dt_offload_optim_read_state: [%zu, %zu) outside range %zu [%zu, %zu)", lo,
                        lo + n, r, rg->lo, rg->hi);
    uint64_t t;
    dt_status st = dt_nvme_store_read(d->store, d->region[r * (size_t)d->nstate + (size_t)i],
                                      (lo - rg->lo) * sizeof(float), dst, n * sizeof(float), &t);
    return st < 0 ? st : dt_nvme_store_wait(d->store, t);
}

dt_nvme_store *dt_offload_optim_store(const dt_offload_optim *d) { return d ? d->store : NULL; }
size_t dt_offload_optim_num_subgroups(const dt_offload_optim *d) { return d ? d->ngroup : 0; }
size_t dt_offload_optim_buffer_bytes(const dt_offload_optim *d)
{
    return d ? (size_t)d->nbuf * (size_t)d->nstate * d->S * sizeof(float) : 0;
}
