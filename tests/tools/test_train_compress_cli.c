/* `dtrain train --comm-hook ...`: PowerSGD and fp16 compression in a short
 * two-rank DDP run (the summary names the hook and PowerSGD's compression),
 * AIAK's variables over the flags, and the combinations refused before
 * anything starts (PowerSGD with ZeRO, --powersgd-* without the hook, a
 * contradicting --reduce-dtype, both AIAK switches). */
// dt-test-timeout: 120
#include "test.h"
#include "tools/train_cli.h"

#include <stdlib.h>

/* A short two-rank MLP run with --comm-hook hook and up to eight more
 * arguments (NULL-terminated); a static array, valid until the next call. */
static char **run_args(const char *hook, const char *const *extra)
{
    static char *args[48];
    int n = 0;
    const char *base[] = {"run", "-n", "2", "--", getenv("DT_CLI"), "train", "--model", "mlp", "--mlp-dim", "16",
                          "--mlp-hidden", "32", "--data", "random", "--random-items", "200", "--limit-test", "40",
                          "--batch", "20", "--epochs", "1", "--progress", "none", "--threads", "1", "--seed", "3",
                          "--comm-hook", hook, NULL};
    for (int i = 0; base[i]; i++)
        args[n++] = (char *)base[i];
    for (int i = 0; extra && extra[i] && i < 8; i++)
        args[n++] = (char *)extra[i];
    args[n] = NULL;
    return args;
}

TEST(powersgd_two_ranks)
{
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 60, NULL,
             run_args("powersgd",
                      (const char *[]){"--powersgd-rank", "2", "--powersgd-start-iter", "2", NULL}));
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    /* 200 items over 2 ranks of batch 20: 5 steps; 3 of them compressed */
    ASSERT_STR_CONTAINS(r->out, "comm hook powersgd (rank 2 from step 2: ");
    ASSERT_STR_CONTAINS(r->out, "x fewer elements all-reduced)");
    ASSERT_STR_CONTAINS(r->out, "[0] test loss: ");
    free(r);
}

TEST(fp16_and_env_override)
{
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 60, NULL, run_args("fp16", NULL));
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->out, "; comm hook fp16");
    /* AIAK's variables override the command line */
    setenv("AIAK_POWERSGD_COMPRESSION", "1", 1);
    setenv("AIAK_MATRIX_APPROXIMATION_RANK", "3", 1);
    setenv("AIAK_START_COMPRESS_ITER", "1", 1);
    cli_runv(r, 60, NULL, run_args("fp16", NULL));
    unsetenv("AIAK_POWERSGD_COMPRESSION");
    unsetenv("AIAK_MATRIX_APPROXIMATION_RANK");
    unsetenv("AIAK_START_COMPRESS_ITER");
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->out, "comm hook powersgd (rank 3 from step 1: ");
    free(r);
}

/* --save, --max-steps, --resume under PowerSGD: the resumed run's final
 * checkpoint (parameters, AdamW state, the hook's Qs and both ranks' error
 * memories) is byte for byte the uninterrupted run's. 5 steps, compressed
 * from step 1, stopped after 3. */
TEST(powersgd_resume_exact)
{
    cli_result *r = calloc(1, sizeof *r);
    char ref[400], run[400], a[600], b[600];
    snprintf(ref, sizeof ref, "%s/psgd_ref", cli_tmpdir());
    snprintf(run, sizeof run, "%s/psgd_run", cli_tmpdir());
    cli_runv(r, 60, NULL,
             run_args("powersgd", (const char *[]){"--powersgd-start-iter", "1", "--optimizer", "adamw", "--save",
                                                   ref, NULL}));
    ASSERT_EQ_INT(r->code, 0);
    cli_runv(r, 60, NULL,
             run_args("powersgd", (const char *[]){"--powersgd-start-iter", "1", "--optimizer", "adamw", "--save",
                                                   run, "--max-steps", "3", NULL}));
    ASSERT_EQ_INT(r->code, 0);
    cli_runv(r, 60, NULL,
             run_args("powersgd", (const char *[]){"--powersgd-start-iter", "1", "--optimizer", "adamw", "--save",
                                                   run, "--resume", run, NULL}));
    if (r->code != 0)
        fprintf(stderr, "stdout:\n%s\nstderr:\n%s\n", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->out, "resumed from ");
    snprintf(a, sizeof a, "%s/step-00000005/rank-00000.safetensors", run);
    snprintf(b, sizeof b, "%s/step-00000005/rank-00000.safetensors", ref);
    ASSERT(same_file(a, b));
    snprintf(a, sizeof a, "%s/step-00000003/rank-00000.safetensors", run);
    ASSERT(!same_file(a, b));
    /* another matrix rank is refused, naming both */
    snprintf(a, sizeof a, "%s/step-00000003", run);
    cli_runv(r, 60, NULL,
             run_args("powersgd", (const char *[]){"--powersgd-rank", "2", "--optimizer", "adamw", "--resume",
                                                   a, NULL}));
    ASSERT(r->code != 0);
    ASSERT_STR_CONTAINS(r->err, "matrix approximation rank 1 in the checkpoint, 2 in this run");
    free(r);
}

/* Refused at once, in one process (no ranks started). */
static void refused(const char *env, const char *want, char *const *args)
{
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 30, env, args);
    if (r->code != 2 || !strstr(r->err, want))
        fprintf(stderr, "code %d\nstderr:\n%s\n", r->code, r->err);
    ASSERT_EQ_INT(r->code, 2);
    ASSERT_STR_CONTAINS(r->err, want);
    free(r);
}

TEST(refused_combinations)
{
    refused(NULL, "ZeRO stage 2",
            (char *[]){"train", "--model", "mlp", "--data", "random", "--zero", "2", "--comm-hook", "powersgd", NULL});
    refused(NULL, "ZeRO stage 3",
            (char *[]){"train", "--model", "mlp", "--data", "random", "--fsdp", "full_shard", "--comm-hook", "fp16",
                       NULL});
    refused(NULL, "need --comm-hook powersgd",
            (char *[]){"train", "--model", "mlp", "--data", "random", "--powersgd-rank", "2", NULL});
    refused(NULL, "--reduce-dtype bf16 contradicts",
            (char *[]){"train", "--model", "mlp", "--data", "random", "--comm-hook", "fp16", "--reduce-dtype", "bf16",
                       NULL});
    refused(NULL, "--comm-hook",
            (char *[]){"train", "--model", "mlp", "--data", "random", "--comm-hook", "topk", NULL});
    setenv("AIAK_FP16_COMPRESSION", "1", 1);
    refused("AIAK_POWERSGD_COMPRESSION=1", "both set",
            (char *[]){"train", "--model", "mlp", "--data", "random", NULL});
    unsetenv("AIAK_FP16_COMPRESSION");
    refused("AIAK_START_COMPRESS_ITER=-5", "AIAK_START_COMPRESS_ITER",
            (char *[]){"train", "--model", "mlp", "--data", "random", NULL});
}

TEST(help_names_the_flags)
{
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 30, NULL, (char *[]){"train", "--help", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->out, "--comm-hook {allreduce|fp16|bf16|powersgd}");
    ASSERT_STR_CONTAINS(r->out, "--powersgd-rank R");
    ASSERT_STR_CONTAINS(r->out, "--powersgd-start-iter N");
    free(r);
}

int main(void)
{
    RUN(powersgd_two_ranks);
    RUN(fp16_and_env_override);
    RUN(powersgd_resume_exact);
    RUN(refused_combinations);
    RUN(help_names_the_flags);
    cli_cleanup();
    return TEST_REPORT();
}
