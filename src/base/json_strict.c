/* Strict JSON parsing (json_strict.h). */
#include "base/json_strict.h"

#include <stdio.h>
#include <string.h>

/* The first key that appears twice in one object of the tree under o; its
 * path (keys from the top, quoted, dot-separated) into path. */
static bool dup_key(const cJSON *o, char *path, size_t n, size_t at)
{
    for (const cJSON *c = o ? o->child : NULL; c; c = c->next) {
        size_t k = at;
        if (cJSON_IsObject(o) && c->string) {
            for (const cJSON *d = o->child; d != c; d = d->next)
                if (d->string && !strcmp(d->string, c->string)) {
                    snprintf(path + at, n - at, "%s\"%s\"", at ? "." : "", c->string);
                    return true;
                }
            int w = snprintf(path + at, n - at, "%s\"%s\"", at ? "." : "", c->string);
            k = w > 0 && at + (size_t)w < n ? at + (size_t)w : n - 1;
        }
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && dup_key(c, path, n, k))
            return true;
        path[at] = '\0';
    }
    return false;
}

dt_status dt__json_parse_strict(const char *txt, size_t n, const char *name, cJSON **out)
{
    *out = NULL;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(txt, n, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = at && at >= txt && at <= txt + n ? (size_t)(at - txt) : 0;
        return dt_error(DT_ERR_FORMAT, "%s: not valid JSON (near byte %zu)", name, pos);
    }
    for (const char *p = end ? end : txt + n; p < txt + n; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != '\0') {
            cJSON_Delete(root);
            return dt_error(DT_ERR_FORMAT, "%s: text after the end of the JSON value (at byte %zu)", name,
                            (size_t)(p - txt));
        }
    /* cJSON ends a string at an escaped NUL: "a\u0000b" would read as "a", the rest dropped without a word.
     * A backslash is only ever inside a string in valid JSON, and starts a two-character escape. */
    for (size_t i = 0; i + 1 < n; i++)
        if (txt[i] == '\\') {
            if (txt[i + 1] == 'u' && i + 5 < n && !memcmp(txt + i + 2, "0000", 4)) {
                cJSON_Delete(root);
                return dt_error(DT_ERR_FORMAT, "%s: a string holds \\u0000 (a NUL character, at byte %zu), which "
                                "dtrain cannot keep in a string", name, i);
            }
            i++;
        }
    char path[512] = "";
    if (dup_key(root, path, sizeof path, 0)) {
        cJSON_Delete(root);
        return dt_error(DT_ERR_FORMAT, "%s: the key %s appears twice", name, path);
    }
    *out = root;
    return DT_OK;
}
