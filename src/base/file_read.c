/* dt_file_read_all: small text files (JSON configs, indexes) read whole. */
#include "dtrain/base.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* path's directory part (without the trailing slashes) into buf: "." for a bare name. */
static void dir_of(const char *path, char *buf, size_t cap)
{
    if (dt_path_trim_slashes(path, buf, cap) < 0) {
        buf[0] = 0;
        return;
    }
    char *s = strrchr(buf, '/');
    if (!s)
        snprintf(buf, cap, ".");
    else if (s == buf)
        buf[1] = 0;
    else
        *s = 0;
}

bool dt_file_hf_cache_link(const char *path, char *out, size_t n)
{
    struct stat sb;
    char snap[4096], snaps[4096], repo[4096], blobs[4200], rb[PATH_MAX], rp[PATH_MAX];
    if (!path || !out || !n || lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode))
        return false;
    dir_of(path, snap, sizeof snap);   /* REPO/snapshots/REV */
    dir_of(snap, snaps, sizeof snaps); /* REPO/snapshots */
    const char *base = strrchr(snaps, '/');
    if (strcmp(base ? base + 1 : snaps, "snapshots"))
        return false;
    dir_of(snaps, repo, sizeof repo);
    snprintf(blobs, sizeof blobs, "%s/blobs", repo);
    if (!realpath(blobs, rb) || !realpath(path, rp))
        return false;
    const size_t l = strlen(rb);
    if (strncmp(rp, rb, l) || rp[l] != '/' || strchr(rp + l + 1, '/') || stat(rp, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        strlen(rp) >= n)
        return false;
    memcpy(out, rp, strlen(rp) + 1);
    return true;
}

dt_status dt_file_read_all(const char *path, size_t max, char **out, size_t *len)
{
    if (!path || !out)
        return dt_error(DT_ERR_NULL, "dt_file_read_all: %s is NULL", path ? "out" : "path");
    *out = NULL;
    if (len)
        *len = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), e = errno;
    char blob[PATH_MAX];
    if (fd < 0 && e == ELOOP && dt_file_hf_cache_link(path, blob, sizeof blob))
        fd = open(blob, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), e = errno; /* the hub cache's own link */
    errno = e;
    if (fd < 0)
        return dt_error(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s", path,
                        errno == ELOOP ? "is a symlink (not followed)" : strerror(errno));
    struct stat sb;
    dt_status st = DT_OK;
    char *buf = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = dt_error(DT_ERR_FORMAT, "%s: not a regular file", path);
    else if ((uint64_t)sb.st_size > max)
        st = dt_error(DT_ERR_FORMAT, "%s: %lld bytes, more than the %zu this reader takes", path,
                      (long long)sb.st_size, max);
    else if (!(buf = malloc((size_t)sb.st_size + 1)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", path);
    size_t got = 0;
    while (st >= 0 && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            st = dt_error(DT_ERR_IO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "short file");
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (st < 0) {
        free(buf);
        return st;
    }
    buf[got] = 0;
    *out = buf;
    if (len)
        *len = got;
    return DT_OK;
}

dt_status dt_path_trim_slashes(const char *path, char *buf, size_t cap)
{
    if (!path || !buf || cap == 0)
        return dt_error(DT_ERR_NULL, "dt_path_trim_slashes: NULL argument");
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    if (n >= cap)
        return dt_error(DT_ERR_INVALID_ARG, "path too long (%zu bytes, at most %zu): %.200s", n, cap - 1, path);
    memcpy(buf, path, n);
    buf[n] = 0;
    return DT_OK;
}
