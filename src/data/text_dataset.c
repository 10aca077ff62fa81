/* Text corpora as language-model data (tokenizer.h: dt_dataset_text_open).
 *
 * The documents are tokenized once, when the set is opened (every rank
 * does the same work and gets the same ids: encoding is deterministic),
 * each followed by the end-of-document token, and kept in memory as uint32
 * ids (4 bytes a token: the Bible's 4.3 MB become about 1.2 M tokens, 5 MB).
 * Items are then windows of T + 1 tokens exactly as a token file's
 * (dt_dataset_tokens_open): x the first T, y the last T.
 *
 * JSON-lines files (jsonl:) and Parquet files (parquet:, read by parquet.h
 * into the same JSON objects, a row at a time, only the columns used) are
 * records with the same keys: each one document, or a prompt and a
 * completion, or a conversation (add_record).
 *
 * Prompt/completion lines (jsonl:...,prompt=KEY,completion=KEY) are the
 * prompt's ids, then the completion's, then the end-of-document id, each
 * text encoded on its own (the boundary is always a token boundary). With
 * completion_only_loss a byte per token says whether it is a counted
 * target (a completion or end-of-document token); a target that is not
 * becomes DT_K_IGNORE_INDEX in y, so the loss's mean runs over the counted
 * targets only (the mean of PyTorch's cross_entropy(ignore_index=-100)).
 * Conversations (lists of messages) are rendered by the tokenizer's chat
 * template first (add_chat). */
#include "base/json_strict.h"
#include "dtrain/kernels.h"
#include "mapfile.h"
#include "parquet.h"
#include "tok_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TEXT_FILE ((size_t)4 << 30)

typedef struct textset {
    uint32_t *tok;
    uint8_t *counted; /* completion_only_loss: 1 where the token is a counted target, else NULL */
    int64_t *rec;     /* per_record: record r is tok[rec[r], rec[r + 1]) (n + 1 entries), else NULL */
    int64_t count, T, stride, n;
} textset;

static int64_t ts_length(void *self) { return ((textset *)self)->n; }

static void ts_window(const textset *s, int64_t i, int64_t *x, int64_t *y)
{
    const int64_t at = s->rec ? s->rec[i] : i * s->stride;
    const uint32_t *w = s->tok + at;
    const uint8_t *c = s->counted ? s->counted + at : NULL;
    /* a record: its first T tokens (at most), padded with its last; T + 1 of a window */
    const int64_t len = s->rec ? (s->rec[i + 1] - at < s->T ? s->rec[i + 1] - at : s->T) : s->T + 1;
    for (int64_t k = 0; k < s->T; k++) {
        x[k] = k < len ? w[k] : w[len - 1];
        y[k] = k + 1 >= len || (c && !c[k + 1]) ? DT_K_IGNORE_INDEX : (int64_t)w[k + 1];
    }
}

static dt_status ts_get_item(void *self, int64_t i, void *x, void *y)
{
    ts_window(self, i, x, y);
    return DT_OK;
}

static dt_status ts_get_batch(void *self, const int64_t *idx, int64_t n, void *x, void *y)
{
    textset *s = self;
    for (int64_t b = 0; b < n; b++)
        ts_window(s, idx[b], (int64_t *)x + b * s->T, (int64_t *)y + b * s->T);
    return DT_OK;
}

static void ts_free(void *self)
{
    textset *s = self;
    if (!s)
        return;
    free(s->tok);
    free(s->counted);
    free(s->rec);
    free(s);
}

static const dt_dataset_vtable textset_vt = {
    .version = DT_DATASET_VTABLE_VERSION,
    .name = "text",
    .length = ts_length,
    .get_item = ts_get_item,
    .get_batch = ts_get_batch,
    .free = ts_free,
};

static dt_status read_file(const char *path, char **buf, size_t *n)
{
    const char *why;
    FILE *f = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    if (!f)
        return dt_error(DT_ERR_IO, "text data %s: cannot open: %s", path, why);
    size_t cap = 1 << 16, len = 0, got;
    char *b = malloc(cap + 1);
    while (b && (got = fread(b + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = cap < MAX_TEXT_FILE ? realloc(b, cap * 2 + 1) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!b || err) {
        free(b);
        return dt_error(err ? DT_ERR_IO : DT_ERR_NO_MEMORY, "text data %s: %s", path,
                        err ? "read error (a directory?)" : "larger than 4 GiB or out of memory");
    }
    b[len] = 0;
    *buf = b;
    *n = len;
    return DT_OK;
}

typedef struct acc {
    uint32_t *tok;
    uint8_t *counted; /* with mask: one byte per token */
    bool mask;
    int64_t n, cap;
    int64_t *rec; /* per_record: where each record starts (nrec of them), else NULL */
    int64_t nrec, reccap;
    bool per_record;
} acc;

/* per_record: a record starts at the next token. */
static dt_status start_record(acc *a, const char *where)
{
    if (!a->per_record)
        return DT_OK;
    if (a->nrec + 2 > a->reccap) { /* one more: the end */
        int64_t cap = a->reccap ? 2 * a->reccap : 1024;
        int64_t *r = realloc(a->rec, (size_t)cap * sizeof *r);
        if (!r)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory (%lld records)", where, (long long)cap);
        a->rec = r;
        a->reccap = cap;
    }
    a->rec[a->nrec++] = a->n;
    return DT_OK;
}

/* Encode text and append its ids (counted: are they targets the loss
 * counts), then the end-of-document id (always counted) when end. */
static dt_status add_text(acc *a, const dt_tokenizer *t, const char *text, size_t n, bool counted, bool end,
                          uint32_t eos, const char *where)
{
    uint32_t *ids;
    int64_t ni;
    dt_status st = dt_tokenizer_encode(t, text, n, false, &ids, &ni);
    if (st < 0)
        return dt_error(st, "%s: %s", where, dt_last_error());
    if (a->n + ni + 1 > a->cap) {
        int64_t cap = a->cap ? a->cap : 1 << 16;
        while (cap < a->n + ni + 1)
            cap *= 2;
        uint32_t *nw = realloc(a->tok, (size_t)cap * sizeof *nw);
        if (nw)
            a->tok = nw;
        uint8_t *nc = nw && a->mask ? realloc(a->counted, (size_t)cap) : NULL;
        if (nc)
            a->counted = nc;
        if (!nw || (a->mask && !nc)) {
            free(ids);
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory (%lld tokens)", where, (long long)cap);
        }
        a->cap = cap;
    }
    if (ni)
        memcpy(a->tok + a->n, ids, (size_t)ni * sizeof *ids);
    if (a->mask && ni)
        memset(a->counted + a->n, counted, (size_t)ni);
    a->n += ni;
    if (end) {
        if (a->mask)
            a->counted[a->n] = 1;
        a->tok[a->n++] = eos;
    }
    free(ids);
    return DT_OK;
}

/* One document and the end-of-document id (one record). */
static dt_status add_doc(acc *a, const dt_tokenizer *t, uint32_t eos, const char *text, size_t n, const char *where)
{
    dt_status st = start_record(a, where);
    return st < 0 ? st : add_text(a, t, text, n, true, true, eos, where);
}

/* The keys of a record (a jsonl line, a parquet row): field (one document), or prompt and completion. */
typedef struct jkeys {
    const char *field, *prompt, *completion;
    bool field_given; /* field= named it (else "text", and a line without it may be a "messages" conversation) */
    bool assistant_only; /* assistant_only_loss: conversations only, their {% generation %} text counted */
} jkeys;

/* The string `key` of object o, or an error naming the line and the key. */
static dt_status jstring(const cJSON *o, const char *key, const char *opt, const char *where, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    const bool conv = !v && strcmp(opt, "field") && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "messages"));
    if (!cJSON_IsString(v))
        return dt_error(DT_ERR_FORMAT, "%s: want an object with a string \"%s\"%s (%s=NAME picks another key)%s",
                        where, key, !v ? "" : ", not another JSON type", opt,
                        cJSON_IsArray(v) ? "; a list there is a conversation (a list of messages) only when the other "
                                           "key is one too"
                        : conv ? "; this line is a \"messages\" conversation, which has no prompt and completion: "
                                 "a loss on the assistant's turns only is --assistant-only-loss"
                               : "");
    *out = v->valuestring;
    return DT_OK;
}

/* Conversations (TRL's conversational formats): the line's messages rendered by the tokenizer's chat template
 * (apply_chat_template with the line's "tools" and "chat_template_kwargs"), nothing added after them (the
 * template ends each turn; TRL's SFTTrainer adds no end-of-document token to a conversation). With prompt, the
 * prompt is rendered with the generation prompt (its targets not counted under completion_only_loss), and the
 * completion is what the whole conversation's rendering adds after it. With assistant_only, only the text the
 * template's {% generation %} blocks wrote is counted (transformers' assistant mask, TRL's assistant_only_loss):
 * the text is encoded piece by piece between those edges, which must be token edges of the whole text's encoding
 * (checked: then the tokens counted are exactly those transformers' mask marks). */
static dt_status add_chat(acc *a, const dt_tokenizer *t, const cJSON *o, const cJSON *prompt, const cJSON *msgs,
                          bool assistant_only, const char *where)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs");
    char *pt = NULL, *full = NULL;
    size_t pn = 0, fn = 0, *sp = NULL, nsp = 0;
    cJSON *all = NULL;
    dt_status st = DT_OK;
    if (prompt) { /* prompt + completion, as one list */
        all = cJSON_CreateArray();
        const cJSON *m;
        for (int k = 0; all && st == DT_OK && k < 2; k++) {
            const cJSON *part = k ? msgs : prompt;
            cJSON_ArrayForEach(m, part) {
                cJSON *r = cJSON_CreateObjectReference(m->child);
                if (!r || !cJSON_AddItemToArray(all, r)) {
                    cJSON_Delete(r);
                    st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
                    break;
                }
            }
        }
        if (!all)
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", where);
        if (st == DT_OK)
            st = dt__tok_render_chat(t, prompt, true, tools, kw, where, &pt, &pn, NULL, NULL);
    }
    if (st == DT_OK)
        st = dt__tok_render_chat(t, all ? all : msgs, false, tools, kw, where, &full, &fn,
                                 assistant_only ? &sp : NULL, assistant_only ? &nsp : NULL);
    if (st == DT_OK && prompt && (fn < pn || memcmp(full, pt, pn)))
        st = dt_error(DT_ERR_INVALID_ARG, "%s: the chat template renders the prompt (with its generation prompt) as "
                      "other text than the start of the whole conversation, so the completion cannot be told "
                      "apart: write this line's prompt and completion as text", where);
    if (st == DT_OK && assistant_only && !nsp)
        st = dt_error(DT_ERR_INVALID_ARG, "%s: a loss on the assistant's turns only needs a chat template that marks "
                      "them with {%% generation %%} ... {%% endgeneration %%}, and this one marks none (TRL refuses "
                      "it too)", where);
    /* the pieces: cut at the prompt's end and at each generation block's edges; counted: inside a block (with
       assistant_only) and past the prompt (with a prompt) */
    const int64_t first = a->n;
    size_t at = 0;
    while (st == DT_OK && at < fn) {
        size_t cut = fn;
        bool in = !assistant_only;
        if (prompt && at < pn)
            cut = pn;
        for (size_t j = 0; assistant_only && j < nsp; j++) {
            const size_t s0 = sp[2 * j], s1 = sp[2 * j + 1];
            if (at >= s0 && at < s1) {
                in = true;
                cut = s1 < cut ? s1 : cut;
            } else if (s0 > at && s0 < cut) {
                cut = s0;
            }
        }
        st = add_text(a, t, full + at, cut - at, in && (!prompt || at >= pn), false, 0, where);
        at = cut;
    }
    if (st == DT_OK && assistant_only) { /* the pieces' tokens are the whole text's, or the mask is not exact */
        uint32_t *ids = NULL;
        int64_t ni = 0;
        st = dt_tokenizer_encode(t, full, fn, false, &ids, &ni);
        if (st < 0)
            st = dt_error(st, "%s: %s", where, dt_last_error());
        else if (ni != a->n - first || (ni && memcmp(ids, a->tok + first, (size_t)ni * sizeof *ids)))
            st = dt_error(DT_ERR_UNSUPPORTED, "%s: a {%% generation %%} block of the chat template starts or ends "
                          "inside a token of the conversation's encoding, so which tokens are the assistant's is not "
                          "clear-cut (transformers counts every token the block's text touches)", where);
        bool any = false;
        for (int64_t i = first; st == DT_OK && i < a->n && !any; i++)
            any = a->counted[i];
        if (st == DT_OK && !any)
            st = dt_error(DT_ERR_INVALID_ARG, "%s: the assistant's turns hold no token (an empty reply?): nothing of "
                          "this conversation would be trained (TRL refuses it too)", where);
        free(ids);
    }
    cJSON_Delete(all);
    free(pt);
    free(full);
    free(sp);
    return st;
}

/* One record (a JSON-lines line, a Parquet row): one document, the string `field` of object o, or its prompt and
 * its completion, or a conversation. where names the record in messages. */
static dt_status add_record(acc *a, const dt_tokenizer *t, uint32_t eos, const cJSON *o, const jkeys *keys,
                            const char *where)
{
    dt_status st = start_record(a, where);
    const char *pr = NULL, *co = NULL;
    const cJSON *fv = cJSON_GetObjectItemCaseSensitive(o, keys->prompt ? keys->prompt : keys->field);
    const cJSON *cv = keys->prompt ? cJSON_GetObjectItemCaseSensitive(o, keys->completion) : NULL;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!keys->prompt && !fv && !keys->field_given && cJSON_IsArray(msgs))
        fv = msgs; /* TRL's conversational language modeling: {"messages": [...]} */
    const bool chat = cJSON_IsArray(fv) && (!keys->prompt || cJSON_IsArray(cv));
    if (st < 0)
        return st;
    if (!cJSON_IsObject(o))
        st = dt_error(DT_ERR_FORMAT, "%s: want a JSON object, one a line", where);
    else if (chat)
        st = add_chat(a, t, o, keys->prompt ? fv : NULL, keys->prompt ? cv : fv, keys->assistant_only, where);
    else if (keys->assistant_only)
        st = dt_error(DT_ERR_INVALID_ARG, "%s: a loss on the assistant's turns only needs conversations (a "
                      "\"messages\" list, or prompt and completion lists), and this line is text", where);
    else if (!keys->prompt)
        st = jstring(o, keys->field, "field", where, &co);
    else if ((st = jstring(o, keys->prompt, "prompt", where, &pr)) == DT_OK)
        st = jstring(o, keys->completion, "completion", where, &co);
    if (st == DT_OK && pr) /* an empty completion: only its end-of-document token is a target */
        st = add_text(a, t, pr, strlen(pr), false, false, eos, where);
    if (st == DT_OK && co)
        st = add_text(a, t, co, strlen(co), true, true, eos, where);
    return st;
}

/* Every line of a JSON-lines file is one record (add_record). Blank lines are skipped. */
static dt_status add_jsonl(acc *a, const dt_tokenizer *t, uint32_t eos, const char *path, char *buf, size_t n,
                           const jkeys *keys)
{
    if (n >= 4 && !memcmp(buf, "PAR1", 4))
        return dt_error(DT_ERR_FORMAT, "jsonl %s: a Parquet file (it starts with \"PAR1\"), not JSON lines: give it "
                        "as parquet:%s", path, path);
    size_t line = 0;
    for (char *p = buf, *end = buf + n; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        line++;
        size_t k = 0;
        while (k < len && (p[k] == ' ' || p[k] == '\t' || p[k] == '\r'))
            k++;
        if (k < len) {
            char where[600];
            snprintf(where, sizeof where, "jsonl %s:%zu", path, line);
            cJSON *o;
            dt_status st = dt__json_parse_strict(p, len, where, &o);
            if (st < 0)
                return st;
            st = add_record(a, t, eos, o, keys, where);
            cJSON_Delete(o);
            if (st < 0)
                return st;
        }
        p = nl ? nl + 1 : end;
    }
    return DT_OK;
}

/* Every row of a Parquet file is one record (add_record), read with only the columns the records use: the
 * document's (or the prompt's and the completion's), "messages" unless field= names the document's, and the chat
 * template's "tools" and "chat_template_kwargs". */
static dt_status add_parquet(acc *a, const dt_tokenizer *t, uint32_t eos, const char *path, const jkeys *keys)
{
    dt__pq_file *f;
    dt_status st = dt__pq_open(path, &f);
    if (st < 0)
        return st;
    const char *cols[6];
    size_t nc = 0;
    cols[nc++] = keys->prompt ? keys->prompt : keys->field;
    if (keys->prompt)
        cols[nc++] = keys->completion;
    if (keys->prompt || !keys->field_given)
        cols[nc++] = "messages";
    cols[nc++] = "tools";
    cols[nc++] = "chat_template_kwargs";
    st = dt__pq_select(f, cols, nc);
    cJSON *row = NULL;
    while (st == DT_OK && (st = dt__pq_next(f, &row)) == DT_OK && row) {
        st = add_record(a, t, eos, row, keys, dt__pq_where(f));
        cJSON_Delete(row);
    }
    dt__pq_close(f);
    return st;
}

dt_status dt_dataset_text_open(const char *spec, const dt_tokenizer *t, const dt_tokens_params *p,
                               dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_text_open: out is NULL");
    *out = NULL;
    if (!spec || !t || !p)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_text_open: NULL argument");
    const bool parquet = !strncmp(spec, "parquet:", 8);
    const bool records = parquet || !strncmp(spec, "jsonl:", 6); /* jsonl: and parquet: take the same keys */
    const size_t plen = parquet ? 8 : records ? 6 : 5;
    if (!records && strncmp(spec, "text:", 5))
        return dt_error(DT_ERR_INVALID_ARG,
                        "data %s: want text:FILE[,FILE...], jsonl:FILE[,FILE...][,field=NAME | "
                        ",prompt=KEY,completion=KEY] or parquet:FILE[,FILE...] with the same keys", spec);
    if (p->seq_len < 1 || p->seq_len > (1 << 24) || p->stride < 0 || p->vocab_size < 0)
        return dt_error(DT_ERR_INVALID_ARG, "data %s: need 1 <= seq_len <= 2^24, stride >= 0, vocab_size >= 0", spec);
    if (p->per_record && p->stride)
        return dt_error(DT_ERR_INVALID_ARG, "data %s: one record an item (no packing) takes no stride (the records "
                        "are not cut into windows)", spec);
    if (p->vocab_size && dt_tokenizer_vocab_size(t) > p->vocab_size)
        return dt_error(DT_ERR_FORMAT, "data %s: the tokenizer has %lld ids, more than the vocab size %lld", spec,
                        (long long)dt_tokenizer_vocab_size(t), (long long)p->vocab_size);
    uint32_t eos;
    dt_status st = dt_tokenizer_eos(t, &eos);
    if (st < 0)
        return dt_error(st, "data %s: documents are separated by the end-of-document token: %s", spec, dt_last_error());
    char *list = strdup(spec + plen);
    if (!list)
        return dt_error(DT_ERR_NO_MEMORY, "data %s: out of memory", spec);
    jkeys keys = {.field = NULL};
    int nfiles = 0;
    for (char *s = list, *c; s; s = c) { /* options first: KEY=NAME anywhere in the list */
        c = strchr(s, ',');
        if (c)
            *c++ = 0;
        const char *eq = strchr(s, '=');
        const char **slot = !eq                             ? NULL
                            : !strncmp(s, "field=", 6)      ? &keys.field
                            : !strncmp(s, "prompt=", 7)     ? &keys.prompt
                            : !strncmp(s, "completion=", 11) ? &keys.completion
                                                             : NULL;
        if (slot) {
            if (!records || !eq[1] || *slot) {
                free(list);
                return dt_error(DT_ERR_INVALID_ARG, "data %s: %.*s=NAME goes with jsonl: (or parquet:), once, and "
                                "names a key", spec, (int)(eq - s), s);
            }
            *slot = eq + 1;
        } else if (!*s) {
            free(list);
            return dt_error(DT_ERR_INVALID_ARG, "data %s: an empty file name", spec);
        } else {
            nfiles++;
        }
    }
    if (records && p->completion_only_loss && !keys.field && !keys.prompt && !keys.completion)
        keys.prompt = "prompt", keys.completion = "completion"; /* TRL's prompt-completion format */
    const char *bad = !nfiles                                            ? "no file"
                      : p->assistant_only_loss && !records
                          ? "a loss on the assistant's turns only needs conversations: jsonl:FILE[,FILE...] or "
                            "parquet:FILE[,FILE...] of \"messages\" lists (TRL's conversational format)"
                      : keys.field && (keys.prompt || keys.completion) ? "field=KEY (one document a line) or "
                                                                           "prompt=KEY,completion=KEY, not both"
                      : !keys.prompt != !keys.completion               ? "prompt=KEY and completion=KEY go together"
                      : p->completion_only_loss && !keys.prompt
                          ? "a loss on the completions only needs prompt/completion data: jsonl:FILE[,FILE...]"
                            "[,prompt=KEY,completion=KEY] or parquet:FILE[,...] so (default keys prompt and "
                            "completion)"
                          : NULL;
    if (bad) {
        free(list);
        return dt_error(DT_ERR_INVALID_ARG, "data %s: %s", spec, bad);
    }
    keys.field_given = keys.field != NULL;
    keys.assistant_only = p->assistant_only_loss;
    if (!keys.field)
        keys.field = "text";
    acc a = {.mask = p->completion_only_loss || p->assistant_only_loss, .per_record = p->per_record};
    size_t left = strlen(spec + plen) + 1;
    for (char *s = list; st == DT_OK && s < list + left; s += strlen(s) + 1) {
        if (!strncmp(s, "field=", 6) || !strncmp(s, "prompt=", 7) || !strncmp(s, "completion=", 11))
            continue; /* an option (checked above) */
        if (parquet) { /* read a column chunk at a time, not whole */
            st = add_parquet(&a, t, eos, s, &keys);
            continue;
        }
        char *buf = NULL;
        size_t n = 0;
        if ((st = read_file(s, &buf, &n)) < 0)
            break;
        char where[600];
        snprintf(where, sizeof where, "text data %s", s);
        st = records ? add_jsonl(&a, t, eos, s, buf, n, &keys) : add_doc(&a, t, eos, buf, n, where);
        free(buf);
    }
    free(list);
    for (int64_t i = 0; st == DT_OK && p->vocab_size && i < a.n; i++)
        if (a.tok[i] >= (uint64_t)p->vocab_size)
            st = dt_error(DT_ERR_FORMAT, "data %s: token %u at position %lld >= vocab size %lld", spec, a.tok[i],
                          (long long)i, (long long)p->vocab_size);
    textset *s = st == DT_OK ? calloc(1, sizeof *s) : NULL;
    if (st == DT_OK && !s)
        st = dt_error(DT_ERR_NO_MEMORY, "data %s: out of memory", spec);
    if (st < 0) {
        free(a.tok);
        free(a.counted);
        free(a.rec);
        return st;
    }
    s->tok = a.tok;
    s->counted = a.counted;
    s->count = a.n;
    s->T = p->seq_len;
    s->stride = p->stride ? p->stride : p->seq_len;
    s->n = a.n >= s->T + 1 ? (a.n - s->T - 1) / s->stride + 1 : 0;
    if (a.per_record) { /* every record with a token an item (an empty one, a template that wrote nothing: none) */
        int64_t kept = 0;
        for (int64_t r = 0; r < a.nrec; r++)
            if ((r + 1 < a.nrec ? a.rec[r + 1] : a.n) > a.rec[r])
                a.rec[kept++] = a.rec[r];
        s->rec = a.rec;
        s->n = kept;
        if (s->rec)
            s->rec[kept] = a.n;
    }
    dt_dataset_info info = {.x_dtype = DT_I64,
                            .x_ndim = 1,
                            .x_shape = {s->T},
                            .y_dtype = DT_I64,
                            .y_ndim = 1,
                            .y_shape = {s->T},
                            .num_classes = p->vocab_size ? p->vocab_size : dt_tokenizer_vocab_size(t)};
    st = dt_dataset_init(&textset_vt, s, &info, out);
    if (st < 0) {
        ts_free(s);
        return st;
    }
    dt_dataset_set_source(*out, spec);
    return DT_OK;
}
