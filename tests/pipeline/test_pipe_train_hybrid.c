/* Pipeline training on 3 stages (GPT, 1f1b and zbh1) and dp 2 x pp 2 on 4
 * ranks (the MLP under 1f1b, the GPT under zbh1: gradients averaged over
 * the replicas once per step, the tied wte summed between stages) equals
 * single-process training on the whole batch
 * (pipe_train.h has what is compared and the bound). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "pipeline/pipe_train.h"

TEST(gpt_three_stages)
{
    run("gpt", DT_PIPE_1F1B, 3, 1, 4);
    run("gpt", DT_PIPE_ZBH1, 3, 1, 8);
}

TEST(dp2_pp2)
{
    run("mlp", DT_PIPE_1F1B, 2, 2, 2);
    run("gpt", DT_PIPE_ZBH1, 2, 2, 4);
}

int main(void)
{
    RUN(gpt_three_stages);
    RUN(dp2_pp2);
    return TEST_REPORT();
}
