/* Modules: constructors, containers, hooks and the forward dispatch.
 *
 * A module is a tagged struct; its forward is a switch on the kind calling
 * the differentiable ops of autograd.h. dt_module_forward wraps every
 * forward the same way: NULL input check, forward pre-hooks, a tape mark
 * for the post-backward hooks (recorded before the module's ops, so the
 * backward walk reaches it after all of them), the kind's forward, a tape
 * mark for the pre-backward hooks, forward post-hooks. Marks are recorded
 * only when the module has backward hooks and grad mode is on. */
#include "nn_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_type_names[] = {
    "Sequential", "Linear", "Conv2d", "BatchNorm2d", "LayerNorm", "ReLU", "GELU", "MaxPool2d",
    "AvgPool2d", "Flatten", "Dropout", "Embedding", "CrossEntropyLoss", "MSELoss", "Custom"};
_Static_assert(sizeof g_type_names / sizeof g_type_names[0] == DT_NN_KIND_COUNT, "module type names");

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

dt_module *dt__module_new(dt_nn_kind kind, int nparam, const dt_nn_param_spec *specs)
{
    dt_module *m = calloc(1, sizeof *m);
    if (!m)
        goto oom;
    m->kind = kind;
    m->training = true;
    m->nparam = nparam;
    if (nparam > 0) {
        m->specs = calloc((size_t)nparam, sizeof *m->specs);
        m->params = calloc((size_t)nparam, sizeof *m->params);
        m->ties = calloc((size_t)nparam, sizeof *m->ties);
        if (!m->specs || !m->params || !m->ties)
            goto oom;
        for (int i = 0; i < nparam; i++) {
            m->specs[i] = specs[i];
            m->specs[i].name = dup_str(specs[i].name);
            if (!m->specs[i].name)
                goto oom;
        }
    }
    return m;
oom:
    dt_module_free(m);
    dt_error(DT_ERR_NO_MEMORY, "module: out of memory");
    return NULL;
}

void dt_module_free(dt_module *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nchild; i++)
        dt_module_free(m->children[i]);
    free(m->children);
    for (int i = 0; m->specs && i < m->nparam; i++)
        free((char *)m->specs[i].name);
    free(m->specs);
    free(m->params); /* the tensors themselves belong to the model */
    free(m->ties);
    free(m->ckpt);
    free(m->lora);
    for (int k = 0; k < DT__HOOK_KINDS; k++)
        dt__hooks_free(&m->hooks[k]);
    if (m->ud_free)
        m->ud_free(m->ud);
    free(m->type);
    free(m->name);
    free(m->path);
    free(m);
}

static dt_nn_param_spec spec(const char *name, dt_nn_init init, bool buffer, int ndim, int64_t d0, int64_t d1,
                             int64_t d2, int64_t d3)
{
    dt_nn_param_spec s = {.name = name, .ndim = ndim, .init = init, .is_buffer = buffer};
    int64_t d[4] = {d0, d1, d2, d3};
    for (int i = 0; i < DT_MAX_DIMS; i++)
        s.shape[i] = i < ndim ? d[i] : 1;
    return s;
}

#define BAD(...) (dt_error(DT_ERR_INVALID_ARG, __VA_ARGS__), (dt_module *)NULL)

dt_module *dt_nn_linear(int64_t in, int64_t out, bool bias)
{
    if (in <= 0 || out <= 0)
        return BAD("Linear: in_features %lld and out_features %lld must be > 0", (long long)in, (long long)out);
    /* kaiming_uniform(a=sqrt(5)) gives U(+-1/sqrt(fan_in)); the bias uses the weight's fan_in */
    float b = (float)(1.0 / sqrt((double)in));
    dt_nn_param_spec s[2] = {spec("weight", DT_NN_INIT_UNIFORM, false, 2, out, in, 0, 0),
                             spec("bias", DT_NN_INIT_UNIFORM, false, 1, out, 0, 0, 0)};
    s[0].a = s[1].a = b;
    dt_module *m = dt__module_new(DT_NN_LINEAR, bias ? 2 : 1, s);
    if (m)
        m->in = in, m->out = out, m->bias = bias;
    return m;
}

dt_module *dt_nn_conv2d(int64_t in, int64_t out, int k, int stride, int pad, bool bias)
{
    if (in <= 0 || out <= 0)
        return BAD("Conv2d: channels in %lld, out %lld must be > 0", (long long)in, (long long)out);
    if (k <= 0 || stride <= 0 || pad < 0)
        return BAD("Conv2d: kernel %d and stride %d must be > 0, pad %d >= 0", k, stride, pad);
    float b = (float)(1.0 / sqrt((double)in * k * k)); /* fan_in = in * k * k, as for Linear */
    dt_nn_param_spec s[2] = {spec("weight", DT_NN_INIT_UNIFORM, false, 4, out, in, k, k),
                             spec("bias", DT_NN_INIT_UNIFORM, false, 1, out, 0, 0, 0)};
    s[0].a = s[1].a = b;
    dt_module *m = dt__module_new(DT_NN_CONV2D, bias ? 2 : 1, s);
    if (m)
        m->in = in, m->out = out, m->k = k, m->stride = stride, m->pad = pad, m->bias = bias;
    return m;
}

dt_module *dt_nn_batchnorm2d(int64_t c, float eps, float momentum)
{
    if (c <= 0 || !(eps > 0) || !(momentum >= 0 && momentum <= 1))
        return BAD("BatchNorm2d: need channels > 0 (%lld), eps > 0 (%g), momentum in [0, 1] (%g)", (long long)c,
                   (double)eps, (double)momentum);
    dt_nn_param_spec s[5] = {spec("weight", DT_NN_INIT_ONES, false, 1, c, 0, 0, 0),
                             spec("bias", DT_NN_INIT_ZEROS, false, 1, c, 0, 0, 0),
                             spec("running_mean", DT_NN_INIT_ZEROS, true, 1, c, 0, 0, 0),
                             spec("running_var", DT_NN_INIT_ONES, true, 1, c, 0, 0, 0),
                             spec("num_batches_tracked", DT_NN_INIT_ZEROS, true, 0, 0, 0, 0, 0)};
    s[4].dtype = DT_I64;
    dt_module *m = dt__module_new(DT_NN_BATCHNORM2D, 5, s);
    if (m)
        m->in = c, m->eps = eps, m->momentum = momentum;
    return m;
}

dt_module *dt_nn_layernorm(int64_t d, float eps)
{
    if (d <= 0 || !(eps > 0))
        return BAD("LayerNorm: need dim > 0 (%lld) and eps > 0 (%g)", (long long)d, (double)eps);
    dt_nn_param_spec s[2] = {spec("weight", DT_NN_INIT_ONES, false, 1, d, 0, 0, 0),
                             spec("bias", DT_NN_INIT_ZEROS, false, 1, d, 0, 0, 0)};
    dt_module *m = dt__module_new(DT_NN_LAYERNORM, 2, s);
    if (m)
        m->in = d, m->eps = eps;
    return m;
}

dt_module *dt_nn_relu(void) { return dt__module_new(DT_NN_RELU, 0, NULL); }
dt_module *dt_nn_gelu(void) { return dt__module_new(DT_NN_GELU, 0, NULL); }

static dt_module *pool(dt_nn_kind kind, int k, int stride, int pad)
{
    if (k <= 0 || stride < 0 || pad < 0 || 2 * pad > k)
        return BAD("pooling: need kernel > 0 (%d), stride >= 0 (%d), 0 <= pad <= kernel/2 (%d)", k, stride, pad);
    dt_module *m = dt__module_new(kind, 0, NULL);
    if (m)
        m->k = k, m->stride = stride ? stride : k, m->pad = pad;
    return m;
}

dt_module *dt_nn_maxpool2d(int k, int stride, int pad) { return pool(DT_NN_MAXPOOL2D, k, stride, pad); }
dt_module *dt_nn_avgpool2d(int k, int stride, int pad) { return pool(DT_NN_AVGPOOL2D, k, stride, pad); }

dt_module *dt_nn_flatten(int start_dim, int end_dim)
{
    dt_module *m = dt__module_new(DT_NN_FLATTEN, 0, NULL);
    if (m)
        m->start_dim = start_dim, m->end_dim = end_dim;
    return m;
}

dt_module *dt_nn_dropout(float p)
{
    if (!(p >= 0 && p < 1))
        return BAD("Dropout: p must be in [0, 1), got %g", (double)p);
    dt_module *m = dt__module_new(DT_NN_DROPOUT, 0, NULL);
    if (m)
        m->p = p;
    return m;
}

dt_module *dt_nn_embedding(int64_t num, int64_t dim)
{
    if (num <= 0 || dim <= 0)
        return BAD("Embedding: num_embeddings %lld and dim %lld must be > 0", (long long)num, (long long)dim);
    dt_nn_param_spec s[1] = {spec("weight", DT_NN_INIT_NORMAL, false, 2, num, dim, 0, 0)};
    s[0].a = 1.0f;
    dt_module *m = dt__module_new(DT_NN_EMBEDDING, 1, s);
    if (m)
        m->in = num, m->out = dim;
    return m;
}

dt_module *dt_nn_cross_entropy_loss(void) { return dt__module_new(DT_NN_CROSS_ENTROPY_LOSS, 0, NULL); }
dt_module *dt_nn_mse_loss(void) { return dt__module_new(DT_NN_MSE_LOSS, 0, NULL); }

dt_module *dt_nn_custom(const char *type, int nparams, const dt_nn_param_spec *params, dt_nn_forward_fn forward,
                        void *ud)
{
    if (!type || !forward || (nparams > 0 && !params)) { /* NULL arguments: DT_ERR_NULL, as everywhere */
        dt_error(DT_ERR_NULL, "dt_nn_custom: %s is NULL", !type ? "type" : !forward ? "forward" : "params");
        return NULL;
    }
    if (nparams < 0) {
        dt_error(DT_ERR_INVALID_ARG, "dt_nn_custom '%s': %d param specs", type, nparams);
        return NULL;
    }
    for (int i = 0; i < nparams; i++)
        if (!params[i].name || !params[i].name[0] || strchr(params[i].name, '.') || params[i].ndim < 0 ||
            params[i].ndim > DT_MAX_DIMS || (unsigned)params[i].dtype >= DT_DTYPE_COUNT) {
            dt_error(DT_ERR_INVALID_ARG, "dt_nn_custom '%s': param %d needs a name without '.', 0..%d dims and a "
                     "known dtype", type, i, DT_MAX_DIMS);
            return NULL;
        }
    dt_module *m = dt__module_new(DT_NN_CUSTOM, nparams, params);
    if (!m)
        return NULL;
    m->type = dup_str(type);
    if (!m->type) {
        dt_module_free(m);
        dt_error(DT_ERR_NO_MEMORY, "dt_nn_custom: out of memory");
        return NULL;
    }
    m->fwd = forward;
    m->ud = ud;
    return m;
}

/* ---- containers ------------------------------------------------------------------- */

dt_status dt_nn_add(dt_module *seq, const char *name, dt_module *child)
{
    char idx[24];
    if (!seq || !child) {
        dt_module_free(child);
        return dt_error(DT_ERR_NULL, "dt_nn_add: %s is NULL", seq ? "child" : "container");
    }
    if ((seq->kind != DT_NN_SEQUENTIAL && seq->kind != DT_NN_CUSTOM) || seq->model || child->parent ||
        child->model || child == seq) {
        dt_module_free(child);
        return dt_error(DT_ERR_STATE, "dt_nn_add: the container must be an unbuilt Sequential or custom module "
                                      "and the child a free module");
    }
    if (!name) {
        snprintf(idx, sizeof idx, "%d", seq->nchild);
        name = idx;
    }
    bool dup = false;
    for (int i = 0; i < seq->nchild; i++)
        dup = dup || !strcmp(seq->children[i]->name, name);
    if (!name[0] || strchr(name, '.') || dup) {
        dt_module_free(child);
        return dt_error(DT_ERR_INVALID_ARG, "dt_nn_add: child name '%s' is empty, has a '.' or is taken",
                        name);
    }
    if (seq->nchild == seq->cap) {
        int cap = seq->cap ? 2 * seq->cap : 4;
        dt_module **c = realloc(seq->children, (size_t)cap * sizeof *c);
        if (!c) {
            dt_module_free(child);
            return dt_error(DT_ERR_NO_MEMORY, "dt_nn_add: out of memory");
        }
        seq->children = c;
        seq->cap = cap;
    }
    child->name = dup_str(name);
    if (!child->name) {
        dt_module_free(child);
        return dt_error(DT_ERR_NO_MEMORY, "dt_nn_add: out of memory");
    }
    child->parent = seq;
    seq->children[seq->nchild++] = child;
    return DT_OK;
}

dt_module *dt_nn_seq(int n, dt_module **children)
{
    if (n < 0 || (n > 0 && !children)) {
        dt_error(n < 0 ? DT_ERR_INVALID_ARG : DT_ERR_NULL, "dt_nn_seq: %d children %s", n,
                 n < 0 ? "(want n >= 0)" : "from a NULL array");
        return NULL;
    }
    dt_module *s = dt__module_new(DT_NN_SEQUENTIAL, 0, NULL);
    int i = 0;
    if (!s)
        goto fail;
    for (; i < n; i++) {
        dt_module *c = children[i];
        if (!c) {
            dt_error(DT_ERR_NULL, "dt_nn_seq: child %d is NULL (did its constructor fail?)", i);
            i++;
            goto fail;
        }
        if (dt_nn_add(s, NULL, c) < 0) {
            i++;
            goto fail;
        }
    }
    return s;
fail:
    for (; i < n; i++)
        dt_module_free(children[i]);
    dt_module_free(s);
    return NULL;
}

/* ---- accessors ---------------------------------------------------------------------- */

dt_nn_kind dt_module_kind(const dt_module *m) { return m ? m->kind : DT_NN_KIND_COUNT; }
const char *dt_module_type(const dt_module *m)
{
    if (!m)
        return "?";
    return m->kind == DT_NN_CUSTOM && m->type ? m->type : g_type_names[m->kind];
}
const char *dt_module_path(const dt_module *m) { return m && m->path ? m->path : ""; }
int dt_module_num_children(const dt_module *m) { return m ? m->nchild : 0; }
dt_module *dt_module_find_child(const dt_module *m, const char *name)
{
    for (int i = 0; m && name && i < m->nchild; i++)
        if (!strcmp(m->children[i]->name, name))
            return m->children[i];
    return NULL;
}
dt_module *dt_module_child(const dt_module *m, int i)
{
    return m && i >= 0 && i < m->nchild ? m->children[i] : NULL;
}
dt_tensor *dt_module_param(const dt_module *m, int i)
{
    return m && m->params && i >= 0 && i < m->nparam ? m->params[i] : NULL;
}
bool dt_module_is_training(const dt_module *m) { return m && m->training; }

static int spec_index(const dt_module *m, const char *name)
{
    for (int i = 0; m && name && i < m->nparam; i++)
        if (!strcmp(m->specs[i].name, name))
            return i;
    return -1;
}

dt_status dt_module_tie(dt_module *m, const char *param, dt_module *src, const char *src_param)
{
    if (!m || !param || !src || !src_param)
        return dt_error(DT_ERR_NULL, "dt_module_tie: NULL argument");
    if (m->model || src->model)
        return dt_error(DT_ERR_STATE, "dt_module_tie: tie before dt_model_build");
    int i = spec_index(m, param), j = spec_index(src, src_param);
    if (i < 0 || j < 0)
        return dt_error(DT_ERR_NOT_FOUND, "dt_module_tie: %s has no parameter '%s'", dt_module_type(i < 0 ? m : src),
                        i < 0 ? param : src_param);
    const dt_nn_param_spec *a = &m->specs[i], *b = &src->specs[j];
    bool same = a->ndim == b->ndim && a->dtype == b->dtype && !a->is_buffer && !b->is_buffer && (m != src || i != j);
    for (int d = 0; same && d < a->ndim; d++)
        same = a->shape[d] == b->shape[d];
    if (!same)
        return dt_error(DT_ERR_SHAPE, "dt_module_tie: %s.%s and %s.%s must be two parameters (not buffers) of one "
                        "shape and dtype", dt_module_type(m), param, dt_module_type(src), src_param);
    /* no cycles: follow the source's own ties */
    const dt_module *s = src;
    for (int k = j, steps = 0; s && steps < 1 << 20; steps++) {
        if (s == m && k == i)
            return dt_error(DT_ERR_INVALID_ARG, "dt_module_tie: %s.%s would be tied to itself", dt_module_type(m),
                            param);
        const struct dt__tie *t = &s->ties[k];
        s = t->src;
        k = t->spec;
    }
    m->ties[i].src = src;
    m->ties[i].spec = spec_index(src, src_param);
    return DT_OK;
}

dt_status dt_module_set_forward(dt_module *m, dt_nn_forward_fn fn, void *ud)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_set_forward: module is NULL");
    m->fwd_override = fn;
    m->fwd_override_ud = fn ? ud : NULL;
    return DT_OK;
}

dt_status dt_module_norm_config(const dt_module *m, float *eps, float *momentum)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_norm_config: module is NULL");
    if (m->kind != DT_NN_BATCHNORM2D && m->kind != DT_NN_LAYERNORM)
        return dt_error(DT_ERR_INVALID_ARG, "dt_module_norm_config: module '%s' is a %s, not a norm",
                        m->path ? m->path : "", dt_module_type(m));
    if (eps)
        *eps = m->eps;
    if (momentum)
        *momentum = m->kind == DT_NN_BATCHNORM2D ? m->momentum : 0.0f;
    return DT_OK;
}

/* ---- writing models -------------------------------------------------------------------- */

dt_status dt_module_get_config(const dt_module *m, dt_module_config *out)
{
    if (!m || !out)
        return dt_error(DT_ERR_NULL, "dt_module_get_config: %s is NULL", m ? "out" : "module");
    *out = (dt_module_config){.in = m->in, .out = m->out, .k = m->k, .stride = m->stride, .pad = m->pad,
                              .bias = m->bias, .eps = m->eps, .momentum = m->momentum, .p = m->p,
                              .start_dim = m->start_dim, .end_dim = m->end_dim};
    return DT_OK;
}

/* A custom module, or the error naming what m is (who: the function). */
static dt_status need_custom(const dt_module *m, const char *who)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "%s: module is NULL", who);
    if (m->kind != DT_NN_CUSTOM)
        return dt_error(DT_ERR_INVALID_ARG, "%s: module '%s' is a built-in %s; only a custom module's (dt_nn_custom) "
                        "can be set", who, m->path ? m->path : "", dt_module_type(m));
    return DT_OK;
}

dt_status dt_module_set_config(dt_module *m, const dt_module_config *c)
{
    dt_status st = need_custom(m, "dt_module_set_config");
    if (st < 0)
        return st;
    if (!c)
        return dt_error(DT_ERR_NULL, "dt_module_set_config: config is NULL");
    m->in = c->in, m->out = c->out, m->k = c->k, m->stride = c->stride, m->pad = c->pad, m->bias = c->bias;
    m->eps = c->eps, m->momentum = c->momentum, m->p = c->p, m->start_dim = c->start_dim, m->end_dim = c->end_dim;
    return DT_OK;
}

void *dt_module_user_data(const dt_module *m) { return m ? m->ud : NULL; }

dt_status dt_module_set_user_data(dt_module *m, void *ud)
{
    dt_status st = need_custom(m, "dt_module_set_user_data");
    if (st < 0)
        return st;
    m->ud = ud;
    return DT_OK;
}

dt_module *dt_module_parent(const dt_module *m) { return m ? m->parent : NULL; }
int dt_module_num_params(const dt_module *m) { return m ? m->nparam : 0; }

dt_status dt_module_param_spec(const dt_module *m, int i, dt_nn_param_spec *out)
{
    if (!m || !out)
        return dt_error(DT_ERR_NULL, "dt_module_param_spec: %s is NULL", m ? "out" : "module");
    if (i < 0 || i >= m->nparam)
        return dt_error(DT_ERR_RANGE, "dt_module_param_spec: %s '%s' has %d parameters, not %d", dt_module_type(m),
                        m->path ? m->path : "", m->nparam, i + 1);
    *out = m->specs[i];
    return DT_OK;
}

dt_status dt_module_set_param_init(dt_module *m, int i, dt_nn_init init, float a)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_set_param_init: module is NULL");
    if (m->model)
        return dt_error(DT_ERR_STATE, "dt_module_set_param_init: %s '%s' is built already; set the init before "
                        "dt_model_build", dt_module_type(m), m->path ? m->path : "");
    if (i < 0 || i >= m->nparam)
        return dt_error(DT_ERR_RANGE, "dt_module_set_param_init: %s has %d parameters, not %d", dt_module_type(m),
                        m->nparam, i + 1);
    if ((unsigned)init > DT_NN_INIT_XAVIER)
        return dt_error(DT_ERR_INVALID_ARG, "dt_module_set_param_init: unknown init %d", (int)init);
    m->specs[i].init = init;
    m->specs[i].a = a;
    return DT_OK;
}

dt_status dt_module_set_param_padding_row(dt_module *m, int i, int64_t row)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_set_param_padding_row: module is NULL");
    if (m->model)
        return dt_error(DT_ERR_STATE, "dt_module_set_param_padding_row: %s '%s' is built already; set the padding "
                        "row before dt_model_build", dt_module_type(m), m->path ? m->path : "");
    if (i < 0 || i >= m->nparam)
        return dt_error(DT_ERR_RANGE, "dt_module_set_param_padding_row: %s has %d parameters, not %d",
                        dt_module_type(m), m->nparam, i + 1);
    if (row < -1 || row >= m->specs[i].shape[0])
        return dt_error(DT_ERR_RANGE, "dt_module_set_param_padding_row: row %lld is outside [0, %lld) of %s's "
                        "parameter '%s' (-1: none)", (long long)row, (long long)m->specs[i].shape[0],
                        dt_module_type(m), m->specs[i].name);
    m->specs[i].has_padding_row = row >= 0;
    m->specs[i].padding_row = row >= 0 ? row : 0;
    return DT_OK;
}

/* ---- hooks ---------------------------------------------------------------------------- */

dt_status dt__hooks_add(dt__hooks *l, void (*fn)(void), void *ud, dt_hook_id *next_id, dt_hook_id *id)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 4;
        dt__hook *h = realloc(l->h, (size_t)cap * sizeof *h);
        if (!h)
            return dt_error(DT_ERR_NO_MEMORY, "adding a hook: out of memory");
        l->h = h;
        l->cap = cap;
    }
    dt_hook_id hid = ++*next_id;
    l->h[l->n++] = (dt__hook){.fn = fn, .ud = ud, .id = hid};
    if (id)
        *id = hid;
    return DT_OK;
}

bool dt__hooks_remove(dt__hooks *l, dt_hook_id id)
{
    for (int i = 0; i < l->n; i++)
        if (l->h[i].id == id) {
            memmove(l->h + i, l->h + i + 1, (size_t)(l->n - i - 1) * sizeof *l->h);
            l->n--;
            return true;
        }
    return false;
}

void dt__hooks_free(dt__hooks *l)
{
    free(l->h);
    memset(l, 0, sizeof *l);
}

static dt_status add_hook(dt_module *m, int kind, void (*fn)(void), void *ud, dt_hook_id *id)
{
    static const char *names[] = {"forward pre", "forward post", "backward pre", "backward post"};
    if (!m || !fn)
        return dt_error(DT_ERR_NULL, "add %s hook: %s is NULL", names[kind], m ? "function" : "module");
    dt_status st = dt__hooks_add(&m->hooks[kind], fn, ud, &m->next_hook_id, id);
    return st < 0 ? dt_error_wrap(st, "module '%s'", dt_module_path(m)) : DT_OK;
}

dt_status dt_module_add_forward_pre_hook(dt_module *m, dt_fwd_pre_hook fn, void *ud, dt_hook_id *id)
{
    return add_hook(m, DT__HOOK_FWD_PRE, (void (*)(void))fn, ud, id);
}
dt_status dt_module_add_forward_post_hook(dt_module *m, dt_fwd_post_hook fn, void *ud, dt_hook_id *id)
{
    return add_hook(m, DT__HOOK_FWD_POST, (void (*)(void))fn, ud, id);
}
dt_status dt_module_add_backward_pre_hook(dt_module *m, dt_bwd_hook fn, void *ud, dt_hook_id *id)
{
    return add_hook(m, DT__HOOK_BWD_PRE, (void (*)(void))fn, ud, id);
}
dt_status dt_module_add_backward_post_hook(dt_module *m, dt_bwd_hook fn, void *ud, dt_hook_id *id)
{
    return add_hook(m, DT__HOOK_BWD_POST, (void (*)(void))fn, ud, id);
}

dt_status dt_module_remove_hook(dt_module *m, dt_hook_id id)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_remove_hook: module is NULL");
    for (int k = 0; k < DT__HOOK_KINDS; k++)
        if (dt__hooks_remove(&m->hooks[k], id))
            return DT_OK;
    return dt_error(DT_ERR_NOT_FOUND, "dt_module_remove_hook: module '%s' has no hook %llu", dt_module_path(m),
                    (unsigned long long)id);
}

dt_status dt_module_hook_set_blind(dt_module *m, dt_hook_id id)
{
    if (!m)
        return dt_error(DT_ERR_NULL, "dt_module_hook_set_blind: module is NULL");
    for (int k = 0; k < DT__HOOK_KINDS; k++)
        for (int i = 0; i < m->hooks[k].n; i++)
            if (m->hooks[k].h[i].id == id) {
                m->hooks[k].h[i].blind = true;
                return DT_OK;
            }
    return dt_error(DT_ERR_NOT_FOUND, "dt_module_hook_set_blind: module '%s' has no hook %llu", dt_module_path(m),
                    (unsigned long long)id);
}

void dt_module_clear_hooks(dt_module *m)
{
    for (int k = 0; m && k < DT__HOOK_KINDS; k++)
        m->hooks[k].n = 0;
}

static dt_status run_bwd_hooks(dt_ctx *ctx, dt_module *m, int kind)
{
    for (int i = 0; i < m->hooks[kind].n; i++) {
        dt_status st = ((dt_bwd_hook)m->hooks[kind].h[i].fn)(ctx, m, m->hooks[kind].h[i].ud);
        if (st < 0)
            return dt_error_wrap(st, "module '%s' backward %s hook %d", m->path, kind == DT__HOOK_BWD_PRE ? "pre" : "post", i);
    }
    return DT_OK;
}

static dt_status mark_bwd_pre(dt_ctx *ctx, void *ud) { return run_bwd_hooks(ctx, ud, DT__HOOK_BWD_PRE); }
static dt_status mark_bwd_post(dt_ctx *ctx, void *ud) { return run_bwd_hooks(ctx, ud, DT__HOOK_BWD_POST); }

/* ---- forward ---------------------------------------------------------------------------- */

static dt_tensor *shape_error(const dt_module *m, const dt_tensor *x, const char *want)
{
    char buf[128];
    (void)m;
    dt_error(DT_ERR_SHAPE, "input %s, expected %s", dt_tensor_shape_str(x, buf, sizeof buf), want);
    return NULL;
}

bool dt_module_is_plain(const dt_module *m)
{
    if (!m)
        return true;
    for (int k = 0; k < DT__HOOK_KINDS; k++)
        if (m->hooks[k].n)
            return false;
    return !m->fwd_override && !m->ckpt;
}

bool dt_module_tree_plain(const dt_module *m)
{
    if (!dt_module_is_plain(m))
        return false;
    for (int i = 0; m && i < m->nchild; i++)
        if (!dt_module_tree_plain(m->children[i]))
            return false;
    return true;
}

static bool tree_unobserved(const dt_module *m)
{
    for (int k = 0; k < DT__HOOK_KINDS; k++)
        for (int i = 0; i < m->hooks[k].n; i++)
            if (!m->hooks[k].h[i].blind)
                return false;
    if (m->fwd_override)
        return false;
    for (int i = 0; i < m->nchild; i++)
        if (!tree_unobserved(m->children[i]))
            return false;
    return true;
}

bool dt_module_subtree_unobserved(const dt_module *m)
{
    for (int i = 0; m && i < m->nchild; i++)
        if (!tree_unobserved(m->children[i]))
            return false;
    return true;
}

dt_rng_key dt_module_dropout_key(dt_module *m)
{
    int rank = m->model ? m->model->rank : 0;
    if (m->model && m->model->replica_ranks > 1) /* context parallelism: the replica's masks */
        rank /= m->model->replica_ranks;
    uint64_t seed = m->model ? m->model->seed : 0;
    dt_rng_key key = dt_rng_key_make(seed, DT_RNG_DROPOUT, ((uint64_t)(uint32_t)rank << 32) | (uint32_t)m->index,
                                     m->fwd_count);
    if (m->training)
        m->fwd_count++;
    return key;
}

/* BatchNorm2d m on x, alone or with ReLU and 2 x 2 max pooling after it
 * (dt_batch_norm_relu_max_pool2x2), then its count of batches */
static dt_tensor *batchnorm_forward(dt_ctx *ctx, dt_module *m, dt_tensor *x, bool relu_pool)
{
    if ((x->ndim != 4 && x->ndim != 2) || x->shape[1] != m->in) {
        char want[96];
        snprintf(want, sizeof want, "[N, %lld, H, W] or [N, %lld]", (long long)m->in, (long long)m->in);
        return shape_error(m, x, want);
    }
    dt_tensor *const *p = m->params;
    dt_tensor *y = relu_pool ? dt_batch_norm_relu_max_pool2x2(ctx, x, p[0], p[1], p[2], p[3], m->training, m->momentum,
                                                              m->eps)
                             : dt_batch_norm(ctx, x, p[0], p[1], p[2], p[3], m->training, m->momentum, m->eps);
    if (y && m->training)
        ((int64_t *)p[4]->data)[0] += 1;
    return y;
}

static dt_tensor *forward_kind(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    char want[96];
    switch (m->kind) {
    case DT_NN_SEQUENTIAL:
        for (int i = 0; i < m->nchild && x; i++)
            x = dt_module_forward(ctx, m->children[i], x);
        return x;
    case DT_NN_LINEAR:
        if (x->ndim < 1 || x->shape[x->ndim - 1] != m->in) {
            snprintf(want, sizeof want, "[..., %lld]", (long long)m->in);
            return shape_error(m, x, want);
        }
        return dt_linear(ctx, x, m->params[0], m->bias ? m->params[1] : NULL);
    case DT_NN_CONV2D:
        if (x->ndim != 4 || x->shape[1] != m->in) {
            snprintf(want, sizeof want, "[N, %lld, H, W]", (long long)m->in);
            return shape_error(m, x, want);
        }
        return dt_conv2d(ctx, x, m->params[0], m->bias ? m->params[1] : NULL, m->stride, m->pad);
    case DT_NN_BATCHNORM2D:
        return batchnorm_forward(ctx, m, x, false);
    case DT_NN_LAYERNORM:
        if (x->ndim < 1 || x->shape[x->ndim - 1] != m->in) {
            snprintf(want, sizeof want, "[..., %lld]", (long long)m->in);
            return shape_error(m, x, want);
        }
        return dt_layer_norm(ctx, x, m->params[0], m->params[1], m->eps);
    case DT_NN_RELU:
        return dt_relu(ctx, x);
    case DT_NN_GELU:
        return dt_gelu(ctx, x);
    case DT_NN_MAXPOOL2D:
    case DT_NN_AVGPOOL2D:
        if (x->ndim != 4)
            return shape_error(m, x, "[N, C, H, W]");
        return m->kind == DT_NN_MAXPOOL2D ? dt_max_pool2d(ctx, x, m->k, m->stride, m->pad)
                                          : dt_avg_pool2d(ctx, x, m->k, m->stride, m->pad);
    case DT_NN_FLATTEN:
        return dt_flatten(ctx, x, m->start_dim, m->end_dim);
    case DT_NN_DROPOUT:
        return dt_dropout(ctx, x, m->p, m->training, dt_module_dropout_key(m));
    case DT_NN_EMBEDDING:
        return dt_embedding(ctx, m->params[0], x);
    case DT_NN_CUSTOM:
        return m->fwd(ctx, m, x, m->ud);
    case DT_NN_CROSS_ENTROPY_LOSS:
    case DT_NN_MSE_LOSS:
        dt_error(DT_ERR_UNSUPPORTED, "module '%s' (%s) is a loss: call dt_module_loss(ctx, m, pred, target)",
                 m->path, dt_module_type(m));
        return NULL;
    default:
        dt_error(DT_ERR_INTERNAL, "module '%s': unknown kind %d", m->path, (int)m->kind);
        return NULL;
    }
}

dt_tensor *dt__module_body(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    return m->fwd_override ? m->fwd_override(ctx, m, x, m->fwd_override_ud) : forward_kind(ctx, m, x);
}

dt_tensor *dt_module_forward(dt_ctx *ctx, dt_module *m, dt_tensor *x)
{
    if (!m || !ctx) {
        dt_error(DT_ERR_NULL, "dt_module_forward: %s is NULL", m ? "context" : "module");
        return NULL;
    }
    if (!x) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "module '%s' (%s): input is NULL", dt_module_path(m), dt_module_type(m));
        return NULL;
    }
    if (!m->model) {
        dt_error(DT_ERR_STATE, "module '%s' (%s): not part of a built model (call dt_model_build first)",
                 dt_module_path(m), dt_module_type(m));
        return NULL;
    }
    for (int i = 0; i < m->hooks[DT__HOOK_FWD_PRE].n; i++) {
        dt_status st = ((dt_fwd_pre_hook)m->hooks[DT__HOOK_FWD_PRE].h[i].fn)(ctx, m, x, m->hooks[DT__HOOK_FWD_PRE].h[i].ud);
        if (st < 0) {
            dt_error_wrap(st, "module '%s' forward pre hook %d", m->path, i);
            return NULL;
        }
    }
    const bool marks = dt_ag_enabled(ctx);
    if (marks && m->hooks[DT__HOOK_BWD_POST].n && dt_ag_mark(ctx, mark_bwd_post, m) < 0)
        return NULL;
    dt_error_clear();
    dt_tensor *y = m->ckpt && marks ? dt__module_checkpointed(ctx, m, x) : dt__module_body(ctx, m, x);
    if (!y) {
        /* a child already named itself; leaf modules add their path */
        if (m->kind != DT_NN_SEQUENTIAL)
            dt_error_wrap(dt_last_status() ? dt_last_status() : DT_ERR_INTERNAL, "module '%s' (%s)", m->path,
                          dt_module_type(m));
        return NULL;
    }
    if (marks && m->hooks[DT__HOOK_BWD_PRE].n && dt_ag_mark(ctx, mark_bwd_pre, m) < 0)
        return NULL;
    for (int i = 0; i < m->hooks[DT__HOOK_FWD_POST].n; i++) {
        dt_status st =
            ((dt_fwd_post_hook)m->hooks[DT__HOOK_FWD_POST].h[i].fn)(ctx, m, x, y, m->hooks[DT__HOOK_FWD_POST].h[i].ud);
        if (st < 0) {
            dt_error_wrap(st, "module '%s' forward post hook %d", m->path, i);
            return NULL;
        }
    }
    return y;
}

dt_tensor *dt_module_forward_bn_relu_pool(dt_ctx *ctx, dt_module *bn, dt_module *pool, dt_tensor *x)
{
    if (ctx && bn && pool && x && bn->model && pool->model && bn->kind == DT_NN_BATCHNORM2D &&
        pool->kind == DT_NN_MAXPOOL2D && pool->k == 2 && pool->stride == 2 && pool->pad == 0 &&
        dt_module_is_plain(bn) && dt_module_is_plain(pool)) {
        dt_error_clear();
        dt_tensor *y = batchnorm_forward(ctx, bn, x, true);
        if (!y)
            dt_error_wrap(dt_last_status() ? dt_last_status() : DT_ERR_INTERNAL, "module '%s' (%s)", bn->path,
                          dt_module_type(bn));
        return y;
    }
    x = dt_module_forward(ctx, bn, x);
    x = dt_module_forward(ctx, pool, x);
    return x ? dt_relu(ctx, x) : NULL;
}

dt_tensor *dt_module_loss(dt_ctx *ctx, dt_module *m, dt_tensor *pred, dt_tensor *target)
{
    if (!m || !ctx) {
        dt_error(DT_ERR_NULL, "dt_module_loss: %s is NULL", m ? "context" : "module");
        return NULL;
    }
    if (!pred || !target) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: %s is NULL", dt_module_type(m), pred ? "target" : "prediction");
        return NULL;
    }
    if (m->kind == DT_NN_CROSS_ENTROPY_LOSS)
        return dt_cross_entropy(ctx, pred, target);
    if (m->kind == DT_NN_MSE_LOSS)
        return dt_mse_loss(ctx, pred, target);
    dt_error(DT_ERR_INVALID_ARG, "dt_module_loss: module '%s' (%s) is not a loss", dt_module_path(m),
             dt_module_type(m));
    return NULL;
}
