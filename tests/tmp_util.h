/* A scratch directory per test program, and removing a tree, for tests
 * that write files (checkpoints, run directories). */
#ifndef DT_TEST_TMP_UTIL_H
#define DT_TEST_TMP_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* $TMPDIR (or /tmp)/dt_<name>_XXXXXX, made on the first call and the same
 * path after it; "" when it cannot be made. */
static inline const char *t_tmpdir(const char *name)
{
    static char dir[256];
    if (!dir[0]) {
        const char *b = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/dt_%s_XXXXXX", b && *b ? b : "/tmp", name);
        if (!mkdtemp(dir))
            dir[0] = 0;
    }
    return dir;
}

/* rm -rf p (a warning, not a failure, when it cannot). */
static inline void t_rm_rf(const char *p)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", p);
}

#endif
