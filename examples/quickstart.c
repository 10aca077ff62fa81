/* quickstart — the README's example: build a small MLP, train it with SGD
 * on a synthetic two-class problem, and print the loss. Uses only the
 * public API (dtrain/dtrain.h). Run: build/examples/example_quickstart */
#include <dtrain/dtrain.h>

#include <stdio.h>

int main(void)
{
    enum { B = 64, D = 16, STEPS = 200 };
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_seq_add(net, NULL, dt_nn_linear(D, 32, true));
    dt_nn_seq_add(net, NULL, dt_nn_relu());
    dt_nn_seq_add(net, NULL, dt_nn_linear(32, 2, true));
    dt_model *m;
    dt_optim *opt;
    dt_ctx *ctx;
    if (dt_model_build(net, /*seed=*/0, NULL, &m) < 0) {
        fprintf(stderr, "build: %s\n", dt_last_error());
        return 1;
    }

    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    dt_optim_segment segs[16];
    size_t nseg;
    dt_optim_segments_from_model(m, DT_F32, false, segs, 16, &nseg);
    dt_optim_range r = {.params = P, .grads = dt_model_flat(m, DT_FLAT_GRADS, DT_F32), .lo = 0, .hi = P->total,
                        .segs = segs, .nseg = nseg};
    dt_sgd_params sp = dt_sgd_params_default();
    sp.lr = 0.1;
    sp.momentum = 0.9;
    if (dt_optim_sgd_init(&sp, &r, 1, &opt) < 0 || dt_ctx_init(NULL, &ctx) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }

    static float x[B * D];
    static int64_t y[B];
    float loss_v = 0;
    for (int step = 0; step < STEPS; step++) {
        /* class = sign of the sum of the first two features */
        dt_rng_fill_normal(dt_rng_key_make(1, DT_RNG_DATA, 0, (uint64_t)step), 0, x, B * D, 0, 1);
        for (int i = 0; i < B; i++)
            y[i] = x[i * D] + x[i * D + 1] > 0;
        dt_model_zero_grad(m);
        dt_tensor *xt = dt_tensor_view_of(ctx, x, DT_F32, 2, (int64_t[]){B, D});
        dt_tensor *yt = dt_tensor_view_of(ctx, y, DT_I64, 1, (int64_t[]){B});
        dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, xt), yt);
        if (!loss || dt_backward(ctx, loss) < 0) { /* one check for the whole pass */
            fprintf(stderr, "step %d: %s\n", step, dt_last_error());
            return 1;
        }
        loss_v = dt_tensor_item(loss);
        dt_optim_step(opt);
        dt_ctx_reset(ctx);
        if (step % 50 == 0)
            printf("step %3d  loss %.4f\n", step, loss_v);
    }
    printf("final loss %.4f\n", loss_v);
    dt_ctx_free(ctx);
    dt_optim_free(opt);
    dt_model_free(m);
    return loss_v < 0.3f ? 0 : 1;
}
