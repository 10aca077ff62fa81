/* Reading a merged trace back into figures (dt_trace_summarize, trace.h).
 *
 * Per step and rank, the rank's main thread over its step span is cut into
 * elementary segments at every span boundary and each segment takes the
 * highest class of the spans covering it: communication it waited for
 * (cat "wait", pipeline sends and receives, a pipeline action's wait for
 * its message) over compute (forward, backward, recompute, optimizer,
 * checkpoint, pipeline F/B/BI/BW) over idle (nothing). O(n^2) in the
 * spans of one step and rank, which are few.
 *
 * The pipeline bubble follows the schedule tables' definition (pipeline.h):
 * idle over the ideal. Over the step's pipeline window (the first action
 * of any rank to the last one's end), a rank's bubble is (window - its
 * compute) / its compute; the formula for p ranks, v stages per rank and m
 * micro-batches is (p - 1) / (v m) (GPipe, 1F1B and interleaved with equal
 * costs; ZB-H1 is below it by design). */
#define _POSIX_C_SOURCE 200809L
#include "base/trace_impl.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { C_NONE = 0, C_COMPUTE = 1, C_COMM = 2 };

typedef struct sev {
    int pid, tid;
    int64_t step;
    double ts, dur, wait; /* µs; wait: a pipeline action's wait for its message */
    int cls;              /* C_* on the main thread */
    int pipe_compute;     /* F/B/BI/BW */
    int stage, mb;        /* pipeline actions (-1 otherwise) */
    const char *cat, *name;
    const cJSON *args;
} sev;

static int is_compute_cat(const char *c)
{
    static const char *const k[] = {"forward", "backward", "recompute", "optimizer", "checkpoint", "other"};
    for (size_t i = 0; i < sizeof k / sizeof *k; i++)
        if (!strcmp(c, k[i]))
            return 1;
    return 0;
}

static void classify(sev *e)
{
    e->cls = C_NONE;
    e->pipe_compute = 0;
    e->stage = e->mb = -1;
    if (!strcmp(e->cat, "wait")) {
        e->cls = C_COMM;
    } else if (!strcmp(e->cat, "pipeline")) {
        /* "F3 s1", "BI0 s2", "send F3 s0", "recv B1 s1" */
        const char *s = strrchr(e->name, 's');
        e->stage = s && s > e->name && s[-1] == ' ' ? atoi(s + 1) : -1;
        e->mb = dt__trace_int(e->args, "mb", -1);
        if (!strncmp(e->name, "send", 4) || !strncmp(e->name, "recv", 4)) {
            e->cls = C_COMM;
        } else {
            e->cls = C_COMPUTE;
            e->pipe_compute = 1;
        }
    } else if (is_compute_cat(e->cat)) {
        e->cls = C_COMPUTE;
    }
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The class times of [lo, hi) covered by spans e[0..n) (main thread). */
static dt_status sweep(const sev *const *e, size_t n, double lo, double hi, double *comp, double *comm)
{
    double *pt = malloc((3 * n + 2) * sizeof *pt); /* up to three points per span */
    if (!pt)
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: %zu spans", n);
    size_t k = 0;
    pt[k++] = lo;
    pt[k++] = hi;
    for (size_t i = 0; i < n; i++) {
        double a = e[i]->ts, b = e[i]->ts + e[i]->dur;
        if (a > lo && a < hi)
            pt[k++] = a;
        if (b > lo && b < hi)
            pt[k++] = b;
        if (e[i]->wait > 0 && a + e[i]->wait > lo && a + e[i]->wait < hi)
            pt[k++] = a + e[i]->wait;
    }
    qsort(pt, k, sizeof *pt, dbl_cmp);
    *comp = *comm = 0;
    for (size_t j = 0; j + 1 < k; j++) {
        double a = pt[j], b = pt[j + 1], mid = 0.5 * (a + b);
        if (b <= a)
            continue;
        int best = C_NONE;
        for (size_t i = 0; i < n && best < C_COMM; i++) {
            const sev *x = e[i];
            if (mid < x->ts || mid >= x->ts + x->dur)
                continue;
            int c = x->cls;
            if (x->pipe_compute && mid < x->ts + x->wait)
                c = C_COMM; /* waiting for its message */
            best = c > best ? c : best;
        }
        if (best == C_COMPUTE)
            *comp += b - a;
        else if (best == C_COMM)
            *comm += b - a;
    }
    free(pt);
    return DT_OK;
}

typedef struct ckey {
    char key[96];
    const sev *e;
} ckey;

static int ckey_cmp(const void *a, const void *b) { return strcmp(((const ckey *)a)->key, ((const ckey *)b)->key); }

static int coll_cmp(const void *a, const void *b)
{
    const dt_trace_coll_row *x = a, *y = b;
    return x->max_wait_ms < y->max_wait_ms ? 1 : x->max_wait_ms > y->max_wait_ms ? -1 : 0;
}

static int op_cmp(const void *a, const void *b)
{
    const dt_trace_op_row *x = a, *y = b;
    return x->total_ms < y->total_ms ? 1 : x->total_ms > y->total_ms ? -1 : 0;
}

static int row_cmp(const void *a, const void *b)
{
    const dt_trace_step_row *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return x->rank - y->rank;
}

/* The step rows: one per step span. */
static dt_status step_rows(dt_trace_summary *s, sev *ev, size_t n)
{
    size_t nrow = 0;
    for (size_t i = 0; i < n; i++)
        nrow += !strcmp(ev[i].cat, "step");
    s->steps = calloc(nrow ? nrow : 1, sizeof *s->steps);
    const sev **sel = malloc((n ? n : 1) * sizeof *sel);
    if (!s->steps || !sel) {
        free(sel);
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: %zu steps", nrow);
    }
    dt_status st = DT_OK;
    for (size_t i = 0; i < n && st >= 0; i++) {
        const sev *sp = &ev[i];
        if (strcmp(sp->cat, "step"))
            continue;
        dt_trace_step_row *r = &s->steps[s->nsteps++];
        r->step = sp->step;
        r->rank = sp->pid;
        r->step_ms = sp->dur * 1e-3;
        size_t k = 0;
        double data = 0, plo = 1e300, phi = -1e300, busy = 0;
        int smax = -1, mmax = -1, nst = 0;
        int stages[64];
        for (size_t j = 0; j < n; j++) {
            const sev *x = &ev[j];
            if (x->step != sp->step || x->pid != sp->pid || x->tid != sp->tid || x == sp)
                continue;
            if (!strcmp(x->cat, "data"))
                data += x->dur;
            if (x->cls != C_NONE)
                sel[k++] = x;
            if (x->pipe_compute) {
                busy += x->dur - x->wait;
                mmax = x->mb > mmax ? x->mb : mmax;
                int seen = 0;
                for (int q = 0; q < nst; q++)
                    seen |= stages[q] == x->stage;
                if (!seen && nst < 64)
                    stages[nst++] = x->stage;
            }
        }
        /* the pipeline window and stage count: over every rank of the step */
        for (size_t j = 0; j < n; j++) {
            const sev *x = &ev[j];
            if (x->step != sp->step || strcmp(x->cat, "pipeline"))
                continue;
            plo = x->ts < plo ? x->ts : plo;
            phi = x->ts + x->dur > phi ? x->ts + x->dur : phi;
            smax = x->stage > smax ? x->stage : smax;
        }
        double comp = 0, comm = 0;
        st = sweep(sel, k, sp->ts, sp->ts + sp->dur, &comp, &comm);
        r->compute_ms = comp * 1e-3;
        r->comm_ms = comm * 1e-3;
        r->idle_ms = r->step_ms - r->compute_ms - r->comm_ms;
        r->data_ms = data * 1e-3;
        r->bubble = r->bubble_formula = -1;
        if (busy > 0 && nst > 0 && smax >= 0) {
            r->chunks = nst;
            r->stages = (smax + 1) / nst; /* p: ranks of a pipeline */
            r->micro = mmax + 1;
            r->bubble = (phi - plo - busy) / busy;
            r->bubble_formula = (double)(r->stages - 1) / ((double)r->chunks * r->micro);
        }
    }
    free(sel);
    qsort(s->steps, s->nsteps, sizeof *s->steps, row_cmp);
    return st;
}

/* Collectives matched across ranks: the slowest rank of each; and what
 * each rank's lateness cost the others. */
static dt_status coll_rows(dt_trace_summary *s, sev *ev, size_t n)
{
    ckey *k = malloc((n ? n : 1) * sizeof *k);
    size_t nk = 0;
    if (!k)
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: collectives");
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ev[i].cat, "comm") && ev[i].args &&
            cJSON_GetObjectItemCaseSensitive(ev[i].args, "wait_peers_us")) {
            const cJSON *a = ev[i].args;
            if (cJSON_GetObjectItemCaseSensitive(a, "peer"))
                continue;
            snprintf(k[nk].key, sizeof k[nk].key, "%s@%d#%020.0f", dt__trace_str(a, "group") ? dt__trace_str(a, "group") : "?",
                     dt__trace_int(a, "group_lead", 0), dt__trace_num(a, "seq", 0));
            k[nk++].e = &ev[i];
        }
    qsort(k, nk, sizeof *k, ckey_cmp);
    s->colls = calloc(nk ? nk : 1, sizeof *s->colls);
    if (!s->colls) {
        free(k);
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: collectives");
    }
    for (size_t i = 0; i < nk;) {
        size_t j = i;
        dt_trace_coll_row *r = &s->colls[s->ncolls++];
        const cJSON *a = k[i].e->args;
        snprintf(r->kind, sizeof r->kind, "%s", k[i].e->name);
        snprintf(r->group, sizeof r->group, "%s", dt__trace_str(a, "group") ? dt__trace_str(a, "group") : "?");
        r->seq = (uint64_t)dt__trace_num(a, "seq", 0);
        r->step = k[i].e->step;
        r->last_rank = dt__trace_int(a, "last_rank", -1);
        r->bytes = (uint64_t)dt__trace_num(a, "bytes", 0);
        for (; j < nk && !strcmp(k[j].key, k[i].key); j++) {
            double w = dt__trace_num(k[j].e->args, "wait_peers_us", 0) * 1e-3;
            r->max_wait_ms = w > r->max_wait_ms ? w : r->max_wait_ms;
            r->max_ms = k[j].e->dur * 1e-3 > r->max_ms ? k[j].e->dur * 1e-3 : r->max_ms;
            r->ranks++;
            if (r->last_rank >= 0 && r->last_rank < DT_TRACE_MAX_RANKS)
                s->made_wait_ms[r->last_rank] += w;
        }
        i = j;
    }
    free(k);
    qsort(s->colls, s->ncolls, sizeof *s->colls, coll_cmp);
    return DT_OK;
}

/* Time per (category, name), all ranks and steps. */
static dt_status op_rows(dt_trace_summary *s, sev *ev, size_t n)
{
    s->ops = calloc(n ? n : 1, sizeof *s->ops);
    if (!s->ops)
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: ops");
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(ev[i].cat, "step"))
            continue;
        dt_trace_op_row *r = NULL;
        for (size_t j = 0; j < s->nops && !r; j++)
            if (!strcmp(s->ops[j].cat, ev[i].cat) && !strcmp(s->ops[j].name, ev[i].name))
                r = &s->ops[j];
        if (!r) {
            r = &s->ops[s->nops++];
            snprintf(r->cat, sizeof r->cat, "%s", ev[i].cat);
            snprintf(r->name, sizeof r->name, "%s", ev[i].name);
        }
        r->count++;
        r->total_ms += ev[i].dur * 1e-3;
        r->max_ms = ev[i].dur * 1e-3 > r->max_ms ? ev[i].dur * 1e-3 : r->max_ms;
    }
    qsort(s->ops, s->nops, sizeof *s->ops, op_cmp);
    return DT_OK;
}

dt_status dt_trace_summarize(const char *path, dt_trace_summary **out)
{
    if (!path || !out)
        return dt_error(DT_ERR_NULL, "dt_trace_summarize: an argument is NULL");
    *out = NULL;
    cJSON *j;
    dt_status st = dt__trace_read(path, &j);
    if (st < 0)
        return st;
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    size_t n = 0, cap = (size_t)cJSON_GetArraySize(evs);
    sev *ev = calloc(cap ? cap : 1, sizeof *ev);
    dt_trace_summary *s = calloc(1, sizeof *s);
    if (!ev || !s) {
        free(ev);
        free(s);
        cJSON_Delete(j);
        return dt_error(DT_ERR_NO_MEMORY, "trace summary: %zu events", cap);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = dt__trace_str(e, "ph");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
        if (!ph || strcmp(ph, "X"))
            continue;
        sev *x = &ev[n];
        /* each number in range before it is converted (a double out of an int's range is undefined there) */
        const double pid = dt__trace_num(e, "pid", -1), tid = dt__trace_num(e, "tid", -1);
        const double step = dt__trace_num(a, "step", -1);
        x->ts = dt__trace_num(e, "ts", -1);
        x->dur = dt__trace_num(e, "dur", -1);
        x->cat = dt__trace_str(e, "cat");
        x->name = dt__trace_str(e, "name");
        x->args = cJSON_IsObject(a) ? a : NULL;
        const bool ok = pid >= 0 && pid < DT_TRACE_MAX_RANKS && tid >= INT_MIN && tid <= INT_MAX && step >= -0x1p62 &&
                        step <= 0x1p62 && isfinite(x->ts) && x->ts >= 0 && isfinite(x->dur) && x->dur >= 0;
        x->pid = ok ? (int)pid : -1;
        x->tid = ok ? (int)tid : -1;
        x->step = ok ? (int64_t)step : -1;
        if (!ok || !x->cat || !x->name) {
            st = dt_error(DT_ERR_FORMAT,
                          "trace file '%s': event %zu lacks pid (0 to %d), tid, ts, dur (finite, >= 0), cat or name "
                          "(or its args.step is out of range)", path, n,
                          DT_TRACE_MAX_RANKS - 1);
            break;
        }
        double w = dt__trace_num(a, "wait_us", 0);
        x->wait = w > 0 && w <= x->dur ? w : 0;
        classify(x);
        s->world = x->pid + 1 > s->world ? x->pid + 1 : s->world;
        n++;
    }
    if (st >= 0)
        st = step_rows(s, ev, n);
    if (st >= 0)
        st = coll_rows(s, ev, n);
    if (st >= 0)
        st = op_rows(s, ev, n);
    free(ev);
    cJSON_Delete(j);
    if (st < 0) {
        dt_trace_summary_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_trace_summary_free(dt_trace_summary *s)
{
    if (!s)
        return;
    free(s->steps);
    free(s->colls);
    free(s->ops);
    free(s);
}
