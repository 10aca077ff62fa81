/* dtrain/autograd.h — differentiable ops, the tape, backward, hooks.
 *
 * Overview
 * --------
 * Ops run eagerly. Each op takes the step context first (see tensor.h),
 * returns a new temporary (valid until dt_ctx_reset) and, when grad mode is on
 * and some input requires grad, appends a node to the context's tape. The
 * output then requires grad too. dt_backward(ctx, loss) walks the tape in
 * reverse from the loss and ACCUMULATES (+=) into the .grad of every leaf
 * (a tensor that requires grad and was not produced by an op: parameters,
 * or inputs marked with dt_tensor_set_requires_grad). An intermediate
 * tensor's gradient is an arena temporary that backward frees (t->grad
 * NULL, its memory reused) once it has been passed on to the op's inputs,
 * as PyTorch frees a non-leaf's; dt_ag_retain_grad(t) before backward keeps
 * it in t->grad until the context's reset (PyTorch's retain_grad()).
 * Backward may be called more than once on the same tape (every call adds
 * into the leaves again); zero the leaf grads yourself between steps
 * (dt_ag_zero_grad, or memset of the flat grad buffer).
 *
 * Errors as values: an op given an invalid input (shape mismatch, wrong
 * dtype, bad dim) returns NULL and sets dt_last_error() to a message naming
 * the op and the shapes ("dt_add: shapes [4,3] and [5] do not broadcast").
 * An op given a NULL input returns NULL and keeps the earlier message, so a
 * whole forward pass can be checked once, at the loss. Nothing aborts.
 *
 * Dtypes: compute ops take f32, bf16 and f16 (labels and indices i32 or
 * i64); any other dtype is DT_ERR_DTYPE. Low-precision inputs are computed
 * in f32 and the result rounded once; the result dtype, autocast and the
 * gradients of low-precision tensors are described in precision.h. Results
 * are deterministic: the same inputs, seed and thread count give
 * bit-identical values and gradients.
 *
 * Hooks
 *   - grad-ready (per leaf, dt_ag_add_grad_hook): fires DURING backward as
 *     soon as the last tape node that uses the leaf has been processed, i.e.
 *     the leaf's gradient for this backward pass is final (the parameters of
 *     the last layer fire first, long before backward ends). Leaves that the
 *     loss does not depend on get no contribution and their hooks do not fire.
 *   - marks (dt_ag_mark): a callback recorded on the tape in forward order;
 *     backward calls it when the walk reaches that point, i.e. after every
 *     node recorded after the mark has been processed and before any node
 *     recorded before it. A module records one mark before its forward
 *     (= post-backward hook) and one after (= pre-backward hook).
 *   - custom ops (dt_ag_custom): an output computed by the caller with a
 *     caller-provided backward (tensor-parallel all-reduce, pipeline sends).
 *   - activation checkpointing (dt_ag_checkpoint): a region re-run during
 *     backward instead of keeping its activations.
 *
 * The op table (ops.h): each node records its op (a dt_op), and one table
 * gives every op its name, backward, autocast class and FLOP count; the
 * walk calls the backward of the node's row, and dt_ag_tape_flops adds up
 * a stretch of the tape's FLOPs.
 *
 * No-grad mode: dt_ag_set_enabled(ctx, false) — ops record nothing and their
 * outputs do not require grad (evaluation, optimizer bookkeeping).
 *
 * Usage (one training step)
 * -------------------------
 *     // once: parameters are views into a flat buffer, grads into another
 *     float *P = dt_calloc(n * 4), *G = dt_calloc(n * 4);
 *     dt_tensor *w = dt_tensor_wrap(P, DT_F32, 2, (int64_t[]){10, 784});
 *     dt_tensor *b = dt_tensor_wrap(P + 7840, DT_F32, 1, (int64_t[]){10});
 *     dt_tensor_set_grad(w, dt_tensor_wrap(G, DT_F32, 2, (int64_t[]){10, 784}));
 *     dt_tensor_set_grad(b, dt_tensor_wrap(G + 7840, DT_F32, 1, (int64_t[]){10}));
 *     dt_ag_add_grad_hook(w, on_grad_ready, bucket);       // optional (DDP)
 *     dt_ctx *ctx;  dt_ctx_init(NULL, &ctx);
 *
 *     // each step
 *     memset(G, 0, n * 4);                                  // zero_grad
 *     dt_tensor *x = dt_tensor_view_of(ctx, images, DT_F32, 2, (int64_t[]){B, 784});
 *     dt_tensor *y = dt_tensor_view_of(ctx, labels, DT_I64, 1, (int64_t[]){B});
 *     dt_tensor *h = dt_relu(ctx, dt_linear(ctx, x, w, b));
 *     dt_tensor *loss = dt_cross_entropy(ctx, h, y);
 *     if (!loss) { fprintf(stderr, "%s\n", dt_last_error()); ... }  // one check
 *     float l = dt_tensor_item(loss);
 *     if (dt_backward(ctx, loss) < 0) { ... }
 *     // G now holds dL/dw and dL/db; w->grad and b->grad view it
 *     sgd_update(P, G, n);
 *     dt_ctx_reset(ctx);                                    // drop temporaries + tape
 */
#ifndef DTRAIN_AUTOGRAD_H
#define DTRAIN_AUTOGRAD_H

#include "dtrain/base.h"
#include "dtrain/ops.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- grad mode, backward, hooks -------------------------------------------- */

/* Turn recording on/off for ctx; returns the previous setting. */
DT_API bool dt_ag_set_enabled(dt_ctx *ctx, bool on);
/* Whether ops on ctx record on the tape. */
DT_API bool dt_ag_enabled(const dt_ctx *ctx);
/* Number of nodes (ops and marks) on the tape since the last reset. */
DT_API size_t dt_ag_tape_len(const dt_ctx *ctx);

/* Counters of the low-precision backward's conversions, summed over every
 * backward on one context since its creation (or the last
 * dt_ag_stats_reset). A bf16/f16 GEMM's backward (matmul, linear, addmm)
 * needs its output's f32 gradient in the GEMM's dtype: it either converts it
 * in a pass of its own (grad_rounds, grad_round_elems elements) or finds the
 * same values already written in that dtype by the op that produced the
 * gradient (grad_shadows: no pass). The producers that write them, where
 * the gradient is a GEMM output's first and only contribution:
 * dt_cross_entropy on bf16/f16 logits (also through a reshape of them),
 * the residual add of a bf16/f16 operand, dt_rope, dt_swiglu, dt_gqa_pack
 * (k, v), dt_bias_gelu_tanh, attention over a bf16/f16 qkv and dt_cast of
 * a bf16/f16 tensor to f32 (autocast's, whose backward rounds anyway). The
 * embedding of a bf16/f16 table counts the same way: its backward rounds
 * its output's gradient to the table's dtype (grad_rounds) unless its
 * producer (the add of two embeddings, the cast of one to f32) wrote it so
 * (grad_shadows).
 * The numbers are the same either way. */
typedef struct {
    uint64_t grad_rounds;      /* output gradients converted by a pass of their own */
    uint64_t grad_round_elems; /* elements those passes converted */
    uint64_t grad_shadows;     /* output gradients taken as their producer wrote them */
    uint64_t view_grads_shared; /* views (reshape, flatten: element k to element k) whose input's
                                   first gradient is the view's own gradient buffer, no copy
                                   (none of its elements -0 or a signalling NaN, which the
                                   copy's 0 + g would change) */
    uint64_t grad_rows_split;   /* tied tables' weight gradients rounded by their GEMM as it stored
                                   them, but for the rows their lookups add to (kept in f32 till
                                   then): dtrain's AMX GEMM, a lazily zeroed bf16 gradient */
    uint64_t grad_f32_skipped;  /* of the shadows written, those whose f32 values were not: the
                                   producer (dt_bias_gelu_tanh, attention, the residual add of a
                                   bf16/f16 operand) wrote the GEMM's dtype alone, the only reader
                                   being that linear/addmm's backward; or a bf16/f16 linear/addmm
                                   wrote its input's gradient so, the only reader being the
                                   backward of the layer norm or bias + GELU whose result, rounded
                                   to that dtype, the input is (which rounds the gradient to it) */
} dt_ag_stats;
/* Copy ctx's counters into *out (zeros for a NULL ctx). */
DT_API void dt_ag_stats_get(const dt_ctx *ctx, dt_ag_stats *out);
/* Zero ctx's counters. */
DT_API void dt_ag_stats_reset(dt_ctx *ctx);

/* Backward from a scalar (numel 1, f32) that requires grad: d loss / d loss
 * = 1. Accumulates into leaf grads, firing grad-ready hooks and marks.
 * A NULL loss returns the error left by the failed forward (or DT_ERR_NULL). */
DT_API dt_status dt_backward(dt_ctx *ctx, dt_tensor *loss);
/* Backward from any tensor `out` with upstream gradient `grad_out` (f32, same
 * shape, any strides). For pipeline stages and scaled losses. */
DT_API dt_status dt_backward_with(dt_ctx *ctx, dt_tensor *out, const dt_tensor *grad_out);

/* Split backward, for zero-bubble pipeline schedules (pipeline.h):
 * dt_backward_input is dt_backward_with computing only the gradients that
 * flow back to inputs (intermediates and non-parameter leaves such as a
 * pipeline stage's received activation); the work of every node that has
 * a parameter input (a persistent leaf: a matmul's dW, a bias's sum, an
 * embedding's scatter) is queued on ctx with its output gradient.
 * dt_backward_weight(ctx) then runs the queued work: parameters'
 * gradients accumulate and their grad-ready hooks fire there. Together
 * they give the same gradients as one dt_backward_with (the same kernels,
 * in the same order per parameter). The queue lives until dt_ctx_reset; a
 * second dt_backward_input before dt_backward_weight adds to it. Regions
 * under dt_ag_checkpoint are not split (their weight gradients come in
 * the first pass). */
DT_API dt_status dt_backward_input(dt_ctx *ctx, dt_tensor *out, const dt_tensor *grad_out);
DT_API dt_status dt_backward_weight(dt_ctx *ctx);

/* Add a grad-ready hook to a leaf (persistent, requires grad). Up to
 * DT_MAX_GRAD_HOOKS per tensor; they fire in the order added. ud is
 * borrowed. */
DT_API dt_status dt_ag_add_grad_hook(dt_tensor *leaf, dt_grad_hook_fn fn, void *ud);
/* Remove every grad-ready hook of t. */
DT_API void dt_ag_clear_grad_hooks(dt_tensor *t);
/* Inside a grad-ready hook of leaf: true when every value of its gradient
 * was seen finite as it was written in this backward pass, so a hook that
 * looks for inf or NaN need not read it: a low-precision weight's gradient
 * written by one GEMM (dtrain's AMX GEMM checks as it stores, elsewhere a
 * read pass follows: dt_k_matmul_lp_checked), or a lazily zeroed
 * low-precision gradient written whole from its f32 sum (checked block by
 * block as it is rounded). False when nothing checked it (the gradient was
 * added to), and outside the hooks. */
DT_API bool dt_ag_grad_checked_finite(const dt_tensor *leaf);
/* Keep the gradient of intermediate t (a tensor an op produced) after
 * backward, in t->grad until the context's reset, as PyTorch's
 * retain_grad() does; without it backward frees an intermediate's gradient
 * once it is passed on. A no-op on a leaf (its gradient is kept anyway).
 * DT_ERR_NULL for NULL. */
DT_API dt_status dt_ag_retain_grad(dt_tensor *t);
/* Zero t->grad if it has one (no-op otherwise). */
DT_API dt_status dt_ag_zero_grad(dt_tensor *t);

/* A tape mark: backward calls fn(ctx, ud) when it reaches this point (see
 * overview). Recorded only in grad mode. ud is borrowed until reset. A
 * negative return aborts backward with that status. */
typedef dt_status (*dt_mark_fn)(dt_ctx *ctx, void *ud);
DT_API dt_status dt_ag_mark(dt_ctx *ctx, dt_mark_fn fn, void *ud);

/* Custom differentiable op. The caller computed `out` (a temporary) from
 * in[0..nin-1] (nin <= 4) any way it likes; if grad mode is on and an input
 * requires grad, a node is recorded and out requires grad. During backward,
 * fn(ctx, grad_out, nin, grad_in, ud) must WRITE the gradient of each input
 * into grad_in[i] (a zeroed contiguous f32 temporary of in[i]'s shape, or
 * NULL where in[i] needs no gradient); the library accumulates it. Returns
 * out, or NULL on error. ud is borrowed until reset. */
typedef dt_status (*dt_custom_backward_fn)(dt_ctx *ctx, const dt_tensor *grad_out, int nin,
                                           dt_tensor **grad_in, void *ud);
DT_API dt_tensor *dt_ag_custom(dt_ctx *ctx, int nin, dt_tensor **in, dt_tensor *out,
                               dt_custom_backward_fn fn, void *ud);

/* Activation checkpointing: out = fn(ctx, nin, in, ud) computed WITHOUT
 * keeping the region's activations (fn runs in no-grad mode). In grad mode
 * one node is recorded; its backward re-runs fn with grad mode on, over
 * aliases of in[] that stand for the inputs, and runs a nested backward
 * from the recomputed output (dt_backward_with may be called from inside a
 * backward for exactly this; it walks only the nodes recorded since the
 * enclosing walk began). Parameters used inside fn get their gradients and
 * fire their grad-ready hooks during that nested backward. fn must be
 * deterministic (dropout with the same key gives the same mask) and may
 * use at most 4 tensor inputs; ud is borrowed until reset. Caveats, as in
 * PyTorch: batch norm in training updates its running stats again when the
 * region is recomputed; a parameter used both inside and outside the
 * region may fire its hook before its last contribution. */
typedef dt_tensor *(*dt_ckpt_fn)(dt_ctx *ctx, int nin, dt_tensor **in, void *ud);
DT_API dt_tensor *dt_ag_checkpoint(dt_ctx *ctx, dt_ckpt_fn fn, int nin, dt_tensor **in, void *ud);

/* ---- views (share storage with the input; differentiable) ------------------ */

/* New shape with the same numel; one entry may be -1 (inferred). A view if x
 * is contiguous, else a contiguous copy. */
DT_API dt_tensor *dt_reshape(dt_ctx *ctx, dt_tensor *x, int ndim, const int64_t *shape);
/* Swap two dims (negative dims count from the end). */
DT_API dt_tensor *dt_transpose(dt_ctx *ctx, dt_tensor *x, int d0, int d1);
/* Reorder dims: out.shape[i] = x.shape[perm[i]]. */
DT_API dt_tensor *dt_permute(dt_ctx *ctx, dt_tensor *x, const int *perm);
/* Slice [start, start+length) of dim. */
DT_API dt_tensor *dt_narrow(dt_ctx *ctx, dt_tensor *x, int dim, int64_t start, int64_t length);
/* Merge dims start_dim..end_dim (inclusive; negative from the end) into one
 * (PyTorch flatten; nn.Flatten is start_dim=1, end_dim=-1). */
DT_API dt_tensor *dt_flatten(dt_ctx *ctx, dt_tensor *x, int start_dim, int end_dim);
/* Contiguous copy (returns x itself if already contiguous). */
DT_API dt_tensor *dt_contiguous(dt_ctx *ctx, dt_tensor *x);
/* Same data, cut from the tape (does not require grad). */
DT_API dt_tensor *dt_detach(dt_ctx *ctx, dt_tensor *x);
/* x converted to dtype (f32, bf16 or f16; round to nearest even), x itself
 * when it already has that dtype (as PyTorch's .to). Differentiable: the
 * gradient is cast back to x's dtype (rounded to its precision; see
 * precision.h). A channel-blocked x is made plain first. */
DT_API dt_tensor *dt_cast(dt_ctx *ctx, dt_tensor *x, dt_dtype dtype);

/* ---- elementwise ------------------------------------------------------------ */

/* a (op) b with NumPy broadcasting (shapes aligned at the trailing dim; a dim
 * of 1 stretches). Gradients are summed over the broadcast dims. */
DT_API dt_tensor *dt_add(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
DT_API dt_tensor *dt_sub(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
DT_API dt_tensor *dt_mul(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
DT_API dt_tensor *dt_div(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
/* x * s. */
DT_API dt_tensor *dt_scale(dt_ctx *ctx, dt_tensor *x, float s);
/* max(x, 0); gradient 0 at x == 0 (PyTorch). */
DT_API dt_tensor *dt_relu(dt_ctx *ctx, dt_tensor *x);
/* x * Phi(x), exact erf form (PyTorch's default approximate='none'). */
DT_API dt_tensor *dt_gelu(dt_ctx *ctx, dt_tensor *x);
/* GELU, tanh approximation (PyTorch approximate='tanh', GPT-2's). */
DT_API dt_tensor *dt_gelu_tanh(dt_ctx *ctx, dt_tensor *x);
/* Inverted dropout: in training, element i (row-major index) is zeroed when
 * dt_rng_uniform(key, i) < p and the rest scaled by 1/(1-p); p = 1 gives
 * zeros. When !training or p == 0 it returns x itself (no copy, no node).
 * p in [0, 1]. The mask depends only on (key, i): use a distinct key per
 * call site and step, e.g. dt_rng_key_make(seed, DT_RNG_DROPOUT, layer, step)
 * (recomputation under dt_ag_checkpoint then sees the same mask). */
DT_API dt_tensor *dt_dropout(dt_ctx *ctx, dt_tensor *x, float p, bool training, dt_rng_key key);
/* dt_dropout of some rows of a sequence with the whole sequence's mask: x
 * [B, R, ...] holds rows at positions pos[r] (R entries, read during the
 * call; each in [0, T)) of a [B, T, ...] tensor, and each element gets the
 * mask dt_dropout would give it there (the whole tensor's row-major index).
 * A rank that holds part of a sequence (tensor parallelism's sequence
 * parallelism, context parallelism's chunks) so drops what one process
 * would drop. */
DT_API dt_tensor *dt_dropout_at(dt_ctx *ctx, dt_tensor *x, float p, bool training, dt_rng_key key,
                                const int64_t *pos, int64_t T);

/* ---- matmul and layers --------------------------------------------------------- */

/* a[..., M, K] @ b: b either [K, N] (a's leading dims are batch, e.g.
 * x[B,128,1024] @ w[1024,4096] -> [B,128,4096]) or [..., K, N] with the same
 * leading dims as a (batched). Result [..., M, N]. */
DT_API dt_tensor *dt_matmul(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
/* x[..., in] W^T + bias: w [out, in], bias [out] or NULL. -> [..., out]. */
DT_API dt_tensor *dt_linear(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias);
/* x[..., in] @ w + bias with w stored [in, out] (PyTorch addmm; Hugging
 * Face's GPT-2 Conv1D layout), bias [out] or NULL. -> [..., out]. */
DT_API dt_tensor *dt_addmm(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias);
/* 2-D convolution, NCHW: x [N,C,H,W], w [O,C,kh,kw], bias [O] or NULL,
 * symmetric stride (>=1) and zero padding (>=0). -> [N,O,Ho,Wo] with
 * Ho = (H + 2*pad - kh)/stride + 1. */
DT_API dt_tensor *dt_conv2d(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *bias, int stride,
                            int pad);
/* Pooling over x [N,C,H,W] with a k x k window; stride 0 means k; pad >= 0
 * (max pool pads with -inf; avg pool counts padding in the divisor, PyTorch's
 * count_include_pad=True). Output sizes floor like PyTorch (ceil_mode off). */
DT_API dt_tensor *dt_max_pool2d(dt_ctx *ctx, dt_tensor *x, int k, int stride, int pad);
DT_API dt_tensor *dt_avg_pool2d(dt_ctx *ctx, dt_tensor *x, int k, int stride, int pad);
/* Batch norm over channel dim 1 of x [N,C] or [N,C,H,W]. gamma/beta [C] or
 * NULL (affine off). running_mean/var [C] persistent f32 or NULL. training:
 * normalise with the batch's biased variance and, if running stats are given,
 * update them in place: r = (1-momentum) r + momentum * batch_stat, using
 * the UNBIASED variance for running_var (PyTorch). Not training: normalise
 * with the running stats (required). The running-stat update is not
 * recorded on the tape. */
DT_API dt_tensor *dt_batch_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                dt_tensor *running_mean, dt_tensor *running_var, bool training,
                                float momentum, float eps);
/* dt_relu(ctx, dt_max_pool2d(ctx, dt_batch_norm(ctx, x, ...), 2, 2, 0)),
 * which is also max pooling of the ReLU (a CNN block's tail): the same
 * values and gradients, bit for bit. For a training batch norm of a
 * channel-blocked f32 x [N, C, H, W] (H, W >= 2) with f32 gamma and beta it
 * is one tape node whose passes never store batch norm's output or the
 * gradient at it (the ConvNet's blocks run so); anything else runs the
 * three ops. */
DT_API dt_tensor *dt_batch_norm_relu_max_pool2x2(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                                 dt_tensor *running_mean, dt_tensor *running_var, bool training,
                                                 float momentum, float eps);
/* Layer norm over the last dim D of x: gamma/beta [D] or NULL. */
DT_API dt_tensor *dt_layer_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                float eps);
/* dt_cast(ctx, dt_layer_norm(ctx, x, gamma, beta, eps), dtype) (dtype f32,
 * bf16 or f16; others DT_ERR_DTYPE): the same values and gradients, and for
 * an f32 x with a bf16/f16 dtype one tape node and one pass, the f32 result
 * rounded once as it is written. For a layer norm whose result feeds a
 * matmul under autocast (precision.h), which would round it to the autocast
 * dtype anyway: GPT-2 builds its blocks so. */
DT_API dt_tensor *dt_layer_norm_to(dt_ctx *ctx, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                                   float eps, dt_dtype dtype);
/* Rows of weight [V, D] picked by idx (i32/i64, any shape, values in [0,V))
 * -> [idx.shape..., D]. Out-of-range indices are DT_ERR_RANGE. */
DT_API dt_tensor *dt_embedding(dt_ctx *ctx, dt_tensor *weight, dt_tensor *idx);

/* ---- transformer ops ------------------------------------------------------------- */

/* Multi-head scaled dot-product attention of GPT-2: qkv [B, T, 3C] holds
 * q | k | v (head h in columns [h C/n_head, (h+1) C/n_head) of each), the
 * result [B, T, C] = softmax(q k^T / sqrt(C/n_head), causal mask if causal)
 * v per head, heads side by side. A blocked online-softmax kernel: memory is
 * O(B T C), never a (T, T) matrix per head; the backward recomputes the
 * probabilities. Dropout on the probabilities with dropout_p in [0, 1) when
 * training, its mask a function of (key, b, h, i, j) (see dt_k_attention_fwd),
 * so recomputation under dt_ag_checkpoint draws the same one. Head size
 * C/n_head <= 256. */
DT_API dt_tensor *dt_attention(dt_ctx *ctx, dt_tensor *qkv, int n_head, bool causal, float dropout_p,
                               bool training, dt_rng_key key);
/* dt_attention over heads [head0, head0 + n_head) of a layer of heads_total
 * (tensor parallelism: qkv holds the rank's n_head heads; tp.h): the same
 * result, with the full layer's dropout mask for those heads
 * (dt_k_attention_fwd_heads), so the ranks' masks together are the
 * single-process one. head0 0, heads_total n_head: dt_attention. */
DT_API dt_tensor *dt_attention_heads(dt_ctx *ctx, dt_tensor *qkv, int n_head, int head0, int heads_total, bool causal,
                                     float dropout_p, bool training, dt_rng_key key);
/* Causal dt_attention (no dropout) with a sliding window and soft-capped
 * scores: query i sees the keys (i - window, i] (window 0: every earlier
 * one; Mistral's and Gemma 2's sliding_window), its scores s = q.k /
 * sqrt(hd) become softcap tanh(s / softcap) before the softmax (softcap 0:
 * none; Gemma 2's attn_logit_softcapping). O(T window) work
 * (dt_k_attention_window_fwd): dt_attention's blocked kernel with the key
 * blocks outside the window skipped and each block's scores capped as
 * they are computed, a bf16/f16 qkv read as it is (dt_attention's numbers;
 * a window of T or more, or 0, without a cap gives dt_attention's bits).
 * window >= 0 and softcap finite and >= 0, else DT_ERR_INVALID_ARG. The heads are independent, so a rank's heads
 * under tensor parallelism need nothing more. */
DT_API dt_tensor *dt_attention_window(dt_ctx *ctx, dt_tensor *qkv, int n_head, int64_t window, float softcap);
/* What an attention computes, all of it at once (dt_attention_ex; over a
 * context-parallel group dt_cp_attention_ex, cp.h): the forms above are
 * shorthands for some of it. Zero-initialised: every head of qkv, no mask,
 * no window, no cap, no dropout. */
typedef struct dt_attention_spec {
    int n_head;        /* heads in qkv (> 0) */
    int head0;         /* the layer's heads these are: [head0, head0 + n_head) of heads_total (tensor */
    int heads_total;   /* parallelism: the rank's; the dropout mask's head index); heads_total 0: n_head */
    bool causal;       /* query i sees the keys j <= i */
    int64_t window;    /* > 0: query i sees the keys (i - window, i] (causal only); 0 none */
    float softcap;     /* > 0: the scores s become softcap tanh(s / softcap) (causal only); 0 none */
    float dropout_p;   /* on the probabilities, in [0, 1); 0 none */
    bool training;     /* dropout only when training */
    dt_rng_key key;    /* the dropout mask's key (dt_module_dropout_key) */
} dt_attention_spec;
/* Attention over qkv [B, T, 3C] as s describes it (dt_k_attention_ex_fwd):
 * the result [B, T, C] in qkv's dtype, as dt_attention's. The window and
 * the cap as dt_attention_window's, the dropout mask dt_attention_heads'
 * (the layer's heads: a tensor-parallel run draws the one-process mask),
 * applied to the probabilities of the capped scores. A window or a cap
 * without causal, a negative window, a cap not finite or negative, p
 * outside [0, 1), or heads not inside heads_total: DT_ERR_INVALID_ARG. */
DT_API dt_tensor *dt_attention_ex(dt_ctx *ctx, dt_tensor *qkv, const dt_attention_spec *s);
/* Soft capping, Gemma 2's final_logit_softcapping: cap tanh(x / cap),
 * elementwise (cap positive and finite, else DT_ERR_INVALID_ARG); in f32,
 * a bf16/f16 x widened and the result rounded to its dtype. */
DT_API dt_tensor *dt_softcap(dt_ctx *ctx, dt_tensor *x, float cap);
/* gelu_tanh(x + bias), fused: x [..., N], bias [N] or NULL. */
DT_API dt_tensor *dt_bias_gelu_tanh(dt_ctx *ctx, dt_tensor *x, dt_tensor *bias);

/* ---- Llama-family ops (Hugging Face LlamaForCausalLM's numerics) --------------- */

/* RMSNorm over the last dim D of x: x / sqrt(mean(x^2) + eps) * weight
 * (weight [D], or NULL for none), the statistics in f32 (LlamaRMSNorm).
 * bf16/f16 inputs are computed in f32 and the result rounded once to x's
 * dtype (x of bf16/f16 with a weight of its dtype, f32 or none: in one pass
 * that reads and writes x's dtype, the same bits). eps > 0. */
DT_API dt_tensor *dt_rms_norm(dt_ctx *ctx, dt_tensor *x, dt_tensor *weight, float eps);
/* Rotary position embedding in the rotate-half layout (transformers'
 * apply_rotary_pos_emb) on x [B, T, n_head * hd]: in every head the pair
 * (j, j + hd/2) is rotated by the angle (pos0 + t) * inv_freq[j] (computed
 * in f32, as transformers does), j < hd/2. inv_freq: hd/2 inverse
 * frequencies (borrowed for the call; rope scaling is already in them). hd
 * even. Differentiable in x. A bf16/f16 x is rotated in f32 and the result
 * rounded once to its dtype, in one pass. */
DT_API dt_tensor *dt_rope(dt_ctx *ctx, dt_tensor *x, int n_head, const float *inv_freq, int64_t pos0);
/* dt_rope with row t of every sequence at position pos[t] (T entries, read
 * during the call; NULL: pos0 + t), for rows that are not consecutive
 * positions (context parallelism's chunks, cp.h). Positions >= 0. */
DT_API dt_tensor *dt_rope_at(dt_ctx *ctx, dt_tensor *x, int n_head, const float *inv_freq, int64_t pos0,
                             const int64_t *pos);
/* dt_rope_at on the first rot values of every head (Phi-3's partial rotary
 * factor: rot = hd * factor; 0: hd), pairs (j, j + rot/2) rotated by
 * inv_freq[j] (rot/2 of them), the values past rot unchanged, with cos and
 * sin multiplied by scale (longrope's attention factor; 1: none) in f32,
 * as transformers' rotary embedding returns them. rot even in [2, hd],
 * scale positive. Differentiable in x. */
DT_API dt_tensor *dt_rope_partial(dt_ctx *ctx, dt_tensor *x, int n_head, int64_t rot, const float *inv_freq,
                                  float scale, int64_t pos0, const int64_t *pos);
/* SwiGLU: silu(gate) * up = gate * sigmoid(gate) * up, fused; gate and up
 * of one shape. */
DT_API dt_tensor *dt_swiglu(dt_ctx *ctx, dt_tensor *gate, dt_tensor *up);
/* Grouped-query attention's input for dt_attention: q [B, T, n_head * hd],
 * k and v [B, T, n_kv_head * hd] -> qkv [B, T, 3 * n_head * hd] (q | k | v)
 * where query head h reads kv head h / (n_head / n_kv_head) (transformers'
 * repeat_kv). n_kv_head divides n_head; n_kv_head == n_head is plain
 * multi-head attention. The backward sums each kv head's copies. */
DT_API dt_tensor *dt_gqa_pack(dt_ctx *ctx, dt_tensor *q, dt_tensor *k, dt_tensor *v, int n_head, int n_kv_head);

/* ---- softmax, losses, reductions --------------------------------------------- */

/* Softmax / log-softmax over the last dim. */
DT_API dt_tensor *dt_softmax(dt_ctx *ctx, dt_tensor *x);
DT_API dt_tensor *dt_log_softmax(dt_ctx *ctx, dt_tensor *x);
/* Mean over N of -log_softmax(logits)[n, label[n]]: logits [N, C] f32,
 * labels [N] i32 or i64 in [0, C); a label of -100 (PyTorch's default
 * ignore_index) is skipped and the mean is over the other rows (0 if none).
 * Other labels out of range: DT_ERR_RANGE. Fused softmax + loss; the labels
 * are copied, so the caller may reuse its buffer before backward. The
 * softmax is not kept: each row's log-sum-exp is taken in one pass over
 * column chunks and the backward recomputes the probabilities, so a
 * vocabulary-sized [N, V] costs no [N, V] buffer beyond the logits and
 * their gradient. -> scalar. */
DT_API dt_tensor *dt_cross_entropy(dt_ctx *ctx, dt_tensor *logits, dt_tensor *labels);
/* The LM head fused with the cross-entropy: the value (and gradients) of
 * dt_cross_entropy(dt_linear(x, w, NULL) as [N, V], labels as [N]) without
 * the [N, V] logits. x [..., C] (N rows), w [V, C] (a Linear's layout; a
 * tied embedding), labels i64/i32 [...] with x's leading dims (or [N]),
 * contiguous; DT_K_IGNORE_INDEX rows do not count. The rows go in chunks of
 * chunk_rows (0: balanced chunks of at most 64 MiB of logits): the forward
 * computes each chunk's logits, log-sum-exp and loss; the backward
 * recomputes them (all chunks but the last, whose logits it keeps) and adds
 * dx and dW chunk by chunk. Memory: one [chunk_rows, V] f32 buffer, against
 * the unfused path's [N, V] logits and their [N, V] gradient; time: one more
 * forward GEMM over all chunks but the last. Autocast treats it as
 * dt_linear (x and w cast), bf16/f16 logits are rounded to that dtype
 * before the f32 softmax as dt_linear's output would be; the loss is f32.
 * Equal to the unfused ops within float rounding (per-chunk means and GEMM
 * sums). Bad labels: DT_ERR_RANGE; shapes: DT_ERR_SHAPE. -> f32 scalar. */
DT_API dt_tensor *dt_linear_cross_entropy(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *labels,
                                          int64_t chunk_rows);
/* Mean of (a - b)^2 over all elements; same shape. -> scalar. */
DT_API dt_tensor *dt_mse_loss(dt_ctx *ctx, dt_tensor *a, dt_tensor *b);
/* Sum / mean of every element -> scalar (ndim 0). Summation order is fixed
 * (deterministic), accumulated in double. */
DT_API dt_tensor *dt_sum(dt_ctx *ctx, dt_tensor *x);
DT_API dt_tensor *dt_mean(dt_ctx *ctx, dt_tensor *x);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_AUTOGRAD_H */
