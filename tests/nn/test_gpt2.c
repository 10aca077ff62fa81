/* GPT-2 in the zoo: Hugging Face names and shapes, the parameter counts of
 * SEMANTICS.md 15.1 for all four OpenAI sizes (meta builds, no memory),
 * nanoGPT's initialisation statistics, the forward's shapes and its loss at
 * init (about ln V), bad inputs, the block type the wrap policies select,
 * and activation checkpointing: gradients with and without, with dropout
 * on, are bit-identical, and the RNG stream around the region is left as
 * it was. */
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "test.h"

#include <math.h>
#include <string.h>

static dt_status make(const char *name, dt_model_config *c, dt_model **m, dt_model_desc *d)
{
    return dt_model_create(name, 1234, c, m, d);
}

TEST(param_counts_all_sizes)
{
    const char *names[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
    const size_t want[] = {124439808u, 354823168u, 774030080u, 1557611200u};
    for (int i = 0; i < 4; i++) {
        dt_model_config c = dt_model_config_default();
        c.build.meta = true;
        dt_model *m = NULL;
        ASSERT_OK(make(names[i], &c, &m, NULL));
        ASSERT_EQ_U64(dt_model_param_count(m), want[i]);
        dt_model_free(m);
    }
}

TEST(hf_names_and_shapes)
{
    dt_model_config c = dt_model_config_default();
    c.build.meta = true;
    dt_model *m = NULL;
    ASSERT_OK(make("gpt2", &c, &m, NULL));
    struct {
        const char *name;
        int64_t a, b;
    } want[] = {
        {"transformer.wte.weight", 50257, 768},
        {"transformer.wpe.weight", 1024, 768},
        {"transformer.h.0.ln_1.weight", 768, 0},
        {"transformer.h.0.attn.c_attn.weight", 768, 2304},
        {"transformer.h.0.attn.c_attn.bias", 2304, 0},
        {"transformer.h.0.attn.c_proj.weight", 768, 768},
        {"transformer.h.11.mlp.c_fc.weight", 768, 3072},
        {"transformer.h.11.mlp.c_proj.weight", 3072, 768},
        {"transformer.h.11.ln_2.bias", 768, 0},
        {"transformer.ln_f.weight", 768, 0},
        {"lm_head.weight", 50257, 768},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t e = dt_model_find_entry(m, want[i].name);
        if (e < 0)
            fprintf(stderr, "missing %s\n", want[i].name);
        ASSERT(e >= 0);
        dt_param_info p;
        ASSERT_OK(dt_model_entry(m, (size_t)e, &p));
        ASSERT_EQ_INT(p.ndim, want[i].b ? 2 : 1);
        ASSERT_EQ_INT(p.shape[0], want[i].a);
        if (want[i].b)
            ASSERT_EQ_INT(p.shape[1], want[i].b);
    }
    /* the head is the embedding: listed, stored once; 12*16 + 2 + 4 + 1 entries */
    dt_param_info head;
    ASSERT_OK(dt_model_entry(m, (size_t)dt_model_find_entry(m, "lm_head.weight"), &head));
    ASSERT_EQ_INT(head.tied_to, dt_model_find_entry(m, "transformer.wte.weight"));
    ASSERT_EQ_U64(dt_model_num_entries(m), 12 * 12 + 2 + 2 + 1);
    ASSERT_STR_EQ(dt_module_type(dt_model_find_module(m, "transformer.h.3")), "GPT2Block");
    dt_model_free(m);
}

static double stddev(const dt_tensor *t, double *mean)
{
    const float *p = t->data;
    int64_t n = dt_tensor_numel(t);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++)
        s += p[i], s2 += (double)p[i] * p[i];
    *mean = s / (double)n;
    return sqrt(s2 / (double)n - *mean * *mean);
}

static const dt_tensor *param(dt_model *m, const char *name)
{
    dt_param_info p;
    int64_t e = dt_model_find_entry(m, name);
    if (e < 0 || dt_model_entry(m, (size_t)e, &p) < 0)
        return NULL;
    return p.tensor;
}

TEST(init_statistics)
{
    dt_model_config c = dt_model_config_default();
    c.n_layer = 8, c.n_embd = 128, c.n_head = 4, c.block_size = 128, c.vocab_size = 1000;
    dt_model *m = NULL;
    ASSERT_OK(make("gpt-mini", &c, &m, NULL));
    double mean, sd;
    sd = stddev(param(m, "transformer.wte.weight"), &mean);
    ASSERT_NEAR(sd, 0.02, 0.0005, 0);
    sd = stddev(param(m, "transformer.wpe.weight"), &mean);
    ASSERT_NEAR(sd, 0.02, 0.001, 0);
    sd = stddev(param(m, "transformer.h.2.mlp.c_fc.weight"), &mean);
    ASSERT_NEAR(sd, 0.02, 0.0005, 0);
    ASSERT_NEAR(mean, 0.0, 0.0005, 0);
    sd = stddev(param(m, "transformer.h.5.mlp.c_proj.weight"), &mean);
    ASSERT_NEAR(sd, 0.02 / 4.0, 0.0002, 0); /* 1/sqrt(2 * 8) */
    sd = stddev(param(m, "transformer.h.0.attn.c_proj.weight"), &mean);
    ASSERT_NEAR(sd, 0.02 / 4.0, 0.0003, 0);
    sd = stddev(param(m, "transformer.h.1.attn.c_attn.bias"), &mean);
    ASSERT_NEAR(sd, 0.0, 0.0, 0);
    ASSERT_NEAR(mean, 0.0, 0.0, 0);
    sd = stddev(param(m, "transformer.ln_f.weight"), &mean);
    ASSERT_NEAR(mean, 1.0, 0.0, 0);
    dt_model_free(m);
}

/* Tokens of a fixed pattern, targets the next ones. */
static void tokens(int64_t *x, int64_t *y, int64_t B, int64_t T, int64_t V)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            x[b * T + t] = (b * 131 + t * 31 + 7) % V;
            y[b * T + t] = (b * 131 + (t + 1) * 31 + 7) % V;
        }
}

TEST(forward_shapes_and_initial_loss)
{
    dt_model *m = NULL;
    dt_model_desc d;
    ASSERT_OK(make("gpt-micro", NULL, &m, &d));
    ASSERT_EQ_INT(d.input_dtype, DT_I64);
    ASSERT_EQ_INT(d.input_shape[0], 64);
    ASSERT_EQ_INT(d.input_classes, 512);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    int64_t x[3 * 17], y[3 * 17];
    tokens(x, y, 3, 17, 512);
    dt_tensor *xt = dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){3, 17});
    dt_tensor *yt = dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){3, 17});
    dt_tensor *logits = dt_model_forward(ctx, m, xt);
    ASSERT(logits != NULL);
    ASSERT_EQ_INT(logits->ndim, 3);
    ASSERT_EQ_INT(logits->shape[2], 512);
    dt_tensor *loss = dt_model_desc_loss(ctx, &d, logits, yt);
    ASSERT(loss != NULL);
    ASSERT_NEAR(dt_tensor_item(loss), log(512.0), 0.05, 0);
    ASSERT_OK(dt_backward(ctx, loss));
    dt_ctx_reset(ctx);
    /* too long, out-of-range token, wrong dtype */
    int64_t big[65] = {0};
    ASSERT(dt_model_forward(ctx, m, dt_tensor_view_of(ctx, big, DT_I64, 2, (int64_t[]){1, 65})) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "block size");
    x[5] = 512;
    ASSERT(dt_model_forward(ctx, m, dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){3, 17})) == NULL);
    ASSERT_EQ_INT(dt_last_status(), DT_ERR_RANGE);
    float f[4] = {0};
    ASSERT(dt_model_forward(ctx, m, dt_tensor_view_of(ctx, f, DT_F32, 2, (int64_t[]){2, 2})) == NULL);
    ASSERT_STR_CONTAINS(dt_last_error(), "token ids");
    dt_ctx_free(ctx);
    dt_model_free(m);
}

TEST(bad_configs)
{
    dt_model *m = NULL;
    dt_model_config c = dt_model_config_default();
    c.n_head = 3; /* 64 % 3 */
    ASSERT_STATUS(make("gpt-micro", &c, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "multiple of n_head");
    c = dt_model_config_default();
    c.seq = 65;
    ASSERT_STATUS(make("gpt-micro", &c, &m, NULL), DT_ERR_INVALID_ARG);
    c = dt_model_config_default();
    c.dropout = 1.0f;
    ASSERT_STATUS(make("gpt-micro", &c, &m, NULL), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(make("gpt3", NULL, &m, NULL), DT_ERR_NOT_FOUND);
    ASSERT(m == NULL);
}

/* loss and a copy of every gradient after one forward + backward */
static float run_step(dt_model *m, const dt_model_desc *d, float *grads, size_t n)
{
    dt_ctx *ctx;
    if (dt_ctx_init(NULL, &ctx) < 0)
        return NAN;
    int64_t x[2 * 24], y[2 * 24];
    tokens(x, y, 2, 24, 512);
    dt_model_zero_grad(m);
    dt_tensor *loss = dt_model_desc_loss(ctx, d, dt_model_forward(ctx, m, dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){2, 24})),
                                         dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){2, 24}));
    float l = loss ? dt_tensor_item(loss) : NAN;
    if (!loss || dt_backward(ctx, loss) < 0)
        l = NAN;
    const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, DT_F32);
    memcpy(grads, g->base, n * sizeof(float));
    dt_ctx_free(ctx);
    return l;
}

TEST(checkpointing_same_gradients_with_dropout)
{
    dt_model_config c = dt_model_config_default();
    c.dropout = 0.2f;
    dt_model *a = NULL, *b = NULL;
    dt_model_desc d;
    ASSERT_OK(make("gpt-micro", &c, &a, &d));
    ASSERT_OK(make("gpt-micro", &c, &b, NULL));
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    p.profile = true;
    int n = 0;
    ASSERT_OK(dt_model_checkpoint_type(b, "GPT2Block", &p, &n));
    ASSERT_EQ_INT(n, 2);
    size_t numel = dt_model_flat(a, DT_FLAT_GRADS, DT_F32)->numel;
    float *ga = malloc(numel * 4), *gb = malloc(numel * 4);
    for (int step = 0; step < 2; step++) { /* the second step: dropout counters advanced alike */
        float la = run_step(a, &d, ga, numel), lb = run_step(b, &d, gb, numel);
        ASSERT(la == lb);
        ASSERT_EQ_INT(memcmp(ga, gb, numel * 4), 0);
    }
    /* dropout really is on: a third model without dropout differs */
    dt_model *z = NULL;
    ASSERT_OK(make("gpt-micro", NULL, &z, NULL));
    float lz = run_step(z, &d, ga, numel), la2 = run_step(a, &d, gb, numel);
    ASSERT(lz != la2);
    double fs, rs;
    uint64_t regions;
    ASSERT_OK(dt_model_checkpoint_profile(b, &fs, &rs, &regions));
    ASSERT_EQ_U64(regions, 4);
    ASSERT(rs > 0);
    /* number_checkpoints limits the count; partition_activations is not available */
    p.number_checkpoints = 1;
    ASSERT_OK(dt_model_checkpoint_type(b, "GPT2Block", &p, &n));
    ASSERT_EQ_INT(n, 1);
    p.partition_activations = true;
    ASSERT_STATUS(dt_model_checkpoint_type(b, "GPT2Block", &p, &n), DT_ERR_UNSUPPORTED);
    free(ga), free(gb);
    dt_model_free(a), dt_model_free(b), dt_model_free(z);
}

/* Activation memory: the arena's high-water mark of one training step of a
 * 6-block model (B 4, T 64), with and without checkpointing the blocks. The
 * recomputation gives its memory back block by block, so the checkpointed
 * step keeps little more than the blocks' inputs. */
static size_t step_peak(bool ckpt)
{
    dt_model_config c = dt_model_config_default();
    c.n_layer = 6;
    dt_model *m = NULL;
    dt_model_desc d;
    dt_ctx *ctx = NULL;
    size_t peak = 0;
    if (make("gpt-micro", &c, &m, &d) < 0 || dt_ctx_init(NULL, &ctx) < 0)
        goto out;
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    if (ckpt && dt_model_checkpoint_type(m, "GPT2Block", &p, NULL) < 0)
        goto out;
    static int64_t x[4 * 64], y[4 * 64];
    tokens(x, y, 4, 64, 512);
    dt_tensor *loss = dt_model_desc_loss(ctx, &d, dt_model_forward(ctx, m, dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){4, 64})),
                                         dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){4, 64}));
    if (loss && dt_backward(ctx, loss) == DT_OK)
        peak = dt_arena_peak(dt_ctx_arena(ctx));
out:
    dt_ctx_free(ctx);
    dt_model_free(m);
    return peak;
}

TEST(checkpointing_saves_activation_memory)
{
    size_t full = step_peak(false), ck = step_peak(true);
    fprintf(stderr, "arena peak of a step: %.2f MiB without checkpointing, %.2f MiB with\n", (double)full / (1 << 20),
            (double)ck / (1 << 20));
    ASSERT(full > 0 && ck > 0);
    ASSERT(ck < full * 6 / 10);
}

TEST(generate)
{
    dt_model *m = NULL;
    ASSERT_OK(make("gpt-micro", NULL, &m, NULL));
    int64_t prompt[3] = {5, 17, 300}, a[80], b[80], n = 0;
    dt_generate_params g = dt_generate_params_default();
    g.temperature = 0, g.max_new_tokens = 70; /* past the 64-token block: the context slides */
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, a, 80, &n));
    ASSERT_EQ_INT(n, 73);
    ASSERT_EQ_INT(memcmp(a, prompt, sizeof prompt), 0);
    /* greedy = argmax of the forward's last position */
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *y = dt_model_forward(ctx, m, dt_tensor_view_of(ctx, prompt, DT_I64, 2, (int64_t[]){1, 3}));
    ASSERT(y != NULL);
    const float *last = (const float *)y->data + 2 * 512;
    int64_t best = 0;
    for (int64_t j = 1; j < 512; j++)
        best = last[j] > last[best] ? j : best;
    ASSERT_EQ_INT(a[3], best);
    dt_ctx_free(ctx);
    /* top-k 1 is greedy whatever the temperature; same seed, same sample; another seed differs */
    g.temperature = 1.5f, g.top_k = 1;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, b, 80, &n));
    ASSERT_EQ_INT(memcmp(a, b, sizeof(int64_t) * 73), 0);
    g.top_k = 0, g.seed = 7, g.max_new_tokens = 20;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, a, 80, &n));
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, b, 80, &n));
    ASSERT_EQ_INT(memcmp(a, b, sizeof(int64_t) * 23), 0);
    g.seed = 8;
    ASSERT_OK(dt_model_generate(m, &g, prompt, 3, b, 80, &n));
    ASSERT(memcmp(a, b, sizeof(int64_t) * 23) != 0);
    /* bad input */
    prompt[1] = 512;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, a, 80, &n), DT_ERR_RANGE);
    prompt[1] = 1;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, a, 10, &n), DT_ERR_RANGE);
    /* nprompt + max_new_tokens overflowed, the room check passed and generation ran on (a hang) */
    int64_t keep = g.max_new_tokens;
    g.max_new_tokens = INT64_MAX;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, a, 80, &n), DT_ERR_RANGE);
    ASSERT_STR_CONTAINS(dt_last_error(), "room for 80 tokens");
    g.max_new_tokens = INT64_MAX - 2;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, a, 80, &n), DT_ERR_RANGE);
    g.max_new_tokens = keep;
    g.temperature = -1;
    ASSERT_STATUS(dt_model_generate(m, &g, prompt, 3, a, 80, &n), DT_ERR_INVALID_ARG);
    dt_model_free(m);
    ASSERT_OK(dt_model_create("mlp", 1, NULL, &m, NULL));
    ASSERT_STATUS(dt_model_generate(m, NULL, prompt, 3, a, 80, &n), DT_ERR_UNSUPPORTED);
    dt_model_free(m);
}

int main(void)
{
    RUN(param_counts_all_sizes);
    RUN(hf_names_and_shapes);
    RUN(init_statistics);
    RUN(forward_shapes_and_initial_loss);
    RUN(bad_configs);
    RUN(checkpointing_same_gradients_with_dropout);
    RUN(checkpointing_saves_activation_memory);
    RUN(generate);
    return TEST_REPORT();
}
