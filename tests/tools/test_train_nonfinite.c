/* `dtrain train` never reports a wrong result as success:
 *  - a NaN gradient injected on rank 1 of a 2-rank job (DT_FAULT_NONFINITE)
 *    stops both ranks after that step, naming the step, the rank and the
 *    parameter, exit 1, no hang: fp32 and bf16, DDP and ZeRO 1 and 3, and
 *    bf16 with gradient clipping (DDP, ZeRO 1);
 *  - fp16: a step skipped for an +inf input leaves BatchNorm's running
 *    statistics alone (the test loss stays finite), the --metrics file is
 *    JSON on every line (a non-finite loss is null) with one final eval;
 *  - a static --loss-scale that overflows every step fails (exit 1);
 *  - ranks given another --lr or --seed refuse to train (exit 2);
 *  - resuming with another --seed, --batch or --data warns that the data order is not kept;
 *  - an edited checkpoint (batch past its epoch) is refused (exit 2). */
// dt-test-timeout: 300
// dt-test-labels: fault
#include "data/data_util.h"
#include "test.h"
#include "train_cli.h"

#include <cjson/cJSON.h>

static char g_spec[420];

/* `dtrain [run -n 2 --] train <common> <extra...>` */
static int train(cli_result *r, const char *env, bool two, const char *const *extra)
{
    char *argv[64];
    int n = 0;
    if (two) {
        char *head[] = {"run", "-n", "2", "--grace", "1", "--", getenv("DT_CLI"), NULL};
        for (int i = 0; head[i]; i++)
            argv[n++] = head[i];
    }
    char *common[] = {"train", "--model", "convnet", "--data", g_spec, "--batch", "8", "--epochs", "1",
                      "--progress", "none", "--threads", "1", "--seed", "5", "--lr", "0.05", NULL};
    for (int i = 0; common[i]; i++)
        argv[n++] = common[i];
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = (char *)extra[i];
    argv[n] = NULL;
    cli_runv(r, 120, env, argv);
    return r->code;
}

static void make_data(void)
{
    if (g_spec[0])
        return;
    char data[400];
    snprintf(data, sizeof data, "%s/mnist", cli_tmpdir());
    mkdir(data, 0755);
    tu_write_mnist(data, "train", 160, 28, 28, 160, 0);
    tu_write_mnist(data, "t10k", 40, 28, 28, 40, 0);
    snprintf(g_spec, sizeof g_spec, "idx:%s", data);
}

TEST(nan_on_one_rank_stops_every_rank)
{
    make_data();
    /* (DDP reduces one dtype: bf16 batch norm there) */
    const char *const cases[][7] = {
        {"--precision", "fp32", NULL},
        {"--precision", "bf16", "--keep-bn-fp32", "false", NULL},
        {"--precision", "fp32", "--zero", "1", NULL},
        {"--precision", "bf16", "--zero", "1", NULL},
        {"--precision", "fp32", "--zero", "3", NULL},
        {"--precision", "bf16", "--zero", "3", NULL},
        /* clipping: the norm's pass widens (and zeroes) the bf16 gradients first */
        {"--precision", "bf16", "--keep-bn-fp32", "false", "--clip-grad-norm", "1", NULL},
        {"--precision", "bf16", "--zero", "1", "--clip-grad-norm", "1", NULL},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cli_result r;
        const char *extra[10] = {"--no-eval"};
        for (int i = 0; cases[c][i]; i++)
            extra[1 + i] = cases[c][i];
        train(&r, "DT_FAULT_NONFINITE=1:3:grad", true, extra);
        fprintf(stderr, "case %s %s %s %s: exit %d\n", cases[c][1], cases[c][2] ? cases[c][2] : "",
                cases[c][3] ? cases[c][3] : "", cases[c][3] && cases[c][4] ? cases[c][4] : "", r.code);
        if (r.code != 1 || !strstr(r.err, "non-finite values at optimizer step 3") ||
            !strstr(r.err, "is not finite on rank 1") || !strstr(r.err, "the gradient of '"))
            fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
        ASSERT_EQ_INT(r.code, 1); /* not 0, not a timeout (-1) */
        ASSERT_STR_CONTAINS(r.err, "non-finite values at optimizer step 3");
        ASSERT_STR_CONTAINS(r.err, "is not finite on rank 1");
        ASSERT_STR_CONTAINS(r.err, "the gradient of '");
        /* both ranks stopped with it (dtrain run prefixes each rank's lines) */
        ASSERT_STR_CONTAINS(r.err, "[0] dtrain train: training step: non-finite values at optimizer step 3");
        ASSERT_STR_CONTAINS(r.err, "[1] dtrain train: training step: non-finite values at optimizer step 3");
    }
    /* an +inf input on rank 0 in fp32: the loss is named */
    cli_result r;
    const char *extra[] = {"--no-eval", NULL};
    train(&r, "DT_FAULT_NONFINITE=0:2:input", true, extra);
    if (r.code != 1)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 1);
    ASSERT_STR_CONTAINS(r.err, "non-finite values at optimizer step 2");
    ASSERT_STR_CONTAINS(r.err, "the loss is NaN on rank 0 (micro-batch 1 of 1)");
}

/* Every line of the metrics file parses as JSON; the number of "eval" records. */
static int metrics_json(const char *path, int *evals, int *null_losses)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[8192];
    int bad = 0;
    *evals = *null_losses = 0;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) {
            fprintf(stderr, "not JSON: %s", line);
            bad++;
            continue;
        }
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "event");
        if (cJSON_IsString(ev) && !strcmp(ev->valuestring, "eval"))
            (*evals)++;
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "loss")))
            (*null_losses)++;
        cJSON_Delete(j);
    }
    fclose(f);
    return bad;
}

TEST(fp16_skipped_step_keeps_batchnorm)
{
    make_data();
    char metrics[512];
    snprintf(metrics, sizeof metrics, "%s/fp16.jsonl", cli_tmpdir());
    const char *extra[] = {"--precision", "fp16", "--log-every", "1", "--metrics", metrics, NULL};
    cli_result r;
    train(&r, "DT_FAULT_NONFINITE=0:2:input", false, extra);
    if (r.code != 0 || strstr(r.out, "nan"))
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "test loss: ");
    ASSERT(!strstr(r.out, "nan")); /* the running statistics stayed finite */
    int evals, nulls;
    ASSERT_EQ_INT(metrics_json(metrics, &evals, &nulls), 0);
    ASSERT_EQ_INT(evals, 1);
    ASSERT(nulls >= 1); /* the skipped step's loss, written as null */
    /* and dtrain plot reads dtrain's own file (a stand-in gnuplot: only the parse matters) */
    char gp[600], png[600];
    snprintf(gp, sizeof gp, "%s/gnuplot-ok", cli_tmpdir());
    FILE *f = fopen(gp, "w");
    ASSERT(f != NULL);
    fprintf(f, "#!/bin/sh\nout=$(sed -n 's/^set output \"\\(.*\\)\"$/\\1/p' \"$1\")\nprintf 'PNG' > \"$out\"\n");
    fclose(f);
    chmod(gp, 0755);
    char env[700];
    snprintf(env, sizeof env, "DT_GNUPLOT=%s", gp);
    snprintf(png, sizeof png, "%s/fp16.png", cli_tmpdir());
    cli_runv(&r, 60, env, (char *[]){"plot", metrics, "-o", png, NULL});
    if (r.code != 0)
        fprintf(stderr, "plot: exit %d\n%s%s", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
}

TEST(static_loss_scale_overflowing_fails)
{
    make_data();
    cli_result r;
    const char *extra[] = {"--precision", "fp16", "--loss-scale", "1e30", "--no-eval", NULL};
    train(&r, NULL, false, extra);
    if (r.code != 1)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 1);
    ASSERT_STR_CONTAINS(r.err, "static loss scale 1e+30 in 10 optimizer steps in a row");
    /* fewer steps than that, all skipped: not a success either */
    const char *few[] = {"--precision", "fp16", "--loss-scale", "1e30", "--no-eval", "--limit-train", "32", NULL};
    train(&r, NULL, false, few);
    if (r.code != 1)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 1);
    ASSERT_STR_CONTAINS(r.err, "every one of the 4 optimizer steps overflowed");
}

TEST(ranks_with_other_options_refuse)
{
    make_data();
    char script[1400];
    snprintf(script, sizeof script,
             "if [ \"$DT_RANK\" = 1 ]; then lr=0.02; seed=6; else lr=0.05; seed=5; fi; exec \"%s\" train --model "
             "convnet --data '%s' --batch 8 --epochs 1 --progress none --threads 1 --no-eval --lr $lr --seed $seed",
             getenv("DT_CLI"), g_spec);
    char *argv[] = {"run", "-n", "2", "--grace", "1", "--", "/bin/sh", "-c", script, NULL};
    cli_result r;
    cli_runv(&r, 120, NULL, argv);
    if (r.code != 2)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--lr differs on rank 1; --seed differs on rank 1");
    ASSERT(!strstr(r.out, "train loss"));
}

TEST(resume_with_another_seed_warns_and_edited_index_refused)
{
    make_data();
    char dir[512], idx[600];
    snprintf(dir, sizeof dir, "%s/ck", cli_tmpdir());
    const char *first[] = {"--no-eval", "--save", dir, "--max-steps", "3", NULL};
    cli_result r;
    train(&r, NULL, false, first);
    ASSERT_EQ_INT(r.code, 0);
    const char *again[] = {"--no-eval", "--save", dir, "--resume", "auto", "--seed", "7", NULL};
    /* the common --seed 5 comes first; the later --seed 7 wins */
    train(&r, NULL, false, again);
    if (r.code != 0 || !strstr(r.err, "--seed 5"))
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "warning: the checkpoint was trained with --seed 5 --rng torch, this run has "
                               "--seed 7");
    /* the same seed: no warning */
    snprintf(dir, sizeof dir, "%s/ck2", cli_tmpdir());
    const char *f2[] = {"--no-eval", "--save", dir, "--max-steps", "3", NULL};
    train(&r, NULL, false, f2);
    ASSERT_EQ_INT(r.code, 0);
    const char *same[] = {"--no-eval", "--save", dir, "--resume", "auto", "--max-steps", "4", NULL};
    train(&r, NULL, false, same);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strstr(r.err, "warning"));
    /* another --batch with as many batches an epoch (30 items: 4 of 8 or of 9), or another --data (the same
       files under another name): other samples at the saved position, which the run said nothing about */
    char d3[600], other[600], spec[700];
    snprintf(d3, sizeof d3, "%s/ck3", cli_tmpdir());
    const char *f3[] = {"--no-eval", "--save", d3, "--max-steps", "2", "--limit-train", "30", NULL};
    train(&r, NULL, false, f3);
    ASSERT_EQ_INT(r.code, 0);
    const char *b9[] = {"--no-eval", "--save", d3, "--resume", "auto", "--max-steps", "3", "--limit-train", "30",
                        "--batch", "9", NULL};
    train(&r, NULL, false, b9);
    if (r.code != 0 || !strstr(r.err, "--batch 8, this run has --batch 9"))
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "warning: the checkpoint was trained with --batch 8, this run has --batch 9");
    snprintf(other, sizeof other, "%s/mnist-other", cli_tmpdir());
    ASSERT_EQ_INT(symlink(g_spec + 4, other), 0);
    snprintf(spec, sizeof spec, "idx:%s", other);
    const char *od[] = {"--no-eval", "--save", d3, "--resume", "auto", "--max-steps", "4", "--limit-train", "30",
                        "--batch", "9", "--data", spec, NULL};
    train(&r, NULL, false, od);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "warning: the checkpoint was trained with --data idx:");
    ASSERT_STR_CONTAINS(r.err, "mnist-other: weights");
    /* batch 999 in a 20-batch epoch: refused, naming the file and the key */
    snprintf(idx, sizeof idx, "%s/step-00000004/index.json", dir);
    FILE *f = fopen(idx, "r");
    ASSERT(f != NULL);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *b = strstr(text, "\\\"batch\\\":");
    ASSERT(b != NULL);
    char *e = b + strlen("\\\"batch\\\":");
    static char out[1 << 16];
    snprintf(out, sizeof out, "%.*s999%s", (int)(e - text), text, e + strspn(e, "0123456789"));
    f = fopen(idx, "w");
    ASSERT(f != NULL);
    fputs(out, f);
    fclose(f);
    /* named explicitly: refused (exit 2) */
    char ck4[600];
    snprintf(ck4, sizeof ck4, "%s/step-00000004", dir);
    const char *named[] = {"--no-eval", "--save", dir, "--resume", ck4, "--max-steps", "4", NULL};
    train(&r, NULL, false, named);
    if (r.code != 2)
        fprintf(stderr, "exit %d\nstdout:\n%s\nstderr:\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "index.json, metadata \"dtrain.run\"");
    ASSERT_STR_CONTAINS(r.err, "\"batch\" is 999 but \"epoch_batches\" is 20");
    /* under --resume auto the damaged newest one is skipped, with that reason, for the older step 3 */
    train(&r, NULL, false, same);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.err, "\"batch\" is 999 but \"epoch_batches\" is 20");
    ASSERT_STR_CONTAINS(r.err, "trying the older");
    ASSERT_STR_CONTAINS(r.out, "step-00000003");
}

int main(void)
{
    RUN(nan_on_one_rank_stops_every_rank);
    RUN(fp16_skipped_step_keeps_batchnorm);
    RUN(static_loss_scale_overflowing_fails);
    RUN(ranks_with_other_options_refuse);
    RUN(resume_with_another_seed_warns_and_edited_index_refused);
    cli_cleanup();
    return TEST_REPORT();
}
