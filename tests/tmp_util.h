/* A scratch directory per test program, and removing a tree, for tests
 * that write files (checkpoints, run directories). */
#ifndef DT_TEST_TMP_UTIL_H
#define DT_TEST_TMP_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A fresh directory $TMPDIR (or /tmp)/dt_<name>_XXXXXX made into buf (cap
 * bytes) at every call: buf, or NULL (buf "") when it cannot be made. The
 * one way tests make scratch directories. */
static inline char *t_mkdtemp(const char *name, char *buf, size_t cap)
{
    const char *b = getenv("TMPDIR");
    int n = snprintf(buf, cap, "%s/dt_%s_XXXXXX", b && *b ? b : "/tmp", name);
    if (n < 0 || (size_t)n >= cap || !mkdtemp(buf)) {
        if (cap)
            buf[0] = 0;
        return NULL;
    }
    return buf;
}

/* One directory per test program: t_mkdtemp on the first call, the same
 * path after it; "" when it cannot be made. */
static inline const char *t_tmpdir(const char *name)
{
    static char dir[256];
    if (!dir[0])
        t_mkdtemp(name, dir, sizeof dir);
    return dir;
}

/* The whole file at path, NUL-terminated (free it), its length in *n (n
 * may be NULL); NULL when it cannot be read. */
static inline char *t_slurp(const char *path, size_t *n)
{
    if (n)
        *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0, got; /* read to the end: /proc files say they are empty */
    char *b = malloc(cap + 1);
    while (b && (got = fread(b + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) {
            char *nb = realloc(b, 2 * cap + 1);
            if (!nb)
                free(b);
            b = nb;
            cap *= 2;
        }
    fclose(f);
    if (b)
        b[len] = 0;
    if (n)
        *n = len;
    return b;
}

/* Write text to dir/name, replacing it: false when it cannot. */
static inline bool t_write_in(const char *dir, const char *name, const char *text)
{
    char p[1024];
    if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, name) >= sizeof p)
        return false;
    FILE *f = fopen(p, "w");
    if (!f)
        return false;
    const bool ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* rm -rf p (a warning, not a failure, when it cannot). */
static inline void t_rm_rf(const char *p)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", p);
}

/* Entries of dir other than "." and ".." (skip_hidden: also none starting
 * with "."); -1 when dir cannot be opened. */
static inline int t_count_entries(const char *dir, bool skip_hidden)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (skip_hidden ? e->d_name[0] != '.' : strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

#endif
