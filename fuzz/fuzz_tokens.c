/* libFuzzer target for the llm.c token-file checker and the window
 * dataset. Any input gives either a file whose size matches its header
 * (uint16 tokens, or uint32 under the Llama 3 magic) and whose tokens are
 * all below the vocabulary, or an error with a message;
 * never a crash or an out-of-bounds read. The first input byte picks the
 * vocabulary bound (0: none). */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/data.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int64_t vocab = data[0] ? (int64_t)data[0] * 257 : 0;
    data++, size--;
    int64_t cnt = -1;
    dt_status st = dt_tokens_check_mem(data, size, "fuzz", vocab, &cnt);
    if (st < 0) {
        if (dt_last_error()[0] == 0 || cnt != -1)
            abort(); /* an error comes with a message and no count */
        return 0;
    }
    int32_t magic;
    memcpy(&magic, data, 4);
    const size_t w = magic == DT_TOKENS32_MAGIC ? 4 : 2; /* llm.c's uint32 (Llama 3) file, or its uint16 one */
    if (cnt < 1 || (size_t)cnt * w + DT_TOKENS_HEADER_BYTES != size)
        abort();
    for (int64_t i = 0; vocab && i < cnt; i++) {
        uint32_t t = 0;
        memcpy(&t, data + DT_TOKENS_HEADER_BYTES + w * (size_t)i, w); /* little-endian, as the files */
        if (t >= (uint64_t)vocab)
            abort();
    }
    /* through a file and the window dataset (small inputs only) */
    if (size > 4096)
        return 0;
    char path[] = "/tmp/dt_fuzz_tokens_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        unlink(path);
        return 0;
    }
    close(fd);
    dt_tokens_params p = dt_tokens_params_default();
    p.seq_len = 1 + (int64_t)(data[DT_TOKENS_HEADER_BYTES] % 16);
    p.stride = data[DT_TOKENS_HEADER_BYTES] % 3;
    p.vocab_size = vocab;
    dt_dataset *ds = NULL;
    if (dt_dataset_tokens_open(path, &p, &ds) != DT_OK)
        abort();
    int64_t n = dt_dataset_length(ds), x[16], y[16];
    if (n > 0 && (dt_dataset_get_item(ds, 0, x, y) < 0 || dt_dataset_get_item(ds, n - 1, x, y) < 0))
        abort();
    for (int64_t k = 0; n > 0 && k < p.seq_len; k++)
        if (x[k] < 0 || y[k] < 0 || (vocab && (x[k] >= vocab || y[k] >= vocab)))
            abort();
    dt_dataset_free(ds);
    unlink(path);
    return 0;
}
