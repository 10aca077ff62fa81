/* Running gnuplot for `dtrain plot` and `dtrain trace plot`: find the
 * program ($DT_GNUPLOT, else `gnuplot` on PATH), run a script that writes
 * DIR/out.png in a private temporary directory, report its error on one
 * line, and move the image to OUT through dt_file (no symlink followed;
 * complete or absent). */
#include "cmd.h"

#include "dtrain/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *dt__gnuplot_find(void)
{
    const char *env = getenv("DT_GNUPLOT");
    if (env && *env)
        return access(env, X_OK) == 0 ? strdup(env) : NULL;
    char p[4096];
    return dt__cli_which("gnuplot", p, sizeof p, NULL, 0) == 0 ? strdup(p) : NULL;
}

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

int dt__gnuplot_run(const char *who, const char *dir, const char *out)
{
    char *gp = dt__gnuplot_find();
    if (!gp) {
        dt__cli_err("%s: gnuplot not found (install Debian's gnuplot-nox, or set DT_GNUPLOT)\n", who);
        return 1;
    }
    char cmd[8192], p[4096];
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
        dt__cli_err("%s: gnuplot failed writing %s: %s\n", who, out, msg[0] ? msg : "(no message)");
        return 1;
    }
    if (publish(dir, out) < 0) {
        dt__cli_err("%s: %s\n", who, dt_last_error());
        return 1;
    }
    return 0;
}
