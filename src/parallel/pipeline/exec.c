/* Running one rank's list of a pipeline table (pipeline.h).
 *
 * Each in-flight (stage, micro-batch) has a context of its own, taken from
 * a pool at its F and given back at its B (BW under zbh1): its tape and
 * activations live exactly as long as the schedule keeps the micro-batch,
 * so the pool's arena bytes are the schedule's activation memory (stats).
 *
 * Messages: RECV posts an asynchronous receive into a buffer of the
 * (stage, micro-batch), kept from step to step (no allocation, no page
 * faults of fresh memory per message); the compute action that needs it
 * waits for it. (Posting the next compute action's receives ahead, before
 * the current one computes, was tried and measured worse: an open receive
 * leaves the batch to the progress thread, which naps on it, and the
 * sends posted meanwhile wait for it to wake; posted just before its
 * wait, a receive is run by the waiting thread itself, comm.h.)
 * SEND_F sends straight out of the forward's output (alive until the
 * micro-batch's backward, which cannot start before the next stage has
 * received it, so waiting on that send before the context goes back costs
 * nothing); SEND_B sends a copy of the input gradient (into a buffer of
 * the (stage, micro-batch) kept from step to step, like the receive
 * buffers), so the context can go back at once and no action ever waits
 * on its own send. Sends and
 * receives are batched point to point (comm.h): all in flight together,
 * matched in posting order per pair, which the table's checker made
 * consistent.
 *
 * A failure midway (break_off) fails the pipeline group before anything
 * else: the peers' waits end at once with this rank's message, and no
 * later message can pair with one of the abandoned schedule.
 *
 * Shapes: what crosses a stage boundary is learnt once per input shape by
 * a handshake along the stages (a dry forward without gradients on zeros,
 * its output's dtype and shape sent to the next stage as 10 i64).
 *
 * Evaluation (dt__pipe_exec_forward) does not use the table: the whole
 * batch goes through the stages in order, each rank running its stages as
 * their input arrives (its dtype and shape first, as in the handshake, then
 * the values) and sending the output on; only the last stage has the
 * model's output. Each rank computes with its own stages' parameters only,
 * so no rank needs the others'. */
#include "parallel/pipeline/pipe_exec.h"
#include "parallel/pipeline/pipe_impl.h"

#include "dtrain/autograd.h"
#include "dtrain/precision.h"
#include "dtrain/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    dt_ctx *ctx;           /* in flight: forwarded, backward not finished */
    dt_tensor *in, *out;   /* stage input (a leaf for stage > 0) and output, on ctx */
    dt_tensor *bl;         /* last stage: the loss x scale / m */
    void *act;             /* received activation (the input of stage > 0): e->actbuf's */
    dt_req *act_req;
    void *grad;            /* received gradient of the output: e->gradbuf's */
    dt_req *grad_req;
    dt_req *out_send;      /* SEND_F out of out->data */
} mb_state;

typedef struct {
    dt_req *req;
    void *buf;             /* what it sends: one of ginbuf (not owned here) */
} pending_send;

typedef struct {
    int nd;
    int64_t shape[DT_MAX_DIMS]; /* with the micro-batch's batch dim */
    dt_dtype dtype;
} bshape;

struct dt__pipe_exec {
    dt_pg *pg;
    dt_model *m;
    const dt_pipe_unit *units;
    int p, r, v, S, mm;
    int *starts;           /* S + 1 */
    const dt_pipe_action *acts;
    int nacts;
    mb_state *mb;          /* v * m */
    void **actbuf, **gradbuf; /* v * m: receive buffers, kept between steps (sized by in / out) */
    double *mt;            /* 3 x 2 S m: per message of the last step, post / wait start / wait end
                              (dt__pipe_exec_msg_times) */
    double *tr;            /* DT_PIPE_TRACE_N x nacts: per action of the last step (dt__pipe_exec_trace) */
    double *cur;           /* the running action's entry of tr */
    float **gin;           /* v * m: the input gradient copied at B / BI (ginbuf's), until SEND_B posts it */
    float **ginbuf;        /* v * m: its buffers, kept between steps (sized by in) */
    dt_ctx **pool;         /* free contexts */
    int npool, nctx;
    dt_ctx **all;          /* every context made, to free */
    pending_send *ps;
    int nps, cps;
    bshape *in, *out;      /* per local chunk: input / output shape */
    int64_t key[DT_MAX_DIMS + 2]; /* the x shape the shapes were learnt for */
    bool have_shapes;
    dt_pipe_stats stats;
    dt_dtype amp;          /* autocast dtype of the contexts (DT_F32: off) */
    size_t live_bytes;
    int live;
};

static int chunk(const dt__pipe_exec *e, int stage) { return stage / e->p; }

dt_status dt__pipe_exec_init(dt_pg *pg, dt_model *m, const dt_pipe_unit *units, const int *starts, int S,
                             const dt_pipe_schedule *sched, dt__pipe_exec **out)
{
    *out = NULL;
    dt__pipe_exec *e = dt_calloc(sizeof *e);
    if (!e)
        return dt_error(DT_ERR_NO_MEMORY, "pipeline executor");
    e->pg = pg, e->m = m, e->units = units;
    e->amp = DT_F32;
    dt_pipe_schedule_shape(sched, &e->p, &e->mm, &e->v, NULL);
    e->r = dt_pg_rank(pg);
    e->S = S;
    dt_status st = dt_pipe_schedule_actions(sched, e->r, &e->acts, &e->nacts);
    e->starts = dt_calloc((size_t)(S + 1) * sizeof *e->starts);
    e->mb = dt_calloc((size_t)e->v * (size_t)e->mm * sizeof *e->mb);
    e->actbuf = dt_calloc((size_t)e->v * (size_t)e->mm * sizeof *e->actbuf);
    e->gradbuf = dt_calloc((size_t)e->v * (size_t)e->mm * sizeof *e->gradbuf);
    e->mt = dt_calloc((size_t)6 * (size_t)S * (size_t)e->mm * sizeof *e->mt);
    e->tr = dt_calloc((size_t)DT_PIPE_TRACE_N * (size_t)(e->nacts + 1) * sizeof *e->tr);
    e->gin = dt_calloc((size_t)e->v * (size_t)e->mm * sizeof *e->gin);
    e->ginbuf = dt_calloc((size_t)e->v * (size_t)e->mm * sizeof *e->ginbuf);
    e->in = dt_calloc((size_t)e->v * sizeof *e->in);
    e->out = dt_calloc((size_t)e->v * sizeof *e->out);
    e->all = dt_calloc((size_t)(e->v * e->mm + 1) * sizeof *e->all);
    e->pool = dt_calloc((size_t)(e->v * e->mm + 1) * sizeof *e->pool);
    if (st >= 0 && (!e->starts || !e->mb || !e->gin || !e->ginbuf || !e->in || !e->out || !e->all || !e->pool || !e->actbuf ||
                    !e->gradbuf || !e->mt || !e->tr))
        st = dt_error(DT_ERR_NO_MEMORY, "pipeline executor");
    if (st < 0) {
        dt__pipe_exec_free(e);
        return st;
    }
    memcpy(e->starts, starts, (size_t)(S + 1) * sizeof *starts);
    e->stats.stage_first = e->r;
    e->stats.stage_count = e->v;
    for (int c = 0; c < e->v && c < 64; c++) {
        e->stats.unit_lo[c] = starts[c * e->p + e->r];
        e->stats.unit_hi[c] = starts[c * e->p + e->r + 1];
    }
    *out = e;
    return DT_OK;
}

static void drop_send(pending_send *q)
{
    if (q->req) {
        dt_req_wait(q->req, -1);
        dt_req_free(q->req);
    }
    q->req = NULL, q->buf = NULL;
}

/* The receive buffers (their sizes follow the shapes). */
static void drop_bufs(dt__pipe_exec *e)
{
    for (int i = 0; e->actbuf && e->gradbuf && e->ginbuf && i < e->v * e->mm; i++) {
        dt_free(e->actbuf[i]);
        dt_free(e->gradbuf[i]);
        dt_free(e->ginbuf[i]);
        e->actbuf[i] = e->gradbuf[i] = NULL;
        e->ginbuf[i] = NULL;
    }
}

void dt__pipe_exec_free(dt__pipe_exec *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->nps; i++)
        drop_send(&e->ps[i]);
    dt_free(e->ps);
    for (int i = 0; i < e->nctx; i++)
        dt_ctx_free(e->all[i]);
    dt_free(e->all);
    dt_free(e->pool);
    dt_free(e->in);
    dt_free(e->out);
    dt_free(e->gin);
    drop_bufs(e);
    dt_free(e->ginbuf);
    dt_free(e->actbuf);
    dt_free(e->gradbuf);
    dt_free(e->mt);
    dt_free(e->tr);
    dt_free(e->mb);
    dt_free(e->starts);
    dt_free(e);
}

void dt__pipe_exec_set_autocast(dt__pipe_exec *e, dt_dtype dt) { e->amp = dt; }

void dt__pipe_exec_stats(const dt__pipe_exec *e, dt_pipe_stats *out) { *out = e->stats; }

dt_status dt__pipe_exec_msg_times(const dt__pipe_exec *e, double *t, size_t n)
{
    size_t want = 6 * (size_t)e->S * (size_t)e->mm;
    if (n != want)
        return dt_error(DT_ERR_INVALID_ARG, "dt_strategy_pipe_msg_times: n is %zu; 3 x 2 x %d stages x %d "
                        "micro-batches = %zu", n, e->S, e->mm, want);
    memcpy(t, e->mt, want * sizeof *t);
    return DT_OK;
}

void dt__pipe_exec_trace(const dt__pipe_exec *e, const dt_pipe_action **acts, const double **t, int *n)
{
    *acts = e->acts, *t = e->tr, *n = e->nacts;
}

/* CPU seconds of the calling thread (what a compute action cost it, without
 * the time other processes held its core). */
static double thread_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) < 0)
        return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A compute action begins computing (its message, if any, has arrived):
 * the trace's compute start, and the thread's CPU clock to take the
 * difference of at its end. */
static double compute_begin(dt__pipe_exec *e)
{
    double t = dt_time_s();
    e->cur[DT_PIPE_TRACE_RUN] = t;
    e->cur[DT_PIPE_TRACE_CPU] = thread_cpu_s();
    return t;
}

/* ... and ends: its wall seconds count as busy. */
static void compute_end(dt__pipe_exec *e)
{
    double t = dt_time_s();
    e->cur[DT_PIPE_TRACE_DONE] = t;
    e->cur[DT_PIPE_TRACE_CPU] = thread_cpu_s() - e->cur[DT_PIPE_TRACE_CPU];
    e->stats.busy_s += t - e->cur[DT_PIPE_TRACE_RUN];
}

static dt_ctx *acquire(dt__pipe_exec *e)
{
    if (e->npool > 0)
        return e->pool[--e->npool];
    if (e->nctx >= e->v * e->mm + 1) {
        dt_error(DT_ERR_STATE, "pipeline executor: more contexts than micro-batches");
        return NULL;
    }
    dt_ctx_params cp = dt_ctx_params_default();
    cp.arena_block = (size_t)1 << 20;
    dt_ctx *c;
    if (dt_ctx_init(&cp, &c) < 0)
        return NULL;
    e->all[e->nctx++] = c;
    if (e->amp != DT_F32 && dt_autocast_set(c, e->amp, NULL) < 0)
        return NULL;
    return c;
}

static void give_back(dt__pipe_exec *e, dt_ctx *c)
{
    dt_ctx_reset(c);
    e->pool[e->npool++] = c;
}

/* The micro-batch leaves the pipeline on this stage: its context goes back. */
static void release(dt__pipe_exec *e, mb_state *q)
{
    if (q->out_send) {
        dt_req_wait(q->out_send, -1);
        dt_req_free(q->out_send);
        q->out_send = NULL;
    }
    if (q->ctx) {
        e->live_bytes -= dt_arena_used(dt_ctx_arena(q->ctx));
        e->live--;
        give_back(e, q->ctx);
    }
    memset(q, 0, sizeof *q);
}

/* Message (dir 0: the activation stage sends on, 1: the gradient it sends
 * back) of micro-batch mb: its index in a block of e->mt. */
static size_t msg_at(const dt__pipe_exec *e, int dir, int stage, int mb)
{
    return ((size_t)dir * (size_t)e->S + (size_t)stage) * (size_t)e->mm + (size_t)mb;
}

static void mark_post(dt__pipe_exec *e, int dir, int stage, int mb)
{
    e->mt[msg_at(e, dir, stage, mb)] = dt_time_s();
}

/* Wait for the message (dir, sender's stage, mb). */
static dt_status wait_req(dt__pipe_exec *e, dt_req **rq, const char *what, int stage, int mb, int dir,
                          int from)
{
    size_t n = 2 * (size_t)e->S * (size_t)e->mm, k = msg_at(e, dir, from, mb);
    double t0 = dt_time_s();
    dt_status st = dt_req_wait(*rq, -1);
    double t1 = dt_time_s();
    e->stats.wait_s += t1 - t0;
    e->stats.waits++;
    e->mt[n + k] = t0;
    e->mt[2 * n + k] = t1;
    if (st < 0)
        st = dt_error(st, "pipeline: receiving %s of stage %d, micro-batch %d: %s", what, stage, mb,
                      dt_req_message(*rq));
    dt_req_free(*rq);
    *rq = NULL;
    return st;
}

static dt_tensor *run_units(dt__pipe_exec *e, dt_ctx *ctx, int stage, dt_tensor *x)
{
    for (int u = e->starts[stage]; u < e->starts[stage + 1] && x; u++) {
        const dt_pipe_unit *un = &e->units[u];
        x = un->fn ? un->fn(ctx, e->m, un, x) : dt_module_forward(ctx, un->module, x);
    }
    return x;
}

static size_t numel_of(const bshape *b)
{
    size_t n = 1;
    for (int i = 0; i < b->nd; i++)
        n *= (size_t)b->shape[i];
    return n;
}

/* ---- the shape handshake -------------------------------------------------------------- */

static dt_status learn_shapes(dt__pipe_exec *e, const dt_tensor *x, int64_t b)
{
    dt_status st = DT_OK;
    dt_req *sends[64] = {NULL};
    int nsend = 0;
    dt_ctx *ctx = acquire(e);
    if (!ctx)
        return dt_last_status();
    bool was = dt_ag_set_enabled(ctx, false);
    for (int s = 0; s < e->S && st >= 0; s++) {
        if (dt_pipe_stage_rank(e->p, s) != e->r)
            continue;
        bshape *in = &e->in[chunk(e, s)], *out = &e->out[chunk(e, s)];
        if (s == 0) {
            in->nd = x->ndim;
            memcpy(in->shape, x->shape, sizeof in->shape);
            in->shape[0] = b;
            in->dtype = x->dtype;
        } else {
            int64_t h[DT_MAX_DIMS + 2];
            int q = dt_pipe_stage_rank(e->p, s - 1);
            if (q == e->r) {
                *in = e->out[chunk(e, s - 1)];
            } else if ((st = dt_pg_recv(e->pg, h, DT_MAX_DIMS + 2, DT_I64, q)) < 0) {
                break;
            } else {
                in->dtype = (dt_dtype)h[0];
                in->nd = (int)h[1];
                if (in->nd < 1 || in->nd > DT_MAX_DIMS || (unsigned)in->dtype >= DT_DTYPE_COUNT) {
                    st = dt_error(DT_ERR_MISMATCH, "pipeline: stage %d got a malformed shape from rank %d", s, q);
                    break;
                }
                memcpy(in->shape, h + 2, sizeof in->shape);
            }
        }
        dt_tensor *t = dt_tensor_zeros(ctx, in->dtype, in->nd, in->shape);
        dt_tensor *o = t ? run_units(e, ctx, s, t) : NULL;
        if (!o) {
            st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL,
                               "pipeline: stage %d (units %d..%d) on its input", s, e->starts[s], e->starts[s + 1] - 1);
            break;
        }
        out->nd = o->ndim;
        memset(out->shape, 0, sizeof out->shape);
        memcpy(out->shape, o->shape, (size_t)o->ndim * sizeof(int64_t));
        out->dtype = o->dtype;
        dt_ctx_reset(ctx);
        if (s < e->S - 1 && dt_pipe_stage_rank(e->p, s + 1) != e->r) {
            static _Thread_local int64_t hs[64][DT_MAX_DIMS + 2];
            int64_t *h = hs[nsend % 64];
            h[0] = out->dtype;
            h[1] = out->nd;
            memcpy(h + 2, out->shape, sizeof out->shape);
            if (nsend >= 64) {
                st = dt_error(DT_ERR_UNSUPPORTED, "pipeline: more than 64 stages on one rank");
                break;
            }
            st = dt_pg_send_async(e->pg, h, DT_MAX_DIMS + 2, DT_I64, dt_pipe_stage_rank(e->p, s + 1), &sends[nsend++]);
        }
    }
    for (int i = 0; i < nsend; i++) {
        dt_status s2 = dt_req_wait(sends[i], -1);
        if (s2 < 0 && st >= 0)
            st = dt_error(s2, "pipeline: sending a stage's output shape: %s", dt_req_message(sends[i]));
        dt_req_free(sends[i]);
    }
    dt_ag_set_enabled(ctx, was);
    give_back(e, ctx);
    if (st >= 0) {
        memset(e->key, 0, sizeof e->key);
        e->key[0] = x->ndim;
        e->key[1] = x->dtype;
        memcpy(e->key + 2, x->shape, (size_t)x->ndim * sizeof(int64_t));
        e->have_shapes = true;
    }
    return st;
}

/* ---- one step ----------------------------------------------------------------------------- */

static dt_status push_send(dt__pipe_exec *e, dt_req *rq, void *buf)
{
    if (e->nps == e->cps) {
        int c = e->cps ? 2 * e->cps : 16;
        pending_send *n = realloc(e->ps, (size_t)c * sizeof *n);
        if (!n)
            return dt_error(DT_ERR_NO_MEMORY, "pipeline executor");
        e->ps = n;
        e->cps = c;
    }
    e->ps[e->nps++] = (pending_send){rq, buf};
    return DT_OK;
}

/* A view of rows [mb b, (mb + 1) b) of t (contiguous, batch first) on ctx. */
static dt_tensor *rows(dt_ctx *ctx, const dt_tensor *t, int mb, int64_t b)
{
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    size_t row = dt_dtype_size(t->dtype) * (size_t)(dt_tensor_numel(t) / t->shape[0]);
    shape[0] = b;
    return dt_tensor_view_of(ctx, (char *)t->data + (size_t)mb * (size_t)b * row, t->dtype, t->ndim, shape);
}

static dt_status step_action(dt__pipe_exec *e, const dt_pipe_action *a, dt__pipe_batch *fb, int64_t b,
                             double *lsum)
{
    const int p = e->p, m = e->mm;
    dt_status st = DT_OK;
    char d[96];
    dt_pg_set_label(e->pg, dt__pipe_action_str(a, d, sizeof d)); /* the flight recorder's label */
    switch (a->op) {
    case DT_PIPE_RECV_F: {
        int c = chunk(e, a->stage + 1);
        mb_state *q = &e->mb[c * m + a->mb];
        const bshape *bs = &e->in[c];
        void **buf = &e->actbuf[c * m + a->mb];
        if (!*buf && !(*buf = dt_alloc(numel_of(bs) * dt_dtype_size(bs->dtype))))
            return dt_error(DT_ERR_NO_MEMORY, "pipeline: %s", dt__pipe_action_str(a, d, sizeof d));
        q->act = *buf;
        return dt_pg_recv_async(e->pg, q->act, numel_of(bs), bs->dtype, a->peer, &q->act_req);
    }
    case DT_PIPE_RECV_B: {
        int c = chunk(e, a->stage - 1);
        mb_state *q = &e->mb[c * m + a->mb];
        size_t n = numel_of(&e->out[c]);
        void **buf = &e->gradbuf[c * m + a->mb];
        if (!*buf && !(*buf = dt_alloc(n * sizeof(float))))
            return dt_error(DT_ERR_NO_MEMORY, "pipeline: %s", dt__pipe_action_str(a, d, sizeof d));
        q->grad = *buf;
        return dt_pg_recv_async(e->pg, q->grad, n, DT_F32, a->peer, &q->grad_req);
    }
    case DT_PIPE_F: {
        int c = chunk(e, a->stage);
        mb_state *q = &e->mb[c * m + a->mb];
        if (a->stage > 0 &&
            (st = wait_req(e, &q->act_req, "the activation", a->stage, a->mb, 0, a->stage - 1)) < 0)
            return st;
        compute_begin(e);
        if (!(q->ctx = acquire(e)))
            return dt_last_status();
        e->live++;
        if (a->stage == 0) {
            q->in = rows(q->ctx, fb->x, a->mb, b);
        } else {
            const bshape *bs = &e->in[c];
            q->in = dt_tensor_view_of(q->ctx, q->act, bs->dtype, bs->nd, bs->shape);
            if (q->in && (st = dt_tensor_set_requires_grad(q->in, true)) < 0)
                return st;
        }
        q->out = run_units(e, q->ctx, a->stage, q->in);
        if (q->out && a->stage == e->S - 1) {
            dt_tensor *y = fb->y ? rows(q->ctx, fb->y, a->mb, b) : NULL;
            dt_tensor *loss = fb->loss(fb->loss_ud, q->ctx, q->out, y);
            if (loss)
                *lsum += dt_tensor_item(loss);
            q->bl = loss ? dt_scale(q->ctx, loss, fb->scale / (float)m) : NULL;
            if (!q->bl)
                q->out = NULL;
        }
        if (!q->out)
            return dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL, "pipeline: %s",
                                 dt__pipe_action_str(a, d, sizeof d));
        if (a->stage < e->S - 1 && !dt_tensor_is_contiguous(q->out) && !(q->out = dt_contiguous(q->ctx, q->out)))
            return dt_last_status();
        compute_end(e);
        e->live_bytes += dt_arena_used(dt_ctx_arena(q->ctx));
        if (e->live_bytes > e->stats.peak_act_bytes)
            e->stats.peak_act_bytes = e->live_bytes;
        if (e->live > e->stats.peak_inflight)
            e->stats.peak_inflight = e->live;
        return DT_OK;
    }
    case DT_PIPE_SEND_F: {
        mb_state *q = &e->mb[chunk(e, a->stage) * m + a->mb];
        mark_post(e, 0, a->stage, a->mb);
        return dt_pg_send_async(e->pg, q->out->data, (size_t)dt_tensor_numel(q->out), q->out->dtype, a->peer,
                                &q->out_send);
    }
    case DT_PIPE_B:
    case DT_PIPE_BI: {
        mb_state *q = &e->mb[chunk(e, a->stage) * m + a->mb];
        size_t before = dt_arena_used(dt_ctx_arena(q->ctx));
        float one = 1.0f;
        dt_tensor g1, *g = &g1, *root = q->out;
        if (a->stage == e->S - 1) {
            dt_tensor_init_contiguous(&g1, DT_F32, 0, NULL, &one);
            root = q->bl;
        } else {
            if ((st = wait_req(e, &q->grad_req, "the gradient", a->stage, a->mb, 1, a->stage + 1)) < 0)
                return st;
            dt_tensor_init_contiguous(&g1, DT_F32, q->out->ndim, q->out->shape, q->grad);
        }
        compute_begin(e);
        st = a->op == DT_PIPE_B ? dt_backward_with(q->ctx, root, g) : dt_backward_input(q->ctx, root, g);
        q->grad = NULL;
        if (st < 0)
            return dt_error_wrap(st, "pipeline: %s", dt__pipe_action_str(a, d, sizeof d));
        if (a->stage > 0) {
            if (!q->in->grad)
                return dt_error(DT_ERR_STATE, "pipeline: %s: the stage's output does not depend on its input",
                                dt__pipe_action_str(a, d, sizeof d));
            /* the input gradient, copied out so that the context can go back
             * (the receiver takes it whenever its schedule says) */
            if (q->in->grad->dtype != DT_F32 || !dt_tensor_is_contiguous(q->in->grad))
                return dt_error(DT_ERR_STATE, "pipeline: %s: the input gradient is not contiguous f32",
                                dt__pipe_action_str(a, d, sizeof d));
            size_t n = (size_t)dt_tensor_numel(q->in->grad);
            int k = chunk(e, a->stage) * m + a->mb;
            if (n != numel_of(&e->in[chunk(e, a->stage)]))
                return dt_error(DT_ERR_STATE, "pipeline: %s: the input gradient has %zu elements, the input %zu",
                                dt__pipe_action_str(a, d, sizeof d), n, numel_of(&e->in[chunk(e, a->stage)]));
            if (!e->ginbuf[k] && !(e->ginbuf[k] = dt_alloc(n * sizeof(float))))
                return dt_error(DT_ERR_NO_MEMORY, "pipeline: %s", dt__pipe_action_str(a, d, sizeof d));
            memcpy(e->ginbuf[k], q->in->grad->data, n * sizeof(float));
            e->gin[k] = e->ginbuf[k];
        }
        compute_end(e);
        size_t after = dt_arena_used(dt_ctx_arena(q->ctx));
        e->live_bytes += after - before;
        if (e->live_bytes > e->stats.peak_act_bytes)
            e->stats.peak_act_bytes = e->live_bytes;
        if (a->op == DT_PIPE_B)
            release(e, q);
        return DT_OK;
    }
    case DT_PIPE_BW: {
        mb_state *q = &e->mb[chunk(e, a->stage) * m + a->mb];
        compute_begin(e);
        if ((st = dt_backward_weight(q->ctx)) < 0)
            return dt_error_wrap(st, "pipeline: %s", dt__pipe_action_str(a, d, sizeof d));
        compute_end(e);
        release(e, q);
        return DT_OK;
    }
    case DT_PIPE_SEND_B: {
        float **slot = &e->gin[chunk(e, a->stage) * m + a->mb];
        if (!*slot)
            return dt_error(DT_ERR_STATE, "pipeline: %s before its backward", dt__pipe_action_str(a, d, sizeof d));
        dt_req *rq = NULL;
        const bshape *bs = &e->in[chunk(e, a->stage)];
        mark_post(e, 1, a->stage, a->mb);
        if ((st = dt_pg_send_async(e->pg, *slot, numel_of(bs), DT_F32, a->peer, &rq)) < 0)
            return st;
        if ((st = push_send(e, rq, *slot)) < 0) {
            e->ginbuf[chunk(e, a->stage) * m + a->mb] = NULL; /* the buffer stays with the request (leaked) */
            return st;
        }
        *slot = NULL;
        return DT_OK;
    }
    default:
        break;
    }
    (void)p;
    return dt_error(DT_ERR_STATE, "pipeline: unknown action %d", (int)a->op);
}

/* Free a request of an abandoned schedule once it ended, waiting until
 * deadline at most: true when it ended (its buffer is free again). */
static bool settle(dt_req *rq, double deadline)
{
    if (!rq)
        return true;
    double left = deadline - dt_time_s();
    bool done = dt_req_wait(rq, left > 0 ? left : 0) != DT_INPROGRESS;
    dt_req_free(rq);
    return done;
}

/* After a failure mid-schedule (the group already failed, break_off):
 * each request still in flight gets up to a second in all to end (on a
 * failed group they end at once); one that has not keeps its buffer (left
 * allocated rather than freed under it; a forward's send keeps its
 * context out of the pool); every other context goes back to the pool. */
static void abandon(dt__pipe_exec *e)
{
    double deadline = dt_time_s() + 1.0;
    int nkeep = 0;
    dt_ctx **keep = dt_calloc((size_t)(e->nctx + 1) * sizeof *keep);
    for (int i = 0; i < e->v * e->mm; i++) {
        mb_state *q = &e->mb[i];
        if (!settle(q->act_req, deadline)) /* the request keeps its buffer: no longer ours */
            e->actbuf[i] = NULL;
        if (!settle(q->grad_req, deadline))
            e->gradbuf[i] = NULL;
        if (!settle(q->out_send, deadline) && q->ctx && keep)
            keep[nkeep++] = q->ctx;
        memset(q, 0, sizeof *q);
        e->gin[i] = NULL;
    }
    for (int i = 0; i < e->nps; i++)
        if (!settle(e->ps[i].req, deadline))
            for (int k = 0; k < e->v * e->mm; k++)
                if (e->ginbuf[k] == e->ps[i].buf)
                    e->ginbuf[k] = NULL;
    e->nps = 0;
    e->npool = 0;
    for (int i = 0; i < e->nctx; i++) {
        bool kept = !keep;
        for (int k = 0; k < nkeep; k++)
            kept = kept || keep[k] == e->all[i];
        if (!kept)
            give_back(e, e->all[i]);
    }
    dt_free(keep);
    e->live = 0;
    e->live_bytes = 0;
}

/* This rank cannot finish the schedule (st, dt_last_error()): fail the
 * pipeline group first, so that the peers' waits end at once with the
 * message (rather than at the group's timeout) and no later message can be
 * matched with one of the abandoned schedule, then abandon the step. */
static dt_status break_off(dt__pipe_exec *e, dt_status st)
{
    char msg[640];
    snprintf(msg, sizeof msg, "pipeline rank %d broke off its schedule: %s", e->r, dt_last_error());
    dt_pg_fail(e->pg, st, msg);
    abandon(e);
    return dt_error(st, "%s", msg);
}

/* The action as a span of the timeline (trace.h): "F3" is the forward of
 * micro-batch 3; its args say how long it waited for its message. The
 * executor's times are dt_time_s, the timeline's clock in seconds. */
static void trace_action(const dt_pipe_action *a, const double *tr)
{
    if (dt_trace_now() <= 0)
        return;
    static const char *const op[] = {"F", "B", "BI", "BW", "send F", "recv F", "send B", "recv B"};
    char name[32];
    snprintf(name, sizeof name, "%s%d s%d", (unsigned)a->op < 8 ? op[a->op] : "?", a->mb, a->stage);
    dt_trace_span_ex(DT_TRACE_PIPE, name, tr[DT_PIPE_TRACE_BEGIN] * 1e6, tr[DT_PIPE_TRACE_END] * 1e6, a->mb,
                     tr[DT_PIPE_TRACE_RUN] * 1e6);
}

dt_status dt__pipe_exec_forward(dt__pipe_exec *e, dt_ctx *ctx, dt_tensor *x, dt_tensor **out)
{
    *out = NULL;
    dt_status st = DT_OK;
    dt_tensor *cur = x;
    for (int s = 0; s < e->S && st >= 0; s++) {
        if (dt_pipe_stage_rank(e->p, s) != e->r)
            continue;
        int q = s ? dt_pipe_stage_rank(e->p, s - 1) : e->r;
        if (q != e->r) { /* the previous stage's output: dtype and shape, then the values */
            int64_t h[DT_MAX_DIMS + 2];
            if ((st = dt_pg_recv(e->pg, h, DT_MAX_DIMS + 2, DT_I64, q)) < 0)
                break;
            if (h[1] < 1 || h[1] > DT_MAX_DIMS || h[0] < 0 || h[0] >= DT_DTYPE_COUNT) {
                st = dt_error(DT_ERR_MISMATCH, "pipeline: forward only: stage %d got a malformed shape from rank %d",
                              s, q);
                break;
            }
            cur = dt_tensor_empty(ctx, (dt_dtype)h[0], (int)h[1], h + 2);
            if (!cur || (st = dt_pg_recv(e->pg, cur->data, (size_t)dt_tensor_numel(cur), cur->dtype, q)) < 0) {
                st = st < 0 ? st : dt_last_status() < 0 ? dt_last_status() : DT_ERR_NO_MEMORY;
                break;
            }
        }
        dt_tensor *o = run_units(e, ctx, s, cur);
        if (o && s < e->S - 1 && !dt_tensor_is_contiguous(o))
            o = dt_contiguous(ctx, o);
        if (!o) {
            st = dt_error_wrap(dt_last_status() < 0 ? dt_last_status() : DT_ERR_NULL,
                               "pipeline: forward only: stage %d (units %d..%d)", s, e->starts[s], e->starts[s + 1] - 1);
            break;
        }
        int nx = s < e->S - 1 ? dt_pipe_stage_rank(e->p, s + 1) : e->r;
        if (nx != e->r) {
            int64_t h[DT_MAX_DIMS + 2] = {o->dtype, o->ndim};
            memcpy(h + 2, o->shape, (size_t)o->ndim * sizeof(int64_t));
            if ((st = dt_pg_send(e->pg, h, DT_MAX_DIMS + 2, DT_I64, nx)) < 0 ||
                (st = dt_pg_send(e->pg, o->data, (size_t)dt_tensor_numel(o), o->dtype, nx)) < 0)
                break;
        }
        cur = o;
        if (s == e->S - 1)
            *out = o;
    }
    if (st < 0) {
        *out = NULL;
        return break_off(e, st);
    }
    return DT_OK;
}

dt_status dt__pipe_exec_run(dt__pipe_exec *e, dt__pipe_batch *fb)
{
    const dt_tensor *x = fb->x;
    if (x->ndim < 1 || !dt_tensor_is_contiguous(x) || (fb->y && !dt_tensor_is_contiguous(fb->y)))
        return dt_error(DT_ERR_INVALID_ARG, "pipeline: the batch must be contiguous with the batch dim first");
    int64_t B = x->shape[0];
    if (B % e->mm || (fb->y && (fb->y->ndim < 1 || fb->y->shape[0] != B)))
        return dt_error(DT_ERR_INVALID_ARG, "pipeline: a batch of %lld does not split into %d equal micro-batches "
                        "(the batch must be a multiple of --micro-batches)", (long long)B, e->mm);
    int64_t b = B / e->mm;
    int64_t key[DT_MAX_DIMS + 2] = {x->ndim, x->dtype};
    memcpy(key + 2, x->shape, (size_t)x->ndim * sizeof(int64_t));
    dt_status st = DT_OK;
    if (!e->have_shapes || memcmp(key, e->key, sizeof key)) {
        drop_bufs(e); /* sized for the old shapes */
        if ((st = learn_shapes(e, x, b)) < 0)
            return break_off(e, st);
    }
    double t0 = dt_time_s(), lsum = 0;
    e->stats.busy_s = 0;
    e->stats.peak_act_bytes = 0;
    e->stats.peak_inflight = 0;
    e->stats.wait_s = 0;
    e->stats.waits = 0;
    memset(e->mt, 0, (size_t)6 * (size_t)e->S * (size_t)e->mm * sizeof *e->mt);
    e->live_bytes = 0;
    e->live = 0;
    memset(e->tr, 0, (size_t)DT_PIPE_TRACE_N * (size_t)e->nacts * sizeof *e->tr);
    for (int i = 0; i < e->nacts && st >= 0; i++) {
        double *tr = e->cur = &e->tr[(size_t)DT_PIPE_TRACE_N * (size_t)i];
        bool comm = e->acts[i].op > DT_PIPE_BW; /* a send or receive: its CPU time is all of it */
        double c0 = comm ? thread_cpu_s() : 0;
        tr[DT_PIPE_TRACE_BEGIN] = dt_time_s();
        st = step_action(e, &e->acts[i], fb, b, &lsum);
        tr[DT_PIPE_TRACE_END] = dt_time_s();
        if (!tr[DT_PIPE_TRACE_RUN]) { /* no compute (a send, a receive): its own work is all of it */
            tr[DT_PIPE_TRACE_RUN] = tr[DT_PIPE_TRACE_BEGIN];
            tr[DT_PIPE_TRACE_DONE] = tr[DT_PIPE_TRACE_END];
            tr[DT_PIPE_TRACE_CPU] = comm ? thread_cpu_s() - c0 : 0;
        }
        trace_action(&e->acts[i], tr);
    }
    if (st < 0)
        return break_off(e, st);
    for (int i = 0; i < e->nps; i++) {
        dt_status s2 = dt_req_wait(e->ps[i].req, -1);
        if (s2 < 0 && st >= 0)
            st = dt_error(s2, "pipeline: sending a gradient: %s", dt_req_message(e->ps[i].req));
        dt_req_free(e->ps[i].req);
    }
    e->nps = 0;
    for (int i = 0; i < e->v * e->mm; i++)
        if ((e->mb[i].ctx || e->gin[i]) && st >= 0)
            st = dt_error(DT_ERR_STATE, "pipeline: a micro-batch still in flight after the schedule");
    if (st < 0)
        return break_off(e, st);
    e->stats.end_s = dt_time_s();
    e->stats.start_s = t0;
    e->stats.step_s = e->stats.end_s - t0;
    fb->loss_value = dt_pipe_stage_rank(e->p, e->S - 1) == e->r ? lsum / e->mm : 0;
    return st;
}
