/* dtrain/zeropp.h — communication with fewer bytes across machines
 * (DeepSpeed ZeRO++'s collectives).
 *
 * Between machines the network is the step's bottleneck. ZeRO++ cuts the
 * bytes that cross it two ways, and these are its collectives:
 *
 *  - qwZ, the quantized weight all-gather: each rank's shard goes out as
 *    int8 with one f32 scale per block of `block` elements
 *    (dt_k_quantize_blocks) and is dequantized on arrival: a quarter of the
 *    f32 bytes (plus the scales). The master weights stay as they are; only
 *    the gathered copy used by forward and backward carries the rounding.
 *  - qgZ, the quantized hierarchical gradient reduce-scatter: the gradient
 *    pieces are quantized (int4 or int8), exchanged inside each machine with
 *    one all-to-all and summed in f32, then quantized again and exchanged
 *    between machines with a second all-to-all, where each rank sums the
 *    machines' partial sums of its own piece in f32. Only each machine's
 *    partial sum of a piece crosses the network, quantized: with int4, 1/8
 *    of an f32 reduce-scatter's cross-machine bytes divided by the ranks per
 *    machine.
 *
 * Every sum runs in a fixed order (local ranks, then machines, in rank
 * order), so results are reproducible; a NaN or infinity anywhere in a
 * piece makes that piece NaN on its owner (never hidden by quantization).
 * No error feedback (DeepSpeed's qgZ has none; LoCo's is not built).
 *
 *     dt_zpp *z;
 *     dt_zpp_init(world, &z);                     // collective: finds the machines
 *     dt_zpp_allgather_q8(world, shard, n, 2048, full);        // full: W n floats
 *     dt_zpp_reduce_scatter_q(z, grads, mine, n, 2048, 4, true); // grads: W n, mine: n (average)
 *     dt_zpp_free(z);
 *
 * The machines come from dt_pg_topology (comm.h; $DT_SIM_LOCAL_SIZE
 * simulates them on one machine); the ranks must be numbered machine by
 * machine with the same number on each (DT_ERR_UNSUPPORTED naming the
 * layout otherwise), as mpirun and `dtrain run --nodes` number them. */
#ifndef DTRAIN_ZEROPP_H
#define DTRAIN_ZEROPP_H

#include "dtrain/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_zpp dt_zpp;

/* The machines of pg and a group inside each (local) and one across them
 * (ranks with the same local index). Collective over pg. Free before pg. */
DT_API dt_status dt_zpp_init(dt_pg *pg, dt_zpp **out);
DT_API void dt_zpp_free(dt_zpp *z);
/* The layout found: machines and ranks per machine. */
DT_API int dt_zpp_nodes(const dt_zpp *z);
DT_API int dt_zpp_local_size(const dt_zpp *z);

/* hpZ's placement check (collective over pg, one small all-gather): hpz
 * ranks in a row must be one machine's: DT_ERR_INVALID_ARG when hpz does
 * not divide pg's size, or (several machines, real or simulated) differs
 * from the ranks per machine; hpz <= 1 is DT_OK without communicating.
 * With one machine any divisor passes (everything stays inside it). */
DT_API dt_status dt_zpp_hpz_check(dt_pg *pg, int hpz);

/* qwZ: out (W n) = every rank's shard (n each, in rank order), sent as int8
 * blocks of `block` elements and dequantized: out's piece r is within half
 * a block scale (max |x| / 127 over the block) of rank r's shard. */
DT_API dt_status dt_zpp_allgather_q8(dt_pg *pg, const float *shard, size_t n, int64_t block, float *out);

/* qgZ: out (n) = the sum (average: / W) over the ranks of piece `rank` of
 * their in (W n floats, piece p for rank p), quantized to `bits` (4 or 8)
 * in blocks of `block` at each of the two hops and summed in f32. */
DT_API dt_status dt_zpp_reduce_scatter_q(dt_zpp *z, const float *in, float *out, size_t n, int64_t block, int bits,
                                         bool average);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ZEROPP_H */
