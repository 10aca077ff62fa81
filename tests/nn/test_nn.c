/* Module and model tests: names (PyTorch state_dict keys), the flat layout,
 * init, forward values (the whole ConvNet against PyTorch), hooks of every
 * kind, the replaceable gradient buffer, determinism, bad input.
 *
 * ConvNet reference values: tests/nn/gen_ref.py (PyTorch 1.13.1, Debian, CPU,
 * /usr/bin/python3 gen_ref.py): every parameter k (in named_parameters order)
 * filled with ((i*7 + k*3) % 17 - 8) / 64, input x[i] = ((i*5) % 23 - 11) / 16
 * of shape [2,1,28,28], labels [3, 7], train mode, cross_entropy, backward. */
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "test.h"
#include "model_util.h"

#include <string.h>

static const char *const torch_keys[] = {
    "layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.bias", "layer1.1.running_mean",
    "layer1.1.running_var", "layer1.1.num_batches_tracked", "layer2.0.weight", "layer2.0.bias",
    "layer2.1.weight", "layer2.1.bias", "layer2.1.running_mean", "layer2.1.running_var",
    "layer2.1.num_batches_tracked", "fc.weight", "fc.bias"};
static const float ref_logits0[10] = {-0x1.384e84p-5f, -0x1.324278p-4f, 0x1.8d038p-3f, -0x1.259314p-4f,
                                      -0x1.a3b26p-5f,  0x1.9b0d2ep-6f,  -0x1.5ecedep-2f, 0x1.6060eep-4f,
                                      0x1.0d30bcp-3f,  -0x1.900c5p-3f};
static const float ref_loss = 0x1.264eep+1f;
static const float ref_fc_bias_grad[10] = {0x1.95ab4ep-4f, 0x1.635e3p-4f,   0x1.d5ccdcp-4f, -0x1.95c5fap-2f,
                                           0x1.6d1a58p-4f, 0x1.a1876p-4f,   0x1.541f2cp-4f, -0x1.90cad2p-2f,
                                           0x1.0003bcp-3f, 0x1.68a47p-4f};
static const float ref_l1w_grad[4] = {0x1.8ac92ap-6f, -0x1.59c962p-7f, 0x1.3128ccp-5f, -0x1.2a082ap-5f};
static const float ref_l1_rmean[2] = {-0x1.007508p-7f, 0x1.9bb4c4p-9f};
static const float ref_l1_rvar[2] = {0x1.ce2a24p-1f, 0x1.cdad9ep-1f};

TEST(convnet_names_and_layout)
{
    dt_model *m = t_create("convnet", 1, NULL);
    ASSERT(m);
    ASSERT_EQ_INT(dt_model_num_entries(m), 16);
    ASSERT_EQ_INT(dt_model_num_params(m), 10);
    /* 16*25+16 + 16+16 + 32*16*25+32 + 32+32 + 10*1568+10 */
    ASSERT_EQ_INT(dt_model_param_count(m), 29034);
    size_t prev_end = 0;
    for (size_t i = 0; i < 16; i++) {
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, i, &p));
        ASSERT_STR_EQ(p.name, torch_keys[i]);
        ASSERT_STR_EQ(p.tensor->name, torch_keys[i]);
        ASSERT_EQ_INT((p.offset * dt_dtype_size(p.dtype)) % 64, 0);
        if (!p.is_buffer) {
            ASSERT(p.offset >= prev_end);
            prev_end = p.offset + p.numel;
            ASSERT(p.tensor->data == t_params(m) + p.offset);
            ASSERT(p.tensor->grad && p.tensor->grad->data == t_grads(m) + p.offset);
        }
    }
    ASSERT(prev_end <= t_numel(m));
    ASSERT_EQ_INT(((uintptr_t)t_params(m)) % 64, 0);
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, 6, &p));
    ASSERT_EQ_INT(p.dtype, DT_I64);
    ASSERT(p.is_buffer);
    ASSERT_OK(dt_model_entry(m, 7, &p));
    ASSERT_EQ_INT(p.ndim, 4);
    ASSERT_EQ_INT(p.shape[0], 32);
    ASSERT_EQ_INT(p.shape[1], 16);
    ASSERT_EQ_INT(p.shape[3], 5);
    ASSERT_EQ_INT(dt_model_find_entry(m, "fc.bias"), 15);
    ASSERT_EQ_INT(dt_model_find_entry(m, "fc.nope"), -1);
    dt_module *conv = dt_model_find_module(m, "layer2.0");
    ASSERT(conv);
    ASSERT_STR_EQ(dt_module_type(conv), "Conv2d");
    ASSERT_STR_EQ(dt_module_path(dt_module_child(dt_model_find_module(m, "layer1"), 1)), "layer1.1");
    dt_model_free(m);
}

TEST(init_pytorch_defaults)
{
    dt_model *a = t_create("convnet", 7, NULL), *b = t_create("convnet", 7, NULL),
             *c = t_create("convnet", 8, NULL);
    ASSERT(a && b && c);
    size_t n = t_numel(a);
    ASSERT_EQ_INT(memcmp(t_params(a), t_params(b), n * 4), 0);
    ASSERT(memcmp(t_params(a), t_params(c), n * 4) != 0);
    dt_param_info w, bias, g, rv;
    ASSERT_OK(dt_model_entry(a, 14, &w));    /* fc.weight, fan_in 1568 */
    ASSERT_OK(dt_model_entry(a, 15, &bias)); /* fc.bias, same bound */
    ASSERT_OK(dt_model_entry(a, 2, &g));     /* layer1.1.weight = 1 */
    ASSERT_OK(dt_model_entry(a, 5, &rv));    /* running_var = 1 */
    const float bound = 1.0f / sqrtf(1568.0f);
    const float *x = w.tensor->data;
    double s2 = 0;
    float mx = 0;
    for (size_t i = 0; i < w.numel; i++) {
        ASSERT(fabsf(x[i]) <= bound);
        mx = fmaxf(mx, fabsf(x[i]));
        s2 += (double)x[i] * x[i];
    }
    /* U(-b, b): variance b^2/3; 15680 samples */
    ASSERT_NEAR(s2 / (double)w.numel, bound * bound / 3.0, 0, 0.05);
    ASSERT(mx > 0.99f * bound);
    for (size_t i = 0; i < bias.numel; i++)
        ASSERT(fabsf(((float *)bias.tensor->data)[i]) <= bound);
    ASSERT_NEAR(((float *)g.tensor->data)[3], 1.0, 0, 0);
    ASSERT_NEAR(((float *)rv.tensor->data)[3], 1.0, 0, 0);
    /* conv1: fan_in = 1*5*5 -> bound 0.2 */
    dt_param_info c1;
    ASSERT_OK(dt_model_entry(a, 0, &c1));
    float m1 = 0;
    for (size_t i = 0; i < c1.numel; i++)
        m1 = fmaxf(m1, fabsf(((float *)c1.tensor->data)[i]));
    ASSERT(m1 <= 0.2f && m1 > 0.18f);
    /* embedding N(0,1) */
    dt_model *e = t_build(dt_nn_embedding(100, 50), 3);
    ASSERT(e);
    dt_param_info ew;
    ASSERT_OK(dt_model_entry(e, 0, &ew));
    ASSERT_STR_EQ(ew.name, "weight");
    double mean = 0, var = 0;
    for (size_t i = 0; i < ew.numel; i++)
        mean += ((float *)ew.tensor->data)[i];
    mean /= 5000;
    for (size_t i = 0; i < ew.numel; i++)
        var += pow(((float *)ew.tensor->data)[i] - mean, 2);
    var /= 5000;
    ASSERT_NEAR(mean, 0, 0.05, 0);
    ASSERT_NEAR(var, 1, 0.08, 0);
    dt_model_free(a);
    dt_model_free(b);
    dt_model_free(c);
    dt_model_free(e);
}

static void fill_convnet_like_torch(dt_model *m)
{
    int k = 0;
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info p;
        dt_model_entry(m, e, &p);
        if (p.is_buffer)
            continue;
        float *d = p.tensor->data;
        for (size_t i = 0; i < p.numel; i++)
            d[i] = (float)(((long)(i * 7 + (size_t)k * 3) % 17 - 8) / 64.0);
        k++;
    }
}

TEST(convnet_matches_pytorch)
{
    dt_model *m = t_create("convnet", 1, NULL);
    ASSERT(m);
    fill_convnet_like_torch(m);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float xs[2 * 784];
    for (int i = 0; i < 2 * 784; i++)
        xs[i] = (float)(((i * 5) % 23 - 11) / 16.0);
    int64_t ys[2] = {3, 7};
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){2, 1, 28, 28}, xs);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){2}, ys);
    dt_tensor *out = dt_model_forward(ctx, m, x);
    ASSERT(out);
    ASSERT_EQ_INT(out->ndim, 2);
    ASSERT_EQ_INT(out->shape[1], 10);
    for (int i = 0; i < 10; i++)
        ASSERT_NEAR(dt_tensor_get(out, i), ref_logits0[i], 2e-5, 1e-4);
    dt_tensor *loss = dt_cross_entropy(ctx, out, y);
    ASSERT(loss);
    ASSERT_NEAR(dt_tensor_item(loss), ref_loss, 0, 1e-5);
    dt_model_zero_grad(m);
    ASSERT_OK(dt_backward(ctx, loss));
    dt_param_info fb, w1, rm, rv, nbt;
    dt_model_entry(m, 15, &fb);
    dt_model_entry(m, 0, &w1);
    dt_model_entry(m, 4, &rm);
    dt_model_entry(m, 5, &rv);
    dt_model_entry(m, 6, &nbt);
    for (int i = 0; i < 10; i++)
        ASSERT_NEAR(t_grads(m)[fb.offset + i], ref_fc_bias_grad[i], 1e-6, 1e-4);
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(t_grads(m)[w1.offset + i], ref_l1w_grad[i], 1e-6, 1e-3);
    for (int i = 0; i < 2; i++) {
        ASSERT_NEAR(((float *)rm.tensor->data)[i], ref_l1_rmean[i], 1e-7, 1e-4);
        ASSERT_NEAR(((float *)rv.tensor->data)[i], ref_l1_rvar[i], 1e-7, 1e-4);
    }
    ASSERT_EQ_INT(((int64_t *)nbt.tensor->data)[0], 1);
    /* eval mode: running stats are used and not updated */
    dt_ctx_reset(ctx);
    dt_model_train(m, false);
    ASSERT(!dt_module_is_training(dt_model_find_module(m, "layer1.1")));
    x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){2, 1, 28, 28}, xs);
    float rm0 = ((float *)rm.tensor->data)[0];
    ASSERT(dt_model_forward(ctx, m, x));
    ASSERT_NEAR(((float *)rm.tensor->data)[0], rm0, 0, 0);
    ASSERT_EQ_INT(((int64_t *)nbt.tensor->data)[0], 1);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* Small modules with weights set by hand. */
TEST(module_forward_values)
{
    dt_module *seq = dt_nn_seq(2, (dt_module *[]){dt_nn_linear(3, 2, true), dt_nn_relu()});
    dt_model *m = t_build(seq, 0);
    ASSERT(m);
    dt_param_info w, b;
    ASSERT_OK(dt_model_entry(m, 0, &w));
    ASSERT_OK(dt_model_entry(m, 1, &b));
    ASSERT_STR_EQ(w.name, "0.weight");
    ASSERT_STR_EQ(b.name, "0.bias");
    float wv[6] = {1, 2, 3, -1, -2, -3}, bv[2] = {0.5f, 1};
    memcpy(w.tensor->data, wv, sizeof wv);
    memcpy(b.tensor->data, bv, sizeof bv);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    /* x = [1, 1, 1]: [1+2+3+0.5, -6+1] = [6.5, -5] -> relu [6.5, 0] */
    dt_tensor *y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){1, 3}, (float[]){1, 1, 1}));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 0), 6.5, 0, 0);
    ASSERT_NEAR(dt_tensor_get(y, 1), 0, 0, 0);
    dt_model_free(m);

    /* LayerNorm(4) on [1,2,3,4]: mean 2.5, var 1.25 -> (x-2.5)/sqrt(1.25+1e-5) */
    m = t_build(dt_nn_layernorm(4, 1e-5f), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 2, (int64_t[]){1, 4}, (float[]){1, 2, 3, 4}));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 0), -1.5 / sqrt(1.25 + 1e-5), 1e-6, 0);
    ASSERT_NEAR(dt_tensor_get(y, 3), 1.5 / sqrt(1.25 + 1e-5), 1e-6, 0);
    dt_model_free(m);

    /* pools on a 1x1x2x2 image [1,2,3,4]: max 4, avg 2.5; flatten [1,1,2,2] -> [1,4] */
    float img[4] = {1, 2, 3, 4};
    m = t_build(dt_nn_seq(1, (dt_module *[]){dt_nn_maxpool2d(2, 0, 0)}), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){1, 1, 2, 2}, img));
    ASSERT(y && dt_tensor_numel(y) == 1);
    ASSERT_NEAR(dt_tensor_get(y, 0), 4, 0, 0);
    dt_model_free(m);
    m = t_build(dt_nn_avgpool2d(2, 2, 0), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){1, 1, 2, 2}, img));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 0), 2.5, 0, 0);
    dt_model_free(m);
    m = t_build(dt_nn_flatten(1, -1), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){1, 1, 2, 2}, img));
    ASSERT(y && y->ndim == 2 && y->shape[1] == 4);
    dt_model_free(m);

    /* GELU(1) = 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447461 */
    m = t_build(dt_nn_gelu(), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){1}, (float[]){1}));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 0), 0.8413447461, 1e-6, 0);
    dt_model_free(m);

    /* Dropout(0.5): train zeroes some and doubles the rest; eval is identity */
    m = t_build(dt_nn_dropout(0.5f), 0);
    float ones[1000];
    for (int i = 0; i < 1000; i++)
        ones[i] = 1;
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){1000}, ones));
    ASSERT(y);
    int zeros = 0;
    for (int i = 0; i < 1000; i++) {
        double v = dt_tensor_get(y, i);
        ASSERT(v == 0 || v == 2);
        zeros += v == 0;
    }
    ASSERT(zeros > 400 && zeros < 600);
    dt_model_train(m, false);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){1000}, ones));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 17), 1, 0, 0);
    dt_model_free(m);

    /* Embedding: rows picked by index */
    m = t_build(dt_nn_embedding(5, 3), 0);
    dt_param_info ew;
    dt_model_entry(m, 0, &ew);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){2}, (int64_t[]){4, 1}));
    ASSERT(y && y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 3);
    ASSERT_NEAR(dt_tensor_get(y, 0), ((float *)ew.tensor->data)[12], 0, 0);
    dt_model_free(m);

    /* BatchNorm2d train on one channel [0, 2] x 2 images: mean 1, biased var 1
     * -> y = [-1, 1]/sqrt(1+1e-5); running_mean = 0.1, running_var = 0.9 + 0.1*2 (unbiased var 2) */
    m = t_build(dt_nn_batchnorm2d(1, 1e-5f, 0.1f), 0);
    y = dt_model_forward(ctx, m, dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){2, 1, 1, 1}, (float[]){0, 2}));
    ASSERT(y);
    ASSERT_NEAR(dt_tensor_get(y, 1), 1 / sqrt(1 + 1e-5), 1e-6, 0);
    dt_param_info rm, rv;
    dt_model_entry(m, 2, &rm);
    dt_model_entry(m, 3, &rv);
    ASSERT_STR_EQ(rm.name, "running_mean");
    ASSERT_NEAR(((float *)rm.tensor->data)[0], 0.1, 1e-7, 0);
    ASSERT_NEAR(((float *)rv.tensor->data)[0], 1.1, 1e-6, 0);
    dt_model_free(m);

    /* losses: CE of uniform logits over 4 classes = log 4; MSE of [1,2] vs [0,0] = 2.5 */
    dt_module *ce = dt_nn_cross_entropy_loss(), *mse = dt_nn_mse_loss();
    dt_tensor *l = dt_module_loss(ctx, ce, dt_tensor_zeros(ctx, DT_F32, 2, (int64_t[]){2, 4}),
                                  dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){2}, (int64_t[]){0, 3}));
    ASSERT(l);
    ASSERT_NEAR(dt_tensor_item(l), log(4.0), 1e-6, 0);
    l = dt_module_loss(ctx, mse, dt_tensor_from(ctx, DT_F32, 1, (int64_t[]){2}, (float[]){1, 2}),
                       dt_tensor_zeros(ctx, DT_F32, 1, (int64_t[]){2}));
    ASSERT(l);
    ASSERT_NEAR(dt_tensor_item(l), 2.5, 1e-6, 0);
    dt_module_free(ce);
    dt_module_free(mse);
    dt_ctx_free(ctx);
}

/* ---- hooks ---------------------------------------------------------------------- */

typedef struct {
    char log[64][32];
    int n;
} event_log;

static void log_event(event_log *l, const char *what, const char *path)
{
    if (l->n < 64)
        snprintf(l->log[l->n++], 32, "%s %s", what, path);
}
static dt_status on_fwd_pre(dt_ctx *c, dt_module *m, dt_tensor *x, void *ud)
{
    (void)c, (void)x;
    log_event(ud, "fpre", dt_module_path(m));
    return DT_OK;
}
static dt_status on_fwd_post(dt_ctx *c, dt_module *m, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)c, (void)x, (void)y;
    log_event(ud, "fpost", dt_module_path(m));
    return DT_OK;
}
static dt_status on_bwd_pre(dt_ctx *c, dt_module *m, void *ud)
{
    (void)c;
    log_event(ud, "bpre", dt_module_path(m));
    return DT_OK;
}
static dt_status on_bwd_post(dt_ctx *c, dt_module *m, void *ud)
{
    (void)c;
    log_event(ud, "bpost", dt_module_path(m));
    return DT_OK;
}

typedef struct {
    event_log *log;
    float grad_at_ready[16]; /* first grad element of each param when its hook fired */
    int fired[16];
} ready_state;

static dt_status on_ready(dt_model *m, size_t index, const dt_param_info *p, void *ud)
{
    ready_state *s = ud;
    s->fired[index]++;
    s->grad_at_ready[index] = t_grads(m)[p->offset];
    log_event(s->log, "ready", p->name);
    return DT_OK;
}

static dt_status failing_hook(dt_ctx *c, dt_module *m, dt_tensor *x, void *ud)
{
    (void)c, (void)m, (void)x, (void)ud;
    return dt_error(DT_ERR_CANCELED, "hook says no");
}

static int find_event(const event_log *l, const char *e)
{
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->log[i], e))
            return i;
    return -1;
}

TEST(hooks_all_kinds)
{
    dt_model *m = t_create("convnet", 3, NULL);
    ASSERT(m);
    event_log lg = {0};
    ready_state rs = {.log = &lg};
    const char *watch[] = {"layer1", "layer2.0", "fc"};
    for (int i = 0; i < 3; i++) {
        dt_module *mod = dt_model_find_module(m, watch[i]);
        ASSERT(mod);
        ASSERT_OK(dt_module_add_forward_pre_hook(mod, on_fwd_pre, &lg, NULL));
        ASSERT_OK(dt_module_add_forward_post_hook(mod, on_fwd_post, &lg, NULL));
        ASSERT_OK(dt_module_add_backward_pre_hook(mod, on_bwd_pre, &lg, NULL));
        ASSERT_OK(dt_module_add_backward_post_hook(mod, on_bwd_post, &lg, NULL));
    }
    ASSERT_OK(dt_model_add_grad_ready_hook(m, on_ready, &rs, NULL));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float xs[4 * 784];
    for (int i = 0; i < 4 * 784; i++)
        xs[i] = (float)((i % 13) - 6) / 8.0f;
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){4, 1, 28, 28}, xs);
    dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){4}, (int64_t[]){1, 2, 3, 4});
    dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y);
    ASSERT(loss);
    /* forward order: layer1 pre/post, layer2.0 pre/post, fc pre/post */
    ASSERT_STR_EQ(lg.log[0], "fpre layer1");
    ASSERT_STR_EQ(lg.log[1], "fpost layer1");
    ASSERT_STR_EQ(lg.log[2], "fpre layer2.0");
    ASSERT_STR_EQ(lg.log[3], "fpost layer2.0");
    ASSERT_STR_EQ(lg.log[4], "fpre fc");
    ASSERT_STR_EQ(lg.log[5], "fpost fc");
    ASSERT_EQ_INT(lg.n, 6);
    dt_model_zero_grad(m);
    ASSERT_OK(dt_backward(ctx, loss));
    /* backward: fc's pre before its params are ready, its post after; the
     * layers in reverse order; every parameter ready exactly once */
    int bpre_fc = find_event(&lg, "bpre fc"), bpost_fc = find_event(&lg, "bpost fc");
    int r_fcw = find_event(&lg, "ready fc.weight"), r_fcb = find_event(&lg, "ready fc.bias");
    int bpre_l2 = find_event(&lg, "bpre layer2.0"), bpost_l2 = find_event(&lg, "bpost layer2.0");
    int r_l2w = find_event(&lg, "ready layer2.0.weight");
    int bpre_l1 = find_event(&lg, "bpre layer1"), bpost_l1 = find_event(&lg, "bpost layer1");
    int r_l1w = find_event(&lg, "ready layer1.0.weight"), r_bn1 = find_event(&lg, "ready layer1.1.bias");
    ASSERT(bpre_fc > 5 && r_fcw > bpre_fc && r_fcb > bpre_fc && bpost_fc > r_fcw && bpost_fc > r_fcb);
    ASSERT(bpre_l2 > bpost_fc && r_l2w > bpre_l2 && bpost_l2 > r_l2w);
    ASSERT(bpre_l1 > bpost_l2 && r_l1w > bpre_l1 && r_bn1 > bpre_l1 && bpost_l1 > r_l1w);
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        dt_model_entry(m, i, &p);
        ASSERT_EQ_INT(rs.fired[i], p.is_buffer ? 0 : 1);
        /* the gradient was final when the hook fired */
        if (!p.is_buffer)
            ASSERT_NEAR(rs.grad_at_ready[i], t_grads(m)[p.offset], 0, 0);
    }
    ASSERT(t_grads(m)[0] != 0);
    /* a failing forward hook stops the forward with its message */
    dt_ctx_reset(ctx);
    dt_module_clear_hooks(dt_model_find_module(m, "layer1"));
    ASSERT_OK(dt_module_add_forward_pre_hook(dt_model_find_module(m, "fc"), failing_hook, NULL, NULL));
    x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){4, 1, 28, 28}, xs);
    ASSERT(dt_model_forward(ctx, m, x) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "hook says no");
    ASSERT_STR_CONTAINS(dt_last_error(), "fc");
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* A Sequential's ReLU followed by MaxPool2d runs as pool-then-ReLU when
 * neither module has hooks; a hook on the ReLU keeps the written order.
 * Both must give the same output and input gradient, bit for bit: windows
 * with a positive maximum, all-negative windows, ties at 0 and positive
 * ties, and a NaN (propagated). */
TEST(relu_maxpool_reordered_exactly)
{
    /* the ConvNet's forward (models/convnet.c) runs pool then ReLU: the two
     * orders give the same values and input gradients, bit for bit */
    dt_module *seq = dt_nn_seq(0, NULL), *swapped = dt_nn_seq(0, NULL);
    ASSERT_OK(dt_nn_add(seq, NULL, dt_nn_relu()));
    ASSERT_OK(dt_nn_add(seq, NULL, dt_nn_maxpool2d(2, 2, 0)));
    ASSERT_OK(dt_nn_add(swapped, NULL, dt_nn_maxpool2d(2, 2, 0)));
    ASSERT_OK(dt_nn_add(swapped, NULL, dt_nn_relu()));
    dt_model *m = t_build(seq, 0), *m2 = t_build(swapped, 0);
    ASSERT(m && m2);
    enum { N = 2, C = 3, H = 6, W = 4, P = 3, Q = 2 };
    float xs[N * C * H * W], gy[N * C * P * Q], out[2][N * C * P * Q], gx[2][N * C * H * W];
    for (int i = 0; i < N * C * H * W; i++)
        xs[i] = (float)((i * 7) % 11 - 6) / 4.0f; /* negatives, zeros, repeats */
    for (int i = 0; i < 4; i++)
        xs[i < 2 ? i : i + W - 2] = -1.0f - (float)i; /* window 0: all negative */
    xs[2] = xs[3] = xs[W + 2] = 0.0f, xs[W + 3] = -2.0f; /* window 1: ties at 0 */
    xs[2 * W] = xs[2 * W + 1] = 1.5f;                    /* window 2: positive tie */
    xs[5 * W + 3] = NAN;
    for (int i = 0; i < N * C * P * Q; i++)
        gy[i] = 0.25f * (float)(i % 5) - 0.5f;
    for (int pass = 0; pass < 2; pass++) {
        dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
        dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){N, C, H, W}, xs);
        dt_tensor *g = dt_tensor_wrap(gx[pass], DT_F32, 4, (int64_t[]){N, C, H, W});
        ASSERT(x && g);
        memset(gx[pass], 0, sizeof gx[pass]);
        ASSERT_OK(dt_tensor_set_grad(x, g));
        dt_tensor *y = dt_model_forward(ctx, pass ? m2 : m, x);
        ASSERT(y);
        dt_tensor *go = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){N, C, P, Q}, gy);
        memcpy(out[pass], y->data, sizeof out[pass]);
        ASSERT_OK(dt_backward_with(ctx, y, go));
        dt_tensor_set_grad(x, NULL);
        dt_tensor_free(g);
        dt_ctx_free(ctx);
    }
    ASSERT(out[0][0] == 0.0f && out[0][1] == 0.0f && out[0][2] == 1.5f && isnan(out[0][5]));
    ASSERT(memcmp(out[0], out[1], sizeof out[0]) == 0);
    ASSERT(memcmp(gx[0], gx[1], sizeof gx[0]) == 0);
    dt_model_free(m);
    dt_model_free(m2);
}

/* Gradients land in caller memory after dt_model_set_grads. */
TEST(replace_grad_buffer)
{
    dt_model *a = t_create("convnet", 5, NULL), *b = t_create("convnet", 5, NULL);
    ASSERT(a && b);
    size_t n = t_numel(a);
    float *mine = dt_calloc(n * sizeof(float));
    dt_flat fm;
    ASSERT_OK(dt_flat_wrap(&fm, DT_F32, mine, n - 1));
    ASSERT_STATUS(dt_model_set_grads(b, DT_F32, &fm), DT_ERR_SHAPE); /* one short */
    ASSERT_OK(dt_flat_wrap(&fm, DT_F32, mine, n));
    ASSERT_STATUS(dt_model_set_grads(b, DT_I64, &fm), DT_ERR_INVALID_ARG); /* no i64 gradients */
    ASSERT_OK(dt_model_set_grads(b, DT_F32, &fm));
    ASSERT(t_grads(b) == mine);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float xs[2 * 784];
    for (int i = 0; i < 2 * 784; i++)
        xs[i] = (float)((i % 11) - 5) / 4.0f;
    for (int k = 0; k < 2; k++) {
        dt_model *m = k ? b : a;
        dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){2, 1, 28, 28}, xs);
        dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){2}, (int64_t[]){0, 9});
        ASSERT_OK(dt_backward(ctx, dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y)));
        dt_ctx_reset(ctx);
    }
    ASSERT_EQ_INT(memcmp(t_grads(a), mine, n * sizeof(float)), 0);
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += fabsf(mine[i]);
    ASSERT(s > 0);
    ASSERT_OK(dt_model_set_grads(b, DT_F32, NULL)); /* back to an owned, zeroed one */
    ASSERT(t_grads(b) != mine);
    ASSERT_NEAR(t_grads(b)[0], 0, 0, 0);
    dt_free(mine);
    dt_ctx_free(ctx);
    dt_model_free(a);
    dt_model_free(b);
}

/* Same seed and thread count: bit-identical parameters after several steps. */
static float *train_convnet(uint64_t seed, int steps)
{
    dt_model *m = t_create("convnet", seed, NULL);
    if (!m)
        return NULL;
    dt_sgd_params sp = dt_sgd_params_default();
    sp.lr = 0.05;
    sp.momentum = 0.9;
    dt_optim *o = t_sgd(m, &sp);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float *xs = malloc(8 * 784 * sizeof(float));
    int64_t ys[8];
    for (int s = 0; s < steps; s++) {
        dt_rng_fill_uniform(dt_rng_key_make(99, DT_RNG_DATA, 0, (uint64_t)s), 0, xs, 8 * 784, -1, 1);
        for (int i = 0; i < 8; i++)
            ys[i] = (s + i * 3) % 10;
        dt_model_zero_grad(m);
        dt_tensor *x = dt_tensor_from(ctx, DT_F32, 4, (int64_t[]){8, 1, 28, 28}, xs);
        dt_tensor *y = dt_tensor_from(ctx, DT_I64, 1, (int64_t[]){8}, ys);
        if (dt_backward(ctx, dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y)) < 0 ||
            dt_optim_step(o) < 0)
            break;
        dt_ctx_reset(ctx);
    }
    size_t n = t_numel(m);
    float *out = malloc(n * sizeof(float) + t_buffers_nbytes(m));
    memcpy(out, t_params(m), n * sizeof(float));
    t_buffers_copy(m, out + n);
    free(xs);
    dt_ctx_free(ctx);
    dt_optim_free(o);
    dt_model_free(m);
    return out;
}

TEST(determinism_two_runs)
{
    dt_model *m = t_create("convnet", 11, NULL);
    size_t bytes = t_numel(m) * sizeof(float) + t_buffers_nbytes(m);
    float *init = malloc(bytes);
    memcpy(init, t_params(m), t_numel(m) * sizeof(float));
    dt_model_free(m);
    float *a = train_convnet(11, 4), *b = train_convnet(11, 4);
    ASSERT(a && b);
    ASSERT_EQ_INT(memcmp(a, b, bytes), 0);
    ASSERT(memcmp(a, init, bytes / 2) != 0); /* training moved the weights */
    free(a);
    free(b);
    free(init);
}

TEST(mlp_model)
{
    dt_model_config c = dt_model_config_default();
    ASSERT_EQ_INT(c.mlp_hidden, 4096);
    c.mlp_seq = 3, c.mlp_dim = 4, c.mlp_hidden = 5;
    dt_model *m = NULL;
    dt_model_desc d;
    ASSERT_OK(dt_model_create("mlp", 1, &c, &m, &d));
    ASSERT_STR_EQ(d.name, "mlp");
    dt_param_info w0, w1;
    ASSERT_OK(dt_model_entry(m, 0, &w0));
    ASSERT_OK(dt_model_entry(m, 1, &w1));
    ASSERT_STR_EQ(w0.name, "w0");
    ASSERT_STR_EQ(w1.name, "w1");
    ASSERT_EQ_INT(w0.shape[0], 4);
    ASSERT_EQ_INT(w0.shape[1], 5);
    const float xb = sqrtf(6.0f / 9.0f); /* xavier bound */
    for (size_t i = 0; i < w0.numel; i++)
        ASSERT(fabsf(((float *)w0.tensor->data)[i]) <= xb);
    int nd, tnd;
    int64_t shape[8], tshape[8];
    /* a negative batch was written into shape[0] with DT_OK */
    ASSERT_STATUS(dt_model_desc_shapes(&d, -2, &nd, shape, &tnd, tshape, NULL), DT_ERR_INVALID_ARG);
    ASSERT_OK(dt_model_desc_shapes(&d, 2, &nd, shape, &tnd, tshape, NULL));
    ASSERT_EQ_INT(nd, 3);
    ASSERT_EQ_INT(shape[1], 3);
    ASSERT_EQ_INT(shape[2], 4);
    ASSERT_EQ_INT(tnd, 0);
    /* loss = mean(x W0 W1) over 2*3*4 outputs; dL/dW1[j][k] = sum_rows h[r][j] / 24 */
    float xs[24];
    for (int i = 0; i < 24; i++)
        xs[i] = (float)(i % 7 - 3) / 4.0f;
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *x = dt_tensor_from(ctx, DT_F32, 3, shape, xs);
    dt_tensor *loss = dt_model_desc_loss(ctx, &d, dt_model_forward(ctx, m, x), NULL);
    ASSERT(loss);
    const float *W0 = w0.tensor->data, *W1 = w1.tensor->data;
    double h[6][5] = {{0}}, z = 0, hs[5] = {0};
    for (int r = 0; r < 6; r++)
        for (int j = 0; j < 5; j++) {
            for (int k = 0; k < 4; k++)
                h[r][j] += (double)xs[r * 4 + k] * W0[k * 5 + j];
            hs[j] += h[r][j];
            for (int o = 0; o < 4; o++)
                z += h[r][j] * W1[j * 4 + o];
        }
    ASSERT_NEAR(dt_tensor_item(loss), z / 24, 1e-6, 1e-5);
    ASSERT_OK(dt_backward(ctx, loss));
    const float *G1 = t_grads(m) + w1.offset;
    for (int j = 0; j < 5; j++)
        for (int o = 0; o < 4; o++)
            ASSERT_NEAR(G1[j * 4 + o], hs[j] / 24, 1e-6, 1e-5);
    ASSERT_NEAR(2 * d.fwd_flops_per_sample, 2 * 2.0 * (2 * 3 * 4 * 5), 0, 0);
    ASSERT_NEAR(2 * d.train_flops_per_sample, 5 * 2 * 3 * 4 * 5 * 2.0, 0, 0);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

/* Optimizer segments from the model: one per parameter tensor. */
TEST(optim_segments_from_model)
{
    dt_model *m = t_create("convnet", 1, NULL);
    dt_optim_segment segs[16];
    size_t n;
    ASSERT_STATUS(dt_optim_segments_from_model(m, DT_F32, true, segs, 3, &n), DT_ERR_RANGE);
    ASSERT_EQ_INT(n, 10);
    ASSERT_OK(dt_optim_segments_from_model(m, DT_F32, true, segs, 16, &n));
    ASSERT_EQ_INT(n, 10);
    dt_param_info p;
    dt_model_entry(m, 14, &p); /* fc.weight: the 9th parameter */
    ASSERT_EQ_INT(segs[8].offset, p.offset);
    ASSERT_EQ_INT(segs[8].numel, 15680);
    ASSERT(!segs[8].no_decay && segs[9].no_decay && segs[2].no_decay && !segs[0].no_decay);
    /* LAMB over the model's layout runs and leaves padding alone */
    dt_optim_range lay = t_range(m, segs, n);
    dt_lamb_params lp = dt_lamb_params_default();
    dt_optim *o = NULL;
    ASSERT_OK(dt_optim_lamb_init(&lp, &lay, 1, &o));
    for (size_t i = 0; i < t_numel(m); i++)
        t_grads(m)[i] = 0.01f;
    ASSERT_OK(dt_optim_step(o));
    /* fc.bias (10 floats) is followed by 6 floats of padding to 64 bytes */
    ASSERT(segs[9].offset + 10 < t_numel(m));
    ASSERT_NEAR(t_params(m)[segs[9].offset + 10], 0, 0, 0);
    ASSERT(t_params(m)[segs[9].offset + 9] != 0);
    dt_optim_kind k;
    ASSERT_OK(dt_optim_kind_parse("adamw", &k));
    ASSERT_EQ_INT(k, DT_OPTIM_ADAMW);
    ASSERT_STATUS(dt_optim_kind_parse("rmsprop", &k), DT_ERR_INVALID_ARG);
    dt_optim_free(o);
    dt_model_free(m);
}

TEST(bad_input)
{
    dt_model *m = t_create("convnet", 1, NULL);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    /* 3 channels into Conv2d(1, 16) */
    dt_tensor *x = dt_tensor_zeros(ctx, DT_F32, 4, (int64_t[]){2, 3, 28, 28});
    dt_error_clear();
    ASSERT(dt_model_forward(ctx, m, x) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_SHAPE);
    ASSERT_STR_CONTAINS(dt_last_error(), "layer1.0");
    ASSERT_STR_CONTAINS(dt_last_error(), "Conv2d");
    ASSERT_STR_CONTAINS(dt_last_error(), "[2,3,28,28]");
    /* 32x32 images: the convs work, fc gets 2048 features instead of 1568 */
    x = dt_tensor_zeros(ctx, DT_F32, 4, (int64_t[]){2, 1, 32, 32});
    ASSERT(dt_model_forward(ctx, m, x) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "'fc' (Linear)");
    ASSERT_STR_CONTAINS(dt_last_error(), "1568");
    /* NULL input, and a NULL flowing into the loss and backward */
    dt_error_clear();
    ASSERT(dt_model_forward(ctx, m, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "input is NULL");
    dt_model_desc cd;
    dt_model *m2 = NULL;
    ASSERT_OK(dt_model_create("convnet", 1, NULL, &m2, &cd));
    dt_model_free(m2);
    dt_tensor *loss = dt_model_desc_loss(ctx, &cd, dt_model_forward(ctx, m, NULL), NULL);
    ASSERT(loss == NULL);
    ASSERT(dt_backward(ctx, loss) < 0);
    /* wrong dtype */
    x = dt_tensor_zeros(ctx, DT_I32, 4, (int64_t[]){2, 1, 28, 28});
    ASSERT(dt_model_forward(ctx, m, x) == NULL);
    ASSERT(dt_last_status() < 0);
    /* bad constructors and names */
    ASSERT(t_create("resnet", 1, NULL) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "resnet");
    ASSERT(dt_nn_linear(0, 3, true) == NULL);
    ASSERT(dt_nn_seq(2, (dt_module *[]){dt_nn_relu(), dt_nn_conv2d(1, 1, 0, 1, 0, true)}) == NULL);
    /* n children from a NULL array read it (SIGSEGV); a negative n gave an empty Sequential */
    dt_error_clear();
    ASSERT(dt_nn_seq(2, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "dt_nn_seq");
    ASSERT(dt_nn_seq(-1, NULL) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_INVALID_ARG);
    dt_module *s = dt_nn_seq(0, NULL);
    ASSERT_OK(dt_nn_add(s, "a", dt_nn_relu()));
    ASSERT_STATUS(dt_nn_add(s, "a", dt_nn_relu()), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_nn_add(s, "x.y", dt_nn_relu()), DT_ERR_INVALID_ARG);
    /* a module outside a model cannot run */
    ASSERT(dt_module_forward(ctx, s, dt_tensor_zeros(ctx, DT_F32, 1, (int64_t[]){3})) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_STATE);
    dt_module_free(s);
    ASSERT(t_build(NULL, 0) == NULL);
    /* a module of a built model cannot be built again (and is not freed) */
    ASSERT(t_build(dt_model_find_module(m, "layer1"), 0) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_STATE);
    ASSERT(t_build(dt_model_root(m), 0) == NULL);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

int main(void)
{
    dt_set_num_threads(2);
    RUN(convnet_names_and_layout);
    RUN(init_pytorch_defaults);
    RUN(convnet_matches_pytorch);
    RUN(module_forward_values);
    RUN(hooks_all_kinds);
    RUN(relu_maxpool_reordered_exactly);
    RUN(replace_grad_buffer);
    RUN(determinism_two_runs);
    RUN(mlp_model);
    RUN(optim_segments_from_model);
    RUN(bad_input);
    return TEST_REPORT();
}
