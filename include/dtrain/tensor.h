/* dtrain/tensor.h — N-d tensors, views over flat buffers, the per-step context.
 *
 * Overview
 * --------
 * A dt_tensor is a transparent struct: dtype, ndim (<= DT_MAX_DIMS), shape and
 * strides (in ELEMENTS, not bytes) and a data pointer to element (0,...,0).
 * A tensor never owns a reference-counted storage: it either owns its data
 * (dt_tensor_new), or borrows it (dt_tensor_wrap, every view, every
 * temporary). Whoever owns the memory keeps it alive while views use it.
 *
 * Two lifetimes:
 *   - Persistent tensors (parameters, gradients, buffers such as batch-norm
 *     running stats) are made with dt_tensor_new / dt_tensor_wrap and freed
 *     with dt_tensor_free. A model's parameters are dt_tensor_wrap views into
 *     one flat 64-byte-aligned buffer; their gradients are dt_tensor_wrap views
 *     into a second flat buffer, attached with dt_tensor_set_grad. To move the
 *     gradients into other memory (DDP's shared-memory buffer), call
 *     dt_tensor_rebind(grad, new_base + offset) on every gradient tensor; the
 *     parameter keeps pointing at the same gradient struct.
 *   - Temporaries (activations, inputs of a step, views, everything an op
 *     returns) live in a dt_ctx: the struct and its data come from the
 *     context's arena and are valid until the next dt_ctx_reset(ctx). After
 *     the first step or two the arena is one block and a step does no malloc.
 *
 * The context (dt_ctx) is passed EXPLICITLY as the first argument of every
 * function that makes temporaries or records on the tape (no thread-local
 * "current context"). It holds the arena, the autograd tape and the grad
 * mode. A context is used by one thread at a time; threads use their own.
 *
 * Errors: functions returning a pointer return NULL and set dt_last_error().
 * See autograd.h for the differentiable ops (dt_add, dt_matmul, dt_reshape,
 * ...) and the usage example of a whole training step.
 *
 * Usage
 * -----
 *     float *flat = dt_calloc(numel_total * sizeof(float));     // model params
 *     dt_tensor *w = dt_tensor_wrap(flat + off, DT_F32, 2, (int64_t[]){10, 1568});
 *     dt_ctx *ctx;
 *     if (dt_ctx_init(NULL, &ctx) < 0) { report dt_last_error(); }
 *     for (step...) {
 *         dt_tensor *x = dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){B, 1568}, batch);
 *         ... ops ...
 *         dt_ctx_reset(ctx);                 // every temporary of the step is gone
 *     }
 *     dt_ctx_free(ctx); dt_tensor_free(w); dt_free(flat);
 */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MAX_DIMS 8
/* Grad-ready hooks one tensor can hold (see autograd.h). */
#define DT_MAX_GRAD_HOOKS 4

/* Flags (dt_tensor.flags). Only REQUIRES_GRAD is meant to be read by users;
 * set it through dt_tensor_set_requires_grad. */
enum {
    DT_TENSOR_REQUIRES_GRAD = 1u << 0, /* gradients flow to / through it */
    DT_TENSOR_OWNS_DATA = 1u << 1,     /* dt_tensor_free frees data */
    DT_TENSOR_TEMP = 1u << 2,          /* struct lives in a dt_ctx arena */
    DT_TENSOR_OWNS_GRAD = 1u << 3,     /* dt_tensor_free frees grad */
    /* Library-internal layouts: a 4-D f32 temporary (C % B == 0) whose data
     * is stored channel-blocked, [N][C/B][H][W][B] with B = 8 (nChw8c) or
     * 16 (nChw16c), while shape/strides stay the logical contiguous NCHW;
     * its grad uses the same layout. Only made by conv2d (and batch_norm /
     * relu / max_pool2d on such inputs) inside a region where
     * dt_ctx_set_blocked is on, with the block dt_k_act_block() chooses
     * (the one oneDNN prefers on this CPU). Every other op converts it to
     * plain first (differentiably); dt_tensor_read/get/item/copy/write/set
     * understand it. Do not touch ->data of such a tensor directly. */
    DT_TENSOR_BLOCKED8 = 1u << 4,
    DT_TENSOR_BLOCKED16 = 1u << 5,
    DT_TENSOR_BLOCKED = DT_TENSOR_BLOCKED8 | DT_TENSOR_BLOCKED16, /* either */
    /* A leaf whose grad reads as zeros whatever its buffer holds (a
     * lazy zero_grad, dt_model_zero_grad_lazy): backward's first
     * contribution overwrites the buffer (a GEMM with beta = 0, a copy)
     * instead of adding to it, and any other first access zero-fills it
     * (a bf16/f16 grad: the pass's f32 sum is written over it, rounded).
     * dt_model_grads_materialize zero-fills what is still marked. */
    DT_TENSOR_GRAD_LAZY = 1u << 6,
    /* An intermediate (a temporary an op produced) whose gradient backward
     * keeps in ->grad until the context's reset (dt_ag_retain_grad); without
     * it backward frees an intermediate's gradient once passed on. */
    DT_TENSOR_RETAIN_GRAD = 1u << 7,
    /* Library-internal: backward allocated this temporary's gradient buffer
     * (GRAD_OWN) or the low-precision copy of it (GLP_OWN) and gives it back
     * to the context's arena once the gradient has been passed on. */
    DT_TENSOR_GRAD_OWN = 1u << 8,
    DT_TENSOR_GLP_OWN = 1u << 9,
    /* Library-internal: this temporary's gradient was written in its
     * low-precision copy alone, its f32 buffer not (the copy's one reader
     * takes it); any other access widens the copy into the buffer first. */
    DT_TENSOR_GLP_ONLY = 1u << 10,
};

typedef struct dt_tensor dt_tensor;
typedef struct dt_ctx dt_ctx;
struct dt__node;
struct dt__grad_rows;

/* Grad-ready hook: called during backward once `leaf`'s gradient for this
 * backward pass is complete (leaf->grad holds the accumulated sum). A
 * negative return aborts backward with that status. */
typedef dt_status (*dt_grad_hook_fn)(dt_tensor *leaf, void *ud);

struct dt_tensor {
    dt_dtype dtype;
    int ndim;                        /* 0..DT_MAX_DIMS; 0 = scalar (numel 1) */
    int64_t shape[DT_MAX_DIMS];      /* entries >= 0; unused entries 1 */
    int64_t strides[DT_MAX_DIMS];    /* in elements; may be 0 (broadcast) */
    void *data;                      /* address of element (0,...,0) */
    uint32_t flags;                  /* DT_TENSOR_* */
    const char *name;                /* optional, borrowed; shown in errors */
    dt_tensor *grad;                 /* gradient: same shape, contiguous, f32 (or, for a
                                        persistent bf16/f16 leaf, its own dtype: precision.h);
                                        NULL until attached or first backward */
    /* ---- autograd bookkeeping: private to the library ---- */
    struct dt__node *node_;          /* op that produced it (NULL for leaves) */
    int64_t pending_;                /* uses left in the running backward */
    uint64_t epoch_;                 /* backward pass pending_ belongs to */
    int nhooks_;
    struct { dt_grad_hook_fn fn; void *ud; } hooks_[DT_MAX_GRAD_HOOKS];
    float *gacc_;                    /* f32 accumulator of a leaf whose grad is not f32 */
    uint64_t gacc_epoch_;            /* backward pass gacc_ belongs to */
    struct dt__grad_rows *gacc_rows_; /* NULL, or the only rows of gacc_ that hold sums (the others'
                                        rounded sums are in grad already: autograd's grad.c) */
    void *glp_;                      /* bf16/f16 copy of a temporary's f32 gradient ... */
    const void *glp_of_;             /* ... of this gradient buffer, */
    uint64_t glp_epoch_;             /* in this backward pass, */
    dt_dtype glp_dtype_;             /* in this dtype */
    bool gfinite_;                   /* a leaf: every value of its gradient was seen finite as
                                        it was written in this pass (until its grad-ready hooks
                                        have run; dt_ag_grad_checked_finite) */
};

/* ---- shape helpers ------------------------------------------------------ */

/* The channel block of t's storage: 8 (DT_TENSOR_BLOCKED8), 16
 * (DT_TENSOR_BLOCKED16) or 0 (plain, or t is NULL). */
static inline int dt_tensor_block(const dt_tensor *t)
{
    return !t ? 0 : (t->flags & DT_TENSOR_BLOCKED8) ? 8 : (t->flags & DT_TENSOR_BLOCKED16) ? 16 : 0;
}

/* Number of elements (1 for ndim 0). NULL gives 0. */
DT_API int64_t dt_tensor_numel(const dt_tensor *t);
/* True if strides are row-major contiguous (size-1 dims ignored). */
DT_API bool dt_tensor_is_contiguous(const dt_tensor *t);
/* True if dtype, ndim and shape are equal. */
DT_API bool dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b);
/* Writes "[2,3,4]" (or "NULL") into buf and returns buf. */
DT_API char *dt_tensor_shape_str(const dt_tensor *t, char *buf, size_t n);
/* Bytes of the elements (numel * dtype size). */
DT_API size_t dt_tensor_nbytes(const dt_tensor *t);
/* Fill shape/strides of a contiguous tensor; checks ndim and dims >= 0.
 * Used by every constructor; exposed for code that builds structs itself. */
DT_API dt_status dt_tensor_init_contiguous(dt_tensor *t, dt_dtype dtype, int ndim,
                                           const int64_t *shape, void *data);

/* ---- persistent tensors (malloc'd; free with dt_tensor_free) ------------- */

/* New zero-filled contiguous tensor that owns its 64-byte aligned data. */
DT_API dt_tensor *dt_tensor_new(dt_dtype dtype, int ndim, const int64_t *shape);
/* Contiguous tensor over caller memory (borrowed: must outlive the tensor).
 * This is how parameters view a flat buffer and gradients a flat grad
 * buffer. data may be NULL only if numel is 0. */
DT_API dt_tensor *dt_tensor_wrap(void *data, dt_dtype dtype, int ndim, const int64_t *shape);
/* Free a persistent tensor, its owned data and owned grad. NULL is a no-op;
 * temporaries (DT_TENSOR_TEMP) are ignored (dt_ctx_reset frees them). */
DT_API void dt_tensor_free(dt_tensor *t);
/* Point t at other memory with the same layout (e.g. DDP moves gradients
 * into a shared-memory flat buffer). If t owned its data, that data is freed.
 * Borrowed: data must outlive t. */
DT_API dt_status dt_tensor_rebind(dt_tensor *t, void *data);
/* Mark t as a leaf that wants gradients (or not). Only f32, bf16 and f16
 * tensors may require grad. */
DT_API dt_status dt_tensor_set_requires_grad(dt_tensor *t, bool on);
/* Attach grad (borrowed; contiguous, same shape as t; f32, or t's own dtype
 * when t is bf16/f16) as t's gradient and set requires_grad. Backward
 * accumulates into it (+=). NULL detaches. If a leaf requires grad and has
 * none at backward time, a zeroed one is allocated (owned by t if t is
 * persistent, of t's dtype; from the arena if temporary, f32). */
DT_API dt_status dt_tensor_set_grad(dt_tensor *t, dt_tensor *grad);

/* ---- element access and copies (work on any strides) --------------------- */

/* Set every element to zero / to v (converted to the dtype). */
DT_API dt_status dt_tensor_zero(dt_tensor *t);
DT_API dt_status dt_tensor_fill(dt_tensor *t, double v);
/* Copy src into dst elementwise; same shape and dtype, any strides. */
DT_API dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src);
/* Copy the elements in row-major order into / from a contiguous buffer of
 * numel elements of t's dtype. */
DT_API dt_status dt_tensor_read(const dt_tensor *t, void *dst);
DT_API dt_status dt_tensor_write(dt_tensor *t, const void *src);
/* Element at a flat row-major index, as double (any dtype, any strides).
 * Returns NAN for a bad index or NULL tensor (and sets the error). */
DT_API double dt_tensor_get(const dt_tensor *t, int64_t flat_index);
/* Set the element at a flat row-major index (converted to the dtype). */
DT_API dt_status dt_tensor_set(dt_tensor *t, int64_t flat_index, double v);
/* The single element of a 1-element tensor (a loss), as float. NAN on error. */
DT_API float dt_tensor_item(const dt_tensor *t);
/* Fill an f32 tensor with uniform [lo,hi) / normal(mean,std) values from
 * the Philox stream key, element i of the tensor (row-major) taking stream
 * element i. Deterministic, independent of thread count.
 * DT_ERR_INVALID_ARG for lo > hi, std < 0 or a non-finite argument. */
DT_API dt_status dt_tensor_rand_uniform(dt_tensor *t, dt_rng_key key, float lo, float hi);
DT_API dt_status dt_tensor_rand_normal(dt_tensor *t, dt_rng_key key, float mean, float std);

/* ---- typed flat buffers --------------------------------------------------- */

/* A flat buffer: one contiguous run of elements of one dtype, the storage a
 * model's parameters, gradients and buffers live in (one flat per dtype), a
 * DDP bucket's byte range and a ZeRO shard's home. Transparent plain data;
 * copying the struct makes a view (only the original frees).
 *
 * Indices are GLOBAL element indices of the full buffer: a view of rank r's
 * shard keeps the global index of its first element in `offset`, so
 * dt_flat_ptr(shard, i) addresses the same element as dt_flat_ptr(full, i).
 * An allocated flat is zeroed and 64-byte aligned; its numel is padded up
 * to a multiple of `world` * (64 bytes / element size), so every rank's
 * shard has the same length and starts 64-byte aligned. The padding stays
 * zero unless the caller writes it.
 *
 *     dt_flat f, shard;
 *     dt_flat_alloc(&f, DT_F32, 1000, 3, NULL);    // numel 1008: 3 shards of 336
 *     dt_flat_shard(&f, 1, 3, &shard);             // offset 336, numel 336
 *     float *x = dt_flat_ptr(&shard, 400);         // == dt_flat_ptr(&f, 400)
 *     dt_flat_free(&f);
 */
struct dt_pg;
typedef struct dt_flat {
    dt_dtype dtype;      /* element type */
    void *base;          /* element `offset` (global index) of the buffer; NULL when numel is 0
                            or for a meta (unallocated) flat */
    size_t offset;       /* global index of base[0]: 0 for a full buffer, lo for a shard view */
    size_t numel;        /* elements reachable from base (a full buffer: total) */
    size_t total;        /* elements of the full buffer, padding included */
    size_t used;         /* elements the layout uses (total minus trailing padding) */
    int world;           /* total is a multiple of world (>= 1) */
    struct dt_pg *pg;    /* allocated with dt_pg_alloc from this group; NULL otherwise */
    bool owned;          /* dt_flat_free releases base */
    bool mapped;         /* base is an anonymous mapping of its own (dt_flat_alloc of
                            DT_FLAT_MAP_MIN bytes or more, no group): its pages are committed
                            when first written, and dt_flat_free unmaps it */
} dt_flat;

/* dt_flat_alloc maps flats of this many bytes or more (without a group)
 * instead of taking them from the heap: zeros that cost no memory until
 * written, so a rank that only ever touches part of a model's flats (a
 * pipeline stage) holds only that part. */
#define DT_FLAT_MAP_MIN ((size_t)256 << 10)

/* The padded size of a flat holding `used` elements of dtype for `world`
 * ranks: the next multiple of world * max(1, 64 / element size); SIZE_MAX
 * when that multiple is past SIZE_MAX (dt_flat_alloc refuses it). */
DT_API size_t dt_flat_padded(dt_dtype dtype, size_t used, int world);
/* Allocate a zeroed flat of dt_flat_padded(dtype, used, world) elements into
 * *f (64-byte aligned). pg non-NULL: from dt_pg_alloc(pg) (shared with the
 * group's ranks on this machine), else dt_calloc, or an anonymous mapping
 * (f->mapped) from DT_FLAT_MAP_MIN bytes on. world >= 1. */
DT_API dt_status dt_flat_alloc(dt_flat *f, dt_dtype dtype, size_t used, int world, struct dt_pg *pg);
/* Allocate only rank `rank`'s shard of `full` (which may be a meta flat
 * with no memory: the layout is what counts) into *f: offset and numel of
 * the shard, total/used/world/dtype of full, zeroed, 64-byte aligned, from
 * pg when non-NULL. Errors as dt_flat_shard. */
DT_API dt_status dt_flat_alloc_shard(dt_flat *f, const dt_flat *full, int rank, int world, struct dt_pg *pg);
/* A flat over caller memory of numel elements (borrowed; total = used = numel,
 * world 1, offset 0). base may be NULL only when numel is 0. DT_ERR_RANGE
 * when the elements' bytes pass PTRDIFF_MAX (no buffer is that large). */
DT_API dt_status dt_flat_wrap(dt_flat *f, dt_dtype dtype, void *base, size_t numel);
/* Release an owned flat's memory and zero the struct; a view or NULL is left
 * alone (the struct is still zeroed for a view). */
DT_API void dt_flat_free(dt_flat *f);
/* Rank `rank`'s shard of a full flat: the equal range [r*total/world,
 * (r+1)*total/world) as a view (no copy). DT_ERR_INVALID_ARG when total is
 * not a multiple of world or rank is outside [0, world); DT_ERR_RANGE when
 * f does not hold that whole range. */
DT_API dt_status dt_flat_shard(const dt_flat *f, int rank, int world, dt_flat *view);
/* A view of global elements [lo, hi) of f (which must hold them). */
DT_API dt_status dt_flat_range(const dt_flat *f, size_t lo, size_t hi, dt_flat *view);
/* Address of global element i (dtype-sized steps), NULL when f does not hold it. */
DT_API void *dt_flat_ptr(const dt_flat *f, size_t i);
/* Byte size of the elements f holds. */
DT_API size_t dt_flat_nbytes(const dt_flat *f);

/* ---- the per-step context -------------------------------------------------- */

typedef struct dt_ctx_params {
    size_t arena_block; /* bytes of the first arena block; default 64 MiB
                           (grows to one block the size of a step's peak) */
} dt_ctx_params;

/* Defaults for dt_ctx_init. */
DT_API dt_ctx_params dt_ctx_params_default(void);
/* A context into *out: arena for temporaries + autograd tape, grad mode on.
 * p may be NULL for defaults. Free with dt_ctx_free. *out is NULL on error. */
DT_API dt_status dt_ctx_init(const dt_ctx_params *p, dt_ctx **out);
/* Free the context and every temporary it handed out. NULL is a no-op. */
DT_API void dt_ctx_free(dt_ctx *ctx);
/* End of a step: every temporary and the tape are dropped (O(1), memory is
 * kept for the next step). Grad mode is left as it was. */
DT_API void dt_ctx_reset(dt_ctx *ctx);
/* The context's arena (for op-private scratch; valid until reset). */
DT_API dt_arena *dt_ctx_arena(dt_ctx *ctx);
/* Allow (on) or forbid conv2d to produce DT_TENSOR_BLOCKED8/16 activations
 * in this context (off by default; dt_k_act_block() == 0, e.g. under
 * DT_CONV_LAYOUT=plain or DT_BLOCKED=0, forbids it always).
 * Meant for a model forward whose conv activations only feed conv2d,
 * batch_norm, relu, max_pool2d and finally an op that converts (flatten);
 * returns the previous setting so the region can restore it. */
DT_API bool dt_ctx_set_blocked(dt_ctx *ctx, bool on);
/* Mark (on) the linear layers (dt_linear, dt_addmm) run in this context
 * from now on as ones whose row count changes from call to call, such as
 * the experts of a mixture-of-experts block, each given the rows routed to
 * it: their products, forward and backward, then run where no code is
 * generated per shape (dt_k_matmul_set_varying), so new row counts create
 * nothing. Off by default; returns the previous setting so the region can
 * restore it. */
DT_API bool dt_ctx_set_varying(dt_ctx *ctx, bool on);
/* Scratch memory from the arena, 64-byte aligned, valid until reset. */
DT_API void *dt_ctx_alloc(dt_ctx *ctx, size_t bytes);

/* ---- temporaries (valid until dt_ctx_reset) --------------------------------- */

/* Uninitialised / zero-filled / constant contiguous temporary. */
DT_API dt_tensor *dt_tensor_empty(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape);
DT_API dt_tensor *dt_tensor_zeros(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape);
DT_API dt_tensor *dt_tensor_full(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape,
                                 double v);
/* Temporary holding a copy of numel contiguous elements at src. */
DT_API dt_tensor *dt_tensor_from(dt_ctx *ctx, dt_dtype dtype, int ndim, const int64_t *shape,
                                 const void *src);
/* Temporary contiguous view over caller memory (no copy; borrowed; e.g. a
 * batch from the data loader). */
DT_API dt_tensor *dt_tensor_view_of(dt_ctx *ctx, void *data, dt_dtype dtype, int ndim,
                                    const int64_t *shape);
/* Temporary copy of t with row-major contiguous strides (not recorded on the
 * tape; use dt_contiguous in autograd.h inside a differentiable forward). */
DT_API dt_tensor *dt_tensor_clone(dt_ctx *ctx, const dt_tensor *t);
/* Temporary struct that aliases t (same data, shape, strides; no grad, not
 * on the tape). Use it to build custom views by editing shape/strides. */
DT_API dt_tensor *dt_tensor_alias(dt_ctx *ctx, const dt_tensor *t);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_H */
