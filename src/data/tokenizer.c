/* Byte-level BPE: the chunker, the tokenizer built from a merge list,
 * encode, decode and the vocab file (data.h; training is bpe_train.c).
 *
 * Encoding a chunk keeps its symbols in a linked list over positions and
 * the mergeable adjacent pairs in a min-heap keyed by (rank, position): the
 * top is the lowest-ranked pair, leftmost among equals. A popped entry is
 * checked against the list (both ends alive, still those ids) and skipped
 * if stale; a merge pushes the two pairs it creates. O(L log L) per chunk,
 * so a long run of spaces or random bytes costs no more than its length
 * deserves (the rank-then-rescan loop of minbpe is O(L * merges)). */
#include "base/sbuf.h"
#include "bpe_impl.h"
#include "mapfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the pair map ---------------------------------------------------------- */

static size_t pair_slot(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

uint32_t dt__pairmap_get(const dt__pairmap *m, uint32_t a, uint32_t b)
{
    if (!m->cap)
        return UINT32_MAX;
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = pair_slot(key, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key)
            return m->vals[i];
        if (m->keys[i] == DT__PAIR_EMPTY)
            return UINT32_MAX;
    }
}

static dt_status pairmap_grow(dt__pairmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *keys = malloc(cap * sizeof *keys);
    uint32_t *vals = malloc(cap * sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return dt_error(DT_ERR_NO_MEMORY, "bpe: out of memory (pair table of %zu entries)", cap);
    }
    memset(keys, 0xff, cap * sizeof *keys);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == DT__PAIR_EMPTY)
            continue;
        size_t j = pair_slot(m->keys[i], cap);
        while (keys[j] != DT__PAIR_EMPTY)
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return DT_OK;
}

dt_status dt__pairmap_put(dt__pairmap *m, uint32_t a, uint32_t b, uint32_t v)
{
    if ((m->n + 1) * 2 > m->cap) {
        dt_status st = pairmap_grow(m);
        if (st < 0)
            return st;
    }
    uint64_t key = (uint64_t)a << 32 | b;
    size_t i = pair_slot(key, m->cap);
    while (m->keys[i] != DT__PAIR_EMPTY && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    if (m->keys[i] == DT__PAIR_EMPTY)
        m->n++;
    m->keys[i] = key;
    m->vals[i] = v;
    return DT_OK;
}

void dt__pairmap_free(dt__pairmap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* ---- the chunker ------------------------------------------------------------ */

enum { C_LETTER, C_DIGIT, C_SPACE, C_OTHER };

static int byte_class(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80)
        return C_LETTER;
    if (c >= '0' && c <= '9')
        return C_DIGIT;
    if (c == ' ' || (c >= '\t' && c <= '\r'))
        return C_SPACE;
    return C_OTHER;
}

size_t dt__bpe_chunk_end(const unsigned char *s, size_t n, size_t i)
{
    /* 's 't 're 've 'm 'll 'd (case-sensitive, as GPT-2's) */
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char c = s[i + 1];
        if (c == 's' || c == 't' || c == 'm' || c == 'd')
            return i + 2;
        if (i + 2 < n && ((c == 'r' && s[i + 2] == 'e') || (c == 'v' && s[i + 2] == 'e') ||
                          (c == 'l' && s[i + 2] == 'l')))
            return i + 3;
    }
    /* ' ?' then a run of letters, digits or others */
    size_t j = i + (s[i] == ' ' && i + 1 < n && byte_class(s[i + 1]) != C_SPACE);
    int cls = byte_class(s[j]);
    if (cls != C_SPACE) {
        while (j < n && byte_class(s[j]) == cls)
            j++;
        return j;
    }
    /* spaces: \s+(?!\S) leaves the last one to the next chunk; \s+ takes a
     * lone one */
    size_t k = i;
    while (k < n && byte_class(s[k]) == C_SPACE)
        k++;
    if (k == n || k - i == 1)
        return k;
    return k - 1;
}

/* ---- the tokenizer ------------------------------------------------------------ */

struct dt_bpe {
    int64_t nm;               /* merges */
    uint32_t (*merges)[2];    /* (nm) */
    dt__pairmap rank;         /* (left, right) -> k */
    size_t *off;              /* (256 + nm + 1) offsets into pool */
    unsigned char *pool;      /* every token's bytes */
};

#define MAX_POOL ((size_t)64 << 20) /* token bytes in all */

dt_status dt__bpe_from_merges(uint32_t (*merges)[2], int64_t nm, const char *name, dt_bpe **out)
{
    *out = NULL;
    dt_bpe *b = calloc(1, sizeof *b);
    if (!b) {
        free(merges);
        return dt_error(DT_ERR_NO_MEMORY, "bpe %s: out of memory", name);
    }
    b->nm = nm;
    b->merges = merges;
    int64_t V = 256 + nm;
    dt_status st = DT_OK;
    b->off = malloc((size_t)(V + 1) * sizeof *b->off);
    if (!b->off) {
        st = dt_error(DT_ERR_NO_MEMORY, "bpe %s: out of memory", name);
        goto fail;
    }
    /* lengths first (in off[id + 1]), to bound the pool before allocating it */
    for (int64_t id = 0; id < 256; id++)
        b->off[id + 1] = 1;
    size_t total = 256;
    for (int64_t k = 0; k < nm; k++) {
        uint32_t l = merges[k][0], r = merges[k][1];
        if (l >= 256 + k || r >= 256 + k) {
            st = dt_error(DT_ERR_FORMAT, "bpe %s: merge %lld uses id %u, not yet defined (ids < %lld)", name,
                          (long long)k, l >= 256 + k ? l : r, (long long)(256 + k));
            goto fail;
        }
        if (dt__pairmap_get(&b->rank, l, r) != UINT32_MAX) {
            st = dt_error(DT_ERR_FORMAT, "bpe %s: merge %lld repeats the pair (%u, %u) of merge %u", name,
                          (long long)k, l, r, dt__pairmap_get(&b->rank, l, r));
            goto fail;
        }
        if ((st = dt__pairmap_put(&b->rank, l, r, (uint32_t)k)) < 0)
            goto fail;
        size_t len = b->off[l + 1] + b->off[r + 1];
        b->off[256 + k + 1] = len;
        total += len;
        if (len > MAX_POOL || total > MAX_POOL) {
            st = dt_error(DT_ERR_FORMAT, "bpe %s: tokens longer than %zu MiB in all (merge %lld)", name,
                          MAX_POOL >> 20, (long long)k);
            goto fail;
        }
    }
    b->pool = malloc(total);
    if (!b->pool) {
        st = dt_error(DT_ERR_NO_MEMORY, "bpe %s: out of memory", name);
        goto fail;
    }
    /* prefix sums turn lengths into offsets; then copy each token's parts */
    b->off[0] = 0;
    for (int64_t id = 0; id < V; id++)
        b->off[id + 1] += b->off[id];
    for (int64_t id = 0; id < V; id++) {
        unsigned char *dst = b->pool + b->off[id];
        if (id < 256) {
            *dst = (unsigned char)id;
            continue;
        }
        uint32_t l = merges[id - 256][0], r = merges[id - 256][1];
        size_t ll = b->off[l + 1] - b->off[l];
        memcpy(dst, b->pool + b->off[l], ll);
        memcpy(dst + ll, b->pool + b->off[r], b->off[r + 1] - b->off[r]);
    }
    *out = b;
    return DT_OK;
fail:
    dt_bpe_free(b);
    return st;
}

void dt_bpe_free(dt_bpe *bpe)
{
    if (!bpe)
        return;
    free(bpe->merges);
    dt__pairmap_free(&bpe->rank);
    free(bpe->off);
    free(bpe->pool);
    free(bpe);
}

int64_t dt_bpe_vocab_size(const dt_bpe *bpe) { return bpe ? 256 + bpe->nm : 0; }

dt_status dt_bpe_merge(const dt_bpe *bpe, int64_t k, uint32_t *left, uint32_t *right)
{
    if (!bpe || !left || !right)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_merge: NULL argument");
    if (k < 0 || k >= bpe->nm)
        return dt_error(DT_ERR_RANGE, "bpe: merge %lld outside 0..%lld", (long long)k, (long long)bpe->nm - 1);
    *left = bpe->merges[k][0];
    *right = bpe->merges[k][1];
    return DT_OK;
}

dt_status dt_bpe_token_bytes(const dt_bpe *bpe, int64_t id, const unsigned char **bytes, size_t *len)
{
    if (!bpe || !bytes || !len)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_token_bytes: NULL argument");
    if (id < 0 || id >= 256 + bpe->nm)
        return dt_error(DT_ERR_RANGE, "bpe: token id %lld outside the vocabulary of %lld", (long long)id,
                        (long long)(256 + bpe->nm));
    *bytes = bpe->pool + bpe->off[id];
    *len = bpe->off[id + 1] - bpe->off[id];
    return DT_OK;
}

/* ---- encode ------------------------------------------------------------------- */

typedef struct heap_ent {
    uint32_t rank;
    uint32_t pos;
} heap_ent;

/* Scratch for one chunk: the symbol list and the heap. */
typedef struct enc_scratch {
    uint32_t *id, *prev, *next; /* prev/next: UINT32_MAX at the ends; id UINT32_MAX = dead */
    heap_ent *heap;
    size_t cap, nh;
} enc_scratch;

static bool ent_less(heap_ent a, heap_ent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(enc_scratch *s, heap_ent e)
{
    size_t i = s->nh++;
    while (i > 0 && ent_less(e, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
}

static heap_ent heap_pop(enc_scratch *s)
{
    heap_ent top = s->heap[0], last = s->heap[--s->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->nh)
            break;
        if (c + 1 < s->nh && ent_less(s->heap[c + 1], s->heap[c]))
            c++;
        if (!ent_less(s->heap[c], last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->nh)
        s->heap[i] = last;
    return top;
}

static dt_status scratch_reserve(enc_scratch *s, size_t n)
{
    if (n <= s->cap)
        return DT_OK;
    size_t cap = s->cap ? s->cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *id = realloc(s->id, cap * sizeof *id);
    if (id)
        s->id = id;
    uint32_t *pv = realloc(s->prev, cap * sizeof *pv);
    if (pv)
        s->prev = pv;
    uint32_t *nx = realloc(s->next, cap * sizeof *nx);
    if (nx)
        s->next = nx;
    /* each merge pushes at most two entries: n - 1 initial + 2 (n - 1) */
    heap_ent *h = realloc(s->heap, 3 * cap * sizeof *h);
    if (h)
        s->heap = h;
    if (!id || !pv || !nx || !h)
        return dt_error(DT_ERR_NO_MEMORY, "bpe encode: out of memory (a chunk of %zu bytes)", n);
    s->cap = cap;
    return DT_OK;
}

static void push_pair(const dt_bpe *b, enc_scratch *s, uint32_t pos)
{
    uint32_t nx = s->next[pos];
    if (nx == UINT32_MAX)
        return;
    uint32_t r = dt__pairmap_get(&b->rank, s->id[pos], s->id[nx]);
    if (r != UINT32_MAX)
        heap_push(s, (heap_ent){r, pos});
}

/* Encode chunk c[0..n) and append its ids to out[*no]. */
static void encode_chunk(const dt_bpe *b, enc_scratch *s, const unsigned char *c, size_t n, uint16_t *out,
                         int64_t *no)
{
    for (size_t i = 0; i < n; i++) {
        s->id[i] = c[i];
        s->prev[i] = i ? (uint32_t)i - 1 : UINT32_MAX;
        s->next[i] = i + 1 < n ? (uint32_t)i + 1 : UINT32_MAX;
    }
    s->nh = 0;
    if (b->nm)
        for (size_t i = 0; i + 1 < n; i++)
            push_pair(b, s, (uint32_t)i);
    while (s->nh) {
        heap_ent e = heap_pop(s);
        uint32_t p = e.pos, q = s->next[p];
        if (s->id[p] == UINT32_MAX || q == UINT32_MAX ||
            dt__pairmap_get(&b->rank, s->id[p], s->id[q]) != e.rank)
            continue; /* stale: p died or its pair changed */
        s->id[p] = 256 + e.rank;
        s->id[q] = UINT32_MAX;
        s->next[p] = s->next[q];
        if (s->next[q] != UINT32_MAX)
            s->prev[s->next[q]] = p;
        if (s->prev[p] != UINT32_MAX)
            push_pair(b, s, s->prev[p]);
        push_pair(b, s, p);
    }
    for (uint32_t i = 0; i != UINT32_MAX; i = s->next[i])
        out[(*no)++] = (uint16_t)s->id[i];
}

dt_status dt_bpe_encode(const dt_bpe *bpe, const void *text, size_t n, uint16_t **ids, int64_t *n_ids)
{
    if (!bpe || (!text && n) || !ids || !n_ids)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (n == 0)
        return DT_OK;
    if (n > UINT32_MAX - 1)
        return dt_error(DT_ERR_INVALID_ARG, "bpe encode: %zu bytes (at most 4 GiB at once)", n);
    uint16_t *out = malloc(n * sizeof *out); /* at most one id per byte */
    if (!out)
        return dt_error(DT_ERR_NO_MEMORY, "bpe encode: out of memory (%zu bytes of text)", n);
    enc_scratch s = {0};
    const unsigned char *t = text;
    int64_t no = 0;
    dt_status st = DT_OK;
    for (size_t i = 0; i < n;) {
        size_t e = dt__bpe_chunk_end(t, n, i);
        if ((st = scratch_reserve(&s, e - i)) < 0)
            break;
        encode_chunk(bpe, &s, t + i, e - i, out, &no);
        i = e;
    }
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    if (st < 0) {
        free(out);
        return st;
    }
    *ids = out;
    *n_ids = no;
    return DT_OK;
}

dt_status dt_bpe_decode(const dt_bpe *bpe, const uint16_t *ids, int64_t n, char **text, size_t *len)
{
    if (!bpe || (!ids && n) || n < 0 || !text || !len)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_decode: bad argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    int64_t V = 256 + bpe->nm;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] >= V)
            return dt_error(DT_ERR_RANGE, "bpe decode: id %u at position %lld is outside the vocabulary of %lld",
                            ids[i], (long long)i, (long long)V);
        total += bpe->off[ids[i] + 1] - bpe->off[ids[i]];
    }
    char *out = malloc(total + 1);
    if (!out)
        return dt_error(DT_ERR_NO_MEMORY, "bpe decode: out of memory (%zu bytes)", total);
    size_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        size_t l = bpe->off[ids[i] + 1] - bpe->off[ids[i]];
        memcpy(out + pos, bpe->pool + bpe->off[ids[i]], l);
        pos += l;
    }
    out[pos] = 0;
    *text = out;
    *len = pos;
    return DT_OK;
}

dt_status dt_bpe_decode_ids(const dt_bpe *bpe, const int64_t *ids, int64_t n, char **text, size_t *len)
{
    if (!bpe || (!ids && n) || n < 0 || !text || !len)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_decode_ids: bad argument");
    *text = NULL;
    *len = 0;
    int64_t V = 256 + bpe->nm; /* <= 65536: every id below it fits 16 bits */
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return dt_error(DT_ERR_RANGE,
                            "bpe decode: id %lld at position %lld is outside the vocabulary of %lld (the model has "
                            "more ids than the BPE: train with the vocabulary's size, --vocab-size %lld)",
                            (long long)ids[i], (long long)i, (long long)V, (long long)V);
    uint16_t *u = malloc((size_t)(n > 0 ? n : 1) * sizeof *u);
    if (!u)
        return dt_error(DT_ERR_NO_MEMORY, "bpe decode: out of memory (%lld ids)", (long long)n);
    for (int64_t i = 0; i < n; i++)
        u[i] = (uint16_t)ids[i];
    dt_status st = dt_bpe_decode(bpe, u, n, text, len);
    free(u);
    return st;
}

/* ---- the vocab file -------------------------------------------------------------- */

#define VOCAB_HEADER "dtrain-bpe 1"
#define MAX_VOCAB_FILE ((size_t)16 << 20)

dt_status dt_bpe_save(const dt_bpe *bpe, const char *path)
{
    if (!bpe || !path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_save: NULL argument");
    dt__sbuf b = {0};
    char line[160];
    int l = snprintf(line, sizeof line, "%s\nmerges %lld\n", VOCAB_HEADER, (long long)bpe->nm);
    dt__sbuf_put(&b, line, (size_t)l);
    for (int64_t k = 0; k < bpe->nm; k++) {
        l = snprintf(line, sizeof line, "%u %u  # ", bpe->merges[k][0], bpe->merges[k][1]);
        dt__sbuf_put(&b, line, (size_t)l);
        /* the token's bytes for people: printable ASCII as is, the rest \xNN,
         * at most 32 bytes shown */
        size_t o = bpe->off[256 + k], n = bpe->off[256 + k + 1] - o;
        for (size_t i = 0; i < n && i < 32; i++) {
            unsigned char c = bpe->pool[o + i];
            if (c >= 0x20 && c < 0x7f && c != '\\')
                l = snprintf(line, sizeof line, "%c", c);
            else
                l = snprintf(line, sizeof line, "\\x%02x", c);
            dt__sbuf_put(&b, line, (size_t)l);
        }
        dt__sbuf_put(&b, n > 32 ? "...\n" : "\n", n > 32 ? 4 : 1);
    }
    dt_status st = b.oom ? dt_error(DT_ERR_NO_MEMORY, "vocab file %s: out of memory", path)
                         : dt_file_write_atomic(path, b.p, b.n, 0644);
    free(b.p);
    return st;
}

/* One decimal id at p: digits only, < lim. Advances *p. */
static bool parse_id(const char **p, const char *end, uint64_t lim, uint32_t *out)
{
    const char *s = *p;
    uint64_t v = 0;
    if (s >= end || *s < '0' || *s > '9' || (*s == '0' && s + 1 < end && s[1] >= '0' && s[1] <= '9'))
        return false;
    while (s < end && *s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s - '0');
        if (v >= lim)
            return false;
        s++;
    }
    *p = s;
    *out = (uint32_t)v;
    return true;
}

dt_status dt_bpe_load_mem(const void *buf, size_t n, const char *name, dt_bpe **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_load_mem: out is NULL");
    *out = NULL;
    if (!buf && n)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_load_mem: NULL buffer");
    if (!name)
        name = "<memory>";
    const char *s = buf, *end = s + n;
    /* line 1 */
    size_t hl = strlen(VOCAB_HEADER);
    if (n < hl + 1 || memcmp(s, VOCAB_HEADER, hl) || s[hl] != '\n')
        return dt_error(DT_ERR_FORMAT, "vocab file %s:1: not a dtrain BPE vocab (want the line \"%s\")", name,
                        VOCAB_HEADER);
    s += hl + 1;
    /* line 2 */
    uint32_t nm;
    if (end - s < 7 || memcmp(s, "merges ", 7))
        return dt_error(DT_ERR_FORMAT, "vocab file %s:2: want \"merges N\"", name);
    s += 7;
    if (!parse_id(&s, end, DT_BPE_MAX_VOCAB - 256 + 1, &nm) || s >= end || *s != '\n')
        return dt_error(DT_ERR_FORMAT, "vocab file %s:2: want \"merges N\" with 0 <= N <= %d and nothing after",
                        name, DT_BPE_MAX_VOCAB - 256);
    s++;
    uint32_t(*merges)[2] = malloc((nm ? nm : 1) * sizeof *merges);
    if (!merges)
        return dt_error(DT_ERR_NO_MEMORY, "vocab file %s: out of memory", name);
    for (uint32_t k = 0; k < nm; k++) {
        long long line = (long long)k + 3;
        uint32_t a, b;
        if (s >= end) {
            free(merges);
            return dt_error(DT_ERR_FORMAT, "vocab file %s:%lld: truncated: %u of %u merges", name, line, k, nm);
        }
        if (!parse_id(&s, end, 256 + (uint64_t)k, &a) || s >= end || *s != ' ' ||
            (s++, !parse_id(&s, end, 256 + (uint64_t)k, &b))) {
            free(merges);
            return dt_error(DT_ERR_FORMAT,
                            "vocab file %s:%lld: want \"LEFT RIGHT\", two ids below %lld (merge %u makes id %lld)",
                            name, line, (long long)(256 + k), k, (long long)(256 + k));
        }
        /* optional "  # comment" */
        if (s < end && *s == ' ') {
            while (s < end && *s == ' ')
                s++;
            if (s >= end || *s != '#') {
                free(merges);
                return dt_error(DT_ERR_FORMAT, "vocab file %s:%lld: unexpected text after the ids", name, line);
            }
            const char *nl = memchr(s, '\n', (size_t)(end - s));
            s = nl ? nl : end;
        }
        if (s >= end || *s != '\n') {
            free(merges);
            return dt_error(DT_ERR_FORMAT, "vocab file %s:%lld: %s", name, line,
                            s >= end ? "no newline at the end of the line" : "unexpected text after the ids");
        }
        s++;
        merges[k][0] = a;
        merges[k][1] = b;
    }
    if (s != end) {
        free(merges);
        return dt_error(DT_ERR_FORMAT, "vocab file %s:%lld: text after the %u merges the file announces", name,
                        (long long)nm + 3, nm);
    }
    return dt__bpe_from_merges(merges, nm, name, out);
}

dt_status dt_bpe_load(const char *path, dt_bpe **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_load: out is NULL");
    *out = NULL;
    if (!path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_bpe_load: path is NULL");
    const char *why;
    FILE *f = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    if (!f)
        return dt_error(DT_ERR_IO, "vocab file %s: cannot open: %s", path, why);
    char *buf = malloc(MAX_VOCAB_FILE + 1);
    if (!buf) {
        fclose(f);
        return dt_error(DT_ERR_NO_MEMORY, "vocab file %s: out of memory", path);
    }
    size_t n = fread(buf, 1, MAX_VOCAB_FILE + 1, f);
    bool err = ferror(f);
    fclose(f);
    dt_status st;
    if (err)
        st = dt_error(DT_ERR_IO, "vocab file %s: read error (a directory?)", path);
    else if (n > MAX_VOCAB_FILE)
        st = dt_error(DT_ERR_IO, "vocab file %s: larger than %zu MiB", path, MAX_VOCAB_FILE >> 20);
    else
        st = dt_bpe_load_mem(buf, n, path, out);
    free(buf);
    return st;
}
