/* What `dtrain train` prints about its layout (train_ddp.h): the nodes a
 * hierarchical reduction found, DDP's summary line, the memory each rank
 * holds. */
#include "cmd.h"
#include "train.h"
#include "train_ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Say once (rank 0) what --hierarchical-allreduce found: the nodes. */
int dt__ddp_say_hierarchy(const dt__ddp_run *r)
{
    dt_pg_topo t;
    dt_status st = dt_pg_topology(r->pg, &t);
    if (st < 0) { /* a bad DT_SIM_LOCAL_SIZE is bad input; a failed exchange is not */
        dt__cli_err("dtrain train: --hierarchical-allreduce: %s\n", dt_last_error());
        return st == DT_ERR_INVALID_ARG ? 2 : 1;
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
             dt__ddp_reduce_size(r), dt_pg_backend(r->pg), dt_ddp_num_buckets(ddp), dt_ddp_num_buckets(ddp) == 1 ? "" : "s",
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
    dt_trainer_memory mem;
    if (dt_trainer_memory_get(tr, &mem) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 1;
    }
    /* one process: only a run with frozen parameters (what they do not cost is the point) */
    if (W <= 1 && r->stage == 0 && mem.frozen_bytes == 0)
        return 0;
    enum { K = 7 };
    double *v = calloc((size_t)W * K, sizeof *v);
    if (!v) {
        dt__cli_err("dtrain train: out of memory\n");
        return 1;
    }
    double *mine = v + (size_t)me * K;
    mine[0] = (double)mem.param_bytes;
    mine[1] = (double)mem.grad_bytes;
    mine[2] = (double)mem.optim_bytes;
    mine[3] = (double)mem.master_bytes;
    mine[4] = (double)mem.gathered_peak;
    mine[5] = (double)mem.peak_rss;
    mine[6] = (double)mem.frozen_bytes;
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
               r->stage, dt__ddp_reduce_size(r), dt_zero_num_units(z), dt_zero_num_units(z) == 1 ? "" : "s",
               dt_prefetch_name(r->zp.backward_prefetch), r->zp.forward_prefetch ? ", forward prefetch" : "",
               (double)zs.bytes_reduced / (1 << 20), (double)zs.bytes_gathered / (1 << 20));
        if (r->stage == 3)
            printf(" (%llu unit all-gathers, %llu prefetched, %llu of them complete when needed)",
                   (unsigned long long)zs.gathers, (unsigned long long)zs.prefetched,
                   (unsigned long long)zs.ready_when_needed);
        printf("\n");
        if (r->zp.quantized_weights || r->zp.quantized_gradients || r->zp.hpz_partition_size > 1)
            printf("ZeRO++: qwZ %s, qgZ %s, hpZ %d: rank 0 ran %llu int8 all-gathers (blocks of %lld), %llu "
                   "backward all-gathers within its hpZ group, %llu int%d reduce-scatters (blocks of %lld); secondary "
                   "shards held "
                   "at most %.2f MiB\n",
                   r->zp.quantized_weights ? "on" : "off", r->zp.quantized_gradients ? "on" : "off",
                   r->zp.hpz_partition_size, (unsigned long long)zs.gathers_quantized, (long long)r->zp.quant_block,
                   (unsigned long long)zs.gathers_secondary, (unsigned long long)zs.reduces_quantized,
                   r->zp.quant_grad_bits, (long long)r->zp.quant_grad_block, (double)zs.secondary_peak / (1 << 20));
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
            char fz[96] = "";
            if (v[(size_t)k * K + 6] > 0) /* frozen: held, but no gradients, optimizer states or masters */
                snprintf(fz, sizeof fz, " + frozen %s (no gradients, optimizer states or masters)", b[6]);
            printf("memory rank %d: parameters %s%s, gradients %s, optimizer states %s, master weights %s, "
                   "peak gathered %s, peak RSS %s\n",
                   k, b[0], fz, b[1], b[2], b[3], b[4], b[5]);
        }
    }
    free(v);
    return 0;
}
