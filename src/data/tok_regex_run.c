/* The backtracking machine of the tokenizer regex engine (tok_regex.h):
 * Cox's "backtrack" VM over the program dt__re_compile makes (tok_regex.c).
 * SPLIT x, y tries x first and records (y, position) on an explicit stack,
 * so the first way through the alternatives in pattern order wins, as in
 * Oniguruma and Perl; a lookahead or atomic group runs its sub-program as a
 * nested match on the same stack and, whatever happened inside, discards
 * the sub-match's backtracking points. The stack lives on the heap, so a
 * run of a million letters under \p{L}+ costs memory, not C stack. */
#include "tok_regex_impl.h"

#include <stdlib.h>
#include <string.h>

static bool class_has_raw(const re_class *k, uint32_t c)
{
    for (int i = 0; i < k->nr; i++)
        if (c >= k->r[i][0] && c <= k->r[i][1])
            return true;
    if ((k->flags & CF_SPACE) && dt__unicode_space(c))
        return true;
    if ((k->flags & CF_NSPACE) && !dt__unicode_space(c))
        return true;
    if ((k->flags & CF_WORD) && dt__unicode_word(c))
        return true;
    if ((k->flags & CF_NWORD) && !dt__unicode_word(c))
        return true;
    if (k->cats || k->nncats) {
        uint32_t bit = 1u << dt__unicode_gc(c);
        if (k->cats & bit)
            return true;
        for (int i = 0; i < k->nncats; i++)
            if (!(k->ncats[i] & bit))
                return true;
    }
    return false;
}

static bool class_has(const re_class *k, uint32_t c, bool ci)
{
    bool in = class_has_raw(k, c);
    if (!in && ci) {
        uint32_t f = fold(c);
        in = (f != c && class_has_raw(k, f)) || (f >= 'a' && f <= 'z' && class_has_raw(k, f - 32)) ||
             (f == 's' && class_has_raw(k, 0x17F)) || (f == 'k' && class_has_raw(k, 0x212A));
    }
    return in != k->neg;
}

/* ---- the machine ------------------------------------------------------------------------------ */

typedef struct bt {
    int pc;
    size_t pos;
} bt;

void dt__re_scratch_free(dt__re_scratch *sc)
{
    free(sc->stk);
    memset(sc, 0, sizeof *sc);
}

static bool push(dt__re_scratch *sc, int pc, size_t pos)
{
    if (sc->top == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 1024;
        bt *nw = realloc(sc->stk, cap * sizeof *nw);
        if (!nw)
            return false;
        sc->stk = nw;
        sc->cap = cap;
    }
    ((bt *)sc->stk)[sc->top++] = (bt){pc, pos};
    return true;
}

/* Match the program from pc at pos: 1 with *end, 0, or DT_ERR_NO_MEMORY. */
static int run(const dt__re *re, dt__re_scratch *sc, const unsigned char *s, size_t n, int pc, size_t pos,
               size_t *end)
{
    size_t base = sc->top;
    for (;;) {
        const inst *I = &re->prog[pc];
        size_t l;
        uint32_t c;
        switch (I->op) {
        case I_CHAR:
            if (pos < n && dt__utf8_next(s, n, pos, &l) == I->arg) {
                pos += l;
                pc++;
                continue;
            }
            goto fail;
        case I_CHARI:
            if (pos < n && fold(dt__utf8_next(s, n, pos, &l)) == I->arg) {
                pos += l;
                pc++;
                continue;
            }
            goto fail;
        case I_ANY:
            if (pos < n && s[pos] != '\n') {
                dt__utf8_next(s, n, pos, &l);
                pos += l;
                pc++;
                continue;
            }
            goto fail;
        case I_CLASS:
            if (pos < n && (c = dt__utf8_next(s, n, pos, &l), class_has(&re->cls[I->arg], c, I->ci))) {
                pos += l;
                pc++;
                continue;
            }
            goto fail;
        case I_SPLIT:
            if (!push(sc, I->y, pos))
                return DT_ERR_NO_MEMORY;
            pc = I->x;
            continue;
        case I_JMP:
            pc = I->x;
            continue;
        case I_MATCH:
            *end = pos;
            sc->top = base;
            return 1;
        case I_BOS:
            if (pos == 0) {
                pc++;
                continue;
            }
            goto fail;
        case I_EOS:
            if (pos == n) {
                pc++;
                continue;
            }
            goto fail;
        case I_LOOK:
        case I_ATOMIC: {
            size_t e;
            int r = run(re, sc, s, n, pc + 1, pos, &e);
            if (r < 0)
                return r;
            if (I->op == I_LOOK ? (r == 1) != I->neg : r == 1) {
                if (I->op == I_ATOMIC)
                    pos = e;
                pc = I->x;
                continue;
            }
            goto fail;
        }
        }
    fail:
        if (sc->top == base)
            return 0;
        bt b = ((bt *)sc->stk)[--sc->top];
        pc = b.pc;
        pos = b.pos;
    }
}

int dt__re_search(const dt__re *re, dt__re_scratch *sc, const unsigned char *s, size_t n, size_t from,
                  size_t *ms, size_t *me)
{
    for (size_t p = from; p <= n;) {
        sc->top = 0;
        size_t e;
        int r = run(re, sc, s, n, 0, p, &e);
        if (r != 0) {
            if (r < 0)
                return dt_error(DT_ERR_NO_MEMORY, "tokenizer regex: out of memory (backtracking stack)");
            *ms = p;
            *me = e;
            return 1;
        }
        if (p == n)
            break;
        size_t l;
        dt__utf8_next(s, n, p, &l);
        p += l;
    }
    return 0;
}
