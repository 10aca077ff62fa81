/* The example programs in examples/, run the way their headers say: under
 * `dtrain run` with several ranks. The custom backend example registers its
 * own backend by name through the public registry, routes collectives
 * through it and checks the results itself (exit code 0 only if every
 * check passed on every rank). */
// dt-test-timeout: 120
#include "dtrain/base.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* Run a shell command with a deadline (coreutils timeout), capture stdout. */
static int run_cmd(const char *cmd, char *out, size_t cap)
{
    char full[2048];
    snprintf(full, sizeof full, "timeout -s KILL 60 %s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (!f)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *cli(void)
{
    const char *p = getenv("DT_CLI");
    return p && *p ? p : DT_BINARY_DIR "/dtrain";
}

static char out[1 << 16];

TEST(custom_backend_example_three_ranks)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run -n 3 -- %s/examples/example_custom_backend", cli(),
             DT_BINARY_DIR);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    ASSERT_EQ_INT(rc, 0);
    for (int r = 0; r < 3; r++) {
        char want[96];
        snprintf(want, sizeof want, "[%d] rank %d of 3: custom backend 'trace' ok", r, r);
        ASSERT_STR_CONTAINS(out, want);
        /* The backend saw the operations: its counters are printed at free. */
        snprintf(want, sizeof want, "[%d] trace: rank %d: allreduce", r, r);
        ASSERT_STR_CONTAINS(out, want);
    }
}

TEST(custom_backend_example_one_rank_wraps_self)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/examples/example_custom_backend self", DT_BINARY_DIR);
    int rc = run_cmd(cmd, out, sizeof out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT_STR_CONTAINS(out, "rank 0 of 1: custom backend 'trace' ok (inner self)");
}

TEST(custom_backend_unknown_inner_is_an_error)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/examples/example_custom_backend nosuchbackend", DT_BINARY_DIR);
    int rc = run_cmd(cmd, out, sizeof out);
    ASSERT_EQ_INT(rc, 1);
    ASSERT_STR_CONTAINS(out, "no inner backend 'nosuchbackend'");
}

TEST(allreduce_example_four_ranks)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s run -n 4 -- %s/examples/example_allreduce", cli(), DT_BINARY_DIR);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    ASSERT_EQ_INT(rc, 0);
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "[%d] rank %d of 4", r, r);
        ASSERT_STR_CONTAINS(out, want);
    }
    ASSERT_STR_CONTAINS(out, "average = 2.5, ok");
    ASSERT(!strstr(out, "WRONG"));
}

int main(void)
{
    RUN(custom_backend_example_three_ranks);
    RUN(custom_backend_example_one_rank_wraps_self);
    RUN(custom_backend_unknown_inner_is_an_error);
    RUN(allreduce_example_four_ranks);
    return TEST_REPORT();
}
