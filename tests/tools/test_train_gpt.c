/* `dtrain train` with a GPT model on llm.c token files: a tiny GPT learns a
 * periodic token stream (validation loss falls far below the initial ln V),
 * the progress and the metrics carry tokens/s and the MFU, samples are
 * printed with --sample-every, activation checkpointing gives the same
 * losses, the MFU's measured peak is in the run's matmul dtype, and the
 * option errors name what is wrong. */
// dt-test-timeout: 300
#include "dtrain/data.h"
#include "test.h"
#include "tools/train_cli.h"

#include <math.h>

static char train_tok[320], val_tok[320], metrics[300], save_dir[300];

static uint16_t stream(int i) { return cli_stream_token(i, false); }

/* The CLI tests' stream (train_cli.h): period 7 over 40 tokens, the next
 * token a function of the previous two. */
static void write_data(void)
{
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", cli_tmpdir());
    snprintf(save_dir, sizeof save_dir, "%s/run", cli_tmpdir());
    cli_stream_train_val(train_tok, val_tok, sizeof train_tok);
}

static double last_val_loss(const char *out)
{
    const char *p = strstr(out, "val loss: ");
    return p ? atof(p + 10) : NAN;
}

static void run_gpt(cli_result *r, bool ckpt)
{
    char data[320], val[320];
    snprintf(data, sizeof data, "%s", train_tok);
    snprintf(val, sizeof val, "%s", val_tok);
    char *args[] = {"train", "--model", "gpt-micro", "--vocab-size", "40", "--n-embd", "32", "--seq", "16",
                    "--data", data, "--val-data", val, "--batch", "4", "--epochs", "2", "--optimizer", "adamw",
                    "--lr", "0.01", "--seed", "3", "--threads", "1", "--eval-every", "20", "--sample-every", "30",
                    "--sample-tokens", "10", "--progress", "plain", "--log-every", "10", "--metrics", metrics,
                    "--mfu-peak", "10", "--save", save_dir, ckpt ? "--activation-checkpointing" : NULL, NULL};
    cli_runv(r, 240, NULL, args);
}

TEST(learns_and_reports)
{
    static cli_result r, rc;
    run_gpt(&r, false);
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    double vl = last_val_loss(r.out);
    fprintf(stderr, "val loss %.4f (ln 40 = %.4f)\n", vl, log(40.0));
    ASSERT(vl < 0.5);
    ASSERT_STR_CONTAINS(r.out, "step 20: val loss");
    ASSERT_STR_CONTAINS(r.out, "tokens/s ");
    ASSERT_STR_CONTAINS(r.out, " MFU ");
    ASSERT_STR_CONTAINS(r.out, "tokens/s: ");
    ASSERT_STR_CONTAINS(r.out, "MFU: ");
    ASSERT_STR_CONTAINS(r.out, "sample at step 30: ");
    /* the sample continues the prompt: "p1 ... p8 | n1 ... n10" */
    const char *smp = strstr(r.out, "sample at step 30: ");
    int n = 0;
    for (const char *p = smp + 19; *p && *p != '\n'; p++)
        n += *p == ' ';
    ASSERT_EQ_INT(n, 7 + 2 + 9);
    static char m[65536];
    slurp_(metrics, m, sizeof m);
    ASSERT_STR_CONTAINS(m, "\"tokens_per_s\":");
    ASSERT_STR_CONTAINS(m, "\"mfu\":");
    ASSERT_STR_CONTAINS(m, "\"event\":\"eval\"");
    /* the saved checkpoint: dtrain generate --ckpt continues the validation
     * stream greedily (the model learnt it), dtrain eval --ckpt gives the
     * same validation loss */
    char prompt[128] = "", want[256] = "", buf[16];
    for (int i = 1000; i < 1008; i++) {
        snprintf(buf, sizeof buf, i > 1000 ? ",%d" : "%d", stream(i));
        strcat(prompt, buf);
        snprintf(buf, sizeof buf, i > 1000 ? " %d" : "%d", stream(i));
        strcat(want, buf);
    }
    strcat(want, " |");
    for (int i = 1008; i < 1018; i++) {
        snprintf(buf, sizeof buf, " %d", stream(i));
        strcat(want, buf);
    }
    static cli_result g;
    cli_runv(&g, 60, NULL, (char *[]){"generate", "--ckpt", save_dir, "--prompt-ids", prompt, "--max-new-tokens",
                                      "10", "--temperature", "0", NULL});
    if (g.code)
        fprintf(stderr, "%s\n", g.err);
    ASSERT_EQ_INT(g.code, 0);
    ASSERT(!strncmp(g.out, want, strlen(want)));
    cli_runv(&g, 60, NULL, (char *[]){"eval", "--ckpt", save_dir, "--threads", "1", NULL});
    if (g.code)
        fprintf(stderr, "%s\n", g.err);
    ASSERT_EQ_INT(g.code, 0);
    ASSERT_NEAR(last_val_loss(g.out), vl, 1e-4, 0);
    /* activation checkpointing: the same losses */
    run_gpt(&rc, true);
    ASSERT_EQ_INT(rc.code, 0);
    ASSERT_NEAR(last_val_loss(rc.out), vl, 0, 0);
}

TEST(option_errors)
{
    static cli_result r;
    char data[320];
    snprintf(data, sizeof data, "%s", train_tok);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", "fashion-mnist", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "tokens:FILE");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", data, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--val-data");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--seq", "8", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "GPT models only");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--seq", "65", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "block size");
    /* a token file whose ids exceed the vocabulary */
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--vocab-size", "20", "--data", data, "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "train.bin");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", "tokens:/nonexistent/x.bin", "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "/nonexistent/x.bin");
    /* validation tokens shorter than one window: "val loss: nan" and exit 0 before; training tokens too
       short name the window */
    char shortf[320];
    ASSERT_OK(cli_stream_file("short.bin", 10, false, shortf, sizeof shortf));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--vocab-size", "40", "--seq", "16", "--data",
                                      data, "--val-data", shortf, "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "the validation set is empty");
    ASSERT_STR_CONTAINS(r.err, "short.bin");
    ASSERT_STR_CONTAINS(r.err, "--seq 16 + 1 tokens");
    ASSERT(!strstr(r.out, "val loss"));
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--vocab-size", "40", "--seq", "16", "--data",
                                      shortf, "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "the training set is empty (no window of --seq 16 + 1 tokens");
}

TEST(generate_cli)
{
    static cli_result a, b;
    cli_runv(&a, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--prompt-ids", "1,2,3", "--max-new-tokens",
                                      "5", "--temperature", "0", NULL});
    ASSERT_EQ_INT(a.code, 0);
    ASSERT(!strncmp(a.out, "1 2 3 | ", 8));
    int n = 0;
    for (const char *p = a.out; *p; p++)
        n += *p == ' ';
    ASSERT_EQ_INT(n, 2 + 2 + 4);
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--prompt-ids", "1,2,3", "--max-new-tokens",
                                      "5", "--temperature", "0", NULL});
    ASSERT_STR_EQ(a.out, b.out);
    ASSERT(!strstr(a.err, "note"));
    /* past the model's positions the window moves (each token sees the last block_size): said, not silent */
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--block-size", "8", "--prompt-ids",
                                      "1,2,3", "--max-new-tokens", "5", "--temperature", "0", NULL});
    ASSERT_EQ_INT(b.code, 0);
    ASSERT(!strstr(b.err, "note"));
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--block-size", "8", "--prompt-ids",
                                      "1,2,3", "--max-new-tokens", "6", "--temperature", "0", NULL});
    ASSERT_EQ_INT(b.code, 0);
    ASSERT_STR_CONTAINS(b.err, "note: the prompt's 3 tokens and up to 6 new ones pass the model's 8 positions");
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--block-size", "8", "--prompt-ids",
                                      "1,2,3,4,5,6,7,8,9", "--max-new-tokens", "2", "--temperature", "0", NULL});
    ASSERT_EQ_INT(b.code, 0);
    ASSERT_STR_CONTAINS(b.err, "note: the prompt's 9 tokens are more than the model's 8 positions");
    ASSERT(!strncmp(b.out, "1 2 3 4 5 6 7 8 9 | ", 20));
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--prompt-ids", "1,512", NULL});
    ASSERT_EQ_INT(b.code, 2);
    ASSERT_STR_CONTAINS(b.err, "--prompt-ids: 512 (at 1) is outside the model's vocabulary [0, 512)");
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--prompt-ids", "1,x", NULL});
    ASSERT_EQ_INT(b.code, 2);
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "convnet", "--prompt-ids", "1", NULL});
    ASSERT_EQ_INT(b.code, 2);
    ASSERT_STR_CONTAINS(b.err, "--model convnet is not a language model");
    /* an empty id was skipped: "1,,2" generated from "1 2", "1," from "1" */
    const char *empty[] = {"1,,2", "1,", ",1", ","};
    for (int i = 0; i < 4; i++) {
        char *args[] = {"generate", "--model", "gpt-micro", "--prompt-ids", (char *)empty[i], NULL};
        cli_runv(&b, 60, NULL, args);
        ASSERT_EQ_INT(b.code, 2);
        ASSERT_STR_CONTAINS(b.err, "an empty id");
        ASSERT_EQ_INT(cli_lines(b.err), 1);
    }
    /* --ckpt of an MLP run: named as such, not a shape error of a default MLP */
    char mlp[340];
    snprintf(mlp, sizeof mlp, "%s/mlp-run", cli_tmpdir());
    cli_runv(&b, 60, NULL,
             (char *[]){"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "16",
                        "--batch", "8", "--max-steps", "1", "--no-eval", "--progress", "none", "--threads", "1",
                        "--save", mlp, NULL});
    ASSERT_EQ_INT(b.code, 0);
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--ckpt", mlp, "--prompt-ids", "1", NULL});
    ASSERT_EQ_INT(b.code, 2);
    ASSERT_STR_CONTAINS(b.err, "its model mlp is not a language model");
}

/* A checkpoint of a larger model (2 blocks) into a smaller one (--n-layer 1): every shape of block 0 fits,
 * and eval --ckpt, --init-from and --resume took block 0 and dropped block 1, silently (PyTorch's
 * load_state_dict(strict=True) refuses unexpected keys). Refused, exit 2, naming a tensor. */
TEST(larger_model_checkpoint_refused)
{
    static cli_result r;
    char dir[340];
    snprintf(dir, sizeof dir, "%s/two-blocks", cli_tmpdir());
#define SMALL "--model", "gpt-micro", "--vocab-size", "40", "--n-embd", "16", "--n-head", "2", "--block-size", "16", \
              "--seq", "16", "--data", train_tok, "--batch", "4", "--threads", "1", "--progress", "none"
    cli_runv(&r, 120, NULL, (char *[]){"train", SMALL, "--n-layer", "2", "--max-steps", "1", "--no-eval", "--save",
                                       dir, NULL});
    ASSERT_EQ_INT(r.code, 0);
    char *cases[][16] = {
        {"eval", "--ckpt", dir, "--n-layer", "1", "--val-data", val_tok, NULL},
        {"train", "--n-layer", "1", "--max-steps", "2", "--no-eval", "--init-from", dir, NULL},
        {"train", "--n-layer", "1", "--max-steps", "2", "--no-eval", "--resume", dir, NULL},
    };
    for (int i = 0; i < 3; i++) {
        char *args[40];
        int n = 0;
        args[n++] = cases[i][0];
        if (i > 0) {
            char *small[] = {SMALL, NULL};
            for (int k = 0; small[k]; k++)
                args[n++] = small[k];
        }
        for (int k = 1; cases[i][k]; k++)
            args[n++] = cases[i][k];
        args[n] = NULL;
        cli_runv(&r, 120, NULL, args);
        if (r.code != 2)
            fprintf(stderr, "case %d: exit %d\n%s%s", i, r.code, r.out, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, i == 0 ? "--ckpt" : i == 1 ? "--init-from" : "--resume");
        ASSERT_STR_CONTAINS(r.err, "of its tensors are not in this model ('transformer.h.1.");
    }
#undef SMALL
}

/* --vocab: a BPE vocabulary turns the prompt text into ids and the output
 * back into text (train's samples too). */
TEST(vocab_text)
{
    const char *corpus = "In the beginning God created the heaven and the earth. And the earth was without form. ";
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 300;
    dt_bpe *bpe = NULL;
    ASSERT_OK(dt_bpe_train(corpus, strlen(corpus), &tp, &bpe));
    char vocab[320];
    snprintf(vocab, sizeof vocab, "%s/v.bpe", cli_tmpdir());
    ASSERT_OK(dt_bpe_save(bpe, vocab));
    int64_t V = dt_bpe_vocab_size(bpe);
    dt_bpe_free(bpe);
    char vs[32];
    snprintf(vs, sizeof vs, "%lld", (long long)V);
    static cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--vocab", vocab,
                                      "--prompt", "In the beginning", "--max-new-tokens", "8", "--temperature", "0",
                                      NULL});
    if (r.code)
        fprintf(stderr, "%s\n", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strncmp(r.out, "In the beginning", 16));
    ASSERT(strlen(r.out) > 17);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--prompt", "x", NULL});
    ASSERT_EQ_INT(r.code, 2);
}

TEST(mfu_peak_in_run_precision)
{
    /* without --mfu-peak the MFU is against a peak measured in the dtype the
     * run's matmuls take: a bf16 run's against the bf16 product, not f32's */
    static const char *const prec[] = {"bf16", "fp32"};
    for (int i = 0; i < 2; i++) {
        static cli_result r;
        char *args[] = {"train", "--model", "gpt-micro", "--vocab-size", "40", "--n-embd", "32", "--seq", "16",
                        "--data", train_tok, "--no-eval", "--batch", "4", "--max-steps", "3", "--optimizer", "adamw",
                        "--lr", "0.01", "--seed", "3", "--threads", "1", "--precision", (char *)prec[i], NULL};
        cli_runv(&r, 240, NULL, args);
        if (r.code != 0)
            fprintf(stderr, "%s\n%s\n", r.out, r.err);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.out, i == 0 ? "GFLOP/s (bf16 matmul peak, per rank)" : "GFLOP/s (f32 matmul peak, per rank)");
    }
}

/* A tokenizer directory whose tokenizer_config.json names the eos_token (Llama-3 Instruct's <|eot_id|>): the run's
 * documents end with it, and the checkpoint keeps it with the tokenizer.json, so eval --ckpt of the same documents
 * gives the run's own validation loss (with the tokenizer.json alone it ended them with <|end_of_text|>). */
TEST(tokenizer_config_eos_kept)
{
    char dir[400], p[500], val[500], train[500], ck[500], cmd[1600];
    snprintf(dir, sizeof dir, "%s/tokdir", cli_tmpdir());
    snprintf(ck, sizeof ck, "%s/tokdir_run", cli_tmpdir());
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/tests/data/tokenizer/llama3.json' '%s/tokenizer.json'", dir,
             DT_SOURCE_DIR, dir);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs("{\"eos_token\": \"<|eot_id|>\", \"bos_token\": \"<|begin_of_text|>\"}\n", f);
    fclose(f);
    const char *docs[] = {"In the beginning God created the heaven and the earth.",
                          "And the earth was without form, and void; and darkness was upon the face of the deep.",
                          "And the Spirit of God moved upon the face of the waters.",
                          "And God said, Let there be light.",
                          "And God saw the light, that it was good: and God divided the light from the darkness."};
    snprintf(val, sizeof val, "jsonl:%s/val.jsonl", cli_tmpdir());
    f = fopen(val + 6, "w");
    ASSERT(f != NULL);
    for (int k = 0; k < 8; k++)
        for (size_t i = 0; i < sizeof docs / sizeof *docs; i++)
            fprintf(f, "{\"text\": \"%s\"}\n", docs[i]);
    fclose(f);
    snprintf(train, sizeof train, "text:%s/tests/data/tokenizer/bible.txt", DT_SOURCE_DIR);
    static cli_result r;
    cli_runv(&r, 240, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", train, "--val-data", val, "--tokenizer", dir,
                        "--seq", "8", "--batch", "4", "--max-steps", "2", "--limit-train", "16", "--save", ck,
                        "--progress", "none", "--threads", "1", NULL});
    if (r.code)
        fprintf(stderr, "%s%s", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    const char *v = strstr(r.out, "val loss: ");
    ASSERT(v);
    const double run_loss = atof(v + 10);
    cli_runv(&r, 240, NULL, (char *[]){"eval", "--ckpt", ck, "--data", val, "--seq", "8", "--json", NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *j = strstr(r.out, "{\"loss\":");
    ASSERT(j);
    ASSERT_NEAR(atof(j + 8), run_loss, 6e-5, 0); /* the run prints 4 decimals */
}

int main(void)
{
    write_data();
    RUN(learns_and_reports);
    RUN(option_errors);
    RUN(mfu_peak_in_run_precision);
    RUN(generate_cli);
    RUN(vocab_text);
    RUN(tokenizer_config_eos_kept);
    RUN(larger_model_checkpoint_refused);
    cli_cleanup();
    return TEST_REPORT();
}
