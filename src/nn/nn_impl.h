/* src/nn/nn_impl.h — module and model internals private to src/nn: hook
 * lists, the forward body and module allocation, on top of the layouts of
 * nn_layer.h (which the library's other layers may read). */
#ifndef DT_NN_IMPL_H
#define DT_NN_IMPL_H

#include "nn/nn_layer.h"

/* Append (fn, ud) with a fresh id from *next_id; remove by id; free. */
dt_status dt__hooks_add(dt__hooks *l, void (*fn)(void), void *ud, dt_hook_id *next_id, dt_hook_id *id);
bool dt__hooks_remove(dt__hooks *l, dt_hook_id id);
void dt__hooks_free(dt__hooks *l);

/* LoRA (lora.c): add the adapters of p to the unbuilt tree under root;
 * whether m is an adapter module (its parameters train under LoRA). */
dt_status dt__lora_apply(dt_module *root, const dt_lora_params *p);
bool dt__lora_param(const dt_module *m);
/* Whether m or a module it is inside is named by one of names (PEFT's modules_to_save: the path is one, or ends in
 * "." + one; paths set). */
bool dt__lora_saved(const dt_module *m, const char *const *names);

/* m's own forward (its replaced forward or its kind's), without hooks or
 * checkpointing: what dt_module_forward runs between the hooks. */
dt_tensor *dt__module_body(dt_ctx *ctx, dt_module *m, dt_tensor *x);
/* The same under activation checkpointing (checkpoint.c): m->ckpt set and
 * grad mode on. */
dt_tensor *dt__module_checkpointed(dt_ctx *ctx, dt_module *m, dt_tensor *x);

/* Allocate a module of a kind with nparam specs (copied). */
dt_module *dt__module_new(dt_nn_kind kind, int nparam, const dt_nn_param_spec *specs);

#endif
