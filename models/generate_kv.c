/* The key/value cache of dt_model_generate (generate.c) for a GPT-2 or a
 * Llama-family zoo model in one process.
 *
 * Without it each new token costs a forward over the whole window. With it
 * the prompt runs once and each later token runs alone: the projections,
 * norms and MLPs on the new positions only, attention of the new queries
 * over the cached keys and values of every position so far (causal;
 * dt__kv_attention), the head on the last position only. The cache holds
 * each layer's keys and values in f32 for the positions [0, cap); a bf16
 * model's projections stay bf16, attention reads them widened to f32 and
 * its output is narrowed back for the output projection.
 *
 * GPT-2 (gpt2_*): walked here module by module: the embedding of the new
 * positions, per block ln_1, c_attn, the cached attention, c_proj and the
 * residual, then the block's MLP half as the model runs it
 * (dt__gpt2_block_half), ln_f and the head. Llama (llama_*): the model's
 * own forward over the new tokens, its attention told by the cache which
 * positions they are (dt__llama_kv_forward, llama.c): RoPE, Qwen3's
 * per-head norms, Gemma's scaling and grouped-query attention stay the
 * model's.
 *
 * Positions stay fixed only while the sequence fits the window: once it is
 * longer than the model's positions the uncached forward crops it to the
 * last ones, every token at a new position, and the caller falls back to
 * that forward. A model the cache does not know (tensor- or
 * context-parallel, hooks, forward overrides other than LoRA's,
 * activation checkpointing, another module tree) is generated without it. */
#include "zoo.h"

#include <dtrain/tp.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_module *ln_1, *c_attn, *c_proj, *block;
} kv_block;

struct dt__gen_kv {
    dt__kv_cache c; /* every layer's keys and values */
    dt_tensor *(*forward)(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n); /* gpt2_ or llama_ */
    dt_model *m;
    int64_t restart; /* dt__gen_kv_start: recompute once the sequence passes it (0: never) */
    /* GPT-2's modules */
    dt_module *wte, *wpe, *ln_f, *head;
    kv_block *b;
    int H;
    int64_t C;
};

/* A subtree the cache can run: no tensor parallelism, and every module
 * plain (no hooks, forward overrides, checkpointing), except a LoRA layer
 * (children lora_A and lora_B: its forward, base(x) + scaling B(A(x)), acts
 * on each row alone, and the cached path calls it as it is). */
static bool plain(const dt_module *m)
{
    const bool lora = dt_module_find_child(m, "lora_A") && dt_module_find_child(m, "lora_B");
    if (dt_tp_module_group(m) || (!lora && !dt_module_is_plain(m)))
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

/* c's storage for L layers of B sequences of cap positions of row floats
 * (and, for B > 1, dt__kv_reorder's scratch: one layer's). */
static dt_status cache_alloc(dt__kv_cache *c, int L, int64_t B, int64_t row, int64_t cap, int64_t window)
{
    *c = (dt__kv_cache){.L = L, .B = B, .row = row, .cap = cap, .window = window};
    const double n = (double)L * (double)B * (double)cap * (double)row;
    if (n * 2 * sizeof(float) < (double)(SIZE_MAX / 4)) {
        c->k = dt_alloc((size_t)n * sizeof(float));
        c->v = dt_alloc((size_t)n * sizeof(float));
        c->scratch = B > 1 ? dt_alloc((size_t)B * (size_t)cap * (size_t)row * sizeof(float)) : NULL;
    }
    if (c->k && c->v && (B == 1 || c->scratch))
        return DT_OK;
    return dt_error(DT_ERR_NO_MEMORY, "generate: a key/value cache of %lld positions (%d layers, rows of %lld) "
                    "for %lld sequences (num_beams)", (long long)cap, L, (long long)row, (long long)B);
}

void dt__kv_reorder(dt__kv_cache *c, const int64_t *parent)
{
    const size_t seq = (size_t)c->cap * (size_t)c->row, used = (size_t)c->len * (size_t)c->row;
    bool same = true;
    for (int64_t b = 0; b < c->B; b++)
        same &= parent[b] == b;
    if (same || !used)
        return;
    for (int l = 0; l < c->L; l++)
        for (int kv = 0; kv < 2; kv++) {
            float *x = (kv ? c->v : c->k) + (size_t)l * (size_t)c->B * seq;
            for (int64_t b = 0; b < c->B; b++)
                memcpy(c->scratch + (size_t)b * seq, x + (size_t)parent[b] * seq, used * sizeof(float));
            for (int64_t b = 0; b < c->B; b++)
                memcpy(x + (size_t)b * seq, c->scratch + (size_t)b * seq, used * sizeof(float));
        }
}

/* An f32 contiguous copy of x (or x itself). */
static dt_tensor *as_f32(dt_ctx *ctx, dt_tensor *x)
{
    if (x && x->dtype != DT_F32)
        x = dt_cast(ctx, x, DT_F32);
    if (x && !dt_tensor_is_contiguous(x))
        x = dt_contiguous(ctx, x);
    return x;
}

dt_tensor *dt__kv_attention(dt_ctx *ctx, dt__kv_cache *c, int l, dt_tensor *q, dt_tensor *k, dt_tensor *v, int H,
                            int KV)
{
    if (!q || !k || !v)
        return NULL;
    const int64_t B = c->B, n = q->ndim == 3 ? q->shape[1] : 0, p0 = c->len, P = p0 + n;
    const int64_t hd = H > 0 ? q->shape[q->ndim - 1] / H : 0, row = (int64_t)KV * hd;
    if (l < 0 || l >= c->L || H < 1 || KV < 1 || H % KV || n < 1 || q->shape[0] != B || hd * H != q->shape[2] ||
        row != c->row || k->ndim != 3 || k->shape[0] != B || k->shape[1] != n || k->shape[2] != row ||
        v->ndim != 3 || v->shape[0] != B || v->shape[1] != n || v->shape[2] != row || P > c->cap) {
        dt_error(DT_ERR_SHAPE, "generate: cached attention of layer %d (%d heads over %d, %lld positions after "
                 "%lld) does not fit the cache (%d layers, %lld sequences, rows of %lld, %lld positions)", l, H, KV,
                 (long long)n, (long long)p0, c->L, (long long)B, (long long)c->row, (long long)c->cap);
        return NULL;
    }
    const dt_dtype dt = q->dtype;
    dt_tensor *k32 = as_f32(ctx, k), *v32 = as_f32(ctx, v);
    if (!k32 || !v32)
        return NULL;
    const size_t seq = (size_t)c->cap * (size_t)row; /* one sequence's positions */
    float *K = c->k + (size_t)l * (size_t)B * seq, *Vc = c->v + (size_t)l * (size_t)B * seq;
    for (int64_t b = 0; b < B; b++) {
        memcpy(K + (size_t)b * seq + (size_t)p0 * (size_t)row, (const float *)k32->data + (size_t)(b * n) * (size_t)row,
               (size_t)n * (size_t)row * sizeof(float));
        memcpy(Vc + (size_t)b * seq + (size_t)p0 * (size_t)row, (const float *)v32->data + (size_t)(b * n) * (size_t)row,
               (size_t)n * (size_t)row * sizeof(float));
    }
    const int64_t window = c->full && c->full[l] ? 0 : c->window; /* this layer's */
    if (p0 == 0 && n > 1 && hd <= 256) {
        /* a prompt with nothing cached before it: the model's own kernels over the rows in their dtype (as the
           uncached forward computes them) */
        if (!dt_tensor_is_contiguous(q))
            q = dt_contiguous(ctx, q);
        if (!dt_tensor_is_contiguous(k))
            k = dt_contiguous(ctx, k);
        if (!dt_tensor_is_contiguous(v))
            v = dt_contiguous(ctx, v);
        return dt_attention_window(ctx, dt_gqa_pack(ctx, q, k, v, H, KV), H, window, c->softcap);
    }
    q = as_f32(ctx, q);
    float *y = dt_ctx_alloc(ctx, (size_t)(B * n) * (size_t)H * (size_t)hd * sizeof(float));
    float *sc = dt_ctx_alloc(ctx, (size_t)(B * H) * (size_t)P * sizeof(float)); /* one score row per head */
    if (!q || !y || !sc)
        return NULL;
    const float *qd = q->data, scale = 1.0f / sqrtf((float)hd), cap = c->softcap, inv = cap > 0.0f ? 1.0f / cap : 0.0f;
    const int64_t group = H / KV;
#pragma omp parallel for schedule(static) num_threads(dt_get_num_threads()) if (B * H > 1 && P * hd > 4096)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        float *s = sc + (size_t)bh * (size_t)P;
        const int64_t kh = h / group; /* its kv head (transformers' repeat_kv) */
        const float *Kb = K + (size_t)b * seq, *Vb = Vc + (size_t)b * seq;
        for (int64_t i = 0; i < n; i++) {
            const float *qi = qd + ((size_t)(b * n + i) * (size_t)H + (size_t)h) * (size_t)hd;
            const int64_t nk = p0 + i + 1, j0 = window > 0 && nk > window ? nk - window : 0;
            float mx = -INFINITY;
            for (int64_t j = j0; j < nk; j++) {
                const float *kj = Kb + (size_t)j * (size_t)row + (size_t)(kh * hd);
                float d = 0;
#pragma omp simd reduction(+ : d)
                for (int64_t e = 0; e < hd; e++)
                    d += qi[e] * kj[e];
                s[j] = cap > 0.0f ? cap * tanhf(d * scale * inv) : d * scale;
                mx = s[j] > mx ? s[j] : mx;
            }
            float sum = 0;
            for (int64_t j = j0; j < nk; j++) {
                s[j] = expf(s[j] - mx);
                sum += s[j];
            }
            float *yo = y + ((size_t)(b * n + i) * (size_t)H + (size_t)h) * (size_t)hd;
            for (int64_t e = 0; e < hd; e++)
                yo[e] = 0;
            for (int64_t j = j0; j < nk; j++) {
                const float *vj = Vb + (size_t)j * (size_t)row + (size_t)(kh * hd), w = s[j] / sum;
#pragma omp simd
                for (int64_t e = 0; e < hd; e++)
                    yo[e] += w * vj[e];
            }
        }
    }
    dt_tensor *out = dt_tensor_view_of(ctx, y, DT_F32, 3, (int64_t[]){B, n, (int64_t)H * hd});
    return out && dt != DT_F32 ? dt_cast(ctx, out, dt) : out;
}

/* ---- GPT-2: the blocks walked here ---- */

static dt_tensor *gpt2_forward(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n)
{
    const int64_t p0 = kv->c.len, C = kv->C, B = kv->c.B;
    int64_t *ids = dt_ctx_alloc(ctx, (size_t)(B * n + n) * sizeof *ids);
    if (!ids)
        return NULL;
    memcpy(ids, tok, (size_t)(B * n) * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[B * n + i] = p0 + i;
    dt_tensor *x = dt_add(ctx, dt_module_forward(ctx, kv->wte, dt_tensor_view_of(ctx, ids, DT_I64, 2, (int64_t[]){B, n})),
                          dt_module_forward(ctx, kv->wpe, dt_tensor_view_of(ctx, ids + B * n, DT_I64, 1, &n)));
    for (int l = 0; l < kv->c.L && x; l++) {
        const kv_block *b = &kv->b[l];
        dt_tensor *qkv = dt_module_forward(ctx, b->c_attn, dt_module_forward(ctx, b->ln_1, x)); /* [1, n, 3C] */
        dt_tensor *y = qkv ? dt__kv_attention(ctx, &kv->c, l, dt_narrow(ctx, qkv, 2, 0, C),
                                              dt_narrow(ctx, qkv, 2, C, C), dt_narrow(ctx, qkv, 2, 2 * C, C), kv->H,
                                              kv->H)
                           : NULL;
        x = y ? dt_add(ctx, x, dt_module_forward(ctx, b->c_proj, y)) : NULL;
        x = x ? dt__gpt2_block_half(ctx, b->block, x, 1) : NULL; /* ln_2, MLP, residual */
    }
    if (!x)
        return NULL;
    x = dt_contiguous(ctx, dt_narrow(ctx, x, 1, n - 1, 1));
    return dt_module_forward(ctx, kv->head, dt_module_forward(ctx, kv->ln_f, x));
}

/* kv of B sequences for a GPT-2 zoo tree (kv->forward stays NULL for
 * another model), want positions or as many as the model has; none for a
 * prompt of more. */
static dt_status gpt2_init(dt_model *m, int64_t B, int64_t nprompt, int64_t want, dt__gen_kv *kv)
{
    dt_module *root = dt_model_root(m);
    dt_module *tr = kid(root, "transformer"), *h = kid(tr, "h");
    if (!tr || !h || !kid(tr, "wte") || !kid(tr, "wpe") || !kid(tr, "ln_f") || !kid(root, "lm_head") ||
        dt_module_num_children(h) < 1)
        return DT_OK; /* not the zoo's layout: no cache */
    kv->wte = kid(tr, "wte"), kv->wpe = kid(tr, "wpe"), kv->ln_f = kid(tr, "ln_f"), kv->head = kid(root, "lm_head");
    const int L = dt_module_num_children(h);
    kv->b = calloc((size_t)L, sizeof *kv->b);
    if (!kv->b)
        return dt_error(DT_ERR_NO_MEMORY, "generate: the key/value cache");
    for (int l = 0; l < L; l++) {
        dt_module *blk = dt_module_child(h, l), *attn = kid(blk, "attn");
        kv_block *b = &kv->b[l];
        b->block = blk, b->ln_1 = kid(blk, "ln_1"), b->c_attn = kid(attn, "c_attn"), b->c_proj = kid(attn, "c_proj");
        if (!b->ln_1 || !b->c_attn || !b->c_proj || !kid(blk, "ln_2") || !kid(blk, "mlp") || heads(attn) < 1 ||
            (l > 0 && heads(attn) != kv->H) || !dt_module_param(b->c_attn, 0))
            return DT_OK;
        kv->H = heads(attn);
    }
    kv->C = dt_module_param(kv->wte, 0)->shape[1];
    const dt_tensor *wa = dt_module_param(kv->b[0].c_attn, 0); /* c_attn: C -> 3C (either layout) */
    const int64_t P = dt_module_param(kv->wpe, 0)->shape[0];
    if (kv->C % kv->H || wa->ndim != 2 || wa->shape[0] * wa->shape[1] != 3 * kv->C * kv->C || nprompt > P)
        return DT_OK;
    dt_status st = cache_alloc(&kv->c, L, B, kv->C, want < P ? want : P, 0);
    if (st == DT_OK)
        kv->forward = gpt2_forward;
    return st;
}

/* ---- Llama family: the model's own forward (llama.c) ---- */

static dt_tensor *llama_forward(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n)
{
    return dt__llama_kv_forward(kv->m, &kv->c, ctx, tok, n);
}

static dt_status llama_init(dt_model *m, int64_t B, int64_t nprompt, int64_t want, dt__gen_kv *kv)
{
    dt__llama_kv_info in;
    if (!dt__llama_kv_shape(m, &in) || nprompt > in.positions)
        return DT_OK;
    kv->restart = in.restart;
    dt_status st = cache_alloc(&kv->c, in.L, B, in.row, want < in.positions ? want : in.positions, in.window);
    if (st == DT_OK) {
        kv->c.full = in.full;
        kv->c.softcap = in.softcap;
        kv->forward = llama_forward;
    }
    return st;
}

dt_status dt__gen_kv_init(dt_model *m, int64_t B, int64_t nprompt, int64_t nnew, dt__gen_kv **out)
{
    static dt_status (*const inits[])(dt_model *, int64_t, int64_t, int64_t, dt__gen_kv *) = {gpt2_init, llama_init};
    *out = NULL;
    dt_module *root = dt_model_root(m);
    if (!root || !plain(root) || B < 1 || nprompt < 1 || nnew < 0 || nnew > INT64_MAX - nprompt)
        return DT_OK;
    for (size_t i = 0; i < sizeof inits / sizeof inits[0]; i++) {
        dt__gen_kv *kv = calloc(1, sizeof *kv);
        if (!kv)
            return dt_error(DT_ERR_NO_MEMORY, "generate: the key/value cache");
        kv->m = m;
        dt_status st = inits[i](m, B, nprompt, nprompt + nnew, kv);
        if (st == DT_OK && kv->forward) {
            *out = kv;
            return DT_OK;
        }
        dt__gen_kv_free(kv);
        if (st < 0)
            return st;
    }
    return DT_OK; /* a model the cache does not know */
}

void dt__gen_kv_free(dt__gen_kv *kv)
{
    if (!kv)
        return;
    dt_free(kv->c.k);
    dt_free(kv->c.v);
    dt_free(kv->c.scratch);
    free(kv->b);
    free(kv);
}

int64_t dt__gen_kv_len(const dt__gen_kv *kv) { return kv ? kv->c.len : 0; }

int64_t dt__gen_kv_start(dt__gen_kv *kv, int64_t n)
{
    if (!kv)
        return 0;
    if (kv->restart && n > kv->restart && kv->c.len <= kv->restart) /* transformers: cache = None */
        kv->c.len = 0;
    return kv->c.len;
}

int64_t dt__gen_kv_cap(const dt__gen_kv *kv) { return kv ? kv->c.cap : 0; }

void dt__gen_kv_reorder(dt__gen_kv *kv, const int64_t *parent)
{
    if (kv)
        dt__kv_reorder(&kv->c, parent);
}

dt_tensor *dt__gen_kv_forward(dt__gen_kv *kv, dt_ctx *ctx, const int64_t *tok, int64_t n)
{
    if (n < 1 || kv->c.len + n > kv->c.cap) {
        dt_error(DT_ERR_RANGE, "generate: %lld new positions after %lld, the cache holds %lld", (long long)n,
                 (long long)kv->c.len, (long long)kv->c.cap);
        return NULL;
    }
    dt_tensor *logits = as_f32(ctx, kv->forward(kv, ctx, tok, n));
    if (logits)
        kv->c.len += n;
    return logits;
}
