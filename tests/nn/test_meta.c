/* Meta builds and shard-local initialisation: a model built with meta =
 * true records its layout without parameter memory; for world sizes 1-4,
 * every rank's shard filled by dt_model_init_range equals, bit for bit, the
 * same range of a fully built model (Philox: dt_model_build's init;
 * torch: dt_model_init_torch's stream). Also the dtype-correct layout of a
 * model with parameters of two dtypes and an i64 buffer. */
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "model_util.h"
#include "test.h"

#include <string.h>

static dt_tensor *no_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ctx, (void)self, (void)ud;
    return x;
}

/* Small models covering every random init: Linear/Conv2d (uniform),
 * Embedding (normal: numel 6 < 16, 21 with a tail, 5000 = 312*16 + 8),
 * Xavier and Kaiming (custom), constants and buffers (BatchNorm). */
static dt_module *mixed_net_ok(void)
{
    dt_module *s = dt_nn_seq(0, NULL);
    dt_nn_add(s, "emb_small", dt_nn_embedding(2, 3));
    dt_nn_add(s, "emb_tail", dt_nn_embedding(7, 3));
    dt_nn_add(s, "emb_big", dt_nn_embedding(100, 50));
    dt_nn_add(s, "conv", dt_nn_conv2d(3, 5, 3, 1, 1, true));
    dt_nn_add(s, "bn", dt_nn_batchnorm2d(5, 1e-5f, 0.1f));
    dt_nn_add(s, "fc", dt_nn_linear(33, 17, true));
    dt_nn_param_spec x = {.name = "xav", .ndim = 2, .shape = {9, 13}, .init = DT_NN_INIT_XAVIER};
    dt_nn_param_spec k = {.name = "kai", .ndim = 3, .shape = {4, 3, 5}, .init = DT_NN_INIT_KAIMING};
    dt_nn_add(s, "x", dt_nn_custom("X", 1, &x, no_forward, NULL));
    dt_nn_add(s, "k", dt_nn_custom("K", 1, &k, no_forward, NULL));
    return s;
}

static dt_status build(int which, int world, bool meta, dt_model **out)
{
    dt_model_build_params bp = dt_model_build_params_default();
    bp.world = world;
    bp.meta = meta;
    if (which == 0) {
        dt_model_config c = dt_model_config_default();
        c.build = bp;
        return dt_model_create("convnet", 17, &c, out, NULL);
    }
    if (which == 1) {
        dt_model_config c = dt_model_config_default();
        c.mlp_seq = 2, c.mlp_dim = 24, c.mlp_hidden = 40;
        c.build = bp;
        return dt_model_create("mlp", 17, &c, out, NULL);
    }
    return dt_model_build(mixed_net_ok(), 17, &bp, out);
}

TEST(shard_init_equals_full_init)
{
    for (int which = 0; which < 3; which++)
        for (int world = 1; world <= 4; world++)
            for (int rng = 0; rng < DT_INIT_RNG_COUNT; rng++) {
                dt_model *full = NULL, *meta = NULL;
                ASSERT_OK(build(which, world, false, &full));
                ASSERT_OK(build(which, world, true, &meta));
                ASSERT(dt_model_is_meta(meta) && !dt_model_is_meta(full));
                ASSERT_EQ_INT(dt_model_world(meta), world);
                if (rng == DT_INIT_TORCH)
                    ASSERT_OK(dt_model_init_torch(full, 17));
                const dt_flat *F = dt_model_flat(full, DT_FLAT_PARAMS, DT_F32);
                const dt_flat *M = dt_model_flat(meta, DT_FLAT_PARAMS, DT_F32);
                ASSERT(F && M);
                ASSERT(M->base == NULL && dt_model_flat(meta, DT_FLAT_GRADS, DT_F32)->base == NULL);
                ASSERT_EQ_INT(M->total, F->total);
                ASSERT_EQ_INT(M->total % (size_t)world, 0);
                size_t covered = 0;
                for (int r = 0; r < world; r++) {
                    dt_flat sh;
                    ASSERT_OK(dt_flat_alloc_shard(&sh, M, r, world, NULL));
                    ASSERT_EQ_INT(sh.numel, M->total / (size_t)world);
                    memset(sh.base, 0x7f, dt_flat_nbytes(&sh)); /* init must overwrite all of it */
                    ASSERT_OK(dt_model_init_range(meta, (dt_init_rng)rng, 17, &sh));
                    if (memcmp(sh.base, dt_flat_ptr(F, sh.offset), dt_flat_nbytes(&sh))) {
                        fprintf(stderr, "  model %d world %d rng %d rank %d differs\n", which, world, rng, r);
                        ASSERT(0);
                    }
                    covered += sh.numel;
                    dt_flat_free(&sh);
                }
                ASSERT_EQ_INT(covered, F->total);
                /* an allocated model's ranges work too, and an odd range */
                dt_flat part;
                ASSERT_OK(dt_flat_alloc(&part, DT_F32, 37, 1, NULL));
                ASSERT_OK(dt_flat_range(&part, 0, 37, &part));
                part.offset = F->used > 60 ? F->used - 60 : 0;
                ASSERT_OK(dt_model_init_range(full, (dt_init_rng)rng, 17, &part));
                ASSERT_EQ_INT(memcmp(part.base, dt_flat_ptr(F, part.offset), 37 * sizeof(float)), 0);
                dt_free(part.base);
                /* the full model is not all zeros (the test can fail) */
                double s = 0;
                for (size_t i = 0; i < F->total; i++)
                    s += ((float *)F->base)[i] * ((float *)F->base)[i];
                ASSERT(s > 0);
                dt_model_free(full);
                dt_model_free(meta);
            }
}

TEST(meta_model_refuses_to_run)
{
    dt_model *m = NULL;
    ASSERT_OK(build(0, 2, true, &m));
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, 0, &p));
    ASSERT(p.tensor == NULL);
    ASSERT_STR_EQ(p.name, "layer1.0.weight");
    /* buffers are allocated and initialised (running_var ones) */
    const dt_flat *B = dt_model_flat(m, DT_FLAT_BUFFERS, DT_F32);
    ASSERT(B && B->base);
    int64_t bi = dt_model_find_entry(m, "layer1.1.running_var");
    ASSERT(bi >= 0);
    ASSERT_OK(dt_model_entry(m, (size_t)bi, &p));
    ASSERT_NEAR(((float *)B->base)[p.offset], 1, 0, 0);
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_zeros(ctx, DT_F32, 4, (int64_t[]){1, 1, 28, 28});
    ASSERT(dt_model_forward(ctx, m, x) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_STATE);
    ASSERT_STR_CONTAINS(dt_last_error(), "meta");
    ASSERT_STATUS(dt_model_init_torch(m, 1), DT_ERR_STATE);
    ASSERT_STATUS(dt_model_set_grads(m, DT_F32, NULL), DT_ERR_STATE);
    /* a range outside the flat, a flat without memory */
    dt_flat bad = *dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    ASSERT_STATUS(dt_model_init_range(m, DT_INIT_PHILOX, 1, &bad), DT_ERR_NULL);
    bad.offset = bad.total;
    ASSERT_STATUS(dt_model_init_range(m, DT_INIT_PHILOX, 1, &bad), DT_ERR_RANGE);
    ASSERT_STATUS(dt_model_init_range(NULL, DT_INIT_PHILOX, 1, &bad), DT_ERR_NULL);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* Offsets are in elements of each entry's own dtype, in the flat of that
 * dtype: an f32 and a bf16 parameter of a custom module, BatchNorm's i64
 * num_batches_tracked. */
TEST(dtype_correct_layout)
{
    dt_nn_param_spec sp[4] = {
        {.name = "a", .ndim = 1, .shape = {5}, .init = DT_NN_INIT_ONES},
        {.name = "h", .ndim = 2, .shape = {3, 7}, .dtype = DT_BF16},
        {.name = "b", .ndim = 1, .shape = {20}, .init = DT_NN_INIT_ONES},
        {.name = "h2", .ndim = 1, .shape = {40}, .dtype = DT_BF16},
    };
    dt_module *s = dt_nn_seq(0, NULL);
    ASSERT_OK(dt_nn_add(s, "c", dt_nn_custom("C", 4, sp, no_forward, NULL)));
    ASSERT_OK(dt_nn_add(s, "bn", dt_nn_batchnorm2d(3, 1e-5f, 0.1f)));
    dt_model_build_params bp = dt_model_build_params_default();
    bp.world = 3;
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(s, 0, &bp, &m));
    const char *names[] = {"c.a", "c.h", "c.b", "c.h2"};
    const size_t offs[] = {0, 0, 16, 32}; /* f32: 5 -> 16; bf16: 21 -> 32 (64 bytes) */
    const dt_dtype dts[] = {DT_F32, DT_BF16, DT_F32, DT_BF16};
    for (int i = 0; i < 4; i++) {
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, names[i]), &p));
        ASSERT_EQ_INT(p.dtype, dts[i]);
        ASSERT_EQ_INT(p.offset, offs[i]);
        const dt_flat *f = dt_model_flat(m, DT_FLAT_PARAMS, p.dtype);
        ASSERT(p.tensor->data == dt_flat_ptr(f, p.offset));
        if (p.dtype == DT_F32) /* autograd is f32 today */
            ASSERT(p.tensor->grad->data == dt_flat_ptr(dt_model_flat(m, DT_FLAT_GRADS, p.dtype), p.offset));
        ASSERT(dt_model_flat(m, DT_FLAT_GRADS, p.dtype)->total == f->total);
        ASSERT_EQ_INT(p.tensor->dtype, p.dtype);
    }
    const dt_flat *f32 = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *b16 = dt_model_flat(m, DT_FLAT_PARAMS, DT_BF16);
    ASSERT_EQ_INT(f32->used, 16 + 32 + 16 + 16);            /* + bn weight, bias (3 -> 16 each) */
    ASSERT_EQ_INT(f32->total, dt_flat_padded(DT_F32, f32->used, 3));
    ASSERT_EQ_INT(b16->used, 32 + 64);
    ASSERT_EQ_INT(b16->total % 3, 0);
    ASSERT(dt_model_flat(m, DT_FLAT_PARAMS, DT_I64) == NULL);
    /* buffers: running stats in an f32 flat, num_batches_tracked in an i64 one */
    dt_param_info nb;
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "bn.num_batches_tracked"), &nb));
    ASSERT(nb.is_buffer && nb.dtype == DT_I64 && nb.offset == 0);
    ASSERT(nb.tensor->data == dt_model_flat(m, DT_FLAT_BUFFERS, DT_I64)->base);
    /* bf16 parameters start at zero; f32 ONES are ones */
    ASSERT_NEAR(((float *)f32->base)[4], 1, 0, 0);
    for (size_t i = 0; i < b16->total; i++)
        ASSERT_EQ_INT(((uint16_t *)b16->base)[i], 0);
    /* a bad dtype in a spec */
    dt_nn_param_spec bad = {.name = "z", .ndim = 1, .shape = {2}, .dtype = DT_DTYPE_COUNT};
    dt_model *m2 = NULL;
    dt_module *c = dt_nn_custom("Z", 1, &bad, no_forward, NULL);
    ASSERT(c == NULL || dt_model_build(c, 0, NULL, &m2) == DT_ERR_INVALID_ARG);
    ASSERT(m2 == NULL);
    dt_model_free(m);
}

int main(void)
{
    RUN(shard_init_equals_full_init);
    RUN(meta_model_refuses_to_run);
    RUN(dtype_correct_layout);
    return TEST_REPORT();
}
