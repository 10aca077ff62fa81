/* tools/train.h — internals of `dtrain train` and `dtrain plot`, shared by
 * tools/cmd_train.c and tools/train_*.c. Not a public interface. */
#ifndef DT_TOOLS_TRAIN_H
#define DT_TOOLS_TRAIN_H

#include "dtrain/base.h"
#include "dtrain/ckpt.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"
#include "dtrain/tokenizer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- options (train_args.c) ------------------------------------------------- */
typedef struct dt__train_opts {
    const char *model;        /* convnet | mlp | a GPT-2 configuration (gpt2, gpt-mini, ...) */
    const char *data;         /* fashion-mnist | mnist:DIR | idx:DIR | random | tokens:FILE (default:
                                 fashion-mnist for convnet, random for mlp) */
    int64_t epochs;           /* >= 1, default 1 */
    int64_t batch;            /* per process, default 100 */
    const char *optimizer;    /* sgd | adam | adamw | lamb, default sgd */
    double lr;                /* default 0.01 */
    double momentum;          /* SGD momentum, default 0 */
    double weight_decay;      /* default: the optimizer's own (-1 = unset) */
    const char *betas;        /* --betas B1,B2 as given (NULL = the optimizer's) */
    double beta[2];           /* parsed by dt__train_check when beta_set */
    bool beta_set;
    double eps;               /* adam/adamw/lamb epsilon (-1 = the optimizer's) */
    const char *lr_schedule;  /* constant | step | cosine | linear, default constant */
    int64_t warmup;           /* linear warm-up steps, default 0 */
    int64_t step_size;        /* step schedule: steps per decay (default: one epoch) */
    double gamma;             /* step schedule factor; -1 when not given (0.1: dt__train_gamma) */
    double clip_grad_norm;    /* 0 = off */
    int64_t threads;          /* compute threads, 0 = library default */
    int64_t eval_every;       /* evaluate every N steps too (0 = only at epoch ends) */
    const char *metrics;      /* JSON-lines file, NULL = none */
    const char *tensorboard;  /* --tensorboard DIR: TensorBoard event files (rank 0), NULL = none */
    int64_t log_every;        /* steps between plain lines / step records, default 100 */
    bool drop_last;           /* --dataloader-drop-last: the epoch's short last training batch dropped */
    uint64_t seed;            /* default 0 */
    const char *rng;          /* torch | philox: how seed draws init and order (default torch) */
    int64_t limit_train;      /* use only the first N training items (0 = all) */
    int64_t limit_test;       /* use only the first N test items (0 = all) */
    const char *progress;     /* auto | bar | plain | none, default auto */
    int64_t prefetch;         /* batches the loader prepares ahead, default 2 */
    int64_t random_items;     /* items of the random train set (--data random only), default 6000 */
    bool no_eval;             /* skip the final evaluation */
    /* DDP (tools/train_ddp.c) */
    bool sync_bn;             /* BatchNorm2d -> SyncBatchNorm when distributed */
    double bucket_mb;         /* DDP bucket cap in MiB, 0 = default 25 */
    int64_t grad_accum;       /* micro-batches per optimizer step, default 1 */
    const char *comm_hook;    /* allreduce | fp16 | bf16 | powersgd, NULL = allreduce (or AIAK_*) */
    int64_t powersgd_rank;    /* 0 = unset (1) */
    int64_t powersgd_start_iter; /* -1 = unset (1000) */
    bool powersgd_no_error_feedback, powersgd_no_warm_start;
    /* optimizer-state offload (src/parallel/zero/offload.c) */
    const char *offload;      /* NULL = none | "cpu" | "nvme:PATH" (checked here) */
    const char *offload_param;/* stage 3 parameter offload: NULL = none | "cpu" | "nvme:PATH" */
    /* model size (the mlp; 0 = the zoo's default) */
    int64_t mlp_dim, mlp_hidden;
    /* language models (GPT-2 zoo models, cmd_train.c) */
    const char *val_data;     /* tokens:FILE, the validation split (NULL = none) */
    int64_t seq;              /* tokens per sample (default: the block size) */
    int64_t n_layer, n_head, n_embd, block_size, vocab_size; /* 0 = the named configuration's */
    double dropout;           /* default 0 */
    bool act_ckpt;            /* activation checkpointing of every GPT2Block */
    const char *plan;         /* NULL | "auto": the planner picks the layout (dt_plan_search) */
    const char *layout_flag;  /* the first layout flag given on the command line ("--tp"), NULL none */
    const char *fp16_flag;    /* the first fp16 loss-scaling flag given ("--hysteresis"), NULL none */
    int64_t sample_every;     /* print a generated sample every N steps (0 = never) */
    int64_t sample_tokens;    /* its length; 0 when not given (64: dt__train_sample_tokens) */
    double mfu_peak;          /* GFLOP/s the MFU is a fraction of (0 = measure the matmul peak) */
    const char *vocab;        /* BPE vocabulary (dtrain tokenize): samples printed as text */
    const char *tokenizer;    /* tokenizer.json for --data text:/jsonl:/parquet: */
    bool tokenizer_of_model;  /* tokenizer is --model hf:DIR's own tokenizer.json (not given) */
    bool loss_mask;           /* --loss-mask: prompt/completion jsonl/parquet, the loss on the completions only */
    bool assistant_only_loss; /* --assistant-only-loss: conversations, the loss on the assistant's turns only */
    const char *packing;      /* --packing on | off: text records packed into windows, or one a sample (padded) */
    const char *chat_template; /* --chat-template FILE: a Jinja chat template in place of the tokenizer's */
    const char *freeze;       /* comma-separated name patterns of frozen parameters (NULL = none) */
    const char *lora_targets; /* LoRA: comma-separated layer names (NULL = no LoRA) */
    int64_t lora_r;           /* 0 = 8 */
    double lora_alpha;        /* 0 = 8 */
    double lora_dropout;
    bool lora_rslora;
    bool lora_dora;           /* DoRA (PEFT's use_dora) */
    const char *lora_save_modules; /* PEFT's modules_to_save: comma-separated module names (NULL: none) */
    const char *lora_layers;  /* PEFT's layers_to_transform: comma-separated indices (NULL: every layer) */
    const char *lora_layers_pattern; /* PEFT's layers_pattern: comma-separated names (NULL: any) */
    const char *lora_bias;    /* PEFT's bias: none (NULL), all, lora_only */
    const char *lora_rank_pattern;  /* PEFT's rank_pattern: a JSON object of layer name patterns to ranks (NULL) */
    const char *lora_alpha_pattern; /* PEFT's alpha_pattern: a JSON object of patterns to alphas (NULL) */
    const char *lora_exclude_modules; /* PEFT's exclude_modules: comma-separated module names (NULL: none) */
    const char *lora_exclude_json; /* not an option: exclude_modules from --lora-from or a checkpoint, as JSON (a
                                      regular expression string or a list of names); NULL: none */
    const char *save_lora;    /* directory for the adapters in PEFT's format at the end */
    const char *lora_from;    /* PEFT adapters (adapter_config.json + adapter_model.safetensors) to start from */
    /* ZeRO / FSDP (tools/train_ddp.c) */
    const char *zero;         /* 0 | 1 | 2 | 3, NULL = unset (DDP) */
    const char *fsdp;         /* no_shard | shard_grad_op | full_shard | hybrid_shard, NULL = unset */
    int64_t wrap_min_params;  /* size-based wrap policy, 0 = none (one unit) */
    const char *backward_prefetch; /* none | backward_pre | backward_post, default backward_pre */
    bool forward_prefetch;
    bool hierarchical_allreduce; /* two-level gradient reductions across nodes (DDP and ZeRO) */
    bool zero_qw, zero_qg;    /* ZeRO++ qwZ / qgZ (--zero-quantized-weights / -gradients) */
    int64_t zero_hpz;         /* ZeRO++ hpZ partition size, 0 = unset (the config's, else off) */
    int64_t zero_quant_block; /* 0 = unset */
    int64_t zero_grad_block;  /* 0 = unset */
    const char *zero_grad_bits; /* "4" | "8", NULL = unset */
    /* tensor parallelism (tools/train_ddp.c): ranks per tensor-parallel group, 0/1 = none */
    int64_t tp;
    bool sequence_parallel;   /* --sequence-parallel (GPT with --tp) */
    /* context parallelism (cp.h, plan.h): ranks per sequence, 0/1 = none */
    int64_t cp;
    const char *cp_impl;      /* --cp-impl ring|ulysses (NULL: ring; a config's sequence_parallel_size: ulysses) */
    const char *cp_balance;   /* --cp-balance on|off (NULL: on for ring, off for ulysses) */
    int64_t dp;               /* data-parallel replicas, 0 = world / (tp x pp); checked against the world */
    /* pipeline parallelism (tools/train_ddp.c, pipeline.h): ranks per pipeline, 0/1 = none */
    int64_t pp;
    const char *pp_schedule;  /* gpipe | 1f1b | interleaved | zbh1, default 1f1b */
    const char *trace;        /* --trace DIR: the timeline (trace.h), NULL = off */
    const char *trace_steps;  /* --trace-steps A:B, NULL = the default */
    const char *pp_balance;   /* compute | params | time: what the stages are balanced by, default compute */
    int64_t micro_batches;    /* pipeline micro-batches per batch, 0 = 4 */
    /* checkpoints (issue 14) */
    const char *save;         /* save directory (DIR/step-N checkpoints), NULL = none */
    const char *save_hf;      /* --save-hf OUT: a Hugging Face model directory at the end, NULL = none */
    uint64_t hf_shard_size;   /* --hf-shard-size BYTES: its shards' size; 0 = 5,000,000,000 */
    int64_t save_every;       /* save every N optimizer steps (0 = only at the end) */
    int64_t keep;             /* keep the newest K checkpoints (0 = all) */
    bool async_save;          /* write checkpoints on a background thread */
    int64_t max_steps;        /* the run's length in optimizer steps, over as many epochs as it takes (0 = --epochs) */
    const char *resume;       /* DIR (a save directory or one checkpoint) | auto, NULL = none */
    const char *init_from;    /* initial weights from a safetensors file, NULL = none */
    /* mixed precision (issue 12) */
    const char *precision;    /* fp32 | bf16 | fp16, default fp32 ("auto" is resolved at parse) */
    const char *precision_auto; /* NULL, or why "auto" chose precision (dt_precision_auto) */
    const char *reduce_dtype; /* fp32 | bf16 | fp16, NULL = the precision's */
    const char *keep_bn_fp32; /* true | false, default true */
    const char *buffer_dtype; /* fp32 | bf16 | fp16, NULL = fp32 */
    double loss_scale;        /* 0 = dynamic, > 0 static, < 0 = unset (dynamic with fp16, none otherwise) */
    int64_t initial_scale_power; /* default 16 */
    int64_t loss_scale_window;   /* default 1000 */
    int64_t hysteresis;          /* default 2 */
    double min_loss_scale;       /* default 1 */
    const char *scaler;       /* deepspeed | torch, default deepspeed */
    /* the JSON config (tools/train_config.c, src/config/) */
    const char *config;       /* --config FILE, NULL = none */
    struct dt_config *cfg;    /* the effective config (file < flags < AIAK_*), set by dt__train_config;
                                 owned by the command, NULL before */
    char offload_buf[1100];   /* the --offload text a config's offload_optimizer gives */
} dt__train_opts;

/* Parse argv (argv[0] is "train"). Returns 0 on success, 1 if --help was
 * printed (exit 0), 2 after printing one line naming the bad flag. */
int dt__train_parse(int argc, char **argv, dt__train_opts *o);
/* The cross-option checks of dt__train_parse (again after a config filled
 * the options). Returns 0 or 2 after printing one line. */
int dt__train_check(dt__train_opts *o);
/* The step schedule's factor and the sample length, their defaults
 * where not given (the options hold "not given" so that dt__train_check
 * can refuse them where they do not apply). */
static inline double dt__train_gamma(const dt__train_opts *o) { return o->gamma < 0 ? 0.1 : o->gamma; }
static inline int64_t dt__train_sample_tokens(const dt__train_opts *o)
{
    return o->sample_tokens ? o->sample_tokens : 64;
}
/* The communication hook the flags and AIAK_* variables choose (ws: the
 * world size); 0, or 2 after printing why (bad input). */
int dt__train_comm_hook(const dt__train_opts *o, int ws, dt_comm_hook_kind *hook, dt_powersgd_params *psgd);
/* --plan auto (tools/train_plan.c): the planner's layout for the ranks the
 * environment gives, into o's layout fields (dp, tp, pp, zero, batch,
 * micro_batches, grad_accum, act_ckpt), checked again; rank 0 prints the
 * choice and the runner-up. Before the process group and before any
 * parallel region (the calibration may run in a child). Returns 0 or the
 * exit code (2: no layout fits, bad input). */
int dt__train_plan_auto(dt__train_opts *o);
/* The planner's prediction for a run of o with these degrees: *rss (peak
 * resident bytes per rank) and *step_ms, both 0 when the planner does not
 * know the model (not a GPT-2 zoo model as named) or DT_PLAN_PREDICT=0.
 * Calibrates in this process when the cache has no figures. Returns 0. */
int dt__train_predict(const dt__train_opts *o, int world, int tp, int pp, int cp, int zero_stage, double *rss,
                      double *step_ms);
/* train_config.c: the config of --config FILE (if any), the flags given
 * on the command line over it, AIAK_* over both (src/config/); then the
 * options the command reads (batch, accumulation, stage, precision, ...)
 * from the result. o->cfg is set (free with dt_config_free). Returns 0 or
 * 2 after printing one line. */
int dt__train_config(int argc, char **argv, dt__train_opts *o);
/* rank 0: the config's warnings on stderr and the effective configuration
 * on stdout, once (nothing when no config key is set). */
void dt__train_config_print(const dt__train_opts *o);
void dt__train_usage(FILE *f);
/* The options every rank of a job must share (all but --threads,
 * --progress, --metrics, --log-every, --prefetch, --mfu-peak and --config,
 * whose values land in the others), as "--name" and its value as text, into
 * names[i] and vals[i] (at most cap). Returns the count. */
int dt__train_shared_opts(const dt__train_opts *o, const char **names, char (*vals)[512], int cap);
/* The options of dt__train_usage as a Markdown table ("| option | meaning |"),
 * the table docs/TRAINING.md carries (dtrain train --help-markdown). */
void dt__train_options_markdown(FILE *f);
/* dtrain eval: the train command's setup with argv (argv[0] "train"),
 * then the weights of checkpoint ckpt and one evaluation (cmd_train.c).
 * kept: the tokenizer the checkpoint keeps (dt__ckpt_tokenizer), taken
 * (freed here), which encodes the text data in place of loading argv's
 * --tokenizer (then the checkpoint's path); NULL: none. */
int dt__train_eval_ckpt(int argc, char **argv, const char *ckpt, bool json, dt_tokenizer *kept);
/* The flag that named dt__train_eval_ckpt's ckpt, for its errors: "--ckpt" (the default), "--weights" or
 * "--model" (an hf:DIR's own weights); set before the call. */
void dt__train_eval_flag(const char *flag);

/* ---- progress display (train_progress.c) -------------------------------------- */
typedef enum { DT__PROGRESS_NONE, DT__PROGRESS_PLAIN, DT__PROGRESS_BAR } dt__progress_mode;

typedef struct dt__progress {
    dt__progress_mode mode;
    FILE *out;
    int64_t epoch, epochs, total, log_every;
    double t0, last_draw;
    int width;
    int64_t tokens_per_sample; /* > 0: show tokens/s */
    double flops_per_sample, peak_gflops; /* > 0: show the MFU */
    bool drawn;
} dt__progress;

/* Whether progress may draw a bar on out: DT_STDOUT_TTY=1/0 if set (dtrain
 * run's hint), else false under a launcher (RANK/WORLD_SIZE, MPI, PMI,
 * Slurm variables), else isatty. */
bool dt__progress_terminal(FILE *out);
/* mode from "auto" or "bar" (a bar on a terminal, else plain), "plain", "none". */
/* Language models: the progress also shows tokens/s and the MFU (model
 * FLOPs per second over peak_gflops) when these are > 0. */
void dt__progress_set_rates(dt__progress *p, int64_t tokens_per_sample, double flops_per_sample, double peak_gflops);
void dt__progress_init(dt__progress *p, const char *mode, FILE *out, int64_t epochs,
                       int64_t log_every);
void dt__progress_epoch_begin(dt__progress *p, int64_t epoch, int64_t total_steps);
/* After optimizer step `step` (1-based within the epoch; global_step counting
 * across epochs, which --log-every's plain lines go by) with the running loss. */
void dt__progress_step(dt__progress *p, int64_t step, int64_t global_step, double loss, double lr, int64_t samples);
/* Leave seconds (an evaluation) out of the epoch's clock: the samples/s and
 * the ETA shown count training time only, as the epoch line does. */
void dt__progress_exclude(dt__progress *p, double seconds);
/* Clears the bar line (before printing anything else). */
void dt__progress_clear(dt__progress *p);
void dt__progress_epoch_end(dt__progress *p, int64_t steps, double loss, double wall_s,
                            double samples_per_s);
/* "1:05" / "1:02:03" */
char *dt__fmt_duration(double s, char *buf, size_t n);

/* ---- metrics file (train_metrics.c) ---------------------------------------------- */
/* Records go to PATH.partial as they happen (one write each, nothing
 * buffered). dt__metrics_close writes the end record
 * {"event":"end","status":STATUS,...} and, for status "ok" only, renames
 * PATH.partial to PATH; otherwise PATH is left untouched and the records stay
 * in PATH.partial. No symlink is followed (dt_file). */
typedef struct dt__metrics {
    dt_file *f;
    char *path, *partial;
    const char *from;     /* resumed: the history continued: ".partial" (PATH.partial), "" (PATH), NULL (none) */
    int64_t kept, dropped, bad; /* its records kept, dropped (after the resumed step), not JSON objects */
} dt__metrics;

/* resume_step < 0: a fresh history (an older PATH.partial is replaced).
 * resume_step >= 0 (a resumed run): the history continues the newer of
 * PATH.partial and PATH, keeping its records up to that step (records
 * without a "step" too) and dropping those after it; the counts and the
 * source are in m. */
dt_status dt__metrics_open(dt__metrics *m, const char *path, int64_t resume_step);
/* One JSON object on one line: fmt is the body without braces, e.g.
 * "\"event\":\"step\",\"step\":%lld"; a "time" field (Unix seconds) is
 * appended. Does nothing when the file is not open. */
dt_status dt__metrics_write(dt__metrics *m, const char *fmt, ...) DT_PRINTF(2, 3);
/* What a run measured, for the end record (the planner's error shows
 * beside it): the largest peak resident set of any rank (VmHWM, bytes) and
 * the median optimizer-step time (ms, rank 0's clock; data loading not
 * included); and what the planner predicted for the run's layout
 * (dt_plan_predict; 0: no prediction, e.g. a model the planner does not
 * know). */
typedef struct dt__metrics_measured {
    double peak_rss_bytes, step_ms;
    double step_cpu_ms; /* the CPU time of a step, every rank's process summed (steps after the first) */
    double predicted_peak_rss_bytes, predicted_step_ms;
    /* the backend's byte counters (comm_counted: the backend counts): the
     * bytes all ranks sent, and of them to another node (comm_nodes_known),
     * from the end of the first optimizer step to the end of the run, which
     * spans comm_steps steps */
    int comm_counted, comm_nodes_known;
    double comm_bytes_sent, comm_bytes_cross_node, comm_steps;
} dt__metrics_measured;
/* status: "ok" | "interrupted" | "failed"; step: the global step reached;
 * me (NULL: none; fields <= 0 left out) adds "peak_rss_bytes" and "step_ms",
 * "step_cpu_ms", then "predicted_peak_rss_bytes" and "predicted_step_ms", then
 * (when counted) "comm_bytes_sent", "comm_bytes_cross_node" (with the nodes
 * known) and "comm_steps". */
dt_status dt__metrics_close(dt__metrics *m, const char *status, int64_t step, int exit_code,
                            const dt__metrics_measured *me);
/* s as a JSON string literal with its quotes ("null" if it does not fit in n). */
void dt__json_quote(const char *s, char *buf, size_t n);

/* ---- reading a metrics file (metrics_read.c) ---------------------------------------- */
/* The points `dtrain plot` draws. */
typedef struct dt__metrics_points {
    double *step_x, *step_loss;          /* training loss records */
    double *eval_x, *eval_loss, *eval_acc; /* evaluations; eval_acc NAN when absent/null */
    size_t nstep, neval, nacc;
} dt__metrics_points;
/* Parse a whole metrics file held in buf[0..n) (JSON lines; need not be
 * NUL-terminated): every non-blank line must be a JSON object with an
 * "event" string; "step" records need numeric "step" and "loss", "eval"
 * records a numeric "test_loss" ("test_accuracy" a number or null, "step"
 * optional); other events and extra fields (nested too) are ignored.
 * Returns 0, or -1 with "N: problem" (N the line) in err (out is then empty).
 * Free out with dt__metrics_points_free. */
int dt__metrics_parse(const char *buf, size_t n, dt__metrics_points *out, char *err, size_t errn);
void dt__metrics_points_free(dt__metrics_points *p);

/* ---- LoRA and --freeze settings kept with a checkpoint (train_lora.c) ------------------ */
typedef struct dt__tuning {
    bool known;           /* the checkpoint says (false: saved before they were kept) */
    char *lora_targets;   /* comma-separated; NULL: no LoRA */
    int64_t lora_r;
    double lora_alpha, lora_dropout;
    bool lora_rslora;
    bool lora_dora;       /* DoRA (false in checkpoints saved before it was kept) */
    char *lora_save;      /* modules_to_save, comma-separated; NULL: none */
    char *lora_layers, *lora_layers_pattern; /* layers_to_transform, layers_pattern, comma-separated; NULL: none */
    dt_lora_bias lora_bias; /* PEFT's bias */
    char *lora_pat[3];    /* rank_pattern, alpha_pattern, exclude_modules as JSON; NULL: none */
    dt_lora_pattern *pattern; /* dt__tuning_lora's, from lora_pat */
    char *freeze;         /* --freeze's patterns; NULL: none */
    char *target_buf;     /* dt__tuning_lora's split targets */
    const char **target_list;
    char *save_buf;       /* and modules to save */
    const char **save_list;
    char *pattern_buf;    /* and layers_pattern */
    const char **pattern_list;
    int64_t *layer_list;  /* layers_to_transform */
} dt__tuning;
/* The settings of the checkpoint at path (a checkpoint or save directory). */
dt_status dt__tuning_read(const char *path, dt__tuning *out);
/* Its LoRA as build parameters (targets borrowed from t); defaults when none. */
dt_status dt__tuning_lora(dt__tuning *t, dt_lora_params *p);
void dt__tuning_free(dt__tuning *t);
/* {"lora":{"targets":..,"r":..,"alpha":..,"dropout":..,"rslora":..,"dora":..,"modules_to_save":..|null}|null,
 * "freeze":..|null} (cJSON_free). */
char *dt__tuning_json(const char *targets, const dt_lora_params *lp, const char *freeze);
/* The settings as the flags that give them, for messages (pat: rank_pattern, alpha_pattern and exclude_modules as
 * JSON, each NULL for none; pat NULL: none). */
void dt__tuning_describe(const char *targets, int64_t r, double alpha, double dropout, bool rslora, bool dora,
                         const char *save, const char *layers, const char *layers_pattern, dt_lora_bias bias,
                         const char *const *pat, const char *freeze, char *buf, size_t n);
/* A comma-separated list of layer indices ("0,3,5") into *out (malloc'd) and *n: 0, or 2 after saying why (opt
 * names the option). */
int dt__parse_layers(const char *opt, const char *list, int64_t **out, size_t *n);
/* layers[0..n) joined with commas (malloc'd), NULL for none or out of memory. */
char *dt__join_layers(const int64_t *layers, size_t n);
/* PEFT's bias setting as its name ("none", "all", "lora_only"), and back (-1: another name). */
const char *dt__lora_bias_name(dt_lora_bias b);
int dt__lora_bias_parse(const char *s);
/* NULL-terminated names joined with commas (malloc'd; "" for none), NULL when out of memory. */
char *dt__join_names(const char *const *names);
/* Whether ck holds these settings. */
bool dt__tuning_same(const dt__tuning *ck, const char *targets, const dt_lora_params *lp, const char *freeze);

#endif
