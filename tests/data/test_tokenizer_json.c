/* tokenizer.json: ids identical to the `tokenizers` library's on the Bible
 * and on random Unicode text for GPT-2, Llama-3 and RoBERTa style files and
 * one dtrain wrote (golden files from tests/data/gen_tokenizer_golden.py),
 * decode(encode(x)) == x, a dtrain BPE and its tokenizer.json agreeing on
 * random text, the regex engine on hand cases, and bad files: an error
 * naming the file and the key, never a crash. */
#include "data/tok_regex.h"
#include "dtrain/tokenizer.h"
#include "test.h"
#include "tmp_util.h"

static const char *gpath(const char *name)
{
    static char p[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/tests/data/tokenizer/%s", DT_SOURCE_DIR, name);
    return p[k];
}

/* Encode TEXT with NAME.json and compare with NAME.TEXT[.sp].ids. */
static int check_golden(const char *name, const char *text, bool special, bool roundtrip)
{
    char f[256];
    snprintf(f, sizeof f, "%s.json", name);
    dt_tokenizer *t;
    if (dt_tokenizer_load(gpath(f), &t) < 0) {
        fprintf(stderr, "load %s: %s\n", f, dt_last_error());
        return 1;
    }
    size_t tn, gn;
    snprintf(f, sizeof f, "%s.txt", text);
    char *txt = t_slurp(gpath(f), &tn);
    snprintf(f, sizeof f, "%s.%s%s.ids", name, text, special ? ".sp" : "");
    char *gold = t_slurp(gpath(f), &gn);
    int bad = !txt || !gold;
    uint32_t *ids = NULL;
    int64_t n = 0;
    if (!bad && dt_tokenizer_encode(t, txt, tn, special, &ids, &n) < 0) {
        fprintf(stderr, "encode: %s\n", dt_last_error());
        bad = 1;
    }
    if (!bad) {
        const uint32_t *g = (const uint32_t *)gold;
        int64_t ng = (int64_t)(gn / 4);
        for (int64_t i = 0; i < n && i < ng && !bad; i++)
            if (ids[i] != g[i]) {
                fprintf(stderr, "%s: id %lld is %u, the library's is %u\n", f, (long long)i, ids[i], g[i]);
                bad = 1;
            }
        if (!bad && n != ng) {
            fprintf(stderr, "%s: %lld ids, the library has %lld\n", f, (long long)n, (long long)ng);
            bad = 1;
        }
    }
    if (!bad && roundtrip && !special) {
        char *back;
        size_t bl;
        if (dt_tokenizer_decode(t, ids, n, false, &back, &bl) < 0 || bl != tn || memcmp(back, txt, tn)) {
            fprintf(stderr, "%s: decode(encode(x)) != x\n", f);
            bad = 1;
        }
        if (!bad)
            free(back);
    }
    free(ids);
    free(txt);
    free(gold);
    dt_tokenizer_free(t);
    return bad;
}

TEST(golden_ids)
{
    static const char *names[] = {"gpt2", "llama3", "roberta", "dtrain"};
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ_INT(check_golden(names[i], "bible", false, i != 2), 0);
        ASSERT_EQ_INT(check_golden(names[i], "unicode", false, i != 2), 0);
    }
    ASSERT_EQ_INT(check_golden("llama3", "bible", true, false), 0);
    ASSERT_EQ_INT(check_golden("llama3", "unicode", true, false), 0);
}

/* Normalizers (NFC, NFKC + Lowercase + Strip, NFD + Replace), the Llama-2
 * style file (Prepend/Replace normalizer, byte fallback, the
 * Replace/ByteFallback/Fuse/Strip decoder) and the Gemma style one (Replace
 * alone, a Split(" ") pre-tokenizer, no Strip in the decoder): ids and
 * decoded text equal to the library's (tests/data/gen_normalizer_golden.py). */
static int check_norm_golden(const char *name, const char *text)
{
    char f[256];
    snprintf(f, sizeof f, "%s.json", name);
    dt_tokenizer *t;
    if (dt_tokenizer_load(gpath(f), &t) < 0) {
        fprintf(stderr, "load %s: %s\n", f, dt_last_error());
        return 1;
    }
    size_t tn, gn, dn;
    snprintf(f, sizeof f, "%s.txt", text);
    char *txt = t_slurp(gpath(f), &tn);
    snprintf(f, sizeof f, "%s.%s.ids", name, text);
    char *gold = t_slurp(gpath(f), &gn);
    snprintf(f, sizeof f, "%s.%s.dec", name, text);
    char *dec = t_slurp(gpath(f), &dn);
    int bad = !txt || !gold || !dec;
    uint32_t *ids = NULL;
    int64_t n = 0;
    if (!bad && dt_tokenizer_encode(t, txt, tn, false, &ids, &n) < 0) {
        fprintf(stderr, "encode: %s\n", dt_last_error());
        bad = 1;
    }
    const uint32_t *g = (const uint32_t *)gold;
    int64_t ng = bad ? 0 : (int64_t)(gn / 4);
    for (int64_t i = 0; !bad && i < n && i < ng; i++)
        if (ids[i] != g[i]) {
            fprintf(stderr, "%s %s: id %lld is %u, the library's is %u\n", name, text, (long long)i, ids[i], g[i]);
            bad = 1;
        }
    if (!bad && n != ng) {
        fprintf(stderr, "%s %s: %lld ids, the library has %lld\n", name, text, (long long)n, (long long)ng);
        bad = 1;
    }
    char *back = NULL;
    size_t bl = 0;
    if (!bad && (dt_tokenizer_decode(t, ids, n, false, &back, &bl) < 0 || bl != dn || memcmp(back, dec, dn))) {
        fprintf(stderr, "%s %s: decode differs from the library's (%zu bytes, want %zu)\n", name, text, bl, dn);
        bad = 1;
    }
    free(back);
    free(ids);
    free(txt);
    free(gold);
    free(dec);
    dt_tokenizer_free(t);
    return bad;
}

TEST(normalizers_golden)
{
    static const char *names[] = {"qwen2", "nfkc", "nfd", "llama2", "gemma", "mistral3", "metaspace"};
    for (int i = 0; i < 7; i++) {
        ASSERT_EQ_INT(check_norm_golden(names[i], "bible"), 0);
        ASSERT_EQ_INT(check_norm_golden(names[i], "unicode"), 0);
    }
}

TEST(specials_and_decode)
{
    dt_tokenizer *t;
    ASSERT_OK(dt_tokenizer_load(gpath("llama3.json"), &t));
    uint32_t bos, eos, eot;
    ASSERT_OK(dt_tokenizer_token_id(t, "<|begin_of_text|>", &bos));
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    ASSERT_OK(dt_tokenizer_token_id(t, "<|end_of_text|>", &eot));
    ASSERT_EQ_INT(eos, eot);
    ASSERT_EQ_INT(dt_tokenizer_token_id(t, "no such token", &eot), DT_ERR_NOT_FOUND);
    const char *s = "<|begin_of_text|>In the beginning<|eot_id|>";
    uint32_t *ids;
    int64_t n;
    ASSERT_OK(dt_tokenizer_encode(t, s, strlen(s), true, &ids, &n));
    ASSERT(n >= 4);
    ASSERT_EQ_INT(ids[0], bos); /* the template's, then the text's own */
    ASSERT_EQ_INT(ids[1], bos);
    char *back;
    size_t bl;
    ASSERT_OK(dt_tokenizer_decode(t, ids + 1, n - 1, false, &back, &bl));
    ASSERT_STR_EQ(back, s);
    free(back);
    ASSERT_OK(dt_tokenizer_decode(t, ids, n, true, &back, &bl));
    ASSERT_STR_EQ(back, "In the beginning");
    free(back);
    free(ids);
    uint32_t big = (uint32_t)dt_tokenizer_vocab_size(t);
    ASSERT_EQ_INT(dt_tokenizer_decode(t, &big, 1, false, &back, &bl), DT_ERR_RANGE);
    ASSERT_EQ_INT(dt_tokenizer_encode(t, "a\xff", 2, false, &ids, &n), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "UTF-8");
    ASSERT_OK(dt_tokenizer_encode(t, "", 0, false, &ids, &n));
    ASSERT_EQ_INT(n, 0);
    dt_tokenizer_free(t);
    dt_tokenizer_free(NULL);
}

/* dir/name := text */
static void put(const char *dir, const char *name, const char *text)
{
    ASSERT(t_write_in(dir, name, text));
}

/* The end-of-document token is transformers' tokenizer.eos_token: a tokenizer_config.json beside the
 * tokenizer.json names it (Llama-3 Instruct's <|eot_id|>, where dtrain's own list took <|end_of_text|>); a string
 * or an AddedToken object; null or no file: the list. A name that is no token, or a file that is not JSON: an error
 * naming the file. */
TEST(eos_from_tokenizer_config)
{
    char dir[400], json[500], cmd[1200];
    snprintf(dir, sizeof dir, "%s/eos", t_tmpdir("tokjson"));
    snprintf(json, sizeof json, "%s/tokenizer.json", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s'", dir, gpath("llama3.json"), json);
    ASSERT_EQ_INT(system(cmd), 0);
    dt_tokenizer *t = NULL;
    uint32_t eos, eot, end;
    ASSERT_OK(dt_tokenizer_load(json, &t)); /* no tokenizer_config.json: the list's */
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    ASSERT_OK(dt_tokenizer_token_id(t, "<|end_of_text|>", &end));
    ASSERT_OK(dt_tokenizer_token_id(t, "<|eot_id|>", &eot));
    ASSERT_EQ_INT(eos, end);
    dt_tokenizer_free(t);
    const char *cfgs[] = {"{\"eos_token\": \"<|eot_id|>\", \"bos_token\": \"<|begin_of_text|>\"}",
                          "{\"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|eot_id|>\"}}"};
    for (int i = 0; i < 2; i++) {
        put(dir, "tokenizer_config.json", cfgs[i]);
        ASSERT_OK(dt_tokenizer_load(i ? dir : json, &t)); /* the directory, or the file in it */
        ASSERT_OK(dt_tokenizer_eos(t, &eos));
        ASSERT_EQ_INT(eos, eot);
        char *cfg = NULL, *map = NULL; /* and an export writes it back (it wrote the list's, <|end_of_text|>) */
        ASSERT_OK(dt_tokenizer_hf_files(t, 0, &cfg, &map));
        ASSERT_STR_CONTAINS(cfg, "\"eos_token\":\t\"<|eot_id|>\"");
        ASSERT_STR_CONTAINS(map, "\"eos_token\":\t\"<|eot_id|>\"");
        ASSERT_STR_CONTAINS(cfg, "\"bos_token\":\t\"<|begin_of_text|>\"");
        free(cfg);
        free(map);
        dt_tokenizer_free(t);
    }
    put(dir, "tokenizer_config.json", "{\"eos_token\": null}");
    ASSERT_OK(dt_tokenizer_load(json, &t));
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    ASSERT_EQ_INT(eos, end);
    dt_tokenizer_free(t);
    put(dir, "tokenizer_config.json", "{\"eos_token\": \"<|no such token|>\"}");
    ASSERT_STATUS(dt_tokenizer_load(json, &t), DT_ERR_FORMAT);
    ASSERT(t == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(),
                        "tokenizer_config.json: key \"eos_token\": \"<|no such token|>\" is not a token");
    put(dir, "tokenizer_config.json", "{\"eos_token\": ");
    ASSERT_STATUS(dt_tokenizer_load(json, &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "tokenizer_config.json");
    put(dir, "tokenizer_config.json", "{\"eos_token\": 7}");
    ASSERT_STATUS(dt_tokenizer_load(json, &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "key \"eos_token\": want a token's text");
}

static uint64_t rs_ = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rs_ ^= rs_ << 13;
    rs_ ^= rs_ >> 7;
    rs_ ^= rs_ << 17;
    return (uint32_t)(rs_ >> 11);
}

/* Random valid UTF-8 biased to the chunker's edge cases. */
static size_t rand_text(char *out, size_t cap)
{
    static const char *pieces[] = {" ",  "  ",  "\t", "\n", "\r\n", "'s", "'ll", "'x", "a",  "Zz", "7",
                                   "42", "!?", "-",  "\xc3\xa9", "\xe2\x80\x94", "\xf0\x9f\x98\x80", "\xc2\xa0", "_", "''"};
    size_t o = 0;
    while (o + 8 < cap) {
        const char *p = pieces[rnd() % (sizeof pieces / sizeof pieces[0])];
        size_t l = strlen(p);
        memcpy(out + o, p, l);
        o += l;
    }
    return o;
}

TEST(dtrain_bpe_matches_its_json)
{
    size_t tn;
    char *txt = t_slurp(gpath("bible.txt"), &tn);
    ASSERT(txt != NULL);
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 400;
    tp.min_count = 1;
    dt_bpe *bpe;
    ASSERT_OK(dt_bpe_train(txt, tn, &tp, &bpe));
    const char *dir = t_tmpdir("tokenizer_json");
    char path[600];
    ASSERT(dir[0]);
    snprintf(path, sizeof path, "%s/t.json", dir);
    ASSERT_OK(dt_bpe_save_tokenizer_json(bpe, "<|endoftext|>", path));
    dt_tokenizer *t;
    ASSERT_OK(dt_tokenizer_load(path, &t));
    ASSERT_EQ_INT(dt_tokenizer_vocab_size(t), dt_bpe_vocab_size(bpe) + 1);
    uint32_t eos;
    ASSERT_OK(dt_tokenizer_eos(t, &eos));
    ASSERT_EQ_INT(eos, dt_bpe_vocab_size(bpe));
    char *buf = malloc(4096);
    for (int trial = 0; trial < 300; trial++) {
        size_t n = trial == 0 ? tn : rand_text(buf, 64 + rnd() % 4000);
        const char *s = trial == 0 ? txt : buf;
        uint16_t *a;
        uint32_t *b;
        int64_t na, nb;
        ASSERT_OK(dt_bpe_encode(bpe, s, n, &a, &na));
        ASSERT_OK(dt_tokenizer_encode(t, s, n, false, &b, &nb));
        ASSERT_EQ_INT(na, nb);
        for (int64_t i = 0; i < na; i++)
            if (a[i] != b[i]) {
                fprintf(stderr, "trial %d: position %lld: bpe %u, json %u\n", trial, (long long)i, a[i], b[i]);
                ASSERT(0);
            }
        free(a);
        free(b);
    }
    free(buf);
    dt_tokenizer_free(t);
    dt_bpe_free(bpe);
    free(txt);
    t_rm_rf(dir);
}

/* The pieces of s under pattern, joined with '|'. */
static const char *re_cuts(const char *pattern, const char *s)
{
    static char out[1024];
    dt__re *re;
    if (dt__re_compile(pattern, "test", &re) < 0)
        return dt_last_error();
    dt__re_scratch sc = {0};
    size_t n = strlen(s), from = 0, o = 0, ms, me;
    while (from < n && dt__re_search(re, &sc, (const unsigned char *)s, n, from, &ms, &me) == 1 && me > ms) {
        if (o)
            out[o++] = '|';
        memcpy(out + o, s + ms, me - ms);
        o += me - ms;
        from = me;
    }
    out[o] = 0;
    dt__re_scratch_free(&sc);
    dt__re_free(re);
    return out;
}

#define LLAMA3 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

TEST(regex_engine)
{
    ASSERT_STR_EQ(re_cuts(GPT2, "a   b"), "a|  | b");
    ASSERT_STR_EQ(re_cuts(GPT2, "I'm He'S 12345 \xce\xb1\xce\xb2!!"), "I|'m| He|'|S| 12345| \xce\xb1\xce\xb2|!!");
    ASSERT_STR_EQ(re_cuts(LLAMA3, "HE'S 12345 x\n\n  y"), "HE|'S| |123|45| x|\n\n| | y");
    ASSERT_STR_EQ(re_cuts(LLAMA3, "it'\xc5\xbf"), "it|'\xc5\xbf"); /* U+017F folds to s */
    ASSERT_STR_EQ(re_cuts(LLAMA3, "(hello)"), "(hello|)");
    ASSERT_STR_EQ(re_cuts("a{2,3}?", "aaaa"), "aa|aa");
    ASSERT_STR_EQ(re_cuts("a++a|b", "aaab"), "b");
    ASSERT_STR_EQ(re_cuts("(?>a+)b|a", "aab"), "aab");
    ASSERT_STR_EQ(re_cuts("\\p{Lu}\\P{L}", "aB1cD!"), "B1|D!");
    ASSERT_STR_EQ(re_cuts("[\\x{4e00}-\\x{9fff}]+", "ab\xe4\xb8\xad\xe6\x96\x87" "cd"), "\xe4\xb8\xad\xe6\x96\x87");
    ASSERT_STR_EQ(re_cuts("\\p{L}", "\xe1\xb2\x89"), "\xe1\xb2\x89"); /* U+1C89, a Unicode 16 letter */
    ASSERT_EQ_INT(dt__unicode_gc(0xA7CE), DT_GC_Cn);               /* a Unicode 17 letter is not one yet */
    /* refused, never matched differently */
    static const char *bad[] = {"(a)\\1", "(?<=a)b", "^a", "a$", "(a*)*", "[[:alpha:]]", "\\p{Han}", "(?i:\xc3\x89)", "a{2", "(a", "a)", "[a"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dt__re *re = NULL;
        dt_status st = dt__re_compile(bad[i], "pattern", &re);
        ASSERT(st == DT_ERR_FORMAT || st == DT_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(dt_last_error(), "pattern");
        ASSERT(re == NULL);
    }
}

/* A minimal tokenizer.json with `model` and `extra` top-level keys. */
static dt_status load_json(const char *model, const char *extra)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "{\"version\":\"1.0\",%s\"model\":%s}", extra, model);
    dt_tokenizer *t = NULL;
    dt_status st = dt_tokenizer_load_mem(buf, strlen(buf), "bad.json", &t);
    if (st == DT_OK)
        dt_tokenizer_free(t);
    return st;
}

#define VOCAB "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2}"

TEST(bad_files)
{
    struct {
        const char *model, *extra, *key;
        dt_status st;
    } cases[] = {
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b\"]}", "", NULL, DT_OK},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[[\"a\",\"b\"]]}", "", NULL, DT_OK},
        {"{\"type\":\"WordPiece\"," VOCAB "}", "", "model.type", DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\",\"merges\":[]}", "", "model.vocab", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\",\"vocab\":[1,2],\"merges\":[]}", "", "model.vocab", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}", "", "model.vocab", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB "}", "", "model.merges", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b c\"]}", "", "model.merges[0]", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[\"a b\", [\"a\",\"b\"]]}", "", "model.merges[1]", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[[\"a\",\"c\"]]}", "", "model.merges[0]", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[[\"b\",\"a\"]]}", "", "model.merges[0]", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[],\"dropout\":0.1}", "", "model.dropout", DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[],\"unk_token\":\"<unk>\"}", "", "model.unk_token", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"normalizer\":{\"type\":\"Precompiled\"},", "normalizer",
         DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"BertNormalizer\"}]},",
         "normalizer.normalizers[1]", DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"normalizer\":{\"type\":\"Replace\",\"content\":\"x\"},",
         "normalizer", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"normalizer\":{\"type\":\"Lowercase\"},", NULL, DT_OK},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"CTC\"}]},",
         "decoder.decoders[1]", DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"pre_tokenizer\":{\"type\":\"Whitespace\"},", "pre_tokenizer",
         DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?<=a)\"},\"behavior\":\"Isolated\","
         "\"invert\":false},",
         "pre_tokenizer.pattern.Regex", DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"decoder\":{\"type\":\"WordPiece\"},", "decoder",
         DT_ERR_UNSUPPORTED},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"},", "pre_tokenizer", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"prepend_scheme\":\"sometimes\"},", "pre_tokenizer",
         DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}",
         "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"add_prefix_space\":false,\"split\":false},", NULL, DT_OK},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"decoder\":{\"type\":\"Metaspace\",\"prepend_scheme\":7},",
         "decoder", DT_ERR_FORMAT},
        {"{\"type\":\"BPE\"," VOCAB ",\"merges\":[]}", "\"added_tokens\":[{\"content\":\"x\"}],", "added_tokens[0]",
         DT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_status st = load_json(cases[i].model, cases[i].extra);
        if (st != cases[i].st)
            fprintf(stderr, "case %zu: %s\n", i, dt_last_error());
        ASSERT_EQ_INT(st, cases[i].st);
        if (cases[i].key) {
            ASSERT_STR_CONTAINS(dt_last_error(), "bad.json");
            ASSERT_STR_CONTAINS(dt_last_error(), cases[i].key);
        }
    }
    dt_tokenizer *t = NULL;
    ASSERT_EQ_INT(dt_tokenizer_load_mem("{\"version\":\"2.0\",\"model\":{}}", 28, "v.json", &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "version");
    ASSERT_EQ_INT(dt_tokenizer_load_mem("{\"model\":", 9, "trunc.json", &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "trunc.json");
    ASSERT_EQ_INT(dt_tokenizer_load_mem("[]", 2, "arr.json", &t), DT_ERR_FORMAT);
    /* a vocab key of bytes that are not UTF-8 (0xFF): the tokenizers library refuses the file, dtrain read the key */
    const char *bin = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"\xff\":1},\"merges\":[]}}";
    ASSERT_EQ_INT(dt_tokenizer_load_mem(bin, strlen(bin), "bin.json", &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "bin.json: not valid UTF-8 (byte 39)");
    ASSERT_EQ_INT(dt_tokenizer_load("/nonexistent/tokenizer.json", &t), DT_ERR_IO);
    ASSERT(t == NULL);
    /* every truncation of a real file: an error or a tokenizer, never a crash */
    size_t n;
    char *j = t_slurp(gpath("llama3.json"), &n);
    ASSERT(j != NULL);
    for (size_t cut = 0; cut < n; cut += 1 + cut / 4) {
        dt_status st = dt_tokenizer_load_mem(j, cut, "cut.json", &t);
        ASSERT(st == DT_ERR_FORMAT);
        ASSERT(t == NULL);
    }
    free(j);
}

int main(void)
{
    RUN(golden_ids);
    RUN(normalizers_golden);
    RUN(specials_and_decode);
    RUN(eos_from_tokenizer_config);
    RUN(dtrain_bpe_matches_its_json);
    RUN(regex_engine);
    RUN(bad_files);
    return TEST_REPORT();
}
