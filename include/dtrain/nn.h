/* dtrain/nn.h — modules, models with named parameters in flat buffers, hooks.
 *
 * Overview
 * --------
 * A module (dt_module) is a layer (Linear, Conv2d, BatchNorm2d, ...), a loss,
 * or a container of named children: a Sequential, or a custom module with
 * its own forward (a residual block: dt_nn_custom + dt_nn_add). Build a
 * tree of modules, then hand its root to dt_model_build(), which owns the
 * tree from then on:
 *
 *   - Every parameter of every module gets a view into the 64-byte aligned
 *     flat buffer of its dtype (a dt_flat, tensor.h: dt_model_flat(m,
 *     DT_FLAT_PARAMS, dtype)), each tensor starting on a 64-byte boundary
 *     (the gaps are zero padding), the flat's length padded to a multiple
 *     of the build's world size so a ZeRO shard is an equal range.
 *     Gradients are views into a mirror flat with the same offsets
 *     (DT_FLAT_GRADS); the caller may replace it with its own memory
 *     (dt_model_set_grads; DDP hands in shared memory). Buffers that are
 *     not trained (batch-norm running stats; num_batches_tracked is i64)
 *     live in flats of their own dtype (DT_FLAT_BUFFERS). A spec names its
 *     dtype (dt_nn_param_spec.dtype), so offsets are in elements of it.
 *   - Names are PyTorch's state_dict keys: a child's name is its index in a
 *     Sequential ("0", "1", ...) or the name given to dt_nn_add
 *     ("layer1", "fc"); a tensor's name is the path of its module plus its
 *     own name: "layer1.0.weight", "layer1.1.running_mean", "fc.bias".
 *   - Entries are enumerated in model order, as PyTorch's state_dict lists
 *     them (each module's parameters, then its buffers, then its children).
 *   - Initialisation follows PyTorch's defaults, driven by Philox keyed by
 *     (seed, DT_RNG_INIT, entry index): Linear and Conv2d weights and biases
 *     U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a = sqrt(5));
 *     norms' weight 1, bias 0; running_var 1; Embedding N(0, 1).
 *
 *   - Two names may share one storage (dt_module_tie: weight tying).
 *   - A meta build (dt_model_build_params.meta) records the layout without
 *     parameter memory; a strategy allocates the shard it owns
 *     (dt_flat_alloc_shard) and fills it with dt_model_init_range, equal to
 *     the same range of a full build.
 *
 * Forward runs eagerly on a dt_ctx (tensor.h, autograd.h): outputs are
 * temporaries valid until dt_ctx_reset. A module given a NULL input returns
 * NULL and keeps the earlier error (or sets DT_ERR_NULL); a module given an
 * input of the wrong shape returns NULL with a message that names the module
 * path, its kind and both shapes. Nothing aborts.
 *
 * Hooks (any number per module, fired in the order added; each add returns
 * an id that dt_module_remove_hook / dt_model_remove_hook takes; a negative
 * return stops the forward (NULL output) or the backward with that status):
 *   - forward pre / post: around the module's forward.
 *   - backward pre / post: built on the tape marks of autograd.h. "pre"
 *     fires when backward reaches the module's output (before any of its
 *     ops' gradients), "post" when its inputs' gradients are done. Recorded
 *     only in grad mode.
 *   - grad-ready (dt_model_add_grad_ready_hook): fires during backward as soon as
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
 *     // a residual block: its own forward over named children
 *     static dt_tensor *block_fwd(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud) {
 *         dt_tensor *h = dt_relu(ctx, dt_module_forward(ctx, dt_module_find_child(self, "fc1"), x));
 *         return dt_add(ctx, x, dt_module_forward(ctx, dt_module_find_child(self, "fc2"), h));
 *     }
 *     dt_module *blk = dt_nn_custom("Block", 0, NULL, block_fwd, NULL);
 *     dt_nn_add(blk, "fc1", dt_nn_linear(128, 128, true));      // "1.fc1.weight", ...
 *     dt_nn_add(blk, "fc2", dt_nn_linear(128, 128, true));
 *
 *     dt_module *net = dt_nn_seq(0, NULL);
 *     dt_nn_add(net, NULL, dt_nn_linear(784, 128, true));   // "0"
 *     dt_nn_add(net, NULL, blk);                                 // "1"
 *     dt_nn_add(net, NULL, dt_nn_linear(128, 10, true));    // "2"
 *     dt_model *m;  dt_ctx *ctx;
 *     if (dt_model_build(net, 42, NULL, &m) < 0 || dt_ctx_init(NULL, &ctx) < 0) { report dt_last_error(); }
 *     for (step...) {
 *         dt_model_zero_grad(m);
 *         dt_tensor *x = dt_tensor_view_of(ctx, images, DT_F32, 2, (int64_t[]){B, 784});
 *         dt_tensor *y = dt_tensor_view_of(ctx, labels, DT_I64, 1, (int64_t[]){B});
 *         dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y);
 *         if (!loss || dt_backward(ctx, loss) < 0) { report dt_last_error(); }
 *         dt_optim_step(opt);        // optim.h: ranges over dt_model_flat(m, ...)
 *         dt_ctx_reset(ctx);
 *     }
 *     dt_model_free(m);
 *
 * Models by name: models.h (dt_model_create("convnet" | "mlp", ...)).
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/autograd.h"
#include "dtrain/base.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * "0", "1", ... Returns NULL (and frees the children) on error; n < 0, or
 * children NULL with n > 0, is an error too. */
DT_API dt_module *dt_nn_seq(int n, dt_module **children);
/* Append child to a container under `name` (NULL: its index, "3"). The
 * container is a Sequential (its forward runs the children in order) or a
 * custom module (dt_nn_custom: its own forward calls its children, found by
 * dt_module_find_child / dt_module_child, with dt_module_forward; this is
 * how residual and attention blocks are written, with PyTorch's names:
 * "block.conv1.weight"). The container takes ownership, also on error.
 * Names must be unique, non-empty, without '.'. */
DT_API dt_status dt_nn_add(dt_module *container, const char *name, dt_module *child);

/* Custom modules (the models use them; so can users). */
typedef enum {
    DT_NN_INIT_ZEROS = 0,
    DT_NN_INIT_ONES,
    DT_NN_INIT_UNIFORM,   /* U(-a, a) */
    DT_NN_INIT_NORMAL,    /* N(0, a^2) */
    DT_NN_INIT_KAIMING,   /* PyTorch Linear/Conv default: U(+-1/sqrt(fan_in)), fan_in = numel/shape[0] */
    DT_NN_INIT_XAVIER,    /* U(+-sqrt(6/(fan_in+fan_out))), 2-D [fan_in, fan_out] (Paddle's default) */
} dt_nn_init;

/* The most blocks a tensor-parallel parameter's slicing has (dt_nn_param_spec.tp_chunks). */
#define DT_TP_MAX_CHUNKS 4

typedef struct dt_nn_param_spec {
    const char *name;                /* "weight", "w0"; copied */
    int ndim;                        /* 1..DT_MAX_DIMS */
    int64_t shape[DT_MAX_DIMS];
    dt_nn_init init;                 /* how dt_model_build fills it */
    float a;                         /* bound / std for UNIFORM and NORMAL */
    bool is_buffer;                  /* true: not trained, lives in the buffers flat of its dtype */
    dt_dtype dtype;                  /* element type; default (0) DT_F32. f32, bf16 and f16
                                        entries are initialised as `init` says (in f32, then
                                        rounded); other dtypes are zero-initialised. f32, bf16
                                        and f16 parameters get gradients (precision.h) */
    int tp_dim;                      /* tensor parallelism (tp.h): 0 = the whole tensor (on every
                                        rank of the tensor-parallel group); d + 1 = this rank's
                                        slice along dim d of the full tensor (dt_tp_init_from
                                        fills it from the full model's init); default 0 */
    int tp_chunks;                   /* with tp_dim: dim d of the full tensor is tp_chunks equal
                                        blocks (GPT-2's c_attn: q | k | v, 3) and the rank holds
                                        its slice of each, side by side; 0 or 1 = one block */
    int64_t tp_chunk_rows[DT_TP_MAX_CHUNKS]; /* with tp_chunks (<= DT_TP_MAX_CHUNKS) blocks of
                                        different sizes: each one's size along dim d in the full
                                        tensor, a multiple of the ranks (Phi-3's qkv_proj with
                                        fewer kv heads: H hd, KV hd, KV hd); all 0 = equal blocks */
    bool has_padding_row;            /* true: row padding_row (along dim 0) is zero after the
                                        init, whatever the init draws (nn.Embedding's padding_idx:
                                        the draws are the same, the row is zeroed after them);
                                        dt_module_set_param_padding_row */
    int64_t padding_row;
} dt_nn_param_spec;

/* forward(ctx, self, x, ud) -> output; get parameters with dt_module_param. */
typedef dt_tensor *(*dt_nn_forward_fn)(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud);
/* A module of kind DT_NN_CUSTOM named by `type` (shown in errors) with the
 * given parameters (copied). ud is borrowed for the module's lifetime. */
DT_API dt_module *dt_nn_custom(const char *type, int nparams, const dt_nn_param_spec *params,
                               dt_nn_forward_fn forward, void *ud);

/* dt_nn_custom whose ud the module owns: free_ud(ud) runs when the module
 * is freed (with its model, by dt_module_free, or here when the module
 * cannot be made). For per-module configuration a forward reads (a
 * Llama attention's head counts and rotary frequencies). */
DT_API dt_module *dt_nn_custom_owned(const char *type, int nparams, const dt_nn_param_spec *params,
                                     dt_nn_forward_fn forward, void *ud, void (*free_ud)(void *));
/* RMSNorm over the last dim (torch.nn.RMSNorm, Llama's LlamaRMSNorm):
 * weight [dim] initialised to 1, y = x / sqrt(mean(x^2) + eps) * weight
 * (dt_rms_norm). A module of type "RMSNorm"; eps > 0. */
DT_API dt_module *dt_nn_rmsnorm(int64_t dim, float eps);

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
/* The child named `name` ("conv1"), NULL if none. */
DT_API dt_module *dt_module_find_child(const dt_module *m, const char *name);
/* Parameter / buffer i of this module in declaration order (Linear: 0
 * weight, 1 bias; BatchNorm2d: weight, bias, running_mean, running_var,
 * num_batches_tracked). NULL before build or out of range. */
DT_API dt_tensor *dt_module_param(const dt_module *m, int i);
DT_API bool dt_module_is_training(const dt_module *m);
/* Weight tying: parameter `param` of m becomes the same tensor as
 * `src_param` of src (two names, one storage; the gradients of both uses
 * add up in it), as PyTorch's `lm_head.weight = wte.weight`. Both modules
 * unbuilt and in the tree later built; same shape and dtype. The tied
 * entry keeps its place in the entry list (tied_to names the source) but
 * takes no room in the flats; its own init is not used (with
 * dt_model_init_torch it still draws its numbers, as torch does before the
 * assignment). */
DT_API dt_status dt_module_tie(dt_module *m, const char *param, dt_module *src, const char *src_param);
/* Replace m's built-in forward by fn(ctx, m, x, ud) (m's hooks still fire
 * around it; parameters via dt_module_param); fn NULL restores the built-in
 * one. dt_syncbn_convert (parallel.h) uses it. ud is borrowed. */
DT_API dt_status dt_module_set_forward(dt_module *m, dt_nn_forward_fn fn, void *ud);
/* eps and momentum (0 for LayerNorm) of a BatchNorm2d or LayerNorm module;
 * either pointer may be NULL. DT_ERR_INVALID_ARG for other kinds. */
DT_API dt_status dt_module_norm_config(const dt_module *m, float *eps, float *momentum);

/* ---- writing models: what a custom module's forward may read ------------------------- */

/* The zoo's models (models.h: the ConvNet, the MLP, GPT-2) are written with
 * this API and the ops of autograd.h only, as a user's own model is. The
 * pattern: a tree of custom modules (dt_nn_custom) whose forwards run their
 * children (dt_module_forward) or apply ops to their parameters directly
 * (dt_module_param), keep their own settings in their configuration
 * (dt_module_set_config: GPT-2's attention keeps its number of heads in k),
 * and take a fused shortcut only where nothing can observe it
 * (dt_module_tree_plain: no hook, replaced forward or checkpoint under the
 * module). A residual block is `dt_add(ctx, x, dt_module_forward(ctx,
 * child, x))` in its forward; an attention block is dt_attention_heads
 * (autograd.h) over its c_attn child's output with its dropout child's key
 * (dt_module_dropout_key). Example, a pre-norm residual block:
 *
 *     static dt_tensor *res_fwd(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud) {
 *         dt_module_config c;
 *         dt_module_get_config(dt_module_find_child(self, "ln"), &c);     // c.eps
 *         dt_tensor *h = dt_module_forward(ctx, dt_module_find_child(self, "ln"), x);
 *         return dt_add(ctx, x, dt_module_forward(ctx, dt_module_find_child(self, "fc"), h));
 *     }
 */

/* A module's configuration: what its constructor was given. Built-in kinds
 * fill the fields they use and leave the others 0: Linear in, out, bias;
 * Conv2d in, out (channels), k, stride, pad, bias; BatchNorm2d in
 * (channels), eps, momentum; LayerNorm in (dim), eps; MaxPool2d and
 * AvgPool2d k, stride, pad; Flatten start_dim, end_dim; Dropout p;
 * Embedding in (num_embeddings), out (dim). A custom module's configuration
 * belongs to it (all 0 from dt_nn_custom): its forward keeps its own
 * settings there (dt_module_set_config). The tensor-parallel layers of
 * tp.h are custom modules whose in and out are the full layer's features
 * (dt_tp_full_shape reads them). */
typedef struct dt_module_config {
    int64_t in;          /* input features / channels / norm dim / embedding rows; default 0 */
    int64_t out;         /* output features / channels / embedding dim; default 0 */
    int k;               /* kernel size (conv, pooling); a custom module's own; default 0 */
    int stride;          /* stride (conv, pooling); default 0 */
    int pad;             /* padding (conv, pooling); default 0 */
    bool bias;           /* Linear, Conv2d: has a bias; default false */
    float eps;           /* norms: added to the variance; default 0 */
    float momentum;      /* BatchNorm2d: running-stat momentum; default 0 */
    float p;             /* Dropout: drop probability in [0, 1); default 0 */
    int start_dim;       /* Flatten: first merged dim; default 0 */
    int end_dim;         /* Flatten: last merged dim (negative from the end); default 0 */
} dt_module_config;
/* m's configuration into *out. DT_ERR_NULL on NULL. */
DT_API dt_status dt_module_get_config(const dt_module *m, dt_module_config *out);
/* Replace a custom module's configuration (its forward's settings). Any
 * time, built or not; what the forward reads takes effect at its next
 * call. DT_ERR_INVALID_ARG for a built-in kind (whose configuration is its
 * constructor's arguments). */
DT_API dt_status dt_module_set_config(dt_module *m, const dt_module_config *c);
/* The user data a custom module's forward gets (dt_nn_custom's ud), and a
 * way to replace it (borrowed, as dt_nn_custom's). A forward may use it to
 * leave a mark for code that runs after it (GPT-2's training forward marks
 * the hidden states it returns in place of the logits). NULL / DT_ERR_NULL
 * on a NULL module; DT_ERR_INVALID_ARG when setting on a built-in kind. */
DT_API void *dt_module_user_data(const dt_module *m);
DT_API dt_status dt_module_set_user_data(dt_module *m, void *ud);
/* The module m was added to (NULL for a root or NULL). Borrowed. */
DT_API dt_module *dt_module_parent(const dt_module *m);
/* The number of parameters and buffers of m itself (its specs), 0 on NULL. */
DT_API int dt_module_num_params(const dt_module *m);
/* Spec i of m (as given to the constructor, name borrowed from m) into *out;
 * DT_ERR_RANGE when i is out of range. */
DT_API dt_status dt_module_param_spec(const dt_module *m, int i, dt_nn_param_spec *out);
/* How dt_model_build initialises parameter i of m (dt_nn_param_spec.init
 * and .a): GPT-2 draws its embeddings from N(0, 0.02^2) instead of the
 * Embedding default N(0, 1). Before dt_model_build (DT_ERR_STATE after);
 * DT_ERR_RANGE when i is out of range. */
DT_API dt_status dt_module_set_param_init(dt_module *m, int i, dt_nn_init init, float a);
/* Row `row` (along dim 0) of parameter i of m is zero after its init, as
 * nn.Embedding(padding_idx=row) and transformers' init leave an embedding's
 * padding row (the generators draw the same numbers; only that row's values
 * are replaced); row -1 removes it. The init only: whether the row trains
 * is the model's forward's business. Before dt_model_build (DT_ERR_STATE
 * after); DT_ERR_RANGE for i, or for a row outside [0, shape[0]). */
DT_API dt_status dt_module_set_param_padding_row(dt_module *m, int i, int64_t row);
/* True when m itself carries no hook, no replaced forward
 * (dt_module_set_forward) and no activation checkpointing: its forward
 * runs as written with nobody looking at its input or output. */
DT_API bool dt_module_is_plain(const dt_module *m);
/* True when m and every module under it is plain (dt_module_is_plain): a
 * forward may then fuse m's work with its neighbours' (GPT-2 fuses c_fc's
 * bias into the GELU) since no hook could see the difference. */
DT_API bool dt_module_tree_plain(const dt_module *m);
/* dt_relu of pool's forward of bn's (bn a BatchNorm2d, pool a MaxPool2d), a
 * CNN block's tail with the ReLU moved behind the pooling (the same values
 * and gradients). Where both are plain and pool takes 2 x 2 windows of
 * stride 2 without padding, bn's forward runs as
 * dt_batch_norm_relu_max_pool2x2 (one node; bn's output never stored);
 * otherwise each module's forward in turn. The ConvNet's blocks run so. */
DT_API dt_tensor *dt_module_forward_bn_relu_pool(dt_ctx *ctx, dt_module *bn, dt_module *pool, dt_tensor *x);
/* True when no module strictly under m has a hook other than a blind one
 * (dt_module_hook_set_blind) or a replaced forward (checkpointing allowed):
 * m's own forward may then keep activations in an internal layout (the
 * ConvNet's channel blocks) as long as it runs each child through
 * dt_module_forward, so the blind hooks and checkpoints still fire where
 * they are. m's own hooks fire outside its forward and are not looked at. */
DT_API bool dt_module_subtree_unobserved(const dt_module *m);
/* The Philox key of Dropout module m's next forward: (model seed,
 * DT_RNG_DROPOUT, rank << 32 | m's index in the model, m's forward count);
 * the count advances when m is in training mode. For fused ops that apply
 * a dropout child's mask themselves (GPT-2's attention passes it to
 * dt_attention_heads). m built (dt_model_build). */
DT_API dt_rng_key dt_module_dropout_key(dt_module *m);

/* ---- activation checkpointing ---------------------------------------------------- */

/* DeepSpeed's `activation_checkpointing` keys (the config issue fills this
 * from JSON). A checkpointed module keeps only its input in forward and
 * re-runs its forward during backward (torch.utils.checkpoint, reentrant
 * form: see dt_ag_checkpoint), with the dropout masks of the first run
 * (the forward counts of the modules under it are stashed and restored).
 * Its own hooks fire once, outside the region. */
typedef struct dt_act_ckpt_params {
    int number_checkpoints;              /* checkpoints per forward: with dt_model_checkpoint_type, the
                                            first N modules of the type; 0 = all. Default 0 */
    bool partition_activations;          /* split kept inputs over the tensor-parallel group: needs
                                            tensor parallelism (DT_ERR_UNSUPPORTED until it exists);
                                            default false */
    bool cpu_checkpointing;              /* keep inputs in CPU memory: they already are (no-op);
                                            default false */
    bool contiguous_memory_optimization; /* copy inputs into one buffer: the step arena already is one
                                            (no-op); default false */
    bool synchronize_checkpoint_boundary;/* device sync at each boundary: no device (no-op); default false */
    bool profile;                        /* time each region's forward and recomputation
                                            (dt_model_checkpoint_profile); default false */
} dt_act_ckpt_params;
DT_API dt_act_ckpt_params dt_act_ckpt_params_default(void);
/* Checkpoint module m of a built model with options p (copied); p NULL
 * turns it off. The module's forward must be a function of its input and
 * parameters (its input is its only tensor argument, as for every module). */
DT_API dt_status dt_module_set_checkpoint(dt_module *m, const dt_act_ckpt_params *p);
/* A checkpoint-unit policy (PyTorch's apply_activation_checkpointing
 * check_fn): true when module m is to be checkpointed. */
typedef bool (*dt_ckpt_check_fn)(const dt_module *m, void *ud);
/* Checkpoint every module of the model (in pre-order) for which check(m,
 * ud) is true, the first p->number_checkpoints of them when that is > 0
 * (the rest off); p NULL turns them all off. *count (may be NULL): how many
 * are on. A unit nested in another unit is recomputed inside it (nothing
 * wrong, only work twice): policies pick disjoint subtrees. */
DT_API dt_status dt_model_checkpoint_fn(dt_model *m, dt_ckpt_check_fn check, void *ud, const dt_act_ckpt_params *p,
                                        int *count);
/* dt_model_checkpoint_fn with the policy "dt_module_type(m) is `type`"
 * ("GPT2Block"; a zoo model names its units in dt_model_desc.ckpt_unit). */
DT_API dt_status dt_model_checkpoint_type(dt_model *m, const char *type, const dt_act_ckpt_params *p,
                                          int *count);
/* Profile totals over the model's checkpointed modules (with profile set):
 * seconds in first runs, seconds recomputing, number of first runs. */
DT_API dt_status dt_model_checkpoint_profile(const dt_model *m, double *forward_s, double *recompute_s,
                                             uint64_t *regions);

/* ---- hooks ---------------------------------------------------------------------- */

/* Forward pre-hook: before m's forward sees x. */
typedef dt_status (*dt_fwd_pre_hook)(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud);
/* Forward post-hook: after m's forward made y (not NULL). */
typedef dt_status (*dt_fwd_post_hook)(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud);
/* Backward hook (pre or post): see the overview. */
typedef dt_status (*dt_bwd_hook)(dt_ctx *ctx, dt_module *m, void *ud);

/* A hook's id: unique within its module (or model, for grad-ready hooks),
 * never 0. */
typedef uint64_t dt_hook_id;

/* Add a hook; *id (may be NULL) receives its id. Unbounded in number. */
DT_API dt_status dt_module_add_forward_pre_hook(dt_module *m, dt_fwd_pre_hook fn, void *ud, dt_hook_id *id);
DT_API dt_status dt_module_add_forward_post_hook(dt_module *m, dt_fwd_post_hook fn, void *ud, dt_hook_id *id);
DT_API dt_status dt_module_add_backward_pre_hook(dt_module *m, dt_bwd_hook fn, void *ud, dt_hook_id *id);
DT_API dt_status dt_module_add_backward_post_hook(dt_module *m, dt_bwd_hook fn, void *ud, dt_hook_id *id);
/* Remove the hook `id` of any kind from m; DT_ERR_NOT_FOUND when m has none
 * with that id (removed already, or another module's). */
DT_API dt_status dt_module_remove_hook(dt_module *m, dt_hook_id id);
/* Mark m's hook `id` blind: it reads no tensor it is given and replaces
 * none (ZeRO-3's parameter gathers and frees). A model's own forward may
 * keep activations in an internal layout (the ConvNet's channel-blocked
 * path) around blind hooks, which still fire at their modules; any other
 * hook makes it run its modules as written. DT_ERR_NOT_FOUND when m has no
 * hook `id`. */
DT_API dt_status dt_module_hook_set_blind(dt_module *m, dt_hook_id id);
/* Remove every hook of every kind from m (not its children). */
DT_API void dt_module_clear_hooks(dt_module *m);

/* ---- models --------------------------------------------------------------------- */

/* LoRA adapters (Hu et al. 2021, as Hugging Face PEFT's LoraConfig), for
 * dt_model_build_params.lora. Every layer whose path is a target or ends
 * in "." + a target (PEFT's list matching: "c_attn" matches
 * "transformer.h.0.attn.c_attn") and is a Linear or a Conv1D custom layer
 * (weight [in, out], GPT-2's) gets lora_A.weight [r, in] (U(+-1/sqrt(in)):
 * kaiming_uniform with a = sqrt(5)) and lora_B.weight [out, r] (zeros, so
 * the model starts as the base), and computes base(x) + scaling *
 * B(A(dropout(x))), scaling = alpha / r (alpha / sqrt(r) with rslora); with
 * layer_rank (PEFT's rank_pattern, alpha_pattern) each layer its own r and
 * alpha, so its own scaling. A module exclude names (PEFT's
 * exclude_modules) is never adapted.
 * Every other parameter of the model is frozen (dt_model_build_params.frozen
 * semantics): only the adapters train, and the modules_to_save and the
 * biases that bias names (PEFT's settings of those names, below).
 * With dora (DoRA, PEFT's use_dora) each adapted layer also gets
 * lora_magnitude_vector.weight [out] (trainable) and computes
 * m / ||W + scaling B A|| * (W x + scaling B(A(x))) + bias, the row norms
 * of the adapted weight taken as constants in the backward (PEFT detaches
 * them); with lora_dropout active in training, PEFT's form
 * base(x) + (m / n - 1) W x' + m / n scaling B(A(x')), x' = dropout(x). The
 * magnitudes start at the base weight's row norms ||W||: a trainer writes
 * them when it starts and when it loads base weights without them
 * (dt_trainer_init, dt_trainer_load_weights). DoRA on a tensor-parallel
 * layer is DT_ERR_UNSUPPORTED. */
/* PEFT's bias setting: which biases train beside the adapters (and are saved with them). */
typedef enum {
    DT_LORA_BIAS_NONE = 0,  /* "none": none */
    DT_LORA_BIAS_ALL,       /* "all": every parameter named "bias" (norms' too) */
    DT_LORA_BIAS_LORA_ONLY, /* "lora_only": the adapted layers' own */
} dt_lora_bias;
typedef struct dt_lora_params {
    int64_t r;                   /* rank, 1..65536 (default 8) */
    float alpha;                 /* lora_alpha (default 8) */
    float dropout;               /* lora_dropout on the adapters' input, [0, 1) (default 0) */
    const char *const *targets;  /* NULL-terminated layer names (required; borrowed during the build): a
                                    layer is adapted when its name is one of them or ends in ".NAME";
                                    {"all-linear", NULL}: every Linear and Conv1D layer but the output
                                    layer lm_head (PEFT's target_modules = "all-linear") */
    bool rslora;                 /* scaling alpha / sqrt(r) (default false) */
    bool dora;                   /* DoRA: weight-decomposed adapters (default false) */
    const char *const *modules_to_save; /* NULL-terminated module names (PEFT's modules_to_save): a
                                    module whose path is one of them or ends in "." + one
                                    ("lm_head", "model.embed_tokens") trains whole, with every
                                    module inside it, beside the adapters (its parameters are not
                                    frozen; no adapters go inside it, as in PEFT); a
                                    weight tied to another (tie_word_embeddings) trains as one
                                    when either module is named (PEFT's ensure_weight_tying). A
                                    name matching no module is refused. Borrowed during the
                                    build; default NULL (none) */
    const int64_t *layers;       /* PEFT's layers_to_transform: with nlayers > 0, a layer a target
                                    name matches by its end (not one named whole) is adapted only
                                    when its layer index is one of layers[0..nlayers): the first
                                    all-digit part of its path after a part named by one of
                                    layers_pattern ("layers", "h"; NULL: after any part but the
                                    first), not its last part ("model.layers.3.mlp.down_proj": 3);
                                    borrowed during the build; default NULL */
    size_t nlayers;
    const char *const *layers_pattern; /* PEFT's layers_pattern (NULL-terminated), or NULL */
    dt_lora_bias bias;           /* PEFT's bias (default DT_LORA_BIAS_NONE) */
    dt_status (*layer_rank)(void *ud, const char *layer, int64_t *r, float *alpha);
                                 /* optional (default NULL: every layer r and alpha): called with
                                    layer_ud for each layer about to be adapted, its full path
                                    ("model.layers.0.self_attn.q_proj") and *r = r, *alpha = alpha,
                                    which it may change for that layer (PEFT's rank_pattern and
                                    alpha_pattern: ckpt.h dt_lora_pattern): the layer gets lora_A
                                    [*r, in], lora_B [out, *r] and the scaling *alpha / *r
                                    (dt_lora_layer_scaling); a status < 0 stops the build with it.
                                    Also called by dt_lora_layer_scaling */
    bool (*exclude)(void *ud, const char *module);
                                 /* optional (default NULL: none): PEFT's exclude_modules, called
                                    with layer_ud for each module path the build considers; true:
                                    the module is never adapted, even when a target names it
                                    (the modules inside it still are considered) */
    void *layer_ud;              /* passed to layer_rank and exclude (borrowed while they can be
                                    called; default NULL) */
} dt_lora_params;
DT_API dt_lora_params dt_lora_params_default(void);
/* DoRA's magnitudes' child module (PEFT's name; its parameter "weight"). */
#define DT_LORA_MAGNITUDE "lora_magnitude_vector"
/* Whether parameter name `name` is a LoRA adapter's weight (it ends in
 * ".lora_A.weight", ".lora_B.weight" or, DoRA's magnitudes,
 * ".lora_magnitude_vector.weight"). */
DT_API bool dt_lora_is_adapter(const char *name);
/* Whether `name` ends in ".lora_magnitude_vector.weight" (DoRA). */
DT_API bool dt_lora_is_magnitude(const char *name);
/* The length of the adapted layer's name in adapter weight `name`
 * ("h.0.attn.c_attn.lora_A.weight": 15), 0 if it is none. */
DT_API size_t dt_lora_layer_len(const char *name);
/* Whether targets are {"all-linear", NULL} (PEFT's shorthand: every Linear
 * and Conv1D layer but the output layer). */
DT_API bool dt_lora_targets_all_linear(const char *const *targets);
/* The adapters' scaling: alpha / r, or alpha / sqrt(r) with rslora (p's
 * own r and alpha: a layer of a model built with layer_rank has its own,
 * dt_lora_layer_scaling). */
DT_API float dt_lora_scaling(const dt_lora_params *p);
/* Layer `layer`'s rank and scaling under p (either out-parameter may be
 * NULL): p's layer_rank applied to r and alpha (when set), then
 * alpha_l / r_l (alpha_l / sqrt(r_l) with rslora), as the build gives
 * that layer. DT_ERR_INVALID_ARG when layer_rank gives a rank outside
 * 1..65536 or an alpha not > 0, naming the layer; layer_rank's own
 * errors as it returns them. */
DT_API dt_status dt_lora_layer_scaling(const dt_lora_params *p, const char *layer, int64_t *r, float *scaling);

/* How LoRA adapts a custom layer that holds a slice of a larger linear
 * layer (a tensor-parallel layer, tp.h, sets it when it makes the layer;
 * dt_module_set_lora). The adapters get the full layer's names and their
 * slice of its shapes: split 1 (the layer's output rows are sliced,
 * column-parallel): lora_A [r, in] whole, lora_B [out / ranks, r] sliced
 * along dim 0 in `chunks` equal chunks as the layer's own output; split 2
 * (input columns sliced, row-parallel): lora_A [r, in / ranks] sliced along
 * dim 1, lora_B [out, r] whole. lora_A is drawn U(+-1/sqrt(in)) of the full
 * in. The adapters' modules join `group` (dt_module.tp). With the
 * adapters added, the layer's forward is fwd(ctx, layer, x, the hook):
 * the base's output plus the adapters' (lora_A, lora_B, lora_dropout
 * children; the layer's scaling, dt_lora_layer_scaling, is kept in lora_A's eps),
 * with whatever collectives the split needs. */
typedef struct dt_lora_hook {
    int64_t in, out;           /* the full layer's features */
    int split;                 /* 1: output rows sliced, 2: input columns sliced */
    int ranks, chunks;         /* the slicing: ranks >= 1, chunks >= 1 (0 = 1) */
    int64_t chunk_rows[DT_TP_MAX_CHUNKS]; /* the chunks' full sizes when they differ (all 0: equal;
                                             dt_nn_param_spec.tp_chunk_rows) */
    bool weight_in_out;        /* the base weight is [in, out] (GPT-2's Conv1D: PEFT's fan_in_fan_out) */
    struct dt_pg *group;       /* the adapters' tensor-parallel group (borrowed) */
    int flags;                 /* the forward's own (not read by nn) */
    dt_nn_forward_fn fwd;      /* called with ud = the module's copy of this hook */
} dt_lora_hook;
/* Set (a copy of) hook h on custom layer m, before the build; NULL clears it. */
DT_API dt_status dt_module_set_lora(dt_module *m, const dt_lora_hook *h);
/* m's LoRA hook, or NULL. */
DT_API const dt_lora_hook *dt_module_lora(const dt_module *m);

/* Initial-value generators (dt_model_build_params.init, dt_model_init_range). */
typedef enum {
    DT_INIT_PHILOX = 0, /* dt_model_build's own init: Philox keyed by (seed, DT_RNG_INIT, entry, element) */
    DT_INIT_TORCH,      /* dt_model_init_torch's: PyTorch's sequential MT19937 stream */
    DT_INIT_RNG_COUNT
} dt_init_rng;

/* Options of dt_model_build. */
typedef struct dt_model_build_params {
    int world;   /* pad every flat to a multiple of world * (64 B / element) elements so rank r's
                    shard (dt_flat_shard) is an equal, aligned range; default 1 */
    bool meta;   /* true: record the layout only; no parameter or gradient flat is allocated
                    (dt_model_flat gives base NULL, entries' tensors are NULL) and the model
                    cannot run forward. A strategy allocates the shard it owns and fills it
                    with dt_model_init_range. Buffers are allocated and initialised as usual.
                    Default false */
    dt_dtype param_dtype;      /* dtype of every trainable parameter whose spec is f32: DT_F32
                                  (default: as the specs say), DT_BF16 or DT_F16. Values are
                                  initialised in f32 and rounded once (a bf16 model equals
                                  the f32 model cast to bf16); gradients live in the
                                  DT_FLAT_GRADS flat of the same dtype. Buffers: buffer_dtype */
    bool keep_batchnorm_fp32;  /* with a low param_dtype: BatchNorm2d weight and bias stay f32
                                  (apex's keep_batchnorm_fp32), and with a low buffer_dtype its
                                  running statistics too; default true */
    const char *const *frozen; /* NULL-terminated fnmatch(3) patterns of entry names ('*' matches
                                  dots too: "transformer.h.0.*", "*.wte.weight"); a parameter whose
                                  name matches one is frozen: named, ordered, initialised and
                                  saved as a parameter, but stored with the buffers (the
                                  DT_FLAT_BUFFERS flat of its dtype) with no gradient, so
                                  optimizers, gradient reductions and ZeRO sharding never see
                                  it (no optimizer state, no gradient memory; every rank holds
                                  it whole). An entry tied to another follows its source.
                                  Borrowed during the build; default NULL (none) */
    const dt_lora_params *lora; /* LoRA adapters on the target layers, every other parameter
                                  frozen (dt_lora_params); borrowed during the build; default NULL */
    const char *const *f32_modules; /* with a low param_dtype: NULL-terminated module paths whose
                                  parameters (and those of the modules inside them) stay f32
                                  (the precision policy's per-module override, e.g. norms);
                                  borrowed during the build; default NULL */
    dt_dtype buffer_dtype;     /* dtype of every buffer whose spec is f32 (FSDP MixedPrecision's
                                  buffer_dtype: batch norm's running statistics): DT_F32 (default:
                                  as the specs say), DT_BF16 or DT_F16; except the buffers of a
                                  batch norm under keep_batchnorm_fp32 and of f32_modules.
                                  Initialised in f32 and rounded once; dt_batch_norm updates
                                  low-precision statistics in f32 and rounds them back */
    dt_init_rng init;          /* DT_INIT_PHILOX (default) draws every randomly initialised
                                  parameter here; DT_INIT_TORCH leaves them zero (constant inits
                                  and buffers are written as usual) for dt_model_init_torch or
                                  dt_model_init_tp(..., DT_INIT_TORCH) to draw next, as
                                  dt_model_create does with it: no Philox draw is made that
                                  PyTorch's stream then replaces (GPT-2 124M: about 3 s on two
                                  cores). No effect on a meta build's parameters */
} dt_model_build_params;
DT_API dt_model_build_params dt_model_build_params_default(void);

/* Is module path `path` (dotted, "" for the root) `prefix` or inside it?
 * ("a.b" is inside "a", not inside "a.bc"; everything is inside "".) */
DT_API bool dt_module_path_within(const char *path, const char *prefix);

/* Lay out and initialise the parameters of the tree under root (see the
 * overview) into *out. p NULL: defaults. Takes ownership of root (freed on
 * failure too), except when root already belongs to a model or a container
 * (DT_ERR_STATE, untouched). *out is NULL on error. */
DT_API dt_status dt_model_build(dt_module *root, uint64_t seed, const dt_model_build_params *p, dt_model **out);
DT_API void dt_model_free(dt_model *m);
/* Redraw every randomly initialised parameter exactly as PyTorch would after
 * torch.manual_seed(seed) when it constructs the same modules in the same
 * order (the entry order): one MT19937 stream (dt_torch_rng, base.h),
 * uniform_ for Linear/Conv2d weights and biases (+-1/sqrt(fan_in)) and for
 * Xavier, normal_ for Embedding. Parameters with constant inits and buffers
 * are left as they are. A model whose modules PyTorch builds in the same
 * order then starts from bit-identical weights (the ConvNet:
 * test_torch_rng). A model whose PyTorch twin draws otherwise (constructor
 * defaults first, then its own init, some tensors twice) carries that
 * order (dt_model_set_torch_init) and this follows it: the zoo's GPT-2 and
 * Llama carry transformers' (models.h). */
DT_API dt_status dt_model_init_torch(dt_model *m, uint64_t seed);

/* One draw from PyTorch's stream in a model's construction: what torch
 * draws for entry `entry`, and whether that draw is the entry's value. */
typedef struct dt_torch_draw {
    size_t entry;    /* the entry (dt_model_find_entry) */
    dt_nn_init init; /* UNIFORM or NORMAL (with a); KAIMING or XAVIER (the bound from the entry's
                        shape, as dt_nn_param_spec's) */
    float a;         /* bound / std for UNIFORM and NORMAL */
    bool keep;       /* true: the entry's initial value (the last kept draw wins); false: drawn and
                        dropped (a constructor's draw that the model's init replaces) */
} dt_torch_draw;
/* The order in which the model's PyTorch twin draws from its generator, for
 * dt_model_init_torch, dt_model_init_range (DT_INIT_TORCH) and
 * dt_model_init_frozen: the n draws (copied) replace the default (each
 * entry's own init once, in entry order). Constant inits (zeros, ones) draw
 * nothing and keep their build values. Randomly initialised, untied float
 * entries without a kept draw (LoRA's adapters, which PEFT adds to the
 * built model) draw after the n, in entry order, each its own init. A draw
 * names a float parameter and a random init, else DT_ERR_INVALID_ARG naming
 * it. n 0 restores the default. */
DT_API dt_status dt_model_set_torch_init(dt_model *m, const dt_torch_draw *draws, size_t n);

/* Fill dst, a flat holding global elements [dst->offset, dst->offset +
 * dst->numel) of the model's parameter flat of dst->dtype (a shard view of
 * a buffer the strategy allocated), with exactly the values a full build
 * (DT_INIT_PHILOX, seed) or dt_model_init_torch(m, seed) (DT_INIT_TORCH) puts
 * there: constant inits included, padding zero. Philox computes only the
 * range's elements; torch draws the whole stream in model order (time of the
 * whole model) but keeps only the range (memory of the range). Works on meta
 * and allocated models alike (the model's own flats are not touched). */
DT_API dt_status dt_model_init_range(const dt_model *m, dt_init_rng rng, uint64_t seed, dt_flat *dst);
/* Redraw the frozen parameters (dt_model_build_params.frozen: they live
 * with the buffers, which a meta build allocates and fills with
 * DT_INIT_PHILOX values) as generator rng would give them in a full build:
 * with DT_INIT_TORCH the values dt_model_init_torch(m, seed) puts there, so
 * a meta model whose shards come from dt_model_init_range(m, DT_INIT_TORCH,
 * seed, ...) holds frozen parameters equal to the full model's. A no-op for
 * DT_INIT_PHILOX and for models without frozen parameters. */
DT_API dt_status dt_model_init_frozen(dt_model *m, dt_init_rng rng, uint64_t seed);
/* The world size the model's flats are padded for, and whether it is meta. */
DT_API int dt_model_world(const dt_model *m);
DT_API bool dt_model_is_meta(const dt_model *m);

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
/* Under context parallelism the n ranks of a cp group hold one replica and
 * draw one replica's masks (each its part of them): with n > 1 the rank
 * given to dt_model_set_rank (a rank of the gradient reduction over dp x cp,
 * ordered d n + c as dt_plan orders it) keys the masks as rank / n, the
 * replica's index. dt_model_create sets it for a model created with a cp
 * group. n <= 1: every rank its own masks (the default). */
DT_API void dt_model_set_replica_ranks(dt_model *m, int n);
/* The model's random-stream positions, for exact resume from a checkpoint:
 * one counter per module in pre-order (dt_nn_dropout's forward calls in
 * training mode, which key its masks; 0 for modules that draw nothing).
 * dt_model_rng_state_size gives the count; get writes that many to out
 * (n is its room: DT_ERR_RANGE when too small); set restores them
 * (DT_ERR_MISMATCH when n differs from the model's count: another model).
 * A custom module that draws random numbers keys them itself. */
DT_API size_t dt_model_rng_state_size(const dt_model *m);
DT_API dt_status dt_model_get_rng_state(const dt_model *m, uint64_t *out, size_t n);
DT_API dt_status dt_model_set_rng_state(dt_model *m, const uint64_t *in, size_t n);

/* One parameter or buffer, in model order. */
typedef struct dt_param_info {
    const char *name;              /* "layer1.0.weight"; borrowed, lives with the model */
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    size_t offset;                 /* element offset (in elements of dtype) into the flat of
                                      its dtype and role; a multiple of 64 bytes */
    size_t numel;
    dt_dtype dtype;                /* from its spec (num_batches_tracked is i64) */
    bool is_buffer;                /* false: in the DT_FLAT_PARAMS / DT_FLAT_GRADS flats;
                                      true: in the DT_FLAT_BUFFERS flat of dtype */
    bool frozen;                   /* a parameter frozen by dt_model_build_params.frozen (then
                                      is_buffer is true too: not trained, no gradient) */
    dt_tensor *tensor;             /* the view; borrowed; NULL in a meta model */
    int64_t tied_to;               /* -1; or the entry whose storage (and gradient) this one
                                      shares (dt_module_tie): listed under both names, as in
                                      PyTorch's state_dict, stored and optimised once */
    dt_module *module;             /* owner */
    int tp_dim, tp_chunks;         /* its spec's tensor-parallel slicing (dt_nn_param_spec) */
    int64_t tp_chunk_rows[DT_TP_MAX_CHUNKS]; /* its spec's (all 0: equal blocks) */
} dt_param_info;

/* Number of entries (parameters and buffers). */
DT_API size_t dt_model_num_entries(const dt_model *m);
DT_API dt_status dt_model_entry(const dt_model *m, size_t i, dt_param_info *out);
/* Index of the entry named `name`, or -1. */
DT_API int64_t dt_model_find_entry(const dt_model *m, const char *name);
/* Number of parameter tensors (entries with is_buffer false, tied ones not
 * counted). */
DT_API size_t dt_model_num_params(const dt_model *m);
/* Trainable elements, without padding (the "parameter count"; frozen
 * parameters are not counted). */
DT_API size_t dt_model_param_count(const dt_model *m);

/* The three families of flats a model holds, one flat per dtype in each. */
typedef enum {
    DT_FLAT_PARAMS = 0, /* trained parameters */
    DT_FLAT_GRADS,      /* their gradients: the same dtype and layout */
    DT_FLAT_BUFFERS,    /* buffers (running stats), not trained */
    DT_FLAT_ROLE_COUNT
} dt_flat_role;

/* The model's flat of `role` and `dtype`, or NULL when no entry has that
 * dtype there. Owned by the model; the struct stays at the same address for
 * the model's life (an optimizer range may point at it) and its base
 * follows dt_model_set_grads. Padding is zero. */
DT_API const dt_flat *dt_model_flat(const dt_model *m, dt_flat_role role, dt_dtype dtype);
/* Replace the gradient flat of g's dtype by caller memory g (borrowed; same
 * dtype and total as the model's; must outlive the model or the next call;
 * used as it is: zero it first). The model's own memory is freed. g NULL
 * switches `dtype` back to a fresh zeroed flat owned by the model. */
DT_API dt_status dt_model_set_grads(dt_model *m, dt_dtype dtype, const dt_flat *g);
/* Re-home parameter entry i (an untied f32, bf16 or f16 parameter): its
 * tensor views data and its gradient views grad, numel elements of its
 * dtype each, borrowed (they must
 * stay valid while the model runs, or until the next call). This is how a
 * sharding strategy (ZeRO, parallel.h) puts parameters into its own
 * per-unit buffers. On a meta model the views are created here (with the
 * grad-ready hooks of a built model), and the model can run forward once
 * every parameter is bound. Entries tied to i follow it. The model's
 * own flats are left as they are (unused for this entry from now on).
 * Errors: DT_ERR_RANGE, DT_ERR_INVALID_ARG (a buffer, a tied entry, not a float dtype). */
DT_API dt_status dt_model_bind_param(dt_model *m, size_t i, void *data, void *grad);
/* Zero every gradient flat (and clear the lazy marks below). */
DT_API void dt_model_zero_grad(dt_model *m);
/* Zero the gradients without writing them (PyTorch's set_to_none, as marks):
 * each parameter gradient (f32, bf16, f16) is marked DT_TENSOR_GRAD_LAZY
 * (tensor.h), so the next backward's first contribution overwrites it (a
 * weight GEMM with beta = 0 instead of zero-fill + accumulate; a bf16/f16
 * gradient: its rounded sum written at the flush) and any other first
 * access in autograd zero-fills it; other gradients are zeroed now. The flat grad
 * buffer holds stale values until then: before reading it directly (a
 * parameter backward never reached, a strategy's buckets), call
 * dt_model_grads_materialize. The trainer does both (one process, f32). */
DT_API void dt_model_zero_grad_lazy(dt_model *m);
/* Zero-fill the gradients still marked by dt_model_zero_grad_lazy (after
 * backward: the parameters it did not reach) and clear the marks. */
DT_API void dt_model_grads_materialize(dt_model *m);

/* ---- pipeline units: how a model describes its cut points -------------------------- */

/* A pipeline (pipeline.h) cuts a model into stages of consecutive units.
 * The model says what its units are: the file that builds a model
 * registers a units function on it (dt_model_set_pipe_units) that lists
 * them, in forward order, each with the parameters it uses (by entry-name
 * prefix, so a stage's parameters follow from the cut without running
 * anything), how to run it and its compute per token; the generic
 * partitioner of the parallel layer (dt_model_pipe_units, dt_pipe_balance)
 * reads that list and never the model's type. A model without a units
 * function whose root is a Sequential is cut between its children. */
struct dt_pipe_unit;
/* A unit's forward on ctx (NULL input propagates). */
typedef dt_tensor *(*dt_pipe_unit_fn)(dt_ctx *ctx, dt_model *m, const struct dt_pipe_unit *u, dt_tensor *x);

/* One unit (layer) of a model for cutting into stages. */
typedef struct dt_pipe_unit {
    char name[64];            /* "transformer.h.3" */
    char params[4][64];       /* the parameters it uses: entry names equal to one of these or under it
                                 ("transformer.wte" covers "transformer.wte.weight"); "" unused */
    dt_module *module;        /* forward by dt_module_forward(module) when fn is NULL; borrowed */
    dt_pipe_unit_fn fn;       /* or this */
    double cost;              /* its compute per input row (token), in multiply-adds: what the stages are
                                 balanced by (dt_pipe_unit_costs); >= 0 */
} dt_pipe_unit;

/* A model's units function: *units (allocated with dt_calloc / dt_alloc;
 * the caller frees them with dt_free) and *n, in forward order, made from
 * the model as it is now (its hooks, its tensor-parallel slices). An error
 * (dt_status < 0, message set) when the model cannot be cut. */
typedef dt_status (*dt_model_units_fn)(dt_model *m, dt_pipe_unit **units, int *n);
/* Register m's units function (NULL: none, the default: a Sequential root
 * is cut between its children, any other model cannot be pipelined). The
 * zoo's builders register theirs (models.h). DT_ERR_NULL on a NULL m. */
DT_API dt_status dt_model_set_pipe_units(dt_model *m, dt_model_units_fn fn);
/* m's units function, NULL when none was registered (or m is NULL). */
DT_API dt_model_units_fn dt_model_get_pipe_units(const dt_model *m);

/* Grad-ready callback: entry `index` (a parameter) has its final gradient
 * for this backward pass in the flat grad buffer. */
typedef dt_status (*dt_grad_ready_fn)(dt_model *m, size_t index, const dt_param_info *p, void *ud);
/* Add a grad-ready hook for every parameter; *id (may be NULL) receives its
 * id. Unbounded in number, fired in the order added. */
DT_API dt_status dt_model_add_grad_ready_hook(dt_model *m, dt_grad_ready_fn fn, void *ud, dt_hook_id *id);
/* Remove the grad-ready hook `id` (DT_ERR_NOT_FOUND if none). */
DT_API dt_status dt_model_remove_hook(dt_model *m, dt_hook_id id);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_NN_H */
