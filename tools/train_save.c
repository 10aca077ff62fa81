/* dtrain train's checkpoints and outputs (train_run.h): the options a
 * checkpoint keeps (its dtrain.user metadata), saving, the end-of-run
 * exports (--save-hf, --save-lora, ...), and the start of a run from a
 * checkpoint (--resume, --init-from, --lora-from). */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"
#include "train_run.h"

#include "dtrain/autograd.h"
#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/generate.h"
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

/* A checkpoint that does not fit this run or is damaged: bad input (exit 2). */
bool dt__tr_bad_input_status(dt_status st)
{
    return st == DT_ERR_MISMATCH || st == DT_ERR_FORMAT || st == DT_ERR_SHAPE || st == DT_ERR_DTYPE ||
           st == DT_ERR_NOT_FOUND;
}

/* The JSON object json (room for cap bytes) with "key": quoted (a file's text as a JSON string, cJSON_free'd
 * here) added at its end; NULL quoted: nothing. */
static void add_file_key(char *json, size_t cap, const char *key, char *quoted)
{
    if (!quoted)
        return;
    size_t l = strlen(json);
    snprintf(json + l - 1, cap - l + 1, ",\"%s\":%s}", key, quoted);
    cJSON_free(quoted);
}


/* The options a checkpoint keeps, so that `dtrain eval --ckpt` builds the
 * same model and data without being told. */
int dt__tr_make_user_json(dt__train_run *t)
{
    char data_q[1200];
    dt__json_quote(t->o.data, data_q, sizeof data_q);
    char val_q[1200], lm[1500] = "";
    if (t->lm) { /* the GPT configuration and the validation data (dtrain eval, dtrain generate --ckpt) */
        dt__json_quote(t->o.val_data ? t->o.val_data : "", val_q, sizeof val_q);
        dt_gpt2_config g;
        memset(&g, 0, sizeof g); /* a Llama or hf:DIR model: its own configuration (0: not saved) */
        dt_gpt2_config_by_name(t->o.model, &g);
        dt_error_clear();
        snprintf(lm, sizeof lm,
                 ",\"val_data\":%s,\"seq\":%lld,\"n_layer\":%lld,\"n_head\":%lld,\"n_embd\":%lld,"
                 "\"block_size\":%lld,\"vocab_size\":%lld",
                 val_q, (long long)t->desc.input_shape[0], (long long)(t->o.n_layer ? t->o.n_layer : g.n_layer),
                 (long long)(t->o.n_head ? t->o.n_head : g.n_head), (long long)(t->o.n_embd ? t->o.n_embd : g.n_embd),
                 (long long)(t->o.block_size ? t->o.block_size : g.block_size),
                 (long long)(t->o.vocab_size ? t->o.vocab_size : g.vocab_size));
        if (t->o.dropout > 0) /* the model's dropout: ckpt convert --hf writes it into config.json */
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), ",\"dropout\":%.9g", t->o.dropout);
        if (t->o.loss_mask) /* the data's prompt targets are ignored: dtrain eval --ckpt evaluates alike */
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), ",\"loss_mask\":true");
        if (t->o.assistant_only_loss) /* likewise the targets outside the assistant's turns */
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), ",\"assistant_only_loss\":true");
        if (!strcmp(t->o.packing, "off")) /* and one record a sample */
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), ",\"packing\":\"off\"");
    } else if (t->o.mlp_dim || t->o.mlp_hidden) { /* the MLP's widths (0: the default) */
        snprintf(lm, sizeof lm, ",\"mlp_dim\":%lld,\"mlp_hidden\":%lld", (long long)t->o.mlp_dim,
                 (long long)t->o.mlp_hidden);
    }
    char *vq = NULL, *tq = NULL, *cq = NULL, *jq = NULL; /* the vocabulary or tokenizer.json goes with the checkpoint */
    if (t->lm && t->o.vocab && t->o.save && !(vq = dt__tr_vocab_quoted("--vocab", t->o.vocab)))
        return 2;
    if (t->lm && t->o.tokenizer && t->o.save) {
        char tp[4200], cp[4300];
        struct stat sb;
        bool dir = stat(t->o.tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode); /* a model directory holding one */
        snprintf(tp, sizeof tp, dir ? "%s/tokenizer.json" : "%s", t->o.tokenizer);
        if (!(tq = dt__tr_vocab_quoted("--tokenizer", tp))) {
            cJSON_free(vq);
            return 2;
        }
        /* and the tokenizer_config.json beside it (its bos and eos tokens: eval and generate --ckpt end documents
           with the token this run did) */
        char *slash = strrchr(tp, '/');
        snprintf(cp, sizeof cp, "%.*s%stokenizer_config.json", slash ? (int)(slash - tp) : 0, tp, slash ? "/" : "");
        bool bad = lstat(cp, &sb) == 0 && S_ISREG(sb.st_mode) && !(cq = dt__tr_vocab_quoted("--tokenizer", cp));
        /* and a chat_template.jinja beside it (the template that wins over the config's), or --chat-template's */
        snprintf(cp, sizeof cp, "%.*s%schat_template.jinja", slash ? (int)(slash - tp) : 0, tp, slash ? "/" : "");
        if (t->o.chat_template && t->tok) { /* the one the run renders with (read at the start) */
            cJSON *s = cJSON_CreateString(dt_tokenizer_chat_template(t->tok));
            jq = s ? cJSON_PrintUnformatted(s) : NULL;
            cJSON_Delete(s);
            bad = bad || !jq;
        } else
            bad = bad || (lstat(cp, &sb) == 0 && S_ISREG(sb.st_mode) &&
                          !(jq = dt__tr_vocab_quoted("--tokenizer", cp)));
        if (bad) {
            cJSON_free(vq);
            cJSON_free(tq);
            cJSON_free(cq);
            return 2;
        }
    }
    size_t n = strlen(data_q) + strlen(lm) + (vq ? strlen(vq) : 0) + (tq ? strlen(tq) : 0) + (cq ? strlen(cq) : 0) +
               (jq ? strlen(jq) : 0) + 512;
    if (!(t->user_json = malloc(n))) {
        cJSON_free(vq);
        cJSON_free(tq);
        cJSON_free(cq);
        cJSON_free(jq);
        return dt__tr_fail(1, "out of memory");
    }
    snprintf(t->user_json, n,
             "{\"model\":\"%s\",\"data\":%s,\"seed\":%llu,\"rng\":\"%s\",\"batch\":%lld,"
             "\"random_items\":%lld,\"limit_train\":%lld,\"limit_test\":%lld,\"world_size\":%d,\"grad_accum\":%lld,"
             "\"lr_schedule\":\"%s\",\"warmup\":%lld,\"lr\":%.17g%s}",
             t->o.model, data_q, (unsigned long long)t->o.seed, t->o.rng, (long long)t->o.batch,
             (long long)t->o.random_items, (long long)t->o.limit_train, (long long)t->o.limit_test, t->ddp.world,
             (long long)t->o.grad_accum, t->o.lr_schedule ? t->o.lr_schedule : "constant", (long long)t->o.warmup,
             t->o.lr, lm);
    add_file_key(t->user_json, n, "vocab_bpe", vq);
    add_file_key(t->user_json, n, "tokenizer_json", tq);
    add_file_key(t->user_json, n, "tokenizer_config_json", cq);
    add_file_key(t->user_json, n, "chat_template_jinja", jq);
    /* the LoRA and --freeze settings (eval/generate --ckpt and --resume rebuild the model with them) */
    char *tj = dt__tuning_json(t->lora_targets ? t->o.lora_targets : NULL, &t->lora, t->o.freeze);
    size_t l = strlen(t->user_json);
    char *u = tj ? realloc(t->user_json, l + strlen(tj) + 2) : NULL;
    if (!u) {
        cJSON_free(tj);
        return dt__tr_fail(1, "out of memory");
    }
    t->user_json = u;
    snprintf(u + l - 1, strlen(tj) + 2, ",%s", tj + 1); /* tj's members after the others */
    cJSON_free(tj);
    return 0;
}

int dt__tr_save_ckpt(dt__train_run *t)
{
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    sp.async = t->o.async_save;
    sp.keep = (int)t->o.keep;
    sp.user_json = t->user_json;
    if (dt_trainer_save(t->tr, t->o.save, &sp) < 0)
        return dt__tr_fail(1, "checkpoint");
    t->saved_step = dt_trainer_steps(t->tr);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"checkpoint\",\"step\":%lld,\"optimizer_step\":%lld,\"micro_step\":%lld,"
                          "\"async\":%s", (long long)t->saved_step, (long long)t->saved_step, (long long)t->micro_step,
                          t->o.async_save ? "true" : "false") < 0)
        return dt__tr_fail(1, NULL);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT;
}

/* The tokenizer --save-hf writes: --tokenizer, else hf:DIR's tokenizer.json
 * (NULL: none known). */
static const char *save_hf_tokenizer(const dt__train_run *t, char *buf, size_t n)
{
    if (t->o.tokenizer)
        return t->o.tokenizer;
    return dt_hf_dir_tokenizer(t->o.model, buf, n) ? buf : NULL;
}

/* The base model's name for adapter_config.json: an hf:DIR model's DIR
 * (AutoPeftModel loads it from there); a zoo model has none (null). */
static const char *base_model_name(const dt__train_run *t)
{
    return !strncmp(t->o.model, "hf:", 3) ? t->o.model + 3 : NULL;
}

/* --save-hf OUT and --save-lora DIR at the end, under every strategy.
 * --save-hf writes the run's weights as a Hugging Face model directory, a
 * LoRA run's adapters merged into their layers (PEFT's merge_and_unload:
 * W + scaling * B A), so OUT is a plain model transformers loads; the
 * weights are taken from a checkpoint (the final --save one, or one written
 * for this into OUT.ckpt-tmp and removed after), which rank 0 converts
 * (dt_hf_save: OUT appears complete or not at all). --save-lora writes the
 * adapters as PEFT does, from rank 0's memory, or under ZeRO-3, --tp and
 * --pp (each rank holds a shard, a slice or its stages) from that
 * checkpoint. */
int dt__tr_save_outputs(dt__train_run *t)
{
    /* ZeRO-3, --tp, --pp: no rank holds every adapter whole */
    const bool lora_from_ckpt = t->o.save_lora && (t->ddp.stage == 3 || t->ddp.tp > 1 || t->ddp.pp > 1);
    if (!t->o.save_hf && !t->o.save_lora)
        return 0;
    const char *ck = t->o.save;
    char tmp[1200] = "";
    if (!ck && (t->o.save_hf || lora_from_ckpt)) {
        char o[1100]; /* OUT/: beside OUT, not inside it (OUT is made at the end) */
        if (dt_path_trim_slashes(t->o.save_hf ? t->o.save_hf : t->o.save_lora, o, sizeof o) < 0)
            return dt__tr_fail(2, t->o.save_hf ? "--save-hf" : "--save-lora");
        /* OUT's missing parents first (save_pretrained's os.makedirs; --save-lora made them already): the
           temporary beside OUT failed the run after its training, naming OUT.ckpt-tmp */
        if (dt_dir_make_parent(o) < 0)
            return dt__tr_fail(1, t->o.save_hf ? "--save-hf" : "--save-lora");
        snprintf(tmp, sizeof tmp, "%s.ckpt-tmp", o);
        dt_trainer_save_params sp = dt_trainer_save_params_default();
        sp.user_json = t->user_json;
        if (dt_trainer_save(t->tr, tmp, &sp) < 0 || dt_trainer_save_wait(t->tr) < 0)
            return dt__tr_fail(1, t->o.save_hf ? "--save-hf" : "--save-lora");
        ck = tmp;
    }
    int rc = 0;
    if (dt__ddp_is_main(&t->ddp)) {
        char latest[4096] = "", esc[512];
        dt_status st = ck ? dt_trainer_ckpt_latest(ck, latest, sizeof latest) : DT_OK;
        if (st >= 0 && t->o.save_hf) {
            dt_hf_config h;
            dt_model_config cfg = dt__tr_model_config(t);
            dt_hf_save_params p = dt_hf_save_params_default();
            if (t->o.hf_shard_size)
                p.max_shard_bytes = t->o.hf_shard_size;
            if (t->lora_targets) /* each layer's own scaling (rank_pattern, alpha_pattern) */
                p.lora_scaling = dt_lora_scaling(&t->lora), p.lora = &t->lora;
            char tokp[4200];
            p.tokenizer = save_hf_tokenizer(t, tokp, sizeof tokp);
            p.chat_template = t->o.chat_template && t->tok ? dt_tokenizer_chat_template(t->tok) : NULL;
            p.generation_from = !strncmp(t->o.model, "hf:", 3) ? t->o.model + 3 : NULL; /* its sampling settings */
            p.lock = t->hf_lock;
            if ((st = dt_model_hf_config(t->o.model, &cfg, &h)) >= 0)
                st = dt_hf_save(latest, &h, t->o.save_hf, &p);
            if (st < 0)
                rc = dt__tr_fail(st == DT_ERR_IO || st == DT_ERR_NO_MEMORY ? 1 : 2, "--save-hf");
            else
                printf("saved %s (a Hugging Face model directory%s)\n", dt_escape(t->o.save_hf, esc, sizeof esc),
                       t->lora_targets ? ", the LoRA adapters merged into their layers" : "");
        }
        if (!rc && t->o.save_lora) {
            st = lora_from_ckpt ? dt_lora_save_peft_from(t->model, latest, &t->lora, base_model_name(t), t->o.save_lora)
                                : dt_lora_save_peft(t->model, &t->lora, base_model_name(t), t->o.save_lora);
            if (st < 0)
                rc = dt__tr_fail(1, "--save-lora");
            else
                printf("LoRA adapters written to %s (PEFT's adapter_config.json, adapter_model.safetensors)\n",
                       dt_escape(t->o.save_lora, esc, sizeof esc));
        }
        if (tmp[0] && nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
            dt__cli_err("dtrain train: could not remove the temporary checkpoint %s\n", tmp);
    }
    return rc;
}

/* --save DIR before any training: created when missing and locked for this
 * job (dt_trainer_save_prepare), so that an unusable directory or one
 * another job saves into is bad input now (exit 2), not a lost checkpoint
 * after the training. */
int dt__tr_setup_save(dt__train_run *t)
{
    if (t->o.save_hf) { /* before any training: a model without a Hugging Face form, an OUT in the way */
        dt_hf_config h;
        dt_model_config cfg = dt__tr_model_config(t);
        if (dt_model_hf_config(t->o.model, &cfg, &h) < 0 || dt_hf_save_check_out(t->o.save_hf) < 0)
            return dt__tr_fail(2, "--save-hf");
        char tokp[4200];
        const char *tp = save_hf_tokenizer(t, tokp, sizeof tokp);
        dt_tokenizer *tk = NULL; /* a tokenizer the end would fail on is bad input now */
        if (tp && dt_tokenizer_load(tp, &tk) < 0)
            return dt__tr_fail(2, "--save-hf");
        dt_tokenizer_free(tk);
        dt_generate_params g = dt_generate_params_default(); /* the sampling settings the export copies */
        if (!strncmp(t->o.model, "hf:", 3) && dt_hf_generation_config(t->o.model + 3, &g, NULL, 0) < 0)
            return dt__tr_fail(2, "--save-hf");
        /* OUT held by the rank that writes it: a second job given the same OUT is refused now, not after its
           training (the end's rename would fail and its model would be lost) */
        if (dt__ddp_is_main(&t->ddp) && dt_hf_save_lock_open(t->o.save_hf, &t->hf_lock) < 0)
            return dt__tr_fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, "--save-hf");
    }
    struct stat sb; /* --save-lora DIR: a symlink (or a file) in the way is bad input now, not after training */
    char sl[4096] = ""; /* (DIR/: lstat of link/ follows the link, so without the trailing slashes) */
    if (t->o.save_lora && dt_path_trim_slashes(t->o.save_lora, sl, sizeof sl) < 0)
        return dt__tr_fail(2, "--save-lora");
    if (t->o.save_lora && lstat(sl, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        dt__cli_err("dtrain train: --save-lora: %s is %s\n", t->o.save_lora,
                    S_ISLNK(sb.st_mode) ? "a symlink (not followed; give the directory itself)" : "not a directory");
        return 2;
    }
    if (t->o.save_lora && dt_lora_save_peft_check(sl) < 0) /* the files it will replace: regular ones or none */
        return dt__tr_fail(2, "--save-lora");
    /* DIR held by the rank that writes it, from now to the end (made now when missing, removed again if the run
       fails before it saves): two jobs given one DIR wrote their adapter_config.json and weights in turn, so the
       pair left could be one job's config beside the other's weights */
    if (t->o.save_lora && dt__ddp_is_main(&t->ddp) && dt_dir_hold_open(sl, &t->lora_hold) < 0) {
        dt__cli_err("dtrain train: --save-lora: %s%s\n", dt_last_error(),
                    dt_last_status() == DT_ERR_STATE ? "; give each job its own adapter directory" : "");
        return dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2;
    }
    if (!t->o.save)
        return 0;
    if (dt_trainer_save_prepare(t->tr, t->o.save) < 0)
        return dt__tr_fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, "--save");
    return 0;
}

/* A --resume / --init-from path that does not exist is bad input (exit 2),
 * named, before the loader tries it. */
static int check_exists(const char *flag, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) == 0)
        return 0;
    dt__cli_err("dtrain train: %s %s: %s\n", flag, path, strerror(errno));
    return 2;
}

/* --resume auto: load the newest checkpoint (path, cap bytes), or, when it
 * is damaged (a file that cannot be read, fails its checksum or does not
 * parse), the next older complete one, with a warning naming what was
 * skipped. Every rank takes the same decision: they agree (one sum) on
 * whether any rank's failure is other than damage (a mismatch with this
 * run, out of memory), which no older checkpoint would cure. */
static dt_status load_auto(dt__train_run *t, char *path, size_t cap, dt_trainer_resume_info *ri)
{
    const char *dash = strrchr(path, '-');
    int64_t step = dash ? atoll(dash + 1) : 0;
    for (;;) {
        dt_status st = dt_trainer_load(t->tr, path, ri);
        if (st >= 0)
            return st;
        char msg[1024], older[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        const bool damage = st == DT_ERR_FORMAT || st == DT_ERR_IO || st == DT_ERR_NOT_FOUND;
        double v[1] = {damage ? 0.0 : 1.0};
        int64_t ostep = -1;
        if (dt_trainer_allreduce_sum(t->tr, v, 1) < 0 || v[0] > 0 ||
            dt_trainer_ckpt_before(t->o.save, step, older, sizeof older, &ostep) < 0 || !older[0])
            return dt_error(st, "%s", msg); /* nothing older to try: the newest one's error */
        if (dt__ddp_is_main(&t->ddp))
            dt__cli_err("dtrain train: warning: --resume auto: %s is damaged (%s); trying the older %s\n", path, msg,
                        older);
        snprintf(path, cap, "%s", older);
        step = ostep;
    }
}

/* When the checkpoint's record u has key as a number other than cur: " flag old" onto was, " flag cur" onto now
 * (integers; differ_real: as %g prints them). */
static void differ_fmt(const cJSON *u, const char *key, const char *flag, double cur, const char *fmt, char *was,
                       char *now, size_t n)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(u, key);
    if (!cJSON_IsNumber(v) || v->valuedouble == cur)
        return;
    char a[40], b[40];
    snprintf(a, sizeof a, fmt, v->valuedouble);
    snprintf(b, sizeof b, fmt, cur);
    snprintf(was + strlen(was), n - strlen(was), " %s %s", flag, a);
    snprintf(now + strlen(now), n - strlen(now), " %s %s", flag, b);
}

static void differ_num(const cJSON *u, const char *key, const char *flag, double cur, char *was, char *now, size_t n)
{
    differ_fmt(u, key, flag, cur, "%.0f", was, now, n);
}

/* The settings that shape the optimizer's steps from here on (--grad-accum, --lr-schedule, --warmup, --lr: the
 * batch of a step and the learning rate of each) as the checkpoint at path recorded them (checkpoints before
 * they were recorded: not compared): those that differ from this run's are a warning naming both, on rank 0
 * (another world size is the trainer's own warning). The run goes on: a resumed run may change them on purpose, but its
 * steps are then not the ones the interrupted run would have taken. */
static void warn_settings(dt__train_run *t, const char *path)
{
    char *js = NULL;
    if (!dt__ddp_is_main(&t->ddp) || dt_trainer_ckpt_user(path, &js) < 0)
        return;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    char was[256] = "", now[256] = "";
    differ_num(u, "grad_accum", "--grad-accum", (double)t->o.grad_accum, was, now, sizeof was);
    const cJSON *sch = cJSON_GetObjectItemCaseSensitive(u, "lr_schedule");
    const char *cur = t->o.lr_schedule ? t->o.lr_schedule : "constant";
    if (cJSON_IsString(sch) && strcmp(sch->valuestring, cur) && strlen(sch->valuestring) < 32) {
        snprintf(was + strlen(was), sizeof was - strlen(was), " --lr-schedule %s", sch->valuestring);
        snprintf(now + strlen(now), sizeof now - strlen(now), " --lr-schedule %s", cur);
    }
    differ_num(u, "warmup", "--warmup", (double)t->o.warmup, was, now, sizeof was);
    differ_fmt(u, "lr", "--lr", t->o.lr, "%.9g", was, now, sizeof was);
    if (was[0])
        dt__cli_err("dtrain train: warning: --resume: the checkpoint was trained with%s, this run has%s: the steps "
                    "from here on differ from the run it continues (another batch per step or learning rate)\n",
                    was, now);
    cJSON_Delete(u);
}

/* Whether the checkpoint at path was trained with this run's --seed and
 * --rng (they draw the data order), --data, --batch, (random data)
 * --random-items and --limit-train (they make the samples and the batches); if not, note
 * says which differ. A checkpoint whose options cannot be read (another
 * program's) is taken as kept. */
static bool seed_kept(dt__train_run *t, const char *path, char *note, size_t n)
{
    char *js = NULL;
    if (dt_trainer_ckpt_user(path, &js) < 0)
        return true;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(u, "seed"), *rng = cJSON_GetObjectItemCaseSensitive(u, "rng");
    const cJSON *data = cJSON_GetObjectItemCaseSensitive(u, "data");
    const cJSON *batch = cJSON_GetObjectItemCaseSensitive(u, "batch");
    bool kept = true;
    if (cJSON_IsNumber(seed) && cJSON_IsString(rng) &&
        (seed->valuedouble != (double)t->o.seed || strcmp(rng->valuestring, t->o.rng))) {
        snprintf(note, n,
                 "the checkpoint was trained with --seed %.0f --rng %s, this run has --seed %llu --rng %s: weights, "
                 "optimizer state and the schedule are resumed, the data order is not kept (the rest of the epoch "
                 "and the epochs after it draw other samples in another order)",
                 seed->valuedouble, rng->valuestring, (unsigned long long)t->o.seed, t->o.rng);
        kept = false;
    } else if (cJSON_IsString(data) && cJSON_IsNumber(batch)) {
        /* another data set, batch size or random set: other samples at the saved position, even with as many
           batches an epoch (which the trainer's own check sees) */
        const bool random = !strcmp(data->valuestring, "random") && !strcmp(t->o.data, "random");
        char was[1400] = "", now[1400] = "", dq[1200];
        if (strcmp(data->valuestring, t->o.data)) {
            snprintf(was + strlen(was), sizeof was - strlen(was), " --data %s",
                     dt_escape(data->valuestring, dq, sizeof dq));
            snprintf(now + strlen(now), sizeof now - strlen(now), " --data %s", dt_escape(t->o.data, dq, sizeof dq));
        }
        differ_num(u, "batch", "--batch", (double)t->o.batch, was, now, sizeof was);
        if (random)
            differ_num(u, "random_items", "--random-items", (double)t->o.random_items, was, now, sizeof was);
        differ_num(u, "limit_train", "--limit-train", (double)t->o.limit_train, was, now, sizeof was);
        if (was[0]) {
            if (snprintf(note, n,
                         "the checkpoint was trained with%s, this run has%s: weights, optimizer state and the "
                         "schedule are resumed, the data order is not kept (the rest of the epoch is other samples)",
                         was, now) >= (int)n && n > 4)
                memcpy(note + n - 4, "...", 4); /* long --data paths: the note says it was cut */
            kept = false;
        }
    }
    cJSON_Delete(u);
    return kept;
}

/* --init-from FILE / --resume DIR|auto, after the trainer is built (DDP:
 * every rank loads the same files). */
int dt__tr_load_lora_from(dt__train_run *t)
{
    if (t->o.lora_from && dt_trainer_load_peft(t->tr, t->o.lora_from) < 0)
        return dt__tr_fail(dt__tr_bad_input_status(dt_last_status()) ? 2 : 1, "--lora-from");
    return 0;
}

/* A run that resumes nothing starts from --init-from's weights, or a
 * Hugging Face model directory's own (any strategy: each rank reads its
 * ranges), then --lora-from's adapters. */
static int initial_weights(dt__train_run *t)
{
    if (t->o.init_from) {
        if (check_exists("--init-from", t->o.init_from))
            return 2;
        if (dt_trainer_load_weights(t->tr, t->o.init_from) < 0)
            return dt__tr_fail(dt__tr_bad_input_status(dt_last_status()) ? 2 : 1, "--init-from");
    } else if (!strncmp(t->o.model, "hf:", 3) && dt_trainer_load_weights(t->tr, t->o.model + 3) < 0) {
        return dt__tr_fail(dt__tr_bad_input_status(dt_last_status()) ? 2 : 1, "--model");
    }
    return dt__tr_load_lora_from(t);
}

int dt__tr_setup_resume(dt__train_run *t)
{
    t->saved_step = -1;
    t->resumed_step = -1;
    if (t->o.init_from || !t->o.resume)
        return initial_weights(t);
    const char *from = t->o.resume;
    char latest[1024];
    if (!strcmp(from, "auto")) {
        struct stat sb;
        latest[0] = 0;
        if (stat(t->o.save, &sb) == 0 && dt_trainer_ckpt_latest(t->o.save, latest, sizeof latest) < 0)
            return dt__tr_fail(1, "--resume auto");
        /* every rank must make the same choice (each looked at the directory itself) */
        double found[2] = {latest[0] ? 1.0 : 0.0, 1.0};
        if (dt_trainer_allreduce_sum(t->tr, found, 2) < 0)
            return dt__tr_fail(1, "--resume auto");
        if (found[0] != 0 && found[0] != found[1]) {
            dt__cli_err("dtrain train: --resume auto: only %.0f of %.0f ranks see a checkpoint in %s (the ranks "
                        "must share the directory)\n", found[0], found[1], t->o.save);
            return 2;
        }
        if (!latest[0]) {
            if (dt__ddp_is_main(&t->ddp))
                printf("--resume auto: no checkpoint in %s yet, starting fresh\n", t->o.save);
            return initial_weights(t);
        }
        from = latest;
    }
    if (from != latest && check_exists("--resume", from))
        return 2;
    dt_trainer_resume_info *ri = &t->ri;
    if ((from == latest ? load_auto(t, latest, sizeof latest, ri) : dt_trainer_load(t->tr, from, ri)) < 0)
        return dt__tr_fail(dt__tr_bad_input_status(dt_last_status()) ? 2 : 1, "--resume");
    t->saved_step = t->resumed_step = ri->step;
    if (ri->data_order_kept && !seed_kept(t, ri->path, ri->note, sizeof ri->note))
        ri->data_order_kept = false;
    warn_settings(t, ri->path);
    dt_trainer_position pos = dt_trainer_get_position(t->tr);
    t->global_step = ri->step;
    t->micro_step = pos.batches;
    if (dt__ddp_is_main(&t->ddp)) {
        printf("resumed from %s: step %lld (epoch %lld, batch %lld)\n", ri->path, (long long)ri->step,
               (long long)ri->epoch + 1, (long long)ri->batch);
        if (!ri->data_order_kept)
            dt__cli_err("dtrain train: warning: %s\n", ri->note);
    }
    return 0;
}

/* A resumed run with nothing left to do (its checkpoint is at --max-steps,
 * or past the last epoch): true after saying so. Nothing is trained,
 * evaluated or written (the restart-safe `--resume auto` re-run of a
 * finished command leaves its files as they are). */
bool dt__tr_nothing_left(dt__train_run *t)
{
    if (t->resumed_step < 0)
        return false;
    const dt_trainer_position pos = dt_trainer_get_position(t->tr);
    const bool by_steps = t->o.max_steps > 0 && t->resumed_step >= t->o.max_steps;
    if (!by_steps && !(t->o.max_steps == 0 && pos.epoch >= t->o.epochs))
        return false;
    if (dt__ddp_is_main(&t->ddp)) {
        char end[96];
        if (by_steps)
            snprintf(end, sizeof end, "--max-steps %lld", (long long)t->o.max_steps);
        else
            snprintf(end, sizeof end, "the end of --epochs %lld", (long long)t->o.epochs);
        printf("nothing to do: the checkpoint %s is at step %lld, %s; no training, evaluation or save, %s left "
               "as it is\n", t->ri.path, (long long)t->resumed_step, end,
               t->o.metrics ? "--metrics file" : "every file");
        fflush(stdout);
    }
    return true;
}
