/* Ring all-reduce on shared memory: reduce-scatter, then all-gather.
 *
 * The vector is cut into W chunks. Reduce-scatter: first each rank copies
 * its own chunk r into its work buffer; at step s (0..W-2) rank r reads its
 * left neighbour's partial of chunk c = r-s-1, combines it with its own
 * input and stores the partial in its own work buffer, then signals. After
 * W-1 steps rank r holds the reduction of chunk r+1. A barrier separates
 * the phases (the right neighbour may still be reading partials that the
 * all-gather overwrites). All-gather: at step t rank r copies chunk r-t from
 * its left neighbour, who got it at step t-1.
 *
 * Each step waits only for the left neighbour, which is what a ring buys on
 * a network; on one machine it costs 2(W-1) dependent steps, so the default
 * table prefers the direct algorithm. Partials are stored in the buffer's
 * dtype (f16/bf16 round at every step, as NCCL's ring does). */
#include "comm/shm/shm.h"

dt_status dt__shm_allreduce_ring(shm_piece *p)
{
    shm_ctx *s = p->s;
    int W = s->size, me = s->rank, left = (me + W - 1) % W;
    size_t es = dt_dtype_size(p->dt), lo, hi;
    uint32_t base = p->step;
    dt_status st;

    dt__shm_chunk(p->count, es, W, me, &lo, &hi);
    dt__copy(p->works[me] + lo * es, p->ins[me] + lo * es, (hi - lo) * es);
    dt__shm_signal(s, base);
    for (int k = 0; k < W - 1; k++) {
        int c = ((me - k - 1) % W + W) % W;
        if ((st = dt__shm_wait(s, left, base + (uint32_t)k)) < 0)
            return st;
        dt__shm_chunk(p->count, es, W, c, &lo, &hi);
        const void *srcs[2] = {p->works[left] + lo * es, p->ins[me] + lo * es};
        shm_moved(s, left, me, (hi - lo) * es);
        dt__reduce(p->dt, p->op, p->works[me] + lo * es, srcs, 2, hi - lo,
                   k == W - 2 ? W : 0);
        dt__shm_signal(s, base + (uint32_t)k + 1);
    }
    uint32_t b = base + (uint32_t)W;
    if ((st = dt__shm_barrier(s, b)) < 0)
        return st;
    for (int t = 0; t < W - 1; t++) {
        int c = ((me - t) % W + W) % W;
        if ((st = dt__shm_wait(s, left, b + (uint32_t)t)) < 0)
            return st;
        dt__shm_chunk(p->count, es, W, c, &lo, &hi);
        dt__copy(p->works[me] + lo * es, p->works[left] + lo * es, (hi - lo) * es);
        shm_moved(s, left, me, (hi - lo) * es);
        dt__shm_signal(s, b + (uint32_t)t + 1);
    }
    p->step = b + (uint32_t)W + 1;
    return DT_OK;
}
