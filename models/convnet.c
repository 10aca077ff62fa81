/* The classic MNIST ConvNet of the PyTorch tutorials (and of the DDP
 * examples), with PyTorch's module names so state_dict keys line up:
 *
 *   layer1 = Sequential(Conv2d(1, 16, 5, padding=2), BatchNorm2d(16), ReLU(), MaxPool2d(2))
 *   layer2 = Sequential(Conv2d(16, 32, 5, padding=2), BatchNorm2d(32), ReLU(), MaxPool2d(2))
 *   fc     = Linear(7*7*32, num_classes)
 *   forward: fc(flatten(layer2(layer1(x))))          x [B, 1, 28, 28]
 *
 * Our root is a container ("ConvNet") with children layer1, layer2,
 * flatten, fc; the Flatten child has no tensors, so the keys are exactly
 * PyTorch's. Its own forward takes two shortcuts:
 *   - conv activations stay channel-blocked (dt_ctx_set_blocked; nChw8c or
 *     nChw16c, the layout oneDNN prefers: dt_k_act_block) through batch norm,
 *     ReLU and max pooling until the flatten converts them, while no module
 *     under the root has a hook other than a blind one or a replaced forward
 *     (nothing could observe the layout). Blind hooks (ZeRO-3's parameter
 *     gathers) and activation checkpointing of the layers (the model's
 *     checkpoint units, dt_model_desc.ckpt_unit) keep it: the values are the
 *     same with them as without, bit for bit (batch norm over plain
 *     activations sums in another order: a few ulps);
 *   - ReLU then max pooling runs as max pooling then ReLU (only while no
 *     module of a layer carries a hook or a checkpoint): equal values and
 *     gradients (max(relu(a), relu(b)) = relu(max(a, b)); the gradient
 *     reaches the window's argmax exactly when that maximum is > 0 either
 *     way; NaN propagates either way), and the ReLU sees a quarter of the
 *     elements; batch norm, the pooling and the ReLU then run as one op. */
#include "zoo.h"

#include <stdio.h>

/* layer l's conv, then batch norm, max pooling and ReLU as one op on blocked
 * activations (dt_module_forward_bn_relu_pool: batch norm's output and the
 * gradient at it are never stored; the same bits as the three in turn) */
static dt_tensor *layer_fused(dt_ctx *ctx, dt_module *layer, dt_tensor *x)
{
    x = dt_module_forward(ctx, dt_module_child(layer, 0), x);
    return dt_module_forward_bn_relu_pool(ctx, dt_module_child(layer, 1), dt_module_child(layer, 3), x);
}

static dt_tensor *convnet_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    if (!dt_module_subtree_unobserved(self)) { /* hooks may look: run each module as written */
        for (int i = 0; i < dt_module_num_children(self) && x; i++)
            x = dt_module_forward(ctx, dt_module_child(self, i), x);
        return x;
    }
    /* Blocked activations whatever blind hooks (ZeRO-3's gathers) or
     * checkpoints the modules carry, so those never change a value: the
     * layers then run through their own forward (each module as written,
     * hooks and checkpointing where they are; a checkpointed layer hands
     * its output on plain, an exact reorder). Self's own hooks fire outside
     * this function. */
    bool fused = true;
    for (int l = 0; l < 2; l++)
        fused &= dt_module_tree_plain(dt_module_child(self, l));
    bool old = dt_ctx_set_blocked(ctx, true);
    for (int l = 0; l < 2 && x; l++) {
        dt_module *layer = dt_module_child(self, l); /* conv, bn, relu, pool */
        x = fused ? layer_fused(ctx, layer, x) : dt_module_forward(ctx, layer, x);
    }
    dt_ctx_set_blocked(ctx, old);
    x = dt_module_forward(ctx, dt_module_child(self, 2), x); /* flatten: back to plain */
    return dt_module_forward(ctx, dt_module_child(self, 3), x);
}

static dt_module *block(int64_t in, int64_t out)
{
    dt_module *c[4] = {dt_nn_conv2d(in, out, 5, 1, 2, true), dt_nn_batchnorm2d(out, 1e-5f, 0.1f), dt_nn_relu(),
                       dt_nn_maxpool2d(2, 2, 0)};
    return dt_nn_seq(4, c);
}

dt_status dt__model_convnet(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d)
{
    if (c->num_classes <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "convnet: num_classes must be > 0, got %lld", (long long)c->num_classes);
    dt_module *root = dt_nn_custom("ConvNet", 0, NULL, convnet_forward, NULL);
    dt_status st = dt_nn_add(root, "layer1", block(1, 16));
    if (st >= 0)
        st = dt_nn_add(root, "layer2", block(16, 32));
    if (st >= 0)
        st = dt_nn_add(root, "flatten", dt_nn_flatten(1, -1));
    if (st >= 0)
        st = dt_nn_add(root, "fc", dt_nn_linear(7 * 7 * 32, c->num_classes, true));
    if (st < 0) {
        dt_module_free(root);
        return st;
    }
    dt_model *m;
    if ((st = dt_model_build(root, seed, &c->build, &m)) < 0)
        return st;
    d->loss = DT_LOSS_CROSS_ENTROPY;
    snprintf(d->ckpt_unit, sizeof d->ckpt_unit, "Sequential"); /* activation-checkpointing units */
    d->input_ndim = 3;
    d->input_shape[0] = 1, d->input_shape[1] = 28, d->input_shape[2] = 28;
    d->input_dtype = DT_F32;
    d->has_target = true;
    d->target_ndim = 0;
    d->target_dtype = DT_I64;
    d->num_classes = c->num_classes;
    /* per sample, 2 FLOPs per multiply-add */
    double conv1 = 2.0 * 16 * 28 * 28 * (1 * 5 * 5);
    double conv2 = 2.0 * 32 * 14 * 14 * (16 * 5 * 5);
    double fc = 2.0 * 1568 * (double)c->num_classes;
    d->fwd_flops_per_sample = conv1 + conv2 + fc;
    /* backward: weight grads for all three, input grads for conv2 and fc
     * (the image needs none) */
    d->train_flops_per_sample = 3 * d->fwd_flops_per_sample - conv1;
    *out = m;
    return DT_OK;
}
