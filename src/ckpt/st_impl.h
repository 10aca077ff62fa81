/* Internal to src/ckpt: raw byte access to an open safetensors file, for
 * the checkpoint reader's verify-as-you-read path (ckpt_read.c). */
#ifndef DTRAIN_CKPT_ST_IMPL_H
#define DTRAIN_CKPT_ST_IMPL_H

#include "dtrain/ckpt.h"

/* Bytes [pos, pos + n) of the file (header included) into dst. */
dt_status dt__st_pread(const dt_st_file *f, uint64_t pos, void *dst, uint64_t n);
/* Ask the kernel to start reading bytes [pos, pos + n) now (readahead;
 * nothing for a file in memory): the disk works while the caller checksums
 * what it has. */
void dt__st_prefetch(const dt_st_file *f, uint64_t pos, uint64_t n);
/* Continue checksum *crc of kind over the file's bytes [pos, end) (read
 * through a 1 MiB buffer). */
dt_status dt__st_sum_range(const dt_st_file *f, dt_ckpt_sum kind, uint64_t pos, uint64_t end, uint32_t *crc);

#endif
