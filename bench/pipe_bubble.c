/* Pipeline bubble and activation memory per schedule (pipeline.h), run
 * under the launcher:
 *
 *     dtrain run -n 4 -- build/bench/pipe_bubble [--layers L] [--dim D] [--batch B] [-m M] [--steps K]
 *
 * A Sequential of L equal Linear(D, D) + ReLU blocks cut into p = world
 * equal stages (2 units per block); each schedule (gpipe, 1f1b,
 * interleaved with v = 2 when L allows, zbh1) trains K steps of a batch of
 * B rows as M micro-batches. Per rank: compute seconds (busy) and the
 * rest of the schedule's wall time (idle) of the last step, idle / busy
 * against the formula's bubble ((p-1)/m, (p-1)/(v m), (p-1)/(3m)), and
 * the peak bytes of micro-batch activations in flight. Rank 0 prints one
 * line per schedule and rank. bench/torch_pipeline.py is the peer. */
#include "dtrain/dtrain.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return def;
}

int main(int argc, char **argv)
{
    int L = (int)arg(argc, argv, "--layers", 8), D = (int)arg(argc, argv, "--dim", 512);
    int B = (int)arg(argc, argv, "--batch", 64), M = (int)arg(argc, argv, "-m", 8), K = (int)arg(argc, argv, "--steps", 3);
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0) {
        fprintf(stderr, "pipe_bubble: %s\n", dt_last_error());
        return 1;
    }
    int P = dt_pg_size(pg), r = dt_pg_rank(pg);
    float *x = malloc((size_t)B * D * sizeof *x);
    for (long i = 0; i < (long)B * D; i++)
        x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    if (r == 0)
        printf("pipe_bubble: p %d, %d blocks of Linear(%d, %d)+ReLU, batch %d as m %d, %d steps\n", P, L, D, D, B, M, K);
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++) {
        dt_pipe_kind kind = (dt_pipe_kind)k;
        int v = kind == DT_PIPE_INTERLEAVED ? 2 : 1;
        if (2 * L < P * v || (kind == DT_PIPE_INTERLEAVED && M % P))
            continue;
        dt_module *net = dt_nn_seq(0, NULL);
        for (int i = 0; i < L; i++) {
            dt_nn_add(net, NULL, dt_nn_linear(D, D, true));
            dt_nn_add(net, NULL, dt_nn_relu());
        }
        dt_model *m;
        dt_strategy *s;
        dt_trainer *tr;
        dt_pipe_params pp = dt_pipe_params_default();
        pp.pp = P, pp.schedule = kind, pp.micro_batches = M;
        dt_trainer_params tp = dt_trainer_params_default();
        tp.loss = DT_TRAINER_LOSS_MEAN;
        if (dt_model_build(net, 1, NULL, &m) < 0 || dt_strategy_pipe_init(pg, &pp, &s) < 0 ||
            dt_trainer_init(m, s, &tp, &tr) < 0) {
            fprintf(stderr, "pipe_bubble: %s: %s\n", dt_pipe_kind_name(kind), dt_last_error());
            return 1;
        }
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_F32, 2, (int64_t[]){B, D}, NULL, DT_I64, 0, NULL);
        for (int i = 0; i < K; i++)
            if (dt_trainer_step(tr, &b, 1, NULL) < 0) {
                fprintf(stderr, "pipe_bubble: %s: %s\n", dt_pipe_kind_name(kind), dt_last_error());
                return 1;
            }
        dt_pipe_stats st;
        dt_strategy_pipe_stats(dt_trainer_strategy(tr), &st);
        double v4[4] = {st.busy_s, st.step_s, (double)st.peak_act_bytes, (double)st.peak_inflight};
        double *all = r == 0 ? calloc((size_t)P * 4, sizeof *all) : NULL;
        dt_pg_gather(pg, v4, all, 4, DT_F64, 0);
        if (r == 0) {
            for (int q = 0; q < P; q++) {
                double busy = all[q * 4], wall = all[q * 4 + 1];
                printf("%-12s rank %d: busy %.4f s, idle %.4f s, idle/busy %.3f (formula %.3f), peak activations "
                       "%.2f MiB (%d micro-batches)\n", dt_pipe_kind_name(kind), q, busy, wall - busy,
                       busy > 0 ? (wall - busy) / busy : 0, dt_pipe_bubble_formula(kind, P, M, v),
                       all[q * 4 + 2] / (1 << 20), (int)all[q * 4 + 3]);
            }
            free(all);
        }
        dt_trainer_free(tr);
        dt_model_free(m);
    }
    free(x);
    dt_pg_free(pg);
    return 0;
}
