/* The zoo models as lists of pipeline units (pipeline.h,
 * dt_model_pipe_units), and cutting units into balanced stages.
 *
 * A unit names the parameters it uses by entry-name prefix, so a stage's
 * parameters (and so the optimizer ranges a pipeline rank steps) follow
 * from the cut without running anything. The GPT's first unit is its
 * embeddings (the same function the model's own forward calls,
 * dt__gpt2_embed), then two units per block (its attention half and its MLP
 * half, dt__gpt2_block_half: the block's own forward is the two in turn),
 * ln_f, and the tied head. Each unit carries its compute per token (cost),
 * which dt_pipe_balance balances: by parameter count the embedding table,
 * which does no GEMM, would weigh as much as the tied head, which does a
 * V x C GEMM per token and the cross-entropy. */
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

/* Half a block (the unit's name ends in "attn" or "mlp"): refused if the
 * block was given hooks after the cut, which only its whole forward runs. */
static dt_tensor *gpt_half(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)m;
    if (!x)
        return NULL;
    if (dt__gpt2_block_hooked(u->module)) {
        dt_error(DT_ERR_STATE, "pipeline unit %s: its block got hooks, a forward override or activation "
                 "checkpointing after the model was cut into half blocks; set them before the strategy attaches",
                 u->name);
        return NULL;
    }
    size_t l = strlen(u->name);
    return dt__gpt2_block_half(ctx, u->module, x, l >= 3 && !strcmp(u->name + l - 3, "mlp"));
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

/* Elements of a module's parameter i (0 if absent), from its spec: a
 * meta model's parameters have no tensors yet. */
static double pnumel(dt_module *mod, int i)
{
    if (!mod || i < 0 || i >= mod->nparam)
        return 0;
    double n = 1;
    for (int d = 0; d < mod->specs[i].ndim; d++)
        n *= (double)mod->specs[i].shape[d];
    return n;
}

/* Elements of the weights (parameter 0) of children a and b of parent's child `name`. */
static double weights(dt_module *parent, const char *name, const char *a, const char *b)
{
    dt_module *c = dt_module_find_child(parent, name);
    return c ? pnumel(dt_module_find_child(c, a), 0) + pnumel(dt_module_find_child(c, b), 0) : 0;
}

/* The GPT: [embeddings, h.0 attention half, h.0 MLP half, ..., ln_f, the
 * tied head]; a block that carries hooks of its own is one unit. Costs per
 * token: matmul multiply-adds (a weight's elements), attention's
 * T-dependent part (causal: T C over QK^T and AV, T the block size, C this
 * rank's width), the head's GEMM with the tied wte plus a few per logit
 * for the cross-entropy, and the element-wise work (layer norms, residual
 * adds, the embedding gather) as a few per element. */
static dt_status gpt_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    dt_module *tr = dt_model_find_module(m, "transformer"), *h = dt_model_find_module(m, "transformer.h");
    dt_module *lnf = dt_model_find_module(m, "transformer.ln_f"), *head = dt_model_find_module(m, "lm_head");
    if (!tr || !h || !lnf || !head)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a GPT2LMHeadModel without transformer.h, "
                        "transformer.ln_f or lm_head");
    int L = dt_module_num_children(h), k = 0;
    dt_pipe_unit *u = dt_calloc((size_t)(2 * L + 3) * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
    const double C = pnumel(lnf, 0), T = (double)tr->in, V = pnumel(head, 0) / (C > 0 ? C : 1);
    set_unit(&u[k], "transformer.wte+wpe", tr, gpt_embed, "transformer.wte", "transformer.wpe");
    u[k++].cost = 2 * C;
    for (int i = 0; i < L; i++) {
        dt_module *b = dt_module_child(h, i);
        const char *path = dt_module_path(b);
        char nm[64], p0[64], p1[64];
        double attn = weights(b, "attn", "c_attn", "c_proj"), mlp = weights(b, "mlp", "c_fc", "c_proj");
        attn += T * attn / (4 * C) + 8 * C; /* attn / 4C: this rank's heads x head size */
        mlp += 8 * C + mlp / (2 * C);      /* mlp / 2C: its hidden width (the GELU) */
        if (dt__gpt2_block_hooked(b)) {
            set_unit(&u[k], path, b, NULL, path, NULL);
            u[k++].cost = attn + mlp;
            continue;
        }
        for (int half = 0; half < 2; half++) {
            snprintf(nm, sizeof nm, "%s.%s", path, half ? "ln_2+mlp" : "ln_1+attn");
            snprintf(p0, sizeof p0, "%s.%s", path, half ? "ln_2" : "ln_1");
            snprintf(p1, sizeof p1, "%s.%s", path, half ? "mlp" : "attn");
            set_unit(&u[k], nm, b, gpt_half, p0, p1);
            u[k++].cost = half ? mlp : attn;
        }
    }
    set_unit(&u[k], "transformer.ln_f", lnf, NULL, "transformer.ln_f", NULL);
    u[k++].cost = 4 * C;
    set_unit(&u[k], "lm_head", head, NULL, "lm_head", NULL);
    u[k++].cost = pnumel(head, 0) + 4 * V;
    *units = u;
    *n = k;
    return DT_OK;
}

/* The Llama decoder: [model.embed_tokens, model.layers.0, ..., model.norm,
 * lm_head], each by its module's own forward (a decoder layer whole).
 * Costs per token as the GPT's: the weights' elements, attention's
 * T H hd (T the longest sequence), a few per element for the norms and
 * residuals, the head's GEMM and the cross-entropy. */
static dt_status llama_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    dt_module *emb = dt_model_find_module(m, "model.embed_tokens"), *ls = dt_model_find_module(m, "model.layers");
    dt_module *norm = dt_model_find_module(m, "model.norm"), *head = dt_model_find_module(m, "lm_head");
    int64_t T = 0, V = 0;
    if (!emb || !ls || !norm || !head || !dt__llama_positions(m, &T, &V))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a LlamaForCausalLM without model.embed_tokens, "
                        "model.layers, model.norm or lm_head");
    int L = dt_module_num_children(ls), k = 0;
    dt_pipe_unit *u = dt_calloc((size_t)(L + 3) * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
    const double C = pnumel(norm, 0);
    set_unit(&u[k], "model.embed_tokens", emb, NULL, "model.embed_tokens", NULL);
    u[k++].cost = 2 * C;
    for (int i = 0; i < L; i++) {
        dt_module *b = dt_module_child(ls, i);
        dt_module *at = dt_module_find_child(b, "self_attn");
        double w = weights(b, "self_attn", "q_proj", "k_proj") + weights(b, "self_attn", "v_proj", "o_proj") +
                   weights(b, "mlp", "gate_proj", "up_proj") +
                   pnumel(dt_module_find_child(dt_module_find_child(b, "mlp"), "down_proj"), 0);
        double qw = at ? pnumel(dt_module_find_child(at, "q_proj"), 0) / (C > 0 ? C : 1) : 0; /* H hd */
        set_unit(&u[k], dt_module_path(b), b, NULL, dt_module_path(b), NULL);
        u[k++].cost = w + (double)T * qw + 16 * C;
    }
    set_unit(&u[k], "model.norm", norm, NULL, "model.norm", NULL);
    u[k++].cost = 4 * C;
    set_unit(&u[k], "lm_head", head, NULL, "lm_head", NULL);
    u[k++].cost = pnumel(head, 0) + 4 * (double)V;
    *units = u;
    *n = k;
    return DT_OK;
}

/* A unit's parameter elements (a tied entry counts in each unit naming it). */
static double unit_params(const dt_model *m, const dt_pipe_unit *u)
{
    double w = 0;
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        if (dt_model_entry(m, e, &pi) >= 0 && !pi.is_buffer && dt__pipe_unit_uses(u, pi.name))
            w += (double)pi.numel;
    }
    return w;
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
    if (!strcmp(type, "GPT2LMHeadModel"))
        return gpt_units(m, units, n);
    if (!strcmp(type, "LlamaForCausalLM"))
        return llama_units(m, units, n);
    if (!strcmp(type, "MLP") && dt_module_num_children(root) == 0) {
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
                        "and Llama zoo models, \"mlp\" and models whose root is a Sequential have)", type);
    }
    /* a Linear's (an MLP weight's) multiply-adds per row are its parameter
     * elements: the compute of these units is their parameter count */
    for (int i = 0; i < k; i++)
        u[i].cost = unit_params(m, &u[i]);
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

dt_status dt_pipe_unit_costs(const dt_model *m, const dt_pipe_unit *units, int n, dt_pipe_balance_by by, double *cost)
{
    if (!m || !units || !cost)
        return dt_error(DT_ERR_NULL, "dt_pipe_unit_costs: an argument is NULL");
    if (by == DT_PIPE_BY_TIME)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_costs: DT_PIPE_BY_TIME costs are measured on an input: "
                        "dt_pipe_unit_times");
    if ((unsigned)by > DT_PIPE_BY_TIME)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_costs: unknown balance %d", (int)by);
    for (int i = 0; i < n; i++) {
        cost[i] = by == DT_PIPE_BY_PARAMS ? unit_params(m, &units[i]) : units[i].cost;
        if (!(cost[i] >= 0) || cost[i] > 1e300)
            return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_unit_costs: unit %d (%s) has cost %g", i, units[i].name,
                            cost[i]);
    }
    return DT_OK;
}

/* The search of dt_pipe_balance for v > 1: stages left to right, each
 * rank's running sum; the incumbent (bR, bM) is improved lexicographically
 * (the busiest rank, then the largest stage). Costs are >= 0, so a stage
 * that exceeds the bound prunes every longer one too. */
typedef struct {
    const double *pre; /* prefix sums, n + 1 */
    int n, p, S;
    double sums[256], bR, bM;
    int cur[1025], *best;
    long nodes, budget;
} bsearch_t;

static void bsearch_rec(bsearch_t *b, int s, int i, double R, double M)
{
    if (++b->nodes > b->budget)
        return;
    int r = s % b->p;
    int jlo = s == b->S - 1 ? b->n : i + 1, jhi = b->n - (b->S - 1 - s);
    for (int j = jlo; j <= jhi; j++) {
        double w = b->pre[j] - b->pre[i], sr = b->sums[r] + w;
        double R2 = sr > R ? sr : R, M2 = w > M ? w : M;
        if (R2 > b->bR || (R2 == b->bR && M2 >= b->bM))
            break;
        b->cur[s] = i;
        if (s == b->S - 1) {
            b->bR = R2, b->bM = M2;
            memcpy(b->best, b->cur, (size_t)b->S * sizeof *b->best);
            break;
        }
        b->sums[r] = sr;
        bsearch_rec(b, s + 1, j, R2, M2);
        b->sums[r] = sr - w;
    }
}

dt_status dt_pipe_balance(const double *cost, int n, int p, int v, int *starts)
{
    if (!cost || !starts)
        return dt_error(DT_ERR_NULL, "dt_pipe_balance: an argument is NULL");
    if (p < 1 || v < 1 || p > 256 || p * v > 1024)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_balance: p = %d ranks x v = %d stages each (need 1 <= p <= 256, "
                        "p v <= 1024)", p, v);
    const int S = p * v;
    if (n < S)
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_balance: %d units cannot make %d stages (each stage needs at "
                        "least one unit)", n, S);
    for (int i = 0; i < n; i++)
        if (!(cost[i] >= 0) || cost[i] > 1e300)
            return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_balance: unit %d has cost %g", i, cost[i]);
    const double *w = cost;
    double *best = dt_calloc((size_t)(n + 1) * (size_t)(S + 1) * sizeof *best),
           *pre = dt_calloc((size_t)(n + 1) * sizeof *pre);
    int *arg = dt_calloc((size_t)(n + 1) * (size_t)(S + 1) * sizeof *arg);
    bsearch_t *bs = v > 1 ? dt_calloc(sizeof *bs) : NULL;
    dt_status st = DT_OK;
    if (!best || !arg || !pre || (v > 1 && !bs)) {
        st = dt_error(DT_ERR_NO_MEMORY, "dt_pipe_balance");
        goto done;
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
    if (v > 1) {
        /* per rank: the DP's cut is the incumbent, the search improves it */
        for (int i = 0; i < n; i++)
            pre[i + 1] = pre[i] + w[i];
        bs->pre = pre, bs->n = n, bs->p = p, bs->S = S, bs->best = starts;
        bs->budget = 4L << 20; /* nodes; past it the best cut found so far stands (the same on every rank) */
        for (int s = 0; s < S; s++) {
            double c = pre[s + 1 < S ? starts[s + 1] : n] - pre[starts[s]];
            bs->sums[s % p] += c;
            bs->bM = c > bs->bM ? c : bs->bM;
        }
        for (int r = 0; r < p; r++)
            bs->bR = bs->sums[r] > bs->bR ? bs->sums[r] : bs->bR;
        memset(bs->sums, 0, sizeof bs->sums);
        bsearch_rec(bs, 0, 0, 0, 0);
    }
done:
    dt_free(bs);
    dt_free(pre);
    dt_free(best);
    dt_free(arg);
    return st;
}
