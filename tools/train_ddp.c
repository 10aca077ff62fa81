/* The data-parallel side of `dtrain train` (see train_ddp.h).
 *
 * Batch sizes are per rank, as in PyTorch DDP: two ranks of --batch 100
 * take 200 samples per optimizer step and half as many steps per epoch.
 * The DistributedSampler pads the epoch by wrapping, so every rank runs the
 * same number of steps and no collective is left waiting at the end. */
#include "cmd.h"
#include "train_ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt__ddp_setup(dt__ddp_run *r, bool sync_bn, double bucket_mb)
{
    memset(r, 0, sizeof *r);
    r->world = 1;
    r->sync_bn = sync_bn;
    r->bucket_mb = bucket_mb;
    /* A group of one is not worth a backend; the environment tells us the
     * size before anything is created, read by the library's strict parser
     * (a malformed WORLD_SIZE is bad input, not a run alone). */
    int ws;
    if (dt_pg_env_world_size(&ws) < 0) {
        dt__cli_err("dtrain train: %s\n", dt_last_error());
        return 2;
    }
    if (ws <= 1)
        return 0;
    dt_status st = dt_pg_init(NULL, &r->pg);
    if (st < 0) {
        dt__cli_err("dtrain train: process group: %s\n", dt_last_error());
        return 1;
    }
    r->rank = dt_pg_rank(r->pg);
    r->world = dt_pg_size(r->pg);
    return 0;
}

int dt__ddp_wrap(dt__ddp_run *r, dt_model *m)
{
    if (!r->pg) {
        if (dt_strategy_none_init(&r->strategy) < 0) {
            dt__cli_err("dtrain train: %s\n", dt_last_error());
            return 1;
        }
        return 0;
    }
    if (r->sync_bn && dt_syncbn_convert(m, r->pg, &r->nconverted) < 0) {
        dt__cli_err("dtrain train: --sync-bn: %s\n", dt_last_error());
        return 1;
    }
    dt_ddp_params p = dt_ddp_params_default();
    if (r->bucket_mb > 0) { /* PyTorch's first bucket is 1 MiB; a smaller cap shrinks it too */
        p.bucket_cap_mb = r->bucket_mb;
        if (p.first_bucket_mb > r->bucket_mb)
            p.first_bucket_mb = r->bucket_mb;
    }
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
    if (!r->pg)
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

bool dt__ddp_is_main(const dt__ddp_run *r) { return r->rank == 0; }

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
}

void dt__ddp_free_ddp(dt__ddp_run *r)
{
    dt_strategy_free(r->strategy); /* only when no trainer took it */
    r->strategy = NULL;
}

void dt__ddp_free_group(dt__ddp_run *r)
{
    dt_pg_free(r->pg);
    r->pg = NULL;
}
