/* dtrain trace plot FILE [-o OUT.png] [--step S] — one step of a timeline
 * (`dtrain train --trace DIR`, DIR/trace.json) as a picture: one row per
 * rank and thread (the rank's main thread, then a row per process group
 * its collectives ran on), time in ms from the step's first start across
 * the ranks. Each span is a box in its category's colour over a light grey
 * row (grey left showing = idle); a collective is split into the time it
 * waited for the last rank of its group to start (wait_peers_us, dark red)
 * and the time it moved data (orange), and the main thread's waits on
 * communication (exposed) are red; a pipeline action's wait for its message
 * is red too. Drawn by gnuplot (tools/gnuplot.c) as boxxyerror boxes. */
#include "cmd.h"

#include "dtrain/base.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ROWS 256

/* Colours and legend names, in drawing order (later ones on top). */
enum { K_DATA, K_CKPT, K_OPTIM, K_FWD, K_BWD, K_RECOMP, K_PF, K_PB, K_P2P, K_XFER, K_PEERWAIT, K_WAIT, K_N };
static const struct {
    unsigned rgb;
    const char *label;
} kinds[K_N] = {
    [K_DATA] = {0xBCBD22, "data loading"},
    [K_CKPT] = {0x8C6D31, "checkpoint"},
    [K_OPTIM] = {0x41AB5D, "optimizer"},
    [K_FWD] = {0x6BAED6, "forward"},
    [K_BWD] = {0x2171B5, "backward"},
    [K_RECOMP] = {0x9E9AC8, "recompute"},
    [K_PF] = {0x17BECF, "pipeline F"},
    [K_PB] = {0xE377C2, "pipeline B/BI/BW"},
    [K_P2P] = {0xFFD92F, "pipeline send/recv"},
    [K_XFER] = {0xFD8D3C, "collective: moving data"},
    [K_PEERWAIT] = {0x67000D, "collective: waiting for peers"},
    [K_WAIT] = {0xE31A1C, "waiting on communication"},
};

typedef struct {
    int pid, tid;
    char name[64];
} row;

typedef struct {
    row rows[MAX_ROWS];
    int nrows;
} rows_t;

static int row_of(rows_t *R, int pid, int tid)
{
    for (int i = 0; i < R->nrows; i++)
        if (R->rows[i].pid == pid && R->rows[i].tid == tid)
            return i;
    if (R->nrows == MAX_ROWS)
        return -1;
    R->rows[R->nrows] = (row){.pid = pid, .tid = tid};
    snprintf(R->rows[R->nrows].name, sizeof R->rows[R->nrows].name, "rank %d thread %d", pid, tid);
    return R->nrows++;
}

static int row_cmp(const void *a, const void *b)
{
    const row *x = a, *y = b;
    return x->pid != y->pid ? x->pid - y->pid : x->tid - y->tid;
}

static double num(const cJSON *o, const char *k, double d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : d;
}

/* num as an int / a step: d when out of range (never an out-of-range cast, undefined in C). */
static int inum(const cJSON *o, const char *k, int d)
{
    const double v = num(o, k, d);
    return v >= INT_MIN && v <= INT_MAX ? (int)v : d;
}

static int64_t snum(const cJSON *o, const char *k, int64_t d)
{
    const double v = num(o, k, (double)d);
    return v >= -0x1p62 && v <= 0x1p62 ? (int64_t)v : d;
}

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The kind of a span, -1: not drawn (the step itself: its idle shows as
 * the grey row). */
static int kind_of(const char *cat, const char *name)
{
    if (!strcmp(cat, "forward"))
        return K_FWD;
    if (!strcmp(cat, "backward"))
        return K_BWD;
    if (!strcmp(cat, "recompute"))
        return K_RECOMP;
    if (!strcmp(cat, "optimizer") || !strcmp(cat, "other"))
        return K_OPTIM;
    if (!strcmp(cat, "data"))
        return K_DATA;
    if (!strcmp(cat, "checkpoint"))
        return K_CKPT;
    if (!strcmp(cat, "wait"))
        return K_WAIT;
    if (!strcmp(cat, "comm"))
        return K_XFER;
    if (!strcmp(cat, "pipeline"))
        return !strncmp(name, "send", 4) || !strncmp(name, "recv", 4) ? K_P2P : name[0] == 'F' ? K_PF : K_PB;
    return -1;
}

/* A unit's short name: its last two path components ("transformer.h.3" ->
 * "h.3"), or the whole when shorter. */
static const char *unit_name(const char *path)
{
    const char *last = strrchr(path, '.');
    if (!last || last == path)
        return path;
    const char *p = last - 1;
    while (p > path && p[-1] != '.')
        p--;
    return p;
}

static void rmtree(const char *dir)
{
    static const char *const f[] = {"plot.gp", "gnuplot.err", "out.png", "spans.dat", "rows.dat", "labels.dat"};
    char p[4096];
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, f[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Write the boxes of step `step` to fd (x0 x1 row kind per line), the
 * pipeline actions' names to lab (x row "name") and the rows; span: the
 * step's length (µs, for the room a name needs). Returns the number of
 * boxes, -1 on a write error. */
static long write_spans(FILE *fd, FILE *lab, const cJSON *evs, int64_t step, double t0, double span, rows_t *R,
                        double *tmax)
{
    long nb = 0;
    for (int k = 0; k < K_N; k++) { /* drawing order: kinds in order, so later kinds lie on top */
        const cJSON *e;
        cJSON_ArrayForEach(e, evs)
        {
            const char *ph = str(e, "ph"), *cat = str(e, "cat"), *name = str(e, "name");
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(e, "args");
            if (!ph || strcmp(ph, "X") || !cat || !name || snum(a, "step", -1) != step)
                continue;
            int kd = kind_of(cat, name);
            double ts = num(e, "ts", 0) - t0, dur = num(e, "dur", 0);
            double w = kd == K_XFER ? num(a, "wait_peers_us", 0) : kd == K_PF || kd == K_PB ? num(a, "wait_us", 0) : 0;
            if (w < 0 || w > dur)
                w = 0;
            /* a collective's (or a pipeline action's) wait is drawn in its own colour over it */
            int draw = kd == k ? kd : (k == K_PEERWAIT && kd == K_XFER && w > 0) ? K_PEERWAIT
                                  : (k == K_WAIT && (kd == K_PF || kd == K_PB) && w > 0) ? K_WAIT : -1;
            if (draw < 0)
                continue;
            int r = row_of(R, inum(e, "pid", 0), inum(e, "tid", 0));
            if (r < 0)
                continue;
            double x0 = ts, x1 = draw == kd ? ts + dur : ts + w;
            if (x1 > *tmax)
                *tmax = x1;
            if (fprintf(fd, "%.6f %.6f %d %d\n", x0 * 1e-3, x1 * 1e-3, r, draw) < 0)
                return -1;
            nb++;
            /* a pipeline action's name on its box ("F3", "B0"), where there is room */
            const bool unit = (kd == K_FWD || kd == K_BWD || kd == K_RECOMP) && strcmp(name, cat);
            if (lab && draw == kd && (kd == K_PF || kd == K_PB || unit) && dur >= 0.025 * span) {
                char nm[16];
                snprintf(nm, sizeof nm, "%s", unit ? unit_name(name) : name);
                char *sp = strchr(nm, ' ');
                if (sp)
                    *sp = 0;
                fprintf(lab, "%.6f %d \"%s\"\n", (x0 + x1) * 0.5e-3, r, nm);
            }
        }
    }
    return nb;
}

int dt__trace_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *title = NULL;
    long long want = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: dtrain trace plot FILE [-o OUT.png] [--step S] [--title TEXT]\n"
                   "  one step of a timeline (default: the first step every rank recorded) as a picture\n");
            return 0;
        }
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--step") || !strcmp(argv[i], "--title")) {
            if (i + 1 >= argc) {
                dt__cli_err("dtrain trace plot: %s needs a value\n", argv[i]);
                return 2;
            }
            const char *o = argv[i++];
            if (!strcmp(o, "-o"))
                out = argv[i];
            else if (!strcmp(o, "--title"))
                title = argv[i];
            else {
                int64_t v;
                if (dt_parse_int("--step", argv[i], 0, INT64_MAX, &v) < 0) {
                    dt__cli_err("dtrain trace plot: %s (a step number)\n", dt_last_error());
                    return 2;
                }
                want = (long long)v;
            }
        } else if (argv[i][0] == '-' || in) {
            dt__cli_err("dtrain trace plot: unexpected argument '%s' (dtrain trace --help)\n", argv[i]);
            return 2;
        } else {
            in = argv[i];
        }
    }
    if (!in) {
        dt__cli_err("dtrain trace plot: give the trace file (DIR/trace.json of dtrain train --trace DIR)\n");
        return 2;
    }
    char defout[4096];
    const char *out_flag = out ? "-o" : "the output (the trace's name with .png; -o names another)";
    if (!out)
        out = dt__cli_png_beside(in, defout, sizeof defout);
    if (strchr(out, '"') || strchr(out, '\n') || (title && (strchr(title, '"') || strchr(title, '\n')))) {
        dt__cli_err("dtrain trace plot: output name and title may not contain '\"' or newlines\n");
        return 2;
    }
    if (dt__cli_out_file("dtrain trace plot", out_flag, out))
        return 2;
    if (dt__cli_same_file(out, in)) { /* the image would replace the trace */
        dt__cli_err("dtrain trace plot: %s %s is also the trace: give another file name\n", out_flag, out);
        return 2;
    }
    size_t n = 0;
    char *txt = NULL;
    dt_status rst = dt_file_read_all(in, (size_t)1 << 32, &txt, &n); /* a regular file, not through a symlink */
    if (rst < 0) {
        dt__cli_err("dtrain trace plot: %s\n", dt_last_error());
        return rst == DT_ERR_NO_MEMORY ? 1 : 2;
    }
    cJSON *j = cJSON_ParseWithLength(txt, n);
    free(txt);
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(j, "traceEvents");
    if (!cJSON_IsArray(evs)) {
        dt__cli_err("dtrain trace plot: %s: not a Chrome trace (no \"traceEvents\" array)\n", in);
        cJSON_Delete(j);
        return 2;
    }
    /* the step: the one asked, else the first; t0: its earliest start */
    rows_t *R = calloc(1, sizeof *R);
    if (!R) {
        cJSON_Delete(j);
        return 1;
    }
    int64_t step = want;
    double t0 = 1e300;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str(e, "ph"), *cat = str(e, "cat");
        if (ph && !strcmp(ph, "X") && cat && !strcmp(cat, "step")) {
            int64_t s = snum(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", -1);
            if (step < 0 || (want < 0 && s < step))
                step = s;
        }
    }
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str(e, "ph");
        if (ph && !strcmp(ph, "X") && snum(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", -1) == step &&
            num(e, "ts", 1e300) < t0)
            t0 = num(e, "ts", 1e300);
    }
    if (step < 0 || t0 > 1e299) {
        if (want < 0)
            dt__cli_err("dtrain trace plot: %s: no step in the trace (no event of category \"step\" with "
                        "args.step)\n", in);
        else
            dt__cli_err("dtrain trace plot: %s: no step %lld in the trace\n", in, (long long)want);
        cJSON_Delete(j);
        free(R);
        return 2;
    }
    char tmpl[] = "/tmp/dtrain-trace-plot-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        dt__cli_err("dtrain trace plot: cannot create a temporary directory: %s\n", strerror(errno));
        cJSON_Delete(j);
        free(R);
        return 1;
    }
    int rc = 0;
    char p[4200];
    double tmax = 0;
    /* rows: every rank's threads in (rank, thread) order, the names from the metadata */
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str(e, "ph");
        if (ph && !strcmp(ph, "X") && snum(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", -1) == step)
            row_of(R, inum(e, "pid", 0), inum(e, "tid", 0));
    }
    qsort(R->rows, (size_t)R->nrows, sizeof *R->rows, row_cmp);
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str(e, "ph"), *nm = str(e, "name");
        const char *tn = str(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
        if (!ph || strcmp(ph, "M") || !nm || strcmp(nm, "thread_name") || !tn)
            continue;
        int pid = inum(e, "pid", 0), tid = inum(e, "tid", 0);
        for (int i = 0; i < R->nrows; i++)
            if (R->rows[i].pid == pid && R->rows[i].tid == tid) {
                snprintf(R->rows[i].name, sizeof R->rows[i].name, "rank %d %.40s", pid, tn);
                for (char *c = R->rows[i].name; *c; c++)
                    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
                        *c = '?';
            }
    }
    double span = 0; /* the step's length over the ranks */
    cJSON_ArrayForEach(e, evs)
    {
        const char *ph = str(e, "ph");
        if (ph && !strcmp(ph, "X") && snum(cJSON_GetObjectItemCaseSensitive(e, "args"), "step", -1) == step &&
            num(e, "ts", 0) + num(e, "dur", 0) - t0 > span)
            span = num(e, "ts", 0) + num(e, "dur", 0) - t0;
    }
    snprintf(p, sizeof p, "%s/spans.dat", dir);
    FILE *fd = fopen(p, "w");
    snprintf(p, sizeof p, "%s/labels.dat", dir);
    FILE *lab = fopen(p, "w");
    long nb = fd && lab ? write_spans(fd, lab, evs, step, t0, span, R, &tmax) : -1;
    if (fd && fclose(fd) != 0)
        nb = -1;
    if (lab && fclose(lab) != 0)
        nb = -1;
    if (nb < 0) {
        dt__cli_err("dtrain trace plot: cannot write temporary files in %s\n", dir);
        rc = 1;
        goto done;
    }
    snprintf(p, sizeof p, "%s/rows.dat", dir);
    fd = fopen(p, "w");
    for (int i = 0; fd && i < R->nrows; i++)
        fprintf(fd, "%d\n", i);
    if (!fd || fclose(fd) != 0) {
        dt__cli_err("dtrain trace plot: cannot write temporary files in %s\n", dir);
        rc = 1;
        goto done;
    }
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    FILE *g = fopen(p, "w");
    if (!g) {
        rc = 1;
        goto done;
    }
    const int h = 150 + 34 * R->nrows;
    fprintf(g, "set terminal pngcairo size 1400,%d noenhanced font \",10\"\n", h < 300 ? 300 : h);
    fprintf(g, "set output \"%s/out.png\"\n", dir);
    fprintf(g, "set title \"%s\"\n", title ? title : "");
    if (!title)
        fprintf(g, "set title \"step %lld (%s)\"\n", (long long)step, "dtrain trace plot");
    fprintf(g, "set xlabel \"time (ms) from the step's first start on any rank\"\n");
    fprintf(g, "set yrange [%d.6:-0.6]\nset xrange [0:%.6f]\n", R->nrows - 1, tmax * 1e-3 * 1.01 + 1e-6);
    fprintf(g, "set ytics (");
    for (int i = 0; i < R->nrows; i++)
        fprintf(g, "%s\"%s\" %d", i ? ", " : "", R->rows[i].name, i);
    fprintf(g, ")\nset grid xtics\nset key outside below horizontal\nset style fill solid 1.0 border lc rgb \"#FFFFFF\"\n");
    fprintf(g, "set lmargin 22\n");
    /* the rows' grey bands (idle where nothing covers them), then the spans, then the legend's entries */
    const double half = tmax * 1e-3 * 0.5;
    fprintf(g, "plot \"%s/rows.dat\" using (%.6f):1:(%.6f):(0.34) with boxxyerror lc rgb \"#E8E8E8\" notitle", dir,
            half, half);
    fprintf(g, ", \"%s/spans.dat\" using (($1+$2)/2):3:(($2-$1)/2):(0.32):($4+1) with boxxyerror lc variable notitle",
            dir);
    fprintf(g, ", \"%s/labels.dat\" using 1:2:3 with labels font \",8\" tc rgb \"#202020\" notitle", dir);
    for (int k = 0; k < K_N; k++)
        fprintf(g, ", NaN with boxes lc rgb \"#%06X\" title \"%s\"", kinds[k].rgb, kinds[k].label);
    fprintf(g, ", NaN with boxes lc rgb \"#E8E8E8\" title \"idle\"\n");
    fclose(g);
    /* lc variable takes the colour index: map kinds to colours with linetypes */
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    {
        /* prepend the linetype definitions (1-based: kind k is linetype k+1) */
        size_t pn = 0;
        char *body = NULL;
        dt_file_read_all(p, (size_t)1 << 32, &body, &pn);
        FILE *g2 = body ? fopen(p, "w") : NULL;
        if (!g2) {
            free(body);
            rc = 1;
            goto done;
        }
        for (int k = 0; k < K_N; k++)
            fprintf(g2, "set linetype %d lc rgb \"#%06X\"\n", k + 1, kinds[k].rgb);
        fputs(body, g2);
        free(body);
        fclose(g2);
    }
    if ((rc = dt__gnuplot_run("dtrain trace plot", dir, out)))
        goto done;
    printf("wrote %s (step %lld, %d rows, %ld spans)\n", out, (long long)step, R->nrows, nb);
done:
    rmtree(dir);
    cJSON_Delete(j);
    free(R);
    return rc;
}
