/* LoRA adapters (nn.h: dt_lora_params), PEFT's LoraLayer for Linear and
 * GPT-2's Conv1D.
 *
 * Before the layout, every target layer gets the children lora_A (weight
 * [r, in], kaiming_uniform with a = sqrt(5): U(+-1/sqrt(in))), lora_B
 * (weight [out, r], zeros) and, with dropout, lora_dropout; its forward is
 * replaced (dt_module_set_forward) by base(x) + scaling * B(A(dropout(x))),
 * scaling = alpha / r (alpha / sqrt(r) with rslora; r and alpha the layer's
 * own with dt_lora_params.layer_rank, PEFT's rank_pattern), kept in lora_A's eps
 * field. The base layer is untouched: its parameters keep their names
 * ("h.0.attn.c_attn.weight") and the adapters are named as PEFT names them
 * in memory without the adapter name ("h.0.attn.c_attn.lora_A.weight"). The
 * build then freezes every parameter outside the adapters (nn_impl.h:
 * dt__lora_param), as PEFT with bias = "none" does. A layer that holds a
 * slice of a larger one (a tensor-parallel layer) carries a dt_lora_hook
 * (dt_module_set_lora): its adapters get the slicing it names and its
 * forward is the hook's, which knows the collectives (tp_lora.c). The
 * targets {"all-linear"} are PEFT's: every Linear and Conv1D layer but the
 * output layer (lm_head).
 *
 * DoRA (Liu et al. 2024, PEFT's use_dora): a layer also gets the child
 * lora_magnitude_vector (weight [out], trainable) and computes
 * m / ||W + s B A|| * (W x + s B(A(x))) + bias, the row norms of the adapted
 * weight taken as constants (no gradient flows through them, as PEFT
 * detaches them); with dropout active in training PEFT's form
 * base(x) + (m / n - 1) W dropout(x) + m / n s B(A(dropout(x))). The
 * magnitudes start at the base weight's row norms: the trainer writes them
 * once the base weights are in place (dt__lora_dora_norm). */
#include "nn_impl.h"

#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_lora_params dt_lora_params_default(void)
{
    return (dt_lora_params){.r = 8, .alpha = 8.0f, .dropout = 0.0f, .targets = NULL, .rslora = false, .dora = false,
                            .modules_to_save = NULL, .layers = NULL, .nlayers = 0, .layers_pattern = NULL,
                            .bias = DT_LORA_BIAS_NONE, .layer_rank = NULL, .exclude = NULL, .layer_ud = NULL};
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = s ? strlen(s) : 0, k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

bool dt_lora_is_magnitude(const char *name) { return ends_with(name, "." DT_LORA_MAGNITUDE ".weight"); }

bool dt_lora_is_adapter(const char *name)
{
    return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight") || dt_lora_is_magnitude(name);
}

size_t dt_lora_layer_len(const char *name)
{
    static const char *const sfx[] = {".lora_A.weight", ".lora_B.weight", "." DT_LORA_MAGNITUDE ".weight"};
    for (int i = 0; i < 3; i++)
        if (ends_with(name, sfx[i]))
            return strlen(name) - strlen(sfx[i]);
    return 0;
}

float dt_lora_scaling(const dt_lora_params *p)
{
    return p->rslora ? p->alpha / sqrtf((float)p->r) : p->alpha / (float)p->r;
}

dt_status dt_lora_layer_scaling(const dt_lora_params *p, const char *layer, int64_t *r, float *scaling)
{
    int64_t rl = p->r;
    float al = p->alpha;
    dt_status st = p->layer_rank ? p->layer_rank(p->layer_ud, layer, &rl, &al) : DT_OK;
    if (st < 0)
        return st;
    if (rl < 1 || rl > (1 << 16) || !(al > 0))
        return dt_error(DT_ERR_INVALID_ARG, "LoRA layer '%s': rank %lld must be in 1..65536 and alpha %g > 0", layer,
                        (long long)rl, (double)al);
    if (r)
        *r = rl;
    if (scaling)
        *scaling = p->rslora ? al / sqrtf((float)rl) : al / (float)rl;
    return DT_OK;
}

static dt_tensor *none_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ctx, (void)self, (void)ud;
    return x;
}

/* t's memory back to ctx's arena: t an op's output (its own arena block; contiguous), not out's memory */
static void dead(dt_ctx *ctx, const dt_tensor *out, dt_tensor *t)
{
    if (out && t && t != out && t->node_ && t->data != out->data && dt_tensor_is_contiguous(t))
        dt_arena_give_back(dt_ctx_arena(ctx), t->data, dt_tensor_nbytes(t));
}

/* The layer's output, the adapters' and its scaled copy are dead once summed: no backward reads them (the linears'
   read their inputs, the scale and the sum nothing), so their memory goes back to the step's arena for the next
   layers' (PyTorch frees them there too). Without it a block with adapters kept twice a plain block's
   activations. */
dt_tensor *dt__lora_sum(dt_ctx *ctx, const dt_tensor *x, dt_tensor *y, dt_tensor *d, float s)
{
    dt_tensor *sd = dt_scale(ctx, d, s);
    dt_tensor *out = dt_add(ctx, y, sd);
    dead(ctx, out, sd);
    if (d != sd)
        dead(ctx, out, d);
    if (y != x)
        dead(ctx, out, y);
    return out;
}

/* DoRA's rows of the adapted layer m (a Linear: weight [out, in]; GPT-2's Conv1D: [in, out], *in_out) */
static void dora_shape(const dt_module *m, int64_t *out, int64_t *in, bool *in_out)
{
    const dt_tensor *w = m->params[0];
    *in_out = m->kind != DT_NN_LINEAR;
    *out = w->shape[*in_out ? 1 : 0];
    *in = w->shape[*in_out ? 0 : 1];
}

/* The base layer's product without its bias: x W^T (a Linear) or x W (a Conv1D) */
static dt_tensor *base_product(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    return m->kind == DT_NN_LINEAR ? dt_linear(ctx, x, m->params[0], NULL) : dt_addmm(ctx, x, m->params[0], NULL);
}

dt_status dt__lora_dora_norm(const dt_module *m, bool adapters, int64_t lo, int64_t hi, float *out)
{
    int64_t nout, in;
    bool io;
    dora_shape(m, &nout, &in, &io);
    const dt_module *a = dt_module_find_child(m, "lora_A"), *b = dt_module_find_child(m, "lora_B");
    const dt_tensor *w = m->params[0], *at = a ? a->params[0] : NULL, *bt = b ? b->params[0] : NULL;
    if (lo < 0 || hi > nout || lo > hi || (adapters && (!at || !bt || !at->data || !bt->data)) || !w->data)
        return dt_error(DT_ERR_STATE, "DoRA '%s': rows [%lld, %lld) of %lld, or its weights, not in memory",
                        m->path ? m->path : "?", (long long)lo, (long long)hi, (long long)nout);
    const int64_t r = at ? at->shape[0] : 0, rows = in > (1 << 18) ? 1 : (1 << 18) / in; /* 1 MiB of f32 rows */
    const size_t es = dt_dtype_size(w->dtype);
    float *c = dt_alloc((size_t)rows * (size_t)(in + (io ? 1 : 0)) * sizeof *c); /* a Conv1D's: a row of W too */
    float *ab = NULL; /* A and B in f32 when their dtypes differ */
    const bool widen = adapters && at->dtype != bt->dtype;
    if (c && widen && (ab = dt_alloc((size_t)(r * in + nout * r) * sizeof *ab)))
        if (dt_k_convert(at->data, at->dtype, ab, DT_F32, r * in) < 0 ||
            dt_k_convert(bt->data, bt->dtype, ab + r * in, DT_F32, nout * r) < 0) {
            dt_free(ab), dt_free(c);
            return dt_last_status();
        }
    if (!c || (widen && !ab)) {
        dt_free(c);
        dt_free(ab);
        return dt_error(DT_ERR_NO_MEMORY, "DoRA '%s': out of memory for its weight norms", m->path ? m->path : "?");
    }
    dt_status st = DT_OK;
    for (int64_t o0 = lo; o0 < hi && st >= 0; o0 += rows) {
        const int64_t n = hi - o0 < rows ? hi - o0 : rows;
        if (!io) { /* rows o0.. of W [out, in] */
            st = dt_k_convert((const char *)w->data + (size_t)(o0 * in) * es, w->dtype, c, DT_F32, n * in);
        } else { /* columns o0.. of W [in, out], transposed */
            float *t = c + rows * in;
            for (int64_t i = 0; i < in && st >= 0; i++) {
                st = dt_k_convert((const char *)w->data + (size_t)(i * nout + o0) * es, w->dtype, t, DT_F32, n);
                for (int64_t j = 0; j < n; j++)
                    c[j * in + i] = t[j];
            }
        }
        if (st >= 0 && adapters) { /* C[n, in] += s B[o0.., :] A */
            const size_t boff = (size_t)(o0 * r) * dt_dtype_size(bt->dtype);
            const void *bp = widen ? (const void *)(ab + r * in + o0 * r)
                                   : (const void *)((const char *)bt->data + boff);
            st = dt_k_matmul(false, false, n, in, r, a->eps, bp, widen ? ab : at->data, widen ? DT_F32 : at->dtype,
                             1.0f, c, NULL);
        }
        for (int64_t j = 0; j < n && st >= 0; j++) {
            double ss = 0;
            for (int64_t i = 0; i < in; i++)
                ss += (double)c[j * in + i] * c[j * in + i];
            out[o0 - lo + j] = (float)sqrt(ss);
        }
    }
    dt_free(c);
    dt_free(ab);
    return st;
}

/* The layer's bias: a Linear's, GPT-2's Conv1D's (its second parameter), or NULL */
static dt_tensor *layer_bias(const dt_module *m)
{
    if (m->kind == DT_NN_LINEAR)
        return m->bias ? m->params[1] : NULL;
    return m->nparam > 1 ? m->params[1] : NULL;
}

/* DoRA's output (the overview): d the adapters' B(A(x')), bx the base's product without bias on x' (x, or x
   through lora_dropout), base the layer's output on x when dropout is active (PEFT's form), else NULL */
static dt_tensor *dora_out(dt_ctx *ctx, dt_module *m, dt_module *mag, dt_tensor *base, dt_tensor *bx, dt_tensor *d,
                           float s)
{
    int64_t nout, in;
    bool io;
    dora_shape(m, &nout, &in, &io);
    dt_tensor *norm = bx && d ? dt_tensor_empty(ctx, DT_F32, 1, &nout) : NULL;
    if (!norm || dt__lora_dora_norm(m, true, 0, nout, norm->data) < 0)
        return NULL;
    dt_tensor *scale = dt_div(ctx, mag->params[0], norm); /* m / ||W + s B A||, per output feature */
    dt_tensor *z = dt_mul(ctx, dt_add(ctx, bx, dt_scale(ctx, d, s)), scale);
    if (base)
        return dt_add(ctx, dt_sub(ctx, base, bx), z);
    dt_tensor *bias = layer_bias(m);
    return bias ? dt_add(ctx, z, bias) : z;
}

static dt_tensor *lora_forward(dt_ctx *ctx, dt_module *m, dt_tensor *x, void *ud)
{
    (void)ud;
    if (m->lora) /* a slice of a larger layer: its own forward, with its collectives */
        return m->lora->fwd(ctx, m, x, m->lora);
    dt_module *a = dt_module_find_child(m, "lora_A"), *b = dt_module_find_child(m, "lora_B");
    dt_module *drop = dt_module_find_child(m, "lora_dropout"), *mag = dt_module_find_child(m, DT_LORA_MAGNITUDE);
    dt_tensor *xd = drop ? dt_module_forward(ctx, drop, x) : x;
    dt_tensor *d = dt_linear(ctx, dt_linear(ctx, xd, a->params[0], NULL), b->params[0], NULL);
    if (mag && !(drop && dt_module_is_training(m))) /* dropout off: the base's product alone, its bias after */
        return dora_out(ctx, m, mag, NULL, base_product(ctx, m, x), d, a->eps);
    dt_tensor *y = m->kind == DT_NN_CUSTOM ? m->fwd(ctx, m, x, m->ud)
                                           : dt_linear(ctx, x, m->params[0], m->bias ? m->params[1] : NULL);
    if (mag)
        return dora_out(ctx, m, mag, y, base_product(ctx, m, xd), d, a->eps);
    return dt__lora_sum(ctx, x, y, d, a->eps);
}

static bool is_target(const char *path, const char *const *targets)
{
    size_t pl = strlen(path);
    for (const char *const *t = targets; *t; t++) {
        size_t tl = strlen(*t);
        if (!strcmp(path, *t) || (pl > tl && path[pl - tl - 1] == '.' && !strcmp(path + pl - tl, *t)))
            return true;
    }
    return false;
}

/* PEFT's layer index of module path (layers_to_transform): the first all-digit part after a part that ends in
 * pattern (at a '.' or the path's start), or with pattern NULL after any part but the first; never the last part;
 * -1 when none */
static int64_t layer_index_of(const char *path, const char *pattern)
{
    const size_t pl = pattern ? strlen(pattern) : 0;
    for (const char *d = strchr(path, '.'); d; d = strchr(d + 1, '.')) { /* d: the '.' before a part */
        const char *s = d + 1, *e = s;
        while (*e >= '0' && *e <= '9')
            e++;
        if (e == s || *e != '.') /* not all digits, or the last part */
            continue;
        const size_t before = (size_t)(d - path); /* the text before the part's '.' */
        if (pattern ? before >= pl && !strncmp(d - pl, pattern, pl) && (before == pl || d[-(ptrdiff_t)pl - 1] == '.')
                    : memchr(path, '.', before) != NULL) { /* a part and the part before it */
            int64_t v = 0;
            for (const char *c = s; c < e && v < ((int64_t)1 << 40); c++)
                v = v * 10 + (*c - '0');
            return v;
        }
    }
    return -1;
}

/* Whether a layer a target name matched by its end is among p's layers_to_transform (PEFT's: the patterns in
 * order, the first that gives an index decides) */
static bool in_layers(const char *path, const dt_lora_params *p)
{
    if (!p->layers || p->nlayers == 0)
        return true;
    int64_t idx = -1;
    if (!p->layers_pattern || !p->layers_pattern[0])
        idx = layer_index_of(path, NULL);
    for (const char *const *q = p->layers_pattern; q && *q && idx < 0; q++)
        idx = layer_index_of(path, *q);
    for (size_t i = 0; idx >= 0 && i < p->nlayers; i++)
        if (p->layers[i] == idx)
            return true;
    return false;
}

/* Whether path is a target of p: named whole, or by its end within p's layers (PEFT's list matching) */
static bool targeted(const char *path, const dt_lora_params *p)
{
    for (const char *const *t = p->targets; *t; t++)
        if (!strcmp(path, *t))
            return true;
    return is_target(path, p->targets) && in_layers(path, p);
}

dt_status dt_module_set_lora(dt_module *m, const dt_lora_hook *h)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_set_lora: module is NULL");
    dt_lora_hook *c = NULL;
    if (h && !(c = malloc(sizeof *c)))
        return dt_error(DT_ERR_NO_MEMORY, "dt_module_set_lora: out of memory");
    if (c)
        *c = *h;
    free(m->lora);
    m->lora = c;
    return DT_OK;
}

const dt_lora_hook *dt_module_lora(const dt_module *m) { return m ? m->lora : NULL; }

bool dt__lora_param(const dt_module *m)
{
    return m->kind == DT_NN_CUSTOM && m->type &&
           (!strcmp(m->type, "LoraA") || !strcmp(m->type, "LoraB") || !strcmp(m->type, "LoraMagnitude"));
}

/* PEFT's modules_to_save match: the module's name is one of them or ends in "." + one */
static bool saved_name(const char *path, const char *const *names)
{
    for (const char *const *n = names; n && *n; n++)
        if (**n && is_target(path, (const char *const[]){*n, NULL}))
            return true;
    return false;
}

bool dt__lora_saved(const dt_module *m, const char *const *names)
{
    for (; names && m; m = m->parent)
        if (m->path && saved_name(m->path, names))
            return true;
    return false;
}

static dt_status add_child(dt_module *m, const char *name, dt_module *c)
{
    dt_nn_kind k = m->kind;
    m->kind = DT_NN_CUSTOM; /* dt_nn_add takes containers; a Linear holds the adapters all the same */
    dt_status st = dt_nn_add(m, name, c);
    m->kind = k;
    return st;
}

bool dt_lora_targets_all_linear(const char *const *targets)
{
    return targets && targets[0] && !strcmp(targets[0], "all-linear") && !targets[1];
}

/* A layer adapt() takes: a Linear, GPT-2's Conv1D, or one with a dt_lora_hook. */
static bool adaptable(const dt_module *m)
{
    return m->lora || m->kind == DT_NN_LINEAR ||
           (m->kind == DT_NN_CUSTOM && m->type && !strcmp(m->type, "Conv1D") && m->nparam >= 1 &&
            m->specs[0].ndim == 2);
}

/* The output layer (transformers' get_output_embeddings(): lm_head), which "all-linear" leaves out. */
static bool is_output(const char *path)
{
    size_t l = strlen(path);
    return !strcmp(path, "lm_head") || (l > 8 && !strcmp(path + l - 8, ".lm_head"));
}

bool dt__tp_rows_split(const int64_t *rows, int c, int64_t t, int64_t *total)
{
    bool ok = c <= DT_TP_MAX_CHUNKS && t >= 1;
    *total = 0;
    for (int k = 0; ok && k < c; k++) {
        ok = rows[k] > 0 && rows[k] % t == 0;
        *total += rows[k];
    }
    return ok;
}

static dt_status adapt(dt_module *m, const char *path, const dt_lora_params *p)
{
    int64_t in, out;
    const dt_lora_hook *h = m->lora;
    int64_t a_in, b_out; /* the adapters' slice of in and out */
    if (h) {
        in = h->in, out = h->out;
    } else if (adaptable(m) && m->kind == DT_NN_LINEAR) {
        in = m->in, out = m->out;
    } else if (adaptable(m)) { /* Conv1D */
        in = m->specs[0].shape[0], out = m->specs[0].shape[1]; /* [in, out]: PEFT's fan_in_fan_out */
    } else {
        return dt_error(DT_ERR_UNSUPPORTED, "LoRA target '%s' is a %s, not a Linear or Conv1D layer", path,
                        dt_module_type(m));
    }
    if (dt_module_find_child(m, "lora_A"))
        return dt_error(DT_ERR_STATE, "LoRA target '%s' has adapters already", path);
    if (p->dora && h) /* the row norms of a sliced layer would need its other ranks' columns */
        return dt_error(DT_ERR_UNSUPPORTED, "LoRA target '%s': DoRA on a tensor-parallel layer is not supported "
                        "(train DoRA without --tp)", path);
    int64_t r;
    float scaling;
    dt_status st = dt_lora_layer_scaling(p, path, &r, &scaling);
    if (st < 0)
        return st;
    a_in = in, b_out = out;
    if (h) {
        const int64_t t = h->ranks, c = h->chunks > 1 ? h->chunks : 1;
        int64_t rows = 0; /* given chunk sizes: each split evenly, out in all */
        const bool rows_ok =
            h->chunk_rows[0] <= 0 || (dt__tp_rows_split(h->chunk_rows, (int)c, t, &rows) && rows == out);
        if (t < 1 || (h->split != 1 && h->split != 2) || !h->fwd || !rows_ok ||
            (h->split == 1 && h->chunk_rows[0] <= 0 && out % (t * c)) || (h->split == 2 && in % t))
            return dt_error(DT_ERR_INVALID_ARG, "LoRA target '%s': its slicing (split %d over %d ranks, %lld chunks "
                            "of [in %lld, out %lld]) does not divide the layer", path, h->split, h->ranks,
                            (long long)c, (long long)in, (long long)out);
        if (h->split == 1)
            b_out = out / t;
        else
            a_in = in / t;
    }
    dt_nn_param_spec sa = {.name = "weight", .ndim = 2, .shape = {r, a_in}, .init = DT_NN_INIT_UNIFORM,
                           .a = 1.0f / sqrtf((float)in), .tp_dim = h && h->split == 2 ? 2 : 0};
    dt_nn_param_spec sb = {.name = "weight", .ndim = 2, .shape = {b_out, r}, .init = DT_NN_INIT_ZEROS,
                           .tp_dim = h && h->split == 1 ? 1 : 0, .tp_chunks = h && h->split == 1 ? h->chunks : 0};
    if (h && h->split == 1) /* lora_B's rows sliced as the layer's output: its blocks' sizes too */
        memcpy(sb.tp_chunk_rows, h->chunk_rows, sizeof sb.tp_chunk_rows);
    dt_module *a = dt_nn_custom("LoraA", 1, &sa, none_forward, NULL);
    dt_module *b = dt_nn_custom("LoraB", 1, &sb, none_forward, NULL);
    st = !a || !b ? DT_ERR_NO_MEMORY : DT_OK;
    if (st < 0) {
        dt_module_free(a);
        dt_module_free(b);
        return dt_error(st, "LoRA target '%s': out of memory", path);
    }
    a->eps = scaling;
    if (h)
        a->tp = b->tp = h->group;
    if ((st = add_child(m, "lora_A", a)) < 0) {
        dt_module_free(b);
        return st;
    }
    if ((st = add_child(m, "lora_B", b)) < 0)
        return st;
    if (p->dropout > 0 && (st = add_child(m, "lora_dropout", dt_nn_dropout(p->dropout))) < 0)
        return st;
    if (p->dora) { /* ones until the trainer writes the base's row norms (dt__lora_dora_norm) */
        dt_nn_param_spec sm = {.name = "weight", .ndim = 1, .shape = {out}, .init = DT_NN_INIT_ONES};
        dt_module *mg = dt_nn_custom("LoraMagnitude", 1, &sm, none_forward, NULL);
        if (!mg)
            return dt_error(DT_ERR_NO_MEMORY, "LoRA target '%s': out of memory", path);
        if ((st = add_child(m, DT_LORA_MAGNITUDE, mg)) < 0)
            return st;
    }
    return dt_module_set_forward(m, lora_forward, NULL);
}

/* Whether a module under m (path its path) is named by name (saved_name) */
static bool has_saved(const dt_module *m, const char *path, const char *name)
{
    const char *one[] = {name, NULL};
    for (int i = 0; i < m->nchild; i++) {
        const dt_module *c = m->children[i];
        char cp[1024];
        snprintf(cp, sizeof cp, "%s%s%s", path, path[0] ? "." : "", c->name);
        if (saved_name(cp, one) || has_saved(c, cp, name))
            return true;
    }
    return false;
}

static dt_status walk(dt_module *m, const char *path, const dt_lora_params *p, int *n)
{
    const bool all = dt_lora_targets_all_linear(p->targets);
    int nchild = m->nchild; /* adapters added below are not walked */
    for (int i = 0; i < nchild; i++) {
        dt_module *c = m->children[i];
        size_t l = strlen(path) + strlen(c->name) + 2;
        char *cp = malloc(l);
        if (!cp)
            return dt_error(DT_ERR_NO_MEMORY, "LoRA: out of memory");
        snprintf(cp, l, "%s%s%s", path, path[0] ? "." : "", c->name);
        dt_status st = DT_OK;
        const bool excluded = p->exclude && p->exclude(p->layer_ud, cp); /* asked of every module (PEFT's) */
        if (saved_name(cp, p->modules_to_save)) { /* a module to save trains whole: no adapters in it (PEFT's) */
        } else if (!excluded && (all ? adaptable(c) && !is_output(cp) && in_layers(cp, p) : targeted(cp, p))) {
            st = adapt(c, cp, p);
            (*n)++;
        } else {
            st = walk(c, cp, p, n);
        }
        free(cp);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

dt_status dt__lora_apply(dt_module *root, const dt_lora_params *p)
{
    if (p->r < 1 || p->r > (1 << 16) || !(p->alpha > 0) || !(p->dropout >= 0 && p->dropout < 1))
        return dt_error(DT_ERR_INVALID_ARG, "LoRA: r %lld must be in 1..65536, alpha %g > 0, dropout %g in [0, 1)",
                        (long long)p->r, (double)p->alpha, (double)p->dropout);
    if (!p->targets || !p->targets[0])
        return dt_error(DT_ERR_INVALID_ARG, "LoRA: no target layers (names such as c_attn or q_proj)");
    for (const char *const *s = p->modules_to_save; s && *s; s++)
        if (!**s || !has_saved(root, "", *s))
            return dt_error(DT_ERR_NOT_FOUND, "LoRA: no module's name ends in '%s' (a module to save, "
                            "modules_to_save; lm_head, embed_tokens or model.norm are such names)", *s);
    int n = 0;
    dt_status st = walk(root, "", p, &n);
    if (st < 0)
        return st;
    if (n == 0)
        return dt_error(DT_ERR_NOT_FOUND, "LoRA: no layer matches the targets (%s%s)%s: layer names end in them, "
                        "as c_attn, c_proj, c_fc in GPT-2%s", p->targets[0], p->targets[1] ? ", ..." : "",
                        p->nlayers ? " in the layers of layers_to_transform (and layers_pattern)" : "",
                        p->exclude ? " (and exclude_modules leaves out those it names)" : "");
    return DT_OK;
}
