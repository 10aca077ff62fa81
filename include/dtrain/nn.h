/* dtrain/nn.h — modules, models with named parameters in flat buffers, hooks.
 *
 * Overview
 * --------
 * A module (dt_module) is a layer (Linear, Conv2d, BatchNorm2d, ...), a loss,
 * or a container (Sequential) of named children. Build a tree of modules,
 * then hand its root to dt_model_build(), which owns the tree from then on:
 *
 *   - Every parameter of every module gets a view into ONE 64-byte aligned
 *     flat f32 buffer (dt_model_params), each tensor starting on a 64-byte
 *     boundary (the gaps are zero padding). Gradients are views into a
 *     mirror flat buffer with the same offsets (dt_model_grads); the caller
 *     may replace it with its own memory (dt_model_set_grad_buffer; DDP
 *     hands in shared memory). Buffers that are not trained (batch-norm
 *     running stats) live in a third flat buffer (dt_model_buffers).
 *   - Names are PyTorch's state_dict keys: a child's name is its index in a
 *     Sequential ("0", "1", ...) or the name given to dt_nn_seq_add
 *     ("layer1", "fc"); a tensor's name is the path of its module plus its
 *     own name: "layer1.0.weight", "layer1.1.running_mean", "fc.bias".
 *   - Entries are enumerated in model order, as PyTorch's state_dict lists
 *     them (each module's parameters, then its buffers, then its children).
 *   - Initialisation follows PyTorch's defaults, driven by Philox keyed by
 *     (seed, DT_RNG_INIT, entry index): Linear and Conv2d weights and biases
 *     U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5));
 *     norms' weight 1, bias 0; running_var 1; Embedding N(0, 1).
 *
 * Forward runs eagerly on a dt_ctx (tensor.h, autograd.h): outputs are
 * temporaries valid until dt_ctx_reset. A module given a NULL input returns
 * NULL and keeps the earlier error (or sets DT_ERR_NULL); a module given an
 * input of the wrong shape returns NULL with a message that names the module
 * path, its kind and both shapes. Nothing aborts.
 *
 * Hooks (up to DT_NN_MAX_HOOKS of each kind per module, fired in the order
 * added; a negative return stops the forward (NULL output) or the backward
 * with that status):
 *   - forward pre / post: around the module's forward.
 *   - backward pre / post: built on the tape marks of autograd.h. "pre"
 *     fires when backward reaches the module's output (before any of its
 *     ops' gradients), "post" when its inputs' gradients are done. Recorded
 *     only in grad mode.
 *   - grad-ready (dt_model_on_grad_ready): fires during backward as soon as
 *     a parameter's gradient for this backward pass is final in the flat
 *     grad buffer (DDP launches a bucket's all-reduce from here).
 *
 * Lifecycle: constructors return modules owned by the caller until added to
 * a container (which then owns them) or passed to dt_model_build (which
 * owns the whole tree, also on failure). dt_model_free frees everything;
 * dt_module_free frees a module tree that was never built. NULL is a no-op.
 *
 * Usage
 * -----
 *     dt_module *net = dt_nn_seq(0, NULL);
 *     dt_nn_seq_add(net, NULL, dt_nn_linear(784, 128, true));   // "0"
 *     dt_nn_seq_add(net, NULL, dt_nn_relu());                    // "1"
 *     dt_nn_seq_add(net, NULL, dt_nn_linear(128, 10, true));    // "2"
 *     dt_model *m = dt_model_build(net, 42);
 *     dt_ctx *ctx = dt_ctx_init(NULL);
 *     for (step...) {
 *         dt_model_zero_grad(m);
 *         dt_tensor *x = dt_tensor_view_of(ctx, images, DT_F32, 2, (int64_t[]){B, 784});
 *         dt_tensor *y = dt_tensor_view_of(ctx, labels, DT_I64, 1, (int64_t[]){B});
 *         dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y);
 *         if (!loss || dt_backward(ctx, loss) < 0) { report dt_last_error(); }
 *         dt_optim_step(opt, dt_model_params(m), dt_model_grads(m));   // optim.h
 *         dt_ctx_reset(ctx);
 *     }
 *     dt_model_free(m);
 *
 * Models by name (models/): dt_model_create("convnet" | "mlp", seed, NULL).
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/autograd.h"
#include "dtrain/base.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_NN_MAX_HOOKS 4

typedef struct dt_module dt_module;
typedef struct dt_model dt_model;

typedef enum {
    DT_NN_SEQUENTIAL = 0,
    DT_NN_LINEAR,
    DT_NN_CONV2D,
    DT_NN_BATCHNORM2D,
    DT_NN_LAYERNORM,
    DT_NN_RELU,
    DT_NN_GELU,
    DT_NN_MAXPOOL2D,
    DT_NN_AVGPOOL2D,
    DT_NN_FLATTEN,
    DT_NN_DROPOUT,
    DT_NN_EMBEDDING,
    DT_NN_CROSS_ENTROPY_LOSS,
    DT_NN_MSE_LOSS,
    DT_NN_CUSTOM,
    DT_NN_KIND_COUNT
} dt_nn_kind;

/* ---- module constructors (NULL + error on bad arguments) -------------------- */

/* y = x W^T + b; W [out, in], b [out]. Input [..., in]. */
DT_API dt_module *dt_nn_linear(int64_t in_features, int64_t out_features, bool bias);
/* NCHW conv, W [out, in, k, k], b [out]; symmetric stride and padding. */
DT_API dt_module *dt_nn_conv2d(int64_t in_channels, int64_t out_channels, int kernel, int stride, int pad,
                               bool bias);
/* Batch norm over channels of [N, C, H, W] (or [N, C]): weight, bias, and
 * buffers running_mean, running_var, num_batches_tracked (i64). PyTorch
 * defaults: eps 1e-5, momentum 0.1. */
DT_API dt_module *dt_nn_batchnorm2d(int64_t channels, float eps, float momentum);
/* Layer norm over the last dim D (weight, bias [D]); PyTorch default eps 1e-5. */
DT_API dt_module *dt_nn_layernorm(int64_t dim, float eps);
DT_API dt_module *dt_nn_relu(void);
/* Exact (erf) GELU, PyTorch's default. */
DT_API dt_module *dt_nn_gelu(void);
/* k x k pooling; stride 0 = k (PyTorch's default). */
DT_API dt_module *dt_nn_maxpool2d(int kernel, int stride, int pad);
DT_API dt_module *dt_nn_avgpool2d(int kernel, int stride, int pad);
/* Merge dims start..end (PyTorch nn.Flatten: 1, -1). */
DT_API dt_module *dt_nn_flatten(int start_dim, int end_dim);
/* Inverted dropout with probability p in [0, 1); identity in eval mode.
 * The mask of forward call c of module j is keyed by
 * (model seed, DT_RNG_DROPOUT, rank << 32 | j, c): see dt_model_set_rank. */
DT_API dt_module *dt_nn_dropout(float p);
/* Lookup table weight [num, dim], N(0, 1) init; input i32/i64 indices. */
DT_API dt_module *dt_nn_embedding(int64_t num_embeddings, int64_t dim);
/* Losses, used through dt_module_loss (not in a Sequential). CrossEntropy:
 * mean over the batch of logits [N, C] vs labels [N] (i32/i64). MSE: mean
 * of squared differences. */
DT_API dt_module *dt_nn_cross_entropy_loss(void);
DT_API dt_module *dt_nn_mse_loss(void);

/* A container. children[0..n) (may be NULL with n 0) are taken over and named
 * "0", "1", ... Returns NULL (and frees the children) on error. */
DT_API dt_module *dt_nn_seq(int n, dt_module **children);
/* Append child to a Sequential under `name` (NULL: its index, "3"). The
 * container takes ownership, also on error. Names must be unique, non-empty,
 * without '.'. */
DT_API dt_status dt_nn_seq_add(dt_module *seq, const char *name, dt_module *child);

/* Custom modules (the models use them; so can users). */
typedef enum {
    DT_NN_INIT_ZEROS = 0,
    DT_NN_INIT_ONES,
    DT_NN_INIT_UNIFORM,   /* U(-a, a) */
    DT_NN_INIT_NORMAL,    /* N(0, a^2) */
    DT_NN_INIT_KAIMING,   /* PyTorch Linear/Conv default: U(+-1/sqrt(fan_in)), fan_in = numel/shape[0] */
    DT_NN_INIT_XAVIER,    /* U(+-sqrt(6/(fan_in+fan_out))), 2-D [fan_in, fan_out] (Paddle's default) */
} dt_nn_init;

typedef struct dt_nn_param_spec {
    const char *name;                /* "weight", "w0"; copied */
    int ndim;                        /* 1..DT_MAX_DIMS */
    int64_t shape[DT_MAX_DIMS];
    dt_nn_init init;                 /* how dt_model_build fills it */
    float a;                         /* bound / std for UNIFORM and NORMAL */
    bool is_buffer;                  /* true: not trained, lives in the buffers flat buffer */
} dt_nn_param_spec;

/* forward(ctx, self, x, ud) -> output; get parameters with dt_module_param. */
typedef dt_tensor *(*dt_nn_forward_fn)(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud);
/* A module of kind DT_NN_CUSTOM named by `type` (shown in errors) with the
 * given parameters (copied). ud is borrowed for the module's lifetime. */
DT_API dt_module *dt_nn_custom(const char *type, int nparams, const dt_nn_param_spec *params,
                               dt_nn_forward_fn forward, void *ud);

/* Free a module tree that was never passed to dt_model_build. */
DT_API void dt_module_free(dt_module *m);

/* ---- running modules ---------------------------------------------------------- */

/* Forward through m (with its hooks). Valid only after dt_model_build. */
DT_API dt_tensor *dt_module_forward(dt_ctx *ctx, dt_module *m, dt_tensor *x);
/* A loss module: pred vs target -> scalar. */
DT_API dt_tensor *dt_module_loss(dt_ctx *ctx, dt_module *m, dt_tensor *pred, dt_tensor *target);

DT_API dt_nn_kind dt_module_kind(const dt_module *m);
/* "Linear", "Conv2d", ... (PyTorch class names); a custom module's type. */
DT_API const char *dt_module_type(const dt_module *m);
/* Full path in the model ("layer1.0"; "" for the root). Borrowed. */
DT_API const char *dt_module_path(const dt_module *m);
DT_API int dt_module_num_children(const dt_module *m);
DT_API dt_module *dt_module_child(const dt_module *m, int i);
/* Parameter / buffer i of this module in declaration order (Linear: 0
 * weight, 1 bias; BatchNorm2d: weight, bias, running_mean, running_var,
 * num_batches_tracked). NULL before build or out of range. */
DT_API dt_tensor *dt_module_param(const dt_module *m, int i);
DT_API bool dt_module_is_training(const dt_module *m);
/* Replace m's built-in forward by fn(ctx, m, x, ud) (m's hooks still fire
 * around it; parameters via dt_module_param); fn NULL restores the built-in
 * one. dt_syncbn_convert (parallel.h) uses it. ud is borrowed. */
DT_API dt_status dt_module_set_forward(dt_module *m, dt_nn_forward_fn fn, void *ud);
/* eps and momentum (0 for LayerNorm) of a BatchNorm2d or LayerNorm module;
 * either pointer may be NULL. DT_ERR_INVALID_ARG for other kinds. */
DT_API dt_status dt_module_norm_config(const dt_module *m, float *eps, float *momentum);

/* ---- hooks ---------------------------------------------------------------------- */

/* Forward pre-hook: before m's forward sees x. */
typedef dt_status (*dt_fwd_pre_hook)(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud);
/* Forward post-hook: after m's forward made y (not NULL). */
typedef dt_status (*dt_fwd_post_hook)(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud);
/* Backward hook (pre or post): see the overview. */
typedef dt_status (*dt_bwd_hook)(dt_ctx *ctx, dt_module *m, void *ud);

DT_API dt_status dt_module_add_forward_pre_hook(dt_module *m, dt_fwd_pre_hook fn, void *ud);
DT_API dt_status dt_module_add_forward_post_hook(dt_module *m, dt_fwd_post_hook fn, void *ud);
DT_API dt_status dt_module_add_backward_pre_hook(dt_module *m, dt_bwd_hook fn, void *ud);
DT_API dt_status dt_module_add_backward_post_hook(dt_module *m, dt_bwd_hook fn, void *ud);
/* Remove every hook of every kind from m (not its children). */
DT_API void dt_module_clear_hooks(dt_module *m);

/* ---- models --------------------------------------------------------------------- */

/* Lay out and initialise the parameters of the tree under root (see the
 * overview). Takes ownership of root (freed on failure too), except when
 * root already belongs to a model or a container (DT_ERR_STATE, untouched). */
DT_API dt_model *dt_model_build(dt_module *root, uint64_t seed);
DT_API void dt_model_free(dt_model *m);
/* Redraw every randomly initialised parameter exactly as PyTorch would after
 * torch.manual_seed(seed) when it constructs the same modules in the same
 * order (the entry order): one MT19937 stream (dt_torch_rng, base.h),
 * uniform_ for Linear/Conv2d weights and biases (+-1/sqrt(fan_in)) and for
 * Xavier, normal_ for Embedding. Parameters with constant inits and buffers
 * are left as they are. A model whose modules PyTorch builds in the same
 * order then starts from bit-identical weights (the ConvNet: test_nn_torch_init). */
DT_API dt_status dt_model_init_torch(dt_model *m, uint64_t seed);

/* Forward through the root module. */
DT_API dt_tensor *dt_model_forward(dt_ctx *ctx, dt_model *m, dt_tensor *x);
DT_API dt_module *dt_model_root(const dt_model *m);
/* Module by path ("layer1.0"; "" is the root); NULL if none. */
DT_API dt_module *dt_model_find_module(const dt_model *m, const char *path);

/* Train (true, the default) or eval mode for every module. */
DT_API void dt_model_train(dt_model *m, bool training);
/* Dropout masks depend on the rank so that data-parallel ranks differ
 * (default 0). */
DT_API void dt_model_set_rank(dt_model *m, int rank);

/* One parameter or buffer, in model order. */
typedef struct dt_param_info {
    const char *name;              /* "layer1.0.weight"; borrowed, lives with the model */
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    size_t offset;                 /* element offset (of dtype) into its flat buffer,
                                      a multiple of 64 bytes */
    size_t numel;
    dt_dtype dtype;                /* f32; num_batches_tracked is i64 */
    bool is_buffer;                /* false: in dt_model_params / dt_model_grads;
                                      true: in dt_model_buffers */
    dt_tensor *tensor;             /* the view; borrowed */
    dt_module *module;             /* owner */
} dt_param_info;

/* Number of entries (parameters and buffers). */
DT_API size_t dt_model_num_entries(const dt_model *m);
DT_API dt_status dt_model_entry(const dt_model *m, size_t i, dt_param_info *out);
/* Index of the entry named `name`, or -1. */
DT_API int64_t dt_model_find_entry(const dt_model *m, const char *name);
/* Number of parameter tensors (entries with is_buffer false). */
DT_API size_t dt_model_num_params(const dt_model *m);
/* Trainable elements, without padding (the "parameter count"). */
DT_API size_t dt_model_param_count(const dt_model *m);

/* The flat parameter buffer: dt_model_flat_numel floats, 64-byte aligned,
 * padding zero. Owned by the model. */
DT_API float *dt_model_params(const dt_model *m);
DT_API size_t dt_model_flat_numel(const dt_model *m);
/* The flat gradient buffer (same layout). */
DT_API float *dt_model_grads(const dt_model *m);
/* Replace the gradient buffer by caller memory of dt_model_flat_numel floats
 * (borrowed; must outlive the model or the next call). The contents are
 * used as they are (zero them first). The model's own buffer is freed; NULL
 * switches back to a fresh zeroed buffer owned by the model. */
DT_API dt_status dt_model_set_grad_buffer(dt_model *m, float *grads);
/* Zero the whole gradient buffer. */
DT_API void dt_model_zero_grad(dt_model *m);
/* The buffers flat buffer (bytes) and its size in bytes. */
DT_API void *dt_model_buffers(const dt_model *m);
DT_API size_t dt_model_buffers_nbytes(const dt_model *m);

/* Grad-ready callback: entry `index` (a parameter) has its final gradient
 * for this backward pass in the flat grad buffer. */
typedef dt_status (*dt_grad_ready_fn)(dt_model *m, size_t index, const dt_param_info *p, void *ud);
/* Register a callback for every parameter (up to DT_NN_MAX_HOOKS). */
DT_API dt_status dt_model_on_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ud);
/* Remove a callback added with the same fn and ud (DT_ERR_NOT_FOUND if none). */
DT_API dt_status dt_model_remove_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ud);

/* ---- the model zoo (models/) ----------------------------------------------------- */

typedef struct dt_model_config {
    int64_t num_classes;   /* convnet: output classes; default 10 */
    int64_t mlp_seq;       /* mlp: tokens per sample; default 128 */
    int64_t mlp_dim;       /* mlp: input/output width; default 1024 */
    int64_t mlp_hidden;    /* mlp: hidden width; default 4096 */
} dt_model_config;
DT_API dt_model_config dt_model_config_default(void);

/* "convnet": the classic MNIST ConvNet (PyTorch names layer1.{0,1}.*,
 *   layer2.{0,1}.*, fc.*): conv5x5 1->16 pad 2, BN, ReLU, maxpool 2;
 *   conv5x5 16->32 pad 2, BN, ReLU, maxpool 2; flatten; linear 1568->10.
 *   Input [B, 1, 28, 28] f32, target [B] i64 labels, cross-entropy loss.
 * "mlp": Paddle's auto-parallel MLP: x[B,128,1024] @ w0[1024,4096] @
 *   w1[4096,1024], loss = mean of the output (no bias, no activation;
 *   Xavier-uniform init as Paddle's create_parameter). Target unused.
 * cfg may be NULL for defaults. NULL + error for an unknown name. */
DT_API dt_model *dt_model_create(const char *name, uint64_t seed, const dt_model_config *cfg);
/* The zoo's names, NULL-terminated. */
DT_API const char *const *dt_model_zoo_names(void);
/* The name a model was created with ("" for dt_model_build). */
DT_API const char *dt_model_name(const dt_model *m);
/* Input shape for a batch of B (ndim into *ndim, dims into shape[]), and the
 * target's dtype and shape (*target_ndim 0 when the loss needs no target). */
DT_API dt_status dt_model_input_shape(const dt_model *m, int64_t batch, int *ndim, int64_t *shape,
                                      int *target_ndim, int64_t *target_shape, dt_dtype *target_dtype);
/* The model's training loss for its output (cross-entropy for convnet, mean
 * for mlp; a model from dt_model_build has none: DT_ERR_UNSUPPORTED). */
DT_API dt_tensor *dt_model_loss(dt_ctx *ctx, dt_model *m, dt_tensor *output, dt_tensor *target);
/* Matmul/conv FLOPs of one forward pass for batch B (2 per multiply-add);
 * a training step is about 3x (backward computes two products per layer,
 * minus the input gradient of the first layer, which is not needed). */
DT_API double dt_model_flops(const dt_model *m, int64_t batch, double *train_step_flops);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_NN_H */
