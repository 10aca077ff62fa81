/* The tensor-parallel Llama decoder (models/llama.c with
 * dt_model_config.tp) against the single-process model: q/k/v and
 * gate/up column-parallel, o and down row-parallel in the [out, in]
 * layout, the key/value heads of grouped-query attention divided over the
 * ranks, Qwen2's q/k/v biases split with their layer, an MLP bias (the
 * row-parallel down_proj's whole), and the vocabulary split with padding
 * (51 tokens: 26 rows a rank on 2, 13 on 4). At step 0 every slice is
 * exactly the single-process tensor; the SGD loss curve agrees within
 * relative 2e-6 (each value a sum of O(C) products added in another
 * order, as for the GPT in test_tp_gpt.c) and the weights after the steps
 * within 1e-5 relative (SGD: the key bias's gradient is zero up to rounding,
 * softmax ignoring a shift, which Adam would scale to a full step). 2 ranks: H 4, KV 2 (each rank one kv head for two
 * query heads); 4 ranks: H 8, KV 4. A size that does not divide the heads
 * is refused naming the key. */
// dt-test-timeout: 120
#include "test.h"
#include "parallel/tp_util.h"

enum { L_B = 2, L_T = 8, L_V = 51, L_STEPS = 3 };

static dt_llama_config config(int H, int KV)
{
    dt_llama_config c = {.vocab_size = L_V, .hidden_size = 32, .intermediate_size = 48, .num_hidden_layers = 2,
                         .num_attention_heads = H, .num_key_value_heads = KV, .head_dim = 6,
                         .max_position_embeddings = 16, .rms_norm_eps = 1e-5f, .initializer_range = 0.1f,
                         .rope_theta = 10000.0, .rope_type = DT_ROPE_LINEAR, .rope_factor = 2.0,
                         .attention_bias = true, .qkv_bias_only = true, .mlp_bias = true};
    return c;
}

static int llama_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    const dt_llama_config lc = config(2 * size, size);
    dt_model_config c = dt_model_config_default();
    c.seq = L_T;
    dt_model *ref, *m;
    dt_model_desc dr, dm;
    TH_OK(dt_llama_create(&lc, 5, &c, &ref, &dr));
    c.tp = pg;
    TH_OK(dt_llama_create(&lc, 5, &c, &m, &dm));
    dm.tp = pg; /* dt_model_create's part: the vocabulary-parallel loss */
    TH_CHECK(dt_tp_model_group(m) == pg, "the model's group");
    TH_OK(dt_tp_init_from(m, pg, ref, DT_INIT_PHILOX, 5));
    char worst[128] = "";
    double ex;
    TH_CHECK(slice_diff(m, ref, rank, NULL, worst, &ex) == 0.0, "step 0 differs: %s", worst);
    /* the biases are there and split: q_proj's holds the rank's H/t heads */
    int64_t j = dt_model_find_entry(m, "model.layers.0.self_attn.q_proj.bias");
    dt_param_info pb;
    TH_CHECK(j >= 0 && dt_model_entry(m, (size_t)j, &pb) == DT_OK && pb.shape[0] == 2 * 6 && pb.tp_dim == 1,
             "q_proj.bias: the rank's 2 heads of 6");
    TH_CHECK(dt_model_find_entry(m, "model.layers.0.self_attn.o_proj.bias") < 0, "o_proj has no bias (Qwen2)");
    dt_trainer *tr, *trr;
    TH_OK(make_sgd(ref, &dr, 0.2, &trr));
    TH_OK(make_sgd(m, &dm, 0.2, &tr));
    int64_t x[L_B * L_T], y[L_B * L_T];
    double first = 0, last = 0;
    for (int k = 0; k < L_STEPS; k++) {
        for (int i = 0; i < L_B * L_T; i++) {
            x[i] = (i * 7 + 3 + k) % L_V;
            y[i] = (i * 5 + 1) % L_V;
        }
        dt_trainer_batch b = dt_trainer_batch_make(x, DT_I64, 2, (int64_t[]){L_B, L_T}, y, DT_I64, 2,
                                                   (int64_t[]){L_B, L_T});
        dt_trainer_metrics a, e;
        TH_OK(dt_trainer_step(trr, &b, 1, &e));
        TH_OK(dt_trainer_step(tr, &b, 1, &a));
        TH_CHECK(fabs(a.loss - e.loss) <= 2e-6 * fabs(e.loss), "step %d: loss %.9g, single process %.9g", k, a.loss,
                 e.loss);
        if (k == 0)
            first = e.loss;
        last = e.loss;
    }
    TH_CHECK(fabs(last - first) > 1e-3, "the loss did not move (%.6g -> %.6g): the comparison shows nothing", first,
             last);
    double tol[2] = {1e-5, 1e-6};
    double dk = slice_diff(m, ref, rank, tol, worst, &ex);
    TH_CHECK(ex == 0.0, "weights after %d steps: %s", L_STEPS, worst);
    if (rank == 0)
        fprintf(stderr, "tp llama on %d ranks: loss %.6f -> %.6f as one process; max |w_tp - w_1| %.3g\n", size,
                first, last, dk);
    dt_trainer_free(tr);
    dt_trainer_free(trr);
    dt_model_free(m);
    dt_model_free(ref);
    dt_pg_free(pg);
    return 0;
}

TEST(tp_llama_loss_curve)
{
    ASSERT_EQ_INT(th_run(2, 60, llama_body, NULL, NULL), 0);
    ASSERT_EQ_INT(th_run(4, 60, llama_body, NULL, NULL), 0);
}

/* 4 ranks, 2 kv heads: refused before anything is built, naming the key */
static int refuse_body(int rank, int size, void *arg)
{
    (void)arg;
    dt_pg *pg;
    TH_OK(th_pg(rank, size, NULL, &pg));
    dt_llama_config lc = config(4, 2);
    dt_model_config c = dt_model_config_default();
    c.tp = pg;
    dt_model *m = NULL;
    TH_CHECK(dt_llama_create(&lc, 5, &c, &m, NULL) == DT_ERR_INVALID_ARG && !m, "KV 2 over 4 ranks accepted");
    TH_CHECK(strstr(dt_last_error(), "num_key_value_heads 2") && strstr(dt_last_error(), "tensor-parallel size 4"),
             "message: %s", dt_last_error());
    lc = config(6, 6);
    TH_CHECK(dt_llama_create(&lc, 5, &c, &m, NULL) == DT_ERR_INVALID_ARG && !m, "H 6 over 4 ranks accepted");
    TH_CHECK(strstr(dt_last_error(), "num_attention_heads 6"), "message: %s", dt_last_error());
    dt_pg_free(pg);
    return 0;
}

TEST(tp_llama_refuses_heads_it_cannot_divide) { ASSERT_EQ_INT(th_run(4, 60, refuse_body, NULL, NULL), 0); }

int main(void)
{
    RUN(tp_llama_loss_curve);
    RUN(tp_llama_refuses_heads_it_cannot_divide);
    return TEST_REPORT();
}
