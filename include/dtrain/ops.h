/* dtrain/ops.h — the op table: one row per op of the tape, the one place
 * that says what an op is.
 *
 * Overview
 * --------
 * Every node on an autograd tape (autograd.h) records a dt_op, and one
 * table, indexed by it, gives each op
 *   - its name (PyTorch's: "matmul", "linear", "cross_entropy_loss", ...,
 *     dt_op_name) and the dtrain function that records it ("dt_matmul",
 *     named in backward's errors);
 *   - its backward: the function the tape calls for the node (every row
 *     but DT_OP_MARK has one, dt_op_has_backward);
 *   - its autocast class (precision.h: what autocast does to its floating
 *     inputs, dt_autocast_class);
 *   - its FLOP count as a function of the node's input and output shapes
 *     (dt_op_flops).
 * The tape dispatches backward through it, the precision policy reads the
 * autocast class from it, and the profiler (dt_ag_tape_flops: the FLOPs of
 * a stretch of the tape, in total and per op) reads the FLOP counts. The
 * table lives in src/autograd/op_table.c; its size is tied to DT_OP_COUNT
 * at compile time. To add an op: add an enum value here (before
 * DT_OP_COUNT; the values are stable, so append), a row in the table
 * (name, function, backward, class, FLOPs), and record nodes with it.
 *
 * FLOP convention (2 per multiply-add, the forward only; a backward is
 * about twice its op's forward for the GEMMs):
 *   - matmul, linear, addmm: 2 M N K for an [M, K] x [K, N] product
 *     (batched: times the batch; bias adds not counted, as PyTorch's
 *     flop counter);
 *   - conv2d: 2 x (output elements) x (C_in / groups) x KH x KW;
 *   - attention over qkv [B, T, 3C]: q k^T and p v in full, 4 B T^2 C (the
 *     causal kernel does about half of it; the MFU convention of nanoGPT
 *     and PaLM, and the zoo's descriptors: models.h);
 *   - the fused LM head (dt_linear_cross_entropy): its GEMM, 2 N V C;
 *   - views (reshape, permute, transpose, narrow, flatten), copies
 *     (contiguous, the blocked-to-plain conversion, gqa_pack), dt_cast,
 *     embedding lookups, marks, checkpointed regions (whose ops are not on
 *     the tape) and custom ops (unknown to dtrain): 0;
 *   - every other op: one per element it writes (elementwise ops,
 *     activations, norms, softmax, rope, swiglu) or, for ops that reduce
 *     (sum, mean, the losses, pooling), one per element it reads: a
 *     convention for profiles, not a cycle count.
 * The zoo's FLOPs per sample (dt_model_desc in models.h) count the GEMM
 * rows only; a forward's tape gives the same number (tests/autograd/
 * test_op_table checks it for each model).
 *
 * Usage
 * -----
 *     size_t t0 = dt_ag_tape_len(ctx);
 *     dt_tensor *logits = dt_model_forward(ctx, m, x);
 *     double by_op[DT_OP_COUNT];
 *     double total = dt_ag_tape_flops(ctx, t0, dt_ag_tape_len(ctx), by_op);
 *     for (int op = 0; op < DT_OP_COUNT; op++)
 *         if (by_op[op] > 0)
 *             printf("%-30s %10.3f GFLOP\n", dt_op_name((dt_op)op), by_op[op] * 1e-9);
 */
#ifndef DTRAIN_OPS_H
#define DTRAIN_OPS_H

#include "dtrain/base.h"
#include "dtrain/tensor.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ops a tape node can record: the differentiable ops of autograd.h
 * and the tape's own entries (marks, custom ops, checkpointed regions). */
typedef enum {
    DT_OP_MATMUL = 0, DT_OP_LINEAR, DT_OP_CONV2D,
    DT_OP_ADD, DT_OP_SUB, DT_OP_MUL, DT_OP_DIV, DT_OP_SCALE,
    DT_OP_RELU, DT_OP_GELU, DT_OP_GELU_TANH, DT_OP_DROPOUT,
    DT_OP_MAX_POOL2D, DT_OP_AVG_POOL2D, DT_OP_BATCH_NORM, DT_OP_LAYER_NORM, DT_OP_EMBEDDING,
    DT_OP_SOFTMAX, DT_OP_LOG_SOFTMAX, DT_OP_CROSS_ENTROPY, DT_OP_MSE_LOSS, DT_OP_SUM, DT_OP_MEAN,
    DT_OP_RESHAPE, DT_OP_TRANSPOSE, DT_OP_PERMUTE, DT_OP_NARROW, DT_OP_FLATTEN, DT_OP_CONTIGUOUS,
    DT_OP_CAST, DT_OP_ATTENTION, DT_OP_BIAS_GELU_TANH, DT_OP_ADDMM,
    DT_OP_RMS_NORM, DT_OP_ROPE, DT_OP_SWIGLU, DT_OP_GQA_PACK,
    DT_OP_LINEAR_CROSS_ENTROPY, /* dt_linear_cross_entropy: the fused LM head and loss */
    DT_OP_TO_PLAIN,             /* a channel-blocked (nChw8c) activation converted to plain NCHW */
    DT_OP_CHECKPOINT,           /* a dt_ag_checkpoint region (re-run in backward) */
    DT_OP_CUSTOM,               /* a dt_ag_custom output with the caller's backward */
    DT_OP_MARK,                 /* a dt_ag_mark callback (no backward) */
    DT_OP_BN_RELU_POOL,         /* dt_batch_norm_relu_max_pool2x2: batch norm, ReLU and 2 x 2 max pooling */
    DT_OP_SOFTCAP,              /* dt_softcap: cap tanh(x / cap) */
    DT_OP_COUNT
} dt_op;

/* What autocast does to an op's floating inputs (PyTorch's three lists;
 * precision.h). */
typedef enum {
    DT_AMP_PROMOTE = 0, /* unlisted: inputs left as they are, the op runs in their promoted dtype */
    DT_AMP_LOWER,       /* lower_precision_fp: f32 inputs cast to the autocast dtype */
    DT_AMP_FP32,        /* fp32: low-precision inputs cast to f32 */
    DT_AMP_CLASS_COUNT
} dt_amp_class;

/* "matmul", "linear", ... (PyTorch's op names; "?" for an unknown op). */
DT_API const char *dt_op_name(dt_op op);
/* The autocast class of op (DT_AMP_PROMOTE for an unknown op). */
DT_API dt_amp_class dt_autocast_class(dt_op op);
/* "promote", "lower", "fp32". */
DT_API const char *dt_amp_class_name(dt_amp_class c);
/* Whether op's row has a backward (every op but DT_OP_MARK; false for an
 * unknown op). */
DT_API bool dt_op_has_backward(dt_op op);
/* The forward FLOPs of op with inputs in[0..nin) and output out, by the
 * convention above (only the shapes are read; NULL inputs are skipped).
 * 0 for an unknown op, a NULL out, or inputs an op of this kind cannot
 * have (too few, wrong rank). */
DT_API double dt_op_flops(dt_op op, int nin, const dt_tensor *const *in, const dt_tensor *out);
/* The profiler of the tape: the FLOPs of ctx's tape nodes [from, to)
 * (positions as dt_ag_tape_len counts them; clamped to the tape), summed
 * from the table. by_op (may be NULL) receives DT_OP_COUNT sums, one per
 * op. Only recorded nodes count: ops run in no-grad mode, or on inputs
 * that do not require grad, are not on the tape. 0 for a NULL ctx. */
DT_API double dt_ag_tape_flops(const dt_ctx *ctx, size_t from, size_t to, double *by_op);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OPS_H */
