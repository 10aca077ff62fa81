/* copy_rows — the strided row copy (src/base/copy.h, dt__copy_rows) against
 * memcpy: the copy a reshard's local slice R -> S(d) and the shm backend's
 * _blocks collectives make (a column block of a row-major matrix).
 *
 *     build/bench/copy_rows [--bytes MiB] [--reps N]
 *
 * For each row width (bytes) and world size W: copy column block 1 of a
 * [rows, W * width] matrix (rows * width = --bytes, default 2 MiB) into a
 * packed [rows, width] buffer three ways, interleaved repetition by
 * repetition (A B C A B C ...): dt__copy_rows, memcpy per row (what the
 * library did before), and one memcpy of the same number of bytes from a
 * contiguous source (the floor). Then the shm backend's copy-in of a
 * _blocks collective: all W column blocks into W packed buffers, by
 * dt__blk_gather (lockstep row copy) against memcpy per run in the same
 * order (what it did before) and one memcpy of the same bytes. Prints the
 * minimum CPU time of each and the ratios to the one memcpy; the copies
 * are checked equal. */
#include "base/copy.h"
#include "comm/backend.h"

#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int64_t mib = 2, reps = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        int64_t *t = !strcmp(argv[i], "--bytes") ? &mib : !strcmp(argv[i], "--reps") ? &reps : NULL;
        if (!t || dt_parse_int(argv[i], argv[i + 1], 1, 1 << 12, t) < 0) {
            fprintf(stderr, "usage: copy_rows [--bytes MiB] [--reps N]\n");
            return 2;
        }
    }
    size_t total = (size_t)mib << 20;
    size_t widths[] = {16, 64, 256, 512, 2048, 8192};
    int ws[] = {2, 8};
    char *src = malloc(8 * total), *d1 = malloc(total), *d2 = malloc(total), *d3 = malloc(total);
    if (!src || !d1 || !d2 || !d3)
        return 1;
    for (size_t i = 0; i < 8 * total; i++)
        src[i] = (char)(i * 7);
    memset(d1, 0, total), memset(d2, 0, total), memset(d3, 0, total);
    printf("copy_rows: %lld MiB out of a [rows, W * width] matrix, min CPU time of %lld\n",
           (long long)mib, (long long)reps);
    printf("  %6s %2s %8s  %10s %10s %10s  %8s %8s  %8s\n", "width", "W", "rows", "copy_rows",
           "memcpy/row", "1 memcpy", "cr/1mc", "row/1mc", "GB/s cr");
    for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++)
        for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
            size_t w = widths[k], rows = total / w, stride = (size_t)ws[wi] * w;
            const char *s = src + w; /* column block 1 */
            double best[3] = {1e30, 1e30, 1e30};
            for (int64_t r = 0; r < reps; r++)
                for (int v = 0; v < 3; v++) {
                    double t0 = cpu_s();
                    if (v == 0)
                        dt__copy_rows(d1, w, s, stride, rows, w);
                    else if (v == 1)
                        for (size_t i = 0; i < rows; i++)
                            memcpy(d2 + i * w, s + i * stride, w);
                    else
                        memcpy(d3, src + (size_t)r % 4 * 64, total);
                    double t = cpu_s() - t0;
                    best[v] = t < best[v] ? t : best[v];
                }
            if (memcmp(d1, d2, total) != 0) {
                fprintf(stderr, "width %zu: dt__copy_rows and memcpy differ\n", w);
                return 1;
            }
            printf("  %6zu %2d %8zu  %8.1fus %8.1fus %8.1fus  %8.2f %8.2f  %8.2f\n", w, ws[wi], rows,
                   best[0] * 1e6, best[1] * 1e6, best[2] * 1e6, best[0] / best[2], best[1] / best[2],
                   (double)total / best[0] * 1e-9);
        }
    printf("  all W blocks (dt__blk_gather, lockstep):\n");
    printf("  %6s %2s %8s  %10s %10s %10s  %8s %8s\n", "width", "W", "rows", "blk_gather",
           "memcpy/run", "1 memcpy", "bg/1mc", "run/1mc");
    for (size_t wi = 0; wi < sizeof ws / sizeof ws[0]; wi++)
        for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++) {
            int W = ws[wi];
            size_t w = widths[k], rows = total / w / (size_t)W, stride = (size_t)W * w;
            dt_pg_block b[8];
            size_t m[8];
            void *g1[8], *g2[8];
            for (int j = 0; j < W; j++) {
                b[j] = (dt_pg_block){.off = (size_t)j * w, .runs = rows, .run = w, .stride = stride};
                m[j] = rows * w;
                g1[j] = d1 + (size_t)j * rows * w;
                g2[j] = d2 + (size_t)j * rows * w;
            }
            double best[3] = {1e30, 1e30, 1e30};
            for (int64_t r = 0; r < reps; r++)
                for (int v = 0; v < 3; v++) {
                    double t0 = cpu_s();
                    if (v == 0)
                        dt__blk_gather(g1, src, b, 0, m, W, 1);
                    else if (v == 1)
                        for (size_t i = 0; i < rows; i++)
                            for (int j = 0; j < W; j++)
                                memcpy((char *)g2[j] + i * w, src + i * stride + (size_t)j * w, w);
                    else
                        memcpy(d3, src + (size_t)r % 4 * 64, rows * w * (size_t)W);
                    double t = cpu_s() - t0;
                    best[v] = t < best[v] ? t : best[v];
                }
            if (memcmp(d1, d2, rows * w * (size_t)W) != 0) {
                fprintf(stderr, "width %zu: dt__blk_gather and memcpy differ\n", w);
                return 1;
            }
            printf("  %6zu %2d %8zu  %8.1fus %8.1fus %8.1fus  %8.2f %8.2f\n", w, W, rows,
                   best[0] * 1e6, best[1] * 1e6, best[2] * 1e6, best[0] / best[2], best[1] / best[2]);
        }
    free(src), free(d1), free(d2), free(d3);
    return 0;
}
