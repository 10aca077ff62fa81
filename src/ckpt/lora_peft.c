/* LoRA adapters saved as Hugging Face PEFT saves them (ckpt.h:
 * dt_lora_save_peft): DIR/adapter_model.safetensors with the adapters'
 * weights under PEFT's keys ("base_model.model." + the model's name, the
 * adapter name "default" left out, metadata format = pt) and
 * DIR/adapter_config.json, LoraConfig.to_dict() with sorted keys. */
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PREFIX "base_model.model."

static bool is_adapter(const char *name)
{
    size_t n = strlen(name);
    return (n > 14 && !strcmp(name + n - 14, ".lora_A.weight")) || (n > 14 && !strcmp(name + n - 14, ".lora_B.weight"));
}

dt_status dt_lora_save_peft(const dt_model *m, const dt_lora_params *p, const char *base_model, const char *dir)
{
    if (!m || !p || !dir)
        return dt_error(DT_ERR_NULL, "dt_lora_save_peft: NULL argument");
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return dt_error(DT_ERR_IO, "LoRA adapters %s: cannot make the directory: %s", dir, strerror(errno));
    size_t ne = dt_model_num_entries(m), n = 0;
    dt_st_desc *d = calloc(ne ? ne : 1, sizeof *d);
    size_t *idx = calloc(ne ? ne : 1, sizeof *idx);
    char **names = calloc(ne ? ne : 1, sizeof *names);
    dt_status st = d && idx && names ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
    bool fan_in_fan_out = false;
    for (size_t i = 0; st == DT_OK && i < ne; i++) {
        dt_param_info pi;
        dt_model_entry(m, i, &pi);
        if (!is_adapter(pi.name))
            continue;
        if (!pi.tensor)
            st = dt_error(DT_ERR_STATE, "LoRA adapters %s: '%s' has no memory on this rank (a sharded or meta "
                          "model: save from a model that holds its parameters whole)", dir, pi.name);
        size_t l = strlen(PREFIX) + strlen(pi.name) + 1;
        if (st == DT_OK && !(names[n] = malloc(l)))
            st = dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
        if (st < 0)
            break;
        snprintf(names[n], l, PREFIX "%s", pi.name);
        /* the layer (the name without ".lora_X.weight") is a Conv1D: PEFT's fan_in_fan_out */
        char layer[512];
        snprintf(layer, sizeof layer, "%.*s", (int)(strlen(pi.name) - 14), pi.name);
        const dt_module *lm = dt_model_find_module(m, layer);
        fan_in_fan_out |= lm && !strcmp(dt_module_type(lm), "Conv1D");
        d[n] = (dt_st_desc){.name = names[n], .dtype = dt_st_dtype_from(pi.dtype), .ndim = pi.ndim};
        memcpy(d[n].shape, pi.shape, sizeof pi.shape);
        idx[n++] = i;
    }
    if (st == DT_OK && n == 0)
        st = dt_error(DT_ERR_NOT_FOUND, "LoRA adapters %s: the model has no lora_A/lora_B weights", dir);
    char path[4096];
    dt_st_writer *w = NULL;
    dt_st_kv meta = {"format", "pt"};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st == DT_OK)
        st = dt_st_writer_open(path, d, n, &meta, 1, &w);
    for (size_t k = 0; st == DT_OK && k < n; k++) {
        dt_param_info pi;
        dt_model_entry(m, idx[k], &pi);
        st = dt_st_writer_write(w, k, pi.tensor->data, pi.numel * dt_dtype_size(pi.dtype));
    }
    if (st == DT_OK)
        st = dt_st_writer_commit(w, NULL);
    if (w)
        dt_st_writer_close(w);
    /* adapter_config.json: PEFT's to_dict(), keys sorted */
    if (st == DT_OK) {
        cJSON *c = cJSON_CreateObject(), *targets = cJSON_CreateArray();
        for (const char *const *t = p->targets; t && *t; t++)
            cJSON_AddItemToArray(targets, cJSON_CreateString(*t));
        cJSON_AddItemToObject(c, "alpha_pattern", cJSON_CreateObject());
        cJSON_AddNullToObject(c, "auto_mapping");
        if (base_model)
            cJSON_AddStringToObject(c, "base_model_name_or_path", base_model);
        else
            cJSON_AddNullToObject(c, "base_model_name_or_path");
        cJSON_AddStringToObject(c, "bias", "none");
        cJSON_AddNullToObject(c, "exclude_modules");
        cJSON_AddBoolToObject(c, "fan_in_fan_out", fan_in_fan_out);
        cJSON_AddBoolToObject(c, "inference_mode", true);
        cJSON_AddBoolToObject(c, "init_lora_weights", true);
        cJSON_AddNullToObject(c, "layers_pattern");
        cJSON_AddNullToObject(c, "layers_to_transform");
        cJSON_AddNumberToObject(c, "lora_alpha", p->alpha);
        cJSON_AddBoolToObject(c, "lora_bias", false);
        cJSON_AddNumberToObject(c, "lora_dropout", p->dropout);
        cJSON_AddNullToObject(c, "modules_to_save");
        cJSON_AddStringToObject(c, "peft_type", "LORA");
        cJSON_AddNumberToObject(c, "r", (double)p->r);
        cJSON_AddItemToObject(c, "rank_pattern", cJSON_CreateObject());
        cJSON_AddNullToObject(c, "revision");
        cJSON_AddItemToObject(c, "target_modules", targets);
        cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
        cJSON_AddBoolToObject(c, "use_dora", false);
        cJSON_AddBoolToObject(c, "use_rslora", p->rslora);
        char *txt = cJSON_Print(c);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        st = txt ? dt_file_write_atomic(path, txt, strlen(txt), 0644)
                 : dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
        cJSON_free(txt);
        cJSON_Delete(c);
    }
    for (size_t k = 0; names && k < n; k++)
        free(names[k]);
    free(names);
    free(idx);
    free(d);
    return st;
}
