/* The classic MNIST ConvNet of the PyTorch tutorials (and of the DDP
 * examples), with PyTorch's module names so state_dict keys line up:
 *
 *   layer1 = Sequential(Conv2d(1, 16, 5, padding=2), BatchNorm2d(16), ReLU(), MaxPool2d(2))
 *   layer2 = Sequential(Conv2d(16, 32, 5, padding=2), BatchNorm2d(32), ReLU(), MaxPool2d(2))
 *   fc     = Linear(7*7*32, num_classes)
 *   forward: fc(flatten(layer2(layer1(x))))          x [B, 1, 28, 28]
 *
 * Our root is a Sequential with children layer1, layer2, flatten, fc; the
 * Flatten child has no tensors, so the keys are exactly PyTorch's. */
#include "nn/nn_impl.h"
#include "zoo.h"

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
    dt_module *root = dt_nn_seq(0, NULL);
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
    m->blocked_acts = true; /* conv -> BN -> ReLU -> pool stay nChw8c until flatten */
    d->loss = DT_LOSS_CROSS_ENTROPY;
    d->input_ndim = 3;
    d->input_shape[0] = 1, d->input_shape[1] = 28, d->input_shape[2] = 28;
    d->input_dtype = DT_F32;
    d->has_target = true;
    d->target_ndim = 0;
    d->target_dtype = DT_I64;
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
