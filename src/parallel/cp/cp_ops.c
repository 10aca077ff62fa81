/* Context parallelism inside a model (cp.h): the differentiable attention
 * over the group, the rank's rows of a whole-sequence tensor, and the loss
 * over the whole sequence.
 *
 * The attention op keeps what the backward needs (the input qkv, the output
 * y and the log-sum-exp of every row) in the step's arena and calls
 * dt_cp_attention_bwd / dt_cp_ulysses_bwd from the tape: the backward is
 * as collective as the forward, in the same order on every rank (the tape
 * runs the same ops everywhere).
 *
 * The loss: each rank holds n_r of the N counted rows of a sequence and
 * computes the mean m_r of its own. The whole sequence's mean is
 * sum_r m_r n_r / N (one all-reduce of two numbers), the value every rank
 * reports. Its gradient with respect to rank r's rows is (n_r / N) dm_r;
 * the strategy then AVERAGES the gradients over the dp x cp ranks (the cp
 * ranks are replicas of the parameters), dividing by P once too often for
 * a sum over the chunks, so the backward hands each rank P n_r / N (as
 * Megatron scales its context-parallel loss by the cp size). */
#include "dtrain/cp.h"

#include <string.h>

/* What an attention over the group computes besides its rows: with causal, a sliding window (0 none) and a soft
 * cap of the scores (0 none); heads [h0, h0 + H) of a layer of Ht, dropout p (0 none: also when not training) with
 * its key */
typedef struct {
    bool causal;
    int64_t window;
    float cap;
    int64_t h0, Ht;
    float p;
    dt_rng_key key;
} attn_mask;

/* The attentions over the group, one row per dt_cp_impl */
typedef struct {
    const char *name;
    bool by_heads; /* the heads (of this rank) are divided over the group */
    dt_status (*fwd)(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                     const attn_mask *m, float *y, float *lse);
    dt_status (*bwd)(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                     const float *dy, int64_t B, int64_t H, int64_t D, const attn_mask *m, float *dqkv);
} cp_impl_ops;

static dt_status ring_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                          const attn_mask *m, float *y, float *lse)
{
    return dt_cp_attention_ex_fwd(cp, l, qkv, B, H, D, m->h0, m->Ht, m->causal, m->window, m->cap, m->p, m->key, y,
                                  lse);
}

static dt_status ring_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                          const float *dy, int64_t B, int64_t H, int64_t D, const attn_mask *m, float *dqkv)
{
    return dt_cp_attention_ex_bwd(cp, l, qkv, y, lse, dy, B, H, D, m->h0, m->Ht, m->causal, m->window, m->cap, m->p,
                                  m->key, dqkv);
}

static dt_status ulysses_fwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, int64_t B, int64_t H, int64_t D,
                             const attn_mask *m, float *y, float *lse)
{
    return dt_cp_ulysses_ex_fwd(cp, l, qkv, B, H, D, m->h0, m->Ht, m->causal, m->window, m->cap, m->p, m->key, y,
                                lse);
}

static dt_status ulysses_bwd(dt_pg *cp, const dt_cp_layout *l, const float *qkv, const float *y, const float *lse,
                             const float *dy, int64_t B, int64_t H, int64_t D, const attn_mask *m, float *dqkv)
{
    return dt_cp_ulysses_ex_bwd(cp, l, qkv, y, lse, dy, B, H, D, m->h0, m->Ht, m->causal, m->window, m->cap, m->p,
                                m->key, dqkv);
}

static const cp_impl_ops k_impl[DT_CP_IMPL_COUNT] = {
    [DT_CP_RING] = {"ring", false, ring_fwd, ring_bwd},
    [DT_CP_ULYSSES] = {"ulysses", true, ulysses_fwd, ulysses_bwd},
};
_Static_assert(DT_CP_IMPL_COUNT == 2, "one row per dt_cp_impl");

const char *dt_cp_impl_name(dt_cp_impl impl)
{
    return (unsigned)impl < DT_CP_IMPL_COUNT ? k_impl[impl].name : "?";
}

dt_status dt_cp_impl_parse(const char *s, dt_cp_impl *out)
{
    if (!s || !out)
        return dt_error(DT_ERR_NULL, "dt_cp_impl_parse: NULL argument");
    for (int i = 0; i < DT_CP_IMPL_COUNT; i++)
        if (!strcmp(s, k_impl[i].name)) {
            *out = (dt_cp_impl)i;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID_ARG, "context-parallel attention '%s': ring or ulysses", s);
}

dt_cp_params dt_cp_params_default(void)
{
    dt_cp_params p = {.group = NULL, .impl = DT_CP_RING, .balance = true};
    return p;
}

dt_status dt_cp_check(const dt_cp_params *p, int64_t T, int64_t n_head)
{
    if (!p || !p->group || dt_pg_size(p->group) <= 1)
        return DT_OK;
    const int P = dt_pg_size(p->group);
    if ((unsigned)p->impl >= DT_CP_IMPL_COUNT)
        return dt_error(DT_ERR_INVALID_ARG, "context parallelism: attention kind %d is neither ring nor ulysses",
                        (int)p->impl);
    const int64_t parts = p->balance ? 2 * (int64_t)P : P;
    if (T < 1 || T % parts)
        return dt_error(DT_ERR_INVALID_ARG, "context parallelism: sequence length %lld is not a multiple of %lld (cp "
                        "%d%s); choose a length divisible by %lld%s", (long long)T, (long long)parts, P,
                        p->balance ? " x 2 chunks a rank for the causal load balance" : "", (long long)parts,
                        p->balance ? " or turn the balance off" : "");
    if (k_impl[p->impl].by_heads && (n_head < 1 || n_head % P))
        return dt_error(DT_ERR_INVALID_ARG, "context parallelism: Ulysses attention needs the heads (%lld on this "
                        "rank) divisible by cp %d (each rank takes heads/cp of them); use ring attention or another "
                        "degree", (long long)n_head, P);
    return DT_OK;
}

dt_status dt_cp_layout_of(const dt_cp_params *p, int64_t T, dt_cp_layout *out)
{
    if (!p || !p->group)
        return dt_error(DT_ERR_NULL, "dt_cp_layout_of: NULL params or group");
    return dt_cp_layout_make(dt_pg_rank(p->group), dt_pg_size(p->group), T, p->balance, out);
}

dt_tensor *dt_cp_local_rows(dt_ctx *ctx, const dt_cp_layout *l, dt_tensor *x)
{
    char s[64];
    if (!x || !ctx || !l) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_cp_local_rows: NULL %s", !x ? "input" : !ctx ? "context" : "layout");
        return NULL;
    }
    if (x->ndim < 2 || x->shape[1] != l->T) {
        dt_error(DT_ERR_SHAPE, "context parallelism: %s has %lld positions in dim 1, the layout %lld",
                 dt_tensor_shape_str(x, s, sizeof s), (long long)(x->ndim > 1 ? x->shape[1] : 0), (long long)l->T);
        return NULL;
    }
    dt_tensor *c = dt_contiguous(ctx, dt_detach(ctx, x));
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[1] = l->local_len;
    dt_tensor *out = c ? dt_tensor_empty(ctx, x->dtype, x->ndim, shape) : NULL;
    if (!out)
        return NULL;
    const size_t row = dt_tensor_nbytes(c) / (size_t)(x->shape[0] * l->T); /* bytes of one position */
    const char *src = c->data;
    char *dst = out->data;
    for (int64_t b = 0; b < x->shape[0]; b++)
        for (int k = 0; k < l->nchunks; k++) /* a chunk's positions are consecutive */
            memcpy(dst + (size_t)(b * l->local_len + k * l->chunk) * row,
                   src + (size_t)(b * l->T + l->start[k]) * row, (size_t)l->chunk * row);
    return out;
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct {
    dt_pg *cp;
    dt_cp_layout l;
    dt_cp_impl impl;
    attn_mask m;
    int64_t B, H, D;
    const float *qkv, *y; /* (B, Tl, 3C), (B, Tl, C): arena temporaries */
    float *lse;           /* (B, H, Tl) */
} attn_saved;

static dt_status attn_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const attn_saved *a = ud;
    if (!gin[0]) /* still collective: every rank runs the same exchanges */
        return dt_error(DT_ERR_STATE, "context-parallel attention backward: the input needs no gradient");
    dt_status st = k_impl[a->impl].bwd(a->cp, &a->l, a->qkv, a->y, a->lse, gout->data, a->B, a->H, a->D, &a->m,
                                       gin[0]->data);
    return st < 0 ? dt_error_wrap(st, "context-parallel attention backward") : DT_OK;
}

/* dt_cp_attention on an f32 qkv under m (its Ht 0: the n_head heads are the layer's) */
static dt_tensor *cp_attention_f32(dt_ctx *ctx, const char *op, const dt_cp_params *p, dt_tensor *qkv, int n_head,
                                   const attn_mask *m)
{
    char s[64];
    if (!qkv) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "%s: input is NULL", op);
        return NULL;
    }
    if (!ctx || !p || !p->group) {
        dt_error(DT_ERR_NULL, "%s: NULL %s", op, !ctx ? "context" : "params or group");
        return NULL;
    }
    if (qkv->ndim != 3 || n_head < 1 || qkv->shape[2] % (3 * (int64_t)n_head)) {
        dt_error(DT_ERR_SHAPE, "%s: want qkv [B, T/cp, 3 n_head hd] with n_head %d, got %s", op, n_head,
                 dt_tensor_shape_str(qkv, s, sizeof s));
        return NULL;
    }
    const int P = dt_pg_size(p->group);
    attn_saved *a = dt_ctx_alloc(ctx, sizeof *a);
    if (!a)
        return NULL;
    memset(a, 0, sizeof *a);
    a->cp = p->group, a->impl = p->impl, a->m = *m;
    if (!a->m.Ht)
        a->m.h0 = 0, a->m.Ht = n_head;
    a->B = qkv->shape[0], a->H = n_head, a->D = qkv->shape[2] / (3 * (int64_t)n_head);
    const int64_t T = qkv->shape[1] * P;
    dt_status st = dt_cp_check(p, T, n_head);
    if (st < 0 || (st = dt_cp_layout_of(p, T, &a->l)) < 0)
        return NULL;
    dt_tensor *c = dt_contiguous(ctx, qkv);
    const int64_t Tl = qkv->shape[1], C = n_head * a->D;
    dt_tensor *y = c ? dt_tensor_empty(ctx, DT_F32, 3, (int64_t[]){a->B, Tl, C}) : NULL;
    a->lse = y ? dt_ctx_alloc(ctx, (size_t)(a->B * a->H * Tl) * sizeof(float)) : NULL;
    if (!a->lse)
        return NULL;
    a->qkv = c->data, a->y = y->data;
    st = k_impl[p->impl].fwd(p->group, &a->l, c->data, a->B, a->H, a->D, &a->m, y->data, a->lse);
    if (st < 0) {
        dt_error_wrap(st, "context-parallel attention (%s, cp %d)", dt_cp_impl_name(p->impl), P);
        return NULL;
    }
    return dt_ag_custom(ctx, 1, &qkv, y, attn_bwd, a);
}

/* A bf16 or f16 qkv (mixed precision) is widened for the attention and y narrowed back: the exchanges and the
 * kernels run in f32, the gradient comes back in qkv's dtype (dt_cast's backward) */
static dt_tensor *cp_attention(dt_ctx *ctx, const char *op, const dt_cp_params *p, dt_tensor *qkv, int n_head,
                               const attn_mask *m)
{
    if (!qkv || qkv->dtype == DT_F32)
        return cp_attention_f32(ctx, op, p, qkv, n_head, m);
    dt_tensor *y = cp_attention_f32(ctx, op, p, dt_cast(ctx, qkv, DT_F32), n_head, m);
    return y ? dt_cast(ctx, y, qkv->dtype) : NULL;
}

/* The description checked here, before any exchange and whether training or not (in eval p never reaches the
 * kernels: a bad one would otherwise pass silently); op names the caller in errors */
static dt_tensor *cp_attention_spec(dt_ctx *ctx, const char *op, const dt_cp_params *p, dt_tensor *qkv,
                                    const dt_attention_spec *s)
{
    if (!s) {
        dt_error(DT_ERR_NULL, "%s: the attention's description is NULL", op);
        return NULL;
    }
    const int Ht = s->heads_total ? s->heads_total : s->n_head;
    if (!(s->dropout_p >= 0.0f && s->dropout_p < 1.0f) || s->head0 < 0 || Ht - s->n_head < s->head0) {
        dt_error(DT_ERR_INVALID_ARG, "%s: dropout %g (want [0, 1)) or heads [%d, %d) of %d", op, (double)s->dropout_p,
                 s->head0, s->head0 + s->n_head, Ht);
        return NULL;
    }
    const attn_mask m = {.causal = s->causal, .window = s->window, .cap = s->softcap, .h0 = s->head0, .Ht = Ht,
                         .p = s->training ? s->dropout_p : 0.0f, .key = s->key};
    return cp_attention(ctx, op, p, qkv, s->n_head, &m);
}

dt_tensor *dt_cp_attention_ex(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, const dt_attention_spec *s)
{
    return cp_attention_spec(ctx, "dt_cp_attention_ex", p, qkv, s);
}

dt_tensor *dt_cp_attention(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head, bool causal)
{
    const dt_attention_spec s = {.n_head = n_head, .causal = causal};
    return cp_attention_spec(ctx, "dt_cp_attention", p, qkv, &s);
}

dt_tensor *dt_cp_attention_heads(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head, int head0,
                                 int heads_total, bool causal, float dropout_p, bool training, dt_rng_key key)
{
    const dt_attention_spec s = {.n_head = n_head, .head0 = head0, .heads_total = heads_total ? heads_total : -1,
                                 .causal = causal, .dropout_p = dropout_p, .training = training, .key = key};
    return cp_attention_spec(ctx, "dt_cp_attention_heads", p, qkv, &s);
}

dt_tensor *dt_cp_attention_window(dt_ctx *ctx, const dt_cp_params *p, dt_tensor *qkv, int n_head, int64_t window,
                                  float softcap)
{
    const dt_attention_spec s = {.n_head = n_head, .causal = true, .window = window, .softcap = softcap};
    return cp_attention_spec(ctx, "dt_cp_attention_window", p, qkv, &s);
}

/* ---- the loss over the whole sequence ------------------------------------------------- */

typedef struct {
    float scale; /* P n_r / N */
} loss_saved;

static dt_status loss_bwd(dt_ctx *ctx, const dt_tensor *gout, int nin, dt_tensor **gin, void *ud)
{
    (void)ctx, (void)nin;
    const loss_saved *s = ud;
    if (gin[0])
        ((float *)gin[0]->data)[0] = ((const float *)gout->data)[0] * s->scale;
    return DT_OK;
}

dt_tensor *dt_cp_loss(dt_ctx *ctx, dt_pg *cp, dt_tensor *loss, int64_t count)
{
    if (!loss) {
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NULL, "dt_cp_loss: loss is NULL");
        return NULL;
    }
    if (!ctx || !cp) {
        dt_error(DT_ERR_NULL, "dt_cp_loss: NULL %s", ctx ? "group" : "context");
        return NULL;
    }
    if (loss->dtype != DT_F32 || dt_tensor_numel(loss) != 1 || count < 0) {
        dt_error(DT_ERR_SHAPE, "dt_cp_loss: want a scalar f32 mean and a count >= 0 (got %s, %lld elements, count "
                 "%lld)", dt_dtype_name(loss->dtype), (long long)dt_tensor_numel(loss), (long long)count);
        return NULL;
    }
    double v[2] = {(double)dt_tensor_item(loss) * (double)count, (double)count};
    dt_status st = dt_pg_allreduce(cp, DT_IN_PLACE, v, 2, DT_F64, DT_REDUCE_SUM);
    if (st < 0) {
        dt_error_wrap(st, "context-parallel loss: all-reduce of the sum and the count");
        return NULL;
    }
    loss_saved *s = dt_ctx_alloc(ctx, sizeof *s);
    dt_tensor *out = s ? dt_tensor_full(ctx, DT_F32, loss->ndim, loss->shape, v[1] > 0 ? v[0] / v[1] : 0.0) : NULL;
    if (!out)
        return NULL;
    s->scale = v[1] > 0 ? (float)((double)dt_pg_size(cp) * (double)count / v[1]) : 0.0f;
    return dt_ag_custom(ctx, 1, &loss, out, loss_bwd, s);
}
