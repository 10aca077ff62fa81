/* tokenizer.json normalizers (tok_norm.h): the Unicode normal forms, Lowercase,
 * Prepend, Replace and Strip, applied in turn, each from one buffer into the
 * other.
 *
 * The normal forms are UAX #15's: every code point replaced by its full
 * decomposition (canonical for NFC/NFD, compatibility for NFKC/NFKD; Hangul
 * syllables algorithmically), runs of non-starters put in canonical order
 * (a stable sort by combining class), then for NFC/NFKC each character
 * composed with the last starter when it is not blocked (no character of
 * the same or a higher class between them, or it follows the starter
 * directly) and the pair is a primary composite. Lowercase is Rust's
 * char::to_lowercase per character (U+0130 becomes "i" + U+0307; no
 * context-dependent final sigma). Prepend adds its text to a non-empty
 * string; Replace replaces every leftmost non-overlapping match of its
 * String or Regex pattern; Strip removes leading and/or trailing
 * White_Space. */
#include "tok_norm.h"
#include "tok_regex.h"

#include <stdlib.h>
#include <string.h>

static dt_status oom(void) { return dt_error(DT_ERR_NO_MEMORY, "tokenizer normalizer: out of memory"); }

static dt_status buf_reserve(tok_buf *b, size_t extra)
{
    if (b->n + extra <= b->cap)
        return DT_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra)
        cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p)
        return oom();
    b->p = p;
    b->cap = cap;
    return DT_OK;
}

static dt_status buf_put(tok_buf *b, const void *s, size_t n)
{
    if (n == 0) /* nothing to add (and b->p may still be NULL) */
        return DT_OK;
    if (buf_reserve(b, n) < 0)
        return DT_ERR_NO_MEMORY;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return DT_OK;
}

static size_t utf8_put(uint32_t cp, unsigned char *o)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 63));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63));
    o[3] = (unsigned char)(0x80 | (cp & 63));
    return 4;
}

static dt_status buf_cp(tok_buf *b, uint32_t cp)
{
    if (buf_reserve(b, 4) < 0)
        return DT_ERR_NO_MEMORY;
    b->n += utf8_put(cp, b->p + b->n);
    return DT_OK;
}

/* ---- the normal forms ------------------------------------------------------------------- */

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static int ccc(uint32_t c)
{
    if (c < 0x300)
        return 0;
    size_t lo = 0, hi = dt__unorm_nccc;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((dt__unorm_ccc[mid] >> 8) <= c)
            lo = mid;
        else
            hi = mid;
    }
    return (int)(dt__unorm_ccc[lo] & 255);
}

uint32_t dt__unorm_to_lower(uint32_t c)
{
    if (c < 0x80)
        return c >= 'A' && c <= 'Z' ? c + 32 : c;
    size_t lo = 0, hi = dt__unorm_nlower;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (dt__unorm_lower[mid][0] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < dt__unorm_nlower && dt__unorm_lower[lo][0] == c ? dt__unorm_lower[lo][1] : c;
}

/* The decomposition entries of c: [*first, *first + *n) (0 when none). */
static void decomp_find(uint32_t c, size_t *first, size_t *n)
{
    size_t lo = 0, hi = dt__unorm_ndecomp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (dt__unorm_decomp[mid][0] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t k = lo;
    while (k < dt__unorm_ndecomp && dt__unorm_decomp[k][0] == c)
        k++;
    *first = lo;
    *n = k - lo;
}

static dt_status cp_push(tok_norm_scratch *sc, size_t *n, uint32_t c)
{
    if (*n == sc->cpcap) {
        size_t cap = sc->cpcap ? sc->cpcap * 2 : 256;
        uint32_t *p = realloc(sc->cp, cap * sizeof *p);
        if (!p)
            return oom();
        sc->cp = p;
        sc->cpcap = cap;
    }
    sc->cp[(*n)++] = c;
    return DT_OK;
}

static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = dt__unorm_ncomp;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const uint32_t *e = dt__unorm_comp[mid];
        if (e[0] < a || (e[0] == a && e[1] < b))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < dt__unorm_ncomp && dt__unorm_comp[lo][0] == a && dt__unorm_comp[lo][1] == b)
        return dt__unorm_comp[lo][2];
    return 0;
}

static dt_status unicode_form(int kind, tok_norm_scratch *sc, const unsigned char *s, size_t len, tok_buf *out)
{
    bool compat = kind == NORM_NFKC || kind == NORM_NFKD, comp = kind == NORM_NFC || kind == NORM_NFKC;
    size_t n = 0;
    dt_status st;
    for (size_t i = 0; i < len;) {
        size_t l;
        uint32_t c = dt__utf8_next(s, len, i, &l);
        i += l;
        if (c >= S_BASE && c < S_BASE + S_COUNT) {
            uint32_t k = c - S_BASE, t = k % T_COUNT;
            if ((st = cp_push(sc, &n, L_BASE + k / N_COUNT)) < 0 ||
                (st = cp_push(sc, &n, V_BASE + (k % N_COUNT) / T_COUNT)) < 0 ||
                (t && (st = cp_push(sc, &n, T_BASE + t)) < 0))
                return st;
            continue;
        }
        size_t f = 0, m = 0;
        if (c >= 0xA0)
            decomp_find(c, &f, &m);
        /* the canonical entry (flag 1) serves both forms unless a compatibility one (flag 2) follows */
        const uint32_t *e = NULL;
        for (size_t k = f; k < f + m; k++)
            if (dt__unorm_decomp[k][2] == 1 || compat)
                e = dt__unorm_decomp[k];
        if (!e) {
            if ((st = cp_push(sc, &n, c)) < 0)
                return st;
            continue;
        }
        for (uint32_t k = 0; k < (e[1] & 31); k++)
            if ((st = cp_push(sc, &n, dt__unorm_data[(e[1] >> 5) + k])) < 0)
                return st;
    }
    uint32_t *cp = sc->cp;
    /* canonical order: insertion sort of each run of non-starters by class (stable) */
    for (size_t i = 1; i < n; i++) {
        int ci = ccc(cp[i]);
        if (ci == 0)
            continue;
        size_t j = i;
        uint32_t c = cp[i];
        while (j > 0 && ccc(cp[j - 1]) > ci) {
            cp[j] = cp[j - 1];
            j--;
        }
        cp[j] = c;
    }
    if (comp && n > 1) {
        size_t starter = 0, w = 1;
        int last = ccc(cp[0]) ? 256 : 0;
        bool have_starter = last == 0;
        for (size_t i = 1; i < n; i++) {
            uint32_t c = cp[i];
            int cc = ccc(c);
            uint32_t k = have_starter ? compose(cp[starter], c) : 0;
            if (k && (last < cc || last == 0)) {
                cp[starter] = k;
                continue;
            }
            if (cc == 0) {
                starter = w;
                have_starter = true;
            }
            last = cc;
            cp[w++] = c;
        }
        n = w;
    }
    out->n = 0;
    for (size_t i = 0; i < n; i++)
        if ((st = buf_cp(out, cp[i])) < 0)
            return st;
    return DT_OK;
}

/* ---- the others ------------------------------------------------------------------------ */

static dt_status lowercase(const unsigned char *s, size_t len, tok_buf *out)
{
    out->n = 0;
    dt_status st;
    for (size_t i = 0; i < len;) {
        size_t l;
        uint32_t c = dt__utf8_next(s, len, i, &l);
        if (c < 0x80) {
            if ((st = buf_cp(out, c >= 'A' && c <= 'Z' ? c + 32 : c)) < 0)
                return st;
        } else if (c == 0x130) {
            if ((st = buf_cp(out, 'i')) < 0 || (st = buf_cp(out, 0x307)) < 0)
                return st;
        } else if ((st = buf_cp(out, dt__unorm_to_lower(c))) < 0) {
            return st;
        }
        i += l;
    }
    return DT_OK;
}

static dt_status replace(const tok_norm *nm, tok_norm_scratch *sc, const unsigned char *s, size_t len, tok_buf *out)
{
    out->n = 0;
    size_t from = 0;
    dt_status st;
    while (from <= len) {
        size_t ms, me;
        if (nm->re) {
            int r = dt__re_search(nm->re, sc->re, s, len, from, &ms, &me);
            if (r < 0)
                return r;
            if (r == 0)
                break;
        } else {
            const unsigned char *hit =
                nm->str_len && len - from >= nm->str_len ? memmem(s + from, len - from, nm->str, nm->str_len) : NULL;
            if (!hit)
                break;
            ms = (size_t)(hit - s);
            me = ms + nm->str_len;
        }
        if (me == ms) { /* an empty match replaces nothing; go on after the next character */
            if (ms >= len)
                break;
            size_t l;
            dt__utf8_next(s, len, ms, &l);
            if ((st = buf_put(out, s + from, ms + l - from)) < 0)
                return st;
            from = ms + l;
            continue;
        }
        if ((st = buf_put(out, s + from, ms - from)) < 0 || (st = buf_put(out, nm->content, nm->content_len)) < 0)
            return st;
        from = me;
    }
    return from < len ? buf_put(out, s + from, len - from) : DT_OK;
}

static dt_status strip(const tok_norm *nm, const unsigned char *s, size_t len, tok_buf *out)
{
    size_t a = 0, b = len, l;
    while (nm->left && a < b && dt__unicode_space(dt__utf8_next(s, len, a, &l)))
        a += l;
    while (nm->right && b > a) {
        size_t i = b - 1;
        while (i > a && (s[i] & 0xC0) == 0x80)
            i--;
        if (!dt__unicode_space(dt__utf8_next(s, len, i, &l)))
            break;
        b = i;
    }
    out->n = 0;
    return buf_put(out, s + a, b - a);
}

dt_status dt__tok_normalize(const tok_norm *norms, int n, tok_norm_scratch *sc, const unsigned char *s, size_t len,
                            const unsigned char **out, size_t *out_len)
{
    if (!sc->re && !(sc->re = calloc(1, sizeof(dt__re_scratch))))
        return oom();
    tok_buf *bufs[2] = {&sc->a, &sc->b};
    int k = 0;
    dt_status st = DT_OK;
    for (int i = 0; i < n; i++) {
        const tok_norm *nm = &norms[i];
        tok_buf *o = bufs[k];
        switch (nm->kind) {
        case NORM_NFC:
        case NORM_NFD:
        case NORM_NFKC:
        case NORM_NFKD:
            st = unicode_form(nm->kind, sc, s, len, o);
            break;
        case NORM_LOWERCASE:
            st = lowercase(s, len, o);
            break;
        case NORM_PREPEND:
            o->n = 0;
            if (len && (st = buf_put(o, nm->str, nm->str_len)) == DT_OK)
                st = buf_put(o, s, len);
            break;
        case NORM_REPLACE:
            st = replace(nm, sc, s, len, o);
            break;
        case NORM_STRIP:
            st = strip(nm, s, len, o);
            break;
        }
        if (st < 0)
            return st;
        s = o->p ? o->p : (const unsigned char *)"";
        len = o->n;
        k ^= 1;
    }
    *out = s;
    *out_len = len;
    return DT_OK;
}

void dt__tok_norm_scratch_free(tok_norm_scratch *sc)
{
    free(sc->a.p);
    free(sc->b.p);
    free(sc->cp);
    if (sc->re)
        dt__re_scratch_free(sc->re);
    free(sc->re);
    memset(sc, 0, sizeof *sc);
}

void dt__tok_norm_free(tok_norm *nm)
{
    free(nm->str);
    free(nm->content);
    dt__re_free(nm->re);
}
