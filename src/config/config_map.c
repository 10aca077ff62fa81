/* What the keys mean here: the values dtrain cannot honour yet (refused
 * with a reason, never dropped), DeepSpeed's batch relation, the mapping of
 * zero_optimization / offload / activation_checkpointing into the params
 * structs of parallel.h, offload.h and nn.h, and AIAK's environment
 * variables. The trainer's own params (optimizer, schedule, precision,
 * loss scaler) are mapped by the train layer (dt_trainer_params_apply_config,
 * src/train/trainer_config.c), which may look at this layer. */
#include "config_impl.h"

#include "dtrain/pipe_strategy.h"
#include "dtrain/train.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_status unsupported(const char *key, const char *why)
{
    return dt_error(DT_ERR_UNSUPPORTED, "key %s: not supported yet (%s)", key, why);
}

dt_status dt__cfg_check_support(dt_config *c, int k, const dt__cfg_val *v)
{
    const char *p = dt__cfg_keys[k].path;
    const bool t = (dt__cfg_keys[k].type == DT__KT_BOOL) && v->v.b;
    if (!strcmp(p, "prescale_gradients") && t)
        return unsupported(p, "gradients are averaged after the reduction, in f32 or the reduce dtype");
    if (!strcmp(p, "gradient_predivide_factor") && v->v.d != 1.0)
        return unsupported(p, "gradients are divided by the world size after the reduction");
    if (!strcmp(p, "sparse_gradients") && t)
        return unsupported(p, "embedding gradients are dense");
    if (!strcmp(p, "amp.enabled") && t)
        return unsupported(p, "apex AMP is not read from the config: use \"fp16\" or \"bf16\" {\"enabled\": true}");
    if (!strcmp(p, "zero_optimization.offload_optimizer.ratio") && v->v.d != 1.0)
        return unsupported(p, "partial optimizer offload: the whole optimizer state is offloaded or none");
    if (!strcmp(p, "optimizer.params.amsgrad") && t)
        return unsupported(p, "dtrain's Adam, AdamW and LAMB keep no running maximum of the second moment; DeepSpeed's "
                              "FusedAdam and FusedLamb refuse it too");
    if (!strcmp(p, "optimizer.params.max_coeff") || !strcmp(p, "optimizer.params.min_coeff"))
        return unsupported(p, "dtrain's LAMB is apex FusedLAMB, whose trust ratio has no clamp");
    if (!strcmp(p, "optimizer.type") && !strcmp(v->v.s, "Lamb"))
        dt__cfg_warn(c, "optimizer.type Lamb: dtrain's LAMB is apex FusedLAMB (AIAK's); DeepSpeed's own Lamb also "
                        "clamps the trust ratio to [0.01, 10]");
    if (!strcmp(p, "dtrain.micro_batches"))
        return dt_error(DT_ERR_INVALID_ARG, "key dtrain.micro_batches: with pipeline parallelism "
                                            "gradient_accumulation_steps is the number of micro-batches "
                                            "(DeepSpeed's PipelineEngine): set that");
    if (!strcmp(p, "pipeline.partition")) {
        const char *s = v->v.s;
        if (!strcmp(s, "best"))
            dt__cfg_warn(c, "pipeline.partition \"best\": DeepSpeed's config default, which its PipelineModule "
                            "does not read; dtrain balances the stages by compute (its default; \"parameters\": by "
                            "parameter count; \"profile\": by measured time)");
        else if (!strcmp(s, "uniform") || !strncmp(s, "type:", 5))
            return unsupported(p, "dtrain balances the stages by parameter count (\"parameters\"), by measured time "
                                  "(\"profile\") or, without the key, by compute");
        else if (strcmp(s, "parameters") && strcmp(s, "profile"))
            return dt_error(DT_ERR_INVALID_ARG, "key pipeline.partition: expected \"parameters\", \"uniform\", "
                                                "\"type:REGEX\" or \"profile\" (DeepSpeed's methods), got \"%s\" "
                                                "(from %s)", s, v->source);
    }
    if (!strcmp(p, "pipeline.seed_layers") && t)
        return unsupported(p, "dtrain initialises the whole model from --seed before cutting it into stages "
                              "(the same weights for every cut), not each layer from its own seed");
    if (!strcmp(p, "pipeline.pipe_partitioned") || !strcmp(p, "pipeline.grad_partitioned"))
        dt__cfg_warn(c, "%s: no effect in dtrain: each tensor-parallel rank sends its whole activation (and "
                        "gradient) to the next stage; DeepSpeed splits them over the tensor-parallel group, the "
                        "same values", p);
    if (!strcmp(p, "pipeline.use_reentrant"))
        dt__cfg_warn(c, "pipeline.use_reentrant: no effect in dtrain: its recomputation is not "
                        "torch.utils.checkpoint's (one kind, the same values)");
    if (!strcmp(p, "dtrain.fused_optimizer") || (!strcmp(p, "optimizer.params.torch_adam")))
        dt__cfg_warn(c, "%s: dtrain's optimizers are always fused (one pass over the flat buffers); nothing to "
                        "switch", v->source[0] == 'A' ? v->source : p);
    return DT_OK;
}

/* ---- batch ---------------------------------------------------------------------------- */

static bool get_i(const dt_config *c, const char *key, int64_t *out)
{
    return dt_config_get_int(c, key, out) == DT_OK;
}

dt_status dt_config_batch_resolve(const dt_config *c, int dp_world, int64_t default_micro, int64_t default_gas,
                                  dt_config_batch *out)
{
    if (!c || !out)
        return dt_error(DT_ERR_NULL, "dt_config_batch_resolve: NULL argument");
    if (dp_world < 1 || default_micro < 1 || default_gas < 1)
        return dt_error(DT_ERR_INVALID_ARG, "dt_config_batch_resolve: world %d, defaults %" PRId64 ", %" PRId64
                                            " must be >= 1", dp_world, default_micro, default_gas);
    int64_t t = 0, m = 0, g = 0, w = dp_world;
    bool ht = get_i(c, "train_batch_size", &t), hm = get_i(c, "train_micro_batch_size_per_gpu", &m),
         hg = get_i(c, "gradient_accumulation_steps", &g);
    if (!ht && !hm) /* DeepSpeed requires one of them; the command line's batch stands in */
        m = default_micro, hm = true;
    if (!hg && !(ht && hm))
        g = default_gas, hg = true;
    const char *derived = NULL; /* the one of the three derived from the other two, and its divisor's name */
    int64_t dnum = 0;
    if (ht && hm && !hg)
        g = t / m / w, derived = "gradient_accumulation_steps", dnum = m;
    else if (ht && hg && !hm)
        m = t / w / g, derived = "train_micro_batch_size_per_gpu", dnum = g;
    else if (hm && hg && !ht) {
        if (__builtin_mul_overflow(m, g, &t) || __builtin_mul_overflow(t, w, &t))
            return dt_error(DT_ERR_INVALID_ARG, "train_micro_batch_size_per_gpu %" PRId64 " * "
                                                "gradient_accumulation_steps %" PRId64 " * world size %d overflows",
                            m, g, dp_world);
    }
    char why[200] = "";
    if (derived && g * m * w != t)
        snprintf(why, sizeof why, "; %s was derived as %" PRId64 " / (%" PRId64 " * %d), which is not a whole number "
                 ">= 1", derived, t, dnum, dp_world);
    int64_t prod;
    if (m <= 0 || g <= 0 || __builtin_mul_overflow(m, g, &prod) || __builtin_mul_overflow(prod, w, &prod) ||
        prod != t)
        return dt_error(DT_ERR_INVALID_ARG,
                        "batch sizes disagree: train_batch_size %" PRId64 " must equal train_micro_batch_size_per_gpu "
                        "%" PRId64 " * gradient_accumulation_steps %" PRId64 " * data-parallel world size %d "
                        "(DeepSpeed's relation; give two of the three and the third is derived%s)",
                        t, m, g, dp_world, why);
    out->train_batch_size = t;
    out->micro_batch = m;
    out->grad_accum = g;
    return DT_OK;
}

/* ---- precision --------------------------------------------------------------------------- */

dt_status dt_config_precision(const dt_config *c, dt_dtype *out)
{
    if (!c)
        return dt_error(DT_ERR_NULL, "dt_config_precision: NULL config");
    bool f16 = false, bf16 = false;
    bool hf = dt_config_get_bool(c, "fp16.enabled", &f16) == DT_OK;
    bool hb = dt_config_get_bool(c, "bf16.enabled", &bf16) == DT_OK;
    /* bf16.enabled "auto": bf16 where the CPU has it, which the caller decides (dt_precision_auto, a layer
     * above this one); with fp16.enabled "auto" as well (a Hugging Face Trainer config: both follow the
     * trainer's arguments) the caller's precision applies */
    if (!hb && !hf && dt_config_is_auto(c, "bf16.enabled") && !dt_config_is_auto(c, "fp16.enabled")) {
        if (out)
            *out = DT_DTYPE_UNSET;
        return DT_OK;
    }
    if (!hf && !hb)
        return DT_ERR_NOT_FOUND;
    if (f16 && bf16)
        return dt_error(DT_ERR_INVALID_ARG, "fp16.enabled and bf16.enabled are both true: they exclude each other");
    if (out)
        *out = f16 ? DT_F16 : bf16 ? DT_BF16 : DT_F32;
    return DT_OK;
}

/* ---- pipeline stages ---------------------------------------------------------------------- */

/* The number of stages the keys name (pipeline.stages, dtrain.pipeline_parallel_size: the stronger
 * origin wins; at the same origin they must agree): *out untouched when neither is set. */
static dt_status pipe_stages(const dt_config *c, int64_t *out)
{
    if (!c)
        return dt_error(DT_ERR_NULL, "dt_config_pipe_stages: NULL config");
    const dt__cfg_val *st = dt__cfg_get(c, "pipeline.stages"), *sz = dt__cfg_get(c, "dtrain.pipeline_parallel_size");
    if (st && sz && st->origin == sz->origin && st->v.i != sz->v.i)
        return dt_error(DT_ERR_INVALID_ARG, "keys pipeline.stages %" PRId64 " (from %s) and "
                                            "dtrain.pipeline_parallel_size %" PRId64 " (from %s) disagree: both name "
                                            "the number of pipeline stages",
                        st->v.i, st->source, sz->v.i, sz->source);
    const dt__cfg_val *pick = st && sz ? (st->origin > sz->origin ? st : sz) : st ? st : sz;
    if (pick)
        *out = pick->v.i;
    return DT_OK;
}

int dt_config_pipe_stages(const dt_config *c)
{
    int64_t pp = 1;
    dt_status st = pipe_stages(c, &pp);
    return st < 0 ? (int)st : (int)pp;
}

/* ---- ZeRO, offload, activation checkpointing ------------------------------------------------ */

static void take_size(const dt_config *c, const char *key, size_t *dst)
{
    int64_t v;
    if (get_i(c, key, &v))
        *dst = (size_t)v;
}

static void take_bool(const dt_config *c, const char *key, bool *dst)
{
    bool v;
    if (dt_config_get_bool(c, key, &v) == DT_OK)
        *dst = v;
}

dt_status dt_config_zero_params(const dt_config *c, int *stage, dt_zero_params *zp)
{
    if (!c || !stage || !zp)
        return dt_error(DT_ERR_NULL, "dt_config_zero_params: NULL argument");
    int64_t s;
    if (get_i(c, "zero_optimization.stage", &s))
        *stage = (int)s;
    take_bool(c, "zero_optimization.overlap_comm", &zp->overlap_comm);
    take_bool(c, "zero_optimization.reduce_scatter", &zp->reduce_scatter);
    take_bool(c, "zero_optimization.contiguous_gradients", &zp->contiguous_gradients);
    take_size(c, "zero_optimization.reduce_bucket_size", &zp->reduce_bucket_size);
    take_size(c, "zero_optimization.allgather_bucket_size", &zp->allgather_bucket_size);
    take_size(c, "zero_optimization.sub_group_size", &zp->sub_group_size);
    take_bool(c, "zero_optimization.round_robin_gradients", &zp->round_robin_gradients);
    take_size(c, "zero_optimization.stage3_prefetch_bucket_size", &zp->prefetch_bucket_size);
    take_size(c, "zero_optimization.stage3_param_persistence_threshold", &zp->param_persistence_threshold);
    take_size(c, "zero_optimization.stage3_max_live_parameters", &zp->max_live_parameters);
    take_size(c, "zero_optimization.stage3_max_reuse_distance", &zp->max_reuse_distance);
    /* ZeRO++ (checked against the stage and the world by dt_zero_pp_check) */
    take_bool(c, "zero_optimization.zero_quantized_weights", &zp->quantized_weights);
    take_bool(c, "zero_optimization.zero_quantized_gradients", &zp->quantized_gradients);
    int64_t q;
    if (get_i(c, "zero_optimization.zero_hpz_partition_size", &q))
        zp->hpz_partition_size = (int)q;
    if (get_i(c, "dtrain.zero_quant_block", &q))
        zp->quant_block = q;
    if (get_i(c, "dtrain.zero_quant_grad_block", &q))
        zp->quant_grad_block = q;
    if (get_i(c, "dtrain.zero_quant_grad_bits", &q))
        zp->quant_grad_bits = (int)q;
    if (*stage > 0)
        zp->stage = *stage;
    /* offload_param (stage 3 parameter offload, parallel.h) */
    dt_offload_params *op = &zp->offload_param;
    const char *dev = NULL, *path = NULL;
    dt_config_get_str(c, "zero_optimization.offload_param.device", &dev);
    dt_config_get_str(c, "zero_optimization.offload_param.nvme_path", &path);
    if (dev) {
        if (!strcmp(dev, "nvme") && !path)
            return dt_error(DT_ERR_INVALID_ARG, "key zero_optimization.offload_param.nvme_path: required with "
                                                "\"device\": \"nvme\" (an existing directory on a fast disk)");
        op->device = !strcmp(dev, "nvme") ? DT_OFFLOAD_NVME : !strcmp(dev, "cpu") ? DT_OFFLOAD_CPU : DT_OFFLOAD_NONE;
        op->nvme_path = op->device == DT_OFFLOAD_NVME ? path : NULL;
    }
    int64_t bc;
    if (get_i(c, "zero_optimization.offload_param.buffer_count", &bc))
        op->buffer_count = (int)bc;
    take_size(c, "zero_optimization.offload_param.buffer_size", &op->buffer_size);
    take_size(c, "zero_optimization.offload_param.max_in_cpu", &op->max_in_cpu);
    take_bool(c, "zero_optimization.offload_param.pin_memory", &op->pin_memory);
    return DT_OK;
}

dt_status dt_config_offload_params(const dt_config *c, dt_offload_params *op)
{
    if (!c || !op)
        return dt_error(DT_ERR_NULL, "dt_config_offload_params: NULL argument");
    const char *dev = NULL, *path = NULL;
    bool legacy = false;
    dt_config_get_str(c, "zero_optimization.offload_optimizer.device", &dev);
    dt_config_get_str(c, "zero_optimization.offload_optimizer.nvme_path", &path);
    if (!dev && dt_config_get_bool(c, "zero_optimization.cpu_offload", &legacy) == DT_OK && legacy)
        dev = "cpu"; /* DeepSpeed's deprecated spelling */
    if (dev) {
        if (!strcmp(dev, "nvme") && !path)
            return dt_error(DT_ERR_INVALID_ARG, "key zero_optimization.offload_optimizer.nvme_path: required with "
                                                "\"device\": \"nvme\" (an existing directory on a fast disk)");
        op->device = !strcmp(dev, "nvme") ? DT_OFFLOAD_NVME : !strcmp(dev, "cpu") ? DT_OFFLOAD_CPU : DT_OFFLOAD_NONE;
        if (op->device == DT_OFFLOAD_NVME)
            op->nvme_path = path;
    }
    take_size(c, "zero_optimization.sub_group_size", &op->sub_group_size);
    int64_t bc;
    if (get_i(c, "zero_optimization.offload_optimizer.buffer_count", &bc))
        op->buffer_count = (int)bc;
    take_bool(c, "zero_optimization.offload_optimizer.pin_memory", &op->pin_memory);
    take_bool(c, "zero_optimization.offload_optimizer.fast_init", &op->fast_init);
    return DT_OK;
}

/* a key of the activation_checkpointing block that is true and does nothing here: the note */
static void act_noop(dt_config *c, const char *key, bool *field, const char *why)
{
    bool on = false;
    if (dt_config_get_bool(c, key, &on) != DT_OK || !on)
        return;
    *field = true;
    dt__cfg_warn(c, "%s: no effect here: %s", key, why);
}

dt_status dt_config_act_ckpt(dt_config *c, bool *enabled, dt_act_ckpt_params *p)
{
    if (!c || !enabled || !p)
        return dt_error(DT_ERR_NULL, "dt_config_act_ckpt: NULL argument");
    bool on;
    if (dt_config_get_bool(c, "activation_checkpointing", &on) == DT_OK)
        *enabled = true;
    int64_t pp = 1, iv = 0;
    if (get_i(c, "pipeline.activation_checkpoint_interval", &iv) && iv > 0 && (pp = dt_config_pipe_stages(c)) > 1)
        *enabled = true; /* DeepSpeed's PipelineEngine: checkpoint the stages' layers */
    if (dt_config_get_bool(c, "dtrain.activation_checkpointing", &on) == DT_OK)
        *enabled = on;
    int64_t tp = 1, n;
    get_i(c, "dtrain.tensor_parallel_size", &tp);
    /* DeepSpeed's keys that change where a checkpointed input is kept, never
     * a value: each true one is said once (dt_act_ckpt_params documents the
     * fields) */
    bool part = false;
    act_noop(c, "activation_checkpointing.partition_activations", &part,
             tp > 1 ? "each tensor-parallel rank keeps its whole checkpointed inputs (the same values; DeepSpeed "
                      "keeps 1/tp of each and all-gathers it before the recomputation)"
                    : "no model-parallel group to split the checkpointed inputs over (tensor_parallel_size 1: "
                      "DeepSpeed keeps the whole input then too)");
    p->partition_activations = false;
    act_noop(c, "activation_checkpointing.cpu_checkpointing", &p->cpu_checkpointing,
             "checkpointed inputs already live in host memory (no device to move them off)");
    act_noop(c, "activation_checkpointing.contiguous_memory_optimization", &p->contiguous_memory_optimization,
             "checkpointed inputs already live in one buffer (the step's arena)");
    act_noop(c, "activation_checkpointing.synchronize_checkpoint_boundary", &p->synchronize_checkpoint_boundary,
             "no device stream to synchronise at a boundary (CPU kernels finish before the next starts)");
    take_bool(c, "activation_checkpointing.profile", &p->profile);
    if (get_i(c, "activation_checkpointing.number_checkpoints", &n))
        p->number_checkpoints = (int)n;
    return DT_OK;
}

/* ---- pipeline parallelism ------------------------------------------------------------------- */

dt_status dt_config_pipe_params(dt_config *c, dt_pipe_params *p)
{
    if (!c || !p)
        return dt_error(DT_ERR_NULL, "dt_config_pipe_params: NULL argument");
    int64_t pp = p->pp;
    dt_status st = pipe_stages(c, &pp);
    if (st < 0)
        return st;
    const dt__cfg_val *sched = dt__cfg_get(c, "dtrain.pipeline_schedule");
    dt_pipe_kind kind = p->schedule;
    if (sched && pp <= 1)
        return dt_error(DT_ERR_INVALID_ARG, "key dtrain.pipeline_schedule \"%s\" (from %s): a schedule needs pipeline "
                                            "parallelism: set pipeline.stages or dtrain.pipeline_parallel_size > 1",
                        sched->v.s, sched->source);
    if (sched && (st = dt_pipe_kind_parse(sched->v.s, &kind)) < 0)
        return st;
    int64_t iv;
    if (dt__cfg_get(c, "pipeline") && pp <= 1)
        dt__cfg_warn(c, "the pipeline block: no effect without pipeline parallelism (pipeline.stages or "
                        "dtrain.pipeline_parallel_size > 1; DeepSpeed reads the block only in its PipelineEngine)");
    else if (get_i(c, "pipeline.activation_checkpoint_interval", &iv) && iv > 1)
        dt__cfg_warn(c, "pipeline.activation_checkpoint_interval %" PRId64 ": dtrain checkpoints each transformer "
                        "block on its own (interval 1): the same values, with more block inputs kept than %" PRId64
                        "-layer regions would keep", iv, iv);
    const dt__cfg_val *part = dt__cfg_get(c, "pipeline.partition");
    if (part && !strcmp(part->v.s, "parameters"))
        p->balance = DT_PIPE_BY_PARAMS;
    else if (part && !strcmp(part->v.s, "profile"))
        p->balance = DT_PIPE_BY_TIME; /* the caller gives p->sample (dtrain train: its first micro-batch) */
    p->pp = (int)pp;
    p->schedule = kind;
    return DT_OK;
}

/* ---- AIAK's environment variables (seed 004) ------------------------------------------------ */

static dt_status env_flag(const char *name, int *out)
{
    int64_t v;
    *out = -1; /* unset */
    const char *s = getenv(name);
    if (!s || !*s)
        return DT_OK;
    if (dt_env_int(name, 0, 0, 1, &v) < 0)
        return dt_error(DT_ERR_INVALID_ARG, "environment variable %s=%s: expected 0 or 1", name, s);
    *out = (int)v;
    return DT_OK;
}

static dt_status set_int(dt_config *c, const char *key, int64_t v, const char *source)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return dt_config_set(c, key, buf, DT_CONFIG_FROM_ENV, source);
}

dt_status dt_config_apply_env(dt_config *c)
{
    if (!c)
        return dt_error(DT_ERR_NULL, "dt_config_apply_env: NULL config");
    /* the compression variables are read by the hooks' own reader
     * (dt_comm_hook_env, parallel.h); what it finds is recorded here */
    dt_comm_hook_kind kind = DT_COMM_HOOK_COUNT;
    dt_powersgd_params ps; /* the reader only reads (and replaces) rank and start_iter */
    memset(&ps, 0, sizeof ps);
    ps.rank = -1;
    ps.start_iter = -1;
    dt_status st = dt_comm_hook_env(&kind, &ps);
    if (st < 0)
        return st;
    if (ps.rank >= 0 && (st = set_int(c, "dtrain.powersgd_rank", ps.rank, "AIAK_MATRIX_APPROXIMATION_RANK")) < 0)
        return st;
    if (ps.start_iter >= 0 &&
        (st = set_int(c, "dtrain.start_compress_iter", ps.start_iter, "AIAK_START_COMPRESS_ITER")) < 0)
        return st;
    if (kind != DT_COMM_HOOK_COUNT) {
        char q[32];
        snprintf(q, sizeof q, "\"%s\"", dt_comm_hook_name(kind));
        if ((st = dt_config_set(c, "dtrain.comm_hook", q, DT_CONFIG_FROM_ENV,
                                kind == DT_COMM_HOOK_FP16 ? "AIAK_FP16_COMPRESSION" : "AIAK_POWERSGD_COMPRESSION")) < 0)
            return st;
    }
    int hier, fused;
    if ((st = env_flag("AIAK_HIERARCHICAL_ALLREDUCE", &hier)) < 0 || (st = env_flag("AIAK_FUSED_OPTIMIZER", &fused)) < 0)
        return st;
    if (hier >= 0 && (st = dt_config_set(c, "dtrain.hierarchical_allreduce", hier ? "true" : "false",
                                         DT_CONFIG_FROM_ENV, "AIAK_HIERARCHICAL_ALLREDUCE")) < 0)
        return st;
    if (fused >= 0 && (st = dt_config_set(c, "dtrain.fused_optimizer", fused ? "true" : "false", DT_CONFIG_FROM_ENV,
                                          "AIAK_FUSED_OPTIMIZER")) < 0)
        return st;
    return DT_OK;
}
