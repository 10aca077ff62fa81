/* General modules: containers with named children and their own forward
 * (a residual block), weight tying (two names, one storage, gradients
 * summed), hooks added with an id and removed by id.
 *
 * The reference numbers come from tests/nn/gen_modules_ref.py (PyTorch
 * 1.13, Debian, CPU, one thread): the same two models written with
 * torch.nn, initialised by torch.manual_seed (here: dt_model_init_torch with
 * the same seed, which draws PyTorch's stream in the same order), inputs by
 * formulas. Printed with float.hex. */
#include "dtrain/autograd.h"
#include "dtrain/nn.h"
#include "model_util.h"
#include "test.h"

#include <string.h>

static const float ref_res_loss = 0x1.f649540000000p-1f;
static const float ref_stem_w_grad[6] = {
    -0x1.2ef5000000000p-9f, -0x1.1850ce0000000p-4f, 0x1.ea9d980000000p-9f, -0x1.0343c00000000p-4f,
    -0x1.12eee00000000p-12f, 0x1.1036500000000p-3f};

static const float ref_conv1_w_grad[6] = {
    0x1.d96f5a0000000p-7f, -0x1.11fee80000000p-2f, -0x1.3ebb420000000p-9f, 0x1.2b8f320000000p-4f,
    -0x1.6b73d80000000p-3f, -0x1.17d45c0000000p-7f};

static const float ref_bn2_w_grad[8] = {
    0x1.41f7e00000000p-4f, -0x1.84e1bc0000000p-6f, 0x1.26c6400000000p-6f, -0x1.f8c6340000000p-7f,
    -0x1.4823980000000p-7f, -0x1.a616620000000p-5f, -0x1.0a4c9c0000000p-3f, 0x1.0c77480000000p-7f};

static const float ref_fc_b_grad[3] = {
    -0x1.d39fa00000000p-4f, 0x1.fd4a440000000p-3f, -0x1.137a740000000p-3f};

static const float ref_bn1_rm[4] = {
    0x1.56d1140000000p-12f, 0x1.c8f2800000000p-12f, -0x1.3dd6840000000p-9f, -0x1.548e1a0000000p-8f};

static const float ref_tied_loss = 0x1.732f120000000p+1f;
static const float ref_wte_grad[60] = {
    -0x1.b843780000000p-7f, 0x1.5d8bf60000000p-5f, 0x1.0e1d8e0000000p-5f, -0x1.f499840000000p-7f,
    0x1.d48a1e0000000p-7f, -0x1.129b2c0000000p-5f, -0x1.ddeac80000000p-9f, -0x1.052fd00000000p-6f,
    -0x1.061c8e0000000p-5f, 0x1.ceac3a0000000p-6f, 0x1.6de5380000000p-8f, 0x1.d4d6400000000p-6f,
    -0x1.8e553a0000000p-6f, 0x1.c0d2de0000000p-7f, -0x1.47dcfa0000000p-7f, 0x1.61c8e80000000p-8f,
    0x1.e9e5800000000p-6f, 0x1.9f60f20000000p-6f, 0x1.94b0760000000p-6f, -0x1.dacfb80000000p-5f,
    0x1.3640440000000p-5f, 0x1.788d9a0000000p-6f, -0x1.6089c20000000p-3f, -0x1.154a3c0000000p-3f,
    -0x1.d2ba800000000p-3f, 0x1.8eac4a0000000p-3f, 0x1.46ec680000000p-2f, -0x1.58e9240000000p-2f,
    0x1.121a9c0000000p-2f, -0x1.aef23c0000000p-3f, -0x1.1d42fe0000000p-8f, 0x1.8ce9500000000p-12f,
    -0x1.de04060000000p-8f, -0x1.5636b00000000p-7f, 0x1.cf3ce80000000p-6f, 0x1.ccfd040000000p-6f,
    -0x1.93e6f00000000p-8f, -0x1.9c95e80000000p-11f, -0x1.1b91c80000000p-7f, -0x1.75808c0000000p-7f,
    0x1.fa620a0000000p-6f, 0x1.f993540000000p-6f, -0x1.51253c0000000p-5f, -0x1.4e17380000000p-6f,
    -0x1.aaafd40000000p-7f, 0x1.ac56900000000p-8f, 0x1.5174000000000p-13f, 0x1.91d8400000000p-4f,
    -0x1.4adbd00000000p-9f, -0x1.f0779e0000000p-9f, -0x1.c81dd00000000p-9f, -0x1.1fd4c80000000p-8f,
    0x1.209a400000000p-7f, 0x1.1b13fc0000000p-7f, 0x1.7179ca0000000p-6f, -0x1.50299c0000000p-4f,
    -0x1.03c2ec0000000p-7f, 0x1.51a5280000000p-5f, -0x1.1011500000000p-3f, -0x1.04b6220000000p-3f};

static const float ref_body_b_grad[6] = {
    0x1.6186460000000p-3f, 0x1.6c38d60000000p-1f, 0x1.7ad7b20000000p-5f, -0x1.56ba320000000p-5f,
    0x1.5a3e180000000p-3f, 0x1.1eaa680000000p-3f};

/* ---- a residual block ------------------------------------------------------ */

/* Block.forward: relu(bn2(conv2(relu(bn1(conv1(x))))) + x) */
static dt_tensor *block_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *h = dt_module_forward(ctx, dt_module_find_child(self, "conv1"), x);
    h = dt_relu(ctx, dt_module_forward(ctx, dt_module_find_child(self, "bn1"), h));
    h = dt_module_forward(ctx, dt_module_find_child(self, "conv2"), h);
    h = dt_module_forward(ctx, dt_module_find_child(self, "bn2"), h);
    return dt_relu(ctx, dt_add(ctx, h, x));
}

/* ResNet.forward: fc(flatten(block(stem(x)))) */
static dt_tensor *resnet_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *h = dt_module_forward(ctx, dt_module_find_child(self, "stem"), x);
    h = dt_module_forward(ctx, dt_module_find_child(self, "block"), h);
    return dt_module_forward(ctx, dt_module_find_child(self, "fc"), dt_flatten(ctx, h, 1, -1));
}

static dt_model *resnet(void)
{
    dt_module *blk = dt_nn_custom("Block", 0, NULL, block_forward, NULL);
    dt_nn_add(blk, "conv1", dt_nn_conv2d(8, 8, 3, 1, 1, false));
    dt_nn_add(blk, "bn1", dt_nn_batchnorm2d(8, 1e-5f, 0.1f));
    dt_nn_add(blk, "conv2", dt_nn_conv2d(8, 8, 3, 1, 1, false));
    dt_nn_add(blk, "bn2", dt_nn_batchnorm2d(8, 1e-5f, 0.1f));
    dt_module *root = dt_nn_custom("ResNet", 0, NULL, resnet_forward, NULL);
    dt_nn_add(root, "stem", dt_nn_conv2d(2, 8, 3, 1, 1, true));
    dt_nn_add(root, "block", blk);
    dt_nn_add(root, "fc", dt_nn_linear(8 * 4 * 4, 3, true));
    dt_model *m = NULL;
    if (dt_model_build(root, 0, NULL, &m) < 0 || dt_model_init_torch(m, 5) < 0)
        return NULL;
    return m;
}

static const float *grad_of(const dt_model *m, const char *name)
{
    dt_param_info p;
    if (dt_model_entry(m, (size_t)dt_model_find_entry(m, name), &p) < 0 || !p.tensor || !p.tensor->grad)
        return NULL;
    return p.tensor->grad->data;
}

TEST(residual_block_matches_pytorch)
{
    dt_model *m = resnet();
    ASSERT(m);
    static const char *keys[] = {"stem.weight", "stem.bias", "block.conv1.weight", "block.bn1.weight",
                                 "block.bn1.bias", "block.bn1.running_mean", "block.bn1.running_var",
                                 "block.bn1.num_batches_tracked", "block.conv2.weight", "block.bn2.weight",
                                 "block.bn2.bias", "block.bn2.running_mean", "block.bn2.running_var",
                                 "block.bn2.num_batches_tracked", "fc.weight", "fc.bias"};
    ASSERT_EQ_INT(dt_model_num_entries(m), 16);
    for (size_t i = 0; i < 16; i++) {
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, i, &p));
        ASSERT_STR_EQ(p.name, keys[i]);
    }
    ASSERT_STR_EQ(dt_module_path(dt_model_find_module(m, "block.conv2")), "block.conv2");
    ASSERT_STR_EQ(dt_module_type(dt_model_find_module(m, "block")), "Block");
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    float xs[64];
    for (int i = 0; i < 64; i++)
        xs[i] = (float)((i * 5) % 23 - 11) / 16.0f;
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){2, 2, 4, 4}, xs);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){2}, (int64_t[]){0, 2});
    dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y);
    ASSERT(loss);
    ASSERT_NEAR(dt_tensor_item(loss), ref_res_loss, 1e-6, 1e-5);
    ASSERT_OK(dt_backward(ctx, loss));
    const float *g;
    ASSERT((g = grad_of(m, "stem.weight")));
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(g[i], ref_stem_w_grad[i], 1e-6, 1e-4);
    ASSERT((g = grad_of(m, "block.conv1.weight")));
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(g[i], ref_conv1_w_grad[i], 1e-6, 1e-4);
    ASSERT((g = grad_of(m, "block.bn2.weight")));
    for (int i = 0; i < 8; i++)
        ASSERT_NEAR(g[i], ref_bn2_w_grad[i], 1e-6, 1e-4);
    ASSERT((g = grad_of(m, "fc.bias")));
    for (int i = 0; i < 3; i++)
        ASSERT_NEAR(g[i], ref_fc_b_grad[i], 1e-6, 1e-4);
    dt_param_info rm;
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "block.bn1.running_mean"), &rm));
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(((float *)rm.tensor->data)[i], ref_bn1_rm[i], 1e-7, 1e-4);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* ---- weight tying ------------------------------------------------------------- */

/* Tied.forward: lm_head(gelu(body(wte(idx)))) */
static dt_tensor *tied_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    (void)ud;
    dt_tensor *h = dt_module_forward(ctx, dt_module_find_child(self, "wte"), idx);
    h = dt_gelu(ctx, dt_module_forward(ctx, dt_module_find_child(self, "body"), h));
    return dt_module_forward(ctx, dt_module_find_child(self, "lm_head"), h);
}

static dt_module *tied_net(void)
{
    dt_module *root = dt_nn_custom("Tied", 0, NULL, tied_forward, NULL);
    dt_module *wte = dt_nn_embedding(10, 6), *head = dt_nn_linear(6, 10, false);
    dt_nn_add(root, "wte", wte);
    dt_nn_add(root, "body", dt_nn_linear(6, 6, true));
    dt_nn_add(root, "lm_head", head);
    if (dt_module_tie(head, "weight", wte, "weight") < 0) {
        dt_module_free(root);
        return NULL;
    }
    return root;
}

TEST(tied_weights_match_pytorch)
{
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(tied_net(), 0, NULL, &m));
    ASSERT_OK(dt_model_init_torch(m, 3));
    /* state_dict keys: both names; parameters: the storage once */
    static const char *keys[] = {"wte.weight", "body.weight", "body.bias", "lm_head.weight"};
    ASSERT_EQ_INT(dt_model_num_entries(m), 4);
    for (size_t i = 0; i < 4; i++) {
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, i, &p));
        ASSERT_STR_EQ(p.name, keys[i]);
        ASSERT_EQ_INT(p.tied_to, i == 3 ? 0 : -1);
    }
    ASSERT_EQ_INT(dt_model_num_params(m), 3);
    ASSERT_EQ_INT(dt_model_param_count(m), 60 + 36 + 6);
    dt_param_info w, h;
    ASSERT_OK(dt_model_entry(m, 0, &w));
    ASSERT_OK(dt_model_entry(m, 3, &h));
    ASSERT(w.tensor == h.tensor && w.offset == h.offset);
    ASSERT(dt_module_param(dt_model_find_module(m, "lm_head"), 0) == w.tensor);
    /* the flat holds the storage once: wte 64 + body.weight 48 + body.bias 16 */
    ASSERT_EQ_INT(dt_model_flat(m, DT_FLAT_PARAMS, DT_F32)->used, 64 + 48 + 16);
    dt_optim_segment segs[8];
    size_t n;
    ASSERT_OK(dt_optim_segments_from_model(m, DT_F32, false, segs, 8, &n));
    ASSERT_EQ_INT(n, 3);
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *idx = dt_tensor_from(ctx, DT_I64, 2, (int64_t[]){2, 3}, (int64_t[]){1, 4, 9, 0, 4, 7});
    dt_tensor *tgt = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){6}, (int64_t[]){4, 9, 2, 3, 3, 0});
    dt_tensor *logits = dt_model_forward(ctx, m, idx);
    dt_tensor *loss = dt_cross_entropy(ctx, dt_reshape(ctx, logits, 2, (int64_t[]){6, 10}), tgt);
    ASSERT(loss);
    ASSERT_NEAR(dt_tensor_item(loss), ref_tied_loss, 1e-6, 1e-5);
    ASSERT_OK(dt_backward(ctx, loss));
    /* the embedding's gradient is the sum of both uses */
    const float *g = grad_of(m, "wte.weight");
    ASSERT(g && g == grad_of(m, "lm_head.weight"));
    for (int i = 0; i < 60; i++)
        ASSERT_NEAR(g[i], ref_wte_grad[i], 1e-6, 1e-4);
    g = grad_of(m, "body.bias");
    for (int i = 0; i < 6; i++)
        ASSERT_NEAR(g[i], ref_body_b_grad[i], 1e-6, 1e-4);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

TEST(tie_errors)
{
    dt_module *a = dt_nn_linear(4, 3, true), *b = dt_nn_linear(3, 4, true), *c = dt_nn_linear(4, 3, true);
    ASSERT_STATUS(dt_module_tie(a, "weight", b, "weight"), DT_ERR_SHAPE); /* [3,4] vs [4,3] */
    ASSERT_STATUS(dt_module_tie(a, "nope", c, "weight"), DT_ERR_NOT_FOUND);
    ASSERT_STATUS(dt_module_tie(a, "weight", a, "weight"), DT_ERR_SHAPE); /* itself */
    ASSERT_STATUS(dt_module_tie(NULL, "weight", c, "weight"), DT_ERR_NULL);
    ASSERT_OK(dt_module_tie(a, "weight", c, "weight"));
    ASSERT_STATUS(dt_module_tie(c, "weight", a, "weight"), DT_ERR_INVALID_ARG); /* a cycle */
    dt_module *bn = dt_nn_batchnorm2d(3, 1e-5f, 0.1f), *bn2 = dt_nn_batchnorm2d(3, 1e-5f, 0.1f);
    ASSERT_STATUS(dt_module_tie(bn, "running_mean", bn2, "running_mean"), DT_ERR_SHAPE); /* buffers */
    /* the source is not in the model that is built */
    dt_model *m = NULL;
    ASSERT_STATUS(dt_model_build(a, 0, NULL, &m), DT_ERR_INVALID_ARG);
    ASSERT(m == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "weight");
    dt_module_free(b);
    dt_module_free(c);
    dt_module_free(bn);
    dt_module_free(bn2);
    /* a chain: c -> b' -> a' resolves to the last */
    dt_module *root = dt_nn_seq(0, NULL);
    dt_module *l0 = dt_nn_linear(4, 3, true), *l1 = dt_nn_linear(4, 3, true), *l2 = dt_nn_linear(4, 3, true);
    dt_nn_add(root, "a", l0);
    dt_nn_add(root, "b", l1);
    dt_nn_add(root, "c", l2);
    ASSERT_OK(dt_module_tie(l2, "weight", l1, "weight"));
    ASSERT_OK(dt_module_tie(l1, "weight", l0, "weight"));
    ASSERT_OK(dt_model_build(root, 1, NULL, &m));
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "c.weight"), &p));
    ASSERT_EQ_INT(p.tied_to, 0);
    ASSERT_EQ_INT(dt_model_num_params(m), 4); /* a.weight, a.bias, b.bias, c.bias */
    /* the model exists and can be torch-initialised and built meta */
    ASSERT_OK(dt_model_init_torch(m, 1));
    dt_model_free(m);
}

/* ---- containers -------------------------------------------------------------- */

TEST(container_errors)
{
    dt_module *lin = dt_nn_linear(2, 2, true);
    dt_module *r = dt_nn_relu();
    ASSERT_STATUS(dt_nn_add(lin, "x", r), DT_ERR_STATE); /* a Linear has no children (r is freed) */
    dt_module *c = dt_nn_custom("C", 0, NULL, block_forward, NULL);
    ASSERT_OK(dt_nn_add(c, "conv1", dt_nn_relu()));
    ASSERT_STATUS(dt_nn_add(c, "conv1", dt_nn_relu()), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_nn_add(c, NULL, NULL), DT_ERR_NULL);
    ASSERT(dt_module_find_child(c, "conv1") == dt_module_child(c, 0));
    ASSERT(dt_module_find_child(c, "nope") == NULL);
    ASSERT(dt_module_find_child(NULL, "conv1") == NULL);
    dt_module_free(c);
    dt_module_free(lin);
    /* NULL arguments give DT_ERR_NULL, a bad count DT_ERR_INVALID_ARG */
    dt_error_clear();
    ASSERT(dt_nn_custom(NULL, 0, NULL, block_forward, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT(dt_nn_custom("C", 0, NULL, NULL, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT(dt_nn_custom("C", 1, NULL, block_forward, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT(dt_nn_custom("C", -1, NULL, block_forward, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    dt_model *m = (dt_model *)&m;
    /* a NULL root keeps the error of the constructor that failed (above) ... */
    ASSERT_STATUS(dt_model_build(NULL, 0, NULL, &m), DT_ERR_INVALID_ARG);
    ASSERT(m == NULL);
    dt_error_clear(); /* ... or says NULL */
    ASSERT_STATUS(dt_model_build(NULL, 0, NULL, &m), DT_ERR_NULL);
    ASSERT(m == NULL);
    ASSERT_STATUS(dt_model_build(dt_nn_relu(), 0, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_create("convnet", 0, NULL, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_ctx_init(NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_module_tie(NULL, NULL, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_set_grads(NULL, DT_F32, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_add_grad_ready_hook(NULL, NULL, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_module_add_forward_pre_hook(NULL, NULL, NULL, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_init_range(NULL, DT_INIT_PHILOX, 0, NULL), DT_ERR_NULL);
}

/* ---- hooks by id ---------------------------------------------------------------- */

typedef struct {
    int calls[64];
} hook_log;

static dt_status count_pre(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx, (void)m, (void)x;
    int *c = ud;
    (*c)++;
    return DT_OK;
}

static dt_status count_ready(dt_model *m, size_t index, const dt_param_info *p, void *ud)
{
    (void)m, (void)index, (void)p;
    int *c = ud;
    (*c)++;
    return DT_OK;
}

TEST(hooks_removed_by_id)
{
    dt_model *m = NULL;
    dt_module *seq = dt_nn_seq(1, (dt_module *[]){dt_nn_linear(3, 2, true)});
    ASSERT_OK(dt_model_build(seq, 0, NULL, &m));
    dt_module *lin = dt_model_find_module(m, "0");
    /* more hooks than the old cap of 4, each with its own counter */
    hook_log lg = {{0}};
    dt_hook_id ids[40];
    for (int i = 0; i < 40; i++) {
        ASSERT_OK(dt_module_add_forward_pre_hook(lin, count_pre, &lg.calls[i], &ids[i]));
        ASSERT(ids[i] != 0);
        for (int j = 0; j < i; j++)
            ASSERT(ids[j] != ids[i]);
    }
    int ready = 0;
    dt_hook_id rid;
    ASSERT_OK(dt_model_add_grad_ready_hook(m, count_ready, &ready, &rid));
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *x = dt_tensor_zeros(ctx, DT_F32, 2, (int64_t[]){1, 3});
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_model_forward(ctx, m, x))));
    dt_ctx_reset(ctx);
    for (int i = 0; i < 40; i++)
        ASSERT_EQ_INT(lg.calls[i], 1);
    ASSERT_EQ_INT(ready, 2); /* weight and bias */
    /* remove every other hook and the grad-ready hook */
    for (int i = 0; i < 40; i += 2)
        ASSERT_OK(dt_module_remove_hook(lin, ids[i]));
    ASSERT_STATUS(dt_module_remove_hook(lin, ids[0]), DT_ERR_NOT_FOUND); /* twice */
    ASSERT_STATUS(dt_module_remove_hook(dt_model_root(m), ids[1]), DT_ERR_NOT_FOUND); /* another module's */
    ASSERT_STATUS(dt_module_remove_hook(NULL, ids[1]), DT_ERR_NULL);
    ASSERT_OK(dt_model_remove_hook(m, rid));
    ASSERT_STATUS(dt_model_remove_hook(m, rid), DT_ERR_NOT_FOUND);
    x = dt_tensor_zeros(ctx, DT_F32, 2, (int64_t[]){1, 3});
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_model_forward(ctx, m, x))));
    for (int i = 0; i < 40; i++)
        ASSERT_EQ_INT(lg.calls[i], i % 2 ? 2 : 1);
    ASSERT_EQ_INT(ready, 2);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* dt_module_forward_bn_relu_pool: a BatchNorm2d and a MaxPool2d(2) on
 * channel-blocked activations run as one op, the same bits as the modules'
 * forwards then ReLU; a pooling of other windows, or a hook on either
 * module, runs the modules (the hook fires); batch norm counts its batch
 * either way. */
static dt_status count_post(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)ctx, (void)m, (void)x, (void)y;
    (*(int *)ud)++;
    return DT_OK;
}

/* conv then bn and pool (child 2 or 3) through the helper or the modules:
 * the values and the conv weight's gradient */
static void bn_pool_run(dt_model *m, int pool, bool helper, float *out, float *gw)
{
    dt_module *root = dt_model_root(m), *conv = dt_module_child(root, 0), *bn = dt_module_child(root, 1);
    dt_module *pl = dt_module_child(root, pool);
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_ctx_set_blocked(ctx, true);
    dt_tensor *x = dt_tensor_empty(ctx, DT_F32, 4, (int64_t[]){2, 1, 8, 8});
    for (int i = 0; i < 128; i++)
        ((float *)x->data)[i] = (float)((i * 37) % 23) / 11.0f - 1.0f;
    dt_tensor *w = dt_module_param(conv, 0);
    dt_ag_zero_grad(w);
    dt_tensor *h = dt_module_forward(ctx, conv, x);
    dt_tensor *y = helper ? dt_module_forward_bn_relu_pool(ctx, bn, pl, h)
                          : dt_relu(ctx, dt_module_forward(ctx, pl, dt_module_forward(ctx, bn, h)));
    ASSERT(y);
    ASSERT_OK(dt_tensor_read(y, out));
    ASSERT_OK(dt_backward(ctx, dt_sum(ctx, dt_mul(ctx, y, y))));
    memcpy(gw, w->grad->data, dt_tensor_nbytes(w));
    dt_ctx_free(ctx);
}

TEST(bn_relu_pool_helper)
{
    dt_module *c[4] = {dt_nn_conv2d(1, 16, 3, 1, 1, true), dt_nn_batchnorm2d(16, 1e-5f, 0.1f), dt_nn_maxpool2d(2, 2, 0),
                       dt_nn_maxpool2d(3, 2, 1)};
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(dt_nn_seq(4, c), 3, NULL, &m));
    dt_module *bn = dt_module_child(dt_model_root(m), 1);
    const int64_t *count = dt_module_param(bn, 4)->data;
    float a[2 * 16 * 16], b[2 * 16 * 16], ga[144], gb[144]; /* 16 channels: blocked in nChw8c and 16c */
    for (int pool = 2; pool <= 3; pool++) {
        const int64_t before = *count;
        bn_pool_run(m, pool, false, a, ga);
        bn_pool_run(m, pool, true, b, gb);
        ASSERT_EQ_INT((long long)(*count - before), 2);
        if (memcmp(a, b, sizeof a) || memcmp(ga, gb, sizeof ga))
            TEST_FAIL_("MaxPool2d(%d): the helper's values or gradient differ from the modules'", pool == 2 ? 2 : 3);
    }
    int calls = 0;
    ASSERT_OK(dt_module_add_forward_post_hook(bn, count_post, &calls, NULL));
    bn_pool_run(m, 2, true, b, gb);
    ASSERT_EQ_INT(calls, 1);
    bn_pool_run(m, 2, false, a, ga);
    if (memcmp(a, b, sizeof a) || memcmp(ga, gb, sizeof ga))
        TEST_FAIL_("a hooked batch norm: the helper's values or gradient differ from the modules'");
    dt_model_free(m);
}

int main(void)
{
    RUN(residual_block_matches_pytorch);
    RUN(bn_relu_pool_helper);
    RUN(tied_weights_match_pytorch);
    RUN(tie_errors);
    RUN(container_errors);
    RUN(hooks_removed_by_id);
    return TEST_REPORT();
}
