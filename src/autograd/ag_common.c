/* Helpers shared by the op files and the tape: output allocation,
 * contiguous views of inputs, argument checks with messages that name the
 * op and the shapes, and the GEMM entry point the layer ops use. Nothing
 * here records on the tape or touches gradients (grad.c, tape.c): the
 * files call downwards only, ag_common <- grad <- tape <- ops_*. */
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
