/* Private to src/parallel/tp/. */
#ifndef DT_TP_IMPL_H
#define DT_TP_IMPL_H

#include "dtrain/tp.h"

/* LoRA on tp.c's ColumnParallelLinear (gather_or_parallel: its
 * gather_output) or RowParallelLinear (its input_is_parallel), weight
 * [in, out] (tp_lora.c). */
dt_status dt__tp_lora_std(dt_module *m, dt_pg *tp, bool column, bool gather_or_parallel);

#endif
