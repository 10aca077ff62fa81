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

/* Print the failed condition `text` with the rank, the place and the
 * message, and count it. */
#define RANK_CHECK_FAILED_(text, ...)                                                     \
    do {                                                                                  \
        fprintf(stderr, "[rank %d] %s:%d: %s: ", g_rank, __FILE__, __LINE__, text);       \
        fprintf(stderr, __VA_ARGS__);                                                     \
        fprintf(stderr, "\n");                                                            \
        g_fail++;                                                                         \
    } while (0)

#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond))                                                                      \
            RANK_CHECK_FAILED_(#cond, __VA_ARGS__);                                       \
    } while (0)

/* The same, then returns from the calling (void) function: for checks
 * after which the function's later steps would read what failed. */
#define CHECK_RET(cond, ...)                                                              \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            RANK_CHECK_FAILED_(#cond, __VA_ARGS__);                                       \
            return;                                                                       \
        }                                                                                 \
    } while (0)

#endif
