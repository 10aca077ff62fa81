/* Strided block layouts (comm.h, dt_pg_block): copies between a layout and
 * contiguous memory, shared by the group layer's pack/unpack (coll.c) and
 * the shm backend, which copies to and from layouts directly. */
#include "comm/backend.h"

#include "base/copy.h"

#include <stdint.h>
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
        /* at the start of a run on each layout side, runs of one length:
         * as many whole runs as are left in one strided row copy */
        size_t L = db && sb ? (drun == srun ? drun : 0) : db ? drun : srun;
        if (L && (!db || dk == 0) && (!sb || sk == 0) && m / L >= 2) {
            size_t rows = m / L;
            size_t doff = db ? db->off + di * db->stride : dk;
            size_t soff = sb ? sb->off + si * sb->stride : sk;
            dt__copy_rows((char *)dst + doff * es, (db ? db->stride : L) * es,
                          (const char *)src + soff * es, (sb ? sb->stride : L) * es, rows, L * es);
            m -= rows * L;
            if (db)
                di += rows;
            else
                dk += rows * L;
            if (sb)
                si += rows;
            else
                sk += rows * L;
            continue;
        }
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

/* A cursor over elements [a, a + m) of one layout: run index i, offset k
 * within the run, elements left. */
typedef struct {
    size_t i, k, left;
} blk_cur;

/* Lockstep copies between W layouts of one buffer and W contiguous
 * buffers: run i of block 0, run i of block 1, ..., then run i+1. When the
 * blocks interleave (a gather or scatter along an inner dim: block j's run
 * i sits beside block j+1's run i), the layout side is then walked in
 * address order, one pass, instead of W passes each touching every page
 * with gaps. While every block with elements left is at the start of a run
 * of one common length and stride, their whole runs go in one lockstep row
 * copy (dt__copy_rows_multi: the row loop inside, no call per run); a run
 * begun or left short by [a, a + m) alone is a step of its own.
 * to_layout: contiguous -> layout (the copy-out of an all-gather into
 * rblocks), else layout -> contiguous (the copy-in of sblocks). */
static void blk_lockstep(char *lay, const dt_pg_block *b, char *const *con, size_t a,
                         const size_t *m, int W, size_t es, int to_layout)
{
    enum { MAXW = 64 };
    blk_cur cur[MAXW];
    size_t done[MAXW];
    if (W > MAXW) { /* more blocks than the cursors: one block after the other */
        for (int j = 0; j < W; j++)
            if (to_layout)
                dt__blk_copy(lay, &b[j], a, con[j], NULL, 0, m[j], es);
            else
                dt__blk_copy(con[j], NULL, 0, lay, &b[j], a, m[j], es);
        return;
    }
    int live = 0;
    for (int j = 0; j < W; j++) {
        size_t run = b[j].run ? b[j].run : 1;
        cur[j] = (blk_cur){a / run, a % run, m[j]};
        done[j] = 0;
        live += m[j] > 0;
    }
    while (live) {
        /* whole runs of one shape in every live block: one lockstep copy */
        void *lp[MAXW], *cp[MAXW];
        int nb = 0, j0 = -1;
        size_t rows = SIZE_MAX;
        for (int j = 0; j < W; j++) {
            if (!cur[j].left)
                continue;
            if (j0 < 0)
                j0 = j;
            if (cur[j].k || b[j].run != b[j0].run || b[j].stride != b[j0].stride ||
                cur[j].left < b[j].run)
                break;
            size_t r = cur[j].left / b[j].run;
            rows = r < rows ? r : rows;
            lp[nb] = lay + (b[j].off + cur[j].i * b[j].stride) * es;
            cp[nb] = con[j] + done[j] * es;
            nb++;
        }
        if (nb == live) {
            size_t run = b[j0].run, str = b[j0].stride;
            if (to_layout)
                dt__copy_rows_multi(lp, str * es, (const void *const *)cp, run * es, nb, rows,
                                    run * es);
            else
                dt__copy_rows_multi(cp, run * es, (const void *const *)lp, str * es, nb, rows,
                                    run * es);
            for (int j = 0; j < W; j++) {
                if (!cur[j].left)
                    continue;
                cur[j].i += rows;
                done[j] += rows * run;
                cur[j].left -= rows * run;
                live -= !cur[j].left;
            }
            continue;
        }
        for (int j = 0; j < W; j++) { /* one run (or its rest) of each block */
            blk_cur *c = &cur[j];
            if (!c->left)
                continue;
            size_t n = b[j].run - c->k < c->left ? b[j].run - c->k : c->left;
            char *l = lay + (b[j].off + c->i * b[j].stride + c->k) * es;
            char *q = con[j] + done[j] * es;
            if (to_layout)
                memcpy(l, q, n * es);
            else
                memcpy(q, l, n * es);
            done[j] += n;
            c->left -= n;
            c->k = 0;
            c->i++;
            live -= !c->left;
        }
    }
}

void dt__blk_scatter(void *dst, const dt_pg_block *db, const void *const *srcs, size_t a,
                     const size_t *m, int W, size_t es)
{
    blk_lockstep(dst, db, (char *const *)srcs, a, m, W, es, 1);
}

void dt__blk_gather(void *const *dsts, const void *src, const dt_pg_block *sb, size_t a,
                    const size_t *m, int W, size_t es)
{
    blk_lockstep((char *)src, sb, (char *const *)dsts, a, m, W, es, 0);
}
