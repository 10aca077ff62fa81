/* Trainer checkpoints of ZeRO and bf16 runs (train.h dt_trainer_save /
 * dt_trainer_load), real processes:
 *   - exact resume at the same world size: ZeRO stages 1, 2, 3 in bf16
 *     (AdamW, fp32 masters of each rank's ranges), saved after 2 steps,
 *     loaded into a fresh run and trained to 4: parameters, masters and
 *     optimizer state bit-identical to an uninterrupted run;
 *   - resharding through real training: ZeRO-3 on 4 ranks -> DDP on 2 ranks
 *     -> one process -> ZeRO-3 on 4 ranks (and ZeRO-1 on 3), training 2 steps
 *     in each; after each load a save with no step between is tensor for
 *     tensor identical to the checkpoint loaded (parameters, fp32 masters,
 *     AdamW's two moments, buffers): no state lost in any direction;
 *   - dtype conversion: a bf16 checkpoint loads into an f32 model (its values
 *     are the saved fp32 masters), and that model's checkpoint back into a
 *     bf16 model gives the first run's bf16 parameters and masters exactly,
 *     so training on from it equals training on from the bf16 checkpoint. */
// dt-test-timeout: 120
#include "parallel/ddp_util.h"
#include "dtrain/ckpt.h"
#include "dtrain/kernels.h"
#include "ckpt_cmp.h"
#include "test.h"
#include "tmp_util.h"

#include <sys/stat.h>
#include <unistd.h>

static const char *tmpdir(void) { return t_tmpdir("zckpt"); }

/* Linear(8,16) ReLU Linear(16,5) ReLU Linear(5,4) in dt. */
static dt_model *ck_model(dt_dtype dt)
{
    dt_module *net = dt_nn_seq(0, NULL);
    dt_nn_add(net, NULL, dt_nn_linear(8, 16, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(16, 5, true));
    dt_nn_add(net, NULL, dt_nn_relu());
    dt_nn_add(net, NULL, dt_nn_linear(5, 4, true));
    dt_model_build_params bp = dt_model_build_params_default();
    bp.param_dtype = dt;
    dt_model *m = NULL;
    return dt_model_build(net, 17, &bp, &m) < 0 ? NULL : m;
}

typedef enum { K_NONE, K_DDP, K_Z1, K_Z2, K_Z3 } kind;

static dt_status make(dt_pg *pg, kind k, dt_dtype dt, dt_model **m, dt_trainer **tr)
{
    *m = ck_model(dt);
    if (!*m)
        return DT_ERR_NO_MEMORY;
    dt_strategy *s;
    dt_status st;
    if (k == K_NONE) {
        st = dt_strategy_none_init(&s);
    } else if (k == K_DDP) {
        dt_ddp_params dp = dt_ddp_params_default();
        dp.reduce_dtype = dt;
        st = dt_strategy_ddp_init(pg, &dp, &s);
    } else {
        dt_zero_params zp = dt_zero_params_default();
        zp.stage = k - K_Z1 + 1;
        zp.wrap_module_type = "Linear";
        st = dt_strategy_zero_init(pg, &zp, &s);
    }
    if (st < 0)
        return st;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.adamw.lr = 0.01;
    tp.precision.param_dtype = dt;
    tp.loss = DT_TRAINER_LOSS_CROSS_ENTROPY;
    return dt_trainer_init(*m, s, &tp, tr);
}

/* Steps [from, to) of the same global batches at any world size: step s
 * takes samples [s * 12, + 12), rank r of W its 12 / W. */
static dt_status steps(dt_trainer *tr, int rank, int W, int from, int to)
{
    for (int s = from; s < to; s++) {
        dt_status st = trainer_step_on(tr, &k_mlp_data, s * 12 + rank * (12 / W), 12 / W, 1, 0, NULL);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* ---- exact resume ---------------------------------------------------------------------- */

typedef struct {
    kind k;
    dt_dtype dt;
    char dir[300];
} rcase;

static int body_resume(int rank, int W, void *arg)
{
    const rcase *c = arg;
    dt_set_num_threads(1);
    dt_pg *pg;
    TH_OK(th_pg(rank, W, NULL, &pg));
    char a[400], b[400], mid[400];
    snprintf(a, sizeof a, "%s/a", c->dir);
    snprintf(b, sizeof b, "%s/b", c->dir);
    snprintf(mid, sizeof mid, "%s/mid", c->dir);
    dt_model *m;
    dt_trainer *tr;
    /* uninterrupted: 4 steps, saving at 2 (a save must not disturb the run) */
    TH_OK(make(pg, c->k, c->dt, &m, &tr));
    TH_OK(steps(tr, rank, W, 0, 2));
    TH_OK(dt_trainer_save(tr, mid, NULL));
    TH_OK(steps(tr, rank, W, 2, 4));
    TH_OK(dt_trainer_save(tr, a, NULL));
    dt_trainer_free(tr);
    dt_model_free(m);
    /* resumed: a fresh run loads step 2 and trains to 4 */
    TH_OK(make(pg, c->k, c->dt, &m, &tr));
    dt_trainer_resume_info ri;
    TH_OK(dt_trainer_load(tr, mid, &ri));
    TH_CHECK(dt_trainer_steps(tr) == 2, "steps %lld after the load", (long long)dt_trainer_steps(tr));
    TH_OK(steps(tr, rank, W, 2, 4));
    TH_OK(dt_trainer_save(tr, b, NULL));
    dt_trainer_free(tr);
    dt_model_free(m);
    if (rank == 0) {
        char pa[500], pb[500];
        snprintf(pa, sizeof pa, "%s/step-00000004", a);
        snprintf(pb, sizeof pb, "%s/step-00000004", b);
        if (t_same_ckpt(pa, pb, true) < 0)
            return 1;
    }
    dt_pg_free(pg);
    return 0;
}

TEST(zero_bf16_resume_exact)
{
    const kind ks[] = {K_Z1, K_Z2, K_Z3};
    for (int i = 0; i < 3; i++) {
        rcase c = {.k = ks[i], .dt = DT_BF16};
        snprintf(c.dir, sizeof c.dir, "%s/resume%d", tmpdir(), i);
        ASSERT(mkdir(c.dir, 0755) == 0);
        int rc = th_run(2, 60.0, body_resume, &c, NULL);
        if (rc)
            fprintf(stderr, "stage %d failed\n", (int)ks[i] - K_Z1 + 1);
        ASSERT_EQ_INT(rc, 0);
    }
    rcase c = {.k = K_Z3, .dt = DT_F32};
    snprintf(c.dir, sizeof c.dir, "%s/resume_f32", tmpdir());
    ASSERT(mkdir(c.dir, 0755) == 0);
    ASSERT_EQ_INT(th_run(3, 60.0, body_resume, &c, NULL), 0);
}

/* ---- resharding through training --------------------------------------------------------- */

typedef struct {
    kind k;
    const char *from;    /* checkpoint to load (NULL: start fresh) */
    char again[400];     /* save right after the load */
    char out[400];       /* save after training */
    int step0;           /* the steps already taken */
} hop;

static int body_hop(int rank, int W, void *arg)
{
    const hop *h = arg;
    dt_set_num_threads(1);
    dt_pg *pg = NULL;
    if (h->k != K_NONE)
        TH_OK(th_pg(rank, W, NULL, &pg));
    dt_model *m;
    dt_trainer *tr;
    TH_OK(make(pg, h->k, DT_BF16, &m, &tr));
    if (h->from) {
        TH_OK(dt_trainer_load(tr, h->from, NULL));
        TH_OK(dt_trainer_save(tr, h->again, NULL));
    }
    TH_OK(steps(tr, rank, W, h->step0, h->step0 + 2));
    TH_OK(dt_trainer_save(tr, h->out, NULL));
    dt_trainer_free(tr);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

static void run_hop(hop *h, int W, const char *from, const char *name, int step0)
{
    h->from = from;
    h->step0 = step0;
    snprintf(h->again, sizeof h->again, "%s/%s_again", tmpdir(), name);
    snprintf(h->out, sizeof h->out, "%s/%s", tmpdir(), name);
    int rc = h->k == K_NONE ? body_hop(0, 1, h) : th_run(W, 60.0, body_hop, h, NULL);
    if (rc)
        fprintf(stderr, "hop %s (W %d) failed\n", name, W);
    ASSERT_EQ_INT(rc, 0);
    if (from) { /* the state loaded is the state saved: every tensor */
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/step-%08d", from, step0);
        snprintf(b, sizeof b, "%s/step-%08d", h->again, step0);
        ASSERT(t_same_ckpt(a, b, true) >= 0);
    }
}

TEST(reshard_zero3_ddp_one_back)
{
    hop z3 = {.k = K_Z3}, ddp = {.k = K_DDP}, one = {.k = K_NONE}, back = {.k = K_Z3}, z1 = {.k = K_Z1};
    run_hop(&z3, 4, NULL, "z3w4", 0);
    run_hop(&ddp, 2, z3.out, "ddpw2", 2);
    run_hop(&one, 1, ddp.out, "one", 4);
    run_hop(&back, 4, one.out, "z3w4back", 6);
    run_hop(&z1, 3, back.out, "z1w3", 8);
}

/* ---- dtype conversion ---------------------------------------------------------------------- */

TEST(bf16_checkpoint_into_f32_and_back)
{
    char c16[400], c32[400], back[400], ref[400], cont[400];
    snprintf(c16, sizeof c16, "%s/c16", tmpdir());
    snprintf(c32, sizeof c32, "%s/c32", tmpdir());
    snprintf(back, sizeof back, "%s/back", tmpdir());
    snprintf(ref, sizeof ref, "%s/ref", tmpdir());
    snprintf(cont, sizeof cont, "%s/cont", tmpdir());
    dt_model *m16, *m32, *mb;
    dt_trainer *t16, *t32, *tb;
    ASSERT_OK(make(NULL, K_NONE, DT_BF16, &m16, &t16));
    ASSERT_OK(steps(t16, 0, 1, 0, 2));
    ASSERT_OK(dt_trainer_save(t16, c16, NULL));
    /* f32: its parameters are the saved fp32 masters */
    ASSERT_OK(make(NULL, K_NONE, DT_F32, &m32, &t32));
    ASSERT_OK(dt_trainer_load(t32, c16, NULL));
    for (size_t i = 0; i < dt_model_num_entries(m32); i++) {
        dt_param_info e, e16;
        dt_model_entry(m32, i, &e);
        dt_model_entry(m16, i, &e16);
        if (e.is_buffer)
            continue;
        float want[256];
        dt_ckpt *ck;
        char p[500];
        snprintf(p, sizeof p, "%s/step-00000002", c16);
        ASSERT_OK(dt_ckpt_open(p, &ck));
        char name[300];
        snprintf(name, sizeof name, "master.%s", e.name);
        int64_t k = dt_ckpt_find(ck, name);
        ASSERT(k >= 0 && e.numel <= 256);
        ASSERT_OK(dt_ckpt_read(ck, (size_t)k, 0, e.numel, want, true));
        dt_ckpt_close(ck);
        ASSERT(!memcmp(dt_flat_ptr(dt_model_flat(m32, DT_FLAT_PARAMS, DT_F32), e.offset), want, e.numel * 4));
        /* and the bf16 parameter is that value rounded */
        uint16_t r[256];
        dt_k_convert(want, DT_F32, r, DT_BF16, (int64_t)e.numel);
        ASSERT(!memcmp(dt_flat_ptr(dt_model_flat(m16, DT_FLAT_PARAMS, DT_BF16), e16.offset), r, e.numel * 2));
    }
    ASSERT_OK(dt_trainer_save(t32, c32, NULL));
    /* back into bf16: the same parameters, masters and moments as c16 ... */
    ASSERT_OK(make(NULL, K_NONE, DT_BF16, &mb, &tb));
    ASSERT_OK(dt_trainer_load(tb, c32, NULL));
    ASSERT_OK(dt_trainer_save(tb, back, NULL));
    char a[500], b[500];
    snprintf(a, sizeof a, "%s/step-00000002", c16);
    snprintf(b, sizeof b, "%s/step-00000002", back);
    ASSERT(t_same_ckpt(a, b, true) >= 0);
    /* ... so training on equals training on from the bf16 run itself */
    ASSERT_OK(steps(t16, 0, 1, 2, 4));
    ASSERT_OK(steps(tb, 0, 1, 2, 4));
    ASSERT_OK(dt_trainer_save(t16, ref, NULL));
    ASSERT_OK(dt_trainer_save(tb, cont, NULL));
    snprintf(a, sizeof a, "%s/step-00000004", ref);
    snprintf(b, sizeof b, "%s/step-00000004", cont);
    ASSERT(t_same_ckpt(a, b, true) >= 0);
    dt_trainer_free(t16);
    dt_trainer_free(t32);
    dt_trainer_free(tb);
    dt_model_free(m16);
    dt_model_free(m32);
    dt_model_free(mb);
}

int main(void)
{
    if (!tmpdir()[0]) {
        fprintf(stderr, "no temporary directory\n");
        return 1;
    }
    RUN(zero_bf16_resume_exact);
    RUN(reshard_zero3_ddp_one_back);
    RUN(bf16_checkpoint_into_f32_and_back);
    t_rm_rf(tmpdir());
    return TEST_REPORT();
}
