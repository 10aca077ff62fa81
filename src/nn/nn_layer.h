/* src/nn/nn_layer.h — Layer-internal: the nn layer's internals for the
 * library's own module implementations in the layers below it.
 *
 * Not installed and not for users (they have nn.h: the zoo's models are
 * written on it alone). Included from outside src/nn by:
 *   - src/parallel/tp/tp.c: the tensor-parallel layers (dt_tp_column_linear,
 *     dt_tp_row_linear, dt_tp_vocab_embedding) are modules whose forwards
 *     read their configuration and parameters as nn's own kinds do, and
 *     tag a module with its tensor-parallel group (dt_module.tp);
 *   - src/train/strategy_pipe_impl.h (the "pipe" strategy): a pipeline
 *     rank holds only its stages' parts of the flats (dt__model_keep_only,
 *     dt__model_materialize, dt__model_release, dt_model.keep);
 *   - src/train/trainer_ckpt_load.c: DoRA's magnitudes start at their
 *     layers' row norms once the base weights are in place
 *     (dt__lora_dora_norm).
 * Everything else of nn (hook lists, the forward body, module allocation)
 * stays in nn_impl.h, private to src/nn. The layouts below change with nn;
 * code outside src/nn should prefer the public calls of nn.h
 * (dt_module_get_config, dt_module_param, dt_module_parent, ...). */
#ifndef DT_NN_LAYER_H
#define DT_NN_LAYER_H

#include "dtrain/nn.h"

enum { DT__HOOK_FWD_PRE = 0, DT__HOOK_FWD_POST, DT__HOOK_BWD_PRE, DT__HOOK_BWD_POST, DT__HOOK_KINDS };

typedef struct dt__hook {
    void (*fn)(void); /* cast to the kind's type */
    void *ud;
    dt_hook_id id;
    bool blind; /* reads no tensor, replaces none (dt_module_hook_set_blind) */
} dt__hook;

/* A growable list of hooks (module hooks of one kind, a model's grad-ready
 * hooks). */
typedef struct dt__hooks {
    dt__hook *h;
    int n, cap;
} dt__hooks;

struct dt_module {
    dt_nn_kind kind;
    char *type;             /* custom: the user's type name */
    char *name;             /* local name ("0", "fc"); NULL for the root */
    char *path;             /* full path, set by dt_model_build */
    dt_module *parent;
    dt_module **children;
    int nchild, cap;
    dt_model *model;        /* set by dt_model_build */
    int index;              /* pre-order index in the model */
    /* configuration */
    int64_t in, out;
    int k, stride, pad;
    bool bias;
    float eps, momentum, p;
    int start_dim, end_dim;
    /* parameters and buffers, in declaration order */
    int nparam;
    dt_nn_param_spec *specs;
    dt_tensor **params;     /* set by dt_model_build */
    struct dt__tie {        /* per spec: dt_module_tie's source, or NULL */
        dt_module *src;
        int spec;
    } *ties;
    dt_nn_forward_fn fwd;
    void *ud;
    void (*ud_free)(void *); /* dt_nn_custom_owned: frees ud with the module */
    struct dt_pg *tp;       /* the tensor-parallel group of its sliced parameters (tp.h), or NULL */
    dt_lora_hook *lora;     /* dt_module_set_lora (owned), or NULL */
    dt_nn_forward_fn fwd_override; /* dt_module_set_forward (SyncBatchNorm) */
    void *fwd_override_ud;
    bool training;
    uint64_t fwd_count;     /* dropout: forward calls so far */
    struct dt__ckpt *ckpt;  /* activation checkpointing of this module (checkpoint.c), or NULL */
    dt__hooks hooks[DT__HOOK_KINDS];
    dt_hook_id next_hook_id;
};

typedef struct dt__entry {
    dt_param_info info;
    char *name;
    dt_tensor *grad;        /* parameters: the view into the grad buffer (NULL when tied) */
    dt_model *model;
    size_t index;
    int spec;               /* index into the module's specs */
    int64_t tied;           /* source entry, or -1 */
} dt__entry;

struct dt_model {
    dt_module *root;
    uint64_t seed;
    int rank;
    int replica_ranks;      /* dt_model_set_replica_ranks (0 or 1: none) */
    dt_module **modules;    /* pre-order */
    int nmodules;
    dt__entry *entries;
    size_t nentry, nparams, param_count;
    int world;              /* flats padded for this many ranks */
    bool meta;              /* no parameter / gradient storage */
    dt_dtype param_dtype;   /* dt_model_build_params.param_dtype */
    dt_dtype buffer_dtype;  /* dt_model_build_params.buffer_dtype */
    bool keep_bn_fp32;      /* dt_model_build_params.keep_batchnorm_fp32 */
    const char *const *f32_modules; /* dt_model_build_params.f32_modules (borrowed during the build) */
    const char *const *frozen; /* dt_model_build_params.frozen (borrowed during the build) */
    bool lora;                 /* dt_model_build_params.lora: parameters outside the adapters frozen */
    const char *const *lora_saved; /* its modules_to_save (borrowed during the build): not frozen */
    dt_lora_bias lora_bias;    /* its bias setting: those biases not frozen */
    size_t nparams_f32;     /* float (f32, bf16, f16) parameters: what a meta model binds */
    size_t nbound;          /* of them, bound by dt_model_bind_param on a meta model */
    /* one flat per role and dtype (total 0 and base NULL when unused) */
    dt_flat flats[DT_FLAT_ROLE_COUNT][DT_DTYPE_COUNT];
    dt__hooks ready;        /* grad-ready hooks */
    dt_hook_id next_hook_id;
    /* per dtype: the spans [keep[2i], keep[2i+1]) of the parameter and
     * gradient flats this rank holds (dt__model_keep_only); NULL: all */
    size_t *keep[DT_DTYPE_COUNT];
    size_t nkeep[DT_DTYPE_COUNT];
    dt_model_units_fn pipe_units; /* dt_model_set_pipe_units (NULL: none) */
    dt_torch_draw *torch_draws;   /* dt_model_set_torch_init (NULL: one draw per entry) */
    size_t ntorch_draws;
    const void *trainer;          /* the dt_trainer training it (dt__model_claim), or NULL */
};

/* Draw k (k < dt__torch_ndraws(md)) of torch's stream for md: the model's
 * recipe (dt_model_set_torch_init) or, without one, entry k's own init
 * (kept unless tied). False when draw k draws nothing (a constant init, a
 * buffer, a non-float entry). model_torch.c. */
size_t dt__torch_ndraws(const dt_model *md);
bool dt__torch_draw(const dt_model *md, size_t k, dt_torch_draw *out);
bool dt__random_init(dt_nn_init init);

/* A meta model (dt_model_build_params.meta) gets its parameter and
 * gradient flats after all, whole-sized but lazy (dt_flat_alloc: flats of
 * DT_FLAT_MAP_MIN bytes or more are anonymous mappings, so what is never
 * written takes no memory), and its entries' views, as a whole build's; the
 * values are zeros: the caller initialises what it holds
 * (dt_model_init_range) and nothing else. A no-op on a model that is not
 * meta. After a failure the model is only fit to be freed. */
dt_status dt__model_materialize(dt_model *m);
/* This rank reads and writes only the spans [spans[2i], spans[2i+1])
 * (sorted, disjoint, in elements) of the model's parameter and gradient
 * flats of `dtype` from now on (a pipeline rank: the entries of its
 * stages). The whole pages outside them are given back to the system
 * (dt__model_release) and dt_model_zero_grad writes only the spans. What
 * lies outside holds garbage from the caller's point of view (zeros on
 * Linux): names, offsets and the layout stay the whole model's. A copy of
 * spans is kept. */
dt_status dt__model_keep_only(dt_model *m, dt_dtype dtype, const size_t *spans, size_t nspan);
/* Give back again the pages outside the kept spans (after something may
 * have written there: a checkpoint load); returns the bytes given back. A no-op for a dtype without
 * kept spans or a flat that is not mapped (dt_flat.mapped). */
size_t dt__model_release(dt_model *m);

/* One trainer a model: dt_trainer_init claims it (DT_ERR_STATE when
 * another trainer holds it: both would attach their strategy's hooks to
 * its parameters, and each step would run the other's reductions),
 * dt_trainer_free gives it back (by: the trainer; a model another holds
 * is left as it is). */
dt_status dt__model_claim(dt_model *m, const void *by);
void dt__model_unclaim(dt_model *m, const void *by);

/* Blocks of given sizes rows[0..c) (dt_nn_param_spec.tp_chunk_rows) over t
 * ranks: true when c <= DT_TP_MAX_CHUNKS and each is positive and a
 * multiple of t; *total: their sum. lora.c. */
bool dt__tp_rows_split(const int64_t *rows, int c, int64_t t, int64_t *total);

/* A LoRA layer's output y + s d (y the base layer's output on input x, d the
 * adapters'); y (when it is not x), d and s d, which no backward reads, go
 * back to ctx's arena once summed. lora.c; tp_lora.c's layers too. */
dt_tensor *dt__lora_sum(dt_ctx *ctx, const dt_tensor *x, dt_tensor *y, dt_tensor *d, float s);

/* DoRA: the row norms of LoRA layer m's adapted weight, out[o - lo] = ||W[o, :] + s (B A)[o, :]|| in f32 for its
 * output features o in [lo, hi) (adapters false: ||W[o, :]||, the adapters at their init, B = 0), from the
 * layer's tensors as they are in memory (a Linear's weight [out, in], a Conv1D's [in, out]). lora.c. */
dt_status dt__lora_dora_norm(const dt_module *m, bool adapters, int64_t lo, int64_t hi, float *out);

#endif
