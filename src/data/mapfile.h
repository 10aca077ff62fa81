/* A read-only memory map of a whole file, shared by the token-file and
 * NumPy readers (internal).
 *
 * A mapped file that shrinks while it is in use (truncated by another
 * process, rewritten in place) would kill the reader with SIGBUS at the
 * first access past the new end, with no message. The readers call
 * dt__map_check before they copy from the map (once per batch or item):
 * it compares the file's size now (fstat of the descriptor the map keeps)
 * with its size when mapped and fails naming the file. */
#ifndef DT_DATA_MAPFILE_H
#define DT_DATA_MAPFILE_H

#include "dtrain/base.h"

#include <stdio.h>

typedef struct dt__map {
    const unsigned char *data; /* the file's bytes (NULL for an empty file) */
    size_t size;               /* bytes */
    int fd;                    /* the mapped file, kept for dt__map_check (meaningful when data) */
    char *path;                /* for messages (malloc'd; NULL when data is NULL) */
    const char *what;          /* "token file", "npy" (static) */
} dt__map;

/* Map path read-only. Errors name the path: DT_ERR_IO (missing, a
 * directory, unreadable). what prefixes the message ("token file"). */
dt_status dt__map_open(const char *path, const char *what, dt__map *m);
/* DT_OK while the file still holds every mapped byte; DT_ERR_IO naming the
 * file when it was truncated since it was mapped (reading the map now
 * would raise SIGBUS). A zeroed or empty map is always OK. */
dt_status dt__map_check(const dt__map *m);
/* Unmap (a zeroed map is a no-op). */
void dt__map_close(dt__map *m);

/* fopen(path, "rb") of a regular file, for readers that read a whole file
 * (text corpora, tokenizer.json, vocab files): the file is opened with
 * O_NONBLOCK and checked with fstat first, so a FIFO, a device or a
 * directory is refused at once instead of blocking on a writer that never
 * comes (or reading /dev/zero without end). NULL on failure with *why set
 * to the reason (strerror's text or "not a regular file"). */
FILE *dt__fopen_regular(const char *path, const char **why);

#endif
