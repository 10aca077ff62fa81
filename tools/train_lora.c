/* The LoRA and --freeze settings a checkpoint keeps (its "dtrain.user"
 * options, keys "lora" and "freeze"), so that `dtrain eval --ckpt`,
 * `dtrain generate --ckpt`, `dtrain ckpt convert --hf` and a resumed
 * `dtrain train` rebuild the model the checkpoint was trained as. */
#include "cmd.h"
#include "train.h"

#include "dtrain/train.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dt__tuning_free(dt__tuning *t)
{
    if (!t)
        return;
    free(t->lora_targets);
    free(t->freeze);
    free(t->target_buf);
    free(t->target_list);
    free(t->lora_save);
    free(t->save_buf);
    free(t->save_list);
    free(t->lora_layers);
    free(t->lora_layers_pattern);
    free(t->pattern_buf);
    free(t->pattern_list);
    free(t->layer_list);
    for (int i = 0; i < 3; i++)
        free(t->lora_pat[i]);
    dt_lora_pattern_free(t->pattern);
    memset(t, 0, sizeof *t);
}

static dt_status dup_str(const cJSON *v, char **out)
{
    *out = NULL;
    if (!cJSON_IsString(v))
        return DT_OK;
    if (!(*out = strdup(v->valuestring)))
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    return DT_OK;
}

static const char *const pat_keys[3] = {"rank_pattern", "alpha_pattern", "exclude_modules"};

dt_status dt__tuning_read(const char *path, dt__tuning *out)
{
    memset(out, 0, sizeof *out);
    char *js = NULL;
    dt_status st = dt_trainer_ckpt_user(path, &js);
    if (st < 0)
        return st;
    cJSON *u = cJSON_Parse(js);
    dt_trainer_run_state_free(js);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(u, "lora"), *f = cJSON_GetObjectItemCaseSensitive(u, "freeze");
    out->known = l != NULL; /* checkpoints saved before the settings were kept say nothing */
    if (cJSON_IsObject(l)) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(l, "r"), *a = cJSON_GetObjectItemCaseSensitive(l, "alpha");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(l, "dropout");
        st = dup_str(cJSON_GetObjectItemCaseSensitive(l, "targets"), &out->lora_targets);
        if (st >= 0 && (!out->lora_targets || !cJSON_IsNumber(r) || !cJSON_IsNumber(a) || !cJSON_IsNumber(d)))
            st = dt_error(DT_ERR_FORMAT, "checkpoint %s: its saved LoRA settings are incomplete", path);
        if (st >= 0) {
            out->lora_r = (int64_t)r->valuedouble;
            out->lora_alpha = a->valuedouble;
            out->lora_dropout = d->valuedouble;
            out->lora_rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "rslora"));
            out->lora_dora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(l, "dora"));
            st = dup_str(cJSON_GetObjectItemCaseSensitive(l, "modules_to_save"), &out->lora_save);
            if (st >= 0)
                st = dup_str(cJSON_GetObjectItemCaseSensitive(l, "layers_to_transform"), &out->lora_layers);
            if (st >= 0)
                st = dup_str(cJSON_GetObjectItemCaseSensitive(l, "layers_pattern"), &out->lora_layers_pattern);
            const cJSON *b = cJSON_GetObjectItemCaseSensitive(l, "bias");
            const int bias = cJSON_IsString(b) ? dt__lora_bias_parse(b->valuestring) : DT_LORA_BIAS_NONE;
            if (st >= 0 && bias < 0)
                st = dt_error(DT_ERR_FORMAT, "checkpoint %s: its saved LoRA bias setting is unknown", path);
            out->lora_bias = bias < 0 ? DT_LORA_BIAS_NONE : (dt_lora_bias)bias;
            for (int i = 0; i < 3 && st >= 0; i++) { /* kept as JSON: absent in older checkpoints */
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(l, pat_keys[i]);
                if (v && !cJSON_IsNull(v) && !(out->lora_pat[i] = cJSON_PrintUnformatted(v)))
                    st = dt_error(DT_ERR_NO_MEMORY, "out of memory");
            }
        }
    }
    if (st >= 0)
        st = dup_str(f, &out->freeze);
    cJSON_Delete(u);
    if (st < 0)
        dt__tuning_free(out);
    return st;
}

/* list split at its commas into *buf (the strings) and *out (NULL-terminated) */
static dt_status split(const char *list, char **buf, const char ***out)
{
    size_t n = 2;
    for (const char *c = list; *c; c++)
        n += *c == ',';
    free(*buf);
    free(*out);
    *buf = strdup(list);
    *out = calloc(n, sizeof **out);
    if (!*buf || !*out)
        return dt_error(DT_ERR_NO_MEMORY, "out of memory");
    size_t k = 0;
    for (char *s = *buf, *c; s; s = c) {
        if ((c = strchr(s, ',')))
            *c++ = 0;
        (*out)[k++] = s;
    }
    return DT_OK;
}

dt_status dt__tuning_lora(dt__tuning *t, dt_lora_params *p)
{
    *p = dt_lora_params_default();
    if (!t->lora_targets)
        return DT_OK;
    if (split(t->lora_targets, &t->target_buf, &t->target_list) < 0 ||
        (t->lora_save && split(t->lora_save, &t->save_buf, &t->save_list) < 0) ||
        (t->lora_layers_pattern && split(t->lora_layers_pattern, &t->pattern_buf, &t->pattern_list) < 0))
        return DT_ERR_NO_MEMORY;
    free(t->layer_list);
    t->layer_list = NULL;
    if (t->lora_layers && dt__parse_layers("the checkpoint's layers_to_transform", t->lora_layers, &t->layer_list,
                                           &p->nlayers))
        return dt_error(DT_ERR_FORMAT, "the checkpoint's LoRA layers_to_transform \"%s\" is not a list of layer "
                        "indices", t->lora_layers);
    p->layers = t->layer_list;
    p->bias = t->lora_bias;
    p->layers_pattern = t->lora_layers_pattern ? t->pattern_list : NULL;
    p->targets = t->target_list;
    p->modules_to_save = t->lora_save ? t->save_list : NULL;
    p->r = t->lora_r;
    p->alpha = (float)t->lora_alpha;
    p->dropout = (float)t->lora_dropout;
    p->rslora = t->lora_rslora;
    p->dora = t->lora_dora;
    dt_lora_pattern_free(t->pattern);
    t->pattern = NULL;
    if ((t->lora_pat[0] || t->lora_pat[1] || t->lora_pat[2]) &&
        dt_lora_pattern_init(t->lora_pat[0], t->lora_pat[1], t->lora_pat[2], &t->pattern) < 0)
        return dt_error_wrap(dt_last_status(), "the checkpoint's LoRA patterns");
    dt_lora_pattern_use(t->pattern, p);
    return DT_OK;
}

const char *dt__lora_bias_name(dt_lora_bias b)
{
    return b == DT_LORA_BIAS_ALL ? "all" : b == DT_LORA_BIAS_LORA_ONLY ? "lora_only" : "none";
}

int dt__lora_bias_parse(const char *s)
{
    return !strcmp(s, "none") ? DT_LORA_BIAS_NONE
           : !strcmp(s, "all") ? DT_LORA_BIAS_ALL
           : !strcmp(s, "lora_only") ? DT_LORA_BIAS_LORA_ONLY
                                     : -1;
}

int dt__parse_layers(const char *opt, const char *list, int64_t **out, size_t *n)
{
    size_t k = 1;
    for (const char *c = list; *c; c++)
        k += *c == ',';
    *n = 0;
    if (!(*out = calloc(k, sizeof **out))) {
        dt__cli_err("dtrain: %s: out of memory\n", opt);
        return 2;
    }
    for (const char *s = list;; s++) {
        char *e;
        errno = 0;
        const long long v = strtoll(s, &e, 10);
        if (e == s || errno || v < 0 || v > 1000000000LL || (*e && *e != ',') || *s == '+' || *s == '-' || *s == ' ') {
            dt__cli_err("dtrain: %s %s: not a comma-separated list of layer indices (0, 1, ...)\n", opt, list);
            free(*out);
            *out = NULL;
            return 2;
        }
        (*out)[(*n)++] = v;
        if (!*e)
            return 0;
        s = e;
    }
}

char *dt__join_layers(const int64_t *layers, size_t n)
{
    char *j = n ? calloc(n, 24) : NULL;
    for (size_t i = 0; j && i < n; i++)
        snprintf(j + strlen(j), n * 24 - strlen(j), "%s%lld", i ? "," : "", (long long)layers[i]);
    return j;
}

char *dt__join_names(const char *const *names)
{
    size_t n = 1;
    for (const char *const *s = names; s && *s; s++)
        n += strlen(*s) + 1;
    char *j = calloc(1, n);
    for (const char *const *s = names; j && s && *s; s++)
        snprintf(j + strlen(j), n - strlen(j), "%s%s", s == names ? "" : ",", *s);
    return j;
}

char *dt__tuning_json(const char *targets, const dt_lora_params *lp, const char *freeze)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    if (targets && lp) {
        cJSON *l = cJSON_AddObjectToObject(o, "lora");
        cJSON_AddStringToObject(l, "targets", targets);
        cJSON_AddNumberToObject(l, "r", (double)lp->r);
        cJSON_AddNumberToObject(l, "alpha", (double)lp->alpha);
        cJSON_AddNumberToObject(l, "dropout", (double)lp->dropout);
        cJSON_AddBoolToObject(l, "rslora", lp->rslora);
        cJSON_AddBoolToObject(l, "dora", lp->dora);
        char *save = lp->modules_to_save && lp->modules_to_save[0] ? dt__join_names(lp->modules_to_save) : NULL;
        char *lay = dt__join_layers(lp->layers, lp->nlayers);
        char *pat = lp->layers_pattern && lp->layers_pattern[0] ? dt__join_names(lp->layers_pattern) : NULL;
        const char *keys[] = {"modules_to_save", "layers_to_transform", "layers_pattern", "bias"};
        const char *vals[] = {save, lay, pat, lp->bias ? dt__lora_bias_name(lp->bias) : NULL};
        for (int k = 0; k < 4; k++)
            if (vals[k])
                cJSON_AddStringToObject(l, keys[k], vals[k]);
            else
                cJSON_AddNullToObject(l, keys[k]);
        free(save);
        free(lay);
        free(pat);
        const dt_lora_pattern *pt = dt_lora_pattern_of(lp);
        for (int k = 0; k < 3; k++) {
            const char *js = dt_lora_pattern_json(pt, pat_keys[k]);
            cJSON *v = js ? cJSON_Parse(js) : NULL;
            if (v)
                cJSON_AddItemToObject(l, pat_keys[k], v);
            else
                cJSON_AddNullToObject(l, pat_keys[k]);
        }
    } else {
        cJSON_AddNullToObject(o, "lora");
    }
    if (freeze)
        cJSON_AddStringToObject(o, "freeze", freeze);
    else
        cJSON_AddNullToObject(o, "freeze");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

void dt__tuning_describe(const char *targets, int64_t r, double alpha, double dropout, bool rslora, bool dora,
                         const char *save, const char *layers, const char *layers_pattern, dt_lora_bias bias,
                         const char *const *pat, const char *freeze, char *buf, size_t n)
{
    size_t k = 0;
    if (targets)
        k = (size_t)snprintf(buf, n,
                             "--lora-targets %s --lora-r %lld --lora-alpha %g --lora-dropout %g%s%s%s%s%s%s%s%s",
                             targets, (long long)r, alpha, dropout, rslora ? " --lora-rslora" : "",
                             dora ? " --lora-dora" : "", save ? " --lora-modules-to-save " : "", save ? save : "",
                             layers ? " --lora-layers-to-transform " : "", layers ? layers : "",
                             layers_pattern ? " --lora-layers-pattern " : "", layers_pattern ? layers_pattern : "");
    else
        k = (size_t)snprintf(buf, n, "no LoRA");
    if (targets && bias && k < n)
        k += (size_t)snprintf(buf + k, n - k, " --lora-bias %s", dt__lora_bias_name(bias));
    static const char *const flags[3] = {"--lora-rank-pattern", "--lora-alpha-pattern", "exclude_modules"};
    for (int i = 0; targets && pat && i < 3; i++)
        if (pat[i] && k < n)
            k += (size_t)snprintf(buf + k, n - k, " %s '%s'", flags[i], pat[i]);
    if (k < n)
        snprintf(buf + k, n - k, freeze ? " --freeze %s" : "", freeze);
}

/* Whether comma-separated list a (NULL: none) names names (NULL or empty: none) */
static bool same_names(const char *a, const char *const *names)
{
    char *j = names && names[0] ? dt__join_names(names) : NULL;
    const bool same = !a == !j && (!a || !strcmp(a, j));
    free(j);
    return same;
}

/* Whether comma-separated list a (NULL: none) holds p's layers_to_transform */
static bool same_layers(const char *a, const dt_lora_params *p)
{
    char *j = dt__join_layers(p->layers, p->nlayers);
    const bool same = !a == !j && (!a || !strcmp(a, j));
    free(j);
    return same;
}

/* Whether ck's rank_pattern, alpha_pattern and exclude_modules are lp's */
static bool same_patterns(const dt__tuning *ck, const dt_lora_params *lp)
{
    const dt_lora_pattern *pt = dt_lora_pattern_of(lp);
    for (int k = 0; k < 3; k++) {
        const char *js = dt_lora_pattern_json(pt, pat_keys[k]);
        if (!ck->lora_pat[k] != !js || (js && strcmp(js, ck->lora_pat[k])))
            return false;
    }
    return true;
}

bool dt__tuning_same(const dt__tuning *ck, const char *targets, const dt_lora_params *lp, const char *freeze)
{
    if (!ck->lora_targets != !targets || !ck->freeze != !freeze || (freeze && strcmp(ck->freeze, freeze)))
        return false;
    if (!targets)
        return true;
    return !strcmp(ck->lora_targets, targets) && ck->lora_r == lp->r && (float)ck->lora_alpha == lp->alpha &&
           (float)ck->lora_dropout == lp->dropout && ck->lora_rslora == lp->rslora && ck->lora_dora == lp->dora &&
           same_names(ck->lora_save, lp->modules_to_save) && same_names(ck->lora_layers_pattern, lp->layers_pattern) &&
           same_layers(ck->lora_layers, lp) && ck->lora_bias == lp->bias && same_patterns(ck, lp);
}
