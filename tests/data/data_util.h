/* Helpers for the data tests: build IDX files (plain or gzip) in memory and
 * in a per-test temporary directory. */
#ifndef DT_TEST_DATA_UTIL_H
#define DT_TEST_DATA_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "tmp_util.h"

/* An IDX file with type byte t, dims, and payload bytes (already big-endian). */
static inline unsigned char *tu_idx(int t, int ndim, const uint32_t *dims, const void *payload,
                                    size_t nbytes, size_t *len)
{
    size_t h = 4 + 4 * (size_t)ndim;
    unsigned char *b = malloc(h + nbytes + 1);
    b[0] = 0;
    b[1] = 0;
    b[2] = (unsigned char)t;
    b[3] = (unsigned char)ndim;
    for (int d = 0; d < ndim; d++) {
        b[4 + 4 * d] = (unsigned char)(dims[d] >> 24);
        b[5 + 4 * d] = (unsigned char)(dims[d] >> 16);
        b[6 + 4 * d] = (unsigned char)(dims[d] >> 8);
        b[7 + 4 * d] = (unsigned char)dims[d];
    }
    if (nbytes)
        memcpy(b + h, payload, nbytes);
    *len = h + nbytes;
    return b;
}

/* gzip-compress buf (a real gzip member with CRC). */
static inline unsigned char *tu_gzip(const unsigned char *buf, size_t n, size_t *len)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
    size_t cap = deflateBound(&zs, (uLong)n) + 64;
    unsigned char *out = malloc(cap);
    zs.next_in = (unsigned char *)buf;
    zs.avail_in = (uInt)n;
    zs.next_out = out;
    zs.avail_out = (uInt)cap;
    deflate(&zs, Z_FINISH);
    *len = cap - zs.avail_out;
    deflateEnd(&zs);
    return out;
}

static inline void tu_write(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fwrite(buf, 1, n, f);
    fclose(f);
}

/* A fresh temporary directory (removed by tu_rmdir). */
static inline char *tu_tmpdir(void)
{
    static char tmpl[256];
    char *d = t_mkdtemp("data", tmpl, sizeof tmpl);
    if (!d) {
        perror("mkdtemp");
        exit(1);
    }
    return d;
}

static inline void tu_rmdir(const char *dir) { t_rm_rf(dir); }

/* A small MNIST-layout data set in dir: n images of h x w (pixel = (i*7 + p)
 * % 256) and labels i % 10, gzip or plain. */
static inline void tu_write_mnist(const char *dir, const char *prefix, uint32_t n, uint32_t h,
                                  uint32_t w, uint32_t nlabels, int gz)
{
    char path[512];
    size_t pix = (size_t)h * w, len;
    unsigned char *img = malloc(n * pix + 1), *lab = malloc(nlabels + 1);
    for (uint32_t i = 0; i < n; i++)
        for (size_t p = 0; p < pix; p++)
            img[i * pix + p] = (unsigned char)((i * 7 + p) % 256);
    for (uint32_t i = 0; i < nlabels; i++)
        lab[i] = (unsigned char)(i % 10);
    uint32_t di[3] = {n, h, w}, dl[1] = {nlabels};
    unsigned char *fi = tu_idx(0x08, 3, di, img, n * pix, &len);
    if (gz) {
        size_t zl;
        unsigned char *z = tu_gzip(fi, len, &zl);
        snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
        tu_write(path, z, zl);
        free(z);
    } else {
        snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
        tu_write(path, fi, len);
    }
    free(fi);
    unsigned char *fl = tu_idx(0x08, 1, dl, lab, nlabels, &len);
    if (gz) {
        size_t zl;
        unsigned char *z = tu_gzip(fl, len, &zl);
        snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);
        tu_write(path, z, zl);
        free(z);
    } else {
        snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
        tu_write(path, fl, len);
    }
    free(fl);
    free(img);
    free(lab);
}

/* A .npy of dtype descr ("<f4", "<f8") and shape (rows, cols) holding the
 * nbytes of v (header padded to 64 bytes, as numpy writes it); 0 on
 * success, -1 if the file cannot be written. */
static inline int du_write_npy(const char *p, const char *descr, int rows, int cols, const void *v, size_t nbytes)
{
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%d, %d), }", descr, rows,
                      cols);
    int pad = (64 - (10 + hl + 1) % 64) % 64;
    FILE *f = fopen(p, "wb");
    if (!f)
        return -1;
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    uint16_t len = (uint16_t)(hl + pad + 1);
    fwrite(&len, 2, 1, f);
    fwrite(hdr, 1, (size_t)hl, f);
    for (int i = 0; i < pad; i++)
        fputc(' ', f);
    fputc('\n', f);
    fwrite(v, 1, nbytes, f);
    return fclose(f) == 0 ? 0 : -1;
}

/* A little-endian float32 .npy of shape (rows, cols) holding v. */
static inline int du_write_npy_f32(const char *p, int rows, int cols, const float *v)
{
    return du_write_npy(p, "<f4", rows, cols, v, (size_t)rows * (size_t)cols * sizeof *v);
}

#endif
