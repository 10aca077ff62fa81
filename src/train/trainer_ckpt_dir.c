/* Trainer checkpoints: the save directory (ckpt.h layout of trainer_ckpt.c):
 * its step-N checkpoints listed, stale temporaries removed, old ones pruned,
 * the newest (or the newest before a step) found. */
#include "train/train_impl.h"
#include "train/trainer_ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The step of a checkpoint's name as the trainer writes it ("step-" and at
 * least 8 digits, no other leading zero), else -1: the path of step N is
 * then always step-%08d of N, so another spelling ("step-4", a copy named
 * "step-0000000004") is neither taken as latest under a name that does not
 * exist nor pruned. */
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
    char canon[32];
    snprintf(canon, sizeof canon, "step-%08" PRId64, v);
    return strcmp(canon, name) ? -1 : v;
}

/* A complete checkpoint: a directory (not a symlink to one: nothing is
 * found through a link, and --keep never removes through one) that holds a
 * regular index.json. */
static bool is_complete(const char *dir, const char *name)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    if (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return false;
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, INDEX_FILE);
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
 * and those of the writer before it). Called by the directory's owner only
 * (own_dir: it holds the lock, so no live job saves there), whose saves
 * never overlap, so any temporary there when a save starts is stale. */
void dt__ckpt_remove_stale(const char *dir)
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

/* After the save of step `saved`: keep it and the newest keep - 1 complete
 * checkpoints of dir before it (keep 0: all). A checkpoint of a later step
 * is another run's (one resumed from an older checkpoint saves below it) and
 * is left alone: the newest by number is not the one just written, and the
 * one just written is never the one removed. */
void dt__ckpt_prune(const char *dir, int keep, int64_t saved)
{
    int64_t *steps;
    size_t n;
    if (keep <= 0 || list_steps(dir, &steps, &n) != DT_OK)
        return;
    int kept = 1; /* `saved` itself */
    for (size_t i = 0; i < n; i++) { /* newest first */
        if (steps[i] >= saved || kept++ < keep)
            continue;
        char p[4200];
        snprintf(p, sizeof p, "%s/step-%08" PRId64, dir, steps[i]);
        remove_ckpt_dir(p);
    }
    free(steps);
}

/* ---- finding and loading ----------------------------------------------------------------------- */

dt_status dt_trainer_ckpt_before(const char *dir, int64_t below, char *out, size_t n, int64_t *step)
{
    if (!dir || !out || n == 0)
        return dt_error(DT_ERR_NULL, "dt_trainer_ckpt_before: NULL argument");
    out[0] = 0;
    if (step)
        *step = -1;
    int64_t *steps;
    size_t k;
    dt_status st = list_steps(dir, &steps, &k);
    if (st < 0)
        return st;
    for (size_t i = 0; i < k; i++) /* newest first */
        if (steps[i] < below) {
            snprintf(out, n, "%s/step-%08" PRId64, dir, steps[i]);
            if (step)
                *step = steps[i];
            break;
        }
    free(steps);
    return DT_OK;
}

dt_status dt_trainer_ckpt_latest(const char *dir, char *out, size_t n)
{
    if (!dir || !out || n == 0)
        return dt_error(DT_ERR_NULL, "dt_trainer_ckpt_latest: NULL argument");
    return dt_trainer_ckpt_before(dir, INT64_MAX, out, n, NULL);
}

