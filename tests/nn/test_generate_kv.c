/* dt_model_generate's key/value cache (models/generate_kv.c).
 *
 * White-box: the cached forward's logits of every new position against the
 * uncached forward over the whole prefix, the prompt at once and then one
 * token at a time (within 1e-4 of the logit scale: the matmuls have other
 * shapes, so the sums run in another order), and the cache's length. Then
 * through the public API: the same tokens with and without the cache,
 * greedy and sampled (temperature, top-k), and a sequence that runs past
 * block_size (where the window moves and generation goes uncached). A
 * model with a forward hook is generated without the cache (and the same
 * tokens). The model: gpt-micro with its weights scaled up so that its
 * logits are far from uniform (a random init's are nearly flat). */
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

TEST(cached_logits_match_the_full_forward)
{
    dt_set_num_threads(2);
    dt_model *m = t_gen_model();
    ASSERT(m);
    const int64_t P = 64, V = 512, np = 9, nnew = 40;
    int64_t seq[64];
    for (int64_t i = 0; i < np; i++)
        seq[i] = (i * 37 + 5) % V;
    dt__gen_kv *kv = NULL;
    ASSERT_OK(dt__gen_kv_init(m, np + nnew, &kv));
    ASSERT(kv); /* the zoo's GPT-2 tree: cached */
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    int64_t n = np;
    double worst = 0;
    for (int64_t k = 0; k < nnew && n < P; k++) {
        dt_ag_set_enabled(ctx, false);
        int64_t c = dt__gen_kv_len(kv);
        ASSERT_EQ_INT(c, k == 0 ? 0 : n - 1);
        dt_tensor *yc = dt__gen_kv_forward(kv, ctx, seq + c, n - c);
        ASSERT(yc && yc->dtype == DT_F32 && yc->ndim == 3 && yc->shape[1] == 1 && yc->shape[2] == V);
        ASSERT_EQ_INT(dt__gen_kv_len(kv), n);
        dt_tensor *yf = dt_model_forward(ctx, m, dt_tensor_view_of(ctx, seq, DT_I64, 2, (int64_t[]){1, n}));
        ASSERT(yf && yf->dtype == DT_F32 && yf->shape[1] == n && yf->shape[2] == V);
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
        if (d > 1e-4 * scale)
            fprintf(stderr, "position %lld: cached and full logits differ by %g (scale %g)\n", (long long)(n - 1), d,
                    scale);
        ASSERT(d <= 1e-4 * scale);
        seq[n++] = best; /* greedy */
        dt_ctx_reset(ctx);
    }
    fprintf(stderr, "largest difference / logit scale: %.3g over %lld positions\n", worst, (long long)(n - np));
    /* the tokens vary (the comparison is not of one repeated row) */
    bool varied = false;
    for (int64_t i = np + 1; i < n; i++)
        varied |= seq[i] != seq[np];
    ASSERT(varied);
    dt__gen_kv_free(kv);
    dt_ctx_free(ctx);
    dt_model_free(m);
}

static void gen(dt_model *m, bool cache, float temp, int64_t top_k, const int64_t *prompt, int64_t np, int64_t nnew,
                int64_t *out, int64_t *nout)
{
    dt_generate_params gp = dt_generate_params_default();
    gp.kv_cache = cache;
    gp.temperature = temp;
    gp.top_k = top_k;
    gp.seed = 5;
    gp.max_new_tokens = nnew;
    ASSERT_OK(dt_model_generate(m, &gp, prompt, np, out, 200, nout));
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

static void same_tokens(dt_model *m, float temp, int64_t top_k, int64_t np, int64_t nnew)
{
    int64_t prompt[100], a[200], b[200], na = 0, nb = 0;
    for (int64_t i = 0; i < np; i++)
        prompt[i] = (i * 53 + 11) % 512;
    uint64_t pa = prims_of(m, false, temp, top_k, prompt, np, nnew, a, &na);
    uint64_t pb = prims_of(m, true, temp, top_k, prompt, np, nnew, b, &nb);
    if (np + nnew <= 64 && nnew > 8) /* inside the window: the cache ran (few shapes) */
        ASSERT(pb < pa / 4);
    ASSERT_EQ_INT(na, nb);
    ASSERT(!memcmp(a, b, (size_t)na * sizeof *a));
}

TEST(same_tokens_with_and_without)
{
    dt_set_num_threads(2);
    dt_model *m = t_gen_model();
    ASSERT(m);
    same_tokens(m, 0.0f, 0, 6, 50);   /* greedy, inside the window */
    same_tokens(m, 1.0f, 0, 3, 40);   /* sampled */
    same_tokens(m, 0.8f, 20, 1, 60);  /* top-k, a one-token prompt */
    same_tokens(m, 0.0f, 0, 50, 40);  /* past block_size (64): the window moves */
    same_tokens(m, 0.0f, 0, 64, 3);   /* a prompt of the whole window */
    dt_model_free(m);
}

static dt_status count_hook(dt_ctx *ctx, dt_module *mod, dt_tensor *x, dt_tensor *y, void *ud)
{
    (void)ctx, (void)mod, (void)x, (void)y;
    (*(int *)ud)++;
    return DT_OK;
}

TEST(hooked_model_goes_uncached)
{
    dt_model *m = t_gen_model();
    ASSERT(m);
    int calls = 0;
    dt_module *attn = dt_model_find_module(m, "transformer.h.0.attn");
    ASSERT(attn);
    dt_hook_id id;
    ASSERT_OK(dt_module_add_forward_post_hook(attn, count_hook, &calls, &id));
    dt__gen_kv *kv = NULL;
    ASSERT_OK(dt__gen_kv_init(m, 16, &kv));
    ASSERT(kv == NULL); /* the hook observes attn's forward: no cache */
    int64_t prompt[2] = {1, 2}, out[200], n = 0;
    gen(m, true, 0.0f, 0, prompt, 2, 5, out, &n);
    ASSERT_EQ_INT(calls, 5); /* one hooked forward per token */
    dt_model_free(m);
}

int main(void)
{
    RUN(cached_logits_match_the_full_forward);
    RUN(same_tokens_with_and_without);
    RUN(hooked_model_goes_uncached);
    return TEST_REPORT();
}
