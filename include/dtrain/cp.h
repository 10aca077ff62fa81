/* dtrain/cp.h — context parallelism: attention over a sequence split across
 * the ranks of a group.
 *
 * A long sequence does not fit one rank's activations, whatever the
 * sharding of the weights. Context parallelism gives each of the P ranks of
 * a `cp` group T/P of the sequence's positions; everything but attention
 * (norms, MLP, the loss) runs on those rows alone, and attention, the one
 * place where a position looks at the others, runs as ring attention: the
 * keys and values travel around the ring, one block per step (P steps),
 * each rank adding the attention of its queries to the block it holds and
 * merging the partial results with the log-sum-exp rule
 * (dt_k_attention_part_fwd, kernels.h). The result equals attention over the
 * whole sequence up to rounding; the backward sends the keys and values
 * around once more, each block's dk/dv travelling with it back to its owner.
 *
 * Causal load balancing: under a causal mask the early positions see few
 * keys, so with plain chunks rank 0 idles while rank P-1 works. With
 * `balance`, the sequence is cut into 2P chunks and rank r holds chunks r
 * and 2P-1-r (for P = 2 and T = 8: rank 0 holds positions 0,1,6,7, rank 1
 * 2,3,4,5), so every rank has the same work; the layout tells which global
 * position each local row has (position ids, rotary tables and labels follow
 * it). The blocks that the mask hides entirely are skipped, not computed.
 *
 *     dt_cp_layout L;
 *     dt_cp_layout_make(dt_pg_rank(cp), dt_pg_size(cp), T, true, &L);  // T % (2P) == 0
 *     // local rows: for i < L.local_len, global position dt_cp_position(&L, i)
 *     dt_cp_attention_fwd(cp, &L, qkv, B, H, D, true, y, lse);        // qkv (B, Tl, 3C)
 *     ...
 *     dt_cp_attention_bwd(cp, &L, qkv, y, lse, dy, B, H, D, true, dqkv);
 *
 * dt_cp_ulysses_fwd/bwd (below) are the all-to-all variant with the same
 * arguments. Both calls are collective over the group (every rank, the same B, H, D,
 * T, balance and causal). f32, no dropout on the probabilities. */
#ifndef DTRAIN_CP_H
#define DTRAIN_CP_H

#include "dtrain/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which positions a rank holds: nchunks (1, or 2 when balanced) chunks of
 * chunk rows each, chunk c starting at global position start[c]; the local
 * rows are the chunks in that order (local_len = nchunks * chunk = T / P). */
typedef struct dt_cp_layout {
    int rank, size;
    bool balance;
    int64_t T, local_len, chunk;
    int nchunks;
    int64_t start[2];
} dt_cp_layout;

/* The layout of rank `rank` of `size` for a sequence of T positions. T must
 * divide into size chunks (2 size when balanced): DT_ERR_INVALID_ARG naming
 * T and the degree otherwise (uneven chunks are refused). */
DT_API dt_status dt_cp_layout_make(int rank, int size, int64_t T, bool balance, dt_cp_layout *out);
/* The global position of local row i (0 <= i < local_len); -1 outside. */
DT_API int64_t dt_cp_position(const dt_cp_layout *l, int64_t i);

/* Ring attention forward. qkv (B, local_len, 3C) with C = H D (q | k | v
 * side by side per row, as dt_k_attention_fwd takes), the rank's rows in
 * the layout's order. Writes y (B, local_len, C) and lse (B, H, local_len),
 * the log-sum-exp of each row's scaled scores over the WHOLE sequence (the
 * backward's input). */
DT_API dt_status dt_cp_attention_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                     int64_t D, bool causal, float *y, float *lse);
/* Ring attention backward: dqkv (B, local_len, 3C) WRITTEN (not added) from
 * the forward's qkv, y, lse and dy (B, local_len, C). */
DT_API dt_status dt_cp_attention_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                     const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, bool causal,
                                     float *dqkv);

/* DeepSpeed-Ulysses' variant, the same contract: one all-to-all turns the
 * rank's rows of every head into the whole sequence of H/P heads, attention
 * runs there locally, and the inverse all-to-all brings y (and lse) back to
 * the rank's rows; the backward exchanges qkv, y, lse and dy the same way
 * and dqkv back. Fewer, larger messages than the ring (4 all-to-alls of
 * T/P rows per layer), but the heads must divide by P (DT_ERR_INVALID_ARG
 * naming both otherwise) and a rank holds the whole sequence of its heads
 * during attention. */
DT_API dt_status dt_cp_ulysses_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                   int64_t D, bool causal, float *y, float *lse);
DT_API dt_status dt_cp_ulysses_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                   const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, bool causal,
                                   float *dqkv);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CP_H */
