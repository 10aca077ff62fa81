/* LoRA adapters saved as Hugging Face PEFT saves them (ckpt.h:
 * dt_lora_save_peft): DIR/adapter_model.safetensors with the adapters'
 * weights under PEFT's keys ("base_model.model." + the model's name, the
 * adapter name "default" left out, metadata format = pt) and
 * DIR/adapter_config.json, LoraConfig.to_dict() with sorted keys. */
#include "base/json_strict.h"
#include "ckpt/ckpt_view.h"
#include "data/tok_regex.h"
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PREFIX "base_model.model."

/* pt's setting key as a JSON value (its own order), else def */
static cJSON *pattern_value(const dt_lora_pattern *pt, const char *key, cJSON *def)
{
    const char *js = dt_lora_pattern_json(pt, key);
    cJSON *v = js ? cJSON_Parse(js) : NULL;
    if (!v)
        return def;
    cJSON_Delete(def);
    return v;
}

/* The adapters' values from m's memory (ck NULL) or from checkpoint ck. */
static dt_status save_peft(const dt_model *m, dt_ckpt *ck, const char *src, const dt_lora_params *p,
                           const char *base_model, const char *dir)
{
    const dt_lora_pattern *pt = dt_lora_pattern_of(p);
    if ((p->layer_rank || p->exclude) && !pt)
        return dt_error(DT_ERR_UNSUPPORTED, "LoRA adapters %s: per-layer settings of a layer_rank or exclude callback "
                        "other than a dt_lora_pattern's have no adapter_config.json form", dir);
    /* the files are never written through a symlink, nor is the directory */
    if (dt_dir_make(dir) < 0)
        return dt_error_wrap(dt_last_status(), "LoRA adapters");
    size_t ne = dt_model_num_entries(m), n = 0;
    dt_st_desc *d = calloc(ne ? ne : 1, sizeof *d);
    size_t *idx = calloc(ne ? ne : 1, sizeof *idx);
    int64_t *cidx = calloc(ne ? ne : 1, sizeof *cidx);
    void *buf = NULL;
    char **names = calloc(ne ? ne : 1, sizeof *names);
    dt_status st = d && idx && cidx && names ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
    bool fan_in_fan_out = false, tied = false;
    for (size_t i = 0; st == DT_OK && i < ne; i++) {
        dt_param_info pi, si;
        dt_model_entry(m, i, &pi);
        /* an adapter, or a parameter of a module to save (in a LoRA model, what trains beside the adapters) */
        const bool adapter = dt_lora_is_adapter(pi.name);
        if (!adapter && pi.is_buffer)
            continue;
        tied |= pi.tied_to >= 0;
        si = pi; /* a tied weight's values: its source's (a checkpoint holds them under that name) */
        if (pi.tied_to >= 0)
            dt_model_entry(m, (size_t)pi.tied_to, &si);
        const bool mag = dt_lora_is_magnitude(pi.name); /* DoRA's [out] */
        int64_t ci = -1;
        dt_ckpt_tensor ct;
        /* from a checkpoint: its full tensor (a tensor-parallel rank holds a slice) */
        int64_t full[DT_MAX_DIMS];
        memcpy(full, pi.shape, sizeof full);
        if (ck && !mag && dt_module_lora(pi.module ? dt_module_parent(pi.module) : NULL)) {
            const dt_lora_hook *h = dt_module_lora(dt_module_parent(pi.module));
            const bool is_a = !strcmp(pi.name + strlen(pi.name) - 14, ".lora_A.weight");
            if (is_a && h->split == 2)
                full[1] = h->in;
            else if (!is_a && h->split == 1)
                full[0] = h->out;
        }
        uint64_t fnum = 1;
        bool fits = ck && (ci = dt_ckpt_find(ck, si.name)) >= 0 && dt_ckpt_tensor_at(ck, (size_t)ci, &ct) >= 0 &&
                    ct.ndim == pi.ndim;
        for (int k = 0; k < pi.ndim; k++) {
            fnum *= (uint64_t)full[k];
            fits = fits && ct.shape[k] == full[k];
        }
        if (ck && (!fits || ct.numel != fnum))
            st = dt_error(DT_ERR_NOT_FOUND, "LoRA adapters %s: checkpoint %s has no tensor '%s' of %llu elements",
                          dir, src, si.name, (unsigned long long)fnum);
        else if (!ck && pi.tp_dim && dt_module_lora(dt_module_parent(pi.module)) &&
                 dt_module_lora(dt_module_parent(pi.module))->ranks > 1)
            st = dt_error(DT_ERR_STATE, "LoRA adapters %s: '%s' is this rank's tensor-parallel slice (save from a "
                          "checkpoint: dt_lora_save_peft_from)", dir, pi.name);
        else if (!ck && !si.tensor)
            st = dt_error(DT_ERR_STATE, "LoRA adapters %s: '%s' has no memory on this rank (a sharded or meta "
                          "model: save from a model that holds its parameters whole)", dir, pi.name);
        size_t l = strlen(PREFIX) + strlen(pi.name) + sizeof ".base_layer";
        if (st == DT_OK && !(names[n] = malloc(l)))
            st = dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
        if (st < 0)
            break;
        dt__lora_peft_name(&pi, names[n], l);
        /* the layer (the name without ".lora_X.weight") is a Conv1D: PEFT's fan_in_fan_out */
        char layer[512];
        snprintf(layer, sizeof layer, "%.*s", (int)dt_lora_layer_len(pi.name), pi.name);
        const dt_module *lm = adapter ? dt_model_find_module(m, layer) : NULL;
        fan_in_fan_out |= lm && (!strcmp(dt_module_type(lm), "Conv1D") || (dt_module_lora(lm) &&
                                                                           dt_module_lora(lm)->weight_in_out));
        d[n] = (dt_st_desc){.name = names[n], .dtype = ck ? ct.dtype : dt_st_dtype_from(pi.dtype), .ndim = pi.ndim};
        memcpy(d[n].shape, full, sizeof full);
        idx[n] = i;
        cidx[n++] = ci;
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
        if (pi.tied_to >= 0)
            dt_model_entry(m, (size_t)pi.tied_to, &pi);
        size_t numel = 1;
        for (int j = 0; j < d[k].ndim; j++)
            numel *= (size_t)d[k].shape[j];
        size_t bytes = numel * dt_st_dtype_size(d[k].dtype);
        if (!ck) {
            st = dt_st_writer_write(w, k, pi.tensor->data, bytes);
            continue;
        }
        void *nb = realloc(buf, bytes ? bytes : 1);
        if (!nb) {
            st = dt_error(DT_ERR_NO_MEMORY, "LoRA adapters %s: out of memory", dir);
            break;
        }
        buf = nb;
        if ((st = dt_ckpt_read(ck, (size_t)cidx[k], 0, numel, buf, true)) >= 0)
            st = dt_st_writer_write(w, k, buf, bytes);
    }
    if (st == DT_OK)
        st = dt_st_writer_commit(w, NULL);
    if (w)
        dt_st_writer_close(w);
    /* adapter_config.json: PEFT's to_dict(), keys sorted */
    if (st == DT_OK) {
        cJSON *c = cJSON_CreateObject(), *targets = cJSON_CreateArray();
        const bool all = dt_lora_targets_all_linear(p->targets);
        for (const char *const *t = p->targets; !all && t && *t; t++)
            cJSON_AddItemToArray(targets, cJSON_CreateString(*t));
        for (size_t e = 0; all && e < dt_model_num_entries(m); e++) { /* PEFT saves what "all-linear" chose */
            dt_param_info pi;
            const size_t sl = sizeof ".lora_A.weight" - 1;
            if (dt_model_entry(m, e, &pi) < 0 || strlen(pi.name) <= sl ||
                strcmp(pi.name + strlen(pi.name) - sl, ".lora_A.weight"))
                continue;
            char layer[1024];
            snprintf(layer, sizeof layer, "%.*s", (int)(strlen(pi.name) - sl), pi.name);
            cJSON_AddItemToArray(targets, cJSON_CreateString(layer));
        }
        cJSON_AddItemToObject(c, "alpha_pattern", pattern_value(pt, "alpha_pattern", cJSON_CreateObject()));
        cJSON_AddNullToObject(c, "auto_mapping");
        if (base_model)
            cJSON_AddStringToObject(c, "base_model_name_or_path", base_model);
        else
            cJSON_AddNullToObject(c, "base_model_name_or_path");
        cJSON_AddStringToObject(c, "bias", p->bias == DT_LORA_BIAS_ALL         ? "all"
                                           : p->bias == DT_LORA_BIAS_LORA_ONLY ? "lora_only"
                                                                               : "none");
        cJSON_AddBoolToObject(c, "ensure_weight_tying", tied); /* a tied weight saved: it trained as one */
        cJSON_AddItemToObject(c, "exclude_modules", pattern_value(pt, "exclude_modules", cJSON_CreateNull()));
        cJSON_AddBoolToObject(c, "fan_in_fan_out", fan_in_fan_out);
        cJSON_AddBoolToObject(c, "inference_mode", true);
        cJSON_AddBoolToObject(c, "init_lora_weights", true);
        cJSON *lpat = cJSON_CreateArray(), *lt = cJSON_CreateArray();
        for (const char *const *s = p->layers_pattern; s && *s; s++)
            cJSON_AddItemToArray(lpat, cJSON_CreateString(*s));
        for (size_t k = 0; p->layers && k < p->nlayers; k++)
            cJSON_AddItemToArray(lt, cJSON_CreateNumber((double)p->layers[k]));
        if (cJSON_GetArraySize(lpat) > 0)
            cJSON_AddItemToObject(c, "layers_pattern", lpat);
        else
            cJSON_AddNullToObject(c, "layers_pattern"), cJSON_Delete(lpat);
        if (cJSON_GetArraySize(lt) > 0)
            cJSON_AddItemToObject(c, "layers_to_transform", lt);
        else
            cJSON_AddNullToObject(c, "layers_to_transform"), cJSON_Delete(lt);
        cJSON_AddNumberToObject(c, "lora_alpha", p->alpha);
        cJSON_AddBoolToObject(c, "lora_bias", false);
        cJSON_AddNumberToObject(c, "lora_dropout", p->dropout);
        cJSON *save = cJSON_CreateArray();
        for (const char *const *s = p->modules_to_save; s && *s; s++)
            cJSON_AddItemToArray(save, cJSON_CreateString(*s));
        if (cJSON_GetArraySize(save) > 0)
            cJSON_AddItemToObject(c, "modules_to_save", save);
        else
            cJSON_AddNullToObject(c, "modules_to_save"), cJSON_Delete(save);
        cJSON_AddStringToObject(c, "peft_type", "LORA");
        cJSON_AddNumberToObject(c, "r", (double)p->r);
        cJSON_AddItemToObject(c, "rank_pattern", pattern_value(pt, "rank_pattern", cJSON_CreateObject()));
        cJSON_AddNullToObject(c, "revision");
        cJSON_AddItemToObject(c, "target_modules", targets);
        cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
        cJSON_AddBoolToObject(c, "use_dora", p->dora);
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
    free(cidx);
    free(buf);
    free(d);
    return st;
}

dt_status dt_lora_save_peft(const dt_model *m, const dt_lora_params *p, const char *base_model, const char *dir)
{
    if (!m || !p || !dir)
        return dt_error(DT_ERR_NULL, "dt_lora_save_peft: NULL argument");
    return save_peft(m, NULL, NULL, p, base_model, dir);
}

dt_status dt_lora_save_peft_from(const dt_model *m, const char *src, const dt_lora_params *p, const char *base_model,
                                 const char *dir)
{
    if (!m || !src || !p || !dir)
        return dt_error(DT_ERR_NULL, "dt_lora_save_peft_from: NULL argument");
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(src, &ck);
    if (st >= 0)
        st = save_peft(m, ck, src, p, base_model, dir);
    dt_ckpt_close(ck);
    return st;
}

dt_status dt_lora_save_peft_check(const char *dir)
{
    if (!dir)
        return dt_error(DT_ERR_NULL, "dt_lora_save_peft_check: NULL argument");
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int k = 0; k < 2; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        dt_status st = dt_file_check_target(path);
        if (st < 0)
            return st;
    }
    return DT_OK;
}

/* ---- reading PEFT's adapter_config.json --------------------------------------- */

static dt_status bad_key(const char *file, const char *key, const char *why)
{
    return dt_error(DT_ERR_UNSUPPORTED, "%s: \"%s\" %s", file, key, why);
}

/* A key that must be absent, null, false, an empty object/list or "none"
 * (PEFT's default) for dtrain to load the adapters as they were trained. */
static bool at_default(const cJSON *v)
{
    return !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || (cJSON_IsObject(v) && !v->child) ||
           (cJSON_IsArray(v) && !v->child) || (cJSON_IsString(v) && !strcmp(v->valuestring, "none"));
}

bool dt__lora_peft_key(const char *key, bool *magnitude)
{
    static const char sfx[] = "." DT_LORA_MAGNITUDE;
    const size_t n = strlen(key), k = sizeof sfx - 1;
    *magnitude = n > k && !strcmp(key + n - k, sfx);
    return *magnitude || dt_lora_is_adapter(key);
}

void dt__lora_peft_name(const dt_param_info *e, char *key, size_t n)
{
    const size_t l = strlen(e->name);
    const bool mag = dt_lora_is_magnitude(e->name);
    /* an adapted layer's own parameter ("L.bias"): PEFT's "L.base_layer.bias" */
    const bool own = !dt_lora_is_adapter(e->name) && e->module && dt_module_find_child(e->module, "lora_A");
    const char *dot = own ? strrchr(e->name, '.') : NULL;
    if (dot)
        snprintf(key, n, PREFIX "%.*s.base_layer%s", (int)(dot - e->name), e->name, dot);
    else
        snprintf(key, n, PREFIX "%.*s", (int)(l - (mag ? 7 : 0)), e->name);
}

bool dt__lora_peft_param(const char *key, char *name, size_t n)
{
    const size_t pl = sizeof PREFIX - 1;
    bool mag;
    if (strncmp(key, PREFIX, pl))
        return false;
    const char *k = key + pl, *b = strstr(k, ".base_layer.");
    if (b && !strchr(b + 12, '.')) /* "L.base_layer.bias": the layer's own "L.bias" */
        snprintf(name, n, "%.*s%s", (int)(b - k), k, b + 11);
    else
        snprintf(name, n, "%s%s", k, dt__lora_peft_key(key, &mag) && mag ? ".weight" : "");
    return true;
}

/* PEFT's keys of an image-text model's adapters as the text model's
 * (dt__lora_peft_view): the vision tower's and the projector's counted and
 * left out, the first of them kept for a message. */
typedef struct peft_names {
    size_t vision, kept;
    char first_vision[512];
} peft_names;

static dt_status peft_name(const char *name, void *ud, char **out)
{
    peft_names *pn = ud;
    const size_t pl = sizeof PREFIX - 1;
    const char *to = NULL;
    size_t skip = 0;
    const dt__mm_part part = strncmp(name, PREFIX, pl) ? DT__MM_NONE : dt__mm_name(name + pl, &to, &skip);
    *out = NULL;
    bool mag;
    if (part == DT__MM_VISION && dt__lora_peft_key(name, &mag)) { /* dtrain has no vision tower to put them on */
        if (pn->vision++ == 0)
            snprintf(pn->first_vision, sizeof pn->first_vision, "%s", name);
        return DT_OK;
    }
    pn->kept++;
    const char *rest = part == DT__MM_LANGUAGE ? name + pl + skip : name;
    if (!(*out = malloc(pl + (to ? strlen(to) : 0) + strlen(rest) + 1)))
        return dt_error(DT_ERR_NO_MEMORY, "out of memory renaming '%s'", name);
    if (part == DT__MM_LANGUAGE)
        sprintf(*out, PREFIX "%s%s", to, rest);
    else
        strcpy(*out, name);
    return DT_OK;
}

dt_status dt__lora_peft_view(dt_ckpt *ck, const char *file, size_t *left_out)
{
    peft_names pn = {0};
    dt_status st = dt__ckpt_rename(ck, peft_name, &pn, "the LoRA adapter");
    if (st >= 0 && pn.kept == 0 && pn.vision > 0)
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: every adapter is on an image-text model's vision tower or "
                      "multi-modal projector ('%s', %zu tensors): dtrain trains the language model only (target "
                      "its layers: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)", file,
                      pn.first_vision, pn.vision);
    if (left_out)
        *left_out = st >= 0 ? pn.vision : 0;
    return st;
}

/* The layer an adapter key of PEFT's names ("base_model.model." LAYER ".lora_A.weight" or ".lora_B.weight") into
 * layer (n bytes); false for any other key. */
static bool adapter_layer(const char *key, char *layer, size_t n)
{
    const size_t pl = sizeof PREFIX - 1, l = strlen(key), sl = sizeof ".lora_A.weight" - 1;
    if (!dt_lora_is_adapter(key) || strncmp(key, PREFIX, pl) || l <= pl + sl || l - pl - sl >= n)
        return false;
    memcpy(layer, key + pl, l - pl - sl);
    layer[l - pl - sl] = '\0';
    return true;
}

/* PEFT's target_modules as a string: a regular expression a layer's whole name must match (re.fullmatch), compiled
 * as \A(?:pattern)\z. A leading ^ and a trailing unescaped $ are dropped: under a whole-name match they match where
 * the anchors do (this engine has neither). The pattern is compiled alone first, so that an error's offset is the
 * pattern's own. */
static dt_status target_regex(const char *file, const char *pat, dt__re **out)
{
    size_t n = strlen(pat), a = pat[0] == '^', bs = 0;
    while (n > a + 1 + bs && pat[n - 2 - bs] == '\\')
        bs++;
    const size_t z = n > a && pat[n - 1] == '$' && bs % 2 == 0; /* "\\$" ends in an escaped backslash, then $ */
    char what[4300], *p = malloc(n + 16);
    if (!p)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    snprintf(what, sizeof what, "%s: \"target_modules\" (a regular expression over layer names%s)", file,
             a ? "; offsets after its leading ^" : "");
    snprintf(p, n + 16, "%.*s", (int)(n - a - z), pat + a);
    dt_status st = dt__re_compile(p, what, out);
    dt__re_free(*out);
    *out = NULL;
    snprintf(p, n + 16, "\\A(?:%.*s)\\z", (int)(n - a - z), pat + a);
    if (st >= 0)
        st = dt__re_compile(p, what, out);
    free(p);
    return st;
}

/* The rank PEFT gives the layer of adapter key `key` (rank_pattern's, else r) into *rl, *why saying where it is set */
static dt_status layer_rank(dt_lora_pattern *pt, const char *key, int64_t r, int64_t *rl, const char **why)
{
    char layer[1024];
    dt_lora_params p = dt_lora_params_default();
    p.r = r;
    dt_lora_pattern_use(pt, &p);
    *rl = r, *why = "\"r\"";
    if (!p.layer_rank || !adapter_layer(key, layer, sizeof layer))
        return DT_OK;
    int64_t k = 0; /* no key: stays 0 */
    float al = 1;
    dt_status st = p.layer_rank(p.layer_ud, layer, &k, &al);
    if (st >= 0 && k > 0)
        *rl = k, *why = "\"rank_pattern\"";
    return st;
}

/* Every adapter in dir/adapter_model.safetensors at rank r: PEFT's loader
 * would refuse the sizes, and a model built at a wrong rank (r 65536 for
 * weights of 16) could need far more memory than the adapters ever held.
 * With re (target_modules as a regular expression): every adapter's layer,
 * in the file's names, matches it whole, and *targets (malloc'd,
 * NULL-terminated) is the adapted layers under dtrain's names, in the
 * file's order: the layers the pattern chose when PEFT built the model.
 * Then the file seen as the text model's adapters (dt__lora_peft_view):
 * *left_out of an image-text model's vision tower, a vision-only file or
 * a key under two names refused before any model is built. */
static dt_status check_adapters(const char *dir, int64_t r, dt_lora_pattern *pt, bool dora, size_t *left_out,
                                const dt__re *re, const char *pat, char ***targets)
{
    char file[4200], layer[1024];
    snprintf(file, sizeof file, "%s/adapter_model.safetensors", dir);
    dt_ckpt *ck = NULL;
    dt__re_scratch sc = {0};
    dt_status st = dt_ckpt_open(file, &ck);
    for (size_t i = 0; st >= 0 && i < dt_ckpt_num_tensors(ck); i++) {
        dt_ckpt_tensor t;
        if ((st = dt_ckpt_tensor_at(ck, i, &t)) < 0)
            break;
        const bool a = strlen(t.name) > 14 && !strcmp(t.name + strlen(t.name) - 14, ".lora_A.weight");
        size_t ms, me;
        int m = 1;
        int64_t rl = r;
        const char *why = "";
        bool mag;
        if (dt__lora_peft_key(t.name, &mag) && mag && (!dora || t.ndim != 1))
            st = dt_error(dora ? DT_ERR_MISMATCH : DT_ERR_FORMAT, "%s: tensor '%s' %s", file, t.name,
                          dora ? "is not one-dimensional (DoRA's magnitudes: one per output feature)"
                               : "holds DoRA magnitudes, but \"use_dora\" in adapter_config.json is not true");
        else if (dt_lora_is_adapter(t.name) && (st = layer_rank(pt, t.name, r, &rl, &why)) >= 0 &&
                 (t.ndim != 2 || t.shape[a ? 0 : 1] != rl))
            st = dt_error(DT_ERR_MISMATCH, "%s: tensor '%s' is not of rank %lld (%s in adapter_config.json): shape "
                          "[%lld, %lld], rank %lld", file, t.name, (long long)rl, why, (long long)t.shape[0],
                          (long long)(t.ndim > 1 ? t.shape[1] : 0), (long long)(t.ndim == 2 ? t.shape[a ? 0 : 1] : 0));
        else if (re && adapter_layer(t.name, layer, sizeof layer) &&
                 (m = dt__re_search(re, &sc, (const unsigned char *)layer, strlen(layer), 0, &ms, &me)) <= 0)
            st = m < 0 ? dt_error(DT_ERR_NO_MEMORY, "%s: out of memory matching target_modules", file)
                       : dt_error(DT_ERR_MISMATCH, "%s: adapter '%s' is on layer '%s', which \"target_modules\" "
                                  "(\"%s\" in adapter_config.json) does not match: the file and its config disagree",
                                  file, t.name, layer, pat);
    }
    dt__re_scratch_free(&sc);
    if (st >= 0)
        st = dt__lora_peft_view(ck, file, left_out);
    /* the adapted layers under dtrain's names: one a lora_A */
    const size_t nt = re && st >= 0 ? dt_ckpt_num_tensors(ck) : 0;
    size_t k = 0;
    if (re && st >= 0 && !(*targets = calloc(nt + 1, sizeof **targets)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    for (size_t i = 0; st >= 0 && i < nt; i++) {
        dt_ckpt_tensor t;
        const size_t l = (st = dt_ckpt_tensor_at(ck, i, &t)) >= 0 ? strlen(t.name) : 0;
        if (l > 14 && !strcmp(t.name + l - 14, ".lora_A.weight") && adapter_layer(t.name, layer, sizeof layer) &&
            !((*targets)[k++] = strdup(layer)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    }
    if (re && st >= 0 && k == 0)
        st = dt_error(DT_ERR_FORMAT, "%s: no LoRA adapter (no key ending in .lora_A.weight)", file);
    dt_ckpt_close(ck);
    return st;
}

/* rank_pattern, alpha_pattern and exclude_modules into out->pattern (none: NULL) */
static dt_status read_patterns(const char *file, const cJSON *c, dt_lora_peft_config *out)
{
    static const char *const keys[] = {"rank_pattern", "alpha_pattern", "exclude_modules"};
    char *js[3] = {NULL, NULL, NULL};
    dt_status st = DT_OK;
    bool any = false;
    for (int i = 0; i < 3 && st >= 0; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, keys[i]);
        if (at_default(v) && !(cJSON_IsString(v) && v->valuestring[0])) /* "none" is a regular expression here */
            continue;
        if (i < 2 ? !cJSON_IsObject(v) : !cJSON_IsString(v) && !cJSON_IsArray(v))
            st = dt_error(DT_ERR_FORMAT, "%s: \"%s\" must be %s", file, keys[i],
                          i < 2 ? "an object of layer name patterns to values" : "a regular expression, a list of "
                          "module names or null");
        else if (!(js[i] = cJSON_PrintUnformatted(v)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
        any = true;
    }
    if (st >= 0 && any && (st = dt_lora_pattern_init(js[0], js[1], js[2], &out->pattern)) < 0)
        st = dt_error_wrap(st, "%s", file);
    for (int i = 0; i < 3; i++)
        cJSON_free(js[i]);
    return st;
}

/* A target_modules entry written as an image-text model's module
 * ("model.language_model.layers.0.self_attn.q_proj") as the text model's
 * ("model.layers.0.self_attn.q_proj"), which dtrain's layers are named;
 * any other as it is. */
static char *text_target(const char *t)
{
    const char *to;
    size_t skip;
    if (dt__mm_name(t, &to, &skip) != DT__MM_LANGUAGE)
        return strdup(t);
    char *s = malloc(strlen(to) + strlen(t + skip) + 1);
    if (s)
        sprintf(s, "%s%s", to, t + skip);
    return s;
}

/* A string or a list of strings (PEFT's layers_pattern) into *out (NULL-terminated, malloc'd); null: NULL */
static dt_status string_list(const char *file, const char *key, const cJSON *v, char ***out)
{
    const int n = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v) && !cJSON_IsArray(v))
        return dt_error(DT_ERR_FORMAT, "%s: \"%s\" must be a name, a list of names or null", file, key);
    if (n == 0)
        return DT_OK;
    if (!(*out = calloc((size_t)n + 1, sizeof **out)))
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
        if (!cJSON_IsString(e) || !e->valuestring[0])
            return dt_error(DT_ERR_FORMAT, "%s: \"%s\"[%d] is not a name", file, key, i);
        if (!((*out)[i] = strdup(e->valuestring)))
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    }
    return DT_OK;
}

/* layers_to_transform (an index, a list of them, or null) and layers_pattern into out (params set by the caller) */
static dt_status read_layers(const char *file, const cJSON *c, dt_lora_peft_config *out)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layers_to_transform");
    const int n = cJSON_IsNumber(lt) ? 1 : cJSON_IsArray(lt) ? cJSON_GetArraySize(lt) : 0;
    if (lt && !cJSON_IsNull(lt) && !cJSON_IsNumber(lt) && !cJSON_IsArray(lt))
        return dt_error(DT_ERR_FORMAT, "%s: \"layers_to_transform\" must be a layer index, a list of them or null",
                        file);
    if (n > 0 && !(out->layers = calloc((size_t)n, sizeof *out->layers)))
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    for (int i = 0; i < n; i++) {
        const cJSON *e = cJSON_IsNumber(lt) ? lt : cJSON_GetArrayItem(lt, i);
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > 1e9 ||
            e->valuedouble != (double)(int64_t)e->valuedouble)
            return dt_error(DT_ERR_FORMAT, "%s: \"layers_to_transform\"[%d] is not a layer index", file, i);
        out->layers[i] = (int64_t)e->valuedouble;
    }
    out->params.nlayers = (size_t)n;
    return string_list(file, "layers_pattern", cJSON_GetObjectItemCaseSensitive(c, "layers_pattern"),
                       &out->layer_patterns);
}

void dt_lora_peft_config_free(dt_lora_peft_config *c)
{
    if (!c)
        return;
    for (char **t = c->target_names; t && *t; t++)
        free(*t);
    for (char **t = c->save_names; t && *t; t++)
        free(*t);
    for (char **t = c->layer_patterns; t && *t; t++)
        free(*t);
    free(c->target_names);
    free(c->save_names);
    free(c->layer_patterns);
    free(c->layers);
    dt_lora_pattern_free(c->pattern);
    c->pattern = NULL;
    c->target_names = c->save_names = c->layer_patterns = NULL;
    c->layers = NULL;
    c->params.targets = c->params.modules_to_save = c->params.layers_pattern = NULL;
    c->params.layers = NULL;
    c->params.nlayers = 0;
}

dt_status dt_lora_peft_config_read(const char *dir, dt_lora_peft_config *out)
{
    if (!dir || !out)
        return dt_error(DT_ERR_NULL, "dt_lora_peft_config_read: NULL argument");
    memset(out, 0, sizeof *out);
    out->params = dt_lora_params_default();
    char file[4200], *txt = NULL;
    size_t len;
    snprintf(file, sizeof file, "%s/adapter_config.json", dir);
    dt_status st = dt_file_read_all(file, 1 << 20, &txt, &len);
    if (st < 0)
        return st;
    cJSON *c = NULL; /* strict: a key given twice ("r") reads as its last in PEFT, its first in cJSON */
    st = dt__json_parse_strict(txt, len, file, &c);
    free(txt);
    if (st < 0)
        return st;
    if (!cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return dt_error(DT_ERR_FORMAT, "%s: not a JSON object", file);
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(c, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "r");
    const cJSON *al = cJSON_GetObjectItemCaseSensitive(c, "lora_alpha");
    const cJSON *dr = cJSON_GetObjectItemCaseSensitive(c, "lora_dropout");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c, "use_rslora");
    const cJSON *ud = cJSON_GetObjectItemCaseSensitive(c, "use_dora");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(c, "target_modules");
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(c, "base_model_name_or_path");
    /* what dtrain's adapters do not express: refused by name, never dropped */
    static const char *const must_default[] = {"lora_bias", "trainable_token_indices", "use_qalora", "megatron_config",
                                               "target_parameters", "layer_replication", "use_bdlora"};
    if (!cJSON_IsString(pt))
        st = dt_error(DT_ERR_FORMAT, "%s: no \"peft_type\" string (PEFT writes \"LORA\")", file);
    else if (strcmp(pt->valuestring, "LORA"))
        st = dt_error(DT_ERR_UNSUPPORTED, "%s: \"peft_type\" is \"%s\": only LORA adapters load", file,
                      pt->valuestring);
    for (size_t i = 0; st >= 0 && i < sizeof must_default / sizeof must_default[0]; i++)
        if (!at_default(cJSON_GetObjectItemCaseSensitive(c, must_default[i])))
            st = bad_key(file, must_default[i], "is set: dtrain's LoRA has plain or DoRA adapters on every target "
                         "layer it selects (no adapter biases, trainable tokens or other layer kinds)");
    if (st >= 0)
        st = read_patterns(file, c, out);
    if (st >= 0 && (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 65536 ||
                    r->valuedouble != (double)(int64_t)r->valuedouble))
        st = dt_error(DT_ERR_FORMAT, "%s: \"r\" must be an integer in 1..65536", file);
    if (st >= 0 && (!cJSON_IsNumber(al) || !(al->valuedouble > 0)))
        st = dt_error(DT_ERR_FORMAT, "%s: \"lora_alpha\" must be a number > 0", file);
    if (st >= 0 && dr && !(cJSON_IsNumber(dr) && dr->valuedouble >= 0 && dr->valuedouble < 1))
        st = dt_error(DT_ERR_FORMAT, "%s: \"lora_dropout\" must be a number in [0, 1)", file);
    if (st >= 0 && rs && !cJSON_IsBool(rs))
        st = dt_error(DT_ERR_FORMAT, "%s: \"use_rslora\" must be true or false", file);
    if (st >= 0 && ud && !cJSON_IsBool(ud) && !cJSON_IsNull(ud))
        st = dt_error(DT_ERR_FORMAT, "%s: \"use_dora\" must be true or false", file);
    if (st >= 0)
        st = read_layers(file, c, out);
    const cJSON *bi = cJSON_GetObjectItemCaseSensitive(c, "bias");
    if (st >= 0 && bi && !cJSON_IsNull(bi) &&
        !(cJSON_IsString(bi) && (!strcmp(bi->valuestring, "none") || !strcmp(bi->valuestring, "all") ||
                                 !strcmp(bi->valuestring, "lora_only"))))
        st = dt_error(DT_ERR_FORMAT, "%s: \"bias\" must be \"none\", \"all\" or \"lora_only\"", file);
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "modules_to_save");
    if (st >= 0 && ms && !cJSON_IsNull(ms) && !cJSON_IsArray(ms))
        st = dt_error(DT_ERR_FORMAT, "%s: \"modules_to_save\" must be a list of module names or null", file);
    const int nms = st >= 0 && cJSON_IsArray(ms) ? cJSON_GetArraySize(ms) : 0;
    if (nms > 0 && !(out->save_names = calloc((size_t)nms + 1, sizeof *out->save_names)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    for (int i = 0; st >= 0 && i < nms; i++) {
        const cJSON *e = cJSON_GetArrayItem(ms, i);
        if (!cJSON_IsString(e) || !e->valuestring[0])
            st = dt_error(DT_ERR_FORMAT, "%s: \"modules_to_save\"[%d] is not a module name", file, i);
        else if (!(out->save_names[i] = text_target(e->valuestring)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    }
    const bool all = cJSON_IsString(tm) && !strcmp(tm->valuestring, "all-linear"); /* a hand-written config's */
    dt__re *re = NULL; /* target_modules as a regular expression: the layers are the file's */
    if (st >= 0 && cJSON_IsString(tm) && !all)
        st = target_regex(file, tm->valuestring, &re);
    else if (st >= 0 && !all && (!cJSON_IsArray(tm) || !tm->child))
        st = dt_error(DT_ERR_FORMAT, "%s: \"target_modules\" must be a non-empty list of layer names, \"all-linear\" "
                      "or a regular expression", file);
    int n = st >= 0 && !re ? (all ? 1 : cJSON_GetArraySize(tm)) : 0;
    if (st >= 0 && !re && !(out->target_names = calloc((size_t)n + 1, sizeof *out->target_names)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    for (int i = 0; st >= 0 && i < n; i++) {
        const cJSON *e = all ? tm : cJSON_GetArrayItem(tm, i);
        if (!cJSON_IsString(e) || !e->valuestring[0])
            st = dt_error(DT_ERR_FORMAT, "%s: \"target_modules\"[%d] is not a layer name", file, i);
        else if (!(out->target_names[i] = text_target(e->valuestring)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", file);
    }
    if (st >= 0)
        st = check_adapters(dir, (int64_t)r->valuedouble, out->pattern, cJSON_IsTrue(ud), &out->left_out, re,
                            re ? tm->valuestring : NULL, &out->target_names);
    dt__re_free(re);
    if (st >= 0) {
        out->params.r = (int64_t)r->valuedouble;
        out->params.alpha = (float)al->valuedouble;
        out->params.dropout = dr ? (float)dr->valuedouble : 0.0f;
        out->params.rslora = cJSON_IsTrue(rs);
        out->params.dora = cJSON_IsTrue(ud);
        out->params.bias = !cJSON_IsString(bi)                ? DT_LORA_BIAS_NONE
                           : !strcmp(bi->valuestring, "all")       ? DT_LORA_BIAS_ALL
                           : !strcmp(bi->valuestring, "lora_only") ? DT_LORA_BIAS_LORA_ONLY
                                                                   : DT_LORA_BIAS_NONE;
        out->params.modules_to_save = (const char *const *)out->save_names;
        out->params.layers = out->layers;
        out->params.layers_pattern = (const char *const *)out->layer_patterns;
        out->params.targets = (const char *const *)out->target_names;
        dt_lora_pattern_use(out->pattern, &out->params);
        if (cJSON_IsString(bm))
            snprintf(out->base_model, sizeof out->base_model, "%s", bm->valuestring);
    } else {
        dt_lora_peft_config_free(out);
    }
    cJSON_Delete(c);
    return st;
}
