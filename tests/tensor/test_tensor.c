/* Tensors: creation, views over flat buffers, rebind, strided copies,
 * element access, the context arena. */
#include "dtrain/autograd.h"
#include "dtrain/tensor.h"
#include "test.h"

TEST(wrap_views_flat_buffer)
{
    float *flat = dt_calloc(20 * sizeof(float));
    dt_tensor *a = dt_tensor_wrap(flat, DT_F32, 2, (const int64_t[]){2, 3});
    dt_tensor *b = dt_tensor_wrap(flat + 6, DT_F32, 1, (const int64_t[]){4});
    ASSERT(a && b);
    ASSERT_EQ_INT(dt_tensor_numel(a), 6);
    ASSERT_EQ_INT(a->strides[0], 3);
    ASSERT_EQ_INT(a->strides[1], 1);
    ASSERT(dt_tensor_is_contiguous(a));
    ASSERT_OK(dt_tensor_fill(b, 2.5));
    ASSERT_NEAR(flat[6], 2.5, 0, 0);
    ASSERT_NEAR(flat[9], 2.5, 0, 0);
    ASSERT_NEAR(flat[10], 0, 0, 0);
    ASSERT_OK(dt_tensor_set(a, 4, 7.0));
    ASSERT_NEAR(flat[4], 7.0, 0, 0);
    ASSERT_NEAR(dt_tensor_get(a, 4), 7.0, 0, 0);
    /* rebind moves the view to other memory */
    float other[6] = {1, 2, 3, 4, 5, 6};
    ASSERT_OK(dt_tensor_rebind(a, other));
    ASSERT_NEAR(dt_tensor_get(a, 5), 6.0, 0, 0);
    char buf[64];
    ASSERT_STR_EQ(dt_tensor_shape_str(a, buf, sizeof buf), "[2,3]");
    dt_tensor_free(a);
    dt_tensor_free(b);
    dt_free(flat);
}

TEST(new_owns_zeroed_data)
{
    dt_tensor *t = dt_tensor_new(DT_I64, 3, (const int64_t[]){2, 1, 3});
    ASSERT(t);
    for (int64_t i = 0; i < 6; i++)
        ASSERT_NEAR(dt_tensor_get(t, i), 0, 0, 0);
    ASSERT_OK(dt_tensor_set(t, 5, 123456789.0));
    ASSERT_EQ_INT(((int64_t *)t->data)[5], 123456789);
    dt_tensor_free(t);
    dt_tensor_free(NULL);
}

TEST(bad_creation)
{
    dt_tensor *e;
    dt_error_clear();
    ASSERT(!dt_tensor_new(DT_F32, 9, (const int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}));
    ASSERT_STR_CONTAINS(dt_last_error(), "ndim 9");
    ASSERT(!dt_tensor_new(DT_F32, 2, (const int64_t[]){2, -1}));
    ASSERT_STR_CONTAINS(dt_last_error(), "negative");
    /* a zero dimension does not hide the others' overflow (accepted before: numel overflowed) */
    ASSERT(!dt_tensor_new(DT_F32, 3, (const int64_t[]){INT64_MAX, 2, 0}));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_RANGE);
    ASSERT(!dt_tensor_wrap(NULL, DT_F32, 3, (const int64_t[]){(int64_t)1 << 40, 0, (int64_t)1 << 40}));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_RANGE);
    e = dt_tensor_new(DT_F32, 3, (const int64_t[]){(int64_t)1 << 20, 0, (int64_t)1 << 20});
    ASSERT(e && dt_tensor_numel(e) == 0);
    dt_tensor_free(e);
    ASSERT(!dt_tensor_wrap(NULL, DT_F32, 1, (const int64_t[]){3}));
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    e = dt_tensor_wrap(NULL, DT_F32, 1, (const int64_t[]){0});
    ASSERT(e != NULL); /* empty tensors need no data */
    dt_tensor_free(e);
    ASSERT_STATUS(dt_tensor_set(NULL, 0, 1), DT_ERR_NULL);
    dt_tensor *t = dt_tensor_new(DT_F32, 1, (const int64_t[]){3});
    ASSERT_STATUS(dt_tensor_set(t, 3, 1.0), DT_ERR_RANGE);
    ASSERT(isnan(dt_tensor_get(t, -1)));
    ASSERT(isnan(dt_tensor_item(t)));
    dt_tensor *iv = dt_tensor_new(DT_I32, 0, NULL);
    ASSERT_STATUS(dt_tensor_set_requires_grad(iv, true), DT_ERR_DTYPE);
    dt_tensor_free(iv);
    dt_tensor *g = dt_tensor_new(DT_F32, 1, (const int64_t[]){4});
    ASSERT_STATUS(dt_tensor_set_grad(t, g), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "[3]");
    ASSERT_STR_CONTAINS(dt_last_error(), "[4]");
    dt_tensor_free(g);
    dt_tensor_free(t);
}

TEST(views_share_storage)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float v[24];
    for (int i = 0; i < 24; i++)
        v[i] = (float)i;
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, (const int64_t[]){2, 3, 4}, v);
    ASSERT(x);
    dt_tensor *t = dt_transpose(ctx, x, 0, 2); /* [4,3,2] */
    ASSERT(t);
    ASSERT_EQ_INT(t->shape[0], 4);
    ASSERT_EQ_INT(t->shape[2], 2);
    ASSERT(t->data == x->data);
    ASSERT(!dt_tensor_is_contiguous(t));
    /* t[i][j][k] = x[k][j][i] = k*12 + j*4 + i ; flat index of t (i,j,k) = i*6+j*2+k */
    ASSERT_NEAR(dt_tensor_get(t, 1 * 6 + 2 * 2 + 1), 1 * 12 + 2 * 4 + 1, 0, 0);
    dt_tensor *n = dt_narrow(ctx, x, 1, 1, 2); /* [2,2,4] starting at x[:,1] */
    ASSERT(n);
    ASSERT(n->data == (float *)x->data + 4);
    ASSERT_NEAR(dt_tensor_get(n, 0), 4, 0, 0);
    ASSERT_NEAR(dt_tensor_get(n, 8), 16, 0, 0);
    /* writes through a view land in the base */
    ASSERT_OK(dt_tensor_set(n, 1, -1.0));
    ASSERT_NEAR(v[5] * 0 + ((float *)x->data)[5], -1.0, 0, 0);
    dt_tensor *r = dt_reshape(ctx, x, 2, (const int64_t[]){-1, 6});
    ASSERT(r && r->data == x->data);
    ASSERT_EQ_INT(r->shape[0], 4);
    /* reshape of a non-contiguous view copies */
    dt_tensor *rt = dt_reshape(ctx, t, 1, (const int64_t[]){24});
    ASSERT(rt && rt->data != x->data);
    ASSERT_NEAR(dt_tensor_get(rt, 1), 12, 0, 0);
    dt_tensor *c = dt_contiguous(ctx, t);
    ASSERT(c && dt_tensor_is_contiguous(c));
    for (int64_t i = 0; i < 24; i++)
        ASSERT_NEAR(dt_tensor_get(c, i), dt_tensor_get(t, i), 0, 0);
    dt_tensor *f = dt_flatten(ctx, x, 1, -1);
    ASSERT(f && f->ndim == 2 && f->shape[1] == 12);
    dt_tensor *p = dt_permute(ctx, x, (const int[]){1, 2, 0});
    ASSERT(p && p->shape[0] == 3 && p->shape[1] == 4 && p->shape[2] == 2);
    ASSERT_NEAR(dt_tensor_get(p, 1 * 8 + 2 * 2 + 1), 12 + 4 + 2, 0, 0);
    dt_ctx_free(ctx);
}

TEST(copy_read_write_strided)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float v[6] = {1, 2, 3, 4, 5, 6}, out[6];
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 2, (const int64_t[]){2, 3}, v);
    dt_tensor *t = dt_transpose(ctx, x, 0, 1);
    ASSERT_OK(dt_tensor_read(t, out));
    float want[6] = {1, 4, 2, 5, 3, 6};
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(out[i], want[i], 0, 0);
    float w[6] = {10, 40, 20, 50, 30, 60};
    ASSERT_OK(dt_tensor_write(t, w));
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(((float *)x->data)[i], (i + 1) * 10, 0, 0);
    dt_tensor *y = dt_tensor_zeros(ctx, DT_F32, 2, (const int64_t[]){3, 2});
    ASSERT_OK(dt_tensor_copy(y, t));
    ASSERT_NEAR(dt_tensor_get(y, 1), 40, 0, 0);
    ASSERT_STATUS(dt_tensor_copy(x, y), DT_ERR_SHAPE);
    dt_ctx_free(ctx);
}

TEST(rng_fill_deterministic)
{
    dt_tensor *a = dt_tensor_new(DT_F32, 1, (const int64_t[]){100});
    dt_tensor *b = dt_tensor_new(DT_F32, 1, (const int64_t[]){100});
    dt_rng_key k = dt_rng_key_make(7, DT_RNG_USER, 1, 2);
    ASSERT_OK(dt_tensor_rand_normal(a, k, 0, 1));
    ASSERT_OK(dt_tensor_rand_normal(b, k, 0, 1));
    ASSERT(memcmp(a->data, b->data, 400) == 0);
    ASSERT_OK(dt_tensor_rand_uniform(a, k, -1, 1));
    for (int i = 0; i < 100; i++)
        ASSERT(((float *)a->data)[i] >= -1 && ((float *)a->data)[i] < 1);
    /* bad ranges were filled silently (values above hi, NaN, mirrored normals); torch refuses them too */
    memcpy(b->data, a->data, 400);
    ASSERT_STATUS(dt_tensor_rand_uniform(a, k, 1, -1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "lo <= hi");
    ASSERT_STATUS(dt_tensor_rand_uniform(a, k, 0, INFINITY), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_tensor_rand_uniform(a, k, NAN, 1), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_tensor_rand_normal(a, k, 0, -1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "std >= 0");
    ASSERT_STATUS(dt_tensor_rand_normal(a, k, NAN, 1), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_tensor_rand_normal(a, k, 0, INFINITY), DT_ERR_INVALID_ARG);
    ASSERT(memcmp(a->data, b->data, 400) == 0); /* nothing written */
    ASSERT_OK(dt_tensor_rand_normal(a, k, 3, 0));
    ASSERT_NEAR(((float *)a->data)[7], 3, 0, 0);
    ASSERT_OK(dt_tensor_rand_uniform(a, k, 2, 2));
    dt_tensor_free(a);
    dt_tensor_free(b);
}

TEST(arena_reset_no_growth)
{
    dt_ctx_params p = dt_ctx_params_default();
    p.arena_block = 4096; /* small, to force spills in the first step */
    dt_ctx *ctx = NULL;
    dt_ctx_init(&p, &ctx);
    size_t peak1 = 0;
    void *first[3] = {0};
    for (int step = 0; step < 5; step++) {
        dt_tensor *a = dt_tensor_zeros(ctx, DT_F32, 2, (const int64_t[]){64, 64});
        dt_tensor *b = dt_tensor_full(ctx, DT_F32, 2, (const int64_t[]){64, 64}, 1.0);
        dt_tensor *c = dt_add(ctx, a, b);
        ASSERT(c);
        if (step == 2) {
            first[0] = a->data;
            first[1] = b->data;
            first[2] = c->data;
            peak1 = dt_arena_peak(dt_ctx_arena(ctx));
        }
        if (step > 2) { /* steady state: same addresses, no growth */
            ASSERT(a->data == first[0] && b->data == first[1] && c->data == first[2]);
            ASSERT_EQ_U64(dt_arena_peak(dt_ctx_arena(ctx)), peak1);
        }
        dt_ctx_reset(ctx);
        ASSERT_EQ_U64(dt_arena_used(dt_ctx_arena(ctx)), 0);
    }
    dt_ctx_free(ctx);
}

int main(void)
{
    RUN(wrap_views_flat_buffer);
    RUN(new_owns_zeroed_data);
    RUN(bad_creation);
    RUN(views_share_storage);
    RUN(copy_read_write_strided);
    RUN(rng_fill_deterministic);
    RUN(arena_reset_no_growth);
    return TEST_REPORT();
}
