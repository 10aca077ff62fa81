/* libFuzzer target for the IDX reader (plain and gzip, from memory) and
 * the image dataset built on it. Any input must give either a valid file
 * whose payload size matches its dimensions, or an error with a message;
 * never a crash, a leak or a huge allocation. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_idx *idx = NULL;
    dt_status st = dt_idx_read_mem(data, size, "fuzz", &idx);
    if (st < 0) {
        if (idx || dt_last_error()[0] == 0)
            abort(); /* an error must come with a message and no object */
        return 0;
    }
    size_t n = idx->elem_size;
    for (int d = 0; d < idx->ndim; d++)
        n *= (size_t)idx->dims[d];
    if (n != idx->nbytes)
        abort();
    /* touch the payload: ASan catches a short buffer */
    volatile uint8_t acc = 0;
    for (size_t i = 0; i < idx->nbytes; i++)
        acc ^= ((const uint8_t *)idx->data)[i];
    (void)acc;
    /* as both images and labels of a dataset (takes ownership) */
    if (idx->type == DT_IDX_U8 && idx->ndim == 3) {
        dt_idx *lab = NULL;
        uint8_t hdr[8 + 256] = {0, 0, 8, 1};
        uint32_t cnt = (uint32_t)idx->dims[0] > 256 ? 256 : (uint32_t)idx->dims[0];
        hdr[4] = (uint8_t)(cnt >> 24);
        hdr[5] = (uint8_t)(cnt >> 16);
        hdr[6] = (uint8_t)(cnt >> 8);
        hdr[7] = (uint8_t)cnt;
        if (dt_idx_read_mem(hdr, 8 + cnt, "labels", &lab) < 0)
            abort();
        dt_dataset *ds = NULL;
        if (dt_dataset_idx_from(idx, lab, "images", "labels", &ds) == DT_OK) {
            int64_t len = dt_dataset_length(ds);
            float *x = malloc(dt_dataset_x_bytes(ds));
            int64_t y;
            if (x && len > 0 && dt_dataset_get_item(ds, len - 1, x, &y) < 0)
                abort();
            free(x);
            dt_dataset_free(ds);
        }
        return 0;
    }
    dt_idx_free(idx);
    return 0;
}
