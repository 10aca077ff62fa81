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
 * T, balance and causal). f32; dropout on the probabilities through the
 * _heads variants (dt_cp_attention_heads_fwd, dt_cp_ulysses_heads_fwd). */
#ifndef DTRAIN_CP_H
#define DTRAIN_CP_H

#include "dtrain/autograd.h"
#include "dtrain/comm.h"
#include "dtrain/tensor.h"

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
/* Ring attention over heads [h0, h0 + H) of a layer of Ht heads (tensor
 * parallelism: the rank's heads; h0 0, Ht H: the functions above) with
 * dropout on the probabilities (p in [0, 1); 0 none): each block of the
 * ring draws its part of the full layer's mask over the whole sequence
 * (dt_k_att_drop: element (b, h0 + h, i, j) at global positions i, j, as
 * dt_k_attention_fwd_heads draws it), so the group draws exactly the
 * single-process mask and the backward regenerates it. p outside [0, 1), or
 * heads not inside the layer: DT_ERR_INVALID_ARG before any exchange. */
DT_API dt_status dt_cp_attention_heads_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                           int64_t D, int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key,
                                           float *y, float *lse);
DT_API dt_status dt_cp_attention_heads_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                           const float *lse, const float *dy, int64_t B, int64_t H, int64_t D,
                                           int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv);
/* Ring attention, causal, with a sliding window (> 0: query i sees the
 * keys (i - window, i]; 0 none) and soft-capped scores (cap > 0: cap tanh(s
 * / cap) before the softmax; 0 none), as dt_k_attention_window_fwd/bwd
 * compute them on the whole sequence: the key blocks before every row's
 * window cost nothing (still passed around). Mistral's, Qwen2's, Gemma 2's
 * and 3's attention. A window < 0 or a cap < 0 or not finite:
 * DT_ERR_INVALID_ARG before any exchange. */
DT_API dt_status dt_cp_attention_window_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                            int64_t D, int64_t window, float cap, float *y, float *lse);
DT_API dt_status dt_cp_attention_window_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                            const float *lse, const float *dy, int64_t B, int64_t H, int64_t D,
                                            int64_t window, float cap, float *dqkv);

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
/* Ulysses over heads [h0, h0 + H) of a layer of Ht heads with dropout, as
 * dt_cp_attention_heads_fwd/bwd: each rank's heads of the whole sequence
 * draw their part of the full layer's mask (dt_k_attention_fwd_heads). */
DT_API dt_status dt_cp_ulysses_heads_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                         int64_t D, int64_t h0, int64_t Ht, bool causal, float p, dt_rng_key key,
                                         float *y, float *lse);
DT_API dt_status dt_cp_ulysses_heads_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                         const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0,
                                         int64_t Ht, bool causal, float p, dt_rng_key key, float *dqkv);
/* Ulysses' causal attention with a sliding window and soft-capped scores,
 * as dt_cp_attention_window_fwd/bwd take them, computed by
 * dt_k_attention_window_fwd/bwd on the whole sequence of the rank's heads. */
DT_API dt_status dt_cp_ulysses_window_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                          int64_t D, int64_t window, float cap, float *y, float *lse);
DT_API dt_status dt_cp_ulysses_window_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                          const float *lse, const float *dy, int64_t B, int64_t H, int64_t D,
                                          int64_t window, float cap, float *dqkv);
/* Both attentions with every argument at once, the general form of the
 * pairs above: heads [h0, h0 + H) of a layer of Ht, the causal mask or
 * none, a sliding window and a soft cap (causal only), and dropout p with
 * its key, the whole sequence's mask of dt_k_attention_ex_fwd (the ring's
 * blocks each their part, dt_k_att_drop; Ulysses' kernel the rank's heads'
 * after the exchange). Every argument checked before any exchange. */
DT_API dt_status dt_cp_attention_ex_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                        int64_t D, int64_t h0, int64_t Ht, bool causal, int64_t window, float cap,
                                        float p, dt_rng_key key, float *y, float *lse);
DT_API dt_status dt_cp_attention_ex_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                        const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0,
                                        int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                                        float *dqkv);
DT_API dt_status dt_cp_ulysses_ex_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H,
                                      int64_t D, int64_t h0, int64_t Ht, bool causal, int64_t window, float cap,
                                      float p, dt_rng_key key, float *y, float *lse);
DT_API dt_status dt_cp_ulysses_ex_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y,
                                      const float *lse, const float *dy, int64_t B, int64_t H, int64_t D, int64_t h0,
                                      int64_t Ht, bool causal, int64_t window, float cap, float p, dt_rng_key key,
                                      float *dqkv);

/* ---- context parallelism in a model -------------------------------------------------
 *
 * A model trained with context parallelism (dt_model_config.cp, models.h;
 * `dtrain train --cp N`) takes the whole sequence [B, T] on every rank of
 * the group, keeps the rank's rows (dt_cp_local_rows: chunks r and 2P-1-r
 * balanced, chunk r plain), gives its position embeddings / rotary
 * tables the global positions of those rows (dt_cp_position), runs every
 * attention through dt_cp_attention and everything else on the local rows,
 * and takes the loss over the whole sequence (dt_cp_loss). The ranks of a
 * cp group hold replicas of the parameters: the gradient reduction runs
 * over dp x cp ranks (plan.h). */

/* Which attention runs over the group. */
typedef enum {
    DT_CP_RING = 0, /* ring attention (dt_cp_attention_fwd), any head count */
    DT_CP_ULYSSES,  /* DeepSpeed-Ulysses' all-to-all (dt_cp_ulysses_fwd); heads % cp == 0 */
    DT_CP_IMPL_COUNT
} dt_cp_impl;
/* "ring", "ulysses" ("?" outside the enum). */
DT_API const char *dt_cp_impl_name(dt_cp_impl impl);
/* The name into *out; DT_ERR_INVALID_ARG naming it otherwise. */
DT_API dt_status dt_cp_impl_parse(const char *s, dt_cp_impl *out);

/* A model's context parallelism. */
typedef struct dt_cp_params {
    dt_pg *group;     /* the cp group (borrowed; outlives the model); NULL or one rank: none. Default NULL */
    dt_cp_impl impl;  /* ring or Ulysses; default DT_CP_RING */
    bool balance;     /* the 2 x cp chunks of the causal load balance (rank r: chunks r and 2P-1-r);
                         default true */
} dt_cp_params;
DT_API dt_cp_params dt_cp_params_default(void);

/* Whether a sequence of T positions and n_head heads (of this rank: after
 * tensor parallelism's split) runs under p: T a multiple of cp (2 cp when
 * balanced), heads a multiple of cp for Ulysses. DT_ERR_INVALID_ARG naming
 * the numbers and the fix; DT_OK without a group. */
DT_API dt_status dt_cp_check(const dt_cp_params *p, int64_t T, int64_t n_head);
/* This rank's layout of T positions under p (dt_cp_layout_make). */
DT_API dt_status dt_cp_layout_of(const dt_cp_params *p, int64_t T, dt_cp_layout *out);
/* The rank's rows of x [B, T, ...] (dim 1 the sequence, T = l->T), in the
 * layout's order: a contiguous temporary [B, local_len, ...] of x's dtype,
 * cut from the tape (token ids, labels). NULL and an error on a shape that
 * does not match. */
DT_API dt_tensor *dt_cp_local_rows(dt_ctx *ctx, const dt_cp_layout *l, dt_tensor *x);
/* Causal (or not) attention of the rank's rows qkv [B, T/cp, 3 n_head hd]
 * (q | k | v per row, as dt_attention takes) over the whole sequence,
 * differentiable: y [B, T/cp, n_head hd] of the same rows, in qkv's
 * dtype. The exchanges and the kernels run in f32: a bf16 or f16 qkv
 * (mixed precision) is widened first and y rounded back (the gradient
 * comes back in qkv's dtype, as dt_cast's does). No dropout. Collective
 * over p->group in forward and backward. */
DT_API dt_tensor *dt_cp_attention(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head, bool causal);
/* dt_cp_attention over heads [head0, head0 + n_head) of a layer of
 * heads_total (tensor parallelism: the rank's heads; tp.h), with dropout on
 * the probabilities (dropout_p in [0, 1), when training) drawn as
 * dt_attention_heads draws it over the whole sequence: the cp group (and a
 * tp group beside it) together draw the single-process mask, under either
 * attention (dt_cp_attention_heads_fwd, dt_cp_ulysses_heads_fwd). head0 0,
 * heads_total n_head, dropout 0: dt_cp_attention. */
DT_API dt_tensor *dt_cp_attention_heads(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head, int head0,
                                        int heads_total, bool causal, float dropout_p, bool training, dt_rng_key key);
/* dt_cp_attention's causal attention with dt_attention_window's sliding
 * window (> 0: query i sees the keys (i - window, i]; 0 or >= T: every
 * earlier one) and soft cap of the scores (> 0; 0 none), under either
 * attention (dt_cp_attention_window_fwd, dt_cp_ulysses_window_fwd). */
DT_API dt_tensor *dt_cp_attention_window(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head,
                                         int64_t window, float softcap);
/* The attention dt_attention_ex computes (autograd.h: heads of a layer,
 * the causal mask, a sliding window, a soft cap, dropout), over the group:
 * the rank's rows qkv [B, T/cp, 3 n_head hd], as dt_cp_attention takes
 * them, under either attention (dt_cp_attention_ex_fwd,
 * dt_cp_ulysses_ex_fwd); the group draws the one-process dropout mask. The
 * forms above are shorthands. A bad description: DT_ERR_INVALID_ARG before
 * any exchange, in training or not. */
DT_API dt_tensor *dt_cp_attention_ex(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, const dt_attention_spec *s);
/* The whole sequence's mean loss from this rank's mean `loss` (a scalar f32)
 * over its `count` counted rows: sum_r loss_r count_r / sum_r count_r over
 * the group (0 when nothing counts), the same value on every rank. Its
 * backward gives this rank's loss cp x count / N, the gradient share that a
 * gradient AVERAGE over the dp x cp ranks turns into the whole sequence's
 * (see cp_ops.c). Collective over cp. */
DT_API dt_tensor *dt_cp_loss(dt_ctx *ctx, dt_pg *cp, dt_tensor *loss, int64_t count);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_CP_H */
