/* A model's pipeline units (pipeline.h, dt_model_pipe_units) and cutting
 * them into balanced stages: the generic partitioner. What the units are
 * is the model's to say (nn.h, dt_model_set_pipe_units: each zoo model
 * file registers its list with the costs of its layers); this file reads
 * that list, or cuts a Sequential root between its children, and never
 * asks which model it has. */
#include "parallel/pipeline/pipe_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool under(const char *name, const char *prefix)
{
    size_t l = strlen(prefix);
    return l && !strncmp(name, prefix, l) && (name[l] == '\0' || name[l] == '.');
}

bool dt_pipe_unit_uses(const dt_pipe_unit *u, const char *entry)
{
    if (!u || !entry)
        return false;
    for (int j = 0; j < 4; j++)
        if (under(entry, u->params[j]))
            return true;
    return false;
}

/* A unit's parameter elements (a tied entry counts in each unit naming it). */
static double unit_params(const dt_model *m, const dt_pipe_unit *u)
{
    double w = 0;
    for (size_t e = 0; e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        if (dt_model_entry(m, e, &pi) >= 0 && !pi.is_buffer && dt_pipe_unit_uses(u, pi.name))
            w += (double)pi.numel;
    }
    return w;
}

/* A Sequential root's children, each costing its parameter count (a
 * Linear's multiply-adds per row). */
static dt_status seq_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    dt_module *root = dt_model_root(m);
    int c = dt_module_num_children(root);
    if (c < 1)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: an empty Sequential");
    dt_pipe_unit *u = dt_calloc((size_t)c * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "dt_model_pipe_units");
    for (int i = 0; i < c; i++) {
        dt_module *ch = dt_module_child(root, i);
        snprintf(u[i].name, sizeof u[i].name, "%s", dt_module_path(ch));
        snprintf(u[i].params[0], sizeof u[i].params[0], "%s", dt_module_path(ch));
        u[i].module = ch;
        u[i].cost = unit_params(m, &u[i]);
    }
    *units = u;
    *n = c;
    return DT_OK;
}

dt_status dt_model_pipe_units(dt_model *m, dt_pipe_unit **units, int *n)
{
    if (!m || !units || !n)
        return dt_error(DT_ERR_NULL, "dt_model_pipe_units: an argument is NULL");
    *units = NULL;
    *n = 0;
    dt_model_units_fn fn = dt_model_get_pipe_units(m);
    dt_module *root = dt_model_root(m);
    if (!fn && dt_module_kind(root) == DT_NN_SEQUENTIAL)
        return seq_units(m, units, n);
    if (!fn)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_model_pipe_units: a model of type '%s' has no pipeline units (the GPT "
                        "and Llama zoo models, \"mlp\" and models whose root is a Sequential have; a model of "
                        "your own registers its units with dt_model_set_pipe_units)", dt_module_type(root));
    dt_pipe_unit *u = NULL;
    int k = 0;
    dt_status st = fn(m, &u, &k);
    if (st < 0) {
        dt_free(u);
        return st;
    }
    if (!u || k < 1) {
        dt_free(u);
        return dt_error(DT_ERR_INVALID_ARG, "dt_model_pipe_units: the units function of a model of type '%s' listed "
                        "no units", dt_module_type(root));
    }
    for (int i = 0; i < k; i++)
        if ((!u[i].module && !u[i].fn) || !(u[i].cost >= 0) || !isfinite(u[i].cost)) {
            st = dt_error(DT_ERR_INVALID_ARG, "dt_model_pipe_units: unit %d (%s) of a model of type '%s' has %s", i,
                          u[i].name, dt_module_type(root), !u[i].module && !u[i].fn ? "no module and no function"
                                                                                     : "a negative or non-finite cost");
            dt_free(u);
            return st;
        }
    *units = u;
    *n = k;
    return DT_OK;
}

dt_status dt_pipe_mesh_init(dt_pg *world, int tp, int pp, dt_mesh **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_pipe_mesh_init: out is NULL");
    *out = NULL;
    if (!world)
        return dt_error(DT_ERR_NULL, "dt_pipe_mesh_init: process group is NULL");
    int W = dt_pg_size(world);
    if (tp < 1 || pp < 1 || W % tp || W % (tp * pp))
        return dt_error(DT_ERR_INVALID_ARG, "dt_pipe_mesh_init: %d ranks do not make dp x tp %d x pp %d (tp x pp "
                        "must divide the world size)", W, tp, pp);
    return dt_mesh_init(world, 3, (int[]){W / (tp * pp), tp, pp}, NULL, (const char *[]){"dp", "tp", "pp"}, out);
}

/* ---- balancing ------------------------------------------------------------------------ */

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
