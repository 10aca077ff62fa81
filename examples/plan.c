/* plan — GPT-2 (gpt-micro) over dp x tp x pp ranks with ZeRO-1, the layout built
 * by a plan (dtrain/plan.h) from four numbers; exit 0 when the loss falls.
 *     build/dtrain run -n 8 -- build/examples/example_plan 2 2 2   # dp tp pp */
#include <dtrain/dtrain.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    enum { B = 4, T = 16, V = 512, STEPS = 3 };
    dt_plan_params pp = dt_plan_params_default();
    pp.dp = argc > 1 ? atoi(argv[1]) : 0, pp.tp = argc > 2 ? atoi(argv[2]) : 1, pp.pp = argc > 3 ? atoi(argv[3]) : 1;
    pp.zero_stage = 1;          /* optimizer state sharded over the replicas */
    pp.pipe.micro_batches = 2;  /* each batch in two through the stages */
    dt_plan *pl = NULL;
    dt_model *m = NULL;
    dt_model_desc d;
    dt_strategy *s = NULL;
    dt_trainer *tr = NULL;
    dt_model_config mc = dt_model_config_default();
    mc.n_layer = 4, mc.block_size = T, mc.vocab_size = V, mc.seq = T;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW, tp.adamw.lr = 1e-2, tp.loss_fn = dt_model_desc_loss_fn, tp.loss_ud = &d;
    if (dt_plan_init(NULL, &pp, &pl) < 0) { /* ranks from the launcher; the degrees checked against them */
        fprintf(stderr, "plan: %s\n", dt_last_error());
        return 2;
    }
    mc.tp = dt_plan_tp_group(pl);                /* this rank's tensor-parallel slices */
    mc.build.meta = dt_plan_meta_model(pl);      /* each rank fills only what it holds */
    if (dt_model_create("gpt-micro", 1, &mc, &m, &d) < 0 || dt_plan_strategy(pl, m, &s) < 0 ||
        dt_trainer_init(m, s, &tp, &tr) < 0) {
        fprintf(stderr, "setup: %s\n", dt_last_error());
        return 1;
    }
    static int64_t x[B * T], y[B * T];
    double first = 0, last = 0;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < B * T; i++) /* this replica's tokens; the target is the next one */
            x[i] = (i * 7 + 3 * dt_plan_rank(pl)) % V, y[i] = (x[i] + 1) % V;
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){B, T}, y, DT_I64, 2, (int64_t[]){B, T});
        dt_trainer_metrics r;
        if (dt_trainer_step(tr, &b, 1, &r) < 0)
            return fprintf(stderr, "step %d: %s\n", step, dt_last_error()), 1;
        first = step ? first : r.loss, last = r.loss;
        if (dt_plan_is_main(pl))
            printf("step %d  loss %.4f  (dp %d x tp %d x pp %d, ZeRO-%d)\n", step, r.loss, dt_plan_world(pl),
                   dt_plan_tp(pl), dt_plan_pp(pl), dt_plan_zero_stage(pl));
    }
    dt_trainer_free(tr); /* and the strategy; the plan (its groups) last */
    dt_model_free(m);
    dt_plan_free(pl);
    return last < first ? 0 : 1;
}
