/* PEFT's per-layer LoRA settings (ckpt.h: dt_lora_pattern): rank_pattern,
 * alpha_pattern and exclude_modules, matched as PEFT 0.22 matches them.
 *
 * A rank or alpha key K names layer N when Python's
 * re.match(rf"(.*\.)?({K})$", N) matches: N whole is K, or a dotted prefix
 * then K. That is compiled as \A(?:.*\.)?(?:K)\z in the tokenizer's regex
 * engine (which has no ^ or $): a K starting with ^ leaves the prefix no
 * room (\A(?:K)\z), a trailing unescaped $ is where \z is anyway. The first
 * key in the object's order that matches gives the layer's value; every
 * key that matches counts as used (PEFT warns of the others). exclude_modules
 * as a string is a regular expression the module's whole name matches
 * (re.fullmatch: \A(?:K)\z); as a list, a module named by an entry or
 * ending in "." + one. The objects keep their JSON (compact, keys in their
 * order) to write back: adapter_config.json and a checkpoint's settings. */
#include "base/json_strict.h"
#include "data/tok_regex.h"
#include "dtrain/ckpt.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pkey {
    char *key;
    dt__re *re;
    double v;
    size_t used; /* layers it matched */
} pkey;

struct dt_lora_pattern {
    pkey *rank, *alpha;
    size_t nrank, nalpha;
    char **names;   /* exclude_modules as a list, NULL-terminated, or NULL */
    dt__re *ex_re;  /* exclude_modules as a regular expression, or NULL */
    size_t excluded; /* modules exclude_modules named */
    char *json[3];  /* rank_pattern, alpha_pattern, exclude_modules as given (compact), NULL when empty */
    dt__re_scratch sc;
};

static const char *const key_names[3] = {"rank_pattern", "alpha_pattern", "exclude_modules"};

/* pat compiled to match a whole name: with suffix, a dotted prefix then pat (PEFT's pattern keys), else pat alone */
static dt_status compile(const char *pat, bool suffix, const char *what, dt__re **out)
{
    size_t n = strlen(pat), a = pat[0] == '^', bs = 0;
    while (n > a + 1 + bs && pat[n - 2 - bs] == '\\')
        bs++;
    const size_t z = n > a && pat[n - 1] == '$' && bs % 2 == 0; /* "\\$" ends in an escaped backslash, then $ */
    char *p = malloc(n + 32);
    if (!p)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", what);
    snprintf(p, n + 32, "%.*s", (int)(n - a - z), pat + a); /* alone first: an error's offset is the key's own */
    dt_status st = dt__re_compile(p, what, out);
    dt__re_free(*out);
    *out = NULL;
    snprintf(p, n + 32, "\\A%s(?:%.*s)\\z", suffix && !a ? "(?:.*\\.)?" : "", (int)(n - a - z), pat + a);
    if (st >= 0)
        st = dt__re_compile(p, what, out);
    free(p);
    return st;
}

static bool whole(const dt__re *re, dt__re_scratch *sc, const char *s)
{
    size_t ms, me;
    return dt__re_search(re, sc, (const unsigned char *)s, strlen(s), 0, &ms, &me) == 1;
}

/* rank_pattern (rank true) or alpha_pattern's JSON text into keys */
static dt_status read_dict(const char *txt, bool rank, pkey **out, size_t *n, char **json)
{
    const char *name = key_names[rank ? 0 : 1];
    cJSON *c = NULL;
    dt_status st = dt__json_parse_strict(txt, strlen(txt), name, &c);
    if (st >= 0 && !cJSON_IsObject(c) && !cJSON_IsNull(c))
        st = dt_error(DT_ERR_FORMAT, "%s: not a JSON object of %s (such as {\"q_proj\": %s})", name,
                      rank ? "layer name patterns to ranks" : "layer name patterns to alphas", rank ? "16" : "32");
    const int k = st >= 0 && cJSON_IsObject(c) ? cJSON_GetArraySize(c) : 0;
    if (k > 0 && !(*out = calloc((size_t)k, sizeof **out)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    for (const cJSON *e = k > 0 && st >= 0 ? c->child : NULL; e && st >= 0; e = e->next) {
        const double v = cJSON_IsNumber(e) ? e->valuedouble : 0;
        char what[600];
        snprintf(what, sizeof what, "%s key \"%.500s\"", name, e->string);
        if (!cJSON_IsNumber(e) || (rank ? v < 1 || v > 65536 || v != (double)(int64_t)v : !(v > 0) || v > 1e30))
            st = dt_error(DT_ERR_FORMAT, "%s: its value must be %s", what,
                          rank ? "a rank, an integer in 1..65536" : "an alpha, a number > 0");
        else if (!((*out)[*n].key = strdup(e->string)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
        else if ((st = compile(e->string, true, what, &(*out)[*n].re)) >= 0)
            (*out)[(*n)++].v = v;
        else
            free((*out)[*n].key);
    }
    if (st >= 0 && k > 0 && !(*json = cJSON_PrintUnformatted(c)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    cJSON_Delete(c);
    return st;
}

static dt_status read_exclude(dt_lora_pattern *pt, const char *txt)
{
    const char *name = key_names[2];
    cJSON *c = NULL;
    dt_status st = dt__json_parse_strict(txt, strlen(txt), name, &c);
    const int k = st >= 0 && cJSON_IsArray(c) ? cJSON_GetArraySize(c) : 0;
    if (st >= 0 && !cJSON_IsArray(c) && !cJSON_IsString(c) && !cJSON_IsNull(c))
        st = dt_error(DT_ERR_FORMAT, "%s: not a regular expression (a string), a list of module names or null",
                      name);
    else if (st >= 0 && cJSON_IsString(c) && c->valuestring[0])
        st = compile(c->valuestring, false, "exclude_modules (a regular expression over module names)", &pt->ex_re);
    if (st >= 0 && k > 0 && !(pt->names = calloc((size_t)k + 1, sizeof *pt->names)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    for (int i = 0; st >= 0 && i < k; i++) {
        const cJSON *e = cJSON_GetArrayItem(c, i);
        if (!cJSON_IsString(e) || !e->valuestring[0])
            st = dt_error(DT_ERR_FORMAT, "%s[%d] is not a module name", name, i);
        else if (!(pt->names[i] = strdup(e->valuestring)))
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    }
    if (st >= 0 && (k > 0 || pt->ex_re) && !(pt->json[2] = cJSON_PrintUnformatted(c)))
        st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    cJSON_Delete(c);
    return st;
}

dt_status dt_lora_pattern_init(const char *rank_pattern, const char *alpha_pattern, const char *exclude_modules,
                               dt_lora_pattern **out)
{
    if (!out)
        return dt_error(DT_ERR_NULL, "dt_lora_pattern_init: out is NULL");
    *out = NULL;
    dt_lora_pattern *pt = calloc(1, sizeof *pt);
    if (!pt)
        return dt_error(DT_ERR_NO_MEMORY, "LoRA patterns: out of memory");
    dt_status st = DT_OK;
    if (rank_pattern)
        st = read_dict(rank_pattern, true, &pt->rank, &pt->nrank, &pt->json[0]);
    if (st >= 0 && alpha_pattern)
        st = read_dict(alpha_pattern, false, &pt->alpha, &pt->nalpha, &pt->json[1]);
    if (st >= 0 && exclude_modules)
        st = read_exclude(pt, exclude_modules);
    if (st < 0)
        dt_lora_pattern_free(pt);
    else
        *out = pt;
    return st;
}

void dt_lora_pattern_free(dt_lora_pattern *pt)
{
    if (!pt)
        return;
    for (size_t i = 0; i < pt->nrank; i++)
        free(pt->rank[i].key), dt__re_free(pt->rank[i].re);
    for (size_t i = 0; i < pt->nalpha; i++)
        free(pt->alpha[i].key), dt__re_free(pt->alpha[i].re);
    for (char **s = pt->names; s && *s; s++)
        free(*s);
    free(pt->rank);
    free(pt->alpha);
    free(pt->names);
    dt__re_free(pt->ex_re);
    for (int i = 0; i < 3; i++)
        cJSON_free(pt->json[i]);
    dt__re_scratch_free(&pt->sc);
    free(pt);
}

/* The value of the first key of k[0, n) that names layer (every key that does counts as used), or def */
static double lookup(dt_lora_pattern *pt, pkey *k, size_t n, const char *layer, double def)
{
    double v = def;
    bool found = false;
    for (size_t i = 0; i < n; i++)
        if (whole(k[i].re, &pt->sc, layer)) {
            k[i].used++;
            if (!found)
                v = k[i].v, found = true;
        }
    return v;
}

static dt_status layer_rank(void *ud, const char *layer, int64_t *r, float *alpha)
{
    dt_lora_pattern *pt = ud;
    *r = (int64_t)lookup(pt, pt->rank, pt->nrank, layer, (double)*r);
    *alpha = (float)lookup(pt, pt->alpha, pt->nalpha, layer, (double)*alpha);
    return DT_OK;
}

static bool exclude(void *ud, const char *module)
{
    dt_lora_pattern *pt = ud;
    const size_t l = strlen(module);
    bool ex = pt->ex_re && whole(pt->ex_re, &pt->sc, module);
    for (char **s = pt->names; s && *s && !ex; s++) {
        const size_t k = strlen(*s);
        ex = !strcmp(module, *s) || (l > k && module[l - k - 1] == '.' && !strcmp(module + l - k, *s));
    }
    pt->excluded += ex;
    return ex;
}

void dt_lora_pattern_use(dt_lora_pattern *pt, dt_lora_params *p)
{
    if (!p)
        return;
    p->layer_rank = pt && (pt->nrank || pt->nalpha) ? layer_rank : NULL;
    p->exclude = pt && (pt->names || pt->ex_re) ? exclude : NULL;
    p->layer_ud = pt;
}

const char *dt_lora_pattern_json(const dt_lora_pattern *pt, const char *key)
{
    for (int i = 0; pt && key && i < 3; i++)
        if (!strcmp(key, key_names[i]))
            return pt->json[i];
    return NULL;
}

dt_lora_pattern *dt_lora_pattern_of(const dt_lora_params *p)
{
    return p && (p->layer_rank == layer_rank || p->exclude == exclude) ? p->layer_ud : NULL;
}

size_t dt_lora_pattern_warn(const dt_lora_pattern *pt, const dt_lora_params *p)
{
    size_t n = 0;
    for (int d = 0; pt && d < 2; d++) {
        const pkey *k = d ? pt->alpha : pt->rank;
        for (size_t i = 0; i < (d ? pt->nalpha : pt->nrank); i++)
            if (!k[i].used && ++n)
                dt_log(DT_LOG_WARN, "LoRA: %s key \"%s\" matches no adapted layer: ignored", key_names[d], k[i].key);
    }
    /* PEFT counts a module to save as excluded too: it warns only when neither names a module */
    if (pt && pt->json[2] && !pt->excluded && !(p && p->modules_to_save && p->modules_to_save[0]) && ++n)
        dt_log(DT_LOG_WARN, "LoRA: exclude_modules %s excludes no module: check its names", pt->json[2]);
    return n;
}
