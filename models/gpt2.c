/* GPT-2 (Radford et al. 2019) as Hugging Face's
 * GPT2LMHeadModel names it:
 *
 *   x = drop(wte[idx] + wpe[arange(T)])                        (B, T, C)
 *   per block:  x = x + resid_drop(c_proj(attn(c_attn(ln_1(x)))))
 *               x = x + drop(c_proj(gelu_tanh(c_fc(ln_2(x)))))
 *   logits = ln_f(x) @ wte^T                                    (B, T, V)
 *
 * Conv1D layers keep their weights [in, out] (dt_addmm). The attention is
 * the blocked online-softmax kernel over the packed c_attn output (no
 * (T, T) matrix, no head transposes); c_fc's bias and the GELU are one fused
 * op (unless c_fc carries hooks, then it runs as its own module). Every
 * projection is one oneDNN matmul over all B*T rows.
 *
 * Init is GPT-2's: Conv1D weights and both embeddings N(0, 0.02), biases
 * 0, LayerNorm 1/0, every c_proj weight N(0, 0.02/sqrt(2 L)), drawn from
 * dtrain's Philox stream (dt_model_build). With PyTorch's stream
 * (dt_model_init_torch) the draws are transformers' GPT2LMHeadModel(config)
 * after torch.manual_seed (torch_order below), so the weights are its.
 *
 * Tensor parallel (dt_model_config.tp over t ranks, Megatron's layout;
 * tp.h): c_attn is column-parallel in three chunks (the rank's n_head/t
 * heads of q, k and v), attn.c_proj row-parallel, c_fc column-parallel,
 * mlp.c_proj row-parallel; wte is vocabulary-parallel (ceil(V/t) rows a
 * rank, padding zero) and the tied head gives the rank's logits for the
 * vocabulary-parallel cross-entropy. Layer norms, wpe and row-parallel
 * biases are whole on every rank. Names and the single-process values
 * (dt_model_init_tp) stay; only shapes are the rank's. Dropout: the
 * embedding, residual and MLP dropouts act on activations that are whole
 * and equal on every rank (after g), with the same key: the same masks on
 * every rank, the single-process ones; the attention dropout draws, for the
 * rank's heads, their part of the single-process mask (dt_attention_heads).
 * So a --tp run with dropout equals the single-process run within rounding.
 *
 * Context parallel (dt_model_config.cp over P ranks; cp.h): the forward
 * takes the whole [B, T] ids on every rank, the embedding keeps the
 * rank's rows (chunks r and 2P-1-r under the causal balance) and looks up
 * wpe at their global positions; each attention is dt_cp_attention (ring
 * or Ulysses) over the rank's heads (with tp: the heads split first, then
 * the sequence); layer norms, MLP and head run on the rows; the loss
 * (dt_model_desc_loss) takes the target's same rows and the whole
 * sequence's mean. Dropout draws one process's masks under either
 * attention: the embedding, residual and MLP dropouts on the rank's rows
 * their part of the whole sequence's (drop_forward), the attention's
 * through dt_cp_attention_heads, the cp ranks keyed as their replica
 * (dt_model_set_replica_ranks). Not with sequence parallelism. */
#include "zoo.h"

#include <dtrain/precision.h>
#include <dtrain/tp.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    dt_gpt2_config c;
} named_config;

static const named_config g_configs[] = {
    {"gpt2", {12, 12, 768, 1024, 50257, 0.0f}},
    {"gpt2-medium", {24, 16, 1024, 1024, 50257, 0.0f}},
    {"gpt2-large", {36, 20, 1280, 1024, 50257, 0.0f}},
    {"gpt2-xl", {48, 25, 1600, 1024, 50257, 0.0f}},
    {"gpt-mini", {6, 6, 384, 256, 50257, 0.0f}},
    {"gpt-micro", {2, 2, 64, 64, 512, 0.0f}},
};

dt_status dt_gpt2_config_by_name(const char *name, dt_gpt2_config *out)
{
    if (!name || !out)
        return dt_error(DT_ERR_NULL, "dt_gpt2_config_by_name: %s is NULL", name ? "out" : "name");
    for (size_t i = 0; i < sizeof g_configs / sizeof g_configs[0]; i++)
        if (!strcmp(name, g_configs[i].name)) {
            *out = g_configs[i].c;
            return DT_OK;
        }
    return dt_error(DT_ERR_NOT_FOUND, "unknown GPT-2 configuration '%s'", name);
}

bool dt__model_is_gpt2(const char *name)
{
    for (size_t i = 0; name && i < sizeof g_configs / sizeof g_configs[0]; i++)
        if (!strcmp(name, g_configs[i].name))
            return true;
    return false;
}

static dt_module *child(dt_module *m, const char *name) { return dt_module_find_child(m, name); }

/* Context parallelism (cp.h): the GPT2Model owns it (its user data), the
 * attention and MLP modules borrow it. With a group of more than one rank the
 * embedding keeps the rank's rows of the whole sequence at their global
 * positions (wpe follows the chunks), every attention is dt_cp_attention_heads,
 * and the rest runs on the rows as it is. */
typedef struct {
    dt_cp_params cp;
} gpt_rt;

static const dt_cp_params *cp_of(const void *ud)
{
    const gpt_rt *rt = ud;
    return rt && rt->cp.group && dt_pg_size(rt->cp.group) > 1 ? &rt->cp : NULL;
}

/* m's configuration (dt_module_config): the custom modules below keep their
 * settings there (the attention its heads in k, the GPT2Model its block
 * size in in, sequence parallelism as pad 1, fused_lm_loss as the root's
 * k 1). */
static dt_module_config cfg(const dt_module *m)
{
    dt_module_config c = {0};
    if (m)
        dt_module_get_config(m, &c);
    return c;
}

/* Set field `f` of custom module m's configuration to v (m may be NULL). */
#define SET_CFG(m, f, v)                                                                                               \
    do {                                                                                                               \
        dt_module_config c_ = cfg(m);                                                                                  \
        c_.f = (v);                                                                                                    \
        if (m)                                                                                                         \
            dt_module_set_config((m), &c_);                                                                            \
    } while (0)

/* ---- modules ------------------------------------------------------------------------ */

static dt_tensor *conv1d_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    return dt_addmm(ctx, x, dt_module_param(self, 0), dt_module_param(self, 1));
}

static dt_module *conv1d(int64_t in, int64_t out, float std)
{
    dt_nn_param_spec s[2] = {
        {.name = "weight", .ndim = 2, .shape = {in, out}, .init = DT_NN_INIT_NORMAL, .a = std},
        {.name = "bias", .ndim = 1, .shape = {out}, .init = DT_NN_INIT_ZEROS},
    };
    return dt_nn_custom("Conv1D", 2, s, conv1d_forward, NULL);
}

/* ---- PyTorch's draws (dt_model_set_torch_init) ----
 * transformers' GPT2LMHeadModel(config) under torch.manual_seed (checked
 * against transformers 5.24, scripts/make_init_goldens.py):
 *   1. the constructors: wte and wpe N(0, 1) (nn.Embedding), then per block
 *      each Conv1D weight N(0, 0.02) (c_attn, attn.c_proj, c_fc,
 *      mlp.c_proj); LayerNorm and the biases draw nothing;
 *   2. GPT2Model's post_init, post-order: wte, wpe N(0, 0.02); per block
 *      c_attn N(0, 0.02); attn.c_proj N(0, 0.02), then GPT2Attention's own
 *      redraw N(0, 0.02/sqrt(2 L)); the MLP alike;
 *   3. lm_head's constructor and init draw last and, tied to wte, change
 *      nothing: left out. */
static dt_status torch_order(dt_model *m, int64_t L)
{
    const size_t n = (size_t)(4 + 10 * L);
    dt_torch_draw *d = malloc(n * sizeof *d);
    if (!d)
        return dt_error(DT_ERR_NO_MEMORY, "gpt2: out of memory");
    const float std = 0.02f, pstd = (float)(0.02 / sqrt(2.0 * (double)L));
    static const char *const proj[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    size_t k = 0;
    dt_status st = DT_OK;
    char name[96];
#define DRAW(nm, i_, a_, keep_)                                                                                        \
    do {                                                                                                               \
        int64_t e_ = dt_model_find_entry(m, nm);                                                                       \
        if (e_ < 0) {                                                                                                  \
            st = dt_error(DT_ERR_INTERNAL, "gpt2: no entry '%s'", nm);                                                 \
            goto done;                                                                                                 \
        }                                                                                                              \
        d[k++] = (dt_torch_draw){.entry = (size_t)e_, .init = (i_), .a = (a_), .keep = (keep_)};                      \
    } while (0)
    DRAW("transformer.wte.weight", DT_NN_INIT_NORMAL, 1.0f, false);
    DRAW("transformer.wpe.weight", DT_NN_INIT_NORMAL, 1.0f, false);
    for (int64_t i = 0; i < L; i++)
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "transformer.h.%lld.%s.weight", (long long)i, proj[j]);
            DRAW(name, DT_NN_INIT_NORMAL, std, false);
        }
    DRAW("transformer.wte.weight", DT_NN_INIT_NORMAL, std, true);
    DRAW("transformer.wpe.weight", DT_NN_INIT_NORMAL, std, true);
    for (int64_t i = 0; i < L; i++)
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "transformer.h.%lld.%s.weight", (long long)i, proj[j]);
            DRAW(name, DT_NN_INIT_NORMAL, std, j % 2 == 0);
            if (j % 2)
                DRAW(name, DT_NN_INIT_NORMAL, pstd, true);
        }
#undef DRAW
    st = dt_model_set_torch_init(m, d, k);
done:
    free(d);
    return st;
}

/* ---- sequence parallelism (Korthikanti et al.; tp.h) ----
 * Modules built with sequence parallelism carry pad == 1 (custom modules
 * use no padding). Between the blocks the residual stream holds the rank's
 * chunk of the tokens, [B, T/t, C]; the layer norms and the residual adds
 * run on the chunk. Entering attention and the MLP, dt_tp_sp_gather
 * (all-gather of the tokens, backward reduce-scatter) replaces f, with
 * c_attn's and c_fc's products (dt_tp_sp_gather_products: the gathered
 * tokens are gathered again for the weights' gradients, not kept); leaving,
 * dt_tp_sp_reduce_scatter_partial (backward all-gather; the partial
 * products given back) replaces g. The layer norms'
 * parameters and the row-parallel biases, whole on every rank, see only the
 * rank's tokens: they enter through f (dt_tp_copy_to_region), whose
 * backward sums their gradients over the group, as Megatron's all-reduce of
 * the sequence-parallel parameters' gradients does. The embedding output is
 * split after the embedding (dt_tp_sp_scatter), and the final layer norm's
 * output gathered for the vocabulary-parallel head, which then takes no f.
 * The residual and MLP dropouts act on the rank's chunk with its part of
 * the whole sequence's masks (drop_forward: dt_dropout_at); the embedding's
 * acts before the split and the attention's on the rank's heads of the
 * gathered sequence, as without. */

/* The group when m runs sequence-parallel: the group of tensor-parallel
 * module `of`. */
static dt_pg *sp_group(const dt_module *m, const dt_module *of)
{
    return cfg(m).pad == 1 ? dt_tp_module_group(of) : NULL;
}

/* Layer norm module ln on x; under sequence parallelism its parameters
 * through f. */
static dt_tensor *ln_forward(dt_ctx *ctx, dt_module *ln, dt_tensor *x, dt_pg *sp)
{
    if (!sp)
        return dt_module_forward(ctx, ln, x);
    return dt_layer_norm(ctx, x, dt_tp_copy_to_region(ctx, sp, dt_module_param(ln, 0)),
                         dt_tp_copy_to_region(ctx, sp, dt_module_param(ln, 1)), cfg(ln).eps);
}

/* Row-parallel module m on the rank's columns x under sequence
 * parallelism: the partial products reduce-scattered over the tokens,
 * then the bias (through f). */
static dt_tensor *row_sp(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_pg *sp)
{
    dt_tensor *y = dt_tp_sp_reduce_scatter_partial(ctx, sp, dt_addmm(ctx, x, dt_module_param(m, 0), NULL), 1);
    return dt_tp_sp_lora(ctx, m, x, dt_add(ctx, y, dt_tp_copy_to_region(ctx, sp, dt_module_param(m, 1))), sp);
}

/* Column-parallel module m's product on the rank's rows x under sequence parallelism, without m's bias when
 * bias is false: with LoRA adapters on m, on the gathered rows (which the adapters keep) and the adapters added
 * (dt_tp_sp_lora); without, dt_tp_sp_gather_products (the gathered rows not kept) */
static dt_tensor *column_sp(dt_ctx *ctx, dt_module *m, dt_tensor *x, dt_pg *sp, bool bias)
{
    dt_tensor *w = dt_module_param(m, 0), *b = bias ? dt_module_param(m, 1) : NULL, *y = NULL;
    if (!dt_module_find_child(m, "lora_A")) {
        dt_tp_sp_gather_products(ctx, sp, x, 1, 1, &w, &b, true, &y);
        return y;
    }
    dt_tensor *g = dt_tp_sp_gather(ctx, sp, x, 1);
    return dt_tp_sp_lora(ctx, m, g, dt_addmm(ctx, g, w, b), sp);
}

/* A dropout module on x [B, R, ...]. Under sequence parallelism x holds the rank's chunk of its rows (rows
 * [r R, (r+1) R) of tp rank r), under context parallelism (cp) its rows are the rank's rows of the cp layout
 * (dt_cp_position), under both the tp rank's chunk of the cp rank's rows: each draws its part of the whole
 * sequence's mask (dt_dropout_at), as one process does */
static dt_tensor *drop_forward(dt_ctx *ctx, dt_module *drop, dt_tensor *x, dt_pg *sp, const dt_cp_params *cp)
{
    if ((!sp && !cp) || !x || !dt_module_is_training(drop) || cfg(drop).p == 0.0f)
        return dt_module_forward(ctx, drop, x);
    const int64_t R = x->shape[1], rows = R * (sp ? dt_pg_size(sp) : 1); /* the rank's rows before the tp split */
    const int64_t T = rows * (cp ? dt_pg_size(cp->group) : 1), r0 = sp ? dt_pg_rank(sp) * R : 0;
    dt_cp_layout l;
    if (cp && dt_cp_layout_of(cp, T, &l) < 0)
        return NULL;
    int64_t *pos = dt_ctx_alloc(ctx, (size_t)R * sizeof *pos);
    if (!pos)
        return NULL;
    for (int64_t r = 0; r < R; r++)
        pos[r] = cp ? dt_cp_position(&l, r0 + r) : r0 + r;
    return dt_dropout_at(ctx, x, cfg(drop).p, true, dt_module_dropout_key(drop), pos, T);
}

/* self's config k = n_head (this rank's) */
static dt_tensor *attn_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    const dt_cp_params *cp = cp_of(ud);
    dt_module *drop = child(self, "attn_dropout");
    dt_pg *sp = sp_group(self, child(self, "c_attn"));
    dt_module *ca = child(self, "c_attn");
    dt_tensor *qkv = sp ? column_sp(ctx, ca, x, sp, true) : dt_module_forward(ctx, ca, x);
    if (!qkv)
        return NULL;
    dt_rng_key key = dt_module_dropout_key(drop);
    const int heads = cfg(self).k;
    /* tensor parallel: the rank's heads, with their part of the full layer's
     * dropout mask (the key is the same on every rank: the same module) */
    dt_pg *tp = dt_tp_module_group(child(self, "c_attn"));
    const int t = tp ? dt_pg_size(tp) : 1, h0 = tp ? dt_pg_rank(tp) * heads : 0;
    dt_tensor *y = cp ? dt_cp_attention_heads(ctx, cp, qkv, heads, h0, heads * t, true, cfg(drop).p,
                                              dt_module_is_training(drop), key)
                      : dt_attention_heads(ctx, qkv, heads, h0, heads * t, true, cfg(drop).p,
                                           dt_module_is_training(drop), key);
    y = sp ? row_sp(ctx, child(self, "c_proj"), y, sp) : dt_module_forward(ctx, child(self, "c_proj"), y);
    return drop_forward(ctx, child(self, "resid_dropout"), y, sp, cp);
}

static dt_tensor *mlp_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    dt_module *fc = child(self, "c_fc");
    dt_pg *sp = sp_group(self, fc);
    dt_tensor *h;
    if (sp) {
        if (dt_module_find_child(fc, "lora_A")) /* its output with the adapters', as the module's */
            h = dt_gelu_tanh(ctx, column_sp(ctx, fc, x, sp, true));
        else /* its bias fused into the GELU */
            h = dt_bias_gelu_tanh(ctx, column_sp(ctx, fc, x, sp, false), dt_module_param(fc, 1));
        h = row_sp(ctx, child(self, "c_proj"), h, sp);
        return drop_forward(ctx, child(self, "dropout"), h, sp, cp_of(ud));
    }
    if (dt_module_tree_plain(fc)) { /* nothing observes c_fc alone: fuse its bias into the GELU */
        dt_pg *tp = dt_tp_module_group(fc); /* column-parallel: its input goes through f */
        if (tp)
            x = dt_tp_copy_to_region(ctx, tp, x);
        h = dt_bias_gelu_tanh(ctx, dt_addmm(ctx, x, dt_module_param(fc, 0), NULL), dt_module_param(fc, 1));
    } else
        h = dt_gelu_tanh(ctx, dt_module_forward(ctx, fc, x));
    h = dt_module_forward(ctx, child(self, "c_proj"), h);
    return drop_forward(ctx, child(self, "dropout"), h, NULL, cp_of(ud));
}

/* ln_1 / ln_2 and the half block's sublayer (attn / mlp): under autocast
 * the sublayer's first op is a matmul (c_attn, c_fc) that rounds its f32
 * input to the autocast dtype, so a plain layer norm of an f32 stream writes
 * that dtype itself (dt_layer_norm_to: the same bits, one pass and no cast
 * node); with hooks on either module, or sequence parallelism, they see
 * the f32 result as before. */
dt_tensor *dt__gpt2_block_half(dt_ctx *ctx, dt_module *block, dt_tensor *x, int half)
{
    dt_pg *sp = sp_group(block, child(child(block, "attn"), "c_attn"));
    dt_module *ln = child(block, half ? "ln_2" : "ln_1"), *f = child(block, half ? "mlp" : "attn");
    const dt_dtype ac = dt_autocast_dtype(ctx);
    dt_tensor *h = !sp && x && x->dtype == DT_F32 && ac != DT_F32 && dt_module_tree_plain(ln) &&
                           dt_module_tree_plain(f)
                       ? dt_layer_norm_to(ctx, x, dt_module_param(ln, 0), dt_module_param(ln, 1), cfg(ln).eps, ac)
                       : ln_forward(ctx, ln, x, sp);
    return dt_add(ctx, x, dt_module_forward(ctx, f, h));
}

static dt_tensor *block_forward(dt_ctx *ctx, dt_module *self, dt_tensor *x, void *ud)
{
    (void)ud;
    return dt__gpt2_block_half(ctx, self, dt__gpt2_block_half(ctx, self, x, 0), 1);
}

/* self (the GPT2Model, its config in = block_size): drop(wte[idx] + wpe[0..T)). */
dt_tensor *dt__gpt2_embed(dt_ctx *ctx, dt_module *self, dt_tensor *idx)
{
    char s[64];
    if (!idx)
        return NULL;
    if ((idx->dtype != DT_I64 && idx->dtype != DT_I32) || idx->ndim != 2) {
        dt_error(DT_ERR_SHAPE, "input %s %s: want token ids [B, T] of i64 or i32", dt_tensor_shape_str(idx, s, sizeof s),
                 dt_dtype_name(idx->dtype));
        return NULL;
    }
    int64_t T = idx->shape[1], block_size = cfg(self).in;
    if (T < 1 || T > block_size) {
        dt_error(DT_ERR_SHAPE, "sequence length %lld is outside [1, %lld] (the block size)", (long long)T,
                 (long long)block_size);
        return NULL;
    }
    const dt_cp_params *cp = cp_of(dt_module_user_data(self));
    dt_cp_layout l;
    if (cp) { /* the rank's rows of the whole sequence, at their global positions */
        if (dt_cp_layout_of(cp, T, &l) < 0)
            return NULL;
        idx = dt_cp_local_rows(ctx, &l, idx);
        T = l.local_len;
    }
    int64_t *pos = dt_ctx_alloc(ctx, (size_t)T * sizeof *pos);
    if (!pos || !idx)
        return NULL;
    for (int64_t t = 0; t < T; t++)
        pos[t] = cp ? dt_cp_position(&l, t) : t;
    dt_tensor *pt = dt_tensor_view_of(ctx, pos, DT_I64, 1, &T);
    dt_tensor *x = dt_add(ctx, dt_module_forward(ctx, child(self, "wte"), idx),
                          dt_module_forward(ctx, child(self, "wpe"), pt));
    return drop_forward(ctx, child(self, "drop"), x, NULL, cp);
}

static dt_tensor *transformer_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    (void)ud;
    dt_pg *sp = sp_group(self, child(self, "wte"));
    dt_tensor *x = dt__gpt2_embed(ctx, self, idx);
    if (sp)
        x = dt_tp_sp_scatter(ctx, sp, x, 1);
    x = dt_module_forward(ctx, child(self, "h"), x);
    x = ln_forward(ctx, child(self, "ln_f"), x, sp);
    return sp ? dt_tp_sp_gather(ctx, sp, x, 1) : x;
}

/* self's config k = 1: built with fused_lm_loss. Then a training-mode forward
 * whose head carries no hooks, and whose root carries none either (a ZeRO-3
 * unit gathers the tied weight around the root's forward and releases it
 * after: the loss, outside, must not read it), returns the hidden states
 * and marks them as such in the root (its user data,
 * dt_module_set_user_data: the GPT2LMHeadModel's forward takes none), which dt_model_desc_loss
 * checks before it applies the head fused with the cross-entropy; every
 * other forward clears the mark and returns the logits. */
static dt_tensor *lm_forward(dt_ctx *ctx, dt_module *self, dt_tensor *idx, void *ud)
{
    (void)ud;
    dt_module *head = child(self, "lm_head");
    dt_module_set_user_data(self, NULL);
    dt_tensor *h = dt_module_forward(ctx, child(self, "transformer"), idx);
    if (cfg(self).k == 1 && dt_module_is_training(self) && h && dt_module_is_plain(self) &&
        dt_module_tree_plain(head)) {
        dt_module_set_user_data(self, h);
        return h;
    }
    return dt_module_forward(ctx, head, h);
}

bool dt__gpt2_block_hooked(const dt_module *block) { return !dt_module_is_plain(block); }

/* ---- pipeline units (nn.h, dt_model_set_pipe_units) ---------------------------------- */

/* The embeddings; under sequence parallelism split into the tensor-parallel
 * rank's rows after them (the pipeline then moves those), as
 * transformer_forward does. */
static dt_tensor *unit_embed(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    (void)m;
    dt_pg *sp = sp_group(u->module, child(u->module, "wte"));
    x = dt__gpt2_embed(ctx, u->module, x);
    return sp && x ? dt_tp_sp_scatter(ctx, sp, x, 1) : x;
}

/* The final layer norm (the unit's module, ln_f); under sequence
 * parallelism (the transformer's) on the rank's rows, its parameters
 * through f, then the rows gathered for the head. */
static dt_tensor *unit_ln_f(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
{
    dt_module *tr = dt_model_find_module(m, "transformer");
    dt_pg *sp = tr ? sp_group(tr, child(tr, "wte")) : NULL;
    x = ln_forward(ctx, u->module, x, sp);
    return sp && x ? dt_tp_sp_gather(ctx, sp, x, 1) : x;
}

/* Half a block (the unit's name ends in "attn" or "mlp"): refused if the
 * block was given hooks after the cut, which only its whole forward runs. */
static dt_tensor *unit_half(dt_ctx *ctx, dt_model *m, const dt_pipe_unit *u, dt_tensor *x)
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

/* The GPT's units: [embeddings, h.0 attention half, h.0 MLP half, ...,
 * ln_f, the tied head]; a block that carries hooks of its own is one unit.
 * Costs per token: matmul multiply-adds (a weight's elements), attention's
 * T-dependent part (causal: T C over QK^T and AV, T the block size, C this
 * rank's width), the head's GEMM with the tied wte plus a few per logit
 * for the cross-entropy, and the element-wise work (layer norms, residual
 * adds, the embedding gather) as a few per element. By parameter count the
 * embedding table, which does no GEMM, would weigh as much as the tied
 * head, which does a V x C GEMM per token and the cross-entropy. */
static dt_status gpt2_units(dt_model *m, dt_pipe_unit **units, int *n)
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
    const double C = dt__zoo_numel(lnf, 0), T = (double)cfg(tr).in, V = dt__zoo_numel(head, 0) / (C > 0 ? C : 1);
    dt__zoo_unit(&u[k], "transformer.wte+wpe", tr, unit_embed, "transformer.wte", "transformer.wpe");
    u[k++].cost = 2 * C;
    for (int i = 0; i < L; i++) {
        dt_module *b = dt_module_child(h, i);
        const char *path = dt_module_path(b);
        char nm[64], p0[64], p1[64];
        double attn = dt__zoo_weights(b, "attn", "c_attn", "c_proj");
        double mlp = dt__zoo_weights(b, "mlp", "c_fc", "c_proj");
        attn += T * attn / (4 * C) + 8 * C; /* attn / 4C: this rank's heads x head size */
        mlp += 8 * C + mlp / (2 * C);      /* mlp / 2C: its hidden width (the GELU) */
        if (dt__gpt2_block_hooked(b)) {
            dt__zoo_unit(&u[k], path, b, NULL, path, NULL);
            u[k++].cost = attn + mlp;
            continue;
        }
        for (int half = 0; half < 2; half++) {
            snprintf(nm, sizeof nm, "%s.%s", path, half ? "ln_2+mlp" : "ln_1+attn");
            snprintf(p0, sizeof p0, "%s.%s", path, half ? "ln_2" : "ln_1");
            snprintf(p1, sizeof p1, "%s.%s", path, half ? "mlp" : "attn");
            dt__zoo_unit(&u[k], nm, b, unit_half, p0, p1);
            u[k++].cost = half ? mlp : attn;
        }
    }
    dt__zoo_unit(&u[k], "transformer.ln_f", lnf, unit_ln_f, "transformer.ln_f", NULL);
    u[k++].cost = 4 * C;
    dt__zoo_unit(&u[k], "lm_head", head, NULL, "lm_head", NULL);
    u[k++].cost = dt__zoo_numel(head, 0) + 4 * V;
    *units = u;
    *n = k;
    return DT_OK;
}

bool dt__gpt2_is_hidden(const dt_module *head, const dt_tensor *out)
{
    const dt_tensor *w = dt_module_param(head, 0);
    return head && out && dt_module_parent(head) && dt_module_user_data(dt_module_parent(head)) == out &&
           out->ndim == 3 && dt_module_num_params(head) == 1 && w && out->shape[2] == w->shape[1];
}

static dt_module *embedding(int64_t n, int64_t dim)
{
    dt_module *e = dt_nn_embedding(n, dim);
    if (e)
        dt_module_set_param_init(e, 0, DT_NN_INIT_NORMAL, 0.02f);
    return e;
}

/* Weight std of parameter 0 of m (NULL: nothing), keeping its kind of init. */
static void set_std(dt_module *m, float std)
{
    dt_nn_param_spec s;
    if (m && dt_module_param_spec(m, 0, &s) == DT_OK)
        dt_module_set_param_init(m, 0, s.init, std);
}

/* Adds child under name to parent; on any failure (earlier too) frees what it
 * was given and returns false. */
static bool add(dt_module *parent, const char *name, dt_module *c, bool ok)
{
    if (!ok || !parent || !c) {
        dt_module_free(c);
        return false;
    }
    return dt_nn_add(parent, name, c) == DT_OK;
}

/* A Conv1D, or under tensor parallelism its column- (chunks > 0) or
 * row-parallel (chunks 0) form; weight init N(0, std). */
static dt_module *proj(dt_pg *tp, int64_t in, int64_t out, float std, int chunks)
{
    dt_module *m = !tp ? conv1d(in, out, std)
                   : chunks ? dt_tp_column_linear(tp, in, out, true, false, chunks)
                            : dt_tp_row_linear(tp, in, out, true, true);
    if (tp)
        set_std(m, std);
    return m;
}

static dt_module *block(const dt_gpt2_config *g, dt_pg *tp, bool sp, gpt_rt *rt)
{
    int64_t C = g->n_embd;
    float std = 0.02f, pstd = 0.02f / sqrtf(2.0f * (float)g->n_layer);
    dt_module *b = dt_nn_custom("GPT2Block", 0, NULL, block_forward, NULL);
    dt_module *attn = dt_nn_custom("GPT2Attention", 0, NULL, attn_forward, rt);
    dt_module *mlp = dt_nn_custom("GPT2MLP", 0, NULL, mlp_forward, rt);
    SET_CFG(attn, k, (int)(g->n_head / (tp ? dt_pg_size(tp) : 1))); /* this rank's heads */
    if (sp && b && attn && mlp) {
        SET_CFG(b, pad, 1);
        SET_CFG(attn, pad, 1);
        SET_CFG(mlp, pad, 1);
    }
    bool ok = b && attn && mlp;
    ok = add(attn, "c_attn", proj(tp, C, 3 * C, std, 3), ok);
    ok = add(attn, "c_proj", proj(tp, C, C, pstd, 0), ok);
    ok = add(attn, "attn_dropout", dt_nn_dropout(g->dropout), ok);
    ok = add(attn, "resid_dropout", dt_nn_dropout(g->dropout), ok);
    ok = add(mlp, "c_fc", proj(tp, C, 4 * C, std, 1), ok);
    ok = add(mlp, "c_proj", proj(tp, 4 * C, C, pstd, 0), ok);
    ok = add(mlp, "dropout", dt_nn_dropout(g->dropout), ok);
    ok = add(b, "ln_1", dt_nn_layernorm(C, 1e-5f), ok);
    ok = add(b, "attn", attn, ok);
    attn = NULL;
    ok = add(b, "ln_2", dt_nn_layernorm(C, 1e-5f), ok);
    ok = add(b, "mlp", mlp, ok);
    mlp = NULL;
    if (!ok) {
        dt_module_free(b);
        return NULL;
    }
    return b;
}

static dt_status check_config(const dt_gpt2_config *g, dt_pg *tp)
{
    if (tp && g->n_head >= 1 && g->n_head % dt_pg_size(tp))
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: n_head %lld is not divisible by the tensor-parallel size %d (each "
                        "rank computes whole heads)", (long long)g->n_head, dt_pg_size(tp));
    return dt__gpt2_config_check(g);
}

dt_status dt__model_gpt2(const char *name, uint64_t seed, const dt_model_config *c, dt_model **out, dt_model_desc *d)
{
    dt_gpt2_config g;
    dt_status st = dt_gpt2_config_by_name(name, &g);
    if (st < 0)
        return st;
    if (c->n_layer)
        g.n_layer = c->n_layer;
    if (c->n_head)
        g.n_head = c->n_head;
    if (c->n_embd)
        g.n_embd = c->n_embd;
    if (c->block_size)
        g.block_size = c->block_size;
    if (c->vocab_size)
        g.vocab_size = c->vocab_size;
    g.dropout = c->dropout;
    dt_pg *tp = c->tp && dt_pg_size(c->tp) > 1 ? c->tp : NULL;
    const bool sp = c->sequence_parallel && tp; /* without tensor parallelism (or a group of one): plain */
    const dt_cp_params *cp = cp_of(&c->cp);
    if ((st = check_config(&g, tp)) < 0)
        return st;
    if (cp && c->build.lora && c->build.lora->dropout > 0) /* its masks follow a rank's rows, not the positions */
        return dt_error(DT_ERR_UNSUPPORTED, "gpt2: LoRA dropout %g with context parallelism is not supported (each "
                        "rank would draw the masks of the other ranks' rows); set it to 0",
                        (double)c->build.lora->dropout);
    int64_t T = c->seq ? c->seq : g.block_size;
    if (T < 1 || T > g.block_size)
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: sequence length %lld is outside [1, %lld] (the block size)",
                        (long long)T, (long long)g.block_size);
    if (cp && (st = dt_cp_check(cp, T, g.n_head / (tp ? dt_pg_size(tp) : 1))) < 0)
        return dt_error_wrap(st, "gpt2");
    const int64_t Tr = cp ? T / dt_pg_size(cp->group) : T; /* a cp rank's rows (dt_cp_check: whole) */
    if (sp && Tr % dt_pg_size(tp))
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: sequence length %lld%s is not divisible by the tensor-parallel "
                        "size %d (sequence parallelism splits the tokens)", (long long)Tr,
                        cp ? " (a context-parallel rank's)" : "", dt_pg_size(tp));
    gpt_rt *rt = calloc(1, sizeof *rt);
    if (!rt)
        return dt_error(DT_ERR_NO_MEMORY, "gpt2: out of memory");
    rt->cp = c->cp;
    int64_t C = g.n_embd, V = g.vocab_size, L = g.n_layer;
    dt_module *root = dt_nn_custom("GPT2LMHeadModel", 0, NULL, lm_forward, NULL);
    dt_module *tr = dt_nn_custom_owned("GPT2Model", 0, NULL, transformer_forward, rt, free); /* frees rt on failure */
    dt_module *h = dt_nn_seq(0, NULL);
    dt_module *wte = tp ? dt_tp_vocab_embedding(tp, V, C) : embedding(V, C);
    dt_module *head = tp ? dt_tp_vocab_head(tp, V, C, sp) : dt_nn_linear(C, V, false);
    if (tp)
        set_std(wte, 0.02f);
    SET_CFG(tr, in, g.block_size);
    if (sp && tr)
        SET_CFG(tr, pad, 1);
    bool ok = root && tr && h;
    for (int64_t i = 0; i < L && ok; i++)
        ok = add(h, NULL, block(&g, tp, sp, rt), ok);
    ok = ok && wte && head && dt_module_tie(head, "weight", wte, "weight") == DT_OK;
    ok = add(tr, "wte", wte, ok);
    ok = add(tr, "wpe", embedding(g.block_size, C), ok);
    ok = add(tr, "drop", dt_nn_dropout(g.dropout), ok);
    ok = add(tr, "h", h, ok);
    h = NULL;
    ok = add(tr, "ln_f", dt_nn_layernorm(C, 1e-5f), ok);
    ok = add(root, "transformer", tr, ok);
    tr = NULL;
    ok = add(root, "lm_head", head, ok);
    if (!ok) {
        dt_module_free(root);
        if (dt_last_status() == DT_OK)
            dt_error(DT_ERR_NO_MEMORY, "gpt2: out of memory building the modules");
        return dt_last_status();
    }
    if (c->fused_lm_loss && !tp)
        SET_CFG(root, k, 1); /* lm_forward: hidden states in training mode, the loss applies the head */
    if ((st = dt_model_build(root, seed, &c->build, out)) < 0)
        return st;
    if (!tp && (st = torch_order(*out, L)) < 0) { /* a tensor-parallel rank's draws are the whole model's */
        dt_model_free(*out);
        *out = NULL;
        return st;
    }
    dt_model_set_pipe_units(*out, gpt2_units); /* how a pipeline cuts it */
    d->lm_head = c->fused_lm_loss && !tp ? head : NULL;
    d->loss = DT_LOSS_CROSS_ENTROPY;
    snprintf(d->ckpt_unit, sizeof d->ckpt_unit, "GPT2Block"); /* activation-checkpointing units */
    d->input_ndim = 1;
    d->input_shape[0] = T;
    d->input_dtype = DT_I64;
    d->input_classes = V;
    d->has_target = true;
    d->target_ndim = 1;
    d->target_shape[0] = T;
    d->target_dtype = DT_I64;
    d->num_classes = V;
    /* Matmul FLOPs of one sample (2 per multiply-add): the projections
     * (12 C^2 per token per block) and the head (V C per token), plus
     * attention's q k^T and p v counted in full (4 T C per token per
     * block, nanoGPT's and PaLM's MFU convention; the causal kernel does
     * about half of it). Backward: twice the forward (input and weight
     * gradients of every product). */
    double tok = (double)T;
    d->fwd_flops_per_sample = 2.0 * tok * ((double)L * 12.0 * (double)C * (double)C + (double)V * (double)C) +
                              4.0 * (double)L * tok * tok * (double)C;
    d->train_flops_per_sample = 3.0 * d->fwd_flops_per_sample;
    return DT_OK;
}
