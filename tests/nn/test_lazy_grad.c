/* Lazy zero_grad (dt_model_zero_grad_lazy, DT_TENSOR_GRAD_LAZY): with the
 * gradient buffer full of NaN garbage and every gradient marked zero, one
 * backward of gpt-micro (tied embedding/head, Conv1D GEMMs with biases,
 * layer norms, the fused LM loss) gives bit for bit the gradients of
 * dt_model_zero_grad + backward, and a second backward accumulates onto
 * them as it does there; the marks are set by the lazy zero and cleared by
 * the first write; dt_model_grads_materialize zero-fills what backward did
 * not reach (here: everything, with no backward), and dt_model_zero_grad
 * clears the marks. */
#include "dtrain/autograd.h"
#include "dtrain/models.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 7 };

typedef struct {
    dt_model *m;
    dt_model_desc d;
    dt_ctx *ctx;
} net;

static int net_make(net *n)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = T;
    if (dt_model_create("gpt-micro", 77, &cfg, &n->m, &n->d) < 0 || dt_ctx_init(NULL, &n->ctx) < 0)
        return -1;
    dt_model_train(n->m, true);
    return 0;
}

static void net_free(net *n)
{
    dt_ctx_free(n->ctx);
    dt_model_free(n->m);
}

/* One forward + loss + backward on fixed tokens (gradients accumulate). */
static int fwd_bwd(net *n)
{
    int64_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++)
        tok[i] = (i * 37 + 5) % 512, tgt[i] = (i * 101 + 9) % 512;
    dt_tensor *x = dt_tensor_view_of(n->ctx, tok, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *y = dt_tensor_view_of(n->ctx, tgt, DT_I64, 2, (int64_t[]){B, T});
    dt_tensor *o = dt_model_forward(n->ctx, n->m, x);
    dt_tensor *l = o ? dt_model_desc_loss(n->ctx, &n->d, o, y) : NULL;
    int rc = l && dt_backward(n->ctx, l) == DT_OK ? 0 : -1;
    if (rc)
        fprintf(stderr, "fwd_bwd: %s\n", dt_last_error());
    dt_ctx_reset(n->ctx);
    return rc;
}

static const dt_flat *grads(const net *n) { return dt_model_flat(n->m, DT_FLAT_GRADS, DT_F32); }

static void fill_nan(const net *n)
{
    const dt_flat *g = grads(n);
    float *p = g->base;
    for (size_t i = 0; i < g->used; i++)
        p[i] = NAN;
}

/* How many parameters carry the lazy mark. */
static size_t marked(const net *n)
{
    size_t k = 0;
    for (size_t i = 0; i < dt_model_num_entries(n->m); i++) {
        dt_param_info p;
        if (dt_model_entry(n->m, i, &p) == DT_OK && !p.is_buffer && p.tied_to < 0 && p.tensor &&
            (p.tensor->flags & DT_TENSOR_GRAD_LAZY))
            k++;
    }
    return k;
}

TEST(lazy_equals_eager_bits)
{
    net e, z;
    ASSERT_EQ_INT(net_make(&e), 0);
    ASSERT_EQ_INT(net_make(&z), 0);
    const size_t n = grads(&e)->used;
    ASSERT(n > 0 && grads(&z)->used == n);
    float *g1 = malloc(n * 4), *g2 = malloc(n * 4);
    dt_model_zero_grad(e.m);
    ASSERT_EQ_INT(fwd_bwd(&e), 0);
    memcpy(g1, grads(&e)->base, n * 4);
    ASSERT_EQ_INT(fwd_bwd(&e), 0);
    memcpy(g2, grads(&e)->base, n * 4);

    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    ASSERT(marked(&z) > 10);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    ASSERT_EQ_INT((int)marked(&z), 0); /* every parameter is reached in gpt-micro */
    dt_model_grads_materialize(z.m);
    ASSERT(memcmp(grads(&z)->base, g1, n * 4) == 0);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    ASSERT(memcmp(grads(&z)->base, g2, n * 4) == 0);

    /* dt_model_zero_grad after a lazy zero: real zeros, no marks */
    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    dt_model_zero_grad(z.m);
    ASSERT_EQ_INT((int)marked(&z), 0);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    ASSERT(memcmp(grads(&z)->base, g1, n * 4) == 0);
    free(g1);
    free(g2);
    net_free(&e);
    net_free(&z);
}

TEST(materialize_unreached_is_zero)
{
    net z;
    ASSERT_EQ_INT(net_make(&z), 0);
    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    dt_model_grads_materialize(z.m); /* no backward: nothing was reached */
    ASSERT_EQ_INT((int)marked(&z), 0);
    const dt_flat *g = grads(&z);
    const float *p = g->base;
    size_t nonzero = 0;
    for (size_t i = 0; i < g->used; i++)
        nonzero += p[i] != 0.0f || signbit(p[i]);
    ASSERT_EQ_INT((int)nonzero, 0);
    net_free(&z);
}

int main(void)
{
    RUN(lazy_equals_eager_bits);
    RUN(materialize_unreached_is_zero);
    return TEST_REPORT();
}
