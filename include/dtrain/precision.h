/* dtrain/precision.h — low-precision compute: which dtype each op runs in,
 * the autocast policy, and models that hold their parameters in bf16/fp16.
 *
 * Overview
 * --------
 * Every differentiable op of autograd.h accepts f32, bf16 and f16 tensors
 * (labels and indices stay i32/i64). Low-precision data is READ in its own
 * dtype and COMPUTED in f32: matmul, linear and addmm hand bf16 operands to
 * oneDNN with f32 accumulation; elementwise ops, activations, pooling,
 * norms (batch-norm and layer-norm statistics), softmax, reductions and
 * losses widen their inputs to f32 exactly, compute in f32 and round the
 * result once. fp16 is stored as fp16 and always computed in f32 on CPUs
 * without fp16 arithmetic (all x86 CPUs dtrain runs on today, AVX512_FP16
 * Sapphire Rapids included: oneDNN's f16 matmul is used only where it
 * exists; elsewhere the operands are widened). bf16 matmul and linear
 * run natively only where oneDNN has bf16 kernels for the CPU (AVX-512
 * machines, faster with AVX512_BF16, fastest with AMX, where oneDNN runs
 * them on the tiles; dtrain's own AMX GEMM for a training step's, or all
 * on request, see dt_k_matmul_amx in kernels.h); elsewhere (AVX2) the bf16
 * operands are widened to f32 first, exactly, so the numbers are the same
 * and the speed is f32's minus the conversion (docs/BENCHMARKS.md).
 * dt_precision_native() says which path this CPU takes. conv2d in bf16
 * runs oneDNN's bf16 convolutions (f32 accumulation, bf16 output rounded
 * once, f32 gradients) where the CPU has them (dt_k_conv2d_native(DT_BF16)
 * in kernels.h: AVX-512 machines) and widens its operands to f32 elsewhere
 * and for fp16 (oneDNN 2.6 has no fp16 convolution): the same numbers up
 * to the f32 summation order.
 *
 * Result dtypes (PyTorch's rules):
 *   - an op whose floating inputs are all of one low dtype returns that
 *     dtype; any f32 input (or bf16 mixed with f16) promotes the op to f32;
 *   - batch_norm and layer_norm return x's dtype whatever the dtype of
 *     gamma/beta (f32 norm parameters with bf16 activations: apex's
 *     keep_batchnorm_fp32); running statistics are always f32;
 *   - losses (cross_entropy, mse_loss) always return an f32 scalar.
 *
 * Gradients: the gradient of a temporary is f32 (as before), holding values
 * of the tensor's dtype: dt_cast's backward rounds the gradient to the
 * input's dtype, so a bf16 activation's gradient is bf16-valued as in
 * PyTorch. A leaf (parameter) of dtype bf16/f16 may have a gradient tensor
 * of its own dtype (a model's DT_FLAT_GRADS flat of that dtype) or of f32;
 * during one backward pass its contributions accumulate in f32 and are
 * added to the gradient tensor once, rounded once, just before its
 * grad-ready hooks fire.
 *
 * Autocast (PyTorch's CPU torch.autocast): while a context's
 * autocast dtype is bf16 or f16, ops whose row of the op table (ops.h)
 * has class DT_AMP_LOWER (matmul, linear,
 * addmm, conv2d, attention) cast their f32 floating inputs to it, ops of class DT_AMP_FP32
 * (the losses) compute on low-precision inputs in f32 (mse_loss through
 * cast nodes; cross_entropy reads bf16/f16 logits row by row, the same
 * numbers without the f32 copy, and its backward hands the LM head's bf16
 * GEMMs the rounded gradient in bf16 directly), and every other op runs in
 * its inputs' dtype (DT_AMP_PROMOTE). dt_attention is "lower" as PyTorch's
 * scaled_dot_product_attention (its qkv is rounded to the autocast dtype;
 * the kernel computes in f32, widening the bf16/f16 qkv tile by tile as it
 * reads it, and returns the result in qkv's dtype: one tape node, the bits
 * of dt_cast to f32, the f32 op and dt_cast back on the scalar and avx2
 * paths, within the bounds kernels.h states for dt_k_attention_fwd_heads_lp
 * on the avx512 ones; on avx512_bf16 a bf16 qkv's probabilities are rounded
 * to bf16 before they multiply v, as flash-attention kernels do). The other casts are
 * dt_cast nodes on the tape, so gradients flow back to the f32 weights in f32 (rounded to bf16
 * on the way, as PyTorch's). Softmax, norms and sums are NOT forced to f32
 * (they compute in f32 anyway), exactly as PyTorch's CPU lists. A model
 * whose layer norm feeds a matmul may write the norm's result directly in
 * the autocast dtype with dt_layer_norm_to (autograd.h): the bits of the
 * f32 result rounded by the matmul's cast, with no cast node (GPT-2 does).
 *
 * Two ways to train in low precision, both built from the above:
 *   - autocast (f32 weights): dt_autocast_set(ctx, DT_BF16, &old) around
 *     the forward; the weights, their gradients and the optimizer stay f32.
 *   - low-precision weights (apex O2, FSDP param_dtype): build the model with
 *     dt_model_build_params.param_dtype = DT_BF16 (keep_batchnorm_fp32 keeps
 *     BatchNorm2d parameters f32), run the forward under autocast with the
 *     same dtype (which casts the f32 input of the first layer), and keep
 *     f32 master weights in the optimizer (train.h / optim.h).
 *
 * Usage
 * -----
 *     dt_dtype old;
 *     dt_autocast_set(ctx, DT_BF16, &old);           // forward in bf16
 *     dt_tensor *logits = dt_model_forward(ctx, m, x);   // x f32: cast by the first conv
 *     dt_autocast_set(ctx, old, NULL);
 *     dt_tensor *loss = dt_cross_entropy(ctx, logits, y); // bf16 logits, f32 loss
 *     dt_backward(ctx, loss);                         // f32 (or bf16) grads in the flats
 */
#ifndef DTRAIN_PRECISION_H
#define DTRAIN_PRECISION_H

#include "dtrain/base.h"
#include "dtrain/ops.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dt_op, dt_amp_class, dt_op_name, dt_autocast_class and
 * dt_amp_class_name: the op table (ops.h), which gives every op its
 * autocast class. */

/* Turn autocast on for ctx with dtype DT_BF16 or DT_F16, or off with
 * DT_F32; *prev (may be NULL) receives the previous setting so a region can
 * restore it. Other dtypes: DT_ERR_DTYPE, unchanged. Off by default;
 * dt_ctx_reset leaves it as it is. */
DT_API dt_status dt_autocast_set(dt_ctx *ctx, dt_dtype dtype, dt_dtype *prev);
/* The context's autocast dtype (DT_F32 = off; DT_F32 for NULL). */
DT_API dt_dtype dt_autocast_dtype(const dt_ctx *ctx);

/* True for the floating dtypes ops compute with: f32, bf16, f16. */
DT_API bool dt_dtype_is_float(dt_dtype t);
/* Whether matmul, linear and addmm in dtype t run natively on this CPU (oneDNN
 * has kernels for it: bf16 on AVX-512 machines, f16 on AVX512_FP16 ones);
 * false means the operands are widened to f32 (same values, f32 speed).
 * DT_F32: true. Asked of oneDNN at run time once and cached; follows
 * ONEDNN_MAX_CPU_ISA. conv2d has its own answer: dt_k_conv2d_native (kernels.h). */
DT_API bool dt_precision_native(dt_dtype t);
/* The precision "auto" trains in on this CPU: DT_BF16 where it has bf16
 * arithmetic (AVX512_BF16; every CPU with AMX has it too) and oneDNN runs
 * bf16 matmuls natively (dt_precision_native), DT_F32 elsewhere. Follows
 * the caps (DT_MAX_CPU_ISA for dtrain's kernels, ONEDNN_MAX_CPU_ISA for
 * oneDNN's). *why (may be NULL) receives a static phrase saying why, for
 * printing: "this CPU has AVX512_BF16", "no AVX512_BF16 on this CPU", ... */
DT_API dt_dtype dt_precision_auto(const char **why);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PRECISION_H */
