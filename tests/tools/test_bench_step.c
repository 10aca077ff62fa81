/* `dtrain bench step` smoke test: tiny runs of both models print one JSON
 * object each with the fields the docs promise; bad options are rejected.
 * Timings are not checked (tests never depend on speed). */
#include "dtrain/base.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int run(const char *args, char *out, size_t cap)
{
    const char *cli = getenv("DT_CLI");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench step %s 2>&1", cli ? cli : DT_BINARY_DIR "/dtrain", args);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(json_per_model)
{
    static char out[8192];
    ASSERT_EQ_INT(run("--model convnet,mlp --batch 1 --steps 2 --warmup 0 --threads 1 --peak-reps 0 --json", out,
                      sizeof out), 0);
    const char *c = strstr(out, "\"model\":\"convnet\""), *m = strstr(out, "\"model\":\"mlp\"");
    ASSERT(c && m);
    const char *keys[] = {"\"median_ms\":", "\"samples_per_s\":", "\"gflops\":", "\"pct_of_peak\":",
                          "\"forward_ms\":", "\"backward_ms\":", "\"optimizer_ms\":", "\"threads\":1",
                          "\"first_step_ms\":", "\"first_over_median\":", "\"page_faults_per_step\":",
                          "\"first_step_page_faults\":", "\"first_step_cpu_ms\":", "\"warmup\":0,"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ASSERT_STR_CONTAINS(c, keys[i]);
    /* one line per result */
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    ASSERT_EQ_INT(lines, 2);
    /* the mlp's 1-sample step is 5 * 2*128*1024*4096 FLOPs */
    ASSERT_STR_CONTAINS(m, "\"gflop_per_step\":5.3687");
}

/* GPT models: token inputs, AdamW, --seq; 3 x (2 T (L 12 C^2 + V C) + 4 L T^2 C)
 * FLOPs per sample for gpt-micro (L 2, C 64, V 512) at T 16, batch 2. */
TEST(gpt_tokens)
{
    static char out[4096];
    ASSERT_EQ_INT(run("--model gpt-micro --batch 2 --seq 16 --steps 1 --warmup 0 --threads 1 --peak-reps 0 --json",
                      out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "\"model\":\"gpt-micro\",\"batch\":2,\"seq\":16,\"optimizer\":\"adamw\"");
    ASSERT_STR_CONTAINS(out, "\"gflop_per_step\":0.0260");
    ASSERT_EQ_INT(run("--model gpt-micro --seq 65 --steps 1 --peak-reps 0", out, sizeof out), 2); /* bad input */
    ASSERT_STR_CONTAINS(out, "block size");
}

/* --precision bf16 / fp16: the run trains (a finite loss close to the f32
 * run's from the same weights and batch) and says which precision ran. */
static double json_num(const char *s, const char *key)
{
    const char *p = strstr(s, key);
    return p ? atof(p + strlen(key)) : NAN;
}

TEST(precision)
{
    static char out[4096];
    const char *base = "--model gpt-micro --batch 2 --seq 16 --steps 1 --warmup 0 --threads 1 --peak-reps 0 --json";
    char args[512];
    ASSERT_EQ_INT(run(base, out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "\"precision\":\"fp32\",\"native_lowp\":true");
    double l32 = json_num(out, "\"loss\":");
    ASSERT(isfinite(l32) && l32 > 1.0);
    const char *lp[2] = {"bf16", "fp16"};
    const double tol[2] = {0.02, 0.005}; /* relative, bf16's 8-bit and fp16's 11-bit mantissa */
    for (int k = 0; k < 2; k++) {
        snprintf(args, sizeof args, "%s --precision %s", base, lp[k]);
        ASSERT_EQ_INT(run(args, out, sizeof out), 0);
        char want[64];
        snprintf(want, sizeof want, "\"precision\":\"%s\"", lp[k]);
        ASSERT_STR_CONTAINS(out, want);
        double l = json_num(out, "\"loss\":");
        ASSERT(isfinite(l));
        ASSERT(fabs(l - l32) <= tol[k] * l32);
    }
    snprintf(args, sizeof args, "%s --precision bf16", "--model gpt-micro --batch 1 --seq 8 --steps 1 --warmup 0 "
             "--threads 1 --peak-reps 0");
    ASSERT_EQ_INT(run(args, out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "gpt-micro bf16 batch 1");
    ASSERT_EQ_INT(run("--precision fp8 --steps 1 --peak-reps 0", out, sizeof out), 2);
    ASSERT_STR_CONTAINS(out, "fp8");
}

/* The default warm-up (auto) runs 2 to 10 steps, reports how many, and the
 * first step apart from the steady state; an explicit count is kept. */
TEST(warmup_auto)
{
    static char out[4096];
    ASSERT_EQ_INT(run("--model mlp --batch 1 --steps 2 --threads 1 --peak-reps 0 --json", out, sizeof out), 0);
    double w = json_num(out, "\"warmup\":"), f = json_num(out, "\"first_step_ms\":");
    ASSERT(w >= 2 && w <= 10);
    ASSERT(f > 0);
    ASSERT(json_num(out, "\"page_faults_per_step\":") >= 0);
    ASSERT_EQ_INT(run("--model mlp --batch 1 --steps 1 --warmup auto --threads 1 --peak-reps 0 --json", out,
                      sizeof out), 0);
    ASSERT(json_num(out, "\"warmup\":") >= 2);
    ASSERT_EQ_INT(run("--model mlp --batch 1 --steps 1 --warmup 1 --threads 1 --peak-reps 0 --json", out,
                      sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "\"warmup\":1,");
    ASSERT_EQ_INT(run("--model mlp --batch 1 --steps 1 --warmup 0 --threads 1 --peak-reps 0", out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "first step");
}

/* The peak a step is set against is measured in the step's precision: a
 * bf16 GPT step's on its own bf16 GEMMs (the 15 of gpt-micro: 4 projections
 * x forward, input and weight gradient, and the LM head's 3; their work is
 * 6 B T (12 L C^2 + V C)), an f32 step's on its f32 GEMMs, a ConvNet's
 * on an n^3 product of its dtype; pct_of_peak is gflops against that
 * figure. Speeds are not checked. */
static void check_peak(const char *args, const char *kind, int shapes, const char *gemm_gflop)
{
    static char out[8192];
    char want[64];
    ASSERT_EQ_INT(run(args, out, sizeof out), 0);
    snprintf(want, sizeof want, "\"peak_kind\":\"%s\"", kind);
    ASSERT_STR_CONTAINS(out, want);
    snprintf(want, sizeof want, "\"peak_shapes\":%d,", shapes);
    ASSERT_STR_CONTAINS(out, want);
    if (gemm_gflop)
        ASSERT_STR_CONTAINS(out, gemm_gflop);
    double peak = json_num(out, "\"peak_gflops\":"), g = json_num(out, "\"gflops\":");
    double pct = json_num(out, "\"pct_of_peak\":"), ms = json_num(out, "\"peak_gemm_ms\":");
    ASSERT(peak > 0 && g > 0 && (strstr(kind, "step shapes") ? ms > 0 : ms == 0));
    /* gflops, peak_gflops and pct_of_peak are each printed to 0.1 */
    ASSERT(pct >= 100.0 * (g - 0.05) / (peak + 0.05) - 0.051 && pct <= 100.0 * (g + 0.05) / (peak - 0.05) + 0.051);
}

TEST(peak_in_step_precision)
{
    const char *gpt = "--model gpt-micro --batch 2 --seq 16 --steps 1 --warmup 0 --threads 1 --peak-reps 1 --json";
    char args[512];
    /* 6 * 32 * (12 * 2 * 64^2 + 512 * 64) = 25165824 */
    snprintf(args, sizeof args, "%s --precision bf16", gpt);
    check_peak(args, "bf16 step shapes", 15, "\"peak_gemm_gflop\":0.0252,");
    snprintf(args, sizeof args, "%s --precision bf16 --prepare off --lm-loss unfused", gpt);
    check_peak(args, "bf16 step shapes", 15, "\"peak_gemm_gflop\":0.0252,");
    check_peak(gpt, "f32 step shapes", 15, "\"peak_gemm_gflop\":0.0252,");
    /* the MLP is GEMMs only: its step's work, 5.3687 GFLOP a sample, is its GEMMs' */
    check_peak("--model mlp --batch 1 --steps 1 --warmup 0 --threads 1 --peak-reps 1 --precision bf16 --json",
               "bf16 step shapes", 5, "\"peak_gemm_gflop\":5.3687,");
    /* the ConvNet's GEMMs (its classifier) are not its work: a 2048^3 product */
    check_peak("--model convnet --batch 1 --steps 1 --warmup 0 --threads 1 --peak-reps 1 --json", "f32 2048^3", 1,
               NULL);
    check_peak("--model convnet --batch 1 --steps 1 --warmup 0 --threads 1 --peak-reps 1 --json --precision bf16",
               "bf16 2048^3", 1, "\"peak_gemm_gflop\":0.0000,");
    /* no peak asked for: none measured, none claimed */
    static char out[8192];
    snprintf(args, sizeof args, "%s --peak-reps 0 --precision bf16", gpt);
    ASSERT_EQ_INT(run(args, out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "\"peak_gflops\":0.0,\"peak_kind\":\"none\",\"peak_shapes\":0,");
    ASSERT_STR_CONTAINS(out, "\"pct_of_peak\":0.0,");
    /* the text form names the kind */
    ASSERT_EQ_INT(run("--model gpt-micro --batch 1 --seq 8 --steps 1 --warmup 0 --threads 1 --peak-reps 1 "
                      "--precision bf16", out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "GFLOP/s matmul peak (bf16 step shapes;");
    const char *bad[] = {"-1", "1001", "2x", "", "nan"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "--model mlp --steps 1 --peak-reps '%s'", bad[i]);
        ASSERT_EQ_INT(run(args, out, sizeof out), 2);
        ASSERT_STR_CONTAINS(out, "--peak-reps");
    }
}

/* --peak-detail: one line per distinct GEMM of the peak (gpt-micro's 15),
 * each with its time, rate and share of the GEMMs' time (the shares add up
 * to the whole) and its time a call inside the recorded step; those times
 * times the counts add up to the summary line's and to step_gemm_ms.
 * Without a peak (--peak-reps 0) there is nothing to detail. */
TEST(peak_detail)
{
    static char out[16384];
    ASSERT_EQ_INT(run("--model gpt-micro --batch 2 --seq 16 --steps 1 --warmup 0 --threads 1 --peak-reps 1 "
                      "--precision bf16 --peak-detail --json", out, sizeof out), 0);
    int lines = 0;
    double share = 0, in_step = 0;
    for (const char *p = strstr(out, "peak "); p; p = strstr(p + 1, "peak ")) {
        int i = -1;
        double pct = -1;
        const char *of = strstr(p, "% of the GEMMs' time");
        if (sscanf(p, "peak %d:", &i) != 1 || !of)
            continue;
        const char *q = of;
        while (q > p && q[-1] != ' ')
            q--;
        ASSERT(sscanf(q, "%lf", &pct) == 1 && pct >= 0 && pct <= 100);
        long long count = 0;
        double call_ms = -1, ratio = -1;
        const char *x = strstr(p, " x"), *in = strstr(p, "; in the step "), *eol = strchr(p, '\n');
        ASSERT(x && sscanf(x, " x%lld:", &count) == 1 && count > 0);
        ASSERT(in && eol && in < eol && sscanf(in, "; in the step %lf ms a call (%lfx)", &call_ms, &ratio) == 2);
        ASSERT(call_ms > 0 && ratio > 0);
        in_step += (double)count * call_ms;
        ASSERT_EQ_INT(i, lines);
        lines++, share += pct;
    }
    ASSERT_EQ_INT(lines, 15);
    ASSERT(fabs(share - 100.0) < 0.1 * 15); /* each share printed to 0.1 */
    ASSERT_STR_CONTAINS(out, "\"peak_shapes\":15,");
    double total = -1, json_ms = -1;
    const char *sum = strstr(out, "peak: the GEMMs took "), *js = strstr(out, "\"step_gemm_ms\":");
    ASSERT(sum && sscanf(sum, "peak: the GEMMs took %lf ms inside the recorded step", &total) == 1);
    ASSERT(js && sscanf(js, "\"step_gemm_ms\":%lf", &json_ms) == 1);
    ASSERT(total > 0 && fabs(json_ms - total) < 1e-3 + 1e-6 * total);
    ASSERT(fabs(in_step - total) < 15 * 0.5e-3 * 20 + 1e-3 * total); /* lines printed to 1 us a call */
    ASSERT_EQ_INT(run("--model gpt-micro --batch 2 --seq 16 --steps 1 --warmup 0 --threads 1 --peak-reps 0 "
                      "--peak-detail --json", out, sizeof out), 0);
    ASSERT(strstr(out, "of the GEMMs' time") == NULL);
}

TEST(bad_options)
{
    static char out[4096];
    ASSERT_EQ_INT(run("--model resnet --steps 1 --peak-reps 0", out, sizeof out), 2); /* bad input: was 1 */
    ASSERT_STR_CONTAINS(out, "resnet");
    ASSERT_EQ_INT(run("--bogus", out, sizeof out), 2);
    ASSERT_EQ_INT(run("--steps 0", out, sizeof out), 2);
    ASSERT_EQ_INT(run("--warmup -2 --steps 1 --peak-reps 0", out, sizeof out), 2);
    /* numbers read strictly: atoi took "abc" and "0" as the default batch (a run of 100), "12x" as 12 */
    const char *bad[][2] = {
        {"--batch abc", "--batch: 'abc' is not an integer"}, {"--batch 0", "--batch: 0 is out of range"},
        {"--seq 12x", "--seq: '12x' is not an integer"},     {"--threads -1", "--threads: -1 is out of range"},
        {"--tp x", "--tp: 'x' is not an integer"},            {"--warmup 1.5", "--warmup: '1.5' is not an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_EQ_INT(run(bad[i][0], out, sizeof out), 2);
        ASSERT_STR_CONTAINS(out, bad[i][1]);
    }
    /* the other suites alike (run() prefixes "bench step": these name their suite themselves) */
    const char *cli = getenv("DT_CLI") ? getenv("DT_CLI") : DT_BINARY_DIR "/dtrain";
    const char *other[][2] = {
        {"matmul --size 12x", "dtrain bench matmul: --size: '12x' is not an integer"},
        {"matmul --threads abc", "dtrain bench matmul: --threads: 'abc' is not an integer"},
        {"data --batch abc", "dtrain bench data: --batch: 'abc' is not an integer"},
        {"data --compute-ms nan", "dtrain bench data: --compute-ms: 'nan' is not a finite number"},
        {"ddp --bucket-mb x", "dtrain bench ddp: --bucket-mb: 'x' is not a finite number"},
        {"ddp --threads 2x", "dtrain bench ddp: --threads: '2x' is not an integer"},
    };
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "%s bench %s 2>&1", cli, other[i][0]);
        FILE *f = popen(cmd, "r");
        ASSERT(f != NULL);
        size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        int st = pclose(f);
        ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 2);
        ASSERT_STR_CONTAINS(out, other[i][1]);
    }
    ASSERT_EQ_INT(run("--help", out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "--model");
}

/* The OpenMP waiting policy the run had: dtrain's default from the load
 * at start (DT_LOADAVG stands in for it), or what the environment set. */
TEST(omp_wait_reported)
{
    static char out[8192];
    const char *args = "--model mlp --batch 1 --steps 1 --warmup 0 --threads 1 --peak-reps 0 --json";
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT") || getenv("DT_OMP_WAIT"))
        DT_TEST_SKIP("OpenMP's waiting is set in this environment: dtrain's default is not checked");
    setenv("DT_LOADAVG", "1000", 1);
    int rc = run(args, out, sizeof out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_STR_CONTAINS(out, "\"omp_wait\":\"passive\",\"cpu\":");
    setenv("DT_LOADAVG", "0", 1);
    rc = run(args, out, sizeof out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_STR_CONTAINS(out, "\"omp_wait\":\"GOMP_SPINCOUNT=10000\",\"cpu\":");
    unsetenv("DT_LOADAVG");
    setenv("OMP_WAIT_POLICY", "active", 1);
    rc = run(args, out, sizeof out);
    unsetenv("OMP_WAIT_POLICY");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_STR_CONTAINS(out, "\"omp_wait\":\"active\",\"cpu\":");
    setenv("OMP_WAIT_POLICY", "a\"b", 1); /* the user's text, kept valid JSON */
    rc = run(args, out, sizeof out);
    unsetenv("OMP_WAIT_POLICY");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_STR_CONTAINS(out, "\"omp_wait\":\"a?b\",\"cpu\":");
    char cpu[160], want[200]; /* and the machine the figures come from (dtrain info's cpu line) */
    snprintf(want, sizeof want, "\"cpu\":\"%s\"}", dt_cpu_model_str(cpu, sizeof cpu));
    ASSERT_STR_CONTAINS(out, want);
}

int main(void)
{
    RUN(json_per_model);
    RUN(gpt_tokens);
    RUN(precision);
    RUN(warmup_auto);
    RUN(peak_in_step_precision);
    RUN(peak_detail);
    RUN(bad_options);
    RUN(omp_wait_reported);
    return TEST_REPORT();
}
