/* A failing pipeline stage over MPI (mpirun -np 4: two replicas of a
 * 2-stage MLP pipeline), as test_pipe_train_mlp's mlp_failing_stage does
 * over shm: world rank 1 (pipeline 0's last stage) refuses its loss on
 * micro-batch 1 of step 2. Its pipeline peer (rank 0) and the other
 * pipeline (ranks 2, 3, which wait for pipeline 0's gradients in the
 * data-parallel average) must fail within 15 s (the groups' timeout is
 * 60 s) naming the failing rank and its cause, while ranks 0 and 1 stay
 * alive (they wait on a group that is not failed until 2 and 3 have seen
 * the failure), so mpirun ending the job cannot stand in for the failure
 * notices. A later step fails too, and everything frees; every schedule
 * but interleaved (which needs more units than the MLP has).
 *
 * Registered by tests/train/tests.cmake when MPI is found. */
#include "train/pipe_train.h"

#include <stdio.h>

#include "comm/rank_check.h"

static int loss_calls;
static dt_model_desc *loss_desc;

static dt_tensor *failing_loss(void *ud, dt_ctx *ctx, dt_tensor *out, dt_tensor *y)
{
    (void)ud;
    if (g_rank == 1 && ++loss_calls == 4 + 2) { /* step 2 (4 micro-batches a step), micro-batch 1 */
        dt_error(DT_ERR_INVALID_ARG, "test loss: refusing micro-batch 1 of step 2");
        return NULL;
    }
    return dt_model_desc_loss_fn(loss_desc, ctx, out, y);
}

/* One schedule on w (a duplicate of root, failed by the run). */
static void run_kind(dt_pg *root, dt_pg *w, dt_pipe_kind kind)
{
    dt_model_config mc = small_cfg("mlp");
    dt_model *m;
    dt_model_desc d;
    dt_strategy *s;
    dt_trainer *tr = NULL;
    dt_pipe_params pp = dt_pipe_params_default();
    pp.pp = 2, pp.schedule = kind, pp.micro_batches = 4;
    if (dt_model_create("mlp", 11, &mc, &m, &d) < 0) {
        CHECK(0, "model: %s", dt_last_error());
        return;
    }
    dt_trainer_params tp = dt_trainer_params_default();
    loss_desc = &d, loss_calls = 0;
    tp.loss_fn = failing_loss;
    tp.loss_ud = &d;
    if (dt_strategy_pipe_init(w, &pp, &s) < 0 || dt_trainer_init(m, s, &tp, &tr) < 0) {
        CHECK(0, "set-up: %s", dt_last_error());
        dt_model_free(m);
        return;
    }
    float xf[B_GLOBAL * 32];
    make_batch("mlp", 0, B_GLOBAL, xf, NULL, NULL);
    dt_trainer_batch b = batch_of("mlp", B_GLOBAL, xf, NULL, NULL);
    CHECK(dt_trainer_step(tr, &b, 1, NULL) == DT_OK, "step 1: %s", dt_last_error());
    double t0 = dt_time_s();
    dt_status st = dt_trainer_step(tr, &b, 1, NULL);
    double took = dt_time_s() - t0;
    CHECK(st < 0, "a step with a failing pipeline stage succeeded");
    CHECK(strstr(dt_last_error(), "pipeline rank 1 broke off its schedule") != NULL &&
              strstr(dt_last_error(), "test loss: refusing micro-batch 1 of step 2") != NULL,
          "%s: the error does not name the failing rank and its cause: %s", dt_pipe_kind_name(kind),
          dt_last_error());
    CHECK(took < 15, "%s: the step took %.1f s to notice the failure", dt_pipe_kind_name(kind), took);
    /* ranks 0 and 1 stay until 2 and 3 have seen the failure */
    CHECK(dt_pg_barrier(root) == DT_OK, "%s", dt_last_error());
    CHECK(dt_trainer_step(tr, &b, 1, NULL) < 0, "a later step after a failed schedule succeeded");
    dt_trainer_free(tr);
    dt_model_free(m);
}

int main(void)
{
    dt_pg *root;
    if (dt_pg_init(NULL, &root) < 0) {
        fprintf(stderr, "dt_pg_init: %s\n", dt_last_error());
        return 1;
    }
    g_rank = dt_pg_rank(root);
    const char *want = getenv("DT_EXPECT_BACKEND");
    if (want && strcmp(want, dt_pg_backend(root)))
        CHECK(0, "backend is '%s', expected '%s'", dt_pg_backend(root), want);
    CHECK(dt_pg_size(root) == 4, "needs 4 ranks, got %d", dt_pg_size(root));
    for (int k = 0; k < DT_PIPE_KIND_COUNT && dt_pg_size(root) == 4; k++) {
        if (k == DT_PIPE_INTERLEAVED)
            continue;
        dt_pg *w;
        if (dt_pg_dup(root, &w) < 0) {
            CHECK(0, "dt_pg_dup: %s", dt_last_error());
            break;
        }
        run_kind(root, w, (dt_pipe_kind)k);
        dt_pg_free(w);
    }
    int64_t bad = g_fail;
    if (dt_pg_allreduce(root, DT_IN_PLACE, &bad, 1, DT_I64, DT_REDUCE_SUM) < 0)
        bad = 1;
    if (g_rank == 0)
        printf("mpi_pipe_fail: backend %s: %s (%lld failures)\n", dt_pg_backend(root), bad ? "FAILED" : "ok",
               (long long)bad);
    dt_pg_free(root);
    return bad ? 1 : 0;
}
