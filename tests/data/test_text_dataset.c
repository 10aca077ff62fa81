/* Text and JSON-lines corpora as language-model data
 * (dt_dataset_text_open): the windows are the documents' ids, each
 * followed by the end-of-document token, in file order; bad specs and
 * files name the spec, the file and the line. */
#include "dtrain/tokenizer.h"
#include "test.h"
#include "tmp_util.h"

static char p_[9][600];
static const char *tp(int slot, const char *name)
{
    snprintf(p_[slot], sizeof p_[slot], "%s/%s", t_tmpdir("text_dataset"), name);
    return p_[slot];
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    fputs(s, f);
    fclose(f);
}

static dt_tokenizer *load(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    dt_tokenizer *t = NULL;
    if (dt_tokenizer_load(path, &t) < 0)
        fprintf(stderr, "%s\n", dt_last_error());
    return t;
}

/* Opening spec fails with want, dt_last_error() holding msg, and gives no
 * data set: 0, else -1 after saying what happened (case i) on stderr. */
static int open_fails(size_t i, const char *spec, const dt_tokenizer *t, const dt_tokens_params *kp, dt_status want,
                      const char *msg)
{
    dt_dataset *ds = NULL;
    dt_status st = dt_dataset_text_open(spec, t, kp, &ds);
    if (st == want && strstr(dt_last_error(), msg) && !ds)
        return 0;
    fprintf(stderr, "case %zu (%s): status %d (want %d), \"%s\" (want \"%s\")%s\n", i, spec, (int)st, (int)want,
            dt_last_error(), msg, ds ? ", a data set" : "");
    dt_dataset_free(ds);
    return -1;
}

/* ids of the concatenated documents, each followed by eos */
static int64_t expect(const dt_tokenizer *t, const char **docs, int n, uint32_t eos, int64_t *out)
{
    int64_t k = 0;
    for (int d = 0; d < n; d++) {
        uint32_t *ids;
        int64_t ni;
        if (dt_tokenizer_encode(t, docs[d], strlen(docs[d]), false, &ids, &ni) < 0)
            return -1;
        for (int64_t i = 0; i < ni; i++)
            out[k++] = ids[i];
        out[k++] = eos;
        free(ids);
    }
    return k;
}

static int check_windows(dt_dataset *ds, const int64_t *want, int64_t nwant, int64_t T)
{
    int64_t n = dt_dataset_length(ds), x[64], y[64];
    if (n != (nwant - T - 1) / T + 1) {
        fprintf(stderr, "%lld windows, want %lld\n", (long long)n, (long long)((nwant - T - 1) / T + 1));
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        if (dt_dataset_get_item(ds, i, x, y) < 0)
            return 1;
        for (int64_t k = 0; k < T; k++)
            if (x[k] != want[i * T + k] || y[k] != want[i * T + k + 1]) {
                fprintf(stderr, "window %lld position %lld: %lld/%lld, want %lld/%lld\n", (long long)i,
                        (long long)k, (long long)x[k], (long long)y[k], (long long)want[i * T + k],
                        (long long)want[i * T + k + 1]);
                return 1;
            }
    }
    return 0;
}

TEST(text_and_jsonl)
{
    dt_tokenizer *t = load();
    ASSERT(t != NULL);
    uint32_t eos;
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    const char *docs[] = {"In the beginning God created the heaven and the earth.\n",
                          "And the earth was without form, and void; 12345 \xce\xb1\xce\xb2 <|eot_id|>\n",
                          "And God said, Let there be light: and there was light."};
    write_file(tp(0, "a.txt"), docs[0]);
    write_file(tp(1, "b.txt"), docs[1]);
    int64_t want[512];
    int64_t nw = expect(t, docs, 2, eos, want);
    ASSERT(nw > 20);
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 4;
    char spec[1400];
    snprintf(spec, sizeof spec, "text:%s,%s", p_[0], p_[1]);
    dt_dataset *ds;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(dt_dataset_get_info(ds)->num_classes, dt_tokenizer_vocab_size(t));
    ASSERT_EQ_INT(check_windows(ds, want, nw, 4), 0);
    dt_dataset_free(ds);
    /* jsonl: one document a line, blank lines skipped, another key */
    char line[2048];
    snprintf(line, sizeof line,
             "{\"body\": \"In the beginning God created the heaven and the earth.\\n\", \"n\": 1}\n\n"
             "  {\"body\": \"And the earth was without form, and void; 12345 \\u03b1\\u03b2 <|eot_id|>\\n\"}\r\n"
             "{\"body\": \"And God said, Let there be light: and there was light.\"}");
    write_file(tp(2, "c.jsonl"), line);
    nw = expect(t, docs, 3, eos, want);
    snprintf(spec, sizeof spec, "jsonl:%s,field=body", p_[2]);
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(check_windows(ds, want, nw, 4), 0);
    dt_dataset_free(ds);
    dt_tokenizer_free(t);
}

TEST(bad_specs_and_files)
{
    dt_tokenizer *t = load();
    ASSERT(t != NULL);
    write_file(tp(3, "bad.jsonl"), "{\"text\": \"fine\"}\n{\"txt\": \"no text key\"}\n");
    write_file(tp(4, "broken.jsonl"), "{\"text\": \"fine\"}\n{\"text\": \n");
    write_file(tp(5, "latin1.txt"), "caf\xe9\n");
    write_file(tp(8, "chat.jsonl"), "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 4;
    char s[9][1400];
    snprintf(s[0], sizeof s[0], "jsonl:%s", p_[3]);
    snprintf(s[1], sizeof s[1], "jsonl:%s", p_[4]);
    snprintf(s[2], sizeof s[2], "text:%s", p_[5]);
    snprintf(s[3], sizeof s[3], "text:%s,field=x", p_[5]);
    snprintf(s[4], sizeof s[4], "text:/nonexistent/x.txt");
    snprintf(s[5], sizeof s[5], "text:");
    snprintf(s[6], sizeof s[6], "tokens:%s", p_[5]);
    snprintf(s[8], sizeof s[8], "jsonl:%s", p_[8]);
    struct {
        const char *spec, *msg;
        dt_status st;
    } cases[] = {
        {s[0], ":2: want an object with a string \"text\"", DT_ERR_FORMAT},
        {s[1], ":2", DT_ERR_FORMAT},
        {s[2], "UTF-8", DT_ERR_INVALID_ARG},
        {s[3], "field=NAME", DT_ERR_INVALID_ARG},
        {s[4], "/nonexistent/x.txt", DT_ERR_IO},
        {s[5], "empty file name", DT_ERR_INVALID_ARG},
        {s[6], "want text:", DT_ERR_INVALID_ARG},
        /* TRL's conversational format with a tokenizer that has no chat template: said what it needs */
        {s[8], "needs the tokenizer's chat template, and this tokenizer has none", DT_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ASSERT_EQ_INT(open_fails(i, cases[i].spec, t, &kp, cases[i].st, cases[i].msg), 0);
    kp.vocab_size = 100; /* smaller than the tokenizer */
    dt_dataset *ds = NULL;
    ASSERT_EQ_INT(dt_dataset_text_open(s[2], t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "vocab size 100");
    dt_tokenizer_free(t);
    /* no end-of-document token */
    const char *noeos = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    ASSERT_OK(dt_tokenizer_load_mem(noeos, strlen(noeos), "noeos.json", &t));
    write_file(tp(6, "a.txt"), "aaa");
    snprintf(s[7], sizeof s[7], "text:%s", p_[6]);
    kp.vocab_size = 0;
    ASSERT_EQ_INT(dt_dataset_text_open(s[7], t, &kp, &ds), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "end-of-document");
    dt_tokenizer_free(t);
}

/* The prompt/completion records of the tests below (as their jsonl files write them) */
static const char *const g_pr[3] = {"Question: who created the heaven?\nAnswer:", "Say hi.", "Empty answer:"};
static const char *const g_co[3] = {" God created the heaven and the earth.", " hi \xce\xb1", ""};

/* Record d's tokens (its prompt's, its completion's, eos) into tok and the label each has as a target (-100: a
 * prompt token) into lab; their number (-1: an encoding error). */
static int64_t pc_record(const dt_tokenizer *t, int d, uint32_t eos, int64_t *tok, int64_t *lab)
{
    int64_t n = 0;
    for (int part = 0; part < 2; part++) {
        uint32_t *ids;
        int64_t ni;
        const char *txt = part ? g_co[d] : g_pr[d];
        if (dt_tokenizer_encode(t, txt, strlen(txt), false, &ids, &ni) < 0)
            return -1;
        for (int64_t i = 0; i < ni; i++, n++)
            tok[n] = ids[i], lab[n] = part ? (int64_t)ids[i] : -100;
        free(ids);
    }
    tok[n] = lab[n] = eos;
    return n + 1;
}

/* Prompt/completion lines: prompt ids, completion ids, eos; with
 * completion_only_loss the targets that are prompt tokens are -100 (the
 * loss's ignore_index), the completion and eos targets are the ids. */
TEST(prompt_completion_mask)
{
    dt_tokenizer *t = load();
    ASSERT(t != NULL);
    uint32_t eos;
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    write_file(tp(0, "pc.jsonl"),
               "{\"q\": \"Question: who created the heaven?\\nAnswer:\", \"a\": \" God created the heaven and the "
               "earth.\", \"id\": 7}\n\n"
               "{\"a\": \" hi \\u03b1\", \"q\": \"Say hi.\"}\n"
               "{\"q\": \"Empty answer:\", \"a\": \"\"}\n");
    int64_t tok[256], lab[256], n = 0;
    for (int d = 0; d < 3; d++) { /* the expected stream and the label each token has as a target */
        const int64_t k = pc_record(t, d, eos, tok + n, lab + n);
        ASSERT(k > 0);
        n += k;
    }
    ASSERT(n > 20);
    const int64_t T = 5;
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = T;
    kp.stride = 1; /* every offset: each target position is seen */
    char spec[1400];
    snprintf(spec, sizeof spec, "jsonl:%s,prompt=q,completion=a", p_[0]);
    for (int masked = 0; masked < 2; masked++) {
        kp.completion_only_loss = masked;
        dt_dataset *ds;
        ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
        ASSERT_EQ_INT(dt_dataset_length(ds), n - T);
        int64_t counted = 0;
        for (int64_t i = 0; i < n - T; i++) {
            int64_t x[8], y[8];
            ASSERT_OK(dt_dataset_get_item(ds, i, x, y));
            for (int64_t k = 0; k < T; k++) {
                ASSERT_EQ_INT(x[k], tok[i + k]);
                ASSERT_EQ_INT(y[k], masked ? lab[i + k + 1] : tok[i + k + 1]);
                counted += i == 0 || k == T - 1 ? y[k] != -100 : 0;
            }
        }
        int64_t want = 0; /* every target but the first token's once */
        for (int64_t i = 1; i < n; i++)
            want += masked ? lab[i] != -100 : 1;
        ASSERT_EQ_INT(counted, want);
        dt_dataset_free(ds);
    }
    /* the empty completion: its eos is the only counted target of its line */
    ASSERT_EQ_INT(lab[n - 1], eos);
    ASSERT_EQ_INT(lab[n - 2], -100);
    /* without keys, completion_only_loss reads TRL's "prompt" and "completion" */
    write_file(tp(1, "trl.jsonl"), "{\"prompt\": \"Say hi.\", \"completion\": \" hi \\u03b1\"}\n");
    snprintf(spec, sizeof spec, "jsonl:%s", p_[1]);
    kp.completion_only_loss = true;
    kp.stride = 0;
    kp.seq_len = 2;
    dt_dataset *ds;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    int64_t x[2], y[2];
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    ASSERT_EQ_INT(y[0], -100); /* "Say hi." is 3 tokens: the targets of positions 0 and 1 are prompt tokens */
    ASSERT_EQ_INT(y[1], -100);
    dt_dataset_free(ds);
    dt_tokenizer_free(t);
}

/* No packing (per_record, TRL's packing=False): item d is record d's first T tokens, padded; its targets the next
 * tokens, the last position's and the padding's -100 (and the prompt's with completion_only_loss); a longer record
 * is cut (TRL's max_length); text: files are one record each; a stride is refused. */
TEST(per_record)
{
    dt_tokenizer *t = load();
    ASSERT(t != NULL);
    uint32_t eos;
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    write_file(tp(0, "pr.jsonl"),
               "{\"prompt\": \"Question: who created the heaven?\\nAnswer:\", \"completion\": \" God created the "
               "heaven and the earth.\"}\n\n{\"completion\": \" hi \\u03b1\", \"prompt\": \"Say hi.\"}\n"
               "{\"prompt\": \"Empty answer:\", \"completion\": \"\"}\n");
    int64_t tok[3][64], lab[3][64], len[3];
    for (int d = 0; d < 3; d++)
        len[d] = pc_record(t, d, eos, tok[d], lab[d]);
    const int64_t T = 12;
    ASSERT(len[0] > T && len[1] < T && len[2] < T); /* one cut, two padded */
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = T;
    kp.per_record = true;
    char spec[1400];
    snprintf(spec, sizeof spec, "jsonl:%s,prompt=prompt,completion=completion", p_[0]);
    for (int masked = 0; masked < 2; masked++) {
        kp.completion_only_loss = masked;
        dt_dataset *ds;
        ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
        ASSERT_EQ_INT(dt_dataset_length(ds), 3);
        for (int d = 0; d < 3; d++) {
            int64_t x[12], y[12];
            ASSERT_OK(dt_dataset_get_item(ds, d, x, y));
            const int64_t n = len[d] < T ? len[d] : T;
            for (int64_t k = 0; k < T; k++) {
                ASSERT_EQ_INT(x[k], tok[d][k < n ? k : n - 1]);
                ASSERT_EQ_INT(y[k], k + 1 >= n ? -100 : masked ? lab[d][k + 1] : tok[d][k + 1]);
            }
        }
        dt_dataset_free(ds);
    }
    /* text: files, one record each */
    write_file(tp(1, "one.txt"), "In the beginning");
    write_file(tp(2, "two.txt"), "God created the heaven and the earth, and the earth was without form.");
    snprintf(spec, sizeof spec, "text:%s,%s", p_[1], p_[2]);
    kp.completion_only_loss = false;
    dt_dataset *ds;
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 2);
    const char *docs[] = {"In the beginning"};
    int64_t want[64], x[12], y[12];
    const int64_t nw = expect(t, docs, 1, eos, want);
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    for (int64_t k = 0; k < T; k++) {
        ASSERT_EQ_INT(x[k], want[k < nw ? k : nw - 1]);
        ASSERT_EQ_INT(y[k], k + 1 < nw ? want[k + 1] : -100);
    }
    ASSERT_OK(dt_dataset_get_item(ds, 1, x, y));
    ASSERT(y[T - 2] != -100 && y[T - 1] == -100); /* cut: the last position has no target */
    dt_dataset_free(ds);
    kp.stride = 1;
    ASSERT_EQ_INT(open_fails(0, spec, t, &kp, DT_ERR_INVALID_ARG, "takes no stride"), 0);
    dt_tokenizer_free(t);
}

/* Prompt/completion mistakes name the line, the key, the option. */
TEST(prompt_completion_bad)
{
    dt_tokenizer *t = load();
    ASSERT(t != NULL);
    write_file(tp(2, "missing.jsonl"), "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n");
    write_file(tp(3, "number.jsonl"), "{\"prompt\": 3, \"completion\": \"b\"}\n");
    write_file(tp(4, "array.jsonl"), "[\"prompt\", \"completion\"]\n");
    write_file(tp(5, "plain.txt"), "text\n");
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 2;
    char s[10][1400];
    snprintf(s[0], sizeof s[0], "jsonl:%s,prompt=prompt,completion=completion", p_[2]);
    snprintf(s[1], sizeof s[1], "jsonl:%s,prompt=prompt,completion=completion", p_[3]);
    snprintf(s[2], sizeof s[2], "jsonl:%s,prompt=prompt,completion=completion", p_[4]);
    snprintf(s[3], sizeof s[3], "jsonl:%s,prompt=prompt", p_[2]);
    snprintf(s[4], sizeof s[4], "jsonl:%s,field=text,prompt=p,completion=c", p_[2]);
    snprintf(s[5], sizeof s[5], "text:%s,prompt=p,completion=c", p_[5]);
    snprintf(s[6], sizeof s[6], "jsonl:%s,prompt=,completion=c", p_[2]);
    snprintf(s[7], sizeof s[7], "jsonl:%s,prompt=a,prompt=b,completion=c", p_[2]);
    snprintf(s[8], sizeof s[8], "jsonl:%s,field=prompt", p_[2]); /* mask on, one document a line */
    snprintf(s[9], sizeof s[9], "text:%s", p_[5]);                /* mask on, no prompts */
    struct {
        const char *spec, *msg;
        bool mask;
        dt_status st;
    } cases[] = {
        {s[0], ":2: want an object with a string \"completion\" (completion=NAME", false, DT_ERR_FORMAT},
        {s[1], ":1: want an object with a string \"prompt\", not another JSON type", true, DT_ERR_FORMAT},
        {s[2], ":1: want a JSON object", true, DT_ERR_FORMAT},
        {s[3], "prompt=KEY and completion=KEY go together", false, DT_ERR_INVALID_ARG},
        {s[4], "not both", false, DT_ERR_INVALID_ARG},
        {s[5], "prompt=NAME goes with jsonl:", false, DT_ERR_INVALID_ARG},
        {s[6], "prompt=NAME goes with jsonl:", false, DT_ERR_INVALID_ARG},
        {s[7], "once", false, DT_ERR_INVALID_ARG},
        {s[8], "completions only needs prompt/completion data", true, DT_ERR_INVALID_ARG},
        {s[9], "completions only needs prompt/completion data", true, DT_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kp.completion_only_loss = cases[i].mask;
        ASSERT_EQ_INT(open_fails(i, cases[i].spec, t, &kp, cases[i].st, cases[i].msg), 0);
    }
    /* a token file has no prompts */
    kp.completion_only_loss = true;
    dt_dataset *ds = NULL;
    ASSERT_STATUS(dt_dataset_tokens_open(p_[5], &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "has no prompts");
    dt_tokenizer_free(t);
}

int main(void)
{
    RUN(text_and_jsonl);
    RUN(bad_specs_and_files);
    RUN(prompt_completion_mask);
    RUN(per_record);
    RUN(prompt_completion_bad);
    t_rm_rf(t_tmpdir("text_dataset"));
    return TEST_REPORT();
}
