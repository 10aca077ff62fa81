/* dtrain bench data — throughput of the data pipeline alone: open the set
 * (read + gunzip + parse), then iterate epochs through the prefetching
 * loader. With --compute-ms the consumer spins that long per batch, like a
 * training step, and the figure that matters is the time it still waits in
 * dt_loader_next (zero when prefetching hides the loading). */
#include "cmd.h"

#include "dtrain/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain bench data [--data SPEC] [--batch 100] [--epochs 3] [--prefetch 2] "
               "[--sync] [--compute-ms X] [--json]\n"
               "  data loader throughput: open SPEC (fashion-mnist, mnist:DIR, idx:DIR), then\n"
               "  iterate epochs through the prefetching loader; --compute-ms spins that long per\n"
               "  batch like a training step (the figure that matters is the wait left)\n");
}

int dt_bench_data(int argc, char **argv)
{
    const char *spec = "fashion-mnist";
    long batch = 100, epochs = 3, prefetch = 2;
    double compute_ms = 0;
    bool json = false, sync = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--sync"))
            sync = true;
        else if (v && !strcmp(a, "--data"))
            spec = argv[++i];
        else if (v && (!strcmp(a, "--batch") || !strcmp(a, "--epochs") || !strcmp(a, "--prefetch"))) {
            int64_t x;
            if (dt__bench_int("dtrain bench data", a, argv[++i], 1, !strcmp(a, "--prefetch") ? 64 : 1 << 30, &x))
                return 2;
            *(!strcmp(a, "--batch") ? &batch : !strcmp(a, "--epochs") ? &epochs : &prefetch) = (long)x;
        } else if (v && !strcmp(a, "--compute-ms")) {
            if (dt__bench_double("dtrain bench data", a, argv[++i], 0, 1e6, &compute_ms))
                return 2;
        } else {
            dt__cli_err("dtrain bench data: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (batch < 1 || epochs < 1 || prefetch < 1 || prefetch > 64 || compute_ms < 0) {
        dt__cli_err("dtrain bench data: batch, epochs >= 1, prefetch 1..64, compute-ms >= 0\n");
        return 2;
    }
    double t0 = dt_time_s();
    dt_dataset *ds = NULL;
    if (dt_dataset_open_spec(spec, DT_SPLIT_TRAIN, &ds) < 0) {
        dt__cli_err("dtrain bench data: --data %s: %s\n", spec, dt_last_error());
        return 2;
    }
    double open_s = dt_time_s() - t0;
    dt_sampler *s = NULL;
    dt_loader *ld = NULL;
    dt_loader_params lp = dt_loader_params_default();
    lp.batch_size = batch;
    lp.prefetch = (int)prefetch;
    lp.background = !sync;
    int rc = 0;
    if (dt_sampler_random_init(dt_dataset_length(ds), 0, &s) < 0 || dt_loader_init(ds, s, &lp, &ld) < 0) {
        dt__cli_err("dtrain bench data: %s\n", dt_last_error());
        rc = 1;
        goto out;
    }
    double best = 1e30, best_wait = 0;
    int64_t nb = dt_loader_num_batches(ld), n = dt_dataset_length(ds);
    for (long e = 0; e < epochs; e++) {
        double wait = 0, te = dt_time_s();
        const dt_batch *b;
        dt_status st = dt_loader_start_epoch(ld, e);
        for (;;) {
            double w0 = dt_time_s();
            st = dt_loader_next(ld, &b);
            wait += dt_time_s() - w0;
            if (st < 0 || !b)
                break;
            for (double c0 = dt_time_s(); (dt_time_s() - c0) * 1e3 < compute_ms;)
                ; /* a stand-in for the training step */
        }
        if (st < 0) {
            dt__cli_err("dtrain bench data: %s\n", dt_last_error());
            rc = 1;
            goto out;
        }
        double el = dt_time_s() - te;
        if (el < best) {
            best = el;
            best_wait = wait;
        }
    }
    if (json)
        printf("{\"bench\":\"data\",\"data\":\"%s\",\"batch\":%ld,\"prefetch\":%ld,\"background\":%s,"
               "\"compute_ms\":%g,\"open_s\":%.4f,\"epoch_s\":%.4f,\"samples_per_s\":%.0f,"
               "\"wait_us_per_batch\":%.1f}\n",
               spec, batch, prefetch, sync ? "false" : "true", compute_ms, open_s, best,
               (double)n / best, 1e6 * best_wait / (double)nb);
    else
        printf("data %s: open %.3f s; best of %ld epochs: %.3f s, %.0f samples/s, %lld batches of %ld, "
               "waiting %.1f us per batch in dt_loader_next (%s, compute %.2f ms per batch)\n",
               spec, open_s, epochs, best, (double)n / best, (long long)nb, batch,
               1e6 * best_wait / (double)nb, sync ? "synchronous" : "background thread", compute_ms);
out:
    dt_loader_free(ld);
    dt_sampler_free(s);
    dt_dataset_free(ds);
    return rc;
}
