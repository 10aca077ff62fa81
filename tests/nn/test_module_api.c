/* The public API for writing models (nn.h "writing models"): configuration
 * getters and setters, user data, parents, parameter specs and inits, the
 * plainness queries and the dropout key. The zoo's models use nothing
 * else; this checks each call's values and errors. */
#include "test.h"

#include "dtrain/nn.h"

static dt_tensor *id_fwd(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ctx, (void)self, (void)ud;
    return x;
}

static dt_status pre_hook(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ctx, (void)m, (void)x, (void)ud;
    return DT_OK;
}

TEST(config_of_builtins)
{
    dt_module_config c;
    dt_module *lin = dt_nn_linear(3, 5, true), *conv = dt_nn_conv2d(2, 4, 3, 2, 1, false);
    dt_module *bn = dt_nn_batchnorm2d(6, 1e-3f, 0.2f), *drop = dt_nn_dropout(0.25f), *fl = dt_nn_flatten(1, -1);
    dt_module *emb = dt_nn_embedding(10, 7), *pool = dt_nn_maxpool2d(2, 0, 0);
    ASSERT(lin && conv && bn && drop && fl && emb && pool);
    ASSERT_OK(dt_module_get_config(lin, &c));
    ASSERT_EQ_INT(c.in, 3);
    ASSERT_EQ_INT(c.out, 5);
    ASSERT(c.bias);
    ASSERT_OK(dt_module_get_config(conv, &c));
    ASSERT_EQ_INT(c.in, 2);
    ASSERT_EQ_INT(c.out, 4);
    ASSERT_EQ_INT(c.k, 3);
    ASSERT_EQ_INT(c.stride, 2);
    ASSERT_EQ_INT(c.pad, 1);
    ASSERT(!c.bias);
    ASSERT_OK(dt_module_get_config(bn, &c));
    ASSERT_EQ_INT(c.in, 6);
    ASSERT_NEAR(c.eps, 1e-3, 0, 1e-6);
    ASSERT_NEAR(c.momentum, 0.2, 0, 1e-6);
    ASSERT_OK(dt_module_get_config(drop, &c));
    ASSERT_NEAR(c.p, 0.25, 0, 0);
    ASSERT_OK(dt_module_get_config(fl, &c));
    ASSERT_EQ_INT(c.start_dim, 1);
    ASSERT_EQ_INT(c.end_dim, -1);
    ASSERT_OK(dt_module_get_config(emb, &c));
    ASSERT_EQ_INT(c.in, 10);
    ASSERT_EQ_INT(c.out, 7);
    ASSERT_OK(dt_module_get_config(pool, &c));
    ASSERT_EQ_INT(c.k, 2);
    ASSERT_EQ_INT(c.stride, 2); /* stride 0 = kernel */
    /* a built-in's configuration is its constructor's: not settable */
    c.in = 99;
    ASSERT_STATUS(dt_module_set_config(lin, &c), DT_ERR_INVALID_ARG);
    ASSERT_STR_CONTAINS(dt_last_error(), "Linear");
    ASSERT_OK(dt_module_get_config(lin, &c));
    ASSERT_EQ_INT(c.in, 3);
    ASSERT_STATUS(dt_module_set_user_data(lin, &c), DT_ERR_INVALID_ARG);
    ASSERT_STATUS(dt_module_get_config(NULL, &c), DT_ERR_NULL);
    ASSERT_STATUS(dt_module_get_config(lin, NULL), DT_ERR_NULL);
    dt_module *all[] = {lin, conv, bn, drop, fl, emb, pool};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        dt_module_free(all[i]);
}

TEST(custom_config_user_data_parent)
{
    int mark = 0;
    dt_module *root = dt_nn_custom("Root", 0, NULL, id_fwd, &mark), *kid = dt_nn_linear(2, 2, false);
    ASSERT(root && kid);
    dt_module_config c;
    ASSERT_OK(dt_module_get_config(root, &c));
    ASSERT_EQ_INT(c.k, 0); /* all 0 from dt_nn_custom */
    ASSERT_EQ_INT(c.in, 0);
    c.k = 12, c.pad = 1, c.in = 1024, c.eps = 0.5f;
    ASSERT_OK(dt_module_set_config(root, &c));
    dt_module_config d;
    ASSERT_OK(dt_module_get_config(root, &d));
    ASSERT_EQ_INT(d.k, 12);
    ASSERT_EQ_INT(d.pad, 1);
    ASSERT_EQ_INT(d.in, 1024);
    ASSERT_NEAR(d.eps, 0.5, 0, 0);
    ASSERT_STATUS(dt_module_set_config(root, NULL), DT_ERR_NULL);
    ASSERT_STATUS(dt_module_set_config(NULL, &c), DT_ERR_NULL);
    ASSERT(dt_module_user_data(root) == &mark);
    ASSERT_OK(dt_module_set_user_data(root, NULL));
    ASSERT(dt_module_user_data(root) == NULL);
    ASSERT(dt_module_user_data(NULL) == NULL);
    ASSERT(dt_module_parent(kid) == NULL);
    ASSERT_OK(dt_nn_add(root, "fc", kid));
    ASSERT(dt_module_parent(kid) == root);
    ASSERT(dt_module_parent(root) == NULL);
    ASSERT(dt_module_parent(NULL) == NULL);
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(root, 1, NULL, &m));
    /* after the build the configuration is still the module's own */
    c.k = 3;
    ASSERT_OK(dt_module_set_config(dt_model_root(m), &c));
    ASSERT_OK(dt_module_get_config(dt_model_root(m), &d));
    ASSERT_EQ_INT(d.k, 3);
    dt_model_free(m);
}

TEST(param_specs_and_init)
{
    dt_module *emb = dt_nn_embedding(50, 8), *lin = dt_nn_linear(4, 3, true);
    ASSERT(emb && lin);
    ASSERT_EQ_INT(dt_module_num_params(lin), 2);
    ASSERT_EQ_INT(dt_module_num_params(NULL), 0);
    dt_nn_param_spec s;
    ASSERT_OK(dt_module_param_spec(lin, 1, &s));
    ASSERT_STR_EQ(s.name, "bias");
    ASSERT_EQ_INT(s.ndim, 1);
    ASSERT_EQ_INT(s.shape[0], 3);
    ASSERT_STATUS(dt_module_param_spec(lin, 2, &s), DT_ERR_RANGE);
    ASSERT_STATUS(dt_module_param_spec(lin, -1, &s), DT_ERR_RANGE);
    ASSERT_STATUS(dt_module_set_param_init(lin, 5, DT_NN_INIT_ZEROS, 0), DT_ERR_RANGE);
    ASSERT_STATUS(dt_module_set_param_init(lin, 0, (dt_nn_init)77, 0), DT_ERR_INVALID_ARG);
    /* N(0, 0.02^2) in place of the Embedding's N(0, 1): the built weights say so */
    ASSERT_OK(dt_module_set_param_init(emb, 0, DT_NN_INIT_NORMAL, 0.02f));
    ASSERT_OK(dt_module_param_spec(emb, 0, &s));
    ASSERT_EQ_INT(s.init, DT_NN_INIT_NORMAL);
    ASSERT_NEAR(s.a, 0.02, 0, 1e-7);
    ASSERT_OK(dt_module_set_param_init(lin, 1, DT_NN_INIT_ONES, 0));
    dt_module *root = dt_nn_seq(0, NULL);
    ASSERT_OK(dt_nn_add(root, "emb", emb));
    ASSERT_OK(dt_nn_add(root, "lin", lin));
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(root, 7, NULL, &m));
    const dt_tensor *w = dt_module_param(emb, 0), *b = dt_module_param(lin, 1);
    double ss = 0, mx = 0;
    for (int64_t i = 0; i < 50 * 8; i++) {
        double v = ((const float *)w->data)[i];
        ss += v * v;
        mx = fabs(v) > mx ? fabs(v) : mx;
    }
    ASSERT(sqrt(ss / 400.0) < 0.04); /* N(0, 1) would give about 1 */
    ASSERT(sqrt(ss / 400.0) > 0.01);
    ASSERT(mx < 0.2);
    for (int i = 0; i < 3; i++)
        ASSERT_NEAR(((const float *)b->data)[i], 1.0, 0, 0);
    ASSERT_STATUS(dt_module_set_param_init(lin, 0, DT_NN_INIT_ZEROS, 0), DT_ERR_STATE);
    dt_model_free(m);
}

TEST(plain_and_observed)
{
    dt_module *root = dt_nn_custom("R", 0, NULL, id_fwd, NULL), *a = dt_nn_custom("A", 0, NULL, id_fwd, NULL);
    dt_module *leaf = dt_nn_relu();
    ASSERT(root && a && leaf);
    ASSERT_OK(dt_nn_add(a, "leaf", leaf));
    ASSERT_OK(dt_nn_add(root, "a", a));
    ASSERT(dt_module_is_plain(root));
    ASSERT(dt_module_tree_plain(root));
    ASSERT(dt_module_subtree_unobserved(root));
    dt_hook_id id;
    ASSERT_OK(dt_module_add_forward_pre_hook(leaf, pre_hook, NULL, &id));
    ASSERT(dt_module_is_plain(root)); /* root itself has none */
    ASSERT(dt_module_is_plain(a));
    ASSERT(!dt_module_is_plain(leaf));
    ASSERT(!dt_module_tree_plain(root));
    ASSERT(!dt_module_tree_plain(a));
    ASSERT(!dt_module_subtree_unobserved(root));
    ASSERT(dt_module_subtree_unobserved(leaf)); /* its own hooks are not looked at */
    /* a blind hook observes nothing, though the tree is no longer plain */
    ASSERT_OK(dt_module_hook_set_blind(leaf, id));
    ASSERT(dt_module_subtree_unobserved(root));
    ASSERT(!dt_module_tree_plain(root));
    ASSERT_OK(dt_module_remove_hook(leaf, id));
    ASSERT(dt_module_tree_plain(root));
    /* a replaced forward observes */
    ASSERT_OK(dt_module_set_forward(a, id_fwd, NULL));
    ASSERT(!dt_module_is_plain(a));
    ASSERT(!dt_module_subtree_unobserved(root));
    ASSERT_OK(dt_module_set_forward(a, NULL, NULL));
    ASSERT(dt_module_tree_plain(root));
    /* checkpointing (of a built model's module) makes it not plain, but observes nothing */
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(root, 1, NULL, &m));
    ASSERT(dt_module_tree_plain(root));
    dt_act_ckpt_params cp = dt_act_ckpt_params_default();
    ASSERT_OK(dt_module_set_checkpoint(a, &cp));
    ASSERT(!dt_module_is_plain(a));
    ASSERT(!dt_module_tree_plain(root));
    ASSERT(dt_module_subtree_unobserved(root));
    dt_model_free(m);
}

TEST(dropout_key)
{
    dt_module *root = dt_nn_seq(0, NULL), *d0 = dt_nn_dropout(0.5f), *d1 = dt_nn_dropout(0.5f);
    ASSERT(root && d0 && d1);
    ASSERT_OK(dt_nn_add(root, NULL, d0));
    ASSERT_OK(dt_nn_add(root, NULL, d1));
    dt_model *m = NULL;
    ASSERT_OK(dt_model_build(root, 5, NULL, &m));
    dt_model_train(m, true);
    dt_rng_key a = dt_module_dropout_key(d0), b = dt_module_dropout_key(d0), c = dt_module_dropout_key(d1);
    /* (seed, DT_RNG_DROPOUT, rank << 32 | index, count): d0 is module 1 of the model, d1 module 2 */
    dt_rng_key want_a = dt_rng_key_make(5, DT_RNG_DROPOUT, 1, 0), want_b = dt_rng_key_make(5, DT_RNG_DROPOUT, 1, 1);
    dt_rng_key want_c = dt_rng_key_make(5, DT_RNG_DROPOUT, 2, 0);
    ASSERT(!memcmp(&a, &want_a, sizeof a));
    ASSERT(!memcmp(&b, &want_b, sizeof b)); /* training: the count advanced */
    ASSERT(!memcmp(&c, &want_c, sizeof c));
    dt_model_train(m, false);
    dt_rng_key e1 = dt_module_dropout_key(d0), e2 = dt_module_dropout_key(d0);
    dt_rng_key want_e = dt_rng_key_make(5, DT_RNG_DROPOUT, 1, 2);
    ASSERT(!memcmp(&e1, &want_e, sizeof e1));
    ASSERT(!memcmp(&e2, &want_e, sizeof e2)); /* eval: no advance */
    dt_model_free(m);
}

int main(void)
{
    RUN(config_of_builtins);
    RUN(custom_config_user_data_parent);
    RUN(param_specs_and_init);
    RUN(plain_and_observed);
    RUN(dropout_key);
    return TEST_REPORT();
}
