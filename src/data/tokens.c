/* llm.c token files: the checker, the memory-mapped reader, the writer and
 * the window dataset (data.h).
 *
 * Two formats: llm.c's GPT-2 file (magic 20240520, version 1, uint16
 * tokens) and its Llama-3 file (magic 20240801, version 7, uint32 tokens),
 * for vocabularies above 65,536 ids. The checks are llm.c's (magic,
 * version, size == 1024 + width * count, count > 0) plus the vocabulary bound, done once at open over the whole
 * file (a few ms for millions of tokens), so a batch read later cannot hold
 * an out-of-range token. Offsets are 64-bit (llm.c casts them to int). The
 * header fields past h[2] are not checked: llm.c writes zeros there and
 * reads nothing. Hosts that are not little-endian are refused (the file is
 * little-endian and read in place). */
#include "dtrain/data.h"
#include "mapfile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static bool host_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static int32_t header_word(const unsigned char *buf, int i)
{
    uint32_t v = (uint32_t)buf[4 * i] | (uint32_t)buf[4 * i + 1] << 8 | (uint32_t)buf[4 * i + 2] << 16 |
                 (uint32_t)buf[4 * i + 3] << 24;
    int32_t s;
    memcpy(&s, &v, sizeof s);
    return s;
}

/* Header and size; sets *count and *width (bytes per token). */
static dt_status check_header(const unsigned char *buf, size_t n, const char *name, int64_t *count, int *width)
{
    if (n < DT_TOKENS_HEADER_BYTES)
        return dt_error(DT_ERR_FORMAT, "token file %s: truncated: %zu bytes, shorter than the %d-byte header",
                        name, n, DT_TOKENS_HEADER_BYTES);
    int32_t magic = header_word(buf, 0), version = header_word(buf, 1), cnt = header_word(buf, 2);
    if (magic != DT_TOKENS_MAGIC && magic != DT_TOKENS32_MAGIC)
        return dt_error(DT_ERR_FORMAT,
                        "token file %s: bad magic %ld (want %d: llm.c's GPT-2 token file, or %d: its uint32 "
                        "Llama-3 file)",
                        name, (long)magic, DT_TOKENS_MAGIC, DT_TOKENS32_MAGIC);
    bool wide = magic == DT_TOKENS32_MAGIC;
    if (version != (wide ? DT_TOKENS32_VERSION : DT_TOKENS_VERSION))
        return dt_error(DT_ERR_FORMAT, "token file %s: bad version %ld (magic %ld wants version %d: %s tokens)", name,
                        (long)version, (long)magic, wide ? DT_TOKENS32_VERSION : DT_TOKENS_VERSION,
                        wide ? "uint32" : "uint16");
    const size_t w = wide ? 4 : 2;
    if (cnt <= 0)
        return dt_error(DT_ERR_FORMAT, "token file %s: the header says %ld tokens (need at least 1)", name,
                        (long)cnt);
    size_t have = (n - DT_TOKENS_HEADER_BYTES) / w;
    if ((size_t)cnt > have)
        return dt_error(DT_ERR_FORMAT, "token file %s: truncated: the header says %ld tokens, the file holds %zu",
                        name, (long)cnt, have);
    size_t extra = n - DT_TOKENS_HEADER_BYTES - w * (size_t)cnt;
    if (extra)
        return dt_error(DT_ERR_FORMAT, "token file %s: %zu bytes after the %ld tokens the header announces", name,
                        extra, (long)cnt);
    *count = cnt;
    *width = (int)w;
    return DT_OK;
}

static uint32_t token_at(const unsigned char *p, int width, int64_t i)
{
    if (width == 2)
        return (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
    return (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
           (uint32_t)p[4 * i + 3] << 24;
}

/* Every token < vocab (vocab > 0); *maxp1 = largest + 1. */
static dt_status check_tokens(const unsigned char *p, int width, int64_t count, const char *name, int64_t vocab,
                              int64_t *maxp1)
{
    uint32_t mx = 0;
    for (int64_t i = 0; i < count; i++) {
        uint32_t t = token_at(p, width, i);
        if (vocab > 0 && t >= (uint64_t)vocab)
            return dt_error(DT_ERR_FORMAT, "token file %s: token %u at position %lld >= vocab size %lld", name,
                            (unsigned)t, (long long)i, (long long)vocab);
        mx = t > mx ? t : mx;
    }
    *maxp1 = (int64_t)mx + 1;
    return DT_OK;
}

dt_status dt_tokens_check_mem(const void *buf, size_t n, const char *name, int64_t vocab_size, int64_t *count)
{
    if (!name)
        name = "<memory>";
    if (!buf && n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_check_mem: NULL buffer");
    if (vocab_size < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_check_mem: vocab_size %lld < 0", (long long)vocab_size);
    int64_t cnt, mx;
    int w;
    dt_status st = check_header(buf, n, name, &cnt, &w);
    if (st < 0)
        return st;
    st = check_tokens((const unsigned char *)buf + DT_TOKENS_HEADER_BYTES, w, cnt, name, vocab_size, &mx);
    if (st < 0)
        return st;
    if (count)
        *count = cnt;
    return DT_OK;
}

struct dt_tokens {
    dt__map map;
    int64_t count;
    int64_t max_plus_one;
    int width;                /* bytes per token: 2 or 4 */
    const unsigned char *tok; /* the first token */
};

dt_status dt_tokens_open(const char *path, int64_t vocab_size, dt_tokens **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_open: out is NULL");
    *out = NULL;
    if (!path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_open: path is NULL");
    if (vocab_size < 0)
        return dt_error(DT_ERR_INVALID_ARG, "token file %s: vocab size %lld < 0", path, (long long)vocab_size);
    if (!host_little_endian())
        return dt_error(DT_ERR_UNSUPPORTED, "token file %s: this host is big-endian; token files are read in "
                        "place as little-endian", path);
    dt_tokens *t = calloc(1, sizeof *t);
    if (!t)
        return dt_error(DT_ERR_NO_MEMORY, "token file %s: out of memory", path);
    dt_status st = dt__map_open(path, "token file", &t->map);
    if (st == DT_OK)
        st = check_header(t->map.data, t->map.size, path, &t->count, &t->width);
    if (st == DT_OK)
        st = check_tokens(t->map.data + DT_TOKENS_HEADER_BYTES, t->width, t->count, path, vocab_size,
                          &t->max_plus_one);
    if (st < 0) {
        dt_tokens_close(t);
        return st;
    }
    t->tok = t->map.data + DT_TOKENS_HEADER_BYTES;
    *out = t;
    return DT_OK;
}

void dt_tokens_close(dt_tokens *t)
{
    if (!t)
        return;
    dt__map_close(&t->map);
    free(t);
}

int64_t dt_tokens_count(const dt_tokens *t) { return t ? t->count : 0; }
const uint16_t *dt_tokens_data(const dt_tokens *t)
{
    return t && t->width == 2 ? (const uint16_t *)(const void *)t->tok : NULL;
}
const uint32_t *dt_tokens_data_u32(const dt_tokens *t)
{
    return t && t->width == 4 ? (const uint32_t *)(const void *)t->tok : NULL;
}
int dt_tokens_width(const dt_tokens *t) { return t ? t->width : 0; }
uint32_t dt_tokens_at(const dt_tokens *t, int64_t i)
{
    return t && i >= 0 && i < t->count ? token_at(t->tok, t->width, i) : 0;
}
int64_t dt_tokens_max_plus_one(const dt_tokens *t) { return t ? t->max_plus_one : 0; }

static dt_status write_file(const char *path, const void *tokens, int64_t n, bool wide)
{
    if (!path || (!tokens && n > 0))
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_write: NULL argument");
    if (n < 1 || n > INT32_MAX)
        return dt_error(DT_ERR_INVALID_ARG, "token file %s: %lld tokens (the format holds 1 to %ld)", path,
                        (long long)n, (long)INT32_MAX);
    if (!host_little_endian())
        return dt_error(DT_ERR_UNSUPPORTED, "token file %s: this host is big-endian", path);
    int32_t h[256] = {wide ? DT_TOKENS32_MAGIC : DT_TOKENS_MAGIC, wide ? DT_TOKENS32_VERSION : DT_TOKENS_VERSION,
                      (int32_t)n};
    dt_file *f;
    dt_status st = dt_file_open(path, 0644, &f);
    if (st < 0)
        return st;
    st = dt_file_write(f, h, sizeof h);
    if (st == DT_OK)
        st = dt_file_write(f, tokens, (size_t)n * (wide ? 4 : 2));
    if (st == DT_OK)
        st = dt_file_commit(f);
    dt_status cst = dt_file_close(f);
    return st < 0 ? st : cst;
}

dt_status dt_tokens_write(const char *path, const uint16_t *tokens, int64_t n)
{
    return write_file(path, tokens, n, false);
}

dt_status dt_tokens_write_u32(const char *path, const uint32_t *tokens, int64_t n)
{
    return write_file(path, tokens, n, true);
}

dt_status dt_tokens_unigram_xent(const dt_tokens *train, const dt_tokens *eval, int64_t vocab_size, double *nats)
{
    if (!train || !eval || !nats)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokens_unigram_xent: NULL argument");
    int64_t need = train->max_plus_one > eval->max_plus_one ? train->max_plus_one : eval->max_plus_one;
    if (vocab_size == 0)
        vocab_size = need;
    if (vocab_size < need || vocab_size > ((int64_t)1 << 32))
        return dt_error(DT_ERR_INVALID_ARG, "unigram cross-entropy: vocab size %lld, but the files hold token %lld",
                        (long long)vocab_size, (long long)need - 1);
    int64_t *cnt = calloc((size_t)vocab_size, sizeof *cnt);
    if (!cnt)
        return dt_error(DT_ERR_NO_MEMORY, "unigram cross-entropy: out of memory");
    for (int64_t i = 0; i < train->count; i++)
        cnt[token_at(train->tok, train->width, i)]++;
    double total = (double)train->count + (double)vocab_size, sum = 0;
    for (int64_t i = 0; i < eval->count; i++)
        sum -= log(((double)cnt[token_at(eval->tok, eval->width, i)] + 1.0) / total);
    free(cnt);
    *nats = sum / (double)eval->count;
    return DT_OK;
}

/* ---- the window dataset ------------------------------------------------ */

typedef struct tokset {
    dt_tokens *t;
    int64_t T, stride, n;
} tokset;

static int64_t tokset_length(void *self) { return ((tokset *)self)->n; }

static void window(const tokset *s, int64_t i, int64_t *x, int64_t *y)
{
    const dt_tokens *t = s->t;
    int64_t o = i * s->stride;
    if (t->width == 2) {
        const uint16_t *w = (const uint16_t *)(const void *)t->tok + o;
        for (int64_t k = 0; k < s->T; k++) {
            x[k] = w[k];
            y[k] = w[k + 1];
        }
        return;
    }
    const uint32_t *w = (const uint32_t *)(const void *)t->tok + o;
    for (int64_t k = 0; k < s->T; k++) {
        x[k] = w[k];
        y[k] = w[k + 1];
    }
}

static dt_status tokset_get_item(void *self, int64_t i, void *x, void *y)
{
    dt_status st = dt__map_check(&((tokset *)self)->t->map); /* truncated: an error, not SIGBUS */
    if (st < 0)
        return st;
    window(self, i, x, y);
    return DT_OK;
}

static dt_status tokset_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    tokset *s = self;
    dt_status st = dt__map_check(&s->t->map); /* truncated: an error, not SIGBUS */
    if (st < 0)
        return st;
    for (int64_t b = 0; b < n; b++)
        window(s, idx[b], (int64_t *)x + b * s->T, (int64_t *)y + b * s->T);
    return DT_OK;
}

static void tokset_free(void *self)
{
    tokset *s = self;
    if (!s)
        return;
    dt_tokens_close(s->t);
    free(s);
}

static const dt_dataset_vtable tokset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "tokens",
    .length = tokset_length,
    .get_item = tokset_get_item,
    .get_batch = tokset_get_batch,
    .free = tokset_free,
};

dt_tokens_params dt_tokens_params_default(void)
{
    return (dt_tokens_params){.seq_len = 0, .stride = 0, .vocab_size = 0, .completion_only_loss = false,
                              .assistant_only_loss = false};
}

dt_status dt_dataset_tokens_open(const char *path, const dt_tokens_params *p, dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_tokens_open: out is NULL");
    *out = NULL;
    if (!path || !p)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_tokens_open: NULL argument");
    if (p->seq_len < 1 || p->seq_len > (1 << 24) || p->stride < 0 || p->vocab_size < 0)
        return dt_error(DT_ERR_INVALID_ARG,
                        "token file %s: need 1 <= seq_len <= 2^24 (got %lld), stride >= 0 (%lld), vocab_size >= 0 "
                        "(%lld)",
                        path, (long long)p->seq_len, (long long)p->stride, (long long)p->vocab_size);
    if (p->completion_only_loss || p->assistant_only_loss)
        return dt_error(DT_ERR_INVALID_ARG,
                        p->completion_only_loss ? "token file %s: a loss on the completions only needs "
                                                  "prompt/completion data (jsonl:FILE,prompt=KEY,completion=KEY, or "
                                                  "parquet: so); a token file has no prompts"
                                                : "token file %s: a loss on the assistant's turns only needs "
                                                  "conversations (jsonl:FILE or parquet:FILE of \"messages\" lists); "
                                                  "a token file has none", path);
    tokset *s = calloc(1, sizeof *s);
    if (!s)
        return dt_error(DT_ERR_NO_MEMORY, "token file %s: out of memory", path);
    dt_status st = dt_tokens_open(path, p->vocab_size, &s->t);
    if (st < 0) {
        free(s);
        return st;
    }
    s->T = p->seq_len;
    s->stride = p->stride ? p->stride : p->seq_len;
    int64_t cnt = s->t->count;
    s->n = cnt >= s->T + 1 ? (cnt - s->T - 1) / s->stride + 1 : 0;
    dt_dataset_info info = {.x_dtype = DT_I64,
                            .x_ndim = 1,
                            .x_shape = {s->T},
                            .y_dtype = DT_I64,
                            .y_ndim = 1,
                            .y_shape = {s->T},
                            .num_classes = p->vocab_size};
    st = dt_dataset_init(&tokset_vt, s, &info, out);
    if (st < 0) {
        tokset_free(s);
        return st;
    }
    dt_dataset_set_source(*out, path);
    return DT_OK;
}
