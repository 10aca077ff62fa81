/* The compiled form of a tokenizer regex, shared by the compiler
 * (tok_regex.c) and the backtracking machine (tok_regex_run.c). */
#ifndef DT_DATA_TOK_REGEX_IMPL_H
#define DT_DATA_TOK_REGEX_IMPL_H

#include "tok_regex.h"

/* A character class. */
enum { CF_SPACE = 1, CF_NSPACE = 2, CF_WORD = 4, CF_NWORD = 8 };
#define MAX_NEG_CATS 8

typedef struct re_class {
    bool neg;
    uint32_t cats;                   /* general categories in the class (bit per DT_GC_*) */
    uint32_t ncats[MAX_NEG_CATS];    /* \P{..}: chars outside each of these masks are in */
    int nncats;
    int flags;                       /* CF_* */
    uint32_t (*r)[2];                /* inclusive ranges */
    int nr, capr;
} re_class;

/* The simple case fold of the letters this engine folds (see the header). */
static inline uint32_t fold(uint32_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c + 32;
    if (c == 0x17F)
        return 's';
    if (c == 0x212A)
        return 'k';
    return c;
}

/* The program: one instruction per step of the machine. */
enum { I_CHAR, I_CHARI, I_ANY, I_CLASS, I_SPLIT, I_JMP, I_MATCH, I_LOOK, I_ATOMIC, I_BOS, I_EOS };

typedef struct inst {
    int op;
    bool neg, ci;
    uint32_t arg;
    int x, y;
} inst;

struct dt__re {
    inst *prog;
    int np;
    re_class *cls;
    int ncls;
};

#endif
