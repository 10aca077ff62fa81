/* Non-finite values in a step without loss scaling (train.h): the scan of
 * the gradients each rank steps, the error every rank returns together when
 * some rank saw a non-finite loss or gradient, the buffer snapshot that a
 * skipped step restores, the cross-rank configuration check, and the
 * test-only fault injection (DT_FAULT_NONFINITE).
 *
 * The scan is one read pass over the owned gradients in their own dtype
 * (dt_k_first_nonfinite: exponent bits all ones, vectorised, threaded); where
 * the optimizer's unscale pass already read them (low-precision gradients
 * widened for the clipping norm) its flag answers and the f32 copies are
 * scanned only to name the first one. The flag travels in the step's
 * existing agreement all-reduce (trainer.c).
 * Only when some rank raised it does every rank take the slow path here: one
 * more all-reduce of four numbers per rank, after which every rank knows
 * which ranks saw what and returns the same message. */
#include "train/train_impl.h"

#include "base/same_check.h"
#include "dtrain/kernels.h"
#include "dtrain/parallel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pieces of range r the optimizer steps: its segments clipped to
 * [lo, hi) (the elements between them, e.g. another stage's tensors in a
 * pipeline's range, are not this rank's and are not read), or [lo, hi). */
static bool range_piece(const dt_optim_range *r, size_t j, size_t *a, size_t *b)
{
    if (!r->segs || !r->nseg) {
        *a = r->lo, *b = r->hi;
        return j == 0;
    }
    if (j >= r->nseg)
        return false;
    *a = r->segs[j].offset > r->lo ? r->segs[j].offset : r->lo;
    *b = r->segs[j].offset + r->segs[j].numel;
    *b = *b < r->hi ? *b : r->hi;
    *b = *b > *a ? *b : *a;
    return true;
}

bool dt__grads_nonfinite(const dt_optim_range *rg, size_t nrg, float *const *g32, size_t *range, size_t *index)
{
    for (size_t k = 0; k < nrg; k++) {
        const dt_flat *g = rg[k].grads;
        if (g32 ? !g32[k] : !g || !g->base || rg[k].hi <= rg[k].lo)
            continue;
        size_t a, b;
        for (size_t j = 0; range_piece(&rg[k], j, &a, &b); j++) {
            if (b <= a)
                continue;
            int64_t at = g32 ? dt_k_first_nonfinite(g32[k] + (a - rg[k].lo), DT_F32, (int64_t)(b - a))
                             : dt_k_first_nonfinite(dt_flat_ptr(g, a), g->dtype, (int64_t)(b - a));
            if (at >= (int64_t)(b - a))
                continue;
            *range = k;
            *index = (a - rg[k].lo) + (size_t)at;
            return true;
        }
    }
    return false;
}

/* ---- the check in backward (train_impl.h: dt__nf_scan) ---------------------------- */

static dt_status nf_hook(dt_model *m, size_t index, const dt_param_info *p, void *ud)
{
    dt__nf_scan *s = ud;
    if (!atomic_load_explicit(&s->armed, memory_order_relaxed) || index >= s->nent || s->root[index] < 0)
        return DT_OK;
    const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, p->dtype);
    if (!g || !g->base || p->numel == 0)
        return DT_OK; /* not counted: the read pass answers */
    /* checked as it was written (dt_ag_grad_checked_finite), else read here */
    if (!dt_ag_grad_checked_finite(p->tensor) &&
        dt_k_first_nonfinite(dt_flat_ptr(g, p->offset), p->dtype, (int64_t)p->numel) < (int64_t)p->numel)
        atomic_store(&s->hit, true);
    if (!atomic_exchange(&s->seen[s->root[index]], 1))
        atomic_fetch_add(&s->got, 1);
    return DT_OK;
}

dt_status dt__nf_scan_init(dt__nf_scan *s, dt_model *m)
{
    memset(s, 0, sizeof *s);
    const size_t ne = dt_model_num_entries(m);
    s->seen = dt_calloc((ne ? ne : 1) * sizeof *s->seen);
    s->root = dt_calloc((ne ? ne : 1) * sizeof *s->root);
    if (!s->seen || !s->root) {
        dt__nf_scan_free(s);
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_init: the gradient check's table (%zu entries)", ne);
    }
    for (size_t i = 0; i < ne; i++) {
        dt_param_info e;
        s->root[i] = -1;
        if (dt_model_entry(m, i, &e) < 0 || e.is_buffer || e.frozen || e.numel == 0 ||
            (e.dtype != DT_F32 && e.dtype != DT_BF16 && e.dtype != DT_F16))
            continue;
        s->root[i] = e.tied_to >= 0 ? e.tied_to : (int64_t)i;
        s->need += e.tied_to < 0;
    }
    s->nent = ne;
    dt_status st = dt_model_add_grad_ready_hook(m, nf_hook, s, &s->id);
    if (st < 0) {
        dt__nf_scan_free(s);
        return st;
    }
    s->m = m;
    s->hooked = true;
    return DT_OK;
}

void dt__nf_scan_free(dt__nf_scan *s)
{
    if (s->hooked)
        dt_model_remove_hook(s->m, s->id);
    dt_free((void *)s->seen);
    dt_free(s->root);
    memset(s, 0, sizeof *s);
}

void dt__nf_scan_arm(dt__nf_scan *s, bool on)
{
    if (!s->hooked)
        return;
    atomic_store(&s->armed, false);
    for (size_t i = 0; i < s->nent; i++)
        atomic_store_explicit(&s->seen[i], 0, memory_order_relaxed);
    atomic_store(&s->got, 0);
    atomic_store(&s->hit, false);
    atomic_store(&s->armed, on);
}

bool dt__nf_scan_clean(dt__nf_scan *s)
{
    const bool clean = s->hooked && atomic_load(&s->armed) && !atomic_load(&s->hit) && s->need > 0 &&
                       atomic_load(&s->got) == s->need;
    if (s->hooked)
        atomic_store(&s->armed, false);
    return clean;
}

/* The model entry holding element `index` of range k (relative to its lo),
 * and the element within that tensor; -1 when it cannot be told (a
 * strategy's ranges other than ZeRO's). */
static int64_t locate(dt_strategy *s, dt_model *m, const dt_optim_range *rg, size_t k, size_t index,
                      size_t *elem)
{
    size_t n = 0;
    dt_zero_piece *q = NULL;
    if (dt__strategy_pieces(s, &q, &n) < 0)
        return -1;
    if (q) { /* the strategy's map (ZeRO's shards) */
        int64_t found = -1;
        for (size_t i = 0; i < n && found < 0; i++)
            if (q[i].range == k && index >= q[i].range_offset && index < q[i].range_offset + (q[i].hi - q[i].lo)) {
                found = (int64_t)q[i].entry;
                *elem = q[i].lo + (index - q[i].range_offset);
            }
        free(q);
        return found;
    }
    if (s->ops.optim_ranges) /* a pipeline's shares: no map kept here */
        return -1;
    const size_t gi = rg[k].lo + index, ne = dt_model_num_entries(m);
    for (size_t i = 0; i < ne; i++) {
        dt_param_info e;
        if (dt_model_entry(m, i, &e) < 0 || e.is_buffer || e.tied_to >= 0 || e.dtype != rg[k].grads->dtype)
            continue;
        if (gi >= e.offset && gi < e.offset + e.numel) {
            *elem = gi - e.offset;
            return (int64_t)i;
        }
    }
    return -1;
}

#define W 5 /* numbers per rank: loss micro-batch, loss kind, gradient flag, entry + 1, element */

/* "1, 3, 4" (at most 8, then "and N more") of the ranks r with v[W * r + f] != 0. */
static void rank_list(const double *v, int world, int f, char *buf, size_t n, int *count, int base)
{
    size_t k = 0;
    int c = 0;
    buf[0] = '\0';
    for (int r = 0; r < world; r++) {
        if (v[W * r + f] == 0)
            continue;
        if (c < 8 && k < n)
            k += (size_t)snprintf(buf + k, n - k, "%s%d", c ? ", " : "", r + base);
        c++;
    }
    if (c > 8 && k < n)
        snprintf(buf + k, n - k, " and %d more", c - 8);
    *count = c;
}

dt_status dt__trainer_nonfinite_error(dt_trainer *tr, const dt__nonfinite *loc, int64_t step, int nmicro)
{
    dt_strategy *s = dt_trainer_strategy(tr);
    dt_model *m = dt_trainer_model(tr);
    /* one slot per replica: a strategy whose sum runs over more ranks than
     * its replicas (a pipeline's stages) reports this rank's findings alone */
    const bool slots = !s->ops.forward_backward && dt_trainer_rank(tr) < dt_trainer_world(tr);
    const int world = slots ? dt_trainer_world(tr) : 1, rank = slots ? dt_trainer_rank(tr) : 0;
    double *v = calloc((size_t)W * (size_t)world, sizeof *v);
    if (!v)
        return dt_error(DT_ERR_NO_MEMORY, "the loss or the gradients are not finite at optimizer step %lld",
                        (long long)step);
    double *mine = v + W * rank;
    mine[0] = loc->loss_micro; /* 1-based micro-batch, 0: finite */
    mine[1] = !loc->loss_micro ? 0 : isnan(loc->loss_value) ? 1 : loc->loss_value > 0 ? 2 : 3;
    mine[2] = loc->grad ? 1 : 0;
    size_t elem = 0;
    if (loc->grad) {
        const dt_optim_range *rg;
        size_t nrg;
        dt__trainer_ranges(tr, &rg, &nrg);
        int64_t e = locate(s, m, rg, loc->range, loc->index, &elem);
        mine[3] = (double)(e + 1);
        mine[4] = (double)(e >= 0 ? elem : loc->index);
    }
    /* every rank is here (the agreed flag): one more all-reduce names them,
     * and every rank writes the same message from the same numbers */
    dt_status st = slots ? dt_trainer_allreduce_sum(tr, v, W * world) : DT_OK;
    if (st < 0) {
        free(v);
        return dt_error_wrap(st, "the loss or the gradients are not finite at optimizer step %lld; naming the "
                                 "ranks", (long long)step);
    }
    char msg[1536], ranks[160];
    size_t k = 0;
    int nl = 0, ng = 0;
    k += (size_t)snprintf(msg, sizeof msg, "non-finite values at optimizer step %lld, training stopped on every rank "
                          "(no update applied)", (long long)step);
    rank_list(v, world, 0, ranks, sizeof ranks, &nl, slots ? 0 : dt_trainer_rank(tr));
    if (nl > 0) {
        int r0 = 0;
        while (v[W * r0] == 0)
            r0++;
        const int kind = (int)v[W * r0 + 1];
        char on[48] = "";
        if (nl > 1)
            snprintf(on, sizeof on, " on rank %d", r0 + (slots ? 0 : dt_trainer_rank(tr)));
        k += (size_t)snprintf(msg + k, sizeof msg - k, ": the loss is %s on rank%s %s (micro-batch %d of %d%s)",
                              kind == 1 ? "NaN" : kind == 2 ? "+inf" : "-inf", nl > 1 ? "s" : "", ranks,
                              (int)v[W * r0], nmicro, on);
    }
    rank_list(v, world, 2, ranks, sizeof ranks, &ng, slots ? 0 : dt_trainer_rank(tr));
    if (ng > 0 && k < sizeof msg) {
        int r0 = 0;
        while (v[W * r0 + 2] == 0)
            r0++;
        const int64_t e = (int64_t)v[W * r0 + 3] - 1;
        dt_param_info pi;
        char what[400];
        if (e >= 0 && dt_model_entry(m, (size_t)e, &pi) >= 0)
            snprintf(what, sizeof what, "the gradient of '%s' (element %.0f)", pi.name, v[W * r0 + 4]);
        else
            snprintf(what, sizeof what, "a gradient (element %.0f of the optimizer's range)", v[W * r0 + 4]);
        k += (size_t)snprintf(msg + k, sizeof msg - k, "%s %s is not finite on rank%s %s%s", nl ? ";" : ":", what,
                              ng > 1 ? "s" : "", ranks,
                              nl && ng > nl ? " (the reduction carries one rank's non-finite gradients to all)" : "");
    }
    if (nl == 0 && ng == 0 && k < sizeof msg)
        k += (size_t)snprintf(msg + k, sizeof msg - k, ": on another rank (%s)",
                              slots ? "a tensor-parallel peer" : "another stage or replica of the pipeline");
    if (k < sizeof msg)
        snprintf(msg + k, sizeof msg - k, ". Training diverged or the data holds inf/NaN: check the data, "
                                          "or try a smaller learning rate or gradient clipping");
    free(v);
    return dt_error(DT_ERR_INVALID_ARG, "%s", msg);
}
#undef W

/* ---- buffers (running statistics) kept across a step that may be skipped ---- */

dt_status dt__buffers_snapshot(dt_model *m, void **save, size_t *cap)
{
    size_t need = 0;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (b && b->base)
            need += dt_flat_nbytes(b);
    }
    if (need == 0)
        return DT_OK;
    if (need > *cap) {
        void *p = realloc(*save, need);
        if (!p)
            return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_step: a copy of the model's buffers (%zu bytes)", need);
        *save = p;
        *cap = need;
    }
    size_t off = 0;
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const dt_flat *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (b && b->base) {
            memcpy((char *)*save + off, b->base, dt_flat_nbytes(b));
            off += dt_flat_nbytes(b);
        }
    }
    return DT_OK;
}

void dt__buffers_restore(dt_model *m, const void *save)
{
    size_t off = 0;
    for (int d = 0; d < DT_DTYPE_COUNT && save; d++) {
        const dt_flat *b = dt_model_flat(m, DT_FLAT_BUFFERS, (dt_dtype)d);
        if (b && b->base) {
            memcpy(b->base, (const char *)save + off, dt_flat_nbytes(b));
            off += dt_flat_nbytes(b);
        }
    }
}

/* ---- DT_FAULT_NONFINITE=RANK:STEP:WHAT (tests) ---- */

dt_status dt__fault_parse(dt__fault *f)
{
    memset(f, 0, sizeof *f);
    const char *e = getenv("DT_FAULT_NONFINITE");
    if (!e || !*e)
        return DT_OK;
    char what[16] = "";
    long long r = -1, s = -1;
    int used = 0;
    if (sscanf(e, "%lld:%lld:%15[a-z]%n", &r, &s, what, &used) != 3 || e[used] || r < 0 || s < 1 ||
        (strcmp(what, "loss") && strcmp(what, "grad") && strcmp(what, "input")))
        return dt_error(DT_ERR_INVALID_ARG, "DT_FAULT_NONFINITE='%s': expected RANK:STEP:WHAT with RANK >= 0, "
                        "STEP >= 1 (an optimizer step) and WHAT loss, grad or input", e);
    f->rank = (int)r;
    f->step = s;
    f->what = what[0] == 'l' ? DT__FAULT_LOSS : what[0] == 'g' ? DT__FAULT_GRAD : DT__FAULT_INPUT;
    return DT_OK;
}

void dt__fault_grad(const dt_optim_range *rg, size_t nrg)
{
    for (size_t k = 0; k < nrg; k++) {
        const dt_flat *g = rg[k].grads;
        size_t a, b;
        if (!g || !g->base || !range_piece(&rg[k], 0, &a, &b) || b <= a)
            continue;
        void *p = dt_flat_ptr(g, a);
        if (g->dtype == DT_F32)
            *(float *)p = NAN;
        else if (g->dtype == DT_BF16)
            *(uint16_t *)p = 0x7fc0u;
        else if (g->dtype == DT_F16)
            *(uint16_t *)p = 0x7e00u;
        else
            continue;
        return;
    }
}

void *dt__fault_input(const void *x, dt_dtype dt, size_t n)
{
    const size_t es = dt_dtype_size(dt);
    void *c = x && n && (dt == DT_F32 || dt == DT_BF16 || dt == DT_F16) ? malloc(n * es) : NULL;
    if (!c)
        return NULL;
    memcpy(c, x, n * es);
    if (dt == DT_F32)
        *(float *)c = INFINITY;
    else
        *(uint16_t *)c = dt == DT_BF16 ? 0x7f80u : 0x7c00u;
    return c;
}

/* ---- the same settings on every replica ---- */

static dt_status sum_replicas(void *tr, double *v, int n) { return dt_trainer_allreduce_sum(tr, v, n); }

dt_status dt_trainer_check_same(dt_trainer *tr, const dt_trainer_field *f, int n)
{
    if (!tr || (!f && n > 0) || n < 0)
        return dt_error(DT_ERR_NULL, "dt_trainer_check_same: NULL argument");
    const int world = dt_trainer_world(tr), rank = dt_trainer_rank(tr);
    /* one slot per replica; a pipeline's sum spans its stages too (and
     * scales): its settings are not compared here (dt_pg_check_same over
     * its world group does) */
    if (world <= 1 || dt_trainer_strategy(tr)->ops.forward_backward || rank >= world)
        return DT_OK;
    const char **nv = malloc(2 * (size_t)n * sizeof *nv + 1);
    if (!nv)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_check_same: %d fields", n);
    for (int i = 0; i < n; i++)
        nv[i] = f[i].name, nv[n + i] = f[i].value;
    dt_status st = dt__same_check(world, rank, nv, nv + n, n, sum_replicas, tr, "dt_trainer_check_same");
    free(nv);
    return st;
}
