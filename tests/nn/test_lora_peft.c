/* LoRA parity with Hugging Face PEFT on golden files made by
 * scripts/make_lora_goldens.py (tests/data/lora) over the Llama of
 * tests/data/hf/llama (GQA: 4 heads over 2 kv heads, head_dim 12):
 *  - PEFT's initial adapters (init/) load into dtrain (dt_lora_peft_config_read,
 *    dt_trainer_load_peft), and 10 AdamW steps (f32) give PEFT's losses within
 *    1e-5 relative, and adapters close to PEFT's after/;
 *  - dtrain's saved adapters (dt_lora_save_peft) have PEFT's layout: the
 *    same keys, shapes, dtypes and config values as PEFT's own files;
 *  - PEFT's trained adapters (after/) load exactly, and the merged export
 *    (dt_hf_save with lora_scaling) equals PEFT's merge_and_unload within
 *    1e-6; without the scaling a LoRA source is refused;
 *  - PEFT's "all-linear" adapters on Gemma 3's image-text model
 *    (tests/data/lora/gemma3_mm, keys under model.language_model. and
 *    model.vision_tower.) load onto tests/data/hf/gemma3_mm's language
 *    model, the vision tower's left out: the PEFT model's logits within
 *    1e-5 of the largest and its loss within 1e-5 relative; under
 *    transformers 4's names too; a vision-only file and a key under both
 *    names refused by name;
 *  - target_modules as PEFT's regular expression (tests/data/lora/
 *    gemma3_mm_regex): the file's layers adapted, PEFT's logits within 1e-5
 *    of the largest, patterns that do not match an adapter whole, or that
 *    the regex dialect lacks, refused by name;
 *  - rank_pattern and alpha_pattern (pat_), exclude_modules (excl_): PEFT's
 *    losses, adapters and merge with each layer's own rank and scaling, or
 *    without the excluded layer. */
#include "ckpt/ckpt_view.h"
#include "model_util.h"
#include "test.h"
#include "peft_files.h"
#include "tmp_util.h"

#include "dtrain/autograd.h"
#include "dtrain/ckpt.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <sys/stat.h>
#include <stdlib.h>

#define HF DT_SOURCE_DIR "/tests/data/hf/llama"
#define HF_MM DT_SOURCE_DIR "/tests/data/hf/gemma3_mm"
#define HF_GPT2 DT_SOURCE_DIR "/tests/data/hf/gpt2"
#define LORA DT_SOURCE_DIR "/tests/data/lora/"

typedef struct run {
    dt_lora_peft_config pc;
    dt_model *m;
    dt_model_desc d;
    dt_trainer *tr;
} run;

/* Model directory base with the adapters of PEFT's directory dir (its settings; its weights unless !weights). */
static int open_run_with(run *r, const char *base, const char *dir, bool weights)
{
    memset(r, 0, sizeof *r);
    dt_model_config mc = dt_model_config_default();
    mc.seq = 16;
    dt_strategy *s = NULL;
    dt_trainer_params tp = dt_trainer_params_default();
    if (dt_lora_peft_config_read(dir, &r->pc) < 0)
        return fprintf(stderr, "config: %s\n", dt_last_error()), 1;
    mc.build.lora = &r->pc.params;
    char hf[600];
    snprintf(hf, sizeof hf, "hf:%s", base);
    if (dt_model_create(hf, 1, &mc, &r->m, &r->d) < 0 || dt_strategy_none_init(&s) < 0 ||
        dt_trainer_init(r->m, s, &tp, &r->tr) < 0 || dt_trainer_load_weights(r->tr, base) < 0 ||
        (weights && dt_trainer_load_peft(r->tr, dir) < 0))
        return fprintf(stderr, "%s: %s\n", dir, dt_last_error()), 1;
    return 0;
}

static int open_run_on(run *r, const char *base, const char *dir) { return open_run_with(r, base, dir, true); }

/* The base Llama with the adapters of PEFT's directory dir. */
static int open_run(run *r, const char *dir) { return open_run_on(r, HF, dir); }

static void close_run(run *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
    dt_lora_peft_config_free(&r->pc);
}

/* The next-token loss of ids [2, 17] (its first 16 against the last 16);
 * the logits [2, 16, V] in *logits unless NULL. */
static dt_tensor *loss_logits(dt_ctx *ctx, run *r, const int64_t *ids, bool grad, dt_tensor **logits)
{
    int64_t *x = dt_ctx_alloc(ctx, 32 * sizeof *x), *y = dt_ctx_alloc(ctx, 32 * sizeof *y);
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 16; t++)
            x[b * 16 + t] = ids[b * 17 + t], y[b * 16 + t] = ids[b * 17 + t + 1];
    dt_ag_set_enabled(ctx, grad);
    dt_tensor *xt = dt_tensor_view_of(ctx, x, DT_I64, 2, (int64_t[]){2, 16});
    dt_tensor *yt = dt_tensor_view_of(ctx, y, DT_I64, 2, (int64_t[]){2, 16});
    dt_tensor *lg = dt_model_forward(ctx, r->m, xt);
    if (logits)
        *logits = lg;
    return dt_model_desc_loss(ctx, &r->d, lg, yt);
}

static dt_tensor *loss_of(dt_ctx *ctx, run *r, const int64_t *ids, bool grad)
{
    return loss_logits(ctx, r, ids, grad, NULL);
}

/* max |model tensor - file tensor| / max |file tensor| over every adapter of
 * PEFT's file (keys "base_model.model." + the model's names, a DoRA
 * magnitude's without ".weight"), or over DoRA's magnitudes only (mag); -1
 * when one is missing or there are not `want` of them. */
static double adapters_err_of(const dt_model *m, const char *file, int want, bool mag)
{
    dt_st_file *f = NULL;
    if (dt_st_open(file, &f) < 0)
        return -1;
    double mx = 0, ref = 0;
    int n = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        dt_model_entry(m, i, &p);
        if ((!dt_lora_is_adapter(p.name) && p.is_buffer) || (mag && !dt_lora_is_magnitude(p.name)))
            continue; /* an adapter, or a module to save's weight (what trains beside them) */
        char key[600]; /* PEFT's: a magnitude's without ".weight", an adapted layer's bias under .base_layer */
        dt__lora_peft_name(&p, key, sizeof key);
        const dt_st_tensor *t = dt_st_find(f, key);
        float *v = t && t->numel == p.numel ? malloc(p.numel * sizeof *v) : NULL;
        if (!v || dt_st_read(f, t, 0, p.numel * sizeof *v, v) < 0) {
            free(v);
            dt_st_close(f);
            return -1;
        }
        for (size_t k = 0; k < p.numel; k++) {
            double a = dt_tensor_get(p.tensor, (int64_t)k), b = v[k];
            mx = fabs(a - b) > mx ? fabs(a - b) : mx;
            ref = fabs(b) > ref ? fabs(b) : ref;
        }
        free(v);
        n++;
    }
    dt_st_close(f);
    return n == want && ref > 0 ? mx / ref : -1;
}

static double adapters_err(const dt_model *m, const char *file)
{
    return adapters_err_of(m, file, 16, false); /* 4 targets x 2 layers x (A, B) */
}

/* 10 AdamW steps (lr 1e-2, weight decay 0.1: the goldens') of r's trained parameters on ids[(step % 2)], [2, 17]
 * each; *worst: the worst relative difference of the losses from PEFT's want[10] (INFINITY until they ran) */
static void adamw_steps(run *r, const int64_t *ids, const float *want, double *worst)
{
    *worst = INFINITY;
    dt_adam_params ap = dt_adamw_params_default();
    ap.lr = 1e-2, ap.weight_decay = 0.1;
    const dt_flat *P = dt_model_flat(r->m, DT_FLAT_PARAMS, DT_F32), *G = dt_model_flat(r->m, DT_FLAT_GRADS, DT_F32);
    dt_optim_range rg = {.params = P, .grads = G, .lo = 0, .hi = P->total};
    dt_optim *o = NULL;
    dt_ctx *ctx = NULL;
    ASSERT_OK(dt_optim_adamw_init(&ap, &rg, 1, &o));
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    double w = 0;
    for (int step = 0; step < 10 && o && ctx; step++) {
        dt_model_zero_grad(r->m);
        dt_tensor *loss = loss_of(ctx, r, ids + (step % 2) * 34, true);
        ASSERT(loss != NULL);
        if (!loss) {
            w = INFINITY;
            break;
        }
        double l = dt_tensor_get(loss, 0);
        fprintf(stderr, "  step %d: loss %.8f, PEFT %.8f\n", step, l, (double)want[step]);
        w = fmax(w, fabs(l - want[step]) / fabs((double)want[step]));
        if (dt_backward(ctx, loss) < 0 || dt_optim_step(o) < 0) {
            w = INFINITY;
            break;
        }
        dt_ctx_reset(ctx);
    }
    if (o && ctx)
        *worst = w;
    dt_optim_free(o);
    dt_ctx_free(ctx);
}

/* PEFT's initial adapters, 10 AdamW steps: PEFT's losses and adapters. */
TEST(train_parity)
{
    size_t nid = 0, nl = 0;
    int64_t *ids = t_read_tensor(LORA "ref.safetensors", "input_ids", &nid);
    float *want = t_read_tensor(LORA "ref.safetensors", "loss", &nl);
    ASSERT(ids && want && nid == 68 && nl == 10);
    run r;
    ASSERT_EQ_INT(open_run(&r, LORA "init"), 0);
    ASSERT_EQ_INT((int)r.pc.params.r, 4);
    ASSERT(r.pc.params.alpha == 8.0f && !r.pc.params.rslora);
    ASSERT(adapters_err(r.m, LORA "init/adapter_model.safetensors") == 0); /* loaded exactly */
    const dt_flat *P = dt_model_flat(r.m, DT_FLAT_PARAMS, DT_F32);
    ASSERT(P && P->numel == 2 * 4 * (32 + 48) + 2 * 4 * (32 + 24) + 2 * 4 * (48 + 32) + 2 * 4 * (64 + 32));
    double worst;
    adamw_steps(&r, ids, want, &worst);
    fprintf(stderr, "  worst relative loss difference over 10 steps %.3g\n", worst);
    ASSERT(worst <= 1e-5);
    ASSERT(want[9] < want[1] - 0.1); /* it trained */
    double ae = adapters_err(r.m, LORA "after/adapter_model.safetensors");
    fprintf(stderr, "  adapters after 10 steps: max error %.3g of the largest\n", ae);
    ASSERT(ae >= 0 && ae <= 1e-4);

    /* dtrain's saved adapters: PEFT's layout (keys, shapes, dtypes, config) */
    char dir[400], f1[500];
    snprintf(dir, sizeof dir, "%s/saved", t_tmpdir("lora_peft"));
    ASSERT_OK(dt_lora_save_peft(r.m, &r.pc.params, HF, dir));
    /* never through a symlink, also when named link/ (lstat of link/ follows the link: it was taken) */
    char link[500];
    snprintf(link, sizeof link, "%s/saved-link", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(symlink(dir, link), 0);
    ASSERT_STATUS(dt_lora_save_peft(r.m, &r.pc.params, HF, link), DT_ERR_INVALID_ARG);
    strcat(link, "/");
    ASSERT_STATUS(dt_lora_save_peft(r.m, &r.pc.params, HF, link), DT_ERR_INVALID_ARG);
    snprintf(f1, sizeof f1, "%s/adapter_model.safetensors", dir);
    dt_st_file *a = NULL, *b = NULL;
    ASSERT_OK(dt_st_open(f1, &a));
    ASSERT_OK(dt_st_open(LORA "after/adapter_model.safetensors", &b));
    if (a && b) {
        ASSERT_EQ_U64(dt_st_count(a), dt_st_count(b));
        for (size_t i = 0; i < dt_st_count(b); i++) {
            const dt_st_tensor *tb = dt_st_tensor_at(b, i), *ta = dt_st_find(a, tb->name);
            ASSERT(ta != NULL);
            if (!ta) {
                fprintf(stderr, "  dtrain's file lacks '%s'\n", tb->name);
                continue;
            }
            ASSERT(ta->dtype == tb->dtype && ta->ndim == tb->ndim && ta->numel == tb->numel);
            for (int d = 0; d < tb->ndim; d++)
                ASSERT(ta->shape[d] == tb->shape[d]);
        }
        ASSERT_STR_EQ(dt_st_meta(a, "format"), "pt");
    }
    dt_st_close(a);
    dt_st_close(b);
    dt_lora_peft_config mine;
    ASSERT_OK(dt_lora_peft_config_read(dir, &mine)); /* every key PEFT's loader needs, at PEFT's values */
    ASSERT(mine.params.r == 4 && mine.params.alpha == 8.0f && mine.params.dropout == 0 && !mine.params.rslora);
    int nt = 0;
    for (char **t = mine.target_names; t && *t; t++, nt++) {
        bool in = false;
        for (char **u = r.pc.target_names; *u; u++)
            in |= !strcmp(*t, *u);
        ASSERT(in);
    }
    ASSERT_EQ_INT(nt, 4);
    ASSERT_STR_EQ(mine.base_model, HF);
    dt_lora_peft_config_free(&mine);
    close_run(&r);
    free(ids);
    free(want);
}

/* The largest |a - b| over the tensors "merged.NAME" of file a_file and NAME of b_file (*n counts them; INFINITY
 * when one is missing), and in *moved the largest |a - base| (NAME in base file base1, or base2 when not NULL). */
static double merged_err(const char *a_file, const char *b_file, const char *base1, const char *base2, int *n,
                         double *moved)
{
    dt_st_file *ref = NULL, *got = NULL;
    double worst = -1;
    *n = 0, *moved = 0;
    if (dt_st_open(a_file, &ref) < 0 || dt_st_open(b_file, &got) < 0)
        goto out;
    worst = 0;
    for (size_t i = 0; i < dt_st_count(ref); i++) {
        const dt_st_tensor *tr = dt_st_tensor_at(ref, i);
        if (strncmp(tr->name, "merged.", 7))
            continue;
        const dt_st_tensor *tg = dt_st_find(got, tr->name + 7);
        size_t nb = 0;
        float *a = malloc(tr->numel * sizeof *a), *b = malloc(tr->numel * sizeof *b);
        float *base = t_read_tensor(base1, tr->name + 7, &nb);
        if (!base && base2)
            base = t_read_tensor(base2, tr->name + 7, &nb);
        if (!tg || tg->numel != tr->numel || !a || !b || !base || nb != tr->numel ||
            dt_st_read(ref, tr, 0, tr->numel * 4, a) < 0 || dt_st_read(got, tg, 0, tg->numel * 4, b) < 0) {
            fprintf(stderr, "  '%s' missing or of another size\n", tr->name + 7);
            worst = INFINITY;
        }
        for (size_t k = 0; worst < INFINITY && k < tr->numel; k++) {
            worst = fmax(worst, fabs((double)a[k] - b[k]));
            *moved = fmax(*moved, fabs((double)a[k] - base[k]));
        }
        free(a);
        free(b);
        free(base);
        (*n)++;
    }
out:
    dt_st_close(ref);
    dt_st_close(got);
    return worst;
}

/* The model's tensors (the frozen base and the adapters) as one checkpoint at ck */
static void model_ckpt(const dt_model *m, const char *ck)
{
    dt_ckpt_list *l = NULL;
    ASSERT_OK(dt_ckpt_list_init(&l));
    ASSERT_OK(dt_ckpt_list_add_model(l, m));
    ASSERT_OK(dt_ckpt_save(ck, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), NULL, NULL));
    dt_ckpt_list_free(l);
}

/* PEFT's trained adapters load into dtrain exactly; their merged export
 * equals PEFT's merge_and_unload. */
TEST(merged_export)
{
    run r;
    ASSERT_EQ_INT(open_run(&r, LORA "after"), 0);
    ASSERT(adapters_err(r.m, LORA "after/adapter_model.safetensors") == 0);
    char ck[400], out[400], out2[400], f[500];
    snprintf(ck, sizeof ck, "%s/ck", t_tmpdir("lora_peft"));
    snprintf(out, sizeof out, "%s/merged", t_tmpdir("lora_peft"));
    snprintf(out2, sizeof out2, "%s/unmerged", t_tmpdir("lora_peft"));
    model_ckpt(r.m, ck);
    dt_hf_config h;
    ASSERT_OK(dt_hf_config_read(HF, &h));
    dt_hf_save_params p = dt_hf_save_params_default();
    ASSERT_EQ_INT(dt_hf_save(ck, &h, out2, &p), DT_ERR_INVALID_ARG); /* never the base alone */
    ASSERT_STR_CONTAINS(dt_last_error(), "lora_A");
    p.lora_scaling = dt_lora_scaling(&r.pc.params);
    ASSERT_OK(dt_hf_save(ck, &h, out, &p));
    snprintf(f, sizeof f, "%s/model.safetensors", out);
    int nmerged = 0;
    double moved = 0, worst = merged_err(LORA "ref.safetensors", f, HF "/model-00001-of-00002.safetensors",
                                         HF "/model-00002-of-00002.safetensors", &nmerged, &moved);
    fprintf(stderr, "  merged: %d weights, max |dtrain - PEFT| %.3g (the merge moved them by up to %.3g)\n", nmerged,
            worst, moved);
    ASSERT_EQ_INT(nmerged, 8);
    ASSERT(worst <= 1e-6);
    ASSERT(moved > 1e-3); /* the adapters changed the weights */
    close_run(&r);
}

/* Bad adapter directories: errors naming the file and the key. */
TEST(bad_adapters)
{
    run r;
    memset(&r, 0, sizeof r);
    char d[400], f[500];
    snprintf(d, sizeof d, "%s/bad", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(dt_lora_peft_config_read(d, &r.pc), DT_ERR_NOT_FOUND);
    ASSERT_STR_CONTAINS(dt_last_error(), "adapter_config.json");
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    snprintf(f, sizeof f, "%s/adapter_config.json", d);
    const char *bad[][2] = {
        {"{\"peft_type\": \"IA3\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", "peft_type"},
        /* target_modules as a regular expression: one this engine refuses (a lookbehind), one malformed */
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"(?<=x)q_proj\"}",
         "target_modules"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"(q_proj\"}", "target_modules"},
        {"{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}", "\"r\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"use_qalora\": true}", "use_qalora"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], \"use_dora\": 1}",
         "use_dora"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"modules_to_save\": \"lm_head\"}", "modules_to_save"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"modules_to_save\": [\"\"]}", "modules_to_save"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": \"0\"}", "layers_to_transform"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": [0, -1]}", "layers_to_transform"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": [1.5]}", "layers_to_transform"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"layers_to_transform\": 1, \"layers_pattern\": 5}", "layers_pattern"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"rank_pattern\": {\"q_proj\": 0}}", "rank_pattern key \"q_proj\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"rank_pattern\": [4]}", "rank_pattern"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"alpha_pattern\": {\"(q_proj\": 8}}", "alpha_pattern key \"(q_proj\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], "
         "\"exclude_modules\": 5}", "exclude_modules"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], \"bias\": \"some\"}",
         "bias"},
        {"[1, 2]", "not a JSON object"},
        /* a key twice: PEFT (Python's json) takes the last r, cJSON alone the first */
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"r\": 8, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]}",
         "the key \"r\" appears twice"},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"]} {}", "text after"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ASSERT_OK(dt_file_write_atomic(f, bad[i][0], strlen(bad[i][0]), 0644));
        dt_status st = dt_lora_peft_config_read(d, &r.pc);
        ASSERT(st == DT_ERR_UNSUPPORTED || st == DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "adapter_config.json");
        ASSERT_STR_CONTAINS(dt_last_error(), bad[i][1]);
    }
    /* weights that do not fit the model built from init/'s settings */
    ASSERT_EQ_INT(open_run(&r, LORA "init"), 0);
    ASSERT_EQ_INT(dt_trainer_load_peft(r.tr, d), DT_ERR_NOT_FOUND); /* no adapter_model.safetensors */
    ASSERT_STR_CONTAINS(dt_last_error(), "adapter_model.safetensors");
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", d);
    struct {
        const char *key;
        int64_t shape[2];
        const char *want;
    } w[] = {
        {"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight", {4, 32}, "k_proj.lora_A"}, /* not a target */
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {4, 31}, "shape"},
        {"model.layers.0.self_attn.q_proj.lora_A.weight", {4, 32}, "not a LoRA adapter as PEFT"},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", {4, 32}, "no tensor"}, /* the rest missing */
    };
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
        float z[4 * 32] = {0};
        dt_st_desc desc = {.name = w[i].key, .dtype = DT_ST_F32, .ndim = 2, .shape = {w[i].shape[0], w[i].shape[1]}};
        dt_st_writer *sw = NULL;
        ASSERT_OK(dt_st_writer_open(f, &desc, 1, NULL, 0, &sw));
        ASSERT_OK(dt_st_writer_write(sw, 0, z, (size_t)(w[i].shape[0] * w[i].shape[1]) * 4));
        ASSERT_OK(dt_st_writer_commit(sw, NULL));
        dt_st_writer_close(sw);
        dt_status st = dt_trainer_load_peft(r.tr, d);
        ASSERT(st < 0);
        ASSERT_STR_CONTAINS(dt_last_error(), "adapter_model.safetensors");
        ASSERT_STR_CONTAINS(dt_last_error(), w[i].want);
    }
    close_run(&r);
}

/* target_modules "all-linear" (PEFT's shorthand): every Linear and Conv1D layer but the output layer (lm_head);
 * the adapters saved name the layers it chose, as PEFT's save_pretrained does (PEFT 0.18 on the golden Llama and
 * GPT-2 directories chose the same 14 and 8 layers), and a hand-written "all-linear" reads back. */
TEST(all_linear)
{
    const char *models[] = {"llama-tiny", "gpt-micro"};
    const char *want_in[] = {"model.layers.0.mlp.down_proj.lora_A.weight", "transformer.h.0.mlp.c_fc.lora_A.weight"};
    const int per_layer[] = {7, 4}; /* q k v o gate up down; c_attn, attn c_proj, c_fc, mlp c_proj */
    const char *all[] = {"all-linear", NULL};
    for (int k = 0; k < 2; k++) {
        dt_lora_params lp = dt_lora_params_default();
        lp.targets = all;
        dt_model_config c = dt_model_config_default();
        c.build.lora = &lp;
        dt_model *m = NULL;
        ASSERT_OK(dt_model_create(models[k], 1, &c, &m, NULL));
        int adapters = 0, layers = 0;
        for (size_t e = 0; e < dt_model_num_entries(m); e++) {
            dt_param_info pi;
            ASSERT_OK(dt_model_entry(m, e, &pi));
            adapters += strstr(pi.name, ".lora_A.weight") != NULL;
            ASSERT(!strstr(pi.name, "lm_head.lora")); /* the output layer is left out */
            const char *one = k == 0 ? "self_attn.q_proj.weight" : "attn.c_attn.weight"; /* one a layer */
            const size_t l = strlen(pi.name), ol = strlen(one);
            layers += l > ol && !strcmp(pi.name + l - ol, one);
        }
        ASSERT(dt_model_find_entry(m, want_in[k]) >= 0);
        ASSERT_EQ_INT(adapters, per_layer[k] * layers);
        char d[400];
        snprintf(d, sizeof d, "%s/all_linear_%d", t_tmpdir("lora_peft"), k);
        ASSERT_OK(dt_lora_save_peft(m, &lp, NULL, d));
        dt_lora_peft_config pc;
        ASSERT_OK(dt_lora_peft_config_read(d, &pc));
        int n = 0;
        for (char **t = pc.target_names; *t; t++, n++) {
            char a[1100];
            snprintf(a, sizeof a, "%s.lora_A.weight", *t);
            ASSERT(dt_model_find_entry(m, a) >= 0); /* each saved name is a layer it adapted */
        }
        ASSERT_EQ_INT(n, adapters);
        dt_lora_peft_config_free(&pc);
        /* the shorthand as a string, written by hand */
        char f[500];
        snprintf(f, sizeof f, "%s/adapter_config.json", d);
        const char *js = "{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 8, \"target_modules\": \"all-linear\"}";
        ASSERT_OK(dt_file_write_atomic(f, js, strlen(js), 0644));
        ASSERT_OK(dt_lora_peft_config_read(d, &pc));
        ASSERT_STR_EQ(pc.target_names[0], "all-linear");
        ASSERT(pc.target_names[1] == NULL);
        dt_lora_peft_config_free(&pc);
        dt_model_free(m);
    }
}

/* Every adapter of m against PEFT's file of an image-text model (keys
 * "base_model.model." + lm + the name past the text model's "model."):
 * how many are equal; -1 on a missing one. */
static int image_text_adapters_equal(const dt_model *m, const char *file, const char *lm)
{
    dt_st_file *f = NULL;
    if (dt_st_open(file, &f) < 0)
        return -1;
    int n = 0;
    for (size_t i = 0; n >= 0 && i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        dt_model_entry(m, i, &p);
        if (!dt_lora_is_adapter(p.name))
            continue;
        char key[600];
        snprintf(key, sizeof key, "base_model.model.%s%s", lm, p.name + strlen("model."));
        const dt_st_tensor *t = dt_st_find(f, key);
        float *v = t && t->numel == p.numel ? malloc(p.numel * sizeof *v) : NULL;
        bool same = v && dt_st_read(f, t, 0, p.numel * sizeof *v, v) >= 0;
        for (size_t k = 0; same && k < p.numel; k++)
            same = dt_tensor_get(p.tensor, (int64_t)k) == v[k];
        free(v);
        n = same ? n + 1 : -1;
        if (!same)
            fprintf(stderr, "  '%s' is not as the file's '%s'\n", p.name, key);
    }
    dt_st_close(f);
    return n;
}

/* file with the tensors of src renamed: each key's prefix from[k] as to[k] (the first that applies) */
static void renamed_copy(const char *src, const char *file, const char *const *from, const char *const *to, int nr)
{
    dt_st_file *f = NULL;
    ASSERT_OK(dt_st_open(src, &f));
    const size_t n = f ? dt_st_count(f) : 0;
    dt_st_desc *d = calloc(n + 1, sizeof *d);
    char **names = calloc(n + 1, sizeof *names);
    ASSERT(d && names);
    for (size_t i = 0; d && names && i < n; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        int k = 0;
        while (k < nr && strncmp(t->name, from[k], strlen(from[k])))
            k++;
        names[i] = malloc(strlen(t->name) + 100);
        if (k < nr)
            sprintf(names[i], "%s%s", to[k], t->name + strlen(from[k]));
        else
            strcpy(names[i], t->name);
        d[i] = (dt_st_desc){.name = names[i], .dtype = t->dtype, .ndim = t->ndim};
        memcpy(d[i].shape, t->shape, sizeof t->shape);
    }
    dt_st_writer *w = NULL;
    ASSERT_OK(dt_st_writer_open(file, d, n, NULL, 0, &w));
    for (size_t i = 0; w && i < n; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        void *buf = malloc(t->numel * 4 + 1);
        ASSERT_OK(dt_st_read(f, t, 0, t->numel * 4, buf));
        ASSERT_OK(dt_st_writer_write(w, i, buf, t->numel * 4));
        free(buf);
    }
    ASSERT_OK(dt_st_writer_commit(w, NULL));
    dt_st_writer_close(w);
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
    free(d);
    dt_st_close(f);
}

/* r's model (eval mode) on ids ([2, 17]: 16 inputs a row) against PEFT's logits want (nl of them): the largest
 * difference over the largest |want| in *rel, the most the adapters move them (|want - base|) in *moved, the
 * next-token loss in *loss */
static void logits_against(run *r, const int64_t *ids, const float *want, const float *base, size_t nl, double *rel,
                           double *moved, double *loss)
{
    *rel = *moved = *loss = NAN;
    dt_model_train(r->m, false);
    dt_ctx *ctx;
    ASSERT_OK(dt_ctx_init(NULL, &ctx));
    dt_tensor *lg = NULL, *l = loss_logits(ctx, r, ids, false, &lg);
    ASSERT(l && lg && dt_tensor_numel(lg) == (int64_t)nl);
    double mx = 0, ref = 0, mv = 0;
    for (size_t k = 0; k < nl; k++) {
        mx = fmax(mx, fabs(dt_tensor_get(lg, (int64_t)k) - want[k]));
        ref = fmax(ref, fabs((double)want[k]));
        mv = fmax(mv, fabs((double)want[k] - base[k]));
    }
    *rel = mx / ref, *moved = mv, *loss = dt_tensor_get(l, 0);
    dt_ctx_free(ctx);
}

/* PEFT's "all-linear" adapters on Gemma 3's image-text model: its language model's load onto the text model
 * dtrain reads from the image-text directory, the vision tower's (18 tensors: q/k/v/out_proj, fc1, fc2 and the
 * pooling head's out_proj, fc1, fc2) are left out, and the logits are the PEFT model's; the same file under
 * transformers 4's module names (language_model.model., vision_tower.vision_model.) loads the same. */
TEST(image_text_adapters)
{
    size_t nid = 0, nl = 0, nb = 0, n1 = 0;
    int64_t *ids = t_read_tensor(LORA "gemma3_mm_ref.safetensors", "input_ids", &nid);
    float *want = t_read_tensor(LORA "gemma3_mm_ref.safetensors", "logits", &nl);
    float *base = t_read_tensor(LORA "gemma3_mm_ref.safetensors", "base_logits", &nb);
    float *wl = t_read_tensor(LORA "gemma3_mm_ref.safetensors", "loss", &n1);
    ASSERT(ids && want && base && wl && nid == 34 && nl == 2 * 16 * 128 && nb == nl && n1 == 1);
    run r;
    ASSERT_EQ_INT(open_run_on(&r, HF_MM, LORA "gemma3_mm"), 0);
    ASSERT_EQ_U64(r.pc.left_out, 18);
    ASSERT(r.pc.params.r == 4 && r.pc.params.alpha == 8.0f);
    /* 4 layers x (q, k, v, o, gate, up, down) x (A, B), each as PEFT saved it */
    ASSERT_EQ_INT(image_text_adapters_equal(r.m, LORA "gemma3_mm/adapter_model.safetensors", "model.language_model."),
                  56);
    double rel, moved, l;
    logits_against(&r, ids, want, base, nl, &rel, &moved, &l);
    fprintf(stderr, "  gemma3_mm + PEFT adapters: logits max error %.3g of the largest (the adapters move them by "
            "up to %.3g); loss %.8f, PEFT %.8f\n", rel, moved, l, (double)wl[0]);
    ASSERT(rel <= 1e-5);
    ASSERT(moved > 0.5); /* the adapters matter */
    ASSERT_NEAR(l, wl[0], 0, 1e-5);
    close_run(&r);

    /* transformers 4's names: the language model under language_model.model., the vision tower at the top */
    char d[400], f[500], cmd[1200];
    snprintf(d, sizeof d, "%s/mm_v4", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", LORA "gemma3_mm/adapter_config.json", d);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", d);
    renamed_copy(LORA "gemma3_mm/adapter_model.safetensors", f,
                 (const char *const[]){"base_model.model.model.language_model.", "base_model.model.model.vision_tower."},
                 (const char *const[]){"base_model.model.language_model.model.",
                                       "base_model.model.vision_tower.vision_model."}, 2);
    ASSERT_EQ_INT(open_run_on(&r, HF_MM, d), 0);
    ASSERT_EQ_U64(r.pc.left_out, 18);
    ASSERT_EQ_INT(image_text_adapters_equal(r.m, f, "language_model.model."), 56);
    close_run(&r);
    free(ids);
    free(want);
    free(base);
    free(wl);
}

/* An image-text model's adapters dtrain cannot use: every one on the vision tower (PEFT targets fc1, out_proj
 * hit nothing else), or one adapter under the text model's and the image-text model's names; refused by
 * dt_lora_peft_config_read and by dt_trainer_load_peft, naming the problem and the keys. */
TEST(image_text_adapters_refused)
{
    char d[400];
    snprintf(d, sizeof d, "%s/mm_bad", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    run r;
    ASSERT_EQ_INT(open_run_on(&r, HF_MM, LORA "gemma3_mm"), 0);
    static const char vis[] = "base_model.model.model.vision_tower.encoder.layers.0.mlp.fc1.lora_A.weight";
    t_write_adapters(d, "\"fc1\"", (const char *const[]){vis, "base_model.model.model.vision_tower.encoder.layers.0."
                                                            "mlp.fc1.lora_B.weight"},
                   (const int64_t[][2]){{4, 16}, {32, 4}}, 2);
    dt_lora_peft_config pc;
    ASSERT_STATUS(dt_lora_peft_config_read(d, &pc), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "vision tower");
    ASSERT_STR_CONTAINS(dt_last_error(), vis);
    ASSERT_STATUS(dt_trainer_load_peft(r.tr, d), DT_ERR_UNSUPPORTED);
    ASSERT_STR_CONTAINS(dt_last_error(), "language model only");
    /* one adapter under two names: transformers 5's and the text model's, transformers 4's and 5's */
    const char *twice[][2] = {
        {"base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight",
         "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"},
        {"base_model.model.language_model.model.layers.0.self_attn.q_proj.lora_A.weight",
         "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight"},
    };
    for (int i = 0; i < 2; i++) {
        t_write_adapters(d, "\"q_proj\"", twice[i], (const int64_t[][2]){{4, 32}, {4, 32}}, 2);
        ASSERT_STATUS(dt_lora_peft_config_read(d, &pc), DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "is there twice");
        ASSERT_STR_CONTAINS(dt_last_error(), twice[i][0]);
        ASSERT_STR_CONTAINS(dt_last_error(), twice[i][1]);
        ASSERT_STATUS(dt_trainer_load_peft(r.tr, d), DT_ERR_FORMAT);
        ASSERT_STR_CONTAINS(dt_last_error(), "is there twice");
    }
    /* a target written as the image-text model's module reads as the text model's */
    t_write_adapters(d, "\"model.language_model.layers.0.self_attn.q_proj\"",
                   (const char *const[]){twice[0][0], "base_model.model.model.language_model.layers.0.self_attn."
                                                      "q_proj.lora_B.weight"},
                   (const int64_t[][2]){{4, 32}, {64, 4}}, 2);
    ASSERT_OK(dt_lora_peft_config_read(d, &pc));
    ASSERT_STR_EQ(pc.target_names[0], "model.layers.0.self_attn.q_proj");
    ASSERT_EQ_U64(pc.left_out, 0);
    dt_lora_peft_config_free(&pc);
    close_run(&r);
}

/* target_modules as PEFT's regular expression (tests/data/lora/gemma3_mm_regex: the language model's layers 1 and
 * 3, q_proj and down_proj, on the image-text model): the layers adapted are the file's, under the text model's
 * names; PEFT's logits within 1e-5 of the largest; the pattern with ^ and $ reads the same; a pattern that does not
 * match one of the file's adapters whole is refused naming it. */
TEST(regex_target_modules)
{
    size_t nid = 0, nl = 0, nb = 0;
    int64_t *ids = t_read_tensor(LORA "gemma3_mm_regex_ref.safetensors", "input_ids", &nid);
    float *want = t_read_tensor(LORA "gemma3_mm_regex_ref.safetensors", "logits", &nl);
    float *base = t_read_tensor(LORA "gemma3_mm_regex_ref.safetensors", "base_logits", &nb);
    ASSERT(ids && want && base && nid == 34 && nl == 2 * 16 * 128 && nb == nl);
    run r;
    ASSERT_EQ_INT(open_run_on(&r, HF_MM, LORA "gemma3_mm_regex"), 0);
    ASSERT_EQ_U64(r.pc.left_out, 0);
    static const char *const layers[4] = {"model.layers.1.self_attn.q_proj", "model.layers.1.mlp.down_proj",
                                          "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.down_proj"};
    size_t nt = 0;
    for (; r.pc.target_names[nt]; nt++) {
        bool known = false;
        for (int k = 0; k < 4; k++)
            known = known || !strcmp(r.pc.target_names[nt], layers[k]);
        ASSERT(known);
    }
    ASSERT_EQ_U64(nt, 4);
    ASSERT_EQ_INT(image_text_adapters_equal(r.m, LORA "gemma3_mm_regex/adapter_model.safetensors",
                                            "model.language_model."), 8);
    double rel, moved, l;
    logits_against(&r, ids, want, base, nl, &rel, &moved, &l);
    fprintf(stderr, "  gemma3_mm + PEFT adapters on a regex's layers: logits max error %.3g of the largest (the "
            "adapters move them by up to %.3g)\n", rel, moved);
    ASSERT(rel <= 1e-5);
    ASSERT(moved > 0.5);
    close_run(&r);

    /* the same adapters under other configs: ^pattern$ reads the same; layer 1 only misses layer 3's adapters */
    char d[400], f[500], cmd[1200];
    snprintf(d, sizeof d, "%s/regex", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/'", LORA "gemma3_mm_regex/adapter_model.safetensors", d);
    ASSERT_EQ_INT(system(cmd), 0);
    snprintf(f, sizeof f, "%s/adapter_config.json", d);
    static const char *const cfgs[3] = {
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
        "\"^.*language_model.*layers\\\\.[13]\\\\.(self_attn\\\\.q_proj|mlp\\\\.down_proj)$\"}",
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": "
        "\".*language_model.*layers\\\\.1\\\\.(self_attn\\\\.q_proj|mlp\\\\.down_proj)\"}",
        /* found inside every q_proj's name, but a whole name it is not (PEFT: re.fullmatch) */
        "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"self_attn\\\\.q_proj\"}",
    };
    dt_lora_peft_config pc;
    ASSERT_OK(dt_file_write_atomic(f, cfgs[0], strlen(cfgs[0]), 0644));
    ASSERT_OK(dt_lora_peft_config_read(d, &pc));
    for (nt = 0; pc.target_names[nt]; nt++)
        ;
    ASSERT_EQ_U64(nt, 4);
    dt_lora_peft_config_free(&pc);
    ASSERT_OK(dt_file_write_atomic(f, cfgs[1], strlen(cfgs[1]), 0644));
    ASSERT_STATUS(dt_lora_peft_config_read(d, &pc), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "layer 'model.language_model.layers.3.");
    ASSERT_STR_CONTAINS(dt_last_error(), "does not match");
    ASSERT_OK(dt_file_write_atomic(f, cfgs[2], strlen(cfgs[2]), 0644));
    ASSERT_STATUS(dt_lora_peft_config_read(d, &pc), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "(\"self_attn\\.q_proj\" in adapter_config.json) does not match");
    free(ids);
    free(want);
    free(base);
}

/* dt_lora_save_peft_check: the two files' names absent or regular files; a FIFO (or a directory) at either is
 * refused naming it, and left there */
TEST(save_check)
{
    char d[400], f[460];
    snprintf(d, sizeof d, "%s/check", t_tmpdir("lora_peft"));
    ASSERT_EQ_INT(mkdir(d, 0755), 0);
    ASSERT_OK(dt_lora_save_peft_check(d));
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", d);
    ASSERT_EQ_INT(mkfifo(f, 0600), 0);
    ASSERT_STATUS(dt_lora_save_peft_check(d), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "adapter_model.safetensors is a FIFO");
    struct stat st;
    ASSERT(lstat(f, &st) == 0 && S_ISFIFO(st.st_mode));
    unlink(f);
    snprintf(f, sizeof f, "%s/adapter_config.json", d);
    ASSERT_EQ_INT(mkdir(f, 0755), 0);
    ASSERT_STATUS(dt_lora_save_peft_check(d), DT_ERR_IO);
    ASSERT_STR_CONTAINS(dt_last_error(), "adapter_config.json is a directory");
    ASSERT_STATUS(dt_lora_save_peft_check(NULL), DT_ERR_NULL);
}

/* PEFT's adapters of name_init/ on base (bf1/bf2 its weight files), with DoRA (use_dora) or modules to save: they
 * load exactly, and dtrain's own DoRA magnitudes (the base's row norms, written by the trainer) equal PEFT's
 * initial ones; 10 AdamW steps give PEFT's losses and name_after/'s tensors; dtrain's saved adapters have PEFT's
 * keys and values and settings; name_after/'s merged export equals PEFT's merge_and_unload. n: the tensors saved,
 * nm: the merged weights compared, tol: the trained tensors' bound (of the largest). */
static void peft_case(const char *base, const char *bf1, const char *bf2, const char *name, int n, int nm_want,
                      double tol)
{
    char init[300], after[300], ref[300], f[600];
    snprintf(init, sizeof init, LORA "%s_init", name);
    snprintf(after, sizeof after, LORA "%s_after", name);
    snprintf(ref, sizeof ref, LORA "%s_ref.safetensors", name);
    size_t nid = 0, nl = 0;
    int64_t *ids = t_read_tensor(ref, "input_ids", &nid);
    float *want = t_read_tensor(ref, "loss", &nl);
    ASSERT(ids && want && nid == 68 && nl == 10);
    run r;
    ASSERT_EQ_INT(open_run_with(&r, base, init, false), 0); /* dtrain's own magnitudes: ||W|| */
    const bool dora = r.pc.params.dora;
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", init);
    double me = dora ? adapters_err_of(r.m, f, n / 3, true) : 0;
    if (dora)
        fprintf(stderr, "  %s: dtrain's initial magnitudes against PEFT's: %.3g of the largest\n", name, me);
    ASSERT(me >= 0 && me <= 1e-6);
    close_run(&r);
    ASSERT_EQ_INT(open_run_on(&r, base, init), 0);
    ASSERT(adapters_err_of(r.m, f, n, false) == 0);
    dt_model_train(r.m, false); /* GPT-2's config.json has dropout 0.1; the golden steps ran without */
    double worst;
    adamw_steps(&r, ids, want, &worst);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", after);
    double ae = adapters_err_of(r.m, f, n, false);
    fprintf(stderr, "  %s: worst relative loss difference over 10 steps %.3g (PEFT %.6f -> %.6f); adapters and "
            "magnitudes after: %.3g of the largest\n", name, worst, (double)want[0], (double)want[9], ae);
    ASSERT(worst <= 1e-5);
    ASSERT(ae >= 0 && ae <= tol);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/%s_saved", t_tmpdir("lora_peft"), name);
    ASSERT_OK(dt_lora_save_peft(r.m, &r.pc.params, base, dir));
    dt_lora_peft_config mine;
    ASSERT_OK(dt_lora_peft_config_read(dir, &mine));
    ASSERT(mine.params.dora == dora);
    ASSERT(!r.pc.save_names == !mine.save_names);
    for (int k = 0; k < 3; k++) { /* rank_pattern, alpha_pattern, exclude_modules written back as read */
        const char *key = (const char *const[]){"rank_pattern", "alpha_pattern", "exclude_modules"}[k];
        const char *a = dt_lora_pattern_json(r.pc.pattern, key), *b = dt_lora_pattern_json(mine.pattern, key);
        ASSERT(!a == !b);
        if (a && b)
            ASSERT_STR_EQ(b, a);
    }
    for (int k = 0; mine.save_names && mine.save_names[k]; k++)
        ASSERT_STR_EQ(mine.save_names[k], r.pc.save_names[k]);
    dt_lora_peft_config_free(&mine);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", dir);
    ASSERT(adapters_err_of(r.m, f, n, false) == 0); /* every key PEFT's file has, with its values */
    close_run(&r);

    /* PEFT's trained adapters merged: PEFT's merge_and_unload */
    ASSERT_EQ_INT(open_run_on(&r, base, after), 0);
    char ck[400], out[400];
    snprintf(ck, sizeof ck, "%s/%s_ck", t_tmpdir("lora_peft"), name);
    snprintf(out, sizeof out, "%s/%s_merged", t_tmpdir("lora_peft"), name);
    model_ckpt(r.m, ck);
    dt_hf_config h;
    ASSERT_OK(dt_hf_config_read(base, &h));
    dt_hf_save_params p = dt_hf_save_params_default();
    p.lora_scaling = dt_lora_scaling(&r.pc.params);
    p.lora = &r.pc.params; /* each layer's own scaling (rank_pattern, alpha_pattern) */
    ASSERT_OK(dt_hf_save(ck, &h, out, &p));
    snprintf(f, sizeof f, "%s/model.safetensors", out);
    int nm = 0;
    double moved = 0, merr = merged_err(ref, f, bf1, bf2, &nm, &moved);
    fprintf(stderr, "  %s merged: %d weights, max |dtrain - PEFT| %.3g (the merge moved them by up to %.3g)\n",
            name, nm, merr, moved);
    ASSERT(nm == nm_want && merr <= 2e-6 && moved > 1e-3);
    close_run(&r);
    free(ids);
    free(want);
}

/* The merged export of PEFT's name_after/ with the default scaling for every layer (dt_hf_save_params.lora NULL):
 * its largest difference from PEFT's merge_and_unload */
static double merged_default_err(const char *name, const char *bf1, const char *bf2)
{
    char after[300], ref[300], ck[400], out[400], f[500];
    snprintf(after, sizeof after, LORA "%s_after", name);
    snprintf(ref, sizeof ref, LORA "%s_ref.safetensors", name);
    snprintf(ck, sizeof ck, "%s/%s_ck_default", t_tmpdir("lora_peft"), name);
    snprintf(out, sizeof out, "%s/%s_merged_default", t_tmpdir("lora_peft"), name);
    run r;
    if (open_run(&r, after) != 0)
        return -1;
    model_ckpt(r.m, ck);
    dt_hf_config h;
    dt_hf_save_params p = dt_hf_save_params_default();
    p.lora_scaling = dt_lora_scaling(&r.pc.params);
    if (dt_hf_config_read(HF, &h) < 0 || dt_hf_save(ck, &h, out, &p) < 0) {
        close_run(&r);
        return -1;
    }
    close_run(&r);
    snprintf(f, sizeof f, "%s/model.safetensors", out);
    int nm = 0;
    double moved;
    return merged_err(ref, f, bf1, bf2, &nm, &moved);
}

/* PEFT's adapter directory src with adapter_config.json's key `drop` removed, as dir */
static void copy_without(const char *src, const char *dir, const char *drop)
{
    char f[600], *txt = NULL;
    size_t n = 0;
    ASSERT_EQ_INT(mkdir(dir, 0755), 0);
    snprintf(f, sizeof f, "%s/adapter_config.json", src);
    ASSERT_OK(dt_file_read_all(f, 1 << 20, &txt, &n));
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    cJSON_DeleteItemFromObjectCaseSensitive(c, drop);
    char *out = cJSON_Print(c);
    snprintf(f, sizeof f, "%s/adapter_config.json", dir);
    ASSERT(out && dt_file_write_atomic(f, out, strlen(out), 0644) >= 0);
    cJSON_free(out);
    cJSON_Delete(c);
    snprintf(f, sizeof f, "%s/adapter_model.safetensors", src);
    ASSERT_OK(dt_file_read_all(f, 1 << 24, &txt, &n));
    char g[600];
    snprintf(g, sizeof g, "%s/adapter_model.safetensors", dir);
    ASSERT(txt && dt_file_write_atomic(g, txt, n, 0644) >= 0);
    free(txt);
}

/* rank_pattern {"q_proj": 4, "model.layers.1.self_attn.v_proj": 2} and alpha_pattern {"o_proj": 32} over r 3,
 * lora_alpha 6 on q_proj, v_proj, o_proj (PEFT's pat_ files): each layer its own rank and scaling (q_proj 6/4, layer
 * 1's v_proj 6/2, o_proj 32/3, layer 0's v_proj 6/3); PEFT's losses, adapters and merge (peft_case). Without
 * the patterns it would not be: the default scaling's merge is far from PEFT's, the file without rank_pattern is
 * refused naming a tensor and both ranks, without alpha_pattern the losses part from PEFT's. */
TEST(rank_alpha_pattern)
{
    const char *bf1 = HF "/model-00001-of-00002.safetensors", *bf2 = HF "/model-00002-of-00002.safetensors";
    peft_case(HF, bf1, bf2, "pat", 12, 6, 1e-4);
    run r;
    ASSERT_EQ_INT(open_run(&r, LORA "pat_init"), 0);
    static const struct {
        const char *layer;
        int64_t r;
        float s;
    } want[] = {{"model.layers.0.self_attn.q_proj", 4, 1.5f}, {"model.layers.1.self_attn.q_proj", 4, 1.5f},
                {"model.layers.0.self_attn.v_proj", 3, 2.0f}, {"model.layers.1.self_attn.v_proj", 2, 3.0f},
                {"model.layers.0.self_attn.o_proj", 3, 32.0f / 3}, {"model.layers.1.self_attn.o_proj", 3, 32.0f / 3}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        int64_t rl = 0;
        float sl = 0;
        char a[300];
        ASSERT_OK(dt_lora_layer_scaling(&r.pc.params, want[k].layer, &rl, &sl));
        ASSERT(rl == want[k].r && fabsf(sl - want[k].s) <= 1e-6f * want[k].s);
        snprintf(a, sizeof a, "%s.lora_A.weight", want[k].layer);
        const int64_t e = dt_model_find_entry(r.m, a);
        dt_param_info pi;
        ASSERT(e >= 0 && dt_model_entry(r.m, (size_t)e, &pi) >= 0 && pi.shape[0] == want[k].r);
    }
    ASSERT_EQ_U64(dt_lora_pattern_warn(r.pc.pattern, &r.pc.params), 0); /* every key named a layer */
    dt_lora_params rs = r.pc.params; /* rsLoRA with patterns (PEFT allows it): alpha_l / sqrt(r_l) */
    rs.rslora = true;
    float srs = 0;
    ASSERT_OK(dt_lora_layer_scaling(&rs, "model.layers.1.self_attn.v_proj", NULL, &srs));
    ASSERT(fabsf(srs - 6.0f / sqrtf(2.0f)) <= 1e-6f);
    close_run(&r);
    double de = merged_default_err("pat", bf1, bf2);
    fprintf(stderr, "  pat merged with the default scaling alpha/r for every layer: %.3g from PEFT's\n", de);
    ASSERT(de > 1e-3);

    char d[400];
    snprintf(d, sizeof d, "%s/pat_no_rank", t_tmpdir("lora_peft"));
    copy_without(LORA "pat_init", d, "rank_pattern");
    dt_lora_peft_config pc;
    ASSERT_EQ_INT(dt_lora_peft_config_read(d, &pc), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "q_proj.lora_");
    ASSERT_STR_CONTAINS(dt_last_error(), "not of rank 3");
    ASSERT_STR_CONTAINS(dt_last_error(), "rank 4");
    /* a rank_pattern the file disagrees with: both ranks named, with rank_pattern */
    char f[500];
    snprintf(f, sizeof f, "%s/adapter_config.json", d);
    char *txt = NULL;
    size_t n = 0;
    ASSERT_OK(dt_file_read_all(f, 1 << 20, &txt, &n));
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    cJSON_AddItemToObject(c, "rank_pattern", cJSON_Parse("{\"q_proj\": 4, \"v_proj\": 5}"));
    char *js = cJSON_Print(c);
    ASSERT_OK(dt_file_write_atomic(f, js, strlen(js), 0644));
    cJSON_free(js);
    cJSON_Delete(c);
    ASSERT_EQ_INT(dt_lora_peft_config_read(d, &pc), DT_ERR_MISMATCH);
    ASSERT_STR_CONTAINS(dt_last_error(), "v_proj.lora_");
    ASSERT_STR_CONTAINS(dt_last_error(), "not of rank 5 (\"rank_pattern\"");

    snprintf(d, sizeof d, "%s/pat_no_alpha", t_tmpdir("lora_peft"));
    copy_without(LORA "pat_init", d, "alpha_pattern");
    size_t nid = 0, nl = 0;
    int64_t *ids = t_read_tensor(LORA "pat_ref.safetensors", "input_ids", &nid);
    float *losses = t_read_tensor(LORA "pat_ref.safetensors", "loss", &nl);
    ASSERT(ids && losses && nid == 68 && nl == 10);
    ASSERT_EQ_INT(open_run(&r, d), 0);
    double worst = 0;
    adamw_steps(&r, ids, losses, &worst);
    fprintf(stderr, "  pat without alpha_pattern: losses up to %.3g from PEFT's\n", worst);
    ASSERT(worst > 1e-4);
    close_run(&r);
    free(ids);
    free(losses);
}

/* The layers m adapts (its lora_A weights). */
static int adapted_layers(const dt_model *m)
{
    int n = 0;
    for (size_t e = 0; m && e < dt_model_num_entries(m); e++) {
        dt_param_info pi;
        dt_model_entry(m, e, &pi);
        n += strstr(pi.name, ".lora_A.weight") != NULL;
    }
    return n;
}

/* exclude_modules as PEFT's regular expression (layer 1's q_proj) over q_proj and v_proj (PEFT's excl_ files):
 * that layer has no adapters, PEFT's losses, adapters and merge (peft_case); as a list, by a name's end; a list
 * that excludes nothing is warned of (its count), an exclusion leaving no layer refused. */
TEST(exclude_modules)
{
    peft_case(HF, HF "/model-00001-of-00002.safetensors", HF "/model-00002-of-00002.safetensors", "excl", 6, 4, 1e-4);
    run r;
    ASSERT_EQ_INT(open_run(&r, LORA "excl_init"), 0);
    ASSERT(dt_model_find_entry(r.m, "model.layers.1.self_attn.q_proj.lora_A.weight") < 0);
    ASSERT(dt_model_find_entry(r.m, "model.layers.0.self_attn.q_proj.lora_A.weight") >= 0);
    ASSERT(dt_model_find_entry(r.m, "model.layers.1.self_attn.v_proj.lora_A.weight") >= 0);
    close_run(&r);
    static const struct {
        const char *exclude;
        int want; /* adapted layers, -1 refused */
        size_t warns;
    } cases[] = {
        {"[\"self_attn.q_proj\"]", 2, 0},            /* a name's end: both q_proj */
        {"[\"layers.0.self_attn.v_proj\", \"x\"]", 3, 0},
        {"[\"q\"]", 4, 1},                           /* not a whole part: nothing excluded, warned */
        {"\"model\\\\.layers\\\\.[01]\\\\..*\"", -1, 0}, /* every layer */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_lora_pattern *pt = NULL;
        ASSERT_OK(dt_lora_pattern_init(NULL, NULL, cases[k].exclude, &pt));
        dt_lora_params lp = dt_lora_params_default();
        lp.targets = (const char *const[]){"q_proj", "v_proj", NULL};
        dt_lora_pattern_use(pt, &lp);
        dt_model_config c = dt_model_config_default();
        c.build.lora = &lp;
        dt_model *m = NULL;
        dt_status st = dt_model_create("llama-tiny", 1, &c, &m, NULL);
        if (cases[k].want < 0) {
            ASSERT_EQ_INT(st, DT_ERR_NOT_FOUND);
            ASSERT_STR_CONTAINS(dt_last_error(), "exclude_modules");
        } else {
            ASSERT_OK(st);
            const int n = adapted_layers(m);
            fprintf(stderr, "  exclude %s: %d adapted layers\n", cases[k].exclude, n);
            ASSERT_EQ_INT(n, cases[k].want);
            ASSERT_EQ_U64(dt_lora_pattern_warn(pt, &lp), cases[k].warns);
        }
        dt_model_free(m);
        dt_lora_pattern_free(pt);
    }
}

/* DoRA's form under active lora_dropout (PEFT's: base(x) + (m/n - 1) W x' + m/n s B(A(x')), x' = dropout(x))
 * against its form without (m/n (W x + s B(A(x))) + bias): with p = 1e-7 no element drops and x' is x times
 * 1 + 1e-7, so the two give the same loss and gradients to that; the adapters and magnitudes drawn away from
 * their init so that every term counts. */
TEST(dora_dropout_form)
{
    const char *targets[] = {"c_attn", "c_proj", NULL};
    dt_model *m[2] = {NULL, NULL};
    dt_model_desc d[2];
    for (int k = 0; k < 2; k++) {
        dt_lora_params lp = dt_lora_params_default();
        lp.targets = targets;
        lp.dora = true;
        lp.dropout = k == 0 ? 1e-7f : 0.0f;
        dt_model_config c = dt_model_config_default();
        c.build.lora = &lp;
        c.seq = 16;
        ASSERT_OK(dt_model_create("gpt-micro", 3, &c, &m[k], &d[k]));
        dt_model_train(m[k], true);
    }
    const dt_flat *P0 = dt_model_flat(m[0], DT_FLAT_PARAMS, DT_F32), *P1 = dt_model_flat(m[1], DT_FLAT_PARAMS, DT_F32);
    ASSERT(P0 && P1 && P0->numel == P1->numel && P0->numel > 0);
    float *p0 = P0->base;
    for (size_t i = 0; i < P0->numel; i++) /* B away from zeros, m away from ones */
        p0[i] += 0.05f * (float)((i * 2654435761u) % 1000) / 1000.0f - 0.02f;
    memcpy(P1->base, P0->base, P0->numel * sizeof(float));
    int64_t ids[2 * 17];
    for (int i = 0; i < 34; i++)
        ids[i] = (i * 37 + 11) % 512; /* gpt-micro: a vocabulary of 512 */
    double loss[2];
    float *grad[2];
    for (int k = 0; k < 2; k++) {
        dt_ctx *ctx;
        ASSERT_OK(dt_ctx_init(NULL, &ctx));
        dt_model_zero_grad(m[k]);
        run r = {.m = m[k], .d = d[k]};
        dt_tensor *l = loss_of(ctx, &r, ids, true);
        if (!l)
            fprintf(stderr, "  %s\n", dt_last_error());
        ASSERT(l != NULL);
        loss[k] = l ? dt_tensor_get(l, 0) : NAN;
        ASSERT_OK(dt_backward(ctx, l));
        const dt_flat *G = dt_model_flat(m[k], DT_FLAT_GRADS, DT_F32);
        grad[k] = malloc(G->numel * sizeof(float));
        memcpy(grad[k], G->base, G->numel * sizeof(float));
        dt_ctx_free(ctx);
    }
    double gd = 0, gm = 0;
    for (size_t i = 0; i < P0->numel; i++) {
        gd = fmax(gd, fabs((double)grad[0][i] - grad[1][i]));
        gm = fmax(gm, fabs((double)grad[1][i]));
    }
    fprintf(stderr, "  DoRA with dropout 1e-7 (PEFT's dropout form) against without: loss %.8f / %.8f, gradients "
            "%.3g of the largest (%.3g)\n", loss[0], loss[1], gd / gm, gm);
    ASSERT(fabs(loss[0] - loss[1]) <= 1e-6 * fabs(loss[1]));
    ASSERT(gm > 0 && gd <= 1e-5 * gm);
    for (int k = 0; k < 2; k++) {
        free(grad[k]);
        dt_model_free(m[k]);
    }
}

/* layers_to_transform and layers_pattern as PEFT 0.22 reads them (checked against get_peft_model on the golden Llama:
 * layers [1] with no pattern or "layers" adapt layer 1's targets, with "h" none): the index is the first number
 * after a part (after a part named by the pattern); a layer named whole is adapted whatever its index; saved and
 * read back through adapter_config.json. */
TEST(layers_to_transform)
{
    static const struct {
        const char *model, *targets[3], *pattern[2];
        int64_t layers[2];
        size_t nl;
        int want; /* lora_A tensors, -1: refused */
        const char *one; /* one of them */
    } cases[] = {
        {"llama-tiny", {"q_proj", "down_proj"}, {NULL}, {1}, 1, 2, "model.layers.1.mlp.down_proj.lora_A.weight"},
        {"llama-tiny", {"q_proj", "down_proj"}, {"layers"}, {0}, 1, 2, "model.layers.0.self_attn.q_proj.lora_A.weight"},
        {"llama-tiny", {"q_proj"}, {"h"}, {1}, 1, -1, NULL},
        {"llama-tiny", {"model.layers.0.self_attn.q_proj", "v_proj"}, {NULL}, {1}, 1, 2,
         "model.layers.0.self_attn.q_proj.lora_A.weight"}, /* named whole: kept; v_proj: layer 1's */
        {"gpt-micro", {"c_attn"}, {"h"}, {0}, 1, 1, "transformer.h.0.attn.c_attn.lora_A.weight"},
        {"gpt-micro", {"all-linear"}, {NULL}, {1}, 1, 4, "transformer.h.1.mlp.c_fc.lora_A.weight"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_lora_params lp = dt_lora_params_default();
        lp.targets = cases[k].targets;
        lp.layers = cases[k].layers;
        lp.nlayers = cases[k].nl;
        lp.layers_pattern = cases[k].pattern[0] ? cases[k].pattern : NULL;
        dt_model_config c = dt_model_config_default();
        c.build.lora = &lp;
        dt_model *m = NULL;
        dt_status st = dt_model_create(cases[k].model, 1, &c, &m, NULL);
        if (cases[k].want < 0) {
            ASSERT_EQ_INT(st, DT_ERR_NOT_FOUND);
            ASSERT_STR_CONTAINS(dt_last_error(), "layers_to_transform");
            continue;
        }
        ASSERT_OK(st);
        const int n = adapted_layers(m);
        fprintf(stderr, "  case %zu: %d adapted layers\n", k, n);
        ASSERT_EQ_INT(n, cases[k].want);
        ASSERT(dt_model_find_entry(m, cases[k].one) >= 0);
        char d[400];
        snprintf(d, sizeof d, "%s/layers_%zu", t_tmpdir("lora_peft"), k);
        ASSERT_OK(dt_lora_save_peft(m, &lp, NULL, d));
        dt_lora_peft_config pc;
        ASSERT_OK(dt_lora_peft_config_read(d, &pc));
        ASSERT(pc.params.nlayers == cases[k].nl && pc.params.layers && pc.params.layers[0] == cases[k].layers[0]);
        const char *const *lpat = pc.params.layers_pattern;
        ASSERT(!cases[k].pattern[0] ? !lpat : lpat && !strcmp(lpat[0], cases[k].pattern[0]));
        dt_lora_peft_config_free(&pc);
        dt_model_free(m);
    }
}

TEST(dora)
{
    peft_case(HF, HF "/model-00001-of-00002.safetensors", HF "/model-00002-of-00002.safetensors", "dora", 24, 8, 1e-4);
    peft_case(HF_GPT2, HF_GPT2 "/model.safetensors", NULL, "gpt2_dora", 18, 6, 1e-4);
}

/* PEFT's bias="all" on GPT-2 (its Conv1D layers and norms have biases): every bias trains beside the adapters on
 * c_attn, the adapted layers' saved as PEFT names them ("...c_attn.base_layer.bias") */
TEST(bias_all)
{
    peft_case(HF_GPT2, HF_GPT2 "/model.safetensors", NULL, "gpt2_bias", 17, 2, 5e-4); /* AdamW: as modules_to_save */
}

/* modules_to_save ["lm_head"] beside LoRA on q_proj and v_proj: the head trains whole as PEFT's copy of it does
 * (the losses within 1e-5 relative; the head's weights within 5e-4 of the largest: AdamW's first steps on its
 * rows of rounding-sized gradients move them by whole steps either way) */
TEST(modules_to_save)
{
    peft_case(HF, HF "/model-00001-of-00002.safetensors", HF "/model-00002-of-00002.safetensors", "save", 9, 5, 5e-4);
}

int main(void)
{
    RUN(train_parity);
    RUN(dora);
    RUN(dora_dropout_form);
    RUN(modules_to_save);
    RUN(bias_all);
    RUN(rank_alpha_pattern);
    RUN(exclude_modules);
    RUN(layers_to_transform);
    RUN(all_linear);
    RUN(merged_export);
    RUN(bad_adapters);
    RUN(image_text_adapters);
    RUN(image_text_adapters_refused);
    RUN(regex_target_modules);
    RUN(save_check);
    t_rm_rf(t_tmpdir("lora_peft"));
    return TEST_REPORT();
}
