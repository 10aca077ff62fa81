/* `dtrain train --hierarchical-allreduce` and AIAK_HIERARCHICAL_ALLREDUCE
 * under `dtrain run -n 3` with nodes simulated (DT_SIM_LOCAL_SIZE=2: nodes
 * of 2 and 1 ranks): the flag turns it on (the run names the nodes it found
 * and trains), AIAK_HIERARCHICAL_ALLREDUCE=0 overrides the flag
 * (environment > command line; with ZeRO-2), and a malformed value is an
 * error naming the variable. That the hierarchical reductions train to the
 * flat ones' parameters is tests/parallel/test_hier_train.c. */
// dt-test-timeout: 240
// dt-test-labels: threads
#include "test.h"
#include "tools/train_cli.h"

#include "dtrain/data.h"

static cli_result g_r;

static void train(const char *env, const char *zero, int hier_flag)
{
    char *cli = getenv("DT_CLI");
    char *args[40] = {"run", "-n", "3", "--", cli, "train", "--model", "convnet", "--limit-train", "30",
                      "--limit-test", "3", "--batch", "5", "--epochs", "1", "--progress", "none",
                      "--threads", "1", "--seed", "3", "--zero", (char *)zero, "--max-steps", "2", NULL};
    int n = 26;
    if (hier_flag)
        args[n++] = "--hierarchical-allreduce";
    args[n] = NULL;
    cli_runv(&g_r, 120, env, args);
}

static double loss_of(const char *out)
{
    const char *p = strstr(out, "[0] train loss");
    p = p ? strstr(p, "): ") : NULL;
    return p ? atof(p + 3) : -1;
}

TEST(flag_env_and_errors)
{
    setenv("DT_SIM_LOCAL_SIZE", "2", 1);
    train(NULL, "0", 1);
    if (g_r.code)
        fprintf(stderr, "%s\n%s\n", g_r.out, g_r.err);
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT_STR_CONTAINS(g_r.out, "[0] hierarchical all-reduce: 2 nodes of unequal size (simulated: DT_SIM_LOCAL_SIZE)");
    ASSERT(loss_of(g_r.out) > 0);

    train("AIAK_HIERARCHICAL_ALLREDUCE=0", "2", 1); /* the environment wins */
    ASSERT_EQ_INT(g_r.code, 0);
    ASSERT(strstr(g_r.out, "hierarchical all-reduce") == NULL);

    train("AIAK_HIERARCHICAL_ALLREDUCE=yes", "0", 0);
    ASSERT_EQ_INT(g_r.code, 2);
    ASSERT_STR_CONTAINS(g_r.err, "AIAK_HIERARCHICAL_ALLREDUCE");

    setenv("DT_SIM_LOCAL_SIZE", "abc", 1); /* bad input (exit 2), named; it was exit 1 as a failed run */
    train(NULL, "0", 1);
    ASSERT_EQ_INT(g_r.code, 2);
    ASSERT_STR_CONTAINS(g_r.err, "DT_SIM_LOCAL_SIZE: 'abc' is not an integer");
    unsetenv("DT_SIM_LOCAL_SIZE");
}

int main(void)
{
    if (!file_exists(dt_data_fashion_mnist_dir())) /* its runs train on Fashion-MNIST */
        DT_TEST_SKIP_ALL_NEED("fashion-mnist", "Fashion-MNIST not installed at %s", dt_data_fashion_mnist_dir());
    RUN(flag_env_and_errors);
    return TEST_REPORT();
}
