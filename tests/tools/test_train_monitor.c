/* dtrain train's monitors: --tensorboard DIR and the config's "csv_monitor"
 * block write DeepSpeed's tags after every optimizer step, at the samples
 * trained over all replicas: Train/Samples/train_loss equal to the --metrics
 * step records' loss (as a float), Train/Samples/lr the next step's rate
 * (the linear schedule's), Train/Samples/eval_loss after the evaluation;
 * a resumed run continues at the checkpoint's samples; with two ranks one
 * set of CSV files (rank 0's); one evaluation per step; wall_clock_breakdown's
 * line and tags. */
// dt-test-timeout: 300
#include "test.h"
#include "train_cli.h"

#include <dirent.h>

typedef struct {
    char tag[64];
    int64_t step;
    float value;
} scalar;

/* The scalars of the one event file in dir (after its version record); -1
 * when there is not exactly one file or a record is malformed. */
static int read_events(const char *dir, scalar *out, int cap)
{
    DIR *d = opendir(dir);
    char path[600] = "";
    int files = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20) && ++files)
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (d)
        closedir(d);
    static unsigned char b[1 << 16];
    FILE *f = files == 1 ? fopen(path, "rb") : NULL;
    if (!f)
        return -1;
    size_t n = fread(b, 1, sizeof b, f), i = 0;
    fclose(f);
    int k = 0;
    while (i + 16 <= n) {
        uint64_t len = 0;
        for (int j = 0; j < 8; j++)
            len |= (uint64_t)b[i + j] << (8 * j);
        if (i + 16 + len > n)
            return -1;
        const unsigned char *p = b + i + 12, *end = p + len;
        scalar s = {.step = 0};
        bool has = false;
        while (p < end) { /* Event fields: 1 wall_time, 2 step, 3 file_version, 5 summary */
            const int key = *p++;
            if (key == 0x09) {
                p += 8;
            } else if (key == 0x10) {
                int sh = 0;
                do
                    s.step |= (int64_t)(*p & 0x7f) << sh, sh += 7;
                while (*p++ & 0x80);
            } else if (key == 0x1a) {
                p += 1 + *p;
            } else if (key == 0x2a) { /* summary { value { tag, simple_value } } (lengths < 128 here) */
                const unsigned char *v = p + 3; /* after: its length, the value key, its length */
                const int tl = v[1];
                if (v[0] != 0x0a || tl >= (int)sizeof s.tag || v[2 + tl] != 0x15)
                    return -1;
                memcpy(s.tag, v + 2, (size_t)tl);
                s.tag[tl] = 0;
                memcpy(&s.value, v + 3 + tl, 4);
                has = true;
                p = end;
            } else {
                return -1;
            }
        }
        if (has && k < cap)
            out[k++] = s;
        i += 16 + len;
    }
    return k;
}

static int pick(const scalar *s, int n, const char *tag, scalar *out, int cap)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].tag, tag) && k < cap)
            out[k++] = s[i];
    return k;
}

#define MLP "train", "--model", "mlp", "--data", "random", "--random-items", "40", "--limit-test", "8", "--batch", \
            "8", "--mlp-dim", "16", "--mlp-hidden", "16", "--optimizer", "adamw", "--lr", "0.01", "--lr-schedule", \
            "linear", "--progress", "none", "--threads", "1"

TEST(tensorboard_flag)
{
    cli_result r;
    char *tb = cli_path("tb"), *met = cli_path("m.jsonl");
    cli_runv(&r, 120, NULL,
             (char *[]){MLP, "--max-steps", "4", "--log-every", "1", "--metrics", met, "--tensorboard", tb, NULL});
    ASSERT_EQ_INT(r.code, 0);
    scalar all[64], loss[8], lr[8], ev[8];
    int n = read_events(tb, all, 64);
    ASSERT(n > 0);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/train_loss", loss, 8), 4);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/lr", lr, 8), 4);
    ASSERT(pick(all, n, "Train/Samples/eval_loss", ev, 8) >= 1);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/loss_scale", ev + 4, 4), 0); /* f32: no scaler */
    double want[8];
    ASSERT_EQ_INT(cli_step_losses(met, want, 8), 4);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ_INT(loss[i].step, 8 * (i + 1)); /* samples: 8 a step */
        ASSERT_EQ_INT(lr[i].step, 8 * (i + 1));
        ASSERT_NEAR(loss[i].value, want[i], 2e-6, 1e-6);
        ASSERT_NEAR(lr[i].value, 0.01 * (3 - i) / 4.0, 1e-9, 1e-6); /* the next step's: linear to 0 over 4 */
    }
    ASSERT_EQ_INT(ev[0].step, 32);
    ASSERT(isfinite(ev[0].value)); /* (the MLP's loss on random data may be negative) */
    /* bad input: a file where the directory goes, exit 2 naming it */
    char *file = cli_path("m.jsonl");
    cli_runv(&r, 60, NULL, (char *[]){MLP, "--max-steps", "1", "--tensorboard", file, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tensorboard");
    ASSERT_STR_CONTAINS(r.err, "not a directory");
}

TEST(resume_continues_samples)
{
    cli_result r;
    char *run = cli_path("run"), *tb1 = cli_path("tb1"), *tb2 = cli_path("tb2");
    cli_runv(&r, 120, NULL, (char *[]){MLP, "--max-steps", "2", "--save", run, "--tensorboard", tb1, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 120, NULL,
             (char *[]){MLP, "--max-steps", "4", "--save", run, "--resume", run, "--tensorboard", tb2, NULL});
    ASSERT_EQ_INT(r.code, 0);
    scalar all[64], loss[8];
    int n = read_events(tb2, all, 64);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/train_loss", loss, 8), 2);
    ASSERT_EQ_INT(loss[0].step, 24); /* the checkpoint's 16 samples, then a step of 8 */
    ASSERT_EQ_INT(loss[1].step, 32);
}

TEST(csv_monitor_two_ranks)
{
    cli_result r;
    char *cfg = cli_path("ds.json"), *out = cli_path("mon");
    FILE *f = fopen(cfg, "w");
    ASSERT(f);
    fprintf(f, "{\"train_micro_batch_size_per_gpu\": 4, \"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s\", "
               "\"job_name\": \"j\"}}", out);
    fclose(f);
    char *const opts[] = {"train", "--model", "mlp", "--data", "random", "--random-items", "40", "--limit-test", "8",
                          "--mlp-dim", "16", "--mlp-hidden", "16", "--optimizer", "sgd", "--lr", "0.01", "--progress",
                          "none", "--threads", "1", "--no-eval", "--max-steps", "3", "--config", cfg, NULL};
    char *const *lists[] = {opts};
    cli_run_ranks(&r, 180, NULL, 2, 1, lists);
    ASSERT_EQ_INT(r.code, 0);
    char path[400], text[512];
    snprintf(path, sizeof path, "%s/j/Train_Samples_train_loss.csv", out);
    f = fopen(path, "rb");
    ASSERT(f);
    size_t k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[k] = 0;
    ASSERT(!strncmp(text, "step,train_loss\r\n8,", 19)); /* two ranks of 4: 8 samples a step */
    ASSERT_STR_CONTAINS(text, "\r\n16,");
    ASSERT_STR_CONTAINS(text, "\r\n24,");
    ASSERT_EQ_INT(cli_lines(text), 4); /* the header and 3 steps: one rank wrote */
    snprintf(path, sizeof path, "%s/j/Train_Samples_lr.csv", out);
    ASSERT(access(path, F_OK) == 0);
}

/* A FIFO at a CSV file's name: refused at once, exit 2 naming it, the FIFO left (the open for appending blocked
 * for ever waiting for a reader) */
TEST(csv_monitor_fifo_refused)
{
    cli_result r;
    char *cfg = cli_path("fifo.json"), *out = cli_path("monfifo");
    char dir[400], fifo[450];
    snprintf(dir, sizeof dir, "%s/j", out);
    snprintf(fifo, sizeof fifo, "%s/Train_Samples_train_loss.csv", dir);
    ASSERT_EQ_INT(mkdir(out, 0700), 0);
    ASSERT_EQ_INT(mkdir(dir, 0700), 0);
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    FILE *f = fopen(cfg, "w");
    ASSERT(f);
    fprintf(f, "{\"train_micro_batch_size_per_gpu\": 4, \"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s\", "
               "\"job_name\": \"j\"}}", out);
    fclose(f);
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "mlp", "--data", "random", "--random-items", "40", "--limit-test", "8",
                        "--mlp-dim", "16", "--mlp-hidden", "16", "--threads", "1", "--progress", "none", "--no-eval",
                        "--max-steps", "3", "--config", cfg, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "Train_Samples_train_loss.csv");
    ASSERT_STR_CONTAINS(r.err, "not a regular file");
    struct stat st;
    ASSERT_EQ_INT(lstat(fifo, &st), 0);
    ASSERT(S_ISFIFO(st.st_mode));
}

/* wall_clock_breakdown: DeepSpeed's timing line after every step and its
 * elapsed_time_ms_* tags, backward = backward_inner + backward_allreduce */
TEST(wall_clock_breakdown)
{
    cli_result r;
    char *cfg = cli_path("wcb.json"), *tb = cli_path("tb_wcb");
    FILE *f = fopen(cfg, "w");
    ASSERT(f);
    fprintf(f, "{\"wall_clock_breakdown\": true, \"tensorboard\": {\"enabled\": true, \"output_path\": \"%s\", "
               "\"job_name\": \"\"}}", tb);
    fclose(f);
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "mlp", "--data", "random", "--random-items", "40", "--limit-test", "8",
                        "--batch", "8", "--mlp-dim", "16", "--mlp-hidden", "16", "--threads", "1", "--progress",
                        "plain", "--no-eval", "--max-steps", "3", "--config", cfg, NULL});
    ASSERT_EQ_INT(r.code, 0);
    int lines = 0;
    for (const char *p = r.out; (p = strstr(p, "time (ms) | fwd: ")); p++)
        lines++;
    ASSERT_EQ_INT(lines, 3);
    ASSERT_STR_CONTAINS(r.out, " | bwd_inner: ");
    scalar all[64], bwd[4], inner[4], wait[4], step[4];
    int n = read_events(tb, all, 64);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/elapsed_time_ms_backward", bwd, 4), 3);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/elapsed_time_ms_backward_inner", inner, 4), 3);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/elapsed_time_ms_backward_allreduce", wait, 4), 3);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/elapsed_time_ms_step", step, 4), 3);
    for (int i = 0; i < 3; i++) {
        ASSERT_NEAR(bwd[i].value, inner[i].value + wait[i].value, 1e-3, 1e-5);
        ASSERT(inner[i].value > 0 && step[i].value > 0);
    }
}

/* --eval-every N whose last evaluation falls on the run's last step: one
 * evaluation there, not two (the end of the run evaluated the same weights
 * again, a second eval record and a second eval_loss point) */
TEST(one_eval_per_step)
{
    cli_result r;
    char *tb = cli_path("tb_eval"), *met = cli_path("m_eval.jsonl");
    cli_runv(&r, 120, NULL,
             (char *[]){MLP, "--max-steps", "4", "--eval-every", "2", "--metrics", met, "--tensorboard", tb, NULL});
    ASSERT_EQ_INT(r.code, 0);
    scalar all[64], ev[8];
    int n = read_events(tb, all, 64);
    ASSERT_EQ_INT(pick(all, n, "Train/Samples/eval_loss", ev, 8), 2);
    ASSERT_EQ_INT(ev[0].step, 16);
    ASSERT_EQ_INT(ev[1].step, 32);
    char text[8192];
    FILE *f = fopen(met, "r");
    ASSERT(f);
    size_t k = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[k] = 0;
    int evals = 0;
    for (char *p = text; (p = strstr(p, "\"event\":\"eval\"")); p++)
        evals++;
    ASSERT_EQ_INT(evals, 2);
}

int main(void)
{
    RUN(tensorboard_flag);
    RUN(resume_continues_samples);
    RUN(csv_monitor_two_ranks);
    RUN(csv_monitor_fifo_refused);
    RUN(one_eval_per_step);
    RUN(wall_clock_breakdown);
    cli_cleanup();
    return TEST_REPORT();
}
