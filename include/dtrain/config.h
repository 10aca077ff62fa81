/* dtrain/config.h — the DeepSpeed-style JSON training config, command-line
 * and environment overrides, turned into the params structs of the other
 * layers.
 *
 * Overview
 * --------
 * A dt_config holds one value per known key, named by its dotted path as it
 * is written in a DeepSpeed config ("zero_optimization.stage",
 * "optimizer.params.lr"; docs/GUIDE.md lists every key and what it maps
 * to). Each value remembers where it came from, and a value set from a
 * stronger origin is never replaced by a weaker one:
 *
 *     file (DT_CONFIG_FROM_FILE) < command line (DT_CONFIG_FROM_CLI)
 *                                < environment (DT_CONFIG_FROM_ENV, AIAK_*)
 *
 * so the three may be applied in any order. A key that nothing set keeps
 * the consumer's own default; "auto" in a file means the same (the command
 * line's value or dtrain's default applies; train_batch_size "auto" is
 * derived by the batch relation).
 *
 * Reading a file: JSON as users paste it. `#` and `//` comments (outside
 * strings) and trailing commas before `}` / `]` are accepted (DeepSpeed
 * reads its configs with hjson, which accepts them too); anything else that
 * is not JSON (a missing comma, an unclosed brace) is DT_ERR_FORMAT with a
 * message naming the file, the line, the column and what is wrong:
 *     ds.json:18:3: missing ',' after the value of "wall_clock_breakdown" (line 17): expected ',' or
 *     a closing bracket, found '"'
 * Duplicate keys are errors (as DeepSpeed's). A key dtrain does not know is
 * a warning naming its full path (dt_config_warning); a known key with the
 * wrong type or a value out of range is DT_ERR_INVALID_ARG naming the key;
 * a key whose behaviour dtrain does not have yet, set to a value that would
 * change training, is DT_ERR_UNSUPPORTED ("key X: not supported yet
 * (reason)"). Every refused key of a file is named in the one error
 * ("ds.json: 3 keys refused: key A: ...; key B: ...; key C: ..."; the
 * status is the first refusal's), not one per attempt. Keys that are pure
 * performance knobs of DeepSpeed's GPU implementation are accepted and have
 * no effect (dt_config_key_no_effect; the effective configuration marks them).
 *
 * Lifecycle: dt_config_init / dt_config_free. Strings returned by getters
 * are borrowed from the config and valid until it is freed or the key is
 * set again. A config is used from one thread.
 *
 * Usage
 * -----
 *     dt_config *c;
 *     dt_config_init(&c);
 *     if (dt_config_load_file(c, "ds_config.json") < 0) fail(dt_last_error());
 *     for (size_t i = 0; i < dt_config_num_warnings(c); i++) warn(dt_config_warning(c, i));
 *     dt_config_set(c, "optimizer.params.lr", "0.001", DT_CONFIG_FROM_CLI, "--lr");
 *     if (dt_config_apply_env(c) < 0) fail(dt_last_error());       // AIAK_*
 *     dt_config_batch b;
 *     dt_config_batch_resolve(c, world, 32, 1, &b);                 // DeepSpeed's relation
 *     dt_zero_params zp = dt_zero_params_default();
 *     int stage = 0;
 *     dt_config_zero_params(c, &stage, &zp);
 *     dt_pipe_params pp = dt_pipe_params_default();                 // pipe_strategy.h
 *     pp.pp = 1;
 *     dt_config_pipe_params(c, &pp);        // stages, schedule; with pp.pp > 1 resolve the batch over
 *                                           // world / pp ranks and take pp.micro_batches = b.grad_accum
 *     dt_trainer_params tp = dt_trainer_params_default();
 *     dt_trainer_params_apply_config(c, &tp);                        // train.h
 *     char *eff = dt_config_effective_json(c);  ...  free(eff);
 *     dt_config_free(c);
 */
#ifndef DTRAIN_CONFIG_H
#define DTRAIN_CONFIG_H

#include "dtrain/base.h"
#include "dtrain/nn.h"
#include "dtrain/offload.h"
#include "dtrain/parallel.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_config dt_config;
struct dt_pipe_params; /* pipe_strategy.h (which includes this header through train.h) */

/* Where a value came from, weakest first. */
typedef enum {
    DT_CONFIG_UNSET = 0,     /* not given (or "auto"): the consumer's default applies */
    DT_CONFIG_FROM_FILE = 1, /* the JSON file */
    DT_CONFIG_FROM_CLI = 2,  /* a command-line flag */
    DT_CONFIG_FROM_ENV = 3   /* an environment variable (AIAK_*) */
} dt_config_origin;

/* An empty config (every key unset) into *out. */
DT_API dt_status dt_config_init(dt_config **out);
/* NULL is a no-op. */
DT_API void dt_config_free(dt_config *c);

/* Read a JSON config file (at most 16 MiB) into c with origin FILE. Errors
 * (see the overview): DT_ERR_IO (cannot read), DT_ERR_FORMAT (not JSON:
 * "path:line:col: what"), DT_ERR_INVALID_ARG (a key's type or range),
 * DT_ERR_UNSUPPORTED (a key dtrain cannot honour yet). On error c keeps what
 * it held before the call. */
DT_API dt_status dt_config_load_file(dt_config *c, const char *path);
/* The same for text[0..n) (need not be NUL-terminated); name is used in
 * messages in place of the file's path. */
DT_API dt_status dt_config_load_string(dt_config *c, const char *name, const char *text, size_t n);

/* Set one key from JSON text (`2`, `true`, `"cpu"`, `[0.9, 0.95]`) with the
 * given origin; source names it in messages and the effective config
 * ("--lr", "AIAK_FP16_COMPRESSION"; copied). Ignored (DT_OK) when the key
 * already holds a value from a stronger origin. Unknown keys are
 * DT_ERR_NOT_FOUND; type, range and support errors as for a file. */
DT_API dt_status dt_config_set(dt_config *c, const char *key, const char *json_value, dt_config_origin origin,
                               const char *source);

/* AIAK-Training's environment variables into c (origin ENV):
 *   AIAK_FP16_COMPRESSION=1             dtrain.comm_hook = "fp16"
 *   AIAK_POWERSGD_COMPRESSION=1         dtrain.comm_hook = "powersgd"
 *   AIAK_MATRIX_APPROXIMATION_RANK=N    dtrain.powersgd_rank (default 1)
 *   AIAK_START_COMPRESS_ITER=N          dtrain.start_compress_iter (default 1000)
 *   AIAK_HIERARCHICAL_ALLREDUCE=0|1     dtrain.hierarchical_allreduce
 *   AIAK_FUSED_OPTIMIZER=0|1            accepted: dtrain's optimizers are always fused (a note)
 * The compression variables are read by dt_comm_hook_env (parallel.h), the
 * hooks' own reader, with its errors (malformed values, both compressions
 * at once); unset, empty or 0 variables change nothing; a malformed
 * AIAK_HIERARCHICAL_ALLREDUCE / AIAK_FUSED_OPTIMIZER is DT_ERR_INVALID_ARG
 * naming the variable. */
DT_API dt_status dt_config_apply_env(dt_config *c);

/* Warnings and notes gathered so far (unknown keys, keys accepted without
 * effect that a user may expect to act, AIAK_FUSED_OPTIMIZER), in order;
 * each a full sentence naming the key. Borrowed. */
DT_API size_t dt_config_num_warnings(const dt_config *c);
DT_API const char *dt_config_warning(const dt_config *c, size_t i);

/* Where key's value came from (DT_CONFIG_UNSET also for unknown keys). */
DT_API dt_config_origin dt_config_origin_of(const dt_config *c, const char *key);
/* Whether key holds "auto" from a file (and nothing stronger set it). */
DT_API bool dt_config_is_auto(const dt_config *c, const char *key);
/* Whether key is accepted without effect in dtrain (a knob of DeepSpeed's GPU
 * implementation, a debugging switch): the effective configuration marks it. */
DT_API bool dt_config_key_no_effect(const char *key);
/* Fill a key that nothing set (or that holds "auto") with the value its
 * consumer will use, so that the effective configuration shows it: origin
 * FILE (the weakest, so any flag or variable still wins), source "default:
 * WHY" or "auto: WHY" (why names where the value comes from, e.g.
 * "--warmup"). A no-op (DT_OK) when the key is set; value errors as
 * dt_config_set. dtrain train resolves WarmupLR's warmup_num_steps,
 * warmup_type and warmup_max_lr this way. */
DT_API dt_status dt_config_resolve(dt_config *c, const char *key, const char *json_value, const char *why);
/* A set key's value. DT_ERR_NOT_FOUND when the key is unset (out untouched),
 * DT_ERR_DTYPE when it is not of that type (ints read as doubles too),
 * DT_ERR_NULL for a NULL c or key.
 * get_str's string is borrowed. */
DT_API dt_status dt_config_get_bool(const dt_config *c, const char *key, bool *out);
DT_API dt_status dt_config_get_int(const dt_config *c, const char *key, int64_t *out);
DT_API dt_status dt_config_get_double(const dt_config *c, const char *key, double *out);
DT_API dt_status dt_config_get_str(const dt_config *c, const char *key, const char **out);
/* A two-number key (optimizer.params.betas) into out[0], out[1]. */
DT_API dt_status dt_config_get_pair(const dt_config *c, const char *key, double out[2]);

/* DeepSpeed's batch relation:
 *     train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp_world
 * The values the config holds are taken; default_micro and default_gas
 * stand in for unset micro / accumulation only when neither train_batch_size
 * nor that value can be derived (the command line's defaults). A missing one
 * is derived with DeepSpeed's integer divisions; afterwards the equality is
 * checked: DT_ERR_INVALID_ARG "train_batch_size 64 != train_micro_batch_size_per_gpu 8 *
 * gradient_accumulation_steps 2 * world size 2 (32)" when the given values
 * disagree or a derived one is 0. */
typedef struct dt_config_batch {
    int64_t train_batch_size; /* samples per optimizer step over all data-parallel ranks */
    int64_t micro_batch;      /* samples per rank per micro-batch */
    int64_t grad_accum;       /* micro-batches per optimizer step */
} dt_config_batch;
DT_API dt_status dt_config_batch_resolve(const dt_config *c, int dp_world, int64_t default_micro,
                                         int64_t default_gas, dt_config_batch *out);

/* The precision the config asks for: DT_F16 (fp16.enabled), DT_BF16
 * (bf16.enabled), DT_F32 (either key false and the other not true);
 * bf16.enabled "auto" with fp16.enabled absent or false: DT_DTYPE_UNSET,
 * which the caller resolves with dt_precision_auto (precision.h: bf16 or
 * f32 on this CPU).
 * DT_ERR_NOT_FOUND when neither key is set (the caller's default applies),
 * and when both are "auto" (a Hugging Face Trainer config: both follow the
 * command line). DT_ERR_NULL for a NULL c. */
DT_API dt_status dt_config_precision(const dt_config *c, dt_dtype *out);

/* zero_optimization into *stage (0..3; untouched when unset) and the fields
 * of zp whose keys are set (zp keeps its other fields). */
DT_API dt_status dt_config_zero_params(const dt_config *c, int *stage, dt_zero_params *zp);
/* zero_optimization.offload_optimizer (and the deprecated cpu_offload) into
 * op's fields whose keys are set. */
DT_API dt_status dt_config_offload_params(const dt_config *c, dt_offload_params *op);
/* activation_checkpointing: *enabled is true when the block is present, or
 * pipeline.activation_checkpoint_interval > 0 with more than one pipeline
 * stage (or dtrain.activation_checkpointing is true), false when
 * dtrain.activation_checkpointing is false, untouched otherwise; p's fields
 * from the block's keys. number_checkpoints (null: all) and profile have
 * their effect; partition_activations, cpu_checkpointing,
 * contiguous_memory_optimization and synchronize_checkpoint_boundary, when
 * true, add a note "KEY: no effect here: WHY" to c's warnings (said once;
 * the values are those without them) and set their fields but
 * partition_activations, which stays false (dtrain keeps whole inputs). */
DT_API dt_status dt_config_act_ckpt(dt_config *c, bool *enabled, dt_act_ckpt_params *p);

/* Pipeline parallelism: DeepSpeed's "pipeline" block (as its PipelineModule
 * and PipelineEngine read it) and dtrain's keys, into p's fields whose keys
 * are set (p keeps the others):
 *   pipeline.stages / dtrain.pipeline_parallel_size  p->pp, the number of
 *       stages (one per rank; "auto" = unset). The stronger origin wins; at
 *       the same origin the two must agree (DT_ERR_INVALID_ARG naming both).
 *   dtrain.pipeline_schedule  p->schedule (gpipe|1f1b|interleaved|zbh1);
 *       DT_ERR_INVALID_ARG naming the key when the stages are not > 1.
 *   gradient_accumulation_steps  with p->pp > 1 it is the number of
 *       micro-batches of a step (DeepSpeed's PipelineEngine), and
 *       train_micro_batch_size_per_gpu their size: resolve the batch
 *       relation over world / (tensor-parallel x pp) data-parallel ranks
 *       (dt_config_batch_resolve) and set p->micro_batches = grad_accum,
 *       with no accumulation on top. Not set here.
 *   pipeline.activation_checkpoint_interval  > 0 turns activation
 *       checkpointing on with more than one stage (dt_config_act_ckpt); dtrain
 *       checkpoints each block (interval 1); larger values give a note.
 *   pipeline.partition  "parameters": p->balance = DT_PIPE_BY_PARAMS (balance
 *       by parameter count; without the key dtrain balances by compute);
 *       "profile": p->balance = DT_PIPE_BY_TIME (the units' measured
 *       forward + backward time: the name DeepSpeed reserves for it, whose
 *       PipelineModule raises NotImplementedError for it; the caller must
 *       then set p->sample, dtrain train passes its first micro-batch);
 *       "best" (DeepSpeed's unread default) leaves p->balance, with a note; "uniform",
 *       "type:REGEX" DT_ERR_UNSUPPORTED at load.
 *   pipeline.seed_layers true: DT_ERR_UNSUPPORTED at load (the model is
 *       initialised whole from one seed). pipe_partitioned, grad_partitioned,
 *       use_reentrant: accepted without effect, with a note at load.
 * The pipeline block without more than one stage adds a note (no effect,
 * as in DeepSpeed without a PipelineModule). Notes go to the warnings
 * (dt_config_warning), each once; hence c is not const. */
DT_API dt_status dt_config_pipe_params(dt_config *c, struct dt_pipe_params *p);
/* The number of pipeline stages the keys above name: 1 when neither is set,
 * a negative dt_status (DT_ERR_INVALID_ARG) when they disagree. */
DT_API int dt_config_pipe_stages(const dt_config *c);

/* The effective configuration as one JSON object (malloc'd, free with
 * free(); NULL on out of memory): {"values": {KEY: VALUE, ...},
 * "from": {KEY: "file" | "--flag" | "AIAK_X" | "default: ..." | "auto: ...", ...}}
 * with every set key, and "no_effect": [KEY, ...] naming the set keys that
 * have no effect in dtrain (only when there is one). */
DT_API char *dt_config_effective_json(const dt_config *c);
/* The same as text, one "  KEY = VALUE  (from)" line per set key, "(from;
 * no effect in dtrain)" for a key without effect (malloc'd; "" when nothing
 * is set). */
DT_API char *dt_config_effective_text(const dt_config *c);

/* Every known key in table order (for documentation and tests): the key
 * at index i, or NULL past the end. */
DT_API const char *dt_config_key_name(size_t i);

#ifdef __cplusplus
}
#endif
#endif
