/* A tokenizer's chat template (tokenizer.h: dt_tokenizer_chat_template,
 * dt_tokenizer_render_chat).
 *
 * transformers keeps an instruct model's conversation format as Jinja text:
 * "chat_template" in tokenizer_config.json (a string, or a list of
 * {"name", "template"} of which "default" is used), or the file
 * chat_template.jinja beside it, which wins. apply_chat_template (as of
 * transformers 5) renders it with the variables messages (each without its
 * null keys, an assistant's reasoning under all its names), tools and
 * documents (None when not given), add_generation_prompt, the special
 * tokens' texts (bos_token, eos_token, unk_token, pad_token) and any
 * further keyword arguments; chat_template.c is the renderer. The
 * text rendered holds the template's special tokens as text; encoding it
 * without add_special finds them as added tokens, as apply_chat_template's
 * tokenize=True does (add_special_tokens=False). */
#include "base/json_strict.h"
#include "chat_template.h"
#include "tok_impl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TEMPLATE ((size_t)1 << 20) /* the largest real templates are ~20 KB */

/* The template of tokenizer_config.json root's "chat_template" (name: the file): a string, a list of named
 * templates ("default" used; none so named: none), null or absent: none. */
dt_status dt__tok_config_chat(const cJSON *root, const char *name, char **tmpl)
{
    *tmpl = NULL;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsArray(c)) {
        const cJSON *e, *pick = NULL;
        int i = 0;
        cJSON_ArrayForEach(e, c) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsObject(e) || !cJSON_IsString(n) || !cJSON_IsString(t))
                return dt_error(DT_ERR_FORMAT, "%s: key \"chat_template[%d]\": want {\"name\": ..., \"template\": ...}",
                                name, i);
            if (!strcmp(n->valuestring, "default"))
                pick = t;
            i++;
        }
        c = pick;
    }
    if (!c || cJSON_IsNull(c))
        return DT_OK;
    if (!cJSON_IsString(c))
        return dt_error(DT_ERR_FORMAT, "%s: key \"chat_template\": want a string, a list of named templates or null",
                        name);
    if (strlen(c->valuestring) > MAX_TEMPLATE)
        return dt_error(DT_ERR_FORMAT, "%s: key \"chat_template\": longer than %zu bytes", name, MAX_TEMPLATE);
    if (!(*tmpl = strdup(c->valuestring)))
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    return DT_OK;
}

const char *dt_tokenizer_chat_template(const dt_tokenizer *t) { return t ? t->chat_template : NULL; }

dt_status dt_tokenizer_set_chat_template(dt_tokenizer *t, const char *tmpl, size_t n, const char *name)
{
    if (!t || (!tmpl && n))
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_set_chat_template: NULL argument");
    if (n > MAX_TEMPLATE)
        return dt_error(DT_ERR_FORMAT, "%s: a chat template longer than %zu bytes", name ? name : "<memory>",
                        MAX_TEMPLATE);
    if (tmpl && memchr(tmpl, 0, n))
        return dt_error(DT_ERR_FORMAT, "%s: the chat template holds a NUL byte", name ? name : "<memory>");
    char *c = NULL, *s = strdup(name ? name : "<memory>");
    if (tmpl && (c = malloc(n + 1))) {
        memcpy(c, tmpl, n);
        c[n] = 0;
    }
    if (!s || (tmpl && !c)) {
        free(c);
        free(s);
        return dt_error(DT_ERR_NO_MEMORY, "dt_tokenizer_set_chat_template: out of memory");
    }
    free(t->chat_template);
    free(t->chat_template_src);
    t->chat_template = c;
    t->chat_template_src = s;
    return DT_OK;
}

/* The text of token id (dt__tok_text_of) into o[key]; nothing when has is false or the id has no token. False:
 * out of memory. */
static bool add_token_text(cJSON *o, const char *key, const dt_tokenizer *t, bool has, uint32_t id)
{
    char *s = has ? dt__tok_text_of(t, id) : NULL;
    const bool ok = !s || cJSON_AddStringToObject(o, key, s) != NULL;
    free(s);
    return ok;
}

/* Message m as transformers 5's apply_chat_template hands it to the template: its keys whose value is null
 * dropped (_normalize_chat_messages), and the reasoning of an assistant turn under every name templates read
 * (_alias_reasoning_fields: the first non-null of reasoning_content, thinking, reasoning becomes "thinking",
 * first, unless the message has one, and "reasoning_content"). Its values are references to m's. */
static cJSON *template_message(const cJSON *m)
{
    static const char *const names[] = {"reasoning_content", "thinking", "reasoning"};
    const cJSON *r = NULL, *e;
    for (size_t k = 0; !r && k < sizeof names / sizeof names[0]; k++) {
        e = cJSON_GetObjectItemCaseSensitive(m, names[k]);
        r = e && !cJSON_IsNull(e) ? e : NULL;
    }
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(m, "thinking");
    cJSON *o = cJSON_CreateObject();
    bool ok = o && (!r || cJSON_AddItemReferenceToObject(o, "thinking", (cJSON *)(th && !cJSON_IsNull(th) ? th : r)));
    cJSON_ArrayForEach(e, m) {
        if (!ok)
            break;
        if (cJSON_IsNull(e) || (r && !strcmp(e->string, "thinking")))
            continue;
        ok = cJSON_AddItemReferenceToObject(o, e->string, (cJSON *)e);
    }
    if (ok && r && !cJSON_GetObjectItemCaseSensitive(o, "reasoning_content"))
        ok = cJSON_AddItemReferenceToObject(o, "reasoning_content", (cJSON *)r);
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

#define CONTINUE_TAG "CONTINUE_FINAL_MESSAGE_TAG "

/* continue_final_message: the final message m (the template's copy of it) gets CONTINUE_TAG after its content's
 * text (a list of parts: after the last part's "text"), as transformers 5 marks it; *final is that text before the
 * mark (malloc'd). */
static dt_status mark_final(const dt_tokenizer *t, cJSON *m, const char *where, char **final)
{
    *final = NULL;
    cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c)
        return dt_error(DT_ERR_INVALID_ARG, "%s: continuing the final message needs its \"content\", and it has "
                        "none", where);
    if (!strstr(t->chat_template, "content"))
        return dt_error(DT_ERR_INVALID_ARG, "%s: continuing the final message needs a chat template that writes "
                        "its \"content\", and this one never names it", where);
    /* the holder of the text: m, or a copy of the content list's last part with a "text" */
    cJSON *content = cJSON_IsArray(c) ? cJSON_Duplicate(c, true) : NULL, *holder = m, *text = c;
    if (cJSON_IsArray(c)) {
        if (!content)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        text = NULL;
        for (cJSON *p = content->child ? content->child->prev : NULL; p && !text;
             p = p == content->child ? NULL : p->prev)
            if (cJSON_IsObject(p) && (text = cJSON_GetObjectItemCaseSensitive(p, "text")))
                holder = p;
    }
    dt_status st = DT_OK;
    if (!text)
        st = dt_error(DT_ERR_INVALID_ARG, "%s: continuing the final message needs a part with a \"text\" in its "
                      "content, and it has none", where);
    else if (!cJSON_IsString(text))
        st = dt_error(DT_ERR_INVALID_ARG, "%s: continuing the final message needs its content%s to be a string",
                      where, content ? "'s last \"text\"" : "");
    if (st == DT_OK) {
        const size_t n = strlen(text->valuestring);
        char *marked = malloc(n + sizeof CONTINUE_TAG);
        cJSON *v = NULL;
        if (marked && (*final = malloc(n + 1))) {
            memcpy(*final, text->valuestring, n + 1);
            memcpy(marked, text->valuestring, n);
            memcpy(marked + n, CONTINUE_TAG, sizeof CONTINUE_TAG);
            v = cJSON_CreateString(marked);
        }
        free(marked);
        /* a replaced item is deleted: m's "content" is a reference (its value the caller's), the copy's own */
        if (!v || !cJSON_ReplaceItemInObjectCaseSensitive(holder, holder == m ? "content" : "text", v)) {
            cJSON_Delete(v);
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        } else if (content && cJSON_ReplaceItemInObjectCaseSensitive(m, "content", content)) {
            content = NULL; /* m's now */
        } else if (content) {
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        }
    }
    cJSON_Delete(content);
    if (st < 0) {
        free(*final);
        *final = NULL;
    }
    return st;
}

/* continue_final_message: text[0, *len) cut where the mark is (the final message's text final ends there), as
 * transformers 5 cuts it: at the mark's last place; when the template stripped the space after it, the whitespace
 * before it goes too. */
static dt_status cut_at_mark(char *text, size_t *len, const char *final, const char *where)
{
    const size_t tag = sizeof CONTINUE_TAG - 2; /* the mark without its space */
    size_t a, e;
    dt__chat_py_strip(final, strlen(final), 'b', &a, &e);
    const char *at = NULL;
    for (size_t i = *len >= tag ? *len - tag + 1 : 0; !at && i-- > 0;)
        if (!memcmp(text + i, CONTINUE_TAG, tag))
            at = text + i;
    if (!at || (e > a && !memmem(text, *len, final + a, e - a)))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the chat template does not write the final message's content as it "
                        "is, so it cannot be continued (transformers refuses it too)", where);
    size_t n = (size_t)(at - text);
    if ((size_t)(text + *len - at) <= tag || at[tag] != ' ')
        dt__chat_py_strip(text, n, 'r', &a, &n);
    text[n] = 0;
    *len = n;
    return DT_OK;
}

dt_status dt__tok_render_chat(const dt_tokenizer *t, const cJSON *messages, dt_chat_end end, const cJSON *tools,
                              const cJSON *kwargs, const char *where, char **text, size_t *len, size_t **spans,
                              size_t *nspans)
{
    *text = NULL;
    *len = 0;
    if (!t->chat_template)
        return dt_error(DT_ERR_INVALID_ARG, "%s: a conversation needs the tokenizer's chat template, and this "
                        "tokenizer has none (transformers reads it from tokenizer_config.json's \"chat_template\" or "
                        "a chat_template.jinja beside the tokenizer.json)", where);
    if (!cJSON_IsArray(messages))
        return dt_error(DT_ERR_INVALID_ARG, "%s: want a JSON list of messages ({\"role\": ..., \"content\": ...}, "
                        "...)", where);
    if (end == DT_CHAT_CONTINUE && spans) /* apply_chat_template refuses these together */
        return dt_error(DT_ERR_INVALID_ARG, "%s: continuing the final message has no assistant mask", where);
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, messages) { /* what apply_chat_template itself needs of a message */
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role")))
            return dt_error(DT_ERR_INVALID_ARG, "%s: message %d: want an object with a string \"role\"", where, i);
        i++;
    }
    if (!i)
        return dt_error(DT_ERR_INVALID_ARG, "%s: an empty conversation (apply_chat_template refuses it too)", where);
    if (kwargs && !cJSON_IsNull(kwargs) && !cJSON_IsObject(kwargs))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the chat template's keyword arguments must be a JSON object", where);
    cJSON *ctx = cJSON_CreateObject();
    bool ok = ctx && add_token_text(ctx, "bos_token", t, t->has_cfg_bos, t->cfg_bos) &&
              add_token_text(ctx, "eos_token", t, t->has_cfg_eos, t->cfg_eos) &&
              add_token_text(ctx, "unk_token", t, t->unk != TOK_NONE, t->unk) &&
              (!t->cfg_pad || cJSON_AddStringToObject(ctx, "pad_token", t->cfg_pad));
    const cJSON *kw;
    if (ok && cJSON_IsObject(kwargs)) /* enable_thinking, ...: as apply_chat_template's **kwargs */
        cJSON_ArrayForEach(kw, kwargs) {
            cJSON *d = cJSON_Duplicate(kw, true);
            cJSON_DeleteItemFromObjectCaseSensitive(ctx, kw->string);
            if (!d || !cJSON_AddItemToObject(ctx, kw->string, d)) {
                cJSON_Delete(d);
                ok = false;
                break;
            }
        }
    /* tools and documents are always there (None when not given), as apply_chat_template passes them */
    const cJSON *docs = cJSON_GetObjectItemCaseSensitive(kwargs, "documents");
    static const char *const fixed[] = {"messages", "add_generation_prompt", "tools", "documents"};
    for (size_t k = 0; ok && k < sizeof fixed / sizeof fixed[0]; k++)
        cJSON_DeleteItemFromObjectCaseSensitive(ctx, fixed[k]);
    cJSON *msgs = ok ? cJSON_AddArrayToObject(ctx, "messages") : NULL;
    cJSON_ArrayForEach(m, messages) {
        cJSON *c = msgs ? template_message(m) : NULL;
        if (!c || !cJSON_AddItemToArray(msgs, c)) {
            cJSON_Delete(c);
            ok = false;
            break;
        }
    }
    ok = ok && msgs && cJSON_AddBoolToObject(ctx, "add_generation_prompt", end == DT_CHAT_GENERATION_PROMPT) &&
         (tools ? cJSON_AddItemReferenceToObject(ctx, "tools", (cJSON *)tools) != 0
                : cJSON_AddNullToObject(ctx, "tools") != NULL) &&
         (docs ? cJSON_AddItemReferenceToObject(ctx, "documents", (cJSON *)docs) != 0
               : cJSON_AddNullToObject(ctx, "documents") != NULL);
    dt_status st = ok ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
    char *final = NULL;
    if (st == DT_OK && end == DT_CHAT_CONTINUE)
        st = mark_final(t, msgs->child->prev, where, &final);
    if (st == DT_OK) {
        char name[700];
        snprintf(name, sizeof name, "%s (%s)", t->chat_template_src ? t->chat_template_src : "the chat template",
                 where);
        st = spans ? dt__chat_render_spans(t->chat_template, strlen(t->chat_template), name, ctx, text, len, spans,
                                           nspans)
                   : dt__chat_render(t->chat_template, strlen(t->chat_template), name, ctx, text, len);
    }
    if (st == DT_OK && final && (st = cut_at_mark(*text, len, final, where)) < 0) {
        free(*text);
        *text = NULL;
        *len = 0;
    }
    free(final);
    cJSON_Delete(ctx);
    return st;
}

dt_status dt_tokenizer_render_chat(const dt_tokenizer *t, const char *conversation, size_t n, dt_chat_end end,
                                   const char *kwargs, size_t kn, char **text, size_t *len)
{
    if (!text || !len)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_render_chat: NULL argument");
    *text = NULL;
    *len = 0;
    if (!t || !conversation || (!kwargs && kn))
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_render_chat: NULL argument");
    if ((unsigned)end > DT_CHAT_CONTINUE)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_render_chat: end %d is not a dt_chat_end", (int)end);
    cJSON *msgs = NULL, *kw = NULL;
    dt_status st = dt__json_parse_strict(conversation, n, "the conversation", &msgs);
    if (st >= 0 && kwargs)
        st = dt__json_parse_strict(kwargs, kn, "the chat template's keyword arguments", &kw);
    if (st >= 0) {
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(kw, "tools");
        st = dt__tok_render_chat(t, msgs, end, tools, kw, "the conversation", text, len, NULL, NULL);
    }
    cJSON_Delete(msgs);
    cJSON_Delete(kw);
    return st;
}
