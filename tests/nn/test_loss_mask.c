/* The loss on the completions only (--loss-mask): targets labelled -100
 * (DT_K_IGNORE_INDEX) do not count and the mean runs over the counted
 * ones, as PyTorch's cross_entropy(ignore_index=-100). Checked through a
 * whole model (llama-tiny: its head then dt_cross_entropy; gpt-micro with
 * the fused LM-head cross-entropy), f32 and bf16 autocast, against the
 * hand computation the definition gives: with the counted targets S,
 *   loss(S) = (1/|S|) sum_{i in S} loss({i})     and
 *   grad(S) = (1/|S|) sum_{i in S} grad({i})     (every parameter),
 * where loss({i}) is the model's loss with target i alone counted (the
 * cross-entropy of that row). A mean over all rows (ignored ones as 0)
 * would be |S|/N of it; a gradient taken through the ignored rows would
 * not add up. A batch with no counted target: loss 0, zero gradients.
 * (The kernel's value against PyTorch's F.cross_entropy(ignore_index=-100)
 * is tests/autograd and tests/kernels' golden check.) */
#include "dtrain/autograd.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/precision.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>

enum { B = 2, T = 6, N = B * T };

/* One forward + loss + backward; *loss and the gradients (f32, malloc'd). */
static int run(const char *model, bool fused, dt_dtype pdt, const int64_t *tgt, float *loss, float **grads,
               size_t *n)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = T;
    cfg.fused_lm_loss = fused;
    cfg.build.param_dtype = pdt;
    dt_model *m;
    dt_model_desc d;
    if (dt_model_create(model, 5, &cfg, &m, &d) < 0) {
        fprintf(stderr, "%s: %s\n", model, dt_last_error());
        return -1;
    }
    dt_model_train(m, true);
    dt_ctx *ctx;
    dt_ctx_init(NULL, &ctx);
    if (pdt != DT_F32)
        dt_autocast_set(ctx, pdt, NULL);
    int64_t tok[N], y[N];
    for (int i = 0; i < N; i++)
        tok[i] = (i * 37 + 5) % 256, y[i] = tgt[i];
    dt_tensor *x = dt_tensor_view_of(ctx, tok, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *yt = dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *o = dt_model_forward(ctx, m, x);
    dt_tensor *l = dt_model_desc_loss(ctx, &d, o, yt);
    int rc = -1;
    if (o && l && dt_backward(ctx, l) == DT_OK) {
        *loss = (float)dt_tensor_item(l);
        const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, pdt);
        *n = g->used;
        *grads = malloc(*n * sizeof(float));
        dt_k_convert(g->base, pdt, *grads, DT_F32, (int64_t)*n);
        rc = 0;
    } else {
        fprintf(stderr, "run %s: %s\n", model, dt_last_error());
    }
    dt_ctx_free(ctx);
    dt_model_free(m);
    return rc;
}

static int check(const char *model, bool fused, dt_dtype pdt, double lrel, double grel)
{
    int64_t full[N], masked[N], one[N];
    bool counted[N];
    for (int i = 0; i < N; i++) {
        full[i] = (i * 101 + 9) % 256;
        counted[i] = i % T >= 4 || i == 1; /* a prompt of 4 per row, one stray counted target */
        masked[i] = counted[i] ? full[i] : DT_K_IGNORE_INDEX;
    }
    float lm, *gm;
    size_t n;
    if (run(model, fused, pdt, masked, &lm, &gm, &n) < 0)
        return 1;
    double sum = 0, *gs = calloc(n, sizeof *gs);
    int k = 0;
    for (int i = 0; i < N; i++) {
        if (!counted[i])
            continue;
        for (int j = 0; j < N; j++)
            one[j] = j == i ? full[j] : DT_K_IGNORE_INDEX;
        float li, *gi;
        size_t ni;
        if (run(model, fused, pdt, one, &li, &gi, &ni) < 0 || ni != n)
            return 1;
        sum += li;
        for (size_t p = 0; p < n; p++)
            gs[p] += gi[p];
        free(gi);
        k++;
    }
    int bad = 0;
    double want = sum / k, gmax = 0, err = 0;
    if (fabs(lm - want) > lrel * fabs(want)) {
        fprintf(stderr, "%s %s: masked loss %.9g, the mean of the %d counted rows' losses %.9g\n", model,
                dt_dtype_name(pdt), lm, k, want);
        bad = 1;
    }
    for (size_t p = 0; p < n; p++) {
        gmax = fmax(gmax, fabs(gs[p] / k));
        err = fmax(err, fabs(gm[p] - gs[p] / k));
    }
    if (!(gmax > 0) || err > grel * gmax) {
        fprintf(stderr, "%s %s: gradient off by %.3g (largest entry %.3g)\n", model, dt_dtype_name(pdt), err, gmax);
        bad = 1;
    }
    /* nothing counted: loss 0, zero gradients */
    for (int j = 0; j < N; j++)
        one[j] = DT_K_IGNORE_INDEX;
    float l0, *g0;
    size_t n0;
    if (run(model, fused, pdt, one, &l0, &g0, &n0) < 0)
        return 1;
    for (size_t p = 0; p < n0; p++)
        bad |= g0[p] != 0;
    if (l0 != 0 || bad)
        fprintf(stderr, "%s %s: no counted target: loss %g (want 0 and zero gradients)\n", model,
                dt_dtype_name(pdt), l0);
    bad |= l0 != 0;
    free(g0);
    free(gs);
    free(gm);
    return bad;
}

TEST(llama_f32) { ASSERT_EQ_INT(check("llama-tiny", false, DT_F32, 1e-5, 1e-5), 0); }
TEST(llama_bf16) { ASSERT_EQ_INT(check("llama-tiny", false, DT_BF16, 2e-2, 3e-2), 0); }
TEST(gpt_fused_f32) { ASSERT_EQ_INT(check("gpt-micro", true, DT_F32, 1e-5, 1e-5), 0); }
TEST(gpt_fused_bf16) { ASSERT_EQ_INT(check("gpt-micro", true, DT_BF16, 2e-2, 3e-2), 0); }

int main(void)
{
    RUN(llama_f32);
    RUN(llama_bf16);
    RUN(gpt_fused_f32);
    RUN(gpt_fused_bf16);
    return TEST_REPORT();
}
