/* dtrain trace {summary,plot} FILE — read a timeline written by
 * `dtrain train --trace DIR` (DIR/trace.json, Chrome trace JSON).
 *
 * summary: the library's figures (dt_trace_summarize, trace.h) as tables:
 * per step and rank compute / exposed communication / idle (and the
 * pipeline bubble beside its formula), the collectives whose slowest rank
 * made the others wait longest, and the ops that took the most time.
 * plot: tools/trace_plot.c. */
#include "cmd.h"

#include "dtrain/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain trace summary FILE [--top N]\n"
               "       dtrain trace plot FILE [-o OUT.png] [--step S] [--title TEXT]\n"
               "  FILE: a timeline written by `dtrain train --trace DIR` (DIR/trace.json)\n"
               "  summary: per step and rank compute, exposed communication (waited for) and idle\n"
               "    time, the pipeline bubble against the schedule's formula, the slowest rank of\n"
               "    each collective (who made the others wait), the top N ops by time (default 15)\n"
               "  plot: one row per rank and thread, compute / communication (waiting, moving\n"
               "    data) / pipeline actions / idle in their own colours, time in ms (gnuplot)\n");
}

static int summary(int argc, char **argv)
{
    const char *file = NULL;
    long top = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--top")) {
            int64_t v;
            if (i + 1 >= argc) {
                dt__cli_err("dtrain trace summary: --top needs a value\n");
                return 2;
            }
            if (dt_parse_int("--top", argv[++i], 1, 100000, &v) < 0) {
                dt__cli_err("dtrain trace summary: %s (a count of rows)\n", dt_last_error());
                return 2;
            }
            top = (long)v;
        } else if (argv[i][0] == '-' || file) {
            dt__cli_err("dtrain trace summary: unexpected argument '%s' (dtrain trace --help)\n", argv[i]);
            return 2;
        } else {
            file = argv[i];
        }
    }
    if (!file) {
        dt__cli_err("dtrain trace summary: give the trace file (DIR/trace.json of dtrain train --trace DIR)\n");
        return 2;
    }
    dt_trace_summary *s;
    dt_status st = dt_trace_summarize(file, &s);
    if (st < 0) {
        dt__cli_err("dtrain trace summary: %s\n", dt_last_error());
        return st == DT_ERR_NO_MEMORY ? 1 : 2;
    }
    if (!s->nsteps && !s->nops && !s->ncolls) { /* as trace plot: nothing to show is not a result */
        dt__cli_err("dtrain trace summary: %s: no events to summarize (no step span, op or collective; a run traced "
                    "with dtrain train --trace writes them from its first step)\n", file);
        dt_trace_summary_free(s);
        return 2;
    }
    printf("trace %s: %d rank%s, %zu step spans\n", file, s->world, s->world == 1 ? "" : "s", s->nsteps);
    printf("\nper step and rank (ms; exposed comm: time the rank waited for communication):\n");
    printf("%6s %5s %10s %10s %12s %10s %8s  %s\n", "step", "rank", "step", "compute", "exposed comm", "idle",
           "data", "pipeline bubble (formula (p-1)/(v m))");
    for (size_t i = 0; i < s->nsteps; i++) {
        const dt_trace_step_row *r = &s->steps[i];
        printf("%6lld %5d %10.3f %10.3f %12.3f %10.3f %8.3f", (long long)r->step, r->rank, r->step_ms,
               r->compute_ms, r->comm_ms, r->idle_ms, r->data_ms);
        if (r->bubble >= 0)
            printf("  %.3f (%.3f: p %d, v %d, m %d)", r->bubble, r->bubble_formula, r->stages, r->chunks, r->micro);
        printf("\n");
    }
    if (s->ncolls) {
        printf("\nslowest rank per collective (the last to start it; the others waited), longest waits first:\n");
        for (size_t i = 0; i < s->ncolls && i < (size_t)top; i++) {
            const dt_trace_coll_row *c = &s->colls[i];
            printf("  step %lld %s #%llu group %s, %llu B on %d ranks: rank %d last, others waited up to %.3f ms "
                   "(longest %.3f ms)\n",
                   (long long)c->step, c->kind, (unsigned long long)c->seq, c->group, (unsigned long long)c->bytes,
                   c->ranks, c->last_rank, c->max_wait_ms, c->max_ms);
        }
        printf("  waits caused, per rank (ms):");
        for (int r = 0; r < s->world && r < DT_TRACE_MAX_RANKS; r++)
            printf(" %d: %.3f%s", r, s->made_wait_ms[r], r + 1 < s->world ? "," : "");
        printf("\n");
    }
    printf("\ntop ops by time (all ranks and steps):\n%-10s %-28s %7s %11s %10s\n", "category", "name", "count",
           "total ms", "max ms");
    for (size_t i = 0; i < s->nops && i < (size_t)top; i++)
        printf("%-10s %-28s %7d %11.3f %10.3f\n", s->ops[i].cat, s->ops[i].name, s->ops[i].count,
               s->ops[i].total_ms, s->ops[i].max_ms);
    dt_trace_summary_free(s);
    return 0;
}

int dt_cmd_trace(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "summary"))
        return summary(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plot"))
        return dt__trace_plot(argc - 1, argv + 1);
    dt__cli_err("dtrain trace: unknown subcommand '%s' (summary, plot)\n", argv[1]);
    usage(stderr);
    return 2;
}
