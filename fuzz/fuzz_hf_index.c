/* libFuzzer target for a Hugging Face model directory's
 * model.safetensors.index.json (ckpt.h dt_ckpt_open on a model directory:
 * the weight_map, each file it names, each tensor in the file it says).
 * The input is written as model.safetensors.index.json into a directory
 * that also holds two valid shards, model-00001-of-00002.safetensors
 * (tensor "a", 4 f32) and model-00002-of-00002.safetensors ("b", 2 f32);
 * any input must give either a checkpoint whose tensors read back, or an
 * error with a message; never a crash, a leak or a file outside the
 * directory. */
// fuzz-sources: src/base/*.c src/ckpt/safetensors.c src/ckpt/crc32c.c src/ckpt/ckpt_read.c
// fuzz-libs: -lcjson -lz
#include "dtrain/ckpt.h"
#include "shard_dir.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"},
                             *const names[] = {"a", "b"};
    static const int64_t numel[] = {4, 2};
    if (!sd_dir[0])
        sd_setup("/tmp/dt-fuzz-hfidx-XXXXXX", "model.safetensors.index.json", 2, files, names, numel);
    sd_write_input(data, size);
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(sd_dir, &ck) < 0) {
        if (ck || dt_last_error()[0] == 0)
            abort();
        return 0;
    }
    for (size_t i = 0; i < dt_ckpt_num_tensors(ck); i++) {
        dt_ckpt_tensor t;
        if (dt_ckpt_tensor_at(ck, i, &t) != DT_OK || dt_ckpt_find(ck, t.name) < 0 || t.numel > 4)
            abort();
        float buf[4];
        if (dt_ckpt_read(ck, i, 0, t.numel, buf, true) < 0 && dt_last_error()[0] == 0)
            abort();
    }
    dt_ckpt_close(ck);
    return 0;
}
