/* The tensor-parallel GPT-2 (models/gpt2.c with dt_model_config.tp) on 2
 * and 4 ranks against the single-process model: exactly its weights at
 * step 0 (every slice, the c_attn q|k|v chunks and the padded vocabulary
 * included: 50 tokens over 4 ranks is 13 rows a rank, 2 of padding), the
 * same SGD loss curve within float rounding (relative 2e-6: each forward
 * value is a sum of O(C) products that tensor parallelism adds in another
 * order), and the weights after the steps within 1e-5 relative. */
// dt-test-timeout: 120
#include "test.h"
#include "parallel/tp_util.h"

/* ---- the GPT -------------------------------------------------------------------------------------- */

enum { G_STEPS = 3 };

static int gpt_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_model_config c;
    gpt_config(&c);
    dt_model *ref, *m;
    dt_model_desc dr, dm;
    TH_OK(dt_model_create("gpt-micro", 3, &c, &ref, &dr));
    c.tp = pg;
    TH_OK(dt_model_create("gpt-micro", 3, &c, &m, &dm));
    TH_CHECK(dm.tp == pg && dr.tp == NULL, "descriptor's group");
    char worst[128] = "";
    double ex;
    TH_CHECK(slice_diff(m, ref, rank, NULL, worst, &ex) == 0.0, "step 0 differs: %s", worst);
    dt_trainer *tr, *trr;
    TH_OK(make_sgd(ref, &dr, 0.2, &trr));
    TH_OK(make_sgd(m, &dm, 0.2, &tr));
    int64_t x[G_B * G_T], y[G_B * G_T];
    double first = 0, last = 0;
    for (int k = 0; k < G_STEPS; k++) {
        for (int i = 0; i < G_B * G_T; i++) {
            x[i] = (i * 7 + 3) % G_V; /* the same batch each step: the loss must go down */
            y[i] = (i * 5 + 1) % G_V;
        }
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){G_B, G_T}, y, DT_I64, 2,
                                                   (int64_t[]){G_B, G_T});
        dt_trainer_metrics a, e;
        TH_OK(dt_trainer_step(trr, &b, 1, &e));
        TH_OK(dt_trainer_step(tr, &b, 1, &a));
        /* the loss ~ log V ~ 4; every term is a sum of O(C) products reordered: float rounding */
        TH_CHECK(fabs(a.loss - e.loss) <= 2e-6 * fabs(e.loss), "step %d: loss %.9g, single process %.9g", k, a.loss,
                 e.loss);
        if (k == 0)
            first = e.loss;
        last = e.loss;
    }
    TH_CHECK(last < first - 1e-3, "the loss did not go down (%.6g -> %.6g): the comparison shows nothing", first,
             last);
    double tol[2] = {1e-5, 1e-6};
    double dk = slice_diff(m, ref, rank, tol, worst, &ex);
    TH_CHECK(ex == 0.0, "weights after %d steps: %s", G_STEPS, worst);
    if (rank == 0)
        fprintf(stderr, "tp gpt on %d ranks: loss %.6f -> %.6f as one process; max |w_tp - w_1| %.3g\n", size, first,
                last, dk);
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_gpt_loss_curve)
{
    ASSERT_EQ_INT(th_run(2, 60, gpt_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(4, 60, gpt_body, NULL, NULL), 0);
}

int main(void)
{
    RUN(tp_gpt_loss_curve);
    return TEST_REPORT();
}
