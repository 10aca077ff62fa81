/* A model describes its own pipeline units (nn.h, dt_model_set_pipe_units;
 * pipeline.h, dt_model_pipe_units): a user's model that registers a units
 * function is cut by the generic partitioner exactly as it lists them (and
 * its units run: dt_pipe_unit_times); the partitioner never looks at the
 * model's type, so a user's model that merely carries a zoo type name
 * ("GPT2LMHeadModel", "MLP") without a units function is refused with an
 * error naming dt_model_set_pipe_units; a units function's failure, an
 * empty list and a bad cost are refused; the zoo's builders register
 * theirs. */
#include "test.h"

#include "dtrain/dtrain.h"

#include <math.h>
#include <string.h>

/* MyNet: x -> fc1 -> relu -> fc2, a custom root (not a Sequential). */
static dt_tensor *mynet_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *h = dt_module_forward(ctx, dt_module_find_child(self, "fc1"), x);
    h = dt_module_forward(ctx, dt_module_find_child(self, "act"), h);
    return dt_module_forward(ctx, dt_module_find_child(self, "fc2"), h);
}

static int g_mode; /* 0: fine; 1: fails; 2: no units; 3: a negative cost */

/* [fc1 + act (by a function), fc2 (by its module)], costs = weight elements. */
static dt_tensor *unit_fc1(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)u;
    dt_module *r = dt_model_root(m);
    return dt_module_forward(ctx, dt_module_find_child(r, "act"),
                             dt_module_forward(ctx, dt_module_find_child(r, "fc1"), x));
}

static dt_status mynet_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    if (g_mode == 1)
        return dt_error(DT_ERR_STATE, "mynet_units: refusing on purpose");
    dt_pipe_unit *u = dt_calloc(2 * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "mynet_units");
    if (g_mode == 2) {
        *units = u;
        *n = 0;
        return DT_OK;
    }
    strcpy(u[0].name, "fc1+act");
    strcpy(u[0].params[0], "fc1");
    u[0].fn = unit_fc1;
    u[0].cost = g_mode == 3 ? -1.0 : 8.0 * 16.0;
    strcpy(u[1].name, "fc2");
    strcpy(u[1].params[0], "fc2");
    u[1].module = dt_model_find_module(m, "fc2");
    u[1].cost = 16.0 * 4.0;
    *units = u;
    *n = 2;
    return DT_OK;
}

/* NULL on a failure (the callers check). */
static dt_model *mynet(const char *type)
{
    dt_module *root = dt_nn_custom(type, 0, NULL, mynet_forward, NULL);
    dt_model *m = NULL;
    if (!root || dt_nn_add(root, "fc1", dt_nn_linear(8, 16, true)) != DT_OK ||
        dt_nn_add(root, "act", dt_nn_relu()) != DT_OK || dt_nn_add(root, "fc2", dt_nn_linear(16, 4, true)) != DT_OK) {
        dt_module_free(root);
        return NULL;
    }
    return dt_model_build(root, 1, NULL, &m) == DT_OK ? m : NULL;
}

TEST(user_model_lists_its_units)
{
    dt_model *m = mynet("MyNet");
    ASSERT(m);
    dt_pipe_unit *u;
    int n;
    ASSERT(dt_model_get_pipe_units(m) == NULL);
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_UNSUPPORTED); /* neither a units function nor a Sequential */
    ASSERT(strstr(dt_last_error(), "dt_model_set_pipe_units"));
    g_mode = 0;
    ASSERT(dt_model_set_pipe_units(m, mynet_units) == DT_OK);
    ASSERT(dt_model_get_pipe_units(m) == mynet_units);
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_OK);
    ASSERT_EQ_INT(n, 2);
    ASSERT(!strcmp(u[0].name, "fc1+act") && !strcmp(u[1].name, "fc2"));
    ASSERT(u[0].cost == 128.0 && u[1].cost == 64.0);
    ASSERT(dt_pipe_unit_uses(&u[0], "fc1.weight") && dt_pipe_unit_uses(&u[0], "fc1.bias"));
    ASSERT(!dt_pipe_unit_uses(&u[0], "fc2.weight") && dt_pipe_unit_uses(&u[1], "fc2.weight"));
    ASSERT(!dt_pipe_unit_uses(&u[0], "fc10.weight")); /* a prefix is a whole name component */
    /* by parameter count: fc1 8x16+16, fc2 16x4+4 */
    double c[2];
    ASSERT(dt_pipe_unit_costs(m, u, n, DT_PIPE_BY_PARAMS, c) == DT_OK);
    ASSERT(c[0] == 144.0 && c[1] == 68.0);
    int starts[2];
    ASSERT(dt_pipe_balance(c, n, 2, 1, starts) == DT_OK);
    ASSERT(starts[0] == 0 && starts[1] == 1);
    /* the units run: the function one and the module one */
    float xs[3 * 8];
    for (int i = 0; i < 3 * 8; i++)
        xs[i] = (float)i / 24.0f;
    dt_tensor x;
    ASSERT(dt_tensor_init_contiguous(&x, DT_F32, 2, (int64_t[]){3, 8}, xs) == DT_OK);
    double t[2] = {-1, -1};
    ASSERT(dt_pipe_unit_times(m, u, n, &x, DT_F32, 1, t) == DT_OK);
    ASSERT(t[0] >= 0 && t[1] >= 0 && isfinite(t[0]) && isfinite(t[1]));
    dt_free(u);
    dt_model_free(m);
}

TEST(type_names_are_not_read)
{
    /* a user's model named like a zoo model gets no zoo units */
    const char *types[] = {"GPT2LMHeadModel", "LlamaForCausalLM", "MLP"};
    for (int i = 0; i < 3; i++) {
        dt_model *m = mynet(types[i]);
        ASSERT(m);
        dt_pipe_unit *u = NULL;
        int n = -1;
        ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_UNSUPPORTED);
        ASSERT(strstr(dt_last_error(), "dt_model_set_pipe_units"));
        ASSERT(strstr(dt_last_error(), types[i]));
        ASSERT(u == NULL && n == 0);
        dt_model_free(m);
    }
}

TEST(bad_units_are_refused)
{
    dt_model *m = mynet("MyNet");
    ASSERT(m);
    ASSERT(dt_model_set_pipe_units(m, mynet_units) == DT_OK);
    dt_pipe_unit *u = NULL;
    int n = -1;
    g_mode = 1;
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_STATE);
    ASSERT(strstr(dt_last_error(), "refusing on purpose"));
    g_mode = 2;
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "no units"));
    g_mode = 3;
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_INVALID_ARG);
    ASSERT(strstr(dt_last_error(), "fc1+act"));
    ASSERT(u == NULL && n == 0);
    g_mode = 0;
    ASSERT(dt_model_set_pipe_units(NULL, mynet_units) == DT_ERR_NULL);
    ASSERT(dt_model_get_pipe_units(NULL) == NULL);
    ASSERT(dt_model_set_pipe_units(m, NULL) == DT_OK); /* back to none */
    ASSERT(dt_model_pipe_units(m, &u, &n) == DT_ERR_UNSUPPORTED);
    dt_model_free(m);
}

TEST(zoo_models_register_theirs)
{
    dt_model_config mc = dt_model_config_default();
    mc.n_layer = 2, mc.n_head = 2, mc.n_embd = 32, mc.block_size = 8, mc.vocab_size = 64, mc.seq = 8;
    mc.mlp_seq = 4, mc.mlp_dim = 8, mc.mlp_hidden = 16;
    const char *names[] = {"gpt-micro", "mlp", "llama-tiny"};
    const int want[] = {2 * 2 + 3, 2, -1};
    for (int i = 0; i < 3; i++) {
        dt_model *m;
        ASSERT(dt_model_create(names[i], 1, &mc, &m, NULL) == DT_OK);
        ASSERT(dt_model_get_pipe_units(m) != NULL);
        dt_pipe_unit *u;
        int n;
        ASSERT(dt_model_pipe_units(m, &u, &n) == DT_OK);
        if (want[i] > 0)
            ASSERT_EQ_INT(n, want[i]);
        else
            ASSERT(n >= 4 && !strcmp(u[0].name, "model.embed_tokens") && !strcmp(u[n - 1].name, "lm_head"));
        for (int k = 0; k < n; k++)
            ASSERT(u[k].cost > 0);
        dt_free(u);
        dt_model_free(m);
    }
    dt_model *m; /* the ConvNet is one custom module: no units */
    ASSERT(dt_model_create("convnet", 1, NULL, &m, NULL) == DT_OK);
    ASSERT(dt_model_get_pipe_units(m) == NULL);
    dt_model_free(m);
}

int main(void)
{
    RUN(user_model_lists_its_units);
    RUN(type_names_are_not_read);
    RUN(bad_units_are_refused);
    RUN(zoo_models_register_theirs);
    return TEST_REPORT();
}
