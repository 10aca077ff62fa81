/* dt_model_generate's key/value cache (models/generate_kv.c).
 *
 * White-box: the cached forward's logits of every new position against the
 * uncached forward over the whole prefix, the prompt at once and then one
 * token at a time (within 1e-4 of the logit scale in f32: the matmuls have
 * other shapes, so the sums run in another order; 3e-2 for a bf16 model,
 * whose uncached attention runs in bf16), and the cache's length. Then
 * through the public API: the same tokens with and without the cache,
 * greedy and sampled (temperature, top-k), and a sequence that runs past
 * the model's positions (where the window moves and generation goes
 * uncached). A model with a forward hook is generated without the cache
 * (and the same tokens). Beam search (one cached sequence per beam) gives
 * the same tokens with and without, past a sliding window too (the
 * uncached forward's sliding-window attention, the cache's window). The
 * models: gpt-micro,
 * llama-tiny (grouped-query attention, RoPE; also in bf16) and the Qwen3
 * (per-head q/k norms), Gemma (scaled embeddings, 1 + w norms), Mistral (a
 * sliding window of 16 positions), Phi-3 (fused projections) and Phi-4's
 * shape (partial RoPE, LongRoPE: past its 8 original positions the cache
 * is recomputed with the long factors, as transformers' Phi-3 does) and
 * Granite (its multipliers, the attention's scale on q) and OLMo 2 (norms
 * after attention and MLP, whole-projection q and k norms) and Gemma 2 (soft
 * caps, sliding and full layers; its weights drawn large, halved) and the
 * mixtures of experts Mixtral, Qwen3-MoE, Qwen2-MoE and OLMoE (each token
 * routed alike in a cached step and over the whole prefix) test
 * directories, each with its weights scaled up so that its logits are far
 * from uniform (a random init's are nearly flat). */
// dt-test-timeout: 300
#include "../models/zoo.h"
#include "model_util.h"
#include "test.h"

#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/"

typedef struct {
    const char *name; /* dt_model_create's */
    dt_dtype dtype;
    float scale;     /* on every weight */
    int64_t restart; /* LongRoPE's original_max_position_embeddings: the cache is recomputed past it */
} gen_model;

static const gen_model g_models[] = {
    {"gpt-micro", DT_F32, 4, 0},       {"llama-tiny", DT_F32, 4, 0},    {"llama-tiny", DT_BF16, 4, 0},
    {"hf:" HF "qwen3", DT_F32, 4, 0}, {"hf:" HF "gemma", DT_F32, 6, 0}, {"hf:" HF "mistral", DT_F32, 4, 0},
    {"hf:" HF "phi3", DT_F32, 4, 0},  {"hf:" HF "phi4", DT_F32, 4, 8}, {"hf:" HF "granite", DT_F32, 8, 0},
    {"hf:" HF "olmo2", DT_F32, 4, 0},  {"hf:" HF "gemma2", DT_F32, 0.5, 0}, {"hf:" HF "gemma3", DT_F32, 2, 0},
    {"hf:" HF "smollm3", DT_F32, 1, 0}, {"hf:" HF "olmo3", DT_F32, 4, 0}, {"hf:" HF "ministral", DT_F32, 4, 0},
    {"hf:" HF "mixtral", DT_F32, 4, 0}, {"hf:" HF "qwen3_moe", DT_F32, 4, 0}, {"hf:" HF "qwen2_moe", DT_F32, 4, 0},
    {"hf:" HF "olmoe", DT_F32, 4, 0},
};
#define N_MODELS (int)(sizeof g_models / sizeof g_models[0])

/* Model i in eval mode, its weights scaled; *P, *V: its positions and
 * vocabulary. */
static dt_model *make(int i, int64_t *P, int64_t *V)
{
    if (!strcmp(g_models[i].name, "gpt-micro")) {
        *P = 64, *V = 512;
        return t_gen_model();
    }
    dt_model *m = NULL;
    dt_model_config c = dt_model_config_default();
    if (!strcmp(g_models[i].name, "llama-tiny"))
        c.block_size = 64;
    c.build.param_dtype = g_models[i].dtype;
    if (dt_model_create(g_models[i].name, 99, &c, &m, NULL) < 0 || !dt_llama_positions(m, P, V)) {
        fprintf(stderr, "%s: %s\n", g_models[i].name, dt_last_error());
        dt_model_free(m);
        return NULL;
    }
    const dt_flat *p = dt_model_flat(m, DT_FLAT_PARAMS, g_models[i].dtype);
    for (size_t j = 0; j < p->total; j++) {
        if (g_models[i].dtype == DT_BF16) {
            uint16_t *w = p->base;
            w[j] = dt_f32_to_bf16(g_models[i].scale * dt_bf16_to_f32(w[j]));
        } else {
            ((float *)p->base)[j] *= g_models[i].scale;
        }
    }
    dt_model_train(m, false);
    return m;
}

static void cached_logits(int i)
{
    dt_set_num_threads(2);
    int64_t P = 0, V = 0;
    dt_model *m = make(i, &P, &V);
    ASSERT(m);
    if (!m)
        return;
    /* a LongRoPE model's prompt within its original positions: the short factors, then the long ones */
    const int64_t np = P < 32 || g_models[i].restart ? 3 : 9, nnew = P - np;
    const double tol = g_models[i].dtype == DT_F32 ? 1e-4 : 3e-2;
    int64_t seq[64];
    for (int64_t j = 0; j < np; j++)
        seq[j] = (j * 37 + 5) % V;
    dt__gen_kv *kv = NULL;
    ASSERT_OK(dt__gen_kv_init(m, 1, np, nnew, &kv));
    ASSERT(kv); /* the zoo's GPT-2 or Llama tree: cached */
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    int64_t n = np;
    double worst = 0;
    for (int64_t k = 0; k < nnew && n < P; k++) {
        dt_ag_set_enabled(ctx, false);
        int64_t c = dt__gen_kv_start(kv, n); /* past the original positions: every position again */
        ASSERT_EQ_INT(c, k == 0 || n == g_models[i].restart + 1 ? 0 : n - 1);
        dt_tensor *yc = dt__gen_kv_forward(kv, ctx, seq + c, n - c);
        ASSERT(yc && yc->dtype == DT_F32 && yc->ndim == 3 && yc->shape[1] == 1 && yc->shape[2] == V);
        ASSERT_EQ_INT(dt__gen_kv_len(kv), n);
        dt_tensor *yf = dt_model_forward(ctx, m, dt_tensor_view_of(ctx, seq, DT_I64, 2, (int64_t[]){1, n}));
        if (yf && yf->dtype != DT_F32) /* a bf16 model's logits */
            yf = dt_cast(ctx, yf, DT_F32);
        ASSERT(yf && dt_tensor_is_contiguous(yf) && yf->shape[1] == n && yf->shape[2] == V);
        const float *a = (const float *)yc->data, *b = (const float *)yf->data + (n - 1) * V;
        double scale = 1, d = 0;
        int64_t best = 0;
        for (int64_t j = 0; j < V; j++) {
            scale = fmax(scale, fabs(b[j]));
            d = fmax(d, fabs((double)a[j] - b[j]));
            if (b[j] > b[best])
                best = j;
        }
        worst = fmax(worst, d / scale);
        if (d > tol * scale)
            fprintf(stderr, "%s: position %lld: cached and full logits differ by %g (scale %g)\n",
                    g_models[i].name, (long long)(n - 1), d, scale);
        ASSERT(d <= tol * scale);
        seq[n++] = best; /* greedy */
        dt_ctx_reset(ctx);
    }
    fprintf(stderr, "%s (%s): largest difference / logit scale: %.3g over %lld positions\n", g_models[i].name,
            dt_dtype_name(g_models[i].dtype), worst, (long long)(n - np));
    ASSERT_EQ_INT(n, P);
    /* the tokens vary (the comparison is not of one repeated row) */
    bool varied = false;
    for (int64_t j = np + 1; j < n; j++)
        varied |= seq[j] != seq[np];
    if (!varied)
        for (int64_t j = 0; j < n; j++)
            fprintf(stderr, "%lld%s", (long long)seq[j], j + 1 < n ? " " : "\n");
    ASSERT(varied);
    dt__gen_kv_free(kv);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

TEST(cached_logits_match_the_full_forward)
{
    for (int i = 0; i < N_MODELS; i++)
        cached_logits(i);
}

static dt_status gen_st(dt_model *m, bool cache, float temp, int64_t top_k, const int64_t *prompt, int64_t np,
                        int64_t nnew, int64_t *out, int64_t *nout)
{
    dt_generate_params gp = dt_generate_params_default();
    gp.kv_cache = cache;
    gp.temperature = temp;
    gp.top_k = top_k;
    gp.seed = 5;
    gp.max_new_tokens = nnew;
    return dt_model_generate(m, &gp, prompt, np, out, 200, nout);
}

static void gen(dt_model *m, bool cache, float temp, int64_t top_k, const int64_t *prompt, int64_t np, int64_t nnew,
                int64_t *out, int64_t *nout)
{
    ASSERT_OK(gen_st(m, cache, temp, top_k, prompt, np, nnew, out, nout));
    ASSERT_EQ_INT(*nout, np + nnew);
}

/* The matmul primitives a generation creates (oneDNN's are per shape): the
 * window's forward makes new ones for each length, the cached path's only
 * for the prompt's and for one row. */
static uint64_t prims_of(dt_model *m, bool cache, float temp, int64_t top_k, const int64_t *prompt, int64_t np,
                         int64_t nnew, int64_t *out, int64_t *nout)
{
    dt_k_cache_clear();
    dt_k_stats_reset();
    gen(m, cache, temp, top_k, prompt, np, nnew, out, nout);
    dt_k_stats st;
    dt_k_stats_get(&st);
    return st.primitives_created;
}

static void same_tokens(int i, dt_model *m, int64_t P, int64_t V, float temp, int64_t top_k, int64_t np,
                        int64_t nnew)
{
    int64_t prompt[100], a[200], b[200], na = 0, nb = 0;
    for (int64_t j = 0; j < np; j++)
        prompt[j] = (j * 53 + 11) % V;
    uint64_t pa = prims_of(m, false, temp, top_k, prompt, np, nnew, a, &na);
    uint64_t pb = prims_of(m, true, temp, top_k, prompt, np, nnew, b, &nb);
    if (np + nnew <= P && nnew > 8) { /* inside the window: the cache ran (few shapes) */
        if (pb >= pa / 4)
            fprintf(stderr, "%s: %llu primitives with the cache, %llu without\n", g_models[i].name,
                    (unsigned long long)pb, (unsigned long long)pa);
        ASSERT(pb < pa / 4);
    }
    ASSERT_EQ_INT(na, nb);
    int64_t first = -1; /* the first token that differs */
    for (int64_t j = 0; j < na && j < nb && first < 0; j++)
        first = a[j] != b[j] ? j : -1;
    if (first >= 0)
        fprintf(stderr, "%s: temperature %g top_k %lld prompt %lld: token %lld is %lld uncached, %lld cached\n",
                g_models[i].name, (double)temp, (long long)top_k, (long long)np, (long long)first,
                (long long)a[first], (long long)b[first]);
    ASSERT(first < 0);
}

/* Beam search with and without the cache (num_beams sequences, reordered
 * by their parents each step): the same tokens, inside the positions and
 * (past them: the cache fills, then the window moves uncached) outside,
 * with stop tokens and a length penalty. */
static void beams(int i, dt_model *m, int64_t P, int64_t V, int64_t nb, int64_t np, int64_t nnew, int64_t eos)
{
    int64_t prompt[100], a[200], b[200], na = 0, nbt = 0;
    for (int64_t j = 0; j < np; j++)
        prompt[j] = (j * 29 + 3) % V;
    dt_generate_params gp = dt_generate_params_default();
    gp.temperature = 0, gp.num_beams = nb, gp.max_new_tokens = nnew, gp.length_penalty = 1.5f;
    if (eos >= 0)
        gp.eos_ids[0] = eos, gp.n_eos = 1;
    gp.kv_cache = false;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, np, a, 200, &na));
    gp.kv_cache = true;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, np, b, 200, &nbt));
    if (na != nbt || memcmp(a, b, (size_t)na * sizeof *a))
        fprintf(stderr, "%s: %lld beams, prompt %lld, %lld new (positions %lld): %lld tokens uncached, %lld cached\n",
                g_models[i].name, (long long)nb, (long long)np, (long long)nnew, (long long)P, (long long)na,
                (long long)nbt);
    ASSERT_EQ_INT(na, nbt);
    ASSERT(!memcmp(a, b, (size_t)na * sizeof *a));
    ASSERT(na > np);
}

TEST(same_tokens_with_and_without)
{
    dt_set_num_threads(2);
    for (int i = 0; i < N_MODELS; i++) {
        if (g_models[i].dtype != DT_F32) /* bf16: logits equal to rounding only (cached_logits) */
            continue;
        int64_t P = 0, V = 0;
        dt_model *m = make(i, &P, &V);
        ASSERT(m);
        if (!m)
            continue;
        const int64_t w = P < 32 ? 3 : 6, s = P < 32 ? 1 : 8; /* a short prompt, the window's step */
        same_tokens(i, m, P, V, 0.0f, 0, w, P - w - 2);      /* greedy, inside the window */
        same_tokens(i, m, P, V, 1.0f, 0, 3, P - 10);         /* sampled */
        same_tokens(i, m, P, V, 0.8f, 20, 1, P - 4);         /* top-k, a one-token prompt */
        same_tokens(i, m, P, V, 0.0f, 0, P - 14, 40);        /* past the positions: the window moves */
        same_tokens(i, m, P, V, 0.0f, 0, P, 3);              /* a prompt of the whole window */
        same_tokens(i, m, P, V, 0.0f, 0, P - s, s + 5);      /* the cache fills, then the window moves */
        beams(i, m, P, V, 3, 4, P - 6, -1);
        beams(i, m, P, V, 4, 2, P - 4, 7 % V);
        beams(i, m, P, V, 2, P - 10, 30, -1); /* the cache fills at P, then the window moves */
        dt_model_free(m);
    }
}

/* LoRA adapters on every linear layer (their forwards replaced by PEFT's base(x) + scaling B(A(x))): cached,
 * the same tokens. The base weights (frozen: the buffers) times 4, the adapters' B drawn away from 0. */
TEST(lora_model_goes_cached)
{
    dt_set_num_threads(2);
    const char *names[] = {"gpt-micro", "llama-tiny"}, *targets[] = {"all-linear", NULL};
    for (int i = 0; i < 2; i++) {
        dt_model *m = NULL;
        dt_model_config c = dt_model_config_default();
        dt_lora_params lp = dt_lora_params_default();
        lp.targets = targets;
        c.build.lora = &lp;
        c.block_size = 64;
        ASSERT_OK(dt_model_create(names[i], 99, &c, &m, NULL));
        const dt_flat *buf = dt_model_flat(m, DT_FLAT_BUFFERS, DT_F32), *par = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
        ASSERT(buf && buf->total > 0 && par && par->total > 0);
        for (size_t j = 0; j < buf->total; j++)
            ((float *)buf->base)[j] *= 4.0f;
        for (size_t j = 0; j < par->total; j++) /* A and B: a fixed pattern in [-0.25, 0.25) */
            ((float *)par->base)[j] = (float)((j * 2654435761u) % 1000) / 2000.0f - 0.25f;
        dt_model_train(m, false);
        dt__gen_kv *kv = NULL;
        ASSERT_OK(dt__gen_kv_init(m, 1, 4, 20, &kv));
        ASSERT(kv != NULL);
        dt__gen_kv_free(kv);
        int64_t prompt[4] = {3, 1, 4, 1}, a[200], b[200], na = 0, nb = 0;
        gen(m, false, 0.0f, 0, prompt, 4, 40, a, &na);
        gen(m, true, 0.0f, 0, prompt, 4, 40, b, &nb);
        ASSERT(!memcmp(a, b, (size_t)na * sizeof *a));
        bool varied = false;
        for (int64_t j = 5; j < na; j++)
            varied |= a[j] != a[4];
        ASSERT(varied);
        /* the adapters count: zero them and the tokens change */
        memset(par->base, 0, par->total * sizeof(float));
        gen(m, true, 0.0f, 0, prompt, 4, 40, b, &nb);
        ASSERT(memcmp(a, b, (size_t)na * sizeof *a) != 0);
        dt_model_free(m);
    }
}

/* on_token: called after each new token with the sequence so far, cached and uncached alike; a non-zero
 * return stops generation there (DT_OK, the tokens so far: the full run's first ones). */
typedef struct {
    int calls, stop_at;
    int64_t last_n;
    bool grew;
} tok_log;

static int log_token(void *ud, const int64_t *seq, int64_t n)
{
    tok_log *l = ud;
    (void)seq;
    l->grew &= n == l->last_n + 1;
    l->last_n = n;
    return ++l->calls == l->stop_at;
}

TEST(on_token_streams_and_stops)
{
    int64_t P = 0, V = 0;
    dt_model *m = make(1, &P, &V); /* llama-tiny */
    ASSERT(m);
    const int64_t prompt[3] = {5, 6, 7};
    for (int cache = 0; m && cache < 2; cache++) {
        int64_t full[64], part[64], nf = 0, np = 0;
        gen(m, cache, 0.0f, 0, prompt, 3, 20, full, &nf);
        tok_log l = {.stop_at = 0, .last_n = 3, .grew = true};
        dt_generate_params gp = dt_generate_params_default();
        gp.temperature = 0.0f, gp.max_new_tokens = 20, gp.kv_cache = cache;
        gp.on_token = log_token, gp.on_token_ud = &l;
        ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, part, 64, &np));
        ASSERT(l.calls == 20 && l.grew && np == nf && !memcmp(part, full, (size_t)nf * sizeof *full));
        l = (tok_log){.stop_at = 4, .last_n = 3, .grew = true};
        ASSERT_OK(dt_model_generate(m, &gp, prompt, 3, part, 64, &np));
        ASSERT(l.calls == 4 && np == 7 && !memcmp(part, full, 7 * sizeof *full));
    }
    dt_model_free(m);
}

static dt_status count_hook(dt_ctx *ctx, dt_module *mod, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)ctx, (void)mod, (void)x, (void)y;
    (*(int *)ud)++;
    return DT_OK;
}

static void hooked(int i, const char *path)
{
    int64_t P = 0, V = 0;
    dt_model *m = make(i, &P, &V);
    ASSERT(m);
    if (!m)
        return;
    int calls = 0;
    dt_module *attn = dt_model_find_module(m, path);
    ASSERT(attn);
    dt_hook_id id;
    ASSERT_OK(dt_module_add_forward_post_hook(attn, count_hook, &calls, &id));
    dt__gen_kv *kv = NULL;
    ASSERT_OK(dt__gen_kv_init(m, 1, 2, 14, &kv));
    ASSERT(kv == NULL); /* the hook observes attn's forward: no cache */
    int64_t prompt[2] = {1, 2}, out[200], n = 0;
    gen(m, true, 0.0f, 0, prompt, 2, 5, out, &n);
    ASSERT_EQ_INT(calls, 5); /* one hooked forward per token */
    dt_model_free(m);
}

TEST(hooked_model_goes_uncached)
{
    hooked(0, "transformer.h.0.attn");     /* gpt-micro */
    hooked(1, "model.layers.1.self_attn"); /* llama-tiny */
}

int main(void)
{
    RUN(cached_logits_match_the_full_forward);
    RUN(same_tokens_with_and_without);
    RUN(hooked_model_goes_uncached);
    RUN(lora_model_goes_cached);
    RUN(on_token_streams_and_stops);
    return TEST_REPORT();
}
