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

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64];
static const char *shard[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};

static void cleanup(void)
{
    char p[160];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    unlink(p);
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, shard[i]);
        unlink(p);
    }
    rmdir(dir);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/dt-fuzz-hfidx-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    for (int i = 0; i < 2; i++) {
        char p[160];
        snprintf(p, sizeof p, "%s/%s", dir, shard[i]);
        dt_st_desc d = {.name = i ? "b" : "a", .dtype = DT_ST_F32, .ndim = 1, .shape = {i ? 2 : 4}};
        float v[4] = {1, 2, 3, 4};
        dt_st_writer *w;
        if (dt_st_writer_open(p, &d, 1, NULL, 0, &w) < 0 || dt_st_writer_write(w, 0, v, (i ? 2 : 4) * 4) < 0 ||
            dt_st_writer_commit(w, NULL) < 0)
            abort();
        dt_st_writer_close(w);
    }
    atexit(cleanup);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0])
        setup();
    char p[160];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(dir, &ck) < 0) {
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
