/* Binomial-tree reduce, broadcast and all-reduce on shared memory.
 *
 * Ranks are renumbered so the root is virtual rank 0. Reduce: at distance
 * k = 1, 2, 4, ... a rank whose bit k is clear absorbs the subtree of
 * virtual rank v+k (waiting for it to signal "subtree done"), until it
 * meets its own lowest set bit; then it signals. Broadcast: every non-root
 * waits for its parent v - lowbit(v) to signal "has the result" and copies
 * it. Only two step numbers are needed (subtree done, has result) because
 * ticks are absolute and each rank passes them in order. log2(W) dependent
 * steps each way; children are combined in a fixed order. */
#include "comm/shm/shm.h"

static int real_rank(int v, int root, int W) { return (v + root) % W; }

/* Reduce phase into works[root]; returns with step R signalled. */
static dt_status tree_reduce(shm_piece *p, int root, uint32_t R, int avg_at_root)
{
    shm_ctx *s = p->s;
    int W = s->size, me = s->rank, v = (me - root + W) % W;
    size_t es = dt_dtype_size(p->dt), n = p->count;
    dt__copy(p->works[me], p->ins[me], n * es);
    for (int k = 1; k < W; k <<= 1) {
        if (v & k)
            break;
        if (v + k >= W)
            continue;
        int child = real_rank(v + k, root, W);
        dt_status st = dt__shm_wait(s, child, R);
        if (st < 0)
            return st;
        const void *srcs[2] = {p->works[me], p->works[child]};
        shm_moved(s, child, me, n * es);
        dt__reduce(p->dt, p->op, p->works[me], srcs, 2, n, 0);
    }
    if (v == 0 && avg_at_root && p->op == DT_REDUCE_AVG)
        dt__avg_finish(p->dt, p->works[me], n, W);
    dt__shm_signal(s, R);
    return DT_OK;
}

/* Broadcast phase from works[root]; step B means "has the result". */
static dt_status tree_bcast(shm_piece *p, int root, uint32_t B)
{
    shm_ctx *s = p->s;
    int W = s->size, me = s->rank, v = (me - root + W) % W;
    size_t es = dt_dtype_size(p->dt);
    if (v != 0) {
        int parent = real_rank(v - (v & -v), root, W);
        dt_status st = dt__shm_wait(s, parent, B);
        if (st < 0)
            return st;
        dt__copy(p->works[me], p->works[parent], p->count * es);
        shm_moved(s, parent, me, p->count * es);
    }
    dt__shm_signal(s, B);
    return DT_OK;
}

dt_status dt__shm_allreduce_tree(shm_piece *p)
{
    uint32_t R = p->step, B = p->step + 1;
    dt_status st = tree_reduce(p, 0, R, 1);
    if (st == DT_OK)
        st = tree_bcast(p, 0, B);
    p->step += 2;
    return st;
}

dt_status dt__shm_reduce_tree(shm_piece *p)
{
    dt_status st = tree_reduce(p, p->root, p->step, 1);
    p->step += 1;
    return st;
}

dt_status dt__shm_broadcast_tree(shm_piece *p)
{
    dt_status st = tree_bcast(p, p->root, p->step);
    p->step += 1;
    return st;
}
