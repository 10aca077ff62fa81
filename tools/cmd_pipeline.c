/* dtrain pipeline show — print a pipeline schedule's action table
 * (pipeline.h): the time grid, each rank's list with its sends and
 * receives, the replay's bubble against the formula and the in-flight
 * micro-batches. Parsing and printing only. */
#include "cmd.h"
#include "dtrain/pipeline.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain pipeline show [--schedule {gpipe|1f1b|interleaved|zbh1}] [-p P] [-m M] [-v V]\n"
               "  prints the checked action table of a pipeline schedule for P ranks (default 4), M\n"
               "  micro-batches (default 8) and V stages per rank (interleaved only; default 2 there):\n"
               "  a time grid with unit costs (F = BI = BW = 1, B = 2; F3 forward of micro-batch 3,\n"
               "  B3 its backward, I3/W3 its input/weight-gradient halves, :c the chunk), then each\n"
               "  rank's actions with their sends and receives, and the bubble against the formula\n"
               "  e.g.  dtrain pipeline show --schedule zbh1 -p 4 -m 8\n");
}

int dt_cmd_pipeline(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "show")) {
        dt__cli_err("dtrain pipeline: unknown subcommand '%s' (show)\n", argv[1]);
        return 2;
    }
    dt_pipe_kind kind = DT_PIPE_1F1B;
    int64_t p = 4, m = 8, v = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            dt__cli_err("dtrain pipeline show: %s needs a value\n", a);
            return 2;
        }
        const char *val = argv[++i];
        dt_status st;
        if (!strcmp(a, "--schedule"))
            st = dt_pipe_kind_parse(val, &kind);
        else if (!strcmp(a, "-p"))
            st = dt_parse_int("-p", val, 1, 256, &p);
        else if (!strcmp(a, "-m"))
            st = dt_parse_int("-m", val, 1, 4096, &m);
        else if (!strcmp(a, "-v"))
            st = dt_parse_int("-v", val, 1, 64, &v);
        else {
            dt__cli_err("dtrain pipeline show: unknown option '%s' (dtrain pipeline show --help)\n", a);
            return 2;
        }
        if (st < 0) {
            dt__cli_err("dtrain pipeline show: %s\n", dt_last_error());
            return 2;
        }
    }
    if (v == 0)
        v = kind == DT_PIPE_INTERLEAVED ? 2 : 1;
    dt_pipe_schedule *s;
    if (dt_pipe_schedule_build(kind, (int)p, (int)m, (int)v, &s) < 0) {
        dt__cli_err("dtrain pipeline show: %s\n", dt_last_error());
        return 2;
    }
    dt_status st = dt_pipe_schedule_print(s, stdout);
    dt_pipe_schedule_free(s);
    if (st < 0) {
        dt__cli_err("dtrain pipeline show: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}
