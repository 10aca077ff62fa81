/* Chat templates (chat_template.h): running the tree.
 *
 * Scopes are jinja2's: the variables passed, then the template's own
 * (top-level set, and set inside if); each for-loop iteration, macro call
 * and with block has a fresh scope whose sets are gone after it, so a set
 * in a loop body is not seen by the next iteration nor after the loop
 * (namespace() is how templates carry state out, as in jinja2). A macro
 * sees the scope it was defined in as it is when called.
 *
 * Memory: values live in the arena. What an output statement, an if test
 * or a loop iteration allocated is given back after it unless a namespace
 * attribute was assigned meanwhile (the only way a value made there can
 * outlive it), so a loop over many messages runs in bounded memory. */
#include "chat_template_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SIG_NONE, SIG_BREAK, SIG_CONTINUE };

static ct_val eval(ct_ctx *c, const ct_node *n, ct_frame *f);
static int exec(ct_ctx *c, const ct_node *n, ct_frame *f);

/* ---- scopes ------------------------------------------------------------------------------- */

static ct_frame *frame_new(ct_ctx *c, ct_frame *parent)
{
    ct_frame *f = ct_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(ct_ctx *c, ct_frame *f, const char *name, ct_val v)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 4;
        const char **names = ct_alloc(c, cap * sizeof *names);
        ct_val *vals = ct_alloc(c, cap * sizeof *vals);
        if (f->n) {
            memcpy(names, f->names, f->n * sizeof *names);
            memcpy(vals, f->vals, f->n * sizeof *vals);
        }
        f->names = names;
        f->vals = vals;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static ct_val lookup(ct_ctx *c, ct_frame *f, const char *name)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name))
                return f->vals[i];
    ct_val v;
    if (ct_global_lookup(name, &v))
        return v;
    return ct_undef(c, "'%s' is undefined", name);
}

/* ---- output ------------------------------------------------------------------------------- */

static void emit(ct_ctx *c, const char *s, size_t n)
{
    if (!n)
        return;
    if (n > c->lim.max_output || c->out_n > c->lim.max_output - n)
        ct_fail(c, 0, DT_ERR_RANGE, "the output is larger than %zu MiB (the limit)", c->lim.max_output >> 20);
    if (c->out_cap - c->out_n < n + 1) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap - c->out_n < n + 1)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p)
            ct_fail(c, 0, DT_ERR_NO_MEMORY, "out of memory");
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_n, s, n);
    c->out_n += n;
}

/* Run body with its output captured as a string. */
static ct_val capture(ct_ctx *c, const ct_node *body, ct_frame *f, int *sig)
{
    size_t start = c->out_n;
    c->capturing++;
    int s = exec(c, body, f);
    c->capturing--;
    if (sig)
        *sig = s;
    ct_val v = ct_str(ct_strdup(c, c->out ? c->out + start : "", c->out_n - start), c->out_n - start);
    c->out_n = start;
    return v;
}

/* ---- calls -------------------------------------------------------------------------------- */

static ct_val call_macro(ct_ctx *c, int line, ct_macro *m, size_t n, const ct_val *args, const char *const *kw)
{
    const ct_node *def = m->def;
    const char *mname = def->k == N_MACRO ? def->name : "caller";
    if (c->calls >= c->lim.max_calls)
        ct_fail(c, line, DT_ERR_RANGE, "macro calls nested deeper than %d (the limit), in '%s'", c->lim.max_calls,
                mname);
    ct_frame *fr = frame_new(c, m->closure);
    size_t np = def->nnames;
    ct_val *bound = ct_alloc(c, (np ? np : 1) * sizeof *bound);
    for (size_t i = 0; i < np; i++)
        bound[i].k = CT_ABSENT;
    ct_list *varargs = ct_list_new(c, 0);
    ct_dict *kwargs = ct_dict_new(c);
    ct_val caller = {.k = CT_ABSENT};
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        if (!kw || !kw[i]) {
            if (pos < np)
                bound[pos++] = args[i];
            else if (def->op & 1)
                ct_list_push(c, varargs, args[i]);
            else
                ct_fail(c, line, DT_ERR_INVALID_ARG, "macro '%s' takes not more than %zu argument(s)", mname, np);
            continue;
        }
        size_t j = 0;
        while (j < np && strcmp(def->names[j], kw[i]))
            j++;
        if (j < np) {
            if (bound[j].k != CT_ABSENT)
                ct_fail(c, line, DT_ERR_INVALID_ARG, "macro '%s' got multiple values for argument '%s'", mname,
                        kw[i]);
            bound[j] = args[i];
        } else if (!strcmp(kw[i], "caller")) {
            caller = args[i];
        } else if (def->op & 2) {
            ct_dict_set(c, kwargs, ct_cstr(kw[i]), args[i]);
        } else {
            ct_fail(c, line, DT_ERR_INVALID_ARG, "macro '%s' takes no keyword argument '%s'", mname, kw[i]);
        }
    }
    c->calls++;
    for (size_t i = 0; i < np; i++) {
        ct_val v = bound[i];
        if (v.k == CT_ABSENT)
            v = def->kids[i] ? eval(c, def->kids[i], fr) : ct_undef(c, "parameter '%s' was not provided",
                                                                   def->names[i]);
        frame_set(c, fr, def->names[i], v);
    }
    varargs->tuple = true;
    if (def->op & 1)
        frame_set(c, fr, "varargs", ct_list_val(varargs));
    if (def->op & 2)
        frame_set(c, fr, "kwargs", (ct_val){.k = CT_DICT, .u.d = kwargs});
    if (caller.k != CT_ABSENT)
        frame_set(c, fr, "caller", caller);
    ct_val out = capture(c, def->b, fr, NULL);
    c->calls--;
    return out;
}

ct_val dt__chat_call(ct_ctx *c, int line, ct_val fn, size_t n, const ct_val *args, const char *const *kw)
{
    switch (fn.k) {
    case CT_MACRO: return call_macro(c, line, fn.u.m, n, args, kw);
    case CT_FUNC: return ct_global_call(c, line, (int)fn.u.i, n, args, kw);
    case CT_METHOD: return ct_method_call(c, line, fn.u.me, n, args, kw);
    case CT_UNDEF: ct_fail_undef(c, line, fn);
    default: ct_fail(c, line, DT_ERR_INVALID_ARG, "'%s' object is not callable", ct_type_name(fn));
    }
}

/* Arguments of a call, filter or test node, evaluated. */
static ct_val *eval_args(ct_ctx *c, const ct_node *n, ct_frame *f, size_t extra)
{
    ct_val *v = ct_alloc(c, (n->nk + extra + 1) * sizeof *v);
    for (size_t i = 0; i < n->nk; i++)
        v[i] = eval(c, n->kids[i], f);
    return v;
}

/* A filter node applied; an innermost NULL operand is `base` (filter blocks). */
static ct_val eval_filter(ct_ctx *c, const ct_node *n, ct_frame *f, ct_val base)
{
    if (n->len)
        ct_fail(c, n->line, DT_ERR_FORMAT, "no filter named '%s'", n->name);
    ct_val v = n->a ? (n->a->k == N_FILTER ? eval_filter(c, n->a, f, base) : eval(c, n->a, f)) : base;
    ct_val *args = eval_args(c, n, f, 0);
    return ct_filter(c, n->line, n->name, v, n->nk, args, n->names);
}

static ct_val eval_call(ct_ctx *c, const ct_node *n, ct_frame *f, ct_val caller)
{
    ct_val fn = eval(c, n->a, f);
    ct_val *args = eval_args(c, n, f, 1);
    const char **kw = n->names;
    size_t na = n->nk;
    if (caller.k != CT_ABSENT) {
        const char **k2 = ct_alloc(c, (na + 1) * sizeof *k2);
        for (size_t i = 0; i < na; i++)
            k2[i] = kw ? kw[i] : NULL;
        k2[na] = "caller";
        args[na++] = caller;
        kw = k2;
    }
    return dt__chat_call(c, n->line, fn, na, args, kw);
}

static bool compare(ct_ctx *c, int line, const char *op, ct_val a, ct_val b)
{
    if (!strcmp(op, "=="))
        return ct_eq(c, a, b);
    if (!strcmp(op, "!="))
        return !ct_eq(c, a, b);
    if (!strcmp(op, "in"))
        return ct_contains(c, line, b, a);
    if (!strcmp(op, "notin"))
        return !ct_contains(c, line, b, a);
    int r = ct_cmp(c, line, a, b, op);
    return op[0] == '<' ? (op[1] ? r <= 0 : r < 0) : (op[1] ? r >= 0 : r > 0);
}

static ct_val eval_node(ct_ctx *c, const ct_node *n, ct_frame *f);

/* A left-leaning chain (1 + 1 + ... + 1) nests as deep as it is long: the C stack is bounded here. */
static ct_val eval(ct_ctx *c, const ct_node *n, ct_frame *f)
{
    if (++c->expr_depth > CT_MAX_EXPR)
        ct_fail(c, n->line, DT_ERR_RANGE, "an expression nested deeper than %d levels (the limit)", CT_MAX_EXPR);
    ct_val v = eval_node(c, n, f);
    c->expr_depth--;
    return v;
}

static ct_val eval_node(ct_ctx *c, const ct_node *n, ct_frame *f)
{
    switch (n->k) {
    case N_LIT: return n->lit;
    case N_NAME: return lookup(c, f, n->name);
    case N_ATTR: return ct_getattr(c, n->line, eval(c, n->a, f), n->name);
    case N_ITEM: {
        ct_val o = eval(c, n->a, f);
        return ct_getitem(c, n->line, o, eval(c, n->b, f));
    }
    case N_SLICE: {
        ct_val o = eval(c, n->a, f), none = {.k = CT_NONE};
        ct_val lo = n->b ? eval(c, n->b, f) : none, hi = n->c ? eval(c, n->c, f) : none;
        return ct_slice(c, n->line, o, lo, hi, n->d ? eval(c, n->d, f) : none);
    }
    case N_CALL: return eval_call(c, n, f, (ct_val){.k = CT_ABSENT});
    case N_FILTER: return eval_filter(c, n, f, (ct_val){.k = CT_UNDEF});
    case N_TEST: {
        if (n->len)
            ct_fail(c, n->line, DT_ERR_FORMAT, "no test named '%s'", n->name);
        ct_val v = eval(c, n->a, f);
        ct_val *args = eval_args(c, n, f, 0);
        return ct_bool(ct_test(c, n->line, n->name, v, n->nk, args, n->names) != (n->op != 0));
    }
    case N_NEG:
    case N_POS: return ct_neg(c, n->line, eval(c, n->a, f), n->k == N_NEG);
    case N_NOT: return ct_bool(!ct_truthy(eval(c, n->a, f)));
    case N_AND: {
        ct_val a = eval(c, n->a, f);
        return ct_truthy(a) ? eval(c, n->b, f) : a;
    }
    case N_OR: {
        ct_val a = eval(c, n->a, f);
        return ct_truthy(a) ? a : eval(c, n->b, f);
    }
    case N_BIN: {
        ct_val a = eval(c, n->a, f);
        return ct_binop(c, n->line, n->op, a, eval(c, n->b, f));
    }
    case N_CONCAT: {
        ct_buf b = {.c = c};
        ct_buf_put(&b, "", 0);
        ct_str_into(&b, eval(c, n->a, f));
        ct_str_into(&b, eval(c, n->b, f));
        return ct_str(b.p, b.n);
    }
    case N_CMP: {
        ct_val a = eval(c, n->a, f);
        for (size_t i = 0; i < n->nk; i++) {
            ct_val b = eval(c, n->kids[i], f);
            if (!compare(c, n->line, n->names[i], a, b))
                return ct_bool(false);
            a = b;
        }
        return ct_bool(true);
    }
    case N_COND:
        if (ct_truthy(eval(c, n->b, f)))
            return eval(c, n->a, f);
        if (n->c)
            return eval(c, n->c, f);
        return ct_undef(c, "the inline if-expression on line %d evaluated to false and no else section was defined",
                        n->line);
    case N_LIST:
    case N_TUPLE: {
        ct_list *l = ct_list_new(c, n->nk);
        for (size_t i = 0; i < n->nk; i++)
            ct_list_push(c, l, eval(c, n->kids[i], f));
        l->tuple = n->k == N_TUPLE;
        return ct_list_val(l);
    }
    case N_DICT: {
        ct_dict *d = ct_dict_new(c);
        for (size_t i = 0; i + 1 < n->nk; i += 2) {
            ct_val k = eval(c, n->kids[i], f);
            ct_dict_set(c, d, k, eval(c, n->kids[i + 1], f));
        }
        return (ct_val){.k = CT_DICT, .u.d = d};
    }
    default: ct_fail(c, n->line, DT_ERR_INTERNAL, "chat template: statement node %d in an expression", (int)n->k);
    }
}

/* ---- statements --------------------------------------------------------------------------- */

/* Bind a for/set target: one name, or a tuple of names unpacking v. */
static void assign(ct_ctx *c, int line, const ct_node *n, ct_frame *f, ct_val v)
{
    if (!n->op) {
        frame_set(c, f, n->names[0], v);
        return;
    }
    ct_list *items = ct_iter(c, line, v);
    if (items->n != n->nnames)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "%s values to unpack (expected %zu, got %zu)",
                items->n > n->nnames ? "too many" : "not enough", n->nnames, items->n);
    for (size_t i = 0; i < n->nnames; i++)
        frame_set(c, f, n->names[i], items->v[i]);
}

static void set_ns(ct_ctx *c, int line, const ct_node *n, ct_frame *f, ct_val v)
{
    ct_val ns = lookup(c, f, n->names[0]);
    if (ns.k != CT_NS)
        ct_fail(c, line, DT_ERR_INVALID_ARG, "cannot assign attribute '%s' on '%s', which is not a namespace",
                n->name, n->names[0]);
    ct_dict_set(c, ns.u.d, ct_cstr(n->name), v);
    c->stores++;
}

static int exec_for(ct_ctx *c, const ct_node *n, ct_frame *f)
{
    ct_list *items = ct_iter(c, n->line, eval(c, n->a, f));
    if (n->d) { /* the loop's `if`: filter first, so loop.length counts what is left */
        ct_list *kept = ct_list_new(c, items->n);
        for (size_t i = 0; i < items->n; i++) {
            ct_tick(c, n->line, 1);
            ct_frame *fr = frame_new(c, f);
            assign(c, n->line, n, fr, items->v[i]);
            if (ct_truthy(eval(c, n->d, fr)))
                ct_list_push(c, kept, items->v[i]);
        }
        items = kept;
    }
    /* jinja2 runs the else block unless an iteration ran its body to the end: also after a
     * break or continue in every iteration */
    bool completed = false;
    ct_loop *lp = ct_alloc(c, sizeof *lp);
    lp->items = items;
    for (lp->i = 0; lp->i < items->n; lp->i++) {
        ct_tick(c, n->line, 1);
        ct_mark m = ct_arena_mark(c);
        uint64_t stores = c->stores;
        ct_frame *fr = frame_new(c, f);
        assign(c, n->line, n, fr, items->v[lp->i]);
        frame_set(c, fr, "loop", (ct_val){.k = CT_LOOP, .u.loop = lp});
        int sig = exec(c, n->b, fr);
        if (c->stores == stores)
            ct_arena_rewind(c, m);
        completed |= sig == SIG_NONE;
        if (sig == SIG_BREAK)
            break;
    }
    if (!completed && n->c)
        return exec(c, n->c, frame_new(c, f));
    return SIG_NONE;
}

static int exec(ct_ctx *c, const ct_node *n, ct_frame *f)
{
    c->line = n->line;
    switch (n->k) {
    case N_BODY:
        for (size_t i = 0; i < n->nk; i++) {
            int sig = exec(c, n->kids[i], f);
            if (sig)
                return sig;
        }
        return SIG_NONE;
    case N_TEXT: emit(c, n->name, n->len); return SIG_NONE;
    case N_OUT: {
        ct_mark m = ct_arena_mark(c);
        uint64_t stores = c->stores;
        ct_val v = eval(c, n->a, f);
        if (v.k == CT_STR) {
            emit(c, v.u.s.p, v.u.s.n);
        } else {
            ct_buf b = {.c = c};
            ct_str_into(&b, v);
            emit(c, b.p, b.n);
        }
        if (c->stores == stores)
            ct_arena_rewind(c, m);
        return SIG_NONE;
    }
    case N_IF: {
        ct_mark m = ct_arena_mark(c);
        uint64_t stores = c->stores;
        bool t = ct_truthy(eval(c, n->a, f));
        if (c->stores == stores)
            ct_arena_rewind(c, m);
        if (t)
            return exec(c, n->b, f);
        return n->c ? exec(c, n->c, f) : SIG_NONE;
    }
    case N_FOR: return exec_for(c, n, f);
    case N_SET: {
        ct_val v = eval(c, n->a, f);
        if (n->name)
            set_ns(c, n->line, n, f, v);
        else
            assign(c, n->line, n, f, v);
        return SIG_NONE;
    }
    case N_SETBLOCK: {
        int sig;
        ct_val v = capture(c, n->b, f, &sig);
        if (n->d)
            v = eval_filter(c, n->d, f, v);
        if (n->name)
            set_ns(c, n->line, n, f, v);
        else
            frame_set(c, f, n->names[0], v);
        return sig;
    }
    case N_MACRO: {
        ct_macro *m = ct_alloc(c, sizeof *m);
        memset(m, 0, sizeof *m);
        m->def = n;
        m->closure = f;
        frame_set(c, f, n->name, (ct_val){.k = CT_MACRO, .u.m = m});
        return SIG_NONE;
    }
    case N_CALLBLOCK: {
        ct_macro *m = ct_alloc(c, sizeof *m);
        memset(m, 0, sizeof *m);
        m->def = n;
        m->closure = f;
        ct_val v = eval_call(c, n->a, f, (ct_val){.k = CT_MACRO, .u.m = m});
        ct_buf b = {.c = c};
        ct_str_into(&b, v);
        emit(c, b.p, b.n);
        return SIG_NONE;
    }
    case N_FILTERBLOCK: {
        int sig;
        ct_val v = eval_filter(c, n->d, f, capture(c, n->b, f, &sig));
        ct_buf b = {.c = c};
        ct_str_into(&b, v);
        emit(c, b.p, b.n);
        return sig;
    }
    case N_WITH: {
        ct_frame *fr = frame_new(c, f);
        for (size_t i = 0; i < n->nk; i++)
            frame_set(c, fr, n->names[i], eval(c, n->kids[i], f));
        if (n->op != 'g' || !c->track_gen)
            return exec(c, n->b, fr);
        /* transformers' assistant mask: the output of the block, where the template's output stands then (inside
           a capture, that is not where the block's text lands: transformers marks other text then) */
        if (c->capturing)
            ct_fail(c, n->line, DT_ERR_UNSUPPORTED, "a generation block inside a macro, call, set or filter block "
                    "(its text's place in the output is not known while it is rendered: the assistant mask would "
                    "mark other text, as transformers' does)");
        const size_t start = c->out_n;
        const int sig = exec(c, n->b, fr);
        if (c->ngen == c->gen_cap) {
            size_t cap = c->gen_cap ? 2 * c->gen_cap : 16;
            size_t *g = ct_alloc(c, 2 * cap * sizeof *g);
            if (c->ngen)
                memcpy(g, c->gen, 2 * c->ngen * sizeof *g);
            c->gen = g;
            c->gen_cap = cap;
        }
        c->gen[2 * c->ngen] = start;
        c->gen[2 * c->ngen + 1] = c->out_n;
        c->ngen++;
        return sig;
    }
    case N_BREAK: return SIG_BREAK;
    case N_CONTINUE: return SIG_CONTINUE;
    default: ct_fail(c, n->line, DT_ERR_INTERNAL, "chat template: expression node %d as a statement", (int)n->k);
    }
}

void dt__chat_exec(ct_ctx *c, const ct_node *body, ct_frame *f)
{
    exec(c, body, f);
}
