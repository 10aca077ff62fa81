/* Files dtrain writes: created without following symlinks, and complete or
 * absent at their final name.
 *
 * Every file starts as a fresh temporary ".NAME.tmp-XXXXXXXX" in the
 * destination's own directory, created with O_CREAT|O_EXCL|O_NOFOLLOW (so
 * nothing planted there, symlink or hard link, is ever opened), and reaches
 * its final name by rename(2), which replaces a directory entry and never
 * writes through one. A symlink already at the final name is refused with a
 * message rather than silently replaced: whoever made it meant something by
 * it; so is anything else there that is not a regular file (a device such
 * as /dev/null, a FIFO, a socket, a directory), which the rename would
 * replace. Same directory = same filesystem, so the rename is atomic; the
 * file is fsynced before it and the directory after it, so after a crash
 * the name holds the old file or the whole new one. */
#include "dtrain/base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

struct dt_file {
    int fd;
    bool committed;
    char *path;     /* final name */
    char *tmp;      /* temporary name (unlinked once committed) */
};

/* Whether a rename may put a new file (dir: a directory) at path: nothing is
 * there, or the same kind of thing. A symlink is refused, and so is anything
 * else: the rename would replace a device such as /dev/null, a FIFO or a
 * socket with the file (as root, /dev/null itself), and a directory cannot
 * take a file's place. */
static dt_status check_replaceable(const char *path, bool dir)
{
    struct stat st;
    if (lstat(path, &st) != 0 || (dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode)))
        return DT_OK;
    if (S_ISLNK(st.st_mode))
        return dt_error(DT_ERR_IO, "%s is a symbolic link; dtrain does not write through symlinks "
                                   "(remove it or choose another name)", path);
    const char *what = S_ISCHR(st.st_mode)    ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISREG(st.st_mode)  ? "a regular file"
                                              : "not a regular file";
    if (S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_IO, "%s is a directory (give a file name)", path);
    if (dir)
        return dt_error(DT_ERR_IO, "%s is %s, not a directory (choose another name)", path, what);
    return dt_error(DT_ERR_IO, "%s is %s; dtrain writes a file whole and renames it into place, which would "
                               "replace it (choose another name)", path, what);
}

dt_status dt_file_check_target(const char *path)
{
    if (!path || !*path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_file_check_target: empty path");
    return check_replaceable(path, false);
}

/* fsync path's directory so that a rename into it survives a crash.
 * Filesystems that cannot sync a directory (EINVAL) are not an error. */
static dt_status sync_dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "cannot open directory %s: %s", dir, strerror(errno));
    int r = fsync(fd);
    int e = errno;
    close(fd);
    if (r != 0 && e != EINVAL && e != EROFS)
        return dt_error(DT_ERR_IO, "cannot sync directory %s: %s", dir, strerror(e));
    return DT_OK;
}

dt_status dt_file_create_excl(const char *path, int mode, int *fd_out)
{
    *fd_out = -1;
    if (!path || !*path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_file_create_excl: empty path");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        struct stat st;
        if (e == EEXIST && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
            return dt_error(DT_ERR_IO, "%s is a symbolic link; dtrain does not write through "
                                       "symlinks (remove it or choose another name)", path);
        return dt_error(DT_ERR_IO, "cannot create %s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return DT_OK;
}

dt_status dt_file_open(const char *path, int mode, dt_file **out)
{
    *out = NULL;
    if (!path || !*path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_file_open: empty path");
    dt_status st = check_replaceable(path, false);
    if (st < 0)
        return st;
    dt_file *f = calloc(1, sizeof *f);
    size_t n = strlen(path);
    char *p = malloc(n + 1), *tmp = malloc(n + 32);
    if (!f || !p || !tmp) {
        free(f), free(p), free(tmp);
        return dt_error(DT_ERR_NO_MEMORY, "out of memory opening %s", path);
    }
    memcpy(p, path, n + 1);
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path + 1) : 0;
    /* Names are not secrets (O_EXCL is what makes this safe); they only have
     * to differ between processes and calls, so a few tries suffice. */
    static _Thread_local uint64_t counter;
    int fd = -1, e = 0;
    for (int attempt = 0; attempt < 64 && fd < 0; attempt++) {
        uint64_t x = dt_hash64(&(uint64_t[3]){dt_time_ns(), (uint64_t)getpid(), ++counter},
                               3 * sizeof(uint64_t), 0x6474726169u);
        snprintf(tmp, n + 32, "%.*s.%s.tmp-%08x", dlen, path, path + dlen, (unsigned)x);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        e = errno;
        if (fd < 0 && e != EEXIST)
            break;
    }
    if (fd < 0) {
        st = dt_error(DT_ERR_IO, "cannot create a temporary file beside %s: %s", path, strerror(e));
        free(f), free(p), free(tmp);
        return st;
    }
    f->fd = fd;
    f->path = p;
    f->tmp = tmp;
    *out = f;
    return DT_OK;
}

int dt_file_fd(const dt_file *f) { return f ? f->fd : -1; }

const char *dt_file_path(const dt_file *f) { return f ? f->path : NULL; }

dt_status dt_file_write(dt_file *f, const void *data, size_t n)
{
    if (!f || f->fd < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_file_write: no open file");
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(f->fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return dt_error(DT_ERR_IO, "cannot write %s: %s", f->path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return DT_OK;
}

dt_status dt_file_commit(dt_file *f)
{
    if (!f || f->fd < 0)
        return dt_error(DT_ERR_INVALID_ARG, "dt_file_commit: no open file");
    if (f->committed)
        return DT_OK;
    if (fsync(f->fd) != 0 && errno != EINVAL)
        return dt_error(DT_ERR_IO, "cannot sync %s: %s", f->path, strerror(errno));
    dt_status st = check_replaceable(f->path, false);
    if (st < 0)
        return st;
    if (rename(f->tmp, f->path) != 0)
        return dt_error(DT_ERR_IO, "cannot rename %s to %s: %s", f->tmp, f->path, strerror(errno));
    f->committed = true;
    return sync_dir_of(f->path);
}

dt_status dt_file_close(dt_file *f)
{
    if (!f)
        return DT_OK;
    dt_status st = DT_OK;
    if (f->fd >= 0 && close(f->fd) != 0 && f->committed)
        st = dt_error(DT_ERR_IO, "cannot close %s: %s", f->path, strerror(errno));
    if (!f->committed)
        unlink(f->tmp);
    free(f->path);
    free(f->tmp);
    free(f);
    return st;
}

dt_status dt_file_write_atomic(const char *path, const void *data, size_t n, int mode)
{
    dt_file *f;
    dt_status st = dt_file_open(path, mode, &f);
    if (st < 0)
        return st;
    if ((st = dt_file_write(f, data, n)) < 0 || (st = dt_file_commit(f)) < 0) {
        dt_file_close(f);
        return st;
    }
    return dt_file_close(f);
}

dt_status dt_file_rename(const char *from, const char *to)
{
    struct stat sf;
    dt_status st = check_replaceable(to, lstat(from, &sf) == 0 && S_ISDIR(sf.st_mode));
    if (st < 0)
        return st;
    if (rename(from, to) != 0)
        return dt_error(DT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
    return sync_dir_of(to);
}

dt_status dt_dir_lock(const char *dir, int *fd)
{
    if (!dir || !*dir || !fd)
        return dt_error(DT_ERR_NULL, "dt_dir_lock: NULL argument");
    *fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (*fd < 0) {
        const int e = errno;
        struct stat sb; /* O_NOFOLLOW | O_DIRECTORY on a link to a directory: ENOTDIR (or ELOOP) */
        const bool link = (e == ELOOP || e == ENOTDIR) && lstat(dir, &sb) == 0 && S_ISLNK(sb.st_mode);
        return dt_error(e == ELOOP || e == ENOTDIR ? DT_ERR_INVALID_ARG : DT_ERR_IO, "%s: %s", dir,
                        link ? "a symlink (not followed)" : e == ENOTDIR ? "not a directory" : strerror(e));
    }
    int rc;
    while ((rc = flock(*fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR)
        ;
    if (rc != 0 && errno == EWOULDBLOCK) {
        close(*fd);
        *fd = -1;
        return dt_error(DT_ERR_STATE, "%s is being written by another job now (it holds the directory's lock)",
                        dir);
    }
    return DT_OK; /* (any other failure: a file system without flock on directories, left unlocked) */
}

/* dt_dir_make into name (path without its trailing slashes); *made: the
 * length of the first level of name this call created (0: none). */
static dt_status make_levels(const char *path, char *name, size_t cap, size_t *made)
{
    *made = 0;
    if (!path || !path[0])
        return dt_error(DT_ERR_INVALID_ARG, "dt_dir_make: %s path", path ? "empty" : "NULL");
    dt_status st = dt_path_trim_slashes(path, name, cap);
    if (st < 0)
        return st;
    /* each missing level in turn; one that exists (or appears meanwhile) is taken as it is */
    for (char *q = name + 1;; q++) {
        const bool end = !*q;
        if (*q != '/' && !end)
            continue;
        *q = 0;
        const int rc = mkdir(name, 0755), e = errno;
        if (rc < 0 && e != EEXIST)
            return dt_error(DT_ERR_IO, "%s: cannot make the directory %s: %s", path, name, strerror(e));
        if (rc == 0 && !*made)
            *made = (size_t)(q - name);
        if (end)
            break;
        *q = '/';
    }
    struct stat sb;
    if (lstat(name, &sb) < 0)
        return dt_error(DT_ERR_IO, "%s: %s", path, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "%s: a symlink (not followed; give the directory itself)", path);
    if (!S_ISDIR(sb.st_mode))
        return dt_error(DT_ERR_INVALID_ARG, "%s: not a directory", path);
    return DT_OK;
}

dt_status dt_dir_make(const char *path)
{
    char name[4096];
    size_t made;
    return make_levels(path, name, sizeof name, &made);
}

dt_status dt_dir_make_parent(const char *path)
{
    if (!path || !path[0])
        return dt_error(DT_ERR_INVALID_ARG, "dt_dir_make_parent: %s path", path ? "empty" : "NULL");
    char par[4096];
    dt_status st = dt_path_trim_slashes(path, par, sizeof par);
    if (st < 0)
        return st;
    char *sl = strrchr(par, '/');
    if (!sl || sl == par) /* "name" or "/name": nothing to make */
        return DT_OK;
    *sl = 0;
    return dt_dir_make(par);
}

struct dt_dir_hold {
    int fd;         /* the directory, open and flock'd (unlocked on a file system without flock on directories) */
    size_t made;    /* the length of the first level of name open made (0: none) */
    char name[4096];
};

dt_status dt_dir_hold_open(const char *dir, dt_dir_hold **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_dir_hold_open: NULL argument");
    *out = NULL;
    dt_dir_hold *h = calloc(1, sizeof *h);
    if (!h)
        return dt_error(DT_ERR_NO_MEMORY, "dt_dir_hold_open: out of memory");
    h->fd = -1;
    dt_status st = make_levels(dir, h->name, sizeof h->name, &h->made);
    if (st >= 0)
        st = dt_dir_lock(h->name, &h->fd);
    if (st < 0) {
        h->made = 0; /* made and then held by another job: the holder's now */
        dt_dir_hold_close(h, false);
        return st;
    }
    *out = h;
    return DT_OK;
}

const char *dt_dir_hold_path(const dt_dir_hold *h) { return h ? h->name : NULL; }

bool dt_dir_hold_same(const dt_dir_hold *h)
{
    struct stat a, b;
    return h && h->fd >= 0 && fstat(h->fd, &a) == 0 && lstat(h->name, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

void dt_dir_hold_close(dt_dir_hold *h, bool remove_made)
{
    if (!h)
        return;
    /* what open made and nothing filled: the directory, then each parent open made (rmdir: only when empty) */
    if (remove_made && h->made && dt_dir_hold_same(h))
        for (char *cut; rmdir(h->name) == 0 && (cut = strrchr(h->name, '/')) && cut > h->name &&
                        (size_t)(cut - h->name) >= h->made;)
            *cut = 0;
    if (h->fd >= 0)
        close(h->fd);
    free(h);
}
