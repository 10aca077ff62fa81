/* Parquet's footer and page headers (parquet_impl.h): a Thrift compact
 * protocol decoder and the structures of parquet.thrift the reader uses.
 *
 * The compact protocol: a struct is a list of fields ended by a 0 byte;
 * a field's header byte holds the id's delta from the previous field (high
 * nibble; 0: a zigzag varint id follows) and the type (low nibble: 1/2
 * bool true/false, 3 i8, 4 i16, 5 i32, 6 i64 as zigzag varints, 7 double,
 * 8 binary as varint length + bytes, 9 list, 10 set, 11 map, 12 struct).
 * A list's header holds its size (high nibble, 15: a varint follows) and
 * its element type. Every read is bounds-checked; a field of an id the
 * reader does not use, or of an unexpected type, is skipped whatever its
 * type; nesting is limited to PQ_MAX_DEPTH, so a hostile footer cannot
 * recurse without end. A list's size is checked against the bytes left
 * (each element takes at least one) before anything is allocated. */
#include "parquet_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tr {
    const uint8_t *p, *end, *start;
    int depth;
    const char *why; /* the first error */
} tr;

enum { T_STOP, T_TRUE, T_FALSE, T_I8, T_I16, T_I32, T_I64, T_DOUBLE, T_BIN, T_LIST, T_SET, T_MAP, T_STRUCT, T_UUID };

static bool fail(tr *t, const char *why)
{
    if (!t->why)
        t->why = why;
    return false;
}

static bool uvar(tr *t, uint64_t *v)
{
    uint64_t x = 0;
    for (int s = 0; s < 70; s += 7) {
        if (t->p >= t->end)
            return fail(t, "ends inside a number");
        uint8_t b = *t->p++;
        if (s == 63 && b > 1)
            return fail(t, "a number past 64 bits");
        x |= (uint64_t)(b & 0x7f) << s;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return fail(t, "a number past 64 bits");
}

static bool zz64(tr *t, int64_t *v)
{
    uint64_t u;
    if (!uvar(t, &u))
        return false;
    *v = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
    return true;
}

static bool zz32(tr *t, int32_t *v)
{
    int64_t x;
    if (!zz64(t, &x))
        return false;
    if (x < INT32_MIN || x > INT32_MAX)
        return fail(t, "a 32-bit number out of range");
    *v = (int32_t)x;
    return true;
}

static bool bin(tr *t, const uint8_t **s, size_t *n)
{
    uint64_t len;
    if (!uvar(t, &len))
        return false;
    if (len > (uint64_t)(t->end - t->p))
        return fail(t, "a string longer than the bytes left");
    *s = t->p;
    *n = (size_t)len;
    t->p += len;
    return true;
}

static bool list_hdr(tr *t, int *elem, uint64_t *count)
{
    if (t->p >= t->end)
        return fail(t, "ends inside a list header");
    uint8_t h = *t->p++;
    uint64_t c = h >> 4;
    if (c == 15 && !uvar(t, &c))
        return false;
    *elem = h & 15;
    if (c > (uint64_t)(t->end - t->p)) /* each element takes a byte or more */
        return fail(t, "a list longer than the bytes left");
    *count = c;
    return true;
}

static bool skip(tr *t, int type);

static bool skip_struct(tr *t)
{
    if (++t->depth > PQ_MAX_DEPTH)
        return fail(t, "nested too deep");
    for (;;) {
        if (t->p >= t->end)
            return fail(t, "ends inside a struct");
        uint8_t h = *t->p++;
        if (!h)
            break;
        if (!(h >> 4)) {
            int64_t id;
            if (!zz64(t, &id))
                return false;
        }
        if (!skip(t, h & 15))
            return false;
    }
    t->depth--;
    return true;
}

static bool skip(tr *t, int type)
{
    uint64_t u;
    const uint8_t *s;
    size_t n;
    switch (type) {
    case T_TRUE:
    case T_FALSE:
        return true;
    case T_I8:
        if (t->p >= t->end)
            return fail(t, "ends inside a byte");
        t->p++;
        return true;
    case T_I16:
    case T_I32:
    case T_I64:
        return uvar(t, &u);
    case T_DOUBLE:
        if (t->end - t->p < 8)
            return fail(t, "ends inside a double");
        t->p += 8;
        return true;
    case T_UUID:
        if (t->end - t->p < 16)
            return fail(t, "ends inside a uuid");
        t->p += 16;
        return true;
    case T_BIN:
        return bin(t, &s, &n);
    case T_LIST:
    case T_SET: {
        int e;
        uint64_t c;
        if (!list_hdr(t, &e, &c))
            return false;
        if (++t->depth > PQ_MAX_DEPTH)
            return fail(t, "nested too deep");
        for (uint64_t i = 0; i < c; i++) {
            if (e == T_TRUE || e == T_FALSE) { /* a bool element is a byte */
                if (t->p >= t->end)
                    return fail(t, "ends inside a list");
                t->p++;
            } else if (!skip(t, e)) {
                return false;
            }
        }
        t->depth--;
        return true;
    }
    case T_MAP: {
        uint64_t c;
        if (!uvar(t, &c))
            return false;
        if (!c)
            return true;
        if (c > (uint64_t)(t->end - t->p))
            return fail(t, "a map longer than the bytes left");
        if (t->p >= t->end)
            return fail(t, "ends inside a map header");
        uint8_t kv = *t->p++;
        if (++t->depth > PQ_MAX_DEPTH)
            return fail(t, "nested too deep");
        for (uint64_t i = 0; i < c; i++)
            for (int k = 0; k < 2; k++) {
                int ty = k ? kv & 15 : kv >> 4;
                if (ty == T_TRUE || ty == T_FALSE) {
                    if (t->p >= t->end)
                        return fail(t, "ends inside a map");
                    t->p++;
                } else if (!skip(t, ty)) {
                    return false;
                }
            }
        t->depth--;
        return true;
    }
    case T_STRUCT:
        return skip_struct(t);
    default:
        return fail(t, "a field of an unknown type");
    }
}

/* The next field of a struct: false at its end (*stop) or on an error. */
static bool field(tr *t, int16_t *last, int *id, int *type, bool *stop)
{
    *stop = false;
    if (t->p >= t->end)
        return fail(t, "ends inside a struct");
    uint8_t h = *t->p++;
    if (!h) {
        *stop = true;
        return false;
    }
    int64_t fid = *last + (h >> 4);
    if (!(h >> 4) && !zz64(t, &fid))
        return false;
    if (fid < INT16_MIN || fid > INT16_MAX)
        return fail(t, "a field id out of range");
    *last = (int16_t)fid;
    *id = (int)fid;
    *type = h & 15;
    return true;
}

/* Loop over a struct's fields: `for (FIELDS(t)) { switch (id) ... }`, ok false on an error. */
#define STRUCT_BEGIN(t)                                                                                              \
    do {                                                                                                             \
        int16_t last_ = 0;                                                                                           \
        int id, ty;                                                                                                  \
        bool stop_;                                                                                                  \
        if (++(t)->depth > PQ_MAX_DEPTH)                                                                             \
            return fail(t, "nested too deep");                                                                       \
        while (field(t, &last_, &id, &ty, &stop_)) {
#define STRUCT_END(t)                                                                                                \
        }                                                                                                            \
        if (!stop_)                                                                                                  \
            return false;                                                                                            \
        (t)->depth--;                                                                                                \
    } while (0)

/* A field's value, read when its type is the one expected, else skipped (as an unknown field). */
static bool get_i32(tr *t, int ty, int32_t *v, bool *seen)
{
    if (ty != T_I32 && ty != T_I16 && ty != T_I8)
        return skip(t, ty);
    if (ty == T_I8) {
        if (t->p >= t->end)
            return fail(t, "ends inside a byte");
        *v = (int8_t)*t->p++;
    } else if (!zz32(t, v)) {
        return false;
    }
    if (seen)
        *seen = true;
    return true;
}

static bool get_i64(tr *t, int ty, int64_t *v, bool *seen)
{
    if (ty != T_I64 && ty != T_I32 && ty != T_I16)
        return skip(t, ty);
    if (!zz64(t, v))
        return false;
    if (seen)
        *seen = true;
    return true;
}

/* ---- FileMetaData ------------------------------------------------------------------------------------------------ */

typedef struct parse {
    tr t;
    pq_meta *m;
    bool encrypted, file_path;
} parse;

static bool int_type(tr *t, pq_el *e)
{
    STRUCT_BEGIN(t)
        if (id == 1 && ty == T_I8) {
            if (t->p >= t->end)
                return fail(t, "ends inside a byte");
            e->int_bits = (int8_t)*t->p++;
        } else if (id == 2 && (ty == T_TRUE || ty == T_FALSE)) {
            e->int_unsigned = ty == T_FALSE;
        } else if (!skip(t, ty)) {
            return false;
        }
    STRUCT_END(t);
    return true;
}

static bool logical(tr *t, pq_el *e)
{
    STRUCT_BEGIN(t)
        if (ty == T_STRUCT && e->logical < 0) {
            e->logical = id;
            if (id == 10 ? !int_type(t, e) : !skip(t, ty))
                return false;
        } else if (!skip(t, ty)) {
            return false;
        }
    STRUCT_END(t);
    return true;
}

static bool schema_el(parse *ps, pq_el *e)
{
    tr *t = &ps->t;
    bool named = false;
    *e = (pq_el){.type = -1, .rep = -1, .nchild = -1, .converted = -1, .logical = -1, .leaf = -1, .parent = -1};
    STRUCT_BEGIN(t)
        bool ok = true;
        switch (id) {
        case 1: ok = get_i32(t, ty, &e->type, NULL); break;
        case 2: ok = get_i32(t, ty, &e->type_length, NULL); break;
        case 3: ok = get_i32(t, ty, &e->rep, NULL); break;
        case 5: ok = get_i32(t, ty, &e->nchild, NULL); break;
        case 6: ok = get_i32(t, ty, &e->converted, NULL); break;
        case 10: ok = ty == T_STRUCT ? logical(t, e) : skip(t, ty); break;
        case 4:
            if (ty == T_BIN && !e->name) {
                const uint8_t *s;
                size_t n;
                if (!bin(t, &s, &n))
                    return false;
                if (memchr(s, 0, n))
                    return fail(t, "a column name holds a NUL byte");
                e->name = malloc(n + 1);
                if (!e->name)
                    return fail(t, "out of memory");
                memcpy(e->name, s, n);
                e->name[n] = 0;
                named = true;
                break;
            }
            ok = skip(t, ty);
            break;
        default: ok = skip(t, ty);
        }
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!named)
        return fail(t, "a schema element without a name");
    return true;
}

static bool col_meta(parse *ps, pq_chunk *c, bool *have)
{
    tr *t = &ps->t;
    bool seen[12] = {false};
    STRUCT_BEGIN(t)
        bool ok = true;
        switch (id) {
        case 1: ok = get_i32(t, ty, &c->type, &seen[1]); break;
        case 4: ok = get_i32(t, ty, &c->codec, &seen[4]); break;
        case 5: ok = get_i64(t, ty, &c->num_values, &seen[5]); break;
        case 7: ok = get_i64(t, ty, &c->total_compressed, &seen[7]); break;
        case 9: ok = get_i64(t, ty, &c->data_off, &seen[9]); break;
        case 11: ok = get_i64(t, ty, &c->dict_off, &seen[11]); break;
        default: ok = skip(t, ty);
        }
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!seen[1] || !seen[4] || !seen[5] || !seen[7] || !seen[9])
        return fail(t, "a column chunk's metadata lacks its type, codec, value count, size or data page offset");
    *have = true;
    return true;
}

static bool col_chunk(parse *ps, pq_chunk *c)
{
    tr *t = &ps->t;
    bool have = false;
    *c = (pq_chunk){.dict_off = -1};
    STRUCT_BEGIN(t)
        bool ok = true;
        if (id == 1 && ty == T_BIN) {
            ps->file_path = true;
            ok = skip(t, ty);
        } else if (id == 3 && ty == T_STRUCT && !have) {
            ok = col_meta(ps, c, &have);
        } else {
            if (id == 9 && ty == T_BIN)
                ps->encrypted = true; /* encrypted_column_metadata */
            ok = skip(t, ty);
        }
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!have && !ps->encrypted)
        return fail(t, "a column chunk without its metadata");
    return true;
}

static bool row_group(parse *ps, pq_group *g)
{
    tr *t = &ps->t;
    bool have_cols = false, have_rows = false;
    STRUCT_BEGIN(t)
        bool ok = true;
        if (id == 1 && ty == T_LIST && !have_cols) {
            int e;
            uint64_t c;
            if (!list_hdr(t, &e, &c))
                return false;
            if (e != T_STRUCT || c != (uint64_t)ps->m->nleaf)
                return fail(t, "a row group's column count is not the schema's");
            g->cols = calloc(c ? c : 1, sizeof *g->cols);
            if (!g->cols)
                return fail(t, "out of memory");
            for (uint64_t i = 0; i < c; i++)
                if (!col_chunk(ps, &g->cols[i]))
                    return false;
            have_cols = true;
        } else if (id == 3) {
            ok = get_i64(t, ty, &g->num_rows, &have_rows);
        } else {
            ok = skip(t, ty);
        }
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!have_cols || !have_rows)
        return fail(t, "a row group without its columns or row count");
    if (g->num_rows < 0)
        return fail(t, "a row group with a negative row count");
    return true;
}

static bool file_meta(parse *ps)
{
    tr *t = &ps->t;
    pq_meta *m = ps->m;
    bool have_schema = false, have_groups = false, have_rows = false;
    STRUCT_BEGIN(t)
        bool ok = true;
        int e;
        uint64_t c;
        if (id == 2 && ty == T_LIST && !have_schema) {
            if (!list_hdr(t, &e, &c))
                return false;
            if (e != T_STRUCT || c < 1 || c > PQ_MAX_SCHEMA)
                return fail(t, "a schema that is not a list of 1 to 100000 elements");
            m->el = calloc(c, sizeof *m->el);
            if (!m->el)
                return fail(t, "out of memory");
            for (uint64_t i = 0; i < c; i++) {
                m->nel = (int32_t)i + 1; /* counted first: what a failing element allocated is freed too */
                if (!schema_el(ps, &m->el[i]))
                    return false;
            }
            have_schema = true;
            /* the leaves, for the row groups' column counts */
            for (int32_t i = 0; i < m->nel; i++)
                m->nleaf += m->el[i].nchild <= 0;
        } else if (id == 4 && ty == T_LIST && have_schema && !have_groups) {
            if (!list_hdr(t, &e, &c))
                return false;
            if (e != T_STRUCT)
                return fail(t, "row groups that are not structs");
            m->groups = calloc(c ? c : 1, sizeof *m->groups);
            if (!m->groups)
                return fail(t, "out of memory");
            for (uint64_t i = 0; i < c; i++) {
                m->ngroups = (int32_t)i + 1;
                if (!row_group(ps, &m->groups[i]))
                    return false;
            }
            have_groups = true;
        } else if (id == 3) {
            ok = get_i64(t, ty, &m->num_rows, &have_rows);
        } else if (id == 8 && ty == T_STRUCT) {
            ps->encrypted = true; /* encryption_algorithm: a plaintext footer over encrypted columns */
            ok = skip(t, ty);
        } else if (id == 4 && !have_schema) {
            return fail(t, "row groups before the schema");
        } else {
            ok = skip(t, ty);
        }
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!have_schema || !have_groups || !have_rows)
        return fail(t, "no schema, row groups or row count");
    return true;
}

void dt__pq_meta_free(pq_meta *m)
{
    if (!m)
        return;
    for (int32_t i = 0; i < m->nel; i++)
        free(m->el[i].name);
    free(m->el);
    free(m->leaf_el);
    for (int32_t g = 0; g < m->ngroups; g++)
        free(m->groups[g].cols);
    free(m->groups);
    memset(m, 0, sizeof *m);
}

/* Link the depth-first element list into a tree: every group's children follow it, each with its subtree. */
static dt_status link_tree(pq_meta *m, const char *name)
{
    int32_t stack[PQ_MAX_DEPTH + 1], left[PQ_MAX_DEPTH + 1], top = 0, nleaf = 0;
    pq_el *root = &m->el[0];
    if (root->nchild < 0 || root->type >= 0)
        return dt_error(DT_ERR_FORMAT, "parquet %s: footer: the schema's root is not a group", name);
    stack[0] = 0;
    left[0] = root->nchild;
    root->first_child = 1;
    m->leaf_el = calloc((size_t)m->nleaf + 1, sizeof *m->leaf_el);
    if (!m->leaf_el)
        return dt_error(DT_ERR_NO_MEMORY, "parquet %s: out of memory", name);
    for (int32_t i = 1; i < m->nel; i++) {
        while (top >= 0 && left[top] == 0)
            top--;
        if (top < 0)
            return dt_error(DT_ERR_FORMAT, "parquet %s: footer: the schema has %d elements, its groups hold fewer",
                            name, (int)m->nel);
        pq_el *e = &m->el[i];
        left[top]--;
        e->parent = stack[top];
        if (e->rep < PQ_REQUIRED || e->rep > PQ_REPEATED)
            return dt_error(DT_ERR_FORMAT, "parquet %s: footer: column \"%s\" has no valid repetition", name,
                            e->name);
        if (e->nchild > 0) {
            if (top + 1 > PQ_MAX_DEPTH - 1)
                return dt_error(DT_ERR_FORMAT, "parquet %s: footer: the schema nests deeper than %d", name,
                                PQ_MAX_DEPTH - 1);
            e->first_child = i + 1;
            stack[++top] = i;
            left[top] = e->nchild;
        } else {
            if (e->type < PQ_BOOLEAN || e->type > PQ_FIXED)
                return dt_error(DT_ERR_FORMAT, "parquet %s: footer: column \"%s\" has no valid type (an empty "
                                "group?)", name, e->name);
            e->leaf = nleaf;
            m->leaf_el[nleaf++] = i;
        }
    }
    while (top >= 0 && left[top] == 0)
        top--;
    if (top >= 0 || nleaf != m->nleaf)
        return dt_error(DT_ERR_FORMAT, "parquet %s: footer: the schema's groups say more children than it has", name);
    return DT_OK;
}

dt_status dt__pq_meta_parse(const uint8_t *buf, size_t n, uint64_t data_end, const char *name, pq_meta *m)
{
    memset(m, 0, sizeof *m);
    parse ps = {.t = {.p = buf, .end = buf + n, .start = buf}, .m = m};
    if (!file_meta(&ps)) {
        dt_status st = strcmp(ps.t.why, "out of memory") ? DT_ERR_FORMAT : DT_ERR_NO_MEMORY;
        return dt_error(st, "parquet %s: footer: corrupt metadata (Thrift) at byte %zu of %zu: %s", name,
                        (size_t)(ps.t.p - buf), n, ps.t.why ? ps.t.why : "malformed");
    }
    if (ps.encrypted)
        return dt_error(DT_ERR_UNSUPPORTED, "parquet %s: encrypted columns (Parquet modular encryption), which "
                        "dtrain does not read", name);
    if (ps.file_path)
        return dt_error(DT_ERR_UNSUPPORTED, "parquet %s: column data kept in other files (ColumnChunk.file_path), "
                        "which dtrain does not read", name);
    dt_status st = link_tree(m, name);
    if (st < 0)
        return st;
    int64_t rows = 0;
    for (int32_t g = 0; g < m->ngroups; g++) {
        const pq_group *gr = &m->groups[g];
        if (gr->num_rows > INT64_MAX - rows)
            return dt_error(DT_ERR_FORMAT, "parquet %s: footer: row counts overflow", name);
        rows += gr->num_rows;
        for (int32_t c = 0; c < m->nleaf; c++) {
            const pq_chunk *ch = &gr->cols[c];
            const pq_el *e = &m->el[m->leaf_el[c]];
            int64_t start = ch->dict_off > 0 && ch->dict_off < ch->data_off ? ch->dict_off : ch->data_off;
            if (ch->type != e->type || ch->num_values < 0 || ch->total_compressed < 0 || start < 4 ||
                (uint64_t)start > data_end || (uint64_t)ch->total_compressed > data_end - (uint64_t)start)
                return dt_error(DT_ERR_FORMAT, "parquet %s: footer: row group %d, column \"%s\": %s", name, (int)g,
                                e->name, ch->type != e->type ? "its type is not the schema's"
                                : ch->num_values < 0           ? "a negative value count"
                                                               : "its bytes lie outside the file's data");
        }
    }
    if (rows != m->num_rows)
        return dt_error(DT_ERR_FORMAT, "parquet %s: footer: %lld rows, its row groups hold %lld", name,
                        (long long)m->num_rows, (long long)rows);
    return DT_OK;
}

/* ---- PageHeader -------------------------------------------------------------------------------------------------- */

static bool data_hdr(tr *t, pq_page_hdr *h, bool v2)
{
    bool seen[8] = {false};
    STRUCT_BEGIN(t)
        bool ok = true;
        if (id == 1)
            ok = get_i32(t, ty, &h->num_values, &seen[1]);
        else if (id == (v2 ? 4 : 2))
            ok = get_i32(t, ty, &h->encoding, &seen[2]);
        else if (!v2 && id == 3)
            ok = get_i32(t, ty, &h->def_enc, NULL);
        else if (!v2 && id == 4)
            ok = get_i32(t, ty, &h->rep_enc, NULL);
        else if (v2 && id == 5)
            ok = get_i32(t, ty, &h->def_len, &seen[5]);
        else if (v2 && id == 6)
            ok = get_i32(t, ty, &h->rep_len, &seen[6]);
        else if (v2 && id == 7 && (ty == T_TRUE || ty == T_FALSE))
            h->compressed = ty == T_TRUE;
        else
            ok = skip(t, ty);
        if (!ok)
            return false;
    STRUCT_END(t);
    if (!seen[1] || !seen[2] || (v2 && (!seen[5] || !seen[6])))
        return fail(t, "a data page header without its value count, encoding or level lengths");
    if (h->num_values < 0 || h->def_len < 0 || h->rep_len < 0)
        return fail(t, "a negative value count or level length");
    return true;
}

bool dt__pq_page_hdr(const uint8_t *buf, size_t n, pq_page_hdr *h, size_t *used, const char **why)
{
    tr t = {.p = buf, .end = buf + n, .start = buf};
    tr *tp = &t;
    *h = (pq_page_hdr){.type = -1, .usize = -1, .csize = -1, .def_enc = PQ_RLE, .rep_enc = PQ_RLE,
                       .compressed = true};
    bool have_sub = false;
    bool ok = true;
    do {
        int16_t last_ = 0;
        int id, ty;
        bool stop_;
        while (ok && field(tp, &last_, &id, &ty, &stop_)) {
            if (id == 1)
                ok = get_i32(tp, ty, &h->type, NULL);
            else if (id == 2)
                ok = get_i32(tp, ty, &h->usize, NULL);
            else if (id == 3)
                ok = get_i32(tp, ty, &h->csize, NULL);
            else if ((id == 5 || id == 7 || id == 8) && ty == T_STRUCT && !have_sub &&
                     h->type == (id == 5 ? PQ_DATA_PAGE : id == 7 ? PQ_DICT_PAGE : PQ_DATA_PAGE_V2)) {
                have_sub = true;
                ok = id == 7 ? data_hdr(tp, h, false) : data_hdr(tp, h, id == 8);
            } else {
                ok = skip(tp, ty);
            }
        }
        if (ok && !stop_)
            ok = false;
    } while (0);
    if (!ok) {
        *why = t.why ? t.why : "malformed";
        return false;
    }
    if (h->type < 0 || h->usize < 0 || h->csize < 0) {
        *why = "a page header without its type or sizes (or a negative size)";
        return false;
    }
    if (h->type != PQ_INDEX_PAGE && h->type <= PQ_DATA_PAGE_V2 && !have_sub) {
        *why = "a page header without its data or dictionary header";
        return false;
    }
    *used = (size_t)(t.p - buf);
    return true;
}
