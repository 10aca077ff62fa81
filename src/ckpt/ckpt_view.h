/* src/ckpt/ckpt_view.h — a checkpoint seen under other names, and the one
 * naming rule between Gemma 3's image-text model and its language model.
 *
 * An image-text model (Gemma3ForConditionalGeneration) holds a text model
 * (Gemma3ForCausalLM) under other names: its model directory reads as the
 * text model (ckpt_read.c: dt_ckpt_open), and so do PEFT adapters trained
 * on it (lora_peft.c: dt__lora_peft_view). Both rename with dt__mm_name.
 *
 * Layer-internal: ckpt's, and train's for the adapters dt_trainer_load_peft
 * reads. Not installed, not for users. */
#ifndef DTRAIN_CKPT_VIEW_H
#define DTRAIN_CKPT_VIEW_H

#include "dtrain/ckpt.h"

/* The part of an image-text model a tensor or module name belongs to. */
typedef enum dt__mm_part {
    DT__MM_NONE,     /* not an image-text model's name (a text model's: "model.layers.0.mlp...") */
    DT__MM_LANGUAGE, /* its language model's: the text model has it under another name */
    DT__MM_VISION,   /* its vision tower's or its multi-modal projector's: the text model has none */
} dt__mm_part;

/* The part name belongs to; for DT__MM_LANGUAGE the text model's name is
 * *to followed by name + *skip. The language model's body is under
 * "language_model.model." (transformers' files; transformers 4's modules)
 * or "model.language_model." (transformers 5's modules), the text model's
 * "model."; its head under "language_model.lm_head." (transformers 4) or
 * "lm_head.", the text model's "lm_head."; the vision tower and the
 * projector under "vision_tower." / "multi_modal_projector." (files,
 * transformers 4) or the same under "model." (transformers 5). */
dt__mm_part dt__mm_name(const char *name, const char **to, size_t *skip);

/* The name a tensor takes in a view: a malloc'd string in *out, or NULL to
 * leave the tensor out; a negative status stops the renaming. */
typedef dt_status (*dt__ckpt_rename_fn)(const char *name, void *ud, char **out);

/* Rename (or leave out) every tensor of ck by fn (ckpt_read.c). The chunks
 * keep their files' keys, so reads are unchanged. Two tensors that take
 * one name are refused: DT_ERR_FORMAT naming the name (as `what` 'NAME')
 * and both keys. On an error ck is as it was. */
dt_status dt__ckpt_rename(dt_ckpt *ck, dt__ckpt_rename_fn fn, void *ud, const char *what);

/* PEFT's adapter file ck (opened from file, which the messages name) seen
 * as adapters of the text model (lora_peft.c): the keys of an image-text
 * model's language model ("base_model.model.model.language_model.X") take
 * the text model's names ("base_model.model.model.X"), those of its vision
 * tower and projector are left out and counted in *left_out, other keys
 * stay as they are. A file whose every adapter is the vision tower's or
 * the projector's is DT_ERR_UNSUPPORTED naming one; a key under both
 * names DT_ERR_FORMAT (dt__ckpt_rename). */
dt_status dt__lora_peft_view(dt_ckpt *ck, const char *file, size_t *left_out);
/* Whether key is an adapter tensor as PEFT names them: "L.lora_A.weight", "L.lora_B.weight", or DoRA's magnitudes
 * "L.lora_magnitude_vector" (*magnitude; the model's parameter is the key + ".weight"). lora_peft.c. */
bool dt__lora_peft_key(const char *key, bool *magnitude);
/* The key PEFT saves model parameter e under (its adapters, DoRA's magnitudes, the modules to save and the trained
 * biases), into key (n bytes): "base_model.model." + the name, a magnitude's without ".weight", an adapted layer's
 * own parameter ("L.bias") under "L.base_layer.bias". lora_peft.c. */
void dt__lora_peft_name(const dt_param_info *e, char *key, size_t n);
/* The model's parameter name PEFT's key holds (dt__lora_peft_name's inverse) into name (n bytes); false when the key
 * is not under "base_model.model.". lora_peft.c. */
bool dt__lora_peft_param(const char *key, char *name, size_t n);

#endif
