/* dtrain bench zero — ZeRO/FSDP stages against DDP, side by side.
 *
 *     dtrain run -n 2 -- dtrain bench zero [--model mlp] [--batch 4] [--seq 64]
 *                         [--steps 20] [--threads 1] [--wrap-min-params N]
 *                         [--wrap-module-type TYPE] [--mlp-dim N] [--mlp-hidden N]
 *                         [--modes ddp,1,1-ar,2,3,3-post,3-none,3-nopool] [--json]
 *
 * Every mode trains its own copy of the model (same seed, same fixed
 * synthetic batch per rank, AdamW) through the library's trainer: "ddp"
 * (dt_strategy_ddp_init), "1" and "2" (ZeRO stages 1 and 2), "1-ar" (stage 1
 * with reduce_scatter off: the whole gradients all-reduced), "3" (stage 3
 * with BACKWARD_PRE prefetch), "3-post" (BACKWARD_POST), "3-none" (no
 * prefetch) and "3-nopool" (BACKWARD_PRE, freed units' pages given back
 * instead of kept in the page pool). After 2 untimed steps per mode, blocks of 5 steps cycle
 * through the modes, each block started on every rank together (an untimed
 * barrier), so machine noise hits all modes alike. Rank 0 prints per mode:
 * the median step time (slowest rank), its ratio to DDP's, the median
 * process CPU time per step (every thread of the rank: compute, copies and
 * the collectives' progress; the slowest rank) and its ratio to DDP's (on a
 * loaded machine the steadier measure; with DT_SHM_SPIN_US=0 a wait sleeps
 * instead of spinning, so it counts work, not waiting), the model-state
 * bytes this rank holds and the peak of gathered parameters, and the
 * communication volume per step in units of Psi (the model's parameter
 * bytes), counted as DeepSpeed counts it: an all-reduce moves 2x its bytes,
 * a reduce-scatter or an all-gather 1x. The ZeRO paper's figures: 2 Psi for
 * DDP and stages 1-2, 3 Psi for stage 3. The last losses of all modes are
 * printed too: they train the same model on the same data. For stage 3
 * modes a line says how many unit all-gathers a step posts, how many a
 * prefetch posted ahead of the hook that needed them and how many of those
 * were complete by then (the gathers that overlapped compute), and how many
 * bytes a step gathered into pages the page pool kept (no page faults) and
 * the most it kept, also in units of the largest unit. */
#include "cmd.h"

#include "dtrain/models.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXMODES = 8, WARM = 2, BLOCK = 5 };

typedef struct {
    char name[16];
    int stage; /* 0: DDP */
    dt_backward_prefetch bp;
    bool nopool; /* stage 3 without the page pool */
    bool allreduce; /* stage 1 with reduce_scatter off: all-reduce the whole gradients */
    dt_model *m;
    dt_trainer *tr;
    double *t, *c; /* wall and CPU seconds per timed step */
    int n;
    double loss;
    uint64_t bytes0; /* collective volume counted before the timed steps */
    dt_zero_stats zs0; /* stage 3 gather counters before the timed steps */
} zmode;

/* Bytes moved so far, DeepSpeed's convention (see the top). */
static uint64_t volume(const zmode *z)
{
    dt_strategy *s = dt_trainer_strategy(z->tr);
    if (z->stage == 0) {
        dt_ddp *d = dt_strategy_ddp(s);
        return d ? 2 * dt_ddp_get_stats(d).bytes_reduced : 0;
    }
    dt_zero_stats st = dt_zero_get_stats(dt_strategy_zero(s));
    return (z->allreduce ? 2 : 1) * st.bytes_reduced + st.bytes_gathered;
}

static int parse_modes(const char *spec, zmode *zm, int *nm)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec);
    *nm = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*nm == MAXMODES) {
            dt__cli_err("dtrain bench zero: at most %d modes\n", MAXMODES);
            return 2;
        }
        zmode *z = &zm[(*nm)++];
        memset(z, 0, sizeof *z);
        snprintf(z->name, sizeof z->name, "%s", tok);
        z->bp = DT_PREFETCH_BACKWARD_PRE;
        if (!strcmp(tok, "ddp"))
            z->stage = 0;
        else if (!strcmp(tok, "1") || !strcmp(tok, "2") || !strcmp(tok, "3"))
            z->stage = tok[0] - '0';
        else if (!strcmp(tok, "1-ar"))
            z->stage = 1, z->allreduce = true;
        else if (!strcmp(tok, "3-post"))
            z->stage = 3, z->bp = DT_PREFETCH_BACKWARD_POST;
        else if (!strcmp(tok, "3-none"))
            z->stage = 3, z->bp = DT_PREFETCH_NONE;
        else if (!strcmp(tok, "3-nopool"))
            z->stage = 3, z->nopool = true;
        else {
            dt__cli_err("dtrain bench zero: unknown mode '%s' (ddp, 1, 1-ar, 2, 3, 3-post, 3-none, 3-nopool)\n", tok);
            return 2;
        }
    }
    return *nm ? 0 : (dt__cli_err("dtrain bench zero: --modes is empty\n"), 2);
}

int dt_bench_zero(int argc, char **argv)
{
    const char *model = "mlp", *modes = "ddp,1,2,3,3-post,3-none", *wrap_type = NULL;
    long batch = 4, seq = 64, steps = 20, threads = 1, wrap = 0, mlp_dim = 0, mlp_hidden = 0;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: dtrain run -n N -- dtrain bench zero [--model mlp] [--batch 4] [--seq 64] [--steps 20]\n"
                   "         [--threads 1] [--wrap-min-params N] [--wrap-module-type TYPE] [--mlp-dim N]\n"
                   "         [--mlp-hidden N]\n"
                   "         [--modes ddp,1,1-ar,2,3,3-post,3-none,3-nopool] [--json]\n"
                   "  ZeRO stages against DDP, interleaved: step time, bytes held, communication volume\n");
            return 0;
        }
        long *dst = !strcmp(a, "--batch")             ? &batch
                    : !strcmp(a, "--seq")             ? &seq
                    : !strcmp(a, "--steps")           ? &steps
                    : !strcmp(a, "--threads")         ? &threads
                    : !strcmp(a, "--wrap-min-params") ? &wrap
                    : !strcmp(a, "--mlp-dim")         ? &mlp_dim
                    : !strcmp(a, "--mlp-hidden")      ? &mlp_hidden
                                                      : NULL;
        if (dst && v) {
            char *end;
            *dst = strtol(v, &end, 10);
            if (*end || end == v) {
                dt__cli_err("dtrain bench zero: %s '%s' is not an integer\n", a, v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--model") && v)
            model = v, i++;
        else if (!strcmp(a, "--modes") && v)
            modes = v, i++;
        else if (!strcmp(a, "--wrap-module-type") && v)
            wrap_type = v, i++;
        else if (!strcmp(a, "--json"))
            json = true;
        else {
            dt__cli_err("dtrain bench zero: unknown or incomplete option '%s' (--model, --batch, --seq, --steps, "
                        "--threads, --wrap-min-params, --wrap-module-type, --mlp-dim, --mlp-hidden, --modes, "
                        "--json)\n", a);
            return 2;
        }
    }
    if (batch < 1 || seq < 1 || steps < BLOCK || threads < 1 || wrap < 0 || mlp_dim < 0 || mlp_hidden < 0) {
        dt__cli_err("dtrain bench zero: need --batch >= 1, --seq >= 1, --steps >= %d, --threads >= 1, "
                    "--wrap-min-params, --mlp-dim, --mlp-hidden >= 0\n", BLOCK);
        return 2;
    }
    zmode zm[MAXMODES];
    int nm = 0, rc = parse_modes(modes, zm, &nm);
    if (rc)
        return rc;
    dt_set_num_threads((int)threads);
    int ws;
    if (dt_pg_env_world_size(&ws) < 0 || ws < 2) {
        dt__cli_err("dtrain bench zero: %s\n",
                    ws < 2 ? "run it under a launcher with 2 or more ranks (dtrain run -n 2 -- ...)" : dt_last_error());
        return 2;
    }
    rc = 1;
    dt_pg *pg = NULL;
    void *x = NULL;
    int64_t *y = NULL;
    dt_model_desc desc;
    if (dt_pg_init(NULL, &pg) < 0)
        goto fail;
    const int rank = dt_pg_rank(pg), world = dt_pg_size(pg);
    dt_model_config cfg = dt_model_config_default();
    cfg.seq = seq;
    if (mlp_dim)
        cfg.mlp_dim = mlp_dim;
    if (mlp_hidden)
        cfg.mlp_hidden = mlp_hidden;
    for (int k = 0; k < nm; k++) {
        zmode *z = &zm[k];
        if (!(z->t = calloc((size_t)steps, sizeof(double))) || !(z->c = calloc((size_t)steps, sizeof(double))) ||
            dt_model_create(model, 1234, &cfg, &z->m, &desc) < 0)
            goto fail;
        dt_strategy *s;
        if (z->stage == 0) {
            if (dt_strategy_ddp_init(pg, NULL, &s) < 0)
                goto fail;
        } else {
            dt_zero_params zp = dt_zero_params_default();
            zp.stage = z->stage;
            zp.backward_prefetch = z->bp;
            zp.page_pool = !z->nopool;
            zp.reduce_scatter = !z->allreduce;
            zp.wrap_min_params = (size_t)wrap;
            zp.wrap_module_type = wrap_type; /* e.g. "GPT2Block": one unit per transformer block */
            if (dt_strategy_zero_init(pg, &zp, &s) < 0)
                goto fail;
        }
        dt_trainer_params tp = dt_trainer_params_default();
        tp.optimizer = DT_OPTIM_ADAMW;
        tp.adamw.lr = 1e-4;
        tp.loss_fn = dt_model_desc_loss_fn;
        tp.loss_ud = &desc;
        if (dt_trainer_init(z->m, s, &tp, &z->tr) < 0)
            goto fail;
    }
    /* one fixed batch per rank, as bench step makes it */
    const bool tokens = desc.input_dtype == DT_I64;
    int nd, tnd;
    int64_t shape[DT_MAX_DIMS], tshape[DT_MAX_DIMS];
    dt_dtype tdt;
    if (dt_model_desc_shapes(&desc, batch, &nd, shape, &tnd, tshape, &tdt) < 0)
        goto fail;
    size_t nx = 1, ny = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)shape[i];
    for (int i = 0; i < tnd; i++)
        ny *= (size_t)tshape[i];
    x = dt_alloc(nx * (tokens ? sizeof(int64_t) : sizeof(float)));
    y = dt_alloc((ny ? ny : 1) * sizeof(int64_t));
    if (!x || !y)
        goto fail;
    if (tokens)
        for (size_t i = 0; i < nx; i++)
            ((int64_t *)x)[i] = (int64_t)((i * 7919u + (size_t)rank * 13u) % (size_t)desc.input_classes);
    else
        dt_rng_fill_uniform(dt_rng_key_make(1, DT_RNG_DATA, (uint64_t)rank, 0), 0, x, nx, -1.0f, 1.0f);
    const int64_t ncls = desc.num_classes > 0 ? desc.num_classes : 10;
    for (size_t i = 0; i < ny; i++)
        y[i] = (int64_t)((i * 31u + 1u + (size_t)rank) % (size_t)ncls);
    dt_trainer_batch b = dt_trainer_batch_make(x, desc.input_dtype, nd, shape, tnd ? y : NULL, tdt, tnd, tshape);
    for (int k = 0; k < nm; k++) {
        for (int s = 0; s < WARM; s++)
            if (dt_trainer_step(zm[k].tr, &b, 1, NULL) < 0)
                goto fail;
        zm[k].bytes0 = volume(&zm[k]);
        zm[k].zs0 = dt_zero_get_stats(dt_strategy_zero(dt_trainer_strategy(zm[k].tr)));
    }
    for (int done = 0, blk = 0; done < nm; blk++) {
        zmode *z = &zm[blk % nm];
        if (z->n >= steps)
            continue;
        if (dt_pg_barrier(pg) < 0)
            goto fail;
        for (int s = 0; s < BLOCK && z->n < steps; s++) {
            dt_trainer_metrics r;
            double t = dt_time_s(), c = dt__bench_cpu_s();
            if (dt_trainer_step(z->tr, &b, 1, &r) < 0)
                goto fail;
            z->c[z->n] = dt__bench_cpu_s() - c;
            z->t[z->n++] = dt_time_s() - t;
            z->loss = r.loss;
        }
        done += z->n >= steps;
    }
    double med[2 * MAXMODES] = {0}, *cmed = med + MAXMODES;
    for (int k = 0; k < nm; k++) {
        med[k] = dt__bench_median(zm[k].t, zm[k].n);
        cmed[k] = dt__bench_median(zm[k].c, zm[k].n);
    }
    if (dt_metrics_allreduce(pg, med, 2 * MAXMODES, DT_REDUCE_MAX) < 0)
        goto fail;
    const double psi = 4.0 * (double)dt_model_param_count(zm[0].m), ddp_ms = 1e3 * med[0];
    if (rank == 0 && !json)
        printf("%s (%zu parameters, Psi = %.2f MiB), batch %ld per rank, %d ranks (%s), %ld thread%s each, AdamW;\n"
               "medians of %ld steps (slowest rank), blocks of %d steps interleaved:\n"
               "%-8s %10s %8s %8s %8s %12s %12s %12s %12s %10s %12s\n",
               model, dt_model_param_count(zm[0].m), psi / 1048576.0, batch, world, dt_pg_backend(pg), threads,
               threads == 1 ? "" : "s", steps, BLOCK, "mode", "step ms", "x first", "cpu ms", "x first", "params MiB", "grads MiB",
               "optim MiB", "gathered MiB", "volume", "last loss");
    for (int k = 0; k < nm; k++) {
        dt_trainer_memory mem;
        if (dt_trainer_memory_get(zm[k].tr, &mem) < 0)
            goto fail;
        const double vol = (double)(volume(&zm[k]) - zm[k].bytes0) / (double)steps / psi;
        const double ratio = med[0] > 0 ? med[k] / med[0] : 0, cratio = cmed[0] > 0 ? cmed[k] / cmed[0] : 0;
        if (rank != 0)
            continue;
        const dt_zero_stats zs = dt_zero_get_stats(dt_strategy_zero(dt_trainer_strategy(zm[k].tr)));
        if (json)
            printf("{\"bench\":\"zero\",\"model\":\"%s\",\"mode\":\"%s\",\"world\":%d,\"batch\":%ld,\"threads\":%ld,"
                   "\"step_ms\":%.3f,\"ratio\":%.4f,\"cpu_ms\":%.3f,\"cpu_ratio\":%.4f,\"param_bytes\":%zu,\"grad_bytes\":%zu,\"optim_bytes\":%zu,"
                   "\"gathered_peak\":%zu,\"pooled_per_step\":%.1f,\"pool_peak\":%llu,\"volume_psi\":%.3f,\"loss\":%.7g}\n",
                   model, zm[k].name, world, batch, threads, 1e3 * med[k], ratio, 1e3 * cmed[k], cratio,
                   mem.param_bytes, mem.grad_bytes, mem.optim_bytes, mem.gathered_peak,
                   (double)(zs.bytes_pooled - zm[k].zs0.bytes_pooled) / (double)steps,
                   (unsigned long long)zs.pool_peak, vol, zm[k].loss);
        else
            printf("%-8s %10.2f %8.3f %8.1f %8.3f %12.2f %12.2f %12.2f %12.2f %8.2f Psi %12.7g\n", zm[k].name,
                   1e3 * med[k], ratio, 1e3 * cmed[k], cratio, mem.param_bytes / 1048576.0, mem.grad_bytes / 1048576.0, mem.optim_bytes / 1048576.0,
                   mem.gathered_peak / 1048576.0, vol, zm[k].loss);
    }
    if (rank == 0 && !json) {
        printf("(x first: step time over the first mode's, %.2f ms; cpu ms: process CPU per step, every thread; "
               "volume per step as DeepSpeed counts it: 2 Psi for DDP and stages 1-2, 3 Psi for stage 3)\n", ddp_ms);
        for (int k = 0; k < nm; k++) {
            dt_zero *zz = dt_strategy_zero(dt_trainer_strategy(zm[k].tr));
            if (!zz || zm[k].stage != 3)
                continue;
            dt_zero_stats a = dt_zero_get_stats(zz), o = zm[k].zs0;
            const double n = (double)steps;
            printf("%-8s %d units; per step %.1f unit all-gathers, %.1f prefetched, %.1f of those complete when "
                   "needed (rank 0)\n", zm[k].name, dt_zero_num_units(zz), (double)(a.gathers - o.gathers) / n,
                   (double)(a.prefetched - o.prefetched) / n, (double)(a.ready_when_needed - o.ready_when_needed) / n);
            size_t big = 0; /* the largest unit freed between gathers */
            for (int i = 0; i < dt_zero_num_units(zz); i++) {
                dt_zero_unit_info ui;
                if (dt_zero_unit(zz, i, &ui) >= 0 && !ui.resident && ui.total * dt_dtype_size(ui.dtype) > big)
                    big = ui.total * dt_dtype_size(ui.dtype);
            }
            printf("%-8s page pool: %.2f MiB per step gathered into kept pages, at most %.2f MiB kept (%.2f of the "
                   "largest unit, %.2f MiB)\n", zm[k].name, (double)(a.bytes_pooled - o.bytes_pooled) / n / 1048576.0,
                   a.pool_peak / 1048576.0, big ? (double)a.pool_peak / (double)big : 0.0, big / 1048576.0);
        }
    }
    rc = 0;
fail:
    if (rc)
        dt__cli_err("dtrain bench zero: %s\n", dt_last_error());
    for (int k = 0; k < nm; k++) {
        dt_trainer_free(zm[k].tr);
        dt_model_free(zm[k].m);
        free(zm[k].t);
        free(zm[k].c);
    }
    dt_free(x);
    dt_free(y);
    dt_pg_free(pg);
    return rc;
}
