/* The DDP reducer: buckets over the flat gradient buffer, grad-ready hooks,
 * in-order posting, the end-of-backward check, waiting.
 *
 * Buckets (SEMANTICS.md 3.1): walk the parameters in model order, adding
 * each to the open bucket; close the bucket as soon as its size (the sum of
 * its tensors' bytes) reaches its limit: 1 MiB for the first bucket, the cap
 * for every later one. Then reverse the list. Because a model's parameters
 * sit in the flat buffer in model order, a bucket is one element range of
 * the buffer (its parameters plus the zero padding between them); reducing
 * the padding costs a few bytes and keeps it zero.
 *
 * Iteration: dt_ddp_forward resets the per-iteration state and records a
 * tape mark before the model's forward. During backward each parameter's
 * grad-ready hook decrements its bucket's pending count; a bucket that
 * reaches zero is complete, and every complete bucket whose predecessors
 * were all posted is posted (so posts happen in bucket-index order on every
 * rank, whatever order gradients land in). Backward reaches the mark after
 * every node of the forward, i.e. when backward is over: there we check for
 * parameters without gradient (error, or with find_unused_parameters mark
 * them ready and post what is left plus the used-bitmap), and count how
 * many all-reduces were posted, and already done, while backward ran.
 * dt_ddp_wait then waits only for what is outstanding. */
#include "parallel/ddp_impl.h"

#include <stdio.h>
#include <string.h>

dt_status dt__ddp_build_buckets(dt_ddp *d)
{
    const size_t mib = (size_t)1 << 20;
    size_t limits[2] = {(size_t)(d->p.first_bucket_mb * (double)mib), (size_t)(d->p.bucket_cap_mb * (double)mib)};
    /* model order first; reversed below */
    dt__ddp_bucket *tmp = dt_calloc((size_t)d->np * sizeof *tmp);
    if (!tmp)
        return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_ddp_init: buckets");
    int nb = 0, li = 0;
    dt__ddp_bucket *cur = NULL;
    for (int i = 0; i < d->np; i++) {
        if (!cur) {
            cur = &tmp[nb++];
            cur->p_lo = i;
        }
        cur->p_hi = i + 1;
        cur->bytes += d->params[i].numel * sizeof(float);
        if (cur->bytes >= limits[li]) {
            cur = NULL;
            li = 1;
        }
    }
    d->b = dt_calloc((size_t)nb * sizeof *d->b);
    if (!d->b) {
        dt_free(tmp);
        return dt_error_wrap(DT_ERR_NO_MEMORY, "dt_ddp_init: buckets");
    }
    for (int k = 0; k < nb; k++) {
        dt__ddp_bucket *b = &d->b[k];
        *b = tmp[nb - 1 - k];
        const dt__ddp_param *first = &d->params[b->p_lo], *last = &d->params[b->p_hi - 1];
        b->offset = first->offset;
        b->numel = last->offset + last->numel - first->offset;
        for (int i = b->p_lo; i < b->p_hi; i++)
            d->params[i].bucket = k;
        b->ready_s = b->posted_s = b->done_s = -1;
    }
    d->nb = nb;
    dt_free(tmp);
    return DT_OK;
}

static double now_rel(const dt_ddp *d) { return dt_time_s() - d->t0; }

static dt_status fail(dt_ddp *d, dt_status st)
{
    d->state = DT__DDP_FAILED;
    d->fail_st = st;
    snprintf(d->fail_msg, sizeof d->fail_msg, "%s", dt_last_error());
    return st;
}

void dt__ddp_begin_iteration(dt_ddp *d)
{
    for (int i = 0; i < d->np; i++)
        d->params[i].ready = false;
    for (int k = 0; k < d->nb; k++) {
        dt__ddp_bucket *b = &d->b[k];
        b->pending = b->p_hi - b->p_lo;
        b->complete = b->posted = false;
        b->req = NULL;
        b->ready_s = b->posted_s = b->done_s = -1;
    }
    if (d->used_local)
        memset(d->used_local, 1, (size_t)d->np);
    d->next_post = 0;
    d->nready = 0;
    d->marks_live = 0;
    d->t0 = dt_time_s();
    d->t_bwd_end = -1;
    d->state = DT__DDP_PREPARED;
}

static dt_status post_bucket(dt_ddp *d, int k)
{
    dt__ddp_bucket *b = &d->b[k];
    float *g = d->grads + b->offset;
    dt_reduce_op op = DT_REDUCE_AVG;
    if (d->p.predivide) {
        const float s = 1.0f / (float)d->world;
        for (size_t i = 0; i < b->numel; i++)
            g[i] *= s;
        op = DT_REDUCE_SUM;
    }
    dt_status st = dt_pg_allreduce_async(d->pg, DT_IN_PLACE, g, b->numel, DT_F32, op, &b->req);
    if (st < 0)
        return dt_error_wrap(st, "DDP: posting the all-reduce of bucket %d (%zu floats)", k, b->numel);
    b->posted = true;
    b->posted_s = now_rel(d);
    d->st.buckets_posted++;
    d->st.bytes_reduced += b->numel * sizeof(float);
    return DT_OK;
}

/* Post every complete bucket whose predecessors are all posted. */
static dt_status post_in_order(dt_ddp *d)
{
    while (d->next_post < d->nb && d->b[d->next_post].complete) {
        dt_status st = post_bucket(d, d->next_post);
        if (st < 0)
            return st;
        d->next_post++;
    }
    return DT_OK;
}

static dt_status mark_ready(dt_ddp *d, int slot)
{
    dt__ddp_param *p = &d->params[slot];
    p->ready = true;
    d->nready++;
    dt__ddp_bucket *b = &d->b[p->bucket];
    if (--b->pending == 0) {
        b->complete = true;
        b->ready_s = now_rel(d);
    }
    return DT_OK;
}

dt_status dt__ddp_grad_ready(dt_model *m, size_t index, const dt_param_info *info, void *ud)
{
    (void)m;
    (void)info;
    dt_ddp *d = ud;
    if (d->no_sync)
        return DT_OK;
    if (index >= d->nentry || d->slot_of_entry[index] < 0)
        return dt_error(DT_ERR_INTERNAL, "DDP: grad-ready for unknown entry %zu", index);
    int slot = d->slot_of_entry[index];
    if (d->state == DT__DDP_FAILED)
        return dt_error(d->fail_st, "%s", d->fail_msg);
    if (d->state != DT__DDP_PREPARED)
        return dt_error(DT_ERR_STATE,
                        "DDP: gradient of '%s' arrived outside a DDP iteration: run the forward with "
                        "dt_ddp_forward (not dt_model_forward) in grad mode before backward",
                        d->params[slot].name);
    if (d->params[slot].ready)
        return fail(d, dt_error(DT_ERR_STATE,
                                "DDP: parameter '%s' was marked ready twice in one iteration (backward "
                                "run twice over one forward?)",
                                d->params[slot].name));
    mark_ready(d, slot);
    dt_status st = post_in_order(d);
    return st < 0 ? fail(d, st) : DT_OK;
}

/* Names of the parameters without gradient, for the error. */
static void unready_names(const dt_ddp *d, char *buf, size_t cap, int *count)
{
    size_t len = 0;
    int n = 0;
    buf[0] = 0;
    for (int i = 0; i < d->np; i++) {
        if (d->params[i].ready)
            continue;
        if (n < 8 && len < cap) {
            int w = snprintf(buf + len, cap - len, "%s'%s'", n ? ", " : "", d->params[i].name);
            if (w > 0)
                len += (size_t)w;
        } else if (n == 8 && len < cap) {
            int w = snprintf(buf + len, cap - len, ", ...");
            if (w > 0)
                len += (size_t)w;
        }
        n++;
    }
    *count = n;
}

dt_status dt__ddp_end_mark(dt_ctx *ctx, void *ud)
{
    (void)ctx;
    dt_ddp *d = ud;
    if (d->state != DT__DDP_PREPARED)
        return d->state == DT__DDP_FAILED ? dt_error(d->fail_st, "%s", d->fail_msg) : DT_OK;
    if (--d->marks_live > 0)
        return DT_OK; /* an earlier forward on this tape still has to finish */
    if (d->no_sync) {
        /* no_sync was switched on between forward and backward: nothing posted */
        d->state = DT__DDP_IDLE;
        return DT_OK;
    }
    if (d->nready < d->np) {
        if (!d->p.find_unused_parameters) {
            char names[400];
            int n;
            unready_names(d, names, sizeof names, &n);
            return fail(d, dt_error(DT_ERR_STATE,
                                    "DDP (rank %d): %d parameter%s got no gradient in this backward: %s. "
                                    "Every parameter must take part in the loss, or construct DDP with "
                                    "find_unused_parameters = true",
                                    d->rank, n, n == 1 ? "" : "s", names));
        }
        for (int i = 0; i < d->np; i++)
            if (!d->params[i].ready) {
                d->used_local[i] = 0;
                mark_ready(d, i);
            }
    }
    /* overlap accounting: everything posted so far was posted during backward */
    uint64_t posted = (uint64_t)d->next_post, done = 0;
    for (int k = 0; k < d->next_post; k++)
        if (d->b[k].req && dt_req_test(d->b[k].req) == DT_OK) {
            done++;
            d->b[k].done_s = now_rel(d);
        }
    d->st.posted_in_backward += posted;
    d->st.done_in_backward += done;
    dt_status st = post_in_order(d);
    if (st < 0)
        return fail(d, st);
    if (d->p.find_unused_parameters) {
        st = dt_pg_allreduce_async(d->pg, d->used_local, d->used_global, (size_t)d->np, DT_U8, DT_REDUCE_MAX,
                                   &d->used_req);
        if (st < 0)
            return fail(d, dt_error_wrap(st, "DDP: all-reduce of the used-parameter bitmap"));
    }
    d->t_bwd_end = now_rel(d);
    d->st.last_backward_s = d->t_bwd_end;
    d->state = DT__DDP_REDUCING;
    return DT_OK;
}

/* Wait for (and free) everything posted; used on the error and free paths. */
void dt__ddp_drain(dt_ddp *d)
{
    for (int k = 0; k < d->nb; k++)
        if (d->b[k].req) {
            dt_req_wait(d->b[k].req, -1);
            dt_req_free(d->b[k].req);
            d->b[k].req = NULL;
        }
    if (d->used_req) {
        dt_req_wait(d->used_req, -1);
        dt_req_free(d->used_req);
        d->used_req = NULL;
    }
}

dt_status dt_ddp_wait(dt_ddp *d)
{
    if (!d)
        return dt_error(DT_ERR_NULL, "dt_ddp_wait: handle is NULL");
    if (d->state == DT__DDP_FAILED)
        return dt_error(d->fail_st, "%s", d->fail_msg);
    if (d->state == DT__DDP_PREPARED) {
        if (d->nready == 0) { /* forward without backward (or no_sync): nothing to do */
            d->state = DT__DDP_IDLE;
            return DT_OK;
        }
        return fail(d, dt_error(DT_ERR_STATE, "DDP: dt_ddp_wait before backward finished (%d of %d "
                                              "gradients arrived); did backward fail?",
                                d->nready, d->np));
    }
    if (d->state != DT__DDP_REDUCING)
        return DT_OK;
    double t = dt_time_s();
    dt_status st = DT_OK;
    for (int k = 0; k < d->nb; k++) {
        dt__ddp_bucket *b = &d->b[k];
        if (!b->req)
            continue;
        dt_status s = dt_req_wait(b->req, -1);
        if (s < 0 && st >= 0) {
            st = dt_error(s, "DDP: all-reduce of gradient bucket %d failed: %s", k, dt_req_message(b->req));
            fail(d, st);
        }
        if (b->done_s < 0)
            b->done_s = now_rel(d);
        dt_req_free(b->req);
        b->req = NULL;
    }
    if (d->used_req) {
        dt_status s = dt_req_wait(d->used_req, -1);
        if (s < 0 && st >= 0) {
            st = dt_error(s, "DDP: all-reduce of the used-parameter bitmap failed: %s",
                          dt_req_message(d->used_req));
            fail(d, st);
        }
        dt_req_free(d->used_req);
        d->used_req = NULL;
    }
    double w = dt_time_s() - t;
    d->st.wait_s += w;
    d->st.last_wait_s = w;
    if (st < 0)
        return st;
    d->st.iterations++;
    d->state = DT__DDP_IDLE;
    return DT_OK;
}

int dt_ddp_num_buckets(const dt_ddp *d) { return d ? d->nb : 0; }

dt_status dt_ddp_bucket(const dt_ddp *d, int k, dt_ddp_bucket_info *out)
{
    if (!d || !out)
        return dt_error(DT_ERR_NULL, "dt_ddp_bucket: NULL argument");
    if (k < 0 || k >= d->nb)
        return dt_error(DT_ERR_RANGE, "dt_ddp_bucket: bucket %d of %d", k, d->nb);
    const dt__ddp_bucket *b = &d->b[k];
    out->offset = b->offset;
    out->numel = b->numel;
    out->bytes = b->bytes;
    out->nparams = b->p_hi - b->p_lo;
    out->first_entry = d->params[b->p_lo].entry;
    out->last_entry = d->params[b->p_hi - 1].entry;
    out->ready_s = b->ready_s;
    out->posted_s = b->posted_s;
    out->done_s = b->done_s;
    return DT_OK;
}

dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d)
{
    dt_ddp_stats z;
    memset(&z, 0, sizeof z);
    return d ? d->st : z;
}

void dt_ddp_reset_stats(dt_ddp *d)
{
    if (d)
        memset(&d->st, 0, sizeof d->st);
}

bool dt_ddp_param_used(const dt_ddp *d, size_t index)
{
    if (!d || index >= d->nentry || d->slot_of_entry[index] < 0)
        return false;
    if (!d->p.find_unused_parameters)
        return true;
    return d->used_global[d->slot_of_entry[index]] != 0;
}
