/* Run the dtrain CLI (env DT_CLI) as a child with a time limit, capturing
 * stdout and stderr, for the train and plot command tests. */
#ifndef DT_TEST_TRAIN_CLI_H
#define DT_TEST_TRAIN_CLI_H

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/data.h"
#include "tmp_util.h"

typedef struct {
    int code;        /* exit status; 128+sig if killed; -1 on timeout */
    char out[65536]; /* stdout (truncated) */
    char err[8192];  /* stderr (truncated) */
} cli_result;

static char cli_tmp_[256];

/* The CLI's scratch directory, its own (t_mkdtemp, tmp_util.h; a test's
 * t_tmpdir is another); exits when it cannot be made. */
static inline const char *cli_tmpdir(void)
{
    if (!cli_tmp_[0] && !t_mkdtemp("cli", cli_tmp_, sizeof cli_tmp_)) {
        perror("mkdtemp");
        exit(1);
    }
    return cli_tmp_;
}

static inline void cli_cleanup(void)
{
    if (cli_tmp_[0])
        t_rm_rf(cli_tmp_);
}

static inline void slurp_(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    size_t k = 0;
    if (f) {
        k = fread(buf, 1, n - 1, f);
        fclose(f);
    }
    buf[k] = 0;
}

/* argv without the program; NULL-terminated. extra_env: "K=V" or NULL.
 * timeout_s is for a release build; sanitizer builds run the CLI 3-10x
 * slower, so their limit is 4x (ctest's per-test TIMEOUT stays the bound). */
static inline int cli_runv(cli_result *r, int timeout_s, const char *extra_env, char *const *args)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    timeout_s *= 4;
#endif
    const char *cli = getenv("DT_CLI");
    if (!cli) {
        fprintf(stderr, "DT_CLI is not set\n");
        return -1;
    }
    char po[512], pe[512];
    snprintf(po, sizeof po, "%s/cli.out", cli_tmpdir());
    snprintf(pe, sizeof pe, "%s/cli.err", cli_tmpdir());
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)cli;
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = dt_test_fork();
    if (pid < 0) {
        r->code = -1;
        r->out[0] = r->err[0] = 0;
        return -1;
    }
    if (pid == 0) {
        int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fo, 1);
        dup2(fe, 2);
        if (extra_env)
            putenv((char *)extra_env);
        execv(cli, argv);
        _exit(127);
    }
    int status = 0;
    double t0 = (double)time(NULL);
    for (;;) {
        pid_t w = dt_test_waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if ((double)time(NULL) - t0 > timeout_s) {
            dt_test_kill(pid, SIGKILL);
            dt_test_waitpid(pid, &status, 0);
            r->code = -1;
            slurp_(po, r->out, sizeof r->out);
            slurp_(pe, r->err, sizeof r->err);
            return -1;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    r->code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    slurp_(po, r->out, sizeof r->out);
    slurp_(pe, r->err, sizeof r->err);
    return r->code;
}

/* Number of lines in s. */
static inline int cli_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static inline int file_exists(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Do files a and b hold the same bytes? (false when either cannot be opened) */
static inline bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        same = x == y;
        if (x == EOF || y == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* The "loss" values of the step records in a metrics file (--metrics), in
 * order: how many (at most cap), -1 when the file cannot be read. */
static inline int cli_step_losses(const char *path, double *out, int cap)
{
    static char buf[1 << 16];
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    int n = 0;
    for (char *p = buf; (p = strstr(p, "\"event\":\"step\"")) && n < cap; p++) {
        char *l = strstr(p, "\"loss\":");
        char *e = strchr(p, '\n');
        if (l && (!e || l < e))
            out[n++] = atof(l + 7);
    }
    return n;
}

/* Two runs' step losses agree: the same count (at least 2) and each pair
 * within 1e-5 relative plus abs_tol (say why on stderr when not). */
static inline bool cli_same_losses(const double *a, int na, const double *b, int nb, double abs_tol)
{
    if (na != nb || na < 2) {
        fprintf(stderr, "%d vs %d step records\n", na, nb);
        return false;
    }
    for (int i = 0; i < na; i++)
        if (!(fabs(a[i] - b[i]) <= 1e-5 * fabs(b[i]) + abs_tol)) {
            fprintf(stderr, "step record %d: loss %.9g vs %.9g\n", i, a[i], b[i]);
            return false;
        }
    return true;
}

/* The step losses of two runs' --metrics files ma and mb agree
 * (cli_same_losses), ma holding want step records (want < 0: any count). */
static inline bool cli_same_metrics(const char *ma, const char *mb, int want, double abs_tol)
{
    double a[64], b[64];
    int na = cli_step_losses(ma, a, 64), nb = cli_step_losses(mb, b, 64);
    if (want >= 0 && na != want) {
        fprintf(stderr, "%s: %d step records, want %d\n", ma, na, want);
        return false;
    }
    return cli_same_losses(a, na, b, nb, abs_tol);
}

/* `dtrain [run -n ranks -- dtrain] <lists[0]> <lists[1]> ...`: the lists are
 * NULL-terminated argument lists (a NULL list is empty) joined in order;
 * one rank runs the CLI directly. Prints the output when the run fails. */
static inline int cli_run_ranks(cli_result *r, int timeout_s, const char *extra_env, int ranks, int nlists,
                                char *const *const *lists)
{
    char *args[96];
    int n = 0;
    static char nr[16];
    if (ranks > 1) {
        snprintf(nr, sizeof nr, "%d", ranks);
        args[n++] = "run", args[n++] = "-n", args[n++] = nr, args[n++] = "--", args[n++] = getenv("DT_CLI");
    }
    for (int l = 0; l < nlists; l++)
        for (char *const *e = lists[l]; e && *e && n < 95; e++)
            args[n++] = *e;
    args[n] = NULL;
    int rc = cli_runv(r, timeout_s, extra_env, args);
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    return rc;
}

/* The number printed after key in a run's output ("val loss: "), NAN when absent. */
static inline double cli_out_value(const char *out, const char *key)
{
    const char *p = strstr(out, key);
    return p ? atof(p + strlen(key)) : NAN;
}

/* name inside the test's scratch directory (16 rotating buffers). */
static inline char *cli_path(const char *name)
{
    static char bufs[16][300];
    static int k;
    char *b = bufs[k++ % 16];
    snprintf(b, 300, "%s/%s", cli_tmpdir(), name);
    return b;
}

/* The CLI tests' synthetic token stream: token i is (i % 7) * 5 + (i / 7) % 2,
 * period 7 over ids < 40, the next token a function of the previous two (a
 * GPT learns it in a few steps); wide adds (i / 49) % 3 * 40 (ids < 120:
 * the Llama tests' larger vocabulary). */
static inline uint16_t cli_stream_token(int64_t i, bool wide)
{
    return (uint16_t)((i % 7) * 5 + (i / 7) % 2 + (wide ? (i / 49) % 3 * 40 : 0));
}

/* tok[0..n) = the stream's first n tokens. */
static inline void cli_stream(uint16_t *tok, int64_t n, bool wide)
{
    for (int64_t i = 0; i < n; i++)
        tok[i] = cli_stream_token(i, wide);
}

/* tok[0..n) written as the token file cli_tmpdir()/name (dt_tokens_write),
 * its --data spec "tokens:PATH" into spec[specn] (spec + 7 is the path).
 * DT_OK, or the writer's error (dt_last_error says which). */
static inline dt_status cli_token_file(const char *name, const uint16_t *tok, int64_t n, char *spec, size_t specn)
{
    snprintf(spec, specn, "tokens:%s/%s", cli_tmpdir(), name);
    return dt_tokens_write(spec + 7, tok, n);
}

/* The stream's first n (<= 20000) tokens as the token file
 * cli_tmpdir()/name, its spec into spec[specn] (cli_token_file). */
static inline dt_status cli_stream_file(const char *name, int64_t n, bool wide, char *spec, size_t specn)
{
    static uint16_t tok[20000];
    if (n < 0 || n > 20000)
        return dt_error(DT_ERR_INVALID_ARG, "cli_stream_file: %lld tokens (at most 20000)", (long long)n);
    cli_stream(tok, n, wide);
    return cli_token_file(name, tok, n, spec, specn);
}

/* The stream's first 3000 tokens as cli_tmpdir()/train.bin and its tokens
 * 1000..1599 as val.bin, their specs into train[n] and val[n]. DT_OK or
 * the writer's error. */
static inline dt_status cli_stream_train_val(char *train, char *val, size_t n)
{
    uint16_t tok[3000];
    cli_stream(tok, 3000, false);
    dt_status st = cli_token_file("train.bin", tok, 3000, train, n);
    return st < 0 ? st : cli_token_file("val.bin", tok + 1000, 600, val, n);
}

#endif
