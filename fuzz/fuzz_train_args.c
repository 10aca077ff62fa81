/* libFuzzer target for `dtrain train` option parsing (tools/train_args.c),
 * which has no side effect but printing.
 *
 * Input: the arguments after "train", one per line. The parser must return
 * 0 (options set), 1 (--help printed) or 2 (an error printed); never crash.
 * When it accepts, every option must hold a value of its type in its range
 * (or its default), and every number given must have been written plainly:
 * integers as -?[0-9]+ (no spaces, no '+', no hex: " -1" once wrapped to
 * 2^64-1), reals as a finite decimal. And the accepted options, written
 * back as --name=value, must parse to the same values. */
// fuzz-sources: src/base/*.c tools/cli_msg.c src/parallel/compress/comm_hooks.c src/ckpt/lora_pattern.c
// fuzz-sources: src/data/tok_regex.c src/data/tok_regex_run.c src/data/tok_unicode.c src/data/unicode_gc.c
// fuzz-libs: -lcjson
#include "train_args.c" /* the option table, opts[], is static */

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "plain_number.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* hf:DIR's own tokenizer.json for text data (models/, not linked here): none */
bool dt_hf_dir_tokenizer(const char *name, char *path, size_t n)
{
    (void)name, (void)path, (void)n;
    return false;
}

/* the Hub cache (models/, not linked here): holds nothing */
dt_status dt_hf_hub_snapshot(const char *repo_id, char *out, size_t n)
{
    (void)repo_id;
    if (out && n)
        out[0] = 0;
    return DT_ERR_NOT_FOUND;
}

/* --precision auto asks the library which precision this CPU trains in
 * (src/autograd, not linked here): the parser needs only an answer. */
dt_dtype dt_precision_auto(const char **why)
{
    if (why)
        *why = "fuzzing: fixed answer";
    return DT_F32;
}

/* dt__train_check and dt__train_comm_hook (in train_args.c, run after the
 * parse this target fuzzes) ask the planner and PowerSGD's defaults, which
 * are not linked here; the parse never calls them. */
dt_status dt_plan_model_id(const char *model, char *buf, size_t n, int64_t *positions)
{
    (void)model, (void)buf, (void)n, (void)positions;
    abort();
}
dt_powersgd_params dt_powersgd_params_default(void) { abort(); }

#define NOPTS (sizeof opts / sizeof opts[0])
#define MAXARGS 64


/* The parser prints its errors and --help through stdio; those streams are
 * pointed at /dev/null for the call. The file descriptors stay as they are,
 * so a sanitizer's report (written to fd 2) is still seen. */
static int quiet_parse(int argc, char **argv, dt__train_opts *o)
{
    static FILE *devnull;
    if (!devnull && !(devnull = fopen("/dev/null", "w")))
        abort();
    FILE *out = stdout, *err = stderr;
    stdout = stderr = devnull;
    int rc = dt__train_parse(argc, argv, o);
    stdout = out;
    stderr = err;
    return rc;
}

/* Every numeric value given on the command line was written plainly. */
static void check_values_plain(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i] + 2, *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const opt_def *d = NULL;
        for (size_t k = 0; k < NOPTS && !d; k++) { /* '_' stands for '-' (--grad_accum, torchrun's habit) */
            size_t j = 0;
            while (j < nlen && opts[k].name[j] &&
                   (opts[k].name[j] == name[j] || (opts[k].name[j] == '-' && name[j] == '_')))
                j++;
            if (j == nlen && !opts[k].name[j])
                d = &opts[k];
        }
        if (!d)
            abort(); /* accepted an unknown option */
        if (d->type == OPT_FLAG)
            continue;
        const char *v = eq ? eq + 1 : argv[++i];
        if ((d->type == OPT_INT && !plain_int(v, 1)) || (d->type == OPT_U64 && (!plain_int(v, 1) || *v == '-')) ||
            (d->type == OPT_FLOAT && !plain_real(v)))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = 0;
    char *argv[MAXARGS + 2];
    int argc = 0;
    argv[argc++] = "train";
    for (char *line = buf, *next; line && argc <= MAXARGS; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        else if (!*line)
            break;
        argv[argc++] = line;
    }
    argv[argc] = NULL;

    dt__train_opts o, def, o2;
    set_defaults(&def);
    int rc = quiet_parse(argc, argv, &o);
    if (rc < 0 || rc > 2)
        abort();
    if (rc != 0) {
        free(buf);
        return 0;
    }
    check_values_plain(argc, argv);

    /* Each option: in range or the default; write it back. */
    /* room for any value the input can hold (at most 8192 bytes): every
       option is written back whole, so the cross-flag checks (--loss-mask
       needs jsonl data, ...) see the same values the first time and the second */
    static char vals[NOPTS][8192 + 64];
    char *argv2[NOPTS + 2];
    int argc2 = 0;
    argv2[argc2++] = "train";
    for (size_t k = 0; k < NOPTS; k++) {
        const opt_def *d = &opts[k];
        const char *f = (const char *)&o + d->off, *fd = (const char *)&def + d->off;
        switch (d->type) {
        case OPT_INT: {
            int64_t x = *(const int64_t *)f;
            if (x == *(const int64_t *)fd)
                continue;
            if ((double)x < d->lo || (double)x > d->hi)
                abort();
            snprintf(vals[k], sizeof vals[k], "--%s=%lld", d->name, (long long)x);
            break;
        }
        case OPT_U64:
            if (*(const uint64_t *)f == *(const uint64_t *)fd)
                continue;
            snprintf(vals[k], sizeof vals[k], "--%s=%llu", d->name,
                     (unsigned long long)*(const uint64_t *)f);
            break;
        case OPT_FLOAT: {
            double x = *(const double *)f;
            if (x == *(const double *)fd)
                continue;
            if (!isfinite(x) || x < d->lo || x > d->hi)
                abort();
            snprintf(vals[k], sizeof vals[k], "--%s=%.17g", d->name, x);
            break;
        }
        case OPT_STR:
        case OPT_CHOICE: {
            const char *s = *(const char *const *)f;
            if (!s || s == *(const char *const *)fd)
                continue;
            if (!*s)
                abort();
            /* a choice, or for --model a model directory (hf:DIR, DIR not empty) */
            const bool hf_dir = strstr(d->choices ? d->choices : "", "|hf:DIR") && !strncmp(s, "hf:", 3) && s[3];
            if (d->type == OPT_CHOICE && !hf_dir) {
                size_t n = strlen(s);
                const char *c = strstr(d->choices, s);
                if (!c || (c != d->choices && c[-1] != '|') || (c[n] && c[n] != '|'))
                    abort();
            }
            if (strlen(s) + strlen(d->name) + 4 > sizeof vals[k]) {
                /* long paths: nothing to compare but the pointer. --config
                 * must stay given (with it the cross-flag checks wait for the
                 * file's keys): a short stand-in, the file is not read here. */
                if (strcmp(d->name, "config"))
                    continue;
                s = "long-config.json";
            }
            snprintf(vals[k], sizeof vals[k], "--%s=%s", d->name, s);
            break;
        }
        case OPT_FLAG:
            if (!*(const bool *)f)
                continue;
            snprintf(vals[k], sizeof vals[k], "--%s", d->name);
            break;
        }
        argv2[argc2++] = vals[k];
    }
    argv2[argc2] = NULL;
    if (quiet_parse(argc2, argv2, &o2) != 0)
        abort();
    for (size_t k = 0; k < NOPTS; k++) {
        const opt_def *d = &opts[k];
        const char *a = (const char *)&o + d->off, *b = (const char *)&o2 + d->off;
        int same;
        if (d->type == OPT_INT || d->type == OPT_U64) {
            same = !memcmp(a, b, 8);
        } else if (d->type == OPT_FLOAT) {
            same = *(const double *)a == *(const double *)b;
        } else if (d->type == OPT_FLAG) {
            same = *(const bool *)a == *(const bool *)b;
        } else {
            const char *sa = *(const char *const *)a, *sb = *(const char *const *)b;
            same = (!sa && !sb) || (sa && sb && !strcmp(sa, sb)) ||
                   (sa && strlen(sa) + strlen(d->name) + 4 > sizeof vals[k]);
        }
        if (!same)
            abort();
    }
    free(buf);
    return 0;
}
