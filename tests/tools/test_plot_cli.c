/* dtrain plot: a good metrics file gives a PNG; malformed files, a missing
 * file and a missing gnuplot each give one clear line and no image. */
#include "test.h"
#include "train_cli.h"

static char path_[512];
static const char *tmpfile_(const char *name, const char *content)
{
    snprintf(path_, sizeof path_, "%s/%s", cli_tmpdir(), name);
    FILE *f = fopen(path_, "w");
    fputs(content, f);
    fclose(f);
    return path_;
}

static const char *good =
    "{\"event\":\"start\",\"model\":\"convnet\",\"batch\":100}\n"
    "{\"event\":\"step\",\"epoch\":1,\"step\":100,\"loss\":0.9,\"lr\":0.01,\"samples_per_s\":5000}\n"
    "{\"event\":\"step\",\"epoch\":1,\"step\":200,\"loss\":0.6,\"lr\":0.01,\"samples_per_s\":5100}\n"
    "{\"event\":\"eval\",\"epoch\":1,\"step\":200,\"test_loss\":0.55,\"test_accuracy\":0.81}\n"
    "\n"
    "{\"event\":\"epoch\",\"epoch\":1,\"wall_s\":4.2,\"samples_per_s\":5000}\n";

TEST(good_file)
{
    if (access("/usr/bin/gnuplot", X_OK) != 0 && !getenv("DT_GNUPLOT"))
        DT_TEST_SKIP_NEED("gnuplot", "gnuplot is not installed (Debian package gnuplot-nox)");
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmpfile_("m.jsonl", good));
    snprintf(out, sizeof out, "%s/m.png", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 step records, 1 evaluations");
    FILE *f = fopen(out, "rb");
    ASSERT(f != NULL);
    unsigned char sig[8] = {0};
    size_t n = fread(sig, 1, 8, f);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fclose(f);
    ASSERT_EQ_INT(n, 8);
    ASSERT(sig[0] == 0x89 && sig[1] == 'P' && sig[2] == 'N' && sig[3] == 'G');
    ASSERT(sz > 1000);
    /* default output name: FILE with .png */
    unlink(out);
    cli_runv(&r, 60, NULL, (char *[]){"plot", in, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(file_exists(out));
}

static void expect_bad(const char *content, const char *msg, int *failed)
{
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmpfile_("bad.jsonl", content));
    snprintf(out, sizeof out, "%s/bad.png", cli_tmpdir());
    unlink(out);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"plot", in, "-o", out, NULL});
    if (r.code != 2 || !strstr(r.err, msg) || !strstr(r.err, "bad.jsonl") || cli_lines(r.err) != 1 ||
        file_exists(out)) {
        fprintf(stderr, "  content %.40s...: code %d, stderr: %s", content, r.code, r.err);
        *failed = 1;
    }
}

TEST(malformed_files)
{
    int failed = 0;
    expect_bad("not json\n", ":1: malformed record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":1,\"loss\":0.5}\n{\"event\":\"step\",\"step\":2,\"loss\":\n",
               ":2: malformed record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":1}\n", "malformed step record", &failed);
    expect_bad("{\"step\":1,\"loss\":2}\n", "no \"event\"", &failed);
    expect_bad("{\"event\":\"eval\",\"test_accuracy\":\"high\",\"test_loss\":1}\n",
               "malformed eval record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":1,\"loss\":0.5} trailing\n", "text after", &failed);
    /* not JSON numbers, though strtod takes them (found by fuzz/fuzz_metrics.c) */
    expect_bad("{\"event\":\"step\",\"step\":1,\"loss\":-nan}\n", ":1: malformed record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":1,\"loss\":-inf}\n", ":1: malformed record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":0x10,\"loss\":1}\n", ":1: malformed record", &failed);
    /* JSON numbers out of double's range parse as infinity: refused, never handed to gnuplot */
    expect_bad("{\"event\":\"step\",\"step\":1,\"loss\":1e999}\n", ":1: malformed step record", &failed);
    expect_bad("{\"event\":\"step\",\"step\":-1e999,\"loss\":1}\n", ":1: malformed step record", &failed);
    expect_bad("{\"event\":\"eval\",\"step\":1,\"test_loss\":1e999}\n", ":1: malformed eval record", &failed);
    expect_bad("{\"event\":\"eval\",\"step\":1e999,\"test_loss\":1}\n", ":1: malformed eval record", &failed);
    expect_bad("{\"event\":\"eval\",\"test_loss\":1,\"test_accuracy\":1e999}\n", ":1: malformed eval record",
               &failed);
    expect_bad("{\"event\":\"start\"}\n", "no step or eval records", &failed);
    expect_bad("", "no step or eval records", &failed);
    ASSERT(!failed);
}

TEST(usage_errors)
{
    cli_result r;
    cli_runv(&r, 30, NULL, (char *[]){"plot", "/nonexistent/m.jsonl", "-o", "/tmp/x.png", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "/nonexistent/m.jsonl: No such file or directory");
    /* the output over an input: refused before anything is written (the image replaced the run's metrics) */
    char in2[600];
    snprintf(in2, sizeof in2, "%s", tmpfile_("same.jsonl", good));
    cli_runv(&r, 30, NULL, (char *[]){"plot", in2, "-o", in2, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is also an input");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    char back[600];
    snprintf(back, sizeof back, "%s", in2);
    snprintf(in2, sizeof in2, "%s", tmpfile_("same.png", good)); /* the default output, the input's .png, is it */
    cli_runv(&r, 30, NULL, (char *[]){"plot", in2, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is also an input");
    FILE *keep = fopen(back, "r");
    ASSERT(keep != NULL);
    char first[16] = "";
    ASSERT(fgets(first, sizeof first, keep) != NULL);
    fclose(keep);
    ASSERT(!strncmp(first, good, strlen(first)));
    /* a FIFO or a directory: refused, not opened (the FIFO's open blocked for ever waiting for a writer) */
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/m.fifo", cli_tmpdir());
    unlink(fifo);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    cli_runv(&r, 30, NULL, (char *[]){"plot", fifo, "-o", "/tmp/x.png", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "not a regular file");
    cli_runv(&r, 30, NULL, (char *[]){"plot", (char *)cli_tmpdir(), "-o", "/tmp/x.png", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "not a regular file");
    unlink(fifo);
    cli_runv(&r, 30, NULL, (char *[]){"plot", NULL});
    ASSERT_EQ_INT(r.code, 2);
    cli_runv(&r, 30, NULL, (char *[]){"plot", "a.jsonl", "--colour", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "unknown option '--colour'");
    cli_runv(&r, 30, NULL, (char *[]){"plot", "a.jsonl", "-o", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "-o needs a value");
}

TEST(gnuplot_missing)
{
    char in[512], out[512];
    snprintf(in, sizeof in, "%s", tmpfile_("m2.jsonl", good));
    snprintf(out, sizeof out, "%s/m2.png", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 30, "DT_GNUPLOT=/nonexistent/gnuplot", (char *[]){"plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 1);
    ASSERT_STR_CONTAINS(r.err, "gnuplot not found");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT(!file_exists(out));
}

/* A stand-in gnuplot that keeps the script it was given and writes a tiny
 * "PNG" where the script says: checks what dtrain plot asks gnuplot for. */
static const char *fake_gnuplot(void)
{
    static char gp[600];
    snprintf(gp, sizeof gp, "%s/fake-gnuplot", cli_tmpdir());
    FILE *f = fopen(gp, "w");
    fprintf(f, "#!/bin/sh\ncp \"$1\" '%s/script.gp'\n"
               "out=$(sed -n 's/^set output \"\\(.*\\)\"$/\\1/p' \"$1\")\n"
               "printf 'PNGDATA' > \"$out\"\n", cli_tmpdir());
    fclose(f);
    chmod(gp, 0755);
    return gp;
}

/* dtrain plot ARGS with the stand-in gnuplot: the script it was handed
 * (a static buffer; "" when none was written, so a caller asserts it is
 * not empty), r the run's result. */
static const char *fake_plot(cli_result *r, char *const *args)
{
    static char env[700], text[16384];
    char script[600];
    snprintf(env, sizeof env, "DT_GNUPLOT=%s", fake_gnuplot());
    snprintf(script, sizeof script, "%s/script.gp", cli_tmpdir());
    unlink(script); /* a script left by an earlier test does not count */
    cli_runv(r, 30, env, args);
    if (r->code)
        fprintf(stderr, "%s", r->err);
    text[0] = 0;
    FILE *g = fopen(script, "r");
    if (g) {
        size_t k = fread(text, 1, sizeof text - 1, g);
        text[k] = 0;
        fclose(g);
    }
    return text;
}

/* Valid JSON with nested values, other events (end) and extra fields is
 * accepted; a short run's few points are drawn with markers. */
TEST(nested_values_and_few_points)
{
    char in[512], out[512];
    snprintf(in, sizeof in, "%s",
             tmpfile_("n.jsonl", "{\"event\":\"start\",\"extra\":{\"a\":[1,2,{\"b\":null}]},\"time\":1.5}\n"
                                 "{\"event\":\"step\",\"step\":1,\"loss\":2.3,\"tags\":[\"x\"]}\n"
                                 "{\"event\":\"step\",\"step\":2,\"loss\":2.1}\n"
                                 "{\"event\":\"end\",\"status\":\"interrupted\"}\n"));
    snprintf(out, sizeof out, "%s/n.png", cli_tmpdir());
    cli_result r;
    const char *text = fake_plot(&r, (char *[]){"plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 step records, 0 evaluations");
    FILE *f = fopen(out, "r");
    char buf[64] = "";
    ASSERT(f != NULL);
    ASSERT(fgets(buf, sizeof buf, f) != NULL);
    fclose(f);
    ASSERT_STR_EQ(buf, "PNGDATA");
    ASSERT(text[0] != 0);
    ASSERT_STR_CONTAINS(text, "with linespoints pt 7 ps 0.6 title \"train loss\"");
}

/* -o through a planted symlink: refused, the link's target unchanged. */
TEST(output_symlink_refused)
{
    char in[512], out[512], victim[512], env[700];
    snprintf(in, sizeof in, "%s", tmpfile_("s.jsonl", good));
    snprintf(victim, sizeof victim, "%s", tmpfile_("victim.png", "precious"));
    snprintf(out, sizeof out, "%s/s.png", cli_tmpdir());
    unlink(out);
    ASSERT_EQ_INT(symlink(victim, out), 0);
    snprintf(env, sizeof env, "DT_GNUPLOT=%s", fake_gnuplot());
    cli_result r;
    cli_runv(&r, 30, env, (char *[]){"plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 2); /* bad input, refused before gnuplot runs */
    ASSERT_STR_CONTAINS(r.err, "symbolic link");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    FILE *f = fopen(victim, "r");
    char buf[64] = "";
    ASSERT(fgets(buf, sizeof buf, f) != NULL);
    fclose(f);
    ASSERT_STR_EQ(buf, "precious");
    /* a directory, or a file in one that does not exist: the same, before any work */
    cli_runv(&r, 30, env, (char *[]){"plot", in, "-o", (char *)cli_tmpdir(), NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is a directory");
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    cli_runv(&r, 30, env, (char *[]){"plot", in, "-o", "/nonexistent/p.png", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "directory /nonexistent: does not exist");
}

/* The title defaults to the file's name, written into gnuplot's script as a
 * string: a '"' in the name ended the string and the rest of the name ran
 * as gnuplot commands (system("touch ...") made the file). The name's '"',
 * backslash and control characters are now '?' in the title. */
TEST(file_name_is_no_gnuplot_command)
{
    char in[600], out[512], pwned[512];
    snprintf(pwned, sizeof pwned, "%s/PWNED", cli_tmpdir());
    snprintf(in, sizeof in, "%s", tmpfile_("x\"; system(\"touch PWNED\"); \"y.jsonl", good));
    snprintf(out, sizeof out, "%s/q.png", cli_tmpdir());
    cli_result r;
    const char *text = fake_plot(&r, (char *[]){"plot", in, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(text[0] != 0);
    ASSERT_STR_CONTAINS(text, "x?; system(?touch PWNED?); ?y.jsonl\"\n");
    ASSERT(strstr(text, "system(\"") == NULL);
    if (access("/usr/bin/gnuplot", X_OK) == 0) { /* the real thing: nothing run, a PNG */
        cli_runv(&r, 60, NULL, (char *[]){"plot", in, "-o", out, NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(file_exists(out));
        ASSERT(!file_exists(pwned) && access("PWNED", F_OK) != 0);
    }
}

/* Issue 32: runs compared in one plot: several files, one colour and
 * legend entry each, the two panels on one x range with fixed margins (so
 * their axes line up); with real gnuplot, a PNG too. */
TEST(several_files_one_legend_entry_each)
{
    char a[512], b[512], out[512];
    snprintf(a, sizeof a, "%s", tmpfile_("a.jsonl", good));
    snprintf(b, sizeof b, "%s",
             tmpfile_("b.jsonl", "{\"event\":\"step\",\"step\":50,\"loss\":1.2}\n"
                                 "{\"event\":\"step\",\"step\":400,\"loss\":0.4}\n"
                                 "{\"event\":\"eval\",\"step\":400,\"test_loss\":0.45,\"test_accuracy\":0.86}\n"));
    snprintf(out, sizeof out, "%s/ab.png", cli_tmpdir());
    cli_result r;
    const char *text = fake_plot(&r, (char *[]){"plot", a, b, "-o", out, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "2 runs: 4 step records, 2 evaluations");
    ASSERT(text[0] != 0);
    const char *want[] = {"title \"a.jsonl: train loss\"", "title \"a.jsonl: test loss\"",
                          "title \"b.jsonl: train loss\"", "title \"b.jsonl: test loss\"",
                          "title \"a.jsonl: test accuracy\"", "title \"b.jsonl: test accuracy\"",
                          "set xrange [50:400]", "set lmargin at screen", "set rmargin at screen",
                          "set multiplot layout 2,1 title \"2 runs\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ASSERT_STR_CONTAINS(text, want[i]);
    /* each file once per panel's legend, not more */
    int n = 0;
    for (const char *q = strstr(text, "a.jsonl: train loss"); q; q = strstr(q + 1, "a.jsonl: train loss"))
        n++;
    ASSERT_EQ_INT(n, 1);
    if (access("/usr/bin/gnuplot", X_OK) == 0) { /* the real thing renders it */
        cli_runv(&r, 60, NULL, (char *[]){"plot", a, b, "-o", out, NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(file_exists(out));
    }
}

int main(void)
{
    RUN(good_file);
    RUN(malformed_files);
    RUN(usage_errors);
    RUN(gnuplot_missing);
    RUN(nested_values_and_few_points);
    RUN(output_symlink_refused);
    RUN(several_files_one_legend_entry_each);
    RUN(file_name_is_no_gnuplot_command);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
