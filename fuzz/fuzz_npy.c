/* libFuzzer target for the .npy reader: the header parser from memory,
 * then (small inputs) the file through the row dataset. Any input gives a
 * header whose data exactly fill the file, or an error with a message;
 * never a crash or an out-of-bounds read. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_npy_header h;
    dt_status st = dt_npy_parse_header(data, size, "fuzz", &h);
    if (st < 0) {
        if (dt_last_error()[0] == 0)
            abort();
        return 0;
    }
    size_t n = (size_t)h.itemsize;
    for (int d = 0; d < h.ndim; d++)
        n *= (size_t)h.shape[d];
    if (n != h.data_bytes || h.data_offset + h.data_bytes != size)
        abort();
    if (size > 8192)
        return 0;
    char path[] = "/tmp/dt_fuzz_npy_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    bool ok = write(fd, data, size) == (ssize_t)size;
    close(fd);
    dt_dataset *ds = NULL;
    if (ok && dt_dataset_npy_open(path, path, &ds) == DT_OK) {
        /* items only when there are rows: then the data fill this small file,
           so an item is small too (a file of no rows may describe any item);
           an item may be refused (a NaN, an infinity, a value beyond float32),
           with a message naming it */
        int64_t len = dt_dataset_length(ds);
        if (len > 0) {
            void *x = malloc(dt_dataset_x_bytes(ds)), *y = malloc(dt_dataset_y_bytes(ds));
            if (!x || !y)
                abort();
            if ((dt_dataset_get_item(ds, 0, x, y) < 0 || dt_dataset_get_item(ds, len - 1, x, y) < 0) &&
                dt_last_error()[0] == 0)
                abort();
            free(x);
            free(y);
        }
        dt_dataset_free(ds);
    } else if (ok && dt_last_error()[0] == 0) {
        abort();
    }
    unlink(path);
    return 0;
}
