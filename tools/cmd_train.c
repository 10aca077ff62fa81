/* dtrain train — train a model from the zoo on a data set, evaluate it on
 * the test split, report honest numbers.
 *
 * Flow: parse the options (train_args.c; bad flags exit 2), create the
 * model (its input shape decides the random data set's shape), open the
 * data (errors name the file, exit 2), build the library's trainer
 * (train.h: the strategy, "ddp" under a launcher, the optimizer, the
 * schedule), then per epoch dt_trainer_epoch runs the steps while the
 * loader's thread prepares batches; this file only prints and writes the
 * records the trainer's metrics give it. The epoch's wall time covers
 * everything from the first batch request to the last optimizer step (data
 * loading included, evaluation excluded).
 *
 * Output: progress on stdout (train_progress.c), the final figures on
 * stdout, errors on stderr as one line. --metrics FILE gets JSON lines
 * (train_metrics.c) in FILE.partial as they happen, renamed to FILE when the
 * run succeeds. SIGINT/SIGTERM/SIGHUP stop the run between steps (exit 130; the
 * records and an end record saying "interrupted" stay in FILE.partial):
 * the step under way finishes, and with --save its checkpoint is written
 * before the exit (the message names it).
 *
 * The three signals are blocked in every thread for the whole command (before
 * any thread starts, so the loader's and OpenMP's inherit the mask) and
 * taken synchronously between steps with sigtimedwait: no handler ever runs.
 * A handler interrupting oneDNN's JIT sgemm (2.6.3, Debian bookworm)
 * corrupts the heap (free(): invalid pointer a few calls later; reproduced
 * with a bare dnnl_sgemm loop and setitimer, with or without sigaltstack). */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"

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

#define LOSS_WINDOW 100 /* "train loss over the last 100 steps" */

static int g_stop; /* the stopping signal taken, or 0 (main thread only) */
/* Fault injection for the restart tests: DT_FAULT_KILL_STEP=k makes rank
 * DT_FAULT_KILL_RANK (default 0) SIGKILL itself right after optimizer step
 * k, on the first attempt only (DT_RESTART_COUNT 0 or unset), so that a test
 * can kill a rank at a step it chose. */
static int64_t g_kill_step, g_kill_rank;
static sigset_t g_stop_set;

/* Take a pending SIGINT/SIGTERM/SIGHUP, if any (they are blocked: see the top). */
static int poll_stop(void)
{
    if (!g_stop) {
        struct timespec zero = {0, 0};
        int sig = sigtimedwait(&g_stop_set, NULL, &zero);
        if (sig > 0)
            g_stop = sig;
    }
    return g_stop;
}

typedef struct {
    dt__train_opts o;
    dt_model *model;
    dt_model_desc desc;
    int in_ndim;                  /* input dims including the batch */
    int64_t in_shape[DT_MAX_DIMS];
    int tgt_ndim;
    bool classifier;              /* has labels / accuracy */
    bool lm;                      /* a language model (token ids in, next tokens out) */
    double peak_gflops;           /* the MFU's denominator (language models) */
    dt_tokens *sample_src;        /* the validation (or training) tokens: the samples' prompt */
    dt_bpe *bpe;                  /* --vocab: samples as text */
    dt_tokenizer *tok;            /* --tokenizer: text data */
    char *freeze_buf;             /* --freeze split at its commas */
    const char **freeze;          /* NULL-terminated patterns into freeze_buf (NULL: none) */
    char *lora_buf;               /* --lora-targets split at its commas */
    const char **lora_targets;    /* NULL-terminated */
    dt_lora_params lora;          /* with lora_targets set: the build's adapters */
    dt_lora_peft_config peft;     /* --lora-from DIR's adapter_config.json */
    char *peft_targets;           /* its target_modules joined with commas (o.lora_targets) */
    dt__tuning ck_tuning;         /* the LoRA/--freeze settings of the checkpoint resumed or evaluated */
    char *ck_path;                /* that checkpoint (NULL: none) */
    const char *vocab_from;       /* where the GPT vocabulary size came from (messages) */
    dt_dataset *base_train, *base_test, *train, *test;
    dt_dataset *test_shard;       /* DDP: this rank's share of the test set (NULL: all) */
    dt__ddp_run ddp;              /* DDP (train_ddp.c): no-op at world size 1 */
    dt_sampler *train_sampler, *test_sampler;
    dt_loader *train_loader, *test_loader;
    dt_trainer *tr;               /* the library's trainer: the step lives there */
    dt__metrics metrics;
    bool metrics_open;
    dt__progress prog;
    int64_t global_step;          /* optimizer steps (DeepSpeed's global_steps; the metrics' "step") */
    int64_t micro_step;           /* micro-batches (the metrics' "micro_step"; = steps without --grad-accum) */
    int64_t spe;                  /* optimizer steps per epoch: ceil(batches / grad_accum) */
    int64_t epochs;               /* epochs the run spans: --epochs, or as many as --max-steps takes */
    dt_sched_params sched;        /* the schedule the trainer runs (flags, then the config) */
    double loss_window[LOSS_WINDOW]; /* the last optimizer steps' losses (each the mean of its micro-batches) */
    int64_t nloss;
    /* the epoch under way (train_epoch and its per-step callback); step: its optimizer step */
    int64_t epoch, nb, step, samples, log_n, epoch_micro;
    int cb_rc;                    /* exit code of a failure the callback reported */
    bool max_reached;             /* --max-steps reached: the epoch ended on purpose */
    int64_t saved_step;           /* optimizer steps of the last checkpoint saved (-1: none) */
    int64_t resumed_step;         /* the checkpoint's step when resumed (-1: a fresh run) */
    dt_trainer_resume_info ri;    /* what the resume loaded (resumed_step >= 0) */
    char *user_json;              /* the options a checkpoint keeps (dtrain eval --ckpt reads them) */
    double log_loss, epoch_loss, t0;
    int ckpt_modules;             /* modules checkpointed (--activation-checkpointing, the config's block) */
    bool ckpt_profile;            /* activation_checkpointing.profile: print the totals at the end */
    double start_s;               /* when the command started (time to the first step) */
    bool first_shown;             /* "first step ..." printed */
    char trace[4096];             /* --trace DIR ("" = off): merged at the end */
    double *step_s;               /* every optimizer step's time (s), for the end record's step_ms */
    int64_t nstep_s, cap_step_s;
    double cpu_first_s, cpu_last_s; /* this process's CPU time at the first and the last step's end */
    int64_t ncpu_steps;             /* steps ended after the first */
    dt__metrics_measured measured; /* the end record's measured figures (0: none) */
    /* the backend's byte counters (dt_pg_traffic_read): at the last step record (rank 0's per-step
       figures) and at the end of the first optimizer step (the end record's window) */
    bool comm_on;
    dt_pg_traffic comm_prev, comm_first;
    int64_t comm_first_step;      /* -1 until the first step ended */
} trainer;

/* One-line errors: "dtrain train: <what>: <message>". */
static int fail(int code, const char *what)
{
    dt__cli_err("dtrain train: %s%s%s\n", what ? what : "", what && *dt_last_error() ? ": " : "",
            dt_last_error());
    return code;
}

/* --precision, --reduce-dtype, --keep-bn-fp32, --buffer-dtype as a policy (train.h). */
static int precision_policy(const dt__train_opts *o, dt_precision_policy *p)
{
    if (dt_precision_policy_parse(o->precision, p) < 0)
        return fail(2, "--precision");
    if (o->reduce_dtype) {
        dt_precision_policy r;
        if (dt_precision_policy_parse(o->reduce_dtype, &r) < 0)
            return fail(2, "--reduce-dtype");
        p->reduce_dtype = r.param_dtype;
    }
    p->keep_batchnorm_fp32 = strcmp(o->keep_bn_fp32, "false") != 0;
    if (o->buffer_dtype) {
        dt_precision_policy r;
        if (dt_precision_policy_parse(o->buffer_dtype, &r) < 0)
            return fail(2, "--buffer-dtype");
        p->buffer_dtype = r.param_dtype;
    }
    return 0;
}

static dt_model_config model_config(const trainer *t)
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
        return fail(1, opt);
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
 * --lora-* options (the weights load after the base's: setup_resume). */
static int lora_from(trainer *t)
{
    if (!t->o.lora_from)
        return 0;
    if (dt_lora_peft_config_read(t->o.lora_from, &t->peft) < 0)
        return fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, "--lora-from");
    size_t n = 1;
    for (char **s = t->peft.target_names; *s; s++)
        n += strlen(*s) + 1;
    if (!(t->peft_targets = calloc(1, n)))
        return fail(1, "--lora-from");
    for (char **s = t->peft.target_names; *s; s++)
        snprintf(t->peft_targets + strlen(t->peft_targets), n - strlen(t->peft_targets), "%s%s",
                 s == t->peft.target_names ? "" : ",", *s);
    t->o.lora_targets = t->peft_targets;
    t->o.lora_r = t->peft.params.r;
    t->o.lora_alpha = t->peft.params.alpha;
    t->o.lora_dropout = t->peft.params.dropout;
    t->o.lora_rslora = t->peft.params.rslora;
    return 0;
}

/* The LoRA and --freeze settings of the checkpoint this run evaluates
 * (dtrain eval --ckpt) or resumes: a command line that gives none takes
 * them (the model is rebuilt as it was trained); one that gives others is
 * refused after the build parameters are known (check_tuning). */
static int ckpt_tuning(trainer *t, const char *eval_ckpt)
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
        return fail(1, "--resume");
    if (t->o.lora_targets || t->o.freeze)
        return 0;
    t->o.freeze = t->ck_tuning.freeze;
    if (t->ck_tuning.lora_targets) {
        t->o.lora_targets = t->ck_tuning.lora_targets;
        t->o.lora_r = t->ck_tuning.lora_r;
        t->o.lora_alpha = t->ck_tuning.lora_alpha;
        t->o.lora_dropout = t->ck_tuning.lora_dropout;
        t->o.lora_rslora = t->ck_tuning.lora_rslora;
    }
    return 0;
}

/* A command line whose LoRA/--freeze settings differ from its checkpoint's. */
static int check_tuning(trainer *t, const char *eval_ckpt)
{
    const dt__tuning *c = &t->ck_tuning;
    if (!t->ck_path || dt__tuning_same(c, t->o.lora_targets, &t->lora, t->o.freeze))
        return 0;
    char ck[1500], here[1500];
    dt__tuning_describe(c->lora_targets, c->lora_r, c->lora_alpha, c->lora_dropout, c->lora_rslora, c->freeze, ck,
                        sizeof ck);
    dt__tuning_describe(t->o.lora_targets, t->lora.r, t->lora.alpha, t->lora.dropout, t->lora.rslora, t->o.freeze,
                        here, sizeof here);
    dt__cli_err("dtrain train: %s %s was trained with %s; this command has %s: give the checkpoint's settings, or "
                "none (they are then taken from it)\n", eval_ckpt ? "--ckpt" : "--resume", t->ck_path, ck, here);
    return 2;
}

/* --freeze and --lora-*: the patterns and targets (each --freeze pattern
 * must match a parameter of the model: a typo would otherwise train
 * everything; freeze_report checks after the build). */
static int freeze_patterns(trainer *t, const char *eval_ckpt)
{
    int rc;
    if ((rc = lora_from(t)) || (rc = ckpt_tuning(t, eval_ckpt)))
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
    t->lora.targets = t->lora_targets;
    return check_tuning(t, eval_ckpt);
}

static bool g_eval_json; /* dtrain eval --json: stdout holds the JSON object only */
static dt_tokenizer *g_eval_tok; /* dtrain eval --ckpt: the tokenizer its checkpoint keeps, until taken */

static int freeze_report(trainer *t)
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
    if (dt__ddp_is_main(&t->ddp) && !g_eval_json)
        printf("frozen: %zu parameters (%zu elements) by %s%s%s; %zu elements train\n", nfrozen, efrozen,
               t->lora_targets ? "LoRA (adapters on " : "--freeze ", t->lora_targets ? t->o.lora_targets : t->o.freeze,
               t->lora_targets ? ")" : "", dt_model_param_count(t->model));
    if (dt__ddp_is_main(&t->ddp) && t->lora_targets && !g_eval_json)
        printf("LoRA: r %lld, alpha %g, dropout %g, scaling %g%s\n", (long long)t->lora.r, (double)t->lora.alpha,
               (double)t->lora.dropout, (double)dt_lora_scaling(&t->lora), t->lora.rslora ? " (rsLoRA)" : "");
    return 0;
}

/* --offload into the trainer's parameters. The CLI's sub-groups are 2^23
 * elements (32 MiB per state buffer), not DeepSpeed's 1e9: with 4 buffers
 * the state in memory stays bounded whatever the model size. */
static int offload_params(const trainer *t, dt_offload_params *p)
{
    *p = dt_offload_params_default();
    if (!t->o.offload)
        return 0;
    if (dt_offload_parse(t->o.offload, p) < 0)
        return fail(2, "--offload");
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
 * other processes leave free (the cores less the 1-minute load average;
 * DT_LOADAVG=X stands in for the load, for tests), say so once with the
 * fix. Only for the default thread count (--threads not given; under dtrain
 * run the launcher's share of the cores): a count the user chose is theirs. */
static void warn_oversubscribed(const trainer *t)
{
    if (t->o.threads)
        return;
    double load = -1;
    const char *e = getenv("DT_LOADAVG");
    if (e && *e) {
        if (dt_parse_double("DT_LOADAVG", e, 0, 1e6, &load) < 0)
            load = -1;
    } else {
        FILE *f = fopen("/proc/loadavg", "r");
        if (f && fscanf(f, "%lf", &load) != 1)
            load = -1;
        if (f)
            fclose(f);
    }
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
static void print_pipe_cut(const trainer *t)
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
 * naming --vocab-size before). A resumed run reads the same files, so it
 * builds the same size. With --tokenizer FILE (text data) the tokenizer is
 * loaded here and its size is the vocabulary's. */
static int vocab_size_from_vocab(trainer *t)
{
    t->vocab_from = "the model's default";
    if (t->o.tokenizer) {
        if (g_eval_tok) /* dtrain eval --ckpt: the one the checkpoint keeps */
            t->tok = g_eval_tok, g_eval_tok = NULL;
        else if (dt_tokenizer_load(t->o.tokenizer, &t->tok) < 0)
            return fail(2, "--tokenizer");
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
            return fail(2, "--vocab");
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
    if (mv > m)
        m = mv;
    if (m <= g.vocab_size)
        return 0; /* every id fits the model's default */
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
static char *vocab_quoted(const char *opt, const char *path)
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

static int check_memory(trainer *t)
{
    dt_model_config cfg = model_config(t);
    cfg.build.meta = true;
    dt_model *m;
    if (dt_model_create(t->o.model, t->o.seed, &cfg, &m, NULL) < 0)
        return fail(2, "--model");
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
        return fail(2, "--optimizer");
    dt_mem_estimate e; /* the plan's per-rank model state (parameters f32 here, as the estimate always took them) */
    if (dt_plan_memory(t->ddp.plan, psi, 4, kind, t->o.momentum > 0, &op, &e) < 0)
        return fail(1, "memory estimate");
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
        return fail(1, NULL);
    return 0;
}

static int setup_model(trainer *t)
{
    dt_model_config cfg = model_config(t);
    dt_precision_policy pol;
    if (precision_policy(&t->o, &pol))
        return 2;
    if (dt_precision_policy_build_params(&pol, &cfg.build) < 0) /* bf16/f16: the model holds its parameters so */
        return fail(2, "--precision");
    cfg.build.meta = dt__ddp_lazy_model(&t->ddp); /* ZeRO-3, --pp: each rank initialises what it holds */
    if (dt_model_create(t->o.model, t->o.seed, &cfg, &t->model, &t->desc) < 0)
        return fail(2, "--model");
    int frc = freeze_report(t);
    if (frc)
        return frc;
    t->lm = t->desc.input_dtype == DT_I64;
    if (t->o.act_ckpt) {
        dt_act_ckpt_params ap = dt_act_ckpt_params_default();
        bool on = true;
        if (t->o.cfg && dt_config_act_ckpt(t->o.cfg, &on, &ap) < 0) /* the config's activation_checkpointing */
            return fail(2, "--config");
        dt_status st = dt_model_desc_checkpoint(t->model, &t->desc, &ap, &t->ckpt_modules);
        if (st < 0)
            return fail(st == DT_ERR_UNSUPPORTED || st == DT_ERR_INVALID_ARG ? 2 : 1, "--activation-checkpointing");
        t->ckpt_profile = ap.profile;
    }
    if (!cfg.build.meta && !strcmp(t->o.rng, "torch") &&
        (cfg.tp ? dt_model_init_tp(t->model, t->o.model, &cfg, DT_INIT_TORCH, t->o.seed)
                : dt_model_init_torch(t->model, t->o.seed)) < 0)
        return fail(1, "--rng torch");
    if (cfg.build.meta && (t->freeze || t->lora_targets) && !strcmp(t->o.rng, "torch") &&
        dt_model_init_frozen(t->model, DT_INIT_TORCH, t->o.seed) < 0) /* the shards get torch's by init_range */
        return fail(1, "--rng torch");
    int64_t tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&t->desc, 1, &t->in_ndim, t->in_shape, &t->tgt_ndim, tshape, &tdt) < 0)
        return fail(1, "model input shape");
    t->classifier = !strcmp(t->o.model, "convnet");
    return 0;
}

/* tokens:FILE, or text:/jsonl: encoded with --tokenizer (dt_dataset_text_open). */
static dt_status lm_data_open(trainer *t, const char *spec, const dt_tokens_params *kp, dt_dataset **out)
{
    if (!strncmp(spec, "tokens:", 7))
        return dt_dataset_tokens_open(spec + 7, kp, out);
    return dt_dataset_text_open(spec, t->tok, kp, out);
}

static int setup_data(trainer *t)
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
        const char *vspec = t->o.val_data ? t->o.val_data : t->o.data, *val = vspec + 7;
        if ((st = lm_data_open(t, t->o.data, &kp, &t->base_train)) >= 0 &&
            (st = lm_data_open(t, vspec, &kp, &t->base_test)) < 0)
            snprintf(what, sizeof what, "--val-data %s", vspec);
        if (st < 0 && st != DT_ERR_NO_MEMORY && strstr(dt_last_error(), ">= vocab size")) {
            /* a token the model's vocabulary does not have: say which option sizes it */
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", dt_last_error());
            dt__cli_err("dtrain train: %s: %s (the model's vocabulary: %s; --vocab-size N sets it)\n", what, msg,
                        t->vocab_from ? t->vocab_from : "the model's default");
            return 2;
        }
        if (st < 0)
            return fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
        if (t->o.sample_every > 0 && dt_tokens_open(val, 0, &t->sample_src) < 0)
            return fail(2, what);
        if (t->o.vocab && !t->bpe && dt_bpe_load(t->o.vocab, &t->bpe) < 0)
            return fail(2, "--vocab");
        int64_t ntr = dt_dataset_length(t->base_train), nte = dt_dataset_length(t->base_test);
        if (t->o.limit_train > 0 && t->o.limit_train < ntr)
            ntr = t->o.limit_train;
        if (t->o.limit_test > 0 && t->o.limit_test < nte)
            nte = t->o.limit_test;
        if (dt_dataset_subset_init(t->base_train, 0, ntr, &t->train) < 0 ||
            dt_dataset_subset_init(t->base_test, 0, nte, &t->test) < 0)
            return fail(1, what);
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
            return fail(2, what);
        if ((st = dt_dataset_subset_init(t->base_train, 0, t->o.random_items, &t->train)) < 0 ||
            (st = dt_dataset_subset_init(t->base_train, t->o.random_items, ntest, &t->test)) < 0)
            return fail(1, what);
    } else {
        /* Out of memory is a runtime failure (exit 1, docs/TRAINING.md);
         * everything else about the data is bad input (exit 2). */
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TRAIN, &t->base_train)) < 0)
            return fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
        if ((st = dt_dataset_open_spec(t->o.data, DT_SPLIT_TEST, &t->base_test)) < 0)
            return fail(st == DT_ERR_NO_MEMORY ? 1 : 2, what);
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
        int64_t ntr = dt_dataset_length(t->base_train), nte = dt_dataset_length(t->base_test);
        if (t->o.limit_train > 0 && t->o.limit_train < ntr)
            ntr = t->o.limit_train;
        if (t->o.limit_test > 0 && t->o.limit_test < nte)
            nte = t->o.limit_test;
        if (dt_dataset_subset_init(t->base_train, 0, ntr, &t->train) < 0 ||
            dt_dataset_subset_init(t->base_test, 0, nte, &t->test) < 0)
            return fail(1, what);
    }
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = t->o.batch;
    lp.prefetch = (int)t->o.prefetch;
    /* DDP: every rank evaluates its own contiguous share of the test set */
    if (t->ddp.world > 1) {
        int64_t lo, hi;
        dt_plan_eval_range(t->ddp.plan, dt_dataset_length(t->test), &lo, &hi);
        if (dt_dataset_subset_init(t->test, lo, hi - lo, &t->test_shard) < 0)
            return fail(1, what);
    }
    dt_dataset *test_set = t->test_shard ? t->test_shard : t->test;
    if (dt_plan_sampler(t->ddp.plan, dt_dataset_length(t->train), t->o.seed,
                              !strcmp(t->o.rng, "torch") ? DT_SHUFFLE_TORCH : DT_SHUFFLE_PHILOX,
                              &t->train_sampler) < 0 ||
        dt_loader_init(t->train, t->train_sampler, &lp, &t->train_loader) < 0)
        return fail(1, "training data loader");
    /* evaluation: bigger batches, no grads (language models: the logits of a
     * batch are B T V floats, so the training batch) */
    lp.batch_size = t->lm || t->o.batch > 500 ? t->o.batch : 500;
    if (!t->o.no_eval && /* --no-eval: no test loader, no memory for its batches */
        (dt_sampler_sequential_init(dt_dataset_length(test_set), &t->test_sampler) < 0 ||
         dt_loader_init(test_set, t->test_sampler, &lp, &t->test_loader) < 0))
        return fail(1, "test data loader");
    if (dt_loader_num_batches(t->train_loader) == 0) {
        dt__cli_err("dtrain train: --data %s: the training set is empty\n", t->o.data);
        return 2;
    }
    return 0;
}

/* The strategy (train_ddp.c). --pp-balance time: the stages are balanced
 * by the units' times on the first micro-batch of the training data (its
 * first batch / micro-batches items in the dataset's order: the same rows,
 * so the same shape, on every rank), viewed as the trainer views a batch. */
static int wrap(trainer *t)
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
            rc = fail(2, "--pp-balance time: reading the sample micro-batch");
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
static dt_pg *world_of(const trainer *t) { return t->ddp.world_pg ? t->ddp.world_pg : t->ddp.pg; }

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The byte counters (every rank, before the first step): the peers' nodes
 * (one small all-gather: the cross-node split) and the counts so far. */
static int comm_start(trainer *t)
{
    dt_pg *w = world_of(t);
    t->comm_first_step = -1;
    if (!w || dt_pg_size(w) < 2)
        return 0;
    dt_pg_topo topo;
    if (dt_pg_topology(w, &topo) < 0)
        return fail(1, "the ranks' nodes (for the byte counters)");
    if (dt_pg_traffic_read(w, &t->comm_prev, NULL, 0) < 0)
        return fail(1, "the byte counters");
    t->comm_on = t->comm_prev.counted;
    return 0;
}

/* The end record's measured figures: the largest peak RSS of the ranks (a
 * MAX over the world, collective) and the median step time. */
static int measure(trainer *t)
{
    dt_trainer_memory mem;
    double rss = dt_trainer_memory_get(t->tr, &mem) == DT_OK ? (double)mem.peak_rss : 0;
    dt_pg *w = world_of(t);
    if (w && dt_pg_allreduce(w, DT_IN_PLACE, &rss, 1, DT_F64, DT_REDUCE_MAX) < 0)
        return fail(1, "the peak memory of the ranks");
    t->measured.peak_rss_bytes = rss;
    dt_pg_traffic now;
    if (t->comm_on && t->comm_first_step >= 0 && t->global_step > t->comm_first_step &&
        dt_pg_traffic_read(w, &now, NULL, 0) >= 0 && now.counted) {
        /* every rank's bytes since its first step ended, summed (exact below 2^53) */
        double b[2] = {(double)(now.sent - t->comm_first.sent),
                       (double)(now.sent_cross_node - t->comm_first.sent_cross_node)};
        if (dt_pg_allreduce(w, DT_IN_PLACE, b, 2, DT_F64, DT_REDUCE_SUM) < 0)
            return fail(1, "the bytes the ranks sent");
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
        return fail(1, "the CPU time of the ranks");
    t->measured.step_cpu_ms = 1e3 * cpu;
    if (t->nstep_s > 0) {
        qsort(t->step_s, (size_t)t->nstep_s, sizeof *t->step_s, dbl_cmp);
        const int64_t n = t->nstep_s;
        t->measured.step_ms = 1e3 * (n % 2 ? t->step_s[n / 2] : 0.5 * (t->step_s[n / 2 - 1] + t->step_s[n / 2]));
    }
    return 0;
}


/* --trace DIR: create DIR (one level, not through a symlink), open the
 * tracer and remember DIR for the merge at the end. */
static int trace_dir(trainer *t, const dt_trace_params *tp)
{
    const char *dir = tp->dir;
    if (!dir)
        return 0;
    struct stat sb;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        dt__cli_err("dtrain train: --trace %s: %s\n", dir, strerror(errno));
        return 2;
    }
    if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        dt__cli_err("dtrain train: --trace %s: not a directory\n", dir);
        return 2;
    }
    snprintf(t->trace, sizeof t->trace, "%s", dir);
    /* opened here, with this process's rank in the world (a pipeline
     * trainer's own rank is its data-parallel one); the trainer records
     * into it */
    dt_trace_params p = *tp;
    dt_pg *w = world_of(t);
    if (dt_trace_open(&p, w ? dt_pg_rank(w) : 0, w ? dt_pg_size(w) : 1) < 0)
        return fail(2, "--trace");
    return 0;
}

/* The ranks' timelines on one clock: rank 0's (collective over the world). */
static int trace_align(trainer *t)
{
    double off = 0, base = 0;
    dt_pg *w = world_of(t);
    if (!t->trace[0] || !w)
        return 0;
    if (dt_pg_clock_offset(w, &off, &base) < 0)
        return fail(1, "--trace");
    dt_trace_set_offset(off, base);
    return 0;
}

/* After the trainer ended: this rank's file (closing the tracer), every
 * rank's (a barrier), then rank 0 merges them into DIR/trace.json. */
static int trace_merge(trainer *t)
{
    dt_pg *w = world_of(t);
    if (!t->trace[0])
        return 0;
    if (dt_trace_close() < 0)
        return fail(1, "--trace");
    if (w && dt_pg_barrier(w) < 0)
        return fail(1, "--trace");
    if (w && dt_pg_rank(w) != 0)
        return 0;
    if (dt_trace_merge(t->trace, w ? dt_pg_size(w) : 1, NULL) < 0)
        return fail(1, "--trace");
    if (t->prog.mode != DT__PROGRESS_NONE)
        printf("trace: %s/trace.json (steps %s)\n", t->trace, t->o.trace_steps ? t->o.trace_steps : "3:5");
    return 0;
}

/* The trainer: strategy (train_ddp.c), optimizer and schedule from the
 * options. */
static int setup_trainer(trainer *t)
{
    dt_trainer_params tp = dt_trainer_params_default();
    if (dt_optim_kind_parse(t->o.optimizer, &tp.optimizer) < 0)
        return fail(2, "--optimizer");
    /* PyTorch's optimizers decay every parameter unless told otherwise;
     * so do we (no_decay_1d false), to match its accuracy band. */
    const double wd = t->o.weight_decay;
    tp.sgd.lr = tp.adam.lr = tp.adamw.lr = tp.lamb.lr = t->o.lr;
    tp.sgd.momentum = t->o.momentum;
    if (wd >= 0)
        tp.sgd.weight_decay = tp.adam.weight_decay = tp.adamw.weight_decay = tp.lamb.weight_decay = wd;
    if (t->o.beta_set) {
        tp.adam.beta1 = tp.adamw.beta1 = tp.lamb.beta1 = t->o.beta[0];
        tp.adam.beta2 = tp.adamw.beta2 = tp.lamb.beta2 = t->o.beta[1];
    }
    if (t->o.eps > 0)
        tp.adam.eps = tp.adamw.eps = tp.lamb.eps = t->o.eps;
    /* the schedule counts optimizer steps: with --grad-accum N one per N
     * batches, plus one for an epoch's last, partial accumulation */
    int64_t nb = dt_loader_num_batches(t->train_loader), accum = t->o.grad_accum > 0 ? t->o.grad_accum : 1;
    int64_t spe = (nb + accum - 1) / accum;
    if (dt_sched_kind_parse(t->o.lr_schedule, &tp.sched.kind) < 0)
        return fail(2, "--lr-schedule");
    tp.sched.step_size = t->o.step_size > 0 ? t->o.step_size : spe;
    tp.sched.gamma = t->o.gamma;
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
        return fail(2, "--scaler");
    tp.scaler.initial_scale_power = (int)t->o.initial_scale_power;
    tp.scaler.init_scale = ldexp(1.0, (int)t->o.initial_scale_power);
    if (t->o.loss_scale_window > 0) /* else each rule's default: 1000, 2000 */
        tp.scaler.loss_scale_window = tp.scaler.growth_interval = t->o.loss_scale_window;
    tp.scaler.hysteresis = (int)t->o.hysteresis;
    tp.scaler.min_loss_scale = t->o.min_loss_scale;
    tp.trace.dir = t->o.trace;
    if (t->o.trace_steps && dt_trace_parse_steps(t->o.trace_steps, &tp.trace) < 0)
        return fail(2, "--trace-steps");
    if (t->o.cfg && dt_trainer_params_apply_config(t->o.cfg, &tp) < 0) /* the config's keys over the flags' */
        return fail(2, "--config");
    t->sched = tp.sched;
    if ((rc = trace_dir(t, &tp.trace)))
        return rc;
    if (dt_trainer_init(t->model, dt__ddp_take_strategy(&t->ddp), &tp, &t->tr) < 0)
        return fail(dt_last_status() == DT_ERR_INVALID_ARG ? 2 : 1, "trainer");
    return trace_align(t);
}

/* A checkpoint that does not fit this run or is damaged: bad input (exit 2). */
static bool bad_input_status(dt_status st)
{
    return st == DT_ERR_MISMATCH || st == DT_ERR_FORMAT || st == DT_ERR_SHAPE || st == DT_ERR_DTYPE ||
           st == DT_ERR_NOT_FOUND;
}

/* The options a checkpoint keeps, so that `dtrain eval --ckpt` builds the
 * same model and data without being told. */
static int make_user_json(trainer *t)
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
        if (t->o.loss_mask) /* the data's prompt targets are ignored: dtrain eval --ckpt evaluates alike */
            snprintf(lm + strlen(lm), sizeof lm - strlen(lm), ",\"loss_mask\":true");
    }
    char *vq = NULL, *tq = NULL; /* the vocabulary or tokenizer.json goes with the checkpoint (generate --ckpt) */
    if (t->lm && t->o.vocab && t->o.save && !(vq = vocab_quoted("--vocab", t->o.vocab)))
        return 2;
    if (t->lm && t->o.tokenizer && t->o.save) {
        char tp[4200];
        struct stat sb;
        bool dir = stat(t->o.tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode); /* a model directory holding one */
        snprintf(tp, sizeof tp, dir ? "%s/tokenizer.json" : "%s", t->o.tokenizer);
        if (!(tq = vocab_quoted("--tokenizer", tp))) {
            cJSON_free(vq);
            return 2;
        }
    }
    size_t n = strlen(data_q) + strlen(lm) + (vq ? strlen(vq) : 0) + (tq ? strlen(tq) : 0) + 512;
    if (!(t->user_json = malloc(n))) {
        cJSON_free(vq);
        cJSON_free(tq);
        return fail(1, "out of memory");
    }
    snprintf(t->user_json, n,
             "{\"model\":\"%s\",\"data\":%s,\"seed\":%llu,\"rng\":\"%s\",\"batch\":%lld,"
             "\"random_items\":%lld,\"limit_train\":%lld,\"limit_test\":%lld,\"world_size\":%d%s}",
             t->o.model, data_q, (unsigned long long)t->o.seed, t->o.rng, (long long)t->o.batch,
             (long long)t->o.random_items, (long long)t->o.limit_train, (long long)t->o.limit_test, t->ddp.world,
             lm);
    if (vq) {
        size_t l = strlen(t->user_json);
        snprintf(t->user_json + l - 1, n - l + 1, ",\"vocab_bpe\":%s}", vq);
        cJSON_free(vq);
    }
    if (tq) {
        size_t l = strlen(t->user_json);
        snprintf(t->user_json + l - 1, n - l + 1, ",\"tokenizer_json\":%s}", tq);
        cJSON_free(tq);
    }
    /* the LoRA and --freeze settings (eval/generate --ckpt and --resume rebuild the model with them) */
    char *tj = dt__tuning_json(t->lora_targets ? t->o.lora_targets : NULL, &t->lora, t->o.freeze);
    size_t l = strlen(t->user_json);
    char *u = tj ? realloc(t->user_json, l + strlen(tj) + 2) : NULL;
    if (!u) {
        cJSON_free(tj);
        return fail(1, "out of memory");
    }
    t->user_json = u;
    snprintf(u + l - 1, strlen(tj) + 2, ",%s", tj + 1); /* tj's members after the others */
    cJSON_free(tj);
    return 0;
}

static int save_ckpt(trainer *t)
{
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    sp.async = t->o.async_save;
    sp.keep = (int)t->o.keep;
    sp.user_json = t->user_json;
    if (dt_trainer_save(t->tr, t->o.save, &sp) < 0)
        return fail(1, "checkpoint");
    t->saved_step = dt_trainer_steps(t->tr);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"checkpoint\",\"step\":%lld,\"optimizer_step\":%lld,\"micro_step\":%lld,"
                          "\"async\":%s", (long long)t->saved_step, (long long)t->saved_step, (long long)t->micro_step,
                          t->o.async_save ? "true" : "false") < 0)
        return fail(1, NULL);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path) != 0 && errno != ENOENT;
}

/* The tokenizer --save-hf writes: --tokenizer, else hf:DIR's tokenizer.json
 * (NULL: none known). */
static const char *save_hf_tokenizer(const trainer *t, char *buf, size_t n)
{
    if (t->o.tokenizer)
        return t->o.tokenizer;
    return dt_hf_dir_tokenizer(t->o.model, buf, n) ? buf : NULL;
}

/* The base model's name for adapter_config.json: an hf:DIR model's DIR
 * (AutoPeftModel loads it from there); a zoo model has none (null). */
static const char *base_model_name(const trainer *t)
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
static int save_outputs(trainer *t)
{
    /* ZeRO-3, --tp, --pp: no rank holds every adapter whole */
    const bool lora_from_ckpt = t->o.save_lora && (t->ddp.stage == 3 || t->ddp.tp > 1 || t->ddp.pp > 1);
    if (!t->o.save_hf && !t->o.save_lora)
        return 0;
    const char *ck = t->o.save;
    char tmp[1200] = "";
    if (!ck && (t->o.save_hf || lora_from_ckpt)) {
        snprintf(tmp, sizeof tmp, "%s.ckpt-tmp", t->o.save_hf ? t->o.save_hf : t->o.save_lora);
        dt_trainer_save_params sp = dt_trainer_save_params_default();
        sp.user_json = t->user_json;
        if (dt_trainer_save(t->tr, tmp, &sp) < 0 || dt_trainer_save_wait(t->tr) < 0)
            return fail(1, t->o.save_hf ? "--save-hf" : "--save-lora");
        ck = tmp;
    }
    int rc = 0;
    if (dt__ddp_is_main(&t->ddp)) {
        char latest[4096] = "", esc[512];
        dt_status st = ck ? dt_trainer_ckpt_latest(ck, latest, sizeof latest) : DT_OK;
        if (st >= 0 && t->o.save_hf) {
            dt_hf_config h;
            dt_model_config cfg = model_config(t);
            dt_hf_save_params p = dt_hf_save_params_default();
            if (t->o.hf_shard_size)
                p.max_shard_bytes = t->o.hf_shard_size;
            if (t->lora_targets)
                p.lora_scaling = dt_lora_scaling(&t->lora);
            char tokp[4200];
            p.tokenizer = save_hf_tokenizer(t, tokp, sizeof tokp);
            if ((st = dt_model_hf_config(t->o.model, &cfg, &h)) >= 0)
                st = dt_hf_save(latest, &h, t->o.save_hf, &p);
            if (st < 0)
                rc = fail(st == DT_ERR_IO || st == DT_ERR_NO_MEMORY ? 1 : 2, "--save-hf");
            else
                printf("saved %s (a Hugging Face model directory%s)\n", dt_escape(t->o.save_hf, esc, sizeof esc),
                       t->lora_targets ? ", the LoRA adapters merged into their layers" : "");
        }
        if (!rc && t->o.save_lora) {
            st = lora_from_ckpt ? dt_lora_save_peft_from(t->model, latest, &t->lora, base_model_name(t), t->o.save_lora)
                                : dt_lora_save_peft(t->model, &t->lora, base_model_name(t), t->o.save_lora);
            if (st < 0)
                rc = fail(1, "--save-lora");
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
static int setup_save(trainer *t)
{
    if (t->o.save_hf) { /* before any training: a model without a Hugging Face form, an OUT in the way */
        dt_hf_config h;
        dt_model_config cfg = model_config(t);
        if (dt_model_hf_config(t->o.model, &cfg, &h) < 0 || dt_hf_save_check_out(t->o.save_hf) < 0)
            return fail(2, "--save-hf");
        char tokp[4200];
        const char *tp = save_hf_tokenizer(t, tokp, sizeof tokp);
        dt_tokenizer *tk = NULL; /* a tokenizer the end would fail on is bad input now */
        if (tp && dt_tokenizer_load(tp, &tk) < 0)
            return fail(2, "--save-hf");
        dt_tokenizer_free(tk);
    }
    if (!t->o.save)
        return 0;
    if (dt_trainer_save_prepare(t->tr, t->o.save) < 0)
        return fail(dt_last_status() == DT_ERR_NO_MEMORY ? 1 : 2, "--save");
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
static dt_status load_auto(trainer *t, char *path, size_t cap, dt_trainer_resume_info *ri)
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

/* Whether the checkpoint at path was trained with this run's --seed and
 * --rng (they draw the data order); if not, note says so. A checkpoint
 * whose options cannot be read (another program's) is taken as kept. */
static bool seed_kept(trainer *t, const char *path, char *note, size_t n)
{
    char *js = NULL;
    if (dt_trainer_ckpt_user(path, &js) < 0)
        return true;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(u, "seed"), *rng = cJSON_GetObjectItemCaseSensitive(u, "rng");
    bool kept = true;
    if (cJSON_IsNumber(seed) && cJSON_IsString(rng) &&
        (seed->valuedouble != (double)t->o.seed || strcmp(rng->valuestring, t->o.rng))) {
        snprintf(note, n,
                 "the checkpoint was trained with --seed %.0f --rng %s, this run has --seed %llu --rng %s: weights, "
                 "optimizer state and the schedule are resumed, the data order is not kept (the rest of the epoch "
                 "and the epochs after it draw other samples in another order)",
                 seed->valuedouble, rng->valuestring, (unsigned long long)t->o.seed, t->o.rng);
        kept = false;
    }
    cJSON_Delete(u);
    return kept;
}

/* --init-from FILE / --resume DIR|auto, after the trainer is built (DDP:
 * every rank loads the same files). */
/* --lora-from DIR's adapter weights, over the base's. */
static int load_lora_from(trainer *t)
{
    if (t->o.lora_from && dt_trainer_load_peft(t->tr, t->o.lora_from) < 0)
        return fail(bad_input_status(dt_last_status()) ? 2 : 1, "--lora-from");
    return 0;
}

/* A run that resumes nothing starts from --init-from's weights, or a
 * Hugging Face model directory's own (any strategy: each rank reads its
 * ranges), then --lora-from's adapters. */
static int initial_weights(trainer *t)
{
    if (t->o.init_from) {
        if (check_exists("--init-from", t->o.init_from))
            return 2;
        if (dt_trainer_load_weights(t->tr, t->o.init_from) < 0)
            return fail(bad_input_status(dt_last_status()) ? 2 : 1, "--init-from");
    } else if (!strncmp(t->o.model, "hf:", 3) && dt_trainer_load_weights(t->tr, t->o.model + 3) < 0) {
        return fail(bad_input_status(dt_last_status()) ? 2 : 1, "--model");
    }
    return load_lora_from(t);
}

static int setup_resume(trainer *t)
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
            return fail(1, "--resume auto");
        /* every rank must make the same choice (each looked at the directory itself) */
        double found[2] = {latest[0] ? 1.0 : 0.0, 1.0};
        if (dt_trainer_allreduce_sum(t->tr, found, 2) < 0)
            return fail(1, "--resume auto");
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
        return fail(bad_input_status(dt_last_status()) ? 2 : 1, "--resume");
    t->saved_step = t->resumed_step = ri->step;
    if (ri->data_order_kept && !seed_kept(t, ri->path, ri->note, sizeof ri->note))
        ri->data_order_kept = false;
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
static bool nothing_left(trainer *t)
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

/* --metrics (rank 0 writes): a fresh history, or a resumed run's continued
 * (train_metrics.c), then the resume record. */
static int open_metrics(trainer *t)
{
    if (!t->o.metrics || !dt__ddp_is_main(&t->ddp))
        return 0;
    if (dt__metrics_open(&t->metrics, t->o.metrics, t->resumed_step) < 0)
        return fail(2, NULL);
    t->metrics_open = true;
    const dt__metrics *m = &t->metrics;
    if (t->resumed_step < 0)
        return 0;
    if (m->from && strcmp(t->o.progress, "none"))
        printf("--metrics: continuing %s%s: %lld records up to step %lld kept, %lld after it dropped%s\n",
               t->o.metrics, m->from, (long long)m->kept, (long long)t->resumed_step, (long long)m->dropped,
               m->bad ? " (and lines that were not records)" : "");
    const dt_trainer_resume_info *ri = &t->ri;
    char path_q[1200];
    dt__json_quote(ri->path, path_q, sizeof path_q);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"resume\",\"from\":%s,\"step\":%lld,\"optimizer_step\":%lld,"
                          "\"micro_step\":%lld,\"epoch\":%lld,\"epoch_batch\":%lld,\"saved_world_size\":%d,"
                          "\"data_order_kept\":%s,\"records_kept\":%lld,\"records_dropped\":%lld",
                          path_q, (long long)ri->step, (long long)ri->step, (long long)t->micro_step,
                          (long long)ri->epoch + 1, (long long)ri->batch, ri->saved_world,
                          ri->data_order_kept ? "true" : "false", (long long)m->kept, (long long)m->dropped) < 0)
        return fail(1, NULL);
    return 0;
}

/* Mean test loss and accuracy (fraction; NAN when not a classifier), summed
 * over the ranks' shares. */
static int evaluate(trainer *t, double *loss_out, double *acc_out)
{
    dt_dataset *test_set = t->test_shard ? t->test_shard : t->test;
    dt_trainer_eval_result r;
    if (!t->test_loader) {
        dt__cli_err("dtrain train: evaluation: there is no test loader (--no-eval)\n");
        return 2;
    }
    if (dt_trainer_evaluate(t->tr, t->test_loader, dt_dataset_get_info(test_set), &r) < 0)
        return fail(1, "evaluation");
    *loss_out = r.loss;
    *acc_out = t->classifier ? r.accuracy : NAN;
    return 0;
}

static int eval_and_record(trainer *t, int64_t epoch, double *tl, double *ta)
{
    int rc = evaluate(t, tl, ta);
    if (rc)
        return rc;
    char acc[32];
    if (isnan(*ta))
        snprintf(acc, sizeof acc, "null");
    else
        snprintf(acc, sizeof acc, "%.6f", *ta);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"eval\",\"epoch\":%lld,\"step\":%lld,\"test_loss\":%.6f,"
                          "\"test_accuracy\":%s,\"test_items\":%lld",
                          (long long)epoch + 1, (long long)t->global_step, *tl, acc,
                          (long long)dt_dataset_length(t->test)) < 0)
        return fail(1, NULL);
    return 0;
}

static double window_mean(const trainer *t)
{
    int64_t n = t->nloss < LOSS_WINDOW ? t->nloss : LOSS_WINDOW;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += t->loss_window[i];
    return n ? s / (double)n : NAN;
}

/* Language models: ",\"tokens_per_s\":N,\"mfu\":F" for a records' tail ("" otherwise):
 * tokens/s over all ranks, the MFU per rank. */
static const char *lm_rates(const trainer *t, double sps, char *buf, size_t cap)
{
    buf[0] = 0;
    if (t->lm)
        snprintf(buf, cap, ",\"tokens_per_s\":%.1f,\"mfu\":%.4f", sps * (double)t->desc.input_shape[0],
                 t->peak_gflops > 0
                     ? sps / (t->ddp.world * t->ddp.cp) * t->desc.train_flops_per_sample * 1e-9 / t->peak_gflops
                     : 0.0);
    return buf;
}

/* A generated sample from the model's weights now: the prompt is the first
 * 8 tokens of the validation file; prints the token ids (rank 0). --pp:
 * every rank generates through its pipeline's stages (collective). */
static int print_sample(trainer *t)
{
    const bool piped = t->ddp.pp > 1;
    if (!t->sample_src || (!piped && !dt__ddp_is_main(&t->ddp)))
        return 0;
    if (dt_model_is_meta(t->model)) { /* ZeRO-3: no rank holds the whole model */
        printf("sample at step %lld: not available with --zero 3 (the parameters are sharded)\n",
               (long long)t->global_step);
        return 0;
    }
    int64_t np = dt_tokens_count(t->sample_src) < 8 ? dt_tokens_count(t->sample_src) : 8, n = 0;
    int64_t cap = np + t->o.sample_tokens, *buf = malloc((size_t)cap * sizeof *buf);
    if (!buf || np < 1) {
        free(buf);
        return 0;
    }
    for (int64_t i = 0; i < np; i++) {
        uint32_t id = dt_tokens_at(t->sample_src, i);
        buf[i] = id < t->desc.input_classes ? id : 0;
    }
    dt_generate_params gp = dt_generate_params_default();
    gp.max_new_tokens = t->o.sample_tokens;
    gp.top_k = 40;
    gp.seed = t->o.seed + (uint64_t)t->global_step;
    if ((piped ? dt_strategy_pipe_generate(dt_trainer_strategy(t->tr), &gp, buf, np, buf, cap, &n)
               : dt_model_generate(t->model, &gp, buf, np, buf, cap, &n)) < 0) {
        free(buf);
        return fail(1, "sample");
    }
    if (!dt__ddp_is_main(&t->ddp)) {
        free(buf);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    uint16_t *ids = t->bpe ? malloc((size_t)n * sizeof *ids) : NULL;
    for (int64_t i = 0; ids && i < n; i++)
        ids[i] = (uint16_t)buf[i];
    if (ids && dt_bpe_decode(t->bpe, ids, n, &text, &len) == DT_OK) {
        printf("sample at step %lld:\n%.*s\n", (long long)t->global_step, (int)len, text);
    } else {
        printf("sample at step %lld:", (long long)t->global_step);
        for (int64_t i = 0; i < n; i++)
            printf("%s%lld", i == np ? " | " : " ", (long long)buf[i]);
        printf("\n");
    }
    free(text);
    free(ids);
    fflush(stdout);
    free(buf);
    return 0;
}

/* The optimizer step within the epoch that the position after a step
 * shows: its batches grouped by grad_accum from the epoch's end backwards,
 * so that a run resumed at another world size (which continues at the same
 * fraction of the epoch, dt_trainer_epoch) shows where it is in the epoch
 * and ends it at spe. */
static int64_t epoch_step(const trainer *t)
{
    const dt_trainer_position pos = dt_trainer_get_position(t->tr);
    const int64_t accum = t->o.grad_accum > 0 ? t->o.grad_accum : 1; /* the trainer's (a pipeline's is 1) */
    const int64_t done = pos.epoch > t->epoch ? t->nb : pos.batch; /* batches of the epoch behind us */
    const int64_t left = (t->nb - done + accum - 1) / accum;
    return t->spe - left;
}

/* After every optimizer step: its record (every --log-every steps and at
 * the epoch's end), progress, mid-epoch evaluation. "step" everywhere is the
 * optimizer step (DeepSpeed's global_steps, HF Trainer's global_step); the
 * micro-batches are "micro_step". */
static dt_status on_step(void *ud, dt_trainer *tr, const dt_trainer_metrics *m)
{
    trainer *t = ud;
    if (poll_stop()) /* DDP: the trainer's next step makes every rank agree */
        dt_trainer_request_stop(tr);
    if (m->stop && !g_stop)
        g_stop = SIGTERM;
    if (!t->first_shown && t->prog.mode != DT__PROGRESS_NONE) { /* the time a user waits for training to start */
        const double now = dt_time_s();
        dt__progress_clear(&t->prog);
        printf("first step done %.2f s after start (the step, data loading included: %.2f s)\n", now - t->start_s,
               now - t->t0);
        fflush(stdout);
        dt__progress_exclude(&t->prog, dt_time_s() - now);
    }
    t->first_shown = true;
    if (t->nstep_s == t->cap_step_s) { /* the step times, for the end record's median */
        int64_t c = t->cap_step_s ? 2 * t->cap_step_s : 256;
        double *q = realloc(t->step_s, (size_t)c * sizeof *q);
        if (q)
            t->step_s = q, t->cap_step_s = c;
    }
    if (t->nstep_s < t->cap_step_s)
        t->step_s[t->nstep_s++] = m->step_s;
    struct timespec cts; /* CPU seconds per step after the first (warm-up), for the end record */
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cts) == 0) {
        const double now_cpu = (double)cts.tv_sec + 1e-9 * (double)cts.tv_nsec;
        if (t->ncpu_steps++ == 0)
            t->cpu_first_s = now_cpu;
        t->cpu_last_s = now_cpu;
    }
    double sum = 0;
    for (int i = 0; i < m->nmicro; i++)
        sum += m->micro_loss[i];
    const int64_t before = t->global_step;
    t->global_step = dt_trainer_steps(tr); /* a step skipped by the loss scaler does not count (as for the schedule) */
    t->micro_step += m->nmicro;
    t->step = epoch_step(t);
    t->samples += m->samples;
    if (isfinite(sum)) { /* a step the fp16 loss scaler skipped is left out of the means */
        t->loss_window[t->nloss++ % LOSS_WINDOW] = m->nmicro ? sum / m->nmicro : NAN;
        t->epoch_loss += sum;
        t->epoch_micro += m->nmicro;
    }
    t->log_loss += sum; /* the step's own record shows it (null) */
    t->log_n += m->nmicro;
    const bool advanced = t->global_step != before;
    dt__progress_step(&t->prog, t->step, t->global_step, window_mean(t), m->lr, t->samples);
    /* a step the fp16 loss scaler skipped keeps its number (it is not a step of the schedule, --max-steps or the
       checkpoint names): its record repeats the number, with skipped_steps one higher */
    dt_pg_traffic now = {0};
    if (t->comm_on && (advanced || t->global_step % t->o.log_every == 0 || t->step == t->spe) &&
        dt_pg_traffic_read(world_of(t), &now, NULL, 0) < 0)
        now.counted = 0;
    if (advanced && t->comm_first_step < 0 && now.counted) {
        t->comm_first = now;
        t->comm_first_step = t->global_step;
    }
    if (t->global_step % t->o.log_every == 0 || t->step == t->spe) {
        double el = dt_time_s() - t->t0;
        char lmr[96], comm[96] = "";
        if (now.counted) { /* this rank's bytes since the previous record */
            snprintf(comm, sizeof comm, ",\"comm_bytes_sent\":%llu", (unsigned long long)(now.sent - t->comm_prev.sent));
            if (now.nodes_known)
                snprintf(comm + strlen(comm), sizeof comm - strlen(comm), ",\"comm_bytes_cross_node\":%llu",
                         (unsigned long long)(now.sent_cross_node - t->comm_prev.sent_cross_node));
            t->comm_prev = now;
        }
        if (dt__metrics_write(&t->metrics,
                              "\"event\":\"step\",\"epoch\":%lld,\"step\":%lld,\"epoch_step\":%lld,"
                              "\"micro_step\":%lld,\"loss\":%.6f,\"lr\":%.6g,\"samples_per_s\":%.1f%s,"
                              "\"loss_scale\":%g,\"skipped_steps\":%lld%s",
                              (long long)t->epoch + 1, (long long)t->global_step, (long long)t->step,
                              (long long)t->micro_step, t->log_n ? t->log_loss / (double)t->log_n : NAN, m->lr,
                              el > 0 ? (double)t->samples / el : 0,
                              lm_rates(t, el > 0 ? (double)t->samples / el : 0, lmr, sizeof lmr), m->loss_scale,
                              (long long)m->skipped_steps, comm) < 0) {
            dt__progress_clear(&t->prog);
            t->cb_rc = fail(1, NULL);
            return DT_ERR_CANCELED; /* reported */
        }
        t->log_loss = 0;
        t->log_n = 0;
    }
    if (advanced) {
        if (t->o.eval_every > 0 && t->global_step % t->o.eval_every == 0 && t->step != t->spe) {
            /* Evaluation time is not training time: keep it out of the clock. */
            double e0 = dt_time_s(), tl, ta;
            dt__progress_clear(&t->prog);
            if ((t->cb_rc = eval_and_record(t, t->epoch, &tl, &ta)))
                return DT_ERR_CANCELED; /* reported already */
            if (t->prog.mode != DT__PROGRESS_NONE) {
                if (isnan(ta))
                    printf("step %lld: %s loss %.4f\n", (long long)t->global_step, t->lm ? "val" : "test", tl);
                else
                    printf("step %lld: test loss %.4f, test accuracy %.2f%%\n", (long long)t->global_step, tl,
                           100 * ta);
            }
            t->t0 += dt_time_s() - e0;
            dt__progress_exclude(&t->prog, dt_time_s() - e0);
        }
        if (t->o.sample_every > 0 && t->global_step % t->o.sample_every == 0) {
            double e0 = dt_time_s();
            dt__progress_clear(&t->prog);
            if ((t->cb_rc = print_sample(t)))
                return DT_ERR_CANCELED; /* reported already */
            t->t0 += dt_time_s() - e0;
            dt__progress_exclude(&t->prog, dt_time_s() - e0);
        }
    }
    const int64_t steps = dt_trainer_steps(tr);
    if (g_kill_step > 0 && steps == g_kill_step && t->ddp.rank == g_kill_rank)
        raise(SIGKILL); /* fault injection for the restart tests (DT_FAULT_KILL_STEP) */
    if (t->o.save && t->o.save_every > 0 && steps % t->o.save_every == 0 && steps != t->saved_step) {
        double s0 = dt_time_s();
        dt__progress_clear(&t->prog);
        if ((t->cb_rc = save_ckpt(t)))
            return DT_ERR_CANCELED; /* reported already */
        t->t0 += dt_time_s() - s0; /* the save's stall is not training time */
    }
    if (t->o.max_steps > 0 && steps >= t->o.max_steps) {
        t->max_reached = true; /* every rank reaches it after the same step */
        return DT_ERR_CANCELED;
    }
    return DT_OK;
}

static int train_epoch(trainer *t, int64_t epoch, double *wall_s, double *sps_out)
{
    t->epoch = epoch;
    t->nb = dt_loader_num_batches(t->train_loader);
    t->step = t->samples = t->log_n = t->epoch_micro = 0; /* resumed mid-epoch: the first step says where (epoch_step) */
    t->log_loss = t->epoch_loss = 0;
    dt__progress_epoch_begin(&t->prog, epoch, t->spe);
    t->t0 = dt_time_s();
    dt_trainer_epoch_result res;
    dt_status st = dt_trainer_epoch(t->tr, t->train_loader, dt_dataset_get_info(t->train), epoch, on_step, t, &res);
    if (st == DT_ERR_CANCELED && t->max_reached && !t->cb_rc)
        st = DT_OK; /* --max-steps: a normal end */
    if (st < 0) {
        dt__progress_clear(&t->prog);
        if (st == DT_ERR_CANCELED && t->cb_rc)
            return t->cb_rc; /* the callback reported it */
        const bool data = st == DT_ERR_FORMAT || st == DT_ERR_IO;
        char where[64] = "training data"; /* the data is this rank's share: name the rank */
        if (data && t->ddp.world > 1)
            snprintf(where, sizeof where, "training data on rank %d", t->ddp.rank);
        return fail(data ? 2 : 1, data ? where : "training step");
    }
    if (g_stop || res.stopped) {
        /* the step under way finished (every rank stopped after the same
         * one); with --save, keep it before leaving */
        dt__progress_clear(&t->prog);
        const int sig = g_stop ? (int)g_stop : SIGTERM;
        char saved[600] = "";
        if (t->o.save) {
            int rc = dt_trainer_steps(t->tr) != t->saved_step ? save_ckpt(t) : 0;
            if (!rc && dt_trainer_save_wait(t->tr) < 0)
                rc = fail(1, "checkpoint");
            if (rc) {
                dt__cli_err("dtrain train: interrupted by signal %d at step %lld; the checkpoint was not saved\n",
                            sig, (long long)t->global_step);
                return rc;
            }
            snprintf(saved, sizeof saved, "; checkpoint %s/step-%08lld saved", t->o.save,
                     (long long)dt_trainer_steps(t->tr));
        }
        dt__cli_err("dtrain train: interrupted by signal %d at step %lld%s\n", sig, (long long)t->global_step, saved);
        return 130;
    }
    *wall_s = dt_time_s() - t->t0;
    *sps_out = *wall_s > 0 ? (double)t->samples / *wall_s : 0;
    dt__progress_epoch_end(&t->prog, t->step, window_mean(t), *wall_s, *sps_out);
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"epoch\",\"epoch\":%lld,\"step\":%lld,\"wall_s\":%.4f,"
                          "\"samples_per_s\":%.1f,\"train_loss\":%.6f,\"train_loss_last100\":%.6f",
                          (long long)epoch + 1, (long long)t->global_step, *wall_s, *sps_out,
                          t->epoch_micro ? t->epoch_loss / (double)t->epoch_micro : NAN, window_mean(t)) < 0)
        return fail(1, NULL);
    return 0;
}

/* A run whose every optimizer step overflowed and was skipped trained
 * nothing: an error (exit 1), never a success. */
static int check_all_skipped(trainer *t)
{
    dt_loss_scaler_state ls;
    const dt_loss_scaler *sc = dt_trainer_loss_scaler(t->tr);
    if (!sc)
        return 0;
    dt_loss_scaler_get_state(sc, &ls);
    if (ls.iter == 0 || ls.skipped < ls.iter)
        return 0;
    dt__cli_err("dtrain train: every one of the %lld optimizer steps overflowed at loss scale %g and was skipped: "
                "nothing was trained (lower --loss-scale or use dynamic loss scaling, check the data for "
                "inf/NaN)\n", (long long)ls.iter, ls.scale);
    return 1;
}

/* Every rank was given the same training options (a rank with another
 * optimizer, learning rate, seed or clipping would train apart and still
 * exit 0): compared once at start, exit 2 naming the options and ranks. */
static int check_same(trainer *t)
{
    enum { CAP = 160 };
    const char *names[CAP];
    char(*vals)[512] = malloc(CAP * sizeof *vals);
    char(*flags)[40] = malloc(CAP * sizeof *flags);
    dt_trainer_field f[CAP];
    if (!vals || !flags) {
        free(vals);
        free(flags);
        return fail(1, "out of memory");
    }
    int n = dt__train_shared_opts(&t->o, names, vals, CAP);
    for (int i = 0; i < n; i++) {
        snprintf(flags[i], sizeof flags[i], "--%s", names[i]);
        f[i] = (dt_trainer_field){flags[i], vals[i]};
    }
    dt_status st = dt_trainer_check_same(t->tr, f, n);
    free(vals);
    free(flags);
    if (st == DT_ERR_MISMATCH) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    return st < 0 ? fail(1, "comparing the ranks' options") : 0;
}

static void cleanup(trainer *t)
{
    dt_loader_free(t->train_loader);
    dt_loader_free(t->test_loader);
    dt_sampler_free(t->train_sampler);
    dt_sampler_free(t->test_sampler);
    dt_dataset_free(t->train);
    dt_dataset_free(t->test_shard);
    dt_dataset_free(t->test);
    dt_dataset_free(t->base_train);
    dt_dataset_free(t->base_test);
    dt_tokens_close(t->sample_src);
    dt_bpe_free(t->bpe);
    dt_tokenizer_free(t->tok);
    free(t->freeze);
    free(t->freeze_buf);
    free(t->lora_targets);
    free(t->lora_buf);
    dt_lora_peft_config_free(&t->peft);
    free(t->peft_targets);
    dt__tuning_free(&t->ck_tuning);
    free(t->ck_path);
    dt_trainer_free(t->tr); /* and its strategy (DDP) before the model and the group */
    dt_trace_close(); /* a run that failed still leaves this rank's timeline */
    dt__ddp_free_ddp(&t->ddp);
    dt_model_free(t->model);
    dt__ddp_free_group(&t->ddp);
}

static int train_main(int argc, char **argv, const char *eval_ckpt);

int dt_cmd_train(int argc, char **argv) { return train_main(argc, argv, NULL); }

int dt__train_eval_ckpt(int argc, char **argv, const char *ckpt, bool json, dt_tokenizer *kept)
{
    dt__cli_err_command("dtrain eval"); /* its errors are dtrain eval's */
    g_eval_json = json;
    g_eval_tok = kept;
    int rc = train_main(argc, argv, ckpt);
    dt_tokenizer_free(g_eval_tok); /* not taken: the setup stopped before */
    g_eval_tok = NULL;
    dt__cli_err_command(NULL);
    return rc;
}

/* The whole command; with eval_ckpt (dtrain eval --ckpt): build the same
 * model and data, load the checkpoint's weights, evaluate, print. */
static int train_main(int argc, char **argv, const char *eval_ckpt)
{
    trainer *t = calloc(1, sizeof *t);
    if (!t) {
        dt__cli_err("dtrain train: out of memory\n");
        return 1;
    }
    t->start_s = dt_time_s();
    t->resumed_step = -1; /* a fresh run until setup_resume loads a checkpoint */
    int rc = dt__train_parse(argc, argv, &t->o);
    if (!rc)
        rc = dt__train_config(argc, argv, &t->o); /* --config FILE, AIAK_* (train_config.c) */
    if (rc) {
        dt_config_free(t->o.cfg);
        free(t);
        return rc == 1 ? 0 : rc;
    }
    /* Before any thread starts (see the top). Never unblocked: the command
     * ends the process, and a signal that comes after the one taken (or
     * after the last step) stays pending and is dropped at exit instead of
     * killing a run that is already writing its end record. */
    sigemptyset(&g_stop_set);
    sigaddset(&g_stop_set, SIGINT);
    sigaddset(&g_stop_set, SIGTERM);
    sigaddset(&g_stop_set, SIGHUP); /* a closed terminal or dropped SSH session: save and stop, as SIGTERM */
    pthread_sigmask(SIG_BLOCK, &g_stop_set, NULL);
    if (t->o.threads > 0)
        dt_set_num_threads((int)t->o.threads);
    int64_t restart = 0;
    if (dt_env_int("DT_FAULT_KILL_STEP", 0, 0, INT64_MAX, &g_kill_step) < 0 ||
        dt_env_int("DT_FAULT_KILL_RANK", 0, 0, 1 << 20, &g_kill_rank) < 0 ||
        dt_env_int("DT_RESTART_COUNT", 0, 0, INT64_MAX, &restart) < 0) {
        rc = fail(2, "environment");
        goto out;
    }
    if (restart > 0)
        g_kill_step = 0;
    if (t->o.plan && !eval_ckpt && (rc = dt__train_plan_auto(&t->o)))
        goto out;
    if ((rc = dt__ddp_setup(&t->ddp, &t->o)))
        goto out;
    if (dt__ddp_is_main(&t->ddp) && !eval_ckpt) {
        dt__train_config_print(&t->o); /* warnings and the effective configuration, once */
    }
    if ((rc = freeze_patterns(t, eval_ckpt)) || (rc = vocab_size_from_vocab(t)) || (rc = check_memory(t)) || (rc = setup_model(t)) || (rc = setup_data(t)) || (rc = wrap(t)) ||
        (rc = setup_trainer(t)) || (rc = check_same(t)) || (rc = make_user_json(t)))
        goto out;
    if (eval_ckpt) {
        if ((rc = open_metrics(t)))
            goto out;
        double el, ea;
        if (dt_trainer_load_weights(t->tr, eval_ckpt) < 0) {
            rc = fail(bad_input_status(dt_last_status()) ? 2 : 1, "--ckpt");
            goto out;
        }
        if ((rc = eval_and_record(t, 0, &el, &ea)))
            goto out;
        if (dt__ddp_is_main(&t->ddp) && g_eval_json) {
            char ms[1200], acc[32] = "null";
            dt__json_quote(t->o.model, ms, sizeof ms);
            if (!isnan(ea))
                snprintf(acc, sizeof acc, "%.9g", ea);
            printf("{\"loss\":%.9g,\"accuracy\":%s,\"items\":%lld,\"seq\":%lld,\"model\":%s}\n", el, acc,
                   (long long)dt_dataset_length(t->test), t->lm ? (long long)t->desc.input_shape[0] : 0LL, ms);
        } else if (dt__ddp_is_main(&t->ddp)) {
            printf("%s loss: %.4f\n", t->lm ? "val" : "test", el);
            if (!isnan(ea))
                printf("test accuracy: %.2f%% (%lld items)\n", 100 * ea, (long long)dt_dataset_length(t->test));
        }
        rc = 0;
        goto out;
    }
    if ((rc = setup_save(t)) || (rc = setup_resume(t)))
        goto out;
    if (nothing_left(t)) /* says so; touches nothing */
        goto out;
    if ((rc = open_metrics(t)) || (rc = comm_start(t)))
        goto out;
    int64_t ntrain = dt_dataset_length(t->train), ntest = dt_dataset_length(t->test);
    int64_t spe = dt_loader_num_batches(t->train_loader);
    char data_q[1200], scaler_json[256] = "null";
    dt__json_quote(t->o.data, data_q, sizeof data_q);
    const dt_loss_scaler *ls = dt_trainer_loss_scaler(t->tr);
    if (ls) /* the rule, and the scale the run starts from */
        snprintf(scaler_json, sizeof scaler_json, "{\"rule\":\"%s\",\"dynamic\":%s,\"initial_scale\":%g}",
                 t->o.scaler, dt_loss_scaler_is_dynamic(ls) ? "true" : "false", dt_loss_scaler_scale(ls));
    if (dt__metrics_write(&t->metrics,
                          "\"event\":\"start\",\"model\":\"%s\",\"data\":%s,\"epochs\":%lld,\"max_steps\":%lld,"
                          "\"batch\":%lld,\"grad_accum\":%lld,\"world_size\":%d,\"optimizer\":\"%s\",\"lr\":%g,"
                          "\"lr_schedule\":\"%s\",\"warmup_steps\":%lld,\"total_steps\":%lld,"
                          "\"seed\":%llu,\"rng\":\"%s\",\"threads\":%d,\"train_items\":%lld,"
                          "\"test_items\":%lld,\"steps_per_epoch\":%lld,\"batches_per_epoch\":%lld,\"params\":%zu,"
                          "\"precision\":\"%s\",\"reduce_dtype\":\"%s\",\"keep_bn_fp32\":%s,\"loss_scaler\":%s,"
                          "\"omp_wait\":\"%s%s\"",
                          t->o.model, data_q, (long long)t->epochs, (long long)t->o.max_steps, (long long)t->o.batch,
                          (long long)t->o.grad_accum, t->ddp.world, t->o.optimizer, t->o.lr,
                          dt_sched_kind_name(t->sched.kind), (long long)t->sched.warmup_steps,
                          (long long)t->sched.total_steps, (unsigned long long)t->o.seed, t->o.rng,
                          dt_get_num_threads(), (long long)ntrain, (long long)ntest, (long long)t->spe, (long long)spe,
                          dt_model_param_count(t->model), t->o.precision,
                          t->o.reduce_dtype ? t->o.reduce_dtype : t->o.precision, t->o.keep_bn_fp32,
                          scaler_json, getenv("GOMP_SPINCOUNT") ? "GOMP_SPINCOUNT=" : "",
                          getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT")
                          : getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "runtime default") < 0) {
        rc = fail(1, NULL);
        goto out;
    }
    if (dt__ddp_is_main(&t->ddp)) /* after the setup's and the files' errors, as training starts */
        warn_oversubscribed(t);
    if (t->o.cfg) { /* the effective config: with --config, or when AIAK_* set a key */
        char *eff = dt_config_effective_json(t->o.cfg), file_q[1200];
        dt__json_quote(t->o.config ? t->o.config : "", file_q, sizeof file_q);
        bool empty = eff && !strcmp(eff, "{\"values\":{},\"from\":{}}") && !t->o.config;
        if (!eff || (!empty && dt__metrics_write(&t->metrics, "\"event\":\"config\",\"file\":%s,\"effective\":%s", file_q,
                                      eff) < 0)) {
            free(eff);
            rc = fail(1, NULL);
            goto out;
        }
        free(eff);
    }
    const dt_trainer_position pos0 = dt_trainer_get_position(t->tr);
    if (t->o.max_steps > 0 && t->epochs < pos0.epoch + 1)
        t->epochs = pos0.epoch + 1; /* resumed at another world size: at least the epoch it is in */
    dt__progress_init(&t->prog, dt__ddp_is_main(&t->ddp) ? t->o.progress : "none", stdout, t->epochs,
                      t->o.log_every);
    if (t->lm) {
        /* the MFU of the step's model FLOPs (forward + backward, per rank) */
        t->peak_gflops = t->o.mfu_peak;
        if (t->peak_gflops <= 0 && dt_k_bench_matmul(1024, DT_F32, 3, &t->peak_gflops) < 0)
            t->peak_gflops = 0;
        dt__progress_set_rates(&t->prog, t->desc.input_shape[0],
                               t->desc.train_flops_per_sample / (t->ddp.world * t->ddp.cp),
                               t->peak_gflops);
    }
    if (t->prog.mode != DT__PROGRESS_NONE)
        printf("training %s (%zu parameters%s) on %s: %lld items, %lld steps/epoch of %lld, %s lr %g, "
               "%d threads\n", t->o.model, dt_model_param_count(t->model),
               t->ddp.tp > 1 ? " in this rank's slice" : "", t->o.data,
               (long long)ntrain, (long long)t->spe, (long long)t->o.batch * t->o.grad_accum, t->o.optimizer,
               t->o.lr, dt_get_num_threads());
    if (t->prog.mode != DT__PROGRESS_NONE && t->o.precision_auto)
        printf("precision auto: %s (%s)\n", t->o.precision, t->o.precision_auto);
    if (t->prog.mode != DT__PROGRESS_NONE) {
        char len[160], warm[64] = "";
        if (t->o.max_steps > 0)
            snprintf(len, sizeof len, "%lld optimizer steps (--max-steps; %lld epoch%s of %lld steps; it overrides "
                     "--epochs, as HF Trainer's max_steps)", (long long)t->o.max_steps, (long long)t->epochs,
                     t->epochs == 1 ? "" : "s", (long long)t->spe);
        else
            snprintf(len, sizeof len, "%lld epoch%s of %lld optimizer steps (%lld)", (long long)t->epochs,
                     t->epochs == 1 ? "" : "s", (long long)t->spe, (long long)(t->epochs * t->spe));
        if (t->sched.warmup_steps > 0)
            snprintf(warm, sizeof warm, ", %s warm-up over %lld steps",
                     t->sched.warmup == DT_WARMUP_LOG ? "log" : "linear", (long long)t->sched.warmup_steps);
        printf("run: %s; lr schedule %s%s", len, dt_sched_kind_name(t->sched.kind), warm);
        if (t->sched.kind == DT_SCHED_COSINE || t->sched.kind == DT_SCHED_LINEAR)
            printf(", total_steps %lld (to %g)", (long long)t->sched.total_steps, t->sched.min_lr);
        printf("\n");
    }
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.tp > 1)
        printf("tensor parallel: %d ranks per group (each holds 1/%d of the weights), %d data-parallel group%s%s\n",
               t->ddp.tp, t->ddp.tp, t->ddp.world, t->ddp.world == 1 ? "" : "s",
               t->o.sequence_parallel ? "; sequence parallel (each holds 1/N of the tokens between the blocks)" : "");
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.cp > 1)
        printf("context parallel: %d ranks per sequence (each holds 1/%d of the positions%s), %s attention; "
               "gradients reduced over %d data-parallel x %d context-parallel ranks\n",
               t->ddp.cp, t->ddp.cp, t->ddp.cpp.balance ? ": chunks r and 2N-1-r of 2N" : "",
               dt_cp_impl_name(t->ddp.cpp.impl), t->ddp.world, t->ddp.cp);
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.pp > 1)
    {
        char tpx[48] = "";
        if (t->ddp.tp > 1)
            snprintf(tpx, sizeof tpx, "%d tensor-parallel x ", t->ddp.tp);
        printf("pipeline parallel: %d stages x %s%d data-parallel%s, schedule %s, %d micro-batches per batch\n",
               t->ddp.pp, tpx, t->ddp.world, t->ddp.stage == 1 ? " (ZeRO-1)" : "", t->ddp.pp_sched,
               t->ddp.pp_micro);
        print_pipe_cut(t);
    }
    if (t->prog.mode != DT__PROGRESS_NONE && t->ddp.world > 1)
        printf("data parallel: %d ranks, batch %lld per rank (%lld per step)%s\n", t->ddp.world,
               (long long)t->o.batch, (long long)t->o.batch * t->ddp.world,
               t->ddp.nconverted ? ", SyncBatchNorm" : "");
    if (t->prog.mode != DT__PROGRESS_NONE && t->ckpt_modules > 0)
        printf("activation checkpointing: %d %s modules recompute their forward in backward\n",
               t->ckpt_modules, t->desc.ckpt_unit);
    fflush(stdout);
    double wall = 0, sps = 0, tl = NAN, ta = NAN, wall_sum = 0;
    bool evaluated = false; /* (a NaN test loss is a result, not "not evaluated") */
    /* --max-steps sets the run's length: the loader wraps into as many epochs as it takes (each reshuffled:
       the sampler's order is a function of the seed and the epoch, as DistributedSampler.set_epoch) */
    int idle = 0; /* epochs in a row without an optimizer step */
    for (int64_t e = pos0.epoch; (t->o.max_steps > 0 || e < t->o.epochs) && !t->max_reached; e++) {
        const int64_t s0 = dt_trainer_steps(t->tr);
        if (t->o.max_steps > 0 && s0 >= t->o.max_steps)
            break;
        if (e >= t->epochs)
            t->prog.epochs = t->epochs = e + 1;
        if ((rc = train_epoch(t, e, &wall, &sps)))
            goto out;
        if (dt_trainer_steps(t->tr) != s0) {
            idle = 0;
        } else if (t->o.max_steps > 0 && ++idle >= 2) { /* no end in sight: say so rather than loop */
            dt__cli_err("dtrain train: epochs %lld and %lld took no optimizer step (every step skipped by the loss "
                        "scaler?): stopping short of --max-steps %lld\n", (long long)e, (long long)e + 1,
                        (long long)t->o.max_steps);
            rc = 1;
            goto out;
        }
        wall_sum += wall;
        if (!t->o.no_eval && (rc = eval_and_record(t, e, &tl, &ta)))
            goto out;
        evaluated = !t->o.no_eval;
    }
    if (!t->o.no_eval && !evaluated && (rc = eval_and_record(t, t->epoch, &tl, &ta)))
        goto out; /* had nothing left to train (a resumed run at its end) */
    if ((rc = check_all_skipped(t)))
        goto out;
    if (t->o.save && dt_trainer_steps(t->tr) != t->saved_step && (rc = save_ckpt(t)))
        goto out;
    if (t->o.save && dt_trainer_save_wait(t->tr) < 0) { /* an asynchronous save still being written */
        rc = fail(1, "checkpoint");
        goto out;
    }
    if ((rc = save_outputs(t)))
        goto out;
    if (t->o.sample_every > 0 && t->global_step % t->o.sample_every != 0 && (rc = print_sample(t)))
        goto out;
    if ((rc = dt__ddp_memory_report(&t->ddp, t->tr))) /* ZeRO: collective */
        goto out;
    /* The final figures, one per line, stable for scripts (demo.sh greps them). DDP: rank 0. */
    if (dt__ddp_is_main(&t->ddp)) {
        if (!t->o.no_eval) {
            printf("%s loss: %.4f\n", t->lm ? "val" : "test", tl);
            if (!isnan(ta))
                printf("test accuracy: %.2f%% (%lld items)\n", 100 * ta, (long long)ntest);
        }
        printf("train loss (last %d steps): %.4f\n", LOSS_WINDOW, window_mean(t));
        printf("epoch wall time: %.2f s (last epoch; data loading included, evaluation excluded)\n", wall);
        printf("samples/s: %.0f\n", sps);
        if (t->lm) {
            printf("tokens/s: %.0f\n", sps * (double)t->desc.input_shape[0]);
            if (t->peak_gflops > 0)
                printf("MFU: %.1f%% of %.1f GFLOP/s (f32 matmul peak, per rank)\n",
                       100.0 * sps / (t->ddp.world * t->ddp.cp) * t->desc.train_flops_per_sample * 1e-9 / t->peak_gflops,
                       t->peak_gflops);
        }
        double cf, cr;
        uint64_t cn;
        if (t->ckpt_profile && dt_model_checkpoint_profile(t->model, &cf, &cr, &cn) == DT_OK)
            printf("activation checkpointing profile: %llu regions, %.3f s in first runs, %.3f s recomputing\n",
                   (unsigned long long)cn, cf, cr);
        if (t->epochs > 1)
            printf("total training time: %.2f s over %lld epochs\n", wall_sum, (long long)t->epochs);
        char ddp_line[400];
        dt__ddp_summary(&t->ddp, t->global_step, ddp_line, sizeof ddp_line);
        if (ddp_line[0])
            printf("%s\n", ddp_line);
        const dt_offload_optim *off = dt_trainer_offload(t->tr);
        if (off) {
            dt_nvme_stats ns;
            dt_nvme_store_stats(dt_offload_optim_store(off), &ns);
            printf("offload: optimizer state in %s (%s I/O), %zu sub-groups, %.1f MiB of buffers; %.1f MiB read, "
                   "%.1f MiB written, %.2f s waiting for I/O\n", dt_nvme_store_dir(dt_offload_optim_store(off)),
                   dt_offload_io_name(dt_nvme_store_io(dt_offload_optim_store(off))),
                   dt_offload_optim_num_subgroups(off), dt_offload_optim_buffer_bytes(off) / 1048576.0,
                   ns.bytes_read / 1048576.0, ns.bytes_written / 1048576.0, ns.wait_s);
        }
    }
    if ((rc = measure(t)))
        goto out;
    if (t->metrics_open) /* the planner's prediction for this layout, beside the measured figures */
        dt__train_predict(&t->o, t->ddp.world, t->ddp.tp > 1 ? t->ddp.tp : 1, t->ddp.pp > 1 ? t->ddp.pp : 1,
                          t->ddp.stage, &t->measured.predicted_peak_rss_bytes, &t->measured.predicted_step_ms);
    dt_trainer_free(t->tr); /* writes this rank's timeline (--trace) */
    t->tr = NULL;
    if ((rc = trace_merge(t)))
        goto out;
    fflush(stdout);
    rc = 0;
out:
    /* the end record says how the run ended; only "ok" publishes FILE */
    if (t->metrics_open &&
        dt__metrics_close(&t->metrics, rc == 0 ? "ok" : rc == 130 ? "interrupted" : "failed",
                          t->global_step, rc, rc == 0 ? &t->measured : NULL) < 0 && rc == 0)
        rc = fail(1, NULL);
    cleanup(t);
    dt_config_free(t->o.cfg);
    free(t->user_json);
    free(t->step_s);
    free(t);
    return rc;
}
