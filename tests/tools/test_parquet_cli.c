/* dtrain on Parquet data (--data parquet:FILE): a GPT trains a few steps
 * on a Parquet file of documents (the format Hugging Face datasets come
 * in) with a Parquet validation set, and dtrain eval --ckpt evaluates it
 * with the tokenizer the run kept; --loss-mask takes prompt/completion
 * columns, conversations come from a "messages" list<struct> column, and
 * dtrain tokenize --show shows what training sees; a corrupt or truncated
 * Parquet file, or one given as jsonl:, is exit 2 with a message naming
 * the file and the problem. The fixtures are tests/data/parquet/'s. */
// dt-test-timeout: 300
#include "test.h"
#include "train_cli.h"

static char tok[1024];

static const char *fx(const char *name)
{
    static char bufs[8][1200];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "parquet:%s/tests/data/parquet/%s.parquet", DT_SOURCE_DIR, name);
    return b;
}

TEST(train_and_eval)
{
    char data[1200], val[1200], ck[400];
    snprintf(data, sizeof data, "%s", fx("docs"));
    snprintf(val, sizeof val, "%s", fx("mixed_plain")); /* its null texts: refused below as --val-data */
    snprintf(ck, sizeof ck, "%s/ck", cli_tmpdir());
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", data, "--tokenizer", tok,
                        "--batch", "2", "--seq", "16", "--max-steps", "2", "--threads", "1", "--save", ck, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "vocab size 701");
    ASSERT_STR_CONTAINS(r.out, "val loss");
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ck, "--json", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "\"loss\":");
    ASSERT_STR_CONTAINS(r.err, "tokenizer: the tokenizer.json --ckpt");
    /* a null text in the validation file: exit 2, the row named */
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", val, "--tokenizer", tok,
                        "--max-steps", "1", "--threads", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--val-data");
    ASSERT_STR_CONTAINS(r.err, "mixed_plain.parquet: row group 0, row 3: want an object with a string \"text\"");
    /* parquet: without a tokenizer */
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "parquet: need --tokenizer");
}

TEST(prompt_completion_and_show)
{
    const char *pc = fx("prompt_completion");
    char data[1200];
    snprintf(data, sizeof data, "%s", pc);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", data, "--loss-mask",
                        "--tokenizer", tok, "--batch", "2", "--seq", "16", "--max-steps", "2", "--threads", "1",
                        NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "val loss");
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", tok, "--show", data, "--loss-mask", "--show-tokens",
                                      "40", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "targets the loss counts");
    /* the first row: its prompt skipped (but for the first token, which is no target), its completion and the end */
    ASSERT_STR_CONTAINS(r.out, "\nQ\u27e6uestion 0: who made In the beginning?\u27e7 God created<|endoftext|>"
                               "\u27e6Question 1:");
}

/* Conversations: a "messages" list<struct<role, content, tool_call_id>> column (gzip, v2 pages), rendered by the
 * chat template of the tokenizer's directory. */
TEST(conversations)
{
    char dir[400], src[1200];
    snprintf(dir, sizeof dir, "%s/llama3", cli_tmpdir());
    ASSERT_EQ_INT(mkdir(dir, 0700), 0);
    snprintf(src, sizeof src, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    size_t n;
    char *json = t_slurp(src, &n);
    ASSERT(json != NULL);
    ASSERT(t_write_in(dir, "tokenizer.json", json));
    free(json);
    ASSERT(t_write_in(dir, "tokenizer_config.json",
                      "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"chat_template\": "
                      "\"{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\\n\\n"
                      "{{ m.content }}<|eot_id|>{% endfor %}\"}"));
    char data[1200];
    snprintf(data, sizeof data, "%s", fx("chat"));
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--vocab-size", "128256", "--n-embd", "16", "--data", data,
                        "--tokenizer", dir, "--batch", "2", "--seq", "16", "--max-steps", "1", "--no-eval",
                        "--threads", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", dir, "--show", data, "--show-tokens", "30", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are kind.");
}

/* Corrupt, truncated and mislabelled Parquet files: exit 2, named. */
TEST(bad_files)
{
    char trunc[400], src[1200];
    snprintf(trunc, sizeof trunc, "%s/trunc.parquet", cli_tmpdir());
    snprintf(src, sizeof src, "%s/tests/data/parquet/docs.parquet", DT_SOURCE_DIR);
    size_t n;
    char *b = t_slurp(src, &n);
    ASSERT(b != NULL && n > 100);
    FILE *f = fopen(trunc, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ_INT(fwrite(b, 1, n - 30, f), n - 30);
    fclose(f);
    free(b);
    char fifo[400];
    snprintf(fifo, sizeof fifo, "%s/fifo.parquet", cli_tmpdir());
    ASSERT_EQ_INT(mkfifo(fifo, 0600), 0);
    char spec[4][1300];
    snprintf(spec[0], sizeof spec[0], "%s", fx("bad_dict_index"));
    snprintf(spec[1], sizeof spec[1], "parquet:%s", trunc);
    snprintf(spec[2], sizeof spec[2], "jsonl:%s", src);
    snprintf(spec[3], sizeof spec[3], "parquet:%s", fifo); /* refused at once, not waited on */
    const char *msg[4] = {"bad_dict_index.parquet: row group 0, column \"text\", page 1: dictionary index 5",
                          "trunc.parquet: not a Parquet file (no \"PAR1\" at its end: truncated?)",
                          "a Parquet file (it starts with \"PAR1\"), not JSON lines: give it as parquet:",
                          "fifo.parquet: cannot open: not a regular file"};
    for (int i = 0; i < 4; i++) {
        cli_result r;
        cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", spec[i], "--no-eval",
                                          "--tokenizer", tok, "--max-steps", "1", "--threads", "1", NULL});
        if (r.code != 2 || !strstr(r.err, msg[i]))
            fprintf(stderr, "case %d: %d %s\n", i, r.code, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, msg[i]);
    }
}

int main(void)
{
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    RUN(train_and_eval);
    RUN(prompt_completion_and_show);
    RUN(conversations);
    RUN(bad_files);
    cli_cleanup();
    return TEST_REPORT();
}
