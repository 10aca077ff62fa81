/* CHECK for test programs whose ranks are processes started by mpirun or
 * `dtrain run` (one program per rank, not the fork harness of
 * test_harness.h): a failed condition prints the rank, the place and the
 * message, counts in g_fail and goes on (the program ends with g_fail's
 * verdict after its collectives, so no rank leaves its peers waiting).
 * The including file sets g_rank. */
#ifndef DT_TESTS_RANK_CHECK_H
#define DT_TESTS_RANK_CHECK_H

#include <stdio.h>

static int g_rank, g_fail;

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                 \
            fprintf(stderr, "\n");                                                        \
            g_fail++;                                                                     \
        }                                                                                 \
    } while (0)

#endif
