/* ZeRO / FSDP units: the auto-wrap policy and each unit's
 * flat layout (2.6).
 *
 * Wrapping is bottom-up: a module (never the root) becomes a unit when the
 * policy accepts it given the parameter elements under it that no nested
 * unit took yet (min_num_params: that count >= the threshold, unless one of
 * the module's parameters is tied to one outside it; by type: its type
 * name; or the user's predicate). The root is always a unit and takes
 * what is left. An entry belongs to the unit whose module path is the
 * longest prefix of its own module's path. Units whose modules hold no
 * parameter of their own are dropped (no hooks, no collectives). A module
 * whose parameters have more than one dtype (a bf16 model with f32 norms)
 * gets one unit per dtype (f32, bf16, f16 in that order), each with its own
 * flat: FSDP likewise wraps the modules it keeps in f32 separately. */
#include "dtrain/precision.h"
#include "parallel/zero/zero_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    dt_module **mods;   /* candidate unit modules, pre-order */
    bool *wrap;
    int n, cap;
    int type_hits;      /* modules whose type is p->wrap_module_type */
} wrap_state;

static size_t own_numel(const dt_model *m, const dt_module *mod)
{
    size_t n = 0;
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info e;
        if (dt_model_entry(m, i, &e) >= 0 && e.module == mod && !e.is_buffer && e.tied_to < 0 && dt_dtype_is_float(e.dtype))
            n += e.numel;
    }
    return n;
}

/* Is module path a a prefix of b at a component boundary? ("" of all) */
static bool path_prefix(const char *a, const char *b)
{
    size_t n = strlen(a);
    if (!n)
        return true;
    return !strncmp(a, b, n) && (b[n] == '\0' || b[n] == '.');
}

/* Does a tie (lm_head.weight -> transformer.wte.weight) cross the border of
 * mod's subtree, one side inside and the other outside? */
static bool splits_tie(const dt_model *m, const dt_module *mod)
{
    const char *mp = dt_module_path(mod);
    for (size_t i = 0; i < dt_model_num_entries(m); i++) {
        dt_param_info e, s;
        if (dt_model_entry(m, i, &e) < 0 || e.tied_to < 0 || dt_model_entry(m, (size_t)e.tied_to, &s) < 0)
            continue;
        if (path_prefix(mp, dt_module_path(e.module)) != path_prefix(mp, dt_module_path(s.module)))
            return true;
    }
    return false;
}

/* Pre-order slot first, then children, then the decision (bottom-up). */
static dt_status visit(const dt_model *m, dt_module *mod, const dt_zero_params *p, wrap_state *w, size_t *left)
{
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 32;
        dt_module **mm = realloc(w->mods, (size_t)cap * sizeof *mm);
        if (mm)
            w->mods = mm;
        bool *ww = realloc(w->wrap, (size_t)cap * sizeof *ww);
        if (ww)
            w->wrap = ww;
        if (!mm || !ww)
            return dt_error(DT_ERR_NO_MEMORY, "ZeRO: wrap policy");
        w->cap = cap;
    }
    int slot = w->n++;
    w->mods[slot] = mod;
    w->wrap[slot] = false;
    size_t sum = own_numel(m, mod);
    for (int i = 0; i < dt_module_num_children(mod); i++) {
        size_t c = 0;
        dt_status st = visit(m, dt_module_child(mod, i), p, w, &c);
        if (st < 0)
            return st;
        sum += c;
    }
    bool root = mod == dt_model_root(m), take = false;
    if (p->wrap_module_type && !strcmp(dt_module_type(mod), p->wrap_module_type))
        w->type_hits++;
    if (!root && sum > 0) {
        if (p->wrap_fn)
            take = p->wrap_fn(p->wrap_ud, mod, sum);
        if (p->wrap_module_type && !strcmp(dt_module_type(mod), p->wrap_module_type))
            take = true;
        /* the size policy leaves a module whose tied twin lives outside it
         * (GPT-2's wte, tied to lm_head) to its parent: a tie cannot span
         * units; the explicit policies (type, predicate) get the error */
        if (p->wrap_min_params > 0 && sum >= p->wrap_min_params && !splits_tie(m, mod))
            take = true;
    }
    w->wrap[slot] = root || take;
    *left = take ? 0 : sum;
    return DT_OK;
}

/* A type policy that names no module of the model is a typo, not "one
 * unit": the error lists the types the model has. */
static dt_status no_such_type(const char *type, const wrap_state *w)
{
    char have[256] = "";
    size_t len = 0;
    for (int i = 0; i < w->n && len + 4 < sizeof have; i++) {
        const char *t = dt_module_type(w->mods[i]);
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = !strcmp(dt_module_type(w->mods[j]), t);
        if (seen)
            continue;
        int k = snprintf(have + len, sizeof have - len, "%s%s", len ? ", " : "", t);
        if (k < 0 || (size_t)k >= sizeof have - len) {
            snprintf(have + len, sizeof have - len, "%s...", len ? ", " : "");
            break;
        }
        len += (size_t)k;
    }
    return dt_error(DT_ERR_INVALID_ARG, "ZeRO: wrap_module_type '%s' names no module of the model (its module types: %s)",
                    type, have);
}

/* f32, bf16, f16 -> 0, 1, 2 (the order of a module's units). */
static int dclass(dt_dtype t) { return t == DT_BF16 ? 1 : t == DT_F16 ? 2 : 0; }
static const dt_dtype k_dclass[3] = {DT_F32, DT_BF16, DT_F16};

void dt__zero_free_units(dt_zero *z)
{
    for (int i = 0; i < z->nu; i++) {
        zunit *u = &z->u[i];
        dt__zero_unit_unmap(u);
        free(u->name);
        free(u->entries);
        free(u->uoff);
        free(u->segs);
    }
    free(z->u);
    free(z->entry_unit);
    z->u = NULL;
    z->entry_unit = NULL;
    z->nu = 0;
}

dt_status dt__zero_build_units(dt_zero *z, const dt_zero_params *p)
{
    const dt_model *m = z->m;
    wrap_state w = {0};
    size_t left = 0;
    dt_status st = visit(m, dt_model_root(m), p, &w, &left);
    if (st >= 0 && p->wrap_module_type && !w.type_hits)
        st = no_such_type(p->wrap_module_type, &w);
    const size_t ne = dt_model_num_entries(m);
    /* per entry: its unit's key (candidate module k, dtype class d) as
     * 3 * (k + 1) + d, with k = -1 for the persistent unit; -1: none */
    int *cand = NULL;
    const int nkeys = 3 * (w.n + 1);
    z->entry_unit = malloc((ne ? ne : 1) * sizeof *z->entry_unit);
    cand = malloc((ne ? ne : 1) * sizeof *cand);
    int *count = calloc((size_t)nkeys, sizeof *count), *map = malloc((size_t)nkeys * sizeof *map);
    if (st >= 0 && (!z->entry_unit || !cand || !count || !map))
        st = dt_error(DT_ERR_NO_MEMORY, "ZeRO: units");
    z->nentry = ne;
    for (size_t i = 0; st >= 0 && i < ne; i++) {
        dt_param_info e;
        dt_model_entry(m, i, &e);
        z->entry_unit[i] = -1;
        cand[i] = -1;
        if (e.is_buffer || e.tied_to >= 0)
            continue;
        if (!dt_dtype_is_float(e.dtype)) {
            st = dt_error(DT_ERR_UNSUPPORTED, "ZeRO: parameter '%s' is %s; f32, bf16 and f16 parameters are sharded",
                          e.name, dt_dtype_name(e.dtype));
            break;
        }
        if (p->stage == 3 && e.numel < p->param_persistence_threshold) {
            cand[i] = dclass(e.dtype);
            count[cand[i]]++;
            continue;
        }
        const char *mp = dt_module_path(e.module);
        int best = 0;
        size_t bestlen = 0;
        for (int k = 0; k < w.n; k++) {
            const char *up = dt_module_path(w.mods[k]);
            if (w.wrap[k] && path_prefix(up, mp) && strlen(up) >= bestlen) {
                best = k;
                bestlen = strlen(up);
            }
        }
        cand[i] = 3 * (best + 1) + dclass(e.dtype);
        count[cand[i]]++;
    }
    /* unit indices: the persistent units first, then modules in pre-order,
     * each module's dtypes in class order */
    int nu = 0;
    for (int key = 0; key < nkeys; key++)
        map[key] = count[key] > 0 ? nu++ : -1;
    if (st >= 0 && !(z->u = calloc((size_t)(nu ? nu : 1), sizeof *z->u)))
        st = dt_error(DT_ERR_NO_MEMORY, "ZeRO: units");
    if (st < 0)
        goto out;
    z->nu = nu;
    for (int key = 0; key < nkeys; key++) {
        int ui = map[key], k = key / 3 - 1;
        if (ui < 0)
            continue;
        zunit *u = &z->u[ui];
        int n = count[key];
        u->z = z;
        u->index = ui;
        u->dtype = k_dclass[key % 3];
        u->es = dt_dtype_size(u->dtype);
        u->mod = k < 0 ? NULL : w.mods[k];
        const char *path = k < 0 ? "<persistent>" : dt_module_path(u->mod);
        u->name = malloc(strlen(path) + 16);
        u->entries = malloc((size_t)n * sizeof *u->entries);
        u->uoff = malloc((size_t)n * sizeof *u->uoff);
        u->segs = malloc((size_t)n * sizeof *u->segs);
        if (!u->name || !u->entries || !u->uoff || !u->segs) {
            st = dt_error(DT_ERR_NO_MEMORY, "ZeRO: units");
            goto out;
        }
        /* a module's second dtype is named apart: "<root>/bf16" */
        const bool split = (key % 3 > 0 && count[key - key % 3]) || (key % 3 == 2 && count[key - 1]);
        snprintf(u->name, strlen(path) + 16, "%s%s%s", *path ? path : "<root>", split ? "/" : "",
                 split ? dt_dtype_name(u->dtype) : "");
        u->resident = p->stage < 3 || k < 0;
        const size_t align = 64 / u->es; /* 64-byte aligned tensors, as the model's flats */
        size_t off = 0;
        for (size_t i = 0; i < ne; i++) {
            if (cand[i] != key)
                continue;
            dt_param_info e;
            dt_model_entry(m, i, &e);
            u->entries[u->nent] = i;
            u->uoff[u->nent++] = off;
            off += (e.numel + align - 1) / align * align;
            z->entry_unit[i] = ui;
        }
        u->used_numel = off;
        u->total = dt_flat_padded(u->dtype, off, z->W);
        u->c = u->total / (size_t)z->W;
    }
    /* tied parameters: under stage 3 both users must be in the source's unit */
    for (size_t i = 0; p->stage == 3 && i < ne; i++) {
        dt_param_info e, s;
        dt_model_entry(m, i, &e);
        if (e.tied_to < 0)
            continue;
        dt_model_entry(m, (size_t)e.tied_to, &s);
        int su = z->entry_unit[e.tied_to];
        const char *mp = dt_module_path(e.module);
        int best = -1;
        size_t bestlen = 0;
        for (int k = 0; k < w.n; k++) {
            const char *up = dt_module_path(w.mods[k]);
            if (w.wrap[k] && path_prefix(up, mp) && strlen(up) >= bestlen) {
                best = k;
                bestlen = strlen(up);
            }
        }
        int tu = best >= 0 ? map[3 * (best + 1) + dclass(s.dtype)] : -1;
        if (su >= 0 && !z->u[su].resident && tu != su) {
            st = dt_error(DT_ERR_UNSUPPORTED, "ZeRO stage 3: '%s' is tied to '%s' but they are in different units "
                                              "('%s' and '%s'): wrap a module that holds both",
                          e.name, s.name, tu >= 0 ? z->u[tu].name : "?", z->u[su].name);
            goto out;
        }
    }
out:
    free(cand);
    free(count);
    free(map);
    free(w.mods);
    free(w.wrap);
    return st;
}
