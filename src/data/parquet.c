/* Parquet files as rows of JSON objects (parquet.h): the file, the
 * selection of columns, and records assembled from the columns' levels.
 *
 * The schema becomes a tree of JSON shapes (jnode): a value (one leaf
 * column), an object (a group's fields) or an array (a repeated field, or
 * a LIST group in its three- or two-level layout), each with the
 * definition level from which it is not null, and an array with the one
 * from which it has an element and its repetition level. A row is built
 * leaf by leaf: each of the leaf's (repetition, definition, value)
 * triples of the row walks the leaf's path of shapes from the row object
 * down, creating what is missing and choosing array elements by the
 * repetition level (below the array's level: its first element, a new
 * list; equal: the next element; above: the same element), with a cursor
 * per array level for each leaf; the leaves under one group find the
 * objects the first leaf made. Where two leaves disagree about the shape
 * (only in a corrupt file) the row is refused, never guessed.
 *
 * The bytes: the footer is read at open; a row group's column chunks for
 * the selected leaves are read whole when the row group starts (pread, or
 * pointed into for a file in memory), each chunk's pages decoded one at a
 * time (parquet_page.c). */
#include "parquet_impl.h"
#include "mapfile.h"
#include "tok_regex.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FOOTER ((uint64_t)1 << 30)
#define MAX_EXACT ((int64_t)1 << 53) /* larger integers do not survive a JSON number (a double) */

typedef enum { J_VAL, J_OBJ, J_ARR } jkind;

typedef struct jnode {
    jkind kind;
    const char *key;   /* the key in the parent object; NULL for an array's element */
    int d_present;     /* definition level from which it is not null */
    int d_elem, rep;   /* J_ARR: the level from which it has an element; its repetition level */
    struct jnode *parent, *elem;
    struct jnode **kids; /* J_OBJ */
    int nkids;
    int32_t el; /* its schema element (J_VAL: the leaf's) */
} jnode;

enum { V_STRING, V_INT, V_UINT, V_BOOL, V_FLOAT };

typedef struct leafsel {
    int32_t leaf;
    int vkind;
    pq_col *col;
    jnode *path[PQ_MAX_DEPTH + 1]; /* from the top-level field down to the value */
    int depth;
    int d_of_rep[PQ_MAX_DEPTH + 1]; /* the definition level of the array at each repetition level */
    cJSON *cur[PQ_MAX_DEPTH + 1];   /* per array on the path: this leaf's current element */
    uint8_t *chunk;                 /* the chunk's bytes (a file's; NULL in memory) */
    size_t chunk_cap;
} leafsel;

struct dt__pq_file {
    char *name;
    FILE *fp;
    const uint8_t *mem;
    uint64_t size;
    pq_meta m;
    /* the selection */
    bool selected, started, failed;
    jnode *pool;
    int32_t npool, cap_pool;
    int32_t *top;    /* the selected top-level fields' elements, in order */
    jnode **top_j;
    int32_t ntop;
    leafsel *leaves; /* in leaf order */
    int32_t nleaves;
    /* the position */
    int64_t group, row_in_group, row;
    char *scratch;
    size_t scratch_cap;
    char where[700];
};

/* ---- opening ----------------------------------------------------------------------------------------------------- */

static dt_status read_at(dt__pq_file *f, uint64_t off, size_t n, uint8_t *dst)
{
    if (f->mem) {
        memcpy(dst, f->mem + off, n);
        return DT_OK;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fileno(f->fp), dst + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return dt_error(DT_ERR_IO, "parquet %s: %s at byte %llu (was the file changed while read?)", f->name,
                            r < 0 ? strerror(errno) : "cannot read", (unsigned long long)(off + got));
        got += (size_t)r;
    }
    return DT_OK;
}

static dt_status open_common(dt__pq_file *f)
{
    if (f->size < 12)
        return dt_error(DT_ERR_FORMAT, "parquet %s: %llu bytes, too short for a Parquet file (\"PAR1\", the footer, "
                        "its length and \"PAR1\"): truncated?", f->name, (unsigned long long)f->size);
    uint8_t head[4], tail[8];
    dt_status st;
    if ((st = read_at(f, 0, 4, head)) < 0 || (st = read_at(f, f->size - 8, 8, tail)) < 0)
        return st;
    if (!memcmp(tail + 4, "PARE", 4))
        return dt_error(DT_ERR_UNSUPPORTED, "parquet %s: an encrypted footer (\"PARE\"), which dtrain does not read",
                        f->name);
    if (memcmp(head, "PAR1", 4) || memcmp(tail + 4, "PAR1", 4))
        return dt_error(DT_ERR_FORMAT, "parquet %s: not a Parquet file (no \"PAR1\" at its %s%s)", f->name,
                        memcmp(head, "PAR1", 4) ? "start" : "end",
                        memcmp(head, "PAR1", 4) ? "" : ": truncated?");
    uint64_t flen = (uint64_t)tail[0] | (uint64_t)tail[1] << 8 | (uint64_t)tail[2] << 16 | (uint64_t)tail[3] << 24;
    if (flen > f->size - 12 || flen > MAX_FOOTER)
        return dt_error(DT_ERR_FORMAT, "parquet %s: a footer of %llu bytes in a file of %llu: truncated or corrupt",
                        f->name, (unsigned long long)flen, (unsigned long long)f->size);
    uint8_t *foot = malloc(flen ? flen : 1);
    if (!foot)
        return dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory (a footer of %llu bytes)", f->name,
                        (unsigned long long)flen);
    st = read_at(f, f->size - 8 - flen, (size_t)flen, foot);
    if (st == DT_OK)
        st = dt__pq_meta_parse(foot, (size_t)flen, f->size - 8 - flen, f->name, &f->m);
    free(foot);
    return st;
}

static dt_status new_file(const char *name, dt__pq_file **out)
{
    *out = calloc(1, sizeof **out);
    if (*out)
        (*out)->name = strdup(name);
    if (!*out || !(*out)->name) {
        free(*out);
        *out = NULL;
        return dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory", name);
    }
    return DT_OK;
}

dt_status dt__pq_open(const char *path, dt__pq_file **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_open: out is NULL");
    *out = NULL;
    if (!path)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_open: no path");
    dt__pq_file *f;
    dt_status st = new_file(path, &f);
    if (st < 0)
        return st;
    const char *why;
    f->fp = dt__fopen_regular(path, &why); /* a FIFO: refused, not waited on */
    struct stat sb;
    if (!f->fp || fstat(fileno(f->fp), &sb) < 0) {
        st = dt_error(DT_ERR_IO, "parquet %s: cannot open: %s", path, f->fp ? strerror(errno) : why);
        dt__pq_close(f);
        return st;
    }
    f->size = (uint64_t)sb.st_size;
    if ((st = open_common(f)) < 0) {
        dt__pq_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

dt_status dt__pq_open_mem(const void *data, size_t size, const char *name, dt__pq_file **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_open_mem: out is NULL");
    *out = NULL;
    if (!data && size)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_open_mem: no data");
    dt__pq_file *f;
    dt_status st = new_file(name ? name : "(memory)", &f);
    if (st < 0)
        return st;
    f->mem = data ? data : (const uint8_t *)"";
    f->size = size;
    if ((st = open_common(f)) < 0) {
        dt__pq_close(f);
        return st;
    }
    *out = f;
    return DT_OK;
}

static void free_selection(dt__pq_file *f)
{
    for (int32_t i = 0; i < f->npool; i++)
        free(f->pool[i].kids);
    free(f->pool);
    for (int32_t i = 0; i < f->nleaves; i++) {
        dt__pq_col_free(f->leaves[i].col);
        free(f->leaves[i].chunk);
    }
    free(f->leaves);
    free(f->top);
    free(f->top_j);
    f->pool = NULL;
    f->leaves = NULL;
    f->top = NULL;
    f->top_j = NULL;
    f->npool = f->nleaves = f->ntop = 0;
}

void dt__pq_close(dt__pq_file *f)
{
    if (!f)
        return;
    free_selection(f);
    dt__pq_meta_free(&f->m);
    if (f->fp)
        fclose(f->fp);
    free(f->scratch);
    free(f->name);
    free(f);
}

int64_t dt__pq_num_rows(const dt__pq_file *f) { return f ? f->m.num_rows : 0; }
int64_t dt__pq_num_row_groups(const dt__pq_file *f) { return f ? f->m.ngroups : 0; }
const char *dt__pq_where(const dt__pq_file *f) { return f ? f->where : ""; }

/* The top-level fields: the root's children, each followed by its subtree. */
static int32_t next_sibling(const pq_meta *m, int32_t i)
{
    int32_t left = 1;
    while (left && i < m->nel) {
        left += m->el[i].nchild > 0 ? m->el[i].nchild : 0;
        left--;
        i++;
    }
    return i;
}

bool dt__pq_has_column(const dt__pq_file *f, const char *name)
{
    if (!f || !name)
        return false;
    for (int32_t i = 1; i < f->m.nel; i = next_sibling(&f->m, i))
        if (!strcmp(f->m.el[i].name, name))
            return true;
    return false;
}

/* ---- the selection: JSON shapes ---------------------------------------------------------------------------------- */

static const char *logical_name(int id)
{
    static const char *const n[] = {"?", "STRING", "MAP", "LIST", "ENUM", "DECIMAL", "DATE", "TIME", "TIMESTAMP",
                                    "?", "INTEGER", "UNKNOWN", "JSON", "BSON", "UUID", "FLOAT16", "VARIANT",
                                    "GEOMETRY", "GEOGRAPHY"};
    return id >= 0 && id < 19 ? n[id] : "an unknown logical type";
}

static const char *converted_name(int c)
{
    static const char *const n[] = {"UTF8", "MAP", "MAP_KEY_VALUE", "LIST", "ENUM", "DECIMAL", "DATE",
                                    "TIME_MILLIS", "TIME_MICROS", "TIMESTAMP_MILLIS", "TIMESTAMP_MICROS", "UINT_8",
                                    "UINT_16", "UINT_32", "UINT_64", "INT_8", "INT_16", "INT_32", "INT_64", "JSON",
                                    "BSON", "INTERVAL"};
    return c >= 0 && c < 22 ? n[c] : "an unknown converted type";
}

static bool is_list(const pq_el *e) { return e->converted == 3 || e->logical == 3; }
static bool is_map(const pq_el *e) { return e->converted == 1 || e->converted == 2 || e->logical == 2; }

/* The dotted path of element i ("messages.list.element.content"). */
static void el_path(const pq_meta *m, int32_t i, char *out, size_t n)
{
    int32_t chain[PQ_MAX_DEPTH + 1], k = 0;
    for (int32_t e = i; e > 0 && k <= PQ_MAX_DEPTH; e = m->el[e].parent)
        chain[k++] = e;
    size_t at = 0;
    out[0] = 0;
    while (k-- > 0 && at + 1 < n) {
        int w = snprintf(out + at, n - at, "%s%s", at ? "." : "", m->el[chain[k]].name);
        at = w < 0 || (size_t)w >= n - at ? n - 1 : at + (size_t)w;
    }
}

typedef struct builder {
    dt__pq_file *f;
    dt_status st;
} builder;

static jnode *new_j(builder *b, jkind kind, int32_t el, jnode *parent)
{
    dt__pq_file *f = b->f;
    if (f->npool >= f->cap_pool) {
        b->st = dt_error(DT_ERR_FORMAT, "parquet %s: the schema's shapes outnumber its elements", f->name);
        return NULL;
    }
    jnode *j = &f->pool[f->npool++];
    *j = (jnode){.kind = kind, .el = el, .parent = parent};
    return j;
}

static jnode *field_j(builder *b, int32_t el, int pd, int pr, jnode *parent);

/* The value of element el (its own levels d, r already counted). */
static jnode *value_j(builder *b, int32_t el, int d, int r, jnode *parent)
{
    dt__pq_file *f = b->f;
    const pq_meta *m = &f->m;
    const pq_el *e = &m->el[el];
    char path[512];
    if (e->nchild <= 0) {
        jnode *j = new_j(b, J_VAL, el, parent);
        if (j)
            j->d_present = d;
        return j;
    }
    if (is_map(e)) {
        el_path(m, el, path, sizeof path);
        b->st = dt_error(DT_ERR_UNSUPPORTED, "parquet %s: column \"%s\" is a MAP, which dtrain does not read as text "
                         "data", f->name, path);
        return NULL;
    }
    if (is_list(e)) {
        const pq_el *rep = &m->el[e->first_child];
        if (e->nchild != 1 || rep->rep != PQ_REPEATED) {
            el_path(m, el, path, sizeof path);
            b->st = dt_error(DT_ERR_FORMAT, "parquet %s: column \"%s\" is a LIST group whose %s", f->name, path,
                             e->nchild != 1 ? "children are more than one" : "child is not repeated");
            return NULL;
        }
        jnode *a = new_j(b, J_ARR, el, parent);
        if (!a)
            return NULL;
        a->d_present = d;
        a->d_elem = d + 1;
        a->rep = r + 1;
        char tuple[300];
        snprintf(tuple, sizeof tuple, "%s_tuple", e->name);
        if (rep->nchild <= 0 || rep->nchild > 1 || !strcmp(rep->name, "array") || !strcmp(rep->name, tuple))
            a->elem = value_j(b, e->first_child, d + 1, r + 1, a); /* two-level: the repeated field is the element */
        else
            a->elem = field_j(b, rep->first_child, d + 1, r + 1, a); /* three-level: its one child is */
        return a->elem ? a : NULL;
    }
    jnode *o = new_j(b, J_OBJ, el, parent);
    if (!o)
        return NULL;
    o->d_present = d;
    o->kids = calloc((size_t)e->nchild, sizeof *o->kids);
    if (!o->kids) {
        b->st = dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory", f->name);
        return NULL;
    }
    for (int32_t c = e->first_child, k = 0; k < e->nchild; k++, c = next_sibling(m, c)) {
        if (!(o->kids[k] = field_j(b, c, d, r, o)))
            return NULL;
        o->kids[k]->key = m->el[c].name;
        o->nkids++;
    }
    return o;
}

/* Field el of a parent whose levels are pd, pr. */
static jnode *field_j(builder *b, int32_t el, int pd, int pr, jnode *parent)
{
    const pq_el *e = &b->f->m.el[el];
    int d = pd + (e->rep != PQ_REQUIRED), r = pr + (e->rep == PQ_REPEATED);
    if (e->rep != PQ_REPEATED)
        return value_j(b, el, d, r, parent);
    jnode *a = new_j(b, J_ARR, el, parent); /* a bare repeated field: a list, empty rather than null */
    if (!a)
        return NULL;
    a->d_present = pd;
    a->d_elem = d;
    a->rep = r;
    a->elem = value_j(b, el, d, r, a);
    return a->elem ? a : NULL;
}

/* How a leaf's values become JSON, or an error naming why the leaf is not read. */
static dt_status leaf_kind(const dt__pq_file *f, int32_t el, int *kind)
{
    const pq_el *e = &f->m.el[el];
    char path[512];
    el_path(&f->m, el, path, sizeof path);
    const int lg = e->logical, cv = e->converted;
    const char *bad = NULL;
    switch (e->type) {
    case PQ_BYTE_ARRAY:
        *kind = V_STRING;
        if ((lg >= 0 && lg != 1 && lg != 4 && lg != 12 && lg != 11) || (cv >= 0 && cv != 0 && cv != 4 && cv != 19))
            bad = lg >= 0 ? logical_name(lg) : converted_name(cv);
        break;
    case PQ_INT32:
    case PQ_INT64:
        *kind = (lg == 10 && e->int_unsigned) || (cv >= 11 && cv <= 14) ? V_UINT : V_INT;
        if ((lg >= 0 && lg != 10 && lg != 11) || (cv >= 0 && (cv < 11 || cv > 18)))
            bad = lg >= 0 ? logical_name(lg) : converted_name(cv);
        break;
    case PQ_BOOLEAN:
        *kind = V_BOOL;
        break;
    case PQ_FLOAT:
    case PQ_DOUBLE:
        *kind = V_FLOAT;
        break;
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "parquet %s: column \"%s\" is %s, which dtrain does not read as text data "
                        "(strings, integers, booleans and floats are read)", f->name, path,
                        e->type == PQ_INT96 ? "INT96 (a legacy timestamp)" : "FIXED_LEN_BYTE_ARRAY");
    }
    if (bad)
        return dt_error(DT_ERR_UNSUPPORTED, "parquet %s: column \"%s\" holds %s values, which dtrain does not read as "
                        "text data (strings, integers, booleans and floats are read)", f->name, path, bad);
    return DT_OK;
}

/* The leaves under shape j, into the selection (in the order met, which is leaf order within a field). */
static dt_status collect(dt__pq_file *f, jnode *j)
{
    if (j->kind == J_ARR)
        return collect(f, j->elem);
    if (j->kind == J_OBJ) {
        for (int k = 0; k < j->nkids; k++) {
            dt_status st = collect(f, j->kids[k]);
            if (st < 0)
                return st;
        }
        return DT_OK;
    }
    leafsel *s = &f->leaves[f->nleaves];
    memset(s, 0, sizeof *s);
    s->leaf = f->m.el[j->el].leaf;
    dt_status st = leaf_kind(f, j->el, &s->vkind);
    if (st < 0)
        return st;
    jnode *chain[PQ_MAX_DEPTH + 1];
    int n = 0, max_rep = 0;
    for (jnode *p = j; p && n <= PQ_MAX_DEPTH; p = p->parent)
        chain[n++] = p;
    for (int k = 0; k < n; k++) {
        s->path[k] = chain[n - 1 - k];
        if (s->path[k]->kind == J_ARR) {
            max_rep = s->path[k]->rep;
            s->d_of_rep[max_rep] = s->path[k]->d_elem;
        }
    }
    s->depth = n;
    char path[512];
    el_path(&f->m, j->el, path, sizeof path);
    s->col = dt__pq_col_new(f->m.el[j->el].type, max_rep, j->d_present, f->name, path);
    if (!s->col)
        return dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory", f->name);
    f->nleaves++;
    return DT_OK;
}

dt_status dt__pq_select(dt__pq_file *f, const char *const *names, size_t n)
{
    if (!f || (n && !names))
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_select: NULL argument");
    if (f->started)
        return dt_error(DT_ERR_INVALID_ARG, "parquet %s: columns are chosen before the first row", f->name);
    free_selection(f);
    const pq_meta *m = &f->m;
    f->cap_pool = 2 * m->nel + 2;
    f->pool = calloc((size_t)f->cap_pool, sizeof *f->pool);
    f->top = calloc((size_t)m->nel + 1, sizeof *f->top);
    f->top_j = calloc((size_t)m->nel + 1, sizeof *f->top_j);
    f->leaves = calloc((size_t)m->nleaf + 1, sizeof *f->leaves);
    if (!f->pool || !f->top || !f->top_j || !f->leaves) {
        free_selection(f);
        return dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory", f->name);
    }
    dt_status st = DT_OK;
    builder b = {.f = f};
    for (int32_t i = 1; st == DT_OK && i < m->nel; i = next_sibling(m, i)) {
        bool want = !names;
        for (size_t k = 0; !want && k < n; k++)
            want = names[k] && !strcmp(names[k], m->el[i].name);
        for (int32_t t = 0; want && t < f->ntop; t++)
            if (!strcmp(m->el[f->top[t]].name, m->el[i].name))
                st = dt_error(DT_ERR_FORMAT, "parquet %s: two columns are named \"%s\"", f->name, m->el[i].name);
        if (!want || st < 0)
            continue;
        jnode *j = field_j(&b, i, 0, 0, NULL);
        if (!j) {
            st = b.st;
            break;
        }
        j->key = m->el[i].name;
        f->top[f->ntop] = i;
        f->top_j[f->ntop++] = j;
        st = collect(f, j);
    }
    if (st < 0) {
        free_selection(f);
        return st;
    }
    f->selected = true;
    return DT_OK;
}

/* ---- rows -------------------------------------------------------------------------------------------------------- */

static dt_status row_err(dt__pq_file *f, const leafsel *s, dt_status code, const char *what)
{
    char path[512];
    el_path(&f->m, f->m.leaf_el[s->leaf], path, sizeof path);
    return dt_error(code, "%s, column \"%s\": %s", f->where, path, what);
}

/* Start row group g: read the selected leaves' chunks. */
static dt_status start_group(dt__pq_file *f, int64_t g)
{
    const pq_group *gr = &f->m.groups[g];
    for (int32_t i = 0; i < f->nleaves; i++) {
        leafsel *s = &f->leaves[i];
        const pq_chunk *cm = &gr->cols[s->leaf];
        uint64_t start = cm->dict_off > 0 && cm->dict_off < cm->data_off ? (uint64_t)cm->dict_off
                                                                          : (uint64_t)cm->data_off;
        size_t n = (size_t)cm->total_compressed;
        const uint8_t *bytes;
        if (f->mem) {
            bytes = f->mem + start;
        } else {
            if (n > s->chunk_cap) {
                uint8_t *b = realloc(s->chunk, n);
                if (!b)
                    return dt_error(DT_ERR_NO_MEMORY, "parquet %s: row group %lld: out of memory (a column chunk of "
                                    "%zu bytes)", f->name, (long long)g, n);
                s->chunk = b;
                s->chunk_cap = n;
            }
            dt_status st = read_at(f, start, n, s->chunk);
            if (st < 0)
                return st;
            bytes = s->chunk;
        }
        dt__pq_col_start(s->col, g, cm, bytes, n);
    }
    return DT_OK;
}

/* The scratch buffer holding v as a NUL-terminated string, checked. */
static dt_status string_of(dt__pq_file *f, const leafsel *s, const pq_val *v, const char **out)
{
    size_t bad;
    char what[200];
    const uint8_t *str = v->n ? v->s : (const uint8_t *)""; /* an empty value may have no bytes at all */
    const uint8_t *nul = memchr(str, 0, v->n);
    if (nul) {
        snprintf(what, sizeof what, "a string holds a NUL character (at byte %zu), which dtrain cannot keep in a "
                 "string", (size_t)(nul - str));
        return row_err(f, s, DT_ERR_FORMAT, what);
    }
    if (!dt__utf8_valid(str, v->n, &bad)) {
        snprintf(what, sizeof what, "a string that is not valid UTF-8 (at byte %zu)", bad);
        return row_err(f, s, DT_ERR_FORMAT, what);
    }
    if (v->n + 1 > f->scratch_cap) {
        size_t cap = f->scratch_cap ? f->scratch_cap : 256;
        while (cap < v->n + 1)
            cap *= 2;
        char *b = realloc(f->scratch, cap);
        if (!b)
            return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->where);
        f->scratch = b;
        f->scratch_cap = cap;
    }
    if (v->n)
        memcpy(f->scratch, str, v->n);
    f->scratch[v->n] = 0;
    *out = f->scratch;
    return DT_OK;
}

static dt_status make_value(dt__pq_file *f, const leafsel *s, const pq_val *v, cJSON **out)
{
    const char *str = NULL;
    dt_status st;
    switch (s->vkind) {
    case V_STRING:
        if ((st = string_of(f, s, v, &str)) < 0)
            return st;
        *out = cJSON_CreateString(str);
        break;
    case V_BOOL:
        *out = cJSON_CreateBool(v->b);
        break;
    case V_FLOAT:
        *out = cJSON_CreateNumber(v->d);
        break;
    default: {
        const bool w32 = f->m.el[f->m.leaf_el[s->leaf]].type == PQ_INT32;
        const bool neg = s->vkind == V_INT && v->i < 0;
        const uint64_t mag = s->vkind == V_UINT ? (w32 ? (uint64_t)(uint32_t)v->i : (uint64_t)v->i)
                             : neg              ? 0 - (uint64_t)v->i
                                                : (uint64_t)v->i;
        if (mag > (uint64_t)MAX_EXACT) {
            char what[160];
            snprintf(what, sizeof what, "an integer of magnitude %llu, past 2^53 (a JSON number here is a double "
                     "and would not hold it exactly)", (unsigned long long)mag);
            return row_err(f, s, DT_ERR_UNSUPPORTED, what);
        }
        *out = cJSON_CreateNumber(neg ? -(double)mag : (double)mag);
    }
    }
    return *out ? DT_OK : dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->where);
}

/* Put item into its slot: key of obj, or appended to the array arr. */
static bool place(cJSON *obj, const char *key, cJSON *arr, cJSON *item)
{
    return arr ? cJSON_AddItemToArray(arr, item) : cJSON_AddItemToObject(obj, key, item);
}

#define DISAGREE "its levels disagree with the other columns of the same field (corrupt file)"

/* One triple (r, d, v) of leaf s into row. */
static dt_status insert(dt__pq_file *f, leafsel *s, cJSON *row, int r, int d, const pq_val *v)
{
    for (int k = 0; k < s->depth; k++)
        if (s->path[k]->kind == J_ARR && s->path[k]->rep > r)
            s->cur[k] = NULL; /* a new list at this level (or above) */
    cJSON *obj = row, *arr = NULL, *item = cJSON_GetObjectItemCaseSensitive(row, s->path[0]->key);
    for (int k = 0; k < s->depth; k++) {
        const jnode *j = s->path[k];
        const char *key = arr ? NULL : j->key;
        int ak = k - 1; /* the array level whose element this is (when arr) */
        cJSON *made = NULL;
        dt_status st = DT_OK;
        if (d < j->d_present) { /* null here */
            if (item)
                return cJSON_IsNull(item) && j->kind != J_VAL ? DT_OK : row_err(f, s, DT_ERR_FORMAT, DISAGREE);
            made = cJSON_CreateNull();
        } else if (j->kind == J_VAL) {
            if (item)
                return row_err(f, s, DT_ERR_FORMAT, DISAGREE);
            if ((st = make_value(f, s, v, &made)) < 0)
                return st;
        } else if (!item) {
            made = j->kind == J_OBJ ? cJSON_CreateObject() : cJSON_CreateArray();
        } else if (j->kind == J_OBJ ? !cJSON_IsObject(item) : !cJSON_IsArray(item)) {
            return row_err(f, s, DT_ERR_FORMAT, DISAGREE);
        }
        if (made) {
            if (!place(obj, key, arr, made)) {
                cJSON_Delete(made);
                return dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->where);
            }
            item = made;
            if (arr)
                s->cur[ak] = made;
        }
        if (d < j->d_present || j->kind == J_VAL)
            return DT_OK;
        if (j->kind == J_OBJ) {
            obj = item;
            arr = NULL;
            item = cJSON_GetObjectItemCaseSensitive(obj, s->path[k + 1]->key);
            continue;
        }
        /* an array: empty here, or which element */
        if (d < j->d_elem) {
            if (r >= j->rep || (!made && cJSON_GetArraySize(item) > 0))
                return row_err(f, s, DT_ERR_FORMAT, DISAGREE);
            return DT_OK;
        }
        cJSON *el;
        if (r < j->rep)
            el = item->child;
        else if (!s->cur[k])
            return row_err(f, s, DT_ERR_FORMAT, DISAGREE);
        else
            el = r == j->rep ? s->cur[k]->next : s->cur[k];
        s->cur[k] = el;
        arr = item;
        obj = NULL;
        item = el; /* NULL: appended at the next level */
    }
    return DT_OK;
}

/* Leaf s's triples of the current row into row. */
static dt_status add_leaf(dt__pq_file *f, leafsel *s, cJSON *row)
{
    for (bool first = true;; first = false) {
        int r, d;
        bool end;
        dt_status st = dt__pq_col_peek(s->col, &r, &d, &end);
        if (st < 0)
            return st;
        if (end && first)
            return row_err(f, s, DT_ERR_FORMAT, "the column ends before this row (fewer rows than the row group "
                           "says)");
        if (end || (!first && r == 0))
            return DT_OK;
        if (first && r != 0)
            return row_err(f, s, DT_ERR_FORMAT, "the row starts with a repetition level that is not 0");
        if (r > 0 && d < s->d_of_rep[r])
            return row_err(f, s, DT_ERR_FORMAT, "a repeated value whose list is not defined (corrupt levels)");
        pq_val v = {0};
        if ((st = dt__pq_col_take(s->col, &v)) < 0 || (st = insert(f, s, row, r, d, &v)) < 0)
            return st;
    }
}

dt_status dt__pq_next(dt__pq_file *f, cJSON **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_next: out is NULL");
    *out = NULL;
    if (!f)
        return dt_error(DT_ERR_INVALID_ARG, "dt__pq_next: NULL file");
    if (f->failed)
        return dt_error(DT_ERR_INVALID_ARG, "parquet %s: an earlier error ended the reading", f->name);
    dt_status st = DT_OK;
    if (!f->selected && (st = dt__pq_select(f, NULL, 0)) < 0)
        return st;
    if (!f->started) {
        f->started = true;
        f->group = -1;
        f->row_in_group = 0;
        f->row = -1;
    }
    while (st == DT_OK && (f->group < 0 || f->row_in_group >= f->m.groups[f->group].num_rows)) {
        if (f->group >= 0) /* every selected column ends with the row group */
            for (int32_t i = 0; st == DT_OK && i < f->nleaves; i++) {
                int r, d;
                bool end;
                if ((st = dt__pq_col_peek(f->leaves[i].col, &r, &d, &end)) == DT_OK && !end) {
                    char path[512];
                    el_path(&f->m, f->m.leaf_el[f->leaves[i].leaf], path, sizeof path);
                    st = dt_error(DT_ERR_FORMAT, "parquet %s: row group %lld, column \"%s\": more values than the row "
                                  "group's %lld rows", f->name, (long long)f->group, path,
                                  (long long)f->m.groups[f->group].num_rows);
                }
            }
        if (st < 0)
            break;
        if (f->group + 1 >= f->m.ngroups)
            return DT_OK; /* the end */
        f->group++;
        f->row_in_group = 0;
        st = start_group(f, f->group);
    }
    cJSON *row = NULL;
    if (st == DT_OK) {
        f->row++;
        snprintf(f->where, sizeof f->where, "parquet %s: row group %lld, row %lld", f->name, (long long)f->group,
                 (long long)f->row);
        row = cJSON_CreateObject();
        if (!row)
            st = dt_error(DT_ERR_NO_MEMORY, "%s: out of memory", f->where);
    }
    for (int32_t i = 0; st == DT_OK && i < f->nleaves; i++)
        st = add_leaf(f, &f->leaves[i], row);
    if (st < 0) {
        cJSON_Delete(row);
        f->failed = true;
        return st;
    }
    f->row_in_group++;
    *out = row;
    return DT_OK;
}
