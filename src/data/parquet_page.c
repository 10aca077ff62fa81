/* A Parquet column chunk's values one at a time (parquet_impl.h: pq_col).
 *
 * A chunk is a dictionary page (optional, first) and data pages. A page is
 * decompressed whole into a buffer the column keeps (an uncompressed page
 * is used where it lies); its levels and values are then decoded lazily, a
 * triple at a time, so memory is one page a column whatever the page's
 * value count. Levels are the RLE / bit-packed hybrid (v1: each section
 * prefixed by its 4-byte length; v2: lengths in the header, never
 * compressed). Values: PLAIN; dictionary indices (a bit width byte, then
 * the hybrid) into the dictionary page's PLAIN values; RLE booleans (a
 * 4-byte length, then the hybrid at width 1); DELTA_BINARY_PACKED (a
 * header: block size, miniblocks a block, value count, first value; then
 * blocks of min delta, one bit width a miniblock and the miniblocks, the
 * last block's unused miniblocks absent), and the two byte-array deltas
 * built on it (lengths then bytes; prefix lengths then suffixes). Delta
 * arithmetic wraps in the column's width. Every count and length is
 * checked against the bytes left; a value the levels promise but the page
 * does not hold is an error, never a read past the buffer. */
#include "parquet_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#if DT_HAVE_ZSTD
#include <zstd.h>
#include <zstd_errors.h>
#endif

/* The RLE / bit-packed hybrid, read a value at a time. */
typedef struct rle {
    const uint8_t *p, *end;
    int bw;
    uint64_t left; /* values left in the current run */
    bool packed;
    uint64_t val;
    const uint8_t *bits;
    uint64_t bitpos, nbits;
} rle;

/* DELTA_BINARY_PACKED, a value at a time. */
typedef struct dbp {
    const uint8_t *p, *end; /* p: past the current miniblock (or the header, the widths) */
    uint64_t per_mini, nmini, left, last, min_delta;
    const uint8_t *widths, *mini;
    uint64_t mini_idx, in_mini;
    int bw;
    bool first, w32, in_block;
} dbp;

struct pq_col {
    int32_t type;
    int max_rep, max_def, rep_bw, def_bw;
    char *name, *path;
    int64_t group, page, taken, values_left;
    const pq_chunk *cm;
    const uint8_t *chunk;
    size_t chunk_n, pos;
    /* the dictionary: n entries; byte arrays as (offset, length) into dict_buf, others as 8-byte values */
    uint8_t *dict_buf;
    uint32_t *dict_off;
    uint32_t *dict_len;
    int64_t dict_n;
    bool have_dict;
    /* the page */
    uint8_t *buf;
    size_t buf_cap;
    int64_t page_left; /* triples left in the page */
    rle reps, defs;
    int enc;
    const uint8_t *v, *vend; /* PLAIN values, or the bytes of the byte-array deltas */
    rle idx;                 /* dictionary indices, RLE booleans */
    uint64_t bitpos;         /* PLAIN booleans */
    dbp d1, d2;              /* deltas: values or lengths (d1), prefix lengths (d2) */
    uint8_t *prev;           /* DELTA_BYTE_ARRAY: the previous value */
    size_t prev_n, prev_cap;
    /* the next triple's levels, once peeked */
    bool peeked;
    int next_rep, next_def;
};

static const char *codec_name(int c)
{
    static const char *const n[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO", "BROTLI", "LZ4", "ZSTD", "LZ4_RAW"};
    return c >= 0 && c < 8 ? n[c] : "an unknown codec";
}

static const char *enc_name(int e)
{
    static const char *const n[] = {"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
                                    "DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
                                    "RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
    return e >= 0 && e < 10 ? n[e] : "an unknown encoding";
}

/* An error in the current page of c. */
#define PERR(c, code, ...) page_err(c, code, __VA_ARGS__)
static dt_status page_err(const pq_col *c, dt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static dt_status page_err(const pq_col *c, dt_status code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_error(code, "parquet %s: row group %lld, column \"%s\", page %lld: %s", c->name, (long long)c->group,
                    c->path, (long long)c->page, msg);
}

static int bit_width(uint64_t max)
{
    int w = 0;
    while (max) {
        w++;
        max >>= 1;
    }
    return w;
}

/* bw (<= 64) bits at bit offset off of b, least significant first. */
static uint64_t read_bits(const uint8_t *b, uint64_t off, int bw)
{
    uint64_t v = 0;
    for (int i = 0; i < bw;) {
        uint64_t at = off + (uint64_t)i;
        int sh = (int)(at & 7), take = 8 - sh < bw - i ? 8 - sh : bw - i;
        v |= (uint64_t)((b[at >> 3] >> sh) & ((1u << take) - 1)) << i;
        i += take;
    }
    return v;
}

static bool uleb(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int s = 0; s < 64; s += 7) {
        if (*p >= end)
            return false;
        uint8_t b = *(*p)++;
        if (s == 63 && b > 1)
            return false;
        x |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

static void rle_init(rle *r, const uint8_t *p, const uint8_t *end, int bw)
{
    *r = (rle){.p = p, .end = end, .bw = bw};
}

/* The next value, or false with *why. */
static bool rle_next(rle *r, uint64_t *v, const char **why)
{
    while (!r->left) {
        uint64_t h;
        if (r->p >= r->end || !uleb(&r->p, r->end, &h)) {
            *why = "the run-length data ends before its values";
            return false;
        }
        if (h & 1) {
            uint64_t groups = h >> 1, bytes = groups * (uint64_t)r->bw, avail = (uint64_t)(r->end - r->p);
            if (groups > ((uint64_t)1 << 40)) {
                *why = "a bit-packed run of an impossible length";
                return false;
            }
            r->packed = true;
            r->bits = r->p;
            r->bitpos = 0;
            r->nbits = (bytes < avail ? bytes : avail) * 8;
            r->p += bytes < avail ? bytes : avail;
            r->left = groups * 8;
        } else {
            int nb = (r->bw + 7) / 8;
            if (r->end - r->p < nb) {
                *why = "the run-length data ends inside a run's value";
                return false;
            }
            uint64_t x = 0;
            for (int i = 0; i < nb; i++)
                x |= (uint64_t)r->p[i] << (8 * i);
            r->p += nb;
            r->packed = false;
            r->val = x;
            r->left = h >> 1;
        }
    }
    if (r->packed) {
        if (r->bitpos + (uint64_t)r->bw > r->nbits) {
            *why = "a bit-packed run ends before its values";
            return false;
        }
        *v = r->bw ? read_bits(r->bits, r->bitpos, r->bw) : 0;
        r->bitpos += (uint64_t)r->bw;
    } else {
        *v = r->val;
    }
    r->left--;
    return true;
}

/* ---- DELTA_BINARY_PACKED ----------------------------------------------------------------------------------------- */

static bool dbp_init(dbp *d, const uint8_t *p, const uint8_t *end, bool w32, uint64_t max_values, const char **why)
{
    uint64_t block, nmini, total, zz;
    *d = (dbp){.end = end, .w32 = w32};
    if (!uleb(&p, end, &block) || !uleb(&p, end, &nmini) || !uleb(&p, end, &total) || !uleb(&p, end, &zz)) {
        *why = "a delta header cut short";
        return false;
    }
    if (!block || block % 128 || block > (1u << 20) || !nmini || block % nmini || (block / nmini) % 32) {
        *why = "a delta header with an invalid block size or miniblock count";
        return false;
    }
    if (total > max_values) {
        *why = "a delta header with more values than the page";
        return false;
    }
    d->p = p;
    d->per_mini = block / nmini;
    d->nmini = nmini;
    d->left = total;
    d->last = (zz >> 1) ^ -(zz & 1);
    d->first = total > 0;
    return true;
}

static bool dbp_next(dbp *d, uint64_t *v, const char **why)
{
    if (!d->left) {
        *why = "delta-encoded values end before the levels' values";
        return false;
    }
    d->left--;
    if (d->first) {
        d->first = false;
        *v = d->last;
        return true;
    }
    if (!d->in_block || d->in_mini == d->per_mini) {
        if (d->in_block && d->mini_idx + 1 < d->nmini) {
            d->mini_idx++;
        } else { /* a new block: its min delta, one width a miniblock */
            uint64_t zz;
            if (!uleb(&d->p, d->end, &zz) || (uint64_t)(d->end - d->p) < d->nmini) {
                *why = "a delta block header cut short";
                return false;
            }
            d->min_delta = (zz >> 1) ^ -(zz & 1);
            d->widths = d->p;
            d->p += d->nmini;
            d->mini_idx = 0;
            d->in_block = true;
        }
        d->bw = d->widths[d->mini_idx];
        uint64_t bytes = d->per_mini * (uint64_t)d->bw / 8;
        if (d->bw > (d->w32 ? 32 : 64) || bytes > (uint64_t)(d->end - d->p)) {
            *why = d->bw > (d->w32 ? 32 : 64) ? "a delta miniblock's bit width is too large"
                                               : "a delta miniblock cut short";
            return false;
        }
        d->mini = d->p;
        d->p += bytes;
        d->in_mini = 0;
    }
    uint64_t delta = d->bw ? read_bits(d->mini, d->in_mini * (uint64_t)d->bw, d->bw) : 0;
    d->in_mini++;
    uint64_t x = d->last + d->min_delta + delta;
    if (d->w32)
        x = (uint64_t)(int64_t)(int32_t)(uint32_t)x;
    d->last = x;
    *v = x;
    return true;
}

/* Where a delta stream ends (its values all read on a copy). */
static bool dbp_end(const dbp *d, const uint8_t **end, const char **why)
{
    dbp c = *d;
    uint64_t v;
    while (c.left)
        if (!dbp_next(&c, &v, why))
            return false;
    *end = c.p;
    return true;
}

/* ---- codecs ------------------------------------------------------------------------------------------------------ */

/* Raw snappy (no framing): a varint length, then literals and copies. */
static bool unsnappy(const uint8_t *s, size_t n, uint8_t *out, size_t want, const char **why)
{
    const uint8_t *p = s, *end = s + n;
    uint64_t len;
    if (!uleb(&p, end, &len) || len != want) {
        *why = "its snappy stream says another decompressed size than the page header";
        return false;
    }
    size_t o = 0;
    while (p < end) {
        uint8_t tag = *p++;
        uint64_t l, off = 0;
        if ((tag & 3) == 0) {
            l = (tag >> 2) + 1u;
            if (l > 60) {
                unsigned nb = (unsigned)l - 60;
                if ((size_t)(end - p) < nb) {
                    *why = "a snappy literal's length is cut short";
                    return false;
                }
                l = 0;
                for (unsigned i = 0; i < nb; i++)
                    l |= (uint64_t)p[i] << (8 * i);
                l++;
                p += nb;
            }
            if (l > (uint64_t)(end - p) || l > want - o) {
                *why = l > (uint64_t)(end - p) ? "a snappy literal runs past the page"
                                                : "snappy data decompresses to more than the page header says";
                return false;
            }
            memcpy(out + o, p, l);
            o += l;
            p += l;
            continue;
        }
        int nb = (tag & 3) == 1 ? 1 : (tag & 3) == 2 ? 2 : 4;
        if (end - p < nb) {
            *why = "a snappy copy is cut short";
            return false;
        }
        if ((tag & 3) == 1) {
            l = ((tag >> 2) & 7) + 4u;
            off = ((uint64_t)(tag >> 5) << 8) | p[0];
        } else {
            l = (tag >> 2) + 1u;
            for (int i = 0; i < nb; i++)
                off |= (uint64_t)p[i] << (8 * i);
        }
        p += nb;
        if (!off || off > o || l > want - o) {
            *why = !off || off > o ? "a snappy copy reaches before the start of the data"
                                   : "snappy data decompresses to more than the page header says";
            return false;
        }
        for (uint64_t i = 0; i < l; i++, o++)
            out[o] = out[o - off];
    }
    if (o != want) {
        *why = "snappy data decompresses to fewer bytes than the page header says";
        return false;
    }
    return true;
}

static bool ungzip(const uint8_t *s, size_t n, uint8_t *out, size_t want, const char **why)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 15 + 16) != Z_OK) {
        *why = "zlib could not start";
        return false;
    }
    z.next_in = (Bytef *)s;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)want;
    int r;
    for (;;) {
        r = inflate(&z, Z_FINISH);
        if (r == Z_STREAM_END && z.avail_in > 0 && z.avail_out > 0 && inflateReset(&z) == Z_OK)
            continue; /* another gzip member */
        break;
    }
    bool ok = r == Z_STREAM_END && z.total_out == want && z.avail_in == 0;
    *why = r == Z_STREAM_END && z.avail_in ? "gzip data decompresses to more than the page header says"
           : r == Z_STREAM_END             ? "gzip data decompresses to fewer bytes than the page header says"
           : r == Z_BUF_ERROR && !z.avail_out ? "gzip data decompresses to more than the page header says"
                                              : "corrupt gzip data";
    inflateEnd(&z);
    return ok;
}

/* Decompress src[0, n) into c->buf, exactly want bytes (the page header's). */
static dt_status decompress(pq_col *c, const uint8_t *src, size_t n, size_t want, const uint8_t **out)
{
    int codec = c->cm->codec;
    if (codec == PQ_UNCOMPRESSED) {
        if (n != want)
            return PERR(c, DT_ERR_FORMAT, "uncompressed, yet its header says %zu bytes compressed and %zu not", n,
                        want);
        *out = src;
        return DT_OK;
    }
    if (codec != PQ_SNAPPY && codec != PQ_GZIP && codec != PQ_ZSTD)
        return PERR(c, DT_ERR_UNSUPPORTED, "compressed with %s, which dtrain does not read (UNCOMPRESSED, SNAPPY, "
                    "GZIP and ZSTD are read; pyarrow writes those with compression=...)", codec_name(codec));
#if !DT_HAVE_ZSTD
    if (codec == PQ_ZSTD)
        return PERR(c, DT_ERR_UNSUPPORTED, "compressed with ZSTD, and this build of dtrain lacks zstd (build it "
                    "with libzstd-dev installed: scripts/deps.sh)");
#endif
    if ((int64_t)want > PQ_MAX_PAGE)
        return PERR(c, DT_ERR_FORMAT, "a decompressed size of %zu bytes, past the limit of %lld", want,
                    (long long)PQ_MAX_PAGE);
    if ((codec == PQ_SNAPPY && want / 24 > n + 1) || (codec == PQ_GZIP && want / 1040 > n + 1))
        return PERR(c, DT_ERR_FORMAT, "%zu compressed bytes cannot hold the %zu its header says (%s)", n, want,
                    codec_name(codec));
    if (want + 1 > c->buf_cap) {
        uint8_t *b = realloc(c->buf, want + 1);
        if (!b)
            return PERR(c, DT_ERR_NO_MEMORY, "out of memory (%zu bytes)", want);
        c->buf = b;
        c->buf_cap = want + 1;
    }
    const char *why = NULL;
    bool ok = true;
    if (codec == PQ_SNAPPY) {
        ok = unsnappy(src, n, c->buf, want, &why);
    } else if (codec == PQ_GZIP) {
        ok = ungzip(src, n, c->buf, want, &why);
    } else {
#if DT_HAVE_ZSTD
        size_t r = ZSTD_decompress(c->buf, want, src, n);
        ok = !ZSTD_isError(r) && r == want;
        why = !ZSTD_isError(r)                                  ? "zstd data decompresses to fewer bytes than the "
                                                                  "page header says"
              : ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? "zstd data decompresses to more than the page "
                                                                      "header says"
                                                                    : ZSTD_getErrorName(r);
#endif
    }
    if (!ok)
        return PERR(c, DT_ERR_FORMAT, "%s", why);
    *out = c->buf;
    return DT_OK;
}

/* ---- the column -------------------------------------------------------------------------------------------------- */

pq_col *dt__pq_col_new(int32_t type, int max_rep, int max_def, const char *name, const char *path)
{
    pq_col *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->type = type;
    c->max_rep = max_rep;
    c->max_def = max_def;
    c->rep_bw = bit_width((uint64_t)max_rep);
    c->def_bw = bit_width((uint64_t)max_def);
    c->name = strdup(name);
    c->path = strdup(path);
    if (!c->name || !c->path) {
        dt__pq_col_free(c);
        return NULL;
    }
    return c;
}

static void drop_dict(pq_col *c)
{
    free(c->dict_buf);
    free(c->dict_off);
    free(c->dict_len);
    c->dict_buf = NULL;
    c->dict_off = NULL;
    c->dict_len = NULL;
    c->dict_n = 0;
    c->have_dict = false;
}

void dt__pq_col_free(pq_col *c)
{
    if (!c)
        return;
    drop_dict(c);
    free(c->buf);
    free(c->prev);
    free(c->name);
    free(c->path);
    free(c);
}

void dt__pq_col_start(pq_col *c, int64_t g, const pq_chunk *cm, const uint8_t *chunk, size_t n)
{
    drop_dict(c);
    c->group = g;
    c->cm = cm;
    c->chunk = chunk;
    c->chunk_n = n;
    c->pos = 0;
    c->page = -1;
    c->taken = 0;
    c->values_left = cm->num_values;
    c->page_left = 0;
    c->peeked = false;
    c->prev_n = 0;
}

int64_t dt__pq_col_taken(const pq_col *c) { return c->taken; }

static size_t type_width(int32_t type)
{
    return type == PQ_INT32 || type == PQ_FLOAT ? 4 : type == PQ_INT64 || type == PQ_DOUBLE ? 8 : 0;
}

/* The dictionary page's PLAIN values, kept for the chunk. */
static dt_status load_dict(pq_col *c, const pq_page_hdr *h, const uint8_t *d, size_t n)
{
    if (c->have_dict)
        return PERR(c, DT_ERR_FORMAT, "a second dictionary page in one column chunk");
    if (h->encoding != PQ_PLAIN && h->encoding != PQ_PLAIN_DICT)
        return PERR(c, DT_ERR_UNSUPPORTED, "a dictionary page encoded %s (PLAIN is read)", enc_name(h->encoding));
    if (c->type != PQ_BYTE_ARRAY && !type_width(c->type))
        return PERR(c, DT_ERR_FORMAT, "a dictionary page for a column of this type");
    int64_t cnt = h->num_values;
    size_t w = type_width(c->type);
    if ((w && (uint64_t)cnt * w != n) || (!w && (uint64_t)cnt > n / 4))
        return PERR(c, DT_ERR_FORMAT, "a dictionary of %lld values in %zu bytes", (long long)cnt, n);
    c->dict_buf = malloc(n ? n : 1);
    c->dict_off = calloc((size_t)cnt + 1, sizeof *c->dict_off);
    c->dict_len = w ? NULL : calloc((size_t)cnt + 1, sizeof *c->dict_len);
    if (!c->dict_buf || !c->dict_off || (!w && !c->dict_len)) {
        drop_dict(c);
        return PERR(c, DT_ERR_NO_MEMORY, "out of memory (a dictionary of %lld values)", (long long)cnt);
    }
    if (n)
        memcpy(c->dict_buf, d, n);
    size_t at = 0;
    for (int64_t i = 0; i < cnt; i++) {
        if (w) {
            c->dict_off[i] = (uint32_t)at;
            at += w;
            continue;
        }
        if (n - at < 4)
            break;
        uint32_t l = (uint32_t)d[at] | (uint32_t)d[at + 1] << 8 | (uint32_t)d[at + 2] << 16 |
                     (uint32_t)d[at + 3] << 24;
        at += 4;
        if (l > n - at) {
            drop_dict(c);
            return PERR(c, DT_ERR_FORMAT, "dictionary value %lld runs past the page", (long long)i);
        }
        c->dict_off[i] = (uint32_t)at;
        c->dict_len[i] = l;
        at += l;
    }
    if (!w && at != n) {
        drop_dict(c);
        return PERR(c, DT_ERR_FORMAT, "a dictionary of %lld values does not fill its %zu bytes", (long long)cnt, n);
    }
    c->dict_n = cnt;
    c->have_dict = true;
    return DT_OK;
}

/* A v1 level section: a 4-byte length, then the hybrid. */
static dt_status levels_v1(pq_col *c, int enc, int bw, const uint8_t **p, const uint8_t *end, rle *r)
{
    if (enc == PQ_BIT_PACKED)
        return PERR(c, DT_ERR_UNSUPPORTED, "levels encoded BIT_PACKED (deprecated; RLE is read)");
    if (enc != PQ_RLE)
        return PERR(c, DT_ERR_FORMAT, "levels encoded %s", enc_name(enc));
    if (end - *p < 4)
        return PERR(c, DT_ERR_FORMAT, "the levels' length is cut short");
    uint32_t n = (uint32_t)(*p)[0] | (uint32_t)(*p)[1] << 8 | (uint32_t)(*p)[2] << 16 | (uint32_t)(*p)[3] << 24;
    *p += 4;
    if (n > (uint64_t)(end - *p))
        return PERR(c, DT_ERR_FORMAT, "levels of %u bytes run past the page", n);
    rle_init(r, *p, *p + n, bw);
    *p += n;
    return DT_OK;
}

/* Set up the values' decoder at v[0, n) for encoding enc and at most max values. */
static dt_status values_init(pq_col *c, int enc, const uint8_t *v, const uint8_t *end, uint64_t max)
{
    const char *why = NULL;
    c->enc = enc;
    c->v = v;
    c->vend = end;
    c->bitpos = 0;
    switch (enc) {
    case PQ_PLAIN:
        if (c->type == PQ_INT96 || c->type == PQ_FIXED)
            return PERR(c, DT_ERR_UNSUPPORTED, "values of a type dtrain does not read");
        return DT_OK;
    case PQ_PLAIN_DICT:
    case PQ_RLE_DICT:
        if (!c->have_dict)
            return PERR(c, DT_ERR_FORMAT, "dictionary-encoded values without a dictionary page");
        if (v >= end) {
            if (max) /* a page of nulls only may hold no values at all */
                return PERR(c, DT_ERR_FORMAT, "dictionary indices without their bit width");
            rle_init(&c->idx, v, end, 0);
            return DT_OK;
        }
        if (*v > 32)
            return PERR(c, DT_ERR_FORMAT, "dictionary indices of bit width %d", *v);
        rle_init(&c->idx, v + 1, end, *v);
        return DT_OK;
    case PQ_RLE:
        if (c->type != PQ_BOOLEAN)
            return PERR(c, DT_ERR_UNSUPPORTED, "RLE values of a column that is not BOOLEAN");
        if (end - v < 4)
            return PERR(c, DT_ERR_FORMAT, "RLE booleans without their length");
        uint32_t n = (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24;
        if (n > (uint64_t)(end - v - 4))
            return PERR(c, DT_ERR_FORMAT, "RLE booleans of %u bytes run past the page", n);
        rle_init(&c->idx, v + 4, v + 4 + n, 1);
        return DT_OK;
    case PQ_DELTA_BP:
        if (c->type != PQ_INT32 && c->type != PQ_INT64)
            return PERR(c, DT_ERR_FORMAT, "DELTA_BINARY_PACKED values of a column that is not INT32 or INT64");
        if (!dbp_init(&c->d1, v, end, c->type == PQ_INT32, max, &why))
            return PERR(c, DT_ERR_FORMAT, "%s", why);
        return DT_OK;
    case PQ_DELTA_LBA:
    case PQ_DELTA_BA: {
        if (c->type != PQ_BYTE_ARRAY)
            return PERR(c, DT_ERR_FORMAT, "%s values of a column that is not BYTE_ARRAY", enc_name(enc));
        const uint8_t *at = v;
        if (enc == PQ_DELTA_BA) { /* prefix lengths, then the suffixes as DELTA_LENGTH_BYTE_ARRAY */
            if (!dbp_init(&c->d2, v, end, true, max, &why) || !dbp_end(&c->d2, &at, &why))
                return PERR(c, DT_ERR_FORMAT, "%s", why);
        }
        if (!dbp_init(&c->d1, at, end, true, max, &why) || !dbp_end(&c->d1, &c->v, &why))
            return PERR(c, DT_ERR_FORMAT, "%s", why);
        if (enc == PQ_DELTA_BA && c->d1.left != c->d2.left)
            return PERR(c, DT_ERR_FORMAT, "DELTA_BYTE_ARRAY with %llu prefixes and %llu suffixes",
                        (unsigned long long)c->d2.left, (unsigned long long)c->d1.left);
        c->prev_n = 0;
        return DT_OK;
    }
    case PQ_BSS:
        return PERR(c, DT_ERR_UNSUPPORTED, "values encoded BYTE_STREAM_SPLIT, which dtrain does not read");
    default:
        return PERR(c, DT_ERR_UNSUPPORTED, "values encoded %s, which dtrain does not read", enc_name(enc));
    }
}

/* The next page with values (a dictionary page is kept on the way, index pages skipped). */
static dt_status next_page(pq_col *c)
{
    for (;;) {
        c->page++;
        if (c->pos >= c->chunk_n)
            return PERR(c, DT_ERR_FORMAT, "the column chunk ends with %lld of its values still to come",
                        (long long)c->values_left);
        pq_page_hdr h;
        size_t used;
        const char *why;
        if (!dt__pq_page_hdr(c->chunk + c->pos, c->chunk_n - c->pos, &h, &used, &why))
            return PERR(c, DT_ERR_FORMAT, "corrupt page header (Thrift): %s", why);
        const uint8_t *raw = c->chunk + c->pos + used;
        if ((uint64_t)h.csize > c->chunk_n - c->pos - used)
            return PERR(c, DT_ERR_FORMAT, "a page of %d bytes runs past its column chunk", h.csize);
        c->pos += used + (size_t)h.csize;
        if (h.type == PQ_INDEX_PAGE)
            continue;
        const uint8_t *d;
        dt_status st;
        if (h.type == PQ_DICT_PAGE) {
            if (c->page > 0)
                return PERR(c, DT_ERR_FORMAT, "a dictionary page after the first page");
            if ((st = decompress(c, raw, (size_t)h.csize, (size_t)h.usize, &d)) < 0 ||
                (st = load_dict(c, &h, d, (size_t)h.usize)) < 0)
                return st;
            continue;
        }
        if (h.type != PQ_DATA_PAGE && h.type != PQ_DATA_PAGE_V2)
            return PERR(c, DT_ERR_FORMAT, "a page of unknown type %d", h.type);
        if (h.num_values > c->values_left)
            return PERR(c, DT_ERR_FORMAT, "%d values, more than the column chunk's %lld left", h.num_values,
                        (long long)c->values_left);
        const uint8_t *p, *end;
        if (h.type == PQ_DATA_PAGE) {
            if ((st = decompress(c, raw, (size_t)h.csize, (size_t)h.usize, &d)) < 0)
                return st;
            p = d;
            end = d + h.usize;
            if (c->max_rep && (st = levels_v1(c, h.rep_enc, c->rep_bw, &p, end, &c->reps)) < 0)
                return st;
            if (c->max_def && (st = levels_v1(c, h.def_enc, c->def_bw, &p, end, &c->defs)) < 0)
                return st;
        } else {
            uint64_t lv = (uint64_t)h.rep_len + (uint64_t)h.def_len;
            if (lv > (uint64_t)h.csize || lv > (uint64_t)h.usize)
                return PERR(c, DT_ERR_FORMAT, "levels of %llu bytes in a page of %d", (unsigned long long)lv,
                            h.csize);
            rle_init(&c->reps, raw, raw + h.rep_len, c->rep_bw);
            rle_init(&c->defs, raw + h.rep_len, raw + lv, c->def_bw);
            if (h.compressed) {
                if ((st = decompress(c, raw + lv, (size_t)h.csize - lv, (size_t)h.usize - lv, &d)) < 0)
                    return st;
            } else if (h.csize != h.usize) {
                return PERR(c, DT_ERR_FORMAT, "not compressed, yet its header says %d bytes compressed and %d not",
                            h.csize, h.usize);
            } else {
                d = raw + lv;
            }
            p = d;
            end = d + ((size_t)h.usize - lv);
        }
        c->page_left = h.num_values;
        c->values_left -= h.num_values;
        if ((st = values_init(c, h.encoding, p, end, (uint64_t)h.num_values)) < 0)
            return st;
        if (h.num_values)
            return DT_OK;
    }
}

dt_status dt__pq_col_peek(pq_col *c, int *rep, int *def, bool *end)
{
    *end = false;
    if (c->peeked) {
        *rep = c->next_rep;
        *def = c->next_def;
        return DT_OK;
    }
    if (!c->page_left) {
        if (!c->values_left) {
            *end = true;
            return DT_OK;
        }
        dt_status st = next_page(c);
        if (st < 0)
            return st;
    }
    uint64_t r = 0, d = 0;
    const char *why = NULL;
    if (c->max_rep && !rle_next(&c->reps, &r, &why))
        return PERR(c, DT_ERR_FORMAT, "repetition levels: %s", why);
    if (c->max_def && !rle_next(&c->defs, &d, &why))
        return PERR(c, DT_ERR_FORMAT, "definition levels: %s", why);
    if (r > (uint64_t)c->max_rep || d > (uint64_t)c->max_def)
        return PERR(c, DT_ERR_FORMAT, "a %s level of %llu, past the column's maximum of %d",
                    r > (uint64_t)c->max_rep ? "repetition" : "definition",
                    (unsigned long long)(r > (uint64_t)c->max_rep ? r : d),
                    r > (uint64_t)c->max_rep ? c->max_rep : c->max_def);
    c->peeked = true;
    *rep = c->next_rep = (int)r;
    *def = c->next_def = (int)d;
    return DT_OK;
}

static uint64_t le(const uint8_t *p, size_t w)
{
    uint64_t x = 0;
    for (size_t i = 0; i < w; i++)
        x |= (uint64_t)p[i] << (8 * i);
    return x;
}

/* A fixed-width value's bits (w bytes) into v by type. */
static void fixed_val(int32_t type, uint64_t bits, pq_val *v)
{
    if (type == PQ_INT32)
        v->i = (int32_t)(uint32_t)bits;
    else if (type == PQ_INT64)
        v->i = (int64_t)bits;
    else if (type == PQ_FLOAT) {
        uint32_t u = (uint32_t)bits;
        float f;
        memcpy(&f, &u, 4);
        v->d = f;
    } else {
        double d;
        memcpy(&d, &bits, 8);
        v->d = d;
    }
}

static dt_status take_value(pq_col *c, pq_val *v)
{
    const char *why = NULL;
    uint64_t x;
    size_t w = type_width(c->type);
    switch (c->enc) {
    case PQ_PLAIN:
        if (c->type == PQ_BOOLEAN) {
            if (c->bitpos >= (uint64_t)(c->vend - c->v) * 8)
                return PERR(c, DT_ERR_FORMAT, "fewer values than its levels say");
            v->b = (c->v[c->bitpos >> 3] >> (c->bitpos & 7)) & 1;
            c->bitpos++;
            return DT_OK;
        }
        if (c->type == PQ_BYTE_ARRAY) {
            if (c->vend - c->v < 4)
                return PERR(c, DT_ERR_FORMAT, "fewer values than its levels say");
            uint64_t l = le(c->v, 4);
            if (l > (uint64_t)(c->vend - c->v - 4))
                return PERR(c, DT_ERR_FORMAT, "a value of %llu bytes runs past the page", (unsigned long long)l);
            v->s = c->v + 4;
            v->n = (size_t)l;
            c->v += 4 + l;
            return DT_OK;
        }
        if ((size_t)(c->vend - c->v) < w)
            return PERR(c, DT_ERR_FORMAT, "fewer values than its levels say");
        fixed_val(c->type, le(c->v, w), v);
        c->v += w;
        return DT_OK;
    case PQ_PLAIN_DICT:
    case PQ_RLE_DICT:
        if (!rle_next(&c->idx, &x, &why))
            return PERR(c, DT_ERR_FORMAT, "dictionary indices: %s", why);
        if (x >= (uint64_t)c->dict_n)
            return PERR(c, DT_ERR_FORMAT, "dictionary index %llu, past the dictionary's %lld values",
                        (unsigned long long)x, (long long)c->dict_n);
        if (w) {
            fixed_val(c->type, le(c->dict_buf + c->dict_off[x], w), v);
        } else {
            v->s = c->dict_buf + c->dict_off[x];
            v->n = c->dict_len[x];
        }
        return DT_OK;
    case PQ_RLE:
        if (!rle_next(&c->idx, &x, &why))
            return PERR(c, DT_ERR_FORMAT, "RLE booleans: %s", why);
        if (x > 1)
            return PERR(c, DT_ERR_FORMAT, "an RLE boolean of %llu", (unsigned long long)x);
        v->b = x;
        return DT_OK;
    case PQ_DELTA_BP:
        if (!dbp_next(&c->d1, &x, &why))
            return PERR(c, DT_ERR_FORMAT, "%s", why);
        v->i = (int64_t)x;
        return DT_OK;
    default: { /* DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY */
        uint64_t pre = 0;
        if (!dbp_next(&c->d1, &x, &why) || (c->enc == PQ_DELTA_BA && !dbp_next(&c->d2, &pre, &why)))
            return PERR(c, DT_ERR_FORMAT, "%s", why);
        if ((int64_t)x < 0 || x > (uint64_t)(c->vend - c->v))
            return PERR(c, DT_ERR_FORMAT, "a value of length %lld runs past the page", (long long)(int64_t)x);
        if (c->enc == PQ_DELTA_LBA) {
            v->s = c->v;
            v->n = (size_t)x;
            c->v += x;
            return DT_OK;
        }
        if ((int64_t)pre < 0 || pre > c->prev_n)
            return PERR(c, DT_ERR_FORMAT, "a prefix of %lld bytes, longer than the previous value's %zu",
                        (long long)(int64_t)pre, c->prev_n);
        size_t n = (size_t)pre + (size_t)x;
        if (n > c->prev_cap) {
            size_t cap = c->prev_cap ? c->prev_cap : 64;
            while (cap < n)
                cap *= 2;
            uint8_t *b = realloc(c->prev, cap);
            if (!b)
                return PERR(c, DT_ERR_NO_MEMORY, "out of memory");
            c->prev = b;
            c->prev_cap = cap;
        }
        if (x)
            memcpy(c->prev + pre, c->v, (size_t)x);
        c->v += x;
        c->prev_n = n;
        v->s = c->prev;
        v->n = n;
        return DT_OK;
    }
    }
}

dt_status dt__pq_col_take(pq_col *c, pq_val *v)
{
    if (!c->peeked)
        return PERR(c, DT_ERR_FORMAT, "internal: a value taken before it was peeked");
    c->peeked = false;
    c->page_left--;
    c->taken++;
    if (c->next_def < c->max_def)
        return DT_OK;
    return take_value(c, v);
}
