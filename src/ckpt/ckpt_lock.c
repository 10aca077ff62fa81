/* The save directory's lock (ckpt.h: dt_ckpt_dir_lock).
 *
 * A save directory belongs to one job at a time: the job that saves there
 * also removes the temporaries a killed save left behind and prunes old
 * checkpoints (--keep), and both would delete a second job's files. The
 * owner holds flock(LOCK_EX) on DIR/.dtrain-lock for as long as it saves
 * there; the kernel drops the lock when the process dies (kill -9
 * included), so a dead job never blocks the next one, and the file's
 * content ("pid P host H") only says who holds it. The lock file is opened
 * with O_NOFOLLOW (a planted symlink is refused, never followed) and is
 * written only once the lock is held: a job that is refused changes
 * nothing in the directory. flock is advisory and per open file: two
 * dt_ckpt_dir_lock_open in one process on the same directory refuse each
 * other too.
 *
 * dt_ckpt_dir_lock_abandon (a job that failed before it saved) removes what
 * open made: the lock file, then the directory if it is empty. Removing a
 * lock file races a job that opened it just before: that job would lock the
 * removed file while a third one creates and locks a new one. So open checks,
 * once it holds the lock, that the name still leads to the file it locked,
 * and starts again when it does not. */
#include "dtrain/ckpt.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_NAME ".dtrain-lock"

struct dt_ckpt_dir_lock {
    int fd;
    char *dir;
    bool made_dir, made_file; /* open created the directory, the lock file */
};

/* Create dir when missing (its parent must exist), never through a symlink;
 * refuse anything but a directory. */
static dt_status make_dir(const char *dir, bool *made)
{
    *made = mkdir(dir, 0755) == 0;
    if (!*made && errno != EEXIST) {
        const int e = errno;
        return dt_error(DT_ERR_IO, "cannot create the checkpoint directory %s: %s%s", dir, strerror(e),
                        e == ENOENT ? " (its parent directory does not exist)" : "");
    }
    /* lstat of "link/" follows the link: look at the name without its trailing slashes */
    char name[4096];
    dt_status st = dt_path_trim_slashes(dir, name, sizeof name);
    if (st < 0)
        return st;
    struct stat sb;
    if (lstat(name, &sb) != 0)
        return dt_error(DT_ERR_IO, "the checkpoint directory %s: %s", dir, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return dt_error(DT_ERR_IO, "the checkpoint directory %s is a symlink (not followed: give the directory "
                        "itself)", dir);
    if (!S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_IO, "the checkpoint directory %s exists and is not a directory", dir);
    return DT_OK;
}

/* The holder's line from the lock file ("pid P host H"), or "another process". */
static void holder_of(int fd, char *out, size_t cap)
{
    char buf[256];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    size_t k = 0;
    for (ssize_t i = 0; i < n && buf[i] != '\n' && k + 1 < sizeof buf; i++)
        if (buf[i] >= 0x20 && buf[i] < 0x7f) /* printable only: it is read back from a file */
            buf[k++] = buf[i];
    buf[k] = 0;
    snprintf(out, cap, "%s", k ? buf : "another process");
}

dt_status dt_ckpt_dir_lock_open(const char *dir, dt_ckpt_dir_lock **out)
{
    if (!dir || !*dir || !out)
        return dt_error(DT_ERR_NULL, "dt_ckpt_dir_lock_open: NULL argument");
    *out = NULL;
    bool made_dir = false, made_file = false;
    dt_status st = make_dir(dir, &made_dir);
    if (st < 0)
        return st;
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, LOCK_NAME) >= sizeof path)
        return dt_error(DT_ERR_INVALID_ARG, "checkpoint directory path too long: %s", dir);
    int fd = -1;
    for (int tries = 0; fd < 0; tries++) {
        made_file = true;
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) {
            made_file = false;
            fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0 && errno == ENOENT && tries < 100)
                continue; /* removed in between by an abandoning job: again */
        }
        if (fd < 0) {
            const int e = errno;
            return dt_error(DT_ERR_IO, "cannot use the checkpoint directory %s: %s: %s%s", dir, path, strerror(e),
                            e == ELOOP ? " (a symlink: not followed)" : "");
        }
        struct stat sb, now;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
            close(fd);
            return dt_error(DT_ERR_IO, "cannot use the checkpoint directory %s: %s is not a regular file", dir, path);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            char who[256];
            holder_of(fd, who, sizeof who);
            close(fd);
            if (e == EWOULDBLOCK)
                return dt_error(DT_ERR_STATE, "the checkpoint directory %s is in use by another job (%s holds %s); "
                                "give each job its own save directory", dir, who, path);
            return dt_error(DT_ERR_IO, "cannot lock the checkpoint directory %s (%s): %s", dir, path, strerror(e));
        }
        /* held: still the file the name leads to? (see the top) */
        if (tries < 100 && (lstat(path, &now) != 0 || now.st_dev != sb.st_dev || now.st_ino != sb.st_ino)) {
            close(fd);
            fd = -1;
        }
    }
    /* held: say who holds it (also proves the directory is writable now) */
    char host[256] = "?", line[400];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    int n = snprintf(line, sizeof line, "pid %ld host %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != (ssize_t)n) {
        const int e = errno;
        close(fd);
        return dt_error(DT_ERR_IO, "cannot write to the checkpoint directory %s (%s): %s", dir, path, strerror(e));
    }
    dt_ckpt_dir_lock *l = calloc(1, sizeof *l);
    if (!l || !(l->dir = strdup(dir))) {
        free(l);
        close(fd);
        return dt_error(DT_ERR_NO_MEMORY, "dt_ckpt_dir_lock_open: out of memory");
    }
    l->fd = fd;
    l->made_dir = made_dir;
    l->made_file = made_file;
    *out = l;
    return DT_OK;
}

const char *dt_ckpt_dir_lock_dir(const dt_ckpt_dir_lock *l) { return l ? l->dir : NULL; }

void dt_ckpt_dir_lock_close(dt_ckpt_dir_lock *l)
{
    if (!l)
        return;
    close(l->fd); /* drops the lock; the file stays (a job about to lock it would start again: see the top) */
    free(l->dir);
    free(l);
}

void dt_ckpt_dir_lock_abandon(dt_ckpt_dir_lock *l)
{
    if (!l)
        return;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", l->dir, LOCK_NAME); /* fitted at open */
    if (l->made_file)
        unlink(path); /* still held: a job that opened it meanwhile finds it gone and starts again */
    if (l->made_dir)
        rmdir(l->dir); /* only when empty: whatever was saved there stays */
    dt_ckpt_dir_lock_close(l);
}
