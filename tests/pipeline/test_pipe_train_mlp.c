/* Pipeline training of the MLP zoo model (two units, two stages) equals
 * single-process training under gpipe, 1f1b and zbh1; interleaved needs
 * more units than the MLP has and m % p == 0, refused with the limit named
 * (pipe_train.h has what is compared and the bound). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "pipeline/pipe_train.h"

TEST(mlp_every_schedule)
{
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++)
        if (k != DT_PIPE_INTERLEAVED)
            run("mlp", (dt_pipe_kind)k, 2, 1, 4);
    /* two units cannot make the 4 stages of pp 2 x v 2 */
    run_expect("mlp", DT_PIPE_INTERLEAVED, 2, 1, 4, "2 units cannot make 4 stages");
    /* interleaved's limit: m % p */
    run_expect("gpt", DT_PIPE_INTERLEAVED, 2, 1, 3, "must be a multiple of the pipeline ranks");
}

int main(void)
{
    RUN(mlp_every_schedule);
    return TEST_REPORT();
}
