/* dtrain train's run length, steps, schedules and metrics across resumes
 * as a PyTorch / DeepSpeed / HF Trainer user expects them (issue 32), through
 * the CLI (env DT_CLI) on a tiny MLP over generated data (64 items, batch 8:
 * 8 batches an epoch):
 *   - --max-steps sets the run's length past --epochs (the loader wraps into
 *     further epochs) and the cosine schedule's length;
 *   - "step" is the optimizer step everywhere under --grad-accum (records,
 *     progress, --log-every), the batches are "micro_step";
 *   - a DeepSpeed WarmupLR with warmup_num_steps "auto" (or left out) warms up
 *     over --warmup (default 0), not a silent 1000 steps; without warmup_type
 *     it ramps as DeepSpeed's default "log"; step s trains at the rate of
 *     DeepSpeed's last_batch_iteration s - 1; the effective config shows both;
 *   - a resumed run continues the --metrics history (the records after the
 *     checkpoint's step dropped), and a finished command re-run with --resume
 *     auto says there is nothing to do and touches nothing;
 *   - --betas / --eps reach the optimizer; config refusals come all at once. */
// dt-test-timeout: 300
#include "test.h"
#include "train_cli.h"

static char g_text[1 << 16];

/* dtrain train <tiny mlp> extra... (NULL-terminated), with env (or NULL). */
static int tiny(cli_result *r, const char *env, char *const *extra)
{
    char *args[64] = {"train", "--model", "mlp", "--mlp-dim", "16", "--mlp-hidden", "16", "--random-items", "64",
                      "--batch", "8", "--threads", "1", "--seed", "1", "--limit-test", "16", "--progress", "plain"};
    int n = 19;
    for (int i = 0; extra[i] && n < 63; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cli_runv(r, 120, env, args);
    return r->code;
}

/* The value of "key": in the n-th (0-based) record of event ev in g_text, NAN if none. */
static double field(const char *ev, int nth, const char *key)
{
    char e[64], k[64];
    snprintf(e, sizeof e, "{\"event\":\"%s\"", ev);
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = g_text;
    for (int i = 0; p && i <= nth; i++)
        if ((p = strstr(p, e)) && i < nth)
            p++;
    if (!p)
        return NAN;
    const char *end = strchr(p, '\n'), *v = strstr(p, k);
    return v && (!end || v < end) ? atof(v + strlen(k)) : NAN;
}

static int count(const char *needle)
{
    int n = 0;
    for (const char *p = g_text; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

TEST(max_steps_sets_the_run_past_epochs)
{
    cli_result r;
    char *m = cli_path("len.jsonl");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--max-steps", "20", "--lr-schedule", "cosine", "--log-every", "1",
                                            "--no-eval", "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    /* 20 steps over 3 epochs of 8 (the last one cut at step 20), not 8 steps and a silent stop */
    ASSERT_EQ_INT(count("{\"event\":\"step\""), 20);
    ASSERT_NEAR(field("step", 19, "step"), 20, 0, 0);
    ASSERT_NEAR(field("step", 19, "epoch"), 3, 0, 0);
    ASSERT_NEAR(field("end", 0, "step"), 20, 0, 0);
    ASSERT_STR_CONTAINS(r.out, "epoch 3/3 step 4/8 loss");
    /* the schedule spans --max-steps: step 20 (index 19) is near the floor, cos(pi * 19/20) */
    ASSERT_NEAR(field("start", 0, "total_steps"), 20, 0, 0);
    ASSERT_STR_CONTAINS(r.out, "total_steps 20");
    ASSERT_NEAR(field("step", 19, "lr"), 0.01 * 0.5 * (1 + cos(M_PI * 19 / 20)), 1e-6, 1e-3);
    /* the epochs past --epochs are the same epochs (reshuffled by seed + epoch, as DistributedSampler.set_epoch)
       as a run given --epochs 3: the same losses step for step */
    char *e3 = cli_path("e3.jsonl"), *m20 = cli_path("m20.jsonl");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--epochs", "3", "--log-every", "1", "--no-eval", "--metrics", e3, NULL}),
                  0);
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--max-steps", "20", "--log-every", "1", "--no-eval", "--metrics", m20,
                                            NULL}), 0);
    double l3[64], l20[64];
    int n3 = cli_step_losses(e3, l3, 64), n20 = cli_step_losses(m20, l20, 64);
    ASSERT_EQ_INT(n3, 24);
    ASSERT(cli_same_losses(l3, 20, l20, n20, 0));
    ASSERT(l3[3] != l3[11]); /* epoch 2's batches are not epoch 1's */
    /* and below one epoch it still stops at --max-steps, with the schedule's end there */
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--max-steps", "4", "--epochs", "3", "--lr-schedule", "linear",
                                            "--log-every", "1", "--no-eval", "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    ASSERT_EQ_INT(count("{\"event\":\"step\""), 4);
    ASSERT_NEAR(field("step", 3, "lr"), 0.01 * 1.0 / 4.0, 1e-12, 1e-9); /* linear: (4 - 3) / 4 */
    /* the final line names the steps its mean is over: 4 here, not "last 100 steps" */
    ASSERT_STR_CONTAINS(r.out, "train loss (last 4 steps): ");
    ASSERT(!strstr(r.out, "last 100 steps"));
}

TEST(step_is_the_optimizer_step)
{
    cli_result r;
    char *m = cli_path("accum.jsonl");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--grad-accum", "2", "--max-steps", "10", "--log-every", "5",
                                            "--no-eval", "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    /* 8 batches = 4 optimizer steps an epoch; records every 5 steps and at each epoch's end */
    ASSERT_NEAR(field("end", 0, "step"), 10, 0, 0);
    ASSERT_NEAR(field("step", 0, "step"), 4, 0, 0); /* the end of epoch 1 */
    ASSERT_NEAR(field("step", 0, "micro_step"), 8, 0, 0);
    ASSERT_NEAR(field("step", 1, "step"), 5, 0, 0); /* --log-every 5 counts optimizer steps */
    ASSERT_NEAR(field("step", 1, "epoch_step"), 1, 0, 0);
    ASSERT_NEAR(field("step", 3, "step"), 10, 0, 0);
    ASSERT_NEAR(field("step", 3, "micro_step"), 20, 0, 0);
    ASSERT_EQ_INT(count("{\"event\":\"step\""), 4); /* steps 4, 5, 8, 10 */
    ASSERT(strstr(g_text, "\"step\":20") == NULL);
    ASSERT_STR_CONTAINS(r.out, "epoch 1/3 done: 4 steps");
    ASSERT_STR_CONTAINS(r.out, "epoch 2/3 step 1/4 loss"); /* plain lines: every 5 optimizer steps (step 5) */
    ASSERT_STR_CONTAINS(r.out, "epoch 3/3 step 2/4 loss"); /* step 10 */
}

static char *cfg(const char *name, const char *text)
{
    char *p = cli_path(name);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

TEST(warmup_lr_auto_is_the_flag)
{
    cli_result r;
    char *m = cli_path("warm.jsonl");
    char *c = cfg("warm.json", "{\"scheduler\":{\"type\":\"WarmupLR\",\"params\":{\"warmup_num_steps\":\"auto\","
                               "\"warmup_type\":\"linear\",\"warmup_max_lr\":\"auto\"}}}");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--config", c, "--lr", "1e-3", "--max-steps", "4", "--log-every", "1",
                                            "--no-eval", "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    for (int i = 0; i < 4; i++) /* no warm-up: --warmup's default 0 (it was 0, 1e-06, 2e-06, 3e-06) */
        ASSERT_NEAR(field("step", i, "lr"), 1e-3, 0, 1e-12);
    ASSERT_STR_CONTAINS(r.out, "  scheduler.params.warmup_num_steps = 0  (auto: --warmup)\n");
    ASSERT_STR_CONTAINS(r.out, "  scheduler.params.warmup_max_lr = 0.001  (auto: the optimizer's lr)\n");
    /* --warmup 2 is what "auto" takes; as DeepSpeed's engine steps it, step s trains at last_batch_iteration
       s - 1 (step 0 at warmup_min_lr, 0) */
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--config", c, "--lr", "1e-3", "--warmup", "2", "--max-steps", "4",
                                            "--log-every", "1", "--no-eval", "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    ASSERT_NEAR(field("step", 0, "lr"), 0, 0, 0);
    ASSERT_NEAR(field("step", 1, "lr"), 0, 0, 0);
    ASSERT_NEAR(field("step", 2, "lr"), 5e-4, 0, 1e-12);
    ASSERT_NEAR(field("step", 3, "lr"), 1e-3, 0, 1e-12);
    /* warmup_type left out: DeepSpeed's "log", ln(step + 1) / ln(4), accepted and shown */
    c = cfg("log.json", "{\"scheduler\":{\"type\":\"WarmupLR\",\"params\":{\"warmup_num_steps\":4}}}");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--config", c, "--max-steps", "6", "--log-every", "1", "--no-eval",
                                            "--metrics", m, NULL}), 0);
    slurp_(m, g_text, sizeof g_text);
    ASSERT_STR_CONTAINS(r.out, "  scheduler.params.warmup_type = \"log\"  (default: DeepSpeed WarmupLR's)\n");
    ASSERT_STR_CONTAINS(r.out, "  scheduler.params.warmup_max_lr = 0.001  (default: DeepSpeed WarmupLR's)\n");
    for (int i = 0; i < 6; i++) /* step i at last_batch_iteration i - 1 */
        ASSERT_NEAR(field("step", i, "lr"), i == 0 ? 0 : i <= 4 ? 1e-3 * log((double)i) / log(4.0) : 1e-3, 1e-9,
                    1e-6);
}

TEST(metrics_continue_across_resumes)
{
    cli_result r;
    char *m = cli_path("hist.jsonl"), *save = cli_path("hist_ck"), part[400], copy[400];
    snprintf(part, sizeof part, "%s.partial", m);
    snprintf(copy, sizeof copy, "%s.copy", m);
    char *cmd[] = {"--max-steps", "12", "--log-every", "1", "--save", save, "--save-every", "5", "--resume", "auto",
                   "--metrics", m, NULL};
    /* killed after step 7: its checkpoint is step 5, its records go to step 7 */
    tiny(&r, "DT_FAULT_KILL_STEP=7", cmd);
    ASSERT_EQ_INT(r.code, 128 + SIGKILL);
    slurp_(part, g_text, sizeof g_text);
    ASSERT_NEAR(field("step", 6, "step"), 7, 0, 0);
    /* the restart continues that history: steps 1..12 once each, in order, steps 6 and 7 of the first
       attempt dropped (they were trained again) */
    ASSERT_EQ_INT(tiny(&r, NULL, cmd), 0);
    ASSERT_STR_CONTAINS(r.out, "records up to step 5 kept, 2 after it dropped");
    ASSERT(!file_exists(part));
    slurp_(m, g_text, sizeof g_text);
    ASSERT_EQ_INT(count("{\"event\":\"step\""), 12);
    for (int i = 0; i < 12; i++)
        ASSERT_NEAR(field("step", i, "step"), i + 1, 0, 0);
    ASSERT_EQ_INT(count("{\"event\":\"resume\""), 1);
    ASSERT_NEAR(field("resume", 0, "step"), 5, 0, 0);
    ASSERT_EQ_INT(count("{\"event\":\"start\""), 2); /* each attempt's */
    ASSERT_NEAR(field("end", 0, "step"), 12, 0, 0);
    ASSERT_EQ_INT(count("{\"event\":\"end\""), 1); /* the killed attempt had none */
    /* the finished command again: nothing to do, said so, nothing touched */
    char cp[1200];
    snprintf(cp, sizeof cp, "cp -p '%s' '%s'", m, copy);
    ASSERT_EQ_INT(system(cp), 0);
    ASSERT_EQ_INT(tiny(&r, NULL, cmd), 0);
    ASSERT_STR_CONTAINS(r.out, "nothing to do");
    ASSERT(strstr(r.out, "train loss") == NULL);
    ASSERT(same_file(m, copy));
    ASSERT(!file_exists(part));
    char ck[600];
    snprintf(ck, sizeof ck, "%s/step-00000013", save);
    ASSERT(!file_exists(ck));
    /* a longer run from there continues the finished file */
    char *more[] = {"--max-steps", "14", "--log-every", "1", "--save", save, "--resume", "auto", "--metrics", m,
                    NULL};
    ASSERT_EQ_INT(tiny(&r, NULL, more), 0);
    slurp_(m, g_text, sizeof g_text);
    ASSERT_EQ_INT(count("{\"event\":\"step\""), 14);
    ASSERT_NEAR(field("step", 13, "step"), 14, 0, 0);
}

TEST(betas_eps_and_refusals)
{
    cli_result r;
    char *a = cli_path("b1.jsonl"), *b = cli_path("b2.jsonl"), *c = cli_path("b3.jsonl");
    double la[16], lb[16], lc[16];
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--optimizer", "adam", "--max-steps", "4", "--log-every", "1",
                                            "--no-eval", "--metrics", a, NULL}), 0);
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--optimizer", "adam", "--betas", "0.9,0.999", "--eps", "1e-8",
                                            "--max-steps", "4", "--log-every", "1", "--no-eval", "--metrics", b,
                                            NULL}), 0);
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--optimizer", "adam", "--betas", "0.5,0.6", "--eps", "1e-3",
                                            "--max-steps", "4", "--log-every", "1", "--no-eval", "--metrics", c,
                                            NULL}), 0);
    int na = cli_step_losses(a, la, 16), nb = cli_step_losses(b, lb, 16), nc = cli_step_losses(c, lc, 16);
    ASSERT(cli_same_losses(la, na, lb, nb, 0)); /* the defaults spelled out: the same run */
    ASSERT_EQ_INT(nc, 4);
    ASSERT(la[3] != lc[3]);                     /* other values: another run */
    /* every refused key of a config in one run */
    char *bad = cfg("bad.json", "{\"zero_optimization\":{\"stage\":9},\"gradient_clipping\":\"x\","
                                "\"scheduler\":{\"type\":\"PolynomialLR\"}}");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--config", bad, NULL}), 2);
    ASSERT_EQ_INT(cli_lines(r.err), 1);
    ASSERT_STR_CONTAINS(r.err, "3 keys refused");
    ASSERT_STR_CONTAINS(r.err, "zero_optimization.stage");
    ASSERT_STR_CONTAINS(r.err, "gradient_clipping");
    ASSERT_STR_CONTAINS(r.err, "scheduler.type");
}

/* --limit-train cuts generated data too, as the help and docs/TRAINING.md say (with --data random it was
 * ignored: the 64 items trained whatever N was) */
TEST(limit_train_cuts_random_data)
{
    cli_result r;
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--limit-train", "16", "--no-eval", NULL}), 0);
    ASSERT_STR_CONTAINS(r.out, "on random: 16 items, 2 steps/epoch of 8");
    ASSERT_STR_CONTAINS(r.out, "epoch 1/1 done: 2 steps");
    ASSERT_EQ_INT(tiny(&r, NULL, (char *[]){"--limit-train", "100", "--no-eval", NULL}), 0); /* more: all 64 */
    ASSERT_STR_CONTAINS(r.out, "on random: 64 items, 8 steps/epoch of 8");
}

int main(void)
{
    RUN(max_steps_sets_the_run_past_epochs);
    RUN(step_is_the_optimizer_step);
    RUN(warmup_lr_auto_is_the_flag);
    RUN(metrics_continue_across_resumes);
    RUN(betas_eps_and_refusals);
    RUN(limit_train_cuts_random_data);
    int rc = TEST_REPORT();
    cli_cleanup();
    return rc;
}
