/* Checkpoint benchmarks of issue 14 (run by bench/ckpt_bench.sh; not a test).
 *
 *   ckpt_bench io DIR DIM HIDDEN
 *       An MLP of 2 * DIM * HIDDEN parameters with AdamW, one step; then a
 *       synchronous dt_trainer_save into DIR (timed to the fsynced, renamed
 *       directory), the page cache of its files dropped (posix_fadvise
 *       DONTNEED after the fsync: the pages are clean, so they go), then
 *       dt_trainer_load from it (timed; it reads each file once, checking
 *       its CRC-32C as the bytes arrive). Prints "bytes N save_s S load_s L
 *       ... save_cpu_s C load_cpu_s D" (CPU: the process's, all threads);
 *       the script writes and reads the same N bytes with dd.
 *   ckpt_bench stall DIR DIM HIDDEN STEPS EVERY
 *       The step loop three times: without saves, with a synchronous save
 *       every EVERY steps, with an asynchronous one. Prints per mode the
 *       median step time of the steps without a save call, the time each
 *       save call blocked the loop, the median step time of the steps taken
 *       while an asynchronous save was being written, and the loop's wall
 *       time.
 *   ckpt_bench rss DIR DIM HIDDEN
 *       Peak extra resident memory of a save, one process: the trainer's
 *       synchronous and asynchronous dt_trainer_save (rank 0 of DDP holds the
 *       whole state) against the model state's size. The peak is reset with
 *       /proc/self/clear_refs ("5") before each save and read (VmHWM) after.
 *   ckpt_bench full DIR MODEL DIM HIDDEN      (under `dtrain run -n N`)
 *       The full state dict (dt_ckpt_save_full, FSDP FULL_STATE_DICT
 *       rank0_only) of zoo model MODEL ("mlp" of DIM x HIDDEN, "gpt2", ...;
 *       built meta: no rank allocates the whole model) whose parameters are sharded over the ranks
 *       like ZeRO-3 (each rank an equal range of the flat parameters): rank
 *       0's peak extra resident memory against the largest tensor and the
 *       model. */
#define _GNU_SOURCE
#include "dtrain/dtrain.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double mib(double b) { return b / 1048576.0; }

/* CPU time of the process (all its threads: the writer thread included), s. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(void)
{
    fprintf(stderr, "ckpt_bench: %s\n", dt_last_error());
    return 1;
}

/* VmRSS or VmHWM of this process, bytes. */
static double proc_kb(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    size_t kl = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl)) {
            kb = strtod(line + kl, NULL);
            break;
        }
    if (f)
        fclose(f);
    return kb * 1024;
}

/* Reset VmHWM to the current RSS (Linux >= 4.0). */
static int reset_peak(void)
{
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    int ok = fd >= 0 && write(fd, "5", 1) == 1;
    if (fd >= 0)
        close(fd);
    return ok ? 0 : -1;
}

/* Sum of the file sizes under dir (one level of subdirectories); with drop,
 * evict each file's pages from the page cache. */
static double dir_bytes(const char *dir, int drop)
{
    DIR *d = opendir(dir);
    double total = 0;
    struct dirent *de;
    char p[4096];
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (lstat(p, &sb) != 0)
            continue;
        if (S_ISDIR(sb.st_mode)) {
            total += dir_bytes(p, drop);
        } else if (S_ISREG(sb.st_mode)) {
            total += (double)sb.st_size;
            int fd = open(p, O_RDONLY);
            if (fd >= 0) {
                if (drop) {
                    fdatasync(fd);
                    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
                }
                close(fd);
            }
        }
    }
    if (d)
        closedir(d);
    return total;
}

typedef struct run {
    dt_model *m;
    dt_model_desc d;
    dt_trainer *tr;
    float *x;
    dt_trainer_batch b;
} run;

static int run_init(run *r, int64_t dim, int64_t hidden)
{
    memset(r, 0, sizeof *r);
    dt_model_config cfg = dt_model_config_default();
    cfg.mlp_dim = dim;
    cfg.mlp_hidden = hidden;
    cfg.mlp_seq = 8;
    if (dt_model_create("mlp", 0, &cfg, &r->m, &r->d) < 0)
        return fail();
    dt_strategy *s;
    dt_strategy_none_init(&s);
    dt_trainer_params tp = dt_trainer_params_default();
    tp.optimizer = DT_OPTIM_ADAMW;
    tp.loss_fn = dt_model_desc_loss_fn;
    tp.loss_ud = &r->d;
    if (dt_trainer_init(r->m, s, &tp, &r->tr) < 0)
        return fail();
    int64_t xs[DT_MAX_DIMS];
    int nd;
    dt_model_desc_shapes(&r->d, 1, &nd, xs, NULL, NULL, NULL);
    size_t nx = 1;
    for (int i = 0; i < nd; i++)
        nx *= (size_t)xs[i];
    r->x = calloc(nx, sizeof(float));
    for (size_t i = 0; i < nx; i++)
        r->x[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    r->b = dt_trainer_batch_make(r->x, DT_F32, nd, xs, NULL, DT_F32, 0, NULL);
    return 0;
}

static void run_free(run *r)
{
    dt_trainer_free(r->tr);
    dt_model_free(r->m);
    free(r->x);
}

static int step(run *r)
{
    dt_trainer_metrics mt;
    return dt_trainer_step(r->tr, &r->b, 1, &mt) < 0 ? fail() : 0;
}

static int io(const char *dir, int64_t dim, int64_t hidden)
{
    run r;
    if (run_init(&r, dim, hidden) || step(&r))
        return 1;
    dt_trainer_save_params sp = dt_trainer_save_params_default();
    double t0 = dt_time_s(), c0 = cpu_s();
    if (dt_trainer_save(r.tr, dir, &sp) < 0)
        return fail();
    double ts = dt_time_s() - t0, cs = cpu_s() - c0;
    double bytes = dir_bytes(dir, 1);
    t0 = dt_time_s();
    c0 = cpu_s();
    if (dt_trainer_load(r.tr, dir, NULL) < 0)
        return fail();
    double tl = dt_time_s() - t0, cl = cpu_s() - c0;
    printf("params %zu bytes %.0f save_s %.4f load_s %.4f save_GBps %.3f load_GBps %.3f save_cpu_s %.4f "
           "load_cpu_s %.4f\n",
           dt_model_param_count(r.m), bytes, ts, tl, bytes / ts / 1e9, bytes / tl / 1e9, cs, cl);
    run_free(&r);
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int stall(const char *dir, int64_t dim, int64_t hidden, int steps, int every)
{
    run r;
    if (run_init(&r, dim, hidden) || step(&r)) /* warm up */
        return 1;
    double *plain = malloc((size_t)steps * sizeof *plain), *during = malloc((size_t)steps * sizeof *during);
    double *blocked = malloc((size_t)steps * sizeof *blocked);
    static const char *names[3] = {"none", "sync", "async"};
    for (int mode = 0; mode < 3; mode++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, names[mode]);
        dt_trainer_save_params sp = dt_trainer_save_params_default();
        sp.async = mode == 2;
        sp.keep = 1;
        int np = 0, nd = 0, nb = 0;
        int64_t last = -1; /* the step of the newest save */
        double t_all = dt_time_s();
        for (int i = 1; i <= steps; i++) {
            /* is the previous asynchronous save still being written? (a
             * zero-cost look: the directory appears when it is complete) */
            char done[4200];
            int writing = 0;
            if (mode == 2 && last >= 0) {
                snprintf(done, sizeof done, "%s/step-%08" PRId64 "/index.json", sub, last);
                writing = access(done, F_OK) != 0;
            }
            double t0 = dt_time_s();
            if (step(&r))
                return 1;
            double dt = dt_time_s() - t0;
            if (writing)
                during[nd++] = dt;
            else
                plain[np++] = dt;
            if (mode > 0 && i % every == 0) {
                last = dt_trainer_steps(r.tr);
                t0 = dt_time_s();
                if (dt_trainer_save(r.tr, sub, &sp) < 0)
                    return fail();
                blocked[nb++] = dt_time_s() - t0;
            }
        }
        double t0 = dt_time_s();
        if (dt_trainer_save_wait(r.tr) < 0)
            return fail();
        double tail = dt_time_s() - t0;
        t_all = dt_time_s() - t_all;
        double bsum = 0, bmax = 0;
        for (int i = 0; i < nb; i++) {
            bsum += blocked[i];
            bmax = blocked[i] > bmax ? blocked[i] : bmax;
        }
        printf("%-5s steps %d saves %d: step median %.1f ms (%d steps); save call blocks median %.1f ms, max %.1f ms; "
               "steps during a background write %d, median %.1f ms; final wait %.1f ms; loop %.2f s\n",
               names[mode], steps, nb, 1e3 * median(plain, np), np, 1e3 * median(blocked, nb), 1e3 * bmax, nd,
               1e3 * median(during, nd), 1e3 * tail, t_all);
        (void)bsum;
    }
    free(plain);
    free(during);
    free(blocked);
    run_free(&r);
    return 0;
}

static int rss(const char *dir, int64_t dim, int64_t hidden)
{
    run r;
    if (run_init(&r, dim, hidden) || step(&r))
        return 1;
    dt_trainer_memory mem;
    if (dt_trainer_memory_get(r.tr, &mem) < 0)
        return fail();
    /* the state a checkpoint holds: parameters + AdamW's two moments (f32) */
    double state = 3.0 * 4.0 * (double)dt_model_param_count(r.m);
    for (int async = 0; async < 2; async++) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", dir, async ? "async" : "sync");
        dt_trainer_save_params sp = dt_trainer_save_params_default();
        sp.async = async;
        double before = proc_kb("VmRSS:");
        if (reset_peak() < 0) {
            fprintf(stderr, "ckpt_bench: cannot reset the peak RSS (/proc/self/clear_refs)\n");
            return 1;
        }
        if (dt_trainer_save(r.tr, sub, &sp) < 0 || dt_trainer_save_wait(r.tr) < 0)
            return fail();
        double peak = proc_kb("VmHWM:");
        printf("%-5s save: RSS before %.1f MiB, peak during %.1f MiB: extra %.1f MiB; checkpointed state %.1f MiB "
               "(extra / state = %.2f)\n",
               async ? "async" : "sync", mib(before), mib(peak), mib(peak - before), mib(state), (peak - before) / state);
    }
    run_free(&r);
    return 0;
}

static int full(const char *dir, const char *model, int64_t dim, int64_t hidden)
{
    dt_pg *pg;
    if (dt_pg_init(NULL, &pg) < 0)
        return fail();
    const int W = dt_pg_size(pg), rank = dt_pg_rank(pg);
    dt_model_config cfg = dt_model_config_default();
    cfg.mlp_dim = dim;
    cfg.mlp_hidden = hidden;
    cfg.mlp_seq = 8;
    cfg.build.meta = true; /* shapes only: each rank allocates its shard */
    dt_model *m;
    if (dt_model_create(model, 0, &cfg, &m, NULL) < 0)
        return fail();
    const dt_flat *P = dt_model_flat(m, DT_FLAT_PARAMS, DT_F32);
    const uint64_t total = P->total, per = (total + (uint64_t)W - 1) / (uint64_t)W;
    const uint64_t lo = per * (uint64_t)rank < total ? per * (uint64_t)rank : total;
    const uint64_t hi = lo + per < total ? lo + per : total;
    float *shard = malloc((size_t)(hi - lo ? hi - lo : 1) * sizeof(float));
    for (uint64_t i = lo; i < hi; i++)
        shard[i - lo] = (float)(i % 1000) * 1e-3f;
    dt_ckpt_list *l;
    if (dt_ckpt_list_init(&l) < 0 ||
        dt_ckpt_list_add_flat(l, m, DT_FLAT_PARAMS, DT_F32, lo, hi, shard, "", "") < 0)
        return fail();
    double largest = 0;
    dt_ckpt_entry *e = dt_ckpt_list_entries(l);
    for (size_t i = 0; i < dt_ckpt_list_count(l); i++) {
        double nb = 4;
        for (int d = 0; d < e[i].ndim; d++)
            nb *= (double)e[i].shape[d];
        largest = nb > largest ? nb : largest;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/full.safetensors", dir);
    unlink(path);
    double before = proc_kb("VmRSS:");
    if (reset_peak() < 0)
        return fprintf(stderr, "ckpt_bench: cannot reset the peak RSS\n"), 1;
    double t0 = dt_time_s();
    dt_ckpt_save_params sp = dt_ckpt_save_params_default();
    sp.overwrite = true;
    if (dt_ckpt_save_full(path, e, dt_ckpt_list_count(l), &sp, pg) < 0)
        return fail();
    double t = dt_time_s() - t0, peak = proc_kb("VmHWM:");
    if (rank == 0)
        printf("%s: full state dict, %d ranks, %zu tensors: model %.1f MiB, largest tensor %.1f MiB, this rank's shard "
               "%.1f MiB; rank 0 RSS before %.1f MiB, peak %.1f MiB: extra %.1f MiB (%.2f x the largest tensor, "
               "%.2f x the model); %.2f s, %.3f GB/s\n",
               model, W, dt_ckpt_list_count(l), mib(4.0 * (double)total), mib(largest), mib(4.0 * (double)(hi - lo)),
               mib(before), mib(peak), mib(peak - before), (peak - before) / largest,
               (peak - before) / (4.0 * (double)total), t, 4.0 * (double)total / t / 1e9);
    dt_ckpt_list_free(l);
    free(shard);
    dt_model_free(m);
    dt_pg_free(pg);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3)
        mkdir(argv[2], 0755);
    if (argc == 5 && !strcmp(argv[1], "io"))
        return io(argv[2], atoll(argv[3]), atoll(argv[4]));
    if (argc == 7 && !strcmp(argv[1], "stall"))
        return stall(argv[2], atoll(argv[3]), atoll(argv[4]), atoi(argv[5]), atoi(argv[6]));
    if (argc == 5 && !strcmp(argv[1], "rss"))
        return rss(argv[2], atoll(argv[3]), atoll(argv[4]));
    if (argc == 6 && !strcmp(argv[1], "full"))
        return full(argv[2], argv[3], atoll(argv[4]), atoll(argv[5]));
    fprintf(stderr, "usage: ckpt_bench io DIR DIM HIDDEN | stall DIR DIM HIDDEN STEPS EVERY | rss DIR DIM HIDDEN | "
                    "full DIR MODEL DIM HIDDEN (under dtrain run)\n");
    return 2;
}
