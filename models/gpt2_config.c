/* GPT-2 configurations dtrain can build (zoo.h dt__gpt2_config_check):
 * kept apart from the model so that hf_config.c's reader (and its fuzz
 * target) checks a config.json's sizes with the builder's own rules. */
#include "zoo.h"

dt_status dt__gpt2_config_check(const dt_gpt2_config *g)
{
    if (g->n_layer < 1 || g->n_head < 1 || g->n_embd < 1 || g->block_size < 1 || g->vocab_size < 1)
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: n_layer, n_head, n_embd, block_size and vocab_size must be >= 1 "
                        "(got %lld, %lld, %lld, %lld, %lld)", (long long)g->n_layer, (long long)g->n_head,
                        (long long)g->n_embd, (long long)g->block_size, (long long)g->vocab_size);
    if (g->n_embd % g->n_head)
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: n_embd %lld is not a multiple of n_head %lld",
                        (long long)g->n_embd, (long long)g->n_head);
    if (g->n_embd / g->n_head > 256)
        return dt_error(DT_ERR_UNSUPPORTED, "gpt2: head size %lld is above the attention kernel's 256",
                        (long long)(g->n_embd / g->n_head));
    if (!(g->dropout >= 0.0f && g->dropout < 1.0f))
        return dt_error(DT_ERR_INVALID_ARG, "gpt2: dropout %g is outside [0, 1)", (double)g->dropout);
    return DT_OK;
}
