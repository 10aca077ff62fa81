/* Chat templates (chat_template.h): the entry point, the arena, the lexer
 * and the parser. The evaluator is chat_template_eval.c, values and the
 * filters/tests/methods chat_template_lib.c.
 *
 * The lexer follows jinja2's (lexer.py) rule for rule, since the bytes a
 * template renders depend on them:
 *   - the source's line breaks (\r\n, \r, \n) become \n and one trailing
 *     line break is dropped (keep_trailing_newline=False);
 *   - text runs to the first '{{', '{%' or '{#'; a tag start may carry a
 *     sign: '-' strips all whitespace (Unicode, as str.rstrip) before it,
 *     '+' keeps it; otherwise, before '{%' and '{#' (lstrip_blocks), the
 *     spaces between the line's start and the tag go when nothing else is
 *     on the line before the tag; "the line's start" is the text's last \n,
 *     or the text's start when what the lexer matched before it (a tag's
 *     end) ended with \n or it is the template's start;
 *   - '-%}', '-}}', '-#}' swallow all whitespace after them; '%}' and '#}'
 *     one \n (trim_blocks), '+%}' and '+#}' none; '}}' nothing;
 *   - inside a tag, the end is only seen where (), [] and {} balance, so
 *     {{ {'a': {'b': 1}} }} works; whitespace, then floats, integers,
 *     names, strings (Python escapes) and operators, in that order;
 *   - {% raw %}...{% endraw %} is text (no trim_blocks after 'raw %}').
 *
 * The parser is jinja2's grammar (parser.py): condexpr > or > and > not >
 * compare (chained) > + - > ~ > * / // % > ** (left-associative, as
 * jinja2's) > unary - + > postfix (.x [i] [a:b:c] (args)) > filters and
 * tests; unknown filters and tests are errors at parse time, as jinja2's
 * compiler makes them. */
#include "chat_template_impl.h"
#include "tok_regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors, arena, buffers ------------------------------------------------------------ */

_Noreturn void ct_fail(ct_ctx *c, int line, dt_status st, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line <= 0)
        line = c->line;
    if (line > 0)
        dt_error(st, "%s, line %d: %s", c->name, line, msg);
    else
        dt_error(st, "%s: %s", c->name, msg);
    c->st = st;
    longjmp(c->jmp, 1);
}

void *ct_alloc(ct_ctx *c, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    ct_blk *b = c->arena.head;
    if (!b || b->size - b->used < n) {
        size_t size = n > (64u << 10) - sizeof(ct_blk) ? n : (64u << 10) - sizeof(ct_blk);
        if (c->arena.total + size > c->arena.limit)
            ct_fail(c, 0, DT_ERR_RANGE, "the template needs more than %zu MiB of working memory (the limit)",
                    c->arena.limit >> 20);
        ct_blk *nb = malloc(sizeof *nb + size);
        if (!nb)
            ct_fail(c, 0, DT_ERR_NO_MEMORY, "out of memory");
        nb->next = b;
        nb->size = size;
        nb->used = 0;
        c->arena.head = b = nb;
        c->arena.total += size;
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

ct_mark ct_arena_mark(const ct_ctx *c)
{
    return (ct_mark){c->arena.head, c->arena.head ? c->arena.head->used : 0};
}

/* Everything allocated since m is dead: give it back. */
void ct_arena_rewind(ct_ctx *c, ct_mark m)
{
    while (c->arena.head != m.head) {
        ct_blk *b = c->arena.head;
        c->arena.head = b->next;
        c->arena.total -= b->size;
        free(b);
    }
    if (m.head)
        m.head->used = m.used;
}

static void arena_free(ct_ctx *c)
{
    ct_arena_rewind(c, (ct_mark){NULL, 0});
}

void ct_tick(ct_ctx *c, int line, uint64_t n)
{
    c->iters += n;
    if (c->iters > c->lim.max_iters)
        ct_fail(c, line, DT_ERR_RANGE, "the template ran more than %llu loop iterations or the like (the limit)",
                (unsigned long long)c->lim.max_iters);
}

char *ct_strdup(ct_ctx *c, const char *s, size_t n)
{
    char *p = ct_alloc(c, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ct_buf_put(ct_buf *b, const char *s, size_t n)
{
    if (n >= 256)
        ct_tick(b->c, 0, n >> 8);
    if (b->cap - b->n < n + 1) {
        if (n > b->c->lim.max_output || b->n > b->c->lim.max_output - n)
            ct_fail(b->c, 0, DT_ERR_RANGE, "a string longer than the output limit (%zu MiB)",
                    b->c->lim.max_output >> 20);
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = ct_alloc(b->c, cap);
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void ct_buf_puts(ct_buf *b, const char *s)
{
    ct_buf_put(b, s, strlen(s));
}

void ct_buf_printf(ct_buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    ct_buf_put(b, tmp, k < 0 ? 0 : (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---- lexer ------------------------------------------------------------------------------- */

typedef enum { T_EOF, T_TEXT, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } ttype;

typedef struct ct_tok {
    ttype t;
    int line;
    const char *p; /* T_TEXT, T_NAME, T_OP: the text */
    size_t n;
    ct_val v;      /* T_STR, T_INT, T_FLOAT */
} ct_tok;

typedef struct lexer {
    ct_ctx *c;
    const char *s;
    size_t n, pos;
    int line;          /* at pos */
    bool line_starting;
    ct_tok *toks;
    size_t ntoks, cap;
} lexer;

/* Python's str.isspace / re's \s: Unicode White_Space plus \x1c-\x1f. */
static size_t space_at(const char *s, size_t n, size_t i)
{
    unsigned char ch = (unsigned char)s[i];
    if (ch < 0x80)
        return (ch >= 0x09 && ch <= 0x0D) || ch == ' ' || (ch >= 0x1C && ch <= 0x1F);
    size_t len;
    uint32_t cp = dt__utf8_next((const unsigned char *)s, n, i, &len);
    return dt__unicode_space(cp) ? len : 0;
}

/* Length of the whitespace run ending at s[n] (Unicode, as str.rstrip). */
static size_t space_before(const char *s, size_t n)
{
    size_t k = n;
    while (k > 0) {
        size_t st = k - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80)
            st--;
        size_t len = space_at(s, k, st);
        if (!len || st + len != k)
            break;
        k = st;
    }
    return n - k;
}

static void advance(lexer *L, size_t to)
{
    for (size_t i = L->pos; i < to; i++)
        L->line += L->s[i] == '\n';
    L->pos = to;
}

static ct_tok *push_tok(lexer *L, ttype t, const char *p, size_t n)
{
    if (L->ntoks == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        ct_tok *nt = ct_alloc(L->c, cap * sizeof *nt);
        if (L->ntoks)
            memcpy(nt, L->toks, L->ntoks * sizeof *nt);
        L->toks = nt;
        L->cap = cap;
    }
    ct_tok *t_ = &L->toks[L->ntoks++];
    *t_ = (ct_tok){.t = t, .line = L->line, .p = p, .n = n};
    return t_;
}

/* Text s[from, to) before a tag with sign `sign`; lstrip: the tag is '{%' or '{#'. */
static void push_text(lexer *L, size_t from, size_t to, char sign, bool lstrip)
{
    const char *t = L->s + from;
    size_t n = to - from;
    if (sign == '-') {
        n -= space_before(t, n);
    } else if (sign != '+' && lstrip) {
        size_t l = n;
        while (l > 0 && t[l - 1] != '\n')
            l--;
        if ((l > 0 || L->line_starting) && l < n && space_before(t + l, n - l) == n - l)
            n = l;
    }
    if (n)
        push_tok(L, T_TEXT, t, n);
}

static bool at(const lexer *L, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i <= L->n && L->n - i >= k && !memcmp(L->s + i, lit, k);
}

static size_t skip_space(const lexer *L, size_t i)
{
    for (size_t k; i < L->n && (k = space_at(L->s, L->n, i));)
        i += k;
    return i;
}

/* A tag end at i (block: "%}", var: "}}", comment: "#}"): its length with
 * what it swallows after it, 0 if none. */
static size_t tag_end(const lexer *L, size_t i, char kind)
{
    const char *e = kind == '%' ? "%}" : kind == '{' ? "}}" : "#}";
    if (kind != '{' && L->s[i] == '+' && at(L, i + 1, e))
        return 3;
    if (L->s[i] == '-' && at(L, i + 1, e))
        return skip_space(L, i + 3) - i;
    if (at(L, i, e))
        return kind != '{' && i + 2 < L->n && L->s[i + 2] == '\n' ? 3 : 2;
    return 0;
}

/* {% raw %} at i (sign already known): the offset after it, 0 if not raw. */
static size_t raw_begin(const lexer *L, size_t i)
{
    size_t k = skip_space(L, i);
    if (!at(L, k, "raw"))
        return 0;
    k = skip_space(L, k + 3);
    if (at(L, k, "-%}"))
        return skip_space(L, k + 3);
    return at(L, k, "%}") ? k + 2 : 0;
}

static int64_t digits_val(lexer *L, const char *s, size_t n, int base)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '_')
            continue;
        int d = ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base || v * (uint64_t)base + (uint64_t)d > INT64_MAX)
            ct_fail(L->c, L->line, DT_ERR_UNSUPPORTED, "integer literal %.*s does not fit 64 bits", (int)n, s);
        v = v * (uint64_t)base + (uint64_t)d;
    }
    return (int64_t)v;
}

static bool is_digit_b(char ch, int base)
{
    if (base == 16)
        return (ch >= '0' && ch <= '9') || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
    return ch >= '0' && ch < '0' + base;
}

/* (\d+_)*\d+ at i: its end, or i. */
static size_t udigits(const lexer *L, size_t i)
{
    size_t k = i;
    while (k < L->n && L->s[k] >= '0' && L->s[k] <= '9') {
        k++;
        if (k + 1 < L->n && L->s[k] == '_' && L->s[k + 1] >= '0' && L->s[k + 1] <= '9')
            k++;
    }
    return k;
}

static bool lex_number(lexer *L)
{
    size_t i = L->pos, n = L->n;
    const char *s = L->s;
    if (!(s[i] >= '0' && s[i] <= '9'))
        return false;
    /* float: not after '.', digits, then .digits [e...] or e... */
    if (!(i > 0 && s[i - 1] == '.')) {
        size_t k = udigits(L, i), e = 0;
        size_t frac = k < n && s[k] == '.' ? udigits(L, k + 1) : 0;
        size_t mant = frac > k + 1 ? frac : k;
        if (mant < n && (s[mant] | 0x20) == 'e') {
            size_t x = mant + 1 + (mant + 1 < n && (s[mant + 1] == '+' || s[mant + 1] == '-'));
            size_t xe = udigits(L, x);
            if (xe > x)
                e = xe;
        }
        size_t end = e ? e : frac > k + 1 ? frac : 0;
        if (end) {
            char tmp[128];
            size_t m = 0;
            for (size_t j = i; j < end && m + 1 < sizeof tmp; j++)
                if (s[j] != '_')
                    tmp[m++] = s[j];
            tmp[m] = 0;
            ct_tok *t = push_tok(L, T_FLOAT, s + i, end - i);
            t->v = ct_float(strtod(tmp, NULL));
            advance(L, end);
            return true;
        }
    }
    int base = 10;
    size_t k = i;
    if (s[i] == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
        base = (s[i + 1] | 0x20) == 'b' ? 2 : (s[i + 1] | 0x20) == 'o' ? 8 : 16;
        k = i + 2;
        size_t st = k;
        while (k < n && (is_digit_b(s[k], base) || (s[k] == '_' && k + 1 < n && is_digit_b(s[k + 1], base))))
            k++;
        if (k == st) { /* "0x" alone: the integer 0, then a name */
            base = 10;
            k = i + 1;
        }
    } else if (s[i] == '0') {
        k = i + 1;
        while (k < n && (s[k] == '0' || (s[k] == '_' && k + 1 < n && s[k + 1] == '0')))
            k++;
    } else {
        k = udigits(L, i);
    }
    size_t ds = base == 10 ? i : i + 2;
    ct_tok *t = push_tok(L, T_INT, s + i, k - i);
    t->v = ct_int(digits_val(L, s + ds, k - ds, base));
    advance(L, k);
    return true;
}

static void put_utf8(ct_buf *b, uint32_t cp)
{
    char u[4];
    size_t k;
    if (cp < 0x80) {
        u[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | cp >> 12);
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        u[0] = (char)(0xF0 | cp >> 18);
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    ct_buf_put(b, u, k);
}

/* A string literal at pos (quote q): Python's escapes, as jinja2 decodes
 * them ("unicode-escape"); an unknown escape stays as written. */
static bool lex_string(lexer *L)
{
    char q = L->s[L->pos];
    if (q != '"' && q != '\'')
        return false;
    size_t i = L->pos + 1;
    while (i < L->n && L->s[i] != q)
        i += L->s[i] == '\\' && i + 1 < L->n ? 2 : 1;
    if (i >= L->n)
        ct_fail(L->c, L->line, DT_ERR_FORMAT, "unterminated string literal");
    ct_buf b = {.c = L->c};
    ct_buf_put(&b, "", 0);
    const char *s = L->s;
    for (size_t j = L->pos + 1; j < i; j++) {
        if (s[j] != '\\') {
            ct_buf_put(&b, s + j, 1);
            continue;
        }
        char e = s[++j];
        const char *simple = strchr("\\'\"abfnrtv", e);
        if (e && simple) {
            static const char out[] = "\\'\"\a\b\f\n\r\t\v";
            ct_buf_put(&b, &out[simple - "\\'\"abfnrtv"], 1);
        } else if (e == '\n') {
            /* a backslash-newline continues the line */
        } else if (e >= '0' && e <= '7') {
            uint32_t v = 0;
            for (int k = 0; k < 3 && j < i && s[j] >= '0' && s[j] <= '7'; k++, j++)
                v = v * 8 + (uint32_t)(s[j] - '0');
            j--;
            put_utf8(&b, v);
        } else if (e == 'x' || e == 'u' || e == 'U') {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int k = 0; k < nd; k++) {
                char h = j + 1 + (size_t)k < i ? s[j + 1 + k] : 0;
                if (!is_digit_b(h, 16))
                    ct_fail(L->c, L->line, DT_ERR_FORMAT, "truncated \\%c escape in a string literal", e);
                v = v * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            j += (size_t)nd;
            if (v > 0x10FFFF)
                ct_fail(L->c, L->line, DT_ERR_FORMAT, "illegal Unicode character in a string literal");
            if (v >= 0xD800 && v <= 0xDFFF)
                ct_fail(L->c, L->line, DT_ERR_UNSUPPORTED, "a lone surrogate (\\u%04X) in a string literal",
                        (unsigned)v);
            put_utf8(&b, v);
        } else if (e == 'N') {
            ct_fail(L->c, L->line, DT_ERR_UNSUPPORTED, "\\N{...} escapes in string literals");
        } else {
            ct_buf_put(&b, s + j - 1, 2);
        }
    }
    ct_tok *t = push_tok(L, T_STR, s + L->pos, i + 1 - L->pos);
    t->v = ct_str(b.p, b.n);
    advance(L, i + 1);
    return true;
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                  "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};

/* The inside of a tag from pos, through its end. kind: '{' or '%'. */
static void lex_tag(lexer *L, char kind, int open_line)
{
    char stack[CT_MAX_NEST];
    int depth = 0;
    for (;;) {
        if (L->pos >= L->n)
            ct_fail(L->c, open_line, DT_ERR_FORMAT, "the '%s' tag is not closed by '%s'",
                    kind == '%' ? "{%" : "{{", kind == '%' ? "%}" : "}}");
        size_t e;
        if (!depth && (e = tag_end(L, L->pos, kind))) {
            push_tok(L, kind == '%' ? T_BEND : T_VEND, NULL, 0);
            L->line_starting = L->s[L->pos + e - 1] == '\n';
            advance(L, L->pos + e);
            return;
        }
        size_t sp = skip_space(L, L->pos);
        if (sp > L->pos) {
            advance(L, sp);
            continue;
        }
        char ch = L->s[L->pos];
        if (lex_number(L) || lex_string(L))
            continue;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_') {
            size_t k = L->pos;
            while (k < L->n && ((L->s[k] >= 'a' && L->s[k] <= 'z') || (L->s[k] >= 'A' && L->s[k] <= 'Z') ||
                                (L->s[k] >= '0' && L->s[k] <= '9') || L->s[k] == '_'))
                k++;
            push_tok(L, T_NAME, L->s + L->pos, k - L->pos);
            advance(L, k);
            continue;
        }
        const char *op = NULL;
        for (size_t i = 0; i < sizeof OPS / sizeof *OPS && !op; i++)
            if (at(L, L->pos, OPS[i]))
                op = OPS[i];
        if (!op) {
            size_t len;
            uint32_t cp = dt__utf8_next((const unsigned char *)L->s, L->n, L->pos, &len);
            ct_fail(L->c, L->line, DT_ERR_FORMAT, "unexpected character U+%04X ('%.*s') in a tag", (unsigned)cp,
                    (int)len, L->s + L->pos);
        }
        if (strchr("([{", op[0])) {
            if (depth == CT_MAX_NEST)
                ct_fail(L->c, L->line, DT_ERR_RANGE, "brackets nested deeper than %d (the limit)", CT_MAX_NEST);
            stack[depth++] = op[0] == '(' ? ')' : op[0] == '[' ? ']' : '}';
        } else if (strchr(")]}", op[0])) {
            if (!depth)
                ct_fail(L->c, L->line, DT_ERR_FORMAT, "unexpected '%c'", op[0]);
            if (stack[--depth] != op[0])
                ct_fail(L->c, L->line, DT_ERR_FORMAT, "unexpected '%c', expected '%c'", op[0], stack[depth]);
        }
        push_tok(L, T_OP, op, strlen(op));
        advance(L, L->pos + strlen(op));
    }
}

static void lex(lexer *L)
{
    L->line = 1;
    L->line_starting = true;
    while (L->pos < L->n) {
        const char *q = NULL;
        for (const char *s = L->s + L->pos; (s = memchr(s, '{', (size_t)(L->s + L->n - s))) != NULL; s++)
            if (s + 1 < L->s + L->n && (s[1] == '{' || s[1] == '%' || s[1] == '#')) {
                q = s;
                break;
            }
        if (!q) {
            push_tok(L, T_TEXT, L->s + L->pos, L->n - L->pos);
            advance(L, L->n);
            break;
        }
        size_t tpos = (size_t)(q - L->s);
        char kind = q[1];
        char sign = tpos + 2 < L->n && (q[2] == '-' || q[2] == '+') ? q[2] : 0;
        size_t after = tpos + 2 + (sign != 0);
        size_t raw = kind == '%' ? raw_begin(L, after) : 0;
        push_text(L, L->pos, tpos, sign, kind != '{');
        advance(L, after);
        int open_line = L->line;
        if (raw) {
            L->line_starting = L->s[raw - 1] == '\n';
            advance(L, raw);
            size_t i = L->pos, end = 0, body_end = 0;
            char esign = 0;
            for (; i + 1 < L->n; i++) {
                if (L->s[i] != '{' || L->s[i + 1] != '%')
                    continue;
                size_t k = i + 2;
                char sg = k < L->n && (L->s[k] == '-' || L->s[k] == '+') ? L->s[k] : 0;
                k = skip_space(L, k + (sg != 0));
                if (!at(L, k, "endraw"))
                    continue;
                k = skip_space(L, k + 6);
                size_t e = k < L->n ? tag_end(L, k, '%') : 0;
                if (e) {
                    body_end = i;
                    end = k + e;
                    esign = sg;
                    break;
                }
            }
            if (!end)
                ct_fail(L->c, open_line, DT_ERR_FORMAT, "missing end of raw directive ({%% endraw %%})");
            push_text(L, L->pos, body_end, esign, true);
            L->line_starting = L->s[end - 1] == '\n';
            advance(L, end);
        } else if (kind == '#') {
            size_t i = L->pos, e = 0;
            for (; i < L->n && !(e = tag_end(L, i, '#')); i++)
                ;
            if (!e)
                ct_fail(L->c, open_line, DT_ERR_FORMAT, "missing end of comment tag ('#}')");
            L->line_starting = L->s[i + e - 1] == '\n';
            advance(L, i + e);
        } else {
            push_tok(L, kind == '%' ? T_BBEGIN : T_VBEGIN, NULL, 0);
            lex_tag(L, kind, open_line);
        }
    }
    push_tok(L, T_EOF, NULL, 0);
}

/* ---- parser ------------------------------------------------------------------------------ */

typedef struct parser {
    ct_ctx *c;
    ct_tok *t;
    size_t i, n;
    int depth;         /* nesting of blocks and expressions */
    int loops;         /* for loops around here (break/continue) */
    unsigned refs;     /* the names varargs (1), kwargs (2), caller (4) were read */
} parser;

static ct_tok *cur(parser *p)
{
    return &p->t[p->i];
}

static ct_tok *nxt(parser *p)
{
    ct_tok *t = &p->t[p->i];
    if (p->i + 1 < p->n)
        p->i++;
    return t;
}

static bool is_op(const ct_tok *t, const char *op)
{
    return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}

static bool is_name(const ct_tok *t, const char *name)
{
    return t->t == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}

static const char *describe(parser *p, const ct_tok *t)
{
    switch (t->t) {
    case T_EOF: return "end of template";
    case T_TEXT: return "template text";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    default: {
        char *s = ct_alloc(p->c, 64);
        snprintf(s, 64, "'%.*s'", (int)(t->n > 60 ? 60 : t->n), t->p);
        return s;
    }
    }
}

static _Noreturn void unexpected(parser *p, const char *what)
{
    ct_tok *t = cur(p);
    ct_fail(p->c, t->line, DT_ERR_FORMAT, "expected %s, got %s", what, describe(p, t));
}

static void expect_op(parser *p, const char *op)
{
    if (!is_op(cur(p), op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        unexpected(p, what);
    }
    nxt(p);
}

static const char *expect_name(parser *p)
{
    if (cur(p)->t != T_NAME)
        unexpected(p, "a name");
    ct_tok *t = nxt(p);
    return ct_strdup(p->c, t->p, t->n);
}

static void expect_bend(parser *p, const char *tag)
{
    if (cur(p)->t != T_BEND) {
        char what[64];
        snprintf(what, sizeof what, "the end of the '%s' tag ('%%}')", tag);
        unexpected(p, what);
    }
    nxt(p);
}

static ct_node *node(parser *p, ct_nkind k, int line)
{
    ct_node *n = ct_alloc(p->c, sizeof *n);
    memset(n, 0, sizeof *n);
    n->k = k;
    n->line = line ? line : cur(p)->line;
    return n;
}

static void nest(parser *p, int d)
{
    p->depth += d;
    if (p->depth > CT_MAX_NEST)
        ct_fail(p->c, cur(p)->line, DT_ERR_RANGE, "the template nests deeper than %d levels (the limit)",
                CT_MAX_NEST);
}

/* A growing array of nodes and names for a node's kids. */
typedef struct kids {
    ct_node **v;
    const char **names;
    size_t n, cap;
} kids;

static void kids_push(parser *p, kids *k, ct_node *n, const char *name)
{
    if (k->n == k->cap) {
        size_t cap = k->cap ? k->cap * 2 : 4;
        ct_node **v = ct_alloc(p->c, cap * sizeof *v);
        const char **nm = ct_alloc(p->c, cap * sizeof *nm);
        if (k->n) {
            memcpy(v, k->v, k->n * sizeof *v);
            memcpy(nm, k->names, k->n * sizeof *nm);
        }
        k->v = v;
        k->names = nm;
        k->cap = cap;
    }
    k->v[k->n] = n;
    k->names[k->n++] = name;
}

static ct_node *expr(parser *p, bool condexpr);
static ct_node *unary(parser *p, bool with_filter);

static ct_node *tuple(parser *p, bool condexpr, bool parens, const char *end_name)
{
    int line = cur(p)->line;
    kids k = {0};
    bool is_tuple = false;
    for (;;) {
        if (k.n)
            expect_op(p, ",");
        ct_tok *t = cur(p);
        if (t->t == T_VEND || t->t == T_BEND || t->t == T_EOF || is_op(t, ")") ||
            (end_name && is_name(t, end_name)))
            break;
        kids_push(p, &k, expr(p, condexpr), NULL);
        if (is_op(cur(p), ","))
            is_tuple = true;
        else
            break;
    }
    if (!is_tuple) {
        if (k.n)
            return k.v[0];
        if (!parens)
            unexpected(p, "an expression");
    }
    ct_node *n = node(p, N_TUPLE, line);
    n->kids = k.v;
    n->nk = k.n;
    return n;
}

static void call_args(parser *p, ct_node *n)
{
    expect_op(p, "(");
    kids k = {0};
    bool kw_seen = false;
    while (!is_op(cur(p), ")")) {
        if (k.n)
            expect_op(p, ",");
        if (is_op(cur(p), ")"))
            break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            ct_fail(p->c, cur(p)->line, DT_ERR_UNSUPPORTED, "*args and **kwargs in calls");
        if (cur(p)->t == T_NAME && is_op(&p->t[p->i + 1], "=")) {
            const char *kw = expect_name(p);
            nxt(p);
            kids_push(p, &k, expr(p, true), kw);
            kw_seen = true;
        } else {
            if (kw_seen)
                ct_fail(p->c, cur(p)->line, DT_ERR_FORMAT, "a positional argument after a keyword argument");
            kids_push(p, &k, expr(p, true), NULL);
        }
    }
    nxt(p);
    n->kids = k.v;
    n->names = k.names;
    n->nk = k.n;
}

static ct_node *primary(parser *p)
{
    ct_tok *t = cur(p);
    ct_node *n;
    if (t->t == T_NAME) {
        nxt(p);
        n = node(p, N_LIT, t->line);
        if (is_name(t, "true") || is_name(t, "True"))
            n->lit = ct_bool(true);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->lit = ct_bool(false);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->lit = (ct_val){.k = CT_NONE};
        else {
            n->k = N_NAME;
            n->name = ct_strdup(p->c, t->p, t->n);
            p->refs |= !strcmp(n->name, "varargs") ? 1u : !strcmp(n->name, "kwargs") ? 2u
                     : !strcmp(n->name, "caller") ? 4u : 0u;
        }
        return n;
    }
    if (t->t == T_STR) {
        n = node(p, N_LIT, t->line);
        n->lit = nxt(p)->v;
        if (cur(p)->t == T_STR) { /* "a" "b": one string */
            ct_buf b = {.c = p->c};
            ct_buf_put(&b, n->lit.u.s.p, n->lit.u.s.n);
            while (cur(p)->t == T_STR) {
                ct_tok *s = nxt(p);
                ct_buf_put(&b, s->v.u.s.p, s->v.u.s.n);
            }
            n->lit = ct_str(b.p, b.n);
        }
        return n;
    }
    if (t->t == T_INT || t->t == T_FLOAT) {
        n = node(p, N_LIT, t->line);
        n->lit = nxt(p)->v;
        return n;
    }
    if (is_op(t, "(")) {
        nxt(p);
        nest(p, 1);
        n = tuple(p, true, true, NULL);
        nest(p, -1);
        expect_op(p, ")");
        return n;
    }
    if (is_op(t, "[") || is_op(t, "{")) {
        bool dict = is_op(t, "{");
        nxt(p);
        nest(p, 1);
        n = node(p, dict ? N_DICT : N_LIST, t->line);
        kids k = {0};
        while (!is_op(cur(p), dict ? "}" : "]")) {
            if (k.n)
                expect_op(p, ",");
            if (is_op(cur(p), dict ? "}" : "]"))
                break;
            kids_push(p, &k, expr(p, true), NULL);
            if (dict) {
                expect_op(p, ":");
                kids_push(p, &k, expr(p, true), NULL);
            }
        }
        nxt(p);
        nest(p, -1);
        n->kids = k.v;
        n->nk = k.n;
        return n;
    }
    unexpected(p, "an expression");
}

static ct_node *postfix(parser *p, ct_node *n)
{
    for (;;) {
        ct_tok *t = cur(p);
        if (is_op(t, ".")) {
            nxt(p);
            ct_tok *a = cur(p);
            if (a->t == T_NAME) {
                ct_node *g = node(p, N_ATTR, t->line);
                g->a = n;
                g->name = expect_name(p);
                n = g;
            } else if (a->t == T_INT) {
                ct_node *g = node(p, N_ITEM, t->line), *k = node(p, N_LIT, t->line);
                k->lit = nxt(p)->v;
                g->a = n;
                g->b = k;
                n = g;
            } else {
                unexpected(p, "an attribute name");
            }
        } else if (is_op(t, "[")) {
            nxt(p);
            nest(p, 1);
            ct_node *lo = NULL, *hi = NULL, *st = NULL;
            if (!is_op(cur(p), ":"))
                lo = expr(p, true);
            if (is_op(cur(p), ":")) {
                nxt(p);
                if (!is_op(cur(p), "]") && !is_op(cur(p), ":") && !is_op(cur(p), ","))
                    hi = expr(p, true);
                if (is_op(cur(p), ":")) {
                    nxt(p);
                    if (!is_op(cur(p), "]") && !is_op(cur(p), ","))
                        st = expr(p, true);
                }
                ct_node *g = node(p, N_SLICE, t->line);
                g->a = n;
                g->b = lo;
                g->c = hi;
                g->d = st;
                n = g;
            } else {
                ct_node *g = node(p, N_ITEM, t->line);
                g->a = n;
                g->b = lo;
                n = g;
            }
            if (is_op(cur(p), ",")) { /* x[a, b]: the tuple (a, b) is the key */
                if (n->k == N_SLICE)
                    ct_fail(p->c, cur(p)->line, DT_ERR_UNSUPPORTED, "slices in a subscript of several items");
                kids k = {0};
                kids_push(p, &k, n->b, NULL);
                while (is_op(cur(p), ",")) {
                    nxt(p);
                    if (is_op(cur(p), "]"))
                        break;
                    kids_push(p, &k, expr(p, true), NULL);
                }
                ct_node *tup = node(p, N_TUPLE, t->line);
                tup->kids = k.v;
                tup->nk = k.n;
                n->b = tup;
            }
            nest(p, -1);
            expect_op(p, "]");
        } else if (is_op(t, "(")) {
            ct_node *g = node(p, N_CALL, t->line);
            g->a = n;
            call_args(p, g);
            n = g;
        } else {
            return n;
        }
    }
}

/* A filter or test name: name(.name)*, as jinja2 reads it. */
static const char *dotted_name(parser *p)
{
    const char *name = expect_name(p);
    while (is_op(cur(p), ".")) {
        nxt(p);
        const char *more = expect_name(p);
        size_t a = strlen(name), b = strlen(more);
        char *s = ct_alloc(p->c, a + b + 2);
        memcpy(s, name, a);
        s[a] = '.';
        memcpy(s + a + 1, more, b + 1);
        name = s;
    }
    return name;
}

static ct_node *filter_one(parser *p, ct_node *n)
{
    int line = cur(p)->line;
    const char *name = dotted_name(p);
    bool supported;
    ct_node *f = node(p, N_FILTER, line);
    f->a = n;
    f->name = name;
    f->len = !ct_filter_known(name, &supported); /* unknown: an error where jinja2 makes it one (check_names) */
    if (is_op(cur(p), "("))
        call_args(p, f);
    return f;
}

static ct_node *filter_expr(parser *p, ct_node *n)
{
    for (;;) {
        ct_tok *t = cur(p);
        if (is_op(t, "|")) {
            nxt(p);
            n = filter_one(p, n);
        } else if (is_name(t, "is")) {
            nxt(p);
            ct_node *g = node(p, N_TEST, t->line);
            g->a = n;
            if (is_name(cur(p), "not")) {
                nxt(p);
                g->op = 1;
            }
            g->name = dotted_name(p);
            g->len = !ct_test_known(g->name);
            ct_tok *a = cur(p);
            if (is_op(a, "(")) {
                call_args(p, g);
            } else if ((a->t == T_NAME || a->t == T_STR || a->t == T_INT || a->t == T_FLOAT || is_op(a, "[") ||
                        is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and")) {
                if (is_name(a, "is"))
                    ct_fail(p->c, a->line, DT_ERR_FORMAT, "you cannot chain multiple tests with 'is'");
                g->kids = ct_alloc(p->c, sizeof *g->kids);
                g->names = ct_alloc(p->c, sizeof *g->names);
                g->kids[0] = postfix(p, primary(p));
                g->names[0] = NULL;
                g->nk = 1;
            }
            n = g;
        } else if (is_op(t, "(")) {
            ct_node *g = node(p, N_CALL, t->line);
            g->a = n;
            call_args(p, g);
            n = g;
        } else {
            return n;
        }
    }
}

static ct_node *unary(parser *p, bool with_filter)
{
    ct_tok *t = cur(p);
    ct_node *n;
    nest(p, 1);
    if (is_op(t, "-") || is_op(t, "+")) {
        nxt(p);
        n = node(p, is_op(t, "-") ? N_NEG : N_POS, t->line);
        n->a = unary(p, false);
    } else {
        n = postfix(p, primary(p));
    }
    if (with_filter)
        n = filter_expr(p, n);
    nest(p, -1);
    return n;
}

static ct_node *binary(parser *p, ct_nkind k, int op, ct_node *a, ct_node *b, int line)
{
    ct_node *n = node(p, k, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static ct_node *power(parser *p)
{
    ct_node *n = unary(p, true);
    while (is_op(cur(p), "**")) {
        int line = nxt(p)->line;
        n = binary(p, N_BIN, 'p', n, unary(p, true), line);
    }
    return n;
}

static ct_node *math2(parser *p)
{
    ct_node *n = power(p);
    for (;;) {
        ct_tok *t = cur(p);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'f' : is_op(t, "%") ? '%' : 0;
        if (!op)
            return n;
        nxt(p);
        n = binary(p, N_BIN, op, n, power(p), t->line);
    }
}

static ct_node *concat(parser *p)
{
    ct_node *n = math2(p);
    while (is_op(cur(p), "~")) {
        int line = nxt(p)->line;
        n = binary(p, N_CONCAT, 0, n, math2(p), line);
    }
    return n;
}

static ct_node *math1(parser *p)
{
    ct_node *n = concat(p);
    for (;;) {
        ct_tok *t = cur(p);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op)
            return n;
        nxt(p);
        n = binary(p, N_BIN, op, n, concat(p), t->line);
    }
}

static ct_node *compare(parser *p)
{
    int line = cur(p)->line;
    ct_node *first = math1(p);
    kids k = {0};
    for (;;) {
        ct_tok *t = cur(p);
        const char *op = NULL;
        static const char *const cmps[] = {"==", "!=", "<", "<=", ">", ">="};
        for (size_t i = 0; i < 6 && !op; i++)
            if (is_op(t, cmps[i]))
                op = cmps[i];
        if (!op && is_name(t, "in"))
            op = "in";
        if (!op && is_name(t, "not") && is_name(&p->t[p->i + 1], "in")) {
            nxt(p);
            op = "notin";
        }
        if (!op)
            break;
        nxt(p);
        kids_push(p, &k, math1(p), op);
    }
    if (!k.n)
        return first;
    ct_node *n = node(p, N_CMP, line);
    n->a = first;
    n->kids = k.v;
    n->names = k.names;
    n->nk = k.n;
    return n;
}

static ct_node *not_expr(parser *p)
{
    if (is_name(cur(p), "not")) {
        int line = nxt(p)->line;
        nest(p, 1);
        ct_node *n = node(p, N_NOT, line);
        n->a = not_expr(p);
        nest(p, -1);
        return n;
    }
    return compare(p);
}

static ct_node *and_expr(parser *p)
{
    ct_node *n = not_expr(p);
    while (is_name(cur(p), "and")) {
        int line = nxt(p)->line;
        n = binary(p, N_AND, 0, n, not_expr(p), line);
    }
    return n;
}

static ct_node *or_expr(parser *p)
{
    ct_node *n = and_expr(p);
    while (is_name(cur(p), "or")) {
        int line = nxt(p)->line;
        n = binary(p, N_OR, 0, n, and_expr(p), line);
    }
    return n;
}

static ct_node *expr(parser *p, bool condexpr)
{
    nest(p, 1);
    ct_node *n = or_expr(p);
    while (condexpr && is_name(cur(p), "if")) {
        ct_node *c = node(p, N_COND, nxt(p)->line);
        c->a = n;
        c->b = or_expr(p);
        if (is_name(cur(p), "else")) {
            nxt(p);
            c->c = expr(p, true);
        }
        n = c;
    }
    nest(p, -1);
    return n;
}

/* ---- statements -------------------------------------------------------------------------- */

static ct_node *body(parser *p, const char *const *ends, const char *block, int block_line);

/* Names separated by commas (optionally in parentheses) up to `stop` ("in", "="). */
static void targets(parser *p, ct_node *n, bool allow_ns)
{
    kids k = {0};
    bool parens = is_op(cur(p), "(");
    if (parens)
        nxt(p);
    for (;;) {
        const char *name = expect_name(p);
        if (allow_ns && !parens && !k.n && is_op(cur(p), ".")) {
            nxt(p);
            n->name = expect_name(p); /* ns.attr */
            kids_push(p, &k, NULL, name);
            break;
        }
        kids_push(p, &k, NULL, name);
        if (!is_op(cur(p), ","))
            break;
        nxt(p);
        n->op = 1; /* a tuple target */
        if (parens && is_op(cur(p), ")"))
            break;
    }
    if (parens) {
        expect_op(p, ")");
        n->op = 1;
    }
    n->names = k.names;
    n->nnames = k.n;
}

/* Parameters of a macro or a call block: (a, b=default, ...). */
static void params(parser *p, ct_node *n)
{
    kids k = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (k.n)
            expect_op(p, ",");
        const char *name = expect_name(p);
        ct_node *def = NULL;
        if (is_op(cur(p), "=")) {
            nxt(p);
            def = expr(p, true);
        }
        kids_push(p, &k, def, name);
    }
    nxt(p);
    n->kids = k.v;
    n->names = k.names;
    n->nk = n->nnames = k.n;
}

/* A filter chain of a filter block or block set: f | g(x), with the
 * innermost operand NULL (the body's text). */
static ct_node *filter_chain(parser *p)
{
    ct_node *n = filter_one(p, NULL);
    while (is_op(cur(p), "|")) {
        nxt(p);
        n = filter_one(p, n);
    }
    return n;
}

static ct_node *statement(parser *p)
{
    ct_tok *t = cur(p);
    int line = t->line;
    if (t->t != T_NAME)
        unexpected(p, "a tag name");
    const char *tag = expect_name(p);
    ct_node *n;
    nest(p, 1);
    if (!strcmp(tag, "if")) {
        n = node(p, N_IF, line);
        ct_node *it = n;
        it->a = tuple(p, false, false, NULL);
        expect_bend(p, "if");
        for (;;) {
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            it->b = body(p, ends, "if", line);
            ct_tok *e = nxt(p);
            if (is_name(e, "elif")) {
                ct_node *el = node(p, N_IF, e->line);
                el->a = tuple(p, false, false, NULL);
                expect_bend(p, "elif");
                it->c = el;
                it = el;
            } else if (is_name(e, "else")) {
                expect_bend(p, "else");
                static const char *const ends2[] = {"endif", NULL};
                it->c = body(p, ends2, "if", line);
                nxt(p);
                expect_bend(p, "endif");
                break;
            } else {
                expect_bend(p, "endif");
                break;
            }
        }
    } else if (!strcmp(tag, "for")) {
        n = node(p, N_FOR, line);
        targets(p, n, false);
        if (!is_name(cur(p), "in"))
            unexpected(p, "'in'");
        nxt(p);
        n->a = tuple(p, false, false, "recursive");
        if (is_name(cur(p), "if")) {
            nxt(p);
            n->d = expr(p, true);
        }
        if (is_name(cur(p), "recursive"))
            ct_fail(p->c, line, DT_ERR_UNSUPPORTED, "recursive for loops");
        expect_bend(p, "for");
        static const char *const ends[] = {"endfor", "else", NULL};
        p->loops++;
        n->b = body(p, ends, "for", line);
        p->loops--;
        if (is_name(nxt(p), "else")) {
            expect_bend(p, "else");
            static const char *const ends2[] = {"endfor", NULL};
            n->c = body(p, ends2, "for", line);
            nxt(p);
        }
        expect_bend(p, "endfor");
    } else if (!strcmp(tag, "set")) {
        n = node(p, N_SET, line);
        targets(p, n, true);
        if (is_op(cur(p), "=")) {
            nxt(p);
            n->a = tuple(p, true, false, NULL);
            expect_bend(p, "set");
        } else {
            if (n->op)
                unexpected(p, "'='");
            n->k = N_SETBLOCK;
            if (is_op(cur(p), "|")) {
                nxt(p);
                n->d = filter_chain(p);
            }
            expect_bend(p, "set");
            static const char *const ends[] = {"endset", NULL};
            n->b = body(p, ends, "set", line);
            nxt(p);
            expect_bend(p, "endset");
        }
    } else if (!strcmp(tag, "macro") || !strcmp(tag, "call")) {
        bool call = !strcmp(tag, "call");
        n = node(p, call ? N_CALLBLOCK : N_MACRO, line);
        if (call) {
            if (is_op(cur(p), "("))
                params(p, n);
            n->a = unary(p, false); /* the call: jinja2's parse_expression; a call expression */
            if (n->a->k != N_CALL)
                ct_fail(p->c, line, DT_ERR_FORMAT, "the 'call' tag needs a call expression");
        } else {
            n->name = expect_name(p);
            params(p, n);
        }
        expect_bend(p, tag);
        unsigned refs = p->refs;
        int loops = p->loops;
        p->refs = 0;
        p->loops = 0;
        static const char *const mends[] = {"endmacro", NULL}, *const cends[] = {"endcall", NULL};
        n->b = body(p, call ? cends : mends, tag, line);
        n->op = (int)p->refs;
        p->refs = refs;
        p->loops = loops;
        nxt(p);
        expect_bend(p, call ? "endcall" : "endmacro");
    } else if (!strcmp(tag, "filter")) {
        n = node(p, N_FILTERBLOCK, line);
        n->d = filter_chain(p);
        expect_bend(p, "filter");
        static const char *const ends[] = {"endfilter", NULL};
        n->b = body(p, ends, "filter", line);
        nxt(p);
        expect_bend(p, "endfilter");
    } else if (!strcmp(tag, "with")) {
        n = node(p, N_WITH, line);
        kids k = {0};
        while (cur(p)->t != T_BEND) {
            if (k.n)
                expect_op(p, ",");
            const char *name = expect_name(p);
            expect_op(p, "=");
            kids_push(p, &k, expr(p, true), name);
        }
        n->kids = k.v;
        n->names = k.names;
        n->nk = n->nnames = k.n;
        expect_bend(p, "with");
        static const char *const ends[] = {"endwith", NULL};
        n->b = body(p, ends, "with", line);
        nxt(p);
        expect_bend(p, "endwith");
    } else if (!strcmp(tag, "generation")) { /* transformers' extension: the body as is, in its own scope */
        expect_bend(p, "generation");
        static const char *const ends[] = {"endgeneration", NULL};
        n = node(p, N_WITH, line);
        n->op = 'g';
        n->b = body(p, ends, "generation", line);
        nxt(p);
        expect_bend(p, "endgeneration");
    } else if (!strcmp(tag, "break") || !strcmp(tag, "continue")) {
        if (!p->loops)
            ct_fail(p->c, line, DT_ERR_FORMAT, "'%s' outside a for loop", tag);
        n = node(p, tag[0] == 'b' ? N_BREAK : N_CONTINUE, line);
        expect_bend(p, tag);
    } else {
        static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "autoescape",
                                                  NULL};
        for (size_t i = 0; unsupported[i]; i++)
            if (!strcmp(tag, unsupported[i]))
                ct_fail(p->c, line, DT_ERR_UNSUPPORTED, "the '%s' tag", tag);
        ct_fail(p->c, line, DT_ERR_FORMAT, "unknown tag '%s'", tag);
    }
    nest(p, -1);
    return n;
}

/* Statements up to a {% tag %} named in ends (NULL-terminated; the tag is
 * left as the current token) or the template's end (ends NULL). */
static ct_node *body(parser *p, const char *const *ends, const char *block, int block_line)
{
    ct_node *n = node(p, N_BODY, 0);
    kids k = {0};
    for (;;) {
        ct_tok *t = cur(p);
        if (t->t == T_EOF) {
            if (!ends)
                break;
            ct_fail(p->c, t->line, DT_ERR_FORMAT,
                    "unexpected end of template: the '%s' block opened on line %d is not closed ('%s')", block,
                    block_line, ends[0][0] == 'e' && ends[1] ? ends[1] : ends[0]);
        }
        if (t->t == T_TEXT) {
            ct_node *x = node(p, N_TEXT, t->line);
            x->name = t->p;
            x->len = t->n;
            kids_push(p, &k, x, NULL);
            nxt(p);
        } else if (t->t == T_VBEGIN) {
            nxt(p);
            ct_node *x = node(p, N_OUT, t->line);
            x->a = tuple(p, true, false, NULL);
            if (cur(p)->t != T_VEND)
                unexpected(p, "the end of the print statement ('}}')");
            nxt(p);
            kids_push(p, &k, x, NULL);
        } else if (t->t == T_BBEGIN) {
            ct_tok *name = &p->t[p->i + 1];
            for (size_t i = 0; ends && ends[i]; i++)
                if (is_name(name, ends[i])) {
                    nxt(p);
                    n->kids = k.v;
                    n->nk = k.n;
                    return n;
                }
            if (name->t == T_NAME) {
                static const char *const closers[] = {"endif", "endfor", "endset", "endmacro", "endcall",
                                                      "endfilter", "endwith", "endgeneration", "elif", "else",
                                                      "endraw", "endblock", NULL};
                for (size_t i = 0; closers[i]; i++)
                    if (is_name(name, closers[i])) {
                        if (block)
                            ct_fail(p->c, name->line, DT_ERR_FORMAT,
                                    "unexpected '%s': the innermost open block is '%s' (line %d)", closers[i],
                                    block, block_line);
                        ct_fail(p->c, name->line, DT_ERR_FORMAT, "unexpected '%s' with no open block",
                                closers[i]);
                    }
            }
            nxt(p);
            kids_push(p, &k, statement(p), NULL);
        } else {
            unexpected(p, "template text or a tag");
        }
    }
    n->kids = k.v;
    n->nk = k.n;
    return n;
}

/* jinja2's compiler refuses an unknown filter or test, except inside an if
 * statement or an inline if (a "soft" frame: there it fails only when run,
 * so templates can guard one with `is filter`); the bodies of loops, macros,
 * call, filter, set and with blocks are not soft again. */
static void check_names(ct_ctx *c, const ct_node *n, bool soft, int depth)
{
    if (!n)
        return;
    if (depth > CT_MAX_EXPR + CT_MAX_NEST)
        ct_fail(c, n->line, DT_ERR_RANGE, "an expression nested deeper than %d levels (the limit)", CT_MAX_EXPR);
    if ((n->k == N_FILTER || n->k == N_TEST) && n->len && !soft)
        ct_fail(c, n->line, DT_ERR_FORMAT, "no %s named '%s'", n->k == N_FILTER ? "filter" : "test", n->name);
    bool inner = soft;
    if (n->k == N_IF || n->k == N_COND)
        inner = true;
    else if (n->k == N_FOR || n->k == N_MACRO || n->k == N_CALLBLOCK || n->k == N_SETBLOCK ||
             n->k == N_FILTERBLOCK || n->k == N_WITH)
        inner = false;
    check_names(c, n->a, n->k == N_FOR || n->k == N_CALLBLOCK ? soft : inner, depth + 1);
    check_names(c, n->b, inner, depth + 1);
    check_names(c, n->c, inner, depth + 1);
    check_names(c, n->d, n->k == N_FILTERBLOCK || n->k == N_SETBLOCK ? soft : inner, depth + 1);
    if (n->k != N_TEXT && n->k != N_LIT)
        for (size_t i = 0; i < n->nk; i++)
            check_names(c, n->kids[i], inner, depth + 1);
}

ct_node *dt__chat_parse(ct_ctx *c, const char *src, size_t n)
{
    lexer L = {.c = c, .s = src, .n = n};
    lex(&L);
    parser p = {.c = c, .t = L.toks, .n = L.ntoks};
    ct_node *root = body(&p, NULL, NULL, 0);
    check_names(c, root, false, 0);
    return root;
}

/* ---- entry --------------------------------------------------------------------------------- */

void dt__chat_limits_default(ct_limits *l)
{
    *l = (ct_limits){.max_template = 4u << 20, .max_output = 256u << 20, .max_memory = (size_t)1 << 30,
                     .max_iters = 10000000, .max_calls = 100};
}

dt_status dt__chat_render(const char *tmpl, size_t n, const char *name, const cJSON *ctx, char **out,
                          size_t *out_len)
{
    ct_limits l;
    dt__chat_limits_default(&l);
    return dt__chat_render_limited(tmpl, n, name, ctx, &l, out, out_len);
}

static void render(ct_ctx *c, const char *tmpl, size_t n, const cJSON *ctx)
{
    /* line breaks to \n, one trailing one dropped */
    char *src = ct_alloc(c, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (tmpl[i] == '\r') {
            src[m++] = '\n';
            i += i + 1 < n && tmpl[i + 1] == '\n';
        } else {
            src[m++] = tmpl[i];
        }
    }
    if (m && src[m - 1] == '\n')
        m--;
    src[m] = 0;
    ct_node *root = dt__chat_parse(c, src, m);
    ct_frame *vars = ct_alloc(c, sizeof *vars);
    memset(vars, 0, sizeof *vars);
    if (ctx) {
        size_t nv = (size_t)cJSON_GetArraySize(ctx), i = 0;
        vars->names = ct_alloc(c, (nv ? nv : 1) * sizeof *vars->names);
        vars->vals = ct_alloc(c, (nv ? nv : 1) * sizeof *vars->vals);
        vars->cap = nv;
        for (const cJSON *it = ctx->child; it && i < nv; it = it->next) {
            if (!it->string)
                continue;
            c->line = -1;
            size_t j = 0;
            while (j < vars->n && strcmp(vars->names[j], it->string))
                j++;
            vars->names[j] = ct_strdup(c, it->string, strlen(it->string));
            vars->vals[j] = ct_from_json(c, it, 0);
            if (j == vars->n)
                vars->n++;
            i++;
        }
    }
    c->line = 0;
    ct_frame *top = ct_alloc(c, sizeof *top);
    memset(top, 0, sizeof *top);
    top->parent = vars;
    dt__chat_exec(c, root, top);
}

/* The render proper, with the jump target; c owns everything it allocates. */
static dt_status render_guarded(ct_ctx *c, const char *tmpl, size_t n, const cJSON *ctx, char **out,
                                size_t *out_len, size_t **spans, size_t *nspans)
{
    if (setjmp(c->jmp))
        return c->st;
    render(c, tmpl, n, ctx);
    size_t *sp = NULL;
    if (spans && !(sp = malloc((c->ngen ? 2 * c->ngen : 1) * sizeof *sp)))
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", c->name);
    *out = c->out ? c->out : malloc(1);
    if (!*out) {
        free(sp);
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", c->name);
    }
    (*out)[c->out_n] = 0;
    *out_len = c->out_n;
    c->out = NULL;
    if (spans) {
        if (c->ngen)
            memcpy(sp, c->gen, 2 * c->ngen * sizeof *sp);
        *spans = sp;
        *nspans = c->ngen;
    }
    return DT_OK;
}

dt_status dt__chat_render_spans(const char *tmpl, size_t n, const char *name, const cJSON *ctx, char **out,
                                size_t *out_len, size_t **spans, size_t *nspans)
{
    ct_limits l;
    dt__chat_limits_default(&l);
    if (spans)
        *spans = NULL;
    if (nspans)
        *nspans = 0;
    if (!spans || !nspans)
        return dt_error(DT_ERR_NULL, "dt__chat_render_spans: NULL spans");
    return dt__chat_render_core(tmpl, n, name, ctx, &l, out, out_len, spans, nspans);
}

dt_status dt__chat_render_limited(const char *tmpl, size_t n, const char *name, const cJSON *ctx,
                                  const ct_limits *lim, char **out, size_t *out_len)
{
    return dt__chat_render_core(tmpl, n, name, ctx, lim, out, out_len, NULL, NULL);
}

dt_status dt__chat_render_core(const char *tmpl, size_t n, const char *name, const cJSON *ctx, const ct_limits *lim,
                               char **out, size_t *out_len, size_t **spans, size_t *nspans)
{
    if (out)
        *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!name)
        name = "chat template";
    if ((!tmpl && n) || !out || !out_len || !lim)
        return dt_error(DT_ERR_NULL, "%s: dt__chat_render: NULL template or output", name);
    if (n > lim->max_template)
        return dt_error(DT_ERR_RANGE, "%s: the template is %zu bytes, more than the limit of %zu", name, n,
                        lim->max_template);
    size_t bad;
    if (!dt__utf8_valid((const unsigned char *)tmpl, n, &bad))
        return dt_error(DT_ERR_FORMAT, "%s: not valid UTF-8 (byte %zu)", name, bad);
    if (ctx && !cJSON_IsObject(ctx))
        return dt_error(DT_ERR_INVALID_ARG, "%s: the variables must be a JSON object", name);
    ct_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", name);
    c->name = name;
    c->lim = *lim;
    c->arena.limit = lim->max_memory;
    c->track_gen = spans != NULL;
    dt_status st = render_guarded(c, tmpl, n, ctx, out, out_len, spans, nspans);
    free(c->out);
    arena_free(c);
    free(c);
    return st;
}
