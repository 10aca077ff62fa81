/* `dtrain bench matmul --gpt2` end to end on a tiny GPT-2 (2 layers, width
 * 64, vocabulary 500, 32 rows): one JSON line per GEMM of the step with the
 * shapes and transposes the step uses (checked against the model's
 * formulas, not against the tool's own table), a step line whose GFLOP is
 * the exact sum of count x 2 M N K, and the out-of-range options refused
 * with a message naming them. */
#include "dtrain/base.h"
#include "cli_util.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>


static char out[1 << 16];

static int run(const char *args)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout -s KILL 60 %s bench matmul %s 2>&1", t_cli(), args);
    return t_run_capture(cmd, out, sizeof out);
}

static int count(const char *needle) { return t_count(out, needle); }

/* The number after "key": in the first line of out containing tag, or NAN. */
static double field(const char *tag, const char *key)
{
    const char *l = strstr(out, tag);
    if (!l)
        return NAN;
    const char *e = strchr(l, '\n');
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(l, k);
    if (!p || (e && p > e))
        return NAN;
    return strtod(p + strlen(k), NULL);
}

TEST(gpt2_gemms_of_a_step)
{
    const long long R = 32, L = 2, C = 64, V = 500;
    int rc = run("--gpt2 --rows 32 --n-layer 2 --n-embd 64 --vocab 500 --size 64 --reps 1 --threads 1 --json");
    if (rc)
        fprintf(stderr, "%s\n", out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(count("\"bench\":\"matmul_gpt2\""), 15);
    ASSERT_EQ_INT(count("\"bench\":\"matmul_gpt2_step\""), 1);
    ASSERT_EQ_INT(count("\"count\":2,"), 12); /* 4 projections x 3 passes, once a layer */
    ASSERT_EQ_INT(count("\"gemm\":\"lm_head\""), 3);
    ASSERT_EQ_INT(count("\"threads\":1,"), 16);
    /* Conv1D weights [in, out]: forward x W, dx = g W^T, dW = x^T g; the tied head x E^T, g E, g^T x */
    ASSERT_STR_CONTAINS(out, "\"pass\":\"fwd\",\"gemm\":\"mlp.c_fc\",\"op\":\"A B\",\"m\":32,\"n\":256,\"k\":64,"
                             "\"bias\":false");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"fwd\",\"gemm\":\"attn.c_attn\",\"op\":\"A B\",\"m\":32,\"n\":192,\"k\":64,"
                             "\"bias\":true");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"bwd-dx\",\"gemm\":\"mlp.c_proj\",\"op\":\"A B^T\",\"m\":32,\"n\":256,\"k\":64");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"bwd-dw\",\"gemm\":\"mlp.c_proj\",\"op\":\"A^T B\",\"m\":256,\"n\":64,\"k\":32");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"fwd\",\"gemm\":\"lm_head\",\"op\":\"A B^T\",\"m\":32,\"n\":500,\"k\":64");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"bwd-dx\",\"gemm\":\"lm_head\",\"op\":\"A B\",\"m\":32,\"n\":64,\"k\":500");
    ASSERT_STR_CONTAINS(out, "\"pass\":\"bwd-dw\",\"gemm\":\"lm_head\",\"op\":\"A^T B\",\"m\":500,\"n\":64,\"k\":32");
    /* per layer 3 passes x 2 R C^2 (3 + 1 + 4 + 4); the head 3 x 2 R V C */
    double want = (double)L * 3 * 2 * R * C * C * 12 + 3.0 * 2 * R * V * C;
    double got = field("matmul_gpt2_step", "gflop");
    ASSERT_NEAR(got, want * 1e-9, 1e-4, 0);
    ASSERT(field("matmul_gpt2_step", "ms") > 0);
    ASSERT(field("matmul_gpt2_step", "gflops") > 0);
    ASSERT(field("matmul_gpt2_step", "peak_gflops") > 0);
    ASSERT(field("\"gemm\":\"lm_head\"", "gflops") > 0);

    ASSERT_EQ_INT(run("--gpt2 --rows 16 --n-layer 1 --n-embd 32 --vocab 100 --size 32 --reps 1"), 0);
    ASSERT_STR_CONTAINS(out, "bwd-dw lm_head");
    ASSERT_STR_CONTAINS(out, "step: ");
}

TEST(bad_options)
{
    ASSERT_EQ_INT(run("--gpt2 --n-embd 0"), 2);
    ASSERT_STR_CONTAINS(out, "--n-embd");
    ASSERT_EQ_INT(run("--gpt2 --rows -4"), 2);
    ASSERT_STR_CONTAINS(out, "--rows");
    ASSERT_EQ_INT(run("--gpt2 --vocab"), 2);
    ASSERT_STR_CONTAINS(out, "unknown or incomplete option '--vocab'");
    ASSERT_EQ_INT(run("--help"), 0);
    ASSERT_STR_CONTAINS(out, "--gpt2");
}

int main(void)
{
    RUN(gpt2_gemms_of_a_step);
    RUN(bad_options);
    return TEST_REPORT();
}
