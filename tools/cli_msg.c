/* tools/cli_msg.c — the one way the CLI prints its own error lines.
 * Messages echo user-supplied strings (paths, option values); a control
 * character in one must not reach the terminal raw (it could move the
 * cursor, recolour it or forge a line), so the whole formatted line goes
 * through dt_escape. Library messages (dt_last_error) are escaped already
 * and dt_escape leaves them unchanged. */
#include "cmd.h"
#include "dtrain/base.h"
#include "dtrain/models.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *g_train_as; /* dt__cli_err_command */
static char *g_capture;          /* dt__cli_err_capture */
static size_t g_capture_n;

void dt__cli_err_command(const char *cmd) { g_train_as = cmd; }

void dt__cli_err_capture(char *buf, size_t n)
{
    g_capture = buf && n ? buf : NULL, g_capture_n = n;
    if (g_capture)
        g_capture[0] = '\0';
}

void dt__cli_err(const char *fmt, ...)
{
    char small[1024], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof small) {
        char *big = malloc((size_t)n + 1);
        if (big) {
            va_start(ap, fmt);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            msg = big;
        } /* else print the truncated message */
    }
    static const char train[] = "dtrain train:";
    if (g_train_as && !strncmp(msg, train, sizeof train - 1)) {
        fputs(g_train_as, stderr); /* the command the user ran */
        fputc(':', stderr);
        memmove(msg, msg + sizeof train - 1, strlen(msg + sizeof train - 1) + 1);
    }
    size_t len = strlen(msg);
    int nl = len && msg[len - 1] == '\n'; /* the line's own end stays a newline */
    if (nl)
        msg[--len] = '\0';
    if (g_capture) { /* the last line, escaped, without its newline */
        dt_escape(msg, g_capture, g_capture_n);
        if (msg != small)
            free(msg);
        return;
    }
    size_t cap = 4 * len + 8; /* each byte escapes to at most 4 */
    char *out = malloc(cap);
    if (out) {
        fputs(dt_escape(msg, out, cap), stderr);
        free(out);
    } else {
        char tmp[256];
        fputs(dt_escape(msg, tmp, sizeof tmp), stderr);
    }
    if (nl)
        fputc('\n', stderr);
    if (msg != small)
        free(msg);
}

/* Levenshtein distance of a and b, '_' and '-' counted equal; 99 when
 * either is longer than 63 bytes. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            char ca = a[i - 1] == '_' ? '-' : a[i - 1], cb = b[j - 1] == '_' ? '-' : b[j - 1];
            int best = diag + (ca != cb);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            diag = row[j];
            row[j] = best;
        }
    }
    return row[lb];
}

const char *dt__cli_suggest(const char *given, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t len = strlen(given);
    int bd = len <= 4 ? 1 : len <= 8 ? 2 : 3; /* the farthest a typo may be */
    for (size_t i = 0; i < n; i++) {
        int d = edit_distance(given, names[i]);
        if (d <= bd && (!best || d < bd)) {
            best = names[i];
            bd = d;
        }
    }
    if (!best) /* a prefix of an option ("--grad" for --grad-accum) */
        for (size_t i = 0; i < n && len >= 3; i++)
            if (!strncmp(names[i], given, len)) {
                best = names[i];
                break;
            }
    return best;
}

bool dt__cli_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b)
        return false;
    return !strcmp(a, b) ||
           (stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino);
}

int dt__cli_out_file(const char *who, const char *flag, const char *path)
{
    struct stat st;
    if (!path || !*path) {
        dt__cli_err("%s: %s needs a file name\n", who, flag);
        return 2;
    }
    if (lstat(path, &st) == 0) {
        if (S_ISREG(st.st_mode))
            return 0;
        dt__cli_err("%s: %s %s is %s\n", who, flag, path,
                    S_ISLNK(st.st_mode)  ? "a symbolic link; dtrain does not write through symlinks"
                    : S_ISDIR(st.st_mode) ? "a directory (give a file name)"
                                          : "not a regular file");
        return 2;
    }
    if (errno != ENOENT) {
        dt__cli_err("%s: %s %s: %s\n", who, flag, path, strerror(errno));
        return 2;
    }
    size_t n = strlen(path);
    char *dir = malloc(n + 2);
    if (!dir)
        return 0; /* the write itself says what fails */
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else
        slash[slash == dir] = '\0'; /* "/x": the root */
    int rc = 0;
    if (stat(dir, &st) != 0) {
        dt__cli_err("%s: %s %s: directory %s: %s\n", who, flag, path, dir,
                    errno == ENOENT ? "does not exist (create it first)" : strerror(errno));
        rc = 2;
    } else if (!S_ISDIR(st.st_mode)) {
        dt__cli_err("%s: %s %s: %s is not a directory\n", who, flag, path, dir);
        rc = 2;
    }
    free(dir);
    return rc;
}

const char *dt__cli_png_beside(const char *in, char *buf, size_t n)
{
    snprintf(buf, n, "%s", in);
    char *dot = strrchr(buf, '.');
    if (dot && !strchr(dot, '/'))
        *dot = 0;
    strncat(buf, ".png", n - strlen(buf) - 1);
    return buf;
}

/* why (n bytes) gets the reason when not NULL. */
static int which_fail(char *why, size_t n, const char *fmt, const char *arg)
{
    if (why && n)
        snprintf(why, n, fmt, arg);
    return -1;
}

int dt__cli_which(const char *prog, char *out, size_t outn, char *why, size_t whyn)
{
    struct stat st;
    if (!prog || !*prog)
        return which_fail(why, whyn, "%s", "an empty program name");
    if (strchr(prog, '/')) {
        if (stat(prog, &st) != 0)
            return which_fail(why, whyn, "%s", strerror(errno));
        if (S_ISDIR(st.st_mode))
            return which_fail(why, whyn, "%s", "a directory");
        if (access(prog, X_OK) != 0)
            return which_fail(why, whyn, "not executable: %s", strerror(errno));
        if (out && outn)
            snprintf(out, outn, "%s", prog);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/bin:/usr/bin"; /* execvp's default */
    char buf[4096];
    for (const char *p = path;;) {
        const char *e = strchr(p, ':');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)len, p, len ? "/" : "", prog); /* empty: the cwd */
        if (stat(buf, &st) == 0 && !S_ISDIR(st.st_mode) && access(buf, X_OK) == 0) {
            if (out && outn)
                snprintf(out, outn, "%s", buf);
            return 0;
        }
        if (!e)
            break;
        p = e + 1;
    }
    return which_fail(why, whyn, "%s", "not found on PATH");
}

const char *dt__cli_hf_model(const char *v)
{
    struct stat sb;
    char snap[4800];
    if (!v || strncmp(v, "hf:", 3) || !v[3] || stat(v + 3, &sb) == 0)
        return v;
    if (dt_hf_hub_snapshot(v + 3, snap, sizeof snap) < 0) {
        dt_error_clear(); /* the loader says it, with its own flag */
        return v;
    }
    static char *kept[16]; /* reachable until the end (a command resolves one or two names) */
    static int nkept;
    char *r = nkept < 16 ? malloc(strlen(snap) + 4) : NULL;
    if (!r)
        return v;
    snprintf(r, strlen(snap) + 4, "hf:%s", snap);
    kept[nkept] = r;
    return kept[nkept++];
}
