/* Running the `dtrain` CLI from a test and reading what it printed.
 *
 *     char out[1 << 16];
 *     char cmd[1024];
 *     snprintf(cmd, sizeof cmd, "%s bench matmul --gpt2 2>&1", t_cli());
 *     ASSERT_EQ_INT(t_run_capture(cmd, out, sizeof out), 0);
 *     ASSERT_EQ_INT(t_count(out, "\"correct\":false"), 0);
 */
#ifndef DT_TEST_CLI_UTIL_H
#define DT_TEST_CLI_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The CLI under test: $DT_CLI (CTest sets it), else the build tree's. */
static inline const char *t_cli(void)
{
    const char *p = getenv("DT_CLI");
    return p && *p ? p : DT_BINARY_DIR "/dtrain";
}

/* Run the shell command cmd; what it writes to stdout (add 2>&1 for
 * stderr) into out[0..cap), NUL-terminated, cut at cap - 1 bytes. Returns
 * its exit status, or -1 when it could not be started or did not exit
 * (killed by a signal). */
static inline int t_run_capture(const char *cmd, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t k = fread(out, 1, cap - 1, f);
    out[k] = '\0';
    int st = pclose(f);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Occurrences of needle in hay (overlapping ones too). */
static inline int t_count(const char *hay, const char *needle)
{
    int c = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        c++;
    return c;
}

#endif
