/* The chat-template interpreter's own types (chat_template.h): values, the
 * syntax tree, the arena both live in, and the render state.
 *
 * chat_template.c lexes and parses, chat_template_eval.c runs the tree,
 * chat_template_values.c holds what values do (str(), repr(), ==, <,
 * lookup, slicing, arithmetic), chat_template_lib.c the filters, tests,
 * methods and globals and json.dumps.
 *
 * Errors unwind: ct_fail() formats the message and longjmps to
 * dt__chat_render, which frees everything. That is safe because every
 * allocation of a render is in its arena or is the output buffer, which
 * the render state owns; no C library call that allocates is left
 * mid-way by the jump (sorting is our own merge sort, not qsort). */
#ifndef DT_DATA_CHAT_TEMPLATE_IMPL_H
#define DT_DATA_CHAT_TEMPLATE_IMPL_H

#include "chat_template.h"

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Limits (chat_template.h), overridable for tests (dt__chat_render_limited). */
typedef struct ct_limits {
    size_t max_template;   /* bytes of template text; 4 MiB */
    size_t max_output;     /* bytes of output; 256 MiB */
    size_t max_memory;     /* bytes of arena; 1 GiB */
    uint64_t max_iters;    /* loop iterations in all (for, and filters' passes); 10 million */
    int max_calls;         /* nested macro calls; 100 */
} ct_limits;

void dt__chat_limits_default(ct_limits *l);
dt_status dt__chat_render_limited(const char *tmpl, size_t n, const char *name, const cJSON *ctx,
                                  const ct_limits *lim, char **out, size_t *out_len);
/* The same recording the generation blocks (spans non-NULL: dt__chat_render_spans). */
dt_status dt__chat_render_core(const char *tmpl, size_t n, const char *name, const cJSON *ctx, const ct_limits *lim,
                               char **out, size_t *out_len, size_t **spans, size_t *nspans);

#define CT_MAX_NEST 256   /* template nesting: blocks and expression parentheses */
#define CT_MAX_DEPTH 1000 /* value nesting (repr, tojson, ==) */
#define CT_MAX_EXPR 1000  /* expression depth, chains included (a + b + ... , x|f|g|..., x.a.b...) */

/* ---- arena ----------------------------------------------------------------------------- */

typedef struct ct_blk {
    struct ct_blk *next; /* the previous block */
    size_t size, used;
    _Alignas(16) unsigned char data[];
} ct_blk;

typedef struct ct_arena {
    ct_blk *head;
    size_t total, limit; /* bytes held in blocks; the most it may hold */
} ct_arena;

typedef struct ct_mark {
    ct_blk *head;
    size_t used;
} ct_mark;

/* ---- values ------------------------------------------------------------------------------ */

typedef enum ct_kind {
    CT_ABSENT, /* an argument not given (never a template's value) */
    CT_UNDEF,  /* jinja2's Undefined; u.s is the hint for its error ("'x' is undefined") */
    CT_NONE,
    CT_BOOL,
    CT_INT,
    CT_FLOAT,
    CT_STR,    /* UTF-8, u.s */
    CT_LIST,   /* list or tuple (u.l->tuple) */
    CT_DICT,
    CT_NS,     /* namespace(): a dict whose attributes `set ns.x` assigns */
    CT_LOOP,   /* a for loop's `loop` */
    CT_MACRO,
    CT_FUNC,   /* a global function, u.i its CT_FN_* */
    CT_METHOD, /* a method bound to a value: u.me */
} ct_kind;

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_loop ct_loop;
typedef struct ct_macro ct_macro;
typedef struct ct_method ct_method;

typedef struct ct_val {
    ct_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        ct_list *l;
        ct_dict *d;
        ct_loop *loop;
        ct_macro *m;
        ct_method *me;
    } u;
} ct_val;

struct ct_list {
    size_t n, cap;
    ct_val *v;
    bool tuple;
    bool range;           /* made by range(): prints as Python's range(a, b[, step]) */
    int64_t r_start, r_stop, r_step;
};

struct ct_dict { /* insertion-ordered, looked up by == */
    size_t n, cap;
    ct_val *k, *v;
};

struct ct_loop {
    ct_list *items;
    size_t i;
};

struct ct_method {
    ct_val self;
    const char *name;
};

enum { CT_FN_RAISE, CT_FN_STRFTIME, CT_FN_NAMESPACE, CT_FN_RANGE, CT_FN_DICT, CT_FN_CYCLER, CT_FN_JOINER,
       CT_FN_LIPSUM };

/* ---- syntax tree ------------------------------------------------------------------------- */

typedef enum ct_nkind {
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_POS, N_NOT, N_AND, N_OR,
    N_BIN, N_CMP, N_CONCAT, N_COND, N_LIST, N_TUPLE, N_DICT,
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK, N_FILTERBLOCK, N_WITH,
    N_BREAK, N_CONTINUE,
} ct_nkind;

typedef struct ct_node ct_node;
struct ct_node {
    ct_nkind k;
    int line;
    int op;              /* N_BIN: '+', '-', '*', '/', 'f' (//), '%', 'p' (**); N_TEST: negated; N_WITH: 'g' for
                            transformers' generation block */
    const char *name;    /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_MACRO; N_TEXT: the text */
    size_t len;          /* N_TEXT: its length; N_FILTER, N_TEST: 1 if jinja2 has no such one */
    ct_val lit;          /* N_LIT */
    ct_node *a, *b, *c, *d;
    ct_node **kids;      /* N_CALL/N_FILTER/N_TEST: arguments; N_LIST/N_TUPLE/N_DICT: items (dict: k, v, ...);
                          * N_BODY: statements; N_CMP: operands after a; N_MACRO: defaults (NULL: none) */
    const char **names;  /* N_CALL...: keyword of each argument (NULL: positional); N_CMP: operators;
                          * N_FOR/N_SET/N_WITH: targets; N_MACRO/N_CALLBLOCK: parameters */
    size_t nk, nnames;
};

struct ct_macro {
    const ct_node *def;  /* N_MACRO (or N_CALLBLOCK for `caller`) */
    struct ct_frame *closure; /* the scope it was defined in */
};

/* ---- render state -------------------------------------------------------------------------- */

typedef struct ct_frame {
    struct ct_frame *parent;
    size_t n, cap;
    const char **names;
    ct_val *vals;
} ct_frame;

typedef struct ct_ctx {
    const char *name;
    ct_limits lim;
    ct_arena arena;
    jmp_buf jmp;
    dt_status st;
    char *out;            /* the output (malloc'd) */
    size_t out_n, out_cap;
    uint64_t iters;       /* loop iterations so far */
    uint64_t stores;      /* namespace stores so far: a region with none may be rewound */
    int calls, depth;     /* nested macro calls; value nesting of the walk in progress */
    int expr_depth;       /* of the expression being evaluated */
    int line;             /* of the node being run, for errors outside one */
    int capturing;        /* captures (macros, set and filter blocks) in progress */
    bool track_gen;       /* record the generation blocks' output (dt__chat_render_spans) */
    size_t *gen;          /* ... [start, end) byte pairs of the output (in the arena) */
    size_t ngen, gen_cap; /* ... pairs held, room */
} ct_ctx;

/* A string being built in the arena. */
typedef struct ct_buf {
    ct_ctx *c;
    char *p;
    size_t n, cap;
} ct_buf;

/* chat_template.c */
_Noreturn void ct_fail(ct_ctx *c, int line, dt_status st, const char *fmt, ...) DT_PRINTF(4, 5);
void *ct_alloc(ct_ctx *c, size_t n);
/* Count n steps of work (a loop iteration is one; a filter's pass over a
 * list one an item; building strings one per 256 bytes) against max_iters. */
void ct_tick(ct_ctx *c, int line, uint64_t n);
ct_mark ct_arena_mark(const ct_ctx *c);
void ct_arena_rewind(ct_ctx *c, ct_mark m);
char *ct_strdup(ct_ctx *c, const char *s, size_t n);
void ct_buf_put(ct_buf *b, const char *s, size_t n);
void ct_buf_puts(ct_buf *b, const char *s);
void ct_buf_printf(ct_buf *b, const char *fmt, ...) DT_PRINTF(2, 3);
ct_node *dt__chat_parse(ct_ctx *c, const char *src, size_t n);

/* chat_template_eval.c */
void dt__chat_exec(ct_ctx *c, const ct_node *body, ct_frame *f);
ct_val dt__chat_call(ct_ctx *c, int line, ct_val fn, size_t n, const ct_val *args, const char *const *kw);

/* n values from s to d (either may be NULL when n is 0). */
static inline void ct_copy_vals(ct_val *d, const ct_val *s, size_t n)
{
    if (n)
        memcpy(d, s, n * sizeof *d);
}

/* chat_template_values.c */
ct_val ct_str(const char *p, size_t n);
ct_val ct_cstr(const char *p);
ct_val ct_int(int64_t i);
ct_val ct_float(double f);
ct_val ct_bool(bool b);
ct_val ct_undef(ct_ctx *c, const char *fmt, ...) DT_PRINTF(2, 3);
ct_list *ct_list_new(ct_ctx *c, size_t cap);
void ct_list_push(ct_ctx *c, ct_list *l, ct_val v);
ct_val ct_list_val(ct_list *l);
ct_dict *ct_dict_new(ct_ctx *c);
ct_val *ct_dict_get(ct_ctx *c, const ct_dict *d, ct_val k);
void ct_dict_set(ct_ctx *c, ct_dict *d, ct_val k, ct_val v);
const char *ct_type_name(ct_val v);
bool ct_truthy(ct_val v);
bool ct_eq(ct_ctx *c, ct_val a, ct_val b);
int ct_cmp(ct_ctx *c, int line, ct_val a, ct_val b, const char *op);
ct_val ct_to_str(ct_ctx *c, ct_val v);
void ct_str_into(ct_buf *b, ct_val v);
void ct_repr_into(ct_buf *b, ct_val v);
ct_list *ct_iter(ct_ctx *c, int line, ct_val v);
ct_val ct_getattr(ct_ctx *c, int line, ct_val v, const char *name);
ct_val ct_getitem(ct_ctx *c, int line, ct_val v, ct_val key);
ct_val ct_slice(ct_ctx *c, int line, ct_val v, ct_val lo, ct_val hi, ct_val step);
ct_val ct_binop(ct_ctx *c, int line, int op, ct_val a, ct_val b);
/* Python's fmt % args (fmt a CT_STR; args a tuple, a dict or one value): the format filter's and the % operator's */
ct_val ct_format(ct_ctx *c, int line, ct_val fmt, ct_val args);
ct_val ct_neg(ct_ctx *c, int line, ct_val a, bool minus);
bool ct_contains(ct_ctx *c, int line, ct_val hay, ct_val needle);
_Noreturn void ct_fail_undef(ct_ctx *c, int line, ct_val u);
ct_val ct_from_json(ct_ctx *c, const cJSON *j, int depth);
size_t ct_utf8_count(const char *p, size_t n);

/* chat_template_lib.c: the library */
bool ct_filter_known(const char *name, bool *supported);
bool ct_test_known(const char *name);
ct_val ct_filter(ct_ctx *c, int line, const char *name, ct_val v, size_t n, const ct_val *args,
                 const char *const *kw);
bool ct_test(ct_ctx *c, int line, const char *name, ct_val v, size_t n, const ct_val *args,
             const char *const *kw);
ct_val ct_method_call(ct_ctx *c, int line, const ct_method *m, size_t n, const ct_val *args,
                      const char *const *kw);
ct_val ct_global_call(ct_ctx *c, int line, int fn, size_t n, const ct_val *args, const char *const *kw);
bool ct_global_lookup(const char *name, ct_val *out);

#endif
