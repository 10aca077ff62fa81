/* The strided row copy (src/base/copy.h) and the block-layout copies built
 * on it (src/comm/blocks.c), against element-by-element references:
 *  - dt__copy_rows for row widths 1..300 bytes (under, at and past the
 *    32- and 128-byte steps), strides wider than the rows on either side,
 *    odd start addresses; bytes outside the rows stay untouched (guard
 *    bytes around every row and after the last);
 *  - dt__blk_copy layout -> contiguous, contiguous -> layout and layout ->
 *    layout (same and different runs), from element positions inside a run
 *    (a begun first run, a short last one);
 *  - dt__blk_gather / dt__blk_scatter with W interleaved blocks from a
 *    position inside a run, rows beyond one tile (many rows of a narrow
 *    stride) and unequal counts.
 * isa_scalar/test_copy_rows runs it again with DT_MAX_CPU_ISA=scalar (the
 * memcpy fallback). */
#include "base/copy.h"
#include "comm/backend.h"
#include "test.h"

#include <stdint.h>

static unsigned char pat(size_t i) { return (unsigned char)(i * 131u + 7u); }

TEST(copy_rows_widths)
{
    size_t widths[] = {1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 96, 127, 128, 129, 160, 255, 256, 300};
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        size_t w = widths[wi];
        for (int shape = 0; shape < 4; shape++) {
            size_t rows = shape == 3 ? 1 : 37;
            size_t ss = shape == 0 ? w : w + 5 + (size_t)shape * 3; /* source stride */
            size_t ds = shape == 1 ? w : w + 11;                    /* destination stride */
            size_t soff = 3, doff = 1; /* odd addresses */
            size_t sn = soff + rows * ss + 64, dn = doff + rows * ds + 64;
            unsigned char *src = malloc(sn), *dst = malloc(dn), *ref = malloc(dn);
            ASSERT(src && dst && ref);
            for (size_t i = 0; i < sn; i++)
                src[i] = pat(i);
            memset(dst, 0xA5, dn);
            memset(ref, 0xA5, dn);
            for (size_t r = 0; r < rows; r++)
                for (size_t b = 0; b < w; b++)
                    ref[doff + r * ds + b] = src[soff + r * ss + b];
            dt__copy_rows(dst + doff, ds, src + soff, ss, rows, w);
            int same = memcmp(dst, ref, dn) == 0;
            if (!same)
                fprintf(stderr, "width %zu shape %d: differs\n", w, shape);
            free(src);
            free(dst);
            free(ref);
            ASSERT(same);
        }
    }
    /* nothing to do: no write */
    unsigned char z = 9;
    dt__copy_rows(&z, 1, "x", 1, 0, 1);
    dt__copy_rows(&z, 1, "x", 1, 5, 0);
    ASSERT_EQ_INT(z, 9);
}

/* Element e (0-based, run by run) of layout b, as an element index. */
static size_t lay_at(const dt_pg_block *b, size_t e)
{
    return b ? b->off + (e / b->run) * b->stride + e % b->run : e;
}

static int check_blk(const dt_pg_block *db, size_t da, const dt_pg_block *sb, size_t sa, size_t m,
                     size_t es)
{
    size_t n = 1 << 16;
    unsigned char *src = malloc(n * es), *dst = malloc(n * es), *ref = malloc(n * es);
    if (!src || !dst || !ref)
        return 0;
    for (size_t i = 0; i < n * es; i++)
        src[i] = pat(i);
    memset(dst, 0x5A, n * es);
    memset(ref, 0x5A, n * es);
    for (size_t e = 0; e < m; e++)
        memcpy(ref + lay_at(db, da + e) * es, src + lay_at(sb, sa + e) * es, es);
    dt__blk_copy(dst, db, da, src, sb, sa, m, es);
    int ok = memcmp(dst, ref, n * es) == 0;
    free(src);
    free(dst);
    free(ref);
    return ok;
}

TEST(blk_copy_layouts)
{
    dt_pg_block a = {.off = 5, .runs = 40, .run = 12, .stride = 30};
    dt_pg_block b = {.off = 2, .runs = 60, .run = 12, .stride = 17};
    dt_pg_block c = {.off = 0, .runs = 48, .run = 10, .stride = 21};
    size_t es_list[] = {1, 2, 4, 8};
    for (int ei = 0; ei < 4; ei++) {
        size_t es = es_list[ei];
        for (size_t start = 0; start < 14; start += 5) {
            for (size_t m = 1; m <= 400; m += 37) {
                ASSERT(check_blk(NULL, 3, &a, start, m, es)); /* layout -> contiguous */
                ASSERT(check_blk(&a, start, NULL, 7, m, es)); /* contiguous -> layout */
                ASSERT(check_blk(&b, start, &a, start, m, es)); /* same runs, same phase */
                ASSERT(check_blk(&b, start + 1, &a, start, m, es)); /* same runs, shifted */
                ASSERT(check_blk(&c, start, &a, start, m, es)); /* different runs */
            }
        }
    }
}

/* W interleaved blocks (a gather along an inner dim: [rows, W * run]). */
static int check_lockstep(int W, size_t rows, size_t run, size_t a, int uneven, size_t es, int gather)
{
    size_t stride = (size_t)W * run, n = rows * stride;
    dt_pg_block b[8];
    size_t m[8];
    unsigned char *lay = malloc(n * es), *ref = malloc(n * es), *con[8], *cref[8];
    if (!lay || !ref)
        return 0;
    for (int j = 0; j < W; j++) {
        b[j] = (dt_pg_block){.off = (size_t)j * run, .runs = rows, .run = run, .stride = stride};
        m[j] = rows * run - a - (uneven ? (size_t)j * 3 % (rows * run - a) : 0);
        con[j] = malloc(rows * run * es);
        cref[j] = malloc(rows * run * es);
        if (!con[j] || !cref[j])
            return 0;
        for (size_t i = 0; i < rows * run * es; i++)
            con[j][i] = cref[j][i] = gather ? 0x33 : pat(i + (size_t)j * 1000);
    }
    for (size_t i = 0; i < n * es; i++)
        lay[i] = ref[i] = gather ? pat(i) : 0x44;
    for (int j = 0; j < W; j++)
        for (size_t e = 0; e < m[j]; e++) {
            if (gather)
                memcpy(cref[j] + e * es, ref + lay_at(&b[j], a + e) * es, es);
            else
                memcpy(ref + lay_at(&b[j], a + e) * es, cref[j] + e * es, es);
        }
    if (gather)
        dt__blk_gather((void *const *)con, lay, b, a, m, W, es);
    else
        dt__blk_scatter(lay, b, (const void *const *)con, a, m, W, es);
    int ok = memcmp(lay, ref, n * es) == 0;
    for (int j = 0; j < W; j++) {
        ok = ok && memcmp(con[j], cref[j], rows * run * es) == 0;
        free(con[j]);
        free(cref[j]);
    }
    free(lay);
    free(ref);
    return ok;
}

TEST(blk_gather_scatter_lockstep)
{
    for (int gather = 0; gather < 2; gather++)
        for (int W = 1; W <= 8; W += 3)
            for (size_t run = 1; run <= 70; run += 23)
                for (size_t a = 0; a < 2 * run; a += run / 2 + 1) {
                    /* 3000 rows of a narrow stride: more rows than one tile */
                    ASSERT(check_lockstep(W, 3000 / run + 3, run, a, 0, 4, gather));
                    ASSERT(check_lockstep(W, 9, run, a, 1, 2, gather));
                    ASSERT(check_lockstep(W, 5, run, a, 1, 8, gather));
                }
}

int main(void)
{
    RUN(copy_rows_widths);
    RUN(blk_copy_layouts);
    RUN(blk_gather_scatter_lockstep);
    return TEST_REPORT();
}
