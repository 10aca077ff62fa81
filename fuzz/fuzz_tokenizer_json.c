/* libFuzzer target for tokenizer.json (tokenizer.h): the reader (model,
 * vocab, merges, added tokens, normalizer, pre-tokenizers with their
 * regexes, decoder, post-processor), then encoding and decoding with what
 * it read. Input: the tokenizer.json text, then a 0 byte, then the text to
 * encode (the whole input is the JSON when there is no 0 byte). Checked:
 * every refusal has a message naming the file; every id encode gives
 * decodes (is below the vocab size); nothing leaks or crashes. */
// fuzz-sources: src/base/*.c src/data/*.c
// fuzz-libs: -lcjson -lz
#include "dtrain/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *z = memchr(data, 0, size);
    size_t jn = z ? (size_t)(z - data) : size;
    const char *text = z ? (const char *)z + 1 : "Hello world <|endoftext|> 123 caf\xc3\xa9";
    size_t tn = z ? size - jn - 1 : strlen(text);
    if (tn > 4096)
        tn = 4096; /* bounded work per input: a corpus is many short texts */
    dt_tokenizer *t = NULL;
    dt_error_clear();
    if (dt_tokenizer_load_mem(data, jn, "fuzz.json", &t) < 0) {
        if (t || !strstr(dt_last_error(), "fuzz.json"))
            abort();
        return 0;
    }
    uint32_t *ids = NULL;
    int64_t n = 0;
    for (int special = 0; special < 2; special++) {
        if (dt_tokenizer_encode(t, text, tn, special, &ids, &n) < 0) {
            if (dt_last_error()[0] == 0)
                abort();
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            if ((int64_t)ids[i] >= dt_tokenizer_vocab_size(t))
                abort();
        char *back = NULL;
        size_t len = 0;
        if (dt_tokenizer_decode(t, ids, n, special, &back, &len) < 0)
            abort(); /* encode's ids all have tokens */
        free(back);
        free(ids);
    }
    char *cfg = NULL, *map = NULL;
    if (dt_tokenizer_hf_files(t, 1024, &cfg, &map) < 0)
        abort();
    free(cfg);
    free(map);
    dt_tokenizer_free(t);
    return 0;
}
