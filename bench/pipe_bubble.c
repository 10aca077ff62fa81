/* Pipeline bubble and activation memory per schedule (pipeline.h), run
 * under the launcher, one compute thread per rank (pin each rank to a core
 * of its own with taskset on a shared machine: the bubble is a per-rank
 * time fraction):
 *
 *     dtrain run -n 2 -- build/bench/pipe_bubble [--layers L] [--dim D] [--batch B] [-m M] [--steps K]
 *                                                [--threads T] [--pin 0|1] [--cpu-offset C]
 *                                                [--timeline 0|1|2] [--front-norm 0|1]
 *
 * --pin 1 (the default) binds rank r to CPU (r + C) mod ncpu (taskset's
 * sched_setaffinity; C = --cpu-offset, default 0: swapping the CPUs tells
 * a rank's cost from its core's), so the two ranks of p = 2 never share a
 * core.
 *
 * A Sequential of L equal Linear(D, D) + ReLU blocks cut into p = world
 * equal stages (2 units per block; interleaved: 2 stages per rank), with
 * --front-norm 1 (the default) a LayerNorm(D) in front of the first block:
 * it makes the first Linear's input need a gradient, so the first stage's
 * backward runs the same GEMMs as every other stage's (without it the first
 * Linear computes no input gradient: one GEMM fewer per micro-batch, about
 * 0.7 ms of a 6 ms backward here, and the stages are not equal; the
 * LayerNorm itself costs tens of microseconds per micro-batch: each
 * rank's units are printed, and the last stage's loss is a mean); each
 * schedule (gpipe, 1f1b, interleaved when L allows and M % p == 0, zbh1)
 * trains K steps of a batch of B rows as M micro-batches (the default,
 * 8 blocks of Linear(1024, 1024), B = 128, M = 8, is a size where a stage's
 * compute per micro-batch, ~10 ms on one AVX2 core, dwarfs the 64 KiB
 * handoffs; on an AVX-512 core ~2.4 ms). Of the K steps (default 20), the
 * one with the smallest makespan is reported (minima hold best under load:
 * a rank preempted by another process in the middle of an action makes
 * the other idle): each rank's compute seconds (busy: the forward and
 * backward actions; and against the ranks' mean: every rank's idle is
 * the same makespan less its busy, so at p = 2, m = 8 a rank 1% busier
 * than the other moves the other's idle/busy by about 0.02, half of
 * ZB-H1's formula), the rest of the step's makespan (idle: the earliest
 * rank's start of the schedule to the latest one's end, less busy; "own
 * window" uses the rank's own start and end instead), idle / busy against
 * the formula's bubble ((p-1)/m for
 * gpipe and 1f1b, (p-1)/(v m) interleaved, (p-1)/(3m) zbh1) and against
 * the table's own replay with unit costs (F = BI = BW = 1, B = 2: what
 * this rank's list idles when every action costs what the formula
 * assumes), whether idle/busy is within 20% of the formula, the step's
 * wall time, the time the rank spent blocked in receive waits (the rest
 * of its idle time is the executor's own work between actions) and the
 * peak bytes of micro-batch activations in flight; the step's mean over
 * the ranks and its makespan over the busiest rank's busy, less 1 (the
 * bubble without the load imbalance); then, per rank, its
 * units (the cut: [first, end) per stage), the costs measured in that step (dt_strategy_pipe_trace: each stage's median
 * wall and CPU milliseconds per F, B, BI, BW), the table replayed with
 * those costs (dt_pipe_schedule_simulate_costs: the idle/busy the
 * schedule has when the stages cost what they cost and the handoffs are
 * free; the gap from the formula to it is the cost model, the gap from it
 * to the measured figure the waiting) and where the rank's idle time went
 * (before its start, waiting for messages, posting sends and receives,
 * giving contexts back, after its last compute); with --timeline 1 every
 * compute action of that step on both ranks on one clock (when it began,
 * how long it waited for its message, computed, and its CPU time), and
 * sends or receives that took 0.1 ms or more to post (--timeline 2: every
 * one), with the thread's CPU time of the post; then, per schedule,
 * the handoffs of that step (dt_strategy_pipe_msg_times): each message's
 * delay = the end of the receiver's wait less the later of the wait's
 * start and the sender's post (median, mean, max, total), and how many
 * waits began before the send was posted (their delay is the transfer's
 * own latency). Under load, the CPU costs are the figures to compare (a
 * preempted action's wall time is not its cost).
 * Rank 0 prints one line per schedule and rank. bench/torch_pipeline.py
 * is the peer (same model, batch and micro-batches). */
#define _GNU_SOURCE
#include "dtrain/dtrain.h"

#include <math.h>
#include <sched.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of x[0..n) (sorts x); 0 when n = 0. */
static double median(double *x, int n)
{
    if (n < 1)
        return 0;
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

enum { TR = 8 }; /* a gathered trace entry: op, stage, mb, then the DT_PIPE_TRACE_N fields */

/* Each stage's median compute per action kind (cost[4 stage + op], op F,
 * B, BI, BW) from a trace of rank r's list, wall (field DT_PIPE_TRACE_DONE
 * less RUN) or CPU seconds; 0 where the rank has no such action. */
static void stage_costs(const double *tr, int n, bool cpu, double *cost, int S)
{
    double *x = malloc((size_t)(n + 1) * sizeof *x);
    for (int st = 0; x && st < S; st++)
        for (int op = 0; op < 4; op++) {
            int k = 0;
            for (int i = 0; i < n; i++)
                if ((int)tr[TR * i] == op && (int)tr[TR * i + 1] == st)
                    x[k++] = cpu ? tr[TR * i + 3 + DT_PIPE_TRACE_CPU]
                                 : tr[TR * i + 3 + DT_PIPE_TRACE_DONE] - tr[TR * i + 3 + DT_PIPE_TRACE_RUN];
            if (k)
                cost[4 * st + op] = median(x, k);
        }
    free(x);
}

/* Rank q's busy seconds in the gathered stats (NV doubles per rank). */
static double busy_of(const double *all, int q, int nv) { return all[q * nv]; }

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return def;
}

int main(int argc, char **argv)
{
    int L = (int)arg(argc, argv, "--layers", 8), D = (int)arg(argc, argv, "--dim", 1024);
    int B = (int)arg(argc, argv, "--batch", 128), M = (int)arg(argc, argv, "-m", 8);
    int K = (int)arg(argc, argv, "--steps", 20), T = (int)arg(argc, argv, "--threads", 1);
    int timeline = (int)arg(argc, argv, "--timeline", 0);
    int front_norm = (int)arg(argc, argv, "--front-norm", 1);
    if (L < 1 || D < 1 || B < 1 || M < 1 || K < 1 || T < 1 || B % M) {
        fprintf(stderr, "pipe_bubble: need positive sizes and a batch that splits into -m micro-batches\n");
        return 2;
    }
    dt_set_num_threads(T);
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
        return 1;
    }
    int P = dt_pg_size(pg), r = dt_pg_rank(pg);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (arg(argc, argv, "--pin", 1) && ncpu > 0) {
        cpu_set_t cs;
        CPU_ZERO(&cs);
        CPU_SET((int)((r + arg(argc, argv, "--cpu-offset", 0)) % ncpu), &cs);
        if (sched_setaffinity(0, sizeof cs, &cs) < 0)
            perror("pipe_bubble: sched_setaffinity");
    }
    float *x = malloc((size_t)B * D * sizeof *x);
    if (!x)
        return 1;
    for (long i = 0; i < (long)B * D; i++)
        x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    if (r == 0)
        printf("pipe_bubble: p %d, %s%d blocks of Linear(%d, %d)+ReLU, batch %d as m %d (micro-batch %d rows), %d "
               "steps (the fastest reported), %d thread%s per rank\n",
               P, front_norm ? "LayerNorm then " : "", L, D, D, B, M, B / M, K, T, T == 1 ? "" : "s");
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++) {
        dt_pipe_kind kind = (dt_pipe_kind)k;
        int v = kind == DT_PIPE_INTERLEAVED ? 2 : 1;
        if (2 * L < P * v || (kind == DT_PIPE_INTERLEAVED && M % P))
            continue;
        dt_module *net = dt_nn_seq(0, NULL);
        if (front_norm)
            dt_nn_add(net, NULL, dt_nn_layernorm(D, 1e-5f));
        for (int i = 0; i < L; i++) {
            dt_nn_add(net, NULL, dt_nn_linear(D, D, true));
            dt_nn_add(net, NULL, dt_nn_relu());
        }
        dt_model *m;
        dt_strategy *s;
        dt_trainer *tr;
        dt_pipe_params pp = dt_pipe_params_default();
        pp.pp = P, pp.schedule = kind, pp.micro_batches = M;
        dt_trainer_params tp = dt_trainer_params_default();
        tp.loss = DT_TRAINER_LOSS_MEAN;
        if (dt_model_build(net, 1, NULL, &m) < 0 || dt_strategy_pipe_init(pg, &pp, &s) < 0 ||
            dt_trainer_init(m, s, &tp, &tr) < 0) {
            fprintf(stderr, "pipe_bubble: %s: %s\n", dt_pipe_kind_name(kind), dt_last_error());
            return 1;
        }
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){B, D}, NULL, DT_I64, 0, NULL);
        dt_pipe_stats best;
        memset(&best, 0, sizeof best);
        size_t nmt = 6 * (size_t)P * (size_t)v * (size_t)M;
        double best_span = 0, *se = calloc((size_t)P * 2, sizeof *se), *mt = calloc(nmt, sizeof *mt),
               *best_mt = calloc(nmt, sizeof *best_mt), *best_tr = NULL;
        int ntr = 0;
        if (!mt || !best_mt)
            return 1;
        for (int i = 0; i < K; i++) {
            if (dt_trainer_step(tr, &b, 1, NULL) < 0) {
                fprintf(stderr, "pipe_bubble: %s: %s\n", dt_pipe_kind_name(kind), dt_last_error());
                return 1;
            }
            dt_pipe_stats st;
            dt_strategy_pipe_stats(dt_trainer_strategy(tr), &st);
            /* the step with the smallest makespan, the same one on every rank */
            double mine[2] = {st.start_s, st.end_s}, t0 = 0, t1 = 0;
            if (!se || dt_pg_allgather(pg, mine, se, 2, DT_F64) < 0) {
                fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
                return 1;
            }
            for (int q = 0; q < P; q++) {
                t0 = q == 0 || se[2 * q] < t0 ? se[2 * q] : t0;
                t1 = q == 0 || se[2 * q + 1] > t1 ? se[2 * q + 1] : t1;
            }
            if (dt_strategy_pipe_msg_times(dt_trainer_strategy(tr), mt, nmt) < 0) {
                fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
                return 1;
            }
            if (i == 0 || t1 - t0 < best_span) {
                best = st, best_span = t1 - t0;
                memcpy(best_mt, mt, nmt * sizeof *mt);
                /* this rank's trace of that step: op, stage, mb, then its fields */
                const dt_pipe_action *acts;
                const double *tt;
                if (dt_strategy_pipe_trace(dt_trainer_strategy(tr), &acts, &tt, &ntr) < 0 ||
                    !(best_tr = best_tr ? best_tr : malloc((size_t)TR * (size_t)(ntr + 1) * sizeof *best_tr))) {
                    fprintf(stderr, "pipe_bubble: the trace: %s\n", dt_last_error());
                    return 1;
                }
                for (int a = 0; a < ntr; a++) {
                    double *o = best_tr + (size_t)TR * (size_t)a;
                    o[0] = acts[a].op, o[1] = acts[a].stage, o[2] = acts[a].mb;
                    memcpy(o + 3, tt + (size_t)DT_PIPE_TRACE_N * (size_t)a, DT_PIPE_TRACE_N * sizeof *tt);
                }
            }
        }
        free(se);
        /* every rank's trace of that step at rank 0 (padded to the longest list) */
        double nloc = ntr, nmax = 0;
        if (dt_pg_allreduce(pg, &nloc, &nmax, 1, DT_F64, DT_REDUCE_MAX) < 0) {
            fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
            return 1;
        }
        size_t ntrm = (size_t)nmax;
        double *mytr = malloc(TR * (ntrm + 1) * sizeof *mytr),
               *alltr = r == 0 ? malloc(TR * (ntrm + 1) * (size_t)P * sizeof *alltr) : NULL;
        if (!mytr || (r == 0 && !alltr))
            return 1;
        for (size_t a = 0; a < ntrm; a++)
            for (int f = 0; f < TR; f++)
                mytr[TR * a + (size_t)f] = a < (size_t)ntr ? best_tr[TR * a + (size_t)f] : -1;
        if (dt_pg_gather(pg, mytr, alltr, TR * ntrm, DT_F64, 0) < 0) {
            fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
            return 1;
        }
        free(mytr);
        free(best_tr);
        /* the handoffs of that step: each message's wait end less the later
         * of the wait's start and the sender's post (every entry is set on
         * one rank only: a sum gathers them) */
        if (dt_pg_allreduce(pg, best_mt, mt, nmt, DT_F64, DT_REDUCE_SUM) < 0) {
            fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
            return 1;
        }
        size_t nmsg = nmt / 3, nd = 0, nlate = 0;
        double *delay = calloc(nmsg + 1, sizeof *delay), dsum = 0, lsum = 0;
        for (size_t j = 0; delay && j < nmsg; j++) {
            double post = mt[j], w0 = mt[nmsg + j], w1 = mt[2 * nmsg + j];
            if (post <= 0 || w1 <= 0)
                continue;
            double d = w1 - (w0 > post ? w0 : post);
            delay[nd++] = d > 0 ? d : 0;
            dsum += d > 0 ? d : 0;
            if (w0 < post) /* the receiver waited for the send: the transfer's own latency */
                nlate++, lsum += d > 0 ? d : 0;
        }
        if (delay && nd)
            qsort(delay, nd, sizeof *delay, cmp_d);
        /* the table's own per-rank idle with unit costs */
        dt_pipe_schedule *sc = NULL;
        dt_pipe_sim sim;
        memset(&sim, 0, sizeof sim);
        /* and replayed with the costs measured in that step: each stage's
         * median wall and CPU seconds per action kind */
        int S = P * v;
        dt_pipe_sim simw, simc;
        double *cw = calloc(4 * (size_t)S, sizeof *cw), *cc = calloc(4 * (size_t)S, sizeof *cc);
        if (!cw || !cc)
            return 1;
        for (int q = 0; r == 0 && q < P; q++) {
            stage_costs(alltr + TR * ntrm * (size_t)q, (int)ntrm, false, cw, S);
            stage_costs(alltr + TR * ntrm * (size_t)q, (int)ntrm, true, cc, S);
        }
        if (dt_pipe_schedule_build(kind, P, M, v, &sc) < 0 || dt_pipe_schedule_simulate(sc, 1, 1, 1, &sim) < 0 ||
            dt_pipe_schedule_simulate_costs(sc, cw, &simw) < 0 || dt_pipe_schedule_simulate_costs(sc, cc, &simc) < 0) {
            fprintf(stderr, "pipe_bubble: %s: %s\n", dt_pipe_kind_name(kind), dt_last_error());
            return 1;
        }
        dt_pipe_schedule_free(sc);
        enum { NV = 12 };
        double v6[NV] = {best.busy_s, best.step_s, (double)best.peak_act_bytes, (double)best.peak_inflight,
                         best.start_s, best.end_s, best.wait_s, (double)best.waits,
                         best.unit_lo[0], best.unit_hi[0], best.stage_count > 1 ? best.unit_lo[1] : -1,
                         best.stage_count > 1 ? best.unit_hi[1] : -1};
        double *all = r == 0 ? calloc((size_t)P * NV, sizeof *all) : NULL;
        dt_pg_gather(pg, v6, all, NV, DT_F64, 0);
        if (r == 0) {
            /* the makespan of the step: the earliest start to the latest end
             * (one monotonic clock on one machine); each rank's idle is the
             * makespan less its compute, as in the formula */
            double f = dt_pipe_bubble_formula(kind, P, M, v), t0 = all[4], t1 = all[5], ssum = 0, bsum = 0,
                   bmean = 0;
            for (int q = 0; q < P; q++)
                bmean += all[q * NV] / P;
            for (int q = 1; q < P; q++) {
                t0 = all[q * NV + 4] < t0 ? all[q * NV + 4] : t0;
                t1 = all[q * NV + 5] > t1 ? all[q * NV + 5] : t1;
            }
            for (int q = 0; q < P; q++) {
                double busy = all[q * NV], own = all[q * NV + 1], span = t1 - t0;
                double ib = busy > 0 ? (span - busy) / busy : 0, ob = busy > 0 ? (own - busy) / busy : 0;
                double tab = sim.busy[q] > 0 ? sim.makespan / sim.busy[q] - 1 : 0;
                ssum += span - busy, bsum += busy;
                printf("%-12s rank %d: busy %.4f s (%+.1f%% of the ranks' mean), idle %.4f s, idle/busy %.3f (own "
                       "window %.3f) | formula %.3f (%s, %+.0f%%) | table %.3f | waited %.4f s in %d receives | peak "
                       "activations %.2f MiB (%d micro-batches)\n",
                       dt_pipe_kind_name(kind), q, busy, bmean > 0 ? 100 * (busy - bmean) / bmean : 0, span - busy, ib,
                       ob, f,
                       fabs(ib - f) <= 0.2 * f ? "within 20%" : "NOT within 20%", f > 0 ? 100 * (ib - f) / f : 0,
                       tab, all[q * NV + 6], (int)all[q * NV + 7], all[q * NV + 2] / (1 << 20), (int)all[q * NV + 3]);
            }
            /* the step's bubble over the busiest rank's compute (what
             * dt_pipe_schedule_simulate_costs calls the bubble when the
             * ranks' costs differ): the schedule's idle without the load
             * imbalance; the per-rank figures above are the target's */
            double bmax = 0;
            for (int q = 0; q < P; q++)
                bmax = all[q * NV] > bmax ? all[q * NV] : bmax;
            printf("%-12s step (makespan) %.4f s, mean idle/busy %.3f (formula %.3f), makespan over the busiest rank's "
                   "busy %.3f\n", dt_pipe_kind_name(kind), t1 - t0, bsum > 0 ? ssum / bsum : 0, f,
                   bmax > 0 ? (t1 - t0 - bmax) / bmax : 0);
            /* the measured costs, the table replayed with them, and where
             * each rank's idle time went */
            static const char *const opn[4] = {"F", "B", "BI", "BW"};
            for (int q = 0; q < P; q++) {
                char cs[512];
                size_t o = 0;
                for (int st = q; st < S && o < sizeof cs - 64; st += P)
                    for (int op = 0; op < 4; op++)
                        if (cw[4 * st + op] > 0)
                            o += (size_t)snprintf(cs + o, sizeof cs - o, "%s%s%d %.2f/%.2f", o ? " " : "", opn[op],
                                                  st, cw[4 * st + op] * 1e3, cc[4 * st + op] * 1e3);
                const double *tq = alltr + TR * ntrm * (size_t)q;
                /* idle inside the window: waits for messages, posting sends
                 * and receives, the bookkeeping after a compute (giving a
                 * context back), the executor between actions */
                double last = 0, waits = 0, sends = 0, recvs = 0, after = 0, gaps = 0, prev = all[q * NV + 4];
                for (size_t a = 0; a < ntrm; a++) {
                    const double *e = tq + TR * a;
                    if (e[0] < 0)
                        break;
                    double own = e[3 + DT_PIPE_TRACE_END] - e[3 + DT_PIPE_TRACE_BEGIN];
                    gaps += e[3 + DT_PIPE_TRACE_BEGIN] - prev;
                    prev = e[3 + DT_PIPE_TRACE_END];
                    if (e[0] == DT_PIPE_SEND_F || e[0] == DT_PIPE_SEND_B) {
                        sends += own;
                    } else if (e[0] == DT_PIPE_RECV_F || e[0] == DT_PIPE_RECV_B) {
                        recvs += own;
                    } else {
                        waits += e[3 + DT_PIPE_TRACE_RUN] - e[3 + DT_PIPE_TRACE_BEGIN];
                        after += e[3 + DT_PIPE_TRACE_END] - e[3 + DT_PIPE_TRACE_DONE];
                        last = e[3 + DT_PIPE_TRACE_DONE];
                    }
                }
                gaps += all[q * NV + 5] - prev;
                double rw = simw.busy[q] > 0 ? simw.makespan / simw.busy[q] - 1 : 0;
                double rc = simc.busy[q] > 0 ? simc.makespan / simc.busy[q] - 1 : 0;
                double ib = busy_of(all, q, NV) > 0 ? (t1 - t0 - busy_of(all, q, NV)) / busy_of(all, q, NV) : 0;
                char un[64];
                snprintf(un, sizeof un, "[%d, %d)", (int)all[q * NV + 8], (int)all[q * NV + 9]);
                if (all[q * NV + 10] >= 0)
                    snprintf(un + strlen(un), sizeof un - strlen(un), " [%d, %d)", (int)all[q * NV + 10],
                             (int)all[q * NV + 11]);
                printf("%-12s rank %d: units %s | costs (ms per action, median wall/CPU) %s | table with these costs: idle/busy "
                       "%.3f (CPU costs %.3f; measured %+.0f%% of it) | idle (ms): %.2f before its start, %.2f waiting for messages, %.2f "
                       "posting sends, %.2f posting receives, %.2f after computes (contexts back), %.2f in the "
                       "executor between actions, %.2f after its last compute\n",
                       dt_pipe_kind_name(kind), q, un, cs, rw, rc, rw > 0 ? 100 * (ib - rw) / rw : 0, (all[q * NV + 4] - t0) * 1e3, waits * 1e3, sends * 1e3,
                       recvs * 1e3, after * 1e3, gaps * 1e3, (t1 - last) * 1e3);
            }
            if (timeline) {
                printf("%-12s timeline (ms from the step's start; compute actions: waited, computed (CPU), then "
                       "bookkeeping):\n", dt_pipe_kind_name(kind));
                for (int q = 0; q < P; q++) {
                    const double *tq = alltr + TR * ntrm * (size_t)q;
                    for (size_t a = 0; a < ntrm; a++) {
                        const double *e = tq + TR * a;
                        if (e[0] < 0)
                            break;
                        if (e[0] > DT_PIPE_BW) { /* a send or receive: shown when it took 0.1 ms or more
                                                  * (every one with --timeline 2) */
                            static const char *const mn[4] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B"};
                            double own = e[3 + DT_PIPE_TRACE_END] - e[3 + DT_PIPE_TRACE_BEGIN];
                            if ((timeline > 1 || own >= 1e-4) && e[0] <= DT_PIPE_RECV_B)
                                printf("  rank %d %-6s stage %d mb %d  %8.3f .. %8.3f  posting took %.3f (CPU %.3f)\n", q,
                                       mn[(int)e[0] - DT_PIPE_SEND_F], (int)e[1], (int)e[2],
                                       (e[3 + DT_PIPE_TRACE_BEGIN] - t0) * 1e3, (e[3 + DT_PIPE_TRACE_END] - t0) * 1e3,
                                       own * 1e3, e[3 + DT_PIPE_TRACE_CPU] * 1e3);
                            continue;
                        }
                        printf("  rank %d %-2s stage %d mb %d  %8.3f .. %8.3f  waited %6.3f  computed %6.3f (CPU %6.3f)"
                               "  then %5.3f\n", q, opn[(int)e[0]], (int)e[1], (int)e[2],
                               (e[3 + DT_PIPE_TRACE_BEGIN] - t0) * 1e3, (e[3 + DT_PIPE_TRACE_END] - t0) * 1e3,
                               (e[3 + DT_PIPE_TRACE_RUN] - e[3 + DT_PIPE_TRACE_BEGIN]) * 1e3,
                               (e[3 + DT_PIPE_TRACE_DONE] - e[3 + DT_PIPE_TRACE_RUN]) * 1e3,
                               e[3 + DT_PIPE_TRACE_CPU] * 1e3,
                               (e[3 + DT_PIPE_TRACE_END] - e[3 + DT_PIPE_TRACE_DONE]) * 1e3);
                    }
                }
            }
            if (nd)
                printf("%-12s handoffs: %zu messages, delay (wait end less the later of its start and the send's "
                       "post) median %.1f us, mean %.1f us, max %.1f us, total %.2f ms; %zu waits began before "
                       "the send (mean %.1f us after it)\n", dt_pipe_kind_name(kind), nd, delay[nd / 2] * 1e6,
                       dsum / (double)nd * 1e6, delay[nd - 1] * 1e6, dsum * 1e3, nlate,
                       nlate ? lsum / (double)nlate * 1e6 : 0);
            free(all);
        }
        free(delay);
        free(alltr);
        free(cw);
        free(cc);
        free(mt);
        free(best_mt);
        dt_trainer_free(tr);
        dt_model_free(m);
    }
    free(x);
    dt_pg_free(pg);
    return 0;
}
