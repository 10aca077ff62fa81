/* Sparse mixture-of-experts MLP blocks of the Llama-family decoders
 * (Mixtral's MixtralSparseMoeBlock, Qwen3-MoE's Qwen3MoeSparseMoeBlock,
 * Qwen2-MoE's Qwen2MoeSparseMoeBlock, OLMoE's OlmoeSparseMoeBlock in
 * transformers 5), built on the public API:
 *
 *   x [N, C] (the block's input, B T rows)
 *   p = softmax(f32(x gate^T))                           [N, E]
 *   for each row n: its k experts e_1..e_k, the largest p[n, .], with
 *     weights w[n, s] = p[n, e_s] (divided by their sum with norm_topk_prob)
 *   y[n] = sum over s of w[n, s] * expert_{e_s}(x[n]),
 *   expert(v) = down(silu(gate(v)) * up(v))               (SwiGLU, [I, C] / [C, I])
 *
 * Each expert runs on the rows routed to it only. The rows are gathered
 * once into expert order (xs [N k, C]: expert 0's rows, then expert 1's,
 * ..., each expert's in token order); expert j takes its slice of xs
 * (dt_narrow), and its three projections are ordinary dt_linear calls on its
 * own parameters, so the tape, gradient hooks, autocast and activation
 * checkpointing treat them as any Linear. The experts' outputs are joined
 * again into expert order (join: a tree of nodes of at most four inputs,
 * dt_ag_custom's limit) and combined: y[n] adds its k weighted rows in
 * ascending expert order, as transformers' index_add_ over the experts does,
 * each product rounded before the add. Four custom ops carry the routing:
 *
 *   route:   p [N, E] -> w [N, k]; backward to p (through the renormalising
 *            division when there is one), so the router's weight trains
 *            through dt_softmax and dt_linear;
 *   gather:  x [N, C] -> xs [N k, C]; backward scatter-adds the rows;
 *   join:    up to four [n_i, C] -> [sum n_i, C]; backward splits;
 *   combine: ys [N k, C], w [N, k] -> y [N, C]; backward to both.
 *
 * They run in f32: a bf16 or f16 block casts around them (the experts'
 * GEMMs stay in the model's dtype). The selection is the forward's data, not
 * differentiable (as torch.topk's indices); ties go to the lower expert. No
 * auxiliary load-balancing loss (hf_config.c refuses output_router_logits).
 * Qwen2-MoE adds a shared expert (a plain SwiGLU MLP of Linear modules) on
 * every token, times sigmoid(shared_expert_gate(x)) (a fifth op, f32).
 * Every expert runs, with no rows when none is routed to it, so that each
 * parameter's gradient lands every step (DDP's buckets wait for them). The
 * experts' linear layers run marked varying (dt_ctx_set_varying): their row
 * counts change every step, and a primitive generated per count would cost
 * more than the products and stay in memory. */
#include "zoo.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One forward's routing, in the context's arena (valid until its reset). */
typedef struct {
    int64_t N, E, k, C;
    int64_t *sel;  /* [N k]: token n's s-th choice of expert (choices by falling probability) */
    int64_t *row;  /* [N k]: the xs row of that choice */
    int64_t *tok;  /* [N k]: the token of each xs row */
    int64_t *off;  /* [E + 1]: expert j's rows of xs are [off[j], off[j + 1]) */
    float *w;      /* [N k]: the choices' weights */
    float *sum;    /* [N]: their probabilities' sum (norm) */
    bool norm;
} moe_plan;

/* ---- route: p [N, E] -> w [N, k] ---- */

static dt_status route_bwd(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const moe_plan *p = ud;
    if (!gin[0])
        return DT_OK;
    const float *go = g->data;
    float *gp = gin[0]->data;
    for (int64_t n = 0; n < p->N; n++) {
        const float *gn = go + n * p->k, *wn = p->w + n * p->k;
        double dot = 0.0; /* w = p / S: dL/dp_u = (g_u - sum_s g_s w_s) / S */
        for (int64_t s = 0; p->norm && s < p->k; s++)
            dot += (double)gn[s] * wn[s];
        for (int64_t s = 0; s < p->k; s++)
            gp[n * p->E + p->sel[n * p->k + s]] += p->norm ? (float)(((double)gn[s] - dot) / p->sum[n]) : gn[s];
    }
    return DT_OK;
}

/* The top k of each row of probs (f32 [N, E]) into p, and their weights w [N, k]. */
static dt_tensor *route(dt_ctx *ctx, dt_tensor *probs, moe_plan *p)
{
    if (!probs)
        return NULL;
    const int64_t N = p->N, E = p->E, k = p->k;
    int64_t *sel = p->sel = dt_ctx_alloc(ctx, (size_t)(N * k) * sizeof *sel);
    int64_t *fill = dt_ctx_alloc(ctx, (size_t)E * sizeof *fill);
    p->row = dt_ctx_alloc(ctx, (size_t)(N * k) * sizeof *p->row);
    p->tok = dt_ctx_alloc(ctx, (size_t)(N * k) * sizeof *p->tok);
    p->off = dt_ctx_alloc(ctx, (size_t)(E + 1) * sizeof *p->off);
    p->sum = dt_ctx_alloc(ctx, (size_t)(N > 0 ? N : 1) * sizeof *p->sum);
    dt_tensor *w = dt_tensor_empty(ctx, DT_F32, 2, (int64_t[]){N, k});
    if (!sel || !fill || !p->row || !p->tok || !p->off || !p->sum || !w)
        return NULL;
    p->w = w->data;
    const float *pr = probs->data;
    memset(p->off, 0, (size_t)(E + 1) * sizeof *p->off);
    for (int64_t n = 0; n < N; n++) {
        const float *pn = pr + n * E;
        float sum = 0.0f;
        for (int64_t s = 0; s < k; s++) { /* the largest not yet taken; ties: the lower expert */
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t t = 0; t < s && !taken; t++)
                    taken = sel[n * k + t] == e;
                if (!taken && (best < 0 || pn[e] > pn[best]))
                    best = e;
            }
            sel[n * k + s] = best;
            p->off[best + 1]++;
            sum += pn[best];
        }
        p->sum[n] = sum;
        for (int64_t s = 0; s < k; s++)
            p->w[n * k + s] = p->norm ? pn[sel[n * k + s]] / sum : pn[sel[n * k + s]];
    }
    for (int64_t e = 0; e < E; e++) {
        p->off[e + 1] += p->off[e];
        fill[e] = p->off[e];
    }
    for (int64_t n = 0; n < N; n++) /* each expert's rows in token order */
        for (int64_t s = 0; s < k; s++) {
            const int64_t r = fill[sel[n * k + s]]++;
            p->row[n * k + s] = r;
            p->tok[r] = n;
        }
    return dt_ag_custom(ctx, 1, &probs, w, route_bwd, p);
}

/* ---- gather: x [N, C] -> xs [N k, C] ---- */

static dt_status gather_bwd(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const moe_plan *p = ud;
    if (!gin[0])
        return DT_OK;
    const float *go = g->data;
    float *gx = gin[0]->data;
    /* by token (its k rows), so the tokens run in parallel */
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (p->N * p->k * p->C > (1 << 16))
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t s = 0; s < p->k; s++) {
            float *d = gx + n * p->C;
            const float *src = go + p->row[n * p->k + s] * p->C;
            for (int64_t c = 0; c < p->C; c++)
                d[c] += src[c];
        }
    return DT_OK;
}

static dt_tensor *gather(dt_ctx *ctx, dt_tensor *x, const moe_plan *p)
{
    if (!x)
        return NULL;
    dt_tensor *xs = dt_tensor_empty(ctx, DT_F32, 2, (int64_t[]){p->N * p->k, p->C});
    if (!xs)
        return NULL;
    const float *src = x->data;
    float *dst = xs->data;
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (p->N * p->k * p->C > (1 << 16))
    for (int64_t r = 0; r < p->N * p->k; r++)
        memcpy(dst + r * p->C, src + p->tok[r] * p->C, (size_t)p->C * sizeof(float));
    return dt_ag_custom(ctx, 1, &x, xs, gather_bwd, (void *)p);
}

/* ---- join: up to four [n_i, C] -> [sum n_i, C] ---- */

static dt_status join_bwd(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx;
    const int64_t *numel = ud; /* each input's elements: its rows follow the ones before it */
    const float *go = g->data;
    for (int i = 0; i < nin; i++) {
        if (gin[i])
            memcpy(gin[i]->data, go, (size_t)numel[i] * sizeof(float));
        go += numel[i];
    }
    return DT_OK;
}

static dt_tensor *join(dt_ctx *ctx, int n, dt_tensor **in)
{
    int64_t rows = 0, *numel = dt_ctx_alloc(ctx, (size_t)n * sizeof *numel);
    for (int i = 0; i < n; i++) {
        if (!in[i] || !numel)
            return NULL;
        rows += in[i]->shape[0];
        numel[i] = dt_tensor_numel(in[i]);
    }
    const int64_t C = in[0]->shape[1];
    dt_tensor *y = dt_tensor_empty(ctx, DT_F32, 2, (int64_t[]){rows, C});
    if (!y)
        return NULL;
    char *d = y->data;
    for (int i = 0; i < n; i++) {
        const size_t b = (size_t)numel[i] * sizeof(float);
        if (b)
            memcpy(d, in[i]->data, b);
        d += b;
    }
    return dt_ag_custom(ctx, n, in, y, join_bwd, numel);
}

/* The n tensors of part (f32 [n_i, C], contiguous), in order, as one: joined four at a time */
static dt_tensor *join_all(dt_ctx *ctx, int n, dt_tensor **part)
{
    while (n > 1) {
        int m = 0;
        for (int i = 0; i < n; i += 4) {
            const int c = n - i < 4 ? n - i : 4;
            part[m++] = c == 1 ? part[i] : join(ctx, c, part + i);
        }
        n = m;
    }
    return part[0];
}

/* ---- combine: ys [N k, C] (expert order), w [N, k] -> y [N, C] ---- */

/* The plan and the experts' joined output, which combine's backward reads. */
typedef struct {
    moe_plan p;
    dt_tensor *ys;
} combine_ud;

static dt_status combine_bwd(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const combine_ud *u = ud;
    const moe_plan *p = &u->p;
    const float *go = g->data, *y = u->ys->data;
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (p->N * p->k * p->C > (1 << 16))
    for (int64_t n = 0; n < p->N; n++) {
        const float *gn = go + n * p->C;
        for (int64_t s = 0; s < p->k; s++) {
            const int64_t r = p->row[n * p->k + s];
            const float wt = p->w[n * p->k + s];
            if (gin[0]) { /* each row of ys is one choice's: written once */
                float *d = (float *)gin[0]->data + r * p->C;
                for (int64_t c = 0; c < p->C; c++)
                    d[c] = wt * gn[c];
            }
            if (gin[1]) {
                const float *yr = y + r * p->C;
                double dot = 0.0;
                for (int64_t c = 0; c < p->C; c++)
                    dot += (double)gn[c] * yr[c];
                ((float *)gin[1]->data)[n * p->k + s] = (float)dot;
            }
        }
    }
    return DT_OK;
}

static dt_tensor *combine(dt_ctx *ctx, dt_tensor *ys, dt_tensor *w, combine_ud *u)
{
    if (!ys || !w)
        return NULL;
    const moe_plan *p = &u->p;
    u->ys = ys;
    dt_tensor *y = dt_tensor_empty(ctx, DT_F32, 2, (int64_t[]){p->N, p->C});
    if (!y)
        return NULL;
    const float *src = ys->data, *wv = w->data;
    float *dst = y->data;
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (p->N * p->k * p->C > (1 << 16))
    for (int64_t n = 0; n < p->N; n++) {
        float *d = dst + n * p->C;
        const int64_t *rn = p->row + n * p->k;
        memset(d, 0, (size_t)p->C * sizeof(float));
        /* the choices in ascending row order, which is ascending expert order: each time the least row above
           the last one taken (k is small) */
        for (int64_t t = 0, last = -1; t < p->k; t++) {
            int64_t s = -1;
            for (int64_t q = 0; q < p->k; q++)
                if (rn[q] > last && (s < 0 || rn[q] < rn[s]))
                    s = q;
            last = rn[s];
            const float wt = wv[n * p->k + s];
            const float *yr = src + rn[s] * p->C;
            for (int64_t c = 0; c < p->C; c++) {
                const float v = wt * yr[c]; /* rounded, then added (transformers' product, then index_add_) */
                d[c] += v;
            }
        }
    }
    return dt_ag_custom(ctx, 2, (dt_tensor *[]){ys, w}, y, combine_bwd, u);
}

/* ---- sigmoid: z -> 1 / (1 + exp(-z)), f32 (Qwen2-MoE's shared expert's gate) ---- */

static dt_status sigmoid_bwd(dt_ctx *ctx, const dt_tensor *g, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const dt_tensor *y = ud;
    if (!gin[0])
        return DT_OK;
    const float *go = g->data, *yv = y->data;
    float *gz = gin[0]->data;
    for (int64_t i = 0, n = dt_tensor_numel(y); i < n; i++)
        gz[i] = go[i] * yv[i] * (1.0f - yv[i]);
    return DT_OK;
}

static dt_tensor *sigmoid(dt_ctx *ctx, dt_tensor *z)
{
    if (!z)
        return NULL;
    dt_tensor *y = dt_tensor_empty(ctx, DT_F32, z->ndim, z->shape);
    if (!y)
        return NULL;
    const float *zv = z->data;
    float *yv = y->data;
    for (int64_t i = 0, n = dt_tensor_numel(z); i < n; i++)
        yv[i] = 1.0f / (1.0f + expf(-zv[i]));
    return dt_ag_custom(ctx, 1, &z, y, sigmoid_bwd, y);
}

/* ---- the modules ---- */

/* A linear map without bias, weight [out, in] N(0, std): the router (MoeRouter) and each expert's three
 * projections (MoeExpertLinear). Not Linear modules: LoRA refuses them as targets, and "all-linear"
 * passes them by, as PEFT passes by transformers 5's fused experts and router. */
static dt_tensor *proj_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    return dt_linear(ctx, x, dt_module_param(self, 0), NULL);
}

static dt_module *proj(const char *type, int64_t in, int64_t out, float std)
{
    dt_nn_param_spec s = {.name = "weight", .ndim = 2, .shape = {out, in}, .init = DT_NN_INIT_NORMAL, .a = std};
    return dt_nn_custom(type, 1, &s, proj_forward, NULL);
}

/* The projections' names, in the order transformers' checkpoints list them, and which is which. */
static const char *const g_mixtral[3] = {"w1", "w2", "w3"};         /* gate, down, up */
static const char *const g_qwen[3] = {"gate_proj", "up_proj", "down_proj"};

/* One expert: down(silu(gate(x)) up(x)). ud: the configuration (borrowed from the model's root). */
static dt_tensor *expert_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const dt_llama_config *c = ud;
    const int gi = 0, ui = c->moe_mixtral_names ? 2 : 1, di = c->moe_mixtral_names ? 1 : 2;
    dt_tensor *g = dt_module_forward(ctx, dt_module_child(self, gi), x);
    dt_tensor *u = dt_module_forward(ctx, dt_module_child(self, ui), x);
    return dt_module_forward(ctx, dt_module_child(self, di), dt_swiglu(ctx, g, u));
}

static dt_tensor *experts_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ctx, (void)self, (void)x, (void)ud;
    dt_error(DT_ERR_STATE, "the experts of a mixture-of-experts block run from the block's forward only");
    return NULL;
}

/* x [..., C] through the block. ud: the configuration (borrowed from the model's root). */
static dt_tensor *block_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const dt_llama_config *c = ud;
    if (!x)
        return NULL;
    const int64_t C = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const int64_t N = dt_tensor_numel(x) / C;
    combine_ud *u = dt_ctx_alloc(ctx, sizeof *u);
    dt_tensor **ys = dt_ctx_alloc(ctx, (size_t)E * sizeof *ys);
    if (!u || !ys)
        return NULL;
    memset(u, 0, sizeof *u);
    u->p = (moe_plan){.N = N, .E = E, .k = k, .C = C, .norm = c->norm_topk_prob};
    dt_tensor *xf = dt_reshape(ctx, x, 2, (int64_t[]){N, C});
    dt_tensor *logits = dt_module_forward(ctx, dt_module_find_child(self, "gate"), xf);
    dt_tensor *probs = dt_contiguous(ctx, dt_softmax(ctx, dt_cast(ctx, logits, DT_F32)));
    dt_tensor *w = route(ctx, probs, &u->p);
    dt_tensor *xs = gather(ctx, dt_contiguous(ctx, dt_cast(ctx, xf, DT_F32)), &u->p);
    if (!w || !xs)
        return NULL;
    if (x->dtype != DT_F32) /* the experts in the model's dtype */
        xs = dt_cast(ctx, xs, x->dtype);
    dt_module *experts = dt_module_find_child(self, "experts");
    /* each expert's row count changes every step: its products run where no code is generated per shape */
    const bool vary = dt_ctx_set_varying(ctx, true);
    int64_t j = 0;
    for (; j < E; j++) {
        dt_tensor *xj = dt_narrow(ctx, xs, 0, u->p.off[j], u->p.off[j + 1] - u->p.off[j]);
        ys[j] = dt_contiguous(ctx, dt_cast(ctx, dt_module_forward(ctx, dt_module_child(experts, (int)j), xj),
                                           DT_F32));
        if (!ys[j])
            break;
    }
    dt_ctx_set_varying(ctx, vary);
    if (j < E)
        return NULL;
    dt_tensor *y = combine(ctx, join_all(ctx, (int)E, ys), w, u);
    if (y && x->dtype != DT_F32)
        y = dt_cast(ctx, y, x->dtype);
    dt_module *shared = dt_module_find_child(self, "shared_expert");
    if (shared) { /* Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x), on every token */
        dt_tensor *z = dt_module_forward(ctx, dt_module_find_child(self, "shared_expert_gate"), xf); /* [N, 1] */
        dt_tensor *s = dt_module_forward(ctx, shared, xf);
        dt_tensor *gate = sigmoid(ctx, dt_contiguous(ctx, dt_cast(ctx, z, DT_F32)));
        if (gate && s && s->dtype != DT_F32)
            gate = dt_cast(ctx, gate, s->dtype);
        y = dt_add(ctx, y, dt_mul(ctx, gate, s));
    }
    return dt_reshape(ctx, y, x->ndim, x->shape);
}

/* Adds child under name to parent; on any failure (earlier too) frees what it was given. */
static bool add(dt_module *parent, const char *name, dt_module *child, bool ok)
{
    if (!ok || !parent || !child) {
        dt_module_free(child);
        return false;
    }
    return dt_nn_add(parent, name, child) == DT_OK;
}

/* A Linear without bias, weight N(0, std): the shared expert's projections and its gate are nn.Linear in
 * transformers (PEFT adapts them; "all-linear" too) */
static dt_module *linear(int64_t in, int64_t out, float std)
{
    dt_module *m = dt_nn_linear(in, out, false);
    if (m && dt_module_set_param_init(m, 0, DT_NN_INIT_NORMAL, std) < 0) {
        dt_module_free(m);
        return NULL;
    }
    return m;
}

static dt_tensor *shared_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    dt_tensor *g = dt_module_forward(ctx, dt_module_child(self, 0), x);
    dt_tensor *u = dt_module_forward(ctx, dt_module_child(self, 1), x);
    return dt_module_forward(ctx, dt_module_child(self, 2), dt_swiglu(ctx, g, u));
}

dt_module *dt__moe_block(const dt_llama_config *c)
{
    const int64_t C = c->hidden_size, E = c->num_experts, I = c->moe_intermediate_size;
    const float std = c->initializer_range;
    const char *const *names = c->moe_mixtral_names ? g_mixtral : g_qwen;
    const int64_t S = c->shared_expert_intermediate_size;
    dt_module *b = dt_nn_custom(c->moe_mixtral_names ? "MixtralSparseMoeBlock"
                                : S > 0 ? "Qwen2MoeSparseMoeBlock" : "Qwen3MoeSparseMoeBlock", 0, NULL,
                                block_forward, (void *)c);
    dt_module *ex = dt_nn_custom("MoeExperts", 0, NULL, experts_forward, NULL);
    bool ok = add(b, "gate", proj("MoeRouter", C, E, std), b && ex);
    for (int64_t j = 0; j < E && ok; j++) {
        dt_module *e = dt_nn_custom("MoeExpert", 0, NULL, expert_forward, (void *)c);
        for (int i = 0; i < 3; i++) { /* gate and up [I, C], down [C, I] */
            const bool down = c->moe_mixtral_names ? i == 1 : i == 2;
            ok = add(e, names[i], proj("MoeExpertLinear", down ? I : C, down ? C : I, std), ok && e);
        }
        char name[24];
        snprintf(name, sizeof name, "%lld", (long long)j);
        ok = add(ex, name, e, ok);
    }
    ok = add(b, "experts", ex, ok);
    if (S > 0 && ok) { /* Qwen2-MoE's shared expert (Qwen2MoeMLP) and its gate, in its module order */
        dt_module *sh = dt_nn_custom("Qwen2MoeMLP", 0, NULL, shared_forward, NULL);
        ok = add(sh, "gate_proj", linear(C, S, std), sh != NULL);
        ok = add(sh, "up_proj", linear(C, S, std), ok);
        ok = add(sh, "down_proj", linear(S, C, std), ok);
        ok = add(b, "shared_expert", sh, ok);
        ok = add(b, "shared_expert_gate", linear(C, 1, std), ok);
    }
    if (!ok) {
        dt_module_free(b);
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NO_MEMORY, "llama: out of memory building a mixture-of-experts block");
        return NULL;
    }
    return b;
}
