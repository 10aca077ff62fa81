/* libFuzzer target for the Parquet reader (src/data/parquet.h), from
 * memory. Any input gives rows (each a JSON object, the row named by
 * dt__pq_where) up to the footer's count, or an error with a message;
 * never a crash, a leak, an out-of-bounds read or a huge allocation. All
 * columns are selected; where one is of a kind the reader refuses, the
 * columns the text data uses are selected instead. The seeds are
 * tests/data/parquet/'s small fixtures. Built without libzstd (the fuzz
 * build's flags are shared by every target), so ZSTD pages are refused. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "data/parquet.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt__pq_file *f = NULL;
    dt_status st = dt__pq_open_mem(data, size, "fuzz", &f);
    if (st < 0) {
        if (f || dt_last_error()[0] == 0)
            abort(); /* an error comes with a message and no file */
        return 0;
    }
    if (dt__pq_select(f, NULL, 0) < 0) {
        static const char *const text[] = {"text", "messages", "prompt", "completion", "tools", "chat_template_kwargs",
                                           "tags", "meta", "nested", "words", "turns", "nums"};
        st = dt__pq_select(f, text, sizeof text / sizeof text[0]);
    }
    int64_t rows = 0;
    cJSON *row = NULL;
    while (st == DT_OK && rows < 20000 && (st = dt__pq_next(f, &row)) == DT_OK && row) {
        if (!cJSON_IsObject(row) || strncmp(dt__pq_where(f), "parquet fuzz: row group ", 24))
            abort();
        char *s = cJSON_PrintUnformatted(row); /* every value printable */
        if (!s)
            abort();
        free(s);
        cJSON_Delete(row);
        rows++;
    }
    if (st < 0 && dt_last_error()[0] == 0)
        abort();
    if (st == DT_OK && rows < 20000 && rows != dt__pq_num_rows(f))
        abort(); /* all rows read: as many as the footer says */
    dt__pq_close(f);
    return 0;
}
