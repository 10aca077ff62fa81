/* Sharded and full checkpoints over safetensors files (ckpt.h).
 *
 * The plan. Every rank knows every rank's range [lo, hi) of every tensor
 * (one all-gather). The boundaries of all ranges cut a tensor into
 * elementary intervals; each interval goes to one of the ranks holding it,
 * the one with the fewest bytes assigned so far (ties: the lowest rank),
 * and neighbouring intervals with the same owner merge into one piece. The
 * plan is a pure function of the range table, so every rank computes the
 * same one without more communication; an interval nobody holds is an
 * error on every rank alike. For a full state dict rank 0 takes every
 * interval it holds itself (no transfer), the rest as above.
 *
 * The index (index.json) lists the files with their size and CRC-32C
 * ("crc32c"; checkpoints written before it have zlib's CRC-32, "crc32"), and
 * each tensor's dtype, global shape and chunks {file, lo, hi, key}: the
 * element range and the 1-D tensor `key` in that file that holds it.
 * Chunks are flat (row-major) element ranges, which is what flat-buffer
 * sharding produces; a later placement (a dim-1 shard of a distributed
 * tensor) adds a field to a chunk, and readers refuse fields they do not
 * know, so an old reader never misreads a new checkpoint.
 *
 * Reading opens files lazily, checks a file's size and checksum once (before
 * the first read from it, or as dt_ckpt_read_batch reads it), and reads
 * exactly the bytes of the intersection.
 *
 * Agreement: every step that can fail on one rank is followed by a
 * collective that carries the status, so all ranks return the same status
 * and none waits for a rank that gave up.
 *
 * Slow disks. The disk work of a collective save (each rank's file, rank
 * 0's index and rename) runs on a helper thread while the calling thread
 * joins a loop of one-number all-reduces with the group until every rank's
 * part is done (run_polled). No rank ever sits in one collective for as
 * long as another rank's disk takes, so a write slower than the collective
 * timeout ($DT_COMM_TIMEOUT) does not fail the save or the job (the trainer's
 * replicated saves wait the same way). */
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define INDEX_NAME "index.json"
#define INDEX_FORMAT "dtrain-checkpoint"
#define INDEX_VERSION 1

dt_ckpt_save_params dt_ckpt_save_params_default(void)
{
    dt_ckpt_save_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static uint64_t entry_numel(const dt_ckpt_entry *e)
{
    uint64_t n = 1;
    for (int d = 0; d < e->ndim; d++)
        n *= (uint64_t)e->shape[d];
    return n;
}

/* One entry on its own: a name, a dtype, a shape whose byte size fits, a
 * range inside it, data for a non-empty range. */
static dt_status entry_check(const char *where, const dt_ckpt_entry *e, size_t i)
{
    if (!e->name || !e->name[0])
        return dt_error(DT_ERR_INVALID_ARG, "%s: entry %zu has no name", where, i);
    if ((unsigned)e->dtype >= DT_DTYPE_COUNT || e->ndim < 0 || e->ndim > DT_MAX_DIMS)
        return dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': bad dtype %d or ndim %d", where, e->name, (int)e->dtype,
                        e->ndim);
    double bytes = (double)dt_dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0)
            return dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': dimension %d is negative", where, e->name, d);
        bytes *= (double)e->shape[d];
    }
    if (bytes > 9007199254740992.0)
        return dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s' is too large", where, e->name);
    uint64_t n = entry_numel(e);
    if (e->lo > e->hi || e->hi > n)
        return dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s': range [%llu, %llu) is not inside its %llu elements",
                        where, e->name, (unsigned long long)e->lo, (unsigned long long)e->hi, (unsigned long long)n);
    if (e->hi > e->lo && !e->data)
        return dt_error(DT_ERR_NULL, "%s: tensor '%s': no data for range [%llu, %llu)", where, e->name,
                        (unsigned long long)e->lo, (unsigned long long)e->hi);
    return DT_OK;
}

static dt_status entries_check(const char *where, const dt_ckpt_entry *e, size_t n)
{
    if (n && !e)
        return dt_error(DT_ERR_NULL, "%s: NULL entries", where);
    for (size_t i = 0; i < n; i++) {
        dt_status st = entry_check(where, &e[i], i);
        if (st < 0)
            return st;
        for (size_t j = 0; j < i; j++)
            if (strcmp(e[j].name, e[i].name) == 0)
                return dt_error(DT_ERR_INVALID_ARG, "%s: tensor '%s' is listed twice", where, e[i].name);
    }
    return DT_OK;
}

/* What all ranks must agree on: names, dtypes, shapes, in order. */
static uint64_t entries_sig(const dt_ckpt_entry *e, size_t n)
{
    uint64_t h = dt_hash64(&n, sizeof n, 0);
    for (size_t i = 0; i < n; i++) {
        h = dt_hash64(e[i].name, strlen(e[i].name) + 1, h);
        int32_t v[2] = {(int32_t)e[i].dtype, e[i].ndim};
        h = dt_hash64(v, sizeof v, h);
        h = dt_hash64(e[i].shape, sizeof(int64_t) * (size_t)e[i].ndim, h);
    }
    return h;
}

/* ---- the plan --------------------------------------------------------------------- */

typedef struct piece {
    uint64_t lo, hi;
    int rank;
    int nth;          /* this rank's nth piece of the tensor (key naming) */
} piece;

typedef struct plan {
    size_t n;
    int world;
    piece **p;        /* p[k][0..np[k]) sorted by lo, tiling [0, numel) */
    size_t *np;
    size_t *count;    /* count[k * world + r]: pieces of tensor k that rank r writes */
} plan;

static void plan_free(plan *pl)
{
    if (pl->p)
        for (size_t k = 0; k < pl->n; k++)
            free(pl->p[k]);
    free(pl->p);
    free(pl->np);
    free(pl->count);
    memset(pl, 0, sizeof *pl);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ranges[(r * n + k) * 2 + {0,1}] = rank r's [lo, hi) of tensor k. */
static dt_status plan_make(const char *where, const dt_ckpt_entry *e, size_t n, int world, const uint64_t *ranges,
                           bool prefer0, plan *pl)
{
    memset(pl, 0, sizeof *pl);
    pl->n = n;
    pl->world = world;
    pl->p = calloc(n ? n : 1, sizeof *pl->p);
    pl->np = calloc(n ? n : 1, sizeof *pl->np);
    pl->count = calloc((n ? n : 1) * (size_t)world, sizeof *pl->count);
    uint64_t *load = calloc((size_t)world, sizeof *load);
    uint64_t *cut = malloc(((size_t)world * 2 + 2) * sizeof *cut);
    dt_status st = DT_OK;
    if (!pl->p || !pl->np || !pl->count || !load || !cut) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        uint64_t numel = entry_numel(&e[k]);
        size_t es = dt_dtype_size(e[k].dtype);
        size_t nc = 0;
        cut[nc++] = 0;
        cut[nc++] = numel;
        for (int r = 0; r < world; r++) {
            const uint64_t *rg = &ranges[((size_t)r * n + k) * 2];
            if (rg[0] < rg[1]) {
                cut[nc++] = rg[0];
                cut[nc++] = rg[1];
            }
        }
        qsort(cut, nc, sizeof *cut, u64_cmp);
        piece *ps = calloc(nc, sizeof *ps);
        if (!ps) {
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
            goto out;
        }
        pl->p[k] = ps;
        size_t m = 0;
        for (size_t c = 0; c + 1 < nc; c++) {
            uint64_t a = cut[c], b = cut[c + 1];
            if (a == b)
                continue;
            int best = -1;
            for (int r = 0; r < world; r++) {
                const uint64_t *rg = &ranges[((size_t)r * n + k) * 2];
                if (rg[0] <= a && b <= rg[1]) {
                    if (prefer0 && r == 0) {
                        best = 0;
                        break;
                    }
                    if (best < 0 || load[r] < load[best])
                        best = r;
                }
            }
            if (best < 0) {
                st = dt_error(DT_ERR_RANGE, "%s: tensor '%s': elements [%llu, %llu) are held by no rank", where,
                              e[k].name, (unsigned long long)a, (unsigned long long)b);
                goto out;
            }
            load[best] += (b - a) * es;
            if (m && ps[m - 1].rank == best && ps[m - 1].hi == a)
                ps[m - 1].hi = b;
            else
                ps[m++] = (piece){.lo = a, .hi = b, .rank = best};
        }
        pl->np[k] = m;
        for (size_t j = 0; j < m; j++)
            ps[j].nth = (int)pl->count[k * (size_t)world + (size_t)ps[j].rank]++;
    }
out:
    free(load);
    free(cut);
    if (st < 0)
        plan_free(pl);
    return st;
}

/* The key of a piece in its rank's file: the tensor's name when the rank
 * writes one piece of it, else name@lo. */
static void piece_key(const plan *pl, size_t k, const piece *p, const char *name, char *buf, size_t cap)
{
    if (pl->count[k * (size_t)pl->world + (size_t)p->rank] == 1)
        snprintf(buf, cap, "%s", name);
    else
        snprintf(buf, cap, "%s@%llu", name, (unsigned long long)p->lo);
}

static void rank_file_name(int r, char *buf, size_t cap)
{
    snprintf(buf, cap, "rank-%05d.safetensors", r);
}

/* Write rank r's pieces (from its entries er) to dir/rank-r.safetensors. */
static dt_status write_rank_file(const char *dir, const plan *pl, int r, const dt_ckpt_entry *er, uint64_t *bytes,
                                 uint32_t *crc)
{
    size_t cnt = 0;
    for (size_t k = 0; k < pl->n; k++)
        cnt += pl->count[k * (size_t)pl->world + (size_t)r];
    dt_st_desc *d = calloc(cnt ? cnt : 1, sizeof *d);
    char **keys = calloc(cnt ? cnt : 1, sizeof *keys);
    const void **src = calloc(cnt ? cnt : 1, sizeof *src);
    char path[4096], fname[64];
    rank_file_name(r, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    dt_st_writer *w = NULL;
    dt_status st = DT_OK;
    if (!d || !keys || !src) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
        goto out;
    }
    size_t i = 0;
    for (size_t k = 0; k < pl->n; k++)
        for (size_t j = 0; j < pl->np[k]; j++) {
            const piece *p = &pl->p[k][j];
            if (p->rank != r)
                continue;
            size_t kl = strlen(er[k].name) + 32;
            if (!(keys[i] = malloc(kl))) {
                st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
                goto out;
            }
            piece_key(pl, k, p, er[k].name, keys[i], kl);
            d[i] = (dt_st_desc){.name = keys[i], .dtype = dt_st_dtype_from(er[k].dtype), .ndim = 1,
                                .shape = {(int64_t)(p->hi - p->lo)}};
            src[i] = (const char *)er[k].data + (p->lo - er[k].lo) * dt_dtype_size(er[k].dtype);
            i++;
        }
    if ((st = dt_st_writer_open(path, d, cnt, NULL, 0, &w)) < 0)
        goto out;
    for (i = 0; i < cnt; i++)
        if ((st = dt_st_writer_write(w, i, src[i], (size_t)d[i].shape[0] * dt_st_dtype_size(d[i].dtype))) < 0)
            goto out;
    *bytes = dt_st_writer_size(w);
    st = dt_st_writer_commit(w, crc);
out:
    dt_st_writer_close(w);
    if (keys)
        for (size_t j = 0; j < cnt; j++)
            free(keys[j]);
    free(keys);
    free(d);
    free(src);
    return st;
}

static dt_status write_index(const char *dir, const plan *pl, const dt_ckpt_entry *e, const dt_ckpt_save_params *p,
                             const uint64_t *bytes, const uint32_t *crc)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, INDEX_NAME);
    cJSON *root = cJSON_CreateObject();
    bool ok = root && cJSON_AddStringToObject(root, "format", INDEX_FORMAT) &&
              cJSON_AddNumberToObject(root, "version", INDEX_VERSION) &&
              cJSON_AddNumberToObject(root, "world", pl->world);
    cJSON *meta = ok ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    ok = ok && meta;
    for (size_t i = 0; ok && p && i < p->nmeta; i++)
        ok = p->meta[i].key && p->meta[i].value && !cJSON_GetObjectItemCaseSensitive(meta, p->meta[i].key) &&
             cJSON_AddStringToObject(meta, p->meta[i].key, p->meta[i].value);
    cJSON *files = ok ? cJSON_AddArrayToObject(root, "files") : NULL;
    ok = ok && files;
    for (int r = 0; ok && r < pl->world; r++) {
        char fname[64];
        rank_file_name(r, fname, sizeof fname);
        cJSON *f = cJSON_CreateObject();
        ok = f && cJSON_AddItemToArray(files, f) && cJSON_AddStringToObject(f, "name", fname) &&
             cJSON_AddNumberToObject(f, "bytes", (double)bytes[r]) && cJSON_AddNumberToObject(f, "crc32c", crc[r]);
    }
    cJSON *tens = ok ? cJSON_AddObjectToObject(root, "tensors") : NULL;
    ok = ok && tens;
    for (size_t k = 0; ok && k < pl->n; k++) {
        cJSON *t = cJSON_CreateObject();
        ok = t && cJSON_AddItemToObject(tens, e[k].name, t) &&
             cJSON_AddStringToObject(t, "dtype", dt_st_dtype_name(dt_st_dtype_from(e[k].dtype)));
        cJSON *sh = ok ? cJSON_AddArrayToObject(t, "shape") : NULL;
        ok = ok && sh;
        for (int d = 0; ok && d < e[k].ndim; d++)
            ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e[k].shape[d]));
        cJSON *ch = ok ? cJSON_AddArrayToObject(t, "chunks") : NULL;
        ok = ok && ch;
        for (size_t j = 0; ok && j < pl->np[k]; j++) {
            const piece *pc = &pl->p[k][j];
            char key[4096 + 32];
            piece_key(pl, k, pc, e[k].name, key, sizeof key);
            cJSON *c = cJSON_CreateObject();
            ok = c && cJSON_AddItemToArray(ch, c) && cJSON_AddNumberToObject(c, "file", pc->rank) &&
                 cJSON_AddNumberToObject(c, "lo", (double)pc->lo) && cJSON_AddNumberToObject(c, "hi", (double)pc->hi) &&
                 cJSON_AddStringToObject(c, "key", key);
        }
    }
    char *txt = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!txt)
        return dt_error(DT_ERR_NO_MEMORY, "%s: cannot build the index (out of memory, or a metadata key given twice)",
                        path);
    dt_status st = dt_file_write_atomic(path, txt, strlen(txt), 0644);
    free(txt);
    return st;
}

/* Remove dir and the regular files in it (a checkpoint has no subdirectories). */
static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[4096];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* A fresh DIR.tmp-XXXXXX beside dir; DT_ERR_STATE when dir exists and may not be replaced. */
static dt_status make_tmpdir(const char *dir, bool overwrite, char *tmp, size_t cap)
{
    struct stat sb;
    if (lstat(dir, &sb) == 0) {
        if (!overwrite)
            return dt_error(DT_ERR_STATE, "checkpoint %s already exists (remove it, or save with overwrite)", dir);
        if (!S_ISDIR(sb.st_mode))
            return dt_error(DT_ERR_STATE, "%s exists and is not a directory", dir);
    }
    if ((size_t)snprintf(tmp, cap, "%s.tmp-XXXXXX", dir) >= cap)
        return dt_error(DT_ERR_INVALID_ARG, "checkpoint path too long: %s", dir);
    if (!mkdtemp(tmp))
        return dt_error(DT_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    chmod(tmp, 0755);
    return DT_OK;
}

/* Test hook: DT_FAULT_CKPT_KILL_COMMIT=1 kills this process (SIGKILL) right
 * after the first rename of a commit that replaces a checkpoint, where a
 * job killed at that moment stops (the tests of an interrupted replace). */
static void fault_kill_commit(void)
{
    int64_t on = 0;
    if (dt_env_int("DT_FAULT_CKPT_KILL_COMMIT", 0, 0, 1, &on) >= 0 && on)
        kill(getpid(), SIGKILL);
}

#ifdef RENAME_EXCHANGE
/* fsync dir's parent directory (a rename there survives a crash). */
static dt_status sync_parent(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    char *slash = strrchr(p, '/');
    if (!slash)
        snprintf(p, sizeof p, ".");
    else if (slash == p)
        p[1] = 0;
    else
        *slash = 0;
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "cannot open directory %s: %s", p, strerror(errno));
    const int r = fsync(fd), e = errno;
    close(fd);
    if (r != 0 && e != EINVAL && e != EROFS)
        return dt_error(DT_ERR_IO, "cannot sync directory %s: %s", p, strerror(e));
    return DT_OK;
}
#endif

/* Move the complete tmp to dir. An old dir is replaced by exchanging the two
 * in one rename (renameat2 RENAME_EXCHANGE): at every instant dir is the old
 * checkpoint or the new one, so a job killed while replacing leaves one
 * complete checkpoint there (and the other in tmp, a stale temporary). Where
 * the filesystem cannot exchange, the old one is moved aside first (dir is
 * then briefly absent: kept in DIR.old-XXXXXX) and removed once the new one
 * is in place. */
static dt_status commit_dir(const char *tmp, const char *dir, bool overwrite)
{
    struct stat sb;
    char old[4096];
    old[0] = 0;
    if (overwrite && lstat(dir, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return dt_error(DT_ERR_STATE, "%s exists and is not a directory", dir);
#ifdef RENAME_EXCHANGE
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
            fault_kill_commit();
            remove_tree(tmp); /* the old checkpoint, now under the temporary name */
            return sync_parent(dir);
        }
        if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
            return dt_error(DT_ERR_IO, "cannot replace %s with %s: %s", dir, tmp, strerror(errno));
#endif
        snprintf(old, sizeof old, "%s.old-XXXXXX", dir);
        if (!mkdtemp(old))
            return dt_error(DT_ERR_IO, "cannot create %s: %s", old, strerror(errno));
        if (rename(dir, old) != 0) {
            dt_status st = dt_error(DT_ERR_IO, "cannot move the old %s aside: %s", dir, strerror(errno));
            rmdir(old);
            return st;
        }
        fault_kill_commit();
    }
    dt_status st = dt_file_rename(tmp, dir);
    if (st < 0) {
        if (old[0])
            rename(old, dir);
        return st;
    }
    if (old[0])
        remove_tree(old);
    return DT_OK;
}

/* ---- saving ----------------------------------------------------------------------- */

/* Test hook: DT_FAULT_CKPT_SLOW_MS=ms makes each rank file's write on rank
 * DT_FAULT_CKPT_SLOW_RANK (default: every rank) take that much longer, as a
 * slow disk would (the slow-save tests). */
static void fault_slow_write(int rank)
{
    int64_t ms = 0, who = -1;
    if (dt_env_int("DT_FAULT_CKPT_SLOW_MS", 0, 0, 3600000, &ms) < 0 || ms == 0 ||
        dt_env_int("DT_FAULT_CKPT_SLOW_RANK", -1, -1, 1 << 20, &who) < 0 || (who >= 0 && who != rank))
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* One rank's disk work in a collective save, run by run_polled. */
typedef struct disk_job {
    dt_status (*fn)(void *);
    void *arg;
    dt_status st;
    char msg[1024];          /* the thread's error message (dt_last_error is per thread) */
    int done;                /* under mu */
    pthread_mutex_t mu;
} disk_job;

static void *disk_thread(void *a)
{
    disk_job *j = a;
    dt_status st = j->fn(j->arg);
    pthread_mutex_lock(&j->mu);
    j->st = st;
    snprintf(j->msg, sizeof j->msg, "%s", st < 0 ? dt_last_error() : "");
    j->done = 1;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* fn(arg) (NULL: nothing to do on this rank) while every rank of pg joins
 * one-number all-reduces until all are done: see "Slow disks" at the top.
 * Returns fn's status (its message set on this thread), or the poll's
 * collective failure in *cst. Without pg (or without a thread) fn runs
 * here. */
static dt_status run_polled(dt_pg *pg, dt_status (*fn)(void *), void *arg, dt_status *cst)
{
    *cst = DT_OK;
    disk_job j = {.fn = fn, .arg = arg, .st = DT_OK};
    pthread_t th;
    bool threaded = false;
    if (fn && pg) {
        pthread_mutex_init(&j.mu, NULL);
        threaded = pthread_create(&th, NULL, disk_thread, &j) == 0;
        if (!threaded)
            pthread_mutex_destroy(&j.mu);
    }
    if (fn && !threaded)
        j.st = fn(arg);
    if (!pg)
        return j.st;
    long wait_ns = 1000 * 1000; /* 1 ms, growing to 20 ms */
    for (;;) {
        int done = 1;
        if (threaded) {
            pthread_mutex_lock(&j.mu);
            done = j.done;
            pthread_mutex_unlock(&j.mu);
        }
        double v = done ? 1.0 : 0.0;
        dt_status st = dt_pg_allreduce(pg, DT_IN_PLACE, &v, 1, DT_F64, DT_REDUCE_SUM);
        if (st < 0) {
            if (threaded) { /* the write still finishes (or fails) on its own */
                pthread_join(th, NULL);
                pthread_mutex_destroy(&j.mu);
            }
            *cst = dt_error(st, "%s", dt_last_error());
            return st;
        }
        if (v >= (double)dt_pg_size(pg))
            break;
        struct timespec ts = {0, wait_ns};
        nanosleep(&ts, NULL);
        wait_ns = wait_ns < 20 * 1000 * 1000 ? 2 * wait_ns : 20 * 1000 * 1000;
    }
    if (threaded) {
        pthread_join(th, NULL);
        pthread_mutex_destroy(&j.mu);
        if (j.st < 0)
            dt_error(j.st, "%s", j.msg);
    }
    return j.st;
}

typedef struct rank_write {
    const char *dir;
    const plan *pl;
    int rank;
    const dt_ckpt_entry *e;
    uint64_t bytes;
    uint32_t crc;
} rank_write;

static dt_status rank_write_fn(void *a)
{
    rank_write *w = a;
    fault_slow_write(w->rank);
    return write_rank_file(w->dir, w->pl, w->rank, w->e, &w->bytes, &w->crc);
}

typedef struct rank0_finish {
    const char *tmp, *dir;
    const plan *pl;
    const dt_ckpt_entry *e;
    const dt_ckpt_save_params *p;
    const uint64_t *bytes;
    const uint32_t *crc;
} rank0_finish;

static dt_status rank0_finish_fn(void *a)
{
    rank0_finish *f = a;
    dt_status st = write_index(f->tmp, f->pl, f->e, f->p, f->bytes, f->crc);
    return st == DT_OK ? commit_dir(f->tmp, f->dir, f->p->overwrite) : st;
}


static dt_status all_i64(dt_pg *pg, int64_t *send, int64_t *recv, size_t count)
{
    if (!pg) {
        memcpy(recv, send, count * sizeof *send);
        return DT_OK;
    }
    return dt_pg_allgather(pg, send, recv, count, DT_I64);
}

dt_status dt_ckpt_save_ranks(const char *dir, const dt_ckpt_entry *const *ranks, int world, size_t n,
                             const dt_ckpt_save_params *p)
{
    if (!dir || !ranks)
        return dt_error(DT_ERR_NULL, "dt_ckpt_save_ranks: NULL %s", !dir ? "dir" : "ranks");
    if (world < 1 || !dir[0])
        return dt_error(DT_ERR_INVALID_ARG, "dt_ckpt_save_ranks: %s", !dir[0] ? "empty dir" : "world < 1");
    dt_ckpt_save_params def = dt_ckpt_save_params_default();
    if (!p)
        p = &def;
    char dbuf[4096];
    dt_status st = dt_path_trim_slashes(dir, dbuf, sizeof dbuf);
    if (st < 0)
        return st;
    dir = dbuf;
    for (int r = 0; r < world; r++) {
        if ((st = entries_check(dir, ranks[r], n)) < 0)
            return dt_error_wrap(st, "rank %d", r);
        if (entries_sig(ranks[r], n) != entries_sig(ranks[0], n))
            return dt_error(DT_ERR_MISMATCH, "%s: rank %d lists other tensors (names, dtypes or shapes) than rank 0",
                            dir, r);
    }
    uint64_t *rg = malloc(((size_t)world * (n ? n : 1) * 2) * sizeof *rg);
    uint64_t *bytes = calloc((size_t)world, sizeof *bytes);
    uint32_t *crc = calloc((size_t)world, sizeof *crc);
    plan pl = {0};
    char tmp[4096];
    tmp[0] = 0;
    if (!rg || !bytes || !crc) {
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", dir);
        goto out;
    }
    for (int r = 0; r < world; r++)
        for (size_t k = 0; k < n; k++) {
            rg[((size_t)r * n + k) * 2] = ranks[r][k].lo;
            rg[((size_t)r * n + k) * 2 + 1] = ranks[r][k].hi;
        }
    if ((st = plan_make(dir, ranks[0], n, world, rg, false, &pl)) < 0)
        goto out;
    if ((st = make_tmpdir(dir, p->overwrite, tmp, sizeof tmp)) < 0) {
        tmp[0] = 0;
        goto out;
    }
    for (int r = 0; r < world; r++)
        if ((st = write_rank_file(tmp, &pl, r, ranks[r], &bytes[r], &crc[r])) < 0)
            goto out;
    if ((st = write_index(tmp, &pl, ranks[0], p, bytes, crc)) < 0)
        goto out;
    st = commit_dir(tmp, dir, p->overwrite);
    if (st == DT_OK)
        tmp[0] = 0;
out:
    if (tmp[0])
        remove_tree(tmp);
    plan_free(&pl);
    free(rg);
    free(bytes);
    free(crc);
    return st;
}

/* Steps 1-2 of a collective save: check, agree on the tensors, gather the
 * range table and make the plan (identical on every rank). */
static dt_status gather_plan(const char *where, const dt_ckpt_entry *e, size_t n, dt_pg *pg, bool prefer0, plan *pl)
{
    int world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    dt_pg_set_label(pg, "checkpoint save"); /* the flight recorder's label */
    dt_status own = entries_check(where, e, n);
    int64_t hdr[3] = {(int64_t)n, own == DT_OK ? (int64_t)(entries_sig(e, n) >> 1) : 0, own};
    int64_t *all = calloc((size_t)world * 3, sizeof *all);
    uint64_t *rg = NULL;
    dt_status st = DT_OK;
    if (!all)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
    if ((st = all_i64(pg, hdr, all, 3)) < 0)
        goto out;
    for (int r = 0; r < world; r++) {
        if (all[r * 3 + 2] < 0) {
            st = own < 0 ? dt_error_wrap(own, "rank %d", rank)
                         : dt_error((dt_status)all[r * 3 + 2], "%s: rank %d cannot save (its error: %s)", where, r,
                                    dt_status_str((dt_status)all[r * 3 + 2]));
            goto out;
        }
        if (all[r * 3] != all[0] || all[r * 3 + 1] != all[1]) {
            st = dt_error(DT_ERR_MISMATCH,
                          "%s: rank %d lists other tensors (%lld entries, or other names, dtypes or shapes) than "
                          "rank 0 (%lld entries)",
                          where, r, (long long)all[r * 3], (long long)all[0]);
            goto out;
        }
    }
    rg = malloc((size_t)world * (n ? n : 1) * 2 * sizeof *rg);
    int64_t *mine = malloc((n ? n : 1) * 2 * sizeof *mine);
    if (!rg || !mine) {
        free(mine);
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        goto out;
    }
    for (size_t k = 0; k < n; k++) {
        mine[2 * k] = (int64_t)e[k].lo;
        mine[2 * k + 1] = (int64_t)e[k].hi;
    }
    st = n ? all_i64(pg, mine, (int64_t *)rg, 2 * n) : DT_OK;
    free(mine);
    if (st < 0)
        goto out;
    st = plan_make(where, e, n, world, rg, prefer0, pl);
out:
    free(all);
    free(rg);
    return st;
}

dt_status dt_ckpt_save(const char *dir, const dt_ckpt_entry *e, size_t n, const dt_ckpt_save_params *p, dt_pg *pg)
{
    if (!dir)
        return dt_error(DT_ERR_NULL, "dt_ckpt_save: NULL dir");
    if (!dir[0]) /* was "cannot rename .tmp-XXXXXX to : No such file or directory", after writing it all */
        return dt_error(DT_ERR_INVALID_ARG, "dt_ckpt_save: empty dir");
    dt_ckpt_save_params def = dt_ckpt_save_params_default();
    if (!p)
        p = &def;
    char dbuf[4096];
    if (dt_path_trim_slashes(dir, dbuf, sizeof dbuf) == DT_OK) /* else too long: make_tmpdir says so on rank 0 */
        dir = dbuf;
    int world = pg ? dt_pg_size(pg) : 1, rank = pg ? dt_pg_rank(pg) : 0;
    plan pl = {0};
    dt_status st = gather_plan(dir, e, n, pg, false, &pl);
    if (st < 0)
        return st;
    /* rank 0 makes the temporary directory and tells the others its name */
    struct {
        int64_t st;
        char name[4096];
    } tmp;
    memset(&tmp, 0, sizeof tmp);
    char msg[512] = "";
    if (rank == 0) {
        tmp.st = make_tmpdir(dir, p->overwrite, tmp.name, sizeof tmp.name);
        if (tmp.st < 0) {
            tmp.name[0] = 0;
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    if (pg && (st = dt_pg_broadcast(pg, &tmp, sizeof tmp, DT_U8, 0)) < 0)
        goto out;
    if (tmp.st < 0) {
        st = rank == 0 ? dt_error((dt_status)tmp.st, "%s", msg)
                       : dt_error((dt_status)tmp.st, "%s: rank 0 could not start the checkpoint", dir);
        goto out;
    }
    /* every rank writes its file, then all learn every size, CRC and status */
    rank_write rw = {.dir = tmp.name, .pl = &pl, .rank = rank, .e = e};
    dt_status cst;
    dt_status wst = run_polled(pg, rank_write_fn, &rw, &cst);
    if (cst < 0) {
        st = cst;
        goto out;
    }
    if (wst < 0)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    uint64_t bytes = rw.bytes;
    uint32_t crc = rw.crc;
    int64_t mine[3] = {wst, (int64_t)bytes, crc}, *all = calloc((size_t)world * 3, sizeof *all);
    uint64_t *ab = calloc((size_t)world, sizeof *ab);
    uint32_t *ac = calloc((size_t)world, sizeof *ac);
    if (!all || !ab || !ac) {
        free(all), free(ab), free(ac);
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", dir);
        goto out; /* the others then fail in the next collective: the group is broken anyway */
    }
    st = all_i64(pg, mine, all, 3);
    int64_t fin = st;
    int bad = -1;
    for (int r = 0; st == DT_OK && r < world; r++) {
        ab[r] = (uint64_t)all[3 * r + 1];
        ac[r] = (uint32_t)all[3 * r + 2];
        if (all[3 * r] < 0 && bad < 0)
            bad = r;
    }
    /* rank 0 writes the index and renames the directory (polled: its disk may be slow too) */
    rank0_finish rf = {.tmp = tmp.name, .dir = dir, .pl = &pl, .e = e, .p = p, .bytes = ab, .crc = ac};
    if (st == DT_OK && bad < 0) {
        dt_status f = run_polled(pg, rank == 0 ? rank0_finish_fn : NULL, &rf, &st);
        if (rank == 0 && st == DT_OK) {
            fin = f;
            if (fin < 0)
                snprintf(msg, sizeof msg, "%s", dt_last_error());
        }
    }
    if (st == DT_OK && rank == 0) {
        if (bad >= 0)
            fin = all[3 * bad];
        if (fin < 0)
            remove_tree(tmp.name);
    }
    free(all), free(ab), free(ac);
    if (st < 0)
        goto out;
    if (pg && (st = dt_pg_broadcast(pg, &fin, 1, DT_I64, 0)) < 0)
        goto out;
    if (fin < 0) {
        if (bad == rank || (bad < 0 && rank == 0))
            st = dt_error((dt_status)fin, "%s", msg);
        else if (bad >= 0)
            st = dt_error((dt_status)fin, "%s: rank %d could not write its file; nothing was saved", dir, bad);
        else
            st = dt_error((dt_status)fin, "%s: rank 0 could not complete the checkpoint; nothing was saved", dir);
    }
out:
    plan_free(&pl);
    return st;
}

dt_status dt_ckpt_save_full(const char *path, const dt_ckpt_entry *e, size_t n, const dt_ckpt_save_params *p,
                            dt_pg *pg)
{
    if (!path)
        return dt_error(DT_ERR_NULL, "dt_ckpt_save_full: NULL path");
    dt_ckpt_save_params def = dt_ckpt_save_params_default();
    if (!p)
        p = &def;
    int rank = pg ? dt_pg_rank(pg) : 0;
    plan pl = {0};
    dt_status st = gather_plan(path, e, n, pg, true, &pl);
    if (st < 0)
        return st;
    int64_t fin = DT_OK;
    char msg[512] = "";
    if (rank == 0) {
        /* rank 0 streams: one piece at a time, received into one buffer */
        dt_st_desc *d = calloc(n ? n : 1, sizeof *d);
        uint64_t maxb = 0;
        for (size_t k = 0; k < n; k++)
            for (size_t j = 0; j < pl.np[k]; j++)
                if (pl.p[k][j].rank != 0) {
                    uint64_t b = (pl.p[k][j].hi - pl.p[k][j].lo) * dt_dtype_size(e[k].dtype);
                    maxb = b > maxb ? b : maxb;
                }
        void *buf = maxb ? malloc(maxb) : NULL;
        dt_st_writer *w = NULL;
        if (!d || (maxb && !buf))
            fin = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory (%llu bytes for the largest piece)", path,
                           (unsigned long long)maxb);
        for (size_t k = 0; d && k < n; k++) {
            d[k].name = e[k].name;
            d[k].dtype = dt_st_dtype_from(e[k].dtype);
            d[k].ndim = e[k].ndim;
            memcpy(d[k].shape, e[k].shape, sizeof d[k].shape);
        }
        if (fin == DT_OK)
            fin = dt_st_writer_open(path, d, n, p->meta, p->nmeta, &w);
        /* keep receiving after an error so the senders are not left waiting */
        for (size_t k = 0; k < n && st == DT_OK; k++) {
            size_t es = dt_dtype_size(e[k].dtype);
            for (size_t j = 0; j < pl.np[k] && st == DT_OK; j++) {
                const piece *pc = &pl.p[k][j];
                uint64_t cnt = pc->hi - pc->lo;
                const void *src;
                if (pc->rank == 0)
                    src = (const char *)e[k].data + (pc->lo - e[k].lo) * es;
                else {
                    st = dt_pg_recv(pg, buf, cnt, e[k].dtype, pc->rank);
                    src = buf;
                }
                if (st == DT_OK && fin == DT_OK)
                    fin = dt_st_writer_write(w, k, src, cnt * es);
            }
        }
        if (st == DT_OK && fin == DT_OK)
            fin = dt_st_writer_commit(w, NULL);
        if (fin < 0)
            snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_st_writer_close(w);
        free(buf);
        free(d);
    } else {
        for (size_t k = 0; k < n && st == DT_OK; k++) {
            size_t es = dt_dtype_size(e[k].dtype);
            for (size_t j = 0; j < pl.np[k] && st == DT_OK; j++) {
                const piece *pc = &pl.p[k][j];
                if (pc->rank == rank)
                    st = dt_pg_send(pg, (const char *)e[k].data + (pc->lo - e[k].lo) * es, pc->hi - pc->lo,
                                    e[k].dtype, 0);
            }
        }
    }
    plan_free(&pl);
    if (st < 0)
        return st;
    if (pg && (st = dt_pg_broadcast(pg, &fin, 1, DT_I64, 0)) < 0)
        return st;
    if (fin < 0)
        return rank == 0 ? dt_error((dt_status)fin, "%s", msg)
                         : dt_error((dt_status)fin, "%s: rank 0 could not write the file; nothing was saved", path);
    return DT_OK;
}
