/* The parallel side of `dtrain train` (see train_ddp.h): its flags (a
 * --config's keys came into them: train_config.c) become a plan (plan.h),
 * which checks them against the world and builds the groups, the mesh and
 * the strategy; what the run prints about it is train_report.c's.
 *
 * Batch sizes are per rank, as in PyTorch DDP: two ranks of --batch 100
 * take 200 samples per optimizer step and half as many steps per epoch.
 * The DistributedSampler pads the epoch by wrapping, so every rank runs the
 * same number of steps and no collective is left waiting at the end. */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The flags as the plan's parameters; a --config's layout (flags merged in) by dt_plan_from_config. */
static int plan_params(dt__ddp_run *r, const dt__train_opts *o, dt_plan_params *pp)
{
    *pp = dt_plan_params_default();
    const char *names[6] = {"--dp", "--tp", "--pp", "--comm-hook", "--zero/--fsdp", "--cp"};
    memcpy(pp->names, names, sizeof names);
    pp->dp = (int)o->dp, pp->tp = o->tp > 1 ? (int)o->tp : 1, pp->pp = o->pp > 1 ? (int)o->pp : 1;
    pp->zero_stage = o->zero ? o->zero[0] - '0' : 0;
    pp->cp = o->cp > 1 ? (int)o->cp : 1;
    if (o->cp_impl) /* checked by the parser */
        dt_cp_impl_parse(o->cp_impl, &pp->cp_impl);
    pp->cp_balance = !o->cp_balance ? -1 : !strcmp(o->cp_balance, "on");
    dt_fsdp_sharding sh;
    if (o->fsdp && dt_fsdp_sharding_parse(o->fsdp, &sh) >= 0) /* checked by the parser */
        pp->fsdp = (int)sh;
    pp->sync_bn = o->sync_bn, pp->zero.wrap_min_params = (size_t)o->wrap_min_params;
    dt_prefetch_parse(o->backward_prefetch, &pp->zero.backward_prefetch);
    pp->zero.forward_prefetch = o->forward_prefetch;
    pp->zero.init_seed = o->seed;
    pp->zero.init_rng = !strcmp(o->rng, "torch") ? DT_INIT_TORCH : DT_INIT_PHILOX;
    int unused = -1; /* without --config: AIAK_*'s zero_optimization knobs (the stage is o->zero) */
    if (o->config && o->cfg && dt_plan_from_config(o->cfg, pp) < 0)
        return dt__cli_err("dtrain train: --config: %s\n", dt_last_error()), 2;
    if (!o->config && o->cfg)
        dt_config_zero_params(o->cfg, &unused, &pp->zero);
    /* ZeRO++: the flags over the config's keys (checked by the plan) */
    pp->zero.quantized_weights |= o->zero_qw;
    pp->zero.quantized_gradients |= o->zero_qg;
    if (o->zero_hpz > 0)
        pp->zero.hpz_partition_size = (int)o->zero_hpz;
    if (o->zero_quant_block > 0)
        pp->zero.quant_block = o->zero_quant_block;
    if (o->zero_grad_block > 0)
        pp->zero.quant_grad_block = o->zero_grad_block;
    if (o->zero_grad_bits)
        pp->zero.quant_grad_bits = atoi(o->zero_grad_bits);
    if (o->offload_param) /* the command line over the config's offload_param (checked by the parser) */
        dt_offload_parse(o->offload_param, &pp->zero.offload_param);
    /* hierarchical reductions: AIAK's switch over the flag over the config */
    int64_t aiak;
    if (dt_env_int("AIAK_HIERARCHICAL_ALLREDUCE", -1, 0, 1, &aiak) < 0)
        return dt__cli_err("dtrain train: %s (1 = on, 0 = off)\n", dt_last_error()), 2;
    pp->hierarchical = aiak >= 0 ? aiak == 1 : o->hierarchical_allreduce || pp->zero.hierarchical;
    if (o->bucket_mb > 0) { /* PyTorch's first bucket is 1 MiB; a smaller cap shrinks it too */
        pp->ddp.bucket_cap_mb = o->bucket_mb;
        if (pp->ddp.first_bucket_mb > o->bucket_mb)
            pp->ddp.first_bucket_mb = o->bucket_mb;
    }
    pp->ddp.comm_hook = r->hook;
    pp->ddp.powersgd = r->psgd;
    pp->pipe.micro_batches = o->micro_batches ? (int)o->micro_batches : 4;
    pp->pipe.balance = !o->pp_balance || !strcmp(o->pp_balance, "compute") ? DT_PIPE_BY_COMPUTE
                       : !strcmp(o->pp_balance, "params")                  ? DT_PIPE_BY_PARAMS
                                                                           : DT_PIPE_BY_TIME;
    dt_pipe_kind_parse(o->pp_schedule ? o->pp_schedule : "1f1b", &pp->pipe.schedule); /* checked by the parser */
    return 0;
}

int dt__ddp_setup(dt__ddp_run *r, const dt__train_opts *o)
{
    memset(r, 0, sizeof *r);
    int ws, rc; /* the world from the environment, by the library's strict parser */
    if (dt_pg_env_world_size(&ws) < 0)
        return dt__cli_err("dtrain train: %s\n", dt_last_error()), 2;
    dt_plan_params pp;
    if ((rc = dt__train_comm_hook(o, ws, &r->hook, &r->psgd)) || (rc = plan_params(r, o, &pp)))
        return rc;
    dt_flight_set_dir(o->save); /* a failing group writes its flight recorder there */
    pp.interrupted = dt__tr_stop_pending; /* Ctrl-C while waiting for the other ranks: stop now, exit 130 */
    dt_status st = dt_plan_init(NULL, &pp, &r->plan);
    if (st == DT_ERR_CANCELED)
        return dt__cli_err("dtrain train: interrupted by signal %d during start-up: %s\n", dt__tr_stop_pending(NULL),
                           dt_last_error()), 130;
    if (st < 0) /* numbers that do not fit, a bad DT_* variable, backend name or a foreign job: bad input */
        return dt__cli_err("dtrain train: %s\n", dt_last_error()),
               st == DT_ERR_INVALID_ARG || st == DT_ERR_NOT_FOUND || st == DT_ERR_RANGE || st == DT_ERR_MISMATCH ? 2 : 1;
    r->zp = pp.zero, r->hier = pp.hierarchical;
    r->pp_sched = o->pp_schedule ? o->pp_schedule : "1f1b";
    r->pp_balance = pp.pipe.balance, r->pp_micro = pp.pipe.micro_batches;
    r->stage = dt_plan_zero_stage(r->plan), r->tp_pg = dt_plan_tp_group(r->plan);
    r->pg = dt_plan_dp_group(r->plan), r->world_pg = dt_plan_world_group(r->plan);
    r->rank = dt_plan_rank(r->plan), r->world = dt_plan_world(r->plan);
    r->tp = dt_plan_tp(r->plan), r->tp_rank = dt_plan_tp_rank(r->plan);
    r->pp = dt_plan_pp(r->plan), r->pp_rank = dt_plan_pp_rank(r->plan);
    r->cp = dt_plan_cp(r->plan), r->cp_rank = dt_plan_cp_rank(r->plan), r->cpp = dt_plan_cp_params(r->plan);
    return 0;
}

int dt__ddp_wrap(dt__ddp_run *r, dt_model *m)
{
    int rc;
    if (r->pp <= 1 && r->pg && r->hier && r->world > 1 && (rc = dt__ddp_say_hierarchy(r)))
        return rc;
    dt_plan_set_sample(r->plan, r->pp_sample);
    if (dt_plan_strategy(r->plan, m, &r->strategy) < 0)
        return dt__cli_err("dtrain train: %s%s\n", r->pp > 1 ? "--pp: " : "", dt_last_error()), 1;
    r->nconverted = dt_plan_num_syncbn(r->plan);
    return 0;
}

dt_strategy *dt__ddp_take_strategy(dt__ddp_run *r)
{
    dt_strategy *s = r->strategy;
    r->strategy = NULL;
    r->used = s;
    return s;
}

bool dt__ddp_is_main(const dt__ddp_run *r) { return dt_plan_is_main(r->plan); }

int dt__ddp_reduce_size(const dt__ddp_run *r) { return r->pg && r->pp <= 1 ? dt_pg_size(r->pg) : r->world; }

bool dt__ddp_lazy_model(const dt__ddp_run *r) { return dt_plan_meta_model(r->plan); }

void dt__ddp_free_ddp(dt__ddp_run *r)
{
    dt_strategy_free(r->strategy); /* only when no trainer took it */
    r->strategy = NULL;
}

void dt__ddp_free_group(dt__ddp_run *r)
{
    dt_plan_free(r->plan); /* the groups and the mesh, subgroups before their parent */
    r->plan = NULL;
    r->pg = r->world_pg = r->tp_pg = NULL;
}
