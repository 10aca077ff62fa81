/* The steady state of a training step does no malloc in dtrain's own code:
 * after two warm-up steps (the arena coalesces, the tape array and the
 * kernels' caches reach their size), forward + backward + reset of a small
 * ConvNet-like model and an MLP with GELU, layer norm, dropout and softmax
 * call malloc/calloc/realloc/aligned_alloc zero times. The allocation
 * functions are wrapped at link time (tests/autograd/tests.cmake:
 * -Wl,--wrap=...), which covers every object of libdtrain_static; oneDNN's
 * own shared library is not covered. */
#include "dtrain/autograd.h"
#include "test.h"

#include <stdlib.h>

#define SH(...) ((const int64_t[]){__VA_ARGS__})

static long n_alloc;
void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t al, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t al, size_t n);
void *__wrap_malloc(size_t n) { n_alloc++; return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { n_alloc++; return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { n_alloc++; return __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t al, size_t n) { n_alloc++; return __real_aligned_alloc(al, n); }

static dt_tensor *param(int nd, const int64_t *sh, uint64_t seed)
{
    dt_tensor *t = dt_tensor_new(DT_F32, nd, sh);
    dt_tensor_rand_normal(t, dt_rng_key_make(seed, DT_RNG_INIT, 0, 0), 0, 0.1f);
    dt_tensor_set_requires_grad(t, true);
    return t;
}

TEST(convnet_steady_state)
{
    dt_tensor *p[8] = {param(4, SH(4, 1, 3, 3), 1), param(1, SH(4), 2), param(1, SH(4), 3),
                       param(1, SH(4), 4),          param(2, SH(10, 4 * 4 * 4), 5),
                       param(1, SH(10), 6),         NULL, NULL};
    dt_tensor *rm = dt_tensor_new(DT_F32, 1, SH(4)), *rv = dt_tensor_new(DT_F32, 1, SH(4));
    dt_tensor_fill(rv, 1);
    static float x[8 * 64];
    static int64_t y[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int i = 0; i < 8 * 64; i++)
        x[i] = (float)((i * 37) % 11) / 11.0f;
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    long before = 0;
    for (int step = 0; step < 6; step++) {
        if (step == 3)
            before = n_alloc;
        dt_tensor *h = dt_tensor_view_of(ctx, x, DT_F32, 4, SH(8, 1, 8, 8));
        h = dt_conv2d(ctx, h, p[0], p[1], 1, 1);
        h = dt_batch_norm(ctx, h, p[2], p[3], rm, rv, true, 0.1f, 1e-5f);
        h = dt_relu(ctx, h);
        h = dt_max_pool2d(ctx, h, 2, 0, 0);
        h = dt_flatten(ctx, h, 1, -1);
        h = dt_linear(ctx, h, p[4], p[5]);
        dt_tensor *loss = dt_cross_entropy(ctx, h, dt_tensor_view_of(ctx, y, DT_I64, 1, SH(8)));
        ASSERT(loss);
        ASSERT_OK(dt_backward(ctx, loss));
        dt_ctx_reset(ctx);
    }
    ASSERT(before > 0); /* the wrapper sees the warm-up allocations */
    ASSERT_EQ_INT(n_alloc - before, 0);
    dt_ctx_free(ctx);
    for (int i = 0; i < 6; i++)
        dt_tensor_free(p[i]);
    dt_tensor_free(rm);
    dt_tensor_free(rv);
}

TEST(mlp_steady_state)
{
    dt_tensor *w0 = param(2, SH(16, 8), 1), *g = param(1, SH(16), 2), *w1 = param(2, SH(16, 16), 3);
    static float x[2 * 3 * 8];
    for (int i = 0; i < 48; i++)
        x[i] = (float)i / 48.0f;
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    long before = 0;
    for (int step = 0; step < 6; step++) {
        if (step == 3)
            before = n_alloc;
        dt_tensor *h = dt_tensor_view_of(ctx, x, DT_F32, 3, SH(2, 3, 8));
        h = dt_matmul(ctx, h, dt_transpose(ctx, w0, 0, 1));
        h = dt_layer_norm(ctx, h, g, NULL, 1e-5f);
        h = dt_gelu(ctx, h);
        h = dt_dropout(ctx, h, 0.1f, true, dt_rng_key_make(1, DT_RNG_DROPOUT, 0, (uint64_t)step));
        h = dt_linear(ctx, h, w1, NULL);
        h = dt_add(ctx, dt_softmax(ctx, h), dt_scale(ctx, h, 0.5f));
        dt_tensor *loss = dt_mean(ctx, dt_mul(ctx, h, h));
        ASSERT(loss);
        ASSERT_OK(dt_backward(ctx, loss));
        dt_ctx_reset(ctx);
    }
    ASSERT(before > 0); /* the wrapper sees the warm-up allocations */
    ASSERT_EQ_INT(n_alloc - before, 0);
    dt_ctx_free(ctx);
    dt_tensor_free(w0);
    dt_tensor_free(g);
    dt_tensor_free(w1);
}

int main(void)
{
    RUN(convnet_steady_state);
    RUN(mlp_steady_state);
    return TEST_REPORT();
}
