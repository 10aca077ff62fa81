/* Trainer checkpoints: a run's state on disk, saved without stalling the
 * other ranks' collectives, loaded for an exact resume.
 *
 * Layout. A save directory holds one checkpoint (ckpt.h: index.json and the
 * safetensors files it lists) per save, named step-<8 digits> after the
 * optimizer steps taken:
 *
 *     DIR/step-00000040/index.json            tensors, files, CRC-32s, metadata
 *                       rank-00000.safetensors
 *
 * The tensors are the model's parameters and buffers under PyTorch's
 * state_dict names and the optimizer state as "optim.<param>.exp_avg" (...
 * exp_avg_sq, momentum_buffer), so `dtrain ckpt` and dt_ckpt_load read and
 * reshard them like any checkpoint. The metadata holds the run state
 * ("dtrain.run": dt_trainer_run_state's JSON) and the caller's options
 * ("dtrain.user"). dt_ckpt_save writes the directory under a temporary name
 * and renames it when complete, so a step-N directory with index.json is a
 * complete checkpoint; loading verifies every file's CRC-32.
 *
 * Who writes. Under DDP (and with one process) every rank holds the whole
 * model and optimizer state, so rank 0 writes and the others only agree on
 * the outcome. Rank 0 first copies everything into a staging buffer (one
 * copy of the flats and the optimizer state), then a background thread
 * writes it (dt_ckpt_save of this process alone). A synchronous save then
 * waits for that thread, and an asynchronous one returns at once (the next
 * save, dt_trainer_save_wait or dt_trainer_free waits for it). Waiting is a
 * loop of small all-reduces of [done, failed] that every rank joins, each one
 * answered at once because rank 0's main thread is free while its writer
 * thread writes: no rank ever sits in a collective for as long as the disk
 * takes, so a slow save cannot run into the collective timeout
 * ($DT_COMM_TIMEOUT), on any rank.
 *
 * Sharded state (ZeRO) is not written here yet: a strategy whose optimizer
 * does not step the whole flat gets DT_ERR_UNSUPPORTED. */
#include "train/train_impl.h"

#include "dtrain/ckpt.h"
#include "dtrain/tp.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INDEX_FILE "index.json"
#define META_RUN "dtrain.run"
#define META_USER "dtrain.user"

dt_trainer_save_params dt_trainer_save_params_default(void)
{
    dt_trainer_save_params p = {.async = false, .keep = 0, .user_json = NULL};
    return p;
}

/* ---- the staged checkpoint and its writer thread ------------------------------------ */

typedef struct ckpt_job {
    char *dir, *final;           /* DIR, DIR/step-N */
    int keep;
    void **bufs;                 /* staging copies, one per flat / optimizer state */
    size_t nbuf;
    dt_ckpt_list *list;          /* entries over the staging copies */
    char *run_state, *user;
    /* outcome */
    pthread_t th;
    bool started;
    int done;                    /* set by the thread at its end (under mu) */
    pthread_mutex_t mu;
    dt_status st;
    char msg[1024];
} ckpt_job;

static void job_free(ckpt_job *j)
{
    if (!j)
        return;
    if (j->started)
        pthread_join(j->th, NULL);
    for (size_t i = 0; i < j->nbuf; i++)
        dt_free(j->bufs[i]);
    free(j->bufs);
    dt_ckpt_list_free(j->list);
    free(j->dir);
    free(j->final);
    cJSON_free(j->run_state);
    free(j->user);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static char *dup_printf(const char *fmt, ...) DT_PRINTF(1, 2);
static char *dup_printf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

/* Remove a checkpoint directory: its plain files, then itself. Nothing
 * below it is followed (unlinkat removes a link, not its target). */
static void remove_ckpt_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(fd, e->d_name, 0);
    closedir(d);
    if (rmdir(path) != 0)
        dt_log(DT_LOG_WARN, "checkpoint: could not remove %s: %s", path, strerror(errno));
}

/* "step-" followed by digits only: the step, else -1. */
static int64_t step_of(const char *name)
{
    if (strncmp(name, "step-", 5) != 0 || !name[5])
        return -1;
    int64_t v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static bool is_complete(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, INDEX_FILE);
    struct stat sb;
    return lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

static int cmp_i64_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The steps of the complete checkpoints in dir, newest first (malloc'd). */
static dt_status list_steps(const char *dir, int64_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return dt_error(DT_ERR_IO, "cannot read the checkpoint directory %s: %s", dir, strerror(errno));
    size_t cap = 0;
    int64_t *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name);
        if (s < 0 || !is_complete(dir, e->d_name))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                free(v);
                closedir(d);
                return dt_error(DT_ERR_NO_MEMORY, "listing %s: out of memory", dir);
            }
            v = nv;
        }
        v[(*n)++] = s;
    }
    closedir(d);
    if (*n > 1)
        qsort(v, *n, sizeof *v, cmp_i64_desc);
    *out = v;
    return DT_OK;
}

/* Temporaries a killed save left behind (dt_ckpt_save's "step-N.tmp-XXXXXX",
 * and those of the writer before it): a save directory belongs to one run,
 * whose saves never overlap, so any temporary there when a save starts is
 * stale. */
static void remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[4200];
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        if (!strncmp(n, ".tmp-step-", 10) || !strncmp(n, ".old-step-", 10) ||
            (!strncmp(n, "step-", 5) && strstr(n, ".tmp-"))) {
            snprintf(p, sizeof p, "%s/%s", dir, n);
            remove_ckpt_dir(p);
        }
    }
    closedir(d);
}

/* The writer: one checkpoint directory (complete or absent), then pruning. */
static dt_status job_write(ckpt_job *j)
{
    remove_stale(j->dir);
    dt_st_kv meta[2] = {{META_RUN, j->run_state}, {META_USER, j->user ? j->user : "null"}};
    dt_ckpt_save_params sp = dt_ckpt_save_params_default();
    sp.meta = meta;
    sp.nmeta = 2;
    sp.overwrite = true; /* a re-save of the same step (after a resume) replaces it */
    dt_status st = dt_ckpt_save(j->final, dt_ckpt_list_entries(j->list), dt_ckpt_list_count(j->list), &sp, NULL);
    if (st < 0)
        return st;
    if (j->keep > 0) {
        int64_t *steps;
        size_t n;
        if (list_steps(j->dir, &steps, &n) == DT_OK) {
            for (size_t i = (size_t)j->keep; i < n; i++) {
                char p[4200];
                snprintf(p, sizeof p, "%s/step-%08" PRId64, j->dir, steps[i]);
                remove_ckpt_dir(p);
            }
            free(steps);
        }
    }
    return DT_OK;
}

static void *job_thread(void *arg)
{
    ckpt_job *j = arg;
    dt_status st = job_write(j);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    if (st < 0)
        snprintf(j->msg, sizeof j->msg, "%s", dt_last_error());
    j->done = 1;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static int job_state(ckpt_job *j, dt_status *st)
{
    pthread_mutex_lock(&j->mu);
    int done = j->done;
    *st = j->st;
    pthread_mutex_unlock(&j->mu);
    return done;
}

/* ---- staging (rank 0) ------------------------------------------------------------------ */

/* A staging copy of n bytes of src, kept by the job. */
static void *stage_copy(ckpt_job *j, const void *src, size_t n)
{
    void *b = dt_alloc(n ? n : 64);
    if (!b)
        return NULL;
    memcpy(b, src, n);
    j->bufs[j->nbuf++] = b;
    return b;
}

static dt_status stage(dt_trainer *tr, const char *dir, const dt_trainer_save_params *p, ckpt_job **out)
{
    *out = NULL;
    dt_model *m = dt_trainer_model(tr);
    dt_optim *o = dt_trainer_optim(tr);
    if (!dt__trainer_whole_state(tr))
        return dt_error(DT_ERR_UNSUPPORTED,
                        "dt_trainer_save: strategy '%s': the model or optimizer state is sharded over the ranks or "
                        "kept as fp32 masters of low-precision parameters; trainer checkpoints of such state are "
                        "not supported yet (fp32 DDP and one process are)",
                        dt_strategy_name(dt_trainer_strategy(tr)));
    ckpt_job *j = calloc(1, sizeof *j);
    if (!j)
        return dt_error(DT_ERR_NO_MEMORY, "dt_trainer_save: out of memory");
    pthread_mutex_init(&j->mu, NULL);
    dt_status st = DT_ERR_NO_MEMORY;
    const int ns = dt_optim_num_states(o);
    j->keep = p->keep;
    j->dir = strdup(dir);
    j->final = dup_printf("%s/step-%08" PRId64, dir, dt_trainer_steps(tr));
    j->user = p->user_json ? strdup(p->user_json) : NULL;
    j->bufs = calloc(2 * DT_DTYPE_COUNT + (size_t)ns + 1, sizeof *j->bufs);
    if (!j->dir || !j->final || (p->user_json && !j->user) || !j->bufs || dt_ckpt_list_init(&j->list) < 0)
        goto fail;
    /* parameters and buffers: a copy of each flat, entries over the copy */
    static const dt_flat_role roles[2] = {DT_FLAT_PARAMS, DT_FLAT_BUFFERS};
    for (int r = 0; r < 2; r++)
        for (int d = 0; d < DT_DTYPE_COUNT; d++) {
            const dt_flat *f = dt_model_flat(m, roles[r], (dt_dtype)d);
            if (!f || !f->numel)
                continue;
            void *c = stage_copy(j, f->base, f->numel * dt_dtype_size((dt_dtype)d));
            if (!c)
                goto fail;
            if ((st = dt_ckpt_list_add_flat(j->list, m, roles[r], (dt_dtype)d, f->offset, f->offset + f->numel, c,
                                            "", "")) < 0)
                goto fail;
            st = DT_ERR_NO_MEMORY;
        }
    /* the optimizer state: "optim.<param>.<state>", laid out like the f32 flat's owned range */
    size_t lo, hi;
    dt__trainer_owned(tr, &lo, &hi);
    for (int i = 0; i < ns; i++) {
        const char *sname;
        float *data;
        size_t n;
        if ((st = dt_optim_state(o, 0, i, &sname, &data, &n)) < 0)
            goto fail;
        st = DT_ERR_NO_MEMORY;
        void *c = stage_copy(j, data, n * sizeof(float));
        char suffix[64];
        snprintf(suffix, sizeof suffix, ".%s", sname);
        if (!c)
            goto fail;
        if ((st = dt_ckpt_list_add_flat(j->list, m, DT_FLAT_PARAMS, DT_F32, lo, hi, c, "optim.", suffix)) < 0)
            goto fail;
        st = DT_ERR_NO_MEMORY;
    }
    if ((st = dt_trainer_run_state(tr, &j->run_state)) < 0)
        goto fail;
    *out = j;
    return DT_OK;
fail:
    job_free(j);
    return st == DT_ERR_NO_MEMORY ? dt_error(st, "dt_trainer_save: out of memory staging the checkpoint") : st;
}

/* ---- agreement ------------------------------------------------------------------------------ */

/* Every rank: wait until rank 0's job (may be NULL: nothing in flight, or
 * another rank) is done, through small all-reduces; then all know whether
 * it failed. Returns DT_OK or the failure (rank 0: its message; others: a
 * message naming rank 0). */
static dt_status agree_done(dt_trainer *tr, ckpt_job **jp)
{
    ckpt_job *j = *jp;
    const bool multi = dt_trainer_world(tr) > 1;
    dt_status jst = DT_OK;
    for (;;) {
        int done = !j || job_state(j, &jst);
        double v[2] = {done ? 1.0 : 0.0, done && jst < 0 ? 1.0 : 0.0};
        if (dt_trainer_rank(tr) != 0)
            v[0] = v[1] = 0;
        if (multi) {
            dt_status st = dt_trainer_allreduce_sum(tr, v, 2);
            if (st < 0)
                return st;
        } else {
            v[0] = done;
            v[1] = done && jst < 0;
        }
        if (v[0] > 0) {
            if (j) {
                char msg[1024];
                snprintf(msg, sizeof msg, "%s", j->msg);
                job_free(j);
                *jp = NULL;
                if (jst < 0)
                    return dt_error(jst, "%s", msg);
            }
            if (v[1] > 0)
                return dt_error(DT_ERR_IO, "rank 0 could not write the checkpoint (its error says why)");
            return DT_OK;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

dt_status dt_trainer_save_wait(dt_trainer *tr)
{
    if (!tr)
        return dt_error(DT_ERR_NULL, "dt_trainer_save_wait: trainer is NULL");
    return agree_done(tr, (ckpt_job **)dt__trainer_ckpt_slot(tr));
}

void dt__trainer_ckpt_free(dt_trainer *tr)
{
    ckpt_job **jp = (ckpt_job **)dt__trainer_ckpt_slot(tr);
    job_free(*jp); /* joins a write in flight */
    *jp = NULL;
}

dt_status dt_trainer_save(dt_trainer *tr, const char *dir, const dt_trainer_save_params *p)
{
    if (!tr || !dir || !*dir)
        return dt_error(DT_ERR_NULL, "dt_trainer_save: %s", tr ? "no directory" : "trainer is NULL");
    if (dt_trainer_offload(tr)) /* every rank has it or none: the refusal is symmetric */
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_save: the optimizer state is offloaded to NVMe (offload.h), "
                        "which checkpoints do not hold yet");
    const char *sl = dt_tp_model_slice(dt_trainer_model(tr)); /* every rank of the group alike */
    if (sl)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_save: '%s' is a tensor-parallel slice (tp.h): checkpoints of "
                        "tensor-parallel models are not supported yet", sl);
    dt_trainer_save_params pp = p ? *p : dt_trainer_save_params_default();
    if (pp.keep < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_trainer_save: keep %d < 0", pp.keep);
    ckpt_job **jp = (ckpt_job **)dt__trainer_ckpt_slot(tr);
    /* the previous save (asynchronous) first: one at a time */
    dt_status st = agree_done(tr, jp);
    if (st < 0)
        return dt_error_wrap(st, "the previous checkpoint");
    ckpt_job *j = NULL;
    dt_status sst = DT_OK;
    if (dt_trainer_rank(tr) == 0) {
        struct stat sb;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            sst = dt_error(DT_ERR_IO, "cannot create the checkpoint directory %s: %s", dir, strerror(errno));
        else if (lstat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            sst = dt_error(DT_ERR_IO, "the checkpoint directory %s is not a directory", dir);
        else
            sst = stage(tr, dir, &pp, &j);
        if (sst >= 0) {
            int rc = pthread_create(&j->th, NULL, job_thread, j);
            if (rc != 0) {
                job_free(j);
                j = NULL;
                sst = dt_error(DT_ERR_INTERNAL, "dt_trainer_save: cannot start the writer thread (%s)",
                               strerror(rc));
            } else {
                j->started = true;
            }
        }
    }
    /* staging failed on rank 0: every rank hears of it now */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", sst < 0 ? dt_last_error() : "");
    double v = sst < 0 ? 1.0 : 0.0;
    if ((st = dt_trainer_allreduce_sum(tr, &v, 1)) < 0) {
        job_free(j);
        return st;
    }
    if (v > 0)
        return sst < 0 ? dt_error(sst, "%s", msg)
                       : dt_error(DT_ERR_IO, "rank 0 could not stage the checkpoint (its error says why)");
    *jp = j;
    if (pp.async)
        return DT_OK;
    return agree_done(tr, jp);
}

/* ---- finding and loading ----------------------------------------------------------------------- */

dt_status dt_trainer_ckpt_latest(const char *dir, char *out, size_t n)
{
    if (!dir || !out || n == 0)
        return dt_error(DT_ERR_NULL, "dt_trainer_ckpt_latest: NULL argument");
    out[0] = 0;
    int64_t *steps;
    size_t k;
    dt_status st = list_steps(dir, &steps, &k);
    if (st < 0)
        return st;
    if (k > 0)
        snprintf(out, n, "%s/step-%08" PRId64, dir, steps[0]);
    free(steps);
    return DT_OK;
}

/* path: a checkpoint (holds trainer.json) or a save directory (its newest). */
static dt_status resolve(const char *path, char *ck, size_t n)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", path, INDEX_FILE);
    struct stat sb;
    if (lstat(p, &sb) == 0) {
        snprintf(ck, n, "%s", path);
        return DT_OK;
    }
    if (stat(path, &sb) != 0)
        return dt_error(DT_ERR_IO, "checkpoint %s: %s", path, strerror(errno));
    dt_status st = dt_trainer_ckpt_latest(path, ck, n);
    if (st < 0)
        return st;
    if (!ck[0])
        return dt_error(DT_ERR_IO, "%s holds no complete checkpoint (no step-N directory with %s)", path,
                        INDEX_FILE);
    return DT_OK;
}

/* The run-state and user metadata of an open checkpoint. */
static dt_status ckpt_meta(const dt_ckpt *ck, const char *ckname, const char *key, const char **out)
{
    *out = dt_ckpt_meta(ck, key);
    if (!*out)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s: no \"%s\" metadata (not saved by dt_trainer_save)", ckname,
                        key);
    return DT_OK;
}

/* Entries over the model's own flats (loaded in place). */
static dt_status model_entries(dt_model *m, dt_ckpt_list *l)
{
    return dt_ckpt_list_add_model(l, m);
}

static dt_status load_impl(dt_trainer *tr, const char *path, dt_trainer_resume_info *info, bool weights_only,
                           char *ckname, size_t ckn)
{
    dt_status st = resolve(path, ckname, ckn);
    if (st < 0)
        return st;
    dt_ckpt *ck = NULL;
    dt_ckpt_list *l = NULL;
    const char *run = NULL;
    if ((st = dt_ckpt_open(ckname, &ck)) < 0)
        return st;
    if (!weights_only) {
        if (!dt__trainer_whole_state(tr)) {
            st = dt_error(DT_ERR_UNSUPPORTED,
                          "dt_trainer_load: strategy '%s' shards the model or optimizer state over the ranks; "
                          "loading a trainer checkpoint into it is not supported yet (DDP and one process are)",
                          dt_strategy_name(dt_trainer_strategy(tr)));
            goto out;
        }
        if ((st = ckpt_meta(ck, ckname, META_RUN, &run)) < 0)
            goto out;
        /* the optimizer kind first: a clearer error than a missing tensor */
        cJSON *rs = cJSON_Parse(run);
        const cJSON *k = rs ? cJSON_GetObjectItemCaseSensitive(rs, "optimizer") : NULL;
        const char *have = dt_optim_kind_name(dt_optim_get_kind(dt_trainer_optim(tr)));
        if (cJSON_IsString(k) && strcmp(k->valuestring, have) != 0)
            st = dt_error(DT_ERR_MISMATCH, "checkpoint %s holds %s optimizer state, this run uses %s", ckname,
                          k->valuestring, have);
        cJSON_Delete(rs);
        if (st < 0)
            goto out;
    }
    if ((st = dt_ckpt_list_init(&l)) < 0 || (st = model_entries(dt_trainer_model(tr), l)) < 0)
        goto out;
    if (!weights_only) {
        dt_optim *o = dt_trainer_optim(tr);
        size_t lo, hi;
        dt__trainer_owned(tr, &lo, &hi);
        for (int i = 0; i < dt_optim_num_states(o); i++) {
            const char *sname;
            float *data;
            char suffix[64];
            if ((st = dt_optim_state(o, 0, i, &sname, &data, NULL)) < 0)
                goto out;
            snprintf(suffix, sizeof suffix, ".%s", sname);
            if ((st = dt_ckpt_list_add_flat(l, dt_trainer_model(tr), DT_FLAT_PARAMS, DT_F32, lo, hi, data, "optim.",
                                            suffix)) < 0)
                goto out;
        }
    }
    dt_ckpt_load_params lp = dt_ckpt_load_params_default();
    lp.verify = true;
    if ((st = dt_ckpt_load(ckname, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), &lp, NULL)) < 0)
        goto out;
    if (!weights_only)
        st = dt_trainer_apply_run_state(tr, run, info);
out:
    dt_ckpt_list_free(l);
    dt_ckpt_close(ck);
    return st;
}

/* Every rank loads; then all agree (a rank that failed makes all fail). */
static dt_status agree_load(dt_trainer *tr, dt_status st)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st < 0 ? dt_last_error() : "");
    double v = st < 0 ? 1.0 : 0.0;
    dt_status ast = dt_trainer_allreduce_sum(tr, &v, 1);
    if (ast < 0)
        return ast;
    if (st < 0)
        return dt_error(st, "%s", msg);
    if (v > 0)
        return dt_error(DT_ERR_IO, "another rank could not load the checkpoint (its error says why)");
    return DT_OK;
}

dt_status dt_trainer_load(dt_trainer *tr, const char *path, dt_trainer_resume_info *info)
{
    if (!tr || !path)
        return dt_error(DT_ERR_NULL, "dt_trainer_load: NULL %s", tr ? "path" : "trainer");
    if (dt_trainer_offload(tr))
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_load: the optimizer state is offloaded to NVMe (offload.h), "
                        "which checkpoints do not hold yet");
    const char *sl = dt_tp_model_slice(dt_trainer_model(tr));
    if (sl)
        return dt_error(DT_ERR_UNSUPPORTED, "dt_trainer_load: '%s' is a tensor-parallel slice (tp.h): checkpoints of "
                        "tensor-parallel models are not supported yet", sl);
    char ck[sizeof ((dt_trainer_resume_info *)0)->path];
    dt_trainer_resume_info ri;
    memset(&ri, 0, sizeof ri);
    dt_status st = load_impl(tr, path, &ri, false, ck, sizeof ck);
    if (st >= 0)
        snprintf(ri.path, sizeof ri.path, "%s", ck);
    st = agree_load(tr, st);
    if (info)
        *info = ri;
    return st;
}

dt_status dt_trainer_load_weights(dt_trainer *tr, const char *file)
{
    if (!tr || !file)
        return dt_error(DT_ERR_NULL, "dt_trainer_load_weights: NULL %s", tr ? "file" : "trainer");
    struct stat sb;
    dt_status st;
    if (stat(file, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char ck[4096]; /* a checkpoint or a save directory */
        st = load_impl(tr, file, NULL, true, ck, sizeof ck);
    } else { /* one safetensors file (PyTorch's names) */
        dt_ckpt_list *l = NULL;
        st = dt_ckpt_list_init(&l);
        if (st >= 0)
            st = model_entries(dt_trainer_model(tr), l);
        dt_ckpt_load_params lp = dt_ckpt_load_params_default();
        if (st >= 0)
            st = dt_ckpt_load(file, dt_ckpt_list_entries(l), dt_ckpt_list_count(l), &lp, NULL);
        dt_ckpt_list_free(l);
    }
    return agree_load(tr, st);
}

dt_status dt_trainer_ckpt_user(const char *path, char **json)
{
    if (!path || !json)
        return dt_error(DT_ERR_NULL, "dt_trainer_ckpt_user: NULL argument");
    *json = NULL;
    char ck[4096];
    dt_status st = resolve(path, ck, sizeof ck);
    if (st < 0)
        return st;
    dt_ckpt *c;
    if ((st = dt_ckpt_open(ck, &c)) < 0)
        return st;
    const char *u;
    if ((st = ckpt_meta(c, ck, META_USER, &u)) >= 0) {
        cJSON *o = cJSON_Parse(u);
        if (!cJSON_IsObject(o))
            st = dt_error(DT_ERR_FORMAT, "checkpoint %s: its \"%s\" metadata is not a JSON object", ck, META_USER);
        else if (!(*json = cJSON_PrintUnformatted(o)))
            st = dt_error(DT_ERR_NO_MEMORY, "checkpoint %s: out of memory", ck);
        cJSON_Delete(o);
    }
    dt_ckpt_close(c);
    return st;
}
