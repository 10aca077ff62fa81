/* src/data/idx_internal.h — IDX helpers shared inside the data module. */
#ifndef DT_DATA_IDX_INTERNAL_H
#define DT_DATA_IDX_INTERNAL_H

#include "dtrain/data.h"

/* Read only the header of the IDX file at path (plain or gzip: only the
 * first compressed bytes are inflated) into hdr's type, ndim and dims; no
 * payload is read or allocated. DT_OK when the header was read; otherwise
 * an error with a message (the full read reports the same file better, so
 * callers may ignore it and go on). */
dt_status dt__idx_peek_file(const char *path, dt_idx *hdr);

#endif
