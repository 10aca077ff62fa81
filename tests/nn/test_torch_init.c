/* `--rng torch` on GPT-2 and Llama: dt_model_init_torch gives the weights
 * transformers' GPT2LMHeadModel(config) and LlamaForCausalLM(config) have
 * after torch.manual_seed(0), as tests/data/torch_init/goldens.txt records
 * them (scripts/make_init_goldens.py: per parameter its first three and
 * last two values and its sum). The draws follow transformers' order:
 * the constructors' defaults (Embedding N(0, 1), Conv1D N(0, 0.02), Linear
 * kaiming) drawn and dropped, then the model's init (GPT-2's residual
 * projections twice). Before that order was kept, dtrain drew each
 * parameter once in entry order: every GPT-2 and Llama weight differed
 * (the step-1 loss of gpt-micro 8.3258 against PyTorch's 8.3373).
 * dt_model_init_range on a meta model walks the same draws: its shards
 * equal the full model's. */
#include "dtrain/base.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/precision.h"
#include "model_util.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDENS DT_SOURCE_DIR "/tests/data/torch_init/goldens.txt"

static bool close_ulps(float got, double want, float ulps)
{
    float w = (float)want;
    float tol = ulps * (nextafterf(fabsf(w), INFINITY) - fabsf(w));
    return fabsf(got - w) <= tol;
}

/* Checks every golden line of `name_case` against m; the number of lines
 * (0 when the file has no such case) into *n. */
static void check_case(dt_model *m, const char *name_case, int *n)
{
    *n = 0;
    FILE *f = fopen(GOLDENS, "r");
    ASSERT(f);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char c[32], name[160];
        unsigned long long numel;
        double v[5], sum;
        if (line[0] == '#')
            continue;
        ASSERT_EQ_INT(sscanf(line, "%31s %159s %llu %lf %lf %lf %lf %lf %lf", c, name, &numel, &v[0], &v[1], &v[2],
                             &v[3], &v[4], &sum), 9);
        if (strcmp(c, name_case))
            continue;
        ++*n;
        int64_t i = dt_model_find_entry(m, name);
        if (i < 0) {
            TEST_FAIL_("%s: no entry '%s'", name_case, name);
            break;
        }
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, (size_t)i, &p));
        ASSERT_EQ_U64(p.numel, numel);
        const float *x = p.tensor->data;
        const float got[5] = {x[0], x[1], x[2], x[p.numel - 2], x[p.numel - 1]};
        double s = 0;
        for (size_t k = 0; k < p.numel; k++)
            s += x[k];
        bool ok = fabs(s - sum) <= 1e-6 + 1e-6 * fabs(sum);
        for (int k = 0; k < 5; k++)
            ok = ok && close_ulps(got[k], v[k], 4); /* torch 2.x's vectorised log/sin/cos round on their own */
        if (!ok) {
            TEST_FAIL_("%s '%s': got %.9g %.9g %.9g .. %.9g %.9g sum %.9g, torch %.9g %.9g %.9g .. %.9g %.9g sum %.9g",
                       name_case, name, (double)got[0], (double)got[1], (double)got[2], (double)got[3],
                       (double)got[4], s, v[0], v[1], v[2], v[3], v[4], sum);
            break;
        }
    }
    fclose(f);
}

/* The untied entries of m: what named_parameters lists. */
static int untied_entries(const dt_model *m)
{
    int n = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        if (dt_model_entry(m, i, &p) == DT_OK && !p.is_buffer && p.tied_to < 0)
            n++;
    }
    return n;
}

/* A meta model of the same build, its parameter flat drawn by
 * dt_model_init_range(DT_INIT_TORCH) in two halves, equals m's flat. */
static void range_matches(dt_model *m, dt_model *mm)
{
    const dt_flat *f = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    for (int r = 0; r < 2; r++) {
        dt_flat sh;
        ASSERT_OK(dt_flat_alloc_shard(&sh, dt_model_flat(mm, DT_FLAT_PARAMS, DT_F32), r, 2, NULL));
        memset(sh.base, 0x7f, dt_flat_nbytes(&sh));
        ASSERT_OK(dt_model_init_range(mm, DT_INIT_TORCH, 0, &sh));
        size_t n = sh.offset + sh.numel <= f->total ? sh.numel : f->total - sh.offset;
        ASSERT(memcmp(sh.base, dt_flat_ptr(f, sh.offset), n * sizeof(float)) == 0);
        dt_flat_free(&sh);
    }
}

TEST(gpt2_starts_from_transformers_weights)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.n_layer = 3;
    cfg.vocab_size = 300;
    dt_model *m = t_create("gpt-micro", 7, &cfg);
    ASSERT(m);
    ASSERT_OK(dt_model_init_torch(m, 0));
    int n;
    check_case(m, "gpt", &n);
    ASSERT_EQ_INT(n, untied_entries(m));
    cfg.build.meta = true;
    dt_model *mm = t_create("gpt-micro", 7, &cfg);
    ASSERT(mm);
    range_matches(m, mm);
    dt_model_free(mm);
    dt_model_free(m);
}

/* llama-tiny as the case's transformers model: untied (llama), tied with
 * every bias (llama_bias), Qwen2's shape: tied, q/k/v biases only, or
 * Phi-3's: one qkv_proj and one gate_up_proj, drawn in its constructors'
 * order (o_proj first); pad >= 0: tied, that pad_token_id (llama_pad: the
 * padding row starts at zero). */
static void config_case(const char *name_case, const dt_llama_config *c);

static void llama_case(const char *name_case, bool tied_with_biases, bool qwen2, bool phi3, int64_t pad)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.has_pad_token = pad >= 0;
    c.pad_token_id = pad;
    c.tie_word_embeddings = tied_with_biases || qwen2 || pad >= 0;
    c.attention_bias = tied_with_biases || qwen2;
    c.qkv_bias_only = qwen2;
    c.mlp_bias = tied_with_biases;
    c.fused = phi3;
    config_case(name_case, &c);
}

/* The case's transformers model built from c (dt_llama_create), drawn with
 * torch's stream; a meta build's ranges the same. */
static void config_case(const char *name_case, const dt_llama_config *cp)
{
    const dt_llama_config c = *cp;
    dt_model *m, *mm;
    ASSERT_OK(dt_llama_create(&c, 7, NULL, &m, NULL));
    ASSERT_OK(dt_model_init_torch(m, 0));
    int n;
    check_case(m, name_case, &n);
    ASSERT_EQ_INT(n, untied_entries(m));
    dt_model_config mc = dt_model_config_default();
    mc.build.meta = true;
    ASSERT_OK(dt_llama_create(&c, 7, &mc, &mm, NULL));
    range_matches(m, mm);
    dt_model_free(mm);
    dt_model_free(m);
}

TEST(llama_starts_from_transformers_weights) { llama_case("llama", false, false, false, -1); }
TEST(llama_tied_with_biases_starts_from_transformers_weights) { llama_case("llama_bias", true, false, false, -1); }
TEST(qwen2_starts_from_transformers_weights) { llama_case("qwen2", false, true, false, -1); }
TEST(phi3_starts_from_transformers_weights) { llama_case("phi3", false, false, true, -1); }
TEST(llama_padding_row_starts_from_transformers_weights) { llama_case("llama_pad", false, false, false, 0); }

/* Gemma 2 (tied, pad_token_id 0, its four norms a layer at 0), Gemma 3
 * (Gemma 2's with q_norm/k_norm over each head at 0, two RoPE bases) and
 * OLMo 2 (untied, pad_token_id 1, whole-projection q_norm/k_norm at 1): the
 * same draws as Llama's (their norms draw nothing), in their constructors'
 * order */
TEST(gemma2_gemma3_and_olmo2_start_from_transformers_weights)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.gemma = c.gemma2 = true;
    c.tie_word_embeddings = c.has_pad_token = true;
    c.pad_token_id = 0;
    c.query_pre_attn_scalar = 256, c.attn_logit_softcapping = 50, c.final_logit_softcapping = 30;
    config_case("gemma2", &c);
    c.qk_norm = true; /* Gemma3TextConfig's: no soft caps, every sixth layer full, two bases */
    c.attn_logit_softcapping = c.final_logit_softcapping = 0;
    c.sliding_window = 4096, c.rope_theta = 1e6, c.rope_local_theta = 1e4;
    config_case("gemma3", &c);
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    c.olmo2 = true;
    c.has_pad_token = true;
    c.pad_token_id = 1;
    config_case("olmo2", &c);
}

/* dt_module_set_param_padding_row: the row is zero after every init (Philox
 * at build and through dt_model_init_range on shards that cut the row,
 * torch's stream), every other value is the unpadded build's; its checks. */
TEST(padding_row_is_zero_after_init)
{
    const int64_t V = 9, C = 5, row = 4;
    for (int torch = 0; torch < 2; torch++) {
        dt_module *e = dt_nn_embedding(V, C), *ref = dt_nn_embedding(V, C);
        ASSERT(e && ref);
        ASSERT_OK(dt_module_set_param_padding_row(e, 0, row));
        dt_model *m = t_build(e, 11), *r = t_build(ref, 11);
        ASSERT(m && r);
        if (torch) {
            ASSERT_OK(dt_model_init_torch(m, 3));
            ASSERT_OK(dt_model_init_torch(r, 3));
        }
        dt_param_info p, q;
        ASSERT_OK(dt_model_entry(m, 0, &p));
        ASSERT_OK(dt_model_entry(r, 0, &q));
        const float *x = p.tensor->data, *y = q.tensor->data;
        for (int64_t i = 0; i < V * C; i++)
            ASSERT(i / C == row ? x[i] == 0.0f : x[i] == y[i] && y[i] != 0.0f);
        /* shards of 7 elements: the row [20, 25) lies across two of them */
        const dt_flat *f = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
        for (size_t lo = 0; lo < (size_t)(V * C); lo += 7) {
            float buf[7];
            dt_flat sh;
            size_t n = lo + 7 <= (size_t)(V * C) ? 7 : (size_t)(V * C) - lo;
            ASSERT_OK(dt_flat_wrap(&sh, DT_F32, buf, n));
            sh.offset = lo;
            ASSERT_OK(dt_model_init_range(m, torch ? DT_INIT_TORCH : DT_INIT_PHILOX, torch ? 3 : 11, &sh));
            ASSERT(memcmp(buf, dt_flat_ptr(f, lo), n * sizeof(float)) == 0);
        }
        dt_model_free(m);
        dt_model_free(r);
    }
    dt_module *e = dt_nn_embedding(V, C);
    ASSERT(e);
    ASSERT_STATUS(dt_module_set_param_padding_row(e, 0, V), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "row 9 is outside [0, 9)");
    ASSERT_STATUS(dt_module_set_param_padding_row(e, 1, 0), DT_ERR_RANGE);
    ASSERT_STATUS(dt_module_set_param_padding_row(NULL, 0, 0), DT_ERR_NULL);
    ASSERT_OK(dt_module_set_param_padding_row(e, 0, 2));
    ASSERT_OK(dt_module_set_param_padding_row(e, 0, -1)); /* none again */
    dt_nn_param_spec sp;
    ASSERT_OK(dt_module_param_spec(e, 0, &sp));
    ASSERT(!sp.has_padding_row);
    dt_model *m = t_build(e, 1);
    ASSERT(m);
    ASSERT_STATUS(dt_module_set_param_padding_row(e, 0, 1), DT_ERR_STATE);
    dt_model_free(m);
}

/* dt_model_build_params.init DT_INIT_TORCH: the build leaves the random
 * parameters zero (constant inits written: the norms' ones) and draws no
 * Philox value; dt_model_create with it draws torch's stream once, the
 * same values as a Philox build redrawn by dt_model_init_torch. An unknown
 * generator is refused. */
TEST(build_leaves_random_init_to_torch)
{
    dt_llama_config c;
    ASSERT_OK(dt_llama_config_by_name("llama-tiny", &c));
    dt_model_config mc = dt_model_config_default();
    mc.build.init = DT_INIT_TORCH;
    dt_model *m, *ref;
    ASSERT_OK(dt_llama_create(&c, 7, &mc, &m, NULL));
    ASSERT_OK(dt_llama_create(&c, 7, NULL, &ref, NULL));
    int zero = 0, ones = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p, q;
        ASSERT_OK(dt_model_entry(m, i, &p));
        ASSERT_OK(dt_model_entry(ref, i, &q));
        if (p.is_buffer || p.tied_to >= 0)
            continue;
        const float *x = p.tensor->data, *y = q.tensor->data;
        size_t nz = 0, same = 0;
        for (size_t k = 0; k < p.numel; k++)
            nz += x[k] != 0.0f, same += x[k] == y[k];
        if (strstr(p.name, "norm")) { /* ones in both builds */
            ASSERT_EQ_U64(same, p.numel);
            ones++;
        } else {
            ASSERT_EQ_U64(nz, 0);
            zero++;
        }
    }
    ASSERT(zero >= 4 && ones >= 2);
    ASSERT_OK(dt_model_init_torch(m, 3));
    ASSERT_OK(dt_model_init_torch(ref, 3));
    const dt_flat *a = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), *b = dt_model_flat(ref, DT_FLAT_PARAMS, DT_F32);
    ASSERT_EQ_U64(a->total, b->total);
    ASSERT(memcmp(a->base, b->base, dt_flat_nbytes(a)) == 0);
    dt_model_free(m);
    dt_model_free(ref);

    dt_model_config cfg = dt_model_config_default();
    cfg.n_layer = 2;
    cfg.vocab_size = 300;
    ASSERT_OK(dt_model_create("gpt-micro", 5, &cfg, &ref, NULL));
    ASSERT_OK(dt_model_init_torch(ref, 5));
    cfg.build.init = DT_INIT_TORCH;
    ASSERT_OK(dt_model_create("gpt-micro", 5, &cfg, &m, NULL));
    a = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32), b = dt_model_flat(ref, DT_FLAT_PARAMS, DT_F32);
    ASSERT(memcmp(a->base, b->base, dt_flat_nbytes(a)) == 0);
    dt_model_free(m);
    dt_model_free(ref);
    cfg.build.init = (dt_init_rng)7;
    ASSERT_STATUS(dt_model_create("gpt-micro", 5, &cfg, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "init generator 7");
}

/* dt_model_set_torch_init's checks name the entry. */
TEST(torch_init_recipe_checks)
{
    dt_model *m = t_build(dt_nn_embedding(7, 3), 5);
    ASSERT(m);
    dt_torch_draw d = {.entry = 3, .init = DT_NN_INIT_NORMAL, .a = 1.0f, .keep = true};
    ASSERT_STATUS(dt_model_set_torch_init(m, &d, 1), DT_ERR_INVALID_ARG);
    d.entry = 0;
    d.init = DT_NN_INIT_ONES;
    ASSERT_STATUS(dt_model_set_torch_init(m, &d, 1), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "'weight'");
    d.init = DT_NN_INIT_NORMAL;
    d.a = NAN;
    ASSERT_STATUS(dt_model_set_torch_init(m, &d, 1), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_model_set_torch_init(NULL, &d, 1), DT_ERR_NULL);
    ASSERT_STATUS(dt_model_set_torch_init(m, NULL, 1), DT_ERR_NULL);
    /* a dropped draw first, then the kept one: torch's two normal_ calls */
    dt_torch_draw two[2] = {{.entry = 0, .init = DT_NN_INIT_NORMAL, .a = 1.0f},
                            {.entry = 0, .init = DT_NN_INIT_NORMAL, .a = 0.5f, .keep = true}};
    ASSERT_OK(dt_model_set_torch_init(m, two, 2));
    ASSERT_OK(dt_model_init_torch(m, 1));
    dt_torch_rng g;
    dt_torch_rng_seed(&g, 1);
    float want[21];
    dt_torch_rng_normal(&g, want, 21, 0.0, 1.0);
    dt_torch_rng_normal(&g, want, 21, 0.0, 0.5);
    dt_param_info p;
    ASSERT_OK(dt_model_entry(m, 0, &p));
    ASSERT(memcmp(p.tensor->data, want, sizeof want) == 0);
    /* n 0: the default again (one draw per entry) */
    ASSERT_OK(dt_model_set_torch_init(m, NULL, 0));
    ASSERT_OK(dt_model_init_torch(m, 1));
    dt_torch_rng_seed(&g, 1);
    dt_torch_rng_normal(&g, want, 21, 0.0, 1.0);
    ASSERT(memcmp(p.tensor->data, want, sizeof want) == 0);
    dt_model_free(m);
}

int main(void)
{
    RUN(gpt2_starts_from_transformers_weights);
    RUN(llama_starts_from_transformers_weights);
    RUN(llama_tied_with_biases_starts_from_transformers_weights);
    RUN(qwen2_starts_from_transformers_weights);
    RUN(phi3_starts_from_transformers_weights);
    RUN(llama_padding_row_starts_from_transformers_weights);
    RUN(gemma2_gemma3_and_olmo2_start_from_transformers_weights);
    RUN(padding_row_is_zero_after_init);
    RUN(build_leaves_random_init_to_torch);
    RUN(torch_init_recipe_checks);
    return TEST_REPORT();
}
