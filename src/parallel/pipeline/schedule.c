/* Pipeline schedules as one global action table (pipeline.h).
 *
 * Building a table takes three passes:
 *   1. each rank's compute order (F, B, BI, BW) from the schedule's rule
 *      (one function per schedule below);
 *   2. communication: a SEND right after the action that produces a
 *      message; on the receiving rank, RECVs are posted in the SENDER's
 *      order — before a compute action that needs message X from rank q,
 *      every message q sends to this rank before X is posted too (early,
 *      into its own buffer). Point-to-point messages between two ranks are
 *      matched in posting order, so this is what keeps an activation from
 *      landing in another micro-batch's buffer; posting the receive just
 *      before its use would not (interleaved: rank 0 sends stage 0's and
 *      stage 2's activations to rank 1 in an order rank 1 consumes
 *      differently);
 *   3. times: a replay with unit costs (check.c) gives every action its
 *      start step, and the checker runs on the result.
 * The executor (exec.c) runs the lists as built. */
#include "parallel/pipeline/pipe_impl.h"

#include <stdlib.h>
#include <string.h>

int dt_pipe_stage_rank(int p, int stage) { return p > 0 ? stage % p : 0; }

double dt_pipe_bubble_formula(dt_pipe_kind kind, int p, int m, int v)
{
    if (p < 1 || m < 1 || v < 1)
        return 0;
    switch (kind) {
    case DT_PIPE_INTERLEAVED:
        return (double)(p - 1) / ((double)v * m);
    case DT_PIPE_ZBH1:
        return (double)(p - 1) / (3.0 * m);
    default:
        return (double)(p - 1) / m;
    }
}

/* ---- per-rank lists under construction ------------------------------------------- */

static dt_status push(dt__pipe_list *l, dt_pipe_op op, int stage, int mb, int peer)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        dt_pipe_action *a = realloc(l->a, (size_t)cap * sizeof *a);
        if (!a)
            return dt_error(DT_ERR_NO_MEMORY, "pipeline schedule: out of memory");
        l->a = a;
        l->cap = cap;
    }
    l->a[l->n++] = (dt_pipe_action){.op = op, .stage = stage, .mb = mb, .peer = peer, .t = 0};
    return DT_OK;
}

/* ---- 1. compute orders ------------------------------------------------------------- */

static dt_status order_gpipe(int p, int m, int r, dt__pipe_list *l)
{
    (void)p;
    dt_status st = DT_OK;
    for (int i = 0; i < m && st >= 0; i++)
        st = push(l, DT_PIPE_F, r, i, -1);
    for (int i = 0; i < m && st >= 0; i++)
        st = push(l, DT_PIPE_B, r, i, -1);
    return st;
}

static dt_status order_1f1b(int p, int m, int r, dt__pipe_list *l)
{
    int warm = p - r - 1 < m ? p - r - 1 : m;
    dt_status st = DT_OK;
    for (int i = 0; i < warm && st >= 0; i++)
        st = push(l, DT_PIPE_F, r, i, -1);
    for (int i = 0; i < m - warm && st >= 0; i++) {
        st = push(l, DT_PIPE_F, r, warm + i, -1);
        if (st >= 0)
            st = push(l, DT_PIPE_B, r, i, -1);
    }
    for (int i = m - warm; i < m && st >= 0; i++)
        st = push(l, DT_PIPE_B, r, i, -1);
    return st;
}

/* ZB-H1 (Qi et al. 2023): 1F1B's memory limit with each backward split
 * into BI (input gradient: on the critical path, the previous stage waits
 * for it) and BW (weight gradient: nobody waits for it). The order comes
 * from list scheduling all ranks at once with unit costs (F = BI = BW):
 * a free rank runs, in this priority, the next F when its activation has
 * arrived, fewer than p - r micro-batches are between F and BI (1F1B's
 * warm-up) and fewer than p between F and BW (the paper's "same number of
 * in-flight micro-batches on every stage": the first stage holds no more
 * than under 1F1B); else the next BI whose gradient has arrived; else the
 * oldest pending BW. BW's thus fill the slots where 1F1B waits: the
 * replay's bubble is p-1 units against 1F1B's 3(p-1) (a third), for every
 * p and m tried (tests/parallel/test_pipe_schedule.c). The greedy
 * alternatives (BI first; BW counted with BI) left 1-3 more units. Orders
 * for all ranks come out together (one call, r = 0). */
static dt_status order_zbh1_all(int p, int m, dt__pipe_list *lists)
{
    size_t pm = (size_t)p * (size_t)m;
    int *fa = malloc(pm * sizeof *fa), *ga = malloc(pm * sizeof *ga);
    int *nf = calloc((size_t)p, sizeof *nf), *nbi = calloc((size_t)p, sizeof *nbi), *nw = calloc((size_t)p, sizeof *nw);
    dt_status st = DT_OK;
    if (!fa || !ga || !nf || !nbi || !nw) {
        st = dt_error(DT_ERR_NO_MEMORY, "zbh1 schedule: out of memory");
        goto done;
    }
    for (size_t k = 0; k < pm; k++)
        fa[k] = ga[k] = -1; /* arrival time of the activation / gradient at rank r for mb */
    for (int mb = 0; mb < m; mb++)
        fa[mb] = 0;      /* rank 0 reads its input */
    int left = 3 * p * m;
    for (int t = 0; left > 0 && st >= 0; t++) {
        for (int r = 0; r < p && st >= 0; r++) {
            int *f = &fa[(size_t)r * m], *g = &ga[(size_t)r * m];
            if (nf[r] < m && f[nf[r]] >= 0 && f[nf[r]] <= t && nf[r] - nbi[r] < p - r && nf[r] - nw[r] < p) {
                int mb = nf[r]++;
                st = push(&lists[r], DT_PIPE_F, r, mb, -1);
                if (r < p - 1)
                    fa[(size_t)(r + 1) * m + mb] = t + 1;
                else
                    g[mb] = t + 1;
            } else if (nbi[r] < nf[r] && g[nbi[r]] >= 0 && g[nbi[r]] <= t) {
                int mb = nbi[r]++;
                st = push(&lists[r], DT_PIPE_BI, r, mb, -1);
                if (r > 0)
                    ga[(size_t)(r - 1) * m + mb] = t + 1;
            } else if (nw[r] < nbi[r]) {
                st = push(&lists[r], DT_PIPE_BW, r, nw[r]++, -1);
            } else {
                continue;
            }
            left--;
        }
    }
done:
    free(fa);
    free(ga);
    free(nf);
    free(nbi);
    free(nw);
    return st;
}

/* Megatron's interleaved 1F1B (schedules.py,
 * forward_backward_pipelining_with_interleaving): virtual micro-batch k
 * runs chunk (k mod pv) / p forward (v - 1 minus that backward) on
 * micro-batch (k / pv) p + k mod p; warm-up min(2(p-r-1) + (v-1)p, mv)
 * (all of them when m == p), then 1F1B over virtual micro-batches. */
static dt_status order_interleaved(int p, int m, int v, int r, dt__pipe_list *l)
{
    int total = m * v, pv = p * v;
    int warm = (m == p) ? total : 2 * (p - r - 1) + (v - 1) * p;
    if (warm > total)
        warm = total;
    dt_status st = DT_OK;
#define VMB(k) (((k) / pv) * p + (k) % p)
#define FCHUNK(k) (((k) % pv) / p)
#define BCHUNK(k) (v - 1 - ((k) % pv) / p)
    for (int k = 0; k < warm && st >= 0; k++)
        st = push(l, DT_PIPE_F, FCHUNK(k) * p + r, VMB(k), -1);
    for (int i = 0; i < total - warm && st >= 0; i++) {
        int k = warm + i;
        st = push(l, DT_PIPE_F, FCHUNK(k) * p + r, VMB(k), -1);
        if (st >= 0)
            st = push(l, DT_PIPE_B, BCHUNK(i) * p + r, VMB(i), -1);
    }
    for (int i = total - warm; i < total && st >= 0; i++)
        st = push(l, DT_PIPE_B, BCHUNK(i) * p + r, VMB(i), -1);
#undef VMB
#undef FCHUNK
#undef BCHUNK
    return st;
}

/* ---- 2. communication ------------------------------------------------------------------ */

/* The message a compute action needs from another rank (*dir DT_PIPE_SEND_F
 * or _B, *src the sending stage), or false. */
static bool needs(const dt__pipe_sched *s, const dt_pipe_action *a, dt_pipe_op *dir, int *src)
{
    int S = s->p * s->v;
    if (a->op == DT_PIPE_F && a->stage > 0) {
        *dir = DT_PIPE_SEND_F, *src = a->stage - 1;
    } else if ((a->op == DT_PIPE_B || a->op == DT_PIPE_BI) && a->stage < S - 1) {
        *dir = DT_PIPE_SEND_B, *src = a->stage + 1;
    } else {
        return false;
    }
    return dt_pipe_stage_rank(s->p, *src) != dt_pipe_stage_rank(s->p, a->stage);
}

/* The message a compute action produces for another rank, or false. */
static bool produces(const dt__pipe_sched *s, const dt_pipe_action *a, dt_pipe_op *dir, int *dst)
{
    int S = s->p * s->v;
    if (a->op == DT_PIPE_F && a->stage < S - 1) {
        *dir = DT_PIPE_SEND_F, *dst = a->stage + 1;
    } else if ((a->op == DT_PIPE_B || a->op == DT_PIPE_BI) && a->stage > 0) {
        *dir = DT_PIPE_SEND_B, *dst = a->stage - 1;
    } else {
        return false;
    }
    return dt_pipe_stage_rank(s->p, *dst) != dt_pipe_stage_rank(s->p, a->stage);
}

static dt_status add_comm(dt__pipe_sched *s, dt__pipe_list *comp)
{
    int p = s->p;
    dt_status st = DT_OK;
    /* sends: after their producer */
    dt__pipe_list *withsend = calloc((size_t)p, sizeof *withsend);
    int *cur = calloc((size_t)p * (size_t)p, sizeof *cur);
    if (!withsend || !cur) {
        st = dt_error(DT_ERR_NO_MEMORY, "pipeline schedule: out of memory");
        goto done;
    }
    for (int r = 0; r < p && st >= 0; r++)
        for (int i = 0; i < comp[r].n && st >= 0; i++) {
            const dt_pipe_action *a = &comp[r].a[i];
            st = push(&withsend[r], a->op, a->stage, a->mb, -1);
            dt_pipe_op dir;
            int dst;
            if (st >= 0 && produces(s, a, &dir, &dst))
                st = push(&withsend[r], dir, a->stage, a->mb, dt_pipe_stage_rank(p, dst));
        }
    /* receives: in the sender's order, up to the message needed */
    for (int r = 0; r < p && st >= 0; r++) {
        for (int i = 0; i < withsend[r].n && st >= 0; i++) {
            const dt_pipe_action a = withsend[r].a[i];
            dt_pipe_op dir;
            int src;
            if (a.op <= DT_PIPE_BW && needs(s, &a, &dir, &src)) {
                int q = dt_pipe_stage_rank(p, src);
                bool found = false;
                while (!found) {
                    int *c = &cur[q * p + r];
                    while (*c < withsend[q].n && !((withsend[q].a[*c].op == DT_PIPE_SEND_F ||
                                                    withsend[q].a[*c].op == DT_PIPE_SEND_B) &&
                                                   withsend[q].a[*c].peer == r))
                        (*c)++;
                    if (*c >= withsend[q].n) {
                        st = dt_error(DT_ERR_STATE, "pipeline schedule: rank %d needs %s of stage %d, micro-batch "
                                      "%d, which rank %d never sends", r,
                                      dir == DT_PIPE_SEND_F ? "the activation" : "the gradient", src, a.mb, q);
                        break;
                    }
                    const dt_pipe_action *sa = &withsend[q].a[(*c)++];
                    dt_pipe_op rop = sa->op == DT_PIPE_SEND_F ? DT_PIPE_RECV_F : DT_PIPE_RECV_B;
                    if ((st = push(&s->lists[r], rop, sa->stage, sa->mb, q)) < 0)
                        break;
                    found = sa->op == dir && sa->stage == src && sa->mb == a.mb;
                }
            }
            if (st >= 0)
                st = push(&s->lists[r], a.op, a.stage, a.mb, a.peer);
        }
    }
done:
    for (int r = 0; withsend && r < p; r++)
        free(withsend[r].a);
    free(withsend);
    free(cur);
    return st;
}

/* ---- building ----------------------------------------------------------------------------- */

static dt_status check_limits(dt_pipe_kind kind, int p, int m, int v)
{
    const char *name = dt_pipe_kind_name(kind);
    if ((unsigned)kind >= DT_PIPE_KIND_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "pipeline schedule: unknown kind %d", (int)kind);
    if (p < 1 || p > DT_PIPE_MAX_RANKS)
        return dt_error(DT_ERR_INVALID_ARG, "%s: pipeline ranks p = %d is outside [1, %d]", name, p,
                        DT_PIPE_MAX_RANKS);
    if (m < 1 || m > DT_PIPE_MAX_MICRO)
        return dt_error(DT_ERR_INVALID_ARG, "%s: micro-batches m = %d is outside [1, %d]", name, m,
                        DT_PIPE_MAX_MICRO);
    if (kind == DT_PIPE_INTERLEAVED) {
        if (v < 2)
            return dt_error(DT_ERR_INVALID_ARG, "interleaved: v = %d chunks per rank; the interleaved schedule "
                            "needs v >= 2 (use 1f1b for one chunk)", v);
        if (m % p)
            return dt_error(DT_ERR_INVALID_ARG, "interleaved: micro-batches m = %d must be a multiple of the "
                            "pipeline ranks p = %d (Megatron's limit: micro-batches go through in groups of p)",
                            m, p);
    } else if (v != 1) {
        return dt_error(DT_ERR_INVALID_ARG, "%s: v = %d chunks per rank; only the interleaved schedule has more "
                        "than one", name, v);
    }
    if ((long)p * v > DT_PIPE_MAX_STAGES)
        return dt_error(DT_ERR_INVALID_ARG, "%s: p v = %d stages is above %d", name, p * v, DT_PIPE_MAX_STAGES);
    return DT_OK;
}

static dt__pipe_sched *sched_new(dt_pipe_kind kind, int p, int m, int v)
{
    dt__pipe_sched *s = calloc(1, sizeof *s);
    if (s)
        s->lists = calloc((size_t)p, sizeof *s->lists);
    if (!s || !s->lists) {
        free(s);
        dt_error(DT_ERR_NO_MEMORY, "pipeline schedule: out of memory");
        return NULL;
    }
    s->kind = kind, s->p = p, s->m = m, s->v = v;
    return s;
}

dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int p, int m, int v, dt_pipe_schedule **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_build: out is NULL");
    *out = NULL;
    dt_status st = check_limits(kind, p, m, v);
    if (st < 0)
        return st;
    dt__pipe_sched *s = sched_new(kind, p, m, v);
    dt__pipe_list *comp = calloc((size_t)p, sizeof *comp);
    if (!s || !comp) {
        free(comp);
        dt_pipe_schedule_free(s);
        return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_schedule_build: out of memory");
    }
    for (int r = 0; r < p && st >= 0; r++) {
        switch (kind) {
        case DT_PIPE_GPIPE:
            st = order_gpipe(p, m, r, &comp[r]);
            break;
        case DT_PIPE_1F1B:
            st = order_1f1b(p, m, r, &comp[r]);
            break;
        case DT_PIPE_INTERLEAVED:
            st = order_interleaved(p, m, v, r, &comp[r]);
            break;
        case DT_PIPE_ZBH1:
        default:
            if (r == 0)
                st = order_zbh1_all(p, m, comp);
            break;
        }
    }
    if (st >= 0)
        st = add_comm(s, comp);
    for (int r = 0; r < p; r++)
        free(comp[r].a);
    free(comp);
    if (st >= 0)
        st = dt__pipe_check_and_time(s);
    if (st < 0) {
        dt_pipe_schedule_free(s);
        return dt_error_wrap(st, "%s schedule (p %d, m %d, v %d)", dt_pipe_kind_name(kind), p, m, v);
    }
    *out = s;
    return DT_OK;
}

dt_status dt_pipe_schedule_from_actions(int p, int m, int v, const dt_pipe_action *const *acts, const int *n,
                                        dt_pipe_schedule **out)
{
    if (!out || !acts || !n)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_from_actions: an argument is NULL");
    *out = NULL;
    if (p < 1 || p > DT_PIPE_MAX_RANKS || m < 1 || m > DT_PIPE_MAX_MICRO || v < 1 || (long)p * v > DT_PIPE_MAX_STAGES)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_schedule_from_actions: p %d, m %d, v %d out of range", p, m, v);
    dt__pipe_sched *s = sched_new(DT_PIPE_KIND_COUNT, p, m, v);
    if (!s)
        return dt_last_status();
    dt_status st = DT_OK;
    for (int r = 0; r < p && st >= 0; r++) {
        if (n[r] < 0 || (n[r] > 0 && !acts[r]))
            st = dt_error(DT_ERR_INVALID_ARG, "dt_pipe_schedule_from_actions: rank %d: bad list", r);
        for (int i = 0; i < n[r] && st >= 0; i++)
            st = push(&s->lists[r], acts[r][i].op, acts[r][i].stage, acts[r][i].mb, acts[r][i].peer);
    }
    if (st >= 0)
        st = dt__pipe_check_and_time(s);
    if (st < 0) {
        dt_pipe_schedule_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_pipe_schedule_free(dt_pipe_schedule *s)
{
    if (!s)
        return;
    for (int r = 0; s->lists && r < s->p; r++)
        free(s->lists[r].a);
    free(s->lists);
    free(s);
}

dt_status dt_pipe_schedule_actions(const dt_pipe_schedule *s, int rank, const dt_pipe_action **a, int *n)
{
    if (!s || !a || !n)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_actions: an argument is NULL");
    if (rank < 0 || rank >= s->p)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_schedule_actions: rank %d outside [0, %d)", rank, s->p);
    *a = s->lists[rank].a;
    *n = s->lists[rank].n;
    return DT_OK;
}

void dt_pipe_schedule_shape(const dt_pipe_schedule *s, int *p, int *m, int *v, dt_pipe_kind *kind)
{
    if (p)
        *p = s ? s->p : 0;
    if (m)
        *m = s ? s->m : 0;
    if (v)
        *v = s ? s->v : 0;
    if (kind)
        *kind = s ? s->kind : DT_PIPE_KIND_COUNT;
}
