/* llm.c token files: write and read back (uint16, and uint32 for ids above
 * 65,535), the window dataset (with the loader and the distributed sampler),
 * and bad files (wrong magic, wrong version, truncated, count beyond the
 * file, trailing bytes, tokens beyond the vocabulary, symlinks), each an
 * error naming the file. */
#include "data_util.h"
#include "dtrain/data.h"
#include "test.h"

#include <sys/stat.h>

static char path_[600];
static const char *tpath(const char *dir, const char *name)
{
    snprintf(path_, sizeof path_, "%s/%s", dir, name);
    return path_;
}

/* A token file image in memory: header words h0..h2, then n tokens i*7 % 50257. */
static unsigned char *make_file(int32_t magic, int32_t version, int32_t count, int64_t n, size_t *len)
{
    *len = 1024 + 2 * (size_t)n;
    unsigned char *b = calloc(1, *len);
    int32_t h[3] = {magic, version, count};
    memcpy(b, h, sizeof h);
    for (int64_t i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i * 7 % 50257);
        memcpy(b + 1024 + 2 * i, &t, 2);
    }
    return b;
}

TEST(write_read_roundtrip)
{
    char *dir = tu_tmpdir();
    uint16_t tok[1000];
    for (int i = 0; i < 1000; i++)
        tok[i] = (uint16_t)(i * 131 % 65536);
    const char *p = tpath(dir, "t.bin");
    ASSERT_OK(dt_tokens_write(p, tok, 1000));
    /* exactly llm.c's layout */
    FILE *f = fopen(p, "rb");
    ASSERT(f != NULL);
    int32_t h[256];
    ASSERT_EQ_INT(fread(h, 4, 256, f), 256);
    ASSERT_EQ_INT(h[0], 20240520);
    ASSERT_EQ_INT(h[1], 1);
    ASSERT_EQ_INT(h[2], 1000);
    for (int i = 3; i < 256; i++)
        ASSERT_EQ_INT(h[i], 0);
    fseek(f, 0, SEEK_END);
    ASSERT_EQ_INT(ftell(f), 1024 + 2000);
    fclose(f);
    dt_tokens *t = NULL;
    ASSERT_OK(dt_tokens_open(p, 0, &t));
    ASSERT_EQ_INT(dt_tokens_count(t), 1000);
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ_INT(dt_tokens_data(t)[i], tok[i]);
    int64_t mx = 0;
    for (int i = 0; i < 1000; i++)
        mx = tok[i] + 1 > mx ? tok[i] + 1 : mx;
    ASSERT_EQ_INT(dt_tokens_max_plus_one(t), mx);
    dt_tokens_close(t);
    /* a vocabulary the file fits in, and one it does not */
    ASSERT_OK(dt_tokens_open(p, mx, &t));
    dt_tokens_close(t);
    ASSERT_STATUS(dt_tokens_open(p, mx - 1, &t), DT_ERR_FORMAT);
    ASSERT(t == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), p);
    ASSERT_STR_CONTAINS(dt_last_error(), ">= vocab size");
    tu_rmdir(dir);
}

/* uint32 token files (llm.c's Llama-3 kind: magic 20240801, version 7):
 * ids up to 2^32 - 1 read back as written, through dt_tokens_at and the
 * window dataset; the size check counts 4 bytes a token. */
TEST(uint32_files)
{
    char *dir = tu_tmpdir();
    uint32_t tok[300];
    for (int i = 0; i < 300; i++)
        tok[i] = (uint32_t)(i * 104729u % 128256u);
    tok[7] = 128255;
    tok[8] = 65536;
    const char *p = tpath(dir, "w.bin");
    ASSERT_OK(dt_tokens_write_u32(p, tok, 300));
    FILE *f = fopen(p, "rb");
    ASSERT(f != NULL);
    int32_t h[256];
    ASSERT_EQ_INT(fread(h, 4, 256, f), 256);
    ASSERT_EQ_INT(h[0], 20240801);
    ASSERT_EQ_INT(h[1], 7);
    ASSERT_EQ_INT(h[2], 300);
    fseek(f, 0, SEEK_END);
    ASSERT_EQ_INT(ftell(f), 1024 + 4 * 300);
    fclose(f);
    dt_tokens *t = NULL;
    ASSERT_OK(dt_tokens_open(p, 128256, &t));
    ASSERT_EQ_INT(dt_tokens_width(t), 4);
    ASSERT(dt_tokens_data(t) == NULL);
    ASSERT(dt_tokens_data_u32(t) != NULL);
    for (int i = 0; i < 300; i++) {
        ASSERT_EQ_U64(dt_tokens_at(t, i), tok[i]);
        ASSERT_EQ_U64(dt_tokens_data_u32(t)[i], tok[i]);
    }
    ASSERT_EQ_INT(dt_tokens_max_plus_one(t), 128256);
    double nats = 0;
    ASSERT_OK(dt_tokens_unigram_xent(t, t, 0, &nats));
    ASSERT(nats > 0);
    dt_tokens_close(t);
    ASSERT_STATUS(dt_tokens_open(p, 128255, &t), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "token 128255 at position 7 >= vocab size 128255");
    /* windows: the ids whole, not cut to 16 bits */
    dt_tokens_params tp = dt_tokens_params_default();
    tp.seq_len = 8;
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    int64_t x[8], y[8];
    ASSERT_OK(dt_dataset_get_item(ds, 0, x, y));
    ASSERT_EQ_INT(x[7], 128255);
    ASSERT_EQ_INT(y[7], 65536);
    ASSERT_EQ_INT(y[6], 128255);
    dt_dataset_free(ds);
    /* a 2-bytes-a-token size under the uint32 magic, and the versions of each magic */
    size_t len;
    unsigned char *b = make_file(20240801, 7, 10, 10, &len); /* 20 bytes of tokens: 5 uint32 */
    ASSERT_STATUS(dt_tokens_check_mem(b, len, "w.bin", 0, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "truncated: the header says 10 tokens, the file holds 5");
    free(b);
    b = make_file(20240801, 7, 5, 10, &len);
    ASSERT_OK(dt_tokens_check_mem(b, len, "w.bin", 0, NULL));
    free(b);
    b = make_file(20240801, 1, 5, 10, &len);
    ASSERT_STATUS(dt_tokens_check_mem(b, len, "w.bin", 0, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "bad version 1");
    free(b);
    tu_rmdir(dir);
}

TEST(writer_refuses)
{
    char *dir = tu_tmpdir();
    uint16_t tok[2] = {1, 2};
    ASSERT_STATUS(dt_tokens_write(tpath(dir, "e.bin"), tok, 0), DT_ERR_INVALID_ARG);
    struct stat sb;
    ASSERT(lstat(tpath(dir, "e.bin"), &sb) != 0); /* nothing written */
    /* a symlink at the name is refused and its target untouched */
    char target[600];
    snprintf(target, sizeof target, "%s/target", dir);
    tu_write(target, "keep", 4);
    ASSERT(symlink(target, tpath(dir, "link.bin")) == 0);
    ASSERT_STATUS(dt_tokens_write(tpath(dir, "link.bin"), tok, 2), DT_ERR_IO);
    ASSERT(stat(target, &sb) == 0);
    ASSERT_EQ_INT(sb.st_size, 4);
    tu_rmdir(dir);
}

TEST(bad_files)
{
    size_t len;
    unsigned char *b;
    int64_t cnt = -1;
    /* good */
    b = make_file(20240520, 1, 10, 10, &len);
    ASSERT_OK(dt_tokens_check_mem(b, len, "g.bin", 50257, &cnt));
    ASSERT_EQ_INT(cnt, 10);
    free(b);
    struct {
        int32_t magic, version, count;
        int64_t n;
        size_t cut;
        const char *msg;
    } cases[] = {
        {20240521, 1, 10, 10, 0, "bad magic 20240521"},
        {20240520, 7, 10, 10, 0, "bad version 7"},
        {20240520, 1, 11, 10, 0, "truncated: the header says 11 tokens, the file holds 10"},
        {20240520, 1, 2000000000, 10, 0, "truncated: the header says 2000000000 tokens"},
        {20240520, 1, 0, 0, 0, "says 0 tokens"},
        {20240520, 1, -5, 10, 0, "says -5 tokens"},
        {20240520, 1, 9, 10, 0, "2 bytes after the 9 tokens"},
        {20240520, 1, 10, 10, 1015, "truncated: 1015 bytes"},
        {20240520, 1, 10, 10, 1024 + 19, "truncated: the header says 10 tokens, the file holds 9"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        b = make_file(cases[c].magic, cases[c].version, cases[c].count, cases[c].n, &len);
        if (cases[c].cut)
            len = cases[c].cut;
        ASSERT_STATUS(dt_tokens_check_mem(b, len, "bad.bin", 0, NULL), DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "bad.bin");
        ASSERT_STR_CONTAINS(dt_last_error(), cases[c].msg);
        free(b);
    }
    /* a token beyond the vocabulary, at its position */
    b = make_file(20240520, 1, 10, 10, &len);
    uint16_t big = 60000;
    memcpy(b + 1024 + 2 * 6, &big, 2);
    ASSERT_STATUS(dt_tokens_check_mem(b, len, "v.bin", 50257, NULL), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "token 60000 at position 6 >= vocab size 50257");
    ASSERT_OK(dt_tokens_check_mem(b, len, "v.bin", 0, NULL));
    free(b);
    /* the same through files: errors name the path */
    char *dir = tu_tmpdir();
    b = make_file(1, 1, 10, 10, &len);
    tu_write(tpath(dir, "m.bin"), b, len);
    free(b);
    dt_tokens *t = (dt_tokens *)1;
    ASSERT_STATUS(dt_tokens_open(tpath(dir, "m.bin"), 0, &t), DT_ERR_FORMAT);
    ASSERT(t == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), tpath(dir, "m.bin"));
    ASSERT_STATUS(dt_tokens_open(tpath(dir, "missing.bin"), 0, &t), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "missing.bin");
    ASSERT_STATUS(dt_tokens_open(dir, 0, &t), DT_ERR_IO); /* a directory */
    tu_write(tpath(dir, "empty.bin"), "", 0);
    ASSERT_STATUS(dt_tokens_open(tpath(dir, "empty.bin"), 0, &t), DT_ERR_FORMAT);
    dt_dataset *ds = (dt_dataset *)1;
    dt_tokens_params tp = dt_tokens_params_default();
    tp.seq_len = 4;
    ASSERT_STATUS(dt_dataset_tokens_open(tpath(dir, "empty.bin"), &tp, &ds), DT_ERR_FORMAT);
    ASSERT(ds == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "empty.bin");
    tu_rmdir(dir);
}

TEST(windows)
{
    char *dir = tu_tmpdir();
    uint16_t tok[23];
    for (int i = 0; i < 23; i++)
        tok[i] = (uint16_t)(100 + i);
    const char *p = tpath(dir, "w.bin");
    ASSERT_OK(dt_tokens_write(p, tok, 23));
    dt_tokens_params tp = dt_tokens_params_default();
    tp.seq_len = 5;
    tp.vocab_size = 200;
    dt_dataset *ds = NULL;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    /* (23 - 6) / 5 + 1 = 4 disjoint windows */
    ASSERT_EQ_INT(dt_dataset_length(ds), 4);
    const dt_dataset_info *info = dt_dataset_get_info(ds);
    ASSERT_EQ_INT(info->x_dtype, DT_I64);
    ASSERT_EQ_INT(info->y_dtype, DT_I64);
    ASSERT_EQ_INT(info->x_shape[0], 5);
    ASSERT_EQ_INT(info->num_classes, 200);
    ASSERT_STR_EQ(dt_dataset_source(ds), p);
    int64_t x[5], y[5];
    ASSERT_OK(dt_dataset_get_item(ds, 3, x, y));
    for (int k = 0; k < 5; k++) {
        ASSERT_EQ_INT(x[k], 100 + 15 + k);
        ASSERT_EQ_INT(y[k], 100 + 16 + k);
    }
    ASSERT_STATUS(dt_dataset_get_item(ds, 4, x, y), DT_ERR_RANGE);
    /* sequential batches of B = 2 are llm.c's: B*T+1 consecutive tokens */
    dt_sampler *s;
    ASSERT_OK(dt_sampler_sequential_init(dt_dataset_length(ds), &s));
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = 2;
    dt_loader *ld;
    ASSERT_OK(dt_loader_init(ds, s, &lp, &ld));
    ASSERT_OK(dt_loader_start_epoch(ld, 0));
    const dt_batch *bt;
    int nb = 0;
    while (dt_loader_next(ld, &bt) == DT_OK && bt) {
        const int64_t *bx = bt->x, *by = bt->y;
        for (int k = 0; k < 10; k++) {
            ASSERT_EQ_INT(bx[k], 100 + nb * 10 + k);
            ASSERT_EQ_INT(by[k], 100 + nb * 10 + k + 1);
        }
        nb++;
    }
    ASSERT_EQ_INT(nb, 2);
    dt_loader_free(ld);
    dt_sampler_free(s);
    dt_dataset_free(ds);
    /* stride 1: every offset; the last window ends at the last token */
    tp.stride = 1;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 23 - 5);
    ASSERT_OK(dt_dataset_get_item(ds, 17, x, y));
    ASSERT_EQ_INT(x[0], 117);
    ASSERT_EQ_INT(y[4], 122);
    /* the distributed sampler: two ranks, disjoint, together every window */
    int seen[18] = {0};
    for (int r = 0; r < 2; r++) {
        dt_distributed_sampler_params dp = dt_distributed_sampler_params_default();
        dp.length = dt_dataset_length(ds);
        dp.world_size = 2;
        dp.rank = r;
        dp.seed = 5;
        ASSERT_OK(dt_sampler_distributed_init(&dp, &s));
        ASSERT_EQ_INT(dt_sampler_length(s), 9);
        int64_t idx[9];
        ASSERT_OK(dt_sampler_indices(s, 0, idx));
        for (int i = 0; i < 9; i++) {
            ASSERT_OK(dt_dataset_get_item(ds, idx[i], x, y));
            ASSERT_EQ_INT(x[0], 100 + idx[i]);
            seen[idx[i]]++;
        }
        dt_sampler_free(s);
    }
    for (int i = 0; i < 18; i++)
        ASSERT_EQ_INT(seen[i], 1);
    dt_dataset_free(ds);
    /* fewer than T + 1 tokens: no windows (an empty set, not an error) */
    tp.seq_len = 23;
    tp.stride = 0;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 0);
    dt_dataset_free(ds);
    tp.seq_len = 22;
    ASSERT_OK(dt_dataset_tokens_open(p, &tp, &ds));
    ASSERT_EQ_INT(dt_dataset_length(ds), 1);
    dt_dataset_free(ds);
    /* vocabulary too small, bad params */
    tp.vocab_size = 122;
    ASSERT_STATUS(dt_dataset_tokens_open(p, &tp, &ds), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "token 122 at position 22");
    tp.vocab_size = 0;
    tp.seq_len = 0;
    ASSERT_STATUS(dt_dataset_tokens_open(p, &tp, &ds), DT_ERR_INVALID_ARG);
    tu_rmdir(dir);
}

TEST(unigram_xent)
{
    char *dir = tu_tmpdir();
    /* train: 0 0 0 1 (vocab 4, add-one: p = 4/8, 2/8, 1/8, 1/8); eval: 0 1 2 */
    uint16_t tr[4] = {0, 0, 0, 1}, ev[3] = {0, 1, 2};
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    ASSERT_OK(dt_tokens_write(a, tr, 4));
    ASSERT_OK(dt_tokens_write(b, ev, 3));
    dt_tokens *ta, *tb;
    ASSERT_OK(dt_tokens_open(a, 0, &ta));
    ASSERT_OK(dt_tokens_open(b, 0, &tb));
    double h;
    ASSERT_OK(dt_tokens_unigram_xent(ta, tb, 4, &h));
    ASSERT_NEAR(h, -(log(0.5) + log(0.25) + log(0.125)) / 3, 1e-12, 0);
    ASSERT_OK(dt_tokens_unigram_xent(ta, tb, 0, &h)); /* vocab 3 from the files */
    ASSERT_NEAR(h, -(log(4.0 / 7) + log(2.0 / 7) + log(1.0 / 7)) / 3, 1e-12, 0);
    ASSERT_STATUS(dt_tokens_unigram_xent(ta, tb, 2, &h), DT_ERR_INVALID_ARG);
    dt_tokens_close(ta);
    dt_tokens_close(tb);
    tu_rmdir(dir);
}

int main(void)
{
    RUN(unigram_xent);
    RUN(write_read_roundtrip);
    RUN(uint32_files);
    RUN(writer_refuses);
    RUN(bad_files);
    RUN(windows);
    return TEST_REPORT();
}
