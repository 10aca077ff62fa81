/* libFuzzer target for the CSV reader. Any input gives a dataset whose
 * rows can all be read (labels >= 0, finite features), or an error with a
 * message; never a crash. The first byte picks the label option. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/data.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *labels[] = {NULL, "0", "1", "label", "x", "-1"};
    dt_csv_params p = dt_csv_params_default();
    p.label = labels[data[0] % 6];
    dt_dataset *ds = NULL;
    dt_status st = dt_dataset_csv_from_mem(data + 1, size - 1, "fuzz", &p, &ds);
    if (st < 0) {
        if (ds || dt_last_error()[0] == 0)
            abort();
        return 0;
    }
    int64_t len = dt_dataset_length(ds), F = dt_dataset_x_numel(ds);
    float *x = malloc((size_t)F * sizeof *x);
    for (int64_t i = 0; i < len; i++) {
        int64_t y;
        if (dt_dataset_get_item(ds, i, x, &y) < 0 || y < 0)
            abort();
        for (int64_t k = 0; k < F; k++)
            if (isnan(x[k]))
                abort();
    }
    free(x);
    dt_dataset_free(ds);
    return 0;
}
