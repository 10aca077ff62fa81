/* Direct all-reduce (and reduce) on shared memory.
 *
 * Rank r owns chunk r of the vector. It reads chunk r from every rank's
 * input (sources in rank order 0..W-1, so the bits do not depend on timing),
 * reduces in cache-sized blocks, and writes the block straight into every
 * rank's output: each byte is read once from its owner and written once to
 * each destination, with no intermediate steps and no synchronisation inside
 * the algorithm (the driver's arrival and final barriers bracket it).
 * Traffic (dt_pg_traffic_read): rank r sends (W-1) chunks' worth of its
 * input to the chunks' owners and its own chunk's result to W-1 ranks,
 * 2 (W-1)/W of the vector in all.
 *
 * In place (ins[j] == works[j]) is safe: chunk r of rank j's buffer is read
 * and written only by rank r, and each block is fully read before it is
 * written. f16/bf16 accumulate in f32 and round once. */
#include "comm/shm/shm.h"

#define DIRECT_BLOCK (16u << 10) /* bytes per block: stays in L1/L2 */

static void direct_chunk(shm_piece *p, int to_all)
{
    shm_ctx *s = p->s;
    int W = s->size, me = s->rank;
    size_t es = dt_dtype_size(p->dt), lo, hi;
    dt__shm_chunk(p->count, es, W, me, &lo, &hi);
    size_t blk = DIRECT_BLOCK / es;
    const void *srcs[SHM_MAX_RANKS];
    float *dsts[SHM_MAX_RANKS];
    int fast = p->dt == DT_F32 && (p->op == DT_REDUCE_SUM || p->op == DT_REDUCE_AVG);
    char *own = to_all ? (p->own_out ? p->own_out : p->works[me]) : p->works[p->root];
    for (size_t b = lo; b < hi; b += blk) {
        size_t n = hi - b < blk ? hi - b : blk;
        for (int j = 0; j < W; j++) {
            srcs[j] = p->ins[j] + b * es;
            shm_moved(s, j, me, n * es); /* chunk me of j's input */
            if (to_all)
                shm_moved(s, me, j, n * es); /* the result into j's output */
        }
        if (!to_all)
            shm_moved(s, me, p->root, n * es);
        if (p->own_in)
            srcs[me] = p->own_in + b * es;
        char *dst = own + b * es;
        if (fast && to_all) {
            /* one pass: every destination written from registers */
            int nd = 0;
            dsts[nd++] = (float *)dst;
            for (int j = 0; j < W; j++)
                if (j != me)
                    dsts[nd++] = (float *)(p->works[j] + b * es);
            dt__reduce_f32_multi(dsts, nd, (const float *const *)srcs, W, n,
                                 p->op == DT_REDUCE_AVG ? W : 0, p->nt);
            continue;
        }
        dt__reduce(p->dt, p->op, dst, srcs, W, n, W);
        if (!to_all)
            continue;
        for (int j = 0; j < W; j++)
            if (j != me)
                dt__copy(p->works[j] + b * es, dst, n * es);
    }
}

dt_status dt__shm_allreduce_direct(shm_piece *p)
{
    direct_chunk(p, 1);
    return DT_OK;
}

dt_status dt__shm_reduce_direct(shm_piece *p)
{
    direct_chunk(p, 0);
    return DT_OK;
}
