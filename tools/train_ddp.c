/* The data-parallel side of `dtrain train` (see train_ddp.h).
 *
 * Batch sizes are per rank, as in PyTorch DDP: two ranks of --batch 100
 * take 200 samples per optimizer step and half as many steps per epoch.
 * The DistributedSampler pads the epoch by wrapping, so every rank runs the
 * same number of steps and no collective is left waiting at the end. */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"
#include "dtrain/pipeline.h"
#include "dtrain/tp.h"

#include "dtrain/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --comm-hook and the --powersgd-* options, then AIAK's variables over
 * them (dt_comm_hook_env), and the combinations that make no sense. */
static int resolve_hook(dt__ddp_run *r, const dt__train_opts *o, int ws)
{
    r->hook = DT_COMM_HOOK_ALLREDUCE;
    r->psgd = dt_powersgd_params_default();
    if (o->comm_hook && dt_comm_hook_parse(o->comm_hook, &r->hook) < 0) {
        dt__cli_err("dtrain train: --comm-hook: %s\n", dt_last_error());
        return 2;
    }
    if (o->powersgd_rank > 0)
        r->psgd.rank = (int)o->powersgd_rank;
    if (o->powersgd_start_iter >= 0)
        r->psgd.start_iter = o->powersgd_start_iter;
    r->psgd.use_error_feedback = !o->powersgd_no_error_feedback;
    r->psgd.warm_start = !o->powersgd_no_warm_start;
    if (dt_comm_hook_env(&r->hook, &r->psgd) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    const bool psgd_opts = o->powersgd_rank > 0 || o->powersgd_start_iter >= 0 || o->powersgd_no_error_feedback ||
                           o->powersgd_no_warm_start;
    if (psgd_opts && r->hook != DT_COMM_HOOK_POWERSGD) {
        dt__cli_err("dtrain train: the --powersgd-* options need --comm-hook powersgd (the hook is %s)\n",
                    dt_comm_hook_name(r->hook));
        return 2;
    }
    if (r->hook == DT_COMM_HOOK_ALLREDUCE)
        return 0;
    if (r->stage > 0) {
        dt__cli_err("dtrain train: --comm-hook %s (or AIAK_*_COMPRESSION) compresses DDP's gradient all-reduce; "
                    "ZeRO stage %d (--zero/--fsdp) reduce-scatters sharded gradients instead, which %s; drop "
                    "one of the two\n",
                    dt_comm_hook_name(r->hook), r->stage,
                    r->hook == DT_COMM_HOOK_POWERSGD ? "PowerSGD's low-rank all-reduce cannot do"
                                                     : "this hook does not apply to");
        return 2;
    }
    const char *want = r->hook == DT_COMM_HOOK_FP16 ? "fp16" : r->hook == DT_COMM_HOOK_BF16 ? "bf16" : "fp32";
    if (o->reduce_dtype && strcmp(o->reduce_dtype, want)) {
        dt__cli_err("dtrain train: --comm-hook %s reduces in %s; --reduce-dtype %s contradicts it (drop one)\n",
                    dt_comm_hook_name(r->hook), want, o->reduce_dtype);
        return 2;
    }
    if (ws <= 1)
        fprintf(stderr, "dtrain train: note: --comm-hook %s has no effect on one rank (nothing is reduced)\n",
                dt_comm_hook_name(r->hook));
    return 0;
}

int dt__ddp_hook_precision(const dt__ddp_run *r, dt_precision_policy *p)
{
    if (!r->pg || r->stage > 0 || r->hook == DT_COMM_HOOK_ALLREDUCE)
        return 0;
    p->reduce_dtype = r->hook == DT_COMM_HOOK_FP16 ? DT_F16 : r->hook == DT_COMM_HOOK_BF16 ? DT_BF16 : DT_F32;
    return 0;
}

int dt__ddp_setup(dt__ddp_run *r, const dt__train_opts *o)
{
    memset(r, 0, sizeof *r);
    r->world = 1;
    r->sync_bn = o->sync_bn;
    r->bucket_mb = o->bucket_mb;
    r->zp = dt_zero_params_default();
    if (o->zero)
        r->stage = o->zero[0] - '0';
    if (o->fsdp) {
        dt_fsdp_sharding sh = DT_FSDP_NO_SHARD;
        dt_fsdp_sharding_parse(o->fsdp, &sh);
        r->stage = sh == DT_FSDP_FULL_SHARD || sh == DT_FSDP_HYBRID_SHARD ? 3 : sh == DT_FSDP_SHARD_GRAD_OP ? 2 : 0;
        r->hybrid = sh == DT_FSDP_HYBRID_SHARD;
    }
    r->zp.stage = r->stage > 0 ? r->stage : 3;
    r->zp.wrap_min_params = (size_t)o->wrap_min_params;
    dt_prefetch_parse(o->backward_prefetch, &r->zp.backward_prefetch);
    r->zp.forward_prefetch = o->forward_prefetch;
    r->zp.init_seed = o->seed;
    r->zp.init_rng = !strcmp(o->rng, "torch") ? DT_INIT_TORCH : DT_INIT_PHILOX;
    if (o->cfg) { /* zero_optimization's knobs (the stage is o->zero already) */
        int unused = -1;
        dt_config_zero_params(o->cfg, &unused, &r->zp);
        r->zp.stage = r->stage > 0 ? r->stage : 3;
    }
    if (o->offload_param) /* the command line over the config's offload_param (checked by the parser) */
        dt_offload_parse(o->offload_param, &r->zp.offload_param);
    /* Hierarchical reductions: AIAK's switch overrides the flag, which
     * overrides the config (environment > command line > file) */
    int64_t aiak;
    if (dt_env_int("AIAK_HIERARCHICAL_ALLREDUCE", -1, 0, 1, &aiak) < 0) {
        dt__cli_err("dtrain train: %s (1 = on, 0 = off)\n", dt_last_error());
        return 2;
    }
    r->hier = aiak >= 0 ? aiak == 1 : o->hierarchical_allreduce || r->zp.hierarchical;
    r->zp.hierarchical = r->hier;
    /* A group of one is not worth a backend; the environment tells us the
     * size before anything is created, read by the library's strict parser
     * (a malformed WORLD_SIZE is bad input, not a run alone). */
    int ws;
    if (dt_pg_env_world_size(&ws) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    if (o->tp > 1 && ws % o->tp) {
        dt__cli_err("dtrain train: --tp %lld needs a multiple of %lld ranks (start them with dtrain run -n N); "
                    "this job has %d\n", (long long)o->tp, (long long)o->tp, ws);
        return 2;
    }
    if (o->pp > 1 && ws % o->pp) {
        dt__cli_err("dtrain train: --pp %lld needs a multiple of %lld ranks (start them with dtrain run -n N); "
                    "this job has %d\n", (long long)o->pp, (long long)o->pp, ws);
        return 2;
    }
    int64_t per = (o->tp > 1 ? o->tp : 1) * (o->pp > 1 ? o->pp : 1);
    if (ws % per) {
        dt__cli_err("dtrain train: --tp %lld x --pp %lld (%lld ranks per replica) does not divide this job's %d "
                    "ranks\n", (long long)(o->tp > 1 ? o->tp : 1), (long long)(o->pp > 1 ? o->pp : 1),
                    (long long)per, ws);
        return 2;
    }
    if (o->dp && o->dp * per != ws) {
        dt__cli_err("dtrain train: --dp %lld x --tp %lld x --pp %lld is %lld ranks; this job has %d (start them with "
                    "dtrain run -n N)\n", (long long)o->dp, (long long)(o->tp > 1 ? o->tp : 1),
                    (long long)(o->pp > 1 ? o->pp : 1), (long long)(o->dp * per), ws);
        return 2;
    }
    int rc = resolve_hook(r, o, ws);
    if (rc)
        return rc;
    if (ws <= 1 && r->stage == 0)
        return 0;
    dt_pg_params pp = dt_pg_params_default();
    if (ws <= 1) { /* ZeRO on one rank: a group of one */
        pp.rank = 0;
        pp.world_size = 1;
        pp.backend = "self";
    }
    dt_flight_set_dir(o->save); /* a failing group writes its flight recorder there */
    dt_status st = dt_pg_init(&pp, &r->pg);
    if (st < 0) {
        dt__cli_err("dtrain train: process group: %s\n", dt_last_error());
        /* a bad DT_* variable or backend name is bad input, and so is a
         * foreign job at the rendezvous (refused); a peer that never came,
         * a timeout or no memory is a runtime failure */
        return st == DT_ERR_INVALID_ARG || st == DT_ERR_NOT_FOUND || st == DT_ERR_RANGE || st == DT_ERR_MISMATCH ? 2
                                                                                                              : 1;
    }
    r->rank = dt_pg_rank(r->pg);
    r->world = dt_pg_size(r->pg);
    r->tp = 1;
    r->pp = 1;
    if (o->pp > 1) { /* one dp x tp x pp mesh: the pipe strategy takes its pipelines and replicas */
        r->world_pg = r->pg;
        r->pg = NULL;
        r->pp = (int)o->pp;
        r->tp = o->tp > 1 ? (int)o->tp : 1;
        if ((st = dt_pipe_mesh_init(r->world_pg, r->tp, r->pp, &r->mesh)) < 0) {
            dt__cli_err("dtrain train: --pp: %s\n", dt_last_error());
            return 1;
        }
        r->rank = dt_mesh_coord(r->mesh, 0);
        r->world = dt_mesh_size(r->mesh, 0);
        r->tp_rank = dt_mesh_coord(r->mesh, 1);
        r->tp_pg = r->tp > 1 ? dt_mesh_dim_group(r->mesh, 1) : NULL; /* the model's slices */
        r->pp_rank = dt_mesh_coord(r->mesh, 2);
        r->pp_sched = o->pp_schedule ? o->pp_schedule : "1f1b";
        r->pp_balance = !o->pp_balance || !strcmp(o->pp_balance, "compute") ? DT_PIPE_BY_COMPUTE
                        : !strcmp(o->pp_balance, "params")                  ? DT_PIPE_BY_PARAMS
                                                                            : DT_PIPE_BY_TIME;
        r->pp_micro = o->micro_batches ? (int)o->micro_batches : 4;
        return 0;
    }
    if (o->tp > 1) { /* Megatron's order: tp ranks adjacent, data parallel across the groups */
        if (r->world % o->tp) {
            dt__cli_err("dtrain train: --tp %lld does not divide the %d ranks\n", (long long)o->tp, r->world);
            return 2;
        }
        r->world_pg = r->pg;
        r->pg = NULL;
        if ((st = dt_tp_groups(r->world_pg, (int)o->tp, &r->tp_pg, &r->dp_pg)) < 0) {
            dt__cli_err("dtrain train: --tp: %s\n", dt_last_error());
            return 1;
        }
        r->tp = (int)o->tp;
        r->tp_rank = dt_pg_rank(r->tp_pg);
        r->rank = dt_pg_rank(r->dp_pg);
        r->world = dt_pg_size(r->dp_pg);
        if (r->world > 1)
            r->pg = r->dp_pg;
    }
    return 0;
}

/* Say once (rank 0) what --hierarchical-allreduce found: the nodes. */
static int say_hierarchy(const dt__ddp_run *r)
{
    dt_pg_topo t;
    if (dt_pg_topology(r->pg, &t) < 0) {
        dt__cli_err("dtrain train: --hierarchical-allreduce: %s\n", dt_last_error());
        return 1;
    }
    if (r->rank == 0) {
        if (t.nnodes > 1 && t.nnodes < r->world)
            printf("hierarchical all-reduce: %d nodes%s%s, %d ranks on this one\n", t.nnodes,
                   t.homogeneous ? "" : " of unequal size", t.simulated ? " (simulated: DT_SIM_LOCAL_SIZE)" : "",
                   t.local_size);
        else
            printf("hierarchical all-reduce: %s: reductions stay flat\n",
                   t.nnodes == 1 ? "all ranks on one node" : "one rank per node");
    }
    return 0;
}

int dt__ddp_wrap(dt__ddp_run *r, dt_model *m)
{
    if (r->pp > 1) {
        dt_pipe_params pp = dt_pipe_params_default();
        pp.pp = r->pp;
        pp.micro_batches = r->pp_micro;
        pp.mesh = r->mesh;
        pp.zero = r->stage; /* 0 or 1 (train_args.c refuses the others) */
        pp.balance = r->pp_balance;
        pp.sample = r->pp_sample;
        pp.init_rng = r->zp.init_rng; /* a meta model (dt__ddp_lazy_model): --rng and --seed */
        pp.init_seed = r->zp.init_seed;
        if (dt_pipe_kind_parse(r->pp_sched, &pp.schedule) < 0 ||
            dt_strategy_pipe_init(r->world_pg, &pp, &r->strategy) < 0) {
            dt__cli_err("dtrain train: --pp: %s\n", dt_last_error());
            return 1;
        }
        return 0;
    }
    if (r->pg && r->hier && r->world > 1 && say_hierarchy(r))
        return 1;
    if (!r->pg) {
        if (dt_strategy_none_init(&r->strategy) < 0) {
            dt__cli_err("dtrain train: %s\n", dt_last_error());
            return 1;
        }
        return 0;
    }
    if (r->stage > 0) {
        if (r->hybrid) /* shard within this machine's ranks, replicate across machines */
            r->zp.hybrid_shard_size = dt_pg_local_size(r->pg);
        if (dt_strategy_zero_init(r->pg, &r->zp, &r->strategy) < 0) {
            dt__cli_err("dtrain train: ZeRO stage %d: %s\n", r->stage, dt_last_error());
            return 1;
        }
        return 0;
    }
    if (r->sync_bn && dt_syncbn_convert(m, r->pg, &r->nconverted) < 0) {
        dt__cli_err("dtrain train: --sync-bn: %s\n", dt_last_error());
        return 1;
    }
    dt_ddp_params p = dt_ddp_params_default();
    p.hierarchical = r->hier;
    if (r->bucket_mb > 0) { /* PyTorch's first bucket is 1 MiB; a smaller cap shrinks it too */
        p.bucket_cap_mb = r->bucket_mb;
        if (p.first_bucket_mb > r->bucket_mb)
            p.first_bucket_mb = r->bucket_mb;
    }
    p.comm_hook = r->hook;
    p.powersgd = r->psgd;
    if (dt_strategy_ddp_init(r->pg, &p, &r->strategy) < 0) {
        dt__cli_err("dtrain train: DDP: %s\n", dt_last_error());
        return 1;
    }
    return 0;
}

dt_strategy *dt__ddp_take_strategy(dt__ddp_run *r)
{
    dt_strategy *s = r->strategy;
    r->strategy = NULL;
    r->used = s;
    return s;
}

dt_status dt__ddp_train_sampler(const dt__ddp_run *r, int64_t n, uint64_t seed, dt_shuffle_rng rng,
                                dt_sampler **out)
{
    if (r->world <= 1)
        return dt_sampler_random_init_rng(n, seed, rng, out);
    dt_distributed_sampler_params p = dt_distributed_sampler_params_default();
    p.length = n;
    p.world_size = r->world;
    p.rank = r->rank;
    p.shuffle = true;
    p.seed = seed;
    p.drop_last = false;
    p.rng = rng;
    return dt_sampler_distributed_init(&p, out);
}

void dt__ddp_eval_range(const dt__ddp_run *r, int64_t n, int64_t *lo, int64_t *hi)
{
    dt_eval_shard(n, r->rank, r->world, lo, hi);
}

bool dt__ddp_is_main(const dt__ddp_run *r) { return r->rank == 0 && r->tp_rank == 0 && r->pp_rank == 0; }

void dt__ddp_summary(const dt__ddp_run *r, int64_t steps, char *buf, size_t n)
{
    buf[0] = 0;
    dt_ddp *ddp = dt_strategy_ddp(r->used);
    if (!ddp)
        return;
    dt_ddp_stats s = dt_ddp_get_stats(ddp);
    double per = s.iterations ? 1e3 * s.wait_s / (double)s.iterations : 0;
    snprintf(buf, n,
             "DDP: %d ranks (%s), %d bucket%s, %s%llu gradient all-reduces: %llu posted during backward, "
             "%llu already done when backward ended; %.2f ms/step waiting for gradients (%lld steps)",
             r->world, dt_pg_backend(r->pg), dt_ddp_num_buckets(ddp), dt_ddp_num_buckets(ddp) == 1 ? "" : "s",
             r->nconverted ? "SyncBatchNorm, " : "", (unsigned long long)s.buckets_posted,
             (unsigned long long)s.posted_in_backward, (unsigned long long)s.done_in_backward, per,
             (long long)steps);
    size_t used = strlen(buf);
    if (r->hook != DT_COMM_HOOK_ALLREDUCE && used < n)
        used += (size_t)snprintf(buf + used, n - used, "; comm hook %s", dt_comm_hook_name(r->hook));
    uint64_t before = 0, after = 0;
    dt_powersgd_stats(dt_ddp_powersgd(ddp), &before, &after);
    if (r->hook == DT_COMM_HOOK_POWERSGD && used < n)
        snprintf(buf + used, n - used, " (rank %d from step %lld: %s%.1fx fewer elements all-reduced)", r->psgd.rank,
                 (long long)r->psgd.start_iter, after ? "" : "not started, ",
                 after ? (double)before / (double)after : 1.0);
}

/* --pp: each rank maps the flats and initialises only its stages (the
 * strategy, pipeline.h), unless the stages are balanced by time (every
 * rank times every unit on the whole model at attach) or tensor parallel
 * (a slice's values are not a range of a whole build's). */
bool dt__ddp_lazy_model(const dt__ddp_run *r)
{
    return r->stage == 3 || (r->pp > 1 && r->tp <= 1 && r->pp_balance != DT_PIPE_BY_TIME);
}

void dt__human_bytes(double b, char *buf, size_t n)
{
    if (b >= 1 << 30)
        snprintf(buf, n, "%.2f GiB", b / (1 << 30));
    else if (b >= 1 << 20)
        snprintf(buf, n, "%.2f MiB", b / (1 << 20));
    else if (b >= 1 << 10)
        snprintf(buf, n, "%.1f KiB", b / (1 << 10));
    else
        snprintf(buf, n, "%.0f B", b);
}

int dt__ddp_memory_report(const dt__ddp_run *r, const dt_trainer *tr)
{
    /* every rank of the world: --pp/--tp ranks hold their stages' or slices'
     * parameters, ZeRO ranks their shares, DDP replicas the whole model; one
     * process: nothing to compare */
    dt_pg *g = r->world_pg ? r->world_pg : r->pg;
    const int W = r->world_pg ? dt_pg_size(g) : r->world, me = r->world_pg ? dt_pg_rank(g) : r->rank;
    if (W <= 1 && r->stage == 0)
        return 0;
    enum { K = 6 };
    double *v = calloc((size_t)W * K, sizeof *v);
    if (!v) {
        dt__cli_err("dtrain train: out of memory\n");
        return 1;
    }
    dt_trainer_memory mem;
    if (dt_trainer_memory_get(tr, &mem) < 0) {
        free(v);
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 1;
    }
    double *mine = v + (size_t)me * K;
    mine[0] = (double)mem.param_bytes;
    mine[1] = (double)mem.grad_bytes;
    mine[2] = (double)mem.optim_bytes;
    mine[3] = (double)mem.master_bytes;
    mine[4] = (double)mem.gathered_peak;
    mine[5] = (double)mem.peak_rss;
    if (W > 1 && dt_metrics_allreduce(g, v, W * K, DT_REDUCE_SUM) < 0) {
        free(v);
        dt__cli_err("dtrain train: memory report: %s\n", dt_last_error());
        return 1;
    }
    dt_zero *z = dt_strategy_zero(r->used);
    if (me == 0 && r->pp > 1 && r->stage == 1)
        printf("ZeRO stage 1 on the data-parallel dimension: %d pipeline stages x %d replicas, each replica steps "
               "1/%d of its stages' parameters\n", r->pp, r->world, r->world);
    if (me == 0 && z) {
        dt_zero_stats zs = dt_zero_get_stats(z);
        printf("ZeRO stage %d: %d ranks, %d unit%s, backward prefetch %s%s; rank 0 reduced %.2f MiB of gradients, "
               "gathered %.2f MiB of parameters",
               r->stage, r->world, dt_zero_num_units(z), dt_zero_num_units(z) == 1 ? "" : "s",
               dt_prefetch_name(r->zp.backward_prefetch), r->zp.forward_prefetch ? ", forward prefetch" : "",
               (double)zs.bytes_reduced / (1 << 20), (double)zs.bytes_gathered / (1 << 20));
        if (r->stage == 3)
            printf(" (%llu unit all-gathers, %llu prefetched, %llu of them complete when needed)",
                   (unsigned long long)zs.gathers, (unsigned long long)zs.prefetched,
                   (unsigned long long)zs.ready_when_needed);
        printf("\n");
        dt_nvme_store *ps = dt_zero_param_store(z);
        if (ps) {
            dt_nvme_stats ns;
            dt_nvme_store_stats(ps, &ns);
            printf("offload: parameter shards in %s (%s I/O), %d buffers; rank 0 read %.1f MiB, wrote %.1f MiB, "
                   "%.2f s waiting for I/O\n", dt_nvme_store_dir(ps), dt_offload_io_name(dt_nvme_store_io(ps)),
                   r->zp.offload_param.buffer_count, ns.bytes_read / 1048576.0, ns.bytes_written / 1048576.0,
                   ns.wait_s);
        }
    }
    if (me == 0) {
        for (int k = 0; k < W; k++) {
            char b[K][32];
            for (int i = 0; i < K; i++)
                dt__human_bytes(v[(size_t)k * K + (size_t)i], b[i], sizeof b[i]);
            printf("memory rank %d: parameters %s, gradients %s, optimizer states %s, master weights %s, "
                   "peak gathered %s, peak RSS %s\n",
                   k, b[0], b[1], b[2], b[3], b[4], b[5]);
        }
    }
    free(v);
    return 0;
}

void dt__ddp_free_ddp(dt__ddp_run *r)
{
    dt_strategy_free(r->strategy); /* only when no trainer took it */
    r->strategy = NULL;
}

void dt__ddp_free_group(dt__ddp_run *r)
{
    if (r->world_pg) { /* --tp: pg is dp_pg's alias; subgroups before their parent */
        if (r->mesh) { /* --pp: the mesh owns tp_pg */
            dt_mesh_free(r->mesh);
            r->mesh = NULL;
            r->tp_pg = NULL;
        }
        dt_pg_free(r->tp_pg);
        dt_pg_free(r->dp_pg);
        dt_pg_free(r->world_pg);
        r->tp_pg = r->dp_pg = r->world_pg = NULL;
    } else {
        dt_pg_free(r->pg);
    }
    r->pg = NULL;
}
