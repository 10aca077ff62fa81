/* dtrain plot FILE.jsonl [-o OUT.png] — loss and accuracy curves of a
 * metrics file written by `dtrain train --metrics`, drawn with gnuplot.
 *
 * The file is read and validated first (dt__metrics_parse, metrics_read.c:
 * every line a JSON object with an "event"; step records need "step" and
 * "loss"; eval records need "test_loss", and "test_accuracy" if present is a
 * number or null; a null loss (a non-finite one, as dtrain train writes it)
 * is a point left out), so a malformed file gets one line naming the file, the
 * line and the problem (exit 2) instead of a gnuplot error. The data go to
 * a private temporary directory as whitespace-separated columns; gnuplot
 * ($DT_GNUPLOT, else `gnuplot` on PATH) renders a PNG there: training and
 * test loss against the step on top, test accuracy below. The PNG then
 * reaches OUT through dt_file (no symlink followed; complete or absent).
 * Also reads a FILE.partial of a run that did not finish. */
#include "cmd.h"
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char *find_gnuplot(void)
{
    const char *env = getenv("DT_GNUPLOT");
    if (env && *env)
        return access(env, X_OK) == 0 ? strdup(env) : NULL;
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    char *copy = strdup(path), *save = NULL;
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        size_t n = strlen(d) + 16;
        char *p = malloc(n);
        snprintf(p, n, "%s/gnuplot", d);
        if (access(p, X_OK) == 0) {
            free(copy);
            return p;
        }
        free(p);
    }
    free(copy);
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain plot FILE.jsonl [-o OUT.png] [--title TEXT]\n"
               "  draws training/test loss and test accuracy from a `dtrain train --metrics` "
               "file\n");
}

/* Points below which the training curve is drawn with markers. */
#define DT_PLOT_MARK_BELOW 50

/* Copy the image gnuplot wrote in dir to out through dt_file. */
static int publish(const char *dir, const char *out)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/out.png", dir);
    FILE *f = fopen(p, "rb");
    if (!f)
        return dt_error(DT_ERR_IO, "gnuplot wrote no image");
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        fclose(f);
        dt_status st = dt_file_write_atomic(out, buf, (size_t)n, 0644);
        free(buf);
        return st < 0 ? -1 : 0;
    }
    fclose(f);
    free(buf);
    return dt_error(DT_ERR_IO, "cannot read the image gnuplot wrote");
}

static void rmtree(const char *dir, const char *const *files, int n)
{
    char p[4096];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

int dt_cmd_plot(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *title = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output") || !strcmp(argv[i], "--title")) {
            if (i + 1 >= argc) {
                dt__cli_err("dtrain plot: %s needs a value\n", argv[i]);
                return 2;
            }
            if (!strcmp(argv[i], "--title"))
                title = argv[++i];
            else
                out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            dt__cli_err("dtrain plot: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!in) {
            in = argv[i];
        } else {
            dt__cli_err("dtrain plot: unexpected argument '%s' (one metrics file)\n", argv[i]);
            return 2;
        }
    }
    if (!in) {
        usage(stderr);
        return 2;
    }
    char defout[4096];
    if (!out) {
        snprintf(defout, sizeof defout, "%s", in);
        char *dot = strrchr(defout, '.');
        if (dot && !strchr(dot, '/'))
            *dot = 0;
        strncat(defout, ".png", sizeof defout - strlen(defout) - 1);
        out = defout;
    }
    if (strchr(out, '"') || strchr(out, '\n') || (title && (strchr(title, '"') || strchr(title, '\n')))) {
        dt__cli_err("dtrain plot: output name and title may not contain '\"' or newlines\n");
        return 2;
    }
    /* the whole file: metrics files are small (a record per log step) */
    FILE *f = fopen(in, "r");
    if (!f) {
        dt__cli_err("dtrain plot: cannot open %s: %s\n", in, strerror(errno));
        return 2;
    }
    char *text = NULL;
    size_t tlen = 0, tcap = 0;
    for (;;) {
        if (tlen == tcap) {
            size_t c = tcap ? 2 * tcap : 65536;
            char *q = realloc(text, c);
            if (!q) {
                dt__cli_err("dtrain plot: %s: out of memory\n", in);
                free(text);
                fclose(f);
                return 1;
            }
            text = q, tcap = c;
        }
        size_t k = fread(text + tlen, 1, tcap - tlen, f);
        tlen += k;
        if (k == 0)
            break;
    }
    int rerr = ferror(f);
    fclose(f);
    if (rerr) {
        dt__cli_err("dtrain plot: cannot read %s\n", in);
        free(text);
        return 2;
    }
    dt__metrics_points pts;
    char err[256];
    int prc = dt__metrics_parse(text, tlen, &pts, err, sizeof err);
    free(text);
    if (prc < 0) {
        dt__cli_err("dtrain plot: %s:%s\n", in, err);
        return 2;
    }
    if (pts.nstep == 0 && pts.neval == 0) {
        dt__cli_err("dtrain plot: %s: no step or eval records to plot\n", in);
        dt__metrics_points_free(&pts);
        return 2;
    }
    char tmpl[] = "/tmp/dtrain-plot-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        dt__cli_err("dtrain plot: cannot create a temporary directory: %s\n", strerror(errno));
        dt__metrics_points_free(&pts);
        return 1;
    }
    static const char *const files[] = {"steps.dat", "evals.dat", "plot.gp", "gnuplot.err", "out.png"};
    char p[4096];
    int rc = 0;
    long nstep = (long)pts.nstep, neval = (long)pts.neval, nacc = (long)pts.nacc;
    snprintf(p, sizeof p, "%s/steps.dat", dir);
    FILE *fs = fopen(p, "w");
    snprintf(p, sizeof p, "%s/evals.dat", dir);
    FILE *fe = fopen(p, "w");
    if (!fs || !fe) {
        dt__cli_err("dtrain plot: cannot write temporary files in %s\n", dir);
        rc = 1;
        goto done;
    }
    for (size_t i = 0; i < pts.nstep; i++)
        fprintf(fs, "%.17g %.9g\n", pts.step_x[i], pts.step_loss[i]);
    for (size_t i = 0; i < pts.neval; i++) {
        if (isnan(pts.eval_acc[i]))
            fprintf(fe, "%.17g %.9g NaN\n", pts.eval_x[i], pts.eval_loss[i]);
        else
            fprintf(fe, "%.17g %.9g %.9g\n", pts.eval_x[i], pts.eval_loss[i], 100.0 * pts.eval_acc[i]);
    }
    fclose(fs);
    fclose(fe);
    fs = fe = NULL;
    char *gp = find_gnuplot();
    if (!gp) {
        dt__cli_err("dtrain plot: gnuplot not found (install Debian's gnuplot-nox, or set "
                        "DT_GNUPLOT)\n");
        rc = 1;
        goto done;
    }
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    FILE *g = fopen(p, "w");
    if (!g) {
        free(gp);
        rc = 1;
        goto done;
    }
    /* A short run has a handful of step records: a line alone would show one
     * point as nothing, so mark the points while there are few. */
    const char *train_style = nstep < DT_PLOT_MARK_BELOW ? "linespoints pt 7 ps 0.6" : "lines";
    fprintf(g, "set terminal pngcairo size 900,%d noenhanced\n", nacc ? 800 : 450);
    /* gnuplot writes into the private directory; the image is then moved to
     * OUT by dt_file (no symlink followed, complete or absent) */
    fprintf(g, "set output \"%s/out.png\"\nset grid\nset key top right\n", dir);
    if (nacc)
        fprintf(g, "set multiplot layout 2,1 title \"%s\"\n", title ? title : in);
    else
        fprintf(g, "set title \"%s\"\n", title ? title : in);
    fprintf(g, "set xlabel \"step\"\nset ylabel \"loss\"\n");
    if (nstep && neval)
        fprintf(g, "plot \"%s/steps.dat\" using 1:2 with %s title \"train loss\", "
                   "\"%s/evals.dat\" using 1:2 with linespoints title \"test loss\"\n", dir,
                train_style, dir);
    else if (nstep)
        fprintf(g, "plot \"%s/steps.dat\" using 1:2 with %s title \"train loss\"\n", dir, train_style);
    else
        fprintf(g, "plot \"%s/evals.dat\" using 1:2 with linespoints title \"test loss\"\n", dir);
    if (nacc) {
        fprintf(g, "set ylabel \"test accuracy (%%)\"\n");
        fprintf(g, "plot \"%s/evals.dat\" using 1:3 with linespoints title \"test accuracy\"\n", dir);
        fprintf(g, "unset multiplot\n");
    }
    fclose(g);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' '%s/plot.gp' 2> '%s/gnuplot.err'", gp, dir, dir);
    free(gp);
    int ws = system(cmd);
    if (ws != 0) {
        snprintf(p, sizeof p, "%s/gnuplot.err", dir);
        FILE *ef = fopen(p, "r");
        char msg[512] = "";
        if (ef) {
            size_t k = fread(msg, 1, sizeof msg - 1, ef);
            msg[k] = 0;
            fclose(ef);
        }
        char *nl = strchr(msg, '\n');
        while (nl && nl[1]) { /* keep the message on one line */
            *nl = ' ';
            nl = strchr(nl, '\n');
        }
        if (nl)
            *nl = 0;
        dt__cli_err("dtrain plot: gnuplot failed writing %s: %s\n", out, msg[0] ? msg : "(no message)");
        rc = 1;
        goto done;
    }
    if (publish(dir, out) < 0) {
        dt__cli_err("dtrain plot: %s\n", dt_last_error());
        rc = 1;
        goto done;
    }
    printf("wrote %s (%ld step records, %ld evaluations)\n", out, nstep, neval);
done:
    if (fs)
        fclose(fs);
    if (fe)
        fclose(fe);
    dt__metrics_points_free(&pts);
    rmtree(dir, files, 5);
    return rc;
}
