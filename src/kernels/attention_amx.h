/* src/kernels/attention_amx.h — the attention's products on the AMX tiles
 * (attention.c), for the tests. Private to src/kernels and the tests. */
#ifndef DT_KERNELS_ATTENTION_AMX_H
#define DT_KERNELS_ATTENTION_AMX_H

#include "kernels/amx_tiles.h"

#include <stdbool.h>
#include <stdint.h>

/* Run the attention over a bf16 qkv on `tiles` (the portable model, or the
 * hardware) whatever the CPU, the ISA path and DT_ATTN_AMX say; NULL: back
 * to the run-time choice. Not thread-safe: set it between calls. */
void dt__attention_amx_force(const dt__amx_tiles *tiles);
/* off: no tiles for any qkv (the rows run, as with DT_ATTN_AMX=off) unless
 * forced above; false: back to the run-time choice. Between calls too. */
void dt__attention_amx_disable(bool off);

/* Tasks (a forward task: a head's block of query rows; a backward one: a
 * head) run on the tiles, and those that took the other path instead
 * because their q, k, v or dy hold a non-finite value, since process
 * start. */
typedef struct {
    uint64_t tasks, fallbacks;
} dt__attention_amx_stats;
void dt__attention_amx_stats_get(dt__attention_amx_stats *out);

#endif
