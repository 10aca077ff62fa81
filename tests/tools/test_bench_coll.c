/* `dtrain bench coll` end to end: under `dtrain run -n 2` (and 3), every op
 * and a few dtypes, tiny sizes and 2 iterations, JSON output. Each JSON line
 * must say the result was correct, and there must be one line per (size,
 * memory, placement). This checks the benchmark's own bookkeeping (sizes,
 * in-place forms, verification) as much as the collectives. */
// dt-test-timeout: 180
#include "dtrain/base.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static const char *cli(void)
{
    const char *p = getenv("DT_CLI");
    return p && *p ? p : DT_BINARY_DIR "/dtrain";
}

static char out[1 << 18];

static int run_bench(int n, const char *op, const char *dtype, const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout -s KILL 90 %s run -n %d -- %s bench coll --op %s --dtype %s --min 8 "
             "--max 4K --iters 2 --json %s 2>&1",
             cli(), n, cli(), op, dtype, extra);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t k = fread(out, 1, sizeof out - 1, f);
    out[k] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count(const char *needle)
{
    int c = 0;
    for (const char *p = out; (p = strstr(p, needle)) != NULL; p++)
        c++;
    return c;
}

TEST(every_op_is_correct_two_ranks)
{
    const char *ops[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};
    for (int i = 0; i < 4; i++) {
        int rc = run_bench(2, ops[i], "f32", "");
        if (rc)
            fprintf(stderr, "%s\n", out);
        ASSERT_EQ_INT(rc, 0);
        /* sizes 8..4096 = 10 points, x 2 memories x 2 placements */
        ASSERT_EQ_INT(count("\"correct\":true"), 40);
        ASSERT_EQ_INT(count("\"correct\":false"), 0);
        ASSERT_EQ_INT(count("\"mem\":\"group\""), 20);
        ASSERT_EQ_INT(count("\"inplace\":true"), 20);
        char want[64];
        snprintf(want, sizeof want, "\"op\":\"%s\"", ops[i]);
        ASSERT_EQ_INT(count(want), 40);
        ASSERT(count("[1] {") == 0); /* only rank 0 prints */
    }
}

TEST(odd_world_and_half_precision)
{
    int rc = run_bench(3, "reduce_scatter", "bf16", "--mem group");
    if (rc)
        fprintf(stderr, "%s\n", out);
    ASSERT_EQ_INT(rc, 0);
    ASSERT(count("\"correct\":true") > 0);
    ASSERT_EQ_INT(count("\"correct\":false"), 0);
    ASSERT_EQ_INT(count("\"mem\":\"plain\""), 0);
    ASSERT_EQ_INT(count("\"ranks\":3"), count("\"correct\":true"));
    rc = run_bench(3, "allreduce", "f16", "--mem plain");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(count("\"correct\":false"), 0);
    ASSERT_EQ_INT(count("\"correct\":true"), 20);
}

TEST(table_output_and_bad_options)
{
    int rc = run_bench(2, "allgather", "i32", "");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(count("\"correct\":true"), 40);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench coll --op frobnicate 2>&1", cli());
    FILE *f = popen(cmd, "r");
    ASSERT(f);
    size_t k = fread(out, 1, sizeof out - 1, f);
    out[k] = '\0';
    int st = pclose(f);
    ASSERT_EQ_INT(WEXITSTATUS(st), 2);
    ASSERT_STR_CONTAINS(out, "unknown --op 'frobnicate'");
    /* One rank, no launcher: the self backend, table format. */
    snprintf(cmd, sizeof cmd, "%s bench coll --op allreduce --max 64 --iters 2 2>&1", cli());
    f = popen(cmd, "r");
    ASSERT(f);
    k = fread(out, 1, sizeof out - 1, f);
    out[k] = '\0';
    st = pclose(f);
    ASSERT_EQ_INT(WEXITSTATUS(st), 0);
    ASSERT_STR_CONTAINS(out, "1 ranks, backend self");
    ASSERT_EQ_INT(count("WRONG"), 0);
    /* the header's "ok" column plus 8..64 = 4 sizes x 2 memories */
    ASSERT_EQ_INT(count(" ok |"), 1 + 8);
}

int main(void)
{
    RUN(every_op_is_correct_two_ranks);
    RUN(odd_world_and_half_precision);
    RUN(table_output_and_bad_options);
    return TEST_REPORT();
}
