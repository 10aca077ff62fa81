/* DDP's iteration around the reduction engine (reducer.c): the grad-ready
 * hook, the end-of-backward mark, unused parameters, dt_ddp_wait, stats.
 *
 * dt_ddp_forward starts an iteration (dt_reducer_begin) and records a tape
 * mark before the model's forward. During backward each parameter's
 * grad-ready hook hands the parameter to the engine, which posts complete
 * buckets in order. Backward reaches the mark after every node of the
 * forward, i.e. when backward is over: there we check for parameters
 * without gradient (error, or with find_unused_parameters mark them ready
 * and all-reduce the used-bitmap), post what is left, and count how many
 * all-reduces were posted, and already done, while backward ran.
 * dt_ddp_wait then waits only for what is outstanding. A model of several
 * parameter dtypes has a reducer per dtype: each call here goes to the
 * reducer of the parameter's dtype, or to each reducer in turn. */
#include "parallel/ddp/ddp_impl.h"

#include <stdio.h>
#include <string.h>

static double now_rel(const dt_ddp *d) { return dt_time_s() - d->t0; }

static dt_status fail(dt_ddp *d, dt_status st)
{
    d->state = DT__DDP_FAILED;
    d->fail_st = st;
    snprintf(d->fail_msg, sizeof d->fail_msg, "%s", dt_last_error());
    return st;
}

int dt__ddp_num_ready(const dt_ddp *d)
{
    int n = 0;
    for (int k = 0; k < d->nred; k++)
        n += dt_reducer_num_ready(d->red[k]);
    return n;
}

static dt_reducer *red_of(const dt_ddp *d, size_t entry) { return d->red[d->red_of_entry[entry]]; }

void dt__ddp_begin_iteration(dt_ddp *d)
{
    for (int k = 0; k < d->nred; k++)
        dt_reducer_begin(d->red[k]);
    if (d->used_local)
        memset(d->used_local, 1, (size_t)d->np);
    d->marks_live = 0;
    d->t0 = dt_time_s();
    d->t_bwd_end = -1;
    d->state = DT__DDP_PREPARED;
}

dt_status dt__ddp_grad_ready(dt_model *m, size_t index, const dt_param_info *info, void *ud)
{
    (void)m;
    dt_ddp *d = ud;
    if (d->no_sync)
        return DT_OK;
    if (index >= d->nentry || d->slot_of_entry[index] < 0)
        return dt_error(DT_ERR_INTERNAL, "DDP: grad-ready for unknown entry %zu", index);
    if (d->state == DT__DDP_FAILED)
        return dt_error(d->fail_st, "%s", d->fail_msg);
    if (d->state != DT__DDP_PREPARED)
        return dt_error(DT_ERR_STATE,
                        "DDP: gradient of '%s' arrived outside a DDP iteration: run the forward with "
                        "dt_ddp_forward (not dt_model_forward) in grad mode before backward",
                        info ? info->name : "?");
    dt_status st = dt_reducer_grad_ready(red_of(d, index), index);
    return st < 0 ? fail(d, dt_error_wrap(st, "DDP")) : DT_OK;
}

/* Names of the parameters without gradient, for the error. */
static void unready_names(const dt_ddp *d, char *buf, size_t cap, int *count)
{
    size_t len = 0;
    int n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < d->nentry; i++) {
        if (d->slot_of_entry[i] < 0 || dt_reducer_is_ready(red_of(d, i), i))
            continue;
        dt_param_info e;
        if (dt_model_entry(d->m, i, &e) < 0)
            continue;
        if (n < 8 && len < cap) {
            int w = snprintf(buf + len, cap - len, "%s'%s'", n ? ", " : "", e.name);
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
    /* overlap accounting: everything posted so far was posted during backward */
    int posted = 0, done = 0;
    for (int k = 0; k < d->nred; k++) {
        int pk = 0, dk = 0;
        dt_reducer_progress(d->red[k], &pk, &dk);
        posted += pk;
        done += dk;
    }
    if (dt__ddp_num_ready(d) < d->np) {
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
        for (size_t i = 0; i < d->nentry; i++)
            if (d->slot_of_entry[i] >= 0 && !dt_reducer_is_ready(red_of(d, i), i)) {
                d->used_local[d->slot_of_entry[i]] = 0;
                dt_status st = dt_reducer_grad_ready(red_of(d, i), i);
                if (st < 0)
                    return fail(d, dt_error_wrap(st, "DDP"));
            }
    }
    d->st.posted_in_backward += (uint64_t)posted;
    d->st.done_in_backward += (uint64_t)done;
    dt_status st = DT_OK;
    for (int k = 0; k < d->nred && st >= 0; k++)
        st = dt_reducer_finish(d->red[k]);
    if (st < 0)
        return fail(d, dt_error_wrap(st, "DDP"));
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
    for (int k = 0; k < d->nred; k++)
        dt_reducer_drain(d->red[k]);
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
        if (dt__ddp_num_ready(d) == 0) { /* forward without backward (or no_sync): nothing to do */
            d->state = DT__DDP_IDLE;
            return DT_OK;
        }
        return fail(d, dt_error(DT_ERR_STATE, "DDP: dt_ddp_wait before backward finished (%d of %d "
                                              "gradients arrived); did backward fail?",
                                dt__ddp_num_ready(d), d->np));
    }
    if (d->state != DT__DDP_REDUCING)
        return DT_OK;
    double t = dt_time_s();
    dt_status st = DT_OK;
    for (int k = 0; k < d->nred; k++) { /* every reducer, also after one failed: none left in flight */
        dt_status sk = dt_reducer_wait(d->red[k]);
        st = st < 0 ? st : sk;
    }
    if (st < 0) {
        dt_error_wrap(st, "DDP");
        fail(d, st);
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

int dt_ddp_num_buckets(const dt_ddp *d)
{
    int n = 0;
    for (int k = 0; d && k < d->nred; k++)
        n += dt_reducer_num_buckets(d->red[k]);
    return n;
}

/* Bucket k of dt_ddp_bucket counts through red[0]'s buckets, then red[1]'s. */
static dt_status bucket_of(const dt_ddp *d, int k, dt_reducer_bucket_info *b)
{
    for (int r = 0; r < d->nred; r++) {
        int n = dt_reducer_num_buckets(d->red[r]);
        if (k >= 0 && k < n)
            return dt_reducer_bucket(d->red[r], k, b);
        k -= n;
    }
    return DT_ERR_RANGE;
}

/* Buckets posted and bytes reduced, over every reducer. */
static void counters(const dt_ddp *d, uint64_t *posted, uint64_t *bytes)
{
    *posted = *bytes = 0;
    for (int k = 0; k < d->nred; k++) {
        uint64_t p = 0, b = 0;
        dt_reducer_counters(d->red[k], &p, &b);
        *posted += p;
        *bytes += b;
    }
}

dt_status dt_ddp_bucket(const dt_ddp *d, int k, dt_ddp_bucket_info *out)
{
    if (!d || !out)
        return dt_error(DT_ERR_NULL, "dt_ddp_bucket: NULL argument");
    dt_reducer_bucket_info b;
    dt_status st = bucket_of(d, k, &b);
    if (st < 0)
        return dt_error(st, "dt_ddp_bucket: bucket %d of %d", k, dt_ddp_num_buckets(d));
    *out = (dt_ddp_bucket_info){.offset = b.offset,
                                .numel = b.numel,
                                .bytes = b.bytes,
                                .nparams = b.nparams,
                                .first_entry = b.first_entry,
                                .last_entry = b.last_entry,
                                .ready_s = b.ready_s,
                                .posted_s = b.posted_s,
                                .done_s = b.done_s};
    return DT_OK;
}

dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d)
{
    dt_ddp_stats z;
    memset(&z, 0, sizeof z);
    if (!d)
        return z;
    dt_ddp_stats s = d->st;
    counters(d, &s.buckets_posted, &s.bytes_reduced);
    s.buckets_posted -= d->st.buckets_posted; /* counters since the last reset (stored as offsets) */
    s.bytes_reduced -= d->st.bytes_reduced;
    return s;
}

void dt_ddp_reset_stats(dt_ddp *d)
{
    if (!d)
        return;
    memset(&d->st, 0, sizeof d->st);
    /* the engine's counters run on; remember where they stood */
    counters(d, &d->st.buckets_posted, &d->st.bytes_reduced);
}

bool dt_ddp_param_used(const dt_ddp *d, size_t index)
{
    if (!d || index >= d->nentry || d->slot_of_entry[index] < 0)
        return false;
    if (!d->p.find_unused_parameters)
        return true;
    return d->used_global[d->slot_of_entry[index]] != 0;
}
