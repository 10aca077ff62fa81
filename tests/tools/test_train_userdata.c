/* dtrain train on users' own data: --data npy:X.npy,Y.npy and
 * --data csv:FILE,label=...,shape=1x28x28 train the ConvNet (exit 0, a
 * test accuracy over the held-out rows), and bad data is one line naming
 * the file and the problem (exit 2). */
#include "test.h"
#include "train_cli.h"

#include <stdint.h>

static char p_[4][600];
static char *tp(int slot, const char *name)
{
    snprintf(p_[slot], sizeof p_[slot], "%s/%s", cli_tmpdir(), name);
    return p_[slot];
}

/* A v1 .npy of f32 (N, 1, 28, 28) (dims3 = 1) or (N, 28, 28) and i64 labels. */
static void write_npy(const char *path, const char *descr, const char *shape, const void *data, size_t nbytes)
{
    char dict[200];
    int dl = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    size_t hl = (size_t)dl + 1;
    hl += (64 - (10 + hl) % 64) % 64;
    FILE *f = fopen(path, "wb");
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hl, (unsigned char)(hl >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, (size_t)dl, f);
    for (size_t i = (size_t)dl; i + 1 < hl; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(data, 1, nbytes, f);
    fclose(f);
}

#define N 60
static float img_[N][784];
static int64_t lab_[N];

static void make_data(void)
{
    unsigned s = 7;
    for (int i = 0; i < N; i++) {
        lab_[i] = i % 3;
        for (int k = 0; k < 784; k++) {
            s = s * 1103515245u + 12345u;
            /* class c lights up rows 9c..9c+8 */
            img_[i][k] = (float)((s >> 16) % 100) / 400.0f + ((k / 28) / 9 == lab_[i] ? 0.6f : 0.0f);
        }
    }
}

TEST(npy_trains)
{
    write_npy(tp(0, "x.npy"), "<f4", "(60, 1, 28, 28)", img_, sizeof img_);
    write_npy(tp(1, "y.npy"), "<i8", "(60,)", lab_, sizeof lab_);
    char spec[1300];
    snprintf(spec, sizeof spec, "npy:%s,%s", tp(0, "x.npy"), tp(1, "y.npy"));
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "convnet", "--data", spec, "--epochs", "1", "--batch", "9", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test accuracy");
    ASSERT_STR_CONTAINS(r.out, "(6 items)"); /* 10 % of 60 rows held out */
    ASSERT_STR_CONTAINS(r.out, "54 items");
}

TEST(csv_trains)
{
    static char text[N * 785 * 8 + 4096];
    size_t o = 0;
    o += (size_t)snprintf(text + o, sizeof text - o, "digit");
    for (int k = 0; k < 784; k++)
        o += (size_t)snprintf(text + o, sizeof text - o, ",p%d", k);
    text[o++] = '\n';
    for (int i = 0; i < N; i++) {
        o += (size_t)snprintf(text + o, sizeof text - o, "%d", (int)lab_[i]);
        for (int k = 0; k < 784; k++)
            o += (size_t)snprintf(text + o, sizeof text - o, ",%.3f", img_[i][k]);
        text[o++] = '\n';
    }
    FILE *f = fopen(tp(2, "d.csv"), "wb");
    fwrite(text, 1, o, f);
    fclose(f);
    char spec[700];
    snprintf(spec, sizeof spec, "csv:%s,label=digit,shape=1x28x28,test=0.25", tp(2, "d.csv"));
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "convnet", "--data", spec, "--epochs", "1", "--batch", "9", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "(15 items)");
}

TEST(bad_data)
{
    char spec[1300];
    cli_result r;
    /* (N, 28, 28) without shape=: the model wants (1, 28, 28) */
    write_npy(tp(3, "x3.npy"), "<f4", "(60, 28, 28)", img_, sizeof img_);
    snprintf(spec, sizeof spec, "npy:%s,%s", tp(3, "x3.npy"), tp(1, "y.npy"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_STR_CONTAINS(r.err, "x3.npy");
    ASSERT_STR_CONTAINS(r.err, "(28, 28)");
    /* labels beyond the model's 10 classes */
    int64_t big[N];
    for (int i = 0; i < N; i++)
        big[i] = i;
    write_npy(tp(3, "ybig.npy"), "<i8", "(60,)", big, sizeof big);
    snprintf(spec, sizeof spec, "npy:%s,%s", tp(0, "x.npy"), tp(3, "ybig.npy"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "labels go up to 59");
    /* no labels for a classifier: every label 0, "test accuracy: 100.00%" and exit 0 before */
    snprintf(spec, sizeof spec, "npy:%s", tp(0, "x.npy"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_STR_CONTAINS(r.err, "the data has no labels");
    /* no held-out items: "test loss: nan" and exit 0 before */
    snprintf(spec, sizeof spec, "npy:%s,%s,test=0", tp(0, "x.npy"), tp(1, "y.npy"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_STR_CONTAINS(r.err, "the test set is empty");
    ASSERT(!strstr(r.out, "test loss"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 0);
    /* a ragged csv names file and line */
    FILE *f = fopen(tp(3, "r.csv"), "wb");
    fputs("a,b,c\n1,2,0\n3,4\n", f);
    fclose(f);
    snprintf(spec, sizeof spec, "csv:%s", tp(3, "r.csv"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--data", spec, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_STR_CONTAINS(r.err, "r.csv:3: 2 cells");
}

int main(void)
{
    make_data();
    RUN(npy_trains);
    RUN(csv_trains);
    RUN(bad_data);
    cli_cleanup();
    return TEST_REPORT();
}
