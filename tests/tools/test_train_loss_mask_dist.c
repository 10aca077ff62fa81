/* --loss-mask under dtrain's strategies: prompt/completion lines of the
 * same length (a one-token-per-character tokenizer: 7 prompt tokens, 8
 * completion tokens and the end-of-document token, one window each), so
 * every window counts the same 9 targets; then each rank's mean over its
 * own counted targets, averaged over the ranks (PyTorch DDP's semantics),
 * is the global batch's mean, and DDP, ZeRO-3, the pipeline (2 stages, 2
 * micro-batches), --tp 2 and --cp 2 (the halves of a window count 2 and 7
 * targets: the loss is the sum and the count over the group) on 2 ranks
 * follow the one-process run's per-step losses from the Hugging Face
 * golden Llama (global batch 8, AdamW) within 1e-5 relative. The masked
 * run's losses differ from the unmasked one's by more than 1e-3 (the mask
 * reaches the loss under each strategy). */
// dt-test-timeout: 300
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/llama"

static char tok_[300], file_[300], data_[400];

/* chars.json: a-z A-Z, the byte-level space, . ? , : one id each (no
 * merges), <|endoftext|> 57; pc.jsonl: 17 lines "Q abcd?" / " efghij." */
static int write_inputs(void)
{
    snprintf(tok_, sizeof tok_, "%s", cli_path("chars.json"));
    snprintf(file_, sizeof file_, "%s", cli_path("pc.jsonl"));
    snprintf(data_, sizeof data_, "jsonl:%s,prompt=prompt,completion=completion", file_);
    FILE *f = fopen(tok_, "w");
    if (!f)
        return -1;
    fputs("{\"version\":\"1.0\",\"added_tokens\":[{\"id\":57,\"content\":\"<|endoftext|>\",\"single_word\":false,"
          "\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}],\"normalizer\":null,"
          "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
          "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
          "\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":{",
          f);
    for (int i = 0; i < 52; i++)
        fprintf(f, "\"%c\":%d,", i < 26 ? 'a' + i : 'A' + i - 26, i);
    fputs("\"\xc4\xa0\":52,\".\":53,\"?\":54,\",\":55,\":\":56}}}", f);
    fclose(f);
    if (!(f = fopen(file_, "w")))
        return -1;
    unsigned s = 1;
    for (int i = 0; i < 17; i++) {
        char p[5], c[7];
        for (int k = 0; k < 4; k++)
            s = s * 1103515245u + 12345u, p[k] = (char)('a' + (s >> 16) % 26);
        for (int k = 0; k < 6; k++)
            s = s * 1103515245u + 12345u, c[k] = (char)('a' + (s >> 16) % 26);
        fprintf(f, "{\"prompt\": \"Q %.4s?\", \"completion\": \" %.6s.\"}\n", p, c);
    }
    fclose(f);
    return 0;
}

static void run(cli_result *r, int ranks, const char *batch, const char *m, bool mask, char *const *extra)
{
    char *base[] = {"train", "--model", "hf:" HF, "--tokenizer", tok_, "--data", data_, "--val-data", data_,
                    "--seq", "16", "--batch", (char *)batch, "--epochs", "2", "--optimizer", "adamw", "--lr", "0.01",
                    "--threads", "1", "--progress", "plain", "--log-every", "1", "--metrics", (char *)m,
                    mask ? "--loss-mask" : NULL, NULL};
    cli_run_ranks(r, 120, NULL, ranks, 2, (char *const *const[]){base, extra});
}

TEST(strategies_follow_one_process)
{
    ASSERT_EQ_INT(write_inputs(), 0);
    static cli_result r;
    double a[64], b[64], u[64];
    char *m1 = cli_path("one.jsonl"), *mu = cli_path("unmasked.jsonl");
    run(&r, 1, "8", m1, true, NULL);
    if (r.code)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    int na = cli_step_losses(m1, a, 64);
    ASSERT_EQ_INT(na, 4);
    run(&r, 1, "8", mu, false, NULL);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(cli_step_losses(mu, u, 64), 4);
    double d = 0; /* the prompts' targets change the loss (far beyond the 1e-5 the strategies keep) */
    for (int i = 0; i < 4; i++)
        d = fmax(d, fabs(u[i] - a[i]) / fabs(a[i]));
    if (!(d > 1e-3))
        fprintf(stderr, "masked and unmasked losses within %.3g relative\n", d);
    ASSERT(d > 1e-3);
    const struct {
        const char *name, *batch;
        char *extra[6];
    } cases[] = {
        {"ddp", "4", {NULL}},
        {"zero3", "4", {"--zero", "3", NULL}},
        {"pp2", "8", {"--pp", "2", "--micro-batches", "2", NULL}},
        {"tp2", "8", {"--tp", "2", NULL}},
        {"cp2", "8", {"--cp", "2", NULL}}, /* rank 0's half of a window counts 2 targets, rank 1's 7 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char *m2 = cli_path(cases[c].name);
        run(&r, 2, cases[c].batch, m2, true, (char *const *)cases[c].extra);
        if (r.code)
            fprintf(stderr, "%s: %s\n%s\n", cases[c].name, r.out, r.err);
        ASSERT_EQ_INT(r.code, 0);
        int nb = cli_step_losses(m2, b, 64);
        bool same = cli_same_losses(a, na, b, nb, 0.0);
        if (!same)
            fprintf(stderr, "  %s differs from one process\n", cases[c].name);
        ASSERT(same);
    }
}

int main(void)
{
    RUN(strategies_follow_one_process);
    return TEST_REPORT();
}
