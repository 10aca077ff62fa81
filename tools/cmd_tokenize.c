/* dtrain tokenize — train a byte-level BPE vocabulary on a corpus, encode
 * a text into an llm.c token file (optionally split into training and
 * validation files), or decode a token file back to text. Parsing and
 * printing only: the tokenizer and the token files are data.h's. */
#include "cmd.h"
#include "dtrain/data.h"
#include "dtrain/kernels.h"
#include "dtrain/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain tokenize --train-vocab N CORPUS -o VOCAB [--min-count C]\n"
            "       dtrain tokenize --vocab VOCAB CORPUS -o TOKENS.bin [--val-fraction F --val-out VAL.bin]\n"
            "       dtrain tokenize --vocab VOCAB --decode TOKENS.bin -o TEXT\n"
            "       dtrain tokenize --unigram TRAIN.bin [EVAL.bin] [--vocab VOCAB]\n"
            "       dtrain tokenize --tokenizer FILE --show SPEC [--loss-mask] [--assistant-only-loss]\n"
            "                       [--show-tokens N] [--packing off --seq T] [--chat-template FILE]\n"
            "       (--tokenizer TOKENIZER.json in place of --vocab VOCAB everywhere)\n"
            "  --train-vocab N    learn a byte-level BPE of N ids (256..65536: the 256 bytes and N-256\n"
            "                     merges) from CORPUS and write the vocab file VOCAB; a VOCAB named\n"
            "                     *.json is written as a Hugging Face tokenizer.json instead (what\n"
            "                     transformers and tokenizers load: the same ids for every text, plus\n"
            "                     the special token <|endoftext|> as id N)\n"
            "  --min-count C      stop merging when the best pair occurs fewer than C times (default 2)\n"
            "  --vocab VOCAB      encode CORPUS with VOCAB into an llm.c token file: uint16 ids (magic\n"
            "                     20240520), or uint32 (magic 20240801, llm.c's Llama-3 file) when the\n"
            "                     vocabulary has more than 65536 ids\n"
            "  --tokenizer FILE   a Hugging Face tokenizer.json (or a model directory holding one) with a\n"
            "                     byte-level BPE model (GPT-2, Llama-3, Qwen2 style): the ids the\n"
            "                     tokenizers library gives (encode(text, add_special_tokens=False)); added\n"
            "                     tokens written in the text (<|endoftext|>) are their ids\n"
            "  --val-fraction F   put the last F of the text (0 < F < 1, cut at a line end) in VAL.bin\n"
            "                     and the rest in TOKENS.bin, each encoded on its own\n"
            "  --decode FILE      write the text of token file FILE\n"
            "  --unigram TRAIN    print the unigram baseline: the cross-entropy (nats per token) of EVAL's\n"
            "                     tokens (default TRAIN's) under TRAIN's token counts, add-one smoothed\n"
            "                     over VOCAB's ids (default: the largest token + 1). A language model's\n"
            "                     validation loss should end well below it\n"
            "  --show SPEC        what dtrain train --data SPEC (text:FILE, jsonl:FILE[,...] or\n"
            "                     parquet:FILE[,...], with the same --tokenizer) trains on: its token\n"
            "                     count, how many are targets the loss counts, and its first N tokens\n"
            "                     (--show-tokens, default 512) as\n"
            "                     text, the targets the loss skips (label -100) inside \u27e6 \u27e7: a\n"
            "                     conversation through the chat template, --loss-mask's prompts and\n"
            "                     --assistant-only-loss's turns other than the assistant's (as train takes\n"
            "                     those options); with --packing off --seq T also the samples train makes of\n"
            "                     the records then (one each: its first T tokens) and the targets they count;\n"
            "                     --chat-template FILE renders conversations with it (as train takes it)\n"
            "  -o FILE            the output; written atomically (complete or absent), never\n"
            "                     through a symlink\n"
            "  e.g. bible Gen1:1-Rev22:21 > kjv.txt\n"
            "       dtrain tokenize --train-vocab 4096 kjv.txt -o kjv.bpe\n"
            "       dtrain tokenize --vocab kjv.bpe kjv.txt -o train.bin --val-fraction 0.1 --val-out val.bin\n"
            "       dtrain tokenize --tokenizer gpt2/tokenizer.json kjv.txt -o train.bin\n");
}

/* The whole of path (size in *n). NULL with a message on failure. Opened
 * without blocking and refused unless a regular file: a FIFO would wait
 * for a writer for ever, /dev/zero never end. */
static char *read_all(const char *path, size_t *n)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat sb;
    const char *why = fd < 0 || fstat(fd, &sb) < 0 ? strerror(errno)
                      : !S_ISREG(sb.st_mode)          ? "not a regular file"
                                                      : NULL;
    FILE *f = why ? NULL : fdopen(fd, "rb");
    if (!f) {
        dt__cli_err("dtrain tokenize: %s: cannot open: %s\n", path, why ? why : strerror(errno));
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    size_t cap = 1 << 20, len = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *nb = cap < ((size_t)1 << 32) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        dt__cli_err("dtrain tokenize: %s: %s\n", path, !buf ? "too large or out of memory" : "read error (a directory?)");
        free(buf);
        return NULL;
    }
    *n = len;
    return buf;
}

/* The vocabulary in use: dtrain's BPE or a tokenizer.json. */
typedef struct vocab_src {
    dt_bpe *bpe;
    dt_tokenizer *tok;
} vocab_src;

static dt_status vocab_open(const char *vocab, const char *tokenizer, vocab_src *v)
{
    v->bpe = NULL;
    v->tok = NULL;
    return tokenizer ? dt_tokenizer_load(tokenizer, &v->tok) : dt_bpe_load(vocab, &v->bpe);
}

static void vocab_close(vocab_src *v)
{
    dt_bpe_free(v->bpe);
    dt_tokenizer_free(v->tok);
}

static int64_t vocab_size(const vocab_src *v)
{
    return v->tok ? dt_tokenizer_vocab_size(v->tok) : dt_bpe_vocab_size(v->bpe);
}

/* Token files hold uint16 ids (llm.c's GPT-2 file) unless the vocabulary
 * has more than 65,536 ids: then uint32 (its Llama-3 file). The width
 * follows the vocabulary, not the text, so every file of one tokenizer has
 * the same kind. */
static bool wide_vocab(const vocab_src *v) { return vocab_size(v) > 65536; }

/* Encode into ids: 1 with a message on failure, 2 for bad input. The
 * message names WHAT, the text's source. */
static int vocab_encode(const vocab_src *v, const char *what, const char *text, size_t n, uint32_t **out,
                        int64_t *nout)
{
    if (v->bpe) {
        uint16_t *ids;
        int64_t ni;
        if (dt_bpe_encode(v->bpe, text, n, &ids, &ni) < 0) {
            dt__cli_err("dtrain tokenize: %s: %s\n", what, dt_last_error());
            return 1;
        }
        uint32_t *o = malloc((size_t)(ni ? ni : 1) * sizeof *o);
        for (int64_t i = 0; o && i < ni; i++)
            o[i] = ids[i];
        free(ids);
        if (!o) {
            dt__cli_err("dtrain tokenize: out of memory\n");
            return 1;
        }
        *out = o;
        *nout = ni;
        return 0;
    }
    dt_status st = dt_tokenizer_encode(v->tok, text, n, false, out, nout);
    if (st < 0) {
        dt__cli_err("dtrain tokenize: %s: %s\n", what, dt_last_error());
        return st == DT_ERR_INVALID_ARG ? 2 : 1;
    }
    return 0;
}

static dt_status vocab_decode(const vocab_src *v, const dt_tokens *t, char **text, size_t *len)
{
    int64_t n = dt_tokens_count(t);
    if (v->bpe) {
        if (dt_tokens_data(t))
            return dt_bpe_decode(v->bpe, dt_tokens_data(t), n, text, len);
        return dt_error(DT_ERR_FORMAT, "a uint32 token file with a dtrain vocabulary (at most 65,536 ids)");
    }
    uint32_t *w = malloc((size_t)(n ? n : 1) * sizeof *w);
    if (!w)
        return dt_error(DT_ERR_NO_MEMORY, "decode: out of memory");
    for (int64_t i = 0; i < n; i++)
        w[i] = dt_tokens_at(t, i);
    dt_status st = dt_tokenizer_decode(v->tok, w, n, false, text, len);
    free(w);
    return st;
}

/* Write ids (encoded from n bytes) as the token file OUT; frees ids. */
static int write_ids(const vocab_src *v, uint32_t *ids, int64_t ni, size_t n, const char *out)
{
    bool wide = wide_vocab(v);
    dt_status st = DT_OK;
    if (wide) {
        st = dt_tokens_write_u32(out, ids, ni);
    } else {
        uint16_t *u = malloc((size_t)(ni ? ni : 1) * sizeof *u);
        for (int64_t i = 0; u && i < ni; i++)
            u[i] = (uint16_t)ids[i]; /* every id < vocab size <= 65536 */
        st = u ? dt_tokens_write(out, u, ni) : dt_error(DT_ERR_NO_MEMORY, "out of memory");
        free(u);
    }
    free(ids);
    if (st < 0) {
        dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
        return st == DT_ERR_INVALID_ARG ? 2 : 1;
    }
    char esc[300];
    printf("%s: %lld tokens from %zu bytes (%.2f bytes per token; %s ids)\n", dt_escape(out, esc, sizeof esc),
           (long long)ni, n, ni ? (double)n / (double)ni : 0.0, wide ? "uint32" : "uint16");
    return 0;
}

static int unigram_baseline(const char *train, const char *eval, const char *vocab, const char *tokenizer,
                            bool extra)
{
    if (extra) {
        dt__cli_err("dtrain tokenize: --unigram takes one or two token files and --vocab or --tokenizer only\n");
        return 2;
    }
    int64_t V = 0;
    if (vocab || tokenizer) {
        vocab_src v;
        if (vocab_open(vocab, tokenizer, &v) < 0) {
            dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
            return 2;
        }
        V = vocab_size(&v);
        vocab_close(&v);
    }
    dt_tokens *a = NULL, *b = NULL;
    double h = 0;
    int rc = 0;
    if (dt_tokens_open(train, V, &a) < 0 || (eval && dt_tokens_open(eval, V, &b) < 0) ||
        dt_tokens_unigram_xent(a, b ? b : a, V, &h) < 0) {
        dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
        rc = 2;
    } else {
        char e1[300], e2[300];
        printf("unigram cross-entropy of %s under the token counts of %s: %.4f nats per token\n",
               dt_escape(eval ? eval : train, e1, sizeof e1), dt_escape(train, e2, sizeof e2), h);
    }
    dt_tokens_close(a);
    dt_tokens_close(b);
    return rc;
}

/* --packing off --seq T: the samples of the records (per_record) and the targets they count, printed. */
static int show_records(const dt_tokenizer *t, const char *spec, dt_tokens_params kp, int64_t T)
{
    dt_dataset *ds = NULL;
    kp.seq_len = T;
    kp.stride = 0;
    kp.per_record = true;
    int64_t *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)T * sizeof *y), counted = 0;
    int rc = x && y ? 0 : 1;
    if (rc == 0 && dt_dataset_text_open(spec, t, &kp, &ds) < 0)
        rc = dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2;
    const int64_t items = ds ? dt_dataset_length(ds) : 0;
    for (int64_t i = 0; rc == 0 && i < items; i++) {
        if (dt_dataset_get_item(ds, i, x, y) < 0) {
            rc = 1;
            break;
        }
        for (int64_t k = 0; k < T; k++)
            counted += y[k] != DT_K_IGNORE_INDEX;
    }
    if (rc)
        dt__cli_err("dtrain tokenize: --show %s: %s\n", spec, rc == 1 && !x ? "out of memory" : dt_last_error());
    else
        printf("--packing off --seq %lld: %lld samples (one a record, its first %lld tokens), %lld targets the loss "
               "counts (%.1f%% of the positions)\n", (long long)T, (long long)items, (long long)T,
               (long long)counted, items ? 100.0 * (double)counted / ((double)items * (double)T) : 0.0);
    dt_dataset_free(ds);
    free(x);
    free(y);
    return rc;
}

/* --show SPEC: the data set dtrain train builds from SPEC, its first n tokens as text with the targets the loss
 * skips marked; T > 0: also its records as --packing off --seq T makes them samples (show_records). */
static int show_data(const char *spec, const char *tokenizer, const char *tmpl, bool loss_mask, bool assistant_only,
                     int64_t n, int64_t T)
{
    dt_tokenizer *t = NULL;
    dt_dataset *ds = NULL;
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 1; /* item i: token i and its successor's label */
    kp.stride = 1;
    kp.completion_only_loss = loss_mask;
    kp.assistant_only_loss = assistant_only;
    char *tx = NULL; /* --chat-template FILE: in place of the tokenizer's */
    size_t tn = 0;
    if (dt_tokenizer_load(tokenizer, &t) < 0 || (tmpl && dt_file_read_all(tmpl, (size_t)1 << 20, &tx, &tn) < 0) ||
        (tmpl && dt_tokenizer_set_chat_template(t, tx, tn, tmpl) < 0) ||
        dt_dataset_text_open(spec, t, &kp, &ds) < 0) {
        free(tx);
        const dt_status st = dt_last_status();
        dt__cli_err("dtrain tokenize: --show %s: %s\n", spec, dt_last_error());
        dt_tokenizer_free(t);
        return st == DT_ERR_NO_MEMORY ? 1 : 2;
    }
    free(tx);
    /* item i is token i and the label of token i + 1: the first `items` tokens are shown (the very last one of the
       set is a label only), each with its own label (the first token is no target) */
    const int64_t items = dt_dataset_length(ds), total = items ? items + 1 : 0;
    if (n > items)
        n = items;
    uint32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
    bool *skip = malloc((size_t)(n ? n : 1) * sizeof *skip);
    int64_t counted = 0, x, y;
    int rc = ids && skip ? 0 : 1;
    for (int64_t i = 0; rc == 0 && i < items; i++) { /* every label, for the count; the first n tokens kept */
        if (dt_dataset_get_item(ds, i, &x, &y) < 0) {
            dt__cli_err("dtrain tokenize: --show %s: %s\n", spec, dt_last_error());
            rc = 1;
            break;
        }
        counted += y != DT_K_IGNORE_INDEX;
        if (i < n)
            ids[i] = (uint32_t)x;
        if (i == 0 && n > 0)
            skip[0] = false;
        if (i + 1 < n)
            skip[i + 1] = y == DT_K_IGNORE_INDEX;
    }
    char esc[700];
    if (rc == 0) {
        printf("%s: %lld tokens, %lld of them targets the loss counts (%.1f%%)%s%s\n",
               dt_escape(spec, esc, sizeof esc), (long long)total, (long long)counted,
               items ? 100.0 * (double)counted / (double)items : 0.0, loss_mask ? " (--loss-mask)" : "",
               assistant_only ? " (--assistant-only-loss)" : "");
        printf("the first %lld tokens, the targets the loss skips inside \u27e6 \u27e7:\n", (long long)n);
    }
    for (int64_t i = 0; rc == 0 && i < n;) { /* runs of one kind, decoded as the tokenizer decodes them */
        int64_t j = i + 1;
        while (j < n && skip[j] == skip[i])
            j++;
        char *text = NULL;
        size_t len = 0;
        if (dt_tokenizer_decode(t, ids + i, j - i, false, &text, &len) < 0) {
            dt__cli_err("dtrain tokenize: --show %s: %s\n", spec, dt_last_error());
            rc = 1;
        } else {
            fputs(skip[i] ? "\u27e6" : "", stdout);
            fwrite(text, 1, len, stdout);
            fputs(skip[i] ? "\u27e7" : "", stdout);
        }
        free(text);
        i = j;
    }
    if (rc == 0)
        putchar('\n');
    if (rc == 0 && T > 0)
        rc = show_records(t, spec, kp, T);
    free(ids);
    free(skip);
    dt_dataset_free(ds);
    dt_tokenizer_free(t);
    return rc;
}

int dt_cmd_tokenize(int argc, char **argv)
{
    const char *train_vocab = NULL, *vocab = NULL, *decode = NULL, *out = NULL, *val_out = NULL,
               *corpus = NULL, *val_frac_s = NULL, *min_count_s = NULL, *unigram = NULL, *tokenizer = NULL,
               *show = NULL, *show_n = NULL, *packing = NULL, *seq = NULL, *tmpl = NULL;
    bool loss_mask = false, assistant_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--loss-mask")) {
            loss_mask = true;
            continue;
        } else if (!strcmp(a, "--assistant-only-loss")) {
            assistant_only = true;
            continue;
        } else if (!strcmp(a, "--show"))
            dst = &show;
        else if (!strcmp(a, "--show-tokens"))
            dst = &show_n;
        else if (!strcmp(a, "--packing"))
            dst = &packing;
        else if (!strcmp(a, "--seq"))
            dst = &seq;
        else if (!strcmp(a, "--chat-template"))
            dst = &tmpl;
        else if (!strcmp(a, "--train-vocab"))
            dst = &train_vocab;
        else if (!strcmp(a, "--vocab"))
            dst = &vocab;
        else if (!strcmp(a, "--tokenizer"))
            dst = &tokenizer;
        else if (!strcmp(a, "--decode"))
            dst = &decode;
        else if (!strcmp(a, "-o"))
            dst = &out;
        else if (!strcmp(a, "--val-out"))
            dst = &val_out;
        else if (!strcmp(a, "--val-fraction"))
            dst = &val_frac_s;
        else if (!strcmp(a, "--min-count"))
            dst = &min_count_s;
        else if (!strcmp(a, "--unigram"))
            dst = &unigram;
        else if (a[0] == '-' && a[1]) {
            dt__cli_err("dtrain tokenize: unknown option '%s' (dtrain tokenize --help)\n", a);
            return 2;
        } else if (corpus) {
            dt__cli_err("dtrain tokenize: one input file only ('%s' and '%s')\n", corpus, a);
            return 2;
        } else {
            corpus = a;
            continue;
        }
        if (i + 1 >= argc) {
            dt__cli_err("dtrain tokenize: %s needs a value\n", a);
            return 2;
        }
        *dst = argv[++i];
    }
    if (vocab && tokenizer) {
        dt__cli_err("dtrain tokenize: give --vocab VOCAB or --tokenizer FILE, not both\n");
        return 2;
    }
    if ((loss_mask || assistant_only || show_n || packing || seq || tmpl) && !show) {
        dt__cli_err("dtrain tokenize: %s goes with --show SPEC\n",
                    loss_mask ? "--loss-mask" : assistant_only ? "--assistant-only-loss" : show_n ? "--show-tokens"
                    : packing ? "--packing" : seq ? "--seq" : "--chat-template");
        return 2;
    }
    int64_t T = 0;
    if (show && (packing || seq) &&
        (!packing || strcmp(packing, "off") || !seq || dt_parse_int("--seq", seq, 1, 1 << 24, &T) < 0)) {
        dt__cli_err("dtrain tokenize: --show SPEC takes --packing off with --seq T (T >= 1): the samples train "
                    "makes of the records at --seq T\n");
        return 2;
    }
    if (show) {
        int64_t n = 512;
        if (!tokenizer || vocab || corpus || out || train_vocab || decode || unigram || val_out || val_frac_s ||
            min_count_s) {
            dt__cli_err("dtrain tokenize: --show SPEC goes with --tokenizer FILE alone (and --loss-mask, "
                        "--assistant-only-loss, --show-tokens N, --packing off --seq T, --chat-template FILE)\n");
            return 2;
        }
        if (show_n && dt_parse_int("--show-tokens", show_n, 0, 1 << 24, &n) < 0) {
            dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
            return 2;
        }
        return show_data(show, tokenizer, tmpl, loss_mask, assistant_only, n, T);
    }
    if (unigram)
        return unigram_baseline(unigram, corpus, vocab, tokenizer,
                                out || train_vocab || decode || val_out || val_frac_s || min_count_s);
    bool have_vocab = vocab || tokenizer;
    int modes = !!train_vocab + (have_vocab && !decode) + !!decode;
    if (modes != 1 || (decode && !have_vocab)) {
        dt__cli_err("dtrain tokenize: give one of --train-vocab N, --vocab VOCAB (or --tokenizer FILE), or "
                    "--vocab VOCAB --decode FILE (dtrain tokenize --help)\n");
        return 2;
    }
    if (!out) {
        dt__cli_err("dtrain tokenize: -o FILE is required\n");
        return 2;
    }
    if (decode ? corpus != NULL : corpus == NULL) {
        dt__cli_err(decode ? "dtrain tokenize: --decode takes no other input file\n"
                           : "dtrain tokenize: give the input text file\n");
        return 2;
    }
    if ((val_frac_s || val_out) && (train_vocab || decode || !val_frac_s || !val_out)) {
        dt__cli_err("dtrain tokenize: --val-fraction F and --val-out FILE go together, with --vocab\n");
        return 2;
    }
    if (min_count_s && !train_vocab) {
        dt__cli_err("dtrain tokenize: --min-count goes with --train-vocab\n");
        return 2;
    }
    if (dt__cli_out_file("dtrain tokenize", "-o", out) ||
        (val_out && dt__cli_out_file("dtrain tokenize", "--val-out", val_out)))
        return 2;
    /* an output over an input or over the other output would lose what it held */
    const char *const ins[] = {corpus, decode, vocab, tokenizer, out};
    const char *const outs[] = {out, val_out};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 5 - (o == 0); k++)
            if (dt__cli_same_file(outs[o], ins[k])) {
                dt__cli_err("dtrain tokenize: %s %s is also %s: give another file name\n", o ? "--val-out" : "-o",
                            outs[o], k == 4 ? "-o" : k == 0 ? "the input" : k == 1 ? "--decode's file"
                                                          : k == 2 ? "--vocab" : "--tokenizer");
                return 2;
            }

    if (train_vocab) {
        dt_bpe_train_params tp = dt_bpe_train_params_default();
        if (dt_parse_int("--train-vocab", train_vocab, 256, DT_BPE_MAX_VOCAB, &tp.vocab_size) < 0 ||
            (min_count_s && dt_parse_int("--min-count", min_count_s, 1, INT64_MAX, &tp.min_count) < 0)) {
            dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
            return 2;
        }
        size_t n;
        char *text = read_all(corpus, &n);
        if (!text)
            return 2;
        double t0 = dt_time_s();
        dt_bpe *bpe;
        dt_status st = dt_bpe_train(text, n, &tp, &bpe);
        free(text);
        if (st < 0) {
            dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
            return st == DT_ERR_NO_MEMORY ? 1 : 2;
        }
        double secs = dt_time_s() - t0;
        size_t ol = strlen(out);
        bool json = ol >= 5 && !strcmp(out + ol - 5, ".json");
        st = json ? dt_bpe_save_tokenizer_json(bpe, "<|endoftext|>", out) : dt_bpe_save(bpe, out);
        int64_t V = dt_bpe_vocab_size(bpe);
        dt_bpe_free(bpe);
        if (st < 0) {
            dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
            return st == DT_ERR_UNSUPPORTED ? 2 : 1;
        }
        char esc[300];
        if (json)
            printf("%s: tokenizer.json, special token <|endoftext|> = id %lld\n", dt_escape(out, esc, sizeof esc),
                   (long long)V);
        printf("%s: vocab of %lld ids (256 bytes + %lld merges) learned from %zu bytes in %.2f s%s\n",
               dt_escape(out, esc, sizeof esc), (long long)V, (long long)(V - 256), n, secs,
               V < tp.vocab_size ? " (the text ran out of pairs before the size asked)" : "");
        return 0;
    }

    vocab_src vs;
    if (vocab_open(vocab, tokenizer, &vs) < 0) {
        dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
        return 2;
    }
    const vocab_src *bpe = &vs;
    int rc = 0;
    if (decode) {
        dt_tokens *t;
        char *text = NULL;
        size_t len = 0;
        if (dt_tokens_open(decode, vocab_size(bpe), &t) < 0) {
            dt__cli_err("dtrain tokenize: %s (vocab %s)\n", dt_last_error(), vocab ? vocab : tokenizer);
            rc = 2;
        } else {
            if (vocab_decode(bpe, t, &text, &len) < 0 ||
                dt_file_write_atomic(out, text, len, 0644) < 0) {
                dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
                rc = 1;
            } else {
                char esc[300];
                printf("%s: %zu bytes from %lld tokens\n", dt_escape(out, esc, sizeof esc), len,
                       (long long)dt_tokens_count(t));
            }
            free(text);
            dt_tokens_close(t);
        }
        vocab_close(&vs);
        return rc;
    }
    double frac = 0;
    if (val_frac_s && dt_parse_double("--val-fraction", val_frac_s, 0, 1, &frac) < 0) {
        dt__cli_err("dtrain tokenize: %s\n", dt_last_error());
        vocab_close(&vs);
        return 2;
    }
    if (val_frac_s && (frac <= 0 || frac >= 1)) {
        dt__cli_err("dtrain tokenize: --val-fraction %s: want a fraction strictly between 0 and 1\n", val_frac_s);
        vocab_close(&vs);
        return 2;
    }
    size_t n;
    char *text = read_all(corpus, &n);
    if (!text) {
        vocab_close(&vs);
        return 2;
    }
    size_t cut = n;
    if (val_frac_s) {
        /* the validation part starts after the line end at or after (1 - F) n */
        size_t at = (size_t)((1.0 - frac) * (double)n);
        const char *nl = at < n ? memchr(text + at, '\n', n - at) : NULL;
        cut = nl ? (size_t)(nl - text) + 1 : n;
        if (cut == 0 || cut >= n) {
            dt__cli_err("dtrain tokenize: %s: cannot split %zu bytes at a line end for --val-fraction %s\n",
                        corpus, n, val_frac_s);
            free(text);
            vocab_close(&vs);
            return 2;
        }
    }
    if (n == 0) {
        dt__cli_err("dtrain tokenize: %s is empty (a token file holds at least one token)\n", corpus);
        rc = 2;
    }
    /* both parts are encoded before either file is written: bad text
     * leaves neither */
    char what[600];
    uint32_t *ids = NULL, *val_ids = NULL;
    int64_t ni = 0, val_ni = 0;
    if (rc == 0) {
        dt_escape(corpus, what, sizeof what);
        rc = vocab_encode(bpe, what, text, cut, &ids, &ni);
    }
    if (rc == 0 && val_frac_s) {
        char esc[500];
        snprintf(what, sizeof what, "%s (its part for --val-out, from byte %zu)", dt_escape(corpus, esc, sizeof esc),
                 cut);
        rc = vocab_encode(bpe, what, text + cut, n - cut, &val_ids, &val_ni);
        if (rc)
            free(ids);
    }
    if (rc == 0)
        rc = write_ids(bpe, ids, ni, cut, out);
    if (rc == 0 && val_frac_s)
        rc = write_ids(bpe, val_ids, val_ni, n - cut, val_out);
    else if (val_frac_s)
        free(val_ids);
    free(text);
    vocab_close(&vs);
    return rc;
}
