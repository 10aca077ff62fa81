/* tests/train/pipe_entries.h — which of a model's entries the stages of
 * this pipeline rank use (dt_pipe_unit_uses over the units of the rank's
 * stages, dt_strategy_pipe_stats), for the tests that compare or inspect
 * exactly those entries (pipe_train.h, test_pipe_stage_memory.c). */
#ifndef DT_TEST_PIPE_ENTRIES_H
#define DT_TEST_PIPE_ENTRIES_H
#include "dtrain/pipe_strategy.h"

#include <stdbool.h>
#include <stdlib.h>

/* A calloc'd array of dt_model_num_entries(m) flags (NULL when something
 * fails: dt_last_error() says what): out[e] is set when a unit of one of
 * the rank's stages uses entry e (buffers never); with storage, a tied
 * entry sets its source's flag instead of its own. */
static inline bool *pipe_rank_entries(const dt_strategy *s, dt_model *m, bool storage)
{
    dt_pipe_stats st;
    dt_pipe_unit *units = NULL;
    int nunits;
    size_t ne = dt_model_num_entries(m);
    bool *out = calloc(ne + 1, sizeof *out);
    if (!out || dt_strategy_pipe_stats(s, &st) < 0 || dt_model_pipe_units(m, &units, &nunits) < 0) {
        free(out);
        return NULL;
    }
    for (size_t e = 0; e < ne; e++) {
        dt_param_info pi;
        if (dt_model_entry(m, e, &pi) < 0) {
            free(out);
            out = NULL;
            break;
        }
        for (int k = 0; k < st.stage_count && !pi.is_buffer; k++)
            for (int u = st.unit_lo[k]; u < st.unit_hi[k]; u++)
                if (dt_pipe_unit_uses(&units[u], pi.name))
                    out[storage && pi.tied_to >= 0 ? (size_t)pi.tied_to : e] = true;
    }
    dt_free(units);
    return out;
}
#endif
