/* safetensors: the streaming writer and the validating reader.
 *
 * Writer: the layout is fixed before any data is written (every offset is
 * in the header), so the header goes out first and each tensor's bytes are
 * pwritten at their place when the caller has them: a state dict gathered one
 * tensor at a time is written with the memory of one tensor. The order is
 * the `safetensors` package's (dtype in the format's enum order descending,
 * then name ascending; the header lists __metadata__ first, then the tensors
 * in offset order, fields dtype, shape, data_offsets; padded with spaces to a
 * multiple of 8), so files are byte-identical to its save_file. The CRC-32C
 * of the whole file (crc32c.c: the SSE4.2 instruction, ~10x zlib's CRC-32)
 * is kept per piece (header, each tensor, accumulated in write order within
 * a tensor) and combined in file order at commit (dt_crc32c_combine): no
 * second pass over the data. dt_st_checksum computes either CRC-32C or
 * zlib's CRC-32 (what checkpoints written before CRC-32C recorded).
 *
 * Reader: the header is read with pread (or from memory), parsed with cJSON
 * and validated completely before the file is handed out; data is read with
 * pread, never mmapped, so a file truncated under us gives an error, not a
 * SIGBUS. Numbers in the header must be non-negative integers below 2^53
 * (cJSON holds them as doubles; anything larger is not a real tensor).
 * Duplicate keys (which cJSON keeps) are found by sorting the names. */
#include "base/sbuf.h"
#include "ckpt/st_impl.h"
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* ---- dtypes ------------------------------------------------------------------------ */

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    [DT_ST_BOOL] = {"BOOL", 1},         [DT_ST_U8] = {"U8", 1},
    [DT_ST_I8] = {"I8", 1},             [DT_ST_F8_E5M2] = {"F8_E5M2", 1},
    [DT_ST_F8_E4M3] = {"F8_E4M3", 1},   [DT_ST_F8_E8M0] = {"F8_E8M0", 1},
    [DT_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 1}, [DT_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 1},
    [DT_ST_I16] = {"I16", 2},           [DT_ST_U16] = {"U16", 2},
    [DT_ST_F16] = {"F16", 2},           [DT_ST_BF16] = {"BF16", 2},
    [DT_ST_I32] = {"I32", 4},           [DT_ST_U32] = {"U32", 4},
    [DT_ST_F32] = {"F32", 4},           [DT_ST_C64] = {"C64", 8},
    [DT_ST_F64] = {"F64", 8},           [DT_ST_I64] = {"I64", 8},
    [DT_ST_U64] = {"U64", 8},
};
_Static_assert(sizeof st_dtypes / sizeof st_dtypes[0] == DT_ST_DTYPE_COUNT, "st_dtypes covers every dtype");

const char *dt_st_dtype_name(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_DTYPE_COUNT ? st_dtypes[t].name : "?";
}

size_t dt_st_dtype_size(dt_st_dtype t)
{
    return (unsigned)t < DT_ST_DTYPE_COUNT ? st_dtypes[t].size : 0;
}

dt_status dt_st_dtype_parse(const char *s, dt_st_dtype *out)
{
    if (!s || !out)
        return dt_error(DT_ERR_NULL, "dt_st_dtype_parse: NULL argument");
    for (int i = 0; i < DT_ST_DTYPE_COUNT; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = (dt_st_dtype)i;
            return DT_OK;
        }
    if (strcmp(s, "F4") == 0 || strcmp(s, "F6_E2M3") == 0 || strcmp(s, "F6_E3M2") == 0)
        return dt_error(DT_ERR_UNSUPPORTED, "dtype %s (sub-byte) is not supported", s);
    return dt_error(DT_ERR_FORMAT, "unknown dtype \"%s\"", s);
}

dt_st_dtype dt_st_dtype_from(dt_dtype t)
{
    switch (t) {
    case DT_F64: return DT_ST_F64;
    case DT_F16: return DT_ST_F16;
    case DT_BF16: return DT_ST_BF16;
    case DT_I32: return DT_ST_I32;
    case DT_I64: return DT_ST_I64;
    case DT_U8: return DT_ST_U8;
    case DT_F32:
    default: return DT_ST_F32;
    }
}

dt_status dt_st_dtype_to(dt_st_dtype t, dt_dtype *out)
{
    dt_dtype d;
    switch (t) {
    case DT_ST_F32: d = DT_F32; break;
    case DT_ST_F64: d = DT_F64; break;
    case DT_ST_F16: d = DT_F16; break;
    case DT_ST_BF16: d = DT_BF16; break;
    case DT_ST_I32: d = DT_I32; break;
    case DT_ST_I64: d = DT_I64; break;
    case DT_ST_U8: d = DT_U8; break;
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "safetensors dtype %s has no dtrain dtype", dt_st_dtype_name(t));
    }
    if (out)
        *out = d;
    return DT_OK;
}

/* 2^53: the largest integer a JSON number (a double in cJSON) holds exactly. */
#define ST_MAX_INT 9007199254740992.0

/* a * b into *out; false on overflow past 2^53 */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > (uint64_t)ST_MAX_INT / a)
        return false;
    *out = a * b;
    return true;
}

/* ---- the header is built in a dt__sbuf (base/sbuf.h) ---------------------------- */

static void sb_puts(dt__sbuf *b, const char *s)
{
    dt__sbuf_put(b, s, strlen(s));
}

static void sb_printf(dt__sbuf *b, const char *fmt, ...) DT_PRINTF(2, 3);
static void sb_printf(dt__sbuf *b, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0)
        dt__sbuf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* A JSON string as serde_json writes it: \" \\ \b \f \n \r \t, other
 * control characters as \u00XX, everything else (UTF-8 included) as is. */
static void sb_json_str(dt__sbuf *b, const char *s)
{
    dt__sbuf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': dt__sbuf_put(b, "\\\"", 2); break;
        case '\\': dt__sbuf_put(b, "\\\\", 2); break;
        case '\b': dt__sbuf_put(b, "\\b", 2); break;
        case '\f': dt__sbuf_put(b, "\\f", 2); break;
        case '\n': dt__sbuf_put(b, "\\n", 2); break;
        case '\r': dt__sbuf_put(b, "\\r", 2); break;
        case '\t': dt__sbuf_put(b, "\\t", 2); break;
        default:
            if (*p < 0x20)
                sb_printf(b, "\\u%04x", *p);
            else
                dt__sbuf_put(b, (const char *)p, 1);
        }
    }
    dt__sbuf_put(b, "\"", 1);
}

/* ---- writer ------------------------------------------------------------------------ */

typedef struct wtensor {
    char *name;
    dt_st_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t begin, end;   /* relative to the data start */
    uint64_t written;      /* bytes written so far */
    uint32_t crc;          /* CRC-32C of the bytes written so far */
} wtensor;

struct dt_st_writer {
    dt_file *f;
    size_t n;
    wtensor *t;           /* in the caller's order */
    size_t *order;        /* file order: order[k] = index into t */
    uint64_t data_start;  /* 8 + N */
    uint64_t size;        /* whole file */
    uint32_t head_crc;    /* CRC-32C of the first data_start bytes */
};

static int wt_cmp_name(const void *a, const void *b, void *ctx)
{
    const wtensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* The package's order: dtype descending in the format's enum order, then name. */
static int wt_cmp_layout(const void *a, const void *b, void *ctx)
{
    const wtensor *t = ctx;
    const wtensor *x = &t[*(const size_t *)a], *y = &t[*(const size_t *)b];
    if (x->dtype != y->dtype)
        return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

static bool valid_utf8(const unsigned char *s, size_t n);

dt_status dt_st_writer_open(const char *path, const dt_st_desc *desc, size_t n, const dt_st_kv *meta,
                            size_t nmeta, dt_st_writer **out)
{
    if (out)
        *out = NULL;
    if (!path || !out || (n && !desc) || (nmeta && !meta))
        return dt_error(DT_ERR_NULL, "dt_st_writer_open: NULL argument");
    dt_status st = DT_OK;
    dt__sbuf hb = {0};
    dt_st_writer *w = calloc(1, sizeof *w);
    if (!w)
        return dt_error(DT_ERR_NO_MEMORY, "dt_st_writer_open: out of memory");
    w->n = n;
    w->t = calloc(n ? n : 1, sizeof *w->t);
    w->order = calloc(n ? n : 1, sizeof *w->order);
    if (!w->t || !w->order) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_st_writer_open: out of memory");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        const dt_st_desc *d = &desc[i];
        wtensor *t = &w->t[i];
        if (!d->name || !d->name[0] || strcmp(d->name, "__metadata__") == 0 ||
            !valid_utf8((const unsigned char *)d->name, strlen(d->name))) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: tensor %zu: name \"%s\" is empty, not UTF-8 or reserved", path,
                          i, d->name ? d->name : "(null)");
            goto fail;
        }
        if ((unsigned)d->dtype >= DT_ST_DTYPE_COUNT || d->ndim < 0 || d->ndim > DT_MAX_DIMS) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': bad dtype %d or ndim %d", path, d->name,
                          (int)d->dtype, d->ndim);
            goto fail;
        }
        uint64_t bytes = dt_st_dtype_size(d->dtype);
        for (int k = 0; k < d->ndim; k++)
            if (d->shape[k] < 0 || !mul_ok(bytes, (uint64_t)d->shape[k], &bytes)) {
                st = dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': dimension %d (%lld) is negative or too large",
                              path, d->name, k, (long long)d->shape[k]);
                goto fail;
            }
        t->name = strdup(d->name);
        if (!t->name) {
            st = dt_error(DT_ERR_NO_MEMORY, "dt_st_writer_open: out of memory");
            goto fail;
        }
        t->dtype = d->dtype;
        t->ndim = d->ndim;
        memcpy(t->shape, d->shape, sizeof t->shape);
        t->end = bytes; /* the size for now; offsets below */
        w->order[i] = i;
    }
    qsort_r(w->order, n, sizeof *w->order, wt_cmp_name, w->t);
    for (size_t k = 1; k < n; k++)
        if (strcmp(w->t[w->order[k]].name, w->t[w->order[k - 1]].name) == 0) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s' is named twice", path, w->t[w->order[k]].name);
            goto fail;
        }
    qsort_r(w->order, n, sizeof *w->order, wt_cmp_layout, w->t);
    uint64_t off = 0;
    for (size_t k = 0; k < n; k++) {
        wtensor *t = &w->t[w->order[k]];
        uint64_t sz = t->end;
        t->begin = off;
        t->end = off + sz;
        off += sz;
        if (off > (uint64_t)ST_MAX_INT) {
            st = dt_error(DT_ERR_INVALID_ARG, "%s: tensors larger than 2^53 bytes in all", path);
            goto fail;
        }
    }

    /* the header */
    sb_puts(&hb, "{");
    bool first = true;
    if (nmeta) {
        sb_puts(&hb, "\"__metadata__\":{");
        for (size_t i = 0; i < nmeta; i++) {
            if (!meta[i].key || !meta[i].value) {
                st = dt_error(DT_ERR_NULL, "%s: __metadata__ entry %zu has a NULL key or value", path, i);
                goto fail;
            }
            for (size_t j = 0; j < i; j++)
                if (strcmp(meta[j].key, meta[i].key) == 0) {
                    st = dt_error(DT_ERR_INVALID_ARG, "%s: __metadata__ key \"%s\" given twice", path, meta[i].key);
                    goto fail;
                }
            if (i)
                sb_puts(&hb, ",");
            sb_json_str(&hb, meta[i].key);
            sb_puts(&hb, ":");
            sb_json_str(&hb, meta[i].value);
        }
        sb_puts(&hb, "}");
        first = false;
    }
    for (size_t k = 0; k < n; k++) {
        const wtensor *t = &w->t[w->order[k]];
        if (!first)
            sb_puts(&hb, ",");
        first = false;
        sb_json_str(&hb, t->name);
        sb_printf(&hb, ":{\"dtype\":\"%s\",\"shape\":[", dt_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            sb_printf(&hb, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        sb_printf(&hb, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin,
                  (unsigned long long)t->end);
    }
    sb_puts(&hb, "}");
    while (hb.n % 8)
        sb_puts(&hb, " ");
    if (hb.oom) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for the header", path);
        goto fail;
    }
    if (hb.n > DT_ST_MAX_HEADER) {
        st = dt_error(DT_ERR_INVALID_ARG, "%s: header of %zu bytes exceeds the format's limit of %u", path, hb.n,
                      DT_ST_MAX_HEADER);
        goto fail;
    }
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)hb.n >> (8 * i));
    w->data_start = 8 + hb.n;
    w->size = w->data_start + off;
    w->head_crc = dt_crc32c(dt_crc32c(0, len, 8), hb.p, hb.n);
    if ((st = dt_file_open(path, 0644, &w->f)) < 0)
        goto fail;
    if ((st = dt_file_write(w->f, len, 8)) < 0 || (st = dt_file_write(w->f, hb.p, hb.n)) < 0)
        goto fail;
    free(hb.p);
    *out = w;
    return DT_OK;
fail:
    free(hb.p);
    dt_st_writer_close(w);
    return st;
}

dt_status dt_st_writer_write(dt_st_writer *w, size_t i, const void *data, size_t nbytes)
{
    if (!w || (nbytes && !data))
        return dt_error(DT_ERR_NULL, "dt_st_writer_write: NULL argument");
    if (i >= w->n)
        return dt_error(DT_ERR_RANGE, "%s: tensor index %zu out of range (%zu tensors)", dt_file_path(w->f), i, w->n);
    wtensor *t = &w->t[i];
    if (nbytes > t->end - t->begin - t->written)
        return dt_error(DT_ERR_RANGE, "%s: tensor '%s': %zu more bytes would exceed its %llu (%llu written)",
                        dt_file_path(w->f), t->name, nbytes, (unsigned long long)(t->end - t->begin),
                        (unsigned long long)t->written);
    int fd = dt_file_fd(w->f);
    const uint8_t *p = data;
    uint64_t pos = w->data_start + t->begin + t->written;
    size_t left = nbytes;
    while (left) {
        size_t chunk = left < ((size_t)1 << 30) ? left : ((size_t)1 << 30);
        ssize_t k = pwrite(fd, p, chunk, (off_t)pos);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return dt_error(DT_ERR_IO, "%s: tensor '%s': write failed: %s", dt_file_path(w->f), t->name,
                            k < 0 ? strerror(errno) : "no progress");
        t->crc = dt_crc32c(t->crc, p, (size_t)k);
        p += k;
        pos += (uint64_t)k;
        left -= (size_t)k;
        t->written += (uint64_t)k;
    }
    return DT_OK;
}

dt_status dt_st_writer_commit(dt_st_writer *w, uint32_t *crc)
{
    if (!w)
        return dt_error(DT_ERR_NULL, "dt_st_writer_commit: NULL writer");
    uint32_t c = w->head_crc;
    for (size_t k = 0; k < w->n; k++) {
        const wtensor *t = &w->t[w->order[k]];
        if (t->written != t->end - t->begin)
            return dt_error(DT_ERR_STATE, "%s: tensor '%s' got %llu of its %llu bytes; nothing was committed",
                            dt_file_path(w->f), t->name, (unsigned long long)t->written,
                            (unsigned long long)(t->end - t->begin));
        c = dt_crc32c_combine(c, t->crc, t->written);
    }
    dt_status st = dt_file_commit(w->f);
    if (st < 0)
        return st;
    if (crc)
        *crc = c;
    return DT_OK;
}

uint64_t dt_st_writer_size(const dt_st_writer *w)
{
    return w ? w->size : 0;
}

void dt_st_writer_close(dt_st_writer *w)
{
    if (!w)
        return;
    dt_file_close(w->f);
    if (w->t)
        for (size_t i = 0; i < w->n; i++)
            free(w->t[i].name);
    free(w->t);
    free(w->order);
    free(w);
}

/* ---- reader ------------------------------------------------------------------------ */

struct dt_st_file {
    char *path;
    int fd;                 /* -1 for a file in memory */
    const uint8_t *mem;
    uint64_t size;
    uint64_t data_start;
    size_t n;
    dt_st_tensor *t;        /* file order */
    char **names;           /* owned names, t[i].name points here */
    size_t *by_name;        /* indices into t sorted by name */
    size_t nmeta;
    char **meta;            /* key, value, key, value ... */
};

/* RFC 3629 UTF-8: no overlongs, no surrogates, nothing past U+10FFFF. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else
            return false;
        if (n - i <= k) /* needs k continuation bytes after s[i] */
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xBF)
                return false;
        i += k + 1;
    }
    return true;
}

static dt_status read_at(const dt_st_file *f, uint64_t pos, void *dst, uint64_t n)
{
    if (pos > f->size || n > f->size - pos)
        return dt_error(DT_ERR_IO, "%s: read of %llu bytes at %llu is past the end of the file (%llu bytes)",
                        f->path, (unsigned long long)n, (unsigned long long)pos, (unsigned long long)f->size);
    if (f->fd < 0) {
        if (n)
            memcpy(dst, f->mem + pos, n);
        return DT_OK;
    }
    uint8_t *p = dst;
    while (n) {
        size_t chunk = n < ((uint64_t)1 << 30) ? (size_t)n : ((size_t)1 << 30);
        ssize_t k = pread(f->fd, p, chunk, (off_t)pos);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return dt_error(DT_ERR_IO, "%s: read failed: %s", f->path, strerror(errno));
        if (k == 0)
            return dt_error(DT_ERR_IO, "%s: the file ended at byte %llu (it shrank after it was opened?)", f->path,
                            (unsigned long long)pos);
        p += k;
        pos += (uint64_t)k;
        n -= (uint64_t)k;
    }
    return DT_OK;
}

/* A JSON number that must be an integer in [0, 2^53]. */
static bool json_uint(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= ST_MAX_INT) || v != (double)(uint64_t)v)
        return false;
    *out = (uint64_t)v;
    return true;
}

static int off_cmp(const void *a, const void *b)
{
    const dt_st_tensor *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

static int name_cmp(const void *a, const void *b, void *ctx)
{
    const dt_st_tensor *t = ctx;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* One tensor entry of the header into *t (offset/nbytes relative to the data). */
static dt_status parse_tensor(const dt_st_file *f, const cJSON *e, dt_st_tensor *t)
{
    const char *nm = e->string;
    if (!cJSON_IsObject(e))
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': not a JSON object", f->path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return dt_error(DT_ERR_FORMAT,
                        "%s: tensor '%s': needs \"dtype\" (a string), \"shape\" and \"data_offsets\" (arrays)",
                        f->path, nm);
    dt_status st = dt_st_dtype_parse(dt->valuestring, &t->dtype);
    if (st < 0)
        return dt_error_wrap(st, "%s: tensor '%s'", f->path, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > DT_MAX_DIMS)
        return dt_error(DT_ERR_UNSUPPORTED, "%s: tensor '%s' has %d dimensions; dtrain supports at most %d", f->path,
                        nm, nd, DT_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (!json_uint(x, &v) || v > INT64_MAX)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", f->path, nm, d);
        t->shape[d] = (int64_t)v;
        if (!mul_ok(numel, v, &numel))
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': shape overflows", f->path, nm);
    }
    t->numel = numel;
    if (!mul_ok(numel, dt_st_dtype_size(t->dtype), &t->nbytes))
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': byte size overflows", f->path, nm);
    uint64_t b, en;
    if (cJSON_GetArraySize(of) != 2 || !json_uint(of->child, &b) || !json_uint(of->child->next, &en))
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': data_offsets must be two non-negative integers", f->path, nm);
    if (en < b)
        return dt_error(DT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", f->path, nm,
                        (unsigned long long)b, (unsigned long long)en);
    if (en - b != t->nbytes)
        return dt_error(DT_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes, its shape and dtype %s need %llu",
                        f->path, nm, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b),
                        dt_st_dtype_name(t->dtype), (unsigned long long)t->nbytes);
    t->offset = b;
    return DT_OK;
}

static dt_status parse_meta(dt_st_file *f, const cJSON *m)
{
    if (!cJSON_IsObject(m))
        return dt_error(DT_ERR_FORMAT, "%s: __metadata__ is not a JSON object", f->path);
    size_t n = (size_t)cJSON_GetArraySize(m);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->path);
    for (const cJSON *x = m->child; x; x = x->next) {
        if (!cJSON_IsString(x))
            return dt_error(DT_ERR_FORMAT, "%s: __metadata__ \"%s\": the value is not a string", f->path, x->string);
        for (size_t i = 0; i < f->nmeta; i++)
            if (strcmp(f->meta[2 * i], x->string) == 0)
                return dt_error(DT_ERR_FORMAT, "%s: __metadata__ key \"%s\" appears twice", f->path, x->string);
        f->meta[2 * f->nmeta] = strdup(x->string);
        f->meta[2 * f->nmeta + 1] = strdup(x->valuestring);
        f->nmeta++;
        if (!f->meta[2 * f->nmeta - 2] || !f->meta[2 * f->nmeta - 1])
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->path);
    }
    return DT_OK;
}

static dt_status parse_header(dt_st_file *f)
{
    if (f->size < 8)
        return dt_error(DT_ERR_FORMAT, "%s: %llu bytes, too short for the 8-byte header size (not a safetensors file?)",
                        f->path, (unsigned long long)f->size);
    uint8_t len[8];
    dt_status st = read_at(f, 0, len, 8);
    if (st < 0)
        return st;
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++)
        hn |= (uint64_t)len[i] << (8 * i);
    if (hn > DT_ST_MAX_HEADER)
        return dt_error(DT_ERR_FORMAT, "%s: header size %llu exceeds the format's limit of %u (not a safetensors file?)",
                        f->path, (unsigned long long)hn, DT_ST_MAX_HEADER);
    if (hn > f->size - 8)
        return dt_error(DT_ERR_FORMAT, "%s: header of %llu bytes is larger than the file (%llu bytes)", f->path,
                        (unsigned long long)hn, (unsigned long long)f->size);
    if (hn < 2)
        return dt_error(DT_ERR_FORMAT, "%s: header of %llu bytes cannot hold a JSON object", f->path,
                        (unsigned long long)hn);
    f->data_start = 8 + hn;
    char *h = malloc(hn + 1);
    if (!h)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory for a %llu-byte header", f->path, (unsigned long long)hn);
    cJSON *root = NULL;
    if ((st = read_at(f, 8, h, hn)) < 0)
        goto out;
    h[hn] = 0;
    if (!valid_utf8((const unsigned char *)h, hn)) {
        st = dt_error(DT_ERR_FORMAT, "%s: the header is not valid UTF-8", f->path);
        goto out;
    }
    if (memchr(h, 0, hn)) {
        st = dt_error(DT_ERR_FORMAT, "%s: the header contains a NUL byte", f->path);
        goto out;
    }
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(h, hn, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = at && at >= h && at <= h + hn ? (size_t)(at - h) : 0;
        st = dt_error(DT_ERR_FORMAT, "%s: the header is not valid JSON (near byte %zu of %llu)", f->path, pos,
                      (unsigned long long)hn);
        goto out;
    }
    for (const char *p = end ? end : h + hn; p < h + hn; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = dt_error(DT_ERR_FORMAT, "%s: bytes after the header's JSON object (at byte %zu)", f->path,
                          (size_t)(p - h));
            goto out;
        }
    if (!cJSON_IsObject(root)) {
        st = dt_error(DT_ERR_FORMAT, "%s: the header is not a JSON object", f->path);
        goto out;
    }
    size_t cnt = (size_t)cJSON_GetArraySize(root);
    f->t = calloc(cnt ? cnt : 1, sizeof *f->t);
    f->names = calloc(cnt ? cnt : 1, sizeof *f->names);
    f->by_name = calloc(cnt ? cnt : 1, sizeof *f->by_name);
    if (!f->t || !f->names || !f->by_name) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->path);
        goto out;
    }
    bool have_meta = false;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (have_meta) {
                st = dt_error(DT_ERR_FORMAT, "%s: __metadata__ appears twice", f->path);
                goto out;
            }
            have_meta = true;
            if ((st = parse_meta(f, e)) < 0)
                goto out;
            continue;
        }
        dt_st_tensor *t = &f->t[f->n];
        if ((st = parse_tensor(f, e, t)) < 0)
            goto out;
        if (!(f->names[f->n] = strdup(e->string))) {
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->path);
            goto out;
        }
        f->n++;
    }
    /* sort by offset (names follow their tensors: point them after sorting) */
    for (size_t i = 0; i < f->n; i++)
        f->t[i].name = f->names[i];
    qsort(f->t, f->n, sizeof *f->t, off_cmp);
    for (size_t i = 0; i < f->n; i++)
        f->by_name[i] = i;
    qsort_r(f->by_name, f->n, sizeof *f->by_name, name_cmp, f->t);
    for (size_t i = 1; i < f->n; i++)
        if (strcmp(f->t[f->by_name[i]].name, f->t[f->by_name[i - 1]].name) == 0) {
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", f->path,
                          f->t[f->by_name[i]].name);
            goto out;
        }
    uint64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        dt_st_tensor *t = &f->t[i];
        if (t->offset != pos) {
            if (t->offset > pos)
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' begins at data byte %llu, leaving a gap after byte %llu",
                              f->path, t->name, (unsigned long long)t->offset, (unsigned long long)pos);
            else
                st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' at data bytes [%llu, %llu) overlaps '%s'", f->path,
                              t->name, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
                              f->t[i - 1].name);
            goto out;
        }
        pos += t->nbytes;
    }
    if (pos != f->size - f->data_start) {
        if (pos > f->size - f->data_start)
            st = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' ends at data byte %llu, past the end of the file (%llu data bytes)",
                          f->path, f->t[f->n - 1].name, (unsigned long long)pos,
                          (unsigned long long)(f->size - f->data_start));
        else
            st = dt_error(DT_ERR_FORMAT, "%s: %llu bytes after the last tensor (the data is %llu bytes, the tensors %llu)",
                          f->path, (unsigned long long)(f->size - f->data_start - pos),
                          (unsigned long long)(f->size - f->data_start), (unsigned long long)pos);
        goto out;
    }
    for (size_t i = 0; i < f->n; i++)
        f->t[i].offset += f->data_start;
    st = DT_OK;
out:
    cJSON_Delete(root);
    free(h);
    return st;
}

static dt_status open_common(dt_st_file *f, dt_st_file **out)
{
    dt_status st = parse_header(f);
    if (st < 0) {
        dt_st_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

dt_status dt_st_open(const char *path, dt_st_file **out)
{
    if (out)
        *out = NULL;
    if (!path || !out)
        return dt_error(DT_ERR_NULL, "dt_st_open: NULL argument");
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dt_error(DT_ERR_NO_MEMORY, "dt_st_open: out of memory");
    }
    f->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f->fd < 0) {
        dt_status st = dt_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "cannot open %s: %s", path,
                                strerror(errno));
        dt_st_close(f);
        return st;
    }
    /* checkpoints are read front to back: a larger readahead window */
    (void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    struct stat sb;
    if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        dt_status st = dt_error(DT_ERR_FORMAT, "%s: not a regular file", path);
        dt_st_close(f);
        return st;
    }
    f->size = (uint64_t)sb.st_size;
    return open_common(f, out);
}

dt_status dt_st_open_mem(const void *data, size_t size, const char *name, dt_st_file **out)
{
    if (out)
        *out = NULL;
    if ((!data && size) || !out)
        return dt_error(DT_ERR_NULL, "dt_st_open_mem: NULL argument");
    dt_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "(memory)"))) {
        free(f);
        return dt_error(DT_ERR_NO_MEMORY, "dt_st_open_mem: out of memory");
    }
    f->fd = -1;
    f->mem = data;
    f->size = size;
    return open_common(f, out);
}

void dt_st_close(dt_st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    if (f->names)
        for (size_t i = 0; i < f->n; i++)
            free(f->names[i]);
    if (f->meta)
        for (size_t i = 0; i < 2 * f->nmeta; i++)
            free(f->meta[i]);
    free(f->names);
    free(f->meta);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

size_t dt_st_count(const dt_st_file *f)
{
    return f ? f->n : 0;
}

const dt_st_tensor *dt_st_tensor_at(const dt_st_file *f, size_t i)
{
    return f && i < f->n ? &f->t[i] : NULL;
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0)
            return &f->t[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

dt_status dt_st_read(const dt_st_file *f, const dt_st_tensor *t, uint64_t off, uint64_t nbytes, void *dst)
{
    if (!f || !t || (nbytes && !dst))
        return dt_error(DT_ERR_NULL, "dt_st_read: NULL argument");
    if (t < f->t || t >= f->t + f->n)
        return dt_error(DT_ERR_INVALID_ARG, "%s: dt_st_read: the tensor is not one of this file's", f->path);
    if (off > t->nbytes || nbytes > t->nbytes - off)
        return dt_error(DT_ERR_RANGE, "%s: tensor '%s': bytes [%llu, +%llu) are beyond its %llu", f->path, t->name,
                        (unsigned long long)off, (unsigned long long)nbytes, (unsigned long long)t->nbytes);
    return read_at(f, t->offset + off, dst, nbytes);
}

const char *dt_st_meta(const dt_st_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}

size_t dt_st_meta_count(const dt_st_file *f)
{
    return f ? f->nmeta : 0;
}

dt_status dt_st_meta_at(const dt_st_file *f, size_t i, const char **key, const char **value)
{
    if (!f)
        return dt_error(DT_ERR_NULL, "dt_st_meta_at: NULL file");
    if (i >= f->nmeta)
        return dt_error(DT_ERR_RANGE, "%s: metadata entry %zu of %zu", f->path, i, f->nmeta);
    if (key)
        *key = f->meta[2 * i];
    if (value)
        *value = f->meta[2 * i + 1];
    return DT_OK;
}

const char *dt_st_path(const dt_st_file *f)
{
    return f ? f->path : "";
}

uint64_t dt_st_file_size(const dt_st_file *f)
{
    return f ? f->size : 0;
}

const char *dt_ckpt_sum_name(dt_ckpt_sum kind)
{
    switch (kind) {
    case DT_SUM_CRC32: return "crc32";
    case DT_SUM_CRC32C: return "crc32c";
    }
    return "?";
}

uint32_t dt_ckpt_sum_update(dt_ckpt_sum kind, uint32_t crc, const void *data, size_t n)
{
    if (kind == DT_SUM_CRC32C)
        return dt_crc32c(crc, data, n);
    const uint8_t *p = data;
    uLong c = crc;
    while (n) {
        uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
        c = crc32(c, p, k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

dt_status dt__st_pread(const dt_st_file *f, uint64_t pos, void *dst, uint64_t n)
{
    return read_at(f, pos, dst, n);
}

void dt__st_prefetch(const dt_st_file *f, uint64_t pos, uint64_t n)
{
    if (f->fd >= 0 && pos < f->size && n)
        (void)posix_fadvise(f->fd, (off_t)pos, (off_t)(n < f->size - pos ? n : f->size - pos), POSIX_FADV_WILLNEED);
}

dt_status dt__st_sum_range(const dt_st_file *f, dt_ckpt_sum kind, uint64_t pos, uint64_t end, uint32_t *crc)
{
    if (pos > end || end > f->size)
        return dt_error(DT_ERR_IO, "%s: bytes [%llu, %llu) are beyond the file (%llu bytes)", f->path,
                        (unsigned long long)pos, (unsigned long long)end, (unsigned long long)f->size);
    uint32_t c = *crc;
    if (pos == end)
        return DT_OK;
    if (f->fd < 0) {
        *crc = dt_ckpt_sum_update(kind, c, f->mem + pos, (size_t)(end - pos));
        return DT_OK;
    }
    /* 1 MiB reads: each is checksummed while it is still in the cache */
    size_t cap = (size_t)1 << 20;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->path);
    dt_status st = DT_OK;
    while (pos < end) {
        uint64_t k = end - pos < cap ? end - pos : cap;
        if ((st = read_at(f, pos, buf, k)) < 0)
            break;
        if (pos + k < end) /* the disk reads the next piece while this one is summed */
            dt__st_prefetch(f, pos + k, end - pos - k < cap ? end - pos - k : cap);
        c = dt_ckpt_sum_update(kind, c, buf, (size_t)k);
        pos += k;
    }
    free(buf);
    if (st == DT_OK)
        *crc = c;
    return st;
}

dt_status dt_st_checksum(const dt_st_file *f, dt_ckpt_sum kind, uint32_t *crc)
{
    if (!f || !crc)
        return dt_error(DT_ERR_NULL, "dt_st_checksum: NULL argument");
    if (kind != DT_SUM_CRC32 && kind != DT_SUM_CRC32C)
        return dt_error(DT_ERR_INVALID_ARG, "dt_st_checksum: unknown checksum kind %d", (int)kind);
    uint32_t c = 0;
    dt_status st = dt__st_sum_range(f, kind, 0, f->size, &c);
    if (st == DT_OK)
        *crc = c;
    return st;
}
