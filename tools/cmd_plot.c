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
 * Also reads a FILE.partial of a run that did not finish. Several files
 * (runs to compare) go into the same panels, a colour and legend entry per
 * file, the panels' x axes aligned (one range, fixed margins). */
#include "cmd.h"
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain plot FILE.jsonl [FILE2.jsonl ...] [-o OUT.png] [--title TEXT]\n"
               "  draws training/test loss and test accuracy from `dtrain train --metrics` files:\n"
               "  several files are compared in the same panels (one colour and legend entry per\n"
               "  file; the panels share the x axis); OUT defaults to the first file's name .png\n");
}

/* Points below which the training curve is drawn with markers. */
#define DT_PLOT_MARK_BELOW 50

#define DT_PLOT_MAX_FILES 16

/* Remove the temporary directory: the script, gnuplot's messages and image,
 * and the data files of nfiles inputs. */
static void rmtree(const char *dir, int nfiles)
{
    static const char *const fixed[] = {"plot.gp", "gnuplot.err", "out.png"};
    char p[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, fixed[i]);
        unlink(p);
    }
    for (int k = 0; k < nfiles; k++) {
        snprintf(p, sizeof p, "%s/steps%d.dat", dir, k);
        unlink(p);
        snprintf(p, sizeof p, "%s/evals%d.dat", dir, k);
        unlink(p);
    }
    rmdir(dir);
}

/* Read and validate one metrics file into *pts (0), or print one line and
 * return the exit code. */
static int read_metrics(const char *in, dt__metrics_points *pts)
{
    /* the whole file: metrics files are small (a record per log step); a regular file, not through a symlink
       (a FIFO would block the read, a device read as empty) */
    char *text = NULL;
    size_t tlen = 0;
    dt_status st = dt_file_read_all(in, (size_t)1 << 32, &text, &tlen);
    if (st < 0) {
        dt__cli_err("dtrain plot: %s\n", dt_last_error());
        return st == DT_ERR_NO_MEMORY ? 1 : 2;
    }
    char err[256];
    int prc = dt__metrics_parse(text, tlen, pts, err, sizeof err);
    free(text);
    if (prc < 0) {
        dt__cli_err("dtrain plot: %s:%s\n", in, err);
        return 2;
    }
    if (pts->nstep == 0 && pts->neval == 0) {
        dt__cli_err("dtrain plot: %s: no step or eval records to plot\n", in);
        dt__metrics_points_free(pts);
        return 2;
    }
    return 0;
}

/* The legend's name of a file: its name without the folders, a '"',
 * backslash or control character replaced by '?' (gnuplot's string). */
static const char *label_of(const char *in, char *buf, size_t n)
{
    const char *b = strrchr(in, '/');
    snprintf(buf, n, "%s", b && b[1] ? b + 1 : in);
    for (char *c = buf; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    return buf;
}

int dt_cmd_plot(int argc, char **argv)
{
    const char *ins[DT_PLOT_MAX_FILES], *out = NULL, *title = NULL;
    int nin = 0;
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
        } else if (nin < DT_PLOT_MAX_FILES) {
            ins[nin++] = argv[i];
        } else {
            dt__cli_err("dtrain plot: more than %d metrics files\n", DT_PLOT_MAX_FILES);
            return 2;
        }
    }
    if (!nin) {
        usage(stderr);
        return 2;
    }
    const char *in = ins[0];
    char defout[4096];
    const char *out_flag = out ? "-o" : "the output (the input's name with .png; -o names another)";
    if (!out)
        out = dt__cli_png_beside(in, defout, sizeof defout);
    if (strchr(out, '"') || strchr(out, '\n') || (title && (strchr(title, '"') || strchr(title, '\n')))) {
        dt__cli_err("dtrain plot: output name and title may not contain '\"' or newlines\n");
        return 2;
    }
    if (dt__cli_out_file("dtrain plot", out_flag, out))
        return 2;
    for (int k = 0; k < nin; k++)
        if (dt__cli_same_file(out, ins[k])) { /* the image would replace the run's metrics */
            dt__cli_err("dtrain plot: %s %s is also an input: give another file name\n", out_flag, out);
            return 2;
        }
    dt__metrics_points pts[DT_PLOT_MAX_FILES];
    for (int k = 0; k < nin; k++) {
        int rc = read_metrics(ins[k], &pts[k]);
        if (rc) {
            for (int j = 0; j < k; j++)
                dt__metrics_points_free(&pts[j]);
            return rc;
        }
    }
    char tmpl[] = "/tmp/dtrain-plot-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        dt__cli_err("dtrain plot: cannot create a temporary directory: %s\n", strerror(errno));
        for (int k = 0; k < nin; k++)
            dt__metrics_points_free(&pts[k]);
        return 1;
    }
    char p[4096];
    int rc = 0;
    long nstep = 0, neval = 0, nacc = 0;
    double xlo = INFINITY, xhi = -INFINITY; /* every panel spans the steps of every file */
    for (int k = 0; k < nin && !rc; k++) {
        snprintf(p, sizeof p, "%s/steps%d.dat", dir, k);
        FILE *fs = fopen(p, "w");
        snprintf(p, sizeof p, "%s/evals%d.dat", dir, k);
        FILE *fe = fopen(p, "w");
        if (!fs || !fe) {
            dt__cli_err("dtrain plot: cannot write temporary files in %s\n", dir);
            rc = 1;
        }
        for (size_t i = 0; fs && i < pts[k].nstep; i++) {
            fprintf(fs, "%.17g %.9g\n", pts[k].step_x[i], pts[k].step_loss[i]);
            xlo = fmin(xlo, pts[k].step_x[i]), xhi = fmax(xhi, pts[k].step_x[i]);
        }
        for (size_t i = 0; fe && i < pts[k].neval; i++) {
            if (isnan(pts[k].eval_acc[i]))
                fprintf(fe, "%.17g %.9g NaN\n", pts[k].eval_x[i], pts[k].eval_loss[i]);
            else
                fprintf(fe, "%.17g %.9g %.9g\n", pts[k].eval_x[i], pts[k].eval_loss[i], 100.0 * pts[k].eval_acc[i]);
            xlo = fmin(xlo, pts[k].eval_x[i]), xhi = fmax(xhi, pts[k].eval_x[i]);
        }
        if (fs)
            fclose(fs);
        if (fe)
            fclose(fe);
        nstep += (long)pts[k].nstep, neval += (long)pts[k].neval, nacc += (long)pts[k].nacc;
    }
    if (rc)
        goto done;
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    FILE *g = fopen(p, "w");
    if (!g) {
        rc = 1;
        goto done;
    }
    fprintf(g, "set terminal pngcairo size 900,%d noenhanced\n", nacc ? 800 : 450);
    /* gnuplot writes into the private directory; the image is then moved to
     * OUT by dt_file (no symlink followed, complete or absent) */
    fprintf(g, "set output \"%s/out.png\"\nset grid\nset key top right\n", dir);
    /* the panels share their x axis: the same range and the same margins
     * (the plot areas line up whatever the width of the y labels) */
    if (xhi > xlo)
        fprintf(g, "set xrange [%.17g:%.17g]\n", xlo, xhi);
    fprintf(g, "set lmargin at screen 0.10\nset rmargin at screen 0.97\n");
    char heading[4200];
    if (title || nin == 1)
        snprintf(heading, sizeof heading, "%s", title ? title : in);
    else
        snprintf(heading, sizeof heading, "%d runs", nin);
    /* the file's name goes into a gnuplot string: a '"' there would end it
     * (and what followed would run as gnuplot commands, system() included) */
    for (char *c = heading; !title && *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    if (nacc)
        fprintf(g, "set multiplot layout 2,1 title \"%s\"\n", heading);
    else
        fprintf(g, "set title \"%s\"\n", heading);
    fprintf(g, "set xlabel \"step\"\nset ylabel \"loss\"\nplot ");
    /* one colour per file, its training loss solid and its test loss dashed;
     * several files: each entry names its file */
    const char *sep = "";
    for (int k = 0; k < nin; k++) {
        char name[4200] = "", lb[4096];
        if (nin > 1)
            snprintf(name, sizeof name, "%s: ", label_of(ins[k], lb, sizeof lb));
        /* A short run has a handful of step records: a line alone would show
         * one point as nothing, so mark the points while there are few. */
        const char *train_style =
            pts[k].nstep < DT_PLOT_MARK_BELOW ? "linespoints pt 7 ps 0.6" : "lines";
        char lc[32] = "", dt[8] = "";
        if (nin > 1)
            snprintf(lc, sizeof lc, " lc %d", k + 1), snprintf(dt, sizeof dt, " dt 2");
        if (pts[k].nstep) {
            fprintf(g, "%s\"%s/steps%d.dat\" using 1:2 with %s%s title \"%strain loss\"", sep, dir, k, train_style,
                    lc, name);
            sep = ", ";
        }
        if (pts[k].neval) {
            fprintf(g, "%s\"%s/evals%d.dat\" using 1:2 with linespoints%s%s title \"%stest loss\"", sep, dir, k, lc,
                    dt, name);
            sep = ", ";
        }
    }
    fprintf(g, "\n");
    if (nacc) {
        fprintf(g, "set ylabel \"test accuracy (%%)\"\nplot ");
        sep = "";
        for (int k = 0; k < nin; k++) {
            if (!pts[k].nacc)
                continue;
            char lb[4096];
            fprintf(g, "%s\"%s/evals%d.dat\" using 1:3 with linespoints lc %d title \"%s%stest accuracy\"", sep, dir,
                    k, k + 1, nin > 1 ? label_of(ins[k], lb, sizeof lb) : "", nin > 1 ? ": " : "");
            sep = ", ";
        }
        fprintf(g, "\nunset multiplot\n");
    }
    fclose(g);
    if ((rc = dt__gnuplot_run("dtrain plot", dir, out)))
        goto done;
    if (nin == 1)
        printf("wrote %s (%ld step records, %ld evaluations)\n", out, nstep, neval);
    else
        printf("wrote %s (%d runs: %ld step records, %ld evaluations)\n", out, nin, nstep, neval);
done:
    for (int k = 0; k < nin; k++)
        dt__metrics_points_free(&pts[k]);
    rmtree(dir, nin);
    return rc;
}
