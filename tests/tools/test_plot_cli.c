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
        DT_TEST_SKIP("gnuplot is not installed (Debian package gnuplot-nox)");
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
    expect_bad("{\"event\":\"start\"}\n", "no step or eval records", &failed);
    expect_bad("", "no step or eval records", &failed);
    ASSERT(!failed);
}

TEST(usage_errors)
{
    cli_result r;
    cli_runv(&r, 30, NULL, (char *[]){"plot", "/nonexistent/m.jsonl", "-o", "/tmp/x.png", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "cannot open /nonexistent/m.jsonl");
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

int main(void)
{
    RUN(good_file);
    RUN(malformed_files);
    RUN(usage_errors);
    RUN(gnuplot_missing);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
