/* safetensors writer and reader: round trips of every dtype (scalars, empty
 * tensors, pieces written in any order), the layout rules (8-byte header
 * padding, the package's tensor order), the CRC, and every bad-input case
 * the reader must refuse with a message naming the file and the tensor. */
#include "dtrain/ckpt.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

static uint64_t file_size(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

TEST(round_trip_every_dtype)
{
    char path[256];
    path_in(path, sizeof path, "all.safetensors");
    dt_st_desc d[DT_ST_DTYPE_COUNT + 2];
    char names[DT_ST_DTYPE_COUNT][32];
    uint8_t *data[DT_ST_DTYPE_COUNT];
    size_t nb[DT_ST_DTYPE_COUNT];
    int n = 0;
    for (int t = 0; t < DT_ST_DTYPE_COUNT; t++, n++) {
        snprintf(names[t], sizeof names[t], "layer%d.weight", t);
        d[n] = (dt_st_desc){.name = names[t], .dtype = (dt_st_dtype)t, .ndim = 2, .shape = {3, t + 1}};
        nb[t] = 3 * (size_t)(t + 1) * dt_st_dtype_size((dt_st_dtype)t);
        data[t] = malloc(nb[t]);
        for (size_t i = 0; i < nb[t]; i++)
            data[t][i] = (uint8_t)(i * 7 + (size_t)t * 13 + 1);
    }
    d[n++] = (dt_st_desc){.name = "step", .dtype = DT_ST_I64, .ndim = 0};
    d[n++] = (dt_st_desc){.name = "empty", .dtype = DT_ST_F32, .ndim = 2, .shape = {0, 5}};
    dt_st_kv meta[2] = {{"format", "pt"}, {"note", "quote \" and \\ and \n"}};
    dt_st_writer *w;
    ASSERT_OK(dt_st_writer_open(path, d, (size_t)n, meta, 2, &w));
    /* write backwards, each tensor in two pieces */
    for (int t = DT_ST_DTYPE_COUNT - 1; t >= 0; t--) {
        size_t h = nb[t] / 2;
        ASSERT_OK(dt_st_writer_write(w, (size_t)t, data[t], h));
        ASSERT_OK(dt_st_writer_write(w, (size_t)t, data[t] + h, nb[t] - h));
    }
    int64_t step = -123456789012345;
    ASSERT_OK(dt_st_writer_write(w, DT_ST_DTYPE_COUNT, &step, 8));
    ASSERT_OK(dt_st_writer_write(w, DT_ST_DTYPE_COUNT + 1, NULL, 0));
    ASSERT_EQ_INT(access(path, F_OK), -1); /* not there before commit */
    uint32_t crc = 0;
    uint64_t size = dt_st_writer_size(w);
    ASSERT_OK(dt_st_writer_commit(w, &crc));
    dt_st_writer_close(w);
    ASSERT_EQ_U64(file_size(path), size);

    dt_st_file *f;
    ASSERT_OK(dt_st_open(path, &f));
    ASSERT_EQ_U64(dt_st_count(f), (uint64_t)n);
    ASSERT_STR_EQ(dt_st_meta(f, "format"), "pt");
    ASSERT_STR_EQ(dt_st_meta(f, "note"), "quote \" and \\ and \n");
    ASSERT(dt_st_meta(f, "absent") == NULL);
    ASSERT_EQ_U64(dt_st_meta_count(f), 2);
    uint32_t crc2 = 0;
    ASSERT_OK(dt_st_checksum(f, DT_SUM_CRC32C, &crc2));
    ASSERT_EQ_U64(crc2, crc);
    /* the data starts 8-byte aligned, and each tensor is aligned to its size */
    const dt_st_tensor *first = dt_st_tensor_at(f, 0);
    ASSERT_EQ_U64(first->offset % 8, 0);
    for (size_t i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        ASSERT_EQ_U64((t->offset - first->offset) % dt_st_dtype_size(t->dtype), 0);
        if (i)
            ASSERT(dt_st_tensor_at(f, i - 1)->dtype >= t->dtype); /* dtype descending */
    }
    for (int t = 0; t < DT_ST_DTYPE_COUNT; t++) {
        const dt_st_tensor *x = dt_st_find(f, names[t]);
        ASSERT(x != NULL);
        ASSERT_EQ_INT(x->dtype, t);
        ASSERT_EQ_INT(x->ndim, 2);
        ASSERT_EQ_INT(x->shape[0], 3);
        ASSERT_EQ_INT(x->shape[1], t + 1);
        ASSERT_EQ_U64(x->nbytes, nb[t]);
        uint8_t *back = malloc(nb[t]);
        ASSERT_OK(dt_st_read(f, x, 0, nb[t], back));
        ASSERT(memcmp(back, data[t], nb[t]) == 0);
        /* a piece from the middle */
        ASSERT_OK(dt_st_read(f, x, 1, nb[t] - 2, back));
        ASSERT(memcmp(back, data[t] + 1, nb[t] - 2) == 0);
        ASSERT_STATUS(dt_st_read(f, x, 1, nb[t], back), DT_ERR_RANGE);
        ASSERT_STR_CONTAINS(dt_last_error(), names[t]);
        free(back);
        free(data[t]);
    }
    const dt_st_tensor *s = dt_st_find(f, "step");
    ASSERT(s && s->ndim == 0 && s->numel == 1 && s->nbytes == 8);
    int64_t back = 0;
    ASSERT_OK(dt_st_read(f, s, 0, 8, &back));
    ASSERT_EQ_INT(back, step);
    const dt_st_tensor *e = dt_st_find(f, "empty");
    ASSERT(e && e->numel == 0 && e->nbytes == 0 && e->shape[1] == 5);
    ASSERT(dt_st_find(f, "nope") == NULL);
    dt_st_close(f);
}

/* The header as the `safetensors` package writes it: __metadata__ first,
 * tensors by dtype size descending then name, compact, space-padded. */
TEST(header_layout_matches_package)
{
    char path[256];
    path_in(path, sizeof path, "layout.safetensors");
    dt_st_desc d[3] = {{.name = "b", .dtype = DT_ST_F16, .ndim = 1, .shape = {3}},
                       {.name = "a", .dtype = DT_ST_F16, .ndim = 1, .shape = {1}},
                       {.name = "z", .dtype = DT_ST_F32, .ndim = 2, .shape = {1, 2}}};
    dt_st_kv meta = {"format", "pt"};
    dt_st_writer *w;
    ASSERT_OK(dt_st_writer_open(path, d, 3, &meta, 1, &w));
    uint8_t zero[8] = {0};
    ASSERT_OK(dt_st_writer_write(w, 0, zero, 6));
    ASSERT_OK(dt_st_writer_write(w, 1, zero, 2));
    ASSERT_OK(dt_st_writer_write(w, 2, zero, 8));
    ASSERT_OK(dt_st_writer_commit(w, NULL));
    dt_st_writer_close(w);
    FILE *fp = fopen(path, "rb");
    ASSERT(fp != NULL);
    char buf[512] = {0};
    size_t got = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++)
        hn |= (uint64_t)(uint8_t)buf[i] << (8 * i);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},"
                       "\"z\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[0,8]},"
                       "\"a\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[8,10]},"
                       "\"b\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[10,16]}}";
    size_t wl = strlen(want);
    ASSERT_EQ_U64(hn, (wl + 7) / 8 * 8);
    ASSERT(got == 8 + hn + 16);
    ASSERT(memcmp(buf + 8, want, wl) == 0);
    for (size_t i = wl; i < hn; i++)
        ASSERT_EQ_INT(buf[8 + i], ' ');
}

TEST(writer_errors)
{
    char path[256];
    path_in(path, sizeof path, "werr.safetensors");
    dt_st_writer *w = NULL;
    dt_st_desc dup[2] = {{.name = "x", .dtype = DT_ST_F32, .ndim = 1, .shape = {2}},
                         {.name = "x", .dtype = DT_ST_F32, .ndim = 1, .shape = {2}}};
    ASSERT_STATUS(dt_st_writer_open(path, dup, 2, NULL, 0, &w), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "'x' is named twice");
    ASSERT(w == NULL);
    dt_st_desc neg = {.name = "n", .dtype = DT_ST_F32, .ndim = 1, .shape = {-1}};
    ASSERT_STATUS(dt_st_writer_open(path, &neg, 1, NULL, 0, &w), DT_ERR_INVALID_ARG);
    dt_st_desc res = {.name = "__metadata__", .dtype = DT_ST_F32, .ndim = 0};
    ASSERT_STATUS(dt_st_writer_open(path, &res, 1, NULL, 0, &w), DT_ERR_INVALID_ARG);
    dt_st_desc big = {.name = "big", .dtype = DT_ST_F64, .ndim = 3, .shape = {1 << 20, 1 << 20, 1 << 20}};
    ASSERT_STATUS(dt_st_writer_open(path, &big, 1, NULL, 0, &w), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "big");
    dt_st_kv dm[2] = {{"k", "1"}, {"k", "2"}};
    dt_st_desc ok = {.name = "ok", .dtype = DT_ST_I32, .ndim = 1, .shape = {2}};
    ASSERT_STATUS(dt_st_writer_open(path, &ok, 1, dm, 2, &w), DT_ERR_INVALID_ARG);
    /* too many bytes, then a commit with missing bytes: no file appears */
    ASSERT_OK(dt_st_writer_open(path, &ok, 1, NULL, 0, &w));
    int32_t v[3] = {1, 2, 3};
    ASSERT_STATUS(dt_st_writer_write(w, 0, v, 12), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "'ok'");
    ASSERT_STATUS(dt_st_writer_write(w, 1, v, 4), DT_ERR_RANGE);
    ASSERT_OK(dt_st_writer_write(w, 0, v, 4));
    ASSERT_STATUS(dt_st_writer_commit(w, NULL), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "'ok' got 4 of its 8 bytes");
    dt_st_writer_close(w);
    ASSERT_EQ_INT(access(path, F_OK), -1);
    /* a symlink at the path is refused */
    char link[256];
    path_in(link, sizeof link, "link.safetensors");
    ASSERT_EQ_INT(symlink("/tmp/dt-nowhere", link), 0);
    ASSERT_STATUS(dt_st_writer_open(link, &ok, 1, NULL, 0, &w), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "symbolic link");
    ASSERT_STATUS(dt_st_open("/nonexistent-dtrain/x.safetensors", NULL), DT_ERR_NULL);
    dt_st_file *f;
    ASSERT_STATUS(dt_st_open("/nonexistent-dtrain/x.safetensors", &f), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "/nonexistent-dtrain/x.safetensors");
}

/* A file of header h (padded as given) followed by ndata bytes. */
static size_t make(uint8_t *buf, const char *h, size_t ndata)
{
    size_t hn = strlen(h);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)hn >> (8 * i));
    memcpy(buf + 8, h, hn);
    memset(buf + 8 + hn, 0x5a, ndata);
    return 8 + hn + ndata;
}

/* The header must give status want, and a message naming the file and `what`. */
static int bad(const char *h, size_t ndata, dt_status want, const char *what)
{
    static uint8_t buf[4096];
    size_t n = make(buf, h, ndata);
    dt_st_file *f = (dt_st_file *)1;
    dt_status st = dt_st_open_mem(buf, n, "bad.safetensors", &f);
    if (st != want || f != NULL || !strstr(dt_last_error(), "bad.safetensors") ||
        !strstr(dt_last_error(), what)) {
        fprintf(stderr, "header %s: got %s \"%s\", want %s with \"%s\"\n", h, dt_status_name(st), dt_last_error(),
                dt_status_name(want), what);
        return 1;
    }
    return 0;
}

#define T1(extra) "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}" extra "}"

TEST(bad_inputs)
{
    int fails = 0;
    /* the good file first, so the cases below fail for their one defect */
    uint8_t buf[512];
    dt_st_file *f;
    ASSERT_OK(dt_st_open_mem(buf, make(buf, T1(""), 8), "good", &f));
    dt_st_close(f);
    ASSERT_OK(dt_st_open_mem(buf, make(buf, T1("") "   \n", 8), "trailing whitespace", &f));
    dt_st_close(f);
    ASSERT_OK(dt_st_open_mem(buf, make(buf, "{}", 0), "empty", &f));
    ASSERT_EQ_U64(dt_st_count(f), 0);
    dt_st_close(f);

    /* sizes */
    ASSERT_STATUS(dt_st_open_mem(buf, 5, "short.safetensors", &f), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "short.safetensors: 5 bytes");
    uint8_t huge[16] = {0x00, 0xe1, 0xf5, 0x05, 0x01}; /* 100,000,000 + 2^32 */
    ASSERT_STATUS(dt_st_open_mem(huge, 16, "huge.safetensors", &f), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "exceeds the format's limit");
    uint8_t longer[16] = {100};
    ASSERT_STATUS(dt_st_open_mem(longer, 16, "longer.safetensors", &f), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "larger than the file");
    size_t n = make(buf, T1(""), 8);
    ASSERT_STATUS(dt_st_open_mem(buf, n - 1, "trunc.safetensors", &f), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "'w' ends at data byte 8, past the end");
    ASSERT_STATUS(dt_st_open_mem(buf, make(buf, T1(""), 9), "extra.safetensors", &f), DT_ERR_FORMAT);
    ASSERT_STR_CONTAINS(dt_last_error(), "1 bytes after the last tensor");

    /* JSON */
    fails += bad("{\"w\":", 0, DT_ERR_FORMAT, "not valid JSON");
    fails += bad("[1,2]", 0, DT_ERR_FORMAT, "not a JSON object");
    fails += bad(T1("") "x", 8, DT_ERR_FORMAT, "bytes after the header");
    fails += bad("{\"\xff\":1}", 0, DT_ERR_FORMAT, "UTF-8");
    fails += bad("{\"\xc0\xaf\":1}", 0, DT_ERR_FORMAT, "UTF-8");  /* overlong */
    fails += bad("{\"\xed\xa0\x80\":1}", 0, DT_ERR_FORMAT, "UTF-8"); /* surrogate */
    /* tensors */
    fails += bad("{\"w\":1}", 0, DT_ERR_FORMAT, "'w': not a JSON object");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, DT_ERR_FORMAT, "'w': needs");
    fails += bad("{\"w\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, DT_ERR_FORMAT,
                 "'w': unknown dtype \"Q7\"");
    fails += bad("{\"w\":{\"dtype\":\"F4\",\"shape\":[2],\"data_offsets\":[0,1]}}", 1, DT_ERR_UNSUPPORTED, "'w'");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, DT_ERR_FORMAT,
                 "'w': shape[0]");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, DT_ERR_FORMAT,
                 "'w': shape[0]");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 8, DT_ERR_FORMAT,
                 "'w': shape[0]");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                 DT_ERR_UNSUPPORTED, "'w' has 9 dimensions");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
                 DT_ERR_FORMAT, "'w': shape overflows");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, DT_ERR_FORMAT,
                 "'w': data_offsets must be");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, DT_ERR_FORMAT,
                 "'w': data_offsets [8, 0] end before");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, DT_ERR_FORMAT,
                 "'w': data_offsets [0, 8] hold 8 bytes, its shape and dtype F32 need 12");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, DT_ERR_FORMAT,
                 "'w' begins at data byte 4, leaving a gap");
    fails += bad(T1(",\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}"), 12, DT_ERR_FORMAT,
                 "overlaps 'w'");
    fails += bad(T1(",\"v\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}"), 16, DT_ERR_FORMAT,
                 "'v' begins at data byte 12, leaving a gap after byte 8");
    fails += bad(T1(",\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}"), 12, DT_ERR_FORMAT,
                 "'w' appears twice");
    fails += bad(T1(",\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[9,9]}"), 9, DT_ERR_FORMAT,
                 "'x' begins at data byte 9");
    fails += bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,9007199254740994]}}", 8,
                 DT_ERR_FORMAT, "'w': data_offsets must be");
    /* metadata */
    fails += bad(T1(",\"__metadata__\":{\"a\":1}"), 8, DT_ERR_FORMAT, "__metadata__ \"a\": the value is not a string");
    fails += bad(T1(",\"__metadata__\":[]"), 8, DT_ERR_FORMAT, "__metadata__ is not a JSON object");
    fails += bad(T1(",\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}"), 8, DT_ERR_FORMAT, "\"a\" appears twice");
    fails += bad(T1(",\"__metadata__\":{},\"__metadata__\":{}"), 8, DT_ERR_FORMAT, "__metadata__ appears twice");
    ASSERT_EQ_INT(fails, 0);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt-test-st-XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(round_trip_every_dtype);
    RUN(header_layout_matches_package);
    RUN(writer_errors);
    RUN(bad_inputs);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return TEST_REPORT();
}
