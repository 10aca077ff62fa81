/* Activation checkpointing as a property of every zoo model: each
 * descriptor names its checkpoint units (dt_model_desc.ckpt_unit: the
 * ConvNet's conv blocks, the MLP's module, GPT blocks), the library turns
 * them on (dt_model_desc_checkpoint, dt_model_checkpoint_fn with any
 * policy), and a training step with them gives the loss and every gradient
 * bit for bit as without them, over two steps (batch norm's running
 * statistics advance in between). Blind hooks (ZeRO-3's parameter gathers:
 * dt_module_hook_set_blind) fire where they are and change no value either,
 * alone or under checkpointing: the ConvNet keeps its channel-blocked
 * activations around them, so a sharded run computes what DDP computes. */
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 6 };

typedef struct {
    dt_model *m;
    dt_model_desc d;
    size_t numel;
} model;

static void make(model *o, const char *name)
{
    dt_model_config c = dt_model_config_default();
    c.mlp_seq = 4, c.mlp_dim = 24, c.mlp_hidden = 40;
    ASSERT_OK(dt_model_create(name, 77, &c, &o->m, &o->d));
    o->numel = dt_model_flat(o->m, DT_FLAT_GRADS, DT_F32)->numel;
}

/* One training step's loss and gradients (step s picks the batch). */
static float step(const model *o, int s, float *grads)
{
    dt_ctx *ctx;
    if (dt_ctx_init(NULL, &ctx) < 0)
        return NAN;
    int nd, tnd;
    int64_t xs[DT_MAX_DIMS], ys[DT_MAX_DIMS];
    dt_dtype ydt;
    float l = NAN;
    if (dt_model_desc_shapes(&o->d, B, &nd, xs, &tnd, ys, &ydt) < 0)
        goto out;
    int64_t nx = 1;
    for (int i = 0; i < nd; i++)
        nx *= xs[i];
    float *x = malloc((size_t)nx * sizeof *x);
    int64_t y[B];
    dt_rng_key k = dt_rng_key_make(5, 9, (uint64_t)s, 0);
    for (int64_t i = 0; i < nx; i++)
        x[i] = 2 * dt_rng_uniform(k, (uint64_t)i) - 1;
    for (int i = 0; i < B; i++)
        y[i] = (int64_t)(dt_rng_uniform(k, (uint64_t)(nx + i)) * 10) % 10;
    dt_model_zero_grad(o->m);
    dt_tensor *out = dt_model_forward(ctx, o->m, dt_tensor_view_of(ctx, x, DT_F32, nd, xs));
    dt_tensor *loss = dt_model_desc_loss(ctx, &o->d, out, o->d.has_target ? dt_tensor_view_of(ctx, y, DT_I64, 1, ys) : NULL);
    if (loss && dt_backward(ctx, loss) == DT_OK)
        l = dt_tensor_item(loss);
    memcpy(grads, dt_model_flat(o->m, DT_FLAT_GRADS, DT_F32)->base, o->numel * sizeof(float));
    free(x);
out:
    dt_ctx_free(ctx);
    return l;
}

/* ref and o take the same two steps: equal loss bits and gradients */
static void same_steps(const model *ref, const model *o)
{
    float *ga = malloc(ref->numel * 4), *gb = malloc(ref->numel * 4);
    for (int s = 0; s < 2; s++) {
        float la = step(ref, s, ga), lb = step(o, s, gb);
        ASSERT(isfinite(la));
        ASSERT_EQ_INT(memcmp(&la, &lb, sizeof la), 0);
        ASSERT_EQ_INT(memcmp(ga, gb, ref->numel * 4), 0);
    }
    free(ga), free(gb);
}

static int g_fired;
static dt_status pre(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx, (void)m, (void)x, (void)ud;
    g_fired++;
    return DT_OK;
}
static dt_status bwd(dt_ctx *ctx, dt_module *m, void *ud)
{
    (void)ctx, (void)m, (void)ud;
    g_fired++;
    return DT_OK;
}

/* a blind forward pre-hook and backward pre-hook on module `path` */
static void blind_hooks(dt_model *m, const char *path)
{
    dt_module *mod = dt_model_find_module(m, path);
    ASSERT(mod != NULL);
    dt_hook_id a, b;
    ASSERT_OK(dt_module_add_forward_pre_hook(mod, pre, NULL, &a));
    ASSERT_OK(dt_module_add_backward_pre_hook(mod, bwd, NULL, &b));
    ASSERT_OK(dt_module_hook_set_blind(mod, a));
    ASSERT_OK(dt_module_hook_set_blind(mod, b));
}

TEST(every_zoo_model_names_its_units)
{
    const char *names[] = {"convnet", "mlp", "gpt-micro"}, *units[] = {"Sequential", "MLP", "GPT2Block"};
    const int want[] = {2, 1, 2};
    for (int i = 0; i < 3; i++) {
        model o;
        make(&o, names[i]);
        ASSERT_STR_EQ(o.d.ckpt_unit, units[i]);
        dt_act_ckpt_params p = dt_act_ckpt_params_default();
        int n = -1;
        ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, &p, &n));
        ASSERT_EQ_INT(n, want[i]);
        p.number_checkpoints = 1; /* the first unit only */
        ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, &p, &n));
        ASSERT_EQ_INT(n, 1);
        ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, NULL, &n)); /* off */
        ASSERT_EQ_INT(n, 0);
        dt_model_desc none = o.d;
        none.ckpt_unit[0] = 0;
        ASSERT_STATUS(dt_model_desc_checkpoint(o.m, &none, &p, &n), DT_ERR_UNSUPPORTED);
        ASSERT_STR_CONTAINS(dt_last_error(), "names no checkpoint units");
        dt_model_free(o.m);
    }
}

static bool is_fc(const dt_module *m, void *ud)
{
    (void)ud;
    return !strcmp(dt_module_path(m), "fc");
}

TEST(convnet_checkpointed_blocks_same_bits)
{
    model ref, o;
    make(&ref, "convnet");
    make(&o, "convnet");
    int n = 0;
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, &p, &n));
    ASSERT_EQ_INT(n, 2);
    same_steps(&ref, &o);
    /* any policy (apply_activation_checkpointing's check_fn): the head too */
    ASSERT_OK(dt_model_checkpoint_fn(o.m, is_fc, NULL, &p, &n));
    ASSERT_EQ_INT(n, 1);
    same_steps(&ref, &o);
    dt_model_free(ref.m), dt_model_free(o.m);
}

TEST(convnet_blind_hooks_same_bits)
{
    model ref, o;
    make(&ref, "convnet");
    make(&o, "convnet");
    /* ZeRO-3's units with --wrap-min-params 1000: layer2.0 and fc, the root */
    blind_hooks(o.m, "layer2.0");
    blind_hooks(o.m, "fc");
    blind_hooks(o.m, "");
    g_fired = 0;
    same_steps(&ref, &o);
    ASSERT_EQ_INT(g_fired, 2 * 6); /* two steps, three modules, forward and backward */
    /* and under checkpointing of the blocks: the hook in layer2 fires again
     * in the recomputation */
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, &p, NULL));
    g_fired = 0;
    same_steps(&ref, &o);
    ASSERT(g_fired > 2 * 6);
    ASSERT_STATUS(dt_module_hook_set_blind(dt_model_root(o.m), 9999), DT_ERR_NOT_FOUND);
    dt_model_free(ref.m), dt_model_free(o.m);
}

TEST(mlp_checkpointed_same_bits)
{
    model ref, o;
    make(&ref, "mlp");
    make(&o, "mlp");
    int n = 0;
    dt_act_ckpt_params p = dt_act_ckpt_params_default();
    ASSERT_OK(dt_model_desc_checkpoint(o.m, &o.d, &p, &n));
    ASSERT_EQ_INT(n, 1);
    same_steps(&ref, &o);
    dt_model_free(ref.m), dt_model_free(o.m);
}

int main(void)
{
    RUN(every_zoo_model_names_its_units);
    RUN(convnet_checkpointed_blocks_same_bits);
    RUN(convnet_blind_hooks_same_bits);
    RUN(mlp_checkpointed_same_bits);
    return TEST_REPORT();
}
