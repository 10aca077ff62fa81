/* tools/train_run.h — the state of one `dtrain train` (or `dtrain eval
 * --ckpt`) run, shared by the files the command is split into:
 *   cmd_train.c    the command: its flow (train_main), the end-of-run
 *                  report and record, eval's one evaluation, the clean-up;
 *   train_setup.c  the model, the data, the strategy and the trainer;
 *   train_save.c   checkpoints, the options they keep, exports, resuming;
 *   train_loop.c   the stop signals, the metrics file, evaluation, the
 *                  per-step callback and the epoch loop.
 * Functions returning int return 0 or the process exit code (1 runtime
 * failure, 2 bad input, 130 stopped by a signal) after printing one line. */
#ifndef DT_TOOLS_TRAIN_RUN_H
#define DT_TOOLS_TRAIN_RUN_H

#include "train.h"
#include "train_ddp.h"

#include "dtrain/ckpt.h"
#include "dtrain/data.h"
#include "dtrain/models.h"
#include "dtrain/tokenizer.h"
#include "dtrain/train.h"

#include <stdbool.h>
#include <stdint.h>

#define LOSS_WINDOW 100 /* "train loss over the last 100 steps" */

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
    const char *peak_what;        /* what peak_gflops is ("bf16 matmul peak", ...) */
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
    char *peft_save;              /* its modules_to_save joined so (o.lora_save_modules), or NULL */
    char *save_buf;               /* --lora-modules-to-save split at its commas */
    const char **save_modules;    /* NULL-terminated (t->lora.modules_to_save) */
    char *peft_layers, *peft_pattern; /* its layers_to_transform and layers_pattern so (NULL: none) */
    int64_t *layers;              /* --lora-layers-to-transform (t->lora.layers) */
    char *pattern_buf;            /* --lora-layers-pattern split at its commas */
    const char **patterns;        /* NULL-terminated (t->lora.layers_pattern) */
    dt_lora_pattern *lora_pattern; /* rank_pattern, alpha_pattern, exclude_modules (t->lora's callbacks), or NULL */
    char *exclude_json;           /* --lora-exclude-modules as a JSON list */
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
    bool failed;                  /* the command's exit code is not 0 (set before the clean-up) */
    int64_t resumed_step;         /* the checkpoint's step when resumed (-1: a fresh run) */
    int64_t eval_step;            /* the optimizer step of the last evaluation (-1: none) */
    double eval_loss, eval_acc;   /* its results */
    dt_trainer_resume_info ri;    /* what the resume loaded (resumed_step >= 0) */
    char *user_json;              /* the options a checkpoint keeps (dtrain eval --ckpt reads them) */
    double log_loss, epoch_loss, t0;
    int ckpt_modules;             /* modules checkpointed (--activation-checkpointing, the config's block) */
    bool ckpt_profile;            /* activation_checkpointing.profile: print the totals at the end */
    double start_s;               /* when the command started (time to the first step) */
    bool first_shown;             /* "first step ..." printed */
    char trace[4096];             /* --trace DIR ("" = off): merged at the end */
    dt_hf_save_lock *hf_lock;     /* rank 0: --save-hf OUT, held from the start (NULL: none) */
    dt_dir_hold *lora_hold;       /* rank 0: --save-lora DIR, held from the start (NULL: none) */
    dt_monitor *monitor;          /* rank 0: --tensorboard / the config's monitors (the trainer writes) */
    bool wall_clock;              /* the config's wall_clock_breakdown: each step's times printed */
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
    bool eval_json;               /* dtrain eval --json: stdout holds the JSON object only */
    bool eval_only;               /* dtrain eval: the run evaluates a checkpoint (no --no-eval to suggest) */
    dt_tokenizer *eval_tok;       /* dtrain eval --ckpt: the tokenizer its checkpoint keeps, until taken */
    /* Fault injection for the restart tests: DT_FAULT_KILL_STEP=k makes rank
     * DT_FAULT_KILL_RANK (default 0) SIGKILL itself right after optimizer step
     * k, on the first attempt only (DT_RESTART_COUNT 0 or unset), so that a test
     * can kill a rank at a step it chose. */
    int64_t kill_step, kill_rank;
} dt__train_run;

/* cmd_train.c: one line "dtrain train: <what>: <dt_last_error()>"; returns code. */
int dt__tr_fail(int code, const char *what);

/* train_setup.c */
/* The model's build configuration from the options (GPT sizes, dropout, LoRA). */
dt_model_config dt__tr_model_config(const dt__train_run *t);
/* --lora-from DIR: its adapter_config.json becomes the run's LoRA settings. */
int dt__tr_lora_from(dt__train_run *t);
/* --freeze and the LoRA targets split into patterns (eval_ckpt: the checkpoint's must match). */
int dt__tr_freeze_patterns(dt__train_run *t, const char *eval_ckpt);
/* Said once when the default thread count exceeds the cores the other processes leave free. */
void dt__tr_warn_oversubscribed(const dt__train_run *t);
/* --pp: every stage's units, rank and parameters. */
void dt__tr_print_pipe_cut(const dt__train_run *t);
/* The GPT vocabulary size: --vocab-size, --tokenizer, --vocab or the token files (said at start). */
int dt__tr_vocab_size_from_vocab(dt__train_run *t);
/* The file at path as a JSON string (cJSON_free it); NULL after an error naming opt. */
char *dt__tr_vocab_quoted(const char *opt, const char *path);
/* The run's memory per rank estimated from a meta model (no weights) and checked against the machine's. */
int dt__tr_check_memory(dt__train_run *t);
/* The model (and its input shape). */
int dt__tr_setup_model(dt__train_run *t);
/* The data sets, samplers and loaders (errors name the file). */
int dt__tr_setup_data(dt__train_run *t);
/* The strategy: DDP, ZeRO, TP, PP, ... around the model. */
int dt__tr_wrap(dt__train_run *t);
/* The group spanning every rank. */
dt_pg *dt__tr_world_of(const dt__train_run *t);
/* The byte counters at start (every rank, before the first step): the peers' nodes and the counts so far. */
int dt__tr_comm_start(dt__train_run *t);
/* The end record's measured figures: the ranks' largest peak RSS (collective) and the median step time. */
int dt__tr_measure(dt__train_run *t);
/* --trace DIR: the ranks' timelines merged at the end. */
int dt__tr_trace_merge(dt__train_run *t);
/* The library's trainer: optimizer, schedule, precision, the step. */
int dt__tr_setup_trainer(dt__train_run *t);

/* train_save.c */
/* A checkpoint that does not fit this run or is damaged: bad input (exit 2). */
bool dt__tr_bad_input_status(dt_status st);
/* --lora-from DIR's adapter weights, over the base's (train and eval): 0, or the exit code after saying why. */
int dt__tr_load_lora_from(dt__train_run *t);
/* The options a checkpoint keeps (t->user_json). */
int dt__tr_make_user_json(dt__train_run *t);
/* A checkpoint of the run now (--save). */
int dt__tr_save_ckpt(dt__train_run *t);
/* The end-of-run exports: --save-hf (complete or absent) and --save-lora (PEFT's format). */
int dt__tr_save_outputs(dt__train_run *t);
/* --save DIR checked before the run starts. */
int dt__tr_setup_save(dt__train_run *t);
/* The run's start: --resume (a checkpoint's weights and state, "auto": the newest), else the initial weights (--init-from, --lora-from). */
int dt__tr_setup_resume(dt__train_run *t);
/* A resumed run with no step left: says so, true. */
bool dt__tr_nothing_left(dt__train_run *t);

/* train_loop.c */
/* SIGINT, SIGTERM, SIGHUP blocked in this thread and every thread it starts
 * after (taken between steps; see cmd_train.c's top). */
void dt__tr_block_stop_signals(void);
/* --metrics FILE opened (rank 0), with the resume record. */
int dt__tr_open_metrics(dt__train_run *t);
/* The mean test loss and accuracy (a fraction; NAN when not a classifier), summed over the ranks' shares. */
int dt__tr_evaluate(dt__train_run *t, double *loss_out, double *acc_out);
/* evaluate, printed and recorded for epoch. */
int dt__tr_eval_and_record(dt__train_run *t, int64_t epoch, double *tl, double *ta);
/* The mean loss of the last LOSS_WINDOW steps. */
double dt__tr_window_mean(const dt__train_run *t);
/* --sample-every: a sample generated from the run's weights, printed. */
int dt__tr_print_sample(dt__train_run *t);
/* One epoch of steps; its wall time and samples/s. */
int dt__tr_train_epoch(dt__train_run *t, int64_t epoch, double *wall_s, double *sps_out);
/* A run whose every optimizer step overflowed and was skipped trained nothing: exit 1, never a success. */
int dt__tr_check_all_skipped(dt__train_run *t);
/* The ranks ran with the same options (exit 2 naming the first that differs). */
int dt__tr_check_same(dt__train_run *t);

#endif
