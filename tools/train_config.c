/* `dtrain train --config FILE`: the command line's side of the JSON config.
 * The merge itself (file < flags < AIAK_*) is the library's (config.h);
 * this file only says which flag is which key, and reads back the options
 * the command acts on before the trainer exists (the batch the loader
 * takes, the stage the group is set up for, the precision the model is
 * built in, ...). The trainer's own params come from the config again in
 * train_setup.c (dt_trainer_params_apply_config), so both agree.
 *
 * Without --config only the AIAK_* variables are read: the flags and
 * their defaults act exactly as before. */
#include "cmd.h"
#include "train.h"

#include "dtrain/comm.h"
#include "dtrain/config.h"
#include "dtrain/optim.h"
#include "dtrain/pipe_strategy.h"
#include "dtrain/plan.h"
#include "dtrain/precision.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether --name was given on the command line (as --name V or --name=V). */
static bool given(int argc, char **argv, const char *name)
{
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) && (argv[i][2 + n] == 0 || argv[i][2 + n] == '='))
            return true;
    return false;
}

static int set(dt_config *c, const char *key, const char *json, const char *flag)
{
    char src[64];
    snprintf(src, sizeof src, "--%s", flag);
    if (dt_config_set(c, key, json, DT_CONFIG_FROM_CLI, src) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    return 0;
}

static int set_num(dt_config *c, const char *key, double v, const char *flag)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    return set(c, key, b, flag);
}

static int set_str(dt_config *c, const char *key, const char *v, const char *flag)
{
    char b[1200];
    dt__json_quote(v, b, sizeof b);
    return set(c, key, b, flag);
}

/* The flags that name a config key, given explicitly, into c. */
#define G(f) (given(argc, argv, f))

static int flags_into(int argc, char **argv, const dt__train_opts *o, dt_config *c)
{
    int rc = 0;
    if (!rc && G("optimizer")) {
        const char *t = !strcmp(o->optimizer, "sgd") ? "SGD" : !strcmp(o->optimizer, "lamb") ? "Lamb"
                        : !strcmp(o->optimizer, "lion") ? "Lion"
                        : !strcmp(o->optimizer, "adamw") ? "AdamW" : "Adam";
        rc = set_str(c, "optimizer.type", t, "optimizer");
        if (!rc && !strcmp(o->optimizer, "adam")) /* torch's Adam: DeepSpeed's Adam without adam_w_mode */
            rc = set(c, "optimizer.params.adam_w_mode", "false", "optimizer");
    }
    if (!rc && G("lr"))
        rc = set_num(c, "optimizer.params.lr", o->lr, "lr");
    if (!rc && G("betas") && o->beta_set) {
        char b[80];
        snprintf(b, sizeof b, "[%.17g, %.17g]", o->beta[0], o->beta[1]);
        rc = set(c, "optimizer.params.betas", b, "betas");
    }
    if (!rc && G("eps"))
        rc = set_num(c, "optimizer.params.eps", o->eps, "eps");
    if (!rc && G("weight-decay"))
        rc = set_num(c, "optimizer.params.weight_decay", o->weight_decay, "weight-decay");
    if (!rc && G("momentum"))
        rc = set_num(c, "optimizer.params.momentum", o->momentum, "momentum");
    if (!rc && G("clip-grad-norm"))
        rc = set_num(c, "gradient_clipping", o->clip_grad_norm, "clip-grad-norm");
    if (!rc && G("lr-schedule"))
        rc = set_str(c, "scheduler.type", o->lr_schedule, "lr-schedule");
    if (!rc && G("warmup"))
        rc = set_num(c, "scheduler.params.warmup_num_steps", (double)o->warmup, "warmup");
    if (!rc && G("step-size"))
        rc = set_num(c, "scheduler.params.step_size", (double)o->step_size, "step-size");
    if (!rc && G("gamma"))
        rc = set_num(c, "scheduler.params.gamma", o->gamma, "gamma");
    if (!rc && G("dataloader-drop-last"))
        rc = set(c, "dataloader_drop_last", "true", "dataloader-drop-last");
    if (!rc && G("log-every"))
        rc = set_num(c, "steps_per_print", (double)o->log_every, "log-every");
    if (!rc && G("zero"))
        rc = set(c, "zero_optimization.stage", o->zero, "zero");
    if (!rc && G("fsdp")) {
        const char *st = !strcmp(o->fsdp, "no_shard") ? "0" : !strcmp(o->fsdp, "shard_grad_op") ? "2" : "3";
        rc = set(c, "zero_optimization.stage", st, "fsdp");
        if (!rc)
            rc = set(c, "dtrain.hybrid_shard", !strcmp(o->fsdp, "hybrid_shard") ? "true" : "false", "fsdp");
    }
    if (!rc && G("precision")) {
        rc = set(c, "fp16.enabled", !strcmp(o->precision, "fp16") ? "true" : "false", "precision");
        if (!rc)
            rc = set(c, "bf16.enabled", !strcmp(o->precision, "bf16") ? "true" : "false", "precision");
    }
    if (!rc && G("reduce-dtype"))
        rc = set_str(c, "communication_data_type", o->reduce_dtype, "reduce-dtype");
    if (!rc && G("loss-scale"))
        rc = set_num(c, "fp16.loss_scale", o->loss_scale, "loss-scale");
    if (!rc && G("initial-scale-power"))
        rc = set_num(c, "fp16.initial_scale_power", (double)o->initial_scale_power, "initial-scale-power");
    if (!rc && G("loss-scale-window"))
        rc = set_num(c, "fp16.loss_scale_window", (double)o->loss_scale_window, "loss-scale-window");
    if (!rc && G("hysteresis"))
        rc = set_num(c, "fp16.hysteresis", (double)o->hysteresis, "hysteresis");
    if (!rc && G("min-loss-scale"))
        rc = set_num(c, "fp16.min_loss_scale", o->min_loss_scale, "min-loss-scale");
    if (!rc && G("activation-checkpointing"))
        rc = set(c, "dtrain.activation_checkpointing", "true", "activation-checkpointing");
    if (!rc && G("offload")) {
        bool nvme = !strncmp(o->offload, "nvme:", 5);
        rc = set_str(c, "zero_optimization.offload_optimizer.device", nvme ? "nvme" : "cpu", "offload");
        if (!rc && nvme)
            rc = set_str(c, "zero_optimization.offload_optimizer.nvme_path", o->offload + 5, "offload");
    }
    if (!rc && G("hierarchical-allreduce"))
        rc = set(c, "dtrain.hierarchical_allreduce", "true", "hierarchical-allreduce");
    if (!rc && G("tp"))
        rc = set_num(c, "dtrain.tensor_parallel_size", (double)o->tp, "tp");
    if (!rc && G("cp"))
        rc = set_num(c, "dtrain.context_parallel_size", (double)o->cp, "cp");
    if (!rc && G("cp-impl"))
        rc = set_str(c, "dtrain.context_parallel_impl", o->cp_impl, "cp-impl");
    if (!rc && G("cp-balance"))
        rc = set(c, "dtrain.context_parallel_balance", !strcmp(o->cp_balance, "on") ? "true" : "false",
                 "cp-balance");
    if (!rc && G("dp"))
        rc = set_num(c, "dtrain.data_parallel_size", (double)o->dp, "dp");
    if (!rc && G("pp")) {
        rc = set_num(c, "dtrain.pipeline_parallel_size", (double)o->pp, "pp");
        if (!rc && dt_config_origin_of(c, "pipeline.stages") != DT_CONFIG_UNSET) /* the file's other name for it */
            rc = set_num(c, "pipeline.stages", (double)o->pp, "pp");
    }
    if (!rc && G("pp-schedule"))
        rc = set_str(c, "dtrain.pipeline_schedule", o->pp_schedule, "pp-schedule");
    if (!rc && G("trace"))
        rc = set_str(c, "dtrain.trace", o->trace, "trace");
    if (!rc && G("trace-steps"))
        rc = set_str(c, "dtrain.trace_steps", o->trace_steps, "trace-steps");
    if (!rc && G("plan"))
        rc = set_str(c, "dtrain.plan", o->plan, "plan");
    if (!rc && G("comm-hook"))
        rc = set_str(c, "dtrain.comm_hook", o->comm_hook, "comm-hook");
    if (!rc && G("powersgd-rank"))
        rc = set_num(c, "dtrain.powersgd_rank", (double)o->powersgd_rank, "powersgd-rank");
    if (!rc && G("powersgd-start-iter"))
        rc = set_num(c, "dtrain.start_compress_iter", (double)o->powersgd_start_iter, "powersgd-start-iter");
    if (!rc && G("powersgd-no-error-feedback"))
        rc = set(c, "dtrain.powersgd_error_feedback", "false", "powersgd-no-error-feedback");
    if (!rc && G("powersgd-no-warm-start"))
        rc = set(c, "dtrain.powersgd_warm_start", "false", "powersgd-no-warm-start");
    return rc;
}

static int bad(void)
{
    dt__cli_err("dtrain train: --config: %s\n", dt_last_error());
    return 2;
}

/* The batch flags into c, once the pipeline stages are known (from the file or --pp): --batch and
 * --grad-accum are the micro-batch and the accumulation; with a pipeline, --batch is a step's batch per
 * replica cut into --micro-batches M, and M is DeepSpeed's gradient_accumulation_steps there. */
static int batch_flags_into(int argc, char **argv, const dt__train_opts *o, dt_config *c, int64_t pp)
{
    int rc = 0;
    if (pp <= 1) {
        if (!rc && G("batch"))
            rc = set_num(c, "train_micro_batch_size_per_gpu", (double)o->batch, "batch");
        if (!rc && G("grad-accum"))
            rc = set_num(c, "gradient_accumulation_steps", (double)o->grad_accum, "grad-accum");
        return rc;
    }
    if (G("grad-accum") && o->grad_accum != 1) {
        dt__cli_err("dtrain train: --grad-accum %lld with a pipeline from --config: there "
                    "gradient_accumulation_steps is the number of micro-batches (DeepSpeed's PipelineEngine): give "
                    "--micro-batches\n", (long long)o->grad_accum);
        return 2;
    }
    if (G("micro-batches"))
        rc = set_num(c, "gradient_accumulation_steps", (double)o->micro_batches, "micro-batches");
    if (!rc && G("batch")) {
        int64_t m = o->micro_batches ? o->micro_batches : 4;
        if (dt_config_get_int(c, "gradient_accumulation_steps", &m) != DT_OK && !o->micro_batches) {
            int64_t t, mb, tp = 1; /* the relation derives the micro-batches from the file's two others */
            int world = 1;
            (void)dt_pg_env_world_size(&world);
            dt_config_get_int(c, "dtrain.tensor_parallel_size", &tp);
            int64_t dp = world % (tp * pp) ? world : world / (tp * pp);
            if (dt_config_get_int(c, "train_batch_size", &t) == DT_OK &&
                dt_config_get_int(c, "train_micro_batch_size_per_gpu", &mb) == DT_OK && mb > 0 && dp > 0)
                m = t / mb / dp;
            m = m > 0 ? m : 4;
        }
        if (o->batch % m) {
            dt__cli_err("dtrain train: --batch %lld does not split into %lld micro-batches "
                        "(gradient_accumulation_steps with a pipeline)\n", (long long)o->batch, (long long)m);
            return 2;
        }
        rc = set_num(c, "train_micro_batch_size_per_gpu", (double)(o->batch / m), "batch");
    }
    return rc;
}

/* WarmupLR's keys (WarmupDecayLR's, and WarmupCosineLR's warm-up) that the
 * file left out or wrote "auto", filled with what the trainer will use
 * (dt_trainer_params_apply_config), so that the effective configuration
 * shows them: warmup_num_steps = --warmup (default
 * 0, no warm-up; DeepSpeed's own default 1000 is not taken silently),
 * warmup_type = "log" (DeepSpeed's default), warmup_min_lr = 0 (its
 * default), warmup_max_lr = the optimizer's lr for "auto" (as the HF
 * Trainer fills it), DeepSpeed's 1e-3 when left out. */
static dt_status resolve_warmup(const dt__train_opts *o, dt_config *c)
{
    const char *type;
    if (dt_config_get_str(c, "scheduler.type", &type) != DT_OK ||
        (strcmp(type, "WarmupLR") && strcmp(type, "WarmupDecayLR") && strcmp(type, "WarmupCosineLR")))
        return DT_OK;
    char b[40];
    snprintf(b, sizeof b, "%lld", (long long)o->warmup);
    dt_status st = dt_config_resolve(c, "scheduler.params.warmup_num_steps", b, "--warmup");
    if (st == DT_OK)
        st = dt_config_resolve(c, "scheduler.params.warmup_type", "\"log\"", "DeepSpeed WarmupLR's");
    if (!strcmp(type, "WarmupCosineLR")) /* its rate is the optimizer's lr, times its ratios */
        return st;
    if (st == DT_OK)
        st = dt_config_resolve(c, "scheduler.params.warmup_min_lr", "0", "DeepSpeed WarmupLR's");
    bool lr_auto = dt_config_is_auto(c, "scheduler.params.warmup_max_lr");
    snprintf(b, sizeof b, "%.17g", lr_auto ? o->lr : 1e-3);
    if (st == DT_OK)
        st = dt_config_resolve(c, "scheduler.params.warmup_max_lr", b,
                               lr_auto ? "the optimizer's lr" : "DeepSpeed WarmupLR's");
    return st;
}

/* A key that holds "auto" (a Hugging Face Trainer config: the trainer's
 * arguments fill it) shown with the value this run uses: its flag, or the
 * default when none was given; why names which. */
static dt_status show_auto(dt_config *c, const char *key, double v, const char *why)
{
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    return dt_config_is_auto(c, key) ? dt_config_resolve(c, key, b, why) : DT_OK;
}

/* Every "auto" key the command resolves itself, filled with what the run
 * will use, so that the effective configuration lists it (they were left
 * out of it: a config of "auto"s showed neither the batch sizes, the
 * clipping, the optimizer's settings nor the precision it had become). The
 * values are those the trainer takes anyway (its flags, then the defaults
 * the config's own keys would have had): nothing the run does changes. */
static dt_status resolve_autos(const dt__train_opts *o, const dt_trainer_params *tp, const dt_config_batch *b,
                               const dt_zero_params *zp, dt_config *c)
{
    const dt_adam_params *ad = tp->optimizer == DT_OPTIM_ADAM ? &tp->adam : &tp->adamw;
    double b1 = ad->beta1, b2 = ad->beta2, eps = ad->eps, wd = ad->weight_decay;
    if (tp->optimizer == DT_OPTIM_LAMB)
        b1 = tp->lamb.beta1, b2 = tp->lamb.beta2, eps = tp->lamb.eps, wd = tp->lamb.weight_decay;
    else if (tp->optimizer == DT_OPTIM_LION)
        b1 = tp->lion.beta1, b2 = tp->lion.beta2, eps = 0, wd = tp->lion.weight_decay;
    else if (tp->optimizer == DT_OPTIM_SGD)
        eps = 0, wd = tp->sgd.weight_decay;
    const bool sgd = tp->optimizer == DT_OPTIM_SGD;
    dt_status st = DT_OK;
    if (!o->plan) { /* under the planner the batch split is its choice, made later */
        st = show_auto(c, "train_batch_size", (double)b->train_batch_size, "--batch x --grad-accum x ranks");
        if (st == DT_OK)
            st = show_auto(c, "train_micro_batch_size_per_gpu", (double)b->micro_batch, "--batch");
        if (st == DT_OK)
            st = show_auto(c, "gradient_accumulation_steps", (double)b->grad_accum,
                           o->pp > 1 ? "--micro-batches" : "--grad-accum");
    }
    if (st == DT_OK)
        st = show_auto(c, "gradient_clipping", o->clip_grad_norm, "--clip-grad-norm; 0: off");
    if (st == DT_OK)
        st = show_auto(c, "optimizer.params.lr", o->lr, "--lr");
    if (st == DT_OK)
        st = show_auto(c, "optimizer.params.weight_decay", wd, "--weight-decay");
    if (st == DT_OK && !sgd && tp->optimizer != DT_OPTIM_LION)
        st = show_auto(c, "optimizer.params.eps", eps, "--eps");
    if (st == DT_OK && !sgd && dt_config_is_auto(c, "optimizer.params.betas")) {
        char v[80];
        snprintf(v, sizeof v, "[%.17g, %.17g]", b1, b2);
        st = dt_config_resolve(c, "optimizer.params.betas", v, "--betas");
    }
    /* fp16 / bf16 "auto": the precision this run trains in (--precision, or the CPU's under bf16 "auto") */
    const char *why = o->precision_auto ? "--precision auto: this CPU's" : "--precision";
    const bool f16 = !strcmp(o->precision, "fp16"), bf16 = !strcmp(o->precision, "bf16");
    if (st == DT_OK && dt_config_is_auto(c, "fp16.enabled"))
        st = dt_config_resolve(c, "fp16.enabled", f16 ? "true" : "false", why);
    if (st == DT_OK && dt_config_is_auto(c, "bf16.enabled"))
        st = dt_config_resolve(c, "bf16.enabled", bf16 ? "true" : "false", why);
    /* the ZeRO knobs the trainer reads (dtrain's defaults, DeepSpeed's where it has them; the HF Trainer sizes
       them from the model), the logging interval, the per-step timing */
    if (st == DT_OK && dt_config_is_auto(c, "zero_optimization.overlap_comm"))
        st = dt_config_resolve(c, "zero_optimization.overlap_comm", zp->overlap_comm ? "true" : "false",
                               "dtrain's default");
    const struct {
        const char *key;
        size_t v;
    } sizes[] = {{"zero_optimization.allgather_bucket_size", zp->allgather_bucket_size},
                 {"zero_optimization.stage3_prefetch_bucket_size", zp->prefetch_bucket_size},
                 {"zero_optimization.stage3_param_persistence_threshold", zp->param_persistence_threshold},
                 {"zero_optimization.stage3_max_live_parameters", zp->max_live_parameters},
                 {"zero_optimization.stage3_max_reuse_distance", zp->max_reuse_distance}};
    for (size_t i = 0; st == DT_OK && i < sizeof sizes / sizeof sizes[0]; i++)
        st = show_auto(c, sizes[i].key, (double)sizes[i].v, "dtrain's default");
    if (st == DT_OK)
        st = show_auto(c, "steps_per_print", (double)o->log_every, "--log-every");
    if (st == DT_OK && dt_config_is_auto(c, "wall_clock_breakdown"))
        st = dt_config_resolve(c, "wall_clock_breakdown", "false", "the default");
    return st;
}

/* The options the command acts on before the trainer exists, from c. */
static int read_back(dt__train_opts *o, dt_config *c)
{
    int world = 1;
    if (dt_pg_env_world_size(&world) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    bool planned = false; /* "dtrain": {"plan": "auto"}: the layout keys are the planner's (refused by name) */
    if (dt_plan_config_auto(c, &planned) < 0)
        return bad();
    if (planned)
        o->plan = "auto";
    int64_t tpn = o->tp;
    if (dt_config_get_int(c, "dtrain.tensor_parallel_size", &tpn) == DT_OK)
        o->tp = tpn;
    dt_config_get_int(c, "dtrain.data_parallel_size", &o->dp);
    /* context parallelism: DeepSpeed's sequence_parallel_size is its Ulysses degree, dtrain's own key (and
       --cp) ring attention unless dtrain.context_parallel_impl says otherwise */
    const char *cs;
    bool cb;
    if (dt_config_get_int(c, "sequence_parallel_size", &o->cp) == DT_OK)
        o->cp_impl = "ulysses";
    if (dt_config_get_int(c, "dtrain.context_parallel_size", &o->cp) == DT_OK)
        o->cp_impl = NULL;
    if (dt_config_get_str(c, "dtrain.context_parallel_impl", &cs) == DT_OK)
        o->cp_impl = !strcmp(cs, "ulysses") ? "ulysses" : "ring";
    if (dt_config_get_bool(c, "dtrain.context_parallel_balance", &cb) == DT_OK)
        o->cp_balance = cb ? "on" : "off";
    dt_pipe_params pq = dt_pipe_params_default();
    pq.pp = o->pp > 1 ? (int)o->pp : 1;
    if (dt_config_pipe_params(c, &pq) < 0)
        return bad();
    int64_t pp = pq.pp, per = (tpn > 1 ? tpn : 1) * pp * (o->cp > 1 ? o->cp : 1);
    if (pp > 1 && world % per) {
        dt__cli_err("dtrain train: --config: key %s %lld x dtrain.tensor_parallel_size %lld (%lld ranks a pipeline) "
                    "does not divide this job's %d ranks (start them with dtrain run -n N)\n",
                    dt_config_origin_of(c, "dtrain.pipeline_parallel_size") ? "dtrain.pipeline_parallel_size"
                                                                              : "pipeline.stages",
                    (long long)pp, (long long)(tpn > 1 ? tpn : 1), (long long)per, world);
        return 2;
    }
    if (o->dp > 0 && o->dp * per != world) {
        char cps[64] = ""; /* per counts the context-parallel ranks too */
        if (o->cp > 1)
            snprintf(cps, sizeof cps, " x context_parallel_size %lld", (long long)o->cp);
        dt__cli_err("dtrain train: --config: key dtrain.data_parallel_size %lld x tensor_parallel_size %lld x "
                    "pipeline stages %lld%s is %lld ranks; this job has %d\n", (long long)o->dp,
                    (long long)(tpn > 1 ? tpn : 1), (long long)pp, cps, (long long)(o->dp * per), world);
        return 2;
    }
    int dp = world % per == 0 ? world / (int)per : world; /* the relation counts data-parallel ranks */
    dt_config_batch b;
    if (pp > 1) { /* gradient_accumulation_steps = micro-batches: dtrain's defaults M = 4, --batch = micro x M */
        int64_t m = o->micro_batches ? o->micro_batches : 4;
        if (dt_config_batch_resolve(c, dp, o->batch / m > 0 ? o->batch / m : 1, m, &b) < 0)
            return bad();
        if (b.grad_accum > 4096) {
            dt__cli_err("dtrain train: --config: gradient_accumulation_steps %lld: at most 4096 micro-batches with "
                        "a pipeline\n", (long long)b.grad_accum);
            return 2;
        }
        o->pp = pp;
        o->micro_batches = b.grad_accum;
        o->batch = b.micro_batch * b.grad_accum;
        o->grad_accum = 1;
    } else {
        if (dt_config_batch_resolve(c, dp, o->batch, o->grad_accum, &b) < 0)
            return bad();
        if (b.grad_accum > 1048576) { /* derived from train_batch_size: past what the trainer accumulates */
            dt__cli_err("dtrain train: --config: gradient_accumulation_steps %lld (train_batch_size %lld / "
                        "train_micro_batch_size_per_gpu %lld / %d data-parallel ranks): at most 1048576\n",
                        (long long)b.grad_accum, (long long)b.train_batch_size, (long long)b.micro_batch, dp);
            return 2;
        }
        o->batch = b.micro_batch;
        o->grad_accum = b.grad_accum;
    }
    if (dt_config_origin_of(c, "dtrain.pipeline_schedule") != DT_CONFIG_UNSET)
        o->pp_schedule = dt_pipe_kind_name(pq.schedule);
    if (pq.balance != DT_PIPE_BY_COMPUTE && !o->pp_balance) /* "parameters" / "profile" */
        o->pp_balance = pq.balance == DT_PIPE_BY_PARAMS ? "params" : "time";
    dt_dtype dt = DT_F32;
    dt_status st = dt_config_precision(c, &dt);
    if (st < 0 && st != DT_ERR_NOT_FOUND)
        return bad();
    if (st == DT_OK && dt == DT_DTYPE_UNSET) /* bf16.enabled "auto": chosen here, and why said at start */
        dt = dt_precision_auto(&o->precision_auto);
    if (st == DT_OK)
        o->precision = dt == DT_F16 ? "fp16" : dt == DT_BF16 ? "bf16" : "fp32";
    const char *s;
    if (dt_config_get_str(c, "communication_data_type", &s) == DT_OK)
        o->reduce_dtype = s;
    int stage = -1;
    dt_zero_params zp = dt_zero_params_default();
    if (dt_config_zero_params(c, &stage, &zp) < 0)
        return bad();
    bool hybrid = false;
    dt_config_get_bool(c, "dtrain.hybrid_shard", &hybrid);
    if (stage >= 0) {
        static const char *const names[] = {"0", "1", "2", "3"};
        o->zero = hybrid ? NULL : names[stage];
        o->fsdp = hybrid ? "hybrid_shard" : NULL;
    } else if (hybrid) { /* the key alone asks for it, as --fsdp hybrid_shard does */
        o->zero = NULL;
        o->fsdp = "hybrid_shard";
    }
    dt_act_ckpt_params ap = dt_act_ckpt_params_default();
    if (dt_config_act_ckpt(c, &o->act_ckpt, &ap) < 0)
        return bad();
    dt_offload_params op = dt_offload_params_default();
    if (dt_config_offload_params(c, &op) < 0)
        return bad();
    if (op.device == DT_OFFLOAD_CPU)
        o->offload = "cpu";
    else if (op.device == DT_OFFLOAD_NVME) {
        snprintf(o->offload_buf, sizeof o->offload_buf, "nvme:%s", op.nvme_path);
        o->offload = o->offload_buf;
    } else if (dt_config_origin_of(c, "zero_optimization.offload_optimizer.device") != DT_CONFIG_UNSET)
        o->offload = NULL; /* "none" */
    int64_t v;
    if (dt_config_get_int(c, "steps_per_print", &v) == DT_OK)
        o->log_every = v;
    dt_config_get_bool(c, "dataloader_drop_last", &o->drop_last);
    dt_config_get_double(c, "gradient_clipping", &o->clip_grad_norm);
    if (dt_config_origin_of(c, "dtrain.hierarchical_allreduce") < DT_CONFIG_FROM_ENV) /* train_ddp.c reads AIAK_* */
        dt_config_get_bool(c, "dtrain.hierarchical_allreduce", &o->hierarchical_allreduce);
    /* the communication hook: from the file or a flag only (train_ddp.c reads AIAK_* over these itself) */
    bool on;
    if (dt_config_origin_of(c, "dtrain.comm_hook") < DT_CONFIG_FROM_ENV)
        dt_config_get_str(c, "dtrain.comm_hook", &o->comm_hook);
    if (dt_config_origin_of(c, "dtrain.powersgd_rank") < DT_CONFIG_FROM_ENV)
        dt_config_get_int(c, "dtrain.powersgd_rank", &o->powersgd_rank);
    if (dt_config_origin_of(c, "dtrain.start_compress_iter") < DT_CONFIG_FROM_ENV)
        dt_config_get_int(c, "dtrain.start_compress_iter", &o->powersgd_start_iter);
    if (dt_config_get_bool(c, "dtrain.powersgd_error_feedback", &on) == DT_OK)
        o->powersgd_no_error_feedback = !on;
    if (dt_config_get_bool(c, "dtrain.powersgd_warm_start", &on) == DT_OK)
        o->powersgd_no_warm_start = !on;
    /* the optimizer the trainer will build (the memory check and the lines printed name it) */
    dt_trainer_params tp = dt_trainer_params_default();
    if (dt_optim_kind_parse(o->optimizer, &tp.optimizer) < 0 || dt_trainer_params_apply_config(c, &tp) < 0)
        return bad();
    o->optimizer = dt_optim_kind_name(tp.optimizer);
    o->lr = dt_trainer_params_lr(&tp);
    if (resolve_warmup(o, c) < 0)
        return bad();
    if (dt_config_get_double(c, "optimizer.params.momentum", &o->momentum) != DT_OK && tp.optimizer != DT_OPTIM_SGD)
        o->momentum = 0;
    if (st == DT_OK && dt == DT_BF16 && o->loss_scale >= 0)
        o->loss_scale = -1; /* bf16 from the config: no scaling (DeepSpeed forces scale 1) */
    if (resolve_autos(o, &tp, &b, &zp, c) < 0)
        return bad();
    return dt__train_check(o);
}

int dt__train_config(int argc, char **argv, dt__train_opts *o)
{
    dt_config *c;
    if (dt_config_init(&c) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 1;
    }
    o->cfg = c;
    if (o->config) {
        if (dt_config_load_file(c, o->config) < 0)
            return bad();
        int rc = flags_into(argc, argv, o, c);
        if (rc)
            return rc;
        dt_pipe_params pq = dt_pipe_params_default();
        pq.pp = 1;
        if (dt_config_pipe_params(c, &pq) < 0)
            return bad();
        if ((rc = batch_flags_into(argc, argv, o, c, pq.pp)))
            return rc;
    }
    if (dt_config_apply_env(c) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    if (!o->config)
        return 0; /* only AIAK_*: nothing the options hold */
    return read_back(o, c);
}

void dt__train_config_print(const dt__train_opts *o)
{
    const dt_config *c = o->cfg;
    if (!c)
        return;
    for (size_t i = 0; i < dt_config_num_warnings(c); i++)
        dt__cli_err("dtrain train: warning: %s\n", dt_config_warning(c, i));
    char *tx = dt_config_effective_text(c);
    if (tx && *tx)
        printf("config%s%s (file < flags < AIAK_* environment):\n%s", o->config ? " " : "",
               o->config ? o->config : "", tx);
    free(tx);
    fflush(stdout);
}
