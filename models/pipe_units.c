/* The zoo models as lists of pipeline units (pipeline.h,
 * dt_model_pipe_units), and cutting units into balanced stages.
 *
 * A unit names the parameters it uses by entry-name prefix, so a stage's
 * parameters (and so the optimizer ranges a pipeline rank steps) follow
 * from the cut without running anything. The GPT's first unit is its
 * embeddings (the same function the model's own forward calls,
 * dt__gpt2_embed), then one unit per block, ln_f, and the tied head. */
#include "nn/nn_impl.h"
#include "parallel/pipeline/pipe_impl.h"
#include "zoo.h"
#include "dtrain/tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_tensor *gpt_embed(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)m;
    return dt__gpt2_embed(ctx, u->module, x);
}

/* The MLP's units: x @ w0, then h @ w1 (unit name "w0" / "w1"). Tensor
 * parallel (the module's ud is the group, mlp.c): f(x) @ w0_r, then
 * g(h_r @ w1_r), so what crosses the stages is the rank's hidden slice. */
static dt_tensor *mlp_unit(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)m;
    dt_pg *tp = u->module->ud;
    if (!strcmp(u->name, "w0"))
        return dt_matmul(ctx, tp ? dt_tp_copy_to_region(ctx, tp, x) : x, dt_module_param(u->module, 0));
    dt_tensor *z = dt_matmul(ctx, x, dt_module_param(u->module, 1));
    return tp ? dt_tp_reduce_from_region(ctx, tp, z) : z;
}

static void set_unit(dt_pipe_unit *u, const char *name, dt_module *mod, dt_pipe_unit_fn fn, const char *p0,
                     const char *p1)
{
    memset(u, 0, sizeof *u);
    snprintf(u->name, sizeof u->name, "%s", name);
    u->module = mod;
    u->fn = fn;
    if (p0)
        snprintf(u->params[0], sizeof u->params[0], "%s", p0);
    if (p1)
        snprintf(u->params[1], sizeof u->params[1], "%s", p1);
}

dt_status dt_model_pipe_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    if (!m || !units || !n)
        return dt_error(DT_ERR_NULL, "dt_model_pipe_units: an argument is NULL");
    *units = NULL;
    *n = 0;
    dt_module *root = dt_model_root(m);
    const char *type = dt_module_type(root);
    dt_pipe_unit *u = NULL;
    int k = 0;
    if (!strcmp(type, "GPT2LMHeadModel")) {
        dt_module *tr = dt_model_find_module(m, "transformer"), *h = dt_model_find_module(m, "transformer.h");
        dt_module *lnf = dt_model_find_module(m, "transformer.ln_f"), *head = dt_model_find_module(m, "lm_head");
        if (!tr || !h || !lnf || !head)
            return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a GPT2LMHeadModel without transformer.h, "
                            "transformer.ln_f or lm_head");
        int L = dt_module_num_children(h);
        if (!(u = dt_calloc((size_t)(L + 3) * sizeof *u)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
        set_unit(&u[k++], "transformer.wte+wpe", tr, gpt_embed, "transformer.wte", "transformer.wpe");
        for (int i = 0; i < L; i++) {
            const char *path = dt_module_path(dt_module_child(h, i));
            set_unit(&u[k++], path, dt_module_child(h, i), NULL, path, NULL);
        }
        set_unit(&u[k++], "transformer.ln_f", lnf, NULL, "transformer.ln_f", NULL);
        set_unit(&u[k++], "lm_head", head, NULL, "lm_head", NULL);
    } else if (!strcmp(type, "MLP") && dt_module_num_children(root) == 0) {
        if (!(u = dt_calloc(2 * sizeof *u)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
        set_unit(&u[k++], "w0", root, mlp_unit, "w0", NULL);
        set_unit(&u[k++], "w1", root, mlp_unit, "w1", NULL);
    } else if (dt_module_kind(root) == DT_NN_SEQUENTIAL) {
        int c = dt_module_num_children(root);
        if (c < 1)
            return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: an empty Sequential");
        if (!(u = dt_calloc((size_t)c * sizeof *u)))
            return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
        for (int i = 0; i < c; i++) {
            const char *path = dt_module_path(dt_module_child(root, i));
            set_unit(&u[k++], path, dt_module_child(root, i), NULL, path, NULL);
        }
    } else {
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a model of type '%s' has no pipeline units (the GPT "
                        "zoo models, \"mlp\" and models whose root is a Sequential have)", type);
    }
    *units = u;
    *n = k;
    return DT_OK;
}

/* ---- balancing ------------------------------------------------------------------------ */

static bool under(const char *name, const char *prefix)
{
    size_t l = strlen(prefix);
    return l && !strncmp(name, prefix, l) && (name[l] == '\0' || name[l] == '.');
}

bool dt__pipe_unit_uses(const dt_pipe_unit *u, const char *entry)
{
    for (int j = 0; j < 4; j++)
        if (under(entry, u->params[j]))
            return true;
    return false;
}

dt_status dt_pipe_balance(const dt_model *m, const dt_pipe_unit *units, int n, int S, int *starts)
{
    if (!m || !units || !starts)
        return dt_error(DT_ERR_NULL, "dt_pipe_balance: an argument is NULL");
    if (S < 1 || n < S)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_balance: %d units cannot make %d stages (each stage needs at "
                        "least one unit)", n, S);
    double *w = dt_calloc((size_t)n * sizeof *w), *best = dt_calloc((size_t)(n + 1) * (size_t)(S + 1) * sizeof *best);
    int *arg = dt_calloc((size_t)(n + 1) * (size_t)(S + 1) * sizeof *arg);
    dt_status st = DT_OK;
    if (!w || !best || !arg) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_pipe_balance");
        goto done;
    }
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        if ((st = dt_model_entry(m, e, &pi)) < 0)
            goto done;
        if (pi.is_buffer)
            continue;
        for (int i = 0; i < n; i++)
            if (dt__pipe_unit_uses(&units[i], pi.name))
                w[i] += (double)pi.numel;
    }
    /* best[i][s]: the smallest largest stage over cuts of units [0, i)
     * into s stages; arg: where the last of them begins */
#define BEST(i, s) best[(size_t)(i) * (size_t)(S + 1) + (size_t)(s)]
#define ARG(i, s) arg[(size_t)(i) * (size_t)(S + 1) + (size_t)(s)]
    for (int i = 0; i <= n; i++)
        for (int s = 0; s <= S; s++)
            BEST(i, s) = -1;
    BEST(0, 0) = 0;
    for (int s = 1; s <= S; s++)
        for (int i = s; i <= n; i++) {
            double sum = 0;
            for (int j = i - 1; j >= s - 1; j--) { /* last stage = units [j, i) */
                sum += w[j];
                if (BEST(j, s - 1) < 0)
                    continue;
                double c = BEST(j, s - 1) > sum ? BEST(j, s - 1) : sum;
                if (BEST(i, s) < 0 || c < BEST(i, s)) {
                    BEST(i, s) = c;
                    ARG(i, s) = j;
                }
            }
        }
    for (int s = S, i = n; s >= 1; s--) {
        starts[s - 1] = ARG(i, s);
        i = ARG(i, s);
    }
#undef BEST
#undef ARG
done:
    dt_free(w);
    dt_free(best);
    dt_free(arg);
    return st;
}
