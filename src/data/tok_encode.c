/* Encoding and decoding with a tokenizer.json (tokenizer.h).
 *
 * Text flows through the pipeline one piece at a time: added-token
 * splitting (raw, then normalized), then each pre-tokenizer step in turn,
 * each step handing its pieces to the next (recursion depth = the number of
 * steps, at most TOK_MAX_PRETOK), then the BPE model appends ids. Each
 * depth owns two growing buffers (the prefixed copy of its input and the
 * byte-level mapped piece) and a span list, reused from piece to piece, so
 * encoding a corpus allocates only while its buffers grow.
 *
 * The BPE merge loop is the library's Word::merge_all: symbols in a linked
 * list, candidate pairs in a min-heap by (rank, position); a popped pair is
 * applied only if both symbols still exist and still form that pair. */
#include "tok_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct span {
    size_t a, b;
    bool match;
} span;

typedef struct hent {
    uint32_t rank, pos;
} hent;

typedef struct enc {
    const dt_tokenizer *t;
    uint32_t *ids;
    size_t n, cap;
    dt__re_scratch re;
    unsigned char *buf[TOK_MAX_PRETOK][2];
    size_t bufcap[TOK_MAX_PRETOK][2];
    span *spans[TOK_MAX_PRETOK];
    size_t nspan[TOK_MAX_PRETOK], spancap[TOK_MAX_PRETOK];
    /* the model's word */
    uint32_t *sid, *sprev, *snext;
    hent *heap;
    size_t symcap, nh;
    char *tmp;
    size_t tmpcap;
    tok_norm_scratch norm; /* the normalizer's buffers */
} enc;

static dt_status oom(void) { return dt_error(DT_ERR_NO_MEMORY, "tokenizer encode: out of memory"); }

static dt_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return DT_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *nw = realloc(*p, c * elem);
    if (!nw)
        return oom();
    *p = nw;
    *cap = c;
    return DT_OK;
}

static dt_status put_id(enc *e, uint32_t id)
{
    if (e->n == e->cap && grow((void **)&e->ids, &e->cap, e->n + 1, sizeof *e->ids) < 0)
        return DT_ERR_NO_MEMORY;
    e->ids[e->n++] = id;
    return DT_OK;
}

/* ---- the BPE model ------------------------------------------------------------------------- */

static bool hless(hent a, hent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void hpush(enc *e, hent x)
{
    size_t i = e->nh++;
    while (i > 0 && hless(x, e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = x;
}

static hent hpop(enc *e)
{
    hent top = e->heap[0], last = e->heap[--e->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->nh)
            break;
        if (c + 1 < e->nh && hless(e->heap[c + 1], e->heap[c]))
            c++;
        if (!hless(e->heap[c], last))
            break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->nh)
        e->heap[i] = last;
    return top;
}

static void push_pair(enc *e, uint32_t pos)
{
    uint32_t nx = e->snext[pos];
    if (nx == TOK_NONE)
        return;
    uint32_t r = dt__pairmap_get(&e->t->merges, e->sid[pos], e->sid[nx]);
    if (r != UINT32_MAX)
        hpush(e, (hent){r, pos});
}

static dt_status add_sym(enc *e, size_t *ns, uint32_t id)
{
    if (*ns >= e->symcap) {
        size_t cap = e->symcap ? e->symcap * 2 : 256;
        while (cap <= *ns)
            cap *= 2;
        uint32_t *a = realloc(e->sid, cap * sizeof *a);
        if (a)
            e->sid = a;
        uint32_t *b = realloc(e->sprev, cap * sizeof *b);
        if (b)
            e->sprev = b;
        uint32_t *c = realloc(e->snext, cap * sizeof *c);
        if (c)
            e->snext = c;
        hent *h = realloc(e->heap, 3 * cap * sizeof *h); /* n - 1 initial pairs + 2 per merge */
        if (h)
            e->heap = h;
        if (!a || !b || !c || !h)
            return oom();
        e->symcap = cap;
    }
    e->sid[(*ns)++] = id;
    return DT_OK;
}

/* The vocab id of prefix + s[0,n) + suffix (either may be NULL). */
static uint32_t lookup_affixed(enc *e, const char *pre, const char *s, size_t n, const char *suf)
{
    const dt_tokenizer *t = e->t;
    if (!pre && !suf)
        return dt__tok_strmap_get(&t->vocab, &t->pool, s, n);
    size_t pl = pre ? strlen(pre) : 0, sl = suf ? strlen(suf) : 0;
    if (grow((void **)&e->tmp, &e->tmpcap, pl + n + sl + 1, 1) < 0)
        return TOK_NONE - 1; /* out of memory: the caller reports it */
    if (pl)
        memcpy(e->tmp, pre, pl);
    memcpy(e->tmp + pl, s, n);
    if (sl)
        memcpy(e->tmp + pl + n, suf, sl);
    return dt__tok_strmap_get(&t->vocab, &t->pool, e->tmp, pl + n + sl);
}

/* BPE.tokenize on one pre-token w[0, n). */
static dt_status model_encode(enc *e, const unsigned char *w, size_t n)
{
    const dt_tokenizer *t = e->t;
    if (n == 0)
        return DT_OK;
    if (t->ignore_merges) {
        uint32_t id = dt__tok_strmap_get(&t->vocab, &t->pool, (const char *)w, n);
        if (id != TOK_NONE)
            return put_id(e, id);
    }
    size_t ns = 0;
    uint32_t unk = TOK_NONE; /* a pending unk (fuse_unk) */
    dt_status st;
    for (size_t i = 0; i < n;) {
        size_t l;
        dt__utf8_next(w, n, i, &l);
        bool first = i == 0, last = i + l >= n;
        uint32_t id = lookup_affixed(e, first ? NULL : t->prefix, (const char *)w + i, l, last ? t->suffix : NULL);
        if (id == TOK_NONE - 1)
            return oom();
        if (id != TOK_NONE) {
            if (unk != TOK_NONE && (st = add_sym(e, &ns, unk)) < 0)
                return st;
            unk = TOK_NONE;
            if ((st = add_sym(e, &ns, id)) < 0)
                return st;
            i += l;
            continue;
        }
        if (t->byte_fallback) {
            /* one <0xXX> per byte of the (affixed) character, if all exist */
            const char *pre = first ? NULL : t->prefix, *suf = last ? t->suffix : NULL;
            size_t pl = pre ? strlen(pre) : 0, sl = suf ? strlen(suf) : 0, tot = pl + l + sl;
            uint32_t bids[64];
            bool all = tot <= 64;
            for (size_t k = 0; all && k < tot; k++) {
                unsigned char b = (unsigned char)(k < pl ? pre[k] : k < pl + l ? w[i + k - pl] : suf[k - pl - l]);
                char code[8];
                static const char hex[] = "0123456789ABCDEF";
                code[0] = '<', code[1] = '0', code[2] = 'x', code[3] = hex[b >> 4], code[4] = hex[b & 15];
                code[5] = '>';
                bids[k] = dt__tok_strmap_get(&t->vocab, &t->pool, code, 6);
                all = bids[k] != TOK_NONE;
            }
            if (all) {
                for (size_t k = 0; k < tot; k++)
                    if ((st = add_sym(e, &ns, bids[k])) < 0)
                        return st;
                i += l;
                continue;
            }
        }
        if (t->unk != TOK_NONE) {
            if (unk != TOK_NONE && !t->fuse_unk && (st = add_sym(e, &ns, unk)) < 0)
                return st;
            unk = t->unk;
        }
        /* else the character is dropped, as the library drops it */
        i += l;
    }
    if (unk != TOK_NONE && (st = add_sym(e, &ns, unk)) < 0)
        return st;
    if (ns == 0)
        return DT_OK;
    for (size_t i = 0; i < ns; i++) {
        e->sprev[i] = i ? (uint32_t)i - 1 : TOK_NONE;
        e->snext[i] = i + 1 < ns ? (uint32_t)i + 1 : TOK_NONE;
    }
    e->nh = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        push_pair(e, (uint32_t)i);
    while (e->nh) {
        hent h = hpop(e);
        uint32_t p = h.pos, q = e->snext[p];
        if (e->sid[p] == TOK_NONE || q == TOK_NONE || dt__pairmap_get(&t->merges, e->sid[p], e->sid[q]) != h.rank)
            continue; /* stale */
        e->sid[p] = t->merge_new[h.rank];
        e->sid[q] = TOK_NONE;
        e->snext[p] = e->snext[q];
        if (e->snext[q] != TOK_NONE)
            e->sprev[e->snext[q]] = p;
        if (e->sprev[p] != TOK_NONE)
            push_pair(e, e->sprev[p]);
        push_pair(e, p);
    }
    for (uint32_t i = 0; i != TOK_NONE; i = e->snext[i])
        if ((st = put_id(e, e->sid[i])) < 0)
            return st;
    return DT_OK;
}

/* ---- pre-tokenizers ---------------------------------------------------------------------------- */

/* Pre-tokenizer k and those after it over the piece s[0, n); at0: the piece starts where the text does (its
 * offset in the original 0: Metaspace's prepend_scheme "first"). */
static dt_status pretok(enc *e, int k, const unsigned char *s, size_t n, bool at0);

static dt_status add_span(enc *e, int k, size_t a, size_t b, bool match)
{
    if (grow((void **)&e->spans[k], &e->spancap[k], e->nspan[k] + 1, sizeof(span)) < 0)
        return DT_ERR_NO_MEMORY;
    e->spans[k][e->nspan[k]++] = (span){a, b, match};
    return DT_OK;
}

/* The library's Pattern::find_matches: matches and the gaps between them,
 * covering s, into spans[k]. Empty matches follow the onig crate's
 * find_iter: one right after the previous match is skipped. */
static dt_status find_matches(enc *e, int k, const tok_pretok *p, const unsigned char *s, size_t n)
{
    e->nspan[k] = 0;
    size_t prev = 0, from = 0, last_end = 0;
    bool have_last = false;
    dt_status st;
    while (from <= n) {
        size_t ms, me;
        if (p->re) {
            int r = dt__re_search(p->re, &e->re, s, n, from, &ms, &me);
            if (r < 0)
                return r;
            if (r == 0)
                break;
            if (ms == me && have_last && last_end == me) {
                if (from >= n)
                    break;
                size_t l;
                dt__utf8_next(s, n, from, &l);
                from += l;
                continue;
            }
        } else {
            if (p->literal_len == 0 || n - from < p->literal_len)
                break;
            const unsigned char *hit = memmem(s + from, n - from, p->literal, p->literal_len);
            if (!hit)
                break;
            ms = (size_t)(hit - s);
            me = ms + p->literal_len;
        }
        from = me;
        last_end = me;
        have_last = true;
        if (prev != ms && (st = add_span(e, k, prev, ms, false)) < 0)
            return st;
        if ((st = add_span(e, k, ms, me, true)) < 0)
            return st;
        prev = me;
    }
    if (prev != n && (st = add_span(e, k, prev, n, false)) < 0)
        return st;
    return DT_OK;
}

/* normalized.split(pattern, behavior): spans[k] become the pieces to keep
 * (in place); returns their number. */
static size_t apply_behavior(enc *e, int k, int behavior, bool invert)
{
    span *sp = e->spans[k];
    size_t n = e->nspan[k], o = 0;
    if (invert)
        for (size_t i = 0; i < n; i++)
            sp[i].match = !sp[i].match;
    switch (behavior) {
    case SB_ISOLATED:
        return n;
    case SB_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!sp[i].match)
                sp[o++] = sp[i];
        return o;
    case SB_CONTIGUOUS:
    case SB_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            bool join = behavior == SB_CONTIGUOUS ? sp[i].match == prev_match : sp[i].match && !prev_match;
            if (join && o > 0)
                sp[o - 1].b = sp[i].b;
            else
                sp[o++] = sp[i];
            prev_match = sp[i].match;
        }
        return o;
    }
    case SB_MERGED_NEXT: { /* the same from the right */
        bool prev_match = false;
        size_t w = n; /* write from the end */
        for (size_t i = n; i-- > 0;) {
            bool join = sp[i].match && !prev_match;
            if (join && w < n)
                sp[w].a = sp[i].a;
            else
                sp[--w] = sp[i];
            prev_match = sp[i].match;
        }
        memmove(sp, sp + w, (n - w) * sizeof *sp);
        return n - w;
    }
    }
    return n;
}

/* The ByteLevel mapping of s[0, n) into buf[k][1], then the next step. */
static dt_status bytelevel_next(enc *e, int k, const unsigned char *s, size_t n, bool at0)
{
    if (grow((void **)&e->buf[k][1], &e->bufcap[k][1], 2 * n + 1, 1) < 0)
        return DT_ERR_NO_MEMORY;
    unsigned char *o = e->buf[k][1];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += dt__utf8_put(dt__tok_byte_char(s[i]), o + m);
    return pretok(e, k + 1, o, m, at0);
}

/* Metaspace: s[0, n) with every space the replacement, one more before it where the scheme asks and it does not
 * start with one already, into buf[k][0]; then, with split, cut before each replacement. */
static dt_status metaspace(enc *e, int k, const tok_pretok *p, const unsigned char *s, size_t n, bool at0)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += s[i] == ' ';
    const size_t rl = p->literal_len;
    if (grow((void **)&e->buf[k][0], &e->bufcap[k][0], n + spaces * rl + rl + 1, 1) < 0)
        return DT_ERR_NO_MEMORY;
    unsigned char *o = e->buf[k][0];
    const bool pre = (p->prepend == MS_ALWAYS || (p->prepend == MS_FIRST && at0)) && s[0] != ' ' &&
                     (n < rl || memcmp(s, p->literal, rl));
    size_t m = 0;
    if (pre) {
        memcpy(o, p->literal, rl);
        m = rl;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') {
            memcpy(o + m, p->literal, rl);
            m += rl;
        } else {
            o[m++] = s[i];
        }
    if (!p->split)
        return pretok(e, k + 1, o, m, at0);
    dt_status st = find_matches(e, k, p, o, m);
    size_t np = st < 0 ? 0 : apply_behavior(e, k, p->behavior, false);
    for (size_t i = 0; st >= 0 && i < np; i++)
        st = pretok(e, k + 1, o + e->spans[k][i].a, e->spans[k][i].b - e->spans[k][i].a, at0 && !e->spans[k][i].a);
    return st;
}

static dt_status pretok(enc *e, int k, const unsigned char *s, size_t n, bool at0)
{
    if (n == 0)
        return DT_OK; /* empty pieces are dropped */
    if (k == e->t->npretok)
        return model_encode(e, s, n);
    const tok_pretok *p = &e->t->pretok[k];
    dt_status st;
    if (p->kind == PT_METASPACE)
        return metaspace(e, k, p, s, n, at0);
    if (p->kind == PT_BYTELEVEL) {
        if (p->add_prefix_space && s[0] != ' ') {
            if (grow((void **)&e->buf[k][0], &e->bufcap[k][0], n + 2, 1) < 0)
                return DT_ERR_NO_MEMORY;
            e->buf[k][0][0] = ' ';
            memcpy(e->buf[k][0] + 1, s, n);
            s = e->buf[k][0];
            n++;
        }
        if (!p->re)
            return bytelevel_next(e, k, s, n, at0);
        if ((st = find_matches(e, k, p, s, n)) < 0)
            return st;
        for (size_t i = 0; i < e->nspan[k]; i++)
            if ((st = bytelevel_next(e, k, s + e->spans[k][i].a, e->spans[k][i].b - e->spans[k][i].a,
                                     at0 && !e->spans[k][i].a)) < 0)
                return st;
        return DT_OK;
    }
    if ((st = find_matches(e, k, p, s, n)) < 0)
        return st;
    size_t np = apply_behavior(e, k, p->behavior, p->invert);
    for (size_t i = 0; i < np; i++)
        if ((st = pretok(e, k + 1, s + e->spans[k][i].a, e->spans[k][i].b - e->spans[k][i].a,
                         at0 && !e->spans[k][i].a)) < 0)
            return st;
    return DT_OK;
}

/* ---- added tokens ---------------------------------------------------------------------------------- */

static bool ends_with_word(const unsigned char *s, size_t n)
{
    if (n == 0)
        return false;
    size_t i = n - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80)
        i--;
    size_t l;
    return dt__unicode_word(dt__utf8_next(s, n, i, &l));
}

/* The leftmost-longest added token of set at or after from: its index into
 * added[], start and end; false if none. */
static bool find_added(const dt_tokenizer *t, const tok_addset *set, const unsigned char *s, size_t n, size_t from,
                       uint32_t *idx, size_t *ms)
{
    for (size_t i = from; i < n; i++) {
        unsigned b = s[i];
        for (uint32_t k = set->start[b]; k < set->start[b + 1]; k++) {
            const tok_added *a = &t->added[set->idx[k]];
            if (a->len <= n - i && !memcmp(s + i, t->pool.p + a->off, a->len)) {
                *idx = set->idx[k];
                *ms = i;
                return true;
            }
        }
    }
    return false;
}

/* The added tokens of level 0 (raw) or 1 (normalized) in s[0, n), the pieces between them on to the next level;
 * at0: s starts where the text does. */
static dt_status split_added(enc *e, int level, const unsigned char *s, size_t n, bool at0)
{
    const dt_tokenizer *t = e->t;
    const tok_addset *set = level == 0 ? &t->raw_set : &t->norm_set;
    size_t start_offset = 0, from = 0;
    dt_status st;
    if (level == 1 && t->nnorm) { /* a piece between raw added tokens: normalized, then the normalized ones */
        if ((st = dt__tok_normalize(t->norm, t->nnorm, &e->norm, s, n, &s, &n)) < 0)
            return st;
    }
    uint32_t idx;
    size_t ms;
    while (set->n && from < n && find_added(t, set, s, n, from, &idx, &ms)) {
        const tok_added *a = &t->added[idx];
        size_t start = ms, stop = ms + a->len;
        from = stop;
        if (a->single_word) {
            bool start_space = start == 0 || !ends_with_word(s, start);
            size_t l;
            bool stop_space = stop == n || !dt__unicode_word(dt__utf8_next(s, n, stop, &l));
            if (!start_space || !stop_space)
                continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) { /* the whitespace run that ends at start */
                size_t i = ns - 1, l;
                while (i > 0 && (s[i] & 0xC0) == 0x80)
                    i--;
                if (!dt__unicode_space(dt__utf8_next(s, n, i, &l)))
                    break;
                ns = i;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            size_t l;
            while (stop < n && dt__unicode_space(dt__utf8_next(s, n, stop, &l)))
                stop += l;
        }
        if (start_offset < start) {
            st = level == 0 ? split_added(e, 1, s + start_offset, start - start_offset, at0 && !start_offset)
                            : pretok(e, 0, s + start_offset, start - start_offset, at0 && !start_offset);
            if (st < 0)
                return st;
        }
        if ((st = put_id(e, a->id)) < 0)
            return st;
        start_offset = stop;
    }
    if (start_offset < n)
        return level == 0 ? split_added(e, 1, s + start_offset, n - start_offset, at0 && !start_offset)
                          : pretok(e, 0, s + start_offset, n - start_offset, at0 && !start_offset);
    return DT_OK;
}

dt_status dt_tokenizer_encode(const dt_tokenizer *t, const void *text, size_t n, bool add_special, uint32_t **ids,
                              int64_t *n_ids)
{
    if (!t || (!text && n) || !ids || !n_ids)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    size_t bad;
    if (!dt__utf8_valid(text, n, &bad))
        return dt_error(DT_ERR_INVALID_ARG, "tokenizer encode: the text is not valid UTF-8 (byte %zu)", bad);
    enc e = {.t = t};
    dt_status st = DT_OK;
    for (uint32_t i = 0; add_special && st == DT_OK && i < t->npre; i++)
        st = put_id(&e, t->pre_ids[i]);
    if (st == DT_OK)
        st = split_added(&e, 0, text, n, true);
    for (uint32_t i = 0; add_special && st == DT_OK && i < t->npost; i++)
        st = put_id(&e, t->post_ids[i]);
    dt__re_scratch_free(&e.re);
    for (int k = 0; k < TOK_MAX_PRETOK; k++) {
        free(e.buf[k][0]);
        free(e.buf[k][1]);
        free(e.spans[k]);
    }
    free(e.sid);
    free(e.sprev);
    free(e.snext);
    free(e.heap);
    free(e.tmp);
    dt__tok_norm_scratch_free(&e.norm);
    if (st < 0) {
        free(e.ids);
        return st;
    }
    *ids = e.ids;
    *n_ids = (int64_t)e.n;
    return DT_OK;
}

/* ---- decode ------------------------------------------------------------------------------------------- */

dt_status dt_tokenizer_decode(const dt_tokenizer *t, const uint32_t *ids, int64_t n, bool skip_special, char **text,
                              size_t *len)
{
    if (!t || (!ids && n) || n < 0 || !text || !len)
        return dt_error(DT_ERR_INVALID_ARG, "dt_tokenizer_decode: bad argument");
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t id = ids[i];
        if (id >= t->nid || (t->added_by_id[id] == TOK_NONE && t->id_len[id] == TOK_NONE))
            return dt_error(DT_ERR_RANGE, "tokenizer decode: id %u at position %lld has no token (vocab size %u)", id,
                            (long long)i, t->nid);
        total += (t->added_by_id[id] != TOK_NONE ? t->added[t->added_by_id[id]].len : t->id_len[id]) + 1;
    }
    if (t->ndec) { /* a decoder of several steps */
        const unsigned char **toks = malloc((size_t)(n ? n : 1) * sizeof *toks);
        size_t *lens = malloc((size_t)(n ? n : 1) * sizeof *lens), k = 0;
        dt_status st = toks && lens ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "tokenizer decode: out of memory");
        for (int64_t i = 0; st == DT_OK && i < n; i++) {
            uint32_t id = ids[i], a = t->added_by_id[id];
            if (a != TOK_NONE && skip_special && t->added[a].special)
                continue;
            toks[k] = (const unsigned char *)t->pool.p + (a != TOK_NONE ? t->added[a].off : t->id_off[id]);
            lens[k++] = a != TOK_NONE ? t->added[a].len : t->id_len[id];
        }
        if (st == DT_OK)
            st = dt__tok_decode_chain(t, toks, lens, k, text, len);
        free(toks);
        free(lens);
        return st;
    }
    char *out = malloc(total + 1);
    if (!out)
        return dt_error(DT_ERR_NO_MEMORY, "tokenizer decode: out of memory");
    size_t o = 0;
    bool firsttok = true;
    for (int64_t i = 0; i < n; i++) {
        uint32_t id = ids[i], a = t->added_by_id[id];
        if (a != TOK_NONE && skip_special && t->added[a].special)
            continue;
        const unsigned char *s = (const unsigned char *)t->pool.p + (a != TOK_NONE ? t->added[a].off : t->id_off[id]);
        size_t l = a != TOK_NONE ? t->added[a].len : t->id_len[id];
        if (!t->byte_decoder) {
            if (!firsttok)
                out[o++] = ' ';
            memcpy(out + o, s, l);
            o += l;
            firsttok = false;
            continue;
        }
        /* every character one of GPT-2's byte characters: their bytes; else the token's own text */
        size_t o0 = o;
        bool mapped = true;
        for (size_t k = 0; k < l;) {
            size_t cl;
            int b = dt__tok_char_byte(dt__utf8_next(s, l, k, &cl));
            if (b < 0) {
                mapped = false;
                break;
            }
            out[o++] = (char)b;
            k += cl;
        }
        if (!mapped) {
            o = o0;
            memcpy(out + o, s, l);
            o += l;
        }
    }
    out[o] = 0;
    *text = out;
    *len = o;
    return DT_OK;
}
