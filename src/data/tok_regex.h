/* The regular expressions of tokenizer.json pre-tokenizers (tok_regex.c,
 * tok_regex_run.c) and the Unicode tables they need (tok_unicode.c;
 * unicode_gc.c, generated).
 *
 * The Hugging Face tokenizers library compiles its Split and ByteLevel
 * patterns with Oniguruma; this is a small backtracking engine with the
 * same match semantics for the constructs those patterns use: literals,
 * '.', classes [...] with ranges, negation and the escapes \s \S \d \D \w
 * \W \p{..} \P{..} (Unicode general categories, one or two letters or
 * their long names), alternation (ordered: the first alternative that
 * leads to a match wins), groups (...) (?:...) (?i:...) (?i) (?>...),
 * lookahead (?=...) (?!...), quantifiers * + ? {n} {n,} {n,m} greedy, lazy
 * (?) and possessive (+), and the anchors \A \z. Case-insensitive matching
 * folds ASCII letters (and U+017F to 's', U+212A to 'k', as Unicode
 * simple case folding does). Anything else (backreferences, lookbehind,
 * ^ and $, case-insensitive non-ASCII letters, a repeated group that can
 * match the empty string) is refused at compile time with a message, never
 * matched differently. Input must be valid UTF-8. */
#ifndef DT_DATA_TOK_REGEX_H
#define DT_DATA_TOK_REGEX_H

#include "dtrain/base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Unicode general categories, in the generated table's order. */
enum {
    DT_GC_Cn, DT_GC_Lu, DT_GC_Ll, DT_GC_Lt, DT_GC_Lm, DT_GC_Lo, DT_GC_Mn, DT_GC_Mc, DT_GC_Me, DT_GC_Nd,
    DT_GC_Nl, DT_GC_No, DT_GC_Pc, DT_GC_Pd, DT_GC_Ps, DT_GC_Pe, DT_GC_Pi, DT_GC_Pf, DT_GC_Po, DT_GC_Sm,
    DT_GC_Sc, DT_GC_Sk, DT_GC_So, DT_GC_Zs, DT_GC_Zl, DT_GC_Zp, DT_GC_Cc, DT_GC_Cf, DT_GC_Cs, DT_GC_Co,
    DT_GC_COUNT
};

extern const char dt__unicode_version[];
extern const uint32_t dt__unicode_gc_runs[];
extern const size_t dt__unicode_gc_nruns;

/* The general category of code point cp (DT_GC_Cn past U+10FFFF). */
int dt__unicode_gc(uint32_t cp);
/* Unicode White_Space (Oniguruma's and Rust's \s). */
bool dt__unicode_space(uint32_t cp);
/* Unicode word characters: letters, marks, Nd, Nl, Pc (Rust's \w, used for
 * single_word added tokens). */
bool dt__unicode_word(uint32_t cp);

/* The code point at s[i] (valid UTF-8, i < n) and its length in bytes. */
uint32_t dt__utf8_next(const unsigned char *s, size_t n, size_t i, size_t *len);
/* Whether s[0, n) is valid UTF-8 (no overlongs, surrogates or values past
 * U+10FFFF); else *bad is the offset of the first bad byte. */
bool dt__utf8_valid(const unsigned char *s, size_t n, size_t *bad);

typedef struct dt__re dt__re;

/* Backtracking state for dt__re_search; zero-initialise, reuse across
 * searches (one per thread), release with dt__re_scratch_free. */
typedef struct dt__re_scratch {
    void *stk;
    size_t cap, top;
} dt__re_scratch;
void dt__re_scratch_free(dt__re_scratch *sc);

/* Compile pat (NUL-terminated UTF-8). `what` names the pattern in messages
 * ("tokenizer.json x.json: pre_tokenizer.pattern.Regex"). DT_ERR_FORMAT
 * for a malformed pattern, DT_ERR_UNSUPPORTED for a construct this engine
 * does not have, each naming the position. */
dt_status dt__re_compile(const char *pat, const char *what, dt__re **out);
void dt__re_free(dt__re *re);

/* The leftmost match in s[0, n) that starts at or after `from` (a char
 * boundary): 1 with [*ms, *me), 0 if none, DT_ERR_NO_MEMORY. */
int dt__re_search(const dt__re *re, dt__re_scratch *sc, const unsigned char *s, size_t n, size_t from,
                  size_t *ms, size_t *me);

#endif
