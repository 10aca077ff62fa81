/* Strided block layouts (comm.h, dt_pg_block): copies between a layout and
 * contiguous memory, shared by the group layer's pack/unpack (coll.c) and
 * the shm backend, which copies to and from layouts directly. */
#include "comm/backend.h"

#include "base/copy.h"

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
 * buffers: step t copies, for each block j in turn, its next rows (up to
 * a tile of whole runs in one strided row copy, dt__copy_rows; a run
 * begun or left short by [a, a + m) alone). When the blocks interleave (a
 * gather or scatter along an inner dim: block j's run i sits beside block
 * j+1's run i), a tile of every block covers one stretch of the layout
 * (about 64 KiB, so it stays in cache between the blocks), walked in
 * address order, instead of W passes each touching every page with gaps.
 * to_layout: contiguous -> layout (the copy-out of an all-gather into
 * rblocks), else layout -> contiguous (the copy-in of sblocks). */
static void blk_lockstep(char *lay, const dt_pg_block *b, char *const *con, size_t a,
                         const size_t *m, int W, size_t es, int to_layout)
{
    enum { MAXW = 64, TILE_BYTES = 64 << 10 };
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
    size_t span = 1; /* the widest stride, bytes: a tile is TILE_BYTES of it */
    for (int j = 0; j < W; j++) {
        size_t run = b[j].run ? b[j].run : 1;
        cur[j] = (blk_cur){a / run, a % run, m[j]};
        done[j] = 0;
        live += m[j] > 0;
        if (m[j] && b[j].stride * es > span)
            span = b[j].stride * es;
    }
    size_t tile = TILE_BYTES / span ? TILE_BYTES / span : 1;
    while (live) {
        for (int j = 0; j < W; j++) {
            blk_cur *c = &cur[j];
            if (!c->left)
                continue;
            size_t run = b[j].run;
            char *lp = lay + (b[j].off + c->i * b[j].stride + c->k) * es;
            char *cp = con[j] + done[j] * es;
            size_t rows = c->k == 0 ? c->left / run : 0, n;
            if (rows > tile)
                rows = tile;
            if (rows) { /* whole runs */
                if (to_layout)
                    dt__copy_rows(lp, b[j].stride * es, cp, run * es, rows, run * es);
                else
                    dt__copy_rows(cp, run * es, lp, b[j].stride * es, rows, run * es);
                n = rows * run;
                c->i += rows;
            } else { /* the rest of a begun run, or a short last one */
                n = run - c->k < c->left ? run - c->k : c->left;
                if (to_layout)
                    memcpy(lp, cp, n * es);
                else
                    memcpy(cp, lp, n * es);
                c->k = 0;
                c->i++;
            }
            done[j] += n;
            c->left -= n;
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
