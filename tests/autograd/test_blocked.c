/* Channel-blocked activations (DT_TENSOR_BLOCKED8 / 16): conv2d ->
 * batch_norm -> relu -> max_pool2d -> conv2d -> ... -> flatten stays blocked
 * inside a dt_ctx_set_blocked region, in the block dt_k_act_block() chose
 * (oneDNN's preference on this machine, or DT_BLOCKED). Checks: the
 * intermediates really are blocked, finite-difference gradients through the
 * blocked path, forward values and gradients of nChw8c and nChw16c
 * bit-identical to each other and to the plain path (region off) except
 * where the plain path runs another convolution algorithm, other ops and
 * the public accessors see plain values, and a ConvNet training step runs
 * fewer reorders (dt_k_stats) than the plain path when the block is the one
 * oneDNN prefers. */
#include "dtrain/kernels.h"
#include "dtrain/nn.h"
#include "model_util.h"
#include "gradcheck.h"

#include <stdlib.h>
#include <string.h>

#define TC(seed, ...) gc_tensor(NARG(__VA_ARGS__), SH(__VA_ARGS__), seed, false)

static bool g_blocked;      /* region on for the net below */
static int g_nblocked;      /* blocked intermediates seen in the last forward */

static dt_tensor *seen(dt_tensor *t)
{
    if (t && (t->flags & DT_TENSOR_BLOCKED)) {
        g_nblocked++;
        if (dt_tensor_block(t) != dt_k_act_block())
            g_nblocked += 1000; /* the wrong block: fails the count below */
    }
    return t;
}

/* x [2,1,8,8] -> conv 1->16 (pad 1) -> BN -> relu -> pool2 [2,16,4,4] ->
 * conv 16->16 (pad 1) -> BN -> relu -> pool2 [2,16,2,2] -> flatten [2,64]
 * (16 channels: both blocks apply) */
static dt_tensor *f_net(dt_ctx *c, dt_tensor **in, void *u)
{
    dt_tensor *x = u;
    bool old = dt_ctx_set_blocked(c, g_blocked);
    g_nblocked = 0;
    dt_tensor *h = seen(dt_conv2d(c, x, in[0], NULL, 1, 1));
    h = seen(dt_batch_norm(c, h, in[1], NULL, NULL, NULL, true, 0.1f, 1e-5f));
    h = seen(dt_relu(c, h));
    h = seen(dt_max_pool2d(c, h, 2, 0, 0));
    h = seen(dt_conv2d(c, h, in[2], NULL, 1, 1));
    h = seen(dt_batch_norm(c, h, in[3], NULL, NULL, NULL, true, 0.1f, 1e-5f));
    h = seen(dt_relu(c, h));
    h = seen(dt_max_pool2d(c, h, 2, 0, 0));
    h = dt_flatten(c, h, 1, -1);
    dt_ctx_set_blocked(c, old);
    return h;
}

static void make_inputs(dt_tensor **in)
{
    in[0] = T(1, 16, 1, 3, 3);
    in[1] = T(3, 16);
    in[2] = T(5, 16, 16, 3, 3);
    in[3] = T(6, 16);
}

TEST(gradcheck_blocked_path)
{
    printf("  activations %s (oneDNN prefers %s)\n", dt_k_block_name(dt_k_act_block()),
           dt_k_block_name(dt_k_onednn_block()));
    if (!dt_k_act_block())
        printf("  (blocked activations off: no blocked tensors; plain path checked)\n");
    dt_tensor *x = TC(7, 2, 1, 8, 8);
    dt_tensor *in[4];
    make_inputs(in);
    g_blocked = true;
    /* h = 2e-3: with 16 channels, steps of 1e-2 cross ReLU / max-pool kinks
     * (the plain path fails the same elements then); 1e-3 to 3e-3 all pass */
    int bad = gradcheck("blocked_net", 4, in, f_net, x, 2e-3, 5e-3, 5e-2);
    ASSERT_EQ_INT(g_nblocked, dt_k_act_block() ? 8 : 0);
    g_blocked = false;
    for (int i = 0; i < 4; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(x);
    ASSERT_EQ_INT(bad, 0);
}

/* Loss = sum(out * R); returns the output values and every input gradient. */
static void run_once(bool blocked, dt_tensor **in, dt_tensor *x, float *out, float **grads)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    for (int i = 0; i < 4; i++)
        dt_ag_zero_grad(in[i]);
    g_blocked = blocked;
    dt_tensor *y = f_net(ctx, in, x);
    g_blocked = false;
    ASSERT(y);
    ASSERT(!(y->flags & DT_TENSOR_BLOCKED));
    int64_t n = dt_tensor_numel(y);
    ASSERT_OK(dt_tensor_read(y, out));
    dt_tensor *R = dt_tensor_empty(ctx, DT_F32, y->ndim, y->shape);
    for (int64_t i = 0; i < n; i++)
        ((float *)R->data)[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    ASSERT_OK(dt_backward_with(ctx, y, R));
    for (int i = 0; i < 4; i++)
        memcpy(grads[i], in[i]->grad->data, dt_tensor_nbytes(in[i]));
    dt_ctx_free(ctx);
}

/* A checkpointed region fed a blocked activation: same gradients as
 * without checkpointing (the region's output is made plain). */
static dt_tensor *ck_region(dt_ctx *c, int nin, dt_tensor **in, void *ud)
{
    (void)nin;
    (void)ud;
    return dt_max_pool2d(c, dt_relu(c, dt_batch_norm(c, in[0], NULL, NULL, NULL, NULL, true, 0.1f, 1e-5f)), 2, 0,
                         0);
}

static void ck_grad(bool ckpt, dt_tensor *x, dt_tensor *w, float *gw)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_ctx_set_blocked(ctx, true);
    dt_ag_zero_grad(w);
    dt_tensor *h = dt_conv2d(ctx, x, w, NULL, 1, 1);
    ASSERT(h);
    dt_tensor *y = ckpt ? dt_ag_checkpoint(ctx, ck_region, 1, &h, NULL) : ck_region(ctx, 1, &h, NULL);
    ASSERT(y);
    dt_tensor *f = dt_flatten(ctx, y, 1, -1);
    dt_tensor *l = dt_sum(ctx, dt_mul(ctx, f, f));
    ASSERT(l);
    ASSERT_OK(dt_backward(ctx, l));
    memcpy(gw, w->grad->data, dt_tensor_nbytes(w));
    dt_ctx_free(ctx);
}

TEST(checkpoint_region_on_blocked_input)
{
    dt_tensor *x = TC(31, 2, 3, 6, 6), *w = T(32, 8, 3, 3, 3);
    float g1[216], g2[216];
    ck_grad(false, x, w, g1);
    ck_grad(true, x, w, g2);
    for (int i = 0; i < 216; i++)
        ASSERT_NEAR(g2[i], g1[i], 1e-5, 1e-4);
    dt_tensor_free(x);
    dt_tensor_free(w);
}

/* nChw8c and nChw16c (forced with dt_k_act_block_set, whatever this
 * machine prefers) give bit-identical values and gradients: the block only
 * decides which channels sit side by side, never a summation order, and
 * oneDNN runs the same primitive (reordering when the block is not its
 * own). The plain path (region off) agrees to rounding only: its batch-norm
 * rows are summed with a vectorised reduction (norm.c) where the blocked
 * kernel sums each channel's lane in order, and it computes the first
 * convolution's weight gradient with oneDNN instead of the direct C = 1
 * kernel. */
TEST(blocked_equals_plain)
{
    dt_tensor *x = TC(17, 2, 1, 8, 8);
    dt_tensor *in[4];
    make_inputs(in);
    enum { NO = 128 };
    float o[3][NO], *g[3][4];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            g[k][i] = malloc(dt_tensor_nbytes(in[i]));
    static const int blocks[3] = {0, 8, 16};
    for (int k = 0; k < 3; k++) {
        ASSERT_OK(dt_k_act_block_set(blocks[k]));
        run_once(blocks[k] != 0, in, x, o[k], g[k]);
        ASSERT_EQ_INT(g_nblocked, blocks[k] && dt_k_conv2d_blocked_enabled() ? 8 : 0);
    }
    ASSERT_OK(dt_k_act_block_set(-1));
    if (memcmp(o[2], o[1], sizeof o[0]))
        TEST_FAIL_("nChw16c: forward values differ from nChw8c's");
    for (int i = 0; i < 4; i++)
        if (memcmp(g[2][i], g[1][i], dt_tensor_nbytes(in[i])))
            TEST_FAIL_("nChw16c: gradient of input %d differs from nChw8c's", i);
    for (int j = 0; j < NO; j++)
        ASSERT_NEAR(o[1][j], o[0][j], 1e-5, 1e-4);
    for (int i = 0; i < 4; i++)
        for (int64_t j = 0; j < dt_tensor_numel(in[i]); j++)
            ASSERT_NEAR(g[1][i][j], g[0][i][j], 1e-4, 1e-3);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            free(g[k][i]);
    for (int i = 0; i < 4; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(x);
}

/* The same net with beta, its blocks' tails as dt_batch_norm_relu_max_pool2x2
 * (g_fused) or as batch norm, ReLU and max pooling: in[0..3] as above,
 * in[4], in[5] the betas. */
static bool g_fused;
static dt_tensor *f_tail(dt_ctx *c, dt_tensor *h, dt_tensor *gamma, dt_tensor *beta)
{
    if (g_fused)
        return seen(dt_batch_norm_relu_max_pool2x2(c, h, gamma, beta, NULL, NULL, true, 0.1f, 1e-5f));
    h = dt_batch_norm(c, h, gamma, beta, NULL, NULL, true, 0.1f, 1e-5f);
    return seen(dt_max_pool2d(c, dt_relu(c, h), 2, 0, 0));
}

static dt_tensor *f_net_beta(dt_ctx *c, dt_tensor **in, void *u)
{
    bool old = dt_ctx_set_blocked(c, true);
    g_nblocked = 0;
    dt_tensor *h = f_tail(c, dt_conv2d(c, u, in[0], NULL, 1, 1), in[1], in[4]);
    h = f_tail(c, dt_conv2d(c, h, in[2], NULL, 1, 1), in[3], in[5]);
    h = dt_flatten(c, h, 1, -1);
    dt_ctx_set_blocked(c, old);
    return h;
}

static void run_beta(dt_tensor **in, dt_tensor *x, float *out, float **grads)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    for (int i = 0; i < 6; i++)
        dt_ag_zero_grad(in[i]);
    dt_tensor *y = f_net_beta(ctx, in, x);
    ASSERT(y);
    ASSERT_OK(dt_tensor_read(y, out));
    dt_tensor *R = dt_tensor_empty(ctx, DT_F32, y->ndim, y->shape);
    for (int64_t i = 0; i < dt_tensor_numel(y); i++)
        ((float *)R->data)[i] = (float)((i * 7) % 11) / 5.0f - 1.0f;
    ASSERT_OK(dt_backward_with(ctx, y, R));
    for (int i = 0; i < 6; i++)
        memcpy(grads[i], in[i]->grad->data, dt_tensor_nbytes(in[i]));
    dt_ctx_free(ctx);
}

/* Batch norm, ReLU and 2 x 2 max pooling as one op on blocked activations:
 * the three ops' values and gradients bit for bit in both blocks, and
 * finite differences agree with its gradients. */
TEST(fused_tail_equals_three_ops)
{
    dt_tensor *x = TC(19, 2, 1, 8, 8), *in[6];
    make_inputs(in);
    in[4] = T(8, 16), in[5] = T(9, 16);
    enum { NO = 128 };
    float o[2][NO], *g[2][6];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++)
            g[k][i] = malloc(dt_tensor_nbytes(in[i]));
    for (int B = 8; B <= 16; B += 8) {
        ASSERT_OK(dt_k_act_block_set(B));
        for (int k = 0; k < 2; k++) {
            g_fused = k == 1;
            run_beta(in, x, o[k], g[k]);
            ASSERT_EQ_INT(g_nblocked, dt_k_conv2d_blocked_enabled() ? 2 : 0);
        }
        if (memcmp(o[1], o[0], sizeof o[0]))
            TEST_FAIL_("block %d: the fused op's values differ from the three ops'", B);
        for (int i = 0; i < 6; i++)
            if (memcmp(g[1][i], g[0][i], dt_tensor_nbytes(in[i])))
                TEST_FAIL_("block %d: the fused op's gradient of input %d differs from the three ops'", B, i);
    }
    g_fused = true;
    int bad = gradcheck("fused_tail", 6, in, f_net_beta, x, 2e-3, 5e-3, 5e-2);
    g_fused = false;
    ASSERT_OK(dt_k_act_block_set(-1));
    ASSERT_EQ_INT(bad, 0);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++)
            free(g[k][i]);
    for (int i = 0; i < 6; i++)
        dt_tensor_free(in[i]);
    dt_tensor_free(x);
}

/* A blocked conv output read through the accessors and fed to ops that do
 * not understand the layout gives the plain values. */
TEST(accessors_and_other_ops_see_plain)
{
    dt_tensor *x = TC(21, 2, 3, 5, 5), *w = TC(22, 16, 3, 3, 3);
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    dt_tensor *yp = dt_conv2d(ctx, x, w, NULL, 1, 1); /* plain reference */
    ASSERT(yp && !(yp->flags & DT_TENSOR_BLOCKED));
    dt_ctx_set_blocked(ctx, true);
    dt_tensor *yb = dt_conv2d(ctx, x, w, NULL, 1, 1);
    ASSERT(yb);
    ASSERT_EQ_INT(dt_tensor_block(yb), dt_k_act_block());
    int64_t n = dt_tensor_numel(yp);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
    ASSERT_OK(dt_tensor_read(yb, b));
    for (int64_t i = 0; i < n; i++) {
        a[i] = ((float *)yp->data)[i];
        ASSERT_NEAR(b[i], a[i], 1e-5, 1e-5);
        ASSERT_NEAR(dt_tensor_get(yb, i), a[i], 1e-5, 1e-5);
    }
    dt_tensor *c = dt_tensor_clone(ctx, yb);
    dt_tensor *s = dt_add(ctx, yb, yb);             /* converts */
    dt_tensor *r = dt_reshape(ctx, yb, 2, SH(2, 400));
    dt_tensor *e = dt_batch_norm(ctx, yb, NULL, NULL, dt_tensor_zeros(ctx, DT_F32, 1, SH(16)),
                                 dt_tensor_full(ctx, DT_F32, 1, SH(16), 1.0), false, 0.1f, 0.0f + 1e-5f);
    dt_tensor *v = dt_avg_pool2d(ctx, yb, 5, 5, 0);
    dt_tensor *vp = dt_avg_pool2d(ctx, yp, 5, 5, 0);
    ASSERT(c && s && r && e && v && vp);
    ASSERT(!(s->flags & DT_TENSOR_BLOCKED) && !(r->flags & DT_TENSOR_BLOCKED));
    ASSERT(!(e->flags & DT_TENSOR_BLOCKED) && !(v->flags & DT_TENSOR_BLOCKED));
    for (int64_t i = 0; i < n; i++) {
        ASSERT_NEAR(dt_tensor_get(c, i), a[i], 1e-5, 1e-5);
        ASSERT_NEAR(((float *)s->data)[i], 2 * a[i], 1e-5, 1e-5);
        ASSERT_NEAR(((float *)r->data)[i], a[i], 1e-5, 1e-5);
        ASSERT_NEAR(((float *)e->data)[i], a[i] / sqrt(1.0 + 1e-5), 1e-5, 1e-4);
    }
    for (int64_t i = 0; i < dt_tensor_numel(vp); i++)
        ASSERT_NEAR(((float *)v->data)[i], ((float *)vp->data)[i], 1e-5, 1e-5);
    /* seeding a backward from a blocked tensor is refused, not misread */
    if (yb->flags & DT_TENSOR_BLOCKED)
        ASSERT_STATUS(dt_backward_with(ctx, yb, yp), DT_ERR_INVALID_ARG);
    free(a);
    free(b);
    dt_ctx_free(ctx);
    dt_tensor_free(x);
    dt_tensor_free(w);
}

static void reorders_per_step(dt_model *m, int B, uint64_t *per)
{
    dt_ctx *ctx = NULL;
    dt_ctx_init(NULL, &ctx);
    float *img = calloc((size_t)B * 784, 4);
    int64_t *lab = calloc((size_t)B, 8);
    dt_tensor *xi = dt_tensor_wrap(img, DT_F32, 1, SH((int64_t)B * 784));
    ASSERT_OK(dt_tensor_rand_normal(xi, dt_rng_key_make(41, DT_RNG_USER, 0, 0), 0.0f, 1.0f));
    dt_tensor_free(xi);
    for (int i = 0; i < B; i++)
        lab[i] = i % 10;
    *per = 0;
    for (int step = 0; step < 2; step++) {
        dt_k_stats s0, s1;
        dt_k_stats_get(&s0);
        dt_model_zero_grad(m);
        dt_tensor *x = dt_tensor_view_of(ctx, img, DT_F32, 4, SH(B, 1, 28, 28));
        dt_tensor *y = dt_tensor_view_of(ctx, lab, DT_I64, 1, SH(B));
        dt_tensor *loss = dt_cross_entropy(ctx, dt_model_forward(ctx, m, x), y);
        ASSERT(loss);
        ASSERT_OK(dt_backward(ctx, loss));
        dt_k_stats_get(&s1);
        *per = s1.reorders - s0.reorders; /* the second step: caches warm */
        dt_ctx_reset(ctx);
    }
    free(img);
    free(lab);
    dt_ctx_free(ctx);
}

static dt_status noop_hook(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx;
    (void)m;
    (void)x;
    (void)ud;
    return DT_OK;
}

/* One ConvNet step's reorders with the blocked region (a) and without (b,
 * a forward hook on layer1 turns the region off), for the block this machine uses.
 * The region removes reorders where its block is the one oneDNN's
 * convolutions want (dt_k_onednn_block: nChw8c on AVX2, nChw16c on
 * AVX-512); the other block needs a reorder on both sides of every
 * convolution, so it makes more than the preferred one (13 vs 11 without the
 * region here with DT_BLOCKED=16 on AVX2, the failure this test once had on
 * AVX-512 with nChw8c hard-wired; since batch norm, ReLU and pooling run as
 * one op on blocked activations the wrong block can come out below the
 * plain step: 10 vs 11 with nChw8c on AVX-512). Values agree either way.
 * *nblk gets the blocked step's reorders. */
static void step_reorders(int block, bool *ok, uint64_t *nblk)
{
    *ok = false;
    ASSERT_OK(dt_k_act_block_set(block));
    dt_model *a = t_create("convnet", 3, NULL), *b = t_create("convnet", 3, NULL);
    ASSERT(a && b);
    /* a forward hook inside the model disables the blocked region (it could
     * see the activations; the root's own hooks fire outside its forward and
     * a blind hook sees nothing: neither does) */
    ASSERT_OK(dt_module_add_forward_pre_hook(dt_model_find_module(b, "layer1"), noop_hook, NULL, NULL));
    uint64_t blk = 0, plain = 0;
    reorders_per_step(a, 100, &blk);
    reorders_per_step(b, 100, &plain);
    int pref = dt_k_onednn_block(), use = dt_k_act_block();
    printf("  reorders per ConvNet step, activations %s (oneDNN prefers %s): %llu blocked region, %llu without\n",
           dt_k_block_name(use), dt_k_block_name(pref), (unsigned long long)blk, (unsigned long long)plain);
    if (use == 0)
        ASSERT_EQ_U64(blk, plain);
    else if (use == pref)
        ASSERT(blk < plain);
    *nblk = blk;
    /* same values up to rounding (the batch-norm sums run in another order,
     * conv1's weight gradient another algorithm; random inputs, so no
     * near-ties in the max-pool windows) */
    float *ga = t_grads(a), *gb = t_grads(b);
    double d2 = 0, n2 = 0;
    for (size_t i = 0; i < t_numel(a); i++) {
        d2 += ((double)ga[i] - gb[i]) * ((double)ga[i] - gb[i]);
        n2 += (double)gb[i] * gb[i];
    }
    printf("  relative gradient difference %.3g\n", sqrt(d2 / n2));
    ASSERT(n2 > 0);
    ASSERT(sqrt(d2 / n2) < 1e-5);
    dt_model_free(a);
    dt_model_free(b);
    *ok = true;
}

TEST(convnet_step_reorders)
{
    bool ok;
    uint64_t n;
    step_reorders(-1, &ok, &n); /* the default: DT_BLOCKED, else oneDNN's preference */
    ASSERT_OK(dt_k_act_block_set(-1));
    ASSERT(ok);
    if (!getenv("DT_BLOCKED") && dt_k_conv2d_blocked_enabled())
        ASSERT_EQ_INT(dt_k_act_block(), dt_k_onednn_block()); /* never assumed: what oneDNN picked */
}

/* Both blocks on this machine, whichever it prefers. */
TEST(convnet_step_both_blocks)
{
    uint64_t n[2] = {0, 0};
    int used[2] = {0, 0};
    for (int B = 8; B <= 16; B += 8) {
        bool ok;
        step_reorders(B, &ok, &n[B / 16]);
        used[B / 16] = dt_k_act_block();
        ASSERT_OK(dt_k_act_block_set(-1));
        ASSERT(ok);
    }
    /* where both blocks ran blocked, the one oneDNN does not prefer costs more reorders */
    const int pref = dt_k_onednn_block();
    if (used[0] == 8 && used[1] == 16 && (pref == 8 || pref == 16))
        ASSERT(pref == 8 ? n[1] > n[0] : n[0] > n[1]);
}

int main(void)
{
    RUN(gradcheck_blocked_path);
    RUN(blocked_equals_plain);
    RUN(fused_tail_equals_three_ops);
    RUN(accessors_and_other_ops_see_plain);
    RUN(convnet_step_reorders);
    RUN(convnet_step_both_blocks);
    RUN(checkpoint_region_on_blocked_input);
    (void)gc_distinct;
    (void)gc_away_from_zero;
    return TEST_REPORT();
}
