/* Recursive halving (reduce-scatter) / recursive doubling (all-gather)
 * all-reduce on shared memory (Rabenseifner's algorithm).
 *
 * With p the largest power of two <= W, the W-p "extra" ranks first fold
 * into ranks 0..W-p-1 (rank i combines its input with rank p+i's). Then the
 * p ranks halve: at distance k = p/2, p/4, ..., 1 rank i keeps the half of
 * its current chunk block selected by bit k of i and combines it with the
 * same half of partner i^k's work buffer; after log2(p) levels rank i holds
 * the reduction of chunk i. Doubling walks back up (k = 1, 2, ...), copying
 * the partner's block, until every rank has everything; the extra ranks
 * then copy the result from their partner.
 *
 * Every level reads and writes disjoint halves on the two partners, and
 * each level waits for the partner's previous level, so a lagging partner
 * is never overwritten while it still reads. */
#include "comm/shm/shm.h"

dt_status dt__shm_allreduce_rechd(shm_piece *p)
{
    shm_ctx *s = p->s;
    int W = s->size, me = s->rank, p2 = 1, lg = 0;
    while (p2 * 2 <= W) {
        p2 *= 2;
        lg++;
    }
    int extra = W - p2;
    size_t es = dt_dtype_size(p->dt), n = p->count;
    uint32_t base = p->step, step = base, final_step = base + 2 * (uint32_t)lg;
    dt_status st;

    if (me < extra) {
        if ((st = dt__shm_wait(s, p2 + me, 1)) < 0) /* arrival: its input is ready */
            return st;
        const void *srcs[2] = {p->ins[me], p->ins[p2 + me]};
        shm_moved(s, p2 + me, me, n * es);
        dt__reduce(p->dt, p->op, p->works[me], srcs, 2, n, 0);
    } else if (me < p2) {
        dt__copy(p->works[me], p->ins[me], n * es);
    }
    dt__shm_signal(s, base);

    if (me >= p2) { /* an extra rank: wait for the partner's result */
        if ((st = dt__shm_wait(s, me - p2, final_step)) < 0)
            return st;
        dt__copy(p->works[me], p->works[me - p2], n * es);
        shm_moved(s, me - p2, me, n * es);
        p->step = final_step + 1;
        return DT_OK;
    }

    int cl = 0, ch = p2; /* current chunk block [cl, ch) of p2 chunks */
    size_t lo, hi, tmp;
    for (int k = p2 / 2; k >= 1; k /= 2) {
        int partner = me ^ k;
        if ((st = dt__shm_wait(s, partner, step)) < 0)
            return st;
        if (me & k)
            cl += k;
        else
            ch = cl + k;
        dt__shm_chunk(n, es, p2, cl, &lo, &tmp);
        dt__shm_chunk(n, es, p2, ch - 1, &tmp, &hi);
        const void *srcs[2] = {p->works[me] + lo * es, p->works[partner] + lo * es};
        shm_moved(s, partner, me, (hi - lo) * es);
        dt__reduce(p->dt, p->op, p->works[me] + lo * es, srcs, 2, hi - lo, k == 1 ? W : 0);
        dt__shm_signal(s, ++step);
    }
    for (int k = 1; k < p2; k *= 2) {
        int partner = me ^ k;
        if ((st = dt__shm_wait(s, partner, step)) < 0)
            return st;
        int pcl = (me & k) ? cl - k : ch, pch = pcl + k;
        dt__shm_chunk(n, es, p2, pcl, &lo, &tmp);
        dt__shm_chunk(n, es, p2, pch - 1, &tmp, &hi);
        dt__copy(p->works[me] + lo * es, p->works[partner] + lo * es, (hi - lo) * es);
        shm_moved(s, partner, me, (hi - lo) * es);
        if (me & k)
            cl = pcl;
        else
            ch = pch;
        dt__shm_signal(s, ++step);
    }
    p->step = final_step + 1;
    return DT_OK;
}
