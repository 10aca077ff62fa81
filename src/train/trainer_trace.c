/* The trainer's part of the timeline (trace.h): it opens the tracer when
 * its params ask for one (dt_trainer_params.trace) and no tracer is open
 * yet, and hooks each unit of the model so that its forward and backward
 * become spans: the children of the Sequential containers near the top (a
 * GPT's blocks h.0, h.1, ...). Nothing here runs, and
 * nothing is allocated, unless a tracer is open when the trainer starts.
 *
 * A unit's forward span carries the FLOPs of the ops it recorded on the
 * tape (dt_ag_tape_flops: the op table's counts; none under no-grad or
 * inside a checkpointed region, whose ops are not recorded).
 *
 * The hooks are blind (they read no tensor), so the model keeps its fast
 * paths; they are added after the strategy's (a ZeRO-3 unit's gather runs
 * before its forward span starts, and shows as a wait). */
#define _POSIX_C_SOURCE 200809L
#include "train/trainer_trace.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct unit_span {
    dt_module *m;
    double tf, tb; /* forward / backward start (dt_trace_now) */
    size_t tape0;  /* the tape's length when the forward began */
    dt_hook_id id[4];
} unit_span;

struct dt__trainer_trace {
    bool owns;        /* opened here: closed at the trainer's end */
    unit_span *u;
    int n;
};

static dt_status fwd_pre(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)m, (void)x;
    ((unit_span *)ud)->tf = dt_trace_now();
    ((unit_span *)ud)->tape0 = dt_ag_tape_len(ctx);
    return DT_OK;
}

static dt_status fwd_post(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)x, (void)y;
    const unit_span *u = ud;
    if (u->tf > 0) /* the FLOPs of the ops the unit recorded (the op table's counts) */
        dt_trace_span_flop(DT_TRACE_FORWARD, dt_module_path(m), u->tf,
                           dt_ag_tape_flops(ctx, u->tape0, dt_ag_tape_len(ctx), NULL));
    return DT_OK;
}

static dt_status bwd_pre(dt_ctx *ctx, dt_module *m, void *ud)
{
    (void)ctx, (void)m;
    ((unit_span *)ud)->tb = dt_trace_now();
    return DT_OK;
}

static dt_status bwd_post(dt_ctx *ctx, dt_module *m, void *ud)
{
    (void)ctx;
    dt_trace_span(DT_TRACE_BACKWARD, dt_module_path(m), ((unit_span *)ud)->tb);
    return DT_OK;
}

/* The units: the children of each Sequential container within the top
 * three levels (a GPT's blocks, a ConvNet's layers), not below them. Other
 * modules stay unhooked: a hook on the model or its head would turn off
 * the fused paths that look for a hook-free subtree (the whole model's
 * forward and backward are spans anyway). */
static int collect(const dt_module *m, int depth, dt_module **out, int n)
{
    for (int i = 0; i < dt_module_num_children(m); i++) {
        dt_module *c = dt_module_child(m, i);
        if (dt_module_kind(m) == DT_NN_SEQUENTIAL) {
            if (out)
                out[n] = c;
            n++;
        } else if (depth < 3) {
            n = collect(c, depth + 1, out, n);
        }
    }
    return n;
}

static int count_units(const dt_module *root, dt_module **out) { return collect(root, 0, out, 0); }

static dt_status hook(unit_span *u)
{
    dt_status st;
    if ((st = dt_module_add_forward_pre_hook(u->m, fwd_pre, u, &u->id[0])) < 0 ||
        (st = dt_module_add_forward_post_hook(u->m, fwd_post, u, &u->id[1])) < 0 ||
        (st = dt_module_add_backward_pre_hook(u->m, bwd_pre, u, &u->id[2])) < 0 ||
        (st = dt_module_add_backward_post_hook(u->m, bwd_post, u, &u->id[3])) < 0)
        return st;
    for (int k = 0; k < 4; k++)
        if ((st = dt_module_hook_set_blind(u->m, u->id[k])) < 0)
            return st;
    return DT_OK;
}

dt_status dt__trainer_trace_init(dt_model *m, bool units, const dt_trace_params *p, int rank, int world,
                                 dt__trainer_trace **out)
{
    *out = NULL;
    bool owns = false;
    dt_status st;
    if (p->dir && !dt_trace_is_open()) {
        if ((st = dt_trace_open(p, rank, world)) < 0)
            return dt_error_wrap(st, "dt_trainer_init: the trace");
        owns = true;
    }
    if (!dt_trace_is_open())
        return DT_OK; /* off: nothing allocated */
    dt__trainer_trace *t = calloc(1, sizeof *t);
    dt_module *root = dt_model_root(m);
    int n = root && units ? count_units(root, NULL) : 0;
    dt_module **mods = calloc((size_t)n + 1, sizeof *mods);
    if (!t || !mods || (n && !(t->u = calloc((size_t)n, sizeof *t->u)))) {
        free(t);
        free(mods);
        if (owns)
            dt_trace_close();
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_init: the trace's %d units", n);
    }
    t->owns = owns;
    if (n)
        count_units(root, mods);
    for (int i = 0; i < n; i++) {
        t->u[i].m = mods[i];
        t->n = i + 1;
        if ((st = hook(&t->u[i])) < 0) {
            free(mods);
            dt__trainer_trace_free(t, m);
            return dt_error_wrap(st, "dt_trainer_init: the trace's hooks");
        }
    }
    free(mods);
    *out = t;
    return DT_OK;
}

void dt__trainer_trace_free(dt__trainer_trace *t, dt_model *m)
{
    (void)m;
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        for (int k = 0; k < 4; k++)
            if (t->u[i].id[k])
                dt_module_remove_hook(t->u[i].m, t->u[i].id[k]);
    if (t->owns && dt_trace_close() < 0)
        dt_log(DT_LOG_WARN, "%s", dt_last_error());
    free(t->u);
    free(t);
}

void dt__trainer_trace_counters(const dt_loss_scaler *scaler)
{
    if (dt_trace_now() <= 0)
        return;
    dt_trace_counter("loss_scale", scaler ? dt_loss_scaler_scale(scaler) : 1.0);
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    if (rss > 0)
        dt_trace_counter("memory", (double)rss * (double)sysconf(_SC_PAGESIZE));
}
