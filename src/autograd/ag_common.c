/* Helpers shared by the op files: output allocation, contiguous views of
 * inputs, argument checks with messages that name the op and the shapes,
 * and the GEMM entry point the layer ops use. */
#include "autograd/ag_impl.h"
#include "dtrain/kernels.h"

#include <string.h>

void dt__contig_strides(int ndim, const int64_t *shape, int64_t *strides)
{
    int64_t s = 1;
    for (int i = DT_MAX_DIMS - 1; i >= ndim; i--)
        strides[i] = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= shape[i];
    }
}

dt_tensor *dt__out(dt_ctx *ctx, int ndim, const int64_t *shape)
{
    return dt_tensor_empty(ctx, DT_F32, ndim, shape);
}

const float *dt__cdata(dt_ctx *ctx, const dt_tensor *x)
{
    if (dt_tensor_is_contiguous(x))
        return x->data;
    float *p = dt_arena_alloc(ctx->arena, dt_tensor_nbytes(x));
    if (p)
        dt_tensor_read(x, p);
    return p;
}

bool dt__check_f32(const char *op, const char *arg, const dt_tensor *t)
{
    if (t->dtype != DT_F32) {
        char s[96];
        dt_error(DT_ERR_DTYPE, "%s: %s %s is %s, want f32", op, arg,
                 dt_tensor_shape_str(t, s, sizeof s), dt_dtype_name(t->dtype));
        return false;
    }
    return true;
}

void dt__shape_error(const char *op, const char *what, const dt_tensor *a, const dt_tensor *b)
{
    char s1[128], s2[128];
    dt_error(DT_ERR_SHAPE, "%s: %s: %s and %s", op, what, dt_tensor_shape_str(a, s1, sizeof s1),
             dt_tensor_shape_str(b, s2, sizeof s2));
}

float *dt__grad_begin(dt_ctx *ctx, dt_tensor *t)
{
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        /* first contribution to a temporary's gradient: write in place */
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        return g->data;
    }
    return dt_arena_alloc(ctx->arena, dt_tensor_nbytes(t));
}

float *dt__grad_gemm(dt_ctx *ctx, dt_tensor *t, float *beta)
{
    if (!t->grad && (t->flags & DT_TENSOR_TEMP)) {
        dt_tensor *g = dt_tensor_empty(ctx, DT_F32, t->ndim, t->shape);
        if (!g)
            return NULL;
        g->flags |= t->flags & DT_TENSOR_BLOCKED;
        t->grad = g;
        *beta = 0.0f;
        return g->data;
    }
    *beta = 1.0f;
    return dt__grad(ctx, t);
}

dt_status dt__grad_commit(dt_ctx *ctx, dt_tensor *t, float *buf)
{
    if (t->grad && t->grad->data == buf)
        return DT_OK;
    float *g = dt__grad(ctx, t);
    if (!g)
        return dt_last_status();
    return dt_k_axpy(dt_tensor_numel(t), 1.0f, buf, g);
}

/* Reference GEMM, used only when the oneDNN kernel refuses (odd leading
 * dimensions): every C element is accumulated in a fixed order, so
 * results are deterministic. */
static void gemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                     float *C, int64_t ldc)
{
#pragma omp parallel for schedule(static) if (M * N * K > 32768)
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (!tb) {
            float acc[256];
            for (int64_t j0 = 0; j0 < N; j0 += 256) {
                int64_t nj = N - j0 < 256 ? N - j0 : 256;
                memset(acc, 0, sizeof acc);
                for (int64_t p = 0; p < K; p++) {
                    float a = ta ? A[p * lda + i] : A[i * lda + p];
                    const float *b = B + p * ldb + j0;
                    for (int64_t j = 0; j < nj; j++)
                        acc[j] += a * b[j];
                }
                for (int64_t j = 0; j < nj; j++)
                    c[j0 + j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * c[j0 + j]);
            }
        } else {
            for (int64_t j = 0; j < N; j++) {
                const float *b = B + j * ldb;
                float acc = 0.0f;
                if (!ta) {
                    const float *a = A + i * lda;
                    for (int64_t p = 0; p < K; p++)
                        acc += a[p] * b[p];
                } else {
                    for (int64_t p = 0; p < K; p++)
                        acc += A[p * lda + i] * b[p];
                }
                c[j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * c[j]);
            }
        }
    }
}

void dt__gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    bool natural = lda == (ta ? M : K) && ldb == (tb ? K : N) && ldc == N;
    if (natural && M > 0 && N > 0 && K > 0 &&
        dt_k_matmul(ta, tb, M, N, K, alpha, A, B, DT_F32, beta, C, NULL) == DT_OK)
        return;
    gemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- nChw8c / nChw16c -> NCHW (see DT__NEED) -------------------------------------------- */

static dt_status plain_backward(dt_ctx *ctx, dt__node *n, const float *gout)
{
    dt_tensor *X = n->in[0];
    float *gx = dt__grad_begin(ctx, X);
    if (!gx)
        return dt_last_status();
    dt_status st = dt_k_to_blocked(gout, X->shape[0], X->shape[1], X->shape[2] * X->shape[3], dt_tensor_block(X), gx);
    return st < 0 ? st : dt__grad_commit(ctx, X, gx);
}

dt_tensor *dt__plain(dt_ctx *ctx, const dt_tensor *t)
{
    dt_tensor *x = (dt_tensor *)(uintptr_t)t;
    if (!dt__blocked(x))
        return x;
    dt_tensor *out = dt__out(ctx, 4, x->shape);
    if (!out)
        return NULL;
    if (dt_k_from_blocked(x->data, x->shape[0], x->shape[1], x->shape[2] * x->shape[3], dt_tensor_block(x),
                          out->data) < 0) {
        dt_error_wrap(dt_last_status(), "to plain layout");
        return NULL;
    }
    if (dt__ag_wants(ctx, 1, &x) && !dt__ag_record(ctx, "to_plain", plain_backward, out, 1, &x))
        return NULL;
    return out;
}
