/* The MLP of Paddle's auto-parallel (semi-auto) examples:
 *
 *   w0 = create_parameter([1024, 4096]); w1 = create_parameter([4096, 1024])
 *   z = matmul(matmul(x, w0), w1)          x [B, 128, 1024]
 *   loss = mean(z)
 *
 * No bias, no activation. Paddle initialises create_parameter weights with
 * Xavier-uniform (fan_in = shape[0], fan_out = shape[1]); we do the same from
 * the Philox stream. Tensor names are "w0" and "w1" (one custom module).
 *
 * Tensor parallel (dt_model_config.tp, the seed's w0 Shard(1), w1
 * Shard(0)): w0 holds the rank's hidden/t columns, w1 the same rows, and
 * z = g(f(x) @ w0_r @ w1_r): f's backward and g's forward are the layer's
 * two all-reduces (Megatron's MLP without the GELU).
 *
 * Activation checkpointing: the one module is the unit (ckpt_unit "MLP"):
 * both matmuls recompute in backward and only x and z are kept; a region
 * per matmul would keep its output, the very hidden activation it means to
 * drop. */
#include "zoo.h"

#include <dtrain/pipeline.h>
#include <dtrain/tp.h>

#include <stdio.h>
#include <string.h>

static dt_tensor *mlp_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const dt_tensor *w0 = dt_module_param(self, 0);
    if (x->ndim < 2 || x->shape[x->ndim - 1] != w0->shape[0]) {
        char buf[96];
        dt_error(DT_ERR_SHAPE, "input %s, expected [..., %lld]", dt_tensor_shape_str(x, buf, sizeof buf),
                 (long long)w0->shape[0]);
        return NULL;
    }
    if (ud) /* tensor parallel over the group ud */
        x = dt_tp_copy_to_region(ctx, ud, x);
    dt_tensor *h = dt_matmul(ctx, x, dt_module_param(self, 0));
    h = dt_matmul(ctx, h, dt_module_param(self, 1));
    return ud ? dt_tp_reduce_partial(ctx, ud, h) : h;
}

/* The pipeline units (nn.h, dt_model_set_pipe_units): x @ w0, then h @ w1
 * (unit names "w0" / "w1"), each costing its parameter count (a Linear's
 * multiply-adds per row). Tensor parallel (the module's user data is the
 * group): f(x) @ w0_r, then g(h_r @ w1_r), so what crosses the stages is
 * the rank's hidden slice. */
static dt_tensor *mlp_unit(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)m;
    dt_pg *tp = dt_module_user_data(u->module);
    if (!strcmp(u->name, "w0"))
        return dt_matmul(ctx, tp ? dt_tp_copy_to_region(ctx, tp, x) : x, dt_module_param(u->module, 0));
    dt_tensor *z = dt_matmul(ctx, x, dt_module_param(u->module, 1));
    return tp ? dt_tp_reduce_partial(ctx, tp, z) : z;
}

static dt_status mlp_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    dt_module *root = dt_model_root(m);
    if (dt_module_num_children(root) != 0) /* LoRA adapters or the like: not the two weights alone */
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a model of type '%s' has no pipeline units (the GPT "
                        "and Llama zoo models, \"mlp\" and models whose root is a Sequential have)",
                        dt_module_type(root));
    dt_pipe_unit *u = dt_calloc(2 * sizeof *u);
    double cost[2];
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
    dt__zoo_unit(&u[0], "w0", root, mlp_unit, "w0", NULL);
    dt__zoo_unit(&u[1], "w1", root, mlp_unit, "w1", NULL);
    dt_status st = dt_pipe_unit_costs(m, u, 2, DT_PIPE_BY_PARAMS, cost);
    if (st < 0) {
        dt_free(u);
        return st;
    }
    u[0].cost = cost[0], u[1].cost = cost[1];
    *units = u;
    *n = 2;
    return DT_OK;
}

dt_status dt__model_mlp(uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d)
{
    if (c->mlp_seq <= 0 || c->mlp_dim <= 0 || c->mlp_hidden <= 0)
        return dt_error(DT_ERR_INVALID_ARG, "mlp: seq, dim and hidden must be > 0");
    dt_pg *tp = c->tp && dt_pg_size(c->tp) > 1 ? c->tp : NULL;
    const int64_t t = tp ? dt_pg_size(tp) : 1;
    if (c->mlp_hidden % t)
        return dt_error(DT_ERR_INVALID_ARG, "mlp: hidden width %lld is not divisible by the tensor-parallel size %lld",
                        (long long)c->mlp_hidden, (long long)t);
    dt_nn_param_spec s[2] = {
        {.name = "w0", .ndim = 2, .shape = {c->mlp_dim, c->mlp_hidden / t}, .init = DT_NN_INIT_XAVIER,
         .tp_dim = tp ? 2 : 0},
        {.name = "w1", .ndim = 2, .shape = {c->mlp_hidden / t, c->mlp_dim}, .init = DT_NN_INIT_XAVIER,
         .tp_dim = tp ? 1 : 0},
    };
    dt_module *mlp = dt_nn_custom("MLP", 2, s, mlp_forward, tp);
    if (mlp && tp)
        dt_tp_module_set_group(mlp, tp); /* checkpoints and the gradient norm find the group */
    dt_status st = dt_model_build(mlp, seed, &c->build, out);
    if (st < 0)
        return st;
    dt_model_set_pipe_units(*out, mlp_units); /* how a pipeline cuts it */
    d->loss = DT_LOSS_MEAN;
    snprintf(d->ckpt_unit, sizeof d->ckpt_unit, "MLP"); /* activation-checkpointing units */
    d->input_ndim = 2;
    d->input_shape[0] = c->mlp_seq, d->input_shape[1] = c->mlp_dim;
    d->input_dtype = DT_F32;
    d->has_target = false;
    double one = 2.0 * (double)c->mlp_seq * (double)c->mlp_dim * (double)c->mlp_hidden;
    d->fwd_flops_per_sample = 2 * one;
    /* backward: dW0, dW1 and the hidden gradient (x needs none) */
    d->train_flops_per_sample = 5 * one;
    return DT_OK;
}
