/* A rank killed in the middle of DDP training: the others get
 * DT_ERR_PEER_FAILED naming the dead rank within 5 s (from whichever DDP
 * call notices first: forward's buffer broadcast, a bucket post during
 * backward, or dt_ddp_wait), never a hang. */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "ddp_util.h"
#include "test.h"
#include "model_util.h"

#include <signal.h>
#include <sys/mman.h>

typedef struct {
    int victim;
    int convnet;
    volatile double *kill_time; /* shared page: when the victim died */
} fault_arg;

static int body_fault(int rank, int W, void *argp)
{
    const fault_arg *a = argp;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    const th_data *dd = a->convnet ? &k_img_data : &k_mlp_data;
    dt_model *m = a->convnet ? t_create("convnet", 1, NULL) : mlp_model(1);
    dt_ddp *ddp;
    TH_OK(dt_ddp_init(pg, m, NULL, &ddp));
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_optim *opt = make_sgd(m);
    dt_status st = DT_OK;
    double t_err = 0;
    for (int s = 0; s < 100000; s++) {
        if (rank == a->victim && s == 5) {
            *a->kill_time = dt_time_s();
            raise(SIGKILL);
        }
        dt_model_zero_grad(m);
        st = fwd_bwd(ctx, m, ddp, dd, (s * W + rank) * 4, 4, 1.0f);
        if (st >= 0)
            st = dt_ddp_wait(ddp);
        if (st >= 0)
            st = dt_optim_step(opt);
        dt_ctx_reset(ctx);
        if (st < 0) {
            t_err = dt_time_s();
            break;
        }
    }
    fprintf(stderr, "[rank %d] noticed %.2f s after the kill: %s\n", rank, t_err - *a->kill_time, dt_last_error());
    TH_CHECK(st == DT_ERR_PEER_FAILED, "got %s: %s", dt_status_name(st), dt_last_error());
    char want[32];
    snprintf(want, sizeof want, "rank %d", a->victim);
    TH_CHECK(strstr(dt_last_error(), want), "message does not name %s: %s", want, dt_last_error());
    TH_CHECK(*a->kill_time > 0 && t_err - *a->kill_time < 5.0, "noticed %.2f s after the kill",
             t_err - *a->kill_time);
    /* later calls fail at once instead of hanging */
    double t0 = dt_time_s();
    TH_CHECK(fwd_bwd(ctx, m, ddp, dd, 0, 4, 1.0f) < 0 || dt_ddp_wait(ddp) < 0, "a later step succeeded");
    TH_CHECK(dt_time_s() - t0 < 1.0, "later failure not immediate");
    dt_optim_free(opt);
    dt_ctx_free(ctx);
    dt_ddp_free(ddp);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

static void run_case(int W, int victim, int convnet, int *fails)
{
    volatile double *kt = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (kt == MAP_FAILED) {
        (*fails)++;
        return;
    }
    *kt = 0;
    fault_arg a = {.victim = victim, .convnet = convnet, .kill_time = kt};
    int codes[8];
    int rc = th_run(W, 30.0, body_fault, &a, codes);
    for (int r = 0; r < W; r++) {
        int want = r == victim ? 128 + SIGKILL : 0;
        if (codes[r] != want) {
            fprintf(stderr, "W=%d victim %d: rank %d exited %d, want %d (th_run %d)\n", W, victim, r, codes[r],
                    want, rc);
            (*fails)++;
        }
    }
    munmap((void *)kt, 4096);
}

TEST(rank_killed_mid_training)
{
    int fails = 0;
    run_case(2, 1, 0, &fails);
    run_case(2, 0, 1, &fails);
    run_case(3, 1, 1, &fails);
    ASSERT_EQ_INT(fails, 0);
}

int main(void)
{
    RUN(rank_killed_mid_training);
    return TEST_REPORT();
}
