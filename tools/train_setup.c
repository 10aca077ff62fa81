/* dtrain train's set-up (train_run.h): the options turned into the model
 * (precision, LoRA, --freeze, the GPT vocabulary, the memory check), the
 * data sets, samplers and loaders, the strategy wrap, the communication
 * start and the library's trainer, with tracing's set-up and merge. */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"
#include "train_run.h"

#include "dtrain/autograd.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/tokenizer.h"
#include "dtrain/kernels.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/offload.h"
#include "dtrain/optim.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/tensor.h"
#include "dtrain/train.h"
#include "dtrain/trace.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* --precision, --reduce-dtype, --keep-bn-fp32, --buffer-dtype as a policy (train.h). */
static int precision_policy(const dt__train_opts *o, dt_precision_policy *p)
{
    if (dt_precision_policy_parse(o->precision, p) < 0)
        return dt__tr_fail(2, "--precision");
    if (o->reduce_dtype) {
        dt_precision_policy r;
        if (dt_precision_policy_parse(o->reduce_dtype, &r) < 0)
            return dt__tr_fail(2, "--reduce-dtype");
        p->reduce_dtype = r.param_dtype;
    }
    p->keep_batchnorm_fp32 = strcmp(o->keep_bn_fp32, "false") != 0;
    if (o->buffer_dtype) {
        dt_precision_policy r;
        if (dt_precision_policy_parse(o->buffer_dtype, &r) < 0)
            return dt__tr_fail(2, "--buffer-dtype");
        p->buffer_dtype = r.param_dtype;
    }
    return 0;
}

dt_model_config dt__tr_model_config(const dt__train_run *t)
{
    dt_model_config cfg = dt_model_config_default();
    if (t->o.mlp_dim)
        cfg.mlp_dim = t->o.mlp_dim;
    if (t->o.mlp_hidden)
        cfg.mlp_hidden = t->o.mlp_hidden;
    cfg.n_layer = t->o.n_layer, cfg.n_head = t->o.n_head, cfg.n_embd = t->o.n_embd;
    cfg.block_size = t->o.block_size, cfg.vocab_size = t->o.vocab_size, cfg.seq = t->o.seq;
    cfg.dropout = (float)t->o.dropout;
    cfg.tp = t->ddp.tp_pg; /* --tp: the rank's slices */
    cfg.sequence_parallel = t->o.sequence_parallel;
    cfg.cp = t->ddp.cpp; /* --cp: the rank's positions of each sequence */
    cfg.fused_lm_loss = true; /* GPT-2: the head fused with the loss in row chunks, no [B*T, V] logits */
    cfg.build.frozen = t->freeze;
    cfg.build.lora = t->lora_targets ? &t->lora : NULL;
    return cfg;
}

/* A comma-separated list into a NULL-terminated array (*buf holds the strings). */
static int split_list(const char *opt, const char *list, char **buf, const char ***out)
{
    size_t n = 1;
    for (const char *c = list; *c; c++)
        n += *c == ',';
    *buf = strdup(list);
    *out = calloc(n + 1, sizeof **out);
    if (!*buf || !*out)
        return dt__tr_fail(1, opt);
    size_t k = 0;
    for (char *s = *buf, *c; s; s = c) {
        if ((c = strchr(s, ',')))
            *c++ = 0;
        if (!*s) {
            dt__cli_err("dtrain train: %s %s: an empty name\n", opt, list);
            return 2;
        }
        (*out)[k++] = s;
    }
    return 0;
}

/* --lora-from DIR: the settings of its adapter_config.json become the
 * --lora-* options (the weights load after the base's: dt__tr_setup_resume). */
int dt__tr_lora_from(dt__train_run *t)
{
    if (!t->o.lora_from)
        return 0;
    if (dt_lora_peft_config_read(t->o.lora_from, &t->peft) < 0)
        return dt__tr_fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, "--lora-from");
    if (t->peft.left_out && dt__ddp_is_main(&t->ddp)) /* an image-text model's: this model has no vision tower */
        dt__cli_err("dtrain train: note: --lora-from %s: %zu adapter tensors of an image-text model's vision tower "
                    "or projector left out (the language model's load)\n", t->o.lora_from, t->peft.left_out);
    if (!(t->peft_targets = dt__join_names((const char *const *)t->peft.target_names)) ||
        (t->peft.save_names && !(t->peft_save = dt__join_names((const char *const *)t->peft.save_names))) ||
        (t->peft.layer_patterns && !(t->peft_pattern = dt__join_names((const char *const *)t->peft.layer_patterns))) ||
        (t->peft.layers && !(t->peft_layers = dt__join_layers(t->peft.layers, t->peft.params.nlayers))))
        return dt__tr_fail(1, "--lora-from");
    t->o.lora_targets = t->peft_targets;
    t->o.lora_save_modules = t->peft_save;
    t->o.lora_layers = t->peft_layers;
    t->o.lora_layers_pattern = t->peft_pattern;
    t->o.lora_bias = t->peft.params.bias ? dt__lora_bias_name(t->peft.params.bias) : NULL;
    t->o.lora_r = t->peft.params.r;
    t->o.lora_alpha = t->peft.params.alpha;
    t->o.lora_dropout = t->peft.params.dropout;
    t->o.lora_rslora = t->peft.params.rslora;
    t->o.lora_dora = t->peft.params.dora;
    t->o.lora_rank_pattern = dt_lora_pattern_json(t->peft.pattern, "rank_pattern");
    t->o.lora_alpha_pattern = dt_lora_pattern_json(t->peft.pattern, "alpha_pattern");
    t->o.lora_exclude_json = dt_lora_pattern_json(t->peft.pattern, "exclude_modules");
    return 0;
}

/* The LoRA and --freeze settings of the checkpoint this run evaluates
 * (dtrain eval --ckpt) or resumes: a command line that gives none takes
 * them (the model is rebuilt as it was trained); one that gives others is
 * refused after the build parameters are known (check_tuning). */
static int ckpt_tuning(dt__train_run *t, const char *eval_ckpt)
{
    char latest[1024] = "";
    const char *path = eval_ckpt;
    struct stat sb;
    if (!path && t->o.resume && !strcmp(t->o.resume, "auto")) {
        if (t->o.save && stat(t->o.save, &sb) == 0 && dt_trainer_ckpt_latest(t->o.save, latest, sizeof latest) >= 0 &&
            latest[0])
            path = latest;
        dt_error_clear();
    } else if (!path && t->o.resume) {
        path = t->o.resume;
    }
    if (!path || stat(path, &sb) != 0 || dt__tuning_read(path, &t->ck_tuning) < 0) {
        dt_error_clear(); /* not a dtrain checkpoint, or none: the load says what is wrong */
        return 0;
    }
    if (!t->ck_tuning.known)
        return 0;
    if (!(t->ck_path = strdup(path)))
        return dt__tr_fail(1, "--resume");
    if (t->o.lora_targets || t->o.freeze)
        return 0;
    t->o.freeze = t->ck_tuning.freeze;
    if (t->ck_tuning.lora_targets) {
        t->o.lora_targets = t->ck_tuning.lora_targets;
        t->o.lora_r = t->ck_tuning.lora_r;
        t->o.lora_alpha = t->ck_tuning.lora_alpha;
        t->o.lora_dropout = t->ck_tuning.lora_dropout;
        t->o.lora_rslora = t->ck_tuning.lora_rslora;
        t->o.lora_dora = t->ck_tuning.lora_dora;
        t->o.lora_save_modules = t->ck_tuning.lora_save;
        t->o.lora_layers = t->ck_tuning.lora_layers;
        t->o.lora_layers_pattern = t->ck_tuning.lora_layers_pattern;
        t->o.lora_bias = t->ck_tuning.lora_bias ? dt__lora_bias_name(t->ck_tuning.lora_bias) : NULL;
        t->o.lora_rank_pattern = t->ck_tuning.lora_pat[0];
        t->o.lora_alpha_pattern = t->ck_tuning.lora_pat[1];
        t->o.lora_exclude_json = t->ck_tuning.lora_pat[2];
    }
    return 0;
}

/* A command line whose LoRA/--freeze settings differ from its checkpoint's. */
static int check_tuning(dt__train_run *t, const char *eval_ckpt)
{
    const dt__tuning *c = &t->ck_tuning;
    if (!t->ck_path || dt__tuning_same(c, t->o.lora_targets, &t->lora, t->o.freeze))
        return 0;
    char ck[1500], here[1500];
    dt__tuning_describe(c->lora_targets, c->lora_r, c->lora_alpha, c->lora_dropout, c->lora_rslora, c->lora_dora,
                        c->lora_save, c->lora_layers, c->lora_layers_pattern, c->lora_bias,
                        (const char *const *)c->lora_pat, c->freeze, ck, sizeof ck);
    const char *pat[3];
    for (int k = 0; k < 3; k++)
        pat[k] = dt_lora_pattern_json(t->lora_pattern, (const char *const[]){"rank_pattern", "alpha_pattern",
                                                                            "exclude_modules"}[k]);
    dt__tuning_describe(t->o.lora_targets, t->lora.r, t->lora.alpha, t->lora.dropout, t->lora.rslora, t->lora.dora,
                        t->o.lora_save_modules, t->o.lora_layers, t->o.lora_layers_pattern, t->lora.bias, pat,
                        t->o.freeze, here, sizeof here);
    dt__cli_err("dtrain train: %s %s was trained with %s; this command has %s: give the checkpoint's settings, or "
                "none (they are then taken from it)\n", eval_ckpt ? "--ckpt" : "--resume", t->ck_path, ck, here);
    return 2;
}

/* --lora-rank-pattern, --lora-alpha-pattern and --lora-exclude-modules (or --lora-from's or the checkpoint's) as
 * t->lora's per-layer callbacks */
static int lora_patterns(dt__train_run *t)
{
    const char *ex = t->o.lora_exclude_json;
    if (t->o.lora_exclude_modules) { /* names, as a JSON list */
        cJSON *l = cJSON_CreateArray();
        char *buf = strdup(t->o.lora_exclude_modules);
        for (char *s = buf, *c; l && s; s = c) {
            if ((c = strchr(s, ',')))
                *c++ = 0;
            cJSON_AddItemToArray(l, cJSON_CreateString(s));
        }
        t->exclude_json = l && buf ? cJSON_PrintUnformatted(l) : NULL;
        cJSON_Delete(l);
        free(buf);
        if (!(ex = t->exclude_json))
            return dt__tr_fail(1, "--lora-exclude-modules");
    }
    if (!t->o.lora_rank_pattern && !t->o.lora_alpha_pattern && !ex)
        return 0;
    if (dt_lora_pattern_init(t->o.lora_rank_pattern, t->o.lora_alpha_pattern, ex, &t->lora_pattern) < 0)
        return dt__tr_fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, t->o.lora_from ? "--lora-from"
                           : t->ck_path && t->o.lora_targets == t->ck_tuning.lora_targets ? "the checkpoint's LoRA"
                                                                                        : "--lora-*-pattern");
    dt_lora_pattern_use(t->lora_pattern, &t->lora);
    return 0;
}

/* --freeze and --lora-*: the patterns and targets (each --freeze pattern
 * must match a parameter of the model: a typo would otherwise train
 * everything; freeze_report checks after the build). */
int dt__tr_freeze_patterns(dt__train_run *t, const char *eval_ckpt)
{
    int rc;
    if ((rc = dt__tr_lora_from(t)) || (rc = ckpt_tuning(t, eval_ckpt)))
        return rc;
    if (t->o.freeze && (rc = split_list("--freeze", t->o.freeze, &t->freeze_buf, &t->freeze)))
        return rc;
    if (!t->o.lora_targets) {
        if (t->o.save_lora) { /* --resume of a checkpoint without LoRA */
            dt__cli_err("dtrain train: --save-lora: this run has no LoRA adapters (--lora-targets, --lora-from, or "
                        "a LoRA checkpoint to resume)\n");
            return 2;
        }
        return check_tuning(t, eval_ckpt);
    }
    if ((rc = split_list("--lora-targets", t->o.lora_targets, &t->lora_buf, &t->lora_targets)))
        return rc;
    t->lora = dt_lora_params_default();
    if (t->o.lora_r)
        t->lora.r = t->o.lora_r;
    if (t->o.lora_alpha > 0)
        t->lora.alpha = (float)t->o.lora_alpha;
    t->lora.dropout = (float)t->o.lora_dropout;
    t->lora.rslora = t->o.lora_rslora;
    t->lora.dora = t->o.lora_dora;
    t->lora.targets = t->lora_targets;
    if (t->o.lora_save_modules) {
        if ((rc = split_list("--lora-modules-to-save", t->o.lora_save_modules, &t->save_buf, &t->save_modules)))
            return rc;
        t->lora.modules_to_save = t->save_modules;
    }
    if (t->o.lora_layers &&
        (rc = dt__parse_layers("--lora-layers-to-transform", t->o.lora_layers, &t->layers, &t->lora.nlayers)))
        return rc;
    t->lora.layers = t->layers;
    t->lora.bias = t->o.lora_bias ? (dt_lora_bias)dt__lora_bias_parse(t->o.lora_bias) : DT_LORA_BIAS_NONE;
    if (t->o.lora_layers_pattern) {
        if ((rc = split_list("--lora-layers-pattern", t->o.lora_layers_pattern, &t->pattern_buf, &t->patterns)))
            return rc;
        t->lora.layers_pattern = t->patterns;
    }
    if ((rc = lora_patterns(t)))
        return rc;
    return check_tuning(t, eval_ckpt);
}

static int freeze_report(dt__train_run *t)
{
    if (!t->freeze && !t->lora_targets)
        return 0;
    size_t nfrozen = 0, efrozen = 0;
    for (const char **f = t->freeze; f && *f; f++) {
        bool hit = false;
        for (size_t i = 0; i < dt_model_num_entries(t->model); i++) {
            dt_param_info p;
            dt_model_entry(t->model, i, &p);
            hit |= p.frozen && fnmatch(*f, p.name, 0) == 0;
        }
        if (!hit) {
            dt__cli_err("dtrain train: --freeze '%s' matches no parameter of --model %s (names as in its "
                        "checkpoints: dtrain ckpt info)\n", *f, t->o.model);
            return 2;
        }
    }
    for (size_t i = 0; i < dt_model_num_entries(t->model); i++) {
        dt_param_info p;
        dt_model_entry(t->model, i, &p);
        if (p.frozen && p.tied_to < 0)
            nfrozen++, efrozen += p.numel;
    }
    if (dt_model_param_count(t->model) == 0) {
        dt__cli_err("dtrain train: --freeze %s freezes every parameter: nothing left to train\n", t->o.freeze);
        return 2;
    }
    if (dt__ddp_is_main(&t->ddp) && !t->eval_json)
        printf("frozen: %zu parameters (%zu elements) by %s%s%s; %zu elements train\n", nfrozen, efrozen,
               t->lora_targets ? "LoRA (adapters on " : "--freeze ", t->lora_targets ? t->o.lora_targets : t->o.freeze,
               t->lora_targets ? ")" : "", dt_model_param_count(t->model));
    if (dt__ddp_is_main(&t->ddp) && t->lora_targets && !t->eval_json)
        printf("LoRA: r %lld, alpha %g, dropout %g, scaling %g%s%s%s\n", (long long)t->lora.r,
               (double)t->lora.alpha, (double)t->lora.dropout, (double)dt_lora_scaling(&t->lora),
               t->lora.rslora ? " (rsLoRA)" : "", t->lora.dora ? ", DoRA" : "",
               t->lora.layer_rank ? "; per layer by rank_pattern, alpha_pattern" : "");
    if (dt__ddp_is_main(&t->ddp) && t->lora_pattern)
        dt_lora_pattern_warn(t->lora_pattern, &t->lora);
    return 0;
}

/* --offload into the trainer's parameters. The CLI's sub-groups are 2^23
 * elements (32 MiB per state buffer), not DeepSpeed's 1e9: with 4 buffers
 * the state in memory stays bounded whatever the model size. */
static int offload_params(const dt__train_run *t, dt_offload_params *p)
{
    *p = dt_offload_params_default();
    if (!t->o.offload)
        return 0;
    if (dt_offload_parse(t->o.offload, p) < 0)
        return dt__tr_fail(2, "--offload");
    p->sub_group_size = (size_t)1 << 23;
    return 0;
}

/* Before anything large is allocated: the model state this rank will hold
 * (parameters, gradients, optimizer state; the ZeRO estimate of offload.h)
 * times the ranks on this machine, against MemAvailable and RLIMIT_AS. A
 * run that cannot fit fails here with the bytes it needs (exit 1), not
 * later by the OOM killer. The parameter count comes from a meta build
 * (layout only, nothing allocated). */
/* Shared CPUs: when this machine's ranks x compute threads exceed the cores
 * other processes leave free (the cores less the 1-minute load average of
 * dt_cpu_load_read; DT_LOADAVG=X stands in for the load, for tests), say so once with the
 * fix. Only for the default thread count (--threads not given; under dtrain
 * run the launcher's share of the cores): a count the user chose is theirs. */
void dt__tr_warn_oversubscribed(const dt__train_run *t)
{
    if (t->o.threads)
        return;
    double load = -1;
    int running;
    if (dt_cpu_load_read(&load, &running) < 0)
        load = -1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *lw = getenv("LOCAL_WORLD_SIZE");
    int64_t ranks = 1;
    if (lw && *lw && dt_parse_int("LOCAL_WORLD_SIZE", lw, 1, 1 << 20, &ranks) < 0)
        ranks = 1;
    const int threads = dt_get_num_threads();
    const double free_cores = (double)cores - load;
    if (load < 0 || cores < 1 || (double)(ranks * threads) <= free_cores + 0.5)
        return;
    dt__cli_err("dtrain train: warning: %lld rank%s x %d compute threads on %ld cores, of which about %.0f are free "
                "(load average %.1f): the threads wait for each other; --threads N with ranks x N <= the free "
                "cores runs faster here (docs/TRAINING.md, \"Shared CPUs\")\n",
                (long long)ranks, ranks == 1 ? "" : "s", threads, cores, free_cores > 0 ? free_cores : 0.0, load);
}

/* --pp: every stage's units, rank and parameters, so that two cuts (and
 * the memory lines at the end) can be told apart. */
void dt__tr_print_pipe_cut(const dt__train_run *t)
{
    int starts[129], S = 0;
    size_t bytes[128];
    if (dt_strategy_pipe_cut(dt_trainer_strategy(t->tr), starts, bytes, 129, &S) < 0)
        return;
    printf("pipeline stages balanced by %s: stage 0 has units [%d, %d)",
           t->ddp.pp_balance == DT_PIPE_BY_TIME     ? "measured time"
           : t->ddp.pp_balance == DT_PIPE_BY_PARAMS ? "parameter count"
                                                    : "compute",
           starts[0], starts[1]);
    for (int i = 1; i < S; i++)
        printf(", stage %d [%d, %d)", i, starts[i], starts[i + 1]);
    printf(" (stage i on pipeline rank i %% %d); parameters per stage:", t->ddp.pp);
    for (int i = 0; i < S; i++) {
        char b[32];
        dt__human_bytes((double)bytes[i], b, sizeof b);
        printf("%s %s", i ? "," : "", b);
    }
    printf(" (a shared one in each stage using it)\n");
}

/* The largest token id + 1 of the token file spec ("tokens:FILE"), 0 when
 * it cannot be read (setup_data then reports why). */
static int64_t tokens_max_plus_one(const char *spec)
{
    dt_tokens *tk = NULL;
    if (!spec || strncmp(spec, "tokens:", 7) || dt_tokens_open(spec + 7, 0, &tk) < 0)
        return 0;
    int64_t m = dt_tokens_max_plus_one(tk);
    dt_tokens_close(tk);
    return m;
}

/* GPT models without --vocab-size: the vocabulary is taken from where it is
 * known (said at start). With --vocab FILE it is the BPE vocabulary's size,
 * so its ids fit. Without, from the token files: an llm.c token file's
 * header holds no vocabulary size (words 3-255 are zero), so the largest id
 * of the training and validation files + 1 is what they tell; the model's
 * default (gpt2: GPT-2's 50257) is kept when every id fits it, so that a
 * model named for a tokenizer keeps that tokenizer's shape, and grown to
 * the largest id + 1 when it does not (the ids beyond it were an error
 * naming --vocab-size before); past 2^24 ids (the largest tokenizers have
 * about 2^18) the file is refused as not token ids. A resumed run reads the same files, so it
 * builds the same size. With --tokenizer FILE (text data) the tokenizer is
 * loaded here and its size is the vocabulary's. */
#define DT__TR_MAX_INFERRED_VOCAB (1 << 24)
int dt__tr_vocab_size_from_vocab(dt__train_run *t)
{
    t->vocab_from = "the model's default";
    const bool hf = !strncmp(t->o.model, "hf:", 3);
    if (hf)
        t->vocab_from = "its config.json's vocab_size";
    if (t->o.tokenizer) {
        if (t->eval_tok) /* dtrain eval --ckpt: the one the checkpoint keeps */
            t->tok = t->eval_tok, t->eval_tok = NULL;
        else if (dt_tokenizer_load(t->o.tokenizer, &t->tok) < 0)
            return dt__tr_fail(2, "--tokenizer");
        if (hf && t->o.tokenizer_of_model && dt__ddp_is_main(&t->ddp))
            printf("text data: encoded with %s (the model's; --tokenizer FILE gives another)\n", t->o.tokenizer);
        if (t->o.chat_template) { /* in place of the tokenizer's own */
            char *tx = NULL;
            size_t tn = 0;
            dt_status st = dt_file_read_all(t->o.chat_template, (size_t)1 << 20, &tx, &tn);
            if (st >= 0)
                st = dt_tokenizer_set_chat_template(t->tok, tx, tn, t->o.chat_template);
            free(tx);
            if (st < 0)
                return dt__tr_fail(2, "--chat-template");
        }
        if (hf) /* the directory's config.json sizes the vocabulary (the tokenizer is checked against it) */
            return 0;
        if (t->o.vocab_size) {
            t->vocab_from = "set by --vocab-size";
            return 0;
        }
        t->o.vocab_size = dt_tokenizer_vocab_size(t->tok);
        t->vocab_from = "the size of --tokenizer";
        if (dt__ddp_is_main(&t->ddp))
            printf("vocab size %lld (the size of --tokenizer %s; --vocab-size N overrides)\n",
                   (long long)t->o.vocab_size, t->o.tokenizer);
        return 0;
    }
    if (t->o.vocab_size) {
        t->vocab_from = "set by --vocab-size";
        return 0;
    }
    if (t->o.vocab) {
        t->vocab_from = "the size of --vocab";
        if (dt_bpe_load(t->o.vocab, &t->bpe) < 0)
            return dt__tr_fail(2, "--vocab");
        t->o.vocab_size = dt_bpe_vocab_size(t->bpe);
        if (dt__ddp_is_main(&t->ddp))
            printf("vocab size %lld (the size of --vocab %s; --vocab-size N overrides)\n",
                   (long long)t->o.vocab_size, t->o.vocab);
        return 0;
    }
    dt_gpt2_config g;
    if (dt_gpt2_config_by_name(t->o.model, &g) < 0)
        return 0; /* not a GPT model */
    int64_t m = tokens_max_plus_one(t->o.data), mv = tokens_max_plus_one(t->o.val_data);
    const char *from = mv > m ? t->o.val_data : t->o.data;
    if (mv > m)
        m = mv;
    if (m <= g.vocab_size)
        return 0; /* every id fits the model's default */
    if (m > DT__TR_MAX_INFERRED_VOCAB) /* no tokenizer has that many: not token ids, or another width */
    {
        dt__cli_err("dtrain train: %s: largest token id %lld would need a vocabulary of %lld (more than %d, larger "
                    "than any tokenizer's): the file does not hold a tokenizer's ids; give --vocab-size N if it "
                    "does\n", from, (long long)(m - 1), (long long)m, DT__TR_MAX_INFERRED_VOCAB);
        return 2;
    }
    t->o.vocab_size = m;
    t->vocab_from = "the token files' largest id + 1";
    if (dt__ddp_is_main(&t->ddp))
        printf("vocab size %lld (the largest token id of the token files + 1; --model %s's default is %lld; "
               "--vocab-size N overrides)\n",
               (long long)m, t->o.model, (long long)g.vocab_size);
    return 0;
}

/* The --vocab file's text as a quoted JSON string (malloc'd; NULL with a
 * message on error): a checkpoint keeps it, so dtrain generate --ckpt
 * needs no --vocab. The file is printable ASCII (dt_bpe_save). */
char *dt__tr_vocab_quoted(const char *opt, const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL, *q = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (f && n >= 0 && n < (64L << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) &&
        fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = 0;
        cJSON *j = cJSON_CreateString(buf);
        q = j ? cJSON_PrintUnformatted(j) : NULL;
        cJSON_Delete(j);
    }
    if (f)
        fclose(f);
    free(buf);
    if (!q)
        dt__cli_err("dtrain train: %s %s: cannot read it to keep it with the checkpoints\n", opt, path);
    return q;
}

/* The model refused its configuration: the flag named is --seq when the
 * model builds without it (a sequence longer than the block size), --model
 * otherwise. */
static int model_fail(dt__train_run *t, dt_model_config cfg)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    const char *what = "--model";
    dt_model *m;
    if (cfg.seq > 0) {
        cfg.seq = 0, cfg.build.meta = true;
        if (dt_model_create(t->o.model, t->o.seed, &cfg, &m, NULL) >= 0) {
            dt_model_free(m);
            what = "--seq";
        }
    }
    dt__cli_err("dtrain train: %s: %s\n", what, msg);
    return 2;
}

int dt__tr_check_memory(dt__train_run *t)
{
    dt_model_config cfg = dt__tr_model_config(t);
    cfg.build.meta = true;
    dt_model *m;
    if (dt_model_create(t->o.model, t->o.seed, &cfg, &m, NULL) < 0)
        return model_fail(t, cfg);
    const size_t psi = dt_model_param_count(m); /* trained: frozen parameters have no gradient or state */
    double frozen = 0;                          /* held whole on every rank all the same */
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info p;
        if (dt_model_entry(m, i, &p) >= 0 && p.frozen && p.tied_to < 0)
            frozen += (double)p.numel * (double)dt_dtype_size(p.dtype);
    }
    dt_model_free(m);
    dt_offload_params op;
    int rc = offload_params(t, &op);
    if (rc)
        return rc;
    dt_optim_kind kind;
    if (dt_optim_kind_parse(t->o.optimizer, &kind) < 0)
        return dt__tr_fail(2, "--optimizer");
    dt_mem_estimate e; /* the plan's per-rank model state (parameters f32 here, as the estimate always took them) */
    if (dt_plan_memory(t->ddp.plan, psi, 4, kind, t->o.momentum > 0, &op, &e) < 0)
        return dt__tr_fail(1, "memory estimate");
    e.params += frozen;
    e.total += frozen;
    char what[256], ranks[48] = "training";
    const int red = dt__ddp_reduce_size(&t->ddp);
    if (red > 1 && t->ddp.stage > 0)
        snprintf(ranks, sizeof ranks, "ZeRO stage %d on %d ranks:", t->ddp.stage, red);
    else if (red > 1)
        snprintf(ranks, sizeof ranks, "DDP on %d ranks:", red);
    snprintf(what, sizeof what, "%s %s (%zu parameters) with %s%s", ranks, t->o.model, psi, t->o.optimizer,
             op.device == DT_OFFLOAD_NVME ? ", state offloaded to nvme" : "");
    int local = t->ddp.pg ? dt_pg_local_size(t->ddp.pg) : 1;
    if (dt_mem_check(what, e.total, local) < 0)
        return dt__tr_fail(1, NULL);
    return 0;
}

int dt__tr_setup_model(dt__train_run *t)
{
    dt_model_config cfg = dt__tr_model_config(t);
    dt_precision_policy pol;
    if (precision_policy(&t->o, &pol))
        return 2;
    if (dt_precision_policy_build_params(&pol, &cfg.build) < 0) /* bf16/f16: the model holds its parameters so */
        return dt__tr_fail(2, "--precision");
    cfg.build.meta = dt__ddp_lazy_model(&t->ddp); /* ZeRO-3, --pp: each rank initialises what it holds */
    cfg.build.init = !strcmp(t->o.rng, "torch") ? DT_INIT_TORCH : DT_INIT_PHILOX; /* torch's: drawn once, by create */
    if (dt_model_create(t->o.model, t->o.seed, &cfg, &t->model, &t->desc) < 0)
        return model_fail(t, cfg);
    int frc = freeze_report(t);
    if (frc)
        return frc;
    t->lm = t->desc.input_dtype == DT_I64;
    if (t->o.act_ckpt) {
        dt_act_ckpt_params ap = dt_act_ckpt_params_default();
        bool on = true;
        if (t->o.cfg && dt_config_act_ckpt(t->o.cfg, &on, &ap) < 0) /* the config's activation_checkpointing */
            return dt__tr_fail(2, "--config");
        dt_status st = dt_model_desc_checkpoint(t->model, &t->desc, &ap, &t->ckpt_modules);
        if (st < 0)
            return dt__tr_fail(st == DT_ERR_UNSUPPORTED || st == DT_ERR_INVALID_ARG ? 2 : 1, "--activation-checkpointing");
        t->ckpt_profile = ap.profile;
    }
    if (cfg.build.meta && (t->freeze || t->lora_targets) && !strcmp(t->o.rng, "torch") &&
        dt_model_init_frozen(t->model, DT_INIT_TORCH, t->o.seed) < 0) /* the shards get torch's by init_range */
        return dt__tr_fail(1, "--rng torch");
    int64_t tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&t->desc, 1, &t->in_ndim, t->in_shape, &t->tgt_ndim, tshape, &tdt) < 0)
        return dt__tr_fail(1, "model input shape");
    t->classifier = !strcmp(t->o.model, "convnet");
    return 0;
}

/* tokens:FILE, or text:/jsonl:/parquet: encoded with --tokenizer (dt_dataset_text_open). */
static dt_status lm_data_open(dt__train_run *t, const char *spec, const dt_tokens_params *kp, dt_dataset **out)
{
    if (!strncmp(spec, "tokens:", 7))
        return dt_dataset_tokens_open(spec + 7, kp, out);
    return dt_dataset_text_open(spec, t->tok, kp, out);
}

/* The training and test splits as views of the opened datasets, cut to
 * --limit-train / --limit-test items where those are given. */
static dt_status limit_splits(dt__train_run *t)
{
    int64_t ntr = dt_dataset_length(t->base_train), nte = dt_dataset_length(t->base_test);
    if (t->o.limit_train > 0 && t->o.limit_train < ntr)
        ntr = t->o.limit_train;
    if (t->o.limit_test > 0 && t->o.limit_test < nte)
        nte = t->o.limit_test;
    dt_status st = dt_dataset_subset_init(t->base_train, 0, ntr, &t->train);
    return st < 0 ? st : dt_dataset_subset_init(t->base_test, 0, nte, &t->test);
}

int dt__tr_setup_data(dt__train_run *t)
{
    dt_status st;
    char what[300];
    snprintf(what, sizeof what, "--data %s", t->o.data);
    if (t->lm) {
        /* llm.c's layout: disjoint windows of T + 1 tokens (stride T), the
         * training ones in the sampler's shuffled order, validation in order */
        dt_tokens_params kp = dt_tokens_params_default();
        kp.seq_len = t->desc.input_shape[0];
        kp.vocab_size = t->desc.input_classes;
        kp.completion_only_loss = t->o.loss_mask; /* prompt positions get label -100: the loss skips them */
        kp.assistant_only_loss = t->o.assistant_only_loss; /* and those outside the assistant's turns */
        kp.per_record = !strcmp(t->o.packing, "off"); /* one record a sample, padded */
        const char *vspec = t->o.val_data ? t->o.val_data : t->o.data, *val = vspec + 7;
        if ((st = lm_data_open(t, t->o.data, &kp, &t->base_train)) >= 0 &&
            (st = lm_data_open(t, vspec, &kp, &t->base_test)) < 0)
            snprintf(what, sizeof what, "--val-data %s", vspec);
        if (st < 0 && st != DT_ERR_NO_MEMORY &&
            (strstr(dt_last_error(), ">= vocab size") || strstr(dt_last_error(), "more than the vocab size"))) {
            /* a token (or a tokenizer) the model's vocabulary does not have: say what sizes it */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", dt_last_error());
            const bool hf = !strncmp(t->o.model, "hf:", 3);
            dt__cli_err("dtrain train: %s: %s (the model's vocabulary: %s%s)\n", what, msg,
                        t->vocab_from ? t->vocab_from : "the model's default",
                        hf ? ": is --tokenizer this model's?" : "; --vocab-size N sets it");
            return 2;
        }
        if (st < 0)
            return dt__tr_fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
        if (t->o.sample_every > 0 && dt_tokens_open(val, 0, &t->sample_src) < 0)
            return dt__tr_fail(2, what);
        if (t->o.vocab && !t->bpe && dt_bpe_load(t->o.vocab, &t->bpe) < 0)
            return dt__tr_fail(2, "--vocab");
        if (limit_splits(t) < 0)
            return dt__tr_fail(1, what);
    } else if (!strcmp(t->o.data, "random")) {
        dt_random_dataset_params rp = dt_random_dataset_params_default();
        int64_t ntest = t->o.limit_test > 0 ? t->o.limit_test : 1000;
        if (!t->o.random_items) /* not given (the parser leaves it 0: it applies to random data only) */
            t->o.random_items = 6000;
        rp.length = t->o.random_items + ntest;
        rp.x_ndim = t->in_ndim - 1;
        for (int d = 0; d < rp.x_ndim; d++)
            rp.x_shape[d] = t->in_shape[d + 1];
        rp.num_classes = 10;
        rp.seed = t->o.seed;
        if ((st = dt_dataset_random_init(&rp, &t->base_train)) < 0)
            return dt__tr_fail(2, what);
        /* --limit-train cuts the training split as for any data (it was ignored here: 6000 items trained) */
        int64_t ntr = t->o.limit_train > 0 && t->o.limit_train < t->o.random_items ? t->o.limit_train
                                                                                   : t->o.random_items;
        if ((st = dt_dataset_subset_init(t->base_train, 0, ntr, &t->train)) < 0 ||
            (st = dt_dataset_subset_init(t->base_train, t->o.random_items, ntest, &t->test)) < 0)
            return dt__tr_fail(1, what);
    } else {
        /* Out of memory is a runtime failure (exit 1, docs/TRAINING.md);
         * everything else about the data is bad input (exit 2). */
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TRAIN, &t->base_train)) < 0)
            return dt__tr_fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TEST, &t->base_test)) < 0)
            return dt__tr_fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
        const dt_dataset_info *info = dt_dataset_get_info(t->base_train);
        /* Every split against the model's input: each batch is viewed as
         * [B, model input], so a test set of other dimensions would be read
         * out of bounds. */
        if (dt_model_desc_check_dataset(&t->desc, t->base_train) < 0) {
            dt__cli_err("dtrain train: --data %s: %s\n", t->o.data, dt_last_error());
            return 2;
        }
        if (dt_model_desc_check_dataset(&t->desc, t->base_test) < 0) {
            char tr[160];
            dt_escape(dt_dataset_source(t->base_train), tr, sizeof tr);
            dt__cli_err("dtrain train: --data %s: %s (the training split, %s, matches the model)\n", t->o.data,
                    dt_last_error(), tr);
            return 2;
        }
        int64_t ncls = info->num_classes, mcls = t->desc.num_classes;
        if (dt_dataset_get_info(t->base_test)->num_classes > ncls)
            ncls = dt_dataset_get_info(t->base_test)->num_classes;
        if (mcls > 0 && ncls > mcls) {
            dt__cli_err("dtrain train: --data %s: labels go up to %lld, --model %s has %lld "
                            "classes\n", t->o.data, (long long)ncls - 1, t->o.model,
                    (long long)mcls);
            return 2;
        }
        /* npy:X.npy alone gives every item label 0: a classifier trained on it reported 100% accuracy */
        if (t->classifier && ncls == 0) {
            dt__cli_err("dtrain train: --data %s: the data has no labels (every item's label would be 0); --model %s "
                        "is a classifier: give the labels too (npy:X.npy,Y.npy)\n", t->o.data, t->o.model);
            return 2;
        }
        if (limit_splits(t) < 0)
            return dt__tr_fail(1, what);
    }
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = t->o.batch;
    lp.prefetch = (int)t->o.prefetch;
    /* DDP: every rank evaluates its own contiguous share of the test set */
    if (t->ddp.world > 1) {
        int64_t lo, hi;
        dt_plan_eval_range(t->ddp.plan, dt_dataset_length(t->test), &lo, &hi);
        if (dt_dataset_subset_init(t->test, lo, hi - lo, &t->test_shard) < 0)
            return dt__tr_fail(1, what);
    }
    dt_dataset *test_set = t->test_shard ? t->test_shard : t->test;
    if (dt_plan_sampler(t->ddp.plan, dt_dataset_length(t->train), t->o.seed,
                        !strcmp(t->o.rng, "torch") ? DT_SHUFFLE_TORCH : DT_SHUFFLE_PHILOX, &t->train_sampler) < 0)
        return dt__tr_fail(1, "training data loader");
    /* a pipeline cuts every batch into --micro-batches equal parts: an epoch's short last batch that does not
       split is dropped (as drop_last), said once; it stopped the run at the epoch's end */
    const int64_t tail = dt_sampler_length(t->train_sampler) % t->o.batch;
    lp.drop_last = t->o.drop_last;
    if (t->ddp.pp > 1 && tail && tail % t->ddp.pp_micro && !t->o.drop_last) {
        lp.drop_last = true;
        if (dt__ddp_is_main(&t->ddp))
            printf("pipeline: each epoch's last %lld samples (per replica) do not split into %d micro-batches: dropped "
                   "(batch %lld)\n", (long long)tail, t->ddp.pp_micro, (long long)t->o.batch);
    }
    if (dt_loader_init(t->train, t->train_sampler, &lp, &t->train_loader) < 0)
        return dt__tr_fail(1, "training data loader");
    lp.drop_last = false;
    /* evaluation: bigger batches, no grads (language models: the logits of a
     * batch are B T V floats, so the training batch) */
    lp.batch_size = t->lm || t->o.batch > 500 ? t->o.batch : 500;
    if (!t->o.no_eval && /* --no-eval: no test loader, no memory for its batches */
        (dt_sampler_sequential_init(dt_dataset_length(test_set), &t->test_sampler) < 0 ||
         dt_loader_init(test_set, t->test_sampler, &lp, &t->test_loader) < 0))
        return dt__tr_fail(1, "test data loader");
    char why[160] = "";
    if (t->lm) /* a window is --seq + 1 tokens */
        snprintf(why, sizeof why, " (no window of --seq %lld + 1 tokens: the data holds fewer)",
                 (long long)t->desc.input_shape[0]);
    if (dt_loader_num_batches(t->train_loader) == 0) {
        dt__cli_err("dtrain train: --data %s: the training set is empty%s\n", t->o.data, why);
        return 2;
    }
    /* an empty test set evaluated to "test loss: nan" and exit 0 */
    if (!t->o.no_eval && dt_dataset_length(t->test) == 0) {
        if (t->lm)
            dt__cli_err("dtrain train: --val-data %s: the validation set is empty%s; give more data%s\n",
                        t->o.val_data ? t->o.val_data : t->o.data, why, t->eval_only ? "" : " or --no-eval");
        else
            dt__cli_err("dtrain train: --data %s: the test set is empty (%lld training items%s); give more data%s\n",
                        t->o.data, (long long)dt_dataset_length(t->train),
                        !strncmp(t->o.data, "npy:", 4) || !strncmp(t->o.data, "csv:", 4) ? ", test=F holds out none"
                                                                                         : "",
                        t->eval_only ? "" : ", a larger held-out fraction or --no-eval");
        return 2;
    }
    return 0;
}

/* The strategy (train_ddp.c). --pp-balance time: the stages are balanced
 * by the units' times on the first micro-batch of the training data (its
 * first batch / micro-batches items in the dataset's order: the same rows,
 * so the same shape, on every rank), viewed as the trainer views a batch. */
int dt__tr_wrap(dt__train_run *t)
{
    if (t->ddp.pp <= 1 || t->ddp.pp_balance != DT_PIPE_BY_TIME)
        return dt__ddp_wrap(&t->ddp, t->model);
    const dt_dataset_info *info = dt_dataset_get_info(t->train);
    int64_t n = t->o.batch / t->ddp.pp_micro, len = dt_dataset_length(t->train);
    n = n < len ? n : len;
    n = n > 0 ? n : 1;
    size_t xb = dt_dataset_x_bytes(t->train), yb = dt_dataset_y_bytes(t->train);
    int64_t *idx = calloc((size_t)n, sizeof *idx);
    void *x = calloc((size_t)n, xb ? xb : 1), *y = calloc((size_t)n, yb ? yb : 1);
    int rc = 0;
    if (info->x_ndim + 1 > DT_MAX_DIMS) {
        dt__cli_err("dtrain train: --pp-balance time: items of %d dims (at most %d)\n", info->x_ndim,
                    DT_MAX_DIMS - 1);
        rc = 2;
    } else if (!idx || !x || !y) {
        dt__cli_err("dtrain train: --pp-balance time: out of memory for the sample micro-batch\n");
        rc = 1;
    } else {
        for (int64_t i = 0; i < n; i++)
            idx[i] = i;
        int64_t shape[DT_MAX_DIMS] = {n};
        for (int d = 0; d < info->x_ndim; d++)
            shape[d + 1] = info->x_shape[d];
        dt_trainer_batch b = dt_trainer_batch_make(x, info->x_dtype, info->x_ndim + 1, shape, NULL, DT_F32, 0, NULL);
        if (dt_dataset_get_batch(t->train, idx, n, x, y) < 0) {
            rc = dt__tr_fail(2, "--pp-balance time: reading the sample micro-batch");
        } else {
            t->ddp.pp_sample = &b;
            rc = dt__ddp_wrap(&t->ddp, t->model); /* the strategy keeps a copy */
            t->ddp.pp_sample = NULL;
        }
    }
    free(idx);
    free(x);
    free(y);
    return rc;
}

/* The whole world's group (NULL: one process). */
dt_pg *dt__tr_world_of(const dt__train_run *t) { return t->ddp.world_pg ? t->ddp.world_pg : t->ddp.pg; }

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The byte counters (every rank, before the first step): the peers' nodes
 * (one small all-gather: the cross-node split) and the counts so far. */
int dt__tr_comm_start(dt__train_run *t)
{
    dt_pg *w = dt__tr_world_of(t);
    t->comm_first_step = -1;
    if (!w || dt_pg_size(w) < 2)
        return 0;
    dt_pg_topo topo;
    if (dt_pg_topology(w, &topo) < 0)
        return dt__tr_fail(1, "the ranks' nodes (for the byte counters)");
    if (dt_pg_traffic_read(w, &t->comm_prev, NULL, 0) < 0)
        return dt__tr_fail(1, "the byte counters");
    t->comm_on = t->comm_prev.counted;
    return 0;
}

/* The end record's measured figures: the largest peak RSS of the ranks (a
 * MAX over the world, collective) and the median step time. */
int dt__tr_measure(dt__train_run *t)
{
    dt_trainer_memory mem;
    double rss = dt_trainer_memory_get(t->tr, &mem) == DT_OK ? (double)mem.peak_rss : 0;
    dt_pg *w = dt__tr_world_of(t);
    if (w && dt_pg_allreduce(w, DT_IN_PLACE, &rss, 1, DT_F64, DT_REDUCE_MAX) < 0)
        return dt__tr_fail(1, "the peak memory of the ranks");
    t->measured.peak_rss_bytes = rss;
    dt_pg_traffic now;
    if (t->comm_on && t->comm_first_step >= 0 && t->global_step > t->comm_first_step &&
        dt_pg_traffic_read(w, &now, NULL, 0) >= 0 && now.counted) {
        /* every rank's bytes since its first step ended, summed (exact below 2^53) */
        double b[2] = {(double)(now.sent - t->comm_first.sent),
                       (double)(now.sent_cross_node - t->comm_first.sent_cross_node)};
        if (dt_pg_allreduce(w, DT_IN_PLACE, b, 2, DT_F64, DT_REDUCE_SUM) < 0)
            return dt__tr_fail(1, "the bytes the ranks sent");
        t->measured.comm_counted = 1;
        t->measured.comm_nodes_known = now.nodes_known;
        t->measured.comm_bytes_sent = b[0];
        t->measured.comm_bytes_cross_node = b[1];
        t->measured.comm_steps = (double)(t->global_step - t->comm_first_step);
    }
    /* the job's CPU time per step (every rank's process, summed): what a step costs in core-seconds, which
       the load of other processes on shared cores does not inflate as it does the step's wall time */
    double cpu = t->ncpu_steps > 1 ? (t->cpu_last_s - t->cpu_first_s) / (double)(t->ncpu_steps - 1) : 0;
    if (w && dt_pg_allreduce(w, DT_IN_PLACE, &cpu, 1, DT_F64, DT_REDUCE_SUM) < 0)
        return dt__tr_fail(1, "the CPU time of the ranks");
    t->measured.step_cpu_ms = 1e3 * cpu;
    if (t->nstep_s > 0) {
        qsort(t->step_s, (size_t)t->nstep_s, sizeof *t->step_s, dbl_cmp);
        const int64_t n = t->nstep_s;
        t->measured.step_ms = 1e3 * (n % 2 ? t->step_s[n / 2] : 0.5 * (t->step_s[n / 2 - 1] + t->step_s[n / 2]));
    }
    return 0;
}


/* The scalars' monitor on rank 0 (not for dtrain eval): --tensorboard DIR,
 * as the config's "tensorboard" block with output_path DIR and no
 * job_name, over the config's; its "csv_monitor" block. */
static int open_monitor(dt__train_run *t)
{
    if (t->eval_only || !dt__ddp_is_main(&t->ddp))
        return 0;
    if (t->o.tensorboard) {
        char q[4200];
        dt__json_quote(t->o.tensorboard, q, sizeof q);
        if (dt_config_set(t->o.cfg, "tensorboard.enabled", "true", DT_CONFIG_FROM_CLI, "--tensorboard") < 0 ||
            dt_config_set(t->o.cfg, "tensorboard.output_path", q, DT_CONFIG_FROM_CLI, "--tensorboard") < 0 ||
            dt_config_set(t->o.cfg, "tensorboard.job_name", "\"\"", DT_CONFIG_FROM_CLI, "--tensorboard") < 0)
            return dt__tr_fail(2, "--tensorboard");
    }
    if (dt_monitor_open_config(t->o.cfg, &t->monitor) < 0)
        return dt__tr_fail(2, t->o.tensorboard ? "--tensorboard" : "--config");
    return 0;
}

/* --trace DIR: create DIR (and its parents, not through a symlink), open the
 * tracer and remember DIR for the merge at the end. */
static int trace_dir(dt__train_run *t, const dt_trace_params *tp)
{
    const char *dir = tp->dir;
    if (!dir)
        return 0;
    if (dt_dir_make(dir) < 0)
        return dt__tr_fail(2, "--trace");
    snprintf(t->trace, sizeof t->trace, "%s", dir);
    /* opened here, with this process's rank in the world (a pipeline
     * trainer's own rank is its data-parallel one); the trainer records
     * into it */
    dt_trace_params p = *tp;
    dt_pg *w = dt__tr_world_of(t);
    if (dt_trace_open(&p, w ? dt_pg_rank(w) : 0, w ? dt_pg_size(w) : 1) < 0)
        return dt__tr_fail(2, "--trace");
    return 0;
}

/* The ranks' timelines on one clock: rank 0's (collective over the world). */
static int trace_align(dt__train_run *t)
{
    double off = 0, base = 0;
    dt_pg *w = dt__tr_world_of(t);
    if (!t->trace[0] || !w)
        return 0;
    if (dt_pg_clock_offset(w, &off, &base) < 0)
        return dt__tr_fail(1, "--trace");
    dt_trace_set_offset(off, base);
    return 0;
}

/* After the trainer ended: this rank's file (closing the tracer), every
 * rank's (a barrier), then rank 0 merges them into DIR/trace.json. */
int dt__tr_trace_merge(dt__train_run *t)
{
    dt_pg *w = dt__tr_world_of(t);
    if (!t->trace[0])
        return 0;
    if (dt_trace_close() < 0)
        return dt__tr_fail(1, "--trace");
    if (w && dt_pg_barrier(w) < 0)
        return dt__tr_fail(1, "--trace");
    if (w && dt_pg_rank(w) != 0)
        return 0;
    if (dt_trace_merge(t->trace, w ? dt_pg_size(w) : 1, NULL) < 0)
        return dt__tr_fail(1, "--trace");
    if (t->prog.mode != DT__PROGRESS_NONE)
        printf("trace: %s/trace.json (steps %s)\n", t->trace, t->o.trace_steps ? t->o.trace_steps : "3:5");
    return 0;
}

/* The trainer: strategy (train_ddp.c), optimizer and schedule from the
 * options. */
int dt__tr_setup_trainer(dt__train_run *t)
{
    dt_trainer_params tp = dt_trainer_params_default();
    if (dt_optim_kind_parse(t->o.optimizer, &tp.optimizer) < 0)
        return dt__tr_fail(2, "--optimizer");
    /* PyTorch's optimizers decay every parameter unless told otherwise;
     * so do we (no_decay_1d false), to match its accuracy band. */
    const double wd = t->o.weight_decay;
    tp.sgd.lr = tp.adam.lr = tp.adamw.lr = tp.lamb.lr = tp.lion.lr = t->o.lr;
    tp.sgd.momentum = t->o.momentum;
    if (wd >= 0)
        tp.sgd.weight_decay = tp.adam.weight_decay = tp.adamw.weight_decay = tp.lamb.weight_decay =
            tp.lion.weight_decay = wd;
    if (t->o.beta_set) {
        tp.adam.beta1 = tp.adamw.beta1 = tp.lamb.beta1 = tp.lion.beta1 = t->o.beta[0];
        tp.adam.beta2 = tp.adamw.beta2 = tp.lamb.beta2 = tp.lion.beta2 = t->o.beta[1];
    }
    if (t->o.eps > 0)
        tp.adam.eps = tp.adamw.eps = tp.lamb.eps = t->o.eps;
    /* the schedule counts optimizer steps: with --grad-accum N one per N
     * batches, plus one for an epoch's last, partial accumulation */
    int64_t nb = dt_loader_num_batches(t->train_loader), accum = t->o.grad_accum > 0 ? t->o.grad_accum : 1;
    int64_t spe = (nb + accum - 1) / accum;
    if (dt_sched_kind_parse(t->o.lr_schedule, &tp.sched.kind) < 0)
        return dt__tr_fail(2, "--lr-schedule");
    tp.sched.step_size = t->o.step_size > 0 ? t->o.step_size : spe;
    tp.sched.gamma = dt__train_gamma(&t->o);
    tp.sched.warmup_steps = t->o.warmup;
    /* the run's length: --max-steps when given (HF Trainer: max_steps overrides num_train_epochs) */
    tp.sched.total_steps = t->o.max_steps > 0 ? t->o.max_steps : spe * t->o.epochs;
    t->spe = spe > 0 ? spe : 1;
    t->epochs = t->o.max_steps > 0 ? (t->o.max_steps + t->spe - 1) / t->spe : t->o.epochs;
    tp.sched.min_lr = 0;
    tp.grad_accum = accum;
    tp.clip_grad_norm = t->o.clip_grad_norm;
    tp.loss_fn = dt_model_desc_loss_fn; /* the zoo model's own loss */
    tp.loss_ud = &t->desc;
    tp.same_batch = t->ddp.cp; /* --cp: a replica's cp ranks share its batch */
    int rc = offload_params(t, &tp.offload);
    if (rc)
        return rc;
    if (precision_policy(&t->o, &tp.precision))
        return 2;
    dt_plan_precision(t->ddp.plan, &tp.precision); /* a DDP compression hook's reduce dtype */
    /* fp16 scales the loss (dynamic unless --loss-scale X > 0); any
     * precision may ask for a scale with --loss-scale */
    tp.use_scaler = tp.precision.param_dtype == DT_F16 || t->o.loss_scale >= 0;
    tp.scaler.loss_scale = t->o.loss_scale > 0 ? t->o.loss_scale : 0;
    if (dt_loss_scaler_kind_parse(t->o.scaler, &tp.scaler.kind) < 0)
        return dt__tr_fail(2, "--scaler");
    tp.scaler.initial_scale_power = (int)t->o.initial_scale_power;
    tp.scaler.init_scale = ldexp(1.0, (int)t->o.initial_scale_power);
    if (t->o.loss_scale_window > 0) /* else each rule's default: 1000, 2000 */
        tp.scaler.loss_scale_window = tp.scaler.growth_interval = t->o.loss_scale_window;
    tp.scaler.hysteresis = (int)t->o.hysteresis;
    tp.scaler.min_loss_scale = t->o.min_loss_scale;
    tp.trace.dir = t->o.trace;
    if (t->o.trace_steps && dt_trace_parse_steps(t->o.trace_steps, &tp.trace) < 0)
        return dt__tr_fail(2, "--trace-steps");
    if (t->o.cfg && dt_trainer_params_apply_config(t->o.cfg, &tp) < 0) /* the config's keys over the flags' */
        return dt__tr_fail(2, "--config");
    double b1; /* OneCycle's momentum decay grows Adam's first beta: past 1 before the run's end, refused now */
    const int64_t last = (t->o.max_steps > 0 ? t->o.max_steps : spe * t->o.epochs) - 1;
    /* a trace window past the run's end records nothing: said now (a --max-steps 2 run with --trace and the
       default 3:5 wrote an empty trace.json without a word; trace summary then finds no event) */
    if (tp.trace.dir && tp.trace.dir[0] && tp.trace.step_begin > last + 1 && dt__ddp_is_main(&t->ddp))
        dt__cli_err("dtrain train: warning: --trace-steps %lld:%lld starts after the run's last step (%lld): the "
                    "trace will hold no step; give --trace-steps 1:%lld\n",
                    (long long)tp.trace.step_begin, (long long)tp.trace.step_end, (long long)last + 1,
                    (long long)last + 2);
    if (tp.optimizer != DT_OPTIM_SGD && dt_sched_beta1(&tp.sched, last, &b1) && !(b1 >= 0 && b1 < 1)) {
        dt__cli_err("dtrain train: --config: OneCycle's momentum reaches %g by the run's last step (%lld): "
                    "decay_mom_rate %g grows it every decay_step_size %lld steps after the cycle, and a beta must be "
                    "below 1\n", b1, (long long)last + 1, tp.sched.cycle.decay_mom_rate,
                    (long long)tp.sched.cycle.decay_steps);
        return 2;
    }
    t->sched = tp.sched;
    if ((rc = trace_dir(t, &tp.trace)))
        return rc;
    if ((rc = open_monitor(t)))
        return rc;
    tp.monitor = t->monitor;
    t->wall_clock = tp.wall_clock_breakdown;
    if (dt_trainer_init(t->model, dt__ddp_take_strategy(&t->ddp), &tp, &t->tr) < 0)
        return dt__tr_fail(dt_last_status() == DT_ERR_INVALID_ARG || dt_last_status() == DT_ERR_UNSUPPORTED ? 2 : 1,
                           "trainer"); /* a combination the model or the strategy does not implement: the usage's */
    return trace_align(t);
}
