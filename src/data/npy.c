/* NumPy .npy files (data.h dt_npy_parse_header, dt_dataset_npy_open).
 *
 * The format (numpy/lib/format.py): "\x93NUMPY", major, minor, the header
 * length (uint16 LE for 1.0, uint32 LE for 2.0 and 3.0), then a Python dict
 * literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with
 * spaces and a '\n', then the raw elements. We parse exactly that grammar
 * (keys in any order, each once; single or double quotes; spaces anywhere
 * between tokens; a trailing comma) and nothing more: no eval, no
 * structured descr lists. The data must fill the rest of the file exactly. */
#include "arrays.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool eat(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A quoted string into buf (cap). */
static bool quoted(cursor *c, char *buf, size_t cap)
{
    skip_ws(c);
    if (c->p >= c->end || (*c->p != '\'' && *c->p != '"'))
        return false;
    char q = *c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (n + 1 >= cap || *c->p == '\\' || *c->p == '\n')
            return false;
        buf[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return false;
    c->p++;
    buf[n] = 0;
    return true;
}

static bool word(cursor *c, const char *w)
{
    skip_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && !memcmp(c->p, w, n)) {
        c->p += n;
        return true;
    }
    return false;
}

static dt_status parse_descr(const char *d, const char *name, dt_npy_header *h)
{
    if (strlen(d) < 3)
        return dt_error(DT_ERR_FORMAT, "npy %s: dtype '%s' is not numeric", name, d);
    char order = d[0];
    if (order != '<' && order != '>' && order != '|' && order != '=')
        return dt_error(DT_ERR_FORMAT, "npy %s: dtype '%s': no byte order (<, >, | or =)", name, d);
    char kind = d[1];
    int size = 0;
    const char *s = d + 2;
    if (*s < '1' || *s > '9')
        size = -1;
    while (size >= 0 && *s >= '0' && *s <= '9' && size < 100)
        size = size * 10 + (*s++ - '0');
    bool ok = size > 0 && *s == 0 &&
              ((kind == 'f' && (size == 2 || size == 4 || size == 8)) ||
               ((kind == 'i' || kind == 'u') && (size == 1 || size == 2 || size == 4 || size == 8)) ||
               (kind == 'b' && size == 1));
    if (!ok)
        return dt_error(DT_ERR_FORMAT,
                        "npy %s: dtype '%s' is not numeric (want float16/32/64, int8-64, uint8-64 or bool; "
                        "object, string, complex, datetime and structured arrays are not supported)",
                        name, d);
    h->kind = kind;
    h->itemsize = size;
    h->big_endian = order == '>' && size > 1;
    return DT_OK;
}

dt_status dt_npy_parse_header(const void *buf, size_t n, const char *name, dt_npy_header *out)
{
    if (!out || (!buf && n))
        return dt_error(DT_ERR_INVALID_ARG, "dt_npy_parse_header: NULL argument");
    if (!name)
        name = "<memory>";
    memset(out, 0, sizeof *out);
    const unsigned char *b = buf;
    if (n < 10 || memcmp(b, "\x93NUMPY", 6))
        return dt_error(DT_ERR_FORMAT, "npy %s: not a .npy file (no \\x93NUMPY magic)", name);
    out->major = b[6];
    out->minor = b[7];
    if (out->major < 1 || out->major > 3)
        return dt_error(DT_ERR_FORMAT, "npy %s: format version %d.%d (want 1.0, 2.0 or 3.0)", name, out->major,
                        out->minor);
    size_t hl, start;
    if (out->major == 1) {
        hl = (size_t)b[8] | (size_t)b[9] << 8;
        start = 10;
    } else {
        if (n < 12)
            return dt_error(DT_ERR_FORMAT, "npy %s: truncated header", name);
        hl = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        start = 12;
    }
    if (hl > n - start)
        return dt_error(DT_ERR_FORMAT, "npy %s: truncated: the header says %zu bytes, the file has %zu after it",
                        name, hl, n - start);
    cursor c = {(const char *)b + start, (const char *)b + start + hl};
    bool have_descr = false, have_order = false, have_shape = false, fortran = false;
    if (!eat(&c, '{'))
        return dt_error(DT_ERR_FORMAT, "npy %s: the header is not a dict", name);
    for (;;) {
        if (eat(&c, '}'))
            break;
        char key[32];
        if (!quoted(&c, key, sizeof key) || !eat(&c, ':'))
            return dt_error(DT_ERR_FORMAT, "npy %s: malformed header dict", name);
        if (!strcmp(key, "descr")) {
            char d[32];
            if (have_descr)
                return dt_error(DT_ERR_FORMAT, "npy %s: 'descr' twice in the header", name);
            skip_ws(&c);
            if (c.p < c.end && *c.p == '[')
                return dt_error(DT_ERR_FORMAT, "npy %s: a structured dtype (descr is a list) is not supported",
                                name);
            if (!quoted(&c, d, sizeof d))
                return dt_error(DT_ERR_FORMAT, "npy %s: 'descr' is not a dtype string", name);
            dt_status st = parse_descr(d, name, out);
            if (st < 0)
                return st;
            have_descr = true;
        } else if (!strcmp(key, "fortran_order")) {
            if (have_order)
                return dt_error(DT_ERR_FORMAT, "npy %s: 'fortran_order' twice in the header", name);
            if (word(&c, "True"))
                fortran = true;
            else if (!word(&c, "False"))
                return dt_error(DT_ERR_FORMAT, "npy %s: 'fortran_order' is not True or False", name);
            have_order = true;
        } else if (!strcmp(key, "shape")) {
            if (have_shape)
                return dt_error(DT_ERR_FORMAT, "npy %s: 'shape' twice in the header", name);
            if (!eat(&c, '('))
                return dt_error(DT_ERR_FORMAT, "npy %s: 'shape' is not a tuple", name);
            for (;;) {
                if (eat(&c, ')'))
                    break;
                skip_ws(&c);
                int64_t v = 0;
                const char *d0 = c.p;
                while (c.p < c.end && *c.p >= '0' && *c.p <= '9' && v < ((int64_t)1 << 48))
                    v = v * 10 + (*c.p++ - '0');
                if (c.p == d0 || v >= ((int64_t)1 << 48))
                    return dt_error(DT_ERR_FORMAT, "npy %s: 'shape' holds something other than sizes", name);
                if (out->ndim == DT_NPY_MAX_DIMS)
                    return dt_error(DT_ERR_FORMAT, "npy %s: more than %d dims", name, DT_NPY_MAX_DIMS);
                out->shape[out->ndim++] = v;
                if (eat(&c, ')'))
                    break;
                if (!eat(&c, ','))
                    return dt_error(DT_ERR_FORMAT, "npy %s: malformed 'shape' tuple", name);
            }
            have_shape = true;
        } else {
            return dt_error(DT_ERR_FORMAT, "npy %s: unknown header key '%s'", name, key);
        }
        if (eat(&c, '}'))
            break;
        if (!eat(&c, ','))
            return dt_error(DT_ERR_FORMAT, "npy %s: malformed header dict", name);
    }
    skip_ws(&c);
    if (c.p != c.end)
        return dt_error(DT_ERR_FORMAT, "npy %s: text after the header dict", name);
    if (!have_descr || !have_order || !have_shape)
        return dt_error(DT_ERR_FORMAT, "npy %s: the header lacks '%s'", name,
                        !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    /* C order; fortran_order of 0-1 dims is the same layout, accept it */
    int big = 0;
    for (int d = 0; d < out->ndim; d++)
        big += out->shape[d] > 1;
    if (fortran && big > 1)
        return dt_error(DT_ERR_FORMAT,
                        "npy %s: fortran_order is True (column-major): save a C-order array "
                        "(np.save(f, np.ascontiguousarray(a)))",
                        name);
    /* the data fill the rest of the file */
    size_t avail = n - start - hl, want = (size_t)out->itemsize, nonzero = want;
    for (int d = 0; d < out->ndim; d++) {
        size_t s = (size_t)out->shape[d];
        if (!s) {
            want = 0;
            continue;
        }
        /* a zero dimension empties the array, but the other dimensions still
           describe one row: their product must be a size too */
        if (nonzero > SIZE_MAX / s)
            return dt_error(DT_ERR_FORMAT, "npy %s: the shape's sizes multiply past any array size",
                            name);
        nonzero *= s;
        want *= s;
    }
    if (want != avail)
        return dt_error(DT_ERR_FORMAT, "npy %s: %s: the shape needs %zu bytes of data, the file has %zu", name,
                        want > avail ? "truncated" : "bytes after the data", want, avail);
    out->data_offset = start + hl;
    out->data_bytes = want;
    return DT_OK;
}

static dt_status open_array(const char *path, dt__array *a)
{
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", path);
    dt_status st = dt__map_open(path, "npy", &a->map);
    if (st < 0)
        return st;
    dt_npy_header h;
    if ((st = dt_npy_parse_header(a->map.data, a->map.size, path, &h)) < 0) {
        dt__array_release(a);
        return st;
    }
    if (h.ndim < 1) {
        dt__array_release(a);
        return dt_error(DT_ERR_FORMAT, "npy %s: a scalar (shape ()); want rows (N, ...)", path);
    }
    a->data = a->map.data + h.data_offset;
    a->kind = h.kind;
    a->itemsize = h.itemsize;
    a->swap = h.big_endian;
    a->ndim = h.ndim;
    memcpy(a->shape, h.shape, sizeof a->shape);
    return DT_OK;
}

dt_status dt_dataset_npy_open(const char *x_path, const char *y_path, dt_dataset **out)
{
    if (!out)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_npy_open: out is NULL");
    *out = NULL;
    if (!x_path)
        return dt_error(DT_ERR_INVALID_ARG, "dt_dataset_npy_open: x_path is NULL");
    dt__array x, y;
    dt_status st = open_array(x_path, &x);
    if (st < 0)
        return st;
    if (y_path && (st = open_array(y_path, &y)) < 0) {
        dt__array_release(&x);
        return st;
    }
    return dt__dataset_rows(&x, y_path ? &y : NULL, out);
}
