/* quickstart — the README's example: a small MLP trained with SGD on a
 * synthetic two-class problem, data-parallel through the library's trainer.
 * Uses only the public API (dtrain/dtrain.h).
 *     build/examples/example_quickstart                           # one process
 *     build/dtrain run -n 2 -- build/examples/example_quickstart  # two ranks (DDP)
 * Each rank draws its own batches; DDP averages the gradients, so every
 * rank holds the same weights after each step. */
#include <dtrain/dtrain.h>

#include <stdio.h>

int main(void)
{
    enum { B = 64, D = 16, STEPS = 200 };
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(D, 32, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(32, 2, true));
    dt_model *m = NULL;
    dt_pg *pg = NULL;
    dt_strategy *ddp = NULL;
    dt_trainer *tr = NULL;
    dt_trainer_params tp = dt_trainer_params_default(); /* SGD, cross-entropy */
    tp.sgd.lr = 0.1;
    tp.sgd.momentum = 0.9;
    if (dt_model_build(net, /*seed=*/0, NULL, &m) < 0 || dt_pg_init(NULL, &pg) < 0 || /* ranks from the launcher */
        dt_strategy_ddp_init(pg, NULL, &ddp) < 0 || dt_trainer_init(m, ddp, &tp, &tr) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    const int rank = dt_pg_rank(pg);

    static float x[B * D];
    static int64_t y[B];
    dt_trainer_metrics r = {0};
    for (int step = 0; step < STEPS; step++) {
        /* this rank's batch; class = sign of the sum of the first two features */
        dt_rng_fill_normal(dt_rng_key_make(1, DT_RNG_DATA, (uint64_t)rank, (uint64_t)step), 0, x, B * D, 0, 1);
        for (int i = 0; i < B; i++)
            y[i] = x[i * D] + x[i * D + 1] > 0;
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){B, D}, y, DT_I64, 1, (int64_t[]){B});
        if (dt_trainer_step(tr, &b, 1, &r) < 0) { /* forward, backward, all-reduce, update */
            fprintf(stderr, "step %d: %s\n", step, dt_last_error());
            return 1;
        }
        if (rank == 0 && step % 50 == 0)
            printf("step %3d  loss %.4f\n", step, r.loss); /* mean over the ranks */
    }
    if (rank == 0)
        printf("final loss %.4f\n", r.loss);
    dt_trainer_free(tr); /* and the strategy */
    dt_model_free(m);
    dt_pg_free(pg);
    return r.loss < 0.3 ? 0 : 1;
}
