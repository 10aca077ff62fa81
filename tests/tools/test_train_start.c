/* What dtrain train says at start: the time to the first step, and
 * --precision auto and the config's "bf16": {"enabled": "auto"}: bf16 where
 * the CPU has AVX512_BF16 (and oneDNN runs bf16 natively), fp32 elsewhere,
 * printed at start. Each ISA path is forced with the caps: DT_MAX_CPU_ISA
 * (dtrain's kernels) and ONEDNN_MAX_CPU_ISA (oneDNN's); the bf16 path
 * needs a CPU with AVX512_BF16 (skipped elsewhere, the fp32 ones run). */
// dt-test-timeout: 300
#include "dtrain/base.h"
#include "dtrain/config.h"
#include "dtrain/train.h"
#include "dtrain/precision.h"
#include "test.h"
#include "train_cli.h"

static cli_result g_r;

static char *const k_train[] = {"train", "--model", "mlp", "--data", "random", "--random-items", "16", "--batch", "8",
                                "--epochs", "1", "--no-eval", "--threads", "1", NULL};

/* dtrain train with extra options under the environment env; its output. */
static const char *train(const char *env, char *const *extra)
{
    char *args[40];
    int n = 0;
    for (int i = 0; k_train[i]; i++)
        args[n++] = k_train[i];
    for (int i = 0; extra && extra[i]; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    cli_runv(&g_r, 120, env, args);
    return g_r.out;
}

static bool hw_bf16(void) { return dt_cpu_detect_hw().avx512_bf16; }

TEST(cli_caps_choose_each_path)
{
    /* capped at AVX2: fp32, and the line says why */
    train("DT_MAX_CPU_ISA=avx2", (char *[]){"--precision", "auto", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, hw_bf16() ? "precision auto: fp32 (AVX512_BF16 switched off by DT_MAX_CPU_ISA)"
                                           : "precision auto: fp32 (no AVX512_BF16 on this CPU)");
    if (!hw_bf16()) {
        train(NULL, (char *[]){"--precision", "auto", NULL});
        ASSERT_STR_CONTAINS(g_r.out, "precision auto: fp32 (no AVX512_BF16 on this CPU)");
        DT_TEST_SKIP("no AVX512_BF16 on this CPU: the bf16 path is not reachable");
    }
    train(NULL, (char *[]){"--precision", "auto", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "precision auto: bf16 (this CPU has AVX512_BF16)");
    /* oneDNN capped below bf16: its matmuls would widen to f32, so fp32 */
    train("ONEDNN_MAX_CPU_ISA=AVX2", (char *[]){"--precision", "auto", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "precision auto: fp32 (oneDNN runs no native bf16 matmul here");
    /* an explicit precision prints no such line, and no widening notice where bf16 is native */
    train(NULL, (char *[]){"--precision", "bf16", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT(!strstr(g_r.out, "precision auto"));
    ASSERT(!strstr(g_r.out, "widen"));
}

/* An explicit bf16 or fp16 where no native matmul of it runs says at start
 * that its products widen to f32 (oneDNN capped below bf16 forces that on
 * every CPU); fp32 says nothing of it. */
TEST(cli_widening_notice)
{
    train("ONEDNN_MAX_CPU_ISA=AVX2", (char *[]){"--precision", "bf16", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "precision bf16: no native bf16 matmul here, its products widen to f32 exactly");
    train("ONEDNN_MAX_CPU_ISA=AVX2", (char *[]){"--precision", "fp32", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT(!strstr(g_r.out, "widen"));
}

TEST(config_auto)
{
    char path[512];
    snprintf(path, sizeof path, "%s/auto.json", cli_tmpdir());
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs("{\"bf16\": {\"enabled\": \"auto\"}}\n", f);
    fclose(f);
    train("DT_MAX_CPU_ISA=avx2", (char *[]){"--config", path, NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "precision auto: fp32 (");
    if (hw_bf16()) {
        train(NULL, (char *[]){"--config", path, NULL});
        ASSERT_EQ_INT(g_r.code, 0);
        ASSERT_STR_CONTAINS(g_r.out, "precision auto: bf16 (this CPU has AVX512_BF16)");
        /* the command line is stronger than the file */
        train(NULL, (char *[]){"--config", path, "--precision", "fp32", NULL});
        ASSERT_EQ_INT(g_r.code, 0);
        ASSERT(!strstr(g_r.out, "precision auto"));
    }
    /* in the library: the config layer says "auto" (DT_DTYPE_UNSET), the trainer's config resolves it as
       dt_precision_auto does */
    dt_config *c = NULL;
    ASSERT_OK(dt_config_init(&c));
    ASSERT_OK(dt_config_load_file(c, path));
    ASSERT(dt_config_is_auto(c, "bf16.enabled"));
    ASSERT(!dt_config_is_auto(c, "fp16.enabled"));
    dt_dtype dt = DT_F16;
    ASSERT_OK(dt_config_precision(c, &dt));
    ASSERT_EQ_INT(dt, DT_DTYPE_UNSET);
    dt_trainer_params tp = dt_trainer_params_default();
    ASSERT_OK(dt_trainer_params_apply_config(c, &tp));
    ASSERT_EQ_INT(tp.precision.param_dtype, dt_precision_auto(NULL));
    dt_precision_policy p;
    ASSERT_OK(dt_precision_policy_parse("auto", &p));
    ASSERT_EQ_INT(p.param_dtype, dt_precision_auto(NULL));
    dt_config_free(c);
}

/* "first step done X s after start (the step, data loading included: Y s)",
 * once, before the epoch's summary, with 0 < Y <= X; not with --progress none. */
TEST(first_step_time)
{
    train(NULL, (char *[]){"--progress", "plain", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    const char *p = strstr(g_r.out, "first step done ");
    ASSERT(p);
    ASSERT(!strstr(p + 1, "first step done"));
    double x = atof(p + strlen("first step done "));
    const char *q = strstr(p, "data loading included: ");
    ASSERT(q);
    double y = atof(q + strlen("data loading included: "));
    ASSERT(y > 0 && y <= x + 0.01);
    ASSERT(strstr(g_r.out, "epoch 1/1 done") > p);
    train(NULL, (char *[]){"--progress", "none", NULL});
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT(!strstr(g_r.out, "first step done"));
}

int main(void)
{
    RUN(first_step_time);
    RUN(cli_caps_choose_each_path);
    RUN(cli_widening_notice);
    RUN(config_auto);
    cli_cleanup();
    return TEST_REPORT();
}
