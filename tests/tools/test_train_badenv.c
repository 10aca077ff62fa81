/* Bad DT_* variables are bad input: a 2-rank `dtrain run ... dtrain train`
 * given DT_COMM_TIMEOUT=abc, DT_SHM_HEAP_MB=x, DT_SHM_SPIN=-3 or
 * DT_BACKEND=foo exits 2 (the launcher passes the rank's code on) naming
 * the variable. Under an address-space limit too small for the
 * shared-memory segment, the error names the limit (ulimit -v), the size
 * needed and DT_SHM_HEAP_MB; with a heap that fits, a small MLP trains
 * under the same limit, on one rank and two, with and without --no-eval
 * (the loaders size their batches to the data, and --no-eval makes no test
 * loader). */
// dt-test-timeout: 240
#include "test.h"
#include "tools/train_cli.h"

#include <sys/resource.h>

/* ASan reserves terabytes of address space: no sanitized CLI starts under
 * an address-space limit, so the limit tests run in the release tree. */
#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN() DT_TEST_SKIP("an address-space limit cannot be tested under AddressSanitizer")
#else
#define SKIP_UNDER_ASAN() (void)0
#endif

static char *g_args[] = {"run", "-n", "2", "--", NULL, "train", "--model", "mlp", "--mlp-hidden", "8", "--data",
                         "random", "--random-items", "16", "--batch", "8", "--limit-test", "8", "--progress", "none",
                         "--threads", "1", "--no-eval", NULL};

TEST(bad_dt_variables_exit_2)
{
    g_args[4] = getenv("DT_CLI");
    const char *cases[][2] = {
        {"DT_COMM_TIMEOUT=abc", "DT_COMM_TIMEOUT"},
        {"DT_SHM_HEAP_MB=x", "DT_SHM_HEAP_MB"},
        {"DT_SHM_SPIN=-3", "DT_SHM_SPIN"},
        {"DT_BACKEND=foo", "'foo'"},
    };
    cli_result *r = calloc(1, sizeof *r);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_runv(r, 60, cases[i][0], g_args);
        if (r->code != 2 || !strstr(r->err, cases[i][1]))
            fprintf(stderr, "%s: exit %d\n%s", cases[i][0], r->code, r->err);
        ASSERT_EQ_INT(r->code, 2);
        ASSERT_STR_CONTAINS(r->err, cases[i][1]);
    }
    free(r);
}

/* DT_LOG_LEVEL with an unknown level (DEBUG, loud) was taken as warn with
 * nothing said: said now, once, where the level is first read (here by the
 * warning DT_MAX_CPU_ISA=foo causes); the known levels say nothing. */
TEST(unknown_log_level_is_said)
{
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    setenv("DT_MAX_CPU_ISA", "foo", 1);
    cli_runv(r, 60, "DT_LOG_LEVEL=DEBUG", (char *[]){"info", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "DT_LOG_LEVEL=DEBUG is not one of error, warn, info, debug; ignored (warn)");
    const char *first = strstr(r->err, "DT_LOG_LEVEL");
    ASSERT(first && !strstr(first + 1, "DT_LOG_LEVEL")); /* once */
    ASSERT_STR_CONTAINS(r->err, "DT_MAX_CPU_ISA=foo"); /* still logged at warn */
    cli_runv(r, 60, "DT_LOG_LEVEL=warn", (char *[]){"info", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT(strstr(r->err, "DT_LOG_LEVEL") == NULL);
    unsetenv("DT_MAX_CPU_ISA");
    /* a command that logs nothing (a quiet tiny run) says it too: the level is read at start */
    cli_runv(r, 60, "DT_LOG_LEVEL=bogus",
             (char *[]){"train", "--model", "mlp", "--mlp-dim", "8", "--mlp-hidden", "8", "--random-items", "16",
                        "--batch", "8", "--threads", "1", "--max-steps", "1", "--no-eval", "--progress", "none", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "DT_LOG_LEVEL=bogus is not one of error, warn, info, debug; ignored (warn)");
    first = strstr(r->err, "DT_LOG_LEVEL");
    ASSERT(first && !strstr(first + 1, "DT_LOG_LEVEL")); /* once */
    free(r);
}

/* DT_CONV_LAYOUT with an unknown policy was taken as auto with nothing
 * said (DT_ATTN_AMX and DT_MAX_CPU_ISA warn): said now, once; `dtrain
 * info` reads it for its activation layout line. */
TEST(unknown_conv_layout_is_said)
{
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(r != NULL);
    cli_runv(r, 60, "DT_CONV_LAYOUT=weird", (char *[]){"info", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT_STR_CONTAINS(r->err, "DT_CONV_LAYOUT=weird is not one of plain, blocked, auto; ignored (auto)");
    const char *first = strstr(r->err, "DT_CONV_LAYOUT");
    ASSERT(first && !strstr(first + 1, "DT_CONV_LAYOUT")); /* once */
    cli_runv(r, 60, "DT_CONV_LAYOUT=plain", (char *[]){"info", NULL});
    ASSERT_EQ_INT(r->code, 0);
    ASSERT(strstr(r->err, "DT_CONV_LAYOUT") == NULL);
    free(r);
}

TEST(address_space_limit_named)
{
    SKIP_UNDER_ASAN();
    g_args[4] = getenv("DT_CLI");
    struct rlimit old;
    ASSERT(getrlimit(RLIMIT_AS, &old) == 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < (rlim_t)800000 * 1024)
        DT_TEST_SKIP("the hard address-space limit is already below 800000 KiB");
    struct rlimit lim = {(rlim_t)800000 * 1024, old.rlim_max};
    cli_result *r = calloc(1, sizeof *r);
    ASSERT(setrlimit(RLIMIT_AS, &lim) == 0); /* soft only: restored below */
    cli_runv(r, 60, "DT_SHM_HEAP_MB=1024", g_args);
    setrlimit(RLIMIT_AS, &old);
    if (!strstr(r->err, "ulimit -v"))
        fprintf(stderr, "exit %d\n%s", r->code, r->err);
    ASSERT(r->code != 0);
    ASSERT_STR_CONTAINS(r->err, "ulimit -v");
    ASSERT_STR_CONTAINS(r->err, "DT_SHM_HEAP_MB");
    ASSERT_STR_CONTAINS(r->err, " bytes");
    free(r);
}

TEST(small_mlp_trains_under_address_space_limit)
{
    SKIP_UNDER_ASAN();
    struct rlimit old;
    ASSERT(getrlimit(RLIMIT_AS, &old) == 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < (rlim_t)800000 * 1024)
        DT_TEST_SKIP("the hard address-space limit is already below 800000 KiB");
    struct rlimit lim = {(rlim_t)800000 * 1024, old.rlim_max};
    cli_result *r = calloc(1, sizeof *r);
    for (int k = 0; k < 4; k++) {
        char *args[40];
        int n = 0;
        if (k & 1) {
            args[n++] = "run", args[n++] = "-n", args[n++] = "2", args[n++] = "--", args[n++] = getenv("DT_CLI");
        }
        for (int i = 5; g_args[i]; i++)
            if (strcmp(g_args[i], "--no-eval") || k >= 2)
                args[n++] = g_args[i];
        args[n] = NULL;
        ASSERT(setrlimit(RLIMIT_AS, &lim) == 0);
        cli_runv(r, 120, "DT_SHM_HEAP_MB=64", args);
        setrlimit(RLIMIT_AS, &old);
        if (r->code)
            fprintf(stderr, "case %d (%s, %s): exit %d\n%s", k, k & 1 ? "2 ranks" : "1 rank",
                    k >= 2 ? "--no-eval" : "eval", r->code, r->err);
        ASSERT_EQ_INT(r->code, 0);
    }
    free(r);
}

int main(void)
{
    if (!getenv("DT_CLI"))
        return DT_TEST_SKIP_CODE;
    RUN(bad_dt_variables_exit_2);
    RUN(unknown_log_level_is_said);
    RUN(unknown_conv_layout_is_said);
    RUN(address_space_limit_named);
    RUN(small_mlp_trains_under_address_space_limit);
    cli_cleanup();
    return TEST_REPORT();
}
