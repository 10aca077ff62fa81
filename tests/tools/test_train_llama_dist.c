/* The Llama decoder under dtrain's strategies: from the Hugging Face golden
 * directory (tests/data/hf/llama: GQA, head_dim 12, untied, llama3 rope),
 * DDP, ZeRO-3 and the pipeline (2 stages, 2 micro-batches) on 2 ranks
 * follow the one-process run's per-step losses (global batch 8, AdamW) within
 * 1e-5 relative, as does tensor parallelism (--tp 2: one kv head and its
 * two query heads a rank, the weights sliced from the directory's); a
 * checkpoint saved under ZeRO-3 resumes in one process; --save-hf under
 * --tp 2 writes the one-process export. The named sizes
 * under --tp and its compositions: test_train_llama_par.c. */
// dt-test-timeout: 300
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/"

static void run(cli_result *r, int ranks, const char *batch, const char *m, char *const *extra)
{
    char *base[] = {"train", "--model", "hf:" HF "llama", "--data", "tokens:" HF "tokens.bin", "--val-data",
                    "tokens:" HF "tokens.bin", "--seq", "16", "--batch", (char *)batch, "--epochs", "2",
                    "--optimizer", "adamw", "--lr", "0.01", "--threads", "1", "--progress", "plain", "--log-every",
                    "1", "--metrics", (char *)m, NULL};
    cli_run_ranks(r, 120, NULL, ranks, 2, (char *const *const[]){base, extra});
}

TEST(strategies_follow_one_process)
{
    static cli_result r;
    double a[64], b[64];
    char *m1 = cli_path("one.jsonl");
    run(&r, 1, "8", m1, NULL);
    ASSERT_EQ_INT(r.code, 0);
    int na = cli_step_losses(m1, a, 64);
    ASSERT(na >= 2);
    const struct {
        const char *name, *batch;
        char *extra[6];
    } cases[] = {
        {"ddp", "4", {NULL}},
        {"zero3", "4", {"--zero", "3", NULL}},
        {"pp2", "8", {"--pp", "2", "--micro-batches", "2", NULL}},
        {"tp2", "8", {"--tp", "2", NULL}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *m2 = cli_path(cases[c].name);
        run(&r, 2, cases[c].batch, m2, (char *const *)cases[c].extra);
        ASSERT_EQ_INT(r.code, 0);
        int nb = cli_step_losses(m2, b, 64);
        bool same = cli_same_losses(a, na, b, nb, 0.0);
        if (!same)
            fprintf(stderr, "  %s differs from one process\n", cases[c].name);
        ASSERT(same);
    }
}

TEST(zero3_checkpoint_resumes_in_one_process)
{
    static cli_result r;
    char *save = cli_path("z3run"), *m = cli_path("z3.jsonl"), *m2 = cli_path("resumed.jsonl");
    run(&r, 2, "4", m, (char *[]){"--zero", "3", "--save", save, "--max-steps", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    run(&r, 1, "8", m2, (char *[]){"--resume", save, NULL});
    ASSERT_EQ_INT(r.code, 0);
    double a[64], b[64];
    char *m1 = cli_path("one2.jsonl");
    run(&r, 1, "8", m1, NULL);
    int na = cli_step_losses(m1, a, 64), nb = cli_step_losses(m2, b, 64);
    ASSERT(na == nb + 2 && nb >= 2);
    bool same = cli_same_losses(a + 2, na - 2, b, nb, 0.0);
    ASSERT(same);
}

/* --save-hf under --tp 2: the directory holds the whole tensors (gathered
 * from the slices) and evaluates as the one-process run's export does */
TEST(tp2_save_hf_equals_one_process)
{
    static cli_result r;
    double loss[2];
    for (int tp = 0; tp < 2; tp++) {
        char *out = cli_path(tp ? "hf_tp2" : "hf_one");
        run(&r, tp ? 2 : 1, "8", cli_path("hf.jsonl"),
            tp ? (char *[]){"--tp", "2", "--save-hf", out, NULL} : (char *[]){"--save-hf", out, NULL});
        ASSERT_EQ_INT(r.code, 0);
        char model[400];
        snprintf(model, sizeof model, "hf:%s", out);
        cli_runv(&r, 120, NULL, (char *[]){"eval", "--model", model, "--data", "tokens:" HF "tokens.bin", "--batch",
                                           "4", "--seq", "16", "--json", NULL});
        ASSERT_EQ_INT(r.code, 0);
        loss[tp] = cli_out_value(r.out, "\"loss\":");
    }
    fprintf(stderr, "exported model's loss: one process %.8f, --tp 2 %.8f\n", loss[0], loss[1]);
    ASSERT(isfinite(loss[0]) && fabs(loss[1] - loss[0]) <= 1e-5 * loss[0]);
}

int main(void)
{
    RUN(strategies_follow_one_process);
    RUN(zero3_checkpoint_resumes_in_one_process);
    RUN(tp2_save_hf_equals_one_process);
    cli_cleanup();
    return TEST_REPORT();
}
