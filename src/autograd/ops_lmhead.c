/* The LM head fused with softmax + cross-entropy (dt_linear_cross_entropy).
 *
 * loss = mean over the counted rows r of lse(l_r) - l_r[y_r], l = x W^T,
 * computed over chunks of rows so that the [N, V] logits never exist: the
 * forward takes, chunk by chunk, the logits (one GEMM), their per-row
 * log-sum-exp and the loss; the backward, chunk by chunk again in reverse
 * order, recomputes the chunk's logits (the last chunk's are still in the
 * buffer from the forward and are not recomputed), turns them into dlogits
 * in place (softmax - onehot, scaled), and adds dx[chunk] = dlogits W and
 * dW += dlogits^T x[chunk] with the GEMMs' beta. One [chunk, V] f32 buffer
 * serves both passes (in low precision a [chunk, V] buffer of that dtype).
 *
 * Low precision (precision.h): autocast treats the op as dt_linear (x and W
 * cast to the autocast dtype); with both bf16 (or both f16) the GEMMs take
 * them as they are and the logits are rounded to that dtype, as dt_linear's
 * bf16 output is (by oneDNN as it stores, where it writes bf16: no f32
 * logits in memory), before the f32 softmax; the backward rounds dlogits to
 * that dtype for its GEMMs, as dt_linear's backward does. The softmax runs
 * on the rows widened chunk by chunk in cache and the rounded dlogits
 * overwrite the row's logits (dt_k_softmax_xent_fwd_lp/_bwd_lp: the f32
 * kernels' numbers, with no f32 [chunk, V] buffer and no separate rounding
 * pass). The forward keeps each row's log-sum-exp (N floats), so the
 * backward takes the softmax in one pass over the logits (one exp each),
 * not two. Mixed dtypes promote to f32. The loss is f32.
 *
 * Against the unfused dt_cross_entropy(dt_linear(x, W)): the same logits
 * row by row; the loss sums per-chunk means (each weighted by its count)
 * instead of one mean, and the chunks' scale g / n is computed as
 * (g n_c / n) / n_c; dW is a sum of per-chunk GEMMs instead of one. So the
 * two agree to float rounding (tests/autograd/test_lmhead.c: 1e-6 relative
 * on the loss, 1e-5 of the largest gradient entry). */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <string.h>

/* Logit bytes a chunk may take when the caller leaves chunk_rows at 0,
 * counted in the buffers the chunk holds (the GEMM dtype's, plus an f32 one
 * where the GEMM cannot write that dtype): GPT-2 124M's bf16 step at B*T =
 * 2048 (206 MB of bf16 logits) is one chunk, with no recomputation and one
 * weight-gradient GEMM over all rows (at 64 MB of f32 it took 7 chunks and ran 24-33%
 * slower than one, and slower than the unfused head); f32 logits of B*T =
 * 4096 (823 MB unfused) take 4 chunks of 206 MB. */
#define DT__LMHEAD_CHUNK_BYTES ((int64_t)256 << 20)

typedef struct {
    const char *X, *W;  /* contiguous x [N, C] and W [V, C] in the GEMM dtype */
    int64_t *lab;       /* N labels (int64 copies) */
    int64_t *count;     /* counted rows per chunk */
    float *lse;         /* N row log-sum-exps from the forward: the backward's softmax in one pass */
    float *buf;         /* [rows, V] f32: the last chunk's logits after the forward (f32), or
                           the GEMM's f32 result (low precision where oneDNN writes no bf16/f16;
                           NULL where it does) */
    void *buf_lp;       /* [rows, V] in the GEMM dtype (low precision only): the last chunk's
                           logits after the forward, their gradient in the backward */
    int64_t N, C, V, rows, total;
    dt_dtype t;
} lmhead_saved;

static int64_t nchunks(const lmhead_saved *s) { return (s->N + s->rows - 1) / s->rows; }

/* The chunk's logits [rc, V]: into s->buf in f32; in low precision into
 * s->buf_lp (rounded by oneDNN as it stores where it writes t, else from
 * the f32 result in s->buf). */
static dt_status chunk_logits(const lmhead_saved *s, int64_t r0, int64_t rc)
{
    const size_t es = dt_dtype_size(s->t);
    const void *Xc = s->X + (size_t)(r0 * s->C) * es;
    if (s->t != DT_F32 && !s->buf) /* dt_k_matmul_writes_lp(t) */
        return dt_k_matmul_batched_lp(false, true, 1, rc, s->V, s->C, 1.0f, Xc, 0, s->W, 0, s->t, s->buf_lp, 0, NULL);
    dt_status st = dt_k_matmul(false, true, rc, s->V, s->C, 1.0f, Xc, s->W, s->t, 0.0f, s->buf, NULL);
    if (st == DT_OK && s->t != DT_F32)
        st = dt_k_convert(s->buf, DT_F32, s->buf_lp, s->t, rc * s->V);
    return st;
}

dt_status dt__bw_lmhead(dt_ctx *ctx, dt__node *n, const float *gout)
{
    const lmhead_saved *s = n->saved[0];
    const size_t es = dt_dtype_size(s->t);
    float bx = 0.0f, bw = 0.0f;
    float *gx = dt__rg(n->in[0]) ? dt__grad_gemm(ctx, n->in[0], &bx) : NULL;
    if (dt__rg(n->in[0]) && !gx)
        return dt_last_status();
    const int64_t nc = nchunks(s);
    /* a tied weight (one chunk): dW rounded into its gradient as the GEMM stores it, but for the rows its
     * lookup's backward adds to, which stay f32 (dt__grad_gemm_rows) */
    void *gw_lp = NULL;
    const int32_t *keep = NULL;
    float *gw = NULL;
    int split = dt__rg(n->in[1]) && nc == 1 && s->t != DT_F32
                   ? dt__grad_gemm_rows(ctx, n, n->in[1], s->t, s->V, s->C, s->N, &gw_lp, &gw, &keep)
                   : 0;
    if (split < 0)
        return split;
    if (!split && dt__rg(n->in[1]) && !(gw = dt__grad_gemm(ctx, n->in[1], &bw)))
        return dt_last_status();
    dt_status st = DT_OK;
    for (int64_t c = nc - 1; c >= 0 && st == DT_OK; c--) {
        int64_t r0 = c * s->rows, rc = r0 + s->rows < s->N ? s->rows : s->N - r0;
        if (c != nc - 1 && (st = chunk_logits(s, r0, rc)) < 0) /* the last chunk's are in the buffer */
            break;
        /* g / n for the chunk's rows: the kernel divides by the chunk's count */
        float dl = s->total ? gout[0] * ((float)s->count[c] / (float)s->total) : 0.0f;
        const void *G = s->buf;
        if (s->t == DT_F32) {
            if ((st = dt_k_softmax_xent_bwd_lse(s->buf, s->lse + r0, s->lab + r0, DT_I64, rc, s->V, dl, s->buf)) < 0)
                break;
        } else { /* chunk by chunk in cache, rounded to t over its logits */
            if ((st = dt_k_softmax_xent_bwd_lp(s->t, s->buf_lp, s->lse + r0, s->lab + r0, DT_I64, rc, s->V, dl, NULL,
                                               s->buf_lp)) < 0)
                break;
            G = s->buf_lp;
        }
        const char *Xc = s->X + (size_t)(r0 * s->C) * es;
        if (gx) /* dx[chunk] = dlogits W: rows of their own, the same beta for every chunk */
            st = dt_k_matmul(false, false, rc, s->C, s->V, 1.0f, G, s->W, s->t, bx, gx + r0 * s->C, NULL);
        if (st == DT_OK && split) {
            bool fin = false;
            st = dt_k_matmul_lp_rows(true, false, s->V, s->C, rc, G, Xc, s->t, gw_lp, keep, gw, &fin);
            dt__grad_gemm_rows_done(n->in[1], fin);
        } else if (st == DT_OK && gw) { /* dW += dlogits^T x[chunk] */
            st = dt_k_matmul(true, false, s->V, s->C, rc, 1.0f, G, Xc, s->t, bw, gw, NULL);
            bw = 1.0f;
        }
    }
    return st;
}

dt_tensor *dt_linear_cross_entropy(dt_ctx *ctx, dt_tensor *x, dt_tensor *w, dt_tensor *labels, int64_t chunk_rows)
{
    const char *op = "dt_linear_cross_entropy";
    DT__NEED(ctx, op, x);
    DT__NEED(ctx, op, w);
    DT__NEED(ctx, op, labels);
    dt_tensor *lp[2] = {x, w};
    if (!dt__autocast(ctx, DT_OP_LINEAR_CROSS_ENTROPY, 2, lp)) /* "lower" as dt_linear: the operands in the autocast dtype */
        return NULL;
    x = lp[0], w = lp[1];
    dt_dtype t = dt__lp_result(2, lp);
    if (t == DT_F32) { /* f32, or mixed dtypes: promoted */
        if (dt__any_lp(2, lp)) {
            dt_dtype ac = ctx->autocast;
            if (!dt__widen_all(ctx, 2, lp))
                return NULL;
            ctx->autocast = DT_F32;
            dt_tensor *y = dt_linear_cross_entropy(ctx, lp[0], lp[1], labels, chunk_rows);
            ctx->autocast = ac;
            return y;
        }
        if (!dt__check_f32(op, "x", x) || !dt__check_f32(op, "weight", w))
            return NULL;
    }
    if (labels->dtype != DT_I32 && labels->dtype != DT_I64) {
        char s[64];
        dt_error(DT_ERR_DTYPE, "%s: labels %s are %s, want i32 or i64", op, dt_tensor_shape_str(labels, s, sizeof s),
                 dt_dtype_name(labels->dtype));
        return NULL;
    }
    if (x->ndim < 1 || w->ndim != 2 || x->shape[x->ndim - 1] != w->shape[1]) {
        dt__shape_error(op, "x [..., C] and weight [V, C] do not match", x, w);
        return NULL;
    }
    int64_t N = 1;
    for (int i = 0; i < x->ndim - 1; i++)
        N *= x->shape[i];
    bool lab_ok = labels->ndim == x->ndim - 1 || labels->ndim == 1;
    if (lab_ok && labels->ndim == x->ndim - 1)
        for (int i = 0; i < labels->ndim; i++)
            lab_ok = lab_ok && labels->shape[i] == x->shape[i];
    if (!lab_ok || dt_tensor_numel(labels) != N || !dt_tensor_is_contiguous(labels)) {
        dt__shape_error(op, "want contiguous labels with x's leading dims ([...] for x [..., C])", x, labels);
        return NULL;
    }
    const int64_t C = w->shape[1], V = w->shape[0];
    if (N == 0 || V == 0) {
        dt__shape_error(op, "empty batch or no classes", x, w);
        return NULL;
    }
    if (chunk_rows < 0) {
        dt_error(DT_ERR_INVALID_ARG, "%s: chunk_rows %lld is negative", op, (long long)chunk_rows);
        return NULL;
    }
    lmhead_saved *s = dt_arena_alloc(ctx->arena, sizeof *s);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    s->N = N, s->C = C, s->V = V, s->t = t;
    if (chunk_rows == 0) { /* balanced chunks of at most DT__LMHEAD_CHUNK_BYTES of logits */
        int64_t lb = V * (t == DT_F32 ? 4 : (int64_t)dt_dtype_size(t) + (dt_k_matmul_writes_lp(t) ? 0 : 4));
        int64_t per = DT__LMHEAD_CHUNK_BYTES / lb > 0 ? DT__LMHEAD_CHUNK_BYTES / lb : 1;
        int64_t k = (N + per - 1) / per;
        chunk_rows = (N + k - 1) / k;
    }
    s->rows = chunk_rows < N ? chunk_rows : N;
    const int64_t nc = nchunks(s);
    s->lab = dt_arena_alloc(ctx->arena, (size_t)N * sizeof(int64_t));
    s->count = dt_arena_alloc(ctx->arena, (size_t)nc * sizeof(int64_t));
    s->lse = dt_arena_alloc(ctx->arena, (size_t)N * sizeof(float));
    if (t == DT_F32 || !dt_k_matmul_writes_lp(t)) /* the GEMM's f32 result */
        s->buf = dt_arena_alloc(ctx->arena, (size_t)(s->rows * V) * sizeof(float));
    if (!s->lab || !s->count || !s->lse || (!s->buf && (t == DT_F32 || !dt_k_matmul_writes_lp(t))))
        return NULL;
    if (t != DT_F32 && !(s->buf_lp = dt_arena_alloc(ctx->arena, (size_t)(s->rows * V) * dt_dtype_size(t))))
        return NULL;
    const char *lb = labels->data;
    for (int64_t r = 0; r < N; r++) {
        int64_t y = s->lab[r] = labels->dtype == DT_I64 ? ((const int64_t *)lb)[r] : ((const int32_t *)lb)[r];
        if ((y < 0 || y >= V) && y != DT_K_IGNORE_INDEX) {
            dt_error(DT_ERR_RANGE, "%s: label %lld at row %lld not in [0, %lld)", op, (long long)y, (long long)r,
                     (long long)V);
            return NULL;
        }
    }
    for (int64_t c = 0; c < nc; c++) {
        int64_t r0 = c * s->rows, r1 = r0 + s->rows < N ? r0 + s->rows : N, k = 0;
        for (int64_t r = r0; r < r1; r++)
            k += s->lab[r] != DT_K_IGNORE_INDEX;
        s->count[c] = k;
        s->total += k;
    }
    s->X = (const char *)dt__cdata(ctx, x); /* contiguous, in x's own dtype */
    s->W = (const char *)dt__cdata(ctx, w);
    dt_tensor *out = dt__out(ctx, 0, NULL);
    if (!s->X || !s->W || !out)
        return NULL;
    double sum = 0.0;
    for (int64_t c = 0; c < nc; c++) {
        int64_t r0 = c * s->rows, rc = r0 + s->rows < N ? s->rows : N - r0;
        float lc;
        dt_status st = chunk_logits(s, r0, rc);
        if (st == DT_OK)
            st = t == DT_F32 ? dt_k_softmax_xent_fwd_lse(s->buf, s->lab + r0, DT_I64, rc, V, &lc, s->lse + r0)
                             : dt_k_softmax_xent_fwd_lp(t, s->buf_lp, s->lab + r0, DT_I64, rc, V, &lc, s->lse + r0);
        if (st < 0) {
            dt_error_wrap(dt_last_status(), "%s", op);
            return NULL;
        }
        sum += (double)lc * (double)s->count[c];
    }
    ((float *)out->data)[0] = s->total ? (float)(sum / (double)s->total) : 0.0f;
    dt_tensor *in[2] = {x, w};
    if (dt__ag_wants(ctx, 2, in)) {
        dt__node *n = dt__ag_record(ctx, DT_OP_LINEAR_CROSS_ENTROPY, out, 2, in);
        if (!n)
            return NULL;
        n->saved[0] = s;
    }
    return out;
}
