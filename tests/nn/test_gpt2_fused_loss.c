/* GPT-2 with dt_model_config.fused_lm_loss: a training-mode forward returns
 * the hidden states [B, T, C] and dt_model_desc_loss applies the tied head
 * fused with the cross-entropy; the loss and every parameter gradient equal
 * the unfused model's (same seed) within float rounding (loss 1e-6
 * relative, gradients 1e-5 of the largest entry), in f32 and with bf16
 * parameters under autocast (loss 1e-4 relative, gradients within a bf16
 * rounding: 8e-3 of the largest entry). Eval mode returns the logits; a
 * hook on the head or on the root falls back to the logits; tensor parallelism is not
 * involved (the flag is ignored there). */
#include "dtrain/autograd.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/precision.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>

enum { B = 2, T = 7 };

typedef struct {
    float loss;
    float *grads;
    size_t n;
    int64_t out_last; /* the forward output's last dim */
} result;

static dt_status hook(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx, (void)m, (void)x;
    ++*(int *)ud;
    return DT_OK;
}

/* One forward + loss + backward of gpt-micro (V 512, C 64) on fixed tokens. */
static int run(bool fused, dt_dtype pdt, bool training, const char *hooked, result *r)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = T;
    cfg.fused_lm_loss = fused;
    cfg.build.param_dtype = pdt;
    dt_model *m;
    dt_model_desc d;
    if (dt_model_create("gpt-micro", 77, &cfg, &m, &d) < 0)
        return -1;
    int calls = 0;
    if (hooked)
        dt_module_add_forward_pre_hook(dt_model_find_module(m, hooked), hook, &calls, NULL);
    dt_model_train(m, training);
    dt_ctx *ctx;
    dt_ctx_init(NULL, &ctx);
    if (pdt != DT_F32)
        dt_autocast_set(ctx, pdt, NULL);
    int64_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 37 + 5) % 512, tgt[i] = (i * 101 + 9) % 512;
    tgt[3] = DT_K_IGNORE_INDEX;
    dt_tensor *x = dt_tensor_view_of(ctx, tok, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *y = dt_tensor_view_of(ctx, tgt, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *o = dt_model_forward(ctx, m, x);
    dt_tensor *l = dt_model_desc_loss(ctx, &d, o, y);
    int rc = -1;
    if (o && l && dt_backward(ctx, l) == DT_OK) {
        r->out_last = o->shape[o->ndim - 1];
        r->loss = (float)dt_tensor_item(l);
        const dt_flat *g = dt_model_flat(m, DT_FLAT_GRADS, pdt);
        r->n = g->used;
        r->grads = malloc(r->n * sizeof(float));
        dt_k_convert(g->base, pdt, r->grads, DT_F32, (int64_t)r->n);
        rc = hooked && !calls ? -2 : 0;
    }
    if (rc == -1)
        fprintf(stderr, "run: %s\n", dt_last_error());
    dt_ctx_free(ctx);
    dt_model_free(m);
    return rc;
}

static int compare(dt_dtype pdt, double lrel, double grel)
{
    result a = {0}, b = {0};
    if (run(false, pdt, true, NULL, &a) || run(true, pdt, true, NULL, &b))
        return 1;
    int bad = 0;
    if (a.out_last != 512 || b.out_last != 64)
        bad++, fprintf(stderr, "outputs' last dims %lld, %lld: want logits (512) and hidden (64)\n",
                       (long long)a.out_last, (long long)b.out_last);
    if (!(fabs(a.loss - b.loss) <= lrel * fabs(a.loss)))
        bad++, fprintf(stderr, "loss %.9g vs unfused %.9g\n", b.loss, a.loss);
    double mx = 0;
    for (size_t i = 0; i < a.n; i++)
        mx = fmax(mx, fabs(a.grads[i]));
    for (size_t i = 0; i < a.n && bad < 10; i++)
        if (!(fabs(a.grads[i] - b.grads[i]) <= grel * mx))
            bad++, fprintf(stderr, "grad %zu: %.9g vs unfused %.9g (max %.3g)\n", i, b.grads[i], a.grads[i], mx);
    if (mx == 0 || a.n != b.n)
        bad++;
    free(a.grads);
    free(b.grads);
    return bad;
}

TEST(equals_unfused_f32) { ASSERT_EQ_INT(compare(DT_F32, 1e-6, 1e-5), 0); }

TEST(equals_unfused_bf16) { ASSERT_EQ_INT(compare(DT_BF16, 1e-4, 8e-3), 0); }

TEST(eval_and_hooks_give_logits)
{
    result a = {0}, b = {0};
    result c = {0};
    ASSERT_EQ_INT(run(true, DT_F32, false, NULL, &a), 0); /* eval mode: logits */
    ASSERT_EQ_INT((int)a.out_last, 512);
    ASSERT_EQ_INT(run(true, DT_F32, true, "lm_head", &b), 0); /* a hook on the head: the head runs */
    ASSERT_EQ_INT((int)b.out_last, 512);
    ASSERT_EQ_INT(run(true, DT_F32, true, "", &c), 0); /* on the root (a ZeRO-3 unit's gather): the same */
    ASSERT_EQ_INT((int)c.out_last, 512);
    ASSERT(fabs(a.loss - b.loss) <= 1e-6 * fabs(a.loss) && c.loss == b.loss);
    free(a.grads);
    free(b.grads);
    free(c.grads);
}

int main(void)
{
    RUN(equals_unfused_f32);
    RUN(equals_unfused_bf16);
    RUN(eval_and_hooks_give_logits);
    return TEST_REPORT();
}
