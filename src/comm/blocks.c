/* Strided block layouts (comm.h, dt_pg_block): copies between a layout and
 * contiguous memory, shared by the group layer's pack/unpack (coll.c) and
 * the shm backend, which copies to and from layouts directly. */
#include "comm/backend.h"

#include <string.h>

/* Copy m elements starting at element a of block sb of src (the block's
 * order: run by run) to element a' of block db of dst. NULL layout =
 * contiguous, from element 0. Runs are walked together: each memcpy moves
 * the longest stretch that is contiguous on both sides. */
void dt__blk_copy(void *dst, const dt_pg_block *db, size_t da, const void *src,
                  const dt_pg_block *sb, size_t sa, size_t m, size_t es)
{
    if (!m)
        return;
    if (!db && !sb) {
        dt__copy((char *)dst + da * es, (const char *)src + sa * es, m * es);
        return;
    }
    /* position: run index and offset within the run (contiguous: one run) */
    size_t drun = db ? db->run : m + da, srun = sb ? sb->run : m + sa;
    size_t di = da / drun, dk = da % drun, si = sa / srun, sk = sa % srun;
    while (m) {
        size_t n = drun - dk < srun - sk ? drun - dk : srun - sk;
        if (n > m)
            n = m;
        size_t doff = db ? db->off + di * db->stride + dk : dk + di * drun;
        size_t soff = sb ? sb->off + si * sb->stride + sk : sk + si * srun;
        memcpy((char *)dst + doff * es, (const char *)src + soff * es, n * es);
        m -= n;
        dk += n;
        sk += n;
        if (dk == drun)
            dk = 0, di++;
        if (sk == srun)
            sk = 0, si++;
    }
}
