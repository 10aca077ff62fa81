/* Lazy zero_grad (dt_model_zero_grad_lazy, DT_TENSOR_GRAD_LAZY): with the
 * gradient buffer full of NaN garbage and every gradient marked zero, one
 * backward of gpt-micro (tied embedding/head, Conv1D GEMMs with biases,
 * layer norms, the LM loss) gives bit for bit the gradients of
 * dt_model_zero_grad + backward, and a second backward accumulates onto
 * them as it does there; the marks are set by the lazy zero and cleared by
 * the first write; dt_model_grads_materialize zero-fills what backward did
 * not reach (here: everything, with no backward), and dt_model_zero_grad
 * clears the marks. The same with bf16 parameters under bf16 autocast (the
 * lazy mark of a bf16 gradient stays until its flush, which writes the
 * rounded f32 sum over the garbage; the tied table gets the head's GEMM
 * and the embedding's rows), with the head and the loss apart and fused
 * (dt_model_config.fused_lm_loss). With dtrain's AMX GEMM (tests.cmake's
 * amx/ registration) the head's GEMM rounds the table's gradient
 * itself but for the looked-up rows, which stay f32 for the embedding's
 * contribution and are rounded by the flush: the same bits. */
#include "dtrain/autograd.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/precision.h"
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

static dt_dtype g_dt = DT_F32; /* the parameters' dtype of the nets made */
static bool g_fused;           /* ... and their head fused with the loss (dt_model_config.fused_lm_loss) */

static int net_make(net *n)
{
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = T;
    cfg.build.param_dtype = g_dt;
    cfg.fused_lm_loss = g_fused;
    if (dt_model_create("gpt-micro", 77, &cfg, &n->m, &n->d) < 0 || dt_ctx_init(NULL, &n->ctx) < 0)
        return -1;
    if (g_dt != DT_F32 && dt_autocast_set(n->ctx, g_dt, NULL) < 0)
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

static const dt_flat *grads_of(const net *n, dt_dtype t) { return dt_model_flat(n->m, DT_FLAT_GRADS, t); }

/* Every gradient flat's bytes, f32 then the low dtype, into buf (NULL:
 * only the count). */
static size_t grad_bytes(const net *n, unsigned char *buf)
{
    size_t k = 0;
    const dt_dtype ts[2] = {DT_F32, g_dt};
    for (int i = 0; i < (g_dt == DT_F32 ? 1 : 2); i++) {
        const dt_flat *g = grads_of(n, ts[i]);
        size_t nb = g && g->base ? g->used * dt_dtype_size(ts[i]) : 0;
        if (buf && nb)
            memcpy(buf + k, g->base, nb);
        k += nb;
    }
    return k;
}

static void fill_nan(const net *n)
{
    const dt_flat *g = grads_of(n, DT_F32);
    float *p = g && g->base ? g->base : NULL;
    for (size_t i = 0; p && i < g->used; i++)
        p[i] = NAN;
    const dt_flat *l = g_dt != DT_F32 ? grads_of(n, g_dt) : NULL;
    uint16_t *q = l && l->base ? l->base : NULL;
    for (size_t i = 0; q && i < l->used; i++)
        q[i] = 0x7fc1; /* a NaN in bf16 and f16 */
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

static void lazy_equals_eager(void)
{
    net e, z;
    ASSERT_EQ_INT(net_make(&e), 0);
    ASSERT_EQ_INT(net_make(&z), 0);
    const size_t n = grad_bytes(&e, NULL);
    ASSERT(n > 0 && grad_bytes(&z, NULL) == n);
    if (g_dt != DT_F32)
        ASSERT(grads_of(&e, g_dt) && grads_of(&e, g_dt)->used > 0);
    unsigned char *g1 = malloc(n), *g2 = malloc(n), *got = malloc(n);
    dt_model_zero_grad(e.m);
    ASSERT_EQ_INT(fwd_bwd(&e), 0);
    grad_bytes(&e, g1);
    ASSERT_EQ_INT(fwd_bwd(&e), 0);
    grad_bytes(&e, g2);
    ASSERT(memcmp(g1, g2, n) != 0);

    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    ASSERT(marked(&z) > 10);
    dt_ag_stats_reset(z.ctx);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    ASSERT_EQ_INT((int)marked(&z), 0); /* every parameter is reached in gpt-micro */
    /* the tied table's gradient rounded by the head's GEMM but for the looked-up rows: where dtrain's AMX GEMM
     * runs gpt-micro's products (DT_AMX_GEMM=on on a CPU with AMX: tests.cmake's amx/ registration) */
    dt_ag_stats as;
    dt_ag_stats_get(z.ctx, &as);
    ASSERT_EQ_INT((int)as.grad_rows_split, g_dt == DT_BF16 && dt_k_matmul_amx(NULL) ? 1 : 0);
    /* in bf16 each of gpt-micro's 2 layers writes four GEMM outputs' gradients in bf16 alone (the
     * attention's qkv, the GELU's input and the residual adds' projections), their GEMMs the only
     * readers, and where the GEMMs write bf16 themselves (not under ONEDNN_MAX_CPU_ISA=AVX2:
     * tests.cmake's isa_avx2/ registration) three GEMM inputs' (the GELU's output and both layer
     * norms'), the GELU's and the norms' backwards the only readers; the final norm's too where the
     * head is a GEMM of its own (not fused with the loss); the bits above */
    dt_gpt2_config gc;
    ASSERT_OK(dt_gpt2_config_by_name("gpt-micro", &gc));
    ASSERT_EQ_INT((int)as.grad_f32_skipped, g_dt != DT_BF16                    ? 0
                                     : dt_k_matmul_writes_lp(DT_BF16) ? 7 * (int)gc.n_layer + !g_fused
                                                                     : 4 * (int)gc.n_layer);
    dt_model_grads_materialize(z.m);
    grad_bytes(&z, got);
    ASSERT(memcmp(got, g1, n) == 0);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    grad_bytes(&z, got);
    ASSERT(memcmp(got, g2, n) == 0);

    /* dt_model_zero_grad after a lazy zero: real zeros, no marks */
    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    dt_model_zero_grad(z.m);
    ASSERT_EQ_INT((int)marked(&z), 0);
    ASSERT_EQ_INT(fwd_bwd(&z), 0);
    grad_bytes(&z, got);
    ASSERT(memcmp(got, g1, n) == 0);
    free(g1);
    free(g2);
    free(got);
    net_free(&e);
    net_free(&z);
}

TEST(lazy_equals_eager_bits) { lazy_equals_eager(); }

TEST(lazy_equals_eager_bits_bf16)
{
    g_dt = DT_BF16;
    lazy_equals_eager();
    g_dt = DT_F32;
}

TEST(lazy_equals_eager_bits_bf16_fused_head)
{
    g_dt = DT_BF16;
    g_fused = true;
    lazy_equals_eager();
    g_dt = DT_F32;
    g_fused = false;
}

TEST(materialize_unreached_is_zero)
{
    net z;
    ASSERT_EQ_INT(net_make(&z), 0);
    fill_nan(&z);
    dt_model_zero_grad_lazy(z.m);
    dt_model_grads_materialize(z.m); /* no backward: nothing was reached */
    ASSERT_EQ_INT((int)marked(&z), 0);
    const dt_flat *g = grads_of(&z, DT_F32);
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
    RUN(lazy_equals_eager_bits_bf16);
    RUN(lazy_equals_eager_bits_bf16_fused_head);
    RUN(materialize_unreached_is_zero);
    return TEST_REPORT();
}
