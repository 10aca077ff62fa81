/* Internals of the autograd layer: tape nodes and helpers shared by the op
 * files. Not a public header. */
#ifndef DT_AG_IMPL_H
#define DT_AG_IMPL_H

#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "tensor/tensor_impl.h"

typedef struct dt__node dt__node;

/* Backward of one op: gout is the contiguous f32 gradient of n->out. The
 * function adds each input's gradient into dt__grad(ctx, in) for inputs
 * that require grad (dt__rg). */
typedef dt_status (*dt__backward_fn)(dt_ctx *ctx, dt__node *n, const float *gout);

#define DT__MAX_IN 4

struct dt__node {
    dt_op op;                       /* its row of the op table (dt__op_table) */
    dt_mark_fn mark;                /* marks only */
    dt_custom_backward_fn custom;   /* dt_ag_custom only */
    void *ud;                       /* mark / custom user data */
    dt_tensor *out;
    dt_tensor *in[DT__MAX_IN];
    int nin;
    void *saved[4];                 /* op-private arena data */
    double f[4];                    /* op-private scalars */
    int64_t i[8];
    size_t idx;                     /* position on the tape */
    int needed;                     /* set by backward's pre-pass */
    bool glp_want;                  /* its backward takes out's gradient in glp_dtype (a bf16/f16 GEMM's: grad_lp) */
    bool glp_alone;                 /* and where there is that shadow, reads it alone (not the f32 values) */
    dt_dtype glp_dtype;
};

/* Does t take part in autograd? */
static inline bool dt__rg(const dt_tensor *t)
{
    return t && (t->flags & DT_TENSOR_REQUIRES_GRAD);
}

/* Should an op with these inputs record a node? */
bool dt__ag_wants(const dt_ctx *ctx, int nin, dt_tensor *const *in);
/* Record a node of op for out (sets out->node_ and requires_grad); its
 * backward is the op's row of the table. Returns NULL (error set) when out
 * of memory. */
dt__node *dt__ag_record(dt_ctx *ctx, dt_op op, dt_tensor *out, int nin, dt_tensor *const *in);

/* ---- the op table (op_table.c; ops.h documents it) -------------------------------- */

/* FLOPs of one node's forward from its shapes (ops.h: the convention). */
typedef double (*dt__flops_fn)(int nin, const dt_tensor *const *in, const dt_tensor *out);

typedef struct dt__op_row {
    const char *name;         /* PyTorch's name: dt_op_name */
    const char *fn;           /* the dtrain function that records it, for messages */
    dt__backward_fn backward; /* NULL: DT_OP_MARK only */
    dt_amp_class amp;         /* autocast class */
    dt__flops_fn flops;       /* never NULL */
} dt__op_row;

/* One row per dt_op, indexed by it. */
extern const dt__op_row dt__op_table[DT_OP_COUNT];

/* The backward of every row, defined beside its op's forward. */
dt_status dt__bw_matmul(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_dense(dt_ctx *ctx, dt__node *n, const float *gout);     /* linear, addmm */
dt_status dt__bw_conv(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_pool(dt_ctx *ctx, dt__node *n, const float *gout);      /* max, avg */
dt_status dt__bw_binary(dt_ctx *ctx, dt__node *n, const float *gout);    /* add, sub, mul, div */
dt_status dt__bw_unary(dt_ctx *ctx, dt__node *n, const float *gout);     /* scale, gelu(s), dropout */
dt_status dt__bw_relu(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_bn(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_bn_pool(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_ln(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_embedding(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_softmax(dt_ctx *ctx, dt__node *n, const float *gout);   /* softmax, log_softmax */
dt_status dt__bw_ce(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_mse(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_sum(dt_ctx *ctx, dt__node *n, const float *gout);       /* sum, mean */
dt_status dt__bw_view(dt_ctx *ctx, dt__node *n, const float *gout);      /* the views */
dt_status dt__bw_contiguous(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_cast(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_attn(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_bias_gelu(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_rms(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_rope(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_swiglu(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_pack(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_lmhead(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_plain(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_ckpt(dt_ctx *ctx, dt__node *n, const float *gout);
dt_status dt__bw_custom(dt_ctx *ctx, dt__node *n, const float *gout);
/* Contiguous f32 gradient buffer of t, allocated zeroed on first use (arena
 * for temporaries, owned heap memory for persistent leaves). */
float *dt__grad(dt_ctx *ctx, dt_tensor *t);

/* The gradient of n->out as the tape walk hands it to n's backward: dt__grad
 * without forgetting the gradient's low-precision shadow (below). */
float *dt__grad_out(dt_ctx *ctx, dt_tensor *t);

/* Low-precision shadows: a producer that writes a temporary's whole
 * gradient rounded to a low dtype (every element already a bf16/f16 value)
 * can keep the same values in that dtype beside it, so that a bf16 GEMM in
 * the consumer's backward takes them instead of converting the f32 buffer
 * again (grad_lp in ops_matmul.c). dt__grad_shadow_new gives an arena buffer
 * of t's numel in dtype lt; after the producer filled it and committed the
 * f32 gradient, dt__grad_shadow_set keeps it when the f32 buffer holds
 * exactly what was written (t's first contribution, written in place:
 * f32buf == t's gradient data) and does nothing otherwise. Every later
 * write access to t's gradient (dt__grad, dt__grad_begin, dt__grad_gemm,
 * dt__grad_commit) drops the shadow, as does the next backward pass.
 * dt__grad_shadow returns it (NULL when there is none in dtype lt). */
void *dt__grad_shadow_new(dt_ctx *ctx, const dt_tensor *t, dt_dtype lt);
/* Whether a producer about to write t's first gradient contribution should
 * write a shadow in lt beside it: t is a temporary with no gradient yet
 * whose own op's backward takes its gradient in lt (node glp_want). Where
 * nothing would read it, the shadow is not written (no bytes, no arena). */
bool dt__grad_shadow_wanted(const dt_tensor *t, dt_dtype lt);
/* dt__grad_shadow_new(ctx, t, lt) when dt__grad_shadow_wanted(t, lt), else
 * NULL; *err is set when the allocation failed (the error is set). */
void *dt__grad_shadow_maybe(dt_ctx *ctx, const dt_tensor *t, dt_dtype lt, bool *err);
void dt__grad_shadow_set(dt_ctx *ctx, dt_tensor *t, const float *f32buf, void *shadow, dt_dtype lt);
/* Whether the running node n, about to write t's first gradient
 * contribution with a shadow in lt (dt__grad_shadow_wanted), may write the
 * shadow alone and leave the f32 buffer unwritten: the one backward that
 * will read t's gradient is its own node's, one that takes only the shadow
 * (node glp_alone: a bf16/f16 linear or addmm, bw_dense: dX, dW and the
 * bias's sums; bias + GELU and layer norm with a rounded result), later in
 * the same walk (not a split backward's input half, not a nested walk);
 * t is not retained (DT_TENSOR_RETAIN_GRAD); and no node between t's and n
 * on the tape takes t (so no later contribution adds to it). The caller
 * then sets the shadow and calls dt__grad_f32_skipped. */
bool dt__grad_shadow_only(const dt_ctx *ctx, const dt__node *n, const dt_tensor *t, dt_dtype lt);
/* t's gradient, just given its shadow (dt__grad_shadow_set), was written
 * there alone: count it (dt_ag_stats.grad_f32_skipped) and mark t
 * (DT_TENSOR_GLP_ONLY), so that any access but the shadow's reader widens
 * the shadow into the f32 buffer first (dt__grad_f32_fill: every write
 * access, which drops the shadow, and a GEMM's backward that finds no
 * shadow); in Debug builds (DT_POISON_UNWRITTEN) the unwritten buffer holds NaN till
 * then, so a reader that bypasses both fails its test. DT_ERR_INTERNAL
 * (and nothing marked) when t holds no such shadow: the values are lost. */
dt_status dt__grad_f32_skipped(dt_ctx *ctx, dt_tensor *t);
/* Where t's gradient is held in its shadow alone (DT_TENSOR_GLP_ONLY): the
 * shadow widened into the f32 buffer (exact: the values are the shadow's),
 * the mark cleared. Nothing otherwise. */
void dt__grad_f32_fill(dt_tensor *t);
const void *dt__grad_shadow(const dt_ctx *ctx, const dt_tensor *t, dt_dtype lt);
/* For the backward of node n (glp_want), about to read its output's
 * gradient: the shadow in lt (dt__grad_shadow), else NULL with the f32
 * values made whole first (dt__grad_f32_fill: a shadow of another dtype
 * alone is widened). */
const void *dt__grad_out_lp(dt_ctx *ctx, const dt__node *n, dt_dtype lt);

/* A node's backward has ended: its scratch goes back to the arena
 * (dt__grad_scratch). And intermediate t (its output; NULL: none) has
 * passed its gradient on: unless t is retained (DT_TENSOR_RETAIN_GRAD), its
 * gradient buffer and shadow go back to the arena (those backward
 * allocated for it: DT_TENSOR_GRAD_OWN / GLP_OWN) and t->grad becomes
 * NULL. */
void dt__grad_drop(dt_ctx *ctx, dt_tensor *t);
/* p (bytes, from the context's arena) is dead once the running node's
 * backward has ended: dt__grad_drop gives it back then. */
void dt__grad_scratch(dt_ctx *ctx, void *p, size_t bytes);
/* t took over from's gradient buffer or shadow (dt__bw_view: a view's
 * gradient or shadow handed to its input as it is): whichever t->grad's data
 * and t->glp_ share with from is t's to give back now, no longer from's
 * (nobody's when from is retained). */
void dt__grad_hand_over(dt_tensor *from, dt_tensor *t);

/* For kernels that OVERWRITE their output: a buffer to write t's gradient
 * contribution into (t's own gradient when this is the first contribution
 * to a temporary, else arena scratch), then dt__grad_commit adds it. */
float *dt__grad_begin(dt_ctx *ctx, dt_tensor *t);
dt_status dt__grad_commit(dt_ctx *ctx, dt_tensor *t, float *buf);
/* For GEMMs: t's gradient buffer and the beta to use (0 when this is the
 * first contribution to a temporary's gradient, so no zero-fill is needed;
 * 1 = accumulate). */
float *dt__grad_gemm(dt_ctx *ctx, dt_tensor *t, float *beta);
/* For a GEMM that would bring the only contribution of this backward pass
 * to a low-precision parameter t whose gradient buffer is lazily zero
 * (DT_TENSOR_GRAD_LAZY; its last pending use, no f32 accumulator live) and
 * whose result oneDNN can write in gt (dt_k_matmul_writes_lp): t's gradient
 * data (dtype gt), with the mark cleared, for the GEMM to write with
 * dt_k_matmul_batched_lp. NULL otherwise (use dt__grad_gemm). The caller
 * must then write the whole buffer. */
void *dt__grad_gemm_lp(dt_ctx *ctx, dt_tensor *t, dt_dtype gt);
/* After that GEMM: whether it saw every value finite as it stored them
 * (dt_k_matmul_lp_checked), for t's grad-ready hooks to ask
 * (dt_ag_grad_checked_finite); the mark goes when the hooks have run or
 * another contribution begins. */
void dt__grad_gemm_lp_done(dt_tensor *t, bool finite);

/* For a GEMM (node self) that writes a low-precision parameter t's gradient
 * [M, N] over K, t lazily zero (DT_TENSOR_GRAD_LAZY, no f32 accumulator
 * live), when every other use of t pending in this walk is an embedding
 * lookup of it (a tied head's weight, whose lookup's backward adds to the
 * rows it looked up) and dt_k_matmul_splits_rows(gt, M, N, K): returns 1
 * with *grad t's gradient data (dtype gt), *acc t's f32 accumulator and
 * *keep the rows map for dt_k_matmul_lp_rows (row r kept at row r of *acc
 * when a lookup touches it). The GEMM rounds the other rows, final, into
 * *grad; the lookups add to the kept rows in *acc, and t's flush rounds
 * only those. 0: not so (use dt__grad_gemm); negative: an error. */
int dt__grad_gemm_rows(dt_ctx *ctx, const dt__node *self, dt_tensor *t, dt_dtype gt, int64_t M, int64_t N,
                       int64_t K, void **grad, float **acc, const int32_t **keep);
/* After that GEMM: whether every value it stored was finite. */
void dt__grad_gemm_rows_done(dt_tensor *t, bool finite);

/* Contiguous f32 output temporary of the given shape. */
dt_tensor *dt__out(dt_ctx *ctx, int ndim, const int64_t *shape);
/* Contiguous f32 data of x: x->data if contiguous, else an arena copy. */
const float *dt__cdata(dt_ctx *ctx, const dt_tensor *x);
/* Row-major contiguous strides for shape. */
void dt__contig_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Checks used at the top of every op; they set the error and return false. */
bool dt__check_f32(const char *op, const char *arg, const dt_tensor *t);
/* "op: <what>: a [2,3] and b [4]" shape error. */
void dt__shape_error(const char *op, const char *what, const dt_tensor *a, const dt_tensor *b);

/* A channel-blocked (DT_TENSOR_BLOCKED8/16) tensor t as a plain NCHW one: t
 * itself when t is plain, else a converted temporary recorded on the tape
 * (its backward converts the gradient back to t's block). NULL with the
 * error set on failure. */
dt_tensor *dt__plain(dt_ctx *ctx, const dt_tensor *t);
static inline bool dt__blocked(const dt_tensor *t)
{
    return t && (t->flags & DT_TENSOR_BLOCKED);
}

/* The DT_TENSOR_* flag for a block of 8 or 16 (0 for anything else). */
static inline uint32_t dt__block_flag(int block)
{
    return block == 8 ? DT_TENSOR_BLOCKED8 : block == 16 ? DT_TENSOR_BLOCKED16 : 0u;
}

/* Null checks; DT__NEED_ANY keeps a channel-blocked input as it is (for the ops that
 * understand that layout), DT__NEED converts it to plain: every other op
 * validates its inputs with it, so none reads blocked data by mistake. */
#define DT__NEED_ANY(ctx, op, t)                                                   \
    do {                                                                            \
        if (!(ctx)) {                                                               \
            dt_error(DT_ERR_NULL, "%s: context is NULL", op);                       \
            return NULL;                                                            \
        }                                                                           \
        if (!(t))                                                                   \
            return dt__null_input(op, #t);                                          \
    } while (0)

#define DT__NEED(ctx, op, t)                                                       \
    do {                                                                            \
        DT__NEED_ANY(ctx, op, t);                                                   \
        if (dt__blocked(t) && !((t) = dt__plain(ctx, (t))))                         \
            return NULL;                                                            \
    } while (0)

#define DT__NEED_F32_ANY(ctx, op, t)                                               \
    do {                                                                            \
        DT__NEED_ANY(ctx, op, t);                                                   \
        if (!dt__check_f32(op, #t, t))                                              \
            return NULL;                                                            \
    } while (0)

#define DT__NEED_F32(ctx, op, t)                                                   \
    do {                                                                            \
        DT__NEED(ctx, op, t);                                                       \
        if (!dt__check_f32(op, #t, t))                                              \
            return NULL;                                                            \
    } while (0)

/* ---- low precision (ops_cast.c; precision.h has the rules) ---------------------- */
#include "dtrain/precision.h"

/* Is t a bf16/f16 tensor (NULL: no)? */
static inline bool dt__is_lp(const dt_tensor *t)
{
    return t && (t->dtype == DT_BF16 || t->dtype == DT_F16);
}
/* The dtype an op computes its result in from these inputs (NULL and
 * non-floating ones ignored): their common low dtype when all floating
 * inputs share one, else f32. */
dt_dtype dt__lp_result(int n, dt_tensor *const *in);
/* Does any input have a low dtype? */
bool dt__any_lp(int n, dt_tensor *const *in);
/* Replace every bf16/f16 in[i] by dt_cast(in[i], f32) (recorded). False
 * with the error set on failure. */
bool dt__widen_all(dt_ctx *ctx, int n, dt_tensor **in);
/* y cast to dtype (y itself when dtype is f32 or y has it; NULL stays NULL). */
dt_tensor *dt__lp_round(dt_ctx *ctx, dt_tensor *y, dt_dtype dtype);
/* The context's autocast for an op of class `op`: DT_AMP_LOWER ops get
 * their f32 inputs cast to the autocast dtype, in place in in[]. */
bool dt__autocast(dt_ctx *ctx, dt_op op, int n, dt_tensor **in);
/* Contiguous f32 data of a float tensor of any of f32/bf16/f16 (an arena
 * copy unless x is contiguous f32). NULL with the error set on failure. */
const float *dt__cdata_f32(dt_ctx *ctx, const dt_tensor *x);
/* y[i] = x[i] rounded to dtype's precision (bf16/f16), in f32. y may alias x. */
dt_status dt__round_to(dt_dtype dtype, const float *x, float *y, int64_t n);
/* dt__round_to that also stores the rounded values in dtype at lp (n
 * elements; NULL: none), e.g. a gradient's shadow (below). */
dt_status dt__round_to_lp(dt_dtype dtype, const float *x, float *y, void *lp, int64_t n);
/* The f32 accumulation of a low-precision leaf's gradient (see grad.c) is
 * added into its gradient tensor; a no-op for other tensors. */
dt_status dt__grad_flush(dt_ctx *ctx, dt_tensor *t);

/* The usual entry of an op that has no low-precision code of its own:
 * when an input in in[0..n) is bf16/f16, widen them all, run `call` (an
 * expression over the widened in[] variables that calls the op's f32
 * path, with autocast suspended: it must not cast them back) and round its
 * result to `rdt`. */
#define DT__LP_RUN(ctx, n, in, rdt, call)                                          \
    do {                                                                            \
        if (dt__any_lp(n, in)) {                                                    \
            dt_dtype rdt_ = (rdt), ac_ = (ctx)->autocast;                           \
            if (!dt__widen_all(ctx, n, in))                                         \
                return NULL;                                                        \
            (ctx)->autocast = DT_F32;                                               \
            dt_tensor *y_ = (call);                                                 \
            (ctx)->autocast = ac_;                                                  \
            return dt__lp_round(ctx, y_, rdt_);                                     \
        }                                                                           \
    } while (0)

/* The GEMM used by matmul/linear/conv: C = alpha * op(A) op(B) + beta * C,
 * row-major, op = transpose when ta/tb. */
void dt__gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
