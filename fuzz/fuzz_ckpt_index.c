/* libFuzzer target for the checkpoint index reader (index.json) and the
 * reads it drives. The input is written as index.json into a directory
 * that also holds a valid rank-00000.safetensors (tensor "w", 6 f32);
 * any input must give either a checkpoint whose tensors can all be read
 * (or refused with a message naming the problem), or an error with a
 * message; never a crash, a leak, a read outside a tensor or a file
 * outside the directory. */
// fuzz-sources: src/base/*.c src/ckpt/safetensors.c src/ckpt/crc32c.c src/ckpt/ckpt_read.c
// fuzz-libs: -lcjson -lz
#include "dtrain/ckpt.h"
#include "shard_dir.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const files[] = {"rank-00000.safetensors"}, *const names[] = {"w"};
    static const int64_t numel[] = {6};
    if (!sd_dir[0])
        sd_setup("/tmp/dt-fuzz-ckpt-XXXXXX", "index.json", 1, files, names, numel);
    sd_write_input(data, size);
    dt_ckpt *ck = NULL;
    if (dt_ckpt_open(sd_dir, &ck) < 0) {
        if (ck || dt_last_error()[0] == 0)
            abort();
        return 0;
    }
    for (size_t i = 0; i < dt_ckpt_num_tensors(ck); i++) {
        dt_ckpt_tensor t;
        if (dt_ckpt_tensor_at(ck, i, &t) != DT_OK || dt_ckpt_find(ck, t.name) < 0)
            abort();
        uint64_t n = t.numel < 64 ? t.numel : 64;
        uint8_t buf[64 * 8];
        if (dt_ckpt_read(ck, i, 0, n, buf, (i & 1) != 0) < 0 && dt_last_error()[0] == 0)
            abort();
    }
    dt_ckpt_close(ck);
    /* the one-pass verified batch (files not yet verified by the reads
     * above, in another order: the last tensor first) */
    if (dt_ckpt_open(sd_dir, &ck) < 0)
        abort(); /* it opened a moment ago */
    size_t nt = dt_ckpt_num_tensors(ck) < 8 ? dt_ckpt_num_tensors(ck) : 8;
    dt_ckpt_req rq[8];
    static uint8_t bbuf[8][64 * 8];
    for (size_t i = 0; i < nt; i++) {
        dt_ckpt_tensor t;
        if (dt_ckpt_tensor_at(ck, nt - 1 - i, &t) != DT_OK)
            abort();
        rq[i] = (dt_ckpt_req){.tensor = nt - 1 - i, .lo = t.numel / 2, .hi = t.numel < 64 ? t.numel : 64, .dst = bbuf[i]};
        if (rq[i].lo > rq[i].hi)
            rq[i].lo = rq[i].hi;
    }
    if (dt_ckpt_read_batch(ck, rq, nt, true) < 0 && dt_last_error()[0] == 0)
        abort();
    if (dt_ckpt_verify(ck) < 0 && dt_last_error()[0] == 0)
        abort();
    dt_ckpt_close(ck);
    return 0;
}
