/* The --metrics file: JSON lines written to PATH.partial while the run
 * lasts, renamed to PATH when it succeeds and removed when it fails, so a
 * file at PATH always holds a finished run. */
#include "train.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

dt_status dt__metrics_open(dt__metrics *m, const char *path)
{
    memset(m, 0, sizeof *m);
    size_t n = strlen(path);
    m->path = malloc(n + 1);
    m->partial = malloc(n + 9);
    if (!m->path || !m->partial) {
        free(m->path);
        free(m->partial);
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(m->path, path, n + 1);
    snprintf(m->partial, n + 9, "%s.partial", path);
    /* A stale PATH from an earlier run must not pass for this run's result. */
    if (unlink(path) != 0 && errno != ENOENT) {
        dt_status st = dt_error(DT_ERR_IO, "--metrics %s: cannot replace it: %s", path, strerror(errno));
        free(m->path);
        free(m->partial);
        m->path = m->partial = NULL;
        return st;
    }
    m->f = fopen(m->partial, "w");
    if (!m->f) {
        dt_status st = dt_error(DT_ERR_IO, "--metrics %s: cannot create %s: %s", path, m->partial,
                                strerror(errno));
        free(m->path);
        free(m->partial);
        m->path = m->partial = NULL;
        return st;
    }
    return DT_OK;
}

dt_status dt__metrics_write(dt__metrics *m, const char *fmt, ...)
{
    if (!m->f)
        return DT_OK;
    va_list ap;
    va_start(ap, fmt);
    fputc('{', m->f);
    vfprintf(m->f, fmt, ap);
    va_end(ap);
    fputs("}\n", m->f);
    if (fflush(m->f) != 0 || ferror(m->f))
        return dt_error(DT_ERR_IO, "--metrics %s: write failed: %s", m->partial, strerror(errno));
    return DT_OK;
}

dt_status dt__metrics_close(dt__metrics *m, bool ok)
{
    dt_status st = DT_OK;
    if (m->f) {
        if (fclose(m->f) != 0 && ok) {
            st = dt_error(DT_ERR_IO, "--metrics %s: %s", m->partial, strerror(errno));
            ok = false;
        }
        m->f = NULL;
        if (ok && rename(m->partial, m->path) != 0) {
            st = dt_error(DT_ERR_IO, "--metrics: cannot rename %s to %s: %s", m->partial, m->path,
                          strerror(errno));
            ok = false;
        }
        if (!ok)
            unlink(m->partial);
    }
    free(m->path);
    free(m->partial);
    m->path = m->partial = NULL;
    return st;
}
