/* The Parquet reader (src/data/parquet.h) against pyarrow: each fixture
 * under tests/data/parquet/ (tests/data/gen_parquet_fixtures.py writes
 * them: every codec, v1 and v2 pages, dictionary, plain and dictionary
 * fallback, the delta encodings, many row groups and pages, nulls, empty
 * strings, Unicode, lists of structs with null fields, nested lists,
 * legacy two-level lists, a pandas file) yields exactly the rows of its
 * .jsonl, which is pyarrow's own reading of it; unsupported columns that
 * are not selected do not fail the file, and selected ones are refused by
 * name; broken files (truncated, bad magic, a footer past the file,
 * corrupt Thrift, corrupt snappy, a lying page size, an unsupported codec,
 * a dictionary index or a level out of range) give the right code and a
 * message naming the problem; byte flips anywhere in a file give a row
 * set or an error with a message, never a crash (run under ASan too); and
 * through dt_dataset_text_open the same data as jsonl: and as parquet:
 * give the same token ids and loss masks. */
#include "data/parquet.h"
#include "base/json_strict.h"
#include "dtrain/tokenizer.h"
#include "test.h"
#include "tmp_util.h"

#include <stdlib.h>
#include <string.h>

static char *fixture(const char *name, const char *ext, size_t *n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/parquet/%s.%s", DT_SOURCE_DIR, name, ext);
    char *b = t_slurp(path, n);
    if (!b)
        fprintf(stderr, "cannot read %s\n", path);
    return b;
}

static void fixture_path(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/tests/data/parquet/%s.parquet", DT_SOURCE_DIR, name);
}

/* Every row of parquet NAME equals the line of NAME.jsonl (the same keys, values and order of arrays); the columns
 * selected are the keys of the expected rows. 0, or -1 after saying what differs. */
static int same_rows(const char *name)
{
    size_t n;
    char *want = fixture(name, "jsonl", &n);
    if (!want)
        return -1;
    char path[1024];
    fixture_path(name, path, sizeof path);
    dt__pq_file *f = NULL;
    int rc = -1;
    cJSON *first = NULL;
    if (dt__pq_open(path, &f) < 0) {
        fprintf(stderr, "%s: %s\n", name, dt_last_error());
        goto done;
    }
    const char *keys[64];
    size_t nk = 0;
    char *nl = strchr(want, '\n');
    if (!nl || dt__json_parse_strict(want, (size_t)(nl - want), name, &first) < 0)
        goto done;
    for (cJSON *k = first->child; k && nk < 64; k = k->next)
        keys[nk++] = k->string;
    if (dt__pq_select(f, keys, nk) < 0) {
        fprintf(stderr, "%s: select: %s\n", name, dt_last_error());
        goto done;
    }
    int64_t rows = 0;
    for (char *p = want; *p; rows++) {
        nl = strchr(p, '\n');
        cJSON *w = NULL, *got = NULL;
        if (!nl || dt__json_parse_strict(p, (size_t)(nl - p), name, &w) < 0)
            goto done;
        dt_status st = dt__pq_next(f, &got);
        bool same = st == DT_OK && got && cJSON_Compare(w, got, true);
        /* the same key order too (a row's keys are the columns' order) */
        for (cJSON *a = w->child, *b = got ? got->child : NULL; same && a; a = a->next, b = b->next)
            same = b && !strcmp(a->string, b->string);
        if (!same) {
            char *g = got ? cJSON_PrintUnformatted(got) : NULL;
            fprintf(stderr, "%s: row %lld: %s\n  want %.*s\n  got  %s\n", name, (long long)rows,
                    st < 0 ? dt_last_error() : dt__pq_where(f), (int)(nl - p), p, g ? g : "(none)");
            free(g);
        }
        cJSON_Delete(w);
        cJSON_Delete(got);
        if (!same)
            goto done;
        p = nl + 1;
    }
    cJSON *extra = NULL;
    if (dt__pq_next(f, &extra) < 0 || extra) {
        fprintf(stderr, "%s: after %lld rows: %s\n", name, (long long)rows, extra ? "another row" : dt_last_error());
        cJSON_Delete(extra);
        goto done;
    }
    if (rows != dt__pq_num_rows(f) || rows == 0) {
        fprintf(stderr, "%s: %lld rows, the footer says %lld\n", name, (long long)rows,
                (long long)dt__pq_num_rows(f));
        goto done;
    }
    rc = 0;
done:
    cJSON_Delete(first);
    dt__pq_close(f);
    free(want);
    return rc;
}

TEST(rows_match_pyarrow)
{
    static const char *const names[] = {
        "mixed_none_v1", "mixed_none_v2", "mixed_snappy_v1", "mixed_snappy_v2", "mixed_gzip_v1", "mixed_gzip_v2",
#if DT_HAVE_ZSTD
        "mixed_zstd_v1", "mixed_zstd_v2", "delta_big_v1", "delta_big_v2", "prompt_completion_conv", "polars",
#endif
        "mixed_plain", "mixed_one_page", "dict_fallback_v1", "dict_fallback_v2", "delta_v1", "delta_v2", "delta_empty",
        "bool_rle", "prompt_completion", "chat", "docs", "extra_types", "pandas", "legacy_lists", "tiny", "index_page",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ASSERT_EQ_INT(same_rows(names[i]), 0);
}

/* How the fixtures are laid out: what the comparison above covers. */
TEST(fixtures_have_the_layouts)
{
    char path[1024];
    dt__pq_file *f;
    fixture_path("mixed_snappy_v1", path, sizeof path);
    ASSERT_OK(dt__pq_open(path, &f));
    ASSERT_EQ_INT(dt__pq_num_row_groups(f), 3); /* 60 rows, 25 a group */
    ASSERT_EQ_INT(dt__pq_num_rows(f), 60);
    ASSERT(dt__pq_has_column(f, "messages") && !dt__pq_has_column(f, "element"));
    dt__pq_close(f);
}

/* A file without zstd built in: a ZSTD page is refused saying so. */
TEST(zstd_or_its_absence)
{
    char path[1024];
    fixture_path("mixed_zstd_v1", path, sizeof path);
    dt__pq_file *f;
    ASSERT_OK(dt__pq_open(path, &f));
    cJSON *row = NULL;
    dt_status st = dt__pq_next(f, &row);
#if DT_HAVE_ZSTD
    ASSERT_OK(st);
    ASSERT(row != NULL);
#else
    ASSERT_STATUS(st, DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "lacks zstd");
#endif
    cJSON_Delete(row);
    dt__pq_close(f);
}

/* Reading all rows of parquet bytes b[0, n) with columns sel[0, nsel) (NULL: all): the first error's status (its
 * message in dt_last_error), or DT_OK. */
static dt_status read_all(const void *b, size_t n, const char *const *sel, size_t nsel, int64_t *rows)
{
    dt__pq_file *f;
    dt_status st = dt__pq_open_mem(b, n, "mem.parquet", &f);
    if (st < 0)
        return st;
    if (sel)
        st = dt__pq_select(f, sel, nsel);
    cJSON *row = NULL;
    int64_t k = 0;
    while (st == DT_OK && (st = dt__pq_next(f, &row)) == DT_OK && row) {
        cJSON_Delete(row);
        k++;
    }
    if (rows)
        *rows = k;
    dt__pq_close(f);
    return st;
}

/* Case name: fixture NAME read (columns sel) fails with code and a message holding msg. */
static int fails(const char *name, const char *const *sel, size_t nsel, dt_status code, const char *msg)
{
    size_t n;
    char *b = fixture(name, "parquet", &n);
    if (!b)
        return -1;
    dt_status st = read_all(b, n, sel, nsel, NULL);
    free(b);
    if (st == code && strstr(dt_last_error(), msg) && strstr(dt_last_error(), "mem.parquet"))
        return 0;
    fprintf(stderr, "%s: status %d (want %d): \"%s\" (want \"%s\")\n", name, (int)st, (int)code, dt_last_error(),
            msg);
    return -1;
}

TEST(broken_files)
{
    static const char *const text[] = {"text"};
    ASSERT_EQ_INT(fails("bad_dict_index", text, 1, DT_ERR_FORMAT, "dictionary index 5, past the dictionary's 2"), 0);
    ASSERT_EQ_INT(fails("bad_levels", text, 1, DT_ERR_FORMAT, "a definition level of 2, past the column's maximum"),
                  0);
    ASSERT_EQ_INT(fails("bad_snappy", text, 1, DT_ERR_FORMAT, "snappy copy reaches before the start"), 0);
    ASSERT_EQ_INT(fails("bad_snappy_size", text, 1, DT_ERR_FORMAT, "fewer bytes than the page header says"), 0);
    ASSERT_EQ_INT(fails("bad_page_size", text, 1, DT_ERR_FORMAT, "snappy stream says another decompressed size"), 0);
    ASSERT_EQ_INT(fails("bad_codec", text, 1, DT_ERR_UNSUPPORTED, "compressed with LZ4_RAW"), 0);
    ASSERT_EQ_INT(fails("bad_levels", text, 1, DT_ERR_FORMAT, "row group 0, column \"text\", page 0"), 0);
    /* unsupported columns: fine unless selected, then named */
    static const char *const when[] = {"text", "when"}, *const attrs[] = {"attrs"}, *const fixed[] = {"fixed"},
                             *const price[] = {"price"}, *const split[] = {"split"}, *const blob[] = {"blob"};
    ASSERT_EQ_INT(fails("extra_types", when, 2, DT_ERR_UNSUPPORTED, "column \"when\" is INT96"), 0);
    ASSERT_EQ_INT(fails("extra_types", attrs, 1, DT_ERR_UNSUPPORTED, "column \"attrs\" is a MAP"), 0);
    ASSERT_EQ_INT(fails("extra_types", fixed, 1, DT_ERR_UNSUPPORTED, "is FIXED_LEN_BYTE_ARRAY"), 0);
    ASSERT_EQ_INT(fails("extra_types", price, 1, DT_ERR_UNSUPPORTED, "column \"price\" is FIXED_LEN_BYTE_ARRAY"), 0);
    ASSERT_EQ_INT(fails("extra_types", split, 1, DT_ERR_UNSUPPORTED, "BYTE_STREAM_SPLIT"), 0);
    ASSERT_EQ_INT(fails("extra_types", blob, 1, DT_ERR_FORMAT, "row group 0, row 0, column \"blob\": a string that "
                        "is not valid UTF-8"), 0);
    ASSERT_EQ_INT(fails("extra_types", NULL, 0, DT_ERR_UNSUPPORTED, "INT96"), 0); /* everything: refused */
}

/* Broken versions of a good file, made here: each refused with its reason. */
TEST(broken_bytes)
{
    size_t n;
    unsigned char *good = (unsigned char *)fixture("mixed_snappy_v1", "parquet", &n);
    ASSERT(good != NULL && n > 100);
    unsigned char *b = malloc(n);
    uint32_t flen = (uint32_t)good[n - 8] | (uint32_t)good[n - 7] << 8 | (uint32_t)good[n - 6] << 16 |
                    (uint32_t)good[n - 5] << 24;
    ASSERT(flen > 20 && flen < n - 12);
    struct {
        const char *what, *msg;
        dt_status st;
    } cases[] = {
        {"truncated", "no \"PAR1\" at its end: truncated?", DT_ERR_FORMAT},
        {"bad magic", "no \"PAR1\" at its start", DT_ERR_FORMAT},
        {"footer past the file", "a footer of", DT_ERR_FORMAT},
        {"corrupt thrift", "footer: corrupt metadata (Thrift)", DT_ERR_FORMAT},
        {"footer cut short", "footer: corrupt metadata (Thrift)", DT_ERR_FORMAT},
        {"too short", "too short for a Parquet file", DT_ERR_FORMAT},
        {"encrypted", "encrypted footer", DT_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(b, good, n);
        size_t len = n;
        switch (i) {
        case 0: len = n / 2; break;
        case 1: memcpy(b, "PAR2", 4); break;
        case 2: b[n - 8] = 0xff, b[n - 7] = 0xff, b[n - 6] = 0xff, b[n - 5] = 0x0f; break;
        case 3: memset(b + n - 8 - flen + 10, 0xff, 16); break;
        case 4: /* the footer's last half dropped (the length and magic kept after it) */
            memmove(b + n - 8 - flen / 2, b + n - 8, 8);
            len = n - flen / 2;
            b[len - 8] = (unsigned char)(flen - flen / 2), b[len - 7] = (unsigned char)((flen - flen / 2) >> 8);
            b[len - 6] = b[len - 5] = 0;
            break;
        case 5: len = 11; break;
        case 6: memcpy(b + n - 4, "PARE", 4); break;
        }
        dt_status st = read_all(b, len, NULL, 0, NULL);
        if (st != cases[i].st || !strstr(dt_last_error(), cases[i].msg))
            fprintf(stderr, "%s: %d %s\n", cases[i].what, (int)st, dt_last_error());
        ASSERT_STATUS(st, cases[i].st);
        ASSERT_STR_CONTAINS(dt_last_error(), cases[i].msg);
    }
    free(b);
    free(good);
}

/* Every byte of small files flipped in turn (and a sample of bigger ones): each read ends with every row or an
 * error with a message, never a crash or a read out of bounds (ASan builds check that). */
TEST(byte_flips)
{
    static const char *const names[] = {"tiny", "legacy_lists", "mixed_snappy_v2", "delta_v1", "mixed_gzip_v1"};
    int64_t ok = 0, bad = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        size_t n;
        unsigned char *good = (unsigned char *)fixture(names[k], "parquet", &n);
        ASSERT(good != NULL);
        unsigned char *b = malloc(n);
        size_t step = n < 4000 ? 1 : n / 1500;
        for (size_t at = 0; at < n; at += step)
            for (int flip = 0; flip < 2; flip++) {
                memcpy(b, good, n);
                b[at] ^= flip ? 0xff : (unsigned char)(1u << (at % 8));
                dt_last_error();
                dt_status st = read_all(b, n, NULL, 0, NULL);
                if (st < 0) {
                    ASSERT(dt_last_error()[0] != 0);
                    bad++;
                } else {
                    ok++;
                }
            }
        free(b);
        free(good);
    }
    fprintf(stderr, "byte flips: %lld read through, %lld refused\n", (long long)ok, (long long)bad);
    ASSERT(bad > 0 && ok > 0);
}


/* Llama-3 Instruct's template in shape (test_chat_data.c's), and one that marks the assistant's turns. */
#define LLAMA3_CONFIG                                                                                                \
    "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", \"chat_template\": \"{% for message in " \
    "messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "            \
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"   \
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"                                             \
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}\"}"
#define GEN_TEMPLATE                                                                                                 \
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'assistant' %}<|start_header_id|>assistant"               \
    "<|end_header_id|>\n\n{% generation %}{{ m.content }}<|eot_id|>{% endgeneration %}{% else %}"                     \
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"

static dt_tokenizer *load_chat(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tokenizer/llama3.json", DT_SOURCE_DIR);
    dt_tokenizer *t = NULL;
    if (dt_tokenizer_load(path, &t) < 0 ||
        dt_tokenizer_apply_config(t, LLAMA3_CONFIG, strlen(LLAMA3_CONFIG), "llama3 config") < 0) {
        fprintf(stderr, "%s\n", dt_last_error());
        dt_tokenizer_free(t);
        return NULL;
    }
    return t;
}

/* jsonl:NAME.jsonl OPTS and parquet:NAME.parquet OPTS give the same windows (x and y, masks included): the number of
 * targets the loss counts, or -1 after saying what differs. */
static int64_t same_dataset(const dt_tokenizer *t, const char *name, const char *opts, bool mask, bool asst)
{
    char js[1200], pq[1200];
    snprintf(js, sizeof js, "jsonl:%s/tests/data/parquet/%s.jsonl%s", DT_SOURCE_DIR, name, opts);
    snprintf(pq, sizeof pq, "parquet:%s/tests/data/parquet/%s.parquet%s", DT_SOURCE_DIR, name, opts);
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 8;
    kp.stride = 1;
    kp.completion_only_loss = mask;
    kp.assistant_only_loss = asst;
    dt_dataset *a = NULL, *b = NULL;
    int64_t counted = -1;
    if (dt_dataset_text_open(js, t, &kp, &a) < 0 || dt_dataset_text_open(pq, t, &kp, &b) < 0) {
        fprintf(stderr, "%s: %s\n", name, dt_last_error());
        goto done;
    }
    if (dt_dataset_length(a) != dt_dataset_length(b) || dt_dataset_length(a) < 8) {
        fprintf(stderr, "%s: %lld windows as jsonl, %lld as parquet\n", name, (long long)dt_dataset_length(a),
                (long long)dt_dataset_length(b));
        goto done;
    }
    counted = 0;
    for (int64_t i = 0; i < dt_dataset_length(a); i++) {
        int64_t xa[8], ya[8], xb[8], yb[8];
        if (dt_dataset_get_item(a, i, xa, ya) < 0 || dt_dataset_get_item(b, i, xb, yb) < 0 ||
            memcmp(xa, xb, sizeof xa) || memcmp(ya, yb, sizeof ya)) {
            fprintf(stderr, "%s: window %lld differs\n", name, (long long)i);
            counted = -1;
            goto done;
        }
        for (int k = 0; k < 8; k++)
            counted += (i == 0 || k == 7) && ya[k] != -100;
    }
done:
    dt_dataset_free(a);
    dt_dataset_free(b);
    return counted;
}

TEST(dataset_same_as_jsonl)
{
    dt_tokenizer *t = load_chat();
    ASSERT(t != NULL);
    /* documents; prompt/completion with and without the mask (the mask counts fewer targets) */
    ASSERT(same_dataset(t, "docs", "", false, false) > 100);
    int64_t all = same_dataset(t, "prompt_completion", ",prompt=prompt,completion=completion", false, false);
    int64_t masked = same_dataset(t, "prompt_completion", "", true, false);
    ASSERT(all > 0 && masked > 0 && masked < all);
    /* conversations: a "messages" list<struct> with a null field; prompt/completion lists */
    ASSERT(same_dataset(t, "chat", "", false, false) > 100);
#if DT_HAVE_ZSTD
    ASSERT(same_dataset(t, "prompt_completion_conv", "", true, false) > 0);
#endif
    ASSERT_OK(dt_tokenizer_set_chat_template(t, GEN_TEMPLATE, strlen(GEN_TEMPLATE), "gen.jinja"));
    int64_t asst = same_dataset(t, "chat", "", false, true);
    ASSERT(asst > 0 && asst < same_dataset(t, "chat", "", false, false));
    /* a null text: the same refusal, the row named (0-based in the row group's file) */
    char spec[1200];
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/mixed_snappy_v1.parquet", DT_SOURCE_DIR);
    dt_tokens_params kp = dt_tokens_params_default();
    kp.seq_len = 8;
    dt_dataset *ds = NULL;
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "mixed_snappy_v1.parquet: row group 0, row 3: want an object with a string "
                                         "\"text\"");
    /* a number where the text should be: refused as jsonl: refuses it */
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/mixed_one_page.parquet,field=score", DT_SOURCE_DIR);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "row group 0, row 0: want an object with a string \"score\", not another "
                                         "JSON type");
    /* a missing column is a missing key */
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/docs.parquet,field=body", DT_SOURCE_DIR);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "docs.parquet: row group 0, row 0: want an object with a string \"body\"");
    /* an unsupported column the rows do not need is not read; one they need is named */
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/extra_types.parquet", DT_SOURCE_DIR);
    ASSERT_OK(dt_dataset_text_open(spec, t, &kp, &ds));
    dt_dataset_free(ds);
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/extra_types.parquet,field=when", DT_SOURCE_DIR);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "column \"when\" is INT96");
    /* a Parquet file given as jsonl: the hint */
    snprintf(spec, sizeof spec, "jsonl:%s/tests/data/parquet/docs.parquet", DT_SOURCE_DIR);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "give it as parquet:");
    /* the keys go with parquet: as with jsonl:, not with text: */
    snprintf(spec, sizeof spec, "parquet:%s/tests/data/parquet/docs.parquet,prompt=a", DT_SOURCE_DIR);
    ASSERT_STATUS(dt_dataset_text_open(spec, t, &kp, &ds), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "go together");
    ASSERT_STATUS(dt_dataset_text_open("parquet:/nonexistent/x.parquet", t, &kp, &ds), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent/x.parquet");
    dt_tokenizer_free(t);
}

int main(void)
{
    RUN(rows_match_pyarrow);
    RUN(fixtures_have_the_layouts);
    RUN(zstd_or_its_absence);
    RUN(broken_files);
    RUN(broken_bytes);
    RUN(byte_flips);
    RUN(dataset_same_as_jsonl);
    return TEST_REPORT();
}
