/* Checking a pipeline table, replaying it, printing it (pipeline.h).
 *
 * The checker is independent of how a table was built: it sees only the
 * per-rank lists. Structure first (each (stage, micro-batch) forwarded and
 * backwarded exactly once on the stage's rank, in order; every message
 * sent after it is produced and received before it is consumed), then the
 * order of messages per ordered pair of ranks (sends of one == receives of
 * the other, element by element: point to point is matched in posting
 * order), then a replay: every rank walks its list, a send never blocks, a
 * compute action waits until its message was sent (or, with both stages
 * on one rank, until the producing action ended). A replay that stops
 * with actions left is a deadlock; the error names each stuck rank and
 * what it waits for. */
#include "parallel/pipeline/pipe_impl.h"

#include <stdlib.h>
#include <string.h>

static const char *const k_op_names[DT_PIPE_OP_COUNT] = {"F", "B", "BI", "BW", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
_Static_assert(DT_PIPE_OP_COUNT == 8, "a name per op");

const char *dt__pipe_action_str(const dt_pipe_action *a, char *buf, size_t n)
{
    const char *op = (unsigned)a->op < DT_PIPE_OP_COUNT ? k_op_names[a->op] : "?";
    if (a->op >= DT_PIPE_SEND_F)
        snprintf(buf, n, "%s(stage %d, mb %d %s rank %d)", op, a->stage, a->mb,
                 a->op == DT_PIPE_SEND_F || a->op == DT_PIPE_SEND_B ? "->" : "<-", a->peer);
    else
        snprintf(buf, n, "%s(stage %d, mb %d)", op, a->stage, a->mb);
    return buf;
}

static bool is_send(dt_pipe_op op) { return op == DT_PIPE_SEND_F || op == DT_PIPE_SEND_B; }
static bool is_recv(dt_pipe_op op) { return op == DT_PIPE_RECV_F || op == DT_PIPE_RECV_B; }

/* ---- structure -------------------------------------------------------------------- */

typedef struct {
    int *f, *b, *bi, *bw;   /* position on the stage's rank, -1 absent; per (stage, mb) */
} positions;

#define IDX(s, st, mb) ((size_t)(st) * (size_t)(s)->m + (size_t)(mb))

static dt_status fail_at(int r, const dt_pipe_action *a, const char *what)
{
    char b[96];
    return dt_error(DT_ERR_INVALID_ARG, "pipeline table: rank %d, %s: %s", r, dt__pipe_action_str(a, b, sizeof b),
                    what);
}

static dt_status check_structure(const dt__pipe_sched *s, positions *ps)
{
    const int p = s->p, S = p * s->v;
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < s->lists[r].n; i++) {
            const dt_pipe_action *a = &s->lists[r].a[i];
            if ((unsigned)a->op >= DT_PIPE_OP_COUNT)
                return fail_at(r, a, "unknown op");
            if (a->stage < 0 || a->stage >= S || a->mb < 0 || a->mb >= s->m)
                return fail_at(r, a, "stage or micro-batch out of range");
            if (a->op <= DT_PIPE_BW) {
                if (dt_pipe_stage_rank(p, a->stage) != r)
                    return fail_at(r, a, "the stage is not held by this rank");
                int *slot = a->op == DT_PIPE_F ? ps->f : a->op == DT_PIPE_B ? ps->b : a->op == DT_PIPE_BI ? ps->bi : ps->bw;
                if (slot[IDX(s, a->stage, a->mb)] >= 0)
                    return fail_at(r, a, "appears twice (each micro-batch runs once per stage)");
                slot[IDX(s, a->stage, a->mb)] = i;
                continue;
            }
            /* messages: the stage that sends, its neighbour, and the ranks */
            bool fwd = a->op == DT_PIPE_SEND_F || a->op == DT_PIPE_RECV_F;
            int dst = fwd ? a->stage + 1 : a->stage - 1;
            if (dst < 0 || dst >= S)
                return fail_at(r, a, "no stage on the other side of this message");
            int from = dt_pipe_stage_rank(p, a->stage), to = dt_pipe_stage_rank(p, dst);
            if (from == to)
                return fail_at(r, a, "both stages are on one rank: nothing to send");
            if (is_send(a->op) ? (r != from || a->peer != to) : (r != to || a->peer != from))
                return fail_at(r, a, "wrong rank or peer for this message");
        }
    }
    for (int st = 0; st < S; st++)
        for (int mb = 0; mb < s->m; mb++) {
            size_t k = IDX(s, st, mb);
            int r = dt_pipe_stage_rank(p, st);
            dt_pipe_action a = {.op = DT_PIPE_F, .stage = st, .mb = mb, .peer = -1};
            if (ps->f[k] < 0)
                return fail_at(r, &a, "missing (every micro-batch runs once per stage)");
            bool whole = ps->b[k] >= 0, split = ps->bi[k] >= 0 || ps->bw[k] >= 0;
            a.op = DT_PIPE_B;
            if (whole == split)
                return fail_at(r, &a, whole ? "both B and BI/BW present" : "no backward (B, or BI and BW)");
            if (split && (ps->bi[k] < 0 || ps->bw[k] < 0))
                return fail_at(r, &a, "BI without BW or BW without BI");
            int bpos = whole ? ps->b[k] : ps->bi[k];
            if (bpos < ps->f[k])
                return fail_at(r, &a, "backward before its forward");
            if (split && ps->bw[k] < ps->bi[k])
                return fail_at(r, &a, "BW before its BI");
            /* neighbours on the same rank (p = 1): local order */
            if (st > 0 && dt_pipe_stage_rank(p, st - 1) == r && ps->f[IDX(s, st - 1, mb)] > ps->f[k])
                return fail_at(r, &a, "forward before the previous stage's forward on the same rank");
            if (st < S - 1 && dt_pipe_stage_rank(p, st + 1) == r) {
                size_t k1 = IDX(s, st + 1, mb);
                int b1 = ps->b[k1] >= 0 ? ps->b[k1] : ps->bi[k1];
                if (b1 > bpos)
                    return fail_at(r, &a, "backward before the next stage's backward on the same rank");
            }
        }
    /* every message produced before sent and received before consumed,
     * exactly once each */
    size_t nmsg = (size_t)2 * S * s->m;
    int *sent = calloc(nmsg, sizeof *sent), *recvd = calloc(nmsg, sizeof *recvd);
    if (!sent || !recvd) {
        free(sent);
        free(recvd);
        return dt_error(DT_ERR_NO_MEMORY, "pipeline table check");
    }
    dt_status st = DT_OK;
    for (int r = 0; r < p && st >= 0; r++)
        for (int i = 0; i < s->lists[r].n && st >= 0; i++) {
            const dt_pipe_action *a = &s->lists[r].a[i];
            if (a->op <= DT_PIPE_BW)
                continue;
            bool fwd = a->op == DT_PIPE_SEND_F || a->op == DT_PIPE_RECV_F;
            size_t k = IDX(s, a->stage, a->mb), mk = (fwd ? 0 : (size_t)S * s->m) + k;
            if (is_send(a->op)) {
                int prod = fwd ? ps->f[k] : ps->b[k] >= 0 ? ps->b[k] : ps->bi[k];
                if (sent[mk]++)
                    st = fail_at(r, a, "sent twice");
                else if (prod > i)
                    st = fail_at(r, a, "sent before the action that produces it");
            } else {
                size_t kc = IDX(s, fwd ? a->stage + 1 : a->stage - 1, a->mb);
                int cons = fwd ? ps->f[kc] : ps->b[kc] >= 0 ? ps->b[kc] : ps->bi[kc];
                if (recvd[mk]++)
                    st = fail_at(r, a, "received twice");
                else if (cons < i)
                    st = fail_at(r, a, "received after the action that consumes it");
            }
        }
    /* each needed message has its send and its receive */
    for (int stg = 0; stg < S && st >= 0; stg++)
        for (int mb = 0; mb < s->m && st >= 0; mb++)
            for (int fwd = 1; fwd >= 0 && st >= 0; fwd--) {
                int dst = fwd ? stg + 1 : stg - 1;
                if (dst < 0 || dst >= S || dt_pipe_stage_rank(p, dst) == dt_pipe_stage_rank(p, stg))
                    continue;
                size_t mk = (fwd ? 0 : (size_t)S * s->m) + IDX(s, stg, mb);
                dt_pipe_action a = {.op = fwd ? DT_PIPE_SEND_F : DT_PIPE_SEND_B, .stage = stg, .mb = mb,
                                    .peer = dt_pipe_stage_rank(p, dst)};
                if (!sent[mk])
                    st = fail_at(dt_pipe_stage_rank(p, stg), &a, "missing: the next stage needs it");
                a.op = fwd ? DT_PIPE_RECV_F : DT_PIPE_RECV_B;
                a.peer = dt_pipe_stage_rank(p, stg);
                if (st >= 0 && !recvd[mk])
                    st = fail_at(dt_pipe_stage_rank(p, dst), &a, "missing: a send without its receive");
            }
    free(sent);
    free(recvd);
    return st;
}

/* Sends of a to b and receives of b from a list the same messages in the
 * same order. */
static dt_status check_pairs(const dt__pipe_sched *s)
{
    for (int a = 0; a < s->p; a++)
        for (int b = 0; b < s->p; b++) {
            if (a == b)
                continue;
            const dt__pipe_list *la = &s->lists[a], *lb = &s->lists[b];
            int i = 0, j = 0, k = 0;
            for (;; k++) {
                while (i < la->n && !(is_send(la->a[i].op) && la->a[i].peer == b))
                    i++;
                while (j < lb->n && !(is_recv(lb->a[j].op) && lb->a[j].peer == a))
                    j++;
                if (i >= la->n && j >= lb->n)
                    break;
                char x[96], y[96];
                if (i >= la->n || j >= lb->n)
                    return dt_error(DT_ERR_INVALID_ARG, "pipeline table: message %d from rank %d to rank %d: %s", k,
                                    a, b,
                                    i >= la->n ? "a receive without a send" : "a send without a receive");
                const dt_pipe_action *sa = &la->a[i], *rb = &lb->a[j];
                bool same = (sa->op == DT_PIPE_SEND_F) == (rb->op == DT_PIPE_RECV_F) && sa->stage == rb->stage &&
                            sa->mb == rb->mb;
                if (!same)
                    return dt_error(DT_ERR_INVALID_ARG, "pipeline table: message %d from rank %d to rank %d: rank %d "
                                    "sends %s but rank %d receives %s (messages between two ranks are matched in "
                                    "posting order)", k, a, b, a, dt__pipe_action_str(sa, x, sizeof x), b,
                                    dt__pipe_action_str(rb, y, sizeof y));
                i++, j++;
            }
        }
    return DT_OK;
}

/* ---- replay -------------------------------------------------------------------------- */

/* Replay with costs cost[4 stage + op] (op F, B, BI, BW). t[r][i] gets
 * start times when non-NULL (an array per rank); sim when non-NULL. Needs
 * a table that passed check_structure. */
static dt_status replay(const dt__pipe_sched *s, const double *cost4, double **t, dt_pipe_sim *sim)
{
    const int p = s->p, S = p * s->v;
    size_t nk = (size_t)S * s->m;
    double *fdone = malloc(nk * sizeof *fdone), *bdone = malloc(nk * sizeof *bdone);
    double *msg = malloc(2 * nk * sizeof *msg);
    int *pc = calloc((size_t)p, sizeof *pc), *inflight = calloc((size_t)p, sizeof *inflight);
    double *clock = calloc((size_t)p, sizeof *clock), *busy = calloc((size_t)p, sizeof *busy);
    dt_status st = DT_OK;
    if (!fdone || !bdone || !msg || !pc || !clock || !inflight || !busy) {
        st = dt_error(DT_ERR_NO_MEMORY, "pipeline table replay");
        goto done;
    }
    for (size_t k = 0; k < nk; k++)
        fdone[k] = bdone[k] = -1;
    for (size_t k = 0; k < 2 * nk; k++)
        msg[k] = -1;
    if (sim)
        memset(sim, 0, sizeof *sim);
    for (;;) {
        bool moved = false, left = false;
        for (int r = 0; r < p; r++) {
            const dt__pipe_list *l = &s->lists[r];
            while (pc[r] < l->n) {
                const dt_pipe_action *a = &l->a[pc[r]];
                size_t k = IDX(s, a->stage, a->mb);
                double ready = clock[r];
                double cost = 0;
                if (a->op == DT_PIPE_F || a->op == DT_PIPE_B || a->op == DT_PIPE_BI) {
                    bool f = a->op == DT_PIPE_F;
                    int src = f ? a->stage - 1 : a->stage + 1;
                    if (src >= 0 && src < S) {
                        double when;
                        if (dt_pipe_stage_rank(p, src) == r)
                            when = f ? fdone[IDX(s, src, a->mb)] : bdone[IDX(s, src, a->mb)];
                        else
                            when = msg[(f ? 0 : nk) + IDX(s, src, a->mb)];
                        if (when < 0)
                            break; /* blocked */
                        if (when > ready)
                            ready = when;
                    }
                    cost = cost4[4 * (size_t)a->stage + (size_t)a->op];
                } else if (a->op == DT_PIPE_BW) {
                    cost = cost4[4 * (size_t)a->stage + DT_PIPE_BW];
                }
                if (t)
                    t[r][pc[r]] = ready;
                clock[r] = ready + cost;
                if (a->op == DT_PIPE_F) {
                    fdone[k] = clock[r];
                    if (sim && ++inflight[r] > sim->peak_inflight[r % 256])
                        sim->peak_inflight[r % 256] = inflight[r];
                } else if (a->op == DT_PIPE_B || a->op == DT_PIPE_BI) {
                    bdone[k] = clock[r];
                } else if (a->op == DT_PIPE_SEND_F || a->op == DT_PIPE_SEND_B) {
                    msg[(a->op == DT_PIPE_SEND_F ? 0 : nk) + k] = clock[r];
                }
                if (a->op == DT_PIPE_B || a->op == DT_PIPE_BW)
                    inflight[r]--;
                busy[r] += cost;
                if (sim && r < 256)
                    sim->busy[r] += cost;
                pc[r]++;
                moved = true;
            }
            if (pc[r] < l->n)
                left = true;
        }
        if (!left)
            break;
        if (!moved) {
            char buf[1024], b[96];
            size_t o = 0;
            for (int r = 0; r < p && o < sizeof buf - 1; r++)
                if (pc[r] < s->lists[r].n)
                    o += (size_t)snprintf(buf + o, sizeof buf - o, "%srank %d waits at %s", o ? "; " : "", r,
                                          dt__pipe_action_str(&s->lists[r].a[pc[r]], b, sizeof b));
            st = dt_error(DT_ERR_STATE, "pipeline table: deadlock: %s", buf);
            goto done;
        }
    }
    if (sim) {
        for (int r = 0; r < p; r++) {
            if (clock[r] > sim->makespan)
                sim->makespan = clock[r];
            if (busy[r] > sim->ideal)
                sim->ideal = busy[r];
        }
        sim->bubble = sim->ideal > 0 ? (sim->makespan - sim->ideal) / sim->ideal : 0;
    }
done:
    free(fdone);
    free(bdone);
    free(msg);
    free(pc);
    free(clock);
    free(busy);
    free(inflight);
    return st;
}

/* Costs (tf, tb, tw) for every stage of s (B = tb + tw), for replay. */
static double *uniform_costs(const dt__pipe_sched *s, double tf, double tb, double tw)
{
    size_t S = (size_t)s->p * (size_t)s->v;
    double *c = malloc(4 * S * sizeof *c);
    for (size_t i = 0; c && i < S; i++) {
        c[4 * i + DT_PIPE_F] = tf;
        c[4 * i + DT_PIPE_B] = tb + tw;
        c[4 * i + DT_PIPE_BI] = tb;
        c[4 * i + DT_PIPE_BW] = tw;
    }
    if (!c)
        dt_error(DT_ERR_NO_MEMORY, "pipeline table replay");
    return c;
}

static dt_status check_all(const dt__pipe_sched *s, double **t)
{
    const int S = s->p * s->v;
    size_t nk = (size_t)S * s->m;
    positions ps = {malloc(nk * sizeof(int)), malloc(nk * sizeof(int)), malloc(nk * sizeof(int)),
                    malloc(nk * sizeof(int))};
    dt_status st = DT_OK;
    if (!ps.f || !ps.b || !ps.bi || !ps.bw) {
        st = dt_error(DT_ERR_NO_MEMORY, "pipeline table check");
    } else {
        for (size_t k = 0; k < nk; k++)
            ps.f[k] = ps.b[k] = ps.bi[k] = ps.bw[k] = -1;
        st = check_structure(s, &ps);
        if (st >= 0)
            st = check_pairs(s);
        double *c = st >= 0 ? uniform_costs(s, 1, 1, 1) : NULL;
        if (st >= 0)
            st = c ? replay(s, c, t, NULL) : dt_last_status();
        free(c);
    }
    free(ps.f);
    free(ps.b);
    free(ps.bi);
    free(ps.bw);
    return st;
}

dt_status dt__pipe_check_and_time(dt__pipe_sched *s)
{
    double **t = calloc((size_t)s->p, sizeof *t);
    dt_status st = t ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "pipeline table");
    for (int r = 0; r < s->p && st >= 0; r++)
        if (!(t[r] = calloc((size_t)s->lists[r].n + 1, sizeof **t)))
            st = dt_error(DT_ERR_NO_MEMORY, "pipeline table");
    if (st >= 0)
        st = check_all(s, t);
    for (int r = 0; r < s->p && st >= 0; r++)
        for (int i = 0; i < s->lists[r].n; i++)
            s->lists[r].a[i].t = (int)t[r][i];
    for (int r = 0; t && r < s->p; r++)
        free(t[r]);
    free(t);
    return st;
}

dt_status dt_pipe_schedule_check(const dt_pipe_schedule *s)
{
    if (!s)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_check: schedule is NULL");
    return check_all(s, NULL);
}

dt_status dt_pipe_schedule_simulate(const dt_pipe_schedule *s, double tf, double tb, double tw, dt_pipe_sim *out)
{
    if (!s || !out)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_simulate: %s is NULL", s ? "out" : "schedule");
    if (!(tf >= 0 && tb >= 0 && tw >= 0))
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_schedule_simulate: costs must be >= 0");
    double *c = uniform_costs(s, tf, tb, tw);
    if (!c)
        return dt_last_status();
    dt_status st = replay(s, c, NULL, out);
    free(c);
    return st;
}

dt_status dt_pipe_schedule_simulate_costs(const dt_pipe_schedule *s, const double *cost, dt_pipe_sim *out)
{
    if (!s || !cost || !out)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_simulate_costs: %s is NULL",
                        !s ? "schedule" : !cost ? "cost" : "out");
    for (int i = 0; i < 4 * s->p * s->v; i++)
        if (!(cost[i] >= 0 && cost[i] < 1e300))
            return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_schedule_simulate_costs: cost[%d] (stage %d, %s) is %g; "
                            "costs must be finite and >= 0", i, i / 4, k_op_names[i % 4], cost[i]);
    return replay(s, cost, NULL, out);
}

/* ---- printing ---------------------------------------------------------------------------- */

dt_status dt_pipe_schedule_print(const dt_pipe_schedule *s, FILE *f)
{
    if (!s || !f)
        return dt_error(DT_ERR_NULL, "dt_pipe_schedule_print: %s is NULL", s ? "file" : "schedule");
    dt_pipe_sim sim;
    dt_status st = dt_pipe_schedule_simulate(s, 1, 1, 1, &sim);
    if (st < 0)
        return st;
    int T = (int)sim.makespan;
    fprintf(f, "schedule %s: p %d, m %d, v %d (%d stages); unit costs F = BI = BW = 1, B = 2; %d steps, bubble "
            "%.3f of ideal (formula %.3f)\n", dt_pipe_kind_name(s->kind), s->p, s->m, s->v, s->p * s->v, T,
            sim.bubble, dt_pipe_bubble_formula(s->kind, s->p, s->m, s->v));
    char (*cells)[16] = calloc((size_t)T + 1, sizeof *cells);
    if (!cells)
        return dt_error(DT_ERR_NO_MEMORY, "dt_pipe_schedule_print");
    for (int r = 0; r < s->p; r++) {
        for (int c = 0; c < T; c++)
            snprintf(cells[c], sizeof cells[c], ".");
        for (int i = 0; i < s->lists[r].n; i++) {
            const dt_pipe_action *a = &s->lists[r].a[i];
            if (a->op > DT_PIPE_BW)
                continue;
            static const char letter[] = {'F', 'B', 'I', 'W'};
            int len = a->op == DT_PIPE_B ? 2 : 1;
            for (int c = a->t; c < a->t + len && c < T; c++) {
                if (s->v > 1)
                    snprintf(cells[c], sizeof cells[c], "%c%d:%d", letter[a->op], a->mb, a->stage / s->p);
                else
                    snprintf(cells[c], sizeof cells[c], "%c%d", letter[a->op], a->mb);
            }
        }
        fprintf(f, "rank %-3d|", r);
        for (int c = 0; c < T; c++)
            fprintf(f, " %-*s", s->v > 1 ? 6 : 4, cells[c]);
        fprintf(f, "\n");
    }
    free(cells);
    for (int r = 0; r < s->p; r++) {
        fprintf(f, "rank %d (%d actions, busy %.0f of %d steps, at most %d micro-batches in flight):\n", r,
                s->lists[r].n, sim.busy[r % 256], T, sim.peak_inflight[r % 256]);
        for (int i = 0; i < s->lists[r].n; i++) {
            char b[96];
            fprintf(f, "  t=%-4d %s\n", s->lists[r].a[i].t, dt__pipe_action_str(&s->lists[r].a[i], b, sizeof b));
        }
    }
    return DT_OK;
}
