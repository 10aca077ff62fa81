/* The byte-level BPE tokenizer: the chunker's cuts, a hand-computed
 * training run, the trainer against a naive recount-every-merge reference,
 * the heap encoder against minbpe's rank-then-rescan loop, exact round
 * trips on random bytes, the vocab file (round trip, bad files naming
 * file:line, symlinks), and the King James Bible when it is installed. */
#include "data/bpe_impl.h"
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <sys/stat.h>

static uint64_t rng_ = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng_ ^= rng_ << 13;
    rng_ ^= rng_ >> 7;
    rng_ ^= rng_ << 17;
    return (uint32_t)(rng_ >> 11);
}

/* The chunks of s joined with '|'. */
static const char *cuts(const char *s)
{
    static char buf[512];
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        size_t e = dt__bpe_chunk_end((const unsigned char *)s, n, i);
        if (i)
            buf[o++] = '|';
        memcpy(buf + o, s + i, e - i);
        o += e - i;
        i = e;
    }
    buf[o] = 0;
    return buf;
}

TEST(chunker)
{
    ASSERT_STR_EQ(cuts("a   b"), "a|  | b");
    ASSERT_STR_EQ(cuts("Hello world"), "Hello| world");
    ASSERT_STR_EQ(cuts("I'm he's they're we've I'll I'd don't"), "I|'m| he|'s| they|'re| we|'ve| I|'ll| I|'d| don|'t");
    ASSERT_STR_EQ(cuts("abc123 45!!  x"), "abc|123| 45|!!| | x");
    ASSERT_STR_EQ(cuts("line\n  2 And"), "line|\n | 2| And");
    ASSERT_STR_EQ(cuts("end.  \n"), "end|.|  \n");
    ASSERT_STR_EQ(cuts("a\nb"), "a|\n|b");
    ASSERT_STR_EQ(cuts(" \xc3\xa9t\xc3\xa9 'S"), " \xc3\xa9t\xc3\xa9| '|S");
    ASSERT_STR_EQ(cuts("x\t\ty"), "x|\t|\t|y"); /* only a space joins the next word */
}

TEST(hand_computed)
{
    /* minbpe's example: counts aa 4, ab 2, ...; then (Z, a) and (a, b) tie at
     * 2 and the smaller ids, (a, b), win; then (Z, Y) 2; then four pairs at
     * 1, the smallest is (a, c). */
    const char *s = "aaabdaaabac";
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 260;
    tp.min_count = 1;
    dt_bpe *b = NULL;
    ASSERT_OK(dt_bpe_train(s, strlen(s), &tp, &b));
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 260);
    uint32_t want[4][2] = {{'a', 'a'}, {'a', 'b'}, {256, 257}, {'a', 'c'}};
    for (int k = 0; k < 4; k++) {
        uint32_t l, r;
        ASSERT_OK(dt_bpe_merge(b, k, &l, &r));
        ASSERT_EQ_INT(l, want[k][0]);
        ASSERT_EQ_INT(r, want[k][1]);
    }
    const unsigned char *tb;
    size_t tl;
    ASSERT_OK(dt_bpe_token_bytes(b, 258, &tb, &tl));
    ASSERT_EQ_INT(tl, 4);
    ASSERT(!memcmp(tb, "aaab", 4));
    ASSERT_STATUS(dt_bpe_token_bytes(b, 260, &tb, &tl), DT_ERR_RANGE);
    uint16_t *ids;
    int64_t n;
    ASSERT_OK(dt_bpe_encode(b, s, strlen(s), &ids, &n));
    ASSERT_EQ_INT(n, 4);
    ASSERT_EQ_INT(ids[0], 258);
    ASSERT_EQ_INT(ids[1], 'd');
    ASSERT_EQ_INT(ids[2], 258);
    ASSERT_EQ_INT(ids[3], 259);
    free(ids);
    /* "aaa" with (a, a) first: [aa, a], left to right */
    ASSERT_OK(dt_bpe_encode(b, "aaa", 3, &ids, &n));
    ASSERT_EQ_INT(n, 2);
    ASSERT_EQ_INT(ids[0], 256);
    ASSERT_EQ_INT(ids[1], 'a');
    free(ids);
    /* min_count 2 stops before the pairs seen once */
    dt_bpe_free(b);
    tp.min_count = 2;
    ASSERT_OK(dt_bpe_train(s, strlen(s), &tp, &b));
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 259);
    dt_bpe_free(b);
    tp.vocab_size = 255;
    ASSERT_STATUS(dt_bpe_train(s, strlen(s), &tp, &b), DT_ERR_INVALID_ARG);
    tp.vocab_size = 65537;
    ASSERT_STATUS(dt_bpe_train(s, strlen(s), &tp, &b), DT_ERR_INVALID_ARG);
}

/* A text of words from a small alphabet, spaces, newlines, punctuation. */
static char *make_text(size_t n)
{
    char *t = malloc(n + 1);
    const char *alpha = "aabcdeeeilnorsttu";
    for (size_t i = 0; i < n; i++) {
        uint32_t r = rnd() % 100;
        t[i] = r < 15 ? ' ' : r < 17 ? '\n' : r < 19 ? ',' : r < 20 ? '\'' : r < 21 ? '7' : alpha[rnd() % 17];
    }
    t[n] = 0;
    return t;
}

/* Naive training: recount every pair of every distinct chunk each merge. */
#define NV 460
static int naive_train(const char *text, size_t n, int vocab, int64_t min_count, uint32_t (*merges)[2])
{
    /* chunks as symbol arrays, with counts (duplicates kept: same sums) */
    size_t nc = 0;
    uint32_t **sym = malloc(n * sizeof *sym);
    size_t *len = malloc(n * sizeof *len);
    for (size_t i = 0; i < n;) {
        size_t e = dt__bpe_chunk_end((const unsigned char *)text, n, i);
        sym[nc] = malloc((e - i) * sizeof **sym);
        for (size_t k = i; k < e; k++)
            sym[nc][k - i] = (unsigned char)text[k];
        len[nc++] = e - i;
        i = e;
    }
    static int64_t cnt[NV][NV];
    int nm = 0;
    for (; 256 + nm < vocab; nm++) {
        memset(cnt, 0, sizeof cnt);
        for (size_t c = 0; c < nc; c++)
            for (size_t k = 0; k + 1 < len[c]; k++)
                cnt[sym[c][k]][sym[c][k + 1]]++;
        int64_t best = 0;
        uint32_t ba = 0, bb = 0;
        for (uint32_t a = 0; a < NV; a++)
            for (uint32_t b = 0; b < NV; b++)
                if (cnt[a][b] > best)
                    best = cnt[a][b], ba = a, bb = b;
        if (best < min_count || best == 0)
            break;
        merges[nm][0] = ba;
        merges[nm][1] = bb;
        for (size_t c = 0; c < nc; c++) {
            size_t o = 0;
            for (size_t k = 0; k < len[c]; k++) {
                if (k + 1 < len[c] && sym[c][k] == ba && sym[c][k + 1] == bb)
                    sym[c][o++] = 256 + (uint32_t)nm, k++;
                else
                    sym[c][o++] = sym[c][k];
            }
            len[c] = o;
        }
    }
    for (size_t c = 0; c < nc; c++)
        free(sym[c]);
    free(sym);
    free(len);
    return nm;
}

TEST(trainer_matches_naive)
{
    size_t n = 30000;
    char *text = make_text(n);
    static uint32_t want[NV][2];
    int nm = naive_train(text, n, 460, 1, want);
    ASSERT_EQ_INT(nm, 204);
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 460;
    tp.min_count = 1;
    dt_bpe *b = NULL;
    ASSERT_OK(dt_bpe_train(text, n, &tp, &b));
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 256 + nm);
    for (int k = 0; k < nm; k++) {
        uint32_t l, r;
        ASSERT_OK(dt_bpe_merge(b, k, &l, &r));
        if (l != want[k][0] || r != want[k][1]) {
            fprintf(stderr, "merge %d: (%u, %u), naive (%u, %u)\n", k, l, r, want[k][0], want[k][1]);
            ASSERT(0);
        }
    }
    dt_bpe_free(b);
    /* min_count 3 against the naive trainer's stop */
    tp.min_count = 3;
    nm = naive_train(text, n, 460, 3, want);
    ASSERT_OK(dt_bpe_train(text, n, &tp, &b));
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 256 + nm);
    dt_bpe_free(b);
    free(text);
}

/* minbpe's encoder: merge the lowest-ranked present pair everywhere, repeat. */
static int64_t naive_encode(const dt_bpe *b, const unsigned char *s, size_t n, uint16_t *out)
{
    static int32_t rank[NV][NV];
    memset(rank, 0xff, sizeof rank);
    for (int64_t m = 0; m < dt_bpe_vocab_size(b) - 256; m++) {
        uint32_t l, r;
        dt_bpe_merge(b, m, &l, &r);
        rank[l][r] = (int32_t)m;
    }
    int64_t no = 0;
    uint32_t *sym = malloc((n + 1) * sizeof *sym);
    for (size_t i = 0; i < n;) {
        size_t e = dt__bpe_chunk_end(s, n, i), L = e - i;
        for (size_t k = 0; k < L; k++)
            sym[k] = s[i + k];
        for (;;) {
            int32_t best = -1;
            for (size_t k = 0; k + 1 < L; k++) {
                int32_t m = rank[sym[k]][sym[k + 1]];
                if (m >= 0 && (best < 0 || m < best))
                    best = m;
            }
            if (best < 0)
                break;
            uint32_t l, r;
            dt_bpe_merge(b, best, &l, &r);
            size_t o = 0;
            for (size_t k = 0; k < L; k++) {
                if (k + 1 < L && sym[k] == l && sym[k + 1] == r)
                    sym[o++] = 256 + (uint32_t)best, k++;
                else
                    sym[o++] = sym[k];
            }
            L = o;
        }
        for (size_t k = 0; k < L; k++)
            out[no++] = (uint16_t)sym[k];
        i = e;
    }
    free(sym);
    return no;
}

TEST(encoder_matches_naive_and_round_trips)
{
    size_t n = 20000;
    char *text = make_text(n);
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 400;
    dt_bpe *b = NULL;
    ASSERT_OK(dt_bpe_train(text, n, &tp, &b));
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 400);
    char *other = make_text(3000); /* text the vocab was not trained on */
    uint16_t *ids, *ref = malloc(3000 * sizeof *ref);
    int64_t ni;
    ASSERT_OK(dt_bpe_encode(b, other, 3000, &ids, &ni));
    int64_t nr = naive_encode(b, (const unsigned char *)other, 3000, ref);
    ASSERT_EQ_INT(ni, nr);
    ASSERT(ni < 3000 * 2 / 3); /* it compresses */
    for (int64_t i = 0; i < ni; i++)
        ASSERT_EQ_INT(ids[i], ref[i]);
    char *dec;
    size_t dl;
    ASSERT_OK(dt_bpe_decode(b, ids, ni, &dec, &dl));
    ASSERT_EQ_INT(dl, 3000);
    ASSERT(!memcmp(dec, other, 3000));
    free(dec);
    free(ids);
    free(ref);
    free(other);
    /* random bytes, every value 0..255, long runs of one byte too */
    for (int round = 0; round < 4; round++) {
        size_t m = 1 + rnd() % 50000;
        unsigned char *rb = malloc(m);
        for (size_t i = 0; i < m; i++)
            rb[i] = round == 3 && i > m / 2 ? ' ' : (unsigned char)rnd();
        ASSERT_OK(dt_bpe_encode(b, rb, m, &ids, &ni));
        ASSERT_OK(dt_bpe_decode(b, ids, ni, &dec, &dl));
        ASSERT_EQ_INT(dl, m);
        ASSERT(!memcmp(dec, rb, m));
        free(dec);
        free(ids);
        free(rb);
    }
    /* a vocab trained on random bytes round-trips text too */
    dt_bpe_free(b);
    unsigned char *rb = malloc(40000);
    for (size_t i = 0; i < 40000; i++)
        rb[i] = (unsigned char)(rnd() % 7 == 0 ? ' ' : rnd());
    tp.vocab_size = 300;
    tp.min_count = 1;
    ASSERT_OK(dt_bpe_train(rb, 40000, &tp, &b));
    ASSERT_OK(dt_bpe_encode(b, text, n, &ids, &ni));
    ASSERT_OK(dt_bpe_decode(b, ids, ni, &dec, &dl));
    ASSERT_EQ_INT(dl, n);
    ASSERT(!memcmp(dec, text, n));
    free(dec);
    free(ids);
    free(rb);
    /* empty input, ids outside the vocabulary */
    ASSERT_OK(dt_bpe_encode(b, "", 0, &ids, &ni));
    ASSERT_EQ_INT(ni, 0);
    ASSERT(ids == NULL);
    uint16_t bad[3] = {1, 300, 2};
    ASSERT_STATUS(dt_bpe_decode(b, bad, 3, &dec, &dl), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "id 300 at position 1");
    /* ids as a model gives them (int64, its vocabulary maybe larger than
     * the BPE's): 65536 + 97 must not narrow to 97 ('a'); -1 is no id either */
    int64_t wide[3] = {104, 105, 97};
    ASSERT_OK(dt_bpe_decode_ids(b, wide, 3, &dec, &dl));
    ASSERT_EQ_INT(dl, 3);
    ASSERT(!memcmp(dec, "hia", 3));
    free(dec);
    wide[2] = 65536 + 97;
    dec = (char *)"unchanged";
    ASSERT_STATUS(dt_bpe_decode_ids(b, wide, 3, &dec, &dl), DT_ERR_RANGE);
    ASSERT(dec == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "id 65633 at position 2");
    wide[0] = -1, wide[2] = 97;
    ASSERT_STATUS(dt_bpe_decode_ids(b, wide, 3, &dec, &dl), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "id -1 at position 0");
    wide[0] = dt_bpe_vocab_size(b); /* the first id past the vocabulary */
    ASSERT_STATUS(dt_bpe_decode_ids(b, wide, 3, &dec, &dl), DT_ERR_RANGE);
    dt_bpe_free(b);
    free(text);
}

static char path_[600];
static const char *tpath(const char *dir, const char *name)
{
    snprintf(path_, sizeof path_, "%s/%s", dir, name);
    return path_;
}

TEST(vocab_file)
{
    char *dir = tu_tmpdir();
    char *text = make_text(10000);
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 300;
    dt_bpe *b = NULL, *c = NULL;
    ASSERT_OK(dt_bpe_train(text, 10000, &tp, &b));
    ASSERT_OK(dt_bpe_save(b, tpath(dir, "v.bpe")));
    ASSERT_OK(dt_bpe_load(tpath(dir, "v.bpe"), &c));
    ASSERT_EQ_INT(dt_bpe_vocab_size(c), dt_bpe_vocab_size(b));
    for (int64_t k = 0; k < dt_bpe_vocab_size(b) - 256; k++) {
        uint32_t l1, r1, l2, r2;
        ASSERT_OK(dt_bpe_merge(b, k, &l1, &r1));
        ASSERT_OK(dt_bpe_merge(c, k, &l2, &r2));
        ASSERT_EQ_INT(l1, l2);
        ASSERT_EQ_INT(r1, r2);
    }
    dt_bpe_free(c);
    /* the file as documented */
    FILE *f = fopen(tpath(dir, "v.bpe"), "rb");
    char line[200];
    ASSERT(fgets(line, sizeof line, f) != NULL);
    ASSERT_STR_EQ(line, "dtrain-bpe 1\n");
    ASSERT(fgets(line, sizeof line, f) != NULL);
    ASSERT_STR_EQ(line, "merges 44\n");
    fclose(f);
    /* a symlink at the name is refused */
    tu_write(tpath(dir, "target"), "keep", 4);
    char target[600];
    snprintf(target, sizeof target, "%s", tpath(dir, "target"));
    ASSERT(symlink(target, tpath(dir, "link.bpe")) == 0);
    ASSERT_STATUS(dt_bpe_save(b, tpath(dir, "link.bpe")), DT_ERR_IO);
    struct stat sb;
    ASSERT(stat(target, &sb) == 0 && sb.st_size == 4);
    ASSERT_STATUS(dt_bpe_load(tpath(dir, "missing"), &c), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "missing");
    ASSERT_STATUS(dt_bpe_load(dir, &c), DT_ERR_IO);
    dt_bpe_free(b);
    /* good hand-written files, with and without comments */
    const char *good = "dtrain-bpe 1\nmerges 3\n97 97  # aa\n256 98\n0 257 # x\n";
    ASSERT_OK(dt_bpe_load_mem(good, strlen(good), "g", &c));
    ASSERT_EQ_INT(dt_bpe_vocab_size(c), 259);
    const unsigned char *tb;
    size_t tl;
    ASSERT_OK(dt_bpe_token_bytes(c, 258, &tb, &tl));
    ASSERT_EQ_INT(tl, 4);
    ASSERT(!memcmp(tb, "\0aab", 4));
    dt_bpe_free(c);
    ASSERT_OK(dt_bpe_load_mem("dtrain-bpe 1\nmerges 0\n", 22, "e", &c));
    ASSERT_EQ_INT(dt_bpe_vocab_size(c), 256);
    dt_bpe_free(c);
    struct {
        const char *text, *msg;
    } bad[] = {
        {"", "bad:1: not a dtrain BPE vocab"},
        {"dtrain-bpe 2\nmerges 0\n", "bad:1:"},
        {"dtrain-bpe 1\nmerge 0\n", "bad:2: want \"merges N\""},
        {"dtrain-bpe 1\nmerges 65281\n", "bad:2:"},
        {"dtrain-bpe 1\nmerges -1\n", "bad:2:"},
        {"dtrain-bpe 1\nmerges 1", "bad:2:"},
        {"dtrain-bpe 1\nmerges 2\n97 98\n", "bad:4: truncated: 1 of 2 merges"},
        {"dtrain-bpe 1\nmerges 1\n97 256\n", "bad:3: want \"LEFT RIGHT\", two ids below 256"},
        {"dtrain-bpe 1\nmerges 2\n97 98\n257 1\n", "bad:4: want \"LEFT RIGHT\", two ids below 257"},
        {"dtrain-bpe 1\nmerges 2\n97 98\n97 98\n", "merge 1 repeats the pair (97, 98) of merge 0"},
        {"dtrain-bpe 1\nmerges 1\n97 98 x\n", "bad:3: unexpected text after the ids"},
        {"dtrain-bpe 1\nmerges 1\n97 98", "bad:3: no newline"},
        {"dtrain-bpe 1\nmerges 1\n97  98\n", "bad:3: want"},
        {"dtrain-bpe 1\nmerges 1\n097 98\n", "bad:3: want"},
        {"dtrain-bpe 1\nmerges 1\n97 98\n\n", "bad:4: text after the 1 merges"},
        {"dtrain-bpe 1\nmerges 1\n99999999999999999999 98\n", "bad:3: want"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = (dt_bpe *)1;
        ASSERT_STATUS(dt_bpe_load_mem(bad[i].text, strlen(bad[i].text), "bad", &c), DT_ERR_FORMAT);
        ASSERT(c == NULL);
        ASSERT_STR_CONTAINS(dt_last_error(), bad[i].msg);
    }
    /* tokens that double each merge are bounded, not allocated */
    char big[4000];
    int o = snprintf(big, sizeof big, "dtrain-bpe 1\nmerges 40\n97 97\n");
    for (int k = 1; k < 40; k++)
        o += snprintf(big + o, sizeof big - (size_t)o, "%d %d\n", 255 + k, 255 + k);
    ASSERT_STATUS(dt_bpe_load_mem(big, (size_t)o, "big", &c), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "tokens longer than");
    free(text);
    tu_rmdir(dir);
}

TEST(bible)
{
    FILE *p = popen("bible Gen1:1-Rev22:21 2>/dev/null", "r");
    if (!p)
        DT_TEST_SKIP_NEED("bible", "cannot run bible");
    size_t cap = 5u << 20, n = 0, r;
    char *t = malloc(cap);
    while ((r = fread(t + n, 1, cap - n, p)) > 0)
        n += r;
    int rc = pclose(p);
    if (rc != 0 || n < 4000000) {
        free(t);
        DT_TEST_SKIP_NEED("bible", "the King James Bible is not installed (bible-kjv, bible-kjv-text)");
    }
    dt_bpe_train_params tp = dt_bpe_train_params_default();
    tp.vocab_size = 4096;
    double t0 = dt_time_s();
    dt_bpe *b = NULL;
    ASSERT_OK(dt_bpe_train(t, n, &tp, &b));
    double secs = dt_time_s() - t0;
    fprintf(stderr, "bible: %zu bytes, vocab 4096 trained in %.2f s\n", n, secs);
    ASSERT_EQ_INT(dt_bpe_vocab_size(b), 4096);
    ASSERT(secs < 30);
    /* the first merges are English's commonest pairs */
    const unsigned char *tb;
    size_t tl;
    ASSERT_OK(dt_bpe_token_bytes(b, 256, &tb, &tl));
    ASSERT(tl == 2 && !memcmp(tb, "th", 2));
    uint16_t *ids;
    int64_t ni;
    ASSERT_OK(dt_bpe_encode(b, t, n, &ids, &ni));
    fprintf(stderr, "bible: %lld tokens, %.2f bytes per token\n", (long long)ni, (double)n / (double)ni);
    ASSERT((double)n / (double)ni > 3.5);
    char *dec;
    size_t dl;
    ASSERT_OK(dt_bpe_decode(b, ids, ni, &dec, &dl));
    ASSERT_EQ_INT(dl, n);
    ASSERT(!memcmp(dec, t, n));
    free(dec);
    free(ids);
    dt_bpe_free(b);
    free(t);
}

int main(void)
{
    RUN(chunker);
    RUN(hand_computed);
    RUN(trainer_matches_naive);
    RUN(encoder_matches_naive_and_round_trips);
    RUN(vocab_file);
    RUN(bible);
    return TEST_REPORT();
}
