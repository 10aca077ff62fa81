/* libFuzzer target for the safetensors reader (from memory). Any input must
 * give either a file whose tensors tile the data exactly and can all be read
 * back, or an error with a message and no object; never a crash, a leak or
 * a huge allocation. */
// fuzz-sources: src/base/*.c src/ckpt/safetensors.c src/ckpt/crc32c.c
// fuzz-libs: -lcjson -lz
#include "dtrain/ckpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_st_file *f = NULL;
    dt_status st = dt_st_open_mem(data, size, "fuzz", &f);
    if (st < 0) {
        if (f || dt_last_error()[0] == 0)
            abort(); /* an error must come with a message and no object */
        return 0;
    }
    /* the tensors tile [8 + N, size) in order, and each can be read */
    uint64_t pos = dt_st_count(f) ? dt_st_tensor_at(f, 0)->offset : size;
    uint8_t buf[64];
    for (size_t i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        if (t->offset != pos || t->nbytes != t->numel * dt_st_dtype_size(t->dtype) || dt_st_find(f, t->name) != t)
            abort();
        pos += t->nbytes;
        uint64_t k = t->nbytes < sizeof buf ? t->nbytes : sizeof buf;
        if (dt_st_read(f, t, t->nbytes - k, k, buf) != DT_OK || memcmp(buf, data + t->offset + t->nbytes - k, k))
            abort();
    }
    if (pos != size)
        abort();
    for (size_t i = 0; i < dt_st_meta_count(f); i++) {
        const char *k, *v;
        if (dt_st_meta_at(f, i, &k, &v) != DT_OK || dt_st_meta(f, k) != v)
            abort();
    }
    uint32_t crc;
    if (dt_st_checksum(f, DT_SUM_CRC32C, &crc) != DT_OK)
        abort();
    dt_st_close(f);
    return 0;
}
