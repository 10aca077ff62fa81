/* dtrain tokenize: train a vocab, encode with a validation split, decode
 * back (the two parts together are the corpus, byte for byte), the same
 * through a tokenizer.json (written by --train-vocab, read by --tokenizer:
 * the same ids as the vocab file), ids above 65,535 (a uint32 token file,
 * never cut to 16 bits; trained on), and bad usage / bad input (exit 2, one
 * line naming the problem, no output file). */
#include "dtrain/data.h"
#include "dtrain/tokenizer.h"
#include "test.h"
#include "train_cli.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>

static char p_[12][600];
static char *tp(int slot, const char *name)
{
    snprintf(p_[slot], sizeof p_[slot], "%s/%s", cli_tmpdir(), name);
    return p_[slot];
}

static char *make_corpus(size_t *n)
{
    /* lines of words with a few non-ASCII and control bytes */
    static const char *w[] = {"and", "the", "LORD", "said", "unto", "him,", "caf\xc3\xa9", "\x01\x7f", "7:14", "it's"};
    size_t cap = 60000, o = 0;
    char *t = malloc(cap);
    unsigned s = 1;
    while (o + 40 < cap) {
        s = s * 1103515245u + 12345u;
        if ((s >> 16) % 3 == 0) { /* a random word of 1..6 letters */
            int len = 1 + (int)((s >> 4) % 6);
            for (int i = 0; i < len; i++) {
                s = s * 1103515245u + 12345u;
                t[o++] = "etaoinshrdlu"[(s >> 16) % 12];
            }
            t[o++] = ' ';
        } else {
            o += (size_t)snprintf(t + o, cap - o, "%s%s", w[(s >> 16) % 10], (s >> 8) % 9 == 0 ? "\n" : " ");
        }
    }
    *n = o;
    return t;
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, n, f);
    fclose(f);
}

TEST(train_encode_split_decode)
{
    size_t n;
    char *corpus = make_corpus(&n);
    char *c = tp(0, "corpus.txt"), *v = tp(1, "v.bpe"), *tr = tp(2, "train.bin"), *va = tp(3, "val.bin"),
         *d1 = tp(4, "train.txt"), *d2 = tp(5, "val.txt");
    write_file(c, corpus, n);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "300", c, "-o", v, "--min-count", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "vocab of 300 ids");
    cli_runv(&r, 60, NULL,
             (char *[]){"tokenize", "--vocab", v, c, "-o", tr, "--val-fraction", "0.2", "--val-out", va, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_EQ_INT(cli_lines(r.out), 2);
    dt_tokens *a, *b;
    ASSERT_OK(dt_tokens_open(tr, 300, &a));
    ASSERT_OK(dt_tokens_open(va, 300, &b));
    /* about 80/20 of the tokens, and fewer tokens than bytes */
    double frac = (double)dt_tokens_count(b) / (double)(dt_tokens_count(a) + dt_tokens_count(b));
    ASSERT(frac > 0.15 && frac < 0.25);
    ASSERT(dt_tokens_count(a) + dt_tokens_count(b) < (int64_t)n * 2 / 3);
    dt_tokens_close(a);
    dt_tokens_close(b);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--vocab", v, "--decode", tr, "-o", d1, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--vocab", v, "--decode", va, "-o", d2, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--unigram", tr, va, "--vocab", v, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "nats per token");
    double h = atof(strstr(r.out, ": ") + 2);
    ASSERT(h > 1.0 && h < log(300.0));
    char *back = malloc(n + 1);
    FILE *f = fopen(d1, "rb");
    size_t k = fread(back, 1, n + 1, f);
    fclose(f);
    ASSERT(k < n && back[k - 1] == '\n'); /* cut at a line end */
    f = fopen(d2, "rb");
    k += fread(back + k, 1, n + 1 - k, f);
    fclose(f);
    ASSERT_EQ_INT(k, n);
    ASSERT(!memcmp(back, corpus, n));
    free(back);
    free(corpus);
}

TEST(tokenizer_json)
{
    size_t n;
    char *corpus = make_corpus(&n);
    for (size_t i = 0; i < n; i++) /* keep it printable */
        if ((unsigned char)corpus[i] == 0x01)
            corpus[i] = ' ';
    char *c = tp(0, "corpus.txt"), *v = tp(1, "v.bpe"), *j = tp(2, "tok.json"), *a = tp(3, "a.bin"),
         *b = tp(4, "b.bin"), *d = tp(5, "back.txt");
    write_file(c, corpus, n);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "300", c, "-o", v, "--min-count", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "300", c, "-o", j, "--min-count", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "<|endoftext|> = id 300");
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--vocab", v, c, "-o", a, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", j, c, "-o", b, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(same_file(a, b));
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", j, "--decode", b, "-o", d, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(same_file(c, d));
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--unigram", b, "--tokenizer", j, NULL});
    ASSERT_EQ_INT(r.code, 0);
    free(corpus);
}

/* dtrain train on text: a text: file and a jsonl: file encoded with a
 * tokenizer.json at start; the model's vocabulary is the tokenizer's. */
TEST(train_on_text)
{
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    size_t n;
    char *corpus = make_corpus(&n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)corpus[i] < 0x20 && corpus[i] != '\n')
            corpus[i] = ' ';
    char *c = tp(0, "corpus.txt"), *j = tp(1, "val.jsonl");
    write_file(c, corpus, n);
    const char *jl = "{\"text\": \"And God said, Let there be light: and there was light.\"}\n"
                     "{\"text\": \"And God saw the light, that it was good: and God divided the light.\"}\n";
    write_file(j, jl, strlen(jl));
    char data[700], val[700];
    snprintf(data, sizeof data, "text:%s", c);
    snprintf(val, sizeof val, "jsonl:%s", j);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", val, "--tokenizer", tok,
                        "--batch", "2", "--seq", "16", "--max-steps", "3", "--threads", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "vocab size 701");
    ASSERT_STR_CONTAINS(r.out, "val loss");
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tokenizer");
    cli_runv(&r, 60, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--tokenizer", c, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "tokenizer.json");
    free(corpus);
}

/* dtrain eval --ckpt of a run trained on text with --tokenizer: the
 * checkpoint's kept tokenizer.json encodes the text data (its own, or
 * --val-data text:OTHER given here), as dtrain generate --ckpt does: the same
 * loss as with --tokenizer given, and the command says which it used. */
TEST(eval_ckpt_uses_its_tokenizer)
{
    char tok[1024], data[700], other[700];
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    snprintf(data, sizeof data, "text:%s/tests/data/tokenizer/bible.txt", DT_SOURCE_DIR);
    char *o = tp(0, "other.txt"), *ck = tp(1, "text_ck");
    const char *ot = "And God said, Let there be light: and there was light. And God saw the light, that it was "
                     "good: and God divided the light from the darkness. And God called the light Day.\n";
    write_file(o, ot, strlen(ot));
    snprintf(other, sizeof other, "text:%s", o);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", data, "--tokenizer", tok, "--batch",
                        "2", "--seq", "16", "--max-steps", "2", "--limit-test", "4", "--threads", "1", "--save", ck,
                        NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    double loss[4];
    for (int k = 0; k < 4; k++) { /* kept, given; then on other text: kept, given */
        char *argv[16] = {"eval", "--ckpt", ck, "--json"};
        int a = 4;
        char tokeq[1100];
        snprintf(tokeq, sizeof tokeq, "--tokenizer=%s", tok);
        if (k == 1)
            argv[a++] = "--tokenizer", argv[a++] = tok;
        if (k == 3) /* the --name=value form too */
            argv[a++] = tokeq;
        if (k >= 2)
            argv[a++] = "--val-data", argv[a++] = other;
        cli_runv(&r, 60, NULL, argv);
        if (r.code != 0)
            fprintf(stderr, "eval %d: %s\n%s\n", k, r.out, r.err);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT_STR_CONTAINS(r.err, k & 1 ? "tokenizer: --tokenizer" : "tokenizer: the tokenizer.json --ckpt");
        const char *l = strstr(r.out, "\"loss\":");
        ASSERT(l != NULL);
        ASSERT(r.out[0] == '{'); /* --json: the object alone on stdout */
        loss[k] = strtod(l + 7, NULL);
    }
    ASSERT(isfinite(loss[0]) && loss[0] == loss[1]);
    ASSERT(isfinite(loss[2]) && loss[2] == loss[3]);
    ASSERT(loss[0] != loss[2]);
    cli_runv(&r, 60, NULL, (char *[]){"eval", "--ckpt", ck, NULL}); /* the text lines say it too */
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "tokenizer: the tokenizer.json --ckpt");
    ASSERT_STR_CONTAINS(r.out, "val loss");
}

/* The loss `dtrain eval --ckpt ck --tokenizer tok --json` prints with the further arguments extra (NULL-ended, at
 * most 12); NAN (said on stderr) when it fails. r: the run. */
static double eval_ckpt_loss(const char *ck, const char *tok, char *const *extra, cli_result *r)
{
    char *argv[20] = {"eval", "--ckpt", (char *)ck, "--tokenizer", (char *)tok, "--json"};
    int a = 6;
    for (int i = 0; extra[i] && a < 19; i++)
        argv[a++] = extra[i];
    cli_runv(r, 60, NULL, argv);
    const char *l = r->code == 0 ? strstr(r->out, "\"loss\":") : NULL;
    if (!l)
        fprintf(stderr, "eval --ckpt %s: %d %s\n%s\n", ck, r->code, r->out, r->err);
    return l ? strtod(l + 7, NULL) : NAN;
}

/* --packing off: each record one sample (TRL's packing=False; the items themselves: data/test_text_dataset); the
 * checkpoint keeps it for eval --ckpt (the same loss as with --packing off given, another packed); a token file has
 * no records (exit 2). */
TEST(train_no_packing)
{
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    char *j = tp(0, "np.jsonl"), *ck = tp(3, "np_ck");
    char lines[4096] = "";
    for (int i = 0; i < 12; i++)
        snprintf(lines + strlen(lines), sizeof lines - strlen(lines),
                 "{\"prompt\": \"Who divided the light from the darkness? (%d)\", \"completion\": \" God%.*s\"}\n", i,
                 i, " and the darkness");
    write_file(j, lines, strlen(lines));
    char data[700];
    snprintf(data, sizeof data, "jsonl:%s", j);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", data, "--loss-mask",
                        "--packing", "off", "--tokenizer", tok, "--batch", "4", "--seq", "32", "--max-steps", "2",
                        "--threads", "1", "--save", ck, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "12 items"); /* the records, not windows of the stream */
    const double val = cli_out_value(r.out, "val loss: ");
    const double kept = eval_ckpt_loss(ck, tok, (char *[]){NULL}, &r);
    /* in the run's batches: the run's validation loss (the mean of batch means depends on the batches) */
    ASSERT_NEAR(kept, val, 6e-5, 0);
    ASSERT_STR_CONTAINS(r.out, "\"items\":12");
    const double given = eval_ckpt_loss(ck, tok, (char *[]){"--data", data, "--val-data", data, "--loss-mask",
                                                           "--packing", "off", NULL}, &r);
    const double windows = eval_ckpt_loss(ck, tok, (char *[]){"--data", data, "--val-data", data, "--loss-mask",
                                                             NULL}, &r);
    ASSERT(!isnan(kept) && kept == given);
    ASSERT(fabs(windows - kept) > 1e-3);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", "tokens:x.bin", "--packing", "off",
                                      "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--packing off makes each record of text data one sample");
    /* tokenize --show ... --packing off --seq T: the samples and their counted targets (every completion within
       64 tokens, none within 4: the prompts are longer) */
    long long packed = -1, counted[2] = {-1, -1};
    for (int k = 0; k < 2; k++) {
        cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", tok, "--show", data, "--loss-mask",
                                          "--show-tokens", "0", "--packing", "off", "--seq", k ? "4" : "64", NULL});
        ASSERT_EQ_INT(r.code, 0);
        const char *c = strstr(r.out, " of them targets the loss counts"), *p = c;
        while (p && p > r.out && p[-1] != ' ')
            p--;
        packed = p ? atoll(p) : -1;
        const char *q = strstr(r.out, "samples (one a record");
        ASSERT(q != NULL && strstr(r.out, "12 samples") != NULL);
        q = strstr(q, "tokens), ");
        counted[k] = q ? atoll(q + 9) : -1;
    }
    ASSERT(packed > 0 && counted[0] == packed && counted[1] == 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", tok, "--show", data, "--packing", "off", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "takes --packing off with --seq T");
}

/* --loss-mask: prompt/completion jsonl trains with the loss on the
 * completions only (the value itself: nn/test_loss_mask); mistakes are
 * exit 2 naming the line, the key or the option. */
TEST(train_loss_mask)
{
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    char *j = tp(0, "pc.jsonl"), *m = tp(1, "missing.jsonl"), *x = tp(2, "plain.txt"), *ck = tp(3, "mask_ck");
    char lines[4096] = "";
    for (int i = 0; i < 12; i++)
        snprintf(lines + strlen(lines), sizeof lines - strlen(lines),
                 "{\"instruction\": \"Who divided the light from the darkness? (%d)\", \"output\": \" And God "
                 "divided the light from the darkness.\"}\n",
                 i);
    write_file(j, lines, strlen(lines));
    const char *ml = "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"a\", \"answer\": \"b\"}\n";
    write_file(m, ml, strlen(ml));
    write_file(x, "In the beginning.\n", 18);
    char data[700], bad[700], txt[700];
    snprintf(data, sizeof data, "jsonl:%s,prompt=instruction,completion=output", j);
    snprintf(bad, sizeof bad, "jsonl:%s,prompt=instruction,completion=output", m);
    snprintf(txt, sizeof txt, "text:%s", x);
    /* an escaped NUL would end the string there (cJSON): refused, not cut short */
    char *nl = tp(4, "nul.jsonl"), nul[700];
    const char *nll = "{\"instruction\": \"a\", \"output\": \"b\\u0000c\"}\n";
    write_file(nl, nll, strlen(nll));
    snprintf(nul, sizeof nul, "jsonl:%s,prompt=instruction,completion=output", nl);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--val-data", data, "--loss-mask",
                        "--tokenizer", tok, "--batch", "2", "--seq", "16", "--max-steps", "2", "--threads", "1",
                        "--save", ck, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "val loss");
    /* dtrain eval --ckpt evaluates as the run did (the checkpoint keeps --loss-mask): the same loss as with
     * --loss-mask given, another without it (every token counted) */
    const double kept = eval_ckpt_loss(ck, tok, (char *[]){NULL}, &r);
    const double given = eval_ckpt_loss(ck, tok, (char *[]){"--data", data, "--val-data", data, "--loss-mask", NULL},
                                        &r);
    const double all = eval_ckpt_loss(ck, tok, (char *[]){"--data", data, "--val-data", data, NULL}, &r);
    ASSERT(!isnan(kept) && kept == given);
    ASSERT(fabs(all - kept) > 1e-3);
    struct {
        const char *data, *val, *msg;
    } cases[] = {
        {bad, NULL, ":2: want an object with a string \"output\""},
        {nul, NULL, ":1: a string holds \\u0000"},
        {txt, NULL, "--loss-mask takes GPT models on prompt/completion data"},
        {data, txt, "--loss-mask takes GPT models on prompt/completion data"},
        {"tokens:x.bin", NULL, "--loss-mask takes GPT models on prompt/completion data"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[24] = {"train", "--model", "gpt-micro", "--data", (char *)cases[i].data, "--loss-mask",
                          "--tokenizer", tok, "--max-steps", "1", "--threads", "1"};
        int a = 12;
        argv[a++] = "--val-data", argv[a++] = (char *)(cases[i].val ? cases[i].val : cases[i].data);
        cli_runv(&r, 60, NULL, argv);
        if (r.code != 2 || !strstr(r.err, cases[i].msg))
            fprintf(stderr, "case %zu: %d %s\n", i, r.code, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, cases[i].msg);
    }
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "convnet", "--loss-mask", "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--loss-mask");
}

/* prompt as transformers' tokenizer(prompt) encodes it (its special tokens added), as --prompt-ids takes the ids
 * (comma-separated into list[0, n)): their count, or -1. */
static int64_t prompt_ids(const dt_tokenizer *t, const char *prompt, char *list, size_t n)
{
    uint32_t *ids;
    int64_t k;
    if (dt_tokenizer_encode(t, prompt, strlen(prompt), true, &ids, &k) < 0)
        return -1;
    list[0] = 0;
    for (int64_t i = 0; i < k; i++)
        snprintf(list + strlen(list), n - strlen(list), "%s%u", i ? "," : "", ids[i]);
    free(ids);
    return k;
}

/* The ids dtrain generate --prompt-ids prints ("p1 ... pn | t1 ... tk") into ids[0, cap): their count. */
static int64_t printed_ids(const char *out, uint32_t *ids, int64_t cap)
{
    int64_t n = 0;
    for (const char *p = out; *p && n < cap;) {
        char *e;
        unsigned long v = strtoul(p, &e, 10);
        if (e == p) {
            p++;
            continue;
        }
        ids[n++] = (uint32_t)v;
        p = e;
    }
    return n;
}

/* dtrain generate --prompt TEXT through a tokenizer.json: --tokenizer FILE,
 * an hf:DIR model's own tokenizer.json, a --ckpt run's kept one; the text
 * printed is the tokenizer's decoding of the ids generate --prompt-ids
 * gives for the prompt's encoding (greedy). An id past the tokenizer: exit 2. */
TEST(generate_with_tokenizer)
{
    char tok[1024], data[1200];
    snprintf(tok, sizeof tok, "%s/tests/data/tokenizer/dtrain.json", DT_SOURCE_DIR);
    snprintf(data, sizeof data, "text:%s/tests/data/tokenizer/bible.txt", DT_SOURCE_DIR);
    char *ck = tp(0, "gen_ck"), *hf = tp(1, "gen_hf"), hfm[700];
    snprintf(hfm, sizeof hfm, "hf:%s", hf);
    cli_result r;
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "llama-tiny", "--data", data, "--tokenizer", tok, "--seq", "32", "--batch",
                        "4", "--max-steps", "2", "--no-eval", "--save", ck, "--save-hf", hf, "--threads", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    dt_tokenizer *t = NULL;
    ASSERT_OK(dt_tokenizer_load(tok, &t));
    const char *prompt = "And God said";
    char list[256];
    const int64_t np = prompt_ids(t, prompt, list, sizeof list);
    ASSERT(np > 0);
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--model", hfm, "--prompt-ids", list, "--temperature", "0", "--max-new-tokens",
                        "12", NULL});
    ASSERT_EQ_INT(r.code, 0);
    uint32_t ids[64];
    const int64_t n = printed_ids(r.out, ids, 64);
    ASSERT_EQ_INT(n, np + 12);
    char *want;
    size_t wl;
    ASSERT_OK(dt_tokenizer_decode(t, ids, n, false, &want, &wl));
    dt_tokenizer_free(t);
    char *argvs[3][12] = {
        {"generate", "--model", hfm, "--prompt", (char *)prompt, "--temperature", "0", "--max-new-tokens", "12"},
        {"generate", "--model", hfm, "--tokenizer", tok, "--prompt", (char *)prompt, "--temperature", "0",
         "--max-new-tokens", "12"},
        {"generate", "--ckpt", ck, "--prompt", (char *)prompt, "--temperature", "0", "--max-new-tokens", "12"},
    };
    for (int k = 0; k < 3; k++) {
        cli_runv(&r, 60, NULL, argvs[k]);
        if (r.code != 0 || strncmp(r.out, want, wl))
            fprintf(stderr, "case %d: %d\n%s\n%s\nwant %s\n", k, r.code, r.out, r.err, want);
        ASSERT_EQ_INT(r.code, 0);
        ASSERT(strlen(r.out) == wl + 1 && !strncmp(r.out, want, wl) && r.out[wl] == '\n');
    }
    free(want);
    /* a model wider than the tokenizer (701 ids): the first id past it is an error, never another token */
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--model", "llama-tiny", "--vocab-size", "60000", "--tokenizer", tok, "--prompt",
                        (char *)prompt, "--max-new-tokens", "16", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "outside the tokenizer's 701 ids");
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--model", hfm, "--tokenizer", tok, "--vocab", tok, "--prompt", "a", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "not both");
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "llama-tiny", "--prompt", "a", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--tokenizer");
}

/* generate --vocab with a model wider than the BPE (70,000 ids against
 * 300): the first id the BPE does not have is an error naming it, exit 2;
 * the uint16 cast it replaced turned 65,536 + k into token k silently. */
TEST(generate_vocab_wide_model)
{
    size_t n;
    char *corpus = make_corpus(&n);
    char *c = tp(0, "wide_corpus.txt"), *v = tp(1, "wide.bpe");
    write_file(c, corpus, n);
    free(corpus);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "300", c, "-o", v, "--min-count", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL,
             (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", "70000", "--vocab", v, "--prompt", "In",
                        "--max-new-tokens", "16", "--sample-seed", "3", NULL});
    if (r.code != 2)
        fprintf(stderr, "%d\n%s\n%s\n", r.code, r.out, r.err);
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is outside the vocabulary of 300");
}

/* A tokenizer with ids above 65,535 (as Llama-3's 128,256): the token file
 * is uint32 (magic 20240801) and holds the ids the tokenizers library gives
 * (70000 for "ab", checked with tokenizers 0.23), decodes back to the text,
 * and trains (tokens:FILE, the vocabulary grown to 70001). */
TEST(wide_ids)
{
    static const char json[] =
        "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
        "\"use_regex\":true},\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"c\":2,\"\xc4\xa0\":3,\"ab\":70000},"
        "\"merges\":[[\"a\",\"b\"]]}}";
    char *j = tp(0, "wide.json"), *c = tp(1, "wide.txt"), *o = tp(2, "wide.bin"), *d = tp(3, "wide.back");
    write_file(j, json, strlen(json));
    char text[2000] = "";
    for (int i = 0; i < 60; i++)
        strcat(text, i % 3 ? "ab cab " : "c abab ");
    write_file(c, text, strlen(text));
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", j, c, "-o", o, NULL});
    if (r.code != 0)
        fprintf(stderr, "  %s", r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "uint32 ids");
    dt_tokens *t = NULL;
    ASSERT_OK(dt_tokens_open(o, 70001, &t));
    ASSERT_EQ_INT(dt_tokens_width(t), 4);
    /* "c abab ab cab ab cab ": c, Ġ, ab, ab, Ġ, ab, Ġ, c, ab, ... */
    const uint32_t want[] = {2, 3, 70000, 70000, 3, 70000, 3, 2, 70000, 3, 70000, 3, 2, 70000, 3};
    ASSERT(dt_tokens_count(t) > 15);
    for (int i = 0; i < 15; i++)
        ASSERT_EQ_U64(dt_tokens_at(t, i), want[i]);
    dt_tokens_close(t);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", j, "--decode", o, "-o", d, NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(same_file(c, d));
    char data[700];
    snprintf(data, sizeof data, "tokens:%s", o);
    cli_runv(&r, 120, NULL,
             (char *[]){"train", "--model", "gpt-micro", "--data", data, "--no-eval", "--seq", "8", "--batch", "2",
                        "--max-steps", "2", "--progress", "none", "--threads", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "vocab size 70001");
}

TEST(bad_usage_and_input)
{
    cli_result r;
    char *v = tp(1, "v.bpe"), *c = tp(0, "corpus.txt"), *j = tp(2, "tok.json"), *bad = tp(3, "wordpiece.json"),
         *out = tp(4, "never.bin"), *bin = tp(5, "bytes.txt");
    char lnk[600];
    snprintf(lnk, sizeof lnk, "%s/link.bin", cli_tmpdir());
    const char *wp = "{\"version\":\"1.0\",\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}";
    write_file(bad, wp, strlen(wp));
    write_file(bin, "ab\xff\xfe", 4);
    remove(out);
    remove(lnk);
    ASSERT_EQ_INT(symlink(out, lnk), 0); /* dangling: a write through it would create out */
    struct {
        char *args[12];
        const char *msg;
    } cases[] = {
        {{"tokenize", NULL}, "give one of"},
        {{"tokenize", "--train-vocab", "100", c, "-o", v, NULL}, "--train-vocab"},
        {{"tokenize", "--train-vocab", "300", c, NULL}, "-o FILE is required"},
        {{"tokenize", "--train-vocab", "300", "--vocab", v, c, "-o", v, NULL}, "give one of"},
        {{"tokenize", "--vocab", v, c, "-o", "x", "--val-fraction", "0.1", NULL}, "go together"},
        {{"tokenize", "--vocab", v, c, "-o", "x", "--val-fraction", "1", "--val-out", "y", NULL}, "strictly between"},
        {{"tokenize", "--vocab", c, c, "-o", "x", NULL}, "not a dtrain BPE vocab"},
        {{"tokenize", "--vocab", v, "/nonexistent/c.txt", "-o", "x", NULL}, "/nonexistent/c.txt: cannot open"},
        {{"tokenize", "--vocab", v, "--decode", c, "-o", "x", NULL}, "bad magic"},
        {{"tokenize", "--bogus", NULL}, "unknown option '--bogus'"},
        {{"tokenize", "--unigram", c, NULL}, "bad magic"},
        {{"tokenize", "--unigram", c, "-o", "x", NULL}, "--unigram takes"},
        {{"tokenize", "--tokenizer", bad, c, "-o", out, NULL}, "model.type"},
        {{"tokenize", "--tokenizer", bad, "--decode", c, "-o", out, NULL}, bad},
        {{"tokenize", "--tokenizer", c, c, "-o", out, NULL}, "tokenizer.json"},
        {{"tokenize", "--tokenizer", j, "--vocab", v, c, "-o", out, NULL}, "not both"},
        {{"tokenize", "--tokenizer", j, bin, "-o", out, NULL}, "not valid UTF-8"},
        {{"tokenize", "--unigram", c, "--min-count", "3", NULL}, "--unigram takes"}, /* was ignored */
        {{"tokenize", "--vocab", v, c, "-o", "", NULL}, "-o needs a file name"},
        /* output paths that cannot be written are bad input, said before any work (they were exit 1 at the end) */
        {{"tokenize", "--vocab", v, c, "-o", "/nonexistent/x.bin", NULL}, "directory /nonexistent: does not exist"},
        {{"tokenize", "--vocab", v, c, "-o", "/", NULL}, "-o / is a directory"},
        {{"tokenize", "--vocab", v, c, "-o", lnk, NULL}, "is a symbolic link"},
        {{"tokenize", "--train-vocab", "300", c, "-o", lnk, NULL}, "is a symbolic link"},
        {{"tokenize", "--vocab", v, c, "-o", out, "--val-fraction", "0.1", "--val-out", "/nonexistent/y", NULL},
         "--val-out /nonexistent/y: directory /nonexistent"},
        {{"tokenize", "--vocab", v, c, "-o", "x", "--val-fraction", "0.1", "--val-out", lnk, NULL}, "--val-out"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_runv(&r, 60, NULL, cases[i].args);
        if (r.code != 2 || !strstr(r.err, cases[i].msg) || cli_lines(r.err) != 1) {
            fprintf(stderr, "  case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
            ASSERT(0);
        }
        ASSERT(access(out, F_OK) != 0); /* nothing written */
    }
}

/* Text that is not UTF-8 in the part --val-out takes: the message names the
 * corpus and the part, and neither token file is written (the training
 * part's file was written before the validation part failed). */
TEST(bad_text_in_val_part_writes_nothing)
{
    cli_result r;
    char *j = tp(2, "tok.json"), *c = tp(3, "bad_tail.txt"), *tr = tp(4, "never.bin"), *va = tp(5, "never_val.bin");
    static const char text[] = "and the LORD said\nunto him \xff\xfe\n";
    write_file(c, text, sizeof text - 1);
    remove(tr);
    remove(va);
    cli_runv(&r, 60, NULL,
             (char *[]){"tokenize", "--tokenizer", j, c, "-o", tr, "--val-fraction", "0.5", "--val-out", va, NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, c);
    ASSERT_STR_CONTAINS(r.err, "its part for --val-out, from byte 18");
    ASSERT_STR_CONTAINS(r.err, "not valid UTF-8");
    ASSERT(access(tr, F_OK) != 0);
    ASSERT(access(va, F_OK) != 0);
}

/* A FIFO given as the corpus, the vocab, the tokenizer.json or text:/jsonl:
 * training data is refused at once, exit 2, naming it: the readers opened
 * them with fopen and waited for a writer for ever (SIGTERM did not stop
 * dtrain train either). */
TEST(fifo_inputs)
{
    char *v = tp(1, "v.bpe"), *c = tp(0, "corpus.txt"), *j = tp(2, "tok.json"), *fifo = tp(3, "fifo.txt"),
         *out = tp(4, "never.bin");
    char text[700], jsonl[700];
    remove(fifo);
    ASSERT_EQ_INT(mkfifo(fifo, 0644), 0);
    remove(out);
    snprintf(text, sizeof text, "text:%s", fifo);
    snprintf(jsonl, sizeof jsonl, "jsonl:%s", fifo);
    char *cases[][16] = {
        {"tokenize", "--vocab", v, fifo, "-o", out, NULL},
        {"tokenize", "--tokenizer", j, fifo, "-o", out, NULL},
        {"tokenize", "--vocab", fifo, c, "-o", out, NULL},
        {"tokenize", "--tokenizer", fifo, c, "-o", out, NULL},
        {"train", "--model", "gpt-micro", "--tokenizer", j, "--data", text, "--no-eval", "--max-steps", "1", NULL},
        {"train", "--model", "gpt-micro", "--tokenizer", j, "--data", jsonl, "--no-eval", "--max-steps", "1", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_result r;
        cli_runv(&r, 20, NULL, cases[i]);
        if (r.code != 2 || !strstr(r.err, "not a regular file") || !strstr(r.err, fifo))
            fprintf(stderr, "  fifo case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
        ASSERT_EQ_INT(r.code, 2);
        ASSERT_STR_CONTAINS(r.err, "not a regular file");
        ASSERT_STR_CONTAINS(r.err, fifo);
        ASSERT(access(out, F_OK) != 0);
    }
    remove(fifo);
}

/* The whole of path (*n bytes), malloc'd; NULL when it cannot be read. */
static char *read_whole(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = malloc(1 << 20);
    *n = b ? fread(b, 1, 1 << 20, f) : 0;
    fclose(f);
    return b;
}

/* An output naming an input or the other output was written over it: the
 * corpus, the vocab or the token file being decoded replaced, or --val-out
 * equal to -o leaving only the validation tokens (exit 0). Refused now,
 * exit 2, every file as it was. */
TEST(outputs_over_inputs_refused)
{
    size_t n;
    char *corpus = make_corpus(&n);
    char *c = tp(0, "same-corpus.txt"), *v = tp(1, "same-v.bpe"), *tr = tp(2, "same-train.bin");
    write_file(c, corpus, n);
    cli_result r;
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--train-vocab", "300", c, "-o", v, NULL});
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--vocab", v, c, "-o", tr, NULL});
    ASSERT_EQ_INT(r.code, 0);
    char dot_tr[620];
    snprintf(dot_tr, sizeof dot_tr, "%s/./same-train.bin", cli_tmpdir());
    struct {
        char *args[12];
        const char *msg;
    } cases[] = {
        {{"tokenize", "--vocab", v, c, "-o", tr, "--val-fraction", "0.1", "--val-out", tr, NULL},
         "--val-out"},
        {{"tokenize", "--vocab", v, c, "-o", tr, "--val-fraction", "0.1", "--val-out", dot_tr, NULL},
         "is also -o"},
        {{"tokenize", "--vocab", v, c, "-o", c, NULL}, "is also the input"},
        {{"tokenize", "--train-vocab", "300", c, "-o", c, NULL}, "is also the input"},
        {{"tokenize", "--vocab", v, c, "-o", v, NULL}, "is also --vocab"},
        {{"tokenize", "--vocab", v, "--decode", tr, "-o", tr, NULL}, "is also --decode's file"},
        {{"tokenize", "--vocab", v, c, "-o", tr, "--val-fraction", "0.1", "--val-out", c, NULL}, "the input"},
    };
    char *before = NULL, *after = NULL;
    size_t nb = 0, na = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        free(before);
        before = read_whole(tr, &nb);
        ASSERT(before != NULL);
        cli_runv(&r, 60, NULL, cases[i].args);
        if (r.code != 2 || !strstr(r.err, cases[i].msg) || cli_lines(r.err) != 1) {
            fprintf(stderr, "  case %zu: exit %d, stderr '%s'\n", i, r.code, r.err);
            ASSERT(0);
        }
        free(after);
        after = read_whole(tr, &na);
        ASSERT(after != NULL && na == nb && !memcmp(before, after, nb)); /* the token file as it was */
    }
    size_t nc = 0;
    char *c2 = read_whole(c, &nc);
    ASSERT(c2 != NULL && nc == n && !memcmp(c2, corpus, n)); /* the corpus as it was */
    free(c2);
    free(before);
    free(after);
    free(corpus);
}

/* A text prompt through a tokenizer.json stops at the tokenizer's eos_token (as transformers' generate stops at the
 * model's eos_token_id; it went on to --max-new-tokens): the token a model's greedy step picks is named eos_token in
 * a tokenizer_config.json beside the tokenizer, and the text then ends there; --eos-id none goes on. */
TEST(generate_stops_at_the_tokenizers_eos)
{
    char src[1024], dir[700], cmd[2600];
    snprintf(src, sizeof src, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    snprintf(dir, sizeof dir, "%s", tp(2, "eos_tokdir"));
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/tokenizer.json'", dir, src, dir);
    ASSERT_EQ_INT(system(cmd), 0);
    dt_tokenizer *t = NULL;
    ASSERT_OK(dt_tokenizer_load(src, &t));
    const char *prompt = "In the beginning";
    char list[256];
    ASSERT(prompt_ids(t, prompt, list, sizeof list) > 0);
    char vs[32];
    snprintf(vs, sizeof vs, "%lld", (long long)dt_tokenizer_vocab_size(t));
    cli_result r; /* the first token the untrained model picks after the prompt */
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--prompt-ids", list,
                                      "--temperature", "0", "--max-new-tokens", "1", NULL});
    ASSERT_EQ_INT(r.code, 0);
    const char *bar = strstr(r.out, "| ");
    ASSERT(bar);
    const uint32_t first = (uint32_t)atol(bar + 2);
    char *text = NULL; /* its text as the tokenizer.json writes it: the vocab key (or added token) of that id */
    FILE *f = fopen(src, "rb");
    ASSERT(f != NULL);
    char *js = malloc(1 << 20);
    size_t jn = fread(js, 1, (1 << 20) - 1, f);
    fclose(f);
    js[jn] = 0;
    cJSON *root = cJSON_Parse(js), *vocab = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "model"), "vocab");
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!text && (uint32_t)e->valuedouble == first)
            text = strdup(e->string);
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "added_tokens")) {
        if (!text && (uint32_t)cJSON_GetObjectItem(e, "id")->valuedouble == first)
            text = strdup(cJSON_GetObjectItem(e, "content")->valuestring);
    }
    cJSON_Delete(root);
    free(js);
    ASSERT(text != NULL);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "eos_token", text);
    char *ct = cJSON_PrintUnformatted(cfg), p[800];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs(ct, f);
    fclose(f);
    cJSON_free(ct);
    cJSON_Delete(cfg);
    free(text);
    dt_tokenizer_free(t);
    static cli_result a, b, c;
    cli_runv(&a, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--prompt", (char *)prompt, "--temperature", "0", "--max-new-tokens", "6", NULL});
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--prompt", (char *)prompt, "--temperature", "0", "--max-new-tokens", "1",
                                      "--eos-id", "none", NULL});
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--prompt", (char *)prompt, "--temperature", "0", "--max-new-tokens", "6",
                                      "--eos-id", "none", NULL});
    ASSERT_EQ_INT(a.code, 0);
    ASSERT_EQ_INT(b.code, 0);
    ASSERT_EQ_INT(c.code, 0);
    ASSERT_STR_EQ(a.out, b.out); /* stopped after the eos token, which is printed */
    ASSERT(strlen(c.out) > strlen(a.out));
}

/* Conversations through the CLI: a model directory's tokenizer with a chat template (tokenizer_config.json);
 * `dtrain generate --chat on --system S --prompt P` gives the tokens of the template's rendering of
 * [system, user] with the generation prompt (the same output as --prompt-ids of those ids); `dtrain train` on
 * TRL's {"messages": [...]} lines trains, and its checkpoint keeps the template for generate --ckpt --chat. Misuse
 * exits 2, named. */
TEST(chat_template_cli)
{
    char src[1024], dir[700], cmd[2600];
    snprintf(src, sizeof src, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    snprintf(dir, sizeof dir, "%s", tp(3, "chat_tokdir"));
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/tokenizer.json'", dir, src, dir);
    ASSERT_EQ_INT(system(cmd), 0);
    const char *cfg =
        "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"chat_template\": \"{{ bos_token }}"
        "{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | "
        "trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
        "<|end_header_id|>\\n\\n' }}{% endif %}\"}";
    ASSERT(t_write_in(dir, "tokenizer_config.json", cfg));
    dt_tokenizer *t = NULL;
    ASSERT_OK(dt_tokenizer_load(dir, &t));
    const char *conv = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                       "\"Who made the light?\"}]";
    char *text = NULL, list[512] = "";
    size_t tl = 0;
    ASSERT_OK(dt_tokenizer_render_chat(t, conv, strlen(conv), true, NULL, 0, &text, &tl));
    ASSERT_STR_CONTAINS(text, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    uint32_t *ids;
    int64_t n;
    ASSERT_OK(dt_tokenizer_encode(t, text, tl, false, &ids, &n));
    for (int64_t i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%u", i ? "," : "", ids[i]);
    free(ids);
    free(text);
    char vs[32];
    snprintf(vs, sizeof vs, "%lld", (long long)dt_tokenizer_vocab_size(t));
    static cli_result a, b;
    cli_runv(&a, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--prompt-ids", list,
                                      "--temperature", "0", "--max-new-tokens", "5", "--eos-id", "none", NULL});
    cli_runv(&b, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--chat", "on", "--system", "Be brief.", "--prompt", "Who made the light?",
                                      "--temperature", "0", "--max-new-tokens", "5", "--eos-id", "none", NULL});
    if (a.code != 0 || b.code != 0)
        fprintf(stderr, "%s\n%s\n%s\n%s\n", a.out, a.err, b.out, b.err);
    ASSERT_EQ_INT(b.code, 0);
    ASSERT_STR_CONTAINS(b.out, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>");
    ASSERT_EQ_INT(a.code, 0);
    uint32_t got[128]; /* --prompt-ids prints ids: decoded, the chat run's text */
    const int64_t ng = printed_ids(a.out, got, 128);
    ASSERT_EQ_INT(ng, n + 5);
    char *want;
    size_t wl;
    ASSERT_OK(dt_tokenizer_decode(t, got, ng, false, &want, &wl));
    ASSERT(strlen(b.out) == wl + 1 && !strncmp(b.out, want, wl));
    free(want);
    dt_tokenizer_free(t);
    /* the same conversation as a file (--messages, as a pipeline takes messages): the same output */
    ASSERT(t_write_in(dir, "conv.json", conv));
    char convp[800];
    snprintf(convp, sizeof convp, "%s/conv.json", dir);
    static cli_result c;
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--messages", convp, "--temperature", "0", "--max-new-tokens", "5", "--eos-id",
                                      "none", NULL});
    ASSERT_EQ_INT(c.code, 0);
    ASSERT_STR_EQ(c.out, b.out);
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--messages", convp, "--prompt", "x", NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "not with --prompt");
    ASSERT(t_write_in(dir, "bad.json", "{\"role\": \"user\"}"));
    snprintf(convp, sizeof convp, "%s/bad.json", dir);
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--messages", convp, NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "bad.json");
    /* a conversation ending with the assistant's words: continued (a pipeline's default), or a new turn (off) */
    const char *part = "[{\"role\": \"user\", \"content\": \"Who made the light?\"}, {\"role\": \"assistant\", "
                       "\"content\": \"It was \"}]";
    ASSERT(t_write_in(dir, "part.json", part));
    snprintf(convp, sizeof convp, "%s/part.json", dir);
    ASSERT_OK(dt_tokenizer_load(dir, &t));
    for (int k = 0; k < 3; k++) { /* auto, on, off */
        char *w = NULL;
        size_t wn = 0;
        ASSERT_OK(dt_tokenizer_render_chat(t, part, strlen(part), k < 2 ? DT_CHAT_CONTINUE : DT_CHAT_GENERATION_PROMPT,
                                           NULL, 0, &w, &wn));
        ASSERT(k == 2 || (wn > 6 && !strcmp(w + wn - 6, "It was"))); /* the template trims the content */
        cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                          "--messages", convp, "--temperature", "0", "--max-new-tokens", "3",
                                          "--eos-id", "none", k ? "--continue-final-message" : "--chat",
                                          k == 1 ? "on" : k ? "off" : "on", NULL});
        if (c.code != 0 || strncmp(c.out, w, wn))
            fprintf(stderr, "continue %d: want the start\n%s\ngot\n%s\n%s\n", k, w, c.out, c.err);
        ASSERT_EQ_INT(c.code, 0);
        ASSERT(!strncmp(c.out, w, wn) && strlen(c.out) > wn);
        ASSERT(k == 2 || strncmp(c.out + wn, "<|eot_id|>", 10)); /* continued, not the turn's end */
        free(w);
    }
    dt_tokenizer_free(t);
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--chat", "on", "--prompt", "x", "--continue-final-message", "on", NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "--continue-final-message continues the final message of --messages");
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--messages", convp, "--continue-final-message", "yes", NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "want auto, on or off");
    /* the template's keyword arguments and tools (Qwen3's enable_thinking; apply_chat_template(tools=...)) */
    char kdir[720];
    snprintf(kdir, sizeof kdir, "%.700s/kw", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/tokenizer.json'", kdir, src, kdir);
    ASSERT_EQ_INT(system(cmd), 0);
    ASSERT(t_write_in(kdir, "tokenizer_config.json",
                      "{\"chat_template\": \"{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in "
                      "messages %}{{ m.role }}: {{ m.content }}\\n{% endfor %}{% if add_generation_prompt %}"
                      "assistant:{% if enable_thinking is false %} <think></think>{% endif %}{% endif %}\"}"));
    ASSERT(t_write_in(kdir, "tools.json", "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]"));
    char toolsp[900];
    snprintf(toolsp, sizeof toolsp, "%s/tools.json", kdir);
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", kdir,
                                      "--chat", "on", "--prompt", "Hi", "--chat-template-kwargs",
                                      "{\"enable_thinking\": false}", "--tools", toolsp, "--temperature", "0",
                                      "--max-new-tokens", "2", "--eos-id", "none", NULL});
    ASSERT_EQ_INT(c.code, 0);
    const char *kwant = "<tools>[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]</tools>user: Hi\n"
                        "assistant: <think></think>";
    if (strncmp(c.out, kwant, strlen(kwant)))
        fprintf(stderr, "kwargs: got %s\n", c.out);
    ASSERT(!strncmp(c.out, kwant, strlen(kwant)));
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", kdir,
                                      "--chat", "on", "--prompt", "Hi", "--chat-template-kwargs", "[1]", NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "--chat-template-kwargs: want a JSON object");
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", kdir,
                                      "--chat", "on", "--prompt", "Hi", "--tools", convp, NULL});
    ASSERT_EQ_INT(c.code, 0); /* a list (of messages here): the template takes any list */
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", kdir,
                                      "--prompt", "Hi", "--tools", toolsp, NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "--tools goes to the chat template");
    ASSERT(t_write_in(kdir, "notlist.json", "{}"));
    snprintf(toolsp, sizeof toolsp, "%s/notlist.json", kdir);
    cli_runv(&c, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", kdir,
                                      "--chat", "on", "--prompt", "Hi", "--tools", toolsp, NULL});
    ASSERT_EQ_INT(c.code, 2);
    ASSERT_STR_CONTAINS(c.err, "want a JSON list of tool schemas");
    /* training on conversations, the template kept by the checkpoint */
    char *data = tp(4, "chats.jsonl"), *ck = tp(5, "chat_ck");
    FILE *f = fopen(data, "w");
    ASSERT(f != NULL);
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Who made the light? %d\"}, {\"role\": "
                   "\"assistant\", \"content\": \"God made the light on day %d.\"}]}\n", i, i % 7);
    fclose(f);
    char spec[700];
    snprintf(spec, sizeof spec, "jsonl:%s", data);
    cli_result r;
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", dir, "--data", spec, "--seq",
                                       "32", "--batch", "4", "--max-steps", "2", "--no-eval", "--save", ck,
                                       "--threads", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--ckpt", ck, "--chat", "on", "--prompt", "Who made the light?",
                                      "--temperature", "0", "--max-new-tokens", "3", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWho made the light?");
    /* --assistant-only-loss: refused while the template marks no assistant turn, then trained with one that does
       (and eval --ckpt evaluates the same way: the run's option is kept) */
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", dir, "--data", spec, "--seq",
                                       "32", "--batch", "4", "--max-steps", "1", "--no-eval", "--assistant-only-loss",
                                       "--threads", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "{% generation %}");
    const char *gcfg =
        "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"chat_template\": \"{{ bos_token }}"
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\\n\\n{% if m.role == 'assistant' %}"
        "{% generation %}{{ m.content }}<|eot_id|>{% endgeneration %}{% else %}{{ m.content }}<|eot_id|>{% endif %}"
        "{% endfor %}\"}";
    ASSERT(t_write_in(dir, "tokenizer_config.json", gcfg));
    /* what training will see: dtrain tokenize --show, the skipped targets bracketed */
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", dir, "--show", spec, "--assistant-only-loss",
                                      "--show-tokens", "60", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "targets the loss counts");
    ASSERT_STR_CONTAINS(r.out, "(--assistant-only-loss)");
    ASSERT_STR_CONTAINS(r.out, "\n<|begin_of_text|>\u27e6<|start_header_id|>user<|end_header_id|>\n\nWho made the "
                               "light? 0<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n\u27e7God made the "
                               "light on day 0.<|eot_id|>\u27e6<|begin_of_text|>");
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", dir, "--show-tokens", "5", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--show-tokens goes with --show SPEC");
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", dir, "--show", spec, "--loss-mask", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "is --assistant-only-loss");
    char *ck2 = tp(5, "chat_ck_asst");
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", dir, "--data", spec, "--seq",
                                       "32", "--batch", "4", "--max-steps", "2", "--assistant-only-loss", "--val-data",
                                       spec, "--save", ck2, "--threads", "1", NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 120, NULL, (char *[]){"eval", "--ckpt", ck2, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    char txt[700];
    snprintf(txt, sizeof txt, "text:%s", data);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", dir, "--data", txt,
                                      "--assistant-only-loss", "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--assistant-only-loss takes GPT models on conversations");
    /* misuse */
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--prompt-ids", "1,2",
                                      "--chat", "on", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--chat goes with --prompt through a tokenizer.json");
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", dir,
                                      "--system", "x", "--prompt", "hi", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "give --chat on");
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", src,
                                      "--chat", "on", "--prompt", "hi", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "has none");
}

/* --chat-template FILE (TRL's chat_template_path): a tokenizer without a template trains on conversations with it;
 * the checkpoint keeps it (generate --ckpt --chat on renders with it); --save-hf writes it into
 * tokenizer_config.json, as it writes a tokenizer directory's own template; generate --chat-template FILE renders
 * with it; without a tokenizer it is refused (exit 2). */
TEST(chat_template_option)
{
    char src[1024], tmpl[700], spec[700];
    snprintf(src, sizeof src, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    snprintf(tmpl, sizeof tmpl, "%s", tp(6, "turns.jinja"));
    FILE *f = fopen(tmpl, "w");
    ASSERT(f != NULL);
    fputs("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>{{ m.content }}<|eot_id|>"
          "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}", f);
    fclose(f);
    char *data = tp(7, "turns.jsonl"), *ck = tp(8, "turns_ck"), *out = tp(9, "turns_hf");
    f = fopen(data, "w");
    ASSERT(f != NULL);
    for (int i = 0; i < 20; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi %d\"}, {\"role\": \"assistant\", "
                   "\"content\": \"Hello %d.\"}]}\n", i, i);
    fclose(f);
    snprintf(spec, sizeof spec, "jsonl:%s", data);
    cli_result r;
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", src, "--data", spec, "--seq",
                                       "16", "--batch", "2", "--max-steps", "1", "--no-eval", "--threads", "1", NULL});
    ASSERT_EQ_INT(r.code, 2); /* the tokenizer has no template */
    ASSERT_STR_CONTAINS(r.err, "has none");
    cli_runv(&r, 60, NULL, (char *[]){"tokenize", "--tokenizer", src, "--show", spec, "--chat-template", tmpl,
                                      "--show-tokens", "12", NULL}); /* what training will see */
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "<|start_header_id|>user<|end_header_id|>Hi 0<|eot_id|>");
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", src, "--chat-template", tmpl,
                                       "--data", spec, "--seq", "16", "--batch", "2", "--max-steps", "1", "--no-eval",
                                       "--threads", "1", "--save", ck, "--save-hf", out, NULL});
    if (r.code != 0)
        fprintf(stderr, "%s\n%s\n", r.out, r.err);
    ASSERT_EQ_INT(r.code, 0);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--ckpt", ck, "--chat", "on", "--prompt", "Hi", "--temperature",
                                      "0", "--max-new-tokens", "2", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT_STR_CONTAINS(r.out, "<|start_header_id|>user<|end_header_id|>Hi<|eot_id|><|start_header_id|>assistant");
    char cfgp[800];
    snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", out);
    size_t n = 0;
    char *cfg = t_slurp(cfgp, &n);
    ASSERT(cfg != NULL);
    ASSERT_STR_CONTAINS(cfg, "\"chat_template\":\t\"{% for m in messages %}<|start_header_id|>{{ m.role }}");
    free(cfg);
    /* generate with the template given */
    dt_tokenizer *t = NULL;
    ASSERT_OK(dt_tokenizer_load(src, &t));
    char vs[32];
    snprintf(vs, sizeof vs, "%lld", (long long)dt_tokenizer_vocab_size(t));
    dt_tokenizer_free(t);
    cli_runv(&r, 60, NULL, (char *[]){"generate", "--model", "gpt-micro", "--vocab-size", vs, "--tokenizer", src,
                                      "--chat-template", tmpl, "--chat", "on", "--prompt", "Hi", "--temperature",
                                      "0", "--max-new-tokens", "1", "--eos-id", "none", NULL});
    ASSERT_EQ_INT(r.code, 0);
    ASSERT(!strncmp(r.out, "<|start_header_id|>user<|end_header_id|>Hi<|eot_id|>", 52));
    /* a tokenizer directory's own template reaches the export too */
    char *dir = tp(10, "turns_tokdir"), *out2 = tp(11, "turns_hf2"), cmd[2400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/tokenizer.json' && cp '%s' '%s/chat_template.jinja'", dir,
             src, dir, tmpl, dir);
    ASSERT_EQ_INT(system(cmd), 0);
    cli_runv(&r, 120, NULL, (char *[]){"train", "--model", "gpt-micro", "--tokenizer", dir, "--data", spec, "--seq",
                                       "16", "--batch", "2", "--max-steps", "1", "--no-eval", "--threads", "1",
                                       "--save-hf", out2, NULL});
    ASSERT_EQ_INT(r.code, 0);
    snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", out2);
    cfg = t_slurp(cfgp, &n);
    ASSERT(cfg != NULL);
    ASSERT_STR_CONTAINS(cfg, "\"chat_template\":\t\"{% for m in messages %}<|start_header_id|>{{ m.role }}");
    free(cfg);
    cli_runv(&r, 60, NULL, (char *[]){"train", "--model", "gpt-micro", "--data", "tokens:x.bin", "--chat-template",
                                      tmpl, "--max-steps", "1", NULL});
    ASSERT_EQ_INT(r.code, 2);
    ASSERT_STR_CONTAINS(r.err, "--chat-template FILE replaces the chat template of the tokenizer");
}

int main(void)
{
    RUN(train_encode_split_decode);
    RUN(tokenizer_json);
    RUN(train_on_text);
    RUN(eval_ckpt_uses_its_tokenizer);
    RUN(train_loss_mask);
    RUN(train_no_packing);
    RUN(generate_with_tokenizer);
    RUN(generate_stops_at_the_tokenizers_eos);
    RUN(chat_template_cli);
    RUN(chat_template_option);
    RUN(generate_vocab_wide_model);
    RUN(wide_ids);
    RUN(bad_usage_and_input);
    RUN(bad_text_in_val_part_writes_nothing);
    RUN(fifo_inputs);
    RUN(outputs_over_inputs_refused);
    cli_cleanup();
    return TEST_REPORT();
}
