/* Read-only whole-file maps (mapfile.h). The map is private and read-only,
 * so a reader can never modify the file; the fd stays open for
 * dt__map_check (one fstat per check), closed with the map. */
#include "mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

dt_status dt__map_open(const char *path, const char *what, dt__map *m)
{
    memset(m, 0, sizeof *m);
    if (!path)
        return dt_error(DT_ERR_INVALID_ARG, "%s: no path given", what);
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return dt_error(DT_ERR_IO, "%s %s: cannot open: %s", what, path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return dt_error(DT_ERR_IO, "%s %s: cannot stat: %s", what, path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return dt_error(DT_ERR_IO, "%s %s: not a regular file", what, path);
    }
    if (sb.st_size > 0) {
        char *name = strdup(path);
        void *p = name ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            free(name);
            return name ? dt_error(DT_ERR_IO, "%s %s: cannot map: %s", what, path, strerror(e))
                        : dt_error(DT_ERR_NO_MEMORY, "%s %s: out of memory", what, path);
        }
        m->data = p;
        m->size = (size_t)sb.st_size;
        m->fd = fd;
        m->path = name;
        m->what = what;
        return DT_OK;
    }
    close(fd);
    return DT_OK;
}

dt_status dt__map_check(const dt__map *m)
{
    if (!m || !m->data)
        return DT_OK;
    struct stat sb;
    if (fstat(m->fd, &sb) != 0)
        return dt_error(DT_ERR_IO, "%s %s: cannot stat: %s", m->what, m->path, strerror(errno));
    if ((uint64_t)sb.st_size < (uint64_t)m->size)
        return dt_error(DT_ERR_IO, "%s %s was truncated while in use (%lld bytes now, %zu when opened); restore "
                        "it (write a new file and rename it over the old one, never rewrite it in place) and resume "
                        "from the last checkpoint", m->what, m->path, (long long)sb.st_size, m->size);
    return DT_OK;
}

FILE *dt__fopen_regular(const char *path, const char **why)
{
    int fd = path ? open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
    if (fd < 0) {
        *why = path ? strerror(errno) : "no path given";
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        *why = strerror(errno);
        close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        *why = S_ISDIR(sb.st_mode) ? "not a regular file (a directory)" : "not a regular file";
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *why = strerror(errno);
        close(fd);
    }
    return f;
}

void dt__map_close(dt__map *m)
{
    if (m && m->data) {
        munmap((void *)m->data, m->size);
        close(m->fd);
        free(m->path);
    }
    if (m)
        memset(m, 0, sizeof *m);
}
