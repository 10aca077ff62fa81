/* The gradient-reduction engine: buckets over a flat gradient buffer,
 * grad-ready counting, strictly ordered posting, waiting for what is
 * outstanding. DDP drives it today; ZeRO-2/3 will drive it with the
 * reduce-scatter collective.
 *
 * Buckets: walk the parameters in model order, adding
 * each to the open bucket; close the bucket as soon as its size (the sum of
 * its tensors' bytes) reaches its limit: first_bucket_mb for the first
 * bucket, the cap for every later one. Then reverse the list (bucket 0 holds
 * the last parameters, whose gradients are ready first in backward).
 * Because a model's parameters sit in the flat buffer in model order, a
 * bucket is one element range of the buffer (its parameters plus the zero
 * padding between them); reducing the padding costs a few bytes and keeps it
 * zero.
 *
 * Iteration: begin resets the counts. Each grad-ready decrements its
 * bucket's pending count; a bucket that reaches zero is complete, and every
 * complete bucket whose predecessors were all posted is posted, so posts
 * happen in bucket-index order on every rank whatever order gradients land
 * in (the collectives match). finish posts what is left; wait waits only
 * for the requests still outstanding.
 *
 * What is posted: the comm hook's post when one is installed, else the default for
 * the collective: all-reduce AVG (or scale by 1/W then all-reduce SUM with
 * predivide, PyTorch's rounding), or reduce-scatter: the bucket's first
 * W * floor(n / W) elements as W equal slices, in place (rank r's slice
 * lands at its own place in the buffer), plus an all-reduce of the
 * n mod W tail elements, which every rank keeps. An equal-count
 * reduce-scatter needs equal slices; the tail keeps the bucket exact
 * without padding parameters.
 *
 * Low-precision reduction (reduce_dtype bf16/f16): the bucket is rounded
 * into its range of a 2-byte copy of the buffer, the collective runs on the
 * copy (the comm layer accumulates bf16/f16 in f32), and wait widens what
 * this rank keeps (the whole bucket, or its slice plus the tail) back into
 * the f32 gradients. Half the bytes on the wire, one rounding of the
 * gradients and one of the result. A bf16/f16 gradient flat (a model that
 * holds its parameters in bf16/f16) is reduced in place in its own dtype
 * (reduce_dtype must be that dtype: no copy, no rounding besides the
 * collective's); comm hooks and predivide take f32 gradients only.
 *
 * Communication hooks (parallel.h): each bucket's dt_grad_bucket (its
 * range, its parameters' shapes and offsets) is built once at init, so a
 * hook sees the same buckets every step; only `step` changes. A hook with a
 * `then` slot reduces in stages: wait runs rounds (wait for every bucket's
 * current request in bucket order, then call `then` for each in bucket
 * order) until no bucket posts again. Rounds keep the collectives in the
 * same order on every rank while the buckets' stages overlap each other;
 * running `then` when a test happens to see a request complete would not
 * (ranks would see different completion orders).
 *
 * From the first post until wait, the gradient buffer is marked in flight
 * (base/inflight.h): an optimizer step or clipping over it fails with the
 * owner's hint (DDP: "call dt_ddp_wait") instead of reading half-reduced
 * gradients. */
#include "base/inflight.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    size_t entry, offset, numel;
    const char *name;
    int bucket;
    bool ready;
} rparam;

typedef struct {
    size_t offset, numel, bytes;
    int p_lo, p_hi;      /* parameter slots [p_lo, p_hi), model order */
    int pending;
    bool complete, posted;
    dt_req *req[2];      /* reduce-scatter may post a tail all-reduce too */
    dt_grad_bucket gb;   /* what a hook sees (fixed at init but for step) */
    bool staged;         /* a hook's `then` still has to run for this bucket */
    double ready_s, posted_s, done_s;
} rbucket;

struct dt_reducer {
    dt_pg *pg;           /* the group reductions are posted on: the caller's, or hpg */
    dt_pg *hpg;          /* params.hierarchical: dt_pg_hierarchical(caller's group), owned */
    dt_model *m;
    dt_reducer_params p;
    char hint[256];
    int rank, world;
    char *grads;         /* the gradient flat: gdt elements */
    dt_dtype gdt;
    size_t ges;          /* its element size */
    size_t flat_numel;
    rparam *params;
    int np;
    int *slot_of_entry;
    size_t nentry;
    rbucket *b;
    int nb;
    uint16_t *low;       /* reduce_dtype bf16/f16: the 2-byte copy of the buffer; else NULL */
    int next_post;
    int nready;
    bool inflight;
    dt_comm_hook hookv;  /* valid when hook */
    bool hook;
    void *hook_state;
    dt_grad_param *gparams; /* np entries, model order; the buckets' params point in */
    uint64_t step;       /* synchronised iterations whose wait succeeded */
    bool any_posted;     /* in this iteration */
    double t0;
    uint64_t buckets_posted, bytes_reduced;
};

dt_reducer_params dt_reducer_params_default(void)
{
    dt_reducer_params p;
    memset(&p, 0, sizeof p);
    p.bucket_cap_mb = 25.0;
    p.first_bucket_mb = 1.0;
    p.collective = DT_REDUCER_ALLREDUCE;
    p.predivide = false;
    p.reduce_dtype = DT_F32;
    p.wait_hint = NULL;
    return p;
}

static dt_status build_buckets(dt_reducer *r)
{
    const size_t mib = (size_t)1 << 20;
    size_t limits[2] = {(size_t)(r->p.first_bucket_mb * (double)mib), (size_t)(r->p.bucket_cap_mb * (double)mib)};
    rbucket *tmp = dt_calloc((size_t)r->np * sizeof *tmp); /* model order first; reversed below */
    r->b = dt_calloc((size_t)r->np * sizeof *r->b);
    if (!tmp || !r->b) {
        dt_free(tmp);
        return dt_error(DT_ERR_NO_MEMORY, "dt_reducer_init: buckets");
    }
    int nb = 0, li = 0;
    rbucket *cur = NULL;
    for (int i = 0; i < r->np; i++) {
        if (!cur) {
            cur = &tmp[nb++];
            cur->p_lo = i;
        }
        cur->p_hi = i + 1;
        cur->bytes += r->params[i].numel * r->ges;
        if (cur->bytes >= limits[li]) {
            cur = NULL;
            li = 1;
        }
    }
    for (int k = 0; k < nb; k++) {
        rbucket *b = &r->b[k];
        *b = tmp[nb - 1 - k];
        const rparam *first = &r->params[b->p_lo], *last = &r->params[b->p_hi - 1];
        b->offset = first->offset;
        b->numel = last->offset + last->numel - first->offset;
        for (int i = b->p_lo; i < b->p_hi; i++) {
            r->params[i].bucket = k;
            r->gparams[i].offset -= b->offset; /* relative to the bucket */
        }
        b->ready_s = b->posted_s = b->done_s = -1;
        b->gb = (dt_grad_bucket){.index = k,
                                 .nbuckets = nb,
                                 .data = r->gdt == DT_F32 ? (float *)(void *)r->grads + b->offset : NULL,
                                 .offset = b->offset,
                                 .numel = b->numel,
                                 .shard_numel = r->p.collective == DT_REDUCER_REDUCE_SCATTER
                                                    ? b->numel / (size_t)r->world
                                                    : 0,
                                 .nparams = b->p_hi - b->p_lo,
                                 .params = r->gparams + b->p_lo};
    }
    r->nb = nb;
    dt_free(tmp);
    return DT_OK;
}

dt_status dt_reducer_init(dt_pg *pg, dt_model *m, const dt_flat *grads, const dt_reducer_params *pp, dt_reducer **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_reducer_init: out is NULL");
    *out = NULL;
    if (!pg || !m || !grads || !grads->base)
        return dt_error(DT_ERR_NULL, "dt_reducer_init: %s is NULL",
                        !pg ? "process group" : !m ? "model" : "gradient flat");
    if ((grads->dtype != DT_F32 && grads->dtype != DT_BF16 && grads->dtype != DT_F16) || grads->offset != 0)
        return dt_error(DT_ERR_DTYPE, "dt_reducer_init: the gradient flat must be a whole f32, bf16 or f16 buffer "
                                      "(%s, offset %zu)", dt_dtype_name(grads->dtype), grads->offset);
    if (grads->dtype != DT_F32 && (!pp || pp->reduce_dtype != grads->dtype || pp->predivide))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_reducer_init: %s gradients are reduced in %s, without predivide "
                                            "(asked: reduce_dtype %s%s)", dt_dtype_name(grads->dtype),
                        dt_dtype_name(grads->dtype), dt_dtype_name(pp ? pp->reduce_dtype : DT_F32),
                        pp && pp->predivide ? ", predivide" : "");
    dt_reducer_params p = pp ? *pp : dt_reducer_params_default();
    if (!(p.bucket_cap_mb > 0) || !(p.first_bucket_mb > 0))
        return dt_error(DT_ERR_INVALID_ARG,
                        "dt_reducer_init: bucket_cap_mb (%g) and first_bucket_mb (%g) must be > 0",
                        p.bucket_cap_mb, p.first_bucket_mb);
    if ((unsigned)p.collective > DT_REDUCER_REDUCE_SCATTER)
        return dt_error(DT_ERR_INVALID_ARG, "dt_reducer_init: unknown collective %d", (int)p.collective);
    if (p.reduce_dtype != DT_F32 && p.reduce_dtype != DT_BF16 && p.reduce_dtype != DT_F16)
        return dt_error(DT_ERR_INVALID_ARG, "dt_reducer_init: reduce_dtype %s (f32, bf16 or f16)",
                        dt_dtype_name(p.reduce_dtype));
    dt_reducer *r = dt_calloc(sizeof *r);
    if (!r)
        return dt_error(DT_ERR_NO_MEMORY, "dt_reducer_init");
    r->pg = pg;
    r->m = m;
    r->p = p;
    snprintf(r->hint, sizeof r->hint, "%s",
             p.wait_hint ? p.wait_hint
                         : "gradient reductions are still in flight: call dt_reducer_wait before reading "
                           "the gradients");
    r->p.wait_hint = r->hint;
    r->rank = dt_pg_rank(pg);
    r->world = dt_pg_size(pg);
    r->grads = grads->base;
    r->gdt = grads->dtype;
    r->ges = dt_dtype_size(grads->dtype);
    r->flat_numel = grads->numel;
    r->nentry = dt_model_num_entries(m);
    /* the trained parameters of this flat's dtype (a model with several
     * parameter dtypes has one reducer per dtype) */
    r->np = 0;
    for (size_t i = 0; i < r->nentry; i++) {
        dt_param_info e;
        if (dt_model_entry(m, i, &e) == DT_OK && !e.is_buffer && e.tied_to < 0 && e.dtype == r->gdt)
            r->np++;
    }
    dt_status st = DT_ERR_NO_MEMORY;
    if (r->np <= 0) {
        st = dt_error(DT_ERR_INVALID_ARG, "dt_reducer_init: the model has no %s parameters", dt_dtype_name(r->gdt));
        goto fail;
    }
    r->params = dt_calloc((size_t)r->np * sizeof *r->params);
    r->gparams = dt_calloc((size_t)r->np * sizeof *r->gparams);
    r->slot_of_entry = dt_calloc((r->nentry ? r->nentry : 1) * sizeof *r->slot_of_entry);
    if (!r->params || !r->gparams || !r->slot_of_entry) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_reducer_init: out of memory");
        goto fail;
    }
    int np = 0;
    size_t end = 0;
    for (size_t i = 0; i < r->nentry; i++) {
        dt_param_info e;
        if ((st = dt_model_entry(m, i, &e)) < 0)
            goto fail;
        r->slot_of_entry[i] = -1;
        /* a tied entry is its source's tensor; another dtype, another reducer's */
        if (e.is_buffer || e.tied_to >= 0 || e.dtype != r->gdt)
            continue;
        if (np >= r->np) {
            st = dt_error(DT_ERR_INTERNAL, "dt_reducer_init: parameter '%s': more parameters than counted", e.name);
            goto fail;
        }
        if (e.offset < end || e.offset + e.numel > r->flat_numel) { /* buckets are ranges: the flat layout must follow model order */
            st = dt_error(DT_ERR_INTERNAL,
                          "dt_reducer_init: parameter '%s' at [%zu, +%zu) is not after the previous parameter "
                          "(ends at %zu) inside the gradient flat (%zu elements)",
                          e.name, e.offset, e.numel, end, r->flat_numel);
            goto fail;
        }
        end = e.offset + e.numel;
        r->params[np] = (rparam){.entry = i, .offset = e.offset, .numel = e.numel, .name = e.name};
        dt_grad_param *gp = &r->gparams[np];
        *gp = (dt_grad_param){.entry = i, .name = e.name, .offset = e.offset, .numel = e.numel, .ndim = e.ndim};
        memcpy(gp->shape, e.shape, sizeof gp->shape);
        r->slot_of_entry[i] = np++;
    }
    r->np = np;
    if ((st = build_buckets(r)) < 0)
        goto fail;
    if (p.reduce_dtype != r->gdt && !(r->low = dt_calloc((r->flat_numel ? r->flat_numel : 1) * sizeof(uint16_t)))) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_reducer_init: %s copy of %zu gradients", dt_dtype_name(p.reduce_dtype),
                      r->flat_numel);
        goto fail;
    }
    if (p.hierarchical && r->world > 1) { /* last: every check above agrees across ranks first */
        if ((st = dt_pg_hierarchical(pg, &r->hpg)) < 0) {
            dt_error_wrap(st, "dt_reducer_init: the hierarchical group");
            goto fail;
        }
        r->pg = r->hpg;
    }
    *out = r;
    return DT_OK;
fail:
    dt_pg_free(r->hpg);
    dt_free(r->low);
    dt_free(r->b);
    dt_free(r->params);
    dt_free(r->gparams);
    dt_free(r->slot_of_entry);
    dt_free(r);
    return st < 0 ? st : DT_ERR_INTERNAL;
}

void dt_reducer_drain(dt_reducer *r)
{
    if (!r)
        return;
    for (int k = 0; k < r->nb; k++)
        for (int j = 0; j < 2; j++)
            if (r->b[k].req[j]) {
                dt_req_wait(r->b[k].req[j], -1);
                dt_req_free(r->b[k].req[j]);
                r->b[k].req[j] = NULL;
            }
    for (int k = 0; k < r->nb; k++)
        r->b[k].staged = false;
    if (r->inflight) {
        dt__inflight_clear(r);
        r->inflight = false;
    }
}

void dt_reducer_free(dt_reducer *r)
{
    if (!r)
        return;
    dt_reducer_drain(r);
    dt_pg_free(r->hpg);
    dt_free(r->low);
    dt_free(r->b);
    dt_free(r->params);
    dt_free(r->gparams);
    dt_free(r->slot_of_entry);
    dt_free(r);
}

dt_status dt_reducer_register_comm_hook(dt_reducer *r, const dt_comm_hook *h, void *state)
{
    if (!r)
        return dt_error(DT_ERR_NULL, "dt_reducer_register_comm_hook: handle is NULL");
    if (h && !h->post)
        return dt_error(DT_ERR_INVALID_ARG, "dt_reducer_register_comm_hook: hook '%s' has no post function",
                        h->name ? h->name : "?");
    if (dt_reducer_outstanding(r))
        return dt_error(DT_ERR_STATE,
                        "dt_reducer_register_comm_hook: reductions are outstanding; register between iterations");
    if (h && r->gdt != DT_F32)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_reducer_register_comm_hook: hook '%s': comm hooks take f32 "
                                            "gradients; these are %s", h->name ? h->name : "?",
                        dt_dtype_name(r->gdt));
    r->hook = h != NULL;
    if (h)
        r->hookv = *h;
    r->hook_state = h ? state : NULL;
    return DT_OK;
}

void dt_reducer_set_comm_hook(dt_reducer *r, dt_comm_hook_fn fn, void *state)
{
    const dt_comm_hook h = {.name = "user", .post = fn, .then = NULL};
    dt_reducer_register_comm_hook(r, fn ? &h : NULL, state);
}

static double now_rel(const dt_reducer *r) { return dt_time_s() - r->t0; }

void dt_reducer_begin(dt_reducer *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->np; i++)
        r->params[i].ready = false;
    for (int k = 0; k < r->nb; k++) {
        rbucket *b = &r->b[k];
        b->pending = b->p_hi - b->p_lo;
        b->complete = b->posted = b->staged = false;
        b->req[0] = b->req[1] = NULL;
        b->ready_s = b->posted_s = b->done_s = -1;
    }
    r->next_post = 0;
    r->nready = 0;
    r->any_posted = false;
    r->t0 = dt_time_s();
}

/* The default posts: all-reduce (average), or reduce-scatter plus tail. */
static dt_status post_default(dt_reducer *r, const dt_grad_bucket *gb, rbucket *b)
{
    dt_reduce_op op = DT_REDUCE_AVG;
    if (r->gdt != DT_F32) { /* bf16/f16 gradients: in place, in their dtype */
        char *lb = r->grads + gb->offset * r->ges;
        if (r->p.collective == DT_REDUCER_ALLREDUCE)
            return dt_pg_allreduce_async(r->pg, DT_IN_PLACE, lb, gb->numel, r->gdt, op, &b->req[0]);
        const size_t c = gb->shard_numel, body = c * (size_t)r->world;
        dt_status st = DT_OK;
        if (c > 0)
            st = dt_pg_reduce_scatter_async(r->pg, lb, lb + (size_t)r->rank * c * r->ges, c, r->gdt, op, &b->req[0]);
        if (st >= 0 && body < gb->numel)
            st = dt_pg_allreduce_async(r->pg, DT_IN_PLACE, lb + body * r->ges, gb->numel - body, r->gdt, op,
                                       &b->req[1]);
        return st;
    }
    float *g = gb->data;
    if (r->p.predivide) {
        const float s = 1.0f / (float)r->world;
        for (size_t i = 0; i < gb->numel; i++)
            g[i] *= s;
        op = DT_REDUCE_SUM;
    }
    /* the buffer the collective runs on: the gradients, or their 2-byte copy */
    const dt_dtype dt = r->p.reduce_dtype;
    void *buf = g;
    size_t esz = sizeof(float);
    if (r->low) {
        buf = r->low + gb->offset;
        esz = sizeof(uint16_t);
        dt_status cs = dt_k_convert(g, DT_F32, buf, dt, (int64_t)gb->numel);
        if (cs < 0)
            return cs;
    }
    char *bb = buf;
    if (r->p.collective == DT_REDUCER_ALLREDUCE)
        return dt_pg_allreduce_async(r->pg, DT_IN_PLACE, buf, gb->numel, dt, op, &b->req[0]);
    const size_t c = gb->shard_numel, body = c * (size_t)r->world;
    dt_status st = DT_OK;
    if (c > 0)
        st = dt_pg_reduce_scatter_async(r->pg, buf, bb + (size_t)r->rank * c * esz, c, dt, op, &b->req[0]);
    if (st >= 0 && body < gb->numel)
        st = dt_pg_allreduce_async(r->pg, DT_IN_PLACE, bb + body * esz, gb->numel - body, dt, op, &b->req[1]);
    return st;
}

static dt_status post_bucket(dt_reducer *r, int k)
{
    rbucket *b = &r->b[k];
    if (!r->inflight) {
        dt_status st = dt__inflight_mark(r, r->grads, r->flat_numel * r->ges, r->hint);
        if (st < 0)
            return st;
        r->inflight = true;
    }
    b->gb.step = r->step;
    dt_pg_set_labelf(r->pg, "DDP bucket %d", k); /* the flight recorder's label */
    dt_status st = r->hook ? r->hookv.post(r->hook_state, r->pg, &b->gb, &b->req[0]) : post_default(r, &b->gb, b);
    if (st < 0)
        return dt_error_wrap(st, "posting the reduction of gradient bucket %d (%zu floats)%s%s", k, b->numel,
                             r->hook ? " by comm hook " : "", r->hook && r->hookv.name ? r->hookv.name : "");
    b->posted = true;
    b->staged = r->hook && r->hookv.then;
    r->any_posted = true;
    b->posted_s = now_rel(r);
    r->buckets_posted++;
    r->bytes_reduced += b->numel * (r->low && !r->hook ? sizeof(uint16_t) : r->ges);
    return DT_OK;
}

static dt_status post_in_order(dt_reducer *r)
{
    while (r->next_post < r->nb && r->b[r->next_post].complete) {
        dt_status st = post_bucket(r, r->next_post);
        if (st < 0)
            return st;
        r->next_post++;
    }
    return DT_OK;
}

dt_status dt_reducer_grad_ready(dt_reducer *r, size_t entry)
{
    if (!r)
        return dt_error(DT_ERR_NULL, "dt_reducer_grad_ready: handle is NULL");
    if (entry >= r->nentry || r->slot_of_entry[entry] < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_reducer_grad_ready: entry %zu is not a parameter", entry);
    rparam *p = &r->params[r->slot_of_entry[entry]];
    if (p->ready)
        return dt_error(DT_ERR_STATE,
                        "parameter '%s' was marked ready twice in one iteration (backward run twice over one "
                        "forward?)",
                        p->name);
    p->ready = true;
    r->nready++;
    rbucket *b = &r->b[p->bucket];
    if (--b->pending == 0) {
        b->complete = true;
        b->ready_s = now_rel(r);
    }
    return post_in_order(r);
}

dt_status dt_reducer_finish(dt_reducer *r)
{
    if (!r)
        return dt_error(DT_ERR_NULL, "dt_reducer_finish: handle is NULL");
    if (r->nready < r->np)
        return dt_error(DT_ERR_STATE, "dt_reducer_finish: %d of %d parameters have no gradient yet",
                        r->np - r->nready, r->np);
    return post_in_order(r);
}

void dt_reducer_progress(dt_reducer *r, int *posted, int *done)
{
    int np = 0, nd = 0;
    if (r)
        for (int k = 0; k < r->next_post; k++) {
            rbucket *b = &r->b[k];
            np++;
            bool ok = (b->req[0] || b->req[1]) && !b->staged;
            for (int j = 0; j < 2; j++)
                if (b->req[j] && dt_req_test(b->req[j]) != DT_OK)
                    ok = false;
            if (ok) {
                nd++;
                if (b->done_s < 0)
                    b->done_s = now_rel(r);
            }
        }
    if (posted)
        *posted = np;
    if (done)
        *done = nd;
}

/* The reduced low-precision values this rank keeps, back into the f32 gradients. */
static void widen(dt_reducer *r, const rbucket *b)
{
    float *g = (float *)(void *)r->grads + b->offset; /* f32 gradients: r->low exists only for them */
    const uint16_t *l = r->low + b->offset;
    if (r->p.collective == DT_REDUCER_ALLREDUCE) {
        dt_k_convert(l, r->p.reduce_dtype, g, DT_F32, (int64_t)b->numel);
        return;
    }
    const size_t c = b->numel / (size_t)r->world, body = c * (size_t)r->world, mine = (size_t)r->rank * c;
    dt_k_convert(l + mine, r->p.reduce_dtype, g + mine, DT_F32, (int64_t)c);
    if (body < b->numel)
        dt_k_convert(l + body, r->p.reduce_dtype, g + body, DT_F32, (int64_t)(b->numel - body));
}

dt_status dt_reducer_wait(dt_reducer *r)
{
    if (!r)
        return dt_error(DT_ERR_NULL, "dt_reducer_wait: handle is NULL");
    dt_status st = DT_OK;
    for (bool more = true; more;) {
        for (int k = 0; k < r->nb; k++) {
            rbucket *b = &r->b[k];
            for (int j = 0; j < 2; j++) {
                if (!b->req[j])
                    continue;
                dt_status s = dt_req_wait(b->req[j], -1);
                if (s < 0 && st >= 0)
                    st = dt_error(s, "reduction of gradient bucket %d failed: %s", k, dt_req_message(b->req[j]));
                dt_req_free(b->req[j]);
                b->req[j] = NULL;
            }
        }
        /* a round of the hooks' next stages, in bucket order */
        more = false;
        for (int k = 0; k < r->nb && st >= 0; k++) {
            rbucket *b = &r->b[k];
            if (!b->staged)
                continue;
            dt_status s = r->hookv.then(r->hook_state, r->pg, &b->gb, &b->req[0]);
            if (s < 0) {
                st = dt_error_wrap(s, "comm hook %s, gradient bucket %d", r->hookv.name ? r->hookv.name : "?", k);
                break;
            }
            b->staged = b->req[0] != NULL;
            more = more || b->staged;
        }
        if (st < 0) /* collect what a failed round left posted, then stop */
            for (int k = 0; k < r->nb; k++) {
                rbucket *b = &r->b[k];
                b->staged = false;
                if (b->req[0]) {
                    dt_req_wait(b->req[0], -1);
                    dt_req_free(b->req[0]);
                    b->req[0] = NULL;
                }
            }
    }
    for (int k = 0; k < r->nb; k++) {
        rbucket *b = &r->b[k];
        if (b->posted && b->done_s < 0)
            b->done_s = now_rel(r);
        if (b->posted && r->low && !r->hook && st >= 0)
            widen(r, b);
    }
    if (st >= 0 && r->any_posted) {
        r->step++;
        r->any_posted = false;
    }
    /* the buffer is no longer read by a collective either way */
    if (r->inflight) {
        dt__inflight_clear(r);
        r->inflight = false;
    }
    return st;
}

bool dt_reducer_outstanding(const dt_reducer *r)
{
    if (!r)
        return false;
    for (int k = 0; k < r->nb; k++)
        if (r->b[k].req[0] || r->b[k].req[1])
            return true;
    return false;
}

int dt_reducer_num_ready(const dt_reducer *r) { return r ? r->nready : 0; }
int dt_reducer_num_params(const dt_reducer *r) { return r ? r->np : 0; }

bool dt_reducer_is_ready(const dt_reducer *r, size_t entry)
{
    if (!r || entry >= r->nentry || r->slot_of_entry[entry] < 0)
        return false;
    return r->params[r->slot_of_entry[entry]].ready;
}

int dt_reducer_num_buckets(const dt_reducer *r) { return r ? r->nb : 0; }

dt_status dt_reducer_bucket(const dt_reducer *r, int k, dt_reducer_bucket_info *out)
{
    if (!r || !out)
        return dt_error(DT_ERR_NULL, "dt_reducer_bucket: NULL argument");
    if (k < 0 || k >= r->nb)
        return dt_error(DT_ERR_RANGE, "dt_reducer_bucket: bucket %d of %d", k, r->nb);
    const rbucket *b = &r->b[k];
    out->offset = b->offset;
    out->numel = b->numel;
    out->bytes = b->bytes;
    out->nparams = b->p_hi - b->p_lo;
    out->first_entry = r->params[b->p_lo].entry;
    out->last_entry = r->params[b->p_hi - 1].entry;
    out->ready_s = b->ready_s;
    out->posted_s = b->posted_s;
    out->done_s = b->done_s;
    return DT_OK;
}

dt_status dt_reducer_shard(const dt_reducer *r, int k, int rank, size_t *offset, size_t *numel)
{
    if (!r || !offset || !numel)
        return dt_error(DT_ERR_NULL, "dt_reducer_shard: NULL argument");
    if (k < 0 || k >= r->nb || rank < 0 || rank >= r->world)
        return dt_error(DT_ERR_RANGE, "dt_reducer_shard: bucket %d of %d, rank %d of %d", k, r->nb, rank, r->world);
    const rbucket *b = &r->b[k];
    if (r->p.collective == DT_REDUCER_ALLREDUCE) {
        *offset = b->offset;
        *numel = b->numel;
    } else {
        const size_t c = b->numel / (size_t)r->world;
        *offset = b->offset + (size_t)rank * c;
        *numel = c;
    }
    return DT_OK;
}

void dt_reducer_counters(const dt_reducer *r, uint64_t *buckets_posted, uint64_t *bytes_reduced)
{
    if (buckets_posted)
        *buckets_posted = r ? r->buckets_posted : 0;
    if (bytes_reduced)
        *bytes_reduced = r ? r->bytes_reduced : 0;
}
