/* A small backtracking regex engine for tokenizer.json patterns
 * (tok_regex.h says what it accepts): the parser and the compiler here, the
 * machine in tok_regex_run.c, the Unicode helpers in tok_unicode.c.
 *
 * The pattern is parsed into a tree, then compiled to a program for a
 * backtracking machine (Cox's "backtrack" VM): SPLIT x, y tries x first
 * and records (y, position) on an explicit stack, so the first way through
 * the alternatives in pattern order wins, as in Oniguruma and Perl.
 * Counted repeats are unrolled; a lookahead or atomic group runs its
 * sub-program as a nested match on the same stack and, whatever happened
 * inside, discards the sub-match's backtracking points. The explicit stack
 * lives on the heap, so a run of a million letters under \p{L}+ costs
 * memory, not C stack. */
#include "tok_regex_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---- the tree -------------------------------------------------------------------------- */

enum { N_EMPTY, N_CHAR, N_CLASS, N_ANY, N_CAT, N_ALT, N_REP, N_LOOK, N_ATOMIC, N_BOS, N_EOS };

typedef struct node {
    int kind;
    uint32_t c;        /* N_CHAR */
    bool ci;           /* N_CHAR, N_CLASS: case-insensitive */
    int cls;           /* N_CLASS: index into the class table */
    int a, b;          /* children (node indices; -1 none) */
    int min, max;      /* N_REP: max -1 = unbounded */
    bool greedy, possessive, neg;
} node;

#define MAX_PROG 200000
#define MAX_NODES 100000

typedef struct parser {
    const unsigned char *p, *s, *end;
    const char *what;
    node *nodes;
    int nn, capn;
    re_class *cls;
    int ncls, capc;
    dt_status st;
    int depth;
} parser;

static int perr(parser *ps, dt_status code, const char *msg)
{
    if (ps->st == DT_OK)
        ps->st = dt_error(code, "%s: regex error at offset %ld: %s", ps->what, (long)(ps->p - ps->s), msg);
    return -1;
}

static int new_node(parser *ps, int kind)
{
    if (ps->nn == ps->capn) {
        int cap = ps->capn ? ps->capn * 2 : 64;
        node *nw = cap <= MAX_NODES ? realloc(ps->nodes, (size_t)cap * sizeof *nw) : NULL;
        if (!nw)
            return perr(ps, cap > MAX_NODES ? DT_ERR_UNSUPPORTED : DT_ERR_NO_MEMORY, "pattern too large");
        ps->nodes = nw;
        ps->capn = cap;
    }
    node *n = &ps->nodes[ps->nn];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    n->a = n->b = -1;
    return ps->nn++;
}

static int new_class(parser *ps)
{
    if (ps->ncls == ps->capc) {
        int cap = ps->capc ? ps->capc * 2 : 8;
        re_class *nw = realloc(ps->cls, (size_t)cap * sizeof *nw);
        if (!nw)
            return perr(ps, DT_ERR_NO_MEMORY, "out of memory");
        ps->cls = nw;
        ps->capc = cap;
    }
    memset(&ps->cls[ps->ncls], 0, sizeof ps->cls[0]);
    return ps->ncls++;
}

static int class_range(parser *ps, re_class *k, uint32_t lo, uint32_t hi)
{
    if (k->nr == k->capr) {
        int cap = k->capr ? k->capr * 2 : 4;
        uint32_t(*nw)[2] = realloc(k->r, (size_t)cap * sizeof *nw);
        if (!nw)
            return perr(ps, DT_ERR_NO_MEMORY, "out of memory");
        k->r = nw;
        k->capr = cap;
    }
    k->r[k->nr][0] = lo;
    k->r[k->nr][1] = hi;
    k->nr++;
    return 0;
}

static bool at_end(const parser *ps) { return ps->p >= ps->end; }

static uint32_t next_cp(parser *ps)
{
    size_t l;
    uint32_t c = dt__utf8_next(ps->p, (size_t)(ps->end - ps->p), 0, &l);
    ps->p += l;
    return c;
}

static int hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A category name of \p{..}: its mask, 0 if unknown. */
static uint32_t cat_mask(const char *name)
{
    static const struct {
        const char *name;
        uint32_t mask;
    } tab[] = {
#define B(x) (1u << DT_GC_##x)
        {"L", B(Lu) | B(Ll) | B(Lt) | B(Lm) | B(Lo)}, {"Letter", B(Lu) | B(Ll) | B(Lt) | B(Lm) | B(Lo)},
        {"LC", B(Lu) | B(Ll) | B(Lt)}, {"L&", B(Lu) | B(Ll) | B(Lt)}, {"Lu", B(Lu)}, {"Ll", B(Ll)},
        {"Lt", B(Lt)}, {"Lm", B(Lm)}, {"Lo", B(Lo)}, {"M", B(Mn) | B(Mc) | B(Me)},
        {"Mark", B(Mn) | B(Mc) | B(Me)}, {"Mn", B(Mn)}, {"Mc", B(Mc)}, {"Me", B(Me)},
        {"N", B(Nd) | B(Nl) | B(No)}, {"Number", B(Nd) | B(Nl) | B(No)}, {"Nd", B(Nd)}, {"Nl", B(Nl)},
        {"No", B(No)}, {"P", B(Pc) | B(Pd) | B(Ps) | B(Pe) | B(Pi) | B(Pf) | B(Po)},
        {"Punctuation", B(Pc) | B(Pd) | B(Ps) | B(Pe) | B(Pi) | B(Pf) | B(Po)}, {"Pc", B(Pc)}, {"Pd", B(Pd)},
        {"Ps", B(Ps)}, {"Pe", B(Pe)}, {"Pi", B(Pi)}, {"Pf", B(Pf)}, {"Po", B(Po)},
        {"S", B(Sm) | B(Sc) | B(Sk) | B(So)}, {"Symbol", B(Sm) | B(Sc) | B(Sk) | B(So)}, {"Sm", B(Sm)},
        {"Sc", B(Sc)}, {"Sk", B(Sk)}, {"So", B(So)}, {"Z", B(Zs) | B(Zl) | B(Zp)},
        {"Separator", B(Zs) | B(Zl) | B(Zp)}, {"Zs", B(Zs)}, {"Zl", B(Zl)}, {"Zp", B(Zp)},
        {"C", B(Cc) | B(Cf) | B(Cs) | B(Co) | B(Cn)}, {"Other", B(Cc) | B(Cf) | B(Cs) | B(Co) | B(Cn)},
        {"Cc", B(Cc)}, {"Cf", B(Cf)}, {"Cs", B(Cs)}, {"Co", B(Co)}, {"Cn", B(Cn)},
#undef B
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(tab[i].name, name))
            return tab[i].mask;
    return 0;
}

/* After '\p' or '\P' (neg): the category into k. */
static int parse_prop(parser *ps, re_class *k, bool neg)
{
    char name[32];
    size_t len = 0;
    if (at_end(ps))
        return perr(ps, DT_ERR_FORMAT, "\\p needs a property name");
    if (*ps->p == '{') {
        ps->p++;
        if (!at_end(ps) && *ps->p == '^') {
            neg = !neg;
            ps->p++;
        }
        while (!at_end(ps) && *ps->p != '}' && len + 1 < sizeof name)
            name[len++] = (char)*ps->p++;
        if (at_end(ps) || *ps->p != '}')
            return perr(ps, DT_ERR_FORMAT, "unterminated \\p{...}");
        ps->p++;
    } else {
        name[len++] = (char)*ps->p++;
    }
    name[len] = 0;
    uint32_t m = cat_mask(name);
    if (!m)
        return perr(ps, DT_ERR_UNSUPPORTED,
                    "unknown property in \\p{...} (general categories only: L, Lu, N, Nd, P, S, Z, M, C, ...)");
    if (!neg) {
        k->cats |= m;
    } else {
        if (k->nncats == MAX_NEG_CATS)
            return perr(ps, DT_ERR_UNSUPPORTED, "too many \\P{...} in one class");
        k->ncats[k->nncats++] = m;
    }
    return 0;
}

/* An escape after '\' that stands for one code point: 1 with *c, 0 if the
 * escape is a class escape (not consumed), -1 on error. */
static int escape_char(parser *ps, uint32_t *c)
{
    unsigned char e = *ps->p;
    switch (e) {
    case 'n': *c = '\n'; break;
    case 'r': *c = '\r'; break;
    case 't': *c = '\t'; break;
    case 'f': *c = '\f'; break;
    case 'v': *c = '\v'; break;
    case 'a': *c = 7; break;
    case 'e': *c = 27; break;
    case 'x':
    case 'u': {
        ps->p++;
        uint32_t v = 0;
        int nd = 0;
        if (e == 'x' && !at_end(ps) && *ps->p == '{') {
            ps->p++;
            while (!at_end(ps) && *ps->p != '}' && hexval(*ps->p) >= 0 && nd < 8) {
                v = v * 16 + (uint32_t)hexval(*ps->p++);
                nd++;
            }
            if (at_end(ps) || *ps->p != '}' || nd == 0)
                return perr(ps, DT_ERR_FORMAT, "bad \\x{...}");
            ps->p++;
        } else {
            int want = e == 'x' ? 2 : 4;
            while (nd < want && !at_end(ps) && hexval(*ps->p) >= 0) {
                v = v * 16 + (uint32_t)hexval(*ps->p++);
                nd++;
            }
            if (nd == 0 || (e == 'u' && nd != 4))
                return perr(ps, DT_ERR_FORMAT, "bad hexadecimal escape");
        }
        if (v > 0x10FFFF)
            return perr(ps, DT_ERR_FORMAT, "code point past U+10FFFF");
        *c = v;
        return 1;
    }
    case 's': case 'S': case 'd': case 'D': case 'w': case 'W': case 'p': case 'P':
        return 0;
    default:
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'))
            return perr(ps, DT_ERR_UNSUPPORTED, "unsupported escape (backreferences, \\b, \\G, ... are not available)");
        *c = next_cp(ps); /* an escaped punctuation or other char stands for itself */
        return 1;
    }
    ps->p++;
    return 1;
}

/* A class escape (\s \S \d \D \w \W \p \P) into k. */
static int class_escape(parser *ps, re_class *k)
{
    unsigned char e = *ps->p++;
    switch (e) {
    case 's': k->flags |= CF_SPACE; return 0;
    case 'S': k->flags |= CF_NSPACE; return 0;
    case 'w': k->flags |= CF_WORD; return 0;
    case 'W': k->flags |= CF_NWORD; return 0;
    case 'd': k->cats |= 1u << DT_GC_Nd; return 0;
    case 'D':
        if (k->nncats == MAX_NEG_CATS)
            return perr(ps, DT_ERR_UNSUPPORTED, "too many negated escapes in one class");
        k->ncats[k->nncats++] = 1u << DT_GC_Nd;
        return 0;
    default: return parse_prop(ps, k, e == 'P');
    }
}

/* After '[': the class up to and including ']'. */
static int parse_class(parser *ps, bool ci)
{
    int ki = new_class(ps);
    if (ki < 0)
        return -1;
    bool neg = false;
    if (!at_end(ps) && *ps->p == '^') {
        neg = true;
        ps->p++;
    }
    bool first = true;
    for (;;) {
        if (at_end(ps))
            return perr(ps, DT_ERR_FORMAT, "unterminated [...]");
        if (*ps->p == ']' && !first) {
            ps->p++;
            break;
        }
        first = false;
        if (*ps->p == '[')
            return perr(ps, DT_ERR_UNSUPPORTED, "nested classes and [:posix:] classes are not available");
        if (ps->p + 1 < ps->end && ps->p[0] == '&' && ps->p[1] == '&')
            return perr(ps, DT_ERR_UNSUPPORTED, "class intersection (&&) is not available");
        uint32_t lo;
        if (*ps->p == '\\') {
            ps->p++;
            if (at_end(ps))
                return perr(ps, DT_ERR_FORMAT, "trailing backslash");
            int r = escape_char(ps, &lo);
            if (r < 0)
                return -1;
            if (r == 0) {
                if (class_escape(ps, &ps->cls[ki]) < 0)
                    return -1;
                continue;
            }
        } else {
            lo = next_cp(ps);
        }
        uint32_t hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                if (at_end(ps))
                    return perr(ps, DT_ERR_FORMAT, "trailing backslash");
                int r = escape_char(ps, &hi);
                if (r <= 0)
                    return r < 0 ? -1 : perr(ps, DT_ERR_FORMAT, "a class escape cannot end a range");
            } else {
                hi = next_cp(ps);
            }
            if (hi < lo)
                return perr(ps, DT_ERR_FORMAT, "range out of order in [...]");
        }
        if (class_range(ps, &ps->cls[ki], lo, hi) < 0)
            return -1;
    }
    ps->cls[ki].neg = neg;
    int n = new_node(ps, N_CLASS);
    if (n < 0)
        return -1;
    ps->nodes[n].cls = ki;
    ps->nodes[n].ci = ci;
    return n;
}

static int parse_alt(parser *ps, bool *ci);

static int cat2(parser *ps, int kind, int a, int b)
{
    if (a < 0)
        return b;
    if (b < 0)
        return a;
    int n = new_node(ps, kind);
    if (n < 0)
        return -1;
    ps->nodes[n].a = a;
    ps->nodes[n].b = b;
    return n;
}

/* One atom; -2 when the concatenation ends here (')' '|' or the end). */
static int parse_atom(parser *ps, bool *ci)
{
    if (at_end(ps) || *ps->p == '|' || *ps->p == ')')
        return -2;
    unsigned char c = *ps->p;
    if (c == '(') {
        ps->p++;
        if (++ps->depth > 200)
            return perr(ps, DT_ERR_UNSUPPORTED, "groups nested too deeply");
        int kind = N_EMPTY; /* a plain group */
        bool neg = false, gci = *ci;
        if (!at_end(ps) && *ps->p == '?') {
            ps->p++;
            if (at_end(ps))
                return perr(ps, DT_ERR_FORMAT, "unterminated group");
            if (*ps->p == ':') {
                ps->p++;
            } else if (*ps->p == '=' || *ps->p == '!') {
                kind = N_LOOK;
                neg = *ps->p++ == '!';
            } else if (*ps->p == '>') {
                kind = N_ATOMIC;
                ps->p++;
            } else if (*ps->p == '<' && ps->p + 1 < ps->end && ps->p[1] != '=' && ps->p[1] != '!') {
                while (!at_end(ps) && *ps->p != '>') /* (?<name>...): a group like any other */
                    ps->p++;
                if (at_end(ps))
                    return perr(ps, DT_ERR_FORMAT, "unterminated group name");
                ps->p++;
            } else if (*ps->p == 'i' || *ps->p == '-') {
                bool on = true;
                while (!at_end(ps) && (*ps->p == 'i' || *ps->p == '-')) {
                    if (*ps->p == '-')
                        on = false;
                    else
                        gci = on;
                    ps->p++;
                }
                if (at_end(ps) || (*ps->p != ':' && *ps->p != ')'))
                    return perr(ps, DT_ERR_UNSUPPORTED, "only the i flag is available in (?flags:...)");
                if (*ps->p == ')') { /* (?i): to the end of the enclosing group */
                    ps->p++;
                    ps->depth--;
                    *ci = gci;
                    int e = new_node(ps, N_EMPTY);
                    return e;
                }
                ps->p++;
            } else {
                return perr(ps, DT_ERR_UNSUPPORTED, "this group kind (lookbehind, conditionals, ...) is not available");
            }
        }
        int inner = parse_alt(ps, &gci);
        if (inner == -1)
            return -1;
        if (at_end(ps) || *ps->p != ')')
            return perr(ps, DT_ERR_FORMAT, "missing ')'");
        ps->p++;
        ps->depth--;
        if (inner < 0 && (inner = new_node(ps, N_EMPTY)) < 0)
            return -1;
        if (kind == N_EMPTY)
            return inner;
        int n = new_node(ps, kind);
        if (n < 0)
            return -1;
        ps->nodes[n].a = inner;
        ps->nodes[n].neg = neg;
        return n;
    }
    if (c == '[') {
        ps->p++;
        return parse_class(ps, *ci);
    }
    if (c == '.') {
        ps->p++;
        return new_node(ps, N_ANY);
    }
    if (c == '^' || c == '$')
        return perr(ps, DT_ERR_UNSUPPORTED, "^ and $ are not available (use \\A and \\z)");
    if (c == '*' || c == '+' || c == '?' || c == '{')
        return perr(ps, DT_ERR_FORMAT, "nothing to repeat");
    uint32_t ch;
    if (c == '\\') {
        ps->p++;
        if (at_end(ps))
            return perr(ps, DT_ERR_FORMAT, "trailing backslash");
        if (*ps->p == 'A' || *ps->p == 'z') {
            int n = new_node(ps, *ps->p == 'A' ? N_BOS : N_EOS);
            ps->p++;
            return n;
        }
        int r = escape_char(ps, &ch);
        if (r < 0)
            return -1;
        if (r == 0) {
            int ki = new_class(ps);
            if (ki < 0 || class_escape(ps, &ps->cls[ki]) < 0)
                return -1;
            int n = new_node(ps, N_CLASS);
            if (n < 0)
                return -1;
            ps->nodes[n].cls = ki;
            ps->nodes[n].ci = *ci;
            return n;
        }
    } else {
        ch = next_cp(ps);
    }
    if (*ci && ch >= 0x80) {
        int g = dt__unicode_gc(ch);
        if (g == DT_GC_Lu || g == DT_GC_Ll || g == DT_GC_Lt)
            return perr(ps, DT_ERR_UNSUPPORTED, "case-insensitive matching of non-ASCII letters is not available");
    }
    int n = new_node(ps, N_CHAR);
    if (n < 0)
        return -1;
    ps->nodes[n].c = *ci ? fold(ch) : ch;
    ps->nodes[n].ci = *ci;
    return n;
}

static int parse_int(parser *ps, int *v)
{
    if (at_end(ps) || *ps->p < '0' || *ps->p > '9')
        return -1;
    long x = 0;
    while (!at_end(ps) && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > 1000)
            return perr(ps, DT_ERR_UNSUPPORTED, "repeat count above 1000");
    }
    *v = (int)x;
    return 0;
}

static int parse_repeat(parser *ps, bool *ci)
{
    int a = parse_atom(ps, ci);
    if (a < 0)
        return a;
    for (;;) {
        if (at_end(ps))
            return a;
        int min, max;
        unsigned char c = *ps->p;
        if (c == '*') {
            min = 0, max = -1;
            ps->p++;
        } else if (c == '+') {
            min = 1, max = -1;
            ps->p++;
        } else if (c == '?') {
            min = 0, max = 1;
            ps->p++;
        } else if (c == '{') {
            const unsigned char *save = ps->p;
            ps->p++;
            if (parse_int(ps, &min) < 0) {
                if (ps->st)
                    return -1;
                ps->p = save; /* not a repeat: '{' stands for itself, as in Oniguruma */
                return a;
            }
            max = min;
            if (!at_end(ps) && *ps->p == ',') {
                ps->p++;
                max = -1;
                if (!at_end(ps) && *ps->p != '}' && parse_int(ps, &max) < 0)
                    return perr(ps, DT_ERR_FORMAT, "bad {n,m}");
            }
            if (at_end(ps) || *ps->p != '}')
                return perr(ps, DT_ERR_FORMAT, "bad {n,m}");
            ps->p++;
            if (max >= 0 && max < min)
                return perr(ps, DT_ERR_FORMAT, "{n,m} with m < n");
        } else {
            return a;
        }
        int n = new_node(ps, N_REP);
        if (n < 0)
            return -1;
        node *r = &ps->nodes[n];
        r->a = a;
        r->min = min;
        r->max = max;
        r->greedy = true;
        if (!at_end(ps) && *ps->p == '?') {
            r->greedy = false;
            ps->p++;
        } else if (!at_end(ps) && *ps->p == '+') {
            r->possessive = true;
            ps->p++;
        }
        a = n;
    }
}

static int parse_alt(parser *ps, bool *ci)
{
    bool ci0 = *ci;
    int alt = -1;
    for (;;) {
        int seq = -1;
        for (;;) {
            int r = parse_repeat(ps, ci);
            if (r == -1)
                return -1;
            if (r == -2)
                break;
            seq = cat2(ps, N_CAT, seq, r);
            if (seq == -1 && ps->st)
                return -1;
        }
        if (seq < 0 && (seq = new_node(ps, N_EMPTY)) < 0)
            return -1;
        alt = alt < 0 ? seq : cat2(ps, N_ALT, alt, seq);
        if (alt < 0)
            return -1;
        if (at_end(ps) || *ps->p != '|')
            break;
        ps->p++; /* an inline (?i) reaches past '|' to the end of its group, as in Oniguruma */
    }
    *ci = ci0;
    return alt;
}

/* ---- the program --------------------------------------------------------------------------- */

typedef struct gen {
    parser *ps;
    inst *prog;
    int np, cap;
} gen;

static int emit(gen *g, int op)
{
    if (g->np == g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        inst *nw = cap <= MAX_PROG * 2 ? realloc(g->prog, (size_t)cap * sizeof *nw) : NULL;
        if (!nw || g->np >= MAX_PROG)
            return perr(g->ps, nw ? DT_ERR_UNSUPPORTED : DT_ERR_NO_MEMORY, "pattern too large once repeats are unrolled");
        g->prog = nw;
        g->cap = cap;
    }
    memset(&g->prog[g->np], 0, sizeof g->prog[0]);
    g->prog[g->np].op = op;
    return g->np++;
}

/* Whether node i can match the empty string. */
static bool nullable(const parser *ps, int i)
{
    const node *n = &ps->nodes[i];
    switch (n->kind) {
    case N_CHAR: case N_CLASS: case N_ANY: return false;
    case N_CAT: return nullable(ps, n->a) && nullable(ps, n->b);
    case N_ALT: return nullable(ps, n->a) || nullable(ps, n->b);
    case N_REP: return n->min == 0 || nullable(ps, n->a);
    case N_ATOMIC: return nullable(ps, n->a);
    default: return true; /* empty, lookahead, anchors */
    }
}

static int gen_node(gen *g, int i);

/* child then the rest of a repeat: min copies, then the optional ones. */
static int gen_rep(gen *g, const node *n)
{
    for (int k = 0; k < n->min; k++)
        if (gen_node(g, n->a) < 0)
            return -1;
    if (n->max < 0) {
        if (nullable(g->ps, n->a))
            return perr(g->ps, DT_ERR_UNSUPPORTED, "a repeated group that can match the empty string");
        int split = emit(g, I_SPLIT);
        if (split < 0 || gen_node(g, n->a) < 0)
            return -1;
        int j = emit(g, I_JMP);
        if (j < 0)
            return -1;
        g->prog[j].x = split;
        g->prog[split].x = n->greedy ? split + 1 : g->np;
        g->prog[split].y = n->greedy ? g->np : split + 1;
        return 0;
    }
    int opt = n->max - n->min, splits[1001];
    for (int k = 0; k < opt; k++) {
        if ((splits[k] = emit(g, I_SPLIT)) < 0 || gen_node(g, n->a) < 0)
            return -1;
    }
    for (int k = 0; k < opt; k++) {
        inst *s = &g->prog[splits[k]];
        s->x = n->greedy ? splits[k] + 1 : g->np;
        s->y = n->greedy ? g->np : splits[k] + 1;
    }
    return 0;
}

static int gen_node(gen *g, int i)
{
    node n = g->ps->nodes[i];
    int k;
    switch (n.kind) {
    case N_EMPTY: return 0;
    case N_CHAR:
        if ((k = emit(g, n.ci ? I_CHARI : I_CHAR)) < 0)
            return -1;
        g->prog[k].arg = n.c;
        return 0;
    case N_CLASS:
        if ((k = emit(g, I_CLASS)) < 0)
            return -1;
        g->prog[k].arg = (uint32_t)n.cls;
        g->prog[k].ci = n.ci;
        return 0;
    case N_ANY: return emit(g, I_ANY) < 0 ? -1 : 0;
    case N_BOS: return emit(g, I_BOS) < 0 ? -1 : 0;
    case N_EOS: return emit(g, I_EOS) < 0 ? -1 : 0;
    case N_CAT: return gen_node(g, n.a) < 0 || gen_node(g, n.b) < 0 ? -1 : 0;
    case N_ALT: {
        int s = emit(g, I_SPLIT);
        if (s < 0 || gen_node(g, n.a) < 0)
            return -1;
        int j = emit(g, I_JMP);
        if (j < 0)
            return -1;
        g->prog[s].x = s + 1;
        g->prog[s].y = g->np;
        if (gen_node(g, n.b) < 0)
            return -1;
        g->prog[j].x = g->np;
        return 0;
    }
    case N_REP:
        if (n.possessive) { /* x*+ is (?>x*) */
            if ((k = emit(g, I_ATOMIC)) < 0)
                return -1;
            n.possessive = false;
            if (gen_rep(g, &n) < 0 || emit(g, I_MATCH) < 0)
                return -1;
            g->prog[k].x = g->np;
            return 0;
        }
        return gen_rep(g, &n);
    case N_LOOK:
    case N_ATOMIC:
        if ((k = emit(g, n.kind == N_LOOK ? I_LOOK : I_ATOMIC)) < 0)
            return -1;
        g->prog[k].neg = n.neg;
        if (gen_node(g, n.a) < 0 || emit(g, I_MATCH) < 0)
            return -1;
        g->prog[k].x = g->np;
        return 0;
    }
    return perr(g->ps, DT_ERR_FORMAT, "internal: unknown node");
}

static void free_classes(re_class *cls, int n)
{
    for (int i = 0; i < n; i++)
        free(cls[i].r);
    free(cls);
}

dt_status dt__re_compile(const char *pat, const char *what, dt__re **out)
{
    *out = NULL;
    parser ps = {.p = (const unsigned char *)pat, .s = (const unsigned char *)pat, .what = what};
    ps.end = ps.p + strlen(pat);
    size_t bad;
    if (!dt__utf8_valid(ps.p, (size_t)(ps.end - ps.p), &bad))
        return dt_error(DT_ERR_FORMAT, "%s: the pattern is not valid UTF-8 (byte %zu)", what, bad);
    bool ci = false;
    int root = parse_alt(&ps, &ci);
    if (root >= 0 && !at_end(&ps))
        perr(&ps, DT_ERR_FORMAT, "unbalanced ')'");
    gen g = {.ps = &ps};
    if (ps.st == DT_OK && root >= 0 && gen_node(&g, root) == 0)
        emit(&g, I_MATCH);
    free(ps.nodes);
    dt__re *re = ps.st == DT_OK ? calloc(1, sizeof *re) : NULL;
    if (!re) {
        free(g.prog);
        free_classes(ps.cls, ps.ncls);
        return ps.st ? ps.st : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", what);
    }
    re->prog = g.prog;
    re->np = g.np;
    re->cls = ps.cls;
    re->ncls = ps.ncls;
    *out = re;
    return DT_OK;
}

void dt__re_free(dt__re *re)
{
    if (!re)
        return;
    free(re->prog);
    free_classes(re->cls, re->ncls);
    free(re);
}
