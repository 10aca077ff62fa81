/* tests/isa_paths.h — the vector paths of dtrain's kernels that a test runs
 * its cases on, lowest first: the scalar code, AVX2, AVX-512 and
 * AVX512_BF16. A path the CPU lacks (or DT_MAX_CPU_ISA caps) is refused by
 * dt_k_set_isa and skipped:
 *
 *     for (size_t p = 0; p < TEST_NISA; p++) {
 *         if (dt_k_set_isa(test_isa_paths[p]) != DT_OK)
 *             continue;
 *         ... the case on this path ...
 *     }
 *     dt_k_set_isa(DT_K_ISA_AUTO);
 */
#ifndef DT_TEST_ISA_PATHS_H
#define DT_TEST_ISA_PATHS_H

#include "dtrain/kernels.h"

#include <stddef.h>

static const dt_k_isa test_isa_paths[] = {DT_K_ISA_SCALAR, DT_K_ISA_AVX2, DT_K_ISA_AVX512, DT_K_ISA_AVX512_BF16};
#define TEST_NISA (sizeof test_isa_paths / sizeof test_isa_paths[0])

#endif
