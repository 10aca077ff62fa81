/* Every key dtrain reads from a DeepSpeed-style config, with its type and
 * range. What each key does here is config_map.c's (and docs/GUIDE.md's);
 * this table only says what a well-formed value is. Blocks (DT__KT_OBJECT)
 * come before their members: the reader walks a block's members only when
 * the block is in the table, and warns about any other member. */
#include "config_impl.h"

#include <string.h>

#define BIG 1e15 /* sizes in elements, steps */
#define OBJ(p) {p, DT__KT_OBJECT, 0, 0, 0, NULL}
#define BOOL(p, f) {p, DT__KT_BOOL, 0, 0, f, NULL}
#define INT(p, lo, hi, f) {p, DT__KT_INT, lo, hi, f, NULL}
#define FLT(p, lo, hi, f) {p, DT__KT_FLOAT, lo, hi, f, NULL}
#define STR(p, ch, f) {p, DT__KT_STR, 0, 0, f, ch}
#define A DT__KF_AUTO
#define N DT__KF_NULL
#define X DT__KF_NOOP /* no effect in dtrain */
#define E DT__KF_EMPTY

const dt__cfg_key dt__cfg_keys[] = {
    /* batch */
    INT("train_batch_size", 1, BIG, A),
    INT("train_micro_batch_size_per_gpu", 1, BIG, A),
    INT("gradient_accumulation_steps", 1, 1048576, A), /* the trainer's limit (dt_trainer_params.grad_accum) */
    /* clipping, logging */
    FLT("gradient_clipping", 0, 1e30, A),
    INT("steps_per_print", 1, BIG, A),
    BOOL("dataloader_drop_last", 0),
    BOOL("wall_clock_breakdown", A),
    BOOL("memory_breakdown", A | X),
    BOOL("dump_state", X),
    /* gradient reduction */
    STR("communication_data_type", "fp32|fp16|bf16", A | N),
    BOOL("prescale_gradients", 0),
    FLT("gradient_predivide_factor", 1e-30, 1e30, 0),
    BOOL("sparse_gradients", 0),
    BOOL("zero_allow_untested_optimizer", X),
    /* DeepSpeed-Ulysses' degree (DeepSpeed reads it at the top level): context parallelism with
       all-to-all attention */
    INT("sequence_parallel_size", 1, 65536, 0),
    BOOL("zero_force_ds_cpu_optimizer", X),
    /* fp16 */
    OBJ("fp16"),
    BOOL("fp16.enabled", A),
    FLT("fp16.loss_scale", 0, 1e38, 0),
    INT("fp16.initial_scale_power", 0, 127, 0),
    INT("fp16.loss_scale_window", 1, 1e12, 0),
    INT("fp16.hysteresis", 1, 1e6, 0),
    BOOL("fp16.consecutive_hysteresis", 0),
    FLT("fp16.min_loss_scale", 1e-38, 1e38, 0),
    BOOL("fp16.auto_cast", 0),
    /* bf16 */
    OBJ("bf16"),
    BOOL("bf16.enabled", A),
    OBJ("amp"),
    BOOL("amp.enabled", 0),
    /* ZeRO */
    OBJ("zero_optimization"),
    INT("zero_optimization.stage", 0, 3, 0),
    BOOL("zero_optimization.overlap_comm", A),
    BOOL("zero_optimization.contiguous_gradients", X),
    INT("zero_optimization.reduce_bucket_size", 1, BIG, A | X),
    INT("zero_optimization.allgather_bucket_size", 1, BIG, A),
    BOOL("zero_optimization.allgather_partitions", X),
    BOOL("zero_optimization.reduce_scatter", 0),
    INT("zero_optimization.sub_group_size", 1, BIG, A),
    BOOL("zero_optimization.round_robin_gradients", X),
    INT("zero_optimization.stage3_prefetch_bucket_size", 0, BIG, A),
    INT("zero_optimization.stage3_param_persistence_threshold", 0, BIG, A),
    INT("zero_optimization.stage3_model_persistence_threshold", 0, 0x1p63, A | X), /* sys.maxsize */
    INT("zero_optimization.stage3_max_live_parameters", 0, BIG, A),
    INT("zero_optimization.stage3_max_reuse_distance", 0, BIG, A),
    BOOL("zero_optimization.stage3_gather_16bit_weights_on_model_save", A | X),
    BOOL("zero_optimization.gather_16bit_weights_on_model_save", A | X),
    BOOL("zero_optimization.cpu_offload", 0),
    BOOL("zero_optimization.ignore_unused_parameters", X),
    BOOL("zero_optimization.elastic_checkpoint", X),
    INT("zero_optimization.zero_hpz_partition_size", 1, 1e6, 0),
    BOOL("zero_optimization.zero_quantized_weights", 0),
    BOOL("zero_optimization.zero_quantized_gradients", 0),
    {"zero_optimization.offload_optimizer", DT__KT_OBJECT, 0, 0, N, NULL}, /* null: none (DeepSpeed's Optional) */
    STR("zero_optimization.offload_optimizer.device", "none|cpu|nvme", N),
    STR("zero_optimization.offload_optimizer.nvme_path", NULL, N),
    BOOL("zero_optimization.offload_optimizer.pin_memory", 0),
    FLT("zero_optimization.offload_optimizer.ratio", 0, 1, 0),
    INT("zero_optimization.offload_optimizer.buffer_count", 1, 1e6, 0),
    BOOL("zero_optimization.offload_optimizer.fast_init", 0),
    {"zero_optimization.offload_param", DT__KT_OBJECT, 0, 0, N, NULL},
    STR("zero_optimization.offload_param.device", "none|cpu|nvme", N),
    STR("zero_optimization.offload_param.nvme_path", NULL, N),
    BOOL("zero_optimization.offload_param.pin_memory", X),
    INT("zero_optimization.offload_param.buffer_count", 1, 1e6, 0),
    INT("zero_optimization.offload_param.buffer_size", 1, BIG, 0),
    INT("zero_optimization.offload_param.max_in_cpu", 0, BIG, X),
    /* optimizer */
    OBJ("optimizer"),
    STR("optimizer.type", "Adam|AdamW|SGD|Lamb|Lion", 0),
    OBJ("optimizer.params"),
    FLT("optimizer.params.lr", 0, 1e6, A),
    {"optimizer.params.betas", DT__KT_PAIR, 0, 0.999999999, A, NULL},
    FLT("optimizer.params.eps", 1e-30, 1, A),
    FLT("optimizer.params.weight_decay", 0, 1e6, A),
    BOOL("optimizer.params.adam_w_mode", 0),
    BOOL("optimizer.params.torch_adam", 0),
    BOOL("optimizer.params.amsgrad", 0),
    BOOL("optimizer.params.fp32_optimizer_states", X),
    FLT("optimizer.params.momentum", 0, 0.999999, 0),
    FLT("optimizer.params.dampening", 0, 1, 0),
    BOOL("optimizer.params.nesterov", 0),
    BOOL("optimizer.params.bias_correction", 0),
    FLT("optimizer.params.max_grad_norm", 0, 1e30, 0),
    BOOL("optimizer.params.grad_averaging", 0),
    FLT("optimizer.params.max_coeff", 0, 1e30, 0),
    FLT("optimizer.params.min_coeff", 0, 1e30, 0),
    /* scheduler: DeepSpeed's names and dtrain's own (constant, step, cosine, linear) */
    OBJ("scheduler"),
    STR("scheduler.type", "WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|LRRangeTest|constant|step|cosine|linear",
        0),
    OBJ("scheduler.params"),
    FLT("scheduler.params.warmup_min_lr", 0, 1e6, A),
    FLT("scheduler.params.warmup_max_lr", 0, 1e6, A),
    INT("scheduler.params.warmup_num_steps", 0, BIG, A),
    STR("scheduler.params.warmup_type", "linear|log", 0),
    INT("scheduler.params.total_num_steps", 1, BIG, A),
    INT("scheduler.params.step_size", 1, BIG, 0),
    FLT("scheduler.params.gamma", 0, 1, 0),
    FLT("scheduler.params.min_lr", 0, 1e6, 0),
    INT("scheduler.params.last_batch_iteration", -1, -1, 0),
    FLT("scheduler.params.warmup_min_ratio", 0, 1e6, 0),
    FLT("scheduler.params.cos_min_ratio", 0, 1e6, 0),
    FLT("scheduler.params.lr_range_test_min_lr", 0, 1e6, A),
    INT("scheduler.params.lr_range_test_step_size", 1, BIG, 0),
    FLT("scheduler.params.lr_range_test_step_rate", 0, 1e6, 0),
    BOOL("scheduler.params.lr_range_test_staircase", 0),
    FLT("scheduler.params.cycle_min_lr", 0, 1e6, 0),
    FLT("scheduler.params.cycle_max_lr", 0, 1e6, A),
    FLT("scheduler.params.decay_lr_rate", 0, 1e6, 0),
    INT("scheduler.params.cycle_first_step_size", 1, BIG, 0),
    INT("scheduler.params.cycle_second_step_size", 1, BIG, N),
    INT("scheduler.params.cycle_first_stair_count", 0, BIG, 0),
    INT("scheduler.params.cycle_second_stair_count", 0, BIG, N),
    INT("scheduler.params.decay_step_size", 0, BIG, 0),
    BOOL("scheduler.params.cycle_momentum", 0),
    FLT("scheduler.params.cycle_min_mom", 0, 0.999999, 0),
    FLT("scheduler.params.cycle_max_mom", 0, 0.999999, 0),
    FLT("scheduler.params.decay_mom_rate", 0, 1e6, 0),
    /* activation checkpointing */
    OBJ("activation_checkpointing"),
    BOOL("activation_checkpointing.partition_activations", 0),
    BOOL("activation_checkpointing.cpu_checkpointing", X),
    BOOL("activation_checkpointing.contiguous_memory_optimization", X),
    INT("activation_checkpointing.number_checkpoints", 0, 1e9, N),
    BOOL("activation_checkpointing.synchronize_checkpoint_boundary", X),
    BOOL("activation_checkpointing.profile", 0),
    /* pipeline parallelism: DeepSpeed's block as its PipelineModule / PipelineEngine read it (with
       more than one stage, gradient_accumulation_steps is the number of micro-batches) */
    OBJ("pipeline"),
    INT("pipeline.stages", 1, 256, A),
    STR("pipeline.partition", NULL, 0),
    BOOL("pipeline.seed_layers", 0),
    INT("pipeline.activation_checkpoint_interval", 0, 1e6, 0),
    BOOL("pipeline.pipe_partitioned", X),
    BOOL("pipeline.grad_partitioned", X),
    BOOL("pipeline.use_reentrant", X),
    /* monitors (DeepSpeed's monitor config): TensorBoard event files and CSV files of the scalars, in
       output_path/job_name (dt_monitor_open_config, monitor.h); W&B and Comet log to a service: no effect here */
    OBJ("tensorboard"),
    BOOL("tensorboard.enabled", 0),
    STR("tensorboard.output_path", NULL, E),
    STR("tensorboard.job_name", NULL, E),
    OBJ("csv_monitor"),
    BOOL("csv_monitor.enabled", 0),
    STR("csv_monitor.output_path", NULL, E),
    STR("csv_monitor.job_name", NULL, E),
    OBJ("wandb"),
    BOOL("wandb.enabled", X),
    STR("wandb.group", NULL, X | N),
    STR("wandb.team", NULL, X | N),
    STR("wandb.project", NULL, X),
    OBJ("flops_profiler"), /* DeepSpeed's profiler; dtrain reports FLOPs as MFU and in --trace */
    BOOL("flops_profiler.enabled", X),
    FLT("flops_profiler.recompute_fwd_factor", 0, 1e6, X),
    INT("flops_profiler.profile_step", 0, BIG, X),
    INT("flops_profiler.module_depth", -1, 1e6, X),
    INT("flops_profiler.top_modules", 0, 1e6, X),
    BOOL("flops_profiler.detailed", X),
    STR("flops_profiler.output_file", NULL, X | N),
    OBJ("comms_logger"), /* DeepSpeed's collective log; dtrain's is --trace's (and the flight recorder) */
    BOOL("comms_logger.enabled", X),
    BOOL("comms_logger.verbose", X),
    BOOL("comms_logger.prof_all", X),
    BOOL("comms_logger.debug", X),
    OBJ("checkpoint"), /* dtrain's saves are collective and load at any world size */
    STR("checkpoint.tag_validation", "Ignore|Warn|Fail", X),
    BOOL("checkpoint.load_universal", X),
    BOOL("checkpoint.use_node_local_storage", X),
    OBJ("comet"),
    BOOL("comet.enabled", X),
    INT("comet.samples_log_interval", 1, BIG, X),
    STR("comet.project", NULL, X | N),
    STR("comet.workspace", NULL, X | N),
    STR("comet.api_key", NULL, X | N),
    STR("comet.experiment_name", NULL, X | N),
    STR("comet.experiment_key", NULL, X | N),
    BOOL("comet.online", X | N),
    STR("comet.mode", NULL, X | N),
    /* dtrain's own block: what DeepSpeed's config does not say */
    OBJ("dtrain"),
    BOOL("dtrain.activation_checkpointing", 0),
    BOOL("dtrain.hybrid_shard", 0),
    STR("dtrain.comm_hook", "allreduce|fp16|bf16|powersgd", 0),
    INT("dtrain.powersgd_rank", 1, 1024, 0),
    INT("dtrain.start_compress_iter", 0, BIG, 0),
    BOOL("dtrain.powersgd_error_feedback", 0),
    BOOL("dtrain.powersgd_warm_start", 0),
    BOOL("dtrain.hierarchical_allreduce", 0),
    INT("dtrain.zero_quant_block", 1, 1073741824, 0),
    INT("dtrain.zero_quant_grad_bits", 4, 8, 0),
    INT("dtrain.zero_quant_grad_block", 1, 1073741824, 0),
    BOOL("dtrain.fused_optimizer", X),
    INT("dtrain.tensor_parallel_size", 1, 1e6, 0),
    INT("dtrain.context_parallel_size", 1, 65536, 0),
    STR("dtrain.context_parallel_impl", "ring|ulysses", 0),
    BOOL("dtrain.context_parallel_balance", 0),
    INT("dtrain.data_parallel_size", 1, 65536, 0),
    INT("dtrain.pipeline_parallel_size", 1, 256, 0),
    STR("dtrain.pipeline_schedule", "gpipe|1f1b|interleaved|zbh1", 0),
    STR("dtrain.trace", NULL, 0),
    STR("dtrain.trace_steps", NULL, 0),
    INT("dtrain.micro_batches", 1, 1e9, 0),
    STR("dtrain.plan", "auto", 0),
};
const size_t dt__cfg_nkeys = sizeof dt__cfg_keys / sizeof dt__cfg_keys[0];

int dt__cfg_find(const char *path)
{
    for (size_t i = 0; path && i < dt__cfg_nkeys; i++)
        if (!strcmp(dt__cfg_keys[i].path, path))
            return (int)i;
    return -1;
}

const char *dt_config_key_name(size_t i) { return i < dt__cfg_nkeys ? dt__cfg_keys[i].path : NULL; }
