/* dtrain bench ddp — DDP step time with and without gradient communication.
 *
 *     dtrain run -n 2 -- dtrain bench ddp [--model convnet] [--batch 100]
 *                         [--steps 40] [--sync-bn] [--bucket-mb X]
 *                         [--no-broadcast-buffers] [--json]
 *     dtrain bench ddp --threads 1 ...      # world size 1: the single-rank baseline
 *
 * Each rank trains the model on a fixed synthetic batch (the per-rank batch)
 * with SGD, through the library's trainer (train.h): one dt_trainer with the
 * "ddp" strategy and one with "none" over the same model. Under a launcher
 * it cycles blocks of 5 steps through four modes (every block starts on all
 * ranks together, after an untimed barrier) so that machine noise hits all
 * of them alike:
 *   ddp     the full DDP step as `dtrain train` runs it: forward (buffer
 *           broadcast), backward with the bucket all-reduces posted from
 *           grad-ready hooks, wait, the trainer's loss/stop agreement, update;
 *   nocomm  the same compute with DDP's no_sync on and no collective at all
 *           (the "none" trainer; what the step costs without communication);
 *   local   the plain single-rank step (the "none" trainer; DDP's hooks
 *           silent), run on every rank at once: "a single rank's step"
 *           under the same machine load as the DDP step;
 *   alone   the same plain step on rank 0 while the other ranks idle (what
 *           one process gets from an otherwise idle machine).
 * DDP overhead = ddp / local - 1 (and ddp / alone - 1). The sync floor is
 * the median over steps of the slower rank's local step of the same index:
 * the part of the overhead that is waiting for the slower rank on a noisy
 * machine, however cheap the communication. At world size 1 it times the
 * plain single-process step. Rank 0
 * prints the median step time of each mode (the slowest rank's median), the
 * wait per step, and the overlap counters. */
#include "cmd.h"

#include "dtrain/autograd.h"
#include "dtrain/models.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MODE_DDP, MODE_NOCOMM, MODE_LOCAL, MODE_ALONE, NMODES };

int dt_bench_ddp(int argc, char **argv)
{
    const char *model = "convnet";
    int64_t batch = 100;
    int steps = 40, threads = 0;
    bool sync_bn = false, json = false, no_bcast = false;
    double bucket_mb = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: dtrain run -n N -- dtrain bench ddp [--model convnet] [--batch 100] [--steps 40]\n"
                   "         [--threads T] [--bucket-mb MB] [--sync-bn] [--no-broadcast-buffers] [--json]\n"
                   "  DDP step time with and without gradient communication (alone: world size 1)\n");
            return 0;
        } else if (!strcmp(a, "--model") && v)
            model = v, i++;
        else if ((!strcmp(a, "--batch") || !strcmp(a, "--steps") || !strcmp(a, "--threads")) && v) {
            int64_t x; /* --threads 0: all cores */
            if (dt__bench_int("dtrain bench ddp", a, v, !strcmp(a, "--threads") ? 0 : !strcmp(a, "--steps") ? 2 : 1,
                              !strcmp(a, "--threads") ? 4096 : 1 << 30, &x))
                return 2;
            if (!strcmp(a, "--batch"))
                batch = x;
            else
                *(!strcmp(a, "--steps") ? &steps : &threads) = (int)x;
            i++;
        } else if (!strcmp(a, "--bucket-mb") && v) {
            if (dt__bench_double("dtrain bench ddp", a, v, 0, 4096, &bucket_mb))
                return 2;
            i++;
        } else if (!strcmp(a, "--sync-bn"))
            sync_bn = true;
        else if (!strcmp(a, "--no-broadcast-buffers"))
            no_bcast = true;
        else if (!strcmp(a, "--json"))
            json = true;
        else {
            dt__cli_err("dtrain bench ddp: unknown or incomplete option '%s' (--model, --batch, --steps, "
                            "--threads, --bucket-mb, --sync-bn, --no-broadcast-buffers, --json)\n", a);
            return 2;
        }
    }
    if (batch < 1 || steps < 2 || threads < 0) {
        dt__cli_err("dtrain bench ddp: need --batch >= 1, --steps >= 2, --threads >= 0\n");
        return 2;
    }
    if (threads > 0)
        dt_set_num_threads(threads);
    int ws;
    if (dt_pg_env_world_size(&ws) < 0) {
        dt__cli_err("dtrain bench ddp: %s\n", dt_last_error());
        return 2;
    }
    const bool dist = ws > 1;
    dt_pg *pg = NULL;
    dt_ddp *ddp = NULL;
    int rc = 1, rank = 0, world = 1;
    if (dist) {
        if (dt_pg_init(NULL, &pg) < 0) {
            dt__cli_err("dtrain bench ddp: %s\n", dt_last_error());
            return 1;
        }
        rank = dt_pg_rank(pg);
        world = dt_pg_size(pg);
    }
    dt_model *m = NULL;
    dt_model_desc desc;
    dt_trainer *tr_ddp = NULL, *tr_local = NULL; /* DDP (world > 1) and plain, same model */
    float *x = NULL;
    int64_t *y = NULL;
    double *tm[NMODES] = {calloc((size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double)),
                          calloc(2 * (size_t)steps, sizeof(double)), calloc((size_t)steps, sizeof(double))};
    if (dt_model_create(model, 0, NULL, &m, &desc) < 0 || !tm[0] || !tm[1] || !tm[2] || !tm[3])
        goto fail;
    int ndim, tnd;
    int64_t shape[DT_MAX_DIMS], tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&desc, batch, &ndim, shape, &tnd, tshape, &tdt) < 0)
        goto fail;
    int64_t xn = 1;
    for (int d = 0; d < ndim; d++)
        xn *= shape[d];
    x = dt_alloc((size_t)xn * sizeof(float));
    y = dt_alloc((size_t)batch * sizeof(int64_t));
    if (!x || !y)
        goto fail;
    dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, (uint64_t)rank, 0), 0, x, (size_t)xn, 0.0f, 1.0f);
    for (int64_t i = 0; i < batch; i++)
        y[i] = (i * 7 + rank) % 10;
    dt_trainer_params tp = dt_trainer_params_default();
    tp.sgd.lr = 0.01;
    tp.sgd.momentum = 0.9;
    tp.loss_fn = dt_model_desc_loss_fn; /* the zoo model's own loss */
    tp.loss_ud = &desc;
    dt_strategy *strat = NULL;
    if (dist) {
        if (sync_bn && dt_syncbn_convert(m, pg, NULL) < 0)
            goto fail;
        dt_ddp_params p = dt_ddp_params_default();
        p.broadcast_buffers = !no_bcast;
        if (bucket_mb > 0) {
            p.bucket_cap_mb = bucket_mb;
            if (p.first_bucket_mb > bucket_mb)
                p.first_bucket_mb = bucket_mb;
        }
        if (dt_strategy_ddp_init(pg, &p, &strat) < 0 || dt_trainer_init(m, strat, &tp, &tr_ddp) < 0)
            goto fail;
        ddp = dt_strategy_ddp(dt_trainer_strategy(tr_ddp));
    }
    if (dt_strategy_none_init(&strat) < 0 || dt_trainer_init(m, strat, &tp, &tr_local) < 0)
        goto fail;
    dt_trainer_batch tb = dt_trainer_batch_make(x, DT_F32, ndim, shape, tnd ? y : NULL, tdt, tnd, tshape);

    /* warm-up (arena growth, oneDNN primitive creation), then blocks of 5
     * steps cycling ddp / nocomm / local, each block started together on
     * every rank (an untimed barrier), so that machine noise hits all three
     * alike */
    int cnt[NMODES] = {0};
    const int warm = 3, block = 5, nmodes = dist ? NMODES : 1;
    dt_ddp_stats s0 = {0};
    for (int it = 0;; it++) {
        const bool warming = it < warm;
        const int mode = warming ? 0 : ((it - warm) / block) % nmodes;
        bool all = true;
        for (int k = 0; k < nmodes; k++)
            all = all && cnt[k] >= steps;
        if (all)
            break;
        if (!warming && cnt[mode] >= steps)
            continue;
        if (ddp)
            dt_ddp_set_no_sync(ddp, mode != MODE_DDP);
        if (it == warm && ddp) {
            dt_ddp_reset_stats(ddp);
            s0 = dt_ddp_get_stats(ddp);
        }
        if (pg && !warming && (it - warm) % block == 0 && dt_pg_barrier(pg) < 0)
            goto fail;
        if (mode == MODE_ALONE && rank != 0) { /* idle: rank 0 runs this block alone */
            tm[mode][cnt[mode]++] = 0;
            continue;
        }
        double t = dt_time_s();
        if (dt_trainer_step(ddp && mode == MODE_DDP ? tr_ddp : tr_local, &tb, 1, NULL) < 0)
            goto fail;
        t = dt_time_s() - t;
        if (!warming)
            tm[mode][cnt[mode]++] = t;
    }
    /* The synchronisation floor: local steps of the same index, max over
     * ranks, median over steps: what a synchronous step with free
     * communication would cost on this machine (every step waits for the
     * slower rank), against the local median (each rank at its own pace). */
    double floor_ms = 0;
    if (pg) {
        double *lmax = tm[2] + steps; /* second half of the local array (allocated 2x) */
        memcpy(lmax, tm[2], (size_t)cnt[2] * sizeof(double));
        if (dt_pg_allreduce(pg, DT_IN_PLACE, lmax, (size_t)cnt[2], DT_F64, DT_REDUCE_MAX) < 0)
            goto fail;
        floor_ms = 1e3 * dt__bench_median(lmax, cnt[2]);
    }
    double med[NMODES] = {dt__bench_median(tm[0], cnt[0]), dist ? dt__bench_median(tm[1], cnt[1]) : 0,
                          dist ? dt__bench_median(tm[2], cnt[2]) : 0, dist ? dt__bench_median(tm[3], cnt[3]) : 0};
    if (pg && dt_metrics_allreduce(pg, med, NMODES, DT_REDUCE_MAX) < 0)
        goto fail;
    dt_ddp_stats st = ddp ? dt_ddp_get_stats(ddp) : s0;
    double wait_ms = st.iterations ? 1e3 * st.wait_s / (double)st.iterations : 0;
    if (rank == 0) {
        const double over = med[2] > 0 ? 100 * (med[0] / med[2] - 1) : 0;
        const double over_alone = med[3] > 0 ? 100 * (med[0] / med[3] - 1) : 0;
        const double comm = med[1] > 0 ? 100 * (med[0] / med[1] - 1) : 0;
        const double fl = med[2] > 0 ? 100 * (floor_ms / (1e3 * med[2]) - 1) : 0;
        if (json)
            printf("{\"bench\":\"ddp\",\"model\":\"%s\",\"batch\":%lld,\"world\":%d,\"threads\":%d,"
                   "\"step_ms\":%.3f,\"nocomm_step_ms\":%.3f,\"local_step_ms\":%.3f,\"alone_step_ms\":%.3f,"
                   "\"sync_floor_ms\":%.3f,\"overhead_pct\":%.2f,\"overhead_alone_pct\":%.2f,"
                   "\"wait_ms\":%.3f,\"buckets\":%d,\"posted_in_backward\":%llu,\"done_in_backward\":%llu,"
                   "\"iterations\":%llu}\n",
                   model, (long long)batch, world, dt_get_num_threads(), 1e3 * med[0], 1e3 * med[1], 1e3 * med[2],
                   1e3 * med[3], floor_ms, over, over_alone, wait_ms, ddp ? dt_ddp_num_buckets(ddp) : 0,
                   (unsigned long long)st.posted_in_backward, (unsigned long long)st.done_in_backward,
                   (unsigned long long)st.iterations);
        else if (!dist)
            printf("%s, batch %lld, 1 process, %d threads: %.2f ms/step (median of %d)\n", model,
                   (long long)batch, dt_get_num_threads(), 1e3 * med[0], cnt[0]);
        else
            printf("%s, batch %lld per rank, %d ranks (%s), %d threads each%s; medians of %d steps, slowest rank:\n"
                   "  ddp step     %.2f ms\n"
                   "  local step   %.2f ms  the plain single-rank step (no DDP), every rank at once\n"
                   "  alone        %.2f ms  the same on rank 0 while the other ranks idle\n"
                   "  no comm      %.2f ms  the DDP step under no_sync (no gradient communication)\n"
                   "  sync floor   %.2f ms  local steps of the same index, slower rank (%+.1f%% over local):\n"
                   "                        what waiting for the slower rank alone costs\n"
                   "  DDP overhead %+.1f%% over the local step, %+.1f%% over alone; communication %+.1f%% over "
                   "no comm\n"
                   "  wait for gradients %.2f ms/step; %d bucket%s; %llu all-reduces, %llu posted during "
                   "backward, %llu done before it ended\n",
                   model, (long long)batch, world, dt_pg_backend(pg), dt_get_num_threads(),
                   sync_bn ? ", SyncBatchNorm" : "", cnt[0], 1e3 * med[0], 1e3 * med[2], 1e3 * med[3], 1e3 * med[1],
                   floor_ms, fl, over, over_alone, comm, wait_ms, dt_ddp_num_buckets(ddp),
                   dt_ddp_num_buckets(ddp) == 1 ? "" : "s",
                   (unsigned long long)st.iterations * (unsigned long long)dt_ddp_num_buckets(ddp),
                   (unsigned long long)st.posted_in_backward, (unsigned long long)st.done_in_backward);
    }
    rc = 0;
fail:
    if (rc)
        dt__cli_err("dtrain bench ddp: %s\n", dt_last_error());
    dt_trainer_free(tr_local);
    dt_trainer_free(tr_ddp); /* frees the DDP handle */
    dt_free(x);
    dt_free(y);
    for (int k = 0; k < NMODES; k++)
        free(tm[k]);
    dt_model_free(m);
    dt_pg_free(pg);
    return rc;
}
