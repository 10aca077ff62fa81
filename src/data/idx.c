/* IDX reader, plain and gzip, from memory or from a file.
 *
 * The header is validated before any payload is allocated: zero magic bytes,
 * a known type byte, 1..DT_IDX_MAX_DIMS dimensions, no dimension of zero,
 * and a payload of at most DT_IDX_MAX_BYTES computed without overflow. A
 * plain file must then hold exactly that many bytes after the header (a short
 * file is "truncated", a long one has "trailing bytes").
 *
 * gzip streams are inflated incrementally. The payload buffer is allocated
 * at once when the header's size is within deflate's maximum ratio (~1032:1)
 * of the compressed size, else it grows with the data actually produced
 * (doubling, capped at the size the header promised), so a tiny hostile
 * stream that claims a huge payload costs little more memory than it can
 * inflate to. zlib checks the gzip CRC and length at the end of the
 * stream; a corrupt stream, a truncated one, or a stream that inflates to a
 * different size than the header says each get their own message. */
#include "dtrain/data.h"
#include "data/idx_internal.h"
#include "data/mapfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static size_t type_size(int t)
{
    switch (t) {
    case DT_IDX_U8:
    case DT_IDX_I8: return 1;
    case DT_IDX_I16: return 2;
    case DT_IDX_I32:
    case DT_IDX_F32: return 4;
    case DT_IDX_F64: return 8;
    default: return 0;
    }
}

const char *dt_idx_type_name(dt_idx_type t)
{
    switch (t) {
    case DT_IDX_U8: return "u8";
    case DT_IDX_I8: return "i8";
    case DT_IDX_I16: return "i16";
    case DT_IDX_I32: return "i32";
    case DT_IDX_F32: return "f32";
    case DT_IDX_F64: return "f64";
    default: return "?";
    }
}

void dt_idx_free(dt_idx *idx)
{
    if (!idx)
        return;
    dt_free(idx->data);
    free(idx);
}

static uint32_t be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Parse and validate the header in h (hn bytes available, hn >= 4).
 * Returns the header length through *hlen, or DT_ERR_FORMAT. When hn is too
 * short for the dims, *hlen is set to the needed length and DT_INPROGRESS
 * returned, so the gzip path can inflate more. */
static dt_status parse_header(const unsigned char *h, size_t hn, const char *name, dt_idx *idx,
                              size_t *hlen)
{
    if (h[0] != 0 || h[1] != 0 || type_size(h[2]) == 0 || h[3] == 0)
        return dt_error(DT_ERR_FORMAT,
                        "%s: wrong magic number 0x%02x%02x%02x%02x (not an IDX file: expected "
                        "0x0000TTNN with type TT in 08,09,0B,0C,0D,0E and 1..%d dimensions)",
                        name, h[0], h[1], h[2], h[3], DT_IDX_MAX_DIMS);
    int ndim = h[3];
    if (ndim > DT_IDX_MAX_DIMS)
        return dt_error(DT_ERR_FORMAT, "%s: %d dimensions (at most %d supported)", name, ndim,
                        DT_IDX_MAX_DIMS);
    *hlen = 4 + 4 * (size_t)ndim;
    if (hn < *hlen)
        return DT_INPROGRESS;
    idx->type = (dt_idx_type)h[2];
    idx->ndim = ndim;
    idx->elem_size = type_size(h[2]);
    uint64_t total = idx->elem_size;
    for (int d = 0; d < ndim; d++) {
        uint32_t v = be32(h + 4 + 4 * d);
        idx->dims[d] = v;
        if (v == 0)
            return dt_error(DT_ERR_FORMAT, "%s: dimension %d is 0 (empty IDX file)", name, d);
        /* v < 2^32 and total <= 2^32 before the multiply: no overflow in 64 bits */
        total *= v;
        if (total > DT_IDX_MAX_BYTES)
            return dt_error(DT_ERR_FORMAT,
                            "%s: absurd dimensions (payload over %llu bytes at dimension %d = %u)",
                            name, (unsigned long long)DT_IDX_MAX_BYTES, d, v);
    }
    for (int d = ndim; d < DT_IDX_MAX_DIMS; d++)
        idx->dims[d] = 1;
    idx->nbytes = (size_t)total;
    return DT_OK;
}

/* Big-endian payload to host order, in place. */
static void fix_endian(dt_idx *idx)
{
    size_t es = idx->elem_size, n = idx->nbytes / es;
    unsigned char *p = idx->data;
    if (es == 1)
        return;
    for (size_t i = 0; i < n; i++, p += es)
        for (size_t a = 0, b = es - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

static dt_status read_plain(const unsigned char *b, size_t n, const char *name, dt_idx *idx)
{
    size_t hlen = 0;
    if (n < 4)
        return dt_error(DT_ERR_FORMAT, "%s: truncated: %zu bytes, an IDX header needs at least 4",
                        name, n);
    dt_status st = parse_header(b, n, name, idx, &hlen);
    if (st == DT_INPROGRESS)
        return dt_error(DT_ERR_FORMAT, "%s: truncated header: %zu bytes, need %zu", name, n, hlen);
    if (st < 0)
        return st;
    size_t have = n - hlen;
    if (have < idx->nbytes)
        return dt_error(DT_ERR_FORMAT, "%s: truncated: %zu payload bytes, the header promises %zu",
                        name, have, idx->nbytes);
    if (have > idx->nbytes)
        return dt_error(DT_ERR_FORMAT, "%s: %zu trailing bytes after the %zu-byte payload", name,
                        have - idx->nbytes, idx->nbytes);
    idx->data = dt_alloc(idx->nbytes);
    if (!idx->data)
        return dt_error(DT_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes", name, idx->nbytes);
    memcpy(idx->data, b + hlen, idx->nbytes);
    return DT_OK;
}

/* Inflate the whole gzip stream. The first bytes are the header; the buffer
 * grows as output arrives. */
static dt_status read_gzip(const unsigned char *b, size_t n, const char *name, dt_idx *idx)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 15 + 16) != Z_OK)
        return dt_error(DT_ERR_NO_MEMORY, "%s: cannot initialise zlib", name);
    dt_status st = DT_OK;
    unsigned char hdr[4 + 4 * DT_IDX_MAX_DIMS];
    size_t hlen = 4, hgot = 0, cap = 0, got = 0;
    unsigned char *out = NULL;
    int zr = Z_OK;
    bool have_header = false;
    zs.next_in = (unsigned char *)b;
    size_t in_left = n;

    for (;;) {
        /* Choose where the next output goes. */
        unsigned char *dst;
        size_t room;
        if (!have_header) {
            dst = hdr + hgot;
            room = hlen - hgot;
        } else {
            if (got == cap) {
                if (cap == idx->nbytes) {
                    /* Full: inflate into a scratch byte to detect excess data. */
                    unsigned char extra;
                    zs.next_out = &extra;
                    zs.avail_out = 1;
                    if (zs.avail_in == 0 && in_left > 0) {
                        uInt take = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
                        zs.next_in = (unsigned char *)b + (n - in_left);
                        zs.avail_in = take;
                        in_left -= take;
                    }
                    zr = inflate(&zs, Z_NO_FLUSH);
                    if (zs.avail_out == 0) {
                        st = dt_error(DT_ERR_FORMAT,
                                      "%s: the gzip stream inflates to more than the %zu bytes "
                                      "the IDX header promises",
                                      name, idx->nbytes);
                        goto done;
                    }
                    if (zr == Z_STREAM_END)
                        break;
                    if (zr == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) {
                        st = dt_error(DT_ERR_FORMAT, "%s: truncated gzip stream", name);
                        goto done;
                    }
                    if (zr != Z_OK) {
                        st = dt_error(DT_ERR_FORMAT, "%s: corrupt gzip stream (%s)", name,
                                      zs.msg ? zs.msg : "zlib error");
                        goto done;
                    }
                    continue;
                }
                /* deflate expands at most ~1032:1, so a payload within that
                 * bound of the input is allocated at once; beyond it (a
                 * hostile header) the buffer only doubles as data arrives. */
                size_t ncap = cap ? cap * 2 : (1u << 16);
                if (!cap && n <= SIZE_MAX / 1040 && idx->nbytes <= n * 1040 + (1u << 16))
                    ncap = idx->nbytes;
                if (ncap > idx->nbytes)
                    ncap = idx->nbytes;
                unsigned char *nb = dt_alloc(ncap);
                if (!nb) {
                    st = dt_error(DT_ERR_NO_MEMORY, "%s: cannot allocate %zu bytes", name, ncap);
                    goto done;
                }
                if (got)
                    memcpy(nb, out, got);
                dt_free(out);
                out = nb;
                cap = ncap;
            }
            dst = out + got;
            room = cap - got;
        }
        if (room > (1u << 30))
            room = 1u << 30;
        zs.next_out = dst;
        zs.avail_out = (uInt)room;
        if (zs.avail_in == 0 && in_left > 0) {
            uInt take = in_left > (1u << 30) ? (1u << 30) : (uInt)in_left;
            zs.next_in = (unsigned char *)b + (n - in_left);
            zs.avail_in = take;
            in_left -= take;
        }
        zr = inflate(&zs, Z_NO_FLUSH);
        size_t produced = room - zs.avail_out;
        if (!have_header) {
            hgot += produced;
            if (hgot == hlen) {
                /* First the 4 magic bytes (sets hlen), then the dims. */
                st = parse_header(hdr, hgot, name, idx, &hlen);
                if (st < 0)
                    goto done;
                have_header = st == DT_OK;
                st = DT_OK;
            }
        } else {
            got += produced;
        }
        if (zr == Z_STREAM_END) {
            if (!have_header) {
                st = dt_error(DT_ERR_FORMAT,
                              "%s: truncated: the gzip stream ends inside the IDX header "
                              "(%zu of %zu bytes)",
                              name, hgot, hlen);
                goto done;
            }
            if (got < idx->nbytes) {
                st = dt_error(DT_ERR_FORMAT,
                              "%s: truncated: %zu payload bytes, the header promises %zu", name,
                              got, idx->nbytes);
                goto done;
            }
            break;
        }
        if (zr == Z_BUF_ERROR && zs.avail_in == 0 && in_left == 0) {
            st = dt_error(DT_ERR_FORMAT, "%s: truncated gzip stream (%zu payload bytes of %zu)",
                          name, got, have_header ? idx->nbytes : 0);
            goto done;
        }
        if (zr != Z_OK && zr != Z_BUF_ERROR) {
            st = dt_error(DT_ERR_FORMAT, "%s: corrupt gzip stream (%s)", name,
                          zs.msg ? zs.msg : (zr == Z_MEM_ERROR ? "out of memory" : "zlib error"));
            goto done;
        }
    }
    if (zs.avail_in > 0 || in_left > 0) {
        st = dt_error(DT_ERR_FORMAT, "%s: %zu trailing bytes after the gzip stream", name,
                      (size_t)zs.avail_in + in_left);
        goto done;
    }
    idx->data = out;
    out = NULL;
done:
    dt_free(out);
    inflateEnd(&zs);
    return st;
}

dt_status dt_idx_read_mem(const void *buf, size_t n, const char *name, dt_idx **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_idx_read_mem: out is NULL");
    *out = NULL;
    if (!name)
        name = "<memory>";
    if (!buf && n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_idx_read_mem: buf is NULL");
    dt_idx *idx = calloc(1, sizeof *idx);
    if (!idx)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    const unsigned char *b = buf;
    dt_status st;
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
        st = read_gzip(b, n, name, idx);
    else
        st = read_plain(b, n, name, idx);
    if (st < 0) {
        dt_idx_free(idx);
        return st;
    }
    fix_endian(idx);
    *out = idx;
    return DT_OK;
}

dt_status dt__idx_peek_file(const char *path, dt_idx *hdr)
{
    memset(hdr, 0, sizeof *hdr);
    const char *why = NULL;
    FILE *f = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    if (!f)
        return dt_error(DT_ERR_IO, "cannot open %s: %s", path, why);
    unsigned char in[4096], h[4 + 4 * DT_IDX_MAX_DIMS];
    size_t n = fread(in, 1, sizeof in, f), hn = 0;
    fclose(f);
    if (n >= 2 && in[0] == 0x1f && in[1] == 0x8b) {
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        if (inflateInit2(&zs, 15 + 16) != Z_OK)
            return dt_error(DT_ERR_NO_MEMORY, "%s: cannot initialise zlib", path);
        zs.next_in = in;
        zs.avail_in = (uInt)n;
        zs.next_out = h;
        zs.avail_out = sizeof h;
        int zr = inflate(&zs, Z_SYNC_FLUSH);
        hn = sizeof h - zs.avail_out;
        inflateEnd(&zs);
        if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR)
            return dt_error(DT_ERR_FORMAT, "%s: corrupt gzip stream", path);
    } else {
        hn = n < sizeof h ? n : sizeof h;
        memcpy(h, in, hn);
    }
    if (hn < 4)
        return dt_error(DT_ERR_FORMAT, "%s: truncated header", path);
    size_t hlen;
    dt_status st = parse_header(h, hn, path, hdr, &hlen);
    if (st == DT_INPROGRESS)
        return dt_error(DT_ERR_FORMAT, "%s: truncated header", path);
    return st;
}

dt_status dt_idx_read_file(const char *path, dt_idx **out)
{
    if (!out || !path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_idx_read_file: NULL argument");
    *out = NULL;
    const char *why = NULL;
    FILE *f = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    if (!f)
        return dt_error(DT_ERR_IO, "cannot open %s: %s", path, why);
    dt_status st = DT_OK;
    unsigned char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        st = dt_error(DT_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        goto close;
    }
    long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = dt_error(DT_ERR_IO, "cannot read %s: %s (is it a regular file?)", path,
                      sz < 0 ? strerror(errno) : "seek failed");
        goto close;
    }
    if ((unsigned long long)sz > DT_IDX_MAX_BYTES + 4096) {
        st = dt_error(DT_ERR_FORMAT, "%s: %ld bytes is larger than any supported IDX file", path, sz);
        goto close;
    }
    buf = malloc(sz ? (size_t)sz : 1);
    if (!buf) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: cannot allocate %ld bytes", path, sz);
        goto close;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        st = dt_error(DT_ERR_IO, "cannot read %s: %s", path, ferror(f) ? strerror(errno) : "short read");
        goto close;
    }
    st = dt_idx_read_mem(buf, (size_t)sz, path, out);
close:
    free(buf);
    fclose(f);
    return st;
}
