/* Pipeline training of a small GPT (embeddings, 2 blocks, ln_f, the tied
 * head) on 2 pipeline ranks equals single-process training under every
 * schedule (gpipe, 1f1b, interleaved v = 2, zbh1)
 * (pipe_train.h has what is compared and the bound). */
// dt-test-timeout: 120
// dt-test-labels: threads
#include "train/pipe_train.h"

TEST(gpt_every_schedule)
{
    for (int k = 0; k < DT_PIPE_KIND_COUNT; k++)
        run("gpt", (dt_pipe_kind)k, 2, 1, 4);
}

int main(void)
{
    RUN(gpt_every_schedule);
    return TEST_REPORT();
}
