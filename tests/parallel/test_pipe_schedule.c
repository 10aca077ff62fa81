/* Pipeline schedules as action tables (pipeline.h): every schedule for
 * p = 1..4 and several m, v builds and passes the checker; the unit-cost
 * replay gives the bubble of the formulas (exactly for gpipe, 1f1b and
 * interleaved; ZB-H1 at most the 1F1B bubble's third plus a bound); the
 * in-flight micro-batches are GPipe's m and 1F1B's p - r; the limits name
 * themselves; and hand-broken tables are refused by the checker with the
 * violation named (a send without a receive, messages in another order,
 * a deadlock, a backward before its forward, a micro-batch twice). */
#include "test.h"

#include "dtrain/pipeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int count_op(const dt_pipe_schedule *s, int r, dt_pipe_op op)
{
    const dt_pipe_action *a;
    int n, c = 0;
    if (dt_pipe_schedule_actions(s, r, &a, &n) < 0)
        return -1;
    for (int i = 0; i < n; i++)
        c += a[i].op == op;
    return c;
}

TEST(all_schedules_build_and_check)
{
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++)
        for (int p = 1; p <= 4; p++)
            for (int m = 1; m <= 12; m++)
                for (int v = 1; v <= 3; v++) {
                    dt_pipe_kind kind = (dt_pipe_kind)k;
                    bool ok = kind == DT_PIPE_INTERLEAVED ? (v >= 2 && m % p == 0) : v == 1;
                    dt_pipe_schedule *s = NULL;
                    dt_status st = dt_pipe_schedule_build(kind, p, m, v, &s);
                    if (!ok) {
                        ASSERT(st < 0);
                        continue;
                    }
                    if (st < 0)
                        fprintf(stderr, "%s p %d m %d v %d: %s\n", dt_pipe_kind_name(kind), p, m, v, dt_last_error());
                    ASSERT_OK(st);
                    ASSERT_OK(dt_pipe_schedule_check(s));
                    /* each rank: m v forwards; B (or BI and BW) as many */
                    for (int r = 0; r < p; r++) {
                        ASSERT_EQ_INT(count_op(s, r, DT_PIPE_F), m * v);
                        if (kind == DT_PIPE_ZBH1) {
                            ASSERT_EQ_INT(count_op(s, r, DT_PIPE_BI), m);
                            ASSERT_EQ_INT(count_op(s, r, DT_PIPE_BW), m);
                        } else {
                            ASSERT_EQ_INT(count_op(s, r, DT_PIPE_B), m * v);
                        }
                        /* messages: one per micro-batch and boundary */
                        int sends = count_op(s, r, DT_PIPE_SEND_F) + count_op(s, r, DT_PIPE_SEND_B);
                        int recvs = count_op(s, r, DT_PIPE_RECV_F) + count_op(s, r, DT_PIPE_RECV_B);
                        int S = p * v, exp_s = 0;
                        for (int c = 0; c < v; c++) {
                            int st_ = c * p + r;
                            exp_s += (st_ < S - 1 && p > 1) + (st_ > 0 && p > 1);
                        }
                        ASSERT_EQ_INT(sends, exp_s * m);
                        ASSERT_EQ_INT(recvs, exp_s * m);
                    }
                    dt_pipe_sim sim;
                    ASSERT_OK(dt_pipe_schedule_simulate(s, 1, 1, 1, &sim));
                    double f = dt_pipe_bubble_formula(kind, p, m, v);
                    if (kind == DT_PIPE_GPIPE || kind == DT_PIPE_1F1B) {
                        ASSERT_NEAR(sim.bubble, f, 1e-9, 0);
                    } else if (kind == DT_PIPE_INTERLEAVED && m > p) {
                        ASSERT_NEAR(sim.bubble, f, 1e-9, 0);
                    } else if (kind == DT_PIPE_ZBH1 && m >= p) {
                        /* 1F1B's bubble is 3(p-1) units; ZB-H1 fills all but about (p-1) */
                        ASSERT_NEAR(sim.makespan - sim.ideal, (double)(p - 1), 1e-9, 0);
                    }
                    for (int r = 0; r < p; r++) {
                        if (kind == DT_PIPE_GPIPE)
                            ASSERT_EQ_INT(sim.peak_inflight[r], m);
                        if (kind == DT_PIPE_1F1B)
                            ASSERT(sim.peak_inflight[r] <= p - r);
                        if (kind == DT_PIPE_ZBH1) /* counted until BW: p on every stage */
                            ASSERT(sim.peak_inflight[r] <= p);
                    }
                    dt_pipe_schedule_free(s);
                }
}

/* The replay with a cost per stage: equal costs give the unit-cost
 * replay; a slower last stage sets 1F1B's makespan to the first stage's
 * forward, the last stage's m (F + B) and the first stage's backward, and
 * the ideal is the busiest rank's compute. */
TEST(simulate_with_stage_costs)
{
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++) {
        int v = k == DT_PIPE_INTERLEAVED ? 2 : 1;
        dt_pipe_schedule *s;
        ASSERT_OK(dt_pipe_schedule_build((dt_pipe_kind)k, 2, 4, v, &s));
        double c[4 * 4];
        for (int st = 0; st < 2 * v; st++) {
            c[4 * st + DT_PIPE_F] = 1.5, c[4 * st + DT_PIPE_B] = 2.5;
            c[4 * st + DT_PIPE_BI] = 1.25, c[4 * st + DT_PIPE_BW] = 1.25;
        }
        dt_pipe_sim a, b;
        ASSERT_OK(dt_pipe_schedule_simulate(s, 1.5, 1.25, 1.25, &a));
        ASSERT_OK(dt_pipe_schedule_simulate_costs(s, c, &b));
        ASSERT_NEAR(b.makespan, a.makespan, 1e-12, 0);
        ASSERT_NEAR(b.ideal, a.ideal, 1e-12, 0);
        ASSERT_NEAR(b.ideal, 4.0 * v * 4.0, 1e-12, 0);
        ASSERT_NEAR(b.bubble, a.bubble, 1e-12, 0);
        ASSERT_NEAR(b.busy[0], a.busy[0], 1e-12, 0);
        ASSERT_NEAR(b.busy[1], a.busy[1], 1e-12, 0);
        c[0] = -1;
        ASSERT(dt_pipe_schedule_simulate_costs(s, c, &b) == DT_ERR_INVALID_ARG);
        ASSERT_STR_CONTAINS(dt_last_error(), "cost[0] (stage 0, F)");
        c[0] = NAN;
        ASSERT(dt_pipe_schedule_simulate_costs(s, c, &b) == DT_ERR_INVALID_ARG);
        ASSERT(dt_pipe_schedule_simulate_costs(s, NULL, &b) == DT_ERR_NULL);
        dt_pipe_schedule_free(s);
    }
    /* 1F1B, p 2, m 4: stage 0 F 1 B 2, stage 1 F 1 B 3 (BI / BW unused) */
    dt_pipe_schedule *s;
    ASSERT_OK(dt_pipe_schedule_build(DT_PIPE_1F1B, 2, 4, 1, &s));
    double c[8] = {1, 2, 0, 0, 1, 3, 0, 0};
    dt_pipe_sim r;
    ASSERT_OK(dt_pipe_schedule_simulate_costs(s, c, &r));
    ASSERT_NEAR(r.makespan, 1 + 4 * (1 + 3) + 2, 1e-12, 0);
    ASSERT_NEAR(r.busy[0], 4 * 3, 1e-12, 0);
    ASSERT_NEAR(r.busy[1], 4 * 4, 1e-12, 0);
    ASSERT_NEAR(r.ideal, 16, 1e-12, 0);
    ASSERT_NEAR(r.bubble, 3.0 / 16, 1e-12, 0);
    /* ZB-H1 charges BI and BW, not B: a B cost changes nothing */
    dt_pipe_schedule_free(s);
    ASSERT_OK(dt_pipe_schedule_build(DT_PIPE_ZBH1, 2, 4, 1, &s));
    double z[8] = {1, 0, 1, 1, 1, 0, 1, 1}, z2[8] = {1, 50, 1, 1, 1, 50, 1, 1};
    dt_pipe_sim r1, r2, r3;
    ASSERT_OK(dt_pipe_schedule_simulate_costs(s, z, &r1));
    ASSERT_OK(dt_pipe_schedule_simulate_costs(s, z2, &r2));
    ASSERT_OK(dt_pipe_schedule_simulate(s, 1, 1, 1, &r3));
    ASSERT_NEAR(r1.makespan, r2.makespan, 1e-12, 0);
    ASSERT_NEAR(r1.makespan, r3.makespan, 1e-12, 0);
    dt_pipe_schedule_free(s);
}

TEST(limits_are_named)
{
    dt_pipe_schedule *s = NULL;
    ASSERT(dt_pipe_schedule_build(DT_PIPE_INTERLEAVED, 4, 6, 2, &s) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "multiple of the pipeline ranks");
    ASSERT(dt_pipe_schedule_build(DT_PIPE_INTERLEAVED, 4, 8, 1, &s) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "v >= 2");
    ASSERT(dt_pipe_schedule_build(DT_PIPE_1F1B, 4, 8, 2, &s) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "only the interleaved");
    ASSERT(dt_pipe_schedule_build(DT_PIPE_GPIPE, 0, 8, 1, &s) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "p = 0");
    ASSERT(dt_pipe_schedule_build(DT_PIPE_ZBH1, 2, 0, 1, &s) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "m = 0");
    ASSERT(s == NULL);
    dt_pipe_kind k;
    ASSERT(dt_pipe_kind_parse("zb", &k) < 0);
    ASSERT_OK(dt_pipe_kind_parse("zbh1", &k));
    ASSERT_EQ_INT(k, DT_PIPE_ZBH1);
}

/* Copy of a built table's lists, editable. */
typedef struct {
    int p, m, v;
    dt_pipe_action *a[4];
    int n[4];
} lists;

static void copy_lists(const dt_pipe_schedule *s, lists *l)
{
    dt_pipe_schedule_shape(s, &l->p, &l->m, &l->v, NULL);
    for (int r = 0; r < l->p; r++) {
        const dt_pipe_action *a;
        dt_pipe_schedule_actions(s, r, &a, &l->n[r]);
        l->a[r] = malloc((size_t)l->n[r] * sizeof *a);
        memcpy(l->a[r], a, (size_t)l->n[r] * sizeof *a);
    }
}

static void free_lists(lists *l)
{
    for (int r = 0; r < l->p; r++)
        free(l->a[r]);
}

static dt_status rebuild(lists *l)
{
    dt_pipe_schedule *s = NULL;
    dt_status st = dt_pipe_schedule_from_actions(l->p, l->m, l->v, (const dt_pipe_action *const *)l->a, l->n, &s);
    dt_pipe_schedule_free(s);
    return st;
}

static int find(const lists *l, int r, dt_pipe_op op, int stage, int mb)
{
    for (int i = 0; i < l->n[r]; i++)
        if (l->a[r][i].op == op && l->a[r][i].stage == stage && l->a[r][i].mb == mb)
            return i;
    return -1;
}

static void swap(dt_pipe_action *a, int i, int j)
{
    dt_pipe_action t = a[i];
    a[i] = a[j];
    a[j] = t;
}

TEST(checker_refuses_broken_tables)
{
    dt_pipe_schedule *s;
    ASSERT_OK(dt_pipe_schedule_build(DT_PIPE_1F1B, 2, 4, 1, &s));
    lists l;
    copy_lists(s, &l);
    ASSERT_OK(rebuild(&l)); /* the copy itself passes */

    /* a receive dropped: the send has no receive */
    int i = find(&l, 1, DT_PIPE_RECV_F, 0, 2);
    ASSERT(i >= 0);
    dt_pipe_action keep = l.a[1][i];
    memmove(&l.a[1][i], &l.a[1][i + 1], (size_t)(l.n[1] - i - 1) * sizeof keep);
    l.n[1]--;
    ASSERT(rebuild(&l) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "RECV_F(stage 0, mb 2");
    free_lists(&l);

    /* rank 1 posts the receive of mb 1 before that of mb 0: both still come
     * before their use, but messages are matched in posting order */
    copy_lists(s, &l);
    int a = find(&l, 1, DT_PIPE_RECV_F, 0, 0);
    int b = find(&l, 1, DT_PIPE_RECV_F, 0, 1);
    ASSERT(a >= 0 && b > a);
    keep = l.a[1][b];
    memmove(&l.a[1][a + 1], &l.a[1][a], (size_t)(b - a) * sizeof keep);
    l.a[1][a] = keep;
    ASSERT(rebuild(&l) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "matched in posting order");
    free_lists(&l);

    /* a backward before its forward */
    copy_lists(s, &l);
    a = find(&l, 1, DT_PIPE_F, 1, 0);
    b = find(&l, 1, DT_PIPE_B, 1, 0);
    swap(l.a[1], a, b);
    ASSERT(rebuild(&l) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "backward before its forward");
    free_lists(&l);

    /* a micro-batch twice */
    copy_lists(s, &l);
    a = find(&l, 0, DT_PIPE_F, 0, 3);
    l.a[0][a].mb = 2;
    ASSERT(rebuild(&l) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "appears twice");
    free_lists(&l);

    /* a deadlock: rank 0 waits for the gradient of mb 0 before it sends
     * the activation of mb 1... which rank 1 needs first: move rank 1's
     * B(mb 0) after its F(mb 1) and rank 0's first backward before its
     * F(mb 1); every message still matched */
    dt_pipe_schedule_free(s);
    ASSERT_OK(dt_pipe_schedule_build(DT_PIPE_GPIPE, 2, 2, 1, &s));
    copy_lists(s, &l);
    /* rank 0: F0 SEND_F0 F1 SEND_F1 RECV_B0 B0 RECV_B1 B1 -> wait for B0
     * before sending F1: F0 SEND_F0 RECV_B0 B0 F1 SEND_F1 RECV_B1 B1;
     * rank 1 (GPipe): F0 F1 first, so it needs F1 before sending B0 */
    dt_pipe_action r0[8] = {
        {DT_PIPE_F, 0, 0, -1, 0},      {DT_PIPE_SEND_F, 0, 0, 1, 0}, {DT_PIPE_RECV_B, 1, 0, 1, 0},
        {DT_PIPE_B, 0, 0, -1, 0},      {DT_PIPE_F, 0, 1, -1, 0},     {DT_PIPE_SEND_F, 0, 1, 1, 0},
        {DT_PIPE_RECV_B, 1, 1, 1, 0},  {DT_PIPE_B, 0, 1, -1, 0},
    };
    ASSERT_EQ_INT(l.n[0], 8);
    memcpy(l.a[0], r0, sizeof r0);
    ASSERT(rebuild(&l) < 0);
    ASSERT_STR_CONTAINS(dt_last_error(), "deadlock");
    free_lists(&l);
    dt_pipe_schedule_free(s);
}

TEST(print_shows_the_grid)
{
    dt_pipe_schedule *s;
    ASSERT_OK(dt_pipe_schedule_build(DT_PIPE_INTERLEAVED, 2, 4, 2, &s));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT_OK(dt_pipe_schedule_print(s, f));
    fclose(f);
    ASSERT_STR_CONTAINS(buf, "schedule interleaved: p 2, m 4, v 2");
    ASSERT_STR_CONTAINS(buf, "rank 1  |");
    ASSERT_STR_CONTAINS(buf, "SEND_F(stage 1, mb 0 -> rank 0)");
    free(buf);
    dt_pipe_schedule_free(s);
}

int main(void)
{
    RUN(all_schedules_build_and_check);
    RUN(simulate_with_stage_costs);
    RUN(limits_are_named);
    RUN(checker_refuses_broken_tables);
    RUN(print_shows_the_grid);
    return TEST_REPORT();
}
