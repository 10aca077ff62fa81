/* A checkpoint write slower than the collective timeout: with sharded state
 * (--zero 2) every rank writes its own file inside a collective save; a
 * rank whose disk takes longer than DT_COMM_TIMEOUT (injected:
 * DT_FAULT_CKPT_SLOW_MS on rank 1) must not make the save's collectives
 * time out. The job finishes (exit 0) with a complete checkpoint holding
 * both ranks' files, as DDP's save (rank 0 writes, the others poll) does
 * on the same slow disk. */
// dt-test-timeout: 240
// dt-test-labels: idle
#include "test.h"
#include "tools/train_cli.h"

static void slow_save(const char *name, const char *strategy, const char *slow_rank)
{
    char dir[400], p[600];
    snprintf(dir, sizeof dir, "%s/%s", cli_tmpdir(), name);
    setenv("DT_COMM_TIMEOUT", "2", 1);
    setenv("DT_INIT_TIMEOUT", "60", 1); /* the start-up of a loaded machine is not the subject */
    setenv("DT_FAULT_CKPT_SLOW_MS", "4500", 1);
    setenv("DT_FAULT_CKPT_SLOW_RANK", slow_rank, 1);
    char *args[] = {"run", "-n", "2", "--", getenv("DT_CLI"), "train", "--model", "mlp", "--mlp-hidden", "16",
                    "--data", "random", "--random-items", "64", "--batch", "8", "--limit-test", "8", "--progress",
                    "none", "--threads", "1", "--optimizer", "adamw", "--epochs", "1", "--save", dir, "--zero",
                    (char *)strategy, NULL};
    cli_result *r = calloc(1, sizeof *r);
    cli_runv(r, 120, NULL, args);
    unsetenv("DT_COMM_TIMEOUT");
    unsetenv("DT_FAULT_CKPT_SLOW_MS");
    unsetenv("DT_FAULT_CKPT_SLOW_RANK");
    if (r->code)
        fprintf(stderr, "%s%s", r->out, r->err);
    ASSERT_EQ_INT(r->code, 0);
    /* 64 items / (2 ranks x 8) = 4 steps */
    snprintf(p, sizeof p, "%s/step-00000004/index.json", dir);
    ASSERT(file_exists(p));
    if (strcmp(strategy, "0")) {
        snprintf(p, sizeof p, "%s/step-00000004/rank-00001.safetensors", dir);
        ASSERT(file_exists(p));
    }
    free(r);
}

TEST(zero2_survives_slow_rank1_write) { slow_save("zero2-r1", "2", "1"); }

TEST(zero2_survives_slow_rank0_write) { slow_save("zero2-r0", "2", "0"); }

TEST(zero3_survives_slow_rank1_write) { slow_save("zero3-r1", "3", "1"); }

int main(void)
{
    if (!getenv("DT_CLI"))
        return DT_TEST_SKIP_CODE;
    RUN(zero2_survives_slow_rank1_write);
    RUN(zero2_survives_slow_rank0_write);
    RUN(zero3_survives_slow_rank1_write);
    cli_cleanup();
    return TEST_REPORT();
}
