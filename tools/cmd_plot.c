/* dtrain plot FILE.jsonl [-o OUT.png] — loss and accuracy curves of a
 * metrics file written by `dtrain train --metrics`, drawn with gnuplot.
 *
 * The file is validated first (every line a flat JSON object with an
 * "event"; step records need "step" and "loss"; eval records need
 * "test_loss", and "test_accuracy" if present is a number or null), so a malformed file gets one line naming the file, the
 * line and the problem (exit 2) instead of a gnuplot error. The data go to
 * a private temporary directory as whitespace-separated columns; gnuplot
 * ($DT_GNUPLOT, else `gnuplot` on PATH) renders a PNG: training and test
 * loss against the step on top, test accuracy below. */
#include "cmd.h"
#include "train.h"

#include <errno.h>
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
                fprintf(stderr, "dtrain plot: %s needs a value\n", argv[i]);
                return 2;
            }
            if (!strcmp(argv[i], "--title"))
                title = argv[++i];
            else
                out = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "dtrain plot: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!in) {
            in = argv[i];
        } else {
            fprintf(stderr, "dtrain plot: unexpected argument '%s' (one metrics file)\n", argv[i]);
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
        fprintf(stderr, "dtrain plot: output name and title may not contain '\"' or newlines\n");
        return 2;
    }
    FILE *f = fopen(in, "r");
    if (!f) {
        fprintf(stderr, "dtrain plot: cannot open %s: %s\n", in, strerror(errno));
        return 2;
    }
    char tmpl[] = "/tmp/dtrain-plot-XXXXXX";
    char *dir = mkdtemp(tmpl);
    if (!dir) {
        fprintf(stderr, "dtrain plot: cannot create a temporary directory: %s\n", strerror(errno));
        fclose(f);
        return 1;
    }
    static const char *const files[] = {"steps.dat", "evals.dat", "plot.gp", "gnuplot.err"};
    char p[4096];
    snprintf(p, sizeof p, "%s/steps.dat", dir);
    FILE *fs = fopen(p, "w");
    snprintf(p, sizeof p, "%s/evals.dat", dir);
    FILE *fe = fopen(p, "w");
    int rc = 0;
    long nstep = 0, neval = 0, nacc = 0, lineno = 0;
    double last_step = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    dt__json_obj *o = malloc(sizeof *o);
    if (!fs || !fe || !o) {
        fprintf(stderr, "dtrain plot: cannot write temporary files in %s\n", dir);
        rc = 1;
        goto done;
    }
    while ((len = getline(&line, &cap, f)) != -1) {
        lineno++;
        char err[128];
        const char *s = line;
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            s++;
        if (!*s)
            continue;
        if (dt__json_parse_line(line, o, err, sizeof err) < 0) {
            fprintf(stderr, "dtrain plot: %s:%ld: malformed record: %s\n", in, lineno, err);
            rc = 2;
            goto done;
        }
        const dt__json_field *ev = dt__json_get(o, "event");
        if (!ev || ev->type != DT__JSON_STR) {
            fprintf(stderr, "dtrain plot: %s:%ld: malformed record: no \"event\" string\n", in, lineno);
            rc = 2;
            goto done;
        }
        if (!strcmp(ev->str, "step")) {
            const dt__json_field *st = dt__json_get(o, "step"), *lo = dt__json_get(o, "loss");
            if (!st || st->type != DT__JSON_NUM || !lo || lo->type != DT__JSON_NUM) {
                fprintf(stderr, "dtrain plot: %s:%ld: malformed step record: needs numeric "
                                "\"step\" and \"loss\"\n", in, lineno);
                rc = 2;
                goto done;
            }
            fprintf(fs, "%.17g %.9g\n", st->num, lo->num);
            last_step = st->num;
            nstep++;
        } else if (!strcmp(ev->str, "eval")) {
            const dt__json_field *ac = dt__json_get(o, "test_accuracy"),
                                 *tl = dt__json_get(o, "test_loss"), *st = dt__json_get(o, "step");
            if (!tl || tl->type != DT__JSON_NUM ||
                (ac && ac->type != DT__JSON_NUM && ac->type != DT__JSON_NULL)) {
                fprintf(stderr, "dtrain plot: %s:%ld: malformed eval record: needs a numeric "
                                "\"test_loss\" (and \"test_accuracy\" a number or null)\n", in, lineno);
                rc = 2;
                goto done;
            }
            double x = st && st->type == DT__JSON_NUM ? st->num : last_step;
            if (ac && ac->type == DT__JSON_NUM) {
                fprintf(fe, "%.17g %.9g %.9g\n", x, tl->num, 100.0 * ac->num);
                nacc++;
            } else {
                fprintf(fe, "%.17g %.9g NaN\n", x, tl->num);
            }
            neval++;
        }
    }
    if (nstep == 0 && neval == 0) {
        fprintf(stderr, "dtrain plot: %s: no step or eval records to plot\n", in);
        rc = 2;
        goto done;
    }
    fclose(fs);
    fclose(fe);
    fs = fe = NULL;
    char *gp = find_gnuplot();
    if (!gp) {
        fprintf(stderr, "dtrain plot: gnuplot not found (install Debian's gnuplot-nox, or set "
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
    fprintf(g, "set terminal pngcairo size 900,%d noenhanced\n", nacc ? 800 : 450);
    fprintf(g, "set output \"%s\"\nset grid\nset key top right\n", out);
    if (nacc)
        fprintf(g, "set multiplot layout 2,1 title \"%s\"\n", title ? title : in);
    else
        fprintf(g, "set title \"%s\"\n", title ? title : in);
    fprintf(g, "set xlabel \"step\"\nset ylabel \"loss\"\n");
    if (nstep && neval)
        fprintf(g, "plot \"%s/steps.dat\" using 1:2 with lines title \"train loss\", "
                   "\"%s/evals.dat\" using 1:2 with linespoints title \"test loss\"\n", dir, dir);
    else if (nstep)
        fprintf(g, "plot \"%s/steps.dat\" using 1:2 with lines title \"train loss\"\n", dir);
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
        fprintf(stderr, "dtrain plot: gnuplot failed writing %s: %s\n", out, msg[0] ? msg : "(no message)");
        unlink(out);
        rc = 1;
        goto done;
    }
    printf("wrote %s (%ld step records, %ld evaluations)\n", out, nstep, neval);
done:
    if (fs)
        fclose(fs);
    if (fe)
        fclose(fe);
    fclose(f);
    free(line);
    free(o);
    rmtree(dir, files, 4);
    return rc;
}
