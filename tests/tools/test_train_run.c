/* dtrain train, real runs through the CLI (env DT_CLI): a short run on a
 * Fashion-MNIST subset writes a complete metrics file, reaches a
 * non-trivial accuracy and is reproducible; the MLP on random data (what an
 * interrupted or failed run leaves: test_train_metrics.c). Labelled
 * slow (tests/data/tests.cmake): the slowest test of the suite. */
// dt-test-timeout: 600
#include "data/data_util.h"
#include "test.h"
#include "train_cli.h"

#include "dtrain/data.h"

#include <math.h>
#include <stdbool.h>

/* The Fashion-MNIST files where dtrain looks for them (Debian's
 * dataset-fashion-mnist, or DT_FASHION_MNIST_DIR); without them the real
 * runs are reported as skipped. */
static int have_fashion(void)
{
    return file_exists(dt_data_fashion_mnist_dir());
}

/* Count "event":"<ev>" records in a metrics file; check each parses. */
static int count_events(const char *text, const char *ev)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"event\":\"%s\"", ev);
    int n = 0;
    for (const char *s = text; (s = strstr(s, pat)); s++)
        n++;
    return n;
}

static double last_number(const char *text, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *s = text, *hit = NULL;
    while ((s = strstr(s, pat))) {
        hit = s;
        s++;
    }
    return hit ? strtod(hit + strlen(pat), NULL) : NAN;
}

/* The whole of a (small) file as a string in buf; false if it cannot be read. */
static bool read_text(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return true;
}

TEST(short_real_run)
{
    if (!have_fashion())
        DT_TEST_SKIP_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dt_data_fashion_mnist_dir());
    char metrics[600], partial[620], png[600];
    snprintf(metrics, sizeof metrics, "%s/run.jsonl", cli_tmpdir());
    snprintf(partial, sizeof partial, "%s.partial", metrics);
    snprintf(png, sizeof png, "%s/run.png", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "convnet", "--data", "fashion-mnist", "--epochs", "1", "--batch",
                        "100", "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9", "--seed", "0",
                        "--limit-train", "2000", "--limit-test", "500", "--log-every", "5",
                        "--eval-every", "10", "--metrics", metrics, NULL});
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test accuracy: ");
    ASSERT_STR_CONTAINS(r.out, "epoch wall time: ");
    ASSERT_STR_CONTAINS(r.out, "samples/s: ");
    ASSERT_STR_CONTAINS(r.out, "\ntrain loss (last 20 steps): "); /* the 20 steps it ran, not "last 100" */
    /* the final figures docs/TRAINING.md quotes ("prints the final figures:" and its block): each line's
       label (up to its first digit) starts a line of the output */
    {
        static char doc[1 << 17];
        ASSERT(read_text(DT_SOURCE_DIR "/docs/TRAINING.md", doc, sizeof doc));
        const char *b = strstr(doc, "prints the final figures:\n\n```\n");
        ASSERT(b != NULL);
        b = strstr(b, "```\n") + 4;
        const char *e = strstr(b, "```");
        ASSERT(e != NULL);
        int lines = 0;
        for (const char *l = b; l < e; l = strchr(l, '\n') + 1) {
            size_t k = strcspn(l, "0123456789\n");
            char want[128];
            snprintf(want, sizeof want, "\n%.*s", (int)(k < 120 ? k : 120), l);
            if (!strstr(r.out, want))
                fprintf(stderr, "  docs/TRAINING.md quotes a line '%.*s...' that dtrain train does not print\n",
                        (int)k, l);
            ASSERT(strstr(r.out, want) != NULL);
            lines++;
        }
        ASSERT(lines >= 5);
    }
    /* not a terminal: plain progress lines every 5 steps */
    ASSERT_STR_CONTAINS(r.out, "epoch 1/1 step 10/20 loss");
    double acc = strtod(strstr(r.out, "test accuracy: ") + 15, NULL);
    ASSERT(acc > 55.0 && acc <= 100.0); /* 20 steps on 2000 images: ~70% (chance is 10%) */
    ASSERT(file_exists(metrics));
    ASSERT(!file_exists(partial));
    static char text[65536];
    ASSERT(read_text(metrics, text, sizeof text));
    ASSERT_EQ_INT(count_events(text, "start"), 1);
    ASSERT_EQ_INT(count_events(text, "step"), 4);   /* steps 5, 10, 15, 20 */
    ASSERT_EQ_INT(count_events(text, "epoch"), 1);
    ASSERT_EQ_INT(count_events(text, "eval"), 2);   /* step 10 and the epoch end */
    ASSERT_NEAR(last_number(text, "test_accuracy") * 100, acc, 0.006, 0);
    ASSERT(last_number(text, "wall_s") > 0);
    ASSERT(last_number(text, "samples_per_s") > 0);
    ASSERT_NEAR(last_number(text, "lr"), 0.01, 1e-9, 0);
    ASSERT_EQ_INT(last_number(text, "train_items"), 2000);
    /* the loss fell: first step record above the last */
    double first = strtod(strstr(text, "\"loss\":") + 7, NULL);
    double last = last_number(text, "loss");
    ASSERT(first > last);
    /* and it plots */
    if (file_exists("/usr/bin/gnuplot")) {
        cli_runv(&r, 60, NULL, (char *[]){"plot", metrics, "-o", png, NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(file_exists(png));
    }
}

/* Same seed, same result: two short runs agree to the last printed digit;
 * another seed differs, and so does the same seed drawn by the other
 * generator (--rng philox against the default torch). */
TEST(reproducible)
{
    if (!have_fashion())
        DT_TEST_SKIP_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dt_data_fashion_mnist_dir());
    static char text[4][16384];
    for (int k = 0; k < 4; k++) {
        char metrics[600];
        snprintf(metrics, sizeof metrics, "%s/rep%d.jsonl", cli_tmpdir(), k);
        cli_result r;
        cli_runv(&r, 300, NULL,
                 (char *[]){"train", "--data", "fashion-mnist", "--batch", "50", "--lr", "0.01",
                            "--momentum", "0.9", "--seed", k == 2 ? "1" : "7", "--limit-train", "300",
                            "--limit-test", "200", "--log-every", "1", "--metrics", metrics,
                            "--progress", "none", "--rng", k == 3 ? "philox" : "torch", NULL});
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(read_text(metrics, text[k], sizeof text[k]));
    }
    ASSERT_EQ_INT(count_events(text[0], "step"), 6);
    ASSERT_NEAR(last_number(text[1], "test_loss"), last_number(text[0], "test_loss"), 0, 0);
    ASSERT_NEAR(last_number(text[1], "train_loss"), last_number(text[0], "train_loss"), 0, 0);
    ASSERT(last_number(text[2], "train_loss") != last_number(text[0], "train_loss"));
    ASSERT_STR_CONTAINS(text[0], "\"rng\":\"torch\"");
    ASSERT_STR_CONTAINS(text[3], "\"rng\":\"philox\"");
    ASSERT(last_number(text[3], "train_loss") != last_number(text[0], "train_loss"));
}

TEST(mlp_random)
{
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/mlp.jsonl", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "4", "--limit-test", "2",
                        "--optimizer", "adamw", "--lr", "1e-4", "--log-every", "1", "--metrics", metrics, NULL});
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test loss: ");
    ASSERT(strstr(r.out, "test accuracy") == NULL); /* no labels to score */
    static char text[16384];
    ASSERT(read_text(metrics, text, sizeof text));
    ASSERT_EQ_INT(count_events(text, "step"), 2);
    ASSERT_STR_CONTAINS(text, "\"test_accuracy\":null");
}

/* --grad-accum: the LR schedule counts optimizer steps, not batches. Five
 * batches of 2 with --grad-accum 2 make optimizer steps after batches 2, 4
 * and 5 (the epoch's last, partial accumulation); a step schedule halving
 * the rate every optimizer step gives steps 1..3 the rates 0.01, 0.005,
 * 0.0025, and the records count optimizer steps (micro_step the batches). */
TEST(grad_accum_schedule_counts_optimizer_steps)
{
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/accum.jsonl", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 300, NULL,
             (char *[]){"train", "--model", "mlp", "--batch", "2", "--random-items", "10", "--limit-test", "2",
                        "--lr", "0.01", "--lr-schedule", "step", "--step-size", "1", "--gamma", "0.5",
                        "--grad-accum", "2", "--log-every", "1", "--no-eval", "--metrics", metrics,
                        "--progress", "none", NULL});
    if (r.code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    static char text[16384];
    ASSERT(read_text(metrics, text, sizeof text));
    /* one record per optimizer step (issue 32: "step" is the optimizer step; the batches are "micro_step") */
    const double want[3] = {0.01, 0.005, 0.0025};
    const char *p = text;
    for (int i = 0; i < 3; i++) {
        p = strstr(p, "\"event\":\"step\"");
        ASSERT(p != NULL);
        char head[64];
        snprintf(head, sizeof head, "\"step\":%d,\"epoch_step\":%d,\"micro_step\":%d,", i + 1, i + 1,
                 i < 2 ? 2 * (i + 1) : 5);
        ASSERT_STR_CONTAINS(p, head);
        const char *lr = strstr(p, "\"lr\":");
        ASSERT(lr != NULL);
        ASSERT_NEAR(strtod(lr + 5, NULL), want[i], 1e-12, 1e-9);
        p++;
    }
    ASSERT(strstr(p, "\"event\":\"step\"") == NULL);
    ASSERT_STR_CONTAINS(text, "\"event\":\"end\",\"status\":\"ok\",\"step\":3,");
}

int main(void)
{
    RUN(short_real_run);
    RUN(reproducible);
    RUN(mlp_random);
    RUN(grad_accum_schedule_counts_optimizer_steps);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
