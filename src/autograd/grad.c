/* Gradient buffers of tensors during backward: the accumulate-into
 * gradient of a tensor (allocated zeroed on first use: an arena temporary
 * for temporaries, owned memory for persistent leaves), and the
 * begin/commit pair that lets a backward function write a temporary's
 * first contribution in place instead of adding it. Used by the tape and
 * the op files; calls nothing of either.
 *
 * A leaf marked DT_TENSOR_GRAD_LAZY (tensor.h: its gradient is zero, its
 * buffer not yet written) is unmarked by its first access here: a GEMM
 * (dt__grad_gemm) or a commit writes the contribution over the buffer, every
 * other access zero-fills the buffer first, and a leaf whose gradient is
 * final without any contribution is zero-filled before its hooks
 * (dt__grad_flush). A low-precision leaf is unmarked by its flush (below). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <string.h>

/* A leaf whose gradient tensor is bf16/f16 (a low-precision parameter):
 * the contributions of one backward pass add up in an f32 arena buffer
 * (gacc_, tagged with the pass's epoch) and dt__grad_flush adds that sum to
 * the gradient tensor once, rounding once, when the leaf's gradient is
 * final (just before its grad-ready hooks). The buffer is zero-filled only
 * where the first contribution adds (zero = true); a GEMM's first
 * contribution writes it with beta = 0 instead. A lazily zeroed leaf
 * (DT_TENSOR_GRAD_LAZY) keeps its mark until the flush, which then writes
 * the rounded sum over the stale buffer instead of adding to it. When a
 * GEMM brings a lazy leaf's only contribution of the pass (its last pending
 * use, no accumulator live), dt__grad_gemm_lp hands it the gradient tensor
 * itself: the GEMM rounds its f32 sums into it once (the flush's rounding,
 * without the f32 buffer and the pass over it). */
static bool lp_leaf(const dt_tensor *t)
{
    return t->grad ? t->grad->dtype != DT_F32 : !(t->flags & DT_TENSOR_TEMP) && t->dtype != DT_F32;
}

static bool lp_acc_live(const dt_ctx *ctx, const dt_tensor *t)
{
    return t->gacc_ && t->gacc_epoch_ == ctx->epoch;
}

static float *lp_acc(dt_ctx *ctx, dt_tensor *t, bool zero)
{
    if (lp_acc_live(ctx, t))
        return t->gacc_;
    size_t nb = (size_t)dt_tensor_numel(t) * sizeof(float);
    float *a = dt_arena_alloc(ctx->arena, nb ? nb : sizeof(float));
    if (!a)
        return NULL;
    if (zero)
        memset(a, 0, nb);
    t->gacc_ = a;
    t->gacc_epoch_ = ctx->epoch;
    t->gacc_rows_ = NULL; /* every row of it */
    return a;
}

/* A lazily zeroed leaf's buffer filled with zeros, the mark cleared. */
static void lazy_fill(dt_tensor *t)
{
    t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
    if (t->grad)
        dt_tensor_zero(t->grad);
}

/* g[0..n) (dtype gt) += acc, rounded once, in blocks on every thread. */
static dt_status lp_add(uint16_t *g, dt_dtype gt, const float *acc, int64_t n)
{
    enum { BLK = 4096 };
    const int64_t nb = (n + BLK - 1) / BLK;
    int bad = 0;
#pragma omp parallel for schedule(static) if (nb > 16) reduction(| : bad)
    for (int64_t b = 0; b < nb; b++) {
        float tmp[BLK];
        int64_t i = b * BLK, c = n - i < BLK ? n - i : BLK;
        if (dt_k_convert(g + i, gt, tmp, DT_F32, c) < 0) {
            bad = 1;
            continue;
        }
        for (int64_t j = 0; j < c; j++)
            tmp[j] += acc[i + j];
        bad |= dt_k_convert(tmp, DT_F32, g + i, gt, c) < 0;
    }
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", "lp_add") : DT_OK;
}

/* g[0..n) (dtype gt) = acc rounded, in blocks on every thread, each block
 * checked for inf and NaN while it is in cache: *finite (the leaf's
 * grad-ready hooks then read nothing, dt_ag_grad_checked_finite). */
static dt_status lp_write(uint16_t *g, dt_dtype gt, const float *acc, int64_t n, bool *finite)
{
    enum { BLK = 16384 };
    const int64_t nb = (n + BLK - 1) / BLK;
    int bad = 0, inf = 0;
#pragma omp parallel for schedule(static) if (nb > 16) reduction(| : bad, inf)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i = b * BLK, c = n - i < BLK ? n - i : BLK;
        bad |= dt_k_convert(acc + i, DT_F32, g + i, gt, c) < 0;
        inf |= dt_k_first_nonfinite(g + i, gt, c) < c;
    }
    *finite = !bad && !inf;
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", "lp_write") : DT_OK;
}

/* A leaf's kept rows (dt__grad_gemm_rows), in the arena of the pass. */
struct dt__grad_rows {
    int64_t n;      /* rows */
    bool finite;    /* every value the GEMM stored was finite */
    int64_t row[];  /* sorted */
};

/* The kept rows of t's accumulator (dt__grad_gemm_rows) rounded into its
 * lazily zero gradient, whose other rows the GEMM wrote. */
static dt_status lp_write_rows(dt_tensor *t)
{
    const struct dt__grad_rows *kr = t->gacc_rows_;
    const int64_t D = t->ndim == 2 ? t->shape[1] : 0, nr = kr->n;
    const dt_dtype gt = t->grad->dtype;
    const size_t es = dt_dtype_size(gt);
    int bad = 0, inf = 0;
#pragma omp parallel for schedule(static) if (nr * D > 65536) reduction(| : bad, inf)
    for (int64_t i = 0; i < nr; i++) {
        char *g = (char *)t->grad->data + (size_t)(kr->row[i] * D) * es;
        bad |= dt_k_convert(t->gacc_ + kr->row[i] * D, DT_F32, g, gt, D) < 0;
        inf |= dt_k_first_nonfinite(g, gt, D) < D;
    }
    t->gfinite_ = !bad && !inf && kr->finite;
    t->gacc_rows_ = NULL;
    return bad ? dt_error(DT_ERR_INTERNAL, "%s: a conversion failed", "lp_write_rows") : DT_OK;
}

dt_status dt__grad_flush(dt_ctx *ctx, dt_tensor *t)
{
    const bool lazy = (t->flags & DT_TENSOR_GRAD_LAZY) != 0;
    if (!t->grad || t->grad->dtype == DT_F32 || !lp_acc_live(ctx, t)) {
        if (lazy) /* final without a contribution: zero */
            lazy_fill(t);
        return DT_OK;
    }
    dt_dtype gt = t->grad->dtype;
    int64_t n = dt_tensor_numel(t);
    dt_status st;
    if (t->gacc_rows_) { /* lazy (dt__grad_gemm_rows asks it) */
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
        st = lp_write_rows(t);
    } else if (lazy) { /* the stale buffer reads as zero: the sum rounded over it */
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
        st = lp_write(t->grad->data, gt, t->gacc_, n, &t->gfinite_);
    } else {
        st = lp_add(t->grad->data, gt, t->gacc_, n);
    }
    if (st < 0)
        return st;
    dt_arena_give_back(ctx->arena, t->gacc_, (size_t)n * sizeof(float));
    t->gacc_ = NULL;
    return DT_OK;
}

float *dt__grad_out(dt_ctx *ctx, dt_tensor *t)
{
    if (t->grad && t->grad->dtype != DT_F32) /* a lazy mark stays until the flush */
        return lp_acc(ctx, t, true);
    if (t->flags & DT_TENSOR_GRAD_LAZY)
        lazy_fill(t);
    if (t->grad)
        return t->grad->data;
    dt_tensor *g;
    if (t->flags & DT_TENSOR_TEMP) {
        g = dt_tensor_zeros(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        t->flags |= DT_TENSOR_GRAD_OWN;
    } else { /* a persistent leaf: a gradient of its own dtype */
        g = dt_tensor_new(t->dtype, t->ndim, t->shape);
        if (!g)
            return NULL;
        t->grad = g;
        t->flags |= DT_TENSOR_OWNS_GRAD;
        if (g->dtype != DT_F32)
            return lp_acc(ctx, t, true);
    }
    return g->data;
}

static size_t shadow_bytes(const dt_tensor *t, dt_dtype lt)
{
    return (size_t)dt_tensor_numel(t) * dt_dtype_size(lt);
}

void dt__grad_f32_fill(dt_tensor *t)
{
    if (!(t->flags & DT_TENSOR_GLP_ONLY))
        return;
    t->flags &= ~(uint32_t)DT_TENSOR_GLP_ONLY;
    if (t->glp_ && t->grad && t->grad->dtype == DT_F32) /* the copy's values, held in f32: widened exactly */
        (void)dt_k_convert(t->glp_, t->glp_dtype_, t->grad->data, DT_F32, dt_tensor_numel(t));
}

/* A contribution to t's gradient is about to be written: the low-precision
 * copy of a temporary's gradient (given back when backward allocated it)
 * and a leaf's finite mark no longer hold. */
static void shadow_drop(dt_ctx *ctx, dt_tensor *t)
{
    dt__grad_f32_fill(t); /* a gradient held in its shadow alone: its f32 values before the shadow goes */
    if ((t->flags & DT_TENSOR_GLP_OWN) && t->glp_)
        dt_arena_give_back(ctx->arena, t->glp_, shadow_bytes(t, t->glp_dtype_));
    t->flags &= ~(uint32_t)DT_TENSOR_GLP_OWN;
    t->glp_ = NULL;
    t->gfinite_ = false;
}

void dt__grad_scratch(dt_ctx *ctx, void *p, size_t bytes)
{
    if (p && ctx->nscratch < (int)(sizeof ctx->scratch / sizeof ctx->scratch[0])) { /* else kept till the reset */
        ctx->scratch[ctx->nscratch] = p;
        ctx->scratch_bytes[ctx->nscratch++] = bytes;
    }
}

void dt__grad_drop(dt_ctx *ctx, dt_tensor *t)
{
    for (; ctx->nscratch > ctx->scratch_floor; ctx->nscratch--)
        dt_arena_give_back(ctx->arena, ctx->scratch[ctx->nscratch - 1], ctx->scratch_bytes[ctx->nscratch - 1]);
    if (!t || !(t->flags & DT_TENSOR_TEMP) || (t->flags & DT_TENSOR_RETAIN_GRAD))
        return;
    t->flags &= ~(uint32_t)DT_TENSOR_GLP_ONLY; /* passed on: nothing to widen */
    shadow_drop(ctx, t);
    if ((t->flags & DT_TENSOR_GRAD_OWN) && t->grad)
        dt_arena_give_back(ctx->arena, t->grad->data, dt_tensor_nbytes(t->grad));
    t->flags &= ~(uint32_t)DT_TENSOR_GRAD_OWN;
    t->grad = NULL;
}

void dt__grad_hand_over(dt_tensor *from, dt_tensor *t)
{
    const uint32_t g = DT_TENSOR_GRAD_OWN, l = DT_TENSOR_GLP_OWN;
    if (from->flags & DT_TENSOR_RETAIN_GRAD) /* from's to read until the reset: given back by no one */
        return;
    if (t->grad && from->grad && t->grad->data == from->grad->data) {
        t->flags = (t->flags & ~g) | (from->flags & g);
        from->flags &= ~g;
    }
    if (t->glp_ && t->glp_ == from->glp_) {
        t->flags = (t->flags & ~l) | (from->flags & l);
        from->flags &= ~l;
    }
}

float *dt__grad(dt_ctx *ctx, dt_tensor *t)
{
    shadow_drop(ctx, t);
    return dt__grad_out(ctx, t);
}

void *dt__grad_shadow_new(dt_ctx *ctx, const dt_tensor *t, dt_dtype lt)
{
    return dt_arena_alloc(ctx->arena, shadow_bytes(t, lt));
}

bool dt__grad_shadow_wanted(const dt_tensor *t, dt_dtype lt)
{
    return t && lt != DT_F32 && (t->flags & DT_TENSOR_TEMP) && !t->grad && t->node_ && t->node_->glp_want &&
           t->node_->glp_dtype == lt;
}

void *dt__grad_shadow_maybe(dt_ctx *ctx, const dt_tensor *t, dt_dtype lt, bool *err)
{
    if (!dt__grad_shadow_wanted(t, lt))
        return NULL;
    void *s = dt__grad_shadow_new(ctx, t, lt);
    *err = s == NULL;
    return s;
}

void dt__grad_shadow_set(dt_ctx *ctx, dt_tensor *t, const float *f32buf, void *shadow, dt_dtype lt)
{
    if (!shadow || lt == DT_F32 || !(t->flags & DT_TENSOR_TEMP) || !t->grad || t->grad->dtype != DT_F32 ||
        t->grad->data != f32buf)
        return;
    if (t->glp_ != shadow)
        shadow_drop(ctx, t);
    t->flags |= DT_TENSOR_GLP_OWN;
    t->glp_ = shadow;
    t->glp_of_ = f32buf;
    t->glp_epoch_ = ctx->epoch;
    t->glp_dtype_ = lt;
}

bool dt__grad_shadow_only(const dt_ctx *ctx, const dt__node *n, const dt_tensor *t, dt_dtype lt)
{
    /* not in a split backward's input half (the node's weight half reads the gradient later, in
     * another pass) nor in a nested walk (a checkpointed region's) */
    if (!dt__grad_shadow_wanted(t, lt) || (t->flags & DT_TENSOR_RETAIN_GRAD) || !n || ctx->split_input ||
        ctx->walk_lo != 0)
        return false;
    const dt__node *p = t->node_;
    if (!p->glp_alone || p->idx >= n->idx || n->idx - p->idx > 8 ||
        n->idx >= ctx->tape_len || ctx->tape[n->idx] != n || ctx->tape[p->idx] != p)
        return false;
    for (size_t k = p->idx + 1; k < n->idx; k++) /* a node between that takes t would add to its gradient later */
        for (int j = 0; j < ctx->tape[k]->nin; j++)
            if (ctx->tape[k]->in[j] == t)
                return false;
    int uses = 0; /* and n itself takes t once */
    for (int j = 0; j < n->nin; j++)
        uses += n->in[j] == t;
    return uses == 1;
}

dt_status dt__grad_f32_skipped(dt_ctx *ctx, dt_tensor *t)
{
    if (!t->glp_ || !t->grad || t->grad->data != t->glp_of_) /* the values would be nowhere */
        return dt_error(DT_ERR_INTERNAL, "backward: a gradient was written in %s alone but that copy was not kept",
                        dt_dtype_name(t->glp_ ? t->glp_dtype_ : t->dtype));
    ctx->ag_stats.grad_f32_skipped++;
    t->flags |= DT_TENSOR_GLP_ONLY;
#ifdef DT_POISON_UNWRITTEN
    float *f = t->grad->data;
    for (int64_t i = 0, n = dt_tensor_numel(t); i < n; i++)
        f[i] = __builtin_nanf("");
#endif
    return DT_OK;
}

const void *dt__grad_out_lp(dt_ctx *ctx, const dt__node *n, dt_dtype lt)
{
    const void *s = n->glp_want ? dt__grad_shadow(ctx, n->out, lt) : NULL;
    if (!s)
        dt__grad_f32_fill(n->out); /* held in a shadow of another dtype alone: the f32 values first */
    return s;
}

const void *dt__grad_shadow(const dt_ctx *ctx, const dt_tensor *t, dt_dtype lt)
{
    if (!t->glp_ || t->glp_dtype_ != lt || t->glp_epoch_ != ctx->epoch || !t->grad || t->grad->data != t->glp_of_)
        return NULL;
    return t->glp_;
}

float *dt__grad_begin(dt_ctx *ctx, dt_tensor *t)
{
    shadow_drop(ctx, t);
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        /* first contribution to a temporary's gradient: write in place */
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        t->flags |= DT_TENSOR_GRAD_OWN;
        return g->data;
    }
    size_t nb = (size_t)dt_tensor_numel(t) * sizeof(float) + 4; /* f32 whatever t's dtype */
    float *s = dt_arena_alloc(ctx->arena, nb);
    dt__grad_scratch(ctx, s, nb); /* the commit gives it back */
    return s;
}

/* buf, if scratch of the running node (dt__grad_begin's), is dead: back to the arena now. */
static void scratch_give_back(dt_ctx *ctx, float *buf)
{
    for (int i = ctx->scratch_floor; i < ctx->nscratch; i++)
        if (ctx->scratch[i] == buf) {
            dt_arena_give_back(ctx->arena, buf, ctx->scratch_bytes[i]);
            ctx->scratch[i] = ctx->scratch[ctx->nscratch - 1];
            ctx->scratch_bytes[i] = ctx->scratch_bytes[--ctx->nscratch];
            return;
        }
}

float *dt__grad_gemm(dt_ctx *ctx, dt_tensor *t, float *beta)
{
    shadow_drop(ctx, t);
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        t->flags |= DT_TENSOR_GRAD_OWN;
        *beta = 0.0f;
        return g->data;
    }
    if ((t->flags & DT_TENSOR_GRAD_LAZY) && t->grad && t->grad->dtype == DT_F32) {
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY; /* the GEMM overwrites the buffer */
        *beta = 0.0f;
        return t->grad->data;
    }
    if (lp_leaf(t) && !lp_acc_live(ctx, t)) { /* the pass's first contribution writes the accumulator */
        if (!t->grad && !dt__grad(ctx, t)) /* creates the gradient tensor (and a zeroed accumulator) */
            return NULL;
        *beta = lp_acc_live(ctx, t) ? 1.0f : 0.0f;
        return lp_acc(ctx, t, false);
    }
    *beta = 1.0f;
    return dt__grad(ctx, t);
}

void *dt__grad_gemm_lp(dt_ctx *ctx, dt_tensor *t, dt_dtype gt)
{
    shadow_drop(ctx, t);
    dt_tensor *g = t->grad;
    if (gt == DT_F32 || !g || g->dtype != gt || (t->flags & DT_TENSOR_TEMP) || !(t->flags & DT_TENSOR_GRAD_LAZY) ||
        lp_acc_live(ctx, t) || t->epoch_ != ctx->epoch || t->pending_ != 1 || !dt_tensor_is_contiguous(g) ||
        !dt_k_matmul_writes_lp(gt))
        return NULL;
    t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY; /* the GEMM writes the buffer; the flush finds nothing to add */
    return g->data;
}

void dt__grad_gemm_lp_done(dt_tensor *t, bool finite) { t->gfinite_ = finite; }

/* The node's uses of t as an input that takes part in autograd. */
static int uses_of(const dt__node *n, const dt_tensor *t)
{
    int u = 0;
    for (int j = 0; j < n->nin; j++)
        u += n->in[j] == t && dt__rg(t);
    return u;
}

int dt__grad_gemm_rows(dt_ctx *ctx, const dt__node *self, dt_tensor *t, dt_dtype gt, int64_t M, int64_t N,
                       int64_t K, void **grad, float **acc, const int32_t **keep)
{
    dt_tensor *g = t->grad;
    if (!g || g->dtype != gt || gt == DT_F32 || (t->flags & DT_TENSOR_TEMP) || !(t->flags & DT_TENSOR_GRAD_LAZY) ||
        lp_acc_live(ctx, t) || t->epoch_ != ctx->epoch || !dt_tensor_is_contiguous(g) || t->ndim != 2 ||
        t->shape[0] != M || t->shape[1] != N || M > INT32_MAX || ctx->split_input || ctx->walk_lo != 0 ||
        !dt_k_matmul_splits_rows(gt, M, N, K))
        return 0;
    /* the uses still to come are the walk's needed nodes below self: all lookups of t, no checkpoint region
     * (whose recomputation would bring uses not counted yet) */
    int64_t left = t->pending_ - uses_of(self, t), found = 0;
    if (left <= 0 || self->idx >= ctx->tape_len || ctx->tape[self->idx] != self)
        return 0;
    for (size_t k = 0; k < self->idx; k++) {
        const dt__node *n = ctx->tape[k];
        if (n->mark)
            return 0;
        int u = n->needed ? uses_of(n, t) : 0;
        if (!u)
            continue;
        if (n->op != DT_OP_EMBEDDING || n->in[0] != t || u != 1 || !n->saved[1])
            return 0;
        found++;
    }
    if (found != left)
        return 0;
    int32_t *map = dt_arena_alloc(ctx->arena, (size_t)M * sizeof(int32_t) + 4);
    if (!map)
        return dt_last_status();
    for (int64_t r = 0; r < M; r++)
        map[r] = -1;
    int64_t nr = 0;
    for (size_t k = 0; k < self->idx; k++) {
        const dt__node *n = ctx->tape[k];
        if (!n->needed || !uses_of(n, t))
            continue;
        const int64_t *ids = n->saved[0];
        for (int64_t i = 0; i < n->i[0]; i++)
            if (map[ids[i]] < 0) {
                map[ids[i]] = (int32_t)ids[i];
                nr++;
            }
    }
    struct dt__grad_rows *kr = dt_arena_alloc(ctx->arena, sizeof *kr + (size_t)nr * sizeof(int64_t));
    if (!kr)
        return dt_last_status();
    kr->n = nr;
    kr->finite = false;
    for (int64_t r = 0, i = 0; r < M; r++)
        if (map[r] >= 0)
            kr->row[i++] = r;
    shadow_drop(ctx, t);
    float *a = lp_acc(ctx, t, false);
    if (!a)
        return dt_last_status();
    t->gacc_rows_ = kr;
    *grad = g->data;
    *acc = a;
    *keep = map;
    ctx->ag_stats.grad_rows_split++;
    return 1;
}

void dt__grad_gemm_rows_done(dt_tensor *t, bool finite)
{
    if (t->gacc_rows_)
        t->gacc_rows_->finite = finite;
}

bool dt_ag_grad_checked_finite(const dt_tensor *leaf) { return leaf && leaf->gfinite_; }

dt_status dt__grad_commit(dt_ctx *ctx, dt_tensor *t, float *buf)
{
    shadow_drop(ctx, t);
    if (t->grad && t->grad->dtype == DT_F32 && t->grad->data == buf)
        return DT_OK;
    if ((t->flags & DT_TENSOR_GRAD_LAZY) && t->grad && t->grad->dtype == DT_F32) {
        t->flags &= ~(uint32_t)DT_TENSOR_GRAD_LAZY;
        memcpy(t->grad->data, buf, (size_t)dt_tensor_numel(t) * sizeof(float));
        scratch_give_back(ctx, buf);
        return DT_OK;
    }
    float *g = dt__grad(ctx, t);
    if (!g)
        return dt_last_status();
    dt_status st = dt_k_axpy(dt_tensor_numel(t), 1.0f, buf, g);
    scratch_give_back(ctx, buf);
    return st;
}
