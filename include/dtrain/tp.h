/* dtrain/tp.h — tensor parallelism (Megatron-LM): the conjugate operators,
 * column- and row-parallel layers, the vocabulary-parallel embedding and
 * cross-entropy.
 *
 * Overview
 * --------
 * Tensor parallelism splits single layers over the ranks of a
 * tensor-parallel group `tp` (any dt_pg: a mesh dimension's group, or one
 * made with dt_pg_split). Each rank holds a slice of the
 * weights and computes its part of the layer; collectives inside forward
 * and backward keep the activations consistent:
 *
 *   f = dt_tp_copy_to_region:    forward identity,   backward all-reduce (sum)
 *   g = dt_tp_reduce_from_region: forward all-reduce, backward identity
 *   dt_tp_gather_last:  forward all-gather along the last dim, backward the rank's slice
 *   dt_tp_scatter_last: forward the rank's slice of the last dim, backward all-gather
 *   dt_tp_rms_norm: an RMSNorm of rows whose last dim the ranks split (the
 *     rows' statistics all-reduced forward and backward)
 *   dt_tp_sp_*: sequence parallelism's versions along any dim (reduce-scatter
 *     and all-gather pairs; the zoo's GPT uses them with
 *     dt_model_config.sequence_parallel, see models/gpt2.c)
 *
 * Megatron's MLP is Z = g(gelu(f(X) A_r) B_r) with A split by columns
 * (ColumnParallelLinear) and B by rows (RowParallelLinear): one all-reduce
 * in forward (g) and one in backward (f). Attention splits the heads: the
 * q/k/v projection is column-parallel (each rank computes n_head / t heads)
 * and the output projection row-parallel.
 *
 * Weights are stored [in, out] (x @ W, the addmm layout of the zoo's MLP and
 * of Hugging Face's GPT-2 Conv1D). A column-parallel weight holds the
 * rank's out/t columns (and bias slice); a row-parallel weight holds the
 * rank's in/t rows, and its bias is whole on every rank, added once after
 * the reduction. A parameter's slicing is recorded in its spec
 * (dt_nn_param_spec.tp_dim, tp_chunks; dt_param_info has them too), so its
 * name stays the global one ("transformer.h.0.mlp.c_fc.weight") with the
 * local shape.
 *
 * Initialisation: dt_tp_init_from fills every parameter of a
 * tensor-parallel model with its slice of the values the single-process
 * model gets (the same generator over the full tensor, then sliced), so the
 * tensor-parallel model equals the single-process one exactly at step 0.
 *
 * Replicated parameters (row-parallel biases, layer norms, position
 * embeddings) see the same inputs and the same output gradients on every
 * rank of the group (g's backward is the identity, f's backward all-reduces),
 * so their gradients are equal on every rank without communication, as in
 * Megatron. LoRA adapters on a tensor-parallel layer (dt_tp_lora_linear)
 * are split to match it and keep that property. Data parallelism composes outside: split the world into tp
 * groups of adjacent ranks and dp groups across them (dt_tp_groups) and run
 * DDP or ZeRO-1 (parallel.h) over the dp group; every dp group holds one
 * copy of each slice.
 *
 * Vocabulary parallelism: the embedding [V, C] is split over the vocabulary
 * (rows); rank r holds rows [r Vl, (r + 1) Vl) with Vl = ceil(V / t); rows
 * past V are padding (zero, never looked up, excluded from the softmax), as
 * Megatron pads, so any V works with any t. The lookup masks the ids
 * outside the rank's range and all-reduces (g). The tied LM head computes
 * the rank's logits [.., Vl] = f(x) @ W_r^T, and the vocabulary-parallel
 * cross-entropy takes the loss from them with three small all-reduces
 * (max, sum of exp, target logit) without ever forming the full logits.
 *
 * Training state. The trainer (train.h) finds the group from the model
 * (dt_tp_model_group: the tp.h modules carry it; a custom module with
 * sliced specs declares it with dt_tp_module_set_group) and then:
 *  - checkpoints (dt_trainer_save/load, `--save`/`--resume`/`--init-from`)
 *    hold every tensor whole under its global name and shape: the
 *    tensor-parallel group of data-parallel rank 0 saves collectively, each
 *    rank the contiguous share r of ceil(N/t) elements of each full tensor
 *    (gathered over the group with dt_tp_gather_full, one tensor at a
 *    time); loading reads the full tensor and keeps the rank's slice
 *    (dt_tp_slice_get). So a checkpoint is the single-process one: it
 *    loads at any tensor-parallel size and in one process, optimizer state
 *    and fp32 masters included, and resuming at the same size is exact;
 *  - the global gradient norm (clip_grad_norm, measure_grad_norm) sums the
 *    slices' squares over the group and counts whole tensors once: the
 *    single-process model's norm up to rounding;
 *  - a loss-scaler overflow in one rank's slice skips the step on all.
 * Dropout (the zoo's GPT, Megatron's RNG-tracker semantics): dropouts on
 * whole activations (after g) draw the same mask on every rank, the
 * single-process one; the attention dropout, inside the split heads, draws
 * for each rank its heads' part of the single-process mask
 * (dt_attention_heads): the tp run equals the single-process run with
 * dropout within rounding. Sequence parallelism in the GPT: dropout 0 only.
 * ZeRO-1 composes (the "zero" strategy at stage 1 over the dp group, or
 * the "pipe" strategy with params.zero = 1): each rank's optimizer steps a
 * share of its own slices' elements; the global norm sums each share's
 * squares over the ranks that partition them, then slices over tp and
 * whole tensors from tp rank 0 only, so it is bitwise the same on every
 * rank. Checkpoints are the single-process ones as under DDP: a save
 * first gathers the data-parallel shares (values, masters, optimizer
 * state) over dp, a load reads each rank's share of its slice of the full
 * tensor. The ZeRO group must be a data-parallel one (each member the same
 * tp rank; dt_trainer_init checks). ZeRO stages 2 and 3 over a
 * tensor-parallel model: dt_trainer_init refuses them, naming the slice
 * (use stage 1 or DDP).
 *
 * Every op here is collective over tp: every rank of the group must call the
 * same ops in the same order with the same shapes (the group's mismatch
 * check names the difference). A group of one makes every op the plain
 * single-process one.
 *
 * Usage (a tensor-parallel MLP, two ranks)
 * ----------------------------------------
 *     dt_pg *world;  dt_pg_init(NULL, &world);
 *     dt_pg *tp, *dp;  dt_tp_groups(world, 2, &tp, &dp);        // Megatron order
 *     dt_module *net = dt_nn_seq(0, NULL);
 *     dt_nn_add(net, NULL, dt_tp_column_linear(tp, 1024, 4096, true, false, 1));
 *     dt_nn_add(net, NULL, dt_nn_gelu());
 *     dt_nn_add(net, NULL, dt_tp_row_linear(tp, 4096, 1024, true, true));
 *     dt_model *m;  dt_model_build(net, seed, NULL, &m);
 *     // the single-process model, layout only, to take the initial values from
 *     dt_model *full = <the same tree with dt_nn_linear-like [in, out] layers, built meta>;
 *     dt_tp_init_from(m, tp, full, DT_INIT_PHILOX, seed);
 *     ... train: dt_model_forward, loss, dt_backward; DDP over dp (dp of size 1: none) ...
 */
#ifndef DTRAIN_TP_H
#define DTRAIN_TP_H

#include "dtrain/autograd.h"
#include "dtrain/base.h"
#include "dtrain/comm.h"
#include "dtrain/nn.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- groups ----------------------------------------------------------------------- */

/* Split world into tensor-parallel groups of tp_size adjacent ranks
 * (Megatron's order: tp group k = ranks [k tp_size, (k + 1) tp_size)) and
 * data-parallel groups across them (dp group j = the ranks whose tp rank
 * is j). Collective over world. tp_size must divide the world size
 * (DT_ERR_INVALID_ARG naming both). Free both before world. */
DT_API dt_status dt_tp_groups(dt_pg *world, int tp_size, dt_pg **tp, dt_pg **dp);

/* ---- the conjugate operators (differentiable; collective over tp) ------------------ */

/* f: x itself forward; backward all-reduces (sums) the gradient over tp. */
DT_API dt_tensor *dt_tp_copy_to_region(dt_ctx *ctx, dt_pg *tp, dt_tensor *x);
/* g: the sum of x over tp (all-reduce) forward; backward identity. */
DT_API dt_tensor *dt_tp_reduce_from_region(dt_ctx *ctx, dt_pg *tp, dt_tensor *x);
/* g on a partial sum the caller gives up: x an op's output that nothing but
 * this call reads, forward or backward (a row-parallel layer's product
 * x_r W_r). The same values and gradient as dt_tp_reduce_from_region, the
 * sum formed in x's own memory (all-reduce in place; the result aliases x)
 * instead of a copy that the step would keep beside it. x not an op's
 * contiguous output (a leaf, no-grad mode): dt_tp_reduce_from_region. */
DT_API dt_tensor *dt_tp_reduce_partial(dt_ctx *ctx, dt_pg *tp, dt_tensor *x);
/* x [..., n] -> [..., t n]: rank r's x in columns [r n, (r + 1) n) (all-gather);
 * backward: the rank's columns of the gradient. */
DT_API dt_tensor *dt_tp_gather_last(dt_ctx *ctx, dt_pg *tp, dt_tensor *x);
/* x [..., N] (the same on every rank) -> the rank's columns [r N/t, (r + 1) N/t)
 * (N divisible by t); backward: all-gather of the gradients. */
DT_API dt_tensor *dt_tp_scatter_last(dt_ctx *ctx, dt_pg *tp, dt_tensor *x);
/* RMSNorm of rows whose last dim the group splits (OLMo 2's q_norm and
 * k_norm over every head, each rank holding its heads): x [..., n_r] and
 * weight [n_r] (or NULL) are the rank's columns; each row is divided by
 * the root mean square of the WHOLE row (all ranks' columns, n = sum n_r),
 * y = x / sqrt(mean(x^2) + eps) * weight, in x's dtype (statistics in f32
 * and double). One all-reduce of the rows' sums of squares forward, one of
 * the rows' sums of x w dy backward; weight's gradient is the rank's slice.
 * A group of one: dt_rms_norm. */
DT_API dt_tensor *dt_tp_rms_norm(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, dt_tensor *weight, float eps);

/* Sequence parallelism (Korthikanti et al.): layer norm and
 * dropout regions hold the rank's chunk of the sequence dimension `dim`
 * (any dim; negative counts from the end), and f/g become these (the same
 * bytes moved: all-reduce = reduce-scatter + all-gather). The chunks are
 * equal: shape[dim] (of the full tensor) divisible by t, else DT_ERR_SHAPE.
 *   dt_tp_sp_gather:         all-gather along dim forward, reduce-scatter backward
 *                            (gather_from_sequence_parallel_region);
 *   dt_tp_sp_reduce_scatter: reduce-scatter (sum) along dim forward, all-gather backward
 *                            (reduce_scatter_to_sequence_parallel_region);
 *   dt_tp_sp_scatter:        the rank's chunk along dim forward, all-gather backward
 *                            (scatter_to_sequence_parallel_region). */
DT_API dt_tensor *dt_tp_sp_gather(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim);
DT_API dt_tensor *dt_tp_sp_reduce_scatter(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim);
/* dt_tp_sp_reduce_scatter on a partial sum the caller gives up (as
 * dt_tp_reduce_partial's x): the same values and gradient, and x's memory
 * goes back to the step's arena once reduced, for the next layers'. */
DT_API dt_tensor *dt_tp_sp_reduce_scatter_partial(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim);
DT_API dt_tensor *dt_tp_sp_scatter(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim);
/* The column-parallel products that follow dt_tp_sp_gather, formed as
 * Megatron-LM's sequence-parallel layers form them: y[i] = X W_i (+ b_i)
 * for the n (1 to 8) weights, X the all-gather of the rank's rows x along
 * dim, with the same values and gradients as dt_tp_sp_gather and then each
 * product, but X is not kept for backward: it (and autocast's copy of it
 * in the products' dtype) goes back to the step's arena once the products
 * are formed, and the products' weight gradients gather x again (one
 * all-gather for the n, given back after the last). x (contiguous) must
 * stay valid until backward; it is the gather's input, which autograd
 * keeps. weight_in_out: W_i stored [in, out] (dt_addmm's layout), else
 * [out, in] (dt_linear's); b NULL or b[i] NULL for no bias. A group of
 * one, no-grad mode or a non-contiguous x: the plain gather and products.
 * On error every y[i] is NULL. */
DT_API dt_status dt_tp_sp_gather_products(dt_ctx *ctx, dt_pg *tp, dt_tensor *x, int dim, int n,
                                          dt_tensor *const *w, dt_tensor *const *b, bool weight_in_out,
                                          dt_tensor **y);
/* LoRA on tensor-parallel layer m (dt_tp_lora_linear's, or this header's
 * own layers) under sequence parallelism, for forwards that run m's
 * weights directly: y + scaling * B(A(dropout(x))), the adapters split as
 * the layer. Column-parallel m: x the gathered input (dt_tp_sp_gather,
 * whose backward sums x's gradient over the group), y the rank's output
 * columns. Row-parallel m: x the rank's input columns of whole rows, y the
 * rank's rows (dim 1) of the output (after dt_tp_sp_reduce_scatter): the
 * adapters' output is formed on the whole rows and its rank's rows added.
 * y itself when m carries no adapters. The same values as one process's
 * LoRA layer, as under tensor parallelism without sequence parallelism.
 * NULL on error: m, x or y NULL (an earlier op's error stands), or m
 * carries adapters but is not a tensor-parallel layer (DT_ERR_INVALID_ARG). */
DT_API dt_tensor *dt_tp_sp_lora(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, dt_pg *sp);

/* ---- layers (modules; forward collective over tp) ---------------------------------- */

/* Y = f(X) @ W_r + b_r: weight [in, out/t] "weight", bias [out/t] "bias"
 * (bias optional), the rank's columns of the full [in, out] layer. With
 * chunks > 1 the full out dimension is `chunks` equal blocks (GPT-2's
 * q | k | v) and the rank holds its slice of each block, side by side.
 * gather_output: all-gather Y to [.., out] (chunks must be 1); else Y is
 * the rank's columns. out must be divisible by t * chunks. Type
 * "ColumnParallelLinear". The group is borrowed (must outlive the model).
 * Initialised N(0, 0.02); dt_tp_init_from replaces it by the full model's. */
DT_API dt_module *dt_tp_column_linear(dt_pg *tp, int64_t in, int64_t out, bool bias, bool gather_output,
                                      int chunks);
/* Y = g(X_r @ W_r) + b: weight [in/t, out] (the rank's rows), bias [out]
 * whole (added once, after the reduction). input_is_parallel: X is already
 * the rank's [.., in/t] (a column-parallel output); else X [.., in] is
 * split first (dt_tp_scatter_last). Type "RowParallelLinear". */
DT_API dt_module *dt_tp_row_linear(dt_pg *tp, int64_t in, int64_t out, bool bias, bool input_is_parallel);
/* Embedding over a vocabulary split by rows: weight [ceil(V/t), dim] (see the
 * overview for padding); input ids (i32/i64, any shape) in [0, V) (else
 * DT_ERR_RANGE); output [ids.shape..., dim], the same on every rank. Type
 * "VocabParallelEmbedding". */
DT_API dt_module *dt_tp_vocab_embedding(dt_pg *tp, int64_t num_embeddings, int64_t dim);
/* The LM head over a vocabulary split by rows: logits [.., ceil(V/t)] =
 * f(X) @ W_r^T, W_r "weight" [ceil(V/t), dim] the rank's rows (padding as
 * the embedding's: zero rows, logits the vocabulary-parallel
 * cross-entropy leaves out). Tie it to a dt_tp_vocab_embedding of the same
 * V (dt_module_tie) for a tied head. input_is_gathered: X comes through
 * dt_tp_sp_gather (sequence parallelism), whose backward already sums over
 * the group, so no f. Type "VocabParallelLMHead"; init N(0, 0.02). */
DT_API dt_module *dt_tp_vocab_head(dt_pg *tp, int64_t num_embeddings, int64_t dim, bool input_is_gathered);
/* The group of a module made by the four constructors above, or the one
 * given to dt_tp_module_set_group (NULL for any other module). */
DT_API dt_pg *dt_tp_module_group(const dt_module *m);
/* Declare that custom module m's sliced parameters (specs with tp_dim) are
 * slices over tp (borrowed; must outlive the model). A model whose slices
 * have no group cannot be checkpointed or clipped (the trainer says so).
 * The four constructors above do it themselves. */
DT_API dt_status dt_tp_module_set_group(dt_module *m, dt_pg *tp);
/* Make custom layer m, the rank's slice over tp of a linear layer in ->
 * out with weight [out, in] (dt_linear's layout), adaptable by LoRA
 * (dt_model_build_params.lora; nn.h dt_lora_hook): column (m computes the
 * rank's out/t output features from the whole input; in_region: the input
 * has been through f, dt_tp_copy_to_region, before m) or row (m takes the
 * rank's in/t input features and returns the output all-reduced over tp).
 * The adapters are split to match (lora_B by rows for a column layer,
 * lora_A by columns for a row layer, the other whole) and their gradients
 * come out whole on every rank. dt_tp_column_linear and dt_tp_row_linear
 * do it themselves (weight [in, out]). */
DT_API dt_status dt_tp_lora_linear(dt_module *m, dt_pg *tp, int64_t in, int64_t out, bool column, bool in_region);
/* The name of m's first parameter that is a tensor-parallel slice (tp_dim
 * set), or NULL when m holds whole tensors only. */
DT_API const char *dt_tp_model_slice(const dt_model *m);
/* The tensor-parallel group of model m: the group of the module holding its
 * first slice (NULL when m holds whole tensors only). The trainer uses it
 * for checkpoints and the global gradient norm. */
DT_API dt_pg *dt_tp_model_group(const dt_model *m);

/* ---- slices and full tensors (checkpoints) ------------------------------------------ */

/* The full (single-process) shape of entry p of a model sliced over t
 * ranks into shape[DT_MAX_DIMS]: p's own shape when p->tp_dim is 0; else
 * dim tp_dim - 1 times t, or the vocabulary V of a "VocabParallel*" module
 * (its `in`; the local rows are ceil(V / t), the padding not counted).
 * DT_ERR_SHAPE when the slicing does not fit p's shape. */
DT_API dt_status dt_tp_full_shape(const dt_param_info *p, int t, int64_t *shape);
/* Rank r's slice of p (of t) from the full tensor `full` into `slice`
 * (p->numel elements of es bytes each; es need not be p's dtype's: f32
 * masters and optimizer state move the same way). Padding rows become
 * zero. _put is the reverse (padding rows skipped). */
DT_API dt_status dt_tp_slice_get(const dt_param_info *p, int t, int r, const void *full, void *slice, size_t es);
DT_API dt_status dt_tp_slice_put(const dt_param_info *p, int t, int r, const void *slice, void *full, size_t es);
/* The full tensor from every rank's slice (an all-gather over tp, then
 * _put per rank): full holds dt_tp_full_shape's elements. Collective over tp;
 * memory t slices. */
DT_API dt_status dt_tp_gather_full(dt_pg *tp, const dt_param_info *p, const void *slice, void *full, size_t es);

/* ---- vocabulary-parallel loss ------------------------------------------------------ */

/* The rank's vocabulary range for a vocabulary of V over tp: rows
 * [*lo, *lo + *n) of the full embedding, *n = min(Vl, V - lo) clamped at 0,
 * Vl = ceil(V / t) (dt_tp_vocab_embedding's local rows). */
DT_API void dt_tp_vocab_range(dt_pg *tp, int64_t V, int64_t *lo, int64_t *n, int64_t *local_rows);
/* Mean cross-entropy of logits split over the vocabulary: logits [N, Vl] or
 * [B, T, Vl] (f32, or bf16/f16 widened to f32 first; this rank's columns, Vl = ceil(V/t), padding columns
 * ignored), labels [N] or [B, T] (i32/i64) in [0, V) or -100 (ignored, as
 * dt_cross_entropy). Equals dt_cross_entropy of the gathered [N, V] logits
 * up to rounding, with all-reduces of N floats (max) and 2N (sum of exp,
 * target logit); the backward needs no communication. -> scalar, the same on
 * every rank. */
DT_API dt_tensor *dt_tp_vocab_cross_entropy(dt_ctx *ctx, dt_pg *tp, dt_tensor *logits, dt_tensor *labels,
                                            int64_t V);

/* ---- initialisation ------------------------------------------------------------------ */

/* Fill every parameter of m, a tensor-parallel model, with its slice of the
 * initial values of `full`, the same model built without tensor parallelism
 * (build it meta: only its layout is used), drawn by rng and seed as
 * dt_model_init_range (DT_INIT_PHILOX: dt_model_build's own values;
 * DT_INIT_TORCH: dt_model_init_torch's). Entries are matched by name; an
 * entry with tp_dim 0 takes the whole tensor, one with tp_dim d + 1 the
 * rank's slice along d (tp_chunks blocks; vocabulary padding rows zero).
 * Frozen parameters (dt_model_build_params.frozen, a LoRA model's base)
 * live with the buffers: they are copied (sliced) from full's own values,
 * which a meta build holds (DT_INIT_PHILOX's; for DT_INIT_TORCH redraw them
 * first with dt_model_init_frozen(full, DT_INIT_TORCH, seed)). Buffers are
 * left as they are. Errors: DT_ERR_NOT_FOUND (a name missing in full),
 * DT_ERR_SHAPE (shapes that are not a slice of the full one), DT_ERR_STATE
 * (an entry frozen in one model and not the other). Time
 * and memory of one full model's parameters per rank. */
DT_API dt_status dt_tp_init_from(dt_model *m, dt_pg *tp, const dt_model *full, dt_init_rng rng, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TP_H */
