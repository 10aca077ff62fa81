/* `dtrain bench coll` end to end: under `dtrain run -n 2` (and 3), every op
 * and a few dtypes, tiny sizes and 2 iterations, JSON output. Each JSON line
 * must say the result was correct, and there must be one line per (size,
 * memory, placement). This checks the benchmark's own bookkeeping (sizes,
 * in-place forms, verification) as much as the collectives. */
// dt-test-timeout: 180
#include "dtrain/base.h"
#include "cli_util.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>


static char out[1 << 18];

static int run_bench(int n, const char *op, const char *dtype, const char *extra)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout -s KILL 90 %s run -n %d -- %s bench coll --op %s --dtype %s --min 8 "
             "--max 4K --iters 2 --json %s 2>&1",
             t_cli(), n, t_cli(), op, dtype, extra);
    return t_run_capture(cmd, out, sizeof out);
}

static int count(const char *needle) { return t_count(out, needle); }

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

/* Parse output the way scripts written for nccl-tests do: every line not
 * starting with '#' is a row of 13 fields (size count type redop root, then
 * time algbw busbw #wrong out of place and in place); the footer has
 * "# Out of bounds values : 0 OK" and "# Avg bus bandwidth    : X". Checks
 * each row (type, redop, root, count = size / elem, #wrong 0, sizes
 * doubling within a table) and that X is the mean of the busbw columns.
 * Returns the number of rows, or -1 after printing what is wrong. */
static int parse_nccl_table(const char *text, const char *type, const char *redop, int root, size_t elem)
{
    int rows = 0;
    double bw_sum = 0, avg = -1;
    int ok_footer = 0;
    size_t prev = 0;
    char *copy = strdup(text), *save = NULL;
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '[') /* dtrain run's "[0] " prefix */
            line = strchr(line, ' ') ? strchr(line, ' ') + 1 : line;
        if (line[0] == '#') {
            sscanf(line, "# Avg bus bandwidth    : %lf", &avg);
            ok_footer |= !strncmp(line, "# Out of bounds values : 0 OK", 29);
            if (strstr(line, "#wrong"))
                prev = 0; /* a new table */
            continue;
        }
        size_t size, count;
        char ty[32], op[32];
        int rt;
        double t[2], alg[2], bus[2], wrong[2];
        int n = sscanf(line, "%zu %zu %31s %31s %d %lf %lf %lf %lf %lf %lf %lf %lf", &size, &count, ty, op, &rt,
                       &t[0], &alg[0], &bus[0], &wrong[0], &t[1], &alg[1], &bus[1], &wrong[1]);
        if (n != 13 || strcmp(ty, type) || strcmp(op, redop) || rt != root || count * elem != size ||
            wrong[0] != 0 || wrong[1] != 0 || (prev && size != 2 * prev) || !(t[0] > 0 && t[1] > 0)) {
            fprintf(stderr, "bad row (%d fields): '%s'\n", n, line);
            free(copy);
            return -1;
        }
        prev = size;
        bw_sum += bus[0] + bus[1];
        rows++;
    }
    free(copy);
    if (!ok_footer || avg < 0 || (rows && fabs(avg - bw_sum / (2 * rows)) > 0.01 + 1e-3 * avg)) {
        fprintf(stderr, "footer: out-of-bounds line %s, average %g, mean of the rows %g\n",
                ok_footer ? "ok" : "missing", avg, rows ? bw_sum / (2 * rows) : 0);
        return -1;
    }
    return rows;
}

TEST(table_output_and_bad_options)
{
    int rc = run_bench(2, "allgather", "i32", "");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(count("\"correct\":true"), 40);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s bench coll --op frobnicate 2>&1", t_cli());
    ASSERT_EQ_INT(t_run_capture(cmd, out, sizeof out), 2);
    ASSERT_STR_CONTAINS(out, "unknown --op 'frobnicate'");
    /* One rank, no launcher: the self backend, table format. */
    snprintf(cmd, sizeof cmd, "%s bench coll --op allreduce --max 64 --iters 2 2>&1", t_cli());
    ASSERT_EQ_INT(t_run_capture(cmd, out, sizeof out), 0);
    ASSERT_STR_CONTAINS(out, "1 ranks, backend self");
    /* nccl-tests' table: 8..64 = 4 sizes x 2 memories */
    ASSERT_EQ_INT(parse_nccl_table(out, "float", "sum", -1, 4), 8);
}

/* --algo hier with simulated nodes (2 x 2 ranks): the table names the
 * algorithm, parses as nccl-tests', and every point is correct; JSON says
 * "algo":"hier". */
TEST(hierarchical_table)
{
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout -s KILL 90 %s run -n 4 -- %s bench coll --op allreduce --algo hier --min 8 --max 64K "
             "--iters 2 --mem plain 2>&1",
             t_cli(), t_cli());
    int st = t_run_capture(cmd, out, sizeof out);
    if (st)
        fprintf(stderr, "%s\n", out);
    ASSERT_EQ_INT(st, 0);
    ASSERT_STR_CONTAINS(out, "4 ranks, backend shm, algorithm hierarchical (2 nodes, simulated)");
    ASSERT_EQ_INT(parse_nccl_table(out, "float", "sum", -1, 4), 14); /* 8 B .. 64 KiB */
    int rc = run_bench(4, "reduce_scatter", "f32", "--algo hier --mem plain");
    ASSERT_EQ_INT(rc, 0);
    ASSERT_EQ_INT(count("\"algo\":\"hier\""), 20);
    ASSERT_EQ_INT(count("\"correct\":true"), 20);
    unsetenv("DT_SIM_LOCAL_SIZE");
}

int main(void)
{
    RUN(every_op_is_correct_two_ranks);
    RUN(odd_world_and_half_precision);
    RUN(table_output_and_bad_options);
    RUN(hierarchical_table);
    return TEST_REPORT();
}
