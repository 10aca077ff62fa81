/* Issue 9: forgetting dt_ddp_wait() before the optimizer step used to let
 * the replicas drift apart silently. Now the step (and clipping) fails with
 * an error that names dt_ddp_wait while the all-reduces are in flight;
 * after the wait it succeeds, and the replicas stay identical. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "test.h"

static int body_no_wait(int rank, int W, void *argp)
{
    (void)argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m = mlp_model(5);
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, NULL, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_optim *opt = make_sgd(m);
    const size_t n = t_numel(m);
    for (int s = 0; s < 3; s++) {
        dt_model_zero_grad(m);
        TH_OK(fwd_bwd(ctx, m, ddp, &k_mlp_data, (s * W + rank) * 4, 4, 1.0f));
        /* the mistake: step without dt_ddp_wait */
        dt_status st = dt_optim_step(opt);
        TH_CHECK(st == DT_ERR_STATE, "step %d without dt_ddp_wait: %s, want DT_ERR_STATE", s, dt_status_name(st));
        TH_CHECK(strstr(dt_last_error(), "dt_ddp_wait") != NULL, "the error does not name the fix: %s",
                 dt_last_error());
        st = dt_clip_grad_norm(t_grads(m), n, 1.0f, NULL);
        TH_CHECK(st == DT_ERR_STATE && strstr(dt_last_error(), "dt_ddp_wait"), "clip without wait: %s",
                 dt_status_name(st));
        TH_CHECK(dt_optim_get_step(opt) == 0 + s, "a refused step counted");
        /* the fix */
        TH_OK(dt_ddp_wait(ddp));
        TH_OK(dt_optim_step(opt));
        dt_ctx_reset(ctx);
    }
    /* replicas identical: every rank's parameters equal rank 0's */
    float *p0 = malloc(n * sizeof *p0);
    memcpy(p0, t_params(m), n * sizeof *p0);
    TH_OK(dt_pg_broadcast(pg, p0, n, DT_F32, 0));
    TH_CHECK(!memcmp(p0, t_params(m), n * sizeof *p0), "rank %d drifted from rank 0", rank);
    free(p0);
    dt_optim_free(opt);
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

TEST(step_without_wait_is_an_error)
{
    for (int W = 2; W <= 3; W++)
        ASSERT_EQ_INT(th_run(W, 60.0, body_no_wait, NULL, NULL), 0);
}

int main(void)
{
    RUN(step_without_wait_is_an_error);
    return TEST_REPORT();
}
