/* The key/value cache of dt_model_generate (generate.c) for a GPT-2 zoo
 * model in one process.
 *
 * Without it each new token costs a forward over the whole window. With it
 * the prompt runs once and each later token runs alone: the embedding of
 * the new positions, per block ln_1, c_attn, attention of the new queries
 * over the cached keys and values of every position so far (causal), c_proj
 * and the residual, then the block's MLP half as the model runs it
 * (dt__gpt2_block_half), ln_f and the head on the last position only. The
 * cache holds each block's keys and values in f32 for the positions
 * [0, cap). The modules' own forwards run the projections, norms and MLP
 * (the model's dtype: a bf16 model's projections stay bf16; attention
 * reads them widened to f32 and its output is narrowed back for c_proj).
 *
 * Positions stay fixed only while the sequence fits the window: once it is
 * longer than block_size the uncached forward crops it to the last
 * block_size tokens, every token at a new position, and the caller falls
 * back to that forward. A model the cache does not know (tensor-parallel
 * slices, hooks, forward overrides, activation checkpointing, another
 * module tree) is generated without it. */
#include "zoo.h"

#include <dtrain/tp.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_module *ln_1, *c_attn, *c_proj, *block;
} kv_block;

struct dt__gen_kv {
    dt_module *wte, *wpe, *ln_f, *head;
    kv_block *b;
    int L, H;
    int64_t C, V, cap, len; /* positions held / cached so far */
    float *k, *v;           /* [L][cap][C] each */
};

/* A plain (no tensor parallelism, hooks, overrides, checkpointing) subtree. */
static bool plain(const dt_module *m)
{
    if (dt_tp_module_group(m) || !dt_module_tree_plain(m))
        return false;
    for (int i = 0; i < dt_module_num_children(m); i++)
        if (!plain(dt_module_child(m, i)))
            return false;
    return true;
}

static dt_module *kid(dt_module *m, const char *name) { return m ? dt_module_find_child(m, name) : NULL; }

/* The number of heads an attention module keeps in its configuration's k
 * (gpt2.c), 0 when it has none. */
static int heads(const dt_module *attn)
{
    dt_module_config c;
    return attn && dt_module_get_config(attn, &c) == DT_OK ? c.k : 0;
}

dt_status dt__gen_kv_init(dt_model *m, int64_t cap, dt__gen_kv **out)
{
    *out = NULL;
    dt_module *root = dt_model_root(m);
    dt_module *tr = kid(root, "transformer"), *h = kid(tr, "h");
    if (!root || !plain(root) || !tr || !h || !kid(tr, "wte") || !kid(tr, "wpe") || !kid(tr, "ln_f") ||
        !kid(root, "lm_head") || dt_module_num_children(h) < 1 || cap < 1)
        return DT_OK; /* not the zoo's layout: no cache */
    dt__gen_kv *kv = calloc(1, sizeof *kv);
    if (!kv)
        return dt_error(DT_ERR_NO_MEMORY, "generate: the key/value cache");
    kv->wte = kid(tr, "wte"), kv->wpe = kid(tr, "wpe"), kv->ln_f = kid(tr, "ln_f"), kv->head = kid(root, "lm_head");
    kv->L = dt_module_num_children(h);
    kv->b = calloc((size_t)kv->L, sizeof *kv->b);
    if (!kv->b)
        goto nomem;
    for (int l = 0; l < kv->L; l++) {
        dt_module *blk = dt_module_child(h, l), *attn = kid(blk, "attn");
        kv_block *b = &kv->b[l];
        b->block = blk, b->ln_1 = kid(blk, "ln_1"), b->c_attn = kid(attn, "c_attn"), b->c_proj = kid(attn, "c_proj");
        if (!b->ln_1 || !b->c_attn || !b->c_proj || !kid(blk, "ln_2") || !kid(blk, "mlp") || heads(attn) < 1 ||
            (l > 0 && heads(attn) != kv->H) || !dt_module_param(b->c_attn, 0)) {
            dt__gen_kv_free(kv);
            return DT_OK;
        }
        kv->H = heads(attn);
    }
    const dt_tensor *wte = dt_module_param(kv->wte, 0);
    kv->V = wte->shape[0], kv->C = wte->shape[1];
    const dt_tensor *wa = dt_module_param(kv->b[0].c_attn, 0); /* c_attn: C -> 3C (either layout) */
    if (kv->C % kv->H || wa->ndim != 2 || wa->shape[0] * wa->shape[1] != 3 * kv->C * kv->C) {
        dt__gen_kv_free(kv);
        return DT_OK;
    }
    kv->cap = cap;
    size_t n = (size_t)kv->L * (size_t)cap * (size_t)kv->C;
    kv->k = dt_alloc(n * sizeof(float));
    kv->v = dt_alloc(n * sizeof(float));
    if (!kv->k || !kv->v)
        goto nomem;
    *out = kv;
    return DT_OK;
nomem:
    dt__gen_kv_free(kv);
    return dt_error(DT_ERR_NO_MEMORY, "generate: a key/value cache of %lld positions", (long long)cap);
}

void dt__gen_kv_free(dt__gen_kv *kv)
{
    if (!kv)
        return;
    dt_free(kv->k);
    dt_free(kv->v);
    free(kv->b);
    free(kv);
}

int64_t dt__gen_kv_len(const dt__gen_kv *kv) { return kv ? kv->len : 0; }

/* An f32 contiguous copy of x (or x itself). */
static dt_tensor *as_f32(dt_ctx *ctx, dt_tensor *x)
{
    if (x && x->dtype != DT_F32)
        x = dt_cast(ctx, x, DT_F32);
    if (x && !dt_tensor_is_contiguous(x))
        x = dt_contiguous(ctx, x);
    return x;
}

/* Block l's attention for the n new rows of qkv [1, n, 3C] (f32) at
 * positions [p0, p0 + n): their keys and values go into the cache, each
 * query attends to positions [0, its own] (softmax of q.k / sqrt(hd)). */
static dt_tensor *attend(dt_ctx *ctx, dt__gen_kv *kv, int l, const float *qkv, int64_t p0, int64_t n)
{
    const int64_t C = kv->C, H = kv->H, hd = C / H, P = p0 + n;
    float *K = kv->k + (size_t)l * (size_t)kv->cap * (size_t)C, *Vc = kv->v + (size_t)l * (size_t)kv->cap * (size_t)C;
    for (int64_t i = 0; i < n; i++) {
        memcpy(K + (size_t)(p0 + i) * (size_t)C, qkv + (size_t)i * 3 * (size_t)C + C, (size_t)C * sizeof(float));
        memcpy(Vc + (size_t)(p0 + i) * (size_t)C, qkv + (size_t)i * 3 * (size_t)C + 2 * C, (size_t)C * sizeof(float));
    }
    float *y = dt_ctx_alloc(ctx, (size_t)n * (size_t)C * sizeof(float));
    float *sc = dt_ctx_alloc(ctx, (size_t)H * (size_t)P * sizeof(float)); /* one score row per head */
    if (!y || !sc)
        return NULL;
    const float scale = 1.0f / sqrtf((float)hd);
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (H > 1 && P * hd > 4096)
    for (int64_t h = 0; h < H; h++) {
        float *s = sc + (size_t)h * (size_t)P;
        for (int64_t i = 0; i < n; i++) {
            const float *q = qkv + (size_t)i * 3 * (size_t)C + (size_t)(h * hd);
            const int64_t nk = p0 + i + 1;
            float mx = -INFINITY;
            for (int64_t j = 0; j < nk; j++) {
                const float *kj = K + (size_t)j * (size_t)C + (size_t)(h * hd);
                float d = 0;
                for (int64_t e = 0; e < hd; e++)
                    d += q[e] * kj[e];
                s[j] = d * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            float sum = 0;
            for (int64_t j = 0; j < nk; j++) {
                s[j] = expf(s[j] - mx);
                sum += s[j];
            }
            float *yo = y + (size_t)i * (size_t)C + (size_t)(h * hd);
            for (int64_t e = 0; e < hd; e++)
                yo[e] = 0;
            for (int64_t j = 0; j < nk; j++) {
                const float *vj = Vc + (size_t)j * (size_t)C + (size_t)(h * hd), w = s[j] / sum;
                for (int64_t e = 0; e < hd; e++)
                    yo[e] += w * vj[e];
            }
        }
    }
    return dt_tensor_view_of(ctx, y, DT_F32, 3, (int64_t[]){1, n, C});
}

dt_tensor *dt__gen_kv_forward(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n)
{
    const int64_t p0 = kv->len;
    if (n < 1 || p0 + n > kv->cap) {
        dt_error(DT_ERR_RANGE, "generate: %lld new positions after %lld, the cache holds %lld", (long long)n,
                 (long long)p0, (long long)kv->cap);
        return NULL;
    }
    int64_t *ids = dt_ctx_alloc(ctx, 2 * (size_t)n * sizeof *ids);
    if (!ids)
        return NULL;
    memcpy(ids, tok, (size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[n + i] = p0 + i;
    dt_tensor *x = dt_add(ctx, dt_module_forward(ctx, kv->wte, dt_tensor_view_of(ctx, ids, DT_I64, 2, (int64_t[]){1, n})),
                          dt_module_forward(ctx, kv->wpe, dt_tensor_view_of(ctx, ids + n, DT_I64, 1, &n)));
    for (int l = 0; l < kv->L && x; l++) {
        const kv_block *b = &kv->b[l];
        dt_tensor *qkv = dt_module_forward(ctx, b->c_attn, dt_module_forward(ctx, b->ln_1, x));
        dt_dtype dt = qkv ? qkv->dtype : DT_F32;
        qkv = as_f32(ctx, qkv);
        dt_tensor *y = qkv ? attend(ctx, kv, l, (const float *)qkv->data, p0, n) : NULL;
        if (y && dt != DT_F32)
            y = dt_cast(ctx, y, dt);
        x = y ? dt_add(ctx, x, dt_module_forward(ctx, b->c_proj, y)) : NULL;
        x = x ? dt__gpt2_block_half(ctx, b->block, x, 1) : NULL; /* ln_2, MLP, residual */
    }
    if (!x)
        return NULL;
    x = dt_contiguous(ctx, dt_narrow(ctx, x, 1, n - 1, 1));
    dt_tensor *logits = as_f32(ctx, dt_module_forward(ctx, kv->head, dt_module_forward(ctx, kv->ln_f, x)));
    if (logits)
        kv->len = p0 + n;
    return logits;
}
